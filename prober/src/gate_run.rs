//! `prober gate`: the one-shot run (DESIGN §4 "Gate"). Wires the pure parts together
//! with the Kubernetes API: client → node list → plan → namespace → start-up sweep →
//! shared pod watch → probes under a semaphore → cleanup → table, report, exit code.
//!
//! Signals: the first SIGINT/SIGTERM stops starting probes, turns running ones into
//! `interrupted` (their pods are deleted), writes the report and exits 2; a second
//! signal deletes the instance's pods best-effort (5 s) and exits 2 at once.

use crate::config::{check_kinds, GateArgs, ProbeKind, GATE_DEFAULT_HOLD};
use crate::error::{error_chain, kube_status_code, Error};
use crate::gate::{build_report, early_stop, progress_line, render_text, ReportInputs};
use crate::podspec::{
    active_deadline_seconds, instance_selector, pod_name, source_args, target_args, PodConfig,
    PodRole, FIELD_MANAGER,
};
use crate::podwatch::PodWatch;
use crate::probe::{run_probe, write_budget, ProbeEnv, ProbePlan, API_CALL_TIMEOUT};
use crate::record::{build_record, Ending, ProbeMeta};
use crate::schedule::{filter_nodes, plan_kinds, NodeInfo, PlannedProbe};
use crate::sweep::{sweep, SWEEP_GRACE};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use rand::RngExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use target_server::report::{ProbeRecord, Reason, Thresholds};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// How long the pod watch may take to deliver its initial list.
pub const WATCH_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long node-agent discovery may take to list the agent pods (10 s: one list per
/// profile namespace; correlation works on what was found if it takes longer).
pub const AGENT_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn with_timeout<T>(
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    url: &str,
    verb: &'static str,
    resource: &str,
) -> Result<T, Error> {
    match tokio::time::timeout(API_CALL_TIMEOUT, fut).await {
        Ok(r) => r.map_err(|e| Error::from_kube(e, url, verb, resource.to_string())),
        Err(_) => Err(Error::Unreachable {
            url: url.to_string(),
            verb,
            resource: resource.to_string(),
            message: format!("no answer within {}s", API_CALL_TIMEOUT.as_secs()),
        }),
    }
}

async fn ensure_namespace(client: &Client, url: &str, ns: &str) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let resource = format!("namespace {ns}");
    if with_timeout(api.get_opt(ns), url, "get", &resource)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let obj = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    match tokio::time::timeout(API_CALL_TIMEOUT, api.create(&pp, &obj)).await {
        Ok(Ok(_)) => {
            tracing::info!(namespace = ns, "created namespace");
            Ok(())
        }
        Ok(Err(e)) if kube_status_code(&e) == Some(409) => Ok(()),
        Ok(Err(e)) => Err(Error::from_kube(e, url, "create", resource)),
        Err(_) => Err(Error::Unreachable {
            url: url.to_string(),
            verb: "create",
            resource,
            message: "timed out".into(),
        }),
    }
}

/// Deletes every pod and Service of `instance` in `pods`' namespace (list by label, then
/// one delete each, grace 0). Returns how many deletes were sent.
pub async fn delete_instance_pods(pods: &Api<Pod>, instance: &str) -> Result<usize, kube::Error> {
    let n = delete_labelled(pods, instance).await?;
    let namespace = pods.namespace().map(str::to_owned).unwrap_or_default();
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(pods.clone().into_client(), &namespace);
    Ok(n + delete_labelled(&services, instance).await?)
}

async fn delete_labelled<K>(api: &Api<K>, instance: &str) -> Result<usize, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api
        .list(&ListParams::default().labels(&instance_selector(instance)))
        .await?;
    let mut n = 0;
    for obj in list.items {
        let Some(name) = obj.meta().name.clone() else {
            continue;
        };
        n += 1;
        match api
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(e) if kube_status_code(&e) == Some(404) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
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
        "  affinity kubernetes.io/hostname In [<node>]; readiness GET /readyz :8080 every 1s; \
         restartPolicy Never; activeDeadlineSeconds {}",
        active_deadline_seconds(cfg.give_up, cfg.hold)
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

fn spawn_signal_handler(env: Arc<ProbeEnv>, instance: String, errors: Arc<Mutex<Vec<String>>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot install signal handlers; SIGINT/SIGTERM will kill the gate");
        return;
    };
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        };
        lock(&errors).push(format!("interrupted by {name}"));
        eprintln!("{name}: stopping, deleting in-flight probe pods (signal again to exit at once)");
        env.cancel.send_replace(true);
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
        eprintln!("second signal: deleting probe pods (best effort) and exiting");
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            delete_instance_pods(&env.pods, &instance),
        )
        .await;
        std::process::exit(2);
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
    if let Some(report) = &args.report {
        let dir = report.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return bad(
                "--report",
                format!("directory of {} does not exist", report.display()),
            );
        }
    }
    Ok(())
}

