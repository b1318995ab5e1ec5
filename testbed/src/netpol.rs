//! Kubernetes NetworkPolicy semantics (`networking.k8s.io/v1`) as the simulated agent
//! enforces them: which pods a policy isolates, and which peers, ports and protocols it
//! admits to or from them. Pure: objects in (their JSON wire shape), decisions out; the
//! agent ([`crate::agent`], [`crate::policy_sync`]) learns the objects from the API and
//! writes the decisions into the node's nftables ([`crate::dataplane`]).
//!
//! The rules, from the Kubernetes documentation ("Network Policies",
//! kubernetes.io/docs/concepts/services-networking/network-policies/) and the
//! `networking.k8s.io/v1` API reference:
//! - A pod is **isolated for ingress** (egress) when at least one NetworkPolicy of its
//!   namespace selects it (`spec.podSelector`: `matchLabels` and `matchExpressions`
//!   ANDed; `{}` selects every pod of the namespace) and has `Ingress` (`Egress`) in its
//!   `policyTypes`. Without `policyTypes` the API defaults it to `Ingress`, plus
//!   `Egress` when `spec.egress` has at least one rule (kube-apiserver
//!   `pkg/apis/networking/v1/defaults.go` `SetDefaults_NetworkPolicy`); the agent
//!   applies the same defaulting, so an object stored without it means the same.
//! - Traffic of an isolated direction is admitted when **any** rule of **any** policy
//!   selecting the pod admits it (policies are additive, never subtractive). A rule
//!   admits a peer listed in `from` (`to`) and a port listed in `ports`; a missing or
//!   empty `from`/`to` admits every peer, a missing or empty `ports` every port.
//!   `ingress: []`, `egress: []` or no rules at all admit nothing (deny all).
//! - Peers: `podSelector` alone = pods of the policy's namespace; `namespaceSelector`
//!   alone = every pod of the namespaces it selects (by the Namespace's labels; every
//!   namespace carries `kubernetes.io/metadata.name: NAME`, which the agent assumes even
//!   when its Namespace object was not seen yet); both in one peer = pods matching the
//!   pod selector **in** namespaces matching the namespace selector (AND); `ipBlock
//!   {cidr, except}` = any address inside `cidr` and outside every `except`, pod or not
//!   (ipBlock matches addresses, not pods). Host-network pods are never selected as peers
//!   (their address is their node's; Kubernetes leaves them undefined, Calico excludes
//!   them), and pods without an IP or whose phase is `Succeeded`/`Failed` have nothing
//!   to admit.
//! - Ports: `{protocol, port, endPort}`, protocol `TCP` (the default), `UDP` or `SCTP`;
//!   a numeric `port` (with `endPort`, the range `port..=endPort`); no `port` = every
//!   port of the protocol. **Named ports** (`port: http`) are not resolved: such an
//!   entry admits nothing and the policy carries a warning the agent logs (so a policy
//!   never admits more than it says). An unknown protocol is skipped the same way.
//! - Traffic between a pod and **its own node** is always allowed ("traffic to and from
//!   the node where a Pod is running is always allowed", as Calico does): the agent
//!   enforces only on forwarded traffic, which never has the own node at one end
//!   ([`allows`] states it for one packet).
//! - IPv4 only: an IPv6 `ipBlock` can never match the testbed's IPv4 pod traffic and is
//!   skipped (with a warning).
//!
//! A pod is not its own peer: its traffic to itself never leaves its network namespace,
//! so no rule is needed for it (and no truth event names it).

use k8s_openapi::api::networking::v1 as netv1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as K8sSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::Ipv4Addr;

/// The label kube-apiserver sets on every Namespace (`kubernetes.io/metadata.name:
/// NAME`, Kubernetes ≥ 1.21), which namespace selectors use to name one namespace.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// `Ingress` (traffic to the selected pod) or `Egress` (traffic from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// Both, ingress first.
    pub const BOTH: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    /// `"ingress"` / `"egress"` (the truth log's `detail.direction`).
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// A label selector's operator (`matchExpressions[].operator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One `matchExpressions` item.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Operator,
    values: BTreeSet<String>,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`, ANDed; empty
/// matches everything), as k8s.io/apimachinery `LabelSelectorAsSelector` reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    labels: BTreeMap<String, String>,
    exprs: Vec<Requirement>,
}

impl Selector {
    /// From the API type. Errors: an operator other than `In`, `NotIn`, `Exists`,
    /// `DoesNotExist` (kube-apiserver refuses such objects; a store that did not is
    /// not trusted with a guess).
    pub fn from_k8s(s: &K8sSelector) -> Result<Selector, String> {
        let mut exprs = Vec::new();
        for e in s.match_expressions.iter().flatten() {
            let op = match e.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => return Err(format!("unknown selector operator {other:?}")),
            };
            exprs.push(Requirement {
                key: e.key.clone(),
                op,
                values: e.values.iter().flatten().cloned().collect(),
            });
        }
        Ok(Selector {
            labels: s.match_labels.clone().unwrap_or_default(),
            exprs,
        })
    }

    /// Whether `labels` satisfy every `matchLabels` pair and every expression (`NotIn`
    /// also matches when the key is absent, as in Kubernetes).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.exprs.iter().all(|r| {
                let got = labels.get(&r.key);
                match r.op {
                    Operator::In => got.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => got.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => got.is_some(),
                    Operator::DoesNotExist => got.is_none(),
                }
            })
    }
}

/// An IPv4 prefix with its host bits cleared (so `10.1.2.3/8` is `10.0.0.0/8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    /// `ip/32`.
    pub fn host(ip: Ipv4Addr) -> Cidr {
        Cidr { addr: ip, len: 32 }
    }

    fn mask(len: u8) -> u32 {
        if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        }
    }

    /// Parses `A.B.C.D/L`. `Ok(None)` for an IPv6 prefix (never matches IPv4 traffic).
    /// Errors: anything else.
    pub fn parse(s: &str) -> Result<Option<Cidr>, String> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not ADDRESS/LENGTH"))?;
        if a.contains(':') {
            return Ok(None);
        }
        let addr: Ipv4Addr = a.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let len: u8 = l.parse().map_err(|e| format!("{s:?}: {e}"))?;
        if len > 32 {
            return Err(format!("{s:?}: prefix length above 32"));
        }
        Ok(Some(Cidr {
            addr: Ipv4Addr::from(u32::from(addr) & Cidr::mask(len)),
            len,
        }))
    }

    /// Whether `ip` is inside.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & Cidr::mask(self.len) == u32::from(self.addr)
    }

    /// Whether every address of `other` is inside this prefix.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.len >= self.len && self.contains(other.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// A transport protocol a policy port names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// nftables' keyword (`tcp`, `udp`, `sctp`).
    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// One admitted port entry: a protocol and a destination port range (`None`: every port
