//! firstpacket's report types: the source report `target-server probe` (the source pod)
//! writes as its termination message, and the records, summary and gate report the prober
//! builds from it. A crate of its own so that the probe pod's binary carries no kube
//! dependency and the prober no HTTP server code, while both read and write one schema.
//!
//! Contract: docs/design.md §2 (measurement) and §4 (outputs). Every document carries
//! `"schema": 1`; fields may be added, never renamed. The JSON Schemas, written by hand
//! from these types, are [`GATE_REPORT_SCHEMA`] (`report/schema/report.schema.json`) and
//! [`SOURCE_REPORT_SCHEMA`] (`report/schema/source-report.schema.json`); this crate's
//! tests, the prober's and the testbed's validate real documents against them.
//!
//! Units: every `*_seconds` field and every time in a [`SourceReport`] is in seconds
//! (f64). Source times are on the source pod's monotonic clock, relative to its own
//! process start (so `process_start` is always 0). Prober timelines are on the prober's
//! monotonic clock, relative to the probe's start. Wall-clock fields (`*_unix`,
//! `started_at`, …) are for display only and are never subtracted across machines.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// JSON Schema (draft 2020-12) of the gate report ([`GateReport`], `prober gate --report
/// FILE`).
pub const GATE_REPORT_SCHEMA: &str = include_str!("../schema/report.schema.json");

/// JSON Schema (draft 2020-12) of the source report ([`SourceReport`], the termination
/// message of a `target-server probe` pod).
pub const SOURCE_REPORT_SCHEMA: &str = include_str!("../schema/source-report.schema.json");

/// Version of every JSON document defined here.
pub const SCHEMA_VERSION: u32 = 1;

/// The kubelet keeps only the last 4096 bytes of a termination message
/// (k8s.io/kubernetes pkg/kubelet/kuberuntime: `maxTerminationMessageLogLength`); the
/// source report stays below this bound with room to spare (512 bytes; 3 KiB until a
/// `policy_change` source's `policy` object was added, issue 32).
pub const MAX_SOURCE_REPORT_BYTES: usize = 3584;

/// Longest per-second hold series kept in a source report (bounded so the report stays
/// ≤ [`MAX_SOURCE_REPORT_BYTES`]).
pub const MAX_HOLD_SERIES: usize = 120;

/// Outcome class of one probe (docs/design.md §2 "Results"). Serialised as the exact strings
/// `success`, `slow`, `failed`, `inconclusive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeResult {
    Success,
    Slow,
    Failed,
    Inconclusive,
}

impl ProbeResult {
    /// All values, in report order.
    pub const ALL: [ProbeResult; 4] = [
        ProbeResult::Success,
        ProbeResult::Slow,
        ProbeResult::Failed,
        ProbeResult::Inconclusive,
    ];

    /// The JSON / metric-label string.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Success => "success",
            ProbeResult::Slow => "slow",
            ProbeResult::Failed => "failed",
            ProbeResult::Inconclusive => "inconclusive",
        }
    }

    /// Conclusive results count toward thresholds; `inconclusive` ones (not the
    /// network's fault) do not.
    pub fn is_conclusive(self) -> bool {
        self != ProbeResult::Inconclusive
    }
}

/// Why a probe was not a plain success (docs/design.md §2 table). Closed set; the JSON uses
/// these exact strings. `success` has no reason (`null`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// `slow`: TTFP > `--slow-threshold`.
    TtfpOverThreshold,
    /// `failed`: no successful attempt before `--give-up`.
    NoSuccessBeforeGiveUp,
    /// `failed`: failures during the hold after the first success.
    LostAfterSuccess,
    /// `failed`: target container running, readiness never passed.
    TargetNeverReady,
    /// `failed`: source container running, readiness never passed.
    SourceNeverReady,
    /// `failed`: only a pod other than the expected target answered.
    WrongPeer,
    /// `inconclusive`: a pod could not be scheduled.
    Unschedulable,
    /// `inconclusive`: the image could not be pulled.
    ImagePull,
    /// `inconclusive`: a container exited abnormally / could not start.
    ContainerFailed,
    /// `inconclusive`: a node of the probe is NotReady at its end, and the probe would
    /// otherwise have `failed` or ended `unschedulable` / `container_failed` there.
    NodeNotReady,
    /// `inconclusive`: the Kubernetes API failed us.
    ApiError,
    /// `inconclusive`: an admission plugin or webhook (Pod Security, ResourceQuota, a
    /// missing PriorityClass, …) rejected a probe object; not RBAC, not the network.
    AdmissionRejected,
    /// `inconclusive`: the prober was interrupted (signal, `--timeout`).
    Interrupted,
    /// `slow`: TTFP was within `--slow-threshold`, but a pod's own programming wait
    /// ([`PodProgramming`]) was over it: the CNI held the new pod's traffic (and so its
    /// readiness) that long before the first packet could even be tried. Added reason
    /// (issue 29).
    EndpointProgrammingSlow,
    /// `failed`: a probe pod's own path to its node never worked before `--give-up`:
    /// every dial of its node went unanswered and no kubelet request reached it, so its
    /// CNI never programmed its endpoint (on a CNI that gates readiness, such as Calico,
    /// it then never turns Ready). Added reason (issue 29).
    EndpointNeverProgrammed,
    /// `failed`, a security finding: a NetworkPolicy isolation let a packet through.
    /// A fresh pod that no rule admits (the `policy` probe's intruder) got an answer
    /// from the isolated target, or a `policy_change` source got one before any policy
    /// admitted it (Kubernetes NetworkPolicy: an isolated pod accepts only what some
    /// policy allows). The gate fails on it by default. Added reason (issue 32).
    IsolationBreach,
    /// `failed`: after the allow policy was deleted, the source's connections kept
    /// working until `--give-up` (a `policy_change` probe's revocation never took
    /// effect). Added reason (issue 32).
    RevocationNotEnforced,
    /// `failed`: a `payload: mtu` path (full-size packets, DF set) never got an answer
    /// before `--give-up` while the same protocol and family with small packets did:
    /// full-size packets are dropped somewhere on the path without the ICMP
    /// "fragmentation needed" that would let the sender adapt (an encapsulation change
    /// that shifted the pod MTU, an underlay with a lower MTU). Added reason (issue 33).
    MtuBlackHole,
    /// `inconclusive`: a requested IP family (`--ip-families`) is one the pod does not
    /// have (`status.podIPs` has no address of it): nothing was measured on it, nothing
    /// guessed. Added reason (issue 33).
    FamilyMissing,
}

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 19] = [
        Reason::TtfpOverThreshold,
        Reason::NoSuccessBeforeGiveUp,
        Reason::LostAfterSuccess,
        Reason::TargetNeverReady,
        Reason::SourceNeverReady,
        Reason::WrongPeer,
        Reason::Unschedulable,
        Reason::ImagePull,
        Reason::ContainerFailed,
        Reason::NodeNotReady,
        Reason::ApiError,
        Reason::AdmissionRejected,
        Reason::Interrupted,
        Reason::EndpointProgrammingSlow,
        Reason::EndpointNeverProgrammed,
        Reason::IsolationBreach,
        Reason::RevocationNotEnforced,
        Reason::MtuBlackHole,
        Reason::FamilyMissing,
    ];

    /// The JSON / metric-label string.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TtfpOverThreshold => "ttfp_over_threshold",
            Reason::NoSuccessBeforeGiveUp => "no_success_before_give_up",
            Reason::LostAfterSuccess => "lost_after_success",
            Reason::TargetNeverReady => "target_never_ready",
            Reason::SourceNeverReady => "source_never_ready",
            Reason::WrongPeer => "wrong_peer",
            Reason::Unschedulable => "unschedulable",
            Reason::ImagePull => "image_pull",
            Reason::ContainerFailed => "container_failed",
            Reason::NodeNotReady => "node_not_ready",
            Reason::ApiError => "api_error",
            Reason::AdmissionRejected => "admission_rejected",
            Reason::Interrupted => "interrupted",
            Reason::EndpointProgrammingSlow => "endpoint_programming_slow",
            Reason::EndpointNeverProgrammed => "endpoint_never_programmed",
            Reason::IsolationBreach => "isolation_breach",
            Reason::RevocationNotEnforced => "revocation_not_enforced",
            Reason::MtuBlackHole => "mtu_black_hole",
            Reason::FamilyMissing => "family_missing",
        }
    }

    /// The result class this reason belongs to (docs/design.md §2 table).
    pub fn result(self) -> ProbeResult {
        match self {
            Reason::TtfpOverThreshold | Reason::EndpointProgrammingSlow => ProbeResult::Slow,
            Reason::NoSuccessBeforeGiveUp
            | Reason::LostAfterSuccess
            | Reason::TargetNeverReady
            | Reason::SourceNeverReady
            | Reason::WrongPeer
            | Reason::EndpointNeverProgrammed
            | Reason::IsolationBreach
            | Reason::RevocationNotEnforced
            | Reason::MtuBlackHole => ProbeResult::Failed,
            Reason::Unschedulable
            | Reason::ImagePull
            | Reason::ContainerFailed
            | Reason::NodeNotReady
            | Reason::ApiError
            | Reason::AdmissionRejected
            | Reason::Interrupted
            | Reason::FamilyMissing => ProbeResult::Inconclusive,
        }
    }
}

