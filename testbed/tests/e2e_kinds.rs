//! End-to-end: the probe kinds of `prober gate --kinds …` (issue 5) against a real
//! testbed, with the faults of docs/scenarios.md. Each test has its own testbed; the tests of
//! this binary run one at a time (docs/design.md §5 "Isolation"). Timing checks compare with the
//! testbed's ground truth or with what the gate would take without the behaviour under
//! test, never with wall-clock guesses alone.

mod common;

use common::{assert_ttfp_near_truth, validate, Testbed, POD_GONE_TIMEOUT, SERIAL};
use serde_json::Value;
use testbed::truth::{truth_service_ttfp, TruthKind};

/// API-write budget per probe kind (prober `probe` module docs; docs/design.md §7).
fn budget(kind: &str, burst_size: u64) -> u64 {
    match kind {
        "cross_node" | "same_node" => 4,
        "recreate" | "service" => 6,
        "burst" => 4 + 2 * burst_size,
        other => panic!("unexpected kind {other}"),
    }
}

fn probes(report: &Value) -> &Vec<Value> {
    report["probes"].as_array().expect("probes array")
}

fn of_kind<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    probes(report)
        .iter()
        .filter(|p| p["kind"] == kind)
        .collect()
}

#[test]
fn s4_cross_node_broken_is_diagnosed_against_same_node_and_the_gate_stops_early() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fault = common::fault_file("s4-cross-node.yaml");
    let tb = Testbed::up("s4kinds", 6, &fault, &[]);
    let give_up = 20.0;
    let (code, report, out) = tb.gate(&[
        "--kinds",
        "same_node,cross_node",
        "--concurrency",
        "2",
        "--give-up",
        "20s",
        "--hold",
        "1s",
    ]);
    validate(&report);
    assert_eq!(code, 1, "{out}");
    assert_eq!(report["summary"]["diagnosis"], "cross_node_broken", "{out}");
    assert_s4_headline(&report, &out);
    let stopped = |p: &Value| {
        p["reason"] == "interrupted" && p["detail"].as_str().unwrap_or("").contains("stopped early")
    };
    let same = of_kind(&report, "same_node");
    assert_eq!(same.len(), 6, "every planned control has a record: {out}");
    // Controls that ran passed; those not started when the gate stopped early are
    // recorded as such. The stop needs a passing control.
    assert!(
        same.iter().all(|p| p["result"] == "success" || stopped(p)),
        "{out}"
    );
    assert!(same.iter().any(|p| p["result"] == "success"), "{out}");
    let cross = of_kind(&report, "cross_node");
    assert_eq!(cross.len(), 6, "every planned pair has a record: {out}");
    let failed = cross.iter().filter(|p| p["result"] == "failed").count();
    assert!(failed >= 2, "{out}");
    for p in &cross {
        assert_ne!(p["result"], "success", "{out}");
        if p["result"] == "failed" {
            assert_eq!(p["reason"], "no_success_before_give_up", "{out}");
        } else {
            assert!(stopped(p), "{out}");
        }
    }
    assert!(report["stopped_early"].is_string(), "{out}");
    let at = |v: &Value| {
        humantime::parse_rfc3339_weak(v.as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("timestamp {v}: {e}"))
    };
    // The first control and the first cross-node pair start together (one slot each),
    // so the evidence of the early stop is there after about one give-up period.
    let first_start = |kind: &str| {
        of_kind(&report, kind)
            .into_iter()
            .filter(|p| !stopped(p))
            .map(|p| at(&p["timeline"]["started_at"]))
            .min()
            .unwrap_or_else(|| panic!("no {kind} probe ran\n{out}"))
    };
    let (s0, c0) = (first_start("same_node"), first_start("cross_node"));
    let apart = match c0.duration_since(s0) {
        Ok(d) => d,
        Err(e) => e.duration(),
    };
    assert!(
        apart.as_secs_f64() < 1.0,
        "first control and first cross-node pair started {apart:?} apart\n{out}"
    );
    // 6 nodes at concurrency 2 with a 20 s give-up: with the controls all first this
    // took two give-up periods (40 s); now one give-up period plus one control and the
    // start-up.
    let duration = report["duration_seconds"]
        .as_f64()
        .expect("duration_seconds");
    eprintln!("S4, 6 nodes, --concurrency 2, --give-up 20s: duration_seconds {duration:.1}");
    assert!(
        duration <= 35.0,
        "duration_seconds {duration:.1} > 35 (give-up {give_up}s)\n{out}"
    );
    for p in probes(&report) {
        let kind = p["kind"].as_str().unwrap();
        assert!(
            p["api_writes"].as_u64().unwrap() <= budget(kind, 0),
            "{p:#}"
        );
    }
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(
        left.is_empty(),
        "probe pods left behind after {POD_GONE_TIMEOUT:?}: {left:?}"
    );
}

