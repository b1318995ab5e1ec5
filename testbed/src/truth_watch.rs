//! Ground truth from a node's real dataplane (docs/design.md §5: "Ground truth in these
//! modes is read from the node's real state, never from a component's word"; §6 truth
//! log): with real Felix and/or real kube-proxy on the nodes, `endpoint_programmed`,
//! `endpoint_revoked` and `service_programmed` are stamped by watching the node's
//! ruleset and routes, not by asking the agents.
//!
//! Per node, a [`NodeWatch`] runs `nft -a monitor` and `ip monitor route` inside the
//! node's network namespace (spawned from its netns thread) and feeds every line to a
//! [`RulesetState`] ([`crate::ruleset`]):
//! - an endpoint is **programmed** from the commit at which the node's ruleset
//!   dispatches its interface to its own chains both ways (Felix's
//!   `cali-from-wl-dispatch` → `cali-fw-IFACE` and `cali-to-wl-dispatch` →
//!   `cali-tw-IFACE`, felix/rules/dispatch.go) while a route to the pod's IP via that
//!   interface exists; **revoked** when either stops while the pod lives;
//! - a Service is **programmed** on the node for an endpoint from the commit at which
//!   kube-proxy's `service-ips` map sends the Service to a chain that dispatches to that
//!   endpoint's DNAT chain.
//!
//! Resolution: `nft monitor` prints each object as the kernel announces the committed
//! transaction and flushes per event; a thread of the daemon reading only that pipe
//! stamps each line as it reads it ([`read_lines_stamped`]), and the truth carries that
//! stamp (checked here: the line arrives 0.1 ms after `nft` returns). Reading costs
//! two idle processes per node and a few microseconds per ruleset line; nothing polls.
//! On a dual-stack node ([`Watching::ipv6`]) an endpoint is programmed only when its
//! interface is dispatched both ways in `table ip6 filter` too and its IPv6 `/128` is
//! routed to it (the route snapshot then takes `ip -6 route show` too), so
//! `endpoint_programmed` is the later of the two families and `endpoint_revoked` comes
//! when either goes; the events carry the IPv4 address as `ip`, as everywhere, and
//! `detail.families` names the families checked (`["ipv4"]` or `["ipv4", "ipv6"]`).
//!
//! What it cannot see: packets themselves (a rule that is present but wrong), and state
//! changed while a monitor restarts is taken from a fresh snapshot, stamped late.
//! The policy truth ([`crate::ipset_watch`]) reads Felix's IPv4 IP sets only.
//!
//! The kubelet tells the watch which pods exist ([`NodeWatch::endpoint_added`] /
//! [`NodeWatch::endpoint_removed`]) through the node's agent; the [`Registry`] maps IPs
//! to pods across nodes for `service_programmed`'s endpoint pod.

use crate::dataplane::PodNet;
use crate::ruleset::{Change, RulesetState, ServiceEndpointKey};
use crate::truth::{Truth, TruthEvent, TruthKind};
use anyhow::{Context, Result};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Pods by IP, across the cluster's nodes (for `service_programmed`).
#[derive(Debug, Default)]
pub struct Registry {
    by_ip: Mutex<HashMap<Ipv4Addr, PodNet>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ipv4Addr, PodNet>> {
        self.by_ip.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live pod holding `ip`.
    pub fn by_ip(&self, ip: Ipv4Addr) -> Option<PodNet> {
        self.lock().get(&ip).cloned()
    }

    /// The IPs of every live pod.
    pub fn ips(&self) -> Vec<Ipv4Addr> {
        self.lock().keys().copied().collect()
    }
}

/// What a [`NodeWatch`] reports.
#[derive(Debug, Clone, Copy)]
pub struct Watching {
    /// Felix's workload dispatch: `endpoint_programmed` / `endpoint_revoked`.
    pub endpoints: bool,
    /// kube-proxy's service maps: `service_programmed`.
    pub services: bool,
    /// Felix's selector IP sets: `policy_programmed` / `policy_revoked`
    /// ([`crate::ipset_watch`]).
    pub policies: bool,
    /// The node is dual-stack (Felix with `ipv6Support`): an endpoint is programmed only
    /// when both families are dispatched and routed ([`RulesetState::dual_stack`]).
    pub ipv6: bool,
}

struct Inner {
    node: String,
    watching: Watching,
    truth: Truth,
    registry: Arc<Registry>,
    state: Mutex<RulesetState>,
    /// This node's live endpoints by interface.
    local: crate::ipset_watch::Locals,
    /// UIDs whose endpoint is programmed now.
    programmed: Mutex<HashSet<String>>,
    /// Commits to the `filter` table, for the IP set watch.
    rules: Arc<crate::ipset_watch::RulesChanged>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One node's ruleset watch (see the module docs). Dropping the last handle stops its
/// monitor processes.
pub struct NodeWatch {
    inner: Arc<Inner>,
    tasks: Vec<tokio::task::AbortHandle>,
    _policies: Option<crate::ipset_watch::PolicyWatch>,
}

impl Drop for NodeWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl std::fmt::Debug for NodeWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeWatch")
            .field("node", &self.inner.node)
            .finish()
    }
}

