//! Discovery of node-agent pods (docs/design.md §3): which agent of which [`Profile`] runs
//! on which Node, where its `/metrics` is, and whether it is Ready.
//!
//! Pure half: [`target_from_pod`] turns a Pod into an [`AgentTarget`]; [`AgentIndex`]
//! keeps them by pod UID and answers per node. I/O half: [`watch_agents`] runs one
//! kube-rs watcher per (profile, namespace) with the profile's label selector and feeds
//! the index (watches scale with profiles, not nodes).

use super::profiles::{parse_selector, selector_matches, PortRule, Profile};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

/// One discovered agent pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTarget {
    /// Profile name (`calico-felix`, …).
    pub profile: String,
    /// `spec.nodeName`.
    pub node: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Pod UID (counters are keyed by UID + restart count: a new UID is a new process).
    pub uid: String,
    /// Σ `restartCount` over the pod's containers.
    pub restart_count: u32,
    /// `status.hostIP` (the Node's address; agents run with hostNetwork).
    pub host_ip: Option<String>,
    /// Metrics port from the profile's rules; `None` when no rule resolved.
    pub port: Option<u16>,
    /// The pod's `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set (the pod is going away, e.g. the old pod of
    /// a DaemonSet rollout).
    pub terminating: bool,
    /// `status.startTime`, else `metadata.creationTimestamp`, Unix milliseconds (orders
    /// overlapping pods of one agent: the newest wins among equals).
    pub started_ms: Option<i64>,
}

impl AgentTarget {
    /// Preference among several pods of one profile on one node (higher wins): not
    /// terminating, then Ready, then the newest start, then the pod name (so the choice
    /// is deterministic). In a DaemonSet rollout the old and the new pod overlap; this
    /// keeps the old one until the new one is Ready (or the old one terminates) and
    /// then switches once — one hand-over, one `agent_restarted`, no flip-flop.
    fn preference(&self) -> (bool, bool, i64, &str) {
        (
            !self.terminating,
            self.ready,
            self.started_ms.unwrap_or(i64::MIN),
            self.pod.as_str(),
        )
    }
}

/// Resolves the metrics port of `pod` by `profile.port`'s rules, in order. Env values and
/// annotations must be plain decimal port numbers (`valueFrom` is not followed).
pub fn resolve_port(profile: &Profile, pod: &Pod) -> Option<u16> {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[]);
    profile.port.iter().find_map(|rule| match rule {
        PortRule::Env(name) => containers.iter().find_map(|c| {
            c.env
                .as_ref()?
                .iter()
                .find(|e| &e.name == name)?
                .value
                .as_deref()?
                .trim()
                .parse::<u16>()
                .ok()
        }),
        PortRule::Annotation(key) => pod
            .metadata
            .annotations
            .as_ref()?
            .get(key)?
            .trim()
            .parse::<u16>()
            .ok(),
        PortRule::ContainerPortName(name) => containers.iter().find_map(|c| {
            let p = c
                .ports
                .as_ref()?
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))?;
            u16::try_from(p.container_port).ok()
        }),
        PortRule::Number(n) => Some(*n),
    })
}

/// The [`AgentTarget`] for `pod` under `profile`, or `None` when the pod does not match
/// the profile's selector, has no UID or is not bound to a node yet.
pub fn target_from_pod(profile: &Profile, pod: &Pod) -> Option<AgentTarget> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let terms = parse_selector(&profile.selector).ok()?;
    if !selector_matches(&terms, labels) {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let status = pod.status.as_ref();
    let restart_count = status
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count.max(0) as u32).sum())
        .unwrap_or(0);
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        .unwrap_or(false);
    Some(AgentTarget {
        profile: profile.name.clone(),
        node,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone()?,
        restart_count,
        host_ip: status.and_then(|s| s.host_ip.clone()),
        port: resolve_port(profile, pod),
        ready,
        terminating: pod.metadata.deletion_timestamp.is_some(),
        started_ms: status
            .and_then(|s| s.start_time.as_ref())
            .or(pod.metadata.creation_timestamp.as_ref())
            .map(|t| t.0.as_millisecond()),
    })
}

