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
//!   TTFP over time (inline SVG), the node-pair matrix of recent results, recent
//!   slow/failed probes with their suspects, the lap time ([`render_status`]); with
//!   `--leader-elect`, this replica's role and the leader's identity, term start and
//!   Lease (`info.leadership` in `/api/v1/probes` too).
//!
//! A standby (`firstpacket_leader` 0) serves all of them; its `/metrics` carries only
//! [`crate::metrics::STANDBY_FAMILIES`].

use crate::metrics::Metrics;
use crate::sync::lock;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use firstpacket_report::{ProbeRecord, ProbeResult};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
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
        .route("/", get(status))
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

async fn status(State(s): State<Arc<AdminState>>) -> Html<String> {
    let (records, finished, total) = {
        let r = lock(&s.recent);
        (
            r.records.iter().cloned().collect::<Vec<_>>(),
            r.finished_at.iter().copied().collect::<Vec<_>>(),
            r.total,
        )
    };
    let info = lock(&s.info).clone();
    Html(render_status(&records, &finished, total, &info))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(r: ProbeResult) -> &'static str {
    match r {
        ProbeResult::Success => "#2e7d32",
        ProbeResult::Slow => "#f9a825",
        ProbeResult::Failed => "#c62828",
        ProbeResult::Inconclusive => "#757575",
    }
}

fn secs(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.3}s"))
}

/// The baseline and drift per kind, and the drifting nodes (table `#drift`).
fn drift_table(info: &RunInfo) -> String {
    if info.drift.is_empty() {
        return String::new();
    }
    let mut out = String::from("<table id=\"drift\"><tr><th>kind</th><th>baseline p50 / p95</th><th>baseline samples</th><th>recent median</th><th>ratio</th><th>drift</th></tr>");
    for (k, st) in &info.drift {
        let _ = write!(
            out,
            "<tr data-kind=\"{}\"><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"drift-active\">{}</td></tr>",
            esc(k),
            esc(k),
            secs(st.baseline.and_then(|b| b.p50)),
            secs(st.baseline.and_then(|b| b.p95)),
            st.baseline_samples,
            secs(st.recent_median),
            st.ratio.map_or("–".into(), |r| format!("{r:.2}")),
            if st.active { "DRIFT" } else { "no" }
        );
    }
    out.push_str("</table>");
    let drifting: Vec<String> = info
        .node_drift
        .iter()
        .filter(|(_, st)| st.active)
        .map(|(n, st)| format!("{} (×{:.1})", esc(n), st.ratio.unwrap_or(f64::NAN)))
        .collect();
    if !drifting.is_empty() {
        let _ = write!(
            out,
            "<p id=\"drifting-nodes\">drifting nodes: {}</p>",
            drifting.join(", ")
        );
    }
    out
}

