//! How the simulated agent keeps its node's NetworkPolicy rules in step with the API
//! (docs/design.md §5 "Agents"; the semantics are [`crate::netpol`]'s):
//!
//! - **Learning**: per node, [`PolicySync::start_watches`] watches Pods, Namespaces and
//!   `networking.k8s.io/v1` NetworkPolicies (all namespaces) through the node's own
//!   API client, as Felix watches its datastore, into an [`Index`]. The agent programs
//!   no endpoint before the three initial lists are in ([`PolicySync::synced`]) and the
//!   new pod itself is known ([`PolicySync::wait_known`]), as Felix programs a workload
//!   only once it has its WorkloadEndpoint with labels. A NetworkPolicy resource the
//!   API server does not serve (404) counts as listed and empty.
//! - **Deciding** ([`Tracker`], pure): for each of the node's endpoints the agent
//!   evaluates what it needs ([`Index::evaluate`]) and compares it with what it last
//!   saw. Every difference is one **change** of one item — a direction's isolation, or
//!   one admitted peer of one direction (`(pod, peer, direction)`) — planned at the
//!   moment it is seen: due after fault `policy_delay`, or never (fault `policy_never`,
//!   new admissions only: revocations always happen). A newer change of the same item
//!   supersedes a waiting one; a change back to what is programmed cancels it. A new
//!   fault file re-plans every waiting change (delays re-sampled from when each was
//!   seen, `policy_never` drawn again), as a recovering agent catches up.
//! - **A new endpoint** ([`Tracker::endpoint_programmed`]): its isolation goes into the
//!   ruleset in the same nftables transaction as its endpoint (the allow-set entry), so
//!   a pod a policy isolates is isolated from its first instant — unless fault
//!   `isolation_lag` holds the deny back that long after the endpoint (a waiting change
//!   not subject to `policy_delay`). Its admissions already due go in with it; the
//!   others follow when due. Changes of pods whose endpoint is not programmed yet wait
//!   for it.
//! - **Applying**: the agent takes the due changes ([`Tracker::take_due`]) inside its
//!   apply loop, writes the affected pods' rules in one transaction and records them
//!   ([`Tracker::commit`]); each item that starts or stops being in the ruleset is one
//!   [`Transition`], a `policy_programmed` / `policy_revoked` truth line
//!   ([`Transition::truth_event`]).
//!
//! Truth lines (docs/design.md §6; stamped after `nft` returned):
//! - a peer admitted / no longer admitted: `node` = the enforcing node (the isolated
//!   pod's), `namespace`/`pod`/`iface` = the isolated pod, `uid` = the peer pod's uid
//!   (`""` when the peer is not a pod: an `ipBlock` that is not exactly one pod's `/32`,
//!   or every peer), `ip` = the peer pod's IP (a block's CIDR, `0.0.0.0/0` for every
//!   peer); `detail` = `{policy: "ns/name" (the first admitting policy), direction:
//!   "ingress"|"egress", peer: {kind: "pod", namespace, pod} | {kind: "ip_block", cidr,
//!   except} | {kind: "any"}, ports: ["8080/tcp"…] | ["all"], seen_t, delay_seconds,
//!   waited_seconds, apply_seconds}`;
//! - the deny itself (isolation) taking effect / lifted: the same event names with
//!   `uid`/`ip` = the isolated pod's own and `detail` = `{policy, direction, isolated:
//!   true, seen_t, delay_seconds, waited_seconds, apply_seconds}`, plus `lag_seconds`
//!   when it is a new pod's isolation (0 when it went in with the endpoint, the
//!   `isolation_lag` sample otherwise).
//!
//! A change of only the ports (or the naming policy) of a peer already admitted is
//! written to the ruleset after its delay, without a truth line. When a pod's endpoint
//! goes away its rules go with it without truth lines (`pod_deleted` says it).

use crate::dataplane::PodNet;
use crate::netpol::{
    namespace_from_value, Admission, Direction, Index, PeerKey, PeerMatch, PodInfo, PodPolicy,
    Policy,
};
use crate::truth::{TruthEvent, TruthKind};
use futures::StreamExt;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The kind of a planned change (what the plan function decides about).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A peer starts being admitted (the only kind `policy_never` applies to).
    Admit,
    /// An admitted peer's ports or naming policy change.
    Update,
    /// A peer stops being admitted.
    Revoke,
    /// A programmed pod becomes isolated.
    Isolate,
    /// A pod stops being isolated.
    Open,
}

/// One item of one pod: a direction's isolation, or one admitted peer of it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    Isolation,
    Peer(PeerKey),
}

/// What an item should be (`None`: not isolated / not admitted).
#[derive(Debug, Clone, PartialEq, Eq)]
enum ItemVal {
    /// Isolated by this policy (`namespace/name`).
    Isolated(String),
    Admitted(Admission),
}

