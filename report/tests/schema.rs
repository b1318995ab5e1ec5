//! The hand-written JSON Schemas (`schema/*.schema.json`) match the Rust report types:
//! realistic documents built in Rust validate, and mutated ones (unknown closed-set
//! strings, missing required fields, another schema version) are rejected.

use firstpacket_report::{
    Attempts, Diagnosis, ErrorKind, GateReport, Hold, NodeRoleStats, NodeSummary, PodProgramming,
    PodRef, PodTimeline, ProbeProgramming, ProbeRecord, ProbeResult, ProgrammingMethod,
    ProgrammingWait, Reason, Role, Signal, SourceHold, SourceOutcome, SourceReport, Summary,
    Suspect, Thresholds, Timeline, Verdict, GATE_REPORT_SCHEMA, SCHEMA_VERSION,
    SOURCE_REPORT_SCHEMA,
};
use serde_json::{json, Value};
use std::collections::BTreeMap;

fn schema(text: &str) -> Value {
    serde_json::from_str(text).expect("schema file is JSON")
}

fn validator(text: &str) -> jsonschema::Validator {
    jsonschema::draft202012::new(&schema(text)).expect("schema compiles")
}

fn errors(v: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc).map(|e| e.to_string()).collect()
}

fn source_report() -> SourceReport {
    let mut errors: BTreeMap<ErrorKind, u64> = ErrorKind::ALL.iter().map(|k| (*k, 0)).collect();
    errors.insert(ErrorKind::Timeout, 41);
    SourceReport {
        schema: SCHEMA_VERSION,
        pod: "firstpacket-src-7f3c2-abcde".into(),
        target: "10.244.2.17:8080".into(),
        expect_pod: "firstpacket-tgt-7f3c2-xyz12".into(),
        interval_seconds: 0.1,
        attempt_timeout_seconds: 0.9,
        give_up_seconds: 60.0,
        hold_seconds: 5.0,
        process_start_unix: 1_760_000_000.123456,
        process_start: 0.0,
        first_attempt: Some(0.002),
        ready_at: Some(0.512),
        first_success_sent: Some(4.602),
        first_success_received: Some(4.603),
        first_success_retransmits: None,
        ttfp_seconds: Some(4.09),
        raw_ttfp_seconds: Some(4.09),
        attempts_before_success: 46,
        failures_before_success: 41,
        failures_before_ready: 5,
        first_success_after_ready_sent: Some(4.602),
        failures_after_ready_before_success: 36,
        errors,
        last_error: Some(ErrorKind::Timeout),
        wrong_peer: None,
        hold: SourceHold {
            seconds: 5.001,
            attempts: 50,
            failures: 0,
            failures_per_second: vec![0, 0, 0, 0, 0],
        },
        outcome: SourceOutcome::Success,
        programming: Some(PodProgramming {
            method: Some(ProgrammingMethod::NodeDial),
            wait_seconds: Some(1.2),
            resolution_seconds: Some(0.1),
            node_addr: Some("172.18.0.3:10250".into()),
            node_dial_attempts: 13,
            node_dial_failures: 12,
            node_dial_first_success_sent: Some(1.2),
            node_dial_last_error: Some(ErrorKind::Timeout),
            node_dial_gave_up: None,
            first_kubelet_request: Some(1.31),
            ready_at: Some(1.31),
        }),
        target_programming: Some(PodProgramming {
            method: Some(ProgrammingMethod::KubeletProbe),
            wait_seconds: Some(0.9),
            resolution_seconds: Some(1.0),
            node_addr: None,
            first_kubelet_request: Some(0.9),
            ..PodProgramming::default()
        }),
        policy: None,
        paths: Vec::new(),
    }
}

fn pod(node: &str, name: &str, ip: &str) -> PodRef {
    PodRef {
        node: node.into(),
        pod: name.into(),
        uid: Some("5f0c7a52-3c2b-4a57-9d3e-0f1d2c3b4a59".into()),
        ip: Some(ip.into()),
        iface: Some("cali1a2b3c4d5e6".into()),
    }
}

