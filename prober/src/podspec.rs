//! Probe pod manifests (docs/design.md §2 steps 2 and 4, §6 labels and pod-spec contract). Pure.
//!
//! Both pods run the `--image` (target-server) with **args only** — the image's
//! entrypoint is its binary (docs/design.md §6) — and a readiness probe on `/readyz` with
//! `periodSeconds: 1`, `failureThreshold: 1`, so `Ready` turns `True` at the first
//! passing kubelet probe. `restartPolicy: Never`, `terminationGracePeriodSeconds: 1`,
//! `terminationMessagePolicy: FallbackToLogsOnError` (the source's JSON report is read
//! from the termination message), and `activeDeadlineSeconds` =
//! 2 × give-up + hold + 60 s so a killed prober never leaks a running pod
//! (<https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/>).
//! Placement is a required node affinity with `matchFields` on `metadata.name` (the
//! node's name itself, as the DaemonSet controller pins its pods:
//! `ReplaceDaemonSetPodNodeNameNodeAffinity`, pkg/controller/daemon/util), not the
//! `kubernetes.io/hostname` label, which differs from the node name under
//! `--hostname-override` and on some cloud providers. The pods still go through the
//! scheduler (taints, cordon) like real workloads.
//!
//! The spec passes the Pod Security Standard `restricted`
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>): pod
//! `securityContext` `runAsNonRoot: true`, `runAsUser`/`runAsGroup`
//! [`PROBE_UID`]/[`PROBE_GID`] (65532, the conventional "nonroot" UID of distroless
//! images), `seccompProfile: RuntimeDefault`; container `securityContext`
//! `allowPrivilegeEscalation: false`, `capabilities.drop: [ALL]`,
//! `readOnlyRootFilesystem: true` (target-server writes only its termination message,
//! `/dev/termination-log`, which the kubelet mounts writable), `privileged: false`.
//! Resources: requests `cpu` [`CPU_REQUEST`], `memory` [`MEMORY_REQUEST`], limit
//! `memory` [`MEMORY_LIMIT`] (no CPU limit: CFS throttling would distort the timing).
//! `automountServiceAccountToken: false`, `enableServiceLinks: false`. Annotations keep
//! meshes and the cluster autoscaler away ([`probe_annotations`]): no sidecar may stand
//! between the probe and the network, and a probe pod never blocks a scale-down.

use crate::schedule::TolerationSpec;
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    LocalObjectReference, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, Pod, PodSecurityContext, PodSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha1::{Digest, Sha1};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::labels::{
    APP_NAME, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_KIND, LABEL_NAME, LABEL_PROBE_ID,
};

/// Container name in probe pods.
pub const CONTAINER_NAME: &str = "target-server";
/// Port target-server listens on in both pods.
pub const SERVER_PORT: i32 = 8080;
/// Margin added to `activeDeadlineSeconds` beyond 2 × give-up + hold.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(60);
/// `runAsUser` of probe pods: 65532, the "nonroot" user of distroless
/// images; any non-zero UID passes `restricted`, target-server needs no file of its own.
pub const PROBE_UID: i64 = 65532;
/// `runAsGroup` of probe pods.
pub const PROBE_GID: i64 = 65532;
/// CPU request of the probe container (10 millicores: target-server idles between
/// dials; a burst of fillers must still fit small nodes).
pub const CPU_REQUEST: &str = "10m";
/// Memory request of the probe container.
pub const MEMORY_REQUEST: &str = "16Mi";
/// Memory limit of the probe container (target-server stays well below: a few
/// connections in flight and a ≤ 3 KB report).
pub const MEMORY_LIMIT: &str = "64Mi";
/// Field key of the node-name pinning (`matchFields`; the only field Kubernetes
/// supports there).
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// Which pod of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRole {
    /// T: `target-server serve`.
    Target,
    /// S: `target-server probe`.
    Source,
    /// A `burst` filler: `target-server serve`, created with T on its node.
    Filler,
    /// A `policy` probe's intruder: `target-server probe` dialing T from its first
    /// instant, admitted by no policy (issue 32).
    Intruder,
}

