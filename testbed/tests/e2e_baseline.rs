//! Baseline and drift end to end on the testbed (issue 14):
//!
//! - `prober run` on S1 learns its baseline; the faults switch at runtime to S5 (node-1
//!   and node-4 1.5–3.5 s slower) and back: the kind's drift and those nodes' drift pass
//!   the thresholds within 10 probes touching them, fall back within 10 probes after
//!   the switch back, and the baseline p50 after the episode is within
//!   max(20 %, 100 ms) of before; a leader change (SIGTERM of the leader with a
//!   standby running) keeps the baseline (ConfigMap);
//! - a slower normal (`program_delay` 1–2 s) gives no drift once learned; 2–4 s does;
//! - the gate: `--save-baseline` on S1 (`--pairs 12`), `--baseline` on S2 exits 1
//!   naming the regressed kind and exactly the slow nodes, and on S1 again exits 0 (five
//!   runs in a row); `--junit` parsed by
//!   `junitparser` (PyPI, pinned; `scripts/setup.sh` installs it) has one testcase per
//!   node and kind, failures on exactly the slow nodes.
//!
//! Short windows and intervals (flags) keep the default run short. Needs root and the
//! workspace binaries (`cargo build --workspace --bins`).

mod common;

use common::{curl, started_unix, wait_ready, Testbed, SERIAL};
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const S1: &str = "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [200ms, 600ms]}\n";

const S5: &str = "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [200ms, 600ms]}\n  - nodes: {labels: {os: ubuntu2004}}\n    program_delay: {uniform: [1.5s, 3.5s]}\n    agent: {extra_failures_per_second: 1}\n";

const S2: &str = "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [200ms, 600ms]}\n  - nodes: {labels: {os: debian13}}\n    resync_loop: {period: 1s, open: 50ms}\n    program_delay: {uniform: [15s, 42s]}\n    agent: {apply_time_floor: 1s}\n";

const NORMAL_1_2: &str = "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [1s, 2s]}\n";
const NORMAL_2_4: &str = "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [2s, 4s]}\n";

/// Flags of every `prober run` here: a probe a second, 2 at a time, short hold; a
/// 20 s recent window and 8 baseline samples so learning takes under a minute.
const RUN_FLAGS: &[&str] = &[
    "--probe-interval",
    "1s",
    "--concurrency",
    "2",
    "--hold",
    "500ms",
    "--give-up",
    "20s",
    "--recent-window",
    "20s",
    "--baseline-window",
    "10m",
    "--baseline-min-samples",
    "8",
    "--baseline-save-interval",
    "5s",
    "--log-format",
    "json",
];

struct Run {
    child: Child,
    log: std::path::PathBuf,
    base: String,
}

impl Run {
    fn start(tb: &Testbed, name: &str, port_offset: u32, extra: &[&str]) -> Run {
        let port = 20_000 + ((std::process::id() + port_offset) % 20_000) as u16;
        let addr = format!("127.0.0.1:{port}");
        let log = tb.state.join(format!("{name}.log"));
        let mut args = vec!["exec", "--", "prober", "run", "--admin-addr", &addr];
        // RUN_FLAGS are (flag, value) pairs; a flag `extra` gives again replaces its pair.
        for pair in RUN_FLAGS.chunks(2) {
            if !extra.contains(&pair[0]) {
                args.extend_from_slice(pair);
            }
        }
        args.extend_from_slice(extra);
        let child = tb
            .cmd()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
            .spawn()
            .expect("spawn prober run");
        let mut run = Run {
            child,
            log,
            base: format!("http://{addr}"),
        };
        let log = run.log.clone();
        let logs = move || std::fs::read_to_string(&log).unwrap_or_default();
        wait_ready(tb, &run.base.clone(), &mut run.child, &logs);
        run
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn metric(&self, tb: &Testbed, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = curl(tb, &format!("{}/metrics", self.base))?;
        metric(&text, name, labels)
    }

    fn probes(&self, tb: &Testbed) -> Vec<Value> {
        curl(tb, &format!("{}/api/v1/probes", self.base))
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["probes"].as_array().cloned())
            .unwrap_or_default()
    }

    /// SIGTERM, then the exit code (within 40 s).
    fn stop(mut self) -> i32 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "prober run did not exit within 40 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The value of `name{labels…}` in a text exposition (the first matching line).
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' ']).next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
}

fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

