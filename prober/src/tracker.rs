//! Pure pod-state machine fed by watch events (docs/design.md §2 step 3).
//!
//! For each probe pod (by name) it keeps the prober-clock [`Instant`] at which each
//! milestone was **first observed**: created, scheduled (`PodScheduled=True` or
//! `spec.nodeName` set), IP assigned (`status.podIP`), container running, Ready (the
//! `Ready` condition `True` — not the phase: a Running pod need not be Ready, Kubernetes
//! docs "Pod Lifecycle"), terminated (container state
//! `terminated`, with exit code and message) and deleted. It also classifies trouble:
//! kubelet waiting reasons for image pulls (`ErrImagePull`, `ImagePullBackOff`,
//! `InvalidImageName`, `ErrImageNeverPull`, `RegistryUnavailable`,
//! `SignatureValidationFailed`; kubelet `images/types.go`) → [`ProblemKind::ImagePull`];
//! container start failures (`CreateContainerConfigError`, `CreateContainerError`,
//! `RunContainerError`, `PreStartHookError`, `PostStartHookError`, `CrashLoopBackOff`,
//! `ContainerCannotRun`; kubelet `container/sync_result.go`) →
//! [`ProblemKind::ContainerFailed`]; `PodScheduled=False` with reason `Unschedulable`
//! (kube-scheduler) → [`PodState::unschedulable`].
//!
//! No I/O and no clock reads: the caller passes `now`.

use crate::podspec::CONTAINER_NAME;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::time::Instant;

/// Waiting reasons that mean the image could not be pulled.
pub const IMAGE_PULL_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
    "SignatureValidationFailed",
];

/// Waiting reasons that mean the container could not be created or started.
pub const CONTAINER_FAILED_REASONS: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "PreStartHookError",
    "PostStartHookError",
    "CrashLoopBackOff",
    "ContainerCannotRun",
];

/// Class of a pod problem that makes a probe inconclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// Image could not be pulled.
    ImagePull,
    /// Container could not be created/started.
    ContainerFailed,
    /// The scheduler found no node (`PodScheduled=False`, reason `Unschedulable`).
    Unschedulable,
}

/// A problem seen on a pod (first seen; the reason/message is the latest).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Class.
    pub kind: ProblemKind,
    /// The Kubernetes reason string (`ErrImagePull`, `Unschedulable`, …).
    pub reason: String,
    /// The accompanying message (may be empty).
    pub message: String,
    /// When first observed.
    pub since: Instant,
}

/// The container's terminated state.
#[derive(Debug, Clone, PartialEq)]
pub struct Terminated {
    /// When first observed.
    pub at: Instant,
    /// `exitCode`.
    pub exit_code: i32,
    /// `reason` (`Completed`, `Error`, `OOMKilled`, …).
    pub reason: Option<String>,
    /// `message`: the termination message (the source's JSON report).
    pub message: Option<String>,
}

/// Everything observed about one pod. All instants are on the prober's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct PodState {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `spec.nodeName` once bound.
    pub node: Option<String>,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// `status.podIPs` in order (the first is `ip`; a second one of the other family
    /// on dual-stack clusters).
    pub ips: Vec<String>,
    /// `status.phase` (latest).
    pub phase: Option<String>,
    /// Create call returned (set by the probe) or first seen, whichever is earlier.
    pub created: Option<Instant>,
    /// Bound to a node.
    pub scheduled: Option<Instant>,
    /// `status.podIP` first set.
    pub ip_assigned: Option<Instant>,
    /// Container first seen `running`.
    pub running: Option<Instant>,
    /// `Ready` condition first `True`.
    pub ready: Option<Instant>,
    /// Container terminated.
    pub terminated: Option<Terminated>,
    /// Deleted (watch `DELETED` event).
    pub deleted: Option<Instant>,
    /// `PodScheduled=False`, reason `Unschedulable` (latest; `None` once scheduled).
    pub unschedulable: Option<Problem>,
    /// Image-pull or container-start problem (first seen).
    pub problem: Option<Problem>,
}

