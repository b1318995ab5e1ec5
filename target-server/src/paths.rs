//! The extra paths a source dials beside its main one (issue 33): `target-server probe
//! --path PROTOCOL/PAYLOAD=IP:PORT` (repeatable), each with the main path's spacing,
//! per-attempt timeout, give-up and hold, from process start, each attempt checked for
//! the expected pod's identity as the main one is.
//!
//! | path | one attempt |
//! |---|---|
//! | `tcp/small` | as the main path: a fresh connection, `GET /` ([`crate::attempt::dial`]) |
//! | `tcp/mtu` | a fresh connection, `POST /pad` with a body of `packet_bytes` bytes; the target answers its identity padded by as many bytes ([`crate::http`]), so each way at least one segment is a full MSS (the connection's MSS comes from the route MTU; Linux sets Don't Fragment on TCP while path-MTU discovery is on, `ip(7)` `IP_MTU_DISCOVER`) |
//! | `udp/small` | one datagram `{"id":N}` from a fresh socket (a new flow for conntrack, as a fresh TCP connection is); the target answers `{"id":N,"pod":…}` ([`serve_udp`]) |
//! | `udp/mtu` | the same datagram padded to an IP packet of `packet_bytes`, Don't Fragment set (`IP_PMTUDISC_DO`: never fragmented locally), answered by one of the same size, DF set too |
//!
//! `packet_bytes` is the route's MTU towards the target when the source starts
//! (`IP_MTU`/`IPV6_MTU` of a connected UDP socket, `ip(7)`/`ipv6(7)`: the pod
//! interface's MTU unless the kernel knows a smaller path MTU), or `--mtu`.
//!
//! A UDP answer counts only with the attempt's own id (answers to earlier attempts
//! arriving late are read and ignored); an answer naming another pod is `wrong_peer`.
//! Failures: no answer within the timeout is `timeout`; an ICMP port unreachable is
//! `refused` (`ECONNREFUSED` on the connected socket); `EMSGSIZE` (the kernel knows
//! a path MTU below the packet) is `unreachable`; other errors as the main path's
//! ([`crate::attempt::classify_io`]).

use crate::attempt::{dial, http_exchange, judge, AttemptOutcome, AttemptResult, USER_AGENT_VALUE};
use crate::ProcessStart;
use firstpacket_report::{ErrorKind, IpFamily, PathId, PathProtocol, Payload};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::Request;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;
use tokio::net::UdpSocket;

/// Largest full-size packet a path uses, bytes (jumbo frames are 9000; a `--mtu` or a
/// route MTU above it is cut to it). Bounds the target's `/pad` body and datagrams.
pub const MAX_PACKET_BYTES: u32 = 9216;

/// Smallest: IPv4's minimum reassembly size (RFC 791); IPv6's minimum MTU is 1280.
pub const MIN_PACKET_BYTES: u32 = 576;

/// IPv4 header (no options) + UDP header, bytes.
const UDP4_OVERHEAD: u32 = 20 + 8;
/// IPv6 header + UDP header, bytes.
const UDP6_OVERHEAD: u32 = 40 + 8;

/// One `--path`: what to dial and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathSpec {
    pub protocol: PathProtocol,
    pub payload: Payload,
    /// The target's address of the path's family.
    pub target: SocketAddr,
}

impl PathSpec {
    /// The path's IP family (its target's).
    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.target.ip())
    }

    /// Protocol, family and payload.
    pub fn id(&self) -> PathId {
        PathId {
            protocol: self.protocol,
            family: self.family(),
            payload: self.payload,
        }
    }
}

impl FromStr for PathSpec {
    type Err = String;

    /// `PROTOCOL/PAYLOAD=IP:PORT` (`udp/mtu=10.1.2.3:8080`, `tcp/small=[fd00::3]:8080`).
    fn from_str(s: &str) -> Result<Self, String> {
        let (what, addr) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected PROTOCOL/PAYLOAD=IP:PORT"))?;
        let (proto, payload) = what
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected PROTOCOL/PAYLOAD before '='"))?;
        let protocol: PathProtocol = proto.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let payload: Payload = payload.parse().map_err(|e| format!("{s:?}: {e}"))?;
        let target = addr
            .parse::<SocketAddr>()
            .map_err(|e| format!("{s:?}: {addr:?} is not IP:PORT ({e})"))?;
        Ok(PathSpec {
            protocol,
            payload,
            target,
        })
    }
}

