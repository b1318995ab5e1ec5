//! End-to-end: every path a new pod depends on (issue 33) — `prober gate --protocols
//! tcp,udp --payload mtu [--ip-families …]` on the simulated agent: healthy, each path's
//! TTFP against the testbed's truth; a family the pods lack is `family_missing`; and each
//! path fault of the simulated agent (`encap_mtu`, `proto_drop`: docs/src/faults.md) caught
//! on the right path with the gate failing, the unaffected paths passing. The real
//! lowered link MTU on the all-real stack is `e2e_real_nodes.rs`' (a real Felix must
//! not run in the second CI lane, where this binary runs).

mod common;

use common::paths::{assert_only_cross_node_paths_fail, gate_every_path, paths, paths_near_truth};
use common::{validate, Testbed, SERIAL};
use testbed::plan::IpFamily;

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

    // encap_mtu: 1400 (pod MTU 1500): cross-node packets over 1400 bytes vanish without
    // an ICMP. Small packets pass on both protocols; the full-size paths fail as MTU
    // black holes on every cross-node probe and pass on the same-node control, so the
    // diagnosis is cross-node.
    let faults = [
        (
            "encap_mtu: 1400",
            ["tcp/ipv4/mtu", "udp/ipv4/mtu"],
            "mtu_black_hole",
        ),
        (
            "proto_drop: {protocols: [udp], cross_node: true}",
            ["udp/ipv4/small", "udp/ipv4/mtu"],
            "no_success_before_give_up",
        ),
    ];
    for (fault, broken, reason) in faults {
        tb.set_fault(&format!(
            "rules:\n  - nodes: {{all: true}}\n    program_delay: 200ms\n    {fault}\n"
        ));
        let (code, report, out) = gate_every_path(&tb, 3, &[]);
        assert_eq!(code, 1, "{fault} must fail the gate: {out}");
        assert_eq!(paths(&report).len(), 6 * 4, "{fault}\n{out}");
        assert_only_cross_node_paths_fail(&report, &broken, reason, &out);
        for p in report["probes"].as_array().unwrap() {
            if p["kind"] == "cross_node" {
                assert_eq!(
                    (p["result"].as_str(), p["reason"].as_str()),
                    (Some("failed"), Some(reason)),
                    "{p:#}"
                );
                assert!(
                    p["detail"].as_str().unwrap_or("").contains(broken[0]),
                    "the detail names the path: {p:#}"
                );
            }
        }
    }
}

/// A dual-stack testbed (`testbed up --ip-families ipv4,ipv6`): S1 passes per family,
/// every path within tolerance of truth; `family_broken: ipv6` (the nodes' IPv6 routes
/// to their peers' pod blocks gone) fails only the cross-node IPv6 paths, the IPv4 ones
/// and the same-node control pass.
#[test]
fn a_dual_stack_testbed_passes_per_family_and_a_broken_family_fails_only_its_paths() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "paths-ds",
        3,
        "rules:\n  - nodes: {all: true}\n    agent: {gates_readiness: false}\n    program_delay: 2s\n",
        &["--ip-families", "ipv4,ipv6"],
    );
    let gate = || gate_every_path(&tb, 3, &["--ip-families", "ipv4,ipv6"]);
    let (code, report, out) = gate();
    assert_eq!(code, 0, "S1 on a dual-stack testbed: {out}");
    let got = paths(&report);
    assert_eq!(got.len(), 6 * 8, "{got:?}\n{out}");
    let v6: Vec<&(String, String, String, String)> =
        got.iter().filter(|p| p.1.contains("/ipv6/")).collect();
    assert_eq!(v6.len(), 6 * 4, "{out}");
    for (kind, path, result, reason) in &got {
        assert_eq!(
            (result.as_str(), reason.as_str()),
            ("success", "none"),
            "{kind} {path}\n{out}"
        );
    }
    paths_near_truth(&tb.truth(), &report, &out);

    tb.set_fault(
        "rules:\n  - nodes: {all: true}\n    agent: {gates_readiness: false}\n    program_delay: 200ms\n    family_broken: ipv6\n",
    );
    let (code, report, out) = gate();
    assert_eq!(code, 1, "{out}");
    assert_only_cross_node_paths_fail(
        &report,
        &[
            "tcp/ipv6/small",
            "tcp/ipv6/mtu",
            "udp/ipv6/small",
            "udp/ipv6/mtu",
        ],
        "no_success_before_give_up",
        &out,
    );
    // The truth agrees per family: the IPv6 routes between the nodes are gone (never
    // up again while the fault holds), the IPv4 path is up.
    let truth = tb.truth();
    for p in report["probes"].as_array().expect("probes") {
        let (s, t) = (
            p["source"]["uid"].as_str().unwrap(),
            p["target"]["uid"].as_str().unwrap(),
        );
        let v6 = testbed::truth::truth_family_ttfp(&truth, s, t, IpFamily::Ipv6);
        assert!(testbed::truth::truth_ttfp(&truth, s, t).is_some(), "{p:#}");
        assert_eq!(
            v6.is_none(),
            p["kind"] == "cross_node",
            "{} IPv6 truth {v6:?}",
            p["id"]
        );
    }
}
