//! The testbed's CNI dataplane: real network namespaces, veths, routes and an nftables
//! allow set (docs/design.md §5 "Topology" and "Programmed").
//!
//! Topology for a [`Plan`]:
//! - host netns `<prefix>-host`: `lo` up, bridge `br0` at `bridge_ip/24`, one veth
//!   `vn<i>` per node enslaved to it, and a route to every node's pod block via that
//!   node (so a client in the host netns reaches pods like an in-cluster client does:
//!   through the node's forward path);
//! - node netns `<prefix>-node-<i>`: `eth0` (peer of `vn<i>`) at the node IP/24,
//!   `ip_forward=1`, `rp_filter=0`, `lo` up, `blackhole <own block>`, `<peer block> via
//!   <peer node IP>` for every peer, and table `inet firstpacket` with set `allowed` and
//!   a forward chain that drops packets from/to `cali*` interfaces whose pod IP is not
//!   in the set (Felix's "Unknown interface" drop: the `cali-from-wl-dispatch` /
//!   `cali-to-wl-dispatch` chains of felix/rules/dispatch.go end in a drop for any
//!   `cali*` interface whose endpoint is not programmed yet), then NetworkPolicy
//!   enforcement ([`NFT_POLICY_CHAIN`], [`Dataplane::write_policies`]);
//! - pod netns `<prefix>-p<n>`: `eth0` with `<ip>/32`, `169.254.1.1 dev eth0 scope link`,
//!   default via 169.254.1.1, static neighbour 169.254.1.1 → `ee:ee:ee:ee:ee:ee` (the
//!   Calico CNI plugin's pod-side setup, cni-plugin/internal/pkg/utils/network_linux.go);
//!   the node side is `cali<11 hex>` with MAC `ee:ee:ee:ee:ee:ee` and a `<ip>/32 dev
//!   cali…` route installed at once, so the node (and kubelet probes) reach the pod
//!   immediately, while forwarded traffic waits for [`Dataplane::allow`];
//! - dual-stack plans ([`Plan::with_ipv6`]) add, per family IPv6: `br0` at
//!   `bridge_ip6/64` and host routes to every node's IPv6 block via its IPv6 address;
//!   in each node `eth0` at its IPv6 address/64, `net.ipv6.conf.all.forwarding=1`,
//!   `accept_dad=0` (addresses usable at once), `blackhole <own IPv6 block>`,
//!   `<peer IPv6 block> via <peer IPv6 node address>`, and set [`NFT_SET6`] gating IPv6
//!   like [`NFT_SET`] gates IPv4; each pod gets `<ip6>/128` (`nodad`) beside its /32,
//!   default route via [`POD_GATEWAY6`] (the EUI-64 link-local of [`WORKLOAD_MAC`],
//!   which the node-side veth is given explicitly) with a permanent neighbour entry for
//!   it, and the node a `<ip6>/128 dev cali…` route at once. NetworkPolicy rules and
//!   `first_connections_dropped` stay IPv4-only (IPv6 packets pass them unchanged);
//! - faults on a node's network (`link_mtu`, `encap_mtu`, `proto_drop`), put in and taken
//!   out by [`Dataplane::set_net_faults`]: the MTU of its bridge port `vn<i>`, table
//!   `netdev firstpacket_vn<i>` in the host netns, table `inet firstpacket_faults` in the
//!   node netns, and `gso_max_segs 1` on every node's `eth0` and on `br0` while a size
//!   limit is in force anywhere.
//!
//! All work is done with the `ip` (iproute2) and `nft` (nftables) commands and runs
//! only inside the namespaces named by the plan. Every method blocks (a few ms per
//! command); call them from `spawn_blocking` or a plain thread when latency of the
//! calling runtime matters.

use crate::fault::ProtoDrop;
use crate::netns::{netns_path, run_in_netns};
use crate::plan::{owned_by_prefix, IpFamily, Ipv4Cidr, NodePlan, Plan};
use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// MAC address of every node-side workload veth (Calico sets `ee:ee:ee:ee:ee:ee` so pods
/// can use a static neighbour entry for their gateway; cni-plugin network_linux.go).
pub const WORKLOAD_MAC: &str = "ee:ee:ee:ee:ee:ee";

/// The pods' link-local gateway (Calico's fixed next hop, never assigned anywhere).
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The pods' IPv6 next hop: `fe80::ecee:eeff:feee:eeee`, the EUI-64 link-local address
/// of [`WORKLOAD_MAC`] (flip bit 1 of the first byte, insert `ff:fe`). Calico's CNI plugin
/// routes a pod's IPv6 default via the host-side veth's link-local address
/// (cni-plugin/internal/pkg/utils/network_linux.go, `SetupRoutes`/`configureContainerSysctls`),
/// which is this one because every host-side veth has that MAC.
pub const POD_GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

/// Name of the IPv6 allow set (type `ipv6_addr`) in [`NFT_TABLE`], on dual-stack plans
/// only: a pod's IPv6 address goes in with its IPv4 one ([`Dataplane::allow`]).
pub const NFT_SET6: &str = "allowed6";

/// nftables table (family `inet`) holding the allow set in each node netns.
pub const NFT_TABLE: &str = "firstpacket";

/// Name of the allow set (type `ipv4_addr`) in [`NFT_TABLE`].
pub const NFT_SET: &str = "allowed";

/// Name of the verdict map (pod IP → `jump fcd_<ip>`) behind the
/// `first_connections_dropped` fault in [`NFT_TABLE`]: a new TCP connection (SYN
/// without ACK) from or to a mapped IP jumps to that endpoint's chain, whose single
/// rule `limit rate 1/week burst N packets drop` drops exactly the first N such SYNs
/// (the token bucket starts full with N packets; checked with nftables 1.0.6) and lets
/// every later one through.
pub const NFT_FCD_MAP: &str = "fcd";

/// The NetworkPolicy chain of [`NFT_TABLE`], jumped to from `forward` after the
/// allow-set drops (and before the `first_connections_dropped` SYN drops, so those count
/// only connections policy admits): `ct state established,related accept` (replies and
/// the rest of admitted connections flow, as Felix's per-workload chains start), then
/// `oifname "cali*" ip daddr vmap @pol_in` (traffic to an ingress-isolated pod of the
/// node jumps to its `pin_<ip>` chain) and `iifname "cali*" ip saddr vmap @pol_out`
/// (traffic from an egress-isolated pod to its `pout_<ip>` chain). Each pod chain
/// `return`s what one of its rules admits and ends in `drop`
/// ([`Dataplane::write_policies`]). Only forwarded traffic passes here: a pod's traffic
/// with its own node (kubelet probes, the pod dialing its node IP) uses the `input` and
/// `output` hooks and is never subject to policy, as Kubernetes requires.
pub const NFT_POLICY_CHAIN: &str = "netpol";

/// Verdict map (pod IP → `jump pin_<ip>`) of ingress-isolated pods ([`NFT_POLICY_CHAIN`]).
pub const NFT_POLICY_IN: &str = "pol_in";

/// Verdict map (pod IP → `jump pout_<ip>`) of egress-isolated pods ([`NFT_POLICY_CHAIN`]).
pub const NFT_POLICY_OUT: &str = "pol_out";

/// A node's underlay interface in its netns (the peer of its bridge port,
/// [`Plan::bridge_port`]).
pub const UNDERLAY_IFACE: &str = "eth0";

/// nftables table (family `inet`) in a node's netns carrying the `proto_drop` fault
/// ([`proto_drop_script`]): one `forward` chain at [`NFT_FAULT_PRIORITY`], apart from
/// the agent's tables, so the simulated agent's allow set and real Felix's iptables-nft
/// chains are never touched. Present only while the fault is in force.
pub const NFT_FAULT_TABLE: &str = "firstpacket_faults";

/// Priority of the fault chains' `forward` hook: after the agents' filter chains
/// (priority 0, the simulated agent's [`NFT_TABLE`] and iptables-nft's `filter`), so a
/// packet an agent accepts still meets them — an nftables `accept` ends only its own base
/// chain, a `drop` is final — and a packet an agent drops is not counted twice.
pub const NFT_FAULT_PRIORITY: i32 = 10;

/// nftables table (family `netdev`) in the host netns carrying node `port`'s
/// `encap_mtu` fault ([`encap_script`]): `firstpacket_vn<i>`, hooked to the node's
/// bridge port.
pub fn link_table(port: &str) -> String {
    format!("{NFT_TABLE}_{port}")
}

/// Host-order offsets in a node's /24 block handed to pods: `.2`–`.254` (`.0`/`.255`
/// are network/broadcast to most tools, `.1` is kept free by convention).
const FIRST_HOST: u32 = 2;
const LAST_HOST: u32 = 254;

/// Errors of dataplane operations. Each names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// A command exited non-zero.
    #[error("`{cmd}` failed (exit {code:?}): {stderr}")]
    Command {
        cmd: String,
        code: Option<i32>,
        stderr: String,
    },
    /// A command could not be started, a netns could not be entered, a sysctl or
    /// `/run/netns` entry could not be written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The node is not in the plan.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// Every address of the node's pod block is in use.
    #[error("node {node}: pod block {cidr} has no free address")]
    BlockExhausted { node: String, cidr: String },
    /// [`Dataplane::check_pod`]: part of a pod's wiring is not there.
    #[error("node {node}: {what} is missing")]
    Missing { node: String, what: String },
    /// The node-side interface name is taken: a pod with the same namespace/name still
    /// has its sandbox on that node (Calico names veths by namespace.pod).
    #[error("node {node}: interface {iface} for {namespace}/{pod} already exists")]
    IfaceInUse {
        node: String,
        namespace: String,
        pod: String,
        iface: String,
    },
}

type Result<T, E = DataplaneError> = std::result::Result<T, E>;

/// Where a pod's network namespace comes from.
#[derive(Clone, Copy)]
enum Sandbox<'a> {
    /// `ip netns add` (the simulated kubelet's sandboxes); pod interface `eth0`.
    Own,
    /// A container runtime's namespace file, bind-mounted into `/run/netns`; pod
    /// interface `ifname`.
    Attached {
        netns: &'a std::path::Path,
        ifname: &'a str,
    },
}

