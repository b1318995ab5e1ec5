//! The one shared, label-selected pod watch of a prober instance (one watcher for all
//! probe pods, as a kube-rs controller watches its objects; watches independent of node
//! count, docs/design.md §7).
//!
//! A background task runs `kube::runtime::watcher` on Pods in the namespace with
//! `firstpacket.io/instance=<id>` and feeds every event into the pure
//! [`Tracker`], stamping it with the prober clock. Probes wait
//! on a `tokio::sync::watch` generation counter with [`PodWatch::wait_for`], always with
//! a deadline.
//!
//! Re-lists (kube-runtime's `Init`, `InitApply`…, `InitDone` after a `410 Gone`) are
//! mark-and-sweep: a tracked pod missing from the re-list was deleted meanwhile and is
//! marked deleted ([`Tracker::end_relist`]), so a wait for a `DELETED` event (the
//! `recreate` kind) does not run out. Every watch request is bounded
//! ([`WATCH_TIMEOUT_SECS`]).
//!
//! Watch trouble (list/watch failing: connection refused, 5xx, 403, timeouts — anything
//! but a `410 Gone`, which is the API server's normal "resourceVersion too old" and is
//! followed by a re-list) is stamped, so a probe whose wait ran out while the watch was
//! failing knows its view is incomplete ([`PodWatch::trouble_since`]) and ends as
//! `inconclusive`/`api_error` instead of blaming the pods.
//!
//! A `401`/`403` on the watch's list or watch calls **before the watch has delivered
//! any event** is different: RBAC does not let this prober watch its pods at all, and
//! no probe can ever see its pods turn Ready. It is recorded as [`WatchForbidden`]
//! ([`PodWatch::forbidden`], [`PodWatch::wait_forbidden`]); [`PodWatch::wait_ready`]
//! fails with it at once, and the gate stops the run with it (exit 2) instead of
//! waiting for `--timeout`. Once the watch has worked, a later 403 (RBAC changed
//! mid-run, API server restarted) stays ordinary trouble as above.

use crate::error::{watcher_error_text, Error};
use crate::sync::lock;
use crate::tracker::{PodState, Tracker};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How a [`PodWatch::wait_for`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Wait<T> {
    /// The predicate returned a value.
    Done(T),
    /// The deadline passed first.
    TimedOut,
    /// The run was cancelled (signal, `--timeout`).
    Cancelled,
}

/// RBAC (or authentication) forbids the pod watch: a `401`/`403` on its list or watch
/// call before the watch ever delivered an event. Carries what the API server said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchForbidden {
    /// The refused verb: `list` (initial list) or `watch`.
    pub verb: &'static str,
    /// HTTP status code (401 or 403).
    pub code: u16,
    /// `Status.reason` (e.g. `Forbidden`).
    pub reason: String,
    /// `Status.message`.
    pub message: String,
}

impl WatchForbidden {
    /// The run error naming the API URL, verb, resource (`pods in namespace NS`) and the
    /// API server's answer ([`Error::Api`]).
    pub fn to_error(&self, url: &str, namespace: &str) -> Error {
        Error::Api {
            url: url.to_string(),
            verb: self.verb,
            resource: format!("pods in namespace {namespace}"),
            code: self.code,
            reason: self.reason.clone(),
            message: self.message.clone(),
            source: None,
        }
    }
}

/// The [`WatchForbidden`] in a watcher error, if it is a `401`/`403` (pure). `None` for
/// every other error and whenever the watch has already delivered events (`established`):
/// then it is trouble ([`is_watch_trouble`]), not a start-up failure. A `410 Gone` or
/// any other code is never forbidden.
pub fn forbidden(err: &watcher::Error, established: bool) -> Option<WatchForbidden> {
    if established {
        return None;
    }
    let (verb, status) = match err {
        watcher::Error::InitialListFailed(kube::Error::Api(s)) => ("list", s),
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => ("watch", s),
        watcher::Error::WatchError(s) => ("watch", s),
        _ => return None,
    };
    matches!(status.code, 401 | 403).then(|| WatchForbidden {
        verb,
        code: status.code,
        reason: status.reason.clone(),
        message: status.message.clone(),
    })
}

struct Shared {
    tracker: Mutex<Tracker>,
    generation: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    /// Set by the first [`forbidden`] error; never cleared (RBAC does not heal itself).
    forbidden: watch::Sender<Option<WatchForbidden>>,
    last_error: Mutex<Option<String>>,
    /// Prober-clock time and text of the last watch error that is trouble
    /// ([`is_watch_trouble`]).
    trouble: Mutex<Option<(std::time::Instant, String)>>,
}

