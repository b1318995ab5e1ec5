//! End-to-end: `prober gate` against a real testbed (network namespaces, real packets).
//!
//! Every test brings up its own testbed in its own state dir and tears it down in a
//! drop guard; a process-wide mutex runs them one at a time (docs/design.md §5 "Isolation").
//! Timing checks compare with the testbed's ground truth (`testbed truth`), never with
//! wall-clock guesses.

mod common;

use common::{assert_ttfp_near_truth, netns_list, validate, Testbed, POD_GONE_TIMEOUT, SERIAL};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ACCURACY_FAULT: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [100ms, 300ms]}
  - nodes: {names: [node-2]}
    program_delay: 3s
";

#[test]
fn gate_ttfp_matches_ground_truth_and_thresholds_set_the_exit_code() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("accuracy", 3, ACCURACY_FAULT, &[]);
    let (code, report, out) = tb.gate(&["--pairs", "12", "--hold", "1s", "--seed", "7"]);
    validate(&report);
    let truth = tb.truth();
    let probes = report["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 12, "{out}");
    for p in probes {
        let ttfp = assert_ttfp_near_truth(&truth, p, &out);
        let touches_slow = p["source"]["node"] == "node-2" || p["target"]["node"] == "node-2";
        if !touches_slow {
            assert!(
                ttfp < 1.0,
                "probe {} not touching node-2 took {ttfp}s",
                p["id"]
            );
        }
    }
    assert_eq!(code, 0, "default thresholds should pass: {out}");
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(
        left.is_empty(),
        "probe pods left behind after {POD_GONE_TIMEOUT:?}: {left:?}"
    );

    let (code, report, out) = tb.gate(&[
        "--pairs",
        "3",
        "--hold",
        "1s",
        "--max-ttfp",
        "1s",
        "--seed",
        "1",
    ]);
    // Every third pair touches node-2 in a 3-node ring: p95 is a node-2 pair (≈ 2–3 s).
    assert_eq!(code, 1, "--max-ttfp 1s must fail: {out}");
    assert_eq!(report["verdict"], "fail");
    let (code, _, out) = tb.gate(&[
        "--pairs",
        "3",
        "--hold",
        "1s",
        "--max-ttfp",
        "10s",
        "--seed",
        "1",
    ]);
    assert_eq!(code, 0, "--max-ttfp 10s must pass: {out}");
}

