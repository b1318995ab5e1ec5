//! The real Kubernetes control plane (`testbed::control_plane`, `testbed up
//! --control-plane real`): etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler from `scripts/control-plane.sh`, in a testbed's host netns.
//!
//! Needs root, `ip`, `kubectl` and the binaries (`bash scripts/control-plane.sh`, or
//! `FIRSTPACKET_CONTROL_PLANE_BIN`); without the binaries each test prints why and
//! passes without checking anything.

mod common;

use common::{output_within, SERIAL};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testbed::control_plane::{self, pki, Config, ControlPlane};
use testbed::dataplane::{list_netns, netns_pids, Dataplane};
use testbed::plan::Plan;

/// The binaries, or `None` after printing why the test is skipped.
fn binaries() -> Option<PathBuf> {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: needs root (network namespaces)");
        return None;
    }
    match control_plane::locate_binaries(None) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

/// The Kubernetes version the binaries were built as (`VERSIONS` next to `bin/`, as
/// `scripts/control-plane.sh` writes it), e.g. `v1.36.3`.
fn built_version(bin: &Path) -> String {
    let p = bin.parent().unwrap().join("VERSIONS");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("kubernetes "))
        .unwrap_or_else(|| panic!("no kubernetes line in {}: {text}", p.display()))
        .trim()
        .to_owned()
}

/// Removes the plan's network (and every process in it) and the state dir on drop.
struct Cleanup {
    plan: Plan,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        control_plane::sweep(&self.plan.state_dir);
        let _ = Dataplane::destroy(&self.plan);
        let _ = std::fs::remove_dir_all(&self.plan.state_dir);
    }
}

fn kubectl(netns: &str, kubeconfig: &Path, args: &[&str]) -> Output {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns, "kubectl", "--request-timeout=20s"])
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args);
    output_within(c, Duration::from_secs(60))
}

