//! Node-agent **profiles** (docs/design.md §3 table): which pods are a CNI / proxy agent, on
//! which port they serve `/metrics`, and which metric families carry each correlation
//! signal. Built in: `calico-felix`, `cilium-agent`, `kube-proxy`, `aws-node`; more (or
//! replacements of a built-in, by name) come from a YAML or JSON file
//! ([`load_profiles_file`], the lead's `--agent-config FILE`).
//!
//! Pure: data and a reader of the page ([`AgentReading::from_page`]); no I/O except
//! [`load_profiles_file`] reading its file.
//!
//! # Config file
//! One document (JSON is YAML, so both are read by the same YAML parser); unknown keys
//! anywhere are an error naming the key:
//! ```yaml
//! profiles:
//!   - name: my-cni
//!     selector: app=my-cni-agent          # equality-based label selector
//!     namespaces: [kube-system]
//!     port:                               # tried in order, first that resolves wins
//!       - {env: MY_CNI_METRICS_PORT}
//!       - {annotation: prometheus.io/port}
//!       - {container_port_name: metrics}
//!       - {number: 9100}
//!     path: /metrics                      # default /metrics
//!     metrics:                            # each a list of alternatives, first present wins
//!       apply_time: [{name: my_cni_apply_seconds}]          # summary or histogram
//!       failures: [{name: my_cni_errors_total, labels: {kind: apply}}]
//!       resyncs: [{name: my_cni_resyncs_total}]
//!       route_resync: [{name: my_cni_route_sync_seconds}]
//!       process_start: [{name: process_start_time_seconds}]
//! disable: [aws-node]                     # built-ins to drop (optional)
//! ```

use super::expo::Page;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Name of the built-in Calico Felix profile.
pub const CALICO_FELIX: &str = "calico-felix";
/// Name of the built-in Cilium agent profile.
pub const CILIUM_AGENT: &str = "cilium-agent";
/// Name of the built-in kube-proxy profile.
pub const KUBE_PROXY: &str = "kube-proxy";
/// Name of the built-in AWS VPC CNI profile.
pub const AWS_NODE: &str = "aws-node";

/// One way to find the agent's metrics port on its Pod; a profile tries its rules in
/// order and the first that yields a port wins.
///
/// In the config file each rule is a one-key map: `{env: NAME}`, `{annotation: KEY}`,
/// `{container_port_name: NAME}` or `{number: PORT}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "PortRuleSpec")]
pub enum PortRule {
    /// A container env var with a literal numeric `value` (e.g. Felix
    /// `FELIX_PROMETHEUSMETRICSPORT`; `valueFrom` is not resolved).
    Env(String),
    /// A Pod annotation with a numeric value (e.g. `prometheus.io/port`).
    Annotation(String),
    /// The `containerPort` of the container port with this name (e.g. Cilium's
    /// `prometheus`, aws-node's `metrics`).
    ContainerPortName(String),
    /// A fixed port.
    Number(u16),
}

/// The config-file form of a [`PortRule`] (exactly one key).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PortRuleSpec {
    env: Option<String>,
    annotation: Option<String>,
    container_port_name: Option<String>,
    number: Option<u16>,
}

impl TryFrom<PortRuleSpec> for PortRule {
    type Error = String;
    fn try_from(s: PortRuleSpec) -> Result<PortRule, String> {
        let mut rules = Vec::new();
        rules.extend(s.env.map(PortRule::Env));
        rules.extend(s.annotation.map(PortRule::Annotation));
        rules.extend(s.container_port_name.map(PortRule::ContainerPortName));
        rules.extend(s.number.map(PortRule::Number));
        match rules.len() {
            1 => Ok(rules.remove(0)),
            n => Err(format!(
                "a port rule needs exactly one of env, annotation, container_port_name, number (found {n})"
            )),
        }
    }
}

