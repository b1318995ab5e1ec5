//! Names, subnets and addresses of one testbed, derived from its state dir (docs/design.md §5
//! "Topology": names and subnets derived from the state dir so two testbeds coexist).
//!
//! Everything here lives only inside network namespaces the testbed creates; the host's
//! own interfaces and routes are never touched, so the private ranges below cannot clash
//! with the host's networks.
//!
//! Layout for a plan with hash index `X` (0..=199) and `N` nodes:
//! - netns prefix `fp` + 6 hex chars of SHA-1 of the canonical state-dir path; every
//!   netns the testbed makes is named `<prefix>-…` (host: `<prefix>-host`, node *i*:
//!   `<prefix>-node-<i>`, pods: `<prefix>-p<counter>`);
//! - underlay bridge `br0` in the host netns at `172.20.X.1/24` (the API server listens
//!   there, port 6443), node *i*'s underlay veth `vn<i>` (host netns, enslaved to `br0`)
//!   ↔ `eth0` (node netns);
//! - node *i* (1-based, `node-<i>`) at `172.20.X.(10+i)/24`;
//! - node *i*'s pod block `10.X.i.0/24` (Calico's default block size is /26; a /24 keeps
//!   the numbers readable and is a valid `blockSize` too).
//!
//! With IPv6 ([`Plan::with_ipv6`], `testbed up --ip-families ipv4,ipv6`) the plan also
//! holds a ULA prefix `G::/48` (RFC 4193: `fd` + a 40-bit global ID, here 5 further
//! bytes of the same SHA-1, so two testbeds get different prefixes):
//! - bridge `br0` at `G::1/64`, node *i* at `G::<10+i>/64` (the last group is the
//!   number 10+i, printed in hex: node-1 is `G::b`);
//! - node *i*'s IPv6 pod block `G:<i>::/120` (256 addresses like the IPv4 /24; a
//!   valid Calico IPv6 `blockSize`, which must lie in 116..=128). A pod gets the
//!   address at the same offset in both blocks (`10.X.i.5` and `G:i::5`).

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// File name of the saved plan inside the state dir.
pub const PLAN_FILE: &str = "plan.json";

/// Most nodes a plan can hold (node IPs are `172.20.X.(10+i)`, so at most 244 fit in the
/// /24; 200 keeps a margin and is far above what one machine can run).
pub const MAX_NODES: usize = 200;

/// API server port on the bridge address (the real kube-apiserver's default secure port).
pub const API_PORT: u16 = 6443;

/// Ports of the real control plane (`testbed up --control-plane real`) inside the host
/// netns, on its loopback (each testbed has its own host netns, so fixed numbers never
/// clash): etcd's client and peer ports (etcd's defaults), the authorization webhook
/// the daemon serves, kube-controller-manager's and kube-scheduler's secure ports
/// (their defaults). kube-apiserver itself listens on [`API_PORT`] of every address.
pub const ETCD_CLIENT_PORT: u16 = 2379;
/// See [`ETCD_CLIENT_PORT`].
pub const ETCD_PEER_PORT: u16 = 2380;
/// See [`ETCD_CLIENT_PORT`].
pub const AUTHZ_WEBHOOK_PORT: u16 = 6480;
/// See [`ETCD_CLIENT_PORT`].
pub const CONTROLLER_MANAGER_PORT: u16 = 10257;
/// See [`ETCD_CLIENT_PORT`].
pub const SCHEDULER_PORT: u16 = 10259;

/// Errors from building, saving or loading a [`Plan`].
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The node count is outside `1..=MAX_NODES`.
    #[error("node count {0} is out of range (1..={MAX_NODES})")]
    NodeCount(usize),
    /// The state dir could not be created or canonicalised.
    #[error("state dir {path}: {source}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing `plan.json` failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `plan.json` is not a plan.
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// An IPv4 prefix such as `10.7.1.0/24`. Serialised as that string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Ipv4Cidr {
    /// Network address (host bits zero).
    pub addr: Ipv4Addr,
    /// Prefix length, 0..=32.
    pub prefix_len: u8,
}

