//! Every fault primitive of docs/design.md §5 on real traffic between network namespaces, the
//! Felix-compatible metrics page, and the docs/scenarios.md fault files. Needs root, `ip`,
//! `nft` and (for `clock_skew`) Debian's `libfaketime`. Scenarios run one at a time (a
//! static lock) in their own state dir and always tear down (drop guard), checked to
//! leave no netns behind; the harness is in `netns_support`.

mod netns_support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netns_support::{
    dial, dial6, dial_within, first_success, poll_until, rt, serve, serve_any, Bed, Server,
    EFFECT_TIMEOUT,
};
use testbed::dataplane::{NetFaults, PodNet};
use testbed::fault::{FaultFile, Faults};
use testbed::felix::{bind_and_serve, FELIX_METRICS_PORT};
use testbed::netns::{run_in_netns, NetnsThread};
use testbed::plan::IpFamily;
use testbed::truth::{read_truth, truth_family_ttfp, truth_ttfp, unix_now, TruthEvent, TruthKind};

/// One scenario's testbed with `nodes` nodes, checked on drop to leave no netns behind.
fn new_bed(name: &str, nodes: usize) -> Bed {
    Bed::new("fp-faults", name, nodes).checking_leftovers()
}

fn faults(yaml: &str) -> Faults {
    Faults::new(FaultFile::parse(yaml).expect("fault file"))
}

fn fault_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("faults")
        .join(name)
}

fn scenario(name: &str) -> FaultFile {
    let text = std::fs::read_to_string(fault_file(name)).expect("read fault file");
    FaultFile::parse(&text).expect("parse scenario file")
}

#[test]
fn queue_programs_a_burst_one_after_another() {
    let bed = new_bed("queue", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-2]}\n  queue: {per_endpoint: 300ms}\n");
    let ag = bed.agents(&f, &[]);
    let added = unix_now();
    let pods: Vec<PodNet> = (0..4)
        .map(|i| bed.add(&ag[1], 1, &format!("q{i}")))
        .collect();
    let _servers: Vec<Server> = pods.iter().map(|p| serve(&p.netns, &p.pod)).collect();
    let last = pods.last().expect("pods");
    // Half-way through the burst the last endpoint is not programmed yet (a check that
    // something has NOT happened: a bounded sleep to the middle of the burst).
    std::thread::sleep(Duration::from_millis(500));
    assert!(dial(&bed.plan.host_netns, last.ip).is_err());
    let success = first_success(
        &bed.plan.host_netns,
        last.ip,
        Duration::from_millis(20),
        Duration::from_secs(4),
    )
    .expect("last endpoint never reachable");
    let mut prog: Vec<f64> = pods
        .iter()
        .map(|p| bed.wait_programmed(&p.uid, Duration::from_secs(1)))
        .collect();
    prog.sort_by(f64::total_cmp);
    for (k, t) in prog.iter().enumerate() {
        let since = t - added;
        let want = 0.3 * (k + 1) as f64;
        assert!(
            since >= want - 0.02 && since < want + 0.25,
            "endpoint {k} programmed {since:.3} s after the burst (want ≈ {want:.1})"
        );
    }
    assert!(
        (success - prog[3]).abs() < 0.2,
        "first success {:.3} vs programmed {:.3}",
        success - added,
        prog[3] - added
    );
}

#[test]
fn revoke_works_then_fails_at_the_configured_time() {
    let bed = new_bed("revoke", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-2]}\n  revoke: {after: 1s}\n");
    let ag = bed.agents(&f, &[]);
    let b = bed.add(&ag[1], 1, "b");
    let _s = serve(&b.netns, "b");
    let programmed = bed.wait_programmed(&b.uid, Duration::from_secs(2));
    let (mut last_ok, mut first_fail) = (None, None);
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end && first_fail.is_none() {
        let sent = unix_now();
        match dial_within(&bed.plan.host_netns, b.ip, Duration::from_millis(100)) {
            Ok(_) => last_ok = Some(sent),
            Err(_) if last_ok.is_some() => first_fail = Some(sent),
            Err(e) => panic!("failed before it ever worked: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let first_fail = first_fail.expect("never failed after revoke");
    let want = programmed + 1.0;
    assert!(
        (first_fail - want).abs() <= 0.1,
        "first failure {:.3} s after programming (want 1.0 ± 0.1)",
        first_fail - programmed
    );
    assert!(last_ok.is_some_and(|t| t < want + 0.05));
    // The agent logs the revoke right after the nft change: the failure may come first.
    let rev = bed.pod_events_until(TruthKind::EndpointRevoked, &b.uid, 1, EFFECT_TIMEOUT);
    assert_eq!(rev.len(), 1, "endpoint_revoked: {rev:?}");
    assert!(
        (rev[0].t - want).abs() < 0.1,
        "revoked at {:.3}",
        rev[0].t - programmed
    );
    // It stays revoked (nothing must happen: a bounded sleep, then one look).
    std::thread::sleep(Duration::from_millis(300));
    assert!(dial(&bed.plan.host_netns, b.ip).is_err());
    assert_eq!(ag[1].stats().revoked_total, 1);
}

#[test]
fn name_reuse_race_leaves_recreated_same_name_pod_unreachable_for_good() {
    // docs/scenarios.md S3 with its own fault file.
    let bed = new_bed("reuse", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = Faults::new(scenario("s3-name-reuse.yaml"));
    let ag = bed.agents(&f, &[]);
    let node2 = bed.node_ns(1);
    // First incarnation: once programmed (the agent gates readiness, as Calico does, so
    // not even its node reaches it before), reachable by its node and from outside.
    let first = bed.add(&ag[1], 1, "web-0");
    let s1 = serve(&first.netns, "web-0");
    bed.wait_programmed(&first.uid, Duration::from_secs(2));
    assert_eq!(dial(&node2, first.ip).as_deref(), Ok("web-0\n"));
    assert_eq!(
        dial(&bed.plan.host_netns, first.ip).as_deref(),
        Ok("web-0\n")
    );
    assert!(bed.events(TruthKind::RouteRemoved).is_empty());
    drop(s1);
    ag[1].endpoint_removed(&first);
    bed.dp.remove_pod(&first).expect("remove");

    // Recreated with the same name: same iface, /32 route removed for good.
    let second = bed.add(&ag[1], 1, "web-0");
    assert_eq!(second.iface, first.iface);
    let _s2 = serve(&second.netns, "web-0");
    let removed = bed.pod_events(TruthKind::RouteRemoved, &second.uid);
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].iface.as_deref(), Some(second.iface.as_str()));
    // A differently named pod on the same node works.
    let other = bed.add(&ag[1], 1, "other-0");
    let _so = serve(&other.netns, "other-0");
    bed.wait_programmed(&second.uid, Duration::from_secs(2));
    bed.wait_programmed(&other.uid, Duration::from_secs(2));
    assert_eq!(dial(&node2, other.ip).as_deref(), Ok("other-0\n"));
    assert_eq!(
        dial(&bed.plan.host_netns, other.ip).as_deref(),
        Ok("other-0\n")
    );
    // Even the kubelet (the node itself) cannot reach the recreated pod, programmed or not.
    assert!(dial(&node2, second.ip).is_err());
    assert!(dial(&bed.plan.host_netns, second.ip).is_err());
    // For good: clearing the fault does not bring the route back (nothing must happen:
    // a bounded sleep, then one look).
    ag[0].set_faults(FaultFile::default());
    std::thread::sleep(Duration::from_millis(300));
    assert!(dial(&node2, second.ip).is_err());
    // Recreate on node-1 (not selected): works.
    let n1a = bed.add(&ag[0], 0, "web-1");
    ag[0].endpoint_removed(&n1a);
    bed.dp.remove_pod(&n1a).expect("remove");
    let n1b = bed.add(&ag[0], 0, "web-1");
    let _s3 = serve(&n1b.netns, "web-1");
    bed.wait_programmed(&n1b.uid, Duration::from_secs(2));
    assert_eq!(dial(&bed.node_ns(0), n1b.ip).as_deref(), Ok("web-1\n"));
}

#[test]
fn first_connections_dropped_counts_from_readiness_then_fails_first_n_then_all_succeed() {
    let bed = new_bed("fcd", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-2]}\n  first_connections_dropped: 3\n");
    let ag = bed.agents(&f, &[]);
    let b = bed.add(&ag[1], 1, "b");
    let a = bed.add(&ag[0], 0, "a");
    let _s = serve(&b.netns, "b");
    bed.wait_programmed(&b.uid, Duration::from_secs(2));
    bed.wait_programmed(&a.uid, Duration::from_secs(2));
    let prog = bed.pod_events(TruthKind::EndpointProgrammed, &b.uid);
    assert_eq!(prog[0].detail["first_connections_dropped"], 3);
    // Before readiness_ok the budget is not armed: forwarded connections pass.
    assert!(dial_within(&a.netns, b.ip, Duration::from_millis(300)).is_ok());
    // The kubelet arms it right before the readiness probe that passes.
    assert_eq!(ag[1].arm_first_connections_dropped(&b), 3);
    assert_eq!(
        ag[0].arm_first_connections_dropped(&a),
        0,
        "no fault on node-1"
    );
    // The node's own connections (kubelet probes) are not forwarded: never dropped.
    assert!(dial(&bed.node_ns(1), b.ip).is_ok());
    let results: Vec<bool> = (0..8)
        .map(|_| dial_within(&a.netns, b.ip, Duration::from_millis(300)).is_ok())
        .collect();
    assert_eq!(
        results,
        vec![false, false, false, true, true, true, true, true],
        "first 3 new connections dropped, then all pass"
    );
    // Node-1's endpoint has no budget: its connections to a fresh node-1 pod pass at once.
    let c = bed.add(&ag[0], 0, "c");
    let _sc = serve(&c.netns, "c");
    bed.wait_programmed(&c.uid, Duration::from_secs(2));
    assert!(dial(&bed.plan.host_netns, c.ip).is_ok());
    // Removal clears the per-endpoint state.
    ag[1].endpoint_removed(&b);
    bed.dp.remove_pod(&b).expect("remove");
}

