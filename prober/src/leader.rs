//! Leader election for `prober run --leader-elect` on a `coordination.k8s.io/v1` Lease
//! (default `firstpacket-leader` in the probe namespace): several replicas run, only the
//! leader probes.
//!
//! The algorithm is client-go's (`k8s.io/client-go/tools/leaderelection/leaderelection.go`,
//! `tryAcquireOrRenew`, `renew`, `release`; defaults 15 s / 10 s / 2 s from its
//! `LeaderElectionConfig` docs), written here, not copied:
//!
//! - **Acquire or renew** (`Elector::try_acquire_or_renew`): the leader first replaces
//!   the Lease it last saw (a PUT carrying that `resourceVersion`: optimistic
//!   concurrency, a 409 if anybody else wrote it); otherwise GET, create it when missing
//!   (404), and take it over only when its holder is empty, is us, or its record has
//!   expired — again by a PUT with the `resourceVersion` just read, so of two standbys
//!   racing for an expired Lease exactly one wins.
//! - **Expiry** ([`Observation`]): a record (holder, `renewTime`, `leaseDurationSeconds`,
//!   `resourceVersion`) counts as expired when it has not *changed* for its
//!   `leaseDurationSeconds` on this process's own monotonic clock (client-go's
//!   `observedTime`). The holder's `renewTime` (its wall clock) is never compared with
//!   ours, so clock skew between machines cannot hand the Lease over early.
//! - **Stepping down**: the leader stops leading when renew-deadline has passed since the
//!   *send* time of its last successful renewal (client-go counts its deadline from the
//!   start of a renew round, one retry period after the last success; counting from the
//!   last success is stricter), or at once when the Lease is seen held by another. As a
//!   standby only acquires after a full lease duration without seeing a change — which
//!   it can see no earlier than our write was sent —, and lease duration > renew
//!   deadline ([`validate`]), the old leader has stopped before a new one starts, as long
//!   as the two monotonic clocks run at about the same rate.
//! - **Release** ([`LeaderHandle::release`], client-go's `ReleaseOnCancel`): on SIGTERM,
//!   after the probes ended and their pods are deleted, the leader writes the Lease
//!   with no holder and `leaseDurationSeconds: 1`, so a standby takes over at its next
//!   attempt instead of after a lease duration.
//! - Standbys retry every retry period, and when the observed record would expire
//!   before the next retry, exactly at its expiry (client-go retries with up to 120 %
//!   jitter instead): a SIGKILLed leader is replaced within lease duration + retry
//!   period of its last renewal being seen.
//! - An API outage shorter than renew-deadline (e.g. an API server restart) does not
//!   step the leader down: renewals are retried every retry period, each bounded by the
//!   time left before the deadline.
//!
//! Why not the `kube-lease-manager` crate (evaluated, 0.13): it does not step down when
//! renewals fail (the holder keeps acting until the Lease is taken from it), judges
//! expiry by comparing the holder's `renewTime` with the local wall clock, relies on
//! server-side-apply conflicts instead of `resourceVersion` preconditions, and does not
//! expose the current holder (the status page names it).
//!
//! Bounded state: one Lease object and one observation.

use crate::error::{kube_status_code, Error};
use crate::labels::{APP_NAME, LABEL_COMPONENT, LABEL_NAME};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::Api;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

/// client-go's `JitterFactor` (1.2): renew-deadline must exceed retry period × this
/// (`NewLeaderElector`'s check), so a renew round has room for more than one try.
pub const JITTER_FACTOR: f64 = 1.2;

/// `app.kubernetes.io/component` of the leader Lease (apart from instance Leases, which
/// [`crate::lease::Reaper`] selects by their own component and never touches this one).
pub const LEADER_COMPONENT: &str = "leader-lease";

/// After the observed record's expiry, how long a standby waits before its attempt (so
/// the attempt is surely after it on our clock).
const EXPIRY_MARGIN: Duration = Duration::from_millis(20);