/// The S4 text output leads with the cross-node kind, its failures and how many of its
/// probes have no TTFP (all of them: none passed), before the same-node controls whose
/// TTFPs would otherwise be the only ones shown.
fn assert_s4_headline(report: &Value, out: &str) {
    let lines: Vec<&str> = out.lines().collect();
    let at = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting {prefix:?}:\n{out}"))
    };
    let (cross, same, all) = (
        at("cross_node: "),
        at("same_node (control): "),
        at("all kinds: "),
    );
    assert!(cross < same && same < all, "{out}");
    let probes = of_kind(report, "cross_node");
    let failed = probes.iter().filter(|p| p["result"] == "failed").count();
    let line = lines[cross];
    assert!(
        line.contains(&format!("failed {failed},")),
        "headline must give the cross-node failures: {line}"
    );
    assert!(
        line.contains(&format!("; {} without a TTFP; TTFP p50 -", probes.len())),
        "headline must say no cross-node probe has a TTFP: {line}"
    );
    // The table's last row, or the line under it that stands for the probes the early
    // stop interrupted (they are not rows).
    assert!(
        lines[cross - 1].is_empty()
            && (lines[cross - 2].starts_with("same_node ")
                || lines[cross - 2].starts_with("… and ")
                    && lines[cross - 2].contains("interrupted by the early stop")),
        "the cross-node line is the first after the probe table:\n{out}"
    );
}

const QUEUE_FAULT: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [100ms, 300ms]}
  - nodes: {names: [node-2]}
    program_delay: 0s
    queue: {per_endpoint: 2s}
";

#[test]
fn burst_ttfp_grows_with_the_fillers_queued_ahead_of_the_target() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("burst", 3, QUEUE_FAULT, &[]);
    let k = 3u64;
    let (_, report, out) = tb.gate(&[
        "--kinds",
        "burst,cross_node",
        "--burst-size",
        "3",
        "--hold",
        "1s",
        "--slow-threshold",
        "30s",
        "--max-ttfp",
        "30s",
        "--seed",
        "3",
        // One probe at a time: node-2's queue then holds only this probe's pods.
        "--concurrency",
        "1",
    ]);
    validate(&report);
    let truth = tb.truth();
    let mut burst_on_node2 = 0;
    for p in probes(&report) {
        let kind = p["kind"].as_str().unwrap();
        assert_eq!(p["result"], "success", "{p:#}\n{out}");
        assert!(
            p["api_writes"].as_u64().unwrap() <= budget(kind, k),
            "{p:#}"
        );
        let ttfp = assert_ttfp_near_truth(&truth, p, &out);
        if kind == "burst" && p["target"]["node"] == "node-2" {
            burst_on_node2 += 1;
            assert_eq!(p["burst"]["fillers_created"], k, "{p:#}");
            // The queue, by the ground truth: node-2 programs one endpoint per 2 s, so
            // the target waits behind every filler of its probe added before it, then
            // itself (its TTFP was checked against the truth above).
            let pid = p["id"].as_str().unwrap();
            let at = |kind: TruthKind, uid: &str| {
                truth
                    .iter()
                    .find(|e| e.event == kind && e.uid.as_deref() == Some(uid))
                    .map(|e| e.t)
            };
            let uid = p["target"]["uid"].as_str().unwrap();
            let added = at(TruthKind::EndpointAdded, uid).expect("target endpoint_added");
            let programmed =
                at(TruthKind::EndpointProgrammed, uid).expect("target endpoint_programmed");
            let ahead = truth
                .iter()
                .filter(|e| {
                    e.event == TruthKind::EndpointAdded
                        && e.t < added
                        && e.pod
                            .as_deref()
                            .is_some_and(|n| n.starts_with(&format!("fp-{pid}-f")))
                })
                .count();
            let wait = programmed - added;
            eprintln!("burst target on node-2: {ahead} filler(s) ahead, programmed {wait:.2}s after its add");
            assert!(
                wait >= 2.0 * (ahead as f64 + 1.0) - 1.0,
                "burst target programmed {wait:.2}s after its add with {ahead} filler(s) queued ahead (TTFP {ttfp:.2}s)\n{out}"
            );
        } else {
            assert!(ttfp < 3.0, "{kind} {p:#} took {ttfp:.2}s\n{out}");
        }
    }
    assert_eq!(burst_on_node2, 1, "{out}");
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(
        left.is_empty(),
        "probe or filler pods left behind after {POD_GONE_TIMEOUT:?}: {left:?}"
    );
}

/// Truth time of the first `kind` event of pod `uid`.
fn truth_at(truth: &[testbed::truth::TruthEvent], kind: TruthKind, uid: &str) -> Option<f64> {
    truth
        .iter()
        .find(|e| e.event == kind && e.uid.as_deref() == Some(uid))
        .map(|e| e.t)
}

