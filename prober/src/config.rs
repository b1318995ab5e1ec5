//! Command line (docs/design.md §6 "prober flags", binding). Every flag has an environment
//! fallback `FIRSTPACKET_<FLAG>` (upper case, `-` → `_`). Durations use humantime syntax
//! (`100ms`, `1.5s`, `10m`).

use crate::schedule::{NodeSelector, TolerationSpec};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

/// Checks an object name as Kubernetes does for most kinds, Leases included
/// (`IsDNS1123Subdomain`, k8s.io/apimachinery/pkg/util/validation): lower-case
/// alphanumerics, '-' and '.', each dot-separated part starting and ending
/// alphanumeric, ≤ 253 characters. Errors: the rule, naming the value.
pub fn parse_dns_subdomain(s: &str) -> Result<String, String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.len() > 253 || !s.split('.').all(label_ok) {
        return Err(format!(
            "{s:?} is not a valid object name (a DNS-1123 subdomain: lower-case letters, \
             digits, '-' and '.', starting and ending with a letter or digit, at most 253 \
             characters)"
        ));
    }
    Ok(s.to_string())
}

/// Parses a humantime duration (`1.5s`, `100ms`, `10m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("'{s}': {e}"))
}

use crate::kind::ProbeKind;

/// Default `--leader-elect-lease-name`.
pub const DEFAULT_LEASE_NAME: &str = "firstpacket-leader";

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// How node-agent metrics are scraped (docs/design.md §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AgentScrape {
    /// http://HOST-IP:PORT/metrics (in-cluster).
    Direct,
    /// Through the API server's pod proxy.
    Proxy,
    /// Direct first; per node and agent profile, the API server's pod proxy once the
    /// direct path fails (remembered for the rest of the run).
    Auto,
}

impl AgentScrape {
    /// The flag value, also the report's `agents.scrape_mode`: `direct`, `proxy`, `auto`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentScrape::Direct => "direct",
            AgentScrape::Proxy => "proxy",
            AgentScrape::Auto => "auto",
        }
    }
}

/// The default `--image`: target-server's image as `bash scripts/image.sh` names it,
/// tagged with the workspace version (Cargo.toml), so a release's prober starts the
/// target-server image of the same release.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/firstpacket/target-server:",
    env!("CARGO_PKG_VERSION")
);

const ABOUT: &str = "firstpacket prober: time to first packet (TTFP) between brand-new pods";

const LONG_ABOUT: &str = "\
firstpacket measures endpoint-programming latency: how long after a brand-new pod is
Ready it can really exchange packets with another brand-new pod on another node.

TTFP (time to first packet) = first successful request sent by the source pod − the
moment the source pod became Ready, both on the source node's monotonic clock.";

/// Top-level command line.
#[derive(Debug, Parser)]
#[command(name = "prober", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One-shot gate: probe every node as source and target, print a table, exit 0/1/2.
    #[command(long_about = GATE_LONG_ABOUT, after_help = GATE_AFTER_HELP)]
    Gate(GateArgs),
    /// Continuous mode: probe forever, serve /metrics, a status page and Node Events.
    #[command(
        long_about = RUN_LONG_ABOUT,
        after_help = RUN_AFTER_HELP,
        mut_arg("concurrency", |a| a.default_value("2"))
    )]
    Run(RunArgs),
    /// List (and with --yes delete) the probe pods and Services of dead prober instances,
    /// or of one named instance, now.
    #[command(long_about = CLEANUP_LONG_ABOUT)]
    Cleanup(CleanupArgs),
}

const CLEANUP_LONG_ABOUT: &str = "\
List (and with --yes delete) the probe pods and Services that dead prober instances left
in the probe namespace, now — instead of waiting for the next prober's start-up sweep or
the pods' activeDeadlineSeconds (e.g. after killing a gate with SIGKILL).

Dead: an in-cluster instance whose owner pod is gone, a gate whose pods are older than
their deadline + 60 s, or an instance whose Lease (firstpacket-<instance>, renewed every
5 s while it lives) nobody renewed for 15 s. Telling that takes watching the Leases for
15 s, so cleanup takes about that long when other instances have Leases. Without --yes
nothing is deleted.

  prober cleanup                       # list instances, their state and objects
  prober cleanup --yes                 # delete the dead ones' objects and Leases
  prober cleanup --instance gate-ab12cd34 --yes   # one instance, now, dead or not
";

/// `prober cleanup` flags.
#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// Kubeconfig file (default: KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, env = "FIRSTPACKET_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Kubeconfig context to use (default: the file's current-context).
    #[arg(long, env = "FIRSTPACKET_CONTEXT")]
    pub context: Option<String>,

    /// Probe namespace.
    #[arg(long, env = "FIRSTPACKET_NAMESPACE", default_value = "firstpacket")]
    pub namespace: String,

    /// Only this instance (`gate-…` / `run-…`, the `firstpacket.io/instance` label),
    /// dead or not.
    #[arg(long, env = "FIRSTPACKET_CLEANUP_INSTANCE")]
    pub instance: Option<String>,

    /// Delete (without it, only list what would be deleted).
    #[arg(long)]
    pub yes: bool,

    /// Log format of stderr.
    #[arg(
        long,
        env = "FIRSTPACKET_LOG_FORMAT",
        value_enum,
        default_value = "plain"
    )]
    pub log_format: LogFormat,
}

