//! The lifecycle of one probe (docs/design.md §2 steps 2–8), per kind: create the target pod T,
//! wait for it to be Ready, create the source pod S dialing T, wait for S to terminate,
//! record, delete.
//!
//! Kinds and their **API-write budget per probe** (creates + deletes; Events are counted
//! apart; docs/design.md §7: "≤ 4 for cross_node and same_node, other kinds list their own"):
//! - `cross_node`: S on node A, T on node B ≠ A. **4** writes: create T, create S,
//!   delete S, delete T.
//! - `same_node`: the control pair, S and T on the same node (the node-local path only).
//!   **4** writes, as `cross_node`.
//! - `recreate`: StatefulSet style. T has a stable name per node
//!   ([`crate::podspec::recreate_target_name`]); the probe deletes the previous
//!   incarnation, waits for the watch's `DELETED` (the old pod is gone, as a StatefulSet
//!   controller waits), creates T again with the **same name on the same node** (so a
//!   Calico-like CNI reuses the interface name, calico#11016), then measures as usual.
//!   When no previous incarnation is alive (first probe on that node), one is created
//!   first and waited Ready. The record keeps `previous_ip`, `iface`, `iface_reused`
//!   and `recreate_gap_seconds`. When a later probe of the plan recreates the same
//!   target, T is left running for it. Budget **6**: create T₀ + delete T₀ (or delete
//!   of the kept incarnation: 1), create T, create S, delete S, delete T (skipped when
//!   kept). Steady state (T kept between probes) is 4.
//!   Every `recreate` record carries `recreate` (also failures). When an earlier probe
//!   of the run failed and deleted its incarnation, the next probe's T₀ has the same
//!   name on the same node: T₀ itself is then a recreate (the CNI reuses the interface
//!   name, exactly the calico#11016 case), so the record says `iface_reused: true` with
//!   the deleted incarnation as `previous_*`, and a T₀ that never turns Ready fails the
//!   probe (`target_never_ready`, detail "first incarnation …").
//! - `service`: S on node A, T on node B ≠ A, plus a per-probe ClusterIP Service
//!   `fp-<id>-svc` ([`crate::podspec::probe_service`]) selecting only T, created before
//!   T (so T joins it as a fresh endpoint, as a new pod joins a Deployment's Service).
//!   S dials `<clusterIP>:80` (→ targetPort 8080) with `--expect-pod` T, so TTFP
//!   includes the service proxy programming on A. The record keeps `service: {name,
//!   cluster_ip}`. Budget **6**: Service create + delete, and the 4 of `cross_node`.
//! - `burst`: T is created once K filler pods (`--burst-size`, component
//!   `probe-filler`, `target-server serve`) on T's node have their IPs (≤ 10 s), so its
//!   endpoint joins the node's backlog behind K others; TTFP of T. The record's `burst` keeps `fillers_ready_seconds`
//!   and `backlog_drain_seconds` ([`burst_backlog`]); the gate runs no other probe on
//!   T's node meanwhile (`crate::schedule::node_claims`). Budget **4 + 2K** (K filler
//!   creates and deletes).
//!
//! Every probe counts its own writes ([`ProbeRecord::api_writes`]) and logs a warning
//! when it exceeds [`write_budget`]. Every wait runs on the shared [`PodWatch`] under a
//! deadline; cancellation (signal, `--timeout`, the gate's early stop) turns the probe
//! into `inconclusive`/`interrupted` and still deletes its pods. A pod that stays
//! `Unschedulable` for [`UNSCHEDULABLE_GRACE`] ends the probe as
//! `inconclusive`/`unschedulable`. When a wait runs out, the probe GETs the pod once (an
//! update the watch missed still counts); if that GET fails or the pod watch failed
//! during the wait, the probe is `inconclusive`/`api_error` ([`api_trouble_ending`]):
//! with the API away, no stage of the pods can be blamed. The decisions themselves are
//! pure ([`timeout_ending`], [`api_trouble_ending`], [`unschedulable_ending`],
//! [`crate::record::build_record`]).

use crate::api::{with_timeout, API_CALL_TIMEOUT};
use crate::error::Error;
use crate::kind::ProbeKind;
use crate::labels::FIELD_MANAGER;
use crate::podspec::duration_arg;
use crate::podspec::{
    calico_iface_name, filler_pod, filler_pod_name, host_port, pod_name, probe_pod_named,
    probe_service, recreate_target_name, service_name, source_args, source_args_to, target_args,
    PodConfig, PodRole, SERVICE_PORT,
};
use crate::podwatch::{PodWatch, Wait};
use crate::record::{build_record, Ending, ProbeMeta};
use crate::tracker::{PodState, ProblemKind};
use firstpacket_report::{BurstInfo, ProbeRecord, ProbeResult, Reason, RecreateInfo, ServiceInfo};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

/// Extra time the source gets beyond give-up + hold to start and report.
pub const SOURCE_FINISH_MARGIN: Duration = Duration::from_secs(30);

/// How long a probe pod may stay `PodScheduled=False` / `Unschedulable` before the probe
/// is recorded `inconclusive`/`unschedulable` (source and target alike), instead of
/// waiting out give-up (+ hold + margin for the source).
///
/// 10 s: the scheduler retries an unschedulable pod when a cluster event may make it fit
/// (node added/updated, pod deleted), after its per-pod backoff, which grows from
/// `podInitialBackoffSeconds` (1 s) to `podMaxBackoffSeconds` (10 s) by default
/// (kube-scheduler configuration, `KubeSchedulerConfiguration` v1). A condition that
/// flips within one maximum backoff (e.g. a node that just turned Ready or was
/// uncordoned) does not cost the probe; one that holds longer is not going to be
/// measured within a useful time.
pub const UNSCHEDULABLE_GRACE: Duration = Duration::from_secs(10);

/// Timeout of the single read (by name) a probe makes of its pod when a wait ran out, to read the
/// pod's real state past a watch that may have missed updates.
pub const FINAL_GET_TIMEOUT: Duration = Duration::from_secs(10);

/// A burst's backlog ([`BurstInfo::fillers_ready_seconds`],
/// [`BurstInfo::backlog_drain_seconds`]), seconds since the first filler's create:
/// `fillers` are the filler pods' tracked states (`None` when never seen), `created` how
/// many create calls succeeded, `source_ready` / `raw_ttfp` the record's prober-clock
/// source Ready (seconds since `origin`, the probe start) and the source's raw TTFP.
/// Pure. Fillers Ready is `None` unless `created` fillers were seen Ready; the drain is
/// `None` unless both it and a first success are known.
pub fn burst_backlog(
    origin: std::time::Instant,
    fillers: &[Option<PodState>],
    created: u32,
    source_ready: Option<f64>,
    raw_ttfp: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    let since = |t: std::time::Instant| t.saturating_duration_since(origin).as_secs_f64();
    let seen: Vec<&PodState> = fillers.iter().flatten().collect();
    let Some(first_create) = seen.iter().filter_map(|s| s.created).min().map(since) else {
        return (None, None);
    };
    let readies: Vec<f64> = seen.iter().filter_map(|s| s.ready).map(since).collect();
    if created == 0 || readies.len() < created as usize {
        return (None, None);
    }
    let last_ready = readies.iter().copied().fold(f64::MIN, f64::max);
    let ready = (last_ready - first_create).max(0.0);
    let success = match (source_ready, raw_ttfp) {
        (Some(r), Some(raw)) => Some(r + raw),
        _ => None,
    };
    let drain = success.map(|s| (s.max(last_ready) - first_create).max(0.0));
    (Some(ready), drain)
}

/// API-write budget of one probe of `kind` (module docs): 4 for `cross_node` and
/// `same_node` (docs/design.md §7), 6 for `recreate`, 4 + 2 × `burst_size` for `burst`.
/// `service` adds a Service create + delete: 6. `policy`: 10 (the isolate and egress
/// policies, T, the intruder and S, created and deleted); `policy_change`: 8 (the
/// isolate policy, T and S created and deleted, the allow policy created and deleted;
/// its three marks are `create pods/proxy` requests, counted apart:
/// [`ProbeRecord::api_writes`] counts stored writes only).
pub fn write_budget(kind: ProbeKind, burst_size: u32) -> u64 {
    match kind {
        ProbeKind::CrossNode | ProbeKind::SameNode | ProbeKind::Unprobed => 4,
        ProbeKind::Recreate | ProbeKind::Service => 6,
        ProbeKind::Burst => 4 + 2 * u64::from(burst_size),
        ProbeKind::Policy => 10,
        ProbeKind::PolicyChange => 8,
    }
}

/// A live incarnation of a stable-name `recreate` target, kept between probes.
#[derive(Debug, Clone, PartialEq)]
pub struct Incarnation {
    /// Its UID (the `DELETED` event to wait for carries it).
    pub uid: Option<String>,
    /// Its pod IP.
    pub ip: Option<String>,
    /// Its node.
    pub node: String,
    /// `None` while it is alive (kept for the next probe); the prober-clock time of its
    /// delete call once a probe deleted it (the name has then been used on the node, so
    /// the next incarnation reuses the interface name).
    pub deleted_at: Option<std::time::Instant>,
}

/// Per stable name: the latest incarnation (alive and kept, or deleted), behind an async
/// lock that also serialises `recreate` probes of the same node.
pub type RecreateSlots = Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Incarnation>>>>>;

/// What every probe of a run shares.
pub struct ProbeEnv {
    /// Pods in the probe namespace.
    pub pods: Api<Pod>,
    /// Nodes (for the `node_not_ready` check).
    pub nodes: Api<Node>,
    /// API server URL (for error messages).
    pub url: String,
    /// Pod manifest settings.
    pub pod_config: PodConfig,
    /// The shared pod watch.
    pub watch: Arc<PodWatch>,
    /// `--slow-threshold`.
    pub slow_threshold: Duration,
    /// API writes made by the whole run (creates + deletes).
    pub writes: AtomicU64,
    /// Where the engine reports a [`EngineFault`] (a forbidden create or delete); the
    /// caller's policy decides (the gate stops the run, the continuous mode carries on).
    pub on_fault: FaultSink,
    /// Stable-name `recreate` targets kept alive between probes.
    pub recreate_slots: RecreateSlots,
    /// Node-agent correlation (docs/design.md §3); `None` turns it off.
    pub agents: Option<Arc<crate::agents::scrape::AgentWatcher>>,
    /// Agent findings on probes with normal TTFP (and every `agent_unreachable`), one
    /// per (node, signal): the report's `warnings[]`.
    pub agent_warnings: Mutex<Vec<firstpacket_report::Suspect>>,
}

