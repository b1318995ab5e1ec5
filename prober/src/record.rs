//! Building a [`ProbeRecord`] from what a probe observed (docs/design.md §2 step 8 and the
//! "Results" table, §4 probe fields). Pure: takes tracker states and the source's
//! termination message, returns the record.
//!
//! TTFP comes only from the source report (one clock, node A: `first_success_sent −
//! ready_at`); the prober's own clock gives the API timeline and
//! `target_ready_to_source_ready_seconds`. Never subtracted across machines.

use crate::podspec::calico_iface_name;
use crate::tracker::PodState;
use firstpacket_report::{
    Attempts, Hold, PodProgramming, PodRef, PodTimeline, ProbeProgramming, ProbeRecord,
    ProbeResult, ProgrammingWait, Reason, SourceOutcome, SourceReport, Timeline,
    NOTABLE_DELAY_SECONDS, SCHEMA_VERSION,
};
use std::time::{Duration, Instant};

/// Identity and clock origin of one probe.
#[derive(Debug, Clone)]
pub struct ProbeMeta {
    /// Probe id (`firstpacket.io/probe-id`).
    pub id: String,
    /// Probe kind (`cross_node`).
    pub kind: String,
    /// Namespace of the pods (for the Calico interface name).
    pub namespace: String,
    /// Planned source node A.
    pub source_node: String,
    /// Planned target node B.
    pub target_node: String,
    /// Source pod name.
    pub source_pod: String,
    /// Target pod name.
    pub target_pod: String,
    /// Prober-clock start of the probe (origin of the timeline).
    pub started: Instant,
    /// RFC 3339 wall time of the start (display only).
    pub started_at: String,
}

/// How the probe ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// The source pod terminated: classify from its termination message.
    SourceTerminated,
    /// The probe stopped before the source reported, for `reason` (with a human detail).
    Aborted {
        /// Result reason (`unschedulable`, `target_never_ready`, `interrupted`, …).
        reason: Reason,
        /// What was seen, for the operator.
        detail: String,
    },
}

/// Longest termination message read, bytes; a longer one is refused unread. The
/// kubelet keeps at most 4096 bytes per container (and 12 KiB per pod; Kubernetes docs
/// "Determine the Reason for Pod Failure"), and the source's report stays under
/// [`firstpacket_report::MAX_SOURCE_REPORT_BYTES`] (3 KiB); 64 KiB is 16× the kubelet's cap,
/// so only a status that did not come from a kubelet is over it.
pub const MAX_TERMINATION_MESSAGE_BYTES: usize = 64 * 1024;

/// Parses a termination message into a [`SourceReport`].
///
/// The message is the JSON line the source wrote to `/dev/termination-log`; with
/// `FallbackToLogsOnError` it can instead be the tail of the container log (the report is
/// also printed on stdout), so if the whole text is not a report, the last line that
/// parses as one is used. Errors describe what was found: the JSON error (cut at 200
/// characters) and a debug-quoted excerpt of the last 160 characters, so an error stays
/// under 2 KiB whatever the message. A message over [`MAX_TERMINATION_MESSAGE_BYTES`]
/// is an error without being parsed. Time is linear in the message length (each line
/// is parsed at most once more); serde_json's recursion limit (128) turns deep nesting
/// into an error, not a stack overflow.
pub fn parse_termination_message(msg: &str) -> Result<SourceReport, String> {
    if msg.len() > MAX_TERMINATION_MESSAGE_BYTES {
        return Err(format!(
            "termination message of {} bytes is over the {MAX_TERMINATION_MESSAGE_BYTES}-byte cap (the kubelet keeps at most 4096)",
            msg.len()
        ));
    }
    let trimmed = msg.trim();
    if trimmed.is_empty() {
        return Err("empty termination message".into());
    }
    let parsed = serde_json::from_str::<SourceReport>(trimmed).or_else(|first_err| {
        trimmed
            .lines()
            .rev()
            .map(str::trim)
            .filter(|l| l.starts_with('{'))
            .find_map(|l| serde_json::from_str::<SourceReport>(l).ok())
            .ok_or(first_err)
    });
    match parsed {
        Ok(r) if r.schema == SCHEMA_VERSION => Ok(r),
        Ok(r) => Err(format!("unsupported source report schema {}", r.schema)),
        Err(e) => Err(format!(
            "termination message is not a source report ({}): {:?}",
            // serde_json quotes offending values (an unknown variant, a string where a
            // number belongs) whole: cut, so the error stays bounded.
            cut(&e.to_string(), 200),
            excerpt(trimmed, 160)
        )),
    }
}

/// The first `max` characters of `s`, with `…` when cut.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

fn excerpt(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let tail: String = s
            .chars()
            .rev()
            .take(max)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    }
}

/// TTFP (floored at 0) and raw TTFP from a source report, seconds. Uses the report's own
/// fields, or `first_success_sent − ready_at` when the source left them out.
pub fn ttfp_from_report(r: &SourceReport) -> (Option<f64>, Option<f64>) {
    let raw = r
        .raw_ttfp_seconds
        .or(match (r.first_success_sent, r.ready_at) {
            (Some(s), Some(ready)) => Some(s - ready),
            _ => None,
        });
    let ttfp = r.ttfp_seconds.or(raw.map(|v| v.max(0.0)));
    (ttfp, raw)
}