/// Server-side `timeoutSeconds` of every watch request the prober makes (pods, nodes,
/// agent pods): 50 s. The API server ends each watch after it and kube-runtime resumes
/// from the last resourceVersion (a re-list only after a `410 Gone`). kube-runtime
/// (5.x) also treats a watch that delivered nothing for this + 5 s as dead and
/// reconnects: that is the client-side timeout that catches a connection cut silently
/// (a load balancer or NAT dropping it without a FIN/RST). 50 s keeps both below the
/// shortest common idle cut-off of load balancers in front of API servers (60 s, e.g.
/// AWS ALB's default; others range up to 350 s), so a quiet watch is never idle long
/// enough to be cut, and a cut one is noticed within 55 s.
pub const WATCH_TIMEOUT_SECS: u32 = 50;

/// Objects per page of a (re-)list: [`LIST_PAGE_SIZE`] instead of kube-runtime's 500. A
/// page is held whole, as its JSON body and as parsed objects, while it is read; at 1 000
/// nodes the agent watches list ~1 000 pods each (~7.5 KB of JSON per pod with its
/// `managedFields`), so 500 per page made each page ~4 MB of body plus its parsed copy, the
/// largest part of the prober's peak RSS. 100 per page costs 10 list requests per 1 000
/// objects, once per watch start and re-list.
pub const LIST_PAGE_SIZE: u32 = 100;

/// The kube-runtime watcher configuration of every prober watch: `label_selector`,
/// [`WATCH_TIMEOUT_SECS`] and [`LIST_PAGE_SIZE`].
pub fn watcher_config(label_selector: &str) -> watcher::Config {
    watcher::Config::default()
        .labels(label_selector)
        .timeout(WATCH_TIMEOUT_SECS)
        .page_size(LIST_PAGE_SIZE)
}

/// How often [`PodWatch::wait_for`] re-evaluates its predicate without a watch event, so
/// predicates that depend on elapsed time (e.g. the unschedulable grace,
/// `crate::probe::UNSCHEDULABLE_GRACE`) fire even when the pod does not change.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Whether a watcher error means the API failed us. A `410 Gone` watch event is the API
/// server's normal answer to an expired resourceVersion (kube-runtime re-lists at once;
/// Kubernetes API concepts, "Efficient detection of changes"): not trouble. Everything
/// else (list/watch start failed, stream failed, other error events) is.
pub fn is_watch_trouble(err: &watcher::Error) -> bool {
    !matches!(err, watcher::Error::WatchError(s) if s.code == 410)
}

/// Feeds one watcher event into the tracker (pure): `Apply` → [`Tracker::apply`],
/// `Delete` → [`Tracker::delete`], `Init` / `InitApply` / `InitDone` → the mark-and-sweep
/// re-list ([`Tracker::begin_relist`], [`Tracker::apply_listed`],
/// [`Tracker::end_relist`]: pods deleted while the watch re-listed get no `DELETED`
/// event). Returns whether waiters should re-check (`InitDone` always: the watch is
/// ready).
pub fn feed(t: &mut Tracker, ev: &Event<Pod>, now: std::time::Instant) -> bool {
    match ev {
        Event::Apply(p) => t.apply(p, now),
        Event::InitApply(p) => t.apply_listed(p, now),
        Event::Delete(p) => t.delete(p, now),
        Event::Init => {
            t.begin_relist();
            false
        }
        Event::InitDone => {
            t.end_relist(now);
            true
        }
    }
}