/// Discovered agents by (profile, pod UID), with per-node lookups. Pure. Keyed by
/// profile too: one pod may match two profiles (e.g. a config profile reading a second
/// port of calico-node), and each is scraped on its own.
#[derive(Debug, Clone, Default)]
pub struct AgentIndex {
    by_uid: HashMap<(String, String), AgentTarget>,
    /// Profiles whose initial list is done.
    synced: HashMap<(String, String), bool>,
    /// The last error of each (profile, namespace) watch that is failing now (cleared
    /// by its next successful list).
    errors: BTreeMap<(String, String), String>,
}

impl AgentIndex {
    /// Adds or replaces an agent (of its profile).
    pub fn apply(&mut self, t: AgentTarget) {
        self.by_uid.insert((t.profile.clone(), t.uid.clone()), t);
    }

    /// Removes the agent of `profile` with this pod UID.
    pub fn delete(&mut self, profile: &str, uid: &str) {
        self.by_uid.remove(&(profile.to_owned(), uid.to_owned()));
    }

    /// Replaces every agent of `profile` in `namespace` by `targets` (a watch re-list).
    pub fn replace(&mut self, profile: &str, namespace: &str, targets: Vec<AgentTarget>) {
        self.by_uid
            .retain(|_, t| !(t.profile == profile && t.namespace == namespace));
        for t in targets {
            self.apply(t);
        }
        self.synced
            .insert((profile.to_owned(), namespace.to_owned()), true);
    }

    /// The agents to scrape on `node`: one pod per profile, the most preferred when
    /// several match (not terminating > Ready > newest start > name; see
    /// `AgentTarget::preference`), sorted by profile.
    pub fn on_node(&self, node: &str) -> Vec<AgentTarget> {
        let mut best: BTreeMap<&str, &AgentTarget> = BTreeMap::new();
        for t in self.by_uid.values().filter(|t| t.node == node) {
            match best.get(t.profile.as_str()) {
                Some(b) if b.preference() >= t.preference() => {}
                _ => {
                    best.insert(t.profile.as_str(), t);
                }
            }
        }
        best.into_values().cloned().collect()
    }