/// Leader election settings (the `--leader-elect-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease (the probe namespace).
    pub namespace: String,
    /// Lease name (`--leader-elect-lease-name`).
    pub lease_name: String,
    /// Our holder identity ([`identity`]).
    pub identity: String,
    /// How long a record must stay unchanged before a standby may take the Lease
    /// (`--leader-elect-lease-duration`, whole seconds: `leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a failing renewal before it steps down
    /// (`--leader-elect-renew-deadline`).
    pub renew_deadline: Duration,
    /// Time between attempts (`--leader-elect-retry-period`).
    pub retry_period: Duration,
}

/// Checks the three durations as client-go's `NewLeaderElector` does: lease duration >
/// renew deadline > retry period × [`JITTER_FACTOR`], retry period ≥ 1 ms; and, since
/// `leaseDurationSeconds` is an integer, lease duration a whole number of seconds, 1 s … `i32::MAX` s.
///
/// Errors: [`Error::Config`] naming the flag and both values.
pub fn validate(lease: Duration, deadline: Duration, retry: Duration) -> Result<(), Error> {
    let h = |d: Duration| humantime::format_duration(d).to_string();
    if lease < Duration::from_secs(1) || lease.subsec_nanos() != 0 {
        return Err(Error::Config {
            flag: "--leader-elect-lease-duration",
            message: format!(
                "{} is not a whole number of seconds ≥ 1s (it is the Lease's leaseDurationSeconds)",
                h(lease)
            ),
        });
    }
    if lease.as_secs() > i32::MAX as u64 {
        return Err(Error::Config {
            flag: "--leader-elect-lease-duration",
            message: format!(
                "{} does not fit the Lease's leaseDurationSeconds (int32, at most {}s)",
                h(lease),
                i32::MAX
            ),
        });
    }
    if retry < Duration::from_millis(1) {
        return Err(Error::Config {
            flag: "--leader-elect-retry-period",
            message: format!("{} must be at least 1ms", h(retry)),
        });
    }
    if lease <= deadline {
        return Err(Error::Config {
            flag: "--leader-elect-lease-duration",
            message: format!(
                "{} must be greater than --leader-elect-renew-deadline {} (else a standby may \
                 take over while the leader still probes)",
                h(lease),
                h(deadline)
            ),
        });
    }
    if deadline.as_secs_f64() <= retry.as_secs_f64() * JITTER_FACTOR {
        return Err(Error::Config {
            flag: "--leader-elect-renew-deadline",
            message: format!(
                "{} must be greater than --leader-elect-retry-period {} × {JITTER_FACTOR}",
                h(deadline),
                h(retry)
            ),
        });
    }
    Ok(())
}

/// Our holder identity: the pod name (`POD_NAME`, from the downward API) in-cluster,
/// else `<hostname>_<instance>` (client-go's usual `hostname_<uuid>`; the instance id
/// is random out-of-cluster, so two replicas on one host differ). `get` reads an
/// environment variable; `hostname` is the host's name (may be empty).
pub fn identity(get: impl Fn(&str) -> Option<String>, hostname: &str, instance: &str) -> String {
    match get("POD_NAME").filter(|s| !s.is_empty()) {
        Some(pod) => pod,
        None if hostname.is_empty() => instance.to_owned(),
        None => format!("{hostname}_{instance}"),
    }
}

/// The host's name: `/proc/sys/kernel/hostname`, else `HOSTNAME`, else empty.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}

use crate::lease::{Observation, Record};

/// What the status page and `/api/v1/probes` (`info.leadership`) show of the election.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Leadership {
    /// `--leader-elect` given (false: this replica always probes).
    pub enabled: bool,
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// Our holder identity.
    pub identity: String,
    /// We lead (and probe) now.
    pub leading: bool,
    /// Terms we started since start-up (1 during the first one).
    pub terms: u64,
    /// Unix time (our wall clock) our current term started, if leading.
    pub term_started_unix: Option<f64>,
    /// The Lease's current holder as last read (None: nobody, or not read yet).
    pub holder: Option<String>,
    /// The holder's `acquireTime` (its wall clock, RFC 3339; display only): its term start.
    pub holder_since: Option<String>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
    /// The last failed attempt's error (cleared by the next success).
    pub last_error: Option<String>,
}

