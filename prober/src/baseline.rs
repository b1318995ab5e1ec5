//! Learned TTFP baseline and drift (docs/design.md §4 "Baseline & drift"). Pure: probe
//! records and wall-clock times in, baselines, drift and snapshots out; no I/O.
//!
//! The alarm is relative: healthy clusters differ (the testbed's normal is 0.2–0.6 s,
//! many real clusters' 1–2 s), so a fixed threshold either misses a cluster that got
//! 1–3 s slower or pages on one whose normal is slow. [`Baselines`] learns each
//! cluster's own normal and says when the recent TTFP drifts off it.
//!
//! **Series.** One per probe kind and one per node (a node's probes in either role: N
//! series, never N² pairs). A probe feeds its kind's series and the series of its source
//! and target node (once when they are the same node).
//!
//! **Samples.** Probes with a TTFP whose result is `success` or `slow` (the recent
//! window must see slow probes: they are the drift); `failed` and `inconclusive` probes
//! are counted elsewhere. A sample's value is the probe's TTFP, or the longer of its
//! pods' programming waits when that is longer (issue 29): on a CNI that gates
//! readiness (Calico) a slow agent shows as a late Ready with TTFP near 0, on one that
//! does not as TTFP, and the drift must see it in both places. Only `success` samples taken while the series was not
//! drifting may enter the baseline.
//!
//! **Windows** (wall-clock finish times, because the baseline is persisted and must
//! survive a restart; a clock step only moves the window edges): the *recent* window is
//! the last `recent_window`; the *baseline* window is the `baseline_window` before it
//! (`[now − recent − baseline, now − recent)`), so a drift in progress is never part of
//! the baseline it is compared with.
//!
//! **Drift** of a series, evaluated after each probe it gets:
//! `ratio = recent median / max(baseline median, dial interval)` (the dial interval is
//! the measurement's resolution: healthy testbed medians are near 0 s, and a ratio over
//! a near-zero median means nothing), and it is *active* when
//! `ratio ≥ drift_ratio` **and** `recent median − baseline median > drift_floor` **and**
//! the baseline has `min_samples` samples (or a static baseline is set) **and** the
//! recent window has [`RECENT_MIN_SAMPLES`]. The floor decides on healthy clusters (a
//! median moving from 0.05 s to 0.2 s quadruples without meaning anything); the ratio
//! decides on slow ones (1.5 s → 2 s is normal jitter at a 1–2 s normal).
//!
//! While a series' drift is active, its samples stay out of the baseline; when it turns
//! active, the samples already in its recent window (the ones that made it drift) are
//! taken out too. So the baseline after an episode is the baseline before it.
//!
//! **Per-node attribution.** A probe's TTFP is set by the slower of its two endpoints
//! (both must be programmed), so a healthy node probed with slow peers has slow probes
//! too. A node's recent value is therefore its *best peer's* recent median, per role:
//! its recent samples as source grouped by the target node (itself for `same_node`),
//! the median of each group, the lowest of those, against the node's baseline as
//! source; the same as target against its baseline as target (each role needs half of
//! `min_samples`); the role that drifts more stands for the node. A slow node is slow with every peer; a
//! healthy node is fast with at least one healthy peer in each role once it met one.
//! Per role, because a target's late programming is partly masked (the source starts
//! only once the target is Ready, docs/design.md §2 step 6): a node slow to program its
//! endpoints shows fully as a source, less as a target. (When every peer a node met
//! recently in a role was slow, it cannot be told apart from them and drifts with them.)
//!
//! A node gets about 2/N of the probes, so its value in a role rests on a few of them,
//! and a healthy cluster whose TTFPs spread widely (a 1–2 s program delay gives
//! 0.1–2 s after Ready) moved it past ratio and floor by chance. A node's role
//! therefore also needs [`ROLE_RECENT_MIN_SAMPLES`] recent probes and a value above its
//! baseline p90 (out of its normal spread). In the unit test
//! `a_widely_spread_healthy_normal_rarely_marks_a_node` (it prints its count) 119 of
//! 1 100 probes marked a healthy node with ratio and floor alone (the previous rule), 2
//! with the guards; a node made slow as in S5 is still marked within a few probes
//! (prober/tests/engine_baseline.rs).
//!
//! The best-peer rule also judges nodes in the gate's baseline comparison
//! ([`compare`]), without those two guards: a gate probes every node in both roles.
//!
//! **Static baseline** (`--baseline-ttfp D`): every series' baseline quantiles are `D`
//! from the start; the recent window and the thresholds work as above.
//!
//! **Memory** (crate `bounds` table, `baseline_samples`): at most
//! [`KIND_CAPACITY`] samples per kind and [`NODE_CAPACITY`] per node, the oldest dropped
//! first; a node's series goes when the node leaves ([`Baselines::forget_node`]).
//!
//! **Persistence**: [`Baselines::snapshot`] / [`Baselines::restore`], the baseline-eligible
//! samples only, at most [`SNAPSHOT_MAX_SAMPLES`] (newest kept per series, kinds first),
//! in a compact JSON a ConfigMap holds (well under its 1 MiB limit,
//! <https://kubernetes.io/docs/concepts/configuration/configmap/#motivation>).

use crate::stats::nearest_rank;
use firstpacket_report::{ProbeRecord, ProbeResult};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Samples kept per kind series (≈ 1.4 days at the default 30 s probe interval with
/// one kind: more than the default 24 h baseline window).
pub const KIND_CAPACITY: usize = 4096;

/// Samples kept per node series. Each probe feeds two node series, so with N nodes a
/// node gets about 2/N of the probes: 256 covers the default 24 h window from ~23
/// nodes up at a 30 s interval (at 1 000 nodes a node is probed ~6 times a day); on
/// smaller clusters a node's baseline is its last 256 probes. 32 bytes a sample: at
/// most 8 MiB at 1 000 nodes with every node series full.
pub const NODE_CAPACITY: usize = 256;

/// Samples the recent window needs before drift is reported (a node's probes in both
/// roles together): one odd probe never makes a median of 3 drift.
pub const RECENT_MIN_SAMPLES: usize = 3;

/// Recent samples a node's role needs before it can decide the node's drift (module
/// docs, "Per-node attribution").
pub const ROLE_RECENT_MIN_SAMPLES: usize = 2;

/// Samples a snapshot (the persisted baseline) holds at most: at ~14 bytes of JSON a
/// sample, ≤ ~700 KiB, under a ConfigMap's 1 MiB.
pub const SNAPSHOT_MAX_SAMPLES: usize = 50_000;

/// Seconds a restored sample may be dated after this prober's clock (replicas' clocks
/// differ by a little; more is a clock that ran ahead, or a forged snapshot).
pub const RESTORE_FUTURE_SLACK: f64 = 60.0;

/// Version of [`Snapshot`].
pub const SNAPSHOT_VERSION: u32 = 1;

/// The quantiles exported and saved: p50, p90, p95.
pub const QUANTILES: [(&str, f64); 3] = [("0.5", 0.5), ("0.9", 0.9), ("0.95", 0.95)];

/// Settings of the baseline and drift (flags `--baseline-window`, `--recent-window`,
/// `--baseline-min-samples`, `--drift-ratio`, `--drift-floor`, `--baseline-ttfp`,
/// `--dial-interval`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DriftConfig {
    /// Length of the baseline window before the recent window.
    pub baseline_window: Duration,
    /// Length of the recent window.
    pub recent_window: Duration,
    /// Baseline samples needed before any drift is reported.
    pub min_samples: usize,
    /// Ratio threshold (recent median / max(baseline median, dial interval)).
    pub ratio: f64,
    /// Absolute floor, seconds: recent median − baseline median must exceed it.
    pub floor: f64,
    /// `--dial-interval`, seconds: the smallest baseline the ratio divides by.
    pub dial_interval: f64,
    /// `--baseline-ttfp`, seconds: a static baseline instead of the learned one.
    pub static_baseline: Option<f64>,
}

