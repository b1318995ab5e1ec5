//! The prober's RBAC, `manifests/base/rbac.yaml`, as one source of truth, judged by the
//! real control plane (`testbed up --control-plane real`):
//!
//! - scenario S1 passes in a namespace enforcing Pod Security `restricted` with exactly
//!   `rbac.yaml`, its probe containers non-root; and
//! - the (verb, resource, namespace scope) set the prober used — `prober gate` with every
//!   probe kind and agent scrapes through the pod proxy, then `prober run --leader-elect` until it has
//!   put a `FirstPacketSlow` Event on a Node, both with the ServiceAccount's own
//!   kubeconfig, read from kube-apiserver's audit log by that user — equals what
//!   `rbac.yaml` grants: no verb more, none less, and no request refused.
//!
//! What taking each rule away does (the RBAC table of docs/src/install.md, row by row) and that the
//! table lists exactly what `rbac.yaml` grants are checked in the middle tier,
//! `prober/tests/engine_rbac.rs` (the testbed's API Store in-process, its `deny`).
//!
//! Needs root, `ip`, `kubectl`, the workspace binaries and the control plane's binaries
//! (`bash scripts/control-plane.sh`); without the latter the testbed tests print why and
//! pass without checking anything.

mod common;

use common::{poll_until, repo_file, Testbed, SERIAL};
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The probe namespace and ServiceAccount `rbac.yaml` is written for.
const NAMESPACE: &str = "firstpacket";
const SERVICE_ACCOUNT: &str = "firstpacket";
const USER: &str = "system:serviceaccount:firstpacket:firstpacket";

/// Scenario S1: a healthy dataplane with a visible delay (endpoints programmed after
/// 300 ms on every node).
const HEALTHY: &str = "rules:\n  - nodes: {all: true}\n    program_delay: 300ms\n";

/// No new endpoint is ever programmed: every probe's target stays not Ready and the
/// probe fails after its give-up period (the paths that re-read a pod and its nodes).
const NEVER_PROGRAMMED: &str = "rules:\n  - nodes: {all: true}\n    never_program: true\n";

/// Then node-2 applies new pods' dataplane 6–8 s late (scenario S2), so `prober run`
/// finds a slow probe to put an Event on; the other nodes stay healthy.
const SLOW_NODE_2: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [100ms, 300ms]}
  - nodes: {labels: {os: debian13}}
    program_delay: {uniform: [6s, 8s]}
";

/// Where a grant applies: every namespace and the cluster scope (a ClusterRole bound by
/// a ClusterRoleBinding), or one namespace (a RoleBinding).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Everywhere,
    Namespace(String),
}

/// One (verb, resource, scope) of `rbac.yaml`; `resource` as RBAC names it
/// (`pods/proxy` for a subresource).
type Grant = (String, String, Scope);

