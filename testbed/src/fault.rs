//! Fault files (DESIGN §6 "Fault file", binding grammar; primitives in §5 "Faults").
//!
//! ```yaml
//! rules:
//!   - nodes: {all: true}                  # or {names: [node-1]} or {labels: {zone: a}}
//!     program_delay: {uniform: [200ms, 1.5s]}
//!   - nodes: {names: [node-2]}
//!     from: 10s                           # active for endpoints added 10 s ..
//!     until: 1m                           # .. 60 s after the file was applied
//!     program_delay: {lognormal: {median: 2s, p99: 20s}}
//!     resync_loop: {period: 10s, open: 500ms}
//!     never_program: 0.1                  # or true / false
//! ```
//!
//! - Durations: a scalar humantime string is fixed (`200ms`, `1.5s`); `{uniform: [a, b]}`;
//!   `{lognormal: {median, p99}}`.
//! - Probabilities are 0–1 (`true` = 1, `false` = 0).
//! - Rules apply in order; a later rule overrides an earlier one key by key for the nodes
//!   both select. A rule with `from`/`until` applies to endpoints added in
//!   `[from, until)` after the file was applied.
//! - Unknown keys are an error naming the line and the key.
//! - Implemented primitives: `program_delay` (time from `endpoint_added` to
//!   `endpoint_programmed`), `resync_loop: {period, open}` (an endpoint whose delay has
//!   elapsed is programmed only inside the next open window; windows start every `period`
//!   from the file's application) and `never_program`. The other §5 primitives (`queue`,
//!   `revoke`, `name_reuse_race`, `first_connections_dropped`, `cross_node`,
//!   `stale_routes`, `service_delay`, `clock_skew`, `agent`) are recognised and rejected
//!   with "primitive X is not implemented yet (testbed issue 2 of 4)" and the line.

use crate::truth::{Truth, TruthEvent, TruthKind};
use rand::{Rng, RngExt};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// z-score of the 99th percentile of the standard normal distribution, used to turn
/// `{lognormal: {median, p99}}` into σ = ln(p99/median) / z.
const Z_P99: f64 = 2.326_347_874_040_840_8;

/// Cap of a lognormal sample: one day (longer than any test or probe give-up).
pub const MAX_SAMPLE: Duration = Duration::from_secs(86_400);

/// Errors of fault-file parsing.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// YAML syntax error, unknown key, bad value or unimplemented primitive. `message`
    /// names the key and ends with "at line L column C" (or "at line L").
    #[error("fault file: {message}")]
    Parse {
        message: String,
        /// 1-based line, when known.
        line: Option<usize>,
    },
}

impl FaultError {
    /// From serde_yaml_ng's error, making sure the message ends with the location
    /// (serde_yaml_ng leaves it out at line 1 column 1, and has none for some errors; an
    /// unknown key then gets its line from the text).
    fn from_yaml(e: serde_yaml_ng::Error, text: &str) -> FaultError {
        let mut message = e.to_string();
        let mut line = e.location().map(|l| l.line());
        if let Some(l) = e.location() {
            // serde_yaml_ng omits the position when it is line 1 column 1.
            if !message.contains(" at line ") {
                message.push_str(&format!(" at line {} column {}", l.line(), l.column()));
            }
        } else {
            let key = message
                .split_once("unknown field `")
                .and_then(|(_, rest)| rest.split_once('`'))
                .map(|(k, _)| k.to_owned());
            if let Some(key) = key {
                line = text
                    .lines()
                    .position(|l| {
                        let l = l.trim_start().trim_start_matches("- ").trim_start();
                        l.strip_prefix(key.as_str())
                            .is_some_and(|r| r.trim_start().starts_with(':'))
                    })
                    .map(|i| i + 1);
                if let Some(n) = line {
                    message.push_str(&format!(" at line {n}"));
                }
            }
        }
        FaultError::Parse { message, line }
    }
}

/// A duration distribution (DESIGN §6 "Durations").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DurationDist {
    /// A scalar: always this.
    Fixed(Duration),
    /// `{uniform: [a, b]}`: uniform on `[a, b]`, `a ≤ b`.
    Uniform(Duration, Duration),
    /// `{lognormal: {median, p99}}`: exp(N(ln median, σ)) with σ from the p99,
    /// `0 < median ≤ p99`.
    Lognormal { median: Duration, p99: Duration },
}

