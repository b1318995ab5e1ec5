//! `target-server probe`: the source pod S (docs/design.md §2 steps 4–8).
//!
//! From process start S serves `/`, `/readyz`, `/healthz` on `--port` (so the kubelet can
//! mark it Ready and `ready_at` is recorded, see [`crate::http`]) and dials `--target`:
//! a new attempt ([`crate::attempt::dial`]) every `--interval` on a tokio interval with
//! [`MissedTickBehavior::Skip`] (after a stall the next attempt goes out on the next
//! tick, never a burst), each spawned so attempts overlap.
//!
//! Phases:
//! 1. **search** until the first success is observed or `--give-up` (since process
//!    start) passes; at give-up no new attempt is sent, in-flight ones may still succeed
//!    (their send time was within give-up), which then starts the hold.
//! 2. **hold**: keep dialing for `--hold` after the first success was observed.
//! 3. **drain**: wait for every in-flight attempt (each bounded by `--attempt-timeout`),
//!    so the earliest-sent success is known before `first_success_sent` is fixed.
//!
//! Then one JSON line ([`crate::tally::encode_bounded`]) goes to `--termination-log`
//! (created/truncated; a write error is logged on stderr and ignored) and stdout, and
//! the process exits 0. SIGTERM/SIGINT at any point: `/readyz` → 503, dialing stops,
//! in-flight attempts are dropped, the report is written with outcome `terminated`.

use crate::attempt::dial;
use crate::http::{self, ServerState};
use crate::identity::Identity;
use crate::node_path::{dial_node, NodeDialConfig};
use crate::paths::PathSpec;
use crate::serve::{bind, Termination};
use crate::tally::{encode_bounded, ReportContext, Tally};
use crate::{Error, ProcessStart};
use firstpacket_report::{SourcePath, SourceReport};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};

/// Validated `probe` settings (from [`crate::cli::ProbeArgs::to_config`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Address dialed (`--target`).
    pub target: SocketAddr,
    /// The only pod name that counts as success (`--expect-pod`).
    pub expect_pod: String,
    /// This pod's own HTTP port (`--port`; 0 = any free port).
    pub port: u16,
    /// Attempt spacing (`--interval`, ≥ 1 ms).
    pub interval: Duration,
    /// Bound on one attempt (`--attempt-timeout`, ≥ 1 ms).
    pub attempt_timeout: Duration,
    /// No success this long after process start → stop (`--give-up`).
    pub give_up: Duration,
    /// Keep dialing this long after the first success (`--hold`).
    pub hold: Duration,
    /// Longest wait for `ready_at` after dialing ended (`--ready-wait`).
    pub ready_wait: Duration,
    /// Where the report line is written (`--termination-log`).
    pub termination_log: PathBuf,
    /// This pod's node `IP:PORT` for the programming wait (`--node-ip`, `--node-port`).
    pub node: Option<SocketAddr>,
    /// `--policy-change` with its `--revoke-quiet` ([`crate::policy`]).
    pub policy_change: Option<Duration>,
    /// Extra paths dialed beside `target` (`--path`, [`crate::paths`]).
    pub paths: Vec<PathSpec>,
    /// `--mtu`: the full-size packets' IP size; else each path's route MTU.
    pub mtu: Option<u32>,
}

impl ProbeConfig {
    /// The node dial's settings: the probe's spacing, timeout and give-up.
    pub fn node_dial(&self) -> NodeDialConfig {
        NodeDialConfig {
            node: self.node,
            interval: self.interval,
            attempt_timeout: self.attempt_timeout,
            give_up: self.give_up,
        }
    }
}

/// Kubelet readiness answers the source waits for before it exits (see [`run`]).
pub const READY_ANSWERS: u32 = 2;

/// How the dial loop ended.
#[derive(Debug)]
pub struct DialRun {
    /// The attempt log.
    pub tally: Tally,
    /// When dialing stopped, seconds since process start.
    pub dial_end: f64,
    /// Stopped by SIGTERM/SIGINT.
    pub terminated: bool,
}

