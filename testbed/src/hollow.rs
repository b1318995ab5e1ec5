//! Hollow nodes (`testbed up --hollow-nodes N`): Nodes that exist only in the API, for
//! runs at a scale (hundreds to a thousand nodes) that network namespaces on one machine
//! cannot hold. One [`Hollow`] drives all of them from a few tasks on one thread:
//!
//! - **Nodes** `hollow-1`…`hollow-N`, labelled [`HOLLOW_LABEL`]`=true` (plus the usual
//!   hostname/os/arch labels), InternalIP `10.X.224.0/21 + i` ([`node_ip`]), registered
//!   as the kubelet registers (create, then the status with the four kubelet-owned
//!   conditions healthy).
//! - **Heartbeats**: each Node's Lease in `kube-node-lease` is renewed every
//!   [`crate::kubelet::HEARTBEAT`] (10 s, the kubelet's renew interval: a quarter of its
//!   40 s lease), and its status re-posted every [`crate::kubelet::NODE_STATUS_REPORT`]
//!   (60 s, the kubelet's `nodeStatusReportFrequency`), so the real node-lifecycle
//!   controller keeps them Ready. The renewals are spread evenly over the period (one
//!   every `10 s / N`) with at most [`HEARTBEAT_CONCURRENCY`] requests in flight, so
//!   the API sees a steady `N / 10` writes per second instead of bursts.
//! - **Agent pods**: a `calico-node-hollow-i` pod per node (the shape
//!   [`crate::daemon::calico_node_pod`] gives netns nodes), Running and Ready with
//!   `hostIP` = `podIP` = the node IP. One HTTP listener on `0.0.0.0:9091` in the host
//!   netns, where the whole `10.X.224.0/21` is a local address (on `lo`), serves every
//!   hollow node's Felix page; the connection's local address names the node. So both of
//!   the prober's scrape paths reach it: direct `http://<hostIP>:9091/metrics` from the
//!   host netns (where `testbed exec` runs) and the API server's pod proxy. Each scrape
//!   records one fast dataplane apply (5–15 ms, batch 1), so counters move. With
//!   `--kube-proxy-metrics all|localhost` each node also has a `kube-proxy-hollow-i`
//!   pod; with `all` a second shared listener serves its page on port 10249.
//!   With [`DirectScrapes::Hold`], a request that did not come through the API server's
//!   pod proxy (no `X-Forwarded-For` header; kube-apiserver's proxy, Go's
//!   `httputil.ReverseProxy`, adds one, and so does the built-in API server's) is held
//!   unanswered until the client gives up: direct scrapes fail by timeout as from a
//!   prober whose pod network cannot reach node ports.
//! - **Probe pods**: every pod bound to a hollow node (but its agent pod) is run
//!   synthetically, from one pod watch on all pods: an IP from `10.X.232.0/21`
//!   ([`pod_ip_range`]), `Running` and `Ready` at once (truth `endpoint_added`, then
//!   `readiness_ok`; `endpoint_programmed` at once unless it is a source). A
//!   `target-server probe` pod (first arg `probe`) whose `--target` is another hollow
//!   pod's IP gets its first success [`HollowConfig::ttfp`] after Ready (truth
//!   `endpoint_programmed` of the source then, so the §6 truth TTFP is the configured
//!   one), keeps "dialing" for `--hold`, then terminates with exit code 0 and a
//!   [`firstpacket_report::SourceReport`] as its termination message, as the real
//!   binary writes it. Its target is any other hollow pod (`serve` pods and anything
//!   else stay Running and Ready until deleted).
//! - **Hollow ↔ netns pairs carry no packets**: a hollow source whose target is not a
//!   hollow pod reports `no_success` (every attempt timed out) after `--give-up`; a netns
//!   source dialing a hollow pod's IP finds nothing there. Gate hollow nodes apart with
//!   `--node-selector testbed.firstpacket.io/hollow=true`, netns nodes with
//!   `--node-selector '!testbed.firstpacket.io/hollow'`.
//! - **Deletion**: a pod with `deletionTimestamp` is removed at once (DELETE with grace 0
//!   and a UID precondition, as the kubelet's status manager does); its IP goes back to
//!   the pool. `activeDeadlineSeconds` is not enforced on hollow nodes.
//!
//! Memory is bounded by N (a node entry and a Felix page state each) plus the pods on
//! hollow nodes; no process, netns or interface is created per hollow node.

use crate::client::{core_path, ApiClient, PatchKind};
use crate::felix::FelixMetrics;
use crate::plan::Ipv4Cidr;
use crate::truth::{Truth, TruthEvent, TruthKind};
use anyhow::{Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// Label on every hollow Node (value `true`).
pub const HOLLOW_LABEL: &str = "testbed.firstpacket.io/hollow";

/// Most hollow nodes a testbed holds (their IPs fill `10.X.224.0/21`).
pub const MAX_HOLLOW_NODES: usize = 2000;

/// API requests in flight at most for registration and heartbeats.
pub const HEARTBEAT_CONCURRENCY: usize = 16;

/// Default [`HollowConfig::ttfp`]: 500 ms.
pub const DEFAULT_TTFP: Duration = Duration::from_millis(500);

/// How hollow agents answer scrapes that did not come through the API server's proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectScrapes {
    /// Answered like proxied ones (default).
    #[default]
    Serve,
    /// Held unanswered until the client closes the connection (at most 5 min).
    Hold,
}

