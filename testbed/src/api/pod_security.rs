//! Pod Security admission (k8s.io/pod-security-admission), enforce mode only, for the
//! checks the testbed's users meet: a namespace labelled
//! `pod-security.kubernetes.io/enforce=baseline|restricted` (version from
//! `…/enforce-version`, default `latest`) rejects a pod create that violates the level
//! with 403 Forbidden and kube-apiserver's message:
//! `pods "NAME" is forbidden: violates PodSecurity "restricted:latest": REASON (DETAIL), …`.
//!
//! Checks (texts from the package's `policy/check_*.go`, order as kube-apiserver v1.36
//! answered here: baseline checks by ID, then restricted ones by ID; a restricted check
//! replaces the baseline check of the same field):
//! - baseline: `capabilities_baseline` ("non-default capabilities"), `hostNamespaces`
//!   ("host namespaces"), `privileged`, `seccompProfile_baseline` (no `Unconfined`);
//! - restricted: `allowPrivilegeEscalation`, `capabilities_restricted` ("unrestricted
//!   capabilities"), `runAsNonRoot`, `runAsUser` (no 0), `seccompProfile_restricted`.
//!
//! Not checked (allowed): hostPath volumes, host ports, AppArmor, SELinux, `/proc`
//! mount, sysctls, volume types, Windows host process; warn/audit modes; exemptions.

use serde_json::Value;

/// The namespace label choosing the enforced level.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// The namespace label choosing the policy version (`latest` when absent).
pub const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";

/// Capabilities the baseline level lets a container add (`check_capabilities_baseline.go`).
const BASELINE_CAPS: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        .collect()
}

fn cname(c: &Value) -> String {
    c["name"].as_str().unwrap_or_default().to_owned()
}

fn join_quote(items: &[String]) -> String {
    items
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn containers_word(n: usize) -> &'static str {
    if n == 1 {
        "container"
    } else {
        "containers"
    }
}

/// `container "a"` / `containers "a", "b"`.
fn named(list: &[String]) -> String {
    format!("{} {}", containers_word(list.len()), join_quote(list))
}

/// `pod`, `container "x"`, `pod and containers "x", "y"`.
fn setters(pod: bool, list: &[String]) -> String {
    let mut parts = vec![];
    if pod {
        parts.push("pod".to_owned());
    }
    if !list.is_empty() {
        parts.push(named(list));
    }
    parts.join(" and ")
}

fn sorted_set(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

fn caps(c: &Value, key: &str) -> Vec<String> {
    c["securityContext"]["capabilities"][key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn capabilities_baseline(spec: &Value) -> Option<(&'static str, String)> {
    let mut bad = vec![];
    let mut which = vec![];
    for c in containers(spec) {
        let added: Vec<String> = caps(c, "add")
            .into_iter()
            .filter(|a| !BASELINE_CAPS.contains(&a.as_str()))
            .collect();
        if !added.is_empty() {
            bad.push(cname(c));
            which.extend(added);
        }
    }
    (!bad.is_empty()).then(|| {
        (
            "non-default capabilities",
            format!(
                "{} must not include {} in securityContext.capabilities.add",
                named(&bad),
                join_quote(&sorted_set(which))
            ),
        )
    })
}

fn host_namespaces(spec: &Value) -> Option<(&'static str, String)> {
    let set: Vec<String> = ["hostIPC", "hostNetwork", "hostPID"]
        .iter()
        .filter(|k| spec[**k] == true)
        .map(|k| format!("{k}=true"))
        .collect();
    (!set.is_empty()).then(|| ("host namespaces", set.join(", ")))
}

fn privileged(spec: &Value) -> Option<(&'static str, String)> {
    let bad: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| c["securityContext"]["privileged"] == true)
        .map(cname)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            "privileged",
            format!(
                "{} must not set securityContext.privileged=true",
                named(&bad)
            ),
        )
    })
}