/// The election's state between attempts.
struct Elector {
    api: Api<Lease>,
    url: String,
    cfg: LeaderConfig,
    /// The Lease as last read or written (its `resourceVersion` is the precondition of
    /// the next replace).
    lease: Option<Lease>,
    observed: Option<Observation>,
    leading: bool,
    /// Send time of the last successful renewal (or acquisition), while leading.
    renewed_at: Option<Instant>,
    status: watch::Sender<Leadership>,
}

/// Outcome of one attempt.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// We hold the Lease (acquired or renewed).
    Held,
    /// Somebody else holds a valid record.
    HeldByOther,
    /// The API refused or did not answer (the message says which call).
    Failed(String),
}

impl Elector {
    fn resource(&self) -> String {
        format!("leases {}/{}", self.cfg.namespace, self.cfg.lease_name)
    }

    fn err(&self, e: kube::Error, verb: &'static str) -> String {
        Error::from_kube(e, &self.url, verb, self.resource()).to_string()
    }

    /// The Lease spec we write: holder us, our duration, renewTime `now`; acquireTime
    /// and transitions from `prev` when it was ours, else `now` and `prev + 1`.
    fn our_spec(&self, prev: Option<&Record>, now: Timestamp) -> LeaseSpec {
        let ours = prev.is_some_and(|r| r.holder.as_deref() == Some(&self.cfg.identity));
        let acquire = match prev {
            Some(r) if ours => r
                .acquire_time
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .unwrap_or(now),
            _ => now,
        };
        let transitions = match prev {
            Some(r) if ours => r.transitions,
            Some(r) => r.transitions + 1,
            None => 0,
        };
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(self.cfg.lease_duration.as_secs() as i32),
            acquire_time: Some(MicroTime(acquire)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    fn new_lease(&self, spec: LeaseSpec) -> Lease {
        let labels = [(LABEL_NAME, APP_NAME), (LABEL_COMPONENT, LEADER_COMPONENT)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.lease_name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(spec),
        }
    }

    /// Replaces the Lease with `spec`, precondition the `resourceVersion` of `base`.
    async fn replace(&mut self, base: &Lease, spec: LeaseSpec) -> Result<(), kube::Error> {
        let mut l = base.clone();
        l.spec = Some(spec);
        let written = self
            .api
            .replace(&self.cfg.lease_name, &PostParams::default(), &l)
            .await?;
        self.remember(written, Instant::now());
        Ok(())
    }

    fn remember(&mut self, lease: Lease, now: Instant) {
        let rec = Record::of(&lease);
        match &mut self.observed {
            Some(o) => {
                o.observe(rec, now);
            }
            None => self.observed = Some(Observation::new(rec, now)),
        }
        self.lease = Some(lease);
    }

    /// One round of client-go's `tryAcquireOrRenew` (module docs).
    async fn try_acquire_or_renew(&mut self) -> Attempt {
        let now_wall = Timestamp::now();
        let now = Instant::now();
        // 1. Fast path: the leader replaces the Lease it last saw.
        if self.leading {
            if let (Some(base), Some(o)) = (self.lease.clone(), self.observed.clone()) {
                if !o.expired(now) {
                    let spec = self.our_spec(Some(&o.record), now_wall);
                    match self.replace(&base, spec).await {
                        Ok(()) => return Attempt::Held,
                        Err(e) => {
                            tracing::debug!(error = %self.err(e, "update"), "optimistic Lease renewal failed; reading the Lease")
                        }
                    }
                }
            }
        }
        // 2. Read it; create it when missing.
        let current = match self.api.get_opt(&self.cfg.lease_name).await {
            Ok(Some(l)) => l,
            Ok(None) => {
                let lease = self.new_lease(self.our_spec(None, now_wall));
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(l) => {
                        self.remember(l, Instant::now());
                        Attempt::Held
                    }
                    Err(e) if kube_status_code(&e) == Some(409) => Attempt::Failed(format!(
                        "{}: created meanwhile by another",
                        self.resource()
                    )),
                    Err(e) => Attempt::Failed(self.err(e, "create")),
                };
            }
            Err(e) => return Attempt::Failed(self.err(e, "get")),
        };
        // 3. Judge the record on our clock.
        self.remember(current.clone(), Instant::now());
        let Some(o) = self.observed.clone() else {
            return Attempt::Failed("no observation".into());
        };
        if !o.may_take(&self.cfg.identity, Instant::now()) {
            return Attempt::HeldByOther;
        }
        // 4. Take it over (or renew through the slow path), precondition its version.
        let spec = self.our_spec(Some(&o.record), now_wall);
        match self.replace(&current, spec).await {
            Ok(()) => Attempt::Held,
            Err(e) => Attempt::Failed(self.err(e, "update")),
        }
    }

    fn publish(&self, last_error: Option<String>) {
        let o = self.observed.as_ref().map(|o| &o.record);
        self.status.send_modify(|s| {
            s.leading = self.leading;
            s.holder = o.and_then(|r| r.holder.clone());
            s.holder_since = o.and_then(|r| r.acquire_time.clone());
            s.transitions = o.map_or(0, |r| r.transitions);
            s.last_error = last_error;
        });
    }

    /// The election loop: attempts every retry period (standbys also exactly at the
    /// observed record's expiry), steps down past the renew deadline. Never returns.
    async fn run(state: Arc<Mutex<Elector>>) {
        let mut failing = false;
        loop {
            let wait = {
                let mut el = state.lock().await;
                let sent = Instant::now();
                let retry = el.cfg.retry_period;
                let deadline = el.cfg.renew_deadline;
                // Each attempt is bounded: a leader's by the time left before its
                // deadline (so a hanging request cannot keep it leading), a standby's
                // by the renew deadline.
                let budget = match (el.leading, el.renewed_at) {
                    (true, Some(r)) => (r + deadline).saturating_duration_since(sent),
                    _ => deadline,
                };
                let outcome = match tokio::time::timeout(budget, el.try_acquire_or_renew()).await {
                    Ok(a) => a,
                    Err(_) => Attempt::Failed(format!(
                        "{}: no answer within {}",
                        el.resource(),
                        humantime::format_duration(budget)
                    )),
                };
                let now = Instant::now();
                let mut last_error = None;
                match outcome {
                    Attempt::Held => {
                        if failing {
                            tracing::info!(lease = %el.resource(), "leader election: the API answers again");
                            failing = false;
                        }
                        if !el.leading {
                            el.leading = true;
                            el.status.send_modify(|s| {
                                s.terms += 1;
                                s.term_started_unix =
                                    Some(Timestamp::now().as_millisecond() as f64 / 1000.0);
                            });
                            tracing::info!(lease = %el.resource(), identity = %el.cfg.identity, "became leader: probing");
                        }
                        el.renewed_at = Some(sent);
                    }
                    Attempt::HeldByOther => {
                        if el.leading {
                            tracing::warn!(lease = %el.resource(), holder = ?el.observed.as_ref().and_then(|o| o.record.holder.clone()),
                                "the Lease is held by another: stepping down (no new probes)");
                            el.step_down();
                        }
                    }
                    Attempt::Failed(msg) => {
                        if !failing {
                            tracing::warn!(lease = %el.resource(), error = %msg, "leader election attempt failed (retrying)");
                            failing = true;
                        }
                        if el.leading
                            && el
                                .renewed_at
                                .is_none_or(|r| now.duration_since(r) >= deadline)
                        {
                            tracing::warn!(lease = %el.resource(), error = %msg,
                                renew_deadline = %humantime::format_duration(deadline),
                                "could not renew the leader Lease within the renew deadline: stepping down (no new probes)");
                            el.step_down();
                        }
                        last_error = Some(msg);
                    }
                }
                el.publish(last_error);
                // Next attempt: a retry period on; a standby also at the expiry of the
                // record it watches; a leader no later than its deadline.
                let mut next = now + retry;
                if !el.leading {
                    if let Some(o) = &el.observed {
                        let at = o.expires_at() + EXPIRY_MARGIN;
                        if at > now && at < next {
                            next = at;
                        }
                    }
                } else if let Some(r) = el.renewed_at {
                    next = next.min((r + deadline).max(now));
                }
                next
            };
            tokio::time::sleep_until(wait.into()).await;
        }
    }

    fn step_down(&mut self) {
        self.leading = false;
        self.renewed_at = None;
        self.status.send_modify(|s| s.term_started_unix = None);
    }
}

/// A running election: its status channel and the loop task.
pub struct LeaderHandle {
    state: Arc<Mutex<Elector>>,
    task: JoinHandle<()>,
    /// The election's status; `leading` flips false before anything else learns of a
    /// lost term.
    pub status: watch::Receiver<Leadership>,
}

/// Starts the election loop for `cfg` on `client` (`url` for error messages). Returns at
/// once; the first attempt runs on the task. Call only with a [`validate`]d `cfg`.
pub fn spawn(client: kube::Client, url: &str, cfg: LeaderConfig) -> LeaderHandle {
    let initial = Leadership {
        enabled: true,
        lease: format!("{}/{}", cfg.namespace, cfg.lease_name),
        identity: cfg.identity.clone(),
        ..Default::default()
    };
    let (tx, rx) = watch::channel(initial);
    let el = Elector {
        api: Api::namespaced(client, &cfg.namespace),
        url: url.to_owned(),
        cfg,
        lease: None,
        observed: None,
        leading: false,
        renewed_at: None,
        status: tx,
    };
    let state = Arc::new(Mutex::new(el));
    let task = tokio::spawn(Elector::run(state.clone()));
    LeaderHandle {
        state,
        task,
        status: rx,
    }
}

impl LeaderHandle {
    /// Whether we lead now.
    pub fn leading(&self) -> bool {
        self.status.borrow().leading
    }