fn get(p: &PodPolicy, d: Direction, item: &Item) -> Option<ItemVal> {
    let dir = p.dir(d);
    match item {
        Item::Isolation => dir.isolated_by.clone().map(ItemVal::Isolated),
        Item::Peer(k) => dir.admits.get(k).cloned().map(ItemVal::Admitted),
    }
}

fn set(p: &mut PodPolicy, d: Direction, item: &Item, v: Option<ItemVal>) {
    let dir = match d {
        Direction::Ingress => &mut p.ingress,
        Direction::Egress => &mut p.egress,
    };
    match (item, v) {
        (Item::Isolation, Some(ItemVal::Isolated(name))) => dir.isolated_by = Some(name),
        (Item::Isolation, _) => dir.isolated_by = None,
        (Item::Peer(k), Some(ItemVal::Admitted(a))) => {
            dir.admits.insert(k.clone(), a);
        }
        (Item::Peer(k), _) => {
            dir.admits.remove(k);
        }
    }
}

/// Whether two values need no ruleset change between them (isolation by another policy
/// is the same deny).
fn same(a: &Option<ItemVal>, b: &Option<ItemVal>) -> bool {
    match (a, b) {
        (Some(ItemVal::Isolated(_)), Some(ItemVal::Isolated(_))) => true,
        _ => a == b,
    }
}

/// A change seen and waiting for its moment.
#[derive(Debug, Clone)]
struct Pending {
    want: Option<ItemVal>,
    seen: Instant,
    seen_unix: f64,
    /// `None`: never (fault `policy_never`).
    due: Option<Instant>,
    delay: Duration,
    /// A new pod's deny held back by `isolation_lag` (not re-planned).
    lag: bool,
}

/// One endpoint of the node as the tracker follows it.
#[derive(Debug, Clone)]
struct TrackedPod {
    net: PodNet,
    /// Its endpoint is programmed (its rules may go in).
    endpoint: bool,
    /// What it needed when last evaluated.
    seen: PodPolicy,
    /// What is in the ruleset.
    programmed: PodPolicy,
    pending: BTreeMap<(Direction, Item), Pending>,
}

/// Plans a change seen at the given instant: `Some((due, delay))`, or `None` = never.
pub type Plan<'a> = &'a mut dyn FnMut(Change, Instant) -> Option<(Instant, Duration)>;

/// What an item's transition was.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// The direction's deny (isolation) by `policy`.
    Isolation { policy: String },
    /// One admitted peer.
    Peer(Admission),
}

/// An item that started (`programmed`) or stopped being in the ruleset.
#[derive(Debug, Clone)]
pub struct Transition {
    /// `policy_programmed` (true) or `policy_revoked`.
    pub programmed: bool,
    /// The isolated pod (whose node enforces).
    pub pod: PodNet,
    pub direction: Direction,
    pub subject: Subject,
    /// When the agent saw the change (Unix seconds) and the delay it planned.
    pub seen_unix: f64,
    pub seen: Instant,
    pub delay: Duration,
    /// A new pod's isolation: `Some(isolation_lag sample)` (zero when it went in with
    /// the endpoint).
    pub lag: Option<Duration>,
}

impl Transition {
    /// The truth line (module docs), `t` left for [`crate::truth::Truth::emit`];
    /// `apply_seconds` = the whole apply that wrote it.
    pub fn truth_event(&self, apply_seconds: f64) -> TruthEvent {
        let kind = if self.programmed {
            TruthKind::PolicyProgrammed
        } else {
            TruthKind::PolicyRevoked
        };
        let mut ev = TruthEvent::pod(kind, &self.pod, json!({}));
        let waited = self.seen.elapsed().as_secs_f64();
        let mut detail = match &self.subject {
            Subject::Isolation { policy } => json!({
                "policy": policy,
                "direction": self.direction.as_str(),
                "isolated": true,
            }),
            Subject::Peer(a) => {
                ev.uid = Some(a.pod.as_ref().map(|p| p.uid.clone()).unwrap_or_default());
                ev.ip = Some(a.peer_ip());
                let peer = match (&a.pod, &a.peer) {
                    (Some(p), _) => json!({"kind": "pod", "namespace": p.namespace, "pod": p.name}),
                    (None, PeerMatch::Any) => json!({"kind": "any"}),
                    (None, PeerMatch::Net { cidr, except }) => json!({
                        "kind": "ip_block",
                        "cidr": cidr.to_string(),
                        "except": except.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    }),
                };
                json!({
                    "policy": a.policy,
                    "direction": self.direction.as_str(),
                    "peer": peer,
                    "ports": a.ports.labels(),
                })
            }
        };
        if let Some(m) = detail.as_object_mut() {
            m.insert("seen_t".into(), json!(self.seen_unix));
            m.insert("delay_seconds".into(), json!(self.delay.as_secs_f64()));
            m.insert("waited_seconds".into(), json!(waited));
            m.insert("apply_seconds".into(), json!(apply_seconds));
            if let Some(l) = self.lag {
                m.insert("lag_seconds".into(), json!(l.as_secs_f64()));
            }
        }
        ev.detail = detail;
        ev
    }
}