impl Ipv4Cidr {
    /// Whether `ip` lies inside this prefix.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix_len))
        };
        (u32::from(ip) & mask) == (u32::from(self.addr) & mask)
    }

    /// The address at offset `n` from the network address (`10.7.1.0/24`.nth(5) =
    /// `10.7.1.5`). No range check: callers keep `n` inside the prefix.
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr).wrapping_add(n))
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: not ADDR/LEN"))?;
        let addr: Ipv4Addr = a.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let prefix_len: u8 = l.parse().map_err(|e| format!("{s:?}: {e}"))?;
        if prefix_len > 32 {
            return Err(format!("{s:?}: prefix length above 32"));
        }
        Ok(Ipv4Cidr { addr, prefix_len })
    }
}

impl TryFrom<String> for Ipv4Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Ipv4Cidr> for String {
    fn from(c: Ipv4Cidr) -> String {
        c.to_string()
    }
}

/// An IPv6 prefix such as `fd12:3456:789a:1::/120`. Serialised as that string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Ipv6Cidr {
    /// Network address (host bits zero).
    pub addr: Ipv6Addr,
    /// Prefix length, 0..=128.
    pub prefix_len: u8,
}

impl Ipv6Cidr {
    /// Whether `ip` lies inside this prefix.
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        let mask = if self.prefix_len == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix_len))
        };
        (u128::from(ip) & mask) == (u128::from(self.addr) & mask)
    }

    /// The address at offset `n` from the network address
    /// (`fd00:1:2:1::/120`.nth(5) = `fd00:1:2:1::5`). No range check.
    pub fn nth(&self, n: u32) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.addr).wrapping_add(u128::from(n)))
    }
}

impl fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl FromStr for Ipv6Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: not ADDR/LEN"))?;
        let addr: Ipv6Addr = a.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let prefix_len: u8 = l.parse().map_err(|e| format!("{s:?}: {e}"))?;
        if prefix_len > 128 {
            return Err(format!("{s:?}: prefix length above 128"));
        }
        Ok(Ipv6Cidr { addr, prefix_len })
    }
}

impl TryFrom<String> for Ipv6Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Ipv6Cidr> for String {
    fn from(c: Ipv6Cidr) -> String {
        c.to_string()
    }
}

/// An IP family, as `--ip-families` and fault `family_broken` spell it: `ipv4` or
/// `ipv6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Ipv6 => "ipv6",
        })
    }
}

impl FromStr for IpFamily {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ipv4" => Ok(IpFamily::Ipv4),
            "ipv6" => Ok(IpFamily::Ipv6),
            w => Err(format!("unknown IP family {w:?} (expected ipv4 or ipv6)")),
        }
    }
}

/// The IPv6 side of a node ([`Plan::with_ipv6`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIpv6 {
    /// Node (underlay) IPv6 address, `G::<10+i>` on the bridge's /64.
    pub ip: Ipv6Addr,
    /// The node's IPv6 pod block, `G:<i>::/120`.
    pub pod_cidr: Ipv6Cidr,
}

/// One node of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlan {
    /// Kubernetes Node name, `node-<i>` (1-based).
    pub name: String,
    /// Its network namespace, `<prefix>-node-<i>`.
    pub netns: String,
    /// Node (underlay) IP, `172.20.<index>.<10+i>` on the bridge's /24; Felix metrics
    /// and kubelet probes originate here.
    pub ip: Ipv4Addr,
    /// The node's pod block, `10.<index>.<i>.0/24` (`spec.podCIDR`).
    pub pod_cidr: Ipv4Cidr,
    /// The node's IPv6 address and pod block on a dual-stack plan, else `None` (and
    /// absent from `plan.json`, so IPv4-only plans read and write as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<NodeIpv6>,
}