impl PodRole {
    /// The `app.kubernetes.io/component` value.
    pub fn component(self) -> &'static str {
        match self {
            PodRole::Target => "probe-target",
            PodRole::Source => "probe-source",
            PodRole::Filler => "probe-filler",
            PodRole::Intruder => "probe-intruder",
        }
    }

    /// Pod-name suffix (`t` / `s`).
    pub fn suffix(self) -> &'static str {
        match self {
            PodRole::Target => "t",
            PodRole::Source => "s",
            PodRole::Filler => "f",
            PodRole::Intruder => "i",
        }
    }
}

/// Everything a probe pod manifest depends on besides the probe itself.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// Namespace the pods go to.
    pub namespace: String,
    /// target-server image.
    pub image: String,
    /// Prober instance id (`gate-xxxxxxxx`).
    pub instance: String,
    /// From `--toleration`.
    pub tolerations: Vec<TolerationSpec>,
    /// From `--image-pull-secret`.
    pub image_pull_secrets: Vec<String>,
    /// From `--priority-class`.
    pub priority_class: Option<String>,
    /// Source attempt spacing (`--dial-interval`).
    pub dial_interval: Duration,
    /// Per-attempt timeout.
    pub attempt_timeout: Duration,
    /// Source gives up after this long without success.
    pub give_up: Duration,
    /// Hold after the first success.
    pub hold: Duration,
    /// Owner (the prober pod) when running in-cluster.
    pub owner: Option<OwnerReference>,
    /// Test hook (hidden `--unsafe-probe-pod-privileged`): the container runs
    /// `privileged`, so the spec violates Pod Security `baseline` and `restricted` and a
    /// test can provoke an admission rejection. Never for real use.
    pub unsafe_privileged: bool,
    /// `--isolation-window`: how long a `policy` probe's intruder dials (issue 32).
    pub isolation_window: Duration,
    /// `--protocols`, `--payload`, `--ip-families` ([`crate::paths`], issue 33).
    pub paths: crate::paths::PathsConfig,
}

impl PodConfig {
    /// The configuration both `gate` and `run` derive from the shared flags
    /// ([`crate::config::ProbeArgs`]): namespace, image, tolerations, pull secrets,
    /// priority class and the source's timing, plus the caller's `instance`, `hold`
    /// (mode-specific default) and `owner` (the prober pod in-cluster, else `None`).
    pub fn from_args(
        p: &crate::config::ProbeArgs,
        instance: &str,
        hold: Duration,
        owner: Option<OwnerReference>,
    ) -> PodConfig {
        PodConfig {
            namespace: p.namespace.clone(),
            image: p.image.clone(),
            instance: instance.to_owned(),
            tolerations: p.toleration.clone(),
            image_pull_secrets: p.image_pull_secret.clone(),
            priority_class: p.priority_class.clone(),
            dial_interval: p.dial_interval,
            attempt_timeout: p.attempt_timeout,
            give_up: p.give_up,
            hold,
            owner,
            unsafe_privileged: p.unsafe_probe_pod_privileged,
            isolation_window: p.isolation_window,
            paths: crate::paths::PathsConfig::new(&p.protocols, p.payload, &p.ip_families),
        }
    }
}

/// Pod name of one probe's pod: `fp-<probe id>-t` / `fp-<probe id>-s`.
pub fn pod_name(probe_id: &str, role: PodRole) -> String {
    format!("fp-{probe_id}-{}", role.suffix())
}

/// Name of filler `i` (0-based) of a `burst` probe: `fp-<probe id>-f<i>`.
pub fn filler_pod_name(probe_id: &str, i: u32) -> String {
    format!("fp-{probe_id}-f{i}")
}

/// Longest pod name used for a stable-name `recreate` target: pod names become the
/// pod's hostname, and Kubernetes truncates hostnames to 63 characters (a DNS label,
/// RFC 1123), so longer names would not be visible as they are inside the pod.
pub const MAX_STABLE_NAME: usize = 63;

