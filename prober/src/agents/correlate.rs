//! Per-probe correlation of node-agent metrics (docs/design.md §3): which node's agent
//! explains a slow or failed probe, with numbers.
//!
//! Pure: takes a [`History`] of scrapes (rings of [`Observation`]s per node and
//! profile) and a [`ProbeWindow`], returns [`Suspect`]s; no I/O, no clock (times are
//! `f64` seconds on one monotonic clock chosen by the caller — the [`AgentWatcher`]'s).
//!
//! # Method
//! For each node of the probe (source, target) and each agent profile on it:
//! 1. The window's two readings: the last good reading at or before `start`
//!    (`before`) and the first at or after `end` (`after`); missing sides fall back to
//!    the nearest good reading inside the window. `window_seconds` = `after.at −
//!    before.at`.
//! 2. **Reset** first: a different pod UID, a higher `restartCount`, a moved
//!    `process_start_time_seconds`, or any cumulative value going down between the two
//!    → `agent_restarted` and *no* rate for this window (never a negative rate;
//!    docs/design.md §3 "any decrease is a reset and a signal").
//! 3. **Apply time**: Δ`_sum`/Δ`_count` of the apply-time summary or histogram over the
//!    window = the mean apply in the window (client_golang summary quantiles cover a
//!    sliding 10-minute window, so they are quoted as context only). Compared with
//!    (a) the node's own recent history (Δ over the readings before the window, within
//!    [`Params::lookback_seconds`]) and (b) the **healthiest half of the other nodes**:
//!    each other node's recent mean (or, lacking a Δ, its lifetime `_sum/_count`), sorted
//!    ascending, the first ⌈k/2⌉ kept, their median — a plain median is wrong when half
//!    the nodes are slow. Flagged `dataplane_apply_slow` when above the absolute floor
//!    **and** [`Params::ratio`]× above either baseline (a persistently slow node is
//!    normal for itself but not for the cluster; a cluster-wide step is caught by the
//!    nodes' own history). Without a cluster baseline (fewer than
//!    [`Params::min_cluster_nodes`] other nodes with data), the higher no-baseline floor
//!    alone also flags.
//! 4. **Failures**: Δ failures ≥ [`Params::failures_min`] and rate ≥
//!    [`Params::failures_rate_floor`], and the rate [`Params::ratio`]× above either
//!    baseline rate (healthy agents count 0) → `dataplane_apply_failures`.
//! 5. **Resyncs**: Δ `felix_resyncs_started` ≥ 1 in the window → `datastore_resync`
//!    (a healthy Felix starts one resync at process start and then stays in sync: the
//!    3.20 fixture shows `felix_resyncs_started 1`).
//! 6. **Route resync**: Δ`_sum`/Δ`_count` of the route-table resync time, when a resync
//!    happened in the window, against the same baselines and its own floor →
//!    `route_resync_slow`.
//! 7. **Readiness / reachability**: an agent reading with Ready false in the window →
//!    `agent_not_ready`; the scrape at the end failed → its signal (`agent_unreachable`
//!    for refused/connect/timeout/HTTP errors, `agent_bad_metrics` for unreadable
//!    pages; the message is one bounded line, with the profile's hint only where it is
//!    the likely fix — see `ScrapeError::hint`); a
//!    profile present in the cluster but absent on the node, or no agent found at all
//!    → `agent_unreachable`.
//!
//! 8. **Gone**: a profile read on the node before but whose agent pod discovery no longer
//!    lists there (deleted mid-run, no replacement) → `agent_unreachable` with reason
//!    `agent_pod_gone`. A replacement pod (new UID) is read instead and gives
//!    `agent_restarted` (`pod_uid_changed`).
//! 9. With no profile searched at all (every built-in disabled by `--agent-config`),
//!    correlation is off: no findings.
//!
//! [`split_findings`] puts findings under the probe's `suspects` (slow / failed) or the
//! report's `warnings` (normal TTFP; `agent_unreachable` always), and
//! [`merge_warnings`] keeps one warning per (node, signal), counting distinct probes and
//! listing every profile.
//!
//! Evidence numbers: durations and rates with 7 significant digits; timestamps and large
//! counters (≥ 10⁵) to the millisecond. Rates over readings spanning less than
//! [`Params::min_rate_span_seconds`] are `null`. Every finding of a scraped agent carries
//! `scrape_path` (`direct` or `proxy`).
//!
//! [`AgentWatcher`]: super::scrape::AgentWatcher

