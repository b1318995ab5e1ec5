//! The daemon's real-control-plane mode (`testbed up --control-plane real`): starts
//! [`ControlPlane`] in the host netns, writes the kubeconfigs (HTTPS, admin client
//! certificate) and `ready.json`, and serves the control socket with the real
//! variants of the `api` commands.
//!
//! The built-in API server, scheduler and controllers are not started. The node
//! components (kubelets, agents, service proxy) are the same as on the built-in control
//! plane ([`crate::daemon::start_nodes`]) and reach kube-apiserver with
//! [`ControlPlane::node_endpoint`]. They start once kube-controller-manager has created
//! the `default` ServiceAccounts of `default` and `kube-system` (ServiceAccount
//! admission rejects pods before that); `ready.json` is written once every Node is
//! Ready and the node-lifecycle controller has removed its
//! `node.kubernetes.io/not-ready` taint (TaintNodesByCondition puts it on every new
//! Node), so pods created right after `testbed up` schedule at once.

use super::{locate_binaries, ControlPlane};
use crate::client::{ClientIdentity, ClusterEndpoint};
use crate::daemon::{DaemonArgs, Nodes, ReadyInfo};
use crate::dataplane::Dataplane;
use crate::fault::Faults;
use crate::netns::NetnsThread;
use crate::plan::Plan;
use crate::truth::Truth;
use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// Runs the daemon on the real control plane until SIGTERM/SIGINT or `shutdown`; stops
/// every control-plane process before returning (the caller removes the network).
/// Errors: binaries missing, a component not ready (with its log tail), file I/O.
pub async fn run(
    args: &DaemonArgs,
    plan: &Plan,
    dataplane: &Arc<Dataplane>,
    truth: &Truth,
    faults: &Faults,
) -> Result<()> {
    let bin = locate_binaries(args.control_plane_bin.as_deref())?;
    let cfg = super::Config::for_plan(plan, &bin);
    let cp = ControlPlane::start(cfg)
        .await
        .context("start the real control plane")?;
    // Before the nodes: a real node's runtime calls CNI as soon as it runs pods.
    let cni = crate::cni::CniServer::start(
        &crate::cni::socket_path(&args.state_dir),
        dataplane.clone(),
        Default::default(),
    )
    .context("serve the CNI socket")?;
    let mut nodes = None;
    let result = serve(args, plan, dataplane, truth, faults, &cp, &cni, &mut nodes).await;
    cni.shutdown().await;
    if let Some(n) = nodes {
        n.shutdown().await;
    }
    cp.stop().await;
    result
}

