//! The object store: etcd plus the registry logic of kube-apiserver that the testbed
//! needs (metadata defaulting, Pod defaults and validation, graceful deletion,
//! namespace termination, ownerReference GC, watch history).

use super::{ApiError, Kind};
use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use tokio::sync::broadcast;

/// Default length of the watch history ring (events kept for `resourceVersion=N`
/// resumption). kube-apiserver's watch cache keeps a comparable window per resource
/// (`--default-watch-cache-size`, 100 objects, growing with load); older resumes get 410.
pub const DEFAULT_HISTORY: usize = 10_000;

/// Capacity of the live fan-out channel; a watcher that falls further behind is ended
/// (the client resumes from its last resourceVersion, as after a server-side timeout).
const FANOUT_CAPACITY: usize = 16_384;

/// Namespaces every cluster has from the start (kube-apiserver's
/// `SystemNamespaces` plus `default`).
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Type of a watch event (`ADDED`, `MODIFIED`, `DELETED` on the wire).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum WatchEventType {
    /// Object created (or, for a selector-filtered watch, started matching).
    Added,
    /// Object changed.
    Modified,
    /// Object removed (or stopped matching).
    Deleted,
}

impl WatchEventType {
    /// Wire name: `ADDED`, `MODIFIED`, `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEventType::Added => "ADDED",
            WatchEventType::Modified => "MODIFIED",
            WatchEventType::Deleted => "DELETED",
        }
    }
}

/// One change in the store. `object` is the object after the change (for `Deleted`:
/// its last state, with the deletion's resourceVersion); `old` the object before it
/// (for `Modified`/`Deleted`), used to turn selector transitions into ADDED/DELETED.
#[derive(Clone, Debug)]
pub struct StoreEvent {
    /// Kind of the object.
    pub kind: Kind,
    /// What happened.
    pub ty: WatchEventType,
    /// The object after the change (full wire JSON with kind/apiVersion).
    pub object: Arc<Value>,
    /// The object before the change, if there was one.
    pub old: Option<Arc<Value>>,
    /// resourceVersion of this change (global counter).
    pub rv: u64,
}

impl StoreEvent {
    /// Namespace of the object (`""` for cluster-scoped ones).
    pub fn namespace(&self) -> &str {
        self.object["metadata"]["namespace"].as_str().unwrap_or("")
    }
}

/// What a watch starts with: `initial` events (synthetic ADDED for the current objects,
/// or the replay from the history ring) and a live receiver that continues exactly after
/// `rv` (no gap, no duplicate).
#[derive(Debug)]
pub struct WatchStart {
    /// Events to send first.
    pub initial: Vec<StoreEvent>,
    /// The store's resourceVersion at the moment the receiver was created.
    pub rv: u64,
    /// Live events with resourceVersion > `rv` (all kinds; filter by kind).
    pub rx: broadcast::Receiver<StoreEvent>,
}

/// Serialisable state of a store (seam for persisting across `testbed api restart`,
/// docs/design.md §5: "State and resourceVersions survive an API server restart").
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoreSnapshot {
    /// Last resourceVersion issued.
    pub rv: u64,
    /// Every object with its kind.
    pub objects: Vec<(Kind, Value)>,
}

/// Query of `GET pods/NAME/log` (query parameters of the same names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogQuery {
    /// `tailLines`: only the last N lines.
    pub tail_lines: Option<i64>,
    /// `sinceSeconds`.
    pub since_seconds: Option<i64>,
    /// `limitBytes`.
    pub limit_bytes: Option<i64>,
    /// `timestamps=true`.
    pub timestamps: bool,
    /// `previous=true`: the previous container instance.
    pub previous: bool,
    /// `follow=true` (answered with the current contents; the body then ends).
    pub follow: bool,
}

/// Source of container logs for `pods/NAME/log`, registered by the daemon (kubelet).
pub trait LogSource: Send + Sync {
    /// The log text of `container` in Pod `namespace/pod`, or `None` if the container has
    /// not started (the API then answers 400 `container "c" in pod "p" is waiting to
    /// start: ContainerCreating`, as kube-apiserver does).
    fn read(&self, namespace: &str, pod: &str, container: &str, query: &LogQuery)
        -> Option<String>;

    /// For `follow=true`: the current contents (after the query's tail/since/limit
    /// rules) and then new output as it is written, as chunks of bytes; the stream ends
    /// when the container ends (kubelet semantics of `kubectl logs -f`). `None` when the
    /// container has not started, or when the source cannot follow: the API then answers
    /// with [`LogSource::read`] and ends the body. The default never follows.
    fn follow(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        query: &LogQuery,
    ) -> Option<LogStream> {
        let _ = (namespace, pod, container, query);
        None
    }
}

/// A followed container log: chunks of bytes, ending when the container ends.
pub type LogStream = futures::stream::BoxStream<'static, Vec<u8>>;

/// A `pods/NAME[:PORT]/proxy/PATH` request handed to the [`ProxySource`].
#[derive(Clone, Debug)]
pub struct ProxyRequest {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name (without `:port`).
    pub pod: String,
    /// The port to reach, a number: from `NAME:PORT`, else the pod's first
    /// `containerPort`, else 80 ([`super::proxy::pod_address`]).
    pub port: Option<String>,
    /// The path after `/proxy`, starting with `/`.
    pub path: String,
    /// Raw query string, if any.
    pub query: Option<String>,
    /// HTTP method.
    pub method: String,
    /// Request body.
    pub body: Vec<u8>,
    /// The client's request headers (name, value) as received; a source passes on those
    /// [`super::proxy::forward`] passes on (not hop-by-hop ones, `Host`,
    /// `Authorization`, `Accept-Encoding`).
    pub headers: Vec<(String, String)>,
}

