//! Command line (docs/design.md §6 "target-server flags", binding): `serve [--port 8080]`;
//! `probe --target IP:PORT --expect-pod NAME [--port] [--interval] [--attempt-timeout]
//! [--give-up] [--hold] [--termination-log PATH]`. Durations are humantime (`1.5s`,
//! `100ms`). Every flag has an environment fallback, shown in `--help`.

use crate::node_path::NodeDialConfig;
use crate::probe::ProbeConfig;
use crate::Error;
use clap::{Args, Parser, Subcommand};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Help text naming the identity sources (shown by every `--help`).
pub const IDENTITY_HELP: &str = "Identity served on GET / (the source's check reads `pod`): \
env POD_NAME (downward API metadata.name), else the hostname; POD_NAMESPACE, POD_IP and \
NODE_NAME when set.";

/// `target-server`: the binary inside firstpacket probe pods (`serve` in the target
/// pod, `probe` in the source pod).
#[derive(Debug, Parser)]
#[command(name = "target-server", version, after_help = IDENTITY_HELP)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The modes.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Target pod: serve `/` (identity JSON), `/readyz`, `/healthz`, `/hostname` until
    /// SIGTERM.
    #[command(after_help = IDENTITY_HELP)]
    Serve(ServeArgs),
    /// Source pod: serve like `serve`, dial `--target` from process start, measure, and
    /// write one JSON report line to the termination log and stdout.
    #[command(after_help = IDENTITY_HELP)]
    Probe(ProbeArgs),
    /// A pod sandbox's placeholder process (the `firstpacket/pause` image a real
    /// node's containerd starts first in every pod, like Kubernetes' `pause`): holds
    /// the pod's namespaces and does nothing until SIGTERM or SIGINT, then exits 0.
    /// As PID 1 of its PID namespace it must handle those signals itself (the kernel
    /// ignores a default-disposition signal sent to a namespace's init).
    Pause,
}

/// `target-server serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Port to serve on, all addresses of both families: TCP (HTTP) and UDP (the
    /// identity answer of `probe --path udp/…`). 0 picks a free port (logged on stderr).
    #[arg(long, env = "FIRSTPACKET_PORT", default_value_t = 8080)]
    pub port: u16,
    /// After SIGTERM: how long `/readyz` keeps answering 503 before the listener
    /// closes and the process exits 0. Kept below the prober's
    /// `terminationGracePeriodSeconds: 1` so the kubelet never needs SIGKILL.
    #[arg(long, env = "FIRSTPACKET_DRAIN", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub drain: Duration,
    /// Spacing of the connects to this pod's node (the programming wait's resolution).
    #[arg(long, env = "FIRSTPACKET_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Bound on one connect to the node (below the first SYN retransmission, 1 s).
    #[arg(long, env = "FIRSTPACKET_ATTEMPT_TIMEOUT", default_value = "900ms", value_parser = humantime::parse_duration)]
    pub attempt_timeout: Duration,
    /// Stop dialing the node when it has not answered this long after process start
    /// (the programming wait is then unknown, or the kubelet fallback's).
    #[arg(long, env = "FIRSTPACKET_GIVE_UP", default_value = "60s", value_parser = humantime::parse_duration)]
    pub give_up: Duration,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// The node dial of both modes: how the pod measures its own programming wait (the
/// time until its own path to its node works; see `target_server::node_path`).
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// This pod's node IP (the downward API's `status.hostIP`). Without it the
    /// programming wait comes only from the kubelet's first request (1 s resolution).
    #[arg(long, env = "HOST_IP")]
    pub node_ip: Option<IpAddr>,
    /// Port dialed on the node: an answer (connect or refusal) is what counts, so any
    /// port the node does not firewall from pods works; the kubelet's listens on every
    /// node.
    #[arg(long, env = "FIRSTPACKET_NODE_PORT", default_value_t = crate::node_path::DEFAULT_NODE_PORT)]
    pub node_port: u16,
}

impl NodeArgs {
    /// The node's `IP:PORT`, if an IP was given.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.node_ip.map(|ip| SocketAddr::new(ip, self.node_port))
    }
}

impl ServeArgs {
    /// The node dial's settings. Errors ([`Error::Config`]): `--interval` or
    /// `--attempt-timeout` below 1 ms.
    pub fn node_dial(&self) -> Result<NodeDialConfig, Error> {
        check_spacing(self.interval, self.attempt_timeout)?;
        Ok(NodeDialConfig {
            node: self.node.addr(),
            interval: self.interval,
            attempt_timeout: self.attempt_timeout,
            give_up: self.give_up,
        })
    }
}