/// Kind of one failed dial attempt (docs/design.md §2 step 5). Closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No answer within `--attempt-timeout` (SYN or response lost).
    Timeout,
    /// TCP RST to the SYN (`ECONNREFUSED`).
    Refused,
    /// ICMP unreachable / no route (`EHOSTUNREACH`, `ENETUNREACH`).
    Unreachable,
    /// Connection reset or closed mid-exchange.
    Reset,
    /// An HTTP answer other than 200.
    HttpStatus,
    /// HTTP 200 from a pod other than `--expect-pod`.
    WrongPeer,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::Timeout,
        ErrorKind::Refused,
        ErrorKind::Unreachable,
        ErrorKind::Reset,
        ErrorKind::HttpStatus,
        ErrorKind::WrongPeer,
    ];

    /// The JSON string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Refused => "refused",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Reset => "reset",
            ErrorKind::HttpStatus => "http_status",
            ErrorKind::WrongPeer => "wrong_peer",
        }
    }
}

/// How the source's dialing ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceOutcome {
    /// A success, and the hold had no failure.
    Success,
    /// A success, then failures during the hold (works-then-breaks).
    LostAfterSuccess,
    /// No success before `--give-up`.
    NoSuccess,
    /// No success, and at least one attempt reached a pod other than the expected one.
    WrongPeer,
    /// Stopped by SIGTERM before the measurement finished.
    Terminated,
}

/// How a pod's programming wait was measured (issue 29: "the endpoint's own programming
/// wait, measured on the pod's clock"). Closed set; the JSON uses these exact strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgrammingMethod {
    /// The pod dialed its own node (`status.hostIP`, a TCP connect every dial interval
    /// from its first instant); the wait ends at the send time of the earliest connect
    /// the node answered (SYN-ACK or RST: either proves both directions work).
    /// Resolution: the dial interval.
    NodeDial,
    /// Fallback where pod-initiated traffic to the node is dropped by policy (Calico's
    /// built-in `DefaultEndpointToHostAction: Drop`): the wait ends when the kubelet's
    /// first probe request reached the pod (its TCP handshake completes only once the
    /// return path is programmed). Resolution: the kubelet's probe period (1 s for
    /// probe pods), plus a SYN retransmission when one was dropped.
    KubeletProbe,
}

impl ProgrammingMethod {
    /// The JSON string.
    pub fn as_str(self) -> &'static str {
        match self {
            ProgrammingMethod::NodeDial => "node_dial",
            ProgrammingMethod::KubeletProbe => "kubelet_probe",
        }
    }
}