/// The answer of the proxied pod.
#[derive(Clone, Debug)]
pub struct ProxyResponse {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type` to pass on.
    pub content_type: Option<String>,
    /// Body.
    pub body: Vec<u8>,
}

/// Future returned by [`ProxySource::proxy`].
pub type ProxyFuture = BoxFuture<'static, Result<ProxyResponse, ApiError>>;

/// Forwards `pods/NAME:PORT/proxy/PATH` into the pod network; registered by the daemon
/// (without one the API server uses [`super::proxy::DirectProxy`]). The API has already
/// answered 404 for an unknown pod and 400 `address not allowed` for one without a
/// usable IP, and resolved the port.
pub trait ProxySource: Send + Sync {
    /// Forward `req` to the Pod (whose current object is `pod`). An answer, whatever its
    /// status, is passed back as it is; `Err` is answered as a `Status` (503
    /// ServiceUnavailable `error trying to reach service: …` when the pod cannot be
    /// reached, as kube-apiserver).
    fn proxy(&self, pod: &Value, req: ProxyRequest) -> ProxyFuture;
}

type Key = (String, String);

struct Inner {
    rv: u64,
    objects: HashMap<Kind, BTreeMap<Key, Arc<Value>>>,
    history: VecDeque<StoreEvent>,
    /// Highest resourceVersion no longer in `history` (watch resumes from below → 410).
    compacted: u64,
    /// Write-ahead log when the store is persisted ([`Store::load_from`]).
    wal: Option<Wal>,
}

/// File name of the full snapshot in a persistence directory.
pub const SNAPSHOT_FILE: &str = "store.json";
/// File name of the write-ahead log (JSON lines, one per change) in a persistence
/// directory.
pub const WAL_FILE: &str = "store.wal";
/// The write-ahead log is folded into a new snapshot after this many entries.
const WAL_COMPACT_EVERY: usize = 10_000;

/// Errors of [`Store::save_to`] and [`Store::load_from`].
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// A file could not be read, written or renamed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The snapshot did not decode.
    #[error("{path}: {source}")]
    Decode {
        /// The file.
        path: std::path::PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
}

struct Wal {
    dir: std::path::PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    entries: usize,
}

#[derive(Serialize)]
struct WalOut<'a> {
    rv: u64,
    kind: Kind,
    ty: WatchEventType,
    object: &'a Value,
}

#[derive(Deserialize)]
struct WalIn {
    rv: u64,
    kind: Kind,
    ty: WatchEventType,
    object: Value,
}

fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> PersistError + '_ {
    move |source| PersistError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `snap` to `dir/store.json` atomically (temp file + rename).
fn write_snapshot(dir: &std::path::Path, snap: &StoreSnapshot) -> Result<(), PersistError> {
    use std::io::Write;
    let path = dir.join(SNAPSHOT_FILE);
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let text = serde_json::to_vec(snap).map_err(|source| PersistError::Decode {
        path: path.clone(),
        source,
    })?;
    let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(&text).map_err(io_err(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io_err(&path))
}

fn open_wal(dir: &std::path::Path, truncate: bool) -> Result<Wal, PersistError> {
    let path = dir.join(WAL_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(!truncate)
        .write(true)
        .truncate(truncate)
        .open(&path)
        .map_err(io_err(&path))?;
    Ok(Wal {
        dir: dir.to_path_buf(),
        file: std::io::BufWriter::new(file),
        entries: 0,
    })
}

fn snapshot_locked(g: &Inner) -> StoreSnapshot {
    let mut objects = Vec::new();
    for kind in Kind::ALL {
        if let Some(m) = g.objects.get(&kind) {
            objects.extend(m.values().map(|o| (kind, (**o).clone())));
        }
    }
    StoreSnapshot { rv: g.rv, objects }
}

/// The in-process object store. Thread-safe; share as `Arc<Store>` across threads and
/// tokio runtimes. All writes go through one mutex; events are fanned out under it, so
/// every subscriber sees changes in resourceVersion order.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<StoreEvent>,
    history_cap: usize,
    expire: tokio::sync::watch::Sender<u64>,
    /// (verb, resource, namespace or "" for everywhere) of [`Store::deny_in`].
    denied: Mutex<HashSet<(String, String, String)>>,
    /// Denies that also reach the testbed's own node components ([`NODE_TOKEN`]).
    denied_nodes: Mutex<HashSet<(String, String, String)>>,
    log_source: RwLock<Option<Arc<dyn LogSource>>>,
    proxy_source: RwLock<Option<Arc<dyn ProxySource>>>,
    service_cidr: RwLock<crate::plan::Ipv4Cidr>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rv", &self.current_rv())
            .finish()
    }
}

/// Now as RFC 3339 with whole seconds (`2026-06-15T04:14:53Z`), the format of
/// `metav1.Time` on the wire.
pub fn rfc3339_now() -> String {
    ts_seconds(now())
}

/// The current wall-clock time as a jiff `Timestamp` (k8s-openapi 0.29's time type;
/// its `jiff` is built without `std`, so there is no `Timestamp::now`).
pub fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_microsecond(d.as_micros() as i64).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn ts_seconds(t: Timestamp) -> String {
    match Timestamp::from_second(t.as_second()) {
        Ok(t) => t.to_string(),
        Err(_) => t.to_string(),
    }
}

/// A random UUID v4 in its text form.
fn uuid_v4() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// 5 random characters from kube-apiserver's `utilrand.String` alphabet
/// (`bcdfghjklmnpqrstvwxz2456789`, k8s.io/apimachinery/pkg/util/rand).
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Removes `null` members recursively (the real server decodes into typed structs, so
/// `"creationTimestamp": null` from `kubectl run` simply disappears).
pub(crate) fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            for x in m.values_mut() {
                strip_nulls(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or("")
}

/// RFC 1123 subdomain (names of most objects), ≤ 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// RFC 1123 label (namespace names), ≤ 63 characters.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

fn required(field: &str) -> (String, String, String) {
    (
        "FieldValueRequired".into(),
        field.into(),
        "Required value".into(),
    )
}

/// Pod validation subset: containers present, each with a name and an image
/// (k8s.io/kubernetes pkg/apis/core/validation `validateContainers`), and a
/// `securityContext` that does not ask for `allowPrivilegeEscalation: false` together
/// with `privileged` or an added `SYS_ADMIN` (`ValidateSecurityContext`; the real
/// message prints the Go struct where this one prints the JSON).
fn validate_pod(pod: &Value) -> Vec<(String, String, String)> {
    let mut causes = Vec::new();
    match pod["spec"]["containers"].as_array() {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                if c["name"].as_str().unwrap_or("").is_empty() {
                    causes.push(required(&format!("spec.containers[{i}].name")));
                }
                if c["image"].as_str().unwrap_or("").is_empty() {
                    causes.push(required(&format!("spec.containers[{i}].image")));
                }
                // ValidateSecurityContext: no_new_privs cannot hold for a privileged
                // container or one adding CAP_SYS_ADMIN.
                let sc = &c["securityContext"];
                if sc["allowPrivilegeEscalation"] == false {
                    let why = if sc["privileged"] == true {
                        Some("cannot set `allowPrivilegeEscalation` to false and `privileged` to true")
                    } else if sc["capabilities"]["add"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|a| a == "SYS_ADMIN" || a == "CAP_SYS_ADMIN")
                    {
                        Some("cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN")
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        causes.push((
                            "FieldValueInvalid".into(),
                            format!("spec.containers[{i}].securityContext"),
                            format!("Invalid value: {sc}: {why}"),
                        ));
                    }
                }
            }
        }
        _ => causes.push(required("spec.containers")),
    }
    causes
}

/// The label every Namespace carries, `kubernetes.io/metadata.name: <name>`, set on
/// create and forced back on every update (kube-apiserver since v1.21, the
/// NamespaceDefaultLabelName feature: k8s.io/kubernetes `pkg/apis/core/v1/defaults.go`
/// `SetDefaults_Namespace` and `pkg/registry/core/namespace/strategy.go`
/// `Canonicalize`). NetworkPolicy `namespaceSelector`s rely on it.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn label_namespace(ns: &mut Value) {
    let name = meta_str(ns, "name").to_string();
    if !ns["metadata"]["labels"].is_object() {
        ns["metadata"]["labels"] = json!({});
    }
    ns["metadata"]["labels"][NAMESPACE_NAME_LABEL] = json!(name);
}

fn set_default(m: &mut Value, key: &str, v: Value) {
    if let Some(o) = m.as_object_mut() {
        o.entry(key.to_string()).or_insert(v);
    }
}

/// Pod defaults from k8s.io/kubernetes pkg/apis/core/v1/defaults.go plus the
/// DefaultTolerationSeconds admission plugin, and the create-time status
/// (`phase: Pending`, `qosClass`).
/// The bearer token the testbed's node components (kubelets, service proxies) send to
/// the built-in API server; plain `api deny` rules do not apply to it.
pub const NODE_TOKEN: &str = "testbed-node";

/// Where the ServiceAccount admission plugin mounts the API access volume.
pub const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// ServiceAccount admission (k8s.io/kubernetes `plugin/pkg/admission/serviceaccount`):
/// unless `automountServiceAccountToken` is false or a container already mounts
/// something at [`SERVICE_ACCOUNT_MOUNT`], adds the projected `kube-api-access-XXXXX`
/// volume (a bound token for 3607 s, `ca.crt` from the `kube-root-ca.crt` ConfigMap,
/// the namespace) and mounts it read-only in every container.
fn add_api_access_volume(spec: &mut Value) {
    if spec["automountServiceAccountToken"] == false {
        return;
    }
    let mounted = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"] == SERVICE_ACCOUNT_MOUNT)
        });
    if mounted {
        return;
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect();
    let name = format!("kube-api-access-{suffix}");
    let volume = json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                { "serviceAccountToken": { "expirationSeconds": 3607, "path": "token" } },
                { "configMap": { "name": "kube-root-ca.crt", "items": [{ "key": "ca.crt", "path": "ca.crt" }] } },
                { "downwardAPI": { "items": [{ "path": "namespace", "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.namespace" } }] } },
            ],
        },
    });
    if !spec["volumes"].is_array() {
        spec["volumes"] = json!([]);
    }
    if let Some(v) = spec["volumes"].as_array_mut() {
        v.push(volume);
    }
    if let Some(cs) = spec["containers"].as_array_mut() {
        for c in cs {
            if !c["volumeMounts"].is_array() {
                c["volumeMounts"] = json!([]);
            }
            if let Some(m) = c["volumeMounts"].as_array_mut() {
                m.push(
                    json!({ "name": name, "readOnly": true, "mountPath": SERVICE_ACCOUNT_MOUNT }),
                );
            }
        }
    }
}

fn default_pod(pod: &mut Value) {
    let spec = &mut pod["spec"];
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "enableServiceLinks", json!(true));
    set_default(spec, "priority", json!(0));
    set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    set_default(spec, "serviceAccountName", json!("default"));
    set_default(spec, "serviceAccount", json!("default"));
    add_api_access_volume(spec);
    let mut qos_has_resources = false;
    if let Some(cs) = spec["containers"].as_array_mut() {
        for c in cs {
            let image = c["image"].as_str().unwrap_or("").to_string();
            let last = image.rsplit('/').next().unwrap_or("");
            let pull = if image.contains('@') || (last.contains(':') && !last.ends_with(":latest"))
            {
                "IfNotPresent"
            } else {
                "Always"
            };
            set_default(c, "imagePullPolicy", json!(pull));
            set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
            set_default(c, "terminationMessagePolicy", json!("File"));
            set_default(c, "resources", json!({}));
            if c["resources"].as_object().is_some_and(|r| {
                r.values()
                    .any(|v| v.as_object().is_some_and(|m| !m.is_empty()))
            }) {
                qos_has_resources = true;
            }
            if let Some(ports) = c["ports"].as_array_mut() {
                for p in ports {
                    set_default(p, "protocol", json!("TCP"));
                }
            }
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                if c[probe].is_object() {
                    let p = &mut c[probe];
                    set_default(p, "timeoutSeconds", json!(1));
                    set_default(p, "periodSeconds", json!(10));
                    set_default(p, "successThreshold", json!(1));
                    set_default(p, "failureThreshold", json!(3));
                    if p["httpGet"].is_object() {
                        set_default(&mut p["httpGet"], "path", json!("/"));
                        set_default(&mut p["httpGet"], "scheme", json!("HTTP"));
                    }
                }
            }
        }
    }
    let tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    let mut tolerations = tolerations;
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let has = tolerations.iter().any(|t| {
            t["key"].as_str() == Some(key) && t["effect"].as_str().is_none_or(|e| e == "NoExecute")
        });
        if !has {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = Value::Array(tolerations);
    let qos = if qos_has_resources {
        "Burstable"
    } else {
        "BestEffort"
    };
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
}

/// Validation of a Deployment or Job (k8s.io/kubernetes `pkg/apis/apps/validation`
/// `ValidateDeploymentSpec`, `pkg/apis/batch/validation` `validateJobSpec`): the pod
/// template's containers, a selector (Deployment) that matches the template labels, and
/// the template's `restartPolicy` (`Always` for Deployments, `OnFailure`/`Never` for
/// Jobs).
fn validate_workload(kind: Kind, obj: &Value) -> Vec<(String, String, String)> {
    let mut causes: Vec<(String, String, String)> =
        validate_pod(&json!({"spec": obj["spec"]["template"]["spec"]}))
            .into_iter()
            .map(|(r, f, m)| (r, format!("spec.template.{f}"), m))
            .collect();
    let labels = &obj["spec"]["template"]["metadata"]["labels"];
    let policy = obj["spec"]["template"]["spec"]["restartPolicy"]
        .as_str()
        .unwrap_or(if kind == Kind::Job { "" } else { "Always" });
    match kind {
        Kind::Deployment => {
            let sel = &obj["spec"]["selector"];
            let ml = sel["matchLabels"].as_object();
            let has_exprs = sel["matchExpressions"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
            if ml.is_none_or(|m| m.is_empty()) && !has_exprs {
                causes.push(required("spec.selector"));
            } else if let Some(ml) = ml {
                if ml.iter().any(|(k, v)| labels[k] != *v) {
                    causes.push((
                        "FieldValueInvalid".into(),
                        "spec.template.metadata.labels".into(),
                        format!(
                            "Invalid value: {labels}: `selector` does not match template `labels`"
                        ),
                    ));
                }
            }
            if policy != "Always" {
                causes.push((
                    "FieldValueNotSupported".into(),
                    "spec.template.spec.restartPolicy".into(),
                    format!("Unsupported value: \"{policy}\": supported values: \"Always\""),
                ));
            }
        }
        Kind::Job if policy != "OnFailure" && policy != "Never" => {
            causes.push((
                "FieldValueNotSupported".into(),
                "spec.template.spec.restartPolicy".into(),
                format!(
                    "Unsupported value: \"{policy}\": supported values: \"OnFailure\", \"Never\""
                ),
            ));
        }
        _ => {}
    }
    causes
}

/// The API defaults of a pod template (`spec.template`): the Pod defaults of
/// [`default_pod`] on its spec, without a status.
fn default_template(obj: &mut Value) {
    let mut pod = json!({"spec": obj["spec"]["template"]["spec"].take()});
    default_pod(&mut pod);
    obj["spec"]["template"]["spec"] = pod["spec"].take();
    if !obj["spec"]["template"]["metadata"].is_object() {
        obj["spec"]["template"]["metadata"] = json!({});
    }
}

/// Deployment defaults (k8s.io/kubernetes `pkg/apis/apps/v1/defaults.go`).
fn default_deployment(obj: &mut Value) {
    let spec = &mut obj["spec"];
    set_default(spec, "replicas", json!(1));
    set_default(spec, "revisionHistoryLimit", json!(10));
    set_default(spec, "progressDeadlineSeconds", json!(600));
    set_default(
        spec,
        "strategy",
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}}),
    );
    default_template(obj);
    obj["status"] = json!({});
}

/// Job defaults (k8s.io/kubernetes `pkg/apis/batch/v1/defaults.go`): completions and
/// parallelism 1 when both are unset, backoffLimit 6, NonIndexed, not suspended.
fn default_job(obj: &mut Value) {
    let spec = &mut obj["spec"];
    if spec["completions"].is_null() && spec["parallelism"].is_null() {
        spec["completions"] = json!(1);
    }
    set_default(spec, "parallelism", json!(1));
    set_default(spec, "backoffLimit", json!(6));
    set_default(spec, "completionMode", json!("NonIndexed"));
    set_default(spec, "suspend", json!(false));
    set_default(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    default_template(obj);
    obj["status"] = json!({});
}

/// Job selector and template labels from its uid (the Job registry's
/// `generateSelector`: `batch.kubernetes.io/controller-uid` and `job-name` labels,
/// plus their legacy unprefixed forms) unless `spec.manualSelector` is true.
fn job_selector(obj: &mut Value) {
    if obj["spec"]["manualSelector"] == json!(true) {
        return;
    }
    let uid = meta_str(obj, "uid").to_string();
    let name = meta_str(obj, "name").to_string();
    obj["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    let labels = &mut obj["spec"]["template"]["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &uid),
        ("job-name", &name),
    ] {
        labels[k] = json!(v);
    }
}

impl Store {
    /// An empty store holding the system namespaces (`default`, `kube-system`,
    /// `kube-public`, `kube-node-lease`), with a [`DEFAULT_HISTORY`] event ring.
    pub fn new() -> Arc<Store> {
        Store::with_history(DEFAULT_HISTORY)
    }

    /// Like [`Store::new`] with a watch history ring of `history` events (tests use a
    /// small one to force 410 Expired).
    pub fn with_history(history: usize) -> Arc<Store> {
        let store = Store::empty(history);
        for ns in SYSTEM_NAMESPACES {
            // Cannot fail on an empty store.
            let _ = store.create(Kind::Namespace, json!({"metadata": {"name": ns}}));
        }
        store
    }

    fn empty(history: usize) -> Arc<Store> {
        let (tx, _) = broadcast::channel(FANOUT_CAPACITY);
        let (expire, _) = tokio::sync::watch::channel(0);
        Arc::new(Store {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: HashMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                wal: None,
            }),
            tx,
            history_cap: history.max(1),
            expire,
            denied: Mutex::new(HashSet::new()),
            denied_nodes: Mutex::new(HashSet::new()),
            log_source: RwLock::new(None),
            proxy_source: RwLock::new(None),
            service_cidr: RwLock::new(super::service::DEFAULT_SERVICE_CIDR),
        })
    }

    /// A store restored from a [`StoreSnapshot`]; resourceVersions continue after
    /// `snapshot.rv`, and watches resuming from an older resourceVersion get 410.
    pub fn restore(snapshot: StoreSnapshot) -> Arc<Store> {
        let store = Store::empty(DEFAULT_HISTORY);
        {
            let mut g = store.lock();
            g.rv = snapshot.rv;
            g.compacted = snapshot.rv;
            for (kind, obj) in snapshot.objects {
                let key = (
                    meta_str(&obj, "namespace").to_string(),
                    meta_str(&obj, "name").to_string(),
                );
                g.objects
                    .entry(kind)
                    .or_default()
                    .insert(key, Arc::new(obj));
            }
        }
        store
    }

    /// Every object and the current resourceVersion (for persisting).
    pub fn snapshot(&self) -> StoreSnapshot {
        snapshot_locked(&self.lock())
    }

    /// Writes a full snapshot of the store (objects and the resourceVersion counter) to
    /// `dir/store.json` atomically (temp file + rename). When the store is persisted
    /// into `dir` ([`Store::load_from`]), its write-ahead log is folded in and emptied
    /// (compaction). Errors: [`PersistError::Io`].
    pub fn save_to(&self, dir: &std::path::Path) -> Result<(), PersistError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut g = self.lock();
        let snap = snapshot_locked(&g);
        write_snapshot(dir, &snap)?;
        if let Some(w) = g.wal.as_mut() {
            if w.dir == dir {
                *w = open_wal(dir, true)?;
            }
        }
        Ok(())
    }

    /// The store persisted in `dir` (etcd's role in docs/design.md §5: "State and
    /// resourceVersions survive an API server restart"), creating `dir` and a fresh
    /// store (system namespaces) when it holds none.
    ///
    /// Layout: `store.json` (a [`StoreSnapshot`]) plus `store.wal`, JSON lines
    /// `{rv, kind, ty, object}`, one per change. Loading replays the log after the
    /// snapshot, so objects, the resourceVersion counter and the watch history since the
    /// last compaction come back: a watch resuming from a resourceVersion at or after
    /// the last snapshot continues without gap or duplicate; an older one gets 410
    /// Expired (as from kube-apiserver, whose watch cache restarts at the current etcd
    /// revision). A torn last line (crash mid-write) is ignored.
    ///
    /// Every later change is appended to the log under the store lock, before the
    /// writer gets its answer (written to the kernel, no fsync: it survives a process
    /// restart, not a power loss). Every 10 000 entries the log is folded into a new
    /// snapshot. Errors: [`PersistError`] for unreadable or undecodable files.
    pub fn load_from(dir: &std::path::Path) -> Result<Arc<Store>, PersistError> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let snap_path = dir.join(SNAPSHOT_FILE);
        let wal_path = dir.join(WAL_FILE);
        let snap = match std::fs::read(&snap_path) {
            Ok(b) => Some(
                serde_json::from_slice::<StoreSnapshot>(&b).map_err(|source| {
                    PersistError::Decode {
                        path: snap_path.clone(),
                        source,
                    }
                })?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&snap_path)(e)),
        };
        let wal_text = match std::fs::read_to_string(&wal_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io_err(&wal_path)(e)),
        };
        let store = match snap {
            Some(s) => Store::restore(s),
            None if wal_text.trim().is_empty() => {
                let s = Store::new();
                write_snapshot(dir, &s.snapshot())?;
                s
            }
            None => Store::empty(DEFAULT_HISTORY),
        };
        {
            let mut g = store.lock();
            let mut replayed = 0;
            let mut good_len = 0;
            for line in wal_text.split_inclusive('\n') {
                let rec = match serde_json::from_str::<WalIn>(line) {
                    Ok(rec) if line.ends_with('\n') => rec,
                    _ => break,
                };
                good_len += line.len();
                if rec.rv <= g.rv {
                    continue;
                }
                let key = (
                    meta_str(&rec.object, "namespace").to_string(),
                    meta_str(&rec.object, "name").to_string(),
                );
                let object = Arc::new(rec.object);
                let table = g.objects.entry(rec.kind).or_default();
                let old = match rec.ty {
                    WatchEventType::Deleted => table.remove(&key),
                    _ => table.insert(key, object.clone()),
                };
                g.rv = rec.rv;
                let ev = StoreEvent {
                    kind: rec.kind,
                    ty: rec.ty,
                    object,
                    old,
                    rv: rec.rv,
                };
                if g.history.len() >= store.history_cap {
                    if let Some(o) = g.history.pop_front() {
                        g.compacted = o.rv;
                    }
                }
                g.history.push_back(ev);
                replayed += 1;
            }
            if good_len < wal_text.len() {
                // Cut a torn tail so that later appends start on a fresh line.
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&wal_path)
                    .map_err(io_err(&wal_path))?;
                f.set_len(good_len as u64).map_err(io_err(&wal_path))?;
            }
            let mut wal = open_wal(dir, false)?;
            wal.entries = replayed;
            g.wal = Some(wal);
        }
        Ok(store)
    }

    /// Appends `ev` to the write-ahead log, compacting when it is long. A failing disk
    /// is logged, not fatal: the in-memory store stays authoritative.
    fn log_write(&self, g: &mut Inner, ev: &StoreEvent) {
        use std::io::Write;
        let Some(w) = g.wal.as_mut() else { return };
        let rec = WalOut {
            rv: ev.rv,
            kind: ev.kind,
            ty: ev.ty,
            object: &ev.object,
        };
        let res = serde_json::to_writer(&mut w.file, &rec)
            .map_err(std::io::Error::from)
            .and_then(|_| w.file.write_all(b"\n"))
            .and_then(|_| w.file.flush());
        if let Err(e) = res {
            tracing::warn!(error = %e, dir = %w.dir.display(), "store: write-ahead log append failed");
        }
        w.entries += 1;
        if w.entries >= WAL_COMPACT_EVERY {
            let dir = w.dir.clone();
            let snap = snapshot_locked(g);
            match write_snapshot(&dir, &snap).and_then(|_| open_wal(&dir, true)) {
                Ok(new) => g.wal = Some(new),
                Err(e) => {
                    tracing::warn!(error = %e, "store: compaction failed");
                    if let Some(w) = g.wal.as_mut() {
                        w.entries = 0;
                    }
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every write is a
        // single insert/remove), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the service CIDR ClusterIPs are allocated from (kube-apiserver's
    /// `--service-cluster-ip-range`); the daemon passes
    /// [`crate::api::service_cidr`]`(plan.index)`. Until then
    /// [`crate::api::DEFAULT_SERVICE_CIDR`]. Existing Services keep their addresses.
    pub fn set_service_cidr(&self, cidr: crate::plan::Ipv4Cidr) {
        *self.service_cidr.write().unwrap_or_else(|e| e.into_inner()) = cidr;
    }

    /// The service CIDR ClusterIPs are allocated from.
    pub fn service_cidr(&self) -> crate::plan::Ipv4Cidr {
        *self.service_cidr.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The last resourceVersion issued.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    fn emit(&self, g: &mut Inner, ev: StoreEvent) {
        if g.history.len() >= self.history_cap {
            if let Some(old) = g.history.pop_front() {
                g.compacted = old.rv;
            }
        }
        self.log_write(g, &ev);
        g.history.push_back(ev.clone());
        // No receivers is fine.
        let _ = self.tx.send(ev);
    }

    fn ns_check(&self, g: &Inner, kind: Kind, ns: &str, name: &str) -> Result<(), ApiError> {
        let Some(nsobj) = g
            .objects
            .get(&Kind::Namespace)
            .and_then(|m| m.get(&(String::new(), ns.to_string())))
        else {
            return Err(ApiError::not_found(Kind::Namespace, ns));
        };
        if nsobj["status"]["phase"] == "Terminating" {
            return Err(ApiError::forbidden(
                kind,
                name,
                &format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            ));
        }
        Ok(())
    }

    /// Creates an object (the registry's create path).
    ///
    /// Fills `metadata`: `uid` (UUID v4), `resourceVersion` (the global counter as a
    /// decimal string), `creationTimestamp` (RFC 3339, seconds), `name` from
    /// `generateName` + 5 random characters; sets `kind`/`apiVersion`; drops `null`
    /// members. Namespaced kinds need `metadata.namespace` (missing → `default`) naming
    /// an existing, non-terminating namespace. Pods get the API defaults and status
    /// `{phase: Pending, qosClass}` (any given status is replaced, as the real server
    /// does). Namespaces get the label [`NAMESPACE_NAME_LABEL`] = their (generated)
    /// name. NetworkPolicies get their API defaults (`podSelector: {}`, `policyTypes`,
    /// port protocol `TCP`) and kube-apiserver's validation (`network_policy.rs`).
    /// Emits ADDED.
    ///
    /// Errors: 404 NotFound (namespace missing), 403 Forbidden (namespace terminating;
    /// a Pod violating its namespace's Pod Security level, [`super::pod_security`]),
    /// 409 AlreadyExists, 422 Invalid (missing name, bad name, Pod without containers
    /// or with a container lacking name/image, an invalid Service, Deployment, Job or
    /// NetworkPolicy spec; the causes name each field), 400 BadRequest (not a JSON
    /// object; a NetworkPolicy field of the wrong JSON type).
    pub fn create(&self, kind: Kind, mut obj: Value) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was not a JSON object",
            ));
        }
        strip_nulls(&mut obj);
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        obj["kind"] = json!(kind.kind_name());
        obj["apiVersion"] = json!(kind.api_version());
        let meta = &mut obj["metadata"];
        if let Some(m) = meta.as_object_mut() {
            for k in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
            ] {
                m.remove(k);
            }
        }
        let ns = if kind.namespaced() {
            let ns = meta["namespace"].as_str().unwrap_or("").to_string();
            let ns = if ns.is_empty() {
                "default".to_string()
            } else {
                ns
            };
            meta["namespace"] = json!(ns);
            ns
        } else {
            if let Some(m) = meta.as_object_mut() {
                m.remove("namespace");
            }
            String::new()
        };
        let generate = meta["generateName"].as_str().unwrap_or("").to_string();
        let given = meta["name"].as_str().unwrap_or("").to_string();
        if given.is_empty() && generate.is_empty() {
            return Err(ApiError::invalid(
                kind,
                "",
                &[(
                    "FieldValueRequired".into(),
                    "metadata.name".into(),
                    "Required value: name or generateName is required".into(),
                )],
            ));
        }
        if kind == Kind::Pod {
            let causes = validate_pod(&obj);
            if !causes.is_empty() {
                let shown = if given.is_empty() {
                    generate.clone()
                } else {
                    given.clone()
                };
                return Err(ApiError::invalid(kind, &shown, &causes));
            }
            default_pod(&mut obj);
        }
        if kind == Kind::Deployment || kind == Kind::Job {
            let causes = validate_workload(kind, &obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(kind, &given, &causes));
            }
            if kind == Kind::Job {
                default_job(&mut obj);
            } else {
                default_deployment(&mut obj);
            }
        }
        if kind == Kind::Service {
            // PrepareForCreate resets the status.
            obj["status"] = json!({"loadBalancer": {}});
            super::service::default_service(&mut obj);
            let causes = super::service::validate_service(&obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(kind, &given, &causes));
            }
        }
        if kind == Kind::NetworkPolicy {
            super::network_policy::check_decodes(&obj)?;
            super::network_policy::default_network_policy(&mut obj);
            let causes = super::network_policy::validate(&obj, &[]);
            if !causes.is_empty() {
                return Err(ApiError::invalid(kind, &given, &causes));
            }
        }
        if kind == Kind::Namespace {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        let mut g = self.lock();
        if kind.namespaced() {
            self.ns_check(&g, kind, &ns, &given)?;
        }
        // Pod Security admission reads the namespace's labels (checked once the name is
        // known: kube-apiserver names a generated pod in its message).
        let ns_labels = if kind == Kind::Pod {
            g.objects
                .get(&Kind::Namespace)
                .and_then(|m| m.get(&(String::new(), ns.clone())))
                .map(|o| o["metadata"]["labels"].clone())
        } else {
            None
        };
        let table = g.objects.entry(kind).or_default();
        let name = if given.is_empty() {
            let mut tries = 0;
            loop {
                let candidate = format!("{generate}{}", name_suffix());
                if !table.contains_key(&(ns.clone(), candidate.clone())) {
                    break candidate;
                }
                tries += 1;
                if tries > 8 {
                    return Err(ApiError::already_exists(kind, &candidate));
                }
            }
        } else {
            given
        };
        let valid = if kind == Kind::Namespace {
            is_dns_label(&name)
        } else {
            is_dns_subdomain(&name)
        };
        if !valid {
            return Err(ApiError::invalid(
                kind,
                &name,
                &[(
                    "FieldValueInvalid".into(),
                    "metadata.name".into(),
                    format!("Invalid value: \"{name}\": a lowercase RFC 1123 {} must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character", if kind == Kind::Namespace { "label" } else { "subdomain" }),
                )],
            ));
        }
        if let Some((policy, found)) = ns_labels
            .as_ref()
            .and_then(|l| super::pod_security::violations(l, &obj))
        {
            return Err(ApiError::forbidden(
                kind,
                &name,
                &super::pod_security::message(&policy, &found),
            ));
        }
        let key = (ns, name.clone());
        if table.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        if kind == Kind::Service {
            // Allocation under the store lock: no two Services get the same ClusterIP.
            let cidr = self.service_cidr();
            let r = super::service::allocate(&mut obj, table.values().map(|o| &**o), cidr);
            r.map_err(|causes| ApiError::invalid(kind, &name, &causes))?;
        }
        g.rv += 1;
        let rv = g.rv;
        let meta = &mut obj["metadata"];
        meta["name"] = json!(name);
        meta["uid"] = json!(uuid_v4());
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(rfc3339_now());
        if matches!(
            kind,
            Kind::Pod | Kind::Deployment | Kind::Job | Kind::NetworkPolicy
        ) {
            meta["generation"] = json!(1);
        }
        if kind == Kind::Namespace {
            label_namespace(&mut obj);
        }
        if kind == Kind::Job {
            job_selector(&mut obj);
        }
        // `IndexMut` on a missing key inserts `null`; drop those again.
        strip_nulls(&mut obj);
        let obj = Arc::new(obj);
        g.objects.entry(kind).or_default().insert(key, obj.clone());
        self.emit(
            &mut g,
            StoreEvent {
                kind,
                ty: WatchEventType::Added,
                object: obj.clone(),
                old: None,
                rv,
            },
        );
        Ok((*obj).clone())
    }

    fn key(kind: Kind, ns: Option<&str>, name: &str) -> Key {
        let ns = if kind.namespaced() {
            ns.unwrap_or("default").to_string()
        } else {
            String::new()
        };
        (ns, name.to_string())
    }

    /// The object `name` (in namespace `ns` for namespaced kinds; `None` → `default`).
    /// Errors: 404 NotFound.
    pub fn get(&self, kind: Kind, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.get_arc(kind, ns, name).map(|o| (*o).clone())
    }

    fn get_arc(&self, kind: Kind, ns: Option<&str>, name: &str) -> Result<Arc<Value>, ApiError> {
        let g = self.lock();
        g.objects
            .get(&kind)
            .and_then(|m| m.get(&Store::key(kind, ns, name)))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// [`Store::get`] deserialised into a k8s-openapi type (e.g. `Pod`). Errors: 404, or
    /// 500 if the stored JSON does not fit `T`.
    pub fn get_typed<T: DeserializeOwned>(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
    ) -> Result<T, ApiError> {
        let v = self.get(kind, ns, name)?;
        serde_json::from_value(v).map_err(|e| ApiError::internal(format!("decoding {name}: {e}")))
    }

    /// All objects of `kind` (in `ns`, or in every namespace when `None`), ordered by
    /// namespace then name, and the list resourceVersion (the store's current one).
    pub fn list(&self, kind: Kind, ns: Option<&str>) -> (Vec<Value>, u64) {
        let (items, rv) = self.list_arc(kind, ns);
        (items.into_iter().map(|o| (*o).clone()).collect(), rv)
    }

    /// [`Store::list`] deserialised into a k8s-openapi type; objects that do not fit are
    /// skipped.
    pub fn list_typed<T: DeserializeOwned>(&self, kind: Kind, ns: Option<&str>) -> Vec<T> {
        self.list(kind, ns)
            .0
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    pub(crate) fn list_arc(&self, kind: Kind, ns: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let g = self.lock();
        let items = list_locked(&g, kind, ns);
        (items, g.rv)
    }

    /// Read-modify-write under the store lock: `f` edits a copy of the object; the
    /// result keeps name, namespace, uid and creationTimestamp, gets a new
    /// resourceVersion and is announced as MODIFIED. If `f` leaves the object unchanged,
    /// nothing is written and no event is sent (like kube-apiserver's no-op updates).
    /// As the update strategies do: a Namespace keeps its [`NAMESPACE_NAME_LABEL`]
    /// label (forced back to its name); a changed Service or NetworkPolicy spec is
    /// defaulted and validated again, and a changed Deployment, Job or NetworkPolicy
    /// spec increments `metadata.generation`.
    /// Errors: 404 NotFound, 422 Invalid / 400 BadRequest (as [`Store::create`]), or
    /// whatever `f` returns.
    pub fn modify(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        let key = Store::key(kind, ns, name);
        let mut g = self.lock();
        let old = g
            .objects
            .get(&kind)
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let mut new = (*old).clone();
        f(&mut new)?;
        strip_nulls(&mut new);
        if !new["metadata"].is_object() {
            new["metadata"] = json!({});
        }
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "resourceVersion",
        ] {
            match old["metadata"].get(field) {
                Some(v) => new["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        new["kind"] = json!(kind.kind_name());
        new["apiVersion"] = json!(kind.api_version());
        if kind == Kind::Service && new["spec"] != old["spec"] {
            let mut causes = super::service::carry_over(&old, &mut new);
            super::service::default_service(&mut new);
            causes.extend(super::service::validate_service(&new));
            if causes.is_empty() {
                let cidr = self.service_cidr();
                let others = g
                    .objects
                    .get(&Kind::Service)
                    .into_iter()
                    .flat_map(|m| m.iter().filter(|(k, _)| **k != key).map(|(_, o)| &**o));
                if let Err(c) = super::service::allocate(&mut new, others, cidr) {
                    causes.extend(c);
                }
            }
            if !causes.is_empty() {
                return Err(ApiError::invalid(kind, name, &causes));
            }
        }
        if kind == Kind::NetworkPolicy && new["spec"] != old["spec"] {
            use super::network_policy as np;
            np::check_decodes(&new)?;
            np::default_network_policy(&mut new);
            let causes = np::validate(&new, &np::cidrs(&old));
            if !causes.is_empty() {
                return Err(ApiError::invalid(kind, name, &causes));
            }
        }
        if kind == Kind::Namespace {
            label_namespace(&mut new);
        }
        if new == *old {
            return Ok(new);
        }
        if matches!(kind, Kind::Deployment | Kind::Job | Kind::NetworkPolicy)
            && new["spec"] != old["spec"]
        {
            // metadata.generation counts spec changes (registry `PrepareForUpdate`).
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
        }

        g.rv += 1;
        let rv = g.rv;
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        let new = Arc::new(new);
        g.objects.entry(kind).or_default().insert(key, new.clone());
        self.emit(
            &mut g,
            StoreEvent {
                kind,
                ty: WatchEventType::Modified,
                object: new.clone(),
                old: Some(old),
                rv,
            },
        );
        Ok((*new).clone())
    }

    /// API delete semantics (k8s.io/kubernetes `pkg/registry/core/pod/strategy.go`
    /// `CheckGracefulDelete`): a Pod bound to a node (`spec.nodeName` set), not in a
    /// terminal phase, with an effective grace period > 0 (`grace_seconds`, else
    /// `spec.terminationGracePeriodSeconds`, default 30) gets
    /// `metadata.deletionTimestamp` = now + grace and `deletionGracePeriodSeconds`
    /// (MODIFIED event); the kubelet finishes with [`Store::remove`]. A second delete may
    /// only shorten the grace period. A Namespace turns `Terminating`, its contents are
    /// deleted the same way, and it goes away with its last object. Everything else
    /// (unbound or finished Pods, grace 0) is removed at once (DELETED event), and
    /// objects listing it in `ownerReferences` are deleted in turn (background GC).
    /// Returns the object as it stands after the call.
    ///
    /// Errors: 404 NotFound; 409 Conflict when `uid_precondition` does not match.
    pub fn delete(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        grace_seconds: Option<i64>,
        uid_precondition: Option<&str>,
    ) -> Result<Value, ApiError> {
        let key = Store::key(kind, ns, name);
        let mut g = self.lock();
        let old = g
            .objects
            .get(&kind)
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let uid = meta_str(&old, "uid").to_string();
        if let Some(want) = uid_precondition {
            if !want.is_empty() && want != uid {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
                ));
            }
        }
        match kind {
            Kind::Pod => {
                let bound = !old["spec"]["nodeName"].as_str().unwrap_or("").is_empty();
                let phase = old["status"]["phase"].as_str().unwrap_or("");
                let terminal = phase == "Succeeded" || phase == "Failed";
                let grace = grace_seconds
                    .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
                    .unwrap_or(30)
                    .max(0);
                if bound && !terminal && grace > 0 {
                    let current = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
                    if current.is_some_and(|c| c <= grace) {
                        return Ok((*old).clone());
                    }
                    let at = now()
                        .checked_add(jiff_seconds(grace))
                        .unwrap_or_else(|_| now());
                    let mut new = (*old).clone();
                    new["metadata"]["deletionTimestamp"] = json!(ts_seconds(at));
                    new["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                    drop(g);
                    return self.replace_locked_free(kind, &key, old, new);
                }
            }
            Kind::Namespace => {
                let mut new = (*old).clone();
                if new["status"]["phase"] != "Terminating" {
                    new["metadata"]["deletionTimestamp"] = json!(rfc3339_now());
                    new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                    new["status"]["phase"] = json!("Terminating");
                    drop(g);
                    let out = self.replace_locked_free(kind, &key, old, new)?;
                    self.drain_namespace(name);
                    return Ok(self.get(kind, None, name).unwrap_or(out));
                }
                drop(g);
                self.drain_namespace(name);
                return Ok(self.get(kind, None, name).unwrap_or((*old).clone()));
            }
            _ => {}
        }
        let removed = self.remove_locked(&mut g, kind, &key);
        drop(g);
        if let Some(obj) = &removed {
            self.after_remove(kind, obj);
        }
        Ok(removed.map(|o| (*o).clone()).unwrap_or_default())
    }

    /// Replaces `old` by `new` if it is still the stored version (MODIFIED event).
    fn replace_locked_free(
        &self,
        kind: Kind,
        key: &Key,
        old: Arc<Value>,
        mut new: Value,
    ) -> Result<Value, ApiError> {
        let mut g = self.lock();
        let cur = g
            .objects
            .get(&kind)
            .and_then(|m| m.get(key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, &key.1))?;
        if !Arc::ptr_eq(&cur, &old) {
            return Err(ApiError::conflict(
                kind,
                &key.1,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        g.rv += 1;
        let rv = g.rv;
        new["metadata"]["resourceVersion"] = json!(rv.to_string());
        let new = Arc::new(new);
        g.objects
            .entry(kind)
            .or_default()
            .insert(key.clone(), new.clone());
        self.emit(
            &mut g,
            StoreEvent {
                kind,
                ty: WatchEventType::Modified,
                object: new.clone(),
                old: Some(old),
                rv,
            },
        );
        Ok((*new).clone())
    }

    fn remove_locked(&self, g: &mut Inner, kind: Kind, key: &Key) -> Option<Arc<Value>> {
        let old = g.objects.get_mut(&kind)?.remove(key)?;
        g.rv += 1;
        let rv = g.rv;
        let mut last = (*old).clone();
        last["metadata"]["resourceVersion"] = json!(rv.to_string());
        let last = Arc::new(last);
        self.emit(
            g,
            StoreEvent {
                kind,
                ty: WatchEventType::Deleted,
                object: last.clone(),
                old: Some(old),
                rv,
            },
        );
        Some(last)
    }

    /// Deletes every object in namespace `ns` (API semantics) and removes the
    /// namespace once it is empty.
    fn drain_namespace(&self, ns: &str) {
        for kind in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
            let (items, _) = self.list_arc(kind, Some(ns));
            for o in items {
                if o["metadata"]["deletionTimestamp"].is_null() {
                    let _ = self.delete(kind, Some(ns), meta_str(&o, "name"), None, None);
                }
            }
        }
        self.finish_namespace_if_empty(ns);
    }

    fn finish_namespace_if_empty(&self, ns: &str) {
        let mut g = self.lock();
        let key = (String::new(), ns.to_string());
        let terminating = g
            .objects
            .get(&Kind::Namespace)
            .and_then(|m| m.get(&key))
            .is_some_and(|o| o["status"]["phase"] == "Terminating");
        if !terminating {
            return;
        }
        let empty = Kind::ALL
            .into_iter()
            .filter(|k| k.namespaced())
            .all(|k| list_locked(&g, k, Some(ns)).is_empty());
        if empty {
            self.remove_locked(&mut g, Kind::Namespace, &key);
        }
    }

    /// Garbage collection after `obj` is gone: delete dependants (ownerReferences
    /// naming its uid; k8s.io/kubernetes pkg/controller/garbagecollector, background
    /// propagation) and finish a terminating namespace.
    fn after_remove(&self, kind: Kind, obj: &Value) {
        let uid = meta_str(obj, "uid");
        if !uid.is_empty() {
            let mut dependants = Vec::new();
            {
                let g = self.lock();
                for (k, m) in g.objects.iter() {
                    for o in m.values() {
                        let owned =
                            o["metadata"]["ownerReferences"]
                                .as_array()
                                .is_some_and(|refs| {
                                    refs.iter().any(|r| r["uid"].as_str() == Some(uid))
                                });
                        if owned && o["metadata"]["deletionTimestamp"].is_null() {
                            dependants.push((
                                *k,
                                meta_str(o, "namespace").to_string(),
                                meta_str(o, "name").to_string(),
                            ));
                        }
                    }
                }
            }
            for (k, ns, name) in dependants {
                let _ = self.delete(k, Some(&ns), &name, None, None);
            }
        }
        if kind.namespaced() {
            self.finish_namespace_if_empty(meta_str(obj, "namespace"));
        }
    }

    /// Final removal (the kubelet, once the Pod's containers have stopped): removes the
    /// object if its uid is `uid` and sends DELETED. Errors: 404 NotFound, 409 Conflict
    /// when the uid differs (a new object of the same name exists).
    pub fn remove(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        uid: &str,
    ) -> Result<(), ApiError> {
        let key = Store::key(kind, ns, name);
        let mut g = self.lock();
        let cur = g
            .objects
            .get(&kind)
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let have = meta_str(&cur, "uid");
        if have != uid {
            return Err(ApiError::conflict(
                kind,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                ),
            ));
        }
        let removed = self.remove_locked(&mut g, kind, &key);
        drop(g);
        if let Some(obj) = removed {
            self.after_remove(kind, &obj);
        }
        Ok(())
    }

    /// A live receiver of every change after this call (all kinds).
    pub fn subscribe(&self) -> broadcast::Receiver<StoreEvent> {
        let _g = self.lock();
        self.tx.subscribe()
    }

    /// The current objects of `kind` (in `ns`, or all namespaces), the list
    /// resourceVersion, and a receiver of every change after exactly that version.
    pub fn list_and_subscribe(
        &self,
        kind: Kind,
        ns: Option<&str>,
    ) -> (Vec<Value>, u64, broadcast::Receiver<StoreEvent>) {
        let g = self.lock();
        let rx = self.tx.subscribe();
        let items = list_locked(&g, kind, ns)
            .into_iter()
            .map(|o| (*o).clone())
            .collect();
        (items, g.rv, rx)
    }

    /// Events with resourceVersion > `since` from the history ring (all kinds).
    /// Errors: 410 Expired (`too old resource version: since (oldest)`) when events
    /// after `since` have already left the ring.
    pub fn events_since(&self, since: u64) -> Result<Vec<StoreEvent>, ApiError> {
        let g = self.lock();
        events_since_locked(&g, since)
    }

    /// Start a watch of `kind` in `ns` (all namespaces when `None`): with
    /// `resource_version` `None` or 0, synthetic ADDED events for the current objects;
    /// with `Some(n)`, the replay of events after `n`; then live. Errors: 410 Expired.
    pub fn watch(
        &self,
        kind: Kind,
        ns: Option<&str>,
        resource_version: Option<u64>,
    ) -> Result<WatchStart, ApiError> {
        let g = self.lock();
        let rx = self.tx.subscribe();
        let in_scope = |e: &StoreEvent| e.kind == kind && ns.is_none_or(|n| e.namespace() == n);
        let initial = match resource_version {
            None | Some(0) => list_locked(&g, kind, ns)
                .into_iter()
                .map(|o| StoreEvent {
                    kind,
                    ty: WatchEventType::Added,
                    rv: o["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0),
                    object: o,
                    old: None,
                })
                .collect(),
            Some(n) => events_since_locked(&g, n)?
                .into_iter()
                .filter(in_scope)
                .collect(),
        };
        Ok(WatchStart {
            initial,
            rv: g.rv,
            rx,
        })
    }

    /// Drops the whole watch history and ends every open watch, so the next resume
    /// from an old resourceVersion gets 410 Expired (`testbed api expire-watches`).
    pub fn expire_watches(&self) {
        {
            let mut g = self.lock();
            g.history.clear();
            g.compacted = g.rv;
        }
        self.expire.send_modify(|n| *n += 1);
    }

    /// Receiver that changes whenever [`Store::expire_watches`] is called.
    pub fn expire_signal(&self) -> tokio::sync::watch::Receiver<u64> {
        self.expire.subscribe()
    }

    /// Makes the HTTP front end answer `verb` (`get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`; `*` for all) on `resource`
    /// (plural, e.g. `pods`, or a subresource such as `pods/proxy`; `*` for all) with 403
    /// Forbidden, like missing RBAC (`testbed api deny VERB RESOURCE`), in every
    /// namespace and at the cluster scope. As in RBAC, `pods` does not cover `pods/proxy`
    /// or `pods/log`: each subresource is its own resource.
    pub fn deny(&self, verb: &str, resource: &str) {
        self.deny_in(verb, resource, None);
    }

    /// [`Store::deny`] limited to `namespace` when given (a RoleBinding's reach; `None`:
    /// everywhere, a ClusterRoleBinding's).
    pub fn deny_in(&self, verb: &str, resource: &str, namespace: Option<&str>) {
        self.denied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(deny_key(verb, resource, namespace));
    }

    /// Lifts one [`Store::deny`] (the same `verb` and `resource` strings); true when it
    /// was in force.
    pub fn allow(&self, verb: &str, resource: &str) -> bool {
        self.allow_in(verb, resource, None)
    }

    /// Lifts one [`Store::deny_in`] (the same strings and namespace); true when it was in
    /// force.
    pub fn allow_in(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        let key = deny_key(verb, resource, namespace);
        let nodes = self
            .denied_nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.denied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
            || nodes
    }

    /// [`Store::deny_in`] that also reaches the testbed's node components (requests
    /// with the bearer token [`NODE_TOKEN`]), which plain denies leave alone: they stand
    /// for "the API refuses the client", not "the cluster stops working".
    pub fn deny_everyone_in(&self, verb: &str, resource: &str, namespace: Option<&str>) {
        self.deny_in(verb, resource, namespace);
        self.denied_nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(deny_key(verb, resource, namespace));
    }

    /// Lifts every [`Store::deny`].
    pub fn allow_all(&self) {
        self.denied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.denied_nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Whether `verb` on `resource` (exactly: `pods/proxy` is not `pods`) is denied in
    /// `namespace` (`None`: a cluster-scoped request or one across all namespaces, which
    /// only an everywhere-deny covers).
    pub fn is_denied(&self, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
        self.is_denied_to(verb, resource, namespace, false)
    }

    /// [`Store::is_denied`] for a request of a node component (`node`: only denies made
    /// with [`Store::deny_everyone_in`] reach it) or of any other client.
    pub fn is_denied_to(
        &self,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
        node: bool,
    ) -> bool {
        let set = if node {
            &self.denied_nodes
        } else {
            &self.denied
        };
        let d = set.lock().unwrap_or_else(|e| e.into_inner());
        let scopes: &[Option<&str>] = match namespace {
            Some(ns) => &[None, Some(ns)],
            None => &[None],
        };
        scopes.iter().any(|&ns| {
            [(verb, resource), (verb, "*"), ("*", resource), ("*", "*")]
                .iter()
                .any(|(v, r)| d.contains(&deny_key(v, r, ns)))
        })
    }

    /// Registers the source of `pods/NAME/log`.
    pub fn set_log_source(&self, source: Arc<dyn LogSource>) {
        *self.log_source.write().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// The registered log source.
    pub fn log_source(&self) -> Option<Arc<dyn LogSource>> {
        self.log_source
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Registers the handler of `pods/NAME:PORT/proxy/PATH`.
    pub fn set_proxy_source(&self, source: Arc<dyn ProxySource>) {
        *self.proxy_source.write().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// The registered proxy handler.
    pub fn proxy_source(&self) -> Option<Arc<dyn ProxySource>> {
        self.proxy_source
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn jiff_seconds(s: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(s)
}

fn list_locked(g: &Inner, kind: Kind, ns: Option<&str>) -> Vec<Arc<Value>> {
    let Some(m) = g.objects.get(&kind) else {
        return Vec::new();
    };
    match ns {
        Some(ns) if kind.namespaced() => m
            .range((ns.to_string(), String::new())..)
            .take_while(|((n, _), _)| n == ns)
            .map(|(_, o)| o.clone())
            .collect(),
        _ => m.values().cloned().collect(),
    }
}

fn events_since_locked(g: &Inner, since: u64) -> Result<Vec<StoreEvent>, ApiError> {
    if since < g.compacted {
        let oldest = g.history.front().map(|e| e.rv).unwrap_or(g.rv + 1);
        return Err(ApiError::expired(
            since,
            oldest.saturating_sub(1).max(g.compacted),
        ));
    }
    Ok(g.history.iter().filter(|e| e.rv > since).cloned().collect())
}

/// Key of one deny: (verb, resource, namespace or "" for everywhere).
fn deny_key(verb: &str, resource: &str, namespace: Option<&str>) -> (String, String, String) {
    (
        verb.to_owned(),
        resource.to_owned(),
        namespace.unwrap_or_default().to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, node: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "target-server"}]}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    #[test]
    fn create_fills_metadata_and_pod_defaults() {
        let s = Store::new();
        let mut p = pod("default", "", None);
        p["metadata"]["generateName"] = json!("probe-");
        p["metadata"]["creationTimestamp"] = Value::Null;
        p["status"] = json!({"phase": "Running"});
        let c = s.create(Kind::Pod, p).unwrap();
        let name = c["metadata"]["name"].as_str().unwrap();
        assert_eq!(name.len(), "probe-".len() + 5);
        assert_eq!(c["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(c["metadata"]["resourceVersion"], s.current_rv().to_string());
        assert!(c["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z'));
        assert_eq!(c["status"]["phase"], "Pending");
        assert_eq!(c["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(
            c["spec"]["containers"][0]["terminationMessagePath"],
            "/dev/termination-log"
        );
        assert_eq!(c["kind"], "Pod");
    }

    #[test]
    fn delete_is_graceful_only_for_bound_running_pods() {
        let s = Store::new();
        s.create(Kind::Pod, pod("default", "bound", Some("node-1")))
            .unwrap();
        s.create(Kind::Pod, pod("default", "loose", None)).unwrap();
        let d = s
            .delete(Kind::Pod, Some("default"), "bound", Some(5), None)
            .unwrap();
        assert!(d["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 5);
        assert!(s.get(Kind::Pod, Some("default"), "bound").is_ok());
        // A second delete may shorten, never lengthen the grace period.
        let again = s
            .delete(Kind::Pod, Some("default"), "bound", Some(30), None)
            .unwrap();
        assert_eq!(again["metadata"]["deletionGracePeriodSeconds"], 5);
        assert_eq!(
            s.remove(Kind::Pod, Some("default"), "bound", "wrong-uid")
                .unwrap_err()
                .code,
            409
        );
        let uid = d["metadata"]["uid"].as_str().unwrap();
        s.remove(Kind::Pod, Some("default"), "bound", uid).unwrap();
        assert_eq!(
            s.get(Kind::Pod, Some("default"), "bound").unwrap_err().code,
            404
        );
        s.delete(Kind::Pod, Some("default"), "loose", None, None)
            .unwrap();
        assert_eq!(
            s.get(Kind::Pod, Some("default"), "loose").unwrap_err().code,
            404
        );
        let e = s
            .delete(Kind::Pod, Some("default"), "loose", None, None)
            .unwrap_err();
        assert_eq!(e.message, "pods \"loose\" not found");
    }

    #[test]
    fn history_ring_overflow_gives_410_and_watch_has_no_gap() {
        let s = Store::with_history(3);
        let start = s.current_rv();
        for i in 0..5 {
            s.create(Kind::Pod, pod("default", &format!("p{i}"), None))
                .unwrap();
        }
        let e = s.events_since(start).unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
        let recent = s.events_since(s.current_rv() - 2).unwrap();
        assert_eq!(recent.len(), 2);
        let mut w = s.watch(Kind::Pod, Some("default"), None).unwrap();
        assert_eq!(w.initial.len(), 5);
        s.create(Kind::Pod, pod("default", "later", None)).unwrap();
        let ev = w.rx.try_recv().unwrap();
        assert_eq!(ev.rv, w.rv + 1);
        assert_eq!(ev.object["metadata"]["name"], "later");
    }

    #[test]
    fn modify_without_change_writes_nothing() {
        let s = Store::new();
        s.create(Kind::Pod, pod("default", "p", None)).unwrap();
        let rv = s.current_rv();
        s.modify(Kind::Pod, Some("default"), "p", |_| Ok(()))
            .unwrap();
        assert_eq!(s.current_rv(), rv);
        let out = s
            .modify(Kind::Pod, Some("default"), "p", |p| {
                p["metadata"]["uid"] = json!("forged");
                p["status"]["phase"] = json!("Running");
                Ok(())
            })
            .unwrap();
        assert_eq!(s.current_rv(), rv + 1);
        assert_ne!(out["metadata"]["uid"], "forged");
    }

    #[test]
    fn namespace_deletion_waits_for_bound_pods_and_blocks_new_content() {
        let s = Store::new();
        s.create(Kind::Namespace, json!({"metadata": {"name": "probe"}}))
            .unwrap();
        let p = s
            .create(Kind::Pod, pod("probe", "t", Some("node-1")))
            .unwrap();
        s.create(Kind::Pod, pod("probe", "u", None)).unwrap();
        let ns = s
            .delete(Kind::Namespace, None, "probe", None, None)
            .unwrap();
        assert_eq!(ns["status"]["phase"], "Terminating");
        assert!(s.get(Kind::Pod, Some("probe"), "u").is_err());
        let t = s.get(Kind::Pod, Some("probe"), "t").unwrap();
        assert!(t["metadata"]["deletionTimestamp"].is_string());
        let e = s.create(Kind::Pod, pod("probe", "v", None)).unwrap_err();
        assert_eq!(e.code, 403);
        s.remove(
            Kind::Pod,
            Some("probe"),
            "t",
            p["metadata"]["uid"].as_str().unwrap(),
        )
        .unwrap();
        assert_eq!(s.get(Kind::Namespace, None, "probe").unwrap_err().code, 404);
    }

    #[test]
    fn owner_removal_garbage_collects_dependants() {
        let s = Store::new();
        let owner = s.create(Kind::Pod, pod("default", "prober", None)).unwrap();
        let mut dep = pod("default", "target", None);
        dep["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
            "name": "prober", "uid": owner["metadata"]["uid"]}]);
        s.create(Kind::Pod, dep).unwrap();
        s.delete(Kind::Pod, Some("default"), "prober", None, None)
            .unwrap();
        assert_eq!(
            s.get(Kind::Pod, Some("default"), "target")
                .unwrap_err()
                .code,
            404
        );
    }

    #[test]
    fn snapshot_restore_keeps_objects_and_resource_versions() {
        let s = Store::new();
        s.create(Kind::Pod, pod("default", "p", None)).unwrap();
        let snap: StoreSnapshot =
            serde_json::from_str(&serde_json::to_string(&s.snapshot()).unwrap()).unwrap();
        let r = Store::restore(snap);
        assert_eq!(r.current_rv(), s.current_rv());
        assert!(r.get(Kind::Pod, Some("default"), "p").is_ok());
        let c = r.create(Kind::Pod, pod("default", "q", None)).unwrap();
        assert_eq!(
            c["metadata"]["resourceVersion"],
            (s.current_rv() + 1).to_string()
        );
    }
}

#[cfg(test)]
mod persist_tests {
    use super::*;

    fn tmp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("testbed-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn pod(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "target-server"}]}})
    }

    #[test]
    fn load_from_replays_the_log_so_objects_rv_and_watch_history_survive() {
        let dir = tmp("replay");
        let s = Store::load_from(&dir).unwrap();
        s.create(Kind::Pod, pod("a")).unwrap();
        let rv_a = s.current_rv();
        s.create(Kind::Pod, pod("b")).unwrap();
        s.modify(Kind::Pod, Some("default"), "b", |p| {
            p["metadata"]["labels"] = json!({"x": "y"});
            Ok(())
        })
        .unwrap();
        s.delete(Kind::Pod, Some("default"), "a", None, None)
            .unwrap();
        let rv = s.current_rv();
        drop(s);
        let r = Store::load_from(&dir).unwrap();
        assert_eq!(r.current_rv(), rv);
        assert!(r.get(Kind::Pod, Some("default"), "a").is_err());
        assert_eq!(
            r.get(Kind::Pod, Some("default"), "b").unwrap()["metadata"]["labels"]["x"],
            "y"
        );
        // A watch resuming after `a` was created sees exactly the later changes.
        let w = r.watch(Kind::Pod, Some("default"), Some(rv_a)).unwrap();
        let got: Vec<(&str, u64)> = w.initial.iter().map(|e| (e.ty.as_str(), e.rv)).collect();
        assert_eq!(
            got,
            [
                ("ADDED", rv_a + 1),
                ("MODIFIED", rv_a + 2),
                ("DELETED", rv_a + 3)
            ]
        );
        assert!(
            w.initial[2].old.is_some(),
            "DELETED carries the previous object"
        );
        let c = r.create(Kind::Pod, pod("c")).unwrap();
        assert_eq!(c["metadata"]["resourceVersion"], (rv + 1).to_string());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn save_to_compacts_the_log_and_older_resumes_get_410() {
        let dir = tmp("compact");
        let s = Store::load_from(&dir).unwrap();
        s.create(Kind::Pod, pod("a")).unwrap();
        let rv_a = s.current_rv();
        s.save_to(&dir).unwrap();
        assert_eq!(std::fs::metadata(dir.join(WAL_FILE)).unwrap().len(), 0);
        s.create(Kind::Pod, pod("b")).unwrap();
        drop(s);
        let r = Store::load_from(&dir).unwrap();
        assert!(r.get(Kind::Pod, Some("default"), "a").is_ok());
        assert!(r.get(Kind::Pod, Some("default"), "b").is_ok());
        assert_eq!(
            r.watch(Kind::Pod, None, Some(rv_a)).unwrap().initial.len(),
            1
        );
        assert_eq!(
            r.watch(Kind::Pod, None, Some(rv_a - 1)).unwrap_err().code,
            410
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_last_log_line_is_ignored() {
        let dir = tmp("torn");
        let s = Store::load_from(&dir).unwrap();
        s.create(Kind::Pod, pod("a")).unwrap();
        let rv = s.current_rv();
        drop(s);
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(WAL_FILE))
            .unwrap();
        f.write_all(br#"{"rv":99,"kind":"Pod","ty":"Add"#).unwrap();
        drop(f);
        let r = Store::load_from(&dir).unwrap();
        assert_eq!(r.current_rv(), rv);
        assert!(r.get(Kind::Pod, Some("default"), "a").is_ok());
        r.create(Kind::Pod, pod("b")).unwrap();
        drop(r);
        let again = Store::load_from(&dir).unwrap();
        assert!(again.get(Kind::Pod, Some("default"), "b").is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