/// Whether both endpoints of probe `p` were programmed before its source's
/// `readiness_ok` (truth log): an application starting at Ready met a working path.
fn programmed_before_source_ready(truth: &[testbed::truth::TruthEvent], p: &Value) -> bool {
    let uid = |side: &str| p[side]["uid"].as_str().unwrap_or_default().to_owned();
    let Some(ready) = truth_at(truth, TruthKind::ReadinessOk, &uid("source")) else {
        return false;
    };
    ["source", "target"].iter().all(|side| {
        truth_at(truth, TruthKind::EndpointProgrammed, &uid(side)).is_some_and(|t| t < ready)
    })
}

const S1_PLUS_FCD_ON_NODE_1: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [200ms, 600ms]}
  - nodes: {names: [node-1]}
    first_connections_dropped: 2
";

#[test]
fn first_attempt_failures_count_from_ready_and_first_connections_dropped_show_after_it() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s1 = common::fault_file("s1-healthy.yaml");
    let tb = Testbed::up("fcd", 3, &s1, &[]);
    let args = ["--kinds", "same_node,cross_node", "--hold", "1s"];
    // S1 on an agent that gates readiness (as Calico does): every pod is Ready only once
    // programmed, so both endpoints of every probe were programmed before its source
    // was Ready; the source's attempts that failed before (it dials from its first
    // instant) are pre-Ready failures, never first-attempt failures.
    tb.set_fault(&format!(
        "{s1}  - nodes: {{all: true}}\n    agent: {{gates_readiness: true}}\n"
    ));
    let (code, report, out) = tb.gate(&args);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    for p in probes(&report) {
        assert_eq!(p["result"], "success", "{out}");
        assert!(programmed_before_source_ready(&truth, p), "gated: {p:#}");
        assert_eq!(
            p["first_attempt_failures"], 0,
            "programmed before Ready: {p:#}"
        );
    }
    // S1 on an agent that does not: wherever both endpoints were still programmed
    // before the source was Ready (timing decides), no first-attempt failure either.
    tb.set_fault(&s1);
    let (code, report, out) = tb.gate(&args);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    for p in probes(&report) {
        assert_eq!(p["result"], "success", "{out}");
        if programmed_before_source_ready(&truth, p) {
            assert_eq!(
                p["first_attempt_failures"], 0,
                "programmed before Ready: {p:#}"
            );
        }
    }
    // Where S1's program delay (up to 600 ms) outlasted the source's start, failures
    // after Ready are real first-attempt failures: the success came after Ready.
    let mut with_failures = 0;
    for p in probes(&report) {
        if p["first_attempt_failures"].as_u64().unwrap() > 0 {
            with_failures += 1;
            assert!(p["ttfp_seconds"].as_f64().unwrap() > 0.0, "{p:#}");
        }
    }
    assert_eq!(
        report["summary"]["first_attempt_failures"], with_failures,
        "{out}"
    );

    // The first 2 new connections from or to each new endpoint on node-1 after its
    // budget is armed (right before each readiness probe until the first pass, so that
    // it counts from Ready) are dropped, then it works. Where the drops land is timing:
    // normally on the source's attempts after Ready (first-attempt failures), but when
    // the kubelet's first probe came before the pod listened (seen under CI load: Ready
    // a probe period later, the source's success before it), the budget is spent before
    // Ready. So every node-1 source must carry the armed budget, at least one must show
    // the drops after Ready (the gate runs again, up to 3 times, until one does), and
    // probes touching no node-1 show none.
    tb.set_fault(S1_PLUS_FCD_ON_NODE_1);
    let (mut from_node1, mut with_failures, mut elsewhere) = (0, 0, 0);
    for _ in 0..3 {
        let (code, report, out) = tb.gate(&args);
        validate(&report);
        assert_eq!(
            code, 0,
            "dropped first connections are not a failure: {out}"
        );
        let truth = tb.truth();
        for p in probes(&report) {
            assert_eq!(p["result"], "success", "{out}");
            let fails = p["first_attempt_failures"].as_u64().unwrap();
            let (src, dst) = (&p["source"]["node"], &p["target"]["node"]);
            if src == "node-1" {
                from_node1 += 1;
                if fails > 0 {
                    with_failures += 1;
                }
                let uid = p["source"]["uid"].as_str().unwrap();
                let ready = truth
                    .iter()
                    .find(|e| e.event == TruthKind::ReadinessOk && e.uid.as_deref() == Some(uid))
                    .expect("source readiness_ok");
                assert_eq!(ready.detail["first_connections_dropped"], 2, "{ready:?}");
            } else if src != "node-1" && dst != "node-1" {
                elsewhere += 1;
                if programmed_before_source_ready(&truth, p) {
                    assert_eq!(fails, 0, "touches no node-1: {p:#}");
                }
            }
        }
        if with_failures >= 1 && from_node1 >= 2 && elsewhere >= 2 {
            break;
        }
    }
    assert!(
        with_failures >= 1 && from_node1 >= 2 && elsewhere >= 2,
        "node-1 sources: {from_node1}, {with_failures} of them with first connections dropped after Ready; probes touching no node-1: {elsewhere}"
    );
}