    /// Profiles with at least one agent anywhere in the cluster (a profile with none is
    /// not that cluster's CNI: its absence on a node is no signal).
    pub fn present_profiles(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_uid.values().map(|t| t.profile.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Every node with an agent.
    pub fn nodes(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_uid.values().map(|t| t.node.clone()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Records that the (profile, namespace) watch failed with `error`; returns true when
    /// it was not failing before (so the caller logs once per outage).
    pub fn set_error(&mut self, profile: &str, namespace: &str, error: String) -> bool {
        self.errors
            .insert((profile.to_owned(), namespace.to_owned()), error)
            .is_none()
    }

    /// The (profile, namespace) watch works again.
    pub fn clear_error(&mut self, profile: &str, namespace: &str) {
        self.errors
            .remove(&(profile.to_owned(), namespace.to_owned()));
    }

    /// Watches failing now, as `"<profile> in <namespace>: <error>"`.
    pub fn errors(&self) -> Vec<String> {
        self.errors
            .iter()
            .map(|((p, ns), e)| format!("{p} in {ns}: {e}"))
            .collect()
    }

    /// Number of (profile, namespace) watches whose initial list is done.
    pub fn synced_watches(&self) -> usize {
        self.synced.values().filter(|s| **s).count()
    }

    /// All agents.
    pub fn all(&self) -> Vec<AgentTarget> {
        self.by_uid.values().cloned().collect()
    }
}

/// Shared, lock-protected index fed by [`watch_agents`].
pub type SharedIndex = Arc<RwLock<AgentIndex>>;

/// Runs one watcher per (profile, namespace) with the profile's label selector and keeps
/// `index` current, until the returned future is dropped. Watch errors are logged and
/// retried by kube-rs's default backoff; a namespace that does not exist simply lists
/// nothing.
pub async fn watch_agents(client: Client, profiles: Vec<Profile>, index: SharedIndex) {
    let mut tasks = Vec::new();
    for profile in profiles {
        for ns in profile.namespaces.clone() {
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let cfg = crate::podwatch::watcher_config(&profile.selector);
            let profile = profile.clone();
            let index = index.clone();
            tasks.push(async move {
                let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
                let mut buffer: Vec<AgentTarget> = Vec::new();
                while let Some(ev) = stream.next().await {
                    match ev {
                        Ok(watcher::Event::Init) => buffer.clear(),
                        Ok(watcher::Event::InitApply(pod)) => {
                            buffer.extend(target_from_pod(&profile, &pod));
                        }
                        Ok(watcher::Event::InitDone) => {
                            if let Ok(mut idx) = index.write() {
                                idx.replace(&profile.name, &ns, std::mem::take(&mut buffer));
                                idx.clear_error(&profile.name, &ns);
                            }
                        }
                        Ok(watcher::Event::Apply(pod)) => {
                            let t = target_from_pod(&profile, &pod);
                            if let Ok(mut idx) = index.write() {
                                match t {
                                    Some(t) => idx.apply(t),
                                    None => {
                                        if let Some(uid) = pod.metadata.uid.as_deref() {
                                            idx.delete(&profile.name, uid);
                                        }
                                    }
                                }
                            }
                        }
                        Ok(watcher::Event::Delete(pod)) => {
                            if let (Some(uid), Ok(mut idx)) =
                                (pod.metadata.uid.as_deref(), index.write())
                            {
                                idx.delete(&profile.name, uid);
                            }
                        }
                        Err(e) => {
                            let text = crate::error::watcher_error_text(&e);
                            let first = index
                                .write()
                                .map(|mut idx| idx.set_error(&profile.name, &ns, text.clone()))
                                .unwrap_or(false);
                            if first && !crate::apihealth::watcher_unanswered(&e) {
                                tracing::warn!(profile = %profile.name, namespace = %ns,
                                    error = %text, "agent discovery failing (retrying; correlation on this profile is blind meanwhile)");
                            } else {
                                tracing::debug!(profile = %profile.name, namespace = %ns,
                                    error = %text, "agent pod watch error (retrying)");
                            }
                        }
                    }
                }
            });
        }
    }
    futures::future::join_all(tasks).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::profiles::{builtin_profiles, find, CALICO_FELIX, CILIUM_AGENT};

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod json")
    }

    fn calico(env_port: Option<&str>, annotation: Option<&str>) -> Pod {
        let mut env = vec![serde_json::json!({"name": "DATASTORE_TYPE", "value": "kubernetes"})];
        if let Some(p) = env_port {
            env.push(serde_json::json!({"name": "FELIX_PROMETHEUSMETRICSPORT", "value": p}));
        }
        let mut ann = serde_json::Map::new();
        if let Some(a) = annotation {
            ann.insert("prometheus.io/port".into(), a.into());
        }
        pod(serde_json::json!({
            "metadata": {"name": "calico-node-x", "namespace": "kube-system", "uid": "u1",
                          "labels": {"k8s-app": "calico-node"}, "annotations": ann},
            "spec": {"nodeName": "node-2", "hostNetwork": true,
                     "containers": [{"name": "calico-node", "env": env}]},
            "status": {"hostIP": "10.0.0.2",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "calico-node", "restartCount": 2,
                           "ready": true, "image": "i", "imageID": "", "state": {}}]}
        }))
    }

    #[test]
    fn felix_port_prefers_env_then_annotation_then_9091() {
        let b = builtin_profiles();
        let felix = find(&b, CALICO_FELIX).expect("felix");
        let t = target_from_pod(felix, &calico(Some("9999"), Some("9092"))).expect("match");
        assert_eq!(t.port, Some(9999));
        let t = target_from_pod(felix, &calico(None, Some("9092"))).expect("match");
        assert_eq!(t.port, Some(9092));
        let t = target_from_pod(felix, &calico(None, None)).expect("match");
        assert_eq!(t.port, Some(9091));
        assert_eq!(t.node, "node-2");
        assert_eq!(t.restart_count, 2);
        assert_eq!(t.host_ip.as_deref(), Some("10.0.0.2"));
        assert!(t.ready);
    }

    #[test]
    fn pod_not_matching_the_selector_is_no_agent() {
        let b = builtin_profiles();
        let cilium = find(&b, CILIUM_AGENT).expect("cilium");
        assert_eq!(target_from_pod(cilium, &calico(None, None)), None);
    }

    #[test]
    fn cilium_port_comes_from_the_named_container_port() {
        let b = builtin_profiles();
        let cilium = find(&b, CILIUM_AGENT).expect("cilium");
        let p = pod(serde_json::json!({
            "metadata": {"name": "cilium-abc", "namespace": "kube-system", "uid": "u2",
                          "labels": {"k8s-app": "cilium"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "cilium-agent",
                "ports": [{"name": "health", "containerPort": 9879},
                          {"name": "prometheus", "containerPort": 9962}]}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        }));
        let t = target_from_pod(cilium, &p).expect("match");
        assert_eq!(t.port, Some(9962));
        assert!(!t.ready);
    }

    #[test]
    fn index_replace_drops_agents_gone_since_the_last_list() {
        let b = builtin_profiles();
        let felix = find(&b, CALICO_FELIX).expect("felix");
        let t = target_from_pod(felix, &calico(None, None)).expect("match");
        let mut idx = AgentIndex::default();
        idx.apply(t.clone());
        assert_eq!(idx.on_node("node-2").len(), 1);
        idx.replace(CALICO_FELIX, "kube-system", Vec::new());
        assert!(idx.on_node("node-2").is_empty());
        assert_eq!(idx.synced_watches(), 1);
    }

    #[test]
    fn one_pod_matching_two_profiles_is_indexed_under_each() {
        let b = builtin_profiles();
        let felix = find(&b, CALICO_FELIX).expect("felix");
        let t = target_from_pod(felix, &calico(None, None)).expect("match");
        let mut other = t.clone();
        other.profile = "second-port".into();
        let mut idx = AgentIndex::default();
        idx.apply(t.clone());
        idx.apply(other);
        assert_eq!(idx.on_node("node-2").len(), 2);
        idx.delete("second-port", &t.uid);
        let left = idx.on_node("node-2");
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].profile, CALICO_FELIX);
    }