/// Run the whole probe: serve, dial, hold, report. Returns the report that was written.
///
/// Errors: [`Error::Bind`] if `--port` cannot be bound, [`Error::Runtime`] if the signal
/// handlers cannot be installed. A termination-log write failure is not an error.
pub async fn run(
    config: ProbeConfig,
    identity: Identity,
    origin: ProcessStart,
) -> Result<SourceReport, Error> {
    let mut termination = Termination::install()?;
    let listener = bind(config.port).await?;
    let state = ServerState::with_node_dial(identity, origin, config.node, config.interval);
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = tokio::spawn(http::serve(listener, Arc::clone(&state), stop_rx));
    let node_dial = tokio::spawn(dial_node(config.node_dial(), origin, Arc::clone(&state)));

    let marks = config.policy_change.map(|quiet| {
        let m = crate::policy::PolicyMarks::new(origin);
        state.serve_policy_marks(Arc::clone(&m));
        (m, quiet)
    });
    let mut policy = None;
    let mut paths = Vec::new();
    let mut run = match &marks {
        None => {
            let (main, extra) = dial_all(&config, origin, &mut termination).await;
            paths = extra;
            main
        }
        Some((m, quiet)) => {
            let loop_config = crate::policy::PolicyLoopConfig {
                interval: config.interval,
                attempt_timeout: config.attempt_timeout,
                give_up: config.give_up,
                hold: config.hold,
                revoke_quiet: *quiet,
            };
            let (tally, dial_end, outcome) = crate::policy::policy_loop(
                loop_config,
                config.target,
                &config.expect_pod,
                origin,
                &mut termination,
                m,
            )
            .await;
            policy = Some(crate::policy::summarize(
                tally.attempts(),
                &m.status(),
                outcome,
            ));
            DialRun {
                terminated: outcome == firstpacket_report::PolicyOutcome::Terminated,
                tally,
                dial_end,
            }
        }
    };
    if !run.terminated && state.ready_answers() < READY_ANSWERS && !config.ready_wait.is_zero() {
        // The dialing ended before the kubelet's readiness probes were answered twice (a
        // short `--hold` after an early success): TTFP needs `ready_at`, so wait — the
        // kubelet probes every `periodSeconds` (1 s for probe pods) — for at most
        // `--ready-wait`. Without it the prober would call a healthy source "never
        // Ready". Twice, because the first answer may reach a kubelet that already gave
        // up on that probe (its SYN was dropped while the CNI programmed the pod, the
        // retransmission 1 s later meets the kubelet's 1 s timeout): the pod would call
        // itself Ready while the API never does.
        let mut answers = state.subscribe_ready_answers();
        let wait = async {
            while *answers.borrow_and_update() < READY_ANSWERS {
                if answers.changed().await.is_err() {
                    break;
                }
            }
        };
        tokio::select! {
            _ = tokio::time::timeout(config.ready_wait, wait) => {}
            _ = termination.recv() => run.terminated = true,
        }
    }
    if run.terminated {
        state.set_not_ready();
        eprintln!("target-server: SIGTERM, /readyz now 503, dialing stopped");
    }
    node_dial.abort();
    let mut report = run.tally.report(&ReportContext {
        pod: state.identity().pod.clone(),
        target: config.target.to_string(),
        expect_pod: config.expect_pod.clone(),
        interval_seconds: config.interval.as_secs_f64(),
        attempt_timeout_seconds: config.attempt_timeout.as_secs_f64(),
        give_up_seconds: config.give_up.as_secs_f64(),
        hold_seconds: config.hold.as_secs_f64(),
        process_start_unix: origin.unix_seconds(),
        ready_at: state.ready_at(),
        dial_end: run.dial_end,
        terminated: run.terminated,
    });
    report.programming = Some(state.programming());
    report.policy = policy;
    report.paths = paths
        .into_iter()
        .map(|(spec, bytes, path_run)| source_path(&spec, bytes, &path_run, state.ready_at()))
        .collect();
    let line = encode_bounded(&report);
    write_report(&config.termination_log, &line);
    println!("{line}");
    let _ = stop_tx.send(true);
    let _ = server.await;
    Ok(report)
}

/// Write `line` + newline to `path` (create/truncate); errors go to stderr only.
pub fn write_report(path: &std::path::Path, line: &str) {
    if let Err(e) = std::fs::write(path, format!("{line}\n")) {
        eprintln!(
            "target-server: cannot write termination log {}: {e}",
            path.display()
        );
    }
}

/// What one dial loop dials: the main path (`--target`, [`dial`]) or an extra one.
#[derive(Debug, Clone, Copy)]
enum Dialer {
    Main(SocketAddr),
    /// An extra path and its full-size packets' IP size (`mtu` paths).
    Path(PathSpec, Option<u32>),
}