use super::profiles::AgentReading;
use firstpacket_report::{ProbeResult, Role, Signal, Suspect};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// Thresholds of the correlation. Every number is documented with its reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Mean apply time (seconds) below which nothing is flagged, whatever the ratios:
    /// 0.25 s is > 10× the p99 (20 ms) and ~70× the mean (3.7 ms = 9.99 s / 2705) of
    /// the real Felix 3.20 page (`prober/tests/fixtures/felix-3.20-1.prom`), and well under
    /// the 1–2 s healthy TTFP of docs/design.md §0, so what passes it can matter for TTFP.
    pub apply_floor_seconds: f64,
    /// With neither an own-history nor a cluster baseline, the floor is this (1 s: half
    /// the upper end of a healthy TTFP, docs/design.md §0).
    pub apply_floor_no_baseline_seconds: f64,
    /// How many times above a baseline a value must be (5×: a factor well outside the
    /// run-to-run spread of a mean over a handful of applies, and a clear margin
    /// against the testbed's S2, where slow nodes sit ≥ 1 s against ms).
    pub ratio: f64,
    /// Least failures in the window (2: Felix retries a failed apply, so one isolated
    /// failure that was retried successfully is routine).
    pub failures_min: f64,
    /// Least failure rate, per second (0.1/s = one every 10 s, the order of a probe's
    /// length; S5's faulty nodes fail 1/s).
    pub failures_rate_floor: f64,
    /// Least resyncs started in the window (1: see module doc, step 5).
    pub resyncs_min: f64,
    /// Route-table resync mean floor, seconds (1 s: Felix's route refresh runs every
    /// 90 s by default, `RouteRefreshInterval`; the 3.20 fixture's mean list time is
    /// 0.66 ms; a resync longer than 1 s holds up route programming noticeably).
    pub route_floor_seconds: f64,
    /// How far back own history and cluster readings reach, seconds (600 s: the
    /// client_golang summary window, `DefMaxAge`).
    pub lookback_seconds: f64,
    /// Other nodes needed for a cluster baseline (2: with one, "the healthiest half" is
    /// a single node).
    pub min_cluster_nodes: usize,
    /// Least span, seconds, of the readings a baseline *rate* (own-history or another
    /// node's failures per second) is computed over; below it the rate is `null` in
    /// evidence and not used (5 s: one hot re-scrape interval,
    /// `ScrapeSettings::hot_interval`; two scrapes a fraction of a second apart give a
    /// rate of 0 or a spike that means nothing).
    pub min_rate_span_seconds: f64,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            apply_floor_seconds: 0.25,
            apply_floor_no_baseline_seconds: 1.0,
            ratio: 5.0,
            failures_min: 2.0,
            failures_rate_floor: 0.1,
            resyncs_min: 1.0,
            route_floor_seconds: 1.0,
            lookback_seconds: 600.0,
            min_cluster_nodes: 2,
            min_rate_span_seconds: 5.0,
        }
    }
}

/// Why a scrape gave no reading.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeFailure {
    /// `AgentUnreachable` or `AgentBadMetrics`.
    pub signal: Signal,
    /// Short static reason ([`super::scrape::ScrapeError::reason`]: `refused`,
    /// `connect`, `timeout`, `http`, `http_status`, `no_address`, `too_large`,
    /// `not_utf8`, `parse`, `no_signal_metrics`, `no_client`), also a metric label.
    pub reason: &'static str,
    /// Human detail (URL, error text, and the profile's hint where it is the likely
    /// fix): one line, at most [`MESSAGE_MAX_CHARS`] characters before the hint
    /// ([`one_line`]).
    pub message: String,
}

/// Longest error text kept in evidence `message`s, characters (an agent's HTML error
/// page must not flood the report or the terminal).
pub const MESSAGE_MAX_CHARS: usize = 200;

/// `s` as one bounded line: every run of whitespace (newlines included) becomes one
/// space, other control characters are dropped, and text beyond `max` characters is cut
/// with `…`.
pub fn one_line(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut chars = 0usize;
    let mut space = false;
    for c in s.chars() {
        if c.is_whitespace() {
            space = !out.is_empty();
            continue;
        }
        if c.is_control() {
            continue;
        }
        if space {
            if chars + 1 >= max {
                out.push('…');
                return out;
            }
            out.push(' ');
            chars += 1;
            space = false;
        }
        if chars >= max {
            out.push('…');
            return out;
        }
        out.push(c);
        chars += 1;
    }
    out
}

/// One scrape of one agent.
///
/// The names are shared (`Arc<str>`): [`History::push`] points an observation's names at
/// the previous one's in its ring when they are equal, so a ring of 32 holds each name
/// once (a ring at 1 000 nodes × 2 agents is kept for the whole run).
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// When the answer arrived, seconds on the caller's monotonic clock.
    pub at: f64,
    /// Profile name.
    pub profile: Arc<str>,
    /// Node name.
    pub node: Arc<str>,
    /// Agent pod name.
    pub pod: Arc<str>,
    /// Agent pod UID.
    pub uid: Arc<str>,
    /// Σ restartCount of the agent pod's containers.
    pub restart_count: u32,
    /// The agent pod's Ready condition.
    pub ready: bool,
    /// How the page was fetched: `direct` or `proxy` (`None` when no request was made,
    /// e.g. no address).
    pub scrape_path: Option<&'static str>,
    /// The reading, or why there is none.
    pub outcome: Result<AgentReading, ScrapeFailure>,
}

/// Evidence `reason` of an `agent_unreachable` finding whose agent stopped answering
/// during the probe and answered again by its end: it explains a slow or failed probe,
/// so it is a suspect there ([`split_findings`]).
pub const STALLED_IN_WINDOW: &str = "stalled_in_window";

/// Scrape failure reasons that mean the agent did not answer (not a page problem, not
/// a missing address).
const STALL_REASONS: &[&str] = &["timeout", "refused", "connect"];

/// How long after the window's end an observation still counts as the window's end
/// scrape, seconds (the end scrape is answered within the scrape timeout, ≤ 10 s).
pub const END_SLACK_SECONDS: f64 = 10.0;

/// Default ring length per (node, profile): 32 readings (≈ 2.5 min at the 5 s hot
/// interval; more for idle nodes swept rarely).
pub const DEFAULT_RING: usize = 32;

/// How far behind its ring's newest observation an older one is still kept, seconds:
/// 1 800 (30 min). The correlation reads at most [`Params::lookback_seconds`] (600 s)
/// before a probe window's start or end, and every probe scrapes its nodes at its start,
/// so an observation half an hour older than the ring's newest is never read again; the
/// newest is always kept. A node swept every hour or so (an idle node of a large
/// cluster) then holds one observation per agent instead of a full ring.
pub const HORIZON_SECONDS: f64 = 1800.0;