/// Result, reason and detail for a parsed source report (docs/design.md §2 "Results").
///
/// Order of rules: a SIGTERM'd source (`outcome: terminated`) → `inconclusive` /
/// `interrupted`; the source's own path to its node never worked ([`never_programmed`])
/// → `failed` / `endpoint_never_programmed`; `ready_at` null → `failed` /
/// `source_never_ready` (the kubelet never reached S: node-local path broken); `no_success` → `no_success_before_give_up`;
/// `wrong_peer` → `wrong_peer`; `lost_after_success` → `lost_after_success`;
/// `success` → `slow` / `ttfp_over_threshold` if TTFP > `slow_threshold`, else
/// `success`.
pub fn classify_report(
    r: &SourceReport,
    slow_threshold: Duration,
) -> (ProbeResult, Option<Reason>, Option<String>) {
    let prog = probe_programming(r, ttfp_from_report(r).0, slow_threshold);
    classify_with(r, &prog, slow_threshold)
}

/// The detail of a source whose own path to its node never worked within its give-up
/// (issue 29): it dialed its node and no dial was answered, no kubelet request reached
/// it, and it never found the target either (a source that reached its target had a
/// working path, whatever its node said). "Within" is up to the moment the source
/// stopped dialing its node (`node_dial_gave_up`, else `give_up_seconds`): a source
/// whose node first reached it after that (its agent programmed it late, as a CI run
/// of S2 showed at 19 s against a 10 s give-up) spent its whole measurement unprogrammed
/// and is classified the same. `None` otherwise, and for a report without the
/// measurement (an older target-server, or no node address given).
pub fn never_programmed(r: &SourceReport) -> Option<String> {
    let p = r.programming.as_ref()?;
    let limit = p.node_dial_gave_up.unwrap_or(r.give_up_seconds);
    let within = |t: Option<f64>| t.is_some_and(|t| t <= limit);
    let never = p.node_dial_attempts > 0
        && !within(p.node_dial_first_success_sent)
        && !within(p.first_kubelet_request)
        && !within(r.ready_at)
        && r.first_success_sent.is_none();
    never.then(|| {
        let late = p
            .first_kubelet_request
            .map(|k| format!(" (the first came at {k:.1}s, after it gave up)"))
            .unwrap_or_default();
        format!(
            "the source pod's own path to its node never worked: {} dials of {} unanswered{}, \
             no kubelet request reached it in {limit:.1}s{late}; its CNI did not program its \
             endpoint in time (it was not Ready)",
            p.node_dial_attempts,
            p.node_addr.as_deref().unwrap_or("its node"),
            p.node_dial_last_error
                .map(|e| format!(" (last {})", e.as_str()))
                .unwrap_or_default(),
        )
    })
}

/// [`classify_report`] with the report's [`probe_programming`] already derived (a
/// `success` whose programming wait is over the threshold is `slow` /
/// `endpoint_programming_slow`).
fn classify_with(
    r: &SourceReport,
    prog: &ProbeProgramming,
    slow_threshold: Duration,
) -> (ProbeResult, Option<Reason>, Option<String>) {
    let last = r
        .last_error
        .map(|e| format!(", last error {}", e.as_str()))
        .unwrap_or_default();
    let fail = |reason: Reason, detail: String| (reason.result(), Some(reason), Some(detail));
    if r.outcome == SourceOutcome::Terminated {
        return fail(
            Reason::Interrupted,
            "source pod was stopped (SIGTERM) before its measurement finished".into(),
        );
    }
    if let Some(never) = never_programmed(r) {
        return fail(Reason::EndpointNeverProgrammed, never);
    }
    if r.ready_at.is_none() {
        return fail(
            Reason::SourceNeverReady,
            format!(
                "source container ran but its readiness probe never passed ({} attempts{last})",
                r.attempts_before_success
            ),
        );
    }
    match r.outcome {
        SourceOutcome::NoSuccess => fail(
            Reason::NoSuccessBeforeGiveUp,
            format!(
                "no success in {:.1}s: {} attempts, {} failed{last}",
                r.give_up_seconds, r.attempts_before_success, r.failures_before_success
            ),
        ),
        SourceOutcome::WrongPeer => fail(
            Reason::WrongPeer,
            format!(
                "answered by {} instead of {}",
                r.wrong_peer.as_deref().unwrap_or("another pod"),
                r.expect_pod
            ),
        ),
        SourceOutcome::LostAfterSuccess => fail(
            Reason::LostAfterSuccess,
            format!(
                "{} of {} attempts failed during the {:.1}s hold after the first success",
                r.hold.failures, r.hold.attempts, r.hold.seconds
            ),
        ),
        SourceOutcome::Success => match ttfp_from_report(r).0 {
            Some(t) if t > slow_threshold.as_secs_f64() => fail(
                Reason::TtfpOverThreshold,
                format!(
                    "TTFP {t:.3}s > slow threshold {:.3}s",
                    slow_threshold.as_secs_f64()
                ),
            ),
            Some(t) => {
                let slow: Vec<String> = [("source", &prog.source), ("target", &prog.target)]
                    .into_iter()
                    .filter_map(|(role, w)| {
                        w.as_ref().filter(|w| w.over_threshold).map(|w| {
                            format!(
                                "the {role}'s {:.3}s ({})",
                                w.wait_seconds,
                                w.method.as_str()
                            )
                        })
                    })
                    .collect();
                if slow.is_empty() {
                    (ProbeResult::Success, None, None)
                } else {
                    fail(
                        Reason::EndpointProgrammingSlow,
                        format!(
                            "programming wait {} > slow threshold {:.3}s: the new pod's own \
                             path to its node worked only then, before Ready (TTFP after \
                             Ready {t:.3}s)",
                            slow.join(" and "),
                            slow_threshold.as_secs_f64()
                        ),
                    )
                }
            }
            None => fail(
                Reason::ContainerFailed,
                "source reported success without a first_success_sent time".into(),
            ),
        },
        SourceOutcome::Terminated => (ProbeResult::Inconclusive, Some(Reason::Interrupted), None),
    }
}