impl PortRule {
    /// Why this rule gave no port on a pod, for the `no_address` evidence: e.g.
    /// `no env FELIX_PROMETHEUSMETRICSPORT with a port number`, `no container port named
    /// "metrics"`.
    pub fn miss(&self) -> String {
        match self {
            PortRule::Env(n) => format!("no env {n} with a port number"),
            PortRule::Annotation(k) => format!("no annotation {k} with a port number"),
            PortRule::ContainerPortName(n) => format!("no container port named {n:?}"),
            PortRule::Number(n) => format!("port {n}"),
        }
    }
}

/// One metric to read: a family name plus an optional label filter (labels absent on a
/// sample count as `""`, as in PromQL) and a factor to base units (e.g. `0.001` for a
/// `_ms` metric).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricRef {
    /// Family or sample name (`x`, `x_total`).
    pub name: String,
    /// Label equality filter.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Multiplier to base units (seconds); default 1.
    #[serde(default = "one")]
    pub scale: f64,
}

fn one() -> f64 {
    1.0
}

impl MetricRef {
    /// A reference without label filter and scale 1.
    pub fn named(name: &str) -> MetricRef {
        MetricRef {
            name: name.to_owned(),
            labels: BTreeMap::new(),
            scale: 1.0,
        }
    }

    /// A reference with one label filter.
    pub fn with_label(name: &str, key: &str, value: &str) -> MetricRef {
        let mut m = MetricRef::named(name);
        m.labels.insert(key.to_owned(), value.to_owned());
        m
    }

    fn filter(&self) -> Vec<(&str, &str)> {
        self.labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// The metrics behind each correlation signal. Each field is a list of alternatives
/// (version aliases): the first whose family is on the page is read.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalMetrics {
    /// Dataplane apply time, a summary or histogram read as cumulative `_sum`/`_count`
    /// (→ `dataplane_apply_slow`).
    #[serde(default)]
    pub apply_time: Vec<MetricRef>,
    /// Apply failures, a counter (→ `dataplane_apply_failures`).
    #[serde(default)]
    pub failures: Vec<MetricRef>,
    /// Datastore resyncs started, a counter (→ `datastore_resync`).
    #[serde(default)]
    pub resyncs: Vec<MetricRef>,
    /// Route-table resync time, summary or histogram (→ `route_resync_slow`).
    #[serde(default)]
    pub route_resync: Vec<MetricRef>,
    /// Process start, Unix seconds, a gauge (a change = a restart → `agent_restarted`).
    #[serde(default)]
    pub process_start: Vec<MetricRef>,
}

/// An agent profile: how to find, reach and read one kind of node agent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Profile name (`calico-felix`, …); also the `profile` label of
    /// `firstpacket_agent_scrapes_total`.
    pub name: String,
    /// Equality-based label selector (`k=v,k2!=v2,k3,!k4`), as for `kubectl -l`.
    pub selector: String,
    /// Namespaces to watch for the agent's pods.
    pub namespaces: Vec<String>,
    /// Port rules, tried in order.
    pub port: Vec<PortRule>,
    /// HTTP path of the page; default `/metrics`.
    #[serde(default = "default_path")]
    pub path: String,
    /// Metrics behind each signal.
    #[serde(default)]
    pub metrics: SignalMetrics,
    /// A hint shown in the evidence of `agent_unreachable` (e.g. how to enable metrics).
    #[serde(default)]
    pub unreachable_hint: Option<String>,
}

fn default_path() -> String {
    "/metrics".to_owned()
}

fn refs(names: &[&str]) -> Vec<MetricRef> {
    names.iter().map(|n| MetricRef::named(n)).collect()
}

