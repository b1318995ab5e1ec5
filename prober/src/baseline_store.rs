//! Persistence of `prober run`'s learned baseline ([`crate::baseline::Snapshot`]) in a
//! ConfigMap in the probe namespace (`--baseline-configmap`, default
//! `firstpacket-baseline`), so a restarted prober and a new leader start from it.
//!
//! API calls (RBAC rows `configmaps` `get`, `patch`, `create` in
//! `manifests/base/rbac.yaml`): at the start of each leadership term one `get`; every
//! `--baseline-save-interval` (default 5 min) when something was learned, and once at
//! shutdown, one merge `patch` of `data` — a `create` the first time (404). So at most
//! 12 writes an hour at the default interval, plus one per shutdown; they are counted
//! in `firstpacket_baseline_writes_total`, apart from the probes' writes (docs/design.md
//! §7). The snapshot is a few hundred KiB at most
//! ([`crate::baseline::SNAPSHOT_MAX_SAMPLES`]), under a ConfigMap's 1 MiB.

use crate::baseline::Snapshot;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;

/// The ConfigMap key holding the snapshot JSON.
pub const DATA_KEY: &str = "baseline.json";

/// Why a load gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The API refused or did not answer (the text names `get configmaps`).
    #[error("cannot get configmaps {namespace}/{name}: {message}")]
    Api {
        /// Namespace.
        namespace: String,
        /// ConfigMap name.
        name: String,
        /// The API's answer.
        message: String,
    },
    /// The ConfigMap exists but is not firstpacket's (no `app.kubernetes.io/name:
    /// firstpacket` label): it is neither read nor written.
    #[error("configmap {namespace}/{name} is not firstpacket's (no label app.kubernetes.io/name=firstpacket): the baseline is not kept there; choose another --baseline-configmap")]
    Foreign {
        /// Namespace.
        namespace: String,
        /// ConfigMap name.
        name: String,
    },
    /// The ConfigMap exists but its data is not a snapshot this prober reads.
    #[error("configmap {namespace}/{name} key {DATA_KEY}: {message}")]
    Bad {
        /// Namespace.
        namespace: String,
        /// ConfigMap name.
        name: String,
        /// What is wrong.
        message: String,
    },
}

/// Reads the snapshot: `Ok(None)` when the ConfigMap (or its key) does not exist yet.
/// Errors: the API's refusal, a ConfigMap that is not firstpacket's, data that is not a
/// snapshot.
pub async fn load(api: &Api<ConfigMap>, name: &str) -> Result<Option<Snapshot>, LoadError> {
    let ns = api.namespace().unwrap_or_default().to_string();
    let cm = match api.get_opt(name).await {
        Ok(Some(cm)) => cm,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(LoadError::Api {
                namespace: ns,
                name: name.to_string(),
                message: crate::error::kube_error_text(&e),
            })
        }
    };
    let ours = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("app.kubernetes.io/name"))
        .is_some_and(|v| v == "firstpacket");
    if !ours {
        return Err(LoadError::Foreign {
            namespace: ns,
            name: name.to_string(),
        });
    }
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(DATA_KEY)) else {
        return Ok(None);
    };
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| LoadError::Bad {
            namespace: ns,
            name: name.to_string(),
            message: e.to_string(),
        })
}

/// The ConfigMap object carrying `snap` (labels as on every firstpacket object).
pub fn configmap(namespace: &str, name: &str, instance: &str, json: String) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm.metadata.namespace = Some(namespace.to_string());
    cm.metadata.labels = Some(
        [
            ("app.kubernetes.io/name", "firstpacket"),
            ("app.kubernetes.io/component", "baseline"),
            ("firstpacket.io/instance", instance),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    cm.data = Some([(DATA_KEY.to_string(), json)].into_iter().collect());
    cm
}

/// Writes `snap`: a merge patch of `data` (and the writer's instance label), a create
/// when the ConfigMap does not exist (404). Errors: the API's answer (its text names
/// the verb and `configmaps`).
pub async fn save(
    api: &Api<ConfigMap>,
    name: &str,
    instance: &str,
    snap: &Snapshot,
) -> Result<(), kube::Error> {
    let json = serde_json::to_string(snap).map_err(kube::Error::SerdeError)?;
    let patch = serde_json::json!({
        "metadata": {"labels": {"firstpacket.io/instance": instance}},
        "data": {DATA_KEY: json},
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if crate::error::kube_status_code(&e) == Some(404) => {
            let ns = api.namespace().unwrap_or_default().to_string();
            match api
                .create(
                    &PostParams::default(),
                    &configmap(&ns, name, instance, json),
                )
                .await
            {
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}