/// A pod's network sandbox as [`Dataplane::add_pod`] made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodNet {
    /// Node name (`node-<i>`).
    pub node: String,
    pub namespace: String,
    pub pod: String,
    /// Pod `metadata.uid`.
    pub uid: String,
    /// Pod IP (from the node's block).
    pub ip: Ipv4Addr,
    /// Pod IPv6 address on a dual-stack plan (same offset in the node's IPv6 block,
    /// [`NodePlan::ipv6_of`]), else `None` (absent from the JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<Ipv6Addr>,
    /// Node-side veth, `cali` + 11 hex chars ([`calico_iface_name`]).
    pub iface: String,
    /// Pod netns name, `<prefix>-p<n>`.
    pub netns: String,
}

/// Calico's host-side veth name for a workload: `cali` + the first 11 hex chars of
/// SHA-1 of `"<namespace>.<pod>"` (libcalico-go lib/backend/k8s/conversion
/// `VethNameForWorkload`), 15 chars = IFNAMSIZ−1. A recreated pod with the same
/// namespace and name gets the same name (calico#11016).
pub fn calico_iface_name(namespace: &str, pod: &str) -> String {
    let digest = Sha1::digest(format!("{namespace}.{pod}").as_bytes());
    let hex = crate::plan::hex(&digest);
    format!("cali{}", &hex[..11])
}

