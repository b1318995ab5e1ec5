//! Who this pod is, as shown on `GET /` and checked by the source's identity test.
//!
//! Sources: the downward API env vars the prober sets on probe pods (`POD_NAME` from
//! `metadata.name`, `POD_NAMESPACE` from `metadata.namespace`, `POD_IP` from
//! `status.podIP`, `NODE_NAME` from `spec.nodeName`; Kubernetes docs "Expose Pod
//! Information to Containers Through Environment Variables"). Without `POD_NAME` the
//! kernel hostname is used: a pod's hostname is its name unless `spec.hostname` is set.

use serde::{Deserialize, Serialize};

/// Where the hostname fallback is read (no `nix`/`libc` dependency needed).
pub const HOSTNAME_PATH: &str = "/proc/sys/kernel/hostname";

/// The identity document served on `GET /`: `{"pod", "namespace", "ip", "node"}`.
/// Only `pod` is required by the source's check; the others are `null` when unknown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Pod name (`POD_NAME`, else the hostname, else `"unknown"`).
    pub pod: String,
    /// `POD_NAMESPACE` if set.
    pub namespace: Option<String>,
    /// `POD_IP` if set.
    pub ip: Option<String>,
    /// `NODE_NAME` if set.
    pub node: Option<String>,
}

impl Identity {
    /// Read the identity from the process environment (see the module docs). Empty
    /// values count as unset. Never fails: the last resort name is `"unknown"`.
    pub fn from_env() -> Self {
        Self::from_lookup(
            |k| std::env::var(k).ok(),
            || std::fs::read_to_string(HOSTNAME_PATH).ok(),
        )
    }

    /// Same as [`Identity::from_env`] with injectable sources (for tests).
    pub fn from_lookup(
        env: impl Fn(&str) -> Option<String>,
        hostname: impl FnOnce() -> Option<String>,
    ) -> Self {
        let get = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let pod = get("POD_NAME")
            .or_else(|| {
                hostname()
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "unknown".to_string());
        Identity {
            pod,
            namespace: get("POD_NAMESPACE"),
            ip: get("POD_IP"),
            node: get("NODE_NAME"),
        }
    }

    /// The `GET /` body: compact JSON of this identity.
    pub fn to_json(&self) -> String {
        // Serialising a struct of strings cannot fail; keep a safe fallback anyway.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_name_env_wins_over_hostname() {
        let id = Identity::from_lookup(
            |k| (k == "POD_NAME").then(|| "src-abc".to_string()),
            || Some("host\n".to_string()),
        );
        assert_eq!(id.pod, "src-abc");
        assert_eq!(id.namespace, None);
    }

    #[test]
    fn hostname_is_the_fallback_and_is_trimmed() {
        let id = Identity::from_lookup(
            |k| (k == "POD_NAME").then(String::new),
            || Some("node-pod\n".to_string()),
        );
        assert_eq!(id.pod, "node-pod");
    }

    #[test]
    fn identity_json_names_pod_and_downward_api_fields() {
        let id = Identity::from_lookup(
            |k| match k {
                "POD_NAME" => Some("t1".into()),
                "POD_NAMESPACE" => Some("firstpacket".into()),
                "POD_IP" => Some("10.0.0.5".into()),
                "NODE_NAME" => Some("node-2".into()),
                _ => None,
            },
            || None,
        );
        let v: serde_json::Value = serde_json::from_str(&id.to_json()).expect("json");
        assert_eq!(v["pod"], "t1");
        assert_eq!(v["namespace"], "firstpacket");
        assert_eq!(v["ip"], "10.0.0.5");
        assert_eq!(v["node"], "node-2");
    }
}
