//! The simulated CNI agent, one per node (the testbed's Felix): it decides **when** a new
//! endpoint is programmed, i.e. when its IP enters the node's nftables allow set so
//! forwarded traffic to/from the pod flows (docs/design.md §5 "Programmed"), carries out every
//! fault primitive of docs/design.md §5 ([`crate::fault`]) and keeps Felix-compatible metrics
//! ([`crate::felix`]).
//!
//! Life of an endpoint:
//! 1. the kubelet calls [`Agent::endpoint_added`] right after
//!    [`Dataplane::add_pod`](crate::dataplane::Dataplane::add_pod) (the node-side /32
//!    route is already in): truth `endpoint_added`; the node's faults for that moment
//!    are resolved ([`FaultFile::for_node`]); `name_reuse_race` (the interface name was
//!    used on this node before) removes the /32 route for good (truth `route_removed`);
//!    `stale_routes` blackholes the IP on k other nodes (truth `peer_route_removed`);
//! 2. the agent draws `never_program`, samples `program_delay`, waits until
//!    `endpoint_added + delay`, then until the next open `resync_loop` window if set;
//! 3. it takes the node's apply loop (one apply at a time, as Felix's single dataplane
//!    goroutine), spends `queue.per_endpoint` and pads to `agent.apply_time_floor`,
//!    adds the IP to the allow set and emits `endpoint_programmed` (detail:
//!    `delay_seconds` sampled, `apply_seconds` the whole apply, `waited_seconds` since
//!    endpoint_added, `first_connections_dropped` the node's budget then);
//! 4. `first_connections_dropped: N` counts from the endpoint's `readiness_ok`, as an
//!    agent that attaches its enforcement late drops flows the dataplane had already
//!    let through: the kubelet calls [`Agent::arm_first_connections_dropped`] right
//!    before every readiness probe of the pod until one passes (and once before
//!    `readiness_ok` for a pod without a readiness probe), which (re)arms the node's
//!    budget of N dropped SYNs from or to the IP, so the ones sent before Ready do not
//!    spend it and the first N new connections after Ready are dropped;
//! 5. with `revoke`, a sample of `after` later the IP leaves the allow set again
//!    (truth `endpoint_revoked`) for good.
//!
//! A new fault file ([`Faults::set`]) re-plans every pending endpoint under the new file
//! (delay re-sampled, still counted from `endpoint_added`), so clearing a
//! `never_program` fault lets stuck endpoints through, like a recovering agent.
//!
//! Node-wide faults are kept by a per-agent task started by [`Agent::new`] (when called
//! inside a tokio runtime) that re-evaluates the fault file on every change, at every
//! `from`/`until` boundary and every second: `cross_node` (peer block routes removed /
//! restored, truth `peer_route_removed` / `peer_route_restored` with `detail.peer`),
//! `family_broken` (one family's peer block routes removed / restored; truth as for
//! `cross_node` with `detail.reason` `family_broken` for IPv4, none for IPv6, see
//! [`crate::fault::Rule::family_broken`]),
//! `link_mtu`, `encap_mtu` and `proto_drop` ([`Dataplane::set_net_faults`], with real
//! Felix too),
//! `agent.not_ready` ([`Agent::is_ready`]), `agent.restarts` ([`Agent::restart_count`],
//! metrics reset), `agent.extra_failures_per_second` / `extra_resyncs_per_second`,
//! `agent.route_resync` (a slow route-table resync in the apply loop) and
//! `agent.datastore_resync` (a datastore re-list holding the apply loop), the
//! apply loop under `resync_loop` (one apply per period, padded to the floor), and the
//! route-table resync every 90 s ([`crate::felix::ROUTE_REFRESH_INTERVAL`]).
//!
//! **NetworkPolicy** (once [`Agent::start_policy_sync`] ran; [`crate::policy_sync`] has
//! the model, [`crate::netpol`] the semantics): the agent learns Pods, Namespaces and
//! NetworkPolicies from the API and enforces them in the node's own nftables
//! ([`Dataplane::write_policies`]). Step 2 above then also waits until the agent knows
//! the new pod (at most [`KNOWN_WAIT`]), and step 3 writes the pod's isolation (and its
//! admissions already due) in the same transaction as its allow-set entry (fault
//! `isolation_lag` holds the deny back). Later changes — a policy created, changed or
//! deleted, a pod or namespace whose labels or IP change, a peer coming or going — are
//! planned when learned (`policy_delay`, `policy_never`, and `resync_loop`'s windows)
//! and applied by the node's policy task through the same apply loop as endpoints (so
//! `queue`, `agent.apply_time_floor`, a `datastore_resync` or a roll's `--down` hold
//! them too), each apply counted in the Felix metrics like an endpoint apply (as
//! Felix's `felix_int_dataplane_apply_time_seconds` covers policy updates);
//! `policy_programmed` / `policy_revoked` truth lines follow each write.
//!
//! [`FaultFile::for_node`]: crate::fault::FaultFile::for_node

use crate::dataplane::{Dataplane, NetFaults, PodNet};
use crate::fault::{FaultFile, Faults, NodeFaults};
use crate::felix::{FelixMetrics, ROUTE_REFRESH_INTERVAL};
use crate::plan::{IpFamily, NodePlan};
use crate::policy_sync::{Change, PolicySync};
use crate::truth::{unix_now, Truth, TruthEvent, TruthKind};
use rand::seq::SliceRandom;
use rand::RngExt;
use serde::Serialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

/// Counters of what the agent did since it was built (not reset by simulated
/// restarts; the Felix page has its own, see [`crate::felix`]). Snapshot from
/// [`Agent::stats`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentStats {
    /// Endpoints whose IP is in the allow set now.
    pub active_local_endpoints: u64,
    /// Endpoints added but not (or no longer: revoked) programmed.
    pub pending_endpoints: u64,
    /// Dataplane applies done.
    pub applies_total: u64,
    /// Sum of apply durations, seconds.
    pub apply_seconds_sum: f64,
    /// Applies that failed.
    pub apply_failures_total: u64,
    /// Endpoints programmed since start.
    pub programmed_total: u64,
    /// Endpoints revoked since start (fault `revoke`).
    pub revoked_total: u64,
    /// Simulated restarts since start (fault `agent.restarts`).
    pub restarts: u64,
    /// NetworkPolicy items (an isolation, an admitted peer) put into the ruleset since
    /// start (truth `policy_programmed`).
    pub policy_programmed_total: u64,
    /// NetworkPolicy items taken out of the ruleset since start (truth
    /// `policy_revoked`; pods removed with their endpoint not counted).
    pub policy_revoked_total: u64,
    /// NetworkPolicy changes learned and not applied yet (never-planned ones included).
    pub policy_pending: u64,
}

/// How long the programming of a new endpoint waits for the agent to know its pod
/// (labels, namespace) when NetworkPolicy enforcement is on; after that it is
/// programmed without policy knowledge (logged), so a broken watch cannot stop a node.
pub const KNOWN_WAIT: Duration = Duration::from_secs(5);

/// Retry interval of a failed NetworkPolicy write.
const POLICY_RETRY: Duration = Duration::from_secs(1);

struct Endpoint {
    token: u64,
    programmed: bool,
    abort: Option<AbortHandle>,
    revoke_abort: Option<AbortHandle>,
    net: PodNet,
    /// Nodes holding a stale blackhole route for this IP (fault `stale_routes`).
    stale_on: Vec<String>,
    stale_abort: Option<AbortHandle>,
    /// A `first_connections_dropped` budget was armed for this IP (cleaned on removal).
    fcd_armed: bool,
}

