//! The testbed daemon: builds the cluster described by a [`Plan`] and runs it until
//! SIGTERM/SIGINT (or a `shutdown` on the control socket), then removes everything.
//!
//! Files in the state dir (all removed by `testbed down`):
//! - `plan.json` — names, subnets, addresses ([`Plan`]);
//! - `daemon.pid`, `daemon.log`;
//! - `ready.json` — written once every node is Ready: API URLs and kubeconfig paths;
//! - `kubeconfig` — API at `http://127.0.0.1:PORT` (usable from the machine itself);
//! - `kubeconfig-cluster` — API at `http://<bridge IP>:6443` (used by `testbed exec`
//!   and by pods);
//! - `truth.jsonl` — ground truth (docs/design.md §6);
//! - `control.sock` — line commands from the CLI (`fault-set PATH`, `shutdown`);
//! - `cni.sock` — CNI requests from `testbed cni`, the plugin of real container
//!   runtimes ([`crate::cni::CniServer`]);
//! - `pods/<uid>/…` — per-pod files (termination message, logs);
//! - with `--control-plane real`: `control-plane/` (component logs and pid files, the
//!   audit log, kubeconfigs, etcd's data) and more of `pki/`, see
//!   [`crate::control_plane`]; both kubeconfigs are then HTTPS with the admin client
//!   certificate.

use crate::agent::Agent;
use crate::api::{
    ApiError, ApiServer, Binder, Kind, LogQuery, LogSource, ProxyFuture, ProxyRequest, ProxySource,
    Store,
};
use crate::client::{ClientIdentity, ClusterEndpoint};
use crate::dataplane::Dataplane;
use crate::fault::{FaultFile, Faults};
use crate::kubelet::{Kubelet, KubeletConfig};
use crate::netns::{self, NetnsThread};
use crate::plan::Plan;
use crate::tls;
use crate::truth::{Truth, TruthEvent, TruthKind};
use anyhow::{Context, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// What `testbed daemon` is started with.
#[derive(Debug, Clone)]
pub struct DaemonArgs {
    pub state_dir: PathBuf,
    pub nodes: usize,
    /// Fault file applied at start (docs/design.md §6 grammar).
    pub fault: Option<PathBuf>,
    /// Extra node labels: node name → (key → value).
    pub node_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Directory holding the image binaries.
    pub bin_dir: PathBuf,
    /// Directory of OCI image layouts, looked up before `bin_dir` ([`crate::image`]).
    pub image_dir: PathBuf,
    /// Where the simulated kube-proxy serves its metrics (`none`: no kube-proxy pods).
    pub kube_proxy_metrics: crate::kube_proxy::MetricsBind,
    /// Built-in or real control plane ([`crate::control_plane`]).
    pub control_plane: crate::control_plane::Mode,
    /// Directory of the real control plane's binaries (`None`: located as
    /// [`crate::control_plane::locate_binaries`] does).
    pub control_plane_bin: Option<PathBuf>,
    /// Hollow nodes to add (`--hollow-nodes`; [`crate::hollow`]), if any.
    pub hollow: Option<crate::hollow::HollowSettings>,
    /// The node agent: simulated, or real Calico Felix of a version (`--agent`).
    pub agent: crate::calico::AgentChoice,
    /// The service proxy: simulated or real kube-proxy (`--kube-proxy`).
    pub kube_proxy: crate::kube_proxy_real::ProxyChoice,
    /// The kubelet and container runtime on the nodes (`--kubelet`).
    pub kubelet: crate::realnode::KubeletChoice,
    /// Dual-stack (`--ip-families ipv4,ipv6`): the plan gets IPv6 addresses and blocks
    /// ([`Plan::with_ipv6`]); false: IPv4 only, as before.
    pub ipv6: bool,
}

/// Contents of `ready.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ReadyInfo {
    pub pid: u32,
    pub api_local: String,
    pub api_cluster: String,
    pub kubeconfig: PathBuf,
    pub kubeconfig_cluster: PathBuf,
    pub nodes: Vec<String>,
    /// `builtin` or `real` (older files without the field: `builtin`).
    #[serde(default = "builtin_mode")]
    pub control_plane: String,
    /// Hollow nodes (`hollow-1`…), none without `--hollow-nodes`.
    #[serde(default)]
    pub hollow_nodes: Vec<String>,
    /// The node agent (`sim` or `calico:vX.Y.Z`; older files: `sim`).
    #[serde(default = "sim_component")]
    pub agent: String,
    /// The service proxy (`sim` or `real`; older files: `sim`).
    #[serde(default = "sim_component")]
    pub kube_proxy: String,
}

fn sim_component() -> String {
    "sim".to_owned()
}

fn builtin_mode() -> String {
    crate::control_plane::Mode::Builtin.as_arg().to_owned()
}

/// Kubeconfig for the API at `server`: with `ca` (HTTPS) it trusts the testbed's CA.
/// The user carries a placeholder token: the testbed API authorises everyone, but
/// kubectl prompts for a password over HTTPS when the user entry is empty.
pub fn kubeconfig(server: &str, ca: Option<&Path>) -> String {
    let ca = ca
        .map(|p| format!("    certificate-authority: {}\n", p.display()))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n{ca}contexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: testbed\n    namespace: default\ncurrent-context: testbed\nusers:\n- name: testbed\n  user:\n    token: testbed\n"
    )
}

/// The control plane the node components talk to: the seam between "which API server
/// runs" and everything else in the daemon. Node components (kubelets, agent pods) get
/// only [`ControlPlane::endpoint`]; `builtin` is the in-process control plane (store,
/// API server, scheduler, controllers), `None` when another one (e.g. a real
/// kube-apiserver with its scheduler and controller-manager) was started instead.
pub struct ControlPlane {
    /// How node components reach the API server (URL, CA, identity).
    pub endpoint: ClusterEndpoint,
    /// CA certificate file copied into pods' service-account dirs.
    pub pod_ca: PathBuf,
    /// `ready.json`: API URL from this machine, API URL from the cluster, kubeconfigs.
    pub api_local: String,
    pub api_cluster: String,
    pub kubeconfig: PathBuf,
    pub kubeconfig_cluster: PathBuf,
    /// The built-in control plane, when it is the one running.
    pub builtin: Option<BuiltIn>,
}

/// The built-in control plane: the store, its API server and the host-netns runtime
/// its pod proxy uses (scheduler and controllers run as tasks on the daemon's runtime).
pub struct BuiltIn {
    pub store: Arc<Store>,
    pub server: ApiServer,
    _host_thread: NetnsThread,
}

