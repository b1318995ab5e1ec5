//! Checks of the NetworkPolicy kinds (issue 32) against the testbed's truth
//! (`policy_programmed` / `policy_revoked`: the moment a node's ruleset starts / stops
//! admitting a peer to an isolated pod), shared by the simulated agent's tests
//! (`e2e_policy.rs`) and real Felix's (`e2e_policy_felix.rs`).

use serde_json::Value;
use testbed::truth::{path_up_from, TruthEvent, TruthKind};

/// The gates' `--dial-interval` (the default).
pub const DIAL_INTERVAL: f64 = 0.1;

pub fn probes(report: &Value) -> Vec<Value> {
    report["probes"].as_array().cloned().unwrap_or_default()
}

pub fn of_kind(report: &Value, kind: &str) -> Vec<Value> {
    probes(report)
        .into_iter()
        .filter(|p| p["kind"] == kind)
        .collect()
}

/// The first `kind` event on `node` admitting (or no longer admitting) `peer` (a UID) to
/// or from the isolated pod `pod`, at or after `from`.
pub fn policy_event(
    truth: &[TruthEvent],
    kind: TruthKind,
    node: &str,
    pod: &str,
    peer: &str,
    from: f64,
) -> Option<f64> {
    policy_event_window(truth, kind, node, pod, peer, from).map(|(t, _)| t)
}

/// [`policy_event`] with the earliest moment the change can have happened: the
/// event's `detail.not_before` (real Felix: the IP set read before the one that saw
/// it), else its `t` (the simulated agent's and a rule commit's are exact).
pub fn policy_event_window(
    truth: &[TruthEvent],
    kind: TruthKind,
    node: &str,
    pod: &str,
    peer: &str,
    from: f64,
) -> Option<(f64, f64)> {
    truth
        .iter()
        .filter(|e| {
            e.event == kind
                && e.node.as_deref() == Some(node)
                && e.pod.as_deref() == Some(pod)
                && e.uid.as_deref() == Some(peer)
                && e.t >= from
        })
        .min_by(|a, b| a.t.total_cmp(&b.t))
        .map(|e| {
            let early = e.detail["not_before"].as_f64().unwrap_or(e.t);
            (e.t, early.min(e.t))
        })
}

/// How the source's egress `ipBlock` admission shows in the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    /// Its own `policy_programmed` line on the source's node (the simulated agent).
    Line,
    /// Within the source's `endpoint_programmed` (real Felix renders an `ipBlock` as a
    /// CIDR match in the endpoint's own policy chains, written before the endpoint is
    /// dispatched; no IP set, no line of its own).
    WithEndpoint,
}

/// Truth TTFP of a `policy` probe: from the source's `readiness_ok` until the path is up
/// (both endpoints programmed, peer routes) **and** the target's node admits the source
/// **and** the source's node admits the target (its egress policy), floored at 0; with
/// how much earlier it can have been (seconds: the admission's resolution when it is
/// the last part to come up, [`policy_event_window`]; 0 otherwise).
pub fn policy_truth_ttfp(truth: &[TruthEvent], p: &Value, egress: Egress) -> Option<(f64, f64)> {
    let (s, t) = (p["source"]["uid"].as_str()?, p["target"]["uid"].as_str()?);
    let (sn, tn) = (p["source"]["node"].as_str()?, p["target"]["node"].as_str()?);
    let (sp, tp) = (p["source"]["pod"].as_str()?, p["target"]["pod"].as_str()?);
    let ready = truth
        .iter()
        .filter(|e| e.event == TruthKind::ReadinessOk && e.uid.as_deref() == Some(s))
        .map(|e| e.t)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))?;
    let path = path_up_from(truth, s, t, ready)?;
    let (ingress, ingress_early) =
        policy_event_window(truth, TruthKind::PolicyProgrammed, tn, tp, s, 0.0)?;
    let egress = match egress {
        Egress::Line => policy_event(truth, TruthKind::PolicyProgrammed, sn, sp, t, 0.0)?,
        Egress::WithEndpoint => path,
    };
    let up = path.max(ingress).max(egress);
    let earliest = path.max(ingress_early).max(egress);
    let want = (up - ready).max(0.0);
    Some((want, want - (earliest - ready).max(0.0)))
}

/// Each `policy` probe's TTFP against its truth, within [−50 ms, dial interval + 50 ms],
/// its isolation checked; returns (probe, TTFP, error) of each.
pub fn check_policy(
    truth: &[TruthEvent],
    report: &Value,
    out: &str,
    egress: Egress,
) -> Vec<(Value, f64, f64)> {
    let mut errs = Vec::new();
    for p in of_kind(report, "policy") {
        let got = p["ttfp_seconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("no TTFP: {p:#}\n{out}"));
        let (want, early) =
            policy_truth_ttfp(truth, &p, egress).unwrap_or_else(|| panic!("no truth for {p:#}"));
        let err = got - want;
        eprintln!(
            "policy {} ({} → {}): ttfp {got:.3} truth {want:.3} (resolution {:.0} ms) error {:+.0} ms",
            p["id"],
            p["source"]["node"],
            p["target"]["node"],
            early * 1e3,
            err * 1e3
        );
        // Early by at most the truth's own resolution (the admission happened between
        // two reads of the node's IP sets) plus 50 ms.
        assert!(
            (-0.05 - early..=DIAL_INTERVAL + 0.05).contains(&err),
            "policy TTFP {got:.3} vs truth {want:.3} (resolution {early:.3}): {p:#}"
        );
        let iso = &p["policy"]["isolation"];
        assert_eq!(iso["checked"], true, "{iso:#}");
        errs.push((p.clone(), got, err));
    }
    errs
}

/// Each `policy_change` probe's admission and revocation against the truth on the
/// target's node, from the moments the prober's create and delete returned; returns
/// each probe's truth admission (seconds after the create).
pub fn check_policy_change(truth: &[TruthEvent], report: &Value, out: &str) -> Vec<f64> {
    let mut admissions = Vec::new();
    for p in of_kind(report, "policy_change") {
        let (s, tn, tp) = (
            p["source"]["uid"].as_str().unwrap(),
            p["target"]["node"].as_str().unwrap(),
            p["target"]["pod"].as_str().unwrap(),
        );
        let pol = &p["policy"];
        let created = pol["allow_created_unix"]
            .as_f64()
            .unwrap_or_else(|| panic!("{p:#}\n{out}"));
        let deleted = pol["allow_deleted_unix"]
            .as_f64()
            .unwrap_or_else(|| panic!("{p:#}\n{out}"));
        let admitted = policy_event(truth, TruthKind::PolicyProgrammed, tn, tp, s, created - 1.0)
            .unwrap_or_else(|| panic!("no policy_programmed for {s} on {tn}: {p:#}"));
        let revoked = policy_event(truth, TruthKind::PolicyRevoked, tn, tp, s, deleted - 1.0)
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
        admissions.push(admitted - created);
    }
    admissions
}