const GATE_LONG_ABOUT: &str = "\
One-shot gate (e.g. after a CNI upgrade, in CI/CD).

For each planned pair (source node A → target node B, a shuffled ring so every node is
a source once and a target once per lap) the gate creates a fresh target pod on B,
waits until it is Ready, then creates a fresh source pod on A that dials the target
every --dial-interval. The source measures TTFP on its own clock and reports it in its
termination message; the gate records the result, deletes both pods (4 API writes per
probe) and moves on, --concurrency pairs at a time.

Kinds (--kinds, --pairs probes of each): cross_node (default); same_node, a control
pair on one node; recreate, a stable-name target per node deleted and recreated on the
same node (the CNI reuses the interface name, calico#11016); service, through a
per-probe ClusterIP Service selecting the fresh target (late Service rules); burst, the
target created right after --burst-size filler pods on its node; unprobed, as cross_node
with a target without a readiness probe; policy, a fresh target isolated by a
NetworkPolicy admitting only the fresh source (and an intruder pod that must never get
through: isolation_breach); policy_change, an allow policy created over two running pods
and deleted again, timed on the source's clock. With same_node in --kinds, the gate
stops its cross-node pairs early once the verdict is fail and every cross-node pair so
far got no answer while the same_node controls passed (diagnosis cross_node_broken).

Results: success (TTFP and the pods' programming waits <= --slow-threshold), slow,
failed (network: no success, lost after success, never Ready, never programmed, wrong
peer, MTU black hole, isolation breach, revocation not enforced) and inconclusive (not
the network's fault: unschedulable, image pull, container failed, node not Ready, API
error, admission rejected, interrupted, a requested IP family the target lacks). With
--protocols/--payload/--ip-families a probe takes its worst path's result.

Node-agent correlation: the metrics of the node agents (Calico Felix, Cilium,
kube-proxy, aws-node; --agent-config, --agent-scrape) on the probes' nodes are scraped
before and after each probe. Findings appear as suspects on slow/failed probes and as
warnings otherwise; agent trouble alone never fails the gate. The report's agents
object and the \"node agents\" line of the output say which agents were found and
scraped (or that correlation is off).";

const GATE_AFTER_HELP: &str = "\
Exit codes:
  0  pass: every threshold held
  1  fail: conclusive probes breached a threshold (TTFP p95 or the new pods'
     programming-wait p95 > --max-ttfp, or more failed probes than --max-failures),
     or a kind or node regressed against
     --baseline (ratio >= --drift-ratio and difference > --drift-floor)
  2  inconclusive: too many inconclusive probes (> --max-inconclusive), the run was
     interrupted or hit --timeout, or an error (API unreachable/forbidden, < 2 nodes);
     --report is still written (verdict inconclusive, the cause in errors[])

Examples:
  prober gate                                   # one probe per node, defaults
  prober gate --pairs 20 --concurrency 8 --report gate.json
  prober gate --node-selector pool=web --toleration dedicated=web:NoSchedule
  prober gate --seed 42 --dry-run               # print the plan and pod specs only
  prober gate --pairs 12 --save-baseline before.json          # before an upgrade
  prober gate --pairs 12 --baseline before.json --junit j.xml # after it
  FIRSTPACKET_MAX_TTFP=2s prober gate           # every flag has an env fallback";

const RUN_LONG_ABOUT: &str = "\
Continuous mode (e.g. a Deployment feeding Prometheus, Grafana and Alertmanager).

Every --probe-interval (jittered by ±20 %), at most --concurrency at a time, the prober
runs one probe (the gate's probe: fresh target pod, fresh source pod dialing it, TTFP
from the source's clock, both pods deleted). Node pairs rotate in laps: per lap every
eligible node is source once and target once; kinds rotate over --kinds. The node set
is watched: NotReady, cordoned, untolerated and non-matching nodes are skipped as they
change. A node that joins, turns Ready or is uncordoned, and a node whose agent pod
(calico-node, cilium, kube-proxy, aws-node) was replaced or restarted, is probed next,
as source and as target.

Admin server (--admin-addr): /metrics (Prometheus), /livez, /readyz (ready once the
pod watch listed the probe pods), /api/v1/probes (recent records in the gate's record
shape, with a running total), / (status page: TTFP over time, node-pair matrix, recent
slow/failed probes with their suspects, lap time).

Slow and failed probes raise Events on the blamed Nodes (reasons FirstPacketSlow,
FirstPacketFailed; at most one per node and reason every 5 minutes), visible in
`kubectl describe node`.

In-cluster, set POD_NAME, POD_NAMESPACE and POD_UID from the downward API: probe pods
then carry an ownerReference to the prober pod (same namespace only), and a restarted
container removes its previous incarnation's probe pods at start-up.";

const RUN_AFTER_HELP: &str = "\
Signals: SIGTERM/SIGINT stops starting probes, cancels the running ones (their pods
are deleted) and exits 0 within 25 s; a second signal deletes the probe pods
best-effort and exits 2.

Examples:
  prober run                                    # defaults: a probe every 30s, 2 at a time
  prober run --probe-interval 10s --kinds cross_node,same_node
  prober run --admin-addr 127.0.0.1:9090        # out-of-cluster, local admin server
  FIRSTPACKET_PROBE_INTERVAL=1m prober run      # every flag has an env fallback";

/// Flags shared by `gate` and `run`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Kubeconfig file to use. Unset: `KUBECONFIG`, then `~/.kube/config`, then the
    /// in-cluster service account (kube-rs `Config::infer`).
    #[arg(long, env = "FIRSTPACKET_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Kubeconfig context to use (default: the file's `current-context`). Needs a
    /// kubeconfig (from `--kubeconfig`, `KUBECONFIG` or `~/.kube/config`).
    #[arg(long, env = "FIRSTPACKET_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,

    /// Namespace for probe pods: used as it is when it exists; created only when it is
    /// missing and RBAC allows creating namespaces (else the error says what to create).
    #[arg(long, env = "FIRSTPACKET_NAMESPACE", default_value = "firstpacket")]
    pub namespace: String,

    /// target-server image (args only are set; its entrypoint is the binary). Default:
    /// the image `bash scripts/image.sh` builds, tagged with this prober's version.
    #[arg(long, env = "FIRSTPACKET_IMAGE", default_value = DEFAULT_IMAGE)]
    pub image: String,

    /// Nodes to probe: label selector, comma-separated terms k=v, k!=v, k (has
    /// the label) or !k (has not).
    #[arg(
        long,
        env = "FIRSTPACKET_NODE_SELECTOR",
        default_value = "kubernetes.io/os=linux"
    )]
    pub node_selector: NodeSelector,

    /// Toleration for probe pods, key[=value]:Effect (repeatable or comma-separated).
    /// Nodes with untolerated NoSchedule/NoExecute taints are skipped.
    #[arg(long, env = "FIRSTPACKET_TOLERATION", value_delimiter = ',')]
    pub toleration: Vec<TolerationSpec>,

    /// imagePullSecret for probe pods (repeatable).
    #[arg(long, env = "FIRSTPACKET_IMAGE_PULL_SECRET", value_delimiter = ',')]
    pub image_pull_secret: Vec<String>,

    /// priorityClassName for probe pods.
    #[arg(long, env = "FIRSTPACKET_PRIORITY_CLASS")]
    pub priority_class: Option<String>,

    /// Probes (pod pairs) in flight at once.
    #[arg(long, env = "FIRSTPACKET_CONCURRENCY", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,

    /// Probe kinds, comma-separated: cross_node, same_node (control pair on one
    /// node), recreate (stable-name target deleted and recreated on its node), burst
    /// (target created among --burst-size filler pods), service (through a per-probe
    /// ClusterIP Service selecting only the fresh target: the source dials
    /// CLUSTER-IP:80), unprobed (as cross_node with a target without a readiness
    /// probe: on a CNI that gates readiness, as Calico does, the target's programming
    /// delay then shows in TTFP, as an application without a readiness probe meets it),
    /// policy (a new pod under an existing NetworkPolicy, with an intruder pod checking
    /// isolation), policy_change (a NetworkPolicy created over running pods, then
    /// deleted). API writes per probe: 4 for cross_node, same_node and unprobed, 6 for
    /// recreate and service, 4 + 2 × --burst-size for burst, 10 for policy, 8 for
    /// policy_change.
    #[arg(
        long,
        env = "FIRSTPACKET_KINDS",
        value_delimiter = ',',
        default_value = "cross_node"
    )]
    pub kinds: Vec<ProbeKind>,

    /// `policy` probes: how long the intruder (a fresh pod that no policy admits)
    /// dials the isolated target from its own first instant; any answer fails the
    /// probe as an `isolation_breach`. Runs beside the source, so it adds to a probe's
    /// time only when longer than the source's run.
    #[arg(long, env = "FIRSTPACKET_ISOLATION_WINDOW", default_value = "5s", value_parser = parse_duration)]
    pub isolation_window: Duration,

    /// Transport protocols each pod-to-pod probe measures, comma-separated: tcp (a fresh
    /// connection and HTTP exchange per attempt), udp (a datagram and its answer per
    /// attempt, from a fresh socket). Every path is dialed by the same source pod, on
    /// its clock, from its first instant: no extra pod or API write, one more attempt
    /// per --dial-interval per path. `service` and the policy kinds measure tcp only.
    #[arg(long, env = "FIRSTPACKET_PROTOCOLS", value_delimiter = ',', default_value = "tcp",
          value_parser = str::parse::<firstpacket_report::PathProtocol>)]
    pub protocols: Vec<firstpacket_report::PathProtocol>,

    /// What each attempt carries: small (a few hundred bytes), or mtu (small attempts
    /// plus, on each protocol, attempts exchanging packets of the pod interface's full
    /// MTU with Don't Fragment set each way). An mtu path that never passes while small
    /// packets do fails with reason mtu_black_hole (full-size packets dropped without
    /// the ICMP that would let senders adapt: an encapsulation change, a lower underlay
    /// MTU).
    #[arg(long, env = "FIRSTPACKET_PAYLOAD", default_value = "small",
          value_parser = str::parse::<firstpacket_report::Payload>)]
    pub payload: firstpacket_report::Payload,

    /// IP families each pod-to-pod probe measures, comma-separated (ipv4, ipv6); by
    /// default the target pod's primary one (its first status.podIPs). On dual-stack
    /// clusters each family is measured separately; a family the target pod has no
    /// address of is inconclusive (reason family_missing), never guessed.
    #[arg(long, env = "FIRSTPACKET_IP_FAMILIES", value_delimiter = ',',
          value_parser = str::parse::<firstpacket_report::IpFamily>)]
    pub ip_families: Vec<firstpacket_report::IpFamily>,

    /// Filler pods created on the target's node together with a `burst` probe's target.
    #[arg(long, env = "FIRSTPACKET_BURST_SIZE", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(0..=200))]
    pub burst_size: u32,

    /// Source attempt spacing (a new connection every interval; attempts overlap).
    #[arg(long, env = "FIRSTPACKET_DIAL_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub dial_interval: Duration,

    /// Per-attempt timeout (below the first SYN retransmit, 1 s).
    #[arg(long, env = "FIRSTPACKET_ATTEMPT_TIMEOUT", default_value = "900ms", value_parser = parse_duration)]
    pub attempt_timeout: Duration,

    /// Give up on a pod becoming Ready / on the first success after this long.
    #[arg(long, env = "FIRSTPACKET_GIVE_UP", default_value = "60s", value_parser = parse_duration)]
    pub give_up: Duration,

    /// Keep dialing this long after the first success [default: 5s gate, 30s run].
    #[arg(long, env = "FIRSTPACKET_HOLD", value_parser = parse_duration)]
    pub hold: Option<Duration>,

    /// TTFP above this is `slow`.
    #[arg(long, env = "FIRSTPACKET_SLOW_THRESHOLD", default_value = "5s", value_parser = parse_duration)]
    pub slow_threshold: Duration,

    /// Node label(s) to group the per-node table by (repeatable or comma-separated).
    #[arg(long, env = "FIRSTPACKET_GROUP_BY_LABEL", value_delimiter = ',')]
    pub group_by_label: Vec<String>,

    /// How to scrape node agents' metrics (docs/design.md §3): direct = GET
    /// http://HOST-IP:PORT/metrics (needs the pod network, e.g. in-cluster); proxy =
    /// through the API server's pod proxy (/api/v1/namespaces/NS/pods/NAME:PORT/proxy/metrics);
    /// auto = direct first and, per node and agent profile, the proxy once the direct path
    /// fails (remembered for the rest of the run).
    #[arg(
        long,
        env = "FIRSTPACKET_AGENT_SCRAPE",
        value_enum,
        default_value = "auto"
    )]
    pub agent_scrape: AgentScrape,

    /// Node-agent profiles file (YAML or JSON: `profiles:` adds or replaces, `disable:`
    /// drops the built-in calico-felix, cilium-agent, kube-proxy and aws-node profiles;
    /// schema in docs/agent-config.md and prober/src/agents/profiles.rs; the book's
    /// chapter docs/src/node-agents.md). Without it the built-ins are used.
    #[arg(long, env = "FIRSTPACKET_AGENT_CONFIG")]
    pub agent_config: Option<std::path::PathBuf>,

    /// Log format on stderr: plain lines (progress, notices, warnings), or one JSON
    /// object per line for everything on stderr (seed, progress, notices, errors, info
    /// events). Filter with RUST_LOG (e.g. `RUST_LOG=info` for plain info events).
    /// stdout keeps the human result table either way.
    #[arg(
        long,
        env = "FIRSTPACKET_LOG_FORMAT",
        value_enum,
        default_value = "plain"
    )]
    pub log_format: LogFormat,

    /// Test hook, hidden from --help: probe containers run `privileged`, so the pod spec
    /// violates Pod Security `baseline` and `restricted` (tests provoke an admission
    /// rejection with it). Never for real use.
    #[arg(
        long,
        env = "FIRSTPACKET_UNSAFE_PROBE_POD_PRIVILEGED",
        hide = true,
        hide_env = true
    )]
    pub unsafe_probe_pod_privileged: bool,
}

