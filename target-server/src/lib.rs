//! `target-server`: the tiny binary inside firstpacket probe pods.
//!
//! Two modes (docs/design.md §2 and the §6 flag contract):
//! - `target-server serve [--port 8080]`: the **target** pod T. HTTP/1.1 on
//!   `0.0.0.0:PORT` answering `/` with its identity, `/readyz` (503 after SIGTERM),
//!   `/healthz`, `/hostname` ([`serve`], [`http`]).
//! - `target-server probe --target IP:PORT --expect-pod NAME …`: the **source** pod S.
//!   Serves the same endpoints, dials T from process start, records `ready_at` and
//!   `first_success_sent` on its own monotonic clock, holds, and writes one
//!   [`firstpacket_report::SourceReport`] JSON line to its termination log and stdout ([`probe`],
//!   [`attempt`], [`tally`]).
//!
//! The report types it writes, and their JSON Schema, are the `firstpacket-report`
//! crate's, shared with the prober.

pub mod attempt;
pub mod cli;
pub mod http;
pub mod identity;
pub mod node_path;
pub mod paths;
pub mod policy;
pub mod probe;
pub mod serve;
pub mod tally;

pub use cli::{Cli, Command, ProbeArgs, ServeArgs};
pub use identity::Identity;

use std::time::{Instant, SystemTime};

/// Everything that can stop `target-server` before it has done its job.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The HTTP listener could not be bound (port taken, no permission).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address we tried, e.g. `0.0.0.0:8080`.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokio runtime or a signal handler could not be set up.
    #[error("cannot set up the runtime ({what}): {source}")]
    Runtime {
        /// Which part failed (`runtime`, `SIGTERM handler`, …).
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A flag value that parses but makes no sense (e.g. a zero `--interval`).
    #[error("invalid setting: {0}")]
    Config(String),
}

/// The process' time origin: the monotonic instant and the wall clock captured first
/// thing in `main`. Every source-report time is `Instant` seconds since `start`; the
/// wall clock is only copied into `process_start_unix` for display: it can step (NTP,
/// a skewed node), so no duration is ever taken from it.
#[derive(Debug, Clone, Copy)]
pub struct ProcessStart {
    /// Monotonic process start.
    pub start: Instant,
    /// Wall clock at the same moment (display only).
    pub wall: SystemTime,
}

impl ProcessStart {
    /// Capture both clocks now. Call this first thing in `main`.
    pub fn now() -> Self {
        ProcessStart {
            start: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// Seconds since process start on the monotonic clock.
    pub fn elapsed_seconds(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Wall clock at process start as Unix seconds (0.0 if the clock is before 1970).
    pub fn unix_seconds(&self) -> f64 {
        self.wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }
}

/// `target-server pause`: waits for SIGTERM or SIGINT. Errors ([`Error::Runtime`]):
/// the signal handlers cannot be installed.
async fn pause() -> Result<(), Error> {
    use tokio::signal::unix::{signal, SignalKind};
    let handler = |kind| {
        signal(kind).map_err(|source| Error::Runtime {
            what: "signal handler",
            source,
        })
    };
    let (mut term, mut int) = (
        handler(SignalKind::terminate())?,
        handler(SignalKind::interrupt())?,
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// Run one parsed command line to completion on a current-thread tokio runtime.
///
/// `serve` returns after SIGTERM/SIGINT and the drain; `probe` after its report is
/// written; `pause` after SIGTERM/SIGINT. Errors: [`Error::Bind`] (port taken), [`Error::Runtime`], [`Error::Config`].
pub fn run(cli: Cli, origin: ProcessStart) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Runtime {
            what: "tokio runtime",
            source,
        })?;
    let identity = Identity::from_env();
    match cli.command {
        Command::Serve(args) => rt.block_on(serve::run(args, identity, origin)),
        Command::Probe(args) => {
            let config = args.to_config()?;
            rt.block_on(probe::run(config, identity, origin))
                .map(|_| ())
        }
        Command::Pause => rt.block_on(pause()),
    }
}
