//! The authorization webhook the testbed serves for the real kube-apiserver
//! (`testbed api deny|allow` on `--control-plane real`).
//!
//! kube-apiserver's `--authorization-config` puts this webhook FIRST in its chain
//! (before Node and RBAC), with `failurePolicy: NoOpinion` and both decision caches
//! off, so a deny takes effect at the next request for every identity (except
//! `system:masters`, which kube-apiserver authorizes before any configured
//! authorizer). For each request it POSTs an `authorization.k8s.io/v1`
//! `SubjectAccessReview`; the answer is
//! `{"allowed":false,"denied":true,"reason":…}` when a deny rule matches the request's
//! verb, resource (`RESOURCE` or `RESOURCE/SUBRESOURCE`, API group ignored) and
//! namespace, otherwise `{"allowed":false}` ("no opinion": RBAC decides). Users marked
//! with [`DenyList::spare`] (the testbed's node components) are denied only by rules
//! added with `everyone` (`testbed api deny … --nodes-too`), as on the built-in API
//! server.

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Deny rules `(verb, resource, namespace)`; `*` matches any verb or resource, a rule
/// without namespace matches every namespace and cluster-scoped requests, a rule with
/// one matches only requests in that namespace (RoleBinding-like reach). Same semantics
/// as the built-in API server's `Store::deny_in`.
#[derive(Debug, Default)]
pub struct DenyList {
    /// Rule → whether it reaches the spared users too.
    rules: Mutex<std::collections::BTreeMap<RuleKey, bool>>,
    spared: Mutex<BTreeSet<String>>,
}

impl DenyList {
    /// Adds a rule (not for the spared users).
    pub fn deny(&self, verb: &str, resource: &str, namespace: Option<&str>) {
        self.lock()
            .entry(key(verb, resource, namespace))
            .or_insert(false);
    }

    /// Adds a rule that reaches the spared users too.
    pub fn deny_everyone(&self, verb: &str, resource: &str, namespace: Option<&str>) {
        self.lock().insert(key(verb, resource, namespace), true);
    }

    /// Rules added with [`DenyList::deny`] leave `user` alone.
    pub fn spare(&self, user: &str) {
        self.spared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(user.to_owned());
    }

    /// Removes a rule (the same strings); true when it was in force.
    pub fn allow(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        self.lock()
            .remove(&key(verb, resource, namespace))
            .is_some()
    }

    /// Removes every rule.
    pub fn allow_all(&self) {
        self.lock().clear();
    }

    /// Whether `verb` on `resource` in `namespace` (`None`: cluster-scoped or across all
    /// namespaces) is denied to anyone not spared; `resource` as RBAC names it (`pods`,
    /// `pods/log`).
    pub fn is_denied(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        self.is_denied_to("", verb, resource, namespace)
    }

    /// [`DenyList::is_denied`] for requests of `user`.
    pub fn is_denied_to(
        &self,
        user: &str,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> bool {
        let spared = self
            .spared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(user);
        let rules = self.lock();
        let scopes: &[Option<&str>] = match namespace {
            Some(ns) => &[None, Some(ns)],
            None => &[None],
        };
        let sub_star = resource
            .split_once('/')
            .map(|(_, s)| format!("*/{s}"))
            .unwrap_or_default();
        scopes.iter().any(|&ns| {
            [
                (verb, resource),
                (verb, "*"),
                ("*", resource),
                ("*", "*"),
                (verb, sub_star.as_str()),
                ("*", sub_star.as_str()),
            ]
            .iter()
            .filter(|(_, r)| !r.is_empty())
            .any(|(v, r)| {
                rules
                    .get(&key(v, r, ns))
                    .is_some_and(|&everyone| everyone || !spared)
            })
        })
    }

    /// The rules (a poisoned lock is still usable: the set has no invariant to break).
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<RuleKey, bool>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `(verb, resource, namespace)` of a rule.
type RuleKey = (String, String, Option<String>);

fn key(verb: &str, resource: &str, ns: Option<&str>) -> RuleKey {
    (verb.to_owned(), resource.to_owned(), ns.map(str::to_owned))
}

/// The `status` of the answer to one `SubjectAccessReview` (`review` is the request
/// body kube-apiserver sends). Non-resource requests (`/healthz`, `/version`) and
/// unparseable reviews get no opinion.
pub fn review_status(deny: &DenyList, review: &Value) -> Value {
    let ra = &review["spec"]["resourceAttributes"];
    let (Some(verb), Some(resource)) = (ra["verb"].as_str(), ra["resource"].as_str()) else {
        return json!({ "allowed": false });
    };
    let resource = match ra["subresource"].as_str() {
        Some(s) if !s.is_empty() => format!("{resource}/{s}"),
        _ => resource.to_owned(),
    };
    let ns = ra["namespace"].as_str().filter(|s| !s.is_empty());
    let user = review["spec"]["user"].as_str().unwrap_or("");
    if deny.is_denied_to(user, verb, &resource, ns) {
        let scope = ns.map(|n| format!(" in namespace {n}")).unwrap_or_default();
        json!({
            "allowed": false,
            "denied": true,
            "reason": format!("testbed api deny: {verb} {resource}{scope} is denied (user {user:?})"),
        })
    } else {
        json!({ "allowed": false })
    }
}

/// The whole answer document for `review`.
pub fn review_answer(deny: &DenyList, review: &Value) -> Value {
    json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "status": review_status(deny, review),
    })
}

