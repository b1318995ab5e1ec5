//! Every path a new pod depends on (issue 33): `--protocols tcp,udp`, `--payload
//! small|mtu` and `--ip-families ipv4,ipv6` turn one probe into several measured paths,
//! all dialed by the same source pod on its own clock, from its first instant, with the
//! main path's spacing, timeout, give-up and hold (target-server's `paths` module).
//!
//! The **main path** is TCP, small, to the target's primary IP (`status.podIPs[0]`):
//! the one every kind measures and whose TTFP the record, metrics and baselines carry.
//! The others are `--path` arguments of the source: for each requested family (default:
//! the primary one), each protocol, and each payload (`small`, plus `mtu` with `--payload
//! mtu`). A requested family the target has no address of is not dialed: its paths are
//! `inconclusive`/`family_missing`, never guessed.
//!
//! Cost: no extra pod and no extra API write — the same source dials every path; each
//! path adds one attempt per `--dial-interval` (a full-size `mtu` attempt carries about
//! one MTU of payload each way).
//!
//! Which kinds: the pod-to-pod ones (`cross_node`, `same_node`, `unprobed`, `recreate`,
//! `burst`); `service`, `policy` and `policy_change` measure their TCP path only.
//!
//! A path's result ([`path_results`]), from its line in the source's report:
//! - a success sent after the source's `ready_at`: `success`, or `slow`/
//!   `ttfp_over_threshold` over `--slow-threshold` (its TTFP counted from `ready_at`, as
//!   the main one), or `failed`/`lost_after_success` with failures in its hold;
//! - no success: `failed`/`mtu_black_hole` for an `mtu` path whose `small` sibling (same
//!   protocol and family) succeeded — full-size packets lost while small ones pass —,
//!   `failed`/`wrong_peer` when only other pods answered, else
//!   `failed`/`no_success_before_give_up`;
//! - the source stopped early: `inconclusive`/`interrupted`; the source left no report
//!   (or one without the path's line): the record's own result when it has no report
//!   at all, else `inconclusive`/`container_failed`.
//!
//! The record's `result`/`reason` become the worst path's (failed, then inconclusive,
//! then slow) when the main path did better; the detail names the path.

use firstpacket_report::{
    IpFamily, PathId, PathProtocol, PathResult, Payload, ProbeRecord, ProbeResult, Reason,
    SourceOutcome, SourceReport,
};
use std::time::Duration;

/// The paths a run asks for (`--protocols`, `--payload`, `--ip-families`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathsConfig {
    /// `--protocols` (deduplicated, in order); never empty.
    pub protocols: Vec<PathProtocol>,
    /// `--payload`.
    pub payload: Payload,
    /// `--ip-families`; empty: the target's primary family.
    pub families: Vec<IpFamily>,
}

impl Default for PathsConfig {
    /// TCP, small, the primary family: the main path only (today's cost).
    fn default() -> Self {
        PathsConfig {
            protocols: vec![PathProtocol::Tcp],
            payload: Payload::Small,
            families: Vec::new(),
        }
    }
}

/// One path a probe measures: its id and the target address it dials (`None`: the
/// target has no address of the family).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedPath {
    pub id: PathId,
    /// `IP:PORT` (bracketed IPv6).
    pub addr: Option<String>,
}

impl PathsConfig {
    /// From the flags: protocols deduplicated in order (tcp when none), families
    /// deduplicated.
    pub fn new(protocols: &[PathProtocol], payload: Payload, families: &[IpFamily]) -> Self {
        let mut p: Vec<PathProtocol> = Vec::new();
        for x in protocols {
            if !p.contains(x) {
                p.push(*x);
            }
        }
        if p.is_empty() {
            p.push(PathProtocol::Tcp);
        }
        let mut f: Vec<IpFamily> = Vec::new();
        for x in families {
            if !f.contains(x) {
                f.push(*x);
            }
        }
        PathsConfig {
            protocols: p,
            payload,
            families: f,
        }
    }

