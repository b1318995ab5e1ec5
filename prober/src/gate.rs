//! Gate verdict, summary, per-node table and report (docs/design.md §4 "Gate"). Pure: probe
//! records in, report and text out.
//!
//! - Quantiles are **nearest-rank** (`rank = ⌈p·n⌉`, 1-based, over the sorted TTFPs of
//!   conclusive probes that have a TTFP), so a reported p95 is always a value that was
//!   actually measured.
//! - Exit codes (docs/design.md §4): **1** when conclusive probes breach a threshold (TTFP p95 >
//!   `--max-ttfp`, or `failed` count > `--max-failures`); else **2** when inconclusive
//!   probes exceed `--max-inconclusive`, the run errored/was interrupted/hit `--timeout`,
//!   or no probe ran; else **0**.
//! - Diagnosis ([`diagnose`]; first rule that applies). Terms: "passed" = `success` or
//!   `slow`; "bad" = `slow` or `failed`; only conclusive probes count (so the early
//!   stop's `interrupted` pairs never do); a "cross-node probe" has source node ≠ target
//!   node, whatever its kind; a node's "peers" are the nodes it has conclusive
//!   cross-node probes with. The rules ask for a pattern that holds in the data, not
//!   one suggested by a few probes: where no rule's pattern is certain the answer is
//!   `scattered_failures`, never a claim about the cross-node path, a pair or a node's
//!   own path.
//!   1. no conclusive probe → `inconclusive`;
//!   2. no bad probe → `healthy`, unless most probes (more than half) were
//!      inconclusive → `inconclusive`: a few passing probes among many that measured
//!      nothing do not show a healthy dataplane (the text and `verdict_reasons` name the
//!      dominant inconclusive reason, [`dominant_inconclusive_reason`]);
//!   3. any `target_never_ready`/`source_never_ready` → `node_local_broken`
//!      (target-server's `/readyz` is the kubelet reaching the pod from its own node:
//!      that failing is a same-node check failing);
//!   4. any `same_node` control probe `failed` → `node_local_broken` (two pods on one
//!      node cannot talk: that node's own dataplane is broken). Before rule 5, so the
//!      cross-node contrast below always has passing controls (or none ran);
//!   5. at least [`CROSS_NODE_BROKEN_SHARE`] (90 %) of the conclusive cross-node probes
//!      `failed`, at least 2 of them, and no node is in every failure (or the failures
//!      cover every node probed, as on 2 nodes) → `cross_node_broken`. 90 % because a
//!      broken cross-node path (tunnel device missing, every remote route gone) fails
//!      every pair, while failures that follow routes for particular pod IPs or node
//!      pairs leave many pairs passing: a stale blackhole route for each new pod IP on
//!      one other node of 4 fails about 5/9 of the pairs,
//!      and reaches 11 of 12 pairs by chance in about 1 % of runs (10 of 12, the 80 %
//!      mark, in about 5 %). With 9 or fewer conclusive cross-node probes it takes all
//!      of them. "No node in every failure": 2 failures that share a node may as well
//!      be that node's problem (rule 6 needs more data to say so);
//!   6. some node X is *broken*: X has ≥ 2 peers, and at least
//!      [`NODE_BROKEN_PEER_SHARE`] (80 %, rounded up: all of 2, 3 or 4 peers, 4 of 5)
//!      of them are *failing peers* — every conclusive probe between the two failed,
//!      in both directions or at least twice (as for a failing pair: one failure per
//!      peer is too few to blame X rather than the peers) —, some conclusive probe
//!      not touching X passed, and every bad probe touches a broken node →
//!      `node_local_broken` (X's own path, not the cluster's cross-node path: it fails
//!      with nearly everyone while the others work). A node failing with one peer
//!      only is a pair (rule 7);
//!   7. [`failing_pairs`] is not empty and every bad probe is a cross-node probe
//!      between the two nodes of one of those pairs → `pair_failures`. A pair counts as
//!      failing when it failed in both directions or at least twice (one failure is
//!      not a pattern), and each of its two nodes also passed with some other peer (so
//!      neither node is broken as a whole): the trouble is the route between those two
//!      nodes (a per-peer route lost in a scale-out). The pairs are listed in
//!      `summary.failing_pairs` and in the text output;
//!   8. some nodes are *suspect* (every conclusive probe touching them, in either role,
//!      was bad, at least 2 of them) and every bad probe touches a suspect node →
//!      `slow_nodes` (the trouble follows particular nodes, e.g. an agent slow to
//!      program endpoints on some of them);
//!   9. otherwise → `scattered_failures` (random pairs, or several patterns mixed; the
//!      failing pairs, if any, are still listed).
//! - Early stop ([`early_stop`], used by `prober gate`): once the verdict is certain to
//!   be `fail` and the cross-node pattern is certain, the remaining cross-node pairs are
//!   not worth a give-up period each (docs/scenarios.md S4).

use crate::schedule::NodeInfo;
use firstpacket_report::{
    Diagnosis, GateReport, KindSummary, NodeRoleStats, NodeSummary, ProbeProgramming, ProbeRecord,
    ProbeResult, Reason, Summary, Suspect, Thresholds, Verdict, SCHEMA_VERSION,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

pub use crate::stats::{conclusive_ttfps, nearest_rank};

fn count(probes: &[ProbeRecord], r: ProbeResult) -> u64 {
    probes.iter().filter(|p| p.result == r).count() as u64
}

/// Nodes where every conclusive probe touching them (as source or target) was slow or
/// failed, at least 2 of them (one probe says nothing about a node: its other end may
/// be the cause), on the node's own evidence (crate `blame`, issue 31): a bad probe
/// does not count against a node when its own-pod evidence names the other end only,
/// or when it names neither and the other end, not this node, is named by its own
/// evidence in the run. Sorted by name.
pub fn suspect_nodes(probes: &[ProbeRecord]) -> Vec<String> {
    let evidenced = crate::blame::evidenced_nodes(probes);
    let mut seen: BTreeMap<&str, (u64, u64)> = BTreeMap::new(); // (conclusive, bad)
    for p in probes.iter().filter(|p| p.result.is_conclusive()) {
        let bad = matches!(p.result, ProbeResult::Slow | ProbeResult::Failed);
        // Own-pod evidence (a pod never Ready, a programming wait) names its own node:
        // the other end's node was fine.
        let blamed = crate::blame::own_blame(p);
        let (s, t) = (p.source.node.as_str(), p.target.node.as_str());
        let mut nodes = vec![s, t];
        nodes.dedup();
        for n in nodes {
            let other = if n == s { t } else { s };
            let counts = match &blamed {
                Some(b) => b.contains(&n),
                None => evidenced.contains_key(n) || !evidenced.contains_key(other),
            };
            let e = seen.entry(n).or_default();
            e.0 += 1;
            e.1 += u64::from(bad && counts);
        }
    }
    seen.into_iter()
        .filter(|(_, (c, b))| *c >= 2 && b == c)
        .map(|(n, _)| n.to_string())
        .collect()
}

fn passed(p: &ProbeRecord) -> bool {
    matches!(p.result, ProbeResult::Success | ProbeResult::Slow)
}

fn is_cross_pair(p: &ProbeRecord) -> bool {
    p.source.node != p.target.node
}

/// The node present in every probe of `probes` (both nodes checked), if exactly one
/// such node exists and `probes` is not empty.
fn common_node(probes: &[&ProbeRecord]) -> Option<String> {
    match nodes_in_every(probes).as_slice() {
        [one] => Some(one.to_string()),
        _ => None,
    }
}

/// The nodes present (as source or target) in every probe of `probes`; empty when
/// `probes` is.
fn nodes_in_every<'a>(probes: &[&'a ProbeRecord]) -> Vec<&'a str> {
    let Some(first) = probes.first() else {
        return Vec::new();
    };
    let mut cands: Vec<&str> = vec![first.source.node.as_str(), first.target.node.as_str()];
    cands.dedup();
    cands.retain(|n| {
        probes
            .iter()
            .all(|p| p.source.node == *n || p.target.node == *n)
    });
    cands
}

/// Share of the conclusive cross-node probes that must have `failed` for
/// `cross_node_broken` (diagnosis rule 5 in the module docs, with the reason for 90 %).
pub const CROSS_NODE_BROKEN_SHARE: f64 = 0.9;

/// Share of a node's peers it must fail with (every conclusive probe between them
/// `failed`) to be called broken itself (diagnosis rule 6, `node_local_broken`).
pub const NODE_BROKEN_PEER_SHARE: f64 = 0.8;

/// The unordered pair of `p`'s nodes, sorted; `None` for a same-node probe.
fn pair_of(p: &ProbeRecord) -> Option<(&str, &str)> {
    let (a, b) = (p.source.node.as_str(), p.target.node.as_str());
    match a.cmp(b) {
        std::cmp::Ordering::Less => Some((a, b)),
        std::cmp::Ordering::Greater => Some((b, a)),
        std::cmp::Ordering::Equal => None,
    }
}

/// Per unordered node pair: (failed, passed, sources of the failures).
type PairTally<'a> = BTreeMap<(&'a str, &'a str), (u64, u64, BTreeSet<&'a str>)>;

fn pair_tally(probes: &[ProbeRecord]) -> PairTally<'_> {
    let mut m: PairTally<'_> = BTreeMap::new();
    for p in probes.iter().filter(|p| p.result.is_conclusive()) {
        let Some(k) = pair_of(p) else { continue };
        let e = m.entry(k).or_default();
        if p.result == ProbeResult::Failed {
            e.0 += 1;
            e.2.insert(p.source.node.as_str());
        } else {
            e.1 += 1;
        }
    }
    m
}

/// Node pairs whose conclusive cross-node probes fail as a pair (diagnosis rule 7):
/// `failed` in both directions or at least twice, and each of the two nodes passed
/// (`success`/`slow`) with some other peer. Sorted by node names.
pub fn failing_pairs(probes: &[ProbeRecord]) -> Vec<firstpacket_report::FailingPair> {
    let tally = pair_tally(probes);
    let passes_elsewhere = |x: &str, not: &str| {
        tally.iter().any(|((a, b), (_, passed, _))| {
            *passed > 0 && (*a == x || *b == x) && *a != not && *b != not
        })
    };
    tally
        .iter()
        .filter(|(_, (failed, _, sources))| *failed >= 2 || sources.len() == 2)
        .filter(|((a, b), _)| passes_elsewhere(a, b) && passes_elsewhere(b, a))
        .map(
            |((a, b), (failed, passed, sources))| firstpacket_report::FailingPair {
                nodes: [a.to_string(), b.to_string()],
                failed: *failed,
                passed: *passed,
                both_directions: sources.len() == 2,
            },
        )
        .collect()
}

/// Nodes that fail with nearly all their peers (diagnosis rule 6): ≥ 2 peers, and at
/// least ⌈[`NODE_BROKEN_PEER_SHARE`] × peers⌉ of them failing peers (every conclusive
/// probe between the two failed, in both directions or at least twice).
fn broken_nodes(probes: &[ProbeRecord]) -> BTreeSet<String> {
    // node → peer → whether that peer is a failing peer
    let mut peers: BTreeMap<&str, BTreeMap<&str, bool>> = BTreeMap::new();
    for ((a, b), (failed, passed, sources)) in pair_tally(probes) {
        let failing = passed == 0 && (failed >= 2 || sources.len() == 2);
        peers.entry(a).or_default().insert(b, failing);
        peers.entry(b).or_default().insert(a, failing);
    }
    peers
        .into_iter()
        .filter(|(_, ps)| {
            let n = ps.len();
            let all_failed = ps.values().filter(|f| **f).count();
            let need = (NODE_BROKEN_PEER_SHARE * n as f64).ceil() as usize;
            n >= 2 && all_failed >= need
        })
        .map(|(x, _)| x.to_string())
        .collect()
}