/// The run-fatal error text for a `401`/`403` on deleting a probe object: the error
/// (verb, resource, URL, the API server's message) and what it means — the gate cannot
/// clean up, so it stops; leftovers end by `activeDeadlineSeconds` (give-up + hold +
/// margin, [`crate::podspec::active_deadline_seconds`]) and the next run's start-up
/// sweep (which needs the same permission).
pub fn delete_forbidden_text(err: &Error, instance: &str) -> String {
    format!(
        "{err}; cleanup cannot work: the gate stops, and probe pods it cannot delete \
         (label firstpacket.io/instance={instance}) end by their activeDeadlineSeconds; \
         grant delete on pods (and services) in the probe namespace"
    )
}

/// A fault in the engine that the caller's policy must decide on (the probe itself
/// already ended `inconclusive`/`api_error` or `admission_rejected`, or logged the
/// failed delete).
#[derive(Debug)]
pub enum EngineFault {
    /// `401`/`403` from RBAC/authentication creating a probe pod or Service
    /// ([`Error::Api`], verb `create`).
    CreateForbidden(Error),
    /// `401`/`403` deleting a probe pod or Service: cleanup cannot work.
    DeleteForbidden(Error),
    /// An admission plugin or webhook rejected a probe object
    /// ([`crate::admission::classify`]): every probe of this spec would be rejected too.
    /// Carries the text of [`crate::admission::Rejection::text`] and the API URL.
    AdmissionRejected(String),
}

impl EngineFault {
    /// The error text for the operator: the API error, and for a forbidden delete what
    /// it means ([`delete_forbidden_text`]).
    pub fn text(&self, instance: &str) -> String {
        match self {
            EngineFault::CreateForbidden(e) => e.to_string(),
            EngineFault::DeleteForbidden(e) => delete_forbidden_text(e, instance),
            EngineFault::AdmissionRejected(t) => t.clone(),
        }
    }

    /// The `firstpacket_engine_faults_total{fault}` label: `create_forbidden`,
    /// `delete_forbidden`, `admission_rejected`.
    pub fn label(&self) -> &'static str {
        match self {
            EngineFault::CreateForbidden(_) => "create_forbidden",
            EngineFault::DeleteForbidden(_) => "delete_forbidden",
            EngineFault::AdmissionRejected(_) => "admission_rejected",
        }
    }
}

/// How long a create refused because the namespace's ServiceAccount does not exist yet
/// ([`crate::admission::is_service_account_pending`]) is retried (every
/// [`SERVICE_ACCOUNT_RETRY`]): the controller-manager creates `default` within about a
/// second of the namespace; 10 s covers a busy one. After that it is an admission
/// rejection like any other.
pub const SERVICE_ACCOUNT_WAIT: Duration = Duration::from_secs(10);

/// Pause between the retries of [`SERVICE_ACCOUNT_WAIT`].
pub const SERVICE_ACCOUNT_RETRY: Duration = Duration::from_millis(500);

/// The API error's code and `Status.message`, if it is an API answer.
fn status_of(err: &kube::Error) -> Option<(u16, &str)> {
    match err {
        kube::Error::Api(s) => Some((s.code, s.message.as_str())),
        _ => None,
    }
}

/// The ending and fault of a failed create of `what` (`pod NS/NAME`, `service NS/NAME`):
/// an admission rejection ([`crate::admission::classify`]) ends the probe
/// `admission_rejected` and reports [`EngineFault::AdmissionRejected`]; a `401`/`403`
/// from RBAC is [`EngineFault::CreateForbidden`] and the probe ends `api_error`, as does
/// any other API error (no fault).
fn create_failed(env: &ProbeEnv, e: kube::Error, what: String) -> Ending {
    let rejection = status_of(&e).and_then(|(code, msg)| crate::admission::classify(code, msg));
    if let Some(r) = rejection {
        let text = format!("Kubernetes API at {}: {}", env.url, r.text(&what));
        env.fault(EngineFault::AdmissionRejected(text.clone()));
        return Ending::Aborted {
            reason: Reason::AdmissionRejected,
            detail: text,
        };
    }
    let err = Error::from_kube(e, &env.url, "create", what);
    if let Some(f) = forbidden_fault(&err, false) {
        env.fault(f);
    }
    Ending::Aborted {
        reason: Reason::ApiError,
        detail: err.to_string(),
    }
}

/// The caller's handler of [`EngineFault`]s (called from probe tasks; must not block).
pub type FaultSink = Arc<dyn Fn(EngineFault) + Send + Sync>;

/// `Some(fault)` when `err` is the API's `401`/`403` (the create/delete cannot work at
/// all).
fn forbidden_fault(err: &Error, delete: bool) -> Option<EngineFault> {
    if !err.is_forbidden() {
        return None;
    }
    let e = err.duplicate_api()?;
    Some(if delete {
        EngineFault::DeleteForbidden(e)
    } else {
        EngineFault::CreateForbidden(e)
    })
}

impl ProbeEnv {
    /// The environment of a mode's probes: `pods` in the probe namespace (the engine's
    /// start-up made them usable; their client also reads Nodes), the pod `watch`, the
    /// pod specs' `pod_config`, `--slow-threshold`, the mode's fault policy and agent
    /// watcher; API writes counted from 0, no recreate slot, no agent warning yet.
    pub fn new(
        pods: Api<Pod>,
        watch: Arc<PodWatch>,
        url: &str,
        pod_config: PodConfig,
        slow_threshold: Duration,
        on_fault: FaultSink,
        agents: Arc<crate::agents::scrape::AgentWatcher>,
    ) -> ProbeEnv {
        ProbeEnv {
            nodes: Api::all(pods.clone().into_client()),
            pods,
            url: url.to_owned(),
            pod_config,
            watch,
            slow_threshold,
            writes: AtomicU64::new(0),
            on_fault,
            recreate_slots: Mutex::new(Default::default()),
            agents: Some(agents),
            agent_warnings: Mutex::new(Vec::new()),
        }
    }

    fn fault(&self, f: EngineFault) {
        (self.on_fault)(f)
    }

    /// Number of stable-name `recreate` slots held (bounded by the nodes probed; see
    /// [`ProbeEnv::prune_recreate_slots`]).
    pub fn recreate_slot_count(&self) -> usize {
        self.recreate_slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Drops the `recreate` slots whose stable name `keep` rejects (e.g. of nodes that
    /// left the cluster) and that no probe holds.
    pub fn prune_recreate_slots(&self, keep: impl Fn(&str) -> bool) {
        self.recreate_slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|name, slot| keep(name) || Arc::strong_count(slot) > 1);
    }

    fn slot(&self, name: &str) -> Arc<tokio::sync::Mutex<Option<Incarnation>>> {
        let mut m = self
            .recreate_slots
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        m.entry(name.to_string()).or_default().clone()
    }
}

/// One probe to run.
#[derive(Debug, Clone)]
pub struct ProbePlan {
    /// Probe id (pod names `fp-<id>-t` / `fp-<id>-s`).
    pub id: String,
    /// Kind.
    pub kind: ProbeKind,
    /// Node A.
    pub source_node: String,
    /// Node B (= A for `same_node`).
    pub target_node: String,
    /// `recreate`: leave the target running for a later probe (see
    /// [`crate::schedule::PlannedProbe::keep_target`]).
    pub keep_target: bool,
    /// `burst`: number of filler pods.
    pub burst_size: u32,
}

impl ProbePlan {
    /// The target pod's name: `fp-<id>-t`, or the stable name for `recreate`.
    pub fn target_name(&self, instance: &str) -> String {
        match self.kind {
            ProbeKind::Recreate => recreate_target_name(instance, &self.target_node),
            _ => pod_name(&self.id, PodRole::Target),
        }
    }
}

fn role_name(role: PodRole) -> &'static str {
    match role {
        PodRole::Target => "target",
        PodRole::Source => "source",
        PodRole::Filler => "filler",
        PodRole::Intruder => "intruder",
    }
}

/// Ending for a pod problem seen while waiting (image pull, container start, exit).
pub fn problem_ending(role: PodRole, s: &PodState) -> Option<Ending> {
    let who = role_name(role);
    if let Some(p) = &s.problem {
        let reason = match p.kind {
            ProblemKind::ImagePull => Reason::ImagePull,
            ProblemKind::ContainerFailed => Reason::ContainerFailed,
            ProblemKind::Unschedulable => Reason::Unschedulable,
        };
        return Some(Ending::Aborted {
            reason,
            detail: format!("{who} pod {}: {}: {}", s.name, p.reason, p.message),
        });
    }
    if s.deleted.is_some() {
        return Some(Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("{who} pod {} was deleted by someone else", s.name),
        });
    }
    None
}

/// Ending for a pod that has been `PodScheduled=False` with reason `Unschedulable` for
/// at least `grace` at `now` (pure; [`UNSCHEDULABLE_GRACE`] in the probes):
/// `inconclusive`/`unschedulable` with the scheduler's message. `None` while it is
/// scheduled, not (yet) unschedulable, or within the grace (the scheduler retries and
/// the condition can flip).
pub fn unschedulable_ending(
    role: PodRole,
    s: &PodState,
    now: std::time::Instant,
    grace: Duration,
) -> Option<Ending> {
    if s.scheduled.is_some() {
        return None;
    }
    let u = s.unschedulable.as_ref()?;
    let pending = now.saturating_duration_since(u.since);
    (pending >= grace).then(|| Ending::Aborted {
        reason: Reason::Unschedulable,
        detail: format!(
            "{} pod {} unschedulable for {:.0}s (grace {:.0}s): {}",
            role_name(role),
            s.name,
            pending.as_secs_f64(),
            grace.as_secs_f64(),
            u.message
        ),
    })
}

/// Ending for a pod problem seen while waiting: [`problem_ending`] (image pull,
/// container start, deleted) or [`unschedulable_ending`] after [`UNSCHEDULABLE_GRACE`].
pub fn pod_ending(role: PodRole, s: &PodState, now: std::time::Instant) -> Option<Ending> {
    problem_ending(role, s).or_else(|| unschedulable_ending(role, s, now, UNSCHEDULABLE_GRACE))
}