/// The TTFP-over-time chart: one dot per record (x = finish time, y = TTFP, colour =
/// result; records without a TTFP on the top edge as crosses), the slow threshold as a
/// dashed line, and behind the dots each kind's baseline band (`bands`: from its
/// baseline p50 to its p95, with the p50 as a line; kinds without a baseline yet have
/// none). Inline SVG, 720 × 220.
pub fn ttfp_svg(
    records: &[ProbeRecord],
    finished: &[f64],
    slow: f64,
    bands: &BTreeMap<String, crate::baseline::DriftStatus>,
) -> String {
    let (w, h, pad) = (720.0f64, 220.0f64, 36.0f64);
    let mut out = format!(
        "<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"TTFP over time\">"
    );
    let _ = write!(
        out,
        "<rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#fafafa\" stroke=\"#ccc\"/>"
    );
    if records.is_empty() {
        out.push_str(
            "<text x=\"20\" y=\"110\" font-size=\"14\">no probe finished yet</text></svg>",
        );
        return out;
    }
    let t0 = finished.iter().copied().fold(f64::INFINITY, f64::min);
    let t1 = finished.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = (t1 - t0).max(1.0);
    let ymax = records
        .iter()
        .filter_map(|r| r.ttfp_seconds)
        .fold(slow * 1.2, f64::max)
        .max(0.1);
    let x = |t: f64| pad + (t - t0) / span * (w - 2.0 * pad);
    let y = |v: f64| h - pad - (v / ymax).min(1.0) * (h - 2.0 * pad);
    // Baseline bands first, so the dots are drawn over them.
    for (kind, st) in bands {
        let Some((p50, p95)) = st.baseline.and_then(|b| Some((b.p50?, b.p95?))) else {
            continue;
        };
        let (top, bottom) = (y(p95), y(p50));
        let _ = write!(
            out,
            "<rect class=\"baseline-band\" data-kind=\"{k}\" x=\"{pad}\" y=\"{top:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"#90caf9\" fill-opacity=\"0.3\"><title>{k} baseline p50 {p50:.3}s – p95 {p95:.3}s</title></rect><line class=\"baseline-p50\" data-kind=\"{k}\" x1=\"{pad}\" y1=\"{bottom:.1}\" x2=\"{x2}\" y2=\"{bottom:.1}\" stroke=\"#1e88e5\" stroke-width=\"1\"/>",
            k = esc(kind),
            bw = w - 2.0 * pad,
            bh = (bottom - top).max(1.0),
            x2 = w - pad,
        );
    }
    // Axes and labels.
    let _ = write!(
        out,
        "<line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/><line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{}\" stroke=\"#999\"/>",
        h - pad,
        w - pad,
        h - pad,
        h - pad
    );
    for frac in [0.0, 0.5, 1.0] {
        let v = ymax * frac;
        let _ = write!(
            out,
            "<text x=\"2\" y=\"{:.1}\" font-size=\"10\">{v:.2}s</text>",
            y(v) + 3.0
        );
    }
    let _ = write!(
        out,
        "<line class=\"slow-threshold\" x1=\"{pad}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#f9a825\" stroke-dasharray=\"4 3\"/>",
        y(slow),
        w - pad
    );
    let _ = write!(
        out,
        "<text x=\"{pad}\" y=\"{}\" font-size=\"10\">{:.0}s span</text>",
        h - 8.0,
        span
    );
    for (r, t) in records.iter().zip(finished) {
        let cx = x(*t);
        match r.ttfp_seconds {
            Some(v) => {
                let _ = write!(
                    out,
                    "<circle class=\"pt\" cx=\"{cx:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{}\"><title>{} {} → {}: {}</title></circle>",
                    y(v),
                    color(r.result),
                    esc(&r.id),
                    esc(&r.source.node),
                    esc(&r.target.node),
                    secs(Some(v))
                );
            }
            None => {
                let cy = pad - 6.0;
                let _ = write!(
                    out,
                    "<text class=\"pt\" x=\"{:.1}\" y=\"{cy:.1}\" font-size=\"11\" fill=\"{}\">×<title>{} {}</title></text>",
                    cx - 3.0,
                    color(r.result),
                    esc(&r.id),
                    r.result.as_str()
                );
            }
        }
    }
    out.push_str("</svg>");
    out
}

