//! `prober run`: the continuous mode (docs/design.md §4 "Continuous mode"). The same engine as
//! the gate ([`crate::engine`] start-up, [`crate::probe::run_probe`] per probe); the
//! policy here is "forever":
//!
//! - a probe every `--probe-interval` (±20 % jitter), at most `--concurrency` in
//!   flight; pairs and kinds from [`crate::rotation::Rotation`] over the live node set
//!   (a node watch: NotReady, cordoned, untolerated or non-matching nodes are skipped as
//!   they change); nodes that became eligible or whose agent pod changed go first;
//! - each finished record goes to the metrics and the recent-records ring under one
//!   lock ([`crate::admin::AdminState::record`]), slow/failed ones raise rate-limited
//!   Events on the blamed Nodes ([`crate::events`]);
//! - a forbidden create/delete is counted and logged; probing carries on (RBAC can be
//!   fixed while the Deployment runs);
//! - every [`JANITOR_INTERVAL`] the instance's pods and Services that no probe in flight
//!   owns (a create that timed out, a delete that failed) are deleted;
//! - per-node state (metrics series, Event rate limits, `recreate` slots, agent rings) is
//!   pruned when the node leaves; sizes are exported as
//!   `firstpacket_state_entries{structure}`;
//! - SIGTERM/SIGINT: no new probes, running ones are cancelled (they delete their pods),
//!   a final cleanup, exit 0 within [`SHUTDOWN_GRACE`]; a second signal deletes the
//!   instance's pods best-effort (5 s) and exits 2.
//!
//! With `--leader-elect` ([`crate::leader`]) probes start only within a leadership term;
//! each term has its own cancel channel, set when the election leaves the term (its
//! probes stop and delete their pods) or on shutdown; `firstpacket_leader` is 1 only in
//! a term. A standby keeps its node watch, agent discovery, instance Lease, reaper and
//! janitor (deleting dead instances' pods is harmless from any replica). After a
//! SIGTERM's cleanup the leader Lease is released, then the instance Lease.
//!
//! In-cluster (`POD_NAME`, `POD_NAMESPACE`, `POD_UID` from the downward API, and
//! `POD_NAMESPACE` = `--namespace`), probe pods carry an ownerReference to the prober
//! pod, and the instance id derives from the pod UID (`run-<8 hex>`), so a restarted
//! container (kill -9, same pod) removes its previous incarnation's probe pods at start.

use crate::admin::{AdminState, RunInfo};
use crate::config::{check_kinds, RunArgs};
use crate::console::Console;
use crate::engine::Signals;
use crate::error::Error;
use crate::events::{
    event_message, event_reason, node_event, post_event, EventLimiter, PendingBlames,
};
use crate::metrics::Metrics;
use crate::podspec::{recreate_target_name, PodConfig};
use crate::probe::{run_probe, EngineFault, ProbeEnv, ProbePlan};
use crate::reclaim::{delete_instance_pods, delete_orphans, final_cleanup_within};
use crate::rotation::{agent_changes, became_eligible, AgentSnapshot, NextProbe, Rotation};
use crate::schedule::{check_node, NodeInfo};
use crate::sync::lock;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use rand::RngExt;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// Default `--hold` of `prober run` (docs/design.md §2 step 7).
pub const RUN_DEFAULT_HOLD: Duration = Duration::from_secs(30);

/// How long a SIGTERM waits for the probes in flight to delete their pods (20 s: within
/// the default `terminationGracePeriodSeconds` of 30 s, leaving room for the final
/// cleanup).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// How long the final cleanup after a SIGTERM retries.
pub const SHUTDOWN_CLEANUP: Duration = Duration::from_secs(5);

/// How often leftovers of this instance (objects no probe in flight owns) are deleted.
pub const JANITOR_INTERVAL: Duration = Duration::from_secs(30);

/// How long the baseline write at shutdown may wait for the API (within the 25 s a
/// SIGTERM allows, after [`SHUTDOWN_GRACE`] and [`SHUTDOWN_CLEANUP`]).
pub const BASELINE_SHUTDOWN_SAVE: Duration = Duration::from_secs(3);

/// How often the agent index is compared for changed agent pods.
pub const AGENT_POLL: Duration = Duration::from_secs(1);

/// Jitter of the probe interval: uniform in ±20 %.
pub fn jittered(interval: Duration, unit: f64) -> Duration {
    interval.mul_f64(0.8 + 0.4 * unit.clamp(0.0, 1.0))
}

/// The owner of probe pods in-cluster: the prober pod from `POD_NAME`/`POD_UID`, when
/// `POD_NAMESPACE` is the probe namespace (ownerReferences cannot cross namespaces).
/// `get` reads an environment variable.
pub fn owner_from_env(
    namespace: &str,
    get: impl Fn(&str) -> Option<String>,
) -> Option<OwnerReference> {
    let name = get("POD_NAME").filter(|s| !s.is_empty())?;
    let uid = get("POD_UID").filter(|s| !s.is_empty())?;
    let ns = get("POD_NAMESPACE").filter(|s| !s.is_empty())?;
    if ns != namespace {
        tracing::info!(
            pod_namespace = %ns,
            probe_namespace = %namespace,
            "prober pod is in another namespace: probe pods get no ownerReference"
        );
        return None;
    }
    Some(OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name,
        uid,
        controller: None,
        block_owner_deletion: None,
    })
}

/// The instance id: `run-` + the first 8 hex digits of the owner pod's UID (stable
/// across container restarts), else `run-` + 8 random `[a-z0-9]`.
pub fn run_instance(owner: Option<&OwnerReference>) -> String {
    match owner {
        Some(o) => {
            let hex: String = o
                .uid
                .chars()
                .filter(|c| c.is_ascii_hexdigit())
                .map(|c| c.to_ascii_lowercase())
                .take(8)
                .collect();
            format!("run-{hex}")
        }
        None => format!("run-{}", crate::gate_run::random_suffix(8)),
    }
}

/// The live node set: every node the node watch delivered (the `--node-selector`
/// applied server-side), with its UID (for Events).
#[derive(Debug, Default)]
pub struct NodeSet {
    /// By name: the planner's view and the UID.
    pub nodes: BTreeMap<String, (NodeInfo, Option<String>)>,
    /// The first list is done.
    pub synced: bool,
}

impl NodeSet {
    /// Eligible node names now ([`check_node`]).
    pub fn eligible(&self, p: &crate::config::ProbeArgs) -> BTreeSet<String> {
        self.nodes
            .values()
            .filter(|(n, _)| check_node(n, &p.node_selector, &p.toleration).is_ok())
            .map(|(n, _)| n.name.clone())
            .collect()
    }

