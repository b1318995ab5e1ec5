//! The status page of `prober run` (`GET /`) and its debug page (`GET /debug`):
//! server-rendered, self-contained HTML — inline CSS and SVG, no scripts, no external
//! assets, so it works behind `kubectl port-forward` and in a headless browser alike.
//! Pure: the records (oldest first), their finish times, the run facts and "now" in,
//! HTML out ([`render_status`], [`render_debug`]).
//!
//! What the page shows, and the rule behind each number:
//!
//! - **Wall-clock times.** Every record, matrix cell and chart point carries the time its
//!   probe finished, in UTC, and its age (now − finish). Both are read on the prober's
//!   own clock (the record is stamped when the prober completes it), so no two machines'
//!   clocks are compared.
//! - **Laps** ([`LapCheck`]). A lap makes every eligible node source once and target once
//!   (`crate::rotation`). *Planned*: eligible nodes × `--probe-interval`. *Measured*: the
//!   last complete lap, start to start. *What the probes allow*: with `--concurrency` c
//!   probes in flight and a mean probe duration D (probe start to its record: pods
//!   created, Ready, TTFP, `--hold`), at most c / D probes start per second (Little's
//!   law), so a probe starts at best every max(`--probe-interval`, D / c), and a lap
//!   takes at least nodes × that. When D / c > `--probe-interval` the interval cannot be
//!   met and the page says so, with the settings that would meet it. D is the mean over
//!   the last [`LAP_SAMPLE`] records.
//! - **Stale cells.** A matrix cell (the latest probe of a source → target pair) is
//!   stale when that probe finished more than [`STALE_LAPS`] laps ago, the lap being the
//!   longer of the measured lap and the lap the recent probes allow (the planned lap
//!   before either is known). After two laps both of the pair's nodes have newer results
//!   elsewhere in their row and column than the cell, so its colour no longer says how
//!   the pair is now: it stays, hatched, with a dashed border, its age and the word
//!   `stale`. In a cluster of n nodes one ordered pair is probed about once every
//!   (n − 1) × (kinds) laps, so on larger clusters most cross-node cells are stale even
//!   when healthy; rows and columns (nodes) stay fresh.
//! - **The chart**: TTFP over finish time (UTC axis, right edge = now, so a prober
//!   that stopped measuring shows as an empty stretch), each probe's programming wait
//!   beside it (a readiness-gating CNI moves the delay there, `ProbeProgramming`), the
//!   slow threshold, each kind's baseline band, and a legend.
//! - **Programming wait** next to TTFP in the tables: the source's and the target's own
//!   waits (`ProbeProgramming`), `gated` when the delay came before Ready.
//!
//! The debug page holds the internals (sizes of the bounded structures, the ring).

use super::{RunInfo, RECENT_CAPACITY};
use firstpacket_report::{ProbeProgramming, ProbeRecord, ProbeResult};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// A matrix cell is stale once its probe is older than this many laps (module docs).
pub const STALE_LAPS: f64 = 2.0;

/// Records (newest) the mean probe duration and start spacing are taken over.
pub const LAP_SAMPLE: usize = 20;

/// Rows of the "latest probes" table.
const LATEST_ROWS: usize = 20;

/// Rows of the "recent slow and failed probes" table.
const BAD_ROWS: usize = 50;

/// HTML-escapes `s` for text and double-quoted attributes.
pub fn esc(s: &str) -> String {
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

/// `1.234s`, or `–` for `None`.
fn secs(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.3}s"))
}

/// A duration in seconds as a person reads an age: `42s`, `7m 02s`, `2h 05m`,
/// `3d 04h` (negative values, a clock step back, read as `0s`).
pub fn age_text(seconds: f64) -> String {
    let s = if seconds.is_finite() {
        seconds.max(0.0).floor() as u64
    } else {
        0
    };
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {:02}h", s / 86400, s % 86400 / 3600),
    }
}

fn timestamp(unix: f64) -> Option<Timestamp> {
    if !unix.is_finite() {
        return None;
    }
    Timestamp::from_millisecond((unix * 1000.0).round() as i64).ok()
}

/// Unix seconds as UTC with `fmt` (strftime), `?` when out of range.
fn utc_fmt(unix: f64, fmt: &str) -> String {
    timestamp(unix).map_or("?".into(), |t| t.strftime(fmt).to_string())
}

/// Unix seconds as `2026-12-04 19:40:12 UTC`.
pub fn utc_text(unix: f64) -> String {
    utc_fmt(unix, "%Y-%m-%d %H:%M:%S UTC")
}

/// Unix seconds as RFC 3339 in UTC, whole seconds (`2026-12-04T19:40:12Z`).
pub fn rfc3339(unix: f64) -> String {
    utc_fmt(unix, "%Y-%m-%dT%H:%M:%SZ")
}

/// The lap facts of the page (module docs, "Laps"). Seconds throughout.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LapCheck {
    /// Eligible nodes (probes per lap).
    pub nodes: usize,
    /// `--probe-interval`.
    pub interval: f64,
    /// `--concurrency` (at least 1).
    pub concurrency: u32,
    /// Nodes × `--probe-interval`; `None` without eligible nodes.
    pub planned: Option<f64>,
    /// The last complete lap, as `prober run` timed it.
    pub measured: Option<f64>,
    /// Records the means below are taken over (the newest, at most [`LAP_SAMPLE`]).
    pub sample: usize,
    /// Mean probe duration D (start to record) over the sample; `None` under 3 records.
    pub mean_probe: Option<f64>,
    /// Mean spacing of the sample's probe starts; `None` under 3 records.
    pub mean_start_gap: Option<f64>,
    /// D / concurrency: the shortest mean spacing of starts the probes allow.
    pub min_start_gap: Option<f64>,
    /// Nodes × max(`--probe-interval`, D / concurrency).
    pub allowed: Option<f64>,
    /// D / concurrency > `--probe-interval`: the interval cannot be met.
    pub interval_unmet: bool,
}

