//! How the node components (kubelet, simulated agent pods, service proxy) reach the API
//! server: over HTTP(S) with a `kube::Client`, like the real ones, whichever API server
//! runs (the built-in one or a real kube-apiserver). The daemon describes the server
//! with one [`ClusterEndpoint`]; [`ApiClient`] is a thin JSON-in/JSON-out REST helper
//! over `kube::Client` (objects stay `serde_json::Value` in their wire shape).
//!
//! A `kube::Client` spawns its request buffer on the runtime it is built on: build it
//! (with [`ClusterEndpoint::client`]) on the runtime that uses it — for node components
//! the node's [`crate::netns::NetnsThread`], so their sockets live in the node netns.

use base64::Engine as _;
use serde_json::Value;
use std::time::Duration;

/// Who a client is to the API server.
#[derive(Clone, Debug)]
pub enum ClientIdentity {
    /// No credentials.
    Anonymous,
    /// `Authorization: Bearer <token>`.
    Token(String),
    /// A TLS client certificate and its private key, both PEM.
    Certificate { cert_pem: String, key_pem: String },
}

/// One API server as a client sees it: its URL (`https://IP:PORT` or `http://…`), the
/// CA certificate (PEM) that signed its serving certificate (`None` for plain HTTP),
/// and the client's identity.
#[derive(Clone, Debug)]
pub struct ClusterEndpoint {
    pub url: String,
    pub ca_pem: Option<String>,
    pub identity: ClientIdentity,
}

/// An API call that failed: `code` is the HTTP status of the API's `Status` answer, or
/// 0 when no answer came (connection refused, timeout, TLS).
#[derive(Clone, Debug, thiserror::Error)]
#[error("{method} {path}: {code} {reason}: {message}")]
pub struct ApiCallError {
    pub method: String,
    pub path: String,
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl ApiCallError {
    /// No answer, or an answer saying "try again" (429, 5xx): worth retrying.
    pub fn is_transient(&self) -> bool {
        self.code == 0 || self.code == 429 || self.code >= 500
    }
}

impl ClusterEndpoint {
    /// A kubeconfig (YAML) for this endpoint, credentials and CA inline.
    pub fn kubeconfig_yaml(&self) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        let ca = self
            .ca_pem
            .as_deref()
            .map(|c| format!("    certificate-authority-data: {}\n", b64(c)))
            .unwrap_or_default();
        let user = match &self.identity {
            ClientIdentity::Anonymous => "    {}\n".to_string(),
            ClientIdentity::Token(t) => format!("    token: {t}\n"),
            ClientIdentity::Certificate { cert_pem, key_pem } => format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(cert_pem),
                b64(key_pem)
            ),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n{ca}contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n{user}",
            self.url
        )
    }

    /// Builds a client on the current tokio runtime. Errors: a bad URL, CA or key.
    pub async fn client(&self) -> anyhow::Result<ApiClient> {
        use anyhow::Context as _;
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())
            .context("kubeconfig for the cluster endpoint")?;
        let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .with_context(|| format!("client configuration for {}", self.url))?;
        cfg.connect_timeout = Some(Duration::from_secs(5));
        // Watches stay open for minutes; single requests are short.
        cfg.read_timeout = Some(Duration::from_secs(330));
        let client = kube::Client::try_from(cfg)
            .with_context(|| format!("build the API client for {}", self.url))?;
        Ok(ApiClient { client })
    }
}

/// Merge-patch or strategic-merge-patch content types.
#[derive(Clone, Copy, Debug)]
pub enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
}

/// JSON REST calls through a `kube::Client`. Cheap to clone.
#[derive(Clone)]
pub struct ApiClient {
    client: kube::Client,
}

impl ApiClient {
    /// The underlying client (for `kube::Api` / watchers).
    pub fn kube(&self) -> kube::Client {
        self.client.clone()
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> Result<Value, ApiCallError> {
        let fail = |code: u16, reason: &str, message: String| ApiCallError {
            method: method.to_string(),
            path: path.to_string(),
            code,
            reason: reason.to_string(),
            message,
        };
        let bytes = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| fail(0, "Encode", e.to_string()))?,
            None => Vec::new(),
        };
        let mut req = axum::http::Request::builder().method(method).uri(path);
        if let Some(ct) = content_type {
            req = req.header("Content-Type", ct);
        }
        req = req.header("Accept", "application/json");
        let req = req
            .body(bytes)
            .map_err(|e| fail(0, "BadRequest", e.to_string()))?;
        match self.client.request::<Value>(req).await {
            Ok(v) => Ok(v),
            Err(kube::Error::Api(s)) => Err(fail(s.code, &s.reason, s.message.clone())),
            Err(e) => Err(fail(0, "NoAnswer", e.to_string())),
        }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Value, ApiCallError> {
        self.call("GET", path, None, None).await
    }