/// `agent: {gates_readiness: true}` (the simulated agent judged by real Felix, whose
/// `cali-INPUT` drops a workload it has not programmed; the default): the node itself
/// cannot reach a new pod until its endpoint is programmed — so the kubelet's readiness
/// probe fails until then — while a node with `gates_readiness: false` reaches its new
/// pod at once.
#[test]
fn gates_readiness_cuts_a_new_pod_off_its_own_node_until_programmed() {
    let bed = new_bed("gate", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = faults(
        "rules:\n- nodes: {names: [node-2]}\n  program_delay: 2s\n- nodes: {names: [node-1]}\n  agent: {gates_readiness: false}\n  program_delay: 2s\n",
    );
    let ag = bed.agents(&f, &[]);
    // The node task puts the gate in within its first pass.
    std::thread::sleep(Duration::from_millis(500));
    let gated = bed.add(&ag[1], 1, "gated");
    let open = bed.add(&ag[0], 0, "open");
    let _s1 = serve(&gated.netns, "gated");
    let _s2 = serve(&open.netns, "open");
    let added = unix_now();
    assert!(
        dial_within(&bed.node_ns(0), open.ip, Duration::from_millis(300)).is_ok(),
        "an ungated node reaches its unprogrammed pod (the old simulated behaviour)"
    );
    assert!(
        dial_within(&bed.node_ns(1), gated.ip, Duration::from_millis(300)).is_err(),
        "the gated node must not reach its pod before programming"
    );
    let up = first_success(
        &bed.node_ns(1),
        gated.ip,
        Duration::from_millis(50),
        Duration::from_secs(6),
    )
    .expect("reachable once programmed");
    let programmed = bed.wait_programmed(&gated.uid, Duration::from_secs(1));
    assert!(
        (up - programmed).abs() < 0.2 && programmed - added > 1.5,
        "node reached its pod at {:.3}s, programmed at {:.3}s",
        up - added,
        programmed - added
    );
    // Turning the key off opens the gate for later pods at once.
    bed_set(
        &f,
        "rules:\n- nodes: {all: true}\n  agent: {gates_readiness: false}\n  program_delay: 2s\n",
    );
    std::thread::sleep(Duration::from_millis(1500));
    let later = bed.add(&ag[1], 1, "later");
    let _s3 = serve(&later.netns, "later");
    assert!(dial_within(&bed.node_ns(1), later.ip, Duration::from_millis(300)).is_ok());
}

fn bed_set(f: &Faults, yaml: &str) {
    f.set(FaultFile::parse(yaml).expect("fault file"));
}

#[test]
fn cross_node_breaks_cross_node_pairs_and_same_node_still_works() {
    // docs/scenarios.md S4 with its own fault file.
    let bed = new_bed("xnode", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = Faults::new(scenario("s4-cross-node.yaml"));
    let ag = bed.agents(&f, &[]);
    let a1 = bed.add(&ag[0], 0, "a1");
    let a2 = bed.add(&ag[0], 0, "a2");
    let b = bed.add(&ag[1], 1, "b");
    let _s = [
        serve(&a2.netns, "a2"),
        serve(&b.netns, "b"),
        serve(&a1.netns, "a1"),
    ];
    for p in [&a1, &a2, &b] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    bed.truth.emit(TruthEvent::pod(
        TruthKind::ReadinessOk,
        &a1,
        serde_json::json!({}),
    ));
    // The node tasks remove the peer routes (asynchronously, at their first tick).
    let removed = bed.events_until(TruthKind::PeerRouteRemoved, 2, EFFECT_TIMEOUT);
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(removed
        .iter()
        .any(|e| e.node.as_deref() == Some("node-1") && e.detail["peer"] == "node-2"));
    assert_eq!(dial(&a1.netns, a2.ip).as_deref(), Ok("a2\n"), "same node");
    assert!(dial(&a1.netns, b.ip).is_err(), "cross node");
    assert!(dial(&b.netns, a1.ip).is_err(), "cross node, other way");
    assert!(
        truth_ttfp(&read_truth(&bed.truth_path).expect("read"), &a1.uid, &b.uid).is_none(),
        "truth: the pair never had a path"
    );

    // Clearing the fault restores the routes within the node task's second.
    let cleared = unix_now();
    ag[0].set_faults(FaultFile::default());
    let success = first_success(
        &a1.netns,
        b.ip,
        Duration::from_millis(20),
        Duration::from_secs(3),
    )
    .expect("cross node never came back");
    // Each route is logged right after it is back: the packet may win.
    let restored = bed.events_until(TruthKind::PeerRouteRestored, 2, EFFECT_TIMEOUT);
    assert_eq!(restored.len(), 2, "{restored:?}");
    let last_restored = restored.iter().map(|e| e.t).fold(0.0, f64::max);
    assert!(
        last_restored - cleared < 0.5,
        "restored {:.3} s after clearing",
        last_restored - cleared
    );
    assert!((success - last_restored).abs() < 0.2);
    let ttfp = truth_ttfp(&read_truth(&bed.truth_path).expect("read"), &a1.uid, &b.uid)
        .expect("truth ttfp");
    let ready = bed.pod_events(TruthKind::ReadinessOk, &a1.uid)[0].t;
    assert!((ttfp - (last_restored - ready)).abs() < 1e-6);
}

#[test]
fn family_broken_ipv6_breaks_only_cross_node_ipv6_until_cleared() {
    let bed = Bed::dual_stack("fp-faults", "fam6", 2).checking_leftovers();
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-1]}\n  family_broken: ipv6\n");
    let ag = bed.agents(&f, &[]);
    let a1 = bed.add(&ag[0], 0, "a1");
    let a2 = bed.add(&ag[0], 0, "a2");
    let b = bed.add(&ag[1], 1, "b");
    let _s = [
        serve_any(&a1.netns, "a1"),
        serve_any(&a2.netns, "a2"),
        serve_any(&b.netns, "b"),
    ];
    for p in [&a1, &a2, &b] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    let (a16, a26, b6) = (a1.ip6.unwrap(), a2.ip6.unwrap(), b.ip6.unwrap());
    let block6 = bed.plan.nodes[1].ipv6.unwrap().pod_cidr.to_string();
    let node1_v6_routes = || {
        let out = std::process::Command::new("ip")
            .args(["-n", &bed.node_ns(0), "-6", "route", "show", &block6])
            .output()
            .expect("ip");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The node task removes node-1's IPv6 route to node-2's block at its first tick.
    let left = poll_until(
        EFFECT_TIMEOUT,
        Duration::from_millis(10),
        node1_v6_routes,
        |r| r.trim().is_empty(),
    );
    assert!(
        left.trim().is_empty(),
        "IPv6 peer route still there: {left}"
    );
    assert!(dial6(&a1.netns, b6).is_err(), "cross-node IPv6 from node-1");
    assert!(
        dial6(&b.netns, a16).is_err(),
        "cross-node IPv6 to node-1 (no way back)"
    );
    assert_eq!(
        dial6(&a1.netns, a26).as_deref(),
        Ok("a2\n"),
        "same-node IPv6"
    );
    assert_eq!(
        dial(&a1.netns, b.ip).as_deref(),
        Ok("b\n"),
        "cross-node IPv4"
    );
    assert_eq!(
        dial(&b.netns, a1.ip).as_deref(),
        Ok("a1\n"),
        "cross-node IPv4 back"
    );
    // The truth names the family: IPv6's path is down, IPv4's (truth_ttfp) is not.
    bed.truth.emit(TruthEvent::pod(
        TruthKind::ReadinessOk,
        &a1,
        serde_json::json!({}),
    ));
    let removed = bed.events(TruthKind::PeerRouteRemoved);
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(removed[0].detail["family"], "ipv6", "{removed:?}");
    assert_eq!(removed[0].detail["reason"], "family_broken");
    let truth = read_truth(&bed.truth_path).expect("read");
    assert!(
        truth_ttfp(&truth, &a1.uid, &b.uid).is_some(),
        "IPv4 path up"
    );
    assert!(
        truth_family_ttfp(&truth, &a1.uid, &b.uid, IpFamily::Ipv6).is_none(),
        "IPv6 path down"
    );

    let cleared = unix_now();
    ag[0].set_faults(FaultFile::default());
    let back = poll_until(
        Duration::from_secs(3),
        Duration::from_millis(20),
        || dial6(&a1.netns, b6),
        Result::is_ok,
    );
    assert_eq!(back.as_deref(), Ok("b\n"), "IPv6 never came back");
    assert!(unix_now() - cleared < 2.0);
    assert!(node1_v6_routes().contains("via"), "route as built");
    let restored = bed.events_until(TruthKind::PeerRouteRestored, 1, EFFECT_TIMEOUT);
    assert_eq!(restored[0].detail["family"], "ipv6", "{restored:?}");
    let truth = read_truth(&bed.truth_path).expect("read");
    assert!(truth_family_ttfp(&truth, &a1.uid, &b.uid, IpFamily::Ipv6).is_some());
}

#[test]
fn cross_node_on_a_dual_stack_testbed_breaks_both_families_with_one_event_per_peer_and_family() {
    let bed = Bed::dual_stack("fp-faults", "xnode6", 2).checking_leftovers();
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-1]}\n  cross_node: {broken_peers: all}\n");
    let ag = bed.agents(&f, &[]);
    let a1 = bed.add(&ag[0], 0, "a1");
    let a2 = bed.add(&ag[0], 0, "a2");
    let b = bed.add(&ag[1], 1, "b");
    let _s = [
        serve_any(&a1.netns, "a1"),
        serve_any(&a2.netns, "a2"),
        serve_any(&b.netns, "b"),
    ];
    for p in [&a1, &a2, &b] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    let removed = bed.events_until(TruthKind::PeerRouteRemoved, 2, EFFECT_TIMEOUT);
    // Both families go in the same reconcile pass; give IPv6 a moment after the event.
    let v6 = poll_until(
        Duration::from_secs(2),
        Duration::from_millis(10),
        || dial6(&a1.netns, b.ip6.unwrap()),
        Result::is_err,
    );
    assert!(v6.is_err(), "cross-node IPv6 still flows: {v6:?}");
    assert!(dial(&a1.netns, b.ip).is_err(), "cross-node IPv4");
    assert_eq!(
        dial6(&a1.netns, a2.ip6.unwrap()).as_deref(),
        Ok("a2\n"),
        "same node"
    );
    std::thread::sleep(Duration::from_millis(300));
    let removed_now = bed.events(TruthKind::PeerRouteRemoved);
    let mut families: Vec<&str> = removed_now
        .iter()
        .map(|e| e.detail["family"].as_str().unwrap_or("none"))
        .collect();
    families.sort_unstable();
    assert_eq!(
        families,
        ["ipv4", "ipv6"],
        "one event per peer and family: {removed_now:?}"
    );
    assert!(removed.iter().all(|e| e.detail["reason"] == "cross_node"));
    ag[0].set_faults(FaultFile::default());
    let back = poll_until(
        Duration::from_secs(3),
        Duration::from_millis(20),
        || dial6(&a1.netns, b.ip6.unwrap()),
        Result::is_ok,
    );
    assert_eq!(back.as_deref(), Ok("b\n"), "IPv6 restored");
    assert_eq!(dial(&a1.netns, b.ip).as_deref(), Ok("b\n"), "IPv4 restored");
    assert_eq!(bed.events(TruthKind::PeerRouteRestored).len(), 2);
}