/// The diagnosis (rules and their order in the module docs).
pub fn diagnose(probes: &[ProbeRecord]) -> Diagnosis {
    let conclusive: Vec<&ProbeRecord> =
        probes.iter().filter(|p| p.result.is_conclusive()).collect();
    if conclusive.is_empty() {
        return Diagnosis::Inconclusive;
    }
    let bad: Vec<&ProbeRecord> = conclusive
        .iter()
        .copied()
        .filter(|p| matches!(p.result, ProbeResult::Slow | ProbeResult::Failed))
        .collect();
    if bad.is_empty() {
        let inconclusive = probes.len() - conclusive.len();
        if inconclusive > conclusive.len() {
            return Diagnosis::Inconclusive;
        }
        return Diagnosis::Healthy;
    }
    // 3, 4: a node's own checks failed.
    if bad.iter().any(|p| {
        matches!(
            p.reason,
            Some(Reason::TargetNeverReady)
                | Some(Reason::SourceNeverReady)
                | Some(Reason::EndpointNeverProgrammed)
        )
    }) {
        return Diagnosis::NodeLocalBroken;
    }
    if conclusive
        .iter()
        .any(|p| p.kind == "same_node" && p.result == ProbeResult::Failed)
    {
        return Diagnosis::NodeLocalBroken;
    }
    // 5: nearly every cross-node probe failed, not around one node.
    let cross: Vec<&ProbeRecord> = conclusive
        .iter()
        .copied()
        .filter(|p| is_cross_pair(p))
        .collect();
    let cross_failed: Vec<&ProbeRecord> = cross
        .iter()
        .copied()
        .filter(|p| p.result == ProbeResult::Failed)
        .collect();
    let cross_nodes: BTreeSet<&str> = cross
        .iter()
        .flat_map(|p| [p.source.node.as_str(), p.target.node.as_str()])
        .collect();
    let common = nodes_in_every(&cross_failed);
    let need = (CROSS_NODE_BROKEN_SHARE * cross.len() as f64).ceil() as usize;
    if cross_failed.len() >= 2
        && cross_failed.len() >= need
        && (common.is_empty() || common.len() == cross_nodes.len())
    {
        return Diagnosis::CrossNodeBroken;
    }
    // 6: a node that fails with nearly all its peers while the others work.
    let broken = broken_nodes(probes);
    if !broken.is_empty()
        && conclusive.iter().any(|p| {
            passed(p) && !broken.contains(&p.source.node) && !broken.contains(&p.target.node)
        })
        && bad
            .iter()
            .all(|p| broken.contains(&p.source.node) || broken.contains(&p.target.node))
    {
        return Diagnosis::NodeLocalBroken;
    }
    // 7: the failures follow particular node pairs.
    let pairs = failing_pairs(probes);
    if !pairs.is_empty()
        && bad
            .iter()
            .all(|p| pair_of(p).is_some_and(|(a, b)| pairs.iter().any(|fp| fp.nodes == [a, b])))
    {
        return Diagnosis::PairFailures;
    }
    // 8: the trouble follows particular nodes.
    let suspects: BTreeSet<String> = suspect_nodes(probes).into_iter().collect();
    if !suspects.is_empty()
        && bad
            .iter()
            .all(|p| suspects.contains(&p.source.node) || suspects.contains(&p.target.node))
    {
        return Diagnosis::SlowNodes;
    }
    Diagnosis::ScatteredFailures
}

/// The most frequent reason among `inconclusive` probes and its count (ties: the reason
/// declared first in [`Reason::ALL`]). `None` without inconclusive probes.
pub fn dominant_inconclusive_reason(probes: &[ProbeRecord]) -> Option<(Reason, u64)> {
    let mut counts: BTreeMap<usize, u64> = BTreeMap::new();
    for p in probes
        .iter()
        .filter(|p| p.result == ProbeResult::Inconclusive)
    {
        if let Some(i) = p
            .reason
            .and_then(|r| Reason::ALL.iter().position(|x| *x == r))
        {
            *counts.entry(i).or_default() += 1;
        }
    }
    let best = counts.values().copied().max()?;
    counts
        .into_iter()
        .find(|(_, n)| *n == best)
        .map(|(i, n)| (Reason::ALL[i], n))
}

/// `dominant reason api_error: 3 of 4 probes` when the diagnosis is `inconclusive` and
/// some probes were inconclusive; `None` otherwise.
pub fn inconclusive_note(probes: &[ProbeRecord], diagnosis: Diagnosis) -> Option<String> {
    if diagnosis != Diagnosis::Inconclusive {
        return None;
    }
    let (reason, n) = dominant_inconclusive_reason(probes)?;
    Some(format!(
        "dominant reason {}: {n} of {} probes",
        reason.as_str(),
        probes.len()
    ))
}

/// Whether `prober gate` may stop starting (and cut short) its remaining cross-node
/// pairs (kinds `cross_node`, `recreate`, `burst`), given the records so far and
/// `--max-failures`. Returns the reason text when **all** of these hold:
/// 1. the verdict is already `fail`: more `failed` probes than `max_failures` (the
///    remaining pairs cannot change the exit code);
/// 2. the `same_node` control ran and passed: ≥ 1 conclusive `same_node` probe, none
///    failed (so the node-local path works);
/// 3. ≥ 2 cross-node pairs failed with `no_success_before_give_up` (they dialed for the
///    whole give-up period and never got one answer), and no single node is common to
///    all of them (so the failures are not one node's problem — rule 5 of the
///    diagnosis);
/// 4. no cross-node pair passed.
///
/// The remaining pairs could only repeat the same give-up-long failure; the diagnosis
/// (`cross_node_broken`) and the verdict are already settled. Without `same_node` in
/// `--kinds` the gate never stops early.
pub fn early_stop(records: &[ProbeRecord], max_failures: u64) -> Option<String> {
    let conclusive: Vec<&ProbeRecord> = records
        .iter()
        .filter(|p| p.result.is_conclusive())
        .collect();
    let failed = conclusive
        .iter()
        .filter(|p| p.result == ProbeResult::Failed)
        .count() as u64;
    if failed <= max_failures {
        return None;
    }
    let same: Vec<&&ProbeRecord> = conclusive
        .iter()
        .filter(|p| p.kind == "same_node")
        .collect();
    if same.is_empty() || same.iter().any(|p| p.result == ProbeResult::Failed) {
        return None;
    }
    let cross: Vec<&ProbeRecord> = conclusive
        .iter()
        .copied()
        .filter(|p| is_cross_pair(p))
        .collect();
    if cross.iter().any(|p| passed(p)) {
        return None;
    }
    let silent: Vec<&ProbeRecord> = cross
        .iter()
        .copied()
        .filter(|p| p.reason == Some(Reason::NoSuccessBeforeGiveUp))
        .collect();
    if silent.len() < 2 || common_node(&silent).is_some() {
        return None;
    }
    let mut nodes: BTreeSet<&str> = BTreeSet::new();
    for p in &silent {
        nodes.insert(&p.source.node);
        nodes.insert(&p.target.node);
    }
    // With several paths (issue 33) the reason can be one path's while the main one
    // answered: name the silent paths then, not "the cross-node path".
    let main_silent = |p: &&ProbeRecord| {
        p.paths
            .first()
            .is_none_or(|m| m.reason == Some(Reason::NoSuccessBeforeGiveUp))
    };
    let silent_paths: BTreeSet<String> = if silent.iter().any(main_silent) {
        BTreeSet::new()
    } else {
        silent
            .iter()
            .flat_map(|p| &p.paths)
            .filter(|x| x.reason == Some(Reason::NoSuccessBeforeGiveUp))
            .map(|x| x.id().to_string())
            .collect()
    };
    let (on, what) = if silent_paths.is_empty() {
        (String::new(), "the cross-node path is".to_owned())
    } else {
        let ids = silent_paths.into_iter().collect::<Vec<_>>().join(", ");
        (
            format!(" on path(s) {ids}"),
            format!("cross-node path(s) {ids} are"),
        )
    };
    Some(format!(
        "at the stop, {} cross-node pair(s) over nodes {} had got no answer{on} within the \
         give-up period and none had passed, while {} same_node control pair(s) had \
         passed: {what} broken and the verdict is already fail; remaining cross-node pairs \
         were not run",
        silent.len(),
        nodes.into_iter().collect::<Vec<_>>().join(", "),
        same.len()
    ))
}

/// Per-kind counts and quantiles (see [`KindSummary`]).
pub fn summarize_kinds(probes: &[ProbeRecord]) -> BTreeMap<String, KindSummary> {
    let mut kinds: BTreeMap<String, Vec<ProbeRecord>> = BTreeMap::new();
    for p in probes {
        kinds.entry(p.kind.clone()).or_default().push(p.clone());
    }
    kinds
        .into_iter()
        .map(|(k, ps)| {
            let ttfps = conclusive_ttfps(&ps);
            (
                k,
                KindSummary {
                    total: ps.len() as u64,
                    by_result: ProbeResult::ALL
                        .iter()
                        .map(|r| (*r, count(&ps, *r)))
                        .collect(),
                    ttfp_p50: nearest_rank(&ttfps, 0.50),
                    ttfp_p95: nearest_rank(&ttfps, 0.95),
                    ttfp_max: nearest_rank(&ttfps, 1.0),
                    first_attempt_failures: first_attempt_failure_probes(&ps),
                },
            )
        })
        .collect()
}

/// Number of probes with first-attempt failures (`first_attempt_failures` > 0).
pub fn first_attempt_failure_probes(probes: &[ProbeRecord]) -> u64 {
    probes
        .iter()
        .filter(|p| p.first_attempt_failures > 0)
        .count() as u64
}

/// Counts, nearest-rank p50/p95/max TTFP and the diagnosis.
pub fn summarize(probes: &[ProbeRecord]) -> Summary {
    let ttfps = conclusive_ttfps(probes);
    let waits = conclusive_programming_waits(probes);
    Summary {
        total: probes.len() as u64,
        by_result: ProbeResult::ALL
            .iter()
            .map(|r| (*r, count(probes, *r)))
            .collect(),
        ttfp_p50: nearest_rank(&ttfps, 0.50),
        ttfp_p95: nearest_rank(&ttfps, 0.95),
        ttfp_max: nearest_rank(&ttfps, 1.0),
        diagnosis: diagnose(probes),
        first_attempt_failures: first_attempt_failure_probes(probes),
        by_kind: summarize_kinds(probes),
        failing_pairs: failing_pairs(probes),
        programming_wait_p50: nearest_rank(&waits, 0.50),
        programming_wait_p95: nearest_rank(&waits, 0.95),
        programming_wait_max: nearest_rank(&waits, 1.0),
    }
}

/// The programming waits (seconds; source and target, each pod once per probe) of the
/// conclusive probes, sorted.
pub fn conclusive_programming_waits(probes: &[ProbeRecord]) -> Vec<f64> {
    let mut waits: Vec<f64> = probes
        .iter()
        .filter(|p| p.result.is_conclusive())
        .filter_map(|p| p.programming.as_ref())
        .flat_map(ProbeProgramming::waits)
        .collect();
    waits.sort_by(f64::total_cmp);
    waits
}

/// Verdict, exit code and one reason line per broken threshold / run problem.
///
/// `run_errors` are run-level problems (interrupted, `--timeout`, API errors); any of
/// them makes a non-failing run inconclusive.
pub fn verdict(
    summary: &Summary,
    thresholds: &Thresholds,
    run_errors: &[String],
) -> (Verdict, i32, Vec<String>) {
    let get = |r| summary.by_result.get(&r).copied().unwrap_or(0);
    let mut fail = Vec::new();
    if let Some(p95) = summary.ttfp_p95 {
        if p95 > thresholds.max_ttfp_seconds {
            fail.push(format!(
                "TTFP p95 {p95:.3}s > --max-ttfp {:.3}s",
                thresholds.max_ttfp_seconds
            ));
        }
    }
    if let Some(p95) = summary.programming_wait_p95 {
        if p95 > thresholds.max_ttfp_seconds {
            fail.push(format!(
                "programming wait p95 {p95:.3}s > --max-ttfp {:.3}s (new pods' own path to \
                 their node, before Ready)",
                thresholds.max_ttfp_seconds
            ));
        }
    }
    let failed = get(ProbeResult::Failed);
    if failed > thresholds.max_failures {
        fail.push(format!(
            "{failed} failed probe(s) > --max-failures {}",
            thresholds.max_failures
        ));
    }
    if !fail.is_empty() {
        return (Verdict::Fail, 1, fail);
    }
    let mut inc = Vec::new();
    let inconclusive = get(ProbeResult::Inconclusive);
    if inconclusive > thresholds.max_inconclusive {
        inc.push(format!(
            "{inconclusive} inconclusive probe(s) > --max-inconclusive {}",
            thresholds.max_inconclusive
        ));
    }
    inc.extend(run_errors.iter().map(|e| format!("run error: {e}")));
    if summary.total == 0 && inc.is_empty() {
        inc.push("no probe completed".into());
    }
    if !inc.is_empty() {
        return (Verdict::Inconclusive, 2, inc);
    }
    (Verdict::Pass, 0, Vec::new())
}

fn add_stats(s: &mut NodeRoleStats, p: &ProbeRecord) {
    s.probes += 1;
    *s.by_result.entry(p.result).or_insert(0) += 1;
    if p.result.is_conclusive() {
        if let Some(t) = p.ttfp_seconds {
            s.ttfp_max = Some(s.ttfp_max.map_or(t, |m: f64| m.max(t)));
        }
    }
}

