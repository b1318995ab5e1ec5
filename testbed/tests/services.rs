//! The service dataplane with real namespaces and real packets (issue 5, `service`
//! kind): a Service and its EndpointSlice in the store, the kube-proxy-like
//! [`ServiceProxy`] on the client's node, a TCP server in a pod on another node.
//! Needs root, `ip` and `nft`. Scenarios run one at a time (a static lock) in their own
//! state dir and always tear down (drop guard); the harness is in `netns_support`.

mod netns_support;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netns_support::{dial_port, poll_until, rt, serve, Bed, Server, EFFECT_TIMEOUT};
use serde_json::json;
use testbed::api::{service_cidr, Kind, Store};
use testbed::dataplane::PodNet;
use testbed::plan::Ipv4Cidr;
use testbed::services::{
    ProgrammedFn, ServiceProgrammed, ServiceProxy, ServiceProxyConfig, NFT_SVC_TABLE,
};

/// Container port of the pod's server; the Service maps port 80 to it.
const TARGET_PORT: u16 = netns_support::PORT;
const SERVICE_PORT: u16 = 80;

/// One scenario's testbed with `nodes` nodes.
fn new_bed(name: &str, nodes: usize) -> Bed {
    Bed::new("fp-svc", name, nodes)
}

/// One TCP exchange from inside netns `from` to `ip:port` (100 ms connect budget, below
/// the first SYN retransmit). Returns the peer's answer or the error text.
fn dial(from: &str, ip: Ipv4Addr, port: u16) -> Result<String, String> {
    dial_port(from, ip, port, Duration::from_millis(100))
}

/// Dials every 25 ms until success or `limit`; returns the `Instant` the successful
/// attempt was started and how many attempts failed before.
fn first_success(from: &str, ip: Ipv4Addr, port: u16, limit: Duration) -> Option<(Instant, u32)> {
    let end = Instant::now() + limit;
    let mut failed = 0;
    while Instant::now() < end {
        let sent = Instant::now();
        if dial(from, ip, port).is_ok() {
            return Some((sent, failed));
        }
        failed += 1;
        std::thread::sleep(Duration::from_millis(25));
    }
    None
}

/// Creates the Pod object for a sandbox `net` with `labels`, bound and Running with
/// its IP, Ready as given (what the kubelet would write).
fn pod_object(store: &Store, net: &PodNet, labels: serde_json::Value) {
    store
        .create(
            Kind::Pod,
            json!({"metadata": {"name": net.pod, "namespace": net.namespace, "labels": labels},
                "spec": {"nodeName": net.node, "containers": [{"name": "c", "image": "target-server"}]}}),
        )
        .expect("create pod");
}

fn set_ready(store: &Store, net: &PodNet, ready: bool) {
    let ip = net.ip.to_string();
    store
        .modify(Kind::Pod, Some(&net.namespace), &net.pod, |p| {
            p["status"]["phase"] = json!("Running");
            p["status"]["podIP"] = json!(ip);
            p["status"]["podIPs"] = json!([{"ip": ip}]);
            p["status"]["conditions"] =
                json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
            Ok(())
        })
        .expect("set pod status");
}

/// The calls of the delay callback (when) and the programmed reports (when, what).
#[derive(Default)]
struct Record {
    delay_calls: Mutex<Vec<Instant>>,
    programmed: Mutex<Vec<(Instant, ServiceProgrammed)>>,
}