/// Short rings of observations per (node, profile).
#[derive(Debug, Clone)]
pub struct History {
    rings: BTreeMap<(String, String), VecDeque<Observation>>,
    capacity: usize,
}

impl Default for History {
    fn default() -> History {
        History::new(DEFAULT_RING)
    }
}

impl History {
    /// Empty history keeping `capacity` (≥ 2) observations per (node, profile).
    pub fn new(capacity: usize) -> History {
        History {
            rings: BTreeMap::new(),
            capacity: capacity.max(2),
        }
    }

    /// Appends an observation (kept in time order; the oldest is dropped when full, so
    /// one older than every observation of a full ring is not kept), then drops those
    /// more than [`HORIZON_SECONDS`] older than the ring's newest.
    ///
    /// Memory: a ring grows by doubling up to its capacity and never past it (a
    /// `VecDeque` pushed at its allocation's length doubles it), and shrinks when the
    /// horizon leaves it less than half full; the observation's names are shared with
    /// the ring's newest observation when equal. Measured by `tests/history_memory.rs`
    /// (x86_64): 218 bytes per held observation, 873 before (names copied per scrape,
    /// rings doubled to 64 slots) — with every ring full at 1 000 nodes × 2 agents ×
    /// [`DEFAULT_RING`], 14 MB instead of 56 MB; a ring the horizon left with one
    /// observation holds about 750 bytes (its key, two slots, one set of names).
    pub fn push(&mut self, mut obs: Observation) {
        let capacity = self.capacity;
        let ring = self
            .rings
            .entry((obs.node.to_string(), obs.profile.to_string()))
            .or_default();
        if let Some(last) = ring.back() {
            share_if_equal(&mut obs.profile, &last.profile);
            share_if_equal(&mut obs.node, &last.node);
            share_if_equal(&mut obs.pod, &last.pod);
            share_if_equal(&mut obs.uid, &last.uid);
        }
        let pos = ring
            .iter()
            .rposition(|o| o.at <= obs.at)
            .map_or(0, |p| p + 1);
        if ring.len() < capacity {
            if ring.len() == ring.capacity() {
                // Double, but not past the ring's capacity.
                ring.reserve_exact(ring.len().clamp(1, capacity - ring.len()));
            }
            ring.insert(pos, obs);
        } else if pos > 0 {
            ring.pop_front();
            ring.insert(pos - 1, obs);
        }
        let from = ring
            .back()
            .map_or(f64::NEG_INFINITY, |o| o.at - HORIZON_SECONDS);
        while ring.len() > 1 && ring.front().is_some_and(|o| o.at < from) {
            ring.pop_front();
        }
        if ring.capacity() > 2 * ring.len().max(2) {
            ring.shrink_to(ring.len().max(2));
        }
    }

    /// Drops the rings of nodes `keep` rejects (nodes that left the cluster).
    pub fn retain_nodes(&mut self, keep: impl Fn(&str) -> bool) {
        self.rings.retain(|(node, _), _| keep(node));
    }

    /// Number of (node, profile) rings held.
    pub fn rings_len(&self) -> usize {
        self.rings.len()
    }

    /// The ring of (node, profile), oldest first.
    pub fn ring(&self, node: &str, profile: &str) -> Option<&VecDeque<Observation>> {
        self.rings.get(&(node.to_owned(), profile.to_owned()))
    }

    /// Profiles observed on `node`.
    pub fn profiles_on(&self, node: &str) -> Vec<String> {
        self.rings
            .keys()
            .filter(|(n, _)| n == node)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// Nodes with a ring for `profile`.
    pub fn nodes_with(&self, profile: &str) -> Vec<String> {
        self.rings
            .keys()
            .filter(|(_, p)| p == profile)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Last observation time of `node` (any profile).
    pub fn last_at(&self, node: &str) -> Option<f64> {
        self.rings
            .iter()
            .filter(|((n, _), _)| n == node)
            .filter_map(|(_, r)| r.back().map(|o| o.at))
            .reduce(f64::max)
    }
}

/// Points `name` at `kept` when both hold the same text (the copy is freed).
fn share_if_equal(name: &mut Arc<str>, kept: &Arc<str>) {
    if !Arc::ptr_eq(name, kept) && **name == **kept {
        *name = Arc::clone(kept);
    }
}

/// The probe's time window and nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeWindow {
    /// Window start (before the target pod was created), seconds on the history clock.
    pub start: f64,
    /// Window end (after the source finished), same clock.
    pub end: f64,
    /// Source node.
    pub source_node: String,
    /// Target node.
    pub target_node: String,
}

/// What the cluster looks like to the correlation besides the history.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterView {
    /// Profiles with at least one agent pod anywhere (discovery).
    pub present_profiles: Vec<String>,
    /// Every profile searched (for the evidence of "no agent at all").
    pub searched_profiles: Vec<String>,
    /// Profiles whose agent pod exists on each node (discovery), by node.
    pub agents_on_node: BTreeMap<String, Vec<String>>,
    /// Discovery watches failing now, `"<profile> in <namespace>: <error>"` (e.g. a 403:
    /// RBAC missing `list`/`watch` pods there). With none found, "no agents" would be a
    /// guess: the findings say discovery failed instead.
    pub discovery_errors: Vec<String>,
}

fn good(o: &Observation) -> Option<&AgentReading> {
    o.outcome.as_ref().ok()
}

/// Same incarnation: same pod UID, restart count and process start.
fn same_incarnation(a: &Observation, b: &Observation) -> bool {
    let (Some(ra), Some(rb)) = (good(a), good(b)) else {
        return false;
    };
    a.uid == b.uid
        && a.restart_count == b.restart_count
        && match (ra.process_start, rb.process_start) {
            (Some(x), Some(y)) => (x - y).abs() < 0.5,
            _ => true,
        }
}