fn touches(p: &Value, node: &str) -> bool {
    p["source"]["node"] == node || p["target"]["node"] == node
}

fn counted_for(p: &Value, node: &str) -> bool {
    p["drift"]["nodes"]
        .as_array()
        .is_some_and(|a| a.iter().any(|n| n == node))
}

/// Waits until the run's cross_node baseline has its minimum samples; returns its p50.
fn learned_p50(tb: &Testbed, run: &Run, within: Duration) -> f64 {
    let got = common::poll_until(
        within,
        || {
            run.metric(
                tb,
                "firstpacket_baseline_seconds",
                &[("kind", "cross_node"), ("quantile", "0.5")],
            )
        },
        |v| v.is_some_and(|v| !v.is_nan()),
    );
    got.filter(|v| !v.is_nan())
        .unwrap_or_else(|| panic!("no baseline learned within {within:?}\n{}", run.logs()))
}

/// Waits (at most `within`) until every node of `nodes` has a learned baseline: its
/// `firstpacket_node_drift_ratio` is a number (NaN until a role of the node has half of
/// `--baseline-min-samples` in its baseline and a probe in its recent window).
fn nodes_learned(tb: &Testbed, run: &Run, nodes: &[&str], within: Duration) {
    let text = common::poll_until(
        within,
        || curl(tb, &format!("{}/metrics", run.base)).unwrap_or_default(),
        |t| {
            nodes.iter().all(|n| {
                metric(t, "firstpacket_node_drift_ratio", &[("node", n)])
                    .is_some_and(|v| !v.is_nan())
            })
        },
    );
    for n in nodes {
        assert!(
            metric(&text, "firstpacket_node_drift_ratio", &[("node", n)])
                .is_some_and(|v| !v.is_nan()),
            "{n}: no baseline learned within {within:?}\n{text}"
        );
    }
}

/// Asserts `run` shows (within `within`) a baseline p50 within max(20 %, 100 ms) of
/// `want` that it restored from the ConfigMap (its log says so).
fn starts_from_saved(tb: &Testbed, run: &Run, want: f64, within: Duration) {
    let p50 = learned_p50(tb, run, within);
    assert!(
        (p50 - want).abs() <= (0.2 * want).max(0.1),
        "{p50} vs {want}"
    );
    assert!(run.logs().contains("baseline restored"), "{}", run.logs());
}

/// Records of `node` started after `from`, oldest first, with TTFP.
fn after(probes: &[Value], node: &str, from: f64) -> Vec<Value> {
    let mut v: Vec<Value> = probes
        .iter()
        .filter(|p| touches(p, node) && started_unix(p) >= from && p["ttfp_seconds"].is_f64())
        .cloned()
        .collect();
    v.sort_by(|a, b| started_unix(a).total_cmp(&started_unix(b)));
    v
}

