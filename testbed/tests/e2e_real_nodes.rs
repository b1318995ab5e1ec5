//! Real kubelets and containerd on the testbed's nodes (`testbed up --control-plane real
//! --kubelet real`): the probe pods run the built OCI images under runc as a cluster
//! runs them, their network from `testbed cni`, and the gate's TTFP is judged against
//! truth read off the node's wire (`testbed::wire`).
//!
//! Needs root, the real control plane and kubelet (`bash scripts/control-plane.sh`),
//! containerd and runc (`bash scripts/setup.sh`) and the images (`bash
//! scripts/image.sh`); prints SKIPPED without the first three. Tests run one at a time
//! (real kubelets share host paths).

mod common;

use common::{assert_ttfp_near_truth, poll_until, proc_status, validate, Testbed, SERIAL};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Starts a real-node testbed, or `None` after printing why it cannot run here.
fn up(name: &str, nodes: usize, fault: &str) -> Option<Testbed> {
    Testbed::up_real_nodes(name, nodes, fault, &[])
}

/// The parent pid of `pid`.
fn ppid(pid: i32) -> i32 {
    proc_status(pid)
        .get("PPid")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// Whether `/` of process `pid` is mounted read-only (its mountinfo's root entry).
fn root_read_only(pid: i32) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(4) == Some(&"/") && f.get(5).is_some_and(|o| o.split(',').any(|x| x == "ro"))
    })
}

/// What a real node leaves on the host that `down` must remove, for state dir `state`
/// and netns prefix `prefix`: processes (kubelet, containerd, shims of this state dir),
/// mounts under it, cgroup roots `<prefix>-node-*`, netns, and the shared host paths
/// that did not exist before (`created`).
fn leftovers(state: &Path, prefix: &str, created: &[PathBuf]) -> Vec<String> {
    let mut left = Vec::new();
    let st = state.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if e.file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
            .is_none()
        {
            continue;
        }
        let cmd =
            String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).unwrap_or_default())
                .replace('\0', " ");
        if cmd.contains(&st) && (cmd.contains("kubelet") || cmd.contains("containerd")) {
            left.push(format!(
                "process {}: {cmd}",
                e.file_name().to_string_lossy()
            ));
        }
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for l in info.lines() {
        if let Some(m) = l.split_whitespace().nth(4) {
            if m.starts_with(&st) {
                left.push(format!("mount {m}"));
            }
        }
    }
    for h in testbed::realnode::cgroup_hierarchies().unwrap_or_default() {
        for e in std::fs::read_dir(&h).into_iter().flatten().flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{prefix}-node-"))
            {
                left.push(format!("cgroup {}", e.path().display()));
            }
        }
    }
    for n in common::netns_list().lines() {
        if n.starts_with(prefix) {
            left.push(format!("netns {n}"));
        }
    }
    for p in created {
        if p.exists() {
            left.push(format!("shared host path {}", p.display()));
        }
    }
    left
}