/// Pods whose state changes in one apply, with their new rules, and the transitions.
#[derive(Debug, Default)]
pub struct Batch {
    /// Each pod's new state, and whether its rules differ from the ruleset's.
    pods: Vec<(TrackedPod, bool)>,
    /// What starts or stops being in the ruleset with this apply.
    pub transitions: Vec<Transition>,
}

impl Batch {
    /// The address and complete new rules of each pod whose rules change (what to
    /// write).
    pub fn rules(&self) -> Vec<(std::net::Ipv4Addr, &PodPolicy)> {
        self.pods
            .iter()
            .filter(|(_, changed)| *changed)
            .map(|(p, _)| (p.net.ip, &p.programmed))
            .collect()
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// How many pods' rules change (the apply's batch size).
    pub fn changes(&self) -> usize {
        self.pods.iter().filter(|(_, c)| *c).count()
    }
}

/// The node's policy state machine (module docs). Pure: callers pass the clock and
/// the plan, and do the I/O.
#[derive(Debug, Default)]
pub struct Tracker {
    pods: BTreeMap<String, TrackedPod>,
}

impl Tracker {
    /// Compares what each of the node's endpoints needs now (`pods`: its sandbox and
    /// its evaluated policy, `None` while the API has not shown the pod) with what was
    /// last seen and plans every difference with `plan` (module docs). Endpoints
    /// absent from `pods` are forgotten.
    pub fn observe(
        &mut self,
        pods: Vec<(PodNet, Option<PodPolicy>)>,
        now: Instant,
        now_unix: f64,
        plan: Plan<'_>,
    ) {
        let live: BTreeSet<&str> = pods.iter().map(|(n, _)| n.uid.as_str()).collect();
        self.pods.retain(|uid, _| live.contains(uid.as_str()));
        for (net, desired) in pods {
            let tp = self
                .pods
                .entry(net.uid.clone())
                .or_insert_with(|| TrackedPod {
                    net: net.clone(),
                    endpoint: false,
                    seen: PodPolicy::default(),
                    programmed: PodPolicy::default(),
                    pending: BTreeMap::new(),
                });
            tp.net = net;
            let Some(desired) = desired else { continue };
            for d in Direction::BOTH {
                let keys: BTreeSet<Item> = std::iter::once(Item::Isolation)
                    .chain(
                        tp.seen
                            .dir(d)
                            .admits
                            .keys()
                            .chain(desired.dir(d).admits.keys())
                            .cloned()
                            .map(Item::Peer),
                    )
                    .collect();
                for item in keys {
                    let (old, new) = (get(&tp.seen, d, &item), get(&desired, d, &item));
                    if same(&old, &new) {
                        continue;
                    }
                    let prog = get(&tp.programmed, d, &item);
                    if same(&prog, &new) {
                        tp.pending.remove(&(d, item));
                        continue;
                    }
                    let change = change_kind(&prog, &new);
                    let planned = plan(change, now);
                    tp.pending.insert(
                        (d, item),
                        Pending {
                            want: new,
                            seen: now,
                            seen_unix: now_unix,
                            due: planned.map(|p| p.0),
                            delay: planned.map_or(Duration::ZERO, |p| p.1),
                            lag: false,
                        },
                    );
                }
            }
            tp.seen = desired;
        }
    }

    /// Re-plans every waiting change but the `isolation_lag` ones (a new fault file).
    pub fn replan(&mut self, plan: Plan<'_>) {
        for tp in self.pods.values_mut() {
            for ((d, item), p) in tp.pending.iter_mut() {
                if p.lag {
                    continue;
                }
                let change = change_kind(&get(&tp.programmed, *d, item), &p.want);
                let planned = plan(change, p.seen);
                p.due = planned.map(|x| x.0);
                p.delay = planned.map_or(Duration::ZERO, |x| x.1);
            }
        }
    }

    /// The batch of endpoint `uid`'s programming at `now`: its isolation as last seen
    /// (held back `lag` when given and non-zero, as a waiting change), its admissions
    /// due by `now`. `None` for an unknown endpoint. Commit it once written.
    pub fn endpoint_programmed(
        &self,
        uid: &str,
        now: Instant,
        now_unix: f64,
        lag: Option<Duration>,
    ) -> Option<Batch> {
        let mut tp = self.pods.get(uid)?.clone();
        tp.endpoint = true;
        let mut transitions = Vec::new();
        for d in Direction::BOTH {
            let item = Item::Isolation;
            tp.pending.remove(&(d, item.clone()));
            let want = get(&tp.seen, d, &item);
            match (want, lag.filter(|l| !l.is_zero())) {
                (Some(w), Some(l)) => {
                    tp.pending.insert(
                        (d, item),
                        Pending {
                            want: Some(w),
                            seen: now,
                            seen_unix: now_unix,
                            due: Some(now + l),
                            delay: l,
                            lag: true,
                        },
                    );
                }
                (want, _) => {
                    let p = Pending {
                        want,
                        seen: now,
                        seen_unix: now_unix,
                        due: Some(now),
                        delay: Duration::ZERO,
                        lag: true,
                    };
                    apply_item(&mut tp, d, &item, &p, &mut transitions);
                }
            }
        }
        apply_due(&mut tp, now, &mut transitions);
        // Unchanged rules: the caller programs the endpoint alone; the commit still
        // records it as programmed.
        let changed = tp.programmed != self.pods[uid].programmed;
        Some(Batch {
            pods: vec![(tp, changed)],
            transitions,
        })
    }

