//! Settings that are valid but defeat themselves: each mode prints one warning per
//! `(flag, why)` at start-up and runs on (`Console::setting_warning`). Pure; the two
//! modes' lists share the probe flags' part.

use crate::baseline::RECENT_MIN_SAMPLES;
use crate::config::{GateArgs, ProbeArgs, RunArgs, GATE_DEFAULT_HOLD};
use std::time::Duration;

/// One check: `(defeats itself, flag, why)`.
type Check = (bool, &'static str, String);

/// The `(flag, why)` of the checks that hold.
fn failing(checks: impl IntoIterator<Item = Check>) -> Vec<(&'static str, String)> {
    checks
        .into_iter()
        .filter(|(bad, _, _)| *bad)
        .map(|(_, flag, why)| (flag, why))
        .collect()
}

/// A duration as the flags take it (`1m 30s`).
fn d(v: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(v)
}

/// The probe flags both modes take: an `--attempt-timeout` longer than `--give-up` (a
/// single attempt outlasts the probe).
pub fn questionable_probe_settings(p: &ProbeArgs) -> Vec<(&'static str, String)> {
    failing([(
        p.attempt_timeout > p.give_up,
        "--attempt-timeout",
        format!(
            "{} is longer than --give-up ({}): one attempt outlasts the probe",
            d(p.attempt_timeout),
            d(p.give_up)
        ),
    )])
}

/// Settings that are valid but defeat themselves, as (flag, why): a `--timeout` shorter
/// than `--give-up` + `--hold` (a pair that never answers can then never be judged: it
/// ends `interrupted`, the run `inconclusive`), a `--max-ttfp` below `--slow-threshold`
/// (the p95 of probes that are all `success` can fail the gate), and
/// [`questionable_probe_settings`].
pub fn questionable_gate_settings(args: &GateArgs) -> Vec<(&'static str, String)> {
    let p = &args.probe;
    let one_probe = p.give_up + p.hold_or(GATE_DEFAULT_HOLD);
    let mut out = failing([
        (
            args.timeout < one_probe,
            "--timeout",
            format!(
                "{} is shorter than --give-up + --hold ({}): a pair that gets no answer is cut off before it can fail, and the run ends inconclusive",
                d(args.timeout),
                d(one_probe)
            ),
        ),
        (
            args.max_ttfp < p.slow_threshold,
            "--max-ttfp",
            format!(
                "{} is below --slow-threshold ({}): a probe between the two is a success, yet its TTFP can fail the gate (FAIL with no slow probe)",
                d(args.max_ttfp),
                d(p.slow_threshold)
            ),
        ),
    ]);
    out.extend(questionable_probe_settings(p));
    out
}

/// `prober run` settings that start but defeat themselves, as (flag, warning): a recent
/// window that cannot hold the 3 probes drift needs ([`RECENT_MIN_SAMPLES`])
/// at `--probe-interval` (one probe start per interval, jittered by ±20 %), a baseline
/// window that cannot hold `--baseline-min-samples`, and [`questionable_probe_settings`].
pub fn questionable_run_settings(args: &RunArgs) -> Vec<(&'static str, String)> {
    // One probe starts per --probe-interval, jittered by at most −20 %.
    let per_window = |w: Duration| w.as_secs_f64() / (0.8 * args.probe_interval.as_secs_f64());
    let recent = per_window(args.recent_window);
    let need = RECENT_MIN_SAMPLES as f64;
    let base = per_window(args.baseline_window);
    let min = args.drift.baseline_min_samples as f64;
    let mut out = failing([
        (
            recent < need,
            "--recent-window",
            format!(
                "{} holds at most ~{recent:.1} probes at --probe-interval {}: drift needs {need} recent probes and is never reported",
                d(args.recent_window),
                d(args.probe_interval)
            ),
        ),
        (
            args.baseline_ttfp.is_none() && base < min,
            "--baseline-window",
            format!(
                "{} holds at most ~{base:.0} probes at --probe-interval {}, fewer than --baseline-min-samples {min}: no baseline is ever learned",
                d(args.baseline_window),
                d(args.probe_interval)
            ),
        ),
    ]);
    out.extend(questionable_probe_settings(&args.probe));
    out
}
