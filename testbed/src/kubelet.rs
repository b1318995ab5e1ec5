//! The testbed kubelet: one per node, running on that node's [`NetnsThread`] runtime so
//! its readiness probes leave from the node's network namespace, as the real kubelet's
//! do (which is why a pod is reachable from its node before the CNI agent programs it).
//!
//! Per pod bound to the node it: resolves the image to a local binary (pod-spec
//! contract, DESIGN §6: last path component without `:tag`/`@digest`; anything unknown
//! → `ErrImagePull`), sets up the sandbox network ([`Dataplane::add_pod`]) and tells the
//! node's agent, starts the container through `testbed shim`, runs the readiness probe
//! (`httpGet`, `User-Agent: kube-probe/1.32`), keeps `status` like the real kubelet
//! (conditions with timestamps, container state, termination message), enforces
//! `activeDeadlineSeconds`, and performs graceful deletion (SIGTERM, grace, SIGKILL,
//! then the final removal from the store).
//!
//! Termination message: the last 4096 bytes of the container's
//! `terminationMessagePath` file; with `FallbackToLogsOnError`, the tail of the logs
//! only when that file is empty *and* the exit code is non-zero (Kubernetes docs,
//! "Customizing the termination message").
//!
//! [`NetnsThread`]: crate::netns::NetnsThread

use crate::agent::Agent;
use crate::api::{Kind, Store, StoreEvent, WatchEventType};
use crate::dataplane::{Dataplane, PodNet};
use crate::httpc;
use crate::truth::{Truth, TruthEvent, TruthKind};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
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

/// Pods carrying this annotation are simulated by the daemon (the calico-node agent
/// pods); the kubelet leaves them alone.
pub const SIMULATED_ANNOTATION: &str = "testbed.firstpacket.io/simulated";

/// Token written into every pod's service-account directory (the testbed API
/// authorises every request; clients only need something to send).
pub const SERVICE_ACCOUNT_TOKEN: &str = "testbed";

/// What the kubelet of one node needs.
#[derive(Clone)]
pub struct KubeletConfig {
    /// Node name (`node-1`…).
    pub node: String,
    /// The node's InternalIP (`status.hostIP` of its pods).
    pub node_ip: Ipv4Addr,
    /// Directory holding the image binaries (`target-server`, `prober`, …).
    pub bin_dir: PathBuf,
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
    store: Arc<Store>,
    dataplane: Arc<Dataplane>,
    agent: Arc<Agent>,
    truth: Truth,
    /// Running pod workers by pod uid: the sender tells the worker the pod's latest
    /// object (deletion requests arrive as `deletionTimestamp`).
    workers: Mutex<HashMap<String, watch::Sender<Arc<Value>>>>,
    /// `testbed node stop`: the kubelet neither starts pods nor probes while set.
    paused: watch::Sender<bool>,
    /// UIDs whose workers have finished (bounded, oldest dropped first): events for them
    /// still queued in the watch stream must not start a second sandbox.
    finished: Mutex<std::collections::VecDeque<String>>,
}

/// How many finished pod UIDs a kubelet remembers.
const FINISHED_MEMORY: usize = 4096;

