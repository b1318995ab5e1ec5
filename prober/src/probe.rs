//! The lifecycle of one probe (DESIGN §2 steps 2–8): create the target pod T, wait for
//! it to be Ready, create the source pod S dialing T, wait for S to terminate, record,
//! delete both. Exactly 4 API writes per probe (2 creates, 2 deletes; DESIGN §7).
//!
//! Every wait runs on the shared [`PodWatch`] under a deadline; cancellation (signal,
//! `--timeout`) turns the probe into `inconclusive`/`interrupted` and still deletes its
//! pods. The decisions themselves are pure ([`timeout_ending`],
//! [`crate::record::build_record`]).

use crate::error::{kube_status_code, Error};
use crate::podspec::{pod_name, source_pod, target_pod, PodConfig, PodRole, FIELD_MANAGER};
use crate::podwatch::{PodWatch, Wait};
use crate::record::{build_record, Ending, ProbeMeta};
use crate::tracker::{PodState, ProblemKind};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use target_server::report::{ProbeRecord, ProbeResult, Reason};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

/// Timeout of each single API call a probe makes.
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Extra time the source gets beyond give-up + hold to start and report.
pub const SOURCE_FINISH_MARGIN: Duration = Duration::from_secs(30);

/// What every probe of a run shares.
pub struct ProbeEnv {
    /// Pods in the probe namespace.
    pub pods: Api<Pod>,
    /// Nodes (for the `node_not_ready` check).
    pub nodes: Api<Node>,
    /// API server URL (for error messages).
    pub url: String,
    /// Pod manifest settings.
    pub pod_config: PodConfig,
    /// The shared pod watch.
    pub watch: Arc<PodWatch>,
    /// `--slow-threshold`.
    pub slow_threshold: Duration,
    /// API writes made (creates + deletes), for the "≤ 4 per probe" budget.
    pub writes: AtomicU64,
    /// A run-fatal error (e.g. 403 on create): set once, stops the run.
    pub fatal: Mutex<Option<String>>,
    /// Cancels the whole run (set on a fatal error).
    pub cancel: watch::Sender<bool>,
}

impl ProbeEnv {
    fn set_fatal(&self, msg: String) {
        let mut f = self.fatal.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(msg);
        }
        self.cancel.send_replace(true);
    }
}

/// One probe to run.
#[derive(Debug, Clone)]
pub struct ProbePlan {
    /// Probe id (pod names `fp-<id>-t` / `fp-<id>-s`).
    pub id: String,
    /// Kind label (`cross_node`).
    pub kind: &'static str,
    /// Node A.
    pub source_node: String,
    /// Node B.
    pub target_node: String,
}

fn role_name(role: PodRole) -> &'static str {
    match role {
        PodRole::Target => "target",
        PodRole::Source => "source",
    }
}

/// Ending for a pod problem seen while waiting (image pull, container start, exit).
pub fn problem_ending(role: PodRole, s: &PodState) -> Option<Ending> {
    let who = role_name(role);
    if let Some(p) = &s.problem {
        let reason = match p.kind {
            ProblemKind::ImagePull => Reason::ImagePull,
            ProblemKind::ContainerFailed | ProblemKind::Unschedulable => Reason::ContainerFailed,
        };
        return Some(Ending::Aborted {
            reason,
            detail: format!("{who} pod {}: {}: {}", s.name, p.reason, p.message),
        });
    }
    if s.deleted.is_some() {
        return Some(Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("{who} pod {} was deleted by someone else", s.name),
        });
    }
    None
}