impl std::str::FromStr for DirectScrapes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "serve" => Ok(DirectScrapes::Serve),
            "hold" => Ok(DirectScrapes::Hold),
            other => Err(format!("{other:?}: expected serve or hold")),
        }
    }
}

/// What `testbed up` asks for (`--hollow-nodes`, `--hollow-ttfp`,
/// `--hollow-direct-scrapes`).
#[derive(Debug, Clone)]
pub struct HollowSettings {
    /// How many hollow nodes.
    pub count: usize,
    /// [`HollowConfig::ttfp`].
    pub ttfp: Duration,
    /// [`HollowConfig::direct_scrapes`].
    pub direct_scrapes: DirectScrapes,
}

/// What the hollow nodes are started with.
#[derive(Debug, Clone)]
pub struct HollowConfig {
    /// How many (`hollow-1`…`hollow-N`), at most [`MAX_HOLLOW_NODES`].
    pub count: usize,
    /// Time from a source pod's Ready to its first successful attempt (its TTFP).
    pub ttfp: Duration,
    /// How direct (not proxied) agent scrapes are answered.
    pub direct_scrapes: DirectScrapes,
    /// The plan's subnet index (the `X` of `10.X.…`).
    pub index: u8,
    /// kube-proxy pods on hollow nodes as on netns ones (`--kube-proxy-metrics`): `all`
    /// = a pod per node and its page on `hostIP:10249` (one shared listener),
    /// `localhost` = the pods without a reachable page (refused, as kube-proxy's
    /// default `127.0.0.1:10249` is from off the node), `none` = no pods.
    pub kube_proxy: crate::kube_proxy::MetricsBind,
}

/// Name of hollow node `i` (1-based): `hollow-<i>`.
pub fn node_name(i: usize) -> String {
    format!("hollow-{i}")
}

/// The block holding every hollow node's InternalIP: `10.X.224.0/21` (above the netns
/// nodes' pod blocks `10.X.1.0/24`…`10.X.200.0/24`). Added to the host netns' `lo`.
pub fn node_ip_range(index: u8) -> Ipv4Cidr {
    Ipv4Cidr {
        addr: Ipv4Addr::new(10, index, 224, 0),
        prefix_len: 21,
    }
}

/// InternalIP of hollow node `i` (1-based, ≤ [`MAX_HOLLOW_NODES`]).
pub fn node_ip(index: u8, i: usize) -> Ipv4Addr {
    node_ip_range(index).nth(i as u32)
}

/// Where hollow pods' IPs come from: `10.X.232.0/21` (2046 addresses, reused after
/// deletion). Not routed anywhere: nothing can connect to a hollow pod.
pub fn pod_ip_range(index: u8) -> Ipv4Cidr {
    Ipv4Cidr {
        addr: Ipv4Addr::new(10, index, 232, 0),
        prefix_len: 21,
    }
}

/// The Node object of hollow node `name` at `ip`: labels (hostname, os, arch,
/// [`HOLLOW_LABEL`]), addresses, capacity, kubelet endpoint, nodeInfo, the four
/// kubelet-owned conditions healthy.
pub fn node_object(name: &str, ip: Ipv4Addr) -> Value {
    let arch = std::env::consts::ARCH
        .replace("x86_64", "amd64")
        .replace("aarch64", "arm64");
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch, "beta.kubernetes.io/os": "linux",
            "beta.kubernetes.io/arch": arch, HOLLOW_LABEL: "true",
        } },
        "spec": {},
        "status": node_status(ip, &Value::Null),
    })
}

fn node_status(ip: Ipv4Addr, current_conditions: &Value) -> Value {
    json!({
        "addresses": [
            { "type": "InternalIP", "address": ip.to_string() },
        ],
        "capacity": { "cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi" },
        "allocatable": { "cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi" },
        "conditions": crate::kubelet::node_conditions(current_conditions),
        "daemonEndpoints": { "kubeletEndpoint": { "Port": crate::kubelet::KUBELET_PORT } },
        "nodeInfo": {
            "kubeletVersion": "v1.32.4-testbed-hollow", "kubeProxyVersion": "",
            "osImage": "firstpacket testbed (hollow node)", "kernelVersion": "",
            "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
            "containerRuntimeVersion": "hollow://0.1.0",
            "machineID": "", "systemUUID": "", "bootID": "",
        },
    })
}

/// One hollow node's state.
struct HollowNode {
    name: String,
    ip: Ipv4Addr,
    /// Its Felix page's counters.
    felix: Mutex<FelixMetrics>,
    /// Its kube-proxy page.
    kube_proxy: crate::kube_proxy::KubeProxyMetrics,
    /// Conditions last posted (transition times kept).
    conditions: Mutex<Value>,
    /// When the status was last posted.
    status_at: Mutex<Instant>,
}

/// A hollow pod's IP pool and what runs.
#[derive(Default)]
struct Pods {
    /// uid → pod IP (pods being run).
    running: HashMap<String, Ipv4Addr>,
    /// IPs in use (for "is the target a hollow pod").
    in_use: BTreeSet<Ipv4Addr>,
    free: VecDeque<Ipv4Addr>,
    /// UIDs whose deletion was sent.
    deleting: BTreeSet<String>,
}

