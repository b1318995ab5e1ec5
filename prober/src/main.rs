//! `prober`: thin binary over the `prober` library (parse args, init tracing, run).

use clap::Parser;
use prober::config::{Cli, Command};
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<i32> = match cli.command {
        Command::Gate(args) => {
            prober::init_tracing(args.probe.log_format);
            prober::gate_run::run_gate(args).await.map_err(Into::into)
        }
        Command::Run(args) => {
            prober::init_tracing(args.probe.log_format);
            Err(prober::Error::NotImplemented("prober run (continuous mode)".into()).into())
        }
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(2)),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