impl DurationDist {
    /// One sample. Lognormal samples use Box–Muller on two uniforms and are capped at
    /// [`MAX_SAMPLE`] (a heavy tail must not overflow timers).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            DurationDist::Fixed(d) => d,
            DurationDist::Uniform(a, b) => {
                if a == b {
                    a
                } else {
                    Duration::from_secs_f64(rng.random_range(a.as_secs_f64()..=b.as_secs_f64()))
                }
            }
            DurationDist::Lognormal { median, p99 } => {
                let m = median.as_secs_f64();
                let sigma = (p99.as_secs_f64() / m).ln() / Z_P99;
                let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
                let u2: f64 = rng.random::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let s = m * (sigma * z).exp();
                Duration::try_from_secs_f64(s)
                    .unwrap_or(MAX_SAMPLE)
                    .min(MAX_SAMPLE)
            }
        }
    }
}

fn parse_duration_str<E: de::Error>(s: &str) -> Result<Duration, E> {
    humantime::parse_duration(s.trim()).map_err(|e| {
        E::custom(format!(
            "invalid duration {s:?}: {e} (use a humantime string such as 200ms or 1.5s)"
        ))
    })
}

/// A duration written as a humantime string.
#[derive(Debug, Clone, Copy, PartialEq)]
struct HumanDuration(Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as 200ms or 1.5s")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<HumanDuration, E> {
                parse_duration_str(s).map(HumanDuration)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<HumanDuration, E> {
                if n == 0 {
                    Ok(HumanDuration(Duration::ZERO))
                } else {
                    Err(E::custom(format!(
                        "duration {n} has no unit (write e.g. {n}s or {n}ms)"
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for DurationDist {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Lognormal {
            median: HumanDuration,
            p99: HumanDuration,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DurationDist;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration (200ms), {uniform: [a, b]} or {lognormal: {median, p99}}")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DurationDist, E> {
                parse_duration_str(s).map(DurationDist::Fixed)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<DurationDist, E> {
                HumanDuration::deserialize(de::value::U64Deserializer::<E>::new(n))
                    .map(|h| DurationDist::Fixed(h.0))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<DurationDist, A::Error> {
                let key: String = map.next_key()?.ok_or_else(|| {
                    de::Error::custom("empty distribution; expected uniform or lognormal")
                })?;
                let dist = match key.as_str() {
                    "uniform" => {
                        let [a, b]: [HumanDuration; 2] = map.next_value()?;
                        if a.0 > b.0 {
                            return Err(de::Error::custom(format!(
                                "uniform: lower bound {:?} is above upper bound {:?}",
                                a.0, b.0
                            )));
                        }
                        DurationDist::Uniform(a.0, b.0)
                    }
                    "lognormal" => {
                        let l: Lognormal = map.next_value()?;
                        if l.median.0.is_zero() || l.p99.0 < l.median.0 {
                            return Err(de::Error::custom("lognormal: need 0 < median ≤ p99"));
                        }
                        DurationDist::Lognormal {
                            median: l.median.0,
                            p99: l.p99.0,
                        }
                    }
                    other => {
                        return Err(de::Error::custom(format!(
                            "unknown distribution `{other}`, expected `uniform` or `lognormal`"
                        )))
                    }
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "unexpected key `{extra}`: a distribution has exactly one key"
                    )));
                }
                Ok(dist)
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for DurationDist {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let h = |d: &Duration| humantime::format_duration(*d).to_string();
        match self {
            DurationDist::Fixed(d) => s.serialize_str(&h(d)),
            DurationDist::Uniform(a, b) => {
                let mut m = BTreeMap::new();
                m.insert("uniform", vec![h(a), h(b)]);
                m.serialize(s)
            }
            DurationDist::Lognormal { median, p99 } => {
                let mut inner = BTreeMap::new();
                inner.insert("median", h(median));
                inner.insert("p99", h(p99));
                let mut m = BTreeMap::new();
                m.insert("lognormal", inner);
                m.serialize(s)
            }
        }
    }
}

fn ser_opt_duration<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        None => s.serialize_none(),
    }
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

/// A probability 0–1; YAML `true`/`false` mean 1/0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Probability(pub f64);

impl<'de> Deserialize<'de> for Probability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Probability;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true, false or a probability between 0 and 1")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Probability, E> {
                Ok(Probability(if b { 1.0 } else { 0.0 }))
            }
            fn visit_f64<E: de::Error>(self, p: f64) -> Result<Probability, E> {
                if (0.0..=1.0).contains(&p) {
                    Ok(Probability(p))
                } else {
                    Err(E::custom(format!("probability {p} is outside 0–1")))
                }
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Probability, E> {
                self.visit_f64(n as f64)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Probability, E> {
                self.visit_f64(n as f64)
            }
        }
        d.deserialize_any(V)
    }
}

/// `resync_loop: {period, open}`: programming happens only in windows
/// `[k·period, k·period + open)` after the file was applied. `0 < open ≤ period`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ResyncLoop {
    #[serde(serialize_with = "ser_duration")]
    pub period: Duration,
    #[serde(serialize_with = "ser_duration")]
    pub open: Duration,
}

impl<'de> Deserialize<'de> for ResyncLoop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            period: HumanDuration,
            open: HumanDuration,
        }
        let r = Raw::deserialize(d)?;
        if r.period.0.is_zero() || r.open.0.is_zero() || r.open.0 > r.period.0 {
            return Err(de::Error::custom("resync_loop: need 0 < open ≤ period"));
        }
        Ok(ResyncLoop {
            period: r.period.0,
            open: r.open.0,
        })
    }
}