#[derive(Default)]
struct Counters {
    applies: AtomicU64,
    apply_nanos: AtomicU64,
    failures: AtomicU64,
    programmed: AtomicU64,
    revoked: AtomicU64,
    restarts: AtomicU64,
    policy_programmed: AtomicU64,
    policy_revoked: AtomicU64,
}

struct Inner {
    node: NodePlan,
    labels: BTreeMap<String, String>,
    dataplane: Arc<Dataplane>,
    truth: Truth,
    faults: Faults,
    runtime: Option<Handle>,
    /// By pod uid. Allow/disallow happen under it.
    endpoints: Mutex<HashMap<String, Endpoint>>,
    /// Node-side interface names ever used on this node (fault `name_reuse_race`).
    used_ifaces: Mutex<HashSet<String>>,
    /// The node's apply loop: one dataplane apply at a time (Felix's
    /// `InternalDataplane` applies from one goroutine, felix/dataplane/linux/int_dataplane.go).
    apply_loop: tokio::sync::Mutex<()>,
    /// (peer, family) whose block route this node has removed now, and the fault it
    /// was removed for (`cross_node` or `family_broken`).
    broken_peers: Mutex<BTreeMap<(String, IpFamily), &'static str>>,
    ready: AtomicBool,
    /// The agent's process is down (`testbed agent roll --down`): not Ready, no applies.
    down: AtomicBool,
    next_token: AtomicU64,
    counters: Counters,
    felix: Mutex<FelixMetrics>,
    /// Real Calico Felix runs on this node ([`Agent::attach_felix`]): it programs the
    /// dataplane; the simulated apply loop and its metrics are off.
    real: std::sync::OnceLock<Arc<crate::calico::felix::FelixNode>>,
    /// The node's ruleset watch ([`Agent::attach_watch`]), told of every endpoint.
    watch: std::sync::OnceLock<Arc<crate::truth_watch::NodeWatch>>,
    /// The node's wire watch (`--kubelet real`: `container_started`, `readiness_ok`).
    wire: std::sync::OnceLock<Arc<crate::wire::WireWatch>>,
    /// Whether the node's `gates_readiness` drop rule is in ([`Inner::reconcile_gate`]).
    gating: AtomicBool,
    /// NetworkPolicy enforcement ([`Agent::start_policy_sync`]).
    policy: std::sync::OnceLock<Arc<PolicySync>>,
    /// Its watch and apply tasks (aborted with the agent).
    policy_tasks: Mutex<Vec<AbortHandle>>,
}