/// of the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub protocol: Protocol,
    pub ports: Option<(u16, u16)>,
}

impl PortRange {
    /// Whether a packet of `protocol` to destination port `port` is in the range.
    pub fn matches(&self, protocol: Protocol, port: u16) -> bool {
        self.protocol == protocol && self.ports.is_none_or(|(a, b)| (a..=b).contains(&port))
    }
}

impl fmt::Display for PortRange {
    /// `8080/tcp`, `8080-8090/tcp`, `tcp` (every port).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ports {
            None => write!(f, "{}", self.protocol.nft()),
            Some((a, b)) if a == b => write!(f, "{a}/{}", self.protocol.nft()),
            Some((a, b)) => write!(f, "{a}-{b}/{}", self.protocol.nft()),
        }
    }
}

/// The ports a peer is admitted on: all of them, or these ranges.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ports {
    All,
    Only(BTreeSet<PortRange>),
}

impl Ports {
    fn union(&mut self, other: &Ports) {
        match (&mut *self, other) {
            (Ports::All, _) => {}
            (_, Ports::All) => *self = Ports::All,
            (Ports::Only(a), Ports::Only(b)) => a.extend(b.iter().copied()),
        }
    }

    /// Whether `protocol`/`port` is admitted.
    pub fn matches(&self, protocol: Protocol, port: u16) -> bool {
        match self {
            Ports::All => true,
            Ports::Only(r) => r.iter().any(|r| r.matches(protocol, port)),
        }
    }

    /// As the truth log shows them: `["8080/tcp"]`, `["all"]`.
    pub fn labels(&self) -> Vec<String> {
        match self {
            Ports::All => vec!["all".into()],
            Ports::Only(r) => r.iter().map(ToString::to_string).collect(),
        }
    }
}

/// The addresses one admission matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerMatch {
    /// Every address (an empty `from`/`to`).
    Any,
    /// Inside `cidr` and outside every `except` (a pod peer is its `/32`).
    Net { cidr: Cidr, except: Vec<Cidr> },
}

impl PeerMatch {
    /// Whether `ip` is matched.
    pub fn matches(&self, ip: Ipv4Addr) -> bool {
        match self {
            PeerMatch::Any => true,
            PeerMatch::Net { cidr, except } => {
                cidr.contains(ip) && !except.iter().any(|e| e.contains(ip))
            }
        }
    }
}

/// Who is admitted: the key of one admission (one truth transition each).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PeerKey {
    /// A pod, by uid (selected by pod/namespace selectors, or an `ipBlock` that is
    /// exactly its `/32`).
    Pod(String),
    /// An `ipBlock` that is not exactly one pod's address.
    Block { cidr: Cidr, except: Vec<Cidr> },
    /// Every peer (a rule with an empty `from`/`to`).
    Any,
}

/// A pod admitted as a peer: identity for the truth log.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ip: Ipv4Addr,
}

/// One admitted peer of one pod in one direction, merged over every rule admitting it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Admission {
    /// The first admitting policy, `namespace/name` (policies in name order).
    pub policy: String,
    /// The addresses it matches.
    pub peer: PeerMatch,
    /// The pod behind it, when it is one.
    pub pod: Option<PeerPod>,
    /// The ports and protocols admitted (union over the admitting rules).
    pub ports: Ports,
}

impl Admission {
    /// The peer's address for the truth log's `ip`: the pod IP, the CIDR
    /// (`10.0.0.0/8`), or `0.0.0.0/0` for every peer.
    pub fn peer_ip(&self) -> String {
        match (&self.pod, &self.peer) {
            (Some(p), _) => p.ip.to_string(),
            (None, PeerMatch::Any) => "0.0.0.0/0".into(),
            (None, PeerMatch::Net { cidr, .. }) if cidr.len == 32 => cidr.addr.to_string(),
            (None, PeerMatch::Net { cidr, .. }) => cidr.to_string(),
        }
    }
}

/// What one direction of one pod needs: isolated or not, and if so whom it admits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirPolicy {
    /// `Some(first selecting policy, "namespace/name")` when isolated.
    pub isolated_by: Option<String>,
    /// Admitted peers (empty when not isolated: everything passes then).
    pub admits: BTreeMap<PeerKey, Admission>,
}