/// A monitor source: the command, and how its lines and snapshots feed the state.
#[derive(Clone, Copy)]
enum Source {
    Nft,
    Route,
}

impl Source {
    fn monitor(self) -> &'static [&'static str] {
        match self {
            Source::Nft => &["nft", "-a", "monitor"],
            Source::Route => &["ip", "monitor", "route"],
        }
    }

    /// The commands whose outputs, one after the other, are the snapshot (`ipv6`: the
    /// node is dual-stack, its IPv6 routes too).
    fn snapshot(self, ipv6: bool) -> &'static [&'static [&'static str]] {
        match (self, ipv6) {
            (Source::Nft, _) => &[&["nft", "-a", "list", "ruleset"]],
            (Source::Route, false) => &[&["ip", "-4", "route", "show"]],
            (Source::Route, true) => &[
                &["ip", "-4", "route", "show"],
                &["ip", "-6", "route", "show"],
            ],
        }
    }
}

impl NodeWatch {
    /// Starts the watch of `node` on `rt` (the node's netns thread runtime). Returns
    /// once both monitors run and the first snapshots are in. Errors: `nft`/`ip` missing.
    pub async fn start(
        node: &str,
        rt: &tokio::runtime::Handle,
        registry: Arc<Registry>,
        truth: Truth,
        watching: Watching,
    ) -> Result<NodeWatch> {
        let inner = Arc::new(Inner {
            node: node.to_owned(),
            watching,
            truth,
            registry,
            state: Mutex::new(if watching.ipv6 {
                RulesetState::dual_stack()
            } else {
                RulesetState::new()
            }),
            local: Arc::default(),
            programmed: Mutex::new(HashSet::new()),
            rules: Arc::default(),
        });
        let mut tasks = Vec::new();
        for src in [Source::Nft, Source::Route] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = rt.spawn(monitor_loop(Arc::downgrade(&inner), src, Some(tx)));
            tasks.push(task.abort_handle());
            rx.await.context("ruleset monitor task")?.with_context(|| {
                format!("start `{}` in {node}'s netns", src.monitor().join(" "))
            })?;
        }
        let policies = if watching.policies {
            let (node, reg, truth) = (node.to_owned(), inner.registry.clone(), inner.truth.clone());
            let (rules, locals) = (inner.rules.clone(), inner.local.clone());
            let w = rt
                .spawn(async move {
                    crate::ipset_watch::PolicyWatch::start(&node, &reg, truth, rules, locals)
                })
                .await
                .context("IP set watch task")??;
            Some(w)
        } else {
            None
        };
        Ok(NodeWatch {
            inner,
            tasks,
            _policies: policies,
        })
    }

    /// A pod's sandbox exists on this node (the kubelet's CNI ADD): from now on its
    /// programming is reported; if the ruleset already dispatches it (a recreated pod
    /// reusing its interface name), at once.
    pub fn endpoint_added(&self, net: &PodNet) {
        let i = &self.inner;
        lock(&i.registry.by_ip).insert(net.ip, net.clone());
        lock(&i.local).insert(net.iface.clone(), net.clone());
        lock(&i.programmed).remove(&net.uid);
        i.reconcile_endpoints(None);
    }

    /// The pod's sandbox is going away (before CNI DEL): nothing more is reported for it.
    pub fn endpoint_removed(&self, net: &PodNet) {
        let i = &self.inner;
        {
            let mut reg = lock(&i.registry.by_ip);
            if reg.get(&net.ip).is_some_and(|p| p.uid == net.uid) {
                reg.remove(&net.ip);
            }
        }
        {
            let mut local = lock(&i.local);
            if local.get(&net.iface).is_some_and(|p| p.uid == net.uid) {
                local.remove(&net.iface);
            }
        }
        lock(&i.programmed).remove(&net.uid);
        // Its veth goes with CNI DEL, and its routes with it (the kernel announces no
        // route deletion then).
        lock(&i.state).link_removed(&net.iface);
    }

    /// UIDs of this node's endpoints programmed now (tests).
    pub fn programmed(&self) -> HashSet<String> {
        lock(&self.inner.programmed).clone()
    }
}

