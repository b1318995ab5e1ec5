//! The labels and the field manager on everything the prober creates (probe pods,
//! Services, Leases, Events' objects): the names every part that lists, watches or
//! deletes by label agrees on. A leaf.

/// `app.kubernetes.io/name` label key (value [`APP_NAME`]).
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/component` label key (`probe-target`, `probe-source`, `probe-filler`).
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Prober instance id label key.
pub const LABEL_INSTANCE: &str = "firstpacket.io/instance";
/// Probe id label key.
pub const LABEL_PROBE_ID: &str = "firstpacket.io/probe-id";
/// Probe kind label key (`cross_node`, …).
pub const LABEL_KIND: &str = "firstpacket.io/kind";
/// Value of [`LABEL_NAME`] on everything the prober creates.
pub const APP_NAME: &str = "firstpacket";
/// Field manager sent on every write: one fixed name, so `metadata.managedFields` names
/// the prober for what it wrote (Kubernetes docs "Server-Side Apply", field management).
pub const FIELD_MANAGER: &str = "firstpacket-prober";
/// Label selector for every pod of one prober instance.
pub fn instance_selector(instance: &str) -> String {
    format!("{LABEL_INSTANCE}={instance}")
}