/// Both pods' programming waits from a source report (the source's own measurement
/// and the target's as the target reported it) and where the probe's delay showed
/// ([`ProbeProgramming`]; issue 29). A wait is over the threshold when it exceeds
/// `slow_threshold`; `readiness_gated` compares the delay before Ready (the longer wait
/// of a pod whose readiness passed only once its path worked) with `ttfp` (seconds),
/// when either is above [`NOTABLE_DELAY_SECONDS`].
pub fn probe_programming(
    r: &SourceReport,
    ttfp: Option<f64>,
    slow_threshold: Duration,
) -> ProbeProgramming {
    let wait = |p: &Option<PodProgramming>| {
        let p = p.as_ref()?;
        let wait_seconds = p.wait_seconds?;
        Some(ProgrammingWait {
            method: p.method?,
            wait_seconds,
            resolution_seconds: p.resolution_seconds.unwrap_or(0.0),
            over_threshold: wait_seconds > slow_threshold.as_secs_f64(),
        })
    };
    let source = wait(&r.programming);
    let target = wait(&r.target_programming);
    // The delay before Ready: the waits of pods whose readiness passed only after their
    // path worked (a pod without a readiness probe, kind `unprobed`'s target, has no
    // `ready_at`: its wait held back nothing, its darkness is in TTFP).
    let gated_wait = |p: &Option<PodProgramming>| {
        let p = p.as_ref()?;
        let w = p.wait_seconds?;
        let slack = p.resolution_seconds.unwrap_or(0.0);
        p.ready_at.filter(|r| *r + slack >= w).map(|_| w)
    };
    let before = [
        gated_wait(&r.programming),
        gated_wait(&r.target_programming),
    ]
    .into_iter()
    .flatten()
    .fold(0.0_f64, f64::max);
    let ttfp = ttfp.unwrap_or(0.0);
    let readiness_gated = if before.max(ttfp) <= NOTABLE_DELAY_SECONDS {
        None
    } else {
        Some(before >= ttfp)
    };
    ProbeProgramming {
        source,
        target,
        readiness_gated,
    }
}

fn secs_since(origin: Instant, t: Option<Instant>) -> Option<f64> {
    t.map(|t| t.saturating_duration_since(origin).as_secs_f64())
}

/// API timeline of one pod relative to the probe start (seconds, prober clock).
pub fn pod_timeline(origin: Instant, s: Option<&PodState>) -> PodTimeline {
    let Some(s) = s else {
        return PodTimeline::default();
    };
    PodTimeline {
        created: secs_since(origin, s.created),
        scheduled: secs_since(origin, s.scheduled),
        ip_assigned: secs_since(origin, s.ip_assigned),
        ready: secs_since(origin, s.ready),
        finished: secs_since(origin, s.terminated.as_ref().map(|t| t.at)),
        deleted: secs_since(origin, s.deleted),
    }
}

fn pod_ref(namespace: &str, planned_node: &str, pod: &str, s: Option<&PodState>) -> PodRef {
    PodRef {
        node: s
            .and_then(|s| s.node.clone())
            .unwrap_or_else(|| planned_node.to_string()),
        pod: pod.to_string(),
        uid: s.and_then(|s| s.uid.clone()),
        ip: s.and_then(|s| s.ip.clone()),
        iface: Some(calico_iface_name(namespace, pod)),
    }
}

/// Builds the probe record.
///
/// `target`/`source` are the tracker states (None if the pod was never created/seen);
/// `deleted_at` overrides the `deleted` time with the moment our delete returned (the
/// watch's `DELETED` may come later); `finished` is when the record was completed.
pub fn build_record(
    meta: &ProbeMeta,
    target: Option<&PodState>,
    source: Option<&PodState>,
    ending: &Ending,
    slow_threshold: Duration,
    finished: Instant,
) -> ProbeRecord {
    let mut source_report = None;
    let mut programming = None;
    let (result, reason, detail) = match ending {
        Ending::Aborted { reason, detail } => {
            (reason.result(), Some(*reason), Some(detail.clone()))
        }
        Ending::SourceTerminated => {
            let term = source.and_then(|s| s.terminated.as_ref());
            let exit = term.map(|t| t.exit_code);
            match term.and_then(|t| t.message.as_deref()) {
                None => (
                    ProbeResult::Inconclusive,
                    Some(Reason::ContainerFailed),
                    Some(format!(
                        "source exited (code {}) without a termination message",
                        exit.map_or("?".into(), |c| c.to_string())
                    )),
                ),
                Some(msg) => match parse_termination_message(msg) {
                    Ok(r) => {
                        let prog = probe_programming(&r, ttfp_from_report(&r).0, slow_threshold);
                        let c = classify_with(&r, &prog, slow_threshold);
                        programming = Some(prog);
                        source_report = Some(r);
                        c
                    }
                    Err(e) => (
                        ProbeResult::Inconclusive,
                        Some(Reason::ContainerFailed),
                        Some(format!(
                            "source exit code {}: {e}",
                            exit.map_or("?".into(), |c| c.to_string())
                        )),
                    ),
                },
            }
        }
    };
    let (ttfp, raw) = source_report
        .as_ref()
        .map(ttfp_from_report)
        .unwrap_or((None, None));
    let attempts = source_report
        .as_ref()
        .map(|r| Attempts {
            before_success: r.attempts_before_success,
            failures_before_success: r.failures_before_success,
            last_error: r.last_error,
            errors: r.errors.clone(),
        })
        .unwrap_or_default();
    let hold = source_report
        .as_ref()
        .map(|r| Hold {
            seconds: r.hold.seconds,
            failures: r.hold.failures,
        })
        .unwrap_or_default();
    let gap = match (target.and_then(|t| t.ready), source.and_then(|s| s.ready)) {
        (Some(t), Some(s)) => Some(s.saturating_duration_since(t).as_secs_f64()),
        _ => None,
    };
    ProbeRecord {
        id: meta.id.clone(),
        kind: meta.kind.clone(),
        source: pod_ref(&meta.namespace, &meta.source_node, &meta.source_pod, source),
        target: pod_ref(&meta.namespace, &meta.target_node, &meta.target_pod, target),
        result,
        reason,
        detail,
        ttfp_seconds: ttfp,
        raw_ttfp_seconds: raw,
        target_ready_to_source_ready_seconds: gap,
        attempts,
        hold,
        timeline: Timeline {
            started_at: meta.started_at.clone(),
            target: pod_timeline(meta.started, target),
            source: pod_timeline(meta.started, source),
            finished: secs_since(meta.started, Some(finished)),
        },
        suspects: Vec::new(),
        first_attempt_failures: first_attempt_failures(result, reason, source_report.as_ref()),
        pre_ready_attempt_failures: pre_ready_attempt_failures(
            result,
            reason,
            source_report.as_ref(),
        ),
        programming,
        source_report,
        api_writes: 0,
        recreate: None,
        burst: None,
        service: None,
        policy: None,
        paths: Vec::new(),
        drift: None,
    }
}

