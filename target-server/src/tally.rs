//! Pure accounting of the source's attempts → [`SourceReport`] (docs/design.md §2 steps 5–8).
//!
//! The dialer feeds every attempt in ([`Tally::start`] when it is spawned,
//! [`Tally::finish`] when it ends); [`Tally::report`] derives every number at the end,
//! so the rules below are tested without any I/O:
//! - `first_success_sent` = the **earliest send time** among successful attempts (an
//!   attempt sent earlier can complete after a later one; the dialer waits for every
//!   in-flight attempt before the report is made).
//! - attempts before success = attempts sent before it; failures before success = those
//!   of them that failed (in-flight ones at SIGTERM are not failures); `last_error` = the
//!   kind of the latest-**sent** failure before it (of all failures if none succeeded).
//! - hold = attempts sent after it, except failures sent before the first success
//!   after `ready_at` (below; those are pre-Ready or first-attempt failures, so a
//!   success before Ready followed by failures once Ready, then success, is not
//!   `lost_after_success`): `failures`, and `failures_per_second` bucketed by
//!   whole seconds since `first_success_sent`: `round(hold seconds)` buckets (at least
//!   1, at most [`MAX_HOLD_SERIES`]); the last bucket takes any tail.
//! - `raw_ttfp_seconds = first_success_sent − ready_at`, `ttfp_seconds = max(0, raw)`,
//!   both null unless both times exist.
//! - the view from Ready: `failures_before_ready` = failures before the first success
//!   sent before `ready_at` (all of them without `ready_at`);
//!   `first_success_after_ready_sent` = the earliest send time among successes sent at
//!   or after `ready_at`; `failures_after_ready_before_success` = failures sent at or
//!   after `ready_at` and before that success (every failure after `ready_at` if none).
//! - outcome: `terminated` on SIGTERM; else `lost_after_success` if the hold saw a
//!   failure, `success` if not; without success `wrong_peer` if any 200 came from another
//!   pod, else `no_success`.
//!
//! Memory: 24 bytes per attempt (bounded by `cli::MAX_ATTEMPTS`).

use crate::attempt::{AttemptOutcome, AttemptResult};
use firstpacket_report::{
    ErrorKind, PodProgramming, SourceHold, SourceOutcome, SourceReport, MAX_HOLD_SERIES,
    MAX_SOURCE_REPORT_BYTES, SCHEMA_VERSION,
};
use std::collections::BTreeMap;

/// State of one attempt in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Spawned, not finished (only left at the end after SIGTERM).
    InFlight,
    /// HTTP 200 from the expected pod.
    Success,
    /// Failed with this kind.
    Failed(ErrorKind),
}

/// One attempt: seconds since process start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attempt {
    /// Send time (just before `connect()`; the spawn time while in flight).
    pub sent: f64,
    /// Completion time (equal to `sent` while in flight).
    pub received: f64,
    /// Result.
    pub status: Status,
    /// TCP segments retransmitted on the attempt's connection (when it got an answer).
    pub retransmits: Option<u32>,
}

/// The attempt log plus the first wrong peer seen.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    attempts: Vec<Attempt>,
    wrong_peer: Option<String>,
    success_seen: bool,
    /// The target's programming wait from the latest-received successful answer.
    target_programming: Option<(f64, PodProgramming)>,
}

/// Everything besides the attempt log that goes into the report.
#[derive(Debug, Clone)]
pub struct ReportContext {
    /// This pod's name.
    pub pod: String,
    /// `--target` as given.
    pub target: String,
    /// `--expect-pod`.
    pub expect_pod: String,
    /// Settings, seconds.
    pub interval_seconds: f64,
    /// Settings, seconds.
    pub attempt_timeout_seconds: f64,
    /// Settings, seconds.
    pub give_up_seconds: f64,
    /// Settings, seconds.
    pub hold_seconds: f64,
    /// Wall clock at process start, Unix seconds.
    pub process_start_unix: f64,
    /// First kubelet `/readyz` answered 200, seconds since process start.
    pub ready_at: Option<f64>,
    /// When dialing stopped (hold over, give-up, or SIGTERM), seconds since start.
    pub dial_end: f64,
    /// Stopped by SIGTERM.
    pub terminated: bool,
}

