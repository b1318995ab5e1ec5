//! Settings that are valid but defeat themselves: each mode prints one warning per
//! `(flag, why)` at start-up and runs on (`Console::setting_warning`). Pure; the two
//! modes' lists share the probe flags' part.

use crate::baseline::RECENT_MIN_SAMPLES;
use crate::config::{GateArgs, ProbeArgs, RunArgs, GATE_DEFAULT_HOLD};
use std::time::Duration;

/// The probe flags both modes take: an `--attempt-timeout` longer than `--give-up` (a
/// single attempt outlasts the probe).
pub fn questionable_probe_settings(p: &ProbeArgs) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if p.attempt_timeout > p.give_up {
        out.push((
            "--attempt-timeout",
            format!(
                "{} is longer than --give-up ({}): one attempt outlasts the probe",
                humantime::format_duration(p.attempt_timeout),
                humantime::format_duration(p.give_up)
            ),
        ));
    }
    out
}

/// Settings that are valid but defeat themselves, as (flag, why): a `--timeout` shorter
/// than `--give-up` + `--hold` (a pair that never answers can then never be judged: it
/// ends `interrupted`, the run `inconclusive`), a `--max-ttfp` below `--slow-threshold`
/// (the p95 of probes that are all `success` can fail the gate), and
/// [`questionable_probe_settings`].
pub fn questionable_gate_settings(args: &GateArgs) -> Vec<(&'static str, String)> {
    let p = &args.probe;
    let mut out = Vec::new();
    let one_probe = p.give_up + p.hold_or(GATE_DEFAULT_HOLD);
    if args.timeout < one_probe {
        out.push((
            "--timeout",
            format!(
                "{} is shorter than --give-up + --hold ({}): a pair that gets no answer is cut off before it can fail, and the run ends inconclusive",
                humantime::format_duration(args.timeout),
                humantime::format_duration(one_probe)
            ),
        ));
    }
    if args.max_ttfp < p.slow_threshold {
        out.push((
            "--max-ttfp",
            format!(
                "{} is below --slow-threshold ({}): a probe between the two is a success, yet its TTFP can fail the gate (FAIL with no slow probe)",
                humantime::format_duration(args.max_ttfp),
                humantime::format_duration(p.slow_threshold)
            ),
        ));
    }
    out.extend(questionable_probe_settings(p));
    out
}

/// `prober run` settings that start but defeat themselves, as (flag, warning): a recent
/// window that cannot hold the 3 probes drift needs ([`RECENT_MIN_SAMPLES`])
/// at `--probe-interval` (one probe start per interval, jittered by ±20 %), a baseline
/// window that cannot hold `--baseline-min-samples`.
pub fn questionable_run_settings(args: &RunArgs) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let interval = args.probe_interval.as_secs_f64();
    // One probe starts per --probe-interval, jittered by at most −20 %.
    let per_window = |w: Duration| w.as_secs_f64() / (0.8 * interval);
    let recent = per_window(args.recent_window);
    let need = RECENT_MIN_SAMPLES as f64;
    if recent < need {
        out.push((
            "--recent-window",
            format!(
                "{} holds at most ~{recent:.1} probes at --probe-interval {}: drift needs {need} recent probes and is never reported",
                humantime::format_duration(args.recent_window),
                humantime::format_duration(args.probe_interval)
            ),
        ));
    }
    let base = per_window(args.baseline_window);
    let min = args.drift.baseline_min_samples as f64;
    if args.baseline_ttfp.is_none() && base < min {
        out.push((
            "--baseline-window",
            format!(
                "{} holds at most ~{base:.0} probes at --probe-interval {}, fewer than --baseline-min-samples {min}: no baseline is ever learned",
                humantime::format_duration(args.baseline_window),
                humantime::format_duration(args.probe_interval)
            ),
        ));
    }
    out.extend(questionable_probe_settings(&args.probe));
    out
}
