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
use crate::engine::{delete_instance_pods, final_cleanup_within, Signals};
use crate::error::Error;
use crate::events::{
    event_message, event_reason, node_event, post_event, EventLimiter, PendingBlames,
};
use crate::metrics::Metrics;
use crate::podspec::{recreate_target_name, PodConfig, LABEL_PROBE_ID};
use crate::probe::{run_probe, EngineFault, ProbeEnv, ProbePlan};
use crate::rotation::{agent_changes, became_eligible, AgentSnapshot, NextProbe, Rotation};
use crate::schedule::{check_node, NodeInfo};
use crate::sync::lock;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams};
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

/// Deletes the instance's pods and Services whose `firstpacket.io/probe-id` is not in
/// `live` (leftovers of probes that could not delete them; 404 is fine: the probe's own
/// cleanup won the race). Returns the deletes that took effect; other API errors are
/// returned (the caller retries at the next [`JANITOR_INTERVAL`]).
pub async fn delete_orphans(
    pods: &Api<Pod>,
    instance: &str,
    live: &HashSet<String>,
) -> Result<usize, kube::Error> {
    let lp = ListParams::default().labels(&crate::podspec::instance_selector(instance));
    let services: Api<Service> = Api::namespaced(
        pods.clone().into_client(),
        pods.namespace().unwrap_or_default(),
    );
    let n = delete_unlisted(
        pods,
        &lp,
        &DeleteParams::default().grace_period(0),
        live,
        "pod",
    )
    .await?;
    Ok(n + delete_unlisted(&services, &lp, &DeleteParams::default(), live, "Service").await?)
}

