//! The testbed kubelet: one per node, running on that node's [`NetnsThread`] runtime so
//! its readiness probes leave from the node's network namespace, as the real kubelet's
//! do (which is why a pod is reachable from its node before the CNI agent programs it).
//!
//! It is a client of the API server like the real kubelet ([`crate::client`]; HTTPS
//! from the node netns), whichever API server runs:
//! - registers its Node (labels, capacity, conditions, addresses, nodeInfo,
//!   `daemonEndpoints`, podCIDR) and, every [`HEARTBEAT`], renews its Lease in
//!   `kube-node-lease` ([`LEASE_SECONDS`]) and brings the Node's conditions back to
//!   Ready when they are not (a stopped kubelet sends nothing);
//! - watches the pods with `spec.nodeName=<node>` and drives each through its life;
//! - writes pod status only through `pods/NAME/status` (JSON merge patch of what
//!   changed, carrying `metadata.uid` so it cannot land on a new pod of the same name);
//! - finishes graceful deletion itself: SIGTERM, grace, SIGKILL, then `DELETE` with
//!   `gracePeriodSeconds=0` and a UID precondition.
//!
//! Per pod it: resolves the image (pod-spec contract, docs/design.md §6): an OCI image
//! of the image dir ([`crate::image`]), else the local binary named by the last path
//! component without `:tag`/`@digest`, else `ErrImagePull`,
//! sets up the sandbox network ([`Dataplane::add_pod`]) and tells the node's agent,
//! starts the container through `testbed shim` with the identity its `securityContext`
//! and its image's user give ([`crate::security::container_identity`]; `runAsNonRoot`
//! against a root user → `CreateContainerConfigError`), runs the readiness probe (`httpGet`,
//! `User-Agent: kube-probe/1.32`), keeps `status` like the real kubelet (conditions
//! with timestamps, container state, termination message), enforces
//! `activeDeadlineSeconds`.
//!
//! Simulated agent pods (calico-node, kube-proxy; [`SIMULATED_ANNOTATION`]) run no
//! process: their status follows the node's simulated agent (Ready, restarts since the
//! pod started). [`Kubelet::roll_agent`] replaces the node's calico-node pod
//! (`testbed agent roll`).
//!
//! Termination message: the last 4096 bytes of the container's
//! `terminationMessagePath` file; with `FallbackToLogsOnError`, the tail of the logs
//! only when that file is empty *and* the exit code is non-zero (Kubernetes docs,
//! "Customizing the termination message").
//!
//! [`NetnsThread`]: crate::netns::NetnsThread

use crate::agent::Agent;
use crate::client::{core_path, merge_diff, ApiCallError, ApiClient, ClusterEndpoint, PatchKind};
use crate::dataplane::{Dataplane, PodNet};
use crate::httpc;
use crate::truth::{Truth, TruthEvent, TruthKind};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// The real kubelet keeps at most this many bytes of a termination message
/// (k8s.io/kubernetes `pkg/kubelet/kuberuntime`, `maxMsgSize`).
pub const MAX_TERMINATION_MESSAGE: usize = 4096;
/// With `FallbackToLogsOnError`, the log tail used has at most this many lines
/// (`kuberuntime_container.go`, `kubecontainer.MaxContainerTerminationMessageLogLines`).
pub const FALLBACK_LOG_LINES: usize = 80;
/// Default `terminationGracePeriodSeconds` (Kubernetes API default).
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

/// A container's environment from ConfigMaps ([`Kubelet::config_map_env`]).
#[derive(Debug, Default)]
struct ConfigMapEnv {
    /// `envFrom` variables in order (later ones override earlier ones).
    from: Vec<(String, String)>,
    /// `valueFrom.configMapKeyRef` values by env name (absent: optional and missing).
    by_key_ref: HashMap<String, String>,
}

/// Pods carrying this annotation are simulated by the daemon (the calico-node and
/// kube-proxy agent pods; the value is the app, `calico-node` or `kube-proxy`): the
/// kubelet runs no container for them and writes their status from the agent.
pub const SIMULATED_ANNOTATION: &str = "testbed.firstpacket.io/simulated";

/// Token written into every pod's service-account directory (the testbed API
/// authorises every request; clients only need something to send).
pub const SERVICE_ACCOUNT_TOKEN: &str = "testbed";

/// The kubelet API port (`daemonEndpoints.kubeletEndpoint.Port`).
pub const KUBELET_PORT: u16 = 10250;

/// How often the kubelet renews its Lease and checks its Node's conditions (the real
/// kubelet's `nodeLeaseRenewInterval`, 10 s = a quarter of the lease duration).
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// `leaseDurationSeconds` of the node Lease (the real kubelet's default, 40 s).
pub const LEASE_SECONDS: i64 = 40;

/// A Node's conditions are re-posted (fresh `lastHeartbeatTime`) at least this often,
/// even unchanged.
pub const NODE_STATUS_REPORT: Duration = Duration::from_secs(60);

/// A refused pod status write is sent again after this long.
pub const STATUS_RESYNC: Duration = Duration::from_secs(5);
/// How soon a Ready condition someone else turned False (while this kubelet wants True)
/// is put back (`StatusWriter::reconcile`).
pub const STATUS_RECONCILE_DELAY: Duration = Duration::from_secs(2);

/// What the kubelet of one node needs.
#[derive(Clone)]
pub struct KubeletConfig {
    /// Node name (`node-1`…).
    pub node: String,
    /// The node's InternalIP (`status.hostIP` of its pods).
    pub node_ip: Ipv4Addr,
    /// `spec.podCIDR` of the Node (e.g. `10.244.1.0/24`).
    pub pod_cidr: String,
    /// Extra Node labels (`--node-labels`).
    pub node_labels: BTreeMap<String, String>,
    /// Directory holding the image binaries (`target-server`, `prober`, …).
    pub bin_dir: PathBuf,
    /// Directory of OCI image layouts, looked up first ([`crate::image`]).
    pub image_dir: PathBuf,
    /// Where OCI images are unpacked (`<unpack_dir>/<manifest hex>/rootfs`).
    pub unpack_dir: PathBuf,
    /// Directory for per-pod files (`<pods_dir>/<uid>/…`).
    pub pods_dir: PathBuf,
    /// The `testbed` executable, run as `testbed shim` for every container.
    pub testbed_exe: PathBuf,
    /// `KUBERNETES_SERVICE_HOST` / `_PORT` given to every container.
    pub api_host: String,
    pub api_port: u16,
    /// The API server's CA certificate, copied into each pod's service-account dir.
    pub ca_cert: Option<PathBuf>,
}

/// One node's kubelet.
pub struct Kubelet {
    cfg: KubeletConfig,
    api: ApiClient,
    dataplane: Arc<Dataplane>,
    agent: Arc<Agent>,
    truth: Truth,
    /// Running pod workers by pod uid: the sender tells the worker the pod's latest
    /// object (deletion requests arrive as `deletionTimestamp`).
    workers: Mutex<HashMap<String, watch::Sender<Arc<Value>>>>,
    /// The status writer of every running worker (marked stale when the kubelet
    /// resumes: others may have changed the status meanwhile).
    writers: Mutex<HashMap<String, Arc<StatusWriter>>>,
    /// `testbed node stop`: the kubelet neither starts pods, probes nor heartbeats.
    paused: watch::Sender<bool>,
    /// UIDs whose workers have finished (bounded, oldest dropped first): events for them
    /// still queued in the watch stream must not start a second sandbox.
    finished: Mutex<std::collections::VecDeque<String>>,
    /// The node's runtime (its sockets live in the node netns): work requested from
    /// elsewhere (the daemon's control socket) runs here.
    rt: tokio::runtime::Handle,
    /// Real kube-proxy of this node (`--kube-proxy real`): the kube-proxy pod's status
    /// and log follow it.
    kube_proxy: std::sync::OnceLock<Arc<crate::supervise::Supervised>>,
}