impl Inner {
    /// Emits `endpoint_programmed`/`endpoint_revoked` for every local endpoint whose
    /// state differs from what the ruleset says now, stamped `at` (the moment the
    /// monitor line that changed it was read) or now.
    fn reconcile_endpoints(&self, at: Option<f64>) {
        if !self.watching.endpoints {
            return;
        }
        let (dispatched, dispatched6) = {
            let st = lock(&self.state);
            (st.dispatched(), st.dispatched6())
        };
        let local: Vec<PodNet> = lock(&self.local).values().cloned().collect();
        let mut programmed = lock(&self.programmed);
        for net in local {
            // On a dual-stack node the pod's IPv6 /128 must be routed to it too.
            let now = dispatched
                .get(&net.iface)
                .is_some_and(|ips| ips.contains(&net.ip))
                && (!self.watching.ipv6
                    || net.ip6.is_none_or(|ip6| {
                        dispatched6
                            .get(&net.iface)
                            .is_some_and(|ips| ips.contains(&ip6))
                    }));
            let was = programmed.contains(&net.uid);
            if now && !was {
                programmed.insert(net.uid.clone());
                self.truth.emit_at(
                    TruthEvent::pod(
                        TruthKind::EndpointProgrammed,
                        &net,
                        json!({ "method": "ruleset", "dispatch": ["cali-from-wl-dispatch", "cali-to-wl-dispatch"],
                                "families": if self.watching.ipv6 { &["ipv4", "ipv6"][..] } else { &["ipv4"][..] } }),
                    ),
                    at,
                );
            } else if !now && was {
                programmed.remove(&net.uid);
                self.truth.emit_at(
                    TruthEvent::pod(
                        TruthKind::EndpointRevoked,
                        &net,
                        json!({ "method": "ruleset", "reason": "dispatch or route gone" }),
                    ),
                    at,
                );
            }
        }
    }

    fn on_change(&self, change: Option<Change>, at: Option<f64>) {
        let Some(c) = change else { return };
        if !c.dispatched_added.is_empty() || !c.dispatched_removed.is_empty() {
            self.reconcile_endpoints(at);
        }
        if self.watching.services {
            for key in &c.services_added {
                self.emit_service(key, true, at);
            }
            for key in &c.services_removed {
                self.emit_service(key, false, at);
            }
        }
    }

    /// `service_programmed` for one endpoint of one Service on this node (the
    /// simulated proxy's convention, [`crate::services::ServiceProgrammed`]: the
    /// endpoint Pod's pod/uid/ip when added; a line with `detail.removed` when gone).
    fn emit_service(&self, key: &ServiceEndpointKey, added: bool, at: Option<f64>) {
        let pod = self.registry.by_ip(key.ip);
        let mut ev = TruthEvent {
            node: Some(self.node.clone()),
            namespace: Some(key.namespace.clone()),
            detail: json!({
                "service": key.service,
                "method": "ruleset",
                "endpoints": if added { vec![key.ip.to_string()] } else { vec![] },
                "removed": if added { vec![] } else { vec![key.ip.to_string()] },
            }),
            ..TruthEvent::new(TruthKind::ServiceProgrammed)
        };
        if added {
            ev.ip = Some(key.ip.to_string());
            if let Some(p) = pod {
                ev.pod = Some(p.pod);
                ev.uid = Some(p.uid);
            }
        }
        self.truth.emit_at(ev, at);
    }

