//! The gate's `--junit FILE`: JUnit XML for CI systems (Jenkins, GitLab, GitHub
//! actions' test reporters, `junitparser`). Pure: the report in, XML text out.
//!
//! Shape (the de-facto JUnit schema those consumers read: `testsuites` >
//! `testsuite` > `testcase` with an optional `failure message=…` or `skipped`,
//! <https://github.com/testmoapp/junitxml>): one `testsuite` named `firstpacket gate`,
//! and in it
//!
//! - per probe kind in the run, `classname="firstpacket.kind"`, `name=<kind>`: fails
//!   when the kind has `failed` probes, its TTFP p95 is over `--max-ttfp`, or the
//!   baseline comparison regressed for it;
//! - per node probed, `classname="firstpacket.node"`, `name=<node>`: fails when the
//!   baseline comparison regressed for it, when it is slow with every peer (its best
//!   peer's p95 — crate `baseline` module docs, "Per-node attribution" — is over
//!   `--max-ttfp`), or when every conclusive probe touching it was slow or failed (at
//!   least 2; the gate's `slow_nodes` rule), so a healthy node probed with slow peers
//!   passes;
//! - one `classname="firstpacket.baseline"`, `name="baseline comparison"`: fails on a
//!   regression, `skipped` without `--baseline` (or when the run ended with an error);
//! - when the run ended with an error (the report's `errors[]`, exit 2: API
//!   unreachable, `--timeout`, a bad `--baseline` file…), one
//!   `classname="firstpacket.run"`, `name="run"` failing with those errors.
//!
//! Failure messages carry the numbers; the failure body lists the slow/failed probes
//! concerned with their suspects (node, signal, evidence). The XML is written here
//! (six element types; the only trap, escaping, is [`esc`]) rather than through an XML
//! crate.

use crate::baseline::{best_peers, regression_lines};
use firstpacket_report::{GateReport, ProbeRecord, ProbeResult};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Escapes text for XML attributes and content; drops characters XML 1.0 forbids.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

struct Case {
    classname: &'static str,
    name: String,
    failure: Option<(String, String)>,
    skipped: Option<String>,
    out: String,
}

fn probe_line(p: &ProbeRecord) -> String {
    let suspects: Vec<String> = p
        .suspects
        .iter()
        .map(|s| {
            format!(
                "{} {} ({}) {}",
                s.node,
                s.signal.as_str(),
                s.role.as_str(),
                s.evidence
            )
        })
        .collect();
    // Issue 33: the paths that did not pass, by name.
    let paths: Vec<String> = p
        .paths
        .iter()
        .filter(|x| x.result != ProbeResult::Success)
        .map(|x| {
            format!(
                "{} {}{}",
                x.id(),
                x.result.as_str(),
                x.reason
                    .map(|r| format!("/{}", r.as_str()))
                    .unwrap_or_default()
            )
        })
        .collect();
    format!(
        "{} {} {} -> {}: {}{} ttfp {}{}{}",
        p.id,
        p.kind,
        p.source.node,
        p.target.node,
        p.result.as_str(),
        p.reason
            .map(|r| format!("/{}", r.as_str()))
            .unwrap_or_default(),
        p.ttfp_seconds.map_or("-".into(), |t| format!("{t:.3}s")),
        if paths.is_empty() {
            String::new()
        } else {
            format!("; paths: {}", paths.join(", "))
        },
        if suspects.is_empty() {
            String::new()
        } else {
            format!("; suspects: {}", suspects.join("; "))
        }
    )
}

fn bad(p: &ProbeRecord) -> bool {
    matches!(p.result, ProbeResult::Slow | ProbeResult::Failed)
}

/// The JUnit XML of `report` (module docs).
pub fn render(report: &GateReport) -> String {
    let kinds: Vec<String> = report.summary.by_kind.keys().cloned().collect();
    let mut cases = kind_cases(report, &kinds);
    cases.extend(node_cases(report, &kinds));
    cases.push(baseline_case(report));
    if !report.errors.is_empty() {
        // The run itself failed (exit 2): a CI reporter must show it, not a green suite.
        cases.push(Case {
            classname: "firstpacket.run",
            name: "run".into(),
            failure: Some((
                format!("the gate ended with an error: {}", report.errors.join("; ")),
                report.errors.join("\n"),
            )),
            skipped: None,
            out: String::new(),
        });
    }
    suite_xml(report, &cases)
}