impl Kubelet {
    /// Builds the kubelet; call [`Kubelet::run`] on the node's runtime.
    pub fn new(
        cfg: KubeletConfig,
        store: Arc<Store>,
        dataplane: Arc<Dataplane>,
        agent: Arc<Agent>,
        truth: Truth,
    ) -> Arc<Kubelet> {
        Arc::new(Kubelet {
            cfg,
            store,
            dataplane,
            agent,
            truth,
            workers: Mutex::new(HashMap::new()),
            paused: watch::channel(false).0,
            finished: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// Stops (`true`) or restarts (`false`) this kubelet, as `testbed node stop|start`
    /// does: a stopped kubelet starts no pod and runs no probe; containers keep running.
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

    /// Watches the store for pods bound to this node and drives each through its life.
    /// Runs until the store's event stream closes.
    pub async fn run(self: Arc<Self>) {
        let mut rx = self.store.subscribe();
        let mut paused = self.paused.subscribe();
        let (pods, _) = self.store.list(Kind::Pod, None);
        for p in pods {
            self.observe(Arc::new(p), false);
        }
        loop {
            if *paused.borrow() {
                // Stopped: events pile up in the channel (or lag); re-list on restart.
                while *paused.borrow_and_update() {
                    if paused.changed().await.is_err() {
                        return;
                    }
                }
                rx = self.store.subscribe();
                let (pods, _) = self.store.list(Kind::Pod, None);
                for p in pods {
                    self.observe(Arc::new(p), false);
                }
                continue;
            }
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = paused.changed() => continue,
            };
            match ev {
                Ok(StoreEvent {
                    kind: Kind::Pod,
                    ty,
                    object,
                    ..
                }) => self.observe(object, ty == WatchEventType::Deleted),
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(node = %self.cfg.node, missed = n, "kubelet lagged; re-listing");
                    let (pods, _) = self.store.list(Kind::Pod, None);
                    for p in pods {
                        self.observe(Arc::new(p), false);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    }

    /// Stops every container on this node at once (SIGKILL) and tears down its pods'
    /// networks; used when the daemon shuts down.
    pub fn kill_all(&self) {
        let workers: Vec<_> = self
            .workers
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default();
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

    fn observe(self: &Arc<Self>, pod: Arc<Value>, deleted: bool) {
        if pod["spec"]["nodeName"].as_str() != Some(self.cfg.node.as_str()) {
            return;
        }
        if !pod["metadata"]["annotations"][SIMULATED_ANNOTATION].is_null() {
            // Simulated agent pods run no container: a graceful deletion ends at once.
            if !deleted && !pod["metadata"]["deletionTimestamp"].is_null() {
                if let (Some(ns), Some(name), Some(uid)) = (
                    pod["metadata"]["namespace"].as_str(),
                    pod["metadata"]["name"].as_str(),
                    pod["metadata"]["uid"].as_str(),
                ) {
                    let _ = self.store.remove(Kind::Pod, Some(ns), name, uid);
                }
            }
            return;
        }
        let Some(uid) = pod["metadata"]["uid"].as_str().map(str::to_owned) else {
            return;
        };
        let mut workers = match self.workers.lock() {
            Ok(w) => w,
            Err(p) => p.into_inner(),
        };
        if let Some(tx) = workers.get(&uid) {
            let mut obj = (*pod).clone();
            if deleted && obj["metadata"]["deletionTimestamp"].is_null() {
                // Removed without a graceful phase (force delete): stop now.
                obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            let _ = tx.send(Arc::new(obj));
            return;
        }
        if deleted {
            return;
        }
        let already_finished = self
            .finished
            .lock()
            .map(|f| f.iter().any(|u| u == &uid))
            .unwrap_or(false);
        if already_finished || !pod["metadata"]["deletionTimestamp"].is_null() {
            // A stale event for a pod this kubelet already finished, or a pod being
            // deleted that never started here: nothing to run.
            if !already_finished {
                let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
                let name = pod["metadata"]["name"].as_str().unwrap_or("");
                let _ = self.store.remove(Kind::Pod, Some(ns), name, &uid);
            }
            return;
        }
        let (tx, rx) = watch::channel(pod.clone());
        workers.insert(uid.clone(), tx);
        drop(workers);
        let me = self.clone();
        tokio::spawn(async move {
            let ns = pod["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned();
            let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let worker = PodWorker {
                k: me.clone(),
                ns,
                name,
                uid: uid.clone(),
                rx,
            };
            worker.run().await;
            if let Ok(mut f) = me.finished.lock() {
                if f.len() >= FINISHED_MEMORY {
                    f.pop_front();
                }
                f.push_back(uid.clone());
            }
            if let Ok(mut w) = me.workers.lock() {
                w.remove(&uid);
            }
        });
    }
}

/// Drives one pod from bound to removed.
struct PodWorker {
    k: Arc<Kubelet>,
    ns: String,
    name: String,
    uid: String,
    rx: watch::Receiver<Arc<Value>>,
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

    /// Applies `f` to the stored pod's status (ignoring a pod that is already gone).
    fn update(&self, f: impl FnOnce(&mut Value)) {
        let uid = self.uid.clone();
        let name = self.name.clone();
        let r = self
            .k
            .store
            .modify(Kind::Pod, Some(&self.ns), &self.name, move |obj| {
                if obj["metadata"]["uid"].as_str() != Some(uid.as_str()) {
                    return Err(crate::api::ApiError::conflict(
                        Kind::Pod,
                        &name,
                        "uid changed",
                    ));
                }
                if !obj["status"].is_object() {
                    obj["status"] = json!({});
                }
                f(&mut obj["status"]);
                Ok(())
            });
        if let Err(e) = r {
            tracing::debug!(pod = %self.name, error = %e.message, "status update skipped");
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
            st["qosClass"] = json!("BestEffort");
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
        });

        // Image → local binary (pod-spec contract).
        let binary = match resolve_image(&self.k.cfg.bin_dir, &image) {
            Some(b) => b,
            None => {
                let msg = format!("failed to pull and unpack image \"{image}\": not found (the testbed maps only images named like a binary in its bin dir)");
                self.update(|st| {
                    st["containerStatuses"] =
                        json!([waiting_status(&cname, &image, "ErrImagePull", Some(&msg))]);
                });
                self.wait_for_deletion_only().await;
                self.finish(None).await;
                return;
            }
        };

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
                self.update(|st| {
                    st["containerStatuses"] = json!([waiting_status(
                        &cname,
                        &image,
                        "CreateContainerError",
                        Some(&msg)
                    )]);
                });
                self.wait_for_deletion_only().await;
                self.finish(None).await;
                return;
            }
        };
        self.k.agent.endpoint_added(&net);
        let pod_ip = net.ip.to_string();

        // Container, restarted per restartPolicy (Always; OnFailure on a non-zero exit)
        // with the kubelet's back-off: 10 s doubling up to 5 min (Kubernetes docs, "Pod
        // Lifecycle", container restart policy).
        let pod_dir = self.k.cfg.pods_dir.join(&self.uid);
        let mut restarts: u64 = 0;
        let mut last_state = json!({});
        let ended = loop {
            let child = match self.start_container(&pod, &container, &binary, &net, &pod_dir) {
                Ok(c) => c,
                Err(msg) => {
                    self.update(|st| {
                        st["podIP"] = json!(pod_ip);
                        st["podIPs"] = json!([{ "ip": pod_ip }]);
                        st["containerStatuses"] = json!([waiting_status(
                            &cname,
                            &image,
                            "CreateContainerError",
                            Some(&msg)
                        )]);
                    });
                    self.wait_for_deletion_only().await;
                    self.finish(Some(&net)).await;
                    return;
                }
            };
            let pid = child.id().unwrap_or(0) as i32;
            let _ = std::fs::write(pod_dir.join("pid"), pid.to_string());
            let started_at = now_rfc3339();
            let container_id = format!("testbed://{}-{pid}", self.uid);
            let has_readiness = container["readinessProbe"].is_object();
            {
                let (cname, image, cid, sa, pod_ip) = (
                    cname.clone(),
                    image.clone(),
                    container_id.clone(),
                    started_at.clone(),
                    pod_ip.clone(),
                );
                let last_state_now = last_state.clone();
                self.update(move |st| {
                    st["phase"] = json!("Running");
                    st["podIP"] = json!(pod_ip);
                    st["podIPs"] = json!([{ "ip": pod_ip }]);
                    set_condition(st, "PodReadyToStartContainers", true, None, None);
                    st["containerStatuses"] = json!([{
                        "name": cname, "image": image, "imageID": format!("testbed://{image}"),
                        "containerID": cid, "ready": !has_readiness, "started": true,
                        "restartCount": restarts, "state": { "running": { "startedAt": sa } },
                        "lastState": last_state_now,
                    }]);
                    if !has_readiness {
                        set_condition(st, "Ready", true, None, None);
                        set_condition(st, "ContainersReady", true, None, None);
                    }
                });
            }
            if !has_readiness {
                self.readiness_ok(&net);
            }

            // Readiness prober (runs on this node's runtime: packets leave the node netns).
            let (stop_probe, stop_rx) = watch::channel(false);
            let probe_task = if has_readiness {
                Some(tokio::spawn(readiness_loop(
                    self.k.clone(),
                    self.ns.clone(),
                    self.name.clone(),
                    self.uid.clone(),
                    container["readinessProbe"].clone(),
                    net.clone(),
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
                let (cname, image, ls, n) =
                    (cname.clone(), image.clone(), last_state.clone(), restarts);
                let wait_msg = format!(
                    "back-off {}s restarting failed container={cname} pod={}_{}({})",
                    backoff.as_secs(),
                    self.name,
                    self.ns,
                    self.uid
                );
                self.update(move |st| {
                st["containerStatuses"] = json!([{
                    "name": cname, "image": image, "imageID": format!("testbed://{image}"),
                    "ready": false, "started": false, "restartCount": n,
                    "state": { "waiting": { "reason": "CrashLoopBackOff", "message": wait_msg } },
                    "lastState": ls,
                }]);
                set_condition(st, "Ready", false, Some("ContainersNotReady"), None);
                set_condition(st, "ContainersReady", false, Some("ContainersNotReady"), None);
            });
                if self.sleep_unless_deleted(backoff).await {
                    self.finish(Some(&net)).await;
                    return;
                }
                continue;
            }
            {
                let (cname, image, cid) = (cname.clone(), image.clone(), container_id.clone());
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
                        "name": cname, "image": image, "imageID": format!("testbed://{image}"),
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
                });
            }
            break ended;
        };
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

    fn readiness_ok(&self, net: &PodNet) {
        self.k
            .truth
            .emit(TruthEvent::pod(TruthKind::ReadinessOk, net, json!({})));
    }

    /// Starts the container through the shim; returns the child or a message for
    /// `CreateContainerError`.
    fn start_container(
        &self,
        pod: &Value,
        container: &Value,
        binary: &Path,
        net: &PodNet,
        pod_dir: &Path,
    ) -> Result<tokio::process::Child, String> {
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
        std::fs::write(dev_dir.join(tm_name), b"").map_err(|e| e.to_string())?;
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
            .arg("--netns")
            .arg(&net.netns)
            .arg("--dev-dir")
            .arg(&dev_dir)
            .arg("--hostname")
            .arg(&self.name);
        if pod["spec"]["automountServiceAccountToken"] != false {
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
        cmd.arg("--").arg(binary);
        if let Some(args) = container["args"].as_array() {
            for a in args {
                cmd.arg(a.as_str().unwrap_or_default());
            }
        }
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOSTNAME", &self.name)
            .env("KUBERNETES_SERVICE_HOST", &self.k.cfg.api_host)
            .env("KUBERNETES_SERVICE_PORT", self.k.cfg.api_port.to_string())
            .env(
                "KUBERNETES_SERVICE_PORT_HTTPS",
                self.k.cfg.api_port.to_string(),
            );
        if let Ok(v) = std::env::var("RUST_LOG") {
            cmd.env("RUST_LOG", v);
        }
        // Fault `clock_skew`: libfaketime's variables for this node's new containers.
        for (k, v) in self.k.agent.container_env() {
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
        cmd.spawn().map_err(|e| format!("start container: {e}"))
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
        let _ = self
            .k
            .store
            .remove(Kind::Pod, Some(&self.ns), &self.name, &self.uid);
        let _ = std::fs::remove_dir_all(self.k.cfg.pods_dir.join(&self.uid));
    }
}

/// Runs the pod's readiness probe until told to stop; updates the Ready conditions on
/// every transition and emits `readiness_ok` on the first pass.
async fn readiness_loop(
    k: Arc<Kubelet>,
    ns: String,
    name: String,
    uid: String,
    probe: Value,
    net: PodNet,
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
        // The node controller may have flipped Ready while the kubelet was stopped.
        if let Ok(obj) = k.store.get(Kind::Pod, Some(&ns), &name) {
            if obj["metadata"]["uid"].as_str() == Some(uid.as_str()) {
                ready = obj["status"]["containerStatuses"][0]["ready"]
                    .as_bool()
                    .unwrap_or(ready);
            }
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
            k.truth
                .emit(TruthEvent::pod(TruthKind::ReadinessOk, &net, json!({})));
        }
        if new_ready != ready {
            ready = new_ready;
            let (uid, pod_name) = (uid.clone(), name.clone());
            let _ = k.store.modify(Kind::Pod, Some(&ns), &name, move |obj| {
                if obj["metadata"]["uid"].as_str() != Some(uid.as_str()) {
                    return Err(crate::api::ApiError::conflict(
                        Kind::Pod,
                        &pod_name,
                        "uid changed",
                    ));
                }
                let st = &mut obj["status"];
                if let Some(cs) = st["containerStatuses"].get_mut(0) {
                    if cs["state"]["running"].is_null() {
                        return Ok(());
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
                Ok(())
            });
        }
    }
}

/// Maps an image reference to a binary in `bin_dir`: the last path component without
/// `:tag` or `@digest` (DESIGN §6 pod-spec contract). `None` when no such executable.
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

/// Resolves a downward-API `fieldPath` (Kubernetes docs, "Expose Pod Information to
/// Containers Through Environment Variables"); unknown paths give "".
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
