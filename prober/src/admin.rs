//! The admin HTTP server of `prober run` (docs/design.md §6 "Continuous mode admin server"):
//!
//! - `GET /metrics`: Prometheus text exposition ([`crate::metrics`]);
//! - `GET /livez`: `200 ok` while the process serves;
//! - `GET /readyz`: `200 ready` once the pod watch delivered its initial list (even if
//!   empty), `503 starting` before;
//! - `GET /api/v1/probes`: JSON [`ProbesPage`]: the recent probe records (the gate
//!   report's record shape, oldest first, at most [`RECENT_CAPACITY`]) and the running
//!   `total` of probes recorded since start, read under the same lock as the metrics
//!   update, so a scrape can be compared with it;
//! - `GET /`: the status page, self-contained HTML (no external assets, no scripts):
//!   wall-clock times and ages, the lap (measured, planned, what the probes allow, a
//!   warning when `--probe-interval` cannot be met), TTFP and programming wait over time
//!   (inline SVG with a UTC axis and a legend), the node-pair matrix of latest results
//!   with stale cells marked, the latest and the slow/failed probes ([`status`],
//!   [`status::render_status`]); with `--leader-elect`, this replica's role and the
//!   leader's identity, term start and Lease (`info.leadership` in `/api/v1/probes`
//!   too);
//! - `GET /debug`: the internals (sizes of the bounded structures, the ring)
//!   ([`status::render_debug`]).
//!
//! A standby (`firstpacket_leader` 0) serves all of them; its `/metrics` carries only
//! [`crate::metrics::STANDBY_FAMILIES`].

pub mod status;

pub use status::render_status;

use crate::metrics::Metrics;
use crate::sync::lock;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use firstpacket_report::ProbeRecord;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Probe records kept for `/api/v1/probes` and the status page (bounded ring).
pub const RECENT_CAPACITY: usize = 500;

/// The recent records and the running total.
#[derive(Debug, Default)]
pub struct Recent {
    /// Oldest first, at most [`RECENT_CAPACITY`].
    pub records: VecDeque<ProbeRecord>,
    /// Probes recorded since start (also those dropped from the ring).
    pub total: u64,
    /// Unix wall time each kept record finished (parallel to `records`).
    pub finished_at: VecDeque<f64>,
}

/// What the status page and `/api/v1/probes` show besides the records.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunInfo {
    /// The prober instance id.
    pub instance: String,
    /// Eligible nodes now, sorted.
    pub eligible_nodes: Vec<String>,
    /// Nodes skipped now, with the reason.
    pub skipped_nodes: Vec<(String, String)>,
    /// Duration of the last complete lap, seconds.
    pub lap_seconds: Option<f64>,
    /// Eligible nodes × `--probe-interval`, seconds.
    pub lap_expected_seconds: Option<f64>,
    /// The lap in progress (1-based).
    pub lap: u64,
    /// `--probe-interval`, seconds.
    pub probe_interval_seconds: f64,
    /// `--concurrency`.
    pub concurrency: u32,
    /// `--slow-threshold`, seconds.
    pub slow_threshold_seconds: f64,
    /// Sizes of the bounded in-memory structures.
    pub state_entries: BTreeMap<String, u64>,
    /// Leader election (`enabled` false without `--leader-elect`): whether this replica
    /// leads, and who holds the Lease ([`crate::leader::Leadership`]).
    pub leadership: crate::leader::Leadership,
    /// Baseline and drift per kind ([`crate::baseline`]), as the gauges show them.
    pub drift: BTreeMap<String, crate::baseline::DriftStatus>,
    /// Baseline and drift per node.
    pub node_drift: BTreeMap<String, crate::baseline::DriftStatus>,
}

/// Everything the admin server reads.
pub struct AdminState {
    /// The metrics.
    pub metrics: Metrics,
    /// Recent records; the lock also covers their metrics update.
    pub recent: Mutex<Recent>,
    /// Set once the pod watch's initial list is done.
    pub ready: AtomicBool,
    /// Run facts for the page.
    pub info: Mutex<RunInfo>,
    /// The learned baseline (`prober run`; `None` in tests that do not need it). Lock
    /// order: `recent`, then this.
    pub baselines: Mutex<Option<crate::baseline::Baselines>>,
}

impl AdminState {
    /// A fresh state over `metrics`.
    pub fn new(metrics: Metrics, info: RunInfo) -> AdminState {
        AdminState {
            metrics,
            recent: Mutex::new(Recent::default()),
            ready: AtomicBool::new(false),
            info: Mutex::new(info),
            baselines: Mutex::new(None),
        }
    }

    /// Brings the baseline and drift gauges and the page's drift facts up to `now`
    /// (Unix seconds): the windows slide with time, not only with probes.
    pub fn sync_drift(&self, now_unix: f64) {
        let _r = lock(&self.recent);
        self.sync_drift_locked(now_unix);
    }

    fn sync_drift_locked(&self, now_unix: f64) {
        let (kinds, nodes) = match lock(&self.baselines).as_ref() {
            Some(b) => (b.kinds(now_unix), b.nodes(now_unix)),
            None => return,
        };
        self.metrics.set_drift(&kinds, &nodes);
        let mut info = lock(&self.info);
        info.drift = kinds;
        info.node_drift = nodes;
    }