const S1_PLUS_QUEUE_ON_NODE_2: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [200ms, 600ms]}
  - nodes: {names: [node-2]}
    program_delay: 0s
    queue: {per_endpoint: 1500ms}
";

/// Wall-clock span of a probe: `started_at` → `started_at + timeline.finished`.
fn span(p: &Value) -> (f64, f64) {
    let start = humantime::parse_rfc3339_weak(p["timeline"]["started_at"].as_str().unwrap())
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    (
        start,
        start + p["timeline"]["finished"].as_f64().unwrap_or(0.0),
    )
}

/// Burst isolation (about 55 s, in the default run): with a programming queue of
/// 1.5 s per endpoint on node-2 (no program delay there, so endpoints queue in the order
/// they were added), the burst on node-2 is slow and its backlog grows with
/// `--burst-size` (5 vs 10), while the cross-node probes touching node-2 in the same
/// run, which never overlap it, wait behind no filler in node-2's queue (truth) and
/// stay within 1 s of their S1 TTFP plus the queue slots of plain endpoints (2 × 1.5 s).
#[test]
fn burst_backlog_is_its_own_and_the_plain_probes_beside_it_stay_at_their_s1_values() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let s1 = common::fault_file("s1-healthy.yaml");
    let tb = Testbed::up("burstiso", 3, &s1, &[]);
    let common_args = ["--hold", "1s", "--concurrency", "3", "--max-ttfp", "60s"];
    let mut args = vec!["--kinds", "cross_node"];
    args.extend_from_slice(&common_args);
    let (code, s1_report, out) = tb.gate(&args);
    validate(&s1_report);
    assert_eq!(code, 0, "{out}");
    let s1_max = probes(&s1_report)
        .iter()
        .map(|p| p["ttfp_seconds"].as_f64().unwrap())
        .fold(0.0, f64::max);

    tb.set_fault(S1_PLUS_QUEUE_ON_NODE_2);
    let mut drains = Vec::new();
    for k in ["5", "10"] {
        let mut args = vec![
            "--kinds",
            "burst,cross_node",
            "--burst-size",
            k,
            "--slow-threshold",
            "3s",
        ];
        args.extend_from_slice(&common_args);
        let (_, report, out) = tb.gate(&args);
        validate(&report);
        let truth = tb.truth();
        let burst: Vec<&Value> = of_kind(&report, "burst")
            .into_iter()
            .filter(|p| p["target"]["node"] == "node-2")
            .collect();
        assert_eq!(burst.len(), 1, "{out}");
        let b = burst[0];
        assert_ttfp_near_truth(&truth, b, &out);
        let drain = b["burst"]["backlog_drain_seconds"].as_f64().expect("drain");
        // The node programs one endpoint per 1.5 s: the target waited behind every
        // filler added before it (truth), then itself.
        let uid = b["target"]["uid"].as_str().unwrap();
        let pid = b["id"].as_str().unwrap();
        let added = truth_at(&truth, TruthKind::EndpointAdded, uid).expect("added");
        let ahead = truth
            .iter()
            .filter(|e| {
                e.event == TruthKind::EndpointAdded
                    && e.t < added
                    && e.pod
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&format!("fp-{pid}-f")))
            })
            .count();
        assert!(
            drain >= 1.5 * (ahead as f64 + 1.0) - 0.5,
            "drain {drain:.2}s, {ahead} ahead: {b:#}"
        );
        // Where the target landed in the queue is the kubelets' race (fillers and
        // target are created together): slow (> 3 s) is certain with ≥ 3 fillers ahead
        // (programmed ≥ 6 s after it was added, its source Ready well before that).
        if ahead >= 3 {
            assert_eq!(
                b["result"], "slow",
                "burst of {k}, {ahead} ahead: {b:#}\n{out}"
            );
        }
        eprintln!(
            "burst of {k} on node-2: {ahead} filler(s) ahead, TTFP {}, drain {drain:.2}s",
            b["ttfp_seconds"]
        );
        drains.push(drain);
        let (b0, b1) = span(b);
        for p in of_kind(&report, "cross_node") {
            if p["source"]["node"] != "node-2" && p["target"]["node"] != "node-2" {
                continue;
            }
            let (p0, p1) = span(p);
            assert!(
                p1 <= b0 || p0 >= b1,
                "overlaps the node-2 burst: {p:#}\n{out}"
            );
            // Isolation: none of its endpoints on node-2 was queued behind a burst filler
            // (ground truth: no filler added before it was still unprogrammed when it was
            // added). Its own endpoint there takes one queue slot (1.5 s) even alone, and
            // another plain probe's may be ahead of it: TTFP within 1 s of S1 plus two slots.
            for side in ["source", "target"] {
                if p[side]["node"] != "node-2" {
                    continue;
                }
                let uid = p[side]["uid"].as_str().unwrap();
                let added = truth_at(&truth, TruthKind::EndpointAdded, uid).expect("added");
                let ahead: Vec<&str> = truth
                    .iter()
                    .filter(|e| {
                        e.event == TruthKind::EndpointAdded
                            && e.t < added
                            && e.pod.as_deref().is_some_and(|n| {
                                // A filler: `fp-<probe id>-f<i>`.
                                n.rsplit_once("-f").is_some_and(|(_, i)| {
                                    !i.is_empty() && i.chars().all(|c| c.is_ascii_digit())
                                })
                            })
                            && e.uid.as_deref().is_some_and(|fu| {
                                // Still queued when it was added: neither programmed nor
                                // torn down (`pod_deleted`) before.
                                let before = |k| truth_at(&truth, k, fu).is_some_and(|t| t < added);
                                !before(TruthKind::EndpointProgrammed)
                                    && !before(TruthKind::PodDeleted)
                            })
                            && e.node.as_deref() == Some("node-2")
                    })
                    .filter_map(|e| e.pod.as_deref())
                    .collect();
                assert!(
                    ahead.is_empty(),
                    "{side} of a cross-node probe queued behind burst fillers {ahead:?}: {p:#}\n{out}"
                );
            }
            let ttfp = p["ttfp_seconds"].as_f64().expect("ttfp");
            assert!(
                ttfp <= s1_max + 1.0 + 3.0,
                "cross-node probe touching node-2: TTFP {ttfp:.2}s, S1 max {s1_max:.2}s\n{out}"
            );
        }
    }
    assert!(
        drains[1] > drains[0] + 3.0,
        "drain 5 → 10 fillers: {drains:?}"
    );
}