/// `prober gate` flags.
#[derive(Debug, Clone, Args)]
pub struct GateArgs {
    /// Shared probe flags.
    #[command(flatten)]
    pub probe: ProbeArgs,

    /// Probes per kind: N probes of each kind in --kinds (--kinds a,b → 2N probes)
    /// [default: one per eligible node, per kind].
    #[arg(long, env = "FIRSTPACKET_PAIRS", value_parser = clap::value_parser!(u32).range(1..))]
    pub pairs: Option<u32>,

    /// Seed of the node shuffle [default: random, printed so a run can be repeated].
    #[arg(long, env = "FIRSTPACKET_SEED")]
    pub seed: Option<u64>,

    /// Fail when the TTFP p95 of conclusive probes, or the p95 of their pods' programming
    /// waits (a new pod's own path to its node, before Ready: where a CNI that gates
    /// readiness puts the delay), exceeds this.
    #[arg(long, env = "FIRSTPACKET_MAX_TTFP", default_value = "5s", value_parser = parse_duration)]
    pub max_ttfp: Duration,

    /// Fail when more probes than this are `failed`.
    #[arg(long, env = "FIRSTPACKET_MAX_FAILURES", default_value_t = 0)]
    pub max_failures: u64,

    /// Inconclusive (exit 2) when more probes than this are `inconclusive`.
    #[arg(long, env = "FIRSTPACKET_MAX_INCONCLUSIVE", default_value_t = 0)]
    pub max_inconclusive: u64,