/// One case per probe kind: failed by failed probes, a p95 over `--max-ttfp` or a
/// regression of the kind against the baseline.
fn kind_cases(report: &GateReport, kinds: &[String]) -> Vec<Case> {
    let max = report.thresholds.max_ttfp_seconds;
    let cmp = report.baseline.as_ref();
    let mut cases = Vec::new();
    for k in kinds {
        let ks = &report.summary.by_kind[k];
        let mut why = Vec::new();
        let failed = ks.by_result.get(&ProbeResult::Failed).copied().unwrap_or(0);
        if failed > 0 {
            why.push(format!("{failed} failed probe(s)"));
        }
        if let Some(p95) = ks.ttfp_p95.filter(|p| *p > max) {
            why.push(format!("TTFP p95 {p95:.3}s > --max-ttfp {max:.3}s"));
        }
        if let Some(e) = cmp.and_then(|c| {
            c.entries
                .iter()
                .find(|e| e.kind == *k && e.node.is_none() && e.regressed)
        }) {
            why.push(format!(
                "baseline {} {:.3}s vs {:.3}s (x{:.1})",
                cmp.map_or("", |c| c.quantile.as_str()),
                e.current_seconds.unwrap_or(f64::NAN),
                e.baseline_seconds.unwrap_or(f64::NAN),
                e.ratio.unwrap_or(f64::NAN)
            ));
        }
        let body: Vec<String> = report
            .probes
            .iter()
            .filter(|p| p.kind == *k && bad(p))
            .map(probe_line)
            .collect();
        cases.push(Case {
            classname: "firstpacket.kind",
            name: k.clone(),
            failure: (!why.is_empty())
                .then(|| (format!("{k}: {}", why.join("; ")), body.join("\n"))),
            skipped: None,
            out: format!(
                "probes {}, TTFP p50 {} p95 {} max {}",
                ks.total,
                fmt(ks.ttfp_p50),
                fmt(ks.ttfp_p95),
                fmt(ks.ttfp_max)
            ),
        });
    }
    cases
}

/// One case per node, failed only on the node's own evidence (issue 31: the cases
/// follow the text diagnosis, crate `blame`): its own pods failed (never Ready, never
/// programmed), its own pods' programming wait p95 is over `--max-ttfp`, it is slow
/// with every peer not itself named by its own evidence, every probe touching it was
/// bad (the gate's `slow_nodes` rule), or it regressed against the baseline.
fn node_cases(report: &GateReport, kinds: &[String]) -> Vec<Case> {
    let max = report.thresholds.max_ttfp_seconds;
    let cmp = report.baseline.as_ref();
    let mut cases = Vec::new();
    let suspects = crate::gate::suspect_nodes(&report.probes);
    let evidenced = crate::blame::evidenced_nodes(&report.probes);
    let exclude: BTreeSet<String> = evidenced.keys().cloned().collect();
    let best: Vec<(String, crate::baseline::BestPeers)> = kinds
        .iter()
        .map(|k| (k.clone(), best_peers(&report.probes, k, 0.95, &exclude)))
        .collect();
    let own_failed = own_failures(&report.probes);
    let waits: Vec<(&String, BTreeMap<&str, Vec<f64>>)> = kinds
        .iter()
        .map(|k| {
            (
                k,
                crate::baseline::node_programming_waits(&report.probes, k),
            )
        })
        .collect();
    for n in &report.nodes {
        let node = &n.node;
        let mut why = Vec::new();
        if let Some(rs) = own_failed.get(node.as_str()) {
            let list: Vec<String> = rs.iter().map(|(r, c)| format!("{r} ×{c}")).collect();
            why.push(format!("its own pods failed: {}", list.join(", ")));
        }
        for (k, waits) in &waits {
            let w = waits
                .get(node.as_str())
                .and_then(|v| crate::stats::nearest_rank(v, 0.95));
            if let Some(w) = w.filter(|w| *w > max) {
                why.push(format!(
                    "{k}: its pods' programming wait p95 {w:.3}s > --max-ttfp {max:.3}s"
                ));
            }
        }
        for (k, b) in &best {
            if let Some((x, peer, count)) = b.get(node).filter(|b| b.0 > max) {
                why.push(format!(
                    "{k}: slow with every peer: best peer {peer} p95 {x:.3}s > --max-ttfp {max:.3}s ({count} probes)"
                ));
            }
        }
        if suspects.contains(node) {
            why.push("every conclusive probe touching it was slow or failed".into());
        }
        if let Some(c) = cmp {
            why.extend(baseline_why(c, node));
        }
        let agent: Vec<&str> = evidenced
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|e| e.strip_prefix("agent "))
            .collect();
        if !why.is_empty() && !agent.is_empty() {
            why.push(format!("its agent: {}", agent.join(", ")));
        }
        let body: Vec<String> = report
            .probes
            .iter()
            .filter(|p| (p.source.node == *node || p.target.node == *node) && bad(p))
            .map(probe_line)
            .collect();
        let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        cases.push(Case {
            classname: "firstpacket.node",
            name: node.clone(),
            failure: (!why.is_empty())
                .then(|| (format!("{node}: {}", why.join("; ")), body.join("\n"))),
            skipped: None,
            out: format!(
                "as source {} probes (max {}), as target {} probes (max {}){}",
                n.as_source.probes,
                fmt(n.as_source.ttfp_max),
                n.as_target.probes,
                fmt(n.as_target.ttfp_max),
                if labels.is_empty() {
                    String::new()
                } else {
                    format!("; labels {}", labels.join(","))
                }
            ),
        });
    }
    cases
}

