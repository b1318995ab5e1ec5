//! `testbed` binary: see `testbed --help` and `testbed::cli`.

use clap::Parser;

fn main() {
    // A container runtime executes a CNI plugin by its `type`, without arguments.
    if testbed::cni::invoked_as_plugin() {
        std::process::exit(testbed::cni::plugin_main());
    }
    let cli = testbed::cli::Cli::parse();
    if !matches!(
        cli.cmd,
        testbed::cli::Cmd::Shim { .. } | testbed::cli::Cmd::Cni
    ) {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
            )
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    match testbed::cli::main_with(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("testbed: error: {e:#}");
            std::process::exit(2);
        }
    }
}