    /// Feeds one monitor line read at `at` (Unix seconds).
    fn feed(&self, src: Source, line: &str, at: f64) {
        if matches!(src, Source::Nft) {
            self.rules.note(line, at);
        }
        let change = {
            let mut st = lock(&self.state);
            match src {
                Source::Nft => st.feed_nft(line),
                Source::Route => st.feed_route(line),
            }
        };
        self.on_change(change, Some(at));
    }

    fn load_snapshot(&self, src: Source, text: &str) {
        let change = {
            let mut st = lock(&self.state);
            match src {
                Source::Nft => st.load_nft_snapshot(text),
                Source::Route => st.load_route_snapshot(text),
            }
        };
        self.on_change(change, None);
    }
}

/// Runs one monitor for the life of the watch: spawn it, take a snapshot, feed every
/// line; when it ends, start again after a second (`ready` answered after the first
/// start).
async fn monitor_loop(
    weak: Weak<Inner>,
    src: Source,
    mut ready: Option<tokio::sync::oneshot::Sender<Result<()>>>,
) {
    loop {
        let argv = src.monitor();
        let mut cmd = tokio::process::Command::new(argv[0]);
        cmd.args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                if let Some(r) = ready.take() {
                    let _ = r.send(Err(e.into()));
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(stdout) = child.stdout.take() else {
            return;
        };
        let mut lines = read_lines_stamped(stdout);
        // Give the monitor a moment to subscribe before the snapshot, so nothing falls
        // between them (a duplicate is harmless: adds are idempotent).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(ipv6) = weak.upgrade().map(|i| i.watching.ipv6) else {
            return;
        };
        let mut text = String::new();
        for snap in src.snapshot(ipv6) {
            let out = tokio::process::Command::new(snap[0])
                .args(&snap[1..])
                .output()
                .await
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            text.push_str(&out);
        }
        match weak.upgrade() {
            Some(inner) => inner.load_snapshot(src, &text),
            None => return,
        }
        if let Some(r) = ready.take() {
            let _ = r.send(Ok(()));
        }
        while let Some((at, line)) = lines.recv().await {
            let Some(inner) = weak.upgrade() else { return };
            inner.feed(src, &line, at);
        }
        let _ = child.kill().await;
        tracing::warn!(monitor = %src.monitor().join(" "), "ruleset monitor ended; restarting");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The monitor's output lines, each with the wall time (Unix seconds) it was read at,
/// read on a thread of its own: the node's runtime may be busy for a while (every
/// pod's simulated kubelet work runs there) and a line read late would be stamped
/// late. The thread ends at the pipe's end (the monitor exited or was killed); the
/// channel then closes. When the pipe cannot be taken over from tokio (an error logged)
/// or the thread cannot start, the channel closes at once and the monitor is restarted.
fn read_lines_stamped(
    stdout: tokio::process::ChildStdout,
) -> tokio::sync::mpsc::UnboundedReceiver<(f64, String)> {
    use std::io::BufRead;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    match stdout.into_owned_fd() {
        Ok(fd) => {
            let spawned = std::thread::Builder::new()
                .name("truth-monitor".into())
                .spawn(move || {
                    let reader = std::io::BufReader::new(std::fs::File::from(fd));
                    for line in reader.lines() {
                        let Ok(line) = line else { break };
                        if tx.send((crate::truth::unix_now(), line)).is_err() {
                            break;
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "truth monitor reader thread not started");
            }
        }
        Err(e) => tracing::error!(error = %e, "truth monitor pipe not taken over"),
    }
    rx
}
