//! `testbed cni` as a container runtime calls it (testbed::cni): a network namespace
//! made the way containerd makes one (a file outside `/run/netns` bind-mounted onto
//! the namespace of a thread that unshared it), the built binary run with the CNI
//! environment and the network configuration on stdin, against a running 2-node
//! testbed. Needs root, `ip`, `nft` and the workspace binaries.

mod common;

use common::{poll_until, Testbed, SERIAL};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testbed::dataplane::calico_iface_name;
use testbed::truth::TruthKind;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn root() -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    eprintln!("SKIPPED: needs root (network namespaces)");
    false
}

/// A network namespace held by a bind mount on a file of our own, as containerd's
/// `CNI_NETNS` (`…/netns/cni-<id>`). Unmounted and removed when dropped.
struct RuntimeNetns(PathBuf);

impl RuntimeNetns {
    fn new(path: PathBuf) -> RuntimeNetns {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::File::create(&path).unwrap();
        let ns = RuntimeNetns(path);
        let p = ns.0.clone();
        std::thread::spawn(move || -> nix::Result<()> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &p,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
        })
        .join()
        .unwrap()
        .expect("unshare a netns and bind-mount it");
        ns
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// `(dev, ino)` of the namespace (the same for every bind mount of it).
    fn id(&self) -> (u64, u64) {
        let m = std::fs::metadata(&self.0).unwrap();
        (m.dev(), m.ino())
    }

    /// Runs `f` on a thread inside the namespace (sockets it makes stay there; a child
    /// it spawns starts there).
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = std::fs::File::open(&self.0).unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// `ip ARGS…` inside the namespace: stdout, or None when it failed.
    fn ip(&self, args: &[&str]) -> Option<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        self.run(move || {
            let o = Command::new("ip").args(&args).output().ok()?;
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
        })
    }
}

impl Drop for RuntimeNetns {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `ip ARGS…` on the machine (with `-n NETNS` in `args`): stdout, or None.
fn ip_cmd(args: &[&str]) -> Option<String> {
    let o = Command::new("ip").args(args).output().unwrap();
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// One plugin run: exit code and stdout. `subcommand`: `testbed cni`, else the binary
/// with no arguments (as a runtime runs a plugin named by `type`).
fn cni(env: &[(&str, &str)], stdin: &str, subcommand: bool) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_testbed"));
    if subcommand {
        c.arg("cni");
    }
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn conf(socket: &Path, node: &str) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "firstpacket",
        "type": "testbed",
        "testbed": {"socket": socket, "node": node},
    })
    .to_string()
}

/// The CNI environment of `command` for container `id` of pod default/`pod` (uid `uid`).
fn env<'a>(
    command: &'a str,
    id: &'a str,
    netns: &'a str,
    args: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", args),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
}

fn error_code(out: &(i32, String)) -> u64 {
    assert_eq!(out.0, 1, "exit code; stdout {}", out.1);
    let v: Value = serde_json::from_str(&out.1).unwrap_or_else(|e| panic!("{e}: {}", out.1));
    for k in ["cniVersion", "msg", "details"] {
        assert!(v[k].is_string(), "{k} in {v}");
    }
    v["code"].as_u64().unwrap()
}

/// `/run/netns` entries named `<prefix>-…` that are bind mounts of namespace `id`.
fn bind_mounts_of(prefix: &str, id: (u64, u64)) -> Vec<String> {
    testbed::dataplane::list_netns(prefix)
        .into_iter()
        .filter(|n| {
            std::fs::metadata(Path::new("/run/netns").join(n))
                .is_ok_and(|m| (m.dev(), m.ino()) == id)
        })
        .collect()
}

/// A TCP server in `ns` on :8080 answering `hi\n` to every connection.
fn serve_in(ns: &RuntimeNetns) {
    let l = ns.run(|| TcpListener::bind("0.0.0.0:8080").unwrap());
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(b"hi\n");
        }
    });
}

/// Connects from netns `from` (a `/run/netns` name) to `ip:8080` and reads the answer.
fn dial(from: &str, ip: Ipv4Addr) -> Option<String> {
    testbed::netns::run_in_netns(from, move || {
        let mut c =
            TcpStream::connect_timeout(&SocketAddr::from((ip, 8080)), Duration::from_millis(500))
                .ok()?;
        c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let mut s = String::new();
        c.read_to_string(&mut s).ok()?;
        Some(s)
    })
    .ok()
    .flatten()
}

