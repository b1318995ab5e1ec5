//! Hollow nodes (`testbed up --hollow-nodes M`, testbed/src/hollow.rs) on either control
//! plane (`FIRSTPACKET_CONTROL_PLANE` picks one): they stay Ready past the node-monitor
//! grace, a gate over them succeeds with the configured TTFP (checked against the truth
//! log), no probe pod is left, and `down` leaves no process or netns.
//!
//! 50 hollow nodes by default; 1 000 with `FIRSTPACKET_LONG_TESTS=1`. Needs root, `ip`,
//! `kubectl` and the workspace binaries (and, on the real control plane, its binaries).

mod common;

use common::{
    assert_ttfp_near_truth, netns_list, output_within, poll_until, started_unix, Testbed,
    POD_GONE_TIMEOUT, SERIAL,
};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The TTFP hollow sources are given.
const TTFP: Duration = Duration::from_millis(1500);

/// `testbed up --nodes 1 --hollow-nodes M …` (without [`Testbed::up`]'s wait for one
/// calico-node pod per netns node: hollow nodes carry theirs too).
fn up_hollow(name: &str, hollow: usize) -> Testbed {
    up_hollow_with(name, hollow, &[])
}

fn up_hollow_with(name: &str, hollow: usize, extra: &[&str]) -> Testbed {
    common::bin("prober");
    common::bin("target-server");
    let state = std::env::temp_dir().join(format!("fp-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).unwrap();
    let tb = Testbed { state };
    let mut up = tb.cmd();
    up.args(["up", "--nodes", "1"])
        .args(["--hollow-nodes", &hollow.to_string()])
        .args([
            "--hollow-ttfp",
            &humantime::format_duration(TTFP).to_string(),
        ])
        .args(extra)
        .arg("--image-dir")
        .arg(tb.state.join("no-images"));
    let started = Instant::now();
    let out = output_within(up, common::command_timeout());
    assert!(
        out.status.success(),
        "testbed up failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "testbed up with {hollow} hollow nodes: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    tb
}

/// Hollow Nodes by Ready status, and the age (seconds) of the stalest hollow Lease.
fn hollow_health(tb: &Testbed) -> (usize, usize, f64) {
    let nodes: Value = serde_json::from_str(&tb.kubectl(&[
        "get",
        "nodes",
        "-l",
        "testbed.firstpacket.io/hollow=true",
        "-o",
        "json",
    ]))
    .unwrap();
    let items = nodes["items"].as_array().cloned().unwrap_or_default();
    let ready = items
        .iter()
        .filter(|n| {
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .count();
    let leases: Value = serde_json::from_str(&tb.kubectl(&[
        "get",
        "leases",
        "-n",
        "kube-node-lease",
        "-o",
        "json",
    ]))
    .unwrap();
    let now = std::time::SystemTime::now();
    let stalest = leases["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| {
            l["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("hollow-"))
        })
        .map(|l| {
            let t = l["spec"]["renewTime"]
                .as_str()
                .and_then(|s| humantime::parse_rfc3339(s).ok())
                .unwrap_or(std::time::UNIX_EPOCH);
            now.duration_since(t).unwrap_or_default().as_secs_f64()
        })
        .fold(0.0, f64::max);
    (items.len(), ready, stalest)
}

#[test]
fn hollow_nodes_stay_ready_and_a_gate_over_them_measures_their_ttfp() {
    let _g = serial();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: needs root (network namespaces)");
        return;
    }
    let n = if common::long_tests() { 1000 } else { 50 };
    let tb = up_hollow("hollow", n);

    // Past the node-monitor grace (20 s on the real control plane, checked every 2 s)
    // plus one heartbeat period: every hollow Node stays Ready and every Lease is
    // younger than two renew periods, all along.
    let until = Instant::now() + common::node_not_ready_within();
    while Instant::now() < until {
        let (count, ready, stalest) = hollow_health(&tb);
        assert_eq!(count, n, "hollow Nodes registered");
        assert_eq!(ready, n, "hollow Nodes Ready");
        assert!(stalest < 20.0, "a hollow Lease is {stalest:.1}s old");
        std::thread::sleep(Duration::from_secs(2));
    }

    let started = Instant::now();
    let pairs = n.to_string();
    let (code, report, out) = tb.gate(&[
        "--node-selector",
        "testbed.firstpacket.io/hollow=true",
        "--pairs",
        &pairs,
        "--concurrency",
        "16",
        "--hold",
        "1s",
    ]);
    eprintln!(
        "gate over {n} hollow nodes: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(code, 0, "{out}");
    let probes = report["probes"].as_array().unwrap();
    assert_eq!(probes.len(), n, "{out}");
    let truth = tb.truth();
    for p in probes {
        assert_eq!(p["result"], "success", "{p:#}");
        let ttfp = assert_ttfp_near_truth(&truth, p, &out);
        assert!(
            (ttfp - TTFP.as_secs_f64()).abs() < 0.1,
            "probe {}: TTFP {ttfp:.3}s, configured {TTFP:?}",
            p["id"]
        );
    }
    // Every hollow node was probed as source and as target, and its agent scraped.
    let nodes = report["nodes"].as_array().unwrap();
    let hollow: Vec<&Value> = nodes
        .iter()
        .filter(|x| x["node"].as_str().is_some_and(|s| s.starts_with("hollow-")))
        .collect();
    assert_eq!(hollow.len(), n, "{out}");
    // Hollow nodes carry calico-node and kube-proxy pods whose pages answer: no
    // agent warning.
    assert_eq!(report["warnings"], serde_json::json!([]), "{out}");
    let felix = &report["agents"]["profiles"]["calico-felix"];
    // (node-1's agent may be scraped too: the sweep covers every agent.)
    assert!(
        felix["nodes_ok"].as_u64().unwrap_or(0) >= n as u64,
        "{felix:#}"
    );
    assert_eq!(felix["scrapes_failed"].as_u64(), Some(0), "{felix:#}");

    let left = poll_until(POD_GONE_TIMEOUT, || tb.probe_pods(), Vec::is_empty);
    assert!(left.is_empty(), "probe pods left: {left:?}");

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
}

/// Gate start-up (command start to the first probe's start) with every direct agent
/// scrape timing out (`--hollow-direct-scrapes hold`): it must not grow with the node
/// count (issue 17; the target is ≤ 10 s at 1 000 nodes, where scraping every node
/// first took over 4 minutes). Prints the number; asserts a bound three times the
/// target, so a busy machine does not fail it. 200 hollow nodes by default, 1 000 with
/// `FIRSTPACKET_LONG_TESTS=1`.
#[test]
fn gate_start_up_does_not_wait_for_every_nodes_agent_when_direct_scrapes_fail() {
    let _g = serial();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("SKIPPED: needs root (network namespaces)");
        return;
    }
    let n = if common::long_tests() { 1000 } else { 200 };
    let tb = up_hollow_with("hollow-startup", n, &["--hollow-direct-scrapes", "hold"]);
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (code, report, out) = tb.gate(&[
        "--node-selector",
        "testbed.firstpacket.io/hollow=true",
        "--pairs",
        "16",
        "--concurrency",
        "16",
        "--hold",
        "1s",
    ]);
    assert_eq!(code, 0, "{out}");
    let probes = report["probes"].as_array().unwrap();
    let first = probes
        .iter()
        .map(started_unix)
        .fold(f64::INFINITY, f64::min);
    let startup = first - t0;
    let felix = &report["agents"]["profiles"]["calico-felix"];
    eprintln!(
        "gate start-up to first probe at {n} hollow nodes, direct scrapes failing: {startup:.2}s \
         (calico-felix: {} nodes scraped, {} via the proxy)",
        felix["nodes_scraped"], felix["nodes_via_proxy"]
    );
    assert!(startup <= 30.0, "start-up {startup:.2}s\n{out}");
    // The scrapes went through the proxy (the direct path never answered).
    assert_eq!(felix["scrapes_failed"].as_u64(), Some(0), "{felix:#}");
    assert!(
        felix["nodes_scraped"].as_u64().unwrap_or(u64::MAX) < n as u64 / 2,
        "{felix:#}"
    );
}