/// Ending when a wait for `role` ran out of time while the API failed us (`trouble`: the
/// pod watch reported errors during the wait, or the final GET of the pod failed):
/// `inconclusive`/`api_error` (docs/design.md §2 "Results": not the network's fault). The pods
/// may well have progressed — in a real cluster the kubelet reports status through the
/// same API server — so no stage is blamed; the last state the prober saw is in the
/// detail. Pure.
pub fn api_trouble_ending(
    role: PodRole,
    s: Option<&PodState>,
    waited: Duration,
    trouble: &str,
) -> Ending {
    let seen = match timeout_ending(role, s, waited) {
        Ending::Aborted { detail, .. } => detail,
        Ending::SourceTerminated => String::new(),
    };
    Ending::Aborted {
        reason: Reason::ApiError,
        detail: format!(
            "Kubernetes API failed while waiting for the {} pod: {trouble}; last state seen: {seen}",
            role_name(role)
        ),
    }
}

/// Ending when a wait for `role` ran out of time (pure; rules of docs/design.md §2 "Results"):
/// never scheduled → `unschedulable` (with the scheduler's message); scheduled but the
/// container never ran → `container_failed`; running but never Ready →
/// `target_never_ready` / `source_never_ready`; Ready but unfinished (source) →
/// `container_failed`.
pub fn timeout_ending(role: PodRole, s: Option<&PodState>, waited: Duration) -> Ending {
    let who = role_name(role);
    let secs = waited.as_secs_f64();
    let Some(s) = s else {
        return Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("{who} pod never appeared in the watch within {secs:.0}s"),
        };
    };
    if s.scheduled.is_none() {
        let msg = s
            .unschedulable
            .as_ref()
            .map(|u| u.message.clone())
            .unwrap_or_else(|| "no scheduling decision".into());
        return Ending::Aborted {
            reason: Reason::Unschedulable,
            detail: format!("{who} pod {} not scheduled after {secs:.0}s: {msg}", s.name),
        };
    }
    if s.running.is_none() {
        return Ending::Aborted {
            reason: Reason::ContainerFailed,
            detail: format!(
                "{who} pod {} container not running after {secs:.0}s (phase {})",
                s.name,
                s.phase.as_deref().unwrap_or("unknown")
            ),
        };
    }
    if s.ready.is_none() {
        let reason = match role {
            PodRole::Target | PodRole::Filler => Reason::TargetNeverReady,
            PodRole::Source | PodRole::Intruder => Reason::SourceNeverReady,
        };
        return Ending::Aborted {
            reason,
            detail: format!(
                "{who} pod {} on {} running but not Ready after {secs:.0}s",
                s.name,
                s.node.as_deref().unwrap_or("?")
            ),
        };
    }
    Ending::Aborted {
        reason: Reason::ContainerFailed,
        detail: format!("{who} pod {} did not finish within {secs:.0}s", s.name),
    }
}

fn interrupted(stage: &str) -> Ending {
    Ending::Aborted {
        reason: Reason::Interrupted,
        detail: format!("run interrupted while {stage}"),
    }
}

/// Per-probe bookkeeping: writes made, pods to delete at the end, kind extras.
#[derive(Default)]
struct ProbeState {
    writes: u64,
    /// Pods this probe created and still owns (deleted at the end, except a kept
    /// `recreate` target).
    created: Vec<String>,
    recreate: Option<RecreateInfo>,
    burst: Option<BurstInfo>,
    /// `service`: the Service once created (deleted at the end).
    service: Option<ServiceInfo>,
    /// `policy`, `policy_change`: the NetworkPolicies created and still to delete, in
    /// creation order, and what the probe learnt about them.
    policies: Vec<String>,
    policy: Option<firstpacket_report::PolicyInfo>,
    /// The paths the source was asked to dial ([`crate::paths`]; empty: the main one).
    paths: Vec<crate::paths::PlannedPath>,
}

impl ProbeState {
    fn owns(&mut self, name: &str) {
        if !self.created.iter().any(|n| n == name) {
            self.created.push(name.to_string());
        }
    }

    fn disown(&mut self, name: &str) {
        self.created.retain(|n| n != name);
    }
}

async fn create(env: &ProbeEnv, st: &mut ProbeState, pod: &Pod) -> Result<(), Ending> {
    st.writes += 1;
    let r = create_counted(env, pod).await;
    if r.is_ok() {
        st.owns(pod.metadata.name.as_deref().unwrap_or_default());
    }
    r
}

/// One create call (counted in the run's writes); the watch's tracker learns the time.
/// A create refused because the namespace's ServiceAccount does not exist yet is retried
/// for [`SERVICE_ACCOUNT_WAIT`] (each retry counted as a write); other failures end as
/// [`create_failed`] says.
async fn create_counted(env: &ProbeEnv, pod: &Pod) -> Result<(), Ending> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = env.pod_config.namespace.as_str();
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    let sa_deadline = Instant::now() + SERVICE_ACCOUNT_WAIT;
    loop {
        env.writes.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(API_CALL_TIMEOUT, env.pods.create(&pp, pod)).await {
            Ok(Ok(_)) => {
                let now = std::time::Instant::now();
                env.watch.with_tracker(|t| t.note_created(&name, now));
                return Ok(());
            }
            Ok(Err(e))
                if status_of(&e)
                    .is_some_and(|(c, m)| crate::admission::is_service_account_pending(c, m))
                    && Instant::now() + SERVICE_ACCOUNT_RETRY < sa_deadline =>
            {
                tracing::info!(pod = %name, error = %crate::error::kube_error_text(&e),
                    "the namespace's ServiceAccount does not exist yet; retrying the create");
                tokio::time::sleep(SERVICE_ACCOUNT_RETRY).await;
            }
            Ok(Err(e)) => return Err(create_failed(env, e, format!("pod {ns}/{name}"))),
            Err(_) => {
                return Err(Ending::Aborted {
                    reason: Reason::ApiError,
                    detail: format!(
                        "create pod {ns}/{name} at {} timed out after {}s",
                        env.url,
                        API_CALL_TIMEOUT.as_secs()
                    ),
                })
            }
        }
    }
}

/// Deletes a probe pod (grace 0; 404 is fine). Returns when the delete returned (prober
/// clock), or the error ([`Error::Api`] with verb `delete`, or [`Error::Unreachable`]
/// when no answer came within [`API_CALL_TIMEOUT`]). A `401`/`403` is also reported to
/// the caller's [`FaultSink`]. Counted in the run's writes.
pub async fn delete_pod(env: &ProbeEnv, name: &str) -> Result<std::time::Instant, Error> {
    delete_pod_with(env, name, DeleteParams::default().grace_period(0)).await
}

/// [`delete_pod`] with explicit delete options (a `recreate` target is deleted
/// gracefully, as a StatefulSet controller does, so its `DELETED` event means the kubelet
/// has stopped it).
async fn delete_pod_with(
    env: &ProbeEnv,
    name: &str,
    dp: DeleteParams,
) -> Result<std::time::Instant, Error> {
    delete_counted(env, &env.pods, "pod", name, &dp).await?;
    Ok(std::time::Instant::now())
}

/// One delete call of a probe's `what` (`pod`, `service`) counted in the run's writes,
/// bounded by [`API_CALL_TIMEOUT`] ([`with_timeout`]); 404 is fine (already gone). A
/// `401`/`403` is also reported to the caller's [`FaultSink`].
async fn delete_counted<K>(
    env: &ProbeEnv,
    api: &Api<K>,
    what: &str,
    name: &str,
    dp: &DeleteParams,
) -> Result<(), Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    env.writes.fetch_add(1, Ordering::Relaxed);
    let resource = format!("{what} {}/{name}", env.pod_config.namespace);
    match with_timeout(api.delete(name, dp), &env.url, "delete", &resource).await {
        Ok(_) | Err(Error::Api { code: 404, .. }) => Ok(()),
        Err(err) => {
            if let Some(f) = forbidden_fault(&err, true) {
                env.fault(f);
            }
            Err(err)
        }
    }
}

/// Waits until `name` is Ready with an IP; the ending otherwise (rules of
/// [`problem_ending`] / [`timeout_ending`]). Returns the IP.
async fn wait_target_ready(
    env: &ProbeEnv,
    name: &str,
    cancel: &mut watch::Receiver<bool>,
) -> Result<String, Ending> {
    let waited = env.pod_config.give_up;
    let started = std::time::Instant::now();
    let deadline = Instant::now() + waited;
    match env
        .watch
        .wait_for(name, deadline, cancel, target_ready_check)
        .await
    {
        Wait::Done(r) => r,
        Wait::Cancelled => Err(interrupted("waiting for the target to be Ready")),
        Wait::TimedOut => settle_timeout(
            env,
            PodRole::Target,
            name,
            started,
            waited,
            target_ready_check,
        )
        .await
        .and_then(|r| r),
    }
}

/// What ends the wait for a target: Ready with an IP (`Ok(ip)`), or a problem
/// ([`pod_ending`]) or an exit before Ready (`Err`). `None`: keep waiting.
fn target_ready_check(s: Option<&PodState>) -> Option<Result<String, Ending>> {
    let s = s?;
    if let (Some(_), Some(ip)) = (s.ready, &s.ip) {
        return Some(Ok(ip.clone()));
    }
    if let Some(e) = pod_ending(PodRole::Target, s, std::time::Instant::now()) {
        return Some(Err(e));
    }
    s.terminated.as_ref().map(|t| {
        Err(Ending::Aborted {
            reason: Reason::ContainerFailed,
            detail: format!(
                "target pod {} exited (code {}) before it was Ready",
                s.name, t.exit_code
            ),
        })
    })
}

/// What ends the wait for a source: its termination, or a problem ([`pod_ending`]).
fn source_done_check(s: Option<&PodState>) -> Option<Ending> {
    let s = s?;
    if s.terminated.is_some() {
        return Some(Ending::SourceTerminated);
    }
    pod_ending(PodRole::Source, s, std::time::Instant::now())
}

