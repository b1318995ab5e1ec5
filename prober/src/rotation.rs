//! Pure scheduling of `prober run` (continuous mode): which pair to probe next over a
//! live node set, and which changes make a node "probe next".
//!
//! - **Laps** ([`Rotation`]): a lap is a shuffled order of the eligible nodes at its
//!   start; probe `i` of the lap has `order[i]` as source and `order[(i + offset) % n]`
//!   as target, `offset = 1 + lap % (n − 1)` (a permutation, so every node is source
//!   once and target once per lap, and the pairing changes from lap to lap). A node that
//!   stops being eligible mid-lap is skipped (as source, and as target: the next
//!   eligible node in the order takes its place); a node that joins is probed at once
//!   through the priority queue and is part of the next lap. Kinds rotate over the
//!   probes (`--kinds`); `same_node` probes put source and target on one node.
//! - **Change triggers** ([`Rotation::prioritise`]): a node that just became eligible
//!   (joined, turned Ready, uncordoned: [`became_eligible`]) or whose agent pod changed
//!   ([`agent_changes`]) is queued as source and as target ahead of the rotation.

use crate::kind::ProbeKind;
use crate::schedule::{check_node, NodeInfo, NodeSelector, TolerationSpec};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One probe the rotation picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextProbe {
    /// Kind (rotating over `--kinds`).
    pub kind: ProbeKind,
    /// Source node (A).
    pub source: String,
    /// Target node (B; = A for `same_node`).
    pub target: String,
    /// Lap number (1-based) of a rotation probe; `None` for a change-triggered one.
    pub lap: Option<u64>,
    /// Why a change-triggered probe was scheduled (e.g. `node node-3 became Ready`).
    pub trigger: Option<String>,
}

/// Role a queued change-triggered probe gives its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueuedRole {
    Source,
    Target,
}

/// The continuous mode's pair rotation (module docs). Pure: the caller passes the
/// eligible node set on every call.
#[derive(Debug, Clone)]
pub struct Rotation {
    kinds: Vec<ProbeKind>,
    seed: u64,
    order: Vec<String>,
    pos: usize,
    lap: u64,
    kind_pos: usize,
    queue: VecDeque<(String, QueuedRole, String)>,
    /// Laps completed (the caller times them).
    completed_laps: u64,
}

impl Rotation {
    /// A rotation over `kinds` (non-empty; duplicates already removed), shuffled from
    /// `seed`.
    pub fn new(kinds: Vec<ProbeKind>, seed: u64) -> Rotation {
        Rotation {
            kinds,
            seed,
            order: Vec::new(),
            pos: 0,
            lap: 0,
            kind_pos: 0,
            queue: VecDeque::new(),
            completed_laps: 0,
        }
    }

    /// Queues `node` as source and as target, ahead of the rotation (`why` goes into
    /// the probes' log lines). A node already queued in a role is not queued again.
    pub fn prioritise(&mut self, node: &str, why: &str) {
        for role in [QueuedRole::Source, QueuedRole::Target] {
            if !self.queue.iter().any(|(n, r, _)| n == node && *r == role) {
                self.queue
                    .push_back((node.to_string(), role, why.to_string()));
            }
        }
    }

    /// Change-triggered probes waiting (≤ 2 per node).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Drops queued entries of nodes not in `eligible` (they left or turned NotReady).
    pub fn prune(&mut self, eligible: &BTreeSet<String>) {
        self.queue.retain(|(n, _, _)| eligible.contains(n));
    }

    /// The current lap (1-based; 0 before the first probe).
    pub fn lap(&self) -> u64 {
        self.lap
    }

    /// Laps completed so far.
    pub fn completed_laps(&self) -> u64 {
        self.completed_laps
    }

    /// Nodes in the current lap's order.
    pub fn lap_len(&self) -> usize {
        self.order.len()
    }

    fn next_kind(&mut self) -> ProbeKind {
        let k = self.kinds[self.kind_pos % self.kinds.len().max(1)];
        self.kind_pos += 1;
        k
    }