/// One stored sample.
#[derive(Debug, Clone)]
struct Sample {
    /// Wall-clock finish time, Unix seconds.
    t: f64,
    /// TTFP, seconds (f32: µs precision is plenty, and it keeps a sample at 32 bytes).
    ttfp: f32,
    /// May enter the baseline (a `success` taken while the series did not drift).
    eligible: bool,
    /// Node series: the node was the probe's source (else its target).
    as_source: bool,
    /// The other node of the probe (node series only; the node itself for same-node).
    peer: Option<Arc<str>>,
}

#[derive(Debug, Clone, Default)]
struct Series {
    samples: VecDeque<Sample>,
    active: bool,
}

/// Baseline quantiles of one series, seconds, and the samples they come from.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Quantiles {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 95th percentile.
    pub p95: Option<f64>,
    /// Samples.
    pub n: u64,
}

impl Quantiles {
    /// Nearest-rank quantiles of `values` (crate `stats`).
    pub fn of(values: &[f64]) -> Quantiles {
        Quantiles {
            p50: nearest_rank(values, 0.5),
            p90: nearest_rank(values, 0.9),
            p95: nearest_rank(values, 0.95),
            n: values.len() as u64,
        }
    }

    /// The quantile named `0.5`, `0.9` or `0.95` (also `p50`, `p90`, `p95`).
    pub fn get(&self, q: &str) -> Option<f64> {
        match q {
            "0.5" | "p50" => self.p50,
            "0.9" | "p90" => self.p90,
            "0.95" | "p95" => self.p95,
            _ => None,
        }
    }
}

/// The drift state of one series now.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct DriftStatus {
    /// Baseline quantiles (the static value for all three with `--baseline-ttfp`);
    /// `None` until the baseline has `min_samples` (never with a static baseline).
    pub baseline: Option<Quantiles>,
    /// Baseline-eligible samples in the baseline window.
    pub baseline_samples: u64,
    /// Median of the recent window (the best peer's, for a node), `None` when empty.
    pub recent_median: Option<f64>,
    /// Samples in the recent window.
    pub recent_samples: u64,
    /// recent median / max(baseline median, dial interval); `None` until both exist.
    pub ratio: Option<f64>,
    /// Ratio and floor passed with enough samples.
    pub active: bool,
    /// For a node: the peer whose probes gave `recent_median`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_peer: Option<String>,
}

/// What a probe counted as ([`Baselines::observe`]), the record's `drift` field.
pub type DriftMark = firstpacket_report::DriftMark;

/// Learned baselines of every kind and node (module docs).
#[derive(Debug, Clone)]
pub struct Baselines {
    cfg: DriftConfig,
    kinds: BTreeMap<String, Series>,
    nodes: BTreeMap<String, Series>,
    /// Shared node-name strings for the samples' `peer`.
    names: BTreeMap<String, Arc<str>>,
    /// Samples added since creation (tells a writer whether anything was learned).
    added: u64,
}

/// The persisted baseline: per series `[t, ttfp]` pairs (Unix seconds rounded to 0.1 s,
/// seconds rounded to 1 ms), baseline-eligible samples only.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`SNAPSHOT_VERSION`].
    pub version: u32,
    /// Unix seconds the snapshot was taken.
    pub saved_at: f64,
    /// Per kind.
    pub kinds: BTreeMap<String, Vec<[f64; 2]>>,
    /// Per node, its probes as source.
    pub nodes: BTreeMap<String, Vec<[f64; 2]>>,
    /// Per node, its probes as target.
    #[serde(default)]
    pub nodes_as_target: BTreeMap<String, Vec<[f64; 2]>>,
}

/// A stored TTFP back in seconds, rounded to the microsecond (the f32's last bits are
/// noise, not measurement).
fn us(x: f32) -> f64 {
    (f64::from(x) * 1e6).round() / 1e6
}

fn median(v: &[f64]) -> Option<f64> {
    nearest_rank(v, 0.5)
}

impl Baselines {
    /// Empty baselines under `cfg`.
    pub fn new(cfg: DriftConfig) -> Baselines {
        Baselines {
            cfg,
            kinds: BTreeMap::new(),
            nodes: BTreeMap::new(),
            names: BTreeMap::new(),
            added: 0,
        }
    }

    /// Samples added by [`Baselines::observe`] since creation.
    pub fn added(&self) -> u64 {
        self.added
    }

    /// The settings.
    pub fn config(&self) -> &DriftConfig {
        &self.cfg
    }

    fn name(&mut self, n: &str) -> Arc<str> {
        self.names
            .entry(n.to_string())
            .or_insert_with(|| Arc::from(n))
            .clone()
    }

    /// Feeds one finished probe at wall time `now` (Unix seconds) and returns what it
    /// counted as: whether its kind's drift, and which of its nodes' drift, was active
    /// once it was added. Probes without a TTFP, or not `success`/`slow`, change nothing
    /// and count as no drift.
    pub fn observe(&mut self, rec: &ProbeRecord, now: f64) -> DriftMark {
        let Some(ttfp) = new_pod_delay(rec) else {
            return DriftMark::default();
        };
        if !matches!(rec.result, ProbeResult::Success | ProbeResult::Slow) {
            return DriftMark::default();
        }
        let eligible = rec.result == ProbeResult::Success;
        let cfg = self.cfg;
        self.added += 1;
        let kind_series = self.kinds.entry(rec.kind.clone()).or_default();
        push(kind_series, now, ttfp, eligible, None, KIND_CAPACITY, &cfg);
        let kind_active = update(kind_series, now, &cfg, false);
        let mut ends = vec![(rec.source.node.clone(), rec.target.node.clone(), true)];
        if rec.source.node != rec.target.node {
            ends.push((rec.target.node.clone(), rec.source.node.clone(), false));
        }
        let mut nodes = Vec::new();
        for (node, peer, as_source) in ends {
            let peer = self.name(&peer);
            let s = self.nodes.entry(node.clone()).or_default();
            push(
                s,
                now,
                ttfp,
                eligible,
                Some((peer, as_source)),
                NODE_CAPACITY,
                &cfg,
            );
            if update(s, now, &cfg, true) {
                nodes.push(node);
            }
        }
        DriftMark {
            counted: kind_active || !nodes.is_empty(),
            kind: kind_active,
            nodes,
        }
    }

    /// The state of every kind series now (kinds never seen are absent).
    pub fn kinds(&self, now: f64) -> BTreeMap<String, DriftStatus> {
        self.kinds
            .iter()
            .map(|(k, s)| (k.clone(), status(s, now, &self.cfg, false)))
            .collect()
    }

    /// The state of kind `kind` now (an empty series when never seen).
    pub fn kind(&self, kind: &str, now: f64) -> DriftStatus {
        match self.kinds.get(kind) {
            Some(s) => status(s, now, &self.cfg, false),
            None => status(&Series::default(), now, &self.cfg, false),
        }
    }

    /// The state of every node series now.
    pub fn nodes(&self, now: f64) -> BTreeMap<String, DriftStatus> {
        self.nodes
            .iter()
            .map(|(k, s)| (k.clone(), status(s, now, &self.cfg, true)))
            .collect()
    }

    /// Drops `node`'s series (it left the cluster or the selector); its samples in
    /// kind series stay.
    pub fn forget_node(&mut self, node: &str) {
        self.nodes.remove(node);
        self.names.remove(node);
    }

    /// Samples held in all series (the `baseline_samples` structure's size).
    pub fn len(&self) -> usize {
        self.kinds
            .values()
            .chain(self.nodes.values())
            .map(|s| s.samples.len())
            .sum()
    }

