//! End-to-end: the NetworkPolicy kinds (issue 32), `prober gate --kinds
//! policy,policy_change`, on a testbed whose simulated agent enforces NetworkPolicy in
//! the nodes' nftables, with its policy faults (docs/src/testbed.md). One testbed, one gate
//! per fault; every timing is compared with the testbed's truth (`policy_programmed`,
//! `policy_revoked`: the moment a node's ruleset starts / stops admitting the peer).
//! Real Felix as the judge of the same probes: `e2e_policy_felix.rs`.

mod common;

use common::{validate, Testbed, SERIAL};
use serde_json::Value;
use testbed::truth::{path_up_from, TruthEvent, TruthKind};

/// The gates' `--dial-interval` (the default).
const DIAL_INTERVAL: f64 = 0.1;

fn probes(report: &Value) -> Vec<Value> {
    report["probes"].as_array().cloned().unwrap_or_default()
}

fn of_kind(report: &Value, kind: &str) -> Vec<Value> {
    probes(report)
        .into_iter()
        .filter(|p| p["kind"] == kind)
        .collect()
}

/// The first `kind` event on `node` admitting (or no longer admitting) `peer`, at or
/// after `from`.
fn policy_event(
    truth: &[TruthEvent],
    kind: TruthKind,
    node: &str,
    peer: &str,
    from: f64,
) -> Option<f64> {
    truth
        .iter()
        .filter(|e| {
            e.event == kind
                && e.node.as_deref() == Some(node)
                && e.uid.as_deref() == Some(peer)
                && e.t >= from
        })
        .map(|e| e.t)
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))))
}

/// Truth TTFP of a `policy` probe: from the source's `readiness_ok` until the path is up
/// (both endpoints programmed, peer routes) **and** the target's node admits the source
/// **and** the source's node admits the target (its egress policy), floored at 0.
fn policy_truth_ttfp(truth: &[TruthEvent], p: &Value) -> Option<f64> {
    let (s, t) = (p["source"]["uid"].as_str()?, p["target"]["uid"].as_str()?);
    let (sn, tn) = (p["source"]["node"].as_str()?, p["target"]["node"].as_str()?);
    let ready = truth
        .iter()
        .filter(|e| e.event == TruthKind::ReadinessOk && e.uid.as_deref() == Some(s))
        .map(|e| e.t)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))?;
    let path = path_up_from(truth, s, t, ready)?;
    let ingress = policy_event(truth, TruthKind::PolicyProgrammed, tn, s, 0.0)?;
    let egress = policy_event(truth, TruthKind::PolicyProgrammed, sn, t, 0.0)?;
    Some((path.max(ingress).max(egress) - ready).max(0.0))
}

