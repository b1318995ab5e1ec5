//! End-to-end: the NetworkPolicy kinds (issue 32), `prober gate --kinds
//! policy,policy_change`, on a testbed whose simulated agent enforces NetworkPolicy in
//! the nodes' nftables, with its policy faults (docs/src/testbed.md). One testbed, one gate
//! per fault; every timing is compared with the testbed's truth (`policy_programmed`,
//! `policy_revoked`: the moment a node's ruleset starts / stops admitting the peer).
//! Real Felix as the judge of the same probes: `e2e_policy_felix.rs`.

mod common;

use common::policy::{check_policy, check_policy_change, probes, Egress};
use common::{validate, Testbed, SERIAL};

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
    check_policy(&truth, &report, &out, Egress::Line);
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
    for (_, _, err) in check_policy(&truth, &report, &out, Egress::Line) {
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