impl DirPolicy {
    /// Whether traffic with remote address `remote`, `protocol` and destination port
    /// `port` passes (not isolated, or admitted by some admission).
    pub fn admits(&self, remote: Ipv4Addr, protocol: Protocol, port: u16) -> bool {
        self.isolated_by.is_none()
            || self
                .admits
                .values()
                .any(|a| a.peer.matches(remote) && a.ports.matches(protocol, port))
    }
}

/// Both directions of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodPolicy {
    pub ingress: DirPolicy,
    pub egress: DirPolicy,
}

impl PodPolicy {
    /// One direction.
    pub fn dir(&self, d: Direction) -> &DirPolicy {
        match d {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    fn dir_mut(&mut self, d: Direction) -> &mut DirPolicy {
        match d {
            Direction::Ingress => &mut self.ingress,
            Direction::Egress => &mut self.egress,
        }
    }
}

/// Whether the ruleset the agent writes for a pod with `policy` on a node with IP
/// `node_ip` passes one new connection: `dir` Ingress = from `remote` to the pod,
/// `port` the pod's; Egress = from the pod to `remote`, `port` the remote's. Traffic
/// with the pod's own node is always allowed (module docs).
pub fn allows(
    policy: &PodPolicy,
    dir: Direction,
    remote: Ipv4Addr,
    node_ip: Ipv4Addr,
    protocol: Protocol,
    port: u16,
) -> bool {
    remote == node_ip || policy.dir(dir).admits(remote, protocol, port)
}

/// One peer of a rule, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Peer {
    /// `podSelector` and/or `namespaceSelector` (`None` = not given).
    Pods {
        pods: Option<Selector>,
        namespaces: Option<Selector>,
    },
    /// `ipBlock`.
    Block { cidr: Cidr, except: Vec<Cidr> },
}

/// One ingress or egress rule, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    /// `None`: every peer (missing or empty `from`/`to`).
    peers: Option<Vec<Peer>>,
    /// What it admits on.
    ports: Ports,
}

/// A NetworkPolicy, parsed and defaulted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    pod_selector: Selector,
    /// `Some(rules)` when `Ingress` is among the (defaulted) policy types.
    ingress: Option<Vec<Rule>>,
    /// `Some(rules)` when `Egress` is.
    egress: Option<Vec<Rule>>,
    /// What of the policy the agent does not enforce (named ports, IPv6 blocks,
    /// unknown protocols, malformed peers), one sentence each, for the log.
    pub warnings: Vec<String>,
}

impl Policy {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn rules(&self, d: Direction) -> Option<&Vec<Rule>> {
        match d {
            Direction::Ingress => self.ingress.as_ref(),
            Direction::Egress => self.egress.as_ref(),
        }
    }

    /// Parses a `networking.k8s.io/v1` NetworkPolicy in its JSON wire shape and applies
    /// the API defaults (`policyTypes`, `podSelector: {}`, protocol `TCP`). Errors: not
    /// a NetworkPolicy (no namespace or name, a field of the wrong type), an invalid
    /// selector: the agent then ignores the object and logs the error.
    pub fn from_value(v: &Value) -> Result<Policy, String> {
        let np: netv1::NetworkPolicy =
            serde_json::from_value(v.clone()).map_err(|e| format!("not a NetworkPolicy: {e}"))?;
        let namespace = np
            .metadata
            .namespace
            .clone()
            .ok_or("NetworkPolicy without metadata.namespace")?;
        let name = np
            .metadata
            .name
            .clone()
            .ok_or("NetworkPolicy without metadata.name")?;
        let spec = np.spec.unwrap_or_default();
        let pod_selector = Selector::from_k8s(&spec.pod_selector.unwrap_or_default())
            .map_err(|e| format!("spec.podSelector: {e}"))?;
        let types: Vec<String> = match spec.policy_types.as_deref() {
            Some(t) if !t.is_empty() => t.to_vec(),
            _ => {
                let mut t = vec!["Ingress".to_owned()];
                if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
                    t.push("Egress".to_owned());
                }
                t
            }
        };
        let mut warnings = Vec::new();
        // One direction's rules, `None` when `policyTypes` leaves it out.
        type Parts<'a> = (
            Option<&'a [netv1::NetworkPolicyPeer]>,
            Option<&'a [netv1::NetworkPolicyPort]>,
        );
        let mut direction = |ty: &str, field: &str, rules: Vec<Parts<'_>>| -> Result<_, String> {
            if !types.iter().any(|t| t == ty) {
                return Ok(None);
            }
            rules
                .into_iter()
                .enumerate()
                .map(|(i, (peers, ports))| {
                    parse_rule(&format!("spec.{field}[{i}]"), peers, ports, &mut warnings)
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
        };
        let (ingress_rules, egress_rules) = (
            spec.ingress.unwrap_or_default(),
            spec.egress.unwrap_or_default(),
        );
        let ingress = direction(
            "Ingress",
            "ingress",
            ingress_rules
                .iter()
                .map(|r| (r.from.as_deref(), r.ports.as_deref()))
                .collect(),
        )?;
        let egress = direction(
            "Egress",
            "egress",
            egress_rules
                .iter()
                .map(|r| (r.to.as_deref(), r.ports.as_deref()))
                .collect(),
        )?;
        Ok(Policy {
            namespace,
            name,
            pod_selector,
            ingress,
            egress,
            warnings,
        })
    }
}