    /// Stops the election and, if we lead, releases the Lease (client-go's
    /// `ReleaseOnCancel`): holder cleared, `leaseDurationSeconds: 1`, transitions kept,
    /// a replace with the last seen `resourceVersion` (one try, bounded by `within`).
    /// Call only after the probes ended (nothing guarded by the Lease still runs).
    /// Returns whether the Lease was released (false: not leading, or the write failed —
    /// logged; the Lease then expires after its duration).
    pub async fn release(self, within: Duration) -> bool {
        self.task.abort();
        // The aborted loop drops its lock at its next await point.
        let mut el = self.state.lock().await;
        if !el.leading {
            return false;
        }
        let (Some(base), Some(o)) = (el.lease.clone(), el.observed.clone()) else {
            return false;
        };
        let now = MicroTime(Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(o.record.transitions),
            ..Default::default()
        };
        let out = tokio::time::timeout(within, el.replace(&base, spec)).await;
        el.step_down();
        let ok = match out {
            Ok(Ok(())) => {
                tracing::info!(lease = %el.resource(), "released the leader Lease");
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %el.err(e, "update"), "could not release the leader Lease (it expires by itself)");
                false
            }
            Err(_) => {
                tracing::warn!(lease = %el.resource(), "no answer releasing the leader Lease (it expires by itself)");
                false
            }
        };
        el.publish(None);
        ok
    }
}

