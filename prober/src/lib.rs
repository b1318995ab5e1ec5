//! firstpacket prober: measures time to first packet (TTFP) between brand-new pods
//! (docs/design.md §2) and gates on it (§4).
//!
//! The modules form layers; each uses only the ones below it (no import circles):
//! - **leaves**: [`kind`] (the probe kinds), [`labels`] (labels and field manager),
//!   [`error`], [`sync`], [`stats`], [`admission`];
//! - **pure logic** (tested without I/O): [`config`] (command line), [`schedule`],
//!   [`podspec`], [`tracker`], [`record`], [`gate`] (verdict, report), [`baseline`],
//!   [`rotation`], [`junit`], [`settings`] (self-defeating flags), the correlation and
//!   exposition parser in [`agents`];
//! - **single API calls**: [`api`] (each call bounded by its timeout), [`apihealth`]
//!   (API outages, told to an [`apihealth::OutageSink`]), [`reclaim`] (deleting an
//!   instance's pods and Services);
//! - **long-lived API parts**: [`podwatch`] (the shared pod watch), [`lease`] (instance
//!   Leases and the reaper of dead instances), [`sweep`] (the start-up sweep),
//!   [`leader`] (`--leader-elect`), [`events`] (Node Events), [`baseline_store`] (the
//!   baseline ConfigMap), agent discovery and scraping in [`agents`];
//! - **one probe**: [`probe`] (its lifecycle, from create to record);
//! - **presentation**: [`console`] (stderr notices, plain or JSON), [`metrics`],
//!   [`bounds`] (each bounded structure's limit), [`admin`] (HTTP server, status page);
//! - **assembly**: [`engine`] (connecting, start-up, the pieces both modes share), then
//!   the modes: [`gate_run`] (`prober gate`), [`run_mode`] (`prober run`), [`cleanup`]
//!   (`prober cleanup`).
//!
//! The route of one `prober gate` probe, from the command line to its record, goes down
//! these layers and never back into a module it left: `main` parses [`config`] →
//! [`gate_run::run_gate`] checks the flags ([`settings`]) → [`engine`] connects
//! ([`apihealth`] records outages), lists the nodes ([`api`], [`schedule`] filters and
//! plans them) and starts up (namespace, [`lease`], [`sweep`], the [`podwatch`], agent
//! discovery in [`agents`]) → [`gate_run`] spawns each planned probe →
//! [`probe::run_probe`]: [`podspec`] builds the pods, [`api`] creates them, the
//! [`podwatch`]'s [`tracker`] follows them to Ready and to the source's termination
//! message, it deletes them ([`api`] again, a call, not a return), [`record`] turns the
//! source report and the timeline into a `ProbeRecord` → back in [`gate_run`], [`gate`] summarises the records, judges
//! the verdict and renders the text; [`junit`] and the report file are written last.

pub mod admin;
pub mod admission;
pub mod agents;
pub mod api;
pub mod apihealth;
pub mod baseline;
pub mod baseline_store;
pub mod blame;
pub mod bounds;
pub mod cleanup;
pub mod config;
pub mod console;
pub mod engine;
pub mod error;
pub mod events;
pub mod gate;
pub mod gate_run;
pub mod junit;
pub mod kind;
pub mod labels;
pub mod leader;
pub mod lease;
pub mod metrics;
pub mod netpol;
pub mod paths;
pub mod podspec;
pub mod podwatch;
pub mod probe;
pub mod reclaim;
pub mod record;
pub mod rotation;
pub mod run_mode;
pub mod schedule;
pub mod settings;
pub mod stats;
pub mod sweep;
pub mod sync;
pub mod tracker;

pub use error::Error;

use config::LogFormat;
use tracing_subscriber::EnvFilter;

/// Installs the tracing subscriber on stderr: `plain` or `json` lines, filter from
/// `RUST_LOG`. Defaults: `json` → `warn,prober=info,kube_client=off,
/// kube_runtime::watcher=off` (progress and summary events for log pipelines); `plain`
/// → `warn,kube_client=off,kube_runtime::watcher=off` (the progress
/// lines and the table already say what the info events would, so a terminal shows
/// only warnings besides them). API errors are reported by the prober itself, with
/// their context. ANSI colours only on a terminal. A second call is a no-op.
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    // kube-runtime's watcher logs every failed retry itself (a 403 floods stderr); the
    // prober's own watches log each trouble once, with context.
    let default = match format {
        LogFormat::Plain => "warn,kube_client=off,kube_runtime::watcher=off",
        LogFormat::Json => "warn,prober=info,kube_client=off,kube_runtime::watcher=off",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
