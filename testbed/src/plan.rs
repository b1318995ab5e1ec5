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

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use std::fmt;
use std::net::Ipv4Addr;
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
        })
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
    fn plan_rejects_zero_nodes() {
        assert!(matches!(
            Plan::new(tmp("zero").path(), 0),
            Err(PlanError::NodeCount(0))
        ));
    }
}
