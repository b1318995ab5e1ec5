//! Dataplane, agent, faults and truth with real namespaces and real packets (docs/design.md §5
//! "Topology" and "Programmed"). Needs root, `ip` and `nft`. Scenarios run one at a
//! time (a static lock) in their own state dir and always tear down (drop guard); the
//! harness is in `netns_support`.

mod netns_support;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use netns_support::{
    dial, dial6, events, first_success, rt, serve, serve_any, Bed, Server, EFFECT_TIMEOUT,
};
use testbed::agent::Agent;
use testbed::dataplane::{
    calico_iface_name, list_netns, netns_pids, Dataplane, DataplaneError, PodNet,
};
use testbed::fault::{FaultFile, Faults};
use testbed::truth::{read_truth, truth_ttfp, unix_now, TruthEvent, TruthKind};

/// One scenario's testbed with `nodes` nodes.
fn new_bed(name: &str, nodes: usize) -> Bed {
    Bed::new("fp-dp", name, nodes)
}

/// Pod `a` (uid-a) on node-1 and pod `b` (uid-b, serving `b\n`) on node-2, both
/// announced to their node's agent (`ag[0]`, `ag[1]`).
fn a_and_b(bed: &Bed, ag: &[Arc<Agent>]) -> (PodNet, PodNet, Server) {
    let a = bed
        .dp
        .add_pod("node-1", "default", "a", "uid-a")
        .expect("add a");
    let b = bed
        .dp
        .add_pod("node-2", "default", "b", "uid-b")
        .expect("add b");
    let sb = serve(&b.netns, "b");
    ag[0].endpoint_added(&a);
    ag[1].endpoint_added(&b);
    (a, b, sb)
}

#[test]
fn cross_node_pod_traffic_needs_both_endpoints_programmed() {
    let bed = new_bed("allow", 2);
    let started = Instant::now();
    let a = bed
        .dp
        .add_pod("node-1", "default", "a", "uid-a")
        .expect("add a");
    let add_ms = started.elapsed().as_secs_f64() * 1e3;
    let b = bed
        .dp
        .add_pod("node-2", "default", "b", "uid-b")
        .expect("add b");
    eprintln!("add_pod took {add_ms:.1} ms");
    assert!(bed.plan.nodes[0].pod_cidr.contains(a.ip));
    assert!(bed.plan.nodes[1].pod_cidr.contains(b.ip));
    assert_eq!(b.iface, calico_iface_name("default", "b"));
    let _sb = serve(&b.netns, "b");
    let _sa = serve(&a.netns, "a");

    // The node reaches its own pods before any programming (kubelet probes pass).
    assert_eq!(dial(&bed.node_ns(1), b.ip).as_deref(), Ok("b\n"));
    assert_eq!(dial(&bed.node_ns(0), a.ip).as_deref(), Ok("a\n"));
    // Forwarded traffic does not flow yet: pod→pod, node→remote pod, host→pod.
    assert!(dial(&a.netns, b.ip).is_err());
    assert!(dial(&bed.node_ns(0), b.ip).is_err());
    assert!(dial(&bed.plan.host_netns, b.ip).is_err());

    bed.dp.allow("node-2", b.ip).expect("allow b");
    assert!(dial(&a.netns, b.ip).is_err(), "source not programmed yet");
    // An in-cluster-like client in the host netns needs only the target programmed.
    assert_eq!(dial(&bed.plan.host_netns, b.ip).as_deref(), Ok("b\n"));
    bed.dp.allow("node-1", a.ip).expect("allow a");
    assert_eq!(dial(&a.netns, b.ip).as_deref(), Ok("b\n"));
    assert_eq!(dial(&b.netns, a.ip).as_deref(), Ok("a\n"));
    assert_eq!(bed.dp.allowed("node-1").expect("list"), vec![a.ip]);

    bed.dp.disallow("node-1", a.ip).expect("disallow a");
    bed.dp
        .disallow("node-1", a.ip)
        .expect("disallow is idempotent");
    assert!(
        dial(&a.netns, b.ip).is_err(),
        "revoked source must break the path"
    );
    assert!(bed.dp.allowed("node-1").expect("list").is_empty());
}