/// S1 on real kubelets: nodes run containerd, the gate passes with every TTFP within
/// the dial interval of the wire truth, every source's report reached the prober
/// through the kubelet's termination message, the probe pods run the built image as
/// UID 65532 under `containerd-shim-runc-v2` with no capabilities, a read-only root
/// and seccomp on; the kubectl suite works; `down` leaves nothing.
#[test]
fn s1_on_real_kubelets_matches_the_wire_truth_and_down_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let created = testbed::realnode::SharedHostPaths::record();
    let Some(tb) = up("realnode", 2, "rules: []\n") else {
        return;
    };
    let prefix = tb.prefix();

    // The Nodes are the real kubelet's, on containerd.
    let runtimes = tb.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.nodeInfo.containerRuntimeVersion} {.status.nodeInfo.kubeletVersion}{\"\\n\"}{end}",
    ]);
    for l in runtimes.lines() {
        assert!(
            l.contains("containerd://1.") && l.contains(" v1."),
            "not a real kubelet on containerd: {l}"
        );
    }

    // A gate whose probe pods live long enough to be looked at (--hold 4s).
    // (A second handle on the same testbed, forgotten so that its Drop does not run
    // `down`.)
    let gate = std::thread::spawn({
        let tb = std::mem::ManuallyDrop::new(Testbed {
            state: tb.state.clone(),
        });
        move || {
            tb.gate(&[
                "--pairs",
                "4",
                "--kinds",
                "cross_node,same_node",
                "--hold",
                "4s",
            ])
        }
    });
    // While it runs: a target pod's process, as the runtime runs it (found on the
    // node side: `target-server serve` in a cgroup under this testbed's node roots).
    let root = format!("/{prefix}-node-");
    let target = poll_until(
        Duration::from_secs(90),
        || {
            std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .find_map(|e| {
                    let pid: i32 = e.file_name().to_str()?.parse().ok()?;
                    let argv = std::fs::read(e.path().join("cmdline")).ok()?;
                    let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
                    let serve = argv.first()?.ends_with(b"target-server")
                        && argv.get(1).is_some_and(|a| *a == b"serve");
                    let cg = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
                    let uid = cg
                        .split(&['/', '\n'][..])
                        .find_map(|part| part.strip_prefix("pod"))?
                        .to_owned();
                    (serve && cg.contains(&root)).then_some((uid, pid))
                })
        },
        |t| t.is_some() || gate.is_finished(),
    );
    let Some((uid, pid)) = target else {
        let (code, _, out) = gate.join().expect("gate thread");
        panic!("no target pod process seen while the gate ran (exit {code}):\n{out}");
    };
    let st = proc_status(pid);
    let parent = ppid(pid);
    let parent_cmd = std::fs::read_to_string(format!("/proc/{parent}/cmdline")).unwrap_or_default();
    assert!(
        parent_cmd.contains("containerd-shim-runc-v2"),
        "pod {uid}'s process {pid} is not under containerd-shim-runc-v2 but {parent_cmd:?}"
    );
    assert!(
        st.get("Uid")
            .is_some_and(|u| u.split_whitespace().all(|x| x == "65532")),
        "uid: {st:?}"
    );
    assert_eq!(
        st.get("CapEff").map(String::as_str),
        Some("0000000000000000"),
        "{st:?}"
    );
    assert_eq!(
        st.get("NoNewPrivs").map(String::as_str),
        Some("1"),
        "{st:?}"
    );
    assert_eq!(
        st.get("Seccomp").map(String::as_str),
        Some("2"),
        "seccomp filter mode: {st:?}"
    );
    assert!(root_read_only(pid), "pod {uid}'s root is writable");

    let (code, report, out) = gate.join().expect("gate thread");
    assert_eq!(code, 0, "S1 on real kubelets must pass: {out}");
    validate(&report);
    let truth = tb.truth();
    let probes = report["probes"].as_array().cloned().unwrap_or_default();
    assert_eq!(probes.len(), 8, "{out}");
    for p in &probes {
        assert_eq!(p["result"], "success", "{p:#}");
        assert!(
            p["source_report"].is_object(),
            "the source's report (its termination message, through the real kubelet) is missing: {p:#}"
        );
        assert_ttfp_near_truth(&truth, p, &out);
    }
    let wire = truth
        .iter()
        .filter(|e| e.detail["method"] == "wire")
        .count();
    assert!(
        wire >= 2 * probes.len(),
        "truth from the wire: {wire} events"
    );

    kubectl_suite(&tb);
    // An image the node does not have cannot be pulled (no registry is reachable), as
    // on an air-gapped node.
    let stray = tb.manifest(
        "stray.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: stray, namespace: default}\nspec:\n  containers:\n  - name: c\n    image: registry.invalid/nothing:1\n",
    );
    tb.kubectl(&["apply", "-f", &stray]);
    let reason = tb.kubectl_until(
        &[
            "get",
            "pod",
            "stray",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ],
        Duration::from_secs(60),
        |o| o.contains("ErrImagePull") || o.contains("ImagePullBackOff"),
    );
    assert!(
        reason.contains("ErrImagePull") || reason.contains("ImagePullBackOff"),
        "a missing image must fail to pull: {reason:?}"
    );
    tb.kubectl(&["delete", "pod", "stray", "--wait=true", "--timeout=60s"]);

    // `node stop` stops the node's kubelet and containerd: the node-lifecycle controller
    // marks it NotReady; `node start` brings it back.
    let node_status = |tb: &Testbed| {
        tb.kubectl(&[
            "get",
            "node",
            "node-2",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ])
    };
    let out = tb
        .cmd()
        .args(["node", "stop", "node-2"])
        .output()
        .expect("node stop");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node2 = tb.state.join("nodes").join("node-2");
    let running = |dir: &Path| {
        let d = dir.to_string_lossy().into_owned();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                // The kubelet and containerd, not the shims (containers outlive them).
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                cmd.contains(&d) && !cmd.contains("containerd-shim")
            })
            .count()
    };
    assert_eq!(
        running(&node2),
        0,
        "node-2's kubelet or containerd still runs after node stop"
    );
    let status = poll_until(
        // The node-lifecycle controller's grace (20 s) after the last Lease renewal
        // (every 10 s), checked every 2 s, and 10 s of slack.
        Duration::from_secs(20 + 10 + 2 + 10),
        || node_status(&tb),
        |s| s.trim() != "True",
    );
    assert_ne!(status.trim(), "True", "node-2 still Ready after node stop");
    let out = tb
        .cmd()
        .args(["node", "start", "node-2"])
        .output()
        .expect("node start");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = poll_until(
        Duration::from_secs(60),
        || node_status(&tb),
        |s| s.trim() == "True",
    );
    assert_eq!(
        status.trim(),
        "True",
        "node-2 not Ready again after node start"
    );

    // down leaves nothing.
    let out = tb.cmd().arg("down").output().expect("down");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = leftovers(&tb.state, &prefix, created.created());
    assert!(left.is_empty(), "left after down:\n{}", left.join("\n"));
    // (Drop runs `down` again: idempotent.)
}