impl ResyncLoop {
    /// The earliest instant ≥ `t` (both measured from the file's application) that lies
    /// inside an open window.
    pub fn next_open(&self, t: Duration) -> Duration {
        let p = self.period.as_nanos();
        let tn = t.as_nanos();
        if tn % p < self.open.as_nanos() {
            t
        } else {
            let start = (tn / p + 1) * p;
            Duration::from_nanos(u64::try_from(start).unwrap_or(u64::MAX))
        }
    }
}

/// Which nodes a rule selects.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeSelector {
    /// `{names: [node-1, …]}`.
    Names(Vec<String>),
    /// `{labels: {k: v, …}}`: every pair must match the node's labels.
    Labels(BTreeMap<String, String>),
    /// `{all: true}`.
    All,
}

impl NodeSelector {
    /// Whether the node with this name and these labels is selected.
    pub fn matches(&self, node: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            NodeSelector::Names(n) => n.iter().any(|n| n == node),
            NodeSelector::Labels(want) => want.iter().all(|(k, v)| labels.get(k) == Some(v)),
            NodeSelector::All => true,
        }
    }
}

impl<'de> Deserialize<'de> for NodeSelector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            names: Option<Vec<String>>,
            labels: Option<BTreeMap<String, String>>,
            all: Option<bool>,
        }
        let r = Raw::deserialize(d)?;
        match (r.names, r.labels, r.all) {
            (Some(n), None, None) => Ok(NodeSelector::Names(n)),
            (None, Some(l), None) => Ok(NodeSelector::Labels(l)),
            (None, None, Some(true)) => Ok(NodeSelector::All),
            (None, None, Some(false)) => Err(de::Error::custom(
                "nodes: `all: false` selects nothing; use names or labels",
            )),
            _ => Err(de::Error::custom(
                "nodes: give exactly one of names, labels, all",
            )),
        }
    }
}

/// Uninhabited: the value of a primitive that is parsed only to be rejected.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Unimplemented {}

/// Rejects any value of an unimplemented primitive. Going through `deserialize_any`
/// lets serde_yaml_ng stamp the error with the value's line.
struct Reject(&'static str);

impl Reject {
    fn err<E: de::Error>(&self) -> E {
        E::custom(format!(
            "primitive `{}` is not implemented yet (testbed issue 2 of 4)",
            self.0
        ))
    }
}

impl<'de> Visitor<'de> for Reject {
    type Value = Option<Unimplemented>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "nothing: primitive `{}` is not implemented yet", self.0)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(self.err())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(self.err())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(self.err())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(self.err())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Err(self.err())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(self.err())
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Err(self.err())
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.err())
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.err())
    }
}