/// Lines of a gate's output (stdout and stderr) that read like a warning: they name
/// a warning, error, failure, suspect, slowness or breakage, once the zero counts of
/// the summary (`slow 0`, `failed 0`) and the per-node table's `ok/bad/inc` header are
/// set aside.
fn warning_like_lines(out: &str) -> Vec<String> {
    const WORDS: [&str; 8] = [
        "warn",
        "error",
        "fail",
        "suspect",
        "slow",
        "broken",
        "stopped",
        "not probed",
    ];
    out.lines()
        .filter(|l| {
            let l = l
                .to_lowercase()
                .replace("slow 0", "")
                .replace("failed 0", "")
                .replace("ok/bad/inc", "");
            WORDS.iter().any(|w| l.contains(w))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn warning_like_lines_catch_the_shapes_a_healthy_run_must_not_print() {
    let healthy =
        "cross_node: 3 probe(s): success 3, slow 0, failed 0, inconclusive 0; 0 without a TTFP\n\
                   first connections after Ready: 3 of 3 probe(s) needed retries before their first success; all of them success (their TTFP includes the retries)\n\
                   NODE  AS SOURCE ok/bad/inc\ndiagnosis: healthy";
    assert!(warning_like_lines(healthy).is_empty());
    for bad in [
        "first-attempt failures: 3 probe(s) whose source's first connections failed",
        "warning: --max-ttfp: 2s is below --slow-threshold (10s)",
        "cross_node: 3 probe(s): success 2, slow 1, failed 0",
    ] {
        assert_eq!(warning_like_lines(bad).len(), 1, "{bad}");
    }
}

#[test]
fn s1_healthy_cluster_passes_and_down_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fault = common::fault_file("s1-healthy.yaml");
    // Nodes whose `kubernetes.io/hostname` label is not their name (kubelet
    // --hostname-override, cloud providers): probe pods are pinned by the node's name.
    let tb = Testbed::up(
        "s1",
        3,
        &fault,
        &["--hostname-label-suffix", ".ec2.internal"],
    );
    let label = tb.kubectl(&[
        "get",
        "node",
        "node-1",
        "-o",
        "jsonpath={.metadata.labels.kubernetes\\.io/hostname}",
    ]);
    assert_eq!(label, "node-1.ec2.internal");
    let (code, report, out) = tb.gate(&[]);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let alarming = warning_like_lines(&out);
    assert!(
        alarming.is_empty(),
        "a healthy run printed warning-like lines {alarming:#?}:\n{out}"
    );
    assert!(out.contains("diagnosis: healthy"), "{out}");
    // A --max-ttfp below --slow-threshold is warned about before the first probe.
    let (_, _, warned) = tb.gate(&[
        "--pairs",
        "1",
        "--slow-threshold",
        "10s",
        "--max-ttfp",
        "2s",
    ]);
    let warning = warned
        .find("warning: --max-ttfp: 2s is below --slow-threshold (10s)")
        .unwrap_or_else(|| panic!("no --max-ttfp warning:\n{warned}"));
    assert!(
        warned.find("[1/1]").is_none_or(|first| warning < first),
        "the warning comes before the first probe:\n{warned}"
    );
    let probes = report["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 3);
    assert!(probes.iter().all(|p| p["result"] == "success"), "{out}");
    assert!(
        report["summary"]["ttfp_p95"].as_f64().unwrap() < 1.0,
        "{out}"
    );
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(
        left.is_empty(),
        "probe pods left behind after {POD_GONE_TIMEOUT:?}: {left:?}"
    );

    let prefix = tb.prefix();
    let state = tb.state.clone();
    drop(tb);
    let netns = netns_list();
    assert!(!netns.contains(&prefix), "netns left after down:\n{netns}");
    let procs = String::from_utf8(
        Command::new("ps")
            .args(["-eo", "args"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let leftover: Vec<&str> = procs
        .lines()
        .filter(|l| l.contains(state.to_str().unwrap()) || l.contains(&prefix))
        .collect();
    assert!(
        leftover.is_empty(),
        "processes left after down: {leftover:#?}"
    );
    assert!(!state.exists(), "state dir left after down");
    let links = String::from_utf8(
        Command::new("ip")
            .args(["-o", "link"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        !links.contains("cali"),
        "a cali* veth leaked into the host namespace"
    );
}

#[test]
fn interrupted_gate_leaves_no_probe_pod_and_kubectl_shows_ip_and_node() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fault = "rules:\n  - nodes: {all: true}\n    program_delay: 20s\n";
    let tb = Testbed::up("sigint", 3, fault, &[]);
    let mut gate = tb
        .cmd()
        .args([
            "exec",
            "--",
            "prober",
            "gate",
            "--pairs",
            "6",
            "--give-up",
            "60s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until a probe pod has an IP, then look with kubectl.
    let start = Instant::now();
    let mut table = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        let out = tb.exec(&["kubectl", "get", "pods", "-A", "-o", "wide"]);
        table = String::from_utf8_lossy(&out.stdout).into_owned();
        if table
            .lines()
            .any(|l| l.contains("fp-") && l.contains("Running"))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let header = table.lines().next().unwrap_or("");
    assert!(
        header.contains("IP") && header.contains("NODE"),
        "kubectl printed no IP/NODE columns:\n{table}"
    );
    let row = table
        .lines()
        .find(|l| l.contains("fp-") && l.contains("Running"))
        .unwrap_or_else(|| panic!("no running probe pod:\n{table}"));
    assert!(row.contains("node-"), "row without node: {row}");
    assert!(
        row.split_whitespace()
            .any(|c| c.parse::<std::net::Ipv4Addr>().is_ok()),
        "row without IP: {row}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(gate.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = gate.wait().unwrap();
    assert_eq!(status.code(), Some(2), "an interrupted gate exits 2");
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(
        left.is_empty(),
        "probe pods left {POD_GONE_TIMEOUT:?} after SIGINT: {left:?}"
    );
}

/// `testbed node stop` while the gate's probes are starting: the probes touching that
/// node end `inconclusive`/`node_not_ready` (the node, not the network, stopped them;
/// never `unschedulable` or `failed`), the others pass. Give-up long enough for the
/// node to be seen NotReady before those probes end (at once on the built-in control
/// plane, after the node-lifecycle grace on the real one).
#[test]
fn a_node_stopped_mid_probe_makes_its_probes_node_not_ready() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // node-3's pods cannot turn Ready for 4 s (its agent gates readiness and programs
    // late), so the stop below lands while they are still starting however fast the
    // kubelet's first readiness probe passes elsewhere.
    let fault = "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [200ms, 600ms]}\n  - nodes: {names: [node-3]}\n    agent: {gates_readiness: true}\n    program_delay: 4s\n";
    let tb = Testbed::up("nodestop", 3, fault, &[]);
    let give_up = if common::on_real_control_plane() {
        "45s"
    } else {
        "10s"
    };
    let (code, report, out) = std::thread::scope(|sc| {
        let gate = sc.spawn(|| {
            tb.gate(&[
                "--pairs",
                "6",
                "--concurrency",
                "6",
                "--give-up",
                give_up,
                "--hold",
                "1s",
            ])
        });
        // Stop node-3 as soon as the gate has created its first probe pods.
        let pods = common::poll_until(
            Duration::from_secs(60),
            || tb.probe_pods(),
            |p| !p.is_empty(),
        );
        assert!(!pods.is_empty(), "the gate created no probe pod");
        let stop = tb.cmd().args(["node", "stop", "node-3"]).output().unwrap();
        assert!(
            stop.status.success(),
            "{}",
            String::from_utf8_lossy(&stop.stderr)
        );
        gate.join().expect("gate thread")
    });
    let start = tb.cmd().args(["node", "start", "node-3"]).output().unwrap();
    assert!(
        start.status.success(),
        "{}",
        String::from_utf8_lossy(&start.stderr)
    );
    validate(&report);
    let probes = report["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 6, "{out}");
    let touches = |p: &Value| p["source"]["node"] == "node-3" || p["target"]["node"] == "node-3";
    let mut not_ready = 0;
    for p in probes {
        if touches(p) {
            assert!(
                p["result"] == "success"
                    || (p["result"] == "inconclusive" && p["reason"] == "node_not_ready"),
                "a probe touching the stopped node: {p:#}\n{out}"
            );
            not_ready += usize::from(p["reason"] == "node_not_ready");
        } else {
            assert_eq!(p["result"], "success", "{p:#}\n{out}");
        }
    }
    assert!(not_ready >= 1, "no probe ended node_not_ready:\n{out}");
    assert_eq!(
        code, 2,
        "node_not_ready is inconclusive, not a failure: {out}"
    );
    assert!(
        out.contains("node_not_ready"),
        "the text names the reason: {out}"
    );
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(left.is_empty(), "probe pods left behind: {left:?}");
}

/// Probe pods pass Pod Security `restricted` (a namespace enforcing it admits them and
/// the gate passes); a spec that violates it (the hidden test flag) is an admission
/// rejection named as such — `admission_rejected`, the policy and the fields in the
/// message, the gate stopped with exit 2 — not an RBAC "forbidden".
#[test]
fn restricted_namespace_admits_probe_pods_and_a_violating_spec_is_an_admission_rejection() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fault = "rules:\n  - nodes: {all: true}\n    program_delay: 100ms\n";
    let tb = Testbed::up("psa", 2, fault, &[]);
    let ns = "fp-restricted";
    let manifest = write_manifest(
        &tb,
        "ns.yaml",
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels: \
             {{pod-security.kubernetes.io/enforce: restricted}}\n"
        ),
    );
    tb.kubectl(&["apply", "-f", &manifest]);
    let (code, report, out) = tb.gate(&["--namespace", ns, "--pairs", "1", "--hold", "1s"]);
    assert_eq!(code, 0, "restricted must admit the probe pods: {out}");
    assert_eq!(report["probes"][0]["result"], "success", "{out}");
    validate(&report);

    let (code, report, out) = tb.gate(&[
        "--namespace",
        ns,
        "--pairs",
        "2",
        "--hold",
        "1s",
        "--unsafe-probe-pod-privileged",
    ]);
    assert_eq!(code, 2, "an admission rejection is inconclusive: {out}");
    assert_eq!(report["verdict"], "inconclusive", "{out}");
    validate(&report);
    let probes = report["probes"].as_array().cloned().unwrap_or_default();
    let rejected: Vec<_> = probes
        .iter()
        .filter(|p| p["reason"] == "admission_rejected")
        .collect();
    assert!(!rejected.is_empty(), "no admission_rejected probe: {out}");
    for p in &rejected {
        assert_eq!(p["result"], "inconclusive", "{p}");
        let d = p["detail"].as_str().unwrap_or_default();
        assert!(
            d.contains("rejected by admission (PodSecurity \"restricted:latest\")")
                && d.contains("privileged"),
            "detail must name the policy and the field: {p}"
        );
    }
    let first = report["errors"][0].as_str().unwrap_or_default();
    assert!(
        first.contains("rejected by admission") && first.contains("the gate stops"),
        "errors[0] must say the gate stopped on the admission rejection: {out}"
    );
    assert!(
        !first.contains("cannot create") && !first.contains("RBAC"),
        "not an RBAC error: {first}"
    );
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(left.is_empty(), "probe pods left behind: {left:?}");
}

fn write_manifest(tb: &Testbed, name: &str, text: &str) -> String {
    let p = tb.state.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

const WEB_POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web, tier: front}
spec:
  restartPolicy: Never
  containers:
  - name: web
    image: ghcr.io/firstpacket/target-server:0.1.0
    args: [serve]
    ports: [{containerPort: 8080, name: http}]
    readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}
";

const WEB_DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: webd}
spec:
  replicas: 3
  selector: {matchLabels: {app: webd}}
  template:
    metadata: {labels: {app: webd}}
    spec:
      containers:
      - name: web
        image: target-server
        args: [serve]
        readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}
";

#[test]
fn real_kubectl_works_against_the_testbed() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "kubectl",
        2,
        "rules:\n  - nodes: {all: true}\n    program_delay: 100ms\n",
        &[],
    );

    // get -w streams changes: start it before the pod exists.
    let mut watch = tb
        .cmd()
        .args(["exec", "--", "kubectl", "get", "pods", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let watch_out = watch.stdout.take().unwrap();
    let (line_tx, line_rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(watch_out)
            .lines()
            .map_while(Result::ok)
        {
            if line_tx.send(l).is_err() {
                break;
            }
        }
    });

    // apply -f with default validation (needs OpenAPI), then create -f → AlreadyExists.
    let pod = write_manifest(&tb, "web.yaml", WEB_POD);
    assert!(tb
        .kubectl(&["apply", "-f", &pod])
        .contains("pod/web created"));
    let out = tb.exec(&["kubectl", "create", "-f", &pod]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"),
        "create -f of an existing pod"
    );
    let out = tb.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=20s"]);
    assert!(out.contains("condition met"), "{out}");

    // Selectors.
    assert!(tb
        .kubectl(&["get", "pods", "-l", "tier=front", "-o", "name"])
        .contains("pod/web"));
    assert!(!tb
        .kubectl(&["get", "pods", "-l", "tier!=front", "-o", "name"])
        .contains("pod/web"));
    let node = tb.kubectl(&["get", "pod", "web", "-o", "jsonpath={.spec.nodeName}"]);
    let other = if node == "node-1" { "node-2" } else { "node-1" };
    assert!(tb
        .kubectl(&[
            "get",
            "pods",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "name"
        ])
        .contains("pod/web"));
    assert!(!tb
        .kubectl(&[
            "get",
            "pods",
            "--field-selector",
            &format!("spec.nodeName={other}"),
            "-o",
            "name"
        ])
        .contains("pod/web"));

    // describe, logs. Events are recorded apart from the change they report (a real
    // scheduler's and kubelet's event recorders write them asynchronously): poll.
    let events_within = Duration::from_secs(30);
    let d = tb.kubectl_until(&["describe", "pod", "web"], events_within, |d| {
        d.contains("Status:")
            && d.contains("Running")
            && d.contains(&node)
            && d.contains("Scheduled")
    });
    assert!(
        d.contains("Status:") && d.contains("Running") && d.contains(&node),
        "{d}"
    );
    assert!(
        d.contains("Scheduled"),
        "describe pod shows the scheduler's event (polled {events_within:?}):\n{d}"
    );
    let d = tb.kubectl_until(&["describe", "node", &node], events_within, |d| {
        d.contains("Ready") && d.contains("web") && d.contains("NodeReady")
    });
    assert!(d.contains("Ready") && d.contains("web"), "{d}");
    assert!(
        d.contains("NodeReady"),
        "describe node shows the kubelet's events (polled {events_within:?}):\n{d}"
    );
    let logs = tb.kubectl(&["logs", "web"]);
    assert!(logs.contains("listening"), "logs: {logs:?}");

    // Agent metrics through the API server's pod proxy.
    let page = tb.kubectl(&[
        "get",
        "--raw",
        "/api/v1/namespaces/kube-system/pods/calico-node-node-1:9091/proxy/metrics",
    ]);
    assert!(
        page.contains("# TYPE felix_int_dataplane_apply_time_seconds summary"),
        "{page}"
    );

    // delete --wait (graceful: the kubelet finishes it).
    assert!(tb.kubectl(&["delete", "pod", "web"]).contains("deleted"));
    assert!(tb.kubectl(&["get", "pods", "-o", "name"]).trim().is_empty());

    // A Deployment reaches its ready replicas.
    let dep = write_manifest(&tb, "webd.yaml", WEB_DEPLOYMENT);
    tb.kubectl(&["apply", "-f", &dep]);
    let out = tb.kubectl(&["rollout", "status", "deployment/webd", "--timeout=30s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    let ready = tb.kubectl(&[
        "get",
        "deployment",
        "webd",
        "-o",
        "jsonpath={.status.readyReplicas}",
    ]);
    assert_eq!(ready, "3");

    // `get -w` prints as its watch delivers: collect lines until web's Running row and
    // at least 3 lines came (at most 30 s), then stop it.
    let streamed = |lines: &[String]| {
        lines
            .iter()
            .any(|l| l.starts_with("web") && l.contains("Running"))
            && lines.len() >= 3
    };
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !streamed(&lines) {
        match line_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = watch.wait();
    let _ = reader.join();
    lines.extend(line_rx.try_iter());
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("web") && l.contains("Running")),
        "get -w printed: {lines:#?}"
    );
    assert!(lines.len() >= 3, "get -w streamed only {lines:#?}");
}

#[test]
fn a_pod_with_in_cluster_kube_rs_config_lists_nodes() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("incluster", 2, "rules: []\n", &[]);
    // A real cluster authorizes ServiceAccounts by RBAC (the `default` one may do
    // nothing); the built-in API server lets every request through.
    let sa = if common::on_real_control_plane() {
        tb.kubectl(&["create", "serviceaccount", "incluster"]);
        tb.kubectl(&[
            "create",
            "clusterrolebinding",
            "incluster-admin",
            "--clusterrole=cluster-admin",
            "--serviceaccount=default:incluster",
        ]);
        "  serviceAccountName: incluster\n"
    } else {
        ""
    };
    let manifest = write_manifest(
        &tb,
        "incluster.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: incluster}}\nspec:\n{sa}  restartPolicy: Never\n  containers:\n  - name: prober\n    image: ghcr.io/firstpacket/prober:0.1.0\n    args: [gate, --dry-run]\n"),
    );
    tb.kubectl(&["apply", "-f", &manifest]);
    let start = Instant::now();
    let mut phase = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        phase = tb.kubectl(&["get", "pod", "incluster", "-o", "jsonpath={.status.phase}"]);
        if phase == "Succeeded" || phase == "Failed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let logs = tb.kubectl(&["logs", "incluster"]);
    assert_eq!(phase, "Succeeded", "in-cluster prober failed:\n{logs}");
    // The dry run lists both nodes: it reached the API over HTTPS (through the
    // `kubernetes` Service) with the token and CA of its kube-api-access volume.
    assert!(logs.contains("node-1") && logs.contains("node-2"), "{logs}");
    let spec = tb.kubectl(&[
        "get",
        "pod",
        "incluster",
        "-o",
        "jsonpath={.spec.volumes[*].name}",
    ]);
    assert!(spec.contains("kube-api-access-"), "{spec}");
    // The same logs from the kubelet API on the pod's node (what a real API server
    // calls for `kubectl logs`), whole and tailed.
    let host_ip = tb.kubectl(&["get", "pod", "incluster", "-o", "jsonpath={.status.hostIP}"]);
    let kubelet = |q: &str| {
        let url = format!("https://{host_ip}:10250/containerLogs/default/incluster/prober{q}");
        let out = tb.exec(&["curl", "-sS", "-k", "--max-time", "5", &url]);
        assert!(out.status.success(), "{url}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(kubelet(""), logs);
    let last = logs.lines().last().unwrap_or_default();
    assert_eq!(kubelet("?tailLines=1").trim_end(), last);
}

/// S1 (healthy) gates one after another on one testbed: 10 runs, 100 with
/// `FIRSTPACKET_LONG_TESTS=1`; every run must pass (exit 0, verdict pass, every probe
/// `success`): a false failure here is a prober that flakes. Prints the count, each
/// failing run's output, and the slowest run's p95 TTFP.
#[test]
fn repeated_s1_gates_have_no_false_failures() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let long = common::long_tests();
    let runs = if long { 100 } else { 10 };
    let fault = common::fault_file("s1-healthy.yaml");
    let tb = Testbed::up("s1rep", 3, &fault, &[]);
    let t0 = Instant::now();
    let mut false_failures = Vec::new();
    let mut worst_p95 = 0.0f64;
    for run in 1..=runs {
        let (code, report, out) = tb.gate(&[]);
        let all_success = report["probes"]
            .as_array()
            .is_some_and(|p| !p.is_empty() && p.iter().all(|p| p["result"] == "success"));
        if code != 0 || report["verdict"] != "pass" || !all_success {
            eprintln!(
                "S1 run {run}: exit {code}, verdict {}:\n{out}",
                report["verdict"]
            );
            false_failures.push(run);
        }
        worst_p95 = worst_p95.max(report["summary"]["ttfp_p95"].as_f64().unwrap_or(0.0));
    }
    eprintln!(
        "repeated S1 gates: {runs} runs, {} false failure(s) {false_failures:?}, worst p95 TTFP {worst_p95:.3}s, {:.0}s in all",
        false_failures.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        false_failures.is_empty(),
        "false failures in runs {false_failures:?} of {runs}"
    );
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(left.is_empty(), "probe pods left: {left:?}");
}

/// 20 nodes × 10 pods with `FIRSTPACKET_LONG_TESTS=1`, else 4 × 5: up, every pod Ready,
/// every pod answering HTTP through the dataplane from the host netns, down. Prints the
/// times.
#[test]
fn many_nodes_with_many_pods_come_up_serve_and_tear_down() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let long = common::long_tests();
    let (nodes, per_node) = if long { (20, 10) } else { (4, 5) };
    let t0 = Instant::now();
    let tb = Testbed::up(
        "scale",
        nodes,
        "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [100ms, 300ms]}\n",
        &[],
    );
    let t_up = t0.elapsed();
    let mut manifest = String::new();
    for n in 1..=nodes {
        for i in 0..per_node {
            manifest.push_str(&format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: s-{n}-{i}, labels: {{app: scale}}}}\nspec:\n  nodeName: node-{n}\n  restartPolicy: Never\n  containers:\n  - name: web\n    image: target-server\n    args: [serve]\n    readinessProbe: {{httpGet: {{path: /readyz, port: 8080}}, periodSeconds: 1}}\n"
            ));
        }
    }
    let path = write_manifest(&tb, "scale.yaml", &manifest);
    let t1 = Instant::now();
    tb.kubectl(&["apply", "--validate=false", "-f", &path]);
    let out = tb.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pods",
        "-l",
        "app=scale",
        "--timeout=120s",
    ]);
    assert_eq!(out.lines().count(), nodes * per_node, "{out}");
    let t_ready = t1.elapsed();
    let ips = tb.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=scale",
        "-o",
        "jsonpath={range .items[*]}{.status.podIP}{\"\\n\"}{end}",
    ]);
    let ips: Vec<&str> = ips.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(ips.len(), nodes * per_node);
    let t2 = Instant::now();
    // Ready (the kubelet's probe from the node) does not wait for the CNI agent to
    // program the pod for traffic from elsewhere: each pod gets 30 s to answer.
    let mut script = String::new();
    for ip in &ips {
        script.push_str(&format!(
            "end=$((SECONDS+30)); until curl -sf -m 3 -o /dev/null http://{ip}:8080/; do \
             if [ $SECONDS -ge $end ]; then echo \"{ip} did not answer within 30s\" >&2; exit 1; fi; \
             sleep 0.2; done\n"
        ));
    }
    let out = tb.exec(&["bash", "-c", &script]);
    assert!(
        out.status.success(),
        "a pod did not answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t_traffic = t2.elapsed();
    let prefix = tb.prefix();
    let t3 = Instant::now();
    drop(tb);
    let t_down = t3.elapsed();
    let netns = netns_list();
    assert!(!netns.contains(&prefix), "netns left after down");
    println!(
        "scale: {nodes} nodes × {per_node} pods: up {:.1}s, all Ready {:.1}s, {} HTTP checks {:.1}s, down {:.1}s",
        t_up.as_secs_f64(),
        t_ready.as_secs_f64(),
        ips.len(),
        t_traffic.as_secs_f64(),
        t_down.as_secs_f64()
    );
}