/// Starts the built-in control plane: the store (persisted in `state/etcd`, fresh on
/// every `up`), the API server (HTTPS with the testbed's CA on the bridge IP in the host
/// netns, plain HTTP on 127.0.0.1), kubeconfigs, scheduler and controllers. Node
/// components reach it at `https://<bridge IP>:<api port>` with the placeholder token.
pub async fn start_builtin_control_plane(state: &Path, plan: &Plan) -> Result<ControlPlane> {
    // The store persists into state/etcd (snapshot + write-ahead log) so objects and
    // resourceVersions survive `testbed api restart`; a fresh `up` starts empty. A new
    // store already holds default, kube-system, kube-public and kube-node-lease.
    let etcd = state.join("etcd");
    let _ = std::fs::remove_dir_all(&etcd);
    let store = Store::load_from(&etcd)
        .map_err(|e| anyhow::anyhow!("open the store in {}: {e}", etcd.display()))?;
    let service_cidr = crate::api::service_cidr(plan.index);
    store.set_service_cidr(service_cidr);
    // The `kubernetes` Service in `default` (first address of the service range, 443 →
    // the API server's secure port) and its EndpointSlice, as kube-apiserver keeps
    // them: pods reach the API through it.
    let kubernetes_ip = service_cidr.nth(1);
    create_kubernetes_service(&store, kubernetes_ip, plan.bridge_ip, plan.api_port)?;

    // API: HTTPS with the testbed's own CA in the host netns (pods, node components,
    // `testbed exec`), and plain HTTP on this machine's loopback (`$STATE/kubeconfig`).
    let pki = tls::ensure_pki(
        &state.join("pki"),
        &tls::api_server_sans(
            &[
                std::net::IpAddr::V4(plan.bridge_ip),
                std::net::IpAddr::V4(kubernetes_ip),
            ],
            &[],
        ),
    )
    .context("create the API server's CA and certificate")?;
    let tls_config = pki.server_config().context("TLS configuration")?;
    let ca_path = state.join("pki").join("ca.crt");
    let host_ns = plan.host_netns.clone();
    let binder: Binder = Arc::new(move |addr| {
        netns::run_in_netns(&host_ns, move || std::net::TcpListener::bind(addr)).and_then(|r| r)
    });
    let mut server = ApiServer::new(store.clone());
    let cluster_addr = std::net::SocketAddr::from((plan.bridge_ip, plan.api_port));
    server
        .listen(cluster_addr, Some(tls_config), Some(binder))
        .with_context(|| format!("bind the API on {cluster_addr}"))?;
    let local_addr = server
        .listen("127.0.0.1:0".parse()?, None, None)
        .context("bind the API on 127.0.0.1")?;
    let api_local = format!("http://{local_addr}");
    let api_cluster = format!("https://{cluster_addr}");
    let kc = state.join("kubeconfig");
    let kcc = state.join("kubeconfig-cluster");
    std::fs::write(&kc, kubeconfig(&api_local, None))?;
    std::fs::write(&kcc, kubeconfig(&api_cluster, Some(&ca_path)))?;

    // Pod proxy and logs reach pods from the host netns, like the real API server.
    let host_thread =
        NetnsThread::spawn(&plan.host_netns).context("start the host netns runtime")?;
    store.set_proxy_source(Arc::new(PodProxy {
        rt: host_thread.handle(),
    }));
    store.set_log_source(Arc::new(PodLogs {
        store: store.clone(),
        pods_dir: state.join("pods"),
    }));

    tokio::spawn(crate::scheduler::run(store.clone()));
    tokio::spawn(crate::controllers::run(store.clone()));
    let ca_pem =
        std::fs::read_to_string(&ca_path).with_context(|| format!("read {}", ca_path.display()))?;
    tokio::spawn(crate::controllers::run_namespace_publishers(
        store.clone(),
        ca_pem.clone(),
    ));
    Ok(ControlPlane {
        endpoint: ClusterEndpoint {
            url: api_cluster.clone(),
            ca_pem: Some(ca_pem),
            identity: ClientIdentity::Token(crate::api::NODE_TOKEN.to_string()),
        },
        pod_ca: ca_path,
        api_local,
        api_cluster,
        kubeconfig: kc,
        kubeconfig_cluster: kcc,
        builtin: Some(BuiltIn {
            store,
            server,
            _host_thread: host_thread,
        }),
    })
}

/// Creates `default/kubernetes` (ClusterIP `ip`, port `https` 443 → `api_port`) and
/// its EndpointSlice (`api_ip:api_port`, ready) in the built-in store.
fn create_kubernetes_service(
    store: &Store,
    ip: std::net::Ipv4Addr,
    api_ip: std::net::Ipv4Addr,
    api_port: u16,
) -> Result<()> {
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "kubernetes", "namespace": "default",
                      "labels": { "component": "apiserver", "provider": "kubernetes" } },
        "spec": {
            "type": "ClusterIP", "clusterIP": ip.to_string(), "clusterIPs": [ip.to_string()],
            "ports": [{ "name": "https", "port": 443, "protocol": "TCP", "targetPort": api_port }],
            "sessionAffinity": "None",
        },
    });
    store
        .create(Kind::Service, svc)
        .map_err(|e| anyhow::anyhow!("create the kubernetes Service: {}", e.message))?;
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": { "name": "kubernetes", "namespace": "default",
                      "labels": { "kubernetes.io/service-name": "kubernetes" } },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": [api_ip.to_string()], "conditions": { "ready": true } }],
        "ports": [{ "name": "https", "port": api_port, "protocol": "TCP" }],
    });
    store
        .create(Kind::EndpointSlice, slice)
        .map_err(|e| anyhow::anyhow!("create the kubernetes EndpointSlice: {}", e.message))?;
    Ok(())
}

/// The node components of every node of `plan`, running on their node netns threads.
pub struct Nodes {
    /// One simulated kubelet per node, in plan order (none with `--kubelet real`).
    pub kubelets: Vec<Arc<Kubelet>>,
    /// One real kubelet and containerd per node, in plan order (`--kubelet real`).
    pub real: Vec<Arc<crate::realnode::RealNode>>,
    /// Each node's agent (the simulated one, or the handle of real Felix), in plan
    /// order.
    agents: Vec<Arc<Agent>>,
    /// The shared host paths the real nodes made (removed after them).
    host_paths: crate::realnode::SharedHostPaths,
    proxies: Vec<crate::services::ServiceProxy>,
    /// Real Felix per node (`--agent calico`), in plan order.
    pub felix: Vec<Arc<crate::calico::felix::FelixNode>>,
    /// Real kube-proxy per node (`--kube-proxy real`), in plan order.
    pub kube_proxies: Vec<Arc<crate::supervise::Supervised>>,
    tasks: Vec<tokio::task::AbortHandle>,
    threads: Vec<NetnsThread>,
}

impl Nodes {
    /// Each node's agent by node name (what [`crate::cni::CniServer`] hands sandboxes
    /// to).
    pub fn agents(&self) -> BTreeMap<String, Arc<Agent>> {
        self.agents
            .iter()
            .map(|a| (a.node().name.clone(), a.clone()))
            .collect()
    }

    /// Kills every container (SIGKILL), stops the service proxies, real Felix and
    /// kube-proxy (their cgroups removed) and the node threads.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        for k in &self.kubelets {
            k.kill_all();
        }
        for p in self.proxies {
            let _ = p.shutdown().await;
        }
        for f in &self.felix {
            f.stop().await;
            f.remove_cgroup();
        }
        for k in &self.kube_proxies {
            k.stop().await;
        }
        for r in &self.real {
            r.stop().await;
        }
        if !self.real.is_empty() {
            self.host_paths.remove();
        }
        drop(self.threads);
    }
}

/// The real components' shared pieces: Felix builds, the pod registry of the ruleset
/// watches.
struct RealParts {
    builds: crate::calico::Builds,
    registry: Arc<crate::truth_watch::Registry>,
    /// kube-proxy binary (`--kube-proxy real`).
    kube_proxy: Option<PathBuf>,
    /// `--kubelet real`: the binaries and images of the real nodes.
    nodes: Option<RealNodeParts>,
}

/// What every real node ([`crate::realnode`]) is started with.
struct RealNodeParts {
    bins: crate::realnode::Binaries,
    /// The OCI archives imported into each node's containerd.
    images: Vec<PathBuf>,
    /// With `--kube-proxy real`: the reference of the kube-proxy image (its archive is
    /// in `images`), run as each kubelet's static pod.
    kube_proxy_image: Option<String>,
    /// The pause image's reference (containerd's `sandbox_image`).
    sandbox_image: String,
}