    /// `POST path` with a JSON body (create; subresources such as `token`).
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ApiCallError> {
        self.call("POST", path, Some("application/json"), Some(body))
            .await
    }

    /// `PUT path` with a JSON body (replace).
    pub async fn put(&self, path: &str, body: &Value) -> Result<Value, ApiCallError> {
        self.call("PUT", path, Some("application/json"), Some(body))
            .await
    }

    /// `PATCH path`.
    pub async fn patch(
        &self,
        path: &str,
        kind: PatchKind,
        body: &Value,
    ) -> Result<Value, ApiCallError> {
        let ct = match kind {
            PatchKind::Merge => "application/merge-patch+json",
            PatchKind::Strategic => "application/strategic-merge-patch+json",
        };
        self.call("PATCH", path, Some(ct), Some(body)).await
    }

    /// `DELETE path` with `DeleteOptions` as the body.
    pub async fn delete(&self, path: &str, options: &Value) -> Result<Value, ApiCallError> {
        self.call("DELETE", path, Some("application/json"), Some(options))
            .await
    }
}

/// REST path of a core/v1 object: `/api/v1[/namespaces/NS]/PLURAL/NAME`.
pub fn core_path(ns: Option<&str>, plural: &str, name: &str) -> String {
    match ns {
        Some(ns) => format!("/api/v1/namespaces/{ns}/{plural}/{name}"),
        None => format!("/api/v1/{plural}/{name}"),
    }
}

/// The RFC 7386 merge patch that turns `old` into `new`: changed members (objects
/// recursively, arrays and scalars whole), removed members as `null`. `None` when equal.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = serde_json::Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov @ Value::Object(_)) if nv.is_object() => {
                        if let Some(d) = merge_diff(ov, nv) {
                            out.insert(k.clone(), d);
                        }
                    }
                    _ => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ if old == new => None,
        _ => Some(new.clone()),
    }
}

/// A watcher back-off that retries quickly (250 ms doubling to 2 s): the testbed's API
/// server restarts in milliseconds and tests time what follows.
#[derive(Default)]
pub struct QuickBackoff(u32);

impl Iterator for QuickBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = Duration::from_millis(250u64 << self.0.min(3)).min(Duration::from_secs(2));
        self.0 = self.0.saturating_add(1);
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for QuickBackoff {
    fn reset(&mut self) {
        self.0 = 0;
    }
}

/// RFC 3339 UTC with microseconds (`MicroTime`, e.g. a Lease's `renewTime`).
pub fn now_micro() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_diff_sends_changes_and_nulls_for_removed_members() {
        let old = json!({"phase": "Pending", "a": {"x": 1, "y": 2}, "c": [1], "gone": 1});
        let new = json!({"phase": "Running", "a": {"x": 1, "y": 3}, "c": [1]});
        assert_eq!(
            merge_diff(&old, &new),
            Some(json!({"phase": "Running", "a": {"y": 3}, "gone": null}))
        );
        assert_eq!(merge_diff(&new, &new), None);
        let mut patched = old.clone();
        crate::api::merge_patch(&mut patched, &merge_diff(&old, &new).unwrap());
        assert_eq!(patched, new);
    }

    #[test]
    fn kubeconfig_carries_ca_and_identity_inline() {
        let ep = ClusterEndpoint {
            url: "https://10.0.0.1:6443".into(),
            ca_pem: Some("CA".into()),
            identity: ClientIdentity::Token("t0k".into()),
        };
        let y = ep.kubeconfig_yaml();
        assert!(y.contains("server: https://10.0.0.1:6443"));
        assert!(y.contains("certificate-authority-data: Q0E="));
        assert!(y.contains("token: t0k"));
        assert!(kube::config::Kubeconfig::from_yaml(&y).is_ok());
    }
}
