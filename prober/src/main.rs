//! `prober`: thin binary over the `prober` library (parse args, init tracing, run).
//!
//! stdout carries the result (the gate's table); stderr the log. An error that stops the
//! run is one `error: …` line on stderr (one JSON object with `--log-format json`) and
//! exit code 2 (docs/design.md §4: "the run errored").

use clap::Parser;
use prober::config::{Cli, Command};
use prober::console::Console;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
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