/// After a wait on `name` ran out of time: one read of the pod by name
/// ([`crate::api::read_by_name`], a `list`, so RBAC needs no `get`) (bounded by
/// [`FINAL_GET_TIMEOUT`]) is fed into the tracker, so an update the watch missed still
/// counts, and `check` decides again. Otherwise the ending is [`api_trouble_ending`]
/// when the GET failed or the watch reported trouble since `started`
/// ([`PodWatch::trouble_since`]), else [`timeout_ending`]. Returns `Ok(value)` when
/// `check` decided, `Err(ending)` otherwise.
async fn settle_timeout<T>(
    env: &ProbeEnv,
    role: PodRole,
    name: &str,
    started: std::time::Instant,
    waited: Duration,
    mut check: impl FnMut(Option<&PodState>) -> Option<T>,
) -> Result<T, Ending> {
    let mut trouble = None;
    match tokio::time::timeout(FINAL_GET_TIMEOUT, crate::api::read_by_name(&env.pods, name)).await {
        Ok(Ok(Some(pod))) => {
            let now = std::time::Instant::now();
            env.watch.with_tracker(|t| t.apply(&pod, now));
        }
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            let ns = &env.pod_config.namespace;
            trouble = Some(
                Error::from_kube(e, &env.url, "list/get", format!("pod {ns}/{name}")).to_string(),
            );
        }
        Err(_) => {
            trouble = Some(format!(
                "get pod {name} at {} timed out after {}s",
                env.url,
                FINAL_GET_TIMEOUT.as_secs()
            ))
        }
    }
    let state = env.watch.snapshot(name);
    if let Some(v) = check(state.as_ref()) {
        return Ok(v);
    }
    let trouble = trouble.or_else(|| {
        env.watch
            .trouble_since(started)
            .map(|e| format!("pod watch failed: {e}"))
    });
    Err(match trouble {
        Some(t) => api_trouble_ending(role, state.as_ref(), waited, &t),
        None => timeout_ending(role, state.as_ref(), waited),
    })
}

fn services_api(env: &ProbeEnv) -> Api<Service> {
    Api::namespaced(env.pods.clone().into_client(), &env.pod_config.namespace)
}

/// `service`: creates the probe's ClusterIP Service ([`probe_service`]) and keeps its
/// name and the allocated `spec.clusterIP` in `st.service` (the create response carries
/// it: the API server allocates it on create). Counted as one write; a 401/403 is
/// run-fatal as for pods; a Service without a ClusterIP is an `api_error`.
async fn create_service(
    env: &ProbeEnv,
    plan: &ProbePlan,
    st: &mut ProbeState,
) -> Result<(), Ending> {
    let ns = env.pod_config.namespace.as_str();
    let name = service_name(&plan.id);
    let svc = probe_service(&env.pod_config, &plan.id, plan.kind.as_str());
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    st.writes += 1;
    env.writes.fetch_add(1, Ordering::Relaxed);
    let created =
        match tokio::time::timeout(API_CALL_TIMEOUT, services_api(env).create(&pp, &svc)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(create_failed(env, e, format!("service {ns}/{name}"))),
            Err(_) => {
                return Err(Ending::Aborted {
                    reason: Reason::ApiError,
                    detail: format!(
                        "create service {ns}/{name} at {} timed out after {}s",
                        env.url,
                        API_CALL_TIMEOUT.as_secs()
                    ),
                })
            }
        };
    let cluster_ip = created
        .spec
        .and_then(|s| s.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None");
    st.service = Some(ServiceInfo {
        name: name.clone(),
        cluster_ip: cluster_ip.clone(),
    });
    if cluster_ip.is_none() {
        return Err(Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("service {ns}/{name} was created without a clusterIP"),
        });
    }
    Ok(())
}

/// Deletes a probe's Service (404 is fine); counted in the run's writes. Errors as
/// [`delete_pod`].
async fn delete_service(env: &ProbeEnv, name: &str) -> Result<(), Error> {
    delete_counted(
        env,
        &services_api(env),
        "service",
        name,
        &DeleteParams::default(),
    )
    .await
}

/// `recreate`: makes sure a previous incarnation of the stable-name target exists
/// (creating one if none is kept), deletes it, waits for its `DELETED`, and returns
/// what the record keeps plus the prober-clock time of the delete call.
async fn retire_previous(
    env: &ProbeEnv,
    plan: &ProbePlan,
    t_name: &str,
    slot: &mut Option<Incarnation>,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Result<(Incarnation, std::time::Instant), Ending> {
    let cfg = &env.pod_config;
    let iface = calico_iface_name(&cfg.namespace, t_name);
    st.recreate = Some(RecreateInfo {
        iface: iface.clone(),
        ..Default::default()
    });
    let prev = match slot.take() {
        Some(p) if p.node == plan.target_node && p.deleted_at.is_none() => p,
        other => {
            let mut reused_from = None;
            if let Some(p) = other {
                if p.node == plan.target_node {
                    // An earlier probe deleted its incarnation: T₀ reuses the name.
                    reused_from = Some(p);
                } else {
                    // An incarnation on another node cannot be reused by name: drop it.
                    tracing::warn!(pod = %t_name, node = %p.node, "recreate target on another node");
                }
            }
            if let Some(p) = &reused_from {
                st.recreate = Some(RecreateInfo {
                    previous_ip: p.ip.clone(),
                    previous_uid: p.uid.clone(),
                    iface,
                    iface_reused: true,
                    recreate_gap_seconds: p.deleted_at.map(|d| {
                        std::time::Instant::now()
                            .saturating_duration_since(d)
                            .as_secs_f64()
                    }),
                });
            }
            first_incarnation(env, plan, t_name, reused_from.as_ref(), cancel, st).await?
        }
    };
    st.owns(t_name);
    st.writes += 1;
    // Graceful (the pod's own terminationGracePeriodSeconds), not grace 0: with grace 0
    // the API server removes the object at once, before the kubelet has torn the pod
    // down, and a "recreated" pod would race its own predecessor's teardown. A
    // StatefulSet controller deletes gracefully and waits for the object to be gone.
    let deleted_at = delete_pod_with(env, t_name, DeleteParams::default())
        .await
        .map_err(|e| Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("deleting the previous incarnation: {e}"),
        })?;
    st.disown(t_name);
    let deadline = Instant::now() + cfg.give_up;
    let uid = prev.uid.clone();
    let gone = env
        .watch
        .wait_for(t_name, deadline, cancel, |s| match s {
            None => Some(()),
            Some(s) if s.uid != uid || s.deleted.is_some() => Some(()),
            Some(_) => None,
        })
        .await;
    match gone {
        Wait::Done(()) => {}
        Wait::Cancelled => return Err(interrupted("waiting for the old target to be gone")),
        Wait::TimedOut => {
            return Err(Ending::Aborted {
                reason: Reason::ApiError,
                detail: format!(
                    "previous incarnation of {t_name} not gone (no DELETED event) after {:.0}s",
                    cfg.give_up.as_secs_f64()
                ),
            })
        }
    }
    env.watch.with_tracker(|t| t.forget(t_name));
    // Until a new incarnation replaces it: the name has been used on this node.
    *slot = Some(Incarnation {
        deleted_at: Some(deleted_at),
        ..prev.clone()
    });
    Ok((prev, deleted_at))
}