/// Ending when a wait for `role` ran out of time (pure; rules of DESIGN §2 "Results"):
/// never scheduled → `unschedulable` (with the scheduler's message); scheduled but the
/// container never ran → `container_failed`; running but never Ready →
/// `target_never_ready` / `source_never_ready`; Ready but unfinished (source) →
/// `container_failed`.
pub fn timeout_ending(role: PodRole, s: Option<&PodState>, waited: Duration) -> Ending {
    let who = role_name(role);
    let secs = waited.as_secs_f64();
    let Some(s) = s else {
        return Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!("{who} pod never appeared in the watch within {secs:.0}s"),
        };
    };
    if s.scheduled.is_none() {
        let msg = s
            .unschedulable
            .as_ref()
            .map(|u| u.message.clone())
            .unwrap_or_else(|| "no scheduling decision".into());
        return Ending::Aborted {
            reason: Reason::Unschedulable,
            detail: format!("{who} pod {} not scheduled after {secs:.0}s: {msg}", s.name),
        };
    }
    if s.running.is_none() {
        return Ending::Aborted {
            reason: Reason::ContainerFailed,
            detail: format!(
                "{who} pod {} container not running after {secs:.0}s (phase {})",
                s.name,
                s.phase.as_deref().unwrap_or("unknown")
            ),
        };
    }
    if s.ready.is_none() {
        let reason = match role {
            PodRole::Target => Reason::TargetNeverReady,
            PodRole::Source => Reason::SourceNeverReady,
        };
        return Ending::Aborted {
            reason,
            detail: format!(
                "{who} pod {} on {} running but not Ready after {secs:.0}s",
                s.name,
                s.node.as_deref().unwrap_or("?")
            ),
        };
    }
    Ending::Aborted {
        reason: Reason::ContainerFailed,
        detail: format!("{who} pod {} did not finish within {secs:.0}s", s.name),
    }
}

fn interrupted(stage: &str) -> Ending {
    Ending::Aborted {
        reason: Reason::Interrupted,
        detail: format!("run interrupted while {stage}"),
    }
}

async fn create(env: &ProbeEnv, pod: &Pod) -> Result<(), Ending> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = env.pod_config.namespace.as_str();
    let pp = PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.into()),
    };
    env.writes.fetch_add(1, Ordering::Relaxed);
    match tokio::time::timeout(API_CALL_TIMEOUT, env.pods.create(&pp, pod)).await {
        Ok(Ok(_)) => {
            let now = std::time::Instant::now();
            env.watch.with_tracker(|t| t.note_created(&name, now));
            Ok(())
        }
        Ok(Err(e)) => {
            let fatal = matches!(kube_status_code(&e), Some(401) | Some(403));
            let err = Error::from_kube(e, &env.url, "create", format!("pod {ns}/{name}"));
            if fatal {
                env.set_fatal(err.to_string());
            }
            Err(Ending::Aborted {
                reason: Reason::ApiError,
                detail: err.to_string(),
            })
        }
        Err(_) => Err(Ending::Aborted {
            reason: Reason::ApiError,
            detail: format!(
                "create pod {ns}/{name} at {} timed out after {}s",
                env.url,
                API_CALL_TIMEOUT.as_secs()
            ),
        }),
    }
}

/// Deletes a probe pod (grace 0; 404 is fine). Returns when the delete returned, or the
/// error text.
pub async fn delete_pod(env: &ProbeEnv, name: &str) -> Result<std::time::Instant, String> {
    env.writes.fetch_add(1, Ordering::Relaxed);
    let dp = DeleteParams::default().grace_period(0);
    match tokio::time::timeout(API_CALL_TIMEOUT, env.pods.delete(name, &dp)).await {
        Ok(Ok(_)) => Ok(std::time::Instant::now()),
        Ok(Err(e)) if kube_status_code(&e) == Some(404) => Ok(std::time::Instant::now()),
        Ok(Err(e)) => Err(Error::from_kube(
            e,
            &env.url,
            "delete",
            format!("pod {}/{name}", env.pod_config.namespace),
        )
        .to_string()),
        Err(_) => Err(format!("delete pod {name} timed out")),
    }
}