    /// A partner for `node` among `eligible`, rotating with the probe count.
    fn partner(&self, node: &str, eligible: &BTreeSet<String>) -> Option<String> {
        let others: Vec<&String> = eligible.iter().filter(|n| *n != node).collect();
        if others.is_empty() {
            return None;
        }
        Some(others[self.kind_pos % others.len()].clone())
    }

    /// The next probe over `eligible`, or `None` when the kinds cannot be placed (no
    /// node; one node and the next kind needs two). Every call advances the kind.
    pub fn next(&mut self, eligible: &BTreeSet<String>) -> Option<NextProbe> {
        if eligible.is_empty() || self.kinds.is_empty() {
            return None;
        }
        self.prune(eligible);
        let kind = self.next_kind();
        let same = kind == ProbeKind::SameNode;
        if !same && eligible.len() < 2 {
            return None;
        }
        if let Some((node, role, why)) = self.queue.pop_front() {
            if same {
                // One same_node probe covers both roles.
                self.queue.retain(|(n, _, _)| *n != node);
                return Some(NextProbe {
                    kind,
                    source: node.clone(),
                    target: node,
                    lap: None,
                    trigger: Some(why),
                });
            }
            let partner = self.partner(&node, eligible)?;
            let (source, target) = match role {
                QueuedRole::Source => (node, partner),
                QueuedRole::Target => (partner, node),
            };
            return Some(NextProbe {
                kind,
                source,
                target,
                lap: None,
                trigger: Some(why),
            });
        }
        for _ in 0..2 {
            while self.pos < self.order.len() {
                let i = self.pos;
                self.pos += 1;
                let src = &self.order[i];
                if !eligible.contains(src) {
                    continue;
                }
                let target = if same {
                    Some(src.clone())
                } else {
                    let n = self.order.len();
                    let offset = 1 + (self.lap as usize) % (n - 1).max(1);
                    (0..n)
                        .map(|j| &self.order[(i + offset + j) % n])
                        .find(|t| *t != src && eligible.contains(*t))
                        .cloned()
                        .or_else(|| self.partner(src, eligible))
                };
                let Some(target) = target else { continue };
                return Some(NextProbe {
                    kind,
                    source: src.clone(),
                    target,
                    lap: Some(self.lap),
                    trigger: None,
                });
            }
            // A new lap over the nodes eligible now.
            if !self.order.is_empty() {
                self.completed_laps += 1;
            }
            self.lap += 1;
            let mut order: Vec<String> = eligible.iter().cloned().collect();
            let mut rng = StdRng::seed_from_u64(self.seed.wrapping_add(self.lap));
            order.shuffle(&mut rng);
            self.order = order;
            self.pos = 0;
        }
        None
    }
}

/// Whether a node change makes the node eligible now when it was not before (`old`:
/// `None` = the node just joined): `Some(why)` — `joined`, `became Ready`,
/// `uncordoned`, `became eligible` (labels/taints). `None` when it was already eligible
/// or is not eligible now.
pub fn became_eligible(
    old: Option<&NodeInfo>,
    new: &NodeInfo,
    selector: &NodeSelector,
    tolerations: &[TolerationSpec],
) -> Option<&'static str> {
    if check_node(new, selector, tolerations).is_err() {
        return None;
    }
    let Some(old) = old else {
        return Some("joined");
    };
    if check_node(old, selector, tolerations).is_ok() {
        return None;
    }
    Some(if !old.ready {
        "became Ready"
    } else if old.unschedulable {
        "uncordoned"
    } else {
        "became eligible"
    })
}

/// Agent pods by (profile, node): the set of (pod UID, Σ restartCount) seen.
pub type AgentSnapshot = BTreeMap<(String, String), BTreeSet<(String, u32)>>;

