//! The simulated CNI agent, one per node (the testbed's Felix): it decides **when** a new
//! endpoint is programmed, i.e. when its IP enters the node's nftables allow set so
//! forwarded traffic to/from the pod flows (DESIGN §5 "Programmed").
//!
//! Life of an endpoint:
//! 1. the kubelet calls [`Agent::endpoint_added`] right after
//!    [`Dataplane::add_pod`](crate::dataplane::Dataplane::add_pod) (the node-side /32
//!    route is already in): truth `endpoint_added`;
//! 2. the agent resolves the node's faults for that moment ([`FaultFile::for_node`]),
//!    draws `never_program` and samples `program_delay`, waits until `endpoint_added +
//!    delay`, then until the next open `resync_loop` window if one is set;
//! 3. it calls [`Dataplane::allow`] and, once that returned, emits
//!    `endpoint_programmed` (detail: `delay_seconds` sampled, `apply_seconds` the nft
//!    call, `waited_seconds` since endpoint_added).
//!
//! A new fault file ([`Faults::set`]) re-plans every pending endpoint under the new file
//! (delay re-sampled, still counted from `endpoint_added`), so clearing a
//! `never_program` fault lets stuck endpoints through, like a recovering agent.
//! Programming is serialised per node (one apply loop, as in Felix).
//!
//! [`FaultFile::for_node`]: crate::fault::FaultFile::for_node

use crate::dataplane::{Dataplane, PodNet};
use crate::fault::{FaultFile, Faults};
use crate::plan::NodePlan;
use crate::truth::{Truth, TruthEvent, TruthKind};
use serde::Serialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

/// Counters of what the agent really did, for the Felix-compatible `/metrics`
/// (DESIGN §5 "Agents"). Snapshot from [`Agent::stats`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentStats {
    /// Endpoints whose IP is in the allow set now (`felix_active_local_endpoints`).
    pub active_local_endpoints: u64,
    /// Endpoints added but not yet programmed.
    pub pending_endpoints: u64,
    /// Dataplane applies done (each one allow/disallow batch of size 1;
    /// `felix_int_dataplane_apply_time_seconds_count`).
    pub applies_total: u64,
    /// Sum of apply durations, seconds (`…_apply_time_seconds_sum`).
    pub apply_seconds_sum: f64,
    /// Applies that failed (`felix_int_dataplane_failures`).
    pub apply_failures_total: u64,
    /// Endpoints programmed since start.
    pub programmed_total: u64,
}

struct Endpoint {
    token: u64,
    programmed: bool,
    abort: Option<AbortHandle>,
    net: PodNet,
}

#[derive(Default)]
struct Counters {
    applies: AtomicU64,
    apply_nanos: AtomicU64,
    failures: AtomicU64,
    programmed: AtomicU64,
}

struct Inner {
    node: NodePlan,
    labels: BTreeMap<String, String>,
    dataplane: Arc<Dataplane>,
    truth: Truth,
    faults: Faults,
    runtime: Option<Handle>,
    /// By pod uid. Also the per-node "apply loop" lock: allow/disallow happen under it.
    endpoints: Mutex<HashMap<String, Endpoint>>,
    next_token: AtomicU64,
    counters: Counters,
}

/// One node's simulated CNI agent. Share it as `Arc<Agent>`.
pub struct Agent {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.inner.node.name)
            .finish()
    }
}

impl Agent {
    /// An agent for `node` (with Kubernetes node `labels`, used by `{labels: …}` fault
    /// selectors) programming `dataplane`, writing `truth`, obeying the shared `faults`.
    /// If called inside a tokio runtime, that runtime is the fallback for endpoint tasks
    /// when [`Agent::endpoint_added`] is called outside one.
    pub fn new(
        node: NodePlan,
        labels: BTreeMap<String, String>,
        dataplane: Arc<Dataplane>,
        truth: Truth,
        faults: Faults,
    ) -> Agent {
        Agent {
            inner: Arc::new(Inner {
                node,
                labels,
                dataplane,
                truth,
                faults,
                runtime: Handle::try_current().ok(),
                endpoints: Mutex::new(HashMap::new()),
                next_token: AtomicU64::new(1),
                counters: Counters::default(),
            }),
        }
    }

    /// The node this agent serves.
    pub fn node(&self) -> &NodePlan {
        &self.inner.node
    }

