//! Deleting what one prober instance created: its probe pods, Services and
//! NetworkPolicies, found by
//! the instance label (`firstpacket.io/instance`) — all of them ([`delete_instance_pods`]:
//! a dead instance's, or ours at the end with [`final_cleanup`]'s retry) or those no
//! running probe owns ([`delete_orphans`], `prober run`'s janitor). Which instances are
//! dead is decided by their owners (the start-up sweep, the Lease reaper, `prober
//! cleanup`); the deleting itself is done here only.

use crate::api::API_CALL_TIMEOUT;
use crate::error::{kube_status_code, Error};
use crate::labels::{instance_selector, LABEL_PROBE_ID};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Deletes every pod and Service of `instance` in `pods`' namespace (list by label, then
/// one delete each, grace 0). Returns how many deletes were sent (404s included: gone is
/// gone); errors name the verb (`list`/`delete`), the object and `url`
/// ([`Error::from_kube`]).
pub async fn delete_instance_pods(
    pods: &Api<Pod>,
    instance: &str,
    url: &str,
) -> Result<usize, Error> {
    delete_instance_objects(pods, instance, url, &|_| false).await
}

/// `prober run`'s janitor: deletes `instance`'s pods and Services whose
/// `firstpacket.io/probe-id` is not in `live` (leftovers of probes that could not delete
/// them; a 404 is fine: the probe's own cleanup won the race). Returns the deletes sent;
/// errors as [`delete_instance_pods`] (the caller retries at its next pass).
pub async fn delete_orphans(
    pods: &Api<Pod>,
    instance: &str,
    url: &str,
    live: &HashSet<String>,
) -> Result<usize, Error> {
    let keep = |meta: &ObjectMeta| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(LABEL_PROBE_ID))
            .is_some_and(|id| live.contains(id))
    };
    delete_instance_objects(pods, instance, url, &keep).await
}

/// The pods, then the Services, then the NetworkPolicies (kinds `policy`,
/// `policy_change`) of `instance` that `keep` does not keep. NetworkPolicies the
/// prober may not list (403: a deployment without the policy kinds' RBAC) or that the
/// API does not serve (404) are skipped: it cannot have made any.
async fn delete_instance_objects(
    pods: &Api<Pod>,
    instance: &str,
    url: &str,
    keep: &(dyn Fn(&ObjectMeta) -> bool + Sync),
) -> Result<usize, Error> {
    let namespace = pods.namespace().map(str::to_owned).unwrap_or_default();
    let n = delete_labelled(pods, instance, url, "pod", &namespace, keep).await?;
    let services: Api<Service> = Api::namespaced(pods.clone().into_client(), &namespace);
    let n = n + delete_labelled(&services, instance, url, "service", &namespace, keep).await?;
    let policies: Api<NetworkPolicy> = Api::namespaced(pods.clone().into_client(), &namespace);
    match delete_labelled(&policies, instance, url, "networkpolicy", &namespace, keep).await {
        Ok(m) => Ok(n + m),
        Err(
            e @ Error::Api {
                code: 403 | 404, ..
            },
        ) => {
            tracing::warn!(error = %e, "probe NetworkPolicies cannot be listed: leftovers of --kinds policy and policy_change stay");
            Ok(n)
        }
        Err(e) => Err(e),
    }
}

async fn delete_labelled<K>(
    api: &Api<K>,
    instance: &str,
    url: &str,
    what: &str,
    namespace: &str,
    keep: &(dyn Fn(&ObjectMeta) -> bool + Sync),
) -> Result<usize, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api
        .list(&ListParams::default().labels(&instance_selector(instance)))
        .await
        .map_err(|e| {
            // `networkpolicy` → `networkpolicies`, as RBAC and kubectl name them.
            let plural = match what.strip_suffix('y') {
                Some(stem) => format!("{stem}ies"),
                None => format!("{what}s"),
            };
            Error::from_kube(e, url, "list", format!("{plural} in namespace {namespace}"))
        })?;
    let mut n = 0;
    for obj in list.items {
        if keep(obj.meta()) {
            continue;
        }
        let Some(name) = obj.meta().name.clone() else {
            continue;
        };
        tracing::debug!(%name, kind = what, "deleting probe object");
        n += 1;
        match api
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(e) if kube_status_code(&e) == Some(404) => {}
            Err(e) => {
                return Err(Error::from_kube(
                    e,
                    url,
                    "delete",
                    format!("{what} {namespace}/{name}"),
                ))
            }
        }
    }
    Ok(n)
}

