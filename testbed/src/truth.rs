//! The ground-truth log (docs/design.md §6 "Truth log", binding): JSON lines
//! `{t, event, node, namespace, pod, uid, ip, iface, detail}`, one clock (the daemon's
//! wall clock), `t` = Unix seconds with µs precision, stamped **after** the change took
//! effect. Absent fields are `null`.
//!
//! [`truth_ttfp`] computes a pair's true TTFP from the log (§6 formula).

use crate::dataplane::PodNet;
use crate::plan::IpFamily;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Errors of the truth log.
#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    /// Opening, writing or reading the log file failed.
    #[error("truth log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line of the log is not a truth event.
    #[error("truth log {path} line {line}: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
}

/// Closed set of truth events (docs/design.md §6). Serialised as the snake_case names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruthKind {
    /// A Node became Ready (`node`).
    NodeReady,
    /// A Node stopped being Ready (`node`).
    NodeNotReady,
    /// CNI ADD done: the pod's netns, veth and node-side /32 route exist (pod fields).
    EndpointAdded,
    /// The endpoint is programmed: the simulated agent put the pod's IP into its node's
    /// allow set, or (real Felix) the node's ruleset started dispatching its interface
    /// to its own chains with its route present (`detail.method` = `ruleset`).
    EndpointProgrammed,
    /// No longer programmed: the allow-set entry was removed (fault `revoke`), or the
    /// ruleset stopped dispatching the live pod's interface.
    EndpointRevoked,
    /// The node-side /32 route of a pod was removed (fault `name_reuse_race`).
    RouteRemoved,
    /// `node` lost its route to peer `detail.peer`'s pod block (fault `cross_node`).
    PeerRouteRemoved,
    /// `node`'s route to peer `detail.peer`'s pod block is back.
    PeerRouteRestored,
    /// Service rules for `detail.service` programmed on `node` (by the simulated proxy,
    /// or read from real kube-proxy's ruleset: `detail.method` = `ruleset`).
    ServiceProgrammed,
    /// First passing readiness probe of a pod.
    ReadinessOk,
    /// The pod is gone from the node (sandbox torn down, object removed).
    PodDeleted,
    /// A new fault file is in force (`detail` describes it).
    FaultChanged,
    /// The pod's first container process was started by its kubelet (pod fields;
    /// `detail`: `container`, `pid`). A pod's programming wait is its
    /// `endpoint_programmed` − this.
    ContainerStarted,
    /// `testbed agent roll`: `node`'s calico-node pod was replaced, as a DaemonSet
    /// rollout replaces it (`namespace`/`pod`/`uid` = the new pod; `detail`: `image`,
    /// `old_pod`, `old_uid`, `old_image`); stamped once the new pod is Running.
    AgentRolled,
    /// `node`'s ruleset starts admitting a peer to or from a pod a NetworkPolicy
    /// isolates (`namespace`/`pod`/`iface` = the isolated pod, `uid`/`ip` = the admitted
    /// peer's; `detail`: `policy`, `direction`, `peer`, `ports`, …), or, with
    /// `detail.isolated: true` and the pod's own `uid`/`ip`, the pod's deny itself
    /// starts ([`crate::policy_sync`] has the shapes).
    PolicyProgrammed,
    /// The opposite of [`TruthKind::PolicyProgrammed`]: a peer no longer admitted, or
    /// (`detail.isolated: true`) the pod no longer isolated in that direction.
    PolicyRevoked,
}

/// One line of the truth log. Field order and names are the §6 contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TruthEvent {
    /// Unix seconds (µs precision), stamped by [`Truth::emit`] after the change.
    pub t: f64,
    pub event: TruthKind,
    pub node: Option<String>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub uid: Option<String>,
    /// Pod IP as a string (`10.7.1.2`).
    pub ip: Option<String>,
    /// Node-side interface (`cali…`).
    pub iface: Option<String>,
    /// Event-specific data (`null` when none).
    #[serde(default)]
    pub detail: serde_json::Value,
}

impl TruthEvent {
    /// An event with every optional field `null` and `t = 0` (stamped at emit).
    pub fn new(event: TruthKind) -> TruthEvent {
        TruthEvent {
            t: 0.0,
            event,
            node: None,
            namespace: None,
            pod: None,
            uid: None,
            ip: None,
            iface: None,
            detail: serde_json::Value::Null,
        }
    }