/// The main dial loop and one per extra path, side by side until all have ended;
/// SIGTERM/SIGINT stops them all. Returns the main run and each path's (its spec,
/// packet size and run).
async fn dial_all(
    config: &ProbeConfig,
    origin: ProcessStart,
    termination: &mut Termination,
) -> (DialRun, Vec<(PathSpec, Option<u32>, DialRun)>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let dialers: Vec<(PathSpec, Option<u32>)> = config
        .paths
        .iter()
        .map(|spec| {
            let mtu = config
                .mtu
                .or_else(|| match crate::paths::route_mtu(spec.target) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        eprintln!(
                            "target-server: no route MTU towards {}: {e}; using 1500",
                            spec.target
                        );
                        Some(1500)
                    }
                });
            (*spec, crate::paths::packet_bytes(spec, mtu.unwrap_or(1500)))
        })
        .collect();
    // The extra paths on tasks of their own, the main one on this task.
    let handles: Vec<_> = dialers
        .iter()
        .map(|(spec, bytes)| {
            let (cfg, dialer, stop) =
                (config.clone(), Dialer::Path(*spec, *bytes), stop_rx.clone());
            tokio::spawn(async move { dial_loop(&cfg, origin, dialer, stop).await })
        })
        .collect();
    let all = async {
        let main = dial_loop(config, origin, Dialer::Main(config.target), stop_rx.clone()).await;
        let mut runs = Vec::with_capacity(handles.len());
        for h in handles {
            // A path task cannot panic short of a bug; such a path reports as stopped.
            runs.push(h.await.unwrap_or_else(|_| DialRun {
                tally: Tally::new(),
                dial_end: origin.elapsed_seconds(),
                terminated: true,
            }));
        }
        (main, runs)
    };
    tokio::pin!(all);
    let (main, runs) = tokio::select! {
        r = &mut all => r,
        _ = termination.recv() => {
            let _ = stop_tx.send(true);
            all.await
        }
    };
    let paths = dialers
        .into_iter()
        .zip(runs)
        .map(|((spec, bytes), run)| (spec, bytes, run))
        .collect();
    (main, paths)
}

/// One path's summary for the report ([`SourcePath`]), from its run's attempt log.
fn source_path(
    spec: &PathSpec,
    packet_bytes: Option<u32>,
    run: &DialRun,
    ready_at: Option<f64>,
) -> SourcePath {
    let r = run.tally.report(&ReportContext {
        pod: String::new(),
        target: spec.target.to_string(),
        expect_pod: String::new(),
        interval_seconds: 0.0,
        attempt_timeout_seconds: 0.0,
        give_up_seconds: 0.0,
        hold_seconds: 0.0,
        process_start_unix: 0.0,
        ready_at,
        dial_end: run.dial_end,
        terminated: run.terminated,
    });
    SourcePath {
        path: spec.id(),
        bytes: packet_bytes,
        first_success_sent: r.first_success_sent,
        retransmits: r.first_success_retransmits,
        attempts: r.attempts_before_success,
        failures: r.failures_before_success,
        last_error: r.last_error,
        hold_failures: r.hold.failures,
        outcome: r.outcome,
    }
}

/// The search / hold / drain loop (module docs) of one path, until it ends or `stop`
/// turns true (then `terminated`). Never fails.
async fn dial_loop(
    config: &ProbeConfig,
    origin: ProcessStart,
    dialer: Dialer,
    mut stop: watch::Receiver<bool>,
) -> DialRun {
    let mut tally = Tally::new();
    let mut tasks: JoinSet<(usize, crate::attempt::AttemptOutcome)> = JoinSet::new();
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let give_up_at = Instant::from_std(origin.start) + config.give_up;
    let mut hold_until: Option<Instant> = None;
    let mut sending = true;
    let mut dial_end: Option<f64> = None;
    let expect: Arc<str> = Arc::from(config.expect_pod.as_str());
    let name = match dialer {
        Dialer::Main(_) => String::new(),
        Dialer::Path(spec, _) => format!(" on path {}", spec.id()),
    };

    loop {
        if !sending && tasks.is_empty() {
            break;
        }
        // Deadline of the current phase: give-up while searching, hold end after.
        let phase_end = hold_until.unwrap_or(give_up_at);
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => {
                let now = origin.elapsed_seconds();
                tasks.abort_all();
                return DialRun { tally, dial_end: dial_end.unwrap_or(now), terminated: true };
            }
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                // A panicked attempt task (should not happen) stays "in flight".
                if let Ok((seq, outcome)) = joined {
                    if tally.finish(seq, outcome) {
                        eprintln!(
                            "target-server: first success{name} observed at {:.3}s, holding {}",
                            origin.elapsed_seconds(),
                            humantime::format_duration(config.hold)
                        );
                        hold_until = Some(Instant::now() + config.hold);
                        sending = true;
                        dial_end = None;
                    }
                }
            }
            _ = sleep_until(phase_end), if sending => {
                sending = false;
                dial_end = Some(origin.elapsed_seconds());
                if !tally.has_success() {
                    eprintln!(
                        "target-server: no success{name} after {}, giving up",
                        humantime::format_duration(config.give_up)
                    );
                }
            }
            _ = ticker.tick(), if sending => {
                let seq = tally.start(origin.elapsed_seconds());
                let expect = Arc::clone(&expect);
                let timeout = config.attempt_timeout;
                tasks.spawn(async move {
                    let outcome = match dialer {
                        Dialer::Main(target) => dial(origin, target, &expect, timeout).await,
                        Dialer::Path(spec, bytes) => {
                            crate::paths::attempt(origin, spec, bytes, seq as u64, &expect, timeout).await
                        }
                    };
                    (seq, outcome)
                });
            }
        }
    }
    DialRun {
        tally,
        dial_end: dial_end.unwrap_or_else(|| origin.elapsed_seconds()),
        terminated: false,
    }
}