/// Explicitly bad `seccompProfile.type` setters (pod, containers) and their values.
fn seccomp_explicit(spec: &Value, ok: &dyn Fn(&str) -> bool) -> Option<(&'static str, String)> {
    let ty = |v: &Value| {
        v["securityContext"]["seccompProfile"]["type"]
            .as_str()
            .map(str::to_owned)
    };
    let mut values = vec![];
    let pod_bad = match ty(spec) {
        Some(t) if !ok(&t) => {
            values.push(t);
            true
        }
        _ => false,
    };
    let mut bad = vec![];
    for c in containers(spec) {
        if let Some(t) = ty(c).filter(|t| !ok(t)) {
            bad.push(cname(c));
            values.push(t);
        }
    }
    (pod_bad || !bad.is_empty()).then(|| {
        (
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters(pod_bad, &bad),
                join_quote(&sorted_set(values))
            ),
        )
    })
}

fn seccomp_baseline(spec: &Value) -> Option<(&'static str, String)> {
    seccomp_explicit(spec, &|t| t != "Unconfined")
}

fn allow_privilege_escalation(spec: &Value) -> Option<(&'static str, String)> {
    let bad: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| c["securityContext"]["allowPrivilegeEscalation"] != false)
        .map(cname)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            "allowPrivilegeEscalation != false",
            format!(
                "{} must set securityContext.allowPrivilegeEscalation=false",
                named(&bad)
            ),
        )
    })
}

fn capabilities_restricted(spec: &Value) -> Option<(&'static str, String)> {
    let mut missing = vec![];
    let mut adding = vec![];
    let mut which = vec![];
    for c in containers(spec) {
        if !caps(c, "drop").iter().any(|d| d == "ALL") {
            missing.push(cname(c));
        }
        let added: Vec<String> = caps(c, "add")
            .into_iter()
            .filter(|a| a != "NET_BIND_SERVICE")
            .collect();
        if !added.is_empty() {
            adding.push(cname(c));
            which.extend(added);
        }
    }
    let mut details = vec![];
    if !missing.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            named(&missing)
        ));
    }
    if !adding.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            named(&adding),
            join_quote(&sorted_set(which))
        ));
    }
    (!details.is_empty()).then(|| ("unrestricted capabilities", details.join("; ")))
}

fn run_as_non_root(spec: &Value) -> Option<(&'static str, String)> {
    let pod_v = &spec["securityContext"]["runAsNonRoot"];
    let pod_bad = *pod_v == false;
    let pod_true = *pod_v == true;
    let mut explicit = vec![];
    let mut implicit = vec![];
    for c in containers(spec) {
        match &c["securityContext"]["runAsNonRoot"] {
            Value::Bool(false) => explicit.push(cname(c)),
            Value::Bool(true) => {}
            _ if !pod_true => implicit.push(cname(c)),
            _ => {}
        }
    }
    const REASON: &str = "runAsNonRoot != true";
    if pod_bad || !explicit.is_empty() {
        return Some((
            REASON,
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters(pod_bad, &explicit)
            ),
        ));
    }
    (!implicit.is_empty()).then(|| {
        (
            REASON,
            format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                named(&implicit)
            ),
        )
    })
}

fn run_as_user(spec: &Value) -> Option<(&'static str, String)> {
    let pod_bad = spec["securityContext"]["runAsUser"].as_i64() == Some(0);
    let bad: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| c["securityContext"]["runAsUser"].as_i64() == Some(0))
        .map(cname)
        .collect();
    (pod_bad || !bad.is_empty()).then(|| {
        (
            "runAsUser=0",
            format!("{} must not set runAsUser=0", setters(pod_bad, &bad)),
        )
    })
}

fn seccomp_restricted(spec: &Value) -> Option<(&'static str, String)> {
    let ok = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    if let Some(v) = seccomp_explicit(spec, &ok) {
        return Some(v);
    }
    let pod_set = spec["securityContext"]["seccompProfile"].is_object();
    let implicit: Vec<String> = containers(spec)
        .into_iter()
        .filter(|c| !c["securityContext"]["seccompProfile"].is_object() && !pod_set)
        .map(cname)
        .collect();
    (!implicit.is_empty()).then(|| {
        (
            "seccompProfile",
            format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                named(&implicit)
            ),
        )
    })
}