fn ok_stdout(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `f` every 250 ms until it returns `Some` or `timeout` passes (then panics
/// with `what`).
fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Audit events (JSON lines) of the control plane.
fn audit_events(cfg: &Config) -> Vec<Value> {
    std::fs::read_to_string(cfg.audit_log_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn audited(cfg: &Config, user: &str, verb: &str, resource: &str, code: u64) -> bool {
    audit_events(cfg).iter().any(|e| {
        e["user"]["username"] == user
            && e["verb"] == verb
            && e["objectRef"]["resource"] == resource
            && e["responseStatus"]["code"] == code
    })
}

#[test]
fn real_control_plane_serves_rbac_webhook_denies_audit_restart_and_leaves_nothing() {
    let Some(bin) = binaries() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("fp-realcp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let plan = Plan::new(&dir, 1).expect("plan");
    let _cleanup = Cleanup { plan: plan.clone() };
    Dataplane::create(&plan).expect("create the host netns and bridge");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cfg = Config::for_plan(&plan, &bin);
    let started = Instant::now();
    let cp = rt
        .block_on(ControlPlane::start(cfg.clone()))
        .unwrap_or_else(|e| panic!("start the control plane: {e:#}"));
    eprintln!(
        "control plane ready in {:.1}s: {:?}",
        started.elapsed().as_secs_f64(),
        cp.pids()
    );
    let pids = cp.pids();
    assert_eq!(pids.len(), 4, "{pids:?}");
    let ns = plan.host_netns.clone();
    let admin = cfg.kubeconfig_path(pki::ADMIN);

    // The server is the version the script built (version ldflags), not v0.0.0.
    let v: Value = serde_json::from_str(&ok_stdout(
        &kubectl(&ns, &admin, &["version", "-o", "json"]),
        "kubectl version",
    ))
    .expect("kubectl version JSON");
    assert_eq!(
        v["serverVersion"]["gitVersion"],
        built_version(&bin).as_str(),
        "{v}"
    );

    // The admin identity (cluster-admin by RBAC, not system:masters) can read.
    let nss = ok_stdout(
        &kubectl(&ns, &admin, &["get", "ns", "-o", "name"]),
        "get ns",
    );
    for want in [
        "namespace/default",
        "namespace/kube-system",
        "namespace/kube-node-lease",
    ] {
        assert!(nss.lines().any(|l| l == want), "{want} in {nss}");
    }
    let me: Value = serde_json::from_str(&ok_stdout(
        &kubectl(&ns, &admin, &["auth", "whoami", "-o", "json"]),
        "auth whoami",
    ))
    .unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "firstpacket-admin");
    let groups = me["status"]["userInfo"]["groups"].to_string();
    assert!(!groups.contains("system:masters"), "{groups}");

    // The `kubernetes` Service: first IP of the service CIDR, endpoint = advertise IP.
    let svc: Value = serde_json::from_str(&ok_stdout(
        &kubectl(&ns, &admin, &["get", "svc", "kubernetes", "-o", "json"]),
        "get svc kubernetes",
    ))
    .unwrap();
    assert_eq!(
        svc["spec"]["clusterIP"],
        cfg.kubernetes_service_ip().to_string().as_str()
    );
    let eps = wait_for("kubernetes endpoints", Duration::from_secs(30), || {
        let out = kubectl(
            &ns,
            &admin,
            &["get", "endpoints", "kubernetes", "-o", "json"],
        );
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v["subsets"][0]["addresses"][0]["ip"]
            .as_str()
            .map(str::to_owned)
    });
    assert_eq!(eps, plan.bridge_ip.to_string());

    // The real controllers: a Deployment gets a ReplicaSet that creates pods.
    ok_stdout(
        &kubectl(
            &ns,
            &admin,
            &[
                "create",
                "deployment",
                "web",
                "--image=registry.k8s.io/pause:3.10",
                "--replicas=2",
            ],
        ),
        "create deployment",
    );
    let rs = wait_for(
        "ReplicaSet of deployment web",
        Duration::from_secs(60),
        || {
            let out = kubectl(&ns, &admin, &["get", "rs", "-l", "app=web", "-o", "json"]);
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            let item = v["items"].get(0)?.clone();
            (item["metadata"]["ownerReferences"][0]["kind"] == "Deployment").then_some(item)
        },
    );
    let rs_name = rs["metadata"]["name"].as_str().unwrap().to_owned();
    wait_for("2 pods of the ReplicaSet", Duration::from_secs(60), || {
        let out = kubectl(&ns, &admin, &["get", "pods", "-l", "app=web", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let items = v["items"].as_array()?;
        (items.len() == 2
            && items
                .iter()
                .all(|p| p["metadata"]["ownerReferences"][0]["name"] == rs_name.as_str()))
        .then_some(())
    });
    // The root CA ConfigMap and the default ServiceAccount are published.
    wait_for(
        "kube-root-ca.crt in default",
        Duration::from_secs(30),
        || {
            kubectl(&ns, &admin, &["get", "configmap", "kube-root-ca.crt"])
                .status
                .success()
                .then_some(())
        },
    );

    // `api deny list pods` through the webhook: 403 for the admin, other verbs and
    // resources untouched; `allow` restores it at the next request.
    cp.deny_list().deny("list", "pods", None);
    let out = kubectl(&ns, &admin, &["get", "pods"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "list pods still allowed");
    assert!(
        err.contains("Forbidden") && err.contains("testbed api deny"),
        "{err}"
    );
    ok_stdout(
        &kubectl(&ns, &admin, &["get", "deployments"]),
        "get deployments while pods are denied",
    );
    ok_stdout(
        &kubectl(
            &ns,
            &admin,
            &["get", "pod", rs_name.as_str(), "--ignore-not-found"],
        ),
        "get (not list) a pod while list is denied",
    );
    assert!(cp.deny_list().allow("list", "pods", None));
    ok_stdout(
        &kubectl(&ns, &admin, &["get", "pods"]),
        "list pods after allow",
    );
    // The audit log says who was refused and who was served.
    wait_for(
        "audit events of the denied and allowed list",
        Duration::from_secs(10),
        || {
            (audited(&cfg, "firstpacket-admin", "list", "pods", 403)
                && audited(&cfg, "firstpacket-admin", "list", "pods", 200))
            .then_some(())
        },
    );
    // The real controllers run under their own ServiceAccounts.
    assert!(
        audit_events(&cfg)
            .iter()
            .any(|e| e["user"]["username"]
                == "system:serviceaccount:kube-system:replicaset-controller"),
        "no request by the replicaset-controller ServiceAccount in the audit log"
    );

    // A per-node kubelet identity (`system:node:node-1`, group `system:nodes`) passes
    // the Node authorizer: it registers its Node, and admission adds the not-ready
    // taint a real kubelet's new Node gets.
    let node_id = cp.node_identity("node-1").expect("node identity");
    let nd = dir.join("node-1-id");
    std::fs::create_dir_all(&nd).unwrap();
    for (f, pem) in [
        ("ca.crt", &node_id.ca_pem),
        ("node.crt", &node_id.cert_pem),
        ("node.key", &node_id.key_pem),
    ] {
        std::fs::write(nd.join(f), pem).unwrap();
    }
    let node_kc = nd.join("kubeconfig");
    std::fs::write(
        &node_kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {}\n    certificate-authority: {}\ncontexts:\n- name: t\n  context: {{cluster: t, user: node}}\ncurrent-context: t\nusers:\n- name: node\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            node_id.url,
            nd.join("ca.crt").display(),
            nd.join("node.crt").display(),
            nd.join("node.key").display()
        ),
    )
    .unwrap();
    let node_json = nd.join("node.json");
    std::fs::write(
        &node_json,
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1","labels":{"kubernetes.io/hostname":"node-1"}}}"#,
    )
    .unwrap();
    let created = kubectl(
        &ns,
        &node_kc,
        &["create", "-f", &node_json.display().to_string()],
    );
    ok_stdout(&created, "create Node node-1 as system:node:node-1");
    let node = ok_stdout(
        &kubectl(&ns, &admin, &["get", "node", "node-1", "-o", "json"]),
        "get node",
    );
    eprintln!("node-1 as created by its kubelet identity: {node}");
    let node: Value = serde_json::from_str(&node).unwrap();
    assert_eq!(node["metadata"]["name"], "node-1");
    let me = kubectl(
        &ns,
        &node_kc,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert_eq!(ok_stdout(&me, "whoami as the node"), "system:node:node-1");

    // `api restart`: objects (and their UIDs) stay.
    let uid = |out: &Output| -> String {
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["metadata"]["uid"].as_str().unwrap_or("").to_owned()
    };
    let before = uid(&kubectl(
        &ns,
        &admin,
        &["get", "deploy", "web", "-o", "json"],
    ));
    assert!(!before.is_empty());
    let apiserver_pid = cp.pids()["kube-apiserver"];
    let t = Instant::now();
    rt.block_on(cp.api_restart())
        .unwrap_or_else(|e| panic!("api restart: {e:#}"));
    eprintln!("api restart took {:.1}s", t.elapsed().as_secs_f64());
    assert_ne!(cp.pids()["kube-apiserver"], apiserver_pid, "a new process");
    let after = uid(&kubectl(
        &ns,
        &admin,
        &["get", "deploy", "web", "-o", "json"],
    ));
    assert_eq!(before, after, "deployment web kept across api restart");

    // `api expire-watches`: a watch resumed from an earlier resourceVersion gets 410.
    let list: Value = serde_json::from_slice(
        &kubectl(
            &ns,
            &admin,
            &["get", "--raw", "/api/v1/namespaces/default/configmaps"],
        )
        .stdout,
    )
    .unwrap();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    ok_stdout(
        &kubectl(&ns, &admin, &["create", "configmap", "after-list"]),
        "create configmap",
    );
    rt.block_on(cp.expire_watches())
        .unwrap_or_else(|e| panic!("expire watches: {e:#}"));
    let watch = kubectl(
        &ns,
        &admin,
        &[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=3"),
        ],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&watch.stdout),
        String::from_utf8_lossy(&watch.stderr)
    );
    assert!(
        text.contains("410") || text.contains("Expired") || text.contains("too old"),
        "watch from rv {rv} after expire-watches: {text}"
    );
    eprintln!("watch from rv {rv} after expire-watches: {}", text.trim());

    // Stop: none of the processes remains, nothing from the bin dir in the netns.
    rt.block_on(cp.stop());
    for (name, pid) in &pids {
        assert!(
            !control_plane::process_runs(*pid as i32, name),
            "{name} (pid {pid}) still runs after stop"
        );
    }
    let left: Vec<i32> = netns_pids(std::slice::from_ref(&ns));
    let ours: Vec<(i32, String)> = control_plane::processes_from(&bin)
        .into_iter()
        .filter(|(p, _)| left.contains(p))
        .collect();
    assert!(ours.is_empty(), "still running in {ns}: {ours:?}");
    drop(cp);
    Dataplane::destroy(&plan).expect("destroy");
    assert!(
        list_netns(&plan.prefix).is_empty(),
        "netns left: {:?}",
        list_netns(&plan.prefix)
    );
}

/// `testbed up --control-plane real` → `testbed exec -- kubectl` (HTTPS, admin
/// certificate) → `testbed api deny` with a singular resource refused, a plural one
/// enforced → `testbed down` leaves no control-plane process.
#[test]
fn testbed_up_real_serves_kubectl_and_api_deny_and_down_leaves_nothing() {
    let Some(bin) = binaries() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let state = std::env::temp_dir().join(format!("fp-realcp-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let tb = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_testbed"));
        c.arg("--state-dir").arg(&state).args(args);
        c.env(control_plane::BIN_ENV, &bin);
        output_within(c, Duration::from_secs(240))
    };
    struct Down<'a>(&'a dyn Fn(&[&str]) -> Output);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = (self.0)(&["down"]);
        }
    }
    let _down = Down(&tb);
    let up = tb(&[
        "up",
        "--nodes",
        "1",
        "--control-plane",
        "real",
        "--timeout",
        "200s",
    ]);
    assert!(
        up.status.success(),
        "testbed up --control-plane real: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let plan = Plan::load(&state).expect("plan.json");
    let who = tb(&[
        "exec",
        "--",
        "kubectl",
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(
        ok_stdout(&who, "testbed exec kubectl auth whoami"),
        "firstpacket-admin"
    );
    // `kubeconfig` (this machine, through the relay) works too.
    let local = Command::new("kubectl")
        .arg(format!(
            "--kubeconfig={}",
            state.join("kubeconfig").display()
        ))
        .args(["get", "ns", "default", "-o", "name"])
        .output()
        .unwrap();
    assert_eq!(
        ok_stdout(&local, "kubectl with $STATE/kubeconfig").trim(),
        "namespace/default"
    );

    let bad = tb(&["api", "deny", "create", "pod"]);
    assert!(!bad.status.success(), "singular resource accepted");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("\"pods\""),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    ok_stdout(
        &tb(&["api", "deny", "create", "configmaps", "-n", "default"]),
        "api deny",
    );
    let denied = tb(&[
        "exec",
        "--",
        "kubectl",
        "create",
        "configmap",
        "x",
        "-n",
        "default",
    ]);
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(
        !denied.status.success(),
        "create configmap in default still allowed"
    );
    // kubectl create words it `configmaps is forbidden: User … cannot create …`.
    assert!(
        err.contains("forbidden") && err.contains("testbed api deny"),
        "{err}"
    );
    ok_stdout(
        &tb(&[
            "exec",
            "--",
            "kubectl",
            "create",
            "configmap",
            "x",
            "-n",
            "kube-public",
        ]),
        "create in another namespace",
    );
    ok_stdout(&tb(&["api", "allow", "all"]), "api allow all");
    ok_stdout(
        &tb(&[
            "exec",
            "--",
            "kubectl",
            "create",
            "configmap",
            "x",
            "-n",
            "default",
        ]),
        "create after allow all",
    );

    // `api stop`: kube-apiserver gone (connections refused), etcd stays; `api start`
    // brings the same objects back.
    ok_stdout(&tb(&["api", "stop"]), "api stop");
    let stopped = tb(&[
        "exec",
        "--",
        "kubectl",
        "--request-timeout=5s",
        "get",
        "configmap",
        "x",
    ]);
    assert!(
        !stopped.status.success(),
        "kubectl worked while the API was stopped"
    );
    ok_stdout(&tb(&["api", "start"]), "api start");
    let cm = tb(&[
        "exec",
        "--",
        "kubectl",
        "get",
        "configmap",
        "x",
        "-o",
        "name",
    ]);
    assert_eq!(
        ok_stdout(&cm, "get configmap x after api start").trim(),
        "configmap/x"
    );

    let daemon_pid: i32 = std::fs::read_to_string(state.join("daemon.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pids: Vec<i32> = control_plane::BINARIES
        .iter()
        .filter_map(|b| {
            std::fs::read_to_string(state.join(format!("control-plane/{b}.pid")))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(pids.len(), 4, "pid files");
    ok_stdout(&tb(&["down"]), "testbed down");
    for p in &pids {
        assert!(
            control_plane::BINARIES
                .iter()
                .all(|b| !control_plane::process_runs(*p, b)),
            "control-plane pid {p} survived testbed down"
        );
    }
    assert!(
        !control_plane::process_runs(daemon_pid, "testbed"),
        "daemon {daemon_pid} survived testbed down"
    );
    assert!(list_netns(&plan.prefix).is_empty());
    assert!(!state.exists(), "state dir left");
}

/// A component that dies at start: `ControlPlane::start` fails naming the component,
/// its log file and quoting the log's last lines, and leaves no process behind. Runs
/// with stand-in binaries (shell scripts), so it needs only root.
#[test]
fn a_component_that_exits_at_start_fails_start_with_its_log_tail() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: needs root (network namespaces)");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("fp-realcp-fail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let plan = Plan::new(&dir, 1).expect("plan");
    let _cleanup = Cleanup { plan: plan.clone() };
    Dataplane::create(&plan).expect("create the host netns");
    let bin = dir.join("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for b in control_plane::BINARIES {
        let script = format!("#!/bin/sh\necho \"{b}: cannot start (stand-in binary)\"\nexit 3\n");
        let p = bin.join(b);
        std::fs::write(&p, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut cfg = Config::for_plan(&plan, &bin);
    cfg.ready_timeout = Duration::from_secs(20);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = format!(
        "{:#}",
        rt.block_on(ControlPlane::start(cfg.clone())).unwrap_err()
    );
    assert!(e.contains("etcd exited before healthy"), "{e}");
    assert!(
        e.contains(&cfg.log_path("etcd").display().to_string()),
        "{e}"
    );
    assert!(e.contains("etcd: cannot start (stand-in binary)"), "{e}");
    assert!(control_plane::processes_from(&bin).is_empty());
}

/// The daemon killed with SIGKILL (no cleanup of its own): every control-plane process
/// dies with it (`PR_SET_PDEATHSIG`), before any `testbed down`.
#[test]
fn control_plane_processes_die_with_a_killed_daemon() {
    let Some(bin) = binaries() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let state = std::env::temp_dir().join(format!("fp-realcp-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let tb = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_testbed"));
        c.arg("--state-dir").arg(&state).args(args);
        c.env(control_plane::BIN_ENV, &bin);
        output_within(c, Duration::from_secs(240))
    };
    struct Down<'a>(&'a dyn Fn(&[&str]) -> Output);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = (self.0)(&["down"]);
        }
    }
    let _down = Down(&tb);
    let up = tb(&["up", "--nodes", "1", "--control-plane", "real"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let pid_of = |name: &str| -> i32 {
        std::fs::read_to_string(state.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .trim()
            .parse()
            .unwrap()
    };
    let daemon = pid_of("daemon.pid");
    let cps: Vec<(i32, &str)> = control_plane::BINARIES
        .iter()
        .map(|b| (pid_of(&format!("control-plane/{b}.pid")), *b))
        .collect();
    for (p, b) in &cps {
        assert!(control_plane::process_runs(*p, b), "{b} ({p}) not running");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for(
        "control plane gone after the daemon's SIGKILL",
        Duration::from_secs(10),
        || {
            cps.iter()
                .all(|(p, b)| !control_plane::process_runs(*p, b))
                .then_some(())
        },
    );
}

/// `testbed up --control-plane real` without the binaries fails at once with one line
/// saying how to build them, and starts nothing.
#[test]
fn up_real_without_binaries_says_to_run_the_script() {
    let state = std::env::temp_dir().join(format!("fp-realcp-nobin-{}", std::process::id()));
    let empty = state.with_extension("bin");
    std::fs::create_dir_all(&empty).unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_testbed"));
    c.arg("--state-dir")
        .arg(&state)
        .args(["up", "--nodes", "1", "--control-plane", "real"])
        .env(control_plane::BIN_ENV, &empty);
    let out = output_within(c, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("run `bash scripts/control-plane.sh`"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!state.join("daemon.pid").exists(), "a daemon was started");
    let _ = std::fs::remove_dir_all(&state);
    let _ = std::fs::remove_dir_all(&empty);
}
