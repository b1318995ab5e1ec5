//! Shared network-namespace harness of the dataplane-level tests (`dataplane.rs`,
//! `faults.rs`, `services.rs`; docs/design.md §5 "Topology", "Programmed" and "Isolation"): a
//! [`Bed`] per scenario (Plan + Dataplane + truth log in its own state dir, destroyed by
//! a drop guard even when the test panics, one scenario at a time per test binary), a
//! tiny TCP server inside a pod netns ([`serve`]), one-exchange dial helpers that run
//! inside a netns ([`dial`], [`dial_within`], [`dial_port`]), agents for every node and
//! polling helpers for asynchronous effects ([`poll_until`], [`Bed::events_until`]).
//! Needs root, `ip` and `nft`.
// Each test binary compiles its own copy and uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use testbed::agent::Agent;
use testbed::dataplane::{list_netns, Dataplane, PodNet};
use testbed::fault::Faults;
use testbed::netns::{run_in_netns, NetnsThread};
use testbed::plan::Plan;
use testbed::truth::{read_truth, unix_now, Truth, TruthEvent, TruthKind};

/// Runs the scenarios of one test binary one at a time: they share `ip`/`nft` state.
static SERIAL: Mutex<()> = Mutex::new(());

/// Port of every pod's test server (the container port the tests dial).
pub const PORT: u16 = 8080;

/// One scenario's testbed: state dir `<tmp>/<prefix>-<pid>-<name>`, plan, dataplane
/// and a truth log at `<dir>/truth.jsonl`; destroyed on drop (even when the test
/// panics). Holds the binary's serial lock for its whole life.
pub struct Bed {
    pub plan: Plan,
    pub dp: Arc<Dataplane>,
    pub dir: PathBuf,
    pub truth: Truth,
    pub truth_path: PathBuf,
    /// When set, dropping the bed (outside a panic) asserts that no netns of the plan
    /// is left behind.
    check_leftovers: bool,
    _serial: MutexGuard<'static, ()>,
}

impl Bed {
    /// Creates the dataplane of `nodes` nodes for scenario `name`; `prefix` names the
    /// test binary in the state dir. Panics when the plan or dataplane cannot be made.
    pub fn new(prefix: &str, name: &str, nodes: usize) -> Bed {
        Bed::with_families(prefix, name, nodes, false)
    }

    /// [`Bed::new`] with a dual-stack plan (`Plan::with_ipv6`): every node and pod has
    /// an IPv6 address beside its IPv4 one.
    pub fn dual_stack(prefix: &str, name: &str, nodes: usize) -> Bed {
        Bed::with_families(prefix, name, nodes, true)
    }

    fn with_families(prefix: &str, name: &str, nodes: usize, ipv6: bool) -> Bed {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut plan = Plan::new(&dir, nodes).expect("plan");
        if ipv6 {
            plan = plan.with_ipv6();
        }
        let dp = Arc::new(Dataplane::create(&plan).expect("create dataplane"));
        let truth_path = dir.join("truth.jsonl");
        let truth = Truth::open(&truth_path).expect("truth");
        Bed {
            plan,
            dp,
            dir,
            truth,
            truth_path,
            check_leftovers: false,
            _serial: serial,
        }
    }

    /// Also asserts on drop (unless already panicking) that no netns is left behind.
    pub fn checking_leftovers(mut self) -> Bed {
        self.check_leftovers = true;
        self
    }

    /// The truth log and its path.
    pub fn truth(&self) -> (Truth, PathBuf) {
        (self.truth.clone(), self.truth_path.clone())
    }

    /// Netns name of node `i` (0-based).
    pub fn node_ns(&self, i: usize) -> String {
        self.plan.nodes[i].netns.clone()
    }

    /// Every truth event of `kind` so far.
    pub fn events(&self, kind: TruthKind) -> Vec<TruthEvent> {
        read_truth(&self.truth_path)
            .expect("read truth")
            .into_iter()
            .filter(|e| e.event == kind)
            .collect()
    }