#[test]
fn run_drift_follows_s5_at_runtime_and_back_without_absorbing_it_and_survives_a_leader_change() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "drift",
        4,
        S1,
        &["--node-labels", "node-1=os=ubuntu2004,node-4=os=ubuntu2004"],
    );
    let leader = Run::start(
        &tb,
        "leader",
        41,
        &[
            "--leader-elect",
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
            "--leader-elect-retry-period",
            "1s",
        ],
    );
    // Series exist from the start, NaN until learned; thresholds exported.
    let text = curl(&tb, &format!("{}/metrics", leader.base)).expect("metrics");
    assert_eq!(
        metric(&text, "firstpacket_drift_threshold_ratio", &[]),
        Some(1.5),
        "{text}"
    );
    assert_eq!(
        metric(&text, "firstpacket_drift_floor_seconds", &[]),
        Some(0.5)
    );
    let before = learned_p50(&tb, &leader, Duration::from_secs(120));
    assert!(before < 1.0, "S1 baseline p50 {before}");
    let nodes = ["node-1", "node-2", "node-3", "node-4"];
    nodes_learned(&tb, &leader, &nodes, Duration::from_secs(120));

    // S5 at runtime: drift within 10 probes touching node-1 / node-4.
    let switched = now_unix();
    tb.set_fault(S5);
    let slow = ["node-1", "node-4"];
    let probes = common::poll_until(
        Duration::from_secs(120),
        || leader.probes(&tb),
        |ps| {
            slow.iter()
                .all(|n| after(ps, n, switched).iter().any(|p| counted_for(p, n)))
        },
    );
    for n in slow {
        let mine = after(&probes, n, switched);
        let first = mine.iter().position(|p| counted_for(p, n));
        assert!(
            first.is_some_and(|i| i < 10),
            "{n}: drift not counted within 10 probes touching it (first at {first:?} of {})\n{}",
            mine.len(),
            leader.logs()
        );
    }
    // The gauges show it too (polled: a node's best-peer median over a 20 s window
    // moves with each probe).
    let seen: std::cell::RefCell<BTreeSet<String>> = Default::default();
    let text = common::poll_until(
        Duration::from_secs(60),
        || {
            let text = curl(&tb, &format!("{}/metrics", leader.base)).unwrap_or_default();
            for n in slow {
                if metric(&text, "firstpacket_node_drift_active", &[("node", n)]) == Some(1.0) {
                    seen.borrow_mut().insert(n.to_string());
                }
            }
            text
        },
        |t| {
            seen.borrow().len() == slow.len()
                && metric(t, "firstpacket_drift_active", &[("kind", "cross_node")]) == Some(1.0)
        },
    );
    let seen = seen.into_inner();
    assert_eq!(
        seen.len(),
        2,
        "node drift gauges seen active: {seen:?}\n{text}"
    );
    assert_eq!(
        metric(&text, "firstpacket_drift_active", &[("kind", "cross_node")]),
        Some(1.0),
        "kind drift not active in S5\n{text}"
    );
    let r = metric(&text, "firstpacket_drift_ratio", &[("kind", "cross_node")]).expect("ratio");
    assert!(r >= 1.5, "drift ratio {r}");

    // Back to S1: drift ends within 10 probes (started after the switch back).
    let back = now_unix();
    tb.set_fault(S1);
    let probes = common::poll_until(
        Duration::from_secs(120),
        || leader.probes(&tb),
        |ps| slow.iter().all(|n| after(ps, n, back).len() >= 10),
    );
    for n in slow {
        let mine = after(&probes, n, back);
        assert!(
            mine.len() >= 10,
            "{n}: only {} probes after the switch back",
            mine.len()
        );
        assert!(
            !counted_for(&mine[9], n),
            "{n}: still drifting 10 probes after the switch back: {:?}",
            mine.iter().map(|p| counted_for(p, n)).collect::<Vec<_>>()
        );
        assert_eq!(
            leader.metric(&tb, "firstpacket_node_drift_active", &[("node", n)]),
            Some(0.0)
        );
    }
    let r = leader
        .metric(&tb, "firstpacket_drift_ratio", &[("kind", "cross_node")])
        .expect("ratio");
    assert!(r < 1.5, "ratio after the episode {r}");
    // The episode (now in the baseline window) was not absorbed.
    let after_p50 = learned_p50(&tb, &leader, Duration::from_secs(5));
    assert!(
        (after_p50 - before).abs() <= (0.2 * before).max(0.1),
        "baseline p50 {before:.3}s before the episode, {after_p50:.3}s after"
    );
    // Status page: the baseline band behind the chart.
    let page = curl(&tb, &format!("{}/", leader.base)).expect("status page");
    assert!(
        page.contains("class=\"baseline-band\" data-kind=\"cross_node\""),
        "no band"
    );

    // Leader change: a standby takes over after the leader's SIGTERM and starts from
    // the saved baseline (before it learned anything itself).
    let standby = Run::start(
        &tb,
        "standby",
        43,
        &[
            "--leader-elect",
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
            "--leader-elect-retry-period",
            "1s",
        ],
    );
    let samples_before = leader
        .metric(
            &tb,
            "firstpacket_baseline_samples",
            &[("kind", "cross_node")],
        )
        .expect("samples");
    assert_eq!(leader.stop(), 0);
    starts_from_saved(&tb, &standby, after_p50, Duration::from_secs(30));
    let own = standby.probes(&tb).len() as f64;
    let samples = standby
        .metric(
            &tb,
            "firstpacket_baseline_samples",
            &[("kind", "cross_node")],
        )
        .unwrap_or(0.0);
    assert!(
        samples >= 8.0 && own < 8.0,
        "the new leader's baseline ({samples} samples, the old one had {samples_before}) is its own ({own} probes)"
    );
    assert_eq!(standby.stop(), 0);

    // A restart (a new process, no election): it starts from the saved baseline too.
    let restarted = Run::start(&tb, "restarted", 45, &[]);
    starts_from_saved(&tb, &restarted, after_p50, Duration::from_secs(15));
    assert_eq!(restarted.stop(), 0);
}