impl Record {
    fn wait_programmed(
        &self,
        after: usize,
        pred: impl Fn(&ServiceProgrammed) -> bool,
    ) -> Option<(Instant, ServiceProgrammed)> {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            {
                let g = self.programmed.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(hit) = g.iter().skip(after).find(|(_, p)| pred(p)) {
                    return Some(hit.clone());
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// The proxy's `on_programmed` callback: records each report with its arrival.
    fn recorder(self: &Arc<Self>) -> ProgrammedFn {
        let rec = self.clone();
        Arc::new(move |p| {
            rec.programmed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((Instant::now(), p))
        })
    }

    fn programmed_len(&self) -> usize {
        self.programmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// A store with the plan's service CIDR and the controllers (EndpointSlices) running
/// on `rt`; returns the store and the CIDR.
fn store_with_controllers(rt: &tokio::runtime::Runtime, bed: &Bed) -> (Arc<Store>, Ipv4Cidr) {
    let store = Store::new();
    let cidr = service_cidr(bed.plan.index);
    store.set_service_cidr(cidr);
    rt.spawn(testbed::controllers::run(store.clone()));
    (store, cidr)
}

/// An API client of `store` served over plain HTTP on 127.0.0.1 (the proxy watches
/// through the API, as on a node). Built on `rt`, where the proxy runs.
fn api_of(rt: &tokio::runtime::Runtime, store: &Arc<Store>) -> testbed::client::ApiClient {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind API");
        let addr = listener.local_addr().expect("API addr");
        tokio::spawn(testbed::api::serve(store.clone(), listener));
        testbed::client::ClusterEndpoint {
            url: format!("http://{addr}"),
            ca_pem: None,
            identity: testbed::client::ClientIdentity::Anonymous,
        }
        .client()
        .await
        .expect("API client")
    })
}

/// Client pod `client` on node-1 and target pod `target` (serving `target\n`) on
/// node-2, both allowed in the CNI dataplane.
fn client_and_target(bed: &Bed) -> (PodNet, PodNet, Server) {
    let c = bed
        .dp
        .add_pod("node-1", "default", "client", "uid-c")
        .expect("add client");
    let t = bed
        .dp
        .add_pod("node-2", "default", "target", "uid-t")
        .expect("add target");
    bed.dp.allow("node-1", c.ip).expect("allow client");
    bed.dp.allow("node-2", t.ip).expect("allow target");
    let server = serve(&t.netns, "target");
    (c, t, server)
}

fn nft_tables(netns: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", netns, "nft", "list", "tables"])
        .output()
        .expect("nft list tables");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cluster_ip_works_only_after_the_delayed_programming_and_stops_when_the_endpoint_goes() {
    let bed = new_bed("path", 2);
    let rt = rt();
    let (store, cidr) = store_with_controllers(&rt, &bed);
    // Client pod on node-1, target pod on node-2, both programmed in the CNI dataplane,
    // so only the service rules decide.
    let (c, t, _server) = client_and_target(&bed);
    assert_eq!(
        dial(&c.netns, t.ip, TARGET_PORT).as_deref(),
        Ok("target\n"),
        "pod IP path works"
    );

    let delay_ms = Arc::new(AtomicU64::new(0));
    let rec = Arc::new(Record::default());
    let kp_metrics = testbed::kube_proxy::KubeProxyMetrics::new(testbed::truth::unix_now());
    let cfg = ServiceProxyConfig {
        node: "node-1".into(),
        netns: bed.plan.nodes[0].netns.clone(),
        service_cidr: cidr,
        delay: {
            let (d, rec) = (delay_ms.clone(), rec.clone());
            Arc::new(move |node: &str| {
                assert_eq!(node, "node-1");
                rec.delay_calls
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Instant::now());
                Duration::from_millis(d.load(Ordering::SeqCst))
            })
        },
        on_programmed: rec.recorder(),
        metrics: Some(kp_metrics.clone()),
    };
    let proxy = rt
        .block_on(ServiceProxy::start(api_of(&rt, &store), cfg))
        .expect("start proxy");
    assert!(nft_tables(&bed.plan.nodes[0].netns).contains(NFT_SVC_TABLE));

    // A Service selecting the (not yet Ready) target: a ClusterIP from the plan's CIDR.
    let svc = store
        .create(
            Kind::Service,
            json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"},
                    "ports": [{"port": SERVICE_PORT, "targetPort": TARGET_PORT}]}}),
        )
        .expect("create service");
    let vip: Ipv4Addr = svc["spec"]["clusterIP"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("clusterIP allocated");
    assert!(cidr.contains(vip), "{vip} in {cidr}");
    pod_object(&store, &t, json!({"app": "web"}));
    set_ready(&store, &t, false);
    rec.wait_programmed(0, |p| p.service == "web" && p.cluster_ip == Some(vip))
        .expect("service without endpoints programmed");
    let err = dial(&c.netns, vip, SERVICE_PORT).expect_err("no ready endpoint yet");
    assert!(
        err.contains("refused"),
        "a port without endpoints is rejected: {err}"
    );

    // The target turns Ready: the slice changes at once, the rule only after the delay.
    let delay = Duration::from_millis(2000);
    delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    let calls_before = rec
        .delay_calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len();
    let reports_before = rec.programmed_len();
    set_ready(&store, &t, true);
    let (ok_sent, failures) = first_success(&c.netns, vip, SERVICE_PORT, Duration::from_secs(8))
        .expect("ClusterIP reachable after the delay");
    let seen = *rec
        .delay_calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(calls_before)
        .expect("the delay callback ran for the readiness change");
    let lag = ok_sent.saturating_duration_since(seen);
    eprintln!("first success {lag:?} after the change was seen ({failures} failures before)");
    assert!(
        failures > 0,
        "the ClusterIP did not work before programming"
    );
    assert!(
        lag + Duration::from_millis(50) >= delay,
        "too early: {lag:?} < {delay:?}"
    );
    assert!(
        lag <= delay + Duration::from_millis(400),
        "too late: {lag:?}"
    );
    let (at, p) = rec
        .wait_programmed(reports_before, |p| !p.added.is_empty())
        .expect("programmed report with the endpoint");
    assert!(at.saturating_duration_since(seen) + Duration::from_millis(50) >= delay);
    assert!(
        at <= ok_sent + Duration::from_millis(200),
        "reported once the rule is in"
    );
    assert_eq!(p.node, "node-1");
    assert_eq!(
        p.added[0].uid.as_deref(),
        Some(
            store.get(Kind::Pod, Some("default"), "target").unwrap()["metadata"]["uid"]
                .as_str()
                .unwrap()
        )
    );
    assert_eq!(p.added[0].ip, t.ip);
    assert_eq!(p.delay, delay);
    let lines = p.truth_events();
    assert_eq!(lines[0].pod.as_deref(), Some("target"));
    assert_eq!(lines[0].node.as_deref(), Some("node-1"));
    // Node-local clients (nat output) reach the ClusterIP too.
    assert_eq!(
        dial(&bed.plan.nodes[0].netns, vip, SERVICE_PORT).as_deref(),
        Ok("target\n")
    );
    // The Service IP on another port is rejected, an unallocated ClusterIP is dropped.
    assert!(dial(&c.netns, vip, 81).unwrap_err().contains("refused"));
    let unallocated = cidr.nth(3);
    assert!(!dial(&c.netns, unallocated, SERVICE_PORT)
        .unwrap_err()
        .contains("refused"));

    // The endpoint goes away (not Ready): after the (short) delay the ClusterIP fails.
    delay_ms.store(300, Ordering::SeqCst);
    let reports_before = rec.programmed_len();
    set_ready(&store, &t, false);
    let (at, p) = rec
        .wait_programmed(reports_before, |p| !p.removed.is_empty())
        .expect("programmed report with the endpoint removed");
    assert!(p.endpoints.is_empty());
    assert_eq!(p.removed[0].ip, t.ip);
    // Refused for a fresh 4-tuple; a reused client port can still match the old
    // connection's conntrack entry (TIME_WAIT reopen keeps its DNAT binding, as with
    // kube-proxy, which does not flush TCP entries) and then times out instead.
    let err = dial(&c.netns, vip, SERVICE_PORT).expect_err("no endpoint any more");
    eprintln!("after removal: {err}");
    eprintln!("removal programmed {:?} ago", at.elapsed());
    // The pod IP path is unaffected.
    assert_eq!(dial(&c.netns, t.ip, TARGET_PORT).as_deref(), Ok("target\n"));

    // Service deleted: its rules go (report without a ClusterIP); shutdown removes the table.
    let reports_before = rec.programmed_len();
    store
        .delete(Kind::Service, Some("default"), "web", None, None)
        .expect("delete service");
    rec.wait_programmed(reports_before, |p| p.cluster_ip.is_none())
        .expect("removal of the Service reported");
    rt.block_on(proxy.shutdown()).expect("shutdown");
    assert!(!nft_tables(&bed.plan.nodes[0].netns).contains(NFT_SVC_TABLE));

    // kube-proxy's page counted the writes, and the 2 s programming shows in
    // kubeproxy_network_programming_duration_seconds (above the 1 s bucket).
    let page = kp_metrics.render();
    let scrape = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_owned())))
        .expect("kube-proxy page parses");
    let histogram = |name: &str| match scrape.samples.iter().find(|s| s.metric == name) {
        Some(prometheus_parse::Sample {
            value: prometheus_parse::Value::Histogram(h),
            ..
        }) => h.clone(),
        other => panic!("{name}: {other:?}\n{page}"),
    };
    let syncs = histogram("kubeproxy_sync_proxy_rules_duration_seconds");
    assert!(
        syncs.last().unwrap().count >= 4.0,
        "≥ 4 table writes (added, endpoint, removed, deleted): {page}"
    );
    let prog = histogram("kubeproxy_network_programming_duration_seconds");
    let le = |b: f64| prog.iter().find(|x| x.less_than == b).unwrap().count;
    assert!(le(f64::INFINITY) - le(1.0) >= 1.0, "{page}");
    assert!(le(f64::INFINITY) - le(3.0) == 0.0, "{page}");
}