const REVOKE_FAULT: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [100ms, 300ms]}
    revoke: {after: 10s}
";

#[test]
fn revoke_during_the_hold_is_lost_after_success_and_a_short_hold_misses_it() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("revoke", 2, REVOKE_FAULT, &[]);
    let (code, report, out) = tb.gate(&["--pairs", "1", "--hold", "15s"]);
    validate(&report);
    assert_eq!(code, 1, "{out}");
    let p = &probes(&report)[0];
    assert_eq!(p["result"], "failed", "{out}");
    assert_eq!(p["reason"], "lost_after_success", "{out}");
    assert!(
        p["ttfp_seconds"].as_f64().unwrap() < 1.0,
        "it worked first: {p:#}"
    );
    assert!(p["hold"]["failures"].as_u64().unwrap() > 0, "{p:#}");
    // The documented limit of a short hold: the break comes after it ended.
    let (code, report, out) = tb.gate(&["--pairs", "1", "--hold", "5s"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(probes(&report)[0]["result"], "success", "{out}");
}

/// S3 (docs/scenarios.md). Two `recreate` probes target each node. On node-2 the first one's
/// T₀ has a fresh name (never used there), so it turns Ready and only its recreated T
/// loses its /32 route; that probe then deletes T. The second probe on node-2 creates
/// its T₀ with the **same stable name on the same node**: the testbed's agent (and a
/// Calico-like CNI) sees the interface name reused — it is a recreate (docs/design.md §2
/// "recreate": same name, same node, so the CNI reuses the interface name), so the race
/// hits T₀ and the probe fails at its first incarnation. Both node-2 records say
/// `iface_reused`, and the testbed's truth has a `route_removed` for each failed target.
#[test]
fn s3_only_recreate_on_the_racing_node_fails_and_keeps_the_interface_name() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let fault = common::fault_file("s3-name-reuse.yaml");
    let tb = Testbed::up("s3kinds", 3, &fault, &[]);
    let (code, report, out) = tb.gate(&[
        "--kinds",
        "recreate,cross_node",
        "--pairs",
        "6",
        "--give-up",
        "10s",
        "--hold",
        "1s",
        "--seed",
        "5",
    ]);
    validate(&report);
    assert_eq!(code, 1, "{out}");
    let truth = tb.truth();
    for p in probes(&report) {
        let kind = p["kind"].as_str().unwrap();
        assert!(
            p["api_writes"].as_u64().unwrap() <= budget(kind, 0),
            "{p:#}"
        );
        if kind == "recreate" {
            let rc = &p["recreate"];
            assert_eq!(rc["iface_reused"], true, "{p:#}");
            assert!(rc["previous_ip"].is_string(), "{p:#}");
            assert!(rc["recreate_gap_seconds"].as_f64().unwrap() >= 0.0, "{p:#}");
            assert_eq!(rc["iface"], p["target"]["iface"], "{p:#}");
        }
        if kind == "recreate" && p["target"]["node"] == "node-2" {
            assert_eq!(p["result"], "failed", "{p:#}\n{out}");
            assert_eq!(p["reason"], "target_never_ready", "{p:#}\n{out}");
            let uid = p["target"]["uid"].as_str().unwrap();
            assert!(
                truth
                    .iter()
                    .any(|e| e.event == TruthKind::RouteRemoved && e.uid.as_deref() == Some(uid)),
                "no route_removed truth for the failed target {uid}: {p:#}"
            );
        } else {
            assert_eq!(p["result"], "success", "{kind} {p:#}\n{out}");
        }
    }
    // Same stable name each time on a node: 2 laps, one name per target node.
    let mut names: Vec<&str> = of_kind(&report, "recreate")
        .iter()
        .map(|p| p["target"]["pod"].as_str().unwrap())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3, "{names:?}");
    // The second node-2 probe failed at its first incarnation (a reused name).
    let node2: Vec<&Value> = of_kind(&report, "recreate")
        .into_iter()
        .filter(|p| p["target"]["node"] == "node-2")
        .collect();
    assert_eq!(node2.len(), 2, "{out}");
    let at_first = node2
        .iter()
        .filter(|p| {
            p["detail"]
                .as_str()
                .unwrap_or("")
                .contains("first incarnation")
        })
        .count();
    assert_eq!(at_first, 1, "{node2:#?}");
    assert_eq!(report["summary"]["diagnosis"], "node_local_broken", "{out}");
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(
        left.is_empty(),
        "probe pods left behind after {POD_GONE_TIMEOUT:?}: {left:?}"
    );
}