    /// An event about one pod: node, namespace, pod, uid, ip and iface from `net`.
    pub fn pod(event: TruthKind, net: &PodNet, detail: serde_json::Value) -> TruthEvent {
        TruthEvent {
            node: Some(net.node.clone()),
            namespace: Some(net.namespace.clone()),
            pod: Some(net.pod.clone()),
            uid: Some(net.uid.clone()),
            ip: Some(net.ip.to_string()),
            iface: Some(net.iface.clone()),
            detail,
            ..TruthEvent::new(event)
        }
    }

    /// An event about one node.
    pub fn node(event: TruthKind, node: &str, detail: serde_json::Value) -> TruthEvent {
        TruthEvent {
            node: Some(node.to_owned()),
            detail,
            ..TruthEvent::new(event)
        }
    }
}

/// Now as Unix seconds rounded to whole microseconds.
pub fn unix_now() -> f64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    d.as_micros() as f64 / 1e6
}

/// Append-only writer of the truth log. Cheap to clone; all clones share one file and
/// lock, so lines never interleave and appear in `t` order (except lines stamped by
/// [`Truth::emit_at`]).
#[derive(Clone, Debug)]
pub struct Truth {
    path: Arc<PathBuf>,
    file: Arc<Mutex<File>>,
}

impl Truth {
    /// Opens (creating if needed) the log at `path` for appending. Errors:
    /// [`TruthError::Io`].
    pub fn open(path: &Path) -> Result<Truth, TruthError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| TruthError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Truth {
            path: Arc::new(path.to_path_buf()),
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stamps `ev.t` with now and appends it as one line (one `write`; the file is
    /// unbuffered, so the line is on disk for readers at once). Returns the stamped
    /// event. Errors: [`TruthError::Io`].
    pub fn try_emit(&self, ev: TruthEvent) -> Result<TruthEvent, TruthError> {
        self.append(ev, None)
    }

    /// Appends `ev` stamped `t` (Unix seconds) when given, instead of now: for a change
    /// whose moment was recorded where it happened (the shim's `execve` for
    /// `container_started`, the read of a ruleset monitor's line), so the stamp does
    /// not depend on how soon the writer runs. Such a line may sit a few milliseconds
    /// out of `t` order in the file (readers sort by `t`). `None`: as [`Truth::emit`].
    /// A write failure is only logged; returns the stamp, or `None` then.
    pub fn emit_at(&self, ev: TruthEvent, t: Option<f64>) -> Option<f64> {
        logged(self.append(ev, t))
    }

    /// Like [`Truth::try_emit`] but a write failure is only logged (`tracing::error!`):
    /// ground truth must never stop the cluster. Returns the stamp `t`, or `None` when
    /// the write failed.
    pub fn emit(&self, ev: TruthEvent) -> Option<f64> {
        logged(self.append(ev, None))
    }

    /// Stamps `ev.t` with `t`, or with now under the lock (so such lines are in time
    /// order), and writes it as one line.
    fn append(&self, mut ev: TruthEvent, t: Option<f64>) -> Result<TruthEvent, TruthError> {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        ev.t = t.unwrap_or_else(unix_now);
        let mut line = serde_json::to_vec(&ev).map_err(|e| TruthError::Io {
            path: self.path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        line.push(b'\n');
        f.write_all(&line)
            .and_then(|()| f.flush())
            .map_err(|source| TruthError::Io {
                path: self.path.to_path_buf(),
                source,
            })?;
        Ok(ev)
    }
}

/// The stamp of a written event, or `None` after logging why it was not written.
fn logged(written: Result<TruthEvent, TruthError>) -> Option<f64> {
    match written {
        Ok(ev) => Some(ev.t),
        Err(e) => {
            tracing::error!(error = %e, "truth log write failed");
            None
        }
    }
}

/// Reads a whole truth log. Blank lines are skipped. Errors: [`TruthError::Io`],
/// [`TruthError::Parse`] naming the 1-based line.
pub fn read_truth(path: &Path) -> Result<Vec<TruthEvent>, TruthError> {
    let body = std::fs::read_to_string(path).map_err(|source| TruthError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    body.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| TruthError::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// The true programming wait of pod `pod_uid`, seconds (issue 29): its first
/// `endpoint_programmed` − its first `container_started`, i.e. how long after its
/// container started the pod's own network path was in; negative when the endpoint was
/// programmed before the container started (the pod's process then finds its path up at
/// once). `None` when either event is missing.
pub fn truth_programming_wait(events: &[TruthEvent], pod_uid: &str) -> Option<f64> {
    let first = |kind: TruthKind| {
        events
            .iter()
            .filter(|e| e.event == kind && e.uid.as_deref() == Some(pod_uid))
            .map(|e| e.t)
            .reduce(f64::min)
    };
    Some(first(TruthKind::EndpointProgrammed)? - first(TruthKind::ContainerStarted)?)
}

/// The true TTFP of a (source, target) pair, seconds, from a truth log (docs/design.md §6):
/// `max(endpoint_programmed of both pods, peer_route_restored between their nodes if
/// removed) − readiness_ok of the source`, floored at 0.
///
/// Implemented as "the earliest time at or after the source's `readiness_ok` at which
/// every part of the path is up", which is the §6 formula when nothing is revoked, and
/// stays right when something is: each pod's endpoint is up from `endpoint_programmed`
/// until `endpoint_revoked`; each direction between the two pods' nodes (from
/// `endpoint_added`'s `node`) is up except between `peer_route_removed` and
/// `peer_route_restored` (`node` = the node that lost the route, `detail.peer` = the
/// peer whose block it lost; when the event names a pod (`uid`, fault `stale_routes`:
/// only that pod's IP is blackholed on `node`) it counts only for pairs with that pod).
/// Same-node pairs have no peer routes. This is the IPv4 path's (the primary family):
/// route events of another family (`detail.family`, [`truth_family_ttfp`]) do not count.
///
/// Returns `None` when the source never passed readiness, either pod's node is unknown,
/// or the path never came up in the log.
pub fn truth_ttfp(
    events: &[TruthEvent],
    source_pod_uid: &str,
    target_pod_uid: &str,
) -> Option<f64> {
    truth_family_ttfp(events, source_pod_uid, target_pod_uid, IpFamily::Ipv4)
}

/// [`truth_ttfp`] of the pair's path in one IP family (issue 33, dual-stack testbeds):
/// the same endpoint events (an endpoint admits both of a pod's addresses in one step),
/// and the peer-route events of that family only — `detail.family` (`ipv4`, `ipv6`;
/// absent means `ipv4`, as in logs written before dual-stack).
pub fn truth_family_ttfp(
    events: &[TruthEvent],
    source_pod_uid: &str,
    target_pod_uid: &str,
    family: IpFamily,
) -> Option<f64> {
    let ready = events
        .iter()
        .filter(|e| e.event == TruthKind::ReadinessOk && e.uid.as_deref() == Some(source_pod_uid))
        .map(|e| e.t)
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))))?;
    Some(path_up_in(events, source_pod_uid, target_pod_uid, ready, family)? - ready)
}

/// The IP family a peer-route event is about (`detail.family`; absent: IPv4).
fn event_family(e: &TruthEvent) -> Option<IpFamily> {
    match e.detail.get("family").and_then(|f| f.as_str()) {
        None => Some(IpFamily::Ipv4),
        Some(f) => f.parse().ok(),
    }
}

/// The earliest time (Unix seconds) at or after `from` at which every part of the path
/// between pods `source_pod_uid` and `target_pod_uid` is up: both endpoints programmed
/// (and not revoked), and, across nodes, both directions' peer routes present. `from`
/// itself when the path is already up then. This is [`truth_ttfp`] with the moment of
/// reference given instead of the source's `readiness_ok`: the benchmark times other
/// methods (the operator's loop, a 1 s poller) from the moment each starts timing.
///
/// Returns `None` when either pod's node is unknown (no `endpoint_added`) or the path
/// never came up in the log after `from`.
pub fn path_up_from(
    events: &[TruthEvent],
    source_pod_uid: &str,
    target_pod_uid: &str,
    from: f64,
) -> Option<f64> {
    path_up_in(events, source_pod_uid, target_pod_uid, from, IpFamily::Ipv4)
}

/// [`path_up_from`] in one IP family ([`truth_family_ttfp`]).
fn path_up_in(
    events: &[TruthEvent],
    source_pod_uid: &str,
    target_pod_uid: &str,
    from: f64,
    family: IpFamily,
) -> Option<f64> {
    let uid_is = |e: &TruthEvent, u: &str| e.uid.as_deref() == Some(u);
    let node_of = |u: &str| {
        events
            .iter()
            .find(|e| e.event == TruthKind::EndpointAdded && uid_is(e, u))
            .and_then(|e| e.node.clone())
    };
    let (src_node, dst_node) = (node_of(source_pod_uid)?, node_of(target_pod_uid)?);

    let mut relevant: Vec<&TruthEvent> = events
        .iter()
        .filter(|e| match e.event {
            TruthKind::EndpointProgrammed | TruthKind::EndpointRevoked => {
                uid_is(e, source_pod_uid) || uid_is(e, target_pod_uid)
            }
            TruthKind::PeerRouteRemoved | TruthKind::PeerRouteRestored => {
                let node = e.node.as_deref();
                let peer = e.detail.get("peer").and_then(|p| p.as_str());
                // A pod-scoped event (fault `stale_routes`: `uid` = the pod whose IP
                // is blackholed) concerns only pairs with that pod.
                let pod_scoped_elsewhere = e
                    .uid
                    .as_deref()
                    .is_some_and(|u| u != source_pod_uid && u != target_pod_uid);
                src_node != dst_node
                    && !pod_scoped_elsewhere
                    && event_family(e) == Some(family)
                    && ((node == Some(&src_node) && peer == Some(&dst_node))
                        || (node == Some(&dst_node) && peer == Some(&src_node)))
            }
            _ => false,
        })
        .collect();
    relevant.sort_by(|a, b| a.t.total_cmp(&b.t));

    // State: [source endpoint, target endpoint, src→dst route, dst→src route].
    let mut up = [false, false, true, true];
    let apply = |up: &mut [bool; 4], e: &TruthEvent| {
        let on = matches!(
            e.event,
            TruthKind::EndpointProgrammed | TruthKind::PeerRouteRestored
        );
        match e.event {
            TruthKind::EndpointProgrammed | TruthKind::EndpointRevoked => {
                if uid_is(e, source_pod_uid) {
                    up[0] = on;
                }
                if uid_is(e, target_pod_uid) {
                    up[1] = on;
                }
            }
            _ => {
                if e.node.as_deref() == Some(&src_node) {
                    up[2] = on;
                } else {
                    up[3] = on;
                }
            }
        }
    };
    let mut iter = relevant.into_iter().peekable();
    while let Some(e) = iter.next_if(|e| e.t <= from) {
        apply(&mut up, e);
    }
    if up.iter().all(|&u| u) {
        return Some(from);
    }
    for e in iter {
        apply(&mut up, e);
        if up.iter().all(|&u| u) {
            return Some(e.t.max(from));
        }
    }
    None
}

/// Truth TTFP of a `service` probe (docs/design.md §2 kind `service`, §6 truth; issue 5): the
/// pair's [`truth_ttfp`], or later if the source's node programmed the Service rule with
/// the target as an endpoint later — `max(pair, service_programmed on source_node naming
/// the target pod's uid − readiness_ok of the source)`, floored at 0. Seconds.
///
/// Returns `None` when [`truth_ttfp`] does, or when `source_node` never programmed the
/// target as an endpoint.
pub fn truth_service_ttfp(
    events: &[TruthEvent],
    source_pod_uid: &str,
    target_pod_uid: &str,
    source_node: &str,
) -> Option<f64> {
    let pair = truth_ttfp(events, source_pod_uid, target_pod_uid)?;
    let first = |kind: TruthKind, uid: &str, node: Option<&str>| {
        events
            .iter()
            .filter(|e| e.event == kind && e.uid.as_deref() == Some(uid))
            .filter(|e| node.is_none_or(|n| e.node.as_deref() == Some(n)))
            .map(|e| e.t)
            .reduce(f64::min)
    };
    let ready = first(TruthKind::ReadinessOk, source_pod_uid, None)?;
    let rule = first(
        TruthKind::ServiceProgrammed,
        target_pod_uid,
        Some(source_node),
    )?;
    Some(pair.max((rule - ready).max(0.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(t: f64, event: TruthKind, uid: Option<&str>, node: &str) -> TruthEvent {
        TruthEvent {
            t,
            uid: uid.map(str::to_owned),
            node: Some(node.to_owned()),
            ..TruthEvent::new(event)
        }
    }

    fn pair(src_prog: f64, dst_prog: f64, ready: f64) -> Vec<TruthEvent> {
        vec![
            ev(0.0, TruthKind::EndpointAdded, Some("t"), "node-2"),
            ev(dst_prog, TruthKind::EndpointProgrammed, Some("t"), "node-2"),
            ev(1.0, TruthKind::EndpointAdded, Some("s"), "node-1"),
            ev(src_prog, TruthKind::EndpointProgrammed, Some("s"), "node-1"),
            ev(ready, TruthKind::ReadinessOk, Some("s"), "node-1"),
        ]
    }

    #[test]
    fn programming_wait_is_first_programmed_minus_first_container_start() {
        let mut evs = pair(10.0, 7.0, 3.0);
        evs.push(ev(2.5, TruthKind::ContainerStarted, Some("s"), "node-1"));
        evs.push(ev(12.0, TruthKind::EndpointProgrammed, Some("s"), "node-1"));
        evs.push(ev(4.0, TruthKind::ContainerStarted, Some("s"), "node-1"));
        assert_eq!(truth_programming_wait(&evs, "s"), Some(7.5));
        // The target never started a container in this log.
        assert_eq!(truth_programming_wait(&evs, "t"), None);
        assert_eq!(truth_programming_wait(&evs, "x"), None);
    }

    #[test]
    fn ttfp_is_latest_programming_minus_source_ready() {
        let evs = pair(10.0, 7.0, 3.0);
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(7.0));
        let evs = pair(4.0, 12.5, 3.0);
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(9.5));
    }

    #[test]
    fn ttfp_is_zero_when_programmed_before_ready() {
        let evs = pair(2.0, 1.5, 3.0);
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(0.0));
    }

    #[test]
    fn ttfp_is_none_when_an_endpoint_is_never_programmed() {
        let mut evs = pair(2.0, 1.5, 3.0);
        evs.retain(|e| {
            !(e.event == TruthKind::EndpointProgrammed && e.uid.as_deref() == Some("t"))
        });
        assert_eq!(truth_ttfp(&evs, "s", "t"), None);
    }

    #[test]
    fn ttfp_waits_for_a_removed_peer_route_to_be_restored() {
        let mut evs = pair(4.0, 5.0, 3.0);
        let mut rm = ev(0.5, TruthKind::PeerRouteRemoved, None, "node-2");
        rm.detail = json!({"peer": "node-1"});
        let mut back = ev(20.0, TruthKind::PeerRouteRestored, None, "node-2");
        back.detail = json!({"peer": "node-1"});
        evs.push(rm.clone());
        evs.push(back);
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(17.0));
        // A route between other nodes does not matter.
        let mut evs = pair(4.0, 5.0, 3.0);
        rm.detail = json!({"peer": "node-3"});
        evs.push(rm);
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(2.0));
    }