    /// Skipped nodes now, with the reason.
    pub fn skipped(&self, p: &crate::config::ProbeArgs) -> Vec<(String, String)> {
        self.nodes
            .values()
            .filter_map(|(n, _)| {
                check_node(n, &p.node_selector, &p.toleration)
                    .err()
                    .map(|r| (n.name.clone(), r.to_string()))
            })
            .collect()
    }
}

/// What changed in the node set, for the scheduler.
enum NodeChange {
    /// Node became eligible (joined, Ready, uncordoned): probe it next.
    Eligible(String, &'static str),
    /// Node left the watch (deleted or no longer matching): prune its state.
    Gone(String),
}

fn spawn_node_watch(
    api: Api<Node>,
    p: crate::config::ProbeArgs,
    set: Arc<Mutex<NodeSet>>,
    tx: mpsc::UnboundedSender<NodeChange>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let cfg = crate::podwatch::watcher_config(&p.node_selector.to_string());
        let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
        let mut pending: BTreeMap<String, (NodeInfo, Option<String>)> = BTreeMap::new();
        let apply = |set: &mut NodeSet, info: NodeInfo, uid: Option<String>| {
            let old = set.nodes.get(&info.name).map(|(n, _)| n.clone());
            let why = if set.synced {
                became_eligible(old.as_ref(), &info, &p.node_selector, &p.toleration)
            } else {
                None
            };
            if let Some(why) = why {
                let _ = tx.send(NodeChange::Eligible(info.name.clone(), why));
            }
            set.nodes.insert(info.name.clone(), (info, uid));
        };
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => pending.clear(),
                Ok(Event::InitApply(n)) => {
                    let info = NodeInfo::from_node(&n);
                    pending.insert(info.name.clone(), (info, n.metadata.uid.clone()));
                }
                Ok(Event::InitDone) => {
                    let mut s = lock(&set);
                    let gone: Vec<String> = s
                        .nodes
                        .keys()
                        .filter(|k| !pending.contains_key(*k))
                        .cloned()
                        .collect();
                    for g in gone {
                        s.nodes.remove(&g);
                        let _ = tx.send(NodeChange::Gone(g));
                    }
                    for (_, (info, uid)) in std::mem::take(&mut pending) {
                        apply(&mut s, info, uid);
                    }
                    s.synced = true;
                }
                Ok(Event::Apply(n)) => {
                    let info = NodeInfo::from_node(&n);
                    apply(&mut lock(&set), info, n.metadata.uid.clone());
                }
                Ok(Event::Delete(n)) => {
                    if let Some(name) = n.metadata.name {
                        lock(&set).nodes.remove(&name);
                        let _ = tx.send(NodeChange::Gone(name));
                    }
                }
                Err(e) if crate::apihealth::watcher_unanswered(&e) => {
                    tracing::debug!(error = %crate::error::watcher_error_text(&e), "node watch: API server not answering (retrying with backoff)");
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error::watcher_error_text(&e), "node watch error (retrying with backoff)");
                }
            }
        }
    })
}

fn agent_snapshot(a: &crate::agents::scrape::AgentWatcher) -> AgentSnapshot {
    let mut out = AgentSnapshot::new();
    if let Ok(idx) = a.index().read() {
        for t in idx.all() {
            out.entry((t.profile.clone(), t.node.clone()))
                .or_default()
                .insert((t.uid.clone(), t.restart_count));
        }
    }
    out
}

/// Runs `prober run` until a signal. Returns the exit code: 0 after a SIGTERM/SIGINT
/// handled within [`SHUTDOWN_GRACE`], 2 after a second signal. Start-up errors (config,
/// `--admin-addr` cannot be bound, API unreachable/forbidden, pod watch never ready) are
/// returned as [`Error`].
pub async fn run_continuous(args: RunArgs) -> Result<i32, Error> {
    let p = args.probe.clone();
    let console = Console::new(p.log_format);
    let (kinds, drift_cfg) = check_run_args(&args, console)?;
    let profiles = crate::engine::load_profiles(&p)?;
    let n_profiles = profiles.len();
    let hold = p.hold_or(RUN_DEFAULT_HOLD);
    let owner = owner_from_env(&p.namespace, |k| std::env::var(k).ok());
    let instance = run_instance(owner.as_ref());
    let seed: u64 = rand::rng().random();
    let tag = crate::gate_run::random_suffix(3);

    let admin = new_admin_state(&args, &kinds, drift_cfg, &instance);
    let server = serve_admin(&args, admin.clone(), console, &instance).await?;

    let conn_health = crate::apihealth::ApiHealth::new(Some(console.outage_sink()));
    let (conn, _pings) = crate::engine::connect_watched(&p, &conn_health).await?;
    let url = conn.url.clone();
    let started = crate::engine::start(&conn, &p, &instance, hold, profiles, console, true).await?;
    admin.ready.store(true, Ordering::Relaxed);
    let pods = started.pods.clone();
    delete_previous_incarnation(&pods, &instance, &url, &started.watch).await;
    let agents = Arc::new(started.agents);
    let (lease, reaper_task) = (started.lease, started.reaper);
    let nodes_api: Api<Node> = Api::all(conn.client.clone());
    let env = Arc::new(ProbeEnv::new(
        pods.clone(),
        started.watch.clone(),
        &url,
        PodConfig::from_args(&p, &instance, hold, owner),
        p.slow_threshold,
        run_fault_sink(admin.clone(), instance.clone()),
        agents.clone(),
    ));

    let (node_set, mut node_rx, node_task) = start_node_watch(nodes_api, &p, &admin, &agents).await;

    let mut signals = Signals::install_or_error()?;
    let (cancel_tx, cancel_rx) = watch::channel(false);
    // Leader election: probes start only within a term; each term has its own cancel
    // channel, set when the term ends or on shutdown.
    let leader = args
        .leader_elect
        .then(|| crate::leader::spawn(conn.client.clone(), &url, leader_config(&args, &instance)));
    let mut leader_rx = leader.as_ref().map(|h| h.status.clone());
    lock(&admin.info).leadership = leader_rx
        .as_ref()
        .map(|rx| rx.borrow().clone())
        .unwrap_or_default();
    let known_nodes: BTreeSet<String> = lock(&node_set).nodes.keys().cloned().collect();
    let mut rl = RunLoop {
        store: Arc::new(BaselineStore::new(
            &conn.client,
            &args,
            &instance,
            admin.clone(),
            drift_cfg,
            &kinds,
        )),
        // The current term: its number and cancel receiver (without --leader-elect, one
        // endless term cancelled only on shutdown).
        term: (!args.leader_elect).then(|| (0, cancel_rx.clone())),
        known_nodes,
        agent_prev: agent_snapshot(&agents),
        rotation: Rotation::new(kinds.clone(), seed),
        set: JoinSet::new(),
        counter: 0,
        lap_started: Instant::now(),
        laps_seen: 0,
        next_probe: tokio::time::Instant::now(),
        announced: None,
        limiter: Arc::new(Mutex::new(EventLimiter::new(crate::events::EVENT_WINDOW))),
        pending: Arc::new(Mutex::new(PendingBlames::default())),
        in_flight_ids: Arc::new(Mutex::new(HashSet::new())),
        bound_inputs: crate::bounds::BoundInputs::of(&p, n_profiles, kinds.len()),
        p,
        probe_interval: args.probe_interval,
        console,
        instance,
        tag,
        admin,
        env,
        agents,
        client: conn.client.clone(),
        conn_health,
        node_set,
        cancel_rx,
    };
    if rl.term.is_some() {
        rl.store.load().await;
    }
    let signal = rl
        .run(
            &mut node_rx,
            &mut leader_rx,
            &mut signals,
            args.baseline_save_interval,
        )
        .await;
    let tasks = RunTasks {
        server,
        node_task,
        reaper_task,
        leader,
        lease,
    };
    Ok(shut_down(rl, &mut signals, signal, &cancel_tx, tasks, &url).await)
}

