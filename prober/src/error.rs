//! The prober's error type.
//!
//! Every variant carries the context an operator needs to act on it (which verb, which
//! resource, which API server URL, which pod) and maps to a short static
//! [`Error::reason`] usable as a metric label. `main` turns any error into one line on
//! stderr and exit code 2 (docs/design.md §4: "the run errored").

use thiserror::Error;

/// Errors the prober library returns.
#[derive(Debug, Error)]
pub enum Error {
    /// A command-line value could not be used (bad selector, toleration, kind, …).
    #[error("invalid {flag}: {message}")]
    Config {
        /// The flag, e.g. `--toleration`.
        flag: &'static str,
        /// What is wrong with the value.
        message: String,
    },

    /// No kubeconfig / in-cluster config could be found or loaded.
    #[error("cannot load Kubernetes client configuration (KUBECONFIG or in-cluster): {0}")]
    ClientConfig(String),

    /// The API server could not be reached at all (connect/TLS/timeout).
    #[error("cannot reach the Kubernetes API at {url} ({verb} {resource}): {message}")]
    Unreachable {
        /// API server URL from the client configuration.
        url: String,
        /// The HTTP verb as the API names it: get, list, watch, create, delete.
        verb: &'static str,
        /// The resource, e.g. `pods in namespace firstpacket`.
        resource: String,
        /// The transport error text (the whole chain of `source`, or what timed out).
        message: String,
        /// The client's own error, when there was one (`None` for a call that timed out).
        #[source]
        source: Option<Box<kube::Error>>,
    },

    /// The API server answered with an error Status (403, 422, 500, …).
    #[error("Kubernetes API at {url} refused {verb} {resource}: HTTP {code} {reason}: {message}")]
    Api {
        /// API server URL.
        url: String,
        /// The verb.
        verb: &'static str,
        /// The resource.
        resource: String,
        /// HTTP status code from the `Status` body.
        code: u16,
        /// `Status.reason` (e.g. `Forbidden`).
        reason: String,
        /// `Status.message`.
        message: String,
        /// The client's own error (`kube::Error::Api` with the whole `Status`), when the
        /// answer came through kube's client.
        #[source]
        source: Option<Box<kube::Error>>,
    },

    /// The probe namespace does not exist and RBAC does not let the prober create it.
    #[error(
        "namespace {namespace} does not exist and the Kubernetes API at {url} refused to \
         create it ({cause}): create it (`kubectl create namespace {namespace}`), or grant \
         create on namespaces (cluster scope), or pick an existing --namespace"
    )]
    NamespaceMissing {
        /// The `--namespace`.
        namespace: String,
        /// API server URL.
        url: String,
        /// `HTTP 403 Forbidden: <Status.message>`.
        cause: String,
    },

    /// Too few Nodes are eligible to form a `cross_node` pair.
    #[error("need at least 2 eligible nodes for cross_node probes, found {eligible}{detail}")]
    NotEnoughNodes {
        /// Eligible count.
        eligible: usize,
        /// Why the others were skipped (already formatted, may be empty).
        detail: String,
    },

    /// A wait on the pod watch gave up (the watch never delivered its initial list).
    #[error("pod watch did not become ready within {seconds}s: {message}")]
    WatchNotReady {
        /// The wait, seconds.
        seconds: u64,
        /// The last watch error, if any.
        message: String,
    },

    /// Writing an output file failed.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A feature that the CLI accepts but this version does not implement.
    #[error("{0} is not implemented yet")]
    NotImplemented(String),
}