struct Inner {
    cfg: HollowConfig,
    api: ApiClient,
    truth: Truth,
    nodes: Vec<HollowNode>,
    by_name: HashMap<String, usize>,
    by_ip: HashMap<Ipv4Addr, usize>,
    pods: Mutex<Pods>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The running hollow nodes. Dropping it stops their tasks (the Nodes stay in the API
/// until the control plane goes).
pub struct Hollow {
    tasks: Vec<JoinHandle<()>>,
    names: Vec<String>,
}

impl Drop for Hollow {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Hollow {
    /// Registers the Nodes, their Leases and agent pods through `api`, binds the shared
    /// metrics listener on `0.0.0.0:9091` and starts the heartbeat, pod-watch and
    /// listener tasks. Must run on a runtime inside the host netns (where
    /// [`node_ip_range`] is local). Returns once every Node and agent pod exists.
    /// Errors: count out of range, the listener's bind, a Node that could not be
    /// registered (after retries).
    pub async fn start(cfg: HollowConfig, api: ApiClient, truth: Truth) -> Result<Hollow> {
        anyhow::ensure!(
            (1..=MAX_HOLLOW_NODES).contains(&cfg.count),
            "hollow node count {} is out of range (1..={MAX_HOLLOW_NODES})",
            cfg.count
        );
        let now = Instant::now();
        let start_unix = crate::truth::unix_now();
        let nodes: Vec<HollowNode> = (1..=cfg.count)
            .map(|i| HollowNode {
                name: node_name(i),
                ip: node_ip(cfg.index, i),
                felix: Mutex::new(FelixMetrics::new(now, start_unix)),
                kube_proxy: crate::kube_proxy::KubeProxyMetrics::new(start_unix),
                conditions: Mutex::new(Value::Null),
                status_at: Mutex::new(now),
            })
            .collect();
        let pool = pod_ip_range(cfg.index);
        let pods = Pods {
            free: (2..2047).map(|n| pool.nth(n)).collect(),
            ..Pods::default()
        };
        let inner = Arc::new(Inner {
            by_name: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.clone(), i))
                .collect(),
            by_ip: nodes.iter().enumerate().map(|(i, n)| (n.ip, i)).collect(),
            cfg,
            api,
            truth,
            nodes,
            pods: Mutex::new(pods),
        });
        let listener = tokio::net::TcpListener::bind(("0.0.0.0", crate::felix::FELIX_METRICS_PORT))
            .await
            .context("bind the hollow agents' metrics listener on 0.0.0.0:9091 (host netns)")?;
        let mut tasks = vec![tokio::spawn(serve_metrics(
            inner.clone(),
            listener,
            Page::Felix,
        ))];
        if inner.cfg.kube_proxy.addr().is_some() {
            let port = crate::kube_proxy::KUBE_PROXY_METRICS_PORT;
            let l = tokio::net::TcpListener::bind(("0.0.0.0", port))
                .await
                .with_context(|| {
                    format!("bind the hollow kube-proxies' metrics listener on 0.0.0.0:{port}")
                })?;
            tasks.push(tokio::spawn(serve_metrics(
                inner.clone(),
                l,
                Page::KubeProxy,
            )));
        }
        // Registration: Nodes (create + status), Leases, agent pods.
        let results: Vec<Result<()>> = futures::stream::iter(0..inner.nodes.len())
            .map(|i| {
                let inner = inner.clone();
                async move { inner.register(i).await }
            })
            .buffer_unordered(HEARTBEAT_CONCURRENCY)
            .collect()
            .await;
        if let Some(e) = results.into_iter().find_map(Result::err) {
            return Err(e);
        }
        tasks.push(tokio::spawn(heartbeats(inner.clone())));
        tasks.push(tokio::spawn(watch_pods(inner.clone())));
        let names = inner.nodes.iter().map(|n| n.name.clone()).collect();
        tracing::info!(count = inner.nodes.len(), "hollow nodes registered");
        Ok(Hollow { tasks, names })
    }

    /// The hollow nodes' names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Retries `f` on transient API errors (no answer, 429, 5xx) up to 20 times, 250 ms
/// doubling to 2 s between tries.
async fn retry<F, Fut>(mut f: F) -> Result<Value, crate::client::ApiCallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Value, crate::client::ApiCallError>>,
{
    let mut wait = Duration::from_millis(250);
    let mut tries = 0;
    loop {
        match f().await {
            Err(e) if e.is_transient() && tries < 20 => {
                tries += 1;
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";

impl Inner {
    /// Node `i`: the Node (create, or take over on 409), its status, its Lease, its
    /// calico-node pod with a Running/Ready status.
    async fn register(&self, i: usize) -> Result<()> {
        let n = &self.nodes[i];
        let obj = node_object(&n.name, n.ip);
        let node = match retry(|| self.api.post("/api/v1/nodes", &obj)).await {
            Ok(v) => v,
            Err(e) if e.code == 409 => self
                .api
                .get(&core_path(None, "nodes", &n.name))
                .await
                .with_context(|| format!("read Node {}", n.name))?,
            Err(e) => return Err(e).with_context(|| format!("register Node {}", n.name)),
        };
        self.post_status(i).await;
        let owner = json!([{ "apiVersion": "v1", "kind": "Node", "name": n.name,
                             "uid": node["metadata"]["uid"] }]);
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": { "name": n.name, "namespace": "kube-node-lease", "ownerReferences": owner },
            "spec": lease_spec(&n.name),
        });
        match retry(|| self.api.post(LEASES, &lease)).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => self.renew_lease(i).await,
            Err(e) => return Err(e).with_context(|| format!("create the Lease of {}", n.name)),
        }
        let mut agents = vec![crate::daemon::calico_node_pod(
            &n.name,
            crate::daemon::CALICO_NODE_IMAGE,
        )];
        if self.cfg.kube_proxy != crate::kube_proxy::MetricsBind::None {
            agents.push(crate::daemon::kube_proxy_pod(&n.name));
        }
        for pod in agents {
            self.create_agent_pod(i, &pod).await?;
        }
        Ok(())
    }

    /// Creates agent pod `pod` (kept if it exists) on node `i`, Running and Ready.
    async fn create_agent_pod(&self, i: usize, pod: &Value) -> Result<()> {
        let n = &self.nodes[i];
        let pods = "/api/v1/namespaces/kube-system/pods";
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        match retry(|| self.api.post(pods, pod)).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("create agent pod {name}")),
        }
        let c = &pod["spec"]["containers"][0];
        let now = crate::kubelet::now_rfc3339();
        let status = running_status(
            n.ip,
            n.ip,
            c["name"].as_str().unwrap_or_default(),
            c["image"].as_str().unwrap_or_default(),
            name,
            &now,
        );
        let path = format!("{}/status", core_path(Some("kube-system"), "pods", name));
        retry(|| self.api.patch(&path, PatchKind::Merge, &status))
            .await
            .with_context(|| format!("status of agent pod {name}"))?;
        Ok(())
    }

    /// Posts node `i`'s status (conditions healthy, transition times kept).
    async fn post_status(&self, i: usize) {
        let n = &self.nodes[i];
        let status = {
            let current = lock(&n.conditions);
            node_status(n.ip, &current)
        };
        let path = format!("{}/status", core_path(None, "nodes", &n.name));
        match self
            .api
            .patch(&path, PatchKind::Merge, &json!({ "status": status }))
            .await
        {
            Ok(_) => {
                *lock(&n.conditions) = status["conditions"].clone();
                *lock(&n.status_at) = Instant::now();
            }
            Err(e) => tracing::warn!(node = %n.name, error = %e, "hollow node status not posted"),
        }
    }

    /// Renews node `i`'s Lease (creates it when gone).
    async fn renew_lease(&self, i: usize) {
        let n = &self.nodes[i];
        let path = format!("{LEASES}/{}", n.name);
        match self
            .api
            .patch(
                &path,
                PatchKind::Merge,
                &json!({ "spec": lease_spec(&n.name) }),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == 404 => {
                let lease = json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": { "name": n.name, "namespace": "kube-node-lease" },
                    "spec": lease_spec(&n.name),
                });
                if let Err(e) = self.api.post(LEASES, &lease).await {
                    tracing::warn!(node = %n.name, error = %e, "create hollow node lease");
                }
            }
            Err(e) => tracing::warn!(node = %n.name, error = %e, "renew hollow node lease"),
        }
    }

    /// One watch event's pod: starts, deletes or ignores it.
    fn observe(self: &Arc<Self>, pod: &Value) {
        let Some(node) = pod["spec"]["nodeName"].as_str() else {
            return;
        };
        let Some(&node_idx) = self.by_name.get(node) else {
            return;
        };
        if pod["metadata"]["annotations"][crate::kubelet::SIMULATED_ANNOTATION].is_string() {
            return;
        }
        let (Some(ns), Some(name), Some(uid)) = (
            pod["metadata"]["namespace"].as_str(),
            pod["metadata"]["name"].as_str(),
            pod["metadata"]["uid"].as_str(),
        ) else {
            return;
        };
        let mut pods = lock(&self.pods);
        if pod["metadata"]["deletionTimestamp"].is_string() {
            if pods.deleting.insert(uid.to_owned()) {
                let me = self.clone();
                let (ns, name, uid) = (ns.to_owned(), name.to_owned(), uid.to_owned());
                tokio::spawn(async move { me.delete_pod(&ns, &name, &uid).await });
            }
            return;
        }
        if pods.running.contains_key(uid)
            || matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            )
        {
            return;
        }
        let Some(ip) = pods.free.pop_front() else {
            tracing::warn!(pod = %name, "hollow pod IP pool exhausted");
            return;
        };
        pods.running.insert(uid.to_owned(), ip);
        pods.in_use.insert(ip);
        drop(pods);
        let c = &pod["spec"]["containers"][0];
        let info = PodInfo {
            ns: ns.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            node: node_idx,
            ip,
            container: c["name"].as_str().unwrap_or("main").to_owned(),
            image: c["image"].as_str().unwrap_or_default().to_owned(),
            args: c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect(),
        };
        tokio::spawn(self.clone().run_pod(info));
    }

    /// A pod gone from the API: its IP goes back to the pool.
    fn forget(&self, uid: &str) {
        let mut pods = lock(&self.pods);
        pods.deleting.remove(uid);
        if let Some(ip) = pods.running.remove(uid) {
            pods.in_use.remove(&ip);
            pods.free.push_back(ip);
        }
    }

    fn deleted(&self, uid: &str) -> bool {
        lock(&self.pods).deleting.contains(uid)
    }

    /// Removes the pod for good (grace 0, UID precondition), as the kubelet does once
    /// its containers are gone.
    async fn delete_pod(&self, ns: &str, name: &str, uid: &str) {
        let path = core_path(Some(ns), "pods", name);
        let opts = json!({ "gracePeriodSeconds": 0, "preconditions": { "uid": uid } });
        match retry(|| self.api.delete(&path, &opts)).await {
            Ok(_) => {}
            Err(e) if e.code == 404 || e.code == 409 => {}
            Err(e) => tracing::warn!(pod = %name, error = %e, "delete hollow pod"),
        }
    }

    fn pod_event(&self, kind: TruthKind, p: &PodInfo, detail: Value) {
        self.truth.emit(TruthEvent {
            node: Some(self.nodes[p.node].name.clone()),
            namespace: Some(p.ns.clone()),
            pod: Some(p.name.clone()),
            uid: Some(p.uid.clone()),
            ip: Some(p.ip.to_string()),
            iface: Some(crate::dataplane::calico_iface_name(&p.ns, &p.name)),
            detail,
            ..TruthEvent::new(kind)
        });
    }

    /// Runs one pod: Running and Ready at once; a `probe` pod then behaves as
    /// [`source_report`] describes and terminates.
    async fn run_pod(self: Arc<Self>, p: PodInfo) {
        let t0 = Instant::now();
        let start_unix = crate::truth::unix_now();
        let node_ip = self.nodes[p.node].ip;
        let now = crate::kubelet::now_rfc3339();
        let status = running_status(node_ip, p.ip, &p.container, &p.image, &p.uid, &now);
        let path = format!("{}/status", core_path(Some(&p.ns), "pods", &p.name));
        self.pod_event(TruthKind::EndpointAdded, &p, json!({ "hollow": true }));
        if let Err(e) = retry(|| self.api.patch(&path, PatchKind::Merge, &status)).await {
            tracing::debug!(pod = %p.name, error = %e, "hollow pod status");
            return;
        }
        let ready_at = t0.elapsed().as_secs_f64();
        self.pod_event(TruthKind::ReadinessOk, &p, json!({ "hollow": true }));
        let probe = ProbeArgs::parse(&p.args);
        let Some(probe) = probe else {
            self.pod_event(TruthKind::EndpointProgrammed, &p, json!({ "hollow": true }));
            return;
        };
        let reachable = probe
            .target
            .split(':')
            .next()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
            .is_some_and(|ip| lock(&self.pods).in_use.contains(&ip));
        let success = if reachable {
            tokio::time::sleep(self.cfg.ttfp).await;
            let sent = t0.elapsed().as_secs_f64();
            if self.deleted(&p.uid) {
                return;
            }
            self.pod_event(TruthKind::EndpointProgrammed, &p, json!({ "hollow": true }));
            tokio::time::sleep(probe.hold).await;
            Some(sent)
        } else {
            tokio::time::sleep(probe.give_up).await;
            None
        };
        if self.deleted(&p.uid) {
            return;
        }
        let report = source_report(&p.name, &probe, start_unix, ready_at, success);
        let message = serde_json::to_string(&report).unwrap_or_default();
        let now = crate::kubelet::now_rfc3339();
        let status = json!({ "status": {
            "phase": "Succeeded",
            "conditions": pod_conditions(false, "PodCompleted", &now),
            "containerStatuses": [{
                "name": p.container, "image": p.image, "imageID": "",
                "containerID": format!("hollow://{}", p.uid),
                "ready": false, "started": false, "restartCount": 0,
                "state": { "terminated": {
                    "exitCode": 0, "reason": "Completed", "message": message,
                    "startedAt": now, "finishedAt": now,
                    "containerID": format!("hollow://{}", p.uid),
                } },
            }],
        } });
        if let Err(e) = retry(|| self.api.patch(&path, PatchKind::Merge, &status)).await {
            tracing::debug!(pod = %p.name, error = %e, "hollow source status");
        }
    }
}