    /// No sample held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The baseline-eligible samples within the windows at `now`, newest kept per
    /// series when more than [`SNAPSHOT_MAX_SAMPLES`] (kinds first, then nodes sharing
    /// what is left equally).
    pub fn snapshot(&self, now: f64) -> Snapshot {
        let oldest =
            now - self.cfg.recent_window.as_secs_f64() - self.cfg.baseline_window.as_secs_f64();
        let pick = |s: &Series, cap: usize, role: Option<bool>| -> Vec<[f64; 2]> {
            let v: Vec<[f64; 2]> = s
                .samples
                .iter()
                .filter(|x| x.eligible && x.t >= oldest && role.is_none_or(|r| x.as_source == r))
                .map(|x| {
                    [
                        (x.t * 10.0).round() / 10.0,
                        (us(x.ttfp) * 1000.0).round() / 1000.0,
                    ]
                })
                .collect();
            let skip = v.len().saturating_sub(cap);
            v[skip..].to_vec()
        };
        let mut left = SNAPSHOT_MAX_SAMPLES;
        let mut kinds = BTreeMap::new();
        for (k, s) in &self.kinds {
            let v = pick(s, left, None);
            left -= v.len();
            kinds.insert(k.clone(), v);
        }
        let per_role = if self.nodes.is_empty() {
            0
        } else {
            left / (2 * self.nodes.len())
        };
        let role = |r: bool| -> BTreeMap<String, Vec<[f64; 2]>> {
            self.nodes
                .iter()
                .map(|(k, s)| (k.clone(), pick(s, per_role, Some(r))))
                .collect()
        };
        Snapshot {
            version: SNAPSHOT_VERSION,
            saved_at: now,
            kinds,
            nodes: role(true),
            nodes_as_target: role(false),
        }
    }

    /// Adds the samples of a snapshot (a restart, or a new leader taking over) in front
    /// of what is held: samples older than the windows at `now`, samples dated more than
    /// [`RESTORE_FUTURE_SLACK`] after `now` (a writer whose clock ran ahead: they would sit
    /// in the recent window as drift for as long), non-finite values and samples newer
    /// than the oldest held of the same series are skipped. Returns the
    /// samples taken. Errors: a snapshot of another version (nothing taken).
    pub fn restore(&mut self, snap: &Snapshot, now: f64) -> Result<usize, String> {
        if snap.version != SNAPSHOT_VERSION {
            return Err(format!(
                "baseline snapshot version {} (this prober reads {SNAPSHOT_VERSION})",
                snap.version
            ));
        }
        let oldest =
            now - self.cfg.recent_window.as_secs_f64() - self.cfg.baseline_window.as_secs_f64();
        let mut taken = 0;
        let mut fill = |series: &mut Series, v: &[(&[f64; 2], bool)], cap: usize| {
            let first = series.samples.front().map_or(f64::INFINITY, |s| s.t);
            let mut add: Vec<Sample> = v
                .iter()
                .filter(|([t, x], _)| {
                    t.is_finite()
                        && x.is_finite()
                        && *x >= 0.0
                        && *t >= oldest
                        && *t <= now + RESTORE_FUTURE_SLACK
                        && *t < first
                })
                .map(|([t, x], as_source)| Sample {
                    t: *t,
                    ttfp: *x as f32,
                    eligible: true,
                    as_source: *as_source,
                    peer: None,
                })
                .collect();
            add.sort_by(|a, b| a.t.total_cmp(&b.t));
            let room = cap.saturating_sub(series.samples.len());
            let skip = add.len().saturating_sub(room);
            for s in add.drain(skip..).rev() {
                series.samples.push_front(s);
                taken += 1;
            }
        };
        for (k, v) in &snap.kinds {
            let v: Vec<(&[f64; 2], bool)> = v.iter().map(|x| (x, true)).collect();
            fill(self.kinds.entry(k.clone()).or_default(), &v, KIND_CAPACITY);
        }
        let names: BTreeSet<&String> = snap
            .nodes
            .keys()
            .chain(snap.nodes_as_target.keys())
            .collect();
        for k in names {
            let mut v: Vec<(&[f64; 2], bool)> = Vec::new();
            v.extend(snap.nodes.get(k).into_iter().flatten().map(|x| (x, true)));
            v.extend(
                snap.nodes_as_target
                    .get(k)
                    .into_iter()
                    .flatten()
                    .map(|x| (x, false)),
            );
            fill(self.nodes.entry(k.clone()).or_default(), &v, NODE_CAPACITY);
        }
        Ok(taken)
    }
}

/// A probe's sample value (seconds): its TTFP, or the longer of its pods' programming
/// waits when that is longer — the new pod's delay wherever the CNI put it (issue 29):
/// on a CNI that gates readiness (Calico) a slow agent delays Ready and leaves TTFP
/// near 0, on one that does not the same delay is TTFP. `None` without a finite,
/// non-negative TTFP.
fn new_pod_delay(rec: &ProbeRecord) -> Option<f64> {
    let ttfp = rec.ttfp_seconds.filter(|t| t.is_finite() && *t >= 0.0)?;
    let wait = rec
        .programming
        .iter()
        .flat_map(|g| g.waits())
        .fold(0.0_f64, f64::max);
    Some(ttfp.max(wait))
}

fn push(
    s: &mut Series,
    now: f64,
    ttfp: f64,
    eligible: bool,
    peer: Option<(Arc<str>, bool)>,
    cap: usize,
    cfg: &DriftConfig,
) {
    let eligible = eligible && !s.active;
    let as_source = peer.as_ref().is_none_or(|p| p.1);
    s.samples.push_back(Sample {
        t: now,
        ttfp: ttfp as f32,
        eligible,
        as_source,
        peer: peer.map(|p| p.0),
    });
    let oldest = now - cfg.recent_window.as_secs_f64() - cfg.baseline_window.as_secs_f64();
    while s.samples.len() > cap || s.samples.front().is_some_and(|x| x.t < oldest) {
        s.samples.pop_front();
    }
}

/// Re-evaluates `s` after a new sample; when it turns (or stays) active, its recent
/// samples leave the baseline. Returns whether it is active.
fn update(s: &mut Series, now: f64, cfg: &DriftConfig, by_peer: bool) -> bool {
    let st = status(s, now, cfg, by_peer);
    s.active = st.active;
    if st.active {
        let recent_from = now - cfg.recent_window.as_secs_f64();
        for x in s.samples.iter_mut().rev() {
            if x.t < recent_from {
                break;
            }
            x.eligible = false;
        }
    }
    st.active
}

/// The recent value of a series: its median, or (`by_peer`) the best-peer value of
/// [`best_of`] over (role, peer) groups, and that peer.
fn recent_value(recent: &[&Sample], by_peer: bool) -> (Option<f64>, Option<String>) {
    if !by_peer {
        let v: Vec<f64> = recent.iter().map(|s| us(s.ttfp)).collect();
        return (median(&v), None);
    }
    let mut groups: BTreeMap<(bool, &str), Vec<f64>> = BTreeMap::new();
    for s in recent {
        groups
            .entry((s.as_source, s.peer.as_deref().unwrap_or("")))
            .or_default()
            .push(us(s.ttfp));
    }
    // One role here (the caller splits them): the lowest per-peer median.
    best_of(&groups, 0.5).map_or((None, None), |(m, p)| (Some(m), Some(p.to_string())))
}