impl PodState {
    fn new(name: &str) -> Self {
        PodState {
            name: name.to_string(),
            uid: None,
            node: None,
            ip: None,
            ips: Vec::new(),
            phase: None,
            created: None,
            scheduled: None,
            ip_assigned: None,
            running: None,
            ready: None,
            terminated: None,
            deleted: None,
            unschedulable: None,
            problem: None,
        }
    }

    /// Applies one observation of the pod object at `now`. Returns true if anything
    /// changed.
    pub fn observe(&mut self, pod: &Pod, now: Instant) -> bool {
        let before = self.clone();
        if self.uid.is_none() {
            self.uid = pod.metadata.uid.clone();
        }
        if self.created.is_none() {
            self.created = Some(now);
        }
        let spec_node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        if spec_node.is_some() {
            self.node = spec_node;
        }
        let status = pod.status.as_ref();
        self.phase = status.and_then(|s| s.phase.clone()).or(self.phase.take());
        let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
        let cond = |t: &str| conditions.iter().find(|c| c.type_ == t);

        let scheduled_true = cond("PodScheduled").is_some_and(|c| c.status == "True");
        if (scheduled_true || self.node.is_some()) && self.scheduled.is_none() {
            self.scheduled = Some(now);
        }
        if self.scheduled.is_some() {
            self.unschedulable = None;
        } else if let Some(c) = cond("PodScheduled")
            .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        {
            let since = self.unschedulable.as_ref().map_or(now, |p| p.since);
            self.unschedulable = Some(Problem {
                kind: ProblemKind::Unschedulable,
                reason: "Unschedulable".into(),
                message: c.message.clone().unwrap_or_default(),
                since,
            });
        }

        if let Some(ip) = status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty())
        {
            self.ips = pod_ips(status, &ip);
            self.ip = Some(ip);
            if self.ip_assigned.is_none() {
                self.ip_assigned = Some(now);
            }
        }

        if cond("Ready").is_some_and(|c| c.status == "True") && self.ready.is_none() {
            self.ready = Some(now);
        }

        // By name: a sidecar (a mesh proxy injected despite the annotations) may sort
        // first in the list.
        let cs = status
            .and_then(|s| s.container_statuses.as_deref())
            .and_then(|v| v.iter().find(|c| c.name == CONTAINER_NAME));
        if let Some(state) = cs.and_then(|c| c.state.as_ref()) {
            if state.running.is_some() && self.running.is_none() {
                self.running = Some(now);
            }
            if let Some(t) = &state.terminated {
                if self.terminated.is_none() {
                    self.terminated = Some(Terminated {
                        at: now,
                        exit_code: t.exit_code,
                        reason: t.reason.clone(),
                        message: t.message.clone().filter(|m| !m.is_empty()),
                    });
                } else if let Some(term) = self.terminated.as_mut() {
                    // The message may arrive in a later update; keep the newest.
                    if term.message.is_none() {
                        term.message = t.message.clone().filter(|m| !m.is_empty());
                    }
                }
            }
            if let Some(w) = &state.waiting {
                let reason = w.reason.clone().unwrap_or_default();
                let kind = if IMAGE_PULL_REASONS.contains(&reason.as_str()) {
                    Some(ProblemKind::ImagePull)
                } else if CONTAINER_FAILED_REASONS.contains(&reason.as_str()) {
                    Some(ProblemKind::ContainerFailed)
                } else {
                    None
                };
                if let (Some(kind), None) = (kind, &self.problem) {
                    self.problem = Some(Problem {
                        kind,
                        reason,
                        message: w.message.clone().unwrap_or_default(),
                        since: now,
                    });
                }
            }
        }
        *self != before
    }
}

/// How many forgotten pod UIDs a [`Tracker`] remembers, so that a watch event arriving
/// after [`Tracker::forget`] does not bring the pod back (4 096: far more than the pods
/// in flight; the oldest is dropped first).
pub const FORGOTTEN_CAPACITY: usize = 4096;

