//! The middle test tier's cluster: the testbed's API [`Store`] served over plain HTTP on
//! loopback, its scheduler, Nodes that exist only in the API, and a scripted kubelet that
//! runs every bound pod as a hollow node's kubelet does (no process, no packet): Running
//! and Ready, and a `target-server probe` pod terminating with the
//! [`firstpacket_report::SourceReport`] the real binary writes. What each pod does is
//! the test's [`Script`], so every probe ending can be produced on purpose.
//!
//! Each test runs in a network namespace of its own with only loopback up
//! ([`run`]): no root beyond `unshare --user --map-root-user --net`, no testbed binary,
//! no traffic outside it. The prober runs in-process (`prober::gate_run::run_gate`, …)
//! with `--kubeconfig` pointing at [`Cluster::kubeconfig`].

#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::api::{ApiServer, Kind, Store, WatchEventType};
use testbed::hollow::{pod_conditions, running_status, source_report, ProbeArgs};
use tokio::task::JoinHandle;

/// Runs `test` on a fresh 2-worker runtime inside a network namespace of its own (this
/// thread's, inherited by the runtime's threads) with only `lo` up. Panics, naming the
/// way to run the tests, when no namespace can be made (neither root nor inside
/// `unshare --user --map-root-user --net`).
pub fn run<F, Fut>(test: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    isolate();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(test());
    rt.shutdown_timeout(Duration::from_secs(2));
}

/// This thread into a new network namespace with `lo` up.
fn isolate() {
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        panic!(
            "cannot make a network namespace for the test ({e}): run as root, or inside \
             `unshare --user --map-root-user --net`"
        );
    }
    let st = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .expect("run `ip link set lo up` (iproute2)");
    assert!(st.success(), "ip link set lo up: {st}");
}

/// What the scripted kubelet does with one bound pod.
#[derive(Debug, Clone)]
pub enum Act {
    /// Running at once, Ready `ready_after` later; a source then dials: first success
    /// `ttfp` after Ready (`None`: none before its `--give-up`), then its `--hold`, and
    /// terminates with its report, changed by `outcome` when given.
    Run {
        ready_after: Duration,
        ttfp: Option<Duration>,
        outcome: Outcome,
    },
    /// Running, the readiness probe never passes.
    NeverReady,
    /// `ErrImagePull`, never starts.
    ImagePull,
    /// The container exits with code 1 at once (`restartPolicy: Never`: phase Failed).
    Crash,
    /// Left alone: the pod stays Pending on its node (a kubelet that is gone).
    Ignore,
}

/// How a source's report differs from a plain success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// As dialed.
    AsDialed,
    /// Every answer came from another pod (`wrong_peer`).
    WrongPeer,
    /// Failures during the hold after the first success.
    LostAfterSuccess,
    /// NetworkPolicy isolation does not hold: a `policy` probe's intruder gets its
    /// answer `ttfp` after Ready (without it an intruder never gets one), and a
    /// `policy_change` source is answered before the prober's arm mark.
    Breach,
    /// A `policy_change` source stays admitted after the revoke mark.
    NotRevoked,
    /// A `policy_change` source's `/policy` reads are never answered (as a pod whose
    /// network went away under the proxied connection); its marks are.
    StatusUnanswered,
}

/// A pod as the script sees it.
#[derive(Debug, Clone)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// `source` (runs `target-server probe`), `target` (serves), or `other`.
    pub role: &'static str,
    pub labels: HashMap<String, String>,
}

/// Chooses each bound pod's [`Act`].
pub type Script = Arc<dyn Fn(&PodView) -> Act + Send + Sync>;

/// Healthy: Ready after 20 ms, first success `ttfp` after Ready.
pub fn healthy(ttfp: Duration) -> Script {
    Arc::new(move |_| Act::Run {
        ready_after: Duration::from_millis(20),
        ttfp: Some(ttfp),
        outcome: Outcome::AsDialed,
    })
}