/// The stable name of the `recreate` target on `node` for prober `instance`:
/// `fp-<instance suffix>-rc-<node>` (the suffix is the part after the last `-`, as in
/// probe ids). The name is the same every time the target is recreated by this
/// instance, so a Calico-like CNI reuses the interface name (`cali` + SHA-1 of
/// `namespace.pod`), which is the point of the kind (calico#11016). When the node name
/// has characters a pod name cannot carry (only `a-z0-9.-`) or the result would exceed
/// [`MAX_STABLE_NAME`], the node part is the first 10 hex characters of SHA-1(node).
pub fn recreate_target_name(instance: &str, node: &str) -> String {
    let suffix = instance.rsplit('-').next().unwrap_or(instance);
    let plain = format!("fp-{suffix}-rc-{node}");
    let ok_chars = node
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    let ok_ends = node
        .chars()
        .last()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if ok_chars && ok_ends && plain.len() <= MAX_STABLE_NAME {
        return plain;
    }
    let digest = Sha1::digest(node.as_bytes());
    let hex: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    format!("fp-{suffix}-rc-{hex}")
}

/// `activeDeadlineSeconds` = ceil(2 × give-up + hold + 60 s), in whole seconds.
pub fn active_deadline_seconds(give_up: Duration, hold: Duration) -> i64 {
    let total = give_up * 2 + hold + DEADLINE_MARGIN;
    let secs = total.as_secs() + u64::from(total.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// A duration as a target-server flag value: whole seconds as `60s`, else milliseconds
/// (`100ms`, `1500ms`); both are humantime syntax, which target-server parses.
pub fn duration_arg(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Calico's host-side interface name for a pod: `cali` + the first 11 hex characters of
/// SHA-1(`<namespace>.<pod>`) (libcalico-go `lib/names/names.go`,
/// `VethNameForWorkload`). The testbed names its veths the same way (docs/design.md §5).
pub fn calico_iface_name(namespace: &str, pod: &str) -> String {
    let digest = Sha1::digest(format!("{namespace}.{pod}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("cali{}", &hex[..11])
}

/// The five labels of docs/design.md §6 for one probe pod.
pub fn probe_labels(
    instance: &str,
    probe_id: &str,
    kind: &str,
    role: PodRole,
) -> BTreeMap<String, String> {
    [
        (LABEL_NAME, APP_NAME),
        (LABEL_COMPONENT, role.component()),
        (LABEL_INSTANCE, instance),
        (LABEL_PROBE_ID, probe_id),
        (LABEL_KIND, kind),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Args of the target container: `serve --port 8080`.
pub fn target_args() -> Vec<String> {
    ["serve", "--port", "8080"].map(String::from).to_vec()
}

/// `host:port`, with an IPv6 address in brackets (`[fd00::5]:8080`, RFC 3986 §3.2.2), as
/// `std::net::SocketAddr` parses it. `host` is an IP address or a name; anything with a
/// `:` is taken for IPv6 (an already bracketed host is kept as it is).
pub fn host_port(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Args of the source container (`target-server probe`, docs/design.md §6 flags), dialing
/// `<target_ip>:8080` ([`SERVER_PORT`]; `[ip]:8080` for IPv6, [`host_port`]).
pub fn source_args(cfg: &PodConfig, target_ip: &str, target_pod: &str) -> Vec<String> {
    source_args_to(cfg, &host_port(target_ip, SERVER_PORT), target_pod)
}

/// Args of the source container dialing `target_addr` (`IP:port`, e.g. a ClusterIP
/// and [`SERVICE_PORT`] for `service` probes); `--expect-pod target_pod` makes the
/// source count only answers from that pod (docs/design.md §6 target-server flags).
pub fn source_args_to(cfg: &PodConfig, target_addr: &str, target_pod: &str) -> Vec<String> {
    vec![
        "probe".into(),
        "--target".into(),
        target_addr.into(),
        "--expect-pod".into(),
        target_pod.into(),
        "--interval".into(),
        duration_arg(cfg.dial_interval),
        "--attempt-timeout".into(),
        duration_arg(cfg.attempt_timeout),
        "--give-up".into(),
        duration_arg(cfg.give_up),
        "--hold".into(),
        duration_arg(cfg.hold),
    ]
}

fn value_env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.to_string(),
            }),
            ..Default::default()
        }),
    }
}

/// Annotations of every probe pod: `sidecar.istio.io/inject: "false"`,
/// `linkerd.io/inject: disabled` (no mesh proxy between the probe and the network; the
/// mesh would also delay Ready and intercept the dials), and
/// `cluster-autoscaler.kubernetes.io/safe-to-evict: "true"` (a probe pod never blocks a
/// node scale-down; it is short-lived and the probe ends on its deletion).
pub fn probe_annotations() -> BTreeMap<String, String> {
    [
        ("sidecar.istio.io/inject", "false"),
        ("linkerd.io/inject", "disabled"),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Required node affinity pinning a pod to the node named `node`: one term with
/// `matchFields` `metadata.name In [node]` (module docs).
pub fn node_name_affinity(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: NODE_NAME_FIELD.into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_string()]),
                    }]),
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod-level `securityContext` (module docs: `restricted`).
fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(PROBE_UID),
        run_as_group: Some(PROBE_GID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// The container `securityContext`: `restricted` (module docs), or with `privileged`
/// (the test hook [`PodConfig::unsafe_privileged`]) a privileged container that keeps
/// its capabilities and may escalate.
fn container_security_context(privileged: bool) -> SecurityContext {
    if privileged {
        return SecurityContext {
            privileged: Some(true),
            ..Default::default()
        };
    }
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        ..Default::default()
    }
}

