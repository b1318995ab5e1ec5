//! Checks of the per-path results (issue 33: `--protocols`, `--payload`,
//! `--ip-families`) against the testbed's truth, shared by the simulated agent's tests
//! (`e2e_paths.rs`) and the all-real stack's (`e2e_real_nodes.rs`).

use super::DIAL_INTERVAL;
use serde_json::Value;
use testbed::truth::TruthEvent;

/// `protocol/family/payload` of a record's path.
pub fn id(p: &Value) -> String {
    format!(
        "{}/{}/{}",
        p["protocol"].as_str().unwrap_or("?"),
        p["family"].as_str().unwrap_or("?"),
        p["payload"].as_str().unwrap_or("?")
    )
}

/// Every probe's paths as (kind, path, result, reason).
pub fn paths(report: &Value) -> Vec<(String, String, String, String)> {
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

/// Each successful path's TTFP within [−50 ms, dial interval + 50 ms] of the pair's
/// truth TTFP in the path's family (one dataplane carries every protocol and size), TCP
/// ones with a
/// retransmission count and UDP ones without.
pub fn paths_near_truth(truth: &[TruthEvent], report: &Value, out: &str) {
    for p in report["probes"].as_array().expect("probes") {
        for x in p["paths"].as_array().expect("paths") {
            let Some(t) = x["ttfp_seconds"].as_f64() else {
                continue;
            };
            let family = x["family"].as_str().unwrap().parse().expect("a family");
            let want = testbed::truth::truth_family_ttfp(
                truth,
                p["source"]["uid"].as_str().unwrap(),
                p["target"]["uid"].as_str().unwrap(),
                family,
            )
            .unwrap_or_else(|| panic!("no {family} truth for {p:#}"));
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
            // A TCP path's first success carries the kernel's retransmission count from
            // the source's own socket; UDP has none.
            assert_eq!(
                x["retransmits"].is_u64(),
                x["protocol"] == "tcp",
                "{} path {}: retransmits {}",
                p["id"],
                id(x),
                x["retransmits"]
            );
        }
    }
}

/// `prober gate --kinds cross_node,same_node --pairs PAIRS --hold 1s --give-up 5s
/// --protocols tcp,udp --payload mtu EXTRA…`: every path of the pod-to-pod kinds, four
/// per probe and family, a failing path given up after 5 s (unless EXTRA has its own
/// `--give-up`).
pub fn gate_every_path(tb: &super::Testbed, pairs: usize, extra: &[&str]) -> (i32, Value, String) {
    let pairs = pairs.to_string();
    let mut args = vec![
        "--kinds",
        "cross_node,same_node",
        "--pairs",
        &pairs,
        "--hold",
        "1s",
        "--protocols",
        "tcp,udp",
        "--payload",
        "mtu",
    ];
    if !extra.contains(&"--give-up") {
        args.extend_from_slice(&["--give-up", "5s"]);
    }
    args.extend_from_slice(extra);
    let (code, report, out) = tb.gate(&args);
    super::validate(&report);
    (code, report, out)
}

/// Asserts that exactly the `broken` paths (`protocol/family/payload`) of every
/// `cross_node` probe failed with `reason`, and every other path of the report (the
/// same-node control's included) succeeded; and that the diagnosis is
/// `cross_node_broken`.
pub fn assert_only_cross_node_paths_fail(report: &Value, broken: &[&str], reason: &str, out: &str) {
    for (kind, path, result, why) in paths(report) {
        let hit = kind == "cross_node" && broken.contains(&path.as_str());
        let want = if hit {
            ("failed", reason)
        } else {
            ("success", "none")
        };
        assert_eq!(
            (result.as_str(), why.as_str()),
            want,
            "{kind} {path}\n{out}"
        );
    }
    assert_eq!(report["summary"]["diagnosis"], "cross_node_broken", "{out}");
}