impl NodePlan {
    /// The IPv6 address at the same offset in the node's IPv6 block as `ip4` has in its
    /// IPv4 block (a pod's second address), if the plan is dual-stack and `ip4` lies in
    /// the node's IPv4 block.
    pub fn ipv6_of(&self, ip4: Ipv4Addr) -> Option<Ipv6Addr> {
        let v6 = self.ipv6?;
        if !self.pod_cidr.contains(ip4) {
            return None;
        }
        Some(
            v6.pod_cidr
                .nth(u32::from(ip4).wrapping_sub(u32::from(self.pod_cidr.addr))),
        )
    }
}

/// The whole naming/addressing plan of one testbed. Deterministic in the canonical
/// state-dir path and the node count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Canonical state dir.
    pub state_dir: PathBuf,
    /// Netns name prefix: `fp` + 6 hex chars of SHA-1 of the canonical state-dir path.
    pub prefix: String,
    /// 0..=199, from the same hash; picks the subnets (`172.20.<index>.0/24`,
    /// `10.<index>.0.0/16`).
    pub index: u8,
    /// Host-side netns holding the underlay bridge and the API server, `<prefix>-host`.
    pub host_netns: String,
    /// Bridge address, `172.20.<index>.1` (/24); the API server listens here.
    pub bridge_ip: Ipv4Addr,
    /// API server port on [`Plan::bridge_ip`] (6443).
    pub api_port: u16,
    /// Nodes `node-1`…`node-N`.
    pub nodes: Vec<NodePlan>,
    /// Bridge IPv6 address `G::1` (/64) on a dual-stack plan ([`Plan::with_ipv6`]),
    /// else `None` (absent from `plan.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_ip6: Option<Ipv6Addr>,
}

impl Plan {
    /// Builds the plan for `state_dir` (created if missing, then canonicalised) with
    /// `nodes` nodes. Errors: [`PlanError::NodeCount`] outside `1..=MAX_NODES`,
    /// [`PlanError::StateDir`] if the dir cannot be created/resolved.
    pub fn new(state_dir: &Path, nodes: usize) -> Result<Plan, PlanError> {
        if nodes == 0 || nodes > MAX_NODES {
            return Err(PlanError::NodeCount(nodes));
        }
        std::fs::create_dir_all(state_dir).map_err(|source| PlanError::StateDir {
            path: state_dir.to_path_buf(),
            source,
        })?;
        let state_dir = state_dir
            .canonicalize()
            .map_err(|source| PlanError::StateDir {
                path: state_dir.to_path_buf(),
                source,
            })?;
        let digest = Sha1::digest(state_dir.as_os_str().as_encoded_bytes());
        let prefix = format!("fp{}", hex(&digest[..3]));
        let index = (u16::from_be_bytes([digest[3], digest[4]]) % 200) as u8;
        let host_netns = format!("{prefix}-host");
        let nodes = (1..=nodes)
            .map(|i| NodePlan {
                name: format!("node-{i}"),
                netns: format!("{prefix}-node-{i}"),
                ip: Ipv4Addr::new(172, 20, index, 10 + i as u8),
                pod_cidr: Ipv4Cidr {
                    addr: Ipv4Addr::new(10, index, i as u8, 0),
                    prefix_len: 24,
                },
                ipv6: None,
            })
            .collect();
        Ok(Plan {
            state_dir,
            prefix,
            index,
            host_netns,
            bridge_ip: Ipv4Addr::new(172, 20, index, 1),
            api_port: API_PORT,
            nodes,
            bridge_ip6: None,
        })
    }

