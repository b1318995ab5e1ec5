//! End-to-end: every path a new pod depends on (issue 33) — `prober gate --protocols
//! tcp,udp --payload mtu [--ip-families …]` on the simulated agent: healthy, each path's
//! TTFP against the testbed's truth; a family the pods lack is `family_missing`; and each
//! path fault (`encap_mtu`, `proto_drop`, `link_mtu`: docs/src/testbed.md) caught on the
//! right path with the gate failing, the unaffected paths passing.

mod common;

use common::paths::{paths, paths_near_truth};
use common::{validate, Testbed, SERIAL};

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
    paths_near_truth(&tb.truth(), &report, &out);
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
