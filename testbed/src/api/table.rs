//! `meta.k8s.io/v1` Table responses for `kubectl get` (as kubectl 1.32 asks for them).
//!
//! Columns and cell rules are those of kube-apiserver's printers
//! (k8s.io/kubernetes `pkg/printers/internalversion/printers.go`: `printPod`,
//! `printNode`, `printNamespace`, `printEvent`, `printNetworkPolicy`, …), so kubectl
//! shows what it shows against a real cluster.

use super::Kind;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

fn col(name: &str, ty: &str, format: &str, description: &str, priority: u8) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
}

/// Column definitions of `kind` (all priorities; kubectl hides priority > 0 unless
/// `-o wide`).
pub fn columns(kind: Kind) -> Vec<Value> {
    let name = col("Name", "string", "name", "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names", 0);
    let age = col("Age", "string", "", "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata", 0);
    match kind {
        Kind::Pod => vec![
            name,
            col("Ready", "string", "", "The aggregate readiness state of this pod for accepting traffic.", 0),
            col("Status", "string", "", "The aggregate status of the containers in this pod.", 0),
            col("Restarts", "string", "", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.", 0),
            age,
            col("IP", "string", "", "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.", 1),
            col("Node", "string", "", "NodeName is a request to schedule this pod onto a specific node. If it is non-empty, the scheduler simply schedules this pod onto that node, assuming that it fits resource requirements.", 1),
            col("Nominated Node", "string", "", "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods.", 1),
            col("Readiness Gates", "string", "", "If specified, all readiness gates will be evaluated for pod readiness.", 1),
        ],
        Kind::Node => vec![
            name,
            col("Status", "string", "", "The status of the node", 0),
            col("Roles", "string", "", "The roles of the node", 0),
            age,
            col("Version", "string", "", "Kubelet Version reported by the node.", 0),
            col("Internal-IP", "string", "", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
            col("External-IP", "string", "", "List of addresses reachable to the node. Queried from cloud provider, if available.", 1),
            col("OS-Image", "string", "", "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).", 1),
            col("Kernel-Version", "string", "", "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).", 1),
            col("Container-Runtime", "string", "", "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).", 1),
        ],
        Kind::Namespace => vec![
            name,
            col("Status", "string", "", "The status of the namespace", 0),
            age,
        ],
        Kind::Event => vec![
            col("Last Seen", "string", "", "Time when this Event was last observed.", 0),
            col("Type", "string", "", "Type of this event (Normal, Warning), new types could be added in the future", 0),
            col("Reason", "string", "", "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.", 0),
            col("Object", "string", "", "The object that this event is about.", 0),
            col("Subobject", "string", "", "The subobject that this event is about.", 1),
            col("Source", "string", "", "The component reporting this event.", 1),
            col("Message", "string", "", "A human-readable description of the status of this operation.", 0),
            col("First Seen", "string", "", "The time at which the event was first recorded.", 1),
            col("Count", "string", "", "The number of times this event has occurred.", 1),
            col("Name", "string", "", "Name of the event.", 1),
        ],
        Kind::Deployment => vec![
            name,
            col("Ready", "string", "", "Number of the pod with ready state", 0),
            col("Up-to-date", "string", "", "Total number of non-terminated pods targeted by this deployment that have the desired template spec.", 0),
            col("Available", "string", "", "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.", 0),
            age,
            col("Containers", "string", "", "Names of each container in the template.", 1),
            col("Images", "string", "", "Images referenced by each container in the template.", 1),
            col("Selector", "string", "", "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.", 1),
        ],
        Kind::Job => vec![
            name,
            col("Status", "string", "", "Status of the job.", 0),
            col("Completions", "string", "", "The desired number of successfully finished pods the job should be run with.", 0),
            col("Duration", "string", "", "Time required to complete the job.", 0),
            age,
            col("Containers", "string", "", "Names of each container in the template.", 1),
            col("Images", "string", "", "Images referenced by each container in the template.", 1),
            col("Selector", "string", "", "A label query over pods that should match the pod count.", 1),
        ],
        Kind::Service => vec![
            name,
            col("Type", "string", "", "The type of the service.", 0),
            col("Cluster-IP", "string", "", "The cluster IP of the service.", 0),
            col("External-IP", "string", "", "The external IP of the service.", 0),
            col("Port(s)", "string", "", "The ports of the service.", 0),
            age,
            col("Selector", "string", "", "Route service traffic to pods with label keys and values matching this selector.", 1),
        ],
        Kind::NetworkPolicy => vec![
            name,
            col("Pod-Selector", "string", "", "podSelector selects the pods to which this NetworkPolicy object applies. The array of rules is applied to any pods selected by this field. An empty selector matches all pods in the policy's namespace. Multiple network policies can select the same set of pods. In this case, the ingress rules for each are combined additively. This field is optional. If it is not specified, it defaults to an empty selector.", 0),
            age,
        ],
        Kind::EndpointSlice => vec![
            name,
            col("AddressType", "string", "", "Type of address carried by this EndpointSlice.", 0),
            col("Ports", "string", "", "Ports exposed by this EndpointSlice.", 0),
            col("Endpoints", "string", "", "Endpoints in this EndpointSlice.", 0),
            age,
        ],
        _ => vec![name, age],
    }
}

/// Cells of a Service row (`printService`): Name, Type, Cluster-IP (`clusterIPs[0]`,
/// `<none>` when unset), External-IP (`externalIPs` plus load-balancer ingress;
/// `<pending>` for a LoadBalancer without ingress, `externalName` for ExternalName,
/// else `<none>`), Port(s) (`port[:nodePort]/PROTO` joined by `,`, `<none>` when
/// empty), Age, Selector (`k=v` joined by `,`, `<none>`).
pub fn service_cells(svc: &Value, now: Timestamp) -> Vec<Value> {
    let spec = &svc["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP");
    let cluster_ip = spec["clusterIPs"][0]
        .as_str()
        .or_else(|| spec["clusterIP"].as_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("<none>");
    let mut external: Vec<String> = spec["externalIPs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let ingress: Vec<String> = svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ip"].as_str().or_else(|| i["hostname"].as_str()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let external_ip = match ty {
        "ExternalName" => s(&spec["externalName"]).to_string(),
        "LoadBalancer" => {
            external.extend(ingress);
            if external.is_empty() {
                "<pending>".to_string()
            } else {
                external.join(",")
            }
        }
        _ if !external.is_empty() => external.join(","),
        _ => "<none>".to_string(),
    };
    let ports: Vec<String> = spec["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64() {
                Some(n) if n > 0 => format!("{}:{n}/{proto}", p["port"]),
                _ => format!("{}/{proto}", p["port"]),
            }
        })
        .collect();
    let selector: Vec<String> = spec["selector"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    vec![
        json!(s(&svc["metadata"]["name"])),
        json!(ty),
        json!(cluster_ip),
        json!(external_ip),
        json!(if ports.is_empty() {
            "<none>".to_string()
        } else {
            ports.join(",")
        }),
        json!(age(&svc["metadata"]["creationTimestamp"], now)),
        json!(if selector.is_empty() {
            "<none>".to_string()
        } else {
            selector.join(",")
        }),
    ]
}

/// Cells of an EndpointSlice row (`printEndpointSlice`): Name, AddressType, Ports
/// (port numbers joined by `,`; `<unset>` when none), Endpoints (the first 3 addresses
/// joined by `,` plus ` + N more...`; `<unset>` when none), Age.
pub fn endpoint_slice_cells(slice: &Value, now: Timestamp) -> Vec<Value> {
    let ports: Vec<String> = slice["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| match p["port"].as_i64() {
            Some(n) => n.to_string(),
            None => "<unset>".to_string(),
        })
        .collect();
    let addrs: Vec<&str> = slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|e| e["addresses"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let endpoints = if addrs.is_empty() {
        "<unset>".to_string()
    } else if addrs.len() > 3 {
        format!("{} + {} more...", addrs[..3].join(","), addrs.len() - 3)
    } else {
        addrs.join(",")
    };
    vec![
        json!(s(&slice["metadata"]["name"])),
        json!(s(&slice["addressType"])),
        json!(if ports.is_empty() {
            "<unset>".to_string()
        } else {
            ports.join(",")
        }),
        json!(endpoints),
        json!(age(&slice["metadata"]["creationTimestamp"], now)),
    ]
}

fn template_containers(obj: &Value) -> (String, String) {
    let cs = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = cs.iter().map(|c| s(&c["name"])).collect();
    let images: Vec<&str> = cs.iter().map(|c| s(&c["image"])).collect();
    (names.join(","), images.join(","))
}

/// `metav1.FormatLabelSelector`: `k=v` terms and expressions joined by commas,
/// `<none>` when empty.
fn selector_text(sel: &Value) -> String {
    let mut terms: Vec<String> = sel["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let vals: Vec<&str> = e["values"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let key = s(&e["key"]);
        terms.push(match s(&e["operator"]) {
            "In" => format!("{key} in ({})", vals.join(",")),
            "NotIn" => format!("{key} notin ({})", vals.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            op => format!("{key} {op} ({})", vals.join(",")),
        });
    }
    if terms.is_empty() {
        "<none>".into()
    } else {
        terms.join(",")
    }
}

/// Cells of a NetworkPolicy row (`printNetworkPolicy`): Name, Pod-Selector
/// (`metav1.FormatLabelSelector` of `spec.podSelector`: `k=v` terms and expressions
/// joined by `,`, `<none>` for the empty selector that selects every pod), Age.
pub fn network_policy_cells(np: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(s(&np["metadata"]["name"])),
        json!(selector_text(&np["spec"]["podSelector"])),
        json!(age(&np["metadata"]["creationTimestamp"], now)),
    ]
}

/// Cells of a Deployment row (printDeployment): Name, Ready (`ready/desired`),
/// Up-to-date, Available, Age, Containers, Images, Selector.
pub fn deployment_cells(d: &Value, now: Timestamp) -> Vec<Value> {
    let st = &d["status"];
    let n = |v: &Value| v.as_i64().unwrap_or(0);
    let (containers, images) = template_containers(d);
    vec![
        json!(s(&d["metadata"]["name"])),
        json!(format!(
            "{}/{}",
            n(&st["readyReplicas"]),
            n(&d["spec"]["replicas"])
        )),
        json!(n(&st["updatedReplicas"])),
        json!(n(&st["availableReplicas"])),
        json!(age(&d["metadata"]["creationTimestamp"], now)),
        json!(containers),
        json!(images),
        json!(selector_text(&d["spec"]["selector"])),
    ]
}

fn has_condition(obj: &Value, ty: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

/// Cells of a Job row (printJob, v1.32): Name, Status (Complete, Failed, Terminating,
/// Suspended, FailureTarget, SuccessCriteriaMet, else Running), Completions
/// (`succeeded/completions`), Duration (start to completion, or to now), Age,
/// Containers, Images, Selector.
pub fn job_cells(j: &Value, now: Timestamp) -> Vec<Value> {
    let st = &j["status"];
    let status = if has_condition(j, "Complete") {
        "Complete"
    } else if has_condition(j, "Failed") {
        "Failed"
    } else if j["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else if has_condition(j, "Suspended") {
        "Suspended"
    } else if has_condition(j, "FailureTarget") {
        "FailureTarget"
    } else if has_condition(j, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    };
    let succeeded = st["succeeded"].as_i64().unwrap_or(0);
    let completions = match j["spec"]["completions"].as_i64() {
        Some(c) => format!("{succeeded}/{c}"),
        None => {
            let p = j["spec"]["parallelism"].as_i64().unwrap_or(1);
            if p > 1 {
                format!("{succeeded}/1 of {p}")
            } else {
                format!("{succeeded}/1")
            }
        }
    };
    let parse = |v: &Value| v.as_str().and_then(|t| t.parse::<Timestamp>().ok());
    let duration = match (parse(&st["startTime"]), parse(&st["completionTime"])) {
        (None, _) => String::new(),
        (Some(a), None) => human_duration(now.as_second() - a.as_second()),
        (Some(a), Some(b)) => human_duration(b.as_second() - a.as_second()),
    };
    let (containers, images) = template_containers(j);
    vec![
        json!(s(&j["metadata"]["name"])),
        json!(status),
        json!(completions),
        json!(duration),
        json!(age(&j["metadata"]["creationTimestamp"], now)),
        json!(containers),
        json!(images),
        json!(selector_text(&j["spec"]["selector"])),
    ]
}

/// kubectl's `duration.HumanDuration` (k8s.io/apimachinery `pkg/util/duration`):
/// `45s`, `3m12s`, `15m`, `5h3m`, `2d4h`, `300d`, `3y10d`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Age of an RFC 3339 timestamp relative to `now`, as kubectl prints it; `<unknown>`
/// when absent or unparsable.
pub fn age(ts: &Value, now: Timestamp) -> String {
    match ts.as_str().and_then(|s| s.parse::<Timestamp>().ok()) {
        Some(t) => human_duration(now.as_second() - t.as_second()),
        None => "<unknown>".into(),
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.into()
    }
}

/// Cells of a Pod row: Name, Ready (`ready/total`), Status (printPod's reason logic:
/// phase, `status.reason`, a waiting/terminated container reason, `Completed`,
/// `Terminating` when deletionTimestamp is set), Restarts, Age, IP, Node,
/// Nominated Node, Readiness Gates.
pub fn pod_cells(pod: &Value, now: Timestamp) -> Vec<Value> {
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    let mut reason = s(&pod["status"]["phase"]).to_string();
    if !s(&pod["status"]["reason"]).is_empty() {
        reason = s(&pod["status"]["reason"]).to_string();
    }
    let conditions = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if let Some(c) = conditions.iter().find(|c| c["type"] == "PodScheduled") {
        if c["status"] == "False" && c["reason"] == "SchedulingGated" {
            reason = "SchedulingGated".into();
        }
    }
    let mut ready = 0;
    let mut restarts: i64 = 0;
    let mut last_restart: Option<Timestamp> = None;
    let mut initializing = false;
    let init_statuses = pod["status"]["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let n_init = pod["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    for (i, c) in init_statuses.iter().enumerate() {
        restarts += c["restartCount"].as_i64().unwrap_or(0);
        let term = &c["state"]["terminated"];
        if term.is_object() && term["exitCode"].as_i64() == Some(0) {
            continue;
        }
        initializing = true;
        if term.is_object() {
            reason = if !s(&term["reason"]).is_empty() {
                format!("Init:{}", s(&term["reason"]))
            } else if term["signal"].as_i64().unwrap_or(0) != 0 {
                format!("Init:Signal:{}", term["signal"])
            } else {
                format!("Init:ExitCode:{}", term["exitCode"])
            };
        } else if !s(&c["state"]["waiting"]["reason"]).is_empty()
            && s(&c["state"]["waiting"]["reason"]) != "PodInitializing"
        {
            reason = format!("Init:{}", s(&c["state"]["waiting"]["reason"]));
        } else {
            reason = format!("Init:{i}/{n_init}");
        }
        break;
    }
    if !initializing {
        let mut has_running = false;
        let statuses = pod["status"]["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for c in statuses.iter().rev() {
            restarts += c["restartCount"].as_i64().unwrap_or(0);
            if let Ok(t) = s(&c["lastState"]["terminated"]["finishedAt"]).parse::<Timestamp>() {
                if last_restart.is_none_or(|l| t > l) {
                    last_restart = Some(t);
                }
            }
            let waiting = &c["state"]["waiting"];
            let term = &c["state"]["terminated"];
            if !s(&waiting["reason"]).is_empty() {
                reason = s(&waiting["reason"]).to_string();
            } else if term.is_object() && !s(&term["reason"]).is_empty() {
                reason = s(&term["reason"]).to_string();
            } else if term.is_object() {
                reason = if term["signal"].as_i64().unwrap_or(0) != 0 {
                    format!("Signal:{}", term["signal"])
                } else {
                    format!("ExitCode:{}", term["exitCode"].as_i64().unwrap_or(0))
                };
            } else if c["ready"] == true && c["state"]["running"].is_object() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            reason = if pod_ready {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        reason = if s(&pod["status"]["reason"]) == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    let restarts_cell = match last_restart {
        Some(t) if restarts > 0 => format!(
            "{restarts} ({} ago)",
            human_duration(now.as_second() - t.as_second())
        ),
        _ => restarts.to_string(),
    };
    let ip = s(&pod["status"]["podIP"]);
    let gates = pod["spec"]["readinessGates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let gates_cell = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let true_count = gates
            .iter()
            .filter(|g| {
                conditions
                    .iter()
                    .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };
    vec![
        json!(s(&pod["metadata"]["name"])),
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_cell),
        json!(age(&pod["metadata"]["creationTimestamp"], now)),
        json!(or_none(ip)),
        json!(or_none(s(&pod["spec"]["nodeName"]))),
        json!(or_none(s(&pod["status"]["nominatedNodeName"]))),
        json!(gates_cell),
    ]
}

/// Cells of a Node row: Name, Status (`Ready`, `NotReady`, `Unknown`, plus
/// `,SchedulingDisabled` when cordoned), Roles (from `node-role.kubernetes.io/*` and
/// `kubernetes.io/role` labels), Age, Version, Internal-IP, External-IP, OS-Image,
/// Kernel-Version, Container-Runtime.
pub fn node_cells(node: &Value, now: Timestamp) -> Vec<Value> {
    let conditions = node["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut status: Vec<String> = Vec::new();
    match conditions.iter().find(|c| c["type"] == "Ready") {
        Some(c) if c["status"] == "True" => status.push("Ready".into()),
        Some(_) => status.push("NotReady".into()),
        None => status.push("Unknown".into()),
    }
    if node["spec"]["unschedulable"] == true {
        status.push("SchedulingDisabled".into());
    }
    let mut roles: Vec<String> = Vec::new();
    if let Some(labels) = node["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            if let Some(r) = k.strip_prefix("node-role.kubernetes.io/") {
                if !r.is_empty() {
                    roles.push(r.to_string());
                }
            } else if k == "kubernetes.io/role" && !s(v).is_empty() {
                roles.push(s(v).to_string());
            }
        }
    }
    roles.sort();
    roles.dedup();
    let addr = |ty: &str| {
        node["status"]["addresses"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["type"] == ty))
            .map(|x| s(&x["address"]).to_string())
            .unwrap_or_default()
    };
    let unknown = |v: &str| {
        if v.is_empty() {
            "<unknown>".to_string()
        } else {
            v.to_string()
        }
    };
    let info = &node["status"]["nodeInfo"];
    vec![
        json!(s(&node["metadata"]["name"])),
        json!(status.join(",")),
        json!(if roles.is_empty() {
            "<none>".to_string()
        } else {
            roles.join(",")
        }),
        json!(age(&node["metadata"]["creationTimestamp"], now)),
        json!(s(&info["kubeletVersion"])),
        json!(or_none(&addr("InternalIP"))),
        json!(or_none(&addr("ExternalIP"))),
        json!(unknown(s(&info["osImage"]))),
        json!(unknown(s(&info["kernelVersion"]))),
        json!(unknown(s(&info["containerRuntimeVersion"]))),
    ]
}

fn event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
    let first = if ev["firstTimestamp"].is_string() {
        &ev["firstTimestamp"]
    } else {
        &ev["eventTime"]
    };
    let last = if ev["lastTimestamp"].is_string() {
        &ev["lastTimestamp"]
    } else if ev["series"]["lastObservedTime"].is_string() {
        &ev["series"]["lastObservedTime"]
    } else {
        first
    };
    let io = &ev["involvedObject"];
    let source = {
        let c = s(&ev["source"]["component"]);
        let c = if c.is_empty() {
            s(&ev["reportingComponent"])
        } else {
            c
        };
        let h = s(&ev["source"]["host"]);
        if h.is_empty() {
            c.to_string()
        } else {
            format!("{c}, {h}")
        }
    };
    let count = ev["count"]
        .as_i64()
        .or_else(|| ev["series"]["count"].as_i64())
        .unwrap_or(1);
    vec![
        json!(age(last, now)),
        json!(s(&ev["type"])),
        json!(s(&ev["reason"])),
        json!(format!(
            "{}/{}",
            s(&io["kind"]).to_lowercase(),
            s(&io["name"])
        )),
        json!(s(&io["fieldPath"])),
        json!(source),
        json!(s(&ev["message"]).trim()),
        json!(age(first, now)),
        json!(count.to_string()),
        json!(s(&ev["metadata"]["name"])),
    ]
}

/// The cells of one row of `kind` for `obj`.
pub fn cells(kind: Kind, obj: &Value, now: Timestamp) -> Vec<Value> {
    match kind {
        Kind::Pod => pod_cells(obj, now),
        Kind::Node => node_cells(obj, now),
        Kind::Namespace => vec![
            json!(s(&obj["metadata"]["name"])),
            json!(s(&obj["status"]["phase"])),
            json!(age(&obj["metadata"]["creationTimestamp"], now)),
        ],
        Kind::Event => event_cells(obj, now),
        Kind::Deployment => deployment_cells(obj, now),
        Kind::Job => job_cells(obj, now),
        Kind::Service => service_cells(obj, now),
        Kind::EndpointSlice => endpoint_slice_cells(obj, now),
        Kind::NetworkPolicy => network_policy_cells(obj, now),
        _ => vec![
            json!(s(&obj["metadata"]["name"])),
            json!(age(&obj["metadata"]["creationTimestamp"], now)),
        ],
    }
}

/// A `PartialObjectMetadata` of `obj` (the default `rows[].object`; kubectl needs it
/// for the NAMESPACE column under `-A` and for `--show-labels`).
pub fn partial_metadata(obj: &Value) -> Value {
    let mut meta = obj["metadata"].clone();
    if let Some(m) = meta.as_object_mut() {
        m.remove("managedFields");
    }
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
}

/// A `meta.k8s.io/v1` Table of `objs` with list resourceVersion `rv`.
pub fn table<'a>(kind: Kind, objs: impl IntoIterator<Item = &'a Value>, rv: u64) -> Value {
    let now = crate::api::now();
    let rows: Vec<Value> = objs
        .into_iter()
        .map(|o| json!({"cells": cells(kind, o, now), "object": partial_metadata(o)}))
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns(kind),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_row_shows_type_cluster_ip_ports_and_selector() {
        let svc = json!({"metadata": {"name": "web", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"type": "NodePort", "clusterIP": "10.200.0.12", "clusterIPs": ["10.200.0.12"],
                "selector": {"app": "web"},
                "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}});
        let cells = service_cells(&svc, crate::api::now());
        assert_eq!(cells.len(), columns(Kind::Service).len());
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "NodePort");
        assert_eq!(cells[2], "10.200.0.12");
        assert_eq!(cells[3], "<none>");
        assert_eq!(cells[4], "80:30080/TCP,53/UDP");
        assert_eq!(cells[6], "app=web");
        let lb = json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "clusterIP": "None", "clusterIPs": ["None"]}});
        let cells = service_cells(&lb, crate::api::now());
        assert_eq!(
            (&cells[2], &cells[3], &cells[4]),
            (&json!("None"), &json!("<pending>"), &json!("<none>"))
        );
    }

    #[test]
    fn endpoint_slice_row_lists_ports_and_at_most_three_addresses() {
        let eps: Vec<Value> = (1..=5)
            .map(|i| json!({"addresses": [format!("10.0.0.{i}")]}))
            .collect();
        let sl = json!({"metadata": {"name": "web-abcde"}, "addressType": "IPv4",
            "ports": [{"name": "", "port": 8080, "protocol": "TCP"}], "endpoints": eps});
        let cells = endpoint_slice_cells(&sl, crate::api::now());
        assert_eq!(cells.len(), columns(Kind::EndpointSlice).len());
        assert_eq!(cells[2], "8080");
        assert_eq!(cells[3], "10.0.0.1,10.0.0.2,10.0.0.3 + 2 more...");
        let empty = json!({"metadata": {"name": "x"}, "addressType": "IPv4", "endpoints": []});
        let cells = endpoint_slice_cells(&empty, crate::api::now());
        assert_eq!(
            (&cells[2], &cells[3]),
            (&json!("<unset>"), &json!("<unset>"))
        );
    }

    #[test]
    fn network_policy_row_shows_the_pod_selector_or_none() {
        let np = json!({"metadata": {"name": "deny-all", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
        let cells = network_policy_cells(&np, crate::api::now());
        assert_eq!(cells.len(), columns(Kind::NetworkPolicy).len());
        assert_eq!(
            (&cells[0], &cells[1]),
            (&json!("deny-all"), &json!("<none>"))
        );
        let np = json!({"metadata": {"name": "web"}, "spec": {"podSelector": {
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}}});
        let cells = network_policy_cells(&np, crate::api::now());
        assert_eq!(cells[1], "app=web,tier notin (db)");
        assert_eq!(cells[2], "<unknown>");
    }

    #[test]
    fn human_duration_matches_kubectl_forms() {
        assert_eq!(human_duration(45), "45s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(192), "3m12s");
        assert_eq!(human_duration(900), "15m");
        assert_eq!(human_duration(5 * 3600 + 180), "5h3m");
        assert_eq!(human_duration(20 * 3600), "20h");
        assert_eq!(human_duration(52 * 3600), "2d4h");
        assert_eq!(human_duration(300 * 86400), "300d");
    }

    #[test]
    fn pod_status_column_follows_container_states() {
        let now = crate::api::now();
        let fixture: Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/k8s-pod-running-ready.json"
        ))
        .unwrap();
        let c = pod_cells(&fixture, now);
        assert_eq!(c[1], "1/1");
        assert_eq!(c[2], "Running");
        assert_eq!(c[5], "10.244.0.3");
        let mut pulling = fixture.clone();
        pulling["status"]["containerStatuses"][0]["ready"] = json!(false);
        pulling["status"]["containerStatuses"][0]["state"] =
            json!({"waiting": {"reason": "ErrImagePull"}});
        let c = pod_cells(&pulling, now);
        assert_eq!(c[1], "0/1");
        assert_eq!(c[2], "ErrImagePull");
        let mut deleting = fixture;
        deleting["metadata"]["deletionTimestamp"] = json!("2030-01-01T00:00:00Z");
        assert_eq!(pod_cells(&deleting, now)[2], "Terminating");
        let pending = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}});
        let c = pod_cells(&pending, now);
        assert_eq!(c[2], "Pending");
        assert_eq!(c[5], "<none>");
        assert_eq!(c[6], "<none>");
    }

    #[test]
    fn node_status_shows_scheduling_disabled_when_cordoned() {
        let now = crate::api::now();
        let mut node: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/k8s-node-ready.json")).unwrap();
        assert_eq!(node_cells(&node, now)[1], "Ready");
        assert_eq!(node_cells(&node, now)[2], "control-plane,master");
        node["spec"]["unschedulable"] = json!(true);
        assert_eq!(node_cells(&node, now)[1], "Ready,SchedulingDisabled");
        assert_eq!(node_cells(&node, now)[5], "172.18.0.2");
    }
}