/// Whether any cumulative value went down from `a` to `b`.
fn decreased(a: &AgentReading, b: &AgentReading) -> Option<(&'static str, f64, f64)> {
    let pairs = [
        (
            "apply_count",
            a.apply.map(|s| s.count),
            b.apply.map(|s| s.count),
        ),
        ("apply_sum", a.apply.map(|s| s.sum), b.apply.map(|s| s.sum)),
        ("failures", a.failures, b.failures),
        ("resyncs", a.resyncs, b.resyncs),
        (
            "route_resync_count",
            a.route_resync.map(|s| s.count),
            b.route_resync.map(|s| s.count),
        ),
    ];
    pairs.into_iter().find_map(|(name, x, y)| match (x, y) {
        (Some(x), Some(y)) if y < x => Some((name, x, y)),
        _ => None,
    })
}

/// Mean of a cumulative (sum, count) pair between two readings: `None` unless Δcount > 0
/// and both deltas are non-negative.
fn delta_mean(
    a: &AgentReading,
    b: &AgentReading,
    pick: fn(&AgentReading) -> Option<super::profiles::SumCount>,
) -> Option<(f64, f64)> {
    let (x, y) = (pick(a)?, pick(b)?);
    let dc = y.count - x.count;
    let ds = y.sum - x.sum;
    (dc > 0.0 && ds >= 0.0 && ds.is_finite()).then(|| (ds / dc, dc))
}

fn apply_of(r: &AgentReading) -> Option<super::profiles::SumCount> {
    r.apply
}
fn route_of(r: &AgentReading) -> Option<super::profiles::SumCount> {
    r.route_resync
}

/// Good readings of `ring` of the incarnation of `last`, with `from ≤ at ≤ to`.
fn span<'a>(
    ring: &'a VecDeque<Observation>,
    last: &Observation,
    from: f64,
    to: f64,
) -> Vec<&'a Observation> {
    ring.iter()
        .filter(|o| o.at >= from && o.at <= to && same_incarnation(o, last))
        .collect()
}

/// The node's own history before `before`: (mean of pick, failure rate), over the
/// readings of the same incarnation within the lookback.
fn own_history(
    ring: &VecDeque<Observation>,
    before: &Observation,
    params: &Params,
) -> (Option<f64>, Option<f64>, Option<f64>) {
    let s = span(ring, before, before.at - params.lookback_seconds, before.at);
    let (Some(first), Some(last)) = (s.first(), s.last()) else {
        return (None, None, None);
    };
    let (Some(a), Some(b)) = (good(first), good(last)) else {
        return (None, None, None);
    };
    let dt = last.at - first.at;
    let apply = delta_mean(a, b, apply_of).map(|(m, _)| m);
    let route = delta_mean(a, b, route_of).map(|(m, _)| m);
    let rate = match (a.failures, b.failures) {
        (Some(x), Some(y))
            if dt >= params.min_rate_span_seconds.max(f64::MIN_POSITIVE) && y >= x =>
        {
            Some((y - x) / dt)
        }
        _ => None,
    };
    (apply, route, rate)
}

/// Per other node's recent (apply mean, route mean, failure rate) up to `end`.
fn cluster_values(
    history: &History,
    profile: &str,
    exclude: &str,
    end: f64,
    params: &Params,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut applies, mut routes, mut rates) = (Vec::new(), Vec::new(), Vec::new());
    for node in history.nodes_with(profile) {
        if node == exclude {
            continue;
        }
        let Some(ring) = history.ring(&node, profile) else {
            continue;
        };
        let Some(last) = ring.iter().rev().find(|o| o.at <= end && good(o).is_some()) else {
            continue;
        };
        let s = span(ring, last, end - params.lookback_seconds, end);
        let (Some(first), Some(lr)) = (s.first().and_then(|o| good(o)), good(last)) else {
            continue;
        };
        let lifetime = |sc: Option<super::profiles::SumCount>| {
            sc.filter(|s| s.count > 0.0 && s.sum.is_finite())
                .map(|s| s.sum / s.count)
        };
        if let Some(m) = delta_mean(first, lr, apply_of)
            .map(|(m, _)| m)
            .or_else(|| lifetime(lr.apply))
        {
            applies.push(m);
        }
        if let Some(m) = delta_mean(first, lr, route_of)
            .map(|(m, _)| m)
            .or_else(|| lifetime(lr.route_resync))
        {
            routes.push(m);
        }
        let dt = last.at - s.first().map_or(last.at, |o| o.at);
        if let (Some(x), Some(y)) = (first.failures, lr.failures) {
            if dt >= params.min_rate_span_seconds.max(f64::MIN_POSITIVE) && y >= x {
                rates.push((y - x) / dt);
            }
        }
    }
    (applies, routes, rates)
}

/// Median of the healthiest (lowest) ⌈k/2⌉ of `values`; `None` with fewer than
/// `min` values.
pub fn healthy_half_median(values: &[f64], min: usize) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < min.max(1) {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let half = &v[..v.len().div_ceil(2)];
    let n = half.len();
    Some(if n % 2 == 1 {
        half[n / 2]
    } else {
        (half[n / 2 - 1] + half[n / 2]) / 2.0
    })
}