/// One node's simulated CNI agent. Share it as `Arc<Agent>`. Dropping the last handle
/// stops its node task (pending endpoint tasks end when their runtime does or when the
/// endpoint is removed).
pub struct Agent {
    inner: Arc<Inner>,
    node_task: Option<AbortHandle>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.inner.node.name)
            .finish()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(t) = self.node_task.take() {
            t.abort();
        }
        for t in self
            .inner
            .policy_tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl Agent {
    /// An agent for `node` (with Kubernetes node `labels`, used by `{labels: …}` fault
    /// selectors) programming `dataplane`, writing `truth`, obeying the shared `faults`.
    /// If called inside a tokio runtime, that runtime runs the node task (node-wide
    /// faults, metrics upkeep) and is the fallback for endpoint tasks when
    /// [`Agent::endpoint_added`] is called outside one; without a runtime node-wide
    /// faults are not applied.
    pub fn new(
        node: NodePlan,
        labels: BTreeMap<String, String>,
        dataplane: Arc<Dataplane>,
        truth: Truth,
        faults: Faults,
    ) -> Agent {
        let runtime = Handle::try_current().ok();
        let inner = Arc::new(Inner {
            node,
            labels,
            dataplane,
            truth,
            faults,
            runtime: runtime.clone(),
            endpoints: Mutex::new(HashMap::new()),
            used_ifaces: Mutex::new(HashSet::new()),
            apply_loop: tokio::sync::Mutex::new(()),
            broken_peers: Mutex::new(BTreeMap::new()),
            ready: AtomicBool::new(true),
            down: AtomicBool::new(false),
            next_token: AtomicU64::new(1),
            counters: Counters::default(),
            felix: Mutex::new(FelixMetrics::new(Instant::now(), unix_now())),
            real: std::sync::OnceLock::new(),
            watch: std::sync::OnceLock::new(),
            wire: std::sync::OnceLock::new(),
            gating: AtomicBool::new(false),
            policy: std::sync::OnceLock::new(),
            policy_tasks: Mutex::new(Vec::new()),
        });
        let node_task =
            runtime.map(|rt| rt.spawn(node_loop(Arc::downgrade(&inner))).abort_handle());
        Agent { inner, node_task }
    }

    /// The node this agent serves.
    pub fn node(&self) -> &NodePlan {
        &self.inner.node
    }

    /// Hands the node's dataplane to real Calico Felix: from now on endpoints are only
    /// registered (truth `endpoint_added`; programming is Felix's, seen by the ruleset
    /// watch), readiness and restarts are the Felix process's, and the node task applies
    /// the real-agent faults (`agent_io`, `agent_cpu`, `agent_pause`, `agent.restarts`)
    /// to it instead of the simulated ones. Once; later calls are ignored.
    pub fn attach_felix(&self, felix: Arc<crate::calico::felix::FelixNode>) {
        let _ = self.inner.real.set(felix);
    }

    /// The real Felix of this node, if one runs.
    pub fn felix(&self) -> Option<&Arc<crate::calico::felix::FelixNode>> {
        self.inner.real.get()
    }

    /// Tells `watch` of every endpoint added or removed from now on. Once.
    pub fn attach_watch(&self, watch: Arc<crate::truth_watch::NodeWatch>) {
        let _ = self.inner.watch.set(watch);
    }

    /// Tells `wire` of every endpoint added or removed from now on (a real kubelet's
    /// node: its pods' start and readiness are read off the wire). Once.
    pub fn attach_wire(&self, wire: Arc<crate::wire::WireWatch>) {
        let _ = self.inner.wire.set(wire);
    }

    /// The node's ruleset watch, if one runs.
    pub fn watch(&self) -> Option<&Arc<crate::truth_watch::NodeWatch>> {
        self.inner.watch.get()
    }

    /// Turns NetworkPolicy enforcement on (simulated agent only; see the module docs):
    /// starts watching Pods, Namespaces and NetworkPolicies with `client` and the node's
    /// policy task, both on the current tokio runtime (build `client` there: the node's
    /// runtime, so the watches come from the node). Call before the node's first pod.
    /// Once; later calls are ignored.
    pub fn start_policy_sync(&self, client: kube::Client) {
        let ps = PolicySync::new(&self.inner.node.name);
        if self.inner.policy.set(ps.clone()).is_err() {
            return;
        }
        let mut tasks = ps.start_watches(client);
        tasks.push(tokio::spawn(policy_loop(Arc::downgrade(&self.inner), ps)).abort_handle());
        self.inner
            .policy_tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(tasks);
    }

    /// A new endpoint (call right after `Dataplane::add_pod`): emits `endpoint_added`,
    /// applies `name_reuse_race` and `stale_routes` at once (blocking for one `ip`
    /// command per route touched, a few ms) and schedules programming on the current
    /// tokio runtime (or the one [`Agent::new`] ran in). Calling it again for the same
    /// uid replaces the earlier schedule.
    pub fn endpoint_added(&self, pod: &PodNet) {
        let added_at = Instant::now();
        let inner = &self.inner;
        inner
            .truth
            .emit(TruthEvent::pod(TruthKind::EndpointAdded, pod, json!({})));
        if let Some(w) = inner.watch.get() {
            w.endpoint_added(pod);
        }
        if let Some(w) = inner.wire.get() {
            w.add_pod(pod);
        }
        let nf = inner.faults_at(added_at);
        let real = inner.real.get().is_some();
        let reused = !inner
            .used_ifaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pod.iface.clone());
        if reused && !real {
            if let Some(p) = nf.name_reuse_race {
                if rand::rng().random_bool(p.0.clamp(0.0, 1.0)) {
                    inner.name_reuse_race(pod);
                }
            }
        }
        let stale_on = match nf.stale_routes {
            Some(s) if s.k > 0 => inner.add_stale_routes(pod, s.k as usize),
            _ => Vec::new(),
        };
        let token = inner.next_token.fetch_add(1, Ordering::Relaxed);
        let Some(rt) = Handle::try_current().ok().or_else(|| inner.runtime.clone()) else {
            tracing::error!(pod = %pod.pod, "agent: no tokio runtime; endpoint will not be programmed");
            return;
        };
        let stale_abort = match (nf.stale_routes.and_then(|s| s.hold), stale_on.is_empty()) {
            (Some(hold), false) => {
                let d = hold.sample(&mut rand::rng());
                let weak = Arc::downgrade(inner);
                let (uid, token2) = (pod.uid.clone(), token);
                Some(
                    rt.spawn(async move {
                        tokio::time::sleep(d).await;
                        if let Some(inner) = weak.upgrade() {
                            let _ = tokio::task::spawn_blocking(move || {
                                inner.clear_stale_routes(&uid, Some(token2))
                            })
                            .await;
                        }
                    })
                    .abort_handle(),
                )
            }
            _ => None,
        };
        let mut eps = inner.lock();
        if let Some(old) = eps.remove(&pod.uid) {
            old.abort_tasks();
        }
        // Real Felix programs it; the simulated apply loop does otherwise.
        let task = (!real).then(|| rt.spawn(program(inner.clone(), pod.clone(), token, added_at)));
        eps.insert(
            pod.uid.clone(),
            Endpoint {
                token,
                programmed: false,
                abort: task.map(|t| t.abort_handle()),
                revoke_abort: None,
                net: pod.clone(),
                stale_on,
                stale_abort,
                fcd_armed: false,
            },
        );
        drop(eps);
        if let Some(ps) = inner.policy.get() {
            ps.bump();
        }
    }

    /// The `teardown_delay` fault for this node now (zero when unset): how long the
    /// sandbox teardown of a deleted pod takes ([`crate::fault`]).
    pub fn teardown_delay(&self) -> Duration {
        self.inner
            .faults
            .teardown_delay(&self.inner.node.name, &self.inner.labels)
    }

    /// The `cni_add_delay` fault for this node now (zero when unset): how long a CNI ADD
    /// through `testbed cni` waits before wiring the pod ([`crate::cni`]).
    pub fn cni_add_delay(&self) -> Duration {
        self.inner
            .faults
            .cni_add_delay(&self.inner.node.name, &self.inner.labels)
    }

    /// Fault `first_connections_dropped: N` in force on this node now: (re)arms the
    /// endpoint's budget of N dropped new connections ([`Dataplane::arm_first_syn_drops`],
    /// one blocking `nft` call) and returns N; 0 (and no `nft` call) without the fault or
    /// for an unknown endpoint. The kubelet calls it right before each readiness probe
    /// until the pod's first pass, so the budget counts from `readiness_ok` (module
    /// docs, step 4). An `nft` failure is logged and returns 0.
    pub fn arm_first_connections_dropped(&self, pod: &PodNet) -> u32 {
        let inner = &self.inner;
        let n = inner
            .faults_at(Instant::now())
            .first_connections_dropped
            .unwrap_or(0);
        if n == 0 {
            return 0;
        }
        let mut eps = inner.lock();
        let Some(ep) = eps.get_mut(&pod.uid) else {
            return 0;
        };
        match inner
            .dataplane
            .arm_first_syn_drops(&inner.node.name, pod.ip, n)
        {
            Ok(()) => {
                ep.fcd_armed = true;
                n
            }
            Err(e) => {
                tracing::error!(pod = %pod.pod, error = %e, "agent: arming first_connections_dropped failed");
                0
            }
        }
    }

    /// The endpoint is going away: cancels pending programming, revoke and stale-route
    /// timers, removes stale routes it caused on other nodes and, if it was
    /// programmed, removes its IP from the allow set and its NetworkPolicy rules
    /// (blocks for those `ip`/`nft` calls; waits for an allow in progress). Unknown
    /// endpoints are ignored.
    pub fn endpoint_removed(&self, pod: &PodNet) {
        let inner = &self.inner;
        if let Some(w) = inner.watch.get() {
            w.endpoint_removed(pod);
        }
        if let Some(w) = inner.wire.get() {
            w.remove_pod(pod.ip);
        }
        inner.clear_stale_routes(&pod.uid, None);
        let mut eps = inner.lock();
        let Some(ep) = eps.remove(&pod.uid) else {
            return;
        };
        ep.abort_tasks();
        let had_rules = inner.policy.get().is_some_and(|ps| {
            let mut t = ps.tracker();
            let had = t.has_rules(&pod.uid);
            t.forget(&pod.uid);
            had
        });
        if ep.programmed || ep.fcd_armed || had_rules {
            let started = Instant::now();
            let r = inner.dataplane.forget(&inner.node.name, ep.net.ip);
            inner.count_apply(started.elapsed(), Some(1), r.is_ok());
            if let Err(e) = r {
                tracing::warn!(pod = %pod.pod, error = %e, "agent: disallow failed");
            }
        }
        drop(eps);
        if let Some(ps) = inner.policy.get() {
            ps.bump();
        }
    }

    /// Replaces the cluster's fault file (shared by every agent holding the same
    /// [`Faults`]), emits `fault_changed` and re-plans every pending endpoint.
    pub fn set_faults(&self, file: FaultFile) {
        self.inner.faults.set_and_record(file, &self.inner.truth);
    }

    /// Whether the agent reports Ready (the calico-node pod's readiness): false while
    /// fault `agent.not_ready: true` is in force for this node. Updated by the node
    /// task within a second of a change.
    pub fn is_ready(&self) -> bool {
        if let Some(f) = self.inner.real.get() {
            return f.process().is_ready();
        }
        self.inner.ready.load(Ordering::Relaxed) && !self.inner.down.load(Ordering::Relaxed)
    }

    /// The agent's process is down until `until` (a pod replacement, `testbed agent
    /// roll --down`): it takes the node's apply loop (so no endpoint is programmed
    /// meanwhile: new pods stay dark, programmed ones keep flowing, as with a stopped
    /// Felix) and reports not Ready; `acquired` is sent once the loop is held. At
    /// `until` it comes back as a new process ([`Agent::rolled`]) and lets the waiting
    /// applies through.
    pub async fn down_until(
        &self,
        until: tokio::time::Instant,
        acquired: tokio::sync::oneshot::Sender<()>,
    ) {
        let _apply = self.inner.apply_loop.lock().await;
        self.inner.down.store(true, Ordering::Relaxed);
        let _ = acquired.send(());
        tokio::time::sleep_until(until).await;
        self.rolled();
        self.inner.down.store(false, Ordering::Relaxed);
    }

    /// The agent's pod was replaced (`testbed agent roll`): a new process, so the
    /// Felix page starts again from zero (`process_start_time_seconds` = now), as
    /// after a restart; the pod-level restart count is the new pod's own (the kubelet
    /// counts from the pod's start).
    pub fn rolled(&self) {
        *self.inner.felix() = FelixMetrics::new(Instant::now(), unix_now());
        tracing::info!(node = %self.inner.node.name, "agent: pod replaced (new process)");
    }

    /// How many times the simulated agent restarted (fault `agent.restarts`): the
    /// calico-node pod's `restartCount` should follow it.
    pub fn restart_count(&self) -> u64 {
        if let Some(f) = self.inner.real.get() {
            return f.process().restarts();
        }
        self.inner.counters.restarts.load(Ordering::Relaxed)
    }

    /// Fault `clock_skew` in force for this node now (the kubelet applies it to the
    /// containers it starts: [`crate::fault::ClockSkew`]).
    pub fn clock_skew(&self) -> Option<crate::fault::ClockSkew> {
        self.inner.faults_at(Instant::now()).clock_skew
    }

    /// What the agent did so far.
    pub fn stats(&self) -> AgentStats {
        let eps = self.inner.lock();
        let active = eps.values().filter(|e| e.programmed).count() as u64;
        let c = &self.inner.counters;
        let policy_pending = self
            .inner
            .policy
            .get()
            .map_or(0, |ps| ps.tracker().pending() as u64);
        AgentStats {
            active_local_endpoints: active,
            pending_endpoints: eps.len() as u64 - active,
            applies_total: c.applies.load(Ordering::Relaxed),
            apply_seconds_sum: c.apply_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            apply_failures_total: c.failures.load(Ordering::Relaxed),
            programmed_total: c.programmed.load(Ordering::Relaxed),
            revoked_total: c.revoked.load(Ordering::Relaxed),
            restarts: c.restarts.load(Ordering::Relaxed),
            policy_programmed_total: c.policy_programmed.load(Ordering::Relaxed),
            policy_revoked_total: c.policy_revoked.load(Ordering::Relaxed),
            policy_pending,
        }
    }

    /// The Felix-compatible metrics page now ([`crate::felix::render`]);
    /// `felix_active_local_endpoints` = endpoints known (added, not removed).
    pub fn felix_page(&self) -> String {
        let known = self.inner.lock().len() as u64;
        let mut m = self.inner.felix();
        crate::felix::render(&mut m, known, Instant::now())
    }
}