/// One pod's own programming wait (issue 29), measured by `target-server` in the pod on
/// its own monotonic clock: every time is seconds since the pod's process start.
///
/// `wait_seconds` is when the pod's own network path first worked: the
/// [`ProgrammingMethod::NodeDial`] answer if any, else the kubelet's first request
/// ([`ProgrammingMethod::KubeletProbe`]), else null (neither yet). On a CNI that holds a
/// new pod's traffic until its agent has programmed the endpoint (Calico Felix drops
/// workload↔host traffic of an unknown interface: felix/rules/dispatch.go), this is
/// the programming delay, and Ready comes after it. On a CNI that lets node traffic
/// through at once it is about 0 whatever the agent does: the delay then shows after
/// Ready, in TTFP.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PodProgramming {
    /// How `wait_seconds` was measured (null when it is null).
    pub method: Option<ProgrammingMethod>,
    /// Seconds from process start to the first moment the pod's path worked.
    pub wait_seconds: Option<f64>,
    /// What `wait_seconds` resolves to, seconds (the dial interval, or the kubelet's
    /// probe period).
    pub resolution_seconds: Option<f64>,
    /// `IP:PORT` the pod dialed (its node's `status.hostIP`; null when not given: then
    /// only the kubelet fallback is available).
    pub node_addr: Option<String>,
    /// Connects sent to the node.
    pub node_dial_attempts: u64,
    /// Of those, the ones that ended without an answer (timeout, unreachable).
    pub node_dial_failures: u64,
    /// Earliest send time among the connects the node answered.
    pub node_dial_first_success_sent: Option<f64>,
    /// Kind of the most recent failed connect.
    pub node_dial_last_error: Option<ErrorKind>,
    /// When the pod stopped dialing its node without an answer (its give-up), if it did.
    pub node_dial_gave_up: Option<f64>,
    /// When the first request with `User-Agent: kube-probe/…` reached the pod (any path,
    /// any answer).
    pub first_kubelet_request: Option<f64>,
    /// First kubelet `/readyz` answered 200 (as the source report's `ready_at`).
    pub ready_at: Option<f64>,
}

/// One pod's programming wait as the probe record carries it (the full measurement is
/// in `source_report.programming` / `source_report.target_programming`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgrammingWait {
    /// How it was measured.
    pub method: ProgrammingMethod,
    /// Seconds from the pod's container start (its process start) to the moment its own
    /// path to its node worked, on the pod's clock.
    pub wait_seconds: f64,
    /// What the method resolves to, seconds.
    pub resolution_seconds: f64,
    /// Whether it was over `--slow-threshold` (the probe is then `slow` /
    /// `endpoint_programming_slow` unless TTFP was slow too).
    pub over_threshold: bool,
}

/// Where a probe's new-pod delay showed (issue 29): before Ready, as a pod's programming
/// wait (a CNI that holds a new pod's traffic until its agent has programmed it, as
/// Calico does, so readiness waits too), or after Ready, as TTFP (a CNI that lets the
/// node reach the pod at once).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ProbeProgramming {
    /// The source pod's wait (null when it could not be measured).
    pub source: Option<ProgrammingWait>,
    /// The target pod's wait, as the target reported it to the source.
    pub target: Option<ProgrammingWait>,
    /// `true` when the delay before Ready — the longer wait of a pod whose readiness
    /// passed only once its path worked (a target without a readiness probe, kind
    /// `unprobed`, never counts) — was at least TTFP and over
    /// [`NOTABLE_DELAY_SECONDS`] (the CNI gated readiness); `false` when TTFP was the
    /// larger (the delay was after Ready); null when neither reached it.
    pub readiness_gated: Option<bool>,
}

impl ProbeProgramming {
    /// The measured waits, seconds: the source's, then the target's, finite ones only.
    pub fn waits(&self) -> impl Iterator<Item = f64> + '_ {
        [&self.source, &self.target]
            .into_iter()
            .flatten()
            .map(|w| w.wait_seconds)
            .filter(|w| w.is_finite())
    }
}

/// Shortest delay `readiness_gated` takes a side on, seconds: the kubelet's 1 s probe
/// period (a pod is normally Ready within about that anyway).
pub const NOTABLE_DELAY_SECONDS: f64 = 1.0;

/// A path's transport protocol (issue 33, `--protocols`). Closed set; the JSON and the
/// metric label use these exact strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathProtocol {
    /// A fresh TCP connection and an HTTP/1.1 exchange per attempt.
    Tcp,
    /// One UDP datagram and its answer per attempt, from a fresh socket (a new flow for
    /// conntrack each time, as a fresh TCP connection is).
    Udp,
}

impl PathProtocol {
    /// Every protocol, in declaration order.
    pub const ALL: [PathProtocol; 2] = [PathProtocol::Tcp, PathProtocol::Udp];

    /// The JSON / metric-label string.
    pub fn as_str(self) -> &'static str {
        match self {
            PathProtocol::Tcp => "tcp",
            PathProtocol::Udp => "udp",
        }
    }
}

/// A path's IP family (issue 33, `--ip-families`). Closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IpFamily {
    Ipv4,
    Ipv6,
}

impl IpFamily {
    /// Every family, in declaration order.
    pub const ALL: [IpFamily; 2] = [IpFamily::Ipv4, IpFamily::Ipv6];

    /// The JSON / metric-label string.
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Ipv6 => "ipv6",
        }
    }

    /// The family of `ip`.
    pub fn of(ip: std::net::IpAddr) -> IpFamily {
        match ip {
            std::net::IpAddr::V4(_) => IpFamily::Ipv4,
            std::net::IpAddr::V6(_) => IpFamily::Ipv6,
        }
    }
}

/// What a path's attempts carry (issue 33, `--payload`). Closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    /// A few hundred bytes each way (the identity exchange).
    Small,
    /// Packets of the pod interface's full MTU each way, Don't Fragment set.
    Mtu,
}

impl Payload {
    /// Every payload, in declaration order.
    pub const ALL: [Payload; 2] = [Payload::Small, Payload::Mtu];

    /// The JSON / metric-label string.
    pub fn as_str(self) -> &'static str {
        match self {
            Payload::Small => "small",
            Payload::Mtu => "mtu",
        }
    }
}

/// `FromStr` for the path's closed sets: the exact JSON string, else an error naming the
/// value and the set (`unknown protocol "sctp" (expected tcp or udp)`).
macro_rules! path_set_from_str {
    ($t:ty, $what:literal, $expected:literal) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$t>::ALL
                    .into_iter()
                    .find(|x| x.as_str() == s)
                    .ok_or_else(|| {
                        format!(
                            concat!("unknown ", $what, " {:?} (expected ", $expected, ")"),
                            s
                        )
                    })
            }
        }
    };
}
path_set_from_str!(PathProtocol, "protocol", "tcp or udp");
path_set_from_str!(IpFamily, "IP family", "ipv4 or ipv6");
path_set_from_str!(Payload, "payload", "small or mtu");

/// Which path: protocol, family and payload; written `tcp/ipv4/small` (the JSON of
/// [`SourcePath::path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId {
    pub protocol: PathProtocol,
    pub family: IpFamily,
    pub payload: Payload,
}

