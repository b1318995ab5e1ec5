//! `prober gate`: the one-shot run (docs/design.md §4 "Gate"). Wires the pure parts together
//! with the Kubernetes API: client → node list → plan → namespace → start-up sweep →
//! shared pod watch → probes under a semaphore → cleanup → table, report, exit code.
//!
//! A run that fails before its probes (API unreachable, RBAC forbids the first list or
//! the pod watch ([`crate::engine::check_watch_allowed`]), < 2 nodes, pod watch never ready) still
//! writes its `--report` ([`startup_failure_report`]) and exits 2. A 401/403 later on —
//! creating or deleting a probe object, or the pod watch before it ever delivered an
//! event (`crate::podwatch::WatchForbidden`) — is run-fatal, and so is an admission
//! rejection of a probe object (`crate::admission`: every probe has the same spec; that
//! probe is `inconclusive`/`admission_rejected`): the run stops at once, the
//! pods created so far are deleted where RBAC allows it (a forbidden delete is reported
//! as "cleanup cannot work"), the 403 is first in `errors[]`, exit 2. When the API fails mid-run, probes whose
//! waits ran out end `inconclusive`/`api_error` (`crate::probe`), the final cleanup is
//! retried for [`crate::reclaim::FINAL_CLEANUP_DEADLINE`], and the report is written.
//!
//! Signals: the first SIGINT/SIGTERM stops starting probes, turns running ones into
//! `interrupted` (their pods are deleted), writes the report and exits 2; a second
//! signal deletes the instance's pods best-effort (5 s) and ends the run at once
//! ([`run_gate`] returns exit code 2).
//!
//! Start-up, the probes themselves and the cleanup helpers are the engine's
//! ([`crate::engine`], shared with `prober run`); this module is the gate's policy: the
//! finite plan, the early stop, `--timeout`, a forbidden create/delete stopping the run,
//! the report.

use crate::config::{check_kinds, GateArgs, GATE_DEFAULT_HOLD};
use crate::console::{Console, STDOUT_PATH};
use crate::error::Error;
use crate::gate::{build_report, early_stop, render_text, ReportInputs};
use crate::kind::ProbeKind;
use crate::podspec::{
    active_deadline_seconds, pod_name, source_args, target_args, PodConfig, PodRole, CPU_REQUEST,
    MEMORY_LIMIT, MEMORY_REQUEST, PROBE_GID, PROBE_UID,
};
use crate::probe::{run_probe, write_budget, EngineFault, ProbeEnv, ProbePlan};
use crate::reclaim::{delete_instance_pods, final_cleanup};
use crate::record::{build_record, Ending, ProbeMeta};
use crate::schedule::{node_claims, plan_kinds, NodeInfo, PlannedProbe};
use crate::sync::lock;
use firstpacket_report::{GateReport, ProbeRecord, Reason, Thresholds};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use rand::RngExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinSet;

/// A random `[a-z0-9]{n}` string.
pub fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// A gate instance id: `gate-` + 8 random `[a-z0-9]`.
pub fn new_gate_instance() -> String {
    format!("gate-{}", random_suffix(8))
}

/// Probe id for plan entry `index` of `instance`: `<instance suffix>-<index>`, so pod
/// names (`fp-<id>-t`) are unique per instance and readable.
pub fn probe_id(instance: &str, index: usize) -> String {
    let suffix = instance.rsplit('-').next().unwrap_or(instance);
    format!("{suffix}-{index}")
}

/// The `--dry-run` text: plan (kind, nodes, pod names, write budget) and the key
/// pod-spec fields.
pub fn render_plan(
    plan: &[PlannedProbe],
    skipped: &[(String, crate::schedule::SkipReason)],
    cfg: &PodConfig,
    seed: u64,
    eligible: usize,
    burst_size: u32,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan: {} probe(s) over {eligible} eligible node(s), seed {seed}, instance {}",
        plan.len(),
        cfg.instance
    );
    for p in plan {
        let pp = probe_plan(p, &cfg.instance, burst_size);
        let mut extra = String::new();
        if p.kind == ProbeKind::Burst {
            extra = format!(" + {burst_size} filler(s)");
        }
        if p.keep_target {
            extra.push_str(", target kept for the next recreate");
        }
        let _ = writeln!(
            out,
            "  {:>3}  {:<10} {} → {}  (pods {} / {}{extra}; ≤ {} API writes)",
            p.index,
            p.kind.as_str(),
            p.source,
            p.target,
            pod_name(&pp.id, PodRole::Source),
            pp.target_name(&cfg.instance),
            write_budget(p.kind, burst_size)
        );
    }
    for (n, r) in skipped {
        let _ = writeln!(out, "  skipped {n}: {r}");
    }
    let tol: Vec<String> = cfg.tolerations.iter().map(|t| t.to_string()).collect();
    let _ = writeln!(out, "pod spec (both pods):");
    let _ = writeln!(out, "  namespace {}  image {}", cfg.namespace, cfg.image);
    let _ = writeln!(
        out,
        "  affinity matchFields metadata.name In [<node>]; readiness GET /readyz :8080 every 1s; \
         restartPolicy Never; activeDeadlineSeconds {}",
        active_deadline_seconds(cfg.give_up, cfg.hold)
    );
    let _ = writeln!(
        out,
        "  securityContext {}; requests cpu {CPU_REQUEST} memory {MEMORY_REQUEST}, limit memory {MEMORY_LIMIT}",
        if cfg.unsafe_privileged {
            "PRIVILEGED (--unsafe-probe-pod-privileged: violates Pod Security baseline/restricted)".to_string()
        } else {
            format!(
                "restricted (runAsNonRoot, uid/gid {PROBE_UID}/{PROBE_GID}, seccomp RuntimeDefault, \
                 no privilege escalation, capabilities drop ALL, read-only root)"
            )
        }
    );
    let _ = writeln!(
        out,
        "  tolerations [{}]  imagePullSecrets [{}]  priorityClassName {}",
        tol.join(", "),
        cfg.image_pull_secrets.join(", "),
        cfg.priority_class.as_deref().unwrap_or("-")
    );
    let _ = writeln!(out, "  target args {:?}", target_args());
    let _ = writeln!(
        out,
        "  source args {:?}",
        source_args(cfg, "<target IP>", "fp-<id>-t")
    );
    out
}