#[test]
fn a_slower_normal_is_learned_without_drift_and_doubling_it_drifts() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("normal", 3, NORMAL_1_2, &[]);
    // 4 at a time: ~20 probes in the 20 s recent window, as the defaults have in theirs
    // (10 minutes at a probe every 30 s); with fewer, a node's median rests on 2–3 probes.
    let run = Run::start(&tb, "normal", 47, &["--concurrency", "4"]);
    let p50 = learned_p50(&tb, &run, Duration::from_secs(150));
    assert!(p50 > 0.3, "1-2 s normal learned as {p50}");
    nodes_learned(
        &tb,
        &run,
        &["node-1", "node-2", "node-3"],
        Duration::from_secs(120),
    );
    // Learned: a few more probes, none counted as drift, gauges 0.
    let learned_at = now_unix();
    let probes = common::poll_until(
        Duration::from_secs(60),
        || run.probes(&tb),
        |ps| ps.iter().filter(|p| started_unix(p) >= learned_at).count() >= 4,
    );
    let drifting: Vec<&Value> = probes
        .iter()
        .filter(|p| p["drift"]["counted"] == true)
        .collect();
    assert!(
        drifting.is_empty(),
        "drift on a healthy slower normal: {drifting:?}"
    );
    assert_eq!(
        run.metric(&tb, "firstpacket_drift_active", &[("kind", "cross_node")]),
        Some(0.0)
    );
    // Doubled: drift.
    tb.set_fault(NORMAL_2_4);
    let active = common::poll_until(
        Duration::from_secs(120),
        || run.metric(&tb, "firstpacket_drift_active", &[("kind", "cross_node")]),
        |v| *v == Some(1.0),
    );
    assert_eq!(
        active,
        Some(1.0),
        "no drift after doubling the normal\n{}",
        run.logs()
    );
    assert_eq!(run.stop(), 0);
}

/// junitparser's view of a JUnit file: (classname, name, failure message or "").
fn junit_cases(path: &std::path::Path) -> Vec<(String, String, String)> {
    let venv = std::env::var("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache")
        })
        .join("firstpacket/venv-junitparser-5.0.3/bin/python3");
    assert!(
        venv.is_file(),
        "{} missing: run `bash scripts/setup.sh`",
        venv.display()
    );
    let script = r#"
import json, sys
from junitparser import JUnitXml, Failure
xml = JUnitXml.fromfile(sys.argv[1])
out = []
for suite in xml:
    for case in suite:
        msg = ""
        for r in case.result:
            if isinstance(r, Failure):
                msg = r.message or ""
        out.append([case.classname, case.name, msg])
print(json.dumps(out))
"#;
    let out = std::process::Command::new(&venv)
        .args(["-c", script])
        .arg(path)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "junitparser: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("junitparser output")
}