/// The run's facts, its leadership and the skipped nodes, as paragraphs of the page.
fn run_facts_html(out: &mut String, total: u64, info: &RunInfo) {
    let _ = write!(
        out,
        "<p class=\"facts\"><span>instance <b>{}</b></span><span>probes recorded <b id=\"total\">{total}</b></span><span>eligible nodes <b>{}</b></span><span>lap <b>{}</b></span><span>last lap <b id=\"lap-seconds\">{}</b></span><span>expected lap <b>{}</b></span><span>interval {:.1}s × concurrency {}</span></p>",
        esc(&info.instance),
        info.eligible_nodes.len(),
        info.lap,
        secs(info.lap_seconds),
        secs(info.lap_expected_seconds),
        info.probe_interval_seconds,
        info.concurrency
    );
    let l = &info.leadership;
    if l.enabled {
        let role = if l.leading { "leader" } else { "standby" };
        let _ = write!(
            out,
            "<p class=\"facts\" id=\"leadership\"><span>this replica <b id=\"role\">{role}</b> ({})</span><span>leader <b id=\"leader\">{}</b></span><span>its term since <b>{}</b></span><span>Lease <b>{}</b> (transitions {})</span></p>",
            esc(&l.identity),
            esc(l.holder.as_deref().unwrap_or("none")),
            esc(l.holder_since.as_deref().unwrap_or("–")),
            esc(&l.lease),
            l.transitions
        );
        if !l.leading {
            out.push_str("<p>standby: probes run on the leader; its status page has them.</p>");
        }
    }
    if !info.skipped_nodes.is_empty() {
        let s: Vec<String> = info
            .skipped_nodes
            .iter()
            .map(|(n, r)| format!("{}: {}", esc(n), esc(r)))
            .collect();
        let _ = write!(out, "<p>skipped: {}</p>", s.join("; "));
    }
}

/// The node-pair matrix: one cell per (source, target) in `nodes`, the latest result.
fn matrix_html(
    out: &mut String,
    latest: &BTreeMap<(String, String), &ProbeRecord>,
    nodes: &BTreeSet<String>,
) {
    let _ = write!(
        out,
        "<h2>Node pairs (latest result, source ↓ target →)</h2><table id=\"matrix\"><tr><th>source \\ target</th>"
    );
    for t in nodes {
        let _ = write!(out, "<th>{}</th>", esc(t));
    }
    out.push_str("</tr>");
    for s in nodes {
        let _ = write!(out, "<tr><th>{}</th>", esc(s));
        for t in nodes {
            match latest.get(&(s.clone(), t.clone())) {
                Some(r) => {
                    let _ = write!(
                        out,
                        "<td class=\"cell {}\" data-source=\"{}\" data-target=\"{}\" title=\"{} {}\">{}</td>",
                        r.result.as_str(),
                        esc(s),
                        esc(t),
                        esc(&r.id),
                        r.reason.map_or("", |x| x.as_str()),
                        r.ttfp_seconds
                            .map_or(r.result.as_str().to_string(), |v| format!("{v:.2}s"))
                    );
                }
                None => out.push_str("<td class=\"none\"></td>"),
            }
        }
        out.push_str("</tr>");
    }
}

/// The table of the 50 most recent slow and failed probes, newest first.
fn bad_probes_html(out: &mut String, records: &[ProbeRecord]) {
    out.push_str("</table><h2>Recent slow and failed probes</h2><table id=\"bad\"><tr><th>probe</th><th>kind</th><th>source → target</th><th>result</th><th>TTFP</th><th>suspects</th><th class=\"l\">detail</th></tr>");
    let mut any = false;
    for r in records
        .iter()
        .rev()
        .filter(|r| matches!(r.result, ProbeResult::Slow | ProbeResult::Failed))
        .take(50)
    {
        any = true;
        let suspects: Vec<String> = r
            .suspects
            .iter()
            .map(|s| format!("{}: {}", esc(&s.node), s.signal.as_str()))
            .collect();
        let _ = write!(
            out,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{} → {}</td><td>{}{}</td><td>{}</td><td class=\"suspects\">{}</td><td class=\"l\">{}</td></tr>",
            r.result.as_str(),
            esc(&r.id),
            esc(&r.kind),
            esc(&r.source.node),
            esc(&r.target.node),
            r.result.as_str(),
            r.reason.map(|x| format!("/{}", x.as_str())).unwrap_or_default(),
            secs(r.ttfp_seconds),
            if suspects.is_empty() { "–".into() } else { suspects.join("<br>") },
            esc(r.detail.as_deref().unwrap_or(""))
        );
    }
    if !any {
        out.push_str("<tr><td colspan=\"7\">none in the recent records</td></tr>");
    }
    out.push_str("</table>");
}