/// Kinds whose pairs cross nodes and are cut short by the early stop.
fn stops_early(kind: ProbeKind) -> bool {
    kind != ProbeKind::SameNode
}

/// Runs `prober gate`. Returns the process exit code (0 pass, 1 fail, 2 inconclusive);
/// errors before any probe ran (config, API unreachable/forbidden, < 2 nodes) are
/// returned as [`Error`] (exit 2 in `main`).
pub async fn run_gate(args: GateArgs) -> Result<i32, Error> {
    let p = &args.probe;
    let kinds = check_kinds(&p.kinds)?;
    check_settings(&args)?;
    // Agent profiles first: a bad --agent-config fails before any API call.
    let profiles = match &p.agent_config {
        Some(path) => {
            crate::agents::profiles::load_profiles_file(path).map_err(|e| Error::Config {
                flag: "--agent-config",
                message: e.to_string(),
            })?
        }
        None => crate::agents::profiles::builtin_profiles(),
    };
    for (flag, set) in [
        ("--junit", args.junit.is_some()),
        ("--save-baseline", args.save_baseline.is_some()),
        ("--baseline", args.baseline.is_some()),
    ] {
        if set {
            return Err(Error::NotImplemented(flag.to_string()));
        }
    }
    let hold = p.hold_or(GATE_DEFAULT_HOLD);
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let instance = new_gate_instance();
    let run_start = Instant::now();
    let started_at = Timestamp::now().to_string();
    eprintln!("firstpacket gate {instance}: seed {seed} (repeat the plan with --seed {seed})");

    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::ClientConfig(error_chain(&e)))?;
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| Error::ClientConfig(error_chain(&e)))?;

    let nodes_api: Api<Node> = Api::all(client.clone());
    let selector = p.node_selector.to_string();
    let node_list = with_timeout(
        nodes_api.list(&ListParams::default().labels(&selector)),
        &url,
        "list",
        "nodes",
    )
    .await?;
    let all_nodes: Vec<NodeInfo> = node_list.items.iter().map(NodeInfo::from_node).collect();
    let (eligible, skipped) = filter_nodes(&all_nodes, &p.node_selector, &p.toleration);
    for (n, r) in &skipped {
        tracing::info!(node = %n, reason = %r, "node skipped");
    }
    let names: Vec<String> = eligible.iter().map(|n| n.name.clone()).collect();
    let pairs = args.pairs.map_or(names.len(), |n| n as usize);
    let plan = plan_kinds(&names, &kinds, pairs, seed).ok_or_else(|| Error::NotEnoughNodes {
        eligible: names.len(),
        detail: if skipped.is_empty() {
            format!(" (selector {selector})")
        } else {
            let s: Vec<String> = skipped.iter().map(|(n, r)| format!("{n}: {r}")).collect();
            format!(" (skipped {})", s.join("; "))
        },
    })?;

    let pod_config = PodConfig {
        namespace: p.namespace.clone(),
        image: p.image.clone(),
        instance: instance.clone(),
        tolerations: p.toleration.clone(),
        image_pull_secrets: p.image_pull_secret.clone(),
        priority_class: p.priority_class.clone(),
        dial_interval: p.dial_interval,
        attempt_timeout: p.attempt_timeout,
        give_up: p.give_up,
        hold,
        owner: None,
    };
    if args.dry_run {
        print!(
            "{}",
            render_plan(
                &plan,
                &skipped,
                &pod_config,
                seed,
                names.len(),
                p.burst_size
            )
        );
        return Ok(0);
    }

    ensure_namespace(&client, &url, &p.namespace).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
    let max_age = p.give_up * 2 + hold + SWEEP_GRACE;
    let swept = sweep(&pods, &url, &p.namespace, &instance, max_age).await?;
    if !swept.is_empty() {
        eprintln!("swept {} leftover probe pod(s)", swept.len());
    }

    let watch = Arc::new(PodWatch::start(pods.clone(), &instance_selector(&instance)));
    watch.wait_ready(WATCH_READY_TIMEOUT).await?;

    // Node-agent correlation (DESIGN §3): discovery + a first scrape of the planned
    // nodes, so the first probes have a cluster baseline.
    let agents = crate::agents::scrape::AgentWatcher::start(
        client.clone(),
        profiles,
        crate::agents::scrape::ScrapeSettings {
            mode: p.agent_scrape.into(),
            ..Default::default()
        },
        crate::agents::correlate::Params::default(),
    );
    if !agents.wait_synced(AGENT_SYNC_TIMEOUT).await {
        tracing::warn!("agent discovery not synced; correlating on what was found");
    }
    agents.prime(&names).await;

    let (cancel_tx, cancel_rx) = watch::channel(false);
    let env = Arc::new(ProbeEnv {
        pods: pods.clone(),
        nodes: nodes_api,
        url: url.clone(),
        pod_config,
        watch: watch.clone(),
        slow_threshold: p.slow_threshold,
        writes: AtomicU64::new(0),
        fatal: Mutex::new(None),
        cancel: cancel_tx,
        recreate_slots: Mutex::new(Default::default()),
        agents: Some(Arc::new(agents)),
        agent_warnings: Mutex::new(Vec::new()),
    });
    // Early stop (gate::early_stop): cancels cross-node kinds only. The run-wide cancel
    // is forwarded to it, so those probes see one channel.
    let (cross_cancel_tx, cross_cancel_rx) = watch::channel(false);
    let cross_cancel_tx = Arc::new(cross_cancel_tx);
    {
        let mut run_cancel = cancel_rx.clone();
        let tx = cross_cancel_tx.clone();
        tokio::spawn(async move {
            if run_cancel.wait_for(|c| *c).await.is_ok() {
                tx.send_replace(true);
            }
        });
    }
    let finished: Arc<Mutex<Vec<ProbeRecord>>> = Arc::new(Mutex::new(Vec::new()));
    let stopped_early: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let run_errors = Arc::new(Mutex::new(Vec::<String>::new()));
    spawn_signal_handler(env.clone(), instance.clone(), run_errors.clone());
    {
        let env = env.clone();
        let errors = run_errors.clone();
        let timeout = args.timeout;
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            lock(&errors).push(format!(
                "--timeout {} reached",
                humantime::format_duration(timeout)
            ));
            env.cancel.send_replace(true);
        });
    }

    let total = plan.len();
    let sem = Arc::new(Semaphore::new(p.concurrency as usize));
    let mut set: JoinSet<(usize, Option<ProbeRecord>)> = JoinSet::new();
    for planned in plan {
        let env = env.clone();
        let sem = sem.clone();
        let probe = probe_plan(&planned, &instance, p.burst_size);
        let cross = stops_early(probe.kind);
        let mut cancel = if cross {
            cross_cancel_rx.clone()
        } else {
            cancel_rx.clone()
        };
        let run_cancel = cancel_rx.clone();
        let finished = finished.clone();
        let stopped = stopped_early.clone();
        let cross_tx = cross_cancel_tx.clone();
        let max_failures = args.max_failures;
        let index = planned.index;
        set.spawn(async move {
            let permit = tokio::select! {
                p = sem.acquire_owned() => p.ok(),
                _ = cancel.wait_for(|c| *c) => None,
            };
            let early = lock(&stopped).clone();
            if permit.is_none() || *cancel.borrow() {
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
                if let Some(why) = lock(&stopped).clone() {
                    rec.detail = Some(format!(
                        "cut short: stopped early: {why} ({})",
                        rec.detail.as_deref().unwrap_or("")
                    ));
                }
            }
            // Decide on the early stop before the permit goes to the next probe.
            {
                let mut done = lock(&finished);
                done.push(rec.clone());
                let mut st = lock(&stopped);
                if st.is_none() {
                    if let Some(why) = early_stop(&done, max_failures) {
                        eprintln!("stopping cross-node probes early: {why}");
                        *st = Some(why);
                        cross_tx.send_replace(true);
                    }
                }
            }
            drop(permit);
            (index, Some(rec))
        });
    }
    let mut records: Vec<(usize, ProbeRecord)> = Vec::with_capacity(total);
    let mut not_started = 0usize;
    while let Some(res) = set.join_next().await {
        match res {
            Ok((i, Some(rec))) => {
                eprintln!("{}", progress_line(records.len() + 1, total, &rec));
                records.push((i, rec));
            }
            Ok((_, None)) => not_started += 1,
            Err(e) => lock(&run_errors).push(format!("probe task failed: {e}")),
        }
    }
    // Leftovers (a probe cut short mid-create, or a failed delete).
    match tokio::time::timeout(
        Duration::from_secs(15),
        delete_instance_pods(&pods, &instance),
    )
    .await
    {
        Ok(Ok(n)) if n > 0 => {
            env.writes.fetch_add(n as u64, Ordering::Relaxed);
            tracing::info!(deleted = n, "deleted leftover probe pods");
        }
        Ok(Err(e)) => lock(&run_errors).push(format!("final cleanup: {}", error_chain(&e))),
        Err(_) => lock(&run_errors).push("final cleanup timed out".into()),
        _ => {}
    }
    if not_started > 0 {
        lock(&run_errors).push(format!(
            "{not_started} of {total} planned probe(s) not started"
        ));
    }
    if let Some(f) = lock(&env.fatal).clone() {
        eprintln!("error: {f}");
        lock(&run_errors).insert(0, f);
    }
    records.sort_by_key(|(i, _)| *i);
    let probes: Vec<ProbeRecord> = records.into_iter().map(|(_, r)| r).collect();
    let n_probes = probes.len();
    let errors = lock(&run_errors).clone();
    let agent_warnings = std::mem::take(&mut *lock(&env.agent_warnings));
    let report = build_report(
        probes,
        &eligible,
        agent_warnings,
        ReportInputs {
            thresholds: Thresholds {
                slow_threshold_seconds: p.slow_threshold.as_secs_f64(),
                max_ttfp_seconds: args.max_ttfp.as_secs_f64(),
                max_failures: args.max_failures,
                max_inconclusive: args.max_inconclusive,
            },
            instance: instance.clone(),
            started_at,
            finished_at: Timestamp::now().to_string(),
            duration_seconds: run_start.elapsed().as_secs_f64(),
            errors,
            group_by: p.group_by_label.clone(),
            stopped_early: lock(&stopped_early).clone(),
            skipped_nodes: skipped
                .iter()
                .map(|(n, r)| target_server::report::SkippedNode {
                    node: n.clone(),
                    reason: r.to_string(),
                })
                .collect(),
        },
    );
    print!("{}", render_text(&report, &p.group_by_label));
    tracing::info!(
        api_writes = env.writes.load(Ordering::Relaxed),
        probes = n_probes,
        "API writes (creates + deletes)"
    );
    if let Some(a) = &env.agents {
        for ((profile, result), n) in a.scrape_counts() {
            tracing::info!(profile = %profile, result = %result, scrapes = n, "agent scrapes");
        }
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&report).map_err(|e| Error::Output {
            path: path.display().to_string(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(path, json + "\n").map_err(|e| Error::Output {
            path: path.display().to_string(),
            source: e,
        })?;
        eprintln!("report written to {}", path.display());
    }
    Ok(report.exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let kinds = [ProbeKind::CrossNode, ProbeKind::Recreate, ProbeKind::Burst];
        let plan = plan_kinds(&["n1".into(), "n2".into()], &kinds, 2, 1).expect("plan");
        let text = render_plan(&plan, &[], &cfg, 1, 2, 3);
        assert!(text.contains("seed 1"));
        assert!(text.contains("fp-abcdefgh-0-t"));
        assert!(text.contains("activeDeadlineSeconds 185"));
        assert!(text.contains("k:NoSchedule"));
        assert!(text.contains(&format!("{} → {}", plan[0].source, plan[0].target)));
        assert!(text.contains("fp-abcdefgh-rc-n1"), "{text}");
        assert!(text.contains("+ 3 filler(s)"), "{text}");
        assert!(text.contains("≤ 10 API writes"), "{text}");
    }
}
