//! Felix-compatible `/metrics` for the simulated agent (docs/design.md §3 "calico-felix"
//! profile, §5 "Agents"; issue 3).
//!
//! The page is Prometheus text format 0.0.4 with `# HELP`/`# TYPE` lines; names, HELP
//! texts and shapes are those of a real Felix 3.20 page
//! (`prober/tests/fixtures/felix-3.20-1.prom`). Every value comes from what the simulated
//! [`Agent`] really did ([`FelixMetrics`] is fed by it):
//!
//! | family | type | fed by |
//! |---|---|---|
//! | `felix_int_dataplane_apply_time_seconds` | summary | every dataplane apply of the agent (endpoint programmed/removed/revoked, NetworkPolicy applies, apply-loop iterations under `resync_loop`, `agent.route_resync` resyncs), including `queue` and `apply_time_floor` time |
//! | `felix_int_dataplane_msg_batch_size` | summary | endpoint updates handled per apply (1 each), or the pods whose NetworkPolicy rules one policy apply rewrote |
//! | `felix_int_dataplane_failures` | counter | failed applies + fault `agent.extra_failures_per_second` |
//! | `felix_resyncs_started` | counter | 1 at (re)start + fault `agent.extra_resyncs_per_second` + 1 per `agent.datastore_resync` episode |
//! | `felix_resync_state` | gauge | 3 (in sync, the value of the fixture); 2 (resync in progress) during an `agent.datastore_resync` episode (felix/calc/async_calc_graph.go: WaitForDatastore 1, ResyncInProgress 2, InSync 3) |
//! | `felix_route_table_list_seconds` | summary | timed `ip -o link show` of the node at (re)start and every 90 s, and every `agent.route_resync.every` padded to at least `takes` (felix/routetable/route_table.go observes the interface listing of each resync) |
//! | `felix_route_table_per_iface_sync_seconds` | summary | timed per-`cali*` route read in the same resync |
//! | `felix_iptables_restore_errors` | counter | failed `nft` transactions (our iptables-restore) |
//! | `felix_active_local_endpoints` | gauge | local endpoints the agent knows (added, not removed) |
//! | `process_start_time_seconds` | gauge | the agent's (re)start, Unix seconds |
//!
//! A simulated restart (fault `agent.restarts`) starts every counter and summary from
//! zero and moves `process_start_time_seconds`, as a restarted Felix process does.
//!
//! Summaries are [`SlidingSummary`]: client_golang's `prometheus.Summary` defaults
//! (objectives 0.5/0.9/0.99, `MaxAge` 10 min, `AgeBuckets` 5; client_golang
//! prometheus/summary.go), so quantiles cover the last 8–10 minutes while `_sum` and
//! `_count` are cumulative; an empty window gives `NaN`.

use crate::agent::Agent;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Felix's default Prometheus port (`PrometheusMetricsPort`, Calico Felix
/// configuration reference).
pub const FELIX_METRICS_PORT: u16 = 9091;

/// client_golang `DefMaxAge` (prometheus/summary.go).
pub const MAX_AGE: Duration = Duration::from_secs(600);

/// client_golang `DefAgeBuckets` (prometheus/summary.go).
pub const AGE_BUCKETS: usize = 5;

/// Quantiles Felix's summaries export (client_golang's default objectives as Felix
/// sets them: 0.5, 0.9, 0.99).
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// Values kept per age bucket at most (a bound on memory; at one apply per 10 ms for
/// 10 min this is never reached by the testbed).
const MAX_VALUES_PER_BUCKET: usize = 100_000;

/// Interval of the agent's route-table resync (Felix `RouteRefreshInterval` default
/// 90 s, Calico Felix configuration reference).
pub const ROUTE_REFRESH_INTERVAL: Duration = Duration::from_secs(90);

