//! End-to-end test of `prober run` (continuous mode) on the testbed, out-of-cluster via
//! `testbed exec`: the admin server's `/metrics` and `/api/v1/probes` agree with each
//! other (TTFP histogram count = records with a TTFP up to the `total` read with them;
//! per-node counters = the records), every node is source and target, the recorded
//! TTFPs match the testbed's ground truth, the status page has a matrix cell for every
//! pair probed, and SIGTERM ends the run with exit 0 and no probe pod left.
//!
//! Needs root and the workspace binaries (`cargo build --workspace --bins`).

mod common;

use common::{assert_ttfp_near_truth, Testbed, SERIAL};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Healthy dataplane with a visible delay (endpoints programmed after 300 ms).
const FAULT: &str = "rules:\n  - nodes: {all: true}\n    program_delay: 300ms\n";

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the Prometheus text format (the subset the prober writes: no escapes in
/// label values).
fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((head, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => {
                let body = rest.trim_end_matches('}');
                let labels = body
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.to_string(), v.trim_matches('"').to_string()))
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (head.to_string(), BTreeMap::new()),
        };
        out.push((name, labels, value));
    }
    out
}

fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// `curl` inside the testbed's host netns (where the prober listens).
fn curl(tb: &Testbed, url: &str) -> Option<String> {
    let out = tb.exec(&["curl", "-sf", "-m", "5", url]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `/api/v1/probes`, `/metrics`, `/api/v1/probes` in one exec (the same second); retried
/// until both probe pages have the same `total`, so the metrics were read between two
/// identical states.
fn consistent_scrape(tb: &Testbed, base: &str) -> (Value, Vec<Sample>) {
    let script = format!(
        "curl -sf -m 5 {base}/api/v1/probes && echo && echo '=====' && curl -sf -m 5 {base}/metrics && echo '=====' && curl -sf -m 5 {base}/api/v1/probes"
    );
    for _ in 0..20 {
        let out = tb.exec(&["bash", "-c", &script]);
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let parts: Vec<&str> = text.split("=====").collect();
            if parts.len() == 3 {
                let a: Value = serde_json::from_str(parts[0].trim()).expect("probes JSON");
                let b: Value = serde_json::from_str(parts[2].trim()).expect("probes JSON");
                if a["total"] == b["total"] {
                    return (a, parse_metrics(parts[1]));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("no consistent scrape of {base} in 20 tries");
}

fn spawn_run(tb: &Testbed, addr: &str, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    tb.cmd()
        .args([
            "exec",
            "--",
            "prober",
            "run",
            "--probe-interval",
            "3s",
            "--hold",
            "2s",
            "--give-up",
            "20s",
            "--admin-addr",
            addr,
            "--log-format",
            "json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn prober run")
}

#[test]
fn run_metrics_agree_with_records_cover_every_node_and_sigterm_cleans_up() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("run", 4, FAULT, &[]);
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let base = format!("http://{addr}");
    let log = tb.state.join("prober-run.log");
    let mut run = spawn_run(&tb, &addr, &log);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    // Ready once the pod watch listed the (no) probe pods.
    let start = Instant::now();
    while curl(&tb, &format!("{base}/readyz")).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "/readyz never 200\n{}",
            logs()
        );
        assert!(
            run.try_wait().expect("wait").is_none(),
            "prober exited\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(curl(&tb, &format!("{base}/livez")).as_deref(), Some("ok\n"));

    // Probe until every node was source and target (two laps at most), ≥ 8 records.
    let nodes: BTreeSet<String> = (1..=4).map(|i| format!("node-{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(150);
    let (page, samples) = loop {
        let (page, samples) = consistent_scrape(&tb, &base);
        let probes = page["probes"].as_array().cloned().unwrap_or_default();
        let conclusive: Vec<&Value> = probes
            .iter()
            .filter(|p| p["result"] != "inconclusive")
            .collect();
        let src: BTreeSet<String> = conclusive
            .iter()
            .filter_map(|p| p["source"]["node"].as_str().map(str::to_owned))
            .collect();
        let dst: BTreeSet<String> = conclusive
            .iter()
            .filter_map(|p| p["target"]["node"].as_str().map(str::to_owned))
            .collect();
        if src == nodes && dst == nodes && probes.len() >= 8 {
            break (page, samples);
        }
        assert!(
            Instant::now() < deadline,
            "not every node covered in time: sources {src:?}, targets {dst:?}, {} records\n{}",
            probes.len(),
            logs()
        );
        std::thread::sleep(Duration::from_secs(3));
    };
    let probes = page["probes"].as_array().expect("probes").clone();
    let total = page["total"].as_u64().expect("total");
    assert_eq!(
        probes.len() as u64,
        total,
        "ring holds every record this early"
    );

    // The histogram count equals the records with a TTFP, per kind and overall.
    let with_ttfp = probes.iter().filter(|p| p["ttfp_seconds"].is_f64()).count();
    assert_eq!(
        sum(&samples, "firstpacket_ttfp_seconds_count", &[]) as usize,
        with_ttfp,
        "TTFP histogram count vs records with a TTFP (total {total})"
    );
    assert_eq!(
        sum(
            &samples,
            "firstpacket_ttfp_seconds_count",
            &[("kind", "cross_node")]
        ) as usize,
        with_ttfp
    );
    let ttfp_sum: f64 = probes
        .iter()
        .filter_map(|p| p["ttfp_seconds"].as_f64())
        .sum();
    assert!(
        (sum(&samples, "firstpacket_ttfp_seconds_sum", &[]) - ttfp_sum).abs() < 1e-6,
        "TTFP histogram sum vs records"
    );
    assert_eq!(sum(&samples, "firstpacket_probes_total", &[]) as u64, total);
    // Per-node counters agree with the records.
    for node in &nodes {
        for (role, field) in [("source", "source"), ("target", "target")] {
            for result in ["success", "slow", "failed", "inconclusive"] {
                let want = probes
                    .iter()
                    .filter(|p| p[field]["node"] == node.as_str() && p["result"] == result)
                    .count();
                let got = sum(
                    &samples,
                    "firstpacket_node_probes_total",
                    &[("node", node), ("role", role), ("result", result)],
                );
                assert_eq!(got as usize, want, "{node} {role} {result}");
            }
        }
        let last = probes
            .iter()
            .rev()
            .find(|p| p["source"]["node"] == node.as_str() && p["ttfp_seconds"].is_f64())
            .and_then(|p| p["ttfp_seconds"].as_f64());
        if let Some(last) = last {
            let got = sum(
                &samples,
                "firstpacket_node_last_ttfp_seconds",
                &[("node", node), ("role", "source")],
            );
            assert!(
                (got - last).abs() < 1e-9,
                "{node} last TTFP {got} vs {last}"
            );
        }
    }
    // Pre-initialised and always-present series.
    assert!(samples
        .iter()
        .any(|(n, l, _)| n == "firstpacket_probes_total"
            && l.get("reason").map(String::as_str) == Some("wrong_peer")));
    assert_eq!(sum(&samples, "firstpacket_build_info", &[]), 1.0);
    assert_eq!(sum(&samples, "firstpacket_eligible_nodes", &[]), 4.0);
    assert!(samples
        .iter()
        .any(|(n, _, _)| n == "firstpacket_probes_in_flight"));
    assert!(
        !samples
            .iter()
            .any(|(_, l, _)| l.contains_key("pod") || l.contains_key("source")),
        "no pod or pair labels"
    );
    let recent = sum(
        &samples,
        "firstpacket_state_entries",
        &[("structure", "recent_records")],
    );
    assert!(recent as u64 >= total.saturating_sub(2) && recent as u64 <= 500);

    // TTFP near the testbed's truth for every success.
    let truth = tb.truth();
    let mut checked = 0;
    for p in probes.iter().filter(|p| p["result"] == "success") {
        assert_ttfp_near_truth(&truth, p, "prober run");
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} successes:\n{page:#}");

    // The status page: a matrix cell for every pair probed, self-contained.
    let html = curl(&tb, &format!("{base}/")).expect("status page");
    let page2: Value =
        serde_json::from_str(&curl(&tb, &format!("{base}/api/v1/probes")).expect("probes"))
            .expect("json");
    for p in page2["probes"].as_array().expect("probes").iter().take(400) {
        let cell = format!(
            "data-source=\"{}\" data-target=\"{}\"",
            p["source"]["node"].as_str().unwrap_or("?"),
            p["target"]["node"].as_str().unwrap_or("?")
        );
        assert!(html.contains(&cell), "no matrix cell {cell}");
    }
    assert!(html.contains("<svg"), "no TTFP chart");
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));

    // SIGTERM: exit 0 within the grace period, no probe pod left.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let stop = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().expect("wait") {
            break s;
        }
        assert!(
            stop.elapsed() < Duration::from_secs(30),
            "prober run still running 30s after SIGTERM\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status.code(), Some(0), "exit after SIGTERM\n{}", logs());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = tb.probe_pods();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "probe pods left: {left:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every stderr line is one JSON object.
    for line in logs().lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "not JSON: {line}"
        );
    }
}
