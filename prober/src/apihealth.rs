//! API outages the prober lived through: one record per stretch of time in which the
//! Kubernetes API server did not answer, reported in the gate's `api_outages[]`
//! (docs/design.md §4), counted by `prober run`'s metrics, and told on stderr in **one
//! line per outage** instead of one raw error per watcher and retry.
//!
//! # What counts
//! Every request of the prober's main [`kube::Client`] passes through
//! [`ApiHealthLayer`] (a tower layer on kube's default stack, outside its retries), which
//! classifies the final result:
//! - **unanswered**: a transport error (connect refused, TLS closed, timeout, the
//!   connection reset mid-request) or HTTP 502/503/504 (a proxy or load balancer in
//!   front of a server that is down, or kube-apiserver still starting: its `/readyz`
//!   fails with 503 while its storage is not ready — Kubernetes' "API server health"
//!   docs) — an outage starts at the first such result;
//! - **answered**: any other HTTP response (200, 404, 403, 409, 410 …: the server is up
//!   and decided) — an ongoing outage ends at the first such result **to a request sent
//!   after the outage began**. An answer to a request sent earlier (in flight when the
//!   server went away, served just before its listener closed and read just after the
//!   first refusal) says nothing about the server now, and would split one outage in two.
//!
//! The start is the first failure seen, the end the first answer after it: both are
//! observations, so an outage is known to within the gap between the prober's requests
//! (its watches re-connect within about a second, its instance Lease renews every few
//! seconds). Watch *bodies* that break mid-stream are not seen
//! here; the watcher's reconnect is.
//!
//! # Bounds
//! At most [`MAX_OUTAGES`] outages are kept (the oldest dropped, counted in
//! [`ApiHealth::dropped`]); one ongoing outage at a time.

use k8s_openapi::jiff::Timestamp;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How many finished outages are kept for the report (older ones are dropped and
/// counted): a gate lives minutes; `prober run` exports counters, not the list.
pub const MAX_OUTAGES: usize = 100;

/// One outage: when the first unanswered request was seen and how long until the first
/// answer (`seconds` is `None` while it is ongoing).
#[derive(Debug, Clone, PartialEq)]
pub struct Outage {
    /// RFC 3339 wall time of the first unanswered request (prober clock; display only).
    pub start: String,
    /// Seconds from the first unanswered request to the first answer (monotonic clock).
    pub seconds: Option<f64>,
    /// The first failure, one line (e.g. `connection refused`, `HTTP 503`).
    pub first_error: String,
    /// Unanswered requests during the outage.
    pub failed_requests: u64,
}

#[derive(Debug)]
struct Ongoing {
    outage: Outage,
    since: Instant,
}

#[derive(Debug, Default)]
struct State {
    done: std::collections::VecDeque<Outage>,
    ongoing: Option<Ongoing>,
    dropped: u64,
    total: u64,
    total_seconds: f64,
    /// API server clock minus ours, seconds, from the last response's `Date` header.
    server_offset: Option<f64>,
}

/// What [`ApiHealth::observe`] changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// An outage began with this request.
    Started,
    /// This answer ended an outage (the finished record).
    Ended(Outage),
}

/// Who hears of each finished outage (and, at the end of a run, of one still going on:
/// the `bool`): the mode's stderr line, given by the mode, so this record stays free of
/// presentation.
#[derive(Clone)]
pub struct OutageSink(Arc<OutageFn>);

/// The sink's callback: `(outage, at_end)`.
type OutageFn = dyn Fn(&Outage, bool) + Send + Sync;

impl OutageSink {
    /// A sink calling `f(outage, at_end)`.
    pub fn new(f: impl Fn(&Outage, bool) + Send + Sync + 'static) -> Self {
        OutageSink(Arc::new(f))
    }
}

impl std::fmt::Debug for OutageSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutageSink")
    }
}

/// The shared outage record (cheap to clone: one `Arc`). Observers are the client layer
/// and tests; readers the gate report, the run loop's metrics and stderr.
#[derive(Debug, Clone, Default)]
pub struct ApiHealth {
    state: Arc<Mutex<State>>,
    /// Who hears of finished outages (`None`: nobody, e.g. `prober cleanup`).
    sink: Option<OutageSink>,
}

