//! Listeners of the API server: plain HTTP or HTTPS (rustls, the testbed's own CA, see
//! [`crate::tls`]), and the [`ApiServer`] handle behind `testbed api restart`.
//!
//! Each connection is served by hyper's HTTP/1.1 server over the axum [`router`]. The
//! accept loop owns its connections, so stopping a listener closes the port and drops
//! every open connection (watches end; clients resume from their last
//! resourceVersion), as a kube-apiserver restart does.

use super::{router, Store};
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::{JoinHandle, JoinSet};

/// How long a client may take for its TLS handshake before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds a listening socket on an address; called again on every (re)start, so it can
/// enter a network namespace first (`netns::run_in_netns`). The default is
/// `std::net::TcpListener::bind`, which sets `SO_REUSEADDR` on Linux, so a restart
/// can rebind a port whose old connections are in TIME_WAIT.
pub type Binder = Arc<dyn Fn(SocketAddr) -> io::Result<std::net::TcpListener> + Send + Sync>;

/// Serves `app` on `listener` (HTTPS when `tls` is given) until the task is aborted or
/// the listener fails for good. Transient accept errors (e.g. EMFILE) are retried after
/// 50 ms, as `axum::serve` does.
async fn accept_loop(
    app: Router,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<()> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => {
                let (stream, peer) = match r {
                    Ok(accepted) => accepted,
                    Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted) => continue,
                    Err(e) if e.raw_os_error().is_some_and(|c| c == 23 || c == 24) => {
                        // ENFILE / EMFILE: wait for descriptors to be freed.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let acceptor = acceptor.clone();
                conns.spawn(async move {
                    // Each request knows its client's address (`ConnectInfo`, as
                    // `axum::serve` with connect info gives it): the pod proxy passes it
                    // on in `X-Forwarded-For`.
                    let app = TowerToHyperService::new(app);
                    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                        hyper::service::Service::call(&app, req)
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(a) => {
                            let Ok(Ok(s)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, a.accept(stream)).await else {
                                return;
                            };
                            let _ = http.serve_connection(TokioIo::new(s), svc).with_upgrades().await;
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), svc).with_upgrades().await;
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Serves any router `app` over HTTPS on `listener` with `tls` until the listener fails
/// (the kubelets' API uses it).
pub async fn serve_router_tls(
    app: Router,
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
) -> io::Result<()> {
    accept_loop(app, listener, Some(tls)).await
}

/// Serves the API over HTTPS on `listener` with the certificate chain `cert_pem` and
/// its key `key_pem` (PEM; see [`crate::tls::server_config`]) until the listener fails.
/// Errors: a bad certificate/key (as `InvalidInput`), or the listener's error.
pub async fn serve_tls(
    store: Arc<Store>,
    listener: tokio::net::TcpListener,
    cert_pem: &str,
    key_pem: &str,
) -> io::Result<()> {
    let cfg = crate::tls::server_config(cert_pem, key_pem)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    accept_loop(router(store), listener, Some(cfg)).await
}

/// Binds with `bind`, retrying for up to 2 s while the address is still in use: an
/// aborted accept task may drop its listening socket a moment after `stop` returns.
fn bind_retrying(bind: &Binder, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match bind(addr) {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

struct Endpoint {
    addr: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    bind: Binder,
    task: Option<JoinHandle<io::Result<()>>>,
}

/// The running API server: a set of listeners (each plain HTTP or HTTPS) over one
/// [`Store`], which can be stopped and started again on the same addresses while the
/// store lives on (or is swapped for one reloaded from disk).
///
/// Must be used inside a tokio runtime (listeners are registered with the current
/// one). Dropping it stops every listener.
pub struct ApiServer {
    store: Arc<Store>,
    endpoints: Vec<Endpoint>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addrs", &self.addrs())
            .field("running", &self.is_running())
            .finish()
    }
}

fn default_binder() -> Binder {
    Arc::new(std::net::TcpListener::bind)
}

impl ApiServer {
    /// A server over `store` with no listeners yet.
    pub fn new(store: Arc<Store>) -> ApiServer {
        ApiServer {
            store,
            endpoints: Vec::new(),
        }
    }

    /// The store being served.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Binds `addr` with `bind` (default: plain `bind(2)` in the current network
    /// namespace) and serves on it, HTTPS when `tls` is given. Port 0 picks a free port,
    /// which is then kept for restarts. Returns the bound address. Errors: the bind.
    pub fn listen(
        &mut self,
        addr: SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
        bind: Option<Binder>,
    ) -> io::Result<SocketAddr> {
        let bind = bind.unwrap_or_else(default_binder);
        let listener = bind(addr)?;
        self.listen_on(listener, tls, Some(bind))
    }

    /// Serves on an already bound `listener` (e.g. one bound inside another network
    /// namespace); `bind` re-creates it on restart (default: plain `bind(2)` on the
    /// same address). Returns the address. Errors: the socket's address or mode.
    pub fn listen_on(
        &mut self,
        listener: std::net::TcpListener,
        tls: Option<Arc<rustls::ServerConfig>>,
        bind: Option<Binder>,
    ) -> io::Result<SocketAddr> {
        let addr = listener.local_addr()?;
        let mut ep = Endpoint {
            addr,
            tls,
            bind: bind.unwrap_or_else(default_binder),
            task: None,
        };
        ep.task = Some(self.spawn(&ep, listener)?);
        self.endpoints.push(ep);
        Ok(addr)
    }

    fn spawn(
        &self,
        ep: &Endpoint,
        listener: std::net::TcpListener,
    ) -> io::Result<JoinHandle<io::Result<()>>> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        Ok(tokio::spawn(accept_loop(
            router(self.store.clone()),
            listener,
            ep.tls.clone(),
        )))
    }

    /// The listening addresses, in the order they were added.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.endpoints.iter().map(|e| e.addr).collect()
    }

    /// Whether the listeners are up.
    pub fn is_running(&self) -> bool {
        self.endpoints
            .iter()
            .any(|e| e.task.as_ref().is_some_and(|t| !t.is_finished()))
    }

    /// Closes every listener and every open connection (open watches end).
    pub async fn stop(&mut self) {
        for ep in &mut self.endpoints {
            if let Some(t) = ep.task.take() {
                t.abort();
                let _ = t.await;
            }
        }
    }

    /// Binds every listener again on its address and serves. Listeners already running
    /// are left alone. Errors: the first failing bind (the others stay as they are).
    pub fn start(&mut self) -> io::Result<()> {
        for i in 0..self.endpoints.len() {
            if self.endpoints[i].task.is_some() {
                continue;
            }
            let ep = &self.endpoints[i];
            let listener = bind_retrying(&ep.bind, ep.addr)?;
            let task = self.spawn(ep, listener)?;
            self.endpoints[i].task = Some(task);
        }
        Ok(())
    }

    /// [`ApiServer::stop`] then [`ApiServer::start`]: the same addresses, the same
    /// store, so resourceVersions and watch history carry on.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.stop().await;
        self.start()
    }

    /// Stops, serves `store` instead (e.g. one reloaded with [`Store::load_from`]) and
    /// starts again.
    pub async fn restart_with(&mut self, store: Arc<Store>) -> io::Result<()> {
        self.stop().await;
        self.store = store;
        self.start()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        for ep in &mut self.endpoints {
            if let Some(t) = ep.task.take() {
                t.abort();
            }
        }
    }
}