#[test]
fn same_name_pod_gets_same_iface_and_removal_is_idempotent() {
    let bed = new_bed("reuse", 2);
    let first = bed
        .dp
        .add_pod("node-1", "ns1", "web-0", "uid-1")
        .expect("add");
    bed.dp.allow("node-1", first.ip).expect("allow");
    // A second sandbox with the same name on the same node is refused.
    assert!(matches!(
        bed.dp.add_pod("node-1", "ns1", "web-0", "uid-x"),
        Err(DataplaneError::IfaceInUse { .. })
    ));
    // … and that failed attempt left the first pod's sandbox intact.
    let _s1 = serve(&first.netns, "web-0");
    assert_eq!(dial(&bed.node_ns(0), first.ip).as_deref(), Ok("web-0\n"));
    drop(_s1);
    bed.dp.remove_pod(&first).expect("remove");
    bed.dp.remove_pod(&first).expect("remove again");
    assert!(!list_netns(&bed.plan.prefix).contains(&first.netns));
    assert!(
        bed.dp.allowed("node-1").expect("list").is_empty(),
        "removal clears the allow set"
    );

    let second = bed
        .dp
        .add_pod("node-1", "ns1", "web-0", "uid-2")
        .expect("re-add");
    assert_eq!(second.iface, first.iface);
    assert_ne!(second.netns, first.netns);
    assert_ne!(
        second.ip, first.ip,
        "Calico-like FIFO IPAM does not hand the freed IP out at once"
    );
    let _s = serve(&second.netns, "web-0");
    assert_eq!(dial(&bed.node_ns(0), second.ip).as_deref(), Ok("web-0\n"));

    // Concurrent CNI ADDs get distinct addresses and all work.
    let pods: Vec<PodNet> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|i| {
                let dp = bed.dp.clone();
                s.spawn(move || dp.add_pod("node-2", "burst", &format!("p{i}"), &format!("u{i}")))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("join").expect("add"))
            .collect()
    });
    let mut ips: Vec<Ipv4Addr> = pods.iter().map(|p| p.ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 6);
    let _servers: Vec<Server> = pods.iter().map(|p| serve(&p.netns, &p.pod)).collect();
    for p in &pods {
        assert_eq!(dial(&bed.node_ns(1), p.ip), Ok(format!("{}\n", p.pod)));
    }
}

#[test]
fn program_delay_holds_first_packet_and_truth_agrees() {
    let bed = new_bed("delay", 2);
    let (truth, path) = bed.truth();
    let faults = Faults::new(
        FaultFile::parse("rules:\n- nodes: {all: true}\n  program_delay: 1s\n").expect("faults"),
    );
    let rt = rt();
    let _g = rt.enter();
    let ag = bed.agents(&faults, &[]);

    let b = bed
        .dp
        .add_pod("node-2", "default", "b", "uid-b")
        .expect("add b");
    let _sb = serve(&b.netns, "b");
    ag[1].endpoint_added(&b);
    let a = bed
        .dp
        .add_pod("node-1", "default", "a", "uid-a")
        .expect("add a");
    ag[0].endpoint_added(&a);
    // A third endpoint removed before its delay ran out is never programmed.
    let c = bed
        .dp
        .add_pod("node-1", "default", "c", "uid-c")
        .expect("add c");
    ag[0].endpoint_added(&c);
    ag[0].endpoint_removed(&c);
    truth.emit(TruthEvent::pod(
        TruthKind::ReadinessOk,
        &a,
        serde_json::json!({}),
    ));

    let success = first_success(
        &a.netns,
        b.ip,
        Duration::from_millis(20),
        Duration::from_secs(5),
    )
    .expect("path never came up");
    let added_a = events(&path, TruthKind::EndpointAdded, "uid-a")[0].t;
    // The agent logs a programming right after the nft change: the packet may win.
    let prog_a = bed.pod_events_until(TruthKind::EndpointProgrammed, "uid-a", 1, EFFECT_TIMEOUT);
    let prog_b = bed.pod_events_until(TruthKind::EndpointProgrammed, "uid-b", 1, EFFECT_TIMEOUT);
    assert_eq!((prog_a.len(), prog_b.len()), (1, 1));
    let programmed = prog_a[0].t.max(prog_b[0].t);
    assert!(
        success >= added_a + 1.0 - 0.06,
        "first success {:.3} s after endpoint_added",
        success - added_a
    );
    assert!(
        prog_a[0].t - added_a >= 1.0,
        "programmed {:.3} s after added",
        prog_a[0].t - added_a
    );
    assert!(
        prog_a[0].t - added_a < 1.3,
        "programmed {:.3} s after added",
        prog_a[0].t - added_a
    );
    assert_eq!(prog_a[0].detail["delay_seconds"], 1.0);
    // The first success lands within one dial period (+ slack) of the truth.
    assert!(
        (success - programmed).abs() < 0.25,
        "first success {:.3} vs truth {:.3}",
        success,
        programmed
    );
    // truth_ttfp agrees with the log.
    let ttfp = truth_ttfp(&read_truth(&path).expect("read"), "uid-a", "uid-b").expect("ttfp");
    let ready = events(&path, TruthKind::ReadinessOk, "uid-a")[0].t;
    assert!((ttfp - (programmed - ready)).abs() < 1e-6);

    // A check that c was NOT programmed: a bounded wait past its 1 s delay (counted
    // from its add, before the path came up) is the honest way.
    std::thread::sleep(Duration::from_millis(500));
    assert!(events(&path, TruthKind::EndpointProgrammed, "uid-c").is_empty());
    let st = ag[0].stats();
    assert_eq!((st.active_local_endpoints, st.pending_endpoints), (1, 0));
}

