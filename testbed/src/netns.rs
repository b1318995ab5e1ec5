//! Running code inside a named network namespace (`/run/netns/<name>`, as made by
//! `ip netns add`).
//!
//! The network namespace is a property of the *thread* (setns(2) with `CLONE_NEWNET`
//! changes only the calling thread), and every socket belongs to the namespace its
//! creating thread was in at `socket()` time, for its whole life. So:
//! - [`NetnsThread`] is one OS thread inside the netns running a current-thread tokio
//!   runtime: futures spawned on its [`NetnsThread::handle`] create their sockets there.
//! - [`run_in_netns`] runs one closure on a short-lived thread inside the netns, e.g. to
//!   bind a `std::net::TcpListener` there and hand it back (the socket stays in that
//!   netns whichever thread later uses it).
//!
//! Do **not** use `spawn_blocking`, `tokio::fs` or DNS (`lookup_host`, `ToSocketAddrs`
//! with names) on a [`NetnsThread`] runtime: tokio's blocking-pool threads can be created
//! from threads outside the netns, so sockets made there may land in the wrong namespace.
//! Use IP literals.

use nix::sched::{setns, CloneFlags};
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::thread::JoinHandle;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Path of a named netns as `ip netns add` creates it.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Opens `/run/netns/<name>`. Errors: the `io::Error` of the open, with the path added.
fn open_netns(name: &str) -> io::Result<File> {
    let path = netns_path(name);
    File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Moves the calling thread into the netns open at `f`.
fn enter(f: &File, name: &str) -> io::Result<()> {
    setns(f, CloneFlags::CLONE_NEWNET)
        .map_err(|e| io::Error::other(format!("setns into netns {name}: {e}")))
}

/// A dedicated OS thread inside a netns, running a current-thread tokio runtime (all
/// drivers enabled). Dropping it (or [`NetnsThread::shutdown`]) stops the runtime, drops
/// every task spawned on it and joins the thread.
pub struct NetnsThread {
    name: String,
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl NetnsThread {
    /// Starts the thread inside netns `netns_name` (must exist under `/run/netns`).
    /// Returns once the runtime is up. Errors: netns missing or `setns` refused (needs
    /// `CAP_SYS_ADMIN`), runtime build failure, thread spawn failure.
    pub fn spawn(netns_name: &str) -> io::Result<NetnsThread> {
        let f = open_netns(netns_name)?;
        let name = netns_name.to_owned();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<Handle>>();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread_name = format!("netns-{name}");
        let ns_name = name.clone();
        let thread = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                if let Err(e) = enter(&f, &ns_name) {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                drop(f);
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
                // Dropping the runtime drops every task still spawned on it.
                drop(rt);
            })?;
        let handle = match ready_rx.recv() {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(io::Error::other(format!(
                    "netns thread for {name} exited before starting"
                )));
            }
        };
        Ok(NetnsThread {
            name,
            handle,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Handle of the runtime inside the netns: `handle().spawn(fut)` runs `fut` there.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// The netns name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops the runtime (dropping its tasks) and joins the thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            // Never join from inside the runtime thread itself (would deadlock).
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for NetnsThread {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl std::fmt::Debug for NetnsThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetnsThread")
            .field("name", &self.name)
            .finish()
    }
}

/// Runs `f` on a fresh thread inside netns `name` and returns its result (blocking the
/// caller until it finishes). Sockets `f` creates stay in that netns. Errors: netns
/// missing, `setns` refused, or `f` panicked (reported as `io::ErrorKind::Other`).
pub fn run_in_netns<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = open_netns(name)?;
    std::thread::scope(|s| {
        let h = s.spawn(move || -> io::Result<T> {
            enter(&file, name)?;
            drop(file);
            Ok(f())
        });
        h.join()
            .map_err(|_| io::Error::other(format!("closure in netns {name} panicked")))?
    })
}