/// One rule's peers and ports; `field` names it in warnings and errors.
fn parse_rule(
    field: &str,
    peers: Option<&[netv1::NetworkPolicyPeer]>,
    ports: Option<&[netv1::NetworkPolicyPort]>,
    warnings: &mut Vec<String>,
) -> Result<Rule, String> {
    let peers = match peers {
        None | Some([]) => None,
        Some(list) => {
            let mut out = Vec::new();
            for (i, p) in list.iter().enumerate() {
                let at = format!("{field}.peers[{i}]");
                match (&p.ip_block, &p.pod_selector, &p.namespace_selector) {
                    (Some(b), None, None) => {
                        let Some(cidr) = Cidr::parse(&b.cidr).map_err(|e| format!("{at}: {e}"))?
                        else {
                            warnings.push(format!(
                                "{at}: IPv6 ipBlock {} never matches the IPv4 pod network",
                                b.cidr
                            ));
                            continue;
                        };
                        let mut except = Vec::new();
                        for e in b.except.iter().flatten() {
                            match Cidr::parse(e).map_err(|err| format!("{at}: {err}"))? {
                                Some(c) => except.push(c),
                                None => warnings.push(format!(
                                    "{at}: IPv6 except {e} ignored in an IPv4 block"
                                )),
                            }
                        }
                        except.sort();
                        except.dedup();
                        out.push(Peer::Block { cidr, except });
                    }
                    (None, pods, namespaces) if pods.is_some() || namespaces.is_some() => {
                        let sel = |s: &Option<K8sSelector>| {
                            s.as_ref()
                                .map(Selector::from_k8s)
                                .transpose()
                                .map_err(|e| format!("{at}: {e}"))
                        };
                        out.push(Peer::Pods {
                            pods: sel(pods)?,
                            namespaces: sel(namespaces)?,
                        });
                    }
                    _ => warnings.push(format!(
                        "{at}: a peer needs exactly ipBlock, or podSelector and/or \
                         namespaceSelector; skipped"
                    )),
                }
            }
            if out.is_empty() {
                // Every listed peer was skipped: the rule admits nobody (never "any").
                return Ok(Rule {
                    peers: Some(Vec::new()),
                    ports: Ports::All,
                });
            }
            Some(out)
        }
    };
    let ports = match ports {
        None | Some([]) => Ports::All,
        Some(list) => {
            let mut set = BTreeSet::new();
            for (i, p) in list.iter().enumerate() {
                let at = format!("{field}.ports[{i}]");
                let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
                    "TCP" => Protocol::Tcp,
                    "UDP" => Protocol::Udp,
                    "SCTP" => Protocol::Sctp,
                    other => {
                        warnings.push(format!("{at}: unknown protocol {other:?}; skipped"));
                        continue;
                    }
                };
                let ports = match &p.port {
                    None => None,
                    Some(IntOrString::Int(n)) => {
                        let Ok(a) = u16::try_from(*n) else {
                            warnings.push(format!("{at}: port {n} out of range; skipped"));
                            continue;
                        };
                        let b = match p.end_port {
                            None => a,
                            Some(e) => match u16::try_from(e) {
                                Ok(b) if b >= a => b,
                                _ => {
                                    warnings.push(format!(
                                        "{at}: endPort {e} below port {a} or out of range; skipped"
                                    ));
                                    continue;
                                }
                            },
                        };
                        Some((a, b))
                    }
                    Some(IntOrString::String(name)) => {
                        warnings.push(format!(
                            "{at}: named port {name:?} is not resolved by the testbed's \
                             agent; this entry admits nothing"
                        ));
                        continue;
                    }
                };
                set.insert(PortRange { protocol, ports });
            }
            Ports::Only(set)
        }
    };
    Ok(Rule { peers, ports })
}

/// A pod as the agent knows it from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// `status.podIP` (IPv4; `None` before it has one).
    pub ip: Option<Ipv4Addr>,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// Phase `Succeeded` or `Failed`: its sandbox is gone or going.
    pub terminal: bool,
}

