//! Admission rejections of probe objects, told apart from RBAC (pure).
//!
//! The API server authorizes a request (RBAC) before admission runs. A `403` whose
//! `Status.message` has the authorizer's shape — `pods is forbidden: User "U" cannot
//! create resource "pods" in API group "" in the namespace "NS"` (apiserver
//! `responsewriters.forbiddenMessage`) — is RBAC: the gate stops (exit 2), as before.
//! Any other `403` on a create came from an admission plugin or webhook, which judged
//! the object itself: [`classify`] names the policy, and the probe ends
//! `inconclusive`/`admission_rejected` with the API's message (which lists the
//! offending fields). The messages recognised (kube-apiserver):
//!
//! | policy | message |
//! |---|---|
//! | `PodSecurity "restricted:latest"` | `pods "P" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (…), …` |
//! | `ResourceQuota "Q"` | `pods "P" is forbidden: exceeded quota: Q, requested: …, used: …, limited: …` |
//! | `Priority` | `pods "P" is forbidden: no PriorityClass with name X was found` |
//! | `ServiceAccount` | `pods "P" is forbidden: error looking up service account NS/default: serviceaccount "default" not found` (transient: the namespace is new, [`is_service_account_pending`]) |
//! | `LimitRanger` | `pods "P" is forbidden: [maximum memory usage per Container is …]` |
//! | `admission webhook "W"` | `admission webhook "W" denied the request: …` (any code the webhook chose, 400/403/422) |
//! | `ValidatingAdmissionPolicy 'V'` | `… is forbidden: ValidatingAdmissionPolicy 'V' with binding 'B' denied request: …` (403 or 422) |
//! | `NamespaceLifecycle` | `404`: `namespaces "NS" not found` (the probe namespace does not exist) |
//!
//! Any other non-RBAC `403` is reported with the policy `admission`.

/// An admission rejection: which policy, and what the API server said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The policy, e.g. `PodSecurity "restricted:latest"`, `ResourceQuota "pods"`.
    pub policy: String,
    /// The part of `Status.message` that names the fields/limits (after the policy
    /// prefix when there is one), else the whole message.
    pub detail: String,
}

impl Rejection {
    /// One line for records and logs: `rejected by admission (POLICY) creating WHAT:
    /// DETAIL`, plus what to do for the policies where the fix is known.
    pub fn text(&self, what: &str) -> String {
        let hint = if self.policy.starts_with("PodSecurity") {
            "; the probe pod spec passes `restricted` unless changed: check the namespace's \
             pod-security.kubernetes.io labels and any mutating webhook"
        } else if self.policy.starts_with("ResourceQuota") {
            "; probe pods request cpu 10m and memory 16Mi (limit 64Mi) each: raise the quota \
             or lower --concurrency / --burst-size"
        } else if self.policy == "Priority" {
            "; create the PriorityClass or fix --priority-class"
        } else if self.policy == "NamespaceLifecycle" {
            "; create the namespace (kubectl create namespace NS) or pick another --namespace"
        } else {
            ""
        };
        format!(
            "rejected by admission ({}) creating {what}: {}{hint}",
            self.policy, self.detail
        )
    }
}

/// Whether `message` has the shape of an RBAC (authorizer) denial: `User "…" cannot …`.
pub fn is_rbac_denial(message: &str) -> bool {
    message.contains("User \"") && message.contains("\" cannot ")
}

/// The admission [`Rejection`] in an API error answer (`code`, `Status.message`) to a
/// create, or `None` when it is not one (RBAC, authentication `401`, validation `422`
/// of our own spec, server errors).
pub fn classify(code: u16, message: &str) -> Option<Rejection> {
    let after = |needle: &str| message.find(needle).map(|i| &message[i + needle.len()..]);
    let quoted_name = |rest: &str, q: char| -> Option<String> {
        let rest = rest.strip_prefix(q)?;
        rest.find(q).map(|end| rest[..end].to_string())
    };
    if let Some(rest) = after("admission webhook ") {
        if let Some(name) = quoted_name(rest, '"') {
            let detail = after("denied the request: ").unwrap_or(message).to_string();
            return Some(Rejection {
                policy: format!("admission webhook \"{name}\""),
                detail,
            });
        }
    }
    if let Some(rest) = after("ValidatingAdmissionPolicy ") {
        if let Some(name) = quoted_name(rest, '\'') {
            let detail = after("denied request: ").unwrap_or(message).to_string();
            return Some(Rejection {
                policy: format!("ValidatingAdmissionPolicy '{name}'"),
                detail,
            });
        }
    }
    if code == 404 {
        // NamespaceLifecycle: `namespaces "NS" not found`.
        return (message.starts_with("namespaces \"") && message.ends_with("not found")).then(
            || Rejection {
                policy: "NamespaceLifecycle".into(),
                detail: message.to_string(),
            },
        );
    }
    if code != 403 || is_rbac_denial(message) {
        return None;
    }
    if let Some(rest) = after("violates PodSecurity ") {
        if let Some(level) = quoted_name(rest, '"') {
            let detail = rest.split_once(": ").map_or(rest, |(_, d)| d).to_string();
            return Some(Rejection {
                policy: format!("PodSecurity \"{level}\""),
                detail,
            });
        }
    }
    if let Some(rest) = after("exceeded quota: ") {
        let name = rest.split(',').next().unwrap_or(rest).trim();
        return Some(Rejection {
            policy: format!("ResourceQuota \"{name}\""),
            detail: format!("exceeded quota: {rest}"),
        });
    }
    let detail = message
        .split_once(" is forbidden: ")
        .map_or(message, |(_, d)| d)
        .to_string();
    let policy = if message.contains("no PriorityClass with name") {
        "Priority"
    } else if is_service_account_pending(code, message) {
        "ServiceAccount"
    } else if message.contains("usage per Container is")
        || message.contains("usage per Pod is")
        || message.contains("limit to request ratio")
    {
        "LimitRanger"
    } else {
        "admission"
    };
    Some(Rejection {
        policy: policy.into(),
        detail,
    })
}

