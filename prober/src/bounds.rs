//! The stated bound of every structure `prober run` keeps, as a function of the
//! cluster's nodes and the run's settings. `prober run` exports each structure's size
//! as `firstpacket_state_entries{structure}` and its bound as
//! `firstpacket_state_bound{structure}`; a long-running prober whose size passes its
//! bound is a leak (the soak test checks it throughout a run with node churn, API
//! restarts and RBAC changes).
//!
//! Inputs ([`BoundInputs`]): `nodes` N — the nodes the prober currently knows (its node
//! watch, pruned as nodes leave); `concurrency` C (`--concurrency`); `burst_size` F
//! (`--burst-size`, the filler pods of a `burst` probe); `profiles` P (node-agent
//! profiles enabled); `kinds` K (`--kinds`). The bounds:
//!
//! | structure | bound | why |
//! |---|---|---|
//! | `recent_records` | 500 | the ring of the status page ([`crate::admin::RECENT_CAPACITY`]) |
//! | `tracked_pods` | 2·C·(2 + F) + N | pods of probes in flight, the same again still terminating, and one previous `recreate` incarnation per node |
//! | `forgotten_pod_uids` | 4096 | [`crate::tracker::FORGOTTEN_CAPACITY`] |
//! | `recreate_slots` | N + C | one stable name per node, plus those held by probes of nodes that just left |
//! | `event_limits` | 2·N | one entry per (node, Event reason): `FirstPacketSlow`, `FirstPacketFailed` |
//! | `queued_triggers` | 2·N | a node-change trigger per node and role ([`crate::rotation::Rotation::queued`]) |
//! | `nodes` | N | (the definition of N) |
//! | `agent_warnings` | 8·N | one per (node, signal), eight signals (`firstpacket_report::Signal`); taken by each finished probe |
//! | `agent_history_rings` | N·P | one observation ring per (node, profile) |
//! | `agent_hot_nodes` | N + 2·C | hot nodes, plus the two nodes of each probe in flight whose node left |
//! | `agent_via_proxy` | N·P | the (node, profile) pairs that fell back to the pod proxy |
//! | `pending_blames` | 64 | [`crate::events::PENDING_CAPACITY`] |
//! | `api_outages` | 100 | [`crate::apihealth::MAX_OUTAGES`] |
//! | `baseline_samples` | K·4096 + N·256 | TTFP samples of the learned baseline ([`crate::baseline`]): [`crate::baseline::KIND_CAPACITY`] per kind, [`crate::baseline::NODE_CAPACITY`] per node (a node's series goes when it leaves); 32 bytes each: ≤ 8.1 MiB at 1 000 nodes with every series full |

/// What the bounds depend on (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundInputs {
    /// Nodes known (N).
    pub nodes: usize,
    /// `--concurrency` (C).
    pub concurrency: usize,
    /// `--burst-size` (F).
    pub burst_size: usize,
    /// Enabled node-agent profiles (P).
    pub profiles: usize,
    /// Probe kinds (K, `--kinds`).
    pub kinds: usize,
}

impl BoundInputs {
    /// The inputs of a run with probe flags `p`, `profiles` enabled agent profiles and
    /// `kinds` probe kinds; `nodes` 0 until the node watch has them.
    pub fn of(p: &crate::config::ProbeArgs, profiles: usize, kinds: usize) -> BoundInputs {
        BoundInputs {
            nodes: 0,
            concurrency: p.concurrency as usize,
            burst_size: p.burst_size as usize,
            profiles,
            kinds,
        }
    }
}

/// Signals a node can carry at once (`firstpacket_report::Signal`'s variants).
const SIGNALS: usize = firstpacket_report::Signal::ALL.len();

/// The bound of `structure` (module docs' table), `None` for a name not in it.
pub fn bound(structure: &str, i: BoundInputs) -> Option<usize> {
    let (n, c, f, p) = (i.nodes, i.concurrency, i.burst_size, i.profiles);
    Some(match structure {
        "recent_records" => crate::admin::RECENT_CAPACITY,
        "tracked_pods" => 2 * c * (2 + f) + n,
        "forgotten_pod_uids" => crate::tracker::FORGOTTEN_CAPACITY,
        "recreate_slots" => n + c,
        "event_limits" => 2 * n,
        "queued_triggers" => 2 * n,
        "nodes" => n,
        "agent_warnings" => SIGNALS * n,
        "agent_history_rings" => n * p,
        "agent_hot_nodes" => n + 2 * c,
        "agent_via_proxy" => n * p,
        "pending_blames" => crate::events::PENDING_CAPACITY,
        "api_outages" => crate::apihealth::MAX_OUTAGES,
        "baseline_samples" => {
            i.kinds * crate::baseline::KIND_CAPACITY + n * crate::baseline::NODE_CAPACITY
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exported_structure_has_a_bound_growing_with_nodes_not_time() {
        let i = BoundInputs {
            nodes: 10,
            concurrency: 2,
            burst_size: 3,
            profiles: 3,
            kinds: 2,
        };
        assert_eq!(bound("tracked_pods", i), Some(2 * 2 * 5 + 10));
        assert_eq!(bound("agent_history_rings", i), Some(30));
        assert_eq!(bound("baseline_samples", i), Some(2 * 4096 + 10 * 256));
        assert_eq!(bound("no_such_structure", i), None);
        assert_eq!(
            SIGNALS,
            [
                firstpacket_report::Signal::DataplaneApplySlow,
                firstpacket_report::Signal::DataplaneApplyFailures,
                firstpacket_report::Signal::DatastoreResync,
                firstpacket_report::Signal::RouteResyncSlow,
                firstpacket_report::Signal::AgentRestarted,
                firstpacket_report::Signal::AgentNotReady,
                firstpacket_report::Signal::AgentUnreachable,
                firstpacket_report::Signal::AgentBadMetrics,
            ]
            .len()
        );
    }
}
