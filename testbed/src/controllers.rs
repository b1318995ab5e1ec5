//! Minimal controllers over the [`Store`], so manifests can be applied to the testbed
//! as users apply them to a cluster: apps/v1 Deployment, batch/v1 Job, and the
//! EndpointSlice controller (discovery.k8s.io/v1 slices for selector Services, which the
//! service dataplane of [`crate::services`] programs).
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
//! - One EndpointSlice per Service (the real controller splits at 100 endpoints,
//!   `--max-endpoints-per-slice`, and by port set); a Pod whose named `targetPort`
//!   resolves differently from the first Pod's is left out instead of getting a slice of
//!   its own.
//!
//! Every reconcile is a full pass over all Deployments, Jobs and Services (cheap at
//! testbed size), triggered by any store event and by a 1 s resync.
//! Writes with no change are no-ops in the store, so a pass that finds nothing to do
//! writes nothing.

use crate::api::{rfc3339_now, ApiError, Kind, Store};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// Interval of the full resync (also catches Job `activeDeadlineSeconds`).
pub const RESYNC: Duration = Duration::from_secs(1);

/// Label naming an EndpointSlice's Service (discovery.k8s.io/v1 `LabelServiceName`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Label naming the controller that manages an EndpointSlice
/// (discovery.k8s.io/v1 `LabelManagedBy`).
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";

/// Value of [`MANAGED_BY_LABEL`] on slices of the EndpointSlice controller
/// (k8s.io/kubernetes `pkg/controller/endpointslice` `ControllerName`).
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// Runs the Deployment, Job and EndpointSlice controllers until the store's event
/// channel closes.
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