impl std::fmt::Display for PathId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.protocol.as_str(),
            self.family.as_str(),
            self.payload.as_str()
        )
    }
}

impl std::str::FromStr for PathId {
    type Err = String;

    /// `PROTOCOL/FAMILY/PAYLOAD`, e.g. `udp/ipv6/mtu`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut it = s.split('/');
        let (Some(p), Some(f), Some(l), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(format!("{s:?}: expected PROTOCOL/FAMILY/PAYLOAD"));
        };
        let why = |e: String| format!("{s:?}: {e}");
        Ok(PathId {
            protocol: p.parse().map_err(why)?,
            family: f.parse().map_err(why)?,
            payload: l.parse().map_err(why)?,
        })
    }
}

impl Serialize for PathId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PathId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One extra path a source dialed beside its main one (`target-server probe --path`;
/// issue 33), as its report carries it (short keys: up to seven of these share the
/// termination message's [`MAX_SOURCE_REPORT_BYTES`]). Times are seconds since the
/// source's process start, on its clock; the attempts have the main path's spacing,
/// timeout, give-up and hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourcePath {
    pub path: PathId,
    /// `payload: mtu`: the IP packet size of the full-size packets each way (the route's
    /// MTU to the target when the source started, or `--mtu`); absent for `small`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u32>,
    /// Earliest send time among successful attempts (null without one).
    pub first_success_sent: Option<f64>,
    /// TCP paths: segments retransmitted on that attempt's connection (as
    /// [`SourceReport::first_success_retransmits`]); absent for UDP or when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<u32>,
    /// Attempts sent before that one (all of them without a success).
    pub attempts: u64,
    /// Of those, how many failed.
    pub failures: u64,
    /// Kind of the most recent failure before the first success (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<ErrorKind>,
    /// Failures during the hold after the first success.
    pub hold_failures: u64,
    pub outcome: SourceOutcome,
}

/// One path's result in a probe record (issue 33; [`ProbeRecord::paths`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathResult {
    pub protocol: PathProtocol,
    pub family: IpFamily,
    pub payload: Payload,
    pub result: ProbeResult,
    pub reason: Option<Reason>,
    /// This path's first good packet after the source's Ready (its `ready_at`, as the
    /// main TTFP), floored at 0; null without a success.
    pub ttfp_seconds: Option<f64>,
    /// TCP paths with a success: segments the kernel retransmitted on the connection
    /// of the first successful attempt. More than 0: the path first passed only after
    /// TCP's retransmission back-off (packets lost and sent again; RFC 6298), which its
    /// TTFP includes — loss that a TCP-only prober would report as a slow success.
    /// Absent for UDP, without a success, or from a source that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<u32>,
}

impl PathResult {
    /// Path `id`'s result, without a retransmission count.
    pub fn new(
        id: PathId,
        result: ProbeResult,
        reason: Option<Reason>,
        ttfp_seconds: Option<f64>,
    ) -> Self {
        PathResult {
            protocol: id.protocol,
            family: id.family,
            payload: id.payload,
            result,
            reason,
            ttfp_seconds,
            retransmits: None,
        }
    }

    /// Protocol, family and payload (`tcp/ipv4/small` when displayed).
    pub fn id(&self) -> PathId {
        PathId {
            protocol: self.protocol,
            family: self.family,
            payload: self.payload,
        }
    }
}

/// What `target-server probe` writes to its termination log and stdout (one JSON line).
///
/// All `f64` times are seconds on the source's monotonic clock since its own process
/// start. `null` means "did not happen". Size ≤ [`MAX_SOURCE_REPORT_BYTES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceReport {
    /// Always [`SCHEMA_VERSION`].
    pub schema: u32,
    /// This pod's name (downward API `POD_NAME`, else hostname).
    pub pod: String,
    /// `--target IP:PORT` as given.
    pub target: String,
    /// `--expect-pod`: the only identity that counts as success.
    pub expect_pod: String,
    /// Settings in force, seconds.
    pub interval_seconds: f64,
    pub attempt_timeout_seconds: f64,
    pub give_up_seconds: f64,
    pub hold_seconds: f64,
    /// Wall clock at process start, Unix seconds (display only).
    pub process_start_unix: f64,
    /// Always 0.0: the origin of every other time here.
    pub process_start: f64,
    /// When the first attempt was sent.
    pub first_attempt: Option<f64>,
    /// First `/readyz` request with a `User-Agent: kube-probe/…` header answered 200.
    pub ready_at: Option<f64>,
    /// Earliest send time among successful attempts.
    pub first_success_sent: Option<f64>,
    /// When that attempt's answer arrived.
    pub first_success_received: Option<f64>,
    /// TCP segments the kernel retransmitted on that attempt's connection
    /// (`tcpi_total_retrans`, tcp(7)): more than 0 means the first success came only
    /// after TCP's retransmission back-off, which its time includes (issue 33). Added
    /// field (absent when unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_success_retransmits: Option<u32>,
    /// `first_success_sent − ready_at` floored at 0 (null unless both exist).
    pub ttfp_seconds: Option<f64>,
    /// `first_success_sent − ready_at`, may be negative.
    pub raw_ttfp_seconds: Option<f64>,
    /// Attempts sent before the one that first succeeded (all attempts if none did).
    pub attempts_before_success: u64,
    /// Of those, how many failed (attempts still in flight at success are not counted).
    pub failures_before_success: u64,
    /// Of those failures, the ones sent before `ready_at` (all of them when `ready_at`
    /// is null): what the pod met before the kubelet called it Ready, which no
    /// application started at Ready would see. Added field (defaults to 0).
    #[serde(default)]
    pub failures_before_ready: u64,
    /// Earliest send time among successful attempts sent at or after `ready_at` (null
    /// without `ready_at` or without such a success). Added field (defaults to null).
    #[serde(default)]
    pub first_success_after_ready_sent: Option<f64>,
    /// Failed attempts sent at or after `ready_at` and before
    /// `first_success_after_ready_sent` (every failure sent after `ready_at` when there
    /// is no such success; 0 without `ready_at`): what an application that starts
    /// connecting when its pod turns Ready would see fail first. Added field (defaults
    /// to 0).
    #[serde(default)]
    pub failures_after_ready_before_success: u64,
    /// Failure counts by kind, over the whole run.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// Kind of the most recent failure before the first success.
    pub last_error: Option<ErrorKind>,
    /// Identity of a wrong peer seen (first one), if any.
    pub wrong_peer: Option<String>,
    /// The hold after the first success.
    pub hold: SourceHold,
    pub outcome: SourceOutcome,
    /// This source pod's own programming wait ([`PodProgramming`]). Added field
    /// (defaults to null: a source that predates it).
    #[serde(default)]
    pub programming: Option<PodProgramming>,
    /// The target pod's programming wait as the target reported it in its last answer
    /// to a successful attempt (`GET /` carries it; its times are on the target's
    /// clock). Null when no attempt succeeded or the target predates it.
    #[serde(default)]
    pub target_programming: Option<PodProgramming>,
    /// `target-server probe --policy-change` only: the marks and what the attempts
    /// met around them ([`SourcePolicy`]). Added field (issue 32; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<SourcePolicy>,
    /// The extra paths dialed beside the main one (`--path`; issue 33), in the order
    /// given. Added field (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<SourcePath>,
}

