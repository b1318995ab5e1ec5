//! The testbed's service dataplane: a kube-proxy-like programmer per node (docs/design.md §5,
//! issue 5 `service` kind; `service_delay` fault, `service_programmed` truth events).
//!
//! Each node runs one [`ServiceProxy`]. It watches Services and EndpointSlices
//! (`discovery.k8s.io/v1`) through the API ([`crate::client`]), as kube-proxy does, so
//! it programs the same from the built-in API server and a real one (whose
//! EndpointSlice controller writes the slices), and keeps its **own** nftables table, `ip firstpacket-svc`
//! ([`NFT_SVC_TABLE`]), in the node netns (it never touches the CNI dataplane's `inet
//! firstpacket` table). The table mirrors kube-proxy's nftables mode
//! (k8s.io/kubernetes `pkg/proxy/nftables/proxier.go`), reduced to ClusterIPs:
//! - `nat-prerouting` (pod traffic, hook prerouting, priority dstnat −100) and
//!   `nat-output` (node-local traffic, hook output, −100) jump to `services`, which
//!   matches `clusterIP . protocol . port` and DNATs to one ready endpoint
//!   (`numgen random mod N` over per-endpoint chains, like kube-proxy's
//!   `service-…` → `endpoint-…` chains);
//! - `filter-forward` / `filter-output` (priority −110, new connections only):
//!   ports without a ready endpoint and unknown ports of a ClusterIP are rejected (ICMP
//!   port unreachable → `ECONNREFUSED`), unallocated addresses of the service CIDR
//!   dropped, as kube-proxy's `service-endpoints-check` / `cluster-ips-check` do.
//!
//! For node-local clients the node netns also gets a route `<service CIDR> dev eth0`
//! (a real node reaches ClusterIPs through its default route; without any route,
//! `connect()` fails before the nat output hook could rewrite the address). Pod traffic
//! does not need it: prerouting DNAT happens before the routing decision.
//!
//! **Delay**: every change of a Service's desired rules (its ClusterIP, ports, ready
//! endpoints), from the moment this proxy sees it in the store, is programmed after
//! `delay(node)` ([`DelayFn`], the `service_delay` fault); a newer change supersedes an
//! older one still waiting. After each successful table write, [`ProgrammedFn`] is
//! called once per Service whose programmed rules changed ([`ServiceProgrammed`];
//! [`ServiceProgrammed::truth_events`] turns it into truth lines).
//!
//! The table is rewritten whole in one `nft -f -` transaction (`ip netns exec NETNS nft
//! -f -`, about 30 ms), so it is never half-programmed.

use crate::api::Kind;
use crate::client::ApiClient;
use crate::controllers::SERVICE_NAME_LABEL;
use crate::plan::Ipv4Cidr;
use crate::truth::{unix_now, TruthEvent, TruthKind};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::Instant;

/// nftables table (family `ip`) of the service dataplane in each node netns.
pub const NFT_SVC_TABLE: &str = "firstpacket-svc";

/// Retry interval after a failed table write.
pub const RETRY: Duration = Duration::from_secs(1);

/// Programming delay of a node: called with the node name each time a change is seen;
/// returns how long after that moment the change goes in (the lead wires it to the
/// `service_delay` fault). Called on the proxy's task: keep it cheap and non-blocking.
pub type DelayFn = Arc<dyn Fn(&str) -> Duration + Send + Sync>;

/// Called after a node's table write, once per Service whose programmed rules changed.
/// Called on the proxy's task: keep it cheap (e.g. write truth lines).
pub type ProgrammedFn = Arc<dyn Fn(ServiceProgrammed) + Send + Sync>;

/// Errors of the service dataplane.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A command (`ip`, `nft`) exited non-zero.
    #[error("[{netns}] `{cmd}` failed (exit {code:?}): {stderr}")]
    Command {
        netns: String,
        cmd: String,
        code: Option<i32>,
        stderr: String,
    },
    /// A command could not be started or fed.
    #[error("[{netns}] run `{cmd}`: {source}")]
    Io {
        netns: String,
        cmd: String,
        #[source]
        source: std::io::Error,
    },
}

/// One ready endpoint of a Service, from its EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceEndpoint {
    /// `addresses[0]` of the slice endpoint (the Pod IP).
    pub ip: Ipv4Addr,
    /// `targetRef.name` (the Pod), if the slice names one.
    pub pod: Option<String>,
    /// `targetRef.uid`.
    pub uid: Option<String>,
    /// `nodeName` of the endpoint (where the Pod runs).
    pub node: Option<String>,
}