    /// The truth events of `kind` about pod `uid` so far.
    pub fn pod_events(&self, kind: TruthKind, uid: &str) -> Vec<TruthEvent> {
        events(&self.truth_path, kind, uid)
    }

    /// Agents for every node, writing to this bed's truth log; `labels` are
    /// `(node, key, value)` triples.
    pub fn agents(&self, faults: &Faults, labels: &[(&str, &str, &str)]) -> Vec<Arc<Agent>> {
        self.plan
            .nodes
            .iter()
            .map(|n| {
                let l: BTreeMap<String, String> = labels
                    .iter()
                    .filter(|(node, _, _)| *node == n.name)
                    .map(|(_, k, v)| (k.to_string(), v.to_string()))
                    .collect();
                Arc::new(Agent::new(
                    n.clone(),
                    l,
                    self.dp.clone(),
                    self.truth.clone(),
                    faults.clone(),
                ))
            })
            .collect()
    }

    /// Adds pod `pod` (namespace `default`, a fresh uid) on node `node` (0-based) and
    /// tells `agent` about the new endpoint.
    pub fn add(&self, agent: &Agent, node: usize, pod: &str) -> PodNet {
        let net = self
            .dp
            .add_pod(
                &self.plan.nodes[node].name,
                "default",
                pod,
                &format!("uid-{pod}-{}", unix_now()),
            )
            .expect("add pod");
        agent.endpoint_added(&net);
        net
    }

    /// Polls the truth log (every 10 ms, at most `limit`) until it holds at least `n`
    /// events of `kind`; returns them as last read, so the caller asserts on what it
    /// saw. The agent logs a change right after making it, so a packet can pass (or
    /// fail) a moment before its event is in the log.
    pub fn events_until(&self, kind: TruthKind, n: usize, limit: Duration) -> Vec<TruthEvent> {
        poll_until(limit, TRUTH_POLL, || self.events(kind), |e| e.len() >= n)
    }

    /// [`Bed::events_until`] for the events of `kind` about pod `uid`.
    pub fn pod_events_until(
        &self,
        kind: TruthKind,
        uid: &str,
        n: usize,
        limit: Duration,
    ) -> Vec<TruthEvent> {
        poll_until(
            limit,
            TRUTH_POLL,
            || self.pod_events(kind, uid),
            |e| e.len() >= n,
        )
    }

    /// Waits (≤ `limit`) until `uid` has an `endpoint_programmed` event; returns its t.
    pub fn wait_programmed(&self, uid: &str, limit: Duration) -> f64 {
        let end = Instant::now() + limit;
        loop {
            if let Some(e) = self.pod_events(TruthKind::EndpointProgrammed, uid).first() {
                return e.t;
            }
            assert!(Instant::now() < end, "{uid} never programmed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Err(e) = Dataplane::destroy(&self.plan) {
            eprintln!("destroy failed: {e}");
        }
        let left = list_netns(&self.plan.prefix);
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.check_leftovers && !std::thread::panicking() {
            assert!(left.is_empty(), "netns left behind: {left:?}");
        }
    }
}

/// How often [`Bed::events_until`] reads the truth log again.
pub const TRUTH_POLL: Duration = Duration::from_millis(10);

/// How long a check of an asynchronous effect (a truth event, a metric, an agent
/// state) waits for it: generous, far above what the effects take here.
pub const EFFECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Calls `probe` every `every` until `done` holds for its value or `limit` has passed
/// (always at least once); returns the last value, so the caller asserts on what it
/// last saw.
pub fn poll_until<T>(
    limit: Duration,
    every: Duration,
    mut probe: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let v = probe();
        if done(&v) || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(every);
    }
}

/// The truth events of `kind` about pod `uid` in the log at `path`.
pub fn events(path: &Path, kind: TruthKind, uid: &str) -> Vec<TruthEvent> {
    read_truth(path)
        .expect("read truth")
        .into_iter()
        .filter(|e| e.event == kind && e.uid.as_deref() == Some(uid))
        .collect()
}