/// The run's background tasks and held Leases, ended at shutdown.
struct RunTasks {
    server: tokio::task::JoinHandle<()>,
    node_task: tokio::task::JoinHandle<()>,
    reaper_task: tokio::task::JoinHandle<()>,
    leader: Option<crate::leader::LeaderHandle>,
    lease: Option<crate::lease::InstanceLease>,
}

impl RunTasks {
    /// Hands the leadership over (waiting at most `within`), stops the tasks, releases
    /// the instance Lease.
    async fn end(self, within: Duration) {
        if let Some(h) = self.leader {
            h.release(within).await;
        }
        self.server.abort();
        self.node_task.abort();
        self.reaper_task.abort();
        if let Some(l) = self.lease {
            l.release().await;
        }
    }
}

/// Shutdown after `signal`: no new probes; the running ones cancelled (they delete their
/// pods) and waited for `SHUTDOWN_GRACE`; leftovers deleted; the learned baseline
/// saved; the leadership handed over. A second signal deletes the pods best-effort
/// and ends at once (exit 2). Returns the exit code.
async fn shut_down(
    mut rl: RunLoop,
    signals: &mut Signals,
    signal: &'static str,
    cancel_tx: &watch::Sender<bool>,
    tasks: RunTasks,
    url: &str,
) -> i32 {
    rl.console.signal(signal);
    tracing::info!(
        signal,
        in_flight = rl.set.len(),
        "stopping: no new probes, deleting the probes' pods"
    );
    cancel_tx.send_replace(true);
    let pods = rl.env.pods.clone();
    let drained = tokio::select! {
        r = tokio::time::timeout(SHUTDOWN_GRACE, async { while rl.set.join_next().await.is_some() {} }) => r.is_ok(),
        _ = signals.next() => {
            rl.console.second_signal();
            let _ = tokio::time::timeout(Duration::from_secs(5), delete_instance_pods(&pods, &rl.instance, url)).await;
            tasks.end(Duration::from_secs(2)).await;
            return 2;
        }
    };
    if !drained {
        tracing::warn!("probes did not finish within the shutdown grace; deleting their pods");
        rl.set.abort_all();
    }
    match final_cleanup_within(&pods, &rl.instance, url, SHUTDOWN_CLEANUP).await {
        Ok(n) if n > 0 => tracing::info!(deleted = n, "deleted leftover probe pods"),
        Ok(_) => {}
        Err(e) => rl.console.error(None, &e.to_string()),
    }
    // The learned baseline, for the next incarnation or leader (only a replica that led
    // has learned anything worth keeping).
    if rl.term.is_some() {
        rl.store.save_if_learned(BASELINE_SHUTDOWN_SAVE).await;
    }
    // The probes ended and their pods are gone: hand the leadership over at once.
    tasks.end(Duration::from_secs(5)).await;
    0
}

/// Binds `--admin-addr` and serves the admin router there (metrics, health, status
/// page); says so on the console. Errors: the bind, as a `--admin-addr` config error.
async fn serve_admin(
    args: &RunArgs,
    admin: Arc<AdminState>,
    console: Console,
    instance: &str,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let listener = tokio::net::TcpListener::bind(&args.admin_addr)
        .await
        .map_err(|e| Error::Config {
            flag: "--admin-addr",
            message: format!("cannot listen on {}: {e}", args.admin_addr),
        })?;
    console.run_started(
        instance,
        &args.admin_addr,
        args.probe_interval.as_secs_f64(),
        args.probe.concurrency,
    );
    let router = crate::admin::router(admin);
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "admin server failed");
        }
    }))
}

impl RunLoop {
    /// The loop: one handler per event (the next probe's time, a node change, the agent
    /// tick, the janitor, the baseline tick, a leadership change), then the bookkeeping
    /// and, when due and leading, a probe start. Returns the signal that ended it.
    async fn run(
        &mut self,
        node_rx: &mut mpsc::UnboundedReceiver<NodeChange>,
        leader_rx: &mut Option<watch::Receiver<crate::leader::Leadership>>,
        signals: &mut Signals,
        baseline_save_interval: Duration,
    ) -> &'static str {
        let mut agent_tick = tokio::time::interval(AGENT_POLL);
        let mut janitor_tick = tokio::time::interval(JANITOR_INTERVAL);
        janitor_tick.tick().await;
        let mut baseline_tick = tokio::time::interval(baseline_save_interval);
        baseline_tick.tick().await;

        loop {
            // Reap finished probes.
            while self.set.try_join_next().is_some() {}
            let start_now = tokio::select! {
                _ = tokio::time::sleep_until(self.next_probe) => {
                    self.next_probe = tokio::time::Instant::now()
                        + jittered(self.probe_interval, rand::rng().random::<f64>());
                    true
                }
                Some(change) = node_rx.recv() => self.on_node_change(change),
                _ = agent_tick.tick() => self.on_agent_tick(),
                _ = janitor_tick.tick() => {
                    self.on_janitor().await;
                    false
                }
                _ = baseline_tick.tick() => {
                    self.on_baseline_tick();
                    false
                }
                Some(st) = leadership_changed(leader_rx) => self.on_leadership(st, leader_rx.clone()),
                name = signals.next() => break name,
            };
            let leading_now = self.leading_now(leader_rx.as_ref());
            let eligible = self.bookkeeping();
            if start_now && leading_now {
                self.start_probe(&eligible);
            }
        }
    }
}

