//! Node-agent correlation (docs/design.md §3, issue 4): pure correlation on S2/S5-like
//! numbers, the real fixture pages read through the built-in profiles, and the scrape
//! path against loopback HTTP servers.

use firstpacket_report::{ProbeResult, Role, Signal, Suspect};
use prober::agents::correlate::{
    correlate, healthy_half_median, merge_warnings, split_findings, ClusterView, History,
    Observation, Params, ProbeWindow, ScrapeFailure, DEFAULT_RING, HORIZON_SECONDS,
};
use prober::agents::discover::{AgentIndex, AgentTarget};
use prober::agents::expo;
use prober::agents::profiles::{
    builtin_profiles, find, AgentReading, SumCount, CALICO_FELIX, CILIUM_AGENT, KUBE_PROXY,
};
use prober::agents::scrape::{
    fetch_direct, no_retry_client, read_page, reference_sample, AgentWatcher, ScrapeError,
    ScrapeMode, ScrapeSettings, Scraper,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn fixture(name: &str) -> String {
    let p = format!("{FIXTURES}/{name}");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {p}: {e}"))
}

/// Cumulative counters of one simulated Felix.
#[derive(Debug, Clone, Copy)]
struct Felix {
    sum: f64,
    count: f64,
    failures: f64,
    resyncs: f64,
    start: f64,
}

impl Felix {
    fn new() -> Felix {
        Felix {
            sum: 0.5,
            count: 100.0,
            failures: 0.0,
            resyncs: 1.0,
            start: 1.7e9,
        }
    }
    /// `n` applies of `each` seconds and `fails` failures.
    fn step(&mut self, n: f64, each: f64, fails: f64) {
        self.sum += n * each;
        self.count += n;
        self.failures += fails;
    }
    fn reading(&self) -> AgentReading {
        AgentReading {
            apply: Some(SumCount {
                sum: self.sum,
                count: self.count,
            }),
            failures: Some(self.failures),
            resyncs: Some(self.resyncs),
            process_start: Some(self.start),
            ..AgentReading::default()
        }
    }
}

fn obs(node: &str, at: f64, f: &Felix) -> Observation {
    Observation {
        at,
        profile: CALICO_FELIX.into(),
        node: node.into(),
        pod: format!("calico-node-{node}").into(),
        uid: format!("uid-{node}").into(),
        restart_count: 0,
        ready: true,
        scrape_path: Some("direct"),
        outcome: Ok(f.reading()),
    }
}

fn view(nodes: &[&str]) -> ClusterView {
    ClusterView {
        present_profiles: vec![CALICO_FELIX.to_owned()],
        searched_profiles: vec![CALICO_FELIX.to_owned()],
        agents_on_node: nodes
            .iter()
            .map(|n| ((*n).to_owned(), vec![CALICO_FELIX.to_owned()]))
            .collect(),
        discovery_errors: Vec::new(),
    }
}

/// A cluster where `slow` nodes apply in `slow_each` seconds and fail `fail_rate`/s
/// (by node) over 40 s of history, then a window [30, 40].
fn cluster(
    nodes: &[&str],
    apply_each: &dyn Fn(&str, f64) -> f64,
    fail_rate: &dyn Fn(&str) -> f64,
) -> History {
    let mut h = History::default();
    for n in nodes {
        let mut f = Felix::new();
        for step in 0..=4 {
            let t = step as f64 * 10.0;
            if step > 0 {
                f.step(5.0, apply_each(n, t), fail_rate(n) * 10.0);
            }
            h.push(obs(n, t, &f));
        }
    }
    h
}

fn window(src: &str, dst: &str) -> ProbeWindow {
    ProbeWindow {
        start: 30.0,
        end: 40.0,
        source_node: src.to_owned(),
        target_node: dst.to_owned(),
    }
}

fn all_pairs_findings(h: &History, nodes: &[&str]) -> Vec<Suspect> {
    let v = view(nodes);
    let mut out = Vec::new();
    for s in nodes {
        for t in nodes {
            if s != t {
                out.extend(correlate(h, &v, &window(s, t), &Params::default()));
            }
        }
    }
    out
}

fn flagged(findings: &[Suspect], signal: Signal) -> BTreeSet<String> {
    findings
        .iter()
        .filter(|s| s.signal == signal)
        .map(|s| s.node.clone())
        .collect()
}

fn num(s: &Suspect, key: &str) -> f64 {
    s.evidence[key]
        .as_f64()
        .unwrap_or_else(|| panic!("evidence {key} missing in {}", s.evidence))
}

const NODES4: [&str; 4] = ["node-1", "node-2", "node-3", "node-4"];

#[test]
fn s2_two_slow_nodes_of_four_are_exactly_the_apply_slow_suspects_with_numbers() {
    let slow = |n: &str, _t: f64| {
        if n == "node-2" || n == "node-3" {
            1.2
        } else {
            0.004
        }
    };
    let h = cluster(&NODES4, &slow, &|_| 0.0);
    let f = all_pairs_findings(&h, &NODES4);
    let expected: BTreeSet<String> = ["node-2", "node-3"].map(String::from).into();
    assert_eq!(flagged(&f, Signal::DataplaneApplySlow), expected);
    assert!(
        f.iter().all(|s| s.signal == Signal::DataplaneApplySlow),
        "only apply_slow: {f:?}"
    );
    let one = f
        .iter()
        .find(|s| s.node == "node-2" && s.role == Role::Target)
        .expect("node-2 as target");
    assert!((num(one, "apply_mean_seconds") - 1.2).abs() < 1e-6);
    assert!((num(one, "healthy_half_apply_mean_seconds") - 0.004).abs() < 1e-6);
    assert!((num(one, "window_seconds") - 10.0).abs() < 1e-9);
    assert_eq!(num(one, "applies_in_window"), 5.0);
}

#[test]
fn s5_failures_rising_on_two_nodes_flag_exactly_those() {
    let rate = |n: &str| {
        if n == "node-1" || n == "node-4" {
            1.0
        } else {
            0.0
        }
    };
    let h = cluster(&NODES4, &|_, _| 0.004, &rate);
    let f = all_pairs_findings(&h, &NODES4);
    let expected: BTreeSet<String> = ["node-1", "node-4"].map(String::from).into();
    assert_eq!(flagged(&f, Signal::DataplaneApplyFailures), expected);
    assert!(flagged(&f, Signal::DataplaneApplySlow).is_empty());
    let one = f
        .iter()
        .find(|s| s.signal == Signal::DataplaneApplyFailures)
        .expect("one");
    assert!((num(one, "failures_per_second") - 1.0).abs() < 1e-9);
    assert_eq!(num(one, "failures_in_window"), 10.0);
}

#[test]
fn healthy_cluster_gives_no_findings() {
    let h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    assert!(all_pairs_findings(&h, &NODES4).is_empty());
}

#[test]
fn half_the_cluster_slow_is_still_flagged_against_the_healthiest_half() {
    let nodes = ["a", "b", "c", "d", "e", "f"];
    let slow = |n: &str, _t: f64| if "bdf".contains(n) { 0.9 } else { 0.003 };
    let h = cluster(&nodes, &slow, &|_| 0.0);
    let f = all_pairs_findings(&h, &nodes);
    let expected: BTreeSet<String> = ["b", "d", "f"].map(String::from).into();
    assert_eq!(flagged(&f, Signal::DataplaneApplySlow), expected);
    // A plain median of the other five (3 fast, 2 slow → 0.003) works here by luck;
    // over all six it is between the groups, where the healthiest half is not.
    let all = [0.003, 0.9, 0.003, 0.9, 0.003, 0.9];
    assert_eq!(healthy_half_median(&all, 2), Some(0.003));
}

#[test]
fn a_cluster_wide_step_is_caught_by_each_nodes_own_history() {
    // Every node fast until t=30, then every node slow in the window.
    let step = |_n: &str, t: f64| if t > 30.0 { 0.8 } else { 0.003 };
    let h = cluster(&NODES4, &step, &|_| 0.0);
    let f = all_pairs_findings(&h, &NODES4);
    assert_eq!(flagged(&f, Signal::DataplaneApplySlow).len(), 4);
    let one = &f[0];
    assert!((num(one, "own_history_apply_mean_seconds") - 0.003).abs() < 1e-9);
}

#[test]
fn a_node_slow_all_along_without_cluster_baseline_is_flagged_by_the_absolute_floor() {
    let nodes = ["x", "y"];
    let slow = |n: &str, _t: f64| if n == "x" { 1.2 } else { 0.002 };
    let h = cluster(&nodes, &slow, &|_| 0.0);
    let f = correlate(&h, &view(&nodes), &window("y", "x"), &Params::default());
    assert_eq!(
        flagged(&f, Signal::DataplaneApplySlow),
        ["x".to_owned()].into()
    );
    assert!(f[0].evidence["healthy_half_apply_mean_seconds"].is_null());
    // Below the 1 s no-baseline floor it is not.
    let slow = |n: &str, _t: f64| if n == "x" { 0.6 } else { 0.002 };
    let h = cluster(&nodes, &slow, &|_| 0.0);
    assert!(correlate(&h, &view(&nodes), &window("y", "x"), &Params::default()).is_empty());
}

#[test]
fn slow_but_under_the_absolute_floor_is_not_flagged() {
    // 50 ms vs 1 ms is 50×, but under the 0.25 s floor.
    let slow = |n: &str, _t: f64| if n == "node-2" { 0.05 } else { 0.001 };
    let h = cluster(&NODES4, &slow, &|_| 0.0);
    assert!(all_pairs_findings(&h, &NODES4).is_empty());
}

#[test]
fn counter_reset_is_agent_restarted_never_a_negative_rate() {
    let mut h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    // node-2's Felix restarts inside the window: counters start from 0, new start time.
    let mut f = Felix::new();
    f.sum = 0.01;
    f.count = 3.0;
    f.resyncs = 1.0;
    f.start = 1.7e9 + 35.0;
    let mut o = obs("node-2", 40.5, &f);
    o.restart_count = 0; // hostNetwork process restarted in place; only the page says so
    h.push(o);
    let w = ProbeWindow {
        start: 30.0,
        end: 40.2,
        source_node: "node-1".into(),
        target_node: "node-2".into(),
    };
    let f = correlate(&h, &view(&NODES4), &w, &Params::default());
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].signal, Signal::AgentRestarted);
    assert_eq!(f[0].node, "node-2");
    assert_eq!(f[0].evidence["counter_decreased"], "apply_count");
    // No finding anywhere carries a negative number.
    let text = serde_json::to_string(&f).expect("json");
    assert!(!text.contains(":-"), "{text}");
}