macro_rules! rejecters {
    ($($f:ident => $name:literal),* $(,)?) => {
        $(
            fn $f<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Unimplemented>, D::Error> {
                d.deserialize_any(Reject($name))
            }
        )*
    };
}

rejecters! {
    reject_queue => "queue",
    reject_revoke => "revoke",
    reject_name_reuse_race => "name_reuse_race",
    reject_first_connections_dropped => "first_connections_dropped",
    reject_cross_node => "cross_node",
    reject_stale_routes => "stale_routes",
    reject_service_delay => "service_delay",
    reject_clock_skew => "clock_skew",
    reject_agent => "agent",
}

/// One rule as written.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rule {
    /// Which nodes it applies to.
    pub nodes: NodeSelector,
    /// Applies to endpoints added at or after this long since the file was applied.
    #[serde(serialize_with = "ser_opt_duration")]
    pub from: Option<Duration>,
    /// … and before this long since the file was applied.
    #[serde(serialize_with = "ser_opt_duration")]
    pub until: Option<Duration>,
    /// Time from `endpoint_added` to `endpoint_programmed`.
    pub program_delay: Option<DurationDist>,
    /// Programming only inside periodic open windows.
    pub resync_loop: Option<ResyncLoop>,
    /// Probability that a new endpoint is never programmed.
    pub never_program: Option<Probability>,
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Raw {
            nodes: NodeSelector,
            #[serde(default)]
            from: Option<HumanDuration>,
            #[serde(default)]
            until: Option<HumanDuration>,
            #[serde(default)]
            program_delay: Option<DurationDist>,
            #[serde(default)]
            resync_loop: Option<ResyncLoop>,
            #[serde(default)]
            never_program: Option<Probability>,
            #[serde(default, deserialize_with = "reject_queue")]
            queue: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_revoke")]
            revoke: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_name_reuse_race")]
            name_reuse_race: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_first_connections_dropped")]
            first_connections_dropped: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_cross_node")]
            cross_node: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_stale_routes")]
            stale_routes: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_service_delay")]
            service_delay: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_clock_skew")]
            clock_skew: Option<Unimplemented>,
            #[serde(default, deserialize_with = "reject_agent")]
            agent: Option<Unimplemented>,
        }
        let r = Raw::deserialize(d)?;
        let (from, until) = (r.from.map(|h| h.0), r.until.map(|h| h.0));
        if let (Some(f), Some(u)) = (from, until) {
            if f >= u {
                return Err(de::Error::custom(format!(
                    "from ({f:?}) must be before until ({u:?})"
                )));
            }
        }
        Ok(Rule {
            nodes: r.nodes,
            from,
            until,
            program_delay: r.program_delay,
            resync_loop: r.resync_loop,
            never_program: r.never_program,
        })
    }
}

/// A parsed fault file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultFile {
    /// Rules in file order (later ones override earlier ones key by key).
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// The faults in force for one node at one moment, resolved from every matching rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct NodeFaults {
    pub program_delay: Option<DurationDist>,
    pub resync_loop: Option<ResyncLoop>,
    pub never_program: Option<Probability>,
}

impl NodeFaults {
    /// Samples `program_delay` (zero when unset).
    pub fn sample_program_delay<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        self.program_delay.map_or(Duration::ZERO, |d| d.sample(rng))
    }

    /// Decides the fate of a new endpoint: `None` = never programmed (`never_program`
    /// drew true), else the sampled `program_delay` (zero when unset).
    pub fn plan_programming<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<Duration> {
        if let Some(Probability(p)) = self.never_program {
            if rng.random_bool(p.clamp(0.0, 1.0)) {
                return None;
            }
        }
        Some(self.sample_program_delay(rng))
    }

    /// When an endpoint whose delay has elapsed at `due` (time since the file's
    /// application) gets programmed: `due` itself, or the start of the next open
    /// `resync_loop` window.
    pub fn programming_time(&self, due: Duration) -> Duration {
        self.resync_loop.map_or(due, |r| r.next_open(due))
    }

    /// Whether any fault is in force.
    pub fn is_empty(&self) -> bool {
        self == &NodeFaults::default()
    }
}

