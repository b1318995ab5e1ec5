//! Truth read off a real node's wire (`--kubelet real`): the simulated kubelet writes
//! `container_started` and `readiness_ok` itself, a real kubelet tells nobody, so the
//! testbed watches what its pods send, from the node's network namespace, with one
//! `AF_PACKET` socket per node (packet(7); cooked `SOCK_DGRAM`, every protocol):
//!
//! - **`container_started`** = the first IPv4 packet the pod sends. Every probe pod's
//!   process dials its node from its first instant (target-server's node dial), and
//!   nothing in a pod sandbox sends IPv4 before the container runs (the pause process
//!   sends nothing), so this is the container's start to within the first dial's
//!   syscall. A pod whose process never sends has none (as a pod that never starts).
//! - **`readiness_ok`** = the first TCP segment from the pod to its node's IP whose
//!   payload starts `HTTP/1.1 200`: the answer to the kubelet's first passing readiness
//!   probe (the kubelet probes from the node IP; target-server answers nothing else to
//!   the node with a 200, docs/design.md §5). The in-pod clock's `ready_at` is the moment
//!   target-server sent that answer, so both name the same packet.
//!
//! Resolution: the packet is seen on the pod's veth as it enters the node (before
//! netfilter, so also when the dataplane drops it); the time is taken when this
//! watcher reads it (the node's runtime thread), typically well under a millisecond
//! after, bounded by that thread's scheduling. `detail.method` = `wire`.
//!
//! Bounded: one entry per live pod IP (added at CNI ADD, removed at DEL).

use crate::dataplane::PodNet;
use crate::truth::{Truth, TruthEvent, TruthKind};
use serde_json::json;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// What one pod has been seen doing.
#[derive(Debug)]
struct Seen {
    net: PodNet,
    started: bool,
    ready: bool,
}

/// The watcher of one node (see the module docs). Dropping it stops the watch.
#[derive(Debug)]
pub struct WireWatch {
    pods: Arc<Mutex<HashMap<Ipv4Addr, Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WireWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a packet from a pod says, if anything (pure; `payload` is the IPv4 packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// A TCP segment whose payload starts `HTTP/1.1 200`.
    pub http_200: bool,
}

/// Parses an IPv4 packet (RFC 791 header, RFC 9293 TCP header). `None`: not IPv4, or
/// too short for its own header.
pub fn parse_ipv4(p: &[u8]) -> Option<Packet> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(p[0] & 0x0f) * 4;
    if ihl < 20 || p.len() < ihl {
        return None;
    }
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    // Only the first fragment carries the TCP header.
    let first_fragment = u16::from_be_bytes([p[6], p[7]]) & 0x1fff == 0;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]])).min(p.len());
    let http_200 = p[9] == 6 && first_fragment && {
        let tcp = &p[ihl.min(total)..total];
        tcp.len() >= 20 && {
            let off = usize::from(tcp[12] >> 4) * 4;
            tcp.get(off..)
                .is_some_and(|d| d.starts_with(b"HTTP/1.1 200"))
        }
    };
    Some(Packet { src, dst, http_200 })
}

impl WireWatch {
    /// Starts watching from the current runtime, which must run inside the node's
    /// network namespace (the node's [`crate::netns::NetnsThread`]): the socket is made
    /// there. `node_ip` is the node's address (the kubelet's probes come from it).
    /// Errors: the socket (needs `CAP_NET_RAW`).
    pub fn start(node_ip: Ipv4Addr, truth: Truth) -> std::io::Result<WireWatch> {
        use nix::sys::socket::{socket, AddressFamily, SockFlag, SockProtocol, SockType};
        let fd: OwnedFd = socket(
            AddressFamily::Packet,
            SockType::Datagram,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::EthAll,
        )?;
        // SAFETY: `fd` is an open socket owned by the AsyncFd from here on, so it stays
        // open and the same for the AsyncFd's lifetime (OwnedFd's as_raw_fd is constant).
        let afd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .map_err(|e| e.into_parts().1)?;
        let pods: Arc<Mutex<HashMap<Ipv4Addr, Seen>>> = Arc::default();
        let task = tokio::spawn(read_loop(afd, node_ip, truth, pods.clone()));
        Ok(WireWatch { pods, task })
    }

    /// Watches pod `net` from now on (call at CNI ADD, before its container starts).
    pub fn add_pod(&self, net: &PodNet) {
        self.lock().insert(
            net.ip,
            Seen {
                net: net.clone(),
                started: false,
                ready: false,
            },
        );
    }

    /// Stops watching pod IP `ip` (CNI DEL).
    pub fn remove_pod(&self, ip: Ipv4Addr) {
        self.lock().remove(&ip);
    }