/// Nodes whose agent pods changed between two snapshots (replaced: another UID;
/// restarted: another restart count; a pod added or removed), sorted, each once, with
/// the profile as the cause (`agent calico-felix pod replaced`). A (profile, node) seen
/// for the first time counts when `old` was not the first snapshot (`first`): at
/// start-up every agent is new.
pub fn agent_changes(
    old: &AgentSnapshot,
    new: &AgentSnapshot,
    first: bool,
) -> Vec<(String, String)> {
    if first {
        return Vec::new();
    }
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for ((profile, node), pods) in new {
        let why = match old.get(&(profile.clone(), node.clone())) {
            None => Some("pod appeared"),
            Some(before) if before == pods => None,
            Some(before) => {
                let uids_before: BTreeSet<&String> = before.iter().map(|(u, _)| u).collect();
                let uids_now: BTreeSet<&String> = pods.iter().map(|(u, _)| u).collect();
                Some(if uids_before == uids_now {
                    "restarted"
                } else {
                    "pod replaced"
                })
            }
        };
        if let Some(why) = why {
            out.entry(node.clone())
                .or_insert_with(|| format!("agent {profile} {why}"));
        }
    }
    for (profile, node) in old.keys() {
        if !new.contains_key(&(profile.clone(), node.clone())) {
            out.entry(node.clone())
                .or_insert_with(|| format!("agent {profile} pod gone"));
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_node_is_source_and_target_once_per_lap() {
        let nodes = set(&["n1", "n2", "n3", "n4", "n5"]);
        let mut r = Rotation::new(vec![ProbeKind::CrossNode], 7);
        for lap in 1..=4u64 {
            let mut src = BTreeMap::<String, u32>::new();
            let mut dst = BTreeMap::<String, u32>::new();
            for _ in 0..nodes.len() {
                let p = r.next(&nodes).expect("probe");
                assert_eq!(p.lap, Some(lap));
                assert_ne!(p.source, p.target);
                *src.entry(p.source).or_default() += 1;
                *dst.entry(p.target).or_default() += 1;
            }
            assert!(src.values().all(|c| *c == 1) && src.len() == 5, "{src:?}");
            assert!(dst.values().all(|c| *c == 1) && dst.len() == 5, "{dst:?}");
        }
        assert_eq!(r.completed_laps(), 3);
    }

    #[test]
    fn nodes_leaving_mid_lap_are_skipped_and_joining_nodes_come_next_lap() {
        let mut r = Rotation::new(vec![ProbeKind::CrossNode], 1);
        let all = set(&["a", "b", "c", "d"]);
        let first = r.next(&all).expect("probe");
        let gone = ["a", "b", "c", "d"]
            .into_iter()
            .find(|n| *n != first.source && *n != first.target)
            .expect("a node not in the first probe");
        let fewer: BTreeSet<String> = all.iter().filter(|n| *n != gone).cloned().collect();
        let mut rest = Vec::new();
        while let Some(p) = r.next(&fewer) {
            if p.lap != Some(1) {
                break;
            }
            rest.push(p);
        }
        assert!(
            rest.iter().all(|p| p.source != gone && p.target != gone),
            "{rest:?}"
        );
        assert_eq!(rest.len(), 2, "the other two sources of lap 1: {rest:?}");
        // Lap 2 is over the set of that moment, including a new node.
        let more = set(&["a", "b", "c", "d", "e"]);
        let mut sources = BTreeSet::new();
        // Two probes finish lap 2 (over the 3 nodes), then lap 3 has all 5.
        for _ in 0..7 {
            let p = r.next(&more).expect("probe");
            if p.lap == Some(3) {
                sources.insert(p.source);
            }
        }
        assert!(sources.contains("e"), "{sources:?}");
    }

    #[test]
    fn triggered_nodes_go_first_as_source_and_target() {
        let nodes = set(&["n1", "n2", "n3"]);
        let mut r = Rotation::new(vec![ProbeKind::CrossNode], 3);
        r.next(&nodes);
        r.prioritise("n3", "node n3 became Ready");
        r.prioritise("n3", "again");
        assert_eq!(r.queued(), 2);
        let a = r.next(&nodes).expect("probe");
        let b = r.next(&nodes).expect("probe");
        assert_eq!((a.source.as_str(), a.lap), ("n3", None));
        assert_eq!(b.target, "n3");
        assert_eq!(a.trigger.as_deref(), Some("node n3 became Ready"));
        assert!(r.next(&nodes).expect("probe").lap.is_some());
        // A queued node that left is dropped.
        r.prioritise("n9", "joined");
        assert!(r.next(&nodes).expect("probe").trigger.is_none());
        assert_eq!(r.queued(), 0);
    }

    #[test]
    fn kinds_rotate_and_same_node_needs_one_node() {
        let mut r = Rotation::new(vec![ProbeKind::CrossNode, ProbeKind::SameNode], 0);
        let nodes = set(&["n1", "n2"]);
        let a = r.next(&nodes).expect("probe");
        let b = r.next(&nodes).expect("probe");
        assert_eq!(a.kind, ProbeKind::CrossNode);
        assert_eq!(b.kind, ProbeKind::SameNode);
        assert_eq!(b.source, b.target);
        let mut one = Rotation::new(vec![ProbeKind::CrossNode], 0);
        assert!(one.next(&set(&["n1"])).is_none());
        assert!(one.next(&BTreeSet::new()).is_none());
        let mut same = Rotation::new(vec![ProbeKind::SameNode], 0);
        assert_eq!(same.next(&set(&["n1"])).expect("probe").source, "n1");
    }

    fn node(name: &str, ready: bool, cordoned: bool) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            labels: [("kubernetes.io/os".to_string(), "linux".to_string())].into(),
            ready,
            unschedulable: cordoned,
            taints: vec![],
        }
    }

    #[test]
    fn eligibility_transitions_name_the_change() {
        let sel: NodeSelector = "kubernetes.io/os=linux".parse().expect("selector");
        let ok = node("n", true, false);
        assert_eq!(became_eligible(None, &ok, &sel, &[]), Some("joined"));
        assert_eq!(
            became_eligible(Some(&node("n", false, false)), &ok, &sel, &[]),
            Some("became Ready")
        );
        assert_eq!(
            became_eligible(Some(&node("n", true, true)), &ok, &sel, &[]),
            Some("uncordoned")
        );
        assert_eq!(became_eligible(Some(&ok), &ok, &sel, &[]), None);
        assert_eq!(
            became_eligible(None, &node("n", false, false), &sel, &[]),
            None
        );
    }

    #[test]
    fn agent_changes_find_replaced_restarted_and_gone_pods() {
        let key = |p: &str, n: &str| (p.to_string(), n.to_string());
        let pods = |v: &[(&str, u32)]| -> BTreeSet<(String, u32)> {
            v.iter().map(|(u, r)| (u.to_string(), *r)).collect()
        };
        let old: AgentSnapshot = [
            (key("felix", "n1"), pods(&[("u1", 0)])),
            (key("felix", "n2"), pods(&[("u2", 0)])),
            (key("felix", "n3"), pods(&[("u3", 0)])),
        ]
        .into();
        let new: AgentSnapshot = [
            (key("felix", "n1"), pods(&[("u1", 1)])),
            (key("felix", "n2"), pods(&[("u9", 0)])),
            (key("felix", "n4"), pods(&[("u4", 0)])),
        ]
        .into();
        let c = agent_changes(&old, &new, false);
        assert_eq!(
            c,
            vec![
                ("n1".to_string(), "agent felix restarted".to_string()),
                ("n2".to_string(), "agent felix pod replaced".to_string()),
                ("n3".to_string(), "agent felix pod gone".to_string()),
                ("n4".to_string(), "agent felix pod appeared".to_string()),
            ]
        );
        assert!(agent_changes(&AgentSnapshot::new(), &new, true).is_empty());
        assert!(agent_changes(&new, &new, false).is_empty());
    }
}