/// The all-real stack (`--agent calico --kube-proxy real --kubelet real`: nothing
/// between the prober and the packet is this project's code but the CNI wiring and the
/// faults): S1 passes with every kind the sandboxes' lifecycle touches (cross-node,
/// same-node, Service, a recreated StatefulSet-style pod) and TTFP within the dial
/// interval of the truth; S2 on real Felix (`agent_io: {delay: 5s}` on node-2 and
/// node-3) fails naming exactly those nodes, the delay before Ready; S4 (every
/// cross-node route gone) is diagnosed `cross_node_broken` against the same-node
/// control.
#[test]
fn the_all_real_stack_passes_s1_names_the_s2_nodes_and_diagnoses_s4() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = testbed::calico::Builds::locate().require([testbed::calico::DEFAULT_VERSION]) {
        eprintln!("SKIPPED: {e}");
        return;
    }
    let Some(tb) = Testbed::up_real_nodes(
        "allreal",
        4,
        "rules: []\n",
        &[
            "--agent",
            "calico",
            "--kube-proxy",
            "real",
            "--node-labels",
            "node-2=os=debian13,node-3=os=debian13",
        ],
    ) else {
        return;
    };

    // The agents are the real kubelets' static pods, Ready.
    let agents = tb.kubectl_until(
        &[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}",
        ],
        Duration::from_secs(60),
        |o| o.split_whitespace().filter(|x| x.ends_with("=True")).count() == 8,
    );
    for n in 1..=4 {
        for a in ["calico-node", "kube-proxy"] {
            assert!(
                agents.contains(&format!("{a}-node-{n}=True")),
                "{a} is not the Ready static pod of node-{n}: {agents}"
            );
        }
    }

    // S1.
    let (code, report, out) = tb.gate(&[
        "--pairs",
        "4",
        "--kinds",
        "cross_node,same_node,service,recreate",
    ]);
    assert_eq!(code, 0, "S1 on the all-real stack must pass: {out}");
    validate(&report);
    let truth = tb.truth();
    let probes = report["probes"].as_array().cloned().unwrap_or_default();
    assert_eq!(probes.len(), 16, "{out}");
    assert!(
        out.contains("calico-felix 4/4 nodes scraped ok; kube-proxy 4/4 nodes scraped ok"),
        "the static pods' agents are scraped: {out}"
    );
    for p in &probes {
        assert_eq!(p["result"], "success", "{p:#}");
        if p["kind"] != "service" {
            assert_ttfp_near_truth(&truth, p, &out);
        }
    }

    // Every path (issue 33) on real Felix, kube-proxy and kubelets: UDP and full-size
    // packets pass, each path's TTFP within tolerance of the ruleset's truth.
    let (code, report, out) = tb.gate(&[
        "--pairs",
        "2",
        "--kinds",
        "cross_node,same_node",
        "--hold",
        "1s",
        "--protocols",
        "tcp,udp",
        "--payload",
        "mtu",
    ]);
    assert_eq!(
        code, 0,
        "every path must pass on the healthy all-real stack: {out}"
    );
    validate(&report);
    let got = common::paths::paths(&report);
    assert_eq!(got.len(), 4 * 4, "four probes of four paths: {out}");
    assert!(
        got.iter().all(|(_, _, r, _)| r == "success"),
        "{got:?}\n{out}"
    );
    common::paths::paths_near_truth(&tb.truth(), &report, &out);

    kubectl_suite(&tb);

    // S2 on real Felix.
    tb.set_fault(
        &std::fs::read_to_string(common::repo_file("testbed/faults/s2-real-felix.yaml"))
            .expect("S2 fault file"),
    );
    let (code, report, out) = tb.gate(&["--pairs", "4", "--kinds", "cross_node,same_node"]);
    assert_eq!(code, 1, "S2 must fail: {out}");
    assert_eq!(report["summary"]["diagnosis"], "slow_nodes", "{out}");
    assert!(
        out.contains("nodes with only slow/failed probes: node-2, node-3\n"),
        "S2 names exactly node-2 and node-3: {out}"
    );
    assert!(
        out.contains("0 after Ready (in TTFP)"),
        "on real Felix the wait is before Ready: {out}"
    );
    // Felix is the real kubelet's static pod (`calico-node-NODE`): the gate scrapes it
    // and names exactly those nodes' agents with the apply signal.
    let named: std::collections::BTreeSet<String> = probes_of(&report)
        .iter()
        .flat_map(|p| p["suspects"].as_array().cloned().unwrap_or_default())
        .filter(|s| s["signal"] == "dataplane_apply_slow")
        .filter_map(|s| s["node"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        named,
        ["node-2", "node-3"].map(String::from).into(),
        "suspects with dataplane_apply_slow: {out}"
    );

    // S4: every cross-node route gone.
    tb.set_fault("rules:\n  - nodes: {all: true}\n    cross_node: {broken_peers: all}\n");
    let (code, report, out) = tb.gate(&["--pairs", "3", "--kinds", "cross_node,same_node"]);
    assert_eq!(code, 1, "S4 must fail: {out}");
    assert_eq!(report["summary"]["diagnosis"], "cross_node_broken", "{out}");
    let probes = report["probes"].as_array().cloned().unwrap_or_default();
    assert!(
        probes
            .iter()
            .filter(|p| p["kind"] == "cross_node")
            .all(|p| p["result"] != "success"),
        "{out}"
    );
    assert!(
        probes
            .iter()
            .any(|p| p["kind"] == "same_node" && p["result"] == "success"),
        "{out}"
    );
}