    /// Pods watched now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No pod watched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ipv4Addr, Seen>> {
        self.pods.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a packet makes true for the pods, given what was seen before: the events to
/// emit (pure but for `pods`' flags).
fn judge(
    pods: &mut HashMap<Ipv4Addr, Seen>,
    node_ip: Ipv4Addr,
    pkt: Packet,
) -> Vec<(TruthKind, PodNet)> {
    let mut out = Vec::new();
    let Some(s) = pods.get_mut(&pkt.src) else {
        return out;
    };
    if !s.started {
        s.started = true;
        out.push((TruthKind::ContainerStarted, s.net.clone()));
    }
    if !s.ready && pkt.http_200 && pkt.dst == node_ip {
        s.ready = true;
        out.push((TruthKind::ReadinessOk, s.net.clone()));
    }
    out
}

async fn read_loop(
    afd: tokio::io::unix::AsyncFd<OwnedFd>,
    node_ip: Ipv4Addr,
    truth: Truth,
    pods: Arc<Mutex<HashMap<Ipv4Addr, Seen>>>,
) {
    // IPv4 header + TCP header + "HTTP/1.1 200": what is judged; the rest is cut.
    let mut buf = [0u8; 256];
    loop {
        let Ok(mut guard) = afd.readable().await else {
            return;
        };
        loop {
            let r = nix::sys::socket::recvfrom::<nix::sys::socket::LinkAddr>(
                afd.get_ref().as_raw_fd(),
                &mut buf,
            );
            match r {
                // sll_protocol is in network byte order (packet(7)).
                Ok((n, Some(addr))) if u16::from_be(addr.protocol()) == 0x0800 => {
                    let Some(pkt) = parse_ipv4(&buf[..n.min(buf.len())]) else {
                        continue;
                    };
                    let events = {
                        let mut p = pods.lock().unwrap_or_else(|p| p.into_inner());
                        judge(&mut p, node_ip, pkt)
                    };
                    for (kind, net) in events {
                        truth.emit(TruthEvent::pod(kind, &net, json!({"method": "wire"})));
                    }
                }
                Ok(_) => {}
                Err(nix::errno::Errno::EAGAIN) => {
                    guard.clear_ready();
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "wire watch: recvfrom");
                    guard.clear_ready();
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/TCP packet from `src` to `dst` carrying `payload` (TCP header with 12
    /// bytes of options, as Linux sends them).
    fn tcp(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let tcp_len = 32;
        let total = 20 + tcp_len + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40; // DF
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p[20 + 12] = (tcp_len as u8 / 4) << 4;
        p[20 + tcp_len..].copy_from_slice(payload);
        p
    }

    fn net(ip: Ipv4Addr) -> PodNet {
        PodNet {
            node: "node-1".into(),
            namespace: "fp".into(),
            pod: "s".into(),
            uid: "u1".into(),
            ip,
            ip6: None,
            iface: "cali0123456789a".into(),
            netns: "x".into(),
        }
    }

    #[test]
    fn an_http_200_to_the_node_is_found_past_the_tcp_options() {
        let p = parse_ipv4(&tcp(
            [10, 7, 1, 5],
            [172, 20, 7, 11],
            b"HTTP/1.1 200 OK\r\n",
        ))
        .unwrap();
        assert_eq!(p.src, Ipv4Addr::new(10, 7, 1, 5));
        assert_eq!(p.dst, Ipv4Addr::new(172, 20, 7, 11));
        assert!(p.http_200);
        let p = parse_ipv4(&tcp([10, 7, 1, 5], [172, 20, 7, 11], b"HTTP/1.1 503 x")).unwrap();
        assert!(!p.http_200);
        let mut syn = tcp([10, 7, 1, 5], [172, 20, 7, 11], b"");
        assert!(!parse_ipv4(&syn).unwrap().http_200);
        syn[0] = 0x60;
        assert_eq!(parse_ipv4(&syn), None, "IPv6 is not judged");
        assert_eq!(parse_ipv4(&[0x45; 10]), None, "too short");
    }

    #[test]
    fn first_packet_is_the_start_and_the_first_200_to_the_node_is_ready() {
        let (pod_ip, node_ip) = (Ipv4Addr::new(10, 7, 1, 5), Ipv4Addr::new(172, 20, 7, 11));
        let mut pods = HashMap::new();
        pods.insert(
            pod_ip,
            Seen {
                net: net(pod_ip),
                started: false,
                ready: false,
            },
        );
        let kinds = |v: Vec<(TruthKind, PodNet)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        // Someone else's packet: nothing.
        let other = parse_ipv4(&tcp([10, 7, 1, 9], [172, 20, 7, 11], b"HTTP/1.1 200")).unwrap();
        assert!(judge(&mut pods, node_ip, other).is_empty());
        // The node dial's SYN: started, once.
        let syn = parse_ipv4(&tcp([10, 7, 1, 5], [172, 20, 7, 11], b"")).unwrap();
        assert_eq!(
            kinds(judge(&mut pods, node_ip, syn)),
            [TruthKind::ContainerStarted]
        );
        assert!(judge(&mut pods, node_ip, syn).is_empty());
        // A 200 to another pod is not the kubelet's probe; a 503 to the node is not ready.
        let to_peer = parse_ipv4(&tcp([10, 7, 1, 5], [10, 7, 2, 4], b"HTTP/1.1 200")).unwrap();
        assert!(judge(&mut pods, node_ip, to_peer).is_empty());
        let not_yet = parse_ipv4(&tcp([10, 7, 1, 5], [172, 20, 7, 11], b"HTTP/1.1 503")).unwrap();
        assert!(judge(&mut pods, node_ip, not_yet).is_empty());
        let ok = parse_ipv4(&tcp([10, 7, 1, 5], [172, 20, 7, 11], b"HTTP/1.1 200 OK")).unwrap();
        assert_eq!(
            kinds(judge(&mut pods, node_ip, ok)),
            [TruthKind::ReadinessOk]
        );
        assert!(
            judge(&mut pods, node_ip, ok).is_empty(),
            "the first one only"
        );
    }
}