    /// Every change due by `now` of pods whose endpoint is programmed, as one batch
    /// (empty when none). Commit it once written.
    pub fn take_due(&self, now: Instant) -> Batch {
        let mut batch = Batch::default();
        for tp in self.pods.values() {
            if !tp.endpoint || !tp.pending.values().any(|p| p.due.is_some_and(|d| d <= now)) {
                continue;
            }
            let mut new = tp.clone();
            apply_due(&mut new, now, &mut batch.transitions);
            let changed = new.programmed != tp.programmed;
            batch.pods.push((new, changed));
        }
        batch
    }

    /// Records a batch as written.
    pub fn commit(&mut self, batch: Batch) {
        for (tp, _) in batch.pods {
            if let Some(slot) = self.pods.get_mut(&tp.net.uid) {
                *slot = tp;
            }
        }
    }

    /// When the next waiting change of a programmed endpoint is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.pods
            .values()
            .filter(|tp| tp.endpoint)
            .flat_map(|tp| tp.pending.values().filter_map(|p| p.due))
            .min()
    }

    /// Whether endpoint `uid` has rules in the ruleset.
    pub fn has_rules(&self, uid: &str) -> bool {
        self.pods
            .get(uid)
            .is_some_and(|tp| tp.programmed != PodPolicy::default())
    }

    /// Forgets endpoint `uid` (its sandbox is gone; the caller removes its rules).
    pub fn forget(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// How many changes wait (never-planned ones included).
    pub fn pending(&self) -> usize {
        self.pods.values().map(|tp| tp.pending.len()).sum()
    }
}

fn change_kind(prog: &Option<ItemVal>, want: &Option<ItemVal>) -> Change {
    match (prog, want) {
        (_, Some(ItemVal::Isolated(_))) => Change::Isolate,
        (Some(ItemVal::Isolated(_)), None) => Change::Open,
        (None, Some(ItemVal::Admitted(_))) => Change::Admit,
        (Some(_), Some(_)) => Change::Update,
        (_, None) => Change::Revoke,
    }
}

/// Applies every change of `tp` due by `now` to its programmed rules.
fn apply_due(tp: &mut TrackedPod, now: Instant, out: &mut Vec<Transition>) {
    let due: Vec<(Direction, Item)> = tp
        .pending
        .iter()
        .filter(|(_, p)| p.due.is_some_and(|d| d <= now))
        .map(|(k, _)| k.clone())
        .collect();
    for (d, item) in due {
        if let Some(p) = tp.pending.remove(&(d, item.clone())) {
            apply_item(tp, d, &item, &p, out);
        }
    }
}

fn apply_item(
    tp: &mut TrackedPod,
    d: Direction,
    item: &Item,
    p: &Pending,
    out: &mut Vec<Transition>,
) {
    let old = get(&tp.programmed, d, item);
    set(&mut tp.programmed, d, item, p.want.clone());
    let lag = (p.lag && matches!(item, Item::Isolation)).then_some(p.delay);
    let (programmed, subject) = match (&old, &p.want) {
        (None, Some(v)) => (true, v),
        (Some(v), None) => (false, v),
        _ => return, // an update: rules rewritten, no transition
    };
    let subject = match subject {
        ItemVal::Isolated(policy) => Subject::Isolation {
            policy: policy.clone(),
        },
        ItemVal::Admitted(a) => Subject::Peer(a.clone()),
    };
    out.push(Transition {
        programmed,
        pod: tp.net.clone(),
        direction: d,
        subject,
        seen_unix: p.seen_unix,
        seen: p.seen,
        delay: p.delay,
        lag: if programmed { lag } else { None },
    });
}

/// Which of the three initial lists are in.
#[derive(Debug, Default)]
struct Synced {
    pods: AtomicBool,
    namespaces: AtomicBool,
    policies: AtomicBool,
}

/// One node's policy knowledge and state (module docs). Share it as `Arc`.
#[derive(Debug)]
pub struct PolicySync {
    node: String,
    index: Mutex<Index>,
    tracker: Mutex<Tracker>,
    synced: Synced,
    /// Bumped on every index change and every endpoint added or removed.
    changes: tokio::sync::watch::Sender<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The kinds the agent watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watched {
    Pods,
    Namespaces,
    Policies,
}

impl PolicySync {
    /// Empty, nothing synced, for node `node`.
    pub fn new(node: &str) -> Arc<PolicySync> {
        Arc::new(PolicySync {
            node: node.to_owned(),
            index: Mutex::new(Index::default()),
            tracker: Mutex::new(Tracker::default()),
            synced: Synced::default(),
            changes: tokio::sync::watch::channel(0).0,
        })
    }