/// Per role (`true` = as source), the lowest per-peer quantile `q`; then the higher of
/// the two roles (module docs, "Per-node attribution"), with its peer.
fn best_of<'a>(groups: &BTreeMap<(bool, &'a str), Vec<f64>>, q: f64) -> Option<(f64, &'a str)> {
    [true, false]
        .into_iter()
        .filter_map(|role| {
            groups
                .iter()
                .filter(|((r, _), _)| *r == role)
                .filter_map(|((_, p), v)| nearest_rank(v, q).map(|x| (x, *p)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

fn status(s: &Series, now: f64, cfg: &DriftConfig, by_peer: bool) -> DriftStatus {
    if !by_peer {
        return eval(
            s.samples.iter(),
            now,
            cfg,
            cfg.min_samples,
            RECENT_MIN_SAMPLES,
            false,
        );
    }
    // A node: each role against its own baseline (a target's TTFPs are partly masked,
    // so the roles' normals differ), the role that drifts more decides.
    let min = cfg.min_samples.div_ceil(2);
    let roles: Vec<DriftStatus> = [true, false]
        .into_iter()
        .map(|role| {
            eval(
                s.samples.iter().filter(|x| x.as_source == role),
                now,
                cfg,
                min,
                ROLE_RECENT_MIN_SAMPLES,
                true,
            )
        })
        .collect();
    let (baseline_samples, recent_samples) = roles.iter().fold((0, 0), |a, r| {
        (a.0 + r.baseline_samples, a.1 + r.recent_samples)
    });
    let mut pick = roles
        .into_iter()
        .max_by(|a, b| {
            (
                a.active,
                a.ratio.unwrap_or(f64::NEG_INFINITY),
                a.baseline.is_some(),
            )
                .partial_cmp(&(
                    b.active,
                    b.ratio.unwrap_or(f64::NEG_INFINITY),
                    b.baseline.is_some(),
                ))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .unwrap_or_default();
    pick.baseline_samples = baseline_samples;
    pick.recent_samples = recent_samples;
    // The recent minimum counts the node's probes in both roles.
    pick.active &= recent_samples >= RECENT_MIN_SAMPLES as u64;
    pick
}

/// Baseline and drift of `samples` (one kind, or one role of a node with `by_peer`).
fn eval<'a>(
    samples: impl Iterator<Item = &'a Sample>,
    now: f64,
    cfg: &DriftConfig,
    min_samples: usize,
    recent_min: usize,
    by_peer: bool,
) -> DriftStatus {
    let recent_from = now - cfg.recent_window.as_secs_f64();
    let base_from = recent_from - cfg.baseline_window.as_secs_f64();
    let mut base: Vec<f64> = Vec::new();
    let mut recent: Vec<&Sample> = Vec::new();
    for x in samples {
        if x.t >= recent_from {
            recent.push(x);
        } else if x.eligible && x.t >= base_from {
            base.push(us(x.ttfp));
        }
    }
    let baseline = match cfg.static_baseline {
        Some(b) => Some(Quantiles {
            p50: Some(b),
            p90: Some(b),
            p95: Some(b),
            n: base.len() as u64,
        }),
        None if base.len() >= min_samples.max(1) => Some(Quantiles::of(&base)),
        None => None,
    };
    let (recent_median, best_peer) = recent_value(&recent, by_peer);
    let base_median = baseline.and_then(|b| b.p50);
    let ratio = match (recent_median, base_median) {
        (Some(r), Some(b)) => Some(r / b.max(cfg.dial_interval).max(f64::MIN_POSITIVE)),
        _ => None,
    };
    // A node's role also has to leave its normal spread (module docs, "Per-node
    // attribution"): its value rests on a few probes.
    let spread_left = !by_peer
        || match (recent_median, baseline.and_then(|b| b.p90)) {
            (Some(r), Some(p90)) => r > p90,
            _ => false,
        };
    let active = match (ratio, recent_median, base_median) {
        (Some(ratio), Some(r), Some(b)) => {
            ratio >= cfg.ratio && r - b > cfg.floor && recent.len() >= recent_min && spread_left
        }
        _ => false,
    };
    DriftStatus {
        baseline,
        baseline_samples: base.len() as u64,
        recent_median,
        recent_samples: recent.len() as u64,
        ratio,
        active,
        best_peer: if by_peer { best_peer } else { None },
    }
}

/// Per node: (best-peer value, that peer, the node's samples), [`best_peers`].
pub type BestPeers = BTreeMap<String, (f64, String, usize)>;

/// Every node's best-peer quantile `q` over `kind`'s `success`/`slow` probes (module
/// docs, "Per-node attribution": per role the lowest per-peer quantile, the higher of
/// the two roles): node → (that value, its peer, the node's samples). Nodes without
/// such a probe are absent.
///
/// Peers in `exclude` (nodes named by their own evidence, crate `blame`) are left out
/// when another node is judged: a node that met only such peers cannot be told apart
/// from them and is absent (issue 31: under S2 a healthy node whose peers were all
/// the slow ones was reported slow with every peer).
pub fn best_peers(
    probes: &[ProbeRecord],
    kind: &str,
    q: f64,
    exclude: &BTreeSet<String>,
) -> BTreeMap<String, (f64, String, usize)> {
    by_node_and_peer(probes, kind, exclude)
        .into_iter()
        .filter_map(|(n, groups)| {
            let count: usize = groups.values().map(Vec::len).sum();
            best_of(&groups, q).map(|(x, p)| (n.to_string(), (x, p.to_string(), count)))
        })
        .collect()
}

/// Every node's probes grouped by (role, peer): `true` as source; the peer is the other
/// node (itself for same-node probes). TTFPs of `success`/`slow` probes of `kind`.
type PeerGroups<'a> = BTreeMap<(bool, &'a str), Vec<f64>>;

/// [`PeerGroups`] per node, leaving out of each node's groups the peers in `exclude`
/// (never the node itself).
fn by_node_and_peer<'a>(
    probes: &'a [ProbeRecord],
    kind: &str,
    exclude: &BTreeSet<String>,
) -> BTreeMap<&'a str, PeerGroups<'a>> {
    let mut out: BTreeMap<&str, PeerGroups<'a>> = BTreeMap::new();
    for p in probes.iter().filter(|p| p.kind == kind) {
        if !matches!(p.result, ProbeResult::Success | ProbeResult::Slow) {
            continue;
        }
        let Some(t) = p.ttfp_seconds else { continue };
        let (s, d) = (p.source.node.as_str(), p.target.node.as_str());
        if s == d || !exclude.contains(d) {
            out.entry(s)
                .or_default()
                .entry((true, d))
                .or_default()
                .push(t);
        }
        if s != d && !exclude.contains(s) {
            out.entry(d)
                .or_default()
                .entry((false, s))
                .or_default()
                .push(t);
        }
    }
    out
}

fn passed_ttfps<'a>(probes: &'a [ProbeRecord], kind: &'a str) -> impl Iterator<Item = f64> + 'a {
    probes
        .iter()
        .filter(move |p| p.kind == kind)
        .filter(|p| matches!(p.result, ProbeResult::Success | ProbeResult::Slow))
        .filter_map(|p| p.ttfp_seconds)
}

// ---------------------------------------------------------------------------------
// The gate's saved baseline (`--save-baseline`) and comparison (`--baseline`).
// ---------------------------------------------------------------------------------

/// Version of [`SavedBaseline`] files.
pub const SAVED_BASELINE_VERSION: u32 = 1;

/// One kind in a saved baseline: its quantiles and its nodes'.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SavedKind {
    /// Over the kind's `success`/`slow` probes, seconds.
    #[serde(flatten)]
    pub all: Quantiles,
    /// Per node, seconds.
    pub nodes: BTreeMap<String, SavedNode>,
    /// Per node: its probe pods' programming waits (either role), seconds. Added
    /// field (empty in files that predate it: then not compared).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub programming_wait: BTreeMap<String, Quantiles>,
}

/// One node in a saved baseline: its probes in either role, and per role (a node is
/// compared role by role: a target's TTFPs are partly masked, so the roles' normals
/// differ).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SavedNode {
    /// Probes in either role.
    #[serde(flatten)]
    pub all: Quantiles,
    /// Probes with the node as source.
    pub as_source: Quantiles,
    /// Probes with the node as target.
    pub as_target: Quantiles,
}

/// The settings a saved baseline was measured with (a comparison warns when they
/// differ: the numbers would not be like for like).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SavedSettings {
    /// `--dial-interval`, seconds.
    pub dial_interval_seconds: f64,
    /// `--slow-threshold`, seconds.
    pub slow_threshold_seconds: f64,
    /// `--max-ttfp`, seconds.
    pub max_ttfp_seconds: f64,
    /// `--drift-ratio` at save time.
    pub drift_ratio: f64,
    /// `--drift-floor` at save time, seconds.
    pub drift_floor_seconds: f64,
    /// `--baseline-min-samples` at save time.
    pub baseline_min_samples: u64,
}

/// A gate's `--save-baseline` file (JSON).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SavedBaseline {
    /// [`SAVED_BASELINE_VERSION`].
    pub version: u32,
    /// RFC 3339 wall time of the run (display only).
    pub saved_at: String,
    /// The gate instance that measured it.
    pub instance: String,
    /// The thresholds and settings used.
    pub settings: SavedSettings,
    /// Per kind.
    pub kinds: BTreeMap<String, SavedKind>,
}

