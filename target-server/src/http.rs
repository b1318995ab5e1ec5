//! The HTTP/1.1 side both modes serve (docs/design.md §2 steps 2 and 4; shaped like agnhost
//! netexec's `/healthz`, `/readyz`, `/hostname`).
//!
//! | path | answer |
//! |---|---|
//! | `/` | 200, identity JSON `{"pod","namespace","ip","node","programming"}` ([`Identity`], and the pod's programming wait so far: [`ServerState::programming`]) |
//! | `/readyz` | 200 `ok` while running, 503 `shutting down` after SIGTERM |
//! | `/healthz` | 200 `ok` |
//! | `/hostname` | 200, the pod name as text |
//! | `POST /mark/{arm,allow,revoke}`, `GET`/`POST /policy` | a `--policy-change` source only: [`crate::policy`] |
//! | `POST /pad` | 200, the identity and a `pad` as long as the body (a `tcp/mtu` path's full-size exchange, [`crate::paths`]; the one endpoint that reads a body, ≤ [`crate::paths::MAX_PACKET_BYTES`]) |
//! | anything else | 404 |
//!
//! The first `/readyz` request with a `User-Agent: kube-probe/…` header (the kubelet's
//! prober sets `kube-probe/<major>.<minor>`, k8s.io/kubernetes
//! `pkg/probe/http/request.go`) that is answered 200 sets `ready_at`: the source's local
//! proxy for "this pod is Ready". The time is taken when the response is produced, on the
//! monotonic clock. Any request with that header, on any path and whatever the answer,
//! sets `first_kubelet_request` (the programming wait's fallback,
//! [`crate::node_path`]) when it is handled. Keep-alive is off: every probe attempt is a fresh connection anyway.
//!
//! # Hostile clients (bounded memory and time)
//! Nothing in a request is executed or stored; only the path, the `User-Agent` and the
//! body-length headers are looked at. Every connection is bounded ([`Limits`], defaults
//! from the `DEFAULT_*` constants):
//! - request head (request line + headers) at most [`MAX_HEAD_BYTES`] bytes and
//!   [`MAX_HEADERS`] header lines, else `431 Request Header Fields Too Large` and close
//!   (hyper's parser enforces both);
//! - the body is never read (but `POST /pad`'s, see the table): a request announcing more than [`MAX_BODY_BYTES`] or a
//!   chunked body gets `413 Content Too Large` ([`ServerState::respond`]) and the
//!   connection is closed;
//! - a complete head within [`HEADER_READ_TIMEOUT`] of the connection's start, and the
//!   whole connection within [`CONNECTION_DEADLINE`], else it is dropped (slowloris);
//! - at most [`MAX_CONNECTIONS`] connections at once; the next one waits in the
//!   kernel's listen backlog (connect succeeds, its request is read once a slot frees:
//!   at the latest one header timeout later, when an idle holder is dropped).

use crate::identity::Identity;
use crate::ProcessStart;
use firstpacket_report::{ErrorKind, PodProgramming, ProgrammingMethod};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE, USER_AGENT};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

/// Prefix of the kubelet prober's `User-Agent` (`kube-probe/1.32`).
pub const KUBE_PROBE_UA_PREFIX: &str = "kube-probe/";

/// A client that sends no complete request head within this long of its connection's
/// start is dropped (bounds idle and slowloris sockets; the kubelet and the source's
/// attempts send their whole request at once, and an attempt gives up after 900 ms).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Whole-connection deadline: a connection still open this long after it was accepted
/// is closed, whatever it is doing (a request is answered in microseconds; this only
/// bounds what the header timeout does not, e.g. a client that never reads the answer).
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// Largest request head (request line + headers), bytes; larger gets 431. A kubelet
/// probe's head is about 120 bytes, a source attempt's about 100; 8 KiB is the per-line
/// limit of nginx (`large_client_header_buffers 4 8k`) and Apache
/// (`LimitRequestFieldSize 8190`), so any ordinary client fits.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Most header lines in one request; more gets 431. The kubelet sends 4 plus the
/// probe's `httpHeaders` (none in firstpacket's pods); hyper's own default is 100.
pub const MAX_HEADERS: usize = 64;

/// Largest request body accepted, bytes, without ever being read: no endpoint takes a
/// body, so this only tolerates a stray small one. A larger `Content-Length`, or any
/// `Transfer-Encoding` (size unknown), gets 413.
pub const MAX_BODY_BYTES: u64 = 1024;