/// Handle on the running pod watch. Dropping it stops the watch task.
pub struct PodWatch {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    namespace: String,
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PodWatch {
    /// Starts watching `api` (namespaced Pods) with `label_selector`.
    pub fn start(api: Api<Pod>, label_selector: &str) -> Self {
        let (generation, _) = watch::channel(0u64);
        let (ready, _) = watch::channel(false);
        let (forbidden_tx, _) = watch::channel(None);
        let namespace = api.namespace().unwrap_or_default().to_string();
        let shared = Arc::new(Shared {
            tracker: Mutex::new(Tracker::new()),
            generation,
            ready,
            forbidden: forbidden_tx,
            last_error: Mutex::new(None),
            trouble: Mutex::new(None),
        });
        let cfg = watcher_config(label_selector);
        let s = shared.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
            // A live watch delivered an event: RBAC lets us watch.
            let mut established = false;
            while let Some(ev) = stream.next().await {
                let now = std::time::Instant::now();
                let changed = match ev {
                    Ok(ev) => {
                        if matches!(ev, Event::Apply(_) | Event::Delete(_)) {
                            established = true;
                        }
                        let changed = feed(&mut lock(&s.tracker), &ev, now);
                        if matches!(ev, Event::InitDone) {
                            s.ready.send_replace(true);
                        }
                        changed
                    }
                    Err(e) => {
                        let msg = watcher_error_text(&e);
                        if crate::apihealth::watcher_unanswered(&e) {
                            tracing::debug!(error = %msg, "pod watch: API server not answering (retrying with backoff)");
                        } else {
                            tracing::warn!(error = %msg, "pod watch error (retrying with backoff)");
                        }
                        if is_watch_trouble(&e) {
                            *lock(&s.trouble) = Some((now, msg.clone()));
                        }
                        if let Some(f) = forbidden(&e, established) {
                            s.forbidden.send_if_modified(|cur| {
                                let first = cur.is_none();
                                if first {
                                    *cur = Some(f);
                                }
                                first
                            });
                        }
                        *lock(&s.last_error) = Some(msg);
                        false
                    }
                };
                if changed {
                    s.generation.send_modify(|g| *g += 1);
                }
            }
        });
        PodWatch {
            shared,
            task,
            namespace,
        }
    }

    /// Waits until the watch delivered its initial list (so no event can be missed and
    /// API errors surface early). Errors after `timeout` with the last watch error, or
    /// at once with [`Error::Api`] (verb `list`/`watch`, `url` named) when the watch is
    /// [forbidden](WatchForbidden).
    pub async fn wait_ready(&self, url: &str, timeout: Duration) -> Result<(), Error> {
        let mut rx = self.shared.ready.subscribe();
        let mut fb = self.shared.forbidden.subscribe();
        let ok = tokio::select! {
            r = tokio::time::timeout(timeout, rx.wait_for(|r| *r)) => matches!(r, Ok(Ok(_))),
            f = fb.wait_for(|f| f.is_some()) => match f.ok().and_then(|f| f.clone()) {
                Some(f) => return Err(f.to_error(url, &self.namespace)),
                None => false,
            },
        };
        match ok {
            true => Ok(()),
            false => Err(Error::WatchNotReady {
                seconds: timeout.as_secs(),
                message: lock(&self.shared.last_error)
                    .clone()
                    .unwrap_or_else(|| "no error reported".into()),
            }),
        }
    }

    /// The [`WatchForbidden`] seen so far, if any.
    pub fn forbidden(&self) -> Option<WatchForbidden> {
        self.shared.forbidden.borrow().clone()
    }

    /// Resolves once the watch is [forbidden](WatchForbidden) (at once if it already
    /// is); pending forever otherwise. The gate races it against the run.
    pub async fn wait_forbidden(&self) -> WatchForbidden {
        let mut rx = self.shared.forbidden.subscribe();
        loop {
            if let Some(f) = rx.borrow_and_update().clone() {
                return f;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// The namespace watched.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The last watch error, if any.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.shared.last_error).clone()
    }

    /// The last watch error if it was trouble ([`is_watch_trouble`]) and happened at or
    /// after `since` (prober clock): the watch may have missed this pod's updates since
    /// then.
    pub fn trouble_since(&self, since: std::time::Instant) -> Option<String> {
        lock(&self.shared.trouble)
            .as_ref()
            .filter(|(at, _)| *at >= since)
            .map(|(_, msg)| msg.clone())
    }

    /// Runs `f` on the tracker (e.g. `note_created`, `forget`) and wakes waiters.
    pub fn with_tracker<R>(&self, f: impl FnOnce(&mut Tracker) -> R) -> R {
        let r = f(&mut lock(&self.shared.tracker));
        self.shared.generation.send_modify(|g| *g += 1);
        r
    }

    /// A copy of one pod's state.
    pub fn snapshot(&self, name: &str) -> Option<PodState> {
        lock(&self.shared.tracker).get(name).cloned()
    }

    /// Waits until `f(state)` returns `Some`, the `deadline` passes, or `cancel` turns
    /// true (or its sender is dropped). `f` sees `None` while the pod is not yet known;
    /// it runs on every change and at least every [`RECHECK_INTERVAL`].
    pub async fn wait_for<T>(
        &self,
        name: &str,
        deadline: Instant,
        cancel: &mut watch::Receiver<bool>,
        mut f: impl FnMut(Option<&PodState>) -> Option<T>,
    ) -> Wait<T> {
        // Subscribe before checking so no change between check and wait is lost.
        let mut gen = self.shared.generation.subscribe();
        loop {
            if let Some(v) = f(lock(&self.shared.tracker).get(name)) {
                return Wait::Done(v);
            }
            if *cancel.borrow() {
                return Wait::Cancelled;
            }
            tokio::select! {
                r = gen.changed() => {
                    if r.is_err() {
                        return Wait::Cancelled;
                    }
                }
                r = cancel.changed() => {
                    if r.is_err() {
                        return Wait::Cancelled;
                    }
                }
                _ = tokio::time::sleep(RECHECK_INTERVAL) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    // One last look: the change may have landed just now.
                    if let Some(v) = f(lock(&self.shared.tracker).get(name)) {
                        return Wait::Done(v);
                    }
                    return Wait::TimedOut;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn status(code: u16) -> Box<Status> {
        Box::new(Status::failure("x", "y").with_code(code))
    }

    fn pod(name: &str, uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(uid.into());
        p
    }

    #[test]
    fn a_relist_after_410_turns_a_missed_deletion_into_deleted() {
        let t0 = std::time::Instant::now();
        let mut t = Tracker::new();
        for ev in [
            Event::Init,
            Event::InitDone,
            Event::Apply(pod("a", "ua")),
            Event::Apply(pod("b", "ub")),
        ] {
            feed(&mut t, &ev, t0);
        }
        assert!(t.get("b").is_some_and(|s| s.deleted.is_none()));
        // 410 Gone → kube-runtime re-lists; b was deleted in between.
        let t1 = t0 + Duration::from_secs(3);
        feed(&mut t, &Event::Init, t1);
        feed(&mut t, &Event::InitApply(pod("a", "ua")), t1);
        assert!(
            t.get("b").is_some_and(|s| s.deleted.is_none()),
            "not before InitDone"
        );
        assert!(feed(&mut t, &Event::InitDone, t1));
        assert_eq!(t.get("b").and_then(|s| s.deleted), Some(t1));
        assert_eq!(t.get("a").and_then(|s| s.deleted), None);
    }

    #[test]
    fn every_watch_is_bounded_below_load_balancer_idle_cut_offs() {
        let c = watcher_config("firstpacket.io/instance=gate-x");
        assert_eq!(c.timeout, Some(WATCH_TIMEOUT_SECS));
        const { assert!(WATCH_TIMEOUT_SECS + 5 < 60) };
        assert_eq!(
            c.label_selector.as_deref(),
            Some("firstpacket.io/instance=gate-x")
        );
    }

    #[test]
    fn only_410_gone_is_not_watch_trouble() {
        assert!(!is_watch_trouble(&watcher::Error::WatchError(status(410))));
        assert!(is_watch_trouble(&watcher::Error::WatchError(status(500))));
        assert!(is_watch_trouble(&watcher::Error::NoResourceVersion));
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(status(code))
    }

    #[test]
    fn forbidden_watch_or_list_before_any_event_is_a_start_up_failure() {
        let f = forbidden(&watcher::Error::WatchStartFailed(api(403)), false).expect("403");
        assert_eq!((f.verb, f.code), ("watch", 403));
        let f = forbidden(&watcher::Error::InitialListFailed(api(401)), false).expect("401");
        assert_eq!((f.verb, f.code), ("list", 401));
        let f = forbidden(&watcher::Error::WatchError(status(403)), false).expect("event");
        assert_eq!(f.verb, "watch");
        let e = f
            .to_error("https://10.0.0.1:6443", "firstpacket")
            .to_string();
        assert!(
            e.contains("refused watch pods in namespace firstpacket"),
            "{e}"
        );
        assert!(e.contains("HTTP 403"), "{e}");
        assert!(e.contains("https://10.0.0.1:6443"), "{e}");
    }

    #[test]
    fn other_errors_and_403_after_the_watch_worked_are_not_start_up_failures() {
        assert!(forbidden(&watcher::Error::WatchStartFailed(api(403)), true).is_none());
        assert!(forbidden(&watcher::Error::WatchStartFailed(api(500)), false).is_none());
        assert!(forbidden(&watcher::Error::WatchError(status(410)), false).is_none());
        assert!(forbidden(&watcher::Error::NoResourceVersion, false).is_none());
    }
}
