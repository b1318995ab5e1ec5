//! `target-server` binary: capture the clocks, parse the flags, run, map the result to an
//! exit code (0 done, 1 runtime error, 2 usage error from clap). Logic lives in the
//! library (`target_server::run`).

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // First thing: every source-report time is measured from here (docs/design.md §2 step 5).
    let origin = target_server::ProcessStart::now();
    let cli = target_server::Cli::parse();
    match target_server::run(cli, origin) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("target-server: error: {e}");
            ExitCode::FAILURE
        }
    }
}