/// Everything `rbac.yaml` grants ServiceAccount `firstpacket/firstpacket`: each rule of
/// each Role/ClusterRole a binding of that subject refers to, expanded per verb and
/// resource. Panics on rules this check cannot judge (other API groups, resourceNames,
/// wildcards), so they cannot slip through.
fn granted(yaml: &str) -> BTreeSet<Grant> {
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("rbac.yaml document"))
        .filter(|v: &Value| !v.is_null())
        .collect();
    let rules_of = |kind: &str, name: &str, ns: Option<&str>| -> Vec<Value> {
        let role = docs
            .iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && (kind == "ClusterRole" || d["metadata"]["namespace"].as_str() == ns)
            })
            .unwrap_or_else(|| panic!("rbac.yaml binds {kind} {name} but does not define it"));
        role["rules"].as_array().cloned().unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for b in &docs {
        let scope = match b["kind"].as_str() {
            Some("ClusterRoleBinding") => Scope::Everywhere,
            Some("RoleBinding") => Scope::Namespace(
                b["metadata"]["namespace"]
                    .as_str()
                    .expect("RoleBinding namespace")
                    .to_owned(),
            ),
            _ => continue,
        };
        let ours = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == SERVICE_ACCOUNT
                && s["namespace"] == NAMESPACE
        });
        if !ours {
            continue;
        }
        let ns = match &scope {
            Scope::Namespace(n) => Some(n.as_str()),
            Scope::Everywhere => None,
        };
        let kind = b["roleRef"]["kind"].as_str().expect("roleRef.kind");
        let name = b["roleRef"]["name"].as_str().expect("roleRef.name");
        for rule in rules_of(kind, name, ns) {
            // The core group, coordination.k8s.io for the instance Leases and
            // networking.k8s.io for the probe NetworkPolicies (resource names do not
            // collide, so grants are keyed by resource name).
            assert!(
                rule["apiGroups"] == serde_json::json!([""])
                    || rule["apiGroups"] == serde_json::json!(["coordination.k8s.io"])
                    || rule["apiGroups"] == serde_json::json!(["networking.k8s.io"]),
                "{rule}"
            );
            assert!(rule["resourceNames"].is_null(), "{rule}");
            for r in rule["resources"].as_array().expect("resources") {
                for v in rule["verbs"].as_array().expect("verbs") {
                    let (r, v) = (r.as_str().unwrap(), v.as_str().unwrap());
                    assert!(r != "*" && v != "*", "wildcard in {rule}");
                    out.insert((v.to_owned(), r.to_owned(), scope.clone()));
                }
            }
        }
    }
    out
}

/// The user's requests in the audit log, one per request (stage ResponseComplete), as
/// (verb, resource[/subresource], namespace or "" for cluster-scoped, HTTP code).
fn requests_of(tb: &Testbed, user: &str) -> Vec<(String, String, String, u64)> {
    tb.audit_events()
        .iter()
        .filter(|e| e["user"]["username"] == user && e["stage"] == "ResponseComplete")
        .filter_map(|e| {
            let o = &e["objectRef"];
            let mut resource = o["resource"].as_str()?.to_owned();
            if let Some(sub) = o["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            Some((
                e["verb"].as_str()?.to_owned(),
                resource,
                o["namespace"].as_str().unwrap_or("").to_owned(),
                e["responseStatus"]["code"].as_u64().unwrap_or(0),
            ))
        })
        .collect()
}

/// The grants a request needs: the namespaced one and the everywhere one, either does.
fn grants_for(verb: &str, resource: &str, ns: &str) -> Vec<Grant> {
    let mut g = vec![(verb.to_owned(), resource.to_owned(), Scope::Everywhere)];
    if !ns.is_empty() {
        g.push((
            verb.to_owned(),
            resource.to_owned(),
            Scope::Namespace(ns.to_owned()),
        ));
    }
    g
}

fn rbac_yaml() -> String {
    std::fs::read_to_string(repo_file("manifests/base/rbac.yaml"))
        .expect("manifests/base/rbac.yaml")
}

/// `testbed up --control-plane real` with `fault` (node-2 labelled `os=debian13`), the
/// probe namespace (`manifests/base/namespace.yaml`, Pod Security `restricted`) and
/// `rbac.yaml` applied; returns it with a kubeconfig of the ServiceAccount; `None` after
/// printing why not.
fn up_real(name: &str, fault: &str) -> Option<(Testbed, std::path::PathBuf)> {
    let tb = Testbed::up_real(name, 3, fault, &["--node-labels", "node-2=os=debian13"])?;
    tb.kubectl(&[
        "apply",
        "-f",
        repo_file("manifests/base/namespace.yaml").to_str().unwrap(),
    ]);
    apply_rbac(&tb, &rbac_yaml());
    let kubeconfig = tb.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT);
    Some((tb, kubeconfig))
}