    fn overlapping(uid: &str, ready: bool, terminating: bool, started_ms: i64) -> AgentTarget {
        AgentTarget {
            profile: CALICO_FELIX.into(),
            node: "node-2".into(),
            namespace: "kube-system".into(),
            pod: format!("calico-node-{uid}"),
            uid: uid.into(),
            restart_count: 0,
            host_ip: Some("10.0.0.2".into()),
            port: Some(9091),
            ready,
            terminating,
            started_ms: Some(started_ms),
        }
    }

    #[test]
    fn two_pods_of_one_profile_on_a_node_yield_one_deterministic_choice() {
        // DaemonSet rollout: the old pod Ready, the new one starting.
        let mut idx = AgentIndex::default();
        idx.apply(overlapping("old", true, false, 1_000));
        idx.apply(overlapping("new", false, false, 2_000));
        let pick = |idx: &AgentIndex| {
            let v = idx.on_node("node-2");
            assert_eq!(v.len(), 1, "{v:?}");
            v[0].uid.clone()
        };
        assert_eq!(pick(&idx), "old", "Ready beats newer");
        // The new pod becomes Ready: the newest Ready pod wins, from now on.
        idx.apply(overlapping("new", true, false, 2_000));
        assert_eq!(pick(&idx), "new");
        // The old pod terminates: still the new one (no flip back).
        idx.apply(overlapping("old", true, true, 1_000));
        assert_eq!(pick(&idx), "new");
        // A terminating pod loses even against a not-Ready one.
        let mut idx = AgentIndex::default();
        idx.apply(overlapping("old", true, true, 1_000));
        idx.apply(overlapping("new", false, false, 2_000));
        assert_eq!(pick(&idx), "new");
    }

    #[test]
    fn terminating_and_start_time_come_from_the_pod() {
        let b = builtin_profiles();
        let felix = find(&b, CALICO_FELIX).expect("felix");
        let mut p = calico(None, None);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:10Z".parse().expect("ts"),
        ));
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().expect("ts"),
        ));
        let t = target_from_pod(felix, &p).expect("match");
        assert!(t.terminating);
        assert_eq!(t.started_ms, Some(1_767_225_600_000));
    }
}