/// A summary with client_golang's sliding-window semantics: [`AGE_BUCKETS`] streams,
/// every observation goes into all of them, quantiles are read from the head stream,
/// and every `MAX_AGE / AGE_BUCKETS` the head stream is emptied and the next one
/// becomes head (`maybeRotateStreams` in prometheus/summary.go). Quantiles are exact
/// nearest-rank over the head stream (client_golang's CKMS stream is an approximation of
/// the same rank with ε 0.05/0.01/0.001). `_sum`/`_count` never slide.
#[derive(Debug, Clone)]
pub struct SlidingSummary {
    streams: Vec<Vec<f64>>,
    head: usize,
    head_expires: Instant,
    stream_duration: Duration,
    sum: f64,
    count: u64,
}

impl SlidingSummary {
    /// An empty summary created at `now` with client_golang's defaults.
    pub fn new(now: Instant) -> SlidingSummary {
        SlidingSummary::with_window(now, MAX_AGE, AGE_BUCKETS)
    }

    /// An empty summary with `max_age` split into `age_buckets` (≥ 1) streams.
    pub fn with_window(now: Instant, max_age: Duration, age_buckets: usize) -> SlidingSummary {
        let age_buckets = age_buckets.max(1);
        let stream_duration = max_age / age_buckets as u32;
        SlidingSummary {
            streams: vec![Vec::new(); age_buckets],
            head: 0,
            head_expires: now + stream_duration,
            stream_duration,
            sum: 0.0,
            count: 0,
        }
    }

    fn rotate(&mut self, now: Instant) {
        while now >= self.head_expires {
            self.streams[self.head].clear();
            self.head = (self.head + 1) % self.streams.len();
            self.head_expires += self.stream_duration;
        }
    }

    /// Records `v` at `now`.
    pub fn observe(&mut self, v: f64, now: Instant) {
        self.rotate(now);
        for s in &mut self.streams {
            if s.len() < MAX_VALUES_PER_BUCKET {
                s.push(v);
            }
        }
        self.sum += v;
        self.count += 1;
    }

    /// The `q`-quantile (0–1) of the window at `now`: the nearest-rank value
    /// (`ceil(q·n)`-th smallest), `NaN` when the window is empty.
    pub fn quantile(&mut self, q: f64, now: Instant) -> f64 {
        self.rotate(now);
        let s = &self.streams[self.head];
        if s.is_empty() {
            return f64::NAN;
        }
        let mut v = s.clone();
        v.sort_by(f64::total_cmp);
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    }

    /// Sum of every value observed since creation.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of values observed since creation.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// What one simulated Felix process has counted since it (re)started. Owned by the
/// [`Agent`]; read by [`render`].
#[derive(Debug, Clone)]
pub struct FelixMetrics {
    /// Wall-clock (re)start, Unix seconds.
    pub start_time_unix: f64,
    /// Seconds per dataplane apply.
    pub apply_time: SlidingSummary,
    /// Endpoint updates per apply.
    pub msg_batch_size: SlidingSummary,
    /// Seconds per route-table interface listing.
    pub route_table_list: SlidingSummary,
    /// Seconds per interface route sync.
    pub route_table_per_iface_sync: SlidingSummary,
    /// `felix_int_dataplane_failures`.
    pub failures: u64,
    /// `felix_resyncs_started`.
    pub resyncs_started: u64,
    /// `felix_resync_state` (3 = in sync, as in the fixture).
    pub resync_state: f64,
    /// `felix_iptables_restore_errors`.
    pub iptables_restore_errors: u64,
}

impl FelixMetrics {
    /// A freshly started process at `now` / `start_time_unix`: one resync started,
    /// in sync, everything else zero/empty.
    pub fn new(now: Instant, start_time_unix: f64) -> FelixMetrics {
        FelixMetrics {
            start_time_unix,
            apply_time: SlidingSummary::new(now),
            msg_batch_size: SlidingSummary::new(now),
            route_table_list: SlidingSummary::new(now),
            route_table_per_iface_sync: SlidingSummary::new(now),
            failures: 0,
            resyncs_started: 1,
            resync_state: 3.0,
            iptables_restore_errors: 0,
        }
    }