impl Endpoint {
    fn abort_tasks(&self) {
        for a in [&self.abort, &self.revoke_abort, &self.stale_abort]
            .into_iter()
            .flatten()
        {
            a.abort();
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Endpoint>> {
        self.endpoints.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn felix(&self) -> std::sync::MutexGuard<'_, FelixMetrics> {
        self.felix.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Faults for this node at `at` (time since the file's application).
    fn faults_at(&self, at: Instant) -> NodeFaults {
        let applied = self.faults.current();
        applied.file.for_node(
            &self.node.name,
            &self.labels,
            at.saturating_duration_since(applied.applied_at),
        )
    }

    fn count_apply(&self, took: Duration, batch: Option<usize>, ok: bool) {
        let c = &self.counters;
        c.applies.fetch_add(1, Ordering::Relaxed);
        c.apply_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        if !ok {
            c.failures.fetch_add(1, Ordering::Relaxed);
        }
        self.felix().record_apply(took, batch, ok, Instant::now());
    }

    /// The plan of NetworkPolicy changes under the faults in force now (module docs):
    /// `policy_delay` (and `policy_never` for new admissions) counted from when the
    /// change was seen, then `resync_loop`'s next open window; `None` = never.
    fn policy_plan(&self) -> impl FnMut(Change, Instant) -> Option<(Instant, Duration)> + '_ {
        let applied = self.faults.current();
        let nf = applied.file.for_node(
            &self.node.name,
            &self.labels,
            Instant::now().saturating_duration_since(applied.applied_at),
        );
        move |change, seen| {
            let delay = nf.plan_policy_change(change == Change::Admit, &mut rand::rng())?;
            let due = seen.checked_add(delay)?;
            let since = due.saturating_duration_since(applied.applied_at);
            let at = applied.applied_at.checked_add(nf.programming_time(since))?;
            Some((at, delay))
        }
    }

    /// Truth lines and counters for NetworkPolicy transitions just written by an apply
    /// that took `took`.
    fn record_policy(&self, transitions: &[crate::policy_sync::Transition], took: Duration) {
        for t in transitions {
            let c = if t.programmed {
                &self.counters.policy_programmed
            } else {
                &self.counters.policy_revoked
            };
            c.fetch_add(1, Ordering::Relaxed);
            self.truth.emit(t.truth_event(took.as_secs_f64()));
        }
    }

    /// One NetworkPolicy apply (blocking; the caller holds the apply loop, which
    /// started at `started`): every change due now of programmed endpoints, written in
    /// one transaction, then truth and metrics. Errors: the `nft` write (nothing
    /// recorded; the changes stay due).
    fn apply_policy_changes(&self, ps: &PolicySync, started: Instant) -> Result<(), String> {
        let eps = self.lock();
        let (now, now_unix) = (Instant::now(), unix_now());
        let desired = ps.desired(&eps.values().map(|e| e.net.clone()).collect::<Vec<_>>());
        let mut t = ps.tracker();
        t.observe(desired, now, now_unix, &mut self.policy_plan());
        let batch = t.take_due(now);
        if batch.is_empty() {
            return Ok(());
        }
        let rules = batch.rules();
        let r = if rules.is_empty() {
            Ok(())
        } else {
            self.dataplane.write_policies(&self.node.name, &rules, None)
        };
        drop(rules);
        let took = started.elapsed();
        if batch.changes() > 0 {
            self.count_apply(took, Some(batch.changes()), r.is_ok());
        }
        r.map_err(|e| e.to_string())?;
        self.record_policy(&batch.transitions, took);
        t.commit(batch);
        Ok(())
    }

    /// calico#11016: the agent saw the old interface go "down" after the new one came
    /// up and deleted the route, which nothing re-adds.
    fn name_reuse_race(&self, pod: &PodNet) {
        match self.dataplane.remove_pod_route(&self.node.name, pod.ip) {
            Ok(()) => {
                self.truth.emit(TruthEvent::pod(
                    TruthKind::RouteRemoved,
                    pod,
                    json!({"reason": "name_reuse_race", "iface_reused": true}),
                ));
            }
            Err(e) => {
                tracing::error!(pod = %pod.pod, error = %e, "agent: name_reuse_race route removal failed")
            }
        }
    }

    /// Blackholes `pod.ip` on up to `k` other nodes chosen at random; returns them.
    fn add_stale_routes(&self, pod: &PodNet, k: usize) -> Vec<String> {
        let mut others: Vec<String> = self
            .dataplane
            .plan()
            .nodes
            .iter()
            .filter(|n| n.name != self.node.name)
            .map(|n| n.name.clone())
            .collect();
        others.shuffle(&mut rand::rng());
        others.truncate(k);
        others.sort();
        let mut done = Vec::new();
        for other in others {
            match self.dataplane.add_blackhole(&other, pod.ip) {
                Ok(()) => {
                    self.truth.emit(TruthEvent {
                        node: Some(other.clone()),
                        ..TruthEvent::pod(
                            TruthKind::PeerRouteRemoved,
                            pod,
                            json!({"peer": self.node.name, "reason": "stale_routes"}),
                        )
                    });
                    done.push(other);
                }
                Err(e) => {
                    tracing::error!(node = %other, error = %e, "agent: stale route not added")
                }
            }
        }
        done
    }

    /// Removes the stale routes of endpoint `uid` (only if its token still matches,
    /// when given), emitting `peer_route_restored` for each.
    fn clear_stale_routes(&self, uid: &str, token: Option<u64>) {
        let (net, nodes) = {
            let mut eps = self.lock();
            let Some(ep) = eps.get_mut(uid) else { return };
            if token.is_some_and(|t| t != ep.token) {
                return;
            }
            (ep.net.clone(), std::mem::take(&mut ep.stale_on))
        };
        for other in nodes {
            match self.dataplane.remove_blackhole(&other, net.ip) {
                Ok(()) => {
                    self.truth.emit(TruthEvent {
                        node: Some(other.clone()),
                        ..TruthEvent::pod(
                            TruthKind::PeerRouteRestored,
                            &net,
                            json!({"peer": self.node.name, "reason": "stale_routes"}),
                        )
                    });
                }
                Err(e) => {
                    tracing::error!(node = %other, error = %e, "agent: stale route not removed")
                }
            }
        }
    }

    /// Brings the node's peer routes in line with `cross_node` (every family the plan
    /// has) and `family_broken` (one family) (blocking `ip` calls). Truth events are
    /// written for IPv4 routes only (`detail.reason` names the fault): they describe the
    /// IPv4 path [`crate::truth::truth_ttfp`] follows.
    fn reconcile_peers(&self, nf: &NodeFaults) {
        let plan = self.dataplane.plan();
        let families: &[IpFamily] = if plan.has_ipv6() {
            &[IpFamily::Ipv4, IpFamily::Ipv6]
        } else {
            &[IpFamily::Ipv4]
        };
        let mut want: BTreeMap<(String, IpFamily), &'static str> = BTreeMap::new();
        for n in plan.nodes.iter().filter(|n| n.name != self.node.name) {
            if let Some(f) = nf.family_broken.filter(|f| families.contains(f)) {
                want.insert((n.name.clone(), f), "family_broken");
            }
            if let Some(c) = nf.cross_node.as_ref() {
                if c.broken_peers.includes(&n.name) {
                    for f in families {
                        want.insert((n.name.clone(), *f), "cross_node");
                    }
                }
            }
        }
        let mut have = self.broken_peers.lock().unwrap_or_else(|p| p.into_inner());
        // Per family (`detail.family`): each family's truth TTFP follows its own routes
        // (truth::truth_family_ttfp).
        let emit = |kind: TruthKind, peer: &str, family: IpFamily, reason: &str| {
            self.truth.emit(TruthEvent::node(
                kind,
                &self.node.name,
                json!({"peer": peer, "reason": reason, "family": family.to_string()}),
            ));
        };
        for ((peer, family), reason) in &want {
            if have.contains_key(&(peer.clone(), *family)) {
                continue;
            }
            match self
                .dataplane
                .remove_peer_route_family(&self.node.name, peer, *family)
            {
                Ok(()) => {
                    have.insert((peer.clone(), *family), *reason);
                    emit(TruthKind::PeerRouteRemoved, peer, *family, reason);
                }
                Err(e) => {
                    tracing::error!(peer = %peer, %family, error = %e, "agent: peer route not removed")
                }
            }
        }
        for ((peer, family), reason) in have.clone() {
            if want.contains_key(&(peer.clone(), family)) {
                continue;
            }
            match self
                .dataplane
                .restore_peer_route_family(&self.node.name, &peer, family)
            {
                Ok(()) => {
                    have.remove(&(peer.clone(), family));
                    emit(TruthKind::PeerRouteRestored, &peer, family, reason);
                }
                Err(e) => {
                    tracing::error!(peer = %peer, %family, error = %e, "agent: peer route not restored")
                }
            }
        }
    }

    /// Brings the faults on the node's network in line with `link_mtu`, `encap_mtu` and
    /// `proto_drop` ([`Dataplane::set_net_faults`]; blocking `ip`/`nft` calls). They are
    /// the network's, not the agent's: kept with either agent, and while the agent is
    /// down. No truth line (the file's `fault_changed` says what is in force); a failure
    /// is logged and retried on the next pass.
    fn reconcile_net(&self, nf: &NodeFaults) {
        let want = NetFaults {
            link_mtu: nf.link_mtu,
            encap_mtu: nf.encap_mtu,
            proto_drop: nf.proto_drop.clone(),
        };
        if self.dataplane.net_faults(&self.node.name) == want {
            return;
        }
        match self.dataplane.set_net_faults(&self.node.name, &want) {
            Ok(()) => {
                tracing::info!(node = %self.node.name, faults = ?want, "agent: network faults set")
            }
            Err(e) => {
                tracing::error!(node = %self.node.name, error = %e, "agent: network faults not set")
            }
        }
    }

    /// Brings the node's readiness gate in line with `agent.gates_readiness` (simulated
    /// agent only; [`Dataplane::set_readiness_gate`]): while on — the default, as on
    /// Calico, unless a rule sets `gates_readiness: false` — a new pod's traffic to its
    /// own node is dropped until its endpoint is programmed, so its kubelet's readiness
    /// probe fails until then, as with real Felix.
    fn reconcile_gate(&self, nf: &NodeFaults) {
        let want = self.real.get().is_none() && nf.agent.gates_readiness.unwrap_or(true);
        if self.gating.load(Ordering::Relaxed) == want {
            return;
        }
        match self.dataplane.set_readiness_gate(&self.node.name, want) {
            Ok(()) => self.gating.store(want, Ordering::Relaxed),
            Err(e) => {
                tracing::error!(node = %self.node.name, error = %e, "agent: readiness gate not set")
            }
        }
    }

    /// Route-table resync: times the interface listing and one route read per
    /// workload interface (blocking `ip` calls).
    fn route_resync(&self) {
        self.route_resync_listing_at_least(Duration::ZERO);
    }

    /// [`Inner::route_resync`] whose interface listing takes at least `floor` (blocking:
    /// the listing is padded with a sleep, fault `agent.route_resync`), as a route
    /// table listing thousands of routes or a contended netlink socket would.
    fn route_resync_listing_at_least(&self, floor: Duration) {
        let started = Instant::now();
        let listed = self.dataplane.list_workload_ifaces(&self.node.name);
        if let Some(pad) = floor.checked_sub(started.elapsed()) {
            std::thread::sleep(pad);
        }
        let list_took = started.elapsed();
        let ifaces: Vec<String> = self.lock().values().map(|e| e.net.iface.clone()).collect();
        let mut per_iface = Vec::new();
        for iface in ifaces {
            let t = Instant::now();
            if self.dataplane.iface_routes(&self.node.name, &iface).is_ok() {
                per_iface.push(t.elapsed());
            }
        }
        let now = Instant::now();
        let mut m = self.felix();
        if listed.is_ok() {
            m.route_table_list.observe(list_took.as_secs_f64(), now);
        }
        for d in per_iface {
            m.route_table_per_iface_sync.observe(d.as_secs_f64(), now);
        }
    }

    /// One apply-loop iteration without endpoint updates (fault `resync_loop`): a real
    /// read of the allow set, padded to `floor`.
    async fn loop_apply(self: &Arc<Self>, floor: Option<Duration>) {
        let _apply = self.apply_loop.lock().await;
        let started = Instant::now();
        let me = self.clone();
        let ok = tokio::task::spawn_blocking(move || me.dataplane.allowed(&me.node.name).is_ok())
            .await
            .unwrap_or(false);
        if let Some(f) = floor {
            tokio::time::sleep_until((started + f).into()).await;
        }
        self.count_apply(started.elapsed(), None, ok);
    }

    /// Fault `agent.route_resync`: one slow route-table resync inside the apply loop.
    /// Felix queues a route-table resync every `RouteRefreshInterval` and runs it in its
    /// next dataplane apply (felix/dataplane/linux/int_dataplane.go `apply()` calls the
    /// route tables' `Apply`; felix/routetable/route_table.go times the interface
    /// listing of a resync into `felix_route_table_list_seconds`), so the listing time
    /// lands in `felix_route_table_list_seconds` and the whole apply in
    /// `felix_int_dataplane_apply_time_seconds`, and endpoints due meanwhile wait.
    async fn slow_route_resync(self: &Arc<Self>, takes: Duration) {
        let _apply = self.apply_loop.lock().await;
        let started = Instant::now();
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.route_resync_listing_at_least(takes)).await;
        self.count_apply(started.elapsed(), None, true);
    }

    /// Fault `agent.datastore_resync`: the datastore watch broke and the agent re-lists
    /// for `takes`. Felix's calculation graph counts every `ResyncInProgress` status in
    /// `felix_resyncs_started` and shows the status in `felix_resync_state`
    /// (felix/calc/async_calc_graph.go: WaitForDatastore 1, ResyncInProgress 2,
    /// InSync 3); endpoints added meanwhile reach the dataplane only from the new
    /// listing, so the apply loop is held until it is back in sync.
    async fn datastore_resync(self: &Arc<Self>, takes: Duration) {
        let _apply = self.apply_loop.lock().await;
        {
            let mut m = self.felix();
            m.resyncs_started += 1;
            m.resync_state = 2.0;
        }
        tokio::time::sleep(takes).await;
        self.felix().resync_state = 3.0;
    }

    /// A simulated process restart: metrics start again from zero.
    fn restart(&self) {
        self.counters.restarts.fetch_add(1, Ordering::Relaxed);
        *self.felix() = FelixMetrics::new(Instant::now(), unix_now());
        tracing::info!(node = %self.node.name, "agent: simulated restart");
    }
}

/// The node task: node-wide faults and metrics upkeep (see the module docs). Ends when
/// the agent is dropped.
async fn node_loop(weak: Weak<Inner>) {
    let Some(mut rx) = weak.upgrade().map(|i| i.faults.subscribe()) else {
        return;
    };
    let mut last_tick = Instant::now();
    let mut next_route_resync = Instant::now();
    let mut next_restart: Option<(u64, Instant)> = None;
    let mut next_loop_apply: Option<(u64, Instant)> = None;
    // Faults agent.route_resync / agent.datastore_resync: (file generation, next due).
    let mut next_slow_route: Option<(u64, Instant)> = None;
    let mut next_ds_resync: Option<(u64, Instant)> = None;
    let (mut carry_failures, mut carry_resyncs) = (0.0f64, 0.0f64);
    let mut real_faults = RealFaults::default();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let now = Instant::now();
        let applied = inner.faults.current();
        let since = now.saturating_duration_since(applied.applied_at);
        let nf = applied
            .file
            .for_node(&inner.node.name, &inner.labels, since);

        {
            let i2 = inner.clone();
            let nf2 = nf.clone();
            let _ = tokio::task::spawn_blocking(move || {
                i2.reconcile_peers(&nf2);
                i2.reconcile_net(&nf2);
                i2.reconcile_gate(&nf2);
            })
            .await;
        }
        if let Some(felix) = inner.real.get().cloned() {
            // Real Felix: only the faults that act on the real process.
            let due = real_faults.step(&felix, &nf, applied.generation, now);
            let mut wake = Instant::now() + Duration::from_secs(1);
            for b in applied.file.boundaries(&inner.node.name, &inner.labels) {
                let at = applied.applied_at + b;
                if at > now && at < wake {
                    wake = at;
                }
            }
            wake = due.map_or(wake, |d| d.min(wake));
            drop(inner);
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => {}
                r = rx.changed() => if r.is_err() { return },
            }
            continue;
        }
        inner
            .ready
            .store(nf.agent.not_ready != Some(true), Ordering::Relaxed);

        // Extra failures / resyncs, accumulated over real elapsed time.
        let dt = now.saturating_duration_since(last_tick).as_secs_f64();
        last_tick = now;
        carry_failures += dt * nf.agent.extra_failures_per_second.unwrap_or(0.0);
        carry_resyncs += dt * nf.agent.extra_resyncs_per_second.unwrap_or(0.0);
        let (add_f, add_r) = (carry_failures.floor(), carry_resyncs.floor());
        carry_failures -= add_f;
        carry_resyncs -= add_r;
        if add_f > 0.0 || add_r > 0.0 {
            let mut m = inner.felix();
            m.failures += add_f as u64;
            m.resyncs_started += add_r as u64;
        }

        // Restarts, re-planned when the file changes.
        match (nf.agent.restarts, next_restart) {
            (None, _) => next_restart = None,
            (Some(r), plan) => {
                let due = match plan {
                    Some((g, at)) if g == applied.generation => at,
                    _ => now + r.every.sample(&mut rand::rng()),
                };
                if now >= due {
                    inner.restart();
                    next_restart =
                        Some((applied.generation, now + r.every.sample(&mut rand::rng())));
                } else {
                    next_restart = Some((applied.generation, due));
                }
            }
        }

        // Route-table resync at start and every ROUTE_REFRESH_INTERVAL.
        if now >= next_route_resync {
            let i2 = inner.clone();
            let _ = tokio::task::spawn_blocking(move || i2.route_resync()).await;
            next_route_resync = now + ROUTE_REFRESH_INTERVAL;
        }

        // Slow route-table resyncs and datastore resyncs: an episode every `every`,
        // run as its own task (it waits for and holds the apply loop for `takes`).
        for (fault, next, route) in [
            (nf.agent.route_resync, &mut next_slow_route, true),
            (nf.agent.datastore_resync, &mut next_ds_resync, false),
        ] {
            let Some(f) = fault else {
                *next = None;
                continue;
            };
            let due = match *next {
                Some((g, at)) if g == applied.generation => at,
                _ => now + f.every.sample(&mut rand::rng()),
            };
            if now < due {
                *next = Some((applied.generation, due));
                continue;
            }
            let takes = f.takes.sample(&mut rand::rng());
            let i2 = inner.clone();
            tokio::spawn(async move {
                if route {
                    i2.slow_route_resync(takes).await;
                } else {
                    i2.datastore_resync(takes).await;
                }
            });
            *next = Some((applied.generation, now + f.every.sample(&mut rand::rng())));
        }

        // Apply loop under resync_loop: one apply per period, at the window starts.
        match nf.resync_loop {
            None => next_loop_apply = None,
            Some(r) => {
                let at = match next_loop_apply {
                    Some((g, at)) if g == applied.generation => at,
                    _ => applied.applied_at + r.next_open(since),
                };
                if now >= at {
                    inner.loop_apply(nf.agent.apply_time_floor).await;
                    // Next iteration: the first open instant at least one period
                    // after this one started and not before now, so an apply that
                    // takes the whole period (apply_time_floor ≥ period) is retried
                    // back to back, as a stuck apply loop is.
                    let this_start = at.saturating_duration_since(applied.applied_at);
                    let after = Instant::now().saturating_duration_since(applied.applied_at);
                    let next_start = r.next_open((this_start + r.period).max(after));
                    next_loop_apply = Some((applied.generation, applied.applied_at + next_start));
                } else {
                    next_loop_apply = Some((applied.generation, at));
                }
            }
        }

        // Sleep until the next second, boundary, restart or loop apply.
        let mut wake = Instant::now() + Duration::from_secs(1);
        for b in applied.file.boundaries(&inner.node.name, &inner.labels) {
            let at = applied.applied_at + b;
            if at > now && at < wake {
                wake = at;
            }
        }
        for at in [
            next_restart.map(|x| x.1),
            next_loop_apply.map(|x| x.1),
            next_slow_route.map(|x| x.1),
            next_ds_resync.map(|x| x.1),
        ]
        .into_iter()
        .flatten()
        {
            if at < wake {
                wake = at;
            }
        }
        wake = wake.min(next_route_resync);
        drop(inner);
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

/// The node's NetworkPolicy task (module docs): re-evaluates on every change the
/// watches or the node's endpoints bring, re-plans on every fault change, and applies
/// due changes through the apply loop. Ends when the agent is dropped.
async fn policy_loop(weak: Weak<Inner>, ps: Arc<PolicySync>) {
    let mut changes = ps.subscribe();
    let Some(mut faults_rx) = weak.upgrade().map(|i| i.faults.subscribe()) else {
        return;
    };
    let mut retry_at: Option<Instant> = None;
    loop {
        changes.borrow_and_update();
        let Some(inner) = weak.upgrade() else { return };
        let next = {
            let eps = inner.lock();
            let (now, now_unix) = (Instant::now(), unix_now());
            let desired = ps.desired(&eps.values().map(|e| e.net.clone()).collect::<Vec<_>>());
            let mut t = ps.tracker();
            t.observe(desired, now, now_unix, &mut inner.policy_plan());
            t.next_due()
        };
        let next = match (next, retry_at) {
            (Some(n), Some(r)) => Some(n.max(r)),
            (n, _) => n,
        };
        if next.is_some_and(|n| n <= Instant::now()) {
            let apply = inner.apply_loop.lock().await;
            let started = Instant::now();
            let nf = inner.faults_at(started);
            if let Some(q) = nf.queue {
                let d = q.per_endpoint.sample(&mut rand::rng());
                tokio::time::sleep(d).await;
            }
            if let Some(floor) = nf.agent.apply_time_floor {
                tokio::time::sleep_until((started + floor).into()).await;
            }
            let (i2, ps2) = (inner.clone(), ps.clone());
            let r = tokio::task::spawn_blocking(move || i2.apply_policy_changes(&ps2, started))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            drop(apply);
            retry_at = match r {
                Ok(()) => None,
                Err(e) => {
                    tracing::error!(node = %inner.node.name, error = %e, "agent: NetworkPolicy write failed; retrying");
                    Some(Instant::now() + POLICY_RETRY)
                }
            };
            continue;
        }
        drop(inner);
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => {}
            r = changes.changed() => if r.is_err() { return },
            r = faults_rx.changed() => {
                if r.is_err() {
                    return;
                }
                faults_rx.borrow_and_update();
                let Some(inner) = weak.upgrade() else { return };
                ps.tracker().replan(&mut inner.policy_plan());
            }
        }
    }
}

/// The real-agent faults of one node as last applied (docs/design.md §6 "Faults on real
/// agents"; [`crate::calico::felix`] says how each acts on Felix).
#[derive(Default)]
struct RealFaults {
    /// The `agent-io` line last written.
    io: Option<String>,
    /// The CPU quota last set (`Some(None)`: lifted).
    cpu: Option<Option<(u64, u64)>>,
    /// Next pause (file generation, instant) and, while paused, when to resume.
    next_pause: Option<(u64, Instant)>,
    resume_at: Option<Instant>,
    /// Next restart (file generation, instant).
    next_restart: Option<(u64, Instant)>,
}

impl RealFaults {
    /// Applies `nf` to `felix` at `now` (generation `generation` of the fault file);
    /// returns when it next needs to act.
    fn step(
        &mut self,
        felix: &crate::calico::felix::FelixNode,
        nf: &NodeFaults,
        generation: u64,
        now: Instant,
    ) -> Option<Instant> {
        let mut rng = rand::rng();
        let io = crate::calico::felix::agent_io_line(
            nf.agent_io.as_ref().and_then(|a| a.delay.as_ref()),
            nf.agent_io
                .as_ref()
                .and_then(|a| a.fail)
                .map_or(0.0, |p| p.0),
        );
        if self.io.as_deref() != Some(&io) {
            match felix.set_io(
                nf.agent_io.as_ref().and_then(|a| a.delay.as_ref()),
                nf.agent_io
                    .as_ref()
                    .and_then(|a| a.fail)
                    .map_or(0.0, |p| p.0),
            ) {
                Ok(()) => self.io = Some(io),
                Err(e) => {
                    tracing::error!(node = %felix.node(), error = %format!("{e:#}"), "agent_io")
                }
            }
        }
        let cpu = nf.agent_cpu.as_ref().map(|c| c.cfs());
        if self.cpu != Some(cpu) {
            match felix.set_cpu_quota(cpu) {
                Ok(()) => self.cpu = Some(cpu),
                Err(e) => {
                    tracing::error!(node = %felix.node(), error = %format!("{e:#}"), "agent_cpu")
                }
            }
        }
        let mut wake: Option<Instant> = None;
        let mut soon = |t: Instant| wake = Some(wake.map_or(t, |w: Instant| w.min(t)));
        // agent_pause: SIGSTOP for a sample of `for` every sample of `every`.
        match &nf.agent_pause {
            None => {
                self.next_pause = None;
                if self.resume_at.take().is_some() {
                    felix.process().set_paused(false);
                }
            }
            Some(p) => {
                if let Some(r) = self.resume_at {
                    if now >= r {
                        felix.process().set_paused(false);
                        self.resume_at = None;
                    } else {
                        soon(r);
                    }
                }
                let due = match self.next_pause {
                    Some((g, at)) if g == generation => at,
                    _ => now + p.every.sample(&mut rng),
                };
                if now >= due && self.resume_at.is_none() {
                    felix.process().set_paused(true);
                    let r = now + p.for_.sample(&mut rng);
                    self.resume_at = Some(r);
                    soon(r);
                    self.next_pause = Some((generation, now + p.every.sample(&mut rng)));
                } else {
                    self.next_pause = Some((generation, due.max(now)));
                }
                if let Some((_, at)) = self.next_pause {
                    soon(at);
                }
            }
        }
        // agent.restarts: the process is killed; its supervisor restarts it.
        match nf.agent.restarts {
            None => self.next_restart = None,
            Some(r) => {
                let due = match self.next_restart {
                    Some((g, at)) if g == generation => at,
                    _ => now + r.every.sample(&mut rng),
                };
                if now >= due {
                    tracing::info!(node = %felix.node(), "agent: fault restarts: killing Felix");
                    felix.process().kill();
                    self.next_restart = Some((generation, now + r.every.sample(&mut rng)));
                } else {
                    self.next_restart = Some((generation, due));
                }
                if let Some((_, at)) = self.next_restart {
                    soon(at);
                }
            }
        }
        wake
    }
}

/// Waits until the endpoint is due under the faults in force (re-planning on every
/// fault change), then programs it through the node's apply loop.
async fn program(inner: Arc<Inner>, net: PodNet, token: u64, added_at: Instant) {
    let mut rx = inner.faults.subscribe();
    let (delay, nf) = loop {
        rx.borrow_and_update();
        let applied = inner.faults.current();
        let since_applied = added_at.saturating_duration_since(applied.applied_at);
        let nf = applied
            .file
            .for_node(&inner.node.name, &inner.labels, since_applied);
        let planned = {
            let mut rng = rand::rng();
            nf.plan_programming(&mut rng)
        };
        let Some(delay) = planned else {
            tracing::debug!(pod = %net.pod, "agent: never_program drawn; waiting for a fault change");
            if rx.changed().await.is_err() {
                return;
            }
            continue;
        };
        // Absurd delays (e.g. `100years`) would overflow `Instant`: treat as never.
        let at = added_at.checked_add(delay).and_then(|due| {
            let due = due.saturating_duration_since(applied.applied_at);
            applied.applied_at.checked_add(nf.programming_time(due))
        });
        let Some(at) = at else {
            if rx.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => break (delay, nf),
            r = rx.changed() => if r.is_err() { return },
        }
    };
    // With NetworkPolicy enforcement: never program a pod whose labels are unknown
    // (its isolation goes in with it).
    if let Some(ps) = inner.policy.get() {
        if !ps.wait_known(&net.uid, KNOWN_WAIT).await {
            tracing::warn!(pod = %format!("{}/{}", net.namespace, net.pod), "agent: pod still unknown to the policy watches after {KNOWN_WAIT:?}; programming it without NetworkPolicy");
        }
    }
    let lag = nf.isolation_lag.map(|d| d.sample(&mut rand::rng()));
    let apply_guard = inner.apply_loop.lock().await;
    let started = Instant::now();
    if let Some(q) = nf.queue {
        let d = q.per_endpoint.sample(&mut rand::rng());
        tokio::time::sleep(d).await;
    }
    if let Some(floor) = nf.agent.apply_time_floor {
        tokio::time::sleep_until((started + floor).into()).await;
    }
    let inner2 = inner.clone();
    let net2 = net.clone();
    let fcd = nf.first_connections_dropped.unwrap_or(0);
    let res = tokio::task::spawn_blocking(move || {
        apply(&inner2, &net2, token, delay, added_at, started, fcd, lag)
    })
    .await;
    drop(apply_guard);
    match res {
        Ok(true) => {
            if let Some(r) = nf.revoke {
                let after = r.after.sample(&mut rand::rng());
                let weak = Arc::downgrade(&inner);
                let uid = net.uid.clone();
                let task = tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let Some(inner) = weak.upgrade() else { return };
                    let _ = tokio::task::spawn_blocking(move || revoke(&inner, &uid, token, after))
                        .await;
                });
                if let Some(ep) = inner.lock().get_mut(&net.uid) {
                    if ep.token == token {
                        ep.revoke_abort = Some(task.abort_handle());
                    }
                }
            }
        }
        Ok(false) => {}
        Err(e) => {
            if !e.is_cancelled() {
                tracing::error!(pod = %net.pod, error = %e, "agent: programming task failed");
            }
        }
    }
}

