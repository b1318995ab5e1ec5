//! Single calls to the API server that the prober's parts share: each bounded by
//! [`API_CALL_TIMEOUT`], errors naming the verb, the object and the server
//! ([`Error::from_kube`], [`Error::Unreachable`]). A leaf: it knows nothing of probes,
//! modes or output.

use crate::error::Error;
use kube::api::ListParams;
use kube::Api;
use std::time::Duration;

/// Timeout of each single API call (30 s: kube-rs's client has no per-request timeout
/// of its own beyond the connection's read timeout, and a call that has not been
/// answered in 30 s is an outage, not a slow answer).
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Awaits `fut` (one API call) for at most [`API_CALL_TIMEOUT`]. Errors: the call's own
/// error as [`Error::from_kube`] (`verb` on `resource` at `url`), or
/// [`Error::Unreachable`] when no answer came in time.
pub async fn with_timeout<T>(
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    url: &str,
    verb: &'static str,
    resource: &str,
) -> Result<T, Error> {
    match tokio::time::timeout(API_CALL_TIMEOUT, fut).await {
        Ok(r) => r.map_err(|e| Error::from_kube(e, url, verb, resource.to_string())),
        Err(_) => Err(Error::Unreachable {
            url: url.to_string(),
            verb,
            resource: resource.to_string(),
            message: format!("no answer within {}s", API_CALL_TIMEOUT.as_secs()),
            source: None,
        }),
    }
}

/// One object by name, read with `list` and `fieldSelector=metadata.name=NAME` instead
/// of a `get`: the prober holds `list` on pods and nodes anyway (its watches), so its
/// RBAC (`manifests/base/rbac.yaml`) needs no `get` for the occasional single read.
/// When the list is refused (403: a Role that grants `get` but not `list`), one `get`
/// instead. `Ok(None)` when no such object exists. Errors: the last call's
/// [`kube::Error`].
pub async fn read_by_name<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .list(&ListParams::default().fields(&format!("metadata.name={name}")))
        .await
    {
        Ok(list) => Ok(list.items.into_iter().next()),
        Err(kube::Error::Api(s)) if s.code == 403 => api.get_opt(name).await,
        Err(e) => Err(e),
    }
}