/// A Lease spec renewed now: holder the node, 40 s ([`crate::kubelet::LEASE_SECONDS`]).
fn lease_spec(node: &str) -> Value {
    json!({ "holderIdentity": node, "leaseDurationSeconds": crate::kubelet::LEASE_SECONDS,
            "renewTime": crate::client::now_micro() })
}

/// The pod conditions of a Running pod (`ready`) or a finished one (`reason` on the
/// false Ready/ContainersReady, e.g. `PodCompleted`), all transitioned at `now`.
pub fn pod_conditions(ready: bool, reason: &str, now: &str) -> Value {
    let status = if ready { "True" } else { "False" };
    let mut conds = vec![
        json!({ "type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now }),
        json!({ "type": "Initialized", "status": "True", "lastTransitionTime": now }),
    ];
    for ty in ["Ready", "ContainersReady"] {
        let mut c = json!({ "type": ty, "status": status, "lastTransitionTime": now });
        if !ready {
            c["reason"] = json!(reason);
        }
        conds.push(c);
    }
    conds.push(json!({ "type": "PodScheduled", "status": "True", "lastTransitionTime": now }));
    json!(conds)
}

/// Merge patch of a pod Running and Ready on a node at `host_ip` with `pod_ip`.
pub fn running_status(
    host_ip: Ipv4Addr,
    pod_ip: Ipv4Addr,
    container: &str,
    image: &str,
    id: &str,
    now: &str,
) -> Value {
    json!({ "status": {
        "phase": "Running",
        "hostIP": host_ip.to_string(), "hostIPs": [{ "ip": host_ip.to_string() }],
        "podIP": pod_ip.to_string(), "podIPs": [{ "ip": pod_ip.to_string() }],
        "startTime": now,
        "conditions": pod_conditions(true, "", now),
        "containerStatuses": [{
            "name": container, "image": image, "imageID": "",
            "containerID": format!("hollow://{id}"),
            "ready": true, "started": true, "restartCount": 0,
            "state": { "running": { "startedAt": now } },
        }],
    } })
}

/// A pod on a hollow node.
struct PodInfo {
    ns: String,
    name: String,
    uid: String,
    node: usize,
    ip: Ipv4Addr,
    container: String,
    image: String,
    args: Vec<String>,
}

/// The flags of `target-server probe` a hollow source honours (defaults as
/// target-server's: interval 100 ms, attempt timeout 900 ms, give-up 60 s, hold 5 s).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeArgs {
    pub target: String,
    pub expect_pod: String,
    pub interval: Duration,
    pub attempt_timeout: Duration,
    pub give_up: Duration,
    pub hold: Duration,
    /// `--path PROTOCOL/PAYLOAD=IP:PORT` (issue 33): each gets a line like the main
    /// path's (a hollow node's dataplane carries every protocol and size alike).
    pub paths: Vec<firstpacket_report::PathId>,
}

impl ProbeArgs {
    /// From a container's args (`probe --target IP:PORT --expect-pod NAME …`, flags as
    /// `--flag value` or `--flag=value`); `None` unless the first arg is `probe`.
    /// Unparsable durations keep their defaults.
    pub fn parse(args: &[String]) -> Option<ProbeArgs> {
        if args.first().map(String::as_str) != Some("probe") {
            return None;
        }
        let mut p = ProbeArgs {
            target: String::new(),
            expect_pod: String::new(),
            interval: Duration::from_millis(100),
            attempt_timeout: Duration::from_millis(900),
            give_up: Duration::from_secs(60),
            hold: Duration::from_secs(5),
            paths: Vec::new(),
        };
        let mut it = args[1..].iter();
        while let Some(a) = it.next() {
            let (flag, value) = match a.split_once('=') {
                Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
                None => (a.clone(), None),
            };
            let Some(value) = value.or_else(|| it.next().cloned()) else {
                break;
            };
            let dur = |d: &mut Duration| {
                if let Ok(v) = humantime::parse_duration(&value) {
                    *d = v;
                }
            };
            match flag.as_str() {
                "--target" => p.target = value.clone(),
                "--expect-pod" => p.expect_pod = value.clone(),
                "--interval" => dur(&mut p.interval),
                "--attempt-timeout" => dur(&mut p.attempt_timeout),
                "--give-up" => dur(&mut p.give_up),
                "--hold" => dur(&mut p.hold),
                "--path" => p.paths.extend(value.split(',').filter_map(path_id)),
                _ => {}
            }
        }
        Some(p)
    }
}

/// The path of a `--path` value `PROTOCOL/PAYLOAD=IP:PORT`, if it parses.
fn path_id(v: &str) -> Option<firstpacket_report::PathId> {
    let (what, addr) = v.split_once('=')?;
    let (proto, payload) = what.split_once('/')?;
    Some(firstpacket_report::PathId {
        protocol: proto.parse().ok()?,
        family: firstpacket_report::IpFamily::of(addr.parse::<std::net::SocketAddr>().ok()?.ip()),
        payload: payload.parse().ok()?,
    })
}

/// The report a hollow source writes, in `target-server probe`'s shape: times in
/// seconds since its start; `ready_at` when its Ready status was written; with
/// `success` (the send time of the first success) an attempt every `interval` from
/// 1 ms on, those sent at least `attempt_timeout` before the success failed by timeout,
/// then a hold without failures; without, every attempt until `give_up` timed out.
pub fn source_report(
    pod: &str,
    a: &ProbeArgs,
    process_start_unix: f64,
    ready_at: f64,
    success: Option<f64>,
) -> firstpacket_report::SourceReport {
    use firstpacket_report::{ErrorKind, SourceHold, SourceOutcome, SourceReport};
    let interval = a.interval.as_secs_f64().max(0.001);
    let first_attempt = 0.001;
    // Attempts sent in [first_attempt, t): one every interval.
    let sent_before = |t: f64| -> u64 {
        if t <= first_attempt {
            0
        } else {
            ((t - first_attempt) / interval).ceil() as u64
        }
    };
    let timeout = a.attempt_timeout.as_secs_f64();
    let (outcome, attempts, failures, before_ready, hold) = match success {
        Some(s) => {
            let failures = sent_before((s - timeout).max(0.0));
            let before_ready = failures.min(sent_before(ready_at));
            let hold_s = a.hold.as_secs_f64();
            let hold = SourceHold {
                seconds: hold_s,
                attempts: (hold_s / interval) as u64,
                failures: 0,
                failures_per_second: vec![
                    0;
                    (hold_s as usize).min(firstpacket_report::MAX_HOLD_SERIES)
                ],
            };
            (
                SourceOutcome::Success,
                sent_before(s),
                failures,
                before_ready,
                hold,
            )
        }
        None => {
            let n = sent_before(a.give_up.as_secs_f64());
            (
                SourceOutcome::NoSuccess,
                n,
                n,
                n.min(sent_before(ready_at)),
                SourceHold::default(),
            )
        }
    };
    let mut errors = std::collections::BTreeMap::new();
    if failures > 0 {
        errors.insert(ErrorKind::Timeout, failures);
    }
    SourceReport {
        schema: firstpacket_report::SCHEMA_VERSION,
        pod: pod.to_owned(),
        target: a.target.clone(),
        expect_pod: a.expect_pod.clone(),
        interval_seconds: a.interval.as_secs_f64(),
        attempt_timeout_seconds: timeout,
        give_up_seconds: a.give_up.as_secs_f64(),
        hold_seconds: a.hold.as_secs_f64(),
        process_start_unix,
        process_start: 0.0,
        first_attempt: Some(first_attempt),
        ready_at: Some(ready_at),
        first_success_sent: success,
        first_success_received: success.map(|s| s + 0.001),
        first_success_retransmits: None,
        ttfp_seconds: success.map(|s| (s - ready_at).max(0.0)),
        raw_ttfp_seconds: success.map(|s| s - ready_at),
        attempts_before_success: attempts,
        failures_before_success: failures,
        failures_before_ready: before_ready,
        first_success_after_ready_sent: success.filter(|s| *s >= ready_at),
        failures_after_ready_before_success: failures - before_ready,
        errors,
        last_error: (failures > 0).then_some(ErrorKind::Timeout),
        wrong_peer: None,
        hold,
        outcome,
        programming: None,
        target_programming: None,
        policy: None,
        paths: a
            .paths
            .iter()
            .map(|id| firstpacket_report::SourcePath {
                path: *id,
                bytes: (id.payload == firstpacket_report::Payload::Mtu).then_some(1500),
                first_success_sent: success,
                retransmits: None,
                attempts,
                failures,
                last_error: (failures > 0).then_some(ErrorKind::Timeout),
                hold_failures: 0,
                outcome,
            })
            .collect(),
    }
}

/// Renews every Lease once per [`crate::kubelet::HEARTBEAT`], one node every
/// `HEARTBEAT / N`, at most [`HEARTBEAT_CONCURRENCY`] in flight; re-posts a node's
/// status when it is [`crate::kubelet::NODE_STATUS_REPORT`] old.
async fn heartbeats(inner: Arc<Inner>) {
    let n = inner.nodes.len().max(1);
    let step = (crate::kubelet::HEARTBEAT / n as u32).max(Duration::from_millis(1));
    let mut tick = tokio::time::interval(step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let permits = Arc::new(tokio::sync::Semaphore::new(HEARTBEAT_CONCURRENCY));
    let mut k = 0usize;
    loop {
        tick.tick().await;
        let i = k % n;
        k = k.wrapping_add(1);
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            inner.renew_lease(i).await;
            let stale =
                lock(&inner.nodes[i].status_at).elapsed() >= crate::kubelet::NODE_STATUS_REPORT;
            if stale {
                inner.post_status(i).await;
            }
            drop(permit);
        });
    }
}