#[test]
fn family_broken_ipv4_on_a_dual_stack_testbed_keeps_ipv6_and_says_so_in_truth() {
    let bed = Bed::dual_stack("fp-faults", "fam4", 2).checking_leftovers();
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-1]}\n  family_broken: ipv4\n");
    let ag = bed.agents(&f, &[]);
    let a1 = bed.add(&ag[0], 0, "a1");
    let b = bed.add(&ag[1], 1, "b");
    let _s = [serve_any(&a1.netns, "a1"), serve_any(&b.netns, "b")];
    for p in [&a1, &b] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    let removed = bed.events_until(TruthKind::PeerRouteRemoved, 1, EFFECT_TIMEOUT);
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(removed[0].node.as_deref(), Some("node-1"));
    assert_eq!(removed[0].detail["peer"], "node-2");
    assert_eq!(removed[0].detail["reason"], "family_broken");
    assert!(dial(&a1.netns, b.ip).is_err(), "cross-node IPv4");
    assert_eq!(
        dial6(&a1.netns, b.ip6.unwrap()).as_deref(),
        Ok("b\n"),
        "IPv6 unaffected"
    );
    ag[0].set_faults(FaultFile::default());
    let restored = bed.events_until(TruthKind::PeerRouteRestored, 1, EFFECT_TIMEOUT);
    assert_eq!(restored.len(), 1, "{restored:?}");
    assert_eq!(restored[0].detail["reason"], "family_broken");
    assert!(first_success(
        &a1.netns,
        b.ip,
        Duration::from_millis(20),
        Duration::from_secs(3)
    )
    .is_some());
}

