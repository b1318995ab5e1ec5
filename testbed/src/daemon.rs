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
//! - `truth.jsonl` — ground truth (DESIGN §6);
//! - `control.sock` — line commands from the CLI (`fault-set PATH`, `shutdown`);
//! - `pods/<uid>/…` — per-pod files (termination message, logs);
//! - with `--control-plane real`: `control-plane/` (component logs and pid files, the
//!   audit log, kubeconfigs, etcd's data) and more of `pki/`, see
//!   [`crate::control_plane`]; both kubeconfigs are then HTTPS with the admin client
//!   certificate.

use crate::agent::Agent;
use crate::api::{
    ApiError, ApiServer, Binder, Kind, LogQuery, LogSource, ProxyFuture, ProxyRequest,
    ProxyResponse, ProxySource, Store,
};
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
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// What `testbed daemon` is started with.
#[derive(Debug, Clone)]
pub struct DaemonArgs {
    pub state_dir: PathBuf,
    pub nodes: usize,
    /// Fault file applied at start (DESIGN §6 grammar).
    pub fault: Option<PathBuf>,
    /// Extra node labels: node name → (key → value).
    pub node_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Directory holding the image binaries.
    pub bin_dir: PathBuf,
    /// Where the simulated kube-proxy serves its metrics (`none`: no kube-proxy pods).
    pub kube_proxy_metrics: crate::kube_proxy::MetricsBind,
    /// Built-in or real control plane ([`crate::control_plane`]).
    pub control_plane: crate::control_plane::Mode,
    /// Directory of the real control plane's binaries (`None`: located as
    /// [`crate::control_plane::locate_binaries`] does).
    pub control_plane_bin: Option<PathBuf>,
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

/// Node object as the testbed kubelet registers it (shape of a real v1 Node, e.g.
/// `shared/fixtures/k8s-node-ready.json`).
pub fn node_object(
    plan: &Plan,
    idx: usize,
    labels: &BTreeMap<String, String>,
) -> serde_json::Value {
    let n = &plan.nodes[idx];
    let now = crate::kubelet::now_rfc3339();
    let mut all = BTreeMap::new();
    all.insert("kubernetes.io/hostname".to_string(), n.name.clone());
    all.insert("kubernetes.io/os".to_string(), "linux".to_string());
    all.insert(
        "kubernetes.io/arch".to_string(),
        std::env::consts::ARCH
            .replace("x86_64", "amd64")
            .replace("aarch64", "arm64"),
    );
    all.insert("beta.kubernetes.io/os".to_string(), "linux".to_string());
    all.extend(labels.clone());
    let cidr = n.pod_cidr.to_string();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": n.name, "labels": all },
        "spec": { "podCIDR": cidr, "podCIDRs": [cidr] },
        "status": {
            "addresses": [
                { "type": "InternalIP", "address": n.ip.to_string() },
                { "type": "Hostname", "address": n.name },
            ],
            "capacity": { "cpu": "2", "memory": "4Gi", "pods": "110" },
            "allocatable": { "cpu": "2", "memory": "4Gi", "pods": "110" },
            "conditions": [
                { "type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available", "lastHeartbeatTime": now, "lastTransitionTime": now },
                { "type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "message": "kubelet has no disk pressure", "lastHeartbeatTime": now, "lastTransitionTime": now },
                { "type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "message": "kubelet has sufficient PID available", "lastHeartbeatTime": now, "lastTransitionTime": now },
                { "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now },
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.32.4-testbed", "kubeProxyVersion": "",
                "osImage": "firstpacket testbed (network namespaces)",
                "kernelVersion": kernel_version(), "operatingSystem": "linux",
                "architecture": std::env::consts::ARCH, "containerRuntimeVersion": "testbed://0.1.0",
                "machineID": "", "systemUUID": "", "bootID": "",
            },
        },
    })
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Runs the daemon until asked to stop; always removes what it built.
pub fn run(args: DaemonArgs) -> Result<()> {
    let plan = Plan::new(&args.state_dir, args.nodes).context("plan the cluster")?;
    plan.save().context("save plan.json")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(run_inner(&args, &plan));
    // Teardown happens whatever happened above.
    if let Err(e) = Dataplane::destroy(&plan) {
        tracing::warn!(error = %e, "dataplane teardown");
    }
    for f in ["ready.json", "control.sock", "daemon.pid"] {
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
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("read fault file {}", p.display()))?;
            let f = FaultFile::parse(&text)
                .map_err(|e| anyhow::anyhow!("fault file {}: {e}", p.display()))?;
            f.check_nodes(&node_names(plan))
                .map_err(|e| anyhow::anyhow!("fault file {}: {e}", p.display()))?;
            f
        }
        None => FaultFile::default(),
    };
    let faults = Faults::new(faults);

    let dataplane = Arc::new(
        Dataplane::create(plan).context("create the network (netns, bridge, veths, nftables)")?,
    );
    if args.control_plane == crate::control_plane::Mode::Real {
        return crate::control_plane::daemon::run(args, plan, &truth, &faults).await;
    }
    // The store persists into state/etcd (snapshot + write-ahead log) so objects and
    // resourceVersions survive `testbed api restart`; a fresh `up` starts empty. A new
    // store already holds default, kube-system, kube-public and kube-node-lease.
    let etcd = state.join("etcd");
    let _ = std::fs::remove_dir_all(&etcd);
    let store = Store::load_from(&etcd)
        .map_err(|e| anyhow::anyhow!("open the store in {}: {e}", etcd.display()))?;
    let service_cidr = crate::api::service_cidr(plan.index);
    store.set_service_cidr(service_cidr);

    // API: HTTPS with the testbed's own CA in the host netns (pods, `testbed exec`), and
    // plain HTTP on this machine's loopback (`$STATE/kubeconfig`).
    let pki = tls::ensure_pki(
        &state.join("pki"),
        &tls::api_server_sans(&[std::net::IpAddr::V4(plan.bridge_ip)], &[]),
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
    let api_local = local_addr.to_string();
    let api_cluster = format!("https://{cluster_addr}");
    let kc = state.join("kubeconfig");
    let kcc = state.join("kubeconfig-cluster");
    std::fs::write(&kc, kubeconfig(&format!("http://{api_local}"), None))?;
    std::fs::write(&kcc, kubeconfig(&api_cluster, Some(&ca_path)))?;

    // Pod proxy and logs reach pods from the host netns, like the real API server.
    let host_thread =
        NetnsThread::spawn(&plan.host_netns).context("start the host netns runtime")?;
    let pods_dir = state.join("pods");
    store.set_proxy_source(Arc::new(PodProxy {
        rt: host_thread.handle(),
    }));
    store.set_log_source(Arc::new(PodLogs {
        store: store.clone(),
        pods_dir: pods_dir.clone(),
    }));

    tokio::spawn(crate::scheduler::run(store.clone()));
    tokio::spawn(crate::controllers::run(store.clone()));

    // Nodes: a runtime inside each node netns running its kubelet and agent.
    let testbed_exe = std::env::current_exe().context("locate the testbed executable")?;
    std::fs::create_dir_all(&pods_dir)?;
    let mut node_threads = Vec::new();
    let mut kubelets = Vec::new();
    let mut proxies = Vec::new();
    for (i, n) in plan.nodes.iter().enumerate() {
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
        let kubelet = Kubelet::new(
            KubeletConfig {
                node: n.name.clone(),
                node_ip: n.ip,
                bin_dir: args.bin_dir.clone(),
                pods_dir: pods_dir.clone(),
                testbed_exe: testbed_exe.clone(),
                api_host: plan.bridge_ip.to_string(),
                api_port: plan.api_port,
                ca_cert: Some(ca_path.clone()),
            },
            store.clone(),
            dataplane.clone(),
            agent.clone(),
            truth.clone(),
        );
        thread.handle().spawn(kubelet.clone().run());
        // Felix-compatible metrics on nodeIP:9091 (hostNetwork, like calico-node).
        thread.handle().spawn({
            let agent = agent.clone();
            async move {
                if let Err(e) = crate::felix::bind_and_serve(agent).await {
                    tracing::error!(error = %e, "felix metrics server");
                }
            }
        });
        store
            .create(Kind::Node, node_object(plan, i, &labels))
            .map_err(|e| anyhow::anyhow!("register {}: {}", n.name, e.message))?;
        truth.emit(TruthEvent::node(
            TruthKind::NodeReady,
            &n.name,
            json!({"ip": n.ip.to_string()}),
        ));
        register_node_events(&store, &n.name);
        tokio::spawn(agent_pod_loop(
            store.clone(),
            n.name.clone(),
            n.ip.to_string(),
            agent.clone(),
        ));
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
            tokio::spawn(kube_proxy_pod_loop(
                store.clone(),
                n.name.clone(),
                n.ip.to_string(),
            ));
        }
        let proxy = crate::services::ServiceProxy::start(
            store.clone(),
            crate::services::ServiceProxyConfig {
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
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("start the service proxy on {}: {e}", n.name))?;
        proxies.push(proxy);
        node_threads.push(thread);
        kubelets.push(kubelet);
    }

    let info = ReadyInfo {
        pid: std::process::id(),
        api_local: format!("http://{api_local}"),
        api_cluster: api_cluster.clone(),
        kubeconfig: kc,
        kubeconfig_cluster: kcc,
        nodes: plan.nodes.iter().map(|n| n.name.clone()).collect(),
        control_plane: builtin_mode(),
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
                if handle_control(stream, &mut Control { faults: &faults, truth: &truth, store: &store, kubelets: &kubelets, server: &mut server, nodes: node_names(plan) }).await {
                    break;
                }
            }
        }
    }
    tracing::info!("shutting down");
    for k in &kubelets {
        k.kill_all();
    }
    for p in proxies {
        let _ = p.shutdown().await;
    }
    drop(node_threads);
    Ok(())
}