/// Per-node stats as source and as target, with the `group_by` labels of each node
/// (absent labels omitted). Every node in `nodes` appears, plus any node a probe names;
/// order: by label values (in `group_by` order), then node name.
pub fn node_summaries(
    probes: &[ProbeRecord],
    nodes: &[NodeInfo],
    group_by: &[String],
) -> Vec<NodeSummary> {
    let mut map: BTreeMap<String, NodeSummary> = BTreeMap::new();
    let labels_of = |name: &str| -> BTreeMap<String, String> {
        nodes
            .iter()
            .find(|n| n.name == name)
            .map(|n| {
                group_by
                    .iter()
                    .filter_map(|k| n.labels.get(k).map(|v| (k.clone(), v.clone())))
                    .collect()
            })
            .unwrap_or_default()
    };
    let entry = |map: &mut BTreeMap<String, NodeSummary>, name: &str| {
        if !map.contains_key(name) {
            map.insert(
                name.to_string(),
                NodeSummary {
                    node: name.to_string(),
                    labels: labels_of(name),
                    as_source: NodeRoleStats::default(),
                    as_target: NodeRoleStats::default(),
                },
            );
        }
    };
    for n in nodes {
        entry(&mut map, &n.name);
    }
    for p in probes {
        entry(&mut map, &p.source.node);
        entry(&mut map, &p.target.node);
        if let Some(s) = map.get_mut(&p.source.node) {
            add_stats(&mut s.as_source, p);
        }
        if let Some(s) = map.get_mut(&p.target.node) {
            add_stats(&mut s.as_target, p);
        }
    }
    let mut out: Vec<NodeSummary> = map.into_values().collect();
    out.sort_by(|a, b| {
        let ka: Vec<Option<&String>> = group_by.iter().map(|k| a.labels.get(k)).collect();
        let kb: Vec<Option<&String>> = group_by.iter().map(|k| b.labels.get(k)).collect();
        ka.cmp(&kb).then_with(|| a.node.cmp(&b.node))
    });
    out
}

/// Everything [`build_report`] needs besides the probes.
#[derive(Debug, Clone)]
pub struct ReportInputs {
    /// Thresholds in force.
    pub thresholds: Thresholds,
    /// Prober instance id.
    pub instance: String,
    /// RFC 3339 wall times (display only).
    pub started_at: String,
    /// RFC 3339 wall time of the end.
    pub finished_at: String,
    /// Run duration on the prober clock, seconds.
    pub duration_seconds: f64,
    /// Run-level errors.
    pub errors: Vec<String>,
    /// `--group-by-label` keys.
    pub group_by: Vec<String>,
    /// Why some probes were stopped early ([`early_stop`]), if they were.
    pub stopped_early: Option<String>,
    /// Nodes left out of the plan, with the reason.
    pub skipped_nodes: Vec<firstpacket_report::SkippedNode>,
}

/// Assembles the gate report (schema 1), computing summary, verdict and nodes.
pub fn build_report(
    probes: Vec<ProbeRecord>,
    nodes: &[NodeInfo],
    warnings: Vec<Suspect>,
    inputs: ReportInputs,
) -> GateReport {
    let summary = summarize(&probes);
    let (verdict, exit_code, mut verdict_reasons) =
        verdict(&summary, &inputs.thresholds, &inputs.errors);
    if verdict != Verdict::Pass {
        if let Some(note) = inconclusive_note(&probes, summary.diagnosis) {
            verdict_reasons.push(format!("diagnosis inconclusive: {note}"));
        }
    }
    GateReport {
        schema: SCHEMA_VERSION,
        verdict,
        exit_code,
        verdict_reasons,
        thresholds: inputs.thresholds,
        nodes: node_summaries(&probes, nodes, &inputs.group_by),
        summary,
        warnings,
        probes,
        instance: inputs.instance,
        started_at: inputs.started_at,
        finished_at: inputs.finished_at,
        duration_seconds: inputs.duration_seconds,
        errors: inputs.errors,
        stopped_early: inputs.stopped_early,
        skipped_nodes: inputs.skipped_nodes,
        agents: None,
        api_outages: Vec::new(),
        baseline: None,
    }
}

/// Puts the comparison with `--baseline` into `report`: a regression makes the verdict
/// `fail` (exit 1, which takes precedence over inconclusive), with one
/// `verdict_reasons` line per regressed kind or node naming its numbers; a comparison
/// without regression leaves the verdict as it was.
pub fn apply_baseline(report: &mut GateReport, cmp: firstpacket_report::BaselineComparison) {
    if cmp.regressed {
        let lines: Vec<String> = crate::baseline::regression_lines(&cmp)
            .into_iter()
            .map(|l| format!("baseline regression: {l}"))
            .collect();
        if report.verdict != Verdict::Fail {
            report.verdict = Verdict::Fail;
            report.exit_code = 1;
        }
        let mut reasons = lines;
        reasons.append(&mut report.verdict_reasons);
        report.verdict_reasons = reasons;
    }
    report.baseline = Some(cmp);
}

/// The text section of the baseline comparison (empty without one): the compared
/// quantile and thresholds, one line per kind and node, the warnings.
pub fn render_baseline_text(report: &GateReport) -> String {
    let Some(c) = &report.baseline else {
        return String::new();
    };
    let mut out = format!(
        "\nbaseline comparison ({} vs the baseline saved {}; regression: ratio >= {} and +{:.3}s):\n",
        c.quantile, c.saved_at, c.ratio, c.floor_seconds
    );
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}s"));
    for e in &c.entries {
        let what = match &e.node {
            Some(n) => format!("  {} {n}", e.kind),
            None => format!("{} (all nodes)", e.kind),
        };
        out.push_str(&format!(
            "  {what:<28} now {:>9} (n={:<3}) baseline {:>9} (n={:<3}) ratio {:>6}  {}\n",
            f(e.current_seconds),
            e.current_samples,
            f(e.baseline_seconds),
            e.baseline_samples,
            e.ratio.map_or("-".into(), |r| format!("{r:.2}")),
            if e.regressed { "REGRESSED" } else { "ok" }
        ));
    }
    for w in &c.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

/// What a gate run knows about its node-agent scrapes at the end, gathered from the
/// `crate::agents::scrape::AgentWatcher` (discovery index, scrape counts, observation
/// history, proxy fallbacks). Input of [`agents_report`]; plain data so the summary is
/// tested without I/O.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentScrapeFacts {
    /// `--agent-scrape` as given (`auto`, `direct`, `proxy`).
    pub scrape_mode: String,
    /// Enabled profiles, in configuration order (empty: correlation off).
    pub profiles: Vec<String>,
    /// Discovered agent pods as (profile, node).
    pub agents: Vec<(String, String)>,
    /// Scrapes by (profile, result) for the whole run; `result` is `ok` or a failure
    /// reason (`AgentWatcher::scrape_counts`).
    pub counts: BTreeMap<(String, String), u64>,
    /// Per (profile, node) in the kept observation history: (successful, failed) scrapes.
    pub node_outcomes: BTreeMap<(String, String), (u64, u64)>,
    /// (profile, node) pairs that went over to the API server's pod proxy (auto mode).
    pub via_proxy: Vec<(String, String)>,
}

/// The report's `agents` object from [`AgentScrapeFacts`] (pure). One entry per enabled
/// profile (and any other profile that shows up in the facts), with zero counts for a
/// profile whose agent was not found.
pub fn agents_report(f: &AgentScrapeFacts) -> firstpacket_report::AgentsReport {
    use firstpacket_report::{AgentProfileReport, AgentsReport};
    let mut profiles: BTreeMap<String, AgentProfileReport> = f
        .profiles
        .iter()
        .map(|p| (p.clone(), AgentProfileReport::default()))
        .collect();
    let mut nodes: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (p, n) in &f.agents {
        nodes.entry(p.as_str()).or_default().insert(n.as_str());
        profiles.entry(p.clone()).or_default();
    }
    for (p, set) in &nodes {
        if let Some(r) = profiles.get_mut(*p) {
            r.nodes_with_agent = set.len() as u64;
        }
    }
    for ((p, result), n) in &f.counts {
        let r = profiles.entry(p.clone()).or_default();
        if result == "ok" {
            r.scrapes_ok += n;
        } else {
            r.scrapes_failed += n;
            *r.failures.entry(result.clone()).or_default() += n;
        }
    }
    for ((p, _node), (ok, failed)) in &f.node_outcomes {
        let r = profiles.entry(p.clone()).or_default();
        if ok + failed > 0 {
            r.nodes_scraped += 1;
        }
        if *ok > 0 {
            r.nodes_ok += 1;
        }
    }
    let proxied: BTreeSet<&(String, String)> = f.via_proxy.iter().collect();
    for (p, _node) in proxied {
        profiles.entry(p.clone()).or_default().nodes_via_proxy += 1;
    }
    AgentsReport {
        scrape_mode: f.scrape_mode.clone(),
        profiles,
    }
}

/// Whether a scrape failure reason means an unreadable page (`agent_bad_metrics`) rather
/// than an unreachable agent; the same split as `crate::agents::scrape::ScrapeError::signal`.
fn is_bad_metrics_reason(reason: &str) -> bool {
    matches!(
        reason,
        "too_large" | "not_utf8" | "parse" | "no_signal_metrics"
    )
}

/// The one-line text summary of the report's `agents` object, printed after the
/// warnings, e.g. `node agents (scrape auto): calico-felix 3/3 nodes scraped ok;
/// kube-proxy 0/3 nodes scraped ok (6 failed scrapes: unreachable: connect); not found:
/// aws-node, cilium-agent`. `x/y` = nodes with a successful scrape / nodes scraped.
pub fn agents_line(r: &firstpacket_report::AgentsReport) -> String {
    let head = format!("node agents (scrape {})", r.scrape_mode);
    if r.profiles.is_empty() {
        return format!("{head}: correlation off (every agent profile disabled)");
    }
    let mut parts = Vec::new();
    let mut not_found = Vec::new();
    for (name, p) in &r.profiles {
        if p.nodes_with_agent == 0 && p.scrapes_ok + p.scrapes_failed == 0 {
            not_found.push(name.as_str());
            continue;
        }
        let mut s = format!("{name} {}/{} nodes scraped ok", p.nodes_ok, p.nodes_scraped);
        if p.nodes_with_agent > p.nodes_scraped {
            let _ = write!(
                s,
                ", {} other node(s) with an agent not scraped",
                p.nodes_with_agent - p.nodes_scraped
            );
        }
        if p.nodes_via_proxy > 0 {
            let _ = write!(s, ", {} via the API server's pod proxy", p.nodes_via_proxy);
        }
        if p.scrapes_failed > 0 {
            let (bad, unreachable): (Vec<&String>, Vec<&String>) =
                p.failures.keys().partition(|k| is_bad_metrics_reason(k));
            let mut kinds = Vec::new();
            for (label, reasons) in [("unreachable", unreachable), ("bad metrics", bad)] {
                if !reasons.is_empty() {
                    let rs: Vec<&str> = reasons.iter().map(|r| r.as_str()).collect();
                    kinds.push(format!("{label}: {}", rs.join(", ")));
                }
            }
            let _ = write!(
                s,
                " ({} failed scrape(s): {})",
                p.scrapes_failed,
                kinds.join("; ")
            );
        }
        parts.push(s);
    }
    if parts.is_empty() {
        return format!(
            "{head}: no agent pods found (searched {})",
            not_found.join(", ")
        );
    }
    let mut line = format!("{head}: {}", parts.join("; "));
    if !not_found.is_empty() {
        let _ = write!(line, "; not found: {}", not_found.join(", "));
    }
    line
}

/// `0.31s`, or `-` when absent.
pub fn fmt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}s"))
}

/// The stderr progress line for a finished probe:
/// `[3/12] node-1 → node-2 success 0.31s` (plus the reason when not a success).
pub fn progress_line(done: usize, total: usize, p: &ProbeRecord) -> String {
    let mut s = format!(
        "[{done}/{total}] {} {} → {} {}",
        p.kind,
        p.source.node,
        p.target.node,
        p.result.as_str()
    );
    if let Some(t) = p.ttfp_seconds {
        let _ = write!(s, " {t:.2}s");
    }
    if let Some(r) = p.reason {
        let _ = write!(s, " ({})", r.as_str());
    }
    s
}

fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = widths[i].saturating_sub(c.chars().count());
                format!("{c}{}", " ".repeat(pad))
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The JSON string of a diagnosis (`cross_node_broken`, …).
fn diagnosis_str(d: Diagnosis) -> String {
    serde_json::to_value(d)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// The kind the headline leads with: the first of `cross_node`, `recreate`, `service`,
/// `burst`, `unprobed`, `policy`, `policy_change` that ran, else `same_node` (the control: it only leads when it
/// ran alone).
pub fn main_kind(summary: &Summary) -> Option<&str> {
    [
        "cross_node",
        "recreate",
        "service",
        "burst",
        "unprobed",
        "policy",
        "policy_change",
        "same_node",
    ]
    .into_iter()
    .find(|k| summary.by_kind.contains_key(*k))
    .or_else(|| summary.by_kind.keys().next().map(String::as_str))
}

/// `cross_node: 6 probe(s): success 0, slow 0, failed 2, inconclusive 4; 6 without a
/// TTFP; TTFP p50 -  p95 -  max -`. `no_ttfp` = probes that add no TTFP to the
/// quantiles (not conclusive, or no success seen).
fn counts_line(label: &str, by: &BTreeMap<ProbeResult, u64>, total: u64, no_ttfp: u64) -> String {
    let g = |r| by.get(&r).copied().unwrap_or(0);
    format!(
        "{label}: {total} probe(s): success {}, slow {}, failed {}, inconclusive {}; {no_ttfp} without a TTFP",
        g(ProbeResult::Success),
        g(ProbeResult::Slow),
        g(ProbeResult::Failed),
        g(ProbeResult::Inconclusive),
    )
}

fn quantiles(p50: Option<f64>, p95: Option<f64>, max: Option<f64>) -> String {
    format!(
        "TTFP p50 {}  p95 {}  max {}",
        fmt_secs(p50),
        fmt_secs(p95),
        fmt_secs(max)
    )
}

/// The summary lines under the probe table: the main kind ([`main_kind`]) first with
/// its counts, how many of its probes have no TTFP, and its quantiles; then the other
/// kinds (`same_node` marked as the control); then, with more than one kind, all probes
/// together (the quantiles `--max-ttfp` is checked against); then how many probes
/// needed retries after Ready before their first success, and whether those were all
/// `success` (a fact on a healthy run, not a warning).
pub fn render_headline(report: &GateReport) -> String {
    let s = &report.summary;
    let mut out = String::new();
    let no_ttfp = |kind: Option<&str>| -> u64 {
        let ps: Vec<ProbeRecord> = report
            .probes
            .iter()
            .filter(|p| kind.is_none_or(|k| p.kind == k))
            .cloned()
            .collect();
        (ps.len() - conclusive_ttfps(&ps).len()) as u64
    };
    let main = main_kind(s).map(str::to_string);
    let mut kinds: Vec<&String> = s.by_kind.keys().collect();
    kinds.sort_by_key(|k| Some(k.as_str()) != main.as_deref());
    for k in kinds {
        let ks = &s.by_kind[k];
        let label = if k == "same_node" && s.by_kind.len() > 1 {
            "same_node (control)".to_string()
        } else {
            k.clone()
        };
        let _ = writeln!(
            out,
            "{}; {}",
            counts_line(&label, &ks.by_result, ks.total, no_ttfp(Some(k))),
            quantiles(ks.ttfp_p50, ks.ttfp_p95, ks.ttfp_max)
        );
    }
    if s.by_kind.len() != 1 {
        let _ = writeln!(
            out,
            "{}; {}",
            counts_line("all kinds", &s.by_result, s.total, no_ttfp(None)),
            quantiles(s.ttfp_p50, s.ttfp_p95, s.ttfp_max)
        );
    }
    if s.first_attempt_failures > 0 {
        // Retries after Ready are part of every TTFP: a fact, a concern only when those
        // probes were not `success` (issue 31: a healthy PASS read as a problem).
        let retried = || {
            report
                .probes
                .iter()
                .filter(|p| p.first_attempt_failures > 0)
        };
        let bad = retried()
            .filter(|p| p.result != ProbeResult::Success)
            .count();
        let tail = if bad == 0 {
            "all of them success (their TTFP includes the retries)".to_string()
        } else {
            format!("{bad} of them slow or failed")
        };
        let _ = writeln!(
            out,
            "first connections after Ready: {} of {} probe(s) needed retries before their first success; {tail}",
            s.first_attempt_failures, s.total
        );
    }
    out.push_str(&programming_lines(report));
    out
}

/// Where the new pods' delay was (issue 29): the programming wait's quantiles (the pods'
/// own path to their node, measured in the pods, before Ready), how many probes had
/// their delay before Ready (the CNI gated readiness) and how many after (in TTFP), and
/// the nodes whose own pods waited over `--slow-threshold`, were never programmed or
/// never Ready (crate `blame`: the same evidence the JUnit node cases and `--baseline`
/// read). Empty when no wait was measured.
pub fn programming_lines(report: &GateReport) -> String {
    let s = &report.summary;
    let mut out = String::new();
    if s.programming_wait_max.is_none() {
        return out;
    }
    let (mut before, mut after) = (0, 0);
    let mut slow: BTreeMap<&str, u64> = BTreeMap::new();
    for p in &report.probes {
        match p.programming.as_ref().and_then(|g| g.readiness_gated) {
            Some(true) => before += 1,
            Some(false) => after += 1,
            None => {}
        }
        // Every own-pod reason (crate `blame`): a pod never Ready is one its node never
        // let the kubelet reach, on a gating CNI one it never programmed.
        if let Some(nodes) = crate::blame::own_blame(p) {
            for n in nodes {
                *slow.entry(n).or_default() += 1;
            }
        }
    }
    let _ = writeln!(
        out,
        "programming wait (a new pod's own path to its node, before Ready): p50 {}  p95 {}  max {}",
        fmt_secs(s.programming_wait_p50),
        fmt_secs(s.programming_wait_p95),
        fmt_secs(s.programming_wait_max)
    );
    if before + after > 0 {
        let _ = writeln!(
            out,
            "where the delay was: {before} probe(s) before Ready (the CNI held the new pod \
             until programmed), {after} after Ready (in TTFP)"
        );
    }
    if !slow.is_empty() {
        let list: Vec<String> = slow.iter().map(|(n, c)| format!("{n} ({c})")).collect();
        let _ = writeln!(
            out,
            "pods waiting over --slow-threshold (or never programmed, or never Ready) for their node's dataplane: {}",
            list.join(", ")
        );
    }
    out
}

/// The human-readable end-of-run text for stdout: probe table, summary
/// ([`render_headline`]: main kind first), the diagnosis line (`diagnosis: X`, except
/// that a `healthy` diagnosis under a FAIL/INCONCLUSIVE verdict reads `diagnosis: no
/// slow or failed probe …`, so the two lines never contradict), `failing node pairs:
/// a↔b (2 failed, both directions, 0 passed), …` when [`failing_pairs`] found any, the
/// early stop, skipped nodes, agent findings ([`render_agent_findings`]), per-node
/// table, verdict and its reasons.
pub fn render_text(report: &GateReport, group_by: &[String]) -> String {
    let mut out = probes_table(&report.probes, report.stopped_early.is_some());
    let s = &report.summary;
    out.push('\n');
    out.push_str(&render_headline(report));
    out.push_str(&diagnosis_lines(report));
    out.push_str(&isolation_lines(&report.probes));
    out.push_str(&crate::paths::text_lines(&report.probes));
    if let Some(why) = &report.stopped_early {
        let _ = writeln!(out, "stopped early: {why}");
    }
    if !report.skipped_nodes.is_empty() {
        let s: Vec<String> = report
            .skipped_nodes
            .iter()
            .map(|n| format!("{} ({})", n.node, n.reason))
            .collect();
        let _ = writeln!(out, "nodes not probed: {}", s.join(", "));
    }
    let suspects = suspect_nodes(&report.probes);
    if !suspects.is_empty() && s.diagnosis != firstpacket_report::Diagnosis::Healthy {
        let _ = writeln!(
            out,
            "nodes with only slow/failed probes: {}",
            suspects.join(", ")
        );
    }

    out.push_str(&render_agent_findings(report));
    if let Some(a) = &report.agents {
        let _ = writeln!(out, "\n{}", agents_line(a));
    }

    out.push('\n');
    out.push_str(&nodes_table(&report.nodes, group_by));
    let v = match report.verdict {
        Verdict::Pass => "PASS",
        Verdict::Fail => "FAIL",
        Verdict::Inconclusive => "INCONCLUSIVE",
    };
    let _ = writeln!(out, "\nverdict: {v} (exit {})", report.exit_code);
    for r in &report.verdict_reasons {
        let _ = writeln!(out, "  - {r}");
    }
    out
}

/// The security finding of the NetworkPolicy kinds (issue 32): `SECURITY: NetworkPolicy
/// isolation breached in N probe(s)`, then each breach's kind, nodes and detail (at most
/// 5, then a count); empty without a breach.
pub fn isolation_lines(probes: &[ProbeRecord]) -> String {
    let breaches: Vec<&ProbeRecord> = probes
        .iter()
        .filter(|p| p.reason == Some(Reason::IsolationBreach))
        .collect();
    if breaches.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "SECURITY: NetworkPolicy isolation breached in {} probe(s): a pod that a policy isolates answered a peer no policy admits\n",
        breaches.len()
    );
    for p in breaches.iter().take(5) {
        let _ = writeln!(
            out,
            "  - {} {} → {}: {}",
            p.kind,
            p.source.node,
            p.target.node,
            p.detail.as_deref().unwrap_or("")
        );
    }
    if breaches.len() > 5 {
        let _ = writeln!(
            out,
            "  … and {} more (listed in the report)",
            breaches.len() - 5
        );
    }
    out
}

/// One row per probe (kind, source → target, TTFP, result, reason), sorted by kind and
/// nodes.
/// One row per probe, sorted by kind, source and target. After an early stop
/// (`stopped_early`), the probes it interrupted are one line under the table rather than
/// rows (issue 31: S4's table had 11 of 16 rows `inconclusive interrupted` around the
/// failures that mattered); the report keeps every probe.
fn probes_table(probes: &[ProbeRecord], stopped_early: bool) -> String {
    let cut = |p: &&ProbeRecord| stopped_early && p.reason == Some(Reason::Interrupted);
    let hidden = probes.iter().filter(cut).count();
    let shown: Vec<ProbeRecord> = if hidden > 0 && hidden < probes.len() {
        probes.iter().filter(|p| !cut(p)).cloned().collect()
    } else {
        probes.to_vec()
    };
    let mut out = probe_rows(&shown);
    if shown.len() < probes.len() {
        let _ = writeln!(
            out,
            "… and {hidden} probe(s) interrupted by the early stop (inconclusive/interrupted; \
             listed in the report)"
        );
    }
    out
}

fn probe_rows(probes: &[ProbeRecord]) -> String {
    let mut rows = vec![vec![
        "KIND".to_string(),
        "SOURCE NODE".to_string(),
        "→".into(),
        "TARGET NODE".into(),
        "TTFP".into(),
        "RESULT".into(),
        "REASON".into(),
    ]];
    let mut sorted: Vec<&ProbeRecord> = probes.iter().collect();
    sorted.sort_by(|a, b| {
        (
            a.kind.as_str(),
            a.source.node.as_str(),
            a.target.node.as_str(),
        )
            .cmp(&(
                b.kind.as_str(),
                b.source.node.as_str(),
                b.target.node.as_str(),
            ))
    });
    for p in sorted {
        rows.push(vec![
            p.kind.clone(),
            p.source.node.clone(),
            "→".into(),
            p.target.node.clone(),
            fmt_secs(p.ttfp_seconds),
            p.result.as_str().into(),
            p.reason.map_or("", |r| r.as_str()).into(),
        ]);
    }
    table(&rows)
}

/// The diagnosis line (never contradicting the verdict) and the failing node pairs.
fn diagnosis_lines(report: &GateReport) -> String {
    let s = &report.summary;
    let mut out = String::new();
    let diag = diagnosis_str(s.diagnosis);
    let note = inconclusive_note(&report.probes, s.diagnosis);
    match (note, s.diagnosis, report.verdict) {
        (Some(note), _, _) => {
            let _ = writeln!(out, "diagnosis: {diag} ({note})");
        }
        // `healthy` next to FAIL/INCONCLUSIVE would contradict the verdict line.
        (None, Diagnosis::Healthy, Verdict::Fail | Verdict::Inconclusive) => {
            let _ = writeln!(
                out,
                "diagnosis: no slow or failed probe (every conclusive probe passed \
                 --slow-threshold); the verdict below comes from its reasons"
            );
        }
        (None, _, _) => {
            let _ = writeln!(out, "diagnosis: {diag}");
        }
    }
    if !s.failing_pairs.is_empty() {
        let pairs: Vec<String> = s
            .failing_pairs
            .iter()
            .map(|fp| {
                format!(
                    "{}↔{} ({} failed{}, {} passed)",
                    fp.nodes[0],
                    fp.nodes[1],
                    fp.failed,
                    if fp.both_directions {
                        ", both directions"
                    } else {
                        ""
                    },
                    fp.passed
                )
            })
            .collect();
        let _ = writeln!(out, "failing node pairs: {}", pairs.join(", "));
    }
    out
}