impl PodInfo {
    /// From a Pod's JSON wire shape. `None` without namespace, name or uid.
    pub fn from_value(v: &Value) -> Option<PodInfo> {
        let m = &v["metadata"];
        let labels = m["labels"]
            .as_object()
            .map(|l| {
                l.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let phase = v["status"]["phase"].as_str().unwrap_or("");
        Some(PodInfo {
            namespace: m["namespace"].as_str()?.to_owned(),
            name: m["name"].as_str()?.to_owned(),
            uid: m["uid"].as_str()?.to_owned(),
            labels,
            node: v["spec"]["nodeName"].as_str().map(str::to_owned),
            ip: v["status"]["podIP"].as_str().and_then(|s| s.parse().ok()),
            host_network: v["spec"]["hostNetwork"].as_bool().unwrap_or(false),
            terminal: matches!(phase, "Succeeded" | "Failed"),
        })
    }
}

/// The name and labels of a Namespace's JSON wire shape; `None` without a name.
pub fn namespace_from_value(v: &Value) -> Option<(String, BTreeMap<String, String>)> {
    let name = v["metadata"]["name"].as_str()?.to_owned();
    let labels = v["metadata"]["labels"]
        .as_object()
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    Some((name, labels))
}

/// The cluster as one agent knows it: policies, pods, namespaces.
#[derive(Debug, Clone, Default)]
pub struct Index {
    /// By `(namespace, name)`, so a namespace's policies come in name order.
    policies: BTreeMap<(String, String), Policy>,
    /// By uid.
    pods: HashMap<String, PodInfo>,
    /// Namespace labels by name.
    namespaces: HashMap<String, BTreeMap<String, String>>,
}

impl Index {
    /// Adds or replaces a policy.
    pub fn put_policy(&mut self, p: Policy) {
        self.policies
            .insert((p.namespace.clone(), p.name.clone()), p);
    }

    /// Removes a policy (no-op when unknown).
    pub fn remove_policy(&mut self, namespace: &str, name: &str) {
        self.policies
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Replaces every policy (a watch's re-list).
    pub fn replace_policies(&mut self, ps: Vec<Policy>) {
        self.policies = ps
            .into_iter()
            .map(|p| ((p.namespace.clone(), p.name.clone()), p))
            .collect();
    }

    /// Adds or replaces a pod.
    pub fn put_pod(&mut self, p: PodInfo) {
        self.pods.insert(p.uid.clone(), p);
    }

    /// Removes a pod by uid.
    pub fn remove_pod(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    /// Replaces every pod.
    pub fn replace_pods(&mut self, ps: Vec<PodInfo>) {
        self.pods = ps.into_iter().map(|p| (p.uid.clone(), p)).collect();
    }

    /// Adds or replaces a namespace's labels.
    pub fn put_namespace(&mut self, name: String, labels: BTreeMap<String, String>) {
        self.namespaces.insert(name, labels);
    }

    /// Removes a namespace.
    pub fn remove_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// Replaces every namespace.
    pub fn replace_namespaces(&mut self, ns: Vec<(String, BTreeMap<String, String>)>) {
        self.namespaces = ns.into_iter().collect();
    }

    /// A pod by uid.
    pub fn pod(&self, uid: &str) -> Option<&PodInfo> {
        self.pods.get(uid)
    }

    /// How many policies it holds.
    pub fn policy_count(&self) -> usize {
        self.policies.len()
    }

    /// A namespace's labels, with `kubernetes.io/metadata.name` always set.
    fn namespace_labels(&self, ns: &str) -> BTreeMap<String, String> {
        let mut l = self.namespaces.get(ns).cloned().unwrap_or_default();
        l.insert(NAMESPACE_NAME_LABEL.to_owned(), ns.to_owned());
        l
    }

    /// What `pod` (with `ip` its address) needs in both directions (module docs).
    /// `ip` overrides `pod.ip` for the pod itself (its node knows it before the API
    /// does); `local_ips` likewise for other pods of the node, by uid.
    pub fn evaluate(&self, pod: &PodInfo, local_ips: &HashMap<String, Ipv4Addr>) -> PodPolicy {
        let mut out = PodPolicy::default();
        let selecting: Vec<&Policy> = self
            .policies
            .range((pod.namespace.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == pod.namespace)
            .map(|(_, p)| p)
            .filter(|p| p.pod_selector.matches(&pod.labels))
            .collect();
        if selecting.is_empty() {
            return out;
        }
        // Peers: pods with an address, local ones at the node's address.
        let peers: Vec<(&PodInfo, Ipv4Addr)> = self
            .pods
            .values()
            .filter(|p| p.uid != pod.uid && !p.host_network && !p.terminal)
            .filter_map(|p| Some((p, local_ips.get(&p.uid).copied().or(p.ip)?)))
            .collect();
        let mut by_ip: HashMap<Ipv4Addr, Vec<&PodInfo>> = HashMap::new();
        for (p, ip) in &peers {
            by_ip.entry(*ip).or_default().push(p);
        }
        let ns_labels: HashMap<&str, BTreeMap<String, String>> = peers
            .iter()
            .map(|(p, _)| (p.namespace.as_str(), self.namespace_labels(&p.namespace)))
            .collect();
        for d in Direction::BOTH {
            let dir = out.dir_mut(d);
            for policy in &selecting {
                let Some(rules) = policy.rules(d) else {
                    continue;
                };
                dir.isolated_by.get_or_insert_with(|| policy.key());
                for rule in rules {
                    if rule.ports == Ports::Only(BTreeSet::new()) {
                        continue; // every port entry skipped: admits nothing
                    }
                    let mut admit = |key: PeerKey, peer: PeerMatch, pod: Option<PeerPod>| match dir
                        .admits
                        .get_mut(&key)
                    {
                        Some(a) => a.ports.union(&rule.ports),
                        None => {
                            dir.admits.insert(
                                key,
                                Admission {
                                    policy: policy.key(),
                                    peer,
                                    pod,
                                    ports: rule.ports.clone(),
                                },
                            );
                        }
                    };
                    let Some(list) = &rule.peers else {
                        admit(PeerKey::Any, PeerMatch::Any, None);
                        continue;
                    };
                    for peer in list {
                        match peer {
                            Peer::Pods { pods, namespaces } => {
                                for &(p, ip) in &peers {
                                    let ns_ok = match namespaces {
                                        None => p.namespace == policy.namespace,
                                        Some(sel) => ns_labels
                                            .get(p.namespace.as_str())
                                            .is_some_and(|l| sel.matches(l)),
                                    };
                                    if !ns_ok
                                        || pods.as_ref().is_some_and(|s| !s.matches(&p.labels))
                                    {
                                        continue;
                                    }
                                    admit(
                                        PeerKey::Pod(p.uid.clone()),
                                        PeerMatch::Net {
                                            cidr: Cidr::host(ip),
                                            except: Vec::new(),
                                        },
                                        Some(peer_pod(p, ip)),
                                    );
                                }
                            }
                            Peer::Block { cidr, except } => {
                                let m = PeerMatch::Net {
                                    cidr: *cidr,
                                    except: except.clone(),
                                };
                                if except.iter().any(|e| e.covers(cidr)) {
                                    continue; // excepts cover the whole block
                                }
                                if pod.ip.is_some_and(|own| cidr.len == 32 && cidr.addr == own) {
                                    continue; // the pod itself
                                }
                                // A /32 that is exactly one pod's address names that pod.
                                let one = (cidr.len == 32)
                                    .then(|| by_ip.get(&cidr.addr))
                                    .flatten()
                                    .filter(|v| v.len() == 1)
                                    .map(|v| v[0]);
                                match one {
                                    Some(p) => admit(
                                        PeerKey::Pod(p.uid.clone()),
                                        m,
                                        Some(peer_pod(p, cidr.addr)),
                                    ),
                                    None => admit(
                                        PeerKey::Block {
                                            cidr: *cidr,
                                            except: except.clone(),
                                        },
                                        m,
                                        None,
                                    ),
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

fn peer_pod(p: &PodInfo, ip: Ipv4Addr) -> PeerPod {
    PeerPod {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        ip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            node: Some("node-1".into()),
            ip: Some(ip.parse().unwrap()),
            host_network: false,
            terminal: false,
        }
    }

    fn policy(ns: &str, name: &str, spec: Value) -> Policy {
        Policy::from_value(&json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": ns, "name": name}, "spec": spec,
        }))
        .unwrap()
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    /// An index with pods `target` (10.0.1.2, app=t), `source` (10.0.2.2, app=s),
    /// `other` (10.0.2.3, app=o) in `ns`, `far` (10.0.2.4, app=s) in `ns2` (labelled
    /// team=b), and `policies`.
    fn cluster(policies: Vec<Policy>) -> Index {
        let mut ix = Index::default();
        for p in [
            pod("ns", "target", "10.0.1.2", &[("app", "t")]),
            pod("ns", "source", "10.0.2.2", &[("app", "s")]),
            pod("ns", "other", "10.0.2.3", &[("app", "o")]),
            pod("ns2", "far", "10.0.2.4", &[("app", "s")]),
        ] {
            ix.put_pod(p);
        }
        ix.put_namespace("ns2".into(), [("team".into(), "b".into())].into());
        for p in policies {
            ix.put_policy(p);
        }
        ix
    }

    fn eval(ix: &Index, name: &str) -> PodPolicy {
        let p = ix.pod(&format!("uid-{name}")).unwrap().clone();
        ix.evaluate(&p, &HashMap::new())
    }

    fn admitted(d: &DirPolicy) -> Vec<String> {
        d.admits
            .keys()
            .map(|k| match k {
                PeerKey::Pod(u) => u.clone(),
                PeerKey::Block { cidr, except } => format!("{cidr} except {except:?}"),
                PeerKey::Any => "any".into(),
            })
            .collect()
    }

    #[test]
    fn selectors_match_labels_and_every_expression_operator() {
        let sel = |v: Value| Selector::from_k8s(&serde_json::from_value(v).unwrap()).unwrap();
        let l = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        let s = sel(json!({"matchLabels": {"a": "1"}, "matchExpressions": [
            {"key": "b", "operator": "In", "values": ["x", "y"]},
            {"key": "c", "operator": "NotIn", "values": ["z"]},
            {"key": "d", "operator": "Exists"},
            {"key": "e", "operator": "DoesNotExist"},
        ]}));
        assert!(s.matches(&l(&[("a", "1"), ("b", "x"), ("d", "")])));
        assert!(s.matches(&l(&[("a", "1"), ("b", "y"), ("c", "w"), ("d", "q")])));
        assert!(
            !s.matches(&l(&[("a", "2"), ("b", "x"), ("d", "")])),
            "matchLabels"
        );
        assert!(!s.matches(&l(&[("a", "1"), ("b", "q"), ("d", "")])), "In");
        assert!(!s.matches(&l(&[("a", "1"), ("d", "")])), "In needs the key");
        assert!(
            !s.matches(&l(&[("a", "1"), ("b", "x"), ("c", "z"), ("d", "")])),
            "NotIn"
        );
        assert!(!s.matches(&l(&[("a", "1"), ("b", "x")])), "Exists");
        assert!(
            !s.matches(&l(&[("a", "1"), ("b", "x"), ("d", ""), ("e", "")])),
            "DoesNotExist"
        );
        assert!(sel(json!({})).matches(&l(&[])), "{{}} matches everything");
        let bad: K8sSelector = serde_json::from_value(
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        )
        .unwrap();
        assert!(Selector::from_k8s(&bad).unwrap_err().contains("Gt"));
    }

    #[test]
    fn policy_types_default_to_ingress_plus_egress_only_with_egress_rules() {
        let ix = cluster(vec![policy("ns", "a", json!({"podSelector": {}}))]);
        let t = eval(&ix, "target");
        assert_eq!(t.ingress.isolated_by.as_deref(), Some("ns/a"));
        assert!(t.ingress.admits.is_empty(), "no rules: deny all");
        assert_eq!(t.egress.isolated_by, None);
        // `egress: []` is no egress rule: still Ingress only (defaults.go).
        let ix = cluster(vec![policy("ns", "a", json!({"egress": []}))]);
        assert_eq!(eval(&ix, "target").egress.isolated_by, None);
        let ix = cluster(vec![policy("ns", "a", json!({"egress": [{}]}))]);
        let t = eval(&ix, "target");
        assert_eq!(t.egress.isolated_by.as_deref(), Some("ns/a"));
        assert_eq!(admitted(&t.egress), ["any"]);
        assert!(t.ingress.isolated_by.is_some());
        // Explicit types win: Egress only, no rules = deny all egress, ingress open.
        let ix = cluster(vec![policy("ns", "a", json!({"policyTypes": ["Egress"]}))]);
        let t = eval(&ix, "target");
        assert_eq!(t.ingress.isolated_by, None);
        assert_eq!(t.egress.isolated_by.as_deref(), Some("ns/a"));
        assert!(!t.egress.admits(ip("10.0.2.2"), Protocol::Tcp, 80));
        assert!(t.ingress.admits(ip("10.0.2.2"), Protocol::Tcp, 80));
    }

    #[test]
    fn only_policies_of_the_pods_namespace_selecting_it_isolate_it() {
        let ix = cluster(vec![
            policy(
                "ns",
                "for-s",
                json!({"podSelector": {"matchLabels": {"app": "s"}}}),
            ),
            policy("ns2", "all", json!({"podSelector": {}})),
        ]);
        assert_eq!(eval(&ix, "target"), PodPolicy::default());
        assert_eq!(
            eval(&ix, "source").ingress.isolated_by.as_deref(),
            Some("ns/for-s")
        );
        assert_eq!(
            eval(&ix, "far").ingress.isolated_by.as_deref(),
            Some("ns2/all")
        );
    }

    #[test]
    fn peers_by_pod_namespace_and_both_selectors() {
        let sel = |from: Value| {
            let ix = cluster(vec![policy(
                "ns",
                "p",
                json!({"podSelector": {"matchLabels": {"app": "t"}}, "ingress": [{"from": from}]}),
            )]);
            admitted(&eval(&ix, "target").ingress)
        };
        // podSelector alone: the policy's namespace only.
        assert_eq!(
            sel(json!([{"podSelector": {"matchLabels": {"app": "s"}}}])),
            ["uid-source"]
        );
        assert_eq!(
            sel(json!([{"podSelector": {}}])),
            ["uid-other", "uid-source"]
        );
        // namespaceSelector alone: every pod of the selected namespaces.
        assert_eq!(
            sel(json!([{"namespaceSelector": {"matchLabels": {"team": "b"}}}])),
            ["uid-far"]
        );
        assert_eq!(
            sel(json!([{"namespaceSelector": {}}])),
            ["uid-far", "uid-other", "uid-source"]
        );
        // The name label every namespace has, even unseen ones (ns has no object here).
        assert_eq!(
            sel(
                json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}}])
            ),
            ["uid-other", "uid-source"]
        );
        // Both in one peer: AND (app=s in namespace ns, not far in ns2).
        assert_eq!(
            sel(json!([{"podSelector": {"matchLabels": {"app": "s"}},
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}}])),
            ["uid-source"]
        );
        // Two peers: OR.
        assert_eq!(
            sel(json!([{"podSelector": {"matchLabels": {"app": "s"}}},
                       {"namespaceSelector": {"matchLabels": {"team": "b"}}}])),
            ["uid-far", "uid-source"]
        );
        // Empty `from`: any peer.
        assert_eq!(sel(json!([])), ["any"]);
    }

    #[test]
    fn ip_blocks_match_addresses_with_excepts_and_name_a_pod_only_as_its_slash_32() {
        let ix = cluster(vec![policy(
            "ns",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "t"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [
                {"ipBlock": {"cidr": "10.0.2.2/32"}},
                {"ipBlock": {"cidr": "10.9.1.7/16", "except": ["10.9.3.0/24"]}},
                {"ipBlock": {"cidr": "fd00::/64"}},
            ]}]}),
        )]);
        let e = eval(&ix, "target").egress;
        assert_eq!(
            admitted(&e),
            [
                "uid-source",
                "10.9.0.0/16 except [Cidr { addr: 10.9.3.0, len: 24 }]"
            ]
        );
        let src = &e.admits[&PeerKey::Pod("uid-source".into())];
        assert_eq!(src.peer_ip(), "10.0.2.2");
        assert_eq!(src.pod.as_ref().unwrap().name, "source");
        assert!(e.admits(ip("10.0.2.2"), Protocol::Tcp, 1));
        assert!(!e.admits(ip("10.0.2.3"), Protocol::Tcp, 1), "another pod");
        assert!(
            e.admits(ip("10.9.200.1"), Protocol::Udp, 53),
            "inside the block"
        );
        assert!(
            !e.admits(ip("10.9.3.9"), Protocol::Tcp, 1),
            "inside the except"
        );
        assert!(!e.admits(ip("10.8.0.1"), Protocol::Tcp, 1), "outside");
        let block = e.admits.values().find(|a| a.pod.is_none()).unwrap();
        assert_eq!(block.peer_ip(), "10.9.0.0/16");
        let p = ix.policies.values().next().unwrap();
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(p.warnings[0].contains("IPv6"));
    }

    #[test]
    fn ports_protocols_and_ranges_are_admitted_and_named_ports_admit_nothing() {
        let ix = cluster(vec![policy(
            "ns",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "t"}}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "s"}}}],
                 "ports": [{"port": 8080}, {"protocol": "UDP", "port": 5000, "endPort": 5010},
                           {"protocol": "SCTP"}]},
                {"from": [{"podSelector": {"matchLabels": {"app": "o"}}}],
                 "ports": [{"port": "http"}]},
            ]}),
        )]);
        let i = eval(&ix, "target").ingress;
        let s = ip("10.0.2.2");
        assert!(i.admits(s, Protocol::Tcp, 8080));
        assert!(!i.admits(s, Protocol::Tcp, 8081));
        assert!(
            !i.admits(s, Protocol::Udp, 8080),
            "protocol defaults to TCP"
        );
        assert!(i.admits(s, Protocol::Udp, 5010) && !i.admits(s, Protocol::Udp, 5011));
        assert!(
            i.admits(s, Protocol::Sctp, 9),
            "no port: every port of the protocol"
        );
        assert_eq!(
            i.admits[&PeerKey::Pod("uid-source".into())].ports.labels(),
            ["8080/tcp", "5000-5010/udp", "sctp"]
        );
        assert!(
            !i.admits(ip("10.0.2.3"), Protocol::Tcp, 80),
            "named port: nothing"
        );
        assert!(!i.admits.contains_key(&PeerKey::Pod("uid-other".into())));
        let p = ix.policies.values().next().unwrap();
        assert!(
            p.warnings.iter().any(|w| w.contains("named port \"http\"")),
            "{:?}",
            p.warnings
        );
    }

    #[test]
    fn policies_are_additive_and_an_admission_names_the_first_policy() {
        let ix = cluster(vec![
            policy(
                "ns",
                "b-web",
                json!({"podSelector": {"matchLabels": {"app": "t"}}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "s"}}}], "ports": [{"port": 80}]}]}),
            ),
            policy("ns", "a-deny", json!({"podSelector": {}, "ingress": []})),
            policy(
                "ns",
                "c-admin",
                json!({"podSelector": {"matchLabels": {"app": "t"}}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "s"}}}], "ports": [{"port": 22}]},
                {"from": [{"podSelector": {"matchLabels": {"app": "o"}}}]}]}),
            ),
        ]);
        let i = eval(&ix, "target").ingress;
        assert_eq!(
            i.isolated_by.as_deref(),
            Some("ns/a-deny"),
            "deny-all isolates"
        );
        let s = &i.admits[&PeerKey::Pod("uid-source".into())];
        assert_eq!(s.policy, "ns/b-web");
        assert_eq!(s.ports.labels(), ["22/tcp", "80/tcp"], "rules add up");
        assert!(
            i.admits(ip("10.0.2.3"), Protocol::Udp, 1),
            "other: every port"
        );
        assert!(
            !i.admits(ip("10.0.2.4"), Protocol::Tcp, 80),
            "far: other namespace"
        );
    }

    #[test]
    fn the_own_node_is_always_allowed_even_under_deny_all() {
        let ix = cluster(vec![policy(
            "ns",
            "deny",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )]);
        let t = eval(&ix, "target");
        let node = ip("10.9.0.11");
        for d in Direction::BOTH {
            assert!(allows(&t, d, node, node, Protocol::Tcp, 10250), "{d:?}");
            assert!(
                !allows(&t, d, ip("10.9.0.12"), node, Protocol::Tcp, 10250),
                "{d:?} other node"
            );
            assert!(
                !allows(&t, d, ip("10.0.2.2"), node, Protocol::Tcp, 8080),
                "{d:?} pod"
            );
        }
    }

    #[test]
    fn peers_without_address_on_host_network_finished_or_the_pod_itself_are_not_admitted() {
        let mut ix = cluster(vec![policy(
            "ns",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "t"}}, "ingress": [
                {"from": [{"podSelector": {}}]}, {"from": [{"ipBlock": {"cidr": "10.0.1.2/32"}}]}]}),
        )]);
        let mut host = pod("ns", "host", "10.9.0.11", &[]);
        host.host_network = true;
        let mut done = pod("ns", "done", "10.0.2.9", &[]);
        done.terminal = true;
        let mut fresh = pod("ns", "fresh", "10.0.2.10", &[]);
        fresh.ip = None;
        for p in [host, done, fresh.clone()] {
            ix.put_pod(p);
        }
        assert_eq!(
            admitted(&eval(&ix, "target").ingress),
            ["uid-other", "uid-source"]
        );
        // The node learned `fresh`'s address before the API had it.
        let t = ix.pod("uid-target").unwrap().clone();
        let local = HashMap::from([("uid-fresh".to_owned(), ip("10.0.2.10"))]);
        assert_eq!(
            admitted(&ix.evaluate(&t, &local).ingress),
            ["uid-fresh", "uid-other", "uid-source"]
        );
    }

    #[test]
    fn malformed_policies_are_errors_and_odd_peers_warnings() {
        let err = Policy::from_value(&json!({"metadata": {"name": "x"}, "spec": {}})).unwrap_err();
        assert!(err.contains("namespace"), "{err}");
        let err = Policy::from_value(&json!({"metadata": {"name": "x", "namespace": "n"},
            "spec": {"ingress": [{"from": [{"ipBlock": {"cidr": "banana"}}]}]}}))
        .unwrap_err();
        assert!(err.contains("banana"), "{err}");
        // A peer with nothing (or ipBlock plus a selector) is skipped; a rule left without
        // peers admits nobody, not everybody.
        let ix = cluster(vec![policy(
            "ns",
            "p",
            json!({"podSelector": {}, "ingress": [
            {"from": [{}, {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
        )]);
        let t = eval(&ix, "target").ingress;
        assert!(t.isolated_by.is_some() && t.admits.is_empty(), "{t:?}");
        assert_eq!(ix.policies.values().next().unwrap().warnings.len(), 2);
    }
}