    /// Stop the whole run after this long (running probes become `interrupted`).
    #[arg(long, env = "FIRSTPACKET_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,

    /// Write the JSON report (schema 1) here. Also written when the run fails at
    /// start-up (API unreachable, RBAC forbids a list, …): verdict inconclusive, exit
    /// code 2, the cause in errors[], no probes. `-` prints it to stdout between the
    /// lines `===== BEGIN firstpacket report.json =====` and `===== END firstpacket
    /// report.json =====` (for a gate run as a Job: the report stays in the pod's log).
    #[arg(long, env = "FIRSTPACKET_REPORT")]
    pub report: Option<PathBuf>,

    /// Write a JUnit XML file: one testsuite, a testcase per kind, per node and one
    /// for the baseline comparison; failures carry the suspects and numbers.
    #[arg(long, env = "FIRSTPACKET_JUNIT")]
    pub junit: Option<PathBuf>,

    /// Store this run's TTFP p50/p90/p95 and sample count per kind and per node (and
    /// the thresholds used) here, as JSON, for a later `--baseline`.
    #[arg(long, env = "FIRSTPACKET_SAVE_BASELINE")]
    pub save_baseline: Option<PathBuf>,

    /// Compare with a baseline saved by `--save-baseline` (like for like: the kinds both
    /// have, the same --baseline-quantile on both sides, per kind and per node): a
    /// regression (ratio ≥ --drift-ratio and difference > --drift-floor) fails the gate.
    #[arg(long, env = "FIRSTPACKET_BASELINE")]
    pub baseline: Option<PathBuf>,

