//! Fault files (docs/design.md §6 "Fault file", binding grammar; primitives in §5 "Faults").
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
//! - Primitives (docs/design.md §5): `program_delay` (time from `endpoint_added` to
//!   `endpoint_programmed`), `resync_loop: {period, open}` (an endpoint whose delay has
//!   elapsed is programmed only inside the next open window; windows start every `period`
//!   from the file's application), `never_program: p`, `queue: {per_endpoint: D}`,
//!   `revoke: {after: D}`, `name_reuse_race: p`, `first_connections_dropped: N`,
//!   `cross_node: {broken_peers: all | [names]}`, `family_broken: ipv4 | ipv6` (below),
//!   `stale_routes: {k: N, for: D}`,
//!   `link_mtu: N`, `encap_mtu: N`, `proto_drop: {protocols, cross_node}` (below),
//!   `clock_skew: ±D`, `agent: {not_ready, restarts: {every: D},
//!   extra_failures_per_second, extra_resyncs_per_second, apply_time_floor,
//!   route_resync: {every: D, takes: D}, datastore_resync: {every: D, takes: D},
//!   gates_readiness}`. Each type below says what it does; [`crate::agent`] carries them
//!   out.
//! - NetworkPolicy primitives of the simulated agent ([`crate::policy_sync`]):
//!   `policy_delay: D` (each admission change — a peer starting or ceasing to be
//!   admitted to or from a pod of the node, a programmed pod's isolation changing — is
//!   in the node's ruleset D after the agent learned it), `policy_never: p` (each newly
//!   admitted (pod, peer, direction) is never programmed on the node with probability
//!   p; revocations always are), `isolation_lag: D` (a new pod a policy isolates is
//!   reachable for D after its endpoint is programmed before its deny applies).
//! - Primitives acting on the real Calico Felix process (`testbed up --control-plane real
//!   --agent calico`), all node-wide: `agent_io: {delay: D, fail: p}` (every dataplane
//!   write Felix makes takes D longer and fails with probability p), `agent_cpu: {quota:
//!   P%}` (a cgroup CPU quota on Felix, 0.1–1000 % of one CPU), `agent_pause: {every: D,
//!   for: D}` (Felix is stopped with SIGSTOP for `for` every `every`), `policies: N` (N
//!   NetworkPolicies active on every node and selecting nothing the prober creates, in a
//!   namespace of their own, [`crate::calico::datastore::load_policy`]:
//!   cluster-wide, [`FaultFile::policies_in_force`]) and `agent_version: v3.M.P` (the Felix
//!   release the selected nodes run, [`FaultFile::agent_versions`]).
//! - A primitive that does not apply to the running agent or service proxy is refused
//!   naming the line ([`FaultFile::check_components`]): the simulated agent's decisions
//!   (`program_delay`, `resync_loop`, `never_program`, `queue`, `revoke`,
//!   `name_reuse_race`, `first_connections_dropped`, `policy_delay`, `policy_never`,
//!   `isolation_lag`, every `agent` key but `restarts`) with real Felix, the real-Felix primitives above with the simulated agent, and
//!   `service_delay` with the real kube-proxy.
//! - `service_delay: D` (duration distribution): time from an EndpointSlice change
//!   being seen by a node's service proxy to its rules being in ([`crate::services`]).
//! - `from`/`until`: per-endpoint primitives (decided when an endpoint is added:
//!   `program_delay`, `resync_loop`, `never_program`, `queue`, `revoke`,
//!   `name_reuse_race`, `first_connections_dropped`, `stale_routes`, `isolation_lag`,
//!   `clock_skew` at container start) select endpoints added in the window; node-wide
//!   ones (`cross_node`, `family_broken`, `agent`, `teardown_delay`, `cni_add_delay`, `agent_io`,
//!   `agent_cpu`, `agent_pause`, `policies`, `agent_version`, `link_mtu`, `encap_mtu`,
//!   `proto_drop`) are in force during the
//!   window, and so are `policy_delay` and `policy_never` for the policy changes the
//!   agent learns meanwhile.
//! - `teardown_delay: D` (duration distribution): time the node's kubelet takes, after a
//!   deleted pod's containers have stopped, to tear its sandbox down (the CNI DEL) and
//!   remove the pod from the API, as a slow CNI plugin or a busy container runtime makes
//!   it ([`crate::kubelet`]). A StatefulSet-style recreate waits this long for the name.
//!   A CNI DEL through `testbed cni` ([`crate::cni`]) takes this long too.
//! - Primitives of the node's network, carried out by the dataplane
//!   ([`crate::dataplane::Dataplane::set_net_faults`]), node-wide, silent (no ICMP, no
//!   RST): `link_mtu: N` (bytes, 576–9000: the bridge-side end of the node's underlay
//!   veth gets MTU N, the node's own `eth0` keeps its MTU, so Linux's veth and bridge
//!   MTU checks drop larger frames on the link both ways while the node believes in its
//!   link; restored when the rule stops applying), `encap_mtu: N` (bytes, 576–9000: IP
//!   packets of the node's pods longer than N crossing its link are dropped, as an
//!   overlay whose overhead the pod MTU does not leave room for black-holes them — the
//!   handshake and small packets pass, full-size ones vanish; Calico's IP-in-IP adds 20
//!   bytes, VXLAN 50, and kubespray's switch of its Calico default from IP-in-IP to
//!   VXLAN shifted the room needed by 30) and `proto_drop: {protocols: [udp, tcp,
//!   icmp], cross_node: true|false}` (forwarded pod packets of those protocols dropped
//!   in the node: with `cross_node: true`, the default, only those crossing the
//!   underlay, else same-node pod↔pod ones too). They apply with every agent, service
//!   proxy and kubelet: the MTU ones live on the host side of the link, where no agent
//!   is, and `proto_drop`'s chain (a table of its own, forward hook, after the agents'
//!   filter chains) drops what an agent's chain accepted, as an nftables `accept` ends
//!   only its own base chain.
//! - `family_broken: ipv4 | ipv6` (node-wide): the selected nodes lose their routes of
//!   that family to every peer's pod block while the rule is in force (cross-node
//!   traffic of that family from them has no route; same-node traffic and the other
//!   family are unaffected), restored after; see [`Rule::family_broken`] for the truth
//!   it writes. `ipv6` is refused on an IPv4-only testbed naming the line
//!   ([`FaultFile::check_families`]). It applies with either agent like `cross_node`
//!   (the peer routes are the testbed's own, on real Felix's nodes too).
//! - `cni_add_delay: D` (duration distribution): time a CNI ADD through `testbed cni`
//!   ([`crate::cni`], a real container runtime's sandbox) waits before the pod's
//!   network is wired, as a slow CNI plugin (IPAM, datastore writes) makes it; the
//!   pod's `endpoint_added` comes that much later. Node-wide, sampled per ADD. The
//!   simulated kubelet does not call CNI and ignores it.

use crate::plan::IpFamily;
use crate::truth::{Truth, TruthEvent, TruthKind};
use rand::{Rng, RngExt};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet};
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
    /// A rule names a node the cluster does not have (in `nodes.names` or
    /// `cross_node.broken_peers`): almost always a typo, which would otherwise select
    /// nothing without a word.
    #[error("fault file: rule {rule} names node {name:?}, which is not in this cluster (nodes: {known})")]
    UnknownNode {
        /// 1-based rule number.
        rule: usize,
        /// The unknown name.
        name: String,
        /// The cluster's nodes, comma-separated.
        known: String,
    },
    /// A rule needs something this machine lacks (e.g. `clock_skew` without
    /// libfaketime): applying it would silently do nothing.
    #[error("fault file: rule {rule}: {message}")]
    Unsupported {
        /// 1-based rule number.
        rule: usize,
        message: String,
    },
    /// A rule sets a primitive that the running agent, service proxy or kubelet does
    /// not act on ([`FaultFile::check_components`], [`FaultFile::check_kubelet`]):
    /// applying it would silently do nothing.
    #[error(
        "fault file: rule {rule} (line {line}): `{key}` does not apply to {component}: {message}"
    )]
    NotForComponent {
        /// The component that does not act on it (`real Calico Felix`, `the simulated
        /// agent`, `real kube-proxy`, `a real kubelet`).
        component: &'static str,
        /// 1-based rule number.
        rule: usize,
        /// 1-based line of the key in the file (the rule's first line when not found).
        line: usize,
        /// The key as written, nested keys dotted (`agent.apply_time_floor`).
        key: String,
        /// Why it does not apply, and what to use instead.
        message: String,
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

/// A duration distribution (docs/design.md §6 "Durations").
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

/// `queue: {per_endpoint: D}`: the node's agent programs endpoints one after another
/// and each apply takes a sample of `D` (under the node's single apply loop), so the
/// K-th endpoint of a burst is programmed about K·D after the burst.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Queue {
    /// Time each endpoint's apply takes.
    pub per_endpoint: DurationDist,
}

impl<'de> Deserialize<'de> for Queue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            per_endpoint: DurationDist,
        }
        let r = Raw::deserialize(d)?;
        Ok(Queue {
            per_endpoint: r.per_endpoint,
        })
    }
}

/// `revoke: {after: D}`: a sample of `D` after an endpoint was programmed its allow-set
/// entry is removed again (truth `endpoint_revoked`) and stays removed: the pod works,
/// then stops working.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Revoke {
    /// Time from `endpoint_programmed` to `endpoint_revoked`.
    pub after: DurationDist,
}

impl<'de> Deserialize<'de> for Revoke {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            after: DurationDist,
        }
        let r = Raw::deserialize(d)?;
        Ok(Revoke { after: r.after })
    }
}

/// Which peers' pod-block routes a `cross_node` fault removes on a selected node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum BrokenPeers {
    /// `broken_peers: all`: every other node.
    #[serde(serialize_with = "ser_all")]
    All,
    /// `broken_peers: [node-1, …]`: only these nodes (the node itself and unknown names
    /// are ignored).
    Names(Vec<String>),
}

fn ser_all<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("all")
}

impl BrokenPeers {
    /// Whether the route to `peer`'s block is to be removed.
    pub fn includes(&self, peer: &str) -> bool {
        match self {
            BrokenPeers::All => true,
            BrokenPeers::Names(n) => n.iter().any(|n| n == peer),
        }
    }
}

/// `cross_node: {broken_peers: all | [names]}`: while the rule is in force (its
/// `from`/`until` read as wall-time windows since the file was applied), the selected
/// nodes have no route to the chosen peers' pod blocks (truth `peer_route_removed` /
/// `peer_route_restored`, `detail.peer`). Same-node traffic is unaffected
/// (docs/scenarios.md S4).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrossNode {
    pub broken_peers: BrokenPeers,
}

impl<'de> Deserialize<'de> for CrossNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Peers {
            Word(String),
            Names(Vec<String>),
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            broken_peers: Peers,
        }
        let r = Raw::deserialize(d)?;
        let broken_peers = match r.broken_peers {
            Peers::Word(w) if w == "all" => BrokenPeers::All,
            Peers::Word(w) => {
                return Err(de::Error::custom(format!(
                    "cross_node.broken_peers: expected `all` or a list of node names, got {w:?}"
                )))
            }
            Peers::Names(n) => BrokenPeers::Names(n),
        };
        Ok(CrossNode { broken_peers })
    }
}

/// `stale_routes: {k: N, for: D}` (our definition; docs/design.md §5 names the primitive
/// only): when an endpoint is added on a selected node, `k` other nodes chosen at
/// random (all of them if fewer) get a `blackhole <pod IP>/32` route, as if they still
/// held a stale route for an IP that used to live elsewhere. Traffic from those nodes
/// (and their pods) to the new pod is dropped until the route goes: after a sample of
/// `for`, or, without `for`, when the endpoint is removed. Truth: `peer_route_removed`
/// / `peer_route_restored` with `node` = the node holding the stale route, the pod
/// fields of the new pod and `detail: {peer: <pod's node>, reason: "stale_routes"}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StaleRoutes {
    /// How many other nodes get the stale route.
    pub k: u32,
    /// How long the stale route stays; `None` = until the endpoint is removed.
    #[serde(rename = "for")]
    pub hold: Option<DurationDist>,
}

impl<'de> Deserialize<'de> for StaleRoutes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            k: u32,
            #[serde(default, rename = "for")]
            hold: Option<DurationDist>,
        }
        let r = Raw::deserialize(d)?;
        Ok(StaleRoutes {
            k: r.k,
            hold: r.hold,
        })
    }
}

/// `clock_skew: D` with an optional sign (`30s`, `+30s`, `-1m`): for pod processes
/// started on the node while the rule is in force,
/// - the wall clock (`CLOCK_REALTIME`) is shifted by `D` through libfaketime
///   ([`ClockSkew::faketime_env`]); it reaches dynamically linked binaries only, so a
///   statically linked image binary is replaced by the dynamically linked build of the
///   same name in the bin dir (none there: the container fails to start with
///   `CreateContainerError`);
/// - `CLOCK_MONOTONIC` and `CLOCK_BOOTTIME` are offset by `D` in a time namespace of
///   the pod's own ([`ClockSkew::timens_offsets`]; Linux ≥ 5.6, `time_namespaces(7)`);
///   intervals on one clock, which TTFP is, do not move.
///
/// The daemon's (and the prober's) clocks are not shifted. Linux cannot offset
/// `CLOCK_REALTIME` per namespace, hence libfaketime for the wall clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockSkew {
    /// Signed shift in seconds.
    pub seconds: f64,
}

/// Where Debian's `libfaketime` package (0.9.10 in bookworm) installs the preload
/// library (`dpkg -L libfaketime`).
pub const LIBFAKETIME_PATH: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl ClockSkew {
    /// Environment for a process whose wall clock is to be shifted: `LD_PRELOAD` of
    /// [`LIBFAKETIME_PATH`], `FAKETIME="+S"`/`"-S"` (libfaketime's relative offset in
    /// seconds, fractions allowed), and `FAKETIME_DONT_FAKE_MONOTONIC=1` so that
    /// `CLOCK_MONOTONIC` (what TTFP is measured with) stays true. Works for dynamically
    /// linked binaries only (LD_PRELOAD).
    pub fn faketime_env(&self) -> Vec<(String, String)> {
        let sign = if self.seconds < 0.0 { '-' } else { '+' };
        vec![
            ("LD_PRELOAD".to_owned(), LIBFAKETIME_PATH.to_owned()),
            (
                "FAKETIME".to_owned(),
                format!("{sign}{}", self.seconds.abs()),
            ),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ]
    }
}