#[test]
fn resync_loop_programs_only_inside_open_windows() {
    let bed = new_bed("resync", 2);
    let applied_wall = unix_now();
    let faults = Faults::new(
        FaultFile::parse("rules:\n- nodes: {all: true}\n  program_delay: 300ms\n  resync_loop: {period: 2s, open: 200ms}\n")
            .expect("faults"),
    );
    let rt = rt();
    let _g = rt.enter();
    let ag = bed.agents(&faults, &[]);
    let (a, b, _sb) = a_and_b(&bed, &ag);
    // Due at ~0.3 s, after the first window [0, 0.2) closed: next window opens at 2 s.
    // A check that nothing was programmed yet: a bounded sleep into the closed window.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(dial(&a.netns, b.ip).is_err(), "programmed outside a window");
    let success = first_success(
        &a.netns,
        b.ip,
        Duration::from_millis(20),
        Duration::from_secs(4),
    )
    .expect("never programmed");
    for uid in ["uid-a", "uid-b"] {
        let p = bed.pod_events_until(TruthKind::EndpointProgrammed, uid, 1, EFFECT_TIMEOUT);
        assert_eq!(p.len(), 1, "{uid} programmed: {p:?}");
        let since = p[0].t - applied_wall;
        assert!(
            (2.0..2.2).contains(&since),
            "{uid} programmed {since:.3} s after the file was applied"
        );
    }
    assert!(
        success - applied_wall >= 1.95,
        "first success {:.3} s after apply",
        success - applied_wall
    );
}

#[test]
fn never_program_blocks_until_the_fault_is_cleared() {
    let bed = new_bed("never", 2);
    let path = bed.truth_path.clone();
    let faults = Faults::new(
        FaultFile::parse("rules:\n- nodes: {names: [node-2]}\n  never_program: true\n")
            .expect("faults"),
    );
    let rt = rt();
    let _g = rt.enter();
    let ag = bed.agents(&faults, &[]);
    let (a, b, _sb) = a_and_b(&bed, &ag);
    let added = Instant::now();
    // a (node-1, no fault) is programmed at once: wait for it.
    let prog_a = bed.pod_events_until(TruthKind::EndpointProgrammed, "uid-a", 1, EFFECT_TIMEOUT);
    assert_eq!(prog_a.len(), 1, "uid-a programmed: {prog_a:?}");
    // b must NOT be programmed: give it the same bounded 800 ms it had before (it
    // would be as quick as a without the fault).
    std::thread::sleep(Duration::from_millis(800).saturating_sub(added.elapsed()));
    assert!(events(&path, TruthKind::EndpointProgrammed, "uid-b").is_empty());
    assert!(dial(&a.netns, b.ip).is_err());

    ag[0].set_faults(FaultFile::default());
    let success = first_success(
        &a.netns,
        b.ip,
        Duration::from_millis(50),
        Duration::from_secs(3),
    );
    assert!(
        success.is_some(),
        "clearing the fault must let the stuck endpoint through"
    );
    let changed: Vec<_> = read_truth(&path)
        .expect("read")
        .into_iter()
        .filter(|e| e.event == TruthKind::FaultChanged)
        .collect();
    assert_eq!(changed.len(), 1);
    let prog_b = bed.pod_events_until(TruthKind::EndpointProgrammed, "uid-b", 1, EFFECT_TIMEOUT);
    assert_eq!(prog_b.len(), 1, "uid-b programmed: {prog_b:?}");
}

