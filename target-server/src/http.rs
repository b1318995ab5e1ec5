//! The HTTP/1.1 side both modes serve (docs/design.md §2 steps 2 and 4; shaped like agnhost
//! netexec's `/healthz`, `/readyz`, `/hostname`).
//!
//! | path | answer |
//! |---|---|
//! | `/` | 200, identity JSON `{"pod","namespace","ip","node"}` ([`Identity`]) |
//! | `/readyz` | 200 `ok` while running, 503 `shutting down` after SIGTERM |
//! | `/healthz` | 200 `ok` |
//! | `/hostname` | 200, the pod name as text |
//! | anything else | 404 |
//!
//! The first `/readyz` request with a `User-Agent: kube-probe/…` header (the kubelet's
//! prober sets `kube-probe/<major>.<minor>`, k8s.io/kubernetes
//! `pkg/probe/http/request.go`) that is answered 200 sets `ready_at`: the source's local
//! proxy for "this pod is Ready". The time is taken when the response is produced, on the
//! monotonic clock. Keep-alive is off: every probe attempt is a fresh connection anyway.

use crate::identity::Identity;
use crate::ProcessStart;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE, USER_AGENT};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Prefix of the kubelet prober's `User-Agent` (`kube-probe/1.32`).
pub const KUBE_PROBE_UA_PREFIX: &str = "kube-probe/";

/// A client that sends no complete request head within this long is dropped (bounds
/// idle sockets; the kubelet sends its request at once).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// State shared between the HTTP handlers and the mode that runs them.
#[derive(Debug)]
pub struct ServerState {
    identity: Identity,
    identity_json: Bytes,
    origin: ProcessStart,
    ready: AtomicBool,
    ready_at: watch::Sender<Option<f64>>,
}

impl ServerState {
    /// New state: `/readyz` answers 200, `ready_at` unset.
    pub fn new(identity: Identity, origin: ProcessStart) -> Arc<Self> {
        let identity_json = Bytes::from(identity.to_json());
        Arc::new(ServerState {
            identity,
            identity_json,
            origin,
            ready: AtomicBool::new(true),
            ready_at: watch::channel(None).0,
        })
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
        *self.ready_at.borrow()
    }

    /// A receiver that changes once, when `ready_at` is set.
    pub fn subscribe_ready_at(&self) -> watch::Receiver<Option<f64>> {
        self.ready_at.subscribe()
    }

    fn record_kubelet_ready(&self) {
        let now = self.origin.elapsed_seconds();
        self.ready_at.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(now);
                true
            } else {
                false
            }
        });
    }

    /// Answer one request (pure routing; see the module table).
    pub fn respond<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        match req.uri().path() {
            "/" => text(
                StatusCode::OK,
                self.identity_json.clone(),
                "application/json",
            ),
            "/readyz" => {
                if self.is_ready() {
                    let from_kubelet = req
                        .headers()
                        .get(USER_AGENT)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|ua| ua.starts_with(KUBE_PROBE_UA_PREFIX));
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

fn text(status: StatusCode, body: Bytes, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Accept connections on `listener` and serve them until `stop` turns `true`; then stop
/// accepting and return (connections already accepted finish on their own tasks).
///
/// Accept errors (e.g. `EMFILE`) are logged and retried after 10 ms, never fatal.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ServerState>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
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
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = state.respond(&req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            // A client going away mid-request is not our problem; nothing to log.
            let _ = conn.await;
        });
    }
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