#[test]
fn service_ttfp_includes_late_service_rules_while_cross_node_stays_fast() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "svc",
        3,
        "rules:\n  - nodes: {all: true}\n    program_delay: {uniform: [100ms, 300ms]}\n    service_delay: 4s\n",
        &[],
    );
    let (code, report, out) = tb.gate(&[
        "--kinds",
        "service,cross_node",
        "--pairs",
        "3",
        "--hold",
        "1s",
        "--slow-threshold",
        "30s",
        "--max-ttfp",
        "30s",
    ]);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    let interval = common::DIAL_INTERVAL;
    assert_eq!(of_kind(&report, "service").len(), 3, "{out}");
    for p in probes(&report) {
        let kind = p["kind"].as_str().unwrap();
        assert_eq!(p["result"], "success", "{p:#}\n{out}");
        assert!(
            p["api_writes"].as_u64().unwrap() <= budget(kind, 0),
            "{p:#}"
        );
        let ttfp = p["ttfp_seconds"].as_f64().unwrap();
        if kind == "cross_node" {
            assert!(p.get("service").is_none(), "{p:#}");
            assert!(ttfp < 1.0, "cross_node TTFP {ttfp:.3}s\n{out}");
            continue;
        }
        let svc = &p["service"];
        assert!(svc["name"].as_str().unwrap().ends_with("-svc"), "{p:#}");
        let cluster_ip = svc["cluster_ip"].as_str().unwrap();
        assert!(
            truth
                .iter()
                .any(|e| e.event == TruthKind::ServiceProgrammed
                    && e.detail["cluster_ip"] == cluster_ip),
            "no service_programmed truth for {cluster_ip}"
        );
        let want = truth_service_ttfp(
            &truth,
            p["source"]["uid"].as_str().unwrap(),
            p["target"]["uid"].as_str().unwrap(),
            p["source"]["node"].as_str().unwrap(),
        )
        .unwrap_or_else(|| panic!("no truth for {}: {p:#}", p["id"]));
        let err = ttfp - want;
        assert!(
            (-0.05..=interval + 0.05).contains(&err),
            "service {}→{}: TTFP {ttfp:.3}s vs truth {want:.3}s",
            p["source"]["node"],
            p["target"]["node"]
        );
        // The service rules came ~4 s after the target's endpoint; the source became
        // Ready ~1–2 s after the target was created, so the delay shows.
        assert!(
            ttfp > 1.5,
            "service TTFP {ttfp:.3}s does not show the 4 s delay"
        );
    }
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(
        left.is_empty(),
        "probe pods left behind after {POD_GONE_TIMEOUT:?}: {left:?}"
    );
    let svcs = tb.wait_no_labelled("services", POD_GONE_TIMEOUT);
    assert!(
        svcs.is_empty(),
        "probe services left behind after {POD_GONE_TIMEOUT:?}: {svcs:?}"
    );
}

