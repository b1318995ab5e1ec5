//! Checking the RESOURCE of `testbed api deny|allow` the way RBAC names resources: the
//! lower-case plural (`pods`, the NAME column of `kubectl api-resources`), a
//! subresource as `PLURAL/SUB` (`pods/log`, `pods/proxy`, `deployments/scale`), or `*`
//! (`*/scale` for a subresource of every resource). RBAC matches these strings exactly,
//! so `pod` or `po` would match no request at all: they are rejected with the plural
//! to use instead. Resources not in the built-in table (custom resources) are accepted
//! when they look like a resource name (lower-case DNS label).

/// A built-in Kubernetes resource: its plural (the RBAC name), singular, short names and
/// subresources (as `kubectl api-resources` and the API discovery documents list them,
/// Kubernetes v1.36).
struct Known {
    plural: &'static str,
    singular: &'static str,
    short: &'static [&'static str],
    subresources: &'static [&'static str],
}

const fn k(
    plural: &'static str,
    singular: &'static str,
    short: &'static [&'static str],
    subresources: &'static [&'static str],
) -> Known {
    Known {
        plural,
        singular,
        short,
        subresources,
    }
}

const KNOWN: &[Known] = &[
    k(
        "pods",
        "pod",
        &["po"],
        &[
            "attach",
            "binding",
            "ephemeralcontainers",
            "eviction",
            "exec",
            "log",
            "portforward",
            "proxy",
            "resize",
            "status",
        ],
    ),
    k("services", "service", &["svc"], &["proxy", "status"]),
    k("endpoints", "endpoints", &["ep"], &[]),
    k("endpointslices", "endpointslice", &[], &[]),
    k("nodes", "node", &["no"], &["proxy", "status"]),
    k("namespaces", "namespace", &["ns"], &["finalize", "status"]),
    k("configmaps", "configmap", &["cm"], &[]),
    k("secrets", "secret", &[], &[]),
    k("serviceaccounts", "serviceaccount", &["sa"], &["token"]),
    k("events", "event", &["ev"], &[]),
    k(
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        &["pvc"],
        &["status"],
    ),
    k(
        "persistentvolumes",
        "persistentvolume",
        &["pv"],
        &["status"],
    ),
    k(
        "replicationcontrollers",
        "replicationcontroller",
        &["rc"],
        &["scale", "status"],
    ),
    k("resourcequotas", "resourcequota", &["quota"], &["status"]),
    k("limitranges", "limitrange", &["limits"], &[]),
    k("podtemplates", "podtemplate", &[], &[]),
    k("bindings", "binding", &[], &[]),
    k("componentstatuses", "componentstatus", &["cs"], &[]),
    k(
        "deployments",
        "deployment",
        &["deploy"],
        &["scale", "status"],
    ),
    k("replicasets", "replicaset", &["rs"], &["scale", "status"]),
    k(
        "statefulsets",
        "statefulset",
        &["sts"],
        &["scale", "status"],
    ),
    k("daemonsets", "daemonset", &["ds"], &["status"]),
    k("controllerrevisions", "controllerrevision", &[], &[]),
    k("jobs", "job", &[], &["status"]),
    k("cronjobs", "cronjob", &["cj"], &["status"]),
    k(
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        &["hpa"],
        &["status"],
    ),
    k(
        "poddisruptionbudgets",
        "poddisruptionbudget",
        &["pdb"],
        &["status"],
    ),
    k("leases", "lease", &[], &[]),
    k("ingresses", "ingress", &["ing"], &["status"]),
    k("ingressclasses", "ingressclass", &[], &[]),
    k("networkpolicies", "networkpolicy", &["netpol"], &[]),
    k("ipaddresses", "ipaddress", &["ip"], &[]),
    k("servicecidrs", "servicecidr", &[], &["status"]),
    k("roles", "role", &[], &[]),
    k("rolebindings", "rolebinding", &[], &[]),
    k("clusterroles", "clusterrole", &[], &[]),
    k("clusterrolebindings", "clusterrolebinding", &[], &[]),
    k(
        "customresourcedefinitions",
        "customresourcedefinition",
        &["crd", "crds"],
        &["status"],
    ),
    k("apiservices", "apiservice", &[], &["status"]),
    k("tokenreviews", "tokenreview", &[], &[]),
    k("subjectaccessreviews", "subjectaccessreview", &[], &[]),
    k(
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        &[],
        &[],
    ),
    k(
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        &[],
        &[],
    ),
    k(
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        &[],
        &[],
    ),
    k("selfsubjectreviews", "selfsubjectreview", &[], &[]),
    k(
        "certificatesigningrequests",
        "certificatesigningrequest",
        &["csr"],
        &["approval", "status"],
    ),
    k("storageclasses", "storageclass", &["sc"], &[]),
    k("volumeattachments", "volumeattachment", &[], &["status"]),
    k("csidrivers", "csidriver", &[], &[]),
    k("csinodes", "csinode", &[], &[]),
    k("csistoragecapacities", "csistoragecapacity", &[], &[]),
    k("priorityclasses", "priorityclass", &["pc"], &[]),
    k("runtimeclasses", "runtimeclass", &[], &[]),
    k("flowschemas", "flowschema", &[], &["status"]),
    k(
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
        &[],
        &["status"],
    ),
    k(
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        &[],
        &[],
    ),
    k(
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        &[],
        &[],
    ),
    k(
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        &[],
        &["status"],
    ),
    k(
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        &[],
        &[],
    ),
    k(
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicy",
        &[],
        &[],
    ),
    k(
        "mutatingadmissionpolicybindings",
        "mutatingadmissionpolicybinding",
        &[],
        &[],
    ),
];

