//! Node-pair choice for every probe kind (docs/design.md §2 step 1 and "Kinds"). Pure: takes
//! Node data, returns a plan; no I/O.
//!
//! Eligibility follows what the Kubernetes scheduler itself would accept for a probe pod:
//! the Node's `Ready` condition is `True`, `spec.unschedulable` is not set (cordoned,
//! <https://kubernetes.io/docs/concepts/architecture/nodes/#manual-node-administration>),
//! its labels match `--node-selector` (label-selector syntax,
//! <https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors>),
//! and every `NoSchedule`/`NoExecute` taint is tolerated by a `--toleration`
//! (matching rules of `ToleratesTaint`, k8s.io/api `core/v1/toleration.go`).
//!
//! The plan is a shuffled ring (seeded, reproducible): pair `k` has
//! `source = order[k % n]` and `target = order[(k + 1 + (k / n) % (n - 1)) % n]`, so each
//! lap of `n` pairs uses every node once as source and once as target, and later laps
//! shift the target offset so new pairs get exercised.
//!
//! [`plan_kinds`] runs each requested kind over that ring: `cross_node`, `recreate` and
//! `burst` use the ring pairs (source ≠ target), `same_node` pins both pods of probe `k`
//! to `order[k % n]`. The other kinds follow one another in the order given, and the
//! `same_node` controls are woven into them, one control then two other probes
//! ([`CONTROL_EVERY`]): `s0, x0, x1, s1, x2, x3, s2, …` (leftovers of either at the end).
//! The early-stop rule (`gate::early_stop`) needs both a passing control and two silent
//! cross-node pairs with no node in common: started together, they are there after one
//! give-up period, where controls all first would add their whole run before the first
//! cross-node pair (at `--concurrency 2` on 6 nodes, a second give-up period). Inside a
//! lap the ring pairs are started even positions first (`0, 2, 4, …, 1, 3, …`): with an
//! even node count the first `n/2` pairs share no node, so the pairs in flight together
//! fail or pass independently (and `x0`, `x1` above are two such pairs).

use crate::kind::ProbeKind;
use k8s_openapi::api::core::v1::{Node, Toleration};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One requirement of an equality-based label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the label is absent, as in Kubernetes).
    NotEquals(String, String),
    /// `key`: the label exists.
    Exists(String),
    /// `!key`: the label does not exist.
    NotExists(String),
}

/// A label selector in Kubernetes' equality-based syntax, comma-separated
/// (`kubernetes.io/os=linux,pool!=gpu`). Set-based forms (`in (…)`) are rejected with
/// an error. An empty string selects every node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSelector {
    /// All requirements must hold (AND).
    pub requirements: Vec<Requirement>,
}

impl NodeSelector {
    /// True when every requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

impl FromStr for NodeSelector {
    type Err = String;

    /// Parses `k=v[,k==v][,k!=v][,k][,!k]`; errors name the offending term.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut requirements = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if term.contains('(') || term.contains(' ') {
                return Err(format!(
                    "'{term}': only equality-based selectors (k=v, k!=v, k, !k) are supported"
                ));
            }
            let req = if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(k.to_string(), v.to_string())
            } else if let Some((k, v)) = term.split_once("==") {
                Requirement::Equals(k.to_string(), v.to_string())
            } else if let Some((k, v)) = term.split_once('=') {
                Requirement::Equals(k.to_string(), v.to_string())
            } else if let Some(k) = term.strip_prefix('!') {
                Requirement::NotExists(k.to_string())
            } else {
                Requirement::Exists(term.to_string())
            };
            let key = match &req {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if key.is_empty() || key.contains('=') || key.contains('!') {
                return Err(format!("'{term}': empty or malformed label key"));
            }
            requirements.push(req);
        }
        Ok(NodeSelector { requirements })
    }
}