/// A healthy [`Act::Run`].
pub fn ok(ttfp_ms: u64) -> Act {
    Act::Run {
        ready_after: Duration::from_millis(20),
        ttfp: Some(Duration::from_millis(ttfp_ms)),
        outcome: Outcome::AsDialed,
    }
}

/// The in-process cluster. Dropping it stops the server and every task.
pub struct Cluster {
    pub store: Arc<Store>,
    pub server: ApiServer,
    /// Kubeconfig of an anonymous client (the built-in server's RBAC is
    /// [`Store::deny`]).
    pub kubeconfig: PathBuf,
    pub dir: TempDir,
    pub nodes: Vec<String>,
    script: Arc<Mutex<Script>>,
    tasks: Vec<JoinHandle<()>>,
    pub kubelet: Arc<KubeletLog>,
    /// While true the scheduler binds nothing ([`Cluster::pause_scheduling`]).
    scheduling_paused: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.kubelet.abort_all();
    }
}

/// What the scripted kubelet ran (pod name → node), and its running pod tasks.
#[derive(Default)]
pub struct KubeletLog {
    pub started: Mutex<Vec<(String, String)>>,
    running: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl KubeletLog {
    fn abort_all(&self) {
        for (_, t) in lock(&self.running).drain() {
            t.abort();
        }
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "fp-engine-{tag}-{}-{:x}",
            std::process::id(),
            rand_u64()
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Node `i` (1-based): `node-i` at `127.0.1.i`.
pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, i as u8)
}

impl Cluster {
    /// `n` Ready nodes (`node-1`…), the scheduler, the scripted kubelet running
    /// `script`, the API on `127.0.0.1:<free port>`.
    pub async fn start(n: usize, script: Script) -> Cluster {
        let store = Store::new();
        let mut server = ApiServer::new(store.clone());
        let addr = server
            .listen("127.0.0.1:0".parse().unwrap(), None, None)
            .expect("listen on loopback");
        let dir = TempDir::new("cluster");
        let kubeconfig = dir.path().join("kubeconfig");
        let endpoint = testbed::client::ClusterEndpoint {
            url: format!("http://{addr}"),
            ca_pem: None,
            identity: testbed::client::ClientIdentity::Anonymous,
        };
        std::fs::write(&kubeconfig, endpoint.kubeconfig_yaml()).expect("write kubeconfig");
        let mut nodes = Vec::new();
        for i in 1..=n {
            let name = format!("node-{i}");
            let mut node = testbed::hollow::node_object(&name, node_ip(i));
            if let Some(labels) = node["metadata"]["labels"].as_object_mut() {
                labels.remove(testbed::hollow::HOLLOW_LABEL);
            }
            store.create(Kind::Node, node).expect("create node");
            nodes.push(name);
        }
        let script = Arc::new(Mutex::new(script));
        let kubelet = Arc::new(KubeletLog::default());
        let scheduling_paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = vec![
            // Subscribed here, before any test write: nothing created after `start`
            // returns is missed.
            tokio::spawn(run_scheduler(
                store.clone(),
                store.subscribe(),
                scheduling_paused.clone(),
            )),
            tokio::spawn(run_kubelet(
                store.clone(),
                store.subscribe(),
                script.clone(),
                kubelet.clone(),
            )),
        ];
        Cluster {
            store,
            server,
            kubeconfig,
            dir,
            nodes,
            script,
            tasks,
            kubelet,
            scheduling_paused,
        }
    }

    /// Stops (`true`) or resumes the scheduler's binding of pending pods.
    pub fn pause_scheduling(&self, paused: bool) {
        self.scheduling_paused
            .store(paused, std::sync::atomic::Ordering::SeqCst);
    }

    /// Replaces the script for pods bound from now on.
    pub fn set_script(&self, script: Script) {
        *lock(&self.script) = script;
    }