/// The four built-in profiles, exactly as docs/design.md §3's table.
///
/// Sources: Felix metric names from the Calico "Felix Prometheus metrics" reference and
/// the real 3.20 page in `prober/tests/fixtures/felix-3.20-1.prom` (≤ 3.28 route-table names
/// `felix_route_table_list_seconds` / `felix_route_table_per_iface_sync_seconds`;
/// ≥ 3.29 `felix_route_table_resync_seconds` / `…_partial_resync_seconds`); Felix port
/// `PrometheusMetricsPort` default 9091 (Felix configuration reference). Cilium: the
/// `prometheus` container port (9962 today, 9090 in 1.11; Cilium Helm chart), metrics as
/// in `prober/tests/fixtures/cilium-1.11.0.prom`. kube-proxy: `metricsBindAddress` default
/// `127.0.0.1:10249` (kube-proxy configuration reference), metrics as in
/// `prober/tests/fixtures/kube-proxy-1.21.1.prom`. aws-node: `metrics` port 61678 (amazon-vpc-cni-k8s
/// `aws-k8s-cni.yaml`).
pub fn builtin_profiles() -> Vec<Profile> {
    vec![
        Profile {
            name: CALICO_FELIX.to_owned(),
            selector: "k8s-app=calico-node".to_owned(),
            namespaces: vec!["calico-system".to_owned(), "kube-system".to_owned()],
            port: vec![
                PortRule::Env("FELIX_PROMETHEUSMETRICSPORT".to_owned()),
                PortRule::Annotation("prometheus.io/port".to_owned()),
                PortRule::Number(9091),
            ],
            path: default_path(),
            metrics: SignalMetrics {
                apply_time: refs(&["felix_int_dataplane_apply_time_seconds"]),
                failures: refs(&["felix_int_dataplane_failures"]),
                resyncs: refs(&["felix_resyncs_started"]),
                route_resync: refs(&[
                    "felix_route_table_resync_seconds",
                    "felix_route_table_list_seconds",
                ]),
                process_start: refs(&["process_start_time_seconds"]),
            },
            unreachable_hint: Some(
                "Felix metrics are off by default: set FelixConfiguration \
                 prometheusMetricsEnabled: true (port 9091)"
                    .to_owned(),
            ),
        },
        Profile {
            name: CILIUM_AGENT.to_owned(),
            selector: "k8s-app=cilium".to_owned(),
            namespaces: vec!["kube-system".to_owned()],
            port: vec![PortRule::ContainerPortName("prometheus".to_owned())],
            path: default_path(),
            metrics: SignalMetrics {
                apply_time: vec![MetricRef::with_label(
                    "cilium_endpoint_regeneration_time_stats_seconds",
                    "scope",
                    "total",
                )],
                failures: vec![MetricRef::with_label(
                    "cilium_endpoint_regenerations_total",
                    "outcome",
                    "fail",
                )],
                resyncs: Vec::new(),
                route_resync: Vec::new(),
                process_start: refs(&[
                    "cilium_process_start_time_seconds",
                    "process_start_time_seconds",
                ]),
            },
            unreachable_hint: Some("enable agent metrics: Helm prometheus.enabled=true".to_owned()),
        },
        Profile {
            name: KUBE_PROXY.to_owned(),
            selector: "k8s-app=kube-proxy".to_owned(),
            namespaces: vec!["kube-system".to_owned()],
            port: vec![PortRule::Number(10249)],
            path: default_path(),
            metrics: SignalMetrics {
                apply_time: refs(&["kubeproxy_sync_proxy_rules_duration_seconds"]),
                failures: refs(&["kubeproxy_sync_proxy_rules_iptables_restore_failures_total"]),
                resyncs: Vec::new(),
                route_resync: Vec::new(),
                process_start: refs(&["process_start_time_seconds"]),
            },
            unreachable_hint: Some(
                "kube-proxy binds metrics to 127.0.0.1:10249 by default: set \
                 metricsBindAddress: 0.0.0.0:10249"
                    .to_owned(),
            ),
        },
        Profile {
            name: AWS_NODE.to_owned(),
            selector: "k8s-app=aws-node".to_owned(),
            namespaces: vec!["kube-system".to_owned()],
            port: vec![
                PortRule::ContainerPortName("metrics".to_owned()),
                PortRule::Number(61678),
            ],
            path: default_path(),
            metrics: SignalMetrics {
                apply_time: Vec::new(),
                failures: refs(&["awscni_ipamd_error_count"]),
                resyncs: Vec::new(),
                route_resync: Vec::new(),
                process_start: refs(&["process_start_time_seconds"]),
            },
            unreachable_hint: None,
        },
    ]
}