#[test]
fn destroy_leaves_no_netns_and_no_processes() {
    let bed = new_bed("destroy", 3);
    let p = bed
        .dp
        .add_pod("node-3", "default", "x", "uid-x")
        .expect("add");
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &p.netns, "sleep", "1000"])
        .spawn()
        .expect("spawn sleep in pod netns");
    // Wait until the child really is in the pod netns.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !netns_pids(std::slice::from_ref(&p.netns)).contains(&(child.id() as i32)) {
        assert!(
            Instant::now() < deadline,
            "sleep never showed up in the netns"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut names = list_netns(&bed.plan.prefix);
    names.sort();
    assert_eq!(names.len(), 1 + 3 + 1, "{names:?}");

    Dataplane::destroy(&bed.plan).expect("destroy");
    Dataplane::destroy(&bed.plan).expect("destroy is idempotent");
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the process in the pod netns was killed");
    let listed = String::from_utf8_lossy(
        &std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list")
            .stdout,
    )
    .into_owned();
    assert!(!listed.contains(&bed.plan.prefix), "left over: {listed}");
}

/// `ip -n NETNS ARGS…`'s stdout; panics when it fails.
fn ip_out(netns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .arg("-n")
        .arg(netns)
        .args(args)
        .output()
        .expect("run ip");
    assert!(out.status.success(), "ip -n {netns} {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dual_stack_pods_get_both_families_and_the_gate_holds_ipv6_too() {
    let bed = Bed::dual_stack("fp-dp", "dual", 2);
    let a = bed
        .dp
        .add_pod("node-1", "default", "a", "uid-a")
        .expect("add a");
    let a2 = bed
        .dp
        .add_pod("node-1", "default", "a2", "uid-a2")
        .expect("add a2");
    let b = bed
        .dp
        .add_pod("node-2", "default", "b", "uid-b")
        .expect("add b");
    let (n1, n2) = (
        bed.plan.nodes[0].ipv6.unwrap(),
        bed.plan.nodes[1].ipv6.unwrap(),
    );
    let (a6, a26, b6) = (a.ip6.unwrap(), a2.ip6.unwrap(), b.ip6.unwrap());
    assert!(n1.pod_cidr.contains(a6) && n2.pod_cidr.contains(b6));
    assert_eq!(
        Some(a6),
        bed.plan.nodes[0].ipv6_of(a.ip),
        "same offset in both blocks"
    );

    // What the pod and its node look like.
    let addrs = ip_out(&a.netns, &["-6", "-o", "addr", "show", "dev", "eth0"]);
    assert!(
        addrs.contains(&format!("inet6 {a6}/128 scope global")),
        "{addrs}"
    );
    let global = addrs.lines().find(|l| l.contains("scope global")).unwrap();
    assert!(!global.contains("tentative"), "usable at once: {addrs}");
    let routes = ip_out(&a.netns, &["-6", "route", "show", "default"]);
    assert!(
        routes.contains("via fe80::ecee:eeff:feee:eeee dev eth0"),
        "{routes}"
    );
    let neigh = ip_out(&a.netns, &["-6", "neigh", "show", "dev", "eth0"]);
    assert!(
        neigh.contains("fe80::ecee:eeff:feee:eeee lladdr ee:ee:ee:ee:ee:ee PERMANENT"),
        "{neigh}"
    );
    let node_ns = bed.node_ns(0);
    let ll = ip_out(&node_ns, &["-6", "-o", "addr", "show", "dev", &a.iface]);
    assert!(
        ll.contains("inet6 fe80::ecee:eeff:feee:eeee/64 scope link"),
        "{ll}"
    );
    let r = ip_out(&node_ns, &["-6", "route", "show"]);
    assert!(r.contains(&format!("{a6} dev {}", a.iface)), "{r}");
    assert!(r.contains(&format!("blackhole {}", n1.pod_cidr)), "{r}");
    assert!(
        r.contains(&format!("{} via {} dev eth0", n2.pod_cidr, n2.ip)),
        "{r}"
    );
    // The IPv4 side is as in an IPv4-only testbed.
    let r4 = ip_out(&node_ns, &["route", "show"]);
    assert!(
        r4.contains(&format!("{} dev {} scope link", a.ip, a.iface)),
        "{r4}"
    );

    let _s = [
        serve_any(&a.netns, "a"),
        serve_any(&a2.netns, "a2"),
        serve_any(&b.netns, "b"),
    ];
    // The node reaches its own pods over IPv6 at once; forwarded IPv6 waits, like IPv4.
    assert_eq!(dial6(&bed.node_ns(1), b6).as_deref(), Ok("b\n"));
    assert_eq!(dial6(&node_ns, a6).as_deref(), Ok("a\n"));
    assert!(
        dial6(&a.netns, b6).is_err(),
        "IPv6 cross-node before programming"
    );
    assert!(
        dial6(&a.netns, a26).is_err(),
        "IPv6 same-node before programming"
    );
    assert!(dial(&a.netns, b.ip).is_err(), "IPv4 before programming");

    for (node, p) in [("node-1", &a), ("node-1", &a2), ("node-2", &b)] {
        bed.dp.allow(node, p.ip).expect("allow");
    }
    assert_eq!(dial6(&a.netns, b6).as_deref(), Ok("b\n"), "IPv6 cross-node");
    assert_eq!(dial6(&b.netns, a6).as_deref(), Ok("a\n"), "IPv6 back");
    assert_eq!(
        dial6(&a.netns, a26).as_deref(),
        Ok("a2\n"),
        "IPv6 same node"
    );
    assert_eq!(
        dial(&a.netns, b.ip).as_deref(),
        Ok("b\n"),
        "IPv4 cross-node"
    );
    assert_eq!(
        dial(&a.netns, a2.ip).as_deref(),
        Ok("a2\n"),
        "IPv4 same node"
    );
    assert_eq!(
        dial6(&bed.plan.host_netns, b6).as_deref(),
        Ok("b\n"),
        "host"
    );

    // Revoking the endpoint takes both families away together.
    bed.dp.disallow("node-1", a.ip).expect("disallow a");
    assert!(dial6(&a.netns, b6).is_err(), "IPv6 after revoke");
    assert!(dial(&a.netns, b.ip).is_err(), "IPv4 after revoke");
    bed.dp.remove_pod(&a).expect("remove a");
    assert!(!ip_out(&node_ns, &["-6", "route", "show"]).contains(&a6.to_string()));
}

#[test]
fn ipv4_only_testbeds_have_no_ipv6_anywhere() {
    let bed = new_bed("v4only", 2);
    let a = bed
        .dp
        .add_pod("node-1", "default", "a", "uid-a")
        .expect("add a");
    assert_eq!(a.ip6, None);
    assert!(bed.plan.nodes.iter().all(|n| n.ipv6.is_none()));
    let global = ip_out(&a.netns, &["-6", "addr", "show", "scope", "global"]);
    assert!(global.trim().is_empty(), "{global}");
    let r6 = ip_out(&bed.node_ns(0), &["-6", "route", "show"]);
    assert!(!r6.contains("via") && !r6.contains("blackhole"), "{r6}");
    let link = ip_out(
        &bed.node_ns(0),
        &["-6", "-o", "addr", "show", "dev", &a.iface],
    );
    assert!(!link.contains("nodad"), "no explicit link-local: {link}");
    let nft = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &bed.node_ns(0),
            "nft",
            "list",
            "table",
            "inet",
            "firstpacket",
        ])
        .output()
        .expect("nft");
    let nft = String::from_utf8_lossy(&nft.stdout);
    assert!(
        nft.contains("set allowed") && !nft.contains("allowed6") && !nft.contains("ip6"),
        "{nft}"
    );
}