    /// The paths a run's metrics pre-initialise (`Metrics::initialise_paths`): every
    /// protocol × payload of the requested families (both, when none is named: the
    /// primary one is known only from the pods), the main TCP/small one included; none
    /// when the run asks for the main path only.
    pub fn metric_ids(&self) -> Vec<PathId> {
        if self.protocols == [PathProtocol::Tcp]
            && self.payload == Payload::Small
            && self.families.len() <= 1
        {
            return Vec::new();
        }
        let families = if self.families.is_empty() {
            IpFamily::ALL.to_vec()
        } else {
            self.families.clone()
        };
        let payloads: &[Payload] = match self.payload {
            Payload::Small => &[Payload::Small],
            Payload::Mtu => &[Payload::Small, Payload::Mtu],
        };
        let mut protocols = self.protocols.clone();
        if !protocols.contains(&PathProtocol::Tcp) {
            protocols.insert(0, PathProtocol::Tcp);
        }
        let mut out = Vec::new();
        for family in families {
            for protocol in &protocols {
                for payload in payloads {
                    out.push(PathId {
                        protocol: *protocol,
                        family,
                        payload: *payload,
                    });
                }
            }
        }
        out
    }

    /// Whether only the main path is asked for (then records carry no `paths`).
    pub fn main_only(&self, primary: IpFamily) -> bool {
        self.protocols == [PathProtocol::Tcp]
            && self.payload == Payload::Small
            && self.families.iter().all(|f| *f == primary)
    }

    /// The probe's paths for a target with `ips` (`status.podIPs` in order, the first
    /// primary) serving on `port`: the main one first, then family by family, protocol
    /// by protocol, `small` before `mtu`. Empty when [`Self::main_only`] or the target
    /// has no parsable IP.
    pub fn plan(&self, ips: &[String], port: u16) -> Vec<PlannedPath> {
        let parsed: Vec<std::net::IpAddr> = ips.iter().filter_map(|i| i.parse().ok()).collect();
        let Some(primary) = parsed.first().copied() else {
            return Vec::new();
        };
        let primary_family = IpFamily::of(primary);
        if self.main_only(primary_family) {
            return Vec::new();
        }
        let families = if self.families.is_empty() {
            vec![primary_family]
        } else {
            self.families.clone()
        };
        let payloads: &[Payload] = match self.payload {
            Payload::Small => &[Payload::Small],
            Payload::Mtu => &[Payload::Small, Payload::Mtu],
        };
        let main = PathId {
            protocol: PathProtocol::Tcp,
            family: primary_family,
            payload: Payload::Small,
        };
        let mut out = vec![PlannedPath {
            id: main,
            addr: Some(crate::podspec::host_port(&primary.to_string(), port)),
        }];
        for family in families {
            let addr = parsed
                .iter()
                .find(|ip| IpFamily::of(**ip) == family)
                .map(|ip| crate::podspec::host_port(&ip.to_string(), port));
            for protocol in &self.protocols {
                for payload in payloads {
                    let id = PathId {
                        protocol: *protocol,
                        family,
                        payload: *payload,
                    };
                    if id != main && !out.iter().any(|p| p.id == id) {
                        out.push(PlannedPath {
                            id,
                            addr: addr.clone(),
                        });
                    }
                }
            }
        }
        out
    }
}

/// The source's `--path` arguments for `planned` (all but the main path, and only
/// those with an address).
pub fn source_args(planned: &[PlannedPath]) -> Vec<String> {
    planned
        .iter()
        .skip(1)
        .filter_map(|p| {
            let addr = p.addr.as_ref()?;
            Some([
                "--path".to_string(),
                format!(
                    "{}/{}={addr}",
                    p.id.protocol.as_str(),
                    p.id.payload.as_str()
                ),
            ])
        })
        .flatten()
        .collect()
}

/// Severity order of results for "the worst path": failed > inconclusive > slow >
/// success.
fn severity(r: ProbeResult) -> u8 {
    match r {
        ProbeResult::Success => 0,
        ProbeResult::Slow => 1,
        ProbeResult::Inconclusive => 2,
        ProbeResult::Failed => 3,
    }
}