/// Most connections served at once; the next waits in the listen backlog until one
/// ends. Who connects: the source's attempts (every `--dial-interval` 100 ms, each at
/// most `--attempt-timeout` 900 ms, so ≤ 10 overlap), the kubelet's readiness probe
/// (one per period, ≤ its 1 s timeout; liveness likewise if a spec adds one), and a
/// person's `curl` — about a dozen at once; 128 leaves 10× room. Each connection costs
/// hyper's read buffer (≤ 16 KiB: [`MAX_HEAD_BYTES`] × 2) plus a task; measured: 128
/// connections each holding a nearly full head add 2.4 MiB of RSS
/// (`target-server/tests/hostile.rs`), well within the pod's 16 MiB memory request.
pub const MAX_CONNECTIONS: usize = 128;

/// Per-connection limits of [`serve_with`] / [`serve_connection`]. [`Limits::default`]
/// is the constants above; tests shrink them to keep the runs short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once ([`MAX_CONNECTIONS`]); ≥ 1.
    pub max_connections: usize,
    /// Complete head within this long of the connection's start
    /// ([`HEADER_READ_TIMEOUT`]).
    pub header_read_timeout: Duration,
    /// Connection closed this long after accept ([`CONNECTION_DEADLINE`]).
    pub connection_deadline: Duration,
    /// Request head bytes ([`MAX_HEAD_BYTES`]); at least 8192 (hyper's minimum buffer).
    pub max_head_bytes: usize,
    /// Header lines ([`MAX_HEADERS`]).
    pub max_headers: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            connection_deadline: CONNECTION_DEADLINE,
            max_head_bytes: MAX_HEAD_BYTES,
            max_headers: MAX_HEADERS,
        }
    }
}

/// State shared between the HTTP handlers and the mode that runs them.
#[derive(Debug)]
pub struct ServerState {
    identity: Identity,
    origin: ProcessStart,
    ready: AtomicBool,
    /// First kubelet `/readyz` answered 200 (seconds since process start).
    ready_at: OnceLock<f64>,
    /// Kubelet `/readyz` requests answered 200 so far.
    ready_answers: watch::Sender<u32>,
    /// The node dial's address and interval (the programming wait's resolution).
    node_addr: Option<SocketAddr>,
    node_interval: Duration,
    dial: Mutex<NodeDialLog>,
    /// A `--policy-change` source's marks ([`crate::policy`]).
    policy: OnceLock<Arc<crate::policy::PolicyMarks>>,
}

/// What the node dial ([`crate::node_path`]) and the kubelet's requests have shown.
#[derive(Debug, Default, Clone, Copy)]
struct NodeDialLog {
    attempts: u64,
    failures: u64,
    first_success_sent: Option<f64>,
    last_error: Option<ErrorKind>,
    gave_up: Option<f64>,
    first_kubelet_request: Option<f64>,
}

impl ServerState {
    /// New state: `/readyz` answers 200, `ready_at` unset, no node dial (the
    /// programming wait can only come from the kubelet's requests).
    pub fn new(identity: Identity, origin: ProcessStart) -> Arc<Self> {
        Self::with_node_dial(identity, origin, None, Duration::from_millis(100))
    }

    /// [`ServerState::new`] for a pod that dials its node `node` every `interval`
    /// ([`crate::node_path::dial_node`] records into this state).
    pub fn with_node_dial(
        identity: Identity,
        origin: ProcessStart,
        node: Option<SocketAddr>,
        interval: Duration,
    ) -> Arc<Self> {
        Arc::new(ServerState {
            identity,
            origin,
            ready: AtomicBool::new(true),
            ready_at: OnceLock::new(),
            ready_answers: watch::channel(0).0,
            node_addr: node,
            node_interval: interval,
            dial: Mutex::new(NodeDialLog::default()),
            policy: OnceLock::new(),
        })
    }

    /// Serve the `policy_change` marks of `marks` (`POST /mark/…`, `GET /policy`).
    pub fn serve_policy_marks(&self, marks: Arc<crate::policy::PolicyMarks>) {
        let _ = self.policy.set(marks);
    }