#[test]
fn restart_count_change_alone_is_agent_restarted() {
    let mut h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    let mut f = Felix::new();
    f.step(20.0, 0.004, 0.0);
    let mut o = obs("node-3", 41.0, &f);
    o.restart_count = 1;
    h.push(o);
    let w = ProbeWindow {
        start: 30.0,
        end: 40.5,
        source_node: "node-3".into(),
        target_node: "node-1".into(),
    };
    let f = correlate(&h, &view(&NODES4), &w, &Params::default());
    assert_eq!(
        flagged(&f, Signal::AgentRestarted),
        ["node-3".to_owned()].into()
    );
}

#[test]
fn resyncs_in_the_window_are_datastore_resync() {
    let mut h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    let mut f = Felix::new();
    f.step(20.0, 0.004, 0.0);
    f.resyncs = 4.0;
    h.push(obs("node-4", 41.0, &f));
    let w = ProbeWindow {
        start: 30.0,
        end: 40.5,
        source_node: "node-1".into(),
        target_node: "node-4".into(),
    };
    let f = correlate(&h, &view(&NODES4), &w, &Params::default());
    assert_eq!(
        flagged(&f, Signal::DatastoreResync),
        ["node-4".to_owned()].into()
    );
    let s = f
        .iter()
        .find(|s| s.signal == Signal::DatastoreResync)
        .expect("resync");
    assert_eq!(num(s, "resyncs_in_window"), 3.0);
}

#[test]
fn agent_not_ready_in_the_window_is_reported() {
    let mut h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    let mut f = Felix::new();
    f.step(20.0, 0.004, 0.0);
    let mut o = obs("node-1", 41.0, &f);
    o.ready = false;
    h.push(o);
    let w = ProbeWindow {
        start: 30.0,
        end: 40.5,
        source_node: "node-1".into(),
        target_node: "node-2".into(),
    };
    let f = correlate(&h, &view(&NODES4), &w, &Params::default());
    assert_eq!(
        flagged(&f, Signal::AgentNotReady),
        ["node-1".to_owned()].into()
    );
}

#[test]
fn unreachable_and_absent_agents_are_warnings_only_one_per_node() {
    let mut h = cluster(&["node-1", "node-2", "node-3"], &|_, _| 0.004, &|_| 0.0);
    h.push(Observation {
        at: 40.5,
        profile: CALICO_FELIX.into(),
        node: "node-2".into(),
        pod: "calico-node-node-2".into(),
        uid: "uid-node-2".into(),
        restart_count: 0,
        ready: true,
        scrape_path: Some("direct"),
        outcome: Err(ScrapeFailure {
            signal: Signal::AgentUnreachable,
            reason: "connect",
            message: "connect http://10.0.0.2:9091/metrics: Connection refused".into(),
        }),
    });
    let mut v = view(&["node-1", "node-2", "node-3"]);
    v.agents_on_node.remove("node-4");
    let mut warnings = Vec::new();
    for _ in 0..3 {
        for (s, t) in [("node-2", "node-4"), ("node-1", "node-2")] {
            let w = ProbeWindow {
                start: 30.0,
                end: 40.2,
                source_node: s.into(),
                target_node: t.into(),
            };
            let f = correlate(&h, &v, &w, &Params::default());
            let (suspects, warn) = split_findings(f, ProbeResult::Slow);
            assert!(
                suspects.is_empty(),
                "unreachable is never a suspect: {suspects:?}"
            );
            merge_warnings(&mut warnings, warn);
        }
    }
    let got: Vec<(String, Signal)> = warnings
        .iter()
        .map(|w| (w.node.clone(), w.signal))
        .collect();
    assert_eq!(
        got,
        [
            ("node-2".to_owned(), Signal::AgentUnreachable),
            ("node-4".to_owned(), Signal::AgentUnreachable)
        ]
    );
    assert_eq!(warnings[0].evidence["seen_in_probes"], 6);
    assert_eq!(warnings[1].evidence["reason"], "no_agent_pod_on_node");
}