impl FaultFile {
    /// Parses a fault file. An empty document is an empty file (no rules). Errors:
    /// [`FaultError::Parse`] with serde_yaml_ng's message: syntax errors, unknown keys
    /// ("unknown field `x`, expected one of …"), bad values and unimplemented primitives,
    /// each followed by "at line L column C".
    pub fn parse(yaml: &str) -> Result<FaultFile, FaultError> {
        if yaml.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        }) {
            return Ok(FaultFile::default());
        }
        serde_yaml_ng::from_str(yaml).map_err(|e| FaultError::from_yaml(e, yaml))
    }

    /// Resolves the faults for node `node` with `labels`, for an endpoint added
    /// `since_applied` after the file was applied: every rule that selects the node and
    /// whose `[from, until)` contains `since_applied` is applied in order, each key it
    /// sets overriding earlier rules.
    pub fn for_node(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
        since_applied: Duration,
    ) -> NodeFaults {
        let mut out = NodeFaults::default();
        for r in &self.rules {
            if !r.nodes.matches(node, labels) {
                continue;
            }
            if r.from.is_some_and(|f| since_applied < f)
                || r.until.is_some_and(|u| since_applied >= u)
            {
                continue;
            }
            if r.program_delay.is_some() {
                out.program_delay = r.program_delay;
            }
            if r.resync_loop.is_some() {
                out.resync_loop = r.resync_loop;
            }
            if r.never_program.is_some() {
                out.never_program = r.never_program;
            }
        }
        out
    }
}

/// The fault file in force, when it was applied and its generation (starts at 0, +1 per
/// [`Faults::set`]).
#[derive(Debug, Clone)]
pub struct Applied {
    pub file: Arc<FaultFile>,
    pub applied_at: Instant,
    pub generation: u64,
}

struct FaultsInner {
    state: RwLock<Applied>,
    tx: watch::Sender<u64>,
}

/// The cluster's shared, replaceable fault state. Cheap to clone; every agent holds one
/// and is woken through [`Faults::subscribe`] when the file changes (`testbed fault set`).
#[derive(Clone)]
pub struct Faults {
    inner: Arc<FaultsInner>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faults")
            .field("current", &self.current())
            .finish()
    }
}

impl Faults {
    /// Starts with `file` applied now (generation 0).
    pub fn new(file: FaultFile) -> Faults {
        let (tx, _) = watch::channel(0);
        Faults {
            inner: Arc::new(FaultsInner {
                state: RwLock::new(Applied {
                    file: Arc::new(file),
                    applied_at: Instant::now(),
                    generation: 0,
                }),
                tx,
            }),
        }
    }

    /// The file in force.
    pub fn current(&self) -> Applied {
        self.inner
            .state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the file (applied now) and wakes every subscriber. Returns the new state.
    pub fn set(&self, file: FaultFile) -> Applied {
        let applied = {
            let mut st = self.inner.state.write().unwrap_or_else(|p| p.into_inner());
            *st = Applied {
                file: Arc::new(file),
                applied_at: Instant::now(),
                generation: st.generation + 1,
            };
            st.clone()
        };
        self.inner.tx.send_replace(applied.generation);
        applied
    }

    /// Like [`Faults::set`] and records `fault_changed` in the truth log, with `detail`
    /// `{generation, rules}` (rules as parsed, durations as humantime strings).
    pub fn set_and_record(&self, file: FaultFile, truth: &Truth) -> Applied {
        let applied = self.set(file);
        truth.emit(TruthEvent {
            detail: serde_json::json!({
                "generation": applied.generation,
                "rules": serde_json::to_value(&applied.file.rules).unwrap_or_default(),
            }),
            ..TruthEvent::new(TruthKind::FaultChanged)
        });
        applied
    }

    /// A receiver that sees the generation change on every [`Faults::set`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn err(yaml: &str) -> String {
        FaultFile::parse(yaml).unwrap_err().to_string()
    }