/// The rules of one Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRules {
    /// Service port name (`""` when unnamed).
    pub name: String,
    /// `tcp`, `udp` or `sctp` (nftables spelling).
    pub protocol: String,
    /// The Service port (`spec.ports[].port`).
    pub port: u16,
    /// DNAT targets: ready endpoint IP and the slice's port of the same name.
    pub backends: Vec<(Ipv4Addr, u16)>,
}

/// Everything programmed for one Service on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRules {
    /// `spec.clusterIP`.
    pub cluster_ip: Ipv4Addr,
    /// One entry per Service port, in `spec.ports` order.
    pub ports: Vec<PortRules>,
    /// Ready endpoints (deduplicated by IP, sorted).
    pub endpoints: Vec<ServiceEndpoint>,
}

/// `(namespace, name)` of a Service.
pub type ServiceKey = (String, String);

/// What a node just programmed for one Service (argument of [`ProgrammedFn`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceProgrammed {
    /// The node whose table changed.
    pub node: String,
    /// Service namespace.
    pub namespace: String,
    /// Service name.
    pub service: String,
    /// The ClusterIP now programmed; `None` when the Service's rules were removed
    /// (Service deleted or no longer a ClusterIP Service).
    pub cluster_ip: Option<Ipv4Addr>,
    /// `(port, protocol)` of each programmed Service port.
    pub ports: Vec<(u16, String)>,
    /// Ready endpoints now programmed.
    pub endpoints: Vec<ServiceEndpoint>,
    /// Endpoints programmed now that were not before.
    pub added: Vec<ServiceEndpoint>,
    /// Endpoints no longer programmed.
    pub removed: Vec<ServiceEndpoint>,
    /// Unix seconds (µs) at which this proxy saw the change it just programmed.
    pub seen_unix: f64,
    /// The delay [`DelayFn`] gave for that change.
    pub delay: Duration,
}

impl ServiceProgrammed {
    /// The `service_programmed` truth lines (docs/design.md §6) for this change, `t` left for
    /// [`crate::truth::Truth::emit`] to stamp. Convention:
    /// - one line per endpoint in [`ServiceProgrammed::added`]: `node` = the programming
    ///   node, `namespace` = the Service's, `pod`/`uid`/`ip` = **the endpoint Pod's**
    ///   (so a probe's truth joins on the target's uid and the source's node), `iface`
    ///   null;
    /// - when nothing was added (endpoints removed, Service deleted, ports changed): one
    ///   line with `pod`/`uid`/`ip` null;
    /// - `detail` always: `{service, cluster_ip, ports: ["80/tcp"…], endpoints: [IP…],
    ///   removed: [IP…], seen_t, delay_seconds}`.
    pub fn truth_events(&self) -> Vec<TruthEvent> {
        let detail = json!({
            "service": self.service,
            "cluster_ip": self.cluster_ip.map(|ip| ip.to_string()),
            "ports": self.ports.iter().map(|(p, proto)| format!("{p}/{proto}")).collect::<Vec<_>>(),
            "endpoints": self.endpoints.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>(),
            "removed": self.removed.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>(),
            "seen_t": self.seen_unix,
            "delay_seconds": self.delay.as_secs_f64(),
        });
        let base = TruthEvent {
            node: Some(self.node.clone()),
            namespace: Some(self.namespace.clone()),
            detail,
            ..TruthEvent::new(TruthKind::ServiceProgrammed)
        };
        if self.added.is_empty() {
            return vec![base];
        }
        self.added
            .iter()
            .map(|e| TruthEvent {
                pod: e.pod.clone(),
                uid: e.uid.clone(),
                ip: Some(e.ip.to_string()),
                ..base.clone()
            })
            .collect()
    }
}

/// nftables protocol keyword of a Service port protocol (`TCP` → `tcp`).
fn nft_proto(p: &str) -> String {
    p.to_ascii_lowercase()
}