    /// Starts the three watches on the current tokio runtime (build `client` there).
    /// Returns their tasks (abort to stop).
    pub fn start_watches(self: &Arc<Self>, client: kube::Client) -> Vec<tokio::task::AbortHandle> {
        [Watched::Pods, Watched::Namespaces, Watched::Policies]
            .into_iter()
            .map(|w| tokio::spawn(watch(client.clone(), w, Arc::downgrade(self))).abort_handle())
            .collect()
    }

    /// Whether the initial Pod, Namespace and NetworkPolicy lists are in.
    pub fn synced(&self) -> bool {
        let s = &self.synced;
        s.pods.load(Ordering::Relaxed)
            && s.namespaces.load(Ordering::Relaxed)
            && s.policies.load(Ordering::Relaxed)
    }

    /// A receiver that changes on every index change and endpoint change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Signals a change (an endpoint added or removed).
    pub fn bump(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Waits (at most `limit`) until the lists are in and pod `uid` is known; returns
    /// whether it is.
    pub async fn wait_known(&self, uid: &str, limit: Duration) -> bool {
        let mut rx = self.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            rx.borrow_and_update();
            if self.synced() && lock(&self.index).pod(uid).is_some() {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return false,
            }
        }
    }

    /// The tracker (lock order: the agent's endpoints, then the index, then this).
    pub fn tracker(&self) -> MutexGuard<'_, Tracker> {
        lock(&self.tracker)
    }

    /// What each of `locals` (the node's endpoints) needs now, `None` for pods the API
    /// has not shown yet.
    pub fn desired(&self, locals: &[PodNet]) -> Vec<(PodNet, Option<PodPolicy>)> {
        let index = lock(&self.index);
        let local_ips: HashMap<String, std::net::Ipv4Addr> =
            locals.iter().map(|n| (n.uid.clone(), n.ip)).collect();
        locals
            .iter()
            .map(|net| {
                let policy = index.pod(&net.uid).map(|p| {
                    let mut p: PodInfo = p.clone();
                    p.ip = Some(net.ip);
                    index.evaluate(&p, &local_ips)
                });
                (net.clone(), policy)
            })
            .collect()
    }

    fn update(&self, f: impl FnOnce(&mut Index)) {
        f(&mut lock(&self.index));
        self.bump();
    }

    fn set_synced(&self, w: Watched) {
        let flag = match w {
            Watched::Pods => &self.synced.pods,
            Watched::Namespaces => &self.synced.namespaces,
            Watched::Policies => &self.synced.policies,
        };
        if !flag.swap(true, Ordering::Relaxed) {
            tracing::debug!(node = %self.node, watched = ?w, "policy sync: initial list in");
            self.bump();
        }
    }

    /// One object seen (added or modified).
    fn apply(&self, w: Watched, v: &serde_json::Value) {
        match w {
            Watched::Pods => {
                if let Some(p) = PodInfo::from_value(v) {
                    self.update(|ix| ix.put_pod(p));
                }
            }
            Watched::Namespaces => {
                if let Some((name, labels)) = namespace_from_value(v) {
                    self.update(|ix| ix.put_namespace(name, labels));
                }
            }
            Watched::Policies => match self.policy(v) {
                Some(p) => self.update(|ix| ix.put_policy(p)),
                None => {
                    let m = &v["metadata"];
                    let (ns, name) = (
                        m["namespace"].as_str().unwrap_or(""),
                        m["name"].as_str().unwrap_or(""),
                    );
                    self.update(|ix| ix.remove_policy(ns, name));
                }
            },
        }
    }

    /// A policy parsed, its warnings and errors logged.
    fn policy(&self, v: &serde_json::Value) -> Option<Policy> {
        let name = format!(
            "{}/{}",
            v["metadata"]["namespace"].as_str().unwrap_or(""),
            v["metadata"]["name"].as_str().unwrap_or("")
        );
        match Policy::from_value(v) {
            Ok(p) => {
                for w in &p.warnings {
                    tracing::warn!(node = %self.node, policy = %name, "NetworkPolicy not fully enforced: {w}");
                }
                Some(p)
            }
            Err(e) => {
                tracing::warn!(node = %self.node, policy = %name, error = %e, "NetworkPolicy ignored");
                None
            }
        }
    }