/// Issue 29: an agent that stopped answering during the probe (scrapes timed out) and
/// answered again is evidence on its node — a suspect on a slow probe, a warning on a
/// successful one; one that answered throughout is not named.
#[test]
fn an_agent_that_stalled_during_the_probe_and_came_back_is_a_suspect() {
    let mut h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    let timed_out = |at: f64| Observation {
        at,
        profile: CALICO_FELIX.into(),
        node: "node-3".into(),
        pod: "calico-node-node-3".into(),
        uid: "uid-node-3".into(),
        restart_count: 0,
        ready: true,
        scrape_path: Some("proxy"),
        outcome: Err(ScrapeFailure {
            signal: Signal::AgentUnreachable,
            reason: "timeout",
            message: "GET http://10.0.0.3:9091/metrics: timed out after 5s".into(),
        }),
    };
    h.push(timed_out(33.0));
    h.push(timed_out(38.0));
    let mut f = Felix::new();
    f.step(45.0, 0.004, 0.0);
    h.push(obs("node-3", 45.5, &f));
    let w = ProbeWindow {
        start: 30.0,
        end: 40.5,
        source_node: "node-1".into(),
        target_node: "node-3".into(),
    };
    let found = correlate(&h, &view(&NODES4), &w, &Params::default());
    let stalled: Vec<&Suspect> = found
        .iter()
        .filter(|s| s.signal == Signal::AgentUnreachable)
        .collect();
    assert_eq!(stalled.len(), 1, "{found:?}");
    assert_eq!(stalled[0].node, "node-3");
    assert_eq!(stalled[0].evidence["reason"], "stalled_in_window");
    assert_eq!(stalled[0].evidence["failed_scrapes"], 2);
    assert_eq!(stalled[0].evidence["first_failure"], "timeout");
    let (suspects, _) = split_findings(found.clone(), ProbeResult::Slow);
    assert!(
        suspects
            .iter()
            .any(|s| s.node == "node-3" && s.signal == Signal::AgentUnreachable),
        "{suspects:?}"
    );
    let (suspects, warnings) = split_findings(found, ProbeResult::Success);
    assert!(suspects.is_empty() && !warnings.is_empty());
    // Still not answering at the window's end: we only could not look.
    h.push(timed_out(46.0));
    let found = correlate(&h, &view(&NODES4), &w, &Params::default());
    assert!(
        !found
            .iter()
            .any(|s| s.evidence["reason"] == "stalled_in_window"),
        "{found:?}"
    );
}

#[test]
fn failing_discovery_is_named_instead_of_no_agents() {
    let h = History::default();
    let v = ClusterView {
        searched_profiles: vec![CALICO_FELIX.into()],
        discovery_errors: vec![
            "calico-felix in kube-system: initial list failed: HTTP 403 Forbidden: pods is forbidden".into(),
        ],
        ..ClusterView::default()
    };
    let f = correlate(&h, &v, &window("a", "b"), &Params::default());
    let (_, w) = split_findings(f, ProbeResult::Failed);
    assert_eq!(w.len(), 2, "one per node: {w:?}");
    for x in &w {
        assert_eq!(x.evidence["reason"], "discovery_failed", "{x:?}");
        let msg = x.evidence["message"].as_str().unwrap();
        assert!(
            msg.contains("403") && msg.contains("`list` and `watch` on pods"),
            "{msg}"
        );
    }
}

#[test]
fn no_agents_anywhere_gives_one_unreachable_warning_per_node() {
    let h = History::default();
    let v = ClusterView {
        searched_profiles: vec![CALICO_FELIX.into(), KUBE_PROXY.into()],
        ..ClusterView::default()
    };
    let f = correlate(&h, &v, &window("a", "b"), &Params::default());
    let (s, w) = split_findings(f, ProbeResult::Failed);
    assert!(s.is_empty());
    assert_eq!(w.len(), 2);
    assert!(w.iter().all(|w| w.signal == Signal::AgentUnreachable
        && w.evidence["reason"] == "no_agent_pods_in_cluster"));
}

#[test]
fn agent_trouble_with_normal_ttfp_goes_to_warnings() {
    // Negative control: failures rising 5/s on one node, probe succeeded.
    let rate = |n: &str| if n == "node-3" { 5.0 } else { 0.0 };
    let h = cluster(&NODES4, &|_, _| 0.004, &rate);
    let f = correlate(
        &h,
        &view(&NODES4),
        &window("node-1", "node-3"),
        &Params::default(),
    );
    let (suspects, warnings) = split_findings(f.clone(), ProbeResult::Success);
    assert!(suspects.is_empty());
    assert_eq!(
        flagged(&warnings, Signal::DataplaneApplyFailures),
        ["node-3".to_owned()].into()
    );
    let (suspects, warnings) = split_findings(f, ProbeResult::Slow);
    assert_eq!(suspects.len(), 1);
    assert!(warnings.is_empty());
}

#[test]
fn an_agent_pod_deleted_mid_run_is_agent_unreachable_pod_gone() {
    // node-2's calico-node pod was read until t=30 (before the window), then deleted:
    // discovery no longer lists it, no pod replaced it.
    let h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    let mut v = view(&NODES4);
    v.agents_on_node.remove("node-2");
    let w = ProbeWindow {
        start: 41.0,
        end: 55.0,
        source_node: "node-1".into(),
        target_node: "node-2".into(),
    };
    let f = correlate(&h, &v, &w, &Params::default());
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].node.as_str(), f[0].signal),
        ("node-2", Signal::AgentUnreachable)
    );
    assert_eq!(f[0].evidence["reason"], "agent_pod_gone");
    assert_eq!(f[0].evidence["agent_pod"], "calico-node-node-2");
    assert_eq!(num(&f[0], "seconds_since_last_scrape"), 15.0);
}

#[test]
fn a_new_agent_pod_taking_over_is_one_agent_restarted() {
    // DaemonSet hand-over on node-2: the old pod's readings, then the new pod's (a new
    // UID, counters from zero) — one agent_restarted per window, also once merged.
    let mut h = cluster(&NODES4, &|_, _| 0.004, &|_| 0.0);
    let mut f = Felix::new();
    f.start = 1.7e9 + 45.0;
    for at in [46.0, 51.0, 56.0] {
        let mut o = obs("node-2", at, &f);
        o.uid = "uid-node-2-new".into();
        o.pod = "calico-node-node-2-new".into();
        h.push(o);
        f.step(2.0, 0.004, 0.0);
    }
    let mut warnings = Vec::new();
    let w = ProbeWindow {
        start: 40.0,
        end: 45.5,
        source_node: "node-2".into(),
        target_node: "node-1".into(),
    };
    let got = correlate(&h, &view(&NODES4), &w, &Params::default());
    assert_eq!(
        flagged(&got, Signal::AgentRestarted),
        ["node-2".to_owned()].into()
    );
    let r = got
        .iter()
        .find(|s| s.signal == Signal::AgentRestarted)
        .expect("restart");
    assert_eq!(r.evidence["pod_uid_changed"], true);
    merge_warnings(&mut warnings, split_findings(got, ProbeResult::Success).1);
    // A later window inside the new pod's life: no restart any more.
    let w = ProbeWindow {
        start: 51.0,
        end: 55.5,
        source_node: "node-2".into(),
        target_node: "node-1".into(),
    };
    let got = correlate(&h, &view(&NODES4), &w, &Params::default());
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(warnings.len(), 1);
}