/// A config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("cannot read agent config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML/JSON for the schema (unknown keys are named here).
    #[error("invalid agent config {path}: {message}")]
    Invalid {
        /// The file (or `<string>`).
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    profiles: Vec<Profile>,
    #[serde(default)]
    disable: Vec<String>,
}

/// Reads a profiles document (YAML or JSON; see the module doc) and merges it over the
/// built-ins: a profile with a built-in's name replaces it, names in `disable` drop
/// built-ins, the rest are added. `origin` names the source in errors. Disabling every
/// built-in without adding a profile is valid and yields an empty list (correlation
/// off).
///
/// Errors: [`ProfileError::Invalid`] for syntax errors, unknown keys, a profile without
/// a port rule or namespace, an empty or invalid selector ([`parse_selector`]), a `path`
/// not starting with `/`, a metric `scale` that is not a finite number > 0, a `disable`
/// entry that names no built-in profile (the message lists the built-ins), or two
/// profiles with one name.
pub fn parse_profiles(text: &str, origin: &str) -> Result<Vec<Profile>, ProfileError> {
    let invalid = |message: String| ProfileError::Invalid {
        path: origin.to_owned(),
        message,
    };
    let file: ConfigFile = serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let mut seen = std::collections::HashSet::new();
    for p in &file.profiles {
        if !seen.insert(p.name.clone()) {
            return Err(invalid(format!("profile {:?} defined twice", p.name)));
        }
        if p.namespaces.is_empty() {
            return Err(invalid(format!(
                "profile {:?}: namespaces is empty",
                p.name
            )));
        }
        if p.port.is_empty() {
            return Err(invalid(format!("profile {:?}: port has no rule", p.name)));
        }
        parse_selector(&p.selector)
            .map_err(|m| invalid(format!("profile {:?}: selector: {m}", p.name)))?;
        if !p.path.starts_with('/') {
            return Err(invalid(format!(
                "profile {:?}: path {:?} must start with \"/\" (e.g. \"/{}\")",
                p.name, p.path, p.path
            )));
        }
        validate_scales(&p.metrics).map_err(|m| invalid(format!("profile {:?}: {m}", p.name)))?;
    }
    let builtins = builtin_profiles();
    for d in &file.disable {
        if !builtins.iter().any(|b| &b.name == d) {
            let known: Vec<&str> = builtins.iter().map(|b| b.name.as_str()).collect();
            return Err(invalid(format!(
                "disable: unknown profile {d:?} (built-in profiles: {})",
                known.join(", ")
            )));
        }
    }
    let mut out: Vec<Profile> = builtins
        .into_iter()
        .filter(|b| !file.disable.contains(&b.name))
        .filter(|b| !file.profiles.iter().any(|p| p.name == b.name))
        .collect();
    out.extend(file.profiles);
    Ok(out)
}

/// Every `scale` of `m` must be finite and > 0 (a factor to base units; 0, negative or
/// NaN would turn every reading into nonsense silently).
fn validate_scales(m: &SignalMetrics) -> Result<(), String> {
    let groups: [(&str, &[MetricRef]); 5] = [
        ("apply_time", &m.apply_time),
        ("failures", &m.failures),
        ("resyncs", &m.resyncs),
        ("route_resync", &m.route_resync),
        ("process_start", &m.process_start),
    ];
    for (group, refs) in groups {
        for r in refs {
            if !(r.scale.is_finite() && r.scale > 0.0) {
                return Err(format!(
                    "metrics.{group}: {}: scale {} must be a finite number > 0",
                    r.name, r.scale
                ));
            }
        }
    }
    Ok(())
}