    /// The node's Ready condition set to `ready` (a kubelet that stopped posting, as the
    /// node-lifecycle controller marks it: `Unknown`, reason `NodeStatusUnknown`).
    pub fn set_node_ready(&self, node: &str, ready: bool) {
        self.store
            .modify(Kind::Node, None, node, |n| {
                if let Some(conds) = n["status"]["conditions"].as_array_mut() {
                    for c in conds.iter_mut().filter(|c| c["type"] == "Ready") {
                        c["status"] = json!(if ready { "True" } else { "Unknown" });
                        c["reason"] = json!(if ready {
                            "KubeletReady"
                        } else {
                            "NodeStatusUnknown"
                        });
                        c["lastTransitionTime"] = json!(testbed::api::rfc3339_now());
                    }
                }
                Ok(())
            })
            .expect("node condition");
    }

    /// Pods in `ns` (all namespaces when `None`).
    pub fn pods(&self, ns: Option<&str>) -> Vec<Value> {
        self.store.list(Kind::Pod, ns).0
    }

    /// Pods whose labels carry the prober's instance label.
    pub fn probe_pods(&self) -> Vec<Value> {
        self.pods(None)
            .into_iter()
            .filter(|p| !p["metadata"]["labels"]["firstpacket.io/instance"].is_null())
            .collect()
    }

    /// Gate flags: kubeconfig and report file, `extra`, then the defaults of this tier
    /// for the flags `extra` leaves out (`--hold 200ms`, `--give-up 3s`).
    pub fn gate_args(&self, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "prober".into(),
            "gate".into(),
            "--kubeconfig".into(),
            self.kubeconfig.display().to_string(),
            "--report".into(),
            self.report_path().display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        for (flag, value) in [("--hold", "200ms"), ("--give-up", "3s")] {
            if !extra.contains(&flag) {
                a.extend([flag.to_string(), value.to_string()]);
            }
        }
        a
    }

    /// Where [`Cluster::gate_args`] writes the report.
    pub fn report_path(&self) -> PathBuf {
        self.dir.path().join("report.json")
    }

    /// Runs `prober gate` in-process with [`Cluster::gate_args`] + `extra`; its exit
    /// code (`Err`: the run errored, as exit 2) and the report, if written.
    pub async fn gate(&self, extra: &[&str]) -> (Result<i32, prober::Error>, Option<Value>) {
        use clap::Parser;
        let cli = prober::config::Cli::try_parse_from(self.gate_args(extra)).expect("gate args");
        let prober::config::Command::Gate(args) = cli.command else {
            unreachable!()
        };
        let _ = std::fs::remove_file(self.report_path());
        let code = prober::gate_run::run_gate(args).await;
        let report = std::fs::read_to_string(self.report_path())
            .ok()
            .map(|s| serde_json::from_str(&s).expect("report is JSON"));
        (code, report)
    }
}

/// The probes' `result` and `reason` in a report.
pub fn endings(report: &Value) -> Vec<(String, String)> {
    report["probes"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (
                        p["result"].as_str().unwrap_or("").to_string(),
                        p["reason"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits up to `within` for `cond`, polling every 20 ms; false on time-out.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn view(pod: &Value) -> PodView {
    let args: Vec<String> = pod["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let role = match args.first().map(String::as_str) {
        Some("probe") => "source",
        Some("serve") => "target",
        _ => "other",
    };
    PodView {
        namespace: pod["metadata"]["namespace"].as_str().unwrap_or("").into(),
        name: pod["metadata"]["name"].as_str().unwrap_or("").into(),
        node: pod["spec"]["nodeName"].as_str().unwrap_or("").into(),
        role,
        labels: pod["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The scripted kubelet: one subscription to the store; a bound pod gets a task running
/// its [`Act`]; a pod marked for deletion is removed at once (grace 0, UID
/// precondition), as the testbed's kubelets finish a deletion.
async fn run_kubelet(
    store: Arc<Store>,
    mut rx: tokio::sync::broadcast::Receiver<testbed::api::StoreEvent>,
    script: Arc<Mutex<Script>>,
    log: Arc<KubeletLog>,
) {
    let mut next_ip: u32 = 2;
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(_) => return,
        };
        if ev.kind != Kind::Pod {
            continue;
        }
        let pod = &*ev.object;
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
        if ev.ty == WatchEventType::Deleted {
            if let Some(t) = lock(&log.running).remove(&uid) {
                t.abort();
            }
            continue;
        }
        let v = view(pod);
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            if let Some(t) = lock(&log.running).remove(&uid) {
                t.abort();
            }
            let _ = store.delete(Kind::Pod, Some(&v.namespace), &v.name, Some(0), Some(&uid));
            continue;
        }
        if v.node.is_empty() || lock(&log.running).contains_key(&uid) {
            continue;
        }
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        if phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        let act = (lock(&script))(&v);
        // Loopback addresses: a `policy_change` source serves the prober's marks there
        // (through the API server's pod proxy), as the real one does on its pod IP.
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 2, 0, 0)) + next_ip);
        next_ip += 1;
        lock(&log.started).push((v.name.clone(), v.node.clone()));
        let task = tokio::spawn(run_pod(store.clone(), pod.clone(), v, act, ip));
        lock(&log.running).insert(uid, task);
    }
}

/// The testbed's scheduler ([`testbed::scheduler::schedule_once`]) after every change in
/// the store and at least every 100 ms, unless `paused`.
async fn run_scheduler(
    store: Arc<Store>,
    mut rx: tokio::sync::broadcast::Receiver<testbed::api::StoreEvent>,
    paused: Arc<std::sync::atomic::AtomicBool>,
) {
    loop {
        if !paused.load(std::sync::atomic::Ordering::SeqCst) {
            testbed::scheduler::schedule_once(&store);
        }
        match tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            Err(_) | Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(_)) => return,
        }
    }
}