/// Whether `s` is a lower-case DNS label (what resource names are: `[a-z0-9-]`, at most
/// 63 characters, starting and ending alphanumeric).
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The built-in resource `name` names as its plural, singular or a short name
/// (case-insensitively), if any.
fn lookup(name: &str) -> Option<&'static Known> {
    let l = name.to_ascii_lowercase();
    KNOWN
        .iter()
        .find(|k| k.plural == l || k.singular == l || k.short.contains(&l.as_str()))
}

/// Checks `resource` as RBAC names resources (module docs). Ok for `pods`, `pods/log`,
/// `*`, `*/scale`, `widgets` (a custom resource). Errors (one line, naming what to use
/// instead): a singular or short name (`pod` → `pods`, `po` → `pods`), upper case,
/// an unknown subresource of a built-in resource (`pods/logs` → the list), more than
/// one `/`, an empty part, characters RBAC names never have.
pub fn check_resource(resource: &str) -> Result<(), String> {
    let (base, sub) = match resource.split_once('/') {
        Some((b, s)) => (b, Some(s)),
        None => (resource, None),
    };
    if sub.is_some_and(|s| s.contains('/')) {
        return Err(format!(
            "resource {resource:?}: at most one `/` (RESOURCE or RESOURCE/SUBRESOURCE, e.g. pods/log)"
        ));
    }
    let shown = |plural: &str| match sub {
        Some(s) => format!("{plural}/{s}"),
        None => plural.to_owned(),
    };
    if base != "*" {
        match lookup(base) {
            Some(k) if k.plural != base => {
                return Err(format!(
                    "resource {resource:?}: RBAC names resources by their lower-case plural (the NAME column of `kubectl api-resources`); use {:?}",
                    shown(k.plural)
                ));
            }
            Some(_) => {}
            None if !is_label(base) => {
                return Err(format!(
                    "resource {resource:?}: {base:?} is not a resource name (lower-case plural like pods, deployments; or *)"
                ));
            }
            None => {}
        }
    }
    if let Some(s) = sub {
        if s.is_empty() || !is_label(s) {
            return Err(format!(
                "resource {resource:?}: {s:?} is not a subresource name (e.g. pods/log, pods/proxy, deployments/scale)"
            ));
        }
        if let Some(k) = lookup(base).filter(|_| base != "*") {
            if !k.subresources.contains(&s) {
                let list = if k.subresources.is_empty() {
                    "none".to_owned()
                } else {
                    k.subresources
                        .iter()
                        .map(|x| format!("{}/{x}", k.plural))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(format!(
                    "resource {resource:?}: {} has no subresource {s:?} (its subresources: {list})",
                    k.plural
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_subresources_stars_and_custom_resources_pass() {
        for ok in [
            "pods",
            "pods/log",
            "pods/proxy",
            "deployments/scale",
            "*",
            "*/scale",
            "endpoints",
            "leases",
            "widgets",
            "serviceaccounts/token",
        ] {
            assert_eq!(check_resource(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn singular_and_short_names_are_rejected_with_the_plural() {
        let e = check_resource("pod").unwrap_err();
        assert!(e.contains("\"pods\""), "{e}");
        let e = check_resource("po").unwrap_err();
        assert!(e.contains("\"pods\""), "{e}");
        let e = check_resource("deploy").unwrap_err();
        assert!(e.contains("\"deployments\""), "{e}");
        let e = check_resource("pod/log").unwrap_err();
        assert!(e.contains("\"pods/log\""), "{e}");
        let e = check_resource("Pods").unwrap_err();
        assert!(e.contains("\"pods\""), "{e}");
        let e = check_resource("svc").unwrap_err();
        assert!(e.contains("\"services\""), "{e}");
    }

    #[test]
    fn bad_subresources_and_shapes_are_rejected() {
        let e = check_resource("pods/logs").unwrap_err();
        assert!(e.contains("pods/log,"), "{e}");
        assert!(check_resource("configmaps/status").is_err());
        assert!(check_resource("pods/log/x").is_err());
        assert!(check_resource("pods/").is_err());
        assert!(check_resource("").is_err());
        assert!(check_resource("Widgets").is_err());
        assert!(check_resource("pods.v1").is_err());
    }
}