/// Runs a command, optionally inside netns `netns` (via a thread that `setns`es first,
/// so the child inherits the namespace), feeding `stdin`. Returns stdout.
fn run(netns: Option<&str>, argv: &[&str], stdin: Option<&str>) -> Result<String> {
    let cmdline = match netns {
        Some(ns) => format!("[{ns}] {}", argv.join(" ")),
        None => argv.join(" "),
    };
    let exec = || -> Result<std::process::Output> {
        let (prog, args) = argv.split_first().ok_or_else(|| DataplaneError::Io {
            what: "empty command".into(),
            source: std::io::Error::other("empty argv"),
        })?;
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let io_err = |source| DataplaneError::Io {
            what: format!("run `{cmdline}`"),
            source,
        };
        let mut child = cmd.spawn().map_err(io_err)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).map_err(io_err)?;
        }
        child.wait_with_output().map_err(io_err)
    };
    let started = Instant::now();
    let out = match netns {
        Some(ns) => run_in_netns(ns, exec).map_err(|source| DataplaneError::Io {
            what: format!("enter netns {ns}"),
            source,
        })??,
        None => exec()?,
    };
    tracing::debug!(cmd = %cmdline, ms = started.elapsed().as_secs_f64() * 1e3, ok = out.status.success(), "dataplane command");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(DataplaneError::Command {
            cmd: cmdline,
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// `ip [-n NETNS] -batch -` with the given lines (stops at the first failing line).
fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<()> {
    let mut script = lines.join("\n");
    script.push('\n');
    match netns {
        Some(ns) => run(None, &["ip", "-n", ns, "-batch", "-"], Some(&script)),
        None => run(None, &["ip", "-batch", "-"], Some(&script)),
    }
    .map(drop)
}

/// Whether an error only says "that is already gone" (for idempotent teardown).
fn is_gone(e: &DataplaneError) -> bool {
    match e {
        DataplaneError::Command { stderr, .. } => {
            stderr.contains("Cannot find device")
                || stderr.contains("No such process")
                || stderr.contains("No such file or directory")
        }
        DataplaneError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// Writes `value` to `/proc/sys/<key>` inside netns `netns` (`/proc/sys/net` shows the
/// namespace of the thread that opens it).
fn sysctls(netns: &str, kv: &[(&str, &str)]) -> Result<()> {
    run_in_netns(netns, || -> Result<()> {
        for (k, v) in kv {
            let path = format!("/proc/sys/{}", k.replace('.', "/"));
            std::fs::write(&path, v).map_err(|source| DataplaneError::Io {
                what: format!("[{netns}] sysctl {k}={v}"),
                source,
            })?;
        }
        Ok(())
    })
    .map_err(|source| DataplaneError::Io {
        what: format!("enter netns {netns}"),
        source,
    })?
}

/// nftables ruleset for one node: with `gate` (the simulated agent), Felix-like default
/// drop for unknown workloads in `forward`, and an `input` chain that
/// [`Dataplane::set_readiness_gate`] fills; without (real Felix programs the node), the
/// table holds only empty chains, so it never decides a packet.
///
/// With `ipv6` (dual-stack plan) the table also holds set [`NFT_SET6`] and, with
/// `gate`, the same two drops for IPv6 (`ip6 saddr`/`ip6 daddr`), so IPv6 neither slips
/// past the gate nor stays dropped once the endpoint is programmed.
fn node_ruleset(gate: bool, ipv6: bool) -> String {
    let gate6 = if gate && ipv6 {
        format!(
            "\t\tiifname \"cali*\" ip6 saddr != @{NFT_SET6} drop\n\
             \t\toifname \"cali*\" ip6 daddr != @{NFT_SET6} drop\n"
        )
    } else {
        String::new()
    };
    let set6 = if ipv6 {
        format!("\tset {NFT_SET6} {{ type ipv6_addr; }}\n")
    } else {
        String::new()
    };
    let (rules, policy) = if gate {
        (
            format!(
                "\t\tiifname \"cali*\" ip saddr != @{NFT_SET} drop\n\
                 \t\toifname \"cali*\" ip daddr != @{NFT_SET} drop\n\
                 {gate6}\
                 \t\tjump {NFT_POLICY_CHAIN}\n\
                 \t\ttcp flags & (syn | ack) == syn ip saddr vmap @{NFT_FCD_MAP}\n\
                 \t\ttcp flags & (syn | ack) == syn ip daddr vmap @{NFT_FCD_MAP}\n"
            ),
            format!(
                "\tmap {NFT_POLICY_IN} {{ type ipv4_addr : verdict; }}\n\
                 \tmap {NFT_POLICY_OUT} {{ type ipv4_addr : verdict; }}\n\
                 \tchain {NFT_POLICY_CHAIN} {{\n\
                 \t\tct state established,related accept\n\
                 \t\toifname \"cali*\" ip daddr vmap @{NFT_POLICY_IN}\n\
                 \t\tiifname \"cali*\" ip saddr vmap @{NFT_POLICY_OUT}\n\
                 \t}}\n"
            ),
        )
    } else {
        (String::new(), String::new())
    };
    format!(
        "table inet {NFT_TABLE} {{\n\
         \tset {NFT_SET} {{ type ipv4_addr; }}\n\
         {set6}\
         \tmap {NFT_FCD_MAP} {{ type ipv4_addr : verdict; }}\n\
         {policy}\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority 0; policy accept;\n\
         {rules}\
         \t}}\n\
         \tchain {NFT_INPUT} {{\n\
         \t\ttype filter hook input priority 0; policy accept;\n\
         \t}}\n\
         }}\n"
    )
}

/// The `input` chain of [`NFT_TABLE`]: empty, or (simulated agent with
/// `gates_readiness`) one rule dropping traffic from `cali*` interfaces whose pod IP is
/// not programmed — Felix's `cali-INPUT` → `cali-wl-to-host` → `cali-from-wl-dispatch`
/// drop of a workload it does not know yet (felix/rules/static.go, dispatch.go), which
/// makes the kubelet's readiness probe fail until the endpoint is programmed.
pub const NFT_INPUT: &str = "input";

/// A node's pod block allocator: FIFO over free host offsets, like Calico IPAM, which
/// appends released ordinals to the end of a block's `unallocated` list
/// (libcalico-go lib/ipam/ipam_block.go), so a just-freed IP is not reused at once.
struct Block {
    free: VecDeque<u32>,
    /// offset → uid of the pod holding it.
    used: HashMap<u32, String>,
}

struct NodeState {
    plan: NodePlan,
    block: Mutex<Block>,
}

/// The faults on a node's network that the dataplane itself carries out
/// ([`Dataplane::set_net_faults`]; fault primitives `link_mtu`, `encap_mtu`,
/// `proto_drop`, [`crate::fault`]). The default is none.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetFaults {
    /// MTU, in bytes, of the node's bridge port (the bridge-side end of its underlay
    /// veth, [`Plan::bridge_port`]); `None`: as built. The node's own `eth0` keeps its
    /// MTU.
    pub link_mtu: Option<u32>,
    /// Largest IP packet, in bytes, of the node's pods (source or destination in its pod
    /// block) that crosses its bridge port; `None`: no limit.
    pub encap_mtu: Option<u32>,
    /// Forwarded pod packets dropped in the node by protocol.
    pub proto_drop: Option<ProtoDrop>,
}

impl NetFaults {
    /// Whether a size limit is on the node's link (`link_mtu` or `encap_mtu`).
    fn limits_size(&self) -> bool {
        self.link_mtu.is_some() || self.encap_mtu.is_some()
    }
}

/// What [`Dataplane::set_net_faults`] changed, to undo it.
#[derive(Default)]
struct NetState {
    /// Per node, the faults in force (nodes without any are absent).
    faults: BTreeMap<String, NetFaults>,
    /// The MTU each lowered bridge port had before (`link_mtu`).
    port_mtu: BTreeMap<String, u64>,
    /// While the underlay segments (a size limit is in force on some node): each sender's
    /// (netns, device, original `gso_max_segs`).
    segmenting: Option<Vec<(String, &'static str, u64)>>,
}

/// A created dataplane (see the module docs). Shareable (`Arc<Dataplane>`); every
/// method takes `&self` and is safe to call concurrently.
pub struct Dataplane {
    plan: Plan,
    nodes: BTreeMap<String, NodeState>,
    pod_counter: AtomicU64,
    net: Mutex<NetState>,
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("prefix", &self.plan.prefix)
            .field("nodes", &self.plan.nodes.len())
            .finish()
    }
}

impl Dataplane {
    /// Builds the whole topology for `plan`. Leftovers of an earlier run with the same
    /// prefix are swept first; on any failure part-way everything made is swept again
    /// before the error is returned. About `3·N + 3` commands.
    pub fn create(plan: &Plan) -> Result<Dataplane> {
        Dataplane::create_with(plan, true)
    }

    /// [`Dataplane::create`] with or without the simulated agent's allow-set gate in the
    /// nodes' rulesets (`gate = false` when real Calico Felix programs the nodes: Felix
    /// is the gate then).
    pub fn create_with(plan: &Plan, gate: bool) -> Result<Dataplane> {
        sweep(&plan.prefix)?;
        let started = Instant::now();
        if let Err(e) = build(plan, gate) {
            let _ = sweep(&plan.prefix);
            return Err(e);
        }
        tracing::info!(prefix = %plan.prefix, nodes = plan.nodes.len(), ms = started.elapsed().as_millis() as u64, "dataplane created");
        Ok(Dataplane::attach(plan))
    }

    /// A handle on an already-built topology (no commands run). Pod netns numbering
    /// continues after the highest `<prefix>-p<n>` present; address allocation starts
    /// empty (addresses of pods that survived are not known). For the daemon that made
    /// the topology; use [`Dataplane::create`] otherwise.
    pub fn attach(plan: &Plan) -> Dataplane {
        let pod_prefix = format!("{}-p", plan.prefix);
        let last_pod = list_netns(&plan.prefix)
            .iter()
            .filter_map(|n| n.strip_prefix(&pod_prefix)?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let nodes = plan
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    NodeState {
                        plan: n.clone(),
                        block: Mutex::new(Block {
                            free: (FIRST_HOST..=LAST_HOST).collect(),
                            used: HashMap::new(),
                        }),
                    },
                )
            })
            .collect();
        Dataplane {
            plan: plan.clone(),
            nodes,
            pod_counter: AtomicU64::new(last_pod),
            net: Mutex::new(NetState::default()),
        }
    }

    /// The plan this dataplane was built from.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Makes every address of `block` local in the host netns (the block on its `lo`, so
    /// a listener on `0.0.0.0` answers each of them): the hollow nodes' InternalIPs
    /// ([`crate::hollow`]). Gone with the netns. Errors: the `ip` command.
    pub fn add_host_local_block(&self, block: crate::plan::Ipv4Cidr) -> Result<()> {
        ip_batch(
            Some(&self.plan.host_netns),
            &[format!("addr add {block} dev lo")],
        )
    }

    /// Tears everything down ([`sweep`] of the plan's prefix). Idempotent.
    pub fn destroy(plan: &Plan) -> Result<()> {
        sweep(&plan.prefix)
    }

    fn node(&self, node: &str) -> Result<&NodeState> {
        self.nodes
            .get(node)
            .ok_or_else(|| DataplaneError::UnknownNode(node.to_owned()))
    }

    /// CNI ADD: allocates the next free IP of `node`'s block, creates the pod netns and
    /// the Calico-style veth pair, pod-side address/routes/neighbour and the node-side
    /// `/32` route (node → pod works at once; forwarded traffic waits for
    /// [`Dataplane::allow`]). Three commands. Errors: [`DataplaneError::UnknownNode`],
    /// [`DataplaneError::BlockExhausted`], [`DataplaneError::IfaceInUse`] when a
    /// same-named pod's sandbox is still on the node, command failures (everything made
    /// is removed again).
    pub fn add_pod(&self, node: &str, namespace: &str, pod: &str, uid: &str) -> Result<PodNet> {
        self.add_pod_in(node, namespace, pod, uid, Sandbox::Own)
    }

    /// CNI ADD into a network namespace someone else made (a container runtime's,
    /// `CNI_NETNS`): as [`Dataplane::add_pod`], but instead of `ip netns add` the
    /// namespace at `netns` (a netns file such as `/var/run/netns/cni-…`, or
    /// `/proc/self/fd/N` of one held open) is bind-mounted onto `/run/netns/<prefix>-p<n>`
    /// ([`PodNet::netns`]) so every `ip -n` command names it, and the pod-side interface is
    /// called `ifname` (`CNI_IFNAME`) instead of `eth0`. The runtime's own file is never
    /// touched: [`Dataplane::detach_pod`] and [`sweep`] remove only the bind mount.
    /// Errors: as [`Dataplane::add_pod`], plus the bind mount
    /// ([`DataplaneError::Io`]); everything made is removed again.
    pub fn attach_pod(
        &self,
        node: &str,
        namespace: &str,
        pod: &str,
        uid: &str,
        netns: &std::path::Path,
        ifname: &str,
    ) -> Result<PodNet> {
        self.add_pod_in(
            node,
            namespace,
            pod,
            uid,
            Sandbox::Attached { netns, ifname },
        )
    }

    fn add_pod_in(
        &self,
        node: &str,
        namespace: &str,
        pod: &str,
        uid: &str,
        sandbox: Sandbox<'_>,
    ) -> Result<PodNet> {
        let st = self.node(node)?;
        let offset = {
            let mut b = st.block.lock().unwrap_or_else(|p| p.into_inner());
            let off = b
                .free
                .pop_front()
                .ok_or_else(|| DataplaneError::BlockExhausted {
                    node: node.to_owned(),
                    cidr: st.plan.pod_cidr.to_string(),
                })?;
            b.used.insert(off, uid.to_owned());
            off
        };
        let n = self.pod_counter.fetch_add(1, Ordering::Relaxed) + 1;
        let net = PodNet {
            node: node.to_owned(),
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            uid: uid.to_owned(),
            ip: st.plan.pod_cidr.nth(offset),
            ip6: st.plan.ipv6.map(|v6| v6.pod_cidr.nth(offset)),
            iface: calico_iface_name(namespace, pod),
            netns: self.plan.pod_netns(n),
        };
        let started = Instant::now();
        match self.build_pod(st, &net, sandbox) {
            Ok(()) => {
                tracing::debug!(pod = %format!("{namespace}/{pod}"), ip = %net.ip, iface = %net.iface, ms = started.elapsed().as_secs_f64() * 1e3, "pod network added");
                Ok(net)
            }
            Err(e) => {
                let e = match e {
                    DataplaneError::Command { ref stderr, .. }
                        if stderr.contains("File exists") =>
                    {
                        DataplaneError::IfaceInUse {
                            node: node.to_owned(),
                            namespace: namespace.to_owned(),
                            pod: pod.to_owned(),
                            iface: net.iface.clone(),
                        }
                    }
                    e => e,
                };
                // Undo: the netns (pod end of the veth; for an attached one only our
                // bind mount, and not when its name was taken) and our address; the
                // node-side link only if we made it (IfaceInUse means it belongs to
                // another pod).
                let name_taken = matches!(&e, DataplaneError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::AlreadyExists);
                if !name_taken {
                    let _ = delete_netns(&net.netns);
                }
                if !matches!(e, DataplaneError::IfaceInUse { .. }) {
                    let _ = run(
                        None,
                        &["ip", "-n", &st.plan.netns, "link", "del", &net.iface],
                        None,
                    );
                }
                self.free_ip(st, &net);
                Err(e)
            }
        }
    }

    fn build_pod(&self, st: &NodeState, net: &PodNet, sandbox: Sandbox<'_>) -> Result<()> {
        let pod_if = match sandbox {
            Sandbox::Own => {
                run(None, &["ip", "netns", "add", &net.netns], None)?;
                "eth0"
            }
            Sandbox::Attached { netns, ifname } => {
                bind_netns(netns, &net.netns)?;
                ifname
            }
        };
        let mut node = vec![format!(
            "link add {} address {WORKLOAD_MAC} type veth peer name {pod_if} netns {}",
            net.iface, net.netns
        )];
        if net.ip6.is_some() {
            // The kernel would derive the same EUI-64 address once the link is up; put it
            // there explicitly (and without DAD) so it is there from the first packet.
            node.push(format!(
                "addr add {POD_GATEWAY6}/64 dev {} nodad",
                net.iface
            ));
        }
        node.push(format!("link set {} up", net.iface));
        node.push(format!(
            "route add {}/32 dev {} scope link",
            net.ip, net.iface
        ));
        if let Some(ip6) = net.ip6 {
            node.push(format!("route add {ip6}/128 dev {}", net.iface));
        }
        ip_batch(Some(&st.plan.netns), &node)?;
        let mut pod = vec![
            "link set lo up".to_owned(),
            format!("addr add {}/32 dev {pod_if}", net.ip),
        ];
        if let Some(ip6) = net.ip6 {
            pod.push(format!("addr add {ip6}/128 dev {pod_if} nodad"));
        }
        pod.extend([
            format!("link set {pod_if} up"),
            format!("route add {POD_GATEWAY} dev {pod_if} scope link"),
            format!("route add default via {POD_GATEWAY} dev {pod_if}"),
            format!("neigh add {POD_GATEWAY} lladdr {WORKLOAD_MAC} dev {pod_if} nud permanent"),
        ]);
        if net.ip6.is_some() {
            pod.extend([
                format!(
                    "neigh add {POD_GATEWAY6} lladdr {WORKLOAD_MAC} dev {pod_if} nud permanent"
                ),
                format!("route add ::/0 via {POD_GATEWAY6} dev {pod_if}"),
            ]);
        }
        ip_batch(Some(&net.netns), &pod)
    }

    /// The hardware address of interface `ifname` in `pod`'s netns
    /// (`ip -o link show dev IFNAME`, the word after `link/ether`), e.g.
    /// `"2a:5e:0b:7c:11:03"`. Errors: `ip` failure (netns or interface missing),
    /// [`DataplaneError::Missing`] when the line has no `link/ether`.
    pub fn pod_iface_mac(&self, pod: &PodNet, ifname: &str) -> Result<String> {
        let out = run(
            None,
            &["ip", "-n", &pod.netns, "-o", "link", "show", "dev", ifname],
            None,
        )?;
        out.split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .map(str::to_owned)
            .ok_or_else(|| DataplaneError::Missing {
                node: pod.node.clone(),
                what: format!("MAC of {ifname} in netns {}", pod.netns),
            })
    }

    /// CNI CHECK of a pod made by [`Dataplane::attach_pod`] (or `add_pod`, `ifname`
    /// `eth0`): the node-side veth exists and its peer is in the pod's netns, the node
    /// routes `<ip>/32` via it, and `ifname` in the pod's netns carries `<ip>/32` and the
    /// default route via [`POD_GATEWAY`]. Errors: the first thing missing, as
    /// [`DataplaneError::Missing`]; an `ip` failure other than "not found".
    pub fn check_pod(&self, pod: &PodNet, ifname: &str) -> Result<()> {
        let st = self.node(&pod.node)?;
        let missing = |what: String| DataplaneError::Missing {
            node: pod.node.clone(),
            what,
        };
        if !iface_peer_in(&st.plan.netns, &pod.iface, &pod.netns) {
            return Err(missing(format!(
                "veth {} with its peer in netns {}",
                pod.iface, pod.netns
            )));
        }
        let route = run(
            None,
            &[
                "ip",
                "-n",
                &st.plan.netns,
                "-o",
                "route",
                "show",
                &format!("{}/32", pod.ip),
            ],
            None,
        )?;
        if !route.contains(&format!("dev {} ", pod.iface)) {
            return Err(missing(format!("route {}/32 dev {}", pod.ip, pod.iface)));
        }
        let addr = run(
            None,
            &[
                "ip", "-n", &pod.netns, "-o", "-4", "addr", "show", "dev", ifname,
            ],
            None,
        )
        .map_err(|_| missing(format!("{ifname} in netns {}", pod.netns)))?;
        if !addr.contains(&format!("inet {}/32 ", pod.ip)) {
            return Err(missing(format!(
                "{}/32 on {ifname} in netns {}",
                pod.ip, pod.netns
            )));
        }
        let default = run(
            None,
            &["ip", "-n", &pod.netns, "-o", "route", "show", "default"],
            None,
        )?;
        if !default.contains(&format!("via {POD_GATEWAY} dev {ifname}")) {
            return Err(missing(format!(
                "default route via {POD_GATEWAY} dev {ifname} in netns {}",
                pod.netns
            )));
        }
        Ok(())
    }

    fn free_ip(&self, st: &NodeState, net: &PodNet) {
        let off = u32::from(net.ip).wrapping_sub(u32::from(st.plan.pod_cidr.addr));
        let mut b = st.block.lock().unwrap_or_else(|p| p.into_inner());
        if b.used.get(&off).is_some_and(|u| *u == net.uid) {
            b.used.remove(&off);
            b.free.push_back(off);
        }
    }

    /// CNI DEL: removes the IP from the allow set (and its NetworkPolicy rules), deletes the node-side veth (the pod
    /// end goes with it), kills any process still in the pod netns, deletes the netns,
    /// removes a leftover `/32` route and frees the IP (only if this pod still holds it).
    /// Idempotent: parts already gone are skipped. Errors: the first real failure.
    pub fn remove_pod(&self, pod: &PodNet) -> Result<()> {
        self.remove_pod_in(pod, true)
    }

    /// CNI DEL of a pod made by [`Dataplane::attach_pod`]: as [`Dataplane::remove_pod`]
    /// but no process in the namespace is killed (they are the container runtime's) and
    /// only the `/run/netns` bind mount is removed, never the runtime's netns file.
    /// Idempotent. Errors: the first real failure.
    pub fn detach_pod(&self, pod: &PodNet) -> Result<()> {
        self.remove_pod_in(pod, false)
    }

    fn remove_pod_in(&self, pod: &PodNet, kill: bool) -> Result<()> {
        let st = self.node(&pod.node)?;
        let mut first_err = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                if !is_gone(&e) && first_err.is_none() {
                    first_err = Some(e);
                }
            }
        };
        note(self.forget(&pod.node, pod.ip));
        // Only our own veth: a recreated same-name pod on this node may own the name now.
        let ours = iface_peer_in(&st.plan.netns, &pod.iface, &pod.netns);
        if ours {
            note(
                run(
                    None,
                    &["ip", "-n", &st.plan.netns, "link", "del", &pod.iface],
                    None,
                )
                .map(drop),
            );
        }
        if kill {
            kill_netns_pids(std::slice::from_ref(&pod.netns));
        }
        note(delete_netns(&pod.netns));
        // Our IP is still allocated to us, so an `<ip>/32` route can only be ours.
        note(self.remove_pod_route(&pod.node, pod.ip));
        self.free_ip(st, pod);
        first_err.map_or(Ok(()), Err)
    }

    /// Programs an endpoint: adds `ip` to `node`'s allow set (forwarded traffic from/to
    /// its `cali*` interface flows). Idempotent. Errors: unknown node, `nft` failure.
    ///
    /// On a dual-stack plan the pod's IPv6 address ([`NodePlan::ipv6_of`]) goes into
    /// [`NFT_SET6`] in the same nftables transaction: both families of an endpoint are
    /// programmed together, never one without the other.
    pub fn allow(&self, node: &str, ip: Ipv4Addr) -> Result<()> {
        let st = self.node(node)?;
        let mut script = format!("add element inet {NFT_TABLE} {NFT_SET} {{ {ip} }}\n");
        if let Some(ip6) = st.plan.ipv6_of(ip) {
            script.push_str(&format!(
                "add element inet {NFT_TABLE} {NFT_SET6} {{ {ip6} }}\n"
            ));
        }
        run(Some(&st.plan.netns), &["nft", "-f", "-"], Some(&script)).map(drop)
    }

    /// Turns `node`'s readiness gate on or off (see [`NFT_INPUT`]). Idempotent when
    /// called with the state it is in only if the caller tracks it: each call rewrites
    /// the chain. Errors: unknown node, `nft` failure.
    pub fn set_readiness_gate(&self, node: &str, on: bool) -> Result<()> {
        let st = self.node(node)?;
        let mut script = format!("flush chain inet {NFT_TABLE} {NFT_INPUT}\n");
        if on {
            script.push_str(&format!(
                "add rule inet {NFT_TABLE} {NFT_INPUT} iifname \"cali*\" ip saddr != @{NFT_SET} drop\n"
            ));
            if st.plan.ipv6.is_some() {
                // Neighbour discovery stays open: the node must resolve the pod's /128.
                script.push_str(&format!(
                    "add rule inet {NFT_TABLE} {NFT_INPUT} iifname \"cali*\" icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept\n\
                     add rule inet {NFT_TABLE} {NFT_INPUT} iifname \"cali*\" ip6 saddr != @{NFT_SET6} drop\n"
                ));
            }
        }
        run(Some(&st.plan.netns), &["nft", "-f", "-"], Some(&script)).map(drop)
    }

    /// (Re)arms the `first_connections_dropped` budget of `ip` on `node` without touching
    /// the allow set: from now on the node drops the next `drop_first_syns` new TCP
    /// connections (SYNs without ACK) it would forward from or to `ip`, then lets every
    /// later one through (see [`NFT_FCD_MAP`]). Arming again resets the budget; an IP
    /// not (yet) in the allow set spends none of it, its packets are dropped before.
    /// Errors: unknown node, `nft` failure.
    pub fn arm_first_syn_drops(
        &self,
        node: &str,
        ip: Ipv4Addr,
        drop_first_syns: u32,
    ) -> Result<()> {
        let st = self.node(node)?;
        let chain = fcd_chain(ip);
        let script = format!(
            "add chain inet {NFT_TABLE} {chain}\n\
             flush chain inet {NFT_TABLE} {chain}\n\
             add rule inet {NFT_TABLE} {chain} limit rate 1/week burst {drop_first_syns} packets counter drop\n\
             add element inet {NFT_TABLE} {NFT_FCD_MAP} {{ {ip} : jump {chain} }}\n"
        );
        run(Some(&st.plan.netns), &["nft", "-f", "-"], Some(&script)).map(drop)
    }

    /// Removes `ip` from `node`'s allow set and any `first_connections_dropped` state of
    /// it (add-then-delete in one nft transaction, so it succeeds whether or not the IP
    /// was there). Errors: unknown node, `nft` failure.
    pub fn disallow(&self, node: &str, ip: Ipv4Addr) -> Result<()> {
        let st = self.node(node)?;
        run(
            Some(&st.plan.netns),
            &["nft", "-f", "-"],
            Some(&disallow_script(ip, st.plan.ipv6_of(ip))),
        )
        .map(drop)
    }

    /// Writes the NetworkPolicy rules of some of `node`'s pods (each pod's complete rules
    /// for both directions, [`crate::netpol::PodPolicy`]) and, when `allow` is given,
    /// adds that IP to the allow set — all in one nftables transaction, so a new pod's
    /// isolation goes in with its endpoint, never after it. Per pod and direction: a
    /// chain `pin_<ip>` / `pout_<ip>` with one `return` rule per admitted peer and port
    /// range and a final `drop`, referenced from [`NFT_POLICY_IN`] / [`NFT_POLICY_OUT`]
    /// while the direction is isolated (see [`NFT_POLICY_CHAIN`]); a direction neither
    /// isolated nor admitting anybody has neither. Errors: unknown node, `nft` failure
    /// (nothing changed then).
    pub fn write_policies(
        &self,
        node: &str,
        pods: &[(Ipv4Addr, &crate::netpol::PodPolicy)],
        allow: Option<Ipv4Addr>,
    ) -> Result<()> {
        let st = self.node(node)?;
        let mut script = String::new();
        for (ip, p) in pods {
            script.push_str(&policy_script(*ip, p));
        }
        if let Some(ip) = allow {
            script.push_str(&format!(
                "add element inet {NFT_TABLE} {NFT_SET} {{ {ip} }}\n"
            ));
            if let Some(ip6) = st.plan.ipv6_of(ip) {
                script.push_str(&format!(
                    "add element inet {NFT_TABLE} {NFT_SET6} {{ {ip6} }}\n"
                ));
            }
        }
        run(Some(&st.plan.netns), &["nft", "-f", "-"], Some(&script)).map(drop)
    }

    /// A pod's sandbox is going away: [`Dataplane::disallow`] plus its NetworkPolicy
    /// chains and map entries, in one transaction (succeeds whether or not they were
    /// there). Errors: unknown node, `nft` failure.
    pub fn forget(&self, node: &str, ip: Ipv4Addr) -> Result<()> {
        let st = self.node(node)?;
        let mut script = disallow_script(ip, st.plan.ipv6_of(ip));
        script.push_str(&policy_script(ip, &crate::netpol::PodPolicy::default()));
        run(Some(&st.plan.netns), &["nft", "-f", "-"], Some(&script)).map(drop)
    }

    /// Routes `cidr` out of `node`'s `eth0` (`ip route replace CIDR dev eth0`): the
    /// service CIDR for node-local ClusterIP clients when real kube-proxy runs (a real
    /// node reaches them through its default route; the testbed's nodes have none).
    /// Errors: unknown node, `ip` failure.
    pub fn route_via_eth0(&self, node: &str, cidr: &str) -> Result<()> {
        let st = self.node(node)?;
        run(
            None,
            &[
                "ip",
                "-n",
                &st.plan.netns,
                "route",
                "replace",
                cidr,
                "dev",
                "eth0",
            ],
            None,
        )
        .map(drop)
    }

    /// Removes `node`'s routes to `peer`'s pod blocks, every family the plan has (fault
    /// `cross_node`). Idempotent. Errors: unknown node or peer, `ip` failure.
    pub fn remove_peer_route(&self, node: &str, peer: &str) -> Result<()> {
        self.remove_peer_route_family(node, peer, IpFamily::Ipv4)?;
        if self.plan.has_ipv6() {
            self.remove_peer_route_family(node, peer, IpFamily::Ipv6)?;
        }
        Ok(())
    }

    /// Puts `node`'s routes to `peer`'s pod blocks back, every family the plan has (as
    /// built). Idempotent. Errors: unknown node or peer, `ip` failure.
    pub fn restore_peer_route(&self, node: &str, peer: &str) -> Result<()> {
        self.restore_peer_route_family(node, peer, IpFamily::Ipv4)?;
        if self.plan.has_ipv6() {
            self.restore_peer_route_family(node, peer, IpFamily::Ipv6)?;
        }
        Ok(())
    }

    /// `node`'s route to `peer`'s pod block of `family` as built: `(block, via)`, e.g.
    /// `("10.7.2.0/24", "172.20.7.12")`. Errors: unknown node or peer,
    /// [`DataplaneError::Missing`] for `ipv6` on an IPv4-only plan.
    fn peer_route(&self, node: &str, peer: &str, family: IpFamily) -> Result<(String, String)> {
        self.node(node)?;
        let p = self.node(peer)?;
        match family {
            IpFamily::Ipv4 => Ok((p.plan.pod_cidr.to_string(), p.plan.ip.to_string())),
            IpFamily::Ipv6 => p
                .plan
                .ipv6
                .map(|v6| (v6.pod_cidr.to_string(), v6.ip.to_string()))
                .ok_or_else(|| DataplaneError::Missing {
                    node: node.to_owned(),
                    what: "IPv6 (the testbed is IPv4-only)".into(),
                }),
        }
    }

    /// Removes `node`'s route of `family` to `peer`'s pod block (faults `cross_node`,
    /// `family_broken`): that family's traffic from `node` to `peer`'s pods has no route
    /// any more (the nodes have no default route). Idempotent. Errors: unknown node or
    /// peer, `ipv6` on an IPv4-only plan, `ip` failure.
    pub fn remove_peer_route_family(&self, node: &str, peer: &str, family: IpFamily) -> Result<()> {
        let (block, _) = self.peer_route(node, peer, family)?;
        let st = self.node(node)?;
        match run(
            None,
            &["ip", "-n", &st.plan.netns, "route", "del", &block],
            None,
        ) {
            Err(e) if is_gone(&e) => Ok(()),
            r => r.map(drop),
        }
    }

    /// Puts `node`'s route of `family` to `peer`'s pod block back (`<block> via <peer's
    /// node address of that family>`, as built). Idempotent. Errors: as
    /// [`Dataplane::remove_peer_route_family`].
    pub fn restore_peer_route_family(
        &self,
        node: &str,
        peer: &str,
        family: IpFamily,
    ) -> Result<()> {
        let (block, via) = self.peer_route(node, peer, family)?;
        let st = self.node(node)?;
        run(
            None,
            &[
                "ip",
                "-n",
                &st.plan.netns,
                "route",
                "replace",
                &block,
                "via",
                &via,
            ],
            None,
        )
        .map(drop)
    }

    /// Makes the faults on `node`'s network exactly `want` (fault primitives
    /// `link_mtu`, `encap_mtu`, `proto_drop`; what a rule no longer sets is undone).
    /// Nothing is ever answered with an ICMP error: every drop is silent.
    ///
    /// - `link_mtu: N`: the node's bridge port (`vn<i>` in the host netns) gets MTU N
    ///   (its MTU before is restored when the fault goes); the node's `eth0` keeps its
    ///   own, so the node neither fragments nor sends "fragmentation needed". Linux drops
    ///   larger frames on the link itself, silently (a bridge has no address to answer
    ///   from): the veth drops a frame from the node longer than the port's MTU +
    ///   Ethernet header + 4 bytes of VLAN slack (`__is_skb_forwardable`, counted in the
    ///   port's `rx_dropped`); towards the node the bridge checks the port it would leave
    ///   by — with br_netfilter on (as on this machine: `net.bridge.bridge-nf-call-iptables`
    ///   is 1 in new namespaces) `br_nf_dev_queue_xmit` drops a DF packet longer than the
    ///   MTU, else `br_dev_queue_push_xmit` allows the same 4 bytes of slack. By those
    ///   rules, for DF packets: from the node up to N + 4 bytes pass, to it up to N (N + 4
    ///   with `bridge-nf-call-iptables` 0); the tests hold only that full-size packets
    ///   (the pod MTU, well above N) vanish both ways. The bridge
    ///   follows its smallest port (`br0`'s MTU drops to N too), so the host netns
    ///   (API server) sends at most N to every node and TCP between a node and the host
    ///   negotiates segments that fit: the control plane keeps working.
    /// - `encap_mtu: N`: IP packets longer than N bytes whose source (leaving the node)
    ///   or destination (reaching it) is in the node's pod block are dropped on its
    ///   bridge port: nftables table [`link_table`] in the host netns (family `netdev`,
    ///   `ingress` and `egress` hooks of the port), matching `ip length` — the IPv4
    ///   header's total length; `meta length` would be the same at `ingress` but include
    ///   the 14-byte Ethernet header at `egress` (measured). Same-node traffic never
    ///   reaches the port.
    /// - Both size limits see single frames only because, while either is in force on
    ///   any node, every sender onto the underlay (each node's `eth0`, the host's `br0`)
    ///   has `gso_max_segs 1`: a pod's TCP hands its veth GSO batches of up to 64 KB
    ///   that cross veths and the bridge whole (measured: 25 KB on average for a 200 KB
    ///   reply, in the node's forward hook, with `ip length` = `meta length` = the
    ///   batch) and pass the MTU checks above (they are exempt as "to be segmented
    ///   later"); with `gso_max_segs 1` Linux segments them when they leave for the
    ///   underlay, as a NIC's TSO does before the wire. Restored when no size limit is
    ///   left.
    /// - `proto_drop`: table [`NFT_FAULT_TABLE`] in the node netns ([`proto_drop_script`]).
    ///
    /// Errors: unknown node, an `ip`/`nft` failure (what was done before it stays and is
    /// reported by [`Dataplane::net_faults`], so calling again finishes the job).
    pub fn set_net_faults(&self, node: &str, want: &NetFaults) -> Result<()> {
        let st = self.node(node)?;
        let port = self
            .plan
            .bridge_port(node)
            .ok_or_else(|| DataplaneError::UnknownNode(node.to_owned()))?;
        let mut net = self.net.lock().unwrap_or_else(|p| p.into_inner());
        let mut cur = net.faults.get(node).cloned().unwrap_or_default();
        let r = self.apply_net_faults(&mut net, st, &port, &mut cur, want);
        if cur == NetFaults::default() {
            net.faults.remove(node);
        } else {
            net.faults.insert(node.to_owned(), cur);
        }
        if !net.faults.values().any(NetFaults::limits_size) {
            if let Some(saved) = net.segmenting.take() {
                if let Err(e) = restore_segmentation(&saved) {
                    net.segmenting = Some(saved);
                    return r.and(Err(e));
                }
            }
        }
        r
    }

    fn apply_net_faults(
        &self,
        net: &mut NetState,
        st: &NodeState,
        port: &str,
        cur: &mut NetFaults,
        want: &NetFaults,
    ) -> Result<()> {
        let host = self.plan.host_netns.as_str();
        // Segmentation first: no GSO batch may meet a size limit.
        if want.limits_size() && net.segmenting.is_none() {
            net.segmenting = Some(self.segment_underlay()?);
        }
        if cur.proto_drop != want.proto_drop {
            let script = proto_drop_script(want.proto_drop.as_ref());
            run(Some(&st.plan.netns), &["nft", "-f", "-"], Some(&script))?;
            cur.proto_drop = want.proto_drop.clone();
        }
        if cur.encap_mtu != want.encap_mtu {
            let script = encap_script(port, st.plan.pod_cidr, want.encap_mtu);
            run(Some(host), &["nft", "-f", "-"], Some(&script))?;
            cur.encap_mtu = want.encap_mtu;
        }
        if cur.link_mtu != want.link_mtu {
            let mtu = match want.link_mtu {
                Some(m) => {
                    if !net.port_mtu.contains_key(port) {
                        let before = link_attr(host, port, "mtu")?;
                        net.port_mtu.insert(port.to_owned(), before);
                    }
                    u64::from(m)
                }
                None => net.port_mtu.get(port).copied().unwrap_or(1500),
            };
            let mtu = mtu.to_string();
            run(
                None,
                &["ip", "-n", host, "link", "set", "dev", port, "mtu", &mtu],
                None,
            )?;
            if want.link_mtu.is_none() {
                net.port_mtu.remove(port);
            }
            cur.link_mtu = want.link_mtu;
        }
        Ok(())
    }

    /// Sets `gso_max_segs 1` on every sender onto the underlay (each node's `eth0`, the
    /// host's `br0`) and returns what each had, to restore; on a failure part-way
    /// restores the ones done.
    fn segment_underlay(&self) -> Result<Vec<(String, &'static str, u64)>> {
        let mut senders: Vec<(String, &'static str)> = self
            .plan
            .nodes
            .iter()
            .map(|n| (n.netns.clone(), UNDERLAY_IFACE))
            .collect();
        senders.push((self.plan.host_netns.clone(), "br0"));
        let mut saved = Vec::new();
        for (ns, dev) in senders {
            let r = link_attr(&ns, dev, "gso_max_segs")
                .and_then(|before| set_gso_max_segs(&ns, dev, 1).map(|()| before));
            match r {
                Ok(before) => saved.push((ns, dev, before)),
                Err(e) => {
                    let _ = restore_segmentation(&saved);
                    return Err(e);
                }
            }
        }
        tracing::info!(prefix = %self.plan.prefix, "underlay segments GSO batches (a size limit is in force)");
        Ok(saved)
    }

    /// The faults on `node`'s network in force now ([`Dataplane::set_net_faults`]; the
    /// default when none or the node is unknown).
    pub fn net_faults(&self, node: &str) -> NetFaults {
        let net = self.net.lock().unwrap_or_else(|p| p.into_inner());
        net.faults.get(node).cloned().unwrap_or_default()
    }

    /// Whether the underlay's senders segment GSO batches now (a size limit is in force
    /// on some node, see [`Dataplane::set_net_faults`]).
    pub fn underlay_segmented(&self) -> bool {
        let net = self.net.lock().unwrap_or_else(|p| p.into_inner());
        net.segmenting.is_some()
    }

    /// Adds `blackhole <ip>/32` on `node` (fault `stale_routes`: a stale route for a
    /// pod IP that now lives elsewhere). Idempotent. Errors: unknown node, `ip` failure.
    pub fn add_blackhole(&self, node: &str, ip: Ipv4Addr) -> Result<()> {
        let st = self.node(node)?;
        run(
            None,
            &[
                "ip",
                "-n",
                &st.plan.netns,
                "route",
                "replace",
                "blackhole",
                &format!("{ip}/32"),
            ],
            None,
        )
        .map(drop)
    }

    /// Removes the `blackhole <ip>/32` route from `node` again. Idempotent. Errors:
    /// unknown node, `ip` failure.
    pub fn remove_blackhole(&self, node: &str, ip: Ipv4Addr) -> Result<()> {
        let st = self.node(node)?;
        match run(
            None,
            &[
                "ip",
                "-n",
                &st.plan.netns,
                "route",
                "del",
                "blackhole",
                &format!("{ip}/32"),
            ],
            None,
        ) {
            Err(e) if is_gone(&e) => Ok(()),
            r => r.map(drop),
        }
    }

    /// The routes via workload interface `iface` on `node` (`ip route show dev IFACE`),
    /// one per line: the agent's per-interface route sync read, timed for
    /// `felix_route_table_per_iface_sync_seconds`. Errors: unknown node, `ip` failure
    /// (e.g. the interface is gone).
    pub fn iface_routes(&self, node: &str, iface: &str) -> Result<Vec<String>> {
        let st = self.node(node)?;
        let out = run(
            None,
            &["ip", "-n", &st.plan.netns, "route", "show", "dev", iface],
            None,
        )?;
        Ok(out.lines().map(str::to_owned).collect())
    }

    /// Lists `node`'s interfaces (`ip -o link show`) and returns how many are workload
    /// interfaces (`cali*`): the agent's route-table resync list step, timed for
    /// `felix_route_table_list_seconds`. Errors: unknown node, `ip` failure.
    pub fn list_workload_ifaces(&self, node: &str) -> Result<usize> {
        let st = self.node(node)?;
        let out = run(
            None,
            &["ip", "-n", &st.plan.netns, "-o", "link", "show"],
            None,
        )?;
        Ok(out
            .lines()
            .filter(|l| {
                l.split(": ")
                    .nth(1)
                    .is_some_and(|name| name.starts_with("cali"))
            })
            .count())
    }

    /// The IPs currently in `node`'s allow set.
    pub fn allowed(&self, node: &str) -> Result<Vec<Ipv4Addr>> {
        let st = self.node(node)?;
        let out = run(
            Some(&st.plan.netns),
            &["nft", "-j", "list", "set", "inet", NFT_TABLE, NFT_SET],
            None,
        )?;
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| DataplaneError::Io {
            what: "parse `nft -j list set`".into(),
            source: std::io::Error::other(e),
        })?;
        let mut ips = Vec::new();
        for item in v["nftables"].as_array().into_iter().flatten() {
            for el in item["set"]["elem"].as_array().into_iter().flatten() {
                if let Some(ip) = el.as_str().and_then(|s| s.parse().ok()) {
                    ips.push(ip);
                }
            }
        }
        Ok(ips)
    }

    /// Removes the node-side `<ip>/32` route on `node` (fault `name_reuse_race`).
    /// Idempotent (a missing route is fine). Errors: unknown node, `ip` failure.
    pub fn remove_pod_route(&self, node: &str, ip: Ipv4Addr) -> Result<()> {
        let st = self.node(node)?;
        match run(
            None,
            &[
                "ip",
                "-n",
                &st.plan.netns,
                "route",
                "del",
                &format!("{ip}/32"),
            ],
            None,
        ) {
            Err(e) if is_gone(&e) => Ok(()),
            r => r.map(drop),
        }
    }
}

