//! Start-up sweep of leftover probe pods, probe Services and probe NetworkPolicies
//! (docs/design.md §6, binding).
//!
//! Lists pods labelled `app.kubernetes.io/name=firstpacket` in the namespace and deletes
//! those whose `firstpacket.io/instance` is **not ours** and whose instance is provably
//! dead:
//! - in-cluster instances (an ownerReference of kind `Pod`): the owner pod is gone (no
//!   pod of that name, or one with another UID);
//! - gate instances (`gate-…`, no owner): the pod is older than
//!   2 × give-up + hold + grace — longer than any gate probe can take, and the same bound
//!   as the pods' own `activeDeadlineSeconds`.
//!
//! Anything else is kept: never another live instance's pods. Instances with a Lease
//! whose holder died are found by [`crate::lease::Reaper`], which needs one lease
//! duration of watching and so runs beside the probes.

use crate::error::{kube_status_code, Error};
use crate::labels::{APP_NAME, LABEL_INSTANCE, LABEL_NAME};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use std::collections::HashMap;
use std::time::Duration;

/// Extra grace added to the gate age limit.
pub const SWEEP_GRACE: Duration = Duration::from_secs(60);

/// Why a pod is swept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepReason {
    /// Its owner pod (prober replica) no longer exists.
    OwnerGone(String),
    /// A gate instance's pod older than the age limit.
    Expired {
        /// Pod age, seconds.
        age_seconds: i64,
    },
}

/// Facts about one candidate pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Pod name.
    pub name: String,
    /// `firstpacket.io/instance` label, if any.
    pub instance: Option<String>,
    /// `(owner pod name, owner uid)` from an ownerReference of kind `Pod`.
    pub owner_pod: Option<(String, String)>,
    /// Age in seconds (API `creationTimestamp` vs. the API server's clock as the
    /// caller estimates it), if known.
    pub age_seconds: Option<i64>,
    /// The pod's own age limit, seconds: its `activeDeadlineSeconds` plus
    /// [`SWEEP_GRACE`] (each run sets the deadline from its own flags, so another run's
    /// pods are judged by theirs, not by ours).
    pub age_limit_seconds: Option<i64>,
}

impl Candidate {
    /// Extracts the facts from a pod, with `now` as the wall clock.
    pub fn from_pod(pod: &Pod, now: Timestamp) -> Self {
        let mut c = Candidate::from_meta(&pod.metadata, now);
        c.age_limit_seconds = pod
            .spec
            .as_ref()
            .and_then(|s| s.active_deadline_seconds)
            .map(|d| d + SWEEP_GRACE.as_secs() as i64);
        c
    }

    /// Extracts the facts from any object's metadata (probe Services are swept by the
    /// same rules as probe pods).
    pub fn from_meta(md: &ObjectMeta, now: Timestamp) -> Self {
        Candidate {
            name: md.name.clone().unwrap_or_default(),
            instance: md
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_INSTANCE).cloned()),
            owner_pod: md.owner_references.as_ref().and_then(|refs| {
                refs.iter()
                    .find(|r| r.kind == "Pod")
                    .map(|r| (r.name.clone(), r.uid.clone()))
            }),
            age_seconds: md
                .creation_timestamp
                .as_ref()
                .map(|t| now.as_second() - t.0.as_second()),
            age_limit_seconds: None,
        }
    }
}

/// Decides whether to sweep `c`.
///
/// `owner_alive(name, uid)` answers whether that owner pod still exists with that UID;
/// `max_age` is the gate age limit.
pub fn decide(
    c: &Candidate,
    our_instance: &str,
    max_age: Duration,
    owner_alive: impl Fn(&str, &str) -> bool,
) -> Option<SweepReason> {
    let instance = c.instance.as_deref()?;
    if instance == our_instance {
        return None;
    }
    if let Some((owner, uid)) = &c.owner_pod {
        return (!owner_alive(owner, uid)).then(|| SweepReason::OwnerGone(owner.clone()));
    }
    if instance.starts_with("gate-") {
        let age = c.age_seconds?;
        let ours = i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX);
        let limit = c.age_limit_seconds.map_or(ours, |l| l.max(ours));
        return (age > limit).then_some(SweepReason::Expired { age_seconds: age });
    }
    None
}