/// Per-pod-name states of all probe pods of one prober instance.
#[derive(Debug, Default)]
pub struct Tracker {
    pods: HashMap<String, PodState>,
    /// UIDs of forgotten pods (bounded, [`FORGOTTEN_CAPACITY`]), oldest first.
    forgotten: std::collections::VecDeque<String>,
    forgotten_set: std::collections::HashSet<String>,
    /// UIDs listed by the re-list in progress ([`Tracker::begin_relist`]), `None`
    /// outside one.
    relisted: Option<std::collections::HashSet<String>>,
}

impl Tracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds an added/modified pod. Pods without a name are ignored. Returns true if the
    /// pod's state changed.
    pub fn apply(&mut self, pod: &Pod, now: Instant) -> bool {
        let Some(name) = pod.metadata.name.as_deref() else {
            return false;
        };
        if pod
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| self.forgotten_set.contains(u))
        {
            // A late event of a pod already recorded and forgotten.
            return false;
        }
        let state = self
            .pods
            .entry(name.to_string())
            .or_insert_with(|| PodState::new(name));
        // A same-name pod with a new UID is a new pod: start over.
        if let (Some(old), Some(new)) = (state.uid.as_deref(), pod.metadata.uid.as_deref()) {
            if old != new {
                *state = PodState::new(name);
            }
        }
        state.observe(pod, now)
    }

    /// Feeds a deleted pod (its last state is applied first). A pod not tracked is not
    /// added (its deletion ends it; nothing would forget it).
    pub fn delete(&mut self, pod: &Pod, now: Instant) -> bool {
        if pod
            .metadata
            .name
            .as_deref()
            .is_none_or(|n| !self.pods.contains_key(n))
        {
            return false;
        }
        let changed = self.apply(pod, now);
        match pod
            .metadata
            .name
            .as_deref()
            .and_then(|n| self.pods.get_mut(n))
        {
            Some(s) if s.deleted.is_none() => {
                s.deleted = Some(now);
                true
            }
            _ => changed,
        }
    }

    /// A (re-)list starts (watch event `Init`): the pods it lists are collected until
    /// [`Tracker::end_relist`]. kube-runtime re-lists after a `410 Gone` or when a watch
    /// cannot resume; a pod deleted meanwhile never gets a `DELETED` event.
    pub fn begin_relist(&mut self) {
        self.relisted = Some(Default::default());
    }

    /// Feeds a pod of the (re-)list (`InitApply`): [`Tracker::apply`], and the pod's UID
    /// counts as listed.
    pub fn apply_listed(&mut self, pod: &Pod, now: Instant) -> bool {
        if let (Some(set), Some(uid)) = (self.relisted.as_mut(), pod.metadata.uid.as_deref()) {
            set.insert(uid.to_string());
        }
        self.apply(pod, now)
    }

    /// The (re-)list is complete (`InitDone`): every tracked pod seen by the watch (it has
    /// a UID), not yet deleted and not listed is gone — it is marked deleted at `now`
    /// (mark and sweep). Pods only known from our create call (no UID yet: the list may
    /// predate them; their `ADDED` follows) are left alone. Without a preceding
    /// [`Tracker::begin_relist`] nothing happens. Returns true if a pod was marked.
    pub fn end_relist(&mut self, now: Instant) -> bool {
        let Some(listed) = self.relisted.take() else {
            return false;
        };
        let mut changed = false;
        for s in self.pods.values_mut() {
            let gone = s.deleted.is_none() && s.uid.as_ref().is_some_and(|u| !listed.contains(u));
            if gone {
                s.deleted = Some(now);
                changed = true;
            }
        }
        changed
    }

    /// Records that our create call for `name` returned at `at` (earlier than any
    /// watch event, which then keeps it).
    pub fn note_created(&mut self, name: &str, at: Instant) {
        let s = self
            .pods
            .entry(name.to_string())
            .or_insert_with(|| PodState::new(name));
        s.created = Some(s.created.map_or(at, |c| c.min(at)));
    }

    /// The state of `name`, if seen.
    pub fn get(&self, name: &str) -> Option<&PodState> {
        self.pods.get(name)
    }

    /// Drops a pod's state (after its probe is recorded), keeping memory bounded. Later
    /// events of the same pod (same UID) are ignored; a new pod of the same name (new
    /// UID, e.g. the next `recreate` incarnation) is tracked afresh.
    pub fn forget(&mut self, name: &str) {
        let Some(uid) = self.pods.remove(name).and_then(|s| s.uid) else {
            return;
        };
        if self.forgotten_set.insert(uid.clone()) {
            self.forgotten.push_back(uid);
        }
        while self.forgotten.len() > FORGOTTEN_CAPACITY {
            if let Some(old) = self.forgotten.pop_front() {
                self.forgotten_set.remove(&old);
            }
        }
    }

    /// Forgets every tracked pod ([`Tracker::forget`] each), e.g. the leftovers a
    /// restarted prober listed and deleted before its first probe.
    pub fn forget_all(&mut self) {
        let names: Vec<String> = self.pods.keys().cloned().collect();
        for n in names {
            self.forget(&n);
        }
    }

    /// Number of forgotten UIDs remembered (≤ [`FORGOTTEN_CAPACITY`]).
    pub fn forgotten_len(&self) -> usize {
        self.forgotten.len()
    }

    /// Number of tracked pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// True if no pod is tracked.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// Test helper: names every container (spec and status) of a fixture pod