/// One watch on all pods; those bound to hollow nodes are run ([`Inner::observe`]).
async fn watch_pods(inner: Arc<Inner>) {
    use kube::runtime::watcher::{watcher, Config, Event};
    use kube::runtime::WatchStreamExt;
    let ar = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    let api = kube::Api::<kube::api::DynamicObject>::all_with(inner.api.kube(), &ar);
    let mut stream = watcher(api, Config::default())
        .backoff(crate::client::QuickBackoff::default())
        .boxed();
    let mut seen: Option<BTreeSet<String>> = None;
    while let Some(ev) = stream.next().await {
        let v = |o: kube::api::DynamicObject| serde_json::to_value(o).unwrap_or_default();
        match ev {
            Ok(Event::Apply(o)) => inner.observe(&v(o)),
            Ok(Event::Delete(o)) => {
                if let Some(uid) = v(o)["metadata"]["uid"].as_str() {
                    inner.forget(uid);
                }
            }
            Ok(Event::Init) => seen = Some(BTreeSet::new()),
            Ok(Event::InitApply(o)) => {
                let pod = v(o);
                if let (Some(s), Some(uid)) = (seen.as_mut(), pod["metadata"]["uid"].as_str()) {
                    s.insert(uid.to_owned());
                }
                inner.observe(&pod);
            }
            Ok(Event::InitDone) => {
                let seen = seen.take().unwrap_or_default();
                let gone: Vec<String> = lock(&inner.pods)
                    .running
                    .keys()
                    .filter(|u| !seen.contains(*u))
                    .cloned()
                    .collect();
                for uid in gone {
                    inner.forget(&uid);
                }
            }
            Err(e) => tracing::debug!(error = %e, "hollow pod watch"),
        }
    }
}