/// Probe pods of another instance the sweep kept (not provably dead), per instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptInstance {
    /// `firstpacket.io/instance`.
    pub instance: String,
    /// How many of its probe pods are in the namespace.
    pub pods: usize,
    /// For a gate instance (no owner pod): seconds until its oldest pod passes its age
    /// limit and the next run's sweep deletes it; `None` for in-cluster instances (kept
    /// while their owner pod lives).
    pub swept_in_seconds: Option<i64>,
}

/// What the start-up sweep did: the objects deleted (`pod/NAME`, `service/NAME`,
/// `networkpolicy/NAME`) and the
/// other instances whose probe pods it kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// `pod/NAME`, `service/NAME` or `networkpolicy/NAME` deleted.
    pub deleted: Vec<String>,
    /// Other instances' probe pods left alone, by instance (sorted).
    pub kept: Vec<KeptInstance>,
}

/// The pods `candidates` keeps, grouped by instance (not ours): see [`KeptInstance`].
fn kept_instances(
    candidates: &[(&str, Candidate)],
    our_instance: &str,
    max_age: Duration,
    alive: impl Fn(&str, &str) -> bool,
) -> Vec<KeptInstance> {
    let ours = i64::try_from(max_age.as_secs()).unwrap_or(i64::MAX);
    let mut by: std::collections::BTreeMap<String, KeptInstance> = Default::default();
    for (_, c) in candidates.iter().filter(|(what, _)| *what == "pod") {
        let Some(instance) = c.instance.as_deref() else {
            continue;
        };
        if instance == our_instance || decide(c, our_instance, max_age, &alive).is_some() {
            continue;
        }
        let left = match (&c.owner_pod, c.age_seconds) {
            (None, Some(age)) => Some(c.age_limit_seconds.map_or(ours, |l| l.max(ours)) - age),
            _ => None,
        };
        let k = by.entry(instance.to_owned()).or_insert(KeptInstance {
            instance: instance.to_owned(),
            pods: 0,
            swept_in_seconds: left,
        });
        k.pods += 1;
        k.swept_in_seconds = match (k.swept_in_seconds, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    by.into_values().collect()
}

/// The `what` (plural, as RBAC names them) in `namespace` matching `selector`; when the
/// list fails, a warning naming the verb and resource (leftovers of that kind stay) and
/// none.
async fn list_or_warn<K>(
    api: &Api<K>,
    selector: &ListParams,
    url: &str,
    what: &str,
    namespace: &str,
) -> Vec<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(selector).await {
        Ok(l) => l.items,
        Err(e) => {
            let e = Error::from_kube(e, url, "list", format!("{what} in namespace {namespace}"));
            tracing::warn!(error = %e, "cannot list {what} for the start-up sweep: leftover probe {what} stay");
            Vec::new()
        }
    }
}

/// Runs the sweep: list (by `app.kubernetes.io/name=firstpacket`), look up owner pods
/// once each, delete what [`decide`] says. Returns what was deleted and what was kept
/// ([`SweepOutcome`]). A 404 on delete is fine; other API errors are returned. With
/// `delete` false nothing is deleted and `deleted` lists what would be (`prober cleanup`
/// without `--yes`). `clock` gives the API server's time (module docs).
pub async fn sweep(
    pods: &Api<Pod>,
    clock: &crate::apihealth::ApiHealth,
    url: &str,
    namespace: &str,
    our_instance: &str,
    max_age: Duration,
    delete: bool,
) -> Result<SweepOutcome, Error> {
    let selector = ListParams::default().labels(&format!("{LABEL_NAME}={APP_NAME}"));
    let services: Api<Service> = Api::namespaced(pods.clone().into_client(), namespace);
    let policies: Api<NetworkPolicy> = Api::namespaced(pods.clone().into_client(), namespace);
    let pod_list = pods
        .list(&selector)
        .await
        .map_err(|e| Error::from_kube(e, url, "list", format!("pods in namespace {namespace}")))?;
    // Probe Services (kind `service`) and NetworkPolicies (kinds `policy`,
    // `policy_change`) follow the same rules; a cluster without the permission to list
    // them still gets its pods swept.
    let svc_list = list_or_warn(&services, &selector, url, "services", namespace).await;
    let np_list = list_or_warn(&policies, &selector, url, "networkpolicies", namespace).await;
    // After the list: its response's `Date` header is the freshest reading.
    let now = clock.server_now();
    let candidates: Vec<(&'static str, Candidate)> = pod_list
        .items
        .iter()
        .map(|p| ("pod", Candidate::from_pod(p, now)))
        .chain(
            svc_list
                .iter()
                .map(|s| ("service", Candidate::from_meta(&s.metadata, now))),
        )
        .chain(
            np_list
                .iter()
                .map(|p| ("networkpolicy", Candidate::from_meta(&p.metadata, now))),
        )
        .collect();
    let mut owners: HashMap<String, Option<String>> = HashMap::new();
    for (_, c) in &candidates {
        if let Some((owner, _)) = &c.owner_pod {
            if owners.contains_key(owner) {
                continue;
            }
            let got = crate::api::read_by_name(pods, owner).await.map_err(|e| {
                Error::from_kube(e, url, "list", format!("pod {namespace}/{owner}"))
            })?;
            owners.insert(owner.clone(), got.and_then(|p| p.metadata.uid));
        }
    }
    let alive = |name: &str, uid: &str| owners.get(name).is_some_and(|u| u.as_deref() == Some(uid));
    // Instances that still have a pod the sweep keeps are live: keep their Services
    // and NetworkPolicies (they carry no deadline of their own).
    let live_instances: std::collections::HashSet<&str> = candidates
        .iter()
        .filter(|(what, c)| *what == "pod" && decide(c, our_instance, max_age, alive).is_none())
        .filter_map(|(_, c)| c.instance.as_deref())
        .collect();
    let kept = kept_instances(&candidates, our_instance, max_age, alive);
    let mut deleted = Vec::new();
    for (what, c) in &candidates {
        let is_pod = *what == "pod";
        if !is_pod
            && c.instance
                .as_deref()
                .is_some_and(|i| live_instances.contains(i))
        {
            continue;
        }
        let Some(reason) = decide(c, our_instance, max_age, alive) else {
            continue;
        };
        if !delete {
            deleted.push(format!("{what}/{}", c.name));
            continue;
        }
        tracing::info!(name = %c.name, kind = what, ?reason, "sweeping leftover probe object");
        let dp = DeleteParams::default().grace_period(0);
        let r = match *what {
            "pod" => pods.delete(&c.name, &dp).await.map(|_| ()),
            "service" => services.delete(&c.name, &dp).await.map(|_| ()),
            _ => policies.delete(&c.name, &dp).await.map(|_| ()),
        };
        match r {
            Ok(()) => deleted.push(format!("{what}/{}", c.name)),
            Err(e) if kube_status_code(&e) == Some(404) => {}
            Err(e) => {
                return Err(Error::from_kube(
                    e,
                    url,
                    "delete",
                    format!("{what} {namespace}/{}", c.name),
                ))
            }
        }
    }
    Ok(SweepOutcome { deleted, kept })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(instance: Option<&str>, owner: Option<(&str, &str)>, age: Option<i64>) -> Candidate {
        Candidate {
            name: "fp-x-t".into(),
            instance: instance.map(String::from),
            owner_pod: owner.map(|(a, b)| (a.to_string(), b.to_string())),
            age_seconds: age,
            age_limit_seconds: None,
        }
    }

    #[test]
    fn another_run_with_a_longer_give_up_is_judged_by_its_own_pod_deadline() {
        let never = |_: &str, _: &str| false;
        // Our limit is 185 s; the other gate's pod has activeDeadlineSeconds 261.
        let mut c = cand(Some("gate-long"), None, Some(200));
        c.age_limit_seconds = Some(261 + SWEEP_GRACE.as_secs() as i64);
        assert_eq!(decide(&c, "gate-me", MAX, never), None);
        c.age_seconds = Some(400);
        assert_eq!(
            decide(&c, "gate-me", MAX, never),
            Some(SweepReason::Expired { age_seconds: 400 })
        );
    }

    const MAX: Duration = Duration::from_secs(185);

    #[test]
    fn pods_of_a_killed_gate_are_reported_as_kept_with_the_time_until_they_are_swept() {
        let never = |_: &str, _: &str| false;
        let mut young = cand(Some("gate-killed"), None, Some(40));
        young.age_limit_seconds = Some(185 + SWEEP_GRACE.as_secs() as i64);
        let mut older = young.clone();
        older.age_seconds = Some(100);
        let other = cand(Some("replica-1"), Some(("prober-0", "u1")), Some(10));
        let ours = cand(Some("gate-me"), None, Some(5));
        let cands: Vec<(&str, Candidate)> = [young, older, other, ours]
            .into_iter()
            .map(|c| ("pod", c))
            .collect();
        let alive = |n: &str, _: &str| n == "prober-0";
        let kept = kept_instances(&cands, "gate-me", MAX, alive);
        assert_eq!(
            kept,
            vec![
                KeptInstance {
                    instance: "gate-killed".into(),
                    pods: 2,
                    swept_in_seconds: Some(245 - 100),
                },
                KeptInstance {
                    instance: "replica-1".into(),
                    pods: 1,
                    swept_in_seconds: None,
                },
            ]
        );
        // Once expired they are deleted, not kept.
        let expired: Vec<(&str, Candidate)> =
            vec![("pod", cand(Some("gate-old"), None, Some(999)))];
        assert!(kept_instances(&expired, "gate-me", MAX, never).is_empty());
    }

    #[test]
    fn own_and_unlabelled_pods_are_never_swept() {
        let never = |_: &str, _: &str| false;
        assert_eq!(
            decide(
                &cand(Some("gate-me"), None, Some(9999)),
                "gate-me",
                MAX,
                never
            ),
            None
        );
        assert_eq!(
            decide(&cand(None, None, Some(9999)), "gate-me", MAX, never),
            None
        );
    }

    #[test]
    fn old_gate_pods_are_swept_and_young_ones_kept() {
        let never = |_: &str, _: &str| false;
        assert_eq!(
            decide(
                &cand(Some("gate-old"), None, Some(186)),
                "gate-me",
                MAX,
                never
            ),
            Some(SweepReason::Expired { age_seconds: 186 })
        );
        assert_eq!(
            decide(
                &cand(Some("gate-live"), None, Some(185)),
                "gate-me",
                MAX,
                never
            ),
            None
        );
        assert_eq!(
            decide(&cand(Some("gate-live"), None, None), "gate-me", MAX, never),
            None
        );
    }

    #[test]
    fn owned_pods_are_swept_only_when_the_owner_is_gone() {
        let alive = |n: &str, u: &str| n == "prober-0" && u == "uid-1";
        let live = cand(Some("run-abc"), Some(("prober-0", "uid-1")), Some(99_999));
        assert_eq!(decide(&live, "gate-me", MAX, alive), None);
        let replaced = cand(Some("run-abc"), Some(("prober-0", "uid-0")), Some(1));
        assert_eq!(
            decide(&replaced, "gate-me", MAX, alive),
            Some(SweepReason::OwnerGone("prober-0".into()))
        );
    }

    #[test]
    fn unowned_non_gate_instances_are_kept() {
        let never = |_: &str, _: &str| false;
        assert_eq!(
            decide(
                &cand(Some("run-x"), None, Some(99_999)),
                "gate-me",
                MAX,
                never
            ),
            None
        );
    }
}
