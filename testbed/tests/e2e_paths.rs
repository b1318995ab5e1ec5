//! End-to-end: every path a new pod depends on (issue 33) — `prober gate --protocols
//! tcp,udp --payload mtu [--ip-families …]` on the simulated agent: healthy, each path's
//! TTFP against the testbed's truth; a family the pods lack is `family_missing`; and each
//! path fault (`encap_mtu`, `proto_drop`, `link_mtu`: docs/src/testbed.md) caught on the
//! right path with the gate failing, the unaffected paths passing.

mod common;

use common::{validate, Testbed, DIAL_INTERVAL, SERIAL};
use serde_json::Value;

/// `protocol/family/payload` of a record's path.
fn id(p: &Value) -> String {
    format!(
        "{}/{}/{}",
        p["protocol"].as_str().unwrap_or("?"),
        p["family"].as_str().unwrap_or("?"),
        p["payload"].as_str().unwrap_or("?")
    )
}

/// Every probe's paths as (kind, path, result, reason).
fn paths(report: &Value) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for p in report["probes"].as_array().expect("probes") {
        for x in p["paths"].as_array().cloned().unwrap_or_default() {
            out.push((
                p["kind"].as_str().unwrap_or("").to_string(),
                id(&x),
                x["result"].as_str().unwrap_or("").to_string(),
                x["reason"].as_str().unwrap_or("none").to_string(),
            ));
        }
    }
    out
}

/// Each successful path's TTFP within [−50 ms, dial interval + 50 ms] of the probe's
/// truth TTFP (the pair's dataplane is one for every protocol and size).
fn paths_near_truth(tb: &Testbed, report: &Value, out: &str) {
    let truth = tb.truth();
    for p in report["probes"].as_array().expect("probes") {
        let want = testbed::truth::truth_ttfp(
            &truth,
            p["source"]["uid"].as_str().unwrap(),
            p["target"]["uid"].as_str().unwrap(),
        )
        .unwrap_or_else(|| panic!("no truth for {p:#}"));
        for x in p["paths"].as_array().expect("paths") {
            let Some(t) = x["ttfp_seconds"].as_f64() else {
                continue;
            };
            let err = t - want;
            eprintln!(
                "{} {} {}: ttfp {t:.3} truth {want:.3} error {:+.0} ms",
                p["kind"],
                p["id"],
                id(x),
                err * 1000.0
            );
            assert!(
                (-0.05..=DIAL_INTERVAL + 0.05).contains(&err),
                "{} path {}: TTFP {t:.3}s vs truth {want:.3}s\n{out}",
                p["id"],
                id(x)
            );
        }
    }
}

#[test]
fn every_path_passes_healthy_and_a_missing_family_is_family_missing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "paths",
        3,
        // A CNI that does not gate readiness (on by default, as Calico does): the
        // programming then lands after Ready, and every path waits for it.
        "rules:\n  - nodes: {all: true}\n    agent: {gates_readiness: false}\n    program_delay: 2s\n",
        &[],
    );
    let (code, report, out) = tb.gate(&[
        "--kinds",
        "cross_node,same_node",
        "--pairs",
        "2",
        "--hold",
        "1s",
        "--protocols",
        "tcp,udp",
        "--payload",
        "mtu",
    ]);
    validate(&report);
    assert_eq!(code, 0, "{out}");
    let got = paths(&report);
    assert_eq!(got.len(), 4 * 4, "four paths per probe: {got:?}\n{out}");
    for (kind, path, result, reason) in &got {
        assert_eq!(
            (result.as_str(), reason.as_str()),
            ("success", "none"),
            "{kind} {path}\n{out}"
        );
    }
    paths_near_truth(&tb, &report, &out);
    assert!(
        out.contains("udp/ipv4/mtu"),
        "the text lists the paths:\n{out}"
    );

    // IPv6 asked of single-stack pods: its paths are inconclusive, never guessed, and
    // the IPv4 ones still pass.
    let (code, report, out) = tb.gate(&[
        "--kinds",
        "cross_node",
        "--pairs",
        "1",
        "--hold",
        "1s",
        "--protocols",
        "udp",
        "--ip-families",
        "ipv4,ipv6",
    ]);
    validate(&report);
    assert_ne!(code, 0, "{out}");
    let got = paths(&report);
    let want: Vec<(String, String, String, String)> = [
        ("tcp/ipv4/small", "success", "none"),
        ("udp/ipv4/small", "success", "none"),
        ("udp/ipv6/small", "inconclusive", "family_missing"),
    ]
    .iter()
    .map(|(p, r, why)| {
        (
            "cross_node".into(),
            p.to_string(),
            r.to_string(),
            why.to_string(),
        )
    })
    .collect();
    assert_eq!(got, want, "{out}");
    assert_eq!(report["probes"][0]["reason"], "family_missing", "{out}");
}