/// Whether the probe worked at some point: `success`, `slow`, or `failed` with
/// `lost_after_success`.
fn worked(result: ProbeResult, reason: Option<Reason>) -> bool {
    match result {
        ProbeResult::Success | ProbeResult::Slow => true,
        ProbeResult::Failed => reason == Some(Reason::LostAfterSuccess),
        ProbeResult::Inconclusive => false,
    }
}

/// First-attempt failures of a probe ("new pods whose first connections fail, then
/// work"), as an application that starts connecting when its pod turns Ready would see
/// them: the source's failed attempts sent at or after its `ready_at` and before its
/// first success sent after `ready_at` (`failures_after_ready_before_success`).
/// Counted only when the probe worked (`success`, `slow`, `failed`/`lost_after_success`)
/// and the source had such a success; 0 otherwise (a probe that never worked is a plain
/// failure). Attempts before Ready are [`pre_ready_attempt_failures`]: Kubernetes does
/// not promise a pod any network before it is Ready.
pub fn first_attempt_failures(
    result: ProbeResult,
    reason: Option<Reason>,
    report: Option<&SourceReport>,
) -> u64 {
    match report {
        Some(r) if worked(result, reason) && r.first_success_after_ready_sent.is_some() => {
            r.failures_after_ready_before_success
        }
        _ => 0,
    }
}

/// The source's failed attempts sent before its `ready_at` and before its first success
/// (`failures_before_ready`), when the probe worked; 0 otherwise.
pub fn pre_ready_attempt_failures(
    result: ProbeResult,
    reason: Option<Reason>,
    report: Option<&SourceReport>,
) -> u64 {
    match report {
        Some(r) if worked(result, reason) => r.failures_before_ready,
        _ => 0,
    }
}