/// The kubectl suite on real nodes: `apply -f` of a Deployment whose two replicas turn
/// Ready, `get -o wide` (pod IPs and nodes), `describe` (the runtime's events),
/// `logs` and `exec` through the real kubelet — into a pod that has a shell (the host's
/// `/usr`, `/usr/lib` and `/usr/lib64` mounted read-only at `/usr`, `/lib`, `/lib64`:
/// `/usr/bin/sh`) — and a pod violating Pod Security
/// `restricted` refused by admission in a namespace enforcing it.
fn kubectl_suite(tb: &Testbed) {
    let dep = tb.manifest(
        "deploy.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: web\n        image: ghcr.io/firstpacket/target-server:0.1.0\n        args: [serve, --port, \"8080\"]\n        readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}\n        securityContext: {runAsNonRoot: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}\n        volumeMounts: [{name: usr, mountPath: /usr, readOnly: true}, {name: lib, mountPath: /lib, readOnly: true}, {name: lib64, mountPath: /lib64, readOnly: true}]\n      volumes: [{name: usr, hostPath: {path: /usr}}, {name: lib, hostPath: {path: /usr/lib}}, {name: lib64, hostPath: {path: /usr/lib64}}]\n",
    );
    tb.kubectl(&["apply", "-f", &dep]);
    let ready = tb.kubectl_until(
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
        Duration::from_secs(60),
        |o| o.trim() == "2",
    );
    assert_eq!(ready.trim(), "2", "Deployment not Ready on real kubelets");
    let wide = tb.kubectl(&["get", "pods", "-l", "app=web", "-o", "wide"]);
    assert!(wide.contains("node-") && wide.contains("10."), "{wide}");
    let pod = tb.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let describe = tb.kubectl(&["describe", "pod", pod.trim()]);
    assert!(
        describe.contains("Started") && describe.contains("containerd://"),
        "{describe}"
    );
    let logs = tb.kubectl(&["logs", pod.trim()]);
    assert!(
        logs.contains("target-server"),
        "logs through the real kubelet: {logs:?}"
    );
    let exec = tb.kubectl(&["exec", pod.trim(), "--", "/target-server", "--version"]);
    assert!(
        exec.contains("target-server"),
        "exec through the real kubelet: {exec:?}"
    );
    let shell = tb.kubectl(&[
        "exec",
        pod.trim(),
        "--",
        "/usr/bin/sh",
        "-c",
        "echo shell-$((6*7)) as $(id -u)",
    ]);
    assert_eq!(
        shell.trim(),
        "shell-42 as 65532",
        "a shell through the real kubelet"
    );
    tb.kubectl(&["delete", "-f", &dep, "--wait=true", "--timeout=60s"]);
    let ns = tb.manifest(
        "restricted.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: fp-restricted\n  labels: {pod-security.kubernetes.io/enforce: restricted}\n",
    );
    tb.kubectl(&["apply", "-f", &ns]);
    let bad = tb.manifest(
        "privileged.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, namespace: fp-restricted}\nspec:\n  containers:\n  - name: c\n    image: ghcr.io/firstpacket/target-server:0.1.0\n    securityContext: {privileged: true}\n",
    );
    let out = tb.exec(&["kubectl", "apply", "-f", &bad]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("violates PodSecurity \"restricted:latest\""),
        "a privileged pod must be refused by admission: {err}"
    );
}