/// A saved baseline from a gate's probes: per kind in `kinds` (those without a sample
/// too, with `n` 0), its quantiles and its nodes'.
pub fn save(
    probes: &[ProbeRecord],
    kinds: &[&str],
    settings: SavedSettings,
    instance: &str,
    saved_at: &str,
) -> SavedBaseline {
    let mut out = BTreeMap::new();
    for k in kinds {
        let all: Vec<f64> = passed_ttfps(probes, k).collect();
        let nodes = by_node_and_peer(probes, k, &BTreeSet::new())
            .into_iter()
            .map(|(n, groups)| {
                let role = |r: bool| -> Vec<f64> {
                    groups
                        .iter()
                        .filter(|((role, _), _)| *role == r)
                        .flat_map(|(_, v)| v.iter().copied())
                        .collect()
                };
                let (src, dst) = (role(true), role(false));
                let all: Vec<f64> = src.iter().chain(&dst).copied().collect();
                let node = SavedNode {
                    all: Quantiles::of(&all),
                    as_source: Quantiles::of(&src),
                    as_target: Quantiles::of(&dst),
                };
                (n.to_string(), node)
            })
            .collect();
        let programming_wait = node_programming_waits(probes, k)
            .into_iter()
            .map(|(n, v)| (n.to_string(), Quantiles::of(&v)))
            .collect();
        out.insert(
            k.to_string(),
            SavedKind {
                all: Quantiles::of(&all),
                nodes,
                programming_wait,
            },
        );
    }
    SavedBaseline {
        version: SAVED_BASELINE_VERSION,
        saved_at: saved_at.to_string(),
        instance: instance.to_string(),
        settings,
        kinds: out,
    }
}

/// How a gate compares with a saved baseline (`--baseline-quantile`, `--drift-ratio`,
/// `--drift-floor`, `--baseline-min-samples`, `--dial-interval`).
#[derive(Debug, Clone, PartialEq)]
pub struct CompareConfig {
    /// `p50`, `p90` or `p95`.
    pub quantile: String,
    /// Regression when now / max(baseline, dial interval) ≥ this…
    pub ratio: f64,
    /// …and now − baseline > this, seconds.
    pub floor: f64,
    /// Baseline series with fewer samples are compared with a warning.
    pub min_samples: u64,
    /// Seconds.
    pub dial_interval: f64,
}

pub use firstpacket_report::{BaselineComparison, BaselineEntry, BaselineMetric};

fn entry(
    kind: &str,
    node: Option<&str>,
    base: &Quantiles,
    now: Option<f64>,
    now_n: u64,
    peer: Option<&str>,
    c: &CompareConfig,
) -> BaselineEntry {
    let b = base.get(&c.quantile);
    let ratio = match (now, b) {
        (Some(x), Some(b)) => Some(x / b.max(c.dial_interval).max(f64::MIN_POSITIVE)),
        _ => None,
    };
    let regressed = match (ratio, now, b) {
        (Some(r), Some(x), Some(b)) => r >= c.ratio && x - b > c.floor,
        _ => false,
    };
    BaselineEntry {
        kind: kind.to_string(),
        node: node.map(str::to_string),
        baseline_seconds: b,
        baseline_samples: base.n,
        current_seconds: now,
        current_samples: now_n,
        ratio,
        regressed,
        few_samples: base.n < c.min_samples,
        best_peer: peer.map(str::to_string),
        metric: BaselineMetric::Ttfp,
    }
}

/// Per node: the programming waits (seconds) of the kind's `success`/`slow` probes'
/// pods on it, either role (issue 29: a pod's wait is its own node's, so no peer
/// grouping is needed).
pub fn node_programming_waits<'a>(
    probes: &'a [ProbeRecord],
    kind: &str,
) -> BTreeMap<&'a str, Vec<f64>> {
    let mut out: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for p in probes.iter().filter(|p| p.kind == kind) {
        if !matches!(p.result, ProbeResult::Success | ProbeResult::Slow) {
            continue;
        }
        let Some(g) = &p.programming else { continue };
        for (node, w) in [(&p.source.node, &g.source), (&p.target.node, &g.target)] {
            if let Some(w) = w {
                out.entry(node.as_str()).or_default().push(w.wait_seconds);
            }
        }
    }
    out
}