fn check_spacing(interval: Duration, attempt_timeout: Duration) -> Result<(), Error> {
    let ms = Duration::from_millis(1);
    if interval < ms {
        return Err(Error::Config(format!(
            "--interval {interval:?} is below 1ms"
        )));
    }
    if attempt_timeout < ms {
        return Err(Error::Config(format!(
            "--attempt-timeout {attempt_timeout:?} is below 1ms"
        )));
    }
    Ok(())
}

/// `target-server probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Target pod address to dial, `IP:PORT` (the target's pod IP or a ClusterIP).
    #[arg(long, env = "FIRSTPACKET_TARGET")]
    pub target: SocketAddr,
    /// Pod name the target must report on `GET /`; any other name is a `wrong_peer`
    /// failure, never a success.
    #[arg(long, env = "FIRSTPACKET_EXPECT_POD")]
    pub expect_pod: String,
    /// TCP port this pod serves its own `/`, `/readyz`, `/healthz` on (all addresses).
    /// 0 picks a free port (logged on stderr).
    #[arg(long, env = "FIRSTPACKET_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Spacing of dial attempts; a new attempt starts every interval, attempts overlap.
    #[arg(long, env = "FIRSTPACKET_INTERVAL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Bound on one attempt (connect + request + answer). Default 900ms: below the
    /// first SYN retransmission (1 s, RFC 6298 initial RTO), so a lost SYN is never
    /// retried inside an attempt.
    #[arg(long, env = "FIRSTPACKET_ATTEMPT_TIMEOUT", default_value = "900ms", value_parser = humantime::parse_duration)]
    pub attempt_timeout: Duration,
    /// Stop with outcome `no_success` (or `wrong_peer`) when nothing succeeded this long
    /// after process start.
    #[arg(long, env = "FIRSTPACKET_GIVE_UP", default_value = "60s", value_parser = humantime::parse_duration)]
    pub give_up: Duration,
    /// Keep dialing this long after the first success, counting failures per second.
    #[arg(long, env = "FIRSTPACKET_HOLD", default_value = "5s", value_parser = humantime::parse_duration)]
    pub hold: Duration,
    /// When dialing ends before the kubelet's readiness probe was answered twice (a
    /// short `--hold` after an early success), wait this long at most for that: TTFP
    /// needs `ready_at`, and a first answer may reach a kubelet that already timed out.
    /// 0 disables the wait.
    #[arg(long, env = "FIRSTPACKET_READY_WAIT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub ready_wait: Duration,
    /// File the report line is written to (created/truncated). The kubelet turns it
    /// into the container's termination message (last 4096 bytes).
    #[arg(
        long,
        env = "FIRSTPACKET_TERMINATION_LOG",
        default_value = "/dev/termination-log"
    )]
    pub termination_log: PathBuf,
    /// Source of a `policy_change` probe (issue 32): dial on through the prober's marks
    /// (`POST /mark/arm|allow|revoke` on `--port`, `GET /policy`) and time the allow
    /// policy's admission and its revocation on this pod's clock. `--give-up` then
    /// bounds each wait: for the allow mark (from process start), for the first answer
    /// after it, for the revoke mark after the hold, and for the revocation.
    #[arg(long, env = "FIRSTPACKET_POLICY_CHANGE")]
    pub policy_change: bool,
    /// `--policy-change`: the revocation is over when no attempt sent this long after
    /// the last answered one was answered (and one was refused). Must exceed
    /// `--attempt-timeout`, so those attempts have all ended.
    #[arg(long, env = "FIRSTPACKET_REVOKE_QUIET", default_value = "2s", value_parser = humantime::parse_duration)]
    pub revoke_quiet: Duration,
    /// An extra path to dial beside `--target` (issue 33), `PROTOCOL/PAYLOAD=IP:PORT`:
    /// protocol `tcp` or `udp`, payload `small` or `mtu` (packets of the route's full
    /// MTU each way, Don't Fragment set), the target's address of the path's family,
    /// e.g. `udp/mtu=10.1.2.3:8080`. Repeat it (or comma-separate) for several; each has
    /// the main path's spacing, timeout, give-up and hold, and its own line in the
    /// report's `paths`. Ignored with `--policy-change`.
    #[arg(long = "path", env = "FIRSTPACKET_PATHS", value_delimiter = ',')]
    pub paths: Vec<crate::paths::PathSpec>,
    /// The full-size packets' IP size for `mtu` paths, bytes (576–9216). Default: the
    /// route's MTU towards each path's target when the probe starts (the pod
    /// interface's MTU unless the kernel knows a smaller path MTU).
    #[arg(long, env = "FIRSTPACKET_MTU", value_parser = clap::value_parser!(u32).range(576..=9216))]
    pub mtu: Option<u32>,
    #[command(flatten)]
    pub node: NodeArgs,
}