/// How a `--policy-change` source's run ended (issue 32). Closed set.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PolicyOutcome {
    /// Admitted after the allow mark, held, and blocked again after the revoke mark.
    Revoked,
    /// Still answered `--give-up` after the revoke mark.
    StillAdmitted,
    /// No answer within `--give-up` after the allow mark.
    NotAdmitted,
    /// No allow mark within `--give-up` of process start.
    NoAllowMark,
    /// No revoke mark within `--give-up` after the hold ended.
    NoRevokeMark,
    /// Stopped by SIGTERM first.
    #[default]
    Terminated,
}

/// A `policy_change` source's view of the policy it was admitted and then refused by
/// (issue 32). Every time is seconds since the source's process start, on its own
/// clock; the prober marks the moments over HTTP (`POST /mark/arm` before it creates
/// the allow policy, `/mark/allow` right after the create returned, `/mark/revoke`
/// right after the delete returned), so no time taken on another machine is
/// subtracted. Attempts are those of the dial loop (one every `--interval`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SourcePolicy {
    /// When each mark arrived (null: never).
    pub arm_at: Option<f64>,
    pub allow_at: Option<f64>,
    pub revoke_at: Option<f64>,
    /// Answered attempts sent before the arm mark: the target is isolated by a deny-all
    /// policy from its first instant, so each is an isolation breach.
    pub admitted_before_arm: u64,
    /// Send time of the earliest of them.
    pub first_admitted_before_arm_sent: Option<f64>,
    /// Earliest send time among answered attempts sent at or after the arm mark (and
    /// before the revoke mark).
    pub first_admitted_sent: Option<f64>,
    /// `first_admitted_sent − allow_at`: the policy's programming latency as the pod
    /// met it. May be negative by up to the mark's delivery time (the create had
    /// returned before the mark was sent).
    pub admitted_seconds: Option<f64>,
    /// When the hold after `first_admitted_sent` ended (the prober reads it on
    /// `GET /policy` before it deletes the policy).
    pub held_at: Option<f64>,
    /// Failed attempts sent during the hold (works-then-breaks).
    pub hold_failures: u64,
    /// Latest send time among answered attempts sent after the revoke mark.
    pub last_admitted_sent: Option<f64>,
    /// Earliest send time among failed attempts sent after the revoke mark and after
    /// `last_admitted_sent`: the first connection the revocation refused.
    pub first_blocked_sent: Option<f64>,
    /// `first_blocked_sent − revoke_at` (floored at 0): the revocation's latency, at one
    /// dial interval's resolution.
    pub revoked_seconds: Option<f64>,
    pub outcome: PolicyOutcome,
}

/// Works-then-breaks accounting after the first success (docs/design.md §2 step 7).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SourceHold {
    /// Hold length actually observed, seconds.
    pub seconds: f64,
    /// Attempts sent during the hold.
    pub attempts: u64,
    /// Failed attempts during the hold (failures sent before the first success after
    /// `ready_at` are not counted: they are pre-Ready or first-attempt failures).
    pub failures: u64,
    /// Failures per whole second of the hold, at most [`MAX_HOLD_SERIES`] entries.
    pub failures_per_second: Vec<u32>,
}

/// One pod's side of a probe (docs/design.md §4 `source` / `target`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PodRef {
    pub node: String,
    pub pod: String,
    pub uid: Option<String>,
    pub ip: Option<String>,
    /// Host-side interface name as Calico derives it (`cali` + 11 hex of SHA-1 of
    /// `namespace.pod`, libcalico-go `names.go`).
    pub iface: Option<String>,
}

/// API timeline of one pod, seconds on the prober's monotonic clock since probe start.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PodTimeline {
    pub created: Option<f64>,
    pub scheduled: Option<f64>,
    pub ip_assigned: Option<f64>,
    pub ready: Option<f64>,
    pub finished: Option<f64>,
    pub deleted: Option<f64>,
}

/// Both pods' timelines plus the probe's wall-clock start.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// RFC 3339 wall time when the probe started (display only).
    pub started_at: String,
    pub target: PodTimeline,
    pub source: PodTimeline,
    /// Seconds from probe start until the record was complete.
    pub finished: Option<f64>,
}

/// Attempt accounting copied from the source report.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Attempts {
    pub before_success: u64,
    pub failures_before_success: u64,
    pub last_error: Option<ErrorKind>,
    pub errors: BTreeMap<ErrorKind, u64>,
}

/// Hold result in the probe record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Hold {
    pub seconds: f64,
    pub failures: u64,
}

/// Node-agent signals (docs/design.md §3). Closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Signal {
    DataplaneApplySlow,
    DataplaneApplyFailures,
    DatastoreResync,
    RouteResyncSlow,
    AgentRestarted,
    AgentNotReady,
    AgentUnreachable,
    AgentBadMetrics,
}

impl Signal {
    /// Every signal, in declaration order.
    pub const ALL: [Signal; 8] = [
        Signal::DataplaneApplySlow,
        Signal::DataplaneApplyFailures,
        Signal::DatastoreResync,
        Signal::RouteResyncSlow,
        Signal::AgentRestarted,
        Signal::AgentNotReady,
        Signal::AgentUnreachable,
        Signal::AgentBadMetrics,
    ];