impl LapCheck {
    /// The lap facts from the records (oldest first), their finish times (Unix seconds,
    /// parallel) and the run facts. A record's start is its finish minus its
    /// `timeline.finished`; records without it are left out.
    pub fn new(records: &[ProbeRecord], finished: &[f64], info: &RunInfo) -> LapCheck {
        let nodes = info.eligible_nodes.len();
        let interval = info.probe_interval_seconds;
        let concurrency = info.concurrency.max(1);
        let planned = (nodes > 0 && interval > 0.0).then_some(nodes as f64 * interval);
        let sample: Vec<(f64, f64)> = records
            .iter()
            .zip(finished)
            .rev()
            .filter_map(|(r, end)| {
                let d = r.timeline.finished?;
                (d.is_finite() && d >= 0.0 && end.is_finite()).then_some((end - d, d))
            })
            .take(LAP_SAMPLE)
            .collect();
        let n = sample.len();
        let (mean_probe, mean_start_gap) = if n >= 3 {
            let mean = sample.iter().map(|(_, d)| d).sum::<f64>() / n as f64;
            let first = sample.iter().map(|(s, _)| *s).fold(f64::INFINITY, f64::min);
            let last = sample
                .iter()
                .map(|(s, _)| *s)
                .fold(f64::NEG_INFINITY, f64::max);
            (Some(mean), Some((last - first) / (n - 1) as f64))
        } else {
            (None, None)
        };
        let min_start_gap = mean_probe.map(|d| d / f64::from(concurrency));
        let interval_unmet = interval > 0.0 && min_start_gap.is_some_and(|g| g > interval);
        let allowed = min_start_gap
            .filter(|_| nodes > 0)
            .map(|g| nodes as f64 * g.max(interval));
        LapCheck {
            nodes,
            interval,
            concurrency,
            planned,
            measured: info.lap_seconds,
            sample: n,
            mean_probe,
            mean_start_gap,
            min_start_gap,
            allowed,
            interval_unmet,
        }
    }

    /// The lap the stale rule uses: the longer of the measured lap and the lap the
    /// recent probes allow; the planned lap before either is known.
    pub fn lap_seconds(&self) -> Option<f64> {
        match (self.measured, self.allowed) {
            (Some(m), Some(a)) => Some(m.max(a)),
            (Some(x), None) | (None, Some(x)) => Some(x),
            (None, None) => self.planned,
        }
    }

    /// Age after which a matrix cell is stale: [`STALE_LAPS`] × [`Self::lap_seconds`].
    pub fn stale_after(&self) -> Option<f64> {
        self.lap_seconds().map(|l| STALE_LAPS * l)
    }

    /// The warning when `--probe-interval` cannot be met (plain text), with the
    /// `--concurrency` or `--probe-interval` that would meet it.
    pub fn warning(&self) -> Option<String> {
        if !self.interval_unmet {
            return None;
        }
        let (d, gap) = (self.mean_probe?, self.min_start_gap?);
        let need = (d / self.interval).ceil() as u64;
        let mut s = format!(
            "--probe-interval {:.1}s cannot be met: a probe takes {d:.1} s on average (last {} probes, --hold included) and --concurrency {} runs at most {} at a time, so a probe starts at best every {gap:.1} s",
            self.interval, self.sample, self.concurrency, self.concurrency
        );
        if let Some(g) = self.mean_start_gap {
            let _ = write!(s, " (measured: every {g:.1} s)");
        }
        if let (Some(a), Some(p)) = (self.allowed, self.planned) {
            let _ = write!(
                s,
                "; a lap of {} nodes takes at least {a:.1} s, not the planned {p:.1} s",
                self.nodes
            );
        }
        let _ = write!(
            s,
            ". To probe every {:.1}s: --concurrency {need} or more, or a shorter --hold; or set --probe-interval to {gap:.1}s or more.",
            self.interval
        );
        Some(s)
    }
}

/// One matrix cell: the latest probe of a pair, its age and whether it is stale.
#[derive(Debug, Clone, Copy)]
pub struct Cell<'a> {
    /// The pair's latest record.
    pub record: &'a ProbeRecord,
    /// Its finish time, Unix seconds.
    pub finished: f64,
    /// now − finished, seconds.
    pub age: f64,
    /// `age` > the stale age ([`LapCheck::stale_after`]).
    pub stale: bool,
}

/// The node-pair matrix's cells by (source node, target node): each pair's latest
/// record (by finish time), aged at `now_unix` and marked stale past `stale_after`.
pub fn cells<'a>(
    records: &'a [ProbeRecord],
    finished: &[f64],
    now_unix: f64,
    stale_after: Option<f64>,
) -> BTreeMap<(String, String), Cell<'a>> {
    let mut out: BTreeMap<(String, String), Cell<'a>> = BTreeMap::new();
    for (r, &t) in records.iter().zip(finished) {
        let key = (r.source.node.clone(), r.target.node.clone());
        if out.get(&key).is_some_and(|c| c.finished > t) {
            continue;
        }
        let age = now_unix - t;
        out.insert(
            key,
            Cell {
                record: r,
                finished: t,
                age,
                stale: stale_after.is_some_and(|s| age > s),
            },
        );
    }
    out
}