    #[test]
    fn parses_every_duration_form() {
        let f = FaultFile::parse(
            "rules:\n\
             - nodes: {all: true}\n  program_delay: 1.5s\n\
             - nodes: {names: [node-1]}\n  program_delay: {uniform: [200ms, 1s]}\n\
             - nodes: {labels: {zone: a}}\n  program_delay: {lognormal: {median: 2s, p99: 20s}}\n",
        )
        .unwrap();
        assert_eq!(f.rules.len(), 3);
        assert_eq!(
            f.rules[0].program_delay,
            Some(DurationDist::Fixed(Duration::from_millis(1500)))
        );
        assert_eq!(
            f.rules[1].program_delay,
            Some(DurationDist::Uniform(
                Duration::from_millis(200),
                Duration::from_secs(1)
            ))
        );
        assert_eq!(
            f.rules[2].program_delay,
            Some(DurationDist::Lognormal {
                median: Duration::from_secs(2),
                p99: Duration::from_secs(20)
            })
        );
        assert_eq!(
            f.rules[2].nodes,
            NodeSelector::Labels(labels(&[("zone", "a")]))
        );
    }

    #[test]
    fn empty_file_has_no_rules() {
        assert_eq!(FaultFile::parse("").unwrap(), FaultFile::default());
        assert_eq!(
            FaultFile::parse("# nothing\n").unwrap(),
            FaultFile::default()
        );
        assert_eq!(
            FaultFile::parse("rules: []\n").unwrap(),
            FaultFile::default()
        );
    }