/// Serves the webhook (`POST /authorize`, plain HTTP: it listens only on the host
/// netns' loopback) on `listener` until the future is dropped. Errors: the server's.
pub async fn serve(listener: std::net::TcpListener, deny: Arc<DenyList>) -> std::io::Result<()> {
    use axum::routing::post;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let app = axum::Router::new().route(
        "/authorize",
        post(move |body: axum::body::Bytes| {
            let deny = deny.clone();
            async move {
                let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                axum::Json(review_answer(&deny, &review))
            }
        }),
    );
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sar(verb: &str, resource: &str, sub: &str, ns: &str) -> Value {
        json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {
                "user": "firstpacket-admin", "groups": ["system:authenticated"],
                "resourceAttributes": { "verb": verb, "resource": resource, "subresource": sub, "namespace": ns, "version": "v1" },
            },
        })
    }

    #[test]
    fn deny_matches_verb_resource_and_namespace_and_allow_lifts_it() {
        let d = DenyList::default();
        assert_eq!(
            review_status(&d, &sar("list", "pods", "", "default")),
            json!({"allowed": false})
        );
        d.deny("list", "pods", None);
        let s = review_status(&d, &sar("list", "pods", "", "default"));
        assert_eq!(s["denied"], true);
        assert!(s["reason"].as_str().unwrap().contains("list pods"));
        // Cluster-wide list (no namespace) too.
        assert_eq!(
            review_status(&d, &sar("list", "pods", "", ""))["denied"],
            true
        );
        // Other verbs, resources and subresources are not.
        assert!(review_status(&d, &sar("get", "pods", "", "default"))["denied"].is_null());
        assert!(review_status(&d, &sar("list", "pods", "log", "default"))["denied"].is_null());
        assert!(d.allow("list", "pods", None));
        assert!(!d.allow("list", "pods", None));
        assert!(review_status(&d, &sar("list", "pods", "", "default"))["denied"].is_null());
    }

    #[test]
    fn namespaced_rules_reach_only_their_namespace_and_stars_match() {
        let d = DenyList::default();
        d.deny("*", "pods/proxy", Some("kube-system"));
        assert_eq!(
            review_status(&d, &sar("get", "pods", "proxy", "kube-system"))["denied"],
            true
        );
        assert!(review_status(&d, &sar("get", "pods", "proxy", "default"))["denied"].is_null());
        assert!(review_status(&d, &sar("get", "pods", "proxy", ""))["denied"].is_null());
        d.deny("patch", "*/scale", None);
        assert_eq!(
            review_status(&d, &sar("patch", "deployments", "scale", "a"))["denied"],
            true
        );
        d.allow_all();
        assert!(review_status(&d, &sar("patch", "deployments", "scale", "a"))["denied"].is_null());
    }

    #[test]
    fn spared_users_are_denied_only_by_everyone_rules() {
        let d = DenyList::default();
        d.spare("firstpacket-node-components");
        let mut r = sar("list", "pods", "", "default");
        r["spec"]["user"] = json!("firstpacket-node-components");
        d.deny("list", "pods", None);
        assert!(review_status(&d, &r)["denied"].is_null());
        assert_eq!(
            review_status(&d, &sar("list", "pods", "", "default"))["denied"],
            true
        );
        d.deny_everyone("list", "pods", None);
        assert_eq!(review_status(&d, &r)["denied"], true);
        assert!(d.allow("list", "pods", None));
        assert!(review_status(&d, &r)["denied"].is_null());
    }

    #[test]
    fn non_resource_requests_get_no_opinion() {
        let d = DenyList::default();
        d.deny("*", "*", None);
        let r = json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}});
        assert_eq!(review_answer(&d, &r)["status"], json!({"allowed": false}));
        assert_eq!(
            review_answer(&d, &Value::Null)["kind"],
            "SubjectAccessReview"
        );
    }
}