/// What control commands act on.
struct Control<'a> {
    server: &'a mut ApiServer,
    /// The cluster's node names (fault files are checked against them).
    nodes: Vec<String>,
    faults: &'a Faults,
    truth: &'a Truth,
    store: &'a Arc<Store>,
    kubelets: &'a [Arc<Kubelet>],
}

/// Serves one control connection: one command line, one answer line (`ok …` or
/// `error …`). Returns true on `shutdown`. Commands: `shutdown`, `fault-set PATH`,
/// `node-stop NODE`, `node-start NODE`, `api-deny VERB RESOURCE [NAMESPACE]`,
/// `api-allow VERB RESOURCE [NAMESPACE]`, `api-allow-all`, `api-expire-watches`, `api-restart`, `api-stop`,
/// `api-start`.
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
            apply_fault(Path::new(path), c.faults, c.truth, &c.nodes),
            false,
        ),
        ["node-stop", node] => (set_node_stopped(c, node, true), false),
        ["node-start", node] => (set_node_stopped(c, node, false), false),
        ["api-deny", verb, resource, ns @ ..] if ns.len() <= 1 => {
            c.store.deny_in(verb, resource, ns.first().copied());
            ("ok".to_string(), false)
        }
        ["api-allow", verb, resource, ns @ ..] if ns.len() <= 1 => {
            if c.store.allow_in(verb, resource, ns.first().copied()) {
                ("ok".to_string(), false)
            } else {
                let scope = ns
                    .first()
                    .map(|n| format!(" in namespace {n}"))
                    .unwrap_or_default();
                (
                    format!("error {verb} {resource}{scope} was not denied"),
                    false,
                )
            }
        }
        ["api-allow-all"] => {
            c.store.allow_all();
            ("ok".to_string(), false)
        }
        ["api-stop"] => {
            c.server.stop().await;
            ("ok".to_string(), false)
        }
        ["api-start"] => match c.server.start() {
            Ok(()) => ("ok".to_string(), false),
            Err(e) => (format!("error start the API server: {e}"), false),
        },
        ["api-restart"] => match c.server.restart().await {
            Ok(()) => ("ok".to_string(), false),
            Err(e) => (format!("error restart the API server: {e}"), false),
        },
        ["api-expire-watches"] => {
            c.store.expire_watches();
            ("ok".to_string(), false)
        }
        _ => (format!("error unknown control command {line:?}"), false),
    };
    let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
    stop
}

