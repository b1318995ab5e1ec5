//! `target-server probe --policy-change`: the source of a `policy_change` probe (issue
//! 32), which times a NetworkPolicy being created over two running pods, and deleted
//! again, on its own clock.
//!
//! The target is isolated by a deny-all ingress policy from its first instant. The
//! source dials it every `--interval` from process start, as in a plain probe, while the
//! prober marks the moments over HTTP on the source's own port (through the API
//! server's `pods/proxy`, or directly):
//!
//! | request | meaning |
//! |---|---|
//! | `POST /mark/arm` | sent just before the prober creates the allow policy |
//! | `POST /mark/allow` | sent right after the create returned |
//! | `POST /mark/revoke` | sent right after the delete of the allow policy returned |
//! | `GET /policy` (or `POST`) | the marks and the phase so far (JSON [`PolicyStatus`]); the prober reads `held_at` to know when to delete (with a POST, so that `create` on `pods/proxy` is the only verb it needs) |
//!
//! A mark is taken once (a repeated one answers with the first time, 200); a mark out
//! of order (`allow` before `arm`, `revoke` before `allow`) is refused with 409 and
//! changes nothing. Each answer is `{"mark": NAME, "at": SECONDS}` on the pod's clock.
//!
//! Phases of the dial loop ([`policy_loop`]):
//! 1. **isolated**: until the allow mark; answered attempts sent before the arm mark are
//!    isolation breaches (nothing admits the source yet). No allow mark within
//!    `--give-up` of process start ends the run (`no_allow_mark`).
//! 2. **admission**: the first answered attempt sent at or after the arm mark, within
//!    `--give-up` of the allow mark (else `not_admitted`); then the hold (`--hold`),
//!    whose failures are counted; then `held_at` is published.
//! 3. **waiting for revoke**: dialing on, at most `--give-up` after the hold
//!    (`no_revoke_mark`).
//! 4. **revocation**: after the revoke mark, until no attempt sent in the last
//!    `--revoke-quiet` was answered and at least one was refused (`revoked`), or
//!    `--give-up` after the mark with answers still coming (`still_admitted`).
//!
//! The report's [`SourcePolicy`] is derived from the attempt log and the marks by the
//! pure [`summarize`], so its rules are tested without I/O.

use crate::attempt::dial;
use crate::serve::Termination;
use crate::tally::{Attempt, Status, Tally};
use crate::ProcessStart;
use firstpacket_report::{PolicyOutcome, SourcePolicy};
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};

/// The three marks, in the only order they are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Just before the allow policy's create.
    Arm,
    /// Right after the create returned.
    Allow,
    /// Right after the delete returned.
    Revoke,
}

impl Mark {
    /// From the path segment (`arm`, `allow`, `revoke`).
    pub fn parse(s: &str) -> Option<Mark> {
        match s {
            "arm" => Some(Mark::Arm),
            "allow" => Some(Mark::Allow),
            "revoke" => Some(Mark::Revoke),
            _ => None,
        }
    }

    /// The path segment.
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Arm => "arm",
            Mark::Allow => "allow",
            Mark::Revoke => "revoke",
        }
    }
}

/// `GET /policy`: the marks and the hold's end so far, seconds since process start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PolicyStatus {
    pub arm_at: Option<f64>,
    pub allow_at: Option<f64>,
    pub revoke_at: Option<f64>,
    /// Earliest answered attempt sent at or after the arm mark, once observed.
    pub first_admitted_sent: Option<f64>,
    /// When the hold after it ended: the prober may delete the allow policy.
    pub held_at: Option<f64>,
}

/// The marks shared between the HTTP handlers and the dial loop.
#[derive(Debug)]
pub struct PolicyMarks {
    origin: ProcessStart,
    status: Mutex<PolicyStatus>,
    changed: watch::Sender<u32>,
}

/// Why a mark was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfOrder(pub String);