/// Each planned path's result (module docs), the main one taken from the record
/// (`result`, `reason`, `ttfp_seconds`) as built from the source's `report`.
pub fn path_results(
    planned: &[PlannedPath],
    record: &ProbeRecord,
    report: Option<&SourceReport>,
    slow_threshold: Duration,
) -> Vec<PathResult> {
    let line = |id: PathId| report.and_then(|r| r.paths.iter().find(|p| p.path == id));
    let ready_at = report.and_then(|r| r.ready_at);
    let succeeded = |id: PathId| {
        if Some(&id) == planned.first().map(|p| &p.id) {
            return report.is_some_and(|r| r.first_success_sent.is_some());
        }
        line(id).is_some_and(|l| l.first_success_sent.is_some())
    };
    planned
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let out = |result, reason, ttfp| PathResult::new(p.id, result, reason, ttfp);
            if i == 0 {
                return PathResult {
                    retransmits: report
                        .filter(|r| r.first_success_sent.is_some())
                        .and_then(|r| r.first_success_retransmits),
                    ..out(record.result, record.reason, record.ttfp_seconds)
                };
            }
            if p.addr.is_none() {
                return out(ProbeResult::Inconclusive, Some(Reason::FamilyMissing), None);
            }
            if report.is_none() {
                return out(record.result, record.reason, None);
            }
            let Some(l) = line(p.id) else {
                return out(
                    ProbeResult::Inconclusive,
                    Some(Reason::ContainerFailed),
                    None,
                );
            };
            if let Some(sent) = l.first_success_sent {
                let ttfp = ready_at.map(|r| ((sent - r).max(0.0) * 1e6).round() / 1e6);
                let judged = if l.hold_failures > 0 {
                    out(ProbeResult::Failed, Some(Reason::LostAfterSuccess), ttfp)
                } else if ttfp.is_some_and(|t| t > slow_threshold.as_secs_f64()) {
                    out(ProbeResult::Slow, Some(Reason::TtfpOverThreshold), ttfp)
                } else {
                    out(ProbeResult::Success, None, ttfp)
                };
                return PathResult {
                    retransmits: l.retransmits,
                    ..judged
                };
            }
            let small = PathId {
                payload: Payload::Small,
                ..p.id
            };
            let (result, reason) = match l.outcome {
                SourceOutcome::Terminated => (ProbeResult::Inconclusive, Reason::Interrupted),
                _ if p.id.payload == Payload::Mtu && succeeded(small) => {
                    (ProbeResult::Failed, Reason::MtuBlackHole)
                }
                SourceOutcome::WrongPeer => (ProbeResult::Failed, Reason::WrongPeer),
                _ => (ProbeResult::Failed, Reason::NoSuccessBeforeGiveUp),
            };
            out(result, Some(reason), None)
        })
        .collect()
}

/// Sets `record.paths` for `planned` and, when a path did worse than the main one,
/// the record's result and reason to the worst path's (the detail names it and keeps
/// what was there).
pub fn apply(record: &mut ProbeRecord, planned: &[PlannedPath], slow_threshold: Duration) {
    if planned.is_empty() {
        return;
    }
    let paths = path_results(
        planned,
        record,
        record.source_report.as_ref(),
        slow_threshold,
    );
    let worst = paths
        .iter()
        .skip(1)
        .filter(|p| severity(p.result) > severity(record.result))
        .rev()
        .max_by_key(|p| severity(p.result));
    if let Some(w) = worst {
        let id = w.id();
        let what = match w.reason {
            Some(Reason::MtuBlackHole) => format!(
                "path {id}: full-size packets never got through while small ones did (MTU black hole)"
            ),
            Some(Reason::FamilyMissing) => {
                format!("path {id}: the target has no {} address", w.family.as_str())
            }
            Some(r) => format!("path {id}: {}", r.as_str()),
            None => format!("path {id}"),
        };
        record.detail = Some(match record.detail.take() {
            Some(d) if !d.is_empty() => format!("{what}; {d}"),
            _ => what,
        });
        record.result = w.result;
        record.reason = w.reason;
    }
    record.paths = paths;
}