/// `testbed node stop|start NODE`: the kubelet stops (or resumes); the node controller's
/// view follows at once (no 40 s grace): Ready `Unknown` with reason
/// `NodeStatusUnknown` and the `node.kubernetes.io/unreachable` taints, and the node's
/// pods turn unready (Kubernetes docs, "Node status" and "Taint based evictions").
fn set_node_stopped(c: &Control<'_>, node: &str, stopped: bool) -> String {
    let Some(k) = c.kubelets.iter().find(|k| k.node() == node) else {
        return format!("error no node {node:?}");
    };
    k.set_paused(stopped);
    let now = crate::kubelet::now_rfc3339();
    let r = c.store.modify(Kind::Node, None, node, |n| {
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
        let (pods, _) = c.store.list(Kind::Pod, None);
        for p in pods.iter().filter(|p| p["spec"]["nodeName"] == node) {
            let (ns, name) = (
                p["metadata"]["namespace"].as_str().unwrap_or(""),
                p["metadata"]["name"].as_str().unwrap_or(""),
            );
            let _ = c.store.modify(Kind::Pod, Some(ns), name, |obj| {
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

pub(crate) fn apply_fault(path: &Path, faults: &Faults, truth: &Truth, nodes: &[String]) -> String {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return format!("error read {}: {e}", path.display()),
    };
    match FaultFile::parse(&text).and_then(|f| f.check_nodes(nodes).map(|()| f)) {
        Ok(f) => {
            faults.set_and_record(f, truth);
            "ok".to_string()
        }
        Err(e) => format!("error {}: {e}", path.display()),
    }
}

/// `pods/NAME[:PORT]/proxy/PATH`: an HTTP request from the host netns to the pod's IP
/// (its node IP for hostNetwork pods); the port is a number or a containerPort name.
struct PodProxy {
    rt: tokio::runtime::Handle,
}

impl ProxySource for PodProxy {
    fn proxy(&self, pod: &serde_json::Value, req: ProxyRequest) -> ProxyFuture {
        let ip = pod["status"]["podIP"]
            .as_str()
            .and_then(|s| s.parse::<std::net::Ipv4Addr>().ok());
        let ports: Vec<serde_json::Value> = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .collect();
        let port = match req.port.as_deref() {
            None => ports
                .first()
                .and_then(|p| p["containerPort"].as_u64())
                .map(|p| p as u16),
            Some(p) => p.parse::<u16>().ok().or_else(|| {
                ports
                    .iter()
                    .find(|x| x["name"] == p)
                    .and_then(|x| x["containerPort"].as_u64())
                    .map(|p| p as u16)
            }),
        };
        let rt = self.rt.clone();
        Box::pin(async move {
            let ip = ip.ok_or_else(|| {
                ApiError::new(
                    503,
                    "ServiceUnavailable",
                    format!("pod {} has no IP yet", req.pod),
                )
            })?;
            let port = port.ok_or_else(|| {
                ApiError::new(
                    503,
                    "ServiceUnavailable",
                    format!("no port {:?} on pod {}", req.port, req.pod),
                )
            })?;
            let path = match &req.query {
                Some(q) if !q.is_empty() => format!("{}?{q}", req.path),
                _ => req.path.clone(),
            };
            let addr = std::net::SocketAddr::from((ip, port));
            let method = req.method.clone();
            let body = req.body.clone();
            let answer = rt
                .spawn(async move {
                    crate::httpc::request(
                        addr,
                        &method,
                        &path,
                        &[("Accept", "text/plain;version=0.0.4,*/*")],
                        &body,
                        std::time::Duration::from_secs(10),
                    )
                    .await
                })
                .await
                .map_err(|e| ApiError::internal(format!("proxy task: {e}")))?;
            match answer {
                Ok(r) => Ok(ProxyResponse {
                    status: r.status,
                    content_type: None,
                    body: r.body,
                }),
                Err(e) => Err(ApiError::new(
                    503,
                    "ServiceUnavailable",
                    format!("error trying to reach service: {e}"),
                )),
            }
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
/// testbed's metrics mirror, `shared/fixtures/felix-3.20-1.prom`).
const CALICO_NODE_IMAGE: &str = "docker.io/calico/node:v3.20.0";

/// Image of the simulated kube-proxy pods.
const KUBE_PROXY_IMAGE: &str = "registry.k8s.io/kube-proxy:v1.32.0";

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

/// Writes a simulated agent pod's status: Running on the node's IP (hostNetwork), Ready
/// as `ready`, `restartCount` `restarts`. Errors: the store's (e.g. the pod is gone).
fn set_agent_pod_status(
    store: &Store,
    name: &str,
    (container, image): (&str, &str),
    node_ip: &str,
    started: &str,
    (ready, restarts): (bool, u64),
) -> Result<(), ApiError> {
    let ts = crate::kubelet::now_rfc3339();
    let (ip, started) = (node_ip.to_owned(), started.to_owned());
    let (container, image) = (container.to_owned(), image.to_owned());
    store
        .modify(Kind::Pod, Some("kube-system"), name, move |p| {
            let st = &mut p["status"];
            st["phase"] = json!("Running");
            st["podIP"] = json!(ip);
            st["podIPs"] = json!([{ "ip": ip }]);
            st["hostIP"] = json!(ip);
            st["hostIPs"] = json!([{ "ip": ip }]);
            st["startTime"] = json!(started);
            let r = if ready { "True" } else { "False" };
            st["conditions"] = json!([
                { "type": "PodScheduled", "status": "True", "lastTransitionTime": started },
                { "type": "Initialized", "status": "True", "lastTransitionTime": started },
                { "type": "ContainersReady", "status": r, "lastTransitionTime": ts },
                { "type": "Ready", "status": r, "lastTransitionTime": ts },
            ]);
            st["containerStatuses"] = json!([{
                "name": container, "image": image, "imageID": "",
                "containerID": format!("testbed://{container}-{restarts}"), "ready": ready, "started": true,
                "restartCount": restarts, "state": { "running": { "startedAt": ts } },
            }]);
            Ok(())
        })
        .map(|_| ())
}

/// Whether `node`'s `Ready` condition is `True` (a stopped node's pods are NotReady).
fn node_is_ready(store: &Store, node: &str) -> bool {
    store.get(Kind::Node, None, node).is_ok_and(|n| {
        n["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    })
}

/// (Ready, restartCount) of a stored pod's first container, `None` when the pod is gone.
fn stored_pod_state(store: &Store, name: &str) -> Option<(bool, u64)> {
    let p = store.get(Kind::Pod, Some("kube-system"), name).ok()?;
    let cs = &p["status"]["containerStatuses"][0];
    Some((
        cs["ready"] == true,
        cs["restartCount"].as_u64().unwrap_or(0),
    ))
}

/// Keeps a simulated agent pod's status in line, every second: Ready when `agent_state`
/// says so and the node is Ready (`testbed node stop` marks it NotReady, `node start`
/// brings it back), `restartCount` as `agent_state` counts. Ends when the pod is gone.
async fn agent_pod_status_loop(
    store: Arc<Store>,
    name: String,
    node: String,
    node_ip: String,
    container: (&'static str, &'static str),
    agent_state: impl Fn() -> (bool, u64),
) {
    let started = crate::kubelet::now_rfc3339();
    loop {
        let (ready, restarts) = agent_state();
        let want = (ready && node_is_ready(&store, &node), restarts);
        match stored_pod_state(&store, &name) {
            None => return, // deleted (or the cluster is going down)
            Some(have) if have == want => {}
            Some(_) => {
                if set_agent_pod_status(&store, &name, container, &node_ip, &started, want).is_err()
                {
                    return;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The calico-node pod of one node (`k8s-app=calico-node`): created once, then its
/// status follows the simulated agent ([`agent_pod_status_loop`]) — Ready as the agent
/// is, `restartCount` its restarts.
async fn agent_pod_loop(store: Arc<Store>, node: String, node_ip: String, agent: Arc<Agent>) {
    let name = format!("calico-node-{node}");
    let port = crate::felix::FELIX_METRICS_PORT;
    let pod = agent_pod(
        &name,
        &node,
        "calico-node",
        json!({ "prometheus.io/scrape": "true", "prometheus.io/port": port.to_string() }),
        json!({
            "name": "calico-node", "image": CALICO_NODE_IMAGE,
            "env": [
                { "name": "FELIX_PROMETHEUSMETRICSENABLED", "value": "true" },
                { "name": "FELIX_PROMETHEUSMETRICSPORT", "value": port.to_string() },
            ],
            "ports": [{ "name": "http-metrics", "containerPort": port, "hostPort": port, "protocol": "TCP" }],
        }),
    );
    if let Err(e) = store.create(Kind::Pod, pod) {
        tracing::warn!(node = %node, error = %e.message, "create calico-node pod");
        return;
    }
    let container = ("calico-node", CALICO_NODE_IMAGE);
    agent_pod_status_loop(store, name, node, node_ip, container, move || {
        (agent.is_ready(), agent.restart_count())
    })
    .await;
}

/// The kube-proxy pod of one node (`k8s-app=kube-proxy`, Running and Ready while its
/// node is): it stands for the node's [`crate::services::ServiceProxy`]. Its container
/// runs kube-proxy the way kubeadm's DaemonSet does (`--config`, `--hostname-override`);
/// where the metrics listen is in the daemon's `--kube-proxy-metrics`
/// ([`crate::kube_proxy`]).
async fn kube_proxy_pod_loop(store: Arc<Store>, node: String, node_ip: String) {
    let name = format!("kube-proxy-{node}");
    let pod = agent_pod(
        &name,
        &node,
        "kube-proxy",
        json!({}),
        json!({
            "name": "kube-proxy", "image": KUBE_PROXY_IMAGE,
            "command": ["/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"],
            "env": [{ "name": "NODE_NAME", "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "spec.nodeName" } } }],
        }),
    );
    if let Err(e) = store.create(Kind::Pod, pod) {
        tracing::warn!(node = %node, error = %e.message, "create kube-proxy pod");
        return;
    }
    let container = ("kube-proxy", KUBE_PROXY_IMAGE);
    agent_pod_status_loop(store, name, node, node_ip, container, || (true, 0)).await;
}

/// The events a real kubelet records when it starts and its node turns Ready
/// (`Starting`, `NodeReady`; core/v1 Events of cluster-scoped objects live in
/// `default`), so `kubectl describe node` shows them.
fn register_node_events(store: &Store, node: &str) {
    let uid = store
        .get(Kind::Node, None, node)
        .ok()
        .and_then(|n| n["metadata"]["uid"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let now = crate::kubelet::now_rfc3339();
    for (reason, message) in [
        ("Starting", "Starting kubelet.".to_string()),
        ("NodeReady", format!("Node {node} status is now: NodeReady")),
    ] {
        let ev = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": { "generateName": format!("{node}."), "namespace": "default" },
            "involvedObject": { "kind": "Node", "name": node, "uid": uid, "apiVersion": "v1" },
            "reason": reason, "message": message, "type": "Normal",
            "source": { "component": "kubelet", "host": node },
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": "kubelet", "reportingInstance": node,
        });
        if let Err(e) = store.create(Kind::Event, ev) {
            tracing::warn!(node, error = %e.message, "record node event");
        }
    }
}