impl fmt::Display for NodeSelector {
    /// The canonical selector string, as sent in `labelSelector=`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::Equals(k, v) => format!("{k}={v}"),
                Requirement::NotEquals(k, v) => format!("{k}!={v}"),
                Requirement::Exists(k) => k.clone(),
                Requirement::NotExists(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Taint effects (core/v1 `TaintEffect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintEffect {
    /// New pods are not scheduled.
    NoSchedule,
    /// The scheduler avoids the node (ignored by eligibility).
    PreferNoSchedule,
    /// Running pods are evicted and new ones not scheduled.
    NoExecute,
}

impl TaintEffect {
    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

impl FromStr for TaintEffect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "NoSchedule" => Ok(TaintEffect::NoSchedule),
            "PreferNoSchedule" => Ok(TaintEffect::PreferNoSchedule),
            "NoExecute" => Ok(TaintEffect::NoExecute),
            other => Err(format!(
                "unknown taint effect '{other}' (NoSchedule, PreferNoSchedule, NoExecute)"
            )),
        }
    }
}

/// A `--toleration` value: `key[=value]:Effect`, `key:Effect`, or without `:Effect`
/// (tolerates every effect, like a Kubernetes toleration with an empty effect).
/// With `=value` the operator is `Equal`, otherwise `Exists`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TolerationSpec {
    /// Taint key (non-empty).
    pub key: String,
    /// `Some` → operator `Equal`; `None` → operator `Exists`.
    pub value: Option<String>,
    /// `None` → every effect.
    pub effect: Option<TaintEffect>,
}

impl FromStr for TolerationSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kv, effect) = match s.rsplit_once(':') {
            Some((kv, eff)) => (kv, Some(eff.parse::<TaintEffect>()?)),
            None => (s, None),
        };
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        if key.is_empty() {
            return Err(format!("'{s}': empty key (expected key[=value]:Effect)"));
        }
        if let Err(why) = qualified_name(key) {
            return Err(format!(
                "'{s}': key '{key}' is not a valid taint key ({why}; expected key[=value]:Effect)"
            ));
        }
        if let Some(v) = value.as_deref().filter(|v| !label_value_ok(v)) {
            return Err(format!(
                "'{s}': value '{v}' is not a valid taint value (up to 63 characters \
                 [A-Za-z0-9._-], starting and ending alphanumeric)"
            ));
        }
        Ok(TolerationSpec {
            key: key.to_string(),
            value,
            effect,
        })
    }
}

/// A Kubernetes label value (`IsValidLabelValue`, k8s.io/apimachinery
/// `pkg/util/validation`): empty, or up to 63 characters of `[A-Za-z0-9._-]` that start
/// and end alphanumeric. Taint keys' name part and taint values follow it.
fn label_value_ok(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// A qualified name (`IsQualifiedName`, k8s.io/apimachinery `pkg/util/validation`,
/// what a taint key must be): `[prefix/]name`, `name` a non-empty label value, `prefix`
/// a DNS subdomain (lowercase alphanumerics, `-` and `.`, up to 253 characters).
fn qualified_name(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() || !label_value_ok(name) {
        return Err(
            "its name part must be 1–63 characters [A-Za-z0-9._-], alphanumeric at both ends",
        );
    }
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err("its prefix must be a DNS subdomain");
        }
    }
    Ok(())
}

/// The tolerations that tolerate no taint of any of `nodes` (issue 31: a mistyped
/// `--toleration foo` was accepted and silently did nothing). They are legal — a
/// toleration may be given ahead of a taint — so the caller warns rather than refuses.
pub fn unmatched_tolerations<'a>(
    nodes: &[NodeInfo],
    tolerations: &'a [TolerationSpec],
) -> Vec<&'a TolerationSpec> {
    tolerations
        .iter()
        .filter(|tol| {
            !nodes
                .iter()
                .flat_map(|n| &n.taints)
                .any(|t| tol.tolerates(t))
        })
        .collect()
}

impl fmt::Display for TolerationSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)?;
        if let Some(v) = &self.value {
            write!(f, "={v}")?;
        }
        if let Some(e) = self.effect {
            write!(f, ":{}", e.as_str())?;
        }
        Ok(())
    }
}

impl TolerationSpec {
    /// Whether this toleration tolerates a taint (`ToleratesTaint` in k8s.io/api
    /// `core/v1/toleration.go`: effect must match unless empty; key must match;
    /// `Exists` ignores the value, `Equal` compares it).
    pub fn tolerates(&self, taint: &NodeTaint) -> bool {
        if let Some(e) = self.effect {
            if e.as_str() != taint.effect {
                return false;
            }
        }
        if self.key != taint.key {
            return false;
        }
        match &self.value {
            None => true,
            Some(v) => v == taint.value.as_deref().unwrap_or(""),
        }
    }

    /// The pod-spec toleration.
    pub fn to_k8s(&self) -> Toleration {
        Toleration {
            key: Some(self.key.clone()),
            operator: Some(
                if self.value.is_some() {
                    "Equal"
                } else {
                    "Exists"
                }
                .to_string(),
            ),
            value: self.value.clone(),
            effect: self.effect.map(|e| e.as_str().to_string()),
            toleration_seconds: None,
        }
    }
}

/// A Node taint as found in `spec.taints`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTaint {
    /// Taint key.
    pub key: String,
    /// Taint value (often absent).
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// What the planner needs of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `Ready` condition is `True`.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `spec.taints`.
    pub taints: Vec<NodeTaint>,
}

impl NodeInfo {
    /// Extracts the planner's view of a Node object.
    pub fn from_node(node: &Node) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            .unwrap_or(false);
        let spec = node.spec.as_ref();
        let unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
        let taints = spec
            .and_then(|s| s.taints.as_ref())
            .map(|ts| {
                ts.iter()
                    .map(|t| NodeTaint {
                        key: t.key.clone(),
                        value: t.value.clone(),
                        effect: t.effect.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        NodeInfo {
            name,
            labels,
            ready,
            unschedulable,
            taints,
        }
    }
}

/// Why a node was left out of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// `Ready` condition not `True`.
    NotReady,
    /// `spec.unschedulable: true`.
    Cordoned,
    /// Labels do not match `--node-selector`.
    SelectorMismatch,
    /// A `NoSchedule`/`NoExecute` taint no `--toleration` tolerates.
    UntoleratedTaint(String),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NotReady => f.write_str("not Ready"),
            SkipReason::Cordoned => f.write_str("cordoned"),
            SkipReason::SelectorMismatch => f.write_str("does not match --node-selector"),
            SkipReason::UntoleratedTaint(t) => write!(f, "untolerated taint {t}"),
        }
    }
}

/// Checks one node; `Ok(())` if probe pods can go there.
pub fn check_node(
    node: &NodeInfo,
    selector: &NodeSelector,
    tolerations: &[TolerationSpec],
) -> Result<(), SkipReason> {
    if !node.ready {
        return Err(SkipReason::NotReady);
    }
    if node.unschedulable {
        return Err(SkipReason::Cordoned);
    }
    if !selector.matches(&node.labels) {
        return Err(SkipReason::SelectorMismatch);
    }
    for t in &node.taints {
        if t.effect != "NoSchedule" && t.effect != "NoExecute" {
            continue;
        }
        if !tolerations.iter().any(|tol| tol.tolerates(t)) {
            let v = t
                .value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default();
            return Err(SkipReason::UntoleratedTaint(format!(
                "{}{}:{}",
                t.key, v, t.effect
            )));
        }
    }
    Ok(())
}

/// Splits nodes into eligible ones (sorted by name) and skipped ones with the reason.
pub fn filter_nodes(
    nodes: &[NodeInfo],
    selector: &NodeSelector,
    tolerations: &[TolerationSpec],
) -> (Vec<NodeInfo>, Vec<(String, SkipReason)>) {
    let mut eligible = Vec::new();
    let mut skipped = Vec::new();
    for n in nodes {
        match check_node(n, selector, tolerations) {
            Ok(()) => eligible.push(n.clone()),
            Err(r) => skipped.push((n.name.clone(), r)),
        }
    }
    eligible.sort_by(|a, b| a.name.cmp(&b.name));
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    (eligible, skipped)
}

/// One planned probe: 0-based index, source node (A) and target node (B).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPair {
    /// Position in the plan, 0-based.
    pub index: usize,
    /// Node of the source pod S.
    pub source: String,
    /// Node of the target pod T (≠ source).
    pub target: String,
}

/// Plans `pairs` cross-node pairs over `nodes` (names; order irrelevant: they are sorted,
/// then shuffled with `StdRng::seed_from_u64(seed)`, so the same seed and node set give
/// the same plan). Returns `None` when fewer than 2 nodes are given.
pub fn plan_ring(nodes: &[String], pairs: usize, seed: u64) -> Option<Vec<PlannedPair>> {
    let n = nodes.len();
    if n < 2 {
        return None;
    }
    let mut order: Vec<String> = nodes.to_vec();
    order.sort();
    order.dedup();
    let n = order.len();
    if n < 2 {
        return None;
    }
    let mut rng = StdRng::seed_from_u64(seed);
    order.shuffle(&mut rng);
    Some(
        (0..pairs)
            .map(|k| {
                let offset = 1 + (k / n) % (n - 1);
                PlannedPair {
                    index: k,
                    source: order[k % n].clone(),
                    target: order[(k + offset) % n].clone(),
                }
            })
            .collect(),
    )
}

/// One planned probe of any kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedProbe {
    /// Position in the whole plan, 0-based (probe ids use it).
    pub index: usize,
    /// Kind of probe.
    pub kind: ProbeKind,
    /// Node of the source pod S.
    pub source: String,
    /// Node of the target pod T (= `source` for `same_node`).
    pub target: String,
    /// `recreate` only: a later probe of this plan recreates the same stable-name
    /// target, so this probe leaves its target running for it (StatefulSet style)
    /// instead of deleting it.
    pub keep_target: bool,
}

/// Even positions of a lap first, then odd ones (`0, 2, 4, …, 1, 3, 5, …`), per lap of
/// `n`: the order in which ring pairs are started.
fn lap_order(count: usize, n: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(count);
    let mut lap_start = 0;
    while lap_start < count {
        let lap_end = (lap_start + n).min(count);
        out.extend((lap_start..lap_end).filter(|k| (k - lap_start) % 2 == 0));
        out.extend((lap_start..lap_end).filter(|k| (k - lap_start) % 2 == 1));
        lap_start = lap_end;
    }
    out
}

/// Plans `per_kind` probes of each kind in `kinds` over `nodes` (names), seeded like
/// [`plan_ring`] (same seed + node set → same plan).
///
/// Returns `None` when the kinds need more nodes than given: 1 for `same_node` alone,
/// 2 as soon as any other kind is asked for. Duplicate kinds are planned once.
/// `service` is planned like `cross_node` (a ring pair; its Service adds no node).
pub fn plan_kinds(
    nodes: &[String],
    kinds: &[ProbeKind],
    per_kind: usize,
    seed: u64,
) -> Option<Vec<PlannedProbe>> {
    let mut order: Vec<String> = nodes.to_vec();
    order.sort();
    order.dedup();
    let n = order.len();
    let needs_two = kinds.iter().any(|k| *k != ProbeKind::SameNode);
    if n == 0 || (needs_two && n < 2) || kinds.is_empty() {
        return None;
    }
    let mut sorted_kinds: Vec<ProbeKind> = Vec::new();
    if kinds.contains(&ProbeKind::SameNode) {
        sorted_kinds.push(ProbeKind::SameNode);
    }
    for k in kinds {
        if !sorted_kinds.contains(k) {
            sorted_kinds.push(*k);
        }
    }
    let mut rng = StdRng::seed_from_u64(seed);
    order.shuffle(&mut rng);
    let ring: Option<Vec<PlannedPair>> = (n >= 2).then(|| {
        (0..per_kind)
            .map(|k| {
                let offset = 1 + (k / n) % (n - 1);
                PlannedPair {
                    index: k,
                    source: order[k % n].clone(),
                    target: order[(k + offset) % n].clone(),
                }
            })
            .collect()
    });
    let mut out: Vec<PlannedProbe> = Vec::new();
    let mut controls: Vec<PlannedProbe> = Vec::new();
    for kind in sorted_kinds {
        if kind == ProbeKind::SameNode {
            for k in 0..per_kind {
                let node = order[k % n].clone();
                controls.push(PlannedProbe {
                    index: 0,
                    kind,
                    source: node.clone(),
                    target: node,
                    keep_target: false,
                });
            }
            continue;
        }
        let first = out.len();
        let ring = ring.as_ref()?;
        for k in lap_order(per_kind, n) {
            out.push(PlannedProbe {
                index: 0,
                kind,
                source: ring[k].source.clone(),
                target: ring[k].target.clone(),
                keep_target: false,
            });
        }
        if kind == ProbeKind::Recreate {
            for i in first..out.len() {
                let later = out[i + 1..].iter().any(|p| p.target == out[i].target);
                out[i].keep_target = later;
            }
        }
    }
    let mut out = weave(controls, out, CONTROL_EVERY);
    for (i, p) in out.iter_mut().enumerate() {
        p.index = i;
    }
    Some(out)
}

/// The nodes a planned probe uses, sorted by name, each with whether it needs the node
/// to itself: a `burst` probe claims its target's node exclusively (its filler pods
/// start there, and a probe sharing the node would measure that backlog instead of its
/// own, or add to the burst's), every other use is shared. The gate takes these claims
/// (in this order, so no two probes wait on each other) before a probe starts and
/// keeps them until it has ended. Pure.
pub fn node_claims(p: &PlannedProbe) -> Vec<(String, bool)> {
    let exclusive_target = p.kind == ProbeKind::Burst;
    let mut claims = vec![(p.target.clone(), exclusive_target)];
    if p.source != p.target {
        claims.push((p.source.clone(), false));
    }
    claims.sort();
    claims
}

/// Other probes planned after each `same_node` control in [`plan_kinds`] (module docs).
pub const CONTROL_EVERY: usize = 2;

/// `controls` woven into `others`: one control, then `every` others, and so on; what
/// is left of either goes at the end, in order.
fn weave(
    controls: Vec<PlannedProbe>,
    others: Vec<PlannedProbe>,
    every: usize,
) -> Vec<PlannedProbe> {
    let mut out = Vec::with_capacity(controls.len() + others.len());
    let mut others = others.into_iter();
    for c in controls {
        out.push(c);
        out.extend(others.by_ref().take(every));
    }
    out.extend(others);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn same_node_controls_are_woven_among_the_cross_node_pairs_and_pin_both_pods() {
        let kinds = [ProbeKind::CrossNode, ProbeKind::SameNode];
        let plan = plan_kinds(&names(4), &kinds, 4, 3).expect("plan");
        assert_eq!(plan.len(), 8);
        let pattern: Vec<bool> = plan.iter().map(|p| p.kind == ProbeKind::SameNode).collect();
        assert_eq!(
            pattern,
            [true, false, false, true, false, false, true, true],
            "control, two pairs, control, two pairs, leftover controls"
        );
        let (same, cross): (Vec<_>, Vec<_>) =
            plan.iter().partition(|p| p.kind == ProbeKind::SameNode);
        assert!(same.iter().all(|p| p.source == p.target));
        let nodes: BTreeSet<_> = same.iter().map(|p| p.source.clone()).collect();
        assert_eq!(nodes.len(), 4, "every node gets a control pair");
        assert!(cross.iter().all(|p| p.source != p.target));
        // The two pairs next to the first control share no node (early-stop evidence).
        let first_two: BTreeSet<_> = [&plan[1], &plan[2]]
            .iter()
            .flat_map(|p| [p.source.clone(), p.target.clone()])
            .collect();
        assert_eq!(first_two.len(), 4);
        let idx: Vec<usize> = plan.iter().map(|p| p.index).collect();
        assert_eq!(idx, (0..8).collect::<Vec<_>>());
        // Cross-node pairs keep their own order (lap order) once the controls are out.
        let alone = plan_kinds(&names(4), &[ProbeKind::CrossNode], 4, 3).expect("plan");
        let pairs = |v: &[&PlannedProbe]| -> Vec<(String, String)> {
            v.iter()
                .map(|p| (p.source.clone(), p.target.clone()))
                .collect()
        };
        assert_eq!(pairs(&cross), pairs(&alone.iter().collect::<Vec<_>>()));
    }

    #[test]
    fn a_burst_claims_its_target_node_alone_and_every_other_use_is_shared() {
        let p = |kind, source: &str, target: &str| PlannedProbe {
            index: 0,
            kind,
            source: source.into(),
            target: target.into(),
            keep_target: false,
        };
        let c = |v: &[(&str, bool)]| -> Vec<(String, bool)> {
            v.iter().map(|(n, x)| (n.to_string(), *x)).collect()
        };
        assert_eq!(
            node_claims(&p(ProbeKind::Burst, "n3", "n1")),
            c(&[("n1", true), ("n3", false)])
        );
        assert_eq!(
            node_claims(&p(ProbeKind::CrossNode, "n3", "n1")),
            c(&[("n1", false), ("n3", false)])
        );
        assert_eq!(
            node_claims(&p(ProbeKind::SameNode, "n2", "n2")),
            c(&[("n2", false)])
        );
    }

    #[test]
    fn weave_puts_leftovers_at_the_end() {
        let p = |kind| PlannedProbe {
            index: 0,
            kind,
            source: "a".into(),
            target: "b".into(),
            keep_target: false,
        };
        let k = |v: &[PlannedProbe]| {
            v.iter()
                .map(|p| p.kind == ProbeKind::SameNode)
                .collect::<Vec<_>>()
        };
        let w = weave(
            vec![p(ProbeKind::SameNode)],
            vec![p(ProbeKind::CrossNode); 4],
            2,
        );
        assert_eq!(k(&w), [true, false, false, false, false]);
        let w = weave(vec![p(ProbeKind::SameNode); 2], vec![], 2);
        assert_eq!(k(&w), [true, true]);
    }

    #[test]
    fn first_half_lap_of_ring_pairs_shares_no_node_with_even_node_count() {
        let plan = plan_kinds(&names(6), &[ProbeKind::CrossNode], 6, 11).expect("plan");
        let mut seen = BTreeSet::new();
        for p in &plan[..3] {
            assert!(seen.insert(p.source.clone()), "{plan:?}");
            assert!(seen.insert(p.target.clone()), "{plan:?}");
        }
        // Still one lap: each node once as source and once as target.
        let s: BTreeSet<_> = plan.iter().map(|p| &p.source).collect();
        let t: BTreeSet<_> = plan.iter().map(|p| &p.target).collect();
        assert_eq!((s.len(), t.len()), (6, 6));
    }

    #[test]
    fn recreate_keeps_its_target_only_for_a_later_probe_on_the_same_node() {
        let plan = plan_kinds(&names(3), &[ProbeKind::Recreate], 6, 5).expect("plan");
        for (i, p) in plan.iter().enumerate() {
            let later = plan[i + 1..].iter().any(|q| q.target == p.target);
            assert_eq!(p.keep_target, later, "{p:?}");
        }
        assert_eq!(plan.iter().filter(|p| p.keep_target).count(), 3);
        let cross = plan_kinds(&names(3), &[ProbeKind::CrossNode], 6, 5).expect("plan");
        assert!(cross.iter().all(|p| !p.keep_target));
    }

    #[test]
    fn node_count_requirements_depend_on_the_kinds() {
        let one = names(1);
        let plan = plan_kinds(&one, &[ProbeKind::SameNode], 2, 1).expect("same_node on 1 node");
        assert_eq!(plan.len(), 2);
        assert!(plan_kinds(&one, &[ProbeKind::SameNode, ProbeKind::Burst], 2, 1).is_none());
        assert!(plan_kinds(&[], &[ProbeKind::SameNode], 2, 1).is_none());
        assert!(plan_kinds(&names(3), &[], 2, 1).is_none());
    }

    #[test]
    fn lap_order_is_a_permutation_even_positions_first() {
        assert_eq!(lap_order(6, 6), vec![0, 2, 4, 1, 3, 5]);
        assert_eq!(lap_order(7, 3), vec![0, 2, 1, 3, 5, 4, 6]);
        let mut o = lap_order(23, 5);
        o.sort();
        assert_eq!(o, (0..23).collect::<Vec<_>>());
    }

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("node-{i}")).collect()
    }

    fn node(name: &str) -> NodeInfo {
        let mut labels = BTreeMap::new();
        labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
        labels.insert("kubernetes.io/hostname".to_string(), name.to_string());
        NodeInfo {
            name: name.to_string(),
            labels,
            ready: true,
            unschedulable: false,
            taints: vec![],
        }
    }

    #[test]
    fn a_toleration_matching_no_taint_is_reported_unmatched() {
        let mut tainted = node("n1");
        tainted.taints = vec![NodeTaint {
            key: "dedicated".into(),
            value: Some("net".into()),
            effect: "NoSchedule".into(),
        }];
        let nodes = [tainted, node("n2")];
        let tols: Vec<TolerationSpec> = ["dedicated=net:NoSchedule", "foo", "dedicated=web"]
            .iter()
            .map(|t| t.parse().expect("toleration"))
            .collect();
        let unmatched: Vec<String> = unmatched_tolerations(&nodes, &tols)
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(unmatched, ["foo", "dedicated=web"]);
    }

    #[test]
    fn one_lap_uses_every_node_once_as_source_and_once_as_target() {
        for n in 2..12 {
            let plan = plan_ring(&names(n), n, 42).expect("n >= 2");
            let sources: BTreeSet<_> = plan.iter().map(|p| p.source.clone()).collect();
            let targets: BTreeSet<_> = plan.iter().map(|p| p.target.clone()).collect();
            assert_eq!(sources.len(), n, "n={n}");
            assert_eq!(targets.len(), n, "n={n}");
            assert!(plan.iter().all(|p| p.source != p.target), "n={n}");
        }
    }

    #[test]
    fn later_laps_pair_nodes_differently() {
        let plan = plan_ring(&names(5), 10, 7).expect("plan");
        let lap1: BTreeSet<_> = plan[..5].iter().map(|p| (&p.source, &p.target)).collect();
        let lap2: BTreeSet<_> = plan[5..].iter().map(|p| (&p.source, &p.target)).collect();
        assert!(lap1.is_disjoint(&lap2));
        assert!(plan.iter().all(|p| p.source != p.target));
    }

    #[test]
    fn same_seed_same_plan_and_other_seed_other_order() {
        let a = plan_ring(&names(8), 8, 1234).expect("plan");
        let mut shuffled_input = names(8);
        shuffled_input.reverse();
        let b = plan_ring(&shuffled_input, 8, 1234).expect("plan");
        assert_eq!(a, b);
        let differs = (0..20u64).any(|s| plan_ring(&names(8), 8, s).expect("plan") != a);
        assert!(differs);
    }

    #[test]
    fn fewer_than_two_nodes_give_no_plan() {
        assert!(plan_ring(&names(1), 3, 1).is_none());
        assert!(plan_ring(&[], 3, 1).is_none());
        assert!(plan_ring(&["a".into(), "a".into()], 3, 1).is_none());
    }

    #[test]
    fn cordoned_notready_mismatched_and_tainted_nodes_are_skipped() {
        let ok = node("node-1");
        let mut cordoned = node("node-2");
        cordoned.unschedulable = true;
        let mut notready = node("node-3");
        notready.ready = false;
        let mut windows = node("node-4");
        windows
            .labels
            .insert("kubernetes.io/os".into(), "windows".into());
        let mut tainted = node("node-5");
        tainted.taints.push(NodeTaint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
        });
        let mut prefer = node("node-6");
        prefer.taints.push(NodeTaint {
            key: "soft".into(),
            value: None,
            effect: "PreferNoSchedule".into(),
        });
        let sel: NodeSelector = "kubernetes.io/os=linux".parse().expect("selector");
        let all = [ok, cordoned, notready, windows, tainted.clone(), prefer];
        let (eligible, skipped) = filter_nodes(&all, &sel, &[]);
        let names: Vec<_> = eligible.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["node-1", "node-6"]);
        let reasons: BTreeMap<_, _> = skipped.into_iter().collect();
        assert_eq!(reasons["node-2"], SkipReason::Cordoned);
        assert_eq!(reasons["node-3"], SkipReason::NotReady);
        assert_eq!(reasons["node-4"], SkipReason::SelectorMismatch);
        assert!(matches!(reasons["node-5"], SkipReason::UntoleratedTaint(_)));

        let tol: TolerationSpec = "dedicated=gpu:NoSchedule".parse().expect("toleration");
        assert!(check_node(&tainted, &sel, &[tol]).is_ok());
        let wrong_value: TolerationSpec = "dedicated=cpu:NoSchedule".parse().expect("toleration");
        assert!(check_node(&tainted, &sel, &[wrong_value]).is_err());
        let wrong_effect: TolerationSpec = "dedicated:NoExecute".parse().expect("toleration");
        assert!(check_node(&tainted, &sel, &[wrong_effect]).is_err());
        let exists_any: TolerationSpec = "dedicated".parse().expect("toleration");
        assert!(check_node(&tainted, &sel, &[exists_any]).is_ok());
    }

    #[test]
    fn selector_syntax_round_trips_and_rejects_set_based() {
        let s: NodeSelector = "a=b, c!=d,e,!f,g==h".parse().expect("selector");
        assert_eq!(s.to_string(), "a=b,c!=d,e,!f,g=h");
        let mut l = BTreeMap::new();
        l.insert("a".to_string(), "b".to_string());
        l.insert("e".to_string(), "".to_string());
        l.insert("g".to_string(), "h".to_string());
        assert!(s.matches(&l));
        l.insert("f".to_string(), "x".to_string());
        assert!(!s.matches(&l));
        assert!("env in (a,b)".parse::<NodeSelector>().is_err());
        assert!("=x".parse::<NodeSelector>().is_err());
        assert!(""
            .parse::<NodeSelector>()
            .expect("empty")
            .matches(&BTreeMap::new()));
    }

    #[test]
    fn toleration_forms_parse_and_render_k8s_operator() {
        let t: TolerationSpec = "k=v:NoExecute".parse().expect("t");
        assert_eq!(t.to_string(), "k=v:NoExecute");
        assert_eq!(t.to_k8s().operator.as_deref(), Some("Equal"));
        let t: TolerationSpec = "k:NoSchedule".parse().expect("t");
        assert_eq!(t.to_k8s().operator.as_deref(), Some("Exists"));
        assert_eq!(t.to_k8s().value, None);
        assert!("k:Sometimes".parse::<TolerationSpec>().is_err());
        assert!(":NoSchedule".parse::<TolerationSpec>().is_err());
    }

    #[test]
    fn node_info_reads_ready_condition_from_fixture() {
        let raw = include_str!("../tests/fixtures/k8s-node-ready.json");
        let n: Node = serde_json::from_str(raw).expect("fixture parses as Node");
        let info = NodeInfo::from_node(&n);
        assert_eq!(info.name, "kind-control-plane");
        assert!(info.ready);
        assert!(!info.unschedulable);
        let mut n2 = n.clone();
        if let Some(st) = n2.status.as_mut() {
            for c in st.conditions.iter_mut().flatten() {
                if c.type_ == "Ready" {
                    c.status = "False".into();
                }
            }
        }
        assert!(!NodeInfo::from_node(&n2).ready);
    }
}