/// One row per node: its `group_by` labels, and as source and as target the
/// ok/bad/inconclusive counts and the largest TTFP.
fn nodes_table(nodes: &[NodeSummary], group_by: &[String]) -> String {
    let mut header = vec!["NODE".to_string()];
    header.extend(group_by.iter().map(|k| k.to_uppercase()));
    header.extend(
        [
            "AS SOURCE ok/bad/inc",
            "MAX TTFP",
            "AS TARGET ok/bad/inc",
            "MAX TTFP",
        ]
        .map(String::from),
    );
    let mut nrows = vec![header];
    let triple = |st: &NodeRoleStats| {
        let g = |r| st.by_result.get(&r).copied().unwrap_or(0);
        format!(
            "{}/{}/{}",
            g(ProbeResult::Success),
            g(ProbeResult::Slow) + g(ProbeResult::Failed),
            g(ProbeResult::Inconclusive)
        )
    };
    for n in nodes {
        let mut r = vec![n.node.clone()];
        r.extend(
            group_by
                .iter()
                .map(|k| n.labels.get(k).cloned().unwrap_or_else(|| "-".into())),
        );
        r.push(triple(&n.as_source));
        r.push(fmt_secs(n.as_source.ttfp_max));
        r.push(triple(&n.as_target));
        r.push(fmt_secs(n.as_target.ttfp_max));
        nrows.push(r);
    }
    table(&nrows)
}

/// The key number(s) of an agent finding's evidence, as `name value` pairs joined by
/// `, ` (the field names are those of `agents::correlate`): apply mean vs the healthy
/// half / own history, failures per second, resyncs, route resync mean, restart
/// markers, or the reason and message (with the profile's hint) of an unreachable /
/// bad-metrics agent.
pub fn evidence_line(evidence: &serde_json::Value) -> String {
    const KEYS: &[&str] = &[
        "apply_mean_seconds",
        "healthy_half_apply_mean_seconds",
        "own_history_apply_mean_seconds",
        "failures_per_second",
        "failures_in_window",
        "healthy_half_failures_per_second",
        "resyncs_in_window",
        "route_resync_mean_seconds",
        "healthy_half_route_resync_mean_seconds",
        "restart_count_before",
        "restart_count_after",
        "pod_uid_changed",
        "counter_decreased",
        "window_seconds",
        "seconds_since_last_scrape",
        "reason",
        "profile",
        "profiles",
        "scrape_path",
        "seen_in_probes",
        "message",
    ];
    let mut parts = Vec::new();
    // `profiles: [p]` repeats `profile p`: show the list only when it says more.
    let single_profile = evidence
        .get("profiles")
        .and_then(|v| v.as_array())
        .is_some_and(|a| a.len() == 1 && evidence.get("profile") == a.first());
    for k in KEYS {
        if *k == "profiles" && single_profile {
            continue;
        }
        match evidence.get(*k) {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Number(n)) => match n.as_f64() {
                Some(v) if v.fract() != 0.0 => parts.push(format!("{k} {v:.3}")),
                _ => parts.push(format!("{k} {n}")),
            },
            Some(serde_json::Value::String(v)) => parts.push(format!("{k} {v}")),
            Some(v) => parts.push(format!("{k} {v}")),
        }
    }
    parts.join(", ")
}

/// The `suspects:` (slow/failed probes only) and `warnings:` sections of the text
/// output. Suspects: one line per (node, signal), with how many probes named it, their
/// results and the roles the node had in them, and the key numbers ([`evidence_line`])
/// of the first such probe in the report, e.g. `node-2  dataplane_apply_slow  in 3
/// probe(s) (slow 2, failed 1; as target 2, as source 1): apply_mean_seconds 1.250, …`.
/// Warnings: one line per finding. Empty when there are none.
pub fn render_agent_findings(report: &GateReport) -> String {
    #[derive(Default)]
    struct Seen<'a> {
        probes: BTreeSet<&'a str>,
        results: BTreeMap<&'static str, u64>,
        roles: BTreeMap<String, u64>,
        evidence: Option<&'a serde_json::Value>,
    }
    let mut out = String::new();
    let mut by: BTreeMap<(&str, String), Seen<'_>> = BTreeMap::new();
    for p in &report.probes {
        for s in &p.suspects {
            let e = by
                .entry((s.node.as_str(), signal_str(s.signal)))
                .or_default();
            if e.probes.insert(p.id.as_str()) {
                *e.results.entry(p.result.as_str()).or_default() += 1;
            }
            *e.roles.entry(role_str(s.role)).or_default() += 1;
            e.evidence.get_or_insert(&s.evidence);
        }
    }
    if !by.is_empty() {
        out.push_str("\nsuspects (node agents, in slow/failed probes):\n");
        for ((node, signal), e) in &by {
            let results: Vec<String> = e.results.iter().map(|(r, n)| format!("{r} {n}")).collect();
            let roles: Vec<String> = e.roles.iter().map(|(r, n)| format!("as {r} {n}")).collect();
            let _ = writeln!(
                out,
                "  {node:<14} {signal:<25} in {} probe(s) ({}; {}): {}",
                e.probes.len(),
                results.join(", "),
                roles.join(", "),
                e.evidence.map(evidence_line).unwrap_or_default()
            );
        }
    }
    if !report.warnings.is_empty() {
        out.push_str("\nwarnings (node agents; not a failure by themselves):\n");
        for w in &report.warnings {
            let _ = writeln!(
                out,
                "  {:<14} {:<25} {}",
                w.node,
                signal_str(w.signal),
                evidence_line(&w.evidence)
            );
            // A warning merged over several agent profiles: each profile's own story.
            if let Some(by) = w.evidence.get("by_profile").and_then(|b| b.as_object()) {
                if by.len() > 1 {
                    for (profile, ev) in by {
                        let _ = writeln!(out, "      {profile}: {}", evidence_line(ev));
                    }
                }
            }
        }
    }
    out
}