/// Per node, its own pods' failures by reason (crate `blame`: never Ready, never
/// programmed), counted over `failed` probes.
fn own_failures(probes: &[ProbeRecord]) -> BTreeMap<&str, BTreeMap<&'static str, u64>> {
    let mut out: BTreeMap<&str, BTreeMap<&'static str, u64>> = BTreeMap::new();
    for p in probes.iter().filter(|p| p.result == ProbeResult::Failed) {
        if let (Some(nodes), Some(r)) = (crate::blame::own_blame(p), p.reason) {
            for n in nodes {
                *out.entry(n).or_default().entry(r.as_str()).or_default() += 1;
            }
        }
    }
    out
}

/// One line per baseline entry of `node` that regressed.
fn baseline_why(c: &firstpacket_report::BaselineComparison, node: &str) -> Vec<String> {
    c.entries
        .iter()
        .filter(|e| e.node.as_deref() == Some(node) && e.regressed)
        .map(|e| {
            let what = match e.metric {
                firstpacket_report::BaselineMetric::ProgrammingWait => " programming wait",
                _ => "",
            };
            format!(
                "{}{what}: baseline {} {:.3}s vs {:.3}s (x{:.1}, +{:.3}s; best peer {})",
                e.kind,
                c.quantile,
                e.current_seconds.unwrap_or(f64::NAN),
                e.baseline_seconds.unwrap_or(f64::NAN),
                e.ratio.unwrap_or(f64::NAN),
                e.current_seconds.unwrap_or(f64::NAN) - e.baseline_seconds.unwrap_or(f64::NAN),
                e.best_peer.as_deref().unwrap_or("-")
            )
        })
        .collect()
}