    /// Records one dataplane apply: its duration, how many endpoint updates it carried
    /// (`None` for an apply without messages, e.g. an apply-loop retry) and whether it
    /// failed (a failure counts in `felix_int_dataplane_failures` and
    /// `felix_iptables_restore_errors`).
    pub fn record_apply(&mut self, took: Duration, batch: Option<usize>, ok: bool, now: Instant) {
        self.apply_time.observe(took.as_secs_f64(), now);
        if let Some(b) = batch {
            self.msg_batch_size.observe(b as f64, now);
        }
        if !ok {
            self.failures += 1;
            self.iptables_restore_errors += 1;
        }
    }
}

pub(crate) fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        format!("{v}")
    }
}

pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn summary(out: &mut String, name: &str, help: &str, s: &mut SlidingSummary, now: Instant) {
    header(out, name, help, "summary");
    for q in QUANTILES {
        let _ = writeln!(
            out,
            "{name}{{quantile=\"{q}\"}} {}",
            fmt_value(s.quantile(q, now))
        );
    }
    let _ = writeln!(out, "{name}_sum {}", fmt_value(s.sum()));
    let _ = writeln!(out, "{name}_count {}", s.count());
}

/// Renders the page (text format 0.0.4) for `m` at `now`, families in name order as
/// client_golang writes them. `active_local_endpoints` is the gauge's value.
pub fn render(m: &mut FelixMetrics, active_local_endpoints: u64, now: Instant) -> String {
    let mut out = String::with_capacity(4096);
    header(
        &mut out,
        "felix_active_local_endpoints",
        "Number of active endpoints on this host.",
        "gauge",
    );
    let _ = writeln!(out, "felix_active_local_endpoints {active_local_endpoints}");
    summary(
        &mut out,
        "felix_int_dataplane_apply_time_seconds",
        "Time in seconds that it took to apply a dataplane update.",
        &mut m.apply_time,
        now,
    );
    header(
        &mut out,
        "felix_int_dataplane_failures",
        "Number of times dataplane updates failed and will be retried.",
        "counter",
    );
    let _ = writeln!(out, "felix_int_dataplane_failures {}", m.failures);
    summary(
        &mut out,
        "felix_int_dataplane_msg_batch_size",
        "Number of messages processed in each batch. Higher values indicate we're doing more batching to try to keep up.",
        &mut m.msg_batch_size,
        now,
    );
    header(
        &mut out,
        "felix_iptables_restore_errors",
        "Number of iptables-restore errors.",
        "counter",
    );
    let _ = writeln!(
        out,
        "felix_iptables_restore_errors {}",
        m.iptables_restore_errors
    );
    header(
        &mut out,
        "felix_resync_state",
        "Current datastore state.",
        "gauge",
    );
    let _ = writeln!(out, "felix_resync_state {}", fmt_value(m.resync_state));
    // Felix 3.20's HELP text for this counter really is "Current datastore state."
    // (fixture felix-3.20-1.prom).
    header(
        &mut out,
        "felix_resyncs_started",
        "Current datastore state.",
        "counter",
    );
    let _ = writeln!(out, "felix_resyncs_started {}", m.resyncs_started);
    summary(
        &mut out,
        "felix_route_table_list_seconds",
        "Time taken to list all the interfaces during a resync.",
        &mut m.route_table_list,
        now,
    );
    summary(
        &mut out,
        "felix_route_table_per_iface_sync_seconds",
        "Time taken to sync each interface",
        &mut m.route_table_per_iface_sync,
        now,
    );
    header(
        &mut out,
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "gauge",
    );
    let _ = writeln!(
        out,
        "process_start_time_seconds {}",
        fmt_value(m.start_time_unix)
    );
    out
}

/// The agent's page now (see [`render`]).
pub fn render_agent(agent: &Agent) -> String {
    agent.felix_page()
}