fn signal_str(s: firstpacket_report::Signal) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn role_str(r: firstpacket_report::Role) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report inputs of a 10 s run with the default thresholds.
    fn inputs() -> ReportInputs {
        ReportInputs {
            thresholds: th(),
            instance: "gate-abcdefgh".into(),
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: "2026-01-01T00:00:10Z".into(),
            duration_seconds: 10.0,
            errors: vec![],
            group_by: vec![],
            stopped_early: None,
            skipped_nodes: Vec::new(),
        }
    }
    use firstpacket_report::{Attempts, Hold, PodRef, Timeline};

    fn rec(src: &str, dst: &str, result: ProbeResult, ttfp: Option<f64>) -> ProbeRecord {
        let reason = match result {
            ProbeResult::Success => None,
            ProbeResult::Slow => Some(Reason::TtfpOverThreshold),
            ProbeResult::Failed => Some(Reason::NoSuccessBeforeGiveUp),
            ProbeResult::Inconclusive => Some(Reason::ImagePull),
        };
        ProbeRecord {
            id: format!("{src}-{dst}"),
            kind: "cross_node".into(),
            source: PodRef {
                node: src.into(),
                pod: "s".into(),
                ..Default::default()
            },
            target: PodRef {
                node: dst.into(),
                pod: "t".into(),
                ..Default::default()
            },
            result,
            reason,
            detail: None,
            ttfp_seconds: ttfp,
            raw_ttfp_seconds: ttfp,
            target_ready_to_source_ready_seconds: None,
            attempts: Attempts::default(),
            hold: Hold::default(),
            timeline: Timeline::default(),
            suspects: vec![],
            source_report: None,
            first_attempt_failures: 0,
            pre_ready_attempt_failures: 0,
            programming: None,
            api_writes: 4,
            recreate: None,
            burst: None,
            service: None,
            policy: None,
            paths: Vec::new(),
            drift: None,
        }
    }

    /// A record of `kind` (`same_node` pins both pods to `src`).
    fn krec(kind: &str, src: &str, dst: &str, result: ProbeResult) -> ProbeRecord {
        let mut r = rec(
            src,
            dst,
            result,
            matches!(result, ProbeResult::Success).then_some(0.2),
        );
        r.kind = kind.into();
        r
    }

    fn th() -> Thresholds {
        Thresholds {
            slow_threshold_seconds: 5.0,
            max_ttfp_seconds: 5.0,
            max_failures: 0,
            max_inconclusive: 0,
        }
    }

    #[test]
    fn nearest_rank_picks_measured_values() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 0.5), Some(10.0));
        assert_eq!(nearest_rank(&v, 0.95), Some(19.0));
        assert_eq!(nearest_rank(&v, 1.0), Some(20.0));
        assert_eq!(nearest_rank(&[3.0, 1.0, 2.0], 0.5), Some(2.0));
        assert_eq!(nearest_rank(&[0.7], 0.95), Some(0.7));
        assert_eq!(nearest_rank(&[], 0.5), None);
        // n=10, p95 → rank 10 (ceil 9.5).
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 0.95), Some(10.0));
    }

    #[test]
    fn verdict_and_exit_codes_table() {
        use ProbeResult::*;
        struct Case {
            name: &'static str,
            probes: Vec<ProbeRecord>,
            errors: Vec<String>,
            want: (Verdict, i32),
        }
        let ok = |a: &str, b: &str, t| rec(a, b, Success, Some(t));
        let cases = vec![
            Case {
                name: "all fast",
                probes: vec![ok("a", "b", 0.3), ok("b", "a", 0.4)],
                errors: vec![],
                want: (Verdict::Pass, 0),
            },
            Case {
                name: "p95 over max-ttfp",
                probes: vec![ok("a", "b", 0.3), rec("b", "a", Slow, Some(9.0))],
                errors: vec![],
                want: (Verdict::Fail, 1),
            },
            Case {
                name: "one failure",
                probes: vec![ok("a", "b", 0.3), rec("b", "a", Failed, None)],
                errors: vec![],
                want: (Verdict::Fail, 1),
            },
            Case {
                name: "inconclusive only",
                probes: vec![ok("a", "b", 0.3), rec("b", "a", Inconclusive, None)],
                errors: vec![],
                want: (Verdict::Inconclusive, 2),
            },
            Case {
                name: "failure beats inconclusive and run error",
                probes: vec![
                    rec("a", "b", Failed, None),
                    rec("b", "a", Inconclusive, None),
                ],
                errors: vec!["interrupted".into()],
                want: (Verdict::Fail, 1),
            },
            Case {
                name: "run error with good probes",
                probes: vec![ok("a", "b", 0.3)],
                errors: vec!["--timeout reached".into()],
                want: (Verdict::Inconclusive, 2),
            },
            Case {
                name: "no probes",
                probes: vec![],
                errors: vec![],
                want: (Verdict::Inconclusive, 2),
            },
        ];
        for c in cases {
            let s = summarize(&c.probes);
            let (v, code, reasons) = verdict(&s, &th(), &c.errors);
            assert_eq!((v, code), c.want, "{}", c.name);
            assert_eq!(reasons.is_empty(), v == Verdict::Pass, "{}", c.name);
        }
    }

    fn programming_slow(src: &str, dst: &str, source_wait: f64, target_wait: f64) -> ProbeRecord {
        let w = |wait: f64| {
            Some(firstpacket_report::ProgrammingWait {
                method: firstpacket_report::ProgrammingMethod::NodeDial,
                wait_seconds: wait,
                resolution_seconds: 0.1,
                over_threshold: wait > 5.0,
            })
        };
        let mut p = rec(src, dst, ProbeResult::Success, Some(0.0));
        if source_wait > 5.0 || target_wait > 5.0 {
            p.result = ProbeResult::Slow;
            p.reason = Some(Reason::EndpointProgrammingSlow);
        }
        p.programming = Some(firstpacket_report::ProbeProgramming {
            source: w(source_wait),
            target: w(target_wait),
            readiness_gated: Some(source_wait.max(target_wait) > 1.0),
        });
        p
    }

    #[test]
    fn programming_waits_blame_only_their_own_nodes_and_fail_the_gate_on_p95() {
        // b and c program late; a and d are healthy but every probe of a has b or c as
        // its other end.
        let probes = vec![
            programming_slow("a", "b", 0.05, 7.0),
            programming_slow("c", "a", 7.2, 0.05),
            programming_slow("b", "d", 7.1, 0.05),
            programming_slow("d", "c", 0.05, 6.9),
            programming_slow("d", "a", 0.05, 0.05),
            programming_slow("b", "c", 7.0, 7.1),
        ];
        assert_eq!(
            suspect_nodes(&probes),
            vec!["b".to_string(), "c".to_string()]
        );
        assert_eq!(diagnose(&probes), Diagnosis::SlowNodes);
        let s = summarize(&probes);
        assert_eq!(s.programming_wait_max, Some(7.2));
        let (v, code, reasons) = verdict(&s, &th(), &[]);
        assert_eq!((v, code), (Verdict::Fail, 1), "{reasons:?}");
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with("programming wait p95 7.")),
            "{reasons:?}"
        );
        let report = build_report(probes, &[], vec![], inputs());
        assert_eq!(report.exit_code, 1);
        let text = programming_lines(&report);
        assert!(text.contains("5 probe(s) before Ready"), "{text}");
        assert!(text.contains("b (3), c (3)"), "{text}");
    }

    /// A source never programmed blames its own node only, and is node-local.
    #[test]
    fn a_never_programmed_source_blames_its_node_alone() {
        let never = |s: &str, t: &str| {
            let mut p = rec(s, t, ProbeResult::Failed, None);
            p.reason = Some(Reason::EndpointNeverProgrammed);
            p
        };
        let probes = vec![
            never("b", "a"),
            never("b", "c"),
            rec("a", "b", ProbeResult::Success, Some(0.1)),
            rec("c", "a", ProbeResult::Success, Some(0.1)),
            rec("a", "c", ProbeResult::Success, Some(0.1)),
        ];
        assert_eq!(suspect_nodes(&probes), Vec::<String>::new());
        let probes = vec![never("b", "a"), never("b", "c"), never("b", "a")];
        assert_eq!(suspect_nodes(&probes), vec!["b".to_string()]);
        assert_eq!(diagnose(&probes), Diagnosis::NodeLocalBroken);
        let report = build_report(probes, &[], vec![], inputs());
        assert_eq!(report.exit_code, 1);
    }

    #[test]
    fn thresholds_are_respected() {
        let probes = vec![
            rec("a", "b", ProbeResult::Failed, None),
            rec("b", "a", ProbeResult::Inconclusive, None),
            rec("a", "c", ProbeResult::Slow, Some(6.0)),
            rec("c", "a", ProbeResult::Success, Some(0.2)),
        ];
        let mut t = th();
        t.max_failures = 1;
        t.max_inconclusive = 1;
        t.max_ttfp_seconds = 10.0;
        let (v, code, _) = verdict(&summarize(&probes), &t, &[]);
        assert_eq!((v, code), (Verdict::Pass, 0));
    }

    #[test]
    fn diagnosis_rules() {
        use ProbeResult::*;
        let ok = |a: &str, b: &str| rec(a, b, Success, Some(0.2));
        assert_eq!(diagnose(&[ok("a", "b"), ok("b", "a")]), Diagnosis::Healthy);
        assert_eq!(
            diagnose(&[rec("a", "b", Inconclusive, None)]),
            Diagnosis::Inconclusive
        );
        // Node c is slow in both roles; all other pairs fine.
        let ring = vec![
            ok("a", "b"),
            ok("b", "d"),
            rec("d", "c", Slow, Some(9.0)),
            rec("c", "a", Slow, Some(8.0)),
        ];
        assert_eq!(diagnose(&ring), Diagnosis::SlowNodes);
        assert_eq!(suspect_nodes(&ring), vec!["c".to_string()]);
        // b fails with both its peers (each way), the pair without b works: b's own path.
        let one_node = vec![
            rec("a", "b", Failed, None),
            rec("b", "a", Failed, None),
            rec("b", "c", Failed, None),
            rec("c", "b", Failed, None),
            ok("c", "a"),
            ok("a", "c"),
        ];
        assert_eq!(diagnose(&one_node), Diagnosis::NodeLocalBroken);
        // One failure each way through b, one pass: the trouble follows b (slow_nodes,
        // the weakest claim about a node), but one failure per peer is too few to call
        // b's own path broken.
        let small = vec![
            rec("a", "b", Failed, None),
            rec("b", "c", Failed, None),
            ok("c", "a"),
        ];
        assert_eq!(diagnose(&small), Diagnosis::SlowNodes);
        // A single bad probe blames neither of its nodes.
        assert_eq!(
            diagnose(&[rec("a", "b", Failed, None), ok("c", "a"), ok("a", "c")]),
            Diagnosis::ScatteredFailures
        );
        // Every cross pair fails; no node is common to all failures.
        let broken = vec![
            rec("a", "b", Failed, None),
            rec("b", "c", Failed, None),
            rec("c", "a", Failed, None),
        ];
        assert_eq!(diagnose(&broken), Diagnosis::CrossNodeBroken);
        let mut never = rec("a", "b", Failed, None);
        never.reason = Some(Reason::TargetNeverReady);
        assert_eq!(
            diagnose(&[never, ok("b", "c"), ok("c", "a")]),
            Diagnosis::NodeLocalBroken
        );
        let scattered = vec![
            ok("a", "b"),
            rec("b", "c", Slow, Some(7.0)),
            ok("c", "d"),
            ok("d", "a"),
            ok("a", "c"),
            ok("c", "b"),
        ];
        assert_eq!(diagnose(&scattered), Diagnosis::ScatteredFailures);
    }

    #[test]
    fn mostly_inconclusive_run_is_not_called_healthy() {
        use ProbeResult::*;
        let ok = |a: &str, b: &str| rec(a, b, Success, Some(0.2));
        let api = |a: &str, b: &str| {
            let mut r = rec(a, b, Inconclusive, None);
            r.reason = Some(Reason::ApiError);
            r
        };
        // 1 pass, 3 inconclusive (2 api_error, 1 image_pull): not healthy.
        let mostly = vec![
            ok("a", "b"),
            api("b", "c"),
            api("c", "d"),
            rec("d", "a", Inconclusive, None),
        ];
        assert_eq!(diagnose(&mostly), Diagnosis::Inconclusive);
        assert_eq!(
            dominant_inconclusive_reason(&mostly),
            Some((Reason::ApiError, 2))
        );
        // Half inconclusive, every conclusive probe passed: still healthy.
        assert_eq!(
            diagnose(&[ok("a", "b"), ok("b", "c"), api("c", "d"), api("d", "a")]),
            Diagnosis::Healthy
        );
        let report = build_report(mostly, &[], vec![], inputs());
        assert_eq!(report.verdict, Verdict::Inconclusive);
        assert_eq!(report.summary.diagnosis, Diagnosis::Inconclusive);
        assert!(
            report
                .verdict_reasons
                .iter()
                .any(|r| r.contains("dominant reason api_error: 2 of 4 probes")),
            "{:?}",
            report.verdict_reasons
        );
        let text = render_text(&report, &[]);
        assert!(
            text.contains("diagnosis: inconclusive (dominant reason api_error: 2 of 4 probes)"),
            "{text}"
        );
    }

    /// Every ordered cross-node pair over `nodes` (`failed` where `fail(src, dst)`),
    /// plus one passing `same_node` control per node when `controls`.
    fn mesh(nodes: &[&str], controls: bool, fail: impl Fn(&str, &str) -> bool) -> Vec<ProbeRecord> {
        let mut out = Vec::new();
        if controls {
            out.extend(
                nodes
                    .iter()
                    .map(|n| krec("same_node", n, n, ProbeResult::Success)),
            );
        }
        for a in nodes {
            for b in nodes.iter().filter(|b| *b != a) {
                let r = if fail(a, b) {
                    ProbeResult::Failed
                } else {
                    ProbeResult::Success
                };
                out.push(krec("cross_node", a, b, r));
            }
        }
        out
    }

    const N4: [&str; 4] = ["n1", "n2", "n3", "n4"];

    fn is_pair(a: &str, b: &str, x: &str, y: &str) -> bool {
        (a == x && b == y) || (a == y && b == x)
    }

    #[test]
    fn one_pair_broken_both_ways_is_pair_failures_naming_the_pair() {
        for controls in [true, false] {
            let s6 = mesh(&N4, controls, |a, b| is_pair(a, b, "n1", "n3"));
            assert_eq!(
                diagnose(&s6),
                Diagnosis::PairFailures,
                "controls {controls}"
            );
            let pairs = failing_pairs(&s6);
            assert_eq!(
                pairs,
                vec![firstpacket_report::FailingPair {
                    nodes: ["n1".into(), "n3".into()],
                    failed: 2,
                    passed: 0,
                    both_directions: true,
                }]
            );
            assert_eq!(summarize(&s6).failing_pairs, pairs);
        }
        // Two pairs broken (n1↔n3, n2↔n4): each node still passes with its other peers.
        let two = mesh(&N4, true, |a, b| {
            is_pair(a, b, "n1", "n3") || is_pair(a, b, "n2", "n4")
        });
        assert_eq!(diagnose(&two), Diagnosis::PairFailures);
        assert_eq!(failing_pairs(&two).len(), 2);
        // The same direction failing twice (a second lap) counts as a pair too.
        let mut twice = mesh(&N4, true, |a, b| a == "n1" && b == "n3");
        twice.push(krec("cross_node", "n1", "n3", ProbeResult::Failed));
        assert_eq!(diagnose(&twice), Diagnosis::PairFailures);
        let fp = &failing_pairs(&twice)[0];
        assert_eq!((fp.failed, fp.both_directions), (2, false));
        // One failure on the pair is no pattern: scattered, no pair listed.
        let once = mesh(&N4, true, |a, b| a == "n1" && b == "n3");
        assert_eq!(diagnose(&once), Diagnosis::ScatteredFailures);
        assert!(failing_pairs(&once).is_empty());
        // Rule 5 of old (one node in every failure, both roles) no longer calls a pair a
        // broken node, and half a mesh failing is not the cross-node path.
        assert_ne!(diagnose(&two), Diagnosis::NodeLocalBroken);
    }

    #[test]
    fn a_node_failing_with_nearly_all_peers_is_node_local_but_with_some_is_pairs() {
        // n2 fails with every peer, both ways; n1, n3, n4 pass among themselves.
        let all = mesh(&N4, true, |a, b| a == "n2" || b == "n2");
        assert_eq!(diagnose(&all), Diagnosis::NodeLocalBroken);
        assert!(
            failing_pairs(&all).is_empty(),
            "n2 passes with no other peer"
        );
        // n2 fails with n1 and n3 but passes with n4: two failing pairs, not n2 broken.
        let some = mesh(&N4, true, |a, b| {
            is_pair(a, b, "n2", "n1") || is_pair(a, b, "n2", "n3")
        });
        assert_eq!(diagnose(&some), Diagnosis::PairFailures);
        // 6 nodes: n1 fails with 4 of its 5 peers (80 %): broken; with 3 of 5: pairs.
        let n6 = ["n1", "n2", "n3", "n4", "n5", "n6"];
        let four = mesh(&n6, true, |a, b| {
            (a == "n1" || b == "n1") && a != "n6" && b != "n6"
        });
        assert_eq!(diagnose(&four), Diagnosis::NodeLocalBroken);
        let three = mesh(&n6, true, |a, b| {
            (a == "n1" || b == "n1") && !["n5", "n6"].contains(&a) && !["n5", "n6"].contains(&b)
        });
        assert_eq!(diagnose(&three), Diagnosis::PairFailures);
        // A broken node plus a failure it is not in: mixed, no strong claim.
        let mut mixed = all.clone();
        let i = mixed
            .iter()
            .position(|p| p.source.node == "n3" && p.target.node == "n4")
            .expect("n3→n4");
        mixed[i].result = ProbeResult::Failed;
        mixed[i].reason = Some(Reason::NoSuccessBeforeGiveUp);
        assert_eq!(diagnose(&mixed), Diagnosis::ScatteredFailures);
    }

    #[test]
    fn cross_node_broken_takes_nearly_every_conclusive_cross_pair() {
        use ProbeResult::*;
        // S4: every cross pair fails, controls pass.
        let s4 = mesh(&N4, true, |_, _| true);
        assert_eq!(diagnose(&s4), Diagnosis::CrossNodeBroken);
        assert!(
            failing_pairs(&s4).is_empty(),
            "no node passes with any peer"
        );
        // 11 of 12 (92 %): still the path.
        let eleven = mesh(&N4, true, |a, b| !(a == "n1" && b == "n2"));
        assert_eq!(diagnose(&eleven), Diagnosis::CrossNodeBroken);
        // 10 of 12 (83 %, below 90 %): not called the cross-node path.
        let ten = mesh(&N4, true, |a, b| !is_pair(a, b, "n1", "n2"));
        assert_ne!(diagnose(&ten), Diagnosis::CrossNodeBroken);
        // About half of the pairs fail at random (stale routes for new pod IPs), each
        // node passing with some peer: neither the path nor a pair nor a node.
        let half = mesh(&N4, true, |a, b| {
            matches!(
                (a, b),
                ("n1", "n2")
                    | ("n2", "n3")
                    | ("n3", "n4")
                    | ("n4", "n1")
                    | ("n1", "n3")
                    | ("n4", "n2")
            )
        });
        assert_eq!(diagnose(&half), Diagnosis::ScatteredFailures);
        // Early stop: 2 failed pairs sharing no node, the rest interrupted (they do not
        // count), controls passed.
        let mut stopped: Vec<ProbeRecord> = N4
            .iter()
            .map(|n| krec("same_node", n, n, Success))
            .collect();
        stopped.push(krec("cross_node", "n1", "n2", Failed));
        stopped.push(krec("cross_node", "n3", "n4", Failed));
        for (a, b) in [("n2", "n3"), ("n4", "n1"), ("n1", "n3"), ("n2", "n4")] {
            let mut r = krec("cross_node", a, b, Inconclusive);
            r.reason = Some(Reason::Interrupted);
            stopped.push(r);
        }
        assert_eq!(diagnose(&stopped), Diagnosis::CrossNodeBroken);
        // Small samples: one failed cross pair, or two sharing a node, are no pattern.
        let one = vec![
            krec("same_node", "n1", "n1", Success),
            krec("cross_node", "n1", "n2", Failed),
        ];
        assert_eq!(diagnose(&one), Diagnosis::ScatteredFailures);
        let shared = vec![
            krec("same_node", "n1", "n1", Success),
            krec("cross_node", "n1", "n2", Failed),
            krec("cross_node", "n3", "n1", Failed),
        ];
        assert_eq!(diagnose(&shared), Diagnosis::ScatteredFailures);
        // Two nodes, both directions failing, control passing: the whole cross-node path.
        let two_nodes = mesh(&["n1", "n2"], true, |_, _| true);
        assert_eq!(diagnose(&two_nodes), Diagnosis::CrossNodeBroken);
    }

    #[test]
    fn mixed_patterns_list_the_pairs_but_claim_no_single_cause() {
        use ProbeResult::*;
        // n1↔n3 broken and, elsewhere, n2→n4 slow: the pair is listed, the slow probe is
        // not explained by it.
        let mut mixed = mesh(&N4, true, |a, b| is_pair(a, b, "n1", "n3"));
        let i = mixed
            .iter()
            .position(|p| p.source.node == "n2" && p.target.node == "n4")
            .expect("n2→n4");
        mixed[i] = rec("n2", "n4", Slow, Some(8.0));
        assert_eq!(diagnose(&mixed), Diagnosis::ScatteredFailures);
        let report = build_report(mixed, &[], vec![], inputs());
        assert_eq!(report.summary.failing_pairs.len(), 1);
        let text = render_text(&report, &[]);
        assert!(
            text.contains("failing node pairs: n1↔n3 (2 failed, both directions, 0 passed)"),
            "{text}"
        );
        assert!(text.contains("diagnosis: scattered_failures"), "{text}");
        // A failed same-node control outranks a pair pattern.
        let mut local = mesh(&N4, true, |a, b| is_pair(a, b, "n1", "n3"));
        local[0].result = Failed;
        local[0].reason = Some(Reason::NoSuccessBeforeGiveUp);
        assert_eq!(diagnose(&local), Diagnosis::NodeLocalBroken);
    }

    #[test]
    fn text_leads_with_the_main_kind_its_failures_and_probes_without_ttfp() {
        use ProbeResult::*;
        // S4 after the early stop: controls fast, cross pairs failed or interrupted.
        let mut probes: Vec<ProbeRecord> = N4
            .iter()
            .map(|n| {
                let mut r = krec("same_node", n, n, Success);
                r.ttfp_seconds = Some(0.4);
                r
            })
            .collect();
        probes.push(krec("cross_node", "n1", "n2", Failed));
        probes.push(krec("cross_node", "n3", "n4", Failed));
        for (a, b) in [("n2", "n3"), ("n4", "n1")] {
            let mut r = krec("cross_node", a, b, Inconclusive);
            r.reason = Some(Reason::Interrupted);
            probes.push(r);
        }
        let report = build_report(probes, &[], vec![], inputs());
        let text = render_text(&report, &[]);
        let after_table: Vec<&str> = text.lines().skip_while(|l| !l.is_empty()).skip(1).collect();
        assert_eq!(
            after_table[0],
            "cross_node: 4 probe(s): success 0, slow 0, failed 2, inconclusive 2; 4 without a TTFP; TTFP p50 -  p95 -  max -",
            "{text}"
        );
        assert!(
            after_table[1].starts_with("same_node (control): 4 probe(s): success 4"),
            "{text}"
        );
        assert!(
            after_table[2].starts_with("all kinds: 8 probe(s)"),
            "{text}"
        );
        assert!(
            after_table[2].contains("4 without a TTFP; TTFP p50 0.40s"),
            "{text}"
        );
        assert!(text.contains("diagnosis: cross_node_broken"), "{text}");
        // One kind: its line is the headline, no "all kinds" line.
        let one = build_report(mesh(&N4, false, |_, _| false), &[], vec![], inputs());
        let text = render_text(&one, &[]);
        assert!(text.contains("\ncross_node: 12 probe(s): success 12, slow 0, failed 0, inconclusive 0; 0 without a TTFP; TTFP p50 0.20s"), "{text}");
        assert!(!text.contains("all kinds"), "{text}");
    }

    #[test]
    fn healthy_is_never_printed_next_to_fail_or_inconclusive() {
        use ProbeResult::*;
        // --slow-threshold 10s --max-ttfp 2s: every probe a success at 3 s, p95 fails.
        let probes = vec![
            rec("a", "b", Success, Some(3.0)),
            rec("b", "a", Success, Some(3.0)),
        ];
        let mut inp = inputs();
        inp.thresholds.slow_threshold_seconds = 10.0;
        inp.thresholds.max_ttfp_seconds = 2.0;
        let report = build_report(probes.clone(), &[], vec![], inp);
        assert_eq!(
            (report.verdict, report.summary.diagnosis),
            (Verdict::Fail, Diagnosis::Healthy)
        );
        let text = render_text(&report, &[]);
        assert!(!text.contains("diagnosis: healthy"), "{text}");
        assert!(
            text.contains("diagnosis: no slow or failed probe"),
            "{text}"
        );
        // One inconclusive of three: verdict inconclusive, diagnosis healthy in JSON.
        let mut probes = probes;
        probes.push(rec("a", "c", Inconclusive, None));
        let report = build_report(probes.clone(), &[], vec![], inputs());
        assert_eq!(report.verdict, Verdict::Inconclusive);
        let text = render_text(&report, &[]);
        assert!(!text.contains("diagnosis: healthy"), "{text}");
        // A passing run says healthy.
        probes.pop();
        let report = build_report(probes, &[], vec![], inputs());
        assert_eq!(report.verdict, Verdict::Pass);
        assert!(render_text(&report, &[]).contains("diagnosis: healthy"));
    }

    #[test]
    fn suspects_print_one_line_per_node_and_signal_with_the_probes_counted() {
        use firstpacket_report::{Role, Signal, Suspect};
        let sus = |node: &str, role, v: f64| Suspect {
            node: node.into(),
            role,
            signal: Signal::DataplaneApplySlow,
            evidence: serde_json::json!({"apply_mean_seconds": v, "profile": "calico-felix"}),
        };
        let mut probes = Vec::new();
        for (i, (a, b, role)) in [
            ("n1", "n2", Role::Target),
            ("n2", "n3", Role::Source),
            ("n4", "n2", Role::Target),
        ]
        .into_iter()
        .enumerate()
        {
            let mut r = rec(a, b, ProbeResult::Slow, Some(7.0));
            r.id = format!("p{i}");
            r.suspects.push(sus("n2", role, 1.25 + i as f64));
            probes.push(r);
        }
        probes[2].result = ProbeResult::Failed;
        probes[2].ttfp_seconds = None;
        let report = build_report(probes, &[], vec![], inputs());
        let text = render_text(&report, &[]);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("dataplane_apply_slow"))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        let l = lines[0];
        assert!(l.trim_start().starts_with("n2"), "{l}");
        assert!(
            l.contains("in 3 probe(s) (failed 1, slow 2; as source 1, as target 2)"),
            "{l}"
        );
        assert!(l.contains("apply_mean_seconds 1.250"), "{l}");
        assert!(
            !l.contains("p0") && !l.contains("probe p"),
            "no probe ids: {l}"
        );
        assert!(!text.contains("DESIGN"), "{text}");
    }

    #[test]
    fn probes_interrupted_by_an_early_stop_are_one_line_not_rows() {
        let mut probes = mesh(&N4, false, |_, _| false);
        for p in probes.iter_mut().skip(2) {
            p.result = ProbeResult::Inconclusive;
            p.reason = Some(Reason::Interrupted);
            p.ttfp_seconds = None;
        }
        let mut inp = inputs();
        inp.stopped_early = Some("cross-node pairs got no answer".into());
        let text = render_text(&build_report(probes.clone(), &[], vec![], inp), &[]);
        let rows = text.lines().filter(|l| l.ends_with(" interrupted")).count();
        assert_eq!(rows, 0, "{text}");
        assert!(
            text.contains("… and 10 probe(s) interrupted by the early stop"),
            "{text}"
        );
        // Without an early stop every probe is a row.
        let text = render_text(&build_report(probes, &[], vec![], inputs()), &[]);
        let rows = text.lines().filter(|l| l.ends_with(" interrupted")).count();
        assert_eq!(rows, 10, "{text}");
    }

    #[test]
    fn first_attempt_counts_print_as_a_plain_fact() {
        let mut probes = mesh(&N4, false, |_, _| false);
        for p in probes.iter_mut().take(3) {
            p.first_attempt_failures = 4;
        }
        let report = build_report(probes, &[], vec![], inputs());
        let text = render_text(&report, &[]);
        assert!(
            text.contains(
                "first connections after Ready: 3 of 12 probe(s) needed retries before \
                 their first success; all of them success"
            ),
            "{text}"
        );
        let mut probes = mesh(&N4, false, |_, _| false);
        probes[0].first_attempt_failures = 4;
        probes[0].result = ProbeResult::Slow;
        probes[0].reason = Some(Reason::TtfpOverThreshold);
        let text = render_text(&build_report(probes, &[], vec![], inputs()), &[]);
        assert!(text.contains("1 of them slow or failed"), "{text}");
        assert!(!text.contains("first-attempt failures"), "{text}");
    }

    #[test]
    fn same_node_contrast_decides_between_cross_node_and_node_local() {
        use ProbeResult::*;
        let mut s4: Vec<ProbeRecord> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| krec("same_node", n, n, Success))
            .collect();
        s4.extend([
            krec("cross_node", "a", "b", Failed),
            krec("cross_node", "c", "d", Failed),
            krec("cross_node", "b", "c", Failed),
            krec("cross_node", "d", "a", Failed),
        ]);
        assert_eq!(diagnose(&s4), Diagnosis::CrossNodeBroken);
        // The same cross failures, but node c's control pair fails too: node-local.
        let mut local = s4.clone();
        local[2].result = Failed;
        local[2].reason = Some(Reason::NoSuccessBeforeGiveUp);
        assert_eq!(diagnose(&local), Diagnosis::NodeLocalBroken);
    }

    #[test]
    fn early_stop_needs_a_settled_verdict_a_passing_control_and_spread_failures() {
        use ProbeResult::*;
        let same = |n: &str| krec("same_node", n, n, Success);
        let cross = |a: &str, b: &str| krec("cross_node", a, b, Failed);
        let base = vec![same("a"), same("b"), cross("a", "b"), cross("c", "d")];
        let why = early_stop(&base, 0).expect("certain");
        assert!(why.contains("2 cross-node pair(s)"), "{why}");
        assert!(why.contains("a, b, c, d"), "{why}");
        // Verdict not settled yet: --max-failures 5.
        assert_eq!(early_stop(&base, 5), None);
        // Only one failure so far.
        assert_eq!(early_stop(&base[..3], 0), None);
        // Failures share node b: could be b's problem.
        let shared = vec![same("a"), cross("a", "b"), cross("b", "c")];
        assert_eq!(early_stop(&shared, 0), None);
        // No control ran.
        assert_eq!(early_stop(&base[2..], 0), None);
        // Control failed.
        let mut bad_control = base.clone();
        bad_control[0].result = Failed;
        bad_control[0].reason = Some(Reason::NoSuccessBeforeGiveUp);
        assert_eq!(early_stop(&bad_control, 0), None);
        // A cross pair passed.
        let mut one_ok = base.clone();
        one_ok.push(krec("cross_node", "d", "a", Success));
        assert_eq!(early_stop(&one_ok, 0), None);
        // Failed for another reason (lost after success): not evidence of a dead path.
        let mut lost = base.clone();
        lost[3].reason = Some(Reason::LostAfterSuccess);
        assert_eq!(early_stop(&lost, 0), None);
        // Several paths, the main one answered: the silent paths are named.
        let path = |id: &str, result, reason| {
            firstpacket_report::PathResult::new(id.parse().unwrap(), result, reason, None)
        };
        let mut udp = base.clone();
        for p in udp.iter_mut().filter(|p| p.kind == "cross_node") {
            p.reason = Some(Reason::NoSuccessBeforeGiveUp);
            p.paths = vec![
                path("tcp/ipv4/small", Success, None),
                path(
                    "udp/ipv4/small",
                    Failed,
                    Some(Reason::NoSuccessBeforeGiveUp),
                ),
            ];
        }
        let why = early_stop(&udp, 0).expect("certain");
        assert!(
            why.contains("no answer on path(s) udp/ipv4/small")
                && why.contains("cross-node path(s) udp/ipv4/small are broken"),
            "{why}"
        );
        // The main path silent too: the cross-node path as a whole.
        udp[2].paths[0] = path(
            "tcp/ipv4/small",
            Failed,
            Some(Reason::NoSuccessBeforeGiveUp),
        );
        let why = early_stop(&udp, 0).expect("certain");
        assert!(why.contains("the cross-node path is broken"), "{why}");
    }

    #[test]
    fn summary_counts_per_kind_and_first_attempt_failures() {
        use ProbeResult::*;
        let mut a = krec("same_node", "a", "a", Success);
        a.first_attempt_failures = 2;
        let probes = vec![
            a,
            krec("same_node", "b", "b", Success),
            krec("cross_node", "a", "b", Failed),
        ];
        let s = summarize(&probes);
        assert_eq!(s.first_attempt_failures, 1);
        assert_eq!(s.by_kind.len(), 2);
        assert_eq!(s.by_kind["same_node"].total, 2);
        assert_eq!(s.by_kind["same_node"].first_attempt_failures, 1);
        assert_eq!(s.by_kind["same_node"].ttfp_p95, Some(0.2));
        assert_eq!(s.by_kind["cross_node"].by_result[&Failed], 1);
        assert_eq!(s.by_kind["cross_node"].ttfp_p50, None);
    }

    #[test]
    fn node_summaries_count_roles_and_group_by_label() {
        let mk = |name: &str, zone: &str| NodeInfo {
            name: name.into(),
            labels: [("zone".to_string(), zone.to_string())]
                .into_iter()
                .collect(),
            ready: true,
            unschedulable: false,
            taints: vec![],
        };
        let nodes = vec![mk("n1", "z2"), mk("n2", "z1"), mk("n3", "z1")];
        let probes = vec![
            rec("n1", "n2", ProbeResult::Success, Some(0.5)),
            rec("n2", "n3", ProbeResult::Slow, Some(6.0)),
            rec("n3", "n1", ProbeResult::Inconclusive, None),
        ];
        let ns = node_summaries(&probes, &nodes, &["zone".to_string()]);
        let order: Vec<_> = ns.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(order, ["n2", "n3", "n1"]);
        let n2 = &ns[0];
        assert_eq!(n2.labels["zone"], "z1");
        assert_eq!(n2.as_source.probes, 1);
        assert_eq!(n2.as_source.ttfp_max, Some(6.0));
        assert_eq!(n2.as_target.by_result[&ProbeResult::Success], 1);
        let n1 = &ns[2];
        assert_eq!(n1.as_target.by_result[&ProbeResult::Inconclusive], 1);
        assert_eq!(n1.as_target.ttfp_max, None);
    }

    #[test]
    fn report_json_round_trips_and_text_names_verdict() {
        let probes = vec![
            rec("n1", "n2", ProbeResult::Success, Some(0.31)),
            rec("n2", "n1", ProbeResult::Failed, None),
        ];
        let report = build_report(probes, &[], vec![], inputs());
        assert_eq!(report.exit_code, 1);
        assert_eq!(report.summary.by_result[&ProbeResult::Inconclusive], 0);
        let json = serde_json::to_string_pretty(&report).expect("json");
        let back: GateReport = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, report);
        let v: serde_json::Value = serde_json::from_str(&json).expect("value");
        assert_eq!(v["verdict"], "fail");
        // One failure of two probes: no pattern is certain.
        assert_eq!(v["summary"]["diagnosis"], "scattered_failures");
        assert_eq!(v["summary"]["failing_pairs"], serde_json::json!([]));
        assert_eq!(v["probes"][1]["reason"], "no_success_before_give_up");
        let text = render_text(&report, &[]);
        assert!(text.contains("verdict: FAIL (exit 1)"));
        let row = text
            .lines()
            .find(|l| l.starts_with("cross_node  n1 ") && l.contains("→"))
            .expect("probe row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells, ["cross_node", "n1", "→", "n2", "0.31s", "success"]);
        assert_eq!(
            progress_line(1, 2, &report.probes[0]),
            "[1/2] cross_node n1 → n2 success 0.31s"
        );
    }

    #[test]
    fn text_lists_agent_suspects_and_warnings_with_their_key_numbers() {
        use firstpacket_report::{Role, Signal, Suspect};
        let mut slow = rec("n1", "n2", ProbeResult::Failed, None);
        slow.suspects.push(Suspect {
            node: "n2".into(),
            role: Role::Target,
            signal: Signal::DataplaneApplySlow,
            evidence: serde_json::json!({
                "apply_mean_seconds": 1.25,
                "healthy_half_apply_mean_seconds": 0.004,
                "profile": "calico-felix"
            }),
        });
        let warning = Suspect {
            node: "n3".into(),
            role: Role::Source,
            signal: Signal::AgentUnreachable,
            evidence: serde_json::json!({"reason": "connect", "profile": "kube-proxy"}),
        };
        let report = build_report(vec![slow], &[], vec![warning], inputs());
        let text = render_text(&report, &[]);
        let line = text
            .lines()
            .find(|l| l.contains("dataplane_apply_slow"))
            .expect("suspect line");
        assert!(line.trim_start().starts_with("n2"), "{line}");
        assert!(line.contains("target"), "{line}");
        assert!(line.contains("apply_mean_seconds 1.250"), "{line}");
        assert!(
            line.contains("healthy_half_apply_mean_seconds 0.004"),
            "{line}"
        );
        let w = text
            .lines()
            .find(|l| l.contains("agent_unreachable"))
            .expect("warning line");
        assert!(w.trim_start().starts_with("n3"), "{w}");
        assert!(w.contains("reason connect"), "{w}");
        assert!(text.contains("warnings (node agents"), "{text}");
        let empty = build_report(
            vec![rec("n1", "n2", ProbeResult::Success, Some(0.2))],
            &[],
            vec![],
            inputs(),
        );
        assert_eq!(render_agent_findings(&empty), "");
    }

    fn facts() -> AgentScrapeFacts {
        let pn = |p: &str, n: &str| (p.to_string(), n.to_string());
        let mut counts = BTreeMap::new();
        counts.insert(pn("calico-felix", "ok"), 9);
        counts.insert(pn("kube-proxy", "connect"), 6);
        counts.insert(pn("kube-proxy", "parse"), 1);
        let mut node_outcomes = BTreeMap::new();
        for n in ["n1", "n2", "n3"] {
            node_outcomes.insert(pn("calico-felix", n), (3, 0));
        }
        node_outcomes.insert(pn("kube-proxy", "n1"), (0, 3));
        node_outcomes.insert(pn("kube-proxy", "n2"), (0, 4));
        AgentScrapeFacts {
            scrape_mode: "auto".into(),
            profiles: ["calico-felix", "cilium-agent", "kube-proxy", "aws-node"]
                .map(String::from)
                .to_vec(),
            agents: vec![
                pn("calico-felix", "n1"),
                pn("calico-felix", "n2"),
                pn("calico-felix", "n3"),
                pn("kube-proxy", "n1"),
                pn("kube-proxy", "n2"),
                pn("kube-proxy", "n3"),
                pn("kube-proxy", "n3"),
            ],
            counts,
            node_outcomes,
            via_proxy: vec![pn("calico-felix", "n2"), pn("calico-felix", "n2")],
        }
    }

    #[test]
    fn agents_report_counts_nodes_scrapes_and_failures_per_profile() {
        let r = agents_report(&facts());
        assert_eq!(r.scrape_mode, "auto");
        assert_eq!(
            r.profiles.keys().collect::<Vec<_>>(),
            vec!["aws-node", "calico-felix", "cilium-agent", "kube-proxy"]
        );
        let felix = &r.profiles["calico-felix"];
        assert_eq!(
            (
                felix.nodes_with_agent,
                felix.scrapes_ok,
                felix.scrapes_failed
            ),
            (3, 9, 0)
        );
        assert_eq!((felix.nodes_scraped, felix.nodes_ok), (3, 3));
        assert_eq!(felix.nodes_via_proxy, 1, "one node counted once");
        let kp = &r.profiles["kube-proxy"];
        // Two pods of one profile on n3 still count one node.
        assert_eq!(
            (kp.nodes_with_agent, kp.scrapes_ok, kp.scrapes_failed),
            (3, 0, 7)
        );
        assert_eq!((kp.nodes_scraped, kp.nodes_ok), (2, 0));
        assert_eq!(kp.failures.get("connect"), Some(&6));
        assert_eq!(kp.failures.get("parse"), Some(&1));
        let aws = &r.profiles["aws-node"];
        assert_eq!(aws, &firstpacket_report::AgentProfileReport::default());
    }

    #[test]
    fn agents_line_names_each_profile_its_failures_and_the_missing_ones() {
        let line = agents_line(&agents_report(&facts()));
        assert!(line.starts_with("node agents (scrape auto): "), "{line}");
        assert!(line.contains("calico-felix 3/3 nodes scraped ok"), "{line}");
        assert!(line.contains("1 via the API server's pod proxy"), "{line}");
        assert!(
            line.contains(
                "kube-proxy 0/2 nodes scraped ok, 1 other node(s) with an agent not scraped"
            ),
            "{line}"
        );
        assert!(
            line.contains("7 failed scrape(s): unreachable: connect; bad metrics: parse"),
            "{line}"
        );
        assert!(
            line.ends_with("not found: aws-node, cilium-agent"),
            "{line}"
        );
        assert!(!line.contains('\n'), "one line: {line}");
    }

    #[test]
    fn agents_line_says_when_correlation_is_off_or_nothing_was_found() {
        let off = agents_report(&AgentScrapeFacts {
            scrape_mode: "direct".into(),
            ..Default::default()
        });
        assert!(off.profiles.is_empty());
        let json = serde_json::to_value(&off).expect("json");
        assert_eq!(json["profiles"], serde_json::json!({}));
        assert_eq!(json["scrape_mode"], "direct");
        assert!(agents_line(&off).contains("correlation off"));
        let none = agents_report(&AgentScrapeFacts {
            scrape_mode: "proxy".into(),
            profiles: vec!["calico-felix".into(), "aws-node".into()],
            ..Default::default()
        });
        assert_eq!(
            agents_line(&none),
            "node agents (scrape proxy): no agent pods found (searched aws-node, calico-felix)"
        );
    }

    #[test]
    fn text_output_prints_the_agents_line_after_the_warnings_only_when_known() {
        let mk = || {
            build_report(
                vec![rec("n1", "n2", ProbeResult::Success, Some(0.2))],
                &[],
                vec![Suspect {
                    node: "n3".into(),
                    role: firstpacket_report::Role::Source,
                    signal: firstpacket_report::Signal::AgentUnreachable,
                    evidence: serde_json::json!({"reason": "connect"}),
                }],
                inputs(),
            )
        };
        let without = render_text(&mk(), &[]);
        assert!(!without.contains("node agents ("), "{without}");
        let mut report = mk();
        report.agents = Some(agents_report(&facts()));
        let text = render_text(&report, &[]);
        let warn = text.find("warnings (node agents").expect("warnings");
        let line = text.find("node agents (scrape auto)").expect("agents line");
        assert!(line > warn, "{text}");
    }

    #[test]
    fn a_warning_merged_over_two_profiles_prints_each_profile() {
        let mut r = build_report(
            vec![rec("n1", "n2", ProbeResult::Success, Some(0.2))],
            &[],
            vec![],
            inputs(),
        );
        r.warnings.push(Suspect {
            node: "node-2".into(),
            role: firstpacket_report::Role::Source,
            signal: firstpacket_report::Signal::AgentUnreachable,
            evidence: serde_json::json!({
                "reason": "refused", "profiles": ["calico-felix", "kube-proxy"],
                "by_profile": {
                    "calico-felix": {"reason": "timeout", "scrape_path": "direct"},
                    "kube-proxy": {"reason": "refused", "scrape_path": "proxy"},
                },
            }),
        });
        let text = render_agent_findings(&r);
        assert!(
            text.contains("      calico-felix: reason timeout, scrape_path direct"),
            "{text}"
        );
        let one = evidence_line(
            &serde_json::json!({"profile": "kube-proxy", "profiles": ["kube-proxy"]}),
        );
        assert_eq!(one, "profile kube-proxy");
        assert!(
            text.contains("      kube-proxy: reason refused, scrape_path proxy"),
            "{text}"
        );
    }

    #[test]
    fn isolation_breaches_are_named_as_a_security_finding() {
        let mut probes = vec![krec("policy", "node-1", "node-2", ProbeResult::Success)];
        assert_eq!(isolation_lines(&probes), "");
        let mut b = krec("policy", "node-1", "node-3", ProbeResult::Failed);
        b.reason = Some(Reason::IsolationBreach);
        b.detail = Some("isolation breach: pod fp-x-i …".into());
        probes.push(b);
        let text = isolation_lines(&probes);
        assert!(
            text.starts_with("SECURITY: NetworkPolicy isolation breached in 1 probe(s)"),
            "{text}"
        );
        assert!(
            text.contains("policy node-1 → node-3: isolation breach: pod fp-x-i"),
            "{text}"
        );
    }
}