/// The nodes of a probe, sorted (`[a, a]` for a same-node probe).
fn pair_nodes(p: &Value) -> [String; 2] {
    let a = p["source"]["node"].as_str().unwrap_or_default().to_string();
    let b = p["target"]["node"].as_str().unwrap_or_default().to_string();
    if a <= b {
        [a, b]
    } else {
        [b, a]
    }
}

/// docs/scenarios.md S6: node-1 has no route to node-3's pod block (so node-1↔node-3 is broken
/// both ways: the replies of node-3 → node-1 need that route too), every other pair
/// and every same-node control works.
const PAIR_FAULT: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [200ms, 600ms]}
  - nodes: {names: [node-1]}
    cross_node: {broken_peers: [node-3]}
";

#[test]
fn s6_one_node_pair_broken_both_ways_is_pair_failures_naming_the_pair() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("s6pair", 4, PAIR_FAULT, &[]);
    let (code, report, out) = tb.gate(&[
        "--kinds",
        "same_node,cross_node",
        "--pairs",
        "12",
        "--give-up",
        "10s",
        "--hold",
        "1s",
    ]);
    validate(&report);
    assert_eq!(code, 1, "{out}");
    let broken = ["node-1".to_string(), "node-3".to_string()];
    // Ground truth of the fault: exactly the probes between node-1 and node-3 fail.
    let cross = of_kind(&report, "cross_node");
    assert_eq!(cross.len(), 12, "every ordered pair of 4 nodes once: {out}");
    for p in probes(&report) {
        let want = if pair_nodes(p) == broken {
            "failed"
        } else {
            "success"
        };
        assert_eq!(p["result"], want, "{p:#}\n{out}");
    }
    assert_eq!(report["summary"]["diagnosis"], "pair_failures", "{out}");
    let pairs = report["summary"]["failing_pairs"]
        .as_array()
        .expect("pairs");
    assert_eq!(pairs.len(), 1, "{out}");
    assert_eq!(pairs[0]["nodes"], serde_json::json!(broken), "{out}");
    assert_eq!(pairs[0]["failed"], 2, "{out}");
    assert_eq!(pairs[0]["both_directions"], true, "{out}");
    assert!(
        out.contains("failing node pairs: node-1↔node-3 (2 failed, both directions, 0 passed)"),
        "{out}"
    );
    assert!(out.contains("diagnosis: pair_failures"), "{out}");
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(left.is_empty(), "probe pods left behind: {left:?}");
}

/// docs/scenarios.md S7: every new pod IP gets a stale blackhole route on one other node, so
/// about half of the pairs fail, at random, each node passing with some peers.
const STALE_FAULT: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [200ms, 600ms]}
    stale_routes: {k: 1}
";

#[test]
fn s7_random_blackholed_pod_ips_are_never_called_cross_node_broken() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("s7stale", 4, STALE_FAULT, &[]);
    // Each pair fails with probability about 5/9, so about 1 run in 100 loses 11 or 12
    // of its 12 pairs to the dice — a sample that looks like every pair broken. Such a
    // run is printed and the gate runs again (at most twice more); a dataplane that
    // really broke every pair fails all three.
    let mut attempt = 0;
    let (code, report, out) = loop {
        attempt += 1;
        let (code, report, out) = tb.gate(&["--pairs", "12", "--give-up", "10s", "--hold", "1s"]);
        let failed = of_kind(&report, "cross_node")
            .iter()
            .filter(|p| p["result"] == "failed")
            .count();
        if failed < 11 || attempt == 3 {
            break (code, report, out);
        }
        println!("S7 run {attempt}: {failed} of 12 pairs failed (an unrepresentative draw); running the gate again");
    };
    validate(&report);
    let cross = of_kind(&report, "cross_node");
    assert_eq!(cross.len(), 12, "{out}");
    let failed = cross.iter().filter(|p| p["result"] == "failed").count();
    let passed = cross.iter().filter(|p| p["result"] == "success").count();
    // The fault took effect (each pair fails with probability about 5/9: some fail) and
    // left pairs passing.
    assert!(failed >= 1, "the stale routes dropped nothing:\n{out}");
    assert_eq!(code, 1, "{out}");
    let diagnosis = report["summary"]["diagnosis"].as_str().unwrap_or_default();
    assert!(
        !["cross_node_broken", "healthy", "inconclusive"].contains(&diagnosis),
        "{diagnosis}: {failed} failed, {passed} passed:\n{out}"
    );
    // Every failed probe's pair really lost a route (ground truth: a stale route on the
    // source's node for the target's IP, or on the target's node for the source's IP).
    let truth = tb.truth();
    for p in cross.iter().filter(|p| p["result"] == "failed") {
        let (s_uid, t_uid) = (
            p["source"]["uid"].as_str().unwrap_or_default(),
            p["target"]["uid"].as_str().unwrap_or_default(),
        );
        let (s_node, t_node) = (
            p["source"]["node"].as_str().unwrap_or_default(),
            p["target"]["node"].as_str().unwrap_or_default(),
        );
        let stale = truth.iter().any(|e| {
            e.event == TruthKind::PeerRouteRemoved
                && ((e.uid.as_deref() == Some(t_uid) && e.node.as_deref() == Some(s_node))
                    || (e.uid.as_deref() == Some(s_uid) && e.node.as_deref() == Some(t_node)))
        });
        assert!(
            stale,
            "failed without a stale route in the truth log: {p:#}"
        );
    }
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(left.is_empty(), "probe pods left behind: {left:?}");
}

