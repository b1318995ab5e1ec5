//! One dial attempt of the source (docs/design.md §2 step 4): a fresh TCP connection, `GET /`
//! over HTTP/1.1 with `Connection: close`, the whole exchange bounded by
//! `--attempt-timeout`; success only on HTTP 200 whose JSON body names `--expect-pod`.
//!
//! Failure classification ([`ErrorKind`], closed set), from the Linux errno the
//! connect/read returned (`errno(3)`; `connect(2)`):
//! - `timeout`: the attempt's deadline passed (lost SYN or lost answer), or `ETIMEDOUT`.
//! - `refused`: `ECONNREFUSED` (RST to the SYN).
//! - `unreachable`: `EHOSTUNREACH`, `ENETUNREACH`, `ENETDOWN`, `EHOSTDOWN`, and `EPERM` /
//!   `EACCES` (a local firewall rejecting the packet).
//! - `reset`: `ECONNRESET`, `EPIPE`, `ECONNABORTED`, an unexpected EOF, an incomplete
//!   HTTP message, and any other I/O error.
//! - `http_status`: an HTTP answer other than 200, or bytes that are not HTTP.
//! - `wrong_peer`: HTTP 200 whose body does not name `--expect-pod` (the peer's `pod`
//!   is returned; [`NO_IDENTITY`] when the body carries none).

use crate::ProcessStart;
use firstpacket_report::{ErrorKind, PodProgramming};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{CONNECTION, HOST, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Duration;
use tokio::net::TcpStream;

/// `User-Agent` of the source's attempts (lets a target's logs tell them from the
/// kubelet's `kube-probe/…`).
pub const USER_AGENT_VALUE: &str = concat!("firstpacket/", env!("CARGO_PKG_VERSION"));

/// Largest identity body read (the real one is ~100 bytes); more is cut off.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Longest peer name kept (Kubernetes object names are DNS subdomains, ≤ 253
/// characters: Kubernetes docs "Object Names and IDs").
pub const MAX_PEER_NAME: usize = 253;

/// Peer name recorded for a 200 whose body names no pod (not a target-server).
pub const NO_IDENTITY: &str = "(no identity)";

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// HTTP 200 from the expected pod.
    Success,
    /// Any failure; `peer` is set for [`ErrorKind::WrongPeer`] only.
    Failure {
        /// Which kind.
        kind: ErrorKind,
        /// The wrong peer's `pod` (≤ [`MAX_PEER_NAME`] chars).
        peer: Option<String>,
    },
}

impl AttemptResult {
    /// A failure of `kind` without a peer.
    pub(crate) fn fail(kind: ErrorKind) -> Self {
        AttemptResult::Failure { kind, peer: None }
    }
}

/// One attempt's timing and result. Times are seconds since process start.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptOutcome {
    /// Taken just before `connect()` starts.
    pub sent: f64,
    /// When the answer (or the failure) arrived.
    pub received: f64,
    /// What happened.
    pub result: AttemptResult,
    /// On a success: the target's programming wait as its answer carried it
    /// (`programming` in its `GET /` document; `None` from a target that predates it).
    pub peer_programming: Option<PodProgramming>,
    /// TCP attempts that got an answer: segments the kernel retransmitted on this
    /// attempt's connection ([`tcp_retransmits`]); `None` for UDP, failures, or when
    /// the count could not be read.
    pub retransmits: Option<u32>,
}

/// Run one attempt against `target` and time it on `origin`'s clock. Never fails: every
/// problem is an [`AttemptResult::Failure`]; never takes (much) longer than `timeout`.
pub async fn dial(
    origin: ProcessStart,
    target: SocketAddr,
    expect_pod: &str,
    timeout: Duration,
) -> AttemptOutcome {
    let sent = origin.elapsed_seconds();
    let (result, peer_programming, retransmits) =
        match tokio::time::timeout(timeout, exchange(target, expect_pod, timeout)).await {
            Ok(done) => done,
            Err(_elapsed) => (AttemptResult::fail(ErrorKind::Timeout), None, None),
        };
    AttemptOutcome {
        sent,
        received: origin.elapsed_seconds(),
        result,
        peer_programming,
        retransmits,
    }
}

async fn exchange(
    target: SocketAddr,
    expect_pod: &str,
    timeout: Duration,
) -> (AttemptResult, Option<PodProgramming>, Option<u32>) {
    let (result, answer) = exchange_body(target, expect_pod, timeout).await;
    let Some(answer) = answer else {
        return (result, None, None);
    };
    let programming = match &result {
        AttemptResult::Success => peer_programming(&answer.body),
        _ => None,
    };
    (result, programming, answer.retransmits)
}

/// The `programming` member of a target's `GET /` document, if it parses.
pub fn peer_programming(body: &[u8]) -> Option<PodProgramming> {
    let doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    serde_json::from_value(doc.get("programming")?.clone()).ok()
}