impl ClockSkew {
    /// The contents written to `/proc/self/timens_offsets` of a new time namespace:
    /// `monotonic S N` and `boottime S N` lines (seconds, and nanoseconds in
    /// 0 … 10⁹−1, so −2.5 s is `-3 500000000`; `time_namespaces(7)`).
    pub fn timens_offsets(&self) -> String {
        let total_ns = (self.seconds * 1e9).round() as i128;
        let secs = total_ns.div_euclid(1_000_000_000);
        let nanos = total_ns.rem_euclid(1_000_000_000);
        format!("monotonic {secs} {nanos}\nboottime {secs} {nanos}\n")
    }
}

impl Serialize for ClockSkew {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let sign = if self.seconds < 0.0 { "-" } else { "+" };
        let d = Duration::from_secs_f64(self.seconds.abs());
        s.serialize_str(&format!("{sign}{}", humantime::format_duration(d)))
    }
}

impl<'de> Deserialize<'de> for ClockSkew {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ClockSkew;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a signed duration such as 30s, +30s or -1m")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ClockSkew, E> {
                let s = s.trim();
                let (neg, rest) = match s.as_bytes().first() {
                    Some(b'-') => (true, &s[1..]),
                    Some(b'+') => (false, &s[1..]),
                    _ => (false, s),
                };
                let d = parse_duration_str::<E>(rest)?.as_secs_f64();
                Ok(ClockSkew {
                    seconds: if neg { -d } else { d },
                })
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<ClockSkew, E> {
                HumanDuration::deserialize(de::value::U64Deserializer::<E>::new(n)).map(|h| {
                    ClockSkew {
                        seconds: h.0.as_secs_f64(),
                    }
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// `restarts: {every: D}` inside `agent`: the simulated agent restarts every sample of
/// `D` (process start time moves, every Felix counter and summary starts from zero, the
/// restart count goes up); the dataplane it programmed stays as it is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Restarts {
    pub every: DurationDist,
}

impl<'de> Deserialize<'de> for Restarts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            every: DurationDist,
        }
        let r = Raw::deserialize(d)?;
        if let DurationDist::Fixed(d) = r.every {
            if d.is_zero() {
                return Err(de::Error::custom("agent.restarts.every must be above 0"));
            }
        }
        Ok(Restarts { every: r.every })
    }
}

/// `{every: D, takes: D}` inside `agent` (`route_resync`, `datastore_resync`): an
/// episode every sample of `every` (from the moment the rule is in force), each lasting
/// a sample of `takes`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Periodic {
    pub every: DurationDist,
    pub takes: DurationDist,
}

impl<'de> Deserialize<'de> for Periodic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            every: DurationDist,
            takes: DurationDist,
        }
        let r = Raw::deserialize(d)?;
        if let DurationDist::Fixed(d) = r.every {
            if d.is_zero() {
                return Err(de::Error::custom("`every` must be above 0"));
            }
        }
        Ok(Periodic {
            every: r.every,
            takes: r.takes,
        })
    }
}

/// `agent_io: {delay: D, fail: p}` (node-wide; real Calico Felix only): every dataplane
/// write the node's Felix makes (`iptables-nft-restore`, `ipset`, `nft`) takes a sample
/// of `delay` longer and fails with probability `fail`. At least one of the two is given.
/// A later rule's `agent_io` replaces an earlier one as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AgentIo {
    /// Extra time per write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<DurationDist>,
    /// Probability that a write fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail: Option<Probability>,
}

/// Deserializes `T` from a mapping and checks it with `check` inside the mapping's
/// visitor, so that serde_yaml_ng places a failed check at the mapping's line (an error
/// raised after `T::deserialize` has returned is placed at the enclosing rule's line).
fn checked_map<'de, D, T, U>(
    d: D,
    what: &'static str,
    check: fn(T) -> Result<U, String>,
) -> Result<U, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T, U> {
        what: &'static str,
        check: fn(T) -> Result<U, String>,
    }
    impl<'de, T: Deserialize<'de>, U> Visitor<'de> for V<T, U> {
        type Value = U;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(self.what)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<U, A::Error> {
            let t = T::deserialize(de::value::MapAccessDeserializer::new(map))?;
            (self.check)(t).map_err(de::Error::custom)
        }
    }
    d.deserialize_map(V { what, check })
}

impl<'de> Deserialize<'de> for AgentIo {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            delay: Option<DurationDist>,
            #[serde(default)]
            fail: Option<Probability>,
        }
        checked_map(d, "agent_io: {delay: D, fail: p}", |r: Raw| {
            if r.delay.is_none() && r.fail.is_none() {
                return Err("agent_io: give `delay`, `fail` or both".to_owned());
            }
            Ok(AgentIo {
                delay: r.delay,
                fail: r.fail,
            })
        })
    }
}

/// CFS period the testbed uses for `agent_cpu` (the kernel's default
/// `cpu.cfs_period_us`, 100 ms), in µs.
pub const CFS_DEFAULT_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota (and period) Linux accepts, in µs (1 ms).
pub const CFS_MIN_US: u64 = 1_000;
/// Largest CFS period Linux accepts, in µs (1 s).
pub const CFS_MAX_PERIOD_US: u64 = 1_000_000;
/// Smallest `agent_cpu.quota`, in percent of one CPU: 1 ms of CPU per 1 s period.
pub const AGENT_CPU_MIN_PERCENT: f64 = 0.1;
/// Largest `agent_cpu.quota`, in percent of one CPU (ten CPUs).
pub const AGENT_CPU_MAX_PERCENT: f64 = 1000.0;

/// `agent_cpu: {quota: P%}` (node-wide; real Calico Felix only): a cgroup CPU quota on
/// the node's Felix process of `P` percent of one CPU (`2%`, `0.5%`; a plain number is a
/// percentage too), `0.1 ≤ P ≤ 1000`. [`AgentCpu::cfs`] turns it into a CFS period and
/// quota.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentCpu {
    /// Percent of one CPU.
    pub quota_percent: f64,
}

impl AgentCpu {
    /// The CFS bandwidth `(period_us, quota_us)` giving `quota_percent` % of one CPU (for
    /// cgroup v2 `cpu.max` "`quota_us period_us`", v1 `cpu.cfs_period_us` /
    /// `cpu.cfs_quota_us`). The period is [`CFS_DEFAULT_PERIOD_US`] and the quota
    /// `P × 1000` µs, except that Linux accepts no quota below 1 ms and no period above
    /// 1 s (`Documentation/scheduler/sched-bwc.rst`: "The minimum quota allowed for the
    /// quota or period is 1ms. There is also an upper bound on the period length of
    /// 1s."): when `P × 1000` µs is below [`CFS_MIN_US`] the quota is 1 000 µs and the
    /// period `100 000 / P` µs, which keeps the share, capped at [`CFS_MAX_PERIOD_US`]
    /// (reached at the smallest quota, 0.1 %). So 2 % is (100 000, 2 000), 0.5 % is
    /// (200 000, 1 000) and 0.1 % is (1 000 000, 1 000). Values outside 0.1–1000 (only
    /// possible when built by hand) are clamped into it.
    pub fn cfs(&self) -> (u64, u64) {
        let p = if self.quota_percent.is_nan() {
            AGENT_CPU_MIN_PERCENT
        } else {
            self.quota_percent
                .clamp(AGENT_CPU_MIN_PERCENT, AGENT_CPU_MAX_PERCENT)
        };
        let quota = (p * 1000.0).round() as u64;
        if quota >= CFS_MIN_US {
            return (CFS_DEFAULT_PERIOD_US, quota);
        }
        let period = (CFS_DEFAULT_PERIOD_US as f64 / p).round() as u64;
        (period.min(CFS_MAX_PERIOD_US), CFS_MIN_US)
    }
}

impl Serialize for AgentCpu {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = BTreeMap::new();
        m.insert("quota", format!("{}%", self.quota_percent));
        m.serialize(s)
    }
}

/// A CPU share in percent of one CPU: `2%`, `0.5 %` or a plain number, within
/// [`AGENT_CPU_MIN_PERCENT`]..=[`AGENT_CPU_MAX_PERCENT`].
struct QuotaPercent(f64);

impl<'de> Deserialize<'de> for QuotaPercent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl V {
            fn checked<E: de::Error>(p: f64) -> Result<QuotaPercent, E> {
                if (AGENT_CPU_MIN_PERCENT..=AGENT_CPU_MAX_PERCENT).contains(&p) {
                    Ok(QuotaPercent(p))
                } else {
                    Err(E::custom(format!(
                        "agent_cpu.quota must be between 0.1% and 1000% of one CPU (above 0; \
                         Linux needs a quota of at least 1 ms per period of at most 1 s), got {p}%"
                    )))
                }
            }
        }
        impl Visitor<'_> for V {
            type Value = QuotaPercent;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a percentage of one CPU such as 2% or 0.5%")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<QuotaPercent, E> {
                let t = s.trim();
                let t = t.strip_suffix('%').unwrap_or(t).trim_end();
                match t.parse::<f64>() {
                    Ok(p) if p.is_finite() => V::checked(p),
                    _ => Err(E::custom(format!(
                        "agent_cpu.quota: expected a percentage of one CPU such as 2% or 0.5%, got {s:?}"
                    ))),
                }
            }
            fn visit_f64<E: de::Error>(self, p: f64) -> Result<QuotaPercent, E> {
                V::checked(p)
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<QuotaPercent, E> {
                V::checked(n as f64)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<QuotaPercent, E> {
                V::checked(n as f64)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for AgentCpu {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            quota: QuotaPercent,
        }
        let r = Raw::deserialize(d)?;
        Ok(AgentCpu {
            quota_percent: r.quota.0,
        })
    }
}

/// `agent_pause: {every: D, for: D}` (node-wide; real Calico Felix only): every sample of
/// `every` the node's Felix process is stopped (SIGSTOP) for a sample of `for`, then
/// continued (SIGCONT). A fixed `every` must be above 0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AgentPause {
    /// Time between pauses.
    pub every: DurationDist,
    /// Length of each pause.
    #[serde(rename = "for")]
    pub for_: DurationDist,
}

impl<'de> Deserialize<'de> for AgentPause {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            every: DurationDist,
            #[serde(rename = "for")]
            for_: DurationDist,
        }
        checked_map(d, "agent_pause: {every: D, for: D}", |r: Raw| {
            if r.every == DurationDist::Fixed(Duration::ZERO) {
                return Err("agent_pause.every must be above 0".to_owned());
            }
            Ok(AgentPause {
                every: r.every,
                for_: r.for_,
            })
        })
    }
}

/// `agent_version: v3.M.P`: a Calico release (`v3.<minor>.<patch>`, digits only).
struct AgentVersion(String);

impl AgentVersion {
    fn is_valid(v: &str) -> bool {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        v.strip_prefix("v3.")
            .and_then(|rest| rest.split_once('.'))
            .is_some_and(|(minor, patch)| digits(minor) && digits(patch))
    }
}

impl<'de> Deserialize<'de> for AgentVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AgentVersion;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a Calico release such as v3.31.7 (v3.<minor>.<patch>)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<AgentVersion, E> {
                let v = s.trim();
                if AgentVersion::is_valid(v) {
                    Ok(AgentVersion(v.to_owned()))
                } else {
                    Err(E::custom(format!(
                        "agent_version: expected a Calico release such as v3.31.7 \
                         (v3.<minor>.<patch>), got {s:?}"
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `agent: {…}`: how the node's simulated agent looks from outside (its Ready state and
/// its Felix metrics). Keys merge key by key across rules like the rule keys do.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct AgentFaults {
    /// The calico-node pod is not Ready ([`crate::agent::Agent::is_ready`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_ready: Option<bool>,
    /// Periodic restarts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarts: Option<Restarts>,
    /// Extra `felix_int_dataplane_failures` per second (≥ 0, fractions accumulate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_failures_per_second: Option<f64>,
    /// Extra `felix_resyncs_started` per second (≥ 0, fractions accumulate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_resyncs_per_second: Option<f64>,
    /// Every dataplane apply takes at least this long (docs/scenarios.md S2: an apply loop
    /// stuck retrying shows only as apply-time inflation).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_opt_duration"
    )]
    pub apply_time_floor: Option<Duration>,
    /// A slow route-table resync (signal `route_resync_slow`): every `every` the agent
    /// resyncs its route table inside its apply loop (as Felix's dataplane applies its
    /// route tables' queued resync, `RouteRefreshInterval`) and the interface listing
    /// takes at least `takes`: `felix_route_table_list_seconds` and the apply time see
    /// it, endpoints due meanwhile wait for the loop ([`crate::agent`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_resync: Option<Periodic>,
    /// Datastore resyncs (signal `datastore_resync`): every `every` the agent's
    /// datastore watch breaks and it re-lists for `takes`: `felix_resyncs_started` + 1,
    /// `felix_resync_state` 2 (resync in progress) until it is back in sync (3); no
    /// endpoint is programmed meanwhile ([`crate::agent`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datastore_resync: Option<Periodic>,
    /// The simulated agent drops a new pod's traffic to its own node (the kubelet's
    /// readiness probes included) until it has programmed the endpoint, as real Felix
    /// does, so the pod turns Ready only after it is programmed. Unset means `true`
    /// (Calico's behaviour, issue 29); `false` models a CNI that does not gate, whose
    /// delay lands after Ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gates_readiness: Option<bool>,
}

impl AgentFaults {
    /// `self` with every key `later` sets replaced by `later`'s value.
    fn merge(&mut self, later: &AgentFaults) {
        if later.not_ready.is_some() {
            self.not_ready = later.not_ready;
        }
        if later.restarts.is_some() {
            self.restarts = later.restarts;
        }
        if later.extra_failures_per_second.is_some() {
            self.extra_failures_per_second = later.extra_failures_per_second;
        }
        if later.extra_resyncs_per_second.is_some() {
            self.extra_resyncs_per_second = later.extra_resyncs_per_second;
        }
        if later.apply_time_floor.is_some() {
            self.apply_time_floor = later.apply_time_floor;
        }
        if later.route_resync.is_some() {
            self.route_resync = later.route_resync;
        }
        if later.datastore_resync.is_some() {
            self.datastore_resync = later.datastore_resync;
        }
        if later.gates_readiness.is_some() {
            self.gates_readiness = later.gates_readiness;
        }
    }
}

impl<'de> Deserialize<'de> for AgentFaults {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            not_ready: Option<bool>,
            #[serde(default)]
            restarts: Option<Restarts>,
            #[serde(default)]
            extra_failures_per_second: Option<f64>,
            #[serde(default)]
            extra_resyncs_per_second: Option<f64>,
            #[serde(default)]
            apply_time_floor: Option<HumanDuration>,
            #[serde(default)]
            route_resync: Option<Periodic>,
            #[serde(default)]
            datastore_resync: Option<Periodic>,
            #[serde(default)]
            gates_readiness: Option<bool>,
        }
        let r = Raw::deserialize(d)?;
        for (k, v) in [
            ("extra_failures_per_second", r.extra_failures_per_second),
            ("extra_resyncs_per_second", r.extra_resyncs_per_second),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(de::Error::custom(format!("agent.{k} must be a number ≥ 0")));
            }
        }
        Ok(AgentFaults {
            not_ready: r.not_ready,
            restarts: r.restarts,
            extra_failures_per_second: r.extra_failures_per_second,
            extra_resyncs_per_second: r.extra_resyncs_per_second,
            apply_time_floor: r.apply_time_floor.map(|h| h.0),
            route_resync: r.route_resync,
            datastore_resync: r.datastore_resync,
            gates_readiness: r.gates_readiness,
        })
    }
}