/// Installs what real Felix needs in the datastore ([`crate::calico::datastore`]),
/// from a runtime in the host netns. Errors: the API refusing a step.
async fn install_calico(
    plan: &Plan,
    endpoint: &ClusterEndpoint,
    builds: &crate::calico::Builds,
    version: &str,
) -> Result<()> {
    let host = NetnsThread::spawn(&plan.host_netns).context("start the host netns runtime")?;
    let (ep, crd, v) = (
        endpoint.clone(),
        builds.crd_dir(version),
        version.to_owned(),
    );
    let pool = pod_cidr(plan);
    let pool6 = pod_cidr6(plan);
    host.handle()
        .spawn(async move {
            let api = ep.client().await?;
            crate::calico::datastore::install(&api, &crd, &v, &pool, pool6.as_deref()).await
        })
        .await
        .context("Calico datastore task")?
        .context("install Calico's CRDs and resources")?;
    builds.mark_applied(version);
    Ok(())
}

/// The cluster's pod CIDR (every node's block is a /24 of it).
pub fn pod_cidr(plan: &Plan) -> String {
    format!("10.{}.0.0/16", plan.index)
}

/// A dual-stack cluster's IPv6 pod prefix: the plan's ULA `G::/48` (every node's IPv6
/// block `G:<i>::/120` lies in it, [`Plan::with_ipv6`]); `None` on an IPv4-only plan.
pub fn pod_cidr6(plan: &Plan) -> Option<String> {
    let b = plan.bridge_ip6?.segments();
    let g = std::net::Ipv6Addr::new(b[0], b[1], b[2], 0, 0, 0, 0, 0);
    Some(format!("{g}/48"))
}