/// How many finished pod UIDs a kubelet remembers.
const FINISHED_MEMORY: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Node object as the kubelet registers it (shape of a real v1 Node, e.g.
/// `prober/tests/fixtures/k8s-node-ready.json`).
pub fn node_object(cfg: &KubeletConfig) -> Value {
    let mut all = BTreeMap::new();
    all.insert("kubernetes.io/hostname".to_string(), cfg.node.clone());
    all.insert("kubernetes.io/os".to_string(), "linux".to_string());
    all.insert(
        "kubernetes.io/arch".to_string(),
        std::env::consts::ARCH
            .replace("x86_64", "amd64")
            .replace("aarch64", "arm64"),
    );
    all.insert("beta.kubernetes.io/os".to_string(), "linux".to_string());
    all.insert(
        "beta.kubernetes.io/arch".to_string(),
        all["kubernetes.io/arch"].clone(),
    );
    all.extend(cfg.node_labels.clone());
    let cidr = cfg.pod_cidr.clone();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": cfg.node, "labels": all },
        "spec": { "podCIDR": cidr, "podCIDRs": [cidr] },
        "status": node_status(cfg, &Value::Null),
    })
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The four node conditions the kubelet owns, healthy, with transition times kept from
/// `current` (a stored Node's `status.conditions`) where the status did not change.
pub(crate) fn node_conditions(current: &Value) -> Vec<Value> {
    let now = now_rfc3339();
    [
        (
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        (
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        (
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        (
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        ),
    ]
    .into_iter()
    .map(|(ty, status, reason, message)| {
        let old = current
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty));
        let transition = match old {
            Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
            _ => json!(now),
        };
        json!({ "type": ty, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": transition })
    })
    .collect()
}

/// The Node status the kubelet reports; conditions as [`node_conditions`].
fn node_status(cfg: &KubeletConfig, current_conditions: &Value) -> Value {
    json!({
        "addresses": [
            { "type": "InternalIP", "address": cfg.node_ip.to_string() },
            { "type": "Hostname", "address": cfg.node },
        ],
        "capacity": { "cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi" },
        "allocatable": { "cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi" },
        "conditions": node_conditions(current_conditions),
        "daemonEndpoints": { "kubeletEndpoint": { "Port": KUBELET_PORT } },
        "nodeInfo": {
            "kubeletVersion": "v1.32.4-testbed", "kubeProxyVersion": "",
            "osImage": "firstpacket testbed (network namespaces)",
            "kernelVersion": kernel_version(), "operatingSystem": "linux",
            "architecture": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
            "containerRuntimeVersion": "testbed://0.1.0",
            "machineID": "", "systemUUID": "", "bootID": "",
        },
    })
}

/// A stored condition list needs a fresh post: a kubelet-owned condition is unhealthy
/// or missing, or its heartbeat is older than [`NODE_STATUS_REPORT`].
fn node_conditions_stale(current: &Value) -> bool {
    let want = node_conditions(current);
    want.iter().any(|w| {
        let Some(c) = current
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == w["type"]))
        else {
            return true;
        };
        if c["status"] != w["status"] || c["reason"] != w["reason"] {
            return true;
        }
        let hb = c["lastHeartbeatTime"]
            .as_str()
            .and_then(|s| humantime::parse_rfc3339(s).ok());
        hb.is_none_or(|t| {
            SystemTime::now()
                .duration_since(t)
                .is_ok_and(|age| age >= NODE_STATUS_REPORT)
        })
    })
}

impl Kubelet {
    /// Resolves a pod's image (docs/design.md §6 pod-spec contract): an OCI image in
    /// the image dir (unpacked off the runtime's thread), else for a loopback registry
    /// the image pulled from it ([`crate::image::pull_and_unpack`]), else the bin-dir
    /// binary named like it. Errors: the message for `ErrImagePull` (no such image, or an image
    /// there that cannot be read).
    async fn resolve(&self, image: &str) -> Result<ResolvedImage, String> {
        let (dir, unpack, reference) = (
            self.cfg.image_dir.clone(),
            self.cfg.unpack_dir.clone(),
            image.to_owned(),
        );
        let found = tokio::task::spawn_blocking(move || {
            crate::image::find_and_unpack(&dir, &reference, &unpack)
        })
        .await
        .map_err(|e| format!("failed to pull and unpack image \"{image}\": {e}"))?
        .map_err(|e| format!("failed to pull and unpack image \"{image}\": {e}"))?;
        if let Some(img) = found {
            return Ok(ResolvedImage::Oci(img));
        }
        if crate::image::is_loopback_registry(image) {
            let (reference, unpack) = (image.to_owned(), self.cfg.unpack_dir.clone());
            return tokio::task::spawn_blocking(move || {
                crate::image::pull_and_unpack(&reference, &unpack)
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map(ResolvedImage::Oci)
            .map_err(|e| format!("failed to pull and unpack image \"{image}\": {e}"));
        }
        resolve_image(&self.cfg.bin_dir, image)
            .map(ResolvedImage::Binary)
            .ok_or_else(|| {
                format!(
                    "failed to pull and unpack image \"{image}\": not found (no OCI image with that reference in {} and no binary named like it in {})",
                    self.cfg.image_dir.display(),
                    self.cfg.bin_dir.display()
                )
            })
    }

    /// Builds the kubelet's API client (on the current runtime: call this on the node's
    /// runtime), registers the Node (or takes over an existing one), creates its Lease
    /// and records the `Starting`/`NodeReady` events, then starts the heartbeat. Call
    /// [`Kubelet::run`] next. Errors: client configuration, or the API refusing the
    /// Node.
    pub async fn start(
        cfg: KubeletConfig,
        endpoint: &ClusterEndpoint,
        dataplane: Arc<Dataplane>,
        agent: Arc<Agent>,
        truth: Truth,
    ) -> anyhow::Result<Arc<Kubelet>> {
        let api = endpoint.client().await?;
        let k = Arc::new(Kubelet {
            cfg,
            api,
            dataplane,
            agent,
            truth,
            workers: Mutex::new(HashMap::new()),
            writers: Mutex::new(HashMap::new()),
            paused: watch::channel(false).0,
            finished: Mutex::new(std::collections::VecDeque::new()),
            rt: tokio::runtime::Handle::current(),
            kube_proxy: std::sync::OnceLock::new(),
        });
        k.register_node().await?;
        k.renew_lease().await;
        k.record_node_events().await;
        tokio::spawn(k.clone().heartbeat_loop());
        Ok(k)
    }

    /// Replaces this node's calico-node pod as a DaemonSet rollout does (`testbed
    /// agent roll`), on the node's runtime: finds the pod (`k8s-app=calico-node` on
    /// this node, exactly one), deletes it gracefully (UID precondition) and waits
    /// until it is gone, creates a new one (`generateName: calico-node-`, container
    /// image `image`, otherwise the same spec), restarts the simulated agent's process
    /// ([`Agent::rolled`]; with a non-zero `down`, the agent is down from before the
    /// deletion until `down` after it, [`Agent::down_until`]: no endpoint of the node
    /// is programmed meanwhile), waits until the new pod is Running and Ready, and
    /// records `agent_rolled` in the truth log. Returns the new pod's (name, UID).
    ///
    /// Errors: the API refusing a step, no or several calico-node pods on the node, the
    /// old pod not gone or the new one not Ready within 60 s (each names the step).
    pub async fn roll_agent(
        self: &Arc<Self>,
        image: &str,
        down: Duration,
    ) -> anyhow::Result<(String, String)> {
        let me = self.clone();
        let image = image.to_owned();
        self.rt
            .spawn(async move { me.roll_agent_here(&image, down).await })
            .await
            .map_err(|e| anyhow::anyhow!("agent roll task: {e}"))?
    }

    async fn roll_agent_here(
        &self,
        image: &str,
        down: Duration,
    ) -> anyhow::Result<(String, String)> {
        use anyhow::{anyhow, bail, Context};
        let node = self.cfg.node.clone();
        let list_path = format!(
            "/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcalico-node&fieldSelector=spec.nodeName%3D{node}"
        );
        let list = self
            .api
            .get(&list_path)
            .await
            .map_err(|e| anyhow!("list calico-node pods on {node}: {e}"))?;
        let items: Vec<&Value> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        let old = match items.as_slice() {
            [one] => (*one).clone(),
            [] => bail!("no calico-node pod on {node}"),
            more => bail!("{} calico-node pods on {node}; expected one", more.len()),
        };
        let old_name = old["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let old_uid = old["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let old_image = old["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        // Real Felix: the image tag names the build the new pod runs; refuse before
        // touching anything when it is not built, and apply that version's CRDs first
        // (a release's manifests carry them; v3.31.7 has kinds v3.29.5 lacks).
        let real = self.agent.felix().cloned();
        let new_version = match &real {
            None => None,
            Some(f) => {
                let v = crate::calico::version_of_image(image).ok_or_else(|| {
                    anyhow!("image {image:?} is not a calico/node release image: real Felix rolls to docker.io/calico/node:vX.Y.Z (e.g. docker.io/calico/node:{})", crate::calico::DEFAULT_VERSION)
                })?;
                f.builds().felix(&v)?;
                if v != f.version() {
                    f.builds()
                        .apply_crds_once(&self.api, &v)
                        .await
                        .with_context(|| format!("apply Calico {v}'s CRDs"))?;
                }
                Some(v)
            }
        };
        // The old process stops with its pod; with `down`, the new one is serving only
        // `down` after the deletion (no endpoint programmed meanwhile).
        let down_until = tokio::time::Instant::now() + down;
        if let Some(f) = &real {
            f.stop().await;
        }
        let down_task = if down.is_zero() || real.is_some() {
            None
        } else {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let agent = self.agent.clone();
            let until = tokio::time::Instant::now() + down;
            let t = tokio::spawn(async move { agent.down_until(until, tx).await });
            let _ = rx.await;
            Some(t)
        };
        let old_path = core_path(Some("kube-system"), "pods", &old_name);
        let opts = json!({ "kind": "DeleteOptions", "apiVersion": "v1",
                           "preconditions": { "uid": old_uid } });
        self.api
            .delete(&old_path, &opts)
            .await
            .map_err(|e| anyhow!("delete pod kube-system/{old_name}: {e}"))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match self.api.get(&old_path).await {
                Err(e) if e.code == 404 => break,
                Ok(p) if p["metadata"]["uid"] != old_uid.as_str() => break,
                Err(e) if !e.is_transient() => {
                    bail!("wait for kube-system/{old_name} to go: {e}")
                }
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("pod kube-system/{old_name} still there 60 s after its deletion");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut pod = crate::daemon::calico_node_pod(&node, image);
        if let Some(m) = pod["metadata"].as_object_mut() {
            m.remove("name");
            m.insert("generateName".into(), json!("calico-node-"));
        }
        let created = self
            .api
            .post("/api/v1/namespaces/kube-system/pods", &pod)
            .await
            .map_err(|e| anyhow!("create the new calico-node pod on {node}: {e}"))?;
        let name = created["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let uid = created["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match (down_task, &real, &new_version) {
            (_, Some(f), Some(v)) => {
                tokio::time::sleep_until(down_until).await;
                f.start_version(v)
                    .await
                    .with_context(|| format!("start Felix {v} on {node}"))?;
            }
            (Some(t), _, _) => {
                let _ = t.await;
            }
            _ => self.agent.rolled(),
        }
        let path = core_path(Some("kube-system"), "pods", &name);
        loop {
            if let Ok(p) = self.api.get(&path).await {
                let ready = p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if p["status"]["phase"] == "Running" && ready {
                    break;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("new pod kube-system/{name} not Running and Ready within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.truth.emit(TruthEvent {
            namespace: Some("kube-system".into()),
            pod: Some(name.clone()),
            uid: Some(uid.clone()),
            ..TruthEvent::node(
                TruthKind::AgentRolled,
                &node,
                json!({ "image": image, "old_pod": old_name, "old_uid": old_uid, "old_image": old_image,
                        "down_seconds": down.as_secs_f64() }),
            )
        });
        Ok((name, uid))
    }

    /// The kubelet's API client (other node components of the same node share it).
    pub fn api(&self) -> &ApiClient {
        &self.api
    }

    /// The node's agent.
    pub fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }

    /// Real kube-proxy runs on this node: the kube-proxy pod's readiness, restarts and
    /// log are its. Once.
    pub fn set_kube_proxy(&self, kp: Arc<crate::supervise::Supervised>) {
        let _ = self.kube_proxy.set(kp);
    }

    /// The log file of a simulated agent pod's real process (`app` = `calico-node` with
    /// real Felix, `kube-proxy` with real kube-proxy), served as its container log.
    fn agent_log(&self, app: &str) -> Option<PathBuf> {
        match app {
            "calico-node" => self.agent.felix().map(|f| f.log_path()),
            "kube-proxy" => self.kube_proxy.get().and_then(|k| k.log_path()),
            _ => None,
        }
    }

    async fn register_node(&self) -> anyhow::Result<()> {
        let node = node_object(&self.cfg);
        let mut tries = 0;
        loop {
            match self.api.post("/api/v1/nodes", &node).await {
                Ok(_) => break,
                Err(e) if e.code == 409 => {
                    // Already registered (a restarted kubelet): take it over.
                    let patch = json!({ "metadata": { "labels": node["metadata"]["labels"] },
                                        "spec": node["spec"] });
                    self.api
                        .patch(
                            &core_path(None, "nodes", &self.cfg.node),
                            PatchKind::Merge,
                            &patch,
                        )
                        .await
                        .map_err(|e| anyhow::anyhow!("update Node {}: {e}", self.cfg.node))?;
                    break;
                }
                Err(e) if e.is_transient() && tries < 20 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => anyhow::bail!("register Node {}: {e}", self.cfg.node),
            }
        }
        // The status is the kubelet's to post (the API keeps a create's status, but a
        // taken-over Node's status is old).
        self.post_node_status(true).await;
        Ok(())
    }

    /// Posts the Node's conditions when `force` or when they are stale.
    async fn post_node_status(&self, force: bool) {
        let path = format!("{}/status", core_path(None, "nodes", &self.cfg.node));
        let current = match self
            .api
            .get(&core_path(None, "nodes", &self.cfg.node))
            .await
        {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(node = %self.cfg.node, error = %e, "node status: get");
                return;
            }
        };
        let conds = &current["status"]["conditions"];
        if !force && !node_conditions_stale(conds) {
            return;
        }
        let mut status = node_status(&self.cfg, conds);
        // Conditions others own (e.g. NetworkUnavailable) stay as they are.
        if let (Some(mine), Some(theirs)) = (status["conditions"].as_array_mut(), conds.as_array())
        {
            let owned: Vec<Value> = mine.iter().map(|c| c["type"].clone()).collect();
            mine.extend(
                theirs
                    .iter()
                    .filter(|c| !owned.contains(&c["type"]))
                    .cloned(),
            );
        }
        if let Err(e) = self
            .api
            .patch(&path, PatchKind::Merge, &json!({ "status": status }))
            .await
        {
            tracing::warn!(node = %self.cfg.node, error = %e, "node status not posted");
        }
    }

    /// Renews (or creates) the node's Lease in `kube-node-lease`.
    async fn renew_lease(&self) {
        let node = &self.cfg.node;
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}");
        let now = crate::client::now_micro();
        let spec = json!({ "holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now });
        match self
            .api
            .patch(&path, PatchKind::Merge, &json!({ "spec": spec }))
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == 404 => {
                let owner = match self.api.get(&core_path(None, "nodes", node)).await {
                    Ok(n) => json!([{ "apiVersion": "v1", "kind": "Node", "name": node,
                                      "uid": n["metadata"]["uid"] }]),
                    Err(_) => json!([]),
                };
                let lease = json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": { "name": node, "namespace": "kube-node-lease", "ownerReferences": owner },
                    "spec": spec,
                });
                if let Err(e) = self
                    .api
                    .post(
                        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                        &lease,
                    )
                    .await
                {
                    tracing::warn!(node = %node, error = %e, "create node lease");
                }
            }
            Err(e) => tracing::warn!(node = %node, error = %e, "renew node lease"),
        }
    }

    /// Every [`HEARTBEAT`] while not stopped, and at once when restarted: lease
    /// renewal and Node conditions.
    async fn heartbeat_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut paused = self.paused.subscribe();
        loop {
            // A restarted kubelet (`testbed node start`) heartbeats at once.
            tokio::select! {
                _ = tick.tick() => {}
                r = paused.changed() => {
                    if r.is_err() {
                        return;
                    }
                    if *paused.borrow_and_update() {
                        continue;
                    }
                    tick.reset();
                }
            }
            if self.is_paused() {
                continue;
            }
            self.renew_lease().await;
            self.post_node_status(false).await;
        }
    }

    /// The events a real kubelet records when it starts and its node turns Ready
    /// (`Starting`, `NodeReady`; core/v1 Events of cluster-scoped objects live in
    /// `default`), so `kubectl describe node` shows them.
    async fn record_node_events(&self) {
        let node = &self.cfg.node;
        let uid = self
            .api
            .get(&core_path(None, "nodes", node))
            .await
            .ok()
            .and_then(|n| n["metadata"]["uid"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let now = now_rfc3339();
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
            if let Err(e) = self
                .api
                .post("/api/v1/namespaces/default/events", &ev)
                .await
            {
                tracing::warn!(node = %node, error = %e, "record node event");
            }
        }
    }

    /// Stops (`true`) or restarts (`false`) this kubelet, as `testbed node stop|start`
    /// does: a stopped kubelet starts no pod, runs no probe and sends no heartbeat;
    /// containers keep running.
    pub fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// The node this kubelet runs.
    pub fn node(&self) -> &str {
        &self.cfg.node
    }

    /// Whether the kubelet is stopped.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Watches the pods bound to this node (`fieldSelector=spec.nodeName=<node>`) and
    /// drives each through its life. While stopped the watch is closed; on restart it
    /// re-lists. Runs until the daemon stops.
    pub async fn run(self: Arc<Self>) {
        use kube::runtime::watcher::{watcher, Config, Event};
        use kube::runtime::WatchStreamExt;
        let mut paused = self.paused.subscribe();
        let ar = kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
        loop {
            while *paused.borrow_and_update() {
                if paused.changed().await.is_err() {
                    return;
                }
            }
            // Back from a stop: the node controller may have marked the pods NotReady
            // meanwhile (kube-controller-manager's MarkPodsNotReady). As the real
            // kubelet's status manager re-syncs what it holds against the API server,
            // each pod's status is re-read and what differs from the wanted one is sent
            // again (a pod without a readiness probe has no probe loop to do it).
            let writers: Vec<Arc<StatusWriter>> = lock(&self.writers).values().cloned().collect();
            for w in writers {
                w.mark_stale();
                tokio::spawn(async move { w.flush().await });
            }
            let api = kube::Api::<kube::api::DynamicObject>::all_with(self.api.kube(), &ar);
            let cfg = Config::default().fields(&format!("spec.nodeName={}", self.cfg.node));
            let mut stream = watcher(api, cfg)
                .backoff(crate::client::QuickBackoff::default())
                .boxed();
            let mut init: Option<HashSet<String>> = None;
            loop {
                let ev = tokio::select! {
                    ev = stream.next() => ev,
                    _ = paused.changed() => break,
                };
                let to_value = |o: kube::api::DynamicObject| {
                    Arc::new(serde_json::to_value(o).unwrap_or_default())
                };
                match ev {
                    Some(Ok(Event::Apply(o))) => self.observe(to_value(o), false),
                    Some(Ok(Event::Delete(o))) => self.observe(to_value(o), true),
                    Some(Ok(Event::Init)) => init = Some(HashSet::new()),
                    Some(Ok(Event::InitApply(o))) => {
                        let v = to_value(o);
                        if let (Some(seen), Some(uid)) =
                            (init.as_mut(), v["metadata"]["uid"].as_str())
                        {
                            seen.insert(uid.to_owned());
                        }
                        self.observe(v, false);
                    }
                    Some(Ok(Event::InitDone)) => {
                        // Pods gone while the watch was down: stop their workers.
                        let seen = init.take().unwrap_or_default();
                        let gone: Vec<Arc<Value>> = lock(&self.workers)
                            .iter()
                            .filter(|(uid, _)| !seen.contains(*uid))
                            .map(|(_, tx)| tx.borrow().clone())
                            .collect();
                        for p in gone {
                            self.observe(p, true);
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(node = %self.cfg.node, error = %e, "kubelet pod watch");
                    }
                    None => return,
                }
            }
        }
    }

    /// Serves the kubelet API the API server calls for `kubectl logs`: HTTPS on
    /// `<node IP>:`[`KUBELET_PORT`] (bind on the node's runtime) with `cert_pem`/`key_pem`,
    /// `GET /containerLogs/{namespace}/{pod}/{container}` with `tailLines`, `follow`
    /// (streams until the container's pod worker ends), `limitBytes`; `timestamps` and
    /// `sinceSeconds` are accepted, but the log files carry no per-line times, so they
    /// change nothing. No authentication (the testbed's network is private). Errors:
    /// bad certificate, bind.
    pub async fn serve_api(
        self: Arc<Self>,
        cert_pem: String,
        key_pem: String,
    ) -> anyhow::Result<()> {
        use anyhow::Context as _;
        let tls = crate::tls::server_config(&cert_pem, &key_pem).context("kubelet API TLS")?;
        let addr = SocketAddr::from((self.cfg.node_ip, KUBELET_PORT));
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind the kubelet API on {addr}"))?;
        let app = axum::Router::new()
            .route(
                "/containerLogs/{namespace}/{pod}/{container}",
                axum::routing::get(container_logs),
            )
            .with_state(self.clone());
        crate::api::serve_router_tls(app, listener, tls)
            .await
            .with_context(|| format!("kubelet API on {addr}"))
    }

    /// The uid and latest object of the running pod `ns/name` on this node.
    fn find_pod(&self, ns: &str, name: &str) -> Option<(String, Arc<Value>)> {
        lock(&self.workers).iter().find_map(|(uid, tx)| {
            let p = tx.borrow().clone();
            (p["metadata"]["namespace"] == ns && p["metadata"]["name"] == name)
                .then(|| (uid.clone(), p))
        })
    }

    /// Stops every container on this node at once (SIGKILL) and tears down its pods'
    /// networks; used when the daemon shuts down.
    pub fn kill_all(&self) {
        let workers: Vec<String> = lock(&self.workers).keys().cloned().collect();
        for uid in workers {
            let pgid_file = self.cfg.pods_dir.join(&uid).join("pid");
            if let Ok(pid) = std::fs::read_to_string(&pgid_file) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }

    /// The final step of a pod's deletion: `DELETE` with `gracePeriodSeconds=0` and a
    /// UID precondition (a new pod of the same name answers 409 and stays). Retries
    /// until the object is gone (404) or has a new UID (409), as long as the kubelet
    /// runs: every 250 ms…2 s while the API does not answer, up to every 10 s while it
    /// refuses (warned once).
    async fn delete_final(&self, ns: &str, name: &str, uid: &str) {
        let path = core_path(Some(ns), "pods", name);
        let opts = json!({ "kind": "DeleteOptions", "apiVersion": "v1",
                           "gracePeriodSeconds": 0, "preconditions": { "uid": uid } });
        // The kubelet's status manager retries the final delete on every sync until the
        // object is gone (pkg/kubelet/status/status_manager.go): a refusal is retried
        // too, since right after a kube-apiserver restart its authorizers answer 403
        // for a moment (seen here: the RBAC grant of the node components' user).
        let mut wait = Duration::from_millis(250);
        let mut warned = false;
        loop {
            match self.api.delete(&path, &opts).await {
                Ok(_) => return,
                Err(e) if e.code == 404 || e.code == 409 => return,
                Err(e) => {
                    if e.is_transient() || warned {
                        tracing::debug!(pod = %name, error = %e, "final delete; retrying");
                    } else {
                        tracing::warn!(pod = %name, error = %e, "final delete refused; retrying");
                        warned = true;
                    }
                    tokio::time::sleep(wait).await;
                    let cap = if e.is_transient() { 2 } else { 10 };
                    wait = (wait * 2).min(Duration::from_secs(cap));
                }
            }
        }
    }

    /// The container's environment taken from ConfigMaps, as the real kubelet resolves
    /// it (Kubernetes docs, "Configure a Pod to Use a ConfigMap"): `envFrom[].configMapRef`
    /// (every key, with the entry's `prefix`, in list order) and
    /// `env[].valueFrom.configMapKeyRef` (by the env entry's name). A ConfigMap or key
    /// that does not exist is an error unless marked `optional: true`; missing
    /// ConfigMaps are re-read for ~10 s first (one applied in the same `kubectl apply` may
    /// land after the pod). Secrets are refused (this testbed has none to give).
    /// Errors: a message for `CreateContainerConfigError`.
    async fn config_map_env(&self, pod: &Value, container: &Value) -> Result<ConfigMapEnv, String> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut cache: HashMap<String, Option<serde_json::Map<String, Value>>> = HashMap::new();
        let mut out = ConfigMapEnv::default();
        for from in container["envFrom"].as_array().into_iter().flatten() {
            if from.get("secretRef").is_some() {
                return Err("envFrom secretRef: this testbed has no Secrets to give".into());
            }
            let Some(cm) = from.get("configMapRef") else {
                continue;
            };
            let name = cm["name"].as_str().unwrap_or_default();
            let optional = cm["optional"].as_bool().unwrap_or(false);
            let data = self
                .config_map_data(&mut cache, ns, name, optional, deadline)
                .await?;
            let prefix = from["prefix"].as_str().unwrap_or_default();
            for (k, v) in data.into_iter().flatten() {
                out.from.push((
                    format!("{prefix}{k}"),
                    v.as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        for e in container["env"].as_array().into_iter().flatten() {
            let Some(env_name) = e["name"].as_str() else {
                continue;
            };
            if e["valueFrom"].get("secretKeyRef").is_some() {
                return Err(format!(
                    "env {env_name}: secretKeyRef: this testbed has no Secrets to give"
                ));
            }
            let Some(r) = e["valueFrom"].get("configMapKeyRef") else {
                continue;
            };
            let name = r["name"].as_str().unwrap_or_default();
            let key = r["key"].as_str().unwrap_or_default();
            let optional = r["optional"].as_bool().unwrap_or(false);
            let data = self
                .config_map_data(&mut cache, ns, name, optional, deadline)
                .await?;
            match data.as_ref().and_then(|d| d.get(key)) {
                Some(v) => {
                    out.by_key_ref.insert(
                        env_name.to_owned(),
                        v.as_str().unwrap_or_default().to_owned(),
                    );
                }
                None if optional => {}
                None => return Err(format!("couldn't find key {key} in ConfigMap {ns}/{name}")),
            }
        }
        Ok(out)
    }

    /// The `data` of ConfigMap `ns/name` (from `cache` when read before, else from the
    /// API and kept in `cache`); `None` when it does not exist and `optional`. A missing
    /// (or unreachable) ConfigMap is re-read every 250 ms until `deadline`.
    async fn config_map_data(
        &self,
        cache: &mut HashMap<String, Option<serde_json::Map<String, Value>>>,
        ns: &str,
        name: &str,
        optional: bool,
        deadline: tokio::time::Instant,
    ) -> Result<Option<serde_json::Map<String, Value>>, String> {
        if let Some(d) = cache.get(name) {
            return Ok(d.clone());
        }
        let path = core_path(Some(ns), "configmaps", name);
        loop {
            match self.api.get(&path).await {
                Ok(o) => {
                    let d = Some(o["data"].as_object().cloned().unwrap_or_default());
                    cache.insert(name.to_owned(), d.clone());
                    return Ok(d);
                }
                Err(e) if e.code == 404 && optional => {
                    cache.insert(name.to_owned(), None);
                    return Ok(None);
                }
                Err(e)
                    if (e.code == 404 || e.is_transient())
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(250)).await
                }
                Err(e) if e.code == 404 => return Err(format!("configmap {name:?} not found")),
                Err(e) => return Err(format!("configmap {name:?}: {e}")),
            }
        }
    }

    /// Fills the pod's projected `kube-api-access-*` volume, if its first container
    /// mounts one at the service-account path, into `<pod_dir>/<volume>`: a
    /// TokenRequest token (`POST serviceaccounts/NAME/token`, bound to the pod), the
    /// items of the `kube-root-ca.crt` ConfigMap, downward-API items. Returns the
    /// directory (`None`: no such volume). Retries for ~10 s while the ServiceAccount or
    /// ConfigMap does not exist yet (their controllers create them with the namespace).
    /// Errors: a message for `CreateContainerConfigError`.
    async fn fill_api_access(
        &self,
        pod: &Value,
        pod_dir: &Path,
        pod_ip: &str,
    ) -> Result<Option<PathBuf>, String> {
        let Some(vol) = pod["spec"]["volumes"].as_array().and_then(|vs| {
            vs.iter().find(|v| {
                v["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kube-api-access-"))
                    && v["projected"].is_object()
            })
        }) else {
            return Ok(None);
        };
        let vname = vol["name"].as_str().unwrap_or_default();
        let mount = pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["name"] == vname))
            .and_then(|m| m["mountPath"].as_str());
        match mount.map(|m| m.trim_end_matches('/')) {
            None => return Ok(None),
            Some(m)
                if m == crate::api::SERVICE_ACCOUNT_MOUNT
                    || m == crate::shim::SERVICE_ACCOUNT_DIR => {}
            Some(m) => {
                return Err(format!(
                    "volume {vname}: mountPath {m}: this testbed mounts the API access volume only at {}",
                    crate::api::SERVICE_ACCOUNT_MOUNT
                ))
            }
        }
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let sa = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        let dir = pod_dir.join(vname);
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let write = |rel: &str, text: &str| -> Result<(), String> {
            if rel.is_empty() || rel.starts_with('/') || rel.split('/').any(|p| p == "..") {
                return Err(format!("volume {vname}: bad path {rel:?}"));
            }
            let p = dir.join(rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            std::fs::write(&p, text).map_err(|e| format!("write {}: {e}", p.display()))
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let retrying = |e: &ApiCallError| {
            (e.code == 404 || e.is_transient()) && tokio::time::Instant::now() < deadline
        };
        for src in vol["projected"]["sources"].as_array().into_iter().flatten() {
            if let Some(t) = src.get("serviceAccountToken").filter(|t| t.is_object()) {
                let mut spec = json!({
                    "expirationSeconds": t["expirationSeconds"].as_i64().unwrap_or(3607),
                    "boundObjectRef": { "apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"] },
                });
                if let Some(a) = t["audience"].as_str().filter(|a| !a.is_empty()) {
                    spec["audiences"] = json!([a]);
                }
                let req = json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec });
                let path = format!("{}/token", core_path(Some(ns), "serviceaccounts", sa));
                let answer = loop {
                    match self.api.post(&path, &req).await {
                        Ok(a) => break a,
                        Err(e) if retrying(&e) => {
                            tokio::time::sleep(Duration::from_millis(250)).await
                        }
                        Err(e) => {
                            return Err(format!(
                                "MountVolume.SetUp failed for volume {vname:?}: {e}"
                            ))
                        }
                    }
                };
                let token = answer["status"]["token"].as_str().unwrap_or_default();
                write(t["path"].as_str().unwrap_or("token"), token)?;
            } else if let Some(cm) = src.get("configMap").filter(|c| c.is_object()) {
                let cm_name = cm["name"].as_str().unwrap_or_default();
                let path = core_path(Some(ns), "configmaps", cm_name);
                let obj = loop {
                    match self.api.get(&path).await {
                        Ok(o) => break o,
                        Err(e) if retrying(&e) => {
                            tokio::time::sleep(Duration::from_millis(250)).await
                        }
                        Err(e) => {
                            return Err(format!(
                                "MountVolume.SetUp failed for volume {vname:?}: configmap {cm_name:?}: {e}"
                            ))
                        }
                    }
                };
                let data = obj["data"].as_object().cloned().unwrap_or_default();
                match cm["items"].as_array() {
                    Some(items) => {
                        for it in items {
                            let key = it["key"].as_str().unwrap_or_default();
                            let v = data.get(key).and_then(Value::as_str).unwrap_or_default();
                            write(it["path"].as_str().unwrap_or(key), v)?;
                        }
                    }
                    None => {
                        for (k, v) in &data {
                            write(k, v.as_str().unwrap_or_default())?;
                        }
                    }
                }
            } else if let Some(d) = src.get("downwardAPI").filter(|d| d.is_object()) {
                for it in d["items"].as_array().into_iter().flatten() {
                    let fp = it["fieldRef"]["fieldPath"].as_str().unwrap_or_default();
                    let v = downward_field(pod, fp, pod_ip, &self.cfg);
                    write(it["path"].as_str().unwrap_or_default(), &v)?;
                }
            }
        }
        Ok(Some(dir))
    }

    /// (Ready, restarts) of the simulated agent `app` of this node.
    fn simulated_state(&self, app: &str) -> (bool, u64) {
        match (app, self.kube_proxy.get()) {
            ("calico-node", _) => (self.agent.is_ready(), self.agent.restart_count()),
            ("kube-proxy", Some(kp)) => (kp.is_ready(), kp.restarts()),
            _ => (true, 0),
        }
    }

    fn observe(self: &Arc<Self>, pod: Arc<Value>, deleted: bool) {
        if pod["spec"]["nodeName"].as_str() != Some(self.cfg.node.as_str()) {
            return;
        }
        let Some(uid) = pod["metadata"]["uid"].as_str().map(str::to_owned) else {
            return;
        };
        if !deleted && pod["metadata"]["deletionTimestamp"].is_null() {
            let writer = lock(&self.writers).get(&uid).cloned();
            if let Some(w) = writer {
                w.reconcile(&pod["status"]);
            }
        }
        let mut workers = lock(&self.workers);
        if let Some(tx) = workers.get(&uid) {
            let mut obj = (*pod).clone();
            if deleted && obj["metadata"]["deletionTimestamp"].is_null() {
                // Removed without a graceful phase (force delete): stop now.
                obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            if deleted {
                obj["metadata"]["annotations"]["testbed.firstpacket.io/gone"] = json!("true");
            }
            let _ = tx.send(Arc::new(obj));
            return;
        }
        if deleted {
            return;
        }
        let already_finished = lock(&self.finished).iter().any(|u| u == &uid);
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
        if already_finished || !pod["metadata"]["deletionTimestamp"].is_null() {
            // A stale event for a pod this kubelet already finished, or a pod being
            // deleted that never started here: nothing to run.
            if !already_finished {
                let me = self.clone();
                tokio::spawn(async move { me.delete_final(&ns, &name, &uid).await });
            }
            return;
        }
        let (tx, rx) = watch::channel(pod.clone());
        workers.insert(uid.clone(), tx);
        drop(workers);
        let writer = Arc::new(StatusWriter {
            api: self.api.clone(),
            ns: ns.clone(),
            name: name.clone(),
            uid: uid.clone(),
            state: tokio::sync::Mutex::new(WriterState {
                acked: pod["status"].clone(),
                desired: pod["status"].clone(),
            }),
            stale: AtomicBool::new(false),
            retrying: AtomicBool::new(false),
            owns_ready: AtomicBool::new(false),
        });
        lock(&self.writers).insert(uid.clone(), writer.clone());
        let me = self.clone();
        let simulated = pod["metadata"]["annotations"][SIMULATED_ANNOTATION]
            .as_str()
            .map(str::to_owned);
        tokio::spawn(async move {
            let worker = PodWorker {
                k: me.clone(),
                ns,
                name,
                uid: uid.clone(),
                rx,
                status: writer,
            };
            match simulated {
                Some(app) => worker.run_simulated(&app).await,
                None => worker.run().await,
            }
            {
                let mut f = lock(&me.finished);
                if f.len() >= FINISHED_MEMORY {
                    f.pop_front();
                }
                f.push_back(uid.clone());
            }
            lock(&me.workers).remove(&uid);
            lock(&me.writers).remove(&uid);
        });
    }
}

struct WriterState {
    /// The status as the API server last confirmed it (after our last patch).
    acked: Value,
    /// The status as the kubelet wants it.
    desired: Value,
}

/// Writes one pod's status through `pods/NAME/status`: each change is sent as the
/// merge patch from the last confirmed status to the wanted one, with `metadata.uid`
/// (the server refuses it for another pod of the same name). A refused patch (e.g. 403)
/// is sent again with the next change; when the API does not answer, it is retried
/// every second.
struct StatusWriter {
    api: ApiClient,
    ns: String,
    name: String,
    uid: String,
    state: tokio::sync::Mutex<WriterState>,
    /// Someone else may have changed the status (the kubelet was stopped): re-read it
    /// before the next write.
    stale: AtomicBool,
    retrying: AtomicBool,
    /// The pod has no readiness probe: its Ready condition follows the container alone,
    /// so a Ready someone else changed is this kubelet's to put back.
    owns_ready: AtomicBool,
}

impl StatusWriter {
    fn mark_stale(&self) {
        self.stale.store(true, Ordering::SeqCst);
    }

    /// Re-reads the stored status when stale; returns it then (`None` otherwise or on
    /// error). Unsent changes stay wanted.
    async fn resync(&self, st: &mut WriterState) -> Option<Value> {
        if !self.stale.swap(false, Ordering::SeqCst) {
            return None;
        }
        match self
            .api
            .get(&core_path(Some(&self.ns), "pods", &self.name))
            .await
        {
            Ok(p) if p["metadata"]["uid"].as_str() == Some(self.uid.as_str()) => {
                let server = p["status"].clone();
                if st.acked == st.desired {
                    let mine = std::mem::replace(&mut st.desired, server.clone());
                    if self.owns_ready.load(Ordering::SeqCst) {
                        // No readiness probe: readiness is the container's own state,
                        // which only this kubelet knows; what the node controller wrote
                        // meanwhile is put right (the real kubelet's status manager
                        // does the same on its next sync).
                        keep_readiness(&mut st.desired, &mine);
                    }
                }
                st.acked = server.clone();
                Some(server)
            }
            Ok(_) => None,
            Err(e) => {
                if e.is_transient() {
                    self.mark_stale();
                }
                None
            }
        }
    }

    /// After a stop: the stored status when someone else may have changed it.
    async fn resync_now(&self) -> Option<Value> {
        let mut st = self.state.lock().await;
        self.resync(&mut st).await
    }

    /// Applies `f` to the wanted status and sends what changed.
    async fn update(self: &Arc<Self>, f: impl FnOnce(&mut Value)) {
        {
            let mut st = self.state.lock().await;
            if !st.desired.is_object() {
                st.desired = json!({});
            }
            f(&mut st.desired);
        }
        self.flush().await;
    }

    async fn flush(self: &Arc<Self>) {
        let mut st = self.state.lock().await;
        self.resync(&mut st).await;
        let acked = if st.acked.is_object() {
            st.acked.clone()
        } else {
            json!({})
        };
        let Some(diff) = merge_diff(&acked, &st.desired) else {
            return;
        };
        let path = format!("{}/status", core_path(Some(&self.ns), "pods", &self.name));
        let body = json!({ "metadata": { "uid": self.uid }, "status": diff });
        match self.api.patch(&path, PatchKind::Merge, &body).await {
            Ok(_) => st.acked = st.desired.clone(),
            Err(e) if e.code == 404 || e.code == 409 => {
                tracing::debug!(pod = %self.name, error = %e, "status update skipped: pod gone");
            }
            Err(e) if e.is_transient() => {
                tracing::debug!(pod = %self.name, error = %e, "status update failed; retrying");
                self.retry_after(Duration::from_secs(1));
            }
            Err(e) => {
                // Refused (e.g. 403): the real kubelet's status manager re-syncs
                // periodically; so does this one.
                tracing::warn!(pod = %self.name, error = %e, "status update refused");
                self.retry_after(STATUS_RESYNC);
            }
        }
    }

    /// A watch event showed the pod's stored `status`: when its Ready condition is not
    /// the wanted True (the node controller marked the pod not Ready while the node was
    /// unreachable, and again for each pod update while the Node is not yet Ready), the
    /// stored status is re-read and the wanted one sent again after
    /// [`STATUS_RECONCILE_DELAY`], as the real kubelet's status manager reconciles the
    /// API server's copy with its own (`syncBatch`, every 10 s). Only Ready is compared:
    /// other fields the server fills in differ by design.
    fn reconcile(self: &Arc<Self>, stored: &Value) {
        let ready_of = |status: &Value| {
            status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .and_then(|c| c["status"].as_str())
                .map(str::to_owned)
        };
        let got = ready_of(stored);
        let me = self.clone();
        tokio::spawn(async move {
            let want = ready_of(&me.state.lock().await.desired);
            if want.as_deref() == Some("True") && got.is_some() && got != want {
                me.mark_stale();
                me.retry_after(STATUS_RECONCILE_DELAY);
            }
        });
    }

    /// Sends the unsent changes again after `d` (one retry pending at a time).
    fn retry_after(self: &Arc<Self>, d: Duration) {
        if self.retrying.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            me.retrying.store(false, Ordering::SeqCst);
            Box::pin(me.flush()).await;
        });
    }
}

/// Copies the readiness a kubelet decides (the `Ready` and `ContainersReady` conditions,
/// each container status's `ready`) from `mine` into `status`.
fn keep_readiness(status: &mut Value, mine: &Value) {
    for t in ["Ready", "ContainersReady"] {
        let find = |v: &Value| {
            v["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == t).cloned())
        };
        if let Some(c) = find(mine) {
            if let Some(conds) = status["conditions"].as_array_mut() {
                match conds.iter_mut().find(|x| x["type"] == t) {
                    Some(x) => *x = c,
                    None => conds.push(c),
                }
            }
        }
    }
    if let (Some(theirs), Some(ours)) = (
        status["containerStatuses"].as_array_mut(),
        mine["containerStatuses"].as_array(),
    ) {
        for cs in theirs {
            if let Some(o) = ours.iter().find(|o| o["name"] == cs["name"]) {
                cs["ready"] = o["ready"].clone();
            }
        }
    }
}

/// Drives one pod from bound to removed.
struct PodWorker {
    k: Arc<Kubelet>,
    ns: String,
    name: String,
    uid: String,
    rx: watch::Receiver<Arc<Value>>,
    status: Arc<StatusWriter>,
}

/// How the container ended.
enum Ended {
    Exited(i32),
    Deleted,
    DeadlineExceeded,
}

impl PodWorker {
    fn pod(&self) -> Arc<Value> {
        self.rx.borrow().clone()
    }

    fn deletion_requested(&self) -> Option<i64> {
        let p = self.pod();
        if p["metadata"]["deletionTimestamp"].is_null() {
            None
        } else {
            Some(
                p["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(DEFAULT_GRACE_SECONDS),
            )
        }
    }

    /// Applies `f` to the pod's status and writes what changed ([`StatusWriter`]).
    async fn update(&self, f: impl FnOnce(&mut Value)) {
        self.status.update(f).await
    }

    /// Waits (up to 60 s) until no other worker on this node runs a pod of the same
    /// namespace and name (an earlier incarnation still stopping its container).
    async fn wait_for_namesake(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let busy = lock(&self.k.workers).iter().any(|(uid, tx)| {
                let p = tx.borrow();
                *uid != self.uid
                    && p["metadata"]["namespace"] == self.ns.as_str()
                    && p["metadata"]["name"] == self.name.as_str()
            });
            if !busy || tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the pod is gone from the API (not only being deleted).
    fn gone(&self) -> bool {
        !self.pod()["metadata"]["annotations"]["testbed.firstpacket.io/gone"].is_null()
    }

    /// A simulated agent pod (no process): Running on the node's IP (hostNetwork),
    /// Ready and `restartCount` as the node's simulated `app` says, checked every
    /// second while the kubelet runs; a deletion ends at once (no container to stop).
    async fn run_simulated(mut self, app: &str) {
        let pod = self.pod();
        let container = pod["spec"]["containers"][0]["name"]
            .as_str()
            .unwrap_or(app)
            .to_owned();
        let image = pod["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let ip = self.k.cfg.node_ip.to_string();
        let started = now_rfc3339();
        // A real agent's log is this pod's container log (`kubectl logs`).
        let log_dir = self.k.cfg.pods_dir.join(&self.uid);
        if let Some(real_log) = self.k.agent_log(app) {
            let _ = std::fs::create_dir_all(&log_dir);
            let link = log_dir.join("container.log");
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink(&real_log, &link) {
                tracing::warn!(pod = %self.name, error = %e, "link the agent's log");
            }
        }
        // The pod's restartCount counts the agent's restarts since this pod started (a
        // pod that replaced another, `testbed agent roll`, starts from 0).
        let base = self.k.simulated_state(app).1;
        let mut last_restarts: Option<(u64, String)> = None;
        loop {
            if self.gone() {
                let _ = std::fs::remove_dir_all(&log_dir);
                return;
            }
            if self.deletion_requested().is_some() {
                self.k.delete_final(&self.ns, &self.name, &self.uid).await;
                let _ = std::fs::remove_dir_all(&log_dir);
                return;
            }
            if !self.k.is_paused() {
                let (ready, total) = self.k.simulated_state(app);
                let restarts = total.saturating_sub(base);
                let since = match &last_restarts {
                    Some((n, t)) if *n == restarts => t.clone(),
                    _ => {
                        let t = if last_restarts.is_none() {
                            started.clone()
                        } else {
                            now_rfc3339()
                        };
                        last_restarts = Some((restarts, t.clone()));
                        t
                    }
                };
                let (ip, started, container, image, uid) = (
                    ip.clone(),
                    started.clone(),
                    container.clone(),
                    image.clone(),
                    self.uid.clone(),
                );
                self.update(move |st| {
                    st["phase"] = json!("Running");
                    st["podIP"] = json!(ip);
                    st["podIPs"] = json!([{ "ip": ip }]);
                    st["hostIP"] = json!(ip);
                    st["hostIPs"] = json!([{ "ip": ip }]);
                    st["startTime"] = json!(started);
                    if st["qosClass"].is_null() {
                        // The API server sets it at creation (immutable afterwards).
                        if st["qosClass"].is_null() {
                            // The API server sets it at creation (immutable afterwards).
                            st["qosClass"] = json!("BestEffort");
                        }
                    }
                    set_condition(st, "PodReadyToStartContainers", true, None, None);
                    set_condition(st, "Initialized", true, None, None);
                    let (r, m) = if ready {
                        (None, None)
                    } else {
                        (
                            Some("ContainersNotReady"),
                            Some(format!("containers with unready status: [{container}]")),
                        )
                    };
                    set_condition(st, "ContainersReady", ready, r, m.clone());
                    set_condition(st, "Ready", ready, r, m);
                    st["containerStatuses"] = json!([{
                        "name": container, "image": image, "imageID": "",
                        "containerID": format!("testbed://{container}-{uid}-{restarts}"), "ready": ready,
                        "started": true, "restartCount": restarts,
                        "state": { "running": { "startedAt": since } },
                    }]);
                })
                .await;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                r = self.rx.changed() => if r.is_err() { return },
            }
        }
    }

    async fn run(mut self) {
        let pod = self.pod();
        let spec = pod["spec"].clone();
        let container = spec["containers"][0].clone();
        let cname = container["name"].as_str().unwrap_or("main").to_owned();
        let image = container["image"].as_str().unwrap_or("").to_owned();
        let start_time = now_rfc3339();
        let node_ip = self.k.cfg.node_ip.to_string();
        self.update(|st| {
            st["phase"] = json!("Pending");
            st["hostIP"] = json!(node_ip);
            st["hostIPs"] = json!([{ "ip": node_ip }]);
            st["startTime"] = json!(start_time);
            if st["qosClass"].is_null() {
                // The API server sets it at creation (immutable afterwards).
                st["qosClass"] = json!("BestEffort");
            }
            set_condition(st, "PodReadyToStartContainers", false, None, None);
            set_condition(st, "Initialized", true, None, None);
            set_condition(
                st,
                "Ready",
                false,
                Some("ContainersNotReady"),
                Some(format!("containers with unready status: [{cname}]")),
            );
            set_condition(
                st,
                "ContainersReady",
                false,
                Some("ContainersNotReady"),
                Some(format!("containers with unready status: [{cname}]")),
            );
            st["containerStatuses"] =
                json!([waiting_status(&cname, &image, "ContainerCreating", None)]);
        })
        .await;

        // Image → an OCI image in the image dir, else a local binary (pod-spec contract).
        let resolved = match self.k.resolve(&image).await {
            Ok(r) => r,
            Err(msg) => {
                tracing::warn!(pod = %self.name, "{msg}");
                self.fail_waiting(&cname, &image, "ErrImagePull", &msg, None, None)
                    .await;
                return;
            }
        };
        let image_id = resolved.image_id(&image);

        // A pod of the same name still being torn down here (force-deleted, then
        // recreated) holds the sandbox name and interface: wait for it first.
        self.wait_for_namesake().await;

        // Sandbox network (CNI ADD) and the agent's view of the new endpoint.
        let net = match self
            .k
            .dataplane
            .add_pod(&self.k.cfg.node, &self.ns, &self.name, &self.uid)
        {
            Ok(n) => n,
            Err(e) => {
                let msg = format!("failed to create pod sandbox: {e}");
                tracing::warn!(pod = %self.name, "{msg}");
                self.fail_waiting(&cname, &image, "CreateContainerError", &msg, None, None)
                    .await;
                return;
            }
        };
        self.k.agent.endpoint_added(&net);
        let pod_ip = net.ip.to_string();

        // Container, restarted per restartPolicy (Always; OnFailure on a non-zero exit)
        // with the kubelet's back-off: 10 s doubling up to 5 min (Kubernetes docs, "Pod
        // Lifecycle", container restart policy).
        let pod_dir = self.k.cfg.pods_dir.join(&self.uid);
        // The projected `kube-api-access-*` volume (ServiceAccount admission adds it), then
        // the process identity (runAsUser/runAsGroup, capabilities, no_new_privs), where
        // `runAsNonRoot` against the image's user (root for bin-dir binaries) is checked,
        // as the real kubelet does when it generates the container config. Either
        // failing is a `CreateContainerConfigError`.
        let prepared = match self.k.fill_api_access(&pod, &pod_dir, &pod_ip).await {
            Ok(dir) => crate::security::container_identity(&pod, &container, &resolved.user())
                .map(|id| (dir, id)),
            Err(msg) => Err(msg),
        };
        let prepared = match prepared {
            Ok((dir, id)) => self
                .k
                .config_map_env(&pod, &container)
                .await
                .map(|env| (dir, id, env)),
            Err(msg) => Err(msg),
        };
        let (api_access, identity, cm_env) = match prepared {
            Ok(v) => v,
            Err(msg) => {
                tracing::warn!(pod = %self.name, "{msg}");
                self.fail_waiting(
                    &cname,
                    &image,
                    "CreateContainerConfigError",
                    &msg,
                    Some(&pod_ip),
                    Some(&net),
                )
                .await;
                return;
            }
        };
        let mut restarts: u64 = 0;
        let mut last_state = json!({});
        let ended = loop {
            let (child, run_detail, exec_read) = match self.start_container(
                &pod,
                &container,
                &image,
                &resolved,
                &net,
                &pod_dir,
                api_access.as_deref(),
                &identity,
                &cm_env,
            ) {
                Ok(c) => c,
                Err(msg) => {
                    tracing::warn!(pod = %self.name, "{msg}");
                    self.fail_waiting(
                        &cname,
                        &image,
                        "CreateContainerError",
                        &msg,
                        Some(&pod_ip),
                        Some(&net),
                    )
                    .await;
                    return;
                }
            };
            let pid = child.id().unwrap_or(0) as i32;
            let _ = std::fs::write(pod_dir.join("pid"), pid.to_string());
            // Until the shim has exec'ed the image's binary (EOF on the pipe; a few ms,
            // bounded: the shim exits on any error). It wrote the exec's wall time
            // first: the stamp does not depend on how soon this task runs again.
            let exec_at = tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut f = std::fs::File::from(exec_read);
                let mut text = String::new();
                let _ = f.read_to_string(&mut text);
                text.trim().parse::<f64>().ok()
            })
            .await
            .ok()
            .flatten();
            if restarts == 0 {
                // The programming wait of a pod is measured from here
                // (docs/design.md §6: endpoint_programmed − container_started).
                let ev = TruthEvent::pod(
                    TruthKind::ContainerStarted,
                    &net,
                    json!({ "container": cname, "pid": pid }),
                );
                self.k.truth.emit_at(ev, exec_at);
            }
            let started_at = now_rfc3339();
            let container_id = format!("testbed://{}-{pid}", self.uid);
            let has_readiness = container["readinessProbe"].is_object();
            {
                let (cname, image, cid, sa, pod_ip, iid) = (
                    cname.clone(),
                    image.clone(),
                    container_id.clone(),
                    started_at.clone(),
                    pod_ip.clone(),
                    image_id.clone(),
                );
                let pod_ips = pod_ips_status(&net);
                let last_state_now = last_state.clone();
                self.update(move |st| {
                    st["phase"] = json!("Running");
                    st["podIP"] = json!(pod_ip);
                    st["podIPs"] = pod_ips;
                    set_condition(st, "PodReadyToStartContainers", true, None, None);
                    st["containerStatuses"] = json!([{
                        "name": cname, "image": image, "imageID": iid,
                        "containerID": cid, "ready": !has_readiness, "started": true,
                        "restartCount": restarts, "state": { "running": { "startedAt": sa } },
                        "lastState": last_state_now,
                    }]);
                    if !has_readiness {
                        set_condition(st, "Ready", true, None, None);
                        set_condition(st, "ContainersReady", true, None, None);
                    }
                })
                .await;
            }
            if !has_readiness {
                self.status.owns_ready.store(true, Ordering::SeqCst);
                self.readiness_ok(&net, &run_detail);
            }

            // Readiness prober (runs on this node's runtime: packets leave the node netns).
            let (stop_probe, stop_rx) = watch::channel(false);
            let probe_task = if has_readiness {
                Some(tokio::spawn(readiness_loop(
                    self.k.clone(),
                    self.name.clone(),
                    self.status.clone(),
                    container["readinessProbe"].clone(),
                    net.clone(),
                    run_detail.clone(),
                    stop_rx,
                )))
            } else {
                None
            };

            let ended = self.wait_container(child, pid, &spec).await;
            let _ = stop_probe.send(true);
            if let Some(t) = probe_task {
                let _ = t.await;
            }
            let finished_at = now_rfc3339();
            let policy = container["terminationMessagePolicy"]
                .as_str()
                .unwrap_or("File")
                .to_owned();
            let (exit_code, reason) = match &ended {
                Ended::Exited(c) => (*c, if *c == 0 { "Completed" } else { "Error" }),
                Ended::Deleted => (137, "Error"),
                Ended::DeadlineExceeded => (137, "Error"),
            };
            let message = termination_message(&pod_dir, exit_code, &policy);
            let restart_policy = spec["restartPolicy"]
                .as_str()
                .unwrap_or("Always")
                .to_owned();
            let restart = matches!(ended, Ended::Exited(_))
                && (restart_policy == "Always"
                    || (restart_policy == "OnFailure" && exit_code != 0));
            if restart {
                let backoff = Duration::from_secs((10u64 << restarts.min(5)).min(300));
                let term = json!({
                    "exitCode": exit_code, "reason": reason, "message": message,
                    "startedAt": started_at, "finishedAt": finished_at, "containerID": container_id,
                });
                restarts += 1;
                last_state = json!({ "terminated": term });
                let (cname, image, ls, n, iid) = (
                    cname.clone(),
                    image.clone(),
                    last_state.clone(),
                    restarts,
                    image_id.clone(),
                );
                let wait_msg = format!(
                    "back-off {}s restarting failed container={cname} pod={}_{}({})",
                    backoff.as_secs(),
                    self.name,
                    self.ns,
                    self.uid
                );
                self.update(move |st| {
                st["containerStatuses"] = json!([{
                    "name": cname, "image": image, "imageID": iid,
                    "ready": false, "started": false, "restartCount": n,
                    "state": { "waiting": { "reason": "CrashLoopBackOff", "message": wait_msg } },
                    "lastState": ls,
                }]);
                set_condition(st, "Ready", false, Some("ContainersNotReady"), None);
                set_condition(st, "ContainersReady", false, Some("ContainersNotReady"), None);
            }).await;
                if self.sleep_unless_deleted(backoff).await {
                    self.finish(Some(&net)).await;
                    return;
                }
                continue;
            }
            {
                let (cname, image, cid, iid) = (
                    cname.clone(),
                    image.clone(),
                    container_id.clone(),
                    image_id.clone(),
                );
                let deadline = matches!(ended, Ended::DeadlineExceeded);
                self.update(move |st| {
                    let mut term = json!({
                        "exitCode": exit_code, "reason": reason,
                        "startedAt": started_at, "finishedAt": finished_at, "containerID": cid,
                    });
                    if let Some(m) = message {
                        term["message"] = json!(m);
                    }
                    st["containerStatuses"] = json!([{
                        "name": cname, "image": image, "imageID": iid,
                        "containerID": cid, "ready": false, "started": false,
                        "restartCount": restarts, "state": { "terminated": term },
                    }]);
                    set_condition(st, "Ready", false, Some("PodCompleted"), None);
                    set_condition(st, "ContainersReady", false, Some("PodCompleted"), None);
                    set_condition(st, "PodReadyToStartContainers", false, None, None);
                    if deadline {
                        st["phase"] = json!("Failed");
                        st["reason"] = json!("DeadlineExceeded");
                        st["message"] =
                            json!("Pod was active on the node longer than the specified deadline");
                    } else if exit_code == 0 {
                        st["phase"] = json!("Succeeded");
                    } else {
                        st["phase"] = json!("Failed");
                    }
                })
                .await;
            }
            break ended;
        };
        // Fault `teardown_delay`: a slow CNI DEL / runtime keeps a deleted pod's sandbox
        // (and so the API object, whose final delete waits for it) a while longer.
        if matches!(ended, Ended::Deleted) {
            let d = self.k.agent.teardown_delay();
            if !d.is_zero() {
                tracing::debug!(pod = %self.name, delay = ?d, "teardown_delay");
                tokio::time::sleep(d).await;
            }
        }
        // Terminal pods give their sandbox back (CNI DEL) but stay in the API until deleted.
        self.k.agent.endpoint_removed(&net);
        if let Err(e) = self.k.dataplane.remove_pod(&net) {
            tracing::warn!(pod = %self.name, error = %e, "sandbox teardown failed");
        }
        if !matches!(ended, Ended::Deleted) {
            self.wait_for_deletion_only().await;
        }
        self.finish(None).await;
    }

    /// A pod without a readiness probe is Ready once started: arm the agent's
    /// `first_connections_dropped` budget (it counts from readiness_ok), then record it.
    fn readiness_ok(&self, net: &PodNet, run: &Value) {
        let armed = self.k.agent.arm_first_connections_dropped(net);
        self.k.truth.emit(TruthEvent::pod(
            TruthKind::ReadinessOk,
            net,
            readiness_ok_detail(armed, run),
        ));
    }

    /// Starts the container through the shim; returns the child and what it runs (the
    /// truth detail of its `readiness_ok`: `image_id`; with fault `clock_skew` also
    /// `clock_skew` and `program`), or a message for `CreateContainerError`.
    ///
    /// Fault `clock_skew` ([`crate::fault::ClockSkew`]): libfaketime's variables, and
    /// the shim offsets the pod's monotonic clocks in a time namespace; a statically
    /// linked program (libfaketime cannot reach it) is replaced by the dynamically
    /// linked build of the same name in the bin dir, and without one (or without
    /// libfaketime) the container does not start.
    #[allow(clippy::too_many_arguments)]
    fn start_container(
        &self,
        pod: &Value,
        container: &Value,
        image: &str,
        resolved: &ResolvedImage,
        net: &PodNet,
        pod_dir: &Path,
        api_access: Option<&Path>,
        identity: &crate::security::Identity,
        cm_env: &ConfigMapEnv,
    ) -> Result<(tokio::process::Child, Value, std::os::fd::OwnedFd), String> {
        let strings = |v: &Value| -> Option<Vec<String>> {
            v.as_array().map(|a| {
                a.iter()
                    .map(|x| x.as_str().unwrap_or_default().to_owned())
                    .collect()
            })
        };
        let (mut program, argv, image_env) = match resolved {
            ResolvedImage::Oci(img) => {
                let (p, a) = crate::image::process_for(
                    img,
                    strings(&container["command"]),
                    strings(&container["args"]),
                )?;
                (p, a, img.env.clone())
            }
            ResolvedImage::Binary(b) => (
                b.clone(),
                strings(&container["args"]).unwrap_or_default(),
                Vec::new(),
            ),
        };
        // An OCI image's program runs inside its root file system (chroot).
        let mut rootfs = match resolved {
            ResolvedImage::Oci(img) => Some(img.rootfs.clone()),
            ResolvedImage::Binary(_) => None,
        };
        let mut run = json!({ "image_id": resolved.image_id(image) });
        let skew = self.k.agent.clock_skew();
        if let Some(skew) = &skew {
            if !Path::new(crate::fault::LIBFAKETIME_PATH).exists() {
                return Err(format!(
                    "clock_skew: libfaketime is not installed at {} (apt-get install libfaketime)",
                    crate::fault::LIBFAKETIME_PATH
                ));
            }
            if crate::image::is_static_elf(&program) {
                let bin_dir = &self.k.cfg.bin_dir;
                match resolve_image(bin_dir, image).filter(|b| !crate::image::is_static_elf(b)) {
                    Some(b) => {
                        // A dynamically linked build needs the host's libraries.
                        program = b;
                        rootfs = None;
                    }
                    None => {
                        return Err(format!(
                            "clock_skew: {} is statically linked, so libfaketime (LD_PRELOAD) cannot shift its wall clock, and {} has no dynamically linked build of it",
                            program.display(),
                            bin_dir.display()
                        ))
                    }
                }
            }
            run["clock_skew"] = json!(skew);
            run["program"] = json!(program.display().to_string());
        }
        let dev_dir = pod_dir.join("dev");
        std::fs::create_dir_all(&dev_dir)
            .map_err(|e| format!("mkdir {}: {e}", dev_dir.display()))?;
        let tm_path = container["terminationMessagePath"]
            .as_str()
            .unwrap_or("/dev/termination-log");
        let Some(tm_name) = tm_path.strip_prefix("/dev/").filter(|n| !n.contains('/')) else {
            return Err(format!(
                "terminationMessagePath {tm_path}: this testbed supports only files directly under /dev"
            ));
        };
        let tm_file = dev_dir.join(tm_name);
        std::fs::write(&tm_file, b"").map_err(|e| e.to_string())?;
        // Writable by whatever user the container runs as (the real kubelet creates
        // the termination-message file 0666).
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tm_file, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| format!("chmod {}: {e}", tm_file.display()))?;
        }
        let _ = std::fs::write(pod_dir.join("termination-path"), tm_name);
        let log_path = pod_dir.join("container.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("open {}: {e}", log_path.display()))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;

        let mut cmd = tokio::process::Command::new(&self.k.cfg.testbed_exe);
        cmd.arg("shim")
            .arg("--exec-fd")
            .arg(SHIM_EXEC_FD.to_string())
            .arg("--netns")
            .arg(&net.netns)
            .arg("--dev-dir")
            .arg(&dev_dir)
            .arg("--hostname")
            .arg(&self.name);
        if let Some(dir) = api_access {
            cmd.arg("--sa-dir").arg(dir);
        } else if pod["spec"]["automountServiceAccountToken"] != false {
            // No API access volume (a pod created before admission added one): the
            // placeholder token and the CA file.
            let sa = pod_dir.join("serviceaccount");
            std::fs::create_dir_all(&sa).map_err(|e| format!("mkdir {}: {e}", sa.display()))?;
            if let Some(ca) = &self.k.cfg.ca_cert {
                std::fs::copy(ca, sa.join("ca.crt"))
                    .map_err(|e| format!("copy {}: {e}", ca.display()))?;
            }
            std::fs::write(sa.join("token"), SERVICE_ACCOUNT_TOKEN).map_err(|e| e.to_string())?;
            std::fs::write(sa.join("namespace"), &self.ns).map_err(|e| e.to_string())?;
            cmd.arg("--sa-dir").arg(&sa);
        }
        cmd.args(identity.to_args());
        if let Some(skew) = &skew {
            cmd.arg("--clock-offset").arg(skew.seconds.to_string());
        }
        match rootfs
            .as_ref()
            .and_then(|r| program.strip_prefix(r).ok().map(|p| (r, p)))
        {
            Some((root, inside)) => {
                cmd.arg("--rootfs").arg(root);
                cmd.arg("--").arg(Path::new("/").join(inside));
            }
            None => {
                cmd.arg("--").arg(&program);
            }
        }
        cmd.args(&argv);
        cmd.env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin");
        // The image's environment, then the kubelet's and the container's (which win).
        for kv in &image_env {
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
        cmd.env("HOSTNAME", &self.name)
            .env("KUBERNETES_SERVICE_HOST", &self.k.cfg.api_host)
            .env("KUBERNETES_SERVICE_PORT", self.k.cfg.api_port.to_string())
            .env(
                "KUBERNETES_SERVICE_PORT_HTTPS",
                self.k.cfg.api_port.to_string(),
            );
        if let Ok(v) = std::env::var("RUST_LOG") {
            cmd.env("RUST_LOG", v);
        }
        // Fault `clock_skew`: libfaketime's variables.
        for (k, v) in skew.iter().flat_map(|s| s.faketime_env()) {
            cmd.env(k, v);
        }
        // envFrom first, `env` entries override it (as the real kubelet orders them).
        for (k, v) in &cm_env.from {
            cmd.env(k, v);
        }
        if let Some(envs) = container["env"].as_array() {
            for e in envs {
                let Some(name) = e["name"].as_str() else {
                    continue;
                };
                let value = if let Some(v) = e["value"].as_str() {
                    v.to_owned()
                } else if let Some(fp) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    downward_field(pod, fp, &net.ip.to_string(), &self.k.cfg)
                } else if e["valueFrom"].get("configMapKeyRef").is_some() {
                    match cm_env.by_key_ref.get(name) {
                        Some(v) => v.clone(),
                        // optional and missing: the variable is not set at all
                        None => continue,
                    }
                } else {
                    String::new()
                };
                cmd.env(name, value);
            }
        }
        cmd.stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .kill_on_drop(false);
        // The container's process starts when the shim `execve`s the image's binary
        // (after its namespaces and mounts): the shim marks fd 3 close-on-exec, so our
        // read end sees EOF at that exec, the moment `container_started` is stamped
        // (the programming wait a pod measures counts from its own process start).
        let (exec_read, exec_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| format!("start container: pipe: {e}"))?;
        let w = std::os::fd::AsRawFd::as_raw_fd(&exec_write);
        // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if w == SHIM_EXEC_FD {
                    if nix::libc::fcntl(w, nix::libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if nix::libc::dup2(w, SHIM_EXEC_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| format!("start container: {e}"));
        drop(exec_write);
        Ok((child?, run, exec_read))
    }

    /// Waits for exit, a deletion request or `activeDeadlineSeconds`; stops the container
    /// in the latter two cases (SIGTERM, grace, SIGKILL).
    async fn wait_container(
        &mut self,
        mut child: tokio::process::Child,
        pid: i32,
        spec: &Value,
    ) -> Ended {
        let deadline = spec["activeDeadlineSeconds"]
            .as_u64()
            .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
        let sleep_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep_deadline);
        let why;
        loop {
            if let Some(_g) = self.deletion_requested() {
                why = Ended::Deleted;
                break;
            }
            tokio::select! {
                st = child.wait() => {
                    let code = st.ok().and_then(|s| s.code().or_else(|| {
                        use std::os::unix::process::ExitStatusExt;
                        s.signal().map(|sig| 128 + sig)
                    })).unwrap_or(255);
                    return Ended::Exited(code);
                }
                _ = &mut sleep_deadline => { why = Ended::DeadlineExceeded; break; }
                r = self.rx.changed() => { if r.is_err() { why = Ended::Deleted; break; } }
            }
        }
        let grace = match why {
            Ended::Deleted => self.deletion_requested().unwrap_or(0),
            _ => spec["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(DEFAULT_GRACE_SECONDS),
        };
        let pg = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGTERM);
        let grace = Duration::from_secs(grace.max(0) as u64);
        if tokio::time::timeout(grace, child.wait()).await.is_err() {
            let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait().await;
        }
        why
    }

    /// Sleeps `d` unless a deletion is requested first; true when it was.
    async fn sleep_unless_deleted(&mut self, d: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            if self.deletion_requested().is_some() {
                return true;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return false,
                r = self.rx.changed() => if r.is_err() { return true },
            }
        }
    }

    /// The container cannot be created: reports it `Waiting` with `reason` and `msg`
    /// (plus the pod IP once the sandbox has one), then only waits for the pod's
    /// deletion and tears down what exists (`net`: the sandbox network, if made).
    async fn fail_waiting(
        &mut self,
        cname: &str,
        image: &str,
        reason: &str,
        msg: &str,
        pod_ip: Option<&str>,
        net: Option<&PodNet>,
    ) {
        self.update(|st| {
            if let Some(ip) = pod_ip {
                st["podIP"] = json!(ip);
                st["podIPs"] = json!([{ "ip": ip }]);
            }
            st["containerStatuses"] = json!([waiting_status(cname, image, reason, Some(msg))]);
        })
        .await;
        self.wait_for_deletion_only().await;
        self.finish(net).await;
    }

    async fn wait_for_deletion_only(&mut self) {
        while self.deletion_requested().is_none() {
            if self.rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Final step of a deletion: sandbox gone (if still there), pod removed from the API.
    async fn finish(&mut self, net: Option<&PodNet>) {
        if let Some(net) = net {
            self.k.agent.endpoint_removed(net);
            let _ = self.k.dataplane.remove_pod(net);
        }
        let pod = self.pod();
        self.k.truth.emit(TruthEvent {
            t: 0.0,
            event: TruthKind::PodDeleted,
            node: Some(self.k.cfg.node.clone()),
            namespace: Some(self.ns.clone()),
            pod: Some(self.name.clone()),
            uid: Some(self.uid.clone()),
            ip: pod["status"]["podIP"].as_str().map(str::to_owned),
            iface: None,
            detail: json!({}),
        });
        if !self.gone() {
            self.k.delete_final(&self.ns, &self.name, &self.uid).await;
        }
        let _ = std::fs::remove_dir_all(self.k.cfg.pods_dir.join(&self.uid));
    }
}

/// Truth detail of `readiness_ok`: what the container runs (`run`, from
/// [`PodWorker::start_container`]: `image_id`, and with fault `clock_skew` the
/// `clock_skew` applied and the `program` run), plus `"first_connections_dropped": N`
/// when the agent armed that budget for the pod right before (fault
/// `first_connections_dropped`).
fn readiness_ok_detail(armed: u32, run: &Value) -> Value {
    let mut d = run.clone();
    if !d.is_object() {
        d = json!({});
    }
    if armed > 0 {
        d["first_connections_dropped"] = json!(armed);
    }
    d
}

/// Runs the pod's readiness probe until told to stop; updates the Ready conditions on
/// every transition and emits `readiness_ok` on the first pass.
async fn readiness_loop(
    k: Arc<Kubelet>,
    name: String,
    status: Arc<StatusWriter>,
    probe: Value,
    net: PodNet,
    run: Value,
    mut stop: watch::Receiver<bool>,
) {
    let http = &probe["httpGet"];
    let port = http["port"].as_u64().unwrap_or(8080) as u16;
    let path = http["path"].as_str().unwrap_or("/").to_owned();
    let period = Duration::from_secs(probe["periodSeconds"].as_u64().unwrap_or(10).max(1));
    let timeout = Duration::from_secs(probe["timeoutSeconds"].as_u64().unwrap_or(1).max(1));
    let initial = Duration::from_secs(probe["initialDelaySeconds"].as_u64().unwrap_or(0));
    let success_threshold = probe["successThreshold"].as_u64().unwrap_or(1).max(1);
    let failure_threshold = probe["failureThreshold"].as_u64().unwrap_or(3).max(1);
    let addr = SocketAddr::from((net.ip, port));
    if !http.is_object() {
        tracing::warn!(pod = %name, "only httpGet readiness probes are supported; pod stays unready");
    }
    let mut ready = false;
    let mut announced = false;
    let (mut ok_run, mut fail_run) = (0u64, 0u64);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + initial, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        if k.is_paused() {
            continue;
        }
        // Until the first pass, (re)arm the agent's `first_connections_dropped` budget
        // right before each probe, so that it counts from readiness_ok (crate::agent).
        let mut armed = 0;
        if !announced {
            let agent = k.agent.clone();
            let net2 = net.clone();
            armed = tokio::task::spawn_blocking(move || agent.arm_first_connections_dropped(&net2))
                .await
                .unwrap_or(0);
        }
        // The node controller may have flipped Ready while the kubelet was stopped: the
        // built-in one sets the container unready too, kube-controller-manager's
        // node-lifecycle controller only the pod's Ready condition (MarkPodsNotReady).
        if let Some(st) = status.resync_now().await {
            let condition = st["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True");
            ready = st["containerStatuses"][0]["ready"]
                .as_bool()
                .unwrap_or(ready)
                && condition.unwrap_or(true);
        }
        let passed = http.is_object()
            && matches!(
                httpc::request(addr, "GET", &path, &[("User-Agent", httpc::KUBE_PROBE_USER_AGENT), ("Accept", "*/*")], b"", timeout).await,
                Ok(r) if (200..400).contains(&r.status)
            );
        if passed {
            ok_run += 1;
            fail_run = 0;
        } else {
            fail_run += 1;
            ok_run = 0;
        }
        let new_ready = if !ready && ok_run >= success_threshold {
            true
        } else if ready && fail_run >= failure_threshold {
            false
        } else {
            ready
        };
        if new_ready && !announced {
            announced = true;
            k.truth.emit(TruthEvent::pod(
                TruthKind::ReadinessOk,
                &net,
                readiness_ok_detail(armed, &run),
            ));
        }
        if new_ready != ready {
            ready = new_ready;
            status
                .update(move |st| {
                    if let Some(cs) = st["containerStatuses"].get_mut(0) {
                        if cs["state"]["running"].is_null() {
                            return;
                        }
                        cs["ready"] = json!(ready);
                    }
                    let (r, m) = if ready {
                        (None, None)
                    } else {
                        (
                            Some("ContainersNotReady"),
                            Some("containers with unready status".to_owned()),
                        )
                    };
                    set_condition(st, "Ready", ready, r, m.clone());
                    set_condition(st, "ContainersReady", ready, r, m);
                })
                .await;
        }
    }
}

/// `GET /containerLogs/{namespace}/{pod}/{container}` of the kubelet API.
async fn container_logs(
    axum::extract::State(k): axum::extract::State<Arc<Kubelet>>,
    axum::extract::Path((ns, pod, container)): axum::extract::Path<(String, String, String)>,
    axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let text = |code: u16, body: String| {
        (
            axum::http::StatusCode::from_u16(code)
                .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
            [("Content-Type", "text/plain")],
            body,
        )
            .into_response()
    };
    let Some((uid, obj)) = k.find_pod(&ns, &pod) else {
        return text(404, format!("pod {ns}/{pod} not found on {}\n", k.cfg.node));
    };
    let known = obj["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["name"] == container.as_str());
    if !known {
        return text(
            404,
            format!("container {container} is not valid for pod {pod}\n"),
        );
    }
    let tail = q.get("tailLines").and_then(|t| t.parse::<usize>().ok());
    let limit = q.get("limitBytes").and_then(|t| t.parse::<usize>().ok());
    let Some(mut logs) = read_logs(&k.cfg.pods_dir, &uid, tail) else {
        return text(
            404,
            format!("container {container} in pod {pod} has not started\n"),
        );
    };
    if let Some(l) = limit {
        logs.truncate(l.min(logs.len()));
    }
    if q.get("follow").is_none_or(|f| f != "true" && f != "1") {
        return text(200, logs);
    }
    // Follow: what is there, then every new byte of the file until the pod's worker
    // ends.
    let path = k.cfg.pods_dir.join(&uid).join("container.log");
    let start = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    let k2 = k.clone();
    tokio::spawn(async move {
        if tx.send(Ok(logs.into_bytes())).await.is_err() {
            return;
        }
        let mut pos = start;
        loop {
            let alive = lock(&k2.workers).contains_key(&uid);
            let data = std::fs::read(&path).unwrap_or_default();
            let len = data.len() as u64;
            if len > pos {
                let chunk = data[pos as usize..].to_vec();
                pos = len;
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
            if !alive {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    axum::response::Response::builder()
        .status(200)
        .header("Content-Type", "text/plain")
        .body(body)
        .unwrap_or_else(|_| text(500, String::new()))
}

/// What a pod's image resolved to (docs/design.md §6 pod-spec contract).
enum ResolvedImage {
    /// An OCI image from the image directory, unpacked.
    Oci(crate::image::OciImage),
    /// A binary of the bin dir named like the image.
    Binary(PathBuf),
}

impl ResolvedImage {
    /// The container status's `imageID`: `NAME@sha256:…` for an OCI image (as the
    /// real kubelet reports the repo digest), `testbed://IMAGE` for a bin-dir binary.
    fn image_id(&self, image: &str) -> String {
        match self {
            ResolvedImage::Oci(i) => i.image_id.clone(),
            ResolvedImage::Binary(_) => format!("testbed://{image}"),
        }
    }

    /// The image's user (bin-dir binaries run as root).
    fn user(&self) -> crate::image::ImageUser {
        match self {
            ResolvedImage::Oci(i) => crate::image::ImageUser::parse(&i.user),
            ResolvedImage::Binary(_) => crate::image::ImageUser::Unset,
        }
    }
}

/// Maps an image reference to a binary in `bin_dir`: the last path component without
/// `:tag` or `@digest` (docs/design.md §6 pod-spec contract). `None` when no such executable.
pub fn resolve_image(bin_dir: &Path, image: &str) -> Option<PathBuf> {
    let last = image.rsplit('/').next()?;
    let last = last.split('@').next()?;
    let name = last.split(':').next()?;
    if name.is_empty() || name == "." || name == ".." {
        return None;
    }
    let p = bin_dir.join(name);
    p.is_file().then_some(p)
}

/// The shim's fd that closes when it `execve`s the container's binary (`testbed shim
/// --exec-fd`): the kubelet stamps `container_started` at that moment.
pub const SHIM_EXEC_FD: i32 = 3;

/// Resolves a downward-API `fieldPath` (Kubernetes docs, "Expose Pod Information to
/// Containers Through Environment Variables"); unknown paths give "".
/// `status.podIPs` of a pod whose sandbox is `net`: `[{ip: <IPv4>}]`, or on a dual-stack
/// testbed `[{ip: <IPv4>}, {ip: <IPv6>}]` (IPv4 first: it is the primary family and
/// `status.podIP`; the API server requires `podIPs[0]` to equal `podIP` and at most one
/// address per family).
fn pod_ips_status(net: &crate::dataplane::PodNet) -> Value {
    let mut v = vec![json!({ "ip": net.ip.to_string() })];
    if let Some(ip6) = net.ip6 {
        v.push(json!({ "ip": ip6.to_string() }));
    }
    Value::Array(v)
}

fn downward_field(pod: &Value, path: &str, pod_ip: &str, cfg: &KubeletConfig) -> String {
    let m = &pod["metadata"];
    match path {
        "metadata.name" => m["name"].as_str().unwrap_or("").to_owned(),
        "metadata.namespace" => m["namespace"].as_str().unwrap_or("").to_owned(),
        "metadata.uid" => m["uid"].as_str().unwrap_or("").to_owned(),
        "spec.nodeName" => cfg.node.clone(),
        "spec.serviceAccountName" => pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_owned(),
        "status.podIP" => pod_ip.to_owned(),
        "status.podIPs" => pod_ip.to_owned(),
        "status.hostIP" | "status.hostIPs" => cfg.node_ip.to_string(),
        p => {
            for (prefix, key) in [
                ("metadata.labels['", "labels"),
                ("metadata.annotations['", "annotations"),
            ] {
                if let Some(rest) = p.strip_prefix(prefix).and_then(|r| r.strip_suffix("']")) {
                    return m[key][rest].as_str().unwrap_or("").to_owned();
                }
            }
            String::new()
        }
    }
}

/// The termination message as the kubelet keeps it: the message file's last 4096
/// bytes; with `FallbackToLogsOnError`, the logs' tail only when the file is empty and
/// the exit code is non-zero. `None` when there is nothing to report.
pub fn termination_message(pod_dir: &Path, exit_code: i32, policy: &str) -> Option<String> {
    let name = std::fs::read_to_string(pod_dir.join("termination-path"))
        .unwrap_or_else(|_| "termination-log".into());
    let file = std::fs::read(pod_dir.join("dev").join(name.trim())).unwrap_or_default();
    if !file.is_empty() {
        return Some(tail_bytes(&file, MAX_TERMINATION_MESSAGE));
    }
    if policy == "FallbackToLogsOnError" && exit_code != 0 {
        let logs = std::fs::read(pod_dir.join("container.log")).unwrap_or_default();
        let text = String::from_utf8_lossy(&logs);
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(FALLBACK_LOG_LINES)..].join("\n");
        if !tail.is_empty() {
            return Some(tail_bytes(tail.as_bytes(), MAX_TERMINATION_MESSAGE));
        }
    }
    None
}

fn tail_bytes(b: &[u8], max: usize) -> String {
    let start = b.len().saturating_sub(max);
    String::from_utf8_lossy(&b[start..]).into_owned()
}

/// Container logs of a pod on this machine (for `pods/NAME/log`), optionally the last
/// `tail_lines` lines.
pub fn read_logs(pods_dir: &Path, uid: &str, tail_lines: Option<usize>) -> Option<String> {
    let text = std::fs::read_to_string(pods_dir.join(uid).join("container.log")).ok()?;
    Some(match tail_lines {
        Some(n) => {
            let lines: Vec<&str> = text.lines().collect();
            let mut s = lines[lines.len().saturating_sub(n)..].join("\n");
            s.push('\n');
            s
        }
        None => text,
    })
}

fn waiting_status(name: &str, image: &str, reason: &str, message: Option<&str>) -> Value {
    let mut waiting = json!({ "reason": reason });
    if let Some(m) = message {
        waiting["message"] = json!(m);
    }
    json!({
        "name": name, "image": image, "imageID": "", "ready": false, "started": false,
        "restartCount": 0, "state": { "waiting": waiting },
    })
}

/// Sets a pod condition, keeping `lastTransitionTime` when the status did not change.
fn set_condition(
    st: &mut Value,
    ty: &str,
    status: bool,
    reason: Option<&str>,
    message: Option<String>,
) {
    let s = if status { "True" } else { "False" };
    if !st["conditions"].is_array() {
        st["conditions"] = json!([]);
    }
    let Some(conds) = st["conditions"].as_array_mut() else {
        return;
    };
    let now = now_rfc3339();
    if let Some(c) = conds.iter_mut().find(|c| c["type"] == ty) {
        if c["status"] != s {
            c["lastTransitionTime"] = json!(now);
        }
        c["status"] = json!(s);
        set_opt(c, "reason", reason.map(str::to_owned));
        set_opt(c, "message", message);
        return;
    }
    let mut c =
        json!({ "type": ty, "status": s, "lastProbeTime": null, "lastTransitionTime": now });
    set_opt(&mut c, "reason", reason.map(str::to_owned));
    set_opt(&mut c, "message", message);
    conds.push(c);
}

fn set_opt(c: &mut Value, key: &str, v: Option<String>) {
    match (c.as_object_mut(), v) {
        (Some(o), Some(v)) => {
            o.insert(key.into(), json!(v));
        }
        (Some(o), None) => {
            o.remove(key);
        }
        _ => {}
    }
}

/// RFC 3339 UTC with seconds, as the API server writes timestamps.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_readiness_puts_back_what_the_node_controller_changed() {
        let mine = json!({"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "t0"},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": "t0"}],
            "containerStatuses": [{"name": "web", "ready": true}]});
        let mut stored = json!({"conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "False", "lastTransitionTime": "t1"}],
            "containerStatuses": [{"name": "web", "ready": false}], "hostIP": "10.0.0.2"});
        keep_readiness(&mut stored, &mine);
        assert_eq!(stored["conditions"][1]["status"], "True");
        assert_eq!(stored["conditions"][1]["lastTransitionTime"], "t0");
        assert_eq!(stored["conditions"][2]["type"], "ContainersReady");
        assert_eq!(stored["conditions"][0]["type"], "Initialized");
        assert_eq!(stored["containerStatuses"][0]["ready"], true);
        assert_eq!(stored["hostIP"], "10.0.0.2");
    }

    #[test]
    fn image_maps_to_last_path_component_without_tag_or_digest() {
        let dir = std::env::temp_dir().join(format!("fp-kubelet-img-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("target-server"), b"").unwrap();
        for img in [
            "target-server",
            "ghcr.io/firstpacket/target-server:0.1.0",
            "registry:5000/x/target-server@sha256:abc",
        ] {
            assert_eq!(
                resolve_image(&dir, img),
                Some(dir.join("target-server")),
                "{img}"
            );
        }
        assert_eq!(resolve_image(&dir, "docker.io/library/nginx:1.27"), None);
        assert_eq!(resolve_image(&dir, "ghcr.io/x/target-server-typo:1"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn termination_message_prefers_file_and_falls_back_to_logs_only_on_error() {
        let dir = std::env::temp_dir().join(format!("fp-kubelet-tm-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("dev")).unwrap();
        std::fs::write(dir.join("dev/termination-log"), b"").unwrap();
        std::fs::write(dir.join("container.log"), b"line1\nboom\n").unwrap();
        assert_eq!(termination_message(&dir, 0, "FallbackToLogsOnError"), None);
        assert_eq!(termination_message(&dir, 1, "File"), None);
        assert_eq!(
            termination_message(&dir, 1, "FallbackToLogsOnError").as_deref(),
            Some("line1\nboom")
        );
        let big = vec![b'x'; 5000];
        std::fs::write(dir.join("dev/termination-log"), &big).unwrap();
        let m = termination_message(&dir, 1, "FallbackToLogsOnError").unwrap();
        assert_eq!(m.len(), MAX_TERMINATION_MESSAGE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn condition_transition_time_changes_only_on_status_change() {
        let mut st = json!({});
        set_condition(&mut st, "Ready", false, Some("X"), None);
        st["conditions"][0]["lastTransitionTime"] = json!("old");
        set_condition(&mut st, "Ready", false, Some("Y"), None);
        assert_eq!(st["conditions"][0]["lastTransitionTime"], "old");
        assert_eq!(st["conditions"][0]["reason"], "Y");
        set_condition(&mut st, "Ready", true, None, None);
        assert_ne!(st["conditions"][0]["lastTransitionTime"], "old");
        assert!(st["conditions"][0].get("reason").is_none());
    }
}
