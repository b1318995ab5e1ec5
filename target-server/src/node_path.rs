//! The pod's own programming wait (issue 29): from the pod's first instant to the moment
//! its own network path worked, on its own monotonic clock, independent of readiness.
//!
//! # Method
//! Both modes dial the pod's own node (`--node-ip`, the downward API's `status.hostIP`;
//! `--node-port`, default the kubelet's 10250) from process start: a new TCP connect
//! every `--interval`, each bounded by `--attempt-timeout`, attempts overlapping, until
//! the node answers or `--give-up` passes. The node **answers** when the connect
//! completes or is refused: a SYN-ACK or an RST both prove that the pod's packets reach
//! its node and the node's reach the pod. The wait is the send time of the
//! earliest-sent connect that was answered ([`ProgrammingMethod::NodeDial`]), so it
//! resolves to the dial interval (100 ms by default).
//!
//! Why it measures programming: a CNI agent that has not yet programmed a new endpoint
//! may drop its traffic to and from its own node — Calico Felix does, in
//! `cali-from-wl-dispatch` / `cali-to-wl-dispatch` ("Unknown interface",
//! felix/rules/dispatch.go) — which is also why the kubelet's readiness probe fails until
//! then and a stalled agent makes new pods Ready late.
//!
//! # Fallback and what it cannot see
//! - Clusters whose policy drops pod-initiated traffic to the host (Calico's built-in
//!   `DefaultEndpointToHostAction: Drop`; Calico's own manifests set `Accept`) or that
//!   firewall the kubelet port from pods never answer the dial. The kubelet's own probe
//!   requests still arrive once the path is programmed, so the first request with
//!   `User-Agent: kube-probe/…` that reaches the pod ends the wait instead
//!   ([`ProgrammingMethod::KubeletProbe`]): it resolves to the kubelet's probe period
//!   (1 s for probe pods), plus up to one SYN retransmission (1 s) when the kubelet's
//!   SYN was dropped.
//! - A CNI that lets node traffic through before the endpoint is programmed (no
//!   readiness gating) gives a wait of about 0 here whatever its agent does: the delay
//!   is then after Ready, in TTFP.
//! - A rule that REJECTs with a TCP reset on the pod's own node counts as an answer.
//!
//! Memory: a few counters; the dial stops at the first answer or at give-up.

use crate::http::ServerState;
use crate::ProcessStart;
use firstpacket_report::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};

/// The kubelet's port (Kubernetes docs "Ports and Protocols": 10250, kubelet API),
/// listening on every node: the default `--node-port`.
pub const DEFAULT_NODE_PORT: u16 = 10250;

/// The kubelet's readiness probe period on probe pods (`periodSeconds: 1`), seconds: the
/// resolution of [`firstpacket_report::ProgrammingMethod::KubeletProbe`].
pub const KUBELET_PROBE_PERIOD_SECONDS: f64 = 1.0;

/// Settings of the node dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeDialConfig {
    /// The node's `IP:PORT`; `None` = no node dial (kubelet fallback only).
    pub node: Option<SocketAddr>,
    /// Spacing of connects.
    pub interval: Duration,
    /// Bound on one connect.
    pub attempt_timeout: Duration,
    /// No answer this long after process start → stop dialing.
    pub give_up: Duration,
}