/// Starts the node components of every node against `endpoint` (whichever API server
/// runs), one runtime inside each node netns: the kubelet (registers the Node and its
/// Lease, runs pods, serves the kubelet API on `<node IP>:10250` with a serving
/// certificate from the testbed CA in `state/pki`), the simulated CNI agent and its
/// Felix metrics, the agent pods (created through the API), and the service proxy
/// (kube-proxy metrics unless `--kube-proxy-metrics none`). `pod_ca` is the CA file
/// copied into pods' service-account dirs. Errors: a node runtime, the kubelet's
/// registration, the service proxy's start.
pub async fn start_nodes(
    args: &DaemonArgs,
    plan: &Plan,
    dataplane: &Arc<Dataplane>,
    truth: &Truth,
    faults: &Faults,
    endpoint: &ClusterEndpoint,
    pod_ca: &Path,
) -> Result<Nodes> {
    let state = &args.state_dir;
    let service_cidr = crate::api::service_cidr(plan.index);
    let pods_dir = state.join("pods");
    let ca_path = pod_ca.to_path_buf();
    // Nodes: a runtime inside each node netns running its kubelet and agent.
    let testbed_exe = std::env::current_exe().context("locate the testbed executable")?;
    std::fs::create_dir_all(&pods_dir)?;
    let real_proxy = args.kube_proxy == crate::kube_proxy_real::ProxyChoice::Real;
    let cp_bin = || match &args.control_plane_bin {
        Some(bin) => Ok(bin.clone()),
        None => crate::control_plane::locate_binaries(None),
    };
    let real = RealParts {
        builds: crate::calico::Builds::locate(),
        registry: Arc::default(),
        kube_proxy: match (real_proxy, &args.control_plane_bin) {
            (false, _) => None,
            (true, Some(bin)) => Some(crate::kube_proxy_real::locate(bin)?),
            (true, None) => Some(crate::kube_proxy_real::locate(
                &crate::control_plane::locate_binaries(None)?,
            )?),
        },
        nodes: match args.kubelet {
            crate::realnode::KubeletChoice::Sim => None,
            crate::realnode::KubeletChoice::Real => {
                let (mut images, sandbox_image) = crate::realnode::node_images(&args.image_dir)?;
                let kube_proxy_image = match real_proxy {
                    false => None,
                    true => {
                        let bin = crate::kube_proxy_real::locate(&cp_bin()?)?;
                        let reference = crate::kube_proxy_real::image_reference(&bin)?;
                        let tar = state.join("nodes").join("kube-proxy.oci.tar");
                        std::fs::create_dir_all(state.join("nodes"))?;
                        crate::realnode::pack_binary_image(&bin, &reference, &tar)
                            .context("pack kube-proxy into an image")?;
                        images.push(tar);
                        Some(reference)
                    }
                };
                Some(RealNodeParts {
                    bins: crate::realnode::Binaries::locate(&cp_bin()?, &testbed_exe)?,
                    images,
                    kube_proxy_image,
                    sandbox_image,
                })
            }
        },
    };
    if let Some(v) = args.agent.version() {
        install_calico(plan, endpoint, &real.builds, v).await?;
    }
    let mut node_threads = Vec::new();
    let mut kubelets = Vec::new();
    let mut proxies = Vec::new();
    let mut felix_nodes = Vec::new();
    let mut kube_proxies = Vec::new();
    let mut real_nodes = Vec::new();
    let mut agents = Vec::new();
    let host_paths = crate::realnode::SharedHostPaths::record();
    for n in plan.nodes.iter() {
        let labels = args.node_labels.get(&n.name).cloned().unwrap_or_default();
        let thread =
            NetnsThread::spawn(&n.netns).with_context(|| format!("start {} runtime", n.name))?;
        let agent = Arc::new(Agent::new(
            n.clone(),
            labels.clone(),
            dataplane.clone(),
            truth.clone(),
            faults.clone(),
        ));
        agents.push(agent.clone());
        // The simulated agent enforces NetworkPolicy: its watches (from the node, with
        // the node's identity) start before any pod.
        if args.agent.version().is_none() {
            let api = node_client(&thread, endpoint).await?;
            let a = agent.clone();
            thread
                .handle()
                .spawn(async move { a.start_policy_sync(api.kube()) })
                .await
                .context("NetworkPolicy sync start task")?;
        }
        // The node's ruleset watch (truth from the real dataplane) before any pod.
        if args.agent.version().is_some() || real_proxy {
            let watching = crate::truth_watch::Watching {
                endpoints: args.agent.version().is_some(),
                services: real_proxy,
                policies: args.agent.version().is_some(),
                ipv6: plan.has_ipv6(),
            };
            let w = crate::truth_watch::NodeWatch::start(
                &n.name,
                &thread.handle(),
                real.registry.clone(),
                truth.clone(),
                watching,
            )
            .await
            .with_context(|| format!("watch {}'s ruleset", n.name))?;
            agent.attach_watch(Arc::new(w));
        }
        // Real kube-proxy's configuration on this node (`--kube-proxy real`).
        let kp_cfg =
            real.kube_proxy
                .as_ref()
                .map(|bin| crate::kube_proxy_real::KubeProxyConfig {
                    node: n.name.clone(),
                    node_ip: n.ip,
                    cluster_cidr: pod_cidr(plan),
                    dir: state.join("kube-proxy").join(&n.name),
                    kubeconfig: endpoint.kubeconfig_yaml(),
                    binary: bin.clone(),
                    metrics_bind: args.kube_proxy_metrics.addr().unwrap_or(
                        std::net::SocketAddr::from((
                            std::net::Ipv4Addr::LOCALHOST,
                            crate::kube_proxy::KUBE_PROXY_METRICS_PORT,
                        )),
                    ),
                });
        let kubelet = match &real.nodes {
            // A real kubelet and containerd instead of the simulated kubelet.
            Some(r) => {
                // Its pods' start and readiness from the wire, before any pod.
                let (ip, t) = (n.ip, truth.clone());
                let wire = thread
                    .handle()
                    .spawn(async move { crate::wire::WireWatch::start(ip, t) })
                    .await
                    .context("wire watch task")?
                    .with_context(|| format!("watch {}'s pod interfaces", n.name))?;
                agent.attach_wire(Arc::new(wire));
                let cfg = crate::realnode::NodeConfig {
                    node: n.name.clone(),
                    node_ip: n.ip,
                    pod_cidr: n.pod_cidr.to_string(),
                    labels: labels.clone(),
                    dir: state.join("nodes").join(&n.name),
                    cgroup_root: format!("{}-{}", plan.prefix, n.name),
                    api_url: endpoint.url.clone(),
                    pki_dir: pod_ca
                        .parent()
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| state.join("pki")),
                    images: r.images.clone(),
                    sandbox_image: r.sandbox_image.clone(),
                    cni_socket: crate::cni::socket_path(state),
                    bins: r.bins.clone(),
                    // kube-proxy as the kubelet's static pod (Felix still runs beside).
                    static_pods: match (&kp_cfg, &r.kube_proxy_image) {
                        (Some(c), Some(image)) => {
                            vec![crate::kube_proxy_real::static_pod(c, image)?]
                        }
                        _ => Vec::new(),
                    },
                };
                let rn = crate::realnode::RealNode::start(cfg, thread.handle())
                    .await
                    .with_context(|| {
                        format!("start the real kubelet and containerd of {}", n.name)
                    })?;
                real_nodes.push(Arc::new(rn));
                None
            }
            None => Some(
                start_sim_kubelet(
                    args,
                    n,
                    &labels,
                    &thread,
                    endpoint,
                    dataplane,
                    &agent,
                    truth,
                    &pods_dir,
                    &ca_path,
                    &testbed_exe,
                    service_cidr,
                )
                .await?,
            ),
        };
        // Real Felix on the node, or the simulated agent's Felix-compatible metrics on
        // nodeIP:9091 (hostNetwork, like calico-node).
        let agent_image = match args.agent.version() {
            Some(default_version) => {
                let version = node_agent_version(faults, &n.name, &labels, default_version)?;
                let static_of = kubelet.is_none().then(|| real_nodes.last()).flatten();
                let felix = start_felix(
                    args,
                    plan,
                    n,
                    endpoint,
                    &real.builds,
                    &version,
                    &thread,
                    static_of.map(|r| &**r),
                )
                .await
                .with_context(|| format!("start Felix {version} on {}", n.name))?;
                agent.attach_felix(felix.clone());
                felix_nodes.push(felix);
                crate::calico::node_image(&version)
            }
            None => {
                thread.handle().spawn({
                    let agent = agent.clone();
                    async move {
                        if let Err(e) = crate::felix::bind_and_serve(agent).await {
                            tracing::error!(error = %e, "felix metrics server");
                        }
                    }
                });
                CALICO_NODE_IMAGE.to_owned()
            }
        };
        truth.emit(TruthEvent::node(
            TruthKind::NodeReady,
            &n.name,
            json!({"ip": n.ip.to_string()}),
        ));
        // The node's agent pods, created through the API like a DaemonSet's; the
        // simulated kubelet writes their status from the simulated agent (a real
        // kubelet would try to run them).
        if let Some(kubelet) = &kubelet {
            thread
                .handle()
                .spawn(create_agent_pods(
                    kubelet.api().clone(),
                    n.name.clone(),
                    agent_image,
                    args.kube_proxy_metrics.addr().is_some(),
                ))
                .await
                .context("agent pod task")?;
        }
        if let Some(cfg) = kp_cfg {
            // Real kube-proxy (nftables mode) in the node netns; a route for node-local
            // ClusterIP clients, as a real node's default route gives them.
            dataplane
                .route_via_eth0(&n.name, &service_cidr.to_string())
                .with_context(|| format!("service CIDR route on {}", n.name))?;
            if real.nodes.is_some() {
                // The real kubelet runs it (its static pod).
                node_threads.push(thread);
                continue;
            }
            let kp = crate::kube_proxy_real::start(cfg, thread.handle())
                .await
                .with_context(|| format!("start kube-proxy on {}", n.name))?;
            if let Some(kubelet) = kubelet {
                kubelet.set_kube_proxy(kp.clone());
                kubelets.push(kubelet);
            }
            kube_proxies.push(kp);
            node_threads.push(thread);
            continue;
        }
        // kube-proxy-like Service rules in the node netns, late by fault `service_delay`,
        // with kube-proxy's metrics page and pod (unless `--kube-proxy-metrics none`).
        let kp_metrics = crate::kube_proxy::KubeProxyMetrics::new(crate::truth::unix_now());
        if let Some(addr) = args.kube_proxy_metrics.addr() {
            let m = kp_metrics.clone();
            let node = n.name.clone();
            thread.handle().spawn(async move {
                if let Err(e) = crate::kube_proxy::bind_and_serve(m, addr).await {
                    tracing::error!(node = %node, error = %e, "kube-proxy metrics server");
                }
            });
        }
        let proxy_cfg = crate::services::ServiceProxyConfig {
            node: n.name.clone(),
            netns: n.netns.clone(),
            service_cidr,
            delay: {
                let (faults, labels) = (faults.clone(), labels.clone());
                Arc::new(move |node: &str| faults.service_delay(node, &labels))
            },
            on_programmed: {
                let truth = truth.clone();
                Arc::new(move |p: crate::services::ServiceProgrammed| {
                    for ev in p.truth_events() {
                        truth.emit(ev);
                    }
                })
            },
            metrics: Some(kp_metrics),
        };
        // It watches through the node's client, from the node netns.
        let api = match &kubelet {
            Some(k) => k.api().clone(),
            None => node_client(&thread, endpoint).await?,
        };
        let proxy = thread
            .handle()
            .spawn(crate::services::ServiceProxy::start(api, proxy_cfg))
            .await
            .context("service proxy start task")?
            .map_err(|e| anyhow::anyhow!("start the service proxy on {}: {e}", n.name))?;
        proxies.push(proxy);
        node_threads.push(thread);
        kubelets.extend(kubelet);
    }
    let mut tasks = Vec::new();
    if args.agent.version().is_some() {
        // `policies: N` and per-node `agent_version` follow the fault file.
        let (api, faults, kubelets2, labels) = (
            node_client(&node_threads[0], endpoint).await?,
            faults.clone(),
            kubelets.clone(),
            args.node_labels.clone(),
        );
        let default_version = args.agent.version().unwrap_or_default().to_owned();
        let t = node_threads[0].handle().spawn(async move {
            real_agent_loop(api, faults, kubelets2, labels, default_version).await
        });
        tasks.push(t.abort_handle());
    }
    Ok(Nodes {
        kubelets,
        real: real_nodes,
        agents,
        host_paths,
        proxies,
        felix: felix_nodes,
        kube_proxies,
        tasks,
        threads: node_threads,
    })
}

/// An API client made on (and used from) `thread`'s runtime, as the node's components
/// reach the API. Errors: the client's configuration.
async fn node_client(
    thread: &NetnsThread,
    endpoint: &ClusterEndpoint,
) -> Result<crate::client::ApiClient> {
    let ep = endpoint.clone();
    thread
        .handle()
        .spawn(async move { ep.client().await })
        .await
        .context("API client task")?
}

