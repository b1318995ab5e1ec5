//! Real Calico Felix as the judge of the NetworkPolicy kinds (issue 32): `prober gate
//! --kinds policy,policy_change` on `testbed up --control-plane real --agent calico
//! --kube-proxy real`, every timing compared with the truth read from the nodes' real
//! state (`policy_programmed` / `policy_revoked` from Felix's IP sets and the rules that
//! match them, testbed/src/ipset_watch.rs): healthy, a slow Felix on the target's node
//! (`agent_io: {delay: 2s}`), and 400 NetworkPolicies active on every node (`policies:
//! 400`). Felix isolates a new pod from its first instant: no `isolation_breach`.
//!
//! Needs root, the real control plane and a Felix build (see `e2e_calico.rs`); prints
//! `SKIPPED` and passes when they are missing.

mod common;

use common::policy::{check_policy, check_policy_change, of_kind, probes, Egress};
use common::{node_ips, poll_until, sample, validate, Testbed, SERIAL};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use testbed::calico::{Builds, DEFAULT_VERSION};

/// Every node's Felix (`felix_int_dataplane_apply_time_seconds` sum, count) and
/// `felix_active_local_policies`.
fn felix_state(tb: &Testbed, ips: &BTreeMap<String, String>) -> BTreeMap<String, [f64; 3]> {
    ips.iter()
        .map(|(n, ip)| {
            let page = common::curl(tb, &format!("http://{ip}:9091/metrics")).unwrap_or_default();
            let v = |name| sample(&page, name).unwrap_or(f64::NAN);
            (
                n.clone(),
                [
                    v("felix_int_dataplane_apply_time_seconds_sum"),
                    v("felix_int_dataplane_apply_time_seconds_count"),
                    v("felix_active_local_policies"),
                ],
            )
        })
        .collect()
}

/// Mean apply time (s) across nodes between two [`felix_state`] readings.
fn mean_apply(a: &BTreeMap<String, [f64; 3]>, b: &BTreeMap<String, [f64; 3]>) -> f64 {
    let (mut sum, mut count) = (0.0, 0.0);
    for (n, x) in b {
        let y = a[n];
        sum += x[0] - y[0];
        count += x[1] - y[1];
    }
    sum / count.max(1.0)
}

/// No probe failed and none was an isolation breach; no policy of the prober left.
fn no_breach_nothing_left(tb: &Testbed, report: &Value, out: &str) {
    for p in probes(report) {
        assert_ne!(p["result"], "failed", "{p:#}\n{out}");
        assert_eq!(
            p["policy"]["isolation"]["admitted"].as_u64().unwrap_or(0),
            0,
            "{p:#}"
        );
    }
    assert!(!out.contains("SECURITY"), "{out}");
    let left = tb.kubectl(&["get", "netpol", "-n", "firstpacket", "-o", "name"]);
    assert!(left.trim().is_empty(), "policies left: {left}");
}

#[test]
fn policy_kinds_on_real_felix_match_the_ipset_truth_healthy_slow_and_under_400_policies() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = Builds::locate().require([DEFAULT_VERSION]) {
        eprintln!("SKIPPED: {e}");
        return;
    }
    let Some(tb) = Testbed::up_real(
        "policy-felix",
        3,
        "rules: []\n",
        &["--agent", "calico", "--kube-proxy", "real"],
    ) else {
        return;
    };
    let ips = node_ips(&tb);
    let gate = |kinds: &str, extra: &[&str]| {
        let mut args = vec![
            "--hold",
            "1s",
            "--concurrency",
            "2",
            "--kinds",
            kinds,
            "--pairs",
            "3",
        ];
        args.extend_from_slice(extra);
        tb.gate(&args)
    };

    // Healthy (S1): both kinds pass; TTFP, admission and revocation match the truth.
    let before = felix_state(&tb, &ips);
    let (code, report, out) = gate("policy,policy_change", &[]);
    let after = felix_state(&tb, &ips);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    check_policy(&truth, &report, &out, Egress::WithEndpoint);
    let healthy_admissions = check_policy_change(&truth, &report, &out);
    for p in probes(&report) {
        assert_eq!(p["result"], "success", "{p:#}");
    }
    no_breach_nothing_left(&tb, &report, &out);
    let healthy_apply = mean_apply(&before, &after);

    // A slow Felix on node-2 (every dataplane write 2 s late): a new source is admitted
    // on node-2 at least one such write after its IP is known — ~1 s after its Ready
    // when node-2's Felix is idle, several seconds when the write queues behind the
    // target's own endpoint programming on node-2 (seen in CI: 4.06 s, truth 3.98 s) —
    // and the probe says so, matching the ruleset's truth (`check_policy`); healthy
    // admissions are ~0 s.
    tb.set_fault("rules:\n  - nodes: {names: [node-2]}\n    agent_io: {delay: 2s}\n");
    // A node-2 pod's own programming takes several such writes (up to ~6 s, before its
    // Ready): the gate rightly judges that (slow, and over --max-ttfp's 5 s p95), but it
    // is not what this checks, so both limits are raised.
    let (code, report, out) = gate("policy", &["--slow-threshold", "15s", "--max-ttfp", "15s"]);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    let checked = check_policy(&truth, &report, &out, Egress::WithEndpoint);
    let (p, ttfp, _) = checked
        .iter()
        .find(|(p, _, _)| p["target"]["node"] == "node-2")
        .unwrap_or_else(|| panic!("no policy probe targets node-2: {report:#}"));
    assert!(
        *ttfp >= 0.5,
        "TTFP {ttfp:.3} s into node-2 under agent_io 2s shows no delayed write: {p:#}"
    );
    no_breach_nothing_left(&tb, &report, &out);
    tb.set_fault("rules: []\n");

    // policies: 400, active on every node (each with a set holding every pod's IP): in
    // Felix's state and apply time, and in policy_change's admission; no false failure.
    tb.set_fault("rules:\n  - nodes: {all: true}\n    policies: 400\n");
    let loaded = poll_until(
        Duration::from_secs(90),
        || felix_state(&tb, &ips),
        |s| s.values().all(|v| v[2] >= 400.0),
    );
    assert!(
        loaded.values().all(|v| v[2] >= 400.0),
        "felix_active_local_policies: {loaded:?}"
    );
    let before = felix_state(&tb, &ips);
    let (code, report, out) = gate("policy,policy_change", &[]);
    let after = felix_state(&tb, &ips);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    check_policy(&truth, &report, &out, Egress::WithEndpoint);
    let loaded_admissions = check_policy_change(&truth, &report, &out);
    no_breach_nothing_left(&tb, &report, &out);
    let loaded_apply = mean_apply(&before, &after);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    eprintln!(
        "Felix mean apply time {:.1} ms healthy, {:.1} ms under 400 policies; policy_change admission (truth) {:.1} ms vs {:.1} ms; policy_change TTFP {:?}",
        healthy_apply * 1e3,
        loaded_apply * 1e3,
        mean(&healthy_admissions) * 1e3,
        mean(&loaded_admissions) * 1e3,
        of_kind(&report, "policy_change")
            .iter()
            .map(|p| p["ttfp_seconds"].as_f64())
            .collect::<Vec<_>>()
    );
    assert!(
        loaded_apply > healthy_apply,
        "400 active policies do not show in Felix's apply time: {loaded_apply:.4} s vs {healthy_apply:.4} s"
    );
    tb.set_fault("rules: []\n");
}