impl Tally {
    /// Empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record a spawned attempt; `sent_estimate` stands in until it finishes. Returns its
    /// sequence number for [`Tally::finish`].
    pub fn start(&mut self, sent_estimate: f64) -> usize {
        self.attempts.push(Attempt {
            sent: sent_estimate,
            received: sent_estimate,
            status: Status::InFlight,
            retransmits: None,
        });
        self.attempts.len() - 1
    }

    /// Record the outcome of attempt `seq`. Returns `true` exactly once: on the first
    /// success observed (the dialer starts the hold then). Unknown `seq` is ignored.
    pub fn finish(&mut self, seq: usize, outcome: AttemptOutcome) -> bool {
        let Some(a) = self.attempts.get_mut(seq) else {
            return false;
        };
        a.sent = outcome.sent;
        a.received = outcome.received;
        a.retransmits = outcome.retransmits;
        if let (AttemptResult::Success, Some(p)) = (&outcome.result, outcome.peer_programming) {
            if self
                .target_programming
                .as_ref()
                .is_none_or(|(at, _)| outcome.received >= *at)
            {
                self.target_programming = Some((outcome.received, p));
            }
        }
        a.status = match outcome.result {
            AttemptResult::Success => Status::Success,
            AttemptResult::Failure { kind, peer } => {
                if kind == ErrorKind::WrongPeer && self.wrong_peer.is_none() {
                    self.wrong_peer = peer;
                }
                Status::Failed(kind)
            }
        };
        if a.status == Status::Success && !self.success_seen {
            self.success_seen = true;
            return true;
        }
        false
    }

    /// Whether any attempt has succeeded so far.
    pub fn has_success(&self) -> bool {
        self.success_seen
    }

