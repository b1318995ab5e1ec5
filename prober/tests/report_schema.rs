//! The gate report the prober builds validates against the shared JSON Schema
//! (`report/schema/report.schema.json`, docs/design.md §4), for every result class.

use firstpacket_report::{
    BurstInfo, ErrorKind, GateReport, ProbeRecord, Reason, RecreateInfo, SourceHold, SourceOutcome,
    SourceReport, Thresholds,
};
use k8s_openapi::api::core::v1::Pod;
use prober::gate::{build_report, ReportInputs};
use prober::record::{build_record, Ending, ProbeMeta};
use prober::schedule::NodeInfo;
use prober::tracker::{Terminated, Tracker};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn source_report(outcome: SourceOutcome, ready: Option<f64>, success: Option<f64>) -> SourceReport {
    let raw = match (success, ready) {
        (Some(s), Some(r)) => Some(s - r),
        _ => None,
    };
    SourceReport {
        schema: 1,
        pod: "fp-x-s".into(),
        target: "10.0.2.5:8080".into(),
        expect_pod: "fp-x-t".into(),
        interval_seconds: 0.1,
        attempt_timeout_seconds: 0.9,
        give_up_seconds: 60.0,
        hold_seconds: 5.0,
        process_start_unix: 1.7e9,
        process_start: 0.0,
        first_attempt: Some(0.01),
        ready_at: ready,
        first_success_sent: success,
        first_success_received: success.map(|s| s + 0.002),
        first_success_retransmits: None,
        ttfp_seconds: raw.map(|v| v.max(0.0)),
        raw_ttfp_seconds: raw,
        attempts_before_success: 4,
        failures_before_success: 2,
        failures_before_ready: 0,
        first_success_after_ready_sent: success.filter(|s| ready.is_some_and(|r| *s >= r)),
        failures_after_ready_before_success: 2,
        errors: [(ErrorKind::Timeout, 2)].into_iter().collect(),
        last_error: Some(ErrorKind::Timeout),
        wrong_peer: None,
        hold: SourceHold {
            seconds: 5.0,
            attempts: 50,
            failures: 0,
            failures_per_second: vec![0; 5],
        },
        outcome,
        programming: None,
        target_programming: None,
        policy: None,
        paths: Vec::new(),
    }
}

fn probe(i: usize, src: &str, dst: &str, message: Option<String>, ending: Ending) -> ProbeRecord {
    let fixture: Pod =
        serde_json::from_str(include_str!("fixtures/k8s-pod-running-ready.json")).expect("fixture");
    let t0 = Instant::now();
    let id = format!("abcdefgh-{i}");
    let (tn, sn) = (format!("fp-{id}-t"), format!("fp-{id}-s"));
    let mut tr = Tracker::new();
    for (name, node, at) in [(&tn, dst, 300u64), (&sn, src, 900)] {
        let mut p = fixture.clone();
        p.metadata.name = Some(name.clone());
        p.metadata.uid = Some(format!("uid-{name}"));
        if let Some(s) = p.spec.as_mut() {
            s.node_name = Some(node.to_string());
        }
        tr.note_created(name, t0 + Duration::from_millis(at - 200));
        tr.apply(&p, t0 + Duration::from_millis(at));
    }
    let target = tr.get(&tn).cloned();
    let mut source = tr.get(&sn).cloned();
    if let Some(s) = source.as_mut() {
        s.terminated = Some(Terminated {
            at: t0 + Duration::from_secs(7),
            exit_code: 0,
            reason: Some("Completed".into()),
            message,
        });
    }
    let meta = ProbeMeta {
        id,
        kind: "cross_node".into(),
        namespace: "firstpacket".into(),
        source_node: src.into(),
        target_node: dst.into(),
        source_pod: sn,
        target_pod: tn,
        started: t0,
        started_at: "2026-01-01T00:00:00Z".into(),
    };
    build_record(
        &meta,
        target.as_ref(),
        source.as_ref(),
        &ending,
        Duration::from_secs(5),
        t0 + Duration::from_secs(8),
    )
}