fn spawn_signal_handler(
    env: Arc<ProbeEnv>,
    cancel: Arc<watch::Sender<bool>>,
    errors: Arc<Mutex<Vec<String>>>,
    console: Console,
    abort: Arc<Notify>,
) {
    let Some(mut signals) = crate::engine::Signals::install() else {
        tracing::warn!("cannot install signal handlers; SIGINT/SIGTERM will kill the gate");
        return;
    };
    tokio::spawn(async move {
        let name = signals.next().await;
        lock(&errors).push(format!("interrupted by {name}"));
        console.signal(name);
        cancel.send_replace(true);
        signals.next().await;
        console.second_signal();
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            delete_instance_pods(&env.pods, &env.pod_config.instance, &env.url),
        )
        .await;
        abort.notify_one();
    });
}

/// The probe to run for plan entry `p`.
pub fn probe_plan(p: &PlannedProbe, instance: &str, burst_size: u32) -> ProbePlan {
    ProbePlan {
        id: probe_id(instance, p.index),
        kind: p.kind,
        source_node: p.source.clone(),
        target_node: p.target.clone(),
        keep_target: p.keep_target,
        burst_size: if p.kind == ProbeKind::Burst {
            burst_size
        } else {
            0
        },
    }
}

/// Record of a planned probe that was never started because the gate stopped early
/// (`inconclusive` / `interrupted`, with `why` in the detail).
pub fn not_started_record(plan: &ProbePlan, cfg: &PodConfig, why: &str) -> ProbeRecord {
    let now = std::time::Instant::now();
    let meta = ProbeMeta {
        id: plan.id.clone(),
        kind: plan.kind.as_str().to_string(),
        namespace: cfg.namespace.clone(),
        source_node: plan.source_node.clone(),
        target_node: plan.target_node.clone(),
        source_pod: pod_name(&plan.id, PodRole::Source),
        target_pod: plan.target_name(&cfg.instance),
        started: now,
        started_at: Timestamp::now().to_string(),
    };
    let ending = Ending::Aborted {
        reason: Reason::Interrupted,
        detail: format!("not started: stopped early: {why}"),
    };
    build_record(&meta, None, None, &ending, Duration::ZERO, now)
}

/// Checks the settings the source pods and the report depend on before anything is
/// created: dial spacing and attempt timeout ≥ 1 ms (target-server's own floor),
/// a non-zero give-up, and a `--report`/`--save-baseline` directory that exists.
fn check_settings(args: &GateArgs) -> Result<(), Error> {
    let p = &args.probe;
    let ms = Duration::from_millis(1);
    let bad = |flag: &'static str, message: String| Err(Error::Config { flag, message });
    if p.dial_interval < ms {
        return bad(
            "--dial-interval",
            format!("{:?} is below 1ms", p.dial_interval),
        );
    }
    if p.attempt_timeout < ms {
        return bad(
            "--attempt-timeout",
            format!("{:?} is below 1ms", p.attempt_timeout),
        );
    }
    if p.give_up.is_zero() {
        return bad("--give-up", "must be more than 0s".into());
    }
    for (flag, file) in [
        ("--report", &args.report),
        ("--junit", &args.junit),
        ("--save-baseline", &args.save_baseline),
    ] {
        let Some(file) = file else { continue };
        let dir = file.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return bad(
                flag,
                format!("directory of {} does not exist", file.display()),
            );
        }
    }
    Ok(())
}