#[test]
fn merged_warnings_count_distinct_probes_and_list_every_profile() {
    let w = |profile: &str, reason: &str| Suspect {
        node: "node-2".into(),
        role: Role::Target,
        signal: Signal::AgentUnreachable,
        evidence: serde_json::json!({"profile": profile, "reason": reason, "message": format!("{profile} {reason}")}),
    };
    let mut all = Vec::new();
    // 6 probes; node-2 in 4 of them, each time both Felix and kube-proxy unreachable.
    for i in 0..6 {
        let probe = if i % 3 == 0 {
            vec![]
        } else {
            vec![w(CALICO_FELIX, "timeout"), w(KUBE_PROXY, "refused")]
        };
        merge_warnings(&mut all, probe);
    }
    assert_eq!(
        all.len(),
        1,
        "one agent_unreachable warning per node: {all:?}"
    );
    let e = &all[0].evidence;
    assert_eq!(e["seen_in_probes"], 4, "{e}");
    assert_eq!(e["profiles"], serde_json::json!([CALICO_FELIX, KUBE_PROXY]));
    assert_eq!(e["by_profile"][KUBE_PROXY]["reason"], "refused", "{e}");
    assert_eq!(e["by_profile"][CALICO_FELIX]["reason"], "timeout", "{e}");
    assert_eq!(e["profile"], CALICO_FELIX);
}

#[test]
fn all_profiles_disabled_means_no_agent_findings_at_all() {
    let v = ClusterView::default();
    let f = correlate(
        &History::default(),
        &v,
        &window("a", "b"),
        &Params::default(),
    );
    assert!(f.is_empty(), "{f:?}");
}

#[test]
fn restart_evidence_keeps_process_start_precision_and_merges_first_before_last_after() {
    let mut h = History::default();
    let mut f = Felix::new();
    f.start = 1_796_002_000.0;
    h.push(obs("node-1", 0.0, &f));
    f.start = 1_796_002_004.0;
    f.sum = 0.0;
    f.count = 1.0;
    let mut o = obs("node-1", 10.0, &f);
    o.restart_count = 1;
    h.push(o);
    f.start = 1_796_002_020.0;
    let mut o = obs("node-1", 30.0, &f);
    o.restart_count = 4;
    h.push(o);
    let v = view(&["node-1"]);
    let win = |start: f64, end: f64| ProbeWindow {
        start,
        end,
        source_node: "node-1".into(),
        target_node: "node-1".into(),
    };
    let first = correlate(&h, &v, &win(0.0, 10.0), &Params::default());
    let r = first
        .iter()
        .find(|s| s.signal == Signal::AgentRestarted)
        .expect("restart");
    assert_eq!(num(r, "process_start_before"), 1_796_002_000.0);
    assert_eq!(num(r, "process_start_after"), 1_796_002_004.0);
    let second = correlate(&h, &v, &win(10.0, 30.0), &Params::default());
    let mut warnings = Vec::new();
    merge_warnings(&mut warnings, first);
    merge_warnings(&mut warnings, second);
    let m = warnings
        .iter()
        .find(|s| s.signal == Signal::AgentRestarted)
        .expect("merged");
    assert_eq!(num(m, "restart_count_before"), 0.0);
    assert_eq!(num(m, "restart_count_after"), 4.0, "{}", m.evidence);
    assert_eq!(num(m, "process_start_before"), 1_796_002_000.0);
    assert_eq!(num(m, "process_start_after"), 1_796_002_020.0);
    assert!(m.evidence["restart_span"]
        .as_str()
        .unwrap_or("")
        .contains("first"));
}

#[test]
fn evidence_numbers_keep_timestamps_exact_and_round_durations() {
    use prober::agents::correlate::evidence_number;
    assert_ne!(
        evidence_number(1_796_002_000.0),
        evidence_number(1_796_002_004.0)
    );
    assert_eq!(
        evidence_number(1_796_002_004.25).as_f64(),
        Some(1_796_002_004.25)
    );
    assert_eq!(evidence_number(0.123456789).as_f64(), Some(0.1234568));
}

#[test]
fn own_history_rate_from_under_the_minimum_span_is_null() {
    // node-3: two readings 0.4 s apart before the window, then failures in the window.
    let mut h = cluster(&["node-1", "node-2"], &|_, _| 0.004, &|_| 0.0);
    let mut f = Felix::new();
    h.push(obs("node-3", 29.6, &f));
    h.push(obs("node-3", 30.0, &f));
    f.step(5.0, 0.004, 10.0);
    h.push(obs("node-3", 40.0, &f));
    let v = view(&["node-1", "node-2", "node-3"]);
    let got = correlate(&h, &v, &window("node-3", "node-1"), &Params::default());
    let s = got
        .iter()
        .find(|s| s.signal == Signal::DataplaneApplyFailures)
        .expect("failures flagged");
    assert!(
        s.evidence["own_history_failures_per_second"].is_null(),
        "{}",
        s.evidence
    );
    // With a long enough own history the rate is a number.
    let mut h = cluster(&["node-1", "node-2"], &|_, _| 0.004, &|_| 0.0);
    let mut f = Felix::new();
    h.push(obs("node-3", 20.0, &f));
    h.push(obs("node-3", 30.0, &f));
    f.step(5.0, 0.004, 10.0);
    h.push(obs("node-3", 40.0, &f));
    let got = correlate(&h, &v, &window("node-3", "node-1"), &Params::default());
    let s = got
        .iter()
        .find(|s| s.signal == Signal::DataplaneApplyFailures)
        .expect("failures flagged");
    assert_eq!(num(s, "own_history_failures_per_second"), 0.0);
}

#[test]
fn findings_name_the_scrape_path_used() {
    let mut h = History::default();
    for n in ["node-1", "node-2", "node-3"] {
        let mut f = Felix::new();
        for step in 0..=4 {
            if step > 0 {
                f.step(5.0, if n == "node-2" { 1.2 } else { 0.004 }, 0.0);
            }
            let mut o = obs(n, step as f64 * 10.0, &f);
            o.scrape_path = Some("proxy");
            h.push(o);
        }
    }
    let got = correlate(
        &h,
        &view(&["node-1", "node-2", "node-3"]),
        &window("node-1", "node-2"),
        &Params::default(),
    );
    assert!(!got.is_empty());
    assert!(
        got.iter().all(|s| s.evidence["scrape_path"] == "proxy"),
        "{got:?}"
    );
}

// ---- fixture pages through the profiles -------------------------------------------

#[test]
fn felix_320_fixture_reads_through_the_calico_profile_with_old_route_names() {
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let r = read_page(p, "fixture", &fixture("felix-3.20-1.prom")).expect("reading");
    let a = r.apply.expect("apply");
    assert!((a.sum - 9.987720965999968).abs() < 1e-9 && a.count == 2705.0);
    assert_eq!(r.failures, Some(0.0));
    assert_eq!(r.resyncs, Some(1.0));
    let rr = r
        .route_resync
        .expect("≤3.28 alias felix_route_table_list_seconds");
    assert_eq!(rr.count, 384.0);
    assert_eq!(r.process_start, Some(1.63197657029e9));
    assert_eq!(r.apply_p99_seconds, Some(0.020209542));
}

#[test]
fn cilium_fixture_reads_total_regeneration_time_and_zero_failures() {
    let b = builtin_profiles();
    let p = find(&b, CILIUM_AGENT).expect("cilium");
    let text = fixture("cilium-1.11.0.prom");
    let r = read_page(p, "fixture", &text).expect("reading");
    let page = expo::parse(&text).expect("parse");
    let want = page
        .family("cilium_endpoint_regeneration_time_stats_seconds")
        .and_then(|f| f.sum_count(&[("scope", "total")]))
        .expect("total scope");
    let a = r.apply.expect("apply");
    assert_eq!((a.sum, a.count), want);
    assert_eq!(r.failures, Some(0.0), "no outcome=fail series yet = 0");
    assert_eq!(r.process_start, Some(1.64011992031e9));
}

