//! The one shared, label-selected pod watch of a prober instance (STYLE.md: one watcher
//! for all probe pods; watches independent of node count, DESIGN §7).
//!
//! A background task runs `kube::runtime::watcher` on Pods in the namespace with
//! `firstpacket.io/instance=<id>` and feeds every event into the pure
//! [`Tracker`](crate::tracker::Tracker), stamping it with the prober clock. Probes wait
//! on a `tokio::sync::watch` generation counter with [`PodWatch::wait_for`], always with
//! a deadline.
//!
//! Watch trouble (list/watch failing: connection refused, 5xx, 403, timeouts — anything
//! but a `410 Gone`, which is the API server's normal "resourceVersion too old" and is
//! followed by a re-list) is stamped, so a probe whose wait ran out while the watch was
//! failing knows its view is incomplete ([`PodWatch::trouble_since`]) and ends as
//! `inconclusive`/`api_error` instead of blaming the pods.

use crate::error::{watcher_error_text, Error};
use crate::tracker::{PodState, Tracker};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::sync::{Arc, Mutex, MutexGuard};
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

struct Shared {
    tracker: Mutex<Tracker>,
    generation: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    last_error: Mutex<Option<String>>,
    /// Prober-clock time and text of the last watch error that is trouble
    /// ([`is_watch_trouble`]).
    trouble: Mutex<Option<(std::time::Instant, String)>>,
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

/// Handle on the running pod watch. Dropping it stops the watch task.
pub struct PodWatch {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep using it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PodWatch {
    /// Starts watching `api` (namespaced Pods) with `label_selector`.
    pub fn start(api: Api<Pod>, label_selector: &str) -> Self {
        let (generation, _) = watch::channel(0u64);
        let (ready, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            tracker: Mutex::new(Tracker::new()),
            generation,
            ready,
            last_error: Mutex::new(None),
            trouble: Mutex::new(None),
        });
        let cfg = watcher::Config::default().labels(label_selector);
        let s = shared.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                let now = std::time::Instant::now();
                let changed = match ev {
                    Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => {
                        lock(&s.tracker).apply(&p, now)
                    }
                    Ok(Event::Delete(p)) => lock(&s.tracker).delete(&p, now),
                    Ok(Event::Init) => false,
                    Ok(Event::InitDone) => {
                        s.ready.send_replace(true);
                        true
                    }
                    Err(e) => {
                        let msg = watcher_error_text(&e);
                        tracing::warn!(error = %msg, "pod watch error (retrying with backoff)");
                        if is_watch_trouble(&e) {
                            *lock(&s.trouble) = Some((now, msg.clone()));
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
        PodWatch { shared, task }
    }

    /// Waits until the watch delivered its initial list (so no event can be missed and
    /// API errors surface early). Errors after `timeout` with the last watch error.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let mut rx = self.shared.ready.subscribe();
        let ok = matches!(
            tokio::time::timeout(timeout, rx.wait_for(|r| *r)).await,
            Ok(Ok(_))
        );
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

    #[test]
    fn only_410_gone_is_not_watch_trouble() {
        assert!(!is_watch_trouble(&watcher::Error::WatchError(status(410))));
        assert!(is_watch_trouble(&watcher::Error::WatchError(status(500))));
        assert!(is_watch_trouble(&watcher::Error::NoResourceVersion));
    }
}