/// Smallest MTU `encap_mtu` and `link_mtu` accept, in bytes: the datagram size every
/// IPv4 host must be able to receive (RFC 791).
pub const MTU_MIN: u32 = 576;

/// Largest MTU `encap_mtu` and `link_mtu` accept, in bytes (a common jumbo-frame MTU).
pub const MTU_MAX: u32 = 9000;

/// Reads an MTU in bytes for `key`: an integer within [`MTU_MIN`]..=[`MTU_MAX`]. Errors
/// name the key, the bounds and the value (serde_yaml_ng adds the line).
fn de_mtu<'de, D: Deserializer<'de>>(d: D, key: &'static str) -> Result<Option<u32>, D::Error> {
    struct V(&'static str);
    impl V {
        fn out_of_range<E: de::Error>(&self, got: impl fmt::Display) -> E {
            E::custom(format!(
                "{} must be an integer number of bytes between {MTU_MIN} and {MTU_MAX}, got {got}",
                self.0
            ))
        }
    }
    impl Visitor<'_> for V {
        type Value = u32;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(
                f,
                "{}: an MTU in bytes, an integer between {MTU_MIN} and {MTU_MAX}",
                self.0
            )
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<u32, E> {
            match u32::try_from(n) {
                Ok(m) if (MTU_MIN..=MTU_MAX).contains(&m) => Ok(m),
                _ => Err(self.out_of_range(n)),
            }
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<u32, E> {
            match u64::try_from(n) {
                Ok(n) => self.visit_u64(n),
                Err(_) => Err(self.out_of_range(n)),
            }
        }
        fn visit_f64<E: de::Error>(self, x: f64) -> Result<u32, E> {
            Err(self.out_of_range(x))
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<u32, E> {
            Err(self.out_of_range(format!("{s:?}")))
        }
    }
    d.deserialize_any(V(key)).map(Some)
}

fn de_encap_mtu<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    de_mtu(d, "encap_mtu")
}

fn de_link_mtu<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    de_mtu(d, "link_mtu")
}

/// A protocol `proto_drop` can drop (IPv4: the IP header's protocol field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DropProtocol {
    /// Protocol 6.
    Tcp,
    /// Protocol 17.
    Udp,
    /// Protocol 1 (every ICMP message: echo, and errors such as "fragmentation needed").
    Icmp,
}

impl DropProtocol {
    /// The name nftables' `meta l4proto` takes (`tcp`, `udp`, `icmp`).
    pub fn nft(self) -> &'static str {
        match self {
            DropProtocol::Tcp => "tcp",
            DropProtocol::Udp => "udp",
            DropProtocol::Icmp => "icmp",
        }
    }
}

impl<'de> Deserialize<'de> for DropProtocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DropProtocol;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a protocol: udp, tcp or icmp")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<DropProtocol, E> {
                match s.trim() {
                    "tcp" => Ok(DropProtocol::Tcp),
                    "udp" => Ok(DropProtocol::Udp),
                    "icmp" => Ok(DropProtocol::Icmp),
                    _ => Err(E::custom(format!(
                        "proto_drop.protocols: unknown protocol `{s}` (expected udp, tcp or icmp)"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `proto_drop: {protocols: [udp, tcp, icmp], cross_node: true|false}` (node-wide): the
/// selected nodes drop forwarded pod packets of these protocols silently (no ICMP, no
/// RST), both ways: with `cross_node: true` (the default) only those crossing the node's
/// underlay link (a pod of the node talking to another node, a pod elsewhere or a
/// client outside), with `false` also same-node pod↔pod ones. A later rule's
/// `proto_drop` replaces an earlier one as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProtoDrop {
    /// The protocols dropped; never empty.
    pub protocols: BTreeSet<DropProtocol>,
    /// Only packets crossing the node's underlay link (`true`), or every forwarded pod
    /// packet (`false`).
    pub cross_node: bool,
}

impl<'de> Deserialize<'de> for ProtoDrop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fn yes() -> bool {
            true
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            protocols: Vec<DropProtocol>,
            #[serde(default = "yes")]
            cross_node: bool,
        }
        checked_map(
            d,
            "proto_drop: {protocols: [udp, tcp, icmp], cross_node: true|false}",
            |r: Raw| {
                if r.protocols.is_empty() {
                    return Err(
                        "proto_drop.protocols: give at least one of udp, tcp, icmp".to_owned()
                    );
                }
                Ok(ProtoDrop {
                    protocols: r.protocols.into_iter().collect(),
                    cross_node: r.cross_node,
                })
            },
        )
    }
}

/// Calls macro `$m` with the primitive keys a [`Rule`] has besides `nodes`, `from`,
/// `until` and `agent`, in declaration order (one list for resolving and for naming them).
macro_rules! rule_primitives {
    ($m:ident) => {
        $m!(
            program_delay,
            service_delay,
            teardown_delay,
            cni_add_delay,
            resync_loop,
            never_program,
            queue,
            revoke,
            name_reuse_race,
            first_connections_dropped,
            cross_node,
            family_broken,
            stale_routes,
            clock_skew,
            agent_io,
            agent_cpu,
            agent_pause,
            policies,
            agent_version,
            policy_delay,
            policy_never,
            isolation_lag,
            encap_mtu,
            link_mtu,
            proto_drop
        )
    };
}

/// Every key a rule takes besides `nodes`, `from` and `until`: the primitives (for
/// checks that each one is documented).
pub const PRIMITIVE_KEYS: &[&str] = {
    macro_rules! names {
        ($($k:ident),*) => { &[$(stringify!($k),)* "agent"] };
    }
    rule_primitives!(names)
};

/// One rule as written.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rule {
    /// Which nodes it applies to.
    pub nodes: NodeSelector,
    /// In force from this long since the file was applied: for per-endpoint primitives
    /// (everything decided when an endpoint is added) it selects endpoints added at or
    /// after it; node-wide primitives (`cross_node`, `family_broken`, `agent`, `teardown_delay`, `cni_add_delay`,
    /// `agent_io`, `agent_cpu`, `agent_pause`, `policies`, `agent_version`, `link_mtu`,
    /// `encap_mtu`, `proto_drop`) are in force from then.
    #[serde(serialize_with = "ser_opt_duration")]
    pub from: Option<Duration>,
    /// … and before this long since the file was applied.
    #[serde(serialize_with = "ser_opt_duration")]
    pub until: Option<Duration>,
    /// Time from `endpoint_added` to `endpoint_programmed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program_delay: Option<DurationDist>,
    /// Time from an EndpointSlice change being seen to the node's service rules being in
    /// (`service_programmed`), as kube-proxy's sync loop would take.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_delay: Option<DurationDist>,
    /// Time a deleted pod's sandbox teardown (CNI DEL) and final removal from the API
    /// take after its containers stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub teardown_delay: Option<DurationDist>,
    /// Time a CNI ADD through `testbed cni` ([`crate::cni`]) waits before wiring the
    /// pod's network (a slow CNI plugin).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cni_add_delay: Option<DurationDist>,
    /// Programming only inside periodic open windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resync_loop: Option<ResyncLoop>,
    /// Probability that a new endpoint is never programmed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub never_program: Option<Probability>,
    /// Endpoints programmed one after another, each apply taking a sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<Queue>,
    /// Allow-set entry removed again some time after programming.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoke: Option<Revoke>,
    /// Probability that an endpoint reusing an interface name already used on this node
    /// loses its node-side /32 route for good right after CNI ADD (calico#11016).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name_reuse_race: Option<Probability>,
    /// The first N new TCP connections (SYNs without ACK) to or from a new endpoint
    /// that its node would forward **from the endpoint's `readiness_ok` on** are
    /// dropped, then all pass: an agent attaching its enforcement late drops flows the
    /// dataplane had already forwarded, so a pod that turned Ready sees its first
    /// connections fail (the budget is re-armed before each readiness probe until the
    /// first pass; `readiness_ok`'s truth detail carries `first_connections_dropped`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_connections_dropped: Option<u32>,
    /// Peer pod-block routes missing on the selected nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_node: Option<CrossNode>,
    /// `family_broken: ipv4 | ipv6` (node-wide): while the rule is in force the
    /// selected nodes have no route of that family to any peer's pod block, so that
    /// family's cross-node pod traffic from them has nowhere to go (the nodes have no
    /// default route); same-node traffic and the other family are unaffected. Restored
    /// when the rule stops applying. `ipv6` needs a dual-stack testbed
    /// ([`FaultFile::check_families`]). Truth: `peer_route_removed` /
    /// `peer_route_restored` per peer with `detail.reason` `family_broken` and
    /// `detail.family`, so only that family's path is down
    /// ([`crate::truth::truth_family_ttfp`]; [`crate::truth::truth_ttfp`] is IPv4's).
    /// Carried out by [`crate::agent`] with either agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family_broken: Option<IpFamily>,
    /// New pod IPs blackholed on k other nodes for a while.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_routes: Option<StaleRoutes>,
    /// Wall-clock shift for pod processes started on the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_skew: Option<ClockSkew>,
    /// The simulated agent's own state and metrics (`restarts` also for real Felix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentFaults>,
    /// Real Felix's dataplane writes slowed down and failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_io: Option<AgentIo>,
    /// A cgroup CPU quota on real Felix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_cpu: Option<AgentCpu>,
    /// Real Felix stopped (SIGSTOP) periodically.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_pause: Option<AgentPause>,
    /// NetworkPolicies active on every node (each isolating the load's own workload pod
    /// there and admitting every pod through an IP set of its own) that select nothing
    /// the prober creates, in a namespace of their own (load on the agent,
    /// [`crate::calico::datastore::load_policy`]); cluster-wide, see
    /// [`FaultFile::policies_in_force`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policies: Option<u32>,
    /// The real Felix release (`v3.M.P`) the selected nodes run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Time from the simulated agent learning a NetworkPolicy admission change (a peer
    /// starting or ceasing to be admitted to or from a pod of the node, a pod's
    /// isolation changing) to the node's ruleset carrying it ([`crate::policy_sync`]).
    /// Sampled per change, with the rule in force when the change is learned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_delay: Option<DurationDist>,
    /// Probability that a newly admitted (pod, peer, direction) is never programmed on
    /// the node (revocations always are). Drawn when the admission is learned, and
    /// again for every waiting one when a new fault file is applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_never: Option<Probability>,
    /// A new pod that a NetworkPolicy isolates stays reachable (not isolated) this long
    /// after its endpoint is programmed before its deny applies. Per endpoint (sampled
    /// when its endpoint is programmed, with the rule in force when it was added).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation_lag: Option<DurationDist>,
    /// Largest IP packet, in bytes ([`MTU_MIN`]..=[`MTU_MAX`]), of the node's pods that
    /// crosses the node's underlay link; larger ones are dropped silently, as an
    /// encapsulation whose overhead the pod MTU does not leave room for loses them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encap_mtu: Option<u32>,
    /// MTU, in bytes ([`MTU_MIN`]..=[`MTU_MAX`]), of the far (bridge-side) end of the
    /// node's underlay link: larger frames are lost on the link both ways while the node
    /// keeps its own MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_mtu: Option<u32>,
    /// Forwarded pod packets of some protocols dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proto_drop: Option<ProtoDrop>,
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
            #[serde(default)]
            queue: Option<Queue>,
            #[serde(default)]
            revoke: Option<Revoke>,
            #[serde(default)]
            name_reuse_race: Option<Probability>,
            #[serde(default)]
            first_connections_dropped: Option<u32>,
            #[serde(default)]
            cross_node: Option<CrossNode>,
            #[serde(default)]
            family_broken: Option<IpFamily>,
            #[serde(default)]
            stale_routes: Option<StaleRoutes>,
            #[serde(default)]
            service_delay: Option<DurationDist>,
            #[serde(default)]
            teardown_delay: Option<DurationDist>,
            #[serde(default)]
            cni_add_delay: Option<DurationDist>,
            #[serde(default)]
            clock_skew: Option<ClockSkew>,
            #[serde(default)]
            agent: Option<AgentFaults>,
            #[serde(default)]
            agent_io: Option<AgentIo>,
            #[serde(default)]
            agent_cpu: Option<AgentCpu>,
            #[serde(default)]
            agent_pause: Option<AgentPause>,
            #[serde(default)]
            policies: Option<u32>,
            #[serde(default)]
            agent_version: Option<AgentVersion>,
            #[serde(default)]
            policy_delay: Option<DurationDist>,
            #[serde(default)]
            policy_never: Option<Probability>,
            #[serde(default)]
            isolation_lag: Option<DurationDist>,
            #[serde(default, deserialize_with = "de_encap_mtu")]
            encap_mtu: Option<u32>,
            #[serde(default, deserialize_with = "de_link_mtu")]
            link_mtu: Option<u32>,
            #[serde(default)]
            proto_drop: Option<ProtoDrop>,
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
            service_delay: r.service_delay,
            teardown_delay: r.teardown_delay,
            cni_add_delay: r.cni_add_delay,
            resync_loop: r.resync_loop,
            never_program: r.never_program,
            queue: r.queue,
            revoke: r.revoke,
            name_reuse_race: r.name_reuse_race,
            first_connections_dropped: r.first_connections_dropped,
            cross_node: r.cross_node,
            family_broken: r.family_broken,
            stale_routes: r.stale_routes,
            clock_skew: r.clock_skew,
            agent: r.agent,
            agent_io: r.agent_io,
            agent_cpu: r.agent_cpu,
            agent_pause: r.agent_pause,
            policies: r.policies,
            agent_version: r.agent_version.map(|v| v.0),
            policy_delay: r.policy_delay,
            policy_never: r.policy_never,
            isolation_lag: r.isolation_lag,
            encap_mtu: r.encap_mtu,
            link_mtu: r.link_mtu,
            proto_drop: r.proto_drop,
        })
    }
}

/// A parsed fault file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultFile {
    /// Rules in file order (later ones override earlier ones key by key). Required:
    /// `rules: []` is the explicit no-fault file (issue 31: an empty file, or one whose
    /// key was mistyped, was "applied" as no faults without a word).
    pub rules: Vec<Rule>,
}

