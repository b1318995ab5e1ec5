//! Minimal workload controllers over the [`Store`], so manifests can be applied to the
//! testbed as users apply them to a cluster: apps/v1 Deployment and batch/v1 Job.
//!
//! Simplifications (said where they show):
//! - A Deployment owns its Pods directly (a real one owns ReplicaSets that own the Pods).
//!   Pods are named `<deployment>-<pod-template-hash>-<5 chars>` and labelled
//!   `pod-template-hash` as under a ReplicaSet, so names and selectors look the same.
//! - Rollouts: Pods of an older template are removed once `spec.replicas` Pods of the
//!   current template are Ready (strategy `RollingUpdate`, with a 100% surge), or at
//!   once (strategy `Recreate`). minReadySeconds is treated as 0.
//! - A Job runs up to `parallelism` Pods at a time (NonIndexed mode only); finished Pods
//!   stay, as with the real Job controller.
//!
//! Every reconcile is a full pass over all Deployments and Jobs (cheap at testbed size),
//! triggered by store events for Deployments, Jobs and Pods and by a 1 s resync.
//! Writes with no change are no-ops in the store, so a pass that finds nothing to do
//! writes nothing.

use crate::api::{rfc3339_now, ApiError, Kind, Store};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// Interval of the full resync (also catches Job `activeDeadlineSeconds`).
pub const RESYNC: Duration = Duration::from_secs(1);

/// Runs the Deployment and Job controllers until the store's event channel closes.
/// Never fails: per-object errors (e.g. a 409 from a concurrent write) are retried on
/// the next pass.
pub async fn run(store: Arc<Store>) {
    let mut rx = store.subscribe();
    let mut tick = tokio::time::interval(RESYNC);
    loop {
        reconcile_all(&store);
        tokio::select! {
            r = rx.recv() => match r {
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            _ = tick.tick() => {}
        }
        // Coalesce a burst of events into one pass.
        while let Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) =
            rx.try_recv()
        {}
    }
}

/// One reconcile pass over every Deployment and Job in the store.
pub fn reconcile_all(store: &Store) {
    for d in store.list(Kind::Deployment, None).0 {
        if let Err(e) = reconcile_deployment(store, &d) {
            tracing::debug!(error = %e, deployment = name(&d), "deployment reconcile");
        }
    }
    for j in store.list(Kind::Job, None).0 {
        if let Err(e) = reconcile_job(store, &j) {
            tracing::debug!(error = %e, job = name(&j), "job reconcile");
        }
    }
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("")
}

fn ns(o: &Value) -> &str {
    o["metadata"]["namespace"].as_str().unwrap_or("default")
}

fn uid(o: &Value) -> &str {
    o["metadata"]["uid"].as_str().unwrap_or("")
}

fn owned_by(pod: &Value, owner_uid: &str) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|rs| rs.iter().any(|r| r["uid"].as_str() == Some(owner_uid)))
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn deleting(o: &Value) -> bool {
    o["metadata"]["deletionTimestamp"].is_string()
}

/// `pod-template-hash`: FNV-1a 32 of the template JSON, printed in decimal and mapped
/// through `rand.SafeEncodeString` (k8s.io/kubernetes `pkg/controller`
/// `ComputeHash`; the real hash input is the Go struct dump, so values differ).
pub fn pod_template_hash(template: &Value) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h: u32 = 0x811c_9dc5;
    for b in serde_json::to_vec(template).unwrap_or_default() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

fn owner_ref(owner: &Value, kind: Kind) -> Value {
    json!({"apiVersion": kind.api_version(), "kind": kind.kind_name(), "name": name(owner),
           "uid": uid(owner), "controller": true, "blockOwnerDeletion": true})
}

