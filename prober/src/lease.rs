//! Instance liveness: every prober instance, gate or run, in-cluster or not, holds a
//! `coordination.k8s.io/v1` Lease named [`lease_name`] in the probe namespace, renewed
//! every [`RENEW_INTERVAL`] while it lives ([`InstanceLease`]), deleted when it ends
//! cleanly. A Lease nobody renewed for [`LEASE_DURATION`] marks a dead instance: the
//! [`Reaper`] (the start-up sweep's second half, periodic in `prober run`, and `prober
//! cleanup`) deletes that instance's probe pods and Services, then its Lease — so a
//! SIGKILLed prober's pods go within about [`LEASE_DURATION`] + one reaper pass of its
//! death instead of at their `activeDeadlineSeconds`.
//!
//! "Nobody renewed" is judged as client-go's leader election judges a Lease
//! (`k8s.io/client-go/tools/leaderelection/leaderelection.go`: `observedTime` is the
//! local time the record was last seen to change): by the Lease's `resourceVersion`
//! staying the same for [`LEASE_DURATION`] on the reaper's own monotonic clock — never
//! by comparing `renewTime` (the holder's wall clock) with the reaper's wall clock, so
//! clock skew between machines cannot make a live instance look dead. The price: a
//! dead instance is recognised only after the reaper watched its Lease for one
//! [`LEASE_DURATION`].
//!
//! Bounded: the reaper keeps one observation per other instance's Lease present in the
//! namespace (dropped when the Lease goes).

use crate::error::{kube_status_code, Error};
use crate::labels::{APP_NAME, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_NAME};
use crate::reclaim::delete_instance_pods;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// `leaseDurationSeconds` of an instance Lease: how long without a renewal before the
/// instance counts as dead (client-go's leader-election default is 15 s too).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// How often the holder renews (a third of [`LEASE_DURATION`]: two renewals may fail
/// before the Lease looks dead).
pub const RENEW_INTERVAL: Duration = Duration::from_secs(5);

/// `app.kubernetes.io/component` of instance Leases.
pub const LEASE_COMPONENT: &str = "instance-lease";

/// The Lease of `instance`: `firstpacket-<instance>` (instance ids are `gate-…` /
/// `run-…`, lowercase alphanumerics and `-`, so the name is a valid DNS subdomain).
pub fn lease_name(instance: &str) -> String {
    format!("firstpacket-{instance}")
}

/// The Lease object of `instance` (renewTime = acquireTime = `now`).
pub fn lease_object(namespace: &str, instance: &str, now: Timestamp) -> Lease {
    let labels = [
        (LABEL_NAME, APP_NAME),
        (LABEL_COMPONENT, LEASE_COMPONENT),
        (LABEL_INSTANCE, instance),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(instance)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(instance.to_owned()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// The Lease this instance holds while it lives; renewal runs on a task until
/// [`InstanceLease::release`] (or drop, which stops renewing and leaves the Lease to
/// expire).
pub struct InstanceLease {
    api: Api<Lease>,
    name: String,
    task: Option<JoinHandle<()>>,
}

impl InstanceLease {
    /// Creates (or, if this instance's Lease exists — a restarted container of the same
    /// `run` instance —, takes over) the Lease and starts renewing it. A renewal that
    /// fails is logged once per outage and retried at the next interval; a Lease
    /// deleted under us is created again.
    ///
    /// Errors: the API's answer to the create (or, when the Lease exists, the renewal),
    /// e.g. 403 when RBAC does not grant `create leases` (the caller decides whether
    /// that is fatal: see the RBAC table in docs/src/install.md).
    pub async fn acquire(
        client: kube::Client,
        namespace: &str,
        instance: &str,
    ) -> Result<InstanceLease, kube::Error> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let name = lease_name(instance);
        // Create first (a renewal is a PATCH, a verb of its own in RBAC).
        match api
            .create(
                &PostParams::default(),
                &lease_object(namespace, instance, Timestamp::now()),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if kube_status_code(&e) == Some(409) => {
                create_or_renew(&api, namespace, instance).await?
            }
            Err(e) => return Err(e),
        }
        let task = {
            let (api, namespace, instance) =
                (api.clone(), namespace.to_owned(), instance.to_owned());
            tokio::spawn(async move {
                let mut failing = false;
                loop {
                    tokio::time::sleep(RENEW_INTERVAL).await;
                    match create_or_renew(&api, &namespace, &instance).await {
                        Ok(()) if failing => {
                            tracing::info!(lease = %lease_name(&instance), "instance Lease renewed again");
                            failing = false;
                        }
                        Ok(()) => {}
                        Err(e) if !failing && crate::apihealth::is_unanswered(&e) => {
                            // Reported once per outage by the client's ApiHealth.
                            tracing::debug!(lease = %lease_name(&instance), error = %e,
                                "instance Lease renewal got no answer (retrying)");
                            failing = true;
                        }
                        Err(e) if !failing => {
                            tracing::warn!(lease = %lease_name(&instance), error = %e,
                                "instance Lease renewal failed (retrying); if it stays down for \
                                 15 s another prober may take this instance for dead");
                            failing = true;
                        }
                        Err(_) => {}
                    }
                }
            })
        };
        Ok(InstanceLease {
            api,
            name,
            task: Some(task),
        })
    }

    /// Stops renewing and deletes the Lease (best effort, one try bounded by 5 s): the
    /// instance ended cleanly, after its own pods were deleted.
    pub async fn release(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        let dp = DeleteParams::default();
        let del = self.api.delete(&self.name, &dp);
        match tokio::time::timeout(Duration::from_secs(5), del).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if kube_status_code(&e) == Some(404) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.name, error = %e, "could not delete the instance Lease (it expires by itself)")
            }
            Err(_) => {
                tracing::warn!(lease = %self.name, "no answer deleting the instance Lease (it expires by itself)")
            }
        }
    }
}