/// Rounds for evidence: 7 significant digits (`{:.6e}`) keep JSON short and stable for
/// durations and rates; values of 10⁵ and more (Unix timestamps such as
/// `process_start_time_seconds`, large counters) keep every digit down to the
/// millisecond — rounding 1796002000 and 1796002004 to 7 digits made two different
/// process starts look equal.
fn r(x: f64) -> Value {
    if !x.is_finite() {
        return Value::Null;
    }
    if x.abs() >= 1e5 {
        return json!((x * 1000.0).round() / 1000.0);
    }
    let s = format!("{x:.6e}");
    s.parse::<f64>().map_or(Value::Null, |v| json!(v))
}

/// `r`, public for tests of the evidence rounding.
pub fn evidence_number(x: f64) -> Value {
    r(x)
}

fn opt(x: Option<f64>) -> Value {
    x.map_or(Value::Null, r)
}

fn suspect(node: &str, role: Role, signal: Signal, evidence: Map<String, Value>) -> Suspect {
    Suspect {
        node: node.to_owned(),
        role,
        signal,
        evidence: Value::Object(evidence),
    }
}

/// Whether `value` is flagged against the baselines (module doc, step 3).
fn flagged(value: f64, floor: f64, own: Option<f64>, cluster: Option<f64>, p: &Params) -> bool {
    let above = |b: Option<f64>| b.is_some_and(|b| value >= p.ratio * b);
    // Without a cluster baseline, a node slow all along is normal for its own history:
    // the no-baseline floor still catches it.
    let no_baseline = cluster.is_none() && value >= floor.max(p.apply_floor_no_baseline_seconds);
    value >= floor && (above(own) || above(cluster) || no_baseline)
}

/// Findings for one node in one role (see the module doc): none with correlation off;
/// `agent_unreachable` when no agent of a present profile is known on the node; then,
/// per profile, [`profile_findings`].
fn node_findings(
    history: &History,
    cluster: &ClusterView,
    window: &ProbeWindow,
    node: &str,
    role: Role,
    params: &Params,
) -> Vec<Suspect> {
    if cluster.searched_profiles.is_empty() {
        // Every profile disabled: correlation is off, nothing to report.
        return Vec::new();
    }
    let on_node = cluster
        .agents_on_node
        .get(node)
        .cloned()
        .unwrap_or_default();
    let mut profiles: BTreeSet<String> = history.profiles_on(node).into_iter().collect();
    profiles.extend(on_node.iter().cloned());
    if profiles.is_empty() {
        return vec![suspect(
            node,
            role,
            Signal::AgentUnreachable,
            no_agent_evidence(cluster),
        )];
    }
    let mut out = Vec::new();
    for profile in &cluster.present_profiles {
        if !profiles.contains(profile) {
            let mut e = Map::new();
            e.insert("reason".into(), json!("no_agent_pod_on_node"));
            e.insert("profile".into(), json!(profile));
            out.push(suspect(node, role, Signal::AgentUnreachable, e));
        }
    }
    for profile in &profiles {
        if let Some(ring) = history.ring(node, profile) {
            let gone = !on_node.contains(profile);
            let found = profile_findings(history, ring, window, node, profile, gone, params);
            out.extend(
                found
                    .into_iter()
                    .map(|(sig, e)| suspect(node, role, sig, e)),
            );
        }
    }
    out
}

/// Why no agent is known on a node: discovery failed, no agent pod in the cluster, or
/// none on this node.
fn no_agent_evidence(cluster: &ClusterView) -> Map<String, Value> {
    let mut e = Map::new();
    if cluster.present_profiles.is_empty() && !cluster.discovery_errors.is_empty() {
        e.insert("reason".into(), json!("discovery_failed"));
        e.insert("profiles_searched".into(), json!(cluster.searched_profiles));
        e.insert(
            "message".into(),
            json!(format!(
                "agent discovery failed: {} (the prober needs `list` and `watch` on pods in the agents' namespaces)",
                one_line(&cluster.discovery_errors.join("; "), MESSAGE_MAX_CHARS)
            )),
        );
    } else if cluster.present_profiles.is_empty() {
        e.insert("reason".into(), json!("no_agent_pods_in_cluster"));
        e.insert("profiles_searched".into(), json!(cluster.searched_profiles));
    } else {
        e.insert("reason".into(), json!("no_agent_pod_on_node"));
        e.insert("profiles_expected".into(), json!(cluster.present_profiles));
    }
    e
}

/// Evidence fields every finding of an observed agent starts with.
fn agent_evidence(profile: &str, o: &Observation) -> Map<String, Value> {
    let mut e = Map::new();
    e.insert("profile".into(), json!(profile));
    e.insert("agent_pod".into(), json!(&*o.pod));
    if let Some(p) = o.scrape_path {
        e.insert("scrape_path".into(), json!(p));
    }
    e
}

/// An agent that did not answer some scrapes during the probe (timed out or refused)
/// while the latest one answered again (issue 29): it stopped answering (paused,
/// starved, restarting its listener) and came back. That is evidence on the node, unlike
/// a failure that lasts to the window's end (then we only could not look).
fn stalled_in_window(
    ring: &std::collections::VecDeque<Observation>,
    window: &ProbeWindow,
    node: &str,
    profile: &str,
) -> Option<(Signal, Map<String, Value>)> {
    if ring.back().is_none_or(|o| o.outcome.is_err()) {
        return None;
    }
    let stalled: Vec<&Observation> = ring
        .iter()
        .filter(|o| o.at >= window.start && o.at <= window.end + END_SLACK_SECONDS)
        .filter(|o| {
            matches!(&o.outcome, Err(f) if f.signal == Signal::AgentUnreachable
                && STALL_REASONS.contains(&f.reason))
        })
        .collect();
    let (first, last) = (stalled.first()?, stalled.last()?);
    let mut e = agent_evidence(profile, first);
    let why = match &first.outcome {
        Err(f) => f.reason,
        Ok(_) => "",
    };
    e.insert("reason".into(), json!(STALLED_IN_WINDOW));
    e.insert("failed_scrapes".into(), json!(stalled.len()));
    e.insert("first_failure".into(), json!(why));
    e.insert(
        "first_failure_seconds_into_window".into(),
        r(first.at - window.start),
    );
    e.insert(
        "last_failure_seconds_into_window".into(),
        r(last.at - window.start),
    );
    e.insert(
        "message".into(),
        json!(format!(
            "{profile} on {node} did not answer {} scrape(s) during the probe (first: {why}), then answered again",
            stalled.len()
        )),
    );
    Some((Signal::AgentUnreachable, e))
}