    /// Records a finished probe: metrics and the ring under one lock (module docs).
    /// Returns the new running total.
    pub fn record(&self, mut rec: ProbeRecord, now_unix: f64) -> u64 {
        let mut r = lock(&self.recent);
        let mark = lock(&self.baselines)
            .as_mut()
            .map(|b| b.observe(&rec, now_unix));
        if mark.is_some() {
            rec.drift = mark;
            self.sync_drift_locked(now_unix);
        }
        self.metrics.observe(&rec, now_unix);
        r.total += 1;
        r.records.push_back(rec);
        r.finished_at.push_back(now_unix);
        while r.records.len() > RECENT_CAPACITY {
            r.records.pop_front();
            r.finished_at.pop_front();
        }
        r.total
    }

    /// Records held (≤ [`RECENT_CAPACITY`]).
    pub fn recent_len(&self) -> usize {
        lock(&self.recent).records.len()
    }

    /// The `/api/v1/probes` body.
    pub fn probes_page(&self) -> ProbesPage {
        let r = lock(&self.recent);
        ProbesPage {
            schema: 1,
            total: r.total,
            capacity: RECENT_CAPACITY,
            info: lock(&self.info).clone(),
            probes: r.records.iter().cloned().collect(),
        }
    }
}

/// `GET /api/v1/probes`.
#[derive(Debug, Serialize)]
pub struct ProbesPage {
    /// Schema version of this page (1).
    pub schema: u32,
    /// Probes recorded since start.
    pub total: u64,
    /// Ring capacity ([`RECENT_CAPACITY`]).
    pub capacity: usize,
    /// Run facts.
    pub info: RunInfo,
    /// Recent records, oldest first.
    pub probes: Vec<ProbeRecord>,
}

/// The admin router over `state`.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/probes", get(probes))
        .route("/", get(status_page))
        .route("/debug", get(debug_page))
        .with_state(state)
}

async fn metrics(State(s): State<Arc<AdminState>>) -> Response {
    // The record lock: no probe is half-counted while the text is gathered.
    let body = {
        let _r = lock(&s.recent);
        s.metrics.render()
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn readyz(State(s): State<Arc<AdminState>>) -> Response {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: pod watch not synced\n",
        )
            .into_response()
    }
}

async fn probes(State(s): State<Arc<AdminState>>) -> Response {
    axum::Json(s.probes_page()).into_response()
}

/// Wall time now, Unix seconds (the page's "now"; records are stamped on the same clock).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn status_page(State(s): State<Arc<AdminState>>) -> Html<String> {
    let (records, finished, total) = {
        let r = lock(&s.recent);
        (
            r.records.iter().cloned().collect::<Vec<_>>(),
            r.finished_at.iter().copied().collect::<Vec<_>>(),
            r.total,
        )
    };
    let info = lock(&s.info).clone();
    Html(status::render_status(
        &records,
        &finished,
        total,
        &info,
        unix_now(),
    ))
}