/// [`parse_profiles`] on the contents of `path`.
pub fn load_profiles_file(path: &Path) -> Result<Vec<Profile>, ProfileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_profiles(&text, &path.display().to_string())
}

/// One term of an equality-based label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectorTerm {
    /// `k=v` or `k==v`.
    Eq(String, String),
    /// `k!=v` (also true when `k` is absent, as in Kubernetes).
    Ne(String, String),
    /// `k`: the label exists.
    Exists(String),
    /// `!k`: the label does not exist.
    NotExists(String),
}

/// Parses an equality-based selector (`k=v,k2!=v2,k3,!k4`; Kubernetes "Labels and
/// Selectors", equality-based requirements; whitespace around keys and values is
/// ignored, as by `kubectl -l`).
///
/// Errors (messages name the whole selector or the offending term): an empty selector
/// (it would select every pod in the namespaces), set-based requirements (`in`,
/// `notin`, parentheses), an empty term, and keys or values that are not Kubernetes
/// label syntax ([`check_label_key`], [`check_label_value`]) — so `a=b=c` (value `b=c`)
/// and `!!x` (key `!x`) are rejected.
pub fn parse_selector(s: &str) -> Result<Vec<SelectorTerm>, String> {
    if s.trim().is_empty() {
        return Err("empty selector would match every pod: name the agent's labels, e.g. k8s-app=calico-node".to_owned());
    }
    let words: Vec<&str> = s
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .collect();
    if s.contains('(') || s.contains(')') || words.iter().any(|w| *w == "in" || *w == "notin") {
        return Err(format!(
            "{s:?}: set-based requirements (in, notin) are not supported; use equality-based terms (k=v, k!=v, k, !k)"
        ));
    }
    let mut out = Vec::new();
    for raw in s.split(',') {
        let t = raw.trim();
        if t.is_empty() {
            return Err(format!("{s:?}: empty term"));
        }
        let term = if let Some((k, v)) = t.split_once("!=") {
            SelectorTerm::Ne(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = t.split_once("==") {
            SelectorTerm::Eq(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = t.split_once('=') {
            SelectorTerm::Eq(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some(k) = t.strip_prefix('!') {
            SelectorTerm::NotExists(k.trim().to_owned())
        } else {
            SelectorTerm::Exists(t.to_owned())
        };
        let (key, value) = match &term {
            SelectorTerm::Eq(k, v) | SelectorTerm::Ne(k, v) => (k, Some(v)),
            SelectorTerm::Exists(k) | SelectorTerm::NotExists(k) => (k, None),
        };
        check_label_key(key).map_err(|m| format!("{t:?}: {m}"))?;
        if let Some(v) = value {
            check_label_value(v).map_err(|m| format!("{t:?}: {m}"))?;
        }
        out.push(term);
    }
    Ok(out)
}

/// A label name segment: ≤ 63 characters, `[A-Za-z0-9]` at both ends, `-`, `_`, `.`
/// and alphanumerics between (Kubernetes "Labels and Selectors", syntax and character
/// set; apimachinery `validation.IsQualifiedName`).
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 subdomain (label key prefix): ≤ 253 characters, lowercase alphanumerics,
/// `-` and `.`, alphanumeric at both ends (apimachinery `IsDNS1123Subdomain`).
fn is_dns_subdomain(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'.'))
}

/// Checks a label key: `[prefix/]name`, the prefix a DNS subdomain, the name as in
/// `is_label_name` (Kubernetes "Labels and Selectors", syntax and character set).
pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if k.is_empty() {
        return Err("empty label key".to_owned());
    }
    if let Some(p) = prefix {
        if !is_dns_subdomain(p) {
            return Err(format!(
                "label key {k:?}: prefix {p:?} is not a DNS subdomain (lowercase letters, digits, '-', '.')"
            ));
        }
    }
    if !is_label_name(name) {
        return Err(format!(
            "label key {k:?} is not valid (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit, optionally after a DNS-subdomain prefix and '/')"
        ));
    }
    Ok(())
}

/// Checks a label value: empty, or as `is_label_name` (Kubernetes "Labels and
/// Selectors", syntax and character set).
pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_label_name(v) {
        Ok(())
    } else {
        Err(format!(
            "label value {v:?} is not valid (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        ))
    }
}

/// Whether `labels` satisfy every term of `terms`.
pub fn selector_matches(terms: &[SelectorTerm], labels: &BTreeMap<String, String>) -> bool {
    terms.iter().all(|t| match t {
        SelectorTerm::Eq(k, v) => labels.get(k) == Some(v),
        SelectorTerm::Ne(k, v) => labels.get(k) != Some(v),
        SelectorTerm::Exists(k) => labels.contains_key(k),
        SelectorTerm::NotExists(k) => !labels.contains_key(k),
    })
}

/// Cumulative `_sum` (base units, seconds) and `_count` of a summary or histogram.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SumCount {
    /// Σ of observations, seconds (after the reference's `scale`).
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
}

/// What one scrape of one agent says, reduced to the numbers correlation needs. `None`
/// means the family is not on the page (normal across versions).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentReading {
    /// Apply time, cumulative.
    pub apply: Option<SumCount>,
    /// The p99 (or highest) quantile of the apply-time summary, seconds: context only
    /// (client_golang summaries cover a sliding 10-minute window, not the probe's).
    pub apply_p99_seconds: Option<f64>,
    /// Failures, cumulative counter.
    pub failures: Option<f64>,
    /// Resyncs started, cumulative counter.
    pub resyncs: Option<f64>,
    /// Route-table resync time, cumulative.
    pub route_resync: Option<SumCount>,
    /// Agent process start, Unix seconds.
    pub process_start: Option<f64>,
}

impl AgentReading {
    /// Reads the profile's metrics from a parsed page.
    pub fn from_page(profile: &Profile, page: &Page) -> AgentReading {
        let sum_count = |alts: &[MetricRef]| -> Option<SumCount> {
            alts.iter().find_map(|m| {
                let fam = page.family(&m.name)?;
                let (sum, count) = fam.sum_count(&m.filter())?;
                Some(SumCount {
                    sum: sum * m.scale,
                    count,
                })
            })
        };
        let apply = sum_count(&profile.metrics.apply_time);
        let route_resync = sum_count(&profile.metrics.route_resync);
        let scalar = |alts: &[MetricRef]| -> Option<f64> {
            alts.iter().find_map(|m| {
                // A labelled series is created on its first event (client_golang
                // `CounterVec`): family present, series absent = 0 so far.
                page.family(&m.name)?;
                let v = page.scalar(&m.name, &m.filter()).unwrap_or(0.0);
                Some(v * m.scale)
            })
        };
        let failures = scalar(&profile.metrics.failures);
        let resyncs = scalar(&profile.metrics.resyncs);
        let process_start = scalar(&profile.metrics.process_start);
        let apply_p99_seconds = profile.metrics.apply_time.iter().find_map(|m| {
            let fam = page.family(&m.name)?;
            let q = fam.quantiles_matching(&m.filter());
            q.last().map(|(_, v)| v * m.scale).filter(|v| v.is_finite())
        });
        AgentReading {
            apply,
            apply_p99_seconds,
            failures,
            resyncs,
            route_resync,
            process_start,
        }
    }

    /// Whether none of the profile's signal metrics (other than process start) was on
    /// the page: such a page cannot explain anything (`agent_bad_metrics`).
    pub fn has_no_signal(&self) -> bool {
        self.apply.is_none()
            && self.failures.is_none()
            && self.resyncs.is_none()
            && self.route_resync.is_none()
    }
}

/// The profile named `name` in `profiles`.
pub fn find<'a>(profiles: &'a [Profile], name: &str) -> Option<&'a Profile> {
    profiles.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_follow_the_design_table() {
        let b = builtin_profiles();
        let felix = find(&b, CALICO_FELIX).expect("felix");
        assert_eq!(felix.selector, "k8s-app=calico-node");
        assert_eq!(felix.namespaces, ["calico-system", "kube-system"]);
        assert_eq!(felix.port.last(), Some(&PortRule::Number(9091)));
        assert_eq!(
            find(&b, KUBE_PROXY).map(|p| p.port.clone()),
            Some(vec![PortRule::Number(10249)])
        );
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn config_file_adds_replaces_and_disables_profiles() {
        let yaml = r#"
profiles:
  - name: my-cni
    selector: app=my-cni
    namespaces: [net]
    port: [{number: 9100}]
    metrics:
      failures: [{name: my_errors_total, labels: {kind: apply}}]
  - name: kube-proxy
    selector: component=kube-proxy
    namespaces: [kube-system]
    port: [{container_port_name: metrics}]
disable: [aws-node]
"#;
        let p = parse_profiles(yaml, "t.yaml").expect("valid");
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["calico-felix", "cilium-agent", "my-cni", "kube-proxy"]
        );
        assert_eq!(
            find(&p, KUBE_PROXY).map(|p| p.selector.as_str()),
            Some("component=kube-proxy")
        );
        let f = &find(&p, "my-cni").expect("mine").metrics.failures[0];
        assert_eq!(f.labels.get("kind").map(String::as_str), Some("apply"));
    }

    #[test]
    fn config_file_accepts_json() {
        let json = r#"{"profiles":[{"name":"x","selector":"a=b","namespaces":["n"],"port":[{"annotation":"prometheus.io/port"}]}]}"#;
        let p = parse_profiles(json, "t.json").expect("valid");
        assert_eq!(p.len(), 5);
    }

    #[test]
    fn unknown_key_in_config_is_an_error_naming_it() {
        let yaml = "profiles:\n  - name: x\n    selector: a=b\n    namespaces: [n]\n    port: [{number: 1}]\n    scrape_every: 5s\n";
        let err = parse_profiles(yaml, "t.yaml").expect_err("unknown key");
        assert!(err.to_string().contains("scrape_every"), "{err}");
        let err = parse_profiles("profile: []\n", "t.yaml").expect_err("unknown top key");
        assert!(err.to_string().contains("profile"), "{err}");
    }

    #[test]
    fn profile_without_port_rule_is_rejected() {
        let yaml = "profiles:\n  - name: x\n    selector: a=b\n    namespaces: [n]\n    port: []\n";
        assert!(parse_profiles(yaml, "t").is_err());
    }

    #[test]
    fn selector_terms_match_like_kubectl() {
        let t = parse_selector("k8s-app=calico-node,tier!=x,present,!absent").expect("ok");
        let mut l = BTreeMap::new();
        l.insert("k8s-app".to_owned(), "calico-node".to_owned());
        l.insert("present".to_owned(), "".to_owned());
        assert!(selector_matches(&t, &l));
        l.insert("tier".to_owned(), "x".to_owned());
        assert!(!selector_matches(&t, &l));
        assert!(parse_selector("a in (b)").is_err());
    }

    /// A one-profile config whose `key: value` line replaces the selector line, or is
    /// added, for the validation tests below.
    fn one_profile(selector: &str, extra: &str) -> String {
        format!(
            "profiles:\n  - name: x\n    selector: {selector}\n    namespaces: [n]\n    port: [{{number: 1}}]\n{extra}"
        )
    }

    fn config_error(yaml: &str) -> String {
        parse_profiles(yaml, "t.yaml")
            .expect_err("must be rejected")
            .to_string()
    }

    #[test]
    fn empty_selector_is_rejected_because_it_matches_every_pod() {
        assert_eq!(
            config_error(&one_profile("\"\"", "")),
            "invalid agent config t.yaml: profile \"x\": selector: empty selector would match every pod: name the agent's labels, e.g. k8s-app=calico-node"
        );
    }

    #[test]
    fn selector_with_a_value_containing_equals_is_rejected() {
        assert_eq!(
            config_error(&one_profile("a=b=c", "")),
            "invalid agent config t.yaml: profile \"x\": selector: \"a=b=c\": label value \"b=c\" is not valid (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        );
    }

    #[test]
    fn selector_with_a_double_negation_is_rejected() {
        assert_eq!(
            config_error(&one_profile("\"!!x\"", "")),
            "invalid agent config t.yaml: profile \"x\": selector: \"!!x\": label key \"!x\" is not valid (at most 63 characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit, optionally after a DNS-subdomain prefix and '/')"
        );
    }

    #[test]
    fn set_based_selector_error_shows_the_whole_selector() {
        assert_eq!(
            config_error(&one_profile("\"app in (a,b)\"", "")),
            "invalid agent config t.yaml: profile \"x\": selector: \"app in (a,b)\": set-based requirements (in, notin) are not supported; use equality-based terms (k=v, k!=v, k, !k)"
        );
    }

    #[test]
    fn prefixed_keys_and_spaced_terms_are_valid_selectors() {
        let t = parse_selector("app.kubernetes.io/name = cilium-agent, !tier").expect("valid");
        assert_eq!(
            t,
            [
                SelectorTerm::Eq("app.kubernetes.io/name".into(), "cilium-agent".into()),
                SelectorTerm::NotExists("tier".into())
            ]
        );
        assert!(parse_selector("Bad_Prefix/x=y").is_err());
    }

    #[test]
    fn path_without_leading_slash_is_rejected() {
        assert_eq!(
            config_error(&one_profile("a=b", "    path: metrics\n")),
            "invalid agent config t.yaml: profile \"x\": path \"metrics\" must start with \"/\" (e.g. \"/metrics\")"
        );
    }

    #[test]
    fn negative_or_nan_scale_is_rejected() {
        let m = |scale: &str| {
            one_profile(
                "a=b",
                &format!("    metrics:\n      failures: [{{name: errs_total, scale: {scale}}}]\n"),
            )
        };
        assert_eq!(
            config_error(&m("-1")),
            "invalid agent config t.yaml: profile \"x\": metrics.failures: errs_total: scale -1 must be a finite number > 0"
        );
        assert_eq!(
            config_error(&m(".nan")),
            "invalid agent config t.yaml: profile \"x\": metrics.failures: errs_total: scale NaN must be a finite number > 0"
        );
        assert!(parse_profiles(&m("0.001"), "t.yaml").is_ok());
    }

    #[test]
    fn disabling_an_unknown_profile_names_the_known_ones() {
        assert_eq!(
            config_error("disable: [cilium, nosuch]\n"),
            "invalid agent config t.yaml: disable: unknown profile \"cilium\" (built-in profiles: calico-felix, cilium-agent, kube-proxy, aws-node)"
        );
    }

    #[test]
    fn disabling_every_builtin_gives_no_profiles() {
        let p = parse_profiles(
            "disable: [calico-felix, cilium-agent, kube-proxy, aws-node]\n",
            "t.yaml",
        )
        .expect("valid");
        assert!(p.is_empty());
    }

    #[test]
    fn port_rule_misses_name_the_rule() {
        assert_eq!(
            PortRule::ContainerPortName("nosuchport".into()).miss(),
            "no container port named \"nosuchport\""
        );
        assert_eq!(
            PortRule::Env("FELIX_PROMETHEUSMETRICSPORT".into()).miss(),
            "no env FELIX_PROMETHEUSMETRICSPORT with a port number"
        );
    }
}