type Check = fn(&Value) -> Option<(&'static str, String)>;

/// The violations of `pod` (the object being created) under the level its namespace's
/// `labels` enforce, as `"LEVEL:VERSION"` and `REASON (DETAIL)` items; `None` when the
/// namespace enforces nothing (no label, or `privileged`) or the pod passes. An
/// unknown level value is enforced as `restricted` (the plugin fails closed).
pub fn violations(ns_labels: &Value, pod: &Value) -> Option<(String, Vec<String>)> {
    let level = ns_labels[ENFORCE_LABEL].as_str()?;
    let restricted = match level {
        "privileged" => return None,
        "baseline" => false,
        _ => true,
    };
    let version = ns_labels[ENFORCE_VERSION_LABEL]
        .as_str()
        .unwrap_or("latest");
    let spec = &pod["spec"];
    let mut checks: Vec<Check> = vec![];
    if !restricted {
        checks.push(capabilities_baseline);
    }
    checks.push(host_namespaces);
    checks.push(privileged);
    if restricted {
        checks.extend([
            allow_privilege_escalation as Check,
            capabilities_restricted,
            run_as_non_root,
            run_as_user,
            seccomp_restricted,
        ]);
    } else {
        checks.push(seccomp_baseline);
    }
    let found: Vec<String> = checks
        .iter()
        .filter_map(|c| c(spec))
        .map(|(reason, detail)| format!("{reason} ({detail})"))
        .collect();
    let shown = if restricted { "restricted" } else { "baseline" };
    (!found.is_empty()).then(|| (format!("{shown}:{version}"), found))
}

/// The Forbidden text after `pods "NAME" is forbidden: `.
pub fn message(policy: &str, found: &[String]) -> String {
    format!("violates PodSecurity {policy:?}: {}", found.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn restricted() -> Value {
        json!({ ENFORCE_LABEL: "restricted" })
    }

    #[test]
    fn a_plain_pod_violates_restricted_as_kube_apiserver_says() {
        let pod = json!({"spec": {"containers": [{"name": "x", "image": "i"}]}});
        let (policy, found) = violations(&restricted(), &pod).unwrap();
        assert_eq!(
            message(&policy, &found),
            "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"x\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"x\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"x\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"x\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
        assert!(violations(&json!({ ENFORCE_LABEL: "baseline" }), &pod).is_none());
        assert!(violations(&json!({}), &pod).is_none());
    }

    #[test]
    fn every_check_words_as_kube_apiserver_v1_36() {
        // The texts kube-apiserver v1.36.3 answered for this pod (checked on this
        // machine with `testbed up --control-plane real`).
        let pod = json!({"spec": {
        "hostNetwork": true, "hostPID": true,
        "securityContext": {"runAsUser": 0, "runAsNonRoot": false},
        "containers": [
            {"name": "cx", "securityContext": {"privileged": true, "runAsUser": 0}},
            {"name": "cy", "securityContext": {"allowPrivilegeEscalation": true,
                "capabilities": {"drop": ["NET_RAW"], "add": ["NET_ADMIN", "SYS_TIME"]},
                "seccompProfile": {"type": "Unconfined"}}},
        ]}});
        let (policy, found) = violations(&restricted(), &pod).unwrap();
        assert_eq!(
            message(&policy, &found),
            "violates PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true, hostPID=true), privileged (container \"cx\" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (containers \"cx\", \"cy\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (containers \"cx\", \"cy\" must set securityContext.capabilities.drop=[\"ALL\"]; container \"cy\" must not include \"NET_ADMIN\", \"SYS_TIME\" in securityContext.capabilities.add), runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false), runAsUser=0 (pod and container \"cx\" must not set runAsUser=0), seccompProfile (container \"cy\" must not set securityContext.seccompProfile.type to \"Unconfined\")"
        );
        let (policy, found) = violations(&json!({ ENFORCE_LABEL: "baseline" }), &pod).unwrap();
        assert_eq!(
            message(&policy, &found),
            "violates PodSecurity \"baseline:latest\": non-default capabilities (container \"cy\" must not include \"NET_ADMIN\", \"SYS_TIME\" in securityContext.capabilities.add), host namespaces (hostNetwork=true, hostPID=true), privileged (container \"cx\" must not set securityContext.privileged=true), seccompProfile (container \"cy\" must not set securityContext.seccompProfile.type to \"Unconfined\")"
        );
    }

    #[test]
    fn a_restricted_pod_passes() {
        let pod = json!({"spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}});
        assert!(violations(&restricted(), &pod).is_none());
    }
}