    /// The attempt log, in spawn order.
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    /// Derive the report (rules in the module docs). Times are rounded to microseconds.
    pub fn report(&self, ctx: &ReportContext) -> SourceReport {
        let first_attempt = self
            .attempts
            .iter()
            .map(|a| a.sent)
            .min_by(|a, b| a.total_cmp(b));
        let first_success = self
            .attempts
            .iter()
            .filter(|a| a.status == Status::Success)
            .min_by(|a, b| a.sent.total_cmp(&b.sent))
            .copied();

        let mut errors: BTreeMap<ErrorKind, u64> = ErrorKind::ALL.iter().map(|k| (*k, 0)).collect();
        for a in &self.attempts {
            if let Status::Failed(k) = a.status {
                *errors.entry(k).or_insert(0) += 1;
            }
        }

        let before = |a: &Attempt| first_success.is_none_or(|s| a.sent < s.sent);
        let attempts_before_success = self.attempts.iter().filter(|a| before(a)).count() as u64;
        let failures_before_success = self
            .attempts
            .iter()
            .filter(|a| before(a) && matches!(a.status, Status::Failed(_)))
            .count() as u64;
        // The view of an application that starts connecting at Ready (ready_at).
        let ready_at = ctx.ready_at;
        let failures_before_ready = self
            .attempts
            .iter()
            .filter(|a| before(a) && ready_at.is_none_or(|r| a.sent < r))
            .filter(|a| matches!(a.status, Status::Failed(_)))
            .count() as u64;
        let after_ready = |a: &&Attempt| ready_at.is_some_and(|r| a.sent >= r);
        let first_success_after_ready = self
            .attempts
            .iter()
            .filter(after_ready)
            .filter(|a| a.status == Status::Success)
            .map(|a| a.sent)
            .min_by(|a, b| a.total_cmp(b));
        let failures_after_ready_before_success = self
            .attempts
            .iter()
            .filter(after_ready)
            .filter(|a| first_success_after_ready.is_none_or(|s| a.sent < s))
            .filter(|a| matches!(a.status, Status::Failed(_)))
            .count() as u64;
        let last_error = self
            .attempts
            .iter()
            .filter(|a| before(a))
            .filter_map(|a| match a.status {
                Status::Failed(k) => Some((a.sent, k)),
                _ => None,
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, k)| k);

        let mut hold = SourceHold::default();
        if let Some(s) = first_success {
            hold.seconds = (ctx.dial_end - s.sent).max(0.0);
            let buckets = (hold.seconds.round() as usize).clamp(1, MAX_HOLD_SERIES);
            hold.failures_per_second = vec![0; buckets];
            let mut first_taken = false;
            for a in &self.attempts {
                // The first success itself is not a hold attempt; ties in send time
                // with it are (only one attempt is "the" first success).
                if a.sent < s.sent {
                    continue;
                }
                if !first_taken && a.status == Status::Success && a.sent == s.sent {
                    first_taken = true;
                    continue;
                }
                let failed = matches!(a.status, Status::Failed(_));
                // A failure sent before the first success after Ready is no break of a
                // working path: before ready_at nothing is promised, after it it is a
                // first-attempt failure (module docs).
                if failed && first_success_after_ready.is_some_and(|r| a.sent < r) {
                    continue;
                }
                hold.attempts += 1;
                if failed {
                    hold.failures += 1;
                    let i = ((a.sent - s.sent).max(0.0).floor() as usize).min(buckets - 1);
                    hold.failures_per_second[i] = hold.failures_per_second[i].saturating_add(1);
                }
            }
        }

        let first_success_sent = first_success.map(|s| s.sent);
        let raw_ttfp = match (first_success_sent, ctx.ready_at) {
            (Some(s), Some(r)) => Some(round_us(s) - round_us(r)),
            _ => None,
        };
        let outcome = if ctx.terminated {
            SourceOutcome::Terminated
        } else if first_success.is_some() {
            if hold.failures > 0 {
                SourceOutcome::LostAfterSuccess
            } else {
                SourceOutcome::Success
            }
        } else if errors.get(&ErrorKind::WrongPeer).copied().unwrap_or(0) > 0 {
            SourceOutcome::WrongPeer
        } else {
            SourceOutcome::NoSuccess
        };
        hold.seconds = round_us(hold.seconds);

        SourceReport {
            schema: SCHEMA_VERSION,
            pod: ctx.pod.clone(),
            target: ctx.target.clone(),
            expect_pod: ctx.expect_pod.clone(),
            interval_seconds: round_us(ctx.interval_seconds),
            attempt_timeout_seconds: round_us(ctx.attempt_timeout_seconds),
            give_up_seconds: round_us(ctx.give_up_seconds),
            hold_seconds: round_us(ctx.hold_seconds),
            process_start_unix: round_us(ctx.process_start_unix),
            process_start: 0.0,
            first_attempt: first_attempt.map(round_us),
            ready_at: ctx.ready_at.map(round_us),
            first_success_sent: first_success_sent.map(round_us),
            first_success_received: first_success.map(|s| round_us(s.received)),
            first_success_retransmits: first_success.and_then(|s| s.retransmits),
            ttfp_seconds: raw_ttfp.map(|r| round_us(r.max(0.0))),
            raw_ttfp_seconds: raw_ttfp.map(round_us),
            attempts_before_success,
            failures_before_success,
            failures_before_ready,
            first_success_after_ready_sent: first_success_after_ready.map(round_us),
            failures_after_ready_before_success,
            errors,
            last_error,
            wrong_peer: self.wrong_peer.clone(),
            hold,
            outcome,
            programming: None,
            target_programming: self.target_programming.as_ref().map(|(_, p)| p.clone()),
            policy: None,
            paths: Vec::new(),
        }
    }
}

/// Round seconds to microseconds (keeps the JSON short; the clock is not finer anyway
/// for what we measure).
pub fn round_us(s: f64) -> f64 {
    (s * 1e6).round() / 1e6
}

/// Longest string kept in a source report (Kubernetes object names are ≤ 253
/// characters: Kubernetes docs "Object Names and IDs").
pub const MAX_REPORT_STRING: usize = 253;

/// Longest `node_addr` kept in a report (`[IPv6]:port` is at most 47 characters; the
/// target's copy comes from its answer, so it is bounded here too).
pub const MAX_NODE_ADDR: usize = 64;