#[test]
fn gate_saves_a_baseline_on_s1_fails_on_s2_naming_the_slow_nodes_and_passes_on_s1_again() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "gatebase",
        4,
        S1,
        &["--node-labels", "node-2=os=debian13,node-3=os=debian13"],
    );
    let saved = tb.state.join("baseline.json");
    let junit = tb.state.join("junit.xml");
    let common_args = [
        "--pairs",
        "12",
        "--concurrency",
        "12",
        "--hold",
        "1s",
        "--seed",
        "7",
    ];
    let mut args: Vec<&str> = common_args.to_vec();
    args.extend(["--save-baseline", saved.to_str().unwrap()]);
    let (code, _, out) = tb.gate(&args);
    assert_eq!(code, 0, "S1 gate\n{out}");
    let b: Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).expect("saved")).expect("json");
    assert_eq!(b["kinds"]["cross_node"]["n"], 12, "{b:#}");
    assert!(
        b["kinds"]["cross_node"]["p95"]
            .as_f64()
            .is_some_and(|v| v < 1.0),
        "{b:#}"
    );
    for n in 1..=4 {
        assert_eq!(
            b["kinds"]["cross_node"]["nodes"][format!("node-{n}")]["n"],
            6,
            "{b:#}"
        );
    }
    assert_eq!(b["settings"]["drift_ratio"], 1.5);

    // S2: exit 1, naming the kind and exactly node-2 and node-3.
    tb.set_fault(S2);
    let mut args: Vec<&str> = common_args.to_vec();
    args.extend([
        "--give-up",
        "50s",
        "--max-ttfp",
        "60s",
        "--slow-threshold",
        "60s",
    ]);
    args.extend([
        "--baseline",
        saved.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    let (code, report, out) = tb.gate(&args);
    common::validate(&report);
    assert_eq!(code, 1, "S2 against the S1 baseline\n{out}");
    let cmp = &report["baseline"];
    assert_eq!(cmp["regressed"], true, "{cmp:#}");
    assert_eq!(cmp["quantile"], "p95");
    let regressed: BTreeSet<String> = cmp["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["regressed"] == true)
        .map(|e| e["node"].as_str().unwrap_or("*").to_string())
        .collect();
    assert_eq!(
        regressed,
        ["*", "node-2", "node-3"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        "{cmp:#}"
    );
    // Too few samples (6 per node, 12 per kind, below 20): a warning, compared anyway.
    assert_eq!(cmp["few_samples"], true);
    assert!(out.contains("fewer than 20 samples"), "{out}");
    assert!(
        out.contains("baseline regression: cross_node node-2: p95"),
        "{out}"
    );
    let reasons = report["verdict_reasons"].to_string();
    assert!(
        reasons.contains("node-3") && reasons.contains("vs baseline"),
        "{reasons}"
    );
    // JUnit, read by junitparser: a testcase per kind and node, failures on node-2/3.
    let cases = junit_cases(&junit);
    let names: BTreeSet<(String, String)> =
        cases.iter().map(|c| (c.0.clone(), c.1.clone())).collect();
    for n in 1..=4 {
        assert!(
            names.contains(&("firstpacket.node".into(), format!("node-{n}"))),
            "{cases:?}"
        );
    }
    assert!(
        names.contains(&("firstpacket.kind".into(), "cross_node".into())),
        "{cases:?}"
    );
    let failing: BTreeSet<String> = cases
        .iter()
        .filter(|c| c.0 == "firstpacket.node" && !c.2.is_empty())
        .map(|c| c.1.clone())
        .collect();
    assert_eq!(
        failing,
        ["node-2", "node-3"].iter().map(|s| s.to_string()).collect(),
        "{cases:?}"
    );
    let baseline_case = cases
        .iter()
        .find(|c| c.0 == "firstpacket.baseline")
        .expect("baseline case");
    assert!(
        baseline_case.2.contains("node-2") && baseline_case.2.contains("vs baseline"),
        "{baseline_case:?}"
    );
    let node2 = cases.iter().find(|c| c.1 == "node-2").expect("node-2");
    assert!(
        node2.2.contains("p95") && node2.2.contains("best peer"),
        "{node2:?}"
    );
    tb.wait_no_probe_pods(Duration::from_secs(60));

    // S1 again: exit 0, every time.
    tb.set_fault(S1);
    for i in 0..5 {
        let mut args: Vec<&str> = common_args.to_vec();
        args.extend([
            "--baseline",
            saved.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
        ]);
        let (code, report, out) = tb.gate(&args);
        assert_eq!(code, 0, "S1 again, run {i}\n{out}");
        assert_eq!(report["baseline"]["regressed"], false);
        let cases = junit_cases(&junit);
        assert!(cases.iter().all(|c| c.2.is_empty()), "run {i}: {cases:?}");
    }
}

/// The stored baseline (ConfigMap `firstpacket-baseline`, read with `list`: the test
/// denies `get configmaps`) and its `cross_node` samples.
fn stored(tb: &Testbed) -> (Value, Vec<Value>) {
    let list: Value = serde_json::from_str(&tb.kubectl(&[
        "get",
        "configmaps",
        "-n",
        "firstpacket",
        "-o",
        "json",
    ]))
    .expect("configmap list json");
    let cm = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["metadata"]["name"] == "firstpacket-baseline")
        .cloned()
        .expect("configmap firstpacket-baseline");
    let snap: Value =
        serde_json::from_str(cm["data"]["baseline.json"].as_str().expect("baseline.json"))
            .expect("snapshot json");
    let samples = snap["kinds"]["cross_node"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    (snap, samples)
}

/// The stored baseline survives a refused read (nothing written until a read works,
/// then merged; forged kinds and future samples dropped), and a ConfigMap that is not
/// firstpacket's is never written.
#[test]
fn a_refused_baseline_read_never_overwrites_the_stored_baseline_and_a_later_read_merges_it() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("readfail", 3, S1, &[]);
    // A stored baseline of 40 samples (4.321 s: no S1 probe takes that long) over the
    // last 5 minutes, plus one sample dated an hour ahead (a clock that ran ahead) and a
    // kind this run does not probe.
    let now = now_unix();
    let mut samples: Vec<[f64; 2]> = (0..40)
        .map(|i| [(now - 300.0 + 6.0 * i as f64).round(), 4.321])
        .collect();
    samples.push([now + 3600.0, 10.0]);
    let snap = serde_json::json!({
        "version": 1,
        "saved_at": now,
        "kinds": {"cross_node": samples, "no_such_kind": [[now - 100.0, 1.0]]},
        "nodes": {},
        "nodes_as_target": {},
    });
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "firstpacket"}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "firstpacket-baseline", "namespace": "firstpacket",
                          "labels": {"app.kubernetes.io/name": "firstpacket"}},
             "data": {"baseline.json": snap.to_string()}},
        ],
    });
    let file = tb.state.join("stored-baseline.json");
    std::fs::write(&file, cm.to_string()).expect("write");
    tb.kubectl(&[
        "apply",
        "--validate=false",
        "-f",
        file.to_str().expect("path"),
    ]);
    let before = stored(&tb).1;
    assert_eq!(before.len(), 41);

    // The read is refused: the run learns meanwhile but writes nothing.
    common::testbed_ok(&tb, &["api", "deny", "get", "configmaps"]);
    let run = Run::start(&tb, "readfail", 49, &[]);
    common::poll_until(
        Duration::from_secs(60),
        || run.probes(&tb).len(),
        |n| *n >= 3,
    );
    std::thread::sleep(Duration::from_secs(6)); // > one --baseline-save-interval (5 s)
    assert_eq!(stored(&tb).1, before, "{}", run.logs());
    assert!(
        run.logs()
            .contains("nothing is written until a read succeeds"),
        "{}",
        run.logs()
    );

    // Allowed again: the next save reads first, adds the stored samples (not the one
    // from the future, not the unknown kind) to what was learned, then writes.
    common::testbed_ok(&tb, &["api", "allow", "all"]);
    let after = common::poll_until(
        Duration::from_secs(30),
        || stored(&tb).1,
        |s| s.len() != before.len(),
    );
    let t_max = now + 120.0;
    assert!(
        after.len() >= 40
            && after
                .iter()
                .all(|s| s[0].as_f64().unwrap_or(f64::MAX) < t_max),
        "stored after the merge: {after:?}\n{}",
        run.logs()
    );
    let kept = after
        .iter()
        .filter(|s| s[1].as_f64() == Some(4.321))
        .count();
    assert_eq!(kept, 40, "the stored samples survive: {after:?}");
    let (snap, _) = stored(&tb);
    assert!(snap["kinds"].get("no_such_kind").is_none(), "{snap}");
    assert_eq!(run.stop(), 0);

    // A --baseline-configmap that is not firstpacket's (no label) is left alone.
    let foreign = tb.state.join("foreign.json");
    std::fs::write(
        &foreign,
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "someone-elses", "namespace": "firstpacket"},
            "data": {"keep": "me"}})
        .to_string(),
    )
    .expect("write");
    tb.kubectl(&[
        "apply",
        "--validate=false",
        "-f",
        foreign.to_str().expect("path"),
    ]);
    let other = Run::start(
        &tb,
        "foreign",
        51,
        &["--baseline-configmap", "someone-elses"],
    );
    common::poll_until(
        Duration::from_secs(60),
        || other.probes(&tb).len(),
        |n| *n >= 2,
    );
    std::thread::sleep(Duration::from_secs(6)); // > one --baseline-save-interval
    let cm = tb.kubectl(&["get", "configmaps", "-n", "firstpacket", "-o", "json"]);
    let list: Value = serde_json::from_str(&cm).expect("json");
    let theirs = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["metadata"]["name"] == "someone-elses")
        .expect("someone-elses");
    assert_eq!(
        theirs["data"],
        serde_json::json!({"keep": "me"}),
        "{theirs}"
    );
    assert!(
        other.logs().contains("is not firstpacket's"),
        "{}",
        other.logs()
    );
    assert_eq!(other.stop(), 0);
}