/// Findings of one agent (`profile` on `node`, its observations `ring`) over the
/// window: `agent_pod_gone` when its pod left the node (`gone`) and nothing else;
/// else the latest scrape's failure, a not-Ready reading inside the window, and what
/// the window's two good readings show ([`RULES`]; `agent_restarted` instead of any
/// rate when they belong to different processes).
fn profile_findings(
    history: &History,
    ring: &std::collections::VecDeque<Observation>,
    window: &ProbeWindow,
    node: &str,
    profile: &str,
    gone: bool,
    params: &Params,
) -> Vec<(Signal, Map<String, Value>)> {
    let mut out = Vec::new();
    // The agent pod went away (deleted, evicted) and no pod of the profile took
    // over on this node: its last reading is history, the node is unobserved now.
    if let Some(last) = ring.back().filter(|_| gone) {
        let mut e = Map::new();
        e.insert("profile".into(), json!(profile));
        e.insert("agent_pod".into(), json!(&*last.pod));
        e.insert("reason".into(), json!("agent_pod_gone"));
        e.insert(
            "seconds_since_last_scrape".into(),
            r((window.end.max(window.start) - last.at).max(0.0)),
        );
        e.insert(
            "message".into(),
            json!(format!(
                "agent pod {} is gone from node {node} and no {profile} pod replaced it",
                last.pod
            )),
        );
        out.push((Signal::AgentUnreachable, e));
        return out;
    }
    // Reachability at the end of the window: the latest observation.
    if let Some(last) = ring.back().filter(|o| o.at >= window.start) {
        if let Err(f) = &last.outcome {
            let mut e = agent_evidence(profile, last);
            e.insert("reason".into(), json!(f.reason));
            e.insert("message".into(), json!(f.message));
            out.push((f.signal, e));
        }
    }
    out.extend(stalled_in_window(ring, window, node, profile));
    // Readiness inside the window.
    if let Some(nr) = ring
        .iter()
        .find(|o| o.at >= window.start && o.at <= window.end + END_SLACK_SECONDS && !o.ready)
    {
        let mut e = agent_evidence(profile, nr);
        e.insert("ready".into(), json!(false));
        e.insert("seconds_into_window".into(), r(nr.at - window.start));
        out.push((Signal::AgentNotReady, e));
    }
    let Some((before, after)) = window_readings(ring, window) else {
        return out;
    };
    let (Some(rb), Some(ra)) = (good(before), good(after)) else {
        return out;
    };
    let dec = decreased(rb, ra);
    if !same_incarnation(before, after) || dec.is_some() {
        out.push((
            Signal::AgentRestarted,
            restart_evidence(profile, before, after, rb, ra, dec),
        ));
        return out;
    }
    let (own_apply, own_route, own_rate) = own_history(ring, before, params);
    let (c_apply, c_route, c_rate) = cluster_values(history, profile, node, window.end, params);
    let w = WindowReadings {
        profile,
        after,
        rb,
        ra,
        dt: after.at - before.at,
        own: [own_apply, own_route, own_rate],
        healthy_half: [
            healthy_half_median(&c_apply, params.min_cluster_nodes),
            healthy_half_median(&c_route, params.min_cluster_nodes),
            healthy_half_median(&c_rate, params.min_cluster_nodes),
        ],
        cluster_nodes: c_apply.len(),
    };
    out.extend(RULES.iter().filter_map(|rule| rule(&w, params)));
    out
}

/// The window's two good readings: the last at or before its start (else the first
/// inside it) and the first at or after its end (else the last inside it, after the
/// first one).
fn window_readings<'a>(
    ring: &'a std::collections::VecDeque<Observation>,
    window: &ProbeWindow,
) -> Option<(&'a Observation, &'a Observation)> {
    let before = ring
        .iter()
        .rev()
        .find(|o| o.at <= window.start && good(o).is_some())
        .or_else(|| {
            ring.iter()
                .find(|o| o.at > window.start && o.at < window.end && good(o).is_some())
        })?;
    let after = ring
        .iter()
        .find(|o| o.at >= window.end && good(o).is_some())
        .or_else(|| {
            ring.iter()
                .rev()
                .find(|o| o.at > before.at && o.at < window.end && good(o).is_some())
        })
        .filter(|a| a.at > before.at)?;
    Some((before, after))
}