fn resources() -> ResourceRequirements {
    let q = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    };
    ResourceRequirements {
        requests: Some(q(&[("cpu", CPU_REQUEST), ("memory", MEMORY_REQUEST)])),
        limits: Some(q(&[("memory", MEMORY_LIMIT)])),
        ..Default::default()
    }
}

/// Builds one probe pod.
///
/// `role` picks name suffix, component label and args (`target_args()` or
/// `source_args(cfg, target_ip, target_pod)` — pass the latter in `args`). The pod is
/// pinned to `node` by [`node_name_affinity`] and passes `restricted` (module docs).
pub fn probe_pod(
    cfg: &PodConfig,
    probe_id: &str,
    kind: &str,
    role: PodRole,
    node: &str,
    args: Vec<String>,
) -> Pod {
    probe_pod_named(
        cfg,
        &pod_name(probe_id, role),
        probe_id,
        kind,
        role,
        node,
        args,
    )
}

/// [`probe_pod`] with an explicit pod `name` (the stable `recreate` target, `burst`
/// fillers); labels, placement and spec are the same.
pub fn probe_pod_named(
    cfg: &PodConfig,
    name: &str,
    probe_id: &str,
    kind: &str,
    role: PodRole,
    node: &str,
    args: Vec<String>,
) -> Pod {
    let name = name.to_string();
    let readiness = Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/readyz".into()),
            port: IntOrString::Int(SERVER_PORT),
            scheme: Some("HTTP".into()),
            ..Default::default()
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        success_threshold: Some(1),
        timeout_seconds: Some(1),
        ..Default::default()
    };
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(cfg.image.clone()),
        args: Some(args),
        command: None,
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_IP", "status.podIP"),
            field_env("NODE_NAME", "spec.nodeName"),
            // The programming wait: every probe pod dials its own node from its first
            // instant (target-server's node dial), as often as the source dials its
            // target; env, not args, so an older target-server image ignores them.
            field_env("HOST_IP", "status.hostIP"),
            value_env("FIRSTPACKET_INTERVAL", duration_arg(cfg.dial_interval)),
            value_env(
                "FIRSTPACKET_ATTEMPT_TIMEOUT",
                duration_arg(cfg.attempt_timeout),
            ),
            value_env("FIRSTPACKET_GIVE_UP", duration_arg(cfg.give_up)),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: SERVER_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(readiness),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(container_security_context(cfg.unsafe_privileged)),
        resources: Some(resources()),
        ..Default::default()
    };
    let affinity = node_name_affinity(node);
    let tolerations: Vec<_> = cfg.tolerations.iter().map(TolerationSpec::to_k8s).collect();
    let pull_secrets: Vec<_> = cfg
        .image_pull_secrets
        .iter()
        .map(|s| LocalObjectReference { name: s.clone() })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(probe_labels(&cfg.instance, probe_id, kind, role)),
            annotations: Some(probe_annotations()),
            owner_references: cfg.owner.clone().map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            affinity: Some(affinity),
            security_context: Some(pod_security_context()),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(1),
            active_deadline_seconds: Some(active_deadline_seconds(cfg.give_up, cfg.hold)),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            tolerations: (!tolerations.is_empty()).then_some(tolerations),
            image_pull_secrets: (!pull_secrets.is_empty()).then_some(pull_secrets),
            priority_class_name: cfg.priority_class.clone(),
            ..Default::default()
        }),
        status: None,
    }
}