/// The desired rules of every ClusterIP Service in the store: Services of type
/// ClusterIP/NodePort/LoadBalancer with an IPv4 `spec.clusterIP` (not headless), their
/// ports, and as backends the endpoints of all EndpointSlices labelled
/// [`SERVICE_NAME_LABEL`] = the Service name whose `conditions.ready` is not false
/// (discovery.k8s.io/v1: an unset `ready` means ready), on the slice port of the same
/// name and protocol (kube-proxy's `EndpointSliceCache`). Services without a ready
/// endpoint are listed with empty backends (their ports get rejected).
pub fn desired_rules<'a>(
    services: impl IntoIterator<Item = &'a Value>,
    slices: impl IntoIterator<Item = &'a Value>,
) -> BTreeMap<ServiceKey, ServiceRules> {
    let mut by_service: HashMap<ServiceKey, Vec<&Value>> = HashMap::new();
    for s in slices {
        if s["addressType"] != "IPv4" {
            continue;
        }
        if let Some(svc) = s["metadata"]["labels"][SERVICE_NAME_LABEL].as_str() {
            let ns = s["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            by_service.entry((ns, svc.to_string())).or_default().push(s);
        }
    }
    let mut out = BTreeMap::new();
    for svc in services {
        if svc["spec"]["type"] == "ExternalName" {
            continue;
        }
        let Some(cluster_ip) = svc["spec"]["clusterIP"]
            .as_str()
            .and_then(|s| s.parse::<Ipv4Addr>().ok())
        else {
            continue;
        };
        let key = (
            svc["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            svc["metadata"]["name"].as_str().unwrap_or("").to_string(),
        );
        let slices = by_service.get(&key).cloned().unwrap_or_default();
        let mut endpoints = BTreeSet::new();
        let mut ports = Vec::new();
        for sp in svc["spec"]["ports"].as_array().into_iter().flatten() {
            let Some(port) = sp["port"].as_u64().and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let name = sp["name"].as_str().unwrap_or("").to_string();
            let protocol = sp["protocol"].as_str().unwrap_or("TCP").to_string();
            let mut backends = BTreeSet::new();
            for sl in &slices {
                let Some(target) = sl["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| {
                        p["name"].as_str().unwrap_or("") == name
                            && p["protocol"].as_str().unwrap_or("TCP") == protocol
                    })
                    .and_then(|p| p["port"].as_u64())
                    .and_then(|p| u16::try_from(p).ok())
                else {
                    continue;
                };
                for ep in sl["endpoints"].as_array().into_iter().flatten() {
                    if ep["conditions"]["ready"] == json!(false) {
                        continue;
                    }
                    let Some(ip) = ep["addresses"][0]
                        .as_str()
                        .and_then(|s| s.parse::<Ipv4Addr>().ok())
                    else {
                        continue;
                    };
                    backends.insert((ip, target));
                    endpoints.insert(ServiceEndpoint {
                        ip,
                        pod: ep["targetRef"]["name"].as_str().map(str::to_string),
                        uid: ep["targetRef"]["uid"].as_str().map(str::to_string),
                        node: ep["nodeName"].as_str().map(str::to_string),
                    });
                }
            }
            ports.push(PortRules {
                name,
                protocol: nft_proto(&protocol),
                port,
                backends: backends.into_iter().collect(),
            });
        }
        // One entry per IP (a Pod listed in two slices during a handover counts once).
        let mut seen = BTreeSet::new();
        let endpoints: Vec<ServiceEndpoint> = endpoints
            .into_iter()
            .filter(|e| seen.insert(e.ip))
            .collect();
        out.insert(
            key,
            ServiceRules {
                cluster_ip,
                ports,
                endpoints,
            },
        );
    }
    out
}

/// The whole `ip firstpacket-svc` table for `rules` as one `nft -f` script (the table
/// is created if missing, deleted and rebuilt in the same transaction). `cidr` is the
/// service CIDR whose unallocated addresses are dropped.
pub fn render_ruleset(cidr: Ipv4Cidr, rules: &BTreeMap<ServiceKey, ServiceRules>) -> String {
    let t = NFT_SVC_TABLE;
    let mut services = String::new();
    let mut ep_chains = String::new();
    let mut check = String::new();
    let mut cluster_ips = BTreeSet::new();
    let mut n_ep = 0usize;
    for ((ns, name), r) in rules {
        cluster_ips.insert(r.cluster_ip);
        for p in &r.ports {
            let matcher = format!(
                "ip daddr {} meta l4proto {} th dport {}",
                r.cluster_ip, p.protocol, p.port
            );
            let comment = format!("comment \"{ns}/{name}:{}\"", p.port);
            if p.backends.is_empty() {
                let _ = writeln!(check, "\t\t{matcher} reject {comment}");
                continue;
            }
            let _ = writeln!(check, "\t\t{matcher} return");
            let mut chains = Vec::new();
            for (ip, port) in &p.backends {
                let chain = format!("ep-{n_ep}");
                n_ep += 1;
                let _ = write!(
                    ep_chains,
                    "\tchain {chain} {{\n\t\tmeta l4proto {} dnat to {ip}:{port}\n\t}}\n",
                    p.protocol
                );
                chains.push(chain);
            }
            if chains.len() == 1 {
                let _ = writeln!(services, "\t\t{matcher} goto {} {comment}", chains[0]);
            } else {
                let map: Vec<String> = chains
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{i} : goto {c}"))
                    .collect();
                let _ = writeln!(
                    services,
                    "\t\t{matcher} numgen random mod {} vmap {{ {} }} {comment}",
                    chains.len(),
                    map.join(", ")
                );
            }
        }
    }
    if !cluster_ips.is_empty() {
        let ips: Vec<String> = cluster_ips.iter().map(Ipv4Addr::to_string).collect();
        let _ = writeln!(
            check,
            "\t\tip daddr {{ {} }} reject comment \"invalid ClusterIP port\"",
            ips.join(", ")
        );
    }
    let _ = writeln!(
        check,
        "\t\tip daddr {cidr} drop comment \"unallocated ClusterIP\""
    );
    format!(
        "add table ip {t}\n\
         delete table ip {t}\n\
         table ip {t} {{\n\
         \tchain nat-prerouting {{\n\t\ttype nat hook prerouting priority -100; policy accept;\n\t\tjump services\n\t}}\n\
         \tchain nat-output {{\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}}\n\
         \tchain services {{\n{services}\t}}\n\
         {ep_chains}\
         \tchain filter-forward {{\n\t\ttype filter hook forward priority -110; policy accept;\n\t\tct state new jump endpoints-check\n\t}}\n\
         \tchain filter-output {{\n\t\ttype filter hook output priority -110; policy accept;\n\t\tct state new jump endpoints-check\n\t}}\n\
         \tchain endpoints-check {{\n{check}\t}}\n\
         }}\n"
    )
}

/// Runs `ip netns exec NETNS ARGV…` with `stdin`, returning stdout.
async fn netns_exec(netns: &str, argv: &[&str], stdin: &str) -> Result<String, ServiceError> {
    let cmd = argv.join(" ");
    let io = |source| ServiceError::Io {
        netns: netns.to_string(),
        cmd: cmd.clone(),
        source,
    };
    let mut child = tokio::process::Command::new("ip")
        .args(["netns", "exec", netns])
        .args(argv)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io)?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(stdin.as_bytes()).await.map_err(io)?;
        drop(pipe);
    }
    let out = child.wait_with_output().await.map_err(io)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ServiceError::Command {
            netns: netns.to_string(),
            cmd,
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Writes `script` with `nft -f -` inside `netns`. Errors: [`ServiceError`].
pub async fn nft_apply(netns: &str, script: &str) -> Result<(), ServiceError> {
    netns_exec(netns, &["nft", "-f", "-"], script)
        .await
        .map(drop)
}

/// Removes the service table from `netns` (idempotent). Errors: [`ServiceError`].
pub async fn remove_table(netns: &str) -> Result<(), ServiceError> {
    let t = NFT_SVC_TABLE;
    nft_apply(netns, &format!("add table ip {t}\ndelete table ip {t}\n")).await
}

/// Configuration of one node's [`ServiceProxy`].
#[derive(Clone)]
pub struct ServiceProxyConfig {
    /// Node name (`node-<i>`), passed to [`DelayFn`] and reported in
    /// [`ServiceProgrammed::node`].
    pub node: String,
    /// The node's netns (`NodePlan::netns`).
    pub netns: String,
    /// The service CIDR (`crate::api::service_cidr(plan.index)`, the same the store
    /// allocates from).
    pub service_cidr: Ipv4Cidr,
    /// Programming delay per change.
    pub delay: DelayFn,
    /// Called after each table write per changed Service.
    pub on_programmed: ProgrammedFn,
    /// kube-proxy metrics fed by every table write (`None`: not recorded).
    pub metrics: Option<crate::kube_proxy::KubeProxyMetrics>,
}

impl std::fmt::Debug for ServiceProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceProxyConfig")
            .field("node", &self.node)
            .field("netns", &self.netns)
            .field("service_cidr", &self.service_cidr)
            .finish()
    }
}