impl Drop for InstanceLease {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// One renewal: a merge PATCH of `spec.renewTime` (and the holder); a missing Lease is
/// created.
async fn create_or_renew(
    api: &Api<Lease>,
    namespace: &str,
    instance: &str,
) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    let patch = serde_json::json!({
        "spec": {
            "holderIdentity": instance,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            "renewTime": MicroTime(now),
        }
    });
    match api
        .patch(
            &lease_name(instance),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if kube_status_code(&e) == Some(404) => {
            match api
                .create(
                    &PostParams::default(),
                    &lease_object(namespace, instance, now),
                )
                .await
            {
                Ok(_) => Ok(()),
                // Created meanwhile (a race with ourselves is impossible; with an old
                // incarnation of the same instance, it is ours to renew next time).
                Err(e) if kube_status_code(&e) == Some(409) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Deletes `instance`'s Lease from `leases`' namespace; true if it existed (404 is
/// fine). Errors: the API's refusal ([`Error::Api`] naming `delete lease NS/NAME`).
pub async fn delete_lease(leases: &Api<Lease>, url: &str, instance: &str) -> Result<bool, Error> {
    match leases
        .delete(&lease_name(instance), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if kube_status_code(&e) == Some(404) => Ok(false),
        Err(e) => Err(Error::from_kube(
            e,
            url,
            "delete",
            format!(
                "lease {}/{}",
                leases.namespace().unwrap_or_default(),
                lease_name(instance)
            ),
        )),
    }
}

/// The part of a Lease whose change proves its holder alive (client-go compares the
/// raw record; the `resourceVersion` changes with every write, and the spec fields are
/// kept for the judgement and the status page).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// `spec.holderIdentity` (None or empty: nobody holds it).
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub lease_duration_seconds: i32,
    /// `spec.renewTime` as sent by the holder (its wall clock; compared for change only).
    pub renew_time: Option<String>,
    /// `spec.acquireTime` (holder's wall clock; display only).
    pub acquire_time: Option<String>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

impl Record {
    /// The record of `lease` (missing fields empty / 0).
    pub fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            renew_time: spec.renew_time.map(|t| t.0.to_string()),
            acquire_time: spec.acquire_time.map(|t| t.0.to_string()),
            transitions: spec.lease_transitions.unwrap_or(0),
            resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
        }
    }
}

/// The last record seen and when (our monotonic clock) it was first seen as it is:
/// client-go's `observedRecord` + `observedTime`. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The record.
    pub record: Record,
    /// When it was first seen with this content.
    pub since: Instant,
}

impl Observation {
    /// A first observation at `now`.
    pub fn new(record: Record, now: Instant) -> Observation {
        Observation { record, since: now }
    }

    /// Feeds the record read at `now`: `since` moves to `now` only when the record
    /// changed (holder, renewTime, duration, transitions or resourceVersion). Returns
    /// whether it changed.
    pub fn observe(&mut self, record: Record, now: Instant) -> bool {
        let changed = record != self.record;
        if changed {
            self.record = record;
            self.since = now;
        }
        changed
    }

    /// When the record expires on our clock: `since` + its `leaseDurationSeconds` (a
    /// negative or zero duration expires at once).
    pub fn expires_at(&self) -> Instant {
        self.since + Duration::from_secs(self.record.lease_duration_seconds.max(0) as u64)
    }

    /// Expired at `now` (client-go's `!isLeaseValid`: valid while
    /// `observedTime + leaseDuration` is after `now`).
    pub fn expired(&self, now: Instant) -> bool {
        now >= self.expires_at()
    }

    /// Whether `identity` may take the Lease now: nobody holds it, `identity` holds it,
    /// or the record expired (client-go's `tryAcquireOrRenew` step 3).
    pub fn may_take(&self, identity: &str, now: Instant) -> bool {
        match self.record.holder.as_deref() {
            None => true,
            Some(h) if h == identity => true,
            Some(_) => self.expired(now),
        }
    }
}

/// What the reaper saw of one other instance's Lease: the [`Observation`] (the record
/// and when, on the reaper's monotonic clock, it was first seen as it is), and whether
/// it was seen renewed since the reaper first saw it (alive).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    seen: Observation,
    renewed: bool,
}

/// What one [`Reaper::pass`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapOutcome {
    /// Instances found dead (Lease unchanged for [`LEASE_DURATION`]), sorted.
    pub dead: Vec<String>,
    /// `pod/NAME` / `service/NAME` count deleted per dead instance (0 in dry runs).
    pub deleted_objects: usize,
    /// Other instances whose Lease is watched but not (yet) known dead, sorted.
    pub watching: Vec<String>,
}