/// Each `policy` probe's TTFP against its truth, within [−50 ms, dial interval + 50 ms];
/// returns the errors.
fn check_policy(truth: &[TruthEvent], report: &Value, out: &str) -> Vec<f64> {
    let mut errs = Vec::new();
    for p in of_kind(report, "policy") {
        let got = p["ttfp_seconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("no TTFP: {p:#}\n{out}"));
        let want = policy_truth_ttfp(truth, &p).unwrap_or_else(|| panic!("no truth for {p:#}"));
        let err = got - want;
        eprintln!(
            "policy {}: ttfp {got:.3} truth {want:.3} error {:+.0} ms",
            p["id"],
            err * 1e3
        );
        assert!(
            (-0.05..=DIAL_INTERVAL + 0.05).contains(&err),
            "policy TTFP {got:.3} vs truth {want:.3}: {p:#}"
        );
        let iso = &p["policy"]["isolation"];
        assert_eq!(iso["checked"], true, "{iso:#}");
        errs.push(err);
    }
    errs
}

/// Each `policy_change` probe's admission and revocation against the truth on the
/// target's node, from the moments the prober's create and delete returned.
fn check_policy_change(truth: &[TruthEvent], report: &Value, out: &str) {
    for p in of_kind(report, "policy_change") {
        let (s, tn) = (
            p["source"]["uid"].as_str().unwrap(),
            p["target"]["node"].as_str().unwrap(),
        );
        let pol = &p["policy"];
        let created = pol["allow_created_unix"]
            .as_f64()
            .unwrap_or_else(|| panic!("{p:#}\n{out}"));
        let deleted = pol["allow_deleted_unix"]
            .as_f64()
            .unwrap_or_else(|| panic!("{p:#}\n{out}"));
        let admitted = policy_event(truth, TruthKind::PolicyProgrammed, tn, s, created - 1.0)
            .unwrap_or_else(|| panic!("no policy_programmed for {s} on {tn}: {p:#}"));
        let revoked = policy_event(truth, TruthKind::PolicyRevoked, tn, s, deleted - 1.0)
            .unwrap_or_else(|| panic!("no policy_revoked for {s} on {tn}: {p:#}"));
        let raw = p["raw_ttfp_seconds"].as_f64().expect("admission");
        let err_a = raw - (admitted - created);
        let got_r = pol["revoked_seconds"].as_f64().expect("revocation");
        let err_r = got_r - (revoked - deleted);
        eprintln!(
            "policy_change {}: admitted {raw:.3} truth {:.3} ({:+.0} ms); revoked {got_r:.3} truth {:.3} ({:+.0} ms)",
            p["id"],
            admitted - created,
            err_a * 1e3,
            revoked - deleted,
            err_r * 1e3
        );
        assert!(
            (-0.05..=DIAL_INTERVAL + 0.05).contains(&err_a),
            "admission error {err_a:+.3}: {p:#}"
        );
        assert!(
            (-0.05..=DIAL_INTERVAL + 0.05).contains(&err_r),
            "revocation error {err_r:+.3}: {p:#}"
        );
    }
}

#[test]
fn policy_kinds_match_truth_and_each_policy_fault_is_caught() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let healthy = "rules:\n  - nodes: {all: true}\n    program_delay: 200ms\n";
    let tb = Testbed::up("policy", 3, healthy, &[]);
    let gate = |extra: &[&str]| {
        let mut args = vec!["--hold", "1s", "--concurrency", "2"];
        args.extend_from_slice(extra);
        tb.gate(&args)
    };

    // Healthy: both kinds pass; TTFP, admission and revocation match truth; isolation holds.
    let (code, report, out) = gate(&["--kinds", "policy,policy_change", "--pairs", "2"]);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    check_policy(&truth, &report, &out);
    check_policy_change(&truth, &report, &out);
    for p in probes(&report) {
        assert_eq!(p["result"], "success", "{p:#}");
        assert_eq!(
            p["policy"]["isolation"]["admitted"].as_u64().unwrap_or(0),
            0,
            "{p:#}"
        );
    }
    assert!(!out.contains("SECURITY"), "{out}");
    let left = tb.kubectl(&["get", "netpol", "-A", "-o", "name"]);
    assert!(left.trim().is_empty(), "policies left: {left}");

    // policy_delay: 4s on every node: every admission ~4 s late (the `policy` source's
    // Ready comes about a second into it), measured as such: slow over 2 s.
    tb.set_fault(
        "rules:\n  - nodes: {all: true}\n    program_delay: 200ms\n    policy_delay: 4s\n",
    );
    let (code, report, out) = gate(&[
        "--kinds",
        "policy,policy_change",
        "--pairs",
        "1",
        "--slow-threshold",
        "2s",
    ]);
    // Slow, not failed: under `--max-ttfp` (5 s) the verdict passes.
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    for err in check_policy(&truth, &report, &out) {
        assert!(err.abs() < 0.2);
    }
    check_policy_change(&truth, &report, &out);
    for p in probes(&report) {
        assert_eq!(
            (p["result"].as_str(), p["reason"].as_str()),
            (Some("slow"), Some("ttfp_over_threshold")),
            "{p:#}"
        );
        assert!(p["ttfp_seconds"].as_f64().unwrap() > 2.5, "{p:#}");
    }

    // policy_never: 1: the source is never admitted.
    tb.set_fault("rules:\n  - nodes: {all: true}\n    program_delay: 200ms\n    policy_never: 1\n");
    let (code, report, out) = gate(&[
        "--kinds",
        "policy,policy_change",
        "--pairs",
        "1",
        "--give-up",
        "4s",
    ]);
    assert_eq!(code, 1, "{out}");
    for p in probes(&report) {
        assert_eq!(
            (p["result"].as_str(), p["reason"].as_str()),
            (Some("failed"), Some("no_success_before_give_up")),
            "{p:#}"
        );
    }

    // isolation_lag: 3s: a new isolated pod answers anyone for 3 s: the intruder gets in.
    tb.set_fault(
        "rules:\n  - nodes: {all: true}\n    program_delay: 200ms\n    isolation_lag: 3s\n",
    );
    let (code, report, out) = gate(&["--kinds", "policy", "--pairs", "2"]);
    assert_eq!(code, 1, "{out}");
    for p in probes(&report) {
        assert_eq!(
            (p["result"].as_str(), p["reason"].as_str()),
            (Some("failed"), Some("isolation_breach")),
            "{p:#}"
        );
        assert!(
            p["policy"]["isolation"]["admitted"].as_u64().unwrap_or(0) >= 1,
            "{p:#}"
        );
    }
    assert!(
        out.contains("SECURITY: NetworkPolicy isolation breached in 2 probe(s)"),
        "{out}"
    );
    let left = tb.kubectl(&["get", "netpol", "-A", "-o", "name"]);
    assert!(left.trim().is_empty(), "policies left: {left}");
}