/// How long `up` waits for the controller-manager's ServiceAccounts and for the Nodes
/// to be Ready without the not-ready taint.
const NODES_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Polls `probe` (a GET as the bootstrap identity answering 200 with a JSON body) every
/// 200 ms until `done` holds for the body or [`NODES_READY_TIMEOUT`] passes. Errors:
/// the deadline, naming `what` and the last answer.
async fn wait_object(
    cp: &ControlPlane,
    path: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + NODES_READY_TIMEOUT;
    let mut last;
    loop {
        match cp.request("GET", path, None).await {
            Ok((200, body)) => {
                if serde_json::from_slice::<Value>(&body).is_ok_and(|v| done(&v)) {
                    return Ok(());
                }
                last = String::from_utf8_lossy(&body).chars().take(400).collect();
            }
            Ok((code, body)) => {
                last = format!("HTTP {code}: {}", String::from_utf8_lossy(&body))
                    .chars()
                    .take(400)
                    .collect();
            }
            Err(e) => last = format!("{e:#}"),
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("{what} not within {NODES_READY_TIMEOUT:?}; GET {path}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether Node `n` is Ready (condition True) and carries no
/// `node.kubernetes.io/not-ready` taint.
fn node_schedulable_ready(n: &Value) -> bool {
    let ready = n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let tainted = n["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["key"] == "node.kubernetes.io/not-ready");
    ready && !tainted
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    args: &DaemonArgs,
    plan: &Plan,
    dataplane: &Arc<Dataplane>,
    truth: &Truth,
    faults: &Faults,
    cp: &ControlPlane,
    cni: &crate::cni::CniServer,
    nodes_out: &mut Option<Nodes>,
) -> Result<()> {
    let state = &args.state_dir;
    // `kubeconfig` (this machine): a TCP relay on 127.0.0.1 into the host netns, so the
    // server certificate's 127.0.0.1 SAN matches; `kubeconfig-cluster`: the bridge URL.
    let host = NetnsThread::spawn(&plan.host_netns).context("start the host netns runtime")?;
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind the API relay on 127.0.0.1")?;
    let local = relay.local_addr()?;
    let upstream = SocketAddr::from((plan.bridge_ip, plan.api_port));
    tokio::spawn(relay_loop(relay, host.handle(), upstream));
    let kc = state.join("kubeconfig");
    let kcc = state.join("kubeconfig-cluster");
    cp.write_kubeconfig(super::pki::ADMIN, &format!("https://{local}"), &kc)?;
    cp.write_kubeconfig(super::pki::ADMIN, &cp.config().api_url(), &kcc)?;

    // ServiceAccount admission rejects pods ("error looking up service account") until
    // kube-controller-manager has created the namespace's `default` ServiceAccount.
    for ns in ["default", "kube-system"] {
        wait_object(
            cp,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/default"),
            &format!("ServiceAccount {ns}/default (kube-controller-manager)"),
            |_| true,
        )
        .await?;
    }
    let ep = cp.node_endpoint();
    let endpoint = ClusterEndpoint {
        url: ep.url,
        ca_pem: Some(ep.ca_pem),
        identity: ClientIdentity::Certificate {
            cert_pem: ep.cert_pem,
            key_pem: ep.key_pem,
        },
    };
    let pod_ca = cp.config().pki_dir().join("ca.crt");
    let nodes =
        crate::daemon::start_nodes(args, plan, dataplane, truth, faults, &endpoint, &pod_ca)
            .await
            .context("start the node components")?;
    cni.add_agents(nodes.agents());
    let kubelets = nodes.kubelets.clone();
    let real_nodes = nodes.real.clone();
    let felix = nodes.felix.clone();
    *nodes_out = Some(nodes);
    for n in &plan.nodes {
        wait_object(
            cp,
            &format!("/api/v1/nodes/{}", n.name),
            &format!(
                "Node {} Ready without the node.kubernetes.io/not-ready taint",
                n.name
            ),
            node_schedulable_ready,
        )
        .await?;
    }
    // Real Felix: `up` returns once every Felix reports ready (its `/readiness`).
    for f in &felix {
        let deadline = tokio::time::Instant::now() + NODES_READY_TIMEOUT;
        while !f.process().is_ready() {
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "Felix on {} not ready within {NODES_READY_TIMEOUT:?}; its log {} ends:\n{}",
                    f.node(),
                    f.log_path().display(),
                    super::log_tail(&f.log_path(), 15)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Hollow nodes: registered once the netns nodes are up; `up` returns when the
    // node-lifecycle controller has lifted their not-ready taints too.
    let hollow = crate::daemon::start_hollow(args, plan, dataplane, truth, &endpoint).await?;
    if let Some(h) = &hollow {
        let want = h.names().len();
        let selector = format!(
            "/api/v1/nodes?labelSelector={}%3Dtrue",
            crate::hollow::HOLLOW_LABEL
        );
        wait_object(
            cp,
            &selector,
            &format!("{want} hollow Nodes Ready without the node.kubernetes.io/not-ready taint"),
            |list| {
                let items = list["items"].as_array();
                items.is_some_and(|i| i.len() == want && i.iter().all(node_schedulable_ready))
            },
        )
        .await?;
    }
    let info = ReadyInfo {
        pid: std::process::id(),
        hollow_nodes: hollow
            .as_ref()
            .map(crate::daemon::HollowNodes::names)
            .unwrap_or_default(),
        api_local: format!("https://{local}"),
        api_cluster: cp.config().api_url(),
        kubeconfig: kc,
        kubeconfig_cluster: kcc,
        nodes: plan.nodes.iter().map(|n| n.name.clone()).collect(),
        control_plane: super::Mode::Real.as_arg().to_owned(),
        agent: args.agent.as_arg(),
        kube_proxy: args.kube_proxy.as_arg().to_owned(),
    };
    let sock_path = state.join("control.sock");
    let _ = std::fs::remove_file(&sock_path);
    let control = tokio::net::UnixListener::bind(&sock_path)?;
    std::fs::write(state.join("ready.json"), serde_json::to_vec_pretty(&info)?)?;
    tracing::info!(api = %info.api_cluster, pids = ?cp.pids(), "testbed up (real control plane)");

    let nodes: Vec<String> = plan.nodes.iter().map(|n| n.name.clone()).collect();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            conn = control.accept() => {
                let Ok((stream, _)) = conn else { continue };
                let parts = NodeParts { names: &nodes, kubelets: &kubelets, real: &real_nodes };
                if handle_control(stream, cp, args, faults, truth, &parts).await {
                    break;
                }
            }
        }
    }
    tracing::info!("shutting down");
    drop(hollow);
    Ok(())
}

/// Relays every connection accepted on `relay` (this machine's loopback) to `upstream`
/// (kube-apiserver in the host netns), the upstream socket made on `host`'s thread.
async fn relay_loop(
    relay: tokio::net::TcpListener,
    host: tokio::runtime::Handle,
    upstream: SocketAddr,
) {
    loop {
        let Ok((conn, _)) = relay.accept().await else {
            // e.g. out of file descriptors: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let Ok(conn) = conn.into_std() else { continue };
        host.spawn(async move {
            let Ok(mut conn) = tokio::net::TcpStream::from_std(conn) else {
                return;
            };
            if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
            }
        });
    }
}

/// One control command (same line protocol as the built-in mode: one line in, `ok…` or
/// `error …` out). Returns true on `shutdown`.
/// The nodes as control commands see them.
#[derive(Clone, Copy)]
struct NodeParts<'a> {
    /// The cluster's node names.
    names: &'a [String],
    /// Simulated kubelets.
    kubelets: &'a [Arc<crate::kubelet::Kubelet>],
    /// Real kubelets with containerd (`--kubelet real`).
    real: &'a [Arc<crate::realnode::RealNode>],
}

async fn handle_control(
    stream: tokio::net::UnixStream,
    cp: &ControlPlane,
    args: &DaemonArgs,
    faults: &Faults,
    truth: &Truth,
    nodes: &NodeParts<'_>,
) -> bool {
    let (r, mut w) = stream.into_split();
    let mut lines = tokio::io::BufReader::new(r).lines();
    let Ok(Some(line)) = lines.next_line().await else {
        return false;
    };
    let (answer, stop) = answer(&line, cp, args, faults, truth, nodes).await;
    let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
    stop
}

async fn answer(
    line: &str,
    cp: &ControlPlane,
    args: &DaemonArgs,
    faults: &Faults,
    truth: &Truth,
    nodes: &NodeParts<'_>,
) -> (String, bool) {
    let NodeParts {
        names: node_names,
        kubelets,
        real,
    } = *nodes;
    let ok = || ("ok".to_string(), false);
    let err = |e: anyhow::Error| {
        (
            format!("error {}", format!("{e:#}").replace('\n', " | ")),
            false,
        )
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let deny = cp.deny_list();
    match words.as_slice() {
        ["shutdown"] => ("ok".to_string(), true),
        ["fault-set", path] => (
            crate::daemon::apply_fault(
                std::path::Path::new(path),
                faults,
                truth,
                node_names,
                &args.agent,
                args.kube_proxy,
                args.kubelet,
                args.ipv6,
            ),
            false,
        ),
        // The kubelet stops (or resumes) its heartbeats; kube-controller-manager's
        // node-lifecycle controller marks the Node NotReady and taints it after its
        // grace (`--node-monitor-grace-period`), and clears both once the Lease is
        // renewed again.
        ["node-stop", node] => {
            match crate::daemon::pause_node(kubelets, real, truth, node, true).await {
                Ok(()) => ok(),
                Err(e) => err(anyhow!(e)),
            }
        }
        ["node-start", node] => {
            match crate::daemon::pause_node(kubelets, real, truth, node, false).await {
                Ok(()) => ok(),
                Err(e) => err(anyhow!(e)),
            }
        }
        ["agent-roll", node, image, down @ ..] if down.len() <= 1 => (
            crate::daemon::roll_agent(kubelets, node, image, down.first().copied()).await,
            false,
        ),
        ["api-deny", verb, resource, ns @ ..] if ns.len() <= 1 => {
            deny.deny(verb, resource, ns.first().copied());
            ok()
        }
        ["api-deny-nodes-too", verb, resource, ns @ ..] if ns.len() <= 1 => {
            deny.deny_everyone(verb, resource, ns.first().copied());
            ok()
        }
        ["api-allow", verb, resource, ns @ ..] if ns.len() <= 1 => {
            if deny.allow(verb, resource, ns.first().copied()) {
                ok()
            } else {
                let scope = ns
                    .first()
                    .map(|n| format!(" in namespace {n}"))
                    .unwrap_or_default();
                err(anyhow!("{verb} {resource}{scope} was not denied"))
            }
        }
        ["api-allow-all"] => {
            deny.allow_all();
            ok()
        }
        ["api-stop"] => {
            cp.api_stop().await;
            ok()
        }
        ["api-start"] => match cp.api_start().await {
            Ok(()) => ok(),
            Err(e) => err(e.context("start kube-apiserver")),
        },
        ["api-restart"] => match cp.api_restart().await {
            Ok(()) => ok(),
            Err(e) => err(e.context("restart kube-apiserver")),
        },
        ["api-expire-watches"] => match cp.expire_watches().await {
            Ok(rev) => (
                format!("ok etcd compacted at revision {rev}, kube-apiserver restarted"),
                false,
            ),
            Err(e) => err(e.context("expire watches")),
        },
        _ => err(anyhow!("unknown control command {line:?}")),
    }
}