#[test]
fn cross_node_with_named_peers_breaks_only_those() {
    let bed = new_bed("xnames", 3);
    let rt = rt();
    let _g = rt.enter();
    // In force only for the first 1.5 s after the file was applied.
    let applied = unix_now();
    let f = faults(
        "rules:\n- nodes: {names: [node-1]}\n  until: 1500ms\n  cross_node: {broken_peers: [node-3]}\n",
    );
    let ag = bed.agents(&f, &[]);
    let a = bed.add(&ag[0], 0, "a");
    let b = bed.add(&ag[1], 1, "b");
    let c = bed.add(&ag[2], 2, "c");
    let _s = [serve(&b.netns, "b"), serve(&c.netns, "c")];
    for p in [&a, &b, &c] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    // node-1's task removes the route to node-3 asynchronously: wait for its event
    // before relying on the route being gone.
    let removed = bed.events_until(TruthKind::PeerRouteRemoved, 1, EFFECT_TIMEOUT);
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(removed[0].detail["peer"], "node-3");
    assert_eq!(dial(&a.netns, b.ip).as_deref(), Ok("b\n"));
    assert!(dial(&a.netns, c.ip).is_err());
    // `until` ends a node-wide fault on time.
    let back = first_success(
        &a.netns,
        c.ip,
        Duration::from_millis(20),
        Duration::from_secs(3),
    )
    .expect("route never restored");
    assert!(
        (1.45..1.7).contains(&(back - applied)),
        "restored {:.3} s after the file was applied",
        back - applied
    );
    let restored = bed.events_until(TruthKind::PeerRouteRestored, 1, EFFECT_TIMEOUT);
    assert_eq!(restored.len(), 1, "{restored:?}");
    assert_eq!(restored[0].node.as_deref(), Some("node-1"));
}

#[test]
fn stale_routes_blackhole_a_new_pod_on_other_nodes_for_a_while() {
    let bed = new_bed("stale", 3);
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-2]}\n  stale_routes: {k: 2, for: 1500ms}\n");
    let ag = bed.agents(&f, &[]);
    let a = bed.add(&ag[0], 0, "a");
    let c = bed.add(&ag[2], 2, "c");
    bed.wait_programmed(&a.uid, Duration::from_secs(2));
    bed.wait_programmed(&c.uid, Duration::from_secs(2));
    let added = unix_now();
    let b = bed.add(&ag[1], 1, "b");
    let _s = serve(&b.netns, "b");
    bed.wait_programmed(&b.uid, Duration::from_secs(2));
    bed.truth.emit(TruthEvent::pod(
        TruthKind::ReadinessOk,
        &a,
        serde_json::json!({}),
    ));
    let removed = bed.pod_events(TruthKind::PeerRouteRemoved, &b.uid);
    let mut on: Vec<&str> = removed.iter().filter_map(|e| e.node.as_deref()).collect();
    on.sort();
    assert_eq!(on, ["node-1", "node-3"]);
    // b is programmed and reachable through its own node, not from the stale nodes.
    assert_eq!(dial(&bed.plan.host_netns, b.ip).as_deref(), Ok("b\n"));
    assert!(dial(&a.netns, b.ip).is_err());
    assert!(dial(&c.netns, b.ip).is_err());
    let success = first_success(
        &a.netns,
        b.ip,
        Duration::from_millis(20),
        Duration::from_secs(3),
    )
    .expect("stale route never went");
    assert!(
        (1.4..1.9).contains(&(success - added)),
        "first success {:.3} s after add",
        success - added
    );
    // node-1's route (the one a→b needs) may be back before node-3's is logged.
    let restored = bed.pod_events_until(TruthKind::PeerRouteRestored, &b.uid, 2, EFFECT_TIMEOUT);
    assert_eq!(restored.len(), 2, "{restored:?}");
    // Truth TTFP of (a → b) follows the stale route on a's node, not other pairs.
    let evs = read_truth(&bed.truth_path).expect("read");
    let ready = bed.pod_events(TruthKind::ReadinessOk, &a.uid)[0].t;
    let back_on_1 = restored
        .iter()
        .find(|e| e.node.as_deref() == Some("node-1"))
        .expect("node-1 restored")
        .t;
    let ttfp = truth_ttfp(&evs, &a.uid, &b.uid).expect("ttfp");
    assert!((ttfp - (back_on_1 - ready)).abs() < 1e-6);
    assert_eq!(truth_ttfp(&evs, &a.uid, &c.uid), Some(0.0));
}

#[test]
fn clock_skew_shifts_the_wall_clock_of_pod_processes_on_that_node() {
    assert!(
        Path::new(testbed::fault::LIBFAKETIME_PATH).exists(),
        "clock_skew needs Debian's libfaketime (apt-get install libfaketime)"
    );
    let bed = new_bed("skew", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-2]}\n  clock_skew: +30s\n");
    let ag = bed.agents(&f, &[]);
    let b = bed.add(&ag[1], 1, "b");
    let a = bed.add(&ag[0], 0, "a");
    let date_in = |pod: &PodNet, env: Vec<(String, String)>| -> f64 {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &pod.netns, "date", "+%s.%N"])
            .envs(env)
            .output()
            .expect("run date");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("date output")
    };
    let skew_b = ag[1].clock_skew().expect("node-2 is skewed");
    let skewed = date_in(&b, skew_b.faketime_env()) - unix_now();
    assert!((skewed - 30.0).abs() < 1.0, "skew on node-2 {skewed:.3} s");
    let skew_a = ag[0].clock_skew();
    assert!(skew_a.is_none(), "node-1 has no skew: {skew_a:?}");
    let plain = date_in(&a, Vec::new()) - unix_now();
    assert!(plain.abs() < 1.0, "node-1 clock off by {plain:.3} s");
}

/// `GET /metrics` from the host netns to `node IP:9091`; returns the body.
fn scrape(bed: &Bed, node: usize) -> String {
    let ip = bed.plan.nodes[node].ip;
    run_in_netns(&bed.plan.host_netns, move || -> Result<String, String> {
        let mut s = TcpStream::connect_timeout(
            &SocketAddr::from((ip, FELIX_METRICS_PORT)),
            Duration::from_secs(1),
        )
        .map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(3)))
            .map_err(|e| e.to_string())?;
        s.write_all(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain;version=0.0.4\r\nConnection: close\r\n\r\n",
        )
        .map_err(|e| e.to_string())?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
        let (head, body) = buf.split_once("\r\n\r\n").ok_or("no body")?;
        if !head.starts_with("HTTP/1.1 200") || !head.contains("version=0.0.4") {
            return Err(format!("bad response head: {head}"));
        }
        Ok(body.to_owned())
    })
    .expect("host netns")
    .expect("scrape")
}

struct Page {
    scrape: prometheus_parse::Scrape,
}

impl Page {
    fn parse(body: &str) -> Page {
        // Every sample line must carry a value a Prometheus parser accepts (the crate
        // below skips lines it cannot read, so check them first).
        for l in body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let v = l.rsplit(' ').next().unwrap_or("");
            assert!(
                v.parse::<f64>().is_ok() || v == "+Inf" || v == "-Inf",
                "bad sample line {l:?}"
            );
        }
        let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
            .expect("prometheus text parses");
        Page { scrape }
    }

    fn value(&self, name: &str) -> f64 {
        let s = self
            .scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .unwrap_or_else(|| panic!("no {name}"));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{name} is not a scalar"),
        }
    }

    fn quantile(&self, name: &str, q: f64) -> f64 {
        let s = self
            .scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .unwrap_or_else(|| panic!("no {name}"));
        match &s.value {
            prometheus_parse::Value::Summary(v) => v
                .iter()
                .find(|c| c.quantile == q)
                .map(|c| c.count)
                .unwrap_or_else(|| panic!("{name} has no {q} quantile")),
            _ => panic!("{name} is not a summary"),
        }
    }
}