impl Error {
    /// Short static label for metrics and logs (bounded set).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Config { .. } => "config",
            Error::ClientConfig(_) => "client_config",
            Error::Unreachable { .. } => "api_unreachable",
            Error::Api { code: 403, .. } => "api_forbidden",
            Error::Api { .. } => "api_error",
            Error::NamespaceMissing { .. } => "namespace_missing",
            Error::NotEnoughNodes { .. } => "not_enough_nodes",
            Error::WatchNotReady { .. } => "watch_not_ready",
            Error::Output { .. } => "output",
            Error::NotImplemented(_) => "not_implemented",
        }
    }

    /// Wraps a kube client error with the request's context.
    ///
    /// `kube::Error::Api` (a `Status` body) becomes [`Error::Api`]; every other error
    /// (hyper/tower transport, TLS, decoding) becomes [`Error::Unreachable`].
    pub fn from_kube(
        err: kube::Error,
        url: &str,
        verb: &'static str,
        resource: impl Into<String>,
    ) -> Self {
        match err {
            kube::Error::Api(ref status) => Error::Api {
                url: url.to_string(),
                verb,
                resource: resource.into(),
                code: status.code,
                reason: status.reason.clone(),
                message: status.message.clone(),
                source: Some(Box::new(err)),
            },
            other => Error::Unreachable {
                url: url.to_string(),
                verb,
                resource: resource.into(),
                message: error_chain(&other),
                source: Some(Box::new(other)),
            },
        }
    }
}

impl Error {
    /// Whether this is the API's `401`/`403` (RBAC or authentication): retrying cannot
    /// help within a run.
    pub fn is_forbidden(&self) -> bool {
        matches!(
            self,
            Error::Api {
                code: 401 | 403,
                ..
            }
        )
    }

    /// A second [`Error::Api`] equal to this one (its source's `Status` copied), for
    /// the fault a refused call also reports; `None` for every other variant.
    pub fn duplicate_api(&self) -> Option<Error> {
        let Error::Api {
            url,
            verb,
            resource,
            code,
            reason,
            message,
            source,
        } = self
        else {
            return None;
        };
        Some(Error::Api {
            url: url.clone(),
            verb,
            resource: resource.clone(),
            code: *code,
            reason: reason.clone(),
            message: message.clone(),
            source: match source.as_deref() {
                Some(kube::Error::Api(status)) => Some(Box::new(kube::Error::Api(status.clone()))),
                _ => None,
            },
        })
    }
}

/// Flattens an error and its sources into one line (`a: b: c`).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

/// One line for a kube client error: `HTTP 403 Forbidden: <Status.message>` for an API
/// `Status` (instead of its `Debug` dump), else the error chain ([`error_chain`]).
pub fn kube_error_text(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(s) => format!("HTTP {} {}: {}", s.code, s.reason, s.message),
        other => error_chain(other),
    }
}

/// One line for a pod-watch error (kube-runtime `watcher::Error`): what failed (initial
/// list, watch start, watch stream, an error event) and [`kube_error_text`] of the cause.
pub fn watcher_error_text(err: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error as W;
    match err {
        W::InitialListFailed(e) => format!("initial list failed: {}", kube_error_text(e)),
        W::WatchStartFailed(e) => format!("watch start failed: {}", kube_error_text(e)),
        W::WatchFailed(e) => format!("watch stream failed: {}", kube_error_text(e)),
        W::WatchError(s) => format!(
            "watch error event: HTTP {} {}: {}",
            s.code, s.reason, s.message
        ),
        other => error_chain(other),
    }
}

/// HTTP code of a kube error if it is an API `Status` (e.g. 404, 409).
pub fn kube_status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_says_what_to_create_and_grant() {
        let e = Error::NamespaceMissing {
            namespace: "fp".into(),
            url: "https://10.0.0.1:6443/".into(),
            cause: "HTTP 403 Forbidden: namespaces is forbidden: User \"x\" cannot create \
                    resource \"namespaces\""
                .into(),
        };
        let t = e.to_string();
        assert!(t.starts_with("namespace fp does not exist"), "{t}");
        assert!(t.contains("`kubectl create namespace fp`"), "{t}");
        assert!(
            t.contains("grant create on namespaces (cluster scope)"),
            "{t}"
        );
        assert!(t.contains("https://10.0.0.1:6443/"), "{t}");
        assert_eq!(e.reason(), "namespace_missing");
    }
}