    /// `POST /mark/NAME` and `GET`/`POST /policy` of a `--policy-change` source; `None`
    /// for any other request (or without marks). `/policy` answers a POST too, so the
    /// prober needs only `create` on `pods/proxy` to read it through the API server.
    fn respond_policy<B>(&self, req: &Request<B>) -> Option<Response<Full<Bytes>>> {
        use crate::policy::Mark;
        let marks = self.policy.get()?;
        let path = req.uri().path();
        if path == "/policy" && matches!(*req.method(), hyper::Method::GET | hyper::Method::POST) {
            let body = serde_json::to_vec(&marks.status()).unwrap_or_default();
            return Some(text(StatusCode::OK, Bytes::from(body), "application/json"));
        }
        let mark = Mark::parse(path.strip_prefix("/mark/")?)?;
        if req.method() != hyper::Method::POST {
            return Some(text(
                StatusCode::METHOD_NOT_ALLOWED,
                Bytes::from_static(b"POST a mark"),
                "text/plain",
            ));
        }
        Some(match marks.mark(mark) {
            Ok(at) => {
                eprintln!("target-server: mark {} at {at:.3}s", mark.as_str());
                let body = serde_json::json!({"mark": mark.as_str(), "at": at});
                text(
                    StatusCode::OK,
                    Bytes::from(body.to_string()),
                    "application/json",
                )
            }
            Err(e) => text(StatusCode::CONFLICT, Bytes::from(e.0), "text/plain"),
        })
    }

    fn dial_log(&self) -> std::sync::MutexGuard<'_, NodeDialLog> {
        self.dial.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connect to the node was sent.
    pub fn node_dial_sent(&self) {
        self.dial_log().attempts += 1;
    }

    /// A connect sent at `sent` (seconds since process start) ended with `result`
    /// (`Ok` = the node answered). Returns `true` when it was an answer.
    pub fn node_dial_finished(&self, sent: f64, result: Result<(), ErrorKind>) -> bool {
        let mut log = self.dial_log();
        match result {
            Ok(()) => {
                log.first_success_sent =
                    Some(log.first_success_sent.map_or(sent, |s: f64| s.min(sent)));
                true
            }
            Err(kind) => {
                log.failures += 1;
                log.last_error = Some(kind);
                false
            }
        }
    }

    /// The node dial stopped at `at` (its give-up) without an answer so far.
    pub fn node_dial_gave_up(&self, at: f64) {
        let mut log = self.dial_log();
        if log.first_success_sent.is_none() {
            log.gave_up = Some(at);
        }
    }

    /// This pod's programming wait as measured so far ([`PodProgramming`]; rules in
    /// [`crate::node_path`]). Times rounded to microseconds.
    pub fn programming(&self) -> PodProgramming {
        let log = *self.dial_log();
        let round = crate::tally::round_us;
        let (method, wait, resolution) = match (log.first_success_sent, log.first_kubelet_request) {
            (Some(s), _) => (
                Some(ProgrammingMethod::NodeDial),
                Some(s),
                Some(self.node_interval.as_secs_f64()),
            ),
            (None, Some(k)) => (
                Some(ProgrammingMethod::KubeletProbe),
                Some(k),
                Some(crate::node_path::KUBELET_PROBE_PERIOD_SECONDS),
            ),
            (None, None) => (None, None, None),
        };
        PodProgramming {
            method,
            wait_seconds: wait.map(round),
            resolution_seconds: resolution.map(round),
            node_addr: self.node_addr.map(|a| a.to_string()),
            node_dial_attempts: log.attempts,
            node_dial_failures: log.failures,
            node_dial_first_success_sent: log.first_success_sent.map(round),
            node_dial_last_error: log.last_error,
            node_dial_gave_up: log
                .gave_up
                .filter(|_| log.first_success_sent.is_none())
                .map(round),
            first_kubelet_request: log.first_kubelet_request.map(round),
            ready_at: self.ready_at().map(round),
        }
    }

    /// The `GET /` document: the identity, and this pod's programming wait so far (the
    /// source copies the target's into its report).
    fn identity_document(&self) -> Bytes {
        let doc = IdentityDocument {
            identity: &self.identity,
            programming: self.programming(),
        };
        Bytes::from(
            serde_json::to_vec(&doc).unwrap_or_else(|_| self.identity.to_json().into_bytes()),
        )
    }