/// `recreate`'s first incarnation of the stable-name target on `plan.target_node`
/// (`reused_from`: the incarnation an earlier probe deleted, whose name and interface
/// this one reuses): created and waited for Ready, as any target.
async fn first_incarnation(
    env: &ProbeEnv,
    plan: &ProbePlan,
    t_name: &str,
    reused_from: Option<&Incarnation>,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Result<Incarnation, Ending> {
    let cfg = &env.pod_config;
    let pod = probe_pod_named(
        cfg,
        t_name,
        &plan.id,
        plan.kind.as_str(),
        PodRole::Target,
        &plan.target_node,
        target_args(),
    );
    create(env, st, &pod).await?;
    let ip = wait_target_ready(env, t_name, cancel)
        .await
        .map_err(|e| match e {
            Ending::Aborted { reason, detail } => Ending::Aborted {
                reason,
                detail: match reused_from {
                    Some(p) => format!(
                        "first incarnation of the recreate target (name and \
                         interface reused: an earlier probe deleted incarnation {}): \
                         {detail}",
                        p.uid.as_deref().unwrap_or("?")
                    ),
                    None => {
                        format!("first incarnation of the recreate target: {detail}")
                    }
                },
            },
            other => other,
        })?;
    Ok(Incarnation {
        uid: env.watch.snapshot(t_name).and_then(|s| s.uid),
        ip: Some(ip),
        node: plan.target_node.clone(),
        deleted_at: None,
    })
}

async fn lifecycle(
    env: &ProbeEnv,
    plan: &ProbePlan,
    t_name: &str,
    slot: Option<&mut Option<Incarnation>>,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Ending {
    let cfg = &env.pod_config;
    let kind = plan.kind.as_str();
    if *cancel.borrow() {
        return interrupted("starting");
    }
    let mut previous = None;
    if let Some(slot) = slot {
        match retire_previous(env, plan, t_name, slot, cancel, st).await {
            Ok(p) => previous = Some(p),
            Err(e) => return e,
        }
    }
    if plan.kind == ProbeKind::Burst {
        if let Err(e) = start_fillers(env, plan, cancel, st).await {
            return e;
        }
    }
    if plan.kind == ProbeKind::Service {
        if let Err(e) = create_service(env, plan, st).await {
            return e;
        }
    }
    if matches!(plan.kind, ProbeKind::Policy | ProbeKind::PolicyChange) {
        // The target is isolated from its first instant: its policy exists first.
        let isolate = crate::netpol::isolate_policy(cfg, &plan.id, plan.kind);
        if let Err(e) = create_policy(env, st, &isolate).await {
            return e;
        }
    }
    let mut t_pod = probe_pod_named(
        cfg,
        t_name,
        &plan.id,
        kind,
        PodRole::Target,
        &plan.target_node,
        target_args(),
    );
    if plan.kind == ProbeKind::Unprobed {
        crate::podspec::drop_readiness_probe(&mut t_pod);
    }
    let create_started = std::time::Instant::now();
    // Cancelled meanwhile (a signal, or `prober run` lost its leadership term): create
    // nothing more.
    if *cancel.borrow() {
        return interrupted("starting the target");
    }
    if let Err(e) = create(env, st, &t_pod).await {
        return e;
    }
    if let Some((prev, deleted_at)) = previous {
        st.recreate = Some(RecreateInfo {
            previous_ip: prev.ip,
            previous_uid: prev.uid,
            iface: calico_iface_name(&cfg.namespace, t_name),
            iface_reused: prev.node == plan.target_node,
            recreate_gap_seconds: Some(
                create_started
                    .saturating_duration_since(deleted_at)
                    .as_secs_f64(),
            ),
        });
    }
    if plan.kind == ProbeKind::Policy {
        return policy_lifecycle(env, plan, t_name, cancel, st).await;
    }
    let ip = match wait_target_ready(env, t_name, cancel).await {
        Ok(ip) => ip,
        Err(e) => return e,
    };
    tracing::debug!(target_ip = %ip, "target Ready");
    if plan.kind == ProbeKind::PolicyChange {
        return policy_change(env, plan, t_name, &ip, cancel, st).await;
    }

    run_source(env, plan, t_name, &ip, cancel, st).await
}

fn policies_api(env: &ProbeEnv) -> Api<NetworkPolicy> {
    Api::namespaced(env.pods.clone().into_client(), &env.pod_config.namespace)
}

/// Creates one of the probe's NetworkPolicies ([`crate::netpol`]), counted as a write
/// and kept in `st` for deletion; errors as a pod create ([`create_failed`]: an
/// admission rejection or a 401/403 is reported as an [`EngineFault`]).
async fn create_policy(
    env: &ProbeEnv,
    st: &mut ProbeState,
    policy: &NetworkPolicy,
) -> Result<(), Ending> {
    let ns = env.pod_config.namespace.as_str();
    let name = policy.metadata.name.clone().unwrap_or_default();
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    st.writes += 1;
    env.writes.fetch_add(1, Ordering::Relaxed);
    match tokio::time::timeout(API_CALL_TIMEOUT, policies_api(env).create(&pp, policy)).await {
        Ok(Ok(_)) => {
            st.policies.push(name.clone());
            st.policy
                .get_or_insert_with(Default::default)
                .policies
                .push(name);
            Ok(())
        }
        Ok(Err(e)) => Err(create_failed(env, e, format!("networkpolicy {ns}/{name}"))),
        Err(_) => Err(Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!(
                "create networkpolicy {ns}/{name} at {} timed out after {}s",
                env.url,
                API_CALL_TIMEOUT.as_secs()
            ),
        }),
    }
}

/// Deletes one of the probe's NetworkPolicies (404 is fine), counted as a write.
/// Errors as [`delete_pod`].
async fn delete_policy(env: &ProbeEnv, st: &mut ProbeState, name: &str) -> Result<(), Error> {
    st.writes += 1;
    let r = delete_counted(
        env,
        &policies_api(env),
        "networkpolicy",
        name,
        &DeleteParams::default(),
    )
    .await;
    if r.is_ok() {
        st.policies.retain(|n| n != name);
    }
    r
}

/// The InternalIP of Node `name` (one read by name, bounded), for the `policy` probe's
/// egress rule admitting the source's own node; `None` when unknown.
async fn node_internal_ip(env: &ProbeEnv, name: &str) -> Option<String> {
    let read = crate::api::read_by_name(&env.nodes, name);
    let node = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .ok()?
        .ok()??;
    node.status?
        .addresses?
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
}

/// `policy` (issue 32), after the isolate policy and T were created: once T has its IP
/// the source's egress policy and the intruder (a fresh pod that no rule admits, on
/// the source's node, dialing T for `--isolation-window` from its first instant) are
/// created; T Ready, then S as in `cross_node`; then the intruder's report is awaited
/// (bounded) and kept as the isolation check.
async fn policy_lifecycle(
    env: &ProbeEnv,
    plan: &ProbePlan,
    t_name: &str,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Ending {
    let cfg = &env.pod_config;
    let by = Instant::now() + cfg.give_up;
    let t_ip = match env
        .watch
        .wait_for(t_name, by, cancel, |s| s.and_then(|s| s.ip.clone()))
        .await
    {
        Wait::Done(ip) => Some(ip),
        Wait::Cancelled => return interrupted("waiting for the target's IP"),
        // No IP: the wait for Ready below names what went wrong.
        Wait::TimedOut => None,
    };
    let i_name = pod_name(&plan.id, PodRole::Intruder);
    if let Some(t_ip) = &t_ip {
        let node_ip = node_internal_ip(env, &plan.source_node).await;
        if node_ip.is_none() {
            tracing::warn!(node = %plan.source_node,
                "no InternalIP known for the source's node: its egress policy admits only the target");
        }
        let egress = crate::netpol::egress_policy(cfg, &plan.id, t_ip, node_ip.as_deref());
        if let Err(e) = create_policy(env, st, &egress).await {
            return e;
        }
        let mut args = source_args(cfg, t_ip, t_name);
        set_arg(&mut args, "--give-up", duration_arg(cfg.isolation_window));
        set_arg(&mut args, "--hold", "0s".into());
        let i_pod = probe_pod_named(
            cfg,
            &i_name,
            &plan.id,
            plan.kind.as_str(),
            PodRole::Intruder,
            &plan.source_node,
            args,
        );
        if *cancel.borrow() {
            return interrupted("starting the intruder");
        }
        if let Err(e) = create(env, st, &i_pod).await {
            return e;
        }
    }
    let ip = match wait_target_ready(env, t_name, cancel).await {
        Ok(ip) => ip,
        Err(e) => return e,
    };
    let ending = run_source(env, plan, t_name, &ip, cancel, st).await;
    // The intruder's verdict: it ends by itself `--isolation-window` after its start
    // (plus its wait for the kubelet's readiness answers).
    let window = cfg.isolation_window;
    let deadline = Instant::now() + window + Duration::from_secs(10) + SOURCE_FINISH_MARGIN;
    let check = if t_ip.is_none() {
        crate::netpol::isolation_check(
            &i_name,
            window,
            None,
            Some("the target never got an IP".into()),
        )
    } else {
        match env
            .watch
            .wait_for(&i_name, deadline, cancel, source_done_check)
            .await
        {
            Wait::Done(Ending::SourceTerminated) => {
                let msg = env
                    .watch
                    .snapshot(&i_name)
                    .and_then(|s| s.terminated.and_then(|t| t.message));
                match msg.as_deref().map(crate::record::parse_termination_message) {
                    Some(Ok(r)) => crate::netpol::isolation_check(&i_name, window, Some(&r), None),
                    Some(Err(e)) => crate::netpol::isolation_check(&i_name, window, None, Some(e)),
                    None => crate::netpol::isolation_check(
                        &i_name,
                        window,
                        None,
                        Some("the intruder left no termination message".into()),
                    ),
                }
            }
            Wait::Done(Ending::Aborted { detail, .. }) => {
                crate::netpol::isolation_check(&i_name, window, None, Some(detail))
            }
            Wait::Cancelled => {
                crate::netpol::isolation_check(&i_name, window, None, Some("interrupted".into()))
            }
            Wait::TimedOut => crate::netpol::isolation_check(
                &i_name,
                window,
                None,
                Some("the intruder did not finish in time".into()),
            ),
        }
    };
    st.policy.get_or_insert_with(Default::default).isolation = Some(check);
    ending
}

/// Replaces the value after `flag` in `args` (appends both when absent).
fn set_arg(args: &mut Vec<String>, flag: &str, value: String) {
    match args.iter().position(|a| a == flag) {
        Some(i) if i + 1 < args.len() => args[i + 1] = value,
        _ => {
            args.push(flag.into());
            args.push(value);
        }
    }
}

/// One request to the source pod's own HTTP port through the API server's pod proxy
/// (`/api/v1/namespaces/NS/pods/NAME:8080/proxy/PATH`; RBAC: `create pods/proxy` for
/// a POST, `get` for a GET), bounded by [`API_CALL_TIMEOUT`]. Returns the body.
async fn pod_proxy(
    env: &ProbeEnv,
    pod: &str,
    method: http::Method,
    path: &str,
) -> Result<String, String> {
    let ns = &env.pod_config.namespace;
    let uri = format!(
        "/api/v1/namespaces/{ns}/pods/{pod}:{}/proxy/{path}",
        crate::podspec::SERVER_PORT
    );
    let req = http::Request::builder()
        .method(method.clone())
        .uri(&uri)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let client = env.pods.clone().into_client();
    match tokio::time::timeout(API_CALL_TIMEOUT, client.request_text(req)).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => {
            let verb = if method == http::Method::GET {
                "get"
            } else {
                "create"
            };
            Err(Error::from_kube(e, &env.url, verb, format!("pods/proxy {ns}/{pod}")).to_string())
        }
        Err(_) => Err(format!(
            "{method} {uri} at {} timed out after {}s",
            env.url,
            API_CALL_TIMEOUT.as_secs()
        )),
    }
}

/// [`pod_proxy`] to a probe pod, given up as soon as the pod watch says the pod has
/// terminated: `None` then. (A finished pod's IP may answer nothing at all, and the call
/// would wait its whole [`API_CALL_TIMEOUT`] for it.)
async fn pod_proxy_while_running(
    env: &ProbeEnv,
    pod: &str,
    method: http::Method,
    path: &str,
) -> Option<Result<String, String>> {
    let call = pod_proxy(env, pod, method, path);
    tokio::pin!(call);
    loop {
        if env
            .watch
            .snapshot(pod)
            .is_some_and(|s| s.terminated.is_some())
        {
            return None;
        }
        tokio::select! {
            r = &mut call => return Some(r),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Posts mark `name` (`arm`, `allow`, `revoke`) to the `policy_change` source. Errors:
/// [`Ending::SourceTerminated`] when the source has ended (its report says why), an
/// `api_error` ending when the mark cannot be posted.
async fn post_mark(env: &ProbeEnv, pod: &str, name: &str) -> Result<(), Ending> {
    match pod_proxy_while_running(env, pod, http::Method::POST, &format!("mark/{name}")).await {
        None => Err(Ending::SourceTerminated),
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("cannot mark `{name}` on the source through the pod proxy: {e}"),
        }),
    }
}

/// `policy_change` (issue 32), T Ready and isolated by its deny-all policy: creates S
/// (`--policy-change`) and waits for it to be Ready ([`start_policy_change_source`]),
/// marks `arm`, creates the allow policy, marks `allow`, waits until the source's hold
/// after its first answer ended ([`wait_until_held`]), deletes the allow policy, marks
/// `revoke`, and waits for S's report.
async fn policy_change(
    env: &ProbeEnv,
    plan: &ProbePlan,
    t_name: &str,
    ip: &str,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Ending {
    let cfg = &env.pod_config;
    let s_name = match start_policy_change_source(env, plan, t_name, ip, cancel, st).await {
        Ok(name) => name,
        Err(e) => return e,
    };
    if let Err(e) = post_mark(env, &s_name, "arm").await {
        return e;
    }
    let allow = crate::netpol::allow_policy(cfg, &plan.id);
    let allow_name = allow.metadata.name.clone().unwrap_or_default();
    if let Err(e) = create_policy(env, st, &allow).await {
        return e;
    }
    st.policy
        .get_or_insert_with(Default::default)
        .allow_created_unix = Some(unix_now());
    if let Err(e) = post_mark(env, &s_name, "allow").await {
        return e;
    }
    if let Some(e) = wait_until_held(env, &s_name, cancel).await {
        return e;
    }
    if let Err(e) = delete_policy(env, st, &allow_name).await {
        return Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("cannot delete the allow policy: {e}"),
        };
    }
    st.policy
        .get_or_insert_with(Default::default)
        .allow_deleted_unix = Some(unix_now());
    if let Err(e) = post_mark(env, &s_name, "revoke").await {
        return e;
    }
    let waited = cfg.give_up + Duration::from_secs(2) + SOURCE_FINISH_MARGIN;
    wait_source_done(
        env,
        &s_name,
        waited,
        cancel,
        "the source was timing the revocation",
    )
    .await
}

/// Waits up to `waited` for the source `s_name` to end ([`source_done_check`]); on
/// time-out one last read settles it ([`settle_timeout`]); `doing` names what was
/// interrupted.
async fn wait_source_done(
    env: &ProbeEnv,
    s_name: &str,
    waited: Duration,
    cancel: &mut watch::Receiver<bool>,
    doing: &str,
) -> Ending {
    let started = std::time::Instant::now();
    match env
        .watch
        .wait_for(s_name, Instant::now() + waited, cancel, source_done_check)
        .await
    {
        Wait::Done(e) => e,
        Wait::Cancelled => interrupted(doing),
        Wait::TimedOut => {
            match settle_timeout(
                env,
                PodRole::Source,
                s_name,
                started,
                waited,
                source_done_check,
            )
            .await
            {
                Ok(e) | Err(e) => e,
            }
        }
    }
}

/// Now, Unix seconds on this machine's clock.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Creates a `policy_change` source dialing `ip` (its pod deadline covers four
/// give-ups: target-server's `policy` module) and waits until it is Ready (it then
/// serves the marks). Returns its name, or the ending.
async fn start_policy_change_source(
    env: &ProbeEnv,
    plan: &ProbePlan,
    t_name: &str,
    ip: &str,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Result<String, Ending> {
    let cfg = &env.pod_config;
    let s_name = pod_name(&plan.id, PodRole::Source);
    let mut args = source_args(cfg, ip, t_name);
    args.push("--policy-change".into());
    let mut s_pod = probe_pod_named(
        cfg,
        &s_name,
        &plan.id,
        plan.kind.as_str(),
        PodRole::Source,
        &plan.source_node,
        args,
    );
    if let Some(spec) = s_pod.spec.as_mut() {
        spec.active_deadline_seconds = Some(crate::podspec::active_deadline_seconds(
            cfg.give_up * 2,
            cfg.hold + Duration::from_secs(2),
        ));
    }
    if *cancel.borrow() {
        return Err(interrupted("starting the source"));
    }
    create(env, st, &s_pod).await?;
    let by = Instant::now() + cfg.give_up;
    let ready_or_done = |s: Option<&PodState>| {
        let s = s?;
        if s.ready.is_some() {
            return Some(None);
        }
        source_done_check(Some(s)).map(Some)
    };
    match env.watch.wait_for(&s_name, by, cancel, ready_or_done).await {
        Wait::Done(None) => Ok(s_name),
        Wait::Done(Some(e)) => Err(e),
        Wait::Cancelled => Err(interrupted("waiting for the source to be Ready")),
        Wait::TimedOut => Err(timeout_ending(
            PodRole::Source,
            env.watch.snapshot(&s_name).as_ref(),
            cfg.give_up,
        )),
    }
}

/// Reads the source's `/policy` every 200 ms until its hold after the first answer
/// ended (`held_at`), for at most give-up + hold + 5 s (then the deletion goes ahead: the
/// source reports what it met). `Some(ending)` when the source ended meanwhile (not
/// admitted) or the probe was cancelled.
async fn wait_until_held(
    env: &ProbeEnv,
    s_name: &str,
    cancel: &mut watch::Receiver<bool>,
) -> Option<Ending> {
    let cfg = &env.pod_config;
    let by = Instant::now() + cfg.give_up + cfg.hold + Duration::from_secs(5);
    while Instant::now() < by {
        if *cancel.borrow() {
            return Some(interrupted("waiting for the policy to admit the source"));
        }
        // A POST (the source answers both): `create pods/proxy` is then the only verb.
        // Bounded by `by` too: a slow answer must not hold the deletion back.
        let read = pod_proxy_while_running(env, s_name, http::Method::POST, "policy");
        match tokio::time::timeout_at(by, read).await {
            Err(_) => break,
            Ok(None) => return Some(Ending::SourceTerminated),
            Ok(Some(Ok(body))) => {
                let held = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .is_some_and(|v| v["held_at"].is_number());
                if held {
                    return None;
                }
            }
            Ok(Some(Err(e))) => tracing::debug!(error = %e, "reading the source's policy status"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = cancel.changed() => {}
        }
    }
    env.watch
        .snapshot(s_name)
        .is_some_and(|s| s.terminated.is_some())
        .then_some(Ending::SourceTerminated)
}

/// `burst`: creates the plan's fillers on the target node and waits (at most 10 s) until
/// each created one has its IP. Errors: interrupted meanwhile.
async fn start_fillers(
    env: &ProbeEnv,
    plan: &ProbePlan,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Result<(), Ending> {
    let cfg = &env.pod_config;
    let kind = plan.kind.as_str();
    let fillers: Vec<Pod> = (0..plan.burst_size)
        .map(|i| filler_pod(cfg, &plan.id, kind, &plan.target_node, i))
        .collect();
    let results = futures::future::join_all(fillers.iter().map(|p| create_counted(env, p))).await;
    let mut created = 0u32;
    for (i, r) in results.iter().enumerate() {
        st.writes += 1;
        if r.is_ok() {
            created += 1;
            st.owns(&filler_pod_name(&plan.id, i as u32));
        }
    }
    st.burst = Some(BurstInfo {
        fillers: plan.burst_size,
        fillers_created: created,
        fillers_ready_seconds: None,
        backlog_drain_seconds: None,
    });
    // T joins the node's backlog behind the fillers: wait (bounded by 10 s) until
    // every created filler has its IP, i.e. its sandbox and endpoint exist (the CNI
    // ADD ran), so what T meets does not depend on which sandbox a kubelet sets up
    // first. A filler without an IP by then (unschedulable, slow runtime) is not
    // waited for longer.
    let by = Instant::now() + Duration::from_secs(10);
    for i in 0..plan.burst_size {
        let name = filler_pod_name(&plan.id, i);
        if !st.created.contains(&name) {
            continue;
        }
        if let Wait::Cancelled = env
            .watch
            .wait_for(&name, by, cancel, |s| s.and_then(|s| s.ip.clone()))
            .await
        {
            return Err(interrupted("waiting for the burst's fillers"));
        }
    }
    Ok(())
}

/// Creates the source (dialing the target at `ip`, or the probe Service's ClusterIP) and
/// waits for its ending: its report, or the timeout's reading of its state.
async fn run_source(
    env: &ProbeEnv,
    plan: &ProbePlan,
    t_name: &str,
    ip: &str,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) -> Ending {
    let cfg = &env.pod_config;
    let kind = plan.kind.as_str();
    let s_name = pod_name(&plan.id, PodRole::Source);
    let args = match st.service.as_ref().and_then(|s| s.cluster_ip.as_deref()) {
        Some(cluster_ip) => source_args_to(cfg, &host_port(cluster_ip, SERVICE_PORT), t_name),
        None => {
            let mut args = source_args(cfg, ip, t_name);
            if plan.kind.pod_to_pod() {
                // Every path the run asks for, to the target's addresses (issue 33).
                let ips = env
                    .watch
                    .snapshot(t_name)
                    .map(|s| s.ips)
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| vec![ip.to_string()]);
                st.paths = cfg.paths.plan(&ips, crate::podspec::SERVER_PORT as u16);
                args.extend(crate::paths::source_args(&st.paths));
            }
            args
        }
    };
    let s_pod = probe_pod_named(
        cfg,
        &s_name,
        &plan.id,
        kind,
        PodRole::Source,
        &plan.source_node,
        args,
    );
    if *cancel.borrow() {
        return interrupted("starting the source");
    }
    if let Err(e) = create(env, st, &s_pod).await {
        return e;
    }
    let waited = cfg.give_up + cfg.hold + SOURCE_FINISH_MARGIN;
    wait_source_done(env, &s_name, waited, cancel, "the source was measuring").await
}

/// Drops the probe's pods from the watch's tracker (a kept `recreate` target stays).
fn forget_probe_pods(
    env: &ProbeEnv,
    plan: &ProbePlan,
    meta: &ProbeMeta,
    keep: bool,
    record: &ProbeRecord,
) {
    env.watch.with_tracker(|t| {
        if !keep {
            t.forget(&meta.target_pod);
        }
        t.forget(&meta.source_pod);
        if plan.kind == ProbeKind::Policy {
            t.forget(&pod_name(&plan.id, PodRole::Intruder));
        }
        for i in 0..plan
            .burst_size
            .min(record.burst.as_ref().map_or(0, |b| b.fillers))
        {
            t.forget(&filler_pod_name(&plan.id, i));
        }
    });
}

/// Warns when the probe wrote more than its kind's budget ([`write_budget`]); the
/// ending at debug level (the caller logs the one event per probe, `probe done`).
fn log_probe_end(plan: &ProbePlan, record: &ProbeRecord) {
    let budget = write_budget(plan.kind, plan.burst_size);
    if record.api_writes > budget {
        tracing::warn!(
            api_writes = record.api_writes,
            budget,
            "probe exceeded its API-write budget"
        );
    }
    tracing::debug!(
        result = record.result.as_str(),
        reason = record.reason.map(|r| r.as_str()),
        ttfp_seconds = record.ttfp_seconds,
        api_writes = record.api_writes,
        "probe finished"
    );
}

/// Deletes what the probe created, the source first, then the target, then the burst's
/// fillers (gracefully, and waited for: the node stays this burst's until they are
/// gone, at most 15 s) and the probe Service; stamps the pods' deletion times in
/// `states` (target, source). For `recreate`, `guard` keeps the deleted target's
/// incarnation for the next probe of the name, once its `DELETED` is seen (≤ 10 s).
async fn delete_probe_objects(
    env: &ProbeEnv,
    plan: &ProbePlan,
    meta: &ProbeMeta,
    states: &mut [Option<PodState>; 2],
    mut guard: Option<&mut Option<Incarnation>>,
    cancel: &mut watch::Receiver<bool>,
    st: &mut ProbeState,
) {
    // Source first, then the target, then fillers.
    let mut to_delete = st.created.clone();
    to_delete.sort_by_key(|n| {
        if *n == meta.source_pod {
            0
        } else if *n == meta.target_pod {
            1
        } else {
            2
        }
    });
    let is_filler = |n: &str| {
        (0..st.burst.as_ref().map_or(0, |b| b.fillers)).any(|i| filler_pod_name(&plan.id, i) == n)
    };
    let fillers_deleted: Vec<String> = to_delete.iter().filter(|n| is_filler(n)).cloned().collect();
    for name in &to_delete {
        st.writes += 1;
        // Fillers go gracefully: their `DELETED` then means the kubelet has torn their
        // sandboxes down (CNI DEL), i.e. the node's agent has dropped them from its
        // backlog — awaited below before the burst's node claim is released.
        let deleted = if fillers_deleted.contains(name) {
            delete_pod_with(env, name, DeleteParams::default()).await
        } else {
            delete_pod(env, name).await
        };
        match deleted {
            Ok(at) => {
                let i = if *name == meta.target_pod {
                    Some(0)
                } else if *name == meta.source_pod {
                    Some(1)
                } else {
                    None
                };
                if let Some(s) = i.and_then(|i| states[i].as_mut()) {
                    s.deleted.get_or_insert(at);
                }
                if *name == meta.target_pod {
                    if let (Some(g), Some(t)) = (guard.as_deref_mut(), states[0].as_ref()) {
                        // The name is now used on this node: the next probe's first
                        // incarnation reuses it.
                        *g = Some(Incarnation {
                            uid: t.uid.clone(),
                            ip: t.ip.clone(),
                            node: plan.target_node.clone(),
                            deleted_at: Some(at),
                        });
                        // Wait (bounded) for its DELETED event before the next probe
                        // may create the same name: a late event of this UID would
                        // otherwise land on the next incarnation's fresh tracker
                        // entry (which has no UID yet) and mark it deleted.
                        let uid = t.uid.clone();
                        let deadline = Instant::now() + Duration::from_secs(10);
                        let _ = env
                            .watch
                            .wait_for(&meta.target_pod, deadline, cancel, |s| match s {
                                Some(s) if s.uid == uid && s.deleted.is_none() => None,
                                _ => Some(()),
                            })
                            .await;
                    }
                }
            }
            Err(e) => tracing::warn!(pod = %name, error = %e, "delete failed"),
        }
    }
    // Burst isolation: the node stays this burst's until its fillers are gone
    // (bounded: a filler whose deletion is not seen within 15 s is left to the sweep).
    let fillers_gone_by = Instant::now() + Duration::from_secs(15);
    for name in &fillers_deleted {
        let _ = env
            .watch
            .wait_for(name, fillers_gone_by, cancel, |s| match s {
                Some(s) if s.deleted.is_none() => None,
                _ => Some(()),
            })
            .await;
    }
    if let Some(svc) = &st.service {
        st.writes += 1;
        if let Err(e) = delete_service(env, &svc.name).await {
            tracing::warn!(service = %svc.name, error = %e, "delete failed");
        }
    }
    // The policies last, newest first: the pods were isolated until they were gone.
    for name in st.policies.clone().iter().rev() {
        if let Err(e) = delete_policy(env, st, name).await {
            tracing::warn!(networkpolicy = %name, error = %e, "delete failed");
        }
    }
}

/// The probe's record: [`build_record`] of what was seen, the API writes, the
/// `recreate`/`burst`/`service` details (the burst's backlog from its fillers' states),
/// `node_not_ready` when a NotReady node explains the outcome, and the agents'
/// suspects over the probe's window.
async fn finish_record(
    env: &ProbeEnv,
    plan: &ProbePlan,
    meta: &ProbeMeta,
    states: &[Option<PodState>; 2],
    ending: &Ending,
    st: &mut ProbeState,
    agent_window: Option<crate::agents::correlate::ProbeWindow>,
) -> ProbeRecord {
    let mut record = build_record(
        meta,
        states[0].as_ref(),
        states[1].as_ref(),
        ending,
        env.slow_threshold,
        std::time::Instant::now(),
    );
    record.api_writes = st.writes;
    record.recreate = st.recreate.take();
    record.burst = st.burst.take();
    if let Some(b) = record.burst.as_mut() {
        let fillers: Vec<Option<PodState>> = env.watch.with_tracker(|t| {
            (0..plan.burst_size.min(b.fillers))
                .map(|i| t.get(&filler_pod_name(&plan.id, i)).cloned())
                .collect()
        });
        let (ready, drain) = burst_backlog(
            meta.started,
            &fillers,
            b.fillers_created,
            record.timeline.source.ready,
            record.raw_ttfp_seconds,
        );
        b.fillers_ready_seconds = ready;
        b.backlog_drain_seconds = drain;
    }
    record.service = st.service.take();
    record.policy = st.policy.take();
    crate::paths::apply(&mut record, &st.paths, env.slow_threshold);
    match plan.kind {
        ProbeKind::PolicyChange => {
            crate::netpol::apply_policy_change(&mut record, env.slow_threshold)
        }
        ProbeKind::Policy => {
            if let Some(check) = record.policy.as_ref().and_then(|p| p.isolation.clone()) {
                crate::netpol::apply_isolation(&mut record, &check);
            }
        }
        _ => {}
    }
    if could_be_node_not_ready(&record) {
        let mut nodes = vec![&plan.source_node, &plan.target_node];
        nodes.dedup();
        for node in nodes {
            if node_ready(env, node).await == Some(false) {
                record.detail = Some(format!(
                    "node {node} is NotReady (would have been {}/{}: {})",
                    record.result.as_str(),
                    record.reason.map_or("", |r| r.as_str()),
                    record.detail.as_deref().unwrap_or("")
                ));
                record.result = ProbeResult::Inconclusive;
                record.reason = Some(Reason::NodeNotReady);
                break;
            }
        }
    }
    if let (Some(a), Some(w)) = (&env.agents, agent_window) {
        let found = a.probe_finished(w, record.result).await;
        record.suspects = found.suspects;
        let mut warnings = env.agent_warnings.lock().unwrap_or_else(|p| p.into_inner());
        crate::agents::correlate::merge_warnings(&mut warnings, found.warnings);
    }
    record
}

/// Whether a NotReady node would explain `record`'s outcome, so the probe checks its
/// nodes' readiness and, when one is NotReady, ends `inconclusive`/`node_not_ready`:
/// any `failed` probe, and the `inconclusive` ones whose pods never got going on a
/// node that stopped — `unschedulable` (the node's `not-ready` taint keeps the pod
/// off it) and `container_failed` (its kubelet never started the container).
pub fn could_be_node_not_ready(record: &ProbeRecord) -> bool {
    match record.result {
        ProbeResult::Failed => true,
        ProbeResult::Inconclusive => matches!(
            record.reason,
            Some(Reason::Unschedulable) | Some(Reason::ContainerFailed)
        ),
        _ => false,
    }
}

/// Whether Node `name` is Ready now (one read by name through `list`, 10 s bound,
/// [`crate::api::read_by_name`]), for a failed probe's `node_not_ready` check; `None`
/// when unknown. A refused read is logged as a warning naming the verb, since the
/// failure then stays `failed` even on a NotReady node.
async fn node_ready(env: &ProbeEnv, name: &str) -> Option<bool> {
    let read = crate::api::read_by_name(&env.nodes, name);
    match tokio::time::timeout(Duration::from_secs(10), read).await {
        Ok(Ok(Some(n))) => Some(crate::schedule::NodeInfo::from_node(&n).ready),
        Ok(Err(e)) => {
            let e = Error::from_kube(e, &env.url, "list", format!("node {name}"));
            tracing::warn!(node = name, error = %e,
                "cannot list nodes to check a failed probe's node readiness; the probe stays failed");
            None
        }
        _ => None,
    }
}

/// Runs one probe to its record. Never fails: API trouble becomes an `api_error`
/// record. Every pod it created is deleted before returning (even when cancelled),
/// except a `recreate` target kept for a later probe (`plan.keep_target`) after a
/// complete measurement.
pub async fn run_probe(
    env: Arc<ProbeEnv>,
    plan: ProbePlan,
    mut cancel: watch::Receiver<bool>,
) -> ProbeRecord {
    let span = tracing::info_span!(
        "probe",
        probe_id = %plan.id,
        kind = plan.kind.as_str(),
        src_node = %plan.source_node,
        dst_node = %plan.target_node
    );
    async move {
        // Agent window: scraped before the target pod is created (docs/design.md §3).
        let agent_window = match &env.agents {
            Some(a) => Some(a.probe_started(&plan.source_node, &plan.target_node).await),
            None => None,
        };
        let t_name = plan.target_name(&env.pod_config.instance);
        let meta = ProbeMeta {
            id: plan.id.clone(),
            kind: plan.kind.as_str().to_string(),
            namespace: env.pod_config.namespace.clone(),
            source_node: plan.source_node.clone(),
            target_node: plan.target_node.clone(),
            source_pod: pod_name(&plan.id, PodRole::Source),
            target_pod: t_name.clone(),
            started: std::time::Instant::now(),
            started_at: Timestamp::now().to_string(),
        };
        let mut st = ProbeState::default();
        // recreate: one probe at a time per stable name (the slot lock), held to the end.
        let slot = (plan.kind == ProbeKind::Recreate).then(|| env.slot(&t_name));
        let mut guard = None;
        let mut ending = None;
        if let Some(slot) = slot {
            tokio::select! {
                g = slot.lock_owned() => guard = Some(g),
                _ = cancel.wait_for(|c| *c) => ending = Some(interrupted("waiting for the previous recreate probe on this node")),
            }
        }
        let ending = match ending {
            Some(e) => e,
            None => {
                lifecycle(
                    &env,
                    &plan,
                    &t_name,
                    guard.as_deref_mut(),
                    &mut cancel,
                    &mut st,
                )
                .await
            }
        };

        let mut states: [Option<PodState>; 2] = [
            env.watch.snapshot(&meta.target_pod),
            env.watch.snapshot(&meta.source_pod),
        ];
        // Keep a recreate target for the next probe only after a full measurement.
        let keep = plan.keep_target
            && ending == Ending::SourceTerminated
            && states[0].as_ref().is_some_and(|s| s.ready.is_some());
        if keep {
            st.disown(&t_name);
            if let (Some(g), Some(t)) = (guard.as_deref_mut(), states[0].as_ref()) {
                *g = Some(Incarnation {
                    uid: t.uid.clone(),
                    ip: t.ip.clone(),
                    node: plan.target_node.clone(),
                    deleted_at: None,
                });
            }
        }
        delete_probe_objects(
            &env,
            &plan,
            &meta,
            &mut states,
            guard.as_deref_mut(),
            &mut cancel,
            &mut st,
        )
        .await;
        let record = finish_record(&env, &plan, &meta, &states, &ending, &mut st, agent_window).await;
        forget_probe_pods(&env, &plan, &meta, keep, &record);
        // Only now may the next `recreate` probe of this name start: until the forget
        // above, its T₀ (same name) would be forgotten by this probe's cleanup.
        drop(guard);
        log_probe_end(&plan, &record);
        record
    }
    .instrument(span)
    .await
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::{Problem, Tracker};

    fn state(f: impl FnOnce(&mut PodState)) -> PodState {
        let mut tr = Tracker::new();
        tr.note_created("fp-x-t", std::time::Instant::now());
        let mut s = tr.get("fp-x-t").cloned().expect("state");
        f(&mut s);
        s
    }

    #[test]
    fn burst_backlog_runs_from_the_first_filler_create_to_the_later_of_fillers_ready_and_success() {
        let t0 = std::time::Instant::now();
        let at = |s: f64| Some(t0 + Duration::from_secs_f64(s));
        let filler = |created: f64, ready: Option<f64>| {
            Some(state(|s| {
                s.created = at(created);
                s.ready = ready.and_then(at);
            }))
        };
        let fillers = vec![filler(0.5, Some(2.0)), filler(0.6, Some(4.5))];
        // Source Ready at 6.0 s, first success 1.0 s later: drained at 7.0 s.
        let (ready, drain) = burst_backlog(t0, &fillers, 2, Some(6.0), Some(1.0));
        assert_eq!(ready, Some(4.0));
        assert!((drain.unwrap() - 6.5).abs() < 1e-9, "{drain:?}");
        // A success before the last filler was Ready (negative raw TTFP too): the
        // fillers' Ready bounds it.
        let (_, drain) = burst_backlog(t0, &fillers, 2, Some(3.0), Some(-0.5));
        assert!((drain.unwrap() - 4.0).abs() < 1e-9, "{drain:?}");
        // No success: fillers Ready only.
        assert_eq!(
            burst_backlog(t0, &fillers, 2, Some(3.0), None),
            (Some(4.0), None)
        );
        // A created filler never Ready, or never seen: nothing certain.
        let unready = vec![filler(0.5, Some(2.0)), filler(0.6, None)];
        assert_eq!(
            burst_backlog(t0, &unready, 2, Some(6.0), Some(1.0)),
            (None, None)
        );
        let unseen = vec![filler(0.5, Some(2.0)), None];
        assert_eq!(
            burst_backlog(t0, &unseen, 2, Some(6.0), Some(1.0)),
            (None, None)
        );
        assert_eq!(
            burst_backlog(t0, &[], 0, Some(6.0), Some(1.0)),
            (None, None)
        );
    }

    fn reason(e: &Ending) -> Option<Reason> {
        match e {
            Ending::Aborted { reason, .. } => Some(*reason),
            Ending::SourceTerminated => None,
        }
    }

    #[test]
    fn engine_faults_have_distinct_metric_labels_and_admission_keeps_its_text() {
        let f = EngineFault::AdmissionRejected("rejected by admission (Priority) …".into());
        assert_eq!(f.label(), "admission_rejected");
        assert_eq!(f.text("gate-x"), "rejected by admission (Priority) …");
        let err = || Error::Api {
            url: "u".into(),
            verb: "create",
            resource: "pod fp/x".into(),
            code: 403,
            reason: "Forbidden".into(),
            message: "m".into(),
            source: None,
        };
        assert_eq!(
            EngineFault::CreateForbidden(err()).label(),
            "create_forbidden"
        );
        assert_eq!(
            EngineFault::DeleteForbidden(err()).label(),
            "delete_forbidden"
        );
    }

    #[test]
    fn timeouts_map_to_the_stage_that_stalled() {
        let now = std::time::Instant::now();
        let d = Duration::from_secs(60);
        let pending = state(|s| {
            s.unschedulable = Some(Problem {
                kind: ProblemKind::Unschedulable,
                reason: "Unschedulable".into(),
                message: "0/3 nodes are available".into(),
                since: now,
            })
        });
        let e = timeout_ending(PodRole::Target, Some(&pending), d);
        assert_eq!(reason(&e), Some(Reason::Unschedulable));
        assert!(matches!(&e, Ending::Aborted { detail, .. } if detail.contains("0/3 nodes")));

        let creating = state(|s| s.scheduled = Some(now));
        assert_eq!(
            reason(&timeout_ending(PodRole::Target, Some(&creating), d)),
            Some(Reason::ContainerFailed)
        );
        let running = state(|s| {
            s.scheduled = Some(now);
            s.running = Some(now);
        });
        assert_eq!(
            reason(&timeout_ending(PodRole::Target, Some(&running), d)),
            Some(Reason::TargetNeverReady)
        );
        assert_eq!(
            reason(&timeout_ending(PodRole::Source, Some(&running), d)),
            Some(Reason::SourceNeverReady)
        );
        assert_eq!(
            reason(&timeout_ending(PodRole::Target, None, d)),
            Some(Reason::ApiError)
        );
    }

    fn unschedulable_since(since: std::time::Instant) -> PodState {
        state(|s| {
            s.unschedulable = Some(Problem {
                kind: ProblemKind::Unschedulable,
                reason: "Unschedulable".into(),
                message: "0/3 nodes are available: 3 node(s) were unschedulable".into(),
                since,
            })
        })
    }

    #[test]
    fn unschedulable_pod_is_recorded_after_the_grace_not_after_give_up() {
        let t0 = std::time::Instant::now();
        let grace = UNSCHEDULABLE_GRACE;
        for role in [PodRole::Target, PodRole::Source] {
            let s = unschedulable_since(t0);
            // Within the grace the scheduler may still place it.
            assert_eq!(unschedulable_ending(role, &s, t0 + grace / 2, grace), None);
            let e = unschedulable_ending(role, &s, t0 + grace, grace).expect("after grace");
            assert_eq!(reason(&e), Some(Reason::Unschedulable));
            assert!(
                matches!(&e, Ending::Aborted { detail, .. } if detail.contains("3 node(s) were unschedulable")),
                "{e:?}"
            );
            // The condition flipped: scheduled now.
            let mut placed = s.clone();
            placed.scheduled = Some(t0 + grace / 2);
            assert_eq!(
                unschedulable_ending(role, &placed, t0 + grace * 2, grace),
                None
            );
        }
        // The grace is what the waits use: far below the default give-up (60 s).
        assert!(UNSCHEDULABLE_GRACE <= Duration::from_secs(10));
        let old = unschedulable_since(t0);
        assert_eq!(
            pod_ending(PodRole::Source, &old, t0 + UNSCHEDULABLE_GRACE)
                .as_ref()
                .and_then(reason),
            Some(Reason::Unschedulable)
        );
        assert_eq!(
            pod_ending(PodRole::Source, &unschedulable_since(t0), t0),
            None
        );
        // An Unschedulable problem is never a container failure.
        let mut p = state(|_| {});
        p.problem = old.unschedulable.clone();
        assert_eq!(
            problem_ending(PodRole::Target, &p)
                .as_ref()
                .and_then(reason),
            Some(Reason::Unschedulable)
        );
    }

    #[test]
    fn forbidden_delete_text_names_the_403_the_instance_and_that_cleanup_cannot_work() {
        let err = Error::Api {
            url: "https://10.0.0.1:6443".into(),
            verb: "delete",
            resource: "pod firstpacket/fp-ab-0-s".into(),
            code: 403,
            reason: "Forbidden".into(),
            message: "no".into(),
            source: None,
        };
        let t = delete_forbidden_text(&err, "gate-abcdefgh");
        assert!(t.starts_with("Kubernetes API at https://10.0.0.1:6443 refused delete pod firstpacket/fp-ab-0-s: HTTP 403"), "{t}");
        assert!(t.contains("cleanup cannot work"), "{t}");
        assert!(t.contains("firstpacket.io/instance=gate-abcdefgh"), "{t}");
    }

    #[test]
    fn timeouts_while_the_api_failed_are_api_errors_not_pod_failures() {
        let now = std::time::Instant::now();
        let d = Duration::from_secs(41);
        let trouble =
            "cannot reach the Kubernetes API at https://10.0.0.1:6443/: connection refused";
        let ready = state(|s| {
            s.scheduled = Some(now);
            s.running = Some(now);
            s.ready = Some(now);
        });
        let running = state(|s| {
            s.scheduled = Some(now);
            s.running = Some(now);
        });
        let creating = state(|s| s.scheduled = Some(now));
        // Without trouble these blame the pods…
        assert_eq!(
            reason(&timeout_ending(PodRole::Source, Some(&ready), d)),
            Some(Reason::ContainerFailed)
        );
        // …with trouble every stage is an API error, keeping what was seen.
        for (role, s) in [
            (PodRole::Source, Some(&ready)),
            (PodRole::Source, Some(&creating)),
            (PodRole::Target, Some(&running)),
            (PodRole::Target, None),
        ] {
            let e = api_trouble_ending(role, s, d, trouble);
            assert_eq!(reason(&e), Some(Reason::ApiError), "{role:?} {s:?}");
            assert!(
                matches!(&e, Ending::Aborted { detail, .. } if detail.contains("connection refused") && detail.contains("last state seen")),
                "{e:?}"
            );
        }
        assert_eq!(Reason::ApiError.result(), ProbeResult::Inconclusive);
    }

    #[test]
    fn image_pull_problem_ends_the_wait_as_image_pull() {
        let s = state(|s| {
            s.problem = Some(Problem {
                kind: ProblemKind::ImagePull,
                reason: "ErrImagePull".into(),
                message: "no such image".into(),
                since: std::time::Instant::now(),
            })
        });
        let e = problem_ending(PodRole::Target, &s).expect("ending");
        assert_eq!(reason(&e), Some(Reason::ImagePull));
        assert!(problem_ending(PodRole::Target, &state(|_| {})).is_none());
    }
}