/// The faults in force for one node at one moment, resolved from every matching rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct NodeFaults {
    pub program_delay: Option<DurationDist>,
    pub service_delay: Option<DurationDist>,
    pub teardown_delay: Option<DurationDist>,
    pub cni_add_delay: Option<DurationDist>,
    pub resync_loop: Option<ResyncLoop>,
    pub never_program: Option<Probability>,
    pub queue: Option<Queue>,
    pub revoke: Option<Revoke>,
    pub name_reuse_race: Option<Probability>,
    pub first_connections_dropped: Option<u32>,
    pub cross_node: Option<CrossNode>,
    /// A later rule's `family_broken` replaces an earlier one (one family per node).
    pub family_broken: Option<IpFamily>,
    pub stale_routes: Option<StaleRoutes>,
    pub clock_skew: Option<ClockSkew>,
    /// Merged key by key across rules; all `None` when no rule sets `agent`.
    pub agent: AgentFaults,
    /// A later rule's `agent_io` replaces an earlier one as a whole.
    pub agent_io: Option<AgentIo>,
    pub agent_cpu: Option<AgentCpu>,
    pub agent_pause: Option<AgentPause>,
    /// The `policies` of the last rule in force that selects the node and sets it; the
    /// policies are cluster-wide, so read [`FaultFile::policies_in_force`] to know how
    /// many exist.
    pub policies: Option<u32>,
    pub agent_version: Option<String>,
    pub policy_delay: Option<DurationDist>,
    pub policy_never: Option<Probability>,
    pub isolation_lag: Option<DurationDist>,
    /// Bytes; see [`Rule::encap_mtu`].
    pub encap_mtu: Option<u32>,
    /// Bytes; see [`Rule::link_mtu`].
    pub link_mtu: Option<u32>,
    /// A later rule's `proto_drop` replaces an earlier one as a whole.
    pub proto_drop: Option<ProtoDrop>,
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

    /// Plans one NetworkPolicy change ([`crate::policy_sync`]): `None` = never (a new
    /// admission, `admission` true, drawn under `policy_never`), else the sampled
    /// `policy_delay` (zero when unset).
    pub fn plan_policy_change<R: Rng + ?Sized>(
        &self,
        admission: bool,
        rng: &mut R,
    ) -> Option<Duration> {
        if let (true, Some(Probability(p))) = (admission, self.policy_never) {
            if rng.random_bool(p.clamp(0.0, 1.0)) {
                return None;
            }
        }
        Some(self.policy_delay.map_or(Duration::ZERO, |d| d.sample(rng)))
    }

    /// Whether any fault is in force.
    pub fn is_empty(&self) -> bool {
        self == &NodeFaults::default()
    }
}

impl FaultFile {
    /// Parses a fault file. Errors: [`FaultError::Parse`] for a document without the
    /// top-level `rules:` key (an empty file included: `rules: []` says "no faults"),
    /// and with serde_yaml_ng's message for syntax errors, unknown keys ("unknown field
    /// `x`, expected one of …"), bad values and unimplemented primitives
    /// (`service_delay`), each followed by "at line L column C".
    pub fn parse(yaml: &str) -> Result<FaultFile, FaultError> {
        if yaml.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        }) {
            return Err(FaultError::Parse {
                message: "the file is empty: it has no `rules:` key (write `rules: []` for \
                          no faults)"
                    .into(),
                line: None,
            });
        }
        serde_yaml_ng::from_str(yaml).map_err(|e| {
            let mut err = FaultError::from_yaml(e, yaml);
            if let FaultError::Parse { message, .. } = &mut err {
                if message.starts_with("missing field `rules`") {
                    *message = format!(
                        "{message}: a fault file is `rules:` and a list of rules (`rules: []` \
                         for no faults)"
                    );
                }
            }
            err
        })
    }

    /// Checks that every node a rule names (`nodes: {names}`, `cross_node.broken_peers`
    /// lists) is one of `nodes`, and that this machine can apply every rule.
    /// Errors: [`FaultError::UnknownNode`] for the first name that is not a node
    /// (label selectors are not checked: they may select nothing on purpose);
    /// [`FaultError::Unsupported`] for `clock_skew` when libfaketime is not installed
    /// at [`LIBFAKETIME_PATH`] (Debian package `libfaketime`, `scripts/setup.sh`).
    pub fn check_nodes(&self, nodes: &[String]) -> Result<(), FaultError> {
        for (i, r) in self.rules.iter().enumerate() {
            if r.clock_skew.is_some() && !std::path::Path::new(LIBFAKETIME_PATH).exists() {
                return Err(FaultError::Unsupported {
                    rule: i + 1,
                    message: format!(
                        "clock_skew needs libfaketime at {LIBFAKETIME_PATH} (apt-get install libfaketime)"
                    ),
                });
            }
            let mut named: Vec<&String> = Vec::new();
            if let NodeSelector::Names(n) = &r.nodes {
                named.extend(n);
            }
            if let Some(CrossNode {
                broken_peers: BrokenPeers::Names(n),
            }) = &r.cross_node
            {
                named.extend(n);
            }
            if let Some(bad) = named.into_iter().find(|n| !nodes.contains(n)) {
                return Err(FaultError::UnknownNode {
                    rule: i + 1,
                    name: bad.clone(),
                    known: nodes.join(", "),
                });
            }
        }
        Ok(())
    }

    /// Reads, parses and checks the fault file at `path` for the cluster's `nodes`
    /// ([`FaultFile::check_nodes`]) and the running components
    /// ([`FaultFile::check_components`]): what `testbed up --fault` and `fault set` do.
    /// Errors (anyhow, one line): the file unreadable, or the parse/check error prefixed
    /// with the path.
    ///
    /// `ipv6`: whether the testbed is dual-stack ([`FaultFile::check_families`]).
    pub fn load_checked(
        path: &std::path::Path,
        nodes: &[String],
        agent: AgentKind,
        proxy: ProxyKind,
        kubelet: KubeletKind,
        ipv6: bool,
    ) -> anyhow::Result<FaultFile> {
        use anyhow::Context as _;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read fault file {}", path.display()))?;
        FaultFile::parse(&text)
            .and_then(|ff| ff.check_nodes(nodes).map(|()| ff))
            .and_then(|ff| ff.check_components(&text, agent, proxy).map(|()| ff))
            .and_then(|ff| ff.check_kubelet(&text, kubelet, agent).map(|()| ff))
            .and_then(|ff| ff.check_families(&text, ipv6).map(|()| ff))
            .map_err(|e| {
                // FaultError's text starts with "fault file: "; name the file there.
                let text = e.to_string();
                let text = text
                    .strip_prefix("fault file: ")
                    .unwrap_or(&text)
                    .to_owned();
                anyhow::anyhow!("fault file {}: {text}", path.display())
            })
    }

    /// Resolves the faults for node `node` with `labels` at `since_applied` after the
    /// file was applied (for per-endpoint primitives: when the endpoint was added):
    /// every rule that selects the node and whose `[from, until)` contains
    /// `since_applied` is applied in order, each key it sets overriding earlier rules
    /// (`agent`'s keys one by one).
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
            macro_rules! take {
                ($($k:ident),*) => { $( if r.$k.is_some() { out.$k = r.$k.clone(); } )* };
            }
            rule_primitives!(take);
            if let Some(a) = &r.agent {
                out.agent.merge(a);
            }
        }
        out
    }

    /// The `from`/`until` offsets (since application) of every rule that selects the
    /// node, sorted and deduplicated: the moments at which node-wide faults may change.
    pub fn boundaries(&self, node: &str, labels: &BTreeMap<String, String>) -> Vec<Duration> {
        let mut v: Vec<Duration> = self
            .rules
            .iter()
            .filter(|r| r.nodes.matches(node, labels))
            .flat_map(|r| [r.from, r.until])
            .flatten()
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// How many `policies` exist at `since_applied` after the file was applied: the
    /// largest `policies` among the rules whose `[from, until)` contains `since_applied`,
    /// whatever nodes they select (the policies live in a namespace of their own, not on
    /// a node, so `nodes` does not narrow them; two rules in force asking for 100 and 50
    /// mean 100 policies, not 150 and not the later one's 50). 0 when no rule in force
    /// sets it.
    pub fn policies_in_force(&self, since_applied: Duration) -> u32 {
        self.rules
            .iter()
            .filter(|r| {
                !(r.from.is_some_and(|f| since_applied < f)
                    || r.until.is_some_and(|u| since_applied >= u))
            })
            .filter_map(|r| r.policies)
            .max()
            .unwrap_or(0)
    }

    /// Every `agent_version` any rule names, whatever its nodes and `from`/`until` (for
    /// start-up checks that each release is installed).
    pub fn agent_versions(&self) -> BTreeSet<String> {
        self.rules
            .iter()
            .filter_map(|r| r.agent_version.clone())
            .collect()
    }

    /// Checks that every primitive the file sets applies to the running agent and
    /// service proxy, rules in file order. `text` is the YAML the file was parsed from,
    /// used only to find the line of the offending key.
    ///
    /// - With [`AgentKind::Calico`] (real Felix) the simulated agent's decisions and its
    ///   imitation of Felix's metrics are refused: `program_delay`, `resync_loop`,
    ///   `never_program`, `queue`, `revoke`, `name_reuse_race`,
    ///   `first_connections_dropped`, `policy_delay`, `policy_never`, `isolation_lag` and
    ///   `agent.not_ready`,
    ///   `agent.extra_failures_per_second`, `agent.extra_resyncs_per_second`,
    ///   `agent.apply_time_floor`, `agent.route_resync`, `agent.datastore_resync`,
    ///   `agent.gates_readiness`.
    /// - With [`AgentKind::Simulated`] the primitives acting on the real Felix process are
    ///   refused: `agent_io`, `agent_cpu`, `agent_pause`, `policies`, `agent_version`.
    /// - With [`ProxyKind::Real`] `service_delay` (a delay of the simulated kube-proxy)
    ///   is refused.
    /// - `cross_node`, `family_broken`, `stale_routes`, `clock_skew`, `teardown_delay`,
    ///   `cni_add_delay`
    ///   and `agent.restarts` apply to both agents; `link_mtu`, `encap_mtu` and
    ///   `proto_drop` (the node's network, beside whatever the agent programs) to every
    ///   agent, proxy and kubelet.
    ///
    /// Error: [`FaultError::NotForComponent`] for the first offending key, the first in
    /// the file among several in the same rule. Its line is the first line inside the
    /// rule (the `- ` item of `rules:`) where the key is written as a mapping key, in
    /// block or flow style (`agent: {gates_readiness: true}`), a nested key after its
    /// parent; else the rule's first line.
    pub fn check_components(
        &self,
        text: &str,
        agent: AgentKind,
        proxy: ProxyKind,
    ) -> Result<(), FaultError> {
        self.check_keys(text, |k| {
            refusal(k, agent, proxy).map(|why| (refusing_component(k), why))
        })
    }

    /// Refuses a key that only the simulated kubelet acts on when the nodes run real
    /// kubelets (`testbed up --kubelet real`), naming its rule and line and why
    /// ([`SIMULATED_KUBELET_ONLY`]): applying it would silently do nothing.
    /// (`agent.restarts` stays allowed with real Felix: its own supervisor restarts it.)
    pub fn check_kubelet(
        &self,
        text: &str,
        kubelet: KubeletKind,
        agent: AgentKind,
    ) -> Result<(), FaultError> {
        self.check_keys(text, |k| match kubelet {
            KubeletKind::Simulated => None,
            KubeletKind::Real if k == "agent.restarts" && agent == AgentKind::Calico => None,
            KubeletKind::Real => SIMULATED_KUBELET_ONLY
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, why)| {
                    (
                        "a real kubelet",
                        format!("{why}; drop `--kubelet real` to use it"),
                    )
                }),
        })
    }

    /// Refuses `family_broken: ipv6` on an IPv4-only testbed (`ipv6` false: `testbed up`
    /// without `--ip-families ipv4,ipv6`): there is no IPv6 route to remove, so the rule
    /// would silently do nothing. Error: [`FaultError::NotForComponent`] (component "an
    /// IPv4-only testbed") naming the first such rule and the line of its key.
    pub fn check_families(&self, text: &str, ipv6: bool) -> Result<(), FaultError> {
        if ipv6 {
            return Ok(());
        }
        let Some(i) = self
            .rules
            .iter()
            .position(|r| r.family_broken == Some(IpFamily::Ipv6))
        else {
            return Ok(());
        };
        let lines: Vec<&str> = text.lines().collect();
        let span = rule_spans(text).get(i).copied();
        let line = span
            .and_then(|s| find_key(&lines, s, "family_broken"))
            .map(|pos| pos.0 + 1)
            .unwrap_or_else(|| span.map_or_else(|| rules_line(&lines), |s| s.0 + 1));
        Err(FaultError::NotForComponent {
            component: "an IPv4-only testbed",
            rule: i + 1,
            line,
            key: "family_broken".into(),
            message: "the testbed has no IPv6 routes to break; start it with \
                      `testbed up --ip-families ipv4,ipv6`"
                .into(),
        })
    }

    /// The first key of a rule that `refusal` refuses, as a [`FaultError::NotForComponent`].
    fn check_keys(
        &self,
        text: &str,
        refusal: impl Fn(&str) -> Option<(&'static str, String)>,
    ) -> Result<(), FaultError> {
        let mut spans: Option<Vec<(usize, usize)>> = None;
        for (i, r) in self.rules.iter().enumerate() {
            type Why = (&'static str, String);
            let refused: Vec<(&'static str, Why)> = r
                .keys_written()
                .into_iter()
                .filter_map(|k| refusal(k).map(|why| (k, why)))
                .collect();
            if refused.is_empty() {
                continue;
            }
            let spans = spans.get_or_insert_with(|| rule_spans(text));
            let lines: Vec<&str> = text.lines().collect();
            let span = spans.get(i).copied();
            let (key, why, line) = refused
                .into_iter()
                .enumerate()
                .map(|(order, (k, why))| {
                    let pos = span.and_then(|s| find_key(&lines, s, k));
                    (pos.unwrap_or((usize::MAX, usize::MAX)), order, k, why)
                })
                .min()
                .map(|(pos, _, k, why)| {
                    let line = if pos.0 == usize::MAX {
                        span.map_or_else(|| rules_line(&lines), |s| s.0 + 1)
                    } else {
                        pos.0 + 1
                    };
                    (k, why, line)
                })
                .expect("refused is not empty");
            let (component, message) = why;
            return Err(FaultError::NotForComponent {
                component,
                rule: i + 1,
                line,
                key: key.to_owned(),
                message,
            });
        }
        Ok(())
    }
}

/// Which agent the testbed's nodes run (`testbed up --agent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    /// The testbed's simulated Calico agent ([`crate::agent`]).
    Simulated,
    /// The real Calico Felix (`--control-plane real --agent calico`).
    Calico,
}

/// Which kubelet the testbed's nodes run (`testbed up --kubelet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletKind {
    /// The testbed's simulated kubelet ([`crate::kubelet`]).
    Simulated,
    /// A real kubelet with containerd (`--kubelet real`, [`crate::realnode`]).
    Real,
}