/// Issue 29, kind `unprobed` on a CNI that gates readiness (the simulated agent with
/// `gates_readiness: true`, as real Felix): endpoints on node-2 are programmed 3 s late.
/// A readiness-probed pod there turns Ready only after that, so a `cross_node` probe
/// shows it as the pod's programming wait (before Ready, TTFP about 0), while an
/// `unprobed` target there is Ready at once and its darkness lands in TTFP. Both match
/// the truth (TTFP; programming wait = `endpoint_programmed` − `container_started`).
/// Then S2 itself (`faults/s2-apply-loop.yaml`, node-2 labelled `os=debian13`, gating
/// on by default): an `unprobed` target there is dark for 15–42 s after Ready, and its
/// TTFP matches the truth.
#[test]
fn unprobed_targets_carry_the_gated_delay_into_ttfp_and_probed_pods_show_it_as_programming_wait() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "unprobed",
        3,
        "rules:\n  - nodes: {all: true}\n    agent: {gates_readiness: true}\n    program_delay: 100ms\n  - nodes: {names: [node-2]}\n    program_delay: 3s\n",
        &["--node-labels", "node-2=os=debian13"],
    );
    let (_, report, out) = tb.gate(&[
        "--kinds",
        "unprobed,cross_node",
        "--pairs",
        "6",
        "--hold",
        "1s",
        "--slow-threshold",
        "30s",
        "--max-ttfp",
        "30s",
    ]);
    validate(&report);
    let truth = tb.truth();
    let mut seen = (0, 0);
    for p in probes(&report) {
        assert_eq!(p["result"], "success", "{p:#}\n{out}");
        common::assert_ttfp_near_truth(&truth, p, &out);
        let ttfp = p["ttfp_seconds"].as_f64().unwrap();
        let target_on_2 = p["target"]["node"] == "node-2";
        let g = &p["programming"];
        if p["kind"] == "unprobed" && target_on_2 {
            // Ready at container start; dark until programmed: after Ready.
            assert!(
                ttfp > 1.5,
                "unprobed target on node-2: TTFP {ttfp:.3}s\n{p:#}\n{out}"
            );
            assert_eq!(g["readiness_gated"], false, "{g:#}");
            seen.0 += 1;
        }
        if p["kind"] == "cross_node" && target_on_2 {
            // Probed: Ready only once programmed, so the wait is before Ready.
            let w = g["target"]["wait_seconds"].as_f64().unwrap();
            assert!(
                w > 2.5 && ttfp < 1.0,
                "wait {w:.3}s, TTFP {ttfp:.3}s\n{out}"
            );
            assert_eq!(g["readiness_gated"], true, "{g:#}");
            seen.1 += 1;
        }
    }
    assert!(
        seen.0 >= 1 && seen.1 >= 1,
        "no unprobed/cross_node probe targeted node-2: {seen:?}\n{out}"
    );

    // S2 on the gating agent: the unprobed target's darkness after Ready is the apply
    // loop's 15–42 s, as the XDP incident's operator measured it with a wget loop.
    tb.set_fault(&common::fault_file("s2-apply-loop.yaml"));
    let (_, report, out) = tb.gate(&[
        "--kinds",
        "unprobed",
        "--pairs",
        "3",
        "--hold",
        "1s",
        "--give-up",
        "60s",
        "--slow-threshold",
        "60s",
        "--max-ttfp",
        "60s",
    ]);
    validate(&report);
    let truth = tb.truth();
    let mut on_2 = 0;
    for p in probes(&report) {
        assert_eq!(p["result"], "success", "{p:#}\n{out}");
        common::assert_ttfp_near_truth(&truth, p, &out);
        if p["target"]["node"] == "node-2" {
            let ttfp = p["ttfp_seconds"].as_f64().unwrap();
            assert!(
                ttfp > 10.0,
                "S2, unprobed target on node-2: TTFP {ttfp:.3}s\n{p:#}\n{out}"
            );
            on_2 += 1;
        }
    }
    assert!(on_2 >= 1, "no unprobed target on node-2 under S2\n{out}");
}