#[test]
fn kube_proxy_fixture_reads_the_sync_histogram() {
    let b = builtin_profiles();
    let p = find(&b, KUBE_PROXY).expect("kube-proxy");
    let r = read_page(p, "fixture", &fixture("kube-proxy-1.21.1.prom")).expect("reading");
    let a = r
        .apply
        .expect("kubeproxy_sync_proxy_rules_duration_seconds");
    assert!(a.count > 0.0 && a.sum > 0.0);
    assert_eq!(r.failures, Some(0.0));
    assert_eq!(r.process_start, Some(1.6414957951e9));
}

#[test]
fn a_page_without_the_profiles_metrics_is_bad_metrics() {
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let e = read_page(p, "u", &fixture("kube-proxy-1.21.1.prom")).expect_err("no felix metrics");
    assert_eq!(e.signal(), Signal::AgentBadMetrics);
    assert_eq!(e.reason(), "no_signal_metrics");
}

// ---- loopback HTTP ----------------------------------------------------------------

/// How the loopback server answers.
#[derive(Clone)]
enum Serve {
    Page(Arc<Mutex<String>>),
    Stall,
    Huge(usize),
    /// This status code with this body.
    Status(u16, String),
}

/// Serves `how` on 127.0.0.1 (each request; HTTP/1.1, `Connection: close`), recording
/// the `Accept` headers it saw. Returns the port.
async fn serve(how: Serve, accepts: Arc<Mutex<Vec<String>>>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let how = how.clone();
            let accepts = accepts.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let req = String::from_utf8_lossy(&got).to_string();
                if let Some(first) = req.lines().next() {
                    accepts.lock().expect("lock").push(first.to_owned());
                }
                if let Some(a) = req.lines().find_map(|l| {
                    l.strip_prefix("accept: ")
                        .or_else(|| l.strip_prefix("Accept: "))
                }) {
                    accepts.lock().expect("lock").push(a.to_owned());
                }
                let (code, body) = match &how {
                    Serve::Page(p) => (200, p.lock().expect("lock").clone()),
                    Serve::Stall => {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        return;
                    }
                    Serve::Huge(n) => (200, "# x\n".repeat(n / 4 + 1)),
                    Serve::Status(c, b) => (*c, b.clone()),
                };
                let head = format!(
                    "HTTP/1.1 {code} X\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    port
}

fn felix_page(f: &Felix) -> String {
    format!(
        "# HELP felix_int_dataplane_apply_time_seconds Time in seconds for each dataplane update.\n\
         # TYPE felix_int_dataplane_apply_time_seconds summary\n\
         felix_int_dataplane_apply_time_seconds{{quantile=\"0.5\"}} NaN\n\
         felix_int_dataplane_apply_time_seconds_sum {}\n\
         felix_int_dataplane_apply_time_seconds_count {}\n\
         # TYPE felix_int_dataplane_failures counter\n\
         felix_int_dataplane_failures {}\n\
         # TYPE felix_resyncs_started counter\n\
         felix_resyncs_started {}\n\
         # TYPE process_start_time_seconds gauge\n\
         process_start_time_seconds {}\n",
        f.sum, f.count, f.failures, f.resyncs, f.start
    )
}

const T: Duration = Duration::from_millis(500);

#[tokio::test]
async fn direct_scrape_reads_the_page_and_sends_the_text_accept_header() {
    let accepts = Arc::new(Mutex::new(Vec::new()));
    let page = Arc::new(Mutex::new(fixture("felix-3.20-1.prom")));
    let port = serve(Serve::Page(page), accepts.clone()).await;
    let body = fetch_direct("127.0.0.1", port, "/metrics", T, 1 << 20)
        .await
        .expect("body");
    assert!(body.contains("felix_int_dataplane_apply_time_seconds_count 2705"));
    assert_eq!(
        accepts.lock().expect("lock").as_slice(),
        ["GET /metrics HTTP/1.1", "text/plain;version=0.0.4"]
    );
}

#[tokio::test]
async fn a_stalled_agent_times_out_as_unreachable() {
    let port = serve(Serve::Stall, Arc::default()).await;
    let started = std::time::Instant::now();
    let e = fetch_direct("127.0.0.1", port, "/metrics", T, 1 << 20)
        .await
        .expect_err("timeout");
    assert!(matches!(e, ScrapeError::Timeout { .. }), "{e}");
    assert_eq!(e.signal(), Signal::AgentUnreachable);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_page_over_the_size_limit_is_bad_metrics() {
    let port = serve(Serve::Huge(200_000), Arc::default()).await;
    let e = fetch_direct("127.0.0.1", port, "/metrics", T, 100_000)
        .await
        .expect_err("too large");
    assert!(
        matches!(e, ScrapeError::TooLarge { limit: 100_000, .. }),
        "{e}"
    );
    assert_eq!(e.signal(), Signal::AgentBadMetrics);
}

#[tokio::test]
async fn a_refused_port_is_a_connect_error_unreachable() {
    // Bind then drop: the port is (almost surely) closed now.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    let e = fetch_direct("127.0.0.1", port, "/metrics", T, 1 << 20)
        .await
        .expect_err("refused");
    assert!(
        matches!(e, ScrapeError::Connect { refused: true, .. }),
        "{e}"
    );
    assert_eq!(e.reason(), "refused");
    assert_eq!(e.signal(), Signal::AgentUnreachable);
}

fn target(node: &str, port: u16) -> AgentTarget {
    AgentTarget {
        profile: CALICO_FELIX.into(),
        node: node.into(),
        namespace: "kube-system".into(),
        pod: format!("calico-node-{node}"),
        uid: format!("uid-{node}"),
        restart_count: 0,
        host_ip: Some("127.0.0.1".into()),
        port: Some(port),
        ready: true,
        terminating: false,
        started_ms: None,
    }
}

#[tokio::test]
async fn garbage_page_is_agent_bad_metrics_through_the_scraper() {
    let page = Arc::new(Mutex::new("<html>metrics are {broken\n".to_owned()));
    let port = serve(Serve::Page(page), Arc::default()).await;
    let s = Scraper::new(
        None,
        ScrapeSettings {
            mode: ScrapeMode::Direct,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let e = s.scrape(&target("n1", port), p).await.expect_err("garbage");
    assert!(matches!(e, ScrapeError::Parse { .. }), "{e}");
    assert_eq!(e.signal(), Signal::AgentBadMetrics);
}

#[tokio::test]
async fn watcher_names_the_slow_node_and_warns_about_the_unreachable_one() {
    let nodes = ["n1", "n2", "n3", "n4"];
    let mut felix: BTreeMap<&str, Felix> = nodes.iter().map(|n| (*n, Felix::new())).collect();
    let mut pages = BTreeMap::new();
    let mut idx = AgentIndex::default();
    for n in &nodes[..3] {
        let p = Arc::new(Mutex::new(felix_page(&felix[n])));
        let port = serve(Serve::Page(p.clone()), Arc::default()).await;
        pages.insert(*n, p);
        idx.apply(target(n, port));
    }
    // n4's agent exists but nothing listens on its port.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    idx.apply(target("n4", closed));
    let settings = ScrapeSettings {
        mode: ScrapeMode::Direct,
        timeout: T,
        sweep_batch: 0,
        hot_interval: Duration::from_secs(3600),
        ..ScrapeSettings::default()
    };
    let w = AgentWatcher::with_index(
        None,
        builtin_profiles(),
        settings,
        Params::default(),
        Arc::new(RwLock::new(idx)),
    );
    let publish = |felix: &BTreeMap<&str, Felix>| {
        for (n, p) in &pages {
            *p.lock().expect("lock") = felix_page(&felix[n]);
        }
    };
    // Some history on every node, so there is a cluster baseline.
    w.prime(&nodes.map(String::from)).await;
    for f in felix.values_mut() {
        f.step(4.0, 0.002, 0.0);
    }
    publish(&felix);
    w.prime(&nodes.map(String::from)).await;

    let win = w.probe_started("n1", "n2").await;
    for (n, f) in felix.iter_mut() {
        f.step(3.0, if *n == "n2" { 1.5 } else { 0.002 }, 0.0);
    }
    publish(&felix);
    let got = w.probe_finished(win, ProbeResult::Slow).await;
    assert_eq!(got.suspects.len(), 1, "{:?}", got.suspects);
    let s = &got.suspects[0];
    assert_eq!(
        (s.node.as_str(), s.role, s.signal),
        ("n2", Role::Target, Signal::DataplaneApplySlow)
    );
    assert!(
        (num(s, "apply_mean_seconds") - 1.5).abs() < 1e-6,
        "{}",
        s.evidence
    );
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);

    let win = w.probe_started("n3", "n4").await;
    let got = w.probe_finished(win, ProbeResult::Success).await;
    assert!(got.suspects.is_empty());
    assert_eq!(got.warnings.len(), 1, "{:?}", got.warnings);
    assert_eq!(
        (got.warnings[0].node.as_str(), got.warnings[0].signal),
        ("n4", Signal::AgentUnreachable)
    );
    let counts = w.scrape_counts();
    assert!(
        counts
            .get(&(CALICO_FELIX.to_owned(), "refused".to_owned()))
            .copied()
            .unwrap_or(0)
            >= 1
    );
    assert!(
        counts
            .get(&(CALICO_FELIX.to_owned(), "ok".to_owned()))
            .copied()
            .unwrap_or(0)
            >= 6
    );
}

#[tokio::test]
async fn auto_mode_falls_back_to_the_api_server_proxy_and_remembers_it() {
    // The "API server": answers the pod-proxy path with a Felix page.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let page = Arc::new(Mutex::new(felix_page(&Felix::new())));
    let api_port = serve(Serve::Page(page), seen.clone()).await;
    let cfg = kube::Config::new(format!("http://127.0.0.1:{api_port}").parse().expect("uri"));
    let client = kube::Client::try_from(cfg).expect("client");
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    let s = Scraper::new(
        Some(client),
        ScrapeSettings {
            mode: ScrapeMode::Auto,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let t = target("n1", closed);
    assert!(!s.uses_proxy("n1", CALICO_FELIX));
    let r = s.scrape(&t, p).await.expect("via proxy");
    assert_eq!(r.apply.map(|a| a.count), Some(100.0));
    assert!(s.uses_proxy("n1", CALICO_FELIX));
    let seen = seen.lock().expect("lock").clone();
    assert!(
        seen.contains(&format!(
            "GET /api/v1/namespaces/kube-system/pods/calico-node-n1:{closed}/proxy/metrics HTTP/1.1"
        )),
        "{seen:?}"
    );
    assert!(
        seen.contains(&"text/plain;version=0.0.4".to_owned()),
        "{seen:?}"
    );
}

/// An "API server" answering every request with `code` and a Status body, as when its
/// pod proxy cannot reach the agent's port. Returns a client without kube's retry layer
/// ([`no_retry_client`], as the prober's scrapes use) and the number of requests seen.
async fn failing_api(code: u16) -> (kube::Client, Arc<AtomicUsize>) {
    let (cfg, n) = failing_api_config(code).await;
    (no_retry_client(cfg).expect("client"), n)
}

async fn failing_api_config(code: u16) -> (kube::Config, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                seen.fetch_add(1, Ordering::SeqCst);
                let body = format!(
                    r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"error trying to reach service: dial tcp 10.0.0.2:10249: connect: connection refused","reason":"ServiceUnavailable","code":{code}}}"#
                );
                let head = format!(
                    "HTTP/1.1 {code} Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    let cfg = kube::Config::new(format!("http://127.0.0.1:{port}").parse().expect("uri"));
    (cfg, requests)
}

#[tokio::test]
async fn proxy_error_status_is_unreachable_within_the_timeout() {
    let b = builtin_profiles();
    let p = find(&b, KUBE_PROXY).expect("kube-proxy");
    let mut t = target("n1", 10249);
    t.profile = KUBE_PROXY.into();
    let s = Scraper::new(
        Some(failing_api(502).await.0),
        ScrapeSettings {
            mode: ScrapeMode::Proxy,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let e = s.scrape(&t, p).await.expect_err("502");
    assert!(matches!(e, ScrapeError::Status { status: 502, .. }), "{e}");
    assert_eq!(e.signal(), Signal::AgentUnreachable);
}

#[tokio::test]
async fn a_503_connection_refused_through_the_proxy_is_one_request_and_says_refused() {
    let b = builtin_profiles();
    let p = find(&b, KUBE_PROXY).expect("kube-proxy");
    let mut t = target("n1", 10249);
    t.profile = KUBE_PROXY.into();
    let (client, requests) = failing_api(503).await;
    let s = Scraper::new(
        Some(client),
        ScrapeSettings {
            mode: ScrapeMode::Proxy,
            timeout: Duration::from_secs(2),
            ..ScrapeSettings::default()
        },
    );
    let started = std::time::Instant::now();
    let e = s.scrape(&t, p).await.expect_err("503");
    assert!(matches!(e, ScrapeError::Status { status: 503, .. }), "{e}");
    assert_eq!(e.reason(), "refused", "{e}");
    assert_eq!(e.signal(), Signal::AgentUnreachable);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "one attempt, no retries"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // The agent refused: the profile's hint (how to expose the metrics) is attached.
    let f = e.failure(p);
    assert!(f.message.contains("metricsBindAddress"), "{}", f.message);
}

#[test]
fn a_503_relaying_the_os_refusal_text_is_refused_too() {
    // kube-apiserver relays Go's "connect: connection refused"; other API servers (the
    // testbed's) the OS text.
    for message in [
        "error trying to reach service: dial tcp 10.0.0.2:10249: connect: connection refused",
        "error trying to reach service: 10.0.0.2:10249: Connection refused (os error 111)",
    ] {
        let e = ScrapeError::Status {
            url: "/api/v1/namespaces/kube-system/pods/kube-proxy-x:10249/proxy/metrics".into(),
            status: 503,
            message: message.into(),
            proxy: true,
        };
        assert_eq!(e.reason(), "refused", "{message}");
    }
    let e = ScrapeError::Status {
        url: "/x".into(),
        status: 503,
        message: "the server is currently unable to handle the request".into(),
        proxy: true,
    };
    assert_eq!(e.reason(), "http_status");
}

#[tokio::test]
async fn kube_default_retry_would_turn_the_503_into_many_requests() {
    // The control for the test above: the same API server with kube's default client.
    let (cfg, requests) = failing_api_config(503).await;
    let client = kube::Client::try_from(cfg).expect("client");
    let b = builtin_profiles();
    let p = find(&b, KUBE_PROXY).expect("kube-proxy");
    let mut t = target("n1", 10249);
    t.profile = KUBE_PROXY.into();
    let s = Scraper::new(
        Some(client),
        ScrapeSettings {
            mode: ScrapeMode::Proxy,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let e = s.scrape(&t, p).await.expect_err("503");
    assert_eq!(e.reason(), "timeout", "{e}");
    assert!(requests.load(Ordering::SeqCst) > 1);
}

#[tokio::test]
async fn a_403_from_the_pod_proxy_names_the_rbac_needed_and_not_the_metrics_hint() {
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let s = Scraper::new(
        Some(failing_api(403).await.0),
        ScrapeSettings {
            mode: ScrapeMode::Proxy,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let e = s.scrape(&target("n1", 9091), p).await.expect_err("403");
    let f = e.failure(p);
    assert!(
        f.message.contains(
            "needs `get` on `pods/proxy` in the agents' namespaces (calico-system, kube-system)"
        ),
        "{}",
        f.message
    );
    assert!(
        !f.message.contains("prometheusMetricsEnabled"),
        "{}",
        f.message
    );
}

#[tokio::test]
async fn timeouts_and_404_get_no_metrics_are_off_hint_but_refusals_do() {
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let hint = "prometheusMetricsEnabled";
    let stalled = serve(Serve::Stall, Arc::default()).await;
    let e = fetch_direct("127.0.0.1", stalled, "/metrics", T, 1 << 20)
        .await
        .expect_err("timeout");
    assert!(!e.failure(p).message.contains(hint), "{e}");
    let not_found = serve(Serve::Status(404, "nope".into()), Arc::default()).await;
    let e = fetch_direct("127.0.0.1", not_found, "/metrics", T, 1 << 20)
        .await
        .expect_err("404");
    assert!(matches!(e, ScrapeError::Status { status: 404, .. }), "{e}");
    assert!(!e.failure(p).message.contains(hint), "{e}");
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    let e = fetch_direct("127.0.0.1", closed, "/metrics", T, 1 << 20)
        .await
        .expect_err("refused");
    assert!(e.failure(p).message.contains(hint), "{e}");
}

#[tokio::test]
async fn an_html_error_page_becomes_one_bounded_line_in_the_evidence() {
    let page = format!(
        "<html>\n<head><title>404 Not Found</title></head>\n<body>\n{}\n</body>\n</html>\n",
        "<p>nothing here</p>\n".repeat(50)
    );
    let port = serve(Serve::Status(404, page), Arc::default()).await;
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let e = fetch_direct("127.0.0.1", port, "/metrics", T, 1 << 20)
        .await
        .expect_err("404");
    let m = e.failure(p).message;
    assert!(!m.contains('\n') && !m.contains('\r'), "{m}");
    assert!(m.chars().count() <= 201, "{} chars: {m}", m.chars().count());
    assert!(m.ends_with('…'), "{m}");
    assert!(
        m.contains("HTTP 404: <html> <head><title>404 Not Found"),
        "{m}"
    );
}

#[tokio::test]
async fn auto_falls_back_on_a_direct_404_and_does_not_try_direct_again() {
    // Something else answers 404 at the node IP; the API server proxy has the page.
    let direct_seen = Arc::new(Mutex::new(Vec::new()));
    let direct = serve(
        Serve::Status(404, "404 page not found\n".into()),
        direct_seen.clone(),
    )
    .await;
    let api_seen = Arc::new(Mutex::new(Vec::new()));
    let page = Arc::new(Mutex::new(felix_page(&Felix::new())));
    let api_port = serve(Serve::Page(page), api_seen.clone()).await;
    let cfg = kube::Config::new(format!("http://127.0.0.1:{api_port}").parse().expect("uri"));
    let s = Scraper::new(
        Some(no_retry_client(cfg).expect("client")),
        ScrapeSettings {
            mode: ScrapeMode::Auto,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let t = target("n1", direct);
    for _ in 0..3 {
        let (path, r) = s.scrape_via(&t, p).await;
        assert_eq!(path, Some("proxy"));
        assert_eq!(r.expect("via proxy").apply.map(|a| a.count), Some(100.0));
    }
    let direct_requests = direct_seen
        .lock()
        .expect("lock")
        .iter()
        .filter(|l| l.starts_with("GET "))
        .count();
    assert_eq!(direct_requests, 1, "direct tried once, then remembered");
    assert!(s.uses_proxy("n1", CALICO_FELIX));
}

#[tokio::test]
async fn auto_does_not_fall_back_when_the_agent_page_itself_is_bad() {
    let page = Arc::new(Mutex::new("<html>metrics are {broken\n".to_owned()));
    let direct = serve(Serve::Page(page), Arc::default()).await;
    let (client, api_requests) = failing_api(503).await;
    let s = Scraper::new(
        Some(client),
        ScrapeSettings {
            mode: ScrapeMode::Auto,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    let (path, r) = s.scrape_via(&target("n1", direct), p).await;
    assert_eq!(path, Some("direct"));
    assert!(matches!(r, Err(ScrapeError::Parse { .. })), "{r:?}");
    assert_eq!(api_requests.load(Ordering::SeqCst), 0);
    assert!(!s.uses_proxy("n1", CALICO_FELIX));
}

#[tokio::test]
async fn an_unresolved_port_names_every_rule_tried() {
    let yaml = "profiles:\n  - name: mine\n    selector: app=mine\n    namespaces: [n]\n    port: [{container_port_name: nosuchport}, {env: MY_PORT}, {annotation: prometheus.io/port}]\n";
    let profiles = prober::agents::profiles::parse_profiles(yaml, "t.yaml").expect("valid");
    let p = find(&profiles, "mine").expect("mine");
    let mut t = target("n1", 1);
    t.port = None;
    t.profile = "mine".into();
    let s = Scraper::new(None, ScrapeSettings::default());
    let e = s.scrape(&t, p).await.expect_err("no port");
    assert_eq!(e.reason(), "no_address");
    assert_eq!(
        e.to_string(),
        "agent pod kube-system/calico-node-n1: no address (no metrics port: no container port named \"nosuchport\", no env MY_PORT with a port number, no annotation prometheus.io/port with a port number)"
    );
}

/// Smoke test against a live cluster (the testbed): run under `testbed exec` with
/// `FP_AGENT_SMOKE_NODES=node-1,node-2,node-3` and `--ignored`. Discovers the
/// calico-node pods, scrapes them directly and through the API-server proxy, and checks
/// that a healthy cluster gives no finding.
#[tokio::test]
#[ignore = "needs a cluster: run under `testbed exec`"]
async fn live_cluster_smoke() {
    let nodes: Vec<String> = std::env::var("FP_AGENT_SMOKE_NODES")
        .expect("FP_AGENT_SMOKE_NODES")
        .split(',')
        .map(String::from)
        .collect();
    for mode in [ScrapeMode::Direct, ScrapeMode::Proxy] {
        let client = kube::Client::try_default().await.expect("client");
        let w = AgentWatcher::start(
            client,
            builtin_profiles(),
            ScrapeSettings {
                mode,
                ..ScrapeSettings::default()
            },
            Params::default(),
        );
        let synced = w.wait_synced(Duration::from_secs(10)).await;
        let agents = w.index().read().map(|i| i.all()).unwrap_or_default();
        eprintln!("{mode:?}: synced={synced} agents={agents:#?}");
        for n in &nodes {
            assert!(
                agents
                    .iter()
                    .any(|a| &a.node == n && a.profile == CALICO_FELIX),
                "{n}"
            );
        }
        w.prime(&nodes).await;
        let win = w.probe_started(&nodes[0], &nodes[1]).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let got = w.probe_finished(win, ProbeResult::Success).await;
        eprintln!("{mode:?}: counts={:?} findings={got:?}", w.scrape_counts());
        let ok = w
            .scrape_counts()
            .get(&(CALICO_FELIX.to_owned(), "ok".to_owned()))
            .copied()
            .unwrap_or(0);
        assert!(
            ok >= nodes.len() as u64 + 4,
            "{mode:?}: {:?}",
            w.scrape_counts()
        );
        // Pods that are not Ready (hand-made ones) may add `agent_not_ready`; nothing else.
        let not_ready = agents.iter().any(|a| !a.ready);
        assert!(got.suspects.is_empty(), "{got:?}");
        assert!(
            got.warnings
                .iter()
                .all(|w| not_ready && w.signal == Signal::AgentNotReady),
            "{got:?}"
        );
    }
}

/// S2 / S5 against the testbed's simulated Felix, agents only (no probe pods): run
/// under `testbed exec` on a cluster up with the scenario's fault, with
/// `FP_AGENT_SMOKE_NODES` (all nodes), `FP_AGENT_SLOW_NODES` (the faulty ones) and
/// `FP_AGENT_SIGNAL` (`dataplane_apply_slow` for S2, `dataplane_apply_failures` for S5).
#[tokio::test]
#[ignore = "needs a testbed with a fault: run under `testbed exec`"]
async fn live_cluster_names_the_faulty_nodes() {
    let list = |k: &str| -> Vec<String> {
        std::env::var(k)
            .unwrap_or_else(|_| panic!("{k}"))
            .split(',')
            .map(String::from)
            .collect()
    };
    let (nodes, slow) = (list("FP_AGENT_SMOKE_NODES"), list("FP_AGENT_SLOW_NODES"));
    let signal: Signal = serde_json::from_value(serde_json::Value::String(
        std::env::var("FP_AGENT_SIGNAL").unwrap_or_else(|_| "dataplane_apply_slow".into()),
    ))
    .expect("FP_AGENT_SIGNAL is a signal name");
    let client = kube::Client::try_default().await.expect("client");
    let w = AgentWatcher::start(
        client,
        builtin_profiles(),
        ScrapeSettings::default(),
        Params::default(),
    );
    assert!(w.wait_synced(Duration::from_secs(10)).await);
    w.prime(&nodes).await;
    let mut findings = Vec::new();
    for pair in nodes.windows(2) {
        let win = w.probe_started(&pair[0], &pair[1]).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let got = w.probe_finished(win, ProbeResult::Slow).await;
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
        findings.extend(got.suspects);
    }
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&findings).unwrap_or_default()
    );
    let want: BTreeSet<String> = slow.into_iter().collect();
    assert_eq!(flagged(&findings, signal), want);
    assert!(findings.iter().all(|s| s.signal == signal));
}

#[test]
fn the_start_up_reference_sample_is_bounded_and_spread_over_the_nodes() {
    let nodes: Vec<String> = (0..1000).map(|i| format!("n{i:04}")).collect();
    let s = reference_sample(&nodes, 16);
    assert_eq!(s.len(), 16);
    assert_eq!(s[0], "n0000");
    assert_eq!(s[1], "n0062");
    assert_eq!(s[15], "n0937");
    assert_eq!(reference_sample(&nodes[..5], 16), nodes[..5].to_vec());
    assert!(reference_sample(&nodes, 0).is_empty());
}

/// A port where nothing listens (connection refused at once).
async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test]
async fn auto_mode_sends_a_profile_to_the_proxy_once_direct_failed_on_three_nodes() {
    let closed = closed_port().await;
    let s = Scraper::new(
        None,
        ScrapeSettings {
            mode: ScrapeMode::Auto,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    for (i, n) in ["n1", "n2", "n3"].iter().enumerate() {
        assert!(!s.profile_uses_proxy(CALICO_FELIX), "after {i} nodes");
        let _ = s.scrape(&target(n, closed), p).await;
    }
    assert!(s.profile_uses_proxy(CALICO_FELIX));
    // Every node of the profile, including ones never scraped.
    assert!(s.uses_proxy("n999", CALICO_FELIX));
    assert!(!s.profile_uses_proxy(KUBE_PROXY));
}

#[tokio::test]
async fn a_profile_whose_direct_path_worked_once_stays_direct_per_node() {
    let page = Arc::new(Mutex::new(felix_page(&Felix::new())));
    let open = serve(Serve::Page(page), Arc::default()).await;
    let closed = closed_port().await;
    let s = Scraper::new(
        None,
        ScrapeSettings {
            mode: ScrapeMode::Auto,
            timeout: T,
            ..ScrapeSettings::default()
        },
    );
    let b = builtin_profiles();
    let p = find(&b, CALICO_FELIX).expect("felix");
    s.scrape(&target("n0", open), p).await.expect("n0 answers");
    for n in ["n1", "n2", "n3", "n4"] {
        let _ = s.scrape(&target(n, closed), p).await;
    }
    assert!(!s.profile_uses_proxy(CALICO_FELIX));
}

/// The times (s) of node-1's Felix ring, oldest first.
fn felix_times(h: &History) -> Vec<f64> {
    h.ring("node-1", CALICO_FELIX)
        .expect("ring")
        .iter()
        .map(|o| o.at)
        .collect()
}

#[test]
fn a_full_ring_keeps_time_order_drops_the_oldest_and_shares_equal_names() {
    let f = Felix::new();
    let mut h = History::new(2);
    h.push(obs("node-1", 10.0, &f));
    h.push(obs("node-1", 20.0, &f));
    // Older than everything a full ring holds: not kept.
    h.push(obs("node-1", 5.0, &f));
    assert_eq!(felix_times(&h), vec![10.0, 20.0]);
    // Between the two: the oldest goes, order holds.
    h.push(obs("node-1", 15.0, &f));
    assert_eq!(felix_times(&h), vec![15.0, 20.0]);
    h.push(obs("node-1", 30.0, &f));
    assert_eq!(felix_times(&h), vec![20.0, 30.0]);
    let ring = h.ring("node-1", CALICO_FELIX).expect("ring");
    let (a, b) = (&ring[0], &ring[1]);
    assert!(
        std::sync::Arc::ptr_eq(&a.pod, &b.pod) && std::sync::Arc::ptr_eq(&a.uid, &b.uid),
        "equal names are one allocation"
    );
}

#[test]
fn observations_past_the_horizon_go_but_the_newest_stays() {
    let f = Felix::new();
    let mut h = History::new(DEFAULT_RING);
    for i in 0..DEFAULT_RING {
        h.push(obs("node-1", i as f64, &f));
    }
    // Within the horizon of the newest: all kept.
    h.push(obs("node-1", 10.0 + HORIZON_SECONDS, &f));
    assert_eq!(felix_times(&h).first(), Some(&10.0));
    // Past it: only the newest, and the ring's slots shrink with it.
    let late = 100.0 + 2.0 * HORIZON_SECONDS;
    h.push(obs("node-1", late, &f));
    assert_eq!(felix_times(&h), vec![late]);
    assert!(h.ring("node-1", CALICO_FELIX).expect("ring").capacity() <= 2);
    // A ring alone in its node is never emptied by the horizon.
    h.push(obs("node-2", 0.0, &f));
    assert_eq!(h.ring("node-2", CALICO_FELIX).map(|r| r.len()), Some(1));
}