/// A Pod from `owner`'s `spec.template` with `generate_name`, extra labels and a
/// controller ownerReference.
fn pod_from_template(
    owner: &Value,
    kind: Kind,
    generate_name: &str,
    extra: &[(&str, &str)],
) -> Value {
    let t = &owner["spec"]["template"];
    let mut meta = t["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    meta["generateName"] = json!(generate_name);
    meta["namespace"] = json!(ns(owner));
    if !meta["labels"].is_object() {
        meta["labels"] = json!({});
    }
    for (k, v) in extra {
        meta["labels"][*k] = json!(v);
    }
    meta["ownerReferences"] = json!([owner_ref(owner, kind)]);
    if let Some(m) = meta.as_object_mut() {
        m.remove("name");
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": t["spec"].clone()})
}

/// A condition `{type, status, reason, message, lastTransitionTime, lastUpdateTime?}`,
/// keeping the previous timestamps when status, reason and message are unchanged (so an
/// unchanged status writes nothing).
fn condition(
    old: &Value,
    ty: &str,
    status: bool,
    reason: &str,
    message: &str,
    with_update_time: bool,
) -> Value {
    let prev = old["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
        .cloned();
    let st = if status { "True" } else { "False" };
    let now = rfc3339_now();
    let same = prev
        .as_ref()
        .is_some_and(|p| p["status"] == st && p["reason"] == reason && p["message"] == message);
    let mut c = json!({"type": ty, "status": st, "reason": reason, "message": message});
    let keep = |f: &str| -> Value {
        match &prev {
            Some(p) if p[f].is_string() => p[f].clone(),
            _ => json!(now),
        }
    };
    c["lastTransitionTime"] = if prev.as_ref().is_some_and(|p| p["status"] == st) {
        keep("lastTransitionTime")
    } else {
        json!(now)
    };
    if with_update_time {
        c["lastUpdateTime"] = if same {
            keep("lastUpdateTime")
        } else {
            json!(now)
        };
    }
    c
}

/// `maxUnavailable` of a RollingUpdate strategy against `replicas` (an int, or a
/// percentage rounded down; default 25%).
fn max_unavailable(d: &Value, replicas: i64) -> i64 {
    let v = &d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"];
    if let Some(n) = v.as_i64() {
        return n;
    }
    let pct = v
        .as_str()
        .and_then(|s| s.strip_suffix('%'))
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or(25);
    replicas * pct / 100
}

/// One Deployment: create missing Pods of the current template, delete surplus and (per
/// the rollout rule above) old-template Pods, write `status` (`observedGeneration`,
/// `replicas`, `updatedReplicas`, `readyReplicas`, `availableReplicas`,
/// `unavailableReplicas`, conditions `Available` and `Progressing` with the reasons of
/// k8s.io/kubernetes `pkg/controller/deployment/util`). Errors: store errors.
pub fn reconcile_deployment(store: &Store, d: &Value) -> Result<(), ApiError> {
    if deleting(d) {
        return Ok(());
    }
    let namespace = ns(d).to_string();
    let replicas = d["spec"]["replicas"].as_i64().unwrap_or(1).max(0);
    let hash = pod_template_hash(&d["spec"]["template"]);
    let (pods, _) = store.list(Kind::Pod, Some(&namespace));
    let mine: Vec<&Value> = pods
        .iter()
        .filter(|p| owned_by(p, uid(d)) && !deleting(p))
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    let (current, old): (Vec<&Value>, Vec<&Value>) = mine
        .iter()
        .partition(|p| p["metadata"]["labels"]["pod-template-hash"].as_str() == Some(&hash));
    let ready_current = current.iter().filter(|p| is_ready(p)).count() as i64;

    // Failed/Succeeded pods of a Deployment are replaced; remove them.
    for p in pods.iter().filter(|p| {
        owned_by(p, uid(d)) && !deleting(p) && matches!(phase(p), "Succeeded" | "Failed")
    }) {
        let _ = store.delete(Kind::Pod, Some(&namespace), name(p), None, None);
    }
    let have = current.len() as i64;
    if have < replicas {
        for _ in have..replicas {
            let pod = pod_from_template(
                d,
                Kind::Deployment,
                &format!("{}-{hash}-", name(d)),
                &[("pod-template-hash", &hash)],
            );
            store.create(Kind::Pod, pod)?;
        }
    } else if have > replicas {
        // Surplus: not-Ready first, then the newest (ReplicaSet controller's order).
        let mut extra = current.clone();
        extra.sort_by_key(|p| {
            (
                is_ready(p),
                std::cmp::Reverse(
                    p["metadata"]["creationTimestamp"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                ),
            )
        });
        for p in extra.iter().take((have - replicas) as usize) {
            let _ = store.delete(Kind::Pod, Some(&namespace), name(p), None, None);
        }
    }
    let recreate = d["spec"]["strategy"]["type"] == "Recreate";
    if !old.is_empty() && (recreate || ready_current >= replicas) {
        for p in &old {
            let _ = store.delete(Kind::Pod, Some(&namespace), name(p), None, None);
        }
    }

    // Status from what exists now.
    let (pods, _) = store.list(Kind::Pod, Some(&namespace));
    let mine: Vec<&Value> = pods
        .iter()
        .filter(|p| owned_by(p, uid(d)) && !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    let total = mine.len() as i64;
    let updated = mine
        .iter()
        .filter(|p| p["metadata"]["labels"]["pod-template-hash"].as_str() == Some(&hash))
        .count() as i64;
    let ready = mine.iter().filter(|p| is_ready(p)).count() as i64;
    let available = ready;
    let old_status = d["status"].clone();
    let min_available = replicas - max_unavailable(d, replicas);
    let available_cond = if available >= min_available {
        condition(
            &old_status,
            "Available",
            true,
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
            true,
        )
    } else {
        condition(
            &old_status,
            "Available",
            false,
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            true,
        )
    };
    let rs_name = format!("{}-{hash}", name(d));
    let progressing_cond = if updated == replicas && available >= replicas && total == replicas {
        condition(
            &old_status,
            "Progressing",
            true,
            "NewReplicaSetAvailable",
            &format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
            true,
        )
    } else {
        condition(
            &old_status,
            "Progressing",
            true,
            "ReplicaSetUpdated",
            &format!("ReplicaSet \"{rs_name}\" is progressing."),
            true,
        )
    };
    let mut status = json!({
        "observedGeneration": d["metadata"]["generation"].as_i64().unwrap_or(1),
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "conditions": [available_cond, progressing_cond],
    });
    if total - available > 0 {
        status["unavailableReplicas"] = json!(total - available);
    }
    // The real status omits zero counts (omitempty).
    if let Some(m) = status.as_object_mut() {
        m.retain(|_, v| v.as_i64() != Some(0));
    }
    let want_uid = uid(d).to_string();
    store.modify(Kind::Deployment, Some(&namespace), name(d), |cur| {
        if uid(cur) != want_uid {
            return Ok(());
        }
        cur["status"] = status;
        Ok(())
    })?;
    Ok(())
}

/// One Job: count its Pods (`active`, `ready`, `succeeded`, `failed`; with
/// `restartPolicy: OnFailure` container restarts count as failures, as the Job
/// controller does), create Pods up to `min(parallelism, completions − succeeded)`,
/// and finish with condition `Complete` (`succeeded ≥ completions`, plus
/// `completionTime`) or `Failed` (`BackoffLimitExceeded` when failures exceed
/// `backoffLimit`, `DeadlineExceeded` after `activeDeadlineSeconds`), deleting the
/// remaining active Pods. Reasons and messages from k8s.io/kubernetes
/// `pkg/controller/job/job_controller.go`. Errors: store errors.
pub fn reconcile_job(store: &Store, j: &Value) -> Result<(), ApiError> {
    if deleting(j) {
        return Ok(());
    }
    let namespace = ns(j).to_string();
    let old_status = j["status"].clone();
    let finished = |s: &Value| {
        s["conditions"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| {
                (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True"
            })
        })
    };
    let already_finished = finished(&old_status);
    let completions = j["spec"]["completions"].as_i64().unwrap_or(1).max(0);
    let parallelism = j["spec"]["parallelism"].as_i64().unwrap_or(1).max(0);
    let backoff = j["spec"]["backoffLimit"].as_i64().unwrap_or(6);
    let on_failure = j["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure";
    let (pods, _) = store.list(Kind::Pod, Some(&namespace));
    let mine: Vec<&Value> = pods.iter().filter(|p| owned_by(p, uid(j))).collect();
    let succeeded = mine.iter().filter(|p| phase(p) == "Succeeded").count() as i64;
    let failed_pods = mine.iter().filter(|p| phase(p) == "Failed").count() as i64;
    let restarts: i64 = if on_failure {
        mine.iter()
            .flat_map(|p| {
                p["status"]["containerStatuses"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|c| c["restartCount"].as_i64().unwrap_or(0))
            .sum()
    } else {
        0
    };
    let failed = failed_pods + restarts;
    let active: Vec<&Value> = mine
        .iter()
        .copied()
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed") && !deleting(p))
        .collect();
    let now = rfc3339_now();
    let start = old_status["startTime"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| now.clone());
    let deadline_passed = j["spec"]["activeDeadlineSeconds"]
        .as_i64()
        .is_some_and(|s| {
            start
                .parse::<k8s_openapi::jiff::Timestamp>()
                .is_ok_and(|t| crate::api::now().as_second() - t.as_second() >= s)
        });

    let mut status = old_status.clone();
    if !status.is_object() {
        status = json!({});
    }
    status["startTime"] = json!(start);
    let mut conditions: Vec<Value> = old_status["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut active_n = active.len() as i64;
    if !already_finished {
        let outcome = if succeeded >= completions {
            Some(("Complete", "", ""))
        } else if failed > backoff {
            Some((
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ))
        } else if deadline_passed {
            Some((
                "Failed",
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            ))
        } else {
            None
        };
        match outcome {
            Some((ty, reason, message)) => {
                for p in &active {
                    let _ = store.delete(Kind::Pod, Some(&namespace), name(p), Some(0), None);
                }
                active_n = 0;
                conditions.push(json!({"type": ty, "status": "True", "reason": reason,
                    "message": message, "lastProbeTime": now, "lastTransitionTime": now}));
                if ty == "Complete" {
                    status["completionTime"] = json!(now);
                }
            }
            None => {
                let want = parallelism.min(completions - succeeded).max(0);
                while active_n < want {
                    let pod = pod_from_template(j, Kind::Job, &format!("{}-", name(j)), &[]);
                    store.create(Kind::Pod, pod)?;
                    active_n += 1;
                }
            }
        }
    }
    let ready = active.iter().filter(|p| is_ready(p)).count() as i64;
    status["active"] = json!(active_n);
    status["ready"] = json!(ready);
    status["succeeded"] = json!(succeeded);
    status["failed"] = json!(failed);
    status["terminating"] = json!(0);
    status["uncountedTerminatedPods"] = json!({});
    if !conditions.is_empty() {
        status["conditions"] = json!(conditions);
    }
    if let Some(m) = status.as_object_mut() {
        for k in ["active", "succeeded", "failed"] {
            if m.get(k).and_then(Value::as_i64) == Some(0) {
                m.remove(k);
            }
        }
    }
    let want_uid = uid(j).to_string();
    store.modify(Kind::Job, Some(&namespace), name(j), |cur| {
        if uid(cur) != want_uid {
            return Ok(());
        }
        cur["status"] = status;
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(name: &str, replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "main", "image": image}]}}}})
    }

    fn job(name: &str, completions: i64, backoff: i64) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"completions": completions, "backoffLimit": backoff,
                "template": {"spec": {"restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "target-server"}]}}}})
    }

    fn owned(store: &Store, owner: &Value) -> Vec<Value> {
        store
            .list(Kind::Pod, Some("default"))
            .0
            .into_iter()
            .filter(|p| owned_by(p, uid(owner)) && !deleting(p))
            .collect()
    }

    /// A fake kubelet: marks every owned Pod Ready (Running) or finished.
    fn set_pods(store: &Store, owner: &Value, f: impl Fn(&mut Value)) {
        for p in owned(store, owner) {
            store
                .modify(Kind::Pod, Some("default"), name(&p), |p| {
                    f(p);
                    Ok(())
                })
                .unwrap();
        }
    }

    fn ready(p: &mut Value) {
        if p["status"]["phase"] == "Pending" {
            p["status"]["phase"] = json!("Running");
            p["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        }
    }

    fn cond<'a>(o: &'a Value, ty: &str) -> &'a Value {
        o["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
            .unwrap_or(&Value::Null)
    }

    #[test]
    fn deployment_creates_owned_pods_counts_ready_and_recreates_deleted_ones() {
        let store = Store::new();
        let d = store
            .create(Kind::Deployment, deployment("web", 3, "target-server:v1"))
            .unwrap();
        assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");
        reconcile_all(&store);
        let pods = owned(&store, &d);
        assert_eq!(pods.len(), 3);
        let hash = pods[0]["metadata"]["labels"]["pod-template-hash"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(name(&pods[0]).starts_with(&format!("web-{hash}-")));
        assert_eq!(
            pods[0]["metadata"]["ownerReferences"][0]["kind"],
            "Deployment"
        );
        assert_eq!(pods[0]["spec"]["restartPolicy"], "Always");
        let d = store.get(Kind::Deployment, Some("default"), "web").unwrap();
        assert_eq!(d["status"]["replicas"], 3);
        assert!(d["status"]["readyReplicas"].is_null());
        assert_eq!(cond(&d, "Available")["status"], "False");

        set_pods(&store, &d, ready);
        reconcile_all(&store);
        let d = store.get(Kind::Deployment, Some("default"), "web").unwrap();
        assert_eq!(
            (
                &d["status"]["readyReplicas"],
                &d["status"]["availableReplicas"],
                &d["status"]["updatedReplicas"]
            ),
            (&json!(3), &json!(3), &json!(3))
        );
        assert_eq!(cond(&d, "Available")["status"], "True");
        assert_eq!(cond(&d, "Progressing")["reason"], "NewReplicaSetAvailable");
        // A stable state writes nothing.
        let rv = store.current_rv();
        reconcile_all(&store);
        assert_eq!(store.current_rv(), rv);

        // A deleted pod is replaced.
        let victim = name(&owned(&store, &d)[0]).to_string();
        store
            .delete(Kind::Pod, Some("default"), &victim, None, None)
            .unwrap();
        reconcile_all(&store);
        let pods = owned(&store, &d);
        assert_eq!(pods.len(), 3);
        assert!(pods.iter().all(|p| name(p) != victim));
        let d = store.get(Kind::Deployment, Some("default"), "web").unwrap();
        assert_eq!(d["status"]["readyReplicas"], 2);

        // Scale down, then delete: the pods are garbage collected.
        store
            .modify(Kind::Deployment, Some("default"), "web", |d| {
                d["spec"]["replicas"] = json!(1);
                Ok(())
            })
            .unwrap();
        reconcile_all(&store);
        assert_eq!(owned(&store, &d).len(), 1);
        let d2 = store.get(Kind::Deployment, Some("default"), "web").unwrap();
        assert_eq!(d2["metadata"]["generation"], 2);
        assert_eq!(d2["status"]["observedGeneration"], 2);
        store
            .delete(Kind::Deployment, Some("default"), "web", None, None)
            .unwrap();
        assert!(owned(&store, &d).is_empty());
    }

    #[test]
    fn deployment_rollout_replaces_old_template_pods_once_new_ones_are_ready() {
        let store = Store::new();
        let d = store
            .create(Kind::Deployment, deployment("web", 2, "target-server:v1"))
            .unwrap();
        reconcile_all(&store);
        set_pods(&store, &d, ready);
        store
            .modify(Kind::Deployment, Some("default"), "web", |d| {
                d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("target-server:v2");
                Ok(())
            })
            .unwrap();
        reconcile_all(&store);
        assert_eq!(
            owned(&store, &d).len(),
            4,
            "new pods come up next to the old ones"
        );
        set_pods(&store, &d, ready);
        reconcile_all(&store);
        let pods = owned(&store, &d);
        assert_eq!(pods.len(), 2);
        assert!(pods
            .iter()
            .all(|p| p["spec"]["containers"][0]["image"] == "target-server:v2"));
    }

    #[test]
    fn deployment_with_mismatched_selector_is_rejected_with_422() {
        let store = Store::new();
        let mut d = deployment("web", 1, "x");
        d["spec"]["selector"]["matchLabels"]["app"] = json!("other");
        let e = store.create(Kind::Deployment, d).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .contains("selector` does not match template `labels`"),
            "{}",
            e.message
        );
    }

    #[test]
    fn job_runs_pods_until_completions_and_then_is_complete() {
        let store = Store::new();
        let j = store.create(Kind::Job, job("once", 2, 6)).unwrap();
        assert_eq!(
            j["spec"]["template"]["metadata"]["labels"]["job-name"],
            "once"
        );
        reconcile_all(&store);
        let pods = owned(&store, &j);
        assert_eq!(pods.len(), 1, "parallelism 1");
        assert_eq!(pods[0]["spec"]["restartPolicy"], "Never");
        set_pods(&store, &j, |p| p["status"]["phase"] = json!("Succeeded"));
        reconcile_all(&store);
        let j1 = store.get(Kind::Job, Some("default"), "once").unwrap();
        assert_eq!(
            (&j1["status"]["succeeded"], &j1["status"]["active"]),
            (&json!(1), &json!(1))
        );
        set_pods(&store, &j, |p| p["status"]["phase"] = json!("Succeeded"));
        reconcile_all(&store);
        let j2 = store.get(Kind::Job, Some("default"), "once").unwrap();
        assert_eq!(j2["status"]["succeeded"], 2);
        assert_eq!(cond(&j2, "Complete")["status"], "True");
        assert!(j2["status"]["completionTime"].is_string());
        reconcile_all(&store);
        assert_eq!(owned(&store, &j).len(), 2, "no pod after completion");
        assert_eq!(
            crate::api::table::job_cells(&j2, crate::api::now())[1],
            "Complete"
        );
    }

    #[test]
    fn job_fails_after_backoff_limit_failures() {
        let store = Store::new();
        let j = store.create(Kind::Job, job("flaky", 1, 1)).unwrap();
        for _ in 0..2 {
            reconcile_all(&store);
            let j = store.get(Kind::Job, Some("default"), "flaky").unwrap();
            assert!(cond(&j, "Failed").is_null());
            set_pods(&store, &j, |p| {
                if p["status"]["phase"] == "Pending" {
                    p["status"]["phase"] = json!("Failed")
                }
            });
        }
        reconcile_all(&store);
        let j2 = store.get(Kind::Job, Some("default"), "flaky").unwrap();
        assert_eq!(j2["status"]["failed"], 2);
        assert_eq!(cond(&j2, "Failed")["reason"], "BackoffLimitExceeded");
        reconcile_all(&store);
        assert_eq!(owned(&store, &j).len(), 2, "no retry after failing");
    }

    #[test]
    fn job_with_restart_policy_always_is_rejected() {
        let store = Store::new();
        let mut j = job("bad", 1, 1);
        j["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
        let e = store.create(Kind::Job, j).unwrap_err();
        assert_eq!(e.code, 422);
    }
}