impl ProbeArgs {
    /// Validate and convert to the probe's settings.
    ///
    /// Errors ([`Error::Config`]): `--interval` or `--attempt-timeout` below 1 ms (the
    /// attempt log would grow without bound), or more than [`MAX_ATTEMPTS`] attempts
    /// possible in `give-up + hold` (with `--policy-change`: four give-ups + hold +
    /// quiet), or a `--revoke-quiet` not above `--attempt-timeout`.
    pub fn to_config(&self) -> Result<ProbeConfig, Error> {
        check_spacing(self.interval, self.attempt_timeout)?;
        let span = if self.policy_change {
            if self.revoke_quiet <= self.attempt_timeout {
                return Err(Error::Config(format!(
                    "--revoke-quiet {} must exceed --attempt-timeout {} (the refused attempts must have ended)",
                    humantime::format_duration(self.revoke_quiet),
                    humantime::format_duration(self.attempt_timeout)
                )));
            }
            self.give_up * 4 + self.hold + self.revoke_quiet + self.attempt_timeout
        } else {
            self.give_up + self.hold + self.attempt_timeout
        };
        let max_attempts =
            span.as_secs_f64() / self.interval.as_secs_f64() * (1 + self.paths.len()) as f64;
        if max_attempts > MAX_ATTEMPTS as f64 {
            return Err(Error::Config(format!(
                "give-up + hold at --interval {:?} allows {max_attempts:.0} attempts (max {MAX_ATTEMPTS})",
                self.interval
            )));
        }
        Ok(ProbeConfig {
            target: self.target,
            expect_pod: self.expect_pod.clone(),
            port: self.port,
            interval: self.interval,
            attempt_timeout: self.attempt_timeout,
            give_up: self.give_up,
            hold: self.hold,
            ready_wait: self.ready_wait,
            termination_log: self.termination_log.clone(),
            node: self.node.addr(),
            policy_change: self.policy_change.then_some(self.revoke_quiet),
            paths: if self.policy_change {
                Vec::new()
            } else {
                self.paths.clone()
            },
            mtu: self.mtu,
        })
    }
}

/// Most attempts one probe may send: each costs 24 bytes in the attempt log, so this
/// keeps it ≤ ~5 MB even at 1 ms spacing (the default 100 ms × 65 s is 650).
pub const MAX_ATTEMPTS: usize = 200_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("target-server").chain(args.iter().copied()))
    }

    #[test]
    fn probe_defaults_match_the_design_contract() {
        let cli =
            parse(&["probe", "--target", "10.1.2.3:8080", "--expect-pod", "t"]).expect("parse");
        let Command::Probe(p) = cli.command else {
            panic!("not probe")
        };
        let c = p.to_config().expect("config");
        assert_eq!(c.interval, Duration::from_millis(100));
        assert_eq!(c.attempt_timeout, Duration::from_millis(900));
        assert_eq!(c.give_up, Duration::from_secs(60));
        assert_eq!(c.hold, Duration::from_secs(5));
        assert_eq!(c.port, 8080);
        assert_eq!(c.termination_log, PathBuf::from("/dev/termination-log"));
    }

    #[test]
    fn durations_are_humantime() {
        let cli = parse(&[
            "probe",
            "--target",
            "10.1.2.3:8080",
            "--expect-pod",
            "t",
            "--hold",
            "1.5s",
            "--interval",
            "50ms",
        ])
        .expect("parse");
        let Command::Probe(p) = cli.command else {
            panic!("not probe")
        };
        assert_eq!(p.hold, Duration::from_millis(1500));
        assert_eq!(p.interval, Duration::from_millis(50));
    }

    #[test]
    fn target_must_be_ip_and_port() {
        assert!(parse(&["probe", "--target", "10.1.2.3", "--expect-pod", "t"]).is_err());
    }

    #[test]
    fn zero_interval_is_rejected() {
        let cli = parse(&[
            "probe",
            "--target",
            "10.1.2.3:80",
            "--expect-pod",
            "t",
            "--interval",
            "0s",
        ])
        .expect("parse");
        let Command::Probe(p) = cli.command else {
            panic!("not probe")
        };
        assert!(matches!(p.to_config(), Err(Error::Config(_))));
    }

    #[test]
    fn serve_port_defaults_to_8080() {
        let cli = parse(&["serve"]).expect("parse");
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(s.port, 8080);
        assert!(s.drain < Duration::from_secs(1));
    }
}