/// [`Dataplane::disallow`]'s transaction (`ip6`: the pod's IPv6 address on a dual-stack
/// plan, removed from [`NFT_SET6`] in the same transaction).
fn disallow_script(ip: Ipv4Addr, ip6: Option<Ipv6Addr>) -> String {
    let chain = fcd_chain(ip);
    let v6 = ip6.map_or(String::new(), |ip6| {
        format!(
            "add element inet {NFT_TABLE} {NFT_SET6} {{ {ip6} }}\n\
             delete element inet {NFT_TABLE} {NFT_SET6} {{ {ip6} }}\n"
        )
    });
    v6 + &format!(
        "add element inet {NFT_TABLE} {NFT_SET} {{ {ip} }}\n\
         delete element inet {NFT_TABLE} {NFT_SET} {{ {ip} }}\n\
         add chain inet {NFT_TABLE} {chain}\n\
         flush chain inet {NFT_TABLE} {chain}\n\
         add element inet {NFT_TABLE} {NFT_FCD_MAP} {{ {ip} : jump {chain} }}\n\
         delete element inet {NFT_TABLE} {NFT_FCD_MAP} {{ {ip} }}\n\
         delete chain inet {NFT_TABLE} {chain}\n"
    )
}

/// Name of a pod's NetworkPolicy chain: `pin_<a>_<b>_<c>_<d>` (ingress) or
/// `pout_…` (egress).
fn policy_chain(dir: crate::netpol::Direction, ip: Ipv4Addr) -> String {
    let o = ip.octets();
    let d = match dir {
        crate::netpol::Direction::Ingress => "pin",
        crate::netpol::Direction::Egress => "pout",
    };
    format!("{d}_{}_{}_{}_{}", o[0], o[1], o[2], o[3])
}