/// Name of the ConfigMap holding the cluster CA in every namespace (the real
/// controller-manager's root-ca-cert-publisher).
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// The serviceaccount and root-ca-cert-publisher controllers of the built-in control
/// plane: every active namespace gets the `default` ServiceAccount and the
/// [`ROOT_CA_CONFIGMAP`] ConfigMap (`data["ca.crt"]` = `ca_pem`), re-created when
/// deleted. Runs until the store's event channel closes.
pub async fn run_namespace_publishers(store: Arc<Store>, ca_pem: String) {
    let mut rx = store.subscribe();
    loop {
        for ns in store.list(Kind::Namespace, None).0 {
            if ns["status"]["phase"] == "Terminating" {
                continue;
            }
            let Some(n) = ns["metadata"]["name"].as_str() else {
                continue;
            };
            if store.get(Kind::ServiceAccount, Some(n), "default").is_err() {
                let _ = store.create(
                    Kind::ServiceAccount,
                    json!({"apiVersion": "v1", "kind": "ServiceAccount",
                           "metadata": {"name": "default", "namespace": n}}),
                );
            }
            if store
                .get(Kind::ConfigMap, Some(n), ROOT_CA_CONFIGMAP)
                .is_err()
            {
                let _ = store.create(
                    Kind::ConfigMap,
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": n,
                                        "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                           "data": {"ca.crt": ca_pem}}),
                );
            }
        }
        loop {
            match rx.recv().await {
                Ok(ev)
                    if matches!(
                        ev.kind,
                        Kind::Namespace | Kind::ServiceAccount | Kind::ConfigMap
                    ) =>
                {
                    break
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => return,
            }
        }
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
    for svc in store.list(Kind::Service, None).0 {
        if let Err(e) = reconcile_endpoint_slice(store, &svc) {
            tracing::debug!(error = %e, service = name(&svc), "endpointslice reconcile");
        }
    }
}

/// Whether `pod`'s labels contain every `key: value` of a Service's `spec.selector`.
fn selects(selector: &serde_json::Map<String, Value>, pod: &Value) -> bool {
    selector
        .iter()
        .all(|(k, v)| pod["metadata"]["labels"][k.as_str()] == *v)
}

/// The container port a Service port's `targetPort` names in `pod` (a number as is; a
/// name looked up in the containers' `ports[].name` with the Service port's protocol).
fn resolve_target_port(pod: &Value, svc_port: &Value) -> Option<i64> {
    let tp = &svc_port["targetPort"];
    if let Some(n) = tp.as_i64() {
        return Some(n);
    }
    let want = tp.as_str()?;
    let proto = svc_port["protocol"].as_str().unwrap_or("TCP");
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| {
            p["name"].as_str() == Some(want) && p["protocol"].as_str().unwrap_or("TCP") == proto
        })
        .and_then(|p| p["containerPort"].as_i64())
}

/// The slice content (`endpoints`, `ports`) for Service `svc` from `pods`: every Pod the
/// selector matches that has a `status.podIP` and is not Succeeded/Failed, as
/// `{addresses: [podIP], conditions: {ready, serving, terminating}, nodeName,
/// targetRef}` sorted by Pod name. `ready` = the Pod's Ready condition and not
/// terminating; `serving` = the Ready condition; `terminating` = a deletionTimestamp
/// (k8s.io/endpointslice `podToEndpoint`, terminating endpoints published since
/// v1.26). Ports are the Service's ports with `port` = the resolved targetPort and the
/// Service port's `name` (`""` when unnamed) and `protocol`.
pub fn endpoint_slice_content(svc: &Value, pods: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let svc_ports: Vec<Value> = svc["spec"]["ports"].as_array().cloned().unwrap_or_default();
    let Some(selector) = svc["spec"]["selector"].as_object() else {
        return (Vec::new(), Vec::new());
    };
    let mut matching: Vec<&Value> = pods
        .iter()
        .filter(|p| selects(selector, p))
        .filter(|p| !p["status"]["podIP"].as_str().unwrap_or("").is_empty())
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    matching.sort_by(|a, b| name(a).cmp(name(b)));
    let mut slice_ports: Option<Vec<Option<i64>>> = None;
    let mut endpoints = Vec::new();
    for p in matching {
        let resolved: Vec<Option<i64>> = svc_ports
            .iter()
            .map(|sp| resolve_target_port(p, sp))
            .collect();
        if resolved.iter().any(Option::is_none) {
            continue;
        }
        match &slice_ports {
            None => slice_ports = Some(resolved),
            Some(first) if *first != resolved => continue,
            Some(_) => {}
        }
        let terminating = deleting(p);
        let ready = is_ready(p);
        let mut ep = json!({
            "addresses": [p["status"]["podIP"].clone()],
            "conditions": {"ready": ready && !terminating, "serving": ready, "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": ns(p), "name": name(p), "uid": uid(p)},
        });
        if let Some(node) = p["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            ep["nodeName"] = json!(node);
        }
        endpoints.push(ep);
    }
    let ports = match slice_ports {
        Some(resolved) => svc_ports
            .iter()
            .zip(resolved)
            .map(|(sp, port)| {
                let mut p = json!({"name": sp["name"].as_str().unwrap_or(""),
                    "protocol": sp["protocol"].as_str().unwrap_or("TCP"), "port": port});
                if let Some(ap) = sp["appProtocol"].as_str() {
                    p["appProtocol"] = json!(ap);
                }
                p
            })
            .collect(),
        None => Vec::new(),
    };
    (endpoints, ports)
}

/// One Service: keeps exactly one EndpointSlice (`generateName: <service>-`, labels
/// [`SERVICE_NAME_LABEL`] = the Service name, [`MANAGED_BY_LABEL`] = [`MANAGED_BY`] plus
/// the Service's own labels and `service.kubernetes.io/headless` for headless ones, a
/// controller ownerReference to the Service, `addressType: IPv4`) holding
/// [`endpoint_slice_content`]. Services without a selector are left alone (their
/// slices are the user's). Extra managed slices are deleted. An unchanged slice is not
/// written. Errors: store errors.
pub fn reconcile_endpoint_slice(store: &Store, svc: &Value) -> Result<(), ApiError> {
    if deleting(svc) || !svc["spec"]["selector"].is_object() {
        return Ok(());
    }
    if svc["spec"]["type"] == "ExternalName" {
        return Ok(());
    }
    let namespace = ns(svc).to_string();
    let svc_name = name(svc).to_string();
    let (pods, _) = store.list(Kind::Pod, Some(&namespace));
    let (endpoints, ports) = endpoint_slice_content(svc, &pods);
    let mut labels = svc["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[SERVICE_NAME_LABEL] = json!(svc_name);
    labels[MANAGED_BY_LABEL] = json!(MANAGED_BY);
    if svc["spec"]["clusterIP"] == "None" {
        labels["service.kubernetes.io/headless"] = json!("");
    }
    let (slices, _) = store.list(Kind::EndpointSlice, Some(&namespace));
    let mut mine: Vec<&Value> = slices
        .iter()
        .filter(|s| {
            s["metadata"]["labels"][SERVICE_NAME_LABEL] == json!(svc_name)
                && s["metadata"]["labels"][MANAGED_BY_LABEL] == json!(MANAGED_BY)
                && owned_by(s, uid(svc))
                && !deleting(s)
        })
        .collect();
    mine.sort_by(|a, b| name(a).cmp(name(b)));
    match mine.split_first() {
        None => {
            let slice = json!({
                "apiVersion": Kind::EndpointSlice.api_version(), "kind": "EndpointSlice",
                "metadata": {"generateName": format!("{svc_name}-"), "namespace": namespace,
                    "labels": labels, "ownerReferences": [owner_ref(svc, Kind::Service)]},
                "addressType": "IPv4", "endpoints": endpoints, "ports": ports,
            });
            store.create(Kind::EndpointSlice, slice)?;
        }
        Some((keep, extra)) => {
            for x in extra {
                let _ = store.delete(Kind::EndpointSlice, Some(&namespace), name(x), None, None);
            }
            store.modify(Kind::EndpointSlice, Some(&namespace), name(keep), |s| {
                s["metadata"]["labels"] = labels;
                s["addressType"] = json!("IPv4");
                s["endpoints"] = json!(endpoints);
                s["ports"] = json!(ports);
                Ok(())
            })?;
        }
    }
    Ok(())
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

    fn service(name: &str, selector: Value) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "labels": {"team": "net"}},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}})
    }

    fn web_pod(store: &Store, name: &str, app: &str, ip: &str, ready: bool) {
        store
            .create(Kind::Pod, json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
                "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "target-server",
                    "ports": [{"name": "web", "containerPort": 8080}]}]}}))
            .unwrap();
        store
            .modify(Kind::Pod, Some("default"), name, |p| {
                p["status"]["phase"] = json!("Running");
                p["status"]["podIP"] = json!(ip);
                p["status"]["conditions"] =
                    json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
                Ok(())
            })
            .unwrap();
    }

    fn slices_of(store: &Store, svc: &str) -> Vec<Value> {
        store
            .list(Kind::EndpointSlice, Some("default"))
            .0
            .into_iter()
            .filter(|s| s["metadata"]["labels"][SERVICE_NAME_LABEL] == svc)
            .collect()
    }

    #[test]
    fn endpoint_slice_follows_selected_pods_and_their_readiness() {
        let store = Store::new();
        let svc = store
            .create(Kind::Service, service("web", json!({"app": "web"})))
            .unwrap();
        reconcile_all(&store);
        let sl = slices_of(&store, "web");
        assert_eq!(sl.len(), 1, "a slice exists even with no endpoints");
        assert!(name(&sl[0]).starts_with("web-"));
        assert_eq!(sl[0]["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(sl[0]["metadata"]["labels"]["team"], "net");
        assert_eq!(
            sl[0]["metadata"]["ownerReferences"][0]["uid"],
            json!(uid(&svc))
        );
        assert_eq!(sl[0]["endpoints"], json!([]));
        assert_eq!(sl[0]["addressType"], "IPv4");

        web_pod(&store, "a", "web", "10.7.1.2", false);
        web_pod(&store, "b", "web", "10.7.2.2", true);
        web_pod(&store, "other", "db", "10.7.2.3", true);
        reconcile_all(&store);
        let sl = slices_of(&store, "web");
        assert_eq!(sl.len(), 1);
        let eps = sl[0]["endpoints"].as_array().unwrap();
        assert_eq!(
            eps.len(),
            2,
            "not-ready pods are listed, other apps are not"
        );
        assert_eq!(eps[0]["targetRef"]["name"], "a");
        assert_eq!(eps[0]["conditions"]["ready"], false);
        assert_eq!(eps[1]["addresses"], json!(["10.7.2.2"]));
        assert_eq!(eps[1]["conditions"]["ready"], true);
        assert_eq!(eps[1]["nodeName"], "node-1");
        assert_eq!(
            sl[0]["ports"],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            "the named targetPort resolves to the container port"
        );
        // A stable state writes nothing.
        let rv = store.current_rv();
        reconcile_all(&store);
        assert_eq!(store.current_rv(), rv);

        // Deleting a bound pod marks its endpoint terminating and not ready.
        store
            .delete(Kind::Pod, Some("default"), "b", None, None)
            .unwrap();
        reconcile_all(&store);
        let sl = slices_of(&store, "web");
        let b = &sl[0]["endpoints"][1];
        assert_eq!(
            b["conditions"],
            json!({"ready": false, "serving": true, "terminating": true})
        );
        let b_uid = store.get(Kind::Pod, Some("default"), "b").unwrap()["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_string();
        store
            .remove(Kind::Pod, Some("default"), "b", &b_uid)
            .unwrap();
        reconcile_all(&store);
        assert_eq!(
            slices_of(&store, "web")[0]["endpoints"]
                .as_array()
                .unwrap()
                .len(),
            1
        );

        // Deleting the Service removes its slice (ownerReference GC).
        store
            .delete(Kind::Service, Some("default"), "web", None, None)
            .unwrap();
        assert!(slices_of(&store, "web").is_empty());
    }

    #[test]
    fn services_without_a_selector_get_no_managed_slice() {
        let store = Store::new();
        let mut s = service("manual", json!(null));
        s["spec"].as_object_mut().unwrap().remove("selector");
        store.create(Kind::Service, s).unwrap();
        reconcile_all(&store);
        assert!(slices_of(&store, "manual").is_empty());
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