#[test]
fn s2_felix_apply_time_p99_is_high_on_slow_nodes_while_failures_stay_flat() {
    let bed = new_bed("s2", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = Faults::new(scenario("s2-apply-loop.yaml"));
    let ag = bed.agents(&f, &[("node-2", "os", "debian13")]);
    let threads: Vec<NetnsThread> = (0..2)
        .map(|i| {
            let t = NetnsThread::spawn(&bed.node_ns(i)).expect("node thread");
            t.handle().spawn(bind_and_serve(ag[i].clone()));
            t
        })
        .collect();
    let a = bed.add(&ag[0], 0, "a");
    let b = bed.add(&ag[1], 1, "b");
    bed.wait_programmed(&a.uid, Duration::from_secs(2));
    // The slow node's apply loop (≥ 1 s per apply) shows after a few iterations, the
    // fast node's route-table resync after its first tick: poll the pages for both.
    let apply = "felix_int_dataplane_apply_time_seconds";
    let slow1 = poll_until(
        Duration::from_secs(20),
        Duration::from_millis(100),
        || Page::parse(&scrape(&bed, 1)),
        |p| p.quantile(apply, 0.99) >= 1.0 && p.value(&format!("{apply}_count")) >= 2.0,
    );
    let slow1_at = Instant::now();
    let fast = poll_until(
        EFFECT_TIMEOUT,
        Duration::from_millis(100),
        || Page::parse(&scrape(&bed, 0)),
        |p| p.value("felix_route_table_list_seconds_count") >= 1.0,
    );
    // Names, HELP and TYPE as in felix-3.20-1.prom.
    assert_eq!(
        slow1
            .scrape
            .docs
            .get("felix_int_dataplane_apply_time_seconds")
            .map(String::as_str),
        Some("Time in seconds that it took to apply a dataplane update.")
    );
    let p99 = slow1.quantile("felix_int_dataplane_apply_time_seconds", 0.99);
    assert!(p99 >= 1.0, "slow node apply p99 {p99}");
    let count1 = slow1.value("felix_int_dataplane_apply_time_seconds_count");
    assert!(count1 >= 2.0, "apply loop iterations {count1}");
    assert_eq!(slow1.value("felix_int_dataplane_failures"), 0.0);
    assert_eq!(slow1.value("felix_resyncs_started"), 1.0);
    assert_eq!(slow1.value("felix_active_local_endpoints"), 1.0);
    let fast_p99 = fast.quantile("felix_int_dataplane_apply_time_seconds", 0.99);
    assert!(fast_p99 < 0.5, "fast node apply p99 {fast_p99}");
    assert_eq!(
        fast.quantile("felix_int_dataplane_msg_batch_size", 0.5),
        1.0
    );
    assert!(fast.value("process_start_time_seconds") > 1.6e9);
    assert!(fast.value("felix_route_table_list_seconds_count") >= 1.0);
    // b on the slow node is still waiting (15–42 s delay), a on the fast one is done.
    assert!(bed
        .pod_events(TruthKind::EndpointProgrammed, &b.uid)
        .is_empty());

    let slow2 = poll_until(
        EFFECT_TIMEOUT,
        Duration::from_millis(100),
        || Page::parse(&scrape(&bed, 1)),
        |p| p.value(&format!("{apply}_count")) > count1,
    );
    assert!(
        slow2.value(&format!("{apply}_count")) > count1,
        "the apply loop stopped at {count1} iterations"
    );
    // Failures and resyncs must NOT grow: look again once the old 1.5 s window passed.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(slow1_at.elapsed()));
    let slow2 = Page::parse(&scrape(&bed, 1));
    assert_eq!(
        slow2.value("felix_int_dataplane_failures"),
        0.0,
        "failures stay flat"
    );
    assert_eq!(
        slow2.value("felix_resyncs_started"),
        1.0,
        "resyncs stay flat"
    );
    drop(threads);
}

#[test]
fn agent_faults_show_in_readiness_restarts_and_felix_counters() {
    let bed = new_bed("agent", 2);
    let rt = rt();
    let _g = rt.enter();
    // S5's own file: node-1 is on the slower OS, with failures counted every second.
    let f = Faults::new(scenario("s5-slower-os.yaml"));
    let ag = bed.agents(&f, &[("node-1", "os", "ubuntu2004")]);
    let a = bed.add(&ag[0], 0, "a");
    let b = bed.add(&ag[1], 1, "b");
    let prog_a = bed.wait_programmed(&a.uid, Duration::from_secs(5));
    let prog_b = bed.wait_programmed(&b.uid, Duration::from_secs(2));
    let added_a = bed.pod_events(TruthKind::EndpointAdded, &a.uid)[0].t;
    assert!(
        (1.5..3.7).contains(&(prog_a - added_a)),
        "slow OS delay {:.3}",
        prog_a - added_a
    );
    let added_b = bed.pod_events(TruthKind::EndpointAdded, &b.uid)[0].t;
    assert!(prog_b - added_b < 0.7);
    let slow = Page::parse(&ag[0].felix_page());
    let other = Page::parse(&ag[1].felix_page());
    let failures = slow.value("felix_int_dataplane_failures");
    assert!(failures >= 1.0, "S5 node failures {failures}");
    assert_eq!(other.value("felix_int_dataplane_failures"), 0.0);
    assert!(ag[0].is_ready() && ag[1].is_ready());

    // Runtime change: not ready, extra resyncs, restarts every 800 ms on node-2.
    let started_before = other.value("process_start_time_seconds");
    let changed_at = Instant::now();
    ag[0].set_faults(
        FaultFile::parse(
            "rules:\n- nodes: {names: [node-2]}\n  agent: {not_ready: true, extra_resyncs_per_second: 3, restarts: {every: 800ms}}\n",
        )
        .expect("faults"),
    );
    // node-2's task applies the change on its next tick and restarts after ~800 ms
    // (the counter first, then a fresh page): poll for all three.
    let (ready2, restarts2, after) = poll_until(
        EFFECT_TIMEOUT,
        Duration::from_millis(20),
        || {
            (
                ag[1].is_ready(),
                ag[1].restart_count(),
                Page::parse(&ag[1].felix_page()),
            )
        },
        |(ready, restarts, page)| {
            !ready && *restarts >= 1 && page.value("process_start_time_seconds") > started_before
        },
    );
    assert!(
        !ready2,
        "node-2 still ready {EFFECT_TIMEOUT:?} after not_ready"
    );
    assert!(restarts2 >= 1, "node-2 restarts {restarts2}");
    assert!(after.value("process_start_time_seconds") > started_before);
    // node-1 must NOT change: look once the same bounded 1.2 s as before passed.
    std::thread::sleep(Duration::from_millis(1200).saturating_sub(changed_at.elapsed()));
    assert!(ag[0].is_ready());
    assert_eq!(ag[0].restart_count(), 0);
    // Counters restarted from zero at the restart (the programming apply is gone).
    assert!(after.value("felix_int_dataplane_apply_time_seconds_count") < 1.0);
    // node-1's failure counter stopped growing with the S5 rules gone (nothing must
    // happen: a bounded sleep past a tick, then one look).
    let f1 = Page::parse(&ag[0].felix_page()).value("felix_int_dataplane_failures");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        Page::parse(&ag[0].felix_page()).value("felix_int_dataplane_failures"),
        f1
    );
    ag[0].set_faults(
        FaultFile::parse(
            "rules:\n- nodes: {names: [node-2]}\n  agent: {extra_resyncs_per_second: 3}\n",
        )
        .expect("faults"),
    );
    // Ready again on the next tick; 3 extra resyncs a second add up to ≥ 5: poll.
    let (ready2, resyncs) = poll_until(
        Duration::from_secs(15),
        Duration::from_millis(50),
        || {
            (
                ag[1].is_ready(),
                Page::parse(&ag[1].felix_page()).value("felix_resyncs_started"),
            )
        },
        |(ready, resyncs)| *ready && *resyncs >= 1.0 + 5.0,
    );
    assert!(ready2, "node-2 not ready again");
    assert!(resyncs >= 1.0 + 5.0, "resyncs {resyncs}");
    let changed = bed.events(TruthKind::FaultChanged);
    assert_eq!(changed.len(), 2);
}