    /// The same plan, dual-stack: adds the IPv6 underlay addresses and pod blocks of the
    /// module docs (ULA `G::/48`, `G` = `fd` + bytes 5..10 of the state dir's SHA-1).
    /// Idempotent.
    pub fn with_ipv6(mut self) -> Plan {
        let digest = Sha1::digest(self.state_dir.as_os_str().as_encoded_bytes());
        let g = |a: u8, b: u8| u16::from_be_bytes([a, b]);
        let seg = [
            g(0xfd, digest[5]),
            g(digest[6], digest[7]),
            g(digest[8], digest[9]),
        ];
        let addr =
            |subnet: u16, host: u16| Ipv6Addr::new(seg[0], seg[1], seg[2], subnet, 0, 0, 0, host);
        self.bridge_ip6 = Some(addr(0, 1));
        for (i, n) in self.nodes.iter_mut().enumerate() {
            let i = i as u16 + 1;
            n.ipv6 = Some(NodeIpv6 {
                ip: addr(0, 10 + i),
                pod_cidr: Ipv6Cidr {
                    addr: addr(i, 0),
                    prefix_len: 120,
                },
            });
        }
        self
    }

    /// Whether the plan is dual-stack ([`Plan::with_ipv6`]).
    pub fn has_ipv6(&self) -> bool {
        self.bridge_ip6.is_some()
    }

    /// Path of `plan.json` for a state dir.
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(PLAN_FILE)
    }

    /// Writes `plan.json` into the state dir (whole file replaced atomically via a
    /// temporary file + rename). Errors: [`PlanError::Io`].
    pub fn save(&self) -> Result<(), PlanError> {
        let path = Plan::path(&self.state_dir);
        let tmp = self.state_dir.join(format!("{PLAN_FILE}.tmp"));
        let body = serde_json::to_vec_pretty(self).map_err(|source| PlanError::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&tmp, body).map_err(|source| PlanError::Io {
            path: tmp.clone(),
            source,
        })?;
        std::fs::rename(&tmp, &path).map_err(|source| PlanError::Io { path, source })
    }

    /// Reads `plan.json` from a state dir. Errors: [`PlanError::Io`] (e.g. missing),
    /// [`PlanError::Json`].
    pub fn load(state_dir: &Path) -> Result<Plan, PlanError> {
        let path = Plan::path(state_dir);
        let body = std::fs::read(&path).map_err(|source| PlanError::Io {
            path: path.clone(),
            source,
        })?;
        serde_json::from_slice(&body).map_err(|source| PlanError::Json { path, source })
    }

    /// The node named `name`, if any.
    pub fn node(&self, name: &str) -> Option<&NodePlan> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The bridge-side end of node `name`'s underlay veth in the host netns, `vn<i>`
    /// (the node's own end is its `eth0`), if the node is in the plan.
    pub fn bridge_port(&self, name: &str) -> Option<String> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .map(|i| format!("vn{}", i + 1))
    }

    /// Name of the pod netns with counter `n`: `<prefix>-p<n>`.
    pub fn pod_netns(&self, n: u64) -> String {
        format!("{}-p{n}", self.prefix)
    }

    /// Whether a netns name belongs to this plan (starts with `<prefix>-`).
    pub fn owns_netns(&self, name: &str) -> bool {
        owned_by_prefix(&self.prefix, name)
    }
}

/// Whether netns `name` belongs to the testbed with netns prefix `prefix`.
pub fn owned_by_prefix(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.starts_with('-'))
}