    #[test]
    fn a_route_event_counts_only_for_its_own_family() {
        let mut evs = pair(4.0, 5.0, 3.0);
        let mut rm = ev(0.5, TruthKind::PeerRouteRemoved, None, "node-2");
        rm.detail = json!({"peer": "node-1", "reason": "family_broken", "family": "ipv6"});
        let mut back = ev(20.0, TruthKind::PeerRouteRestored, None, "node-2");
        back.detail = rm.detail.clone();
        evs.push(rm);
        evs.push(back);
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(2.0), "IPv4 unaffected");
        assert_eq!(
            truth_family_ttfp(&evs, "s", "t", IpFamily::Ipv6),
            Some(17.0)
        );
        // Without `family` an event is IPv4's (logs from before dual-stack).
        let mut evs = pair(4.0, 5.0, 3.0);
        let mut rm = ev(0.5, TruthKind::PeerRouteRemoved, None, "node-2");
        rm.detail = json!({"peer": "node-1"});
        evs.push(rm);
        assert_eq!(truth_ttfp(&evs, "s", "t"), None);
        assert_eq!(truth_family_ttfp(&evs, "s", "t", IpFamily::Ipv6), Some(2.0));
    }

    #[test]
    fn pod_scoped_stale_route_breaks_only_pairs_with_that_pod() {
        let stale = |t, kind, uid: &str| {
            let mut e = ev(t, kind, Some(uid), "node-1");
            e.detail = json!({"peer": "node-2", "reason": "stale_routes"});
            e
        };
        // node-1 (the source's node) blackholes the target's IP until t = 9.
        let mut evs = pair(4.0, 5.0, 3.0);
        evs.push(stale(0.5, TruthKind::PeerRouteRemoved, "t"));
        evs.push(stale(9.0, TruthKind::PeerRouteRestored, "t"));
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(6.0));
        // The same stale route for another pod's IP does not matter to this pair.
        let mut evs = pair(4.0, 5.0, 3.0);
        evs.push(stale(0.5, TruthKind::PeerRouteRemoved, "other"));
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(2.0));
    }

    #[test]
    fn ttfp_counts_reprogramming_after_a_revoke() {
        let mut evs = pair(2.0, 2.5, 3.0);
        evs.push(ev(2.8, TruthKind::EndpointRevoked, Some("t"), "node-2"));
        evs.push(ev(8.0, TruthKind::EndpointProgrammed, Some("t"), "node-2"));
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(5.0));
    }

    #[test]
    fn ttfp_is_none_without_source_readiness() {
        let mut evs = pair(2.0, 2.5, 3.0);
        evs.retain(|e| e.event != TruthKind::ReadinessOk);
        assert_eq!(truth_ttfp(&evs, "s", "t"), None);
    }

    #[test]
    fn truth_lines_have_the_contract_shape_and_read_back() {
        let d = std::env::temp_dir().join(format!("fp-truth-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        let truth = Truth::open(&d).unwrap();
        let before = unix_now();
        let t = truth
            .emit(TruthEvent::node(TruthKind::NodeReady, "node-1", json!({})))
            .unwrap();
        assert!(t >= before);
        truth.emit(TruthEvent::new(TruthKind::FaultChanged));
        let body = std::fs::read_to_string(&d).unwrap();
        let first: serde_json::Value = serde_json::from_str(body.lines().next().unwrap()).unwrap();
        let keys: Vec<&str> = first
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = vec![
            "t",
            "event",
            "node",
            "namespace",
            "pod",
            "uid",
            "ip",
            "iface",
            "detail",
        ];
        want.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(first["event"], "node_ready");
        assert!(first["pod"].is_null());
        let back = read_truth(&d).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].event, TruthKind::FaultChanged);
        assert!(back[1].t >= back[0].t);
        let _ = std::fs::remove_file(&d);
    }

    #[test]
    fn service_truth_waits_for_the_rule_on_the_source_node_only() {
        let evs = vec![
            ev(10.0, TruthKind::EndpointAdded, Some("s"), "node-1"),
            ev(10.0, TruthKind::EndpointAdded, Some("t"), "node-2"),
            ev(10.5, TruthKind::EndpointProgrammed, Some("s"), "node-1"),
            ev(10.6, TruthKind::EndpointProgrammed, Some("t"), "node-2"),
            ev(11.0, TruthKind::ReadinessOk, Some("s"), "node-1"),
            ev(12.0, TruthKind::ServiceProgrammed, Some("t"), "node-2"),
            ev(15.0, TruthKind::ServiceProgrammed, Some("t"), "node-1"),
            ev(10.8, TruthKind::ServiceProgrammed, Some("t"), "node-3"),
        ];
        assert_eq!(truth_ttfp(&evs, "s", "t"), Some(0.0));
        assert_eq!(truth_service_ttfp(&evs, "s", "t", "node-1"), Some(4.0));
        // Each node's own rule counts; one programmed before Ready adds nothing; no rule
        // on the node → None.
        assert_eq!(truth_service_ttfp(&evs, "s", "t", "node-2"), Some(1.0));
        assert_eq!(truth_service_ttfp(&evs, "s", "t", "node-3"), Some(0.0));
        assert_eq!(truth_service_ttfp(&evs, "s", "t", "node-4"), None);
    }
}