/// The simulated kubelet of node `n` ([`Kubelet`]), started on `thread` (it registers
/// its Node through the API from the node netns) with its kubelet API on
/// `<node IP>:10250` (a serving certificate from the testbed CA in `state/pki`).
/// Errors: its start, the certificate.
#[allow(clippy::too_many_arguments)]
async fn start_sim_kubelet(
    args: &DaemonArgs,
    n: &crate::plan::NodePlan,
    labels: &BTreeMap<String, String>,
    thread: &NetnsThread,
    endpoint: &ClusterEndpoint,
    dataplane: &Arc<Dataplane>,
    agent: &Arc<Agent>,
    truth: &Truth,
    pods_dir: &Path,
    ca_path: &Path,
    testbed_exe: &Path,
    service_cidr: crate::plan::Ipv4Cidr,
) -> Result<Arc<Kubelet>> {
    let state = &args.state_dir;
    let kcfg = KubeletConfig {
        node: n.name.clone(),
        node_ip: n.ip,
        pod_cidr: n.pod_cidr.to_string(),
        node_labels: labels.clone(),
        bin_dir: args.bin_dir.clone(),
        image_dir: args.image_dir.clone(),
        unpack_dir: state.join("images"),
        pods_dir: pods_dir.to_path_buf(),
        testbed_exe: testbed_exe.to_path_buf(),
        // Pods reach the API through the `kubernetes` Service, as on a real node.
        api_host: service_cidr.nth(1).to_string(),
        api_port: 443,
        ca_cert: Some(ca_path.to_path_buf()),
    };
    let kubelet = thread
        .handle()
        .spawn({
            let (ep, dp, agent, truth) = (
                endpoint.clone(),
                dataplane.clone(),
                agent.clone(),
                truth.clone(),
            );
            async move { Kubelet::start(kcfg, &ep, dp, agent, truth).await }
        })
        .await
        .context("kubelet start task")?
        .with_context(|| format!("start the kubelet of {}", n.name))?;
    thread.handle().spawn(kubelet.clone().run());
    let (cert, key) = tls::issue_serving_cert(
        &state.join("pki"),
        &format!("{}@kubelet", n.name),
        &[n.ip.to_string(), n.name.clone()],
    )
    .with_context(|| format!("kubelet serving certificate of {}", n.name))?;
    thread.handle().spawn({
        let (k, node) = (kubelet.clone(), n.name.clone());
        async move {
            if let Err(e) = k.serve_api(cert, key).await {
                tracing::error!(node = %node, error = %format!("{e:#}"), "kubelet API");
            }
        }
    });
    Ok(kubelet)
}

/// The Felix version `node` runs: its fault file's `agent_version` at start, else
/// `default`.
fn node_agent_version(
    faults: &Faults,
    node: &str,
    labels: &BTreeMap<String, String>,
    default: &str,
) -> Result<String> {
    let a = faults.current();
    let nf = a.file.for_node(node, labels, a.applied_at.elapsed());
    crate::calico::version_for(default, nf.agent_version.as_deref())
}

/// Starts real Felix `version` on node `n` (its directory, cgroup and kubeconfig under
/// `STATE/calico/NODE`): supervised by the testbed, or as `real_node`'s static pod.
#[allow(clippy::too_many_arguments)]
async fn start_felix(
    args: &DaemonArgs,
    plan: &Plan,
    n: &crate::plan::NodePlan,
    endpoint: &ClusterEndpoint,
    builds: &crate::calico::Builds,
    version: &str,
    thread: &NetnsThread,
    real_node: Option<&crate::realnode::RealNode>,
) -> Result<Arc<crate::calico::felix::FelixNode>> {
    let cgroup = match crate::calico::felix::NodeCgroup::create(&plan.prefix, &n.name) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(node = %n.name, error = %format!("{e:#}"), "no CPU cgroup: agent_cpu will be refused");
            None
        }
    };
    let cfg = crate::calico::felix::FelixConfig {
        node: n.name.clone(),
        node_ip: n.ip,
        dir: args.state_dir.join("calico").join(&n.name),
        kubeconfig: endpoint.kubeconfig_yaml(),
        cgroup,
    };
    let f = match real_node {
        // The real kubelet runs it: its static pod.
        Some(node) => {
            crate::calico::felix::FelixNode::start_static(
                cfg,
                builds.clone(),
                version,
                node,
                &args.state_dir.join("nodes"),
                thread.handle(),
            )
            .await?
        }
        None => {
            crate::calico::felix::FelixNode::start(cfg, builds.clone(), version, thread.handle())
                .await?
        }
    };
    Ok(Arc::new(f))
}