impl ApiHealth {
    /// A record that tells `sink` of each finished outage.
    pub fn new(sink: Option<OutageSink>) -> Self {
        ApiHealth {
            state: Arc::default(),
            sink,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the final result of one request sent at `sent`: `Err(message)`
    /// unanswered, `Ok(())` answered (an answer ends an ongoing outage only when `sent`
    /// is not before the outage's start: module docs). Returns the transition it caused,
    /// if any, after telling the sink of the outage a [`Transition::Ended`] finished.
    pub fn observe(&self, result: Result<(), String>, sent: Instant) -> Option<Transition> {
        let t = self.observe_at(result, sent, Instant::now());
        if let (Some(Transition::Ended(o)), Some(sink)) = (&t, &self.sink) {
            (sink.0)(o, false);
        }
        t
    }

    fn observe_at(
        &self,
        result: Result<(), String>,
        sent: Instant,
        now: Instant,
    ) -> Option<Transition> {
        let mut s = self.lock();
        match result {
            Err(message) => match &mut s.ongoing {
                Some(o) => {
                    o.outage.failed_requests += 1;
                    None
                }
                None => {
                    s.ongoing = Some(Ongoing {
                        outage: Outage {
                            start: Timestamp::now().to_string(),
                            seconds: None,
                            first_error: crate::agents::correlate::one_line(&message, 200),
                            failed_requests: 1,
                        },
                        since: now,
                    });
                    Some(Transition::Started)
                }
            },
            Ok(()) => {
                if s.ongoing.as_ref().is_some_and(|o| sent < o.since) {
                    return None;
                }
                let o = s.ongoing.take()?;
                let mut outage = o.outage;
                let secs = now.saturating_duration_since(o.since).as_secs_f64();
                outage.seconds = Some(secs);
                s.total += 1;
                s.total_seconds += secs;
                if s.done.len() >= MAX_OUTAGES {
                    s.done.pop_front();
                    s.dropped += 1;
                }
                s.done.push_back(outage.clone());
                Some(Transition::Ended(outage))
            }
        }
    }

    /// Every kept outage, oldest first, the ongoing one last (with `seconds` so far,
    /// flagged by [`ApiHealth::ongoing`]).
    pub fn outages(&self) -> Vec<Outage> {
        let s = self.lock();
        let mut v: Vec<Outage> = s.done.iter().cloned().collect();
        if let Some(o) = &s.ongoing {
            let mut cur = o.outage.clone();
            cur.seconds = Some(o.since.elapsed().as_secs_f64());
            v.push(cur);
        }
        v
    }

    /// Records the API server's `Date` header (RFC 9110 §6.6.1, IMF-fixdate, whole
    /// seconds) of a response received at local wall time `local`. Unparsable values
    /// are ignored.
    pub fn observe_date(&self, date: &str, local: Timestamp) {
        let Ok(server) =
            k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(date.trim())
        else {
            return;
        };
        // The header truncates to the second: its true value lies in [server, server+1).
        let offset = (server.as_millisecond() - local.as_millisecond()) as f64 / 1000.0 + 0.5;
        self.lock().server_offset = Some(offset);
    }

    /// The API server's clock minus the prober's, seconds (to within about a second: the
    /// `Date` header's resolution plus one request's latency), once a response carried
    /// a `Date` header.
    pub fn server_offset(&self) -> Option<f64> {
        self.lock().server_offset
    }

    /// The API server's "now": the prober's wall clock corrected by
    /// [`ApiHealth::server_offset`] (the prober's own clock when no `Date` was seen).
    /// Ages of API objects (their `creationTimestamp`, written by the API server's
    /// clock) are computed against this, so a prober whose clock is minutes off does
    /// not take a live pod for an old one.
    pub fn server_now(&self) -> Timestamp {
        let now = Timestamp::now();
        match self.server_offset() {
            Some(o) => now
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs_f64(o))
                .unwrap_or(now),
            None => now,
        }
    }

    /// Whether the API is unanswered right now (since the last observation).
    pub fn ongoing(&self) -> bool {
        self.lock().ongoing.is_some()
    }

    /// How long the current outage has lasted, if one is ongoing.
    pub fn ongoing_for(&self) -> Option<Duration> {
        self.lock().ongoing.as_ref().map(|o| o.since.elapsed())
    }

    /// Finished outages and their summed seconds, since the start (for counters).
    pub fn totals(&self) -> (u64, f64) {
        let s = self.lock();
        (s.total, s.total_seconds)
    }

    /// Finished outages dropped from [`ApiHealth::outages`] by the [`MAX_OUTAGES`] bound.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Kept records (the bounded structure's size, for the state-size export).
    pub fn len(&self) -> usize {
        let s = self.lock();
        s.done.len() + usize::from(s.ongoing.is_some())
    }

    /// No outage kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// At the end of a run: tells the sink of an outage still going on (the run ended
    /// before the API answered again).
    pub fn finish(&self) {
        let cur = {
            let s = self.lock();
            s.ongoing.as_ref().map(|o| {
                let mut cur = o.outage.clone();
                cur.seconds = Some(o.since.elapsed().as_secs_f64());
                cur
            })
        };
        if let (Some(o), Some(sink)) = (cur, &self.sink) {
            (sink.0)(&o, true);
        }
    }
}

/// How often [`spawn_recovery_pings`] asks the API server during an outage.
pub const RECOVERY_PING_INTERVAL: Duration = Duration::from_millis(500);

/// While an outage is ongoing, `GET /version` every [`RECOVERY_PING_INTERVAL`] through
/// `client` (whose layer records the answer), so the outage's end is seen within half a
/// second of the API server answering again rather than at the next watch retry (kube's
/// watcher backs off up to 30 s). Idle (no request) while the API answers. Stops when
/// the returned guard is dropped.
pub fn spawn_recovery_pings(client: kube::Client, health: ApiHealth) -> RecoveryPings {
    RecoveryPings(tokio::spawn(async move {
        loop {
            tokio::time::sleep(RECOVERY_PING_INTERVAL).await;
            if health.ongoing() {
                let _ =
                    tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await;
            }
        }
    }))
}

/// The task of [`spawn_recovery_pings`]; aborted on drop.
#[derive(Debug)]
pub struct RecoveryPings(tokio::task::JoinHandle<()>);

impl Drop for RecoveryPings {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether an HTTP status means "not answered" (module docs: 502, 503, 504).
pub fn unanswered_status(code: u16) -> bool {
    matches!(code, 502..=504)
}

/// Whether a kube error is one [`ApiHealthLayer`] counts as "not answered": no HTTP
/// response at all (`kube::Error::HyperError`, `kube::Error::Service`: refused,
/// reset, TLS closed, timed out) or an API status 502–504. [`ApiHealth`] reports such
/// errors once per outage, so the retrying watchers log them at debug instead of one
/// warning per watcher and attempt.
pub fn is_unanswered(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => unanswered_status(s.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// [`is_unanswered`] for a watcher's error (its list, watch start or watch stream).
pub fn watcher_unanswered(e: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error as W;
    match e {
        W::InitialListFailed(e) | W::WatchStartFailed(e) | W::WatchFailed(e) => is_unanswered(e),
        W::WatchError(s) => unanswered_status(s.code),
        _ => false,
    }
}

/// The tower layer that feeds [`ApiHealth`] from every request of a [`kube::Client`]
/// (`kube::client::ClientBuilder::with_layer`).
#[derive(Debug, Clone)]
pub struct ApiHealthLayer {
    health: ApiHealth,
}

impl ApiHealthLayer {
    pub fn new(health: ApiHealth) -> Self {
        ApiHealthLayer { health }
    }
}

impl<S> tower::Layer<S> for ApiHealthLayer {
    type Service = ApiHealthService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiHealthService {
            inner,
            health: self.health.clone(),
        }
    }
}

/// The service of [`ApiHealthLayer`].
#[derive(Debug, Clone)]
pub struct ApiHealthService<S> {
    inner: S,
    health: ApiHealth,
}

impl<S, Req, B> tower::Service<Req> for ApiHealthService<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: std::ops::Deref<Target = dyn std::error::Error + Send + Sync>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let sent = Instant::now();
        let fut = self.inner.call(req);
        let health = self.health.clone();
        Box::pin(async move {
            let r = fut.await;
            match &r {
                Ok(resp) if unanswered_status(resp.status().as_u16()) => {
                    health.observe(Err(format!("HTTP {}", resp.status())), sent);
                }
                Ok(resp) => {
                    if let Some(d) = resp
                        .headers()
                        .get(http::header::DATE)
                        .and_then(|v| v.to_str().ok())
                    {
                        health.observe_date(d, Timestamp::now());
                    }
                    health.observe(Ok(()), sent);
                }
                Err(e) => {
                    health.observe(Err(error_text(&**e)), sent);
                }
            }
            r
        })
    }
}

/// The innermost cause of a transport error (what an operator recognises:
/// `Connection refused (os error 111)`, `peer closed connection without sending TLS
/// close_notify`), not the wrapper's generic text.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(s) = cur.source() {
        cur = s;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_outage_from_first_failure_to_first_answer() {
        let h = ApiHealth::new(None);
        let t0 = Instant::now();
        assert_eq!(
            h.observe_at(Ok(()), t0, t0),
            None,
            "answers alone are no outage"
        );
        assert_eq!(
            h.observe_at(Err("connection refused".into()), t0, t0),
            Some(Transition::Started)
        );
        assert!(h.ongoing());
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(h.observe_at(Err("connection refused".into()), t1, t1), None);
        let t = t0 + Duration::from_millis(4500);
        let Some(Transition::Ended(o)) = h.observe_at(Ok(()), t, t) else {
            panic!("the first answer ends the outage")
        };
        assert!((o.seconds.unwrap() - 4.5).abs() < 1e-9);
        assert_eq!(o.failed_requests, 2);
        assert_eq!(o.first_error, "connection refused");
        assert!(!h.ongoing());
        assert_eq!(h.outages(), vec![o]);
        assert_eq!(h.totals().0, 1);
    }