/// How one connect to the node ended: answered (connected or refused), or the failure's
/// kind.
pub fn classify_connect(
    result: Result<std::io::Result<TcpStream>, tokio::time::error::Elapsed>,
) -> Result<(), ErrorKind> {
    match result {
        Ok(Ok(_stream)) => Ok(()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
        Ok(Err(e)) => Err(crate::attempt::classify_io(&e)),
        Err(_) => Err(ErrorKind::Timeout),
    }
}

/// Dials the node until it answers or give-up passes, recording every connect in
/// `state` ([`ServerState::node_dial_sent`] and friends). Returns at once without a
/// node address. Never fails; cancel-safe (dropping it stops the dial).
pub async fn dial_node(config: NodeDialConfig, origin: ProcessStart, state: Arc<ServerState>) {
    dial_node_with(config, origin, state, |node, timeout| async move {
        classify_connect(tokio::time::timeout(timeout, TcpStream::connect(node)).await)
    })
    .await
}

/// [`dial_node`] with the connect injected (`connect(node, attempt_timeout)` → answered
/// or the failure's kind; tests script it).
pub async fn dial_node_with<F, Fut>(
    config: NodeDialConfig,
    origin: ProcessStart,
    state: Arc<ServerState>,
    connect: F,
) where
    F: Fn(SocketAddr, Duration) -> Fut,
    Fut: std::future::Future<Output = Result<(), ErrorKind>> + Send + 'static,
{
    let Some(node) = config.node else {
        return;
    };
    let mut tasks: JoinSet<(f64, Result<(), ErrorKind>)> = JoinSet::new();
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let give_up_at = Instant::from_std(origin.start) + config.give_up;
    let mut sending = true;
    loop {
        if !sending && tasks.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok((sent, result)) = joined {
                    // The first answer stops new connects; in-flight ones still finish,
                    // so the earliest-sent answer is known.
                    if state.node_dial_finished(sent, result) {
                        sending = false;
                    }
                }
            }
            _ = sleep_until(give_up_at), if sending => {
                sending = false;
                state.node_dial_gave_up(origin.elapsed_seconds());
            }
            _ = ticker.tick(), if sending => {
                let sent = origin.elapsed_seconds();
                state.node_dial_sent();
                let attempt = connect(node, config.attempt_timeout);
                tasks.spawn(async move { (sent, attempt.await) });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use firstpacket_report::ProgrammingMethod;

    fn state(node: Option<SocketAddr>) -> Arc<ServerState> {
        ServerState::with_node_dial(
            Identity {
                pod: "p".into(),
                namespace: None,
                ip: None,
                node: None,
            },
            ProcessStart::now(),
            node,
            Duration::from_millis(20),
        )
    }

    fn config(node: Option<SocketAddr>, give_up: Duration) -> NodeDialConfig {
        NodeDialConfig {
            node,
            interval: Duration::from_millis(20),
            attempt_timeout: Duration::from_millis(200),
            give_up,
        }
    }

    const NODE: &str = "192.0.2.1:10250";

    #[tokio::test]
    async fn the_wait_ends_at_the_first_connect_the_node_answers() {
        let node: SocketAddr = NODE.parse().unwrap();
        let origin = ProcessStart::now();
        let st = state(Some(node));
        // The node's path opens 300 ms after start: earlier connects time out
        // (after their 200 ms bound), later ones are answered at once.
        let opens = origin.start + Duration::from_millis(300);
        dial_node_with(
            config(Some(node), Duration::from_secs(5)),
            origin,
            Arc::clone(&st),
            move |_, timeout| async move {
                if std::time::Instant::now() >= opens {
                    Ok(())
                } else {
                    tokio::time::sleep(timeout).await;
                    Err(ErrorKind::Timeout)
                }
            },
        )
        .await;
        let p = st.programming();
        assert_eq!(p.method, Some(ProgrammingMethod::NodeDial));
        let wait = p.wait_seconds.unwrap();
        // Sent at or after the opening, within one interval (+ scheduling slack).
        assert!((0.3..0.3 + 0.02 + 0.05).contains(&wait), "wait {wait}");
        assert_eq!(p.node_dial_first_success_sent, Some(wait));
        assert_eq!(p.resolution_seconds, Some(0.02));
        assert!(p.node_dial_failures >= 10, "{p:?}");
        assert_eq!(p.node_dial_last_error, Some(ErrorKind::Timeout));
        assert_eq!(p.node_dial_gave_up, None);
        assert_eq!(p.node_addr.as_deref(), Some(NODE));
    }

    #[tokio::test]
    async fn a_node_that_never_answers_gives_up_and_the_kubelet_request_is_the_fallback() {
        let node: SocketAddr = NODE.parse().unwrap();
        let origin = ProcessStart::now();
        let st = state(Some(node));
        dial_node_with(
            config(Some(node), Duration::from_millis(150)),
            origin,
            Arc::clone(&st),
            |_, _| async { Err(ErrorKind::Unreachable) },
        )
        .await;
        let p = st.programming();
        assert_eq!(p.method, None, "{p:?}");
        assert_eq!(p.wait_seconds, None);
        assert!(p.node_dial_gave_up.is_some_and(|g| g >= 0.15), "{p:?}");
        assert_eq!(p.node_dial_last_error, Some(ErrorKind::Unreachable));

        let req = hyper::Request::get("/readyz")
            .header(hyper::header::USER_AGENT, "kube-probe/1.32")
            .body(())
            .unwrap();
        st.respond(&req);
        let p = st.programming();
        assert_eq!(p.method, Some(ProgrammingMethod::KubeletProbe));
        assert_eq!(p.wait_seconds, p.first_kubelet_request);
        assert_eq!(p.resolution_seconds, Some(KUBELET_PROBE_PERIOD_SECONDS));
        assert!(p.ready_at.is_some());
    }

    #[tokio::test]
    async fn without_a_node_address_nothing_is_dialed() {
        let st = state(None);
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = Arc::clone(&calls);
        dial_node_with(
            config(None, Duration::from_secs(1)),
            ProcessStart::now(),
            Arc::clone(&st),
            move |_, _| {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Ok(()) }
            },
        )
        .await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
        let p = st.programming();
        assert_eq!(
            (p.method, p.node_addr, p.node_dial_attempts),
            (None, None, 0)
        );
    }

    #[tokio::test]
    async fn a_refused_connect_is_an_answer() {
        // A port nobody listens on, on loopback: the kernel answers with an RST.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let node: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let st = state(Some(node));
        dial_node(
            config(Some(node), Duration::from_secs(2)),
            ProcessStart::now(),
            Arc::clone(&st),
        )
        .await;
        let p = st.programming();
        assert_eq!(p.method, Some(ProgrammingMethod::NodeDial), "{p:?}");
        assert_eq!(p.node_dial_failures, 0);
        assert!(p.wait_seconds.unwrap() < 0.5);
    }

    #[test]
    fn connect_outcomes_map_to_answers_and_kinds() {
        use std::io::{Error, ErrorKind as Io};
        assert_eq!(
            classify_connect(Ok(Err(Error::from(Io::ConnectionRefused)))),
            Ok(())
        );
        assert_eq!(
            classify_connect(Ok(Err(Error::from_raw_os_error(113)))),
            Err(ErrorKind::Unreachable)
        );
    }
}