    /// This pod's identity.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Make `/readyz` answer 503 from now on (SIGTERM).
    pub fn set_not_ready(&self) {
        self.ready.store(false, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Seconds since process start of the first kubelet `/readyz` answered 200, if any.
    pub fn ready_at(&self) -> Option<f64> {
        self.ready_at.get().copied()
    }

    fn record_kubelet_request(&self) {
        let now = self.origin.elapsed_seconds();
        let mut log = self.dial_log();
        if log.first_kubelet_request.is_none() {
            log.first_kubelet_request = Some(now);
        }
    }

    /// Kubelet `/readyz` requests answered 200 so far.
    pub fn ready_answers(&self) -> u32 {
        *self.ready_answers.borrow()
    }

    /// A receiver that changes at every kubelet `/readyz` answered 200.
    pub fn subscribe_ready_answers(&self) -> watch::Receiver<u32> {
        self.ready_answers.subscribe()
    }

    fn record_kubelet_ready(&self) {
        let now = self.origin.elapsed_seconds();
        let _ = self.ready_at.set(now);
        self.ready_answers.send_modify(|n| *n = n.saturating_add(1));
    }

    /// Answer one request (pure routing; see the module table). Never reads the body: a
    /// request announcing a body over [`MAX_BODY_BYTES`] (`Content-Length`, or any
    /// `Transfer-Encoding`) is answered 413 whatever its path.
    pub fn respond<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        if body_too_large(req.headers()) {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                Bytes::from_static(b"request body too large"),
                "text/plain",
            );
        }
        let from_kubelet = req
            .headers()
            .get(USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ua| ua.starts_with(KUBE_PROBE_UA_PREFIX));
        if from_kubelet {
            self.record_kubelet_request();
        }
        if let Some(resp) = self.respond_policy(req) {
            return resp;
        }
        match req.uri().path() {
            "/" => text(StatusCode::OK, self.identity_document(), "application/json"),
            "/readyz" => {
                if self.is_ready() {
                    let resp = text(StatusCode::OK, Bytes::from_static(b"ok"), "text/plain");
                    if from_kubelet {
                        self.record_kubelet_ready();
                    }
                    resp
                } else {
                    text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        Bytes::from_static(b"shutting down"),
                        "text/plain",
                    )
                }
            }
            "/healthz" => text(StatusCode::OK, Bytes::from_static(b"ok"), "text/plain"),
            "/hostname" => text(
                StatusCode::OK,
                Bytes::from(self.identity.pod.clone()),
                "text/plain",
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                Bytes::from_static(b"not found"),
                "text/plain",
            ),
        }
    }
}

impl ServerState {
    /// `POST /pad` (issue 33, a `tcp/mtu` path's attempt, [`crate::paths`]): reads the
    /// body — the one endpoint that does, bounded by a `Content-Length` of at most
    /// [`crate::paths::MAX_PACKET_BYTES`] (else 413, or 411 without one) and by the
    /// connection's deadlines — and answers 200 with the identity and a `pad` string as
    /// long as the body, so full-size segments go both ways.
    pub async fn respond_pad(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        use http_body_util::BodyExt;
        let max = u64::from(crate::paths::MAX_PACKET_BYTES);
        let announced = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match announced {
            None => {
                return text(
                    StatusCode::LENGTH_REQUIRED,
                    Bytes::from_static(b"Content-Length required"),
                    "text/plain",
                )
            }
            Some(n) if n > max || req.headers().contains_key(hyper::header::TRANSFER_ENCODING) => {
                return text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Bytes::from_static(b"request body too large"),
                    "text/plain",
                )
            }
            Some(_) => {}
        }
        let body = match http_body_util::Limited::new(req.into_body(), max as usize)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    Bytes::from_static(b"body not read"),
                    "text/plain",
                )
            }
        };
        #[derive(serde::Serialize)]
        struct Padded<'a> {
            #[serde(flatten)]
            identity: &'a Identity,
            pad: String,
        }
        let doc = Padded {
            identity: &self.identity,
            pad: "x".repeat(body.len()),
        };
        text(
            StatusCode::OK,
            Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()),
            "application/json",
        )
    }
}

/// `GET /`: the [`Identity`] fields, flattened, plus `programming`.
#[derive(serde::Serialize)]
struct IdentityDocument<'a> {
    #[serde(flatten)]
    identity: &'a Identity,
    programming: PodProgramming,
}

