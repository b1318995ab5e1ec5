//! Which node a slow or failed probe blames (issue 31: the baseline comparison and the
//! JUnit node cases follow the text diagnosis). Pure: probe records in, node names out.
//!
//! A probe joins two pods on two nodes, and its TTFP is set by the slower end, so a
//! bad TTFP alone cannot say which node was slow. Some evidence can, because it was
//! measured on one node only:
//!
//! - a pod's own readiness never passing (`target_never_ready`, `source_never_ready`:
//!   the kubelet could not reach the pod on its own node, docs/design.md §2 "Results"),
//!   or a source whose own path to its node never worked (`endpoint_never_programmed`);
//! - a pod's own programming wait over `--slow-threshold` (`endpoint_programming_slow`,
//!   measured inside the pod, issue 29);
//! - a node agent's own metrics named in the probe's `suspects` (crate `agents`).
//!
//! [`own_blame`] gives the nodes the first two name for one probe; [`evidenced_nodes`]
//! collects all three over a run. A node that met only such nodes cannot be told apart
//! from them by TTFP: the best-peer rule (crate `baseline`, "Per-node attribution")
//! therefore leaves evidenced peers out when it judges another node.

use firstpacket_report::{ProbeRecord, ProbeResult, Reason};
use std::collections::{BTreeMap, BTreeSet};

/// The nodes a probe's own-pod evidence blames: `target_never_ready` → the target's
/// node; `source_never_ready` and `endpoint_never_programmed` → the source's;
/// `endpoint_programming_slow` → the nodes whose pod's own programming wait was over
/// the threshold. `None` for every other probe (both nodes share the blame).
pub fn own_blame(p: &ProbeRecord) -> Option<Vec<&str>> {
    match p.reason? {
        Reason::TargetNeverReady => Some(vec![p.target.node.as_str()]),
        Reason::SourceNeverReady | Reason::EndpointNeverProgrammed => {
            Some(vec![p.source.node.as_str()])
        }
        Reason::EndpointProgrammingSlow => {
            let prog = p.programming.as_ref()?;
            let mut nodes = Vec::new();
            for (w, node) in [
                (&prog.source, &p.source.node),
                (&prog.target, &p.target.node),
            ] {
                if w.as_ref().is_some_and(|w| w.over_threshold) {
                    nodes.push(node.as_str());
                }
            }
            Some(nodes)
        }
        _ => None,
    }
}

/// Nodes named by their own evidence in `slow`/`failed` probes (module docs), each with
/// what named it: `"<reason> (N probes)"` per own-pod reason and `"agent <signal>"` per
/// agent signal, sorted. Nodes with no such evidence are absent.
pub fn evidenced_nodes(probes: &[ProbeRecord]) -> BTreeMap<String, BTreeSet<String>> {
    let mut counts: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in probes
        .iter()
        .filter(|p| matches!(p.result, ProbeResult::Slow | ProbeResult::Failed))
    {
        if let (Some(nodes), Some(r)) = (own_blame(p), p.reason) {
            for n in nodes {
                *counts.entry((n, r.as_str())).or_default() += 1;
            }
        }
        for s in &p.suspects {
            out.entry(s.node.clone())
                .or_default()
                .insert(format!("agent {}", s.signal.as_str()));
        }
    }
    for ((n, r), c) in counts {
        out.entry(n.to_owned())
            .or_default()
            .insert(format!("{r} ({c} probe{})", if c == 1 { "" } else { "s" }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(src: &str, dst: &str, result: ProbeResult, reason: Option<Reason>) -> ProbeRecord {
        let mut p = crate::record::test_record("p", src, dst, result);
        p.reason = reason;
        p
    }

    #[test]
    fn own_pod_reasons_name_one_node_and_shared_ones_none() {
        let mut p = probe(
            "a",
            "b",
            ProbeResult::Failed,
            Some(Reason::TargetNeverReady),
        );
        assert_eq!(own_blame(&p), Some(vec!["b"]));
        p.reason = Some(Reason::SourceNeverReady);
        assert_eq!(own_blame(&p), Some(vec!["a"]));
        p.reason = Some(Reason::EndpointNeverProgrammed);
        assert_eq!(own_blame(&p), Some(vec!["a"]));
        p.reason = Some(Reason::NoSuccessBeforeGiveUp);
        assert_eq!(own_blame(&p), None);
        p.reason = Some(Reason::TtfpOverThreshold);
        assert_eq!(own_blame(&p), None);
    }

    #[test]
    fn evidenced_nodes_ignore_passed_probes_and_count_per_reason() {
        let probes = vec![
            probe(
                "a",
                "b",
                ProbeResult::Failed,
                Some(Reason::TargetNeverReady),
            ),
            probe(
                "c",
                "b",
                ProbeResult::Failed,
                Some(Reason::TargetNeverReady),
            ),
            probe(
                "b",
                "a",
                ProbeResult::Failed,
                Some(Reason::NoSuccessBeforeGiveUp),
            ),
            probe("a", "c", ProbeResult::Success, None),
        ];
        let e = evidenced_nodes(&probes);
        assert_eq!(e.keys().collect::<Vec<_>>(), vec!["b"]);
        assert!(e["b"].contains("target_never_ready (2 probes)"), "{e:?}");
    }
}