/// A tiny TCP server inside a pod netns: answers every connection on [`PORT`] with
/// `<name>\n`. Runs on a [`NetnsThread`]; stops when dropped.
pub struct Server {
    _thread: NetnsThread,
}

/// Starts a [`Server`] in `netns`; panics when it cannot bind within 5 s.
pub fn serve(netns: &str, name: &str) -> Server {
    serve_on(netns, name, IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// [`serve`] on `[::]:`[`PORT`]: answers over IPv6 and (as a dual-stack socket, Linux's
/// `bindv6only` 0 default) over IPv4 too.
pub fn serve_any(netns: &str, name: &str) -> Server {
    serve_on(netns, name, IpAddr::V6(Ipv6Addr::UNSPECIFIED))
}

fn serve_on(netns: &str, name: &str, bind: IpAddr) -> Server {
    let thread = NetnsThread::spawn(netns).expect("netns thread");
    let (tx, rx) = std::sync::mpsc::channel();
    let reply = format!("{name}\n");
    thread.handle().spawn(async move {
        // Bound inside the runtime's thread, hence inside the pod netns.
        let l = match tokio::net::TcpListener::bind((bind, PORT)).await {
            Ok(l) => {
                let _ = tx.send(Ok(()));
                l
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        loop {
            if let Ok((mut s, _)) = l.accept().await {
                let reply = reply.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    // Read the request first: closing with unread data would send RST.
                    let mut req = [0u8; 64];
                    let _ = tokio::time::timeout(Duration::from_secs(1), s.read(&mut req)).await;
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("server start")
        .expect("bind");
    Server { _thread: thread }
}

/// One TCP exchange (request line, answer) from inside netns `from` to `ip:port`, with
/// `connect` as connect budget and 300 ms to read. Returns the peer's answer or the
/// error text.
pub fn dial_port(from: &str, ip: Ipv4Addr, port: u16, connect: Duration) -> Result<String, String> {
    dial_ip(from, IpAddr::V4(ip), port, connect)
}

/// [`dial_port`] to an address of either family.
pub fn dial_ip(from: &str, ip: IpAddr, port: u16, connect: Duration) -> Result<String, String> {
    run_in_netns(from, || {
        let addr = SocketAddr::from((ip, port));
        let mut s = TcpStream::connect_timeout(&addr, connect).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .map_err(|e| e.to_string())?;
        let _ = s.write_all(b"hi\n");
        let mut buf = String::new();
        s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
        Ok(buf)
    })
    .map_err(|e| e.to_string())?
}

/// [`dial_port`] to `ip:`[`PORT`] with a `connect` budget (below the first SYN
/// retransmit, a dropped SYN is one failed connection).
pub fn dial_within(from: &str, ip: Ipv4Addr, connect: Duration) -> Result<String, String> {
    dial_port(from, ip, PORT, connect)
}

/// [`dial_ip`] to `[ip]:`[`PORT`] (IPv6) with a 300 ms connect budget.
pub fn dial6(from: &str, ip: Ipv6Addr) -> Result<String, String> {
    dial_ip(from, IpAddr::V6(ip), PORT, Duration::from_millis(300))
}

/// [`dial_port`] to `ip:`[`PORT`] with a 300 ms connect budget.
pub fn dial(from: &str, ip: Ipv4Addr) -> Result<String, String> {
    dial_within(from, ip, Duration::from_millis(300))
}

/// Dials `ip:`[`PORT`] (100 ms connect budget: a dropped SYN is not retransmitted
/// within it) every `every` until success or `limit`; returns the wall time (Unix s)
/// at which the successful attempt was sent.
pub fn first_success(from: &str, ip: Ipv4Addr, every: Duration, limit: Duration) -> Option<f64> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let sent = unix_now();
        if dial_within(from, ip, Duration::from_millis(100)).is_ok() {
            return Some(sent);
        }
        std::thread::sleep(every);
    }
    None
}

/// A two-worker multi-thread tokio runtime with all drivers.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