    /// A new endpoint (call right after `Dataplane::add_pod`): emits `endpoint_added`
    /// now and schedules its programming on the current tokio runtime (or the one
    /// [`Agent::new`] ran in). Calling it again for the same uid replaces the earlier
    /// schedule. Never blocks.
    pub fn endpoint_added(&self, pod: &PodNet) {
        let added_at = Instant::now();
        self.inner
            .truth
            .emit(TruthEvent::pod(TruthKind::EndpointAdded, pod, json!({})));
        let token = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        let Some(rt) = Handle::try_current()
            .ok()
            .or_else(|| self.inner.runtime.clone())
        else {
            tracing::error!(pod = %pod.pod, "agent: no tokio runtime; endpoint will not be programmed");
            return;
        };
        let mut eps = self.inner.lock();
        if let Some(old) = eps.remove(&pod.uid) {
            if let Some(a) = old.abort {
                a.abort();
            }
        }
        let task = rt.spawn(program(self.inner.clone(), pod.clone(), token, added_at));
        eps.insert(
            pod.uid.clone(),
            Endpoint {
                token,
                programmed: false,
                abort: Some(task.abort_handle()),
                net: pod.clone(),
            },
        );
    }

    /// The endpoint is going away: cancels pending programming and, if it was
    /// programmed, removes its IP from the allow set (blocks for that one `nft` call;
    /// waits for an apply in progress). Unknown endpoints are ignored.
    pub fn endpoint_removed(&self, pod: &PodNet) {
        let mut eps = self.inner.lock();
        let Some(ep) = eps.remove(&pod.uid) else {
            return;
        };
        if let Some(a) = ep.abort {
            a.abort();
        }
        if ep.programmed {
            let started = Instant::now();
            let r = self
                .inner
                .dataplane
                .disallow(&self.inner.node.name, ep.net.ip);
            self.inner.count_apply(started.elapsed(), r.is_ok());
            if let Err(e) = r {
                tracing::warn!(pod = %pod.pod, error = %e, "agent: disallow failed");
            }
        }
    }

    /// Replaces the cluster's fault file (shared by every agent holding the same
    /// [`Faults`]), emits `fault_changed` and re-plans every pending endpoint.
    pub fn set_faults(&self, file: FaultFile) {
        self.inner.faults.set_and_record(file, &self.inner.truth);
    }

    /// What the agent did so far.
    pub fn stats(&self) -> AgentStats {
        let eps = self.inner.lock();
        let active = eps.values().filter(|e| e.programmed).count() as u64;
        let c = &self.inner.counters;
        AgentStats {
            active_local_endpoints: active,
            pending_endpoints: eps.len() as u64 - active,
            applies_total: c.applies.load(Ordering::Relaxed),
            apply_seconds_sum: c.apply_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            apply_failures_total: c.failures.load(Ordering::Relaxed),
            programmed_total: c.programmed.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Endpoint>> {
        self.endpoints.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count_apply(&self, took: Duration, ok: bool) {
        let c = &self.counters;
        c.applies.fetch_add(1, Ordering::Relaxed);
        c.apply_nanos
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        if !ok {
            c.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Waits until the endpoint is due under the faults in force (re-planning on every
/// fault change), then programs it.
async fn program(inner: Arc<Inner>, net: PodNet, token: u64, added_at: Instant) {
    let mut rx = inner.faults.subscribe();
    let delay = loop {
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
            _ = tokio::time::sleep_until(at.into()) => break delay,
            r = rx.changed() => if r.is_err() { return },
        }
    };
    let inner2 = inner.clone();
    let net2 = net.clone();
    let res =
        tokio::task::spawn_blocking(move || apply(&inner2, &net2, token, delay, added_at)).await;
    if let Err(e) = res {
        if !e.is_cancelled() {
            tracing::error!(pod = %net.pod, error = %e, "agent: programming task failed");
        }
    }
}

/// The apply step, under the endpoints lock: allow, mark, record truth.
fn apply(inner: &Inner, net: &PodNet, token: u64, delay: Duration, added_at: Instant) {
    let mut eps = inner.lock();
    match eps.get(&net.uid) {
        Some(ep) if ep.token == token && !ep.programmed => {}
        _ => return, // removed or replaced meanwhile
    }
    let started = Instant::now();
    let r = inner.dataplane.allow(&inner.node.name, net.ip);
    let apply_time = started.elapsed();
    inner.count_apply(apply_time, r.is_ok());
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
                }),
            ));
        }
        Err(e) => {
            // Felix would retry on its next apply; one retry loop here is enough to stay
            // faithful without hiding a broken dataplane: log and leave it pending.
            tracing::error!(pod = %net.pod, error = %e, "agent: allow failed; endpoint stays unprogrammed");
        }
    }
}