/// The route's MTU towards `target` now (bytes): `IP_MTU` (`IPV6_MTU`) of a UDP socket
/// connected to it, which sends nothing. Errors: no route, or the socket calls failing.
pub fn route_mtu(target: SocketAddr) -> std::io::Result<u32> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = std::net::UdpSocket::bind(local)?;
    sock.connect(target)?;
    let (level, name) = match target {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_MTU),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_MTU),
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `sock` is an open socket for the whole call; `mtu` and `len` are valid for
    // writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            level,
            name,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(mtu.max(0) as u32)
}

/// Sets Don't Fragment with no local fragmentation (`IP_PMTUDISC_DO`, and
/// `IPV6_PMTUDISC_DO` on an IPv6 socket) on `sock`: a datagram over the known path MTU
/// fails with `EMSGSIZE` instead of leaving in fragments.
fn set_dont_fragment(sock: &UdpSocket, v6: bool) -> std::io::Result<()> {
    let (level, name, value) = if v6 {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    };
    // SAFETY: `sock` is open; `value` is a c_int read for its size.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The full-size packets' IP size for `spec` (`None` for `small`): `mtu` (from
/// `--mtu` or [`route_mtu`]) within [`MIN_PACKET_BYTES`]..=[`MAX_PACKET_BYTES`].
pub fn packet_bytes(spec: &PathSpec, mtu: u32) -> Option<u32> {
    (spec.payload == Payload::Mtu).then(|| mtu.clamp(MIN_PACKET_BYTES, MAX_PACKET_BYTES))
}

/// One attempt on `spec` (module table), timed on `origin`'s clock. Never fails: every
/// problem is an [`AttemptResult::Failure`]; never takes (much) longer than `timeout`.
pub async fn attempt(
    origin: ProcessStart,
    spec: PathSpec,
    packet_bytes: Option<u32>,
    id: u64,
    expect_pod: &str,
    timeout: Duration,
) -> AttemptOutcome {
    if spec.protocol == PathProtocol::Tcp && packet_bytes.is_none() {
        return dial(origin, spec.target, expect_pod, timeout).await;
    }
    let sent = origin.elapsed_seconds();
    let work = async {
        match spec.protocol {
            PathProtocol::Tcp => {
                tcp_pad(spec.target, packet_bytes.unwrap_or(0), expect_pod, timeout).await
            }
            PathProtocol::Udp => (
                udp_exchange(spec.target, packet_bytes, id, expect_pod).await,
                None,
            ),
        }
    };
    let (result, retransmits) = tokio::time::timeout(timeout, work)
        .await
        .unwrap_or((AttemptResult::fail(ErrorKind::Timeout), None));
    AttemptOutcome {
        sent,
        received: origin.elapsed_seconds(),
        result,
        peer_programming: None,
        retransmits,
    }
}

/// `POST /pad` with `bytes` bytes of body; success on 200, the expected pod, and a
/// `pad` of the same length back. With the connection's retransmitted segments when
/// an answer came.
async fn tcp_pad(
    target: SocketAddr,
    bytes: u32,
    expect_pod: &str,
    timeout: Duration,
) -> (AttemptResult, Option<u32>) {
    let req = Request::post("/pad")
        .header(HOST, target.to_string())
        .header(CONNECTION, "close")
        .header(USER_AGENT, USER_AGENT_VALUE)
        .header(CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(Bytes::from(vec![b'x'; bytes as usize])));
    let Ok(req) = req else {
        return (AttemptResult::fail(ErrorKind::Reset), None);
    };
    match http_exchange(target, timeout, req).await {
        Err(kind) => (AttemptResult::fail(kind), None),
        Ok(answer) => {
            let result = match judge(answer.status, &answer.body, expect_pod) {
                AttemptResult::Success if pad_len(&answer.body) != Some(bytes as usize) => {
                    AttemptResult::fail(ErrorKind::HttpStatus)
                }
                other => other,
            };
            (result, answer.retransmits)
        }
    }
}

/// Length of the `pad` member of a JSON answer.
fn pad_len(body: &[u8]) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("pad")?.as_str().map(str::len)
}