/// [`CONTAINER_NAME`], as in a probe pod (the tracker reads the status of that name).
/// `status.podIPs` in order, or just `ip` (`status.podIP`) when the list is empty.
fn pod_ips(status: Option<&k8s_openapi::api::core::v1::PodStatus>, ip: &str) -> Vec<String> {
    let ips: Vec<String> = status
        .and_then(|s| s.pod_ips.as_ref())
        .map(|v| {
            v.iter()
                .map(|p| p.ip.clone())
                .filter(|i| !i.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if ips.is_empty() {
        vec![ip.to_string()]
    } else {
        ips
    }
}

#[cfg(test)]
pub(crate) fn as_probe_containers(pod: &mut Pod) {
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers
            .iter_mut()
            .for_each(|c| c.name = CONTAINER_NAME.into());
    }
    if let Some(cs) = pod
        .status
        .as_mut()
        .and_then(|s| s.container_statuses.as_mut())
    {
        cs.iter_mut().for_each(|c| c.name = CONTAINER_NAME.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        PodCondition,
    };
    use std::time::Duration;

    fn ready_fixture() -> Pod {
        let mut p: Pod =
            serde_json::from_str(include_str!("../tests/fixtures/k8s-pod-running-ready.json"))
                .expect("fixture parses as Pod");
        as_probe_containers(&mut p);
        p
    }

    /// A freshly created pod: the fixture with status and nodeName stripped.
    fn pending() -> Pod {
        let mut p = ready_fixture();
        p.status = None;
        if let Some(s) = p.spec.as_mut() {
            s.node_name = None;
        }
        p
    }

    fn cond(t: &str, status: &str, reason: Option<&str>) -> PodCondition {
        PodCondition {
            type_: t.into(),
            status: status.into(),
            reason: reason.map(String::from),
            message: Some(format!("{t} message")),
            ..Default::default()
        }
    }

    fn set_container_state(p: &mut Pod, state: ContainerState) {
        let st = p.status.get_or_insert_with(Default::default);
        let mut cs = ready_fixture()
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|v| v.into_iter().next())
            .expect("fixture has a container status");
        cs.state = Some(state);
        cs.ready = false;
        st.container_statuses = Some(vec![cs]);
    }

    #[test]
    fn milestones_are_stamped_at_first_observation_only() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut tr = Tracker::new();
        let name = "coredns-589f44dc88-4fpns";
        tr.note_created(name, at(0));
        assert!(tr.apply(&pending(), at(5)));
        let s = tr.get(name).expect("tracked");
        assert_eq!(s.created, Some(at(0)));
        assert_eq!(s.scheduled, None);
        assert_eq!(s.ready, None);

        let mut bound = pending();
        if let Some(s) = bound.spec.as_mut() {
            s.node_name = Some("node-2".into());
        }
        tr.apply(&bound, at(10));
        assert_eq!(tr.get(name).and_then(|s| s.scheduled), Some(at(10)));
        assert_eq!(
            tr.get(name).and_then(|s| s.node.clone()).as_deref(),
            Some("node-2")
        );

        tr.apply(&ready_fixture(), at(30));
        let s = tr.get(name).expect("tracked");
        assert_eq!(s.scheduled, Some(at(10)), "scheduled keeps first time");
        assert_eq!(s.ip_assigned, Some(at(30)));
        assert_eq!(s.ip.as_deref(), Some("10.244.0.3"));
        assert_eq!(s.ready, Some(at(30)));
        assert_eq!(s.running, Some(at(30)));
        assert_eq!(
            s.uid.as_deref(),
            Some("f78db027-d69e-485e-9a9e-a6dc7493b6d7")
        );

        assert!(
            !tr.apply(&ready_fixture(), at(40)),
            "same object changes nothing"
        );
        assert_eq!(tr.get(name).and_then(|s| s.ready), Some(at(30)));
    }

    #[test]
    fn running_but_not_ready_is_not_ready() {
        let mut p = ready_fixture();
        if let Some(st) = p.status.as_mut() {
            for c in st.conditions.iter_mut().flatten() {
                if c.type_ == "Ready" || c.type_ == "ContainersReady" {
                    c.status = "False".into();
                }
            }
        }
        let mut tr = Tracker::new();
        tr.apply(&p, Instant::now());
        let s = tr.get("coredns-589f44dc88-4fpns").expect("tracked");
        assert!(s.running.is_some());
        assert!(s.ready.is_none());
    }

    #[test]
    fn unschedulable_condition_is_reported_until_scheduled() {
        let mut p = pending();
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![cond("PodScheduled", "False", Some("Unschedulable"))]),
            ..Default::default()
        });
        let mut tr = Tracker::new();
        let t0 = Instant::now();
        tr.apply(&p, t0);
        let s = tr.get("coredns-589f44dc88-4fpns").expect("tracked");
        let u = s.unschedulable.as_ref().expect("unschedulable seen");
        assert_eq!(u.reason, "Unschedulable");
        assert_eq!(u.message, "PodScheduled message");
        tr.apply(&ready_fixture(), t0 + Duration::from_secs(1));
        let s = tr.get("coredns-589f44dc88-4fpns").expect("tracked");
        assert!(s.unschedulable.is_none());
        assert!(s.scheduled.is_some());
    }

    #[test]
    fn waiting_reasons_classify_image_pull_and_container_failures() {
        for (reason, kind) in [
            ("ErrImagePull", Some(ProblemKind::ImagePull)),
            ("ImagePullBackOff", Some(ProblemKind::ImagePull)),
            ("InvalidImageName", Some(ProblemKind::ImagePull)),
            ("CreateContainerError", Some(ProblemKind::ContainerFailed)),
            (
                "CreateContainerConfigError",
                Some(ProblemKind::ContainerFailed),
            ),
            ("ContainerCreating", None),
        ] {
            let mut p = ready_fixture();
            if let Some(st) = p.status.as_mut() {
                st.conditions = None;
            }
            set_container_state(
                &mut p,
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some("boom".into()),
                    }),
                    ..Default::default()
                },
            );
            let mut tr = Tracker::new();
            tr.apply(&p, Instant::now());
            let s = tr.get("coredns-589f44dc88-4fpns").expect("tracked");
            assert_eq!(s.problem.as_ref().map(|p| p.kind), kind, "{reason}");
            assert!(s.ready.is_none());
        }
    }

    #[test]
    fn terminated_state_keeps_exit_code_and_late_message() {
        let mut p = ready_fixture();
        set_container_state(
            &mut p,
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 0,
                    reason: Some("Completed".into()),
                    message: None,
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let mut tr = Tracker::new();
        let t0 = Instant::now();
        tr.apply(&p, t0);
        let name = "coredns-589f44dc88-4fpns";
        let t = tr
            .get(name)
            .and_then(|s| s.terminated.clone())
            .expect("terminated");
        assert_eq!(t.exit_code, 0);
        assert_eq!(t.message, None);
        set_container_state(
            &mut p,
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 0,
                    message: Some("{\"schema\":1}".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        tr.apply(&p, t0 + Duration::from_secs(1));
        let t = tr
            .get(name)
            .and_then(|s| s.terminated.clone())
            .expect("terminated");
        assert_eq!(t.at, t0, "first observation time kept");
        assert_eq!(t.message.as_deref(), Some("{\"schema\":1}"));
    }

    #[test]
    fn terminated_job_pod_fixture_reports_exit_code() {
        let list: serde_json::Value = serde_json::from_str(include_str!(
            "../tests/fixtures/k8s-podlist-job-pod-terminated.json"
        ))
        .expect("fixture json");
        let mut pod: Pod = serde_json::from_value(list["items"][0].clone()).expect("pod");
        as_probe_containers(&mut pod);
        let mut tr = Tracker::new();
        tr.apply(&pod, Instant::now());
        let name = pod.metadata.name.clone().expect("name");
        let s = tr.get(&name).expect("tracked");
        let t = s.terminated.as_ref().expect("terminated");
        assert_eq!(t.exit_code, 5);
        assert_eq!(t.reason.as_deref(), Some("Error"));
        assert_eq!(t.message, None);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn recreated_pod_with_new_uid_starts_over_and_delete_is_stamped() {
        let mut tr = Tracker::new();
        let t0 = Instant::now();
        tr.apply(&ready_fixture(), t0);
        let mut again = pending();
        again.metadata.uid = Some("new-uid".into());
        tr.apply(&again, t0 + Duration::from_secs(1));
        let s = tr.get("coredns-589f44dc88-4fpns").expect("tracked");
        assert_eq!(s.uid.as_deref(), Some("new-uid"));
        assert!(s.ready.is_none());
        tr.delete(&again, t0 + Duration::from_secs(2));
        let s = tr.get("coredns-589f44dc88-4fpns").expect("tracked");
        assert_eq!(s.deleted, Some(t0 + Duration::from_secs(2)));
        tr.forget("coredns-589f44dc88-4fpns");
        assert!(tr.is_empty());
    }

    #[test]
    fn late_events_of_a_forgotten_pod_do_not_bring_it_back_but_a_new_incarnation_is_tracked() {
        let mut tr = Tracker::new();
        let t0 = Instant::now();
        let old = ready_fixture();
        let name = old.metadata.name.clone().expect("name");
        tr.note_created(&name, t0);
        tr.apply(&old, t0);
        tr.forget(&name);
        assert!(tr.is_empty());
        assert_eq!(tr.forgotten_len(), 1);
        // MODIFIED and DELETED of the forgotten UID arrive late: ignored.
        assert!(!tr.apply(&old, t0 + Duration::from_secs(1)));
        assert!(!tr.delete(&old, t0 + Duration::from_secs(2)));
        assert!(tr.is_empty(), "forgotten pod re-inserted");
        // A DELETED of a pod never tracked does not add it either.
        let mut stranger = pending();
        stranger.metadata.name = Some("fp-other-0-t".into());
        stranger.metadata.uid = Some("stranger".into());
        assert!(!tr.delete(&stranger, t0));
        assert!(tr.is_empty());
        // The same name with a new UID (the next recreate incarnation) is tracked.
        let mut new = pending();
        new.metadata.uid = Some("new-uid".into());
        assert!(tr.apply(&new, t0 + Duration::from_secs(3)));
        assert_eq!(
            tr.get(&name).and_then(|s| s.uid.as_deref()),
            Some("new-uid")
        );
        tr.forget_all();
        assert!(tr.is_empty());
        assert_eq!(tr.forgotten_len(), 2);
        assert!(!tr.apply(&new, t0 + Duration::from_secs(4)));
    }

    #[test]
    fn forgotten_uids_are_bounded() {
        let mut tr = Tracker::new();
        let t0 = Instant::now();
        for i in 0..(FORGOTTEN_CAPACITY + 10) {
            let mut p = pending();
            p.metadata.name = Some(format!("fp-x-{i}-t"));
            p.metadata.uid = Some(format!("uid-{i}"));
            tr.apply(&p, t0);
            tr.forget(&format!("fp-x-{i}-t"));
        }
        assert_eq!(tr.forgotten_len(), FORGOTTEN_CAPACITY);
        assert!(tr.is_empty());
    }

    #[test]
    fn container_status_is_read_by_name_not_position() {
        // A mesh sidecar ("istio-proxy" sorts before "target-server") listed first and
        // running must not be taken for the probe container, which terminated.
        let mut p = ready_fixture();
        set_container_state(
            &mut p,
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 3,
                    reason: Some("Error".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let statuses = p
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
            .expect("statuses");
        let mut sidecar = statuses[0].clone();
        sidecar.name = "istio-proxy".into();
        sidecar.state = Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        });
        sidecar.ready = true;
        statuses.insert(0, sidecar);
        let mut tr = Tracker::new();
        tr.apply(&p, Instant::now());
        let s = tr.get("coredns-589f44dc88-4fpns").expect("tracked");
        assert_eq!(s.terminated.as_ref().map(|t| t.exit_code), Some(3));
        assert!(s.running.is_none(), "the sidecar's running state was taken");
        // And a pod whose only container has another name yields no container state.
        let mut other = ready_fixture();
        if let Some(cs) = other
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
        {
            cs[0].name = "linkerd-proxy".into();
        }
        let mut tr = Tracker::new();
        tr.apply(&other, Instant::now());
        assert!(tr
            .get("coredns-589f44dc88-4fpns")
            .is_some_and(|s| s.running.is_none() && s.terminated.is_none()));
    }

    #[test]
    fn a_relist_marks_pods_that_vanished_meanwhile_as_deleted() {
        let t0 = Instant::now();
        let pod = |name: &str, uid: &str| {
            let mut p = ready_fixture();
            p.metadata.name = Some(name.into());
            p.metadata.uid = Some(uid.into());
            p
        };
        let mut tr = Tracker::new();
        // The initial list (nothing tracked yet), then a and b seen by the watch.
        tr.begin_relist();
        assert!(!tr.end_relist(t0));
        tr.apply(&pod("a", "uid-a"), t0);
        tr.apply(&pod("b", "uid-b"), t0);
        tr.note_created("c", t0); // created, not seen by the watch yet
                                  // The watch expires (410); b is deleted before the re-list: Init, InitApply(a),
                                  // InitDone.
        let t1 = t0 + Duration::from_secs(5);
        tr.begin_relist();
        tr.apply_listed(&pod("a", "uid-a"), t1);
        assert!(tr.end_relist(t1), "b's deletion must be noticed");
        assert_eq!(tr.get("b").and_then(|s| s.deleted), Some(t1));
        assert_eq!(tr.get("a").and_then(|s| s.deleted), None);
        assert_eq!(
            tr.get("c").and_then(|s| s.deleted),
            None,
            "c has no UID yet"
        );
        // A same-name pod with a new UID in the re-list replaces the old incarnation.
        let t2 = t1 + Duration::from_secs(1);
        tr.begin_relist();
        tr.apply_listed(&pod("a", "uid-a2"), t2);
        tr.end_relist(t2);
        let a = tr.get("a").expect("a");
        assert_eq!(a.uid.as_deref(), Some("uid-a2"));
        assert_eq!(a.deleted, None);
        // InitDone without Init changes nothing.
        assert!(!tr.end_relist(t2));
    }

    #[test]
    fn running_state_is_stamped() {
        let mut p = pending();
        set_container_state(
            &mut p,
            ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            },
        );
        let mut tr = Tracker::new();
        let t0 = Instant::now();
        tr.apply(&p, t0);
        assert_eq!(
            tr.get("coredns-589f44dc88-4fpns").and_then(|s| s.running),
            Some(t0)
        );
    }
}