/// Keys only the simulated kubelet acts on, and why (refused with real kubelets).
pub const SIMULATED_KUBELET_ONLY: &[(&str, &str)] = &[
    ("clock_skew", "it shifts a pod's clocks through the simulated kubelet (libfaketime preloaded into the container process); a real kubelet runs containers under runc, which has no time namespace on these machines"),
    ("first_connections_dropped", "the simulated kubelet arms it when a pod turns Ready"),
    ("agent.not_ready", "it sets the status of the agent pods the simulated kubelet writes; real kubelets run no agent pods"),
    ("agent.restarts", "the simulated kubelet carries the simulated agent's restarts out (and counts them on its agent pod); real kubelets run no agent pods (with real Felix the key stays: Felix's supervisor restarts it)"),
    ("agent_version", "the version is rolled through the agent pods the simulated kubelet runs; real kubelets run no agent pods"),
];

/// Which service proxy the testbed's nodes run (`testbed up --kube-proxy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    /// The testbed's simulated kube-proxy ([`crate::services`]).
    Simulated,
    /// The real kube-proxy (`--kube-proxy real`).
    Real,
}

/// What to use on real Felix instead of a simulated-agent primitive.
const ON_REAL_FELIX: &str = "on real Felix slow down or break programming with `agent_io`, \
     `agent_cpu`, `agent_pause`, `agent: {restarts}` or `policies`";

/// Keys the simulated agent alone acts on, and why (refused with real Felix).
const SIMULATED_AGENT_ONLY: &[(&str, &str)] = &[
    ("program_delay", "it sets when the simulated agent programs a new endpoint; real Felix programs as fast as it can"),
    ("resync_loop", "it makes the simulated agent program only inside periodic windows; real Felix has no such switch"),
    ("never_program", "it makes the simulated agent skip endpoints on purpose; real Felix cannot be told to (`agent_io: {fail: 1}` makes every write fail)"),
    ("queue", "it sets the simulated agent's apply time per endpoint; real Felix's apply time is its own"),
    ("revoke", "it makes the simulated agent withdraw a programmed endpoint; real Felix cannot be told to"),
    ("name_reuse_race", "it imitates the interface-name reuse race (calico#11016) in the simulated agent; real Felix shows it or not by itself"),
    ("first_connections_dropped", "it makes the simulated agent drop a new endpoint's first connections; real Felix cannot be told to"),
    ("agent.not_ready", "it sets the simulated calico-node's Ready state; real Felix reports its own readiness (stop it with `agent_pause`)"),
    ("agent.extra_failures_per_second", "it adds to the simulated agent's imitation of `felix_int_dataplane_failures`; real Felix counts its own (make its writes fail with `agent_io: {fail: P}`)"),
    ("agent.extra_resyncs_per_second", "it adds to the simulated agent's imitation of `felix_resyncs_started`; real Felix counts its own"),
    ("agent.apply_time_floor", "it pads the simulated agent's applies; real Felix's apply time is its own (slow its writes with `agent_io: {delay: D}` or its CPU with `agent_cpu`)"),
    ("agent.route_resync", "it imitates Felix's route-table resync in the simulated agent; real Felix resyncs by itself"),
    ("agent.datastore_resync", "it imitates a datastore resync in the simulated agent; real Felix resyncs by itself (after `agent: {restarts}`, for one)"),
    ("agent.gates_readiness", "it makes the simulated agent imitate what real Felix does anyway (drop a new pod's traffic to its own node until the endpoint is programmed)"),
    ("policy_delay", "it sets when the simulated agent programs a NetworkPolicy change; real Felix programs policy as fast as it can"),
    ("policy_never", "it makes the simulated agent skip NetworkPolicy admissions on purpose; real Felix cannot be told to (`agent_io: {fail: 1}` makes every write fail)"),
    ("isolation_lag", "it makes the simulated agent leave a new isolated pod open for a while; real Felix isolates it with its endpoint"),
];

/// Keys real Felix alone is subject to, and why (refused with the simulated agent).
const REAL_AGENT_ONLY: &[(&str, &str)] = &[
    ("agent_io", "it delays and fails the real Felix process's dataplane writes (iptables-nft-restore, ipset, nft); run `testbed up --control-plane real --agent calico`, or with the simulated agent use `program_delay`, `queue` or `agent: {apply_time_floor}`"),
    ("agent_cpu", "it puts a cgroup CPU quota on the real Felix process; run `testbed up --control-plane real --agent calico`, or with the simulated agent use `queue` or `agent: {apply_time_floor}`"),
    ("agent_pause", "it stops the real Felix process (SIGSTOP) for a while; run `testbed up --control-plane real --agent calico`, or with the simulated agent use `resync_loop`"),
    ("policies", "it loads the real Felix with NetworkPolicies to compute; the simulated agent enforces policies, but its cost does not grow with policies that select nothing; run `testbed up --control-plane real --agent calico`, or with the simulated agent use `queue`"),
    ("agent_version", "it picks the real Felix release the nodes run; run `testbed up --control-plane real --agent calico` (the simulated agent has no release)"),
];

/// Why `service_delay` is refused with the real kube-proxy.
const SERVICE_DELAY_REAL_PROXY: &str = "it delays the simulated kube-proxy's rule sync; the real kube-proxy syncs when it does; drop `--kube-proxy real` to use it";

/// Why `key` (as written, nested keys dotted) does not apply with this agent and proxy,
/// and what to use instead; `None` when it applies.
fn refusal(key: &str, agent: AgentKind, proxy: ProxyKind) -> Option<String> {
    let find = |table: &[(&'static str, &'static str)]| {
        table.iter().find(|(k, _)| *k == key).map(|(_, why)| *why)
    };
    match agent {
        // Real Felix gates readiness by itself: nothing to use instead.
        AgentKind::Calico if key == "agent.gates_readiness" => {
            find(SIMULATED_AGENT_ONLY).map(|why| format!("{why}; remove the key"))
        }
        AgentKind::Calico => {
            find(SIMULATED_AGENT_ONLY).map(|why| format!("{why}; {ON_REAL_FELIX}"))
        }
        AgentKind::Simulated => find(REAL_AGENT_ONLY).map(str::to_owned),
    }
    .or_else(|| {
        (key == "service_delay" && proxy == ProxyKind::Real)
            .then(|| SERVICE_DELAY_REAL_PROXY.to_owned())
    })
}

/// The component that refuses `key` ([`FaultError::NotForComponent`]'s display).
fn refusing_component(key: &str) -> &'static str {
    if key == "service_delay" {
        "real kube-proxy"
    } else if REAL_AGENT_ONLY.iter().any(|(k, _)| *k == key) {
        "the simulated agent"
    } else {
        "real Calico Felix"
    }
}

impl Rule {
    /// The primitive keys this rule sets, as written (nested `agent` keys dotted), in
    /// declaration order.
    fn keys_written(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        macro_rules! key {
            ($($k:ident),*) => { $( if self.$k.is_some() { v.push(stringify!($k)); } )* };
        }
        rule_primitives!(key);
        if let Some(a) = &self.agent {
            macro_rules! agent_key {
                ($($k:ident),*) => {
                    $( if a.$k.is_some() { v.push(concat!("agent.", stringify!($k))); } )*
                };
            }
            agent_key!(
                not_ready,
                restarts,
                extra_failures_per_second,
                extra_resyncs_per_second,
                apply_time_floor,
                route_resync,
                datastore_resync,
                gates_readiness
            );
        }
        v
    }
}