/// Which agent page a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Page {
    /// Felix's, port 9091, `/metrics` and `/`.
    Felix,
    /// kube-proxy's, port 10249, `/metrics`.
    KubeProxy,
}

/// Serves every hollow node's `page` on `listener` (bound on `0.0.0.0` in the host
/// netns): the connection's local address names the node; unknown addresses and other
/// paths get 404.
async fn serve_metrics(inner: Arc<Inner>, listener: tokio::net::TcpListener, page: Page) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let node = match stream.local_addr().map(|a| a.ip()) {
            Ok(std::net::IpAddr::V4(ip)) => inner.by_ip.get(&ip).copied(),
            _ => None,
        };
        let inner = inner.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(
                move |req: hyper::Request<hyper::body::Incoming>| {
                    let inner = inner.clone();
                    async move { Ok::<_, std::convert::Infallible>(inner.page(node, page, &req).await) }
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}

impl Inner {
    async fn page(
        &self,
        node: Option<usize>,
        page: Page,
        req: &hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
        let answer = |code: u16, ct: &str, body: String| {
            hyper::Response::builder()
                .status(code)
                .header("Content-Type", ct)
                .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
                .unwrap_or_default()
        };
        let path = req.uri().path();
        let known = path == "/metrics" || (page == Page::Felix && path == "/");
        let (Some(i), true) = (node, known) else {
            return answer(404, "text/plain", "404 page not found\n".into());
        };
        if self.cfg.direct_scrapes == DirectScrapes::Hold
            && !req.headers().contains_key("x-forwarded-for")
        {
            tokio::time::sleep(Duration::from_secs(300)).await;
            return answer(503, "text/plain", "held\n".into());
        }
        let now = Instant::now();
        let took = Duration::from_micros(5_000 + rand::random::<u64>() % 10_000);
        if page == Page::KubeProxy {
            let m = &self.nodes[i].kube_proxy;
            m.record_sync(took, true);
            return answer(200, crate::felix::CONTENT_TYPE, m.render());
        }
        let mut m = lock(&self.nodes[i].felix);
        m.record_apply(took, Some(1), true, now);
        let body = crate::felix::render(&mut m, 0, now);
        answer(200, crate::felix::CONTENT_TYPE, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn probe_args_parse_both_flag_forms_and_keep_defaults() {
        let p = ProbeArgs::parse(&args(
            "probe --target 10.1.232.5:8080 --expect-pod t-1 --interval=50ms --hold 2s",
        ))
        .unwrap();
        assert_eq!(p.target, "10.1.232.5:8080");
        assert_eq!(p.expect_pod, "t-1");
        assert_eq!(p.interval, Duration::from_millis(50));
        assert_eq!(p.hold, Duration::from_secs(2));
        assert_eq!(p.give_up, Duration::from_secs(60));
        assert!(ProbeArgs::parse(&args("serve --port 8080")).is_none());
        // Extra paths (issue 33) get a line each, like the main path's.
        let p = ProbeArgs::parse(&args(
            "probe --target 10.1.232.5:8080 --expect-pod t --path udp/mtu=10.1.232.5:8080 --path tcp/small=[fd00::5]:8080,bad",
        ))
        .unwrap();
        let ids: Vec<String> = p.paths.iter().map(ToString::to_string).collect();
        assert_eq!(ids, ["udp/ipv4/mtu", "tcp/ipv6/small"]);
        let r = source_report("s", &p, 1.0e9, 0.01, Some(2.01));
        assert_eq!(r.paths.len(), 2);
        assert!(r.paths.iter().all(|x| x.first_success_sent == Some(2.01)));
        assert_eq!((r.paths[0].bytes, r.paths[1].bytes), (Some(1500), None));
    }

    #[test]
    fn source_report_has_the_configured_ttfp_and_counts_timed_out_attempts() {
        let p = ProbeArgs::parse(&args("probe --target 1.2.3.4:8080 --expect-pod t")).unwrap();
        let r = source_report("s", &p, 1.0e9, 0.01, Some(2.01));
        assert!((r.ttfp_seconds.unwrap() - 2.0).abs() < 1e-9);
        // Attempts sent at 0.001, 0.101, … before 2.01: 21; those sent before
        // 2.01 − 0.9 = 1.11 timed out: 12.
        assert_eq!(r.attempts_before_success, 21);
        assert_eq!(r.failures_before_success, 12);
        assert_eq!(r.failures_before_ready, 1);
        assert_eq!(r.errors.values().sum::<u64>(), 12);
        assert_eq!(r.hold.failures_per_second.len(), 5);
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.len() <= firstpacket_report::MAX_SOURCE_REPORT_BYTES);
        let none = source_report("s", &p, 1.0e9, 0.01, None);
        assert_eq!(none.outcome, firstpacket_report::SourceOutcome::NoSuccess);
        assert!(none.ttfp_seconds.is_none());
    }

    #[test]
    fn addresses_stay_in_their_blocks() {
        assert_eq!(node_ip(7, 1), Ipv4Addr::new(10, 7, 224, 1));
        assert!(node_ip_range(7).contains(node_ip(7, MAX_HOLLOW_NODES)));
        assert!(!pod_ip_range(7).contains(node_ip(7, MAX_HOLLOW_NODES)));
        assert_eq!(
            node_object("hollow-1", node_ip(7, 1))["metadata"]["labels"][HOLLOW_LABEL],
            "true"
        );
    }
}
