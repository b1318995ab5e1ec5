//! The resource kinds the testbed API server stores, with their REST names.

use serde::{Deserialize, Serialize};

/// A stored resource kind. Names, groups, short names and scopes are those of the real
/// API (`kubectl api-resources` on v1.32).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// core/v1 Namespace (cluster-scoped).
    Namespace,
    /// core/v1 Node (cluster-scoped).
    Node,
    /// core/v1 Pod.
    Pod,
    /// core/v1 Event.
    Event,
    /// core/v1 Service (stored only; no ClusterIP allocation).
    Service,
    /// discovery.k8s.io/v1 EndpointSlice (stored only).
    EndpointSlice,
    /// coordination.k8s.io/v1 Lease (stored only).
    Lease,
    /// events.k8s.io/v1 Event (what kube-rs' `Recorder` writes). Stored apart from
    /// core/v1 Events (kube-apiserver converts between the two; not done here).
    EventsV1,
    /// apps/v1 Deployment (reconciled by [`crate::controllers`]).
    Deployment,
    /// batch/v1 Job (reconciled by [`crate::controllers`]).
    Job,
    /// core/v1 ServiceAccount (`default` in every namespace; `token` subresource).
    ServiceAccount,
    /// core/v1 ConfigMap (`kube-root-ca.crt` in every namespace).
    ConfigMap,
    /// networking.k8s.io/v1 NetworkPolicy (stored and validated; nothing enforces it).
    NetworkPolicy,
}

impl Kind {
    /// Every kind, in discovery order.
    pub const ALL: [Kind; 13] = [
        Kind::Namespace,
        Kind::Node,
        Kind::Pod,
        Kind::Event,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Lease,
        Kind::EventsV1,
        Kind::Deployment,
        Kind::Job,
        Kind::ServiceAccount,
        Kind::ConfigMap,
        Kind::NetworkPolicy,
    ];

    /// The `kind` field, e.g. `Pod`.
    pub fn kind_name(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Event => "Event",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Lease => "Lease",
            Kind::EventsV1 => "Event",
            Kind::Deployment => "Deployment",
            Kind::Job => "Job",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::ConfigMap => "ConfigMap",
            Kind::NetworkPolicy => "NetworkPolicy",
        }
    }

    /// The REST resource name (plural), e.g. `pods`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Namespace => "namespaces",
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::Event => "events",
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::Lease => "leases",
            Kind::EventsV1 => "events",
            Kind::Deployment => "deployments",
            Kind::Job => "jobs",
            Kind::ServiceAccount => "serviceaccounts",
            Kind::ConfigMap => "configmaps",
            Kind::NetworkPolicy => "networkpolicies",
        }
    }

    /// The singular name, e.g. `pod`.
    pub fn singular(self) -> &'static str {
        match self {
            Kind::Namespace => "namespace",
            Kind::Node => "node",
            Kind::Pod => "pod",
            Kind::Event => "event",
            Kind::Service => "service",
            Kind::EndpointSlice => "endpointslice",
            Kind::Lease => "lease",
            Kind::EventsV1 => "event",
            Kind::Deployment => "deployment",
            Kind::Job => "job",
            Kind::ServiceAccount => "serviceaccount",
            Kind::ConfigMap => "configmap",
            Kind::NetworkPolicy => "networkpolicy",
        }
    }

    /// API group (`""` for core).
    pub fn group(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io",
            Kind::Lease => "coordination.k8s.io",
            Kind::EventsV1 => "events.k8s.io",
            Kind::Deployment => "apps",
            Kind::Job => "batch",
            Kind::NetworkPolicy => "networking.k8s.io",
            _ => "",
        }
    }

    /// API version within the group (always `v1` here).
    pub fn version(self) -> &'static str {
        "v1"
    }

    /// The `apiVersion` field, e.g. `v1` or `discovery.k8s.io/v1`.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::Lease => "coordination.k8s.io/v1",
            Kind::EventsV1 => "events.k8s.io/v1",
            Kind::Deployment => "apps/v1",
            Kind::Job => "batch/v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
            _ => "v1",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::Node)
    }

    /// kubectl short names (discovery `shortNames`; needed for `kubectl get po`).
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::Namespace => &["ns"],
            Kind::Node => &["no"],
            Kind::Pod => &["po"],
            Kind::Event => &["ev"],
            Kind::Service => &["svc"],
            Kind::Deployment => &["deploy"],
            Kind::ServiceAccount => &["sa"],
            Kind::ConfigMap => &["cm"],
            Kind::NetworkPolicy => &["netpol"],
            Kind::EndpointSlice | Kind::Lease | Kind::EventsV1 | Kind::Job => &[],
        }
    }

    /// Discovery `categories` (`all` makes `kubectl get all` include the kind).
    pub fn categories(self) -> &'static [&'static str] {
        match self {
            Kind::Pod | Kind::Service | Kind::Deployment | Kind::Job => &["all"],
            _ => &[],
        }
    }

    /// Group-qualified resource as kube-apiserver prints it in error messages
    /// (`pods`, `leases.coordination.k8s.io`; k8s.io/apimachinery
    /// `schema.GroupResource.String()`).
    pub fn qualified_resource(self) -> String {
        if self.group().is_empty() {
            self.plural().to_string()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }

    /// The kind served at `group`/`version`/`plural`, if any.
    pub fn from_rest(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.version() == version && k.plural() == plural)
    }
}