/// Finds dead instances by their Leases and deletes what they left (see the module
/// docs). Keeps one `Observed` per other instance's Lease.
pub struct Reaper {
    leases: Api<Lease>,
    pods: Api<Pod>,
    url: String,
    our_instance: String,
    observed: HashMap<String, Observed>,
}

impl Reaper {
    /// A reaper of the Leases in `pods`' namespace, never touching `our_instance`.
    pub fn new(pods: Api<Pod>, url: &str, our_instance: &str) -> Reaper {
        let namespace = pods.namespace().unwrap_or_default().to_owned();
        Reaper {
            leases: Api::namespaced(pods.clone().into_client(), &namespace),
            pods,
            url: url.to_owned(),
            our_instance: our_instance.to_owned(),
            observed: HashMap::new(),
        }
    }

    /// Number of Leases observed (bounded by the other instances' Leases present).
    pub fn observed_len(&self) -> usize {
        self.observed.len()
    }

    /// Lists the instance Leases, updates the observations, and for every instance whose
    /// Lease stayed unchanged for [`LEASE_DURATION`] deletes its probe pods and Services
    /// and then the Lease (only when `delete`; otherwise only reports it).
    ///
    /// Errors: the list or a delete refused ([`Error::Api`] naming verb and resource).
    pub async fn pass(&mut self, delete: bool) -> Result<ReapOutcome, Error> {
        let namespace = self.leases.namespace().unwrap_or_default().to_owned();
        let lp = ListParams::default().labels(&format!(
            "{LABEL_NAME}={APP_NAME},{LABEL_COMPONENT}={LEASE_COMPONENT}"
        ));
        let list = self.leases.list(&lp).await.map_err(|e| {
            Error::from_kube(
                e,
                &self.url,
                "list",
                format!("leases in namespace {namespace}"),
            )
        })?;
        let now = Instant::now();
        let mut seen = Vec::new();
        for l in &list.items {
            let Some(instance) = l
                .metadata
                .labels
                .as_ref()
                .and_then(|m| m.get(LABEL_INSTANCE))
                .cloned()
            else {
                continue;
            };
            if instance == self.our_instance {
                continue;
            }
            let record = Record::of(l);
            seen.push(instance.clone());
            match self.observed.get_mut(&instance) {
                Some(o) => o.renewed |= o.seen.observe(record, now),
                None => {
                    self.observed.insert(
                        instance,
                        Observed {
                            seen: Observation::new(record, now),
                            renewed: false,
                        },
                    );
                }
            }
        }
        self.observed.retain(|i, _| seen.contains(i));
        let mut out = ReapOutcome::default();
        let mut dead: Vec<String> = self
            .observed
            .iter()
            // Our own duration, not the record's: a Lease is judged only after the reaper
            // watched it unchanged for one LEASE_DURATION, whatever it claims.
            .filter(|(_, o)| now.duration_since(o.seen.since) >= LEASE_DURATION)
            .map(|(i, _)| i.clone())
            .collect();
        dead.sort();
        for instance in &dead {
            if delete {
                let n = delete_instance_pods(&self.pods, instance, &self.url).await?;
                out.deleted_objects += n;
                tracing::info!(%instance, objects = n, "instance Lease expired: deleted its probe objects");
                delete_lease(&self.leases, &self.url, instance).await?;
                self.observed.remove(instance);
            }
        }
        out.watching = self
            .observed
            .keys()
            .filter(|i| !dead.contains(i))
            .cloned()
            .collect();
        out.watching.sort();
        out.dead = dead;
        Ok(out)
    }

    /// Instances whose Lease has not been seen renewed since the reaper first saw it
    /// (possibly dead: a pass at most [`LEASE_DURATION`] later decides), sorted.
    pub fn pending(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .observed
            .iter()
            .filter(|(_, o)| !o.renewed)
            .map(|(i, _)| i.clone())
            .collect();
        v.sort();
        v
    }

    /// Instances with a Lease right now (as of the last pass), ours excluded.
    pub fn leased(&self) -> Vec<String> {
        let mut v: Vec<String> = self.observed.keys().cloned().collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_object_names_and_labels_the_instance() {
        let l = lease_object("firstpacket", "gate-ab12cd34", Timestamp::UNIX_EPOCH);
        assert_eq!(
            l.metadata.name.as_deref(),
            Some("firstpacket-gate-ab12cd34")
        );
        let labels = l.metadata.labels.unwrap();
        assert_eq!(labels[LABEL_INSTANCE], "gate-ab12cd34");
        assert_eq!(labels[LABEL_COMPONENT], LEASE_COMPONENT);
        let spec = l.spec.unwrap();
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.holder_identity.as_deref(), Some("gate-ab12cd34"));
        assert!(RENEW_INTERVAL * 3 <= LEASE_DURATION);
    }
}