/// The status page (module docs). Pure: records (oldest first), their finish times
/// (Unix seconds), the running total and the run facts in, HTML out. The matrix has one
/// cell per (source, target) node pair seen in the records (the latest result, with
/// `data-source`/`data-target` attributes), rows and columns the nodes seen and the
/// eligible ones.
pub fn render_status(
    records: &[ProbeRecord],
    finished: &[f64],
    total: u64,
    info: &RunInfo,
) -> String {
    let mut latest: BTreeMap<(String, String), &ProbeRecord> = BTreeMap::new();
    let mut nodes: BTreeSet<String> = info.eligible_nodes.iter().cloned().collect();
    for r in records {
        latest.insert((r.source.node.clone(), r.target.node.clone()), r);
        nodes.insert(r.source.node.clone());
        nodes.insert(r.target.node.clone());
    }
    let mut out = String::new();
    out.push_str("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>firstpacket status</title><style>");
    out.push_str("body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px;text-align:center}th{background:#eee}.success{background:#c8e6c9}.slow{background:#fff59d}.failed{background:#ef9a9a}.inconclusive{background:#e0e0e0}.none{background:#fff}.l{text-align:left}h2{font-size:16px;margin-top:1.4em}.facts span{margin-right:1.5em}");
    out.push_str("</style></head><body><h1>firstpacket — time to first packet</h1>");
    run_facts_html(&mut out, total, info);
    out.push_str("<h2>TTFP over time</h2>");
    out.push_str(&ttfp_svg(
        records,
        finished,
        info.slow_threshold_seconds,
        &info.drift,
    ));
    out.push_str(&drift_table(info));
    matrix_html(&mut out, &latest, &nodes);
    bad_probes_html(&mut out, records);
    if !info.state_entries.is_empty() {
        out.push_str("<h2>Bounded state</h2><p>");
        for (k, v) in &info.state_entries {
            let _ = write!(out, "<span>{}: {v}</span> ", esc(k));
        }
        out.push_str("</p>");
    }
    out.push_str("<p>JSON: <a href=\"/api/v1/probes\">/api/v1/probes</a> · metrics: <a href=\"/metrics\">/metrics</a></p></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::ProbeKind;

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
        let html = render_status(&[], &[], 0, &info);
        assert!(html.contains("id=\"leader\">host_run-a<"), "{html}");
        assert!(html.contains("id=\"role\">standby<"), "{html}");
        assert!(html.contains("2026-01-02T03:04:05Z"));
        // Without --leader-elect the page says nothing of an election.
        let html = render_status(&[], &[], 0, &RunInfo::default());
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
        let html = render_status(&page.probes, &[1.0; 10], 10, &page.info);
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

    #[test]
    fn status_page_has_a_cell_per_pair_the_chart_and_the_bad_probes() {
        let records = vec![
            rec(1, "n1", "n2", Some(0.2), ProbeResult::Success),
            rec(2, "n2", "n1", Some(7.5), ProbeResult::Slow),
            rec(3, "n1", "n3", None, ProbeResult::Failed),
        ];
        let info = RunInfo {
            instance: "run-abc".into(),
            eligible_nodes: vec!["n1".into(), "n2".into(), "n3".into()],
            lap_seconds: Some(12.5),
            slow_threshold_seconds: 5.0,
            ..Default::default()
        };
        let html = render_status(&records, &[1.0, 2.0, 3.0], 3, &info);
        for (s, t) in [("n1", "n2"), ("n2", "n1"), ("n1", "n3")] {
            assert!(
                html.contains(&format!("data-source=\"{s}\" data-target=\"{t}\"")),
                "{s}->{t}"
            );
        }
        assert_eq!(html.matches("class=\"cell ").count(), 3);
        assert!(html.contains("<svg") && html.contains("12.500s"));
        assert!(html.contains("x-2") && html.contains("x-3"));
        assert!(
            !html.contains("<script") && !html.contains("http://") && !html.contains("https://")
        );
    }
}