/// Whether the headers announce a body over [`MAX_BODY_BYTES`]: a `Content-Length`
/// above it (or unreadable: hyper has already refused those with 400), or any
/// `Transfer-Encoding` (length unknown until read).
fn body_too_large(headers: &hyper::HeaderMap) -> bool {
    if headers.contains_key(hyper::header::TRANSFER_ENCODING) {
        return true;
    }
    headers
        .get_all(hyper::header::CONTENT_LENGTH)
        .iter()
        .any(|v| {
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .is_none_or(|n| n > MAX_BODY_BYTES)
        })
}

fn text(status: StatusCode, body: Bytes, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Accept connections on `listener` and serve them until `stop` turns `true`; then stop
/// accepting and return (connections already accepted finish on their own tasks).
/// [`serve_with`] under [`Limits::default`].
pub async fn serve(listener: TcpListener, state: Arc<ServerState>, stop: watch::Receiver<bool>) {
    serve_with(listener, state, stop, Limits::default()).await
}

/// [`serve`] under `limits`: at most `limits.max_connections` connections at once (the
/// loop accepts the next only when one has ended, so extra clients wait in the listen
/// backlog), each served by [`serve_connection`].
///
/// Accept errors (e.g. `EMFILE`) are logged and retried after 10 ms, never fatal.
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<ServerState>,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                eprintln!("target-server: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            serve_connection(stream, state, &limits).await;
            drop(permit);
        });
    }
}

/// Serves one HTTP/1.1 connection on `io` (a TCP stream, or an in-memory pipe in tests
/// and fuzzing) with `state`'s routing under `limits` (keep-alive off: one request,
/// then close). Returns when the connection ends: answered, closed by the client, a
/// protocol error (hyper answers 400/431 where it can), the header timeout, or the
/// connection deadline. Never panics on what the client sends; errors are not
/// reported (a client going away mid-request is not the server's problem).
pub async fn serve_connection<I>(io: I, state: Arc<ServerState>, limits: &Limits)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = Arc::clone(&state);
        async move {
            if req.method() == hyper::Method::POST && req.uri().path() == "/pad" {
                return Ok::<_, Infallible>(state.respond_pad(req).await);
            }
            Ok(state.respond(&req))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        // A client that shuts its write side after the request still gets the answer
        // (hyper's default drops the connection on that EOF); the deadlines still hold.
        .half_close(true)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_head_bytes)
        // The read buffer holds the head and whatever body bytes came with it (never
        // read by the service); twice the head cap, and hyper's minimum is 8192.
        .max_buf_size((2 * limits.max_head_bytes).max(8192))
        .max_headers(limits.max_headers)
        .serve_connection(TokioIo::new(io), service);
    let _ = tokio::time::timeout(limits.connection_deadline, conn).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<ServerState> {
        ServerState::new(
            Identity {
                pod: "t-1".into(),
                namespace: None,
                ip: None,
                node: None,
            },
            ProcessStart::now(),
        )
    }

    fn get(path: &str, ua: Option<&str>) -> Request<()> {
        let mut b = Request::get(path);
        if let Some(ua) = ua {
            b = b.header(USER_AGENT, ua);
        }
        b.body(()).expect("request")
    }

    #[test]
    fn readyz_without_kube_probe_agent_does_not_set_ready_at() {
        let s = state();
        assert_eq!(s.respond(&get("/readyz", Some("curl/8"))).status(), 200);
        assert_eq!(s.respond(&get("/readyz", None)).status(), 200);
        assert_eq!(s.ready_at(), None);
    }

    #[test]
    fn first_kube_probe_readyz_sets_ready_at_once() {
        let s = state();
        s.respond(&get("/readyz", Some("kube-probe/1.32")));
        let first = s.ready_at().expect("ready_at set");
        std::thread::sleep(Duration::from_millis(5));
        s.respond(&get("/readyz", Some("kube-probe/1.32")));
        assert_eq!(s.ready_at(), Some(first));
    }

    #[test]
    fn readyz_after_not_ready_is_503_and_does_not_set_ready_at() {
        let s = state();
        s.set_not_ready();
        assert_eq!(
            s.respond(&get("/readyz", Some("kube-probe/1.32"))).status(),
            503
        );
        assert_eq!(s.ready_at(), None);
        assert_eq!(s.respond(&get("/healthz", None)).status(), 200);
    }

    #[test]
    fn unknown_path_is_404() {
        assert_eq!(state().respond(&get("/nope", None)).status(), 404);
    }
}
