//! `target-server serve`: the target pod T (docs/design.md §2 step 2).
//!
//! Listens on `[::]:PORT` (both families; `0.0.0.0:PORT` without IPv6) at once (start → listening is the first thing after the
//! runtime is up; budget ≤ 20 ms, docs/design.md §7). On SIGTERM (or SIGINT): `/readyz` flips to
//! 503, the listener keeps accepting for `--drain` (default 500 ms, below the prober's
//! 1 s grace period) so a kubelet probe in flight sees the 503, then closes; the process
//! exits 0.

use crate::cli::ServeArgs;
use crate::http::{self, ServerState};
use crate::identity::Identity;
use crate::node_path::dial_node;
use crate::{Error, ProcessStart};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;

/// Bind `[::]:port` — both families: Linux accepts IPv4 connections on an IPv6 socket
/// unless `IPV6_V6ONLY` is set (`ipv6(7)`; its default, `net.ipv6.bindv6only`, is 0), so
/// a dual-stack pod is reachable on both of its IPs (issue 33) — or `0.0.0.0:port` where
/// the pod has no IPv6 at all; then log `target-server: listening on ADDR` on stderr
/// (tests and operators read the real port from it when `port` is 0).
///
/// Errors: [`Error::Bind`] (the IPv4 bind's error).
pub async fn bind(port: u16) -> Result<TcpListener, Error> {
    let dual = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    let listener = match dual_stack_listener(dual) {
        Ok(l) => l,
        Err(_) => {
            let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
            TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Bind { addr, source })?
        }
    };
    let local = listener.local_addr().unwrap_or(dual);
    eprintln!("target-server: listening on {local}");
    Ok(listener)
}

/// A listener on `addr` (`[::]:port`) that takes IPv4 connections too (`IPV6_V6ONLY`
/// off, whatever the sysctl says), with `SO_REUSEADDR` as tokio's `bind` sets it.
fn dual_stack_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = tokio::net::TcpSocket::new_v6()?;
    sock.set_reuseaddr(true)?;
    let off: libc::c_int = 0;
    // SAFETY: `sock` is open; `off` is a c_int read for its size.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    sock.bind(addr)?;
    sock.listen(1024)
}

/// SIGTERM (what the kubelet sends on pod deletion) and SIGINT (a terminal's Ctrl-C).
pub struct Termination {
    term: Signal,
    int: Signal,
}

impl Termination {
    /// Install both handlers. Errors: [`Error::Runtime`].
    pub fn install() -> Result<Self, Error> {
        let term = signal(SignalKind::terminate()).map_err(|source| Error::Runtime {
            what: "SIGTERM handler",
            source,
        })?;
        let int = signal(SignalKind::interrupt()).map_err(|source| Error::Runtime {
            what: "SIGINT handler",
            source,
        })?;
        Ok(Termination { term, int })
    }

    /// Resolve on the next SIGTERM or SIGINT.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Run `serve` until SIGTERM/SIGINT plus the drain. Errors: [`Error::Bind`],
/// [`Error::Runtime`].
pub async fn run(args: ServeArgs, identity: Identity, origin: ProcessStart) -> Result<(), Error> {
    let mut termination = Termination::install()?;
    let listener = bind(args.port).await?;
    let port = listener.local_addr().map_or(args.port, |a| a.port());
    let node_dial = args.node_dial()?;
    let state = ServerState::with_node_dial(identity, origin, node_dial.node, node_dial.interval);
    let (stop_tx, stop_rx) = watch::channel(false);
    let server = tokio::spawn(http::serve(listener, Arc::clone(&state), stop_rx));
    let dial = tokio::spawn(dial_node(node_dial, origin, Arc::clone(&state)));
    // UDP on the same port for `udp/*` paths (issue 33): a source's datagrams are
    // answered with this pod's identity.
    let pod = state.identity().pod.clone();
    let udp = tokio::spawn(async move {
        if let Err(e) = crate::paths::serve_udp(port, pod).await {
            eprintln!("target-server: cannot serve UDP on port {port}: {e}");
        }
    });
    termination.recv().await;
    dial.abort();
    udp.abort();
    state.set_not_ready();
    eprintln!(
        "target-server: SIGTERM, /readyz now 503, closing in {}",
        humantime::format_duration(args.drain)
    );
    tokio::time::sleep(args.drain).await;
    let _ = stop_tx.send(true);
    let _ = server.await;
    Ok(())
}