    /// The JSON string, also the `signal` label of metrics, Events and JUnit.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::DataplaneApplySlow => "dataplane_apply_slow",
            Signal::DataplaneApplyFailures => "dataplane_apply_failures",
            Signal::DatastoreResync => "datastore_resync",
            Signal::RouteResyncSlow => "route_resync_slow",
            Signal::AgentRestarted => "agent_restarted",
            Signal::AgentNotReady => "agent_not_ready",
            Signal::AgentUnreachable => "agent_unreachable",
            Signal::AgentBadMetrics => "agent_bad_metrics",
        }
    }
}

/// Which side of a probe a node played.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Source,
    Target,
}

impl Role {
    /// The JSON string, also the `role` label of metrics and JUnit.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Target => "target",
        }
    }
}

/// A suspect (on slow/failed probes) or warning (normal TTFP): docs/design.md §3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspect {
    pub node: String,
    pub role: Role,
    pub signal: Signal,
    /// Free-form numbers behind the signal (e.g. `{"apply_mean_seconds": 1.2,
    /// "healthy_apply_mean_seconds": 0.01}`).
    pub evidence: serde_json::Value,
}

/// One probe as the prober records it (docs/design.md §4 "Probe").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub id: String,
    /// `cross_node`, `same_node`, `recreate`, `service`, `burst`.
    pub kind: String,
    pub source: PodRef,
    pub target: PodRef,
    pub result: ProbeResult,
    pub reason: Option<Reason>,
    /// Human detail for non-success results (e.g. the pod condition message).
    pub detail: Option<String>,
    pub ttfp_seconds: Option<f64>,
    pub raw_ttfp_seconds: Option<f64>,
    /// Target Ready → source Ready on the prober clock: target-side delays shorter than
    /// this are masked.
    pub target_ready_to_source_ready_seconds: Option<f64>,
    pub attempts: Attempts,
    pub hold: Hold,
    pub timeline: Timeline,
    pub suspects: Vec<Suspect>,
    /// The source's own report as read from its termination message, if any.
    pub source_report: Option<SourceReport>,
    /// First-attempt failures: when the probe worked (`success`, `slow`,
    /// `lost_after_success`) and the source had a success sent after it turned Ready,
    /// the number of its attempts sent after Ready (`ready_at`) that failed before that
    /// success — what an application starting to connect at Ready would see fail (new
    /// pods whose first connections fail, then work). 0 otherwise. Attempts sent before
    /// Ready are counted apart in `pre_ready_attempt_failures`. Added after schema 1
    /// was first published (defaults to 0 when absent).
    #[serde(default)]
    pub first_attempt_failures: u64,
    /// When the probe worked: the source's failed attempts sent before it turned Ready
    /// (and before its first success) — the dataplane not yet programmed while the pod
    /// was still starting, which Kubernetes allows. 0 otherwise. Added field (defaults
    /// to 0).
    #[serde(default)]
    pub pre_ready_attempt_failures: u64,
    /// Both pods' own programming waits and where this probe's delay was (issue 29);
    /// null when the source left no report. Added field.
    #[serde(default)]
    pub programming: Option<ProbeProgramming>,
    /// API writes (creates + deletes, Events excluded) this probe made; each kind's
    /// budget is in the prober's `probe` module docs (docs/design.md §7).
    #[serde(default)]
    pub api_writes: u64,
    /// `recreate` probes only: the stable-name target's previous incarnation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recreate: Option<RecreateInfo>,
    /// `burst` probes only: the filler pods created with the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<BurstInfo>,
    /// `service` probes only: the per-probe ClusterIP Service the source dialed.
    /// Added field (issue 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceInfo>,
    /// `policy` and `policy_change` probes only: the NetworkPolicies the probe created
    /// and what they did. Added field (issue 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyInfo>,
    /// Every path the run asked for (`--protocols`, `--payload`, `--ip-families`; issue
    /// 33), the main one (TCP, small, the pod's primary family) first; absent when the
    /// run asked for the main path only. The record's `result`/`reason` are the worst
    /// of these (failed, then inconclusive, then slow); `ttfp_seconds` stays the main
    /// path's. Added field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathResult>,
    /// `prober run` only: whether the probe counted as drift off the learned baseline
    /// (the prober's `baseline` module). Absent in gate reports. Added field (issue 14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftMark>,
}

/// What a probe counted as in `prober run`'s drift detection: taken when its kind's
/// drift or one of its nodes' drift was active once the probe was added (recent median
/// / max(baseline median, dial interval) ≥ `--drift-ratio` and recent − baseline >
/// `--drift-floor`, with enough samples). Such probes stay out of the baseline.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DriftMark {
    /// The kind's or a node's drift was active.
    pub counted: bool,
    /// The probe kind's drift was active.
    pub kind: bool,
    /// The probe's nodes (source, target) whose drift was active.
    pub nodes: Vec<String>,
}

/// The gate's comparison with a saved baseline (`--baseline FILE`), report field
/// `baseline`. Added field (issue 14).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineComparison {
    /// The quantile compared on both sides: `p50`, `p90` or `p95`.
    pub quantile: String,
    /// `--drift-ratio`: regression when now / max(baseline, dial interval) ≥ this…
    pub ratio: f64,
    /// …and now − baseline > `--drift-floor`, seconds.
    pub floor_seconds: f64,
    /// `--baseline-min-samples`: baseline series with fewer samples are compared with a
    /// warning.
    pub min_samples: u64,
    /// When the baseline was saved (RFC 3339, from the file).
    pub saved_at: String,
    /// Some entry regressed (the gate exits 1).
    pub regressed: bool,
    /// Some baseline series had fewer than `min_samples` samples.
    pub few_samples: bool,
    /// One per kind (`node` null) and per kind and node.
    pub entries: Vec<BaselineEntry>,
    /// Kinds or nodes on one side only, too few samples, settings that differ.
    pub warnings: Vec<String>,
}

/// One compared series of [`BaselineComparison`]. Seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineEntry {
    pub kind: String,
    /// Null for the kind as a whole.
    pub node: Option<String>,
    /// The saved quantile (null when the saved series had no sample).
    pub baseline_seconds: Option<f64>,
    pub baseline_samples: u64,
    /// This run's quantile: the kind's, or the node's best peer's (its probes grouped by
    /// the other node, the lowest group quantile). Null without a sample.
    pub current_seconds: Option<f64>,
    pub current_samples: u64,
    /// current / max(baseline, dial interval).
    pub ratio: Option<f64>,
    pub regressed: bool,
    /// The baseline series had fewer than `min_samples` samples.
    pub few_samples: bool,
    /// Nodes only: the peer whose probes gave `current_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_peer: Option<String>,
    /// What the series measures: `ttfp` (absent in files that predate the field), or
    /// `programming_wait` (a node's probe pods' own programming waits, either role;
    /// issue 29). Added field.
    #[serde(default)]
    pub metric: BaselineMetric,
}