    /// The quantile `--baseline` compares: p50, p90 or p95 (the quantile --max-ttfp
    /// judges).
    #[arg(long, env = "FIRSTPACKET_BASELINE_QUANTILE", default_value = "p95",
          value_parser = ["p50", "p90", "p95"])]
    pub baseline_quantile: String,

    /// Drift thresholds (the comparison with --baseline).
    #[command(flatten)]
    pub drift: DriftArgs,

    /// Print the planned pairs and pod specs, write nothing, exit 0.
    #[arg(long, env = "FIRSTPACKET_DRY_RUN")]
    pub dry_run: bool,
}

/// `prober run` flags (continuous mode).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Shared probe flags.
    #[command(flatten)]
    pub probe: ProbeArgs,

    /// Time between probe starts (jittered by ±20 %). A lap (every eligible node source
    /// and target once) takes about nodes × this, while --concurrency keeps up.
    #[arg(long, env = "FIRSTPACKET_PROBE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub probe_interval: Duration,

    /// Take part in leader election on a coordination.k8s.io/v1 Lease in --namespace:
    /// only the replica holding it probes; the others stand by (serving /livez, /readyz,
    /// /metrics without probe series, and a status page naming the leader).
    #[arg(long, env = "FIRSTPACKET_LEADER_ELECT")]
    pub leader_elect: bool,

    /// Name of the leader Lease (in --namespace; a DNS-1123 subdomain: lower-case
    /// letters, digits, '-' and '.', at most 253 characters). Every replica must use the
    /// same name.
    #[arg(long, env = "FIRSTPACKET_LEADER_ELECT_LEASE_NAME", default_value = DEFAULT_LEASE_NAME, value_parser = parse_dns_subdomain)]
    pub leader_elect_lease_name: String,

    /// How long a standby waits without seeing the leader Lease change before it takes
    /// over (whole seconds; written into the Lease as leaseDurationSeconds, and a
    /// standby goes by the value the leader wrote; kube-controller-manager's default).
    #[arg(long, env = "FIRSTPACKET_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader retries a failing renewal before it steps down (stops
    /// probing); less than the lease duration.
    #[arg(long, env = "FIRSTPACKET_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// Time between leader-election attempts (renewals, and a standby's tries); the
    /// renew deadline must exceed 1.2 × this.
    #[arg(long, env = "FIRSTPACKET_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// Admin HTTP server address (/metrics, /livez, /readyz, /api/v1/probes, /).
    #[arg(long, env = "FIRSTPACKET_ADMIN_ADDR", default_value = "0.0.0.0:9090")]
    pub admin_addr: String,

    /// Drift thresholds.
    #[command(flatten)]
    pub drift: DriftArgs,

    /// How far back the learned baseline reaches, before the recent window. 24h: a
    /// day of probes (≈ 2 880 at the default interval) spans the cluster's daily load
    /// cycle, and a slow creep still shows against yesterday.
    #[arg(long, env = "FIRSTPACKET_BASELINE_WINDOW", default_value = "24h", value_parser = parse_duration)]
    pub baseline_window: Duration,

    /// The recent window whose median is compared with the baseline (excluded from the
    /// baseline). 10m: ≈ 20 probes at the default 30 s interval, enough for a median
    /// one odd probe cannot move, short enough that a shift shows within minutes.
    #[arg(long, env = "FIRSTPACKET_RECENT_WINDOW", default_value = "10m", value_parser = parse_duration)]
    pub recent_window: Duration,

    /// A static baseline TTFP instead of the learned one (drift is reported from the
    /// first probes; quantile gauges all show it).
    #[arg(long, env = "FIRSTPACKET_BASELINE_TTFP", value_parser = parse_duration)]
    pub baseline_ttfp: Option<Duration>,

    /// ConfigMap in --namespace that keeps the learned baseline across restarts and
    /// leader changes (read at each leadership term's start, written by the leader).
    #[arg(long, env = "FIRSTPACKET_BASELINE_CONFIGMAP", default_value = "firstpacket-baseline", value_parser = parse_dns_subdomain)]
    pub baseline_configmap: String,

    /// How often the leader writes the baseline ConfigMap when it learned something
    /// (plus once at shutdown). 5m: at most 12 writes an hour; a restart loses at most
    /// this much learning.
    #[arg(long, env = "FIRSTPACKET_BASELINE_SAVE_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub baseline_save_interval: Duration,
}

