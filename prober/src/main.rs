//! `prober`: thin binary over the `prober` library (parse args, init tracing, run).
//!
//! stdout carries the result (the gate's table); stderr the log. An error that stops the
//! run is one `error: …` line on stderr (one JSON object with `--log-format json`) and
//! exit code 2 (docs/design.md §4: "the run errored").

use clap::Parser;
use prober::config::{Cli, Command};
use prober::console::Console;
use std::process::ExitCode;

fn main() -> ExitCode {
    cap_malloc_arenas();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(run())
}

/// glibc malloc arenas the process may use (`M_ARENA_MAX`), unless the environment sets
/// `MALLOC_ARENA_MAX` itself.
///
/// glibc's default is 8 × CPU cores on 64-bit (mallopt(3)): every tokio worker and
/// blocking-pool thread that allocates gets its own arena, and memory freed in one
/// (a 500 KB list page, a metrics page) stays mapped there for that arena's next
/// allocation. Measured with `prober run` at 1 000 hollow nodes on the real control
/// plane (release, 2 cores, VmRSS after 60 s): 40.3 MiB with the default, 35.4 MiB with
/// 2 arenas, 34 MiB and still growing with 1 (every thread then contends for one lock).
/// The prober is I/O-bound and runs few threads, so 2 costs nothing measurable.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`] before any thread starts (no-op on
/// other C libraries, and when `MALLOC_ARENA_MAX` is set: glibc has already read it).
fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a malloc tunable; called once, before the runtime's
        // threads exist. Its return value (1 ok, 0 error) is advisory: on failure glibc
        // keeps its default and the prober works the same, with more memory.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    let (console, result): (Console, Result<i32, prober::Error>) = match cli.command {
        Command::Gate(args) => {
            prober::init_tracing(args.probe.log_format);
            (
                Console::new(args.probe.log_format),
                prober::gate_run::run_gate(args).await,
            )
        }
        Command::Cleanup(args) => {
            prober::init_tracing(args.log_format);
            (
                Console::new(args.log_format),
                prober::cleanup::run_cleanup(args).await,
            )
        }
        Command::Run(args) => {
            prober::init_tracing(args.probe.log_format);
            (
                Console::new(args.probe.log_format),
                prober::run_mode::run_continuous(args).await,
            )
        }
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(2)),
        Err(e) => {
            console.error(Some(e.reason()), &e.to_string());
            ExitCode::from(2)
        }
    }
}