fn probe(id: &str, result: ProbeResult, reason: Option<Reason>) -> ProbeRecord {
    let sr = source_report();
    ProbeRecord {
        id: id.into(),
        kind: "cross_node".into(),
        source: pod("node-1", &sr.pod, "10.244.1.9"),
        target: pod("node-2", &sr.expect_pod, "10.244.2.17"),
        result,
        reason,
        detail: reason.map(|r| format!("detail for {}", r.as_str())),
        ttfp_seconds: sr.ttfp_seconds,
        raw_ttfp_seconds: sr.raw_ttfp_seconds,
        target_ready_to_source_ready_seconds: Some(1.8),
        attempts: Attempts {
            before_success: sr.attempts_before_success,
            failures_before_success: sr.failures_before_success,
            last_error: sr.last_error,
            errors: sr.errors.clone(),
        },
        hold: Hold {
            seconds: sr.hold.seconds,
            failures: sr.hold.failures,
        },
        timeline: Timeline {
            started_at: "2025-10-09T12:00:00.123Z".into(),
            target: PodTimeline {
                created: Some(0.01),
                scheduled: Some(0.02),
                ip_assigned: Some(0.4),
                ready: Some(1.5),
                finished: None,
                deleted: Some(12.0),
            },
            source: PodTimeline {
                created: Some(1.6),
                scheduled: Some(1.61),
                ip_assigned: Some(2.0),
                ready: Some(3.3),
                finished: Some(11.0),
                deleted: Some(12.1),
            },
            finished: Some(12.2),
        },
        suspects: vec![Suspect {
            node: "node-2".into(),
            role: Role::Target,
            signal: Signal::DataplaneApplySlow,
            evidence: json!({"apply_mean_seconds": 1.2, "healthy_apply_mean_seconds": 0.01}),
        }],
        source_report: Some(sr),
        first_attempt_failures: 0,
        pre_ready_attempt_failures: 0,
        programming: Some(ProbeProgramming {
            source: Some(ProgrammingWait {
                method: ProgrammingMethod::NodeDial,
                wait_seconds: 1.2,
                resolution_seconds: 0.1,
                over_threshold: false,
            }),
            target: None,
            readiness_gated: Some(true),
        }),
        api_writes: 4,
        recreate: None,
        burst: None,
        service: None,
        policy: None,
        paths: Vec::new(),
        drift: None,
    }
}

fn gate_report() -> GateReport {
    let by_result: BTreeMap<ProbeResult, u64> = ProbeResult::ALL.iter().map(|r| (*r, 0)).collect();
    let mut summary_by_result = by_result.clone();
    summary_by_result.insert(ProbeResult::Slow, 1);
    summary_by_result.insert(ProbeResult::Failed, 1);
    summary_by_result.insert(ProbeResult::Success, 1);
    let mut labels = BTreeMap::new();
    labels.insert(
        "topology.kubernetes.io/zone".to_string(),
        "zone-a".to_string(),
    );
    GateReport {
        schema: SCHEMA_VERSION,
        verdict: Verdict::Fail,
        exit_code: 1,
        verdict_reasons: vec!["1 failed probe > --max-failures 0".into()],
        thresholds: Thresholds {
            slow_threshold_seconds: 5.0,
            max_ttfp_seconds: 5.0,
            max_failures: 0,
            max_inconclusive: 0,
        },
        summary: Summary {
            total: 3,
            by_result: summary_by_result,
            ttfp_p50: Some(4.09),
            ttfp_p95: Some(6.2),
            ttfp_max: Some(6.2),
            diagnosis: Diagnosis::SlowNodes,
            first_attempt_failures: 0,
            by_kind: BTreeMap::new(),
            failing_pairs: Vec::new(),
            programming_wait_p50: Some(0.9),
            programming_wait_p95: Some(1.2),
            programming_wait_max: Some(1.2),
        },
        nodes: vec![NodeSummary {
            node: "node-1".into(),
            labels,
            as_source: NodeRoleStats {
                probes: 3,
                by_result,
                ttfp_max: Some(6.2),
            },
            as_target: NodeRoleStats::default(),
        }],
        warnings: vec![Suspect {
            node: "node-3".into(),
            role: Role::Source,
            signal: Signal::AgentRestarted,
            evidence: json!({"restarts": 1}),
        }],
        probes: vec![
            probe("p-1", ProbeResult::Success, None),
            probe("p-2", ProbeResult::Slow, Some(Reason::TtfpOverThreshold)),
            probe("p-3", ProbeResult::Failed, Some(Reason::LostAfterSuccess)),
        ],
        instance: "gate-4f2a".into(),
        started_at: "2025-10-09T12:00:00Z".into(),
        finished_at: "2025-10-09T12:01:00Z".into(),
        duration_seconds: 60.0,
        errors: vec![],
        stopped_early: None,
        skipped_nodes: Vec::new(),
        agents: None,
        api_outages: Vec::new(),
        baseline: None,
    }
}