/// With real Felix: keeps the `policies: N` load as the fault file says and rolls a
/// node whose `agent_version` the file changes (checked at every file change and every
/// second, for `from`/`until` windows): the load through
/// [`crate::calico::datastore::sync_policy_load`], a version change as `testbed agent
/// roll` does it — to the version named, or to the `--agent` version when the file stops
/// naming one. A node rolled by hand keeps its version until the file's word for it
/// changes. Runs until aborted.
async fn real_agent_loop(
    api: crate::client::ApiClient,
    faults: Faults,
    kubelets: Vec<Arc<Kubelet>>,
    labels: BTreeMap<String, BTreeMap<String, String>>,
    default_version: String,
) {
    let mut rx = faults.subscribe();
    let mut policies = 0u32;
    // Per node, the `agent_version` the fault file last asked for (a roll by hand
    // afterwards is left alone until the file asks for another one).
    let mut asked: BTreeMap<String, Option<String>> = BTreeMap::new();
    loop {
        let a = faults.current();
        let since = a.applied_at.elapsed();
        let want = a.file.policies_in_force(since);
        if want != policies {
            let nodes: Vec<String> = kubelets.iter().map(|k| k.node().to_owned()).collect();
            match crate::calico::datastore::sync_policy_load(&api, &nodes, policies, want).await {
                Ok(n) => {
                    tracing::info!(policies = n, "policy load");
                    policies = n;
                }
                Err(e) => tracing::error!(error = %format!("{e:#}"), "policy load"),
            }
        }
        for k in &kubelets {
            let node = k.node().to_owned();
            let l = labels.get(&node).cloned().unwrap_or_default();
            let nf = a.file.for_node(&node, &l, since);
            let first = !asked.contains_key(&node);
            let previous = asked
                .insert(node.clone(), nf.agent_version.clone())
                .flatten();
            // At start the node already runs its version (`node_agent_version`); later,
            // only a change of the file's word for this node rolls it: to the named
            // version, or back to the default one when the file stops naming one.
            if first || previous == nf.agent_version {
                continue;
            }
            let Ok(v) = crate::calico::version_for(&default_version, nf.agent_version.as_deref())
            else {
                continue;
            };
            let running = k.agent().felix().map(|f| f.version());
            if running.is_some_and(|r| r != v) {
                tracing::info!(node = %node, version = %v, "agent_version: rolling");
                if let Err(e) = k
                    .roll_agent(&crate::calico::node_image(&v), Duration::ZERO)
                    .await
                {
                    tracing::error!(node = %node, error = %format!("{e:#}"), "agent_version roll");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

/// Hollow nodes ([`crate::hollow`]) running on their own thread in the host netns;
/// dropping it stops them.
pub struct HollowNodes {
    // Field order is drop order: the tasks go before their runtime.
    hollow: crate::hollow::Hollow,
    _thread: NetnsThread,
}

impl HollowNodes {
    /// Their names, in order.
    pub fn names(&self) -> Vec<String> {
        self.hollow.names().to_vec()
    }
}

/// Starts `args.hollow`'s hollow nodes (none: `Ok(None)`) against `endpoint`: makes
/// their InternalIP block local in the host netns, then registers and runs them on a
/// thread there ([`crate::hollow::Hollow::start`]). Errors: the address block, the
/// thread, the client, a registration.
pub async fn start_hollow(
    args: &DaemonArgs,
    plan: &Plan,
    dataplane: &Dataplane,
    truth: &Truth,
    endpoint: &ClusterEndpoint,
) -> Result<Option<HollowNodes>> {
    let Some(h) = &args.hollow else {
        return Ok(None);
    };
    dataplane
        .add_host_local_block(crate::hollow::node_ip_range(plan.index))
        .context("hollow nodes' address block")?;
    let thread = NetnsThread::spawn(&plan.host_netns).context("start the hollow nodes' runtime")?;
    let cfg = crate::hollow::HollowConfig {
        count: h.count,
        ttfp: h.ttfp,
        direct_scrapes: h.direct_scrapes,
        index: plan.index,
        kube_proxy: args.kube_proxy_metrics,
    };
    let (ep, truth) = (endpoint.clone(), truth.clone());
    let hollow = thread
        .handle()
        .spawn(async move {
            let api = ep.client().await?;
            crate::hollow::Hollow::start(cfg, api, truth).await
        })
        .await
        .context("hollow nodes' start task")?
        .context("start the hollow nodes")?;
    Ok(Some(HollowNodes {
        hollow,
        _thread: thread,
    }))
}

/// Runs the daemon until asked to stop; always removes what it built.
pub fn run(args: DaemonArgs) -> Result<()> {
    let mut plan = Plan::new(&args.state_dir, args.nodes).context("plan the cluster")?;
    if args.ipv6 {
        plan = plan.with_ipv6();
    }
    plan.save().context("save plan.json")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(run_inner(&args, &plan));
    // Teardown happens whatever happened above (real nodes that started before a
    // failure included).
    crate::realnode::sweep(&args.state_dir.join("nodes"), &plan.prefix);
    if let Err(e) = Dataplane::destroy(&plan) {
        tracing::warn!(error = %e, "dataplane teardown");
    }
    for f in [
        "ready.json",
        "control.sock",
        crate::cni::SOCKET_FILE,
        "daemon.pid",
    ] {
        let _ = std::fs::remove_file(args.state_dir.join(f));
    }
    let _ = std::fs::remove_dir_all(args.state_dir.join("pods"));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}

/// The plan's node names (`node-1`…).
fn node_names(plan: &Plan) -> Vec<String> {
    plan.nodes.iter().map(|n| n.name.clone()).collect()
}

async fn run_inner(args: &DaemonArgs, plan: &Plan) -> Result<()> {
    let state = &args.state_dir;
    std::fs::write(state.join("daemon.pid"), std::process::id().to_string())?;
    let truth = Truth::open(&state.join("truth.jsonl")).context("open truth log")?;
    let faults = match &args.fault {
        Some(p) => FaultFile::load_checked(
            p,
            &node_names(plan),
            args.agent.kind(),
            args.kube_proxy.kind(),
            args.kubelet.kind(),
            plan.has_ipv6(),
        )?,
        None => FaultFile::default(),
    };
    let faults = Faults::new(faults);

    let dataplane = Arc::new(
        Dataplane::create_with(plan, args.agent == crate::calico::AgentChoice::Sim)
            .context("create the network (netns, bridge, veths, nftables)")?,
    );
    if args.control_plane == crate::control_plane::Mode::Real {
        return crate::control_plane::daemon::run(args, plan, &dataplane, &truth, &faults).await;
    }
    let mut cp = start_builtin_control_plane(state, plan).await?;
    let nodes = start_nodes(
        args,
        plan,
        &dataplane,
        &truth,
        &faults,
        &cp.endpoint,
        &cp.pod_ca,
    )
    .await?;
    let hollow = start_hollow(args, plan, &dataplane, &truth, &cp.endpoint).await?;
    let cni = crate::cni::CniServer::start(
        &crate::cni::socket_path(state),
        dataplane.clone(),
        nodes.agents(),
    )
    .context("serve the CNI socket")?;

    let info = ReadyInfo {
        pid: std::process::id(),
        api_local: cp.api_local.clone(),
        api_cluster: cp.api_cluster.clone(),
        kubeconfig: cp.kubeconfig.clone(),
        kubeconfig_cluster: cp.kubeconfig_cluster.clone(),
        nodes: plan.nodes.iter().map(|n| n.name.clone()).collect(),
        control_plane: builtin_mode(),
        hollow_nodes: hollow.as_ref().map(HollowNodes::names).unwrap_or_default(),
        agent: args.agent.as_arg(),
        kube_proxy: args.kube_proxy.as_arg().to_owned(),
    };

    // Control socket.
    let sock_path = state.join("control.sock");
    let _ = std::fs::remove_file(&sock_path);
    let control = tokio::net::UnixListener::bind(&sock_path)?;
    std::fs::write(state.join("ready.json"), serde_json::to_vec_pretty(&info)?)?;
    tracing::info!(nodes = plan.nodes.len(), api = %info.api_local, "testbed up");

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            conn = control.accept() => {
                let Ok((stream, _)) = conn else { continue };
                if handle_control(stream, &mut Control { faults: &faults, truth: &truth, builtin: cp.builtin.as_mut(), kubelets: &nodes.kubelets, nodes: node_names(plan), ipv6: plan.has_ipv6() }).await {
                    break;
                }
            }
        }
    }
    tracing::info!("shutting down");
    drop(hollow);
    cni.shutdown().await;
    nodes.shutdown().await;
    Ok(())
}

/// What control commands act on.
struct Control<'a> {
    /// The built-in control plane (`None` when another API server runs).
    builtin: Option<&'a mut BuiltIn>,
    /// The cluster's node names (fault files are checked against them).
    nodes: Vec<String>,
    /// The testbed is dual-stack (fault files are checked against it too).
    ipv6: bool,
    faults: &'a Faults,
    truth: &'a Truth,
    kubelets: &'a [Arc<Kubelet>],
}

/// Serves one control connection: one command line, one answer line (`ok …` or
/// `error …`). Returns true on `shutdown`. Commands: `shutdown`, `fault-set PATH`,
/// `node-stop NODE`, `node-start NODE`, `api-deny VERB RESOURCE [NAMESPACE]`,
/// `api-deny-nodes-too VERB RESOURCE [NAMESPACE]` (also for the node components),
/// `api-allow VERB RESOURCE [NAMESPACE]`, `api-allow-all`, `api-expire-watches`, `api-restart`, `api-stop`,
/// `api-start`, `agent-roll NODE IMAGE [DOWN]` (answer `ok NEW_POD NEW_UID`).
async fn handle_control(stream: tokio::net::UnixStream, c: &mut Control<'_>) -> bool {
    let (r, mut w) = stream.into_split();
    let mut lines = tokio::io::BufReader::new(r).lines();
    let Ok(Some(line)) = lines.next_line().await else {
        return false;
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let (answer, stop) = match words.as_slice() {
        ["shutdown"] => ("ok".to_string(), true),
        ["fault-set", path] => (
            apply_fault(
                Path::new(path),
                c.faults,
                c.truth,
                &c.nodes,
                &crate::calico::AgentChoice::Sim,
                crate::kube_proxy_real::ProxyChoice::Sim,
                crate::realnode::KubeletChoice::Sim,
                c.ipv6,
            ),
            false,
        ),
        ["node-stop", node] => (set_node_stopped(c, node, true), false),
        ["node-start", node] => (set_node_stopped(c, node, false), false),
        ["agent-roll", node, image, down @ ..] if down.len() <= 1 => (
            roll_agent(c.kubelets, node, image, down.first().copied()).await,
            false,
        ),
        [cmd, ..] if cmd.starts_with("api-") => match c.builtin.as_deref_mut() {
            Some(b) => (builtin_api_command(b, &words, &line).await, false),
            None => (
                format!("error {cmd} is not available for this control plane"),
                false,
            ),
        },
        _ => (format!("error unknown control command {line:?}"), false),
    };
    let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
    stop
}

/// The `api-*` control commands on the built-in API server.
async fn builtin_api_command(b: &mut BuiltIn, words: &[&str], line: &str) -> String {
    match words {
        ["api-deny", verb, resource, ns @ ..] if ns.len() <= 1 => {
            b.store.deny_in(verb, resource, ns.first().copied());
            "ok".to_string()
        }
        ["api-deny-nodes-too", verb, resource, ns @ ..] if ns.len() <= 1 => {
            b.store
                .deny_everyone_in(verb, resource, ns.first().copied());
            "ok".to_string()
        }
        ["api-allow", verb, resource, ns @ ..] if ns.len() <= 1 => {
            if b.store.allow_in(verb, resource, ns.first().copied()) {
                "ok".to_string()
            } else {
                let scope = ns
                    .first()
                    .map(|n| format!(" in namespace {n}"))
                    .unwrap_or_default();
                format!("error {verb} {resource}{scope} was not denied")
            }
        }
        ["api-allow-all"] => {
            b.store.allow_all();
            "ok".to_string()
        }
        ["api-stop"] => {
            b.server.stop().await;
            "ok".to_string()
        }
        ["api-start"] => match b.server.start() {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error start the API server: {e}"),
        },
        ["api-restart"] => match b.server.restart().await {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error restart the API server: {e}"),
        },
        ["api-expire-watches"] => {
            b.store.expire_watches();
            "ok".to_string()
        }
        _ => format!("error unknown control command {line:?}"),
    }
}

/// `testbed node stop|start NODE`: the kubelet stops (or resumes); the node controller's
/// view follows at once (no 40 s grace): Ready `Unknown` with reason
/// `NodeStatusUnknown` and the `node.kubernetes.io/unreachable` taints, and the node's
/// pods turn unready (Kubernetes docs, "Node status" and "Taint based evictions").
/// That view is the built-in control plane's; another control plane's node-lifecycle
/// controller sees the kubelet's heartbeats stop and acts on its own.
fn set_node_stopped(c: &Control<'_>, node: &str, stopped: bool) -> String {
    let Some(b) = c.builtin.as_deref() else {
        return match pause_kubelet(c.kubelets, c.truth, node, stopped) {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error {e}"),
        };
    };
    let Some(k) = c.kubelets.iter().find(|k| k.node() == node) else {
        return format!("error no node {node:?}");
    };
    k.set_paused(stopped);
    let store = &b.store;
    let now = crate::kubelet::now_rfc3339();
    let r = store.modify(Kind::Node, None, node, |n| {
        if let Some(conds) = n["status"]["conditions"].as_array_mut() {
            for cond in conds.iter_mut().filter(|c| c["type"] == "Ready") {
                let (status, reason, message) = if stopped {
                    ("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
                } else {
                    ("True", "KubeletReady", "kubelet is posting ready status")
                };
                if cond["status"] != status {
                    cond["lastTransitionTime"] = json!(now);
                }
                cond["status"] = json!(status);
                cond["reason"] = json!(reason);
                cond["message"] = json!(message);
                cond["lastHeartbeatTime"] = json!(now);
            }
        }
        let mut taints: Vec<serde_json::Value> = n["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t["key"] != "node.kubernetes.io/unreachable")
            .collect();
        if stopped {
            taints.push(json!({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": now}));
            taints.push(json!({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": now}));
        }
        if taints.is_empty() {
            if let Some(spec) = n["spec"].as_object_mut() {
                spec.remove("taints");
            }
        } else {
            n["spec"]["taints"] = json!(taints);
        }
        Ok(())
    });
    if let Err(e) = r {
        return format!("error {}", e.message);
    }
    if stopped {
        let (pods, _) = store.list(Kind::Pod, None);
        for p in pods.iter().filter(|p| p["spec"]["nodeName"] == node) {
            let (ns, name) = (
                p["metadata"]["namespace"].as_str().unwrap_or(""),
                p["metadata"]["name"].as_str().unwrap_or(""),
            );
            let _ = store.modify(Kind::Pod, Some(ns), name, |obj| {
                if let Some(conds) = obj["status"]["conditions"].as_array_mut() {
                    for cond in conds
                        .iter_mut()
                        .filter(|c| c["type"] == "Ready" && c["status"] == "True")
                    {
                        cond["status"] = json!("False");
                        cond["reason"] = json!("NodeNotReady");
                        cond["lastTransitionTime"] = json!(now);
                    }
                }
                if let Some(cs) = obj["status"]["containerStatuses"].get_mut(0) {
                    if cs["ready"] == true {
                        cs["ready"] = json!(false);
                    }
                }
                Ok(())
            });
        }
    }
    let kind = if stopped {
        TruthKind::NodeNotReady
    } else {
        TruthKind::NodeReady
    };
    c.truth.emit(TruthEvent::node(
        kind,
        node,
        json!({"cause": if stopped { "testbed node stop" } else { "testbed node start" }}),
    ));
    "ok".to_string()
}

/// `testbed node stop|start NODE` on a control plane that watches heartbeats itself:
/// the node's kubelet stops (or resumes) and the truth log records `node_not_ready`
/// (or `node_ready`) with the cause. Errors: no such node.
/// `agent-roll NODE IMAGE [DOWN]` on either control plane: the node's kubelet replaces its
/// calico-node pod ([`Kubelet::roll_agent`]). Answers `ok NEW_POD NEW_UID` or
/// `error …`.
pub(crate) async fn roll_agent(
    kubelets: &[Arc<Kubelet>],
    node: &str,
    image: &str,
    down: Option<&str>,
) -> String {
    let Some(k) = kubelets.iter().find(|k| k.node() == node) else {
        let nodes: Vec<&str> = kubelets.iter().map(|k| k.node()).collect();
        return format!("error no node {node:?} (nodes: {})", nodes.join(", "));
    };
    let down = match down.map(humantime::parse_duration).transpose() {
        Ok(d) => d.unwrap_or_default(),
        Err(e) => return format!("error down duration: {e}"),
    };
    match k.roll_agent(image, down).await {
        Ok((name, uid)) => format!("ok {name} {uid}"),
        Err(e) => format!("error {}", format!("{e:#}").replace('\n', " | ")),
    }
}

/// `testbed node stop|start NODE` with real kubelets: stops (or starts again) the
/// node's kubelet and containerd ([`crate::realnode::RealNode::pause_node`]); the
/// node-lifecycle controller sees the heartbeats stop. Other nodes: [`pause_kubelet`].
pub(crate) async fn pause_node(
    kubelets: &[Arc<Kubelet>],
    real: &[Arc<crate::realnode::RealNode>],
    truth: &Truth,
    node: &str,
    stopped: bool,
) -> Result<(), String> {
    let Some(r) = real.iter().find(|r| r.name() == node) else {
        return pause_kubelet(kubelets, truth, node, stopped);
    };
    if stopped {
        r.pause_node().await;
    } else {
        r.resume().await.map_err(|e| format!("{e:#}"))?;
    }
    emit_node_stopped(truth, node, stopped);
    Ok(())
}

pub(crate) fn pause_kubelet(
    kubelets: &[Arc<Kubelet>],
    truth: &Truth,
    node: &str,
    stopped: bool,
) -> Result<(), String> {
    let Some(k) = kubelets.iter().find(|k| k.node() == node) else {
        return Err(format!("no node {node:?}"));
    };
    k.set_paused(stopped);
    emit_node_stopped(truth, node, stopped);
    Ok(())
}

/// The truth of `testbed node stop|start`.
fn emit_node_stopped(truth: &Truth, node: &str, stopped: bool) {
    let kind = if stopped {
        TruthKind::NodeNotReady
    } else {
        TruthKind::NodeReady
    };
    truth.emit(TruthEvent::node(
        kind,
        node,
        json!({"cause": if stopped { "testbed node stop" } else { "testbed node start" }}),
    ));
}

/// `fault set FILE`: parses and checks the file for `nodes` and the running components
/// (a primitive that does not apply to them is refused naming its line; with real Felix
/// every `agent_version` must be built) and puts it in force. `ipv6`: the testbed is
/// dual-stack (`family_broken: ipv6` is refused otherwise). Answers `ok` or `error …`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply_fault(
    path: &Path,
    faults: &Faults,
    truth: &Truth,
    nodes: &[String],
    agent: &crate::calico::AgentChoice,
    proxy: crate::kube_proxy_real::ProxyChoice,
    kubelet: crate::realnode::KubeletChoice,
    ipv6: bool,
) -> String {
    let checked = FaultFile::load_checked(
        path,
        nodes,
        agent.kind(),
        proxy.kind(),
        kubelet.kind(),
        ipv6,
    )
    .and_then(|f| {
        if agent.version().is_some() {
            let versions = f.agent_versions();
            crate::calico::Builds::locate().require(versions.iter().map(String::as_str))?;
        }
        Ok(f)
    });
    match checked {
        Ok(f) => {
            faults.set_and_record(f, truth);
            "ok".to_string()
        }
        Err(e) => format!("error {}", format!("{e:#}").replace('\n', " | ")),
    }
}

/// `pods/NAME[:PORT]/proxy/PATH`: the built-in API server's own proxy
/// ([`crate::api::proxy::pod_address`], [`crate::api::proxy::forward`], as kube-apiserver
/// answers it), dialled from the host netns runtime `rt`, where pod IPs (and node IPs,
/// for hostNetwork pods) are routable.
struct PodProxy {
    rt: tokio::runtime::Handle,
}

impl ProxySource for PodProxy {
    fn proxy(&self, pod: &serde_json::Value, req: ProxyRequest) -> ProxyFuture {
        let addr = crate::api::proxy::pod_address(pod, req.port.as_deref());
        let rt = self.rt.clone();
        Box::pin(async move {
            let addr = addr?;
            rt.spawn(crate::api::proxy::forward(addr, req))
                .await
                .map_err(|e| ApiError::internal(format!("proxy task: {e}")))?
        })
    }
}

/// `pods/NAME/log`: the container's log file kept by the kubelet.
struct PodLogs {
    store: Arc<Store>,
    pods_dir: std::path::PathBuf,
}

impl LogSource for PodLogs {
    fn read(
        &self,
        namespace: &str,
        pod: &str,
        _container: &str,
        query: &LogQuery,
    ) -> Option<String> {
        let obj = self.store.get(Kind::Pod, Some(namespace), pod).ok()?;
        let uid = obj["metadata"]["uid"].as_str()?;
        let tail = query.tail_lines.and_then(|n| usize::try_from(n).ok());
        crate::kubelet::read_logs(&self.pods_dir, uid, tail)
    }
}

/// Image of the simulated calico-node pods (the Calico release whose Felix page the
/// testbed's metrics mirror, `prober/tests/fixtures/felix-3.20-1.prom`).
pub const CALICO_NODE_IMAGE: &str = "docker.io/calico/node:v3.20.0";

/// Image of the simulated kube-proxy pods.
pub const KUBE_PROXY_IMAGE: &str = "registry.k8s.io/kube-proxy:v1.32.0";

/// A node-agent pod the daemon simulates (kube-system, hostNetwork, one per node, as a
/// DaemonSet would run it): `name` on `node`, labelled `k8s-app=<app>`, with one
/// container. The kubelet leaves it alone ([`crate::kubelet::SIMULATED_ANNOTATION`]);
/// its status is written by [`set_agent_pod_status`].
fn agent_pod(
    name: &str,
    node: &str,
    app: &str,
    annotations: serde_json::Value,
    container: serde_json::Value,
) -> serde_json::Value {
    let mut ann = json!({ crate::kubelet::SIMULATED_ANNOTATION: app });
    if let (Some(a), Some(extra)) = (ann.as_object_mut(), annotations.as_object()) {
        a.extend(extra.clone());
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "kube-system",
            "labels": { "k8s-app": app },
            "annotations": ann,
        },
        "spec": {
            "nodeName": node, "hostNetwork": true, "priorityClassName": "system-node-critical",
            "tolerations": [{ "operator": "Exists" }],
            "containers": [container],
        },
    })
}

/// The simulated calico-node pod of `node` (`calico-node-NODE` in kube-system,
/// `k8s-app=calico-node`, Felix's metrics port as hostPort) with container image `image`.
pub fn calico_node_pod(node: &str, image: &str) -> serde_json::Value {
    let port = crate::felix::FELIX_METRICS_PORT;
    agent_pod(
        &format!("calico-node-{node}"),
        node,
        "calico-node",
        json!({ "prometheus.io/scrape": "true", "prometheus.io/port": port.to_string() }),
        json!({
            "name": "calico-node", "image": image,
            "env": [
                { "name": "FELIX_PROMETHEUSMETRICSENABLED", "value": "true" },
                { "name": "FELIX_PROMETHEUSMETRICSPORT", "value": port.to_string() },
            ],
            "ports": [{ "name": "http-metrics", "containerPort": port, "hostPort": port, "protocol": "TCP" }],
        }),
    )
}

/// The simulated kube-proxy pod of `node` (`kube-proxy-NODE` in kube-system,
/// `k8s-app=kube-proxy`; its container runs kube-proxy the way kubeadm's DaemonSet
/// does).
pub fn kube_proxy_pod(node: &str) -> serde_json::Value {
    agent_pod(
        &format!("kube-proxy-{node}"),
        node,
        "kube-proxy",
        json!({}),
        json!({
            "name": "kube-proxy", "image": KUBE_PROXY_IMAGE,
            "command": ["/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"],
            "env": [{ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "spec.nodeName" } } }],
        }),
    )
}

/// The calico-node pod (`k8s-app=calico-node`, Felix's metrics port, `calico_image`) and, with
/// `kube_proxy`, the kube-proxy pod (`k8s-app=kube-proxy`; it stands for the node's
/// [`crate::services::ServiceProxy`], its container runs kube-proxy the way kubeadm's
/// DaemonSet does) of `node`, created through the API. An existing pod is kept.
async fn create_agent_pods(
    api: crate::client::ApiClient,
    node: String,
    calico_image: String,
    kube_proxy: bool,
) {
    let mut pods = vec![calico_node_pod(&node, &calico_image)];
    if kube_proxy {
        pods.push(kube_proxy_pod(&node));
    }
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let mut wait = std::time::Duration::from_millis(250);
        for _ in 0..20 {
            match api.post("/api/v1/namespaces/kube-system/pods", &pod).await {
                Ok(_) => break,
                Err(e) if e.code == 409 => break,
                Err(e) if e.is_transient() => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::warn!(node = %node, pod = %name, error = %e, "create agent pod");
                    break;
                }
            }
        }
    }
}