impl PolicyMarks {
    /// No mark yet.
    pub fn new(origin: ProcessStart) -> Arc<Self> {
        Arc::new(PolicyMarks {
            origin,
            status: Mutex::new(PolicyStatus::default()),
            changed: watch::channel(0).0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PolicyStatus> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `mark` now (seconds since process start) and returns its time; a mark
    /// already taken returns its first time. Errors: the previous mark is missing.
    pub fn mark(&self, mark: Mark) -> Result<f64, OutOfOrder> {
        let now = self.origin.elapsed_seconds();
        let at = {
            let mut s = self.lock();
            let (slot, before) = match mark {
                Mark::Arm => (&mut s.arm_at, None),
                Mark::Allow => {
                    let b = s.arm_at;
                    (&mut s.allow_at, Some(("arm", b)))
                }
                Mark::Revoke => {
                    let b = s.allow_at;
                    (&mut s.revoke_at, Some(("allow", b)))
                }
            };
            if let Some(at) = *slot {
                return Ok(at);
            }
            if let Some((name, None)) = before {
                return Err(OutOfOrder(format!(
                    "mark {} before mark {name}",
                    mark.as_str()
                )));
            }
            *slot = Some(now);
            now
        };
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        Ok(at)
    }

    /// The status now.
    pub fn status(&self) -> PolicyStatus {
        *self.lock()
    }

    fn update(&self, f: impl FnOnce(&mut PolicyStatus)) {
        f(&mut self.lock());
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn subscribe(&self) -> watch::Receiver<u32> {
        self.changed.subscribe()
    }
}

/// Settings of the policy loop (from `probe --policy-change`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyLoopConfig {
    /// Attempt spacing.
    pub interval: Duration,
    /// Bound on one attempt.
    pub attempt_timeout: Duration,
    /// Bound on each wait (module docs).
    pub give_up: Duration,
    /// Hold after the first admitted answer.
    pub hold: Duration,
    /// No answer among the attempts sent this long after the last one answered ends
    /// the revocation (must exceed the attempt timeout, so they have all finished).
    pub revoke_quiet: Duration,
}

/// The marks and the attempt log → the report's [`SourcePolicy`] (module docs). Pure.
/// `held_at` is the hold's end the loop published; `outcome` how the loop ended.
pub fn summarize(
    attempts: &[Attempt],
    status: &PolicyStatus,
    outcome: PolicyOutcome,
) -> SourcePolicy {
    let ok = |a: &&Attempt| a.status == Status::Success;
    let failed = |a: &&Attempt| matches!(a.status, Status::Failed(_));
    let before_arm: Vec<&Attempt> = attempts
        .iter()
        .filter(ok)
        .filter(|a| status.arm_at.is_none_or(|arm| a.sent < arm))
        .collect();
    let min = |it: &mut dyn Iterator<Item = f64>| {
        it.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
    };
    let max = |it: &mut dyn Iterator<Item = f64>| {
        it.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    let first_admitted_sent = status.arm_at.and_then(|arm| {
        min(&mut attempts
            .iter()
            .filter(ok)
            .filter(|a| a.sent >= arm && status.revoke_at.is_none_or(|r| a.sent < r))
            .map(|a| a.sent))
    });
    let hold_failures = match (first_admitted_sent, status.held_at) {
        (Some(first), Some(held)) => attempts
            .iter()
            .filter(failed)
            .filter(|a| a.sent > first && a.sent <= held)
            .count() as u64,
        _ => 0,
    };
    let after_revoke = |a: &&Attempt| status.revoke_at.is_some_and(|r| a.sent >= r);
    let last_admitted_sent = max(&mut attempts
        .iter()
        .filter(ok)
        .filter(after_revoke)
        .map(|a| a.sent));
    let first_blocked_sent = status.revoke_at.and_then(|r| {
        let from = last_admitted_sent.map_or(r, |l| l.max(r));
        min(&mut attempts
            .iter()
            .filter(failed)
            .filter(|a| a.sent >= from)
            .map(|a| a.sent))
    });
    let revoked_seconds = match (outcome, first_blocked_sent, status.revoke_at) {
        (PolicyOutcome::Revoked, Some(b), Some(r)) => Some((b - r).max(0.0)),
        _ => None,
    };
    SourcePolicy {
        arm_at: status.arm_at,
        allow_at: status.allow_at,
        revoke_at: status.revoke_at,
        admitted_before_arm: before_arm.len() as u64,
        first_admitted_before_arm_sent: min(&mut before_arm.iter().map(|a| a.sent)),
        first_admitted_sent,
        admitted_seconds: match (first_admitted_sent, status.allow_at) {
            (Some(s), Some(a)) => Some(s - a),
            _ => None,
        },
        held_at: status.held_at,
        hold_failures,
        last_admitted_sent,
        first_blocked_sent,
        revoked_seconds,
        outcome,
    }
}

/// The dial loop of a `--policy-change` source (module docs): dials `target` from
/// process start, follows the marks in `marks`, publishes the first admitted answer
/// and the hold's end there, and returns the attempt log, when dialing stopped, and
/// how it ended. Never fails.
pub async fn policy_loop(
    config: PolicyLoopConfig,
    target: std::net::SocketAddr,
    expect_pod: &str,
    origin: ProcessStart,
    termination: &mut Termination,
    marks: &PolicyMarks,
) -> (Tally, f64, PolicyOutcome) {
    let mut tally = Tally::new();
    let mut tasks: JoinSet<(usize, crate::attempt::AttemptOutcome)> = JoinSet::new();
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut changed = marks.subscribe();
    let expect: Arc<str> = Arc::from(expect_pod);
    let start = Instant::from_std(origin.start);
    let at = |secs: f64| start + Duration::from_secs_f64(secs.max(0.0));
    let mut hold_until: Option<Instant> = None;
    let mut outcome: Option<PolicyOutcome> = None;
    loop {
        let s = marks.status();
        let now_s = origin.elapsed_seconds();
        // The phase's deadline, or the end of the run.
        let deadline = if outcome.is_some() {
            None
        } else if let Some(revoke) = s.revoke_at {
            let last_ok = tally
                .attempts()
                .iter()
                .filter(|a| a.status == Status::Success && a.sent >= revoke)
                .map(|a| a.sent)
                .fold(revoke, f64::max);
            let refused = tally
                .attempts()
                .iter()
                .any(|a| matches!(a.status, Status::Failed(_)) && a.sent >= last_ok);
            let quiet_since = now_s - last_ok;
            if refused && quiet_since >= config.revoke_quiet.as_secs_f64() {
                outcome = Some(PolicyOutcome::Revoked);
                None
            } else if now_s >= revoke + config.give_up.as_secs_f64() {
                outcome = Some(PolicyOutcome::StillAdmitted);
                None
            } else {
                // At the earliest one tick from now: the quiet may have passed while the
                // refusals are still in flight (they end within the attempt timeout).
                let next = Instant::now() + config.interval;
                Some(
                    at(last_ok + config.revoke_quiet.as_secs_f64())
                        .max(next)
                        .min(at(revoke + config.give_up.as_secs_f64()).max(next)),
                )
            }
        } else if let Some(held) = s.held_at {
            Some(at(held + config.give_up.as_secs_f64()))
        } else if let Some(until) = hold_until {
            Some(until)
        } else if let Some(allow) = s.allow_at {
            Some(at(allow + config.give_up.as_secs_f64()))
        } else {
            Some(at(config.give_up.as_secs_f64()))
        };
        let Some(deadline) = deadline else {
            break;
        };
        tokio::select! {
            biased;
            _ = termination.recv() => {
                tasks.abort_all();
                return (tally, origin.elapsed_seconds(), PolicyOutcome::Terminated);
            }
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok((seq, o)) = joined {
                    let success = matches!(o.result, crate::attempt::AttemptResult::Success);
                    let sent = o.sent;
                    tally.finish(seq, o);
                    let s = marks.status();
                    if success && hold_until.is_none() && s.revoke_at.is_none()
                        && s.arm_at.is_some_and(|arm| sent >= arm)
                    {
                        eprintln!(
                            "target-server: admitted (attempt sent at {sent:.3}s), holding {}",
                            humantime::format_duration(config.hold)
                        );
                        marks.update(|st| st.first_admitted_sent = Some(sent));
                        hold_until = Some(Instant::now() + config.hold);
                    }
                }
            }
            _ = changed.changed() => {}
            _ = sleep_until(deadline) => {
                let s = marks.status();
                if s.revoke_at.is_some() {
                    // Re-evaluated at the top of the loop.
                } else if s.held_at.is_some() {
                    outcome = Some(PolicyOutcome::NoRevokeMark);
                } else if hold_until.is_some_and(|u| Instant::now() >= u) {
                    let now = origin.elapsed_seconds();
                    marks.update(|st| st.held_at = Some(now));
                } else if s.allow_at.is_some() && hold_until.is_none() {
                    outcome = Some(PolicyOutcome::NotAdmitted);
                } else if s.allow_at.is_none() {
                    outcome = Some(PolicyOutcome::NoAllowMark);
                }
            }
            _ = ticker.tick() => {
                let seq = tally.start(origin.elapsed_seconds());
                let expect = Arc::clone(&expect);
                let timeout = config.attempt_timeout;
                tasks.spawn(async move { (seq, dial(origin, target, &expect, timeout).await) });
            }
        }
    }
    let dial_end = origin.elapsed_seconds();
    // Drain: every in-flight attempt is bounded by the attempt timeout.
    while let Some(joined) = tasks.join_next().await {
        if let Ok((seq, o)) = joined {
            tally.finish(seq, o);
        }
    }
    (
        tally,
        dial_end,
        outcome.unwrap_or(PolicyOutcome::Terminated),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstpacket_report::ErrorKind;

    fn a(sent: f64, ok: bool) -> Attempt {
        Attempt {
            sent,
            received: sent + 0.01,
            status: if ok {
                Status::Success
            } else {
                Status::Failed(ErrorKind::Timeout)
            },
            retransmits: None,
        }
    }

    /// One attempt every 100 ms in `[from, to)`, answered where `ok`.
    fn run(from: f64, to: f64, ok: impl Fn(f64) -> bool) -> Vec<Attempt> {
        let (i0, i1) = ((from * 10.0).round() as i64, (to * 10.0).round() as i64);
        (i0..i1)
            .map(|i| i as f64 / 10.0)
            .map(|t| a(t, ok(t)))
            .collect()
    }

    #[test]
    fn admission_and_revocation_are_timed_from_the_marks_on_the_pods_clock() {
        // Isolated until 3.25 s (allow mark at 3.0), admitted until 7.42 (revoke at 7.3).
        let log = run(0.0, 10.0, |t| (3.25..7.42).contains(&t));
        let status = PolicyStatus {
            arm_at: Some(2.9),
            allow_at: Some(3.0),
            revoke_at: Some(7.3),
            first_admitted_sent: Some(3.3),
            held_at: Some(6.0),
        };
        let p = summarize(&log, &status, PolicyOutcome::Revoked);
        assert_eq!(p.admitted_before_arm, 0);
        let first = p.first_admitted_sent.expect("admitted");
        assert!((first - 3.3).abs() < 1e-9, "{first}");
        assert!((p.admitted_seconds.unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(p.hold_failures, 0);
        assert!((p.last_admitted_sent.unwrap() - 7.4).abs() < 1e-9);
        assert!((p.first_blocked_sent.unwrap() - 7.5).abs() < 1e-9);
        assert!((p.revoked_seconds.unwrap() - 0.2).abs() < 1e-9);
    }

    #[test]
    fn answers_before_the_arm_mark_are_breaches_and_hold_failures_are_counted() {
        let mut log = run(0.0, 6.0, |t| (1.0..1.25).contains(&t) || t >= 3.0);
        log.push(a(4.05, false));
        let status = PolicyStatus {
            arm_at: Some(2.0),
            allow_at: Some(2.1),
            revoke_at: None,
            first_admitted_sent: Some(3.0),
            held_at: Some(5.0),
        };
        let p = summarize(&log, &status, PolicyOutcome::NoRevokeMark);
        assert_eq!(p.admitted_before_arm, 3, "{p:?}");
        assert!((p.first_admitted_before_arm_sent.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(p.hold_failures, 1);
        assert_eq!(p.revoked_seconds, None);
        assert_eq!(p.outcome, PolicyOutcome::NoRevokeMark);
    }

    #[test]
    fn an_answer_between_arm_and_allow_gives_a_negative_latency_not_a_breach() {
        let log = run(0.0, 3.0, |t| t >= 2.0);
        let status = PolicyStatus {
            arm_at: Some(1.95),
            allow_at: Some(2.05),
            ..Default::default()
        };
        let p = summarize(&log, &status, PolicyOutcome::NoRevokeMark);
        assert_eq!(p.admitted_before_arm, 0);
        assert!(p.admitted_seconds.unwrap() < 0.0);
    }

    #[test]
    fn marks_are_taken_once_and_in_order() {
        let m = PolicyMarks::new(ProcessStart::now());
        assert!(m.mark(Mark::Allow).is_err());
        assert!(m.mark(Mark::Revoke).is_err());
        let arm = m.mark(Mark::Arm).expect("arm");
        assert_eq!(m.mark(Mark::Arm), Ok(arm));
        let allow = m.mark(Mark::Allow).expect("allow");
        assert!(allow >= arm);
        m.mark(Mark::Revoke).expect("revoke");
        let s = m.status();
        assert_eq!(s.arm_at, Some(arm));
        assert_eq!(s.allow_at, Some(allow));
        assert!(s.revoke_at.is_some());
        assert_eq!(Mark::parse("allow"), Some(Mark::Allow));
        assert_eq!(Mark::parse("x"), None);
    }
}