#[test]
fn scenario_fault_files_parse_and_say_how_to_run_them() {
    for (name, up) in [
        ("s1-healthy.yaml", None),
        (
            "s2-apply-loop.yaml",
            Some("node-2=os=debian13,node-3=os=debian13"),
        ),
        ("s3-name-reuse.yaml", Some("testbed up --nodes")),
        ("s4-cross-node.yaml", Some("testbed up --nodes")),
        (
            "s5-slower-os.yaml",
            Some("node-1=os=ubuntu2004,node-4=os=ubuntu2004"),
        ),
    ] {
        let text = std::fs::read_to_string(fault_file(name)).expect("read");
        let f = FaultFile::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!f.rules.is_empty(), "{name} has rules");
        if let Some(up) = up {
            assert!(text.contains(up), "{name} says how to bring the testbed up");
        }
    }
    // S2 on real Felix: its primitive acts on the real agent only.
    let text = std::fs::read_to_string(fault_file("s2-real-felix.yaml")).expect("read");
    assert!(
        text.contains("--agent calico") && text.contains("node-2=os=debian13,node-3=os=debian13")
    );
    let f = FaultFile::parse(&text).expect("s2-real-felix.yaml");
    use testbed::fault::{AgentKind, ProxyKind};
    f.check_components(&text, AgentKind::Calico, ProxyKind::Real)
        .expect("applies to real Felix");
    let e = f
        .check_components(&text, AgentKind::Simulated, ProxyKind::Simulated)
        .unwrap_err()
        .to_string();
    assert!(e.contains("agent_io") && e.contains("line 12"), "{e}");
    let s2 = scenario("s2-apply-loop.yaml");
    let labels: BTreeMap<String, String> = [("os".to_owned(), "debian13".to_owned())].into();
    let slow = s2.for_node("node-2", &labels, Duration::ZERO);
    assert_eq!(slow.agent.apply_time_floor, Some(Duration::from_secs(1)));
    assert!(s2
        .for_node("node-1", &BTreeMap::new(), Duration::ZERO)
        .resync_loop
        .is_none());
}

// ---------------------------------------------------------------------------------
// Faults of the node's network: link_mtu, encap_mtu, proto_drop (real packets).

/// UDP port of the pods' echo servers.
const UDP_PORT: u16 = 9000;
/// TCP port of the pods' bulk servers.
const BULK_PORT: u16 = 8081;
/// Bytes a bulk server sends per connection: many full-size segments.
const BULK: usize = 64 * 1024;
/// UDP payload of a full-size datagram: a 1500-byte IP packet (20 IP + 8 UDP header),
/// the pods' MTU.
const FULL: usize = 1472;
/// How long a UDP exchange waits for its echo.
const UDP_WAIT: Duration = Duration::from_millis(500);

/// `IP_MTU_DISCOVER` = `IP_PMTUDISC_DO` on a socket: DF on every datagram, never
/// fragmented locally, and a "fragmentation needed" answer surfaces as `EMSGSIZE`.
fn pmtudisc_do(fd: std::os::fd::RawFd) {
    use nix::libc;
    let v: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: a valid socket fd and a pointer to a c_int of the size given.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "setsockopt IP_MTU_DISCOVER: {}",
        std::io::Error::last_os_error()
    );
}

/// A pod's servers besides [`serve`]: a UDP echo on [`UDP_PORT`] (answers with DF too)
/// and a TCP server on [`BULK_PORT`] that reads a request, then sends [`BULK`] bytes
/// and closes. Stop when dropped.
fn serve_net(netns: &str) -> NetnsThread {
    let t = NetnsThread::spawn(netns).expect("netns thread");
    let (tx, rx) = std::sync::mpsc::channel();
    t.handle().spawn(async move {
        use std::os::fd::AsRawFd;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let udp = tokio::net::UdpSocket::bind(("0.0.0.0", UDP_PORT)).await;
        let tcp = tokio::net::TcpListener::bind(("0.0.0.0", BULK_PORT)).await;
        let (udp, tcp) = match (udp, tcp) {
            (Ok(u), Ok(t)) => (u, t),
            (Err(e), _) | (_, Err(e)) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        pmtudisc_do(udp.as_raw_fd());
        let _ = tx.send(Ok(()));
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            loop {
                if let Ok((n, from)) = udp.recv_from(&mut buf).await {
                    let _ = udp.send_to(&buf[..n], from).await;
                }
            }
        });
        loop {
            if let Ok((mut s, _)) = tcp.accept().await {
                tokio::spawn(async move {
                    let mut req = [0u8; 64];
                    let _ = tokio::time::timeout(Duration::from_secs(1), s.read(&mut req)).await;
                    let _ = s.write_all(&vec![b'y'; BULK]).await;
                    let _ = s.shutdown().await;
                });
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("server start")
        .expect("bind");
    t
}

/// What one UDP exchange saw.
#[derive(Debug, PartialEq)]
enum Udp {
    /// The echo came back with this many bytes.
    Echoed(usize),
    /// No answer within [`UDP_WAIT`] and no error: the datagram (or its echo) vanished
    /// silently. `path_mtu` is the sender's path MTU afterwards (`IP_MTU`): an ICMP
    /// "fragmentation needed" would have lowered it (and failed the receive with
    /// `EMSGSIZE`).
    Lost { path_mtu: i32 },
    /// The socket reported an error (e.g. `EMSGSIZE` after an ICMP error).
    Failed(String),
}

/// Sends a `payload`-byte datagram with DF ([`pmtudisc_do`]) from netns `from` to
/// `ip:`[`UDP_PORT`] on a connected socket and waits for the echo; up to `tries` times
/// (a new datagram each time) until one is echoed. Returns the last outcome.
fn udp(from: &str, ip: std::net::Ipv4Addr, payload: usize, tries: usize) -> Udp {
    use std::os::fd::AsRawFd;
    run_in_netns(from, move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind udp");
        pmtudisc_do(s.as_raw_fd());
        s.connect((ip, UDP_PORT)).expect("connect udp");
        s.set_read_timeout(Some(UDP_WAIT)).expect("timeout");
        let msg = vec![b'x'; payload];
        let mut buf = vec![0u8; 65536];
        let mut last = Udp::Failed("never tried".into());
        for _ in 0..tries {
            if let Err(e) = s.send(&msg) {
                return Udp::Failed(format!("send: {e}"));
            }
            last = match s.recv(&mut buf) {
                Ok(n) => return Udp::Echoed(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    let path_mtu =
                        nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::IpMtu)
                            .unwrap_or(-1);
                    Udp::Lost { path_mtu }
                }
                Err(e) => return Udp::Failed(format!("recv: {e}")),
            };
        }
        last
    })
    .expect("netns")
}

/// How long a bulk body may take on a healthy path (it takes milliseconds; a path
/// that loses TCP's GSO batches and gets through by single-segment retransmissions
/// takes seconds).
const BULK_FAST: Duration = Duration::from_secs(1);

/// What fetching a bulk body saw.
#[derive(Debug, PartialEq)]
enum Bulk {
    /// The whole body, then the server's close, within [`BULK_FAST`].
    Complete(usize),
    /// The whole body, but slower than [`BULK_FAST`].
    Slow(usize, Duration),
    /// Connected (the handshake passed), then only this many bytes before the reads
    /// stalled for 1.5 s.
    Stalled(usize),
    /// The connection never opened.
    NoConnection(String),
}

/// One request to `ip:`[`BULK_PORT`] from netns `from`, reading the body until the
/// server closes or 1.5 s pass without data; the time counts from the request.
fn fetch_bulk(from: &str, ip: std::net::Ipv4Addr) -> Bulk {
    run_in_netns(from, move || {
        let addr = SocketAddr::from((ip, BULK_PORT));
        let mut s = match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => s,
            Err(e) => return Bulk::NoConnection(e.to_string()),
        };
        s.set_read_timeout(Some(Duration::from_millis(1500)))
            .expect("timeout");
        let started = Instant::now();
        let _ = s.write_all(b"hi\n");
        let mut got = 0;
        let mut buf = vec![0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) if started.elapsed() < BULK_FAST => return Bulk::Complete(got),
                Ok(0) => return Bulk::Slow(got, started.elapsed()),
                Ok(n) => got += n,
                Err(_) => return Bulk::Stalled(got),
            }
        }
    })
    .expect("netns")
}