    /// A CI run saw one 3.2 s API stop reported as two outages: a request in flight when
    /// the listener closed was answered 0.2 ms after the first refusal and "ended" it.
    #[test]
    fn an_answer_to_a_request_sent_before_the_outage_does_not_end_it() {
        let h = ApiHealth::new(None);
        let sent_before = Instant::now();
        let t0 = sent_before + Duration::from_millis(300);
        h.observe_at(Err("connection refused".into()), t0, t0);
        let read = t0 + Duration::from_micros(200);
        assert_eq!(h.observe_at(Ok(()), sent_before, read), None);
        assert!(h.ongoing(), "still down: that answer was from before");
        let t = t0 + Duration::from_millis(3200);
        let Some(Transition::Ended(o)) = h.observe_at(Ok(()), t0, t) else {
            panic!("an answer to a request sent at the outage's start ends it")
        };
        assert!((o.seconds.unwrap() - 3.2).abs() < 1e-9);
        assert_eq!(h.outages().len(), 1);
    }

    #[test]
    fn kept_outages_are_bounded_and_the_dropped_counted() {
        let h = ApiHealth::new(None);
        let t = Instant::now();
        for _ in 0..MAX_OUTAGES + 7 {
            h.observe_at(Err("x".into()), t, t);
            h.observe_at(Ok(()), t, t);
        }
        assert_eq!(h.len(), MAX_OUTAGES);
        assert_eq!(h.dropped(), 7);
        assert_eq!(h.totals().0, (MAX_OUTAGES + 7) as u64);
    }

    #[test]
    fn server_clock_from_the_date_header() {
        let h = ApiHealth::new(None);
        assert_eq!(h.server_offset(), None);
        let local: Timestamp = "2026-12-02T08:00:00Z".parse().unwrap();
        // Server 5 minutes behind the prober.
        h.observe_date("Wed, 02 Dec 2026 07:55:00 GMT", local);
        let o = h.server_offset().unwrap();
        assert!((o - (-299.5)).abs() < 1e-9, "{o}");
        let d = Timestamp::now().as_second() - h.server_now().as_second();
        assert!((299..=300).contains(&d), "{d}");
        h.observe_date("not a date", local);
        assert_eq!(h.server_offset(), Some(o), "garbage is ignored");
    }

    #[test]
    fn gateway_statuses_are_unanswered_others_answered() {
        assert!(unanswered_status(503) && unanswered_status(502) && unanswered_status(504));
        for c in [200, 201, 403, 404, 409, 410, 429, 500] {
            assert!(!unanswered_status(c), "{c}");
        }
    }
}