/// Checks `prober run`'s flags before any API call: `--kinds`, `--probe-interval`, the
/// drift settings, the leader-election timings; prints the settings warnings.
fn check_run_args(
    args: &RunArgs,
    console: Console,
) -> Result<(Vec<crate::kind::ProbeKind>, crate::baseline::DriftConfig), Error> {
    let kinds = check_kinds(&args.probe.kinds)?;
    if args.probe_interval.is_zero() {
        return Err(Error::Config {
            flag: "--probe-interval",
            message: "must be more than 0s".into(),
        });
    }
    let drift_cfg = drift_config(args)?;
    for (flag, message) in crate::settings::questionable_run_settings(args) {
        console.setting_warning(flag, &message);
    }
    if args.leader_elect {
        crate::leader::validate(
            args.leader_elect_lease_duration,
            args.leader_elect_renew_deadline,
            args.leader_elect_retry_period,
        )?;
    }
    Ok((kinds, drift_cfg))
}

/// The admin server's state: metrics of `kinds`, the run facts, the drift settings;
/// `firstpacket_leader` 1 without `--leader-elect` (a standby starts at 0).
fn new_admin_state(
    args: &RunArgs,
    kinds: &[crate::kind::ProbeKind],
    drift_cfg: crate::baseline::DriftConfig,
    instance: &str,
) -> Arc<AdminState> {
    let admin = Arc::new(AdminState::new(
        Metrics::new(kinds),
        RunInfo {
            instance: instance.to_owned(),
            probe_interval_seconds: args.probe_interval.as_secs_f64(),
            concurrency: args.probe.concurrency,
            slow_threshold_seconds: args.probe.slow_threshold.as_secs_f64(),
            ..Default::default()
        },
    ));
    admin.metrics.leader.set(i64::from(!args.leader_elect));
    let paths = crate::paths::PathsConfig::new(
        &args.probe.protocols,
        args.probe.payload,
        &args.probe.ip_families,
    );
    admin.metrics.initialise_paths(kinds, &paths.metric_ids());
    *lock(&admin.baselines) = Some(crate::baseline::Baselines::new(drift_cfg));
    admin.metrics.drift_threshold_ratio.set(drift_cfg.ratio);
    admin.metrics.drift_floor_seconds.set(drift_cfg.floor);
    admin
}