/// Port of a `service` probe's ClusterIP Service; it forwards to [`SERVER_PORT`] on the
/// target (docs/design.md §2 kinds, issue 5).
pub const SERVICE_PORT: i32 = 80;

/// `app.kubernetes.io/component` of a `service` probe's Service object.
pub const SERVICE_COMPONENT: &str = "probe-service";

/// Name of a `service` probe's ClusterIP Service: `fp-<probe id>-svc`.
pub fn service_name(probe_id: &str) -> String {
    format!("fp-{probe_id}-svc")
}

/// The ClusterIP Service of a `service` probe (docs/design.md §2 kinds, issue 5): named
/// [`service_name`], the five labels of docs/design.md §6 (component [`SERVICE_COMPONENT`]),
/// selector `firstpacket.io/instance`, `firstpacket.io/probe-id=<id>` and component
/// `probe-target`, so it selects exactly this probe's fresh target T; one TCP port
/// `http` 80 → targetPort 8080. `clusterIP` is left to the API server to allocate
/// (<https://kubernetes.io/docs/concepts/services-networking/service/>).
pub fn probe_service(cfg: &PodConfig, probe_id: &str, kind: &str) -> Service {
    let mut labels = probe_labels(&cfg.instance, probe_id, kind, PodRole::Target);
    labels.insert(LABEL_COMPONENT.into(), SERVICE_COMPONENT.into());
    let selector: BTreeMap<String, String> = [
        (LABEL_INSTANCE, cfg.instance.as_str()),
        (LABEL_PROBE_ID, probe_id),
        (LABEL_COMPONENT, PodRole::Target.component()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(probe_id)),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(labels),
            owner_references: cfg.owner.clone().map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: SERVICE_PORT,
                target_port: Some(IntOrString::Int(SERVER_PORT)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Removes the containers' readiness probes (kind `unprobed`: Ready then means only
/// that the containers started; Kubernetes docs "Pod Lifecycle", container probes).
pub fn drop_readiness_probe(pod: &mut Pod) {
    if let Some(spec) = pod.spec.as_mut() {
        for c in &mut spec.containers {
            c.readiness_probe = None;
        }
    }
}

/// The target pod T of a probe on `node`.
pub fn target_pod(cfg: &PodConfig, probe_id: &str, kind: &str, node: &str) -> Pod {
    probe_pod(cfg, probe_id, kind, PodRole::Target, node, target_args())
}

/// The source pod S of a probe on `node`, dialing `target_ip:8080` and expecting
/// `target_pod` to answer.
pub fn source_pod(
    cfg: &PodConfig,
    probe_id: &str,
    kind: &str,
    node: &str,
    target_ip: &str,
    target_pod: &str,
) -> Pod {
    let args = source_args(cfg, target_ip, target_pod);
    probe_pod(cfg, probe_id, kind, PodRole::Source, node, args)
}

/// Filler `i` of a `burst` probe on `node` (`target-server serve`, component
/// `probe-filler`).
pub fn filler_pod(cfg: &PodConfig, probe_id: &str, kind: &str, node: &str, i: u32) -> Pod {
    probe_pod_named(
        cfg,
        &filler_pod_name(probe_id, i),
        probe_id,
        kind,
        PodRole::Filler,
        node,
        target_args(),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn service_selects_only_this_probes_target_and_maps_80_to_8080() {
        let cfg = cfg();
        let svc = probe_service(&cfg, "ab12-3", "service");
        assert_eq!(svc.metadata.name.as_deref(), Some("fp-ab12-3-svc"));
        let labels = svc.metadata.labels.clone().expect("labels");
        assert_eq!(labels[LABEL_COMPONENT], SERVICE_COMPONENT);
        assert_eq!(labels[LABEL_KIND], "service");
        assert_eq!(labels[LABEL_INSTANCE], cfg.instance);
        let spec = svc.spec.expect("spec");
        let sel = spec.selector.expect("selector");
        let target = probe_pod(
            &cfg,
            "ab12-3",
            "service",
            PodRole::Target,
            "n1",
            target_args(),
        );
        let source = probe_pod(&cfg, "ab12-3", "service", PodRole::Source, "n1", vec![]);
        let other = probe_pod(
            &cfg,
            "ab12-4",
            "service",
            PodRole::Target,
            "n1",
            target_args(),
        );
        let matches = |p: &Pod| {
            let l = p.metadata.labels.clone().unwrap_or_default();
            sel.iter().all(|(k, v)| l.get(k) == Some(v))
        };
        assert!(matches(&target));
        assert!(!matches(&source), "the source must not be an endpoint");
        assert!(
            !matches(&other),
            "another probe's target must not be an endpoint"
        );
        let ports = spec.ports.expect("ports");
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].port, 80);
        assert_eq!(ports[0].target_port, Some(IntOrString::Int(8080)));
        let args = source_args_to(&cfg, "10.96.0.7:80", "fp-ab12-3-t");
        assert_eq!(args[2], "10.96.0.7:80");
        assert_eq!(args[4], "fp-ab12-3-t");
    }

    #[test]
    fn recreate_name_is_stable_per_instance_and_node_and_fits_a_hostname() {
        let a = recreate_target_name("gate-ab12cd34", "node-2");
        assert_eq!(a, "fp-ab12cd34-rc-node-2");
        assert_eq!(a, recreate_target_name("gate-ab12cd34", "node-2"));
        assert_ne!(a, recreate_target_name("gate-ab12cd34", "node-3"));
        assert_ne!(a, recreate_target_name("gate-zz12cd34", "node-2"));
        let long = "ip-10-0-1-23.eu-west-1.compute.internal.example.long-suffix";
        let n = recreate_target_name("gate-ab12cd34", long);
        assert!(n.len() <= MAX_STABLE_NAME, "{n}");
        assert_eq!(n, recreate_target_name("gate-ab12cd34", long));
        assert!(n.starts_with("fp-ab12cd34-rc-") && n.len() == 25, "{n}");
        let upper = recreate_target_name("gate-ab12cd34", "Node_A");
        assert!(upper
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
    }

    #[test]
    fn filler_pod_is_a_pinned_server_with_the_filler_component() {
        let pod = filler_pod(&cfg(), "p7", "burst", "node-3", 4);
        assert_eq!(pod.metadata.name.as_deref(), Some("fp-p7-f4"));
        let labels = pod.metadata.labels.clone().expect("labels");
        assert_eq!(labels[LABEL_COMPONENT], "probe-filler");
        assert_eq!(labels[LABEL_KIND], "burst");
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.containers[0].args.as_deref(), Some(&target_args()[..]));
        let term = &spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .expect("affinity")
            .node_selector_terms[0];
        let vals = term.match_fields.as_ref().expect("fields")[0]
            .values
            .clone();
        assert_eq!(vals, Some(vec!["node-3".to_string()]));
    }

    /// A probe pod configuration with every optional field set (also the NetworkPolicy
    /// builders' tests, `crate::netpol`).
    pub(crate) fn cfg() -> PodConfig {
        PodConfig {
            namespace: "firstpacket".into(),
            image: "ghcr.io/firstpacket/target-server:0.1.0".into(),
            instance: "gate-abcd1234".into(),
            tolerations: vec!["dedicated=net:NoSchedule".parse().expect("tol")],
            image_pull_secrets: vec!["regcred".into()],
            priority_class: Some("high".into()),
            dial_interval: Duration::from_millis(100),
            attempt_timeout: Duration::from_millis(900),
            give_up: Duration::from_secs(60),
            hold: Duration::from_secs(5),
            owner: None,
            unsafe_privileged: false,
            isolation_window: crate::netpol::DEFAULT_ISOLATION_WINDOW,
            paths: Default::default(),
        }
    }

    #[test]
    fn probe_pods_pass_pod_security_restricted_and_keep_meshes_away() {
        for pod in [
            target_pod(&cfg(), "p1", "cross_node", "n1"),
            source_pod(&cfg(), "p1", "cross_node", "n2", "10.0.0.1", "fp-p1-t"),
            filler_pod(&cfg(), "p1", "burst", "n1", 0),
        ] {
            let v = serde_json::to_value(&pod).expect("json");
            let psc = &v["spec"]["securityContext"];
            assert_eq!(psc["runAsNonRoot"], true, "{psc}");
            assert_eq!(psc["runAsUser"], 65532);
            assert_eq!(psc["runAsGroup"], 65532);
            assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
            let c = &v["spec"]["containers"][0];
            let sc = &c["securityContext"];
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
            assert_eq!(sc["privileged"], false);
            assert_eq!(sc["readOnlyRootFilesystem"], true);
            assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
            assert!(sc["capabilities"].get("add").is_none());
            // restricted forbids hostPath volumes, host namespaces and host ports.
            assert!(v["spec"].get("volumes").is_none());
            assert!(v["spec"].get("hostNetwork").is_none());
            assert!(c["ports"][0].get("hostPort").is_none());
            assert_eq!(c["resources"]["requests"]["cpu"], "10m");
            assert_eq!(c["resources"]["requests"]["memory"], "16Mi");
            assert_eq!(c["resources"]["limits"]["memory"], "64Mi");
            assert!(c["resources"]["limits"].get("cpu").is_none());
            assert_eq!(v["spec"]["automountServiceAccountToken"], false);
            let a = &v["metadata"]["annotations"];
            assert_eq!(a["sidecar.istio.io/inject"], "false");
            assert_eq!(a["linkerd.io/inject"], "disabled");
            assert_eq!(a["cluster-autoscaler.kubernetes.io/safe-to-evict"], "true");
        }
    }

    #[test]
    fn unsafe_privileged_hook_makes_the_container_privileged() {
        let mut c = cfg();
        c.unsafe_privileged = true;
        let v = serde_json::to_value(target_pod(&c, "p1", "cross_node", "n1")).expect("json");
        let sc = &v["spec"]["containers"][0]["securityContext"];
        assert_eq!(sc["privileged"], true, "{sc}");
        // allowPrivilegeEscalation=false with privileged=true is invalid (API validation).
        assert!(sc.get("allowPrivilegeEscalation").is_none(), "{sc}");
    }

    #[test]
    fn host_port_brackets_ipv6_only() {
        assert_eq!(host_port("fd00::5", 8080), "[fd00::5]:8080");
        assert_eq!(host_port("10.0.1.5", 8080), "10.0.1.5:8080");
        assert_eq!(host_port("[fd00::5]", 80), "[fd00::5]:80");
        assert_eq!(host_port("node-1.example", 9090), "node-1.example:9090");
        let a: std::net::SocketAddr = host_port("fd00::5", 8080).parse().expect("parses");
        assert_eq!(a.port(), 8080);
        let args = source_args(&cfg(), "fd00:10::7", "fp-p1-t");
        assert_eq!(args[2], "[fd00:10::7]:8080");
    }

    #[test]
    fn target_pod_carries_design_labels_affinity_and_args_only() {
        let pod = target_pod(&cfg(), "abcd1234-0", "cross_node", "node-2");
        assert_eq!(pod.metadata.name.as_deref(), Some("fp-abcd1234-0-t"));
        let labels = pod.metadata.labels.clone().expect("labels");
        assert_eq!(labels[LABEL_NAME], "firstpacket");
        assert_eq!(labels[LABEL_COMPONENT], "probe-target");
        assert_eq!(labels[LABEL_INSTANCE], "gate-abcd1234");
        assert_eq!(labels[LABEL_PROBE_ID], "abcd1234-0");
        assert_eq!(labels[LABEL_KIND], "cross_node");
        let spec = pod.spec.expect("spec");
        let c = &spec.containers[0];
        assert!(c.command.is_none());
        assert_eq!(c.args.as_deref(), Some(&target_args()[..]));
        assert_eq!(
            c.image.as_deref(),
            Some("ghcr.io/firstpacket/target-server:0.1.0")
        );
        let term = &spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .expect("required affinity")
            .node_selector_terms[0];
        assert!(term.match_expressions.is_none(), "no hostname label");
        let req = &term.match_fields.as_ref().expect("matchFields")[0];
        assert_eq!(req.key, "metadata.name");
        assert_eq!(req.operator, "In");
        assert_eq!(req.values.as_deref(), Some(&["node-2".to_string()][..]));
        assert!(spec.node_name.is_none(), "must go through the scheduler");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.active_deadline_seconds, Some(2 * 60 + 5 + 60));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.termination_grace_period_seconds, Some(1));
        let rp = c.readiness_probe.as_ref().expect("readiness");
        assert_eq!(rp.period_seconds, Some(1));
        assert_eq!(rp.failure_threshold, Some(1));
        let get = rp.http_get.as_ref().expect("httpGet");
        assert_eq!(get.path.as_deref(), Some("/readyz"));
        assert_eq!(get.port, IntOrString::Int(8080));
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
        let env: Vec<_> = c
            .env
            .iter()
            .flatten()
            .map(|e| {
                let path = e
                    .value_from
                    .as_ref()
                    .and_then(|v| v.field_ref.as_ref())
                    .map(|f| f.field_path.clone());
                (e.name.clone(), path)
            })
            .collect();
        assert!(env.contains(&("POD_IP".into(), Some("status.podIP".into()))));
        assert!(env.contains(&("NODE_NAME".into(), Some("spec.nodeName".into()))));
        let tol = &spec.tolerations.expect("tolerations")[0];
        assert_eq!(tol.key.as_deref(), Some("dedicated"));
        assert_eq!(tol.operator.as_deref(), Some("Equal"));
        assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
        assert_eq!(spec.image_pull_secrets.expect("secrets")[0].name, "regcred");
    }

    #[test]
    fn source_pod_args_come_from_flags() {
        let mut c = cfg();
        c.dial_interval = Duration::from_millis(250);
        c.hold = Duration::from_millis(1500);
        let pod = source_pod(&c, "p1", "cross_node", "node-1", "10.0.1.5", "fp-p1-t");
        assert_eq!(pod.metadata.name.as_deref(), Some("fp-p1-s"));
        let labels = pod.metadata.labels.clone().expect("labels");
        assert_eq!(labels[LABEL_COMPONENT], "probe-source");
        let spec = pod.spec.expect("spec");
        let args = spec.containers[0].args.clone().expect("args");
        assert_eq!(
            args,
            [
                "probe",
                "--target",
                "10.0.1.5:8080",
                "--expect-pod",
                "fp-p1-t",
                "--interval",
                "250ms",
                "--attempt-timeout",
                "900ms",
                "--give-up",
                "60s",
                "--hold",
                "1500ms"
            ]
        );
        assert!(spec.containers[0].command.is_none());
        assert_eq!(spec.active_deadline_seconds, Some(120 + 2 + 60));
    }

    #[test]
    fn pod_serialises_without_command_and_with_camel_case_fields() {
        let pod = target_pod(&cfg(), "x", "cross_node", "n");
        let v = serde_json::to_value(&pod).expect("json");
        let c = &v["spec"]["containers"][0];
        assert!(c.get("command").is_none());
        assert_eq!(v["spec"]["activeDeadlineSeconds"], 185);
        assert_eq!(c["readinessProbe"]["periodSeconds"], 1);
    }

    #[test]
    fn calico_iface_name_matches_sha1_of_namespace_dot_pod() {
        // `printf 'default.web-0' | sha1sum` = 0d7763386da219ddff1f…
        let name = calico_iface_name("default", "web-0");
        assert_eq!(name, "cali0d7763386da");
        assert_ne!(name, calico_iface_name("default", "web-1"));
        assert_eq!(name, calico_iface_name("default", "web-0"));
    }

    #[test]
    fn deadline_rounds_up_partial_seconds() {
        assert_eq!(
            active_deadline_seconds(Duration::from_millis(1500), Duration::from_millis(1)),
            64
        );
    }
}