/// The nftables commands that make pod `ip`'s policy state exactly `p`
/// ([`Dataplane::write_policies`]), each direction rewritten whole and idempotent
/// (add-then-delete for what must go).
fn policy_script(ip: Ipv4Addr, p: &crate::netpol::PodPolicy) -> String {
    use crate::netpol::{Direction, PeerMatch, Ports};
    use std::fmt::Write as _;
    let mut s = String::new();
    for d in Direction::BOTH {
        let dir = p.dir(d);
        let chain = policy_chain(d, ip);
        let (map, addr) = match d {
            Direction::Ingress => (NFT_POLICY_IN, "ip saddr"),
            Direction::Egress => (NFT_POLICY_OUT, "ip daddr"),
        };
        let t = format!("inet {NFT_TABLE}");
        let _ = writeln!(s, "add chain {t} {chain}");
        let _ = writeln!(s, "flush chain {t} {chain}");
        let _ = writeln!(s, "add element {t} {map} {{ {ip} : jump {chain} }}");
        if dir.isolated_by.is_none() {
            let _ = writeln!(s, "delete element {t} {map} {{ {ip} }}");
            if dir.admits.is_empty() {
                let _ = writeln!(s, "delete chain {t} {chain}");
                continue;
            }
        }
        for a in dir.admits.values() {
            let peer = match &a.peer {
                PeerMatch::Any => String::new(),
                PeerMatch::Net { cidr, except } if except.is_empty() => format!("{addr} {cidr} "),
                PeerMatch::Net { cidr, except } => format!(
                    "{addr} {cidr} {addr} != {{ {} }} ",
                    except
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            match &a.ports {
                Ports::All => {
                    let _ = writeln!(s, "add rule {t} {chain} {peer}return");
                }
                Ports::Only(ranges) => {
                    for r in ranges {
                        let port = match r.ports {
                            None => String::new(),
                            Some((a, b)) if a == b => format!("th dport {a} "),
                            Some((a, b)) => format!("th dport {a}-{b} "),
                        };
                        let _ = writeln!(
                            s,
                            "add rule {t} {chain} {peer}meta l4proto {} {port}return",
                            r.protocol.nft()
                        );
                    }
                }
            }
        }
        let _ = writeln!(s, "add rule {t} {chain} counter drop");
    }
    s
}

/// Attribute `key` (a number: `mtu`, `gso_max_segs`) of device `dev` in netns `netns`
/// (`ip -j -d link show`). Errors: `ip` failure, [`DataplaneError::Missing`] when the
/// output has no such number.
fn link_attr(netns: &str, dev: &str, key: &str) -> Result<u64> {
    let out = run(
        None,
        &["ip", "-n", netns, "-j", "-d", "link", "show", "dev", dev],
        None,
    )?;
    serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v[0][key].as_u64())
        .ok_or_else(|| DataplaneError::Missing {
            node: netns.to_owned(),
            what: format!("{key} of {dev} in `ip -j -d link show`"),
        })
}

fn set_gso_max_segs(netns: &str, dev: &str, segs: u64) -> Result<()> {
    let segs = segs.to_string();
    run(
        None,
        &[
            "ip",
            "-n",
            netns,
            "link",
            "set",
            "dev",
            dev,
            "gso_max_segs",
            &segs,
        ],
        None,
    )
    .map(drop)
}

/// Puts every sender's `gso_max_segs` back; a device already gone is fine. Errors: the
/// first other failure (the rest are still tried).
fn restore_segmentation(saved: &[(String, &'static str, u64)]) -> Result<()> {
    let mut first = None;
    for (ns, dev, segs) in saved {
        if let Err(e) = set_gso_max_segs(ns, dev, *segs) {
            if !is_gone(&e) {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// The nft transaction making a node's `proto_drop` state exactly `p`: table
/// [`NFT_FAULT_TABLE`] added, deleted and, with a fault, written anew (one transaction,
/// whether or not it was there). Its `forward` chain ([`NFT_FAULT_PRIORITY`]) drops the
/// protocols' packets from and to `cali*` interfaces: with `cross_node` only those
/// whose other side is [`UNDERLAY_IFACE`], else every forwarded one (same-node pod↔pod
/// too). A pod's traffic with its own node is not forwarded and never dropped.
pub fn proto_drop_script(p: Option<&ProtoDrop>) -> String {
    use std::fmt::Write as _;
    let t = format!("inet {NFT_FAULT_TABLE}");
    let mut s = format!("add table {t}\ndelete table {t}\n");
    let Some(p) = p else { return s };
    let protos: Vec<&str> = p.protocols.iter().map(|x| x.nft()).collect();
    let l4 = match protos.as_slice() {
        [one] => (*one).to_owned(),
        many => format!("{{ {} }}", many.join(", ")),
    };
    let (from_pod, to_pod) = if p.cross_node {
        (
            format!("iifname \"cali*\" oifname \"{UNDERLAY_IFACE}\""),
            format!("iifname \"{UNDERLAY_IFACE}\" oifname \"cali*\""),
        )
    } else {
        (
            "iifname \"cali*\"".to_owned(),
            "oifname \"cali*\"".to_owned(),
        )
    };
    let _ = write!(
        s,
        "table {t} {{\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority {NFT_FAULT_PRIORITY}; policy accept;\n\
         \t\t{from_pod} meta l4proto {l4} counter drop\n\
         \t\t{to_pod} meta l4proto {l4} counter drop\n\
         \t}}\n\
         }}\n"
    );
    s
}

/// The nft transaction (host netns) making node `port`'s `encap_mtu` state exactly
/// `mtu`: table [`link_table`] (family `netdev`) added, deleted and, with a limit,
/// written anew. Chain `from_node` (the port's `ingress`: frames the node sends) drops
/// IPv4 packets from `block` longer than `mtu`, chain `to_node` (its `egress`: frames
/// to the node) those to `block`, by `ip length` (see [`Dataplane::set_net_faults`]).
pub fn encap_script(port: &str, block: Ipv4Cidr, mtu: Option<u32>) -> String {
    use std::fmt::Write as _;
    let t = format!("netdev {}", link_table(port));
    let mut s = format!("add table {t}\ndelete table {t}\n");
    let Some(mtu) = mtu else { return s };
    let _ = write!(
        s,
        "table {t} {{\n\
         \tchain from_node {{\n\
         \t\ttype filter hook ingress device \"{port}\" priority 0; policy accept;\n\
         \t\tip saddr {block} ip length > {mtu} counter drop\n\
         \t}}\n\
         \tchain to_node {{\n\
         \t\ttype filter hook egress device \"{port}\" priority 0; policy accept;\n\
         \t\tip daddr {block} ip length > {mtu} counter drop\n\
         \t}}\n\
         }}\n"
    );
    s
}

/// Name of the per-endpoint `first_connections_dropped` chain: `fcd_<a>_<b>_<c>_<d>`.
fn fcd_chain(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("fcd_{}_{}_{}_{}", o[0], o[1], o[2], o[3])
}

/// Builds the topology; on error the caller sweeps. `gate`: the simulated agent's
/// allow-set gate in every node's ruleset ([`node_ruleset`]).
fn build(plan: &Plan, gate: bool) -> Result<()> {
    // 1. Namespaces.
    let mut lines = vec![format!("netns add {}", plan.host_netns)];
    lines.extend(plan.nodes.iter().map(|n| format!("netns add {}", n.netns)));
    ip_batch(None, &lines)?;
    // 2. Node sysctls before any interface exists there, so `default` covers them all.
    for n in &plan.nodes {
        sysctls(
            &n.netns,
            &[
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ],
        )?;
        if plan.has_ipv6() {
            sysctls(
                &n.netns,
                &[
                    ("net.ipv6.conf.all.forwarding", "1"),
                    ("net.ipv6.conf.all.accept_dad", "0"),
                    ("net.ipv6.conf.default.accept_dad", "0"),
                ],
            )?;
        }
    }
    if plan.has_ipv6() {
        sysctls(
            &plan.host_netns,
            &[
                ("net.ipv6.conf.all.accept_dad", "0"),
                ("net.ipv6.conf.default.accept_dad", "0"),
            ],
        )?;
    }
    // 3. Host side: bridge and one veth per node.
    let mut host = vec![
        "link set lo up".to_owned(),
        "link add br0 type bridge forward_delay 0 stp_state 0".to_owned(),
        format!("addr add {}/24 dev br0", plan.bridge_ip),
        "link set br0 up".to_owned(),
    ];
    if let Some(b6) = plan.bridge_ip6 {
        host.push(format!("addr add {b6}/64 dev br0 nodad"));
    }
    for n in &plan.nodes {
        let vn = plan
            .bridge_port(&n.name)
            .ok_or_else(|| DataplaneError::UnknownNode(n.name.clone()))?;
        host.push(format!(
            "link add {vn} type veth peer name {UNDERLAY_IFACE} netns {}",
            n.netns
        ));
        host.push(format!("link set {vn} master br0"));
        host.push(format!("link set {vn} up"));
    }
    ip_batch(Some(&plan.host_netns), &host)?;
    // 4. Nodes: address, blackhole for the own block, peers' blocks via their node IPs.
    for n in &plan.nodes {
        let mut l = vec![
            "link set lo up".to_owned(),
            format!("addr add {}/24 dev eth0", n.ip),
            "link set eth0 up".to_owned(),
            format!("route add blackhole {}", n.pod_cidr),
        ];
        for p in plan.nodes.iter().filter(|p| p.name != n.name) {
            l.push(format!("route add {} via {}", p.pod_cidr, p.ip));
        }
        if let Some(v6) = n.ipv6 {
            l.push(format!("addr add {}/64 dev eth0 nodad", v6.ip));
            l.push(format!("route add blackhole {}", v6.pod_cidr));
            for p in plan.nodes.iter().filter(|p| p.name != n.name) {
                if let Some(p6) = p.ipv6 {
                    l.push(format!("route add {} via {}", p6.pod_cidr, p6.ip));
                }
            }
        }
        ip_batch(Some(&n.netns), &l)?;
        run(
            Some(&n.netns),
            &["nft", "-f", "-"],
            Some(&node_ruleset(gate, plan.has_ipv6())),
        )?;
    }
    // 5. Host routes to every block via its node.
    let mut routes: Vec<String> = plan
        .nodes
        .iter()
        .map(|n| format!("route add {} via {}", n.pod_cidr, n.ip))
        .collect();
    routes.extend(
        plan.nodes
            .iter()
            .filter_map(|n| n.ipv6)
            .map(|v6| format!("route add {} via {}", v6.pod_cidr, v6.ip)),
    );
    ip_batch(Some(&plan.host_netns), &routes)
}

/// Whether `iface` exists in `node_netns` and is the veth whose peer lives in
/// `pod_netns` (so it belongs to that pod). Missing pod netns → true if the iface exists
/// (cannot tell; the old sandbox owns it).
fn iface_peer_in(node_netns: &str, iface: &str, pod_netns: &str) -> bool {
    let Ok(out) = run(
        None,
        &["ip", "-n", node_netns, "-o", "link", "show", "dev", iface],
        None,
    ) else {
        return false;
    };
    // `link-netns <name>` is printed when the peer is in a named netns.
    match out
        .split_whitespace()
        .skip_while(|w| *w != "link-netns")
        .nth(1)
    {
        Some(ns) => ns == pod_netns,
        None => true,
    }
}

/// Netns names under `/run/netns` owned by `prefix`.
pub fn list_netns(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| owned_by_prefix(prefix, n))
        .collect();
    v.sort();
    v
}

/// `(dev, ino)` of a netns file (what `/proc/<pid>/ns/net` also stats to).
fn ns_id(path: &std::path::Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// PIDs (thread-group leaders, like `ip netns pids`) whose netns is one of `names`,
/// never our own.
pub fn netns_pids(names: &[String]) -> Vec<i32> {
    let ids: Vec<(u64, u64)> = names.iter().filter_map(|n| ns_id(&netns_path(n))).collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|&pid| pid != me)
        .filter(|pid| {
            ns_id(std::path::Path::new(&format!("/proc/{pid}/ns/net")))
                .is_some_and(|id| ids.contains(&id))
        })
        .collect()
}

/// SIGKILLs every process in the named netns and waits (≤ 3 s) until none is left.
fn kill_netns_pids(names: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let pids = netns_pids(names);
        if pids.is_empty() {
            return;
        }
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if Instant::now() > deadline {
            tracing::warn!(?pids, "processes still in netns after SIGKILL");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deletes a named netns like `ip netns del` (lazy unmount, then unlink). Missing is
/// fine. The namespace itself dies with its last user.
fn delete_netns(name: &str) -> Result<()> {
    let path = netns_path(name);
    let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataplaneError::Io {
            what: format!("delete netns {name}"),
            source,
        }),
    }
}

/// Bind-mounts the network namespace file `src` onto `/run/netns/<name>` (creating the
/// mount point), as `ip netns attach` does for a process's namespace. Errors:
/// [`DataplaneError::Io`] (the mount point file is removed again).
fn bind_netns(src: &std::path::Path, name: &str) -> Result<()> {
    let target = netns_path(name);
    let io = |what: String| move |source| DataplaneError::Io { what, source };
    std::fs::create_dir_all("/run/netns").map_err(io("create /run/netns".into()))?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&target)
        .map_err(io(format!("create {}", target.display())))?;
    if let Err(e) = nix::mount::mount(
        Some(src),
        &target,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    ) {
        let _ = std::fs::remove_file(&target);
        return Err(DataplaneError::Io {
            what: format!("bind-mount {} on {}", src.display(), target.display()),
            source: e.into(),
        });
    }
    Ok(())
}

/// Removes every trace of the testbed with netns prefix `prefix`: kills every process
/// in any `<prefix>-*` netns (SIGKILL, waiting until they are gone), then deletes those
/// netns (their veths, routes and nftables tables go with them). A container runtime's
/// namespace attached with [`Dataplane::attach_pod`] loses only its `/run/netns` bind
/// mount (the runtime's own file stays; its processes are killed like any other in a
/// `<prefix>-*` netns). Idempotent; needs only the prefix, so it works after a crash.
/// Errors: a netns file that cannot be removed.
pub fn sweep(prefix: &str) -> Result<()> {
    let names = list_netns(prefix);
    if names.is_empty() {
        return Ok(());
    }
    kill_netns_pids(&names);
    let mut first_err = None;
    for n in &names {
        if let Err(e) = delete_netns(n) {
            first_err.get_or_insert(e);
        }
    }
    tracing::info!(prefix, netns = names.len(), "swept testbed namespaces");
    first_err.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iface_name_matches_calico() {
        // `echo -n default.nginx | sha1sum` = c440f455693b69cd…
        let name = calico_iface_name("default", "nginx");
        assert_eq!(name, "calic440f455693");
        assert_eq!(name.len(), 15);
        assert_eq!(calico_iface_name("default", "nginx"), name);
        assert_ne!(calico_iface_name("default", "nginx2"), name);
    }

    #[test]
    fn ruleset_drops_unknown_workloads_both_ways() {
        let off = node_ruleset(false, false);
        assert!(!off.contains("drop"), "{off}");
        assert!(off.contains("chain input"));
        let r = node_ruleset(true, false);
        assert!(
            !r.contains("ip6") && !r.contains("allowed6"),
            "IPv4-only: {r}"
        );
        assert!(r.contains("iifname \"cali*\" ip saddr != @allowed drop"));
        assert!(r.contains("oifname \"cali*\" ip daddr != @allowed drop"));
        assert!(r.contains("hook forward"));
        // SYN-only matches come after the allow-set drops, so only SYNs the node would
        // forward count towards `first_connections_dropped`.
        let allow = r.find("@allowed drop").unwrap();
        let fcd = r.find("ip saddr vmap @fcd").unwrap();
        assert!(allow < fcd);
        assert!(r.contains("tcp flags & (syn | ack) == syn ip daddr vmap @fcd"));
        assert_eq!(fcd_chain(Ipv4Addr::new(10, 7, 1, 2)), "fcd_10_7_1_2");
        // NetworkPolicy: after the allow-set drops, before the first-SYN drops, in the
        // forward hook only (a pod's traffic with its own node is never subject to it).
        let policy = r.find("jump netpol").unwrap();
        assert!(allow < policy && policy < fcd);
        let chain = r.find("chain netpol {").unwrap();
        assert!(
            chain < r.find("chain forward").unwrap(),
            "declared before its use"
        );
        let body = &r[chain..];
        let ct = body.find("ct state established,related accept").unwrap();
        assert!(
            ct < body
                .find("oifname \"cali*\" ip daddr vmap @pol_in")
                .unwrap()
        );
        assert!(body.contains("iifname \"cali*\" ip saddr vmap @pol_out"));
        assert!(
            !off.contains("jump netpol") && !off.contains("pol_in"),
            "real Felix enforces by itself"
        );
        let input = &r[r.find("chain input").unwrap()..];
        assert!(!input.contains("jump netpol") && !input.contains("pol_"));
    }

    #[test]
    fn dual_stack_ruleset_gates_ipv6_like_ipv4() {
        let r = node_ruleset(true, true);
        assert!(r.contains("set allowed6 { type ipv6_addr; }"), "{r}");
        assert!(r.contains("iifname \"cali*\" ip6 saddr != @allowed6 drop"));
        assert!(r.contains("oifname \"cali*\" ip6 daddr != @allowed6 drop"));
        let fwd = r.find("chain forward").unwrap();
        let drop6 = r.find("ip6 saddr != @allowed6").unwrap();
        assert!(fwd < drop6 && drop6 < r.find("jump netpol").unwrap());
        let off = node_ruleset(false, true);
        assert!(off.contains("allowed6") && !off.contains("drop"), "{off}");
        // Both families of an endpoint leave together.
        let ip6: Ipv6Addr = "fd00:1:2:1::5".parse().unwrap();
        let s = disallow_script(Ipv4Addr::new(10, 7, 1, 5), Some(ip6));
        assert!(s.contains("delete element inet firstpacket allowed6 { fd00:1:2:1::5 }"));
        assert!(s.contains("delete element inet firstpacket allowed { 10.7.1.5 }"));
        assert!(!disallow_script(Ipv4Addr::new(10, 7, 1, 5), None).contains("allowed6"));
        assert_eq!(POD_GATEWAY6.to_string(), "fe80::ecee:eeff:feee:eeee");
    }

    #[test]
    fn proto_drop_rules_drop_the_protocols_across_the_underlay_or_everywhere() {
        use crate::fault::DropProtocol;
        let none = proto_drop_script(None);
        assert_eq!(
            none, "add table inet firstpacket_faults\ndelete table inet firstpacket_faults\n",
            "no fault: the table goes (whether or not it was there)"
        );
        let udp = ProtoDrop {
            protocols: [DropProtocol::Udp].into(),
            cross_node: true,
        };
        let s = proto_drop_script(Some(&udp));
        assert!(s.starts_with(&none), "{s}");
        let lines: Vec<&str> = s.lines().map(str::trim).collect();
        assert_eq!(
            lines[2..],
            [
                "table inet firstpacket_faults {",
                "chain forward {",
                "type filter hook forward priority 10; policy accept;",
                "iifname \"cali*\" oifname \"eth0\" meta l4proto udp counter drop",
                "iifname \"eth0\" oifname \"cali*\" meta l4proto udp counter drop",
                "}",
                "}",
            ]
        );
        // Several protocols in one set; same-node too: every forwarded pod packet.
        let all = ProtoDrop {
            protocols: [DropProtocol::Icmp, DropProtocol::Tcp, DropProtocol::Udp].into(),
            cross_node: false,
        };
        let s = proto_drop_script(Some(&all));
        assert!(
            s.contains("\t\tiifname \"cali*\" meta l4proto { tcp, udp, icmp } counter drop\n"),
            "{s}"
        );
        assert!(
            s.contains("\t\toifname \"cali*\" meta l4proto { tcp, udp, icmp } counter drop\n"),
            "{s}"
        );
        assert!(!s.contains("eth0"), "{s}");
        // Never the agent's table.
        assert!(!s.contains(&format!("inet {NFT_TABLE} ")));
    }

    #[test]
    fn encap_rules_drop_long_pod_packets_both_ways_on_the_bridge_port() {
        let block: Ipv4Cidr = "10.7.1.0/24".parse().unwrap();
        assert_eq!(link_table("vn1"), "firstpacket_vn1");
        let none = encap_script("vn1", block, None);
        assert_eq!(
            none,
            "add table netdev firstpacket_vn1\ndelete table netdev firstpacket_vn1\n"
        );
        let s = encap_script("vn1", block, Some(1400));
        assert!(s.starts_with(&none), "{s}");
        let lines: Vec<&str> = s.lines().map(str::trim).collect();
        assert_eq!(
            lines[2..],
            [
                "table netdev firstpacket_vn1 {",
                "chain from_node {",
                "type filter hook ingress device \"vn1\" priority 0; policy accept;",
                "ip saddr 10.7.1.0/24 ip length > 1400 counter drop",
                "}",
                "chain to_node {",
                "type filter hook egress device \"vn1\" priority 0; policy accept;",
                "ip daddr 10.7.1.0/24 ip length > 1400 counter drop",
                "}",
                "}",
            ]
        );
    }

    #[test]
    fn only_size_limits_make_the_underlay_segment() {
        assert!(!NetFaults::default().limits_size());
        let proto = NetFaults {
            proto_drop: Some(ProtoDrop {
                protocols: [crate::fault::DropProtocol::Tcp].into(),
                cross_node: true,
            }),
            ..NetFaults::default()
        };
        assert!(!proto.limits_size());
        for f in [
            NetFaults {
                link_mtu: Some(1400),
                ..NetFaults::default()
            },
            NetFaults {
                encap_mtu: Some(9000),
                ..proto
            },
        ] {
            assert!(f.limits_size(), "{f:?}");
        }
    }

    #[test]
    fn policy_rules_return_admitted_peers_and_ports_and_drop_the_rest() {
        use crate::netpol::{
            Admission, Cidr, DirPolicy, PeerKey, PeerMatch, PodPolicy, PortRange, Ports, Protocol,
        };
        let ip = Ipv4Addr::new(10, 7, 2, 5);
        let admit = |peer: PeerMatch, ports: Ports| Admission {
            policy: "ns/p".into(),
            peer,
            pod: None,
            ports,
        };
        let block = PeerMatch::Net {
            cidr: Cidr::parse("10.9.0.0/16").unwrap().unwrap(),
            except: vec![
                Cidr::parse("10.9.1.0/24").unwrap().unwrap(),
                Cidr::parse("10.9.2.0/24").unwrap().unwrap(),
            ],
        };
        let p = PodPolicy {
            ingress: DirPolicy {
                isolated_by: Some("ns/p".into()),
                admits: [
                    (
                        PeerKey::Pod("u".into()),
                        admit(
                            PeerMatch::Net {
                                cidr: Cidr::host(Ipv4Addr::new(10, 7, 1, 3)),
                                except: vec![],
                            },
                            Ports::Only(
                                [
                                    PortRange {
                                        protocol: Protocol::Tcp,
                                        ports: Some((8080, 8080)),
                                    },
                                    PortRange {
                                        protocol: Protocol::Udp,
                                        ports: Some((5000, 5010)),
                                    },
                                    PortRange {
                                        protocol: Protocol::Sctp,
                                        ports: None,
                                    },
                                ]
                                .into(),
                            ),
                        ),
                    ),
                    (
                        PeerKey::Block {
                            cidr: Cidr::host(ip),
                            except: vec![],
                        },
                        admit(block, Ports::All),
                    ),
                ]
                .into(),
            },
            // Egress: admits programmed ahead of the isolation (chain, no map entry).
            egress: DirPolicy {
                isolated_by: None,
                admits: [(PeerKey::Any, admit(PeerMatch::Any, Ports::All))].into(),
            },
        };
        let s = policy_script(ip, &p);
        let lines: Vec<&str> = s.lines().collect();
        let t = "inet firstpacket";
        assert_eq!(
            lines,
            [
                format!("add chain {t} pin_10_7_2_5"),
                format!("flush chain {t} pin_10_7_2_5"),
                format!("add element {t} pol_in {{ 10.7.2.5 : jump pin_10_7_2_5 }}"),
                format!("add rule {t} pin_10_7_2_5 ip saddr 10.7.1.3/32 meta l4proto tcp th dport 8080 return"),
                format!("add rule {t} pin_10_7_2_5 ip saddr 10.7.1.3/32 meta l4proto udp th dport 5000-5010 return"),
                format!("add rule {t} pin_10_7_2_5 ip saddr 10.7.1.3/32 meta l4proto sctp return"),
                format!("add rule {t} pin_10_7_2_5 ip saddr 10.9.0.0/16 ip saddr != {{ 10.9.1.0/24, 10.9.2.0/24 }} return"),
                format!("add rule {t} pin_10_7_2_5 counter drop"),
                format!("add chain {t} pout_10_7_2_5"),
                format!("flush chain {t} pout_10_7_2_5"),
                format!("add element {t} pol_out {{ 10.7.2.5 : jump pout_10_7_2_5 }}"),
                format!("delete element {t} pol_out {{ 10.7.2.5 }}"),
                format!("add rule {t} pout_10_7_2_5 return"),
                format!("add rule {t} pout_10_7_2_5 counter drop"),
            ]
        );
        // Nothing: both chains and map entries removed (idempotently).
        let s = policy_script(ip, &PodPolicy::default());
        assert!(
            s.ends_with(&format!(
                "add element {t} pol_out {{ 10.7.2.5 : jump pout_10_7_2_5 }}\n\
             delete element {t} pol_out {{ 10.7.2.5 }}\n\
             delete chain {t} pout_10_7_2_5\n"
            )),
            "{s}"
        );
        assert!(s.contains(&format!("delete chain {t} pin_10_7_2_5\n")));
        assert!(!s.contains("add rule"));
    }
}