/// The allow step, under the endpoints lock: allow (with the pod's NetworkPolicy
/// rules in the same transaction, its deny held back `isolation_lag` when given), mark,
/// record truth and the apply (timed from `started`, the start of the apply). Returns
/// whether it programmed.
#[allow(clippy::too_many_arguments)]
fn apply(
    inner: &Inner,
    net: &PodNet,
    token: u64,
    delay: Duration,
    added_at: Instant,
    started: Instant,
    first_syns_dropped: u32,
    isolation_lag: Option<Duration>,
) -> bool {
    let mut eps = inner.lock();
    match eps.get(&net.uid) {
        Some(ep) if ep.token == token && !ep.programmed => {}
        _ => return false, // removed or replaced meanwhile
    }
    let (now, now_unix) = (Instant::now(), unix_now());
    let ps = inner.policy.get();
    let mut tracker = ps.map(|ps| {
        let desired = ps.desired(&eps.values().map(|e| e.net.clone()).collect::<Vec<_>>());
        let mut t = ps.tracker();
        t.observe(desired, now, now_unix, &mut inner.policy_plan());
        t
    });
    let batch = tracker
        .as_ref()
        .and_then(|t| t.endpoint_programmed(&net.uid, now, now_unix, isolation_lag));
    // The drop budget is armed from readiness_ok on (module docs, step 4), not here.
    let rules = batch.as_ref().map(|b| b.rules()).unwrap_or_default();
    let r = if rules.is_empty() {
        inner.dataplane.allow(&inner.node.name, net.ip)
    } else {
        inner
            .dataplane
            .write_policies(&inner.node.name, &rules, Some(net.ip))
    };
    drop(rules);
    let apply_time = started.elapsed();
    inner.count_apply(apply_time, Some(1), r.is_ok());
    match r {
        Ok(()) => {
            if let Some(ep) = eps.get_mut(&net.uid) {
                ep.programmed = true;
                ep.abort = None;
            }
            inner.counters.programmed.fetch_add(1, Ordering::Relaxed);
            inner.truth.emit(TruthEvent::pod(
                TruthKind::EndpointProgrammed,
                net,
                json!({
                    "delay_seconds": delay.as_secs_f64(),
                    "apply_seconds": apply_time.as_secs_f64(),
                    "waited_seconds": added_at.elapsed().as_secs_f64(),
                    "first_connections_dropped": first_syns_dropped,
                }),
            ));
            if let (Some(t), Some(b)) = (tracker.as_mut(), batch) {
                inner.record_policy(&b.transitions, apply_time);
                t.commit(b);
            }
            drop(tracker);
            if let Some(ps) = ps {
                ps.bump(); // an isolation_lag deny now waits in the policy task
            }
            true
        }
        Err(e) => {
            // Felix would retry on its next apply; one retry loop here is enough to stay
            // faithful without hiding a broken dataplane: log and leave it pending.
            tracing::error!(pod = %net.pod, error = %e, "agent: allow failed; endpoint stays unprogrammed");
            false
        }
    }
}

/// Fault `revoke`: removes the endpoint's IP from the allow set for good.
fn revoke(inner: &Inner, uid: &str, token: u64, after: Duration) {
    let mut eps = inner.lock();
    let Some(ep) = eps.get_mut(uid) else { return };
    if ep.token != token || !ep.programmed {
        return;
    }
    let started = Instant::now();
    let r = inner.dataplane.disallow(&inner.node.name, ep.net.ip);
    inner.count_apply(started.elapsed(), Some(1), r.is_ok());
    match r {
        Ok(()) => {
            ep.programmed = false;
            ep.revoke_abort = None;
            inner.counters.revoked.fetch_add(1, Ordering::Relaxed);
            inner.truth.emit(TruthEvent::pod(
                TruthKind::EndpointRevoked,
                &ep.net,
                json!({"reason": "revoke", "after_seconds": after.as_secs_f64()}),
            ));
        }
        Err(e) => tracing::error!(pod = %ep.net.pod, error = %e, "agent: revoke failed"),
    }
}