/// A previous incarnation of this instance (the container restarted in the same pod):
/// its probe pods are ours by name but no probe of ours owns them; deleted, and their
/// late watch events kept off this incarnation's pods.
async fn delete_previous_incarnation(
    pods: &Api<Pod>,
    instance: &str,
    url: &str,
    watch: &crate::podwatch::PodWatch,
) {
    match delete_instance_pods(pods, instance, url).await {
        Ok(n) if n > 0 => {
            tracing::info!(deleted = n, "deleted the previous incarnation's probe pods");
            watch.with_tracker(|t| t.forget_all());
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot delete the previous incarnation's probe pods"),
    }
}

/// `prober run`'s policy on engine faults: counted (`firstpacket_engine_faults_total`)
/// and logged; probing carries on.
fn run_fault_sink(admin: Arc<AdminState>, instance: String) -> crate::probe::FaultSink {
    Arc::new(move |f: EngineFault| {
        let label = f.label();
        admin
            .metrics
            .engine_faults
            .with_label_values(&[label])
            .inc();
        match f {
            EngineFault::AdmissionRejected(_) => {
                tracing::error!(fault = label, error = %f.text(&instance), "probe object rejected by admission; probing carries on")
            }
            _ => {
                tracing::error!(fault = label, error = %f.text(&instance), "probe object forbidden; probing carries on")
            }
        }
    })
}

/// Starts the node watch ([`spawn_node_watch`]) and waits (at most
/// `WATCH_READY_TIMEOUT`) for its first list; the eligible nodes then get their metric
/// series and a first agent scrape. Returns the node set, the receiver of node changes
/// and the watch task.
async fn start_node_watch(
    nodes_api: Api<Node>,
    p: &crate::config::ProbeArgs,
    admin: &AdminState,
    agents: &crate::agents::scrape::AgentWatcher,
) -> (
    Arc<Mutex<NodeSet>>,
    mpsc::UnboundedReceiver<NodeChange>,
    tokio::task::JoinHandle<()>,
) {
    let node_set = Arc::new(Mutex::new(NodeSet::default()));
    let (node_tx, node_rx) = mpsc::unbounded_channel();
    let node_task = spawn_node_watch(nodes_api, p.clone(), node_set.clone(), node_tx);
    let deadline = Instant::now() + crate::engine::WATCH_READY_TIMEOUT;
    while !lock(&node_set).synced && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<String> = lock(&node_set).eligible(p).into_iter().collect();
    for n in &names {
        admin.metrics.node_added(n);
    }
    agents.prime(&names).await;
    (node_set, node_rx, node_task)
}

/// The election's settings from the `--leader-elect-*` flags.
fn leader_config(args: &RunArgs, instance: &str) -> crate::leader::LeaderConfig {
    crate::leader::LeaderConfig {
        namespace: args.probe.namespace.clone(),
        lease_name: args.leader_elect_lease_name.clone(),
        identity: crate::leader::identity(
            |k| std::env::var(k).ok(),
            &crate::leader::hostname(),
            instance,
        ),
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    }
}

/// What `prober run`'s loop keeps between its events, and one handler per event: a
/// node change, the agent tick, the janitor, the baseline tick, a leadership change;
/// then [`RunLoop::bookkeeping`] and, when a probe is due, [`RunLoop::start_probe`].
struct RunLoop {
    p: crate::config::ProbeArgs,
    probe_interval: Duration,
    console: Console,
    instance: String,
    /// This incarnation's tag in probe ids.
    tag: String,
    admin: Arc<AdminState>,
    env: Arc<ProbeEnv>,
    agents: Arc<crate::agents::scrape::AgentWatcher>,
    client: kube::Client,
    conn_health: crate::apihealth::ApiHealth,
    node_set: Arc<Mutex<NodeSet>>,
    /// Set on shutdown (every term's probes stop).
    cancel_rx: watch::Receiver<bool>,
    /// The current leadership term: its number and cancel receiver.
    term: Option<(u64, watch::Receiver<bool>)>,
    store: Arc<BaselineStore>,
    limiter: Arc<Mutex<EventLimiter>>,
    pending: Arc<Mutex<PendingBlames>>,
    in_flight_ids: Arc<Mutex<HashSet<String>>>,
    rotation: Rotation,
    set: JoinSet<()>,
    /// Probes started by this incarnation.
    counter: u64,
    known_nodes: BTreeSet<String>,
    agent_prev: AgentSnapshot,
    lap_started: Instant,
    laps_seen: u64,
    next_probe: tokio::time::Instant,
    /// The leadership last announced on the console.
    announced: Option<bool>,
    bound_inputs: crate::bounds::BoundInputs,
}

impl RunLoop {
    /// Room for one more probe now.
    fn has_room(&self) -> bool {
        self.set.len() < self.bound_inputs.concurrency
    }

    /// A node became eligible (probed next) or left (its series pruned). Returns whether
    /// to start a probe now.
    fn on_node_change(&mut self, change: NodeChange) -> bool {
        match change {
            NodeChange::Eligible(node, why) => {
                tracing::info!(node = %node, change = why, "node changed: probing it next");
                self.admin.metrics.node_added(&node);
                self.rotation
                    .prioritise(&node, &format!("node {node} {why}"));
                self.has_room()
            }
            NodeChange::Gone(node) => {
                tracing::info!(node = %node, "node gone: pruning its state");
                self.admin.metrics.node_removed(&node);
                false
            }
        }
    }

    /// Agents that restarted or rolled since the last tick: their nodes are probed next.
    fn on_agent_tick(&mut self) -> bool {
        let now = agent_snapshot(&self.agents);
        let mut start_now = false;
        for (node, why) in agent_changes(&self.agent_prev, &now, false) {
            if lock(&self.node_set).nodes.contains_key(&node) {
                tracing::info!(node = %node, change = %why, "agent changed: probing the node next");
                self.rotation.prioritise(&node, &format!("{why} on {node}"));
                start_now = self.has_room();
            }
        }
        self.agent_prev = now;
        self.admin
            .metrics
            .sync_agent_scrapes(&self.agents.scrape_counts());
        start_now
    }

    /// Deletes this instance's probe objects no running probe owns.
    async fn on_janitor(&self) {
        let live = lock(&self.in_flight_ids).clone();
        let sweep = delete_orphans(&self.env.pods, &self.instance, &self.env.url, &live);
        match tokio::time::timeout(crate::api::API_CALL_TIMEOUT, sweep).await {
            Ok(Ok(n)) if n > 0 => tracing::info!(deleted = n, "deleted leftover probe objects"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "leftover cleanup failed; retried later"),
            Err(_) => tracing::warn!("leftover cleanup got no answer; retried later"),
        }
    }

    /// Saves the learned baseline in the background (a slow API must not hold up the
    /// loop), while this replica leads.
    fn on_baseline_tick(&self) {
        if self.term.is_some() {
            let store = self.store.clone();
            tokio::spawn(async move { store.save_if_learned(crate::api::API_CALL_TIMEOUT).await });
        }
    }

    /// A new election status: a new term starts from the latest persisted baseline and
    /// probes at once; a lost term starts nothing more (its task cancelled its probes).
    fn on_leadership(
        &mut self,
        st: crate::leader::Leadership,
        status: Option<watch::Receiver<crate::leader::Leadership>>,
    ) -> bool {
        lock(&self.admin.info).leadership = st.clone();
        let mut start_now = false;
        if st.leading && self.term.as_ref().map(|t| t.0) != Some(st.terms) {
            // A new term starts from the latest persisted baseline (the previous
            // leader's, or ours from before).
            let store = self.store.clone();
            tokio::spawn(async move { store.load().await });
            let cancel = spawn_term(st.terms, self.cancel_rx.clone(), status, self.admin.clone());
            self.term = Some((st.terms, cancel));
            start_now = self.has_room();
            self.next_probe = tokio::time::Instant::now()
                + jittered(self.probe_interval, rand::rng().random::<f64>());
        } else if !st.leading {
            self.term = None;
        }
        if self.announced != Some(st.leading) {
            self.announced = Some(st.leading);
            self.console
                .leadership(st.leading, &st.identity, &st.lease, st.holder.as_deref());
        }
        start_now
    }

    /// Whether probes may start: always without an election, else while this replica
    /// leads in the term the loop knows (the election may have ended it since). Sets
    /// `firstpacket_leader`.
    fn leading_now(&self, status: Option<&watch::Receiver<crate::leader::Leadership>>) -> bool {
        let leading = status.is_none_or(|rx| {
            let st = rx.borrow();
            st.leading && self.term.as_ref().is_some_and(|t| t.0 == st.terms)
        });
        self.admin.metrics.leader.set(i64::from(leading));
        leading
    }

    /// After every event: the node set (state of departed nodes pruned), laps, the sizes
    /// of the bounded structures against their bounds, API outages and the status
    /// page's facts. Returns the eligible nodes.
    fn bookkeeping(&mut self) -> BTreeSet<String> {
        let (eligible, skipped, names_now) = {
            let s = lock(&self.node_set);
            (
                s.eligible(&self.p),
                s.skipped(&self.p),
                s.nodes.keys().cloned().collect::<BTreeSet<String>>(),
            )
        };
        if names_now != self.known_nodes {
            self.prune_departed(&names_now);
            self.known_nodes = names_now;
        }
        let m = &self.admin.metrics;
        m.eligible_nodes
            .set(i64::try_from(eligible.len()).unwrap_or(i64::MAX));
        let expected = eligible.len() as f64 * self.probe_interval.as_secs_f64();
        m.lap_expected_seconds.set(expected);
        let laps = self.rotation.completed_laps();
        if laps > self.laps_seen {
            let took = self.lap_started.elapsed().as_secs_f64();
            m.lap_seconds.set(took);
            lock(&self.admin.info).lap_seconds = Some(took);
            self.lap_started = Instant::now();
            self.laps_seen = laps;
        }
        let sizes = self.export_state_sizes();
        self.export_api_outages();
        let mut info = lock(&self.admin.info);
        info.eligible_nodes = eligible.iter().cloned().collect();
        info.skipped_nodes = skipped;
        info.lap = self.rotation.lap();
        info.lap_expected_seconds = Some(expected);
        info.state_entries = sizes
            .into_iter()
            .map(|(k, v)| (k.to_string(), v as u64))
            .collect();
        eligible
    }

    /// Forgets what the loop keeps of nodes not in `names_now` (Event limits, baselines,
    /// agent rings, recreate slots).
    fn prune_departed(&self, names_now: &BTreeSet<String>) {
        let keep = |n: &str| names_now.contains(n);
        lock(&self.limiter).prune(keep, Instant::now());
        if let Some(b) = lock(&self.admin.baselines).as_mut() {
            for gone in self.known_nodes.iter().filter(|n| !keep(n)) {
                b.forget_node(gone);
            }
        }
        self.agents.forget_nodes(keep);
        let slot_names: HashSet<String> = names_now
            .iter()
            .map(|n| recreate_target_name(&self.instance, n))
            .collect();
        self.env
            .prune_recreate_slots(|name| slot_names.contains(name));
    }

    /// `firstpacket_state_entries` / `firstpacket_state_bound` of every bounded
    /// structure (bounds: [`crate::bounds`]); returns the sizes.
    fn export_state_sizes(&mut self) -> Vec<(&'static str, usize)> {
        let mut sizes = state_sizes(
            &self.admin,
            &self.env,
            &self.agents,
            &self.limiter,
            &self.rotation,
            self.known_nodes.len(),
        );
        sizes.push(("pending_blames", lock(&self.pending).len()));
        sizes.push((
            "baseline_samples",
            lock(&self.admin.baselines).as_ref().map_or(0, |b| b.len()),
        ));
        self.admin.sync_drift(unix_now());
        sizes.push(("api_outages", self.conn_health.len()));
        self.bound_inputs.nodes = self.known_nodes.len();
        let m = &self.admin.metrics;
        for (k, v) in &sizes {
            m.state_entries
                .with_label_values(&[k])
                .set(i64::try_from(*v).unwrap_or(i64::MAX));
            if let Some(b) = crate::bounds::bound(k, self.bound_inputs) {
                m.state_bound
                    .with_label_values(&[k])
                    .set(i64::try_from(b).unwrap_or(i64::MAX));
            }
        }
        sizes
    }

    /// The API outage counters follow the connection's monotonic totals.
    fn export_api_outages(&self) {
        let (outages, outage_seconds) = self.conn_health.totals();
        let m = &self.admin.metrics;
        m.api_outages
            .inc_by(outages.saturating_sub(m.api_outages.get()));
        let more = outage_seconds - m.api_outage_seconds.get();
        if more > 0.0 {
            m.api_outage_seconds.inc_by(more);
        }
    }

    /// Starts the rotation's next probe among `eligible`, if there is room, a term, and
    /// a pair to probe.
    fn start_probe(&mut self, eligible: &BTreeSet<String>) {
        if !self.has_room() {
            return;
        }
        let Some(term_cancel) = self.term.as_ref().map(|t| t.1.clone()) else {
            return;
        };
        let Some(next) = self.rotation.next(eligible) else {
            tracing::debug!(eligible = eligible.len(), "no pair to probe now");
            return;
        };
        self.counter += 1;
        let plan = probe_plan(
            &self.instance,
            &self.tag,
            self.counter,
            &next,
            self.p.burst_size,
        );
        lock(&self.in_flight_ids).insert(plan.id.clone());
        self.admin.metrics.in_flight.inc();
        if let Some(why) = &next.trigger {
            tracing::info!(probe_id = %plan.id, src_node = %plan.source_node, dst_node = %plan.target_node, trigger = %why, "change-triggered probe");
        }
        let task = ProbeTask {
            env: self.env.clone(),
            admin: self.admin.clone(),
            limiter: self.limiter.clone(),
            pending: self.pending.clone(),
            node_set: self.node_set.clone(),
            in_flight_ids: self.in_flight_ids.clone(),
            client: self.client.clone(),
            instance: self.instance.clone(),
            console: self.console,
        };
        self.set.spawn(task.run(plan, term_cancel));
    }
}

/// Wall time now, Unix seconds.
fn unix_now() -> f64 {
    Timestamp::now().as_millisecond() as f64 / 1000.0
}

/// The baseline settings from `prober run`'s flags. Errors: a zero window
/// ([`Error::Config`] naming the flag).
pub fn drift_config(args: &RunArgs) -> Result<crate::baseline::DriftConfig, Error> {
    for (flag, d) in [
        ("--baseline-window", args.baseline_window),
        ("--recent-window", args.recent_window),
        ("--baseline-save-interval", args.baseline_save_interval),
    ] {
        if d.is_zero() {
            return Err(Error::Config {
                flag,
                message: "must be more than 0s".into(),
            });
        }
    }
    if args.baseline_save_interval < Duration::from_secs(1) {
        // Each save is an API write of up to a few hundred KiB.
        return Err(Error::Config {
            flag: "--baseline-save-interval",
            message: format!(
                "{} is under 1s (each save writes the ConfigMap; the default is 5m)",
                humantime::format_duration(args.baseline_save_interval)
            ),
        });
    }
    Ok(crate::baseline::DriftConfig {
        baseline_window: args.baseline_window,
        recent_window: args.recent_window,
        min_samples: usize::try_from(args.drift.baseline_min_samples).unwrap_or(usize::MAX),
        ratio: args.drift.drift_ratio,
        floor: args.drift.drift_floor.as_secs_f64(),
        dial_interval: args.probe.dial_interval.as_secs_f64(),
        static_baseline: args.baseline_ttfp.map(|d| d.as_secs_f64()),
    })
}

impl BaselineStore {
    /// The store of the learned baseline in the ConfigMap `--baseline-configmap` of the
    /// probe namespace, for `kinds`; nothing read or saved yet.
    fn new(
        client: &kube::Client,
        args: &RunArgs,
        instance: &str,
        admin: Arc<AdminState>,
        cfg: crate::baseline::DriftConfig,
        kinds: &[crate::kind::ProbeKind],
    ) -> BaselineStore {
        BaselineStore {
            api: Api::namespaced(client.clone(), &args.probe.namespace),
            name: args.baseline_configmap.clone(),
            instance: instance.to_owned(),
            admin,
            cfg,
            saved: AtomicU64::new(0),
            saving: AtomicBool::new(false),
            read: AtomicBool::new(false),
            kinds: kinds.iter().map(|k| k.as_str().to_string()).collect(),
        }
    }
}

/// The baseline ConfigMap of this run ([`crate::baseline_store`]).
struct BaselineStore {
    api: Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: String,
    instance: String,
    admin: Arc<AdminState>,
    cfg: crate::baseline::DriftConfig,
    /// `Baselines::added` at the last write.
    saved: AtomicU64,
    /// A write is under way (the next tick skips rather than overlap it).
    saving: AtomicBool,
    /// The stored baseline was read (or found missing, or unusable) this term: until it
    /// was, nothing is written, so a refused or unanswered `get` never lets what was
    /// learned since start overwrite a day of baseline.
    read: AtomicBool,
    /// The run's probe kinds: a stored kind outside them is not restored.
    kinds: Vec<String>,
}

impl BaselineStore {
    /// Replaces the in-memory baseline with the persisted one (a term's start). A
    /// missing ConfigMap keeps what is held; an unusable one (not a snapshot this prober
    /// reads) is logged and later overwritten; a refused or unanswered `get` is logged,
    /// and the read is retried before each write ([`Self::write`]).
    async fn load(&self) {
        self.read.store(false, Ordering::Relaxed);
        self.read_stored(true, crate::api::API_CALL_TIMEOUT).await;
    }

    /// One read of the stored baseline: `replace` puts it in place of what is held, else
    /// its samples older than what is held are added ([`crate::baseline::Baselines::restore`]).
    /// Kinds outside the run's `--kinds` are dropped. Sets `read` unless the API refused
    /// or did not answer within `within`.
    async fn read_stored(&self, replace: bool, within: Duration) {
        let got =
            tokio::time::timeout(within, crate::baseline_store::load(&self.api, &self.name)).await;
        match got {
            Ok(Ok(Some(mut snap))) => {
                let dropped: Vec<String> = snap
                    .kinds
                    .keys()
                    .filter(|k| !self.kinds.contains(k))
                    .cloned()
                    .collect();
                if !dropped.is_empty() {
                    tracing::warn!(configmap = %self.name, kinds = ?dropped, "baseline kinds this run does not probe (--kinds): not restored");
                    snap.kinds.retain(|k, _| self.kinds.contains(k));
                }
                let mut b = lock(&self.admin.baselines);
                // Into what is held (a merge), or into a new one that replaces it.
                let restored = match b.as_mut() {
                    Some(held) if !replace => held.restore(&snap, unix_now()).map(|n| (n, None)),
                    _ => {
                        let mut fresh = crate::baseline::Baselines::new(self.cfg);
                        fresh.restore(&snap, unix_now()).map(|n| (n, Some(fresh)))
                    }
                };
                match restored {
                    Ok((n, fresh)) => {
                        tracing::info!(configmap = %self.name, samples = n, "baseline restored");
                        self.saved.store(0, Ordering::Relaxed);
                        if fresh.is_some() {
                            *b = fresh;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(configmap = %self.name, error = %e, "baseline ConfigMap not used (it is overwritten at the next save)")
                    }
                }
                self.read.store(true, Ordering::Relaxed);
            }
            Ok(Ok(None)) => {
                tracing::info!(configmap = %self.name, "no baseline saved yet: learning from scratch");
                self.read.store(true, Ordering::Relaxed);
            }
            Ok(Err(e @ crate::baseline_store::LoadError::Bad { .. })) => {
                tracing::warn!(error = %e, "baseline ConfigMap unusable: learning from scratch (it is overwritten at the next save)");
                self.read.store(true, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the baseline: learning meanwhile; nothing is written until a read succeeds (retried at each save)")
            }
            Err(_) => {
                tracing::warn!(configmap = %self.name, "get configmaps: no answer: learning meanwhile; nothing is written until a read succeeds (retried at each save)")
            }
        }
    }

    /// Writes the baseline when samples were added since the last write, waiting at
    /// most `within` for the API; skipped while another write is under way.
    async fn save_if_learned(&self, within: Duration) {
        if self.saving.swap(true, Ordering::AcqRel) {
            return;
        }
        self.write(within).await;
        self.saving.store(false, Ordering::Release);
    }

    async fn write(&self, within: Duration) {
        if !self.read.load(Ordering::Relaxed) {
            // The stored baseline was never read: read it now, adding its samples to what
            // was learned meanwhile, and write only once that worked.
            self.read_stored(false, within).await;
            if !self.read.load(Ordering::Relaxed) {
                return;
            }
        }
        let snap = {
            let b = lock(&self.admin.baselines);
            match b.as_ref() {
                Some(b) if b.added() != self.saved.load(Ordering::Relaxed) => {
                    Some((b.snapshot(unix_now()), b.added()))
                }
                _ => None,
            }
        };
        let Some((snap, added)) = snap else {
            return;
        };
        let r = tokio::time::timeout(
            within,
            crate::baseline_store::save(&self.api, &self.name, &self.instance, &snap),
        )
        .await;
        let ok = match r {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(configmap = %self.name, error = %crate::error::kube_error_text(&e), "cannot write the baseline ConfigMap (the error names the refused verb); retried at the next save");
                false
            }
            Err(_) => {
                tracing::warn!(configmap = %self.name, "patch configmaps: no answer; the baseline is written at the next save");
                false
            }
        };
        if ok {
            self.saved.store(added, Ordering::Relaxed);
        }
        self.admin
            .metrics
            .baseline_writes
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }
}

/// The next status of the election, once it changed (never, without one).
async fn leadership_changed(
    rx: &mut Option<watch::Receiver<crate::leader::Leadership>>,
) -> Option<crate::leader::Leadership> {
    match rx {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(rx.borrow_and_update().clone()),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// The cancel channel of leadership term `n`: set (so the term's probes stop and delete
/// their pods) when the election leaves the term — not leading, or a later term — or
/// on shutdown (`shutdown` true). Sets `firstpacket_leader` to 0 when leadership was
/// lost. One task per term, ending with it.
fn spawn_term(
    n: u64,
    mut shutdown: watch::Receiver<bool>,
    status: Option<watch::Receiver<crate::leader::Leadership>>,
    admin: Arc<AdminState>,
) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let Some(mut status) = status else {
        return shutdown;
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.wait_for(|c| *c) => {}
            r = status.wait_for(|s| !s.leading || s.terms != n) => {
                let lost = r.is_ok_and(|s| !s.leading);
                // Cancel first: once the gauge says 0, no probe of the term creates a pod.
                tx.send_replace(true);
                if lost {
                    admin.metrics.leader.set(0);
                }
                return;
            }
        }
        tx.send_replace(true);
    });
    rx
}

fn state_sizes(
    admin: &AdminState,
    env: &ProbeEnv,
    agents: &crate::agents::scrape::AgentWatcher,
    limiter: &Mutex<EventLimiter>,
    rotation: &Rotation,
    nodes: usize,
) -> Vec<(&'static str, usize)> {
    let (tracked, forgotten) = env.watch.with_tracker(|t| (t.len(), t.forgotten_len()));
    let mut v = vec![
        ("recent_records", admin.recent_len()),
        ("tracked_pods", tracked),
        ("forgotten_pod_uids", forgotten),
        ("recreate_slots", env.recreate_slot_count()),
        ("event_limits", lock(limiter).len()),
        ("queued_triggers", rotation.queued()),
        ("nodes", nodes),
        ("agent_warnings", lock(&env.agent_warnings).len()),
    ];
    v.extend(agents.state_sizes());
    v
}

/// The probe for `next`: id `<instance suffix>-<incarnation tag>-<n>` (the tag keeps
/// the pod names of a restarted container apart from its previous incarnation's, which
/// share the instance), never a kept target (no later probe is known in advance),
/// fillers only for `burst`.
pub fn probe_plan(
    instance: &str,
    tag: &str,
    n: u64,
    next: &NextProbe,
    burst_size: u32,
) -> ProbePlan {
    let suffix = instance.rsplit('-').next().unwrap_or(instance);
    ProbePlan {
        id: format!("{suffix}-{tag}-{n}"),
        kind: next.kind,
        source_node: next.source.clone(),
        target_node: next.target.clone(),
        keep_target: false,
        burst_size: if next.kind == crate::kind::ProbeKind::Burst {
            burst_size
        } else {
            0
        },
    }
}

struct ProbeTask {
    env: Arc<ProbeEnv>,
    admin: Arc<AdminState>,
    limiter: Arc<Mutex<EventLimiter>>,
    pending: Arc<Mutex<PendingBlames>>,
    node_set: Arc<Mutex<NodeSet>>,
    in_flight_ids: Arc<Mutex<HashSet<String>>>,
    client: kube::Client,
    instance: String,
    console: Console,
}

impl ProbeTask {
    async fn run(self, plan: ProbePlan, cancel: watch::Receiver<bool>) {
        let id = plan.id.clone();
        let rec = run_probe(self.env.clone(), plan, cancel).await;
        let now_unix = Timestamp::now().as_millisecond() as f64 / 1000.0;
        let n = self.admin.record(rec.clone(), now_unix);
        self.console.run_probe_done(n, &rec);
        self.admin.metrics.in_flight.dec();
        lock(&self.in_flight_ids).remove(&id);
        // Agent findings on probes with normal TTFP: logged once each, not kept.
        let warnings = std::mem::take(&mut *lock(&self.env.agent_warnings));
        for w in warnings {
            tracing::warn!(node = %w.node, signal = w.signal.as_str(), "node-agent warning");
        }
        // Node Events: decide the blame now, or once later probes tell the sides apart.
        let new = event_reason(rec.result).map(|_| (rec.clone(), n));
        let decided = {
            let recent: Vec<_> = lock(&self.admin.recent).records.iter().cloned().collect();
            lock(&self.pending).decide(new, &recent, n)
        };
        for (rec, nodes) in decided {
            let Some(reason) = event_reason(rec.result) else {
                continue;
            };
            for node in nodes {
                let uid = lock(&self.node_set)
                    .nodes
                    .get(&node)
                    .and_then(|(_, u)| u.clone());
                if !lock(&self.limiter).allow(&node, reason, Instant::now()) {
                    continue;
                }
                let ev = node_event(
                    &node,
                    uid.as_deref(),
                    reason,
                    event_message(&rec, &node),
                    &self.instance,
                    Timestamp::now(),
                );
                if post_event(&self.client, &ev).await {
                    self.admin
                        .metrics
                        .node_events
                        .with_label_values(&[reason])
                        .inc();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(flags: &[&str]) -> RunArgs {
        use clap::Parser;
        let mut argv = vec!["prober", "run"];
        argv.extend_from_slice(flags);
        match crate::config::Cli::try_parse_from(argv)
            .expect("parse")
            .command
        {
            crate::config::Command::Run(r) => r,
            _ => panic!("not run"),
        }
    }

    #[test]
    fn self_defeating_run_settings_warn_and_a_sub_second_save_interval_is_refused() {
        use crate::settings::questionable_run_settings;
        assert!(questionable_run_settings(&run_args(&[])).is_empty());
        // The probe flags' warning is the gate's too.
        let w =
            questionable_run_settings(&run_args(&["--attempt-timeout", "10s", "--give-up", "2s"]));
        assert_eq!(
            w.iter().map(|x| x.0).collect::<Vec<_>>(),
            ["--attempt-timeout"]
        );
        let w = questionable_run_settings(&run_args(&["--recent-window", "1m"]));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, "--recent-window");
        assert!(w[0].1.contains("never reported"), "{w:?}");
        let w = questionable_run_settings(&run_args(&["--baseline-window", "5m"]));
        assert_eq!(
            w.iter().map(|x| x.0).collect::<Vec<_>>(),
            ["--baseline-window"]
        );
        // A static baseline needs no learning.
        let w = questionable_run_settings(&run_args(&[
            "--baseline-window",
            "5m",
            "--baseline-ttfp",
            "1s",
        ]));
        assert!(w.is_empty(), "{w:?}");
        let e = drift_config(&run_args(&["--baseline-save-interval", "1ns"])).unwrap_err();
        assert!(e.to_string().contains("--baseline-save-interval"), "{e}");
        assert!(drift_config(&run_args(&["--baseline-save-interval", "1s"])).is_ok());
    }

    #[test]
    fn owner_only_in_the_probe_namespace_and_instance_follows_the_pod_uid() {
        let env = |ns: &'static str| {
            move |k: &str| match k {
                "POD_NAME" => Some("prober-7d9".to_string()),
                "POD_UID" => Some("3F2A1B4C-0000-1111-2222-333344445555".to_string()),
                "POD_NAMESPACE" => Some(ns.to_string()),
                _ => None,
            }
        };
        let o = owner_from_env("firstpacket", env("firstpacket")).expect("owner");
        assert_eq!((o.kind.as_str(), o.name.as_str()), ("Pod", "prober-7d9"));
        assert_eq!(run_instance(Some(&o)), "run-3f2a1b4c");
        assert!(owner_from_env("firstpacket", env("monitoring")).is_none());
        assert!(owner_from_env("firstpacket", |_| None).is_none());
        let random = run_instance(None);
        assert!(random.starts_with("run-") && random.len() == 12, "{random}");
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let i = Duration::from_secs(30);
        assert_eq!(jittered(i, 0.0), Duration::from_secs(24));
        assert_eq!(jittered(i, 1.0), Duration::from_secs(36));
        assert_eq!(jittered(i, 0.5), i);
        assert_eq!(jittered(i, 7.0), Duration::from_secs(36));
    }

    #[test]
    fn run_probe_ids_are_unique_and_never_keep_a_target() {
        let next = NextProbe {
            kind: crate::kind::ProbeKind::Recreate,
            source: "a".into(),
            target: "b".into(),
            lap: Some(1),
            trigger: None,
        };
        let p = probe_plan("run-abcd1234", "x7q", 17, &next, 10);
        assert_eq!(p.id, "abcd1234-x7q-17");
        assert!(!p.keep_target);
        assert_eq!(p.burst_size, 0);
    }
}