    #[test]
    fn unknown_key_error_names_key_and_line() {
        let e = err("rules:\n  - nodes: {all: true}\n    program_dealy: 1s\n");
        assert!(e.contains("program_dealy"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        let e = err(
            "rules:\n  - nodes: {all: true}\n    resync_loop: {period: 1s, open: 1s, phase: 2s}\n",
        );
        assert!(e.contains("phase") && e.contains("line 3"), "{e}");
        let e = err("rulez: []\n");
        assert!(e.contains("rulez") && e.contains("line 1"), "{e}");
        let e = err("rules: []\n# note\nextra: 1\n");
        assert!(e.contains("extra") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn unimplemented_primitive_is_rejected_with_its_name_and_line() {
        let e =
            err("rules:\n  - nodes: {all: true}\n    program_delay: 1s\n    revoke: {after: 2s}\n");
        assert!(
            e.contains("primitive `revoke` is not implemented yet (testbed issue 2 of 4)"),
            "{e}"
        );
        assert!(e.contains("line 4"), "{e}");
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(err("rules:\n- nodes: {all: true}\n  never_program: 1.5\n").contains("outside 0–1"));
        assert!(err("rules:\n- nodes: {all: true}\n  program_delay: soon\n")
            .contains("invalid duration"));
        assert!(
            err("rules:\n- nodes: {all: true}\n  program_delay: {uniform: [2s, 1s]}\n")
                .contains("lower bound")
        );
        assert!(
            err("rules:\n- nodes: {all: true}\n  program_delay: {normal: 1s}\n")
                .contains("unknown distribution")
        );
        assert!(
            err("rules:\n- nodes: {all: true}\n  resync_loop: {period: 1s, open: 2s}\n")
                .contains("open ≤ period")
        );
        assert!(err("rules:\n- nodes: {all: true, names: [a]}\n").contains("exactly one"));
        assert!(
            err("rules:\n- nodes: {all: true}\n  from: 5s\n  until: 1s\n").contains("before until")
        );
        assert!(err("rules:\n- program_delay: 1s\n").contains("nodes"));
    }

    #[test]
    fn later_rules_override_earlier_ones_key_by_key() {
        let f = FaultFile::parse(
            "rules:\n\
             - nodes: {all: true}\n  program_delay: 1s\n  never_program: 0.5\n\
             - nodes: {names: [node-2]}\n  program_delay: 3s\n\
             - nodes: {labels: {zone: b}}\n  resync_loop: {period: 10s, open: 1s}\n",
        )
        .unwrap();
        let n1 = f.for_node("node-1", &labels(&[("zone", "a")]), Duration::ZERO);
        assert_eq!(
            n1.program_delay,
            Some(DurationDist::Fixed(Duration::from_secs(1)))
        );
        assert_eq!(n1.never_program, Some(Probability(0.5)));
        assert_eq!(n1.resync_loop, None);
        let n2 = f.for_node("node-2", &labels(&[("zone", "b")]), Duration::ZERO);
        assert_eq!(
            n2.program_delay,
            Some(DurationDist::Fixed(Duration::from_secs(3)))
        );
        assert_eq!(n2.never_program, Some(Probability(0.5)));
        assert_eq!(
            n2.resync_loop,
            Some(ResyncLoop {
                period: Duration::from_secs(10),
                open: Duration::from_secs(1)
            })
        );
    }

    #[test]
    fn from_until_select_by_time_since_applied() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  from: 10s\n  until: 20s\n  never_program: true\n",
        )
        .unwrap();
        let l = labels(&[]);
        assert!(f.for_node("node-1", &l, Duration::from_secs(9)).is_empty());
        assert_eq!(
            f.for_node("node-1", &l, Duration::from_secs(10))
                .never_program,
            Some(Probability(1.0))
        );
        assert!(f.for_node("node-1", &l, Duration::from_secs(20)).is_empty());
    }

    #[test]
    fn resync_windows_delay_programming_to_the_next_open_window() {
        let r = ResyncLoop {
            period: Duration::from_secs(10),
            open: Duration::from_secs(1),
        };
        assert_eq!(
            r.next_open(Duration::from_millis(500)),
            Duration::from_millis(500)
        );
        assert_eq!(
            r.next_open(Duration::from_millis(1000)),
            Duration::from_secs(10)
        );
        assert_eq!(
            r.next_open(Duration::from_millis(15_000)),
            Duration::from_secs(20)
        );
        assert_eq!(
            r.next_open(Duration::from_millis(20_999)),
            Duration::from_millis(20_999)
        );
        let nf = NodeFaults {
            program_delay: Some(DurationDist::Fixed(Duration::from_secs(2))),
            resync_loop: Some(r),
            never_program: None,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let delay = nf.plan_programming(&mut rng).unwrap();
        assert_eq!(delay, Duration::from_secs(2));
        assert_eq!(
            nf.programming_time(Duration::from_secs(3) + delay),
            Duration::from_secs(10)
        );
        let no_loop = NodeFaults {
            resync_loop: None,
            ..nf
        };
        assert_eq!(
            no_loop.programming_time(Duration::from_secs(5)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn never_program_probability_is_respected() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let always = NodeFaults {
            never_program: Some(Probability(1.0)),
            ..NodeFaults::default()
        };
        assert!(always.plan_programming(&mut rng).is_none());
        let half = NodeFaults {
            never_program: Some(Probability(0.5)),
            ..NodeFaults::default()
        };
        let never = (0..1000)
            .filter(|_| half.plan_programming(&mut rng).is_none())
            .count();
        assert!((400..600).contains(&never), "{never}");
    }

    #[test]
    fn distributions_sample_inside_their_shape() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let u = DurationDist::Uniform(Duration::from_millis(200), Duration::from_millis(300));
        for _ in 0..200 {
            let s = u.sample(&mut rng);
            assert!(s >= Duration::from_millis(200) && s <= Duration::from_millis(300));
        }
        let l = DurationDist::Lognormal {
            median: Duration::from_secs(1),
            p99: Duration::from_secs(10),
        };
        let mut v: Vec<f64> = (0..4000)
            .map(|_| l.sample(&mut rng).as_secs_f64())
            .collect();
        v.sort_by(f64::total_cmp);
        let median = v[2000];
        let p99 = v[3960];
        assert!((0.85..1.15).contains(&median), "median {median}");
        assert!((7.0..14.0).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn set_bumps_generation_and_wakes_subscribers() {
        let f = Faults::new(FaultFile::default());
        let rx = f.subscribe();
        assert_eq!(f.current().generation, 0);
        let a =
            f.set(FaultFile::parse("rules:\n- nodes: {all: true}\n  program_delay: 1s\n").unwrap());
        assert_eq!(a.generation, 1);
        assert!(rx.has_changed().unwrap());
        assert_eq!(f.current().file.rules.len(), 1);
    }
}