/// The baseline and drift per kind, and the drifting nodes (table `#drift`).
fn drift_table(info: &RunInfo) -> String {
    if info.drift.is_empty() {
        return String::new();
    }
    let mut out = String::from("<h2>Baseline and drift</h2><table id=\"drift\"><tr><th>kind</th><th>baseline p50 / p95</th><th>baseline samples</th><th>recent median</th><th>ratio</th><th>drift</th></tr>");
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

/// The longer of a record's two programming waits, seconds.
fn longest_wait(p: Option<&ProbeProgramming>) -> Option<f64> {
    p?.waits().reduce(f64::max)
}

/// A tick step for a time axis spanning `span` seconds: the smallest of 1 s … 1 d
/// that gives at most 8 ticks.
pub fn time_step(span: f64) -> f64 {
    const STEPS: [f64; 16] = [
        1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0,
        21600.0, 86400.0,
    ];
    STEPS
        .iter()
        .copied()
        .find(|s| span / s <= 8.0)
        .unwrap_or(86400.0)
}

/// A tick step for a value axis up to `largest` (> 0): the smallest of 1, 2, 2.5 or 5
/// × 10^k that gives at most 4 steps.
pub fn value_step(largest: f64) -> f64 {
    let raw = largest / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// The chart's geometry: the plot area (SVG units, `y0` its bottom) and the ranges it
/// maps (Unix seconds `t0..t1`, seconds `0..ymax` with a tick every `ystep`).
struct Plot {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    t0: f64,
    t1: f64,
    ymax: f64,
    ystep: f64,
}

impl Plot {
    fn x(&self, t: f64) -> f64 {
        self.x0 + (t - self.t0) / (self.t1 - self.t0) * (self.x1 - self.x0)
    }

    fn y(&self, v: f64) -> f64 {
        self.y0 - (v / self.ymax).clamp(0.0, 1.0) * (self.y0 - self.y1)
    }

    /// Each kind's baseline band (p50 to p95) and its p50 line.
    fn bands(&self, out: &mut String, bands: &BTreeMap<String, crate::baseline::DriftStatus>) {
        let (x0, x1) = (self.x0, self.x1);
        for (kind, st) in bands {
            let Some((p50, p95)) = st.baseline.and_then(|b| Some((b.p50?, b.p95?))) else {
                continue;
            };
            let (bt, bb) = (self.y(p95), self.y(p50));
            let _ = write!(
                out,
                "<rect class=\"baseline-band\" data-kind=\"{k}\" x=\"{x0}\" y=\"{bt:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"#90caf9\" fill-opacity=\"0.3\"><title>{k} baseline p50 {p50:.3}s – p95 {p95:.3}s</title></rect><line class=\"baseline-p50\" data-kind=\"{k}\" x1=\"{x0}\" y1=\"{bb:.1}\" x2=\"{x1}\" y2=\"{bb:.1}\" stroke=\"#1e88e5\" stroke-width=\"1\"/>",
                k = esc(kind),
                bw = x1 - x0,
                bh = (bb - bt).max(1.0),
            );
        }
    }

    /// Both axes with their ticks, grid lines and titles; the "now" edge; the slow
    /// threshold. `h`: the SVG's height.
    fn axes(&self, out: &mut String, h: f64, slow: f64) {
        let (x0, x1, y0, y1) = (self.x0, self.x1, self.y0, self.y1);
        let yticks = (self.ymax / self.ystep).round() as u32;
        for i in 0..=yticks {
            let v = self.ystep * f64::from(i);
            let _ = write!(
                out,
                "<line x1=\"{x0}\" y1=\"{0:.1}\" x2=\"{x1}\" y2=\"{0:.1}\" stroke=\"#e6e6e6\"/><text x=\"{1}\" y=\"{2:.1}\" font-size=\"10\" text-anchor=\"end\">{v:.2}s</text>",
                self.y(v),
                x0 - 4.0,
                self.y(v) + 3.0
            );
        }
        let _ = write!(
            out,
            "<text class=\"axis-title\" x=\"12\" y=\"{0:.1}\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 12 {0:.1})\">TTFP / programming wait (s)</text>",
            (y0 + y1) / 2.0
        );
        // Time axis: UTC ticks at round times.
        let span = self.t1 - self.t0;
        let step = time_step(span);
        let fmt = if step < 60.0 { "%H:%M:%S" } else { "%H:%M" };
        let mut t = (self.t0 / step).ceil() * step;
        while t <= self.t1 + 1e-6 {
            let tx = self.x(t);
            let _ = write!(
                out,
                "<line x1=\"{tx:.1}\" y1=\"{y1}\" x2=\"{tx:.1}\" y2=\"{0}\" stroke=\"#e6e6e6\"/><text class=\"time-tick\" x=\"{tx:.1}\" y=\"{1}\" font-size=\"10\" text-anchor=\"middle\">{2}</text>",
                y0 + 4.0,
                y0 + 15.0,
                utc_fmt(t, fmt)
            );
            t += step;
        }
        let _ = write!(
            out,
            "<line x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"#999\"/><line x1=\"{x0}\" y1=\"{y1}\" x2=\"{x0}\" y2=\"{y0}\" stroke=\"#999\"/><line class=\"now\" x1=\"{x1}\" y1=\"{y1}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"#555\" stroke-dasharray=\"2 2\"/><text x=\"{0}\" y=\"{1}\" font-size=\"10\">now</text>",
            x1 + 3.0,
            y1 + 8.0
        );
        let _ = write!(
            out,
            "<text class=\"axis-title\" x=\"{0:.1}\" y=\"{1}\" font-size=\"11\" text-anchor=\"middle\">probe finish time (UTC, {2}), last {3}</text>",
            (x0 + x1) / 2.0,
            h - 6.0,
            utc_fmt(self.t1, "%Y-%m-%d"),
            age_text(span)
        );
        let _ = write!(
            out,
            "<line class=\"slow-threshold\" x1=\"{x0}\" y1=\"{0:.1}\" x2=\"{x1}\" y2=\"{0:.1}\" stroke=\"#f9a825\" stroke-dasharray=\"5 3\" stroke-width=\"1.5\"/>",
            self.y(slow)
        );
    }

    /// One record's marks: its programming wait (diamond) and its TTFP (dot), or a cross
    /// above the plot without a TTFP; tooltips with the UTC time and age.
    fn record(&self, out: &mut String, r: &ProbeRecord, t: f64, now_unix: f64) {
        let cx = self.x(t);
        let when = format!(
            "{} ({} ago)",
            utc_fmt(t, "%H:%M:%S UTC"),
            age_text(now_unix - t)
        );
        let (id, kind) = (esc(&r.id), esc(&r.kind));
        let (src, dst) = (esc(&r.source.node), esc(&r.target.node));
        if let Some(pw) = longest_wait(r.programming.as_ref()) {
            let _ = write!(
                out,
                "<path class=\"pw\" d=\"M{cx:.1} {:.1}l3 3l-3 3l-3-3z\" fill=\"none\" stroke=\"#5c6bc0\"><title>{id} {src} → {dst}: programming wait {} · {when}</title></path>",
                self.y(pw) - 3.0,
                secs(Some(pw))
            );
        }
        let result = r.result.as_str();
        let fill = color(r.result);
        match r.ttfp_seconds {
            Some(v) => {
                let _ = write!(
                    out,
                    "<circle class=\"pt {result}\" cx=\"{cx:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{fill}\"><title>{id} {kind} {src} → {dst}: {result} TTFP {} · {when}</title></circle>",
                    self.y(v),
                    secs(Some(v))
                );
            }
            None => {
                let _ = write!(
                    out,
                    "<text class=\"pt {result}\" x=\"{cx:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" fill=\"{fill}\">×<title>{id} {kind} {src} → {dst}: {result}{} · {when}</title></text>",
                    self.y1 - 6.0,
                    r.reason.map(|x| format!("/{}", x.as_str())).unwrap_or_default(),
                );
            }
        }
    }
}

/// The TTFP-over-time chart: one dot per record at (finish time, TTFP), coloured by
/// result; records without a TTFP as crosses above the plot; each record's longer
/// programming wait as a hollow diamond; the slow threshold dashed; behind them each
/// kind's baseline band (`bands`: p50 to p95, the p50 as a line; kinds without a
/// baseline have none). The time axis runs from the oldest record to `now_unix` (UTC
/// ticks); the value axis from 0 to the largest value (at least 1.2 × `slow`) rounded
/// up to a tick ([`value_step`]). Inline SVG, 900 × 270; its legend is
/// [`chart_legend`].
pub fn ttfp_svg(
    records: &[ProbeRecord],
    finished: &[f64],
    slow: f64,
    bands: &BTreeMap<String, crate::baseline::DriftStatus>,
    now_unix: f64,
) -> String {
    let (w, h) = (900.0f64, 270.0f64);
    let mut out = format!(
        "<svg id=\"ttfp-chart\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"TTFP over time\" font-family=\"sans-serif\"><rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#fafafa\" stroke=\"#ccc\"/>"
    );
    if records.is_empty() {
        out.push_str(
            "<text x=\"20\" y=\"120\" font-size=\"14\">no probe finished yet</text></svg>",
        );
        return out;
    }
    let t0 = finished.iter().copied().fold(f64::INFINITY, f64::min);
    let newest = finished.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let largest = records
        .iter()
        .flat_map(|r| [r.ttfp_seconds, longest_wait(r.programming.as_ref())])
        .flatten()
        .filter(|v| v.is_finite())
        .fold(slow * 1.2, f64::max)
        .max(0.1);
    let ystep = value_step(largest);
    // Margins: left 58 (value labels), right 36 ("now"), top 28 (crosses), bottom 44.
    let plot = Plot {
        x0: 58.0,
        x1: w - 36.0,
        y0: h - 44.0,
        y1: 28.0,
        t0,
        t1: now_unix.max(newest).max(t0 + 1.0),
        ymax: (largest / ystep).ceil() * ystep,
        ystep,
    };
    // Baseline bands first, so the dots are drawn over them.
    plot.bands(&mut out, bands);
    plot.axes(&mut out, h, slow);
    for (r, &t) in records.iter().zip(finished) {
        plot.record(&mut out, r, t, now_unix);
    }
    out.push_str("</svg>");
    out
}

/// A legend swatch: a small inline SVG.
fn swatch(inner: &str) -> String {
    format!(
        "<svg width=\"16\" height=\"12\" viewBox=\"0 0 16 12\" aria-hidden=\"true\">{inner}</svg>"
    )
}

/// The chart's legend (`#chart-legend`): the four results, the no-TTFP cross, the
/// programming-wait diamond, the slow threshold and, when drawn, the baseline band.
pub fn chart_legend(slow: f64, with_bands: bool) -> String {
    let mut out = String::from("<div class=\"legend\" id=\"chart-legend\">");
    for r in ProbeResult::ALL {
        let _ = write!(
            out,
            "<span class=\"key\" data-key=\"{0}\">{1} {0}</span>",
            r.as_str(),
            swatch(&format!(
                "<circle cx=\"8\" cy=\"6\" r=\"4\" fill=\"{}\"/>",
                color(r)
            ))
        );
    }
    let _ = write!(
        out,
        "<span class=\"key\" data-key=\"no-ttfp\">{} no TTFP (failed or inconclusive; above the plot)</span>",
        swatch("<text x=\"8\" y=\"11\" font-size=\"12\" text-anchor=\"middle\" fill=\"#c62828\">×</text>")
    );
    let _ = write!(
        out,
        "<span class=\"key\" data-key=\"programming-wait\">{} programming wait (the longer pod's)</span>",
        swatch("<path d=\"M8 2l4 4l-4 4l-4-4z\" fill=\"none\" stroke=\"#5c6bc0\"/>")
    );
    let _ = write!(
        out,
        "<span class=\"key\" data-key=\"slow-threshold\">{} slow threshold ({slow:.2}s)</span>",
        swatch("<line x1=\"0\" y1=\"6\" x2=\"16\" y2=\"6\" stroke=\"#f9a825\" stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/>")
    );
    if with_bands {
        let _ = write!(
            out,
            "<span class=\"key\" data-key=\"baseline\">{} baseline p50–p95 per kind (line: p50)</span>",
            swatch("<rect x=\"0\" y=\"2\" width=\"16\" height=\"8\" fill=\"#90caf9\" fill-opacity=\"0.5\"/><line x1=\"0\" y1=\"10\" x2=\"16\" y2=\"10\" stroke=\"#1e88e5\"/>")
        );
    }
    out.push_str("</div>");
    out
}

/// The programming waits of a record as table text (`0.42s / 0.51s`, source first;
/// `gated` when the delay came before Ready) and its tooltip.
fn programming_text(p: Option<&ProbeProgramming>) -> (String, String) {
    let Some(p) = p else {
        return ("–".into(), "no source report".into());
    };
    let one = |w: Option<&firstpacket_report::ProgrammingWait>| {
        w.map_or("–".into(), |w| {
            let v = format!("{:.2}s", w.wait_seconds);
            if w.over_threshold {
                format!("<b>{v}</b>")
            } else {
                v
            }
        })
    };
    let tip = |side: &str, w: Option<&firstpacket_report::ProgrammingWait>| {
        w.map_or(format!("{side}: not measured"), |w| {
            format!(
                "{side}: {:.3}s ({}, ±{:.1}s)",
                w.wait_seconds,
                w.method.as_str(),
                w.resolution_seconds
            )
        })
    };
    let mut text = format!("{} / {}", one(p.source.as_ref()), one(p.target.as_ref()));
    let mut title = format!(
        "{}; {}",
        tip("source", p.source.as_ref()),
        tip("target", p.target.as_ref())
    );
    if p.readiness_gated == Some(true) {
        text.push_str(" <span class=\"gated\">gated</span>");
        title.push_str("; the delay came before Ready (readiness gated)");
    }
    (text, title)
}

/// The run's facts, its leadership and the skipped nodes, as paragraphs of the page.
fn run_facts_html(
    out: &mut String,
    total: u64,
    info: &RunInfo,
    finished: &[f64],
    now_unix: f64,
    stale_after: Option<f64>,
) {
    let _ = write!(
        out,
        "<p class=\"facts\"><span>instance <b>{}</b></span><span>probes recorded <b id=\"total\">{total}</b></span><span>eligible nodes <b>{}</b></span><span>interval {:.1}s × concurrency {}</span><span>slow threshold {:.2}s</span></p>",
        esc(&info.instance),
        info.eligible_nodes.len(),
        info.probe_interval_seconds,
        info.concurrency,
        info.slow_threshold_seconds
    );
    let newest = finished.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if newest.is_finite() {
        let age = now_unix - newest;
        let quiet = stale_after.is_some_and(|s| age > s);
        let _ = write!(
            out,
            "<p class=\"facts{}\" id=\"last-probe\">last probe finished <b>{}</b> ({} ago){}</p>",
            if quiet { " warn" } else { "" },
            utc_text(newest),
            age_text(age),
            if quiet {
                " — longer than two laps: the prober is not measuring (see its logs and /metrics)"
            } else {
                ""
            }
        );
    }
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
        let _ = write!(out, "<p>skipped nodes: {}</p>", s.join("; "));
    }
}

/// The lap paragraph (`#lap`) and, when the interval cannot be met, the warning
/// (`#lap-warning`).
fn lap_html(out: &mut String, lap: &LapCheck, info: &RunInfo) {
    let _ = write!(
        out,
        "<p class=\"facts\" id=\"lap\"><span>lap <b>{}</b> in progress</span><span>last lap took <b id=\"lap-seconds\">{}</b> (measured)</span><span>planned <b>{}</b> ({} nodes × --probe-interval)</span>",
        info.lap,
        secs(lap.measured),
        secs(lap.planned),
        lap.nodes
    );
    if let (Some(a), Some(d)) = (lap.allowed, lap.mean_probe) {
        let _ = write!(
            out,
            "<span>a lap takes at least <b id=\"lap-allowed\">{}</b> at the probes' pace ({d:.1}s each on average, --concurrency {})</span>",
            secs(Some(a)),
            lap.concurrency
        );
    }
    out.push_str("</p>");
    if let Some(w) = lap.warning() {
        let _ = write!(
            out,
            "<p class=\"warn\" id=\"lap-warning\">⚠ {}</p>",
            esc(&w)
        );
    }
}

/// The node-pair matrix (`#matrix`): one cell per (source, target) in `nodes`, the
/// latest result with its finish time and age, stale ones marked; then its legend.
fn matrix_html(
    out: &mut String,
    cells: &BTreeMap<(String, String), Cell<'_>>,
    nodes: &BTreeSet<String>,
    lap: &LapCheck,
) {
    let _ = write!(
        out,
        "<h2>Node pairs — latest result of each pair (source ↓, target →)</h2><table id=\"matrix\" data-stale-after-seconds=\"{}\"><tr><th>source \\ target</th>",
        lap.stale_after().map_or("none".into(), |s| format!("{s:.1}"))
    );
    for t in nodes {
        let _ = write!(out, "<th>{}</th>", esc(t));
    }
    out.push_str("</tr>");
    for s in nodes {
        let _ = write!(out, "<tr><th>{}</th>", esc(s));
        for t in nodes {
            let Some(c) = cells.get(&(s.clone(), t.clone())) else {
                out.push_str("<td class=\"none\"></td>");
                continue;
            };
            let r = c.record;
            let value = r
                .ttfp_seconds
                .map_or(r.result.as_str().to_string(), |v| format!("{v:.2}s"));
            let (_, ptip) = programming_text(r.programming.as_ref());
            let _ = write!(
                out,
                "<td class=\"cell {result}{stale}\" data-source=\"{s}\" data-target=\"{t}\" data-result=\"{result}\" data-finished=\"{rfc}\" data-age-seconds=\"{age}\" title=\"{id} {kind}: {result}{reason}, finished {utc} ({ago} ago){stale_tip}; programming {ptip}\"><span class=\"v\">{value}</span><br><small class=\"age\">{ago} ago</small>{stale_tag}</td>",
                result = r.result.as_str(),
                stale = if c.stale { " stale" } else { "" },
                s = esc(s),
                t = esc(t),
                rfc = rfc3339(c.finished),
                age = if c.age.is_finite() { c.age.max(0.0).floor() as u64 } else { 0 },
                id = esc(&r.id),
                kind = esc(&r.kind),
                reason = r.reason.map(|x| format!("/{}", x.as_str())).unwrap_or_default(),
                utc = utc_text(c.finished),
                ago = age_text(c.age),
                stale_tip = if c.stale { ", stale" } else { "" },
                ptip = esc(&ptip),
                stale_tag = if c.stale {
                    " <small class=\"stale-tag\">stale</small>"
                } else {
                    ""
                },
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out.push_str("<div class=\"legend\" id=\"matrix-legend\">");
    for r in ProbeResult::ALL {
        let _ = write!(
            out,
            "<span class=\"key\"><span class=\"chip {0}\"></span> {0}</span>",
            r.as_str()
        );
    }
    match lap.stale_after() {
        Some(s) => {
            let _ = write!(
                out,
                "<span class=\"key\" id=\"stale-rule\"><span class=\"chip success stale\"></span> stale: finished more than {STALE_LAPS:.0} laps ago (over {} now, a lap being {}); its nodes have newer results in their row and column</span>",
                age_text(s),
                secs(lap.lap_seconds())
            );
        }
        None => out.push_str("<span class=\"key\" id=\"stale-rule\">stale: not judged until a lap time is known</span>"),
    }
    out.push_str("<span class=\"key\"><span class=\"chip none\"></span> not probed in the recent records</span></div>");
}

/// A table of records, newest first: finish time (UTC) and age, kind, pair, result,
/// TTFP, programming wait, suspects and detail.
fn records_table(
    out: &mut String,
    id: &str,
    rows: &[(&ProbeRecord, f64)],
    now_unix: f64,
    empty: &str,
) {
    let _ = write!(
        out,
        "<table id=\"{id}\"><tr><th>finished (UTC)</th><th>age</th><th>kind</th><th>source → target</th><th>result</th><th>TTFP</th><th title=\"each pod's wait until its own path to its node worked\">programming wait<br>source / target</th><th>suspects</th><th>probe</th><th class=\"l\">detail</th></tr>"
    );
    for (r, t) in rows {
        let suspects: Vec<String> = r
            .suspects
            .iter()
            .map(|s| format!("{}: {}", esc(&s.node), s.signal.as_str()))
            .collect();
        let (ptext, ptip) = programming_text(r.programming.as_ref());
        let _ = write!(
            out,
            "<tr class=\"{result}\"><td title=\"{rfc}\">{time}</td><td class=\"age\">{age} ago</td><td>{kind}</td><td>{src} → {dst}</td><td>{result}{reason}</td><td>{ttfp}</td><td title=\"{ptip}\">{ptext}</td><td class=\"suspects\">{suspects}</td><td>{id}</td><td class=\"l\">{detail}</td></tr>",
            result = r.result.as_str(),
            rfc = rfc3339(*t),
            time = utc_fmt(*t, "%H:%M:%S"),
            age = age_text(now_unix - t),
            kind = esc(&r.kind),
            src = esc(&r.source.node),
            dst = esc(&r.target.node),
            reason = r.reason.map(|x| format!("/{}", x.as_str())).unwrap_or_default(),
            ttfp = secs(r.ttfp_seconds),
            ptip = esc(&ptip),
            suspects = if suspects.is_empty() { "–".into() } else { suspects.join("<br>") },
            id = esc(&r.id),
            detail = esc(r.detail.as_deref().unwrap_or("")),
        );
    }
    if rows.is_empty() {
        let _ = write!(out, "<tr><td colspan=\"10\">{empty}</td></tr>");
    }
    out.push_str("</table>");
}

const CSS: &str = "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1300px}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 6px;font-size:12px;text-align:center}th{background:#eee}.success{background:#c8e6c9}.slow{background:#fff59d}.failed{background:#ef9a9a}.inconclusive{background:#e0e0e0}.none{background:#fff}.l{text-align:left}#latest td,#bad td{white-space:nowrap}#latest td.l,#bad td.l{white-space:normal;min-width:16em}h1{font-size:20px}h2{font-size:16px;margin-top:1.4em}.facts span{margin-right:1.5em}.warn{background:#fff3e0;border-left:4px solid #e65100;padding:4px 8px}#matrix td.cell{min-width:64px}#matrix .v{font-weight:bold}td.stale{background-image:repeating-linear-gradient(135deg,rgba(255,255,255,.75) 0 5px,transparent 5px 10px);color:#333;border:2px dashed #555}.stale-tag{font-weight:bold;text-transform:uppercase;font-size:10px}.legend{font-size:12px;margin:.3em 0 .8em}.legend .key{margin-right:1.2em;white-space:nowrap;display:inline-block}.chip{display:inline-block;width:14px;height:10px;border:1px solid #999;vertical-align:middle}.chip.stale{background-image:repeating-linear-gradient(135deg,rgba(255,255,255,.75) 0 3px,transparent 3px 6px);border:2px dashed #555}.gated{font-size:10px;color:#5c6bc0}footer{margin-top:2em;font-size:12px;color:#555}";

/// The status page (module docs). `records` oldest first, `finished` their finish
/// times (Unix seconds, parallel), `total` the probes recorded since start, `now_unix`
/// the time the page is rendered at. The matrix has one cell per (source, target) node
/// pair seen in the records (the latest, with `data-source`/`data-target`,
/// `data-result`,
/// `data-finished` and `data-age-seconds` attributes and class `stale` past the stale
/// age; the table's `data-stale-after-seconds` is that age), rows and columns the nodes
/// seen and the eligible ones.
pub fn render_status(
    records: &[ProbeRecord],
    finished: &[f64],
    total: u64,
    info: &RunInfo,
    now_unix: f64,
) -> String {
    let lap = LapCheck::new(records, finished, info);
    let cells = cells(records, finished, now_unix, lap.stale_after());
    let mut nodes: BTreeSet<String> = info.eligible_nodes.iter().cloned().collect();
    for r in records {
        nodes.insert(r.source.node.clone());
        nodes.insert(r.target.node.clone());
    }
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>firstpacket status</title><style>{CSS}</style></head><body><h1>firstpacket — time to first packet</h1><p class=\"facts\" id=\"now\">as of <b>{}</b></p>",
        utc_text(now_unix)
    );
    run_facts_html(&mut out, total, info, finished, now_unix, lap.stale_after());
    lap_html(&mut out, &lap, info);
    out.push_str("<h2>TTFP over time</h2>");
    out.push_str(&ttfp_svg(
        records,
        finished,
        info.slow_threshold_seconds,
        &info.drift,
        now_unix,
    ));
    let with_bands = info.drift.values().any(|st| {
        st.baseline
            .is_some_and(|b| b.p50.is_some() && b.p95.is_some())
    });
    out.push_str(&chart_legend(info.slow_threshold_seconds, with_bands));
    out.push_str(&drift_table(info));
    matrix_html(&mut out, &cells, &nodes, &lap);
    let newest: Vec<(&ProbeRecord, f64)> =
        records.iter().zip(finished.iter().copied()).rev().collect();
    out.push_str("<h2>Latest probes</h2>");
    let latest: Vec<_> = newest.iter().take(LATEST_ROWS).copied().collect();
    records_table(
        &mut out,
        "latest",
        &latest,
        now_unix,
        "no probe finished yet",
    );
    out.push_str("<h2>Recent slow and failed probes</h2>");
    let bad: Vec<_> = newest
        .iter()
        .filter(|(r, _)| matches!(r.result, ProbeResult::Slow | ProbeResult::Failed))
        .take(BAD_ROWS)
        .copied()
        .collect();
    records_table(
        &mut out,
        "bad",
        &bad,
        now_unix,
        "none in the recent records",
    );
    out.push_str("<footer>JSON: <a href=\"/api/v1/probes\">/api/v1/probes</a> · metrics: <a href=\"/metrics\">/metrics</a> · internals: <a id=\"debug-link\" href=\"/debug\">/debug</a></footer></body></html>\n");
    out
}

/// The debug page (`GET /debug`): the prober's internals — the sizes of its bounded
/// structures (`info.state_entries`, also `firstpacket_state_entries`), the ring of
/// recent records (`held` of [`RECENT_CAPACITY`]), the probes recorded since start.
pub fn render_debug(held: usize, total: u64, info: &RunInfo, now_unix: f64) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>firstpacket internals</title><style>{CSS}</style></head><body><h1>firstpacket — internals</h1><p class=\"facts\">as of <b>{}</b> · instance <b>{}</b> · lap <b>{}</b> · probes recorded <b>{total}</b> · recent records held <b id=\"held\">{held}</b> of {RECENT_CAPACITY}</p>",
        utc_text(now_unix),
        esc(&info.instance),
        info.lap
    );
    out.push_str("<h2>Bounded state</h2><p>Entries of each bounded in-memory structure (also <code>firstpacket_state_entries{structure}</code>, bounds in <code>firstpacket_state_bound</code>).</p><table id=\"state\"><tr><th>structure</th><th>entries</th></tr>");
    for (k, v) in &info.state_entries {
        let _ = write!(out, "<tr><td class=\"l\">{}</td><td>{v}</td></tr>", esc(k));
    }
    if info.state_entries.is_empty() {
        out.push_str("<tr><td colspan=\"2\">not measured yet</td></tr>");
    }
    out.push_str("</table><footer><a href=\"/\">status page</a> · JSON: <a href=\"/api/v1/probes\">/api/v1/probes</a> · metrics: <a href=\"/metrics\">/metrics</a></footer></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstpacket_report::{ProgrammingMethod, ProgrammingWait};

    /// A record of `src` → `dst` that took `took` seconds from start to record.
    fn rec(id: &str, src: &str, dst: &str, result: ProbeResult, took: f64) -> ProbeRecord {
        let mut r = crate::record::test_record(id, src, dst, result);
        r.ttfp_seconds = matches!(result, ProbeResult::Success | ProbeResult::Slow).then_some(0.25);
        r.reason = None;
        r.timeline.finished = Some(took);
        r
    }

    fn info(nodes: &[&str], interval: f64, concurrency: u32, lap: Option<f64>) -> RunInfo {
        RunInfo {
            instance: "run-abc".into(),
            eligible_nodes: nodes.iter().map(|n| n.to_string()).collect(),
            probe_interval_seconds: interval,
            concurrency,
            lap_seconds: lap,
            slow_threshold_seconds: 1.2,
            ..Default::default()
        }
    }

    /// The `<td>` of the matrix cell `src` → `dst` in `html`.
    fn cell_html<'a>(html: &'a str, src: &str, dst: &str) -> &'a str {
        let key = format!("data-source=\"{src}\" data-target=\"{dst}\"");
        let at = html.find(&key).unwrap_or_else(|| panic!("no cell {key}"));
        let start = html[..at].rfind("<td").expect("td");
        let end = at + html[at..].find("</td>").expect("/td");
        &html[start..end]
    }

    #[test]
    fn ages_read_as_a_person_reads_them_and_times_are_utc() {
        for (s, want) in [
            (0.0, "0s"),
            (59.9, "59s"),
            (60.0, "1m 00s"),
            (422.0, "7m 02s"),
            (3900.0, "1h 05m"),
            (90000.0, "1d 01h"),
            (-5.0, "0s"),
            (f64::NAN, "0s"),
        ] {
            assert_eq!(age_text(s), want, "{s}");
        }
        assert_eq!(utc_text(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_text(1_764_877_212.4), "2025-12-04 19:40:12 UTC");
        assert_eq!(rfc3339(1_764_877_212.0), "2025-12-04T19:40:12Z");
        assert_eq!(utc_text(f64::INFINITY), "?");
    }

    #[test]
    fn an_interval_that_concurrency_and_probe_duration_cannot_meet_is_warned_with_the_fix() {
        // 4 nodes, a probe every 1 s planned, 3 at a time, but each takes 10 s (hold
        // and give-up): at best one start every 3.33 s, a lap of at least 13.3 s.
        let records: Vec<ProbeRecord> = (0..25)
            .map(|i| rec(&format!("p{i}"), "a", "b", ProbeResult::Failed, 10.0))
            .collect();
        let finished: Vec<f64> = (0..25).map(|i| 1000.0 + 3.5 * f64::from(i)).collect();
        let lap = LapCheck::new(
            &records,
            &finished,
            &info(&["a", "b", "c", "d"], 1.0, 3, Some(14.0)),
        );
        assert_eq!(lap.sample, LAP_SAMPLE);
        assert_eq!(lap.planned, Some(4.0));
        assert!((lap.mean_probe.unwrap() - 10.0).abs() < 1e-9, "{lap:?}");
        assert!((lap.mean_start_gap.unwrap() - 3.5).abs() < 1e-9, "{lap:?}");
        assert!((lap.min_start_gap.unwrap() - 10.0 / 3.0).abs() < 1e-9);
        assert!((lap.allowed.unwrap() - 40.0 / 3.0).abs() < 1e-9);
        assert!(lap.interval_unmet);
        // The longer of measured (14 s) and allowed (13.3 s); stale after two of them.
        assert_eq!(lap.lap_seconds(), Some(14.0));
        assert_eq!(lap.stale_after(), Some(28.0));
        let w = lap.warning().expect("warning");
        for want in [
            "--probe-interval 1.0s cannot be met",
            "10.0 s on average (last 20 probes",
            "every 3.3 s",
            "measured: every 3.5 s",
            "at least 13.3 s, not the planned 4.0 s",
            "--concurrency 10 or more",
            "--probe-interval to 3.3s or more",
        ] {
            assert!(w.contains(want), "{want:?} not in {w}");
        }
        let html = render_status(&records, &finished, 25, &lap_info(), 1090.0);
        assert!(html.contains("id=\"lap-warning\""), "{html}");

        // 2 s probes, 3 at a time: one start every 0.67 s is possible — no warning, and
        // the lap the probes allow is the planned one.
        let quick: Vec<ProbeRecord> = (0..5)
            .map(|i| rec(&format!("q{i}"), "a", "b", ProbeResult::Success, 2.0))
            .collect();
        let at: Vec<f64> = (0..5).map(|i| 10.0 + f64::from(i)).collect();
        let lap = LapCheck::new(&quick, &at, &info(&["a", "b", "c", "d"], 1.0, 3, None));
        assert!(!lap.interval_unmet && lap.warning().is_none(), "{lap:?}");
        assert_eq!(lap.allowed, Some(4.0));
        assert_eq!(lap.stale_after(), Some(8.0));
        let html = render_status(
            &quick,
            &at,
            5,
            &info(&["a", "b", "c", "d"], 1.0, 3, None),
            15.0,
        );
        assert!(!html.contains("id=\"lap-warning\""));

        // Under 3 records: nothing measured, the planned lap until a lap is timed.
        let lap = LapCheck::new(&quick[..2], &at[..2], &info(&["a", "b"], 5.0, 1, None));
        assert_eq!((lap.mean_probe, lap.warning()), (None, None));
        assert_eq!(lap.lap_seconds(), Some(10.0));
        let lap = LapCheck::new(&[], &[], &info(&[], 5.0, 1, None));
        assert_eq!(lap.stale_after(), None);
    }

    fn lap_info() -> RunInfo {
        info(&["a", "b", "c", "d"], 1.0, 3, Some(14.0))
    }

    #[test]
    fn matrix_cells_show_utc_and_age_and_only_those_older_than_two_laps_are_stale() {
        // A measured lap of 10 s (probes take 0.5 s: the measured lap decides): stale
        // after 20 s.
        let records = vec![
            rec("old-ok", "n1", "n2", ProbeResult::Success, 0.5),
            rec("fresh-fail", "n2", "n1", ProbeResult::Failed, 0.5),
            rec("edge", "n1", "n3", ProbeResult::Success, 0.5),
            rec("newer", "n3", "n1", ProbeResult::Slow, 0.5),
            rec("older", "n3", "n1", ProbeResult::Success, 0.5),
        ];
        let now = 1_764_877_212.0;
        let finished = [now - 422.0, now - 12.0, now - 20.0, now - 3.0, now - 30.0];
        let info = info(&["n1", "n2", "n3"], 1.0, 3, Some(10.0));
        let lap = LapCheck::new(&records, &finished, &info);
        assert_eq!(lap.stale_after(), Some(20.0));
        let cells = cells(&records, &finished, now, lap.stale_after());
        let c = |s: &str, t: &str| cells[&(s.to_string(), t.to_string())];
        assert!(c("n1", "n2").stale && (c("n1", "n2").age - 422.0).abs() < 1e-6);
        assert!(!c("n2", "n1").stale);
        assert!(
            !c("n1", "n3").stale,
            "exactly two laps old is not yet stale"
        );
        // The latest by finish time, not by position in the ring.
        assert_eq!(c("n3", "n1").record.id, "newer");

        let html = render_status(&records, &finished, 5, &info, now);
        let old = cell_html(&html, "n1", "n2");
        assert!(old.contains("class=\"cell success stale\""), "{old}");
        assert!(
            old.contains("7m 02s ago") && old.contains(">stale<"),
            "{old}"
        );
        assert!(
            old.contains("data-finished=\"2025-12-04T19:33:10Z\""),
            "{old}"
        );
        assert!(old.contains("finished 2025-12-04 19:33:10 UTC"), "{old}");
        let failed = cell_html(&html, "n2", "n1");
        assert!(failed.contains("class=\"cell failed\""), "{failed}");
        assert!(failed.contains("data-age-seconds=\"12\"") && failed.contains("12s ago"));
        assert!(!failed.contains("stale"), "{failed}");
        assert_eq!(html.matches("class=\"cell ").count(), 4);
        assert!(html.contains("id=\"stale-rule\""), "{html}");
        assert!(html.contains("id=\"matrix\" data-stale-after-seconds=\"20.0\""));
        assert!(html.contains("more than 2 laps ago (over 20s now, a lap being 10.000s)"));
        assert!(html.contains("as of <b>2025-12-04 19:40:12 UTC</b>"));
        assert!(html.contains("last probe finished <b>2025-12-04 19:40:09 UTC</b> (3s ago)"));

        // The prober stopped: the last probe is older than two laps.
        let html = render_status(&records, &finished, 5, &info, now + 60.0);
        assert!(
            html.contains("class=\"facts warn\" id=\"last-probe\""),
            "{html}"
        );
        assert!(cell_html(&html, "n2", "n1").contains(" stale\""));
    }

    #[test]
    fn the_chart_has_a_utc_time_axis_up_to_now_a_legend_and_the_programming_wait() {
        let wait = |s: f64| ProgrammingWait {
            method: ProgrammingMethod::NodeDial,
            wait_seconds: s,
            resolution_seconds: 0.1,
            over_threshold: false,
        };
        let mut gated = rec("g", "n1", "n2", ProbeResult::Success, 3.0);
        gated.programming = Some(ProbeProgramming {
            source: Some(wait(0.42)),
            target: Some(wait(2.5)),
            readiness_gated: Some(true),
        });
        let records = vec![gated, rec("f", "n2", "n1", ProbeResult::Failed, 9.0)];
        let t0 = 1_764_877_200.0; // 19:40:00
        let finished = [t0, t0 + 40.0];
        let now = t0 + 100.0;
        let svg = ttfp_svg(&records, &finished, 1.2, &BTreeMap::new(), now);
        // 100 s span: a tick every 15 s, labelled in UTC, from 19:40:00 to 19:41:30.
        assert_eq!(time_step(100.0), 15.0);
        for tick in ["19:40:00", "19:40:15", "19:41:30"] {
            assert!(svg.contains(&format!(">{tick}</text>")), "{tick}: {svg}");
        }
        assert!(!svg.contains(">19:41:45</text>"), "ticks stop at now");
        assert!(svg.contains("probe finish time (UTC, 2025-12-04), last 1m 40s"));
        assert!(svg.contains(">now</text>"));
        // The gated probe's 2.5 s programming wait is drawn and sets the value axis.
        assert!(svg.contains("class=\"pw\""), "{svg}");
        assert!(svg.contains("programming wait 2.500s"));
        assert!(
            svg.contains(">3.00s</text>") && !svg.contains(">4.00s</text>"),
            "{svg}"
        );
        assert_eq!(value_step(2.5), 1.0);
        assert_eq!(value_step(1.44), 0.5);
        assert_eq!(value_step(9.0), 2.5);
        assert!(svg.contains("class=\"pt failed\""));
        assert_eq!(time_step(7200.0), 900.0);

        let html = render_status(
            &records,
            &finished,
            2,
            &info(&["n1", "n2"], 1.0, 2, None),
            now,
        );
        let legend = &html[html.find("id=\"chart-legend\"").expect("legend")..];
        let legend = &legend[..legend.find("</div>").expect("end")];
        for key in [
            "success",
            "slow",
            "failed",
            "inconclusive",
            "no TTFP",
            "programming wait",
            "slow threshold (1.20s)",
        ] {
            assert!(legend.contains(key), "{key} not in the legend: {legend}");
        }
        assert!(
            !legend.contains("baseline"),
            "no band drawn, none in the legend"
        );
        // The programming wait next to TTFP in the tables.
        assert!(
            html.contains("0.42s / 2.50s <span class=\"gated\">gated</span>"),
            "{html}"
        );
        assert!(html.contains("source: 0.420s (node_dial, ±0.1s)"));
        // Self-contained, no scripts.
        assert!(
            !html.contains("<script") && !html.contains("http://") && !html.contains("https://")
        );
    }

    #[test]
    fn internals_are_on_the_debug_page_linked_from_the_status_page() {
        let mut info = info(&["n1"], 1.0, 1, None);
        info.state_entries.insert("recent_records".into(), 7);
        info.state_entries.insert("pending_blames".into(), 0);
        let status = render_status(&[], &[], 0, &info, 0.0);
        assert!(!status.contains("Bounded state") && !status.contains("recent_records"));
        assert!(status.contains("href=\"/debug\""));
        let debug = render_debug(7, 9, &info, 0.0);
        assert!(debug.contains("<h2>Bounded state</h2>"));
        assert!(
            debug.contains("<td class=\"l\">recent_records</td><td>7</td>"),
            "{debug}"
        );
        assert!(debug.contains("id=\"held\">7</b> of 500"));
        assert!(debug.contains("href=\"/\""));
    }

    #[test]
    fn status_page_has_a_cell_per_pair_the_chart_and_the_tables() {
        let mut records = vec![
            rec("x-1", "n1", "n2", ProbeResult::Success, 1.0),
            rec("x-2", "n2", "n1", ProbeResult::Slow, 1.0),
            rec("x-3", "n1", "n3", ProbeResult::Failed, 1.0),
        ];
        records[1].ttfp_seconds = Some(7.5);
        let info = RunInfo {
            lap_seconds: Some(12.5),
            ..info(&["n1", "n2", "n3"], 1.0, 3, None)
        };
        let html = render_status(&records, &[1.0, 2.0, 3.0], 3, &info, 4.0);
        for (s, t) in [("n1", "n2"), ("n2", "n1"), ("n1", "n3")] {
            assert!(
                html.contains(&format!("data-source=\"{s}\" data-target=\"{t}\"")),
                "{s}->{t}"
            );
        }
        assert_eq!(html.matches("class=\"cell ").count(), 3);
        assert!(html.contains("<svg") && html.contains("id=\"lap-seconds\">12.500s<"));
        let bad = &html[html.find("id=\"bad\"").expect("bad table")..];
        assert!(bad.contains("x-2") && bad.contains("x-3") && !bad.contains("x-1"));
        let latest = &html
            [html.find("id=\"latest\"").expect("latest")..html.find("id=\"bad\"").expect("bad")];
        assert!(latest.find("x-3") < latest.find("x-1"), "newest first");
        assert!(
            latest.contains(
                "<td title=\"1970-01-01T00:00:03Z\">00:00:03</td><td class=\"age\">1s ago</td>"
            ),
            "{latest}"
        );
    }
}
