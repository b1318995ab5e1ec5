//! The testbed scheduler: binds pending Pods to Nodes (docs/design.md §5 "Scheduler").
//!
//! Filters, in the order of kube-scheduler's default profile (k8s.io/kubernetes
//! `pkg/scheduler/framework/plugins`): `NodeUnschedulable` (cordon, unless the Pod
//! tolerates `node.kubernetes.io/unschedulable:NoSchedule`), `NodeName`,
//! `TaintToleration` (NoSchedule/NoExecute taints; a NotReady node counts as tainted
//! `node.kubernetes.io/not-ready:NoSchedule`, as the node lifecycle controller would
//! taint it), `NodeAffinity` (`spec.nodeSelector` and required node affinity with
//! `In`/`NotIn`/`Exists`/`DoesNotExist`/`Gt`/`Lt` on labels and `matchFields` on
//! `metadata.name`). The first failing filter names the node's reason, and the message
//! of an unschedulable Pod is built like `FitError.Error()` in
//! `pkg/scheduler/framework/types.go`. Among feasible nodes the one with the fewest
//! non-terminated Pods wins (ties by name).

use crate::api::{rfc3339_now, ApiError, Kind, Store, WatchEventType};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

/// `spec.schedulerName` this scheduler serves.
pub const SCHEDULER_NAME: &str = "default-scheduler";

/// Outcome of [`place`] for one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Bind to this node.
    Node(String),
    /// No node fits; the `PodScheduled=False` message, e.g. `0/3 nodes are available:
    /// 1 node(s) were unschedulable, 2 node(s) didn't match Pod's node
    /// affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not
    /// helpful for scheduling.`
    Unschedulable(String),
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn tolerates(pod: &Value, key: &str, value: &str, effect: &str) -> bool {
    pod["spec"]["tolerations"].as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            let t_effect = s(&t["effect"]);
            if !t_effect.is_empty() && t_effect != effect {
                return false;
            }
            let t_key = s(&t["key"]);
            let op = match s(&t["operator"]) {
                "" => "Equal",
                o => o,
            };
            if t_key.is_empty() {
                return op == "Exists";
            }
            if t_key != key {
                return false;
            }
            match op {
                "Exists" => true,
                "Equal" => s(&t["value"]) == value,
                _ => false,
            }
        })
    })
}

fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn match_expression(expr: &Value, value_of: impl Fn(&str) -> Option<String>) -> bool {
    let key = s(&expr["key"]);
    let values: Vec<&str> = expr["values"]
        .as_array()
        .map(|vs| vs.iter().map(s).collect())
        .unwrap_or_default();
    let got = value_of(key);
    match s(&expr["operator"]) {
        "In" => got.is_some_and(|g| values.contains(&g.as_str())),
        "NotIn" => got.is_none_or(|g| !values.contains(&g.as_str())),
        "Exists" => got.is_some(),
        "DoesNotExist" => got.is_none(),
        "Gt" | "Lt" => {
            let (Some(g), Some(v)) = (
                got.and_then(|g| g.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if s(&expr["operator"]) == "Gt" {
                g > v
            } else {
                g < v
            }
        }
        _ => false,
    }
}

/// Whether `node` satisfies the Pod's `spec.nodeSelector` and required node affinity
/// (terms are ORed; expressions and fields inside a term are ANDed; an empty term list
/// matches nothing, as in `nodeaffinity.go`).
pub fn matches_affinity(pod: &Value, node: &Value) -> bool {
    let labels = &node["metadata"]["labels"];
    if let Some(sel) = pod["spec"]["nodeSelector"].as_object() {
        if !sel
            .iter()
            .all(|(k, v)| labels[k.as_str()].as_str() == v.as_str())
        {
            return false;
        }
    }
    let required =
        &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if required.is_null() {
        return true;
    }
    let terms = required["nodeSelectorTerms"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    terms.iter().any(|term| {
        let exprs = term["matchExpressions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let fields = term["matchFields"].as_array().cloned().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        exprs
            .iter()
            .all(|e| match_expression(e, |k| labels[k].as_str().map(str::to_string)))
            && fields.iter().all(|e| {
                match_expression(e, |k| {
                    (k == "metadata.name").then(|| s(&node["metadata"]["name"]).to_string())
                })
            })
    })
}

/// Why `node` cannot take `pod` (kube-scheduler's reason text), or `None` if it fits.
pub fn filter(pod: &Value, node: &Value) -> Option<String> {
    if node["spec"]["unschedulable"] == true
        && !tolerates(pod, "node.kubernetes.io/unschedulable", "", "NoSchedule")
    {
        return Some("node(s) were unschedulable".into());
    }
    let mut taints: Vec<(String, String, String)> = node["spec"]["taints"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    (
                        s(&t["key"]).to_string(),
                        s(&t["value"]).to_string(),
                        s(&t["effect"]).to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    if !node_ready(node) && !taints.iter().any(|t| t.0 == "node.kubernetes.io/not-ready") {
        taints.push((
            "node.kubernetes.io/not-ready".into(),
            String::new(),
            "NoSchedule".into(),
        ));
    }
    for (key, value, effect) in &taints {
        if (effect == "NoSchedule" || effect == "NoExecute") && !tolerates(pod, key, value, effect)
        {
            return Some(format!("node(s) had untolerated taint {{{key}: {value}}}"));
        }
    }
    if !matches_affinity(pod, node) {
        return Some("node(s) didn't match Pod's node affinity/selector".into());
    }
    None
}

/// The unschedulable message for `total` nodes and reason counts
/// (`FitError.Error()`: "0/N nodes are available: " + sorted "count reason" joined by
/// ", " + "." + the preemption post-filter message).
pub fn unschedulable_message(total: usize, reasons: &BTreeMap<String, usize>) -> String {
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    let mut msg = format!("0/{total} nodes are available:");
    if !parts.is_empty() {
        msg.push(' ');
        msg.push_str(&parts.join(", "));
    }
    msg.push('.');
    msg.push_str(&format!(
        " preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling."
    ));
    msg
}

/// Pure placement: which of `nodes` takes `pod`. `load` gives the number of
/// non-terminated Pods per node name (fewest wins; ties by name).
pub fn place(pod: &Value, nodes: &[Value], load: &BTreeMap<String, usize>) -> Placement {
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut best: Option<(usize, String)> = None;
    for node in nodes {
        match filter(pod, node) {
            Some(r) => *reasons.entry(r).or_default() += 1,
            None => {
                let name = s(&node["metadata"]["name"]).to_string();
                let l = load.get(&name).copied().unwrap_or(0);
                if best.as_ref().is_none_or(|b| (l, &name) < (b.0, &b.1)) {
                    best = Some((l, name));
                }
            }
        }
    }
    match best {
        Some((_, n)) => Placement::Node(n),
        None => Placement::Unschedulable(unschedulable_message(nodes.len(), &reasons)),
    }
}

fn pending(pod: &Value) -> bool {
    s(&pod["spec"]["nodeName"]).is_empty()
        && pod["metadata"]["deletionTimestamp"].is_null()
        && matches!(s(&pod["spec"]["schedulerName"]), "" | SCHEDULER_NAME)
        && !matches!(s(&pod["status"]["phase"]), "Succeeded" | "Failed")
}

fn set_condition(pod: &mut Value, status: &str, reason: Option<&str>, message: Option<&str>) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let conds = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let prev = conds.iter().find(|c| c["type"] == "PodScheduled").cloned();
    let transition = match &prev {
        Some(p) if p["status"] == status => p["lastTransitionTime"].clone(),
        _ => json!(rfc3339_now()),
    };
    let mut c = json!({"type": "PodScheduled", "status": status, "lastProbeTime": null, "lastTransitionTime": transition});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    if let Some(m) = message {
        c["message"] = json!(m);
    }
    let mut conds: Vec<Value> = conds
        .into_iter()
        .filter(|c| c["type"] != "PodScheduled")
        .collect();
    conds.insert(0, c);
    pod["status"]["conditions"] = Value::Array(conds);
}

fn record_event(store: &Store, pod: &Value, ty: &str, reason: &str, message: &str) {
    let ns = s(&pod["metadata"]["namespace"]);
    let name = s(&pod["metadata"]["name"]);
    let now = rfc3339_now();
    let suffix: u64 = rand::random();
    let _ = store.create(
        Kind::Event,
        json!({
            "metadata": {"name": format!("{name}.{suffix:016x}"), "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": name,
                "uid": pod["metadata"]["uid"], "apiVersion": "v1",
                "resourceVersion": pod["metadata"]["resourceVersion"]},
            "reason": reason, "message": message, "type": ty,
            "source": {"component": SCHEDULER_NAME},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": SCHEDULER_NAME, "reportingInstance": SCHEDULER_NAME,
        }),
    );
}

/// One scheduling pass over every pending Pod: binds what fits (`spec.nodeName`,
/// `PodScheduled=True`, a `Scheduled` Event) and marks the rest `PodScheduled=False`,
/// reason `Unschedulable` (plus a `FailedScheduling` Event when the message changes).
/// Returns the number of Pods bound.
pub fn schedule_once(store: &Store) -> usize {
    let (nodes, _) = store.list(Kind::Node, None);
    let (pods, _) = store.list(Kind::Pod, None);
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for p in &pods {
        let n = s(&p["spec"]["nodeName"]);
        if !n.is_empty() && !matches!(s(&p["status"]["phase"]), "Succeeded" | "Failed") {
            *load.entry(n.to_string()).or_default() += 1;
        }
    }
    let mut bound = 0;
    for pod in pods.iter().filter(|p| pending(p)) {
        let ns = s(&pod["metadata"]["namespace"]);
        let name = s(&pod["metadata"]["name"]);
        let uid = s(&pod["metadata"]["uid"]).to_string();
        match place(pod, &nodes, &load) {
            Placement::Node(node) => {
                let res = store.modify(Kind::Pod, Some(ns), name, |p| {
                    if s(&p["metadata"]["uid"]) != uid || !pending(p) {
                        return Err(ApiError::conflict(Kind::Pod, name, "pod changed"));
                    }
                    p["spec"]["nodeName"] = json!(node);
                    set_condition(p, "True", None, None);
                    Ok(())
                });
                if let Ok(p) = res {
                    *load.entry(node.clone()).or_default() += 1;
                    bound += 1;
                    record_event(
                        store,
                        &p,
                        "Normal",
                        "Scheduled",
                        &format!("Successfully assigned {ns}/{name} to {node}"),
                    );
                    tracing::debug!(pod = %format!("{ns}/{name}"), %node, "bound");
                }
            }
            Placement::Unschedulable(msg) => {
                let before = pod["status"]["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled"))
                    .map(|c| s(&c["message"]).to_string());
                let res = store.modify(Kind::Pod, Some(ns), name, |p| {
                    if s(&p["metadata"]["uid"]) != uid || !pending(p) {
                        return Err(ApiError::conflict(Kind::Pod, name, "pod changed"));
                    }
                    set_condition(p, "False", Some("Unschedulable"), Some(&msg));
                    Ok(())
                });
                if let Ok(p) = res {
                    if before.as_deref() != Some(msg.as_str()) {
                        record_event(store, &p, "Warning", "FailedScheduling", &msg);
                    }
                }
            }
        }
    }
    bound
}

fn relevant(ev: &crate::api::StoreEvent) -> bool {
    match ev.kind {
        Kind::Node => true,
        Kind::Pod => match ev.ty {
            // A freed node can take a pending pod.
            WatchEventType::Deleted => true,
            _ => pending(&ev.object),
        },
        _ => false,
    }
}

/// Runs the scheduler until the store's event channel closes: a pass at start, then
/// after every relevant change (a pending Pod added/changed, any Node change, a Pod
/// deleted), and every 30 s as a safety net.
pub async fn run(store: Arc<Store>) {
    let mut rx = store.subscribe();
    loop {
        schedule_once(&store);
        loop {
            match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
                Ok(Ok(ev)) if relevant(&ev) => break,
                Ok(Ok(_)) => continue,
                Ok(Err(RecvError::Lagged(_))) => break,
                Ok(Err(RecvError::Closed)) => return,
                Err(_) => break,
            }
        }
        // Coalesce bursts (a probe creates a few pods at once).
        while let Ok(ev) = rx.try_recv() {
            let _ = ev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ready: bool) -> Value {
        json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
               "spec": {},
               "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    fn hostname_affinity(p: &mut Value, op: &str, host: &str) {
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": op, "values": [host]}]}]}}});
    }

    #[test]
    fn hostname_affinity_pins_the_node() {
        let nodes = vec![
            node("node-1", true),
            node("node-2", true),
            node("node-3", true),
        ];
        let mut p = pod();
        hostname_affinity(&mut p, "In", "node-2");
        assert_eq!(
            place(&p, &nodes, &BTreeMap::new()),
            Placement::Node("node-2".into())
        );
        hostname_affinity(&mut p, "NotIn", "node-1");
        let load = BTreeMap::from([("node-2".to_string(), 3)]);
        assert_eq!(place(&p, &nodes, &load), Placement::Node("node-3".into()));
    }

    #[test]
    fn match_fields_on_metadata_name_and_node_selector_apply() {
        let nodes = vec![node("node-1", true), node("node-2", true)];
        let mut p = pod();
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}]}}});
        assert_eq!(
            place(&p, &nodes, &BTreeMap::new()),
            Placement::Node("node-2".into())
        );
        let mut q = pod();
        q["spec"]["nodeSelector"] = json!({"kubernetes.io/os": "windows"});
        assert!(matches!(
            place(&q, &nodes, &BTreeMap::new()),
            Placement::Unschedulable(_)
        ));
    }

    #[test]
    fn cordoned_node_is_skipped_and_message_counts_reasons() {
        let mut n1 = node("node-1", true);
        n1["spec"]["unschedulable"] = json!(true);
        let nodes = vec![n1, node("node-2", true), node("node-3", true)];
        let mut p = pod();
        hostname_affinity(&mut p, "In", "node-1");
        assert_eq!(
            place(&p, &nodes, &BTreeMap::new()),
            Placement::Unschedulable(
                "0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.".into()
            )
        );
        let free = pod();
        assert_eq!(
            place(&free, &nodes, &BTreeMap::new()),
            Placement::Node("node-2".into())
        );
    }

    #[test]
    fn taints_need_tolerations_and_not_ready_nodes_are_avoided() {
        let mut tainted = node("node-1", true);
        tainted["spec"]["taints"] =
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]);
        let nodes = vec![tainted, node("node-2", false)];
        let mut p = pod();
        match place(&p, &nodes, &BTreeMap::new()) {
            Placement::Unschedulable(m) => {
                assert!(
                    m.contains("1 node(s) had untolerated taint {dedicated: gpu}"),
                    "{m}"
                );
                assert!(
                    m.contains("1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }"),
                    "{m}"
                );
            }
            other => panic!("expected unschedulable, got {other:?}"),
        }
        p["spec"]["tolerations"] = json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]);
        assert_eq!(
            place(&p, &nodes, &BTreeMap::new()),
            Placement::Node("node-1".into())
        );
        let mut wildcard = pod();
        wildcard["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
        assert_eq!(
            place(&wildcard, &[node("node-2", false)], &BTreeMap::new()),
            Placement::Node("node-2".into())
        );
    }

    #[test]
    fn schedule_once_binds_and_marks_unschedulable_pods() {
        let store = Store::new();
        store.create(Kind::Node, node("node-1", true)).unwrap();
        let mut pinned = pod();
        pinned["metadata"]["name"] = json!("pinned");
        hostname_affinity(&mut pinned, "In", "node-9");
        store.create(Kind::Pod, pinned).unwrap();
        store.create(Kind::Pod, pod()).unwrap();
        assert_eq!(schedule_once(&store), 1);
        let p = store.get(Kind::Pod, Some("default"), "p").unwrap();
        assert_eq!(p["spec"]["nodeName"], "node-1");
        assert_eq!(p["status"]["conditions"][0]["type"], "PodScheduled");
        assert_eq!(p["status"]["conditions"][0]["status"], "True");
        let q = store.get(Kind::Pod, Some("default"), "pinned").unwrap();
        assert!(q["spec"]["nodeName"].is_null());
        let c = &q["status"]["conditions"][0];
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], "Unschedulable");
        assert!(s(&c["message"]).starts_with("0/1 nodes are available: 1 node(s) didn't match"));
        // A second pass changes nothing (no resourceVersion churn).
        let rv = store.current_rv();
        assert_eq!(schedule_once(&store), 0);
        assert_eq!(store.current_rv(), rv);
    }
}