#[test]
fn cni_plugin_wires_a_runtime_sandbox_like_the_simulated_kubelet() {
    if !root() {
        return;
    }
    let _g = serial();
    let tb = Testbed::up("cni", 2, "rules: []\n", &[]);
    let prefix = tb.prefix();
    let plan = testbed::plan::Plan::load(&tb.state).unwrap();
    let socket = tb.state.join("cni.sock");
    let ns = RuntimeNetns::new(tb.state.join("runtime/netns/cni-sandbox-1"));
    let node_ns = format!("{prefix}-node-2");
    let (id, uid) = ("c0ffee01", "9b7e-uid-cni-1");
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=cni-pod;K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID={uid}");
    let add_env = env("ADD", id, ns.path(), &args);
    let node2 = conf(&socket, "node-2");

    // ADD: the CNI 1.0 result.
    let out = cni(&add_env, &node2, true);
    assert_eq!(out.0, 0, "ADD: {}", out.1);
    let r: Value = serde_json::from_str(&out.1).unwrap();
    let iface = calico_iface_name("default", "cni-pod");
    let addr = r["ips"][0]["address"].as_str().unwrap().to_owned();
    let ip: Ipv4Addr = addr.strip_suffix("/32").unwrap().parse().unwrap();
    assert!(
        plan.nodes[1].pod_cidr.contains(ip),
        "{ip} not in node-2's block"
    );
    let pod_mac = r["interfaces"][1]["mac"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(pod_mac.len(), 17, "{r}");
    assert_eq!(
        r,
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": iface, "mac": "ee:ee:ee:ee:ee:ee"},
                {"name": "eth0", "mac": pod_mac, "sandbox": ns.path()},
            ],
            "ips": [{"address": addr, "gateway": "169.254.1.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
            "dns": {},
        })
    );
    // The wiring: veth and /32 on the node, the address, routes and MAC in the sandbox.
    let link = ip_cmd(&["-n", &node_ns, "-o", "link", "show", "dev", &iface]).expect("veth");
    assert!(link.contains("ee:ee:ee:ee:ee:ee"), "{link}");
    let route = ip_cmd(&["-n", &node_ns, "route", "show", &format!("{ip}/32")]).unwrap();
    assert!(route.contains(&format!("dev {iface}")), "{route}");
    let a = ns.ip(&["-o", "-4", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(a.contains(&format!("inet {ip}/32")), "{a}");
    let d = ns.ip(&["route", "show", "default"]).unwrap();
    assert!(d.contains("via 169.254.1.1 dev eth0"), "{d}");
    let bound = bind_mounts_of(&prefix, ns.id());
    assert_eq!(
        bound.len(),
        1,
        "one /run/netns bind mount of the sandbox: {bound:?}"
    );

    // Truth and the agent: endpoint_added for the uid, then programmed.
    let truth = tb.truth_until(Duration::from_secs(10), |t| {
        t.iter()
            .any(|e| e.event == TruthKind::EndpointProgrammed && e.uid.as_deref() == Some(uid))
    });
    let added: Vec<_> = truth
        .iter()
        .filter(|e| e.event == TruthKind::EndpointAdded && e.uid.as_deref() == Some(uid))
        .collect();
    assert_eq!(added.len(), 1, "{added:?}");
    let e = added[0];
    assert_eq!(
        (e.node.as_deref(), e.namespace.as_deref(), e.pod.as_deref()),
        (Some("node-2"), Some("default"), Some("cni-pod"))
    );
    assert_eq!(
        (e.ip.clone(), e.iface.clone()),
        (Some(ip.to_string()), Some(iface.clone()))
    );
    assert!(
        truth
            .iter()
            .any(|e| e.event == TruthKind::EndpointProgrammed && e.uid.as_deref() == Some(uid)),
        "endpoint_programmed for {uid} within 10 s"
    );
    // Traffic: the node to its pod, and forwarded from the host netns.
    serve_in(&ns);
    for from in [node_ns.clone(), plan.host_netns.clone()] {
        let got = poll_until(Duration::from_secs(5), || dial(&from, ip), Option::is_some);
        assert_eq!(got.as_deref(), Some("hi\n"), "TCP {from} → {ip}:8080");
    }

    // A repeated ADD (here as the runtime runs it: no arguments) answers the same.
    let again = cni(&add_env, &node2, false);
    assert_eq!(again.0, 0, "{}", again.1);
    assert_eq!(serde_json::from_str::<Value>(&again.1).unwrap(), r);

    // CHECK passes, fails without the node's /32, passes again with it back.
    let check_env = env("CHECK", id, ns.path(), &args);
    assert_eq!(cni(&check_env, &node2, true), (0, String::new()));
    ip_cmd(&["-n", &node_ns, "route", "del", &format!("{ip}/32")]).unwrap();
    assert_eq!(
        error_code(&cni(&check_env, &node2, true)),
        testbed::cni::CODE_CHECK_FAILED as u64
    );
    ip_cmd(&[
        "-n",
        &node_ns,
        "route",
        "add",
        &format!("{ip}/32"),
        "dev",
        &iface,
        "scope",
        "link",
    ])
    .unwrap();
    assert_eq!(cni(&check_env, &node2, true), (0, String::new()));

    // DEL: veth, route and bind mount gone; the runtime's namespace file stays.
    let del_env = env("DEL", id, ns.path(), &args);
    assert_eq!(cni(&del_env, &node2, true), (0, String::new()));
    assert!(ip_cmd(&["-n", &node_ns, "-o", "link", "show", "dev", &iface]).is_none());
    let route = ip_cmd(&["-n", &node_ns, "route", "show", &format!("{ip}/32")]).unwrap();
    assert!(route.trim().is_empty(), "{route}");
    assert_eq!(bind_mounts_of(&prefix, ns.id()), Vec::<String>::new());
    assert!(ns.ip(&["-o", "link", "show", "dev", "eth0"]).is_none());
    assert!(
        ns.ip(&["-o", "link", "show", "dev", "lo"]).is_some(),
        "runtime netns gone"
    );
    // DEL again, and of a container never added: success. CHECK now: unknown.
    assert_eq!(cni(&del_env, &node2, true), (0, String::new()));
    assert_eq!(
        cni(&env("DEL", "never-added", "", ""), &node2, true),
        (0, String::new())
    );
    assert_eq!(
        error_code(&cni(&check_env, &node2, true)),
        testbed::cni::CODE_UNKNOWN_CONTAINER as u64
    );
    // An unknown node is an invalid configuration.
    assert_eq!(
        error_code(&cni(&add_env, &conf(&socket, "node-9"), true)),
        testbed::cni::CODE_INVALID_CONFIG as u64
    );

    // Fault cni_add_delay on node-1: the ADD takes that long before the wiring.
    tb.set_fault("rules:\n  - nodes: {names: [node-1]}\n    cni_add_delay: 1500ms\n");
    let ns2 = RuntimeNetns::new(tb.state.join("runtime/netns/cni-sandbox-2"));
    let args2 = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=cni-pod-2;K8S_POD_UID=uid-cni-2";
    let started = Instant::now();
    let out = cni(
        &env("ADD", "c0ffee02", ns2.path(), args2),
        &conf(&socket, "node-1"),
        true,
    );
    let took = started.elapsed();
    assert_eq!(out.0, 0, "{}", out.1);
    assert!(took >= Duration::from_millis(1500), "ADD took {took:?}");
    let r2: Value = serde_json::from_str(&out.1).unwrap();
    let ip2: Ipv4Addr = r2["ips"][0]["address"]
        .as_str()
        .unwrap()
        .trim_end_matches("/32")
        .parse()
        .unwrap();
    assert!(plan.nodes[0].pod_cidr.contains(ip2), "{ip2}");
    assert_eq!(bind_mounts_of(&prefix, ns2.id()).len(), 1);

    // `testbed down` with that sandbox still added: nothing of the prefix is left, the
    // runtime's file still holds its namespace; then the daemon is unreachable.
    let mut down = tb.cmd();
    down.arg("down");
    assert!(down.status().unwrap().success());
    assert_eq!(
        testbed::dataplane::list_netns(&prefix),
        Vec::<String>::new()
    );
    assert!(ns2.ip(&["-o", "link", "show", "dev", "lo"]).is_some());
    assert!(!socket.exists());
    assert_eq!(
        error_code(&cni(&add_env, &node2, true)),
        testbed::cni::CODE_TRY_AGAIN as u64
    );
}

#[test]
fn cni_plugin_errors_are_cni_error_results() {
    // No daemon needed: these fail before or at the connection.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cni.sock");
    let args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p";
    let add = env("ADD", "c1", "/var/run/netns/cni-x", args);
    assert_eq!(
        error_code(&cni(&add, &conf(&socket, "node-1"), true)),
        testbed::cni::CODE_TRY_AGAIN as u64
    );
    assert_eq!(
        error_code(&cni(&add, "{\"cniVersion\": \"1.0.0\", ", true)),
        testbed::cni::CODE_DECODE as u64
    );
    assert_eq!(
        error_code(&cni(
            &add,
            r#"{"cniVersion":"1.0.0","name":"n","type":"testbed"}"#,
            true
        )),
        testbed::cni::CODE_INVALID_CONFIG as u64
    );
    assert_eq!(
        error_code(&cni(
            &env("ADD", "c1", "", args),
            &conf(&socket, "node-1"),
            true
        )),
        testbed::cni::CODE_INVALID_ENV as u64
    );
    // VERSION, as a runtime runs the plugin (no arguments).
    let (code, out) = cni(
        &[("CNI_COMMAND", "VERSION")],
        r#"{"cniVersion":"1.0.0"}"#,
        false,
    );
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cniVersion"], "1.0.0");
    for want in ["0.4.0", "1.0.0"] {
        assert!(
            v["supportedVersions"]
                .as_array()
                .unwrap()
                .contains(&json!(want)),
            "{v}"
        );
    }
}