async fn lifecycle(
    env: &ProbeEnv,
    plan: &ProbePlan,
    cancel: &mut watch::Receiver<bool>,
    created: &mut [bool; 2],
) -> Ending {
    let cfg = &env.pod_config;
    let t_name = pod_name(&plan.id, PodRole::Target);
    if *cancel.borrow() {
        return interrupted("starting");
    }
    let t_pod = target_pod(cfg, &plan.id, plan.kind, &plan.target_node);
    if let Err(e) = create(env, &t_pod).await {
        return e;
    }
    created[0] = true;
    let waited = cfg.give_up;
    let deadline = Instant::now() + waited;
    let ip = match env
        .watch
        .wait_for(&t_name, deadline, cancel, |s| {
            let s = s?;
            if let (Some(_), Some(ip)) = (s.ready, &s.ip) {
                return Some(Ok(ip.clone()));
            }
            if let Some(e) = problem_ending(PodRole::Target, s) {
                return Some(Err(e));
            }
            s.terminated.as_ref().map(|t| {
                Err(Ending::Aborted {
                    reason: Reason::ContainerFailed,
                    detail: format!(
                        "target pod {} exited (code {}) before it was Ready",
                        s.name, t.exit_code
                    ),
                })
            })
        })
        .await
    {
        Wait::Done(Ok(ip)) => ip,
        Wait::Done(Err(e)) => return e,
        Wait::Cancelled => return interrupted("waiting for the target to be Ready"),
        Wait::TimedOut => {
            return timeout_ending(
                PodRole::Target,
                env.watch.snapshot(&t_name).as_ref(),
                waited,
            )
        }
    };
    tracing::debug!(target_ip = %ip, "target Ready");

    let s_name = pod_name(&plan.id, PodRole::Source);
    let s_pod = source_pod(cfg, &plan.id, plan.kind, &plan.source_node, &ip, &t_name);
    if let Err(e) = create(env, &s_pod).await {
        return e;
    }
    created[1] = true;
    let waited = cfg.give_up + cfg.hold + SOURCE_FINISH_MARGIN;
    let deadline = Instant::now() + waited;
    match env
        .watch
        .wait_for(&s_name, deadline, cancel, |s| {
            let s = s?;
            if s.terminated.is_some() {
                return Some(Ending::SourceTerminated);
            }
            problem_ending(PodRole::Source, s)
        })
        .await
    {
        Wait::Done(e) => e,
        Wait::Cancelled => interrupted("the source was measuring"),
        Wait::TimedOut => timeout_ending(
            PodRole::Source,
            env.watch.snapshot(&s_name).as_ref(),
            waited,
        ),
    }
}

async fn node_ready(env: &ProbeEnv, name: &str) -> Option<bool> {
    match tokio::time::timeout(Duration::from_secs(10), env.nodes.get_opt(name)).await {
        Ok(Ok(Some(n))) => Some(crate::schedule::NodeInfo::from_node(&n).ready),
        _ => None,
    }
}