/// Whether the answer is the ServiceAccount admission plugin's "the namespace's
/// ServiceAccount does not exist yet" (`403`, `error looking up service account NS/SA:
/// serviceaccount "SA" not found`): in a namespace created moments ago the
/// controller-manager has not created `default` yet, so the create is retried briefly
/// (the probe's `SERVICE_ACCOUNT_WAIT`).
pub fn is_service_account_pending(code: u16, message: &str) -> bool {
    code == 403 && message.contains("error looking up service account")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_security_rejection_names_the_level_and_the_fields() {
        let m = "pods \"fp-ab-0-t\" is forbidden: violates PodSecurity \"restricted:latest\": \
                 privileged (container \"target-server\" must not set \
                 securityContext.privileged=true), allowPrivilegeEscalation != false \
                 (container \"target-server\" must set \
                 securityContext.allowPrivilegeEscalation=false)";
        let r = classify(403, m).expect("admission");
        assert_eq!(r.policy, "PodSecurity \"restricted:latest\"");
        assert!(
            r.detail.starts_with("privileged (container"),
            "{}",
            r.detail
        );
        assert!(r
            .detail
            .contains("securityContext.allowPrivilegeEscalation=false"));
        let t = r.text("pod firstpacket/fp-ab-0-t");
        assert!(
            t.starts_with("rejected by admission (PodSecurity \"restricted:latest\") creating pod firstpacket/fp-ab-0-t: privileged"),
            "{t}"
        );
        assert!(!t.contains("RBAC"), "{t}");
    }

    #[test]
    fn rbac_denials_and_other_codes_are_not_admission() {
        let rbac = "pods is forbidden: User \"system:serviceaccount:fp:prober\" cannot create \
                    resource \"pods\" in API group \"\" in the namespace \"firstpacket\"";
        assert!(is_rbac_denial(rbac));
        assert_eq!(classify(403, rbac), None);
        assert_eq!(classify(401, "Unauthorized"), None);
        assert_eq!(
            classify(
                422,
                "Pod \"x\" is invalid: spec.containers[0].image: Required value"
            ),
            None
        );
        assert_eq!(classify(500, "etcdserver: request timed out"), None);
        assert_eq!(classify(404, "pods \"x\" not found"), None);
    }

    #[test]
    fn quota_priority_service_account_limit_range_and_namespace_are_named() {
        let q = classify(
            403,
            "pods \"p\" is forbidden: exceeded quota: compute, requested: pods=1, used: \
             pods=10, limited: pods=10",
        )
        .expect("quota");
        assert_eq!(q.policy, "ResourceQuota \"compute\"");
        assert!(q.detail.contains("limited: pods=10"));
        let p = classify(
            403,
            "pods \"p\" is forbidden: no PriorityClass with name high was found",
        )
        .expect("priority");
        assert_eq!(p.policy, "Priority");
        assert_eq!(p.detail, "no PriorityClass with name high was found");
        let sa = "pods \"p\" is forbidden: error looking up service account fp/default: \
                  serviceaccount \"default\" not found";
        assert!(is_service_account_pending(403, sa));
        assert_eq!(classify(403, sa).expect("sa").policy, "ServiceAccount");
        let lr = classify(
            403,
            "pods \"p\" is forbidden: [maximum memory usage per Container is 32Mi, but limit is 64Mi]",
        )
        .expect("limitrange");
        assert_eq!(lr.policy, "LimitRanger");
        let ns = classify(404, "namespaces \"fp\" not found").expect("namespace");
        assert_eq!(ns.policy, "NamespaceLifecycle");
        assert!(ns.text("pod fp/p").contains("kubectl create namespace"));
        let other = classify(403, "pods \"p\" is forbidden: some plugin said no").expect("x");
        assert_eq!(
            (other.policy.as_str(), other.detail.as_str()),
            ("admission", "some plugin said no")
        );
    }

    #[test]
    fn webhooks_and_admission_policies_are_named_whatever_their_code() {
        let w = classify(
            400,
            "admission webhook \"validation.gatekeeper.sh\" denied the request: [psp-caps] \
             container must drop ALL",
        )
        .expect("webhook");
        assert_eq!(w.policy, "admission webhook \"validation.gatekeeper.sh\"");
        assert_eq!(w.detail, "[psp-caps] container must drop ALL");
        let v = classify(
            422,
            "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'no-root' with binding \
             'no-root-b' denied request: failed expression: x",
        )
        .expect("vap");
        assert_eq!(v.policy, "ValidatingAdmissionPolicy 'no-root'");
        assert_eq!(v.detail, "failed expression: x");
    }
}