/// `kubectl apply` of an RBAC manifest, then waits until the API server's authorizer
/// says yes to every grant in it (RBAC changes reach the authorizer through its
/// informers, a moment after the write).
fn apply_rbac(tb: &Testbed, yaml: &str) {
    let path = tb
        .state
        .join(format!("rbac-{}.yaml", common::rand_suffix()));
    std::fs::write(&path, yaml).expect("write rbac");
    tb.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    for (verb, resource, scope) in granted(yaml) {
        wait_can_i(tb, &verb, &resource, &scope);
    }
}

/// Polls `kubectl auth can-i --as USER` for one grant until it answers yes.
fn wait_can_i(tb: &Testbed, verb: &str, resource: &str, scope: &Scope) {
    let ns = match scope {
        Scope::Namespace(n) => n.clone(),
        // A namespace no rule names: only an everywhere grant answers yes there.
        Scope::Everywhere => "kube-node-lease".to_owned(),
    };
    let answer = poll_until(
        Duration::from_secs(20),
        || {
            let mut args = vec!["kubectl", "auth", "can-i", verb];
            // kubectl names a subresource apart: `can-i get pods --subresource=proxy`.
            let sub;
            match resource.split_once('/') {
                Some((r, s)) => {
                    sub = format!("--subresource={s}");
                    args.extend([r, sub.as_str()]);
                }
                None => args.push(resource),
            }
            args.extend(["-n", &ns, "--as", USER]);
            let out = tb.exec(&args);
            String::from_utf8_lossy(&out.stdout).trim() == "yes"
        },
        |yes| *yes,
    );
    assert!(
        answer,
        "kubectl auth can-i {verb} {resource} -n {ns} --as {USER}"
    );
}