/// `agent_restarted`'s evidence: what changed between the window's two readings (pod
/// UID, restart count, process start, a counter that went down).
fn restart_evidence(
    profile: &str,
    before: &Observation,
    after: &Observation,
    rb: &AgentReading,
    ra: &AgentReading,
    dec: Option<(&'static str, f64, f64)>,
) -> Map<String, Value> {
    let mut e = agent_evidence(profile, after);
    e.insert("window_seconds".into(), r(after.at - before.at));
    if before.uid != after.uid {
        e.insert("pod_uid_changed".into(), json!(true));
    }
    e.insert("restart_count_before".into(), json!(before.restart_count));
    e.insert("restart_count_after".into(), json!(after.restart_count));
    e.insert("process_start_before".into(), opt(rb.process_start));
    e.insert("process_start_after".into(), opt(ra.process_start));
    e.insert(
        "restart_span".into(),
        json!("before: the last reading at or before the probe window start; after: the first at or after its end"),
    );
    if let Some((name, x, y)) = dec {
        e.insert("counter_decreased".into(), json!(name));
        e.insert("value_before".into(), r(x));
        e.insert("value_after".into(), r(y));
    }
    e
}

/// What the rate rules read: one agent's two good readings around a probe window (same
/// process), and its baselines — its own history and the cluster's healthy half — for
/// apply time, route resync time and failure rate, in that order.
struct WindowReadings<'a> {
    profile: &'a str,
    after: &'a Observation,
    rb: &'a AgentReading,
    ra: &'a AgentReading,
    /// Seconds between the two readings.
    dt: f64,
    own: [Option<f64>; 3],
    healthy_half: [Option<f64>; 3],
    /// Nodes the cluster apply baseline compared.
    cluster_nodes: usize,
}