/// The measure a [`BaselineEntry`] compares. Closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineMetric {
    /// Time to first packet.
    #[default]
    Ttfp,
    /// A pod's own programming wait ([`PodProgramming`]).
    ProgrammingWait,
}

/// The per-probe ClusterIP Service of a `service` probe (docs/design.md §2 kinds): it selects
/// only the probe's fresh target; the source dials `<cluster_ip>:80` (Service port 80 →
/// targetPort 8080).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ServiceInfo {
    /// Service name, `fp-<probe id>-svc`.
    pub name: String,
    /// `spec.clusterIP` the API server allocated (null if the create failed).
    pub cluster_ip: Option<String>,
}

/// What a `policy` / `policy_change` probe created and measured (issue 32).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PolicyInfo {
    /// The NetworkPolicies the probe created, in creation order (`fp-<id>-isolate`,
    /// `fp-<id>-egress`, `fp-<id>-allow`).
    pub policies: Vec<String>,
    /// `policy`: the isolation check of the probe's intruder pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<IsolationCheck>,
    /// `policy_change`: seconds from the allow policy's creation to the first answered
    /// connection (the source's `admitted_seconds`, floored at 0; also the record's
    /// `ttfp_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_seconds: Option<f64>,
    /// `policy_change`: seconds from the allow policy's deletion to the first refused
    /// connection (the source's `revoked_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_seconds: Option<f64>,
    /// `policy_change`: Unix seconds (prober's clock) when the allow policy's create
    /// returned and when its delete returned; for comparisons with a testbed's truth
    /// on the same machine, never subtracted from the pod's times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_created_unix: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_deleted_unix: Option<f64>,
}

/// A `policy` probe's isolation check (issue 32): a fresh pod that no rule admits (the
/// intruder, on the source's node) dials the isolated target from its own first
/// instant for `window_seconds`; any answer is an isolation breach.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct IsolationCheck {
    /// The intruder pod.
    pub pod: String,
    /// Whether the intruder reported (false: it never ran; see `detail`).
    pub checked: bool,
    /// Its attempts, and how many of them the target answered (breaches).
    pub attempts: u64,
    pub admitted: u64,
    /// Send time of the first answered attempt, seconds since the intruder's start.
    pub first_admitted_seconds: Option<f64>,
    /// How long the intruder dialed.
    pub window_seconds: f64,
    /// Why the check did not run, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What a `recreate` probe knows about the stable-name target it deleted and created
/// again on the same node (StatefulSet style; calico#11016: a recreated pod reusing its
/// interface name lost its route).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RecreateInfo {
    /// Pod IP of the previous incarnation (null if it never got one).
    pub previous_ip: Option<String>,
    /// UID of the previous incarnation.
    pub previous_uid: Option<String>,
    /// Host-side interface name of the target (`cali` + 11 hex of SHA-1 of
    /// `namespace.pod`): the same for every incarnation.
    pub iface: String,
    /// True when the new pod has the same name, namespace and node as the previous
    /// incarnation, so a Calico-like CNI gives it the same interface name.
    pub iface_reused: bool,
    /// Seconds (prober clock) from the delete call of the previous incarnation to the
    /// create call of the new one (includes waiting for the watch's `DELETED`).
    pub recreate_gap_seconds: Option<f64>,
}

/// What a `burst` probe created besides its pair.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BurstInfo {
    /// Filler pods requested (`--burst-size`), created on the target's node together
    /// with the target.
    pub fillers: u32,
    /// Of those, how many create calls succeeded.
    pub fillers_created: u32,
    /// Seconds (prober clock) from the first filler's create to the last filler's
    /// Ready: the node's pod-start backlog (null unless every created filler turned
    /// Ready). Added field (defaults to null).
    #[serde(default)]
    pub fillers_ready_seconds: Option<f64>,
    /// Seconds (prober clock) from the first filler's create until the node's backlog
    /// had drained: the later of the last filler's Ready and the first success through
    /// the target (source Ready on the prober clock + the source's raw TTFP): pod
    /// starts, and the part of the node's programming queue ahead of the target (the
    /// fillers' own programming is not visible from the API). Null without both. While
    /// a burst runs, no other probe of the gate uses its target's node, so this backlog
    /// is the burst's own. Added field (defaults to null).
    #[serde(default)]
    pub backlog_drain_seconds: Option<f64>,
}

/// Gate verdict (docs/design.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    Inconclusive,
}

/// What the summary concludes about the cluster (docs/design.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Diagnosis {
    Healthy,
    SlowNodes,
    CrossNodeBroken,
    /// The failures follow particular node pairs (listed in
    /// [`Summary::failing_pairs`]); each node of such a pair passes with other peers.
    PairFailures,
    NodeLocalBroken,
    ScatteredFailures,
    Inconclusive,
}

/// Thresholds the verdict used, seconds / counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub slow_threshold_seconds: f64,
    pub max_ttfp_seconds: f64,
    pub max_failures: u64,
    pub max_inconclusive: u64,
}

/// Gate summary: counts and nearest-rank TTFP quantiles over probes with a TTFP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub total: u64,
    /// Count per result; every result key is present (0 when none).
    pub by_result: BTreeMap<ProbeResult, u64>,
    pub ttfp_p50: Option<f64>,
    pub ttfp_p95: Option<f64>,
    pub ttfp_max: Option<f64>,
    pub diagnosis: Diagnosis,
    /// Probes whose source's first attempts failed and then worked
    /// (`ProbeRecord::first_attempt_failures` > 0). Added field (defaults to 0).
    #[serde(default)]
    pub first_attempt_failures: u64,
    /// The same counts and quantiles per probe kind (`cross_node`, `same_node`, …).
    /// Added field (defaults to empty).
    #[serde(default)]
    pub by_kind: BTreeMap<String, KindSummary>,
    /// Node pairs whose probes fail as a pair: failed in both directions or at least
    /// twice, each of the two nodes passing with some other peer (prober `gate` module
    /// docs, diagnosis rules). Sorted by node names. Listed whatever the diagnosis
    /// (`pair_failures` when these pairs explain every slow/failed probe). Added field
    /// (defaults to empty).
    #[serde(default)]
    pub failing_pairs: Vec<FailingPair>,
    /// Nearest-rank p50/p95/max of the conclusive probes' pods' own programming waits
    /// (source and target, seconds; `ProbeRecord::programming`); null when none was
    /// measured. The gate holds p95 to `--max-ttfp` as it does TTFP's (issue 29: on a
    /// CNI that gates readiness the stall is here, not in TTFP). Added fields.
    #[serde(default)]
    pub programming_wait_p50: Option<f64>,
    #[serde(default)]
    pub programming_wait_p95: Option<f64>,
    #[serde(default)]
    pub programming_wait_max: Option<f64>,
}