/// Serialise `report` as one compact JSON line (no newline) of at most
/// [`MAX_SOURCE_REPORT_BYTES`] bytes: strings are cut to [`MAX_REPORT_STRING`]
/// characters, then, if still too long, the hold's per-second series is shortened from
/// its end (totals stay), and then extra `paths` are dropped from the end. The kubelet keeps only the last 4096 bytes of a termination
/// message, so an over-long report would lose its start and not parse.
pub fn encode_bounded(report: &SourceReport) -> String {
    let mut r = report.clone();
    for s in [&mut r.pod, &mut r.target, &mut r.expect_pod] {
        if s.chars().count() > MAX_REPORT_STRING {
            *s = crate::attempt::truncate_chars(s, MAX_REPORT_STRING);
        }
    }
    for p in [&mut r.programming, &mut r.target_programming]
        .into_iter()
        .flatten()
    {
        if let Some(a) = p.node_addr.as_mut() {
            if a.chars().count() > MAX_NODE_ADDR {
                *a = crate::attempt::truncate_chars(a, MAX_NODE_ADDR);
            }
        }
    }
    if let Some(p) = r.wrong_peer.as_mut() {
        if p.chars().count() > MAX_REPORT_STRING {
            *p = crate::attempt::truncate_chars(p, MAX_REPORT_STRING);
        }
    }
    loop {
        let line = serde_json::to_string(&r).unwrap_or_default();
        if line.len() <= MAX_SOURCE_REPORT_BYTES {
            return line;
        }
        if r.hold.failures_per_second.is_empty() {
            // Last resort: the extra paths, from the end (the prober reports a path
            // without a line as inconclusive, never guesses it).
            if r.paths.pop().is_some() {
                continue;
            }
            return line;
        }
        let excess = line.len() - MAX_SOURCE_REPORT_BYTES;
        // Each entry costs ≥ 2 bytes ("0,"); drop at least enough, at least one.
        let drop = (excess / 2).max(1).min(r.hold.failures_per_second.len());
        let keep = r.hold.failures_per_second.len() - drop;
        r.hold.failures_per_second.truncate(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(ready_at: Option<f64>, dial_end: f64) -> ReportContext {
        ReportContext {
            pod: "src".into(),
            target: "10.0.0.2:8080".into(),
            expect_pod: "tgt".into(),
            interval_seconds: 0.1,
            attempt_timeout_seconds: 0.9,
            give_up_seconds: 60.0,
            hold_seconds: 5.0,
            process_start_unix: 1_700_000_000.5,
            ready_at,
            dial_end,
            terminated: false,
        }
    }

    fn ok(sent: f64, received: f64) -> AttemptOutcome {
        AttemptOutcome {
            sent,
            received,
            result: AttemptResult::Success,
            peer_programming: None,
            retransmits: None,
        }
    }

    fn fail(sent: f64, received: f64, kind: ErrorKind) -> AttemptOutcome {
        AttemptOutcome {
            sent,
            received,
            result: AttemptResult::Failure { kind, peer: None },
            peer_programming: None,
            retransmits: None,
        }
    }

    /// Feed attempts in completion order; `seq` is the spawn order.
    fn tally(done: Vec<(usize, AttemptOutcome)>) -> Tally {
        let n = done.iter().map(|(s, _)| s + 1).max().unwrap_or(0);
        let mut t = Tally::new();
        for i in 0..n {
            t.start(i as f64 * 0.1);
        }
        for (seq, o) in done {
            t.finish(seq, o);
        }
        t
    }

    #[test]
    fn earliest_sent_success_wins_even_if_it_completes_later() {
        // #0 refused, #1 (sent 0.1) succeeds slowly at 0.8, #2 (sent 0.2) fast at 0.25.
        let t = tally(vec![
            (0, fail(0.0, 0.001, ErrorKind::Refused)),
            (2, ok(0.2, 0.25)),
            (1, ok(0.1, 0.8)),
        ]);
        let r = t.report(&ctx(Some(0.05), 5.0));
        assert_eq!(r.first_success_sent, Some(0.1));
        assert_eq!(r.first_success_received, Some(0.8));
        assert_eq!(r.attempts_before_success, 1);
        assert_eq!(r.failures_before_success, 1);
        assert_eq!(r.last_error, Some(ErrorKind::Refused));
        assert_eq!(r.first_attempt, Some(0.0));
    }

    #[test]
    fn finish_reports_the_first_observed_success_once() {
        let mut t = Tally::new();
        let a = t.start(0.0);
        let b = t.start(0.1);
        assert!(t.finish(b, ok(0.1, 0.2)));
        assert!(!t.finish(a, ok(0.0, 0.3)));
        assert!(t.has_success());
    }

    #[test]
    fn success_before_ready_gives_zero_ttfp_and_keeps_the_negative_raw_value() {
        let t = tally(vec![(0, ok(0.0, 0.01))]);
        let r = t.report(&ctx(Some(0.7), 5.0));
        assert_eq!(r.raw_ttfp_seconds, Some(-0.7));
        assert_eq!(r.ttfp_seconds, Some(0.0));
        assert_eq!(r.outcome, SourceOutcome::Success);
    }

    #[test]
    fn ttfp_is_success_send_minus_ready() {
        let t = tally(vec![
            (0, fail(0.0, 0.9, ErrorKind::Timeout)),
            (1, fail(0.1, 1.0, ErrorKind::Timeout)),
            (2, ok(0.2, 0.21)),
        ]);
        let r = t.report(&ctx(Some(0.05), 5.0));
        assert_eq!(r.raw_ttfp_seconds, Some(0.15));
        assert_eq!(r.ttfp_seconds, Some(0.15));
        assert_eq!(r.errors[&ErrorKind::Timeout], 2);
        assert_eq!(r.errors[&ErrorKind::Refused], 0);
    }

    #[test]
    fn no_ready_at_means_null_ttfp() {
        let t = tally(vec![(0, ok(0.0, 0.01))]);
        let r = t.report(&ctx(None, 5.0));
        assert_eq!(r.ttfp_seconds, None);
        assert_eq!(r.raw_ttfp_seconds, None);
        assert_eq!(r.first_success_sent, Some(0.0));
    }

    #[test]
    fn failures_after_the_first_success_are_hold_failures_per_second() {
        let t = tally(vec![
            (0, ok(0.0, 0.01)),
            (1, fail(0.5, 0.51, ErrorKind::Reset)),
            (2, ok(1.2, 1.21)),
            (3, fail(2.5, 2.51, ErrorKind::Refused)),
            (4, fail(2.7, 2.71, ErrorKind::Refused)),
        ]);
        // Ready before the first success: every later failure is a hold failure.
        let r = t.report(&ctx(Some(0.0), 3.0));
        assert_eq!(r.outcome, SourceOutcome::LostAfterSuccess);
        assert_eq!(r.hold.attempts, 4);
        assert_eq!(r.hold.failures, 3);
        assert_eq!(r.hold.failures_per_second, vec![1, 0, 2]);
        assert_eq!(r.hold.seconds, 3.0);
        assert_eq!(r.attempts_before_success, 0);
        assert_eq!(r.last_error, None);
    }

    #[test]
    fn only_wrong_peers_answering_is_outcome_wrong_peer() {
        let mut t = Tally::new();
        for i in 0..3 {
            let seq = t.start(i as f64);
            t.finish(
                seq,
                AttemptOutcome {
                    sent: i as f64,
                    received: i as f64 + 0.01,
                    result: AttemptResult::Failure {
                        kind: ErrorKind::WrongPeer,
                        peer: Some(format!("other-{i}")),
                    },
                    peer_programming: None,
                    retransmits: None,
                },
            );
        }
        let r = t.report(&ctx(Some(0.1), 60.0));
        assert_eq!(r.outcome, SourceOutcome::WrongPeer);
        assert_eq!(r.wrong_peer.as_deref(), Some("other-0"));
        assert_eq!(r.attempts_before_success, 3);
        assert_eq!(r.failures_before_success, 3);
        assert_eq!(r.first_success_sent, None);
        assert_eq!(r.ttfp_seconds, None);
        assert_eq!(r.hold, SourceHold::default());
    }

    #[test]
    fn no_success_without_wrong_peer_is_no_success() {
        let t = tally(vec![(0, fail(0.0, 0.9, ErrorKind::Timeout))]);
        let r = t.report(&ctx(Some(0.1), 60.0));
        assert_eq!(r.outcome, SourceOutcome::NoSuccess);
        assert_eq!(r.last_error, Some(ErrorKind::Timeout));
    }

    #[test]
    fn last_error_is_the_latest_sent_failure_not_the_latest_completed() {
        // #0 times out (completes last), #1 refused quickly, then #2 succeeds.
        let t = tally(vec![
            (1, fail(0.1, 0.101, ErrorKind::Refused)),
            (2, ok(0.2, 0.21)),
            (0, fail(0.0, 0.9, ErrorKind::Timeout)),
        ]);
        assert_eq!(
            t.report(&ctx(None, 5.0)).last_error,
            Some(ErrorKind::Refused)
        );
    }

    #[test]
    fn in_flight_attempts_at_sigterm_count_as_sent_not_failed() {
        let mut t = Tally::new();
        let a = t.start(0.0);
        t.finish(a, fail(0.0, 0.001, ErrorKind::Refused));
        t.start(0.1);
        let mut c = ctx(None, 0.15);
        c.terminated = true;
        let r = t.report(&c);
        assert_eq!(r.outcome, SourceOutcome::Terminated);
        assert_eq!(r.attempts_before_success, 2);
        assert_eq!(r.failures_before_success, 1);
    }

    #[test]
    fn failures_are_split_at_ready_and_counted_from_ready_to_the_first_success_after_it() {
        // Sent at 0.0..0.9 every 0.1 s; ready_at 0.45. Failures at 0.0–0.2 (pre-Ready),
        // successes at 0.3, 0.4 (before Ready), failures at 0.5, 0.6 (after Ready), success 0.7.
        let mut t = Tally::new();
        for i in 0..10 {
            let sent = i as f64 * 0.1;
            let seq = t.start(sent);
            let o = match i {
                3 | 4 | 7..=9 => ok(sent, sent + 0.01),
                _ => fail(sent, sent + 0.05, ErrorKind::Timeout),
            };
            t.finish(seq, o);
        }
        let r = t.report(&ctx(Some(0.45), 1.0));
        assert_eq!(r.first_success_sent, Some(0.3));
        assert_eq!(r.failures_before_success, 3);
        assert_eq!(r.failures_before_ready, 3);
        assert_eq!(r.first_success_after_ready_sent, Some(0.7));
        assert_eq!(r.failures_after_ready_before_success, 2);

        // Without ready_at everything is "before Ready", nothing after it.
        let r = t.report(&ctx(None, 1.0));
        assert_eq!(r.failures_before_ready, 3);
        assert_eq!(r.first_success_after_ready_sent, None);
        assert_eq!(r.failures_after_ready_before_success, 0);

        // Ready before any attempt: all failures before the first success are after it.
        let r = t.report(&ctx(Some(0.0), 1.0));
        assert_eq!(r.failures_before_ready, 0);
        assert_eq!(r.first_success_after_ready_sent, Some(0.3));
        assert_eq!(r.failures_after_ready_before_success, 3);

        // Failures between the pre-Ready successes and the first success after Ready
        // are no hold failures (the source would not be lost_after_success).
        let r = t.report(&ctx(Some(0.45), 1.0));
        assert_eq!(r.hold.failures, 0);
        assert_eq!(r.outcome, SourceOutcome::Success);
        let r = t.report(&ctx(None, 1.0));
        assert_eq!(r.hold.failures, 2, "without Ready they are");

        // No success after Ready: every failure after it counts.
        let r = t.report(&ctx(Some(0.95), 1.0));
        assert_eq!(r.first_success_after_ready_sent, None);
        assert_eq!(r.failures_after_ready_before_success, 0);
        let r = t.report(&ctx(Some(0.55), 1.0));
        assert_eq!(r.first_success_after_ready_sent, Some(0.7));
        assert_eq!(r.failures_after_ready_before_success, 1);
    }

    #[test]
    fn hold_series_is_bounded() {
        let mut t = Tally::new();
        let s = t.start(0.0);
        t.finish(s, ok(0.0, 0.01));
        for i in 1..400 {
            let seq = t.start(i as f64);
            t.finish(seq, fail(i as f64, i as f64 + 0.5, ErrorKind::Timeout));
        }
        let r = t.report(&ctx(None, 400.0));
        assert_eq!(r.hold.failures_per_second.len(), MAX_HOLD_SERIES);
        assert_eq!(r.hold.failures, 399);
        // One failure per second from second 1 on; the tail beyond the series
        // (seconds 119..399) lands in the last bucket.
        assert_eq!(r.hold.failures_per_second[0], 0);
        assert_eq!(r.hold.failures_per_second[1], 1);
        assert_eq!(
            r.hold.failures_per_second[MAX_HOLD_SERIES - 1] as usize,
            399 - (MAX_HOLD_SERIES - 2)
        );
    }

    fn worst_case_report() -> SourceReport {
        let name = "n".repeat(400);
        let mut errors = BTreeMap::new();
        for k in ErrorKind::ALL {
            errors.insert(k, u64::MAX);
        }
        SourceReport {
            schema: SCHEMA_VERSION,
            pod: name.clone(),
            target: "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535".into(),
            expect_pod: name.clone(),
            interval_seconds: 123456.123457,
            attempt_timeout_seconds: 123456.123457,
            give_up_seconds: 123456.123457,
            hold_seconds: 123456.123457,
            process_start_unix: 1_999_999_999.123457,
            process_start: 0.0,
            first_attempt: Some(123456.123457),
            ready_at: Some(123456.123457),
            first_success_sent: Some(123456.123457),
            first_success_received: Some(123456.123457),
            first_success_retransmits: Some(u32::MAX),
            ttfp_seconds: Some(123456.123457),
            raw_ttfp_seconds: Some(-123456.123457),
            attempts_before_success: u64::MAX,
            failures_before_success: u64::MAX,
            failures_before_ready: u64::MAX,
            first_success_after_ready_sent: Some(123456.123457),
            failures_after_ready_before_success: u64::MAX,
            errors,
            last_error: Some(ErrorKind::HttpStatus),
            wrong_peer: Some(name),
            hold: SourceHold {
                seconds: 123456.123457,
                attempts: u64::MAX,
                failures: u64::MAX,
                failures_per_second: vec![u32::MAX; MAX_HOLD_SERIES],
            },
            outcome: SourceOutcome::LostAfterSuccess,
            programming: Some(worst_programming()),
            target_programming: Some(worst_programming()),
            paths: Vec::new(),
            policy: Some(firstpacket_report::SourcePolicy {
                arm_at: Some(123456.123457),
                allow_at: Some(123456.123457),
                revoke_at: Some(123456.123457),
                admitted_before_arm: u64::MAX,
                first_admitted_before_arm_sent: Some(123456.123457),
                first_admitted_sent: Some(123456.123457),
                admitted_seconds: Some(-123456.123457),
                held_at: Some(123456.123457),
                hold_failures: u64::MAX,
                last_admitted_sent: Some(123456.123457),
                first_blocked_sent: Some(123456.123457),
                revoked_seconds: Some(123456.123457),
                outcome: firstpacket_report::PolicyOutcome::StillAdmitted,
            }),
        }
    }

    fn worst_programming() -> PodProgramming {
        PodProgramming {
            method: Some(firstpacket_report::ProgrammingMethod::KubeletProbe),
            wait_seconds: Some(123456.123457),
            resolution_seconds: Some(123456.123457),
            node_addr: Some("a".repeat(400)),
            node_dial_attempts: u64::MAX,
            node_dial_failures: u64::MAX,
            node_dial_first_success_sent: Some(123456.123457),
            node_dial_last_error: Some(ErrorKind::Unreachable),
            node_dial_gave_up: Some(123456.123457),
            first_kubelet_request: Some(123456.123457),
            ready_at: Some(123456.123457),
        }
    }

    #[test]
    fn the_target_programming_kept_is_the_latest_received_answers() {
        let prog = |wait: f64| PodProgramming {
            wait_seconds: Some(wait),
            ..PodProgramming::default()
        };
        let mut t = Tally::new();
        let (a, b, c) = (t.start(0.0), t.start(0.1), t.start(0.2));
        let with = |sent: f64, received: f64, p: Option<PodProgramming>, ok: bool| AttemptOutcome {
            sent,
            received,
            result: if ok {
                AttemptResult::Success
            } else {
                AttemptResult::Failure {
                    kind: ErrorKind::Timeout,
                    peer: None,
                }
            },
            peer_programming: p,
            retransmits: None,
        };
        t.finish(b, with(0.1, 0.15, Some(prog(1.0)), true));
        // Received earlier than the one kept: ignored.
        t.finish(a, with(0.0, 0.12, Some(prog(0.5)), true));
        // A failure never carries one.
        t.finish(c, with(0.2, 0.3, Some(prog(9.0)), false));
        let r = t.report(&ctx(Some(0.1), 1.0));
        assert_eq!(r.target_programming.and_then(|p| p.wait_seconds), Some(1.0));
        assert_eq!(
            r.programming, None,
            "the tally does not know this pod's own"
        );
    }

    #[test]
    fn worst_case_report_fits_the_termination_message_budget_and_parses() {
        let line = encode_bounded(&worst_case_report());
        assert!(
            line.len() <= MAX_SOURCE_REPORT_BYTES,
            "{} bytes",
            line.len()
        );
        assert!(!line.contains('\n'));
        let back: SourceReport = serde_json::from_str(&line).expect("parses");
        assert_eq!(back.outcome, SourceOutcome::LostAfterSuccess);
        assert_eq!(back.pod.chars().count(), MAX_REPORT_STRING);
        assert_eq!(back.hold.failures, u64::MAX);
    }

    #[test]
    fn extra_paths_are_dropped_from_the_end_only_when_nothing_else_is_left_to_cut() {
        let path = firstpacket_report::SourcePath {
            path: "udp/ipv6/mtu".parse().unwrap(),
            bytes: Some(9216),
            first_success_sent: Some(123456.123457),
            retransmits: Some(u32::MAX),
            attempts: u64::MAX,
            failures: u64::MAX,
            last_error: Some(ErrorKind::HttpStatus),
            hold_failures: u64::MAX,
            outcome: SourceOutcome::LostAfterSuccess,
        };
        let mut worst = worst_case_report();
        worst.paths = vec![path.clone(); 7];
        let line = encode_bounded(&worst);
        assert!(
            line.len() <= MAX_SOURCE_REPORT_BYTES,
            "{} bytes",
            line.len()
        );
        let back: SourceReport = serde_json::from_str(&line).expect("parses");
        assert!(back.paths.len() < 7 && back.hold.failures_per_second.is_empty());
        // A realistic report keeps all seven (short names, counts of a 65 s probe; the
        // hold's series may be cut first).
        let mut real = worst_case_report();
        real.pod = "fp-4k2j9x7q-0-s".into();
        real.expect_pod = "fp-4k2j9x7q-0-t".into();
        real.target = "10.244.17.203:8080".into();
        real.wrong_peer = None;
        for p in [&mut real.programming, &mut real.target_programming]
            .into_iter()
            .flatten()
        {
            p.node_addr = Some("10.0.17.4:10250".into());
            p.node_dial_attempts = 650;
            p.node_dial_failures = 650;
        }
        real.attempts_before_success = 650;
        real.failures_before_success = 650;
        real.errors = ErrorKind::ALL.iter().map(|k| (*k, 650)).collect();
        real.hold.attempts = 650;
        real.hold.failures = 650;
        real.hold.failures_per_second = vec![10; 30];
        real.paths = (0..7)
            .map(|_| firstpacket_report::SourcePath {
                attempts: 650,
                failures: 650,
                hold_failures: 650,
                retransmits: Some(12),
                ..path.clone()
            })
            .collect();
        let line = encode_bounded(&real);
        let back: SourceReport = serde_json::from_str(&line).expect("parses");
        assert_eq!(back.paths.len(), 7, "{} bytes", line.len());
        assert!(line.len() <= MAX_SOURCE_REPORT_BYTES);
    }

    #[test]
    fn realistic_report_is_not_trimmed() {
        let mut t = Tally::new();
        let s = t.start(0.0);
        t.finish(s, ok(0.0, 0.01));
        for i in 1..300 {
            let sent = i as f64 * 0.1;
            let seq = t.start(sent);
            t.finish(seq, fail(sent, sent + 0.9, ErrorKind::Timeout));
        }
        let mut c = ctx(Some(0.5), 30.0);
        c.pod = "firstpacket-src-0123456789abcdef-xyz12".into();
        c.expect_pod = "firstpacket-tgt-0123456789abcdef-xyz12".into();
        let r = t.report(&c);
        let line = encode_bounded(&r);
        let back: SourceReport = serde_json::from_str(&line).expect("parses");
        assert_eq!(back.hold.failures_per_second, r.hold.failures_per_second);
        assert_eq!(back.hold.failures_per_second.len(), 30);
        assert_eq!(back.pod, r.pod);
        assert_eq!(back.expect_pod, r.expect_pod);
    }
}