/// `prober run --leader-elect` (a single replica: it leads, using the leader Lease's
/// verbs) on the host with `kubeconfig`, until a `FirstPacketSlow` Event exists (or
/// `within`, or a request it needs was refused), then SIGTERM; returns its stderr (JSON
/// log lines) and exit code.
fn run_until_slow_event(tb: &Testbed, kubeconfig: &str, within: Duration) -> (String, i32, bool) {
    // Only this run's Events count: an earlier run's are removed first.
    tb.kubectl(&[
        "delete",
        "events",
        "-n",
        "default",
        "--field-selector",
        "reason=FirstPacketSlow",
    ]);
    // The baseline ConfigMap of an earlier run would spare this one its create.
    tb.kubectl(&[
        "delete",
        "configmap",
        "-n",
        "firstpacket",
        "firstpacket-baseline",
        "--ignore-not-found",
    ]);
    let log = tb.state.join(format!("run-{}.log", common::rand_suffix()));
    let port = 20_000 + ((std::process::id() + 29) % 20_000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let mut child = tb
        .cmd()
        .args([
            "exec",
            "--",
            "prober",
            "run",
            "--leader-elect",
            "--kubeconfig",
            kubeconfig,
            "--probe-interval",
            "2s",
            "--hold",
            "1s",
            "--give-up",
            "20s",
            "--admin-addr",
            &addr,
            "--log-format",
            "json",
            // The baseline ConfigMap is written within seconds of the first probe.
            "--baseline-save-interval",
            "2s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
        .spawn()
        .expect("spawn prober run");
    let deadline = Instant::now() + within;
    let mut seen = false;
    while Instant::now() < deadline {
        let out = tb.exec(&[
            "kubectl",
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "reason=FirstPacketSlow",
            "-o",
            "name",
        ]);
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            seen = true;
            break;
        }
        // The prober logs "probe done … slow" before it writes the Event: once a slow
        // probe is logged and the Event write was refused, waiting longer shows nothing.
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("\"result\":\"slow\"") && text.contains("events") && text.contains("403") {
            break;
        }
        // The leader Lease refused (get or update): this replica cannot lead (for
        // long), so no Event comes.
        if text.contains("leader election") && text.contains("403") {
            break;
        }
        // The baseline ConfigMap refused (get at the term's start, patch or create at
        // a save): the audit check fails on it; the run need not wait for an Event.
        if text.contains("configmaps") && text.contains("403") {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    // The process `testbed exec` runs is `ip netns exec … prober`, which execs: the
    // prober is the child itself.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait prober run") {
            break st.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("prober run did not exit within 40 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (
        std::fs::read_to_string(&log).unwrap_or_default(),
        code,
        seen,
    )
}

/// `prober gate` with every probe kind, agent scrapes through the pod proxy.
fn gate_every_kind(tb: &Testbed, kubeconfig: &str) -> (i32, Value, String) {
    tb.gate(&[
        "--kubeconfig",
        kubeconfig,
        "--kinds",
        "cross_node,same_node,recreate,service,burst,policy,policy_change",
        "--burst-size",
        "2",
        "--pairs",
        "1",
        "--agent-scrape",
        "proxy",
        "--give-up",
        "20s",
    ])
}

/// The probe-pod container processes seen on the host (the testbed runs containers as
/// local processes): `(pod name, Uid, NoNewPrivs, CapEff)` from `/proc/PID/status`, for
/// `target-server` processes whose environment has `POD_NAMESPACE=firstpacket` (the
/// probe pods' downward API) — collected every 100 ms until `stop` is set.
fn watch_probe_processes(
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<BTreeSet<(String, u32, u32, String)>> {
    std::thread::spawn(move || {
        let mut seen = BTreeSet::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                // The container itself, not the testbed's shim before its exec (which
                // carries the same environment as root until it drops privileges).
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                if comm.trim() != "target-server" {
                    continue;
                }
                let Ok(env) = std::fs::read(e.path().join("environ")) else {
                    continue;
                };
                let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
                if !vars.iter().any(|v| *v == b"POD_NAMESPACE=firstpacket") {
                    continue;
                }
                let Some(pod) = vars.iter().find_map(|v| v.strip_prefix(b"POD_NAME=")) else {
                    continue;
                };
                let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                    continue;
                };
                let field = |k: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(k))
                        .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
                        .unwrap_or_default()
                };
                seen.insert((
                    String::from_utf8_lossy(pod).into_owned(),
                    field("Uid:").parse().unwrap_or(0),
                    field("NoNewPrivs:").parse().unwrap_or(0),
                    field("CapEff:"),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        seen
    })
}

/// A kubeconfig with two contexts: `elsewhere` (current, an API address nothing
/// listens on) and `firstpacket` (the testbed, as the ServiceAccount), so only
/// `--context firstpacket` reaches the testbed.
fn two_contexts(tb: &Testbed, sa_kubeconfig: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(sa_kubeconfig).expect("kubeconfig");
    let two = text
        .replace(
            "clusters:\n",
            "clusters:\n- name: elsewhere\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\n",
        )
        .replace(
            "contexts:\n",
            "contexts:\n- name: elsewhere\n  context: {cluster: elsewhere, user: firstpacket}\n",
        )
        .replace(
            "current-context: firstpacket\n",
            "current-context: elsewhere\n",
        );
    assert_ne!(two, text, "kubeconfig shape changed");
    let path = tb.state.join("kubeconfig-two-contexts");
    std::fs::write(&path, two).expect("write kubeconfig");
    path
}

/// S1 in a namespace enforcing Pod Security `restricted`, with exactly `rbac.yaml`
/// (the ServiceAccount's token, its context picked by `--context` out of two): the gate
/// passes, each TTFP within the accuracy target of the ground truth, and every probe
/// container process runs non-root with no_new_privs and no effective capability. Then
/// every probe kind with agent scrapes through the proxy, and `prober run` (node-2 turned
/// slow at runtime) until it puts a `FirstPacketSlow` Event on a Node: the audit log shows
/// the ServiceAccount used exactly what `rbac.yaml` grants, and was never refused.
#[test]
fn rbac_yaml_grants_exactly_what_gate_and_run_use() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some((tb, kubeconfig)) = up_real("rbacuse", HEALTHY) else {
        return;
    };
    let two = two_contexts(&tb, &kubeconfig);
    let kubeconfig = kubeconfig.to_str().unwrap().to_owned();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = watch_probe_processes(stop.clone());
    let (code, report, out) = tb.gate(&[
        "--kubeconfig",
        two.to_str().unwrap(),
        "--context",
        SERVICE_ACCOUNT,
        "--pairs",
        "3",
        "--hold",
        "3s",
    ]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let processes = watcher.join().expect("process watcher");
    assert_eq!(
        code, 0,
        "S1 gate in a restricted namespace with rbac.yaml:\n{out}"
    );
    let truth = tb.truth();
    let probes = report["probes"].as_array().expect("probes");
    assert_eq!(probes.len(), 3, "{out}");
    for p in probes {
        common::assert_ttfp_near_truth(&truth, p, &out);
    }
    assert!(!processes.is_empty(), "no probe container process seen");
    for (pod, uid, nnp, cap) in &processes {
        assert!(
            *uid != 0 && *nnp == 1 && cap.trim_start_matches('0').is_empty(),
            "probe pod {pod}: Uid {uid}, NoNewPrivs {nnp}, CapEff {cap}: want non-root, no_new_privs, no capability"
        );
    }
    eprintln!("probe container processes: {processes:?}");

    let (code, report, out) = gate_every_kind(&tb, &kubeconfig);
    assert!(
        code == 0 || code == 1,
        "gate with rbac.yaml exited {code}: {}\n{out}",
        report["errors"]
    );
    assert!(
        report["errors"].as_array().is_none_or(|e| e.is_empty()),
        "gate errors with rbac.yaml: {}",
        report["errors"]
    );
    // A failing probe: its nodes read (by name, through list) to tell node_not_ready.
    tb.set_fault(NEVER_PROGRAMMED);
    let (code, report, out) = tb.gate(&["--kubeconfig", &kubeconfig, "--give-up", "8s"]);
    assert_eq!(
        code, 1,
        "gate with no endpoint ever programmed: {}\n{out}",
        report["errors"]
    );
    assert_eq!(report["probes"][0]["result"], "failed", "{out}");
    tb.wait_no_probe_pods(Duration::from_secs(60));
    tb.set_fault(SLOW_NODE_2);
    let (log, code, seen) = run_until_slow_event(&tb, &kubeconfig, Duration::from_secs(120));
    assert!(seen, "no FirstPacketSlow Event from prober run:\n{log}");
    assert_eq!(code, 0, "prober run exit code after SIGTERM:\n{log}");

    let grants = granted(&rbac_yaml());
    let requests = requests_of(&tb, USER);
    assert!(
        !requests.is_empty(),
        "no request by {USER} in the audit log"
    );
    let refused: BTreeSet<String> = requests
        .iter()
        .filter(|r| r.3 == 403)
        .map(|(v, r, ns, _)| format!("{v} {r} in {ns:?}"))
        .collect();
    assert!(
        refused.is_empty(),
        "rbac.yaml is missing what the prober used (refused: {refused:?})"
    );
    let mut used = BTreeSet::new();
    let mut ungranted = BTreeSet::new();
    for (verb, resource, ns, _) in &requests {
        let g: Vec<Grant> = grants_for(verb, resource, ns)
            .into_iter()
            .filter(|g| grants.contains(g))
            .collect();
        if g.is_empty() {
            ungranted.insert(format!("{verb} {resource} in {ns:?}"));
        }
        used.extend(g);
    }
    eprintln!("{USER} used: {used:?}");
    assert!(
        ungranted.is_empty(),
        "used but not in rbac.yaml: {ungranted:?}"
    );
    let unused: Vec<&Grant> = grants.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "rbac.yaml grants what neither gate nor run used: {unused:?}"
    );
}