/// Drift thresholds, shared by `prober run` (the learned baseline) and `prober gate`
/// (the comparison with `--baseline`).
#[derive(Debug, Clone, Args)]
pub struct DriftArgs {
    /// Drift when the ratio reaches this (and --drift-floor holds). `run`: recent median
    /// / max(baseline median, --dial-interval); `gate --baseline`: this run's
    /// --baseline-quantile (p95 by default) / max(the saved one, --dial-interval), per
    /// kind and per node. 1.5: healthy medians of 20 probes move well under ±30 %
    /// between windows, while the shifts worth a look (an agent upgrade adding 1–3 s)
    /// are ×2 and more.
    #[arg(long, env = "FIRSTPACKET_DRIFT_RATIO", default_value_t = 1.5,
          value_parser = parse_ratio)]
    pub drift_ratio: f64,

    /// …and the difference exceeds this (`run`: recent median − baseline median; `gate
    /// --baseline`: the two --baseline-quantile values). 500ms: on a healthy cluster
    /// (medians near 0 s on the testbed, 0.2–0.6 s on fast real ones) the ratio alone
    /// fires on noise; half a second is what an application starting at Ready notices.
    #[arg(long, env = "FIRSTPACKET_DRIFT_FLOOR", default_value = "500ms", value_parser = parse_duration)]
    pub drift_floor: Duration,

    /// Baseline samples needed before drift is reported (run), or below which a saved
    /// baseline is compared with a warning (gate). 20: the median of 20 samples is
    /// within the 30th–70th percentile with 95 % confidence.
    #[arg(long, env = "FIRSTPACKET_BASELINE_MIN_SAMPLES", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub baseline_min_samples: u64,
}

/// Parses a ratio > 1 (`1.5`). Errors: not a number, or ≤ 1 (every median would drift).
pub fn parse_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("'{s}': {e}"))?;
    if !v.is_finite() || v <= 1.0 {
        return Err(format!("'{s}': must be a number above 1"));
    }
    Ok(v)
}

/// Default `--hold` for the gate (docs/design.md §2 step 7).
pub const GATE_DEFAULT_HOLD: Duration = Duration::from_secs(5);

/// Checks `--kinds`: duplicates removed (first occurrence kept), an empty list rejected
/// ([`crate::Error::Config`]).
pub fn check_kinds(kinds: &[ProbeKind]) -> Result<Vec<ProbeKind>, crate::Error> {
    let mut out: Vec<ProbeKind> = Vec::new();
    for k in kinds {
        if !out.contains(k) {
            out.push(*k);
        }
    }
    if out.is_empty() {
        return Err(crate::Error::Config {
            flag: "--kinds",
            message: "no probe kind given".into(),
        });
    }
    Ok(out)
}