impl Drop for LeaderHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(holder: Option<&str>, rv: &str, secs: i32) -> Record {
        Record {
            holder: holder.map(str::to_owned),
            lease_duration_seconds: secs,
            renew_time: Some(format!("t{rv}")),
            resource_version: rv.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_duration_past_int32_seconds_is_refused() {
        let s = Duration::from_secs;
        assert!(validate(s(i32::MAX as u64), s(10), s(2)).is_ok());
        let e = validate(s(3_000_000_000), s(10), s(2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("int32"), "{e}");
    }

    #[test]
    fn a_record_expires_only_after_staying_unchanged_for_its_duration_on_our_clock() {
        let t0 = Instant::now();
        let mut o = Observation::new(rec(Some("a"), "1", 6), t0);
        assert!(!o.expired(t0 + Duration::from_millis(5999)));
        assert!(!o.may_take("b", t0 + Duration::from_secs(5)));
        // A renewal seen at 5 s restarts the clock, whatever renewTime says.
        o.observe(rec(Some("a"), "2", 6), t0 + Duration::from_secs(5));
        assert!(!o.expired(t0 + Duration::from_secs(10)));
        assert!(o.expired(t0 + Duration::from_secs(11)));
        assert!(o.may_take("b", t0 + Duration::from_secs(11)));
        // Reading the same record again does not.
        o.observe(rec(Some("a"), "2", 6), t0 + Duration::from_secs(10));
        assert_eq!(o.since, t0 + Duration::from_secs(5));
    }

    #[test]
    fn the_holders_wall_clock_is_never_compared_with_ours() {
        // A renewTime far in the past (the holder's clock hours behind) but a fresh
        // change: valid. The same renewTime seen unchanged for the duration: expired.
        let t0 = Instant::now();
        let mut r = rec(Some("a"), "7", 15);
        r.renew_time = Some("1970-01-01T00:00:00Z".into());
        let o = Observation::new(r, t0);
        assert!(!o.may_take("b", t0 + Duration::from_secs(14)));
        assert!(o.may_take("b", t0 + Duration::from_secs(15)));
    }

    #[test]
    fn a_released_or_own_lease_may_be_taken_at_once() {
        let t0 = Instant::now();
        let released = Observation::new(rec(None, "9", 1), t0);
        assert!(released.may_take("b", t0));
        let ours = Observation::new(rec(Some("b"), "9", 15), t0);
        assert!(ours.may_take("b", t0));
        // A release's leaseDurationSeconds 1 also makes a record with a holder expire
        // one second after it was seen.
        let short = Observation::new(rec(Some("a"), "9", 1), t0);
        assert!(short.may_take("b", t0 + Duration::from_secs(1)));
        assert_eq!(short.expires_at(), t0 + Duration::from_secs(1));
    }

    #[test]
    fn durations_are_validated_like_client_go() {
        let s = Duration::from_secs;
        assert!(validate(s(15), s(10), s(2)).is_ok());
        assert!(validate(s(6), s(4), s(1)).is_ok());
        let flag = |r: Result<(), Error>| match r {
            Err(Error::Config { flag, message }) => (flag, message),
            other => panic!("{other:?}"),
        };
        let (f, m) = flag(validate(s(10), s(10), s(2)));
        assert_eq!(f, "--leader-elect-lease-duration");
        assert!(
            m.contains("greater than --leader-elect-renew-deadline 10s"),
            "{m}"
        );
        let (f, m) = flag(validate(s(15), s(2), s(2)));
        assert_eq!(f, "--leader-elect-renew-deadline");
        assert!(m.contains("--leader-elect-retry-period 2s × 1.2"), "{m}");
        // 2.4 s is not more than 2 s × 1.2.
        assert!(validate(s(15), Duration::from_millis(2400), s(2)).is_err());
        assert!(validate(s(15), Duration::from_millis(2401), s(2)).is_ok());
        let (f, _) = flag(validate(Duration::from_millis(6500), s(4), s(1)));
        assert_eq!(f, "--leader-elect-lease-duration");
        let (f, _) = flag(validate(s(6), s(4), Duration::ZERO));
        assert_eq!(f, "--leader-elect-retry-period");
    }

    #[test]
    fn identity_is_the_pod_name_else_host_and_instance() {
        let pod = |k: &str| (k == "POD_NAME").then(|| "prober-7d9-x2".to_string());
        assert_eq!(identity(pod, "host", "run-ab12cd34"), "prober-7d9-x2");
        assert_eq!(
            identity(|_| None, "host", "run-ab12cd34"),
            "host_run-ab12cd34"
        );
        assert_eq!(identity(|_| None, "", "run-ab12cd34"), "run-ab12cd34");
    }

    #[test]
    fn a_record_reads_holder_duration_and_version_from_the_lease() {
        let l = Lease {
            metadata: ObjectMeta {
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                lease_transitions: Some(3),
                ..Default::default()
            }),
        };
        let r = Record::of(&l);
        assert_eq!(r.holder, None, "an empty holder is nobody");
        assert_eq!((r.lease_duration_seconds, r.transitions), (1, 3));
        assert_eq!(r.resource_version, "42");
    }
}