    /// One object deleted.
    fn delete(&self, w: Watched, v: &serde_json::Value) {
        let m = &v["metadata"];
        let name = m["name"].as_str().unwrap_or("").to_owned();
        match w {
            Watched::Pods => {
                let uid = m["uid"].as_str().unwrap_or("").to_owned();
                self.update(|ix| ix.remove_pod(&uid));
            }
            Watched::Namespaces => self.update(|ix| ix.remove_namespace(&name)),
            Watched::Policies => {
                let ns = m["namespace"].as_str().unwrap_or("").to_owned();
                self.update(|ix| ix.remove_policy(&ns, &name));
            }
        }
    }

    /// A (re-)list: every object of the kind.
    fn replace(&self, w: Watched, all: Vec<serde_json::Value>) {
        match w {
            Watched::Pods => {
                let pods = all.iter().filter_map(PodInfo::from_value).collect();
                self.update(|ix| ix.replace_pods(pods));
            }
            Watched::Namespaces => {
                let ns = all.iter().filter_map(namespace_from_value).collect();
                self.update(|ix| ix.replace_namespaces(ns));
            }
            Watched::Policies => {
                let ps = all.iter().filter_map(|v| self.policy(v)).collect();
                self.update(|ix| ix.replace_policies(ps));
            }
        }
        self.set_synced(w);
    }
}

/// Watches every object of one kind (all namespaces) into the index; re-lists after a
/// watch loss like any informer. Ends when the sync is dropped.
async fn watch(client: kube::Client, w: Watched, sync: std::sync::Weak<PolicySync>) {
    use kube::runtime::watcher::{watcher, Config, Error, Event};
    use kube::runtime::WatchStreamExt;
    let ar = match w {
        Watched::Pods => kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
        Watched::Namespaces => {
            kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&())
        }
        Watched::Policies => {
            kube::api::ApiResource::erase::<k8s_openapi::api::networking::v1::NetworkPolicy>(&())
        }
    };
    let api = kube::Api::<kube::api::DynamicObject>::all_with(client, &ar);
    let mut stream = watcher(api, Config::default())
        .backoff(crate::client::QuickBackoff::default())
        .boxed();
    let mut init = Vec::new();
    let to_value = |o: kube::api::DynamicObject| serde_json::to_value(o).unwrap_or_default();
    while let Some(ev) = stream.next().await {
        let Some(sync) = sync.upgrade() else { return };
        match ev {
            Ok(Event::Apply(o)) => sync.apply(w, &to_value(o)),
            Ok(Event::Delete(o)) => sync.delete(w, &to_value(o)),
            Ok(Event::Init) => init.clear(),
            Ok(Event::InitApply(o)) => init.push(to_value(o)),
            Ok(Event::InitDone) => sync.replace(w, std::mem::take(&mut init)),
            Err(Error::InitialListFailed(kube::Error::Api(s)))
                if s.code == 404 && w == Watched::Policies =>
            {
                // The API server does not serve NetworkPolicies: there are none.
                if !sync.synced.policies.load(Ordering::Relaxed) {
                    tracing::warn!(node = %sync.node, "the API server serves no networking.k8s.io/v1 NetworkPolicies; enforcing none");
                }
                sync.set_synced(w);
            }
            Err(e) => {
                tracing::debug!(node = %sync.node, watched = ?w, error = %e, "policy sync watch")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netpol::{Cidr, DirPolicy, PeerPod, Ports};

    fn net(uid: &str, ip: &str) -> PodNet {
        PodNet {
            node: "node-2".into(),
            namespace: "ns".into(),
            pod: uid.trim_start_matches("uid-").into(),
            uid: uid.into(),
            ip: ip.parse().unwrap(),
            ip6: None,
            iface: "cali0123456789a".into(),
            netns: "x-p1".into(),
        }
    }

    fn admission(peer_uid: &str, ip: &str) -> (PeerKey, Admission) {
        let ip: std::net::Ipv4Addr = ip.parse().unwrap();
        (
            PeerKey::Pod(peer_uid.into()),
            Admission {
                policy: "ns/allow".into(),
                peer: PeerMatch::Net {
                    cidr: Cidr::host(ip),
                    except: vec![],
                },
                pod: Some(PeerPod {
                    namespace: "ns".into(),
                    name: peer_uid.trim_start_matches("uid-").into(),
                    uid: peer_uid.into(),
                    ip,
                }),
                ports: Ports::All,
            },
        )
    }

    /// Ingress isolated by `ns/deny`, admitting `peers`.
    fn isolated(peers: &[(&str, &str)]) -> PodPolicy {
        PodPolicy {
            ingress: DirPolicy {
                isolated_by: Some("ns/deny".into()),
                admits: peers.iter().map(|(u, ip)| admission(u, ip)).collect(),
            },
            egress: DirPolicy::default(),
        }
    }

    /// A plan: fixed `delay`, `never` for new admissions.
    fn plan(
        delay: Duration,
        never: bool,
    ) -> impl FnMut(Change, Instant) -> Option<(Instant, Duration)> {
        move |c, seen| (!(never && c == Change::Admit)).then_some((seen + delay, delay))
    }

    fn kinds(b: &Batch) -> Vec<(bool, String)> {
        b.transitions
            .iter()
            .map(|t| {
                let what = match &t.subject {
                    Subject::Isolation { .. } => "isolation".to_owned(),
                    Subject::Peer(a) => a.pod.as_ref().unwrap().uid.clone(),
                };
                (t.programmed, what)
            })
            .collect()
    }

    #[test]
    fn a_new_pods_isolation_goes_in_with_its_endpoint_and_admissions_after_their_delay() {
        let t0 = Instant::now();
        let d = Duration::from_secs(2);
        let mut tr = Tracker::default();
        let target = net("uid-t", "10.0.2.2");
        tr.observe(
            vec![(target.clone(), Some(isolated(&[("uid-s", "10.0.1.2")])))],
            t0,
            0.0,
            &mut plan(d, false),
        );
        assert!(
            tr.take_due(t0 + d).is_empty(),
            "nothing before the endpoint"
        );
        assert_eq!(tr.next_due(), None);
        let t1 = t0 + Duration::from_millis(300);
        let b = tr.endpoint_programmed("uid-t", t1, 0.3, None).unwrap();
        assert_eq!(kinds(&b), [(true, "isolation".to_owned())]);
        assert_eq!(b.transitions[0].lag, Some(Duration::ZERO));
        let rules = b.rules();
        assert!(rules[0].1.ingress.isolated_by.is_some() && rules[0].1.ingress.admits.is_empty());
        tr.commit(b);
        assert_eq!(
            tr.next_due(),
            Some(t0 + d),
            "the admission counts from when it was seen"
        );
        assert!(tr.take_due(t0 + d - Duration::from_millis(1)).is_empty());
        let b = tr.take_due(t0 + d);
        assert_eq!(kinds(&b), [(true, "uid-s".to_owned())]);
        tr.commit(b);
        assert_eq!(tr.next_due(), None);
        // Revoked after its own delay, seen later.
        let t2 = t0 + Duration::from_secs(5);
        tr.observe(
            vec![(target, Some(isolated(&[])))],
            t2,
            5.0,
            &mut plan(d, false),
        );
        assert!(tr.take_due(t2 + d / 2).is_empty());
        let b = tr.take_due(t2 + d);
        assert_eq!(kinds(&b), [(false, "uid-s".to_owned())]);
        let ev = b.transitions[0].truth_event(0.01);
        assert_eq!(ev.event, TruthKind::PolicyRevoked);
        assert_eq!(ev.uid.as_deref(), Some("uid-s"));
        assert_eq!(ev.ip.as_deref(), Some("10.0.1.2"));
        assert_eq!(ev.pod.as_deref(), Some("t"));
        assert_eq!(ev.detail["direction"], "ingress");
        assert_eq!(
            ev.detail["peer"],
            json!({"kind": "pod", "namespace": "ns", "pod": "s"})
        );
        assert_eq!(ev.detail["delay_seconds"], 2.0);
    }

    #[test]
    fn admissions_due_by_the_endpoint_go_in_with_it() {
        let t0 = Instant::now();
        let mut tr = Tracker::default();
        tr.observe(
            vec![(
                net("uid-t", "10.0.2.2"),
                Some(isolated(&[("uid-s", "10.0.1.2")])),
            )],
            t0,
            0.0,
            &mut plan(Duration::ZERO, false),
        );
        let b = tr
            .endpoint_programmed("uid-t", t0 + Duration::from_millis(5), 0.0, None)
            .unwrap();
        assert_eq!(
            kinds(&b),
            [(true, "isolation".to_owned()), (true, "uid-s".to_owned())]
        );
    }

    #[test]
    fn isolation_lag_holds_the_deny_back_and_is_not_replanned() {
        let t0 = Instant::now();
        let lag = Duration::from_secs(3);
        let mut tr = Tracker::default();
        tr.observe(
            vec![(net("uid-t", "10.0.2.2"), Some(isolated(&[])))],
            t0,
            0.0,
            &mut plan(Duration::ZERO, false),
        );
        let b = tr.endpoint_programmed("uid-t", t0, 0.0, Some(lag)).unwrap();
        assert!(b.transitions.is_empty(), "no deny yet");
        assert!(b.rules().is_empty(), "nothing to write with the endpoint");
        tr.commit(b);
        tr.replan(&mut plan(Duration::from_secs(60), true));
        assert_eq!(tr.next_due(), Some(t0 + lag));
        let b = tr.take_due(t0 + lag);
        assert_eq!(kinds(&b), [(true, "isolation".to_owned())]);
        let ev = b.transitions[0].truth_event(0.0);
        assert_eq!(ev.event, TruthKind::PolicyProgrammed);
        assert_eq!(ev.detail["isolated"], true);
        assert_eq!(ev.detail["lag_seconds"], 3.0);
        assert_eq!(ev.uid.as_deref(), Some("uid-t"), "the pod itself");
    }

    #[test]
    fn policy_never_skips_new_admissions_but_not_revocations_and_a_replan_redraws() {
        let t0 = Instant::now();
        let mut tr = Tracker::default();
        let t = net("uid-t", "10.0.2.2");
        tr.observe(
            vec![(t.clone(), Some(isolated(&[])))],
            t0,
            0.0,
            &mut plan(Duration::ZERO, true),
        );
        tr.commit(tr.endpoint_programmed("uid-t", t0, 0.0, None).unwrap());
        let t1 = t0 + Duration::from_secs(1);
        tr.observe(
            vec![(t.clone(), Some(isolated(&[("uid-s", "10.0.1.2")])))],
            t1,
            1.0,
            &mut plan(Duration::ZERO, true),
        );
        assert!(
            tr.take_due(t1 + Duration::from_secs(100)).is_empty(),
            "never"
        );
        assert_eq!((tr.next_due(), tr.pending()), (None, 1));
        // The fault lifted: due from when it was seen.
        tr.replan(&mut plan(Duration::from_millis(500), false));
        assert_eq!(tr.next_due(), Some(t1 + Duration::from_millis(500)));
        let b = tr.take_due(t1 + Duration::from_secs(1));
        assert_eq!(kinds(&b), [(true, "uid-s".to_owned())]);
        tr.commit(b);
        // Never applies to admissions only: the revocation still happens.
        let t2 = t0 + Duration::from_secs(3);
        tr.observe(
            vec![(t, Some(isolated(&[])))],
            t2,
            3.0,
            &mut plan(Duration::ZERO, true),
        );
        assert_eq!(kinds(&tr.take_due(t2)), [(false, "uid-s".to_owned())]);
    }

    #[test]
    fn a_change_back_before_it_was_due_cancels_it_and_a_newer_one_supersedes() {
        let t0 = Instant::now();
        let d = Duration::from_secs(1);
        let mut tr = Tracker::default();
        let t = net("uid-t", "10.0.2.2");
        tr.observe(
            vec![(t.clone(), Some(isolated(&[])))],
            t0,
            0.0,
            &mut plan(d, false),
        );
        tr.commit(tr.endpoint_programmed("uid-t", t0, 0.0, None).unwrap());
        let admit = isolated(&[("uid-s", "10.0.1.2")]);
        let t1 = t0 + Duration::from_millis(100);
        tr.observe(
            vec![(t.clone(), Some(admit.clone()))],
            t1,
            0.1,
            &mut plan(d, false),
        );
        tr.observe(
            vec![(t.clone(), Some(isolated(&[])))],
            t1,
            0.1,
            &mut plan(d, false),
        );
        assert_eq!(tr.pending(), 0, "admitted then revoked before due: nothing");
        tr.observe(
            vec![(t.clone(), Some(admit.clone()))],
            t1,
            0.1,
            &mut plan(d, false),
        );
        let t2 = t0 + Duration::from_millis(600);
        let mut wider = admit;
        for a in wider.ingress.admits.values_mut() {
            a.ports = Ports::Only(
                [crate::netpol::PortRange {
                    protocol: crate::netpol::Protocol::Tcp,
                    ports: Some((80, 80)),
                }]
                .into(),
            );
        }
        tr.observe(vec![(t.clone(), Some(wider))], t2, 0.6, &mut plan(d, false));
        assert_eq!(
            tr.next_due(),
            Some(t2 + d),
            "superseded: due from the newer change"
        );
        // Pods gone from the node are forgotten.
        tr.observe(vec![], t2, 0.6, &mut plan(d, false));
        assert_eq!((tr.pending(), tr.has_rules("uid-t")), (0, false));
    }

    #[test]
    fn an_ip_block_peer_that_is_not_a_pod_has_an_empty_uid_and_its_cidr() {
        let t = Transition {
            programmed: true,
            pod: net("uid-t", "10.0.2.2"),
            direction: Direction::Egress,
            subject: Subject::Peer(Admission {
                policy: "ns/egress".into(),
                peer: PeerMatch::Net {
                    cidr: Cidr::parse("10.9.0.0/16").unwrap().unwrap(),
                    except: vec![Cidr::parse("10.9.1.0/24").unwrap().unwrap()],
                },
                pod: None,
                ports: Ports::All,
            }),
            seen_unix: 1.5,
            seen: Instant::now(),
            delay: Duration::ZERO,
            lag: None,
        };
        let ev = t.truth_event(0.002);
        assert_eq!(ev.uid.as_deref(), Some(""));
        assert_eq!(ev.ip.as_deref(), Some("10.9.0.0/16"));
        assert_eq!(
            ev.detail["peer"],
            json!({"kind": "ip_block", "cidr": "10.9.0.0/16", "except": ["10.9.1.0/24"]})
        );
        assert_eq!(ev.detail["ports"], json!(["all"]));
        assert_eq!(ev.detail["seen_t"], 1.5);
        assert!(ev.detail.get("lag_seconds").is_none());
    }
}