impl ProbeArgs {
    /// `--hold`, or `default` when not given.
    pub fn hold_or(&self, default: Duration) -> Duration {
        self.hold.unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn gate(args: &[&str]) -> Result<GateArgs, clap::Error> {
        let mut argv = vec!["prober", "gate"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv)?;
        match cli.command {
            Command::Gate(g) => Ok(g),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn lease_names_follow_the_dns_subdomain_rule() {
        for ok in ["firstpacket-leader", "a", "a.b-c.9", &"a".repeat(253)] {
            assert_eq!(parse_dns_subdomain(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "",
            "Bad_Name!",
            "UPPER",
            "a/b",
            "-a",
            "a-",
            "a..b",
            &"a".repeat(254),
        ] {
            let e = parse_dns_subdomain(bad).unwrap_err();
            assert!(e.contains("DNS-1123"), "{bad}: {e}");
        }
    }

    #[test]
    fn self_defeating_settings_are_warned_about() {
        let g = gate(&["--timeout", "15s", "--give-up", "300s"]).expect("parse");
        let w = crate::settings::questionable_gate_settings(&g);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, "--timeout");
        assert!(
            w[0].1.contains("shorter than --give-up + --hold (5m 5s)"),
            "{}",
            w[0].1
        );
        let g = gate(&["--attempt-timeout", "10s", "--give-up", "2s"]).expect("parse");
        let w = crate::settings::questionable_gate_settings(&g);
        assert_eq!(
            w.iter().map(|x| x.0).collect::<Vec<_>>(),
            ["--attempt-timeout"]
        );
        let g = gate(&["--slow-threshold", "10s", "--max-ttfp", "2s"]).expect("parse");
        let w = crate::settings::questionable_gate_settings(&g);
        assert_eq!(w.iter().map(|x| x.0).collect::<Vec<_>>(), ["--max-ttfp"]);
        assert!(
            w[0].1.contains("2s is below --slow-threshold (10s)"),
            "{}",
            w[0].1
        );
        let g = gate(&["--slow-threshold", "2s", "--max-ttfp", "2s"]).expect("parse");
        assert!(crate::settings::questionable_gate_settings(&g).is_empty());
        assert!(crate::settings::questionable_gate_settings(&gate(&[]).expect("parse")).is_empty());
    }

    #[test]
    fn run_defaults_follow_design() {
        let cli = Cli::try_parse_from(["prober", "run"]).expect("parse");
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.probe.concurrency, 2);
        assert_eq!(r.probe_interval, Duration::from_secs(30));
        assert_eq!(r.admin_addr, "0.0.0.0:9090");
        assert_eq!(
            r.probe.hold_or(crate::run_mode::RUN_DEFAULT_HOLD),
            Duration::from_secs(30)
        );
        let cli = Cli::try_parse_from([
            "prober",
            "run",
            "--concurrency",
            "5",
            "--probe-interval",
            "1.5s",
            "--kinds",
            "cross_node,same_node",
        ])
        .expect("parse");
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.probe.concurrency, 5);
        assert_eq!(r.probe_interval, Duration::from_millis(1500));
        assert_eq!(r.probe.kinds.len(), 2);
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("run")
            .expect("run")
            .render_long_help()
            .to_string();
        assert!(help.contains("FIRSTPACKET_PROBE_INTERVAL"), "{help}");
        assert!(help.contains("/api/v1/probes"), "{help}");
    }

    #[test]
    fn drift_flags_have_their_documented_defaults_and_reject_ratios_up_to_one() {
        let cli = Cli::try_parse_from(["prober", "run"]).expect("parse");
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.drift.drift_ratio, 1.5);
        assert_eq!(r.drift.drift_floor, Duration::from_millis(500));
        assert_eq!(r.drift.baseline_min_samples, 20);
        assert_eq!(r.baseline_window, Duration::from_secs(24 * 3600));
        assert_eq!(r.recent_window, Duration::from_secs(600));
        assert_eq!(r.baseline_save_interval, Duration::from_secs(300));
        assert_eq!(r.baseline_configmap, "firstpacket-baseline");
        assert!(r.baseline_ttfp.is_none());
        let g = gate(&["--baseline-quantile", "p50", "--drift-ratio", "2"]).expect("parse");
        assert_eq!(
            (g.baseline_quantile.as_str(), g.drift.drift_ratio),
            ("p50", 2.0)
        );
        assert_eq!(gate(&[]).expect("parse").baseline_quantile, "p95");
        assert!(gate(&["--drift-ratio", "1"]).is_err());
        assert!(gate(&["--drift-ratio", "x"]).is_err());
        assert!(gate(&["--baseline-quantile", "p99"]).is_err());
        assert!(gate(&["--baseline-min-samples", "0"]).is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_follow_design() {
        let g = gate(&[]).expect("parse");
        assert_eq!(g.probe.namespace, "firstpacket");
        assert_eq!(
            g.probe.image,
            format!(
                "ghcr.io/firstpacket/target-server:{}",
                env!("CARGO_PKG_VERSION")
            )
        );
        assert_eq!(g.probe.node_selector.to_string(), "kubernetes.io/os=linux");
        assert_eq!(g.probe.concurrency, 4);
        assert_eq!(g.probe.kinds, vec![ProbeKind::CrossNode]);
        assert_eq!(g.probe.dial_interval, Duration::from_millis(100));
        assert_eq!(g.probe.attempt_timeout, Duration::from_millis(900));
        assert_eq!(g.probe.give_up, Duration::from_secs(60));
        assert_eq!(g.probe.hold_or(GATE_DEFAULT_HOLD), Duration::from_secs(5));
        assert_eq!(g.probe.slow_threshold, Duration::from_secs(5));
        assert_eq!(g.max_ttfp, Duration::from_secs(5));
        assert_eq!((g.max_failures, g.max_inconclusive), (0, 0));
        assert_eq!(g.timeout, Duration::from_secs(600));
        assert!(g.pairs.is_none() && g.seed.is_none() && !g.dry_run);
    }

    #[test]
    fn flags_parse_fractional_durations_repeatable_tolerations_and_kinds() {
        let g = gate(&[
            "--hold",
            "1.5s",
            "--toleration",
            "a=b:NoSchedule",
            "--toleration",
            "c:NoExecute,d",
            "--kinds",
            "cross_node,same_node",
            "--group-by-label",
            "zone,rack",
            "--pairs",
            "7",
            "--seed",
            "99",
        ])
        .expect("parse");
        assert_eq!(g.probe.hold, Some(Duration::from_millis(1500)));
        assert_eq!(g.probe.toleration.len(), 3);
        assert_eq!(
            g.probe.kinds,
            vec![ProbeKind::CrossNode, ProbeKind::SameNode]
        );
        assert_eq!(g.probe.group_by_label, vec!["zone", "rack"]);
        assert_eq!((g.pairs, g.seed), (Some(7), Some(99)));
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(gate(&["--toleration", "k:Never"]).is_err());
        // Keys and values as Kubernetes validates them (IsQualifiedName, label values).
        assert!(gate(&["--toleration", "dedicated web:NoSchedule"]).is_err());
        assert!(gate(&["--toleration", "-k"]).is_err());
        assert!(gate(&["--toleration", "Example.COM/k"]).is_err());
        assert!(gate(&["--toleration", "k=a b"]).is_err());
        assert!(gate(&["--toleration", "example.com/k=v_1:NoExecute"]).is_ok());
        assert!(gate(&["--give-up", "soon"]).is_err());
        assert!(gate(&["--kinds", "mesh"]).is_err());
        assert!(gate(&["--concurrency", "0"]).is_err());
        assert!(gate(&["--node-selector", "env in (a)"]).is_err());
    }

    #[test]
    fn kinds_are_deduplicated_and_service_is_accepted() {
        let g = gate(&["--kinds", "same_node,cross_node,same_node,burst"]).expect("parse");
        assert_eq!(
            check_kinds(&g.probe.kinds).expect("ok"),
            vec![ProbeKind::SameNode, ProbeKind::CrossNode, ProbeKind::Burst]
        );
        assert_eq!(g.probe.burst_size, 10);
        let g = gate(&["--kinds", "cross_node,service"]).expect("parse");
        assert_eq!(
            check_kinds(&g.probe.kinds).expect("service accepted"),
            vec![ProbeKind::CrossNode, ProbeKind::Service]
        );
        assert!(check_kinds(&[]).is_err());
        assert!(gate(&["--burst-size", "1000"]).is_err());
    }

    #[test]
    fn help_explains_ttfp_and_exit_codes() {
        let mut cmd = Cli::command();
        let gate = cmd.find_subcommand_mut("gate").expect("gate");
        let help = gate.render_long_help().to_string();
        assert!(help.contains("TTFP"));
        assert!(help.contains("Exit codes"));
        assert!(help.contains("FIRSTPACKET_MAX_TTFP"));
    }

    /// Findings of a new-user test: the help must say what the flags really do.
    #[test]
    fn gate_help_describes_agent_scrape_fallback_pairs_per_kind_and_correlation() {
        let mut cmd = Cli::command();
        let gate = cmd.find_subcommand_mut("gate").expect("gate");
        // Collapse clap's line wrapping so phrases can be matched.
        let help = gate
            .render_long_help()
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(!help.contains("in-cluster, else proxy"), "{help}");
        assert!(help.contains("per node and agent profile"), "{help}");
        assert!(
            help.contains("remembered for the rest of the run"),
            "{help}"
        );
        assert!(help.contains("Probes per kind"), "{help}");
        assert!(help.contains("2N probes"), "{help}");
        assert!(help.contains("prober/src/agents/profiles.rs"), "{help}");
        assert!(help.contains("docs/src/node-agents.md"), "{help}");
        assert!(!help.contains("prober::agents::profiles"), "{help}");
        assert!(help.contains("Node-agent correlation"), "{help}");
        assert!(help.contains("suspects on slow/failed probes"), "{help}");
        assert!(help.contains("never fails the gate"), "{help}");
    }

    #[test]
    fn agent_scrape_modes_have_report_strings() {
        assert_eq!(AgentScrape::Auto.as_str(), "auto");
        assert_eq!(AgentScrape::Direct.as_str(), "direct");
        assert_eq!(AgentScrape::Proxy.as_str(), "proxy");
    }
}