async fn exchange_body(
    target: SocketAddr,
    expect_pod: &str,
    timeout: Duration,
) -> (AttemptResult, Option<HttpAnswer>) {
    let req = Request::get("/")
        .header(HOST, target.to_string())
        .header(CONNECTION, "close")
        .header(USER_AGENT, USER_AGENT_VALUE)
        .body(Full::new(Bytes::new()));
    let Ok(req) = req else {
        // Cannot happen with these static parts; count it as a failed exchange.
        return (AttemptResult::fail(ErrorKind::Reset), None);
    };
    match http_exchange(target, timeout, req).await {
        Ok(answer) => (judge(answer.status, &answer.body, expect_pod), Some(answer)),
        Err(kind) => (AttemptResult::fail(kind), None),
    }
}

/// What one HTTP exchange got back ([`http_exchange`]).
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    /// The answer's status.
    pub status: StatusCode,
    /// Its body (at most [`MAX_BODY_BYTES`]).
    pub body: Bytes,
    /// Segments the kernel retransmitted on the connection up to the answer's end
    /// ([`tcp_retransmits`]; `None` when it could not be read).
    pub retransmits: Option<u32>,
}

/// One HTTP/1.1 exchange over a fresh TCP connection to `target` (`TCP_NODELAY`; the
/// connection driver bounded by `timeout`): the answer's status and body (at most
/// [`MAX_BODY_BYTES`]). Errors: the failure's [`ErrorKind`] (a body over the limit
/// is `wrong_peer` under a 200 — something answered, but not a target-server — else
/// `http_status`).
pub async fn http_exchange(
    target: SocketAddr,
    timeout: Duration,
    req: Request<Full<Bytes>>,
) -> Result<HttpAnswer, ErrorKind> {
    let stream = TcpStream::connect(target)
        .await
        .map_err(|e| classify_io(&e))?;
    let _ = stream.set_nodelay(true);
    // A second descriptor of the socket, to read its TCP_INFO once the answer is in
    // (hyper owns and closes the first one); dropped at the end of this call.
    let info_fd = stream.as_fd().try_clone_to_owned().ok();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| classify_hyper(&e))?;
    // The connection driver must run on its own task: it finishes after the body is read
    // (Connection: close). Bounded so a stuck peer cannot keep it alive.
    tokio::spawn(async move {
        let _ = tokio::time::timeout(timeout, conn).await;
    });
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| classify_hyper(&e))?;
    let status = resp.status();
    match Limited::new(resp.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => Ok(HttpAnswer {
            status,
            body: b.to_bytes(),
            retransmits: info_fd
                .as_ref()
                .and_then(|fd| tcp_retransmits(fd.as_fd()).ok()),
        }),
        Err(e) => Err(match e.downcast_ref::<hyper::Error>() {
            Some(h) => classify_hyper(h),
            None if status == StatusCode::OK => ErrorKind::WrongPeer,
            None => ErrorKind::HttpStatus,
        }),
    }
}

/// Segments the kernel retransmitted on the TCP socket `fd` so far: `tcpi_total_retrans`
/// of `getsockopt(IPPROTO_TCP, TCP_INFO)` (tcp(7); Linux `include/uapi/linux/tcp.h`),
/// SYNs included. More than 0 on a successful attempt means its answer came only after
/// TCP's retransmission back-off (RFC 6298: an RTO of 1 s before the first RTT sample,
/// Linux's floor of 200 ms after it), which the attempt's time includes. Errors: the
/// `getsockopt` call failing (not a TCP socket, closed).
pub fn tcp_retransmits(fd: BorrowedFd<'_>) -> std::io::Result<u32> {
    // SAFETY: all-zero bytes are a valid `tcp_info` (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `fd` is open for the call (borrowed); `info` and `len` are valid for
    // writes of the sizes given, and the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.tcpi_total_retrans)
}

/// Decide an answer: 200 + `{"pod": expect_pod}` is the only success (pure).
pub fn judge(status: StatusCode, body: &[u8], expect_pod: &str) -> AttemptResult {
    if status != StatusCode::OK {
        return AttemptResult::fail(ErrorKind::HttpStatus);
    }
    let peer = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("pod").and_then(|p| p.as_str()).map(str::to_owned));
    match peer {
        Some(p) if p == expect_pod => AttemptResult::Success,
        Some(p) => AttemptResult::Failure {
            kind: ErrorKind::WrongPeer,
            peer: Some(truncate_chars(&p, MAX_PEER_NAME)),
        },
        None => AttemptResult::Failure {
            kind: ErrorKind::WrongPeer,
            peer: Some(NO_IDENTITY.to_string()),
        },
    }
}