/// Runs one probe to its record. Never fails: API trouble becomes an `api_error`
/// record. Both pods are deleted before returning (even when cancelled).
pub async fn run_probe(
    env: Arc<ProbeEnv>,
    plan: ProbePlan,
    mut cancel: watch::Receiver<bool>,
) -> ProbeRecord {
    let span = tracing::info_span!(
        "probe",
        probe_id = %plan.id,
        src_node = %plan.source_node,
        dst_node = %plan.target_node
    );
    async move {
        let meta = ProbeMeta {
            id: plan.id.clone(),
            kind: plan.kind.to_string(),
            namespace: env.pod_config.namespace.clone(),
            source_node: plan.source_node.clone(),
            target_node: plan.target_node.clone(),
            source_pod: pod_name(&plan.id, PodRole::Source),
            target_pod: pod_name(&plan.id, PodRole::Target),
            started: std::time::Instant::now(),
            started_at: Timestamp::now().to_string(),
        };
        let mut created = [false; 2];
        let ending = lifecycle(&env, &plan, &mut cancel, &mut created).await;

        let mut states: [Option<PodState>; 2] = [
            env.watch.snapshot(&meta.target_pod),
            env.watch.snapshot(&meta.source_pod),
        ];
        for (i, name) in [&meta.target_pod, &meta.source_pod].into_iter().enumerate() {
            if !created[i] {
                continue;
            }
            match delete_pod(&env, name).await {
                Ok(at) => {
                    if let Some(s) = states[i].as_mut() {
                        s.deleted.get_or_insert(at);
                    }
                }
                Err(e) => tracing::warn!(pod = %name, error = %e, "delete failed"),
            }
        }
        let mut record = build_record(
            &meta,
            states[0].as_ref(),
            states[1].as_ref(),
            &ending,
            env.slow_threshold,
            std::time::Instant::now(),
        );
        if record.result == ProbeResult::Failed {
            for node in [&plan.source_node, &plan.target_node] {
                if node_ready(&env, node).await == Some(false) {
                    record.detail = Some(format!(
                        "node {node} is NotReady (would have been failed/{}: {})",
                        record.reason.map_or("", |r| r.as_str()),
                        record.detail.as_deref().unwrap_or("")
                    ));
                    record.result = ProbeResult::Inconclusive;
                    record.reason = Some(Reason::NodeNotReady);
                    break;
                }
            }
        }
        env.watch.with_tracker(|t| {
            t.forget(&meta.target_pod);
            t.forget(&meta.source_pod);
        });
        tracing::info!(
            result = record.result.as_str(),
            reason = record.reason.map(|r| r.as_str()),
            ttfp_seconds = record.ttfp_seconds,
            "probe finished"
        );
        record
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::{Problem, Tracker};

    fn state(f: impl FnOnce(&mut PodState)) -> PodState {
        let mut tr = Tracker::new();
        tr.note_created("fp-x-t", std::time::Instant::now());
        let mut s = tr.get("fp-x-t").cloned().expect("state");
        f(&mut s);
        s
    }

    fn reason(e: &Ending) -> Option<Reason> {
        match e {
            Ending::Aborted { reason, .. } => Some(*reason),
            Ending::SourceTerminated => None,
        }
    }

    #[test]
    fn timeouts_map_to_the_stage_that_stalled() {
        let now = std::time::Instant::now();
        let d = Duration::from_secs(60);
        let pending = state(|s| {
            s.unschedulable = Some(Problem {
                kind: ProblemKind::Unschedulable,
                reason: "Unschedulable".into(),
                message: "0/3 nodes are available".into(),
                since: now,
            })
        });
        let e = timeout_ending(PodRole::Target, Some(&pending), d);
        assert_eq!(reason(&e), Some(Reason::Unschedulable));
        assert!(matches!(&e, Ending::Aborted { detail, .. } if detail.contains("0/3 nodes")));

        let creating = state(|s| s.scheduled = Some(now));
        assert_eq!(
            reason(&timeout_ending(PodRole::Target, Some(&creating), d)),
            Some(Reason::ContainerFailed)
        );
        let running = state(|s| {
            s.scheduled = Some(now);
            s.running = Some(now);
        });
        assert_eq!(
            reason(&timeout_ending(PodRole::Target, Some(&running), d)),
            Some(Reason::TargetNeverReady)
        );
        assert_eq!(
            reason(&timeout_ending(PodRole::Source, Some(&running), d)),
            Some(Reason::SourceNeverReady)
        );
        assert_eq!(
            reason(&timeout_ending(PodRole::Target, None, d)),
            Some(Reason::ApiError)
        );
    }

    #[test]
    fn image_pull_problem_ends_the_wait_as_image_pull() {
        let s = state(|s| {
            s.problem = Some(Problem {
                kind: ProblemKind::ImagePull,
                reason: "ErrImagePull".into(),
                message: "no such image".into(),
                since: std::time::Instant::now(),
            })
        });
        let e = problem_ending(PodRole::Target, &s).expect("ending");
        assert_eq!(reason(&e), Some(Reason::ImagePull));
        assert!(problem_ending(PodRole::Target, &state(|_| {})).is_none());
    }
}