#[test]
fn a_newer_change_supersedes_one_still_waiting_for_its_delay() {
    let bed = new_bed("supersede", 2);
    let rt = rt();
    let (store, cidr) = store_with_controllers(&rt, &bed);
    let (c, t, _server) = client_and_target(&bed);

    // A long delay for every change seen while the target is Ready (the proxy may see
    // the Service and its slice as one change or two, by how its initial lists
    // arrive), a short one once it is not Ready: the endpoint must never be programmed.
    let not_ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen_changes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rec = Arc::new(Record::default());
    let cfg = ServiceProxyConfig {
        node: "node-1".into(),
        netns: bed.plan.nodes[0].netns.clone(),
        service_cidr: cidr,
        delay: {
            let (n, seen) = (not_ready.clone(), seen_changes.clone());
            Arc::new(move |_| {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n.load(std::sync::atomic::Ordering::SeqCst) {
                    Duration::from_millis(200)
                } else {
                    Duration::from_millis(1500)
                }
            })
        },
        on_programmed: rec.recorder(),
        metrics: None,
    };
    // Service, then a Ready target, both before the proxy starts: one change (1.5 s).
    let svc = store
        .create(
            Kind::Service,
            json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": SERVICE_PORT, "targetPort": TARGET_PORT}]}}),
        )
        .expect("create service");
    let vip: Ipv4Addr = svc["spec"]["clusterIP"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("vip");
    pod_object(&store, &t, json!({"app": "web"}));
    set_ready(&store, &t, true);
    let deadline = Instant::now() + Duration::from_secs(5);
    while store
        .list(Kind::EndpointSlice, Some("default"))
        .0
        .iter()
        .all(|s| s["endpoints"].as_array().is_none_or(|a| a.is_empty()))
    {
        assert!(Instant::now() < deadline, "slice never got the endpoint");
        std::thread::sleep(Duration::from_millis(10));
    }
    let proxy = rt
        .block_on(ServiceProxy::start(api_of(&rt, &store), cfg))
        .expect("start");
    // The proxy saw its first change; the rest of its initial lists a moment later.
    let seen = poll_until(
        EFFECT_TIMEOUT,
        Duration::from_millis(10),
        || seen_changes.load(std::sync::atomic::Ordering::SeqCst),
        |n| *n > 0,
    );
    assert!(seen > 0, "the proxy saw no change");
    std::thread::sleep(Duration::from_millis(100));
    not_ready.store(true, std::sync::atomic::Ordering::SeqCst);
    set_ready(&store, &t, false);
    // Past both delays: the not-Ready state won, the endpoint never went in. That the
    // endpoint was NOT programmed needs a bounded wait past both delays; that the
    // Service itself was programmed is polled.
    std::thread::sleep(Duration::from_millis(2000));
    let reports = poll_until(
        EFFECT_TIMEOUT,
        Duration::from_millis(10),
        || {
            rec.programmed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        },
        |r| !r.is_empty(),
    );
    assert!(
        !reports.is_empty(),
        "the Service itself was programmed (nothing reported within {EFFECT_TIMEOUT:?} more)"
    );
    assert!(
        reports.iter().all(|(_, p)| p.added.is_empty()),
        "superseded endpoint programmed: {reports:?}"
    );
    assert!(dial(&c.netns, vip, SERVICE_PORT)
        .unwrap_err()
        .contains("refused"));
    rt.block_on(proxy.shutdown()).expect("shutdown");
}