/// One signal's rule over [`WindowReadings`]: its finding's evidence, if it fires.
type Rule = fn(&WindowReadings<'_>, &Params) -> Option<(Signal, Map<String, Value>)>;

/// The rate rules, one per signal (module doc, step 3).
const RULES: [Rule; 4] = [
    apply_slow,
    apply_failures,
    datastore_resync,
    route_resync_slow,
];

/// `dataplane_apply_slow`: the window's mean apply time is flagged against the node's
/// own history or the cluster's healthy half ([`flagged`], floor `apply_floor_seconds`).
fn apply_slow(w: &WindowReadings<'_>, params: &Params) -> Option<(Signal, Map<String, Value>)> {
    let (mean, dc) = delta_mean(w.rb, w.ra, apply_of)?;
    let (own, hh) = (w.own[0], w.healthy_half[0]);
    if !flagged(mean, params.apply_floor_seconds, own, hh, params) {
        return None;
    }
    let mut e = agent_evidence(w.profile, w.after);
    e.insert("apply_mean_seconds".into(), r(mean));
    e.insert("applies_in_window".into(), r(dc));
    e.insert("window_seconds".into(), r(w.dt));
    e.insert("healthy_half_apply_mean_seconds".into(), opt(hh));
    e.insert("cluster_nodes_compared".into(), json!(w.cluster_nodes));
    e.insert("own_history_apply_mean_seconds".into(), opt(own));
    e.insert("apply_p99_seconds_10m".into(), opt(w.ra.apply_p99_seconds));
    e.insert("floor_seconds".into(), r(params.apply_floor_seconds));
    Some((Signal::DataplaneApplySlow, e))
}

/// `dataplane_apply_failures`: at least `failures_min` failures at a rate over
/// `failures_rate_floor` and `ratio` × the baselines (or with no baseline at all).
fn apply_failures(w: &WindowReadings<'_>, params: &Params) -> Option<(Signal, Map<String, Value>)> {
    let (Some(x), Some(y)) = (w.rb.failures, w.ra.failures) else {
        return None;
    };
    let (own_rate, hh_rate) = (w.own[2], w.healthy_half[2]);
    let df = y - x;
    let rate = if w.dt > 0.0 { df / w.dt } else { 0.0 };
    let above = |b: Option<f64>| b.is_some_and(|b| rate > params.ratio * b);
    let fires = df >= params.failures_min
        && rate >= params.failures_rate_floor
        && (above(own_rate) || above(hh_rate) || (own_rate.is_none() && hh_rate.is_none()));
    if !fires {
        return None;
    }
    let mut e = agent_evidence(w.profile, w.after);
    e.insert("failures_in_window".into(), r(df));
    e.insert("failures_per_second".into(), r(rate));
    e.insert("window_seconds".into(), r(w.dt));
    e.insert("healthy_half_failures_per_second".into(), opt(hh_rate));
    e.insert("own_history_failures_per_second".into(), opt(own_rate));
    Some((Signal::DataplaneApplyFailures, e))
}

/// `datastore_resync`: at least `resyncs_min` datastore resyncs in the window.
fn datastore_resync(
    w: &WindowReadings<'_>,
    params: &Params,
) -> Option<(Signal, Map<String, Value>)> {
    let (Some(x), Some(y)) = (w.rb.resyncs, w.ra.resyncs) else {
        return None;
    };
    if y - x < params.resyncs_min {
        return None;
    }
    let mut e = agent_evidence(w.profile, w.after);
    e.insert("resyncs_in_window".into(), r(y - x));
    e.insert("window_seconds".into(), r(w.dt));
    e.insert("resyncs_total".into(), r(y));
    Some((Signal::DatastoreResync, e))
}

/// `route_resync_slow`: the window's mean route-table resync time is flagged against
/// the baselines ([`flagged`], floor `route_floor_seconds`).
fn route_resync_slow(
    w: &WindowReadings<'_>,
    params: &Params,
) -> Option<(Signal, Map<String, Value>)> {
    let (mean, dc) = delta_mean(w.rb, w.ra, route_of)?;
    let (own, hh) = (w.own[1], w.healthy_half[1]);
    if !flagged(mean, params.route_floor_seconds, own, hh, params) {
        return None;
    }
    let mut e = agent_evidence(w.profile, w.after);
    e.insert("route_resync_mean_seconds".into(), r(mean));
    e.insert("route_resyncs_in_window".into(), r(dc));
    e.insert("window_seconds".into(), r(w.dt));
    e.insert("healthy_half_route_resync_mean_seconds".into(), opt(hh));
    e.insert("own_history_route_resync_mean_seconds".into(), opt(own));
    Some((Signal::RouteResyncSlow, e))
}

/// Every finding for the probe's source and target nodes (one evaluation per node when
/// both are the same node, under role `source`). Pure.
pub fn correlate(
    history: &History,
    cluster: &ClusterView,
    window: &ProbeWindow,
    params: &Params,
) -> Vec<Suspect> {
    let mut out = node_findings(
        history,
        cluster,
        window,
        &window.source_node,
        Role::Source,
        params,
    );
    if window.target_node != window.source_node {
        out.extend(node_findings(
            history,
            cluster,
            window,
            &window.target_node,
            Role::Target,
            params,
        ));
    }
    out
}

/// Splits findings into (`ProbeRecord.suspects`, `GateReport.warnings` candidates) by
/// the probe's result: on `slow` / `failed` probes every finding but `agent_unreachable`
/// is a suspect; on `success` and `inconclusive` all are warnings (docs/design.md §3: agent
/// trouble with normal TTFP is never a failure). `agent_unreachable` is a warning (it
/// explains nothing, it says we could not look) — except an agent that stopped
/// answering during the probe and came back ([`STALLED_IN_WINDOW`]), which does explain
/// it.
pub fn split_findings(findings: Vec<Suspect>, result: ProbeResult) -> (Vec<Suspect>, Vec<Suspect>) {
    let blame = matches!(result, ProbeResult::Slow | ProbeResult::Failed);
    findings.into_iter().partition(|s| {
        blame
            && (s.signal != Signal::AgentUnreachable
                || s.evidence.get("reason").and_then(|r| r.as_str()) == Some(STALLED_IN_WINDOW))
    })
}

/// Evidence keys of an `agent_restarted` finding that describe the *end* of its span;
/// a merged warning takes them from the latest probe (the others from the first).
const RESTART_AFTER_KEYS: &[&str] = &[
    "restart_count_after",
    "process_start_after",
    "pod_uid_changed",
    "agent_pod",
];

/// Adds one probe's warnings (`new`) to the run's `into`, keeping one warning per
/// (node, signal). Call once per probe: `seen_in_probes` counts calls (distinct
/// probes) that had the (node, signal), however many profiles it came from.
///
/// The first warning seen keeps its evidence (its `profile`, `reason`, `message` stay
/// at the top level) and gains `seen_in_probes` and `profiles` (every profile seen with
/// this (node, signal), in order of appearance); with more than one profile,
/// `by_profile` maps each profile to its own first evidence (so a kube-proxy problem on
/// the node of a Felix problem stays visible). For `agent_restarted`, the `…_before`
/// numbers are those of the first probe and the `…_after` numbers those of the latest
/// one (`restart_span` says so), so the restart count covers the whole run.
pub fn merge_warnings(into: &mut Vec<Suspect>, new: Vec<Suspect>) {
    let mut counted: BTreeSet<(String, Signal)> = BTreeSet::new();
    for w in new {
        let key = (w.node.clone(), w.signal);
        let first_in_call = counted.insert(key);
        let profile = w
            .evidence
            .get("profile")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match into
            .iter_mut()
            .find(|x| x.node == w.node && x.signal == w.signal)
        {
            Some(existing) => {
                let Value::Object(m) = &mut existing.evidence else {
                    continue;
                };
                if first_in_call {
                    let n = m.get("seen_in_probes").and_then(Value::as_u64).unwrap_or(1);
                    m.insert("seen_in_probes".into(), json!(n + 1));
                }
                if w.signal == Signal::AgentRestarted {
                    for k in RESTART_AFTER_KEYS {
                        if let Some(v) = w.evidence.get(*k) {
                            m.insert((*k).into(), v.clone());
                        }
                    }
                    m.insert(
                        "restart_span".into(),
                        json!("before: the first probe window of the run with this finding; after: the latest"),
                    );
                }
                if let Some(p) = profile {
                    let mut profiles: Vec<Value> = m
                        .get("profiles")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    if !profiles.iter().any(|x| x.as_str() == Some(p.as_str())) {
                        profiles.push(json!(p));
                        let mut by: Map<String, Value> = m
                            .get("by_profile")
                            .and_then(Value::as_object)
                            .cloned()
                            .unwrap_or_else(|| {
                                // The first profile's own evidence, as it was.
                                let mut by = Map::new();
                                if let Some(first) = m.get("profile").and_then(Value::as_str) {
                                    by.insert(first.to_owned(), profile_evidence(m));
                                }
                                by
                            });
                        if let Value::Object(wm) = &w.evidence {
                            by.insert(p.clone(), profile_evidence(wm));
                        }
                        m.insert("profiles".into(), Value::Array(profiles));
                        m.insert("by_profile".into(), Value::Object(by));
                    }
                }
            }
            None => {
                let mut w = w;
                if let Value::Object(m) = &mut w.evidence {
                    m.insert("seen_in_probes".into(), json!(1));
                    m.insert(
                        "profiles".into(),
                        json!(profile.map(|p| vec![p]).unwrap_or_default()),
                    );
                }
                into.push(w);
            }
        }
    }
}

/// One profile's evidence inside `by_profile`: the evidence without the merge's own
/// keys.
fn profile_evidence(m: &Map<String, Value>) -> Value {
    let mut e = m.clone();
    for k in [
        "seen_in_probes",
        "profiles",
        "by_profile",
        "profile",
        "restart_span",
    ] {
        e.remove(k);
    }
    Value::Object(e)
}