/// The probe records of a report.
fn probes_of(report: &serde_json::Value) -> Vec<serde_json::Value> {
    report["probes"].as_array().cloned().unwrap_or_default()
}

/// The real thing on the all-real stack (real Calico Felix, kube-proxy, kubelets with
/// containerd): the underlay's MTU lowered to 1400 on every node's link to the testbed
/// bridge (`link_mtu`: the kernel drops larger frames there, no ICMP), from `up` on —
/// connections made before an MTU drop black-hole their full-size packets too,
/// the control plane's among them, as on a real underlay. Small packets still cross
/// nodes on both protocols; full-size ones never do; the same-node control keeps
/// full size.
#[test]
fn a_lowered_link_mtu_is_caught_on_real_felix_and_real_kubelets() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = testbed::calico::Builds::locate().require([testbed::calico::DEFAULT_VERSION]) {
        eprintln!("SKIPPED: {e}");
        return;
    }
    let Some(tb) = Testbed::up_real_nodes(
        "paths-mtu",
        3,
        "rules:\n  - nodes: {all: true}\n    link_mtu: 1400\n",
        &["--agent", "calico", "--kube-proxy", "real"],
    ) else {
        return;
    };
    let (code, report, out) = common::paths::gate_every_path(&tb, 3, &[]);
    assert_eq!(code, 1, "a lowered link MTU must fail the gate: {out}");
    assert_eq!(common::paths::paths(&report).len(), 6 * 4, "{out}");
    common::paths::assert_only_cross_node_paths_fail(
        &report,
        &["tcp/ipv4/mtu", "udp/ipv4/mtu"],
        "mtu_black_hole",
        &out,
    );
}