/// The gate's text lines for probes that measured several paths: per path, the
/// results, the median TTFP and, for paths that did not pass, the reasons and up to
/// three node pairs. Empty when no probe measured more than its main path.
pub fn text_lines(probes: &[ProbeRecord]) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    #[derive(Default)]
    struct Row {
        counts: [usize; 4],
        ttfps: Vec<f64>,
        bad: BTreeMap<&'static str, Vec<String>>,
        /// Node pairs whose first success needed TCP retransmissions.
        retransmitted: Vec<String>,
    }
    let mut rows: BTreeMap<(u8, PathId), Row> = BTreeMap::new();
    for p in probes {
        for (i, x) in p.paths.iter().enumerate() {
            let id = x.id();
            // The main path first, then in id order.
            let row = rows.entry((u8::from(i != 0), id)).or_default();
            row.counts[severity(x.result) as usize] += 1;
            row.ttfps.extend(x.ttfp_seconds);
            if matches!(
                x.result,
                ProbeResult::Failed | ProbeResult::Inconclusive | ProbeResult::Slow
            ) {
                row.bad
                    .entry(x.reason.map_or("none", |r| r.as_str()))
                    .or_default()
                    .push(format!("{} → {}", p.source.node, p.target.node));
            }
            if x.retransmits.is_some_and(|n| n > 0) {
                row.retransmitted
                    .push(format!("{} → {}", p.source.node, p.target.node));
            }
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\npaths (each probe's source dialed all of them):\n");
    let _ = writeln!(
        out,
        "  {:<15} {:>7} {:>5} {:>6} {:>12} {:>9}  not passing; first success only after TCP retransmits",
        "path", "success", "slow", "failed", "inconclusive", "p50 ttfp"
    );
    for ((_, id), mut row) in rows {
        row.ttfps.sort_by(f64::total_cmp);
        let p50 = row
            .ttfps
            .get(row.ttfps.len().saturating_sub(1) / 2)
            .map_or("-".to_string(), |t| format!("{t:.2}s"));
        let listed = |what: &str, pairs: &[String]| {
            let shown: Vec<&str> = pairs.iter().take(3).map(String::as_str).collect();
            let more = if pairs.len() > 3 { ", …" } else { "" };
            format!("{what} ×{} ({}{more})", pairs.len(), shown.join(", "))
        };
        let mut bad: Vec<String> = row
            .bad
            .iter()
            .map(|(reason, pairs)| listed(reason, pairs))
            .collect();
        if !row.retransmitted.is_empty() {
            bad.push(listed("after_tcp_retransmits", &row.retransmitted));
        }
        let _ = writeln!(
            out,
            "  {:<15} {:>7} {:>5} {:>6} {:>12} {:>9}  {}",
            id.to_string(),
            row.counts[0],
            row.counts[1],
            row.counts[3],
            row.counts[2],
            p50,
            bad.join("; ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstpacket_report::SourcePath;

    fn cfg(protocols: &[PathProtocol], payload: Payload, families: &[IpFamily]) -> PathsConfig {
        PathsConfig {
            protocols: protocols.to_vec(),
            payload,
            families: families.to_vec(),
        }
    }

    fn ids(p: &[PlannedPath]) -> Vec<String> {
        p.iter()
            .map(|p| format!("{}@{}", p.id, p.addr.as_deref().unwrap_or("-")))
            .collect()
    }

    #[test]
    fn the_default_plans_nothing_and_options_plan_every_combination_main_first() {
        let v4 = vec!["10.1.0.5".to_string()];
        assert!(PathsConfig::default().plan(&v4, 8080).is_empty());
        assert!(cfg(&[PathProtocol::Tcp], Payload::Small, &[IpFamily::Ipv4])
            .plan(&v4, 8080)
            .is_empty());
        let p = cfg(&[PathProtocol::Tcp, PathProtocol::Udp], Payload::Mtu, &[]).plan(&v4, 8080);
        assert_eq!(
            ids(&p),
            [
                "tcp/ipv4/small@10.1.0.5:8080",
                "tcp/ipv4/mtu@10.1.0.5:8080",
                "udp/ipv4/small@10.1.0.5:8080",
                "udp/ipv4/mtu@10.1.0.5:8080"
            ]
        );
        assert_eq!(
            source_args(&p),
            [
                "--path",
                "tcp/mtu=10.1.0.5:8080",
                "--path",
                "udp/small=10.1.0.5:8080",
                "--path",
                "udp/mtu=10.1.0.5:8080"
            ]
        );
        // Dual stack asked on a single-stack pod: the IPv6 path is planned, undialed.
        let p = cfg(
            &[PathProtocol::Tcp],
            Payload::Small,
            &[IpFamily::Ipv4, IpFamily::Ipv6],
        )
        .plan(&v4, 8080);
        assert_eq!(
            ids(&p),
            ["tcp/ipv4/small@10.1.0.5:8080", "tcp/ipv6/small@-"]
        );
        assert!(source_args(&p).is_empty());
        // A dual-stack pod, IPv6 primary.
        let ds = vec!["fd00::5".to_string(), "10.1.0.5".to_string()];
        let p = cfg(
            &[PathProtocol::Udp],
            Payload::Small,
            &[IpFamily::Ipv4, IpFamily::Ipv6],
        )
        .plan(&ds, 8080);
        assert_eq!(
            ids(&p),
            [
                "tcp/ipv6/small@[fd00::5]:8080",
                "udp/ipv4/small@10.1.0.5:8080",
                "udp/ipv6/small@[fd00::5]:8080"
            ]
        );
    }

    fn record(result: ProbeResult, reason: Option<Reason>, report: SourceReport) -> ProbeRecord {
        let mut r = crate::record::tests::sample_record();
        r.result = result;
        r.reason = reason;
        r.ttfp_seconds = Some(0.2);
        r.detail = None;
        r.source_report = Some(report);
        r
    }

    fn line(path: &str, first: Option<f64>, outcome: SourceOutcome) -> SourcePath {
        SourcePath {
            path: path.parse().unwrap(),
            bytes: None,
            first_success_sent: first,
            retransmits: None,
            attempts: 3,
            failures: 3,
            last_error: None,
            hold_failures: 0,
            outcome,
        }
    }

    #[test]
    fn an_mtu_path_lost_while_small_passes_is_a_black_hole_and_fails_the_record() {
        let planned = cfg(&[PathProtocol::Tcp, PathProtocol::Udp], Payload::Mtu, &[])
            .plan(&["10.1.0.5".into()], 8080);
        let mut report = crate::record::tests::sample_report();
        report.ready_at = Some(1.0);
        report.first_success_sent = Some(1.2);
        report.paths = vec![
            line("tcp/ipv4/mtu", None, SourceOutcome::NoSuccess),
            line("udp/ipv4/small", Some(7.5), SourceOutcome::Success),
            line("udp/ipv4/mtu", None, SourceOutcome::NoSuccess),
        ];
        let mut r = record(ProbeResult::Success, None, report);
        apply(&mut r, &planned, Duration::from_secs(5));
        let got: Vec<(String, &str, Option<&str>, Option<f64>)> = r
            .paths
            .iter()
            .map(|p| {
                (
                    p.id().to_string(),
                    p.result.as_str(),
                    p.reason.map(|r| r.as_str()),
                    p.ttfp_seconds,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("tcp/ipv4/small".to_string(), "success", None, Some(0.2)),
                (
                    "tcp/ipv4/mtu".into(),
                    "failed",
                    Some("mtu_black_hole"),
                    None
                ),
                (
                    "udp/ipv4/small".into(),
                    "slow",
                    Some("ttfp_over_threshold"),
                    Some(6.5)
                ),
                (
                    "udp/ipv4/mtu".into(),
                    "failed",
                    Some("mtu_black_hole"),
                    None
                ),
            ]
        );
        assert_eq!(
            (r.result, r.reason),
            (ProbeResult::Failed, Some(Reason::MtuBlackHole))
        );
        assert!(r
            .detail
            .unwrap()
            .starts_with("path tcp/ipv4/mtu: full-size"));
        assert_eq!(r.ttfp_seconds, Some(0.2), "the main path's TTFP stays");
    }

    #[test]
    fn the_text_lists_each_path_with_its_results_and_the_pairs_that_did_not_pass() {
        let planned = cfg(&[PathProtocol::Tcp], Payload::Mtu, &[]).plan(&["10.1.0.5".into()], 8080);
        let mut report = crate::record::tests::sample_report();
        report.paths = vec![line("tcp/ipv4/mtu", None, SourceOutcome::NoSuccess)];
        let mut bad = record(ProbeResult::Success, None, report.clone());
        apply(&mut bad, &planned, Duration::from_secs(5));
        report.paths = vec![line("tcp/ipv4/mtu", Some(1.3), SourceOutcome::Success)];
        let mut good = record(ProbeResult::Success, None, report);
        apply(&mut good, &planned, Duration::from_secs(5));
        let text = text_lines(&[bad.clone(), good]);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("/ipv4/")).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("  tcp/ipv4/small"),
            "main path first: {text}"
        );
        assert!(
            lines[1].contains("mtu_black_hole ×1 (node-1 → node-2)"),
            "{text}"
        );
        assert_eq!(text_lines(&[crate::record::tests::sample_record()]), "");
    }

    #[test]
    fn a_first_success_after_tcp_retransmits_is_carried_per_path_and_listed_in_the_text() {
        let planned = cfg(&[PathProtocol::Tcp, PathProtocol::Udp], Payload::Small, &[])
            .plan(&["10.1.0.5".into()], 8080);
        let mut report = crate::record::tests::sample_report();
        report.ready_at = Some(1.0);
        report.first_success_sent = Some(1.2);
        report.first_success_retransmits = Some(2);
        report.paths = vec![line("udp/ipv4/small", Some(1.1), SourceOutcome::Success)];
        let mut slow = record(ProbeResult::Success, None, report.clone());
        apply(&mut slow, &planned, Duration::from_secs(5));
        let got: Vec<_> = slow.paths.iter().map(|p| p.retransmits).collect();
        assert_eq!(
            got,
            [Some(2), None],
            "tcp main path carries it, UDP has none"
        );
        assert_eq!(
            slow.result,
            ProbeResult::Success,
            "a retransmit is no failure"
        );
        // An extra TCP path's own count, and 0 is not listed.
        let planned = cfg(&[PathProtocol::Tcp], Payload::Mtu, &[]).plan(&["10.1.0.5".into()], 8080);
        report.first_success_retransmits = Some(0);
        let mut mtu = line("tcp/ipv4/mtu", Some(1.4), SourceOutcome::Success);
        mtu.retransmits = Some(3);
        report.paths = vec![mtu];
        let mut r = record(ProbeResult::Success, None, report);
        apply(&mut r, &planned, Duration::from_secs(5));
        assert_eq!(r.paths[1].retransmits, Some(3));
        let text = text_lines(&[slow, r]);
        let row = |id: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("  {id}")))
                .unwrap_or_else(|| panic!("no {id} row: {text}"))
                .to_owned()
        };
        assert!(
            row("tcp/ipv4/small").contains("after_tcp_retransmits ×1 (node-1 → node-2)"),
            "{text}"
        );
        assert!(
            row("tcp/ipv4/mtu").contains("after_tcp_retransmits ×1"),
            "{text}"
        );
        assert!(!row("udp/ipv4/small").contains("retransmits"), "{text}");
    }

    #[test]
    fn a_path_without_a_small_sibling_success_a_missing_family_and_a_missing_line() {
        let planned = cfg(
            &[PathProtocol::Udp],
            Payload::Mtu,
            &[IpFamily::Ipv4, IpFamily::Ipv6],
        )
        .plan(&["10.1.0.5".into()], 8080);
        let mut report = crate::record::tests::sample_report();
        report.ready_at = Some(1.0);
        // udp/ipv4/small never answered: its mtu sibling is not a black hole. The
        // udp/ipv4/mtu line is missing (dropped for room).
        report.paths = vec![line("udp/ipv4/small", None, SourceOutcome::NoSuccess)];
        let r0 = record(ProbeResult::Success, None, report);
        let got: Vec<(String, Option<Reason>)> = path_results(
            &planned,
            &r0,
            r0.source_report.as_ref(),
            Duration::from_secs(5),
        )
        .iter()
        .map(|p| (p.id().to_string(), p.reason))
        .collect();
        assert_eq!(
            got,
            [
                ("tcp/ipv4/small".to_string(), None),
                ("udp/ipv4/small".into(), Some(Reason::NoSuccessBeforeGiveUp)),
                ("udp/ipv4/mtu".into(), Some(Reason::ContainerFailed)),
                ("udp/ipv6/small".into(), Some(Reason::FamilyMissing)),
                ("udp/ipv6/mtu".into(), Some(Reason::FamilyMissing)),
            ]
        );
        // A probe that never got a report: its paths share its result.
        let mut r = r0.clone();
        r.result = ProbeResult::Inconclusive;
        r.reason = Some(Reason::Unschedulable);
        r.source_report = None;
        apply(&mut r, &planned, Duration::from_secs(5));
        assert!(r.paths[1..3]
            .iter()
            .all(|p| p.reason == Some(Reason::Unschedulable)));
        assert_eq!(r.paths[3].reason, Some(Reason::FamilyMissing));
        assert_eq!(r.reason, Some(Reason::Unschedulable));
    }
}
