//! End-to-end: `prober gate` against a real testbed (network namespaces, real packets).
//!
//! Every test brings up its own testbed in its own state dir and tears it down in a
//! drop guard; a process-wide mutex runs them one at a time (DESIGN §5 "Isolation").
//! Timing checks compare with the testbed's ground truth (`testbed truth`), never with
//! wall-clock guesses.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn bin(name: &str) -> PathBuf {
    let tb = PathBuf::from(env!("CARGO_BIN_EXE_testbed"));
    let p = tb.parent().unwrap().join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

struct Testbed {
    state: PathBuf,
}

impl Testbed {
    fn up(name: &str, nodes: usize, fault: &str, extra: &[&str]) -> Testbed {
        bin("prober");
        bin("target-server");
        let state = std::env::temp_dir().join(format!("fp-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&state);
        let fault_path =
            std::env::temp_dir().join(format!("fp-e2e-{name}-{}.yaml", std::process::id()));
        std::fs::write(&fault_path, fault).unwrap();
        let tb = Testbed { state };
        let out = tb
            .cmd()
            .args(["up", "--nodes", &nodes.to_string(), "--fault"])
            .arg(&fault_path)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "testbed up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tb
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_testbed"));
        c.arg("--state-dir").arg(&self.state);
        c
    }

    fn exec(&self, args: &[&str]) -> Output {
        self.cmd()
            .arg("exec")
            .arg("--")
            .args(args)
            .output()
            .unwrap()
    }

    fn gate(&self, extra: &[&str]) -> (i32, Value, String) {
        let report = self.state.join(format!("report-{}.json", rand_suffix()));
        let mut args = vec!["prober", "gate", "--report", report.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = self.exec(&args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let text = std::fs::read_to_string(&report)
            .unwrap_or_else(|e| panic!("no report ({e}); stdout:\n{stdout}\nstderr:\n{stderr}"));
        let _ = std::fs::remove_file(&report);
        (
            out.status.code().unwrap_or(-1),
            serde_json::from_str(&text).unwrap(),
            format!("{stdout}\n{stderr}"),
        )
    }

    fn truth(&self) -> Vec<Value> {
        let out = self.cmd().arg("truth").output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn probe_pods(&self) -> Vec<String> {
        let out = self.exec(&[
            "kubectl",
            "get",
            "pods",
            "-A",
            "-l",
            "app.kubernetes.io/name=firstpacket",
            "-o",
            "name",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn prefix(&self) -> String {
        let plan: Value =
            serde_json::from_str(&std::fs::read_to_string(self.state.join("plan.json")).unwrap())
                .unwrap();
        plan["prefix"].as_str().unwrap().to_owned()
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = self.cmd().arg("down").status();
    }
}

fn rand_suffix() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Truth TTFP of a pair (DESIGN §6): max(endpoint_programmed of both pods) −
/// readiness_ok of the source, floored at 0.
fn truth_ttfp(truth: &[Value], source_uid: &str, target_uid: &str) -> Option<f64> {
    let t = |event: &str, uid: &str| {
        truth
            .iter()
            .find(|e| e["event"] == event && e["uid"] == uid)
            .and_then(|e| e["t"].as_f64())
    };
    let prog = t("endpoint_programmed", source_uid)?.max(t("endpoint_programmed", target_uid)?);
    Some((prog - t("readiness_ok", source_uid)?).max(0.0))
}

fn validate(report: &Value) {
    let schema: Value = serde_json::from_str(target_server::GATE_REPORT_SCHEMA).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = v
        .iter_errors(report)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "report does not match the schema: {errors:#?}"
    );
}

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
    let interval = 0.1;
    for p in probes {
        let ttfp = p["ttfp_seconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("no TTFP: {p:#}\n{out}"));
        let want = truth_ttfp(
            &truth,
            p["source"]["uid"].as_str().unwrap(),
            p["target"]["uid"].as_str().unwrap(),
        )
        .unwrap_or_else(|| panic!("no truth for {}", p["id"]));
        let err = ttfp - want;
        assert!(
            (-0.05..=interval + 0.05).contains(&err),
            "probe {} {}→{}: TTFP {ttfp:.3}s vs truth {want:.3}s (error {err:+.3}s)",
            p["id"],
            p["source"]["node"],
            p["target"]["node"]
        );
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
    assert!(tb.probe_pods().is_empty(), "probe pods left behind");

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

#[test]
fn s1_healthy_cluster_passes_and_down_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fault = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testbed/faults/s1-healthy.yaml"
    ))
    .unwrap();
    let tb = Testbed::up("s1", 3, &fault, &[]);
    let (code, report, out) = tb.gate(&[]);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let probes = report["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 3);
    assert!(probes.iter().all(|p| p["result"] == "success"), "{out}");
    assert!(
        report["summary"]["ttfp_p95"].as_f64().unwrap() < 1.0,
        "{out}"
    );
    assert!(tb.probe_pods().is_empty(), "probe pods left behind");

    let prefix = tb.prefix();
    let state = tb.state.clone();
    drop(tb);
    let netns = String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
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
    assert!(tb.probe_pods().is_empty(), "probe pods left after SIGINT");
}

#[test]
fn cordoned_and_not_ready_nodes_are_skipped_and_missing_image_is_inconclusive() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fault = "rules:\n  - nodes: {all: true}\n    program_delay: 100ms\n";
    let tb = Testbed::up("cordon", 4, fault, &[]);
    let out = tb
        .cmd()
        .args(["node", "cordon", "node-3"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tb.cmd().args(["node", "stop", "node-4"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, report, out) = tb.gate(&["--hold", "1s"]);
    assert_eq!(code, 0, "{out}");
    let probes = report["probes"].as_array().unwrap();
    assert_eq!(
        probes.len(),
        2,
        "one pair per schedulable, Ready node: {out}"
    );
    for p in probes {
        for role in ["source", "target"] {
            let node = p[role]["node"].as_str().unwrap();
            assert!(
                node == "node-1" || node == "node-2",
                "probe used cordoned/NotReady {node}: {out}"
            );
        }
    }

    let (code, report, out) = tb.gate(&[
        "--pairs",
        "1",
        "--image",
        "registry.example/none/no-such-image:1",
    ]);
    assert_eq!(code, 2, "a missing image is not a network failure: {out}");
    assert_eq!(report["verdict"], "inconclusive");
    let p = &report["probes"][0];
    assert_eq!(p["result"], "inconclusive");
    assert_eq!(p["reason"], "image_pull");
    assert!(tb.probe_pods().is_empty(), "probe pods left behind");
}