fn json(r: &SourceReport) -> Option<String> {
    Some(serde_json::to_string(r).expect("json"))
}

/// Five probes, one of each result class (success as `recreate`, slow as `burst`,
/// failed, inconclusive from a garbage report, inconclusive unschedulable).
fn probes_of_every_class() -> Vec<ProbeRecord> {
    let mut probes = vec![
        probe(
            0,
            "node-1",
            "node-2",
            json(&source_report(SourceOutcome::Success, Some(0.4), Some(0.6))),
            Ending::SourceTerminated,
        ),
        probe(
            1,
            "node-2",
            "node-3",
            json(&source_report(SourceOutcome::Success, Some(0.4), Some(9.6))),
            Ending::SourceTerminated,
        ),
        probe(
            2,
            "node-3",
            "node-1",
            json(&source_report(SourceOutcome::NoSuccess, Some(0.4), None)),
            Ending::SourceTerminated,
        ),
        probe(
            3,
            "node-1",
            "node-3",
            Some("garbage".into()),
            Ending::SourceTerminated,
        ),
        probe(
            4,
            "node-2",
            "node-1",
            None,
            Ending::Aborted {
                reason: Reason::Unschedulable,
                detail: "0/3 nodes are available".into(),
            },
        ),
    ];
    probes[0].kind = "recreate".into();
    probes[0].recreate = Some(RecreateInfo {
        previous_ip: Some("10.0.2.4".into()),
        previous_uid: Some("uid-old".into()),
        iface: "cali0d7763386da".into(),
        iface_reused: true,
        recreate_gap_seconds: Some(0.42),
    });
    probes[1].kind = "burst".into();
    probes[1].burst = Some(BurstInfo {
        fillers: 10,
        fillers_created: 10,
        fillers_ready_seconds: Some(3.2),
        backlog_drain_seconds: Some(4.1),
    });
    probes[1].api_writes = 24;
    probes
}

/// The gate report of `probes` on three zoned nodes, with errors, an early stop, a
/// skipped node and the agents' scrape facts.
fn report_of(probes: Vec<ProbeRecord>) -> GateReport {
    let nodes: Vec<NodeInfo> = (1..=3)
        .map(|i| NodeInfo {
            name: format!("node-{i}"),
            labels: [("zone".to_string(), format!("z{}", i % 2))]
                .into_iter()
                .collect(),
            ready: true,
            unschedulable: false,
            taints: vec![],
        })
        .collect();
    let mut report = build_report(
        probes,
        &nodes,
        vec![],
        ReportInputs {
            thresholds: Thresholds {
                slow_threshold_seconds: 5.0,
                max_ttfp_seconds: 5.0,
                max_failures: 0,
                max_inconclusive: 0,
            },
            instance: "gate-abcdefgh".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: "2026-01-01T00:01:00Z".into(),
            duration_seconds: 60.0,
            errors: vec!["interrupted by SIGINT".into()],
            group_by: vec!["zone".into()],
            stopped_early: Some("test".into()),
            skipped_nodes: vec![firstpacket_report::SkippedNode {
                node: "node-9".into(),
                reason: "not Ready".into(),
            }],
        },
    );
    assert_eq!(report.exit_code, 1);
    let pn = |p: &str, n: &str| (p.to_string(), n.to_string());
    report.agents = Some(prober::gate::agents_report(
        &prober::gate::AgentScrapeFacts {
            scrape_mode: "auto".into(),
            profiles: vec!["calico-felix".into(), "kube-proxy".into()],
            agents: vec![pn("calico-felix", "node-1"), pn("kube-proxy", "node-1")],
            counts: [
                (pn("calico-felix", "ok"), 4),
                (pn("kube-proxy", "connect"), 4),
            ]
            .into_iter()
            .collect(),
            node_outcomes: [
                (pn("calico-felix", "node-1"), (4, 0)),
                (pn("kube-proxy", "node-1"), (0, 4)),
            ]
            .into_iter()
            .collect(),
            via_proxy: vec![],
        },
    ));
    report
}