async fn debug_page(State(s): State<Arc<AdminState>>) -> Html<String> {
    let (held, total) = {
        let r = lock(&s.recent);
        (r.records.len(), r.total)
    };
    let info = lock(&s.info).clone();
    Html(status::render_debug(held, total, &info, unix_now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::ProbeKind;
    use firstpacket_report::ProbeResult;

    fn rec(id: usize, src: &str, dst: &str, ttfp: Option<f64>, result: ProbeResult) -> ProbeRecord {
        let mut r = crate::record::test_record(&format!("x-{id}"), src, dst, result);
        r.ttfp_seconds = ttfp;
        r.reason = None;
        r
    }

    fn metric(text: &str, prefix: &str) -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    #[test]
    fn a_standby_serves_only_the_allow_listed_families_and_its_page_names_the_leader() {
        let s = AdminState::new(Metrics::new(&[ProbeKind::CrossNode]), RunInfo::default());
        s.record(rec(1, "a", "b", Some(0.2), ProbeResult::Success), 1.0);
        let leading = s.metrics.render();
        assert!(leading.contains("firstpacket_leader 1"), "{leading}");
        assert!(leading.contains("firstpacket_probes_total{"));
        s.metrics.leader.set(0);
        let standby = s.metrics.render();
        assert!(standby.contains("firstpacket_leader 0"), "{standby}");
        for l in standby.lines().filter(|l| !l.starts_with('#')) {
            let family = l.split(['{', ' ']).next().unwrap_or("");
            assert!(
                crate::metrics::STANDBY_FAMILIES.contains(&family),
                "standby line {l}"
            );
        }
        let info = RunInfo {
            leadership: crate::leader::Leadership {
                enabled: true,
                lease: "firstpacket/firstpacket-leader".into(),
                identity: "host_run-b".into(),
                leading: false,
                holder: Some("host_run-a".into()),
                holder_since: Some("2026-01-02T03:04:05Z".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let html = render_status(&[], &[], 0, &info, 0.0);
        assert!(html.contains("id=\"leader\">host_run-a<"), "{html}");
        assert!(html.contains("id=\"role\">standby<"), "{html}");
        assert!(html.contains("2026-01-02T03:04:05Z"));
        // Without --leader-elect the page says nothing of an election.
        let html = render_status(&[], &[], 0, &RunInfo::default(), 0.0);
        assert!(!html.contains("id=\"leadership\""));
    }

    #[test]
    fn ring_is_bounded_and_metrics_count_every_record() {
        let s = AdminState::new(Metrics::new(&[ProbeKind::CrossNode]), RunInfo::default());
        let n = RECENT_CAPACITY + 10;
        for i in 0..n {
            let ttfp = (i % 3 != 0).then_some(0.25);
            let result = if ttfp.is_some() {
                ProbeResult::Success
            } else {
                ProbeResult::Failed
            };
            assert_eq!(
                s.record(rec(i, "a", "b", ttfp, result), i as f64),
                i as u64 + 1
            );
        }
        let page = s.probes_page();
        assert_eq!(page.total, n as u64);
        assert_eq!(page.probes.len(), RECENT_CAPACITY);
        assert_eq!(page.probes[0].id, "x-10", "oldest dropped first");
        let text = s.metrics.render();
        let with_ttfp = (0..n).filter(|i| i % 3 != 0).count() as f64;
        assert_eq!(
            metric(&text, "firstpacket_ttfp_seconds_count{kind=\"cross_node\"}"),
            with_ttfp
        );
        assert_eq!(metric(&text, "firstpacket_probes_total{"), n as f64);
        assert_eq!(
            metric(
                &text,
                "firstpacket_node_probes_total{node=\"a\",result=\"failed\",role=\"source\"}"
            ),
            (n as f64 - with_ttfp)
        );
        // Pre-initialised before any event: a reason never seen has a 0 series.
        assert!(text.contains("reason=\"wrong_peer\""), "{text}");
        // No pod names or pair labels.
        assert!(!text.contains("fp-x-"));
        s.metrics.node_removed("a");
        assert!(!s.metrics.render().contains("node=\"a\""));
    }

    fn drift_cfg() -> crate::baseline::DriftConfig {
        crate::baseline::DriftConfig {
            baseline_window: std::time::Duration::from_secs(3600),
            recent_window: std::time::Duration::from_secs(10),
            min_samples: 3,
            ratio: 1.5,
            floor: 0.5,
            dial_interval: 0.1,
            static_baseline: None,
        }
    }

    #[test]
    fn drift_series_exist_from_the_start_follow_the_records_and_stay_off_a_standby() {
        let s = AdminState::new(Metrics::new(&[ProbeKind::CrossNode]), RunInfo::default());
        s.metrics.node_added("a");
        let text = s.metrics.render();
        for want in [
            "firstpacket_baseline_seconds{kind=\"cross_node\",quantile=\"0.95\"} NaN",
            "firstpacket_drift_ratio{kind=\"cross_node\"} NaN",
            "firstpacket_recent_median_seconds{kind=\"cross_node\"} NaN",
            "firstpacket_drift_active{kind=\"cross_node\"} 0",
            "firstpacket_baseline_samples{kind=\"cross_node\"} 0",
            "firstpacket_node_drift_ratio{node=\"a\"} NaN",
            "firstpacket_node_drift_active{node=\"a\"} 0",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        *lock(&s.baselines) = Some(crate::baseline::Baselines::new(drift_cfg()));
        // Learn 0.3 s, then 2 s: drift, counted in the record and the gauges.
        for i in 0..6 {
            let r = s.record(rec(i, "a", "b", Some(0.3), ProbeResult::Success), i as f64);
            assert!(r > 0);
        }
        for i in 6..10 {
            s.record(
                rec(i, "a", "b", Some(2.0), ProbeResult::Success),
                100.0 + i as f64,
            );
        }
        let page = s.probes_page();
        let last = page.probes.last().expect("record");
        let mark = last.drift.as_ref().expect("drift mark");
        assert!(mark.counted && mark.kind, "{mark:?}");
        let text = s.metrics.render();
        assert!(
            text.contains("firstpacket_drift_active{kind=\"cross_node\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("firstpacket_baseline_seconds{kind=\"cross_node\",quantile=\"0.5\"} 0.3"),
            "{text}"
        );
        assert!(
            text.contains("firstpacket_node_drift_active{node=\"a\"} 1"),
            "{text}"
        );
        // Node b never added (not known): no series brought back by a probe.
        assert!(
            !text.contains("firstpacket_node_drift_ratio{node=\"b\"}"),
            "{text}"
        );
        let html = render_status(&page.probes, &[1.0; 10], 10, &page.info, 2.0);
        assert!(
            html.contains("class=\"baseline-band\" data-kind=\"cross_node\""),
            "{html}"
        );
        assert!(html.contains("id=\"drift\"") && html.contains("DRIFT"));
        assert!(html.contains("id=\"drifting-nodes\""));
        s.metrics.node_removed("a");
        assert!(!s.metrics.render().contains("node=\"a\""));
        s.metrics.leader.set(0);
        assert!(!s.metrics.render().contains("drift"));
    }
}