/// `line` without its comment (`#` at the start or after a blank; quotes are not
/// considered, which fault files do not need).
fn strip_comment(line: &str) -> &str {
    let b = line.as_bytes();
    match (0..b.len()).find(|&i| b[i] == b'#' && (i == 0 || b[i - 1] == b' ' || b[i - 1] == b'\t'))
    {
        Some(i) => &line[..i],
        None => line,
    }
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Whether the (comment-stripped) line is a block-sequence item: `-` then a blank or the
/// end, after the indentation.
fn is_item(line: &str) -> bool {
    let t = line.trim_start_matches(' ');
    t == "-" || t.starts_with("- ") || t.starts_with("-\t")
}

/// Index in `lines` of the first line that starts with the key `rules` (after its
/// indentation).
fn rules_index(lines: &[&str]) -> Option<usize> {
    lines.iter().position(|l| {
        let l = strip_comment(l);
        key_col(l, "rules", 0) == Some(indent_of(l))
    })
}

/// 1-based line of the top-level `rules:` key (1 when there is none).
fn rules_line(lines: &[&str]) -> usize {
    rules_index(lines).map_or(1, |i| i + 1)
}

/// The rules' line ranges in `lines`, 0-based `[start, end)`: the items of the block
/// sequence under the first `rules:` key, each from its `- ` line to the next item at
/// the same indentation or the end of the sequence (a less indented line, or one at the
/// items' indentation that is not an item). Empty when `rules` is missing or written in
/// flow style (`rules: [...]`).
fn rule_spans(text: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(r) = rules_index(&lines) else {
        return Vec::new();
    };
    // `rules:` followed by anything but a blank (flow style, a scalar, a quoted key):
    // no block sequence to read.
    let head = strip_comment(lines[r]).trim();
    if head
        .strip_prefix("rules")
        .is_none_or(|t| t.trim_start().strip_prefix(':') != Some(""))
    {
        return Vec::new();
    }
    let rules_indent = indent_of(lines[r]);
    let mut starts = Vec::new();
    let mut end = lines.len();
    let mut item_indent: Option<usize> = None;
    for (i, raw) in lines.iter().enumerate().skip(r + 1) {
        let l = strip_comment(raw);
        if l.trim().is_empty() {
            continue;
        }
        let ind = indent_of(l);
        match item_indent {
            None => {
                if ind < rules_indent || !is_item(l) {
                    return Vec::new();
                }
                item_indent = Some(ind);
                starts.push(i);
            }
            Some(ii) if ind < ii || (ind == ii && !is_item(l)) => {
                end = i;
                break;
            }
            Some(ii) if ind == ii => starts.push(i),
            Some(_) => {}
        }
    }
    let mut spans = Vec::with_capacity(starts.len());
    for (n, &s) in starts.iter().enumerate() {
        spans.push((s, starts.get(n + 1).copied().unwrap_or(end)));
    }
    spans
}

/// The byte column at or after `from` in `line` where `key` is written as a mapping key:
/// preceded by the line's start, a blank, `{` or `,` (a `- ` item marker ends in a
/// blank), optionally quoted, followed by optional blanks, `:` and a blank, the end or a
/// flow indicator.
fn key_col(line: &str, key: &str, from: usize) -> Option<usize> {
    let b = line.as_bytes();
    let mut search = from.min(line.len());
    while let Some(off) = line.get(search..).and_then(|t| t.find(key)) {
        let at = search + off;
        search = at + key.len();
        let mut start = at;
        let mut end = at + key.len();
        let quote = (start > 0 && matches!(b[start - 1], b'"' | b'\'')).then(|| b[start - 1]);
        if let Some(q) = quote {
            if b.get(end) != Some(&q) {
                continue;
            }
            start -= 1;
            end += 1;
        }
        let before_ok = start == 0 || matches!(b[start - 1], b' ' | b'\t' | b'{' | b',');
        if !before_ok {
            continue;
        }
        let rest = line[end..].trim_start_matches([' ', '\t']);
        if let Some(after) = rest.strip_prefix(':') {
            if after.is_empty() || after.starts_with([' ', '\t', '{', '[', ',', '}', ']']) {
                return Some(start);
            }
        }
    }
    None
}

/// Where `key` (nested keys dotted: `agent.apply_time_floor`) is first written as a
/// mapping key within `span` of `lines`, as 0-based (line, column); a nested key is
/// looked for after its parent, and is its parent's position when only the parent is
/// found.
fn find_key(lines: &[&str], span: (usize, usize), key: &str) -> Option<(usize, usize)> {
    let (lo, hi) = (span.0, span.1.min(lines.len()));
    let find_from = |k: &str, from: (usize, usize)| {
        (from.0..hi).find_map(|i| {
            let start = if i == from.0 { from.1 } else { 0 };
            key_col(strip_comment(lines[i]), k, start).map(|c| (i, c))
        })
    };
    match key.split_once('.') {
        None => find_from(key, (lo, 0)),
        Some((parent, leaf)) => {
            let p = find_from(parent, (lo, 0))?;
            Some(find_from(leaf, (p.0, p.1 + parent.len())).unwrap_or(p))
        }
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

    /// A sample of `service_delay` for `node` now (zero when unset).
    pub fn service_delay(&self, node: &str, labels: &BTreeMap<String, String>) -> Duration {
        self.sample_now(node, labels, |nf| nf.service_delay)
    }

    /// A sample of `teardown_delay` for `node` now (zero when unset).
    pub fn teardown_delay(&self, node: &str, labels: &BTreeMap<String, String>) -> Duration {
        self.sample_now(node, labels, |nf| nf.teardown_delay)
    }

    /// A sample of `cni_add_delay` for `node` now (zero when unset).
    pub fn cni_add_delay(&self, node: &str, labels: &BTreeMap<String, String>) -> Duration {
        self.sample_now(node, labels, |nf| nf.cni_add_delay)
    }

    /// A sample of the node-wide duration `pick` selects, as in force now (zero when
    /// unset).
    fn sample_now(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
        pick: impl Fn(&NodeFaults) -> Option<DurationDist>,
    ) -> Duration {
        let a = self.current();
        let nf = a.file.for_node(node, labels, a.applied_at.elapsed());
        pick(&nf).map_or(Duration::ZERO, |d| d.sample(&mut rand::rng()))
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

    /// Issue 31: `rules: []` is the explicit no-fault file; an empty file or one
    /// without the `rules:` key is refused, not applied as nothing.
    #[test]
    fn only_rules_empty_list_is_the_no_fault_file() {
        assert_eq!(
            FaultFile::parse("rules: []\n").unwrap(),
            FaultFile::default()
        );
        for text in ["", "# nothing\n", "---\n"] {
            let e = err(text);
            assert!(
                e.contains("no `rules:` key") && e.contains("rules: []"),
                "{e}"
            );
        }
        let e = err("rule:\n  - nodes: {all: true}\n");
        assert!(e.contains("rule"), "{e}");
        let e = err("{}\n");
        assert!(
            e.contains("missing field `rules`") && e.contains("rules: []"),
            "{e}"
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
    fn teardown_delay_is_node_wide_and_sampled_now() {
        let f = FaultFile::parse("rules:\n  - nodes: {names: [node-2]}\n    teardown_delay: 3s\n")
            .unwrap();
        let faults = Faults::new(f);
        let labels = BTreeMap::new();
        assert_eq!(
            faults.teardown_delay("node-2", &labels),
            Duration::from_secs(3)
        );
        assert_eq!(faults.teardown_delay("node-1", &labels), Duration::ZERO);
        assert!(err("rules:\n  - nodes: {all: true}\n    teardown_delay: x\n").contains("line 3"));
    }

    #[test]
    fn cni_add_delay_is_node_wide_for_both_agents() {
        let yaml =
            "rules:\n  - nodes: {labels: {zone: a}}\n    cni_add_delay: {uniform: [1s, 2s]}\n";
        let f = FaultFile::parse(yaml).unwrap();
        for agent in [AgentKind::Simulated, AgentKind::Calico] {
            f.check_components(yaml, agent, ProxyKind::Simulated)
                .unwrap();
        }
        let faults = Faults::new(f);
        let zone_a = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
        let d = faults.cni_add_delay("node-1", &zone_a);
        assert!(
            (Duration::from_secs(1)..=Duration::from_secs(2)).contains(&d),
            "{d:?}"
        );
        assert_eq!(
            faults.cni_add_delay("node-1", &BTreeMap::new()),
            Duration::ZERO
        );
        assert_eq!(faults.teardown_delay("node-1", &zone_a), Duration::ZERO);
        assert!(err("rules:\n  - nodes: {all: true}\n    cni_add_delay: x\n").contains("line 3"));
    }

    #[test]
    fn service_delay_parses_as_a_duration_distribution() {
        let f = FaultFile::parse(
            "rules:\n  - nodes: {all: true}\n    service_delay: 2s\n  - nodes: {names: [node-2]}\n    service_delay: {uniform: [1s, 3s]}\n",
        )
        .unwrap();
        let labels = BTreeMap::new();
        assert_eq!(
            f.for_node("node-1", &labels, Duration::ZERO).service_delay,
            Some(DurationDist::Fixed(Duration::from_secs(2)))
        );
        assert_eq!(
            f.for_node("node-2", &labels, Duration::ZERO).service_delay,
            Some(DurationDist::Uniform(
                Duration::from_secs(1),
                Duration::from_secs(3)
            ))
        );
        assert!(
            err("rules:\n  - nodes: {all: true}\n    service_delay: later\n").contains("line 3")
        );
    }

    #[test]
    fn route_and_datastore_resyncs_parse_merge_and_reject_a_zero_period() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent: {route_resync: {every: 3s, takes: 2s}}\n- nodes: {names: [node-2]}\n  agent: {datastore_resync: {every: {uniform: [2s, 4s]}, takes: 1500ms}}\n",
        )
        .unwrap();
        let l = labels(&[]);
        let n1 = f.for_node("node-1", &l, Duration::ZERO).agent;
        assert_eq!(
            n1.route_resync,
            Some(Periodic {
                every: DurationDist::Fixed(Duration::from_secs(3)),
                takes: DurationDist::Fixed(Duration::from_secs(2)),
            })
        );
        assert_eq!(n1.datastore_resync, None);
        let n2 = f.for_node("node-2", &l, Duration::ZERO).agent;
        assert!(n2.route_resync.is_some(), "keys merge one by one");
        assert_eq!(
            n2.datastore_resync.map(|d| d.takes),
            Some(DurationDist::Fixed(Duration::from_millis(1500)))
        );
        let e =
            err("rules:\n- nodes: {all: true}\n  agent: {route_resync: {every: 0s, takes: 1s}}\n");
        assert!(e.contains("every"), "{e}");
        let e = err("rules:\n- nodes: {all: true}\n  agent: {datastore_resync: {every: 1s}}\n");
        assert!(e.contains("takes"), "{e}");
    }

    #[test]
    fn every_other_primitive_parses_with_its_values() {
        let f = FaultFile::parse(
            r#"rules:
- nodes: {all: true}
  queue: {per_endpoint: 300ms}
  revoke: {after: {uniform: [1s, 2s]}}
  name_reuse_race: 0.5
  first_connections_dropped: 3
  cross_node: {broken_peers: all}
  stale_routes: {k: 2, for: 10s}
  clock_skew: -1m
  agent: {not_ready: true, restarts: {every: 30s}, extra_failures_per_second: 1, extra_resyncs_per_second: 0.5, apply_time_floor: 1s}
- nodes: {names: [node-2]}
  cross_node: {broken_peers: [node-1, node-3]}
  clock_skew: 30s
  agent: {not_ready: false}
"#,
        )
        .unwrap();
        let l = labels(&[]);
        let n1 = f.for_node("node-1", &l, Duration::ZERO);
        assert_eq!(
            n1.queue.unwrap().per_endpoint,
            DurationDist::Fixed(Duration::from_millis(300))
        );
        assert_eq!(
            n1.revoke.unwrap().after,
            DurationDist::Uniform(Duration::from_secs(1), Duration::from_secs(2))
        );
        assert_eq!(n1.name_reuse_race, Some(Probability(0.5)));
        assert_eq!(n1.first_connections_dropped, Some(3));
        assert_eq!(
            n1.cross_node.as_ref().unwrap().broken_peers,
            BrokenPeers::All
        );
        let s = n1.stale_routes.unwrap();
        assert_eq!(s.k, 2);
        assert_eq!(s.hold, Some(DurationDist::Fixed(Duration::from_secs(10))));
        assert_eq!(n1.clock_skew.unwrap().seconds, -60.0);
        assert_eq!(n1.agent.not_ready, Some(true));
        assert_eq!(n1.agent.extra_failures_per_second, Some(1.0));
        assert_eq!(n1.agent.extra_resyncs_per_second, Some(0.5));
        assert_eq!(n1.agent.apply_time_floor, Some(Duration::from_secs(1)));
        assert_eq!(
            n1.agent.restarts.unwrap().every,
            DurationDist::Fixed(Duration::from_secs(30))
        );
        // node-2: later rule overrides key by key, agent keys one by one.
        let n2 = f.for_node("node-2", &l, Duration::ZERO);
        let peers = n2.cross_node.unwrap().broken_peers;
        assert!(peers.includes("node-3") && !peers.includes("node-4"));
        assert_eq!(n2.clock_skew.unwrap().seconds, 30.0);
        assert_eq!(n2.agent.not_ready, Some(false));
        assert_eq!(n2.agent.extra_failures_per_second, Some(1.0));
        assert_eq!(n2.first_connections_dropped, Some(3));
        // Rules serialise (for the truth log) and the skew keeps its sign.
        let v = serde_json::to_value(&f.rules).unwrap();
        assert_eq!(v[0]["clock_skew"], "-1m");
        assert_eq!(v[0]["cross_node"]["broken_peers"], "all");
        assert_eq!(v[0]["stale_routes"]["for"], "10s");
    }

    #[test]
    fn clock_skew_timens_offsets_keep_nanoseconds_positive() {
        assert_eq!(
            ClockSkew { seconds: 30.0 }.timens_offsets(),
            "monotonic 30 0\nboottime 30 0\n"
        );
        assert_eq!(
            ClockSkew { seconds: -2.5 }.timens_offsets(),
            "monotonic -3 500000000\nboottime -3 500000000\n"
        );
    }

    #[test]
    fn clock_skew_env_uses_libfaketime_relative_offsets() {
        let env = ClockSkew { seconds: -2.5 }.faketime_env();
        assert!(env.contains(&("FAKETIME".to_owned(), "-2.5".to_owned())));
        assert!(env.contains(&("LD_PRELOAD".to_owned(), LIBFAKETIME_PATH.to_owned())));
        let env = ClockSkew { seconds: 30.0 }.faketime_env();
        assert!(env.contains(&("FAKETIME".to_owned(), "+30".to_owned())));
    }

    #[test]
    fn bad_primitive_values_are_rejected() {
        assert!(
            err("rules:\n- nodes: {all: true}\n  cross_node: {broken_peers: some}\n")
                .contains("expected `all`")
        );
        assert!(err("rules:\n- nodes: {all: true}\n  queue: {per: 1s}\n").contains("per"));
        assert!(
            err("rules:\n- nodes: {all: true}\n  agent: {extra_failures_per_second: -1}\n")
                .contains("≥ 0")
        );
        assert!(
            err("rules:\n- nodes: {all: true}\n  agent: {restart: true}\n").contains("restart")
        );
        assert!(
            err("rules:\n- nodes: {all: true}\n  clock_skew: soon\n").contains("invalid duration")
        );
    }

    #[test]
    fn boundaries_list_the_from_until_of_selected_rules() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  from: 2s\n  until: 5s\n  agent: {not_ready: true}\n\
             - nodes: {names: [node-9]}\n  from: 1s\n  agent: {not_ready: true}\n",
        )
        .unwrap();
        assert_eq!(
            f.boundaries("node-1", &labels(&[])),
            vec![Duration::from_secs(2), Duration::from_secs(5)]
        );
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
            ..NodeFaults::default()
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

    #[test]
    fn rules_naming_nodes_the_cluster_lacks_are_rejected() {
        let nodes: Vec<String> = (1..=3).map(|i| format!("node-{i}")).collect();
        let ok = FaultFile::parse(
            "rules:\n  - nodes: {names: [node-3]}\n    cross_node: {broken_peers: [node-1]}\n  - nodes: {labels: {os: none}}\n    program_delay: 1s\n",
        )
        .unwrap();
        assert!(ok.check_nodes(&nodes).is_ok());
        let typo = FaultFile::parse("rules:\n  - nodes: {all: true}\n    program_delay: 1s\n  - nodes: {names: [node-2, nod-3]}\n    program_delay: 2s\n").unwrap();
        let e = typo.check_nodes(&nodes).unwrap_err().to_string();
        assert!(e.contains("rule 2 names node \"nod-3\""), "{e}");
        assert!(e.contains("node-1, node-2, node-3"), "{e}");
        let peer = FaultFile::parse(
            "rules:\n  - nodes: {all: true}\n    cross_node: {broken_peers: [node-4]}\n",
        )
        .unwrap();
        assert!(peer
            .check_nodes(&nodes)
            .unwrap_err()
            .to_string()
            .contains("node-4"));
    }

    fn calico_err(yaml: &str) -> FaultError {
        FaultFile::parse(yaml)
            .unwrap()
            .check_components(yaml, AgentKind::Calico, ProxyKind::Simulated)
            .unwrap_err()
    }

    fn simulated_err(yaml: &str) -> FaultError {
        FaultFile::parse(yaml)
            .unwrap()
            .check_components(yaml, AgentKind::Simulated, ProxyKind::Simulated)
            .unwrap_err()
    }

    #[test]
    fn keys_only_the_simulated_kubelet_acts_on_are_refused_with_real_kubelets() {
        let yaml = "rules:\n  - nodes: {all: true}\n    program_delay: 1s\n  - nodes: {names: [node-2]}\n    teardown_delay: 1s\n    clock_skew: 5s\n";
        let f = FaultFile::parse(yaml).unwrap();
        f.check_kubelet(yaml, KubeletKind::Simulated, AgentKind::Simulated)
            .unwrap();
        let e = f
            .check_kubelet(yaml, KubeletKind::Real, AgentKind::Simulated)
            .unwrap_err();
        assert_eq!(refused_at(&e), (2, 6, "clock_skew"));
        let text = e.to_string();
        assert!(
            text.contains("does not apply to a real kubelet") && text.contains("--kubelet real"),
            "{text}"
        );
        // The simulated agent's restarts are the simulated kubelet's to carry out; real
        // Felix restarts under its own supervisor.
        let yaml = "rules:\n  - nodes: {all: true}\n    agent: {restarts: {every: 30s}}\n";
        let f = FaultFile::parse(yaml).unwrap();
        let e = f
            .check_kubelet(yaml, KubeletKind::Real, AgentKind::Simulated)
            .unwrap_err();
        assert_eq!(refused_at(&e).2, "agent.restarts");
        f.check_kubelet(yaml, KubeletKind::Real, AgentKind::Calico)
            .unwrap();
    }

    /// (rule, line, key) of a [`FaultError::NotForComponent`].
    fn refused_at(e: &FaultError) -> (usize, usize, &str) {
        match e {
            FaultError::NotForComponent {
                rule, line, key, ..
            } => (*rule, *line, key.as_str()),
            other => panic!("not NotForComponent: {other}"),
        }
    }

    #[test]
    fn agent_io_parses_delay_and_fail_and_needs_one_of_them() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent_io: {delay: {uniform: [10ms, 50ms]}, fail: 0.2}\n\
             - nodes: {names: [node-2]}\n  agent_io: {fail: true}\n",
        )
        .unwrap();
        assert_eq!(
            f.rules[0].agent_io,
            Some(AgentIo {
                delay: Some(DurationDist::Uniform(
                    Duration::from_millis(10),
                    Duration::from_millis(50)
                )),
                fail: Some(Probability(0.2)),
            })
        );
        assert_eq!(
            f.rules[1].agent_io,
            Some(AgentIo {
                delay: None,
                fail: Some(Probability(1.0)),
            })
        );
        let e = err("rules:\n- nodes: {all: true}\n  agent_io: {}\n");
        assert!(e.contains("agent_io: give `delay`, `fail` or both"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        let e = err("rules:\n- nodes: {all: true}\n  agent_io: {fail: 1.5}\n");
        assert!(e.contains("probability 1.5 is outside 0–1"), "{e}");
        let e = err("rules:\n- nodes: {all: true}\n  agent_io: {delay: soon}\n");
        assert!(e.contains("invalid duration"), "{e}");
        let e = err("rules:\n- nodes: {all: true}\n  agent_io: {delay: 1s, retries: 2}\n");
        assert!(
            e.contains("unknown field `retries`") && e.contains("line 3"),
            "{e}"
        );
    }

    #[test]
    fn a_later_agent_io_replaces_an_earlier_one_as_a_whole() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent_io: {delay: 1s, fail: 0.1}\n\
             - nodes: {names: [node-2]}\n  agent_io: {fail: 0.5}\n",
        )
        .unwrap();
        let l = labels(&[]);
        assert_eq!(
            f.for_node("node-1", &l, Duration::ZERO).agent_io,
            Some(AgentIo {
                delay: Some(DurationDist::Fixed(Duration::from_secs(1))),
                fail: Some(Probability(0.1)),
            })
        );
        assert_eq!(
            f.for_node("node-2", &l, Duration::ZERO).agent_io,
            Some(AgentIo {
                delay: None,
                fail: Some(Probability(0.5)),
            })
        );
    }

    #[test]
    fn agent_cpu_quota_reads_percent_strings_and_plain_numbers() {
        let quota = |v: &str| {
            FaultFile::parse(&format!(
                "rules:\n- nodes: {{all: true}}\n  agent_cpu: {{quota: {v}}}\n"
            ))
            .map(|f| f.rules[0].agent_cpu.unwrap().quota_percent)
            .map_err(|e| e.to_string())
        };
        assert_eq!(quota("2%"), Ok(2.0));
        assert_eq!(quota("0.5%"), Ok(0.5));
        assert_eq!(quota("\"0.5 %\""), Ok(0.5));
        assert_eq!(quota("0.1%"), Ok(0.1));
        assert_eq!(quota("1000%"), Ok(1000.0));
        assert_eq!(quota("3"), Ok(3.0));
        assert_eq!(quota("0.25"), Ok(0.25));
        for bad in ["0%", "0", "0.05%", "1001%", "-1%", "-2"] {
            let e = quota(bad).unwrap_err();
            assert!(
                e.contains("agent_cpu.quota must be between 0.1% and 1000% of one CPU (above 0;")
                    && e.contains("line 3"),
                "{bad}: {e}"
            );
        }
        let e = quota("lots").unwrap_err();
        assert!(
            e.contains("agent_cpu.quota: expected a percentage of one CPU such as 2% or 0.5%, got \"lots\""),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  agent_cpu: {quota: 2%, burst: 1%}\n");
        assert!(
            e.contains("unknown field `burst`") && e.contains("line 3"),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  agent_cpu: {}\n");
        assert!(e.contains("missing field `quota`"), "{e}");
    }

    #[test]
    fn agent_cpu_cfs_keeps_the_share_within_the_kernel_limits() {
        let cfs = |p: f64| AgentCpu { quota_percent: p }.cfs();
        assert_eq!(cfs(2.0), (100_000, 2_000));
        assert_eq!(cfs(0.5), (200_000, 1_000));
        assert_eq!(cfs(0.1), (1_000_000, 1_000));
        assert_eq!(cfs(1.0), (100_000, 1_000));
        assert_eq!(cfs(0.3), (333_333, 1_000));
        assert_eq!(cfs(250.0), (100_000, 250_000));
        assert_eq!(cfs(1000.0), (100_000, 1_000_000));
        // Built by hand below the minimum: clamped to 0.1 %.
        assert_eq!(cfs(0.01), (1_000_000, 1_000));
        assert_eq!(cfs(f64::NAN), (1_000_000, 1_000));
    }

    #[test]
    fn agent_pause_parses_every_and_for_and_refuses_a_zero_period() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent_pause: {every: 30s, for: {uniform: [1s, 5s]}}\n",
        )
        .unwrap();
        let p = f
            .for_node("node-1", &labels(&[]), Duration::ZERO)
            .agent_pause;
        assert_eq!(
            p,
            Some(AgentPause {
                every: DurationDist::Fixed(Duration::from_secs(30)),
                for_: DurationDist::Uniform(Duration::from_secs(1), Duration::from_secs(5)),
            })
        );
        let e = err("rules:\n- nodes: {all: true}\n  agent_pause: {every: 0s, for: 1s}\n");
        assert!(
            e.contains("agent_pause.every must be above 0") && e.contains("line 3"),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  agent_pause: 10s\n");
        assert!(
            e.contains("expected agent_pause: {every: D, for: D}"),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  agent_pause: {every: 10s}\n");
        assert!(e.contains("missing field `for`"), "{e}");
        let e = err(
            "rules:\n- nodes: {all: true}\n  agent_pause: {every: 10s, for: 1s, signal: STOP}\n",
        );
        assert!(
            e.contains("unknown field `signal`") && e.contains("line 3"),
            "{e}"
        );
        // A zero pause is allowed (it does nothing), a distribution for `every` too.
        assert!(FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent_pause: {every: {uniform: [0s, 2s]}, for: 0s}\n"
        )
        .is_ok());
    }

    #[test]
    fn gates_readiness_is_an_agent_key_merged_key_by_key() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent: {gates_readiness: true, not_ready: false}\n\
             - nodes: {names: [node-2]}\n  agent: {gates_readiness: false}\n",
        )
        .unwrap();
        let l = labels(&[]);
        let n1 = f.for_node("node-1", &l, Duration::ZERO).agent;
        assert_eq!(n1.gates_readiness, Some(true));
        let n2 = f.for_node("node-2", &l, Duration::ZERO).agent;
        assert_eq!(n2.gates_readiness, Some(false));
        assert_eq!(n2.not_ready, Some(false), "the other keys stay");
        let e = err("rules:\n- nodes: {all: true}\n  agent: {gates_readiness: maybe}\n");
        assert!(
            e.contains("gates_readiness") || e.contains("boolean"),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  agent: {gates_readyness: true}\n");
        assert!(
            e.contains("unknown field `gates_readyness`") && e.contains("line 3"),
            "{e}"
        );
    }

    #[test]
    fn policies_in_force_is_the_largest_among_rules_in_force_on_any_node() {
        let f = FaultFile::parse(
            "rules:\n\
             - nodes: {names: [node-9]}\n  policies: 100\n\
             - nodes: {labels: {zone: x}}\n  from: 10s\n  until: 20s\n  policies: 500\n\
             - nodes: {all: true}\n  from: 30s\n  policies: 50\n",
        )
        .unwrap();
        let at = |s| f.policies_in_force(Duration::from_secs(s));
        assert_eq!(at(0), 100);
        assert_eq!(at(10), 500);
        assert_eq!(at(19), 500);
        assert_eq!(at(20), 100);
        assert_eq!(at(30), 100, "the largest, not the later rule's 50");
        // Per node, the key resolves like any other.
        let l = labels(&[]);
        assert_eq!(f.for_node("node-1", &l, Duration::ZERO).policies, None);
        assert_eq!(f.for_node("node-9", &l, Duration::ZERO).policies, Some(100));
        assert_eq!(
            f.for_node("node-9", &l, Duration::from_secs(30)).policies,
            Some(50)
        );
        assert_eq!(FaultFile::default().policies_in_force(Duration::ZERO), 0);
        let e = err("rules:\n- nodes: {all: true}\n  policies: -1\n");
        assert!(e.contains("policies") && e.contains("line 3"), "{e}");
        let e = err("rules:\n- nodes: {all: true}\n  policies: many\n");
        assert!(e.contains("policies") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn agent_version_must_be_a_calico_v3_release_and_every_one_is_listed() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent_version: v3.31.7\n\
             - nodes: {names: [node-2]}\n  from: 1m\n  agent_version: v3.30.0\n\
             - nodes: {names: [node-3]}\n  agent_version: v3.31.7\n",
        )
        .unwrap();
        let l = labels(&[]);
        assert_eq!(
            f.for_node("node-2", &l, Duration::ZERO)
                .agent_version
                .as_deref(),
            Some("v3.31.7")
        );
        assert_eq!(
            f.for_node("node-2", &l, Duration::from_secs(60))
                .agent_version
                .as_deref(),
            Some("v3.30.0")
        );
        assert_eq!(
            f.agent_versions(),
            BTreeSet::from(["v3.30.0".to_owned(), "v3.31.7".to_owned()])
        );
        assert!(FaultFile::default().agent_versions().is_empty());
        for bad in [
            "3.31.7",
            "v4.0.1",
            "v3.31",
            "v3.31.x",
            "v3..1",
            "v3.31.7-rc1",
            "latest",
        ] {
            let e = err(&format!(
                "rules:\n- nodes: {{all: true}}\n  agent_version: {bad}\n"
            ));
            assert!(
                e.contains(&format!(
                    "agent_version: expected a Calico release such as v3.31.7 (v3.<minor>.<patch>), got \"{bad}\""
                )) && e.contains("line 3"),
                "{bad}: {e}"
            );
        }
        let e = err("rules:\n- nodes: {all: true}\n  agent_version: 3.31\n");
        assert!(
            e.contains("expected a Calico release such as v3.31.7"),
            "{e}"
        );
    }

    #[test]
    fn new_primitives_serialise_for_the_truth_log() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  agent_io: {fail: 0.25}\n  agent_cpu: {quota: 0.5%}\n  \
             agent_pause: {every: 10s, for: 2s}\n  policies: 200\n  agent_version: v3.31.7\n  \
             agent: {gates_readiness: true}\n",
        )
        .unwrap();
        let v = serde_json::to_value(&f.rules).unwrap();
        assert_eq!(v[0]["agent_io"], serde_json::json!({"fail": 0.25}));
        assert_eq!(v[0]["agent_cpu"], serde_json::json!({"quota": "0.5%"}));
        assert_eq!(
            v[0]["agent_pause"],
            serde_json::json!({"every": "10s", "for": "2s"})
        );
        assert_eq!(v[0]["policies"], 200);
        assert_eq!(v[0]["agent_version"], "v3.31.7");
        assert_eq!(v[0]["agent"], serde_json::json!({"gates_readiness": true}));
        // Rules without them serialise as before.
        let v = serde_json::to_value(
            &FaultFile::parse("rules:\n- nodes: {all: true}\n  program_delay: 1s\n")
                .unwrap()
                .rules,
        )
        .unwrap();
        assert_eq!(
            v[0],
            serde_json::json!({"nodes": "all", "from": null, "until": null, "program_delay": "1s"})
        );
    }

    #[test]
    fn s1_style_files_pass_with_every_agent_and_proxy() {
        for yaml in [
            "rules: []\n",
            "rules:\n  - nodes: {all: true}\n    cross_node: {broken_peers: all}\n",
            "rules:\n- nodes: {all: true}\n  cross_node: {broken_peers: [node-1]}\n  stale_routes: {k: 1, for: 5s}\n  \
             clock_skew: -1m\n  teardown_delay: 2s\n  agent: {restarts: {every: 30s}}\n",
        ] {
            let f = FaultFile::parse(yaml).unwrap();
            for agent in [AgentKind::Simulated, AgentKind::Calico] {
                for proxy in [ProxyKind::Simulated, ProxyKind::Real] {
                    assert!(
                        f.check_components(yaml, agent, proxy).is_ok(),
                        "{agent:?} {proxy:?}: {yaml}"
                    );
                }
            }
        }
    }

    #[test]
    fn simulated_agent_primitives_are_refused_with_real_felix_naming_the_line() {
        let yaml = "rules:\n\
                    \x20 - nodes: {all: true}\n\
                    \x20   cross_node: {broken_peers: all}\n\
                    \x20 - nodes: {names: [node-2]}\n\
                    \x20   from: 10s\n\
                    \x20   # program_delay: 1s, a comment\n\
                    \x20   teardown_delay: 1s\n\
                    \x20   program_delay: {uniform: [1s, 2s]}\n";
        let e = calico_err(yaml);
        assert_eq!(refused_at(&e), (2, 8, "program_delay"));
        assert_eq!(
            e.to_string(),
            "fault file: rule 2 (line 8): `program_delay` does not apply to real Calico Felix: \
             it sets when the simulated agent programs a new endpoint; real Felix programs as \
             fast as it can; on real Felix slow down or break programming with `agent_io`, \
             `agent_cpu`, `agent_pause`, `agent: {restarts}` or `policies`"
        );
        let f = FaultFile::parse(yaml).unwrap();
        assert!(f
            .check_components(yaml, AgentKind::Simulated, ProxyKind::Real)
            .is_ok());
        // Every simulated-agent key, written on line 3, is refused under its own name.
        for (key, snippet) in [
            ("program_delay", "program_delay: 1s"),
            ("resync_loop", "resync_loop: {period: 10s, open: 1s}"),
            ("never_program", "never_program: 0.1"),
            ("queue", "queue: {per_endpoint: 1s}"),
            ("revoke", "revoke: {after: 1s}"),
            ("name_reuse_race", "name_reuse_race: 1"),
            ("first_connections_dropped", "first_connections_dropped: 2"),
            ("agent.not_ready", "agent: {not_ready: true}"),
            (
                "agent.extra_failures_per_second",
                "agent: {extra_failures_per_second: 1}",
            ),
            (
                "agent.extra_resyncs_per_second",
                "agent: {extra_resyncs_per_second: 1}",
            ),
            ("agent.apply_time_floor", "agent: {apply_time_floor: 1s}"),
            (
                "agent.route_resync",
                "agent: {route_resync: {every: 3s, takes: 1s}}",
            ),
            (
                "agent.datastore_resync",
                "agent: {datastore_resync: {every: 3s, takes: 1s}}",
            ),
            ("agent.gates_readiness", "agent: {gates_readiness: true}"),
        ] {
            let yaml = format!("rules:\n- nodes: {{all: true}}\n  {snippet}\n");
            let e = calico_err(&yaml);
            assert_eq!(refused_at(&e), (1, 3, key), "{snippet}");
            assert!(
                e.to_string().starts_with(&format!(
                    "fault file: rule 1 (line 3): `{key}` does not apply to real Calico Felix: "
                )),
                "{e}"
            );
            let f = FaultFile::parse(&yaml).unwrap();
            assert!(f
                .check_components(&yaml, AgentKind::Simulated, ProxyKind::Simulated)
                .is_ok());
        }
        assert!(
            calico_err("rules:\n- nodes: {all: true}\n  agent: {gates_readiness: true}\n")
                .to_string()
                .ends_with("until the endpoint is programmed); remove the key")
        );
    }

    #[test]
    fn refused_keys_in_flow_mappings_report_their_own_line() {
        let yaml = "rules:\n\
                    - nodes: {all: true}\n\
                    \x20 agent: {restarts: {every: 30s}}\n\
                    - nodes: {labels: {zone: b}}\n\
                    \x20 agent: {restarts: {every: 1m},\n\
                    \x20         gates_readiness: true}\n";
        assert_eq!(
            refused_at(&calico_err(yaml)),
            (2, 6, "agent.gates_readiness")
        );
        // Several in one rule: the first in the file, not in declaration order.
        let yaml =
            "rules:\n- nodes: {all: true}\n  queue: {per_endpoint: 1s}\n  program_delay: 1s\n";
        assert_eq!(refused_at(&calico_err(yaml)), (1, 3, "queue"));
        let yaml = "rules:\n- nodes: {all: true}\n  agent: {restarts: {every: 1m}, apply_time_floor: 1s, not_ready: true}\n";
        assert_eq!(
            refused_at(&calico_err(yaml)),
            (1, 3, "agent.apply_time_floor")
        );
        // Quoted keys and block-style agent keys.
        let yaml = "rules:\n- nodes: {all: true}\n  agent:\n    restarts: {every: 1m}\n    \"not_ready\": true\n";
        assert_eq!(refused_at(&calico_err(yaml)), (1, 5, "agent.not_ready"));
        // Flow-style rules have no line per rule: the `rules:` line.
        let yaml = "# faults\nrules: [{nodes: {all: true}, queue: {per_endpoint: 1s}}]\n";
        assert_eq!(refused_at(&calico_err(yaml)), (1, 2, "queue"));
    }

    #[test]
    fn real_felix_primitives_are_refused_with_the_simulated_agent() {
        let yaml = "rules:\n\
                    \x20 - nodes:\n\
                    \x20     names:\n\
                    \x20       - node-1\n\
                    \x20   clock_skew: 5s\n\
                    \x20 - nodes: {all: true}\n\
                    \x20   agent: {restarts: {every: 1m}}\n\
                    \x20   policies: 10\n\
                    \x20   agent_version: v3.31.7\n";
        let e = simulated_err(yaml);
        assert_eq!(refused_at(&e), (2, 8, "policies"));
        assert_eq!(
            e.to_string(),
            "fault file: rule 2 (line 8): `policies` does not apply to the simulated agent: it \
             loads the real Felix with NetworkPolicies to compute; the simulated agent \
             enforces policies, but its cost does not grow with policies that select \
             nothing; run `testbed up --control-plane real --agent calico`, or with the \
             simulated agent use `queue`"
        );
        let f = FaultFile::parse(yaml).unwrap();
        assert!(f
            .check_components(yaml, AgentKind::Calico, ProxyKind::Real)
            .is_ok());
        for (key, snippet) in [
            ("agent_io", "agent_io: {delay: 1s}"),
            ("agent_cpu", "agent_cpu: {quota: 2%}"),
            ("agent_pause", "agent_pause: {every: 10s, for: 1s}"),
            ("policies", "policies: 100"),
            ("agent_version", "agent_version: v3.31.7"),
        ] {
            let yaml = format!("rules:\n- nodes: {{all: true}}\n  from: 1s\n  {snippet}\n");
            let e = simulated_err(&yaml);
            assert_eq!(refused_at(&e), (1, 4, key), "{snippet}");
            let s = e.to_string();
            assert!(
                s.starts_with(&format!(
                    "fault file: rule 1 (line 4): `{key}` does not apply to the simulated agent: "
                )) && s.contains("run `testbed up --control-plane real --agent calico`"),
                "{s}"
            );
            let f = FaultFile::parse(&yaml).unwrap();
            assert!(f
                .check_components(&yaml, AgentKind::Calico, ProxyKind::Simulated)
                .is_ok());
        }
    }

    #[test]
    fn service_delay_is_refused_only_with_the_real_kube_proxy() {
        let yaml = "rules:\n- nodes: {all: true}\n  teardown_delay: 1s\n- nodes: {all: true}\n  service_delay: 2s\n";
        let f = FaultFile::parse(yaml).unwrap();
        for agent in [AgentKind::Simulated, AgentKind::Calico] {
            assert!(f
                .check_components(yaml, agent, ProxyKind::Simulated)
                .is_ok());
            let e = f
                .check_components(yaml, agent, ProxyKind::Real)
                .unwrap_err();
            assert_eq!(refused_at(&e), (2, 5, "service_delay"));
            assert_eq!(
                e.to_string(),
                "fault file: rule 2 (line 5): `service_delay` does not apply to real \
                 kube-proxy: it delays the simulated kube-proxy's rule sync; the real \
                 kube-proxy syncs when it does; drop `--kube-proxy real` to use it"
            );
        }
    }

    #[test]
    fn rules_are_checked_in_file_order() {
        // Rule 1 is refused with real Felix, rule 2 with the simulated agent.
        let yaml = "rules:\n- nodes: {all: true}\n  revoke: {after: 1s}\n- nodes: {all: true}\n  agent_cpu: {quota: 1%}\n";
        assert_eq!(refused_at(&calico_err(yaml)), (1, 3, "revoke"));
        assert_eq!(refused_at(&simulated_err(yaml)), (2, 5, "agent_cpu"));
    }

    #[test]
    fn policy_primitives_parse_resolve_per_node_and_plan_changes() {
        let yaml = "rules:\n\
                    - nodes: {all: true}\n\
                    \x20 policy_delay: {uniform: [1s, 2s]}\n\
                    - nodes: {names: [node-2]}\n\
                    \x20 from: 10s\n\
                    \x20 policy_delay: 2s\n\
                    \x20 policy_never: 1\n\
                    \x20 isolation_lag: {lognormal: {median: 1s, p99: 5s}}\n";
        let f = FaultFile::parse(yaml).unwrap();
        let none = BTreeMap::new();
        let n1 = f.for_node("node-1", &none, Duration::from_secs(20));
        assert_eq!(
            n1.policy_delay,
            Some(DurationDist::Uniform(
                Duration::from_secs(1),
                Duration::from_secs(2)
            ))
        );
        assert_eq!((n1.policy_never, n1.isolation_lag), (None, None));
        let n2 = f.for_node("node-2", &none, Duration::from_secs(20));
        assert_eq!(
            n2.policy_delay,
            Some(DurationDist::Fixed(Duration::from_secs(2)))
        );
        assert_eq!(n2.policy_never, Some(Probability(1.0)));
        assert!(matches!(
            n2.isolation_lag,
            Some(DurationDist::Lognormal { .. })
        ));
        let early = f.for_node("node-2", &none, Duration::from_secs(1));
        assert_eq!(early.policy_never, None, "from: 10s");
        let mut rng = rand::rng();
        // policy_never: new admissions only; every other change gets the delay.
        assert_eq!(n2.plan_policy_change(true, &mut rng), None);
        assert_eq!(
            n2.plan_policy_change(false, &mut rng),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            NodeFaults::default().plan_policy_change(true, &mut rng),
            Some(Duration::ZERO)
        );
        let d = n1.plan_policy_change(true, &mut rng).unwrap();
        assert!((Duration::from_secs(1)..=Duration::from_secs(2)).contains(&d));
        // Same error style as every primitive: bad values and unknown keys name the line.
        let e = err("rules:\n- nodes: {all: true}\n  policy_never: 1.5\n");
        assert!(e.contains("line 3"), "{e}");
        let e = err("rules:\n- nodes: {all: true}\n  isolation_lag: {uniform: [2s]}\n");
        assert!(e.contains("line 3"), "{e}");
        let e = err("rules:\n- nodes: {all: true}\n  policy_delays: 1s\n");
        assert!(
            e.contains("unknown field `policy_delays`") && e.contains("line 3"),
            "{e}"
        );
    }

    #[test]
    fn policy_primitives_are_refused_with_real_felix_and_kept_with_real_kubelets() {
        for (key, snippet) in [
            ("policy_delay", "policy_delay: 1s"),
            ("policy_never", "policy_never: 0.5"),
            ("isolation_lag", "isolation_lag: {uniform: [1s, 3s]}"),
        ] {
            let yaml =
                format!("rules:\n- nodes: {{all: true}}\n  teardown_delay: 1s\n  {snippet}\n");
            let e = calico_err(&yaml);
            assert_eq!(refused_at(&e), (1, 4, key), "{snippet}");
            let text = e.to_string();
            assert!(
                text.starts_with(&format!(
                    "fault file: rule 1 (line 4): `{key}` does not apply to real Calico Felix: "
                )) && text.ends_with(ON_REAL_FELIX),
                "{text}"
            );
            let f = FaultFile::parse(&yaml).unwrap();
            for proxy in [ProxyKind::Simulated, ProxyKind::Real] {
                f.check_components(&yaml, AgentKind::Simulated, proxy)
                    .unwrap();
            }
            // The simulated agent enforces policy on real kubelets' pods too.
            f.check_kubelet(&yaml, KubeletKind::Real, AgentKind::Simulated)
                .unwrap();
        }
    }

    #[test]
    fn mtu_primitives_take_bytes_within_bounds_and_name_line_and_key() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  encap_mtu: 1450\n  link_mtu: 576\n\
             - nodes: {names: [node-2]}\n  encap_mtu: 9000\n",
        )
        .unwrap();
        let l = labels(&[]);
        let n1 = f.for_node("node-1", &l, Duration::ZERO);
        assert_eq!((n1.encap_mtu, n1.link_mtu), (Some(1450), Some(576)));
        // A later rule overrides key by key: node-2's encap_mtu, node-1's link_mtu stays.
        let n2 = f.for_node("node-2", &l, Duration::ZERO);
        assert_eq!((n2.encap_mtu, n2.link_mtu), (Some(9000), Some(576)));
        for key in ["encap_mtu", "link_mtu"] {
            for bad in [
                "575", "9001", "0", "-1500", "1400.5", "1400b", "\"1500\"", "big",
            ] {
                let e = err(&format!(
                    "rules:\n- nodes: {{all: true}}\n  teardown_delay: 1s\n  {key}: {bad}\n"
                ));
                assert!(
                    e.contains(&format!(
                        "{key} must be an integer number of bytes between 576 and 9000, got"
                    )) && e.contains("line 4"),
                    "{key}: {bad}: {e}"
                );
            }
            let e = err(&format!(
                "rules:\n- nodes: {{all: true}}\n  {key}: [1400]\n"
            ));
            assert!(e.contains(key) && e.contains("line 3"), "{e}");
        }
    }

    #[test]
    fn proto_drop_parses_protocols_defaults_cross_node_and_refuses_the_unknown() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {all: true}\n  proto_drop: {protocols: [udp]}\n\
             - nodes: {names: [node-2]}\n  proto_drop: {protocols: [icmp, tcp, icmp], cross_node: false}\n",
        )
        .unwrap();
        let l = labels(&[]);
        assert_eq!(
            f.for_node("node-1", &l, Duration::ZERO).proto_drop,
            Some(ProtoDrop {
                protocols: [DropProtocol::Udp].into(),
                cross_node: true,
            }),
            "cross_node defaults to true"
        );
        // A later rule's proto_drop replaces the earlier one as a whole.
        assert_eq!(
            f.for_node("node-2", &l, Duration::ZERO).proto_drop,
            Some(ProtoDrop {
                protocols: [DropProtocol::Tcp, DropProtocol::Icmp].into(),
                cross_node: false,
            })
        );
        let e = err("rules:\n- nodes: {all: true}\n  proto_drop: {protocols: [udp, sctp]}\n");
        assert!(
            e.contains("proto_drop.protocols: unknown protocol `sctp` (expected udp, tcp or icmp)")
                && e.contains("line 3"),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  proto_drop: {protocols: []}\n");
        assert!(
            e.contains("proto_drop.protocols: give at least one of udp, tcp, icmp")
                && e.contains("line 3"),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  proto_drop: {cross_node: false}\n");
        assert!(e.contains("missing field `protocols`"), "{e}");
        let e =
            err("rules:\n- nodes: {all: true}\n  proto_drop: {protocols: [tcp], ports: [53]}\n");
        assert!(
            e.contains("unknown field `ports`") && e.contains("line 3"),
            "{e}"
        );
        let e = err("rules:\n- nodes: {all: true}\n  proto_drop: udp\n");
        assert!(e.contains("expected proto_drop: {protocols"), "{e}");
        let e = err(
            "rules:\n- nodes: {all: true}\n  proto_drop: {protocols: [udp], cross_node: maybe}\n",
        );
        assert!(e.contains("line 3"), "{e}");
    }

    #[test]
    fn network_primitives_are_node_wide_in_their_window_and_serialise() {
        let f = FaultFile::parse(
            "rules:\n- nodes: {names: [node-1]}\n  from: 10s\n  until: 20s\n  link_mtu: 1400\n  \
             encap_mtu: 1450\n  proto_drop: {protocols: [udp, tcp]}\n",
        )
        .unwrap();
        let l = labels(&[]);
        assert!(f.for_node("node-1", &l, Duration::from_secs(9)).is_empty());
        let on = f.for_node("node-1", &l, Duration::from_secs(10));
        assert_eq!((on.link_mtu, on.encap_mtu), (Some(1400), Some(1450)));
        assert!(on.proto_drop.is_some());
        assert!(f.for_node("node-1", &l, Duration::from_secs(20)).is_empty());
        assert!(f.for_node("node-2", &l, Duration::from_secs(15)).is_empty());
        assert_eq!(
            f.boundaries("node-1", &l),
            [Duration::from_secs(10), Duration::from_secs(20)]
        );
        let v = serde_json::to_value(&f.rules).unwrap();
        assert_eq!(v[0]["link_mtu"], 1400);
        assert_eq!(v[0]["encap_mtu"], 1450);
        assert_eq!(
            v[0]["proto_drop"],
            serde_json::json!({"protocols": ["tcp", "udp"], "cross_node": true})
        );
    }

    /// They act on the node's link and its forward path, beside whatever the agent
    /// programs: every agent, service proxy and kubelet.
    #[test]
    fn network_primitives_apply_with_every_agent_proxy_and_kubelet() {
        let yaml = "rules:\n- nodes: {all: true}\n  link_mtu: 1400\n  encap_mtu: 1450\n  \
                    proto_drop: {protocols: [udp], cross_node: false}\n";
        let f = FaultFile::parse(yaml).unwrap();
        for agent in [AgentKind::Simulated, AgentKind::Calico] {
            for proxy in [ProxyKind::Simulated, ProxyKind::Real] {
                f.check_components(yaml, agent, proxy).unwrap();
            }
            for kubelet in [KubeletKind::Simulated, KubeletKind::Real] {
                f.check_kubelet(yaml, kubelet, agent).unwrap();
            }
        }
        for key in ["link_mtu", "encap_mtu", "proto_drop"] {
            assert!(PRIMITIVE_KEYS.contains(&key), "{key}");
        }
        assert!(PRIMITIVE_KEYS.contains(&"agent") && PRIMITIVE_KEYS.contains(&"cross_node"));
    }

    #[test]
    fn family_broken_parses_and_ipv6_is_refused_on_an_ipv4_only_testbed() {
        let yaml = "rules:\n- nodes: {all: true}\n  program_delay: 1s\n- nodes: {names: [node-1]}\n  until: 2s\n  family_broken: ipv6\n";
        let f = FaultFile::parse(yaml).unwrap();
        let nf = f.for_node("node-1", &BTreeMap::new(), Duration::ZERO);
        assert_eq!(nf.family_broken, Some(IpFamily::Ipv6));
        assert_eq!(
            f.for_node("node-2", &BTreeMap::new(), Duration::ZERO)
                .family_broken,
            None
        );
        assert_eq!(
            f.for_node("node-1", &BTreeMap::new(), Duration::from_secs(2))
                .family_broken,
            None,
            "until"
        );
        f.check_families(yaml, true).unwrap();
        let e = f.check_families(yaml, false).unwrap_err().to_string();
        assert!(
            e.contains("rule 2 (line 6): `family_broken` does not apply to an IPv4-only testbed")
                && e.contains("--ip-families ipv4,ipv6"),
            "{e}"
        );
        let v4 = "rules:\n- nodes: {all: true}\n  family_broken: ipv4\n";
        FaultFile::parse(v4)
            .unwrap()
            .check_families(v4, false)
            .unwrap();
        let e = err("rules:\n- nodes: {all: true}\n  family_broken: ipv5\n");
        assert!(e.contains("ipv5") && e.contains("line 3"), "{e}");
        assert!(PRIMITIVE_KEYS.contains(&"family_broken"));
    }
}