/// Node `n`'s entry for kind `k`: role by role, its best peer's quantile `q` now against
/// the role's saved quantile; the worse role stands for the node.
fn node_entry(
    k: &str,
    n: &str,
    saved_node: &SavedNode,
    groups: Option<&PeerGroups<'_>>,
    q: f64,
    c: &CompareConfig,
) -> BaselineEntry {
    // Role by role, each against its own saved quantile; the worse role stands
    // for the node.
    let roles = [
        (true, &saved_node.as_source),
        (false, &saved_node.as_target),
    ];
    roles
        .into_iter()
        .map(|(role, bq)| {
            let mut one = PeerGroups::new();
            for ((r, p), v) in groups.into_iter().flatten() {
                if *r == role {
                    one.insert((*r, *p), v.clone());
                }
            }
            let count: usize = one.values().map(Vec::len).sum();
            let best = best_of(&one, q);
            entry(
                k,
                Some(n),
                bq,
                best.map(|b| b.0),
                count as u64,
                best.map(|b| b.1),
                c,
            )
        })
        .max_by(|a, b| {
            (a.regressed, a.ratio.unwrap_or(f64::NEG_INFINITY))
                .partial_cmp(&(b.regressed, b.ratio.unwrap_or(f64::NEG_INFINITY)))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .expect("two roles")
}

/// A warning per setting that changes what a TTFP means (`--dial-interval`,
/// `--slow-threshold`) and differs between the baseline (`saved`) and this run.
fn settings_warnings(saved: &SavedSettings, now: &SavedSettings) -> Vec<String> {
    let mut warnings = Vec::new();
    for (what, old, new) in [
        (
            "--dial-interval",
            saved.dial_interval_seconds,
            now.dial_interval_seconds,
        ),
        (
            "--slow-threshold",
            saved.slow_threshold_seconds,
            now.slow_threshold_seconds,
        ),
    ] {
        if (old - new).abs() > 1e-9 {
            warnings.push(format!(
                "baseline measured with {what} {old}s, this run {new}s: not like for like"
            ));
        }
    }
    warnings
}

/// Compares a gate's probes with a saved baseline, like for like: the kinds of this run
/// that the baseline has (a kind only on one side is a warning, not compared), the same
/// quantile (`c.quantile`) on both sides. Per kind: the quantile of its `success`/`slow`
/// TTFPs. Per node: its best peer's quantile (module docs: a node's probes grouped by
/// the other node, the lowest group quantile), against the node's saved quantile.
/// Regressed: `now / max(baseline, dial interval) ≥ ratio` and `now − baseline > floor`.
/// A baseline series with fewer than `min_samples` samples is still compared; it is
/// listed in a warning. Settings that differ from the saved ones are warnings too.
pub fn compare(
    saved: &SavedBaseline,
    probes: &[ProbeRecord],
    kinds: &[&str],
    settings: &SavedSettings,
    c: &CompareConfig,
) -> BaselineComparison {
    let mut warnings = Vec::new();
    let mut entries = Vec::new();
    let mut few = Vec::new();
    // Nodes named by their own evidence are left out as peers (crate `blame`).
    let evidenced: BTreeSet<String> = crate::blame::evidenced_nodes(probes).into_keys().collect();
    for k in kinds {
        let Some(base) = saved.kinds.get(*k) else {
            warnings.push(format!(
                "kind {k} is not in the baseline (it has {}): not compared",
                saved.kinds.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
            continue;
        };
        let all: Vec<f64> = passed_ttfps(probes, k).collect();
        let now = nearest_rank(&all, q_value(&c.quantile));
        let e = entry(k, None, &base.all, now, all.len() as u64, None, c);
        if e.few_samples {
            few.push(format!("{k} ({})", base.all.n));
        }
        entries.push(e);
        let groups = by_node_and_peer(probes, k, &evidenced);
        let q = q_value(&c.quantile);
        let mut nodes: BTreeSet<&str> = groups.keys().copied().collect();
        nodes.extend(base.nodes.keys().map(String::as_str));
        for n in nodes {
            let Some(saved_node) = base.nodes.get(n) else {
                warnings.push(format!(
                    "node {n} ({k}) is not in the baseline: not compared"
                ));
                continue;
            };
            let e = node_entry(k, n, saved_node, groups.get(n), q, c);
            if saved_node.as_source.n < c.min_samples || saved_node.as_target.n < c.min_samples {
                few.push(format!(
                    "{k}/{n} ({} as source, {} as target)",
                    saved_node.as_source.n, saved_node.as_target.n
                ));
            }
            entries.push(e);
        }
        // Each node's pods' own programming waits against the node's saved ones.
        let waits = node_programming_waits(probes, k);
        for (n, base_q) in &base.programming_wait {
            let now_v = waits.get(n.as_str()).cloned().unwrap_or_default();
            let now = nearest_rank(&now_v, q);
            let mut e = entry(k, Some(n), base_q, now, now_v.len() as u64, None, c);
            e.metric = BaselineMetric::ProgrammingWait;
            entries.push(e);
        }
    }
    for k in saved.kinds.keys() {
        if !kinds.contains(&k.as_str()) {
            warnings.push(format!(
                "kind {k} is in the baseline but not in this run's --kinds: not compared"
            ));
        }
    }
    if !few.is_empty() {
        warnings.push(format!(
            "baseline has fewer than {} samples (--baseline-min-samples) for: {}; compared anyway, the numbers are less certain",
            c.min_samples,
            few.join(", ")
        ));
    }
    warnings.extend(settings_warnings(&saved.settings, settings));
    BaselineComparison {
        quantile: c.quantile.clone(),
        ratio: c.ratio,
        floor_seconds: c.floor,
        min_samples: c.min_samples,
        saved_at: saved.saved_at.clone(),
        regressed: entries.iter().any(|e| e.regressed),
        few_samples: !few.is_empty(),
        entries,
        warnings,
    }
}

/// `p50` → 0.5 and so on (0.95 for anything else: [`CompareConfig::quantile`] is
/// validated by the flag parser).
pub fn q_value(q: &str) -> f64 {
    match q {
        "p50" | "0.5" => 0.5,
        "p90" | "0.9" => 0.9,
        _ => 0.95,
    }
}

/// One line per regressed entry: `cross_node node-2: p95 17.2s vs baseline 0.55s
/// (×31.3, +16.6s; best peer node-3)`.
pub fn regression_lines(c: &BaselineComparison) -> Vec<String> {
    c.entries
        .iter()
        .filter(|e| e.regressed)
        .map(|e| {
            let mut what = match &e.node {
                Some(n) => format!("{} {n}", e.kind),
                None => format!("{} (all nodes)", e.kind),
            };
            if e.metric == BaselineMetric::ProgrammingWait {
                what.push_str(" programming wait");
            }
            let (now, base) = (
                e.current_seconds.unwrap_or(f64::NAN),
                e.baseline_seconds.unwrap_or(f64::NAN),
            );
            let peer = e
                .best_peer
                .as_deref()
                .map(|p| format!("; best peer {p}"))
                .unwrap_or_default();
            format!(
                "{what}: {} {now:.3}s vs baseline {base:.3}s (x{:.1}, +{:.3}s{peer})",
                c.quantile,
                e.ratio.unwrap_or(f64::NAN),
                now - base
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DriftConfig {
        DriftConfig {
            baseline_window: Duration::from_secs(3600),
            recent_window: Duration::from_secs(60),
            min_samples: 10,
            ratio: 1.5,
            floor: 0.5,
            dial_interval: 0.1,
            static_baseline: None,
        }
    }

    fn rec(kind: &str, src: &str, dst: &str, ttfp: f64) -> ProbeRecord {
        let mut r = crate::record::test_record(
            "p",
            src,
            dst,
            if ttfp > 5.0 {
                ProbeResult::Slow
            } else {
                ProbeResult::Success
            },
        );
        r.kind = kind.to_string();
        r.reason = None;
        r.ttfp_seconds = Some(ttfp);
        r
    }

    const NODES: [&str; 4] = ["n1", "n2", "n3", "n4"];

    /// Feeds a ring of 12 cross-node probes (every ordered pair once) per `lap`, one
    /// probe every `step` seconds from `t`, with TTFP `f(src, dst, i)`. Returns the
    /// time after the last probe and the marks.
    fn feed(
        b: &mut Baselines,
        t: &mut f64,
        laps: usize,
        step: f64,
        f: impl Fn(&str, &str, usize) -> f64,
    ) -> Vec<(String, String, DriftMark)> {
        let mut out = Vec::new();
        let mut i = 0;
        for _ in 0..laps {
            for off in 1..4 {
                for s in 0..4 {
                    let (src, dst) = (NODES[s], NODES[(s + off) % 4]);
                    *t += step;
                    let m = b.observe(&rec("cross_node", src, dst, f(src, dst, i)), *t);
                    out.push((src.to_string(), dst.to_string(), m));
                    i += 1;
                }
            }
        }
        out
    }

    fn healthy(_: &str, _: &str, i: usize) -> f64 {
        0.2 + 0.4 * ((i * 7919) % 100) as f64 / 100.0
    }

    /// Issue 29: on a CNI that gates readiness the same slowdown shows as the pods'
    /// programming waits with TTFP near 0; the drift sees it there, on the slow nodes
    /// only.
    #[test]
    fn programming_waits_drift_while_ttfp_stays_near_zero() {
        let mut b = Baselines::new(cfg());
        let mut t = 1_000_000.0;
        let gated = |b: &mut Baselines, t: &mut f64, wait: &dyn Fn(&str, usize) -> f64| {
            let mut i = 0;
            for _ in 0..2 {
                for off in 1..4 {
                    for s in 0..4 {
                        let (src, dst) = (NODES[s], NODES[(s + off) % 4]);
                        *t += 5.0;
                        let mut p =
                            with_waits(vec![rec("cross_node", src, dst, 0.02)], |n, _| wait(n, i));
                        b.observe(&p.remove(0), *t);
                        i += 1;
                    }
                }
            }
        };
        gated(&mut b, &mut t, &|_, i| healthy("", "", i));
        gated(&mut b, &mut t, &|_, i| healthy("", "", i));
        assert!(!b.kind("cross_node", t).active);
        let slow = |n: &str, i: usize| {
            if ["n1", "n4"].contains(&n) {
                1.5 + 2.0 * ((i * 31) % 10) as f64 / 10.0
            } else {
                healthy("", "", i)
            }
        };
        gated(&mut b, &mut t, &slow);
        let k = b.kind("cross_node", t);
        assert!(k.active, "{k:?}");
        let nodes = b.nodes(t);
        assert!(nodes["n1"].active && nodes["n4"].active, "{nodes:?}");
        assert!(!nodes["n2"].active && !nodes["n3"].active, "{nodes:?}");
    }

    #[test]
    fn no_drift_until_min_samples_then_a_slow_shift_drifts_and_the_baseline_does_not_absorb_it() {
        let mut b = Baselines::new(cfg());
        let mut t = 1_000_000.0;
        // 4 laps at 5 s: 48 probes over 240 s, healthy.
        let marks = feed(&mut b, &mut t, 4, 5.0, healthy);
        assert!(
            marks.iter().all(|(_, _, m)| !m.counted),
            "healthy probes drifted"
        );
        let k = b.kind("cross_node", t);
        let before = k.baseline.expect("learned").p50.expect("p50");
        assert!((0.2..0.6).contains(&before), "{before}");
        assert!(!k.active);
        assert!(k.ratio.expect("ratio") < 1.5, "{k:?}");
        // S5: n1 and n4 slow (1.5–3.5 s): probes touching them are slow.
        let slow = |s: &str, d: &str, i: usize| {
            if ["n1", "n4"].contains(&s) || ["n1", "n4"].contains(&d) {
                1.5 + 2.0 * ((i * 31) % 10) as f64 / 10.0
            } else {
                healthy(s, d, i)
            }
        };
        let marks = feed(&mut b, &mut t, 2, 5.0, slow);
        let k = b.kind("cross_node", t);
        assert!(k.active && k.ratio.expect("ratio") >= 1.5, "{k:?}");
        // Within 10 probes touching n1, its drift is active.
        let n1_marks: Vec<bool> = marks
            .iter()
            .filter(|(s, d, _)| s == "n1" || d == "n1")
            .map(|(_, _, m)| m.nodes.contains(&"n1".to_string()))
            .collect();
        assert!(n1_marks.iter().take(10).any(|a| *a), "{n1_marks:?}");
        let nodes = b.nodes(t);
        assert!(nodes["n1"].active && nodes["n4"].active, "{nodes:?}");
        // The healthy nodes met each other: their best peer is fast.
        assert!(!nodes["n2"].active && !nodes["n3"].active, "{nodes:?}");
        assert_eq!(nodes["n2"].best_peer.as_deref(), Some("n3"));
        // Back to healthy: drift ends within 10 probes touching n1; the baseline
        // median is the one from before.
        let marks = feed(&mut b, &mut t, 2, 5.0, healthy);
        let n1_after: Vec<bool> = marks
            .iter()
            .filter(|(s, d, _)| s == "n1" || d == "n1")
            .map(|(_, _, m)| m.nodes.contains(&"n1".to_string()))
            .collect();
        assert!(n1_after.iter().skip(10).all(|a| !*a), "{n1_after:?}");
        assert!(!b.kind("cross_node", t).active);
        // Long after the episode (it is in the baseline window now), the baseline is
        // what it was.
        feed(&mut b, &mut t, 2, 5.0, healthy);
        let after = b
            .kind("cross_node", t)
            .baseline
            .expect("baseline")
            .p50
            .expect("p50");
        assert!(
            (after - before).abs() <= (0.2 * before).max(0.1),
            "{before} -> {after}"
        );
        let n1 = b.nodes(t)["n1"].baseline.expect("n1").p50.expect("p50");
        assert!(n1 < 0.7, "node baseline absorbed the episode: {n1}");
    }

    #[test]
    fn a_slower_normal_is_learned_and_only_doubling_it_drifts() {
        let mut b = Baselines::new(cfg());
        let mut t = 5_000.0;
        let normal = |_: &str, _: &str, i: usize| 1.0 + ((i * 37) % 10) as f64 / 10.0;
        let marks = feed(&mut b, &mut t, 5, 5.0, normal);
        assert!(marks.iter().all(|(_, _, m)| !m.counted));
        assert!(!b.kind("cross_node", t).active);
        let doubled = |_: &str, _: &str, i: usize| 2.0 + 2.0 * ((i * 37) % 10) as f64 / 10.0;
        feed(&mut b, &mut t, 1, 5.0, doubled);
        let k = b.kind("cross_node", t);
        assert!(k.active, "{k:?}");
        // A node's best peer (the lowest of its peers' medians, biased low with one
        // sample a peer) rises too, but need not pass ×1.5 on a uniform doubling.
        feed(&mut b, &mut t, 1, 5.0, doubled);
        assert!(
            b.nodes(t)
                .values()
                .all(|n| n.ratio.is_some_and(|r| r > 1.2)),
            "{:?}",
            b.nodes(t)
        );
    }

    /// A healthy 3-node cluster whose TTFPs spread widely (uniform 0.1–2 s, as a 1–2 s
    /// program delay gives after Ready), ~20 probes in the recent window as at the
    /// defaults: node drift must stay rare. With ratio and floor alone 119 of these
    /// 1 100 probes marked a node; with the role's recent minimum and its p90, 2.
    #[test]
    fn a_widely_spread_healthy_normal_rarely_marks_a_node() {
        let c = DriftConfig {
            recent_window: Duration::from_secs(20),
            baseline_window: Duration::from_secs(600),
            min_samples: 8,
            ..cfg()
        };
        let mut b = Baselines::new(c);
        // A fixed LCG: the same "random" pairs and TTFPs every run.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 33) as f64 / (1u64 << 31) as f64
        };
        let nodes = ["n1", "n2", "n3"];
        let (mut t, mut marked, mut judged) = (1_000.0, 0, 0);
        for i in 0..1200 {
            t += 1.0;
            let s = (next() * 3.0) as usize % 3;
            let d = (s + 1 + (next() * 2.0) as usize % 2) % 3;
            let m = b.observe(
                &rec("cross_node", nodes[s], nodes[d], 0.1 + 1.9 * next()),
                t,
            );
            if i >= 100 {
                judged += 1;
                marked += usize::from(!m.nodes.is_empty());
            }
        }
        assert!(
            b.nodes(t).values().all(|n| n.baseline.is_some()),
            "{:?}",
            b.nodes(t)
        );
        eprintln!("{marked} of {judged} probes marked a healthy node as drifting");
        assert!(
            marked * 100 <= judged,
            "{marked} of {judged} probes marked a healthy node as drifting"
        );
    }

    #[test]
    fn the_floor_guards_healthy_clusters_and_the_dial_interval_guards_the_ratio() {
        let mut b = Baselines::new(cfg());
        let mut t = 0.0;
        // Near-zero normal, then 0.3 s: ratio ×3 over the dial interval, under the floor.
        feed(&mut b, &mut t, 2, 5.0, |_, _, _| 0.0);
        feed(&mut b, &mut t, 1, 5.0, |_, _, _| 0.3);
        let k = b.kind("cross_node", t);
        let r = k.ratio.expect("ratio");
        assert!(
            (r - 3.0).abs() < 1e-5,
            "denominator is the dial interval: {k:?}"
        );
        assert!(!k.active, "{k:?}");
        // Above the floor it drifts.
        feed(&mut b, &mut t, 1, 5.0, |_, _, _| 0.7);
        assert!(b.kind("cross_node", t).active);
    }

    #[test]
    fn static_baseline_reports_from_the_start_and_unknown_kinds_are_empty() {
        let mut c = cfg();
        c.static_baseline = Some(0.5);
        let mut b = Baselines::new(c);
        let k = b.kind("same_node", 0.0);
        assert_eq!(k.baseline.and_then(|q| q.p95), Some(0.5));
        assert_eq!((k.ratio, k.active), (None, false));
        let mut t = 0.0;
        feed(&mut b, &mut t, 1, 1.0, |_, _, _| 2.0);
        let k = b.kind("cross_node", t);
        assert_eq!(k.ratio, Some(4.0));
        assert!(k.active);
    }

    #[test]
    fn memory_is_bounded_per_series_and_nodes_can_be_forgotten() {
        let mut c = cfg();
        c.baseline_window = Duration::from_secs(10 * 365 * 86400);
        let mut b = Baselines::new(c);
        let mut t = 0.0;
        for i in 0..(KIND_CAPACITY + 100) {
            t += 1.0;
            b.observe(&rec("cross_node", "a", "b", 0.1 + (i % 3) as f64 * 0.01), t);
        }
        assert_eq!(b.len(), KIND_CAPACITY + 2 * NODE_CAPACITY);
        b.forget_node("a");
        assert_eq!(b.len(), KIND_CAPACITY + NODE_CAPACITY);
        assert!(!b.nodes(t).contains_key("a"));
        // Failed and inconclusive probes are no samples.
        let mut f = rec("cross_node", "a", "b", 0.1);
        f.result = ProbeResult::Failed;
        let before = b.len();
        assert!(!b.observe(&f, t + 1.0).counted);
        assert_eq!(b.len(), before);
    }

    #[test]
    fn a_snapshot_restores_the_baseline_after_a_restart() {
        let mut b = Baselines::new(cfg());
        let mut t = 10_000.0;
        feed(&mut b, &mut t, 4, 5.0, healthy);
        let snap = b.snapshot(t);
        let json = serde_json::to_string(&snap).expect("json");
        assert!(json.len() < 10_000, "{}", json.len());
        let back: Snapshot = serde_json::from_str(&json).expect("parse");
        let mut fresh = Baselines::new(cfg());
        let n = fresh.restore(&back, t + 1.0).expect("restore");
        assert!(n > 0);
        let (a, z) = (
            b.kind("cross_node", t + 1.0),
            fresh.kind("cross_node", t + 1.0),
        );
        assert_eq!(a.baseline_samples, z.baseline_samples);
        let (pa, pz) = (
            a.baseline.expect("a").p50.expect("a"),
            z.baseline.expect("z").p50.expect("z"),
        );
        assert!((pa - pz).abs() < 0.002, "{pa} vs {pz}");
        assert!(fresh.nodes(t + 1.0)["n1"].baseline.is_some());
        // Restoring twice adds nothing (only samples older than those held).
        assert_eq!(fresh.restore(&back, t + 1.0), Ok(0));
        let bad = Snapshot {
            version: 99,
            ..Default::default()
        };
        assert!(fresh.restore(&bad, t).is_err());
        // Samples from a clock that ran ahead stay out (they would be "recent" drift).
        let ahead = Snapshot {
            version: SNAPSHOT_VERSION,
            saved_at: t + 3600.0,
            kinds: [(
                "cross_node".to_string(),
                vec![[t + 3600.0, 10.0], [t + 30.0, 0.2]],
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let mut empty = Baselines::new(cfg());
        assert_eq!(empty.restore(&ahead, t), Ok(1));
        assert_eq!(empty.kind("cross_node", t + 31.0).recent_samples, 1);
    }

    /// p95, ratio 1.5, floor 0.5 s, 20 samples, 100 ms dial interval (the defaults).
    fn p95_config() -> CompareConfig {
        CompareConfig {
            quantile: "p95".into(),
            ratio: 1.5,
            floor: 0.5,
            min_samples: 20,
            dial_interval: 0.1,
        }
    }

    fn settings() -> SavedSettings {
        SavedSettings {
            dial_interval_seconds: 0.1,
            slow_threshold_seconds: 5.0,
            max_ttfp_seconds: 5.0,
            drift_ratio: 1.5,
            drift_floor_seconds: 0.5,
            baseline_min_samples: 20,
        }
    }

    fn ring(f: impl Fn(&str, &str, usize) -> f64) -> Vec<ProbeRecord> {
        let mut out = Vec::new();
        let mut i = 0;
        for off in 1..4 {
            for s in 0..4 {
                let (src, dst) = (NODES[s], NODES[(s + off) % 4]);
                out.push(rec("cross_node", src, dst, f(src, dst, i)));
                i += 1;
            }
        }
        out
    }

    /// `ring` with every pod's programming wait given by `wait(node, i)`.
    fn with_waits(
        mut probes: Vec<ProbeRecord>,
        wait: impl Fn(&str, usize) -> f64,
    ) -> Vec<ProbeRecord> {
        let w = |x: f64| {
            Some(firstpacket_report::ProgrammingWait {
                method: firstpacket_report::ProgrammingMethod::NodeDial,
                wait_seconds: x,
                resolution_seconds: 0.1,
                over_threshold: x > 5.0,
            })
        };
        for (i, p) in probes.iter_mut().enumerate() {
            p.programming = Some(firstpacket_report::ProbeProgramming {
                source: w(wait(&p.source.node, i)),
                target: w(wait(&p.target.node, i)),
                readiness_gated: None,
            });
        }
        probes
    }

    #[test]
    fn programming_waits_regress_per_node_while_ttfp_stays_at_its_baseline() {
        let healthy_wait = |_: &str, i: usize| 0.05 + (i % 3) as f64 * 0.05;
        let base = save(
            &with_waits(ring(healthy), healthy_wait),
            &["cross_node"],
            settings(),
            "gate-a",
            "t",
        );
        assert_eq!(base.kinds["cross_node"].programming_wait["n2"].n, 6);
        let c = p95_config();
        // S2 with a gating CNI: n2 and n3 program 1.2–1.9 s late, TTFP unchanged.
        let s2 = with_waits(ring(|s, d, i| healthy(s, d, i + 1)), |n, i| {
            if ["n2", "n3"].contains(&n) {
                1.2 + (i % 8) as f64 * 0.1
            } else {
                healthy_wait(n, i + 1)
            }
        });
        let cmp = compare(&base, &s2, &["cross_node"], &settings(), &c);
        let bad: Vec<(String, BaselineMetric)> = cmp
            .entries
            .iter()
            .filter(|e| e.regressed)
            .map(|e| (e.node.clone().unwrap_or("*".into()), e.metric))
            .collect();
        assert_eq!(
            bad,
            [
                ("n2".to_string(), BaselineMetric::ProgrammingWait),
                ("n3".to_string(), BaselineMetric::ProgrammingWait)
            ]
        );
        let lines = regression_lines(&cmp);
        assert!(
            lines[0].starts_with("cross_node n2 programming wait: p95 1."),
            "{lines:?}"
        );
        // A baseline file from before the field has none: nothing compared, no error.
        let mut old = base.clone();
        old.kinds
            .get_mut("cross_node")
            .unwrap()
            .programming_wait
            .clear();
        let text = serde_json::to_string(&old).unwrap();
        assert!(!text.contains("programming_wait"), "{text}");
        let back: SavedBaseline = serde_json::from_str(&text).unwrap();
        assert!(!compare(&back, &s2, &["cross_node"], &settings(), &c).regressed);
    }

    #[test]
    fn gate_comparison_names_the_regressed_kind_and_exactly_the_slow_nodes() {
        let base = save(&ring(healthy), &["cross_node"], settings(), "gate-a", "t");
        assert_eq!(base.kinds["cross_node"].all.n, 12);
        assert_eq!(base.kinds["cross_node"].nodes["n1"].all.n, 6);
        assert_eq!(base.kinds["cross_node"].nodes["n1"].as_target.n, 3);
        let c = p95_config();
        // S2: n2 and n3 slow.
        let s2 = ring(|s, d, i| {
            if ["n2", "n3"].contains(&s) || ["n2", "n3"].contains(&d) {
                15.0 + i as f64
            } else {
                healthy(s, d, i)
            }
        });
        let cmp = compare(&base, &s2, &["cross_node"], &settings(), &c);
        assert!(cmp.regressed);
        let bad: Vec<String> = cmp
            .entries
            .iter()
            .filter(|e| e.regressed)
            .map(|e| e.node.clone().unwrap_or("*".into()))
            .collect();
        assert_eq!(bad, ["*", "n2", "n3"]);
        assert!(
            cmp.few_samples && cmp.warnings.iter().any(|w| w.contains("fewer than 20")),
            "{:?}",
            cmp.warnings
        );
        let lines = regression_lines(&cmp);
        assert!(
            lines[1].starts_with("cross_node n2: p95 ") && lines[1].contains("vs baseline"),
            "{lines:?}"
        );
        // The same healthy cluster again: no regression.
        let again = ring(|s, d, i| healthy(s, d, i + 5));
        let cmp = compare(&base, &again, &["cross_node"], &settings(), &c);
        assert!(!cmp.regressed, "{cmp:?}");
        // Kinds only on one side are warnings, not compared.
        let cmp = compare(&base, &again, &["same_node"], &settings(), &c);
        assert!(!cmp.regressed && cmp.entries.is_empty());
        assert_eq!(cmp.warnings.len(), 2, "{:?}", cmp.warnings);
    }
}