/// A record as [`build_record`] makes it for a source that terminated without a report
/// (probe `id`, `src` → `dst`, cross-node), with `result` set: the fixture unit tests of
/// the run-mode modules (admin, events) start from.
#[cfg(test)]
pub(crate) fn test_record(id: &str, src: &str, dst: &str, result: ProbeResult) -> ProbeRecord {
    let meta = ProbeMeta {
        id: id.into(),
        kind: "cross_node".into(),
        namespace: "firstpacket".into(),
        source_node: src.into(),
        target_node: dst.into(),
        source_pod: format!("fp-{id}-s"),
        target_pod: format!("fp-{id}-t"),
        started: std::time::Instant::now(),
        started_at: "2026-12-01T00:00:00Z".into(),
    };
    let mut r = build_record(
        &meta,
        None,
        None,
        &Ending::SourceTerminated,
        std::time::Duration::from_secs(5),
        std::time::Instant::now(),
    );
    r.result = result;
    r
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tracker::{Terminated, Tracker};

    /// A healthy source's report (Ready at 1.0 s, first success sent at 1.2 s), for
    /// other modules' tests.
    pub(crate) fn sample_report() -> SourceReport {
        report(SourceOutcome::Success, Some(1.0), Some(1.2))
    }

    /// A record with no pods seen (an `api_error` ending), for other modules' tests to
    /// reshape.
    pub(crate) fn sample_record() -> ProbeRecord {
        let t0 = Instant::now();
        build_record(
            &meta(t0),
            None,
            None,
            &Ending::Aborted {
                reason: Reason::ApiError,
                detail: "sample".into(),
            },
            Duration::from_secs(5),
            t0,
        )
    }
    use firstpacket_report::{ErrorKind, SourceHold};
    use k8s_openapi::api::core::v1::Pod;
    use std::collections::BTreeMap;

    fn report(outcome: SourceOutcome, ready: Option<f64>, success: Option<f64>) -> SourceReport {
        let raw = match (success, ready) {
            (Some(s), Some(r)) => Some(s - r),
            _ => None,
        };
        let mut errors = BTreeMap::new();
        errors.insert(ErrorKind::Timeout, 3);
        SourceReport {
            schema: 1,
            pod: "fp-p-s".into(),
            target: "10.0.2.5:8080".into(),
            expect_pod: "fp-p-t".into(),
            interval_seconds: 0.1,
            attempt_timeout_seconds: 0.9,
            give_up_seconds: 60.0,
            hold_seconds: 5.0,
            process_start_unix: 1.7e9,
            process_start: 0.0,
            first_attempt: Some(0.01),
            ready_at: ready,
            first_success_sent: success,
            first_success_received: success.map(|s| s + 0.001),
            first_success_retransmits: None,
            ttfp_seconds: raw.map(|v| v.max(0.0)),
            raw_ttfp_seconds: raw,
            attempts_before_success: 12,
            failures_before_success: 3,
            // Two of the three before Ready; one after it (when the success came after).
            failures_before_ready: 2,
            first_success_after_ready_sent: success.filter(|s| ready.is_some_and(|r| *s >= r)),
            failures_after_ready_before_success: 1,
            errors,
            last_error: Some(ErrorKind::Timeout),
            wrong_peer: None,
            hold: SourceHold {
                seconds: 5.0,
                attempts: 50,
                failures: if outcome == SourceOutcome::LostAfterSuccess {
                    7
                } else {
                    0
                },
                failures_per_second: vec![],
            },
            outcome,
            programming: None,
            target_programming: None,
            policy: None,
            paths: Vec::new(),
        }
    }

    fn meta(t0: Instant) -> ProbeMeta {
        ProbeMeta {
            id: "p".into(),
            kind: "cross_node".into(),
            namespace: "firstpacket".into(),
            source_node: "node-1".into(),
            target_node: "node-2".into(),
            source_pod: "fp-p-s".into(),
            target_pod: "fp-p-t".into(),
            started: t0,
            started_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn states(t0: Instant, msg: Option<String>) -> (PodState, PodState) {
        let mut fixture: Pod =
            serde_json::from_str(include_str!("../tests/fixtures/k8s-pod-running-ready.json"))
                .expect("fixture");
        crate::tracker::as_probe_containers(&mut fixture);
        let mut tr = Tracker::new();
        let mut t = fixture.clone();
        t.metadata.name = Some("fp-p-t".into());
        t.metadata.uid = Some("uid-t".into());
        let mut s = fixture;
        s.metadata.name = Some("fp-p-s".into());
        s.metadata.uid = Some("uid-s".into());
        tr.note_created("fp-p-t", t0 + Duration::from_millis(10));
        tr.apply(&t, t0 + Duration::from_millis(800));
        tr.note_created("fp-p-s", t0 + Duration::from_millis(900));
        tr.apply(&s, t0 + Duration::from_millis(1700));
        let target = tr.get("fp-p-t").cloned().expect("t");
        let mut source = tr.get("fp-p-s").cloned().expect("s");
        source.terminated = Some(Terminated {
            at: t0 + Duration::from_secs(8),
            exit_code: 0,
            reason: Some("Completed".into()),
            message: msg,
        });
        (target, source)
    }

    fn record_for(r: Option<&SourceReport>, raw_msg: Option<&str>) -> ProbeRecord {
        let t0 = Instant::now();
        let msg = match (r, raw_msg) {
            (_, Some(m)) => Some(m.to_string()),
            (Some(r), None) => Some(serde_json::to_string(r).expect("json")),
            (None, None) => None,
        };
        let (t, s) = states(t0, msg);
        build_record(
            &meta(t0),
            Some(&t),
            Some(&s),
            &Ending::SourceTerminated,
            Duration::from_secs(5),
            t0 + Duration::from_secs(9),
        )
    }

    /// A pod whose path worked at `wait` and whose readiness passed just after it.
    fn waited(wait: f64) -> Option<PodProgramming> {
        Some(PodProgramming {
            method: Some(firstpacket_report::ProgrammingMethod::NodeDial),
            wait_seconds: Some(wait),
            resolution_seconds: Some(0.1),
            ready_at: Some(wait + 0.05),
            ..PodProgramming::default()
        })
    }

    #[test]
    fn a_programming_wait_over_the_threshold_is_slow_and_names_its_pod() {
        // Ready at 7.3 s after a 7.2 s wait (the CNI held the pod), TTFP 0.
        let mut r = report(SourceOutcome::Success, Some(7.3), Some(7.3));
        r.programming = waited(7.2);
        r.target_programming = waited(0.05);
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.result, ProbeResult::Slow);
        assert_eq!(rec.reason, Some(Reason::EndpointProgrammingSlow));
        let detail = rec.detail.as_deref().unwrap();
        assert!(detail.contains("the source's 7.200s"), "{detail}");
        assert!(!detail.contains("target's"), "{detail}");
        let g = rec.programming.expect("programming");
        assert!(g.source.as_ref().unwrap().over_threshold);
        assert!(!g.target.as_ref().unwrap().over_threshold);
        assert_eq!(g.readiness_gated, Some(true));
    }

    #[test]
    fn a_slow_ttfp_wins_over_a_slow_programming_wait_and_shows_the_delay_after_ready() {
        let mut r = report(SourceOutcome::Success, Some(0.5), Some(7.5));
        r.programming = waited(0.1);
        r.target_programming = waited(0.1);
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.reason, Some(Reason::TtfpOverThreshold));
        assert_eq!(rec.programming.unwrap().readiness_gated, Some(false));
        // Both short: no side taken; no measurement: no programming verdict.
        let mut r = report(SourceOutcome::Success, Some(0.5), Some(0.6));
        r.programming = waited(0.3);
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.result, ProbeResult::Success);
        let g = rec.programming.unwrap();
        assert_eq!(g.readiness_gated, None);
        assert_eq!(g.target, None);
        // A target without a readiness probe (kind `unprobed`) waited 3 s: that held
        // back no Ready, so the 2.5 s TTFP is where the delay was.
        let mut r = report(SourceOutcome::Success, Some(0.5), Some(3.0));
        r.programming = waited(0.1);
        r.target_programming = waited(3.0).map(|p| PodProgramming {
            ready_at: None,
            ..p
        });
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.programming.unwrap().readiness_gated, Some(false));
    }

    #[test]
    fn fast_success_is_success_with_ttfp_and_timeline() {
        let r = report(SourceOutcome::Success, Some(0.5), Some(0.8));
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.result, ProbeResult::Success);
        assert_eq!(rec.reason, None);
        let ttfp = rec.ttfp_seconds.expect("ttfp");
        assert!((ttfp - 0.3).abs() < 1e-9);
        assert_eq!(rec.attempts.before_success, 12);
        assert_eq!(rec.attempts.last_error, Some(ErrorKind::Timeout));
        let gap = rec.target_ready_to_source_ready_seconds.expect("gap");
        assert!((gap - 0.9).abs() < 1e-6);
        assert!((rec.timeline.target.ready.expect("ready") - 0.8).abs() < 1e-6);
        assert!((rec.timeline.source.created.expect("created") - 0.9).abs() < 1e-6);
        assert!((rec.timeline.source.finished.expect("finished") - 8.0).abs() < 1e-6);
        assert_eq!(rec.source.uid.as_deref(), Some("uid-s"));
        assert_eq!(rec.target.ip.as_deref(), Some("10.244.0.3"));
        assert_eq!(
            rec.source.iface.as_deref(),
            Some(calico_iface_name("firstpacket", "fp-p-s").as_str())
        );
        assert!(rec.source_report.is_some());
    }

    #[test]
    fn first_attempt_failures_count_only_after_ready_and_when_the_source_later_succeeded() {
        let r = report(SourceOutcome::Success, Some(0.5), Some(0.8));
        let rec = record_for(Some(&r), None);
        assert_eq!(
            rec.first_attempt_failures, 1,
            "only the one sent after Ready"
        );
        assert_eq!(rec.pre_ready_attempt_failures, 2);
        let mut clean = r.clone();
        clean.failures_after_ready_before_success = 0;
        assert_eq!(record_for(Some(&clean), None).first_attempt_failures, 0);
        let lost = report(SourceOutcome::LostAfterSuccess, Some(0.5), Some(0.7));
        assert_eq!(record_for(Some(&lost), None).first_attempt_failures, 1);
        // A source whose only successes came before Ready: nothing seen from Ready on.
        let early = report(SourceOutcome::Success, Some(1.0), Some(0.6));
        let rec = record_for(Some(&early), None);
        assert_eq!(rec.first_attempt_failures, 0);
        assert_eq!(rec.pre_ready_attempt_failures, 2);
        let none = report(SourceOutcome::NoSuccess, Some(0.5), None);
        let rec = record_for(Some(&none), None);
        assert_eq!(rec.result, ProbeResult::Failed);
        assert_eq!(rec.first_attempt_failures, 0);
        assert_eq!(rec.pre_ready_attempt_failures, 0);
    }

    #[test]
    fn success_before_ready_has_zero_ttfp_and_negative_raw() {
        let r = report(SourceOutcome::Success, Some(1.0), Some(0.6));
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.result, ProbeResult::Success);
        assert_eq!(rec.ttfp_seconds, Some(0.0));
        assert!(rec.raw_ttfp_seconds.expect("raw") < 0.0);
    }

    #[test]
    fn ttfp_over_threshold_is_slow() {
        let r = report(SourceOutcome::Success, Some(0.5), Some(7.5));
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.result, ProbeResult::Slow);
        assert_eq!(rec.reason, Some(Reason::TtfpOverThreshold));
        assert!((rec.ttfp_seconds.expect("ttfp") - 7.0).abs() < 1e-9);
    }

    #[test]
    fn source_outcomes_map_to_failed_reasons() {
        for (outcome, success, reason) in [
            (
                SourceOutcome::NoSuccess,
                None,
                Reason::NoSuccessBeforeGiveUp,
            ),
            (SourceOutcome::WrongPeer, None, Reason::WrongPeer),
            (
                SourceOutcome::LostAfterSuccess,
                Some(0.7),
                Reason::LostAfterSuccess,
            ),
        ] {
            let r = report(outcome, Some(0.5), success);
            let rec = record_for(Some(&r), None);
            assert_eq!(rec.result, ProbeResult::Failed, "{outcome:?}");
            assert_eq!(rec.reason, Some(reason), "{outcome:?}");
            assert!(rec.detail.is_some());
        }
    }

    #[test]
    fn never_ready_source_is_failed_source_never_ready() {
        let r = report(SourceOutcome::Success, None, Some(0.7));
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.result, ProbeResult::Failed);
        assert_eq!(rec.reason, Some(Reason::SourceNeverReady));
        assert_eq!(rec.ttfp_seconds, None);
    }

    /// Issue 29: a source whose node never answered a dial and that no kubelet request
    /// reached is `endpoint_never_programmed`; one that the kubelet reached (a node
    /// path that works one way), or one without the measurement, stays
    /// `source_never_ready`.
    #[test]
    fn a_source_whose_node_never_answered_is_endpoint_never_programmed() {
        let mut r = report(SourceOutcome::NoSuccess, None, None);
        r.programming = Some(PodProgramming {
            node_addr: Some("10.0.0.2:10250".into()),
            node_dial_attempts: 150,
            node_dial_failures: 150,
            node_dial_last_error: Some(firstpacket_report::ErrorKind::Timeout),
            node_dial_gave_up: Some(15.0),
            ..PodProgramming::default()
        });
        let rec = record_for(Some(&r), None);
        assert_eq!(rec.result, ProbeResult::Failed);
        assert_eq!(rec.reason, Some(Reason::EndpointNeverProgrammed));
        let d = rec.detail.expect("detail");
        assert!(d.contains("150 dials of 10.0.0.2:10250"), "{d}");
        let mut reached = r.clone();
        reached.programming.as_mut().unwrap().first_kubelet_request = Some(3.0);
        assert_eq!(
            record_for(Some(&reached), None).reason,
            Some(Reason::SourceNeverReady)
        );
        // The kubelet first reached it only after it gave up (its node programmed it
        // late): its whole measurement was spent unprogrammed.
        let mut late = reached.clone();
        late.programming.as_mut().unwrap().first_kubelet_request = Some(19.0);
        late.ready_at = Some(19.0);
        let rec = record_for(Some(&late), None);
        assert_eq!(rec.reason, Some(Reason::EndpointNeverProgrammed));
        assert!(
            rec.detail.as_deref().unwrap().contains("at 19.0s, after"),
            "{rec:?}"
        );
        let mut unmeasured = r.clone();
        unmeasured.programming = None;
        assert_eq!(
            record_for(Some(&unmeasured), None).reason,
            Some(Reason::SourceNeverReady)
        );
    }

    #[test]
    fn garbage_or_missing_message_is_inconclusive_container_failed() {
        let rec = record_for(None, Some("panic: something broke\nat line 3"));
        assert_eq!(rec.result, ProbeResult::Inconclusive);
        assert_eq!(rec.reason, Some(Reason::ContainerFailed));
        assert!(rec
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("something broke"));
        let rec = record_for(None, None);
        assert_eq!(rec.reason, Some(Reason::ContainerFailed));
        assert!(rec
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("without a termination message"));
    }

    #[test]
    fn report_is_found_in_log_fallback_tail() {
        let r = report(SourceOutcome::Success, Some(0.5), Some(0.6));
        let log = format!(
            "starting\nlistening on :8080\n{}\n",
            serde_json::to_string(&r).expect("json")
        );
        let rec = record_for(None, Some(&log));
        assert_eq!(rec.result, ProbeResult::Success);
    }

    #[test]
    fn wrong_schema_is_rejected() {
        let mut r = report(SourceOutcome::Success, Some(0.5), Some(0.6));
        r.schema = 2;
        let msg = serde_json::to_string(&r).expect("json");
        assert!(parse_termination_message(&msg).is_err());
    }

    #[test]
    fn aborted_probe_keeps_reason_and_planned_nodes() {
        let t0 = Instant::now();
        let rec = build_record(
            &meta(t0),
            None,
            None,
            &Ending::Aborted {
                reason: Reason::Unschedulable,
                detail: "0/3 nodes are available".into(),
            },
            Duration::from_secs(5),
            t0 + Duration::from_secs(60),
        );
        assert_eq!(rec.result, ProbeResult::Inconclusive);
        assert_eq!(rec.reason, Some(Reason::Unschedulable));
        assert_eq!(rec.source.node, "node-1");
        assert_eq!(rec.target.node, "node-2");
        assert_eq!(rec.ttfp_seconds, None);
        assert_eq!(rec.timeline.finished, Some(60.0));
    }

    #[test]
    fn a_message_over_the_cap_is_refused_unread() {
        let r = report(SourceOutcome::Success, Some(0.5), Some(0.6));
        let json = serde_json::to_string(&r).expect("json");
        // The valid report last, after 64 KiB of log: still over the cap, still refused.
        let msg = format!("{}\n{json}", "x".repeat(MAX_TERMINATION_MESSAGE_BYTES));
        let e = parse_termination_message(&msg).expect_err("over the cap");
        assert!(e.contains("over the 65536-byte cap"), "{e}");
        let rec = record_for(None, Some(&msg));
        assert_eq!(rec.reason, Some(Reason::ContainerFailed));
        // A message of exactly the cap is read.
        let pad = MAX_TERMINATION_MESSAGE_BYTES - json.len() - 1;
        let msg = format!("{}\n{json}", "x".repeat(pad));
        assert_eq!(msg.len(), MAX_TERMINATION_MESSAGE_BYTES);
        assert_eq!(parse_termination_message(&msg), Ok(r));
    }

    /// Property tests ("fuzzing") of reading a terminated source: garbage, truncated,
    /// oversized and hostile JSON into [`parse_termination_message`] and
    /// [`build_record`]. Cases per property: `FIRSTPACKET_FUZZ_CASES` (default 256).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;
        use std::time::Instant;

        fn config() -> ProptestConfig {
            ProptestConfig {
                cases: std::env::var("FIRSTPACKET_FUZZ_CASES")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(256),
                ..ProptestConfig::default()
            }
        }

        /// A parse must take well under this (debug build, shared cores); linear time
        /// over ≤ 64 KiB is microseconds to a few milliseconds.
        const SLOW: Duration = Duration::from_secs(1);

        /// Parses `msg` and builds the record from it; checks what holds for any input:
        /// bounded time, a bounded one-line-ish error, and an error always becoming
        /// `inconclusive`/`container_failed` with the error in the detail.
        fn check_any(msg: &str) -> Result<Option<SourceReport>, TestCaseError> {
            let started = Instant::now();
            let parsed = parse_termination_message(msg);
            let took = started.elapsed();
            prop_assert!(took < SLOW, "parse took {took:?} for {} bytes", msg.len());
            let rec = record_for(None, Some(msg));
            match parsed {
                Ok(r) => {
                    prop_assert_eq!(r.schema, firstpacket_report::SCHEMA_VERSION);
                    prop_assert_eq!(rec.source_report.as_ref(), Some(&r));
                    let (result, reason, _) = classify_report(&r, Duration::from_secs(5));
                    prop_assert_eq!((rec.result, rec.reason), (result, reason));
                    Ok(Some(r))
                }
                Err(e) => {
                    prop_assert!(e.len() <= 2048, "error of {} bytes", e.len());
                    prop_assert!(
                        e.starts_with("termination message")
                            || e.starts_with("empty")
                            || e.starts_with("unsupported source report schema"),
                        "unclear error {e:?}"
                    );
                    prop_assert_eq!(rec.result, ProbeResult::Inconclusive);
                    prop_assert_eq!(rec.reason, Some(Reason::ContainerFailed));
                    let detail = rec.detail.unwrap_or_default();
                    prop_assert!(detail.contains(&e), "detail {detail:?} lacks {e:?}");
                    prop_assert!(rec.source_report.is_none());
                    Ok(None)
                }
            }
        }

        fn outcome() -> impl Strategy<Value = SourceOutcome> {
            prop_oneof![
                Just(SourceOutcome::Success),
                Just(SourceOutcome::LostAfterSuccess),
                Just(SourceOutcome::NoSuccess),
                Just(SourceOutcome::WrongPeer),
                Just(SourceOutcome::Terminated),
            ]
        }

        fn valid_report() -> impl Strategy<Value = SourceReport> {
            (
                outcome(),
                prop::option::of(0.0f64..1e6),
                prop::option::of(-1e3f64..1e6),
                "[a-z0-9-]{1,63}",
                prop::option::of("\\PC{0,40}"),
            )
                .prop_map(|(o, ready, success, pod, peer)| {
                    let mut r = report(o, ready, success);
                    r.pod = pod;
                    r.wrong_peer = peer;
                    r
                })
        }

        /// Raw JSON values that are legal text but hostile to a typed reader.
        fn hostile_value() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("1e999".to_owned()),
                Just("-1e999".to_owned()),
                Just("18446744073709551616".to_owned()),
                Just("-9223372036854775809".to_owned()),
                Just("1.7976931348623157e309".to_owned()),
                Just("4.9e-325".to_owned()),
                Just("-0".to_owned()),
                "[1-9][0-9]{20,400}",
                "-?[0-9]{1,3}\\.[0-9]{1,400}(e-?[0-9]{1,4})?",
                Just("\"\\ud800\"".to_owned()),
                Just("\"\\udc00\\ud800\"".to_owned()),
                Just("\"\\u0000\"".to_owned()),
                "\\PC{0,60}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
                Just("null".to_owned()),
                Just("true".to_owned()),
                Just("{}".to_owned()),
                Just("[]".to_owned()),
                (1usize..2000).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
                (1usize..2000).prop_map(|d| format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d))),
                (1usize..70_000).prop_map(|n| format!("\"{}\"", "é".repeat(n / 2))),
            ]
        }

        proptest! {
            #![proptest_config(config())]

            #[test]
            fn arbitrary_text_is_an_error_or_a_report_never_a_panic(msg in "\\PC{0,3000}") {
                check_any(&msg)?;
            }

            #[test]
            fn arbitrary_bytes_read_lossily_never_panic(
                bytes in prop::collection::vec(any::<u8>(), 0..5000)
            ) {
                check_any(&String::from_utf8_lossy(&bytes))?;
            }

            #[test]
            fn valid_reports_read_back_equal_also_after_log_lines(
                r in valid_report(),
                log in prop::collection::vec("[^{\n][^\n]{0,80}", 0..20),
                broken_json_line in prop::option::of("\\{[^\n]{0,80}"),
            ) {
                let json = serde_json::to_string(&r).expect("json");
                prop_assert_eq!(check_any(&json)?, Some(r.clone()));
                let mut lines = log;
                if let Some(b) = broken_json_line {
                    lines.push(b);
                }
                lines.push(json);
                prop_assert_eq!(check_any(&lines.join("\n"))?, Some(r));
            }

            #[test]
            fn truncated_reports_are_container_failed(
                r in valid_report(),
                cut in any::<prop::sample::Index>(),
            ) {
                let json = serde_json::to_string(&r).expect("json");
                // Cut at a character boundary short of the end (the kubelet cuts bytes;
                // the API carries the text it kept).
                let chars: Vec<char> = json.chars().collect();
                let keep = cut.index(chars.len());
                let truncated: String = chars[..keep].iter().collect();
                prop_assert_eq!(check_any(&truncated)?, None);
            }

            #[test]
            fn hostile_json_values_duplicate_keys_and_nesting_never_panic(
                r in valid_report(),
                field in any::<prop::sample::Index>(),
                value in hostile_value(),
                duplicate in any::<bool>(),
                nest in prop_oneof![2 => Just(0usize), 1 => 1usize..200, 1 => 200usize..30_000],
            ) {
                let mut v = serde_json::to_value(&r).expect("value");
                let keys: Vec<String> = v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
                let key = keys[field.index(keys.len())].clone();
                v[&key] = serde_json::Value::String("__HOSTILE__".into());
                let mut text = v.to_string().replace("\"__HOSTILE__\"", &value);
                if duplicate {
                    // The same key twice: serde's derive refuses it ("duplicate field").
                    text = text.replacen('{', &format!("{{\"{key}\":{value},"), 1);
                }
                if nest > 0 {
                    text = format!("{}{text}{}", "[".repeat(nest), "]".repeat(nest));
                }
                let got = check_any(&text)?;
                if duplicate || nest > 0 {
                    prop_assert_eq!(got, None);
                }
            }
        }
    }
}