/// Cut `s` to at most `max` characters (on a char boundary).
pub fn truncate_chars(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// Linux errno values used below (`asm-generic/errno.h`; no libc dependency).
mod errno {
    pub const EPERM: i32 = 1;
    pub const EPIPE: i32 = 32;
    pub const EACCES: i32 = 13;
    pub const ENETDOWN: i32 = 100;
    pub const ENETUNREACH: i32 = 101;
    pub const ECONNABORTED: i32 = 103;
    pub const ECONNRESET: i32 = 104;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
    pub const EHOSTDOWN: i32 = 112;
    pub const EHOSTUNREACH: i32 = 113;
}

/// Classify an I/O error (see the module docs for the table).
pub fn classify_io(e: &std::io::Error) -> ErrorKind {
    use std::io::ErrorKind as K;
    if let Some(code) = e.raw_os_error() {
        return match code {
            errno::ECONNREFUSED => ErrorKind::Refused,
            errno::EHOSTUNREACH
            | errno::ENETUNREACH
            | errno::ENETDOWN
            | errno::EHOSTDOWN
            | errno::EPERM
            | errno::EACCES => ErrorKind::Unreachable,
            errno::ETIMEDOUT => ErrorKind::Timeout,
            errno::ECONNRESET | errno::EPIPE | errno::ECONNABORTED => ErrorKind::Reset,
            _ => ErrorKind::Reset,
        };
    }
    match e.kind() {
        K::ConnectionRefused => ErrorKind::Refused,
        K::HostUnreachable | K::NetworkUnreachable | K::NetworkDown | K::PermissionDenied => {
            ErrorKind::Unreachable
        }
        K::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::Reset,
    }
}

/// Classify a hyper error: the underlying I/O error if there is one, else a parse error
/// is `http_status` (not HTTP) and anything else (incomplete message, closed) `reset`.
pub fn classify_hyper(e: &hyper::Error) -> ErrorKind {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return classify_io(io);
        }
        source = s.source();
    }
    if e.is_parse() || e.is_parse_status() {
        ErrorKind::HttpStatus
    } else {
        ErrorKind::Reset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn errno_values_map_to_the_closed_error_kinds() {
        let k = |c| classify_io(&io::Error::from_raw_os_error(c));
        assert_eq!(k(111), ErrorKind::Refused);
        assert_eq!(k(113), ErrorKind::Unreachable);
        assert_eq!(k(101), ErrorKind::Unreachable);
        assert_eq!(k(104), ErrorKind::Reset);
        assert_eq!(k(32), ErrorKind::Reset);
        assert_eq!(k(110), ErrorKind::Timeout);
    }

    #[test]
    fn unexpected_eof_is_reset() {
        let e = io::Error::new(io::ErrorKind::UnexpectedEof, "eof");
        assert_eq!(classify_io(&e), ErrorKind::Reset);
    }

    #[test]
    fn only_200_from_the_expected_pod_is_success() {
        assert_eq!(
            judge(StatusCode::OK, br#"{"pod":"t-1","ip":null}"#, "t-1"),
            AttemptResult::Success
        );
        assert_eq!(
            judge(StatusCode::OK, br#"{"pod":"t-2"}"#, "t-1"),
            AttemptResult::Failure {
                kind: ErrorKind::WrongPeer,
                peer: Some("t-2".into())
            }
        );
        assert_eq!(
            judge(StatusCode::SERVICE_UNAVAILABLE, br#"{"pod":"t-1"}"#, "t-1"),
            AttemptResult::fail(ErrorKind::HttpStatus)
        );
    }

    #[test]
    fn a_200_without_identity_is_a_wrong_peer_not_a_success() {
        assert_eq!(
            judge(StatusCode::OK, b"<html>hello</html>", "t-1"),
            AttemptResult::Failure {
                kind: ErrorKind::WrongPeer,
                peer: Some(NO_IDENTITY.into())
            }
        );
    }

    #[test]
    fn the_targets_programming_is_read_from_its_identity_document() {
        let body = br#"{"pod":"t","programming":{"method":"node_dial","wait_seconds":1.5,"resolution_seconds":0.1,"node_addr":"10.0.0.1:10250","node_dial_attempts":16,"node_dial_failures":15,"node_dial_first_success_sent":1.5,"node_dial_last_error":"timeout","node_dial_gave_up":null,"first_kubelet_request":2.1,"ready_at":2.1}}"#;
        assert_eq!(judge(StatusCode::OK, body, "t"), AttemptResult::Success);
        let p = peer_programming(body).expect("parsed");
        assert_eq!(p.wait_seconds, Some(1.5));
        assert_eq!(p.node_dial_attempts, 16);
        // An older target (identity only) or garbage: none, and still a success.
        assert_eq!(peer_programming(br#"{"pod":"t"}"#), None);
        assert_eq!(peer_programming(br#"{"pod":"t","programming":7}"#), None);
        assert_eq!(peer_programming(b"not json"), None);
    }

    #[test]
    fn long_peer_names_are_truncated() {
        let long = "x".repeat(400);
        let body = format!(r#"{{"pod":"{long}"}}"#);
        match judge(StatusCode::OK, body.as_bytes(), "t") {
            AttemptResult::Failure { peer: Some(p), .. } => assert_eq!(p.len(), MAX_PEER_NAME),
            other => panic!("unexpected {other:?}"),
        }
    }
}