/// Lower-case hex of bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state dir under the temp dir, removed when dropped (`tempfile::TempDir`).
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("fp-plan-test-{name}-"))
            .tempdir()
            .expect("temp dir")
    }

    #[test]
    fn plan_is_deterministic_in_the_state_dir() {
        let d = tmp("det");
        let a = Plan::new(d.path(), 3).unwrap();
        let b = Plan::new(d.path(), 3).unwrap();
        assert_eq!(a, b);
        let other = Plan::new(tmp("other").path(), 3).unwrap();
        assert_ne!(a.prefix, other.prefix);
        assert!(a.prefix.starts_with("fp") && a.prefix.len() == 8);
        assert!(a.index < 200);
    }

    #[test]
    fn plan_addresses_follow_the_layout() {
        let p = Plan::new(tmp("layout").path(), 2).unwrap();
        let x = p.index;
        assert_eq!(p.bridge_ip, Ipv4Addr::new(172, 20, x, 1));
        assert_eq!(p.host_netns, format!("{}-host", p.prefix));
        assert_eq!(p.nodes[1].name, "node-2");
        assert_eq!(p.nodes[1].netns, format!("{}-node-2", p.prefix));
        assert_eq!(p.nodes[1].ip, Ipv4Addr::new(172, 20, x, 12));
        assert_eq!(p.nodes[1].pod_cidr.to_string(), format!("10.{x}.2.0/24"));
        assert!(p.nodes[1].pod_cidr.contains(Ipv4Addr::new(10, x, 2, 77)));
        assert!(!p.nodes[1].pod_cidr.contains(Ipv4Addr::new(10, x, 1, 77)));
        assert!(p.owns_netns(&p.pod_netns(7)));
        assert!(!p.owns_netns(&format!("{}x-host", p.prefix)));
        assert_eq!(p.bridge_port("node-2").as_deref(), Some("vn2"));
        assert_eq!(p.bridge_port("node-3"), None);
    }

    #[test]
    fn plan_round_trips_through_plan_json() {
        let d = tmp("save");
        let p = Plan::new(d.path(), 2).unwrap();
        p.save().unwrap();
        assert_eq!(Plan::load(d.path()).unwrap(), p);
    }

    #[test]
    fn dual_stack_plan_adds_ula_addresses_and_blocks_beside_ipv4() {
        let d = tmp("v6");
        let v4 = Plan::new(d.path(), 2).unwrap();
        assert!(!v4.has_ipv6() && v4.nodes.iter().all(|n| n.ipv6.is_none()));
        let p = v4.clone().with_ipv6();
        assert!(p.has_ipv6());
        assert_eq!(p.nodes[1].ip, v4.nodes[1].ip, "IPv4 side unchanged");
        let b = p.bridge_ip6.unwrap();
        assert_eq!(b.segments()[0] >> 8, 0xfd, "ULA fd00::/8: {b}");
        let g = &b.segments()[..3];
        let n2 = p.nodes[1].ipv6.unwrap();
        assert_eq!(&n2.ip.segments()[..3], g);
        assert_eq!(n2.ip.segments()[3..], [0, 0, 0, 0, 12]);
        assert_eq!(
            n2.pod_cidr.to_string(),
            format!("{:x}:{:x}:{:x}:2::/120", g[0], g[1], g[2])
        );
        let pod4 = Ipv4Addr::new(10, p.index, 2, 77);
        let pod6 = p.nodes[1].ipv6_of(pod4).unwrap();
        assert_eq!(pod6, n2.pod_cidr.nth(77));
        assert!(n2.pod_cidr.contains(pod6));
        assert!(!p.nodes[0].ipv6.unwrap().pod_cidr.contains(pod6));
        assert_eq!(p.nodes[0].ipv6_of(pod4), None, "not node-1's block");
        assert_eq!(v4.nodes[1].ipv6_of(pod4), None, "IPv4-only plan");
        let other = Plan::new(tmp("v6-other").path(), 2).unwrap().with_ipv6();
        assert_ne!(
            other.bridge_ip6.unwrap().segments()[..3],
            *g,
            "another state dir, another prefix"
        );
        // Round trip; an IPv4-only plan.json has no IPv6 keys at all.
        p.save().unwrap();
        assert_eq!(Plan::load(d.path()).unwrap(), p);
        let j = serde_json::to_string(&v4).unwrap();
        assert!(!j.contains("ipv6") && !j.contains("bridge_ip6"), "{j}");
    }

    #[test]
    fn plan_rejects_zero_nodes() {
        assert!(matches!(
            Plan::new(tmp("zero").path(), 0),
            Err(PlanError::NodeCount(0))
        ));
    }
}