/// One entry of [`Summary::failing_pairs`]: an unordered node pair and the conclusive
/// cross-node probes between its two nodes (either direction, any kind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailingPair {
    /// The two nodes, sorted by name.
    pub nodes: [String; 2],
    /// `failed` probes between them.
    pub failed: u64,
    /// Probes between them that passed (`success` or `slow`).
    pub passed: u64,
    /// Whether probes failed in both directions (each node once the source).
    pub both_directions: bool,
}

/// Per-kind part of the [`Summary`]: counts and nearest-rank TTFP quantiles (seconds)
/// over that kind's conclusive probes with a TTFP.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KindSummary {
    pub total: u64,
    pub by_result: BTreeMap<ProbeResult, u64>,
    pub ttfp_p50: Option<f64>,
    pub ttfp_p95: Option<f64>,
    pub ttfp_max: Option<f64>,
    pub first_attempt_failures: u64,
}

/// Per-node, per-role aggregate.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeRoleStats {
    pub probes: u64,
    pub by_result: BTreeMap<ProbeResult, u64>,
    pub ttfp_max: Option<f64>,
}

/// One node's line in the report (docs/design.md §4 `nodes[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub node: String,
    /// The node labels named by `--group-by-label` (absent labels omitted).
    pub labels: BTreeMap<String, String>,
    pub as_source: NodeRoleStats,
    pub as_target: NodeRoleStats,
}

/// The gate's report (`--report FILE`), docs/design.md §4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub schema: u32,
    pub verdict: Verdict,
    /// Process exit code that goes with the verdict (0 pass, 1 fail, 2 inconclusive).
    pub exit_code: i32,
    /// Why the verdict is what it is, one line per broken threshold.
    pub verdict_reasons: Vec<String>,
    pub thresholds: Thresholds,
    pub summary: Summary,
    pub nodes: Vec<NodeSummary>,
    pub warnings: Vec<Suspect>,
    pub probes: Vec<ProbeRecord>,
    /// Prober instance id (the `firstpacket.io/instance` label value).
    pub instance: String,
    /// RFC 3339 wall times (display only).
    pub started_at: String,
    pub finished_at: String,
    pub duration_seconds: f64,
    /// Run-level errors (API unreachable, `--timeout` hit, interrupted).
    pub errors: Vec<String>,
    /// Why the gate stopped starting (and cut short) probes of some kind before the plan
    /// was done, once the pattern was certain (e.g. every `cross_node` pair failing
    /// while the `same_node` control passed); those probes are `inconclusive` /
    /// `interrupted`. Null when the whole plan ran. Added field.
    #[serde(default)]
    pub stopped_early: Option<String>,
    /// Nodes the gate did not probe and why (`not Ready`, `cordoned`, selector or taint):
    /// a NotReady node after an upgrade must not vanish from the report. Added field.
    #[serde(default)]
    pub skipped_nodes: Vec<SkippedNode>,
    /// Node-agent correlation in this run (docs/design.md §3): scrape mode and per-profile scrape
    /// counts, so a reader can tell that correlation ran (and on what). `None` (absent in
    /// JSON) when the run stopped before correlation started. Added field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentsReport>,
    /// API outages the run lived through (the prober's `apihealth` module: from the first
    /// unanswered request to the first answer), oldest first, at most 100. Added field.
    #[serde(default)]
    pub api_outages: Vec<ApiOutage>,
    /// The comparison with `--baseline FILE` (absent without it). Added field (issue 14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<BaselineComparison>,
}

/// One entry of the report's `api_outages[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiOutage {
    /// RFC 3339 wall time of the first unanswered request (prober clock).
    pub start: String,
    /// Seconds from the first unanswered request to the first answer (so far, when
    /// `ongoing`).
    pub seconds: f64,
    /// The run ended before the API answered again.
    pub ongoing: bool,
    /// The first failure, one line (`Connection refused (os error 111)`, `HTTP 503 …`).
    pub first_error: String,
    /// Requests that went unanswered during the outage.
    pub failed_requests: u64,
}

/// The report's `agents` object: how node agents were scraped in a gate run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentsReport {
    /// `--agent-scrape`: `auto`, `direct` or `proxy`.
    pub scrape_mode: String,
    /// Per enabled profile (`calico-felix`, `cilium-agent`, `kube-proxy`, `aws-node`, or
    /// one from `--agent-config`). Empty when every profile is disabled (correlation off).
    pub profiles: BTreeMap<String, AgentProfileReport>,
}

/// One profile's line of [`AgentsReport`]. Counts are for the whole run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentProfileReport {
    /// Nodes with a discovered agent pod of this profile (0: not this cluster's agent).
    pub nodes_with_agent: u64,
    /// Scrapes that gave a reading.
    pub scrapes_ok: u64,
    /// Scrapes that failed (unreachable or unreadable page).
    pub scrapes_failed: u64,
    /// Nodes whose agent was scraped at least once (in the kept history).
    #[serde(default)]
    pub nodes_scraped: u64,
    /// Nodes with at least one successful scrape (in the kept history).
    #[serde(default)]
    pub nodes_ok: u64,
    /// Nodes scraped through the API server's pod proxy after the direct path failed
    /// (`--agent-scrape auto`).
    #[serde(default)]
    pub nodes_via_proxy: u64,
    /// Failed scrapes by reason (`connect`, `timeout`, `http_status`, `parse`,
    /// `no_signal_metrics`, …; the `result` label of `firstpacket_agent_scrapes_total`).
    #[serde(default)]
    pub failures: BTreeMap<String, u64>,
}

/// A node left out of the plan (docs/design.md §2 step 1: Ready, schedulable, matching the
/// selector, no untolerated taint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedNode {
    pub node: String,
    pub reason: String,
}
