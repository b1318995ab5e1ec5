//! Shared harness of the testbed end-to-end tests (`e2e.rs`, `e2e_kinds.rs`): a
//! testbed per test in its own state dir, torn down by a drop guard; `SERIAL` runs the
//! tests of one binary one at a time (DESIGN §5 "Isolation").
#![allow(dead_code)]

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use testbed::truth::TruthEvent;

pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn bin(name: &str) -> PathBuf {
    let tb = PathBuf::from(env!("CARGO_BIN_EXE_testbed"));
    let p = tb.parent().unwrap().join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

pub struct Testbed {
    pub state: PathBuf,
}

impl Testbed {
    pub fn up(name: &str, nodes: usize, fault: &str, extra: &[&str]) -> Testbed {
        bin("prober");
        bin("target-server");
        let state = std::env::temp_dir().join(format!("fp-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&state);
        let fault_path =
            std::env::temp_dir().join(format!("fp-e2e-{name}-{}.yaml", std::process::id()));
        std::fs::write(&fault_path, fault).unwrap();
        let tb = Testbed { state };
        let mut up = tb.cmd();
        up.args(["up", "--nodes", &nodes.to_string(), "--fault"])
            .arg(&fault_path)
            .args(extra);
        let out = output_within(up, command_timeout());
        let _ = std::fs::remove_file(&fault_path);
        assert!(
            out.status.success(),
            "testbed up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tb
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_testbed"));
        c.arg("--state-dir").arg(&self.state);
        c
    }

    /// `testbed exec -- ARGS…`, killed (with everything it started) after
    /// [`command_timeout`] so a hang fails the test instead of blocking CI.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut c = self.cmd();
        c.arg("exec").arg("--").args(args);
        output_within(c, command_timeout())
    }

    pub fn gate(&self, extra: &[&str]) -> (i32, Value, String) {
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

    /// The truth log (`testbed truth`), parsed.
    pub fn truth(&self) -> Vec<TruthEvent> {
        let mut c = self.cmd();
        c.arg("truth");
        let out = output_within(c, command_timeout());
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("truth line {l:?}: {e}")))
            .collect()
    }

    /// `kubectl ARGS…` through `testbed exec`; panics with its output unless it exits 0.
    /// Returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut a = vec!["kubectl"];
        a.extend_from_slice(args);
        let out = self.exec(&a);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Names (`kind/name`) of every object of `resource` carrying the firstpacket label.
    pub fn labelled(&self, resource: &str) -> Vec<String> {
        self.kubectl(&[
            "get",
            resource,
            "-A",
            "-l",
            "app.kubernetes.io/name=firstpacket",
            "-o",
            "name",
        ])
        .lines()
        .map(str::to_owned)
        .collect()
    }

    /// Every probe pod (`pod/NAME`) in the cluster.
    pub fn probe_pods(&self) -> Vec<String> {
        self.labelled("pods")
    }

    pub fn prefix(&self) -> String {
        let plan: Value =
            serde_json::from_str(&std::fs::read_to_string(self.state.join("plan.json")).unwrap())
                .unwrap();
        plan["prefix"].as_str().unwrap().to_owned()
    }
}

impl Drop for Testbed {
    /// `testbed down`, then the test's own leftovers in the state dir (reports,
    /// manifests) — only when down succeeded, so a failed teardown stays inspectable.
    fn drop(&mut self) {
        let mut down = self.cmd();
        down.arg("down");
        let ok = down.status().is_ok_and(|s| s.success());
        if ok && !self.state.join("daemon.pid").exists() {
            let _ = std::fs::remove_dir_all(&self.state);
        }
    }
}

pub fn rand_suffix() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// How long one harness command (`testbed up`, `testbed exec …`, `testbed truth`) may
/// take: `FP_E2E_COMMAND_TIMEOUT` (humantime), default 300 s — longer than any gate
/// these tests run, far shorter than CI's limit.
pub fn command_timeout() -> Duration {
    std::env::var("FP_E2E_COMMAND_TIMEOUT")
        .ok()
        .and_then(|v| humantime::parse_duration(&v).ok())
        .unwrap_or(Duration::from_secs(300))
}

/// Runs `cmd` in its own process group with stdout/stderr captured; after `timeout`
/// kills the whole group (SIGKILL) and panics with what it printed so far.
pub fn output_within(mut cmd: Command, timeout: Duration) -> Output {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("start {shown}: {e}"));
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > timeout {
            let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            let (o, e) = (out.join().unwrap(), err.join().unwrap());
            panic!(
                "{shown} still running after {timeout:?}: killed\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The dial interval the gates in these tests use (the default, 100 ms).
pub const DIAL_INTERVAL: f64 = 0.1;

/// Asserts a probe's TTFP is within [−50 ms, dial interval + 50 ms] of the ground truth
/// (DESIGN §7 accuracy target); returns the TTFP (seconds). `ctx` goes into messages.
pub fn assert_ttfp_near_truth(truth: &[TruthEvent], p: &Value, ctx: &str) -> f64 {
    let ttfp = p["ttfp_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("no TTFP: {p:#}\n{ctx}"));
    let want = testbed::truth::truth_ttfp(
        truth,
        p["source"]["uid"].as_str().unwrap(),
        p["target"]["uid"].as_str().unwrap(),
    )
    .unwrap_or_else(|| panic!("no truth for {}", p["id"]));
    let err = ttfp - want;
    assert!(
        (-0.05..=DIAL_INTERVAL + 0.05).contains(&err),
        "probe {} {} {}→{}: TTFP {ttfp:.3}s vs truth {want:.3}s (error {err:+.3}s)\n{ctx}",
        p["id"],
        p["kind"],
        p["source"]["node"],
        p["target"]["node"]
    );
    ttfp
}

/// `ip netns list` as text.
pub fn netns_list() -> String {
    String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

pub fn validate(report: &Value) {
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