/// Reads a `--baseline` file ([`crate::baseline::SavedBaseline`]) for a run of `kinds`.
/// Errors: [`Error::Config`] naming `--baseline`, the file and what is wrong
/// (unreadable, not JSON of that shape, another version, no kind of `kinds`: a
/// comparison of nothing would pass).
pub fn load_saved_baseline(
    path: &std::path::Path,
    kinds: &[crate::kind::ProbeKind],
) -> Result<crate::baseline::SavedBaseline, Error> {
    let bad = |message: String| Error::Config {
        flag: "--baseline",
        message: format!("{}: {message}", path.display()),
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let b: crate::baseline::SavedBaseline =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a saved baseline: {e}")))?;
    if b.version != crate::baseline::SAVED_BASELINE_VERSION {
        return Err(bad(format!(
            "baseline version {} (this prober reads {})",
            b.version,
            crate::baseline::SAVED_BASELINE_VERSION
        )));
    }
    if !kinds.iter().any(|k| b.kinds.contains_key(k.as_str())) {
        return Err(bad(format!(
            "holds kinds [{}], none of --kinds [{}]: nothing to compare",
            b.kinds.keys().cloned().collect::<Vec<_>>().join(", "),
            kinds
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(b)
}

/// The settings a saved baseline records (and a comparison checks).
pub fn saved_settings(args: &GateArgs) -> crate::baseline::SavedSettings {
    crate::baseline::SavedSettings {
        dial_interval_seconds: args.probe.dial_interval.as_secs_f64(),
        slow_threshold_seconds: args.probe.slow_threshold.as_secs_f64(),
        max_ttfp_seconds: args.max_ttfp.as_secs_f64(),
        drift_ratio: args.drift.drift_ratio,
        drift_floor_seconds: args.drift.drift_floor.as_secs_f64(),
        baseline_min_samples: args.drift.baseline_min_samples,
    }
}

/// Writes `text` to `path` (`flag` names it in the error).
fn write_file(flag: &'static str, path: &std::path::Path, text: &str) -> Result<(), Error> {
    if path.as_os_str() == STDOUT_PATH {
        let name = match flag {
            "--junit" => "junit.xml",
            "--save-baseline" => "baseline.json",
            _ => "output",
        };
        return write_output(path, name, text);
    }
    std::fs::write(path, text).map_err(|e| Error::Output {
        path: format!("{} ({flag})", path.display()),
        source: e,
    })
}

/// Per-node claims of running probes (burst isolation, [`node_claims`]): a read-write
/// lock per node name, taken shared by every probe using the node and exclusively by a
/// `burst` on its target's node. tokio's `RwLock` is fair (first come, first served), so
/// a waiting burst is not starved by a stream of shared users.
#[derive(Default)]
struct NodeLocks(Mutex<std::collections::HashMap<String, Arc<tokio::sync::RwLock<()>>>>);

/// A held claim on one node (dropped = released).
#[allow(dead_code)] // held for its Drop only
enum NodeGuard {
    Shared(tokio::sync::OwnedRwLockReadGuard<()>),
    Exclusive(tokio::sync::OwnedRwLockWriteGuard<()>),
}

impl NodeLocks {
    /// Takes every claim of `claims` (sorted by node name, as [`node_claims`] gives
    /// them, so concurrent claimers cannot deadlock) and returns the guards.
    async fn claim(&self, claims: &[(String, bool)]) -> Vec<NodeGuard> {
        let mut out = Vec::with_capacity(claims.len());
        for (node, exclusive) in claims {
            let l = lock(&self.0).entry(node.clone()).or_default().clone();
            out.push(if *exclusive {
                NodeGuard::Exclusive(l.write_owned().await)
            } else {
                NodeGuard::Shared(l.read_owned().await)
            });
        }
        out
    }
}

/// Kinds whose pairs cross nodes and are cut short by the early stop. The early stop
/// also keeps `same_node` controls that have not started yet from starting (their
/// evidence is no longer needed once the verdict is certain); running ones finish.
fn stops_early(kind: ProbeKind) -> bool {
    kind != ProbeKind::SameNode
}

/// What the run learned before it failed, for the start-up failure report
/// ([`startup_failure_report`]).
#[derive(Debug, Clone)]
pub struct RunStart {
    /// Gate instance id.
    pub instance: String,
    /// RFC 3339 wall time of the start (display only).
    pub started_at: String,
    /// Prober-clock start.
    pub started: Instant,
    /// API server URL, once the client configuration was loaded.
    pub url: Option<String>,
    /// Eligible nodes, once listed.
    pub eligible: Vec<NodeInfo>,
    /// Nodes left out of the plan, once listed.
    pub skipped: Vec<(String, crate::schedule::SkipReason)>,
    /// The client's API health, once the client was built: a start-up failure's
    /// report lists its outages too (an API that never answered is one ongoing outage).
    pub health: Option<crate::apihealth::ApiHealth>,
}

impl RunStart {
    /// A fresh start: new instance id, now.
    pub fn new() -> Self {
        RunStart {
            instance: new_gate_instance(),
            started_at: Timestamp::now().to_string(),
            started: Instant::now(),
            url: None,
            health: None,
            eligible: Vec::new(),
            skipped: Vec::new(),
        }
    }
}

impl Default for RunStart {
    fn default() -> Self {
        Self::new()
    }
}

/// Thresholds in force (`--slow-threshold`, `--max-ttfp`, `--max-failures`,
/// `--max-inconclusive`), as the report states them.
pub fn thresholds(args: &GateArgs) -> Thresholds {
    Thresholds {
        slow_threshold_seconds: args.probe.slow_threshold.as_secs_f64(),
        max_ttfp_seconds: args.max_ttfp.as_secs_f64(),
        max_failures: args.max_failures,
        max_inconclusive: args.max_inconclusive,
    }
}

/// The report of a run that failed before (or while) starting its probes: verdict
/// `inconclusive`, exit code 2, no probes, and `errors[]` = the error text (which names
/// the API URL, verb and resource for API errors; the URL is appended when the error
/// text does not carry it). CI pipelines get their artifact even when the API is
/// unreachable or RBAC forbids the first list.
pub fn startup_failure_report(start: &RunStart, args: &GateArgs, err: &Error) -> GateReport {
    let mut msg = err.to_string();
    if let Some(url) = &start.url {
        if !msg.contains(url.as_str()) {
            msg = format!("{msg} (Kubernetes API {url})");
        }
    }
    build_report(
        Vec::new(),
        &start.eligible,
        Vec::new(),
        ReportInputs {
            thresholds: thresholds(args),
            instance: start.instance.clone(),
            started_at: start.started_at.clone(),
            finished_at: Timestamp::now().to_string(),
            duration_seconds: start.started.elapsed().as_secs_f64(),
            errors: vec![msg],
            group_by: args.probe.group_by_label.clone(),
            stopped_early: None,
            skipped_nodes: start
                .skipped
                .iter()
                .map(|(n, r)| firstpacket_report::SkippedNode {
                    node: n.clone(),
                    reason: r.to_string(),
                })
                .collect(),
        },
    )
}

/// Whether a failed run still gets its `--report`: every error except those about the
/// report file itself (its directory is missing, or writing it failed).
fn report_on_error(err: &Error) -> bool {
    !matches!(
        err,
        Error::Output { .. }
            | Error::Config {
                flag: "--report",
                ..
            }
    )
}

/// What the [`AgentWatcher`](crate::agents::scrape::AgentWatcher) knows at the end of the
/// run, as [`crate::gate::AgentScrapeFacts`]: discovered agents, scrape counts, per-node
/// outcomes in the kept history, proxy fallbacks. `profiles` = the enabled profiles.
pub fn agent_facts(
    a: &crate::agents::scrape::AgentWatcher,
    mode: crate::config::AgentScrape,
    profiles: &[String],
) -> crate::gate::AgentScrapeFacts {
    let agents: Vec<(String, String)> = a
        .index()
        .read()
        .map(|i| i.all().into_iter().map(|t| (t.profile, t.node)).collect())
        .unwrap_or_default();
    let history = a.history();
    let mut names: Vec<String> = profiles.to_vec();
    names.extend(agents.iter().map(|(p, _)| p.clone()));
    names.sort();
    names.dedup();
    let mut node_outcomes = std::collections::BTreeMap::new();
    for p in &names {
        for n in history.nodes_with(p) {
            let (ok, failed) = history.ring(&n, p).map_or((0, 0), |r| {
                let ok = r.iter().filter(|o| o.outcome.is_ok()).count() as u64;
                (ok, r.len() as u64 - ok)
            });
            node_outcomes.insert((p.clone(), n), (ok, failed));
        }
    }
    let via_proxy = agents
        .iter()
        .filter(|(p, n)| a.uses_proxy(n, p))
        .cloned()
        .collect();
    crate::gate::AgentScrapeFacts {
        scrape_mode: mode.as_str().to_owned(),
        profiles: profiles.to_vec(),
        agents,
        counts: a.scrape_counts(),
        node_outcomes,
        via_proxy,
    }
}

/// Writes `report` as pretty JSON plus a newline to `path`; `-` prints it to stdout
/// between marker lines ([`write_output`]).
pub fn write_report(path: &std::path::Path, report: &GateReport) -> Result<(), Error> {
    let json = serde_json::to_string_pretty(report).map_err(|e| Error::Output {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    write_output(path, "report.json", &(json + "\n"))
}

/// `text` (ending in a newline) between the marker lines of [`write_output`].
fn framed(name: &str, text: &str) -> String {
    format!("===== BEGIN firstpacket {name} =====\n{text}===== END firstpacket {name} =====\n")
}

/// Writes `text` (ending in a newline) to the file `path`, or, when `path` is `-`, to
/// stdout between the lines `===== BEGIN firstpacket NAME =====` and `===== END
/// firstpacket NAME =====`, in one locked write, so a gate run as a Kubernetes Job
/// (whose files vanish with its pod) leaves the output in the pod's log, where
/// `scripts/gate-job.sh` cuts it out. Errors: [`Error::Output`] naming the path.
pub fn write_output(path: &std::path::Path, name: &str, text: &str) -> Result<(), Error> {
    let err = |e: std::io::Error| Error::Output {
        path: path.display().to_string(),
        source: e,
    };
    if path.as_os_str() == STDOUT_PATH {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        out.write_all(framed(name, text).as_bytes()).map_err(err)?;
        out.flush().map_err(err)
    } else {
        std::fs::write(path, text).map_err(err)
    }
}

/// Writes `--report`, `--junit` and `--save-baseline`. Every output is attempted;
/// returns the report's exit code, or the first output's error.
fn write_outputs(
    args: &GateArgs,
    report: &GateReport,
    kind_names: &[&str],
    console: Console,
) -> Result<i32, Error> {
    // Every output is attempted, also after one failed (an unwritable --junit must not
    // cost the --save-baseline of a passed run); the first failure is the run's error,
    // the others are logged.
    let mut failed: Option<Error> = None;
    let mut keep = |r: Result<(), Error>| {
        if let Err(e) = r {
            if failed.is_some() {
                tracing::error!(error = %e, "another output not written");
            } else {
                failed = Some(e);
            }
        }
    };
    if let Some(path) = &args.report {
        keep(write_report(path, report).map(|()| console.report_written(path)));
    }
    if let Some(path) = &args.junit {
        keep(
            write_file("--junit", path, &crate::junit::render(report))
                .map(|()| console.file_written("JUnit XML", path)),
        );
    }
    if let Some(path) = &args.save_baseline {
        if report.verdict != firstpacket_report::Verdict::Pass {
            console.setting_warning(
                "--save-baseline",
                "this run did not pass: the saved baseline holds what it measured anyway",
            );
        }
        let saved = crate::baseline::save(
            &report.probes,
            kind_names,
            saved_settings(args),
            &report.instance,
            &report.started_at,
        );
        keep(
            serde_json::to_string_pretty(&saved)
                .map_err(|e| Error::Output {
                    path: path.display().to_string(),
                    source: std::io::Error::other(e),
                })
                .and_then(|json| write_file("--save-baseline", path, &(json + "\n")))
                .map(|()| console.file_written("baseline", path)),
        );
    }
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(report.exit_code)
}

/// Compares the run with the `--baseline` (`saved`), like for like, into the report.
fn compare_with_baseline(
    args: &GateArgs,
    report: &mut GateReport,
    saved: &crate::baseline::SavedBaseline,
    kind_names: &[&str],
) {
    let cmp = crate::baseline::compare(
        saved,
        &report.probes,
        kind_names,
        &saved_settings(args),
        &crate::baseline::CompareConfig {
            quantile: args.baseline_quantile.clone(),
            ratio: args.drift.drift_ratio,
            floor: args.drift.drift_floor.as_secs_f64(),
            min_samples: args.drift.baseline_min_samples,
            dial_interval: args.probe.dial_interval.as_secs_f64(),
        },
    );
    crate::gate::apply_baseline(report, cmp);
}

/// After the last probe: the instance's leftover pods deleted (retried until
/// `FINAL_CLEANUP_DEADLINE`), other instances' unrenewed Leases waited out (their pods
/// reaped), this instance's Lease released.
async fn wind_down(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    instance: &str,
    url: &str,
    env: &ProbeEnv,
    reaper: tokio::task::JoinHandle<()>,
    lease: Option<crate::lease::InstanceLease>,
    run_errors: &Mutex<Vec<String>>,
) {
    // Leftovers (a probe cut short mid-create, or a delete that failed while the API
    // was away): retried until FINAL_CLEANUP_DEADLINE, then given up on.
    match final_cleanup(pods, instance, url).await {
        Ok(n) if n > 0 => {
            env.writes.fetch_add(n as u64, Ordering::Relaxed);
            tracing::info!(deleted = n, "deleted leftover probe pods");
        }
        Ok(_) => {}
        Err(e) => lock(run_errors).push(e.to_string()),
    }
    // Dead instances' Leases still being watched: their pods are deleted once the Lease
    // has gone unrenewed for its duration (at most that long plus a pass).
    if !reaper.is_finished() {
        let wait = crate::lease::LEASE_DURATION + crate::lease::RENEW_INTERVAL * 2;
        tracing::info!(
            "waiting (at most {}s) to tell whether other instances' unrenewed Leases are dead",
            wait.as_secs()
        );
        let mut reaper = reaper;
        if tokio::time::timeout(wait, &mut reaper).await.is_err() {
            reaper.abort();
        }
    }
    if let Some(l) = lease {
        l.release().await;
    }
}

/// The gate's run-fatal stop: the first fatal message wins and cancels the run.
struct Fatal {
    first: Mutex<Option<String>>,
    cancel: Arc<watch::Sender<bool>>,
}

impl Fatal {
    fn new(cancel: Arc<watch::Sender<bool>>) -> Fatal {
        Fatal {
            first: Mutex::new(None),
            cancel,
        }
    }

    /// Records `msg` if it is the first, and cancels the run.
    fn set(&self, msg: String) {
        let mut f = lock(&self.first);
        if f.is_none() {
            *f = Some(msg);
        }
        self.cancel.send_replace(true);
    }

    /// The gate's policy on engine faults: a forbidden create or delete is run-fatal; so
    /// is an admission rejection (every probe pod has the same spec: all would be
    /// rejected).
    fn fault_sink(self: Arc<Self>, instance: String) -> crate::probe::FaultSink {
        Arc::new(move |f: EngineFault| {
            let text = f.text(&instance);
            self.set(match f {
                EngineFault::AdmissionRejected(_) => format!(
                    "probe pods are rejected by admission (the next probes would meet the same \
                     policy); the gate stops: {text}"
                ),
                _ => text,
            })
        })
    }
}

/// The gate's other stops: the pod watch forbidden before it ever worked (e.g. RBAC
/// changed right after the start-up check) is run-fatal like a forbidden create;
/// `--timeout` cancels the run and is recorded in `errors`.
fn spawn_stop_guards(
    watch: &Arc<crate::podwatch::PodWatch>,
    url: &str,
    fatal: &Arc<Fatal>,
    timeout: Duration,
    errors: &Arc<Mutex<Vec<String>>>,
    cancel: &Arc<watch::Sender<bool>>,
) {
    {
        let (url, watch, fatal) = (url.to_owned(), watch.clone(), fatal.clone());
        tokio::spawn(async move {
            let f = watch.wait_forbidden().await;
            fatal.set(f.to_error(&url, watch.namespace()).to_string());
        });
    }
    let (cancel, errors) = (cancel.clone(), errors.clone());
    tokio::spawn(async move {
        tokio::time::sleep(timeout).await;
        lock(&errors).push(format!(
            "--timeout {} reached",
            humantime::format_duration(timeout)
        ));
        cancel.send_replace(true);
    });
}

/// What the gate's probe tasks share: the probe environment, the concurrency permits,
/// the start order (`turn`: the task at plan position `pos` asks for a permit only once
/// `turn` reached `pos`), the burst node claims, the run-wide and the early-stop
/// cancels, and the finished records the early stop is decided on.
struct GateProbes {
    env: Arc<ProbeEnv>,
    sem: Semaphore,
    turn: watch::Sender<usize>,
    node_locks: NodeLocks,
    run_cancel: watch::Receiver<bool>,
    cross_cancel: watch::Receiver<bool>,
    cross_cancel_tx: Arc<watch::Sender<bool>>,
    finished: Arc<Mutex<Vec<ProbeRecord>>>,
    stopped_early: Arc<Mutex<Option<String>>>,
    max_failures: u64,
    console: Console,
}

/// One planned probe of the gate, at plan position `pos` (plan `index`): waits for its
/// turn and a permit (probes start in plan order — same-node controls woven among the
/// cross-node pairs, pairs with no node in common first within a lap:
/// [`crate::schedule`] — and pass the turn on as soon as they hold a permit or gave
/// up waiting, so the runtime's polling order does not decide), then for its nodes'
/// burst claims, runs it, and decides on the early stop before the permit goes on.
/// `None`: not started after a run-wide stop; an early stop gives a not-started record.
async fn gate_probe(
    g: Arc<GateProbes>,
    pos: usize,
    index: usize,
    claims: Vec<(String, bool)>,
    probe: ProbePlan,
) -> (usize, Option<ProbeRecord>) {
    let cross = stops_early(probe.kind);
    let cancel = if cross {
        g.cross_cancel.clone()
    } else {
        g.run_cancel.clone()
    };
    // Whether to start at all: the early stop (or a run-wide stop) cancels every
    // probe not started yet, controls included (`stops_early`).
    let mut start_cancel = g.cross_cancel.clone();
    let run_cancel = g.run_cancel.clone();
    let mut my_turn = g.turn.subscribe();
    let (sem, turn, node_locks, env, finished, stopped, cross_tx, max_failures, console) = (
        &g.sem,
        &g.turn,
        &g.node_locks,
        g.env.clone(),
        &g.finished,
        &g.stopped_early,
        &g.cross_cancel_tx,
        g.max_failures,
        g.console,
    );
    let permit = tokio::select! {
        p = async {
            let _ = my_turn.wait_for(|t| *t >= pos).await;
            sem.acquire().await.ok()
        } => p,
        _ = start_cancel.wait_for(|c| *c) => None,
    };
    if permit.is_none() {
        // Cancelled before starting: still pass the turn on when it comes.
        let _ = my_turn.wait_for(|t| *t >= pos).await;
    }
    turn.send_modify(|t| *t = (*t).max(pos + 1));
    // Burst isolation: wait (holding the permit) until the probe's nodes are
    // free for it (`crate::schedule::node_claims`).
    let guards = match permit {
        Some(_) => tokio::select! {
            g = node_locks.claim(&claims) => Some(g),
            _ = start_cancel.wait_for(|c| *c) => None,
        },
        None => None,
    };
    let early = lock(stopped).clone();
    // A run-wide stop is checked too: its forwarding to the early-stop channel may not
    // have happened yet (a forbidden create must not start one more probe).
    if permit.is_none() || guards.is_none() || *start_cancel.borrow() || *run_cancel.borrow() {
        // Not started: an early stop gives a record; a run-wide stop does not.
        return match early {
            Some(why) if !*run_cancel.borrow() => (
                index,
                Some(not_started_record(&probe, &env.pod_config, &why)),
            ),
            _ => (index, None),
        };
    }
    let mut rec = run_probe(env, probe, cancel).await;
    if rec.reason == Some(Reason::Interrupted) && !*run_cancel.borrow() {
        if let Some(why) = lock(stopped).clone() {
            rec.detail = Some(format!(
                "cut short: stopped early: {why} ({})",
                rec.detail.as_deref().unwrap_or("")
            ));
        }
    }
    // Decide on the early stop before the permit goes to the next probe.
    {
        let mut done = lock(finished);
        done.push(rec.clone());
        let mut st = lock(stopped);
        if st.is_none() {
            if let Some(why) = early_stop(&done, max_failures) {
                console.early_stop(&why);
                *st = Some(why);
                cross_tx.send_replace(true);
            }
        }
    }
    drop(guards);
    drop(permit);
    (index, Some(rec))
}

/// The gate's plan over the eligible `names` (`--pairs`, default one per node).
/// Errors: [`Error::NotEnoughNodes`], naming the selector or the skipped nodes.
fn plan_gate(
    args: &GateArgs,
    names: &[String],
    kinds: &[ProbeKind],
    skipped: &[(String, crate::schedule::SkipReason)],
    seed: u64,
) -> Result<Vec<PlannedProbe>, Error> {
    let pairs = args.pairs.map_or(names.len(), |n| n as usize);
    plan_kinds(names, kinds, pairs, seed).ok_or_else(|| Error::NotEnoughNodes {
        eligible: names.len(),
        detail: if skipped.is_empty() {
            format!(" (selector {})", args.probe.node_selector)
        } else {
            let s: Vec<String> = skipped.iter().map(|(n, r)| format!("{n}: {r}")).collect();
            format!(" (skipped {})", s.join("; "))
        },
    })
}

/// Forwards the run-wide cancel to the early stop's channel (cross-node probes see one
/// channel).
async fn forward_cancel(mut run_cancel: watch::Receiver<bool>, tx: Arc<watch::Sender<bool>>) {
    if run_cancel.wait_for(|c| *c).await.is_ok() {
        tx.send_replace(true);
    }
}

/// Every probe task's record, in plan order, with progress lines; how many were not
/// started. A task that panicked is a run error.
async fn collect_records(
    mut set: JoinSet<(usize, Option<ProbeRecord>)>,
    total: usize,
    console: Console,
    run_errors: &Mutex<Vec<String>>,
) -> (Vec<ProbeRecord>, usize) {
    let mut records: Vec<(usize, ProbeRecord)> = Vec::with_capacity(total);
    let mut not_started = 0usize;
    while let Some(res) = set.join_next().await {
        match res {
            Ok((i, Some(rec))) => {
                console.progress(records.len() + 1, total, &rec);
                records.push((i, rec));
            }
            Ok((_, None)) => not_started += 1,
            Err(e) => lock(run_errors).push(format!("probe task failed: {e}")),
        }
    }
    records.sort_by_key(|(i, _)| *i);
    (records.into_iter().map(|(_, r)| r).collect(), not_started)
}

/// Logs the run's API writes and agent scrapes (info).
fn log_totals(env: &ProbeEnv, probes: usize) {
    tracing::info!(
        api_writes = env.writes.load(Ordering::Relaxed),
        probes,
        "API writes (creates + deletes)"
    );
    if let Some(a) = &env.agents {
        for ((profile, result), n) in a.scrape_counts() {
            tracing::info!(profile = %profile, result = %result, scrapes = n, "agent scrapes");
        }
    }
}

/// Checks the flags before any API call: `--kinds`, the settings (refusals, then
/// warnings), the agent profiles (`--agent-config`) and the `--baseline` file.
#[allow(clippy::type_complexity)]
fn check_gate_args(
    args: &GateArgs,
    console: Console,
) -> Result<
    (
        Vec<ProbeKind>,
        Vec<crate::agents::profiles::Profile>,
        Option<crate::baseline::SavedBaseline>,
    ),
    Error,
> {
    let kinds = check_kinds(&args.probe.kinds)?;
    check_settings(args)?;
    for (flag, message) in crate::settings::questionable_gate_settings(args) {
        console.setting_warning(flag, &message);
    }
    // Agent profiles first: a bad --agent-config fails before any API call.
    let profiles = crate::engine::load_profiles(&args.probe)?;
    let saved_baseline = match &args.baseline {
        Some(path) => Some(load_saved_baseline(path, &kinds)?),
        None => None,
    };
    Ok((kinds, profiles, saved_baseline))
}

/// The gate's report of `probes` ([`build_report`]) with the run's facts: thresholds,
/// times (`started`: RFC 3339 start and its instant), errors, early stop, skipped nodes
/// and the agents scraped.
#[allow(clippy::too_many_arguments)]
fn gate_report(
    args: &GateArgs,
    probes: Vec<ProbeRecord>,
    eligible: &[NodeInfo],
    skipped: &[(String, crate::schedule::SkipReason)],
    env: &ProbeEnv,
    started: (String, Instant),
    errors: Vec<String>,
    stopped_early: Option<String>,
    profile_names: &[String],
) -> GateReport {
    let (started_at, run_start) = started;
    let agent_warnings = std::mem::take(&mut *lock(&env.agent_warnings));
    let mut report = build_report(
        probes,
        eligible,
        agent_warnings,
        ReportInputs {
            thresholds: thresholds(args),
            instance: env.pod_config.instance.clone(),
            started_at,
            finished_at: Timestamp::now().to_string(),
            duration_seconds: run_start.elapsed().as_secs_f64(),
            errors,
            group_by: args.probe.group_by_label.clone(),
            stopped_early,
            skipped_nodes: skipped
                .iter()
                .map(|(n, r)| firstpacket_report::SkippedNode {
                    node: n.clone(),
                    reason: r.to_string(),
                })
                .collect(),
        },
    );
    report.agents = env.agents.as_deref().map(|a| {
        crate::gate::agents_report(&agent_facts(a, args.probe.agent_scrape, profile_names))
    });
    report
}

/// Connects (outages recorded in `health`) and lists the nodes, noting both in `start`
/// for a start-up failure's report. Returns the connection, its recovery pings, the
/// eligible nodes and the skipped ones (logged).
async fn connect_and_list(
    p: &crate::config::ProbeArgs,
    health: &crate::apihealth::ApiHealth,
    start: &mut RunStart,
) -> Result<
    (
        crate::engine::Connection,
        crate::apihealth::RecoveryPings,
        Vec<NodeInfo>,
        Vec<(String, crate::schedule::SkipReason)>,
    ),
    Error,
> {
    start.health = Some(health.clone());
    let (conn, pings) = crate::engine::connect_watched(p, health).await?;
    start.url = Some(conn.url.clone());
    let (eligible, skipped) = crate::engine::list_nodes(&conn, p).await?;
    start.eligible = eligible.clone();
    start.skipped = skipped.clone();
    for (n, r) in &skipped {
        tracing::info!(node = %n, reason = %r, "node skipped");
    }
    Ok((conn, pings, eligible, skipped))
}

/// Runs `prober gate`. Returns the process exit code (0 pass, 1 fail, 2 inconclusive);
/// errors that stop the run before its probes (config, API unreachable/forbidden,
/// < 2 nodes, pod watch never ready) are returned as [`Error`] (exit 2 in `main`), after
/// writing the `--report` of [`startup_failure_report`] (not with `--dry-run`, and not
/// when the error is about the report file itself).
pub async fn run_gate(args: GateArgs) -> Result<i32, Error> {
    let console = Console::new(args.probe.log_format);
    let mut start = RunStart::new();
    let abort = Arc::new(Notify::new());
    let result = tokio::select! {
        r = run_gate_inner(&args, console, &mut start, abort.clone()) => r,
        // A second signal: the pods were deleted best-effort; stop at once.
        _ = abort.notified() => return Ok(2),
    };
    match result {
        Ok(code) => Ok(code),
        Err(e) => {
            if let (Some(path), false) = (&args.report, args.dry_run) {
                if report_on_error(&e) {
                    let mut report = startup_failure_report(&start, &args, &e);
                    if let Some(h) = &start.health {
                        report.api_outages = api_outages(h);
                    }
                    match write_report(path, &report) {
                        Ok(()) => console.report_written(path),
                        Err(w) => console.error(Some(w.reason()), &w.to_string()),
                    }
                    if let Some(junit) = &args.junit {
                        match write_file("--junit", junit, &crate::junit::render(&report)) {
                            Ok(()) => console.file_written("JUnit XML", junit),
                            Err(w) => console.error(Some(w.reason()), &w.to_string()),
                        }
                    }
                }
            }
            Err(e)
        }
    }
}

async fn run_gate_inner(
    args: &GateArgs,
    console: Console,
    start: &mut RunStart,
    abort: Arc<Notify>,
) -> Result<i32, Error> {
    let p = &args.probe;
    let (kinds, profiles, saved_baseline) = check_gate_args(args, console)?;
    let hold = p.hold_or(GATE_DEFAULT_HOLD);
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let instance = start.instance.clone();
    let run_start = start.started;
    let started_at = start.started_at.clone();
    console.seed(&instance, seed);

    let health = crate::apihealth::ApiHealth::new(Some(console.outage_sink()));
    let (conn, pings, eligible, skipped) = connect_and_list(p, &health, start).await?;
    let url = conn.url.clone();
    let names: Vec<String> = eligible.iter().map(|n| n.name.clone()).collect();
    let plan = plan_gate(args, &names, &kinds, &skipped, seed)?;

    let pod_config = PodConfig::from_args(p, &instance, hold, None);
    if args.dry_run {
        let text = render_plan(
            &plan,
            &skipped,
            &pod_config,
            seed,
            names.len(),
            p.burst_size,
        );
        print!("{text}");
        return Ok(0);
    }

    let started =
        crate::engine::start(&conn, p, &instance, hold, profiles.clone(), console, false).await?;
    // Node-agent correlation (docs/design.md §3): a first scrape of the planned nodes, so the
    // first probes have a cluster baseline.
    let profile_names: Vec<String> = profiles.iter().map(|p| p.name.clone()).collect();
    started.agents.prime(&names).await;

    let (cancel_tx, cancel_rx) = watch::channel(false);
    let cancel_tx = Arc::new(cancel_tx);
    // The gate's policy on engine faults: a forbidden create or delete is run-fatal (the
    // first one wins), the run stops at once.
    let fatal = Arc::new(Fatal::new(cancel_tx.clone()));
    let crate::engine::Started {
        pods,
        watch,
        agents,
        lease,
        reaper,
        ..
    } = started;
    let env = Arc::new(ProbeEnv::new(
        pods.clone(),
        watch.clone(),
        &url,
        pod_config,
        p.slow_threshold,
        fatal.clone().fault_sink(instance.clone()),
        Arc::new(agents),
    ));
    let run_errors = Arc::new(Mutex::new(Vec::<String>::new()));
    spawn_signal_handler(
        env.clone(),
        cancel_tx.clone(),
        run_errors.clone(),
        console,
        abort,
    );
    spawn_stop_guards(&watch, &url, &fatal, args.timeout, &run_errors, &cancel_tx);

    let total = plan.len();
    let (probes, not_started, stopped_early) =
        run_gate_probes(args, plan, &env, cancel_rx, console, &run_errors).await;
    wind_down(&pods, &instance, &url, &env, reaper, lease, &run_errors).await;
    if not_started > 0 {
        lock(&run_errors).push(format!(
            "{not_started} of {total} planned probe(s) not started"
        ));
    }
    // The run-fatal stop is the run's first error.
    if let Some(f) = lock(&fatal.first).clone() {
        console.error(None, &f);
        lock(&run_errors).insert(0, f);
    }
    let n_probes = probes.len();
    let mut report = gate_report(
        args,
        probes,
        &eligible,
        &skipped,
        &env,
        (started_at, run_start),
        lock(&run_errors).clone(),
        stopped_early,
        &profile_names,
    );
    drop(pings);
    health.finish();
    report.api_outages = api_outages(&health);
    let kind_names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    if let Some(saved) = &saved_baseline {
        compare_with_baseline(args, &mut report, saved, &kind_names);
    }
    print!("{}", render_text(&report, &p.group_by_label));
    print!("{}", crate::gate::render_baseline_text(&report));
    console.verdict(&report);
    log_totals(&env, n_probes);
    write_outputs(args, &report, &kind_names, console)
}

/// Runs the plan's probes ([`gate_probe`]: plan order, `--concurrency`, burst claims,
/// the early stop of cross-node kinds, to which the run-wide `cancel` is forwarded so
/// those probes see one channel). Returns their records in plan order, how many did
/// not start, and the early stop's reason.
async fn run_gate_probes(
    args: &GateArgs,
    plan: Vec<PlannedProbe>,
    env: &Arc<ProbeEnv>,
    cancel: watch::Receiver<bool>,
    console: Console,
    run_errors: &Mutex<Vec<String>>,
) -> (Vec<ProbeRecord>, usize, Option<String>) {
    let (cross_cancel_tx, cross_cancel_rx) = watch::channel(false);
    let cross_cancel_tx = Arc::new(cross_cancel_tx);
    tokio::spawn(forward_cancel(cancel.clone(), cross_cancel_tx.clone()));
    let stopped_early: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let total = plan.len();
    let shared = Arc::new(GateProbes {
        env: env.clone(),
        sem: Semaphore::new(args.probe.concurrency as usize),
        turn: watch::channel(0usize).0,
        node_locks: NodeLocks::default(),
        run_cancel: cancel,
        cross_cancel: cross_cancel_rx,
        cross_cancel_tx,
        finished: Arc::new(Mutex::new(Vec::new())),
        stopped_early: stopped_early.clone(),
        max_failures: args.max_failures,
        console,
    });
    let mut set: JoinSet<(usize, Option<ProbeRecord>)> = JoinSet::new();
    for (pos, planned) in plan.into_iter().enumerate() {
        let probe = probe_plan(&planned, &env.pod_config.instance, args.probe.burst_size);
        set.spawn(gate_probe(
            shared.clone(),
            pos,
            planned.index,
            node_claims(&planned),
            probe,
        ));
    }
    let (probes, not_started) = collect_records(set, total, console, run_errors).await;
    let stopped = lock(&stopped_early).clone();
    (probes, not_started, stopped)
}

/// The report's `api_outages[]` from the run's [`crate::apihealth::ApiHealth`].
pub fn api_outages(h: &crate::apihealth::ApiHealth) -> Vec<firstpacket_report::ApiOutage> {
    let ongoing = h.ongoing();
    let all = h.outages();
    let n = all.len();
    all.into_iter()
        .enumerate()
        .map(|(i, o)| firstpacket_report::ApiOutage {
            start: o.start,
            seconds: o.seconds.unwrap_or_default(),
            ongoing: ongoing && i + 1 == n,
            first_error: o.first_error,
            failed_requests: o.failed_requests,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baseline_file_that_is_unreadable_or_shares_no_kind_is_a_config_error() {
        use crate::kind::ProbeKind;
        let dir = std::env::temp_dir().join(format!("fp-saved-baseline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let f = dir.join(name);
            std::fs::write(&f, text).unwrap();
            f
        };
        let saved = |kinds: &[&str]| {
            serde_json::to_string(&crate::baseline::save(
                &[],
                kinds,
                Default::default(),
                "gate-x",
                "2026-12-03T00:00:00Z",
            ))
            .unwrap()
        };
        let cross = [ProbeKind::CrossNode];
        let err = |f: &std::path::Path| load_saved_baseline(f, &cross).unwrap_err().to_string();
        assert!(err(&dir.join("missing.json")).contains("--baseline"));
        assert!(err(&write("garbage.json", "{nope")).contains("not a saved baseline"));
        let v2 = saved(&["cross_node"]).replace("\"version\":1", "\"version\":2");
        assert!(err(&write("v2.json", &v2)).contains("baseline version 2"));
        let other = err(&write("other.json", &saved(&["recreate"])));
        assert!(
            other.contains("holds kinds [recreate], none of --kinds [cross_node]"),
            "{other}"
        );
        let ok = write("ok.json", &saved(&["cross_node", "recreate"]));
        assert!(load_saved_baseline(&ok, &cross).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn output_to_stdout_is_framed_by_marker_lines_and_a_file_gets_the_text_alone() {
        let f = framed("report.json", "{\n  \"a\": 1\n}\n");
        let lines: Vec<&str> = f.lines().collect();
        assert_eq!(
            lines.first(),
            Some(&"===== BEGIN firstpacket report.json =====")
        );
        assert_eq!(
            lines.last(),
            Some(&"===== END firstpacket report.json =====")
        );
        assert_eq!(lines[1..lines.len() - 1].join("\n"), "{\n  \"a\": 1\n}");
        let dir = std::env::temp_dir().join(format!("fp-write-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("r.json");
        write_output(&file, "report.json", "x\n").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x\n");
        let bad = dir.join("missing-dir/r.json");
        let e = write_output(&bad, "report.json", "x\n").unwrap_err();
        assert!(e.to_string().contains("missing-dir"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn instance_and_probe_ids_have_the_documented_shape() {
        let i = new_gate_instance();
        assert_eq!(i.len(), 13);
        assert!(i.starts_with("gate-"));
        assert!(i[5..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert_ne!(new_gate_instance(), i);
        assert_eq!(probe_id("gate-ab12cd34", 7), "ab12cd34-7");
    }

    #[test]
    fn dry_run_plan_names_pairs_pods_and_key_spec_fields() {
        let cfg = PodConfig {
            namespace: "fp".into(),
            image: "img/target-server:1".into(),
            instance: "gate-abcdefgh".into(),
            tolerations: vec!["k:NoSchedule".parse().expect("tol")],
            image_pull_secrets: vec![],
            priority_class: None,
            dial_interval: Duration::from_millis(100),
            attempt_timeout: Duration::from_millis(900),
            give_up: Duration::from_secs(60),
            hold: Duration::from_secs(5),
            owner: None,
            unsafe_privileged: false,
            isolation_window: crate::netpol::DEFAULT_ISOLATION_WINDOW,
            paths: Default::default(),
        };
        let kinds = [ProbeKind::CrossNode, ProbeKind::Recreate, ProbeKind::Burst];
        let plan = plan_kinds(&["n1".into(), "n2".into()], &kinds, 2, 1).expect("plan");
        let text = render_plan(&plan, &[], &cfg, 1, 2, 3);
        assert!(text.contains("seed 1"));
        assert!(text.contains("fp-abcdefgh-0-t"));
        assert!(text.contains("activeDeadlineSeconds 185"));
        assert!(
            text.contains("matchFields metadata.name In [<node>]"),
            "{text}"
        );
        assert!(
            text.contains("restricted (runAsNonRoot, uid/gid 65532/65532"),
            "{text}"
        );
        assert!(text.contains("k:NoSchedule"));
        assert!(text.contains(&format!("{} → {}", plan[0].source, plan[0].target)));
        assert!(text.contains("fp-abcdefgh-rc-n1"), "{text}");
        assert!(text.contains("+ 3 filler(s)"), "{text}");
        assert!(text.contains("≤ 10 API writes"), "{text}");
    }
}
