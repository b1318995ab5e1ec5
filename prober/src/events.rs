//! Kubernetes Events on Nodes for slow and failed probes (`prober run`; docs/design.md §4
//! "Continuous mode"): reason `FirstPacketFailed` / `FirstPacketSlow`, type `Warning`,
//! core/v1 Events in namespace `default` (where Events of cluster-scoped objects live),
//! `involvedObject` the Node (kind, name, UID), so `kubectl describe node` shows them.
//!
//! Which nodes ([`blamed_nodes`], [`Blame`]): the nodes the probe's suspects name; else
//! the side of the pair not cleared by a recent success with another peer; while
//! neither side is cleared the decision waits ([`PendingBlames`]) for later probes to
//! tell them apart, and after [`PENDING_PROBES`] further probes both nodes are blamed
//! (one for `same_node`): nothing told them apart. Rate limit
//! ([`EventLimiter`]): at most one Event per (node, reason) per window (default 5 min).
//! Events are counted apart from the probes' API-write budget (docs/design.md §7).

use firstpacket_report::{ProbeRecord, ProbeResult};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Namespace of Events on cluster-scoped objects.
pub const EVENT_NAMESPACE: &str = "default";

/// Default minimum spacing of Events per (node, reason).
pub const EVENT_WINDOW: Duration = Duration::from_secs(300);

/// The Event reason for a probe result: `FirstPacketFailed` (failed),
/// `FirstPacketSlow` (slow); `None` otherwise (success, inconclusive: not the network).
pub fn event_reason(result: ProbeResult) -> Option<&'static str> {
    match result {
        ProbeResult::Failed => Some("FirstPacketFailed"),
        ProbeResult::Slow => Some("FirstPacketSlow"),
        _ => None,
    }
}

/// The nodes a slow/failed probe blames: its suspects' nodes when it has any; else the
/// one node of the pair that has not been cleared by `recent` records (a node is
/// cleared when a recent probe *with another peer* succeeded with it in the same role:
/// the trouble then does not follow it); both nodes when neither or both are cleared
/// (nothing tells them apart). Sorted, each once.
pub fn blamed_nodes(rec: &ProbeRecord, recent: &[ProbeRecord]) -> Vec<String> {
    match blame(rec, recent) {
        Blame::Nodes(n) => n,
        Blame::Undecided => {
            let both: BTreeSet<String> = [rec.source.node.clone(), rec.target.node.clone()].into();
            both.into_iter().collect()
        }
    }
}

/// How a slow/failed probe's blame stands ([`blame`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blame {
    /// These nodes (sorted): suspects, the one uncleared side, or both when both sides
    /// were cleared (the trouble follows the pair).
    Nodes(Vec<String>),
    /// Neither side has been cleared yet: later probes may tell them apart.
    Undecided,
}

/// The blame of `rec` given `recent` records ([`blamed_nodes`] without the fallback).
pub fn blame(rec: &ProbeRecord, recent: &[ProbeRecord]) -> Blame {
    let suspects: BTreeSet<String> = rec.suspects.iter().map(|s| s.node.clone()).collect();
    if !suspects.is_empty() {
        return Blame::Nodes(suspects.into_iter().collect());
    }
    let (src, dst) = (&rec.source.node, &rec.target.node);
    if src == dst {
        return Blame::Nodes(vec![src.clone()]);
    }
    let ok = |r: &ProbeRecord| r.id != rec.id && r.result == ProbeResult::Success;
    let src_cleared = recent
        .iter()
        .any(|r| ok(r) && r.source.node == *src && r.target.node != *dst);
    let dst_cleared = recent
        .iter()
        .any(|r| ok(r) && r.target.node == *dst && r.source.node != *src);
    match (src_cleared, dst_cleared) {
        (true, false) => Blame::Nodes(vec![dst.clone()]),
        (false, true) => Blame::Nodes(vec![src.clone()]),
        (true, true) => {
            let both: BTreeSet<String> = [src.clone(), dst.clone()].into();
            Blame::Nodes(both.into_iter().collect())
        }
        (false, false) => Blame::Undecided,
    }
}

/// Probes after which an undecided blame falls back to both nodes (16: two laps of 8
/// nodes; on a small cluster several laps, so every healthy node had its chance to pass
/// with another peer).
pub const PENDING_PROBES: u64 = 16;

/// At most this many undecided blames wait (the oldest falls back to both nodes).
pub const PENDING_CAPACITY: usize = 64;

/// Slow/failed records whose blame is undecided, with the running probe total when
/// they were recorded.
#[derive(Debug, Default)]
pub struct PendingBlames {
    waiting: std::collections::VecDeque<(ProbeRecord, u64)>,
}