/// A kube-rs watcher on the testbed (over its loopback kubeconfig) through
/// `testbed api restart` and `testbed api expire-watches`: every pod created before,
/// between and after is seen applied exactly once, no pod is seen deleted, and after the
/// restart the watch resumes without a re-list (resourceVersions carry on).
#[test]
fn kube_rs_watcher_survives_api_restart_and_expired_watches() {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("watch", 1, "rules: []\n", &[]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let kubeconfig = tb.state.join("kubeconfig");
    let create = |name: &str| {
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: w}}}}\nspec:\n  nodeName: node-1\n  containers:\n  - {{name: c, image: target-server, args: [serve]}}\n"
        );
        let p = write_manifest(&tb, &format!("{name}.yaml"), &manifest);
        tb.kubectl(&["apply", "--validate=false", "-f", &p]);
    };
    let testbed_cmd = |args: &[&str]| {
        let o = tb.cmd().args(args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (all, after_restart) = rt.block_on(async {
        let cfg = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client, "default");
        let stream = watcher::watcher(pods, watcher::Config::default().labels("app=w"));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                // name@resourceVersion: a repeated one is a duplicated event.
                let name = |p: k8s_openapi::api::core::v1::Pod| {
                    format!(
                        "{}@{}",
                        p.metadata.name.unwrap_or_default(),
                        p.metadata.resource_version.unwrap_or_default()
                    )
                };
                let line = match ev {
                    Ok(Event::Apply(p)) => format!("apply {}", name(p)),
                    Ok(Event::Delete(p)) => format!("delete {}", name(p)),
                    Ok(Event::Init) => "init".to_string(),
                    Ok(Event::InitApply(p)) => format!("initapply {}", name(p)),
                    Ok(Event::InitDone) => "initdone".to_string(),
                    Err(e) => format!("error {e}"),
                };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Collects lines until one starting with `want` shows up (or 20 s pass).
        async fn until(
            rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
            out: &mut Vec<String>,
            want: &str,
        ) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while let Ok(Some(l)) = tokio::time::timeout_at(deadline, rx.recv()).await {
                let done = l.starts_with(want);
                out.push(l);
                if done {
                    return;
                }
            }
            panic!("watcher never reported {want:?}; saw {out:#?}");
        }
        let mut out = Vec::new();
        until(&mut rx, &mut out, "initdone").await;
        tokio::task::block_in_place(|| create("w-a"));
        until(&mut rx, &mut out, "apply w-a").await;
        let mark = out.len();
        tokio::task::block_in_place(|| {
            testbed_cmd(&["api", "restart"]);
            create("w-b");
        });
        until(&mut rx, &mut out, "apply w-b").await;
        let after_restart: Vec<String> = out[mark..].to_vec();
        tokio::task::block_in_place(|| {
            testbed_cmd(&["api", "expire-watches"]);
            create("w-c");
        });
        until(&mut rx, &mut out, "apply w-c").await;
        task.abort();
        (out, after_restart)
    });
    // The built-in API server keeps its watch history over a restart, so the watch
    // resumes. A restarted kube-apiserver's watch cache starts at etcd's current
    // revision: a resume from an older resourceVersion gets 410 "too old resource
    // version" and kube-rs re-lists, as against any real cluster.
    if common::on_real_control_plane() {
        eprintln!("real control plane: after `api restart` the watcher saw {after_restart:#?}");
    } else {
        assert!(
            !after_restart
                .iter()
                .any(|l| l == "init" || l.starts_with("initapply")),
            "the watch re-listed after `api restart` (resourceVersion lost?): {after_restart:#?}"
        );
    }
    // Watch events (not re-list snapshots) never repeat a resourceVersion.
    let applies: Vec<&String> = all.iter().filter(|l| l.starts_with("apply ")).collect();
    let mut unique = applies.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        applies.len(),
        "a watch event was delivered twice: {all:#?}"
    );
    for name in ["w-a", "w-b", "w-c"] {
        assert!(
            all.iter().any(|l| l.starts_with(&format!("apply {name}@"))),
            "{name} never seen: {all:#?}"
        );
    }
    assert!(
        !all.iter().any(|l| l.starts_with("delete")),
        "spurious delete: {all:#?}"
    );
}