/// The request datagram of attempt `id`: `{"id":N}`, padded (`"pad"`) to an IP packet
/// of `packet_bytes` when given.
pub fn udp_request(id: u64, packet_bytes: Option<u32>, v6: bool) -> Vec<u8> {
    let plain = format!(r#"{{"id":{id}}}"#).into_bytes();
    let Some(bytes) = packet_bytes else {
        return plain;
    };
    let overhead = if v6 { UDP6_OVERHEAD } else { UDP4_OVERHEAD };
    pad_json(
        format!(r#"{{"id":{id},"pad":""#),
        (bytes - overhead) as usize,
    )
}

/// `head` + as many `x` as make the whole `"…"}` document `len` bytes (at least
/// `head` + `"}`).
fn pad_json(head: String, len: usize) -> Vec<u8> {
    let mut v = head.into_bytes();
    let fill = len.saturating_sub(v.len() + 2);
    v.resize(v.len() + fill, b'x');
    v.extend_from_slice(b"\"}");
    v
}

/// The target's answer to a request datagram: `{"id":N,"pod":…,"pad":"…"}` of the
/// request's own length (at least the unpadded answer), or `None` for a datagram that
/// is not a request (not JSON, no numeric `id`): never answered.
pub fn udp_answer(request: &[u8], pod: &str) -> Option<Vec<u8>> {
    let v: serde_json::Value = serde_json::from_slice(request).ok()?;
    let id = v.get("id")?.as_u64()?;
    let pod = serde_json::to_string(pod).ok()?;
    Some(pad_json(
        format!(r#"{{"id":{id},"pod":{pod},"pad":""#),
        request.len(),
    ))
}

/// One UDP request/answer from a fresh socket (module docs).
async fn udp_exchange(
    target: SocketAddr,
    packet_bytes: Option<u32>,
    id: u64,
    expect_pod: &str,
) -> AttemptResult {
    let fail = |e: &std::io::Error| {
        AttemptResult::fail(if e.raw_os_error() == Some(libc::EMSGSIZE) {
            ErrorKind::Unreachable
        } else {
            crate::attempt::classify_io(e)
        })
    };
    let v6 = target.is_ipv6();
    let local: SocketAddr = if v6 {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let sock = match UdpSocket::bind(local).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if let Err(e) = set_dont_fragment(&sock, v6) {
        return fail(&e);
    }
    if let Err(e) = sock.connect(target).await {
        return fail(&e);
    }
    if let Err(e) = sock.send(&udp_request(id, packet_bytes, v6)).await {
        return fail(&e);
    }
    let mut buf = vec![0u8; MAX_PACKET_BYTES as usize + 64];
    loop {
        let n = match sock.recv(&mut buf).await {
            Ok(n) => n,
            Err(e) => return fail(&e),
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&buf[..n]) else {
            continue;
        };
        if v.get("id").and_then(|i| i.as_u64()) != Some(id) {
            continue;
        }
        return match v.get("pod").and_then(|p| p.as_str()) {
            Some(p) if p == expect_pod => AttemptResult::Success,
            Some(p) => AttemptResult::Failure {
                kind: ErrorKind::WrongPeer,
                peer: Some(crate::attempt::truncate_chars(
                    p,
                    crate::attempt::MAX_PEER_NAME,
                )),
            },
            None => AttemptResult::Failure {
                kind: ErrorKind::WrongPeer,
                peer: Some(crate::attempt::NO_IDENTITY.to_string()),
            },
        };
    }
}

/// Answers request datagrams on UDP `port` (module docs) for `pod`, on IPv4 and, where
/// the pod has IPv6, IPv6 (a second, v6-only socket), until the task is dropped. Each
/// datagram gets at most one answer of its own size (no amplification); anything that
/// is not a request gets none. Errors: the IPv4 socket cannot be bound.
pub async fn serve_udp(port: u16, pod: String) -> std::io::Result<()> {
    let v4 = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).await?;
    let _ = set_dont_fragment(&v4, false);
    let v6 = bind_v6_only(port).await;
    let answer = |sock: UdpSocket, pod: String| async move {
        let mut buf = vec![0u8; MAX_PACKET_BYTES as usize + 64];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                // Errors here are per-datagram (e.g. an ICMP error queued for an earlier
                // answer): go on.
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            };
            if let Some(a) = udp_answer(&buf[..n], &pod) {
                let _ = sock.send_to(&a, peer).await;
            }
        }
    };
    match v6 {
        Some(v6) => {
            tokio::join!(answer(v4, pod.clone()), answer(v6, pod));
        }
        None => answer(v4, pod).await,
    }
    Ok(())
}

/// A v6-only UDP socket on `[::]:port` (`IPV6_V6ONLY` set before the bind, so it does
/// not collide with the IPv4 socket's port), DF set; `None` where the pod has no IPv6.
async fn bind_v6_only(port: u16) -> Option<UdpSocket> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn6,
    };
    let fd = socket(
        AddressFamily::Inet6,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .ok()?;
    setsockopt(&fd, sockopt::Ipv6V6Only, &true).ok()?;
    let addr = SockaddrIn6::from(std::net::SocketAddrV6::new(
        Ipv6Addr::UNSPECIFIED,
        port,
        0,
        0,
    ));
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr).ok()?;
    let sock = UdpSocket::from_std(std::net::UdpSocket::from(fd)).ok()?;
    let _ = set_dont_fragment(&sock, true);
    Some(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_specs_parse_and_bad_ones_say_why() {
        let p: PathSpec = "udp/mtu=10.1.2.3:8080".parse().unwrap();
        assert_eq!(
            (p.protocol, p.payload, p.target.to_string(), p.family()),
            (
                PathProtocol::Udp,
                Payload::Mtu,
                "10.1.2.3:8080".into(),
                IpFamily::Ipv4
            )
        );
        let p: PathSpec = "tcp/small=[fd00::3]:8080".parse().unwrap();
        assert_eq!(p.family(), IpFamily::Ipv6);
        for (bad, why) in [
            ("udp/mtu", "PROTOCOL/PAYLOAD=IP:PORT"),
            ("udp=10.0.0.1:1", "PROTOCOL/PAYLOAD before"),
            (
                "sctp/small=10.0.0.1:1",
                "unknown protocol \"sctp\" (expected tcp or udp)",
            ),
            (
                "tcp/jumbo=10.0.0.1:1",
                "unknown payload \"jumbo\" (expected small or mtu)",
            ),
            ("tcp/small=10.0.0.1", "is not IP:PORT"),
        ] {
            let e = bad.parse::<PathSpec>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn full_size_datagrams_fill_the_ip_packet_and_answers_match_their_size() {
        let r = udp_request(7, Some(1500), false);
        assert_eq!(r.len() as u32 + UDP4_OVERHEAD, 1500);
        let r6 = udp_request(7, Some(1500), true);
        assert_eq!(r6.len() as u32 + UDP6_OVERHEAD, 1500);
        let v: serde_json::Value = serde_json::from_slice(&r).unwrap();
        assert_eq!(v["id"], 7);
        let a = udp_answer(&r, "t-1").unwrap();
        assert_eq!(a.len(), r.len(), "the answer is as big as the request");
        let v: serde_json::Value = serde_json::from_slice(&a).unwrap();
        assert_eq!(
            (v["id"].as_u64(), v["pod"].as_str()),
            (Some(7), Some("t-1"))
        );
        // Small: the answer is the unpadded identity, longer than the request.
        let small = udp_request(8, None, false);
        assert_eq!(small, br#"{"id":8}"#);
        let a = udp_answer(&small, "t-1").unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&a).unwrap()["pod"],
            "t-1"
        );
        // Garbage is never answered.
        assert_eq!(udp_answer(b"hello", "t"), None);
        assert_eq!(udp_answer(br#"{"id":"x"}"#, "t"), None);
    }

    #[test]
    fn packet_bytes_are_clamped_and_only_for_mtu() {
        let s = |payload| PathSpec {
            protocol: PathProtocol::Udp,
            payload,
            target: "10.0.0.1:8080".parse().unwrap(),
        };
        assert_eq!(packet_bytes(&s(Payload::Small), 1500), None);
        assert_eq!(packet_bytes(&s(Payload::Mtu), 1500), Some(1500));
        assert_eq!(
            packet_bytes(&s(Payload::Mtu), 65536),
            Some(MAX_PACKET_BYTES)
        );
        assert_eq!(packet_bytes(&s(Payload::Mtu), 100), Some(MIN_PACKET_BYTES));
    }

    #[tokio::test]
    async fn udp_attempts_succeed_only_on_the_expected_pod_and_time_out_without_answer() {
        // A target answering as "t-1" on a free loopback port.
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let server = tokio::spawn(serve_udp(port, "t-1".into()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let origin = ProcessStart::now();
        let target: SocketAddr = ([127, 0, 0, 1], port).into();
        let spec = |payload| PathSpec {
            protocol: PathProtocol::Udp,
            payload,
            target,
        };
        let t = Duration::from_millis(500);
        for payload in [Payload::Small, Payload::Mtu] {
            let bytes = packet_bytes(&spec(payload), route_mtu(target).unwrap());
            let ok = attempt(origin, spec(payload), bytes, 1, "t-1", t).await;
            assert_eq!(ok.result, AttemptResult::Success, "{payload:?}");
            let wrong = attempt(origin, spec(payload), bytes, 2, "t-2", t).await;
            assert!(
                matches!(wrong.result, AttemptResult::Failure { kind: ErrorKind::WrongPeer, ref peer } if peer.as_deref() == Some("t-1")),
                "{wrong:?}"
            );
        }
        server.abort();
        let _ = server.await;
        // Nothing listens now: the kernel's port unreachable is `refused`.
        let gone = attempt(origin, spec(Payload::Small), None, 3, "t-1", t).await;
        assert_eq!(gone.result, AttemptResult::fail(ErrorKind::Refused));
    }
}
