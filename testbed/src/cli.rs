//! The `testbed` command line (docs/design.md §6 "testbed CLI"; binding).
//!
//! Every subcommand takes `--state-dir DIR` (env `TESTBED_STATE_DIR`, default
//! `/tmp/firstpacket-testbed`). Names and subnets derive from that directory, so two
//! testbeds with different state dirs coexist.

use crate::daemon::{self, DaemonArgs, ReadyInfo};
use crate::dataplane::Dataplane;
use crate::plan::Plan;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/tmp/firstpacket-testbed";

#[derive(Parser, Debug)]
#[command(
    name = "testbed",
    version,
    about = "A small real Kubernetes-like cluster on this machine, for firstpacket",
    long_about = "A small real Kubernetes-like cluster on this machine: an API server real \
kubectl and kube-rs accept, a scheduler, a kubelet per node, and a Calico-like CNI \
dataplane, with every node and pod in its own network namespace; or, with `up \
--control-plane real`, the real Kubernetes control plane, and with `--agent calico \
--kube-proxy real` real Calico Felix and real kube-proxy on the nodes. Probe pods run the real \
binaries; packets, routes and nftables rules are real. Faults (docs/design.md §6) shape when \
new endpoints get programmed; `testbed truth` prints what really happened and when.\n\n\
Needs root (network namespaces, nftables). Touches nothing outside the namespaces it \
creates.\n\nQuick start:\n  testbed up --nodes 3\n  testbed exec -- kubectl get pods -A -o wide\n  \
testbed exec -- prober gate\n  testbed down"
)]
pub struct Cli {
    /// State directory (plan, logs, kubeconfigs, truth log).
    #[arg(long, global = true, env = "TESTBED_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Build the cluster and return once every node is Ready.
    Up(UpArgs),
    /// Stop the cluster and remove everything it made (idempotent).
    Down,
    /// Run a command in the host network namespace, where the API server and the pod
    /// network are reachable, with KUBECONFIG set (e.g. `testbed exec -- kubectl get no`).
    Exec {
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
    /// Print the ground-truth log (JSON lines, docs/design.md §6).
    Truth,
    /// Node operations: `cordon|uncordon NODE` (spec.unschedulable, as kubectl does),
    /// `stop|start NODE` (kubelet stopped: node Ready=Unknown, unreachable taints, its
    /// pods unready; start undoes it).
    Node {
        #[arg(value_parser = ["cordon", "uncordon", "stop", "start"])]
        action: String,
        node: String,
    },
    /// Node-agent operations: `agent roll NODE --image IMAGE` replaces NODE's
    /// calico-node pod as a DaemonSet rollout does (old pod deleted gracefully and
    /// gone, a new pod with a new name and UID and IMAGE created on NODE, the agent
    /// restarted: its Felix metrics start again, `process_start_time_seconds` moves);
    /// returns once the new pod is Running and Ready; the truth log records
    /// `agent_rolled`. Other nodes' agent pods are not touched. `agent roll --all
    /// --image IMAGE [--interval D]` rolls every node in turn, waiting D between nodes
    /// (a DaemonSet's rolling update with maxUnavailable 1). With real Felix (`up
    /// --agent calico`) the image tag's version (`…/calico/node:v3.29.5`) selects the
    /// Felix build the new pod runs (a version `scripts/calico.sh` has not built is
    /// refused before anything changes) and the first roll to a version applies its
    /// CRDs.
    Agent {
        #[arg(value_parser = ["roll"])]
        action: String,
        /// The node to roll (or `--all`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        node: Option<String>,
        /// Roll every node, one after another.
        #[arg(long)]
        all: bool,
        /// With `--all`: wait this long after a node's new pod is Ready before rolling
        /// the next (humantime, default 0s).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s", requires = "all")]
        interval: Duration,
        /// The new pod's container image (e.g. `docker.io/calico/node:v3.29.5`; with real
        /// Felix its tag must name a version `scripts/calico.sh` built).
        #[arg(long)]
        image: String,
        /// How long the agent is down (humantime, e.g. `15s`; default 0): from before
        /// the old pod's deletion until this long after it, the node programs no new
        /// endpoint (its new pods stay dark, as during a real CNI agent restart) and
        /// the agent pod is not Ready. With real Felix: Felix is stopped that long.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        down: Duration,
    },
    /// Fault operations: `fault set FILE` applies a fault file at once.
    Fault {
        #[arg(value_parser = ["set"])]
        action: String,
        file: PathBuf,
    },
    /// API server operations: `deny VERB RESOURCE [-n NAMESPACE]` (answer 403 like
    /// missing RBAC; VERB one of get, list, watch, create, update, patch, delete,
    /// deletecollection or `*`; RESOURCE a plural like `pods`, a subresource like
    /// `pods/proxy`, or `*`; without -n everywhere; the testbed's own kubelets and service
    /// proxies are spared unless `--nodes-too` comes last), `allow VERB RESOURCE [-n NAMESPACE]`
    /// / `allow all` (undo),
    /// `expire-watches` (the next watch resume gets 410 Gone), `restart`, `stop` (every
    /// API connection refused; nodes, kubelets and pods keep running) and `start`.
    /// RESOURCE is checked as RBAC names resources (`pod` → use `pods`). On the real
    /// control plane deny/allow go through the authorization webhook, restart/stop/start
    /// act on kube-apiserver (etcd keeps the data) and expire-watches compacts etcd and
    /// restarts kube-apiserver.
    Api {
        #[arg(value_parser = ["restart", "deny", "allow", "expire-watches", "stop", "start"])]
        action: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
    /// The problem firstpacket exists for, in under a minute: a gate on a healthy 4-node
    /// cluster, then on one whose node-2 and node-3 are stuck in a dataplane apply loop
    /// (S2), beside a long-lived mesh that stays green; or, with `--fault FILE|SCENARIO`,
    /// one gate on that fault. Tears the testbed down in every case.
    Demo(crate::demo::DemoArgs),
    /// (internal) the CNI plugin a container runtime calls for each pod sandbox: reads
    /// `CNI_COMMAND` (ADD, DEL, CHECK, VERSION) and the other CNI variables and the
    /// network configuration on stdin (with `"testbed": {"socket": "STATE/cni.sock",
    /// "node": "node-1"}`), has the daemon wire the sandbox as the simulated kubelet's
    /// are, prints the CNI result or error on stdout (exit 1 on error). The binary run
    /// without arguments and with `CNI_COMMAND` set does the same. See `testbed::cni`.
    #[command(hide = true)]
    Cni,
    /// (internal) the daemon `up` starts.
    #[command(hide = true)]
    Daemon(UpArgs),
    /// (internal) container entry: join the pod's namespaces and exec the binary.
    #[command(hide = true)]
    Shim {
        #[arg(long)]
        netns: String,
        #[arg(long)]
        dev_dir: PathBuf,
        #[arg(long)]
        hostname: String,
        #[arg(long)]
        sa_dir: Option<PathBuf>,
        /// Container user id (`securityContext.runAsUser`).
        #[arg(long, default_value_t = 0)]
        uid: u32,
        /// Container group id (`securityContext.runAsGroup`).
        #[arg(long, default_value_t = 0)]
        gid: u32,
        /// Supplementary groups, comma-separated.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
        /// Capabilities kept, as a hex bit mask (bit N = capability N); default: the
        /// container runtime's default set.
        #[arg(long, value_parser = parse_hex_caps)]
        caps: Option<u64>,
        /// Set `no_new_privs` (`allowPrivilegeEscalation: false`).
        #[arg(long)]
        no_new_privs: bool,
        /// `readOnlyRootFilesystem: true`: every mount read-only except /dev.
        #[arg(long)]
        read_only_root: bool,
        /// Fault `clock_skew`: offset the container's monotonic and boot-time clocks by
        /// this many seconds (signed) in a time namespace of its own.
        #[arg(long, allow_hyphen_values = true)]
        clock_offset: Option<f64>,
        /// An OCI image's unpacked root file system to `chroot` into (the program is a
        /// path inside it).
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// An inherited fd the shim marks close-on-exec and writes the wall time of its
        /// `execve` to, so whoever holds its pipe's other end learns when the
        /// container's binary was exec'ed (and sees EOF then).
        #[arg(long)]
        exec_fd: Option<i32>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    /// Number of nodes (`node-1` … `node-N`).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Fault file applied from the start (docs/design.md §6 grammar).
    #[arg(long)]
    pub fault: Option<PathBuf>,
    /// Extra node labels: `NODE=KEY=VALUE`, comma-separated and/or repeated,
    /// e.g. `node-2=os=debian13,node-3=os=debian13`.
    #[arg(long, value_delimiter = ',')]
    pub node_labels: Vec<String>,
    /// Make each node's `kubernetes.io/hostname` label differ from its name, as
    /// `kubelet --hostname-override` or a cloud provider does: the label is
    /// `NODE` + SUFFIX (e.g. `--hostname-label-suffix .ec2.internal` → `node-1.ec2.internal`).
    /// A `--node-labels NODE=kubernetes.io/hostname=…` item wins for its node.
    #[arg(long, value_name = "SUFFIX")]
    pub hostname_label_suffix: Option<String>,
    /// Directory with the image binaries (`target-server`, `prober`); default: the
    /// directory of this executable.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Directory of OCI images (image layouts, as `bash scripts/image.sh` writes them);
    /// a pod's image found there runs before any bin-dir binary (docs/design.md §6
    /// pod-spec contract). Default: `images` beside the bin dir (`target/images` for
    /// `target/debug`, where the script writes); a missing directory holds no images.
    #[arg(long, env = "TESTBED_IMAGE_DIR")]
    pub image_dir: Option<PathBuf>,
    /// Where each node's kube-proxy serves its metrics (port 10249): `all` = every
    /// address of the node (reachable at NODE_IP:10249, as clusters that scrape
    /// kube-proxy configure it), `localhost` = 127.0.0.1 only (kube-proxy's own default
    /// `metricsBindAddress`, unreachable from off the node), `none` = no kube-proxy pods
    /// (with `--kube-proxy real` the process still runs, metrics on 127.0.0.1).
    #[arg(long, value_enum, default_value_t = crate::kube_proxy::MetricsBind::All)]
    pub kube_proxy_metrics: crate::kube_proxy::MetricsBind,
    /// How long to wait for every node to be Ready (humantime: `90s`, `2m`; default
    /// 90 s, 300 s with `--control-plane real`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Which control plane runs: `builtin` (the testbed's own API server, scheduler and
    /// controllers; starts in milliseconds) or `real` (etcd, kube-apiserver,
    /// kube-controller-manager, kube-scheduler built by `bash scripts/control-plane.sh`,
    /// in the host network namespace; see testbed/ARCHITECTURE.md).
    #[arg(long, value_enum, env = crate::control_plane::MODE_ENV, default_value_t = crate::control_plane::Mode::Builtin)]
    pub control_plane: crate::control_plane::Mode,
    /// Directory with the real control plane's binaries (default: the one
    /// `scripts/control-plane.sh --print` names).
    #[arg(long, env = crate::control_plane::BIN_ENV)]
    pub control_plane_bin: Option<PathBuf>,
    /// Hollow nodes (`hollow-1` … `hollow-M`, label `testbed.firstpacket.io/hollow=true`):
    /// Nodes that exist only in the API, with fresh heartbeats, served agent metrics
    /// and synthetic probe pods (testbed/src/hollow.rs). At most 2000.
    #[arg(long, env = "TESTBED_HOLLOW_NODES", default_value_t = 0)]
    pub hollow_nodes: usize,
    /// TTFP of probe pods on hollow nodes: from the source's Ready to its first success
    /// (humantime; default 500ms).
    #[arg(long, env = "TESTBED_HOLLOW_TTFP", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub hollow_ttfp: Duration,
    /// How hollow nodes' agents answer scrapes that do not come through the API
    /// server's pod proxy: `serve`, or `hold` (never answered: direct scrapes time out).
    #[arg(long, env = "TESTBED_HOLLOW_DIRECT_SCRAPES", default_value = "serve")]
    pub hollow_direct_scrapes: crate::hollow::DirectScrapes,
    /// The CNI agent on every node: `sim` (the testbed's own, programmed by the fault
    /// file's `program_delay` & co.) or `calico[:VERSION]` (real Calico Felix, default
    /// version v3.31.7, built by `scripts/calico.sh`; needs `--control-plane real`;
    /// faults `agent_io`, `agent_cpu`, `agent_pause`, `agent.restarts`, `policies`,
    /// `agent_version` act on it).
    #[arg(long, env = crate::calico::AGENT_ENV, default_value = "sim", value_parser = parse_agent)]
    pub agent: crate::calico::AgentChoice,
    /// The service proxy on every node: `sim` (the testbed's own; fault
    /// `service_delay`) or `real` (real kube-proxy in nftables mode, built by
    /// `scripts/control-plane.sh`; needs `--control-plane real`).
    #[arg(long, env = crate::kube_proxy_real::KUBE_PROXY_ENV, value_enum, default_value_t = crate::kube_proxy_real::ProxyChoice::Sim)]
    pub kube_proxy: crate::kube_proxy_real::ProxyChoice,
    /// The kubelet and container runtime on every node: `sim` (the testbed's own; pods
    /// are processes in network namespaces) or `real` (per node a real kubelet of the
    /// control plane's version, built by `scripts/control-plane.sh`, and containerd
    /// with runc from `scripts/setup.sh`; pods run the OCI images of `--image-dir`,
    /// built by `scripts/image.sh`, and get their network from `testbed cni`; needs
    /// `--control-plane real`).
    #[arg(long, env = crate::realnode::KUBELET_ENV, value_enum, default_value_t = crate::realnode::KubeletChoice::Sim)]
    pub kubelet: crate::realnode::KubeletChoice,
    /// IP families of the nodes and pods, comma-separated: `ipv4` (the default) or
    /// `ipv4,ipv6` (dual-stack, IPv4 primary: every node gets an IPv6 address and pod
    /// block beside its IPv4 ones and every pod an IPv6 address, second in
    /// `status.podIPs`; docs/src/testbed.md). IPv6 needs the simulated kubelet and
    /// kube-proxy and no hollow nodes; the agent may be the simulated one or real Felix
    /// (`--agent calico`, which then programs IPv6 too).
    #[arg(long, value_delimiter = ',', default_value = "ipv4")]
    pub ip_families: Vec<crate::plan::IpFamily>,
}

impl UpArgs {
    /// Whether `--ip-families` asks for a dual-stack testbed. Errors: a list that is
    /// not `ipv4` or `ipv4,ipv6` (IPv4 is always the primary family; IPv6-only
    /// testbeds do not exist), or IPv6 with a component that does not support it yet
    /// (`--kubelet real`, `--kube-proxy real`, `--hollow-nodes`). Real Felix
    /// (`--agent calico[:VERSION]`) is accepted: it runs with `ipv6Support`
    /// ([`crate::calico::datastore::felix_configuration`]).
    pub fn dual_stack(&self) -> Result<bool> {
        use crate::plan::IpFamily::{Ipv4, Ipv6};
        let ipv6 = match self.ip_families.as_slice() {
            [Ipv4] => false,
            [Ipv4, Ipv6] | [Ipv6, Ipv4] => true,
            other => bail!(
                "--ip-families {}: expected `ipv4` or `ipv4,ipv6` (IPv4 is always there and primary)",
                other
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        if ipv6 {
            let mut not_yet = Vec::new();
            if self.kubelet == crate::realnode::KubeletChoice::Real {
                not_yet.push("--kubelet real".to_owned());
            }
            if self.kube_proxy == crate::kube_proxy_real::ProxyChoice::Real {
                not_yet.push("--kube-proxy real".to_owned());
            }
            if self.hollow_nodes > 0 {
                not_yet.push("--hollow-nodes".to_owned());
            }
            if !not_yet.is_empty() {
                bail!(
                    "--ip-families ipv4,ipv6: IPv6 is not yet supported with {} (dual-stack \
                     testbeds run the simulated kubelet and kube-proxy, without hollow nodes, \
                     and the simulated agent or real Felix); drop it or use --ip-families ipv4",
                    not_yet.join(", ")
                );
            }
        }
        Ok(ipv6)
    }
}

fn parse_agent(s: &str) -> Result<crate::calico::AgentChoice, String> {
    s.parse()
}

/// Parses `NODE=KEY=VALUE` items into node → labels.
pub fn parse_node_labels(items: &[String]) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for item in items.iter().filter(|s| !s.trim().is_empty()) {
        let mut parts = item.trim().splitn(3, '=');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(n), Some(k), Some(v)) if !n.is_empty() && !k.is_empty() => {
                out.entry(n.to_owned())
                    .or_default()
                    .insert(k.to_owned(), v.to_owned());
            }
            _ => bail!("--node-labels: {item:?} is not NODE=KEY=VALUE (e.g. node-2=os=debian13)"),
        }
    }
    Ok(out)
}

/// Directory holding this executable (the default `--bin-dir`).
pub fn default_bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locate the testbed executable")?;
    Ok(exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

/// The default `--image-dir`: `images` beside the bin dir (`target/images` for
/// `target/debug`), where `bash scripts/image.sh` writes.
pub fn default_image_dir(bin_dir: &Path) -> PathBuf {
    bin_dir
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("images")
}

/// True while `pid` exists and is not a zombie (a daemon started by this very process,
/// as in `testbed demo`, stays a zombie until reaped, so it is reaped here).
fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    let p = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::wait::waitpid(p, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3, after the parenthesised command name, is the state.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn read_pid(state: &Path) -> Option<i32> {
    std::fs::read_to_string(state.join("daemon.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Reads `ready.json`, or explains that the testbed is not up.
pub fn ready_info(state: &Path) -> Result<ReadyInfo> {
    let p = state.join("ready.json");
    let text = std::fs::read_to_string(&p).map_err(|_| {
        anyhow!(
            "no running testbed in {} (run `testbed --state-dir {} up` first)",
            state.display(),
            state.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("parse {}", p.display()))
}

/// `testbed up`: starts the daemon and waits for Ready.
pub fn up(state: &Path, args: &UpArgs) -> Result<()> {
    up_with(state, args, true)
}

/// [`up`], printing the `kubectl` hint only with `hints` (the demo tears the cluster down
/// before anyone could use it).
pub fn up_with(state: &Path, args: &UpArgs, hints: bool) -> Result<()> {
    if args.nodes < 1 {
        bail!("--nodes must be at least 1");
    }
    let nodes: Vec<String> = (1..=args.nodes).map(|i| format!("node-{i}")).collect();
    if let Some(bad) = parse_node_labels(&args.node_labels)?
        .keys()
        .find(|n| !nodes.contains(n))
    {
        bail!(
            "--node-labels: node {bad:?} is not in this cluster (nodes: {})",
            nodes.join(", ")
        );
    }
    if let Some(sfx) = &args.hostname_label_suffix {
        for n in &nodes {
            check_label_value(&format!("{n}{sfx}"))
                .map_err(|e| anyhow!("--hostname-label-suffix {sfx:?}: {e}"))?;
        }
    }
    let ipv6 = args.dual_stack()?;
    let real_kubelet = args.kubelet == crate::realnode::KubeletChoice::Real;
    let real_components = args.agent != crate::calico::AgentChoice::Sim
        || args.kube_proxy == crate::kube_proxy_real::ProxyChoice::Real
        || real_kubelet;
    if real_components && args.control_plane != crate::control_plane::Mode::Real {
        let mut given = Vec::new();
        if args.agent != crate::calico::AgentChoice::Sim {
            given.push(format!("--agent {}", args.agent.as_arg()));
        }
        if args.kube_proxy == crate::kube_proxy_real::ProxyChoice::Real {
            given.push("--kube-proxy real".to_owned());
        }
        if real_kubelet {
            given.push("--kubelet real".to_owned());
        }
        bail!(
            "{} need{} the real control plane: add --control-plane real (or set {}=real)",
            given.join(" and "),
            if given.len() == 1 { "s" } else { "" },
            crate::control_plane::MODE_ENV
        );
    }
    let fault_file = match &args.fault {
        Some(f) => Some(crate::fault::FaultFile::load_checked(
            f,
            &nodes,
            args.agent.kind(),
            args.kube_proxy.kind(),
            args.kubelet.kind(),
            ipv6,
        )?),
        None => None,
    };
    if let Some(v) = args.agent.version() {
        // Every version the run needs is built, before anything starts.
        let builds = crate::calico::Builds::locate();
        builds.require(
            std::iter::once(v).chain(
                fault_file
                    .iter()
                    .flat_map(|f| f.agent_versions())
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str),
            ),
        )?;
    }
    std::fs::create_dir_all(state)
        .with_context(|| format!("create state dir {}", state.display()))?;
    let state = state.canonicalize()?;
    if let Some(pid) = read_pid(&state) {
        if pid_alive(pid) {
            bail!(
                "a testbed is already running in {} (daemon pid {pid}); run `testbed --state-dir {} down` first",
                state.display(),
                state.display()
            );
        }
    }
    // Leftovers of a crashed run with this state dir.
    if let Ok(plan) = Plan::load(&state) {
        crate::realnode::sweep(&state.join("nodes"), &plan.prefix);
        let _ = Dataplane::destroy(&plan);
    }
    let _ = std::fs::remove_file(state.join("ready.json"));
    let bin_dir = match &args.bin_dir {
        Some(b) => b.clone(),
        None => default_bin_dir()?,
    };
    for b in ["target-server", "prober"] {
        if !bin_dir.join(b).is_file() {
            eprintln!(
                "warning: {} has no `{b}` binary; pods with that image will fail with ErrImagePull",
                bin_dir.display()
            );
        }
    }
    let cp_bin = match args.control_plane {
        crate::control_plane::Mode::Builtin => None,
        crate::control_plane::Mode::Real => Some(crate::control_plane::locate_binaries(
            args.control_plane_bin.as_deref(),
        )?),
    };
    let log = std::fs::File::create(state.join("daemon.log"))?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--state-dir")
        .arg(&state)
        .arg("daemon")
        .arg("--nodes")
        .arg(args.nodes.to_string());
    if let Some(f) = &args.fault {
        cmd.arg("--fault").arg(f.canonicalize()?);
    }
    if !args.node_labels.is_empty() {
        cmd.arg("--node-labels").arg(args.node_labels.join(","));
    }
    if let Some(sfx) = &args.hostname_label_suffix {
        cmd.arg(format!("--hostname-label-suffix={sfx}"));
    }
    cmd.arg("--kube-proxy-metrics")
        .arg(args.kube_proxy_metrics.as_arg());
    cmd.arg("--control-plane").arg(args.control_plane.as_arg());
    if let Some(b) = &cp_bin {
        if args.kube_proxy == crate::kube_proxy_real::ProxyChoice::Real {
            crate::kube_proxy_real::locate(b)?;
        }
        cmd.arg("--control-plane-bin").arg(b);
    }
    cmd.arg("--agent").arg(args.agent.as_arg());
    cmd.arg("--kube-proxy").arg(args.kube_proxy.as_arg());
    cmd.arg("--kubelet").arg(args.kubelet.as_arg());
    if ipv6 {
        cmd.arg("--ip-families").arg("ipv4,ipv6");
    }
    if args.hollow_nodes > 0 {
        cmd.arg("--hollow-nodes")
            .arg(args.hollow_nodes.to_string())
            .arg("--hollow-ttfp")
            .arg(humantime::format_duration(args.hollow_ttfp).to_string())
            .arg("--hollow-direct-scrapes")
            .arg(match args.hollow_direct_scrapes {
                crate::hollow::DirectScrapes::Serve => "serve",
                crate::hollow::DirectScrapes::Hold => "hold",
            });
    }
    let image_dir = args
        .image_dir
        .clone()
        .unwrap_or_else(|| default_image_dir(&bin_dir));
    if real_kubelet {
        if let Some(b) = &cp_bin {
            crate::realnode::Binaries::locate(b, &std::env::current_exe()?)?;
        }
        crate::realnode::node_images(&image_dir)?;
    }
    cmd.arg("--image-dir")
        .arg(image_dir.canonicalize().unwrap_or(image_dir));
    cmd.arg("--bin-dir")
        .arg(bin_dir.canonicalize().unwrap_or(bin_dir));
    use std::os::unix::process::CommandExt;
    cmd.stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    let mut child = cmd.spawn().context("start the testbed daemon")?;
    let timeout = args.timeout.unwrap_or(match args.control_plane {
        crate::control_plane::Mode::Builtin => Duration::from_secs(90),
        crate::control_plane::Mode::Real => Duration::from_secs(300),
    });
    let start = Instant::now();
    eprint!(
        "testbed: starting {} node(s) in {} ",
        args.nodes,
        state.display()
    );
    loop {
        if let Ok(info) = ready_info(&state) {
            eprintln!(
                "\ntestbed: up in {:.1}s — nodes {}",
                start.elapsed().as_secs_f64(),
                info.nodes.join(", ")
            );
            if hints {
                eprintln!(
                    "  API (this machine): {}   kubeconfig: {}",
                    info.api_local,
                    info.kubeconfig.display()
                );
                eprintln!(
                    "  try: testbed --state-dir {} exec -- kubectl get nodes -o wide",
                    state.display()
                );
            }
            if info.control_plane == crate::control_plane::Mode::Real.as_arg() {
                eprintln!(
                    "  real control plane: logs and audit log in {}",
                    state.join("control-plane").display()
                );
            }
            if let Some(v) = info.agent.strip_prefix("calico:") {
                eprintln!(
                    "  node agent: real Calico Felix {v} on every node (logs in {}; kubectl -n kube-system logs -l k8s-app=calico-node)",
                    state.join("calico").display()
                );
            }
            if info.kube_proxy == "real" {
                eprintln!("  service proxy: real kube-proxy (nftables mode) on every node");
            }
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            eprintln!();
            let log = std::fs::read_to_string(state.join("daemon.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "the testbed daemon exited ({status}) before the cluster was Ready:\n{}",
                tail.join("\n")
            );
        }
        if start.elapsed() > timeout {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            bail!(
                "the cluster was not Ready within {:?}; see {}",
                timeout,
                state.join("daemon.log").display()
            );
        }
        eprint!(".");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `testbed down`: stops the daemon and removes everything; idempotent.
pub fn down(state: &Path) -> Result<()> {
    if !state.exists() {
        eprintln!(
            "testbed: nothing to do ({} does not exist)",
            state.display()
        );
        return Ok(());
    }
    if let Some(pid) = read_pid(state) {
        if pid_alive(pid) {
            let p = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGTERM);
            let start = Instant::now();
            while pid_alive(pid) && start.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if pid_alive(pid) {
                let _ = nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL);
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    crate::control_plane::sweep(state);
    if let Ok(plan) = Plan::load(state) {
        // Real nodes' pods, shims (they outlive containerd), mounts and cgroups.
        crate::realnode::sweep(&state.join("nodes"), &plan.prefix);
        // Real Felix, kube-proxy and the ruleset monitors live in the node netns: the
        // netns sweep kills them; then their (now empty) CPU cgroups can go.
        Dataplane::destroy(&plan).context("remove network namespaces")?;
        let left = crate::calico::felix::sweep_cgroups(&plan.prefix);
        if !left.is_empty() {
            eprintln!(
                "testbed: warning: cgroup {} could not be removed",
                left.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    for f in [
        "plan.json",
        "ready.json",
        "daemon.pid",
        "daemon.log",
        "control.sock",
        "cni.sock",
        "truth.jsonl",
        "kubeconfig",
        "kubeconfig-cluster",
        "demo-fault.yaml",
        "report.json",
    ] {
        let _ = std::fs::remove_file(state.join(f));
    }
    for d in [
        "pods",
        "images",
        "etcd",
        "pki",
        "control-plane",
        "kube-cache",
        "calico",
        "kube-proxy",
    ] {
        let _ = std::fs::remove_dir_all(state.join(d));
    }
    let _ = std::fs::remove_dir(state);
    eprintln!("testbed: down");
    Ok(())
}

/// The `ip netns exec <host netns> CMD…` command `testbed exec` runs, with `KUBECONFIG`
/// (the cluster-side kubeconfig), `KUBECACHEDIR` (`<state>/kube-cache`) and `PATH` (the
/// bin dir first) set.
fn exec_command(state: &Path, cmd: &[String]) -> Result<std::process::Command> {
    let info = ready_info(state)?;
    let plan = Plan::load(state)?;
    let path = format!(
        "{}:{}",
        default_bin_dir()?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = std::process::Command::new("ip");
    c.args(["netns", "exec", &plan.host_netns])
        .args(cmd)
        .env("KUBECONFIG", &info.kubeconfig_cluster)
        // kubectl caches discovery per server host:port for hours; testbeds of either
        // control plane reuse bridge addresses, so each state dir gets its own cache.
        .env("KUBECACHEDIR", state.join("kube-cache"))
        .env("PATH", path)
        .env("TESTBED_STATE_DIR", state);
    Ok(c)
}

/// `testbed exec -- CMD…`: replaces this process with CMD running in the host netns
/// (so signals sent to this pid reach CMD itself); returns only on error.
pub fn exec(state: &Path, cmd: &[String]) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let err = exec_command(state, cmd)?.exec();
    Err(anyhow!(
        "run `ip netns exec` (is iproute2 installed?): {err}"
    ))
}

/// Like [`exec`] but as a child process; returns its exit code (used by `demo`).
pub fn exec_child(state: &Path, cmd: &[String]) -> Result<i32> {
    let status = exec_command(state, cmd)?
        .status()
        .context("run `ip netns exec` (is iproute2 installed?)")?;
    Ok(status.code().unwrap_or(128 + 9))
}

/// Sends one line to the daemon's control socket and returns its answer.
fn control(state: &Path, line: &str) -> Result<String> {
    let _ = ready_info(state)?;
    let mut s = std::os::unix::net::UnixStream::connect(state.join("control.sock"))
        .with_context(|| format!("connect to the testbed daemon in {}", state.display()))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    let answer = answer.trim().to_owned();
    match answer.strip_prefix("error ") {
        Some(e) => bail!("{e}"),
        None => Ok(answer),
    }
}

/// `testbed fault set FILE`.
pub fn fault_set(state: &Path, file: &Path) -> Result<()> {
    let abs = fault_set_quiet(state, file)?;
    eprintln!("testbed: fault file {} applied", abs.display());
    Ok(())
}

/// [`fault_set`] without its line (the demo's file lives in a state dir it deletes);
/// returns the file's absolute path.
pub fn fault_set_quiet(state: &Path, file: &Path) -> Result<PathBuf> {
    let abs = file
        .canonicalize()
        .with_context(|| format!("fault file {}", file.display()))?;
    control(state, &format!("fault-set {}", abs.display()))?;
    Ok(abs)
}

/// `testbed node cordon|uncordon NODE` through the API (as `kubectl cordon` does: a
/// strategic-merge PATCH of `spec.unschedulable`).
pub fn node_cordon(state: &Path, node: &str, cordon: bool) -> Result<()> {
    let info = ready_info(state)?;
    if info.control_plane == crate::control_plane::Mode::Real.as_arg() {
        // HTTPS with a client certificate: let kubectl (which does the same PATCH) talk.
        let verb = if cordon { "cordon" } else { "uncordon" };
        let code = exec_child(state, &["kubectl".into(), verb.into(), node.into()])?;
        if code != 0 {
            bail!("kubectl {verb} {node} exited {code}");
        }
        return Ok(());
    }
    let addr: std::net::SocketAddr = info
        .api_local
        .trim_start_matches("http://")
        .parse()
        .context("API address in ready.json")?;
    let body = if cordon {
        r#"{"spec":{"unschedulable":true}}"#
    } else {
        r#"{"spec":{"unschedulable":null}}"#
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let resp = rt.block_on(crate::httpc::request(
        addr,
        "PATCH",
        &format!("/api/v1/nodes/{node}"),
        &[
            ("Content-Type", "application/strategic-merge-patch+json"),
            ("Accept", "application/json"),
        ],
        body.as_bytes(),
        Duration::from_secs(10),
    ))?;
    if resp.status != 200 {
        bail!(
            "PATCH node {node}: HTTP {}: {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
    }
    eprintln!(
        "node/{node} {}",
        if cordon { "cordoned" } else { "uncordoned" }
    );
    Ok(())
}

/// The verbs `testbed api deny|allow` accept (Kubernetes API request verbs, "Request
/// verbs" in the Kubernetes authorization docs) and `*`.
const API_VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "*",
];

/// `VERB RESOURCE [-n|--namespace NAMESPACE]` of `testbed api deny|allow`; a trailing
/// `--nodes-too` (deny only) is returned as the flag.
fn parse_deny_args<'a>(
    action: &str,
    rest: &'a [String],
) -> Result<(&'a str, &'a str, Option<&'a str>, bool)> {
    let (rest, nodes_too) = match rest.split_last() {
        Some((last, head)) if action == "deny" && last == "--nodes-too" => (head, true),
        _ => (rest, false),
    };
    let (verb, resource, ns) = match rest {
        [v, r] => (v, r, None),
        [v, r, flag, ns] if flag == "-n" || flag == "--namespace" => (v, r, Some(ns.as_str())),
        _ => bail!(
            "usage: testbed api {action} VERB RESOURCE [-n NAMESPACE]{} (e.g. `testbed api {action} list pods -n kube-system`){}",
            if action == "deny" { " [--nodes-too]" } else { "" },
            if action == "allow" { " | testbed api allow all" } else { "" }
        ),
    };
    check_verb(verb)?;
    crate::control_plane::resources::check_resource(resource).map_err(|e| anyhow!("{e}"))?;
    Ok((verb.as_str(), resource.as_str(), ns, nodes_too))
}

fn check_verb(verb: &str) -> Result<()> {
    if API_VERBS.contains(&verb) {
        Ok(())
    } else {
        bail!(
            "unknown verb {verb:?}: one of {} (as in RBAC rules)",
            API_VERBS.join(", ")
        )
    }
}

fn parse_hex_caps(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|e| format!("capability mask {s:?}: {e}"))
}

/// The well-known Node label a kubelet sets to its hostname.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// A Kubernetes label value: at most 63 characters, alphanumerics, `-`, `_`, `.`,
/// beginning and ending with an alphanumeric (empty is allowed).
pub fn check_label_value(v: &str) -> Result<()> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if v.len() > 63 {
        bail!("label value {v:?} is longer than 63 characters");
    }
    if !v.chars().all(|c| alnum(c) || "-_.".contains(c))
        || !v.starts_with(alnum)
        || !v.ends_with(alnum)
    {
        bail!("label value {v:?} must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character");
    }
    Ok(())
}

/// Entry point used by `main`; returns the process exit code.
pub fn main_with(cli: Cli) -> Result<i32> {
    let state = cli.state_dir.clone();
    match cli.cmd {
        Cmd::Shim {
            netns,
            dev_dir,
            hostname,
            sa_dir,
            uid,
            gid,
            groups,
            caps,
            no_new_privs,
            read_only_root,
            clock_offset,
            rootfs,
            exec_fd,
            cmd,
        } => {
            if let Some(fd) = exec_fd {
                // SAFETY: a plain fcntl on an fd we were given; an invalid one fails.
                unsafe {
                    nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC);
                }
            }
            let spec = crate::shim::ShimSpec {
                netns,
                dev_dir,
                hostname,
                sa_dir,
                identity: crate::security::Identity {
                    uid,
                    gid,
                    groups,
                    caps: caps.unwrap_or(crate::security::DEFAULT_CAPS),
                    no_new_privs,
                    read_only_root,
                },
                program: PathBuf::from(&cmd[0]),
                args: cmd[1..].to_vec(),
                clock_offset: clock_offset.map(|seconds| crate::fault::ClockSkew { seconds }),
                rootfs,
                exec_fd,
            };
            let e = crate::shim::enter_and_exec(&spec).unwrap_err();
            Err(anyhow!("container start failed: {e}"))
        }
        Cmd::Daemon(a) => {
            let ipv6 = a.dual_stack()?;
            let mut node_labels = parse_node_labels(&a.node_labels)?;
            if let Some(sfx) = &a.hostname_label_suffix {
                for i in 1..=a.nodes {
                    let node = format!("node-{i}");
                    node_labels
                        .entry(node.clone())
                        .or_default()
                        .entry(HOSTNAME_LABEL.to_owned())
                        .or_insert(format!("{node}{sfx}"));
                }
            }
            daemon::run(DaemonArgs {
                state_dir: state,
                nodes: a.nodes,
                fault: a.fault,
                node_labels,
                image_dir: match (a.image_dir, &a.bin_dir) {
                    (Some(d), _) => d,
                    (None, Some(b)) => default_image_dir(b),
                    (None, None) => default_image_dir(&default_bin_dir()?),
                },
                bin_dir: a.bin_dir.unwrap_or(default_bin_dir()?),
                kube_proxy_metrics: a.kube_proxy_metrics,
                control_plane: a.control_plane,
                control_plane_bin: a.control_plane_bin,
                hollow: (a.hollow_nodes > 0).then_some(crate::hollow::HollowSettings {
                    count: a.hollow_nodes,
                    ttfp: a.hollow_ttfp,
                    direct_scrapes: a.hollow_direct_scrapes,
                }),
                agent: a.agent,
                kube_proxy: a.kube_proxy,
                kubelet: a.kubelet,
                ipv6,
            })?;
            Ok(0)
        }
        Cmd::Up(a) => up(&state, &a).map(|_| 0),
        Cmd::Down => down(&state).map(|_| 0),
        Cmd::Cni => Ok(crate::cni::plugin_main()),
        Cmd::Exec { cmd } => exec(&state, &cmd),
        Cmd::Truth => {
            let p = state.join("truth.jsonl");
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
            print!("{text}");
            Ok(0)
        }
        Cmd::Node { action, node } => match action.as_str() {
            "cordon" => node_cordon(&state, &node, true).map(|_| 0),
            "uncordon" => node_cordon(&state, &node, false).map(|_| 0),
            stop_start => {
                control(&state, &format!("node-{stop_start} {node}"))?;
                eprintln!(
                    "node/{node} {}",
                    if stop_start == "stop" {
                        "stopped (NotReady)"
                    } else {
                        "started (Ready)"
                    }
                );
                Ok(0)
            }
        },
        Cmd::Fault { file, .. } => fault_set(&state, &file).map(|_| 0),
        Cmd::Agent {
            node,
            all,
            interval,
            image,
            down,
            ..
        } => {
            if image.is_empty() || image.chars().any(char::is_whitespace) {
                bail!("--image {image:?}: an image reference has no spaces and is not empty");
            }
            let down = humantime::format_duration(down)
                .to_string()
                .replace(' ', "");
            let nodes = match (node, all) {
                (Some(n), _) => vec![n],
                (None, _) => ready_info(&state)?.nodes,
            };
            let count = nodes.len();
            for (i, node) in nodes.iter().enumerate() {
                let started = Instant::now();
                let answer = control(&state, &format!("agent-roll {node} {image} {down}"))?;
                let mut words = answer.split_whitespace().skip(1);
                let (pod, uid) = (words.next().unwrap_or("?"), words.next().unwrap_or("?"));
                eprintln!(
                    "testbed: [{}/{count}] {node}'s calico-node pod replaced by kube-system/{pod} (uid {uid}, image {image}); Running and Ready after {:.1}s",
                    i + 1,
                    started.elapsed().as_secs_f64()
                );
                if i + 1 < count && !interval.is_zero() {
                    std::thread::sleep(interval);
                }
            }
            Ok(0)
        }
        Cmd::Api { action, rest } => match (action.as_str(), rest.as_slice()) {
            ("allow", [all]) if all == "all" => {
                control(&state, "api-allow-all")?;
                eprintln!("testbed: every denied verb is allowed again");
                Ok(0)
            }
            (action @ ("deny" | "allow"), rest) => {
                let (verb, resource, ns, nodes_too) = parse_deny_args(action, rest)?;
                let scope = ns.map(|n| format!(" in namespace {n}")).unwrap_or_default();
                let cmd = if nodes_too { "deny-nodes-too" } else { action };
                let line = format!("api-{cmd} {verb} {resource} {}", ns.unwrap_or_default());
                control(&state, line.trim_end())?;
                if action == "deny" {
                    let whom = if nodes_too {
                        " (the testbed's kubelets and service proxies too)"
                    } else {
                        ""
                    };
                    eprintln!(
                        "testbed: the API now answers {verb} {resource}{scope} with 403 Forbidden{whom}"
                    );
                } else {
                    eprintln!("testbed: {verb} {resource}{scope} is allowed again");
                }
                Ok(0)
            }
            ("stop", []) => {
                control(&state, "api-stop")?;
                eprintln!("testbed: API server stopped (connections refused; the nodes keep running); `testbed api start` brings it back");
                Ok(0)
            }
            ("start", []) => {
                control(&state, "api-start")?;
                eprintln!("testbed: API server started (same addresses, same store)");
                Ok(0)
            }
            ("restart", []) => {
                control(&state, "api-restart")?;
                eprintln!("testbed: API server restarted (same addresses, same store)");
                Ok(0)
            }
            ("expire-watches", []) => {
                control(&state, "api-expire-watches")?;
                eprintln!("testbed: watches expired; the next resume gets 410 Gone");
                Ok(0)
            }
            (other, rest) => bail!("`testbed api {other}` takes no arguments (got {rest:?})"),
        },
        Cmd::Demo(a) => crate::demo::demo(&state, &a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_parse_node_key_value_items() {
        let m = parse_node_labels(&[
            "node-2=os=debian13".into(),
            "node-3=os=debian13".into(),
            "node-2=zone=a".into(),
        ])
        .unwrap();
        assert_eq!(m["node-2"]["os"], "debian13");
        assert_eq!(m["node-2"]["zone"], "a");
        assert_eq!(m["node-3"].len(), 1);
        assert!(parse_node_labels(&["node-2=os".into()]).is_err());
        assert!(parse_node_labels(&["=a=b".into()]).is_err());
    }

    #[test]
    fn api_deny_checks_the_resource_as_rbac_names_it() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = parse_deny_args("deny", &args(&["create", "pod"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"pods\""), "{e}");
        let ok = args(&["create", "pods/log", "-n", "a"]);
        assert_eq!(
            parse_deny_args("deny", &ok).unwrap(),
            ("create", "pods/log", Some("a"), false)
        );
        let too = args(&["create", "pods", "--nodes-too"]);
        assert_eq!(
            parse_deny_args("deny", &too).unwrap(),
            ("create", "pods", None, true)
        );
        assert!(parse_deny_args("allow", &args(&["lst", "pods"])).is_err());
    }

    #[test]
    fn up_takes_the_control_plane_from_flag_or_default() {
        let c = Cli::try_parse_from(["testbed", "up", "--control-plane", "real"]).unwrap();
        match c.cmd {
            Cmd::Up(a) => assert_eq!(a.control_plane, crate::control_plane::Mode::Real),
            _ => panic!("not up"),
        }
        assert!(Cli::try_parse_from(["testbed", "up", "--control-plane", "kind"]).is_err());
    }

    #[test]
    fn hostname_label_values_are_checked_as_label_values() {
        assert!(check_label_value("node-1.ec2.internal").is_ok());
        assert!(check_label_value("node-1.").is_err());
        assert!(check_label_value("node-1/x").is_err());
        assert!(check_label_value(&"a".repeat(64)).is_err());
    }

    fn up_args(extra: &[&str]) -> Result<UpArgs, clap::Error> {
        let mut argv = vec!["testbed", "--state-dir", "/tmp/x", "up"];
        argv.extend(extra);
        Cli::try_parse_from(argv).map(|c| match c.cmd {
            Cmd::Up(a) => a,
            _ => panic!("not up"),
        })
    }

    #[test]
    fn ip_families_default_to_ipv4_accept_real_felix_and_refuse_ipv6_with_other_real_or_hollow_components(
    ) {
        assert!(!up_args(&[]).unwrap().dual_stack().unwrap(), "default ipv4");
        for f in ["ipv4,ipv6", "ipv6,ipv4"] {
            assert!(up_args(&["--ip-families", f])
                .unwrap()
                .dual_stack()
                .unwrap());
        }
        assert!(up_args(&["--ip-families", "ipv5"]).is_err());
        let only6 = up_args(&["--ip-families", "ipv6"]).unwrap().dual_stack();
        assert!(only6
            .unwrap_err()
            .to_string()
            .contains("IPv4 is always there"));
        // Real Felix programs IPv6 too (with the simulated kubelet and kube-proxy).
        for agent in ["calico", "calico:v3.29.5"] {
            assert!(up_args(&["--ip-families", "ipv4,ipv6", "--agent", agent])
                .unwrap()
                .dual_stack()
                .unwrap());
        }
        for extra in [
            &["--kubelet", "real"][..],
            &["--kube-proxy", "real"],
            &["--hollow-nodes", "3"],
        ] {
            let mut argv = vec!["--ip-families", "ipv4,ipv6"];
            argv.extend(extra);
            let e = up_args(&argv)
                .unwrap()
                .dual_stack()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("IPv6 is not yet supported with") && e.contains(extra[0]),
                "{extra:?}: {e}"
            );
            // IPv4-only, the same components are fine here.
            let mut argv = vec!["--ip-families", "ipv4"];
            argv.extend(extra);
            assert!(!up_args(&argv).unwrap().dual_stack().unwrap());
        }
    }

    #[test]
    fn cli_parses_contract_flags() {
        let c = Cli::try_parse_from([
            "testbed",
            "--state-dir",
            "/tmp/x",
            "up",
            "--nodes",
            "4",
            "--node-labels",
            "node-2=os=a,node-3=os=a",
        ])
        .unwrap();
        match c.cmd {
            Cmd::Up(a) => {
                assert_eq!(a.nodes, 4);
                assert_eq!(a.node_labels.len(), 2);
            }
            _ => panic!("not up"),
        }
        let c =
            Cli::try_parse_from(["testbed", "exec", "--", "kubectl", "get", "pods", "-A"]).unwrap();
        match c.cmd {
            Cmd::Exec { cmd } => assert_eq!(cmd, ["kubectl", "get", "pods", "-A"]),
            _ => panic!("not exec"),
        }
    }
}