/// restartPolicy Always: a container that exits is restarted with back-off; the pod
/// shows `CrashLoopBackOff`, a growing `restartCount` and the previous exit in
/// `lastState`, as `kubectl get pods` users expect.
#[test]
fn restart_policy_always_restarts_an_exiting_container_with_back_off() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("restart", 1, "rules: []\n", &[]);
    let manifest = write_manifest(
        &tb,
        "crash.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: crash}\nspec:\n  containers:\n  - name: c\n    image: target-server\n    args: [no-such-subcommand]\n",
    );
    tb.kubectl(&["apply", "--validate=false", "-f", &manifest]);
    let start = Instant::now();
    let mut status = serde_json::Value::Null;
    while start.elapsed() < Duration::from_secs(20) {
        let out = tb.kubectl(&["get", "pod", "crash", "-o", "json"]);
        status = serde_json::from_str::<serde_json::Value>(&out).unwrap()["status"].clone();
        if status["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(0)
            >= 1
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let cs = &status["containerStatuses"][0];
    assert!(
        cs["restartCount"].as_u64().unwrap_or(0) >= 1,
        "never restarted: {status:#}"
    );
    assert_eq!(status["phase"], "Running", "{status:#}");
    let last_exit = cs["lastState"]["terminated"]["exitCode"]
        .as_i64()
        .unwrap_or(0);
    assert_ne!(last_exit, 0, "lastState keeps the failed exit: {status:#}");
    let table = tb.kubectl(&["get", "pod", "crash"]);
    assert!(
        table.contains("CrashLoopBackOff") || table.contains("Running"),
        "{table}"
    );
}

/// `testbed api stop|start|deny|allow` through the CLI: a stopped API refuses kubectl
/// while the nodes keep running; start brings it back with the same objects; a deny is
/// a 403 for that verb only and `allow` lifts it. Typos are errors, not silent no-ops:
/// an unknown verb, a fault rule or `--node-labels` naming a node the cluster lacks.
#[test]
fn api_and_fault_commands_work_through_the_cli_and_reject_typos() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("apicli", 1, "rules: []\n", &[]);
    let api = |args: &[&str]| {
        let mut c = tb.cmd();
        c.arg("api").args(args);
        common::output_within(c, common::command_timeout())
    };
    // The node's agent pods are created after `up` returns: wait for both, so
    // `before` is the settled list the restart below must keep.
    let agents_within = Duration::from_secs(30);
    let before = tb.kubectl_until(&["get", "pods", "-A", "-o", "name"], agents_within, |o| {
        o.contains("calico-node-node-1") && o.contains("kube-proxy-node-1")
    });
    assert!(
        before.contains("calico-node-node-1") && before.contains("kube-proxy-node-1"),
        "agent pods not listed within {agents_within:?}: {before}"
    );
    // node stop marks the node's agent pods NotReady; node start brings them back.
    let agents_ready = || {
        tb.kubectl(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-o",
            // The pod's Ready condition: both node controllers set it (the real one
            // leaves containerStatuses[].ready alone).
            "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}",
        ])
    };
    let wait_agents = |want: &str| {
        let start = Instant::now();
        loop {
            let got = agents_ready();
            if got.split_whitespace().all(|kv| kv.ends_with(want))
                || start.elapsed() > common::node_not_ready_within()
            {
                return got;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let mut node = tb.cmd();
    node.args(["node", "stop", "node-1"]);
    assert!(common::output_within(node, common::command_timeout())
        .status
        .success());
    let got = wait_agents("=False");
    assert!(
        got.contains("calico-node-node-1=False") && got.contains("kube-proxy-node-1=False"),
        "{got}"
    );
    let mut node = tb.cmd();
    node.args(["node", "start", "node-1"]);
    assert!(common::output_within(node, common::command_timeout())
        .status
        .success());
    let got = wait_agents("=True");
    assert!(
        got.contains("calico-node-node-1=True") && got.contains("kube-proxy-node-1=True"),
        "{got}"
    );

    assert!(api(&["stop"]).status.success());
    let out = tb.exec(&["kubectl", "get", "nodes", "--request-timeout=5s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "kubectl must fail while the API is stopped"
    );
    assert!(err.contains("refused"), "{err}");
    // The node's agent keeps running: its metrics answer without the API.
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tb.state.join("plan.json")).unwrap())
            .unwrap();
    let ip = plan["nodes"][0]["ip"].as_str().unwrap();
    let metrics = tb.exec(&[
        "curl",
        "-sS",
        "--max-time",
        "3",
        &format!("http://{ip}:9091/metrics"),
    ]);
    assert!(
        String::from_utf8_lossy(&metrics.stdout).contains("felix_int_dataplane_apply_time_seconds")
    );

    assert!(api(&["start"]).status.success());
    assert_eq!(tb.kubectl(&["get", "pods", "-A", "-o", "name"]), before);

    assert!(api(&["deny", "list", "nodes"]).status.success());
    let out = tb.exec(&["kubectl", "get", "nodes"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Forbidden"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    tb.kubectl(&["get", "pods", "-A"]);
    assert!(api(&["allow", "list", "nodes"]).status.success());
    assert!(tb.kubectl(&["get", "nodes"]).contains("node-1"));
    let again = api(&["allow", "list", "nodes"]);
    assert!(!again.status.success(), "nothing was denied");
    assert!(String::from_utf8_lossy(&again.stderr).contains("was not denied"));
    let typo = api(&["deny", "lst", "nodes"]);
    assert!(!typo.status.success());
    assert!(String::from_utf8_lossy(&typo.stderr).contains("unknown verb"));
    assert!(api(&["deny", "*", "pods"]).status.success());
    assert!(api(&["allow", "all"]).status.success());
    tb.kubectl(&["get", "pods", "-A"]);
    // A RoleBinding's reach: denied in kube-system only.
    assert!(api(&["deny", "list", "pods", "-n", "kube-system"])
        .status
        .success());
    let out = tb.exec(&["kubectl", "get", "pods", "-n", "kube-system"]);
    assert!(!out.status.success());
    tb.kubectl(&["get", "pods", "-n", "default"]);
    assert!(api(&["allow", "list", "pods", "-n", "kube-system"])
        .status
        .success());
    tb.kubectl(&["get", "pods", "-n", "kube-system"]);
    // As in RBAC, a subresource is its own resource.
    assert!(api(&["deny", "get", "pods/proxy"]).status.success());
    let raw = "/api/v1/namespaces/kube-system/pods/calico-node-node-1:9091/proxy/metrics";
    let out = tb.exec(&["kubectl", "get", "--raw", raw]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("Forbidden"), "{err}");
    tb.kubectl(&["get", "pod", "-n", "kube-system", "calico-node-node-1"]);
    assert!(api(&["allow", "get", "pods/proxy"]).status.success());
    assert!(tb
        .kubectl(&["get", "--raw", raw])
        .contains("felix_int_dataplane_failures"));
    // Selectors a real API server rejects are rejected: 400 BadRequest naming the
    // selector (kube-apiserver v1.36 words it `Unable to find "/v1, Resource=pods" that
    // match label selector "a=b=c", …: found '=', expected: ',' or 'end of string'`, the
    // built-in one `unable to parse requirement: … (in selector "a=b=c")`).
    let out = tb.exec(&["kubectl", "get", "pods", "-A", "-l", "a=b=c"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("(BadRequest)") && err.contains("\"a=b=c\""),
        "{err}"
    );

    let fault = tb.state.join("typo.yaml");
    std::fs::write(
        &fault,
        "rules:\n  - nodes: {names: [node-7]}\n    program_delay: 1s\n",
    )
    .unwrap();
    let mut set = tb.cmd();
    set.args(["fault", "set"]).arg(&fault);
    let out = common::output_within(set, common::command_timeout());
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"node-7\", which is not in this cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let other = std::env::temp_dir().join(format!("fp-e2e-labels-{}", std::process::id()));
    let mut up = std::process::Command::new(env!("CARGO_BIN_EXE_testbed"));
    up.arg("--state-dir").arg(&other).args([
        "up",
        "--nodes",
        "2",
        "--node-labels",
        "node-3=os=debian13",
    ]);
    let out = common::output_within(up, common::command_timeout());
    let _ = std::fs::remove_dir_all(&other);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("node \"node-3\" is not in this cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kubelet is a client of the API server like the real one: it registers its Node
/// (labels, addresses, `daemonEndpoints`, Ready), renews its Lease in
/// `kube-node-lease`, and writes pod status only through `pods/NAME/status` — denying
/// `patch pods` does not stop it, denying `patch pods/status` does until allowed
/// again. The `kubernetes` Service fronts the API server.
#[test]
fn kubelet_registers_node_renews_lease_and_writes_status_through_pods_status() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("clients", 1, "rules: []\n", &[]);
    let api = |args: &[&str]| {
        let mut c = tb.cmd();
        c.arg("api").args(args);
        let out = common::output_within(c, common::command_timeout());
        assert!(out.status.success(), "api {args:?}: {out:?}");
    };
    let json_of = |args: &[&str]| -> serde_json::Value {
        let text = tb.kubectl(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
    };
    let node = json_of(&["get", "node", "node-1", "-o", "json"]);
    assert_eq!(
        node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
        10250
    );
    assert_eq!(
        node["metadata"]["labels"]["kubernetes.io/hostname"],
        "node-1"
    );
    assert!(node["spec"]["podCIDR"]
        .as_str()
        .is_some_and(|c| c.contains('/')));
    let conds = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (ty, want) in [
        ("Ready", "True"),
        ("MemoryPressure", "False"),
        ("DiskPressure", "False"),
        ("PIDPressure", "False"),
    ] {
        let c = conds
            .iter()
            .find(|c| c["type"] == ty)
            .unwrap_or_else(|| panic!("no {ty}: {conds:?}"));
        assert_eq!(c["status"], want, "{ty}");
        assert!(c["lastHeartbeatTime"].is_string() && c["lastTransitionTime"].is_string());
    }

    let lease = || {
        json_of(&[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            "node-1",
            "-o",
            "json",
        ])
    };
    let first = lease();
    assert_eq!(first["spec"]["holderIdentity"], "node-1");
    assert_eq!(first["spec"]["leaseDurationSeconds"], 40);
    let t0 = first["spec"]["renewTime"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!t0.is_empty(), "{first}");
    let start = Instant::now();
    loop {
        let t = lease()["spec"]["renewTime"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if t != t0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "lease never renewed: {t0}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // `node stop` stops the heartbeats (what a real node-lifecycle controller goes by);
    // `node start` resumes them at once.
    let node_cmd = |action: &str| {
        let mut c = tb.cmd();
        c.args(["node", action, "node-1"]);
        let out = common::output_within(c, common::command_timeout());
        assert!(out.status.success(), "node {action}: {out:?}");
    };
    node_cmd("stop");
    let stopped = lease()["spec"]["renewTime"].clone();
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        lease()["spec"]["renewTime"],
        stopped,
        "a stopped kubelet renewed its lease"
    );
    node_cmd("start");
    let start = Instant::now();
    while lease()["spec"]["renewTime"] == stopped {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "lease not renewed after node start"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let pod = |name: &str| {
        let m = write_manifest(
            &tb,
            &format!("{name}.yaml"),
            &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: node-1\n  containers:\n  - {{name: c, image: target-server, args: [serve]}}\n"),
        );
        tb.kubectl(&["apply", "-f", &m]);
    };
    let phase = |name: &str| tb.kubectl(&["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
    let wait_running = |name: &str, within: Duration| {
        let start = Instant::now();
        while phase(name) != "Running" {
            assert!(start.elapsed() < within, "{name} never Running");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    api(&["deny", "patch", "pods", "--nodes-too"]);
    pod("via-status");
    wait_running("via-status", Duration::from_secs(30));
    api(&["allow", "patch", "pods"]);
    api(&["deny", "patch", "pods/status", "--nodes-too"]);
    pod("denied");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        assert_ne!(
            phase("denied"),
            "Running",
            "status written despite the deny"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    api(&["allow", "patch", "pods/status"]);
    wait_running("denied", Duration::from_secs(20));

    let svc = json_of(&[
        "get",
        "service",
        "kubernetes",
        "-n",
        "default",
        "-o",
        "json",
    ]);
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    let slices = tb.kubectl(&[
        "get",
        "endpointslices",
        "-n",
        "default",
        "-l",
        "kubernetes.io/service-name=kubernetes",
        "-o",
        "name",
    ]);
    assert!(slices.contains("kubernetes"), "{slices}");
}

/// Issue 31 point 8: `testbed demo` shows the problem — a healthy gate passes, the S2
/// apply-loop gate fails naming node-2/node-3 with `dataplane_apply_slow`, the long-lived
/// mesh beside it made checks and none failed — exits 0, and leaves no netns, no state
/// and no hint pointing at the deleted cluster; `--fault s2` runs one gate on the
/// scenario with the node labels its rules select by.
#[test]
fn the_demo_shows_the_apply_loop_caught_beside_a_green_mesh_and_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    common::bin("prober");
    common::bin("target-server");
    let dir = std::env::temp_dir().join(format!("fp-e2e-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Removed however the test ends (the demo tears its testbed down itself).
    struct RemoveDir(std::path::PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveDir(dir.clone());
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    // The testbed's netns prefix for this state dir (testbed/src/plan.rs: `fp` + the
    // first 3 bytes of the SHA-1 of its canonical path); other lanes' testbeds may come
    // and go meanwhile.
    let prefix = {
        use sha1::Digest;
        let d = sha1::Sha1::digest(state.canonicalize().unwrap().as_os_str().as_encoded_bytes());
        format!("fp{:02x}{:02x}{:02x}", d[0], d[1], d[2])
    };
    let left = || {
        netns_list()
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let t0 = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .current_dir(&dir)
        .args(["--state-dir", state.to_str().unwrap(), "demo"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run testbed demo");
    // The prefix is the demo's: its netns exist while it runs (so the check after it
    // is not vacuous).
    let mut seen = false;
    while !seen && t0.elapsed() < Duration::from_secs(20) {
        seen = !left().is_empty();
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().expect("demo output");
    let took = t0.elapsed();
    assert!(seen, "no netns with the demo's prefix {prefix} appeared");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    eprintln!("demo took {:.1}s", took.as_secs_f64());
    let row = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{label:<22}  ")))
            .unwrap_or_else(|| panic!("no {label} row:\n{all}"))
            .to_owned()
    };
    let gate = row("firstpacket gate");
    assert!(
        gate.contains("PASS (exit 0)") && gate.contains("FAIL (exit 1)"),
        "{gate}"
    );
    let suspects = row("suspects");
    assert!(
        suspects.contains("node-2 dataplane_apply_slow")
            && suspects.contains("node-3 dataplane_apply_slow")
            && !suspects.contains("node-1")
            && !suspects.contains("node-4"),
        "{suspects}"
    );
    // The mesh: "N checks, 0 failed" in both acts, with checks made.
    let mesh = row("long-lived mesh");
    let counts: Vec<(u64, u64)> = mesh
        .split("checks, ")
        .zip(mesh.split("checks, ").skip(1))
        .filter_map(|(a, b)| {
            let n = a.split_whitespace().last()?.parse().ok()?;
            let f = b.split_whitespace().next()?.parse().ok()?;
            Some((n, f))
        })
        .collect();
    assert_eq!(counts.len(), 2, "{mesh}");
    assert!(counts.iter().all(|(n, f)| *n > 0 && *f == 0), "{mesh}");
    assert!(
        stdout.contains("What firstpacket saw that a long-lived mesh would not"),
        "{all}"
    );
    // Both reports kept where the demo said; nothing points at the deleted cluster.
    for r in [
        "firstpacket-report-healthy.json",
        "firstpacket-report-apply-loop.json",
    ] {
        let text = std::fs::read_to_string(dir.join(r)).unwrap_or_else(|e| panic!("{r}: {e}"));
        validate(&serde_json::from_str(&text).unwrap());
    }
    assert!(!all.contains("kubectl get"), "{all}");
    assert!(!all.contains("kubeconfig:"), "{all}");
    assert_eq!(left(), Vec::<String>::new(), "netns left behind");

    // One gate on a shipped scenario by number: S2, whose rules select nodes by the
    // label its header gives (node-2/node-3 os=debian13): exit 1, those nodes named.
    let out = Command::new(env!("CARGO_BIN_EXE_testbed"))
        .current_dir(&dir)
        .args([
            "--state-dir",
            state.to_str().unwrap(),
            "demo",
            "--fault",
            "s2",
        ])
        .args(["--", "--give-up", "5s", "--hold", "1s"])
        .output()
        .expect("run testbed demo --fault s2");
    let all = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("node labels node-2=os=debian13,node-3=os=debian13"),
        "{all}"
    );
    let named: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("dataplane_apply_slow") && l.trim_start().starts_with("node-"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        !named.is_empty() && named.iter().all(|n| *n == "node-2" || *n == "node-3"),
        "{named:?}\n{all}"
    );
    assert_eq!(left(), Vec::<String>::new(), "netns left behind");
}