/// Content type of the page (Prometheus text exposition format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `GET /metrics` (and `GET /`, which Felix also answers with the same page)
/// for `agent` on `listener` until the task is dropped. Run it on the node's
/// [`NetnsThread`](crate::netns::NetnsThread) with a listener bound there (e.g. by
/// [`bind_and_serve`]). Errors: the accept loop's I/O error.
pub async fn serve_metrics(
    agent: Arc<Agent>,
    listener: tokio::net::TcpListener,
) -> std::io::Result<()> {
    use axum::routing::get;
    let page = move || {
        let agent = agent.clone();
        async move {
            (
                [(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)],
                render_agent(&agent),
            )
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(page.clone()))
        .route("/", get(page));
    axum::serve(listener, app).await
}

/// Binds `<node IP>:9091` ([`FELIX_METRICS_PORT`]) and serves the agent's page there.
/// Must run on the node's `NetnsThread` runtime (that is where the node IP exists).
/// Errors: bind failure (e.g. not in the node netns), accept-loop I/O error.
pub async fn bind_and_serve(agent: Arc<Agent>) -> std::io::Result<()> {
    let addr = SocketAddr::from((agent.node().ip, FELIX_METRICS_PORT));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_metrics(agent, listener).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_summary_reports_nan_quantiles_and_zero_count() {
        let now = Instant::now();
        let mut m = FelixMetrics::new(now, 1.7e9);
        let page = render(&mut m, 0, now);
        assert!(page.contains("felix_int_dataplane_apply_time_seconds{quantile=\"0.99\"} NaN"));
        assert!(page.contains("felix_int_dataplane_apply_time_seconds_count 0"));
        assert!(page.contains("felix_resyncs_started 1"));
        assert!(page.contains("# TYPE felix_int_dataplane_failures counter"));
    }

    #[test]
    fn quantiles_are_nearest_rank_over_the_window() {
        let t0 = Instant::now();
        let mut s = SlidingSummary::new(t0);
        for i in 1..=100 {
            s.observe(i as f64, t0);
        }
        assert_eq!(s.quantile(0.5, t0), 50.0);
        assert_eq!(s.quantile(0.9, t0), 90.0);
        assert_eq!(s.quantile(0.99, t0), 99.0);
        assert_eq!(s.count(), 100);
        assert_eq!(s.sum(), 5050.0);
    }

    #[test]
    fn window_slides_like_client_golang_age_buckets() {
        let t0 = Instant::now();
        let mut s = SlidingSummary::new(t0);
        s.observe(5.0, t0);
        // Still there after 9 min 59 s (head stream has everything since start until
        // the first full rotation cycle).
        assert_eq!(s.quantile(0.5, t0 + Duration::from_secs(599)), 5.0);
        // Gone once 10 min have passed: every stream that saw it has been reset.
        assert!(s.quantile(0.5, t0 + Duration::from_secs(600)).is_nan());
        // _sum/_count do not slide.
        assert_eq!((s.sum(), s.count()), (5.0, 1));
        // A value observed at 3 min survives at least 8 min, at most 10 min.
        let t3 = t0 + Duration::from_secs(180);
        let mut s = SlidingSummary::new(t0);
        s.observe(7.0, t3);
        assert_eq!(s.quantile(0.5, t3 + Duration::from_secs(8 * 60)), 7.0);
        assert!(s.quantile(0.5, t3 + Duration::from_secs(10 * 60)).is_nan());
    }

    #[test]
    fn failed_apply_counts_in_failures_and_restore_errors() {
        let now = Instant::now();
        let mut m = FelixMetrics::new(now, 0.0);
        m.record_apply(Duration::from_millis(3), Some(1), true, now);
        m.record_apply(Duration::from_millis(5), Some(1), false, now);
        m.record_apply(Duration::from_secs(1), None, true, now);
        assert_eq!((m.failures, m.iptables_restore_errors), (1, 1));
        assert_eq!(m.apply_time.count(), 3);
        assert_eq!(m.msg_batch_size.count(), 2);
        let page = render(&mut m, 2, now);
        assert!(page.contains("felix_int_dataplane_apply_time_seconds{quantile=\"0.99\"} 1\n"));
        assert!(page.contains("felix_active_local_endpoints 2\n"));
    }
}