/// The baseline comparison's case: skipped without `--baseline` (or after a run error),
/// failed when something regressed.
fn baseline_case(report: &GateReport) -> Case {
    match report.baseline.as_ref() {
        None => Case {
            classname: "firstpacket.baseline",
            name: "baseline comparison".into(),
            failure: None,
            skipped: Some(if report.errors.is_empty() {
                "no --baseline given".into()
            } else {
                "not compared: the run ended with an error".into()
            }),
            out: String::new(),
        },
        Some(c) => {
            let lines = regression_lines(c);
            Case {
                classname: "firstpacket.baseline",
                name: "baseline comparison".into(),
                failure: c.regressed.then(|| {
                    (
                        format!(
                            "regressed against the baseline saved {}: {}",
                            c.saved_at,
                            lines.join("; ")
                        ),
                        lines.join("\n"),
                    )
                }),
                skipped: None,
                out: c
                    .warnings
                    .iter()
                    .map(|w| format!("warning: {w}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            }
        }
    }
}

/// The `<testsuites>` document of `cases`.
fn suite_xml(report: &GateReport, cases: &[Case]) -> String {
    let failures = cases.iter().filter(|c| c.failure.is_some()).count();
    let skipped = cases.iter().filter(|c| c.skipped.is_some()).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"firstpacket\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{:.3}\">",
        cases.len(),
        report.duration_seconds
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"firstpacket gate\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" time=\"{:.3}\" timestamp=\"{}\">",
        cases.len(),
        report.duration_seconds,
        esc(&report.started_at)
    );
    let _ = writeln!(
        out,
        "    <properties><property name=\"instance\" value=\"{}\"/><property name=\"verdict\" value=\"{}\"/><property name=\"diagnosis\" value=\"{}\"/></properties>",
        esc(&report.instance),
        serde_json::to_value(report.verdict).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
        serde_json::to_value(report.summary.diagnosis).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    );
    for c in cases {
        let _ = write!(
            out,
            "    <testcase classname=\"{}\" name=\"{}\" time=\"0\">",
            c.classname,
            esc(&c.name)
        );
        if let Some((msg, body)) = &c.failure {
            let _ = write!(
                out,
                "<failure message=\"{}\" type=\"firstpacket\">{}</failure>",
                esc(msg),
                esc(body)
            );
        }
        if let Some(why) = &c.skipped {
            let _ = write!(out, "<skipped message=\"{}\"/>", esc(why));
        }
        if !c.out.is_empty() {
            let _ = write!(out, "<system-out>{}</system-out>", esc(&c.out));
        }
        out.push_str("</testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(slow: &[&str], baseline: Option<&crate::baseline::SavedBaseline>) -> GateReport {
        let nodes = ["n1", "n2", "n3", "n4"];
        let mut probes = Vec::new();
        for off in 1..4 {
            for s in 0..4 {
                let (src, dst) = (nodes[s], nodes[(s + off) % 4]);
                let t = if slow.contains(&src) || slow.contains(&dst) {
                    20.0
                } else {
                    0.3
                };
                let mut r = crate::record::test_record(
                    &format!("p{off}{s}"),
                    src,
                    dst,
                    ProbeResult::Success,
                );
                r.reason = None;
                r.ttfp_seconds = Some(t);
                probes.push(r);
            }
        }
        report_of(probes, baseline)
    }

    /// The gate report of `probes` (thresholds 60 s, no failure allowed), compared with
    /// `baseline` when given.
    fn report_of(
        probes: Vec<ProbeRecord>,
        baseline: Option<&crate::baseline::SavedBaseline>,
    ) -> GateReport {
        let mut rep = crate::gate::build_report(
            probes,
            &[],
            Vec::new(),
            crate::gate::ReportInputs {
                thresholds: firstpacket_report::Thresholds {
                    slow_threshold_seconds: 60.0,
                    max_ttfp_seconds: 60.0,
                    max_failures: 0,
                    max_inconclusive: 0,
                },
                instance: "gate-x".into(),
                started_at: "2026-01-01T00:00:00Z".into(),
                finished_at: "2026-01-01T00:01:00Z".into(),
                duration_seconds: 60.0,
                errors: vec![],
                group_by: vec![],
                stopped_early: None,
                skipped_nodes: vec![],
            },
        );
        if let Some(b) = baseline {
            let settings = b.settings.clone();
            let cmp = crate::baseline::compare(
                b,
                &rep.probes,
                &["cross_node"],
                &settings,
                &crate::baseline::CompareConfig {
                    quantile: "p95".into(),
                    ratio: 1.5,
                    floor: 0.5,
                    min_samples: 20,
                    dial_interval: 0.1,
                },
            );
            crate::gate::apply_baseline(&mut rep, cmp);
        }
        rep
    }

    #[test]
    fn a_failed_path_is_named_in_its_kinds_failure() {
        use firstpacket_report::{IpFamily, PathId, PathProtocol, PathResult, Payload, Reason};
        let mut r = crate::record::test_record("p", "n1", "n2", ProbeResult::Failed);
        r.reason = Some(Reason::MtuBlackHole);
        let path = |payload, result, reason| {
            let id = PathId {
                protocol: PathProtocol::Udp,
                family: IpFamily::Ipv4,
                payload,
            };
            PathResult::new(id, result, reason, None)
        };
        r.paths = vec![
            path(Payload::Small, ProbeResult::Success, None),
            path(
                Payload::Mtu,
                ProbeResult::Failed,
                Some(Reason::MtuBlackHole),
            ),
        ];
        let xml = render(&report_of(vec![r], None));
        assert!(
            xml.contains("failed/mtu_black_hole ttfp -; paths: udp/ipv4/mtu failed/mtu_black_hole"),
            "{xml}"
        );
        assert!(!xml.contains("udp/ipv4/small"), "{xml}");
    }

    #[test]
    fn a_regression_fails_the_gate_and_junit_fails_exactly_the_slow_nodes() {
        let healthy = report(&[], None);
        assert_eq!(healthy.exit_code, 0);
        let xml = render(&healthy);
        assert_eq!(xml.matches("<testcase ").count(), 4 + 1 + 1, "{xml}");
        assert!(!xml.contains("<failure"), "{xml}");
        assert!(xml.contains("<skipped message=\"no --baseline given\"/>"));
        // A run that ended with an error fails a `run` testcase (not a green suite).
        let mut broken = report(&[], None);
        broken.errors = vec!["--baseline x.json: not a saved baseline".into()];
        let xml = render(&broken);
        assert_eq!(xml.matches("<testcase ").count(), 4 + 1 + 1 + 1, "{xml}");
        assert!(
            xml.contains("classname=\"firstpacket.run\"")
                && xml.contains("the gate ended with an error: --baseline x.json"),
            "{xml}"
        );
        assert!(
            xml.contains("not compared: the run ended with an error"),
            "{xml}"
        );
        let saved = crate::baseline::save(
            &healthy.probes,
            &["cross_node"],
            Default::default(),
            "gate-x",
            "t0",
        );
        let slow = report(&["n2", "n3"], Some(&saved));
        // Every probe is under --max-ttfp 60s: only the baseline fails the gate.
        assert_eq!(
            (slow.exit_code, slow.verdict),
            (1, firstpacket_report::Verdict::Fail)
        );
        assert!(
            slow.verdict_reasons[0].starts_with(
                "baseline regression: cross_node (all nodes): p95 20.000s vs baseline 0.300s"
            ),
            "{:?}",
            slow.verdict_reasons
        );
        let xml = render(&slow);
        let failing: Vec<&str> = xml
            .lines()
            .filter(|l| l.contains("<failure"))
            .filter_map(|l| l.split(" name=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            failing,
            ["cross_node", "n2", "n3", "baseline comparison"],
            "{xml}"
        );
        assert!(
            xml.contains("n2: cross_node: baseline p95 20.000s vs 0.300s"),
            "{xml}"
        );
        let text = crate::gate::render_baseline_text(&slow);
        assert!(
            text.contains("REGRESSED") && text.contains("fewer than 20"),
            "{text}"
        );
        // The same cluster again: no regression, the verdict untouched.
        let again = report(&[], Some(&saved));
        assert_eq!(again.exit_code, 0);
        assert!(!render(&again).contains("<failure"));
    }

    /// The names of the failing testcases, in document order.
    fn failing(xml: &str) -> Vec<&str> {
        xml.lines()
            .filter(|l| l.contains("<failure"))
            .filter_map(|l| l.split(" name=\"").nth(1)?.split('"').next())
            .collect()
    }

    /// A 4-probe ring under S2 (n2, n3 slow): n1 and n4 met only n2 and n3, so their
    /// TTFPs alone look as bad as the slow nodes'.
    fn s2_ring(gated: bool) -> Vec<ProbeRecord> {
        use firstpacket_report::{
            ProbeProgramming, ProgrammingMethod, ProgrammingWait, Reason, Role, Signal, Suspect,
        };
        let slow = ["n2", "n3"];
        [("n1", "n2"), ("n2", "n4"), ("n3", "n1"), ("n4", "n3")]
            .into_iter()
            .enumerate()
            .map(|(i, (src, dst))| {
                let mut r =
                    crate::record::test_record(&format!("p{i}"), src, dst, ProbeResult::Slow);
                let wait = |n: &str| ProgrammingWait {
                    method: ProgrammingMethod::NodeDial,
                    wait_seconds: if slow.contains(&n) { 20.0 } else { 0.2 },
                    resolution_seconds: 0.1,
                    over_threshold: slow.contains(&n),
                };
                if gated {
                    // The wait is before Ready, in the slow node's own pod; TTFP ≈ 0.
                    r.reason = Some(Reason::EndpointProgrammingSlow);
                    r.ttfp_seconds = Some(0.05);
                    r.programming = Some(ProbeProgramming {
                        source: Some(wait(src)),
                        target: Some(wait(dst)),
                        readiness_gated: Some(true),
                    });
                } else {
                    r.reason = Some(Reason::TtfpOverThreshold);
                    r.ttfp_seconds = Some(70.0);
                }
                let (node, role) = if slow.contains(&src) {
                    (src, Role::Source)
                } else {
                    (dst, Role::Target)
                };
                r.suspects = vec![Suspect {
                    node: node.into(),
                    role,
                    signal: Signal::DataplaneApplySlow,
                    evidence: serde_json::json!({"apply_mean_seconds": 1.0}),
                }];
                r
            })
            .collect()
    }

    /// Issue 31: under S2 the baseline comparison and the JUnit node cases blame exactly
    /// the slow nodes, also when the healthy ones met only slow peers — the delay after
    /// Ready (TTFP) or before it (programming waits).
    #[test]
    fn s2_blames_exactly_the_slow_nodes_when_the_healthy_ones_met_only_slow_peers() {
        let healthy = report(&[], None);
        let mut saved = crate::baseline::save(
            &healthy.probes,
            &["cross_node"],
            Default::default(),
            "gate-x",
            "t0",
        );
        // The healthy baseline's programming waits: 0.2 s on every node.
        for n in ["n1", "n2", "n3", "n4"] {
            saved
                .kinds
                .get_mut("cross_node")
                .unwrap()
                .programming_wait
                .insert(n.into(), crate::baseline::Quantiles::of(&[0.2, 0.2, 0.2]));
        }
        for gated in [false, true] {
            let rep = report_of(s2_ring(gated), Some(&saved));
            let regressed: BTreeSet<&str> = rep
                .baseline
                .as_ref()
                .unwrap()
                .entries
                .iter()
                .filter(|e| e.regressed)
                .filter_map(|e| e.node.as_deref())
                .collect();
            assert_eq!(
                regressed,
                BTreeSet::from(["n2", "n3"]),
                "gated {gated}: {:#?}",
                rep.baseline
            );
            let xml = render(&rep);
            let nodes: Vec<&str> = failing(&xml)
                .into_iter()
                .filter(|n| n.starts_with('n'))
                .collect();
            assert_eq!(nodes, ["n2", "n3"], "gated {gated}: {xml}");
            assert!(xml.contains("its agent: dataplane_apply_slow"), "{xml}");
            assert_eq!(
                crate::gate::suspect_nodes(&rep.probes),
                ["n2", "n3"],
                "gated {gated}"
            );
        }
        // Without the agents' word (no suspects) and with the delay in TTFP, n1 and n4
        // cannot be told apart from their slow peers: every node is named, as before.
        let mut blind = s2_ring(false);
        for p in &mut blind {
            p.suspects.clear();
        }
        assert_eq!(crate::gate::suspect_nodes(&blind), ["n1", "n2", "n3", "n4"]);
    }

    #[test]
    fn escaping_covers_markup_quotes_and_forbidden_controls() {
        assert_eq!(esc("a<b>&\"c'\u{1}\n"), "a&lt;b&gt;&amp;&quot;c&apos;\n");
    }
}