/// Merges `status` into the pod if it is still the one with `uid`.
fn patch_status(store: &Store, v: &PodView, uid: &str, status: &Value) -> bool {
    store
        .modify(Kind::Pod, Some(&v.namespace), &v.name, |p| {
            if p["metadata"]["uid"] != uid {
                return Err(testbed::api::ApiError::conflict(
                    Kind::Pod,
                    &v.name,
                    "uid changed",
                ));
            }
            testbed::api::merge_patch(p, status);
            Ok(())
        })
        .is_ok()
}

/// The pod's first container: its name and image.
fn container_of(pod: &Value) -> (String, String) {
    let c = &pod["spec"]["containers"][0];
    let text = |v: &Value, default: &str| v.as_str().unwrap_or(default).to_string();
    (text(&c["name"], "c"), text(&c["image"], ""))
}

async fn run_pod(store: Arc<Store>, pod: Value, v: PodView, act: Act, ip: Ipv4Addr) {
    let t0 = Instant::now();
    let start_unix = unix_now();
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let (container, image) = container_of(&pod);
    let node_i: usize = v
        .node
        .strip_prefix("node-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let now = testbed::api::rfc3339_now();
    let waiting = |reason: &str| {
        json!({ "status": {
            "phase": "Pending", "hostIP": node_ip(node_i).to_string(), "startTime": now,
            "conditions": pod_conditions(false, "ContainersNotReady", &now),
            "containerStatuses": [{ "name": container, "image": image, "imageID": "",
                "ready": false, "started": false, "restartCount": 0,
                "state": { "waiting": { "reason": reason, "message": format!("{reason} (scripted)") } } }],
        } })
    };
    let (ready_after, ttfp, outcome) = match act {
        Act::Ignore => return,
        Act::ImagePull => {
            patch_status(&store, &v, &uid, &waiting("ErrImagePull"));
            return;
        }
        Act::Crash => {
            let st = json!({ "status": {
                "phase": "Failed", "hostIP": node_ip(node_i).to_string(), "podIP": ip.to_string(),
                "podIPs": [{ "ip": ip.to_string() }], "startTime": now,
                "conditions": pod_conditions(false, "PodFailed", &now),
                "containerStatuses": [{ "name": container, "image": image, "imageID": "",
                    "containerID": format!("scripted://{uid}"),
                    "ready": false, "started": false, "restartCount": 0,
                    "state": { "terminated": { "exitCode": 1, "reason": "Error",
                        "startedAt": now, "finishedAt": now } } }],
            } });
            patch_status(&store, &v, &uid, &st);
            return;
        }
        Act::NeverReady => (None, None, Outcome::AsDialed),
        Act::Run {
            ready_after,
            ttfp,
            outcome,
        } => (Some(ready_after), ttfp, outcome),
    };
    let mut running = running_status(node_ip(node_i), ip, &container, &image, &uid, &now);
    running["status"]["conditions"] = pod_conditions(false, "ContainersNotReady", &now);
    running["status"]["containerStatuses"][0]["ready"] = json!(false);
    if !patch_status(&store, &v, &uid, &running) {
        return;
    }
    let Some(ready_after) = ready_after else {
        return; // never Ready
    };
    tokio::time::sleep(ready_after).await;
    let now = testbed::api::rfc3339_now();
    let ready = running_status(node_ip(node_i), ip, &container, &image, &uid, &now);
    if !patch_status(&store, &v, &uid, &ready) {
        return;
    }
    let ready_at = t0.elapsed().as_secs_f64();
    let args: Vec<String> = pod["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let Some(probe) = ProbeArgs::parse(&args) else {
        return; // a server: Running and Ready until deleted
    };
    let report = if args.iter().any(|a| a == "--policy-change") {
        policy_change_source(&v.name, &probe, ip, t0, start_unix, ready_at, ttfp, outcome).await
    } else {
        dial(&v, &probe, t0, start_unix, ready_at, ttfp, outcome).await
    };
    patch_status(
        &store,
        &v,
        &uid,
        &finished_status(&report, &container, &image, &uid),
    );
}

/// A scripted `target-server probe` after its Ready: first answer `ttfp` later (an
/// intruder's only with [`Outcome::Breach`]), then its hold; or none before its give-up.
async fn dial(
    v: &PodView,
    probe: &ProbeArgs,
    t0: Instant,
    start_unix: f64,
    ready_at: f64,
    ttfp: Option<Duration>,
    outcome: Outcome,
) -> firstpacket_report::SourceReport {
    let intruder = v
        .labels
        .get("app.kubernetes.io/component")
        .map(String::as_str)
        == Some("probe-intruder");
    let ttfp = if intruder && outcome != Outcome::Breach {
        None
    } else {
        ttfp
    };
    let success = match ttfp {
        Some(d) => {
            tokio::time::sleep(d).await;
            let sent = t0.elapsed().as_secs_f64();
            tokio::time::sleep(probe.hold).await;
            Some(sent)
        }
        None => {
            tokio::time::sleep(probe.give_up).await;
            None
        }
    };
    scripted_report(&v.name, probe, start_unix, ready_at, success, outcome)
}

/// The source's report: [`source_report`] of what was dialed, changed by `outcome`.
fn scripted_report(
    pod: &str,
    probe: &ProbeArgs,
    start_unix: f64,
    ready_at: f64,
    success: Option<f64>,
    outcome: Outcome,
) -> firstpacket_report::SourceReport {
    use firstpacket_report::SourceOutcome;
    let mut report = source_report(pod, probe, start_unix, ready_at, success);
    match outcome {
        Outcome::AsDialed | Outcome::Breach | Outcome::NotRevoked | Outcome::StatusUnanswered => {}
        Outcome::WrongPeer => {
            report.outcome = SourceOutcome::WrongPeer;
            report.wrong_peer = Some("someone-else".into());
            report.first_success_sent = None;
            report.first_success_received = None;
            report.ttfp_seconds = None;
            report.raw_ttfp_seconds = None;
            report.first_success_after_ready_sent = None;
        }
        Outcome::LostAfterSuccess => {
            report.outcome = SourceOutcome::LostAfterSuccess;
            report.hold.failures = report.hold.attempts.max(1) / 2 + 1;
            if let Some(f) = report.hold.failures_per_second.first_mut() {
                *f = report.hold.failures as u32;
            }
        }
    }
    report
}

/// The marks a scripted `policy_change` source was given, seconds since its start.
#[derive(Default)]
struct Marks {
    arm: Option<f64>,
    allow: Option<f64>,
    revoke: Option<f64>,
    held: Option<f64>,
    /// `/policy` is never answered ([`Outcome::StatusUnanswered`]).
    status_unanswered: bool,
}

/// The marks of a scripted `policy_change` source, when it took them, and a wake-up for
/// each new one.
type SharedMarks = Arc<(Instant, Mutex<Marks>, tokio::sync::Notify)>;

/// Serves `POST /mark/{arm,allow,revoke}` and `GET`/`POST /policy` on `ip:8080`, as
/// target-server's `policy` module does (a mark once, in order; 409 otherwise).
async fn serve_marks(ip: Ipv4Addr, t0: Instant) -> (SharedMarks, JoinHandle<()>) {
    use axum::extract::{Path as UrlPath, State};
    use axum::http::StatusCode;
    let shared: SharedMarks =
        Arc::new((t0, Mutex::new(Marks::default()), tokio::sync::Notify::new()));
    async fn mark(
        State(sh): State<SharedMarks>,
        UrlPath(name): UrlPath<String>,
    ) -> (StatusCode, String) {
        let now = sh.0.elapsed().as_secs_f64();
        let mut m = lock(&sh.1);
        let ok = match name.as_str() {
            "arm" => *m.arm.get_or_insert(now) > 0.0,
            "allow" if m.arm.is_some() => *m.allow.get_or_insert(now) > 0.0,
            "revoke" if m.allow.is_some() => *m.revoke.get_or_insert(now) > 0.0,
            _ => false,
        };
        drop(m);
        sh.2.notify_waiters();
        if ok {
            (StatusCode::OK, format!(r#"{{"mark":"{name}","at":{now}}}"#))
        } else {
            (StatusCode::CONFLICT, format!("mark {name} out of order"))
        }
    }
    async fn status(State(sh): State<SharedMarks>) -> String {
        if lock(&sh.1).status_unanswered {
            std::future::pending::<()>().await;
        }
        let m = lock(&sh.1);
        json!({"arm_at": m.arm, "allow_at": m.allow, "revoke_at": m.revoke, "held_at": m.held})
            .to_string()
    }
    let app = axum::Router::new()
        .route("/mark/{name}", axum::routing::post(mark))
        .route("/policy", axum::routing::get(status).post(status))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind((ip, 8080))
        .await
        .expect("bind the scripted source's port");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (shared, server)
}

/// A scripted `target-server probe --policy-change`: serves `POST /mark/{arm,allow,revoke}`
/// and `GET`/`POST /policy` on `ip:8080` (the prober reaches it through the built-in API
/// server's pod proxy), is admitted `ttfp` after the allow mark (never without one),
/// holds, and is refused at once after the revoke mark (never with
/// [`Outcome::NotRevoked`]); [`Outcome::Breach`] answers it before the arm mark. Ends
/// as the real one would, `give_up` bounding each wait; returns its report.
#[allow(clippy::too_many_arguments)]
async fn policy_change_source(
    pod: &str,
    probe: &ProbeArgs,
    ip: Ipv4Addr,
    t0: Instant,
    start_unix: f64,
    ready_at: f64,
    ttfp: Option<Duration>,
    outcome: Outcome,
) -> firstpacket_report::SourceReport {
    use firstpacket_report::{PolicyOutcome, SourcePolicy};
    let (shared, server) = serve_marks(ip, t0).await;
    let give_up = probe.give_up.as_secs_f64();
    let now = || t0.elapsed().as_secs_f64();
    // Waits (bounded by `limit` seconds from `from`) until `f` yields.
    let wait = |f: fn(&Marks) -> Option<f64>, from: f64, limit: f64| {
        let sh = shared.clone();
        async move {
            loop {
                let notified = sh.2.notified();
                if let Some(at) = f(&lock(&sh.1)) {
                    return Some(at);
                }
                let left = from + limit - sh.0.elapsed().as_secs_f64();
                if left <= 0.0 {
                    return None;
                }
                let _ = tokio::time::timeout(Duration::from_secs_f64(left), notified).await;
            }
        }
    };
    lock(&shared.1).status_unanswered = outcome == Outcome::StatusUnanswered;
    let mut p = SourcePolicy::default();
    if outcome == Outcome::Breach {
        p.admitted_before_arm = 3;
        p.first_admitted_before_arm_sent = Some(0.01);
    }
    p.outcome = 'run: {
        let Some(allow) = wait(|m| m.allow, 0.0, give_up).await else {
            break 'run PolicyOutcome::NoAllowMark;
        };
        let Some(d) = ttfp.filter(|d| d.as_secs_f64() < give_up) else {
            tokio::time::sleep(probe.give_up).await;
            break 'run PolicyOutcome::NotAdmitted;
        };
        tokio::time::sleep(d).await;
        p.first_admitted_sent = Some(allow + d.as_secs_f64());
        p.admitted_seconds = Some(d.as_secs_f64());
        tokio::time::sleep(probe.hold).await;
        let held = now();
        lock(&shared.1).held = Some(held);
        p.held_at = Some(held);
        let Some(revoke) = wait(|m| m.revoke, held, give_up).await else {
            break 'run PolicyOutcome::NoRevokeMark;
        };
        if outcome == Outcome::NotRevoked {
            tokio::time::sleep(probe.give_up).await;
            p.last_admitted_sent = Some(now());
            break 'run PolicyOutcome::StillAdmitted;
        }
        p.first_blocked_sent = Some(revoke + 0.001);
        p.revoked_seconds = Some(0.001);
        PolicyOutcome::Revoked
    };
    {
        let m = lock(&shared.1);
        p.arm_at = m.arm;
        p.allow_at = m.allow;
        p.revoke_at = m.revoke;
    }
    server.abort();
    let mut report = source_report(pod, probe, start_unix, ready_at, p.first_admitted_sent);
    report.policy = Some(p);
    report
}

/// The status of a source that exited 0 with `report` as its termination message.
fn finished_status(
    report: &firstpacket_report::SourceReport,
    container: &str,
    image: &str,
    uid: &str,
) -> Value {
    let message = serde_json::to_string(report).unwrap_or_default();
    let now = testbed::api::rfc3339_now();
    json!({ "status": {
        "phase": "Succeeded",
        "conditions": pod_conditions(false, "PodCompleted", &now),
        "containerStatuses": [{
            "name": container, "image": image, "imageID": "",
            "containerID": format!("scripted://{uid}"),
            "ready": false, "started": false, "restartCount": 0,
            "state": { "terminated": {
                "exitCode": 0, "reason": "Completed", "message": message,
                "startedAt": now, "finishedAt": now,
                "containerID": format!("scripted://{uid}"),
            } },
        }],
    } })
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// What the prober logged through `tracing` (INFO and up, tracing's plain format without
/// colours: `… WARN prober::lease: … error=…`), as it would print on stderr; with
/// `--log-format json` the console's notices (leadership, errors) are among them.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&lock(&self.0)).into_owned()
    }

    /// The WARN lines so far.
    pub fn warnings(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(" WARN "))
            .map(str::to_owned)
            .collect()
    }
}

/// The writer [`Logs`] hands `tracing_subscriber` (appends to the shared buffer).
pub struct LogsWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogsWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = LogsWriter;
    fn make_writer(&'a self) -> LogsWriter {
        LogsWriter(self.0.clone())
    }
}

/// [`run`] with the `tracing` events of this test's threads (the caller's and every
/// thread of its runtime, so not another test's) captured in the [`Logs`] `test` gets.
pub fn run_logged<F, Fut>(test: F)
where
    F: FnOnce(Logs) -> Fut,
    Fut: Future<Output = ()>,
{
    isolate();
    let logs = Logs::default();
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish(),
    );
    let _here = tracing::dispatcher::set_default(&dispatch);
    let rt = {
        let dispatch = dispatch.clone();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            // The thread's default for its whole life (the guard would only restore none).
            .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&dispatch)))
            .build()
            .expect("tokio runtime")
    };
    rt.block_on(test(logs));
    rt.shutdown_timeout(Duration::from_secs(2));
}