#[test]
fn both_schema_files_are_valid_draft_2020_12() {
    for text in [GATE_REPORT_SCHEMA, SOURCE_REPORT_SCHEMA] {
        let s = schema(text);
        assert_eq!(
            s["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "draft 2020-12"
        );
        if let Err(e) = jsonschema::meta::validate(&s) {
            panic!("schema violates its meta-schema: {e}");
        }
    }
}

#[test]
fn gate_report_embeds_the_source_report_schema_unchanged() {
    let gate = schema(GATE_REPORT_SCHEMA);
    assert_eq!(gate["$defs"]["source_report"], schema(SOURCE_REPORT_SCHEMA));
}

#[test]
fn realistic_gate_report_validates() {
    let v = validator(GATE_REPORT_SCHEMA);
    let doc = serde_json::to_value(gate_report()).expect("serialise");
    assert_eq!(errors(&v, &doc), Vec::<String>::new());
}

#[test]
fn realistic_source_report_validates() {
    let v = validator(SOURCE_REPORT_SCHEMA);
    let doc = serde_json::to_value(source_report()).expect("serialise");
    assert_eq!(errors(&v, &doc), Vec::<String>::new());
}

#[test]
fn every_reason_validates_with_its_own_result_and_no_other() {
    let v = validator(GATE_REPORT_SCHEMA);
    for reason in Reason::ALL {
        for result in ProbeResult::ALL {
            let mut doc = serde_json::to_value(gate_report()).expect("serialise");
            doc["probes"][0]["result"] = json!(result.as_str());
            doc["probes"][0]["reason"] = json!(reason.as_str());
            let ok = v.is_valid(&doc);
            assert_eq!(
                ok,
                reason.result() == result,
                "reason {} with result {}",
                reason.as_str(),
                result.as_str()
            );
        }
    }
}

/// Apply `mutate` to a valid gate report; the schema must reject the result.
fn assert_gate_rejects(what: &str, mutate: impl FnOnce(&mut Value)) {
    let v = validator(GATE_REPORT_SCHEMA);
    let mut doc = serde_json::to_value(gate_report()).expect("serialise");
    assert!(v.is_valid(&doc), "baseline must be valid");
    mutate(&mut doc);
    assert!(!v.is_valid(&doc), "{what} must be rejected");
}

#[test]
fn unknown_reason_string_is_rejected() {
    assert_gate_rejects("unknown reason", |d| {
        d["probes"][2]["reason"] = json!("network_sad")
    });
}

#[test]
fn missing_verdict_is_rejected() {
    assert_gate_rejects("missing verdict", |d| {
        d.as_object_mut().expect("object").remove("verdict");
    });
}

#[test]
fn schema_version_2_is_rejected() {
    assert_gate_rejects("schema 2", |d| d["schema"] = json!(2));
}

#[test]
fn unknown_closed_set_values_are_rejected() {
    assert_gate_rejects("unknown verdict", |d| d["verdict"] = json!("maybe"));
    assert_gate_rejects("unknown diagnosis", |d| {
        d["summary"]["diagnosis"] = json!("gremlins")
    });
    assert_gate_rejects("unknown signal", |d| {
        d["warnings"][0]["signal"] = json!("agent_sad")
    });
    assert_gate_rejects("unknown result", |d| {
        d["probes"][0]["result"] = json!("meh")
    });
    assert_gate_rejects("unknown error kind", |d| {
        d["probes"][0]["attempts"]["last_error"] = json!("eagain")
    });
    assert_gate_rejects("unknown error kind key", |d| {
        d["probes"][0]["attempts"]["errors"]["eagain"] = json!(1)
    });
    assert_gate_rejects("unknown source outcome", |d| {
        d["probes"][0]["source_report"]["outcome"] = json!("ok")
    });
    assert_gate_rejects("verdict/exit code mismatch", |d| d["exit_code"] = json!(0));
    assert_gate_rejects("by_result missing a key", |d| {
        d["summary"]["by_result"]
            .as_object_mut()
            .expect("object")
            .remove("inconclusive");
    });
}

/// A named change applied to a valid document.
type Mutation = Box<dyn Fn(&mut Value)>;

#[test]
fn source_report_mutations_are_rejected() {
    let v = validator(SOURCE_REPORT_SCHEMA);
    let good = serde_json::to_value(source_report()).expect("serialise");
    let cases: Vec<(&str, Mutation)> = vec![
        ("schema 2", Box::new(|d| d["schema"] = json!(2))),
        (
            "missing outcome",
            Box::new(|d| {
                d.as_object_mut().expect("object").remove("outcome");
            }),
        ),
        (
            "unknown last_error",
            Box::new(|d| d["last_error"] = json!("eagain")),
        ),
        (
            "negative ttfp",
            Box::new(|d| d["ttfp_seconds"] = json!(-0.5)),
        ),
        (
            "hold series too long",
            Box::new(|d| d["hold"]["failures_per_second"] = json!(vec![0; 121])),
        ),
    ];
    for (what, mutate) in cases {
        let mut doc = good.clone();
        mutate(&mut doc);
        assert!(!v.is_valid(&doc), "{what} must be rejected");
    }
}

#[test]
fn source_report_with_nulls_validates() {
    // What a probe that never succeeded writes.
    let v = validator(SOURCE_REPORT_SCHEMA);
    let mut r = source_report();
    r.first_success_sent = None;
    r.first_success_received = None;
    r.ttfp_seconds = None;
    r.raw_ttfp_seconds = Some(-1.0);
    r.ready_at = None;
    r.last_error = None;
    r.wrong_peer = Some("other-pod".into());
    r.hold = SourceHold::default();
    r.outcome = SourceOutcome::WrongPeer;
    let doc = serde_json::to_value(r).expect("serialise");
    assert_eq!(errors(&v, &doc), Vec::<String>::new());
}

/// Every closed set's `as_str` (metric, Event and JUnit labels) is its JSON string.
#[test]
fn label_strings_are_the_json_strings() {
    fn json<T: serde::Serialize>(v: T) -> String {
        serde_json::to_value(v)
            .expect("serialise")
            .as_str()
            .expect("a string")
            .to_owned()
    }
    for s in Signal::ALL {
        assert_eq!(s.as_str(), json(s));
    }
    for r in [Role::Source, Role::Target] {
        assert_eq!(r.as_str(), json(r));
    }
    for r in ProbeResult::ALL {
        assert_eq!(r.as_str(), json(r));
    }
    for r in Reason::ALL {
        assert_eq!(r.as_str(), json(r));
    }
    for k in ErrorKind::ALL {
        assert_eq!(k.as_str(), json(k));
    }
}