/// Attribute `key` (`mtu`, `gso_max_segs`) of `dev` in `netns`, from `ip -j -d link`.
fn link_attr(netns: &str, dev: &str, key: &str) -> Option<u64> {
    let out = std::process::Command::new("ip")
        .args(["-n", netns, "-j", "-d", "link", "show", "dev", dev])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v[0][key].as_u64()
}

/// Waits (≤ [`EFFECT_TIMEOUT`]) until the node task has put `want` in on `node`.
fn wait_net(bed: &Bed, node: &str, want: &NetFaults) {
    let got = poll_until(
        EFFECT_TIMEOUT,
        Duration::from_millis(20),
        || bed.dp.net_faults(node),
        |f| f == want,
    );
    assert_eq!(&got, want, "{node}'s network faults");
}

/// A pod's three servers ([`serve`] on 8080, [`serve_net`]).
fn serve_pod(p: &PodNet) -> (Server, NetnsThread) {
    (serve(&p.netns, &p.pod), serve_net(&p.netns))
}

/// `encap_mtu: 1400` on node-1: its pods' packets crossing its link lose everything
/// above 1400 bytes silently, both ways, while handshakes and small packets pass;
/// same-node traffic and other nodes' traffic keep full size; clearing the fault brings
/// full size back and stops the underlay segmenting.
#[test]
fn encap_mtu_black_holes_full_size_packets_of_the_nodes_pods_across_its_link() {
    let bed = new_bed("encap", 3);
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-1]}\n  encap_mtu: 1400\n");
    let ag = bed.agents(&f, &[]);
    let a1 = bed.add(&ag[0], 0, "a1");
    let a2 = bed.add(&ag[0], 0, "a2");
    let b = bed.add(&ag[1], 1, "b");
    let c = bed.add(&ag[2], 2, "c");
    let _s = [&a1, &a2, &b, &c].map(serve_pod);
    for p in [&a1, &a2, &b, &c] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    wait_net(
        &bed,
        "node-1",
        &NetFaults {
            encap_mtu: Some(1400),
            ..NetFaults::default()
        },
    );
    assert_eq!(bed.dp.net_faults("node-2"), NetFaults::default());
    assert!(bed.dp.underlay_segmented());
    // The pods' MTU is the veth default: a full-size packet is 1500 bytes.
    assert_eq!(link_attr(&a1.netns, "eth0", "mtu"), Some(1500));
    assert_eq!(link_attr(&bed.node_ns(0), "eth0", "gso_max_segs"), Some(1));
    // Handshakes and small packets cross, both ways.
    assert_eq!(dial(&a1.netns, b.ip).as_deref(), Ok("b\n"));
    assert_eq!(dial(&b.netns, a1.ip).as_deref(), Ok("a1\n"));
    assert_eq!(udp(&a1.netns, b.ip, 100, 3), Udp::Echoed(100));
    // Exactly N passes (there and back), N + 1 does not.
    assert_eq!(udp(&a1.netns, b.ip, 1400 - 28, 3), Udp::Echoed(1372));
    assert_eq!(udp(&b.netns, a1.ip, 1400 - 28, 3), Udp::Echoed(1372));
    assert_eq!(
        udp(&a1.netns, b.ip, 1401 - 28, 2),
        Udp::Lost { path_mtu: 1500 }
    );
    // Full size vanishes both ways without an ICMP error (the path MTU stays 1500).
    assert_eq!(udp(&a1.netns, b.ip, FULL, 2), Udp::Lost { path_mtu: 1500 });
    assert_eq!(udp(&b.netns, a1.ip, FULL, 2), Udp::Lost { path_mtu: 1500 });
    let stalled = |r: Bulk| matches!(r, Bulk::Stalled(n) if n < BULK);
    assert!(stalled(fetch_bulk(&a1.netns, b.ip)), "node-2 → node-1 bulk");
    assert!(stalled(fetch_bulk(&b.netns, a1.ip)), "node-1 → node-2 bulk");
    // Same node, and pods of other nodes: full size works.
    assert_eq!(udp(&a1.netns, a2.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(fetch_bulk(&a1.netns, a2.ip), Bulk::Complete(BULK));
    assert_eq!(udp(&b.netns, c.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(fetch_bulk(&c.netns, b.ip), Bulk::Complete(BULK));

    // A limit at the pods' MTU loses nothing: TCP's GSO batches (up to 64 KB inside the
    // node) are measured segment by segment, as they go on the wire.
    bed_set(
        &f,
        "rules:\n- nodes: {names: [node-1]}\n  encap_mtu: 1500\n",
    );
    wait_net(
        &bed,
        "node-1",
        &NetFaults {
            encap_mtu: Some(1500),
            ..NetFaults::default()
        },
    );
    assert_eq!(udp(&a1.netns, b.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(fetch_bulk(&a1.netns, b.ip), Bulk::Complete(BULK));
    assert_eq!(fetch_bulk(&b.netns, a1.ip), Bulk::Complete(BULK));

    // Cleared: the rules go, the underlay stops segmenting, full size crosses again.
    f.set(FaultFile::default());
    wait_net(&bed, "node-1", &NetFaults::default());
    assert!(!bed.dp.underlay_segmented());
    assert_eq!(
        link_attr(&bed.node_ns(0), "eth0", "gso_max_segs"),
        Some(65535)
    );
    assert_eq!(
        link_attr(&bed.plan.host_netns, "br0", "gso_max_segs"),
        Some(65535)
    );
    assert_eq!(udp(&a1.netns, b.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(udp(&b.netns, a1.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(fetch_bulk(&a1.netns, b.ip), Bulk::Complete(BULK));
    assert_eq!(fetch_bulk(&b.netns, a1.ip), Bulk::Complete(BULK));
}

/// `proto_drop: {protocols: [udp]}` on node-1: UDP across its link fails both ways
/// while TCP works and same-node UDP works; `cross_node: false` takes same-node UDP
/// too (never the node's own); clearing brings UDP back.
#[test]
fn proto_drop_drops_udp_across_the_link_then_on_the_node_too() {
    let bed = new_bed("proto", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = faults(
        "rules:\n- nodes: {names: [node-1]}\n  proto_drop: {protocols: [udp], cross_node: true}\n",
    );
    let ag = bed.agents(&f, &[]);
    let a1 = bed.add(&ag[0], 0, "a1");
    let a2 = bed.add(&ag[0], 0, "a2");
    let b = bed.add(&ag[1], 1, "b");
    let _s = [&a1, &a2, &b].map(serve_pod);
    for p in [&a1, &a2, &b] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    let udp_only = |cross_node| NetFaults {
        proto_drop: Some(testbed::fault::ProtoDrop {
            protocols: [testbed::fault::DropProtocol::Udp].into(),
            cross_node,
        }),
        ..NetFaults::default()
    };
    wait_net(&bed, "node-1", &udp_only(true));
    assert!(!bed.dp.underlay_segmented(), "no size limit, no segmenting");
    // Cross-node UDP request/response fails both ways, silently.
    assert!(matches!(udp(&a1.netns, b.ip, 100, 2), Udp::Lost { .. }));
    assert!(matches!(udp(&b.netns, a1.ip, 100, 2), Udp::Lost { .. }));
    // TCP crosses; same-node UDP works.
    assert_eq!(dial(&a1.netns, b.ip).as_deref(), Ok("b\n"));
    assert_eq!(dial(&b.netns, a1.ip).as_deref(), Ok("a1\n"));
    assert_eq!(fetch_bulk(&a1.netns, b.ip), Bulk::Complete(BULK));
    assert_eq!(udp(&a1.netns, a2.ip, 100, 3), Udp::Echoed(100));

    // A later file: same-node too.
    bed_set(
        &f,
        "rules:\n- nodes: {names: [node-1]}\n  proto_drop: {protocols: [udp], cross_node: false}\n",
    );
    wait_net(&bed, "node-1", &udp_only(false));
    assert!(matches!(udp(&a1.netns, a2.ip, 100, 2), Udp::Lost { .. }));
    assert!(matches!(udp(&a1.netns, b.ip, 100, 2), Udp::Lost { .. }));
    assert_eq!(dial(&a1.netns, a2.ip).as_deref(), Ok("a2\n"));
    // A pod's traffic with its own node is not forwarded: never dropped.
    assert_eq!(udp(&bed.node_ns(0), a1.ip, 100, 3), Udp::Echoed(100));

    f.set(FaultFile::default());
    wait_net(&bed, "node-1", &NetFaults::default());
    assert_eq!(udp(&a1.netns, b.ip, 100, 3), Udp::Echoed(100));
    assert_eq!(udp(&b.netns, a1.ip, 100, 3), Udp::Echoed(100));
    assert_eq!(udp(&a1.netns, a2.ip, 100, 3), Udp::Echoed(100));
}

/// `link_mtu: 1400` on node-1: the bridge-side end of its link gets MTU 1400 while its
/// `eth0` keeps 1500, so full-size packets to and from its pods vanish on the link
/// without an ICMP error while small ones and same-node traffic pass; the host keeps
/// talking to the node's pods (the bridge follows its smallest port); clearing the
/// fault, or its `until` passing, restores the MTUs; teardown leaves no netns and no
/// link.
#[test]
fn link_mtu_lowers_the_far_end_of_the_nodes_link_and_full_size_vanishes() {
    let bed = new_bed("linkmtu", 2);
    let rt = rt();
    let _g = rt.enter();
    let f = faults("rules:\n- nodes: {names: [node-1]}\n  link_mtu: 1400\n");
    let ag = bed.agents(&f, &[]);
    let a1 = bed.add(&ag[0], 0, "a1");
    let a2 = bed.add(&ag[0], 0, "a2");
    let b = bed.add(&ag[1], 1, "b");
    let servers = [&a1, &a2, &b].map(serve_pod);
    for p in [&a1, &a2, &b] {
        bed.wait_programmed(&p.uid, Duration::from_secs(2));
    }
    wait_net(
        &bed,
        "node-1",
        &NetFaults {
            link_mtu: Some(1400),
            ..NetFaults::default()
        },
    );
    let host = bed.plan.host_netns.clone();
    let port = bed.plan.bridge_port("node-1").expect("port");
    assert_eq!(port, "vn1");
    assert_eq!(link_attr(&host, &port, "mtu"), Some(1400));
    assert_eq!(link_attr(&host, "vn2", "mtu"), Some(1500));
    assert_eq!(
        link_attr(&host, "br0", "mtu"),
        Some(1400),
        "the bridge follows"
    );
    assert_eq!(
        link_attr(&bed.node_ns(0), "eth0", "mtu"),
        Some(1500),
        "the node believes in its link"
    );
    // Small packets and handshakes cross both ways; 1400 bytes too.
    assert_eq!(dial(&a1.netns, b.ip).as_deref(), Ok("b\n"));
    assert_eq!(dial(&b.netns, a1.ip).as_deref(), Ok("a1\n"));
    assert_eq!(udp(&a1.netns, b.ip, 1400 - 28, 3), Udp::Echoed(1372));
    assert_eq!(udp(&b.netns, a1.ip, 1400 - 28, 3), Udp::Echoed(1372));
    // Full size vanishes on the link both ways, and nobody says so: no EMSGSIZE, the
    // senders' path MTU stays 1500 (no "fragmentation needed" reached them).
    assert_eq!(udp(&a1.netns, b.ip, FULL, 2), Udp::Lost { path_mtu: 1500 });
    assert_eq!(udp(&b.netns, a1.ip, FULL, 2), Udp::Lost { path_mtu: 1500 });
    let stalled = |r: Bulk| matches!(r, Bulk::Stalled(n) if n < BULK);
    assert!(stalled(fetch_bulk(&a1.netns, b.ip)), "node-2 → node-1 bulk");
    assert!(stalled(fetch_bulk(&b.netns, a1.ip)), "node-1 → node-2 bulk");
    // Same node: full size.
    assert_eq!(udp(&a1.netns, a2.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(fetch_bulk(&a2.netns, a1.ip), Bulk::Complete(BULK));
    // The host (API server side) and the node's pods agree on segments that fit.
    assert_eq!(fetch_bulk(&host, a1.ip), Bulk::Complete(BULK));

    // Cleared: the port's MTU (and the bridge's) back, full size crosses again.
    f.set(FaultFile::default());
    wait_net(&bed, "node-1", &NetFaults::default());
    assert_eq!(link_attr(&host, &port, "mtu"), Some(1500));
    assert_eq!(link_attr(&host, "br0", "mtu"), Some(1500));
    assert!(!bed.dp.underlay_segmented());
    assert_eq!(udp(&a1.netns, b.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(udp(&b.netns, a1.ip, FULL, 3), Udp::Echoed(FULL));
    assert_eq!(fetch_bulk(&a1.netns, b.ip), Bulk::Complete(BULK));
    assert_eq!(fetch_bulk(&b.netns, a1.ip), Bulk::Complete(BULK));

    // A rule whose `until` passes is undone like a cleared one.
    bed_set(
        &f,
        "rules:\n- nodes: {names: [node-1]}\n  until: 2s\n  link_mtu: 1300\n",
    );
    wait_net(
        &bed,
        "node-1",
        &NetFaults {
            link_mtu: Some(1300),
            ..NetFaults::default()
        },
    );
    assert_eq!(link_attr(&host, &port, "mtu"), Some(1300));
    wait_net(&bed, "node-1", &NetFaults::default());
    assert_eq!(link_attr(&host, &port, "mtu"), Some(1500));
    assert!(!bed.dp.underlay_segmented());

    // Teardown (with the fault back in force) leaves nothing: the links go with the
    // namespaces (checked by the bed's drop guard too).
    f.set(FaultFile::parse("rules:\n- nodes: {all: true}\n  link_mtu: 1280\n").expect("faults"));
    wait_net(
        &bed,
        "node-2",
        &NetFaults {
            link_mtu: Some(1280),
            ..NetFaults::default()
        },
    );
    let prefix = bed.plan.prefix.clone();
    drop(servers);
    drop(ag);
    drop(bed);
    assert!(testbed::dataplane::list_netns(&prefix).is_empty());
    assert_eq!(link_attr(&host, &port, "mtu"), None, "no link left");
}