/// [`delete_orphans`] for one resource: deletes the objects `lp` lists whose probe id is
/// not in `live`; 404 counts as done. Returns the deletes that took effect.
async fn delete_unlisted<K>(
    api: &Api<K>,
    lp: &ListParams,
    dp: &DeleteParams,
    live: &HashSet<String>,
    what: &str,
) -> Result<usize, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut n = 0;
    for obj in api.list(lp).await?.items {
        let meta = obj.meta();
        let id = meta.labels.as_ref().and_then(|l| l.get(LABEL_PROBE_ID));
        if id.is_some_and(|id| live.contains(id)) {
            continue;
        }
        if let Some(name) = meta.name.as_deref() {
            tracing::info!(name = %name, kind = what, "deleting leftover probe object");
            match api.delete(name, dp).await {
                Ok(_) => n += 1,
                Err(e) if crate::error::kube_status_code(&e) == Some(404) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

/// Runs `prober run` until a signal. Returns the exit code: 0 after a SIGTERM/SIGINT
/// handled within [`SHUTDOWN_GRACE`], 2 after a second signal. Start-up errors (config,
/// `--admin-addr` cannot be bound, API unreachable/forbidden, pod watch never ready) are
/// returned as [`Error`].
pub async fn run_continuous(args: RunArgs) -> Result<i32, Error> {
    let p = args.probe.clone();
    let console = Console::new(p.log_format);
    let kinds = check_kinds(&p.kinds)?;
    if args.probe_interval.is_zero() {
        return Err(Error::Config {
            flag: "--probe-interval",
            message: "must be more than 0s".into(),
        });
    }
    let drift_cfg = drift_config(&args)?;
    for (flag, message) in questionable_run_settings(&args) {
        console.setting_warning(flag, &message);
    }
    if args.leader_elect {
        crate::leader::validate(
            args.leader_elect_lease_duration,
            args.leader_elect_renew_deadline,
            args.leader_elect_retry_period,
        )?;
    }
    let profiles = crate::engine::load_profiles(&p)?;
    let n_profiles = profiles.len();
    let hold = p.hold_or(RUN_DEFAULT_HOLD);
    let owner = owner_from_env(&p.namespace, |k| std::env::var(k).ok());
    let instance = run_instance(owner.as_ref());
    let seed: u64 = rand::rng().random();
    let tag = crate::gate_run::random_suffix(3);

    let admin = Arc::new(AdminState::new(
        Metrics::new(&kinds),
        RunInfo {
            instance: instance.clone(),
            probe_interval_seconds: args.probe_interval.as_secs_f64(),
            concurrency: p.concurrency,
            slow_threshold_seconds: p.slow_threshold.as_secs_f64(),
            ..Default::default()
        },
    ));
    // Without --leader-elect this replica always probes; with it, it starts as a standby.
    admin.metrics.leader.set(i64::from(!args.leader_elect));
    *lock(&admin.baselines) = Some(crate::baseline::Baselines::new(drift_cfg));
    admin.metrics.drift_threshold_ratio.set(drift_cfg.ratio);
    admin.metrics.drift_floor_seconds.set(drift_cfg.floor);
    let listener = tokio::net::TcpListener::bind(&args.admin_addr)
        .await
        .map_err(|e| Error::Config {
            flag: "--admin-addr",
            message: format!("cannot listen on {}: {e}", args.admin_addr),
        })?;
    console.run_started(
        &instance,
        &args.admin_addr,
        args.probe_interval.as_secs_f64(),
        p.concurrency,
    );
    let server = {
        let router = crate::admin::router(admin.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "admin server failed");
            }
        })
    };

    let conn_health = crate::apihealth::ApiHealth::new(Some(console));
    let conn = crate::engine::connect_with(
        p.kubeconfig.as_deref(),
        p.context.as_deref(),
        conn_health.clone(),
    )
    .await?;
    let _pings = crate::apihealth::spawn_recovery_pings(conn.client.clone(), conn_health.clone());
    let url = conn.url.clone();
    let started = crate::engine::start(&conn, &p, &instance, hold, profiles, console, true).await?;
    admin.ready.store(true, Ordering::Relaxed);
    let pods = started.pods.clone();
    // A previous incarnation of this instance (the container restarted in the same
    // pod): its probe pods are ours by name but no probe of ours owns them.
    match delete_instance_pods(&pods, &instance, &url).await {
        Ok(n) if n > 0 => {
            tracing::info!(deleted = n, "deleted the previous incarnation's probe pods");
            // Their late watch events must not land on this incarnation's pods.
            started.watch.with_tracker(|t| t.forget_all());
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot delete the previous incarnation's probe pods"),
    }
    let agents = Arc::new(started.agents);
    let (lease, reaper_task) = (started.lease, started.reaper);
    let nodes_api: Api<Node> = Api::all(conn.client.clone());
    let on_fault: crate::probe::FaultSink = {
        let admin = admin.clone();
        let instance = instance.clone();
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
    };
    let env = Arc::new(ProbeEnv {
        pods: pods.clone(),
        nodes: nodes_api.clone(),
        url: url.clone(),
        pod_config: PodConfig::from_args(&p, &instance, hold, owner),
        watch: started.watch.clone(),
        slow_threshold: p.slow_threshold,
        writes: AtomicU64::new(0),
        on_fault,
        recreate_slots: Mutex::new(Default::default()),
        agents: Some(agents.clone()),
        agent_warnings: Mutex::new(Vec::new()),
    });

    let node_set = Arc::new(Mutex::new(NodeSet::default()));
    let (node_tx, mut node_rx) = mpsc::unbounded_channel();
    let node_task = spawn_node_watch(nodes_api, p.clone(), node_set.clone(), node_tx);
    // Wait (bounded) for the first node list.
    let deadline = Instant::now() + crate::engine::WATCH_READY_TIMEOUT;
    while !lock(&node_set).synced && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    {
        let eligible = lock(&node_set).eligible(&p);
        let names: Vec<String> = eligible.iter().cloned().collect();
        for n in &names {
            admin.metrics.node_added(n);
        }
        agents.prime(&names).await;
    }

    let Some(mut signals) = Signals::install() else {
        return Err(Error::Config {
            flag: "signals",
            message: "cannot install SIGINT/SIGTERM handlers".into(),
        });
    };
    let (cancel_tx, cancel_rx) = watch::channel(false);
    // Leader election: probes start only within a term; each term has its own cancel
    // channel, set when the term ends or on shutdown.
    let leader = args.leader_elect.then(|| {
        let cfg = crate::leader::LeaderConfig {
            namespace: p.namespace.clone(),
            lease_name: args.leader_elect_lease_name.clone(),
            identity: crate::leader::identity(
                |k| std::env::var(k).ok(),
                &crate::leader::hostname(),
                &instance,
            ),
            lease_duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
        };
        crate::leader::spawn(conn.client.clone(), &url, cfg)
    });
    let mut leader_rx = leader.as_ref().map(|h| h.status.clone());
    if let Some(rx) = &leader_rx {
        lock(&admin.info).leadership = rx.borrow().clone();
    }
    // The current term: its number and cancel receiver (without --leader-elect, one
    // endless term cancelled only on shutdown).
    let mut term: Option<(u64, watch::Receiver<bool>)> =
        (!args.leader_elect).then(|| (0, cancel_rx.clone()));
    let limiter = Arc::new(Mutex::new(EventLimiter::new(crate::events::EVENT_WINDOW)));
    let pending = Arc::new(Mutex::new(PendingBlames::default()));
    let in_flight_ids: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(HashSet::new()));
    let mut rotation = Rotation::new(kinds.clone(), seed);
    let mut set: JoinSet<()> = JoinSet::new();
    let mut counter: u64 = 0;
    let mut known_nodes: BTreeSet<String> = lock(&node_set).nodes.keys().cloned().collect();
    let mut agent_prev = agent_snapshot(&agents);
    let mut agent_tick = tokio::time::interval(AGENT_POLL);
    let mut janitor_tick = tokio::time::interval(JANITOR_INTERVAL);
    janitor_tick.tick().await;
    let mut lap_started = Instant::now();
    let mut laps_seen = 0u64;
    let mut next_probe = tokio::time::Instant::now();
    let mut announced: Option<bool> = None;
    let concurrency = p.concurrency as usize;
    let cm_api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(conn.client.clone(), &p.namespace);
    let store = Arc::new(BaselineStore {
        api: cm_api,
        name: args.baseline_configmap.clone(),
        instance: instance.clone(),
        admin: admin.clone(),
        cfg: drift_cfg,
        saved: AtomicU64::new(0),
        saving: AtomicBool::new(false),
        read: AtomicBool::new(false),
        kinds: kinds.iter().map(|k| k.as_str().to_string()).collect(),
    });
    if term.is_some() {
        store.load().await;
    }
    let mut baseline_tick = tokio::time::interval(args.baseline_save_interval);
    baseline_tick.tick().await;

    let signal = loop {
        // Reap finished probes.
        while set.try_join_next().is_some() {}
        let mut start_now = false;
        tokio::select! {
            _ = tokio::time::sleep_until(next_probe) => {
                start_now = true;
                next_probe = tokio::time::Instant::now()
                    + jittered(args.probe_interval, rand::rng().random::<f64>());
            }
            Some(change) = node_rx.recv() => match change {
                NodeChange::Eligible(node, why) => {
                    tracing::info!(node = %node, change = why, "node changed: probing it next");
                    admin.metrics.node_added(&node);
                    rotation.prioritise(&node, &format!("node {node} {why}"));
                    start_now = set.len() < concurrency;
                }
                NodeChange::Gone(node) => {
                    tracing::info!(node = %node, "node gone: pruning its state");
                    admin.metrics.node_removed(&node);
                }
            },
            _ = agent_tick.tick() => {
                let now = agent_snapshot(&agents);
                for (node, why) in agent_changes(&agent_prev, &now, false) {
                    if lock(&node_set).nodes.contains_key(&node) {
                        tracing::info!(node = %node, change = %why, "agent changed: probing the node next");
                        rotation.prioritise(&node, &format!("{why} on {node}"));
                        start_now = set.len() < concurrency;
                    }
                }
                agent_prev = now;
                admin.metrics.sync_agent_scrapes(&agents.scrape_counts());
            }
            _ = janitor_tick.tick() => {
                let live = lock(&in_flight_ids).clone();
                match tokio::time::timeout(crate::probe::API_CALL_TIMEOUT, delete_orphans(&pods, &instance, &live)).await {
                    Ok(Ok(n)) if n > 0 => tracing::info!(deleted = n, "deleted leftover probe objects"),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %crate::error::kube_error_text(&e), "leftover cleanup failed; retried later"),
                    Err(_) => tracing::warn!("leftover cleanup got no answer; retried later"),
                }
            }
            _ = baseline_tick.tick() => {
                // In the background: a slow API must not hold up the loop.
                if term.is_some() {
                    let store = store.clone();
                    tokio::spawn(async move { store.save_if_learned(crate::probe::API_CALL_TIMEOUT).await });
                }
            }
            Some(st) = leadership_changed(&mut leader_rx) => {
                lock(&admin.info).leadership = st.clone();
                if st.leading && term.as_ref().map(|t| t.0) != Some(st.terms) {
                    // A new term starts from the latest persisted baseline (the
                    // previous leader's, or ours from before).
                    {
                        let store = store.clone();
                        tokio::spawn(async move { store.load().await });
                    }
                    term = Some((st.terms, spawn_term(st.terms, cancel_rx.clone(), leader_rx.clone(), admin.clone())));
                    start_now = set.len() < concurrency;
                    next_probe = tokio::time::Instant::now()
                        + jittered(args.probe_interval, rand::rng().random::<f64>());
                } else if !st.leading {
                    // The term's task cancelled its probes already; nothing new starts.
                    term = None;
                }
                if announced != Some(st.leading) {
                    announced = Some(st.leading);
                    console.leadership(st.leading, &st.identity, &st.lease, st.holder.as_deref());
                }
            }
            name = signals.next() => break name,
        }
        // Probes start only while the term lasts (the election may have ended it since).
        let leading_now = leader_rx.as_ref().is_none_or(|rx| {
            let st = rx.borrow();
            st.leading && term.as_ref().is_some_and(|t| t.0 == st.terms)
        });
        admin.metrics.leader.set(i64::from(leading_now));

        // Bookkeeping: live node set, pruning, sizes.
        let (eligible, skipped, names_now) = {
            let s = lock(&node_set);
            (
                s.eligible(&p),
                s.skipped(&p),
                s.nodes.keys().cloned().collect::<BTreeSet<String>>(),
            )
        };
        if names_now != known_nodes {
            let keep = |n: &str| names_now.contains(n);
            let now = Instant::now();
            lock(&limiter).prune(keep, now);
            if let Some(b) = lock(&admin.baselines).as_mut() {
                for gone in known_nodes.iter().filter(|n| !keep(n)) {
                    b.forget_node(gone);
                }
            }
            agents.forget_nodes(keep);
            let slot_names: HashSet<String> = names_now
                .iter()
                .map(|n| recreate_target_name(&instance, n))
                .collect();
            env.prune_recreate_slots(|name| slot_names.contains(name));
            known_nodes = names_now;
        }
        admin
            .metrics
            .eligible_nodes
            .set(i64::try_from(eligible.len()).unwrap_or(i64::MAX));
        let expected = eligible.len() as f64 * args.probe_interval.as_secs_f64();
        admin.metrics.lap_expected_seconds.set(expected);
        let laps = rotation.completed_laps();
        if laps > laps_seen {
            let took = lap_started.elapsed().as_secs_f64();
            admin.metrics.lap_seconds.set(took);
            lock(&admin.info).lap_seconds = Some(took);
            lap_started = Instant::now();
            laps_seen = laps;
        }
        let mut sizes = state_sizes(
            &admin,
            &env,
            &agents,
            &limiter,
            &rotation,
            known_nodes.len(),
        );
        sizes.push(("pending_blames", lock(&pending).len()));
        sizes.push((
            "baseline_samples",
            lock(&admin.baselines).as_ref().map_or(0, |b| b.len()),
        ));
        admin.sync_drift(unix_now());
        sizes.push(("api_outages", conn_health.len()));
        let bound_inputs = crate::bounds::BoundInputs {
            nodes: known_nodes.len(),
            concurrency,
            burst_size: p.burst_size as usize,
            profiles: n_profiles,
            kinds: kinds.len(),
        };
        for (k, v) in &sizes {
            admin
                .metrics
                .state_entries
                .with_label_values(&[k])
                .set(i64::try_from(*v).unwrap_or(i64::MAX));
            if let Some(b) = crate::bounds::bound(k, bound_inputs) {
                admin
                    .metrics
                    .state_bound
                    .with_label_values(&[k])
                    .set(i64::try_from(b).unwrap_or(i64::MAX));
            }
        }
        let (outages, outage_seconds) = conn_health.totals();
        // Counters follow the monotonic totals.
        let m = &admin.metrics;
        m.api_outages
            .inc_by(outages.saturating_sub(m.api_outages.get()));
        let more = outage_seconds - m.api_outage_seconds.get();
        if more > 0.0 {
            m.api_outage_seconds.inc_by(more);
        }
        {
            let mut info = lock(&admin.info);
            info.eligible_nodes = eligible.iter().cloned().collect();
            info.skipped_nodes = skipped;
            info.lap = rotation.lap();
            info.lap_expected_seconds = Some(expected);
            info.state_entries = sizes
                .into_iter()
                .map(|(k, v)| (k.to_string(), v as u64))
                .collect();
        }

        if !start_now || set.len() >= concurrency || !leading_now {
            continue;
        }
        let Some(term_cancel) = term.as_ref().map(|t| t.1.clone()) else {
            continue;
        };
        let Some(next) = rotation.next(&eligible) else {
            tracing::debug!(eligible = eligible.len(), "no pair to probe now");
            continue;
        };
        counter += 1;
        let plan = probe_plan(&instance, &tag, counter, &next, p.burst_size);
        lock(&in_flight_ids).insert(plan.id.clone());
        admin.metrics.in_flight.inc();
        if let Some(why) = &next.trigger {
            tracing::info!(probe_id = %plan.id, src_node = %plan.source_node, dst_node = %plan.target_node, trigger = %why, "change-triggered probe");
        }
        let task = ProbeTask {
            env: env.clone(),
            admin: admin.clone(),
            limiter: limiter.clone(),
            pending: pending.clone(),
            node_set: node_set.clone(),
            in_flight_ids: in_flight_ids.clone(),
            client: conn.client.clone(),
            instance: instance.clone(),
            console,
        };
        set.spawn(task.run(plan, term_cancel));
    };

    // Shutdown: no new probes; cancel the running ones (they delete their pods).
    console.signal(signal);
    tracing::info!(
        signal,
        in_flight = set.len(),
        "stopping: no new probes, deleting the probes' pods"
    );
    cancel_tx.send_replace(true);
    let drained = tokio::select! {
        r = tokio::time::timeout(SHUTDOWN_GRACE, async { while set.join_next().await.is_some() {} }) => r.is_ok(),
        _ = signals.next() => {
            console.second_signal();
            let _ = tokio::time::timeout(Duration::from_secs(5), delete_instance_pods(&pods, &instance, &url)).await;
            server.abort();
            node_task.abort();
            reaper_task.abort();
            if let Some(h) = leader {
                h.release(Duration::from_secs(2)).await;
            }
            if let Some(l) = lease {
                l.release().await;
            }
            return Ok(2);
        }
    };
    if !drained {
        tracing::warn!("probes did not finish within the shutdown grace; deleting their pods");
        set.abort_all();
    }
    let code = match final_cleanup_within(&pods, &instance, &url, SHUTDOWN_CLEANUP).await {
        Ok(n) => {
            if n > 0 {
                tracing::info!(deleted = n, "deleted leftover probe pods");
            }
            0
        }
        Err(e) => {
            console.error(None, &e.to_string());
            0
        }
    };
    // The learned baseline, for the next incarnation or leader (only a replica that led
    // has learned anything worth keeping).
    if term.is_some() {
        store.save_if_learned(BASELINE_SHUTDOWN_SAVE).await;
    }
    // The probes ended and their pods are gone: hand the leadership over at once.
    if let Some(h) = leader {
        h.release(Duration::from_secs(5)).await;
    }
    server.abort();
    node_task.abort();
    reaper_task.abort();
    if let Some(l) = lease {
        l.release().await;
    }
    Ok(code)
}