impl PendingBlames {
    /// Adds `rec` (recorded as probe number `total`) and re-decides every waiting
    /// record against `recent` at probe number `now_total`. Returns the decided ones
    /// with their nodes: cleared by now, or waiting for [`PENDING_PROBES`] probes (both
    /// nodes), or pushed out by [`PENDING_CAPACITY`] (both nodes).
    pub fn decide(
        &mut self,
        new: Option<(ProbeRecord, u64)>,
        recent: &[ProbeRecord],
        now_total: u64,
    ) -> Vec<(ProbeRecord, Vec<String>)> {
        if let Some(n) = new {
            self.waiting.push_back(n);
        }
        let mut out = Vec::new();
        let mut keep = std::collections::VecDeque::new();
        for (rec, at) in self.waiting.drain(..) {
            match blame(&rec, recent) {
                Blame::Nodes(n) => out.push((rec, n)),
                Blame::Undecided if now_total.saturating_sub(at) >= PENDING_PROBES => {
                    let n = blamed_nodes(&rec, &[]);
                    out.push((rec, n));
                }
                Blame::Undecided => keep.push_back((rec, at)),
            }
        }
        while keep.len() > PENDING_CAPACITY {
            if let Some((rec, _)) = keep.pop_front() {
                let n = blamed_nodes(&rec, &[]);
                out.push((rec, n));
            }
        }
        self.waiting = keep;
        out
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// One Event per (node, reason) per window; entries of nodes gone are pruned.
#[derive(Debug)]
pub struct EventLimiter {
    window: Duration,
    last: HashMap<(String, &'static str), Instant>,
}

impl EventLimiter {
    /// A limiter with `window` between Events of one (node, reason).
    pub fn new(window: Duration) -> EventLimiter {
        EventLimiter {
            window,
            last: HashMap::new(),
        }
    }

    /// Whether an Event for (node, reason) may go out at `now`; records it if so.
    pub fn allow(&mut self, node: &str, reason: &'static str, now: Instant) -> bool {
        let key = (node.to_string(), reason);
        match self.last.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < self.window => false,
            _ => {
                self.last.insert(key, now);
                true
            }
        }
    }

    /// Drops the entries of nodes `keep` rejects and entries older than the window.
    pub fn prune(&mut self, keep: impl Fn(&str) -> bool, now: Instant) {
        let w = self.window;
        self.last
            .retain(|(n, _), at| keep(n) && now.saturating_duration_since(*at) < w);
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// The Event message for `rec` on `node` (one line, ≤ 1 KiB).
pub fn event_message(rec: &ProbeRecord, node: &str) -> String {
    let ttfp = rec
        .ttfp_seconds
        .map_or("no TTFP".to_string(), |t| format!("TTFP {t:.3}s"));
    let signals: Vec<&str> = rec
        .suspects
        .iter()
        .filter(|s| s.node == node)
        .map(|s| s.signal.as_str())
        .collect();
    let mut m = format!(
        "probe {} ({}) {} → {}: {}{}, {ttfp}",
        rec.id,
        rec.kind,
        rec.source.node,
        rec.target.node,
        rec.result.as_str(),
        rec.reason
            .map(|r| format!("/{}", r.as_str()))
            .unwrap_or_default(),
    );
    if !signals.is_empty() {
        m.push_str(&format!("; suspects on {node}: {}", signals.join(", ")));
    }
    crate::agents::correlate::one_line(&m, 1024)
}

/// Builds the Event object (pure): `involvedObject` = Node `node` (`uid`), reason,
/// message, type `Warning`, source/reporting component `firstpacket`, instance
/// `reporting_instance`.
pub fn node_event(
    node: &str,
    uid: Option<&str>,
    reason: &str,
    message: String,
    reporting_instance: &str,
    now: Timestamp,
) -> Event {
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{node}.firstpacket.")),
            namespace: Some(EVENT_NAMESPACE.into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: uid.map(str::to_owned),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message),
        type_: Some("Warning".into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some("Probe".into()),
        reporting_component: Some("firstpacket".into()),
        reporting_instance: Some(reporting_instance.into()),
        source: Some(EventSource {
            component: Some("firstpacket".into()),
            host: None,
        }),
        ..Default::default()
    }
}

/// Creates an Event (bounded by 10 s); errors are logged, not returned (an Event is
/// information, never a reason to stop probing).
pub async fn post_event(client: &Client, ev: &Event) -> bool {
    let api: Api<Event> = Api::namespaced(client.clone(), EVENT_NAMESPACE);
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(crate::labels::FIELD_MANAGER.into()),
    };
    match tokio::time::timeout(Duration::from_secs(10), api.create(&pp, ev)).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %crate::error::kube_error_text(&e), reason = ?ev.reason, node = ?ev.involved_object.name, "cannot create Node Event");
            false
        }
        Err(_) => {
            tracing::warn!("creating a Node Event got no answer within 10s");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_node_and_reason_per_window() {
        let mut l = EventLimiter::new(Duration::from_secs(300));
        let t0 = Instant::now();
        assert!(l.allow("n1", "FirstPacketSlow", t0));
        assert!(!l.allow("n1", "FirstPacketSlow", t0 + Duration::from_secs(299)));
        assert!(l.allow("n1", "FirstPacketFailed", t0 + Duration::from_secs(1)));
        assert!(l.allow("n2", "FirstPacketSlow", t0 + Duration::from_secs(1)));
        assert!(l.allow("n1", "FirstPacketSlow", t0 + Duration::from_secs(300)));
        assert_eq!(l.len(), 3);
        l.prune(|n| n != "n2", t0 + Duration::from_secs(301));
        assert_eq!(l.len(), 1, "n2 gone, n1/Failed expired");
    }

    fn rec(id: &str, src: &str, dst: &str, result: ProbeResult) -> ProbeRecord {
        crate::record::test_record(id, src, dst, result)
    }

    #[test]
    fn the_side_that_passes_with_other_peers_is_not_blamed() {
        use ProbeResult::*;
        let slow = rec("9", "n3", "n2", Slow);
        // Nothing known: both.
        assert_eq!(blamed_nodes(&slow, &[]), ["n2", "n3"]);
        // n2 passed as target with another source: only n3 is blamed.
        let recent = vec![rec("1", "n4", "n2", Success), slow.clone()];
        assert_eq!(blamed_nodes(&slow, &recent), ["n3"]);
        // n3 passed as source with another target: only n2.
        let recent = vec![rec("2", "n3", "n1", Success)];
        assert_eq!(blamed_nodes(&slow, &recent), ["n2"]);
        // Passes of the same pair or in the other role do not clear anyone.
        let recent = vec![rec("3", "n3", "n2", Success), rec("4", "n2", "n1", Success)];
        assert_eq!(blamed_nodes(&slow, &recent), ["n2", "n3"]);
        // Both cleared: both.
        let recent = vec![rec("1", "n4", "n2", Success), rec("2", "n3", "n1", Success)];
        assert_eq!(blamed_nodes(&slow, &recent), ["n2", "n3"]);
        assert_eq!(blame(&slow, &[]), Blame::Undecided);
        // same_node: its one node.
        assert_eq!(blamed_nodes(&rec("5", "n1", "n1", Failed), &[]), ["n1"]);
    }

    #[test]
    fn undecided_blames_wait_for_later_probes_then_fall_back_to_both() {
        use ProbeResult::*;
        let mut p = PendingBlames::default();
        let slow = rec("1", "n1", "n2", Slow);
        // Nothing known yet: it waits.
        assert!(p
            .decide(Some((slow.clone(), 1)), std::slice::from_ref(&slow), 1)
            .is_empty());
        assert_eq!(p.len(), 1);
        // A later success of n1 with another target clears n1: n2 is blamed, alone.
        let recent = vec![slow.clone(), rec("2", "n1", "n3", Success)];
        let d = p.decide(None, &recent, 2);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].1, ["n2"]);
        assert!(p.is_empty());
        // Never told apart: both, after PENDING_PROBES probes.
        let other = rec("3", "n2", "n3", Failed);
        assert!(p.decide(Some((other.clone(), 3)), &[], 3).is_empty());
        assert!(p.decide(None, &[], 3 + PENDING_PROBES - 1).is_empty());
        let d = p.decide(None, &[], 3 + PENDING_PROBES);
        assert_eq!(d[0].1, ["n2", "n3"]);
        // Bounded.
        for i in 0..(PENDING_CAPACITY + 3) {
            p.decide(Some((rec(&format!("x{i}"), "a", "b", Slow), 100)), &[], 100);
        }
        assert_eq!(p.len(), PENDING_CAPACITY);
    }

    #[test]
    fn reasons_follow_the_result() {
        assert_eq!(event_reason(ProbeResult::Failed), Some("FirstPacketFailed"));
        assert_eq!(event_reason(ProbeResult::Slow), Some("FirstPacketSlow"));
        assert_eq!(event_reason(ProbeResult::Success), None);
        assert_eq!(event_reason(ProbeResult::Inconclusive), None);
    }

    #[test]
    fn event_names_the_node_as_involved_object_in_default() {
        let ev = node_event(
            "node-3",
            Some("uid-3"),
            "FirstPacketSlow",
            "m".into(),
            "run-abc",
            Timestamp::now(),
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(ev.involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(ev.involved_object.name.as_deref(), Some("node-3"));
        assert_eq!(ev.involved_object.uid.as_deref(), Some("uid-3"));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
    }
}
