//! The Kubernetes API subset of the testbed (docs/design.md §5 "API server").
//!
//! Two layers:
//! - [`Store`]: the in-process object store (etcd + registry logic): objects as
//!   `serde_json::Value` in the real wire shape, one global resourceVersion counter,
//!   a bounded event history for watch resumption (410 Gone when too old), graceful
//!   Pod deletion, namespace termination, ownerReference garbage collection. The
//!   kubelet, the scheduler and the daemon use it directly.
//! - [`router`] / [`serve`]: the axum HTTP front end real clients (kube-rs, kubectl)
//!   talk to: discovery, CRUD, watch, label/field selectors, Table responses, PATCH
//!   (merge, strategic-merge, JSON patch, apply), `Status` errors, and the `pods/log`,
//!   `pods/proxy` ([`proxy`]) and `serviceaccounts/token` subresources.
//!
//! Kinds ([`Kind::ALL`]): Namespaces (labelled `kubernetes.io/metadata.name`), Nodes,
//! Pods, core/v1 and events.k8s.io/v1 Events, Services, EndpointSlices, Leases,
//! Deployments, Jobs, ServiceAccounts, ConfigMaps, NetworkPolicies (validated like
//! kube-apiserver, not enforced).
//!
//! What real kubectl sends and needs was observed on the wire (the e2e tests run it);
//! real response shapes are in `prober/tests/fixtures/k8s-*.json*`.

mod discovery;
mod error;
mod http;
mod kind;
mod network_policy;
mod patch;
pub mod pod_security;
pub mod proxy;
pub mod selector;
mod server;
mod service;
mod store;
pub mod table;

pub use error::ApiError;
pub use http::{router, serve};
pub use kind::Kind;
pub use patch::{apply_json_patch, merge_patch, strategic_merge_patch};
pub use proxy::DirectProxy;
pub use server::{serve_router_tls, serve_tls, ApiServer, Binder};
pub use service::{service_cidr, DEFAULT_SERVICE_CIDR, NODE_PORT_RANGE};
pub use store::{
    now, rfc3339_now, LogQuery, LogSource, LogStream, PersistError, ProxyFuture, ProxyRequest,
    ProxyResponse, ProxySource, Store, StoreEvent, StoreSnapshot, WatchEventType, WatchStart,
    DEFAULT_HISTORY, NAMESPACE_NAME_LABEL, NODE_TOKEN, SERVICE_ACCOUNT_MOUNT, SNAPSHOT_FILE,
    WAL_FILE,
};

/// `gitVersion` the testbed API server reports on `/version`.
pub const GIT_VERSION: &str = "v1.32.4-firstpacket-testbed";