/// Wall time now, Unix seconds.
fn unix_now() -> f64 {
    Timestamp::now().as_millisecond() as f64 / 1000.0
}

/// `prober run` settings that start but defeat themselves, as (flag, warning): a recent
/// window that cannot hold the 3 probes drift needs ([`crate::baseline::RECENT_MIN_SAMPLES`])
/// at `--probe-interval` (one probe start per interval, jittered by ±20 %), a baseline
/// window that cannot hold `--baseline-min-samples`.
pub fn questionable_run_settings(args: &RunArgs) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let interval = args.probe_interval.as_secs_f64();
    // One probe starts per --probe-interval, jittered by at most −20 %.
    let per_window = |w: Duration| w.as_secs_f64() / (0.8 * interval);
    let recent = per_window(args.recent_window);
    let need = crate::baseline::RECENT_MIN_SAMPLES as f64;
    if recent < need {
        out.push((
            "--recent-window",
            format!(
                "{} holds at most ~{recent:.1} probes at --probe-interval {}: drift needs {need} recent probes and is never reported",
                humantime::format_duration(args.recent_window),
                humantime::format_duration(args.probe_interval)
            ),
        ));
    }
    let base = per_window(args.baseline_window);
    let min = args.drift.baseline_min_samples as f64;
    if args.baseline_ttfp.is_none() && base < min {
        out.push((
            "--baseline-window",
            format!(
                "{} holds at most ~{base:.0} probes at --probe-interval {}, fewer than --baseline-min-samples {min}: no baseline is ever learned",
                humantime::format_duration(args.baseline_window),
                humantime::format_duration(args.probe_interval)
            ),
        ));
    }
    out
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
        self.read_stored(true, crate::probe::API_CALL_TIMEOUT).await;
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
        burst_size: if next.kind == crate::config::ProbeKind::Burst {
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
            tracing::warn!(node = %w.node, signal = %crate::metrics::signal_label(&w), "node-agent warning");
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
        assert!(questionable_run_settings(&run_args(&[])).is_empty());
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
            kind: crate::config::ProbeKind::Recreate,
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