/// Edits of a valid report `value` that the schema must refuse, and valid variants it
/// must accept.
fn schema_checks_edits(validator: &jsonschema::Validator, value: &serde_json::Value) {
    let mut broken = value.clone();
    broken["probes"][0]["result"] = "maybe".into();
    assert!(
        !validator.is_valid(&broken),
        "the schema check must be able to fail"
    );
    let mut broken = value.clone();
    broken["probes"][0]["recreate"]["iface_reused"] = "yes".into();
    assert!(
        !validator.is_valid(&broken),
        "recreate.iface_reused is a boolean"
    );
    let mut broken = value.clone();
    broken["summary"]["by_kind"]["mesh"] = broken["summary"]["by_kind"]["burst"].clone();
    assert!(!validator.is_valid(&broken), "by_kind keys are probe kinds");
    assert!(value["summary"]["by_kind"]["recreate"]["total"] == 1);
    assert_eq!(value["summary"]["failing_pairs"], serde_json::json!([]));
    let mut pairs = value.clone();
    pairs["summary"]["diagnosis"] = "pair_failures".into();
    pairs["summary"]["failing_pairs"] =
        serde_json::to_value(vec![firstpacket_report::FailingPair {
            nodes: ["node-1".into(), "node-3".into()],
            failed: 2,
            passed: 0,
            both_directions: true,
        }])
        .expect("pair json");
    assert!(validator.is_valid(&pairs), "pair_failures with its pairs");
    let mut broken = pairs.clone();
    broken["summary"]["failing_pairs"][0]["nodes"] = serde_json::json!(["node-1"]);
    assert!(!validator.is_valid(&broken), "a pair has two nodes");
    let mut broken = pairs.clone();
    broken["summary"]["failing_pairs"][0]["failed"] = 0.into();
    assert!(
        !validator.is_valid(&broken),
        "a failing pair failed at least once"
    );
    let mut broken = value.clone();
    broken["agents"]["scrape_mode"] = "sometimes".into();
    assert!(
        !validator.is_valid(&broken),
        "agents.scrape_mode is a flag value"
    );
    let mut broken = value.clone();
    broken["agents"]["profiles"]["calico-felix"]["scrapes_ok"] = (-1).into();
    assert!(!validator.is_valid(&broken), "scrape counts are counts");
    let mut off = value.clone();
    off["agents"] = serde_json::json!({"scrape_mode": "proxy", "profiles": {}});
    assert!(validator.is_valid(&off), "correlation off: profiles {{}}");
    let mut absent = value.clone();
    absent.as_object_mut().expect("object").remove("agents");
    assert!(validator.is_valid(&absent), "agents is optional");
}

#[test]
fn gate_report_with_every_result_class_matches_the_json_schema() {
    let probes = probes_of_every_class();
    assert_eq!(
        probes[0].first_attempt_failures, 2,
        "success after 2 failures after Ready"
    );
    let results: Vec<&str> = probes.iter().map(|p| p.result.as_str()).collect();
    assert_eq!(
        results,
        ["success", "slow", "failed", "inconclusive", "inconclusive"]
    );
    let report = report_of(probes);
    let value = serde_json::to_value(&report).expect("report json");
    assert_eq!(
        value["agents"]["profiles"]["kube-proxy"]["scrapes_failed"],
        4
    );
    let schema: serde_json::Value =
        serde_json::from_str(firstpacket_report::GATE_REPORT_SCHEMA).expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
    schema_checks_edits(&validator, &value);
    let back: GateReport = serde_json::from_value(value).expect("round trip");
    assert_eq!(back, report);
    let by: BTreeMap<_, _> = back.summary.by_result.into_iter().collect();
    assert_eq!(by.values().sum::<u64>(), 5);
}