/// A running per-node service programmer (see the module docs). Dropping it stops the
/// loop (the table stays); [`ServiceProxy::shutdown`] also removes the table.
#[derive(Debug)]
pub struct ServiceProxy {
    netns: String,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ServiceProxy {
    /// Installs the route `<service CIDR> dev eth0` and an empty table in the node netns
    /// (so a broken environment fails here, not later), then spawns the programming loop
    /// on the current tokio runtime (needs the process and time drivers; any runtime, the
    /// commands enter the netns themselves). Services already in the store are
    /// programmed after the delay like any change. Errors: [`ServiceError`] from `ip` or
    /// `nft`.
    pub async fn start(
        api: ApiClient,
        cfg: ServiceProxyConfig,
    ) -> Result<ServiceProxy, ServiceError> {
        let cidr = cfg.service_cidr.to_string();
        netns_exec(
            &cfg.netns,
            &["ip", "route", "replace", &cidr, "dev", "eth0"],
            "",
        )
        .await?;
        nft_apply(
            &cfg.netns,
            &render_ruleset(cfg.service_cidr, &BTreeMap::new()),
        )
        .await?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let netns = cfg.netns.clone();
        let mut proxy = Proxy {
            objects: HashMap::new(),
            cfg,
            seen: BTreeMap::new(),
            pending: Vec::new(),
            target: BTreeMap::new(),
            written: BTreeMap::new(),
            origin: HashMap::new(),
            applied_seq: HashMap::new(),
            seq: 0,
            retry_at: None,
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let watches = [Kind::Service, Kind::EndpointSlice]
            .map(|kind| tokio::spawn(watch_kind(api.kube(), kind, tx.clone())));
        proxy.observe();
        let task = tokio::spawn(async move {
            proxy.run(rx, stop_rx).await;
            for w in watches {
                w.abort();
            }
        });
        Ok(ServiceProxy {
            netns,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// Stops the loop (pending changes are dropped) and removes the table. Errors:
    /// [`ServiceError`] from removing the table (a deleted netns is not an error).
    pub async fn shutdown(mut self) -> Result<(), ServiceError> {
        self.stop_loop().await;
        if !crate::netns::netns_path(&self.netns).exists() {
            return Ok(());
        }
        remove_table(&self.netns).await
    }

    async fn stop_loop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A seen change waiting for its delay.
struct Pending {
    key: ServiceKey,
    rules: Option<ServiceRules>,
    seq: u64,
    due: Instant,
    seen_unix: f64,
    delay: Duration,
}

/// A change seen by one of the proxy's watches.
enum Seen {
    /// Added or modified.
    Upsert(Kind, Value),
    /// Deleted.
    Remove(Kind, Value),
    /// A (re-)list: every object of the kind.
    Replace(Kind, Vec<Value>),
}

fn object_key(o: &Value) -> ServiceKey {
    (
        o["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        o["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

/// Watches every object of `kind` (all namespaces) and forwards what it sees; re-lists
/// after a watch loss like any informer. Ends when the proxy is gone.
async fn watch_kind(client: kube::Client, kind: Kind, tx: tokio::sync::mpsc::Sender<Seen>) {
    use kube::runtime::watcher::{watcher, Config, Event};
    use kube::runtime::WatchStreamExt;
    let ar = match kind {
        Kind::Service => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
        _ => kube::api::ApiResource::erase::<k8s_openapi::api::discovery::v1::EndpointSlice>(&()),
    };
    let api = kube::Api::<kube::api::DynamicObject>::all_with(client, &ar);
    let mut stream = watcher(api, Config::default())
        .backoff(crate::client::QuickBackoff::default())
        .boxed();
    let mut init = Vec::new();
    let to_value = |o: kube::api::DynamicObject| serde_json::to_value(o).unwrap_or_default();
    while let Some(ev) = stream.next().await {
        let msg = match ev {
            Ok(Event::Apply(o)) => Seen::Upsert(kind, to_value(o)),
            Ok(Event::Delete(o)) => Seen::Remove(kind, to_value(o)),
            Ok(Event::Init) => {
                init.clear();
                continue;
            }
            Ok(Event::InitApply(o)) => {
                init.push(to_value(o));
                continue;
            }
            Ok(Event::InitDone) => Seen::Replace(kind, std::mem::take(&mut init)),
            Err(e) => {
                tracing::debug!(kind = ?kind, error = %e, "service proxy watch");
                continue;
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}

struct Proxy {
    /// Services and EndpointSlices as the watches last saw them.
    objects: HashMap<Kind, BTreeMap<ServiceKey, Value>>,
    cfg: ServiceProxyConfig,
    /// Last desired rules seen per Service (to detect changes).
    seen: BTreeMap<ServiceKey, ServiceRules>,
    pending: Vec<Pending>,
    /// What should be in the table now (changes whose delay has passed).
    target: BTreeMap<ServiceKey, ServiceRules>,
    /// What the last successful write put in the table.
    written: BTreeMap<ServiceKey, ServiceRules>,
    /// (seen_unix, delay) of the change behind each Service's `target` entry.
    origin: HashMap<ServiceKey, (f64, Duration)>,
    applied_seq: HashMap<ServiceKey, u64>,
    seq: u64,
    retry_at: Option<Instant>,
}

impl Proxy {
    /// Compares the store's desired rules with the last seen ones and queues each
    /// change with its delay.
    fn observe(&mut self) {
        let empty = BTreeMap::new();
        let services = self.objects.get(&Kind::Service).unwrap_or(&empty);
        let slices = self.objects.get(&Kind::EndpointSlice).unwrap_or(&empty);
        let desired = desired_rules(services.values(), slices.values());
        let keys: BTreeSet<ServiceKey> = desired.keys().chain(self.seen.keys()).cloned().collect();
        for key in keys {
            let new = desired.get(&key);
            if new == self.seen.get(&key) {
                continue;
            }
            let delay = (self.cfg.delay)(&self.cfg.node);
            let seen_unix = unix_now();
            self.seq += 1;
            tracing::debug!(node = %self.cfg.node, service = %format!("{}/{}", key.0, key.1), delay_ms = delay.as_millis() as u64, "service change seen");
            self.pending.push(Pending {
                key: key.clone(),
                rules: new.cloned(),
                seq: self.seq,
                due: Instant::now() + delay,
                seen_unix,
                delay,
            });
            match new {
                Some(r) => {
                    self.seen.insert(key, r.clone());
                }
                None => {
                    self.seen.remove(&key);
                }
            }
        }
    }

    /// Moves due changes into `target` (newest seen change wins) and writes the table
    /// when it differs from what was written, then reports the changed Services.
    async fn apply_due(&mut self) {
        let now = Instant::now();
        let mut due: Vec<Pending> = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].due <= now {
                due.push(self.pending.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|p| p.seq);
        for p in due {
            let last = self.applied_seq.get(&p.key).copied().unwrap_or(0);
            if p.seq <= last {
                continue;
            }
            self.applied_seq.insert(p.key.clone(), p.seq);
            self.origin.insert(p.key.clone(), (p.seen_unix, p.delay));
            match p.rules {
                Some(r) => {
                    self.target.insert(p.key, r);
                }
                None => {
                    self.target.remove(&p.key);
                }
            }
        }
        if self.target == self.written || self.retry_at.is_some_and(|t| t > now) {
            return;
        }
        let script = render_ruleset(self.cfg.service_cidr, &self.target);
        let started = Instant::now();
        let written = nft_apply(&self.cfg.netns, &script).await;
        if let Some(m) = &self.cfg.metrics {
            m.record_sync(started.elapsed(), written.is_ok());
        }
        if let Err(e) = written {
            tracing::warn!(node = %self.cfg.node, error = %e, "service rules not written; retrying");
            self.retry_at = Some(Instant::now() + RETRY);
            return;
        }
        self.retry_at = None;
        let keys: BTreeSet<ServiceKey> = self
            .target
            .keys()
            .chain(self.written.keys())
            .cloned()
            .collect();
        for key in keys {
            let new = self.target.get(&key);
            let old = self.written.get(&key);
            if new == old {
                continue;
            }
            let old_eps: Vec<ServiceEndpoint> =
                old.map(|o| o.endpoints.clone()).unwrap_or_default();
            let new_eps: Vec<ServiceEndpoint> =
                new.map(|n| n.endpoints.clone()).unwrap_or_default();
            let (seen_unix, delay) = self
                .origin
                .get(&key)
                .copied()
                .unwrap_or((0.0, Duration::ZERO));
            let ev = ServiceProgrammed {
                node: self.cfg.node.clone(),
                namespace: key.0.clone(),
                service: key.1.clone(),
                cluster_ip: new.map(|n| n.cluster_ip),
                ports: new
                    .map(|n| {
                        n.ports
                            .iter()
                            .map(|p| (p.port, p.protocol.clone()))
                            .collect()
                    })
                    .unwrap_or_default(),
                added: new_eps
                    .iter()
                    .filter(|e| !old_eps.contains(e))
                    .cloned()
                    .collect(),
                removed: old_eps
                    .iter()
                    .filter(|e| !new_eps.contains(e))
                    .cloned()
                    .collect(),
                endpoints: new_eps,
                seen_unix,
                delay,
            };
            tracing::debug!(node = %ev.node, service = %format!("{}/{}", ev.namespace, ev.service), endpoints = ev.endpoints.len(), "service rules programmed");
            if let (Some(m), true) = (&self.cfg.metrics, seen_unix > 0.0) {
                m.record_programmed(unix_now() - seen_unix);
            }
            (self.cfg.on_programmed)(ev);
        }
        self.written = self.target.clone();
    }

    fn apply_seen(&mut self, msg: Seen) {
        match msg {
            Seen::Upsert(kind, o) => {
                self.objects
                    .entry(kind)
                    .or_default()
                    .insert(object_key(&o), o);
            }
            Seen::Remove(kind, o) => {
                self.objects
                    .entry(kind)
                    .or_default()
                    .remove(&object_key(&o));
            }
            Seen::Replace(kind, all) => {
                self.objects
                    .insert(kind, all.into_iter().map(|o| (object_key(&o), o)).collect());
            }
        }
    }

    async fn run(
        mut self,
        mut rx: tokio::sync::mpsc::Receiver<Seen>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            self.apply_due().await;
            let mut wake = self.pending.iter().map(|p| p.due).min();
            if self.target != self.written {
                let r = self.retry_at.unwrap_or_else(Instant::now);
                wake = Some(wake.map_or(r, |w| w.min(r)));
            }
            let mut dirty = false;
            tokio::select! {
                _ = stop.changed() => return,
                r = rx.recv() => match r {
                    Some(msg) => {
                        self.apply_seen(msg);
                        dirty = true;
                    }
                    None => return,
                },
                _ = sleep_until_opt(wake) => {}
            }
            loop {
                match rx.try_recv() {
                    Ok(msg) => {
                        self.apply_seen(msg);
                        dirty = true;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if *stop.borrow() {
                return;
            }
            if dirty {
                self.observe();
            }
        }
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> ServiceKey {
        ("default".into(), n.into())
    }

    #[test]
    fn ruleset_dnats_ready_endpoints_and_rejects_ports_without_any() {
        let cidr: Ipv4Cidr = "10.200.0.0/18".parse().unwrap();
        let mut rules = BTreeMap::new();
        rules.insert(
            key("one"),
            ServiceRules {
                cluster_ip: Ipv4Addr::new(10, 200, 0, 10),
                ports: vec![PortRules {
                    name: String::new(),
                    protocol: "tcp".into(),
                    port: 80,
                    backends: vec![(Ipv4Addr::new(10, 7, 2, 2), 8080)],
                }],
                endpoints: vec![],
            },
        );
        rules.insert(
            key("two"),
            ServiceRules {
                cluster_ip: Ipv4Addr::new(10, 200, 0, 11),
                ports: vec![
                    PortRules {
                        name: "a".into(),
                        protocol: "tcp".into(),
                        port: 80,
                        backends: vec![
                            (Ipv4Addr::new(10, 7, 1, 2), 8080),
                            (Ipv4Addr::new(10, 7, 2, 3), 8080),
                        ],
                    },
                    PortRules {
                        name: "b".into(),
                        protocol: "udp".into(),
                        port: 53,
                        backends: vec![],
                    },
                ],
                endpoints: vec![],
            },
        );
        let r = render_ruleset(cidr, &rules);
        assert!(r.starts_with("add table ip firstpacket-svc\ndelete table ip firstpacket-svc\n"));
        assert!(r.contains("ip daddr 10.200.0.10 meta l4proto tcp th dport 80 goto ep-0"));
        assert!(r.contains("meta l4proto tcp dnat to 10.7.2.2:8080"));
        assert!(r.contains(
            "ip daddr 10.200.0.11 meta l4proto tcp th dport 80 numgen random mod 2 vmap { 0 : goto ep-1, 1 : goto ep-2 }"
        ));
        assert!(r.contains("ip daddr 10.200.0.11 meta l4proto udp th dport 53 reject"));
        assert!(!r.contains("th dport 53 goto"));
        // Served ports return before the ClusterIP-wide reject; the CIDR drop is last.
        let ret = r.find("th dport 80 return").unwrap();
        let rej = r.find("reject comment \"invalid ClusterIP port\"").unwrap();
        let drop = r.find("ip daddr 10.200.0.0/18 drop").unwrap();
        assert!(ret < rej && rej < drop);
        assert!(r.contains("hook prerouting priority -100"));
        assert!(r.contains("hook output priority -100"));
        let empty = render_ruleset(cidr, &BTreeMap::new());
        assert!(!empty.contains("dnat"));
        assert!(!empty.contains("invalid ClusterIP port"));
    }

    #[test]
    fn desired_rules_take_ready_endpoints_on_the_named_slice_port() {
        let store = crate::api::Store::new();
        store
            .create(
                Kind::Service,
                json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"clusterIP": "10.250.0.20", "selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
            )
            .unwrap();
        store
            .create(
                Kind::Service,
                json!({"metadata": {"name": "headless", "namespace": "default"},
                "spec": {"clusterIP": "None", "selector": {"app": "web"}}}),
            )
            .unwrap();
        store
            .create(
                Kind::EndpointSlice,
                json!({"metadata": {"name": "web-x", "namespace": "default",
                    "labels": {SERVICE_NAME_LABEL: "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [
                    {"addresses": ["10.7.2.2"], "conditions": {"ready": true},
                     "targetRef": {"kind": "Pod", "name": "t", "uid": "u-t"}, "nodeName": "node-2"},
                    {"addresses": ["10.7.1.9"], "conditions": {"ready": false}},
                    {"addresses": ["10.7.1.8"], "conditions": {}}]}),
            )
            .unwrap();
        let (services, _) = store.list(Kind::Service, None);
        let (slices, _) = store.list(Kind::EndpointSlice, None);
        let d = desired_rules(&services, &slices);
        assert_eq!(d.len(), 1, "headless Services get no rules: {d:?}");
        let r = &d[&key("web")];
        assert_eq!(r.cluster_ip, Ipv4Addr::new(10, 250, 0, 20));
        assert_eq!(r.ports[0].port, 80);
        assert_eq!(r.ports[0].protocol, "tcp");
        assert_eq!(
            r.ports[0].backends,
            vec![
                (Ipv4Addr::new(10, 7, 1, 8), 8080),
                (Ipv4Addr::new(10, 7, 2, 2), 8080)
            ],
            "unset ready counts as ready; ready=false is left out"
        );
        let t = r
            .endpoints
            .iter()
            .find(|e| e.ip == Ipv4Addr::new(10, 7, 2, 2))
            .unwrap();
        assert_eq!(t.uid.as_deref(), Some("u-t"));
        assert_eq!(t.node.as_deref(), Some("node-2"));
    }

    #[test]
    fn truth_lines_name_each_added_endpoint_pod() {
        let ep = |ip: [u8; 4], pod: &str| ServiceEndpoint {
            ip: Ipv4Addr::from(ip),
            pod: Some(pod.into()),
            uid: Some(format!("uid-{pod}")),
            node: Some("node-2".into()),
        };
        let mut p = ServiceProgrammed {
            node: "node-1".into(),
            namespace: "fp".into(),
            service: "svc".into(),
            cluster_ip: Some(Ipv4Addr::new(10, 200, 0, 10)),
            ports: vec![(80, "tcp".into())],
            endpoints: vec![ep([10, 7, 2, 2], "a"), ep([10, 7, 2, 3], "b")],
            added: vec![ep([10, 7, 2, 2], "a"), ep([10, 7, 2, 3], "b")],
            removed: vec![],
            seen_unix: 100.0,
            delay: Duration::from_secs(4),
        };
        let lines = p.truth_events();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].event, TruthKind::ServiceProgrammed);
        assert_eq!(lines[1].node.as_deref(), Some("node-1"));
        assert_eq!(lines[1].pod.as_deref(), Some("b"));
        assert_eq!(lines[1].uid.as_deref(), Some("uid-b"));
        assert_eq!(lines[1].ip.as_deref(), Some("10.7.2.3"));
        assert_eq!(lines[0].detail["cluster_ip"], "10.200.0.10");
        assert_eq!(lines[0].detail["delay_seconds"], 4.0);
        p.added.clear();
        p.removed = vec![ep([10, 7, 2, 3], "b")];
        let lines = p.truth_events();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].pod, None);
        assert_eq!(lines[0].detail["removed"], json!(["10.7.2.3"]));
    }
}