/// How long the gate keeps retrying its final cleanup while the API fails (30 s: a
/// restarting API server is normally back well within it; after that the pods end by
/// their own `activeDeadlineSeconds` and the next run's start-up sweep).
pub const FINAL_CLEANUP_DEADLINE: Duration = Duration::from_secs(30);

/// Pause between final-cleanup attempts.
pub const FINAL_CLEANUP_RETRY: Duration = Duration::from_secs(2);

/// Why [`final_cleanup`] gave up; its `Display` is the run error text, naming the API
/// URL, the cause and what becomes of the leftovers.
#[derive(Debug)]
pub enum CleanupError {
    /// `401`/`403` listing or deleting: not retried, it cannot heal within the run.
    Forbidden {
        /// The refused call.
        error: Error,
        /// The instance whose pods are left.
        instance: String,
    },
    /// The API kept failing until [`FINAL_CLEANUP_DEADLINE`].
    GaveUp {
        /// API server URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last cause.
        last: String,
        /// The instance whose pods are left.
        instance: String,
    },
}

impl std::fmt::Display for CleanupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CleanupError::Forbidden { error, instance } => write!(
                f,
                "final cleanup cannot work: {error} (not retried); leftover probe pods \
                 (label firstpacket.io/instance={instance}) end by their \
                 activeDeadlineSeconds; the next run's start-up sweep needs the same \
                 permission"
            ),
            CleanupError::GaveUp {
                url,
                attempts,
                last,
                instance,
            } => write!(
                f,
                "final cleanup at {url} gave up after {attempts} attempt(s): {last}; leftover \
                 probe pods (label firstpacket.io/instance={instance}) end by their \
                 activeDeadlineSeconds and are removed by the next run's start-up sweep"
            ),
        }
    }
}

impl std::error::Error for CleanupError {}

/// Deletes what is left of `instance` ([`delete_instance_pods`]), each attempt bounded
/// by [`API_CALL_TIMEOUT`] and the time left, retrying every [`FINAL_CLEANUP_RETRY`] until
/// `deadline` after the call ([`FINAL_CLEANUP_DEADLINE`] in the gate). A `401`/`403`
/// (RBAC forbids listing or deleting) is not retried: it cannot heal within the run.
/// Returns the number of deletes sent, or a [`CleanupError`].
pub async fn final_cleanup_within(
    pods: &Api<Pod>,
    instance: &str,
    url: &str,
    within: Duration,
) -> Result<usize, CleanupError> {
    let deadline = Instant::now() + within;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let bound = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_secs(1), API_CALL_TIMEOUT);
        let last =
            match tokio::time::timeout(bound, delete_instance_pods(pods, instance, url)).await {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.is_forbidden() => {
                    return Err(CleanupError::Forbidden {
                        error: e,
                        instance: instance.to_string(),
                    })
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {}s", bound.as_secs()),
            };
        if Instant::now() + FINAL_CLEANUP_RETRY >= deadline {
            return Err(CleanupError::GaveUp {
                url: url.to_string(),
                attempts,
                last,
                instance: instance.to_string(),
            });
        }
        tracing::warn!(attempt = attempts, error = %last, "final cleanup failed; retrying");
        tokio::time::sleep(FINAL_CLEANUP_RETRY).await;
    }
}

/// [`final_cleanup_within`] [`FINAL_CLEANUP_DEADLINE`] (the gate's end of run).
pub async fn final_cleanup(
    pods: &Api<Pod>,
    instance: &str,
    url: &str,
) -> Result<usize, CleanupError> {
    final_cleanup_within(pods, instance, url, FINAL_CLEANUP_DEADLINE).await
}
