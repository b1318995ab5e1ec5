//! Operator notices on **stderr** (the gate's "progress line while running", docs/design.md §4):
//! the seed line, one line per finished probe, the early-stop notice, sweep and signal
//! notices, run-fatal errors and "report written".
//!
//! stdout carries the result (the table, `--dry-run`'s plan); stderr carries the log. With
//! `--log-format plain` (the default) a notice is one human line, as `eprintln!` printed
//! it; with `--log-format json` it is a `tracing` event with structured fields
//! (`probe_id`, `kind`, `src_node`, `dst_node`, `result`, `reason`, `ttfp_seconds`,
//! `seed`, …) that the subscriber installed by [`crate::init_tracing`] writes as one JSON
//! object per line, so every stderr line parses as JSON. Events use the target
//! `prober::console` (filtered like the rest of `prober` by `RUST_LOG`).

use crate::config::LogFormat;
use crate::gate::progress_line;
use firstpacket_report::ProbeRecord;

/// The path that means "stdout, between markers" for `--report` (and the gate's other
/// output files).
pub const STDOUT_PATH: &str = "-";

/// Where the gate's notices go: plain lines or JSON events (module docs). `Copy`, so
/// tasks take their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Console {
    format: LogFormat,
}

impl Console {
    /// A console writing in `format` (`--log-format`).
    pub fn new(format: LogFormat) -> Self {
        Console { format }
    }

    fn json(&self) -> bool {
        self.format == LogFormat::Json
    }

    /// The start line: instance id and the shuffle seed (so a run can be repeated).
    pub fn seed(&self, instance: &str, seed: u64) {
        if self.json() {
            tracing::info!(target: "prober::console", instance, seed,
                "gate started (repeat the plan with --seed)");
        } else {
            eprintln!(
                "firstpacket gate {instance}: seed {seed} (repeat the plan with --seed {seed})"
            );
        }
    }

    /// The gate's verdict (JSON only: the table on stdout says it for humans): one
    /// `gate verdict` event with `verdict`, `exit_code`, `diagnosis`, `probes`.
    pub fn verdict(&self, r: &firstpacket_report::GateReport) {
        if self.json() {
            let diagnosis = serde_json::to_value(r.summary.diagnosis)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let verdict = serde_json::to_value(r.verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            tracing::info!(target: "prober::console", verdict = %verdict, exit_code = r.exit_code,
                diagnosis = %diagnosis, probes = r.probes.len(), "gate verdict");
        }
    }

    /// `prober run` started: instance, admin address, interval and concurrency.
    pub fn run_started(&self, instance: &str, admin_addr: &str, interval: f64, concurrency: u32) {
        if self.json() {
            tracing::info!(target: "prober::console", instance, admin_addr,
                probe_interval_seconds = interval, concurrency, "prober run started");
        } else {
            eprintln!(
                "firstpacket run {instance}: a probe every {interval}s (±20 %), {concurrency} at a time; admin server on {admin_addr}"
            );
        }
    }

    /// A leadership change of `prober run --leader-elect`: `leading` true when this
    /// replica starts a term (it probes), false when it stands by (`holder` the Lease's
    /// holder as last read).
    pub fn leadership(&self, leading: bool, identity: &str, lease: &str, holder: Option<&str>) {
        let holder = holder.unwrap_or("none");
        if self.json() {
            tracing::info!(target: "prober::console", leading, identity, lease, holder, "leadership changed");
        } else if leading {
            eprintln!("leader election: {identity} leads (Lease {lease}): probing");
        } else {
            eprintln!("leader election: {identity} stands by (Lease {lease}, holder {holder}): not probing");
        }
    }

    /// One finished probe of `prober run` (the `n`th): `#n id kind src → dst result
    /// [ttfp] [(reason)]`; in JSON one `probe done` event with `reason` always present
    /// (`none` on success).
    pub fn run_probe_done(&self, n: u64, p: &ProbeRecord) {
        if self.json() {
            tracing::info!(
                target: "prober::console",
                n,
                probe_id = %p.id,
                kind = %p.kind,
                src_node = %p.source.node,
                dst_node = %p.target.node,
                result = p.result.as_str(),
                reason = p.reason.map_or("none", |r| r.as_str()),
                ttfp_seconds = p.ttfp_seconds,
                suspects = p.suspects.len(),
                "probe done"
            );
        } else {
            let line = crate::gate::progress_line(0, 0, p);
            let rest = line.split_once("] ").map_or(line.as_str(), |(_, r)| r);
            eprintln!("#{n} {} {rest}", p.id);
        }
    }

    /// One finished probe: `[done/total] kind src → dst result [ttfp] [(reason)]`
    /// ([`progress_line`]).
    pub fn progress(&self, done: usize, total: usize, p: &ProbeRecord) {
        if self.json() {
            tracing::info!(
                target: "prober::console",
                done,
                total,
                probe_id = %p.id,
                kind = %p.kind,
                src_node = %p.source.node,
                dst_node = %p.target.node,
                result = p.result.as_str(),
                reason = p.reason.map_or("none", |r| r.as_str()),
                ttfp_seconds = p.ttfp_seconds,
                detail = p.detail.as_deref(),
                "probe done"
            );
        } else {
            eprintln!("{}", progress_line(done, total, p));
        }
    }

    /// Leftover probe pods of dead instances were deleted at start-up.
    pub fn swept(&self, pods: usize) {
        if self.json() {
            tracing::info!(target: "prober::console", pods, "swept leftover probe pods");
        } else {
            eprintln!("swept {pods} leftover probe pod(s)");
        }
    }

    /// A dead instance's Lease expired (nobody renewed it for the lease duration): its
    /// probe pods and Services were deleted.
    pub fn reaped(&self, instance: &str) {
        if self.json() {
            tracing::info!(target: "prober::console", %instance, "dead instance's Lease expired; its probe objects were deleted");
        } else {
            eprintln!(
                "instance {instance} is dead (its Lease was not renewed for {}s): deleted its probe pods",
                crate::lease::LEASE_DURATION.as_secs()
            );
        }
    }

    /// Probe pods of another instance were left alone by the start-up sweep (docs/design.md §6:
    /// never another live instance's pods), e.g. those of a gate killed with SIGKILL.
    pub fn kept_other_instance(&self, k: &crate::sweep::KeptInstance, leased: bool) {
        let when = match k.swept_in_seconds {
            _ if leased => format!(
                "its Lease is watched: if nobody renews it for {}s they are deleted then",
                crate::lease::LEASE_DURATION.as_secs()
            ),
            Some(s) => format!(
                "not provably dead yet: a later run sweeps them in {}s (their activeDeadlineSeconds + {}s)",
                s.max(0),
                crate::sweep::SWEEP_GRACE.as_secs()
            ),
            None => "their owner pod is alive".to_owned(),
        };
        if self.json() {
            tracing::info!(
                target: "prober::console",
                instance = %k.instance,
                pods = k.pods,
                swept_in_seconds = k.swept_in_seconds,
                "kept probe pods of another instance"
            );
        } else {
            eprintln!(
                "kept {} probe pod(s) of instance {}: {when}",
                k.pods, k.instance
            );
        }
    }

    /// A setting that is valid but probably not what the user meant (e.g. `--timeout`
    /// shorter than one probe can take).
    pub fn setting_warning(&self, flag: &str, message: &str) {
        if self.json() {
            tracing::warn!(target: "prober::console", flag, message, "questionable setting");
        } else {
            eprintln!("warning: {flag}: {message}");
        }
    }

    /// The gate stops its cross-node pairs early ([`crate::gate::early_stop`]).
    pub fn early_stop(&self, why: &str) {
        if self.json() {
            tracing::warn!(target: "prober::console", why, "stopping cross-node probes early");
        } else {
            eprintln!("stopping cross-node probes early: {why}");
        }
    }

    /// First SIGINT/SIGTERM: the run stops and deletes its pods.
    pub fn signal(&self, name: &str) {
        if self.json() {
            tracing::warn!(target: "prober::console", signal = name,
                "stopping, deleting in-flight probe pods (signal again to exit at once)");
        } else {
            eprintln!(
                "{name}: stopping, deleting in-flight probe pods (signal again to exit at once)"
            );
        }
    }

    /// Second signal: best-effort delete and exit.
    pub fn second_signal(&self) {
        if self.json() {
            tracing::warn!(target: "prober::console",
                "second signal: deleting probe pods (best effort) and exiting");
        } else {
            eprintln!("second signal: deleting probe pods (best effort) and exiting");
        }
    }

    /// A run-level error (`error: …`), with its short static `reason` label when known
    /// ([`crate::Error::reason`]).
    pub fn error(&self, reason: Option<&'static str>, message: &str) {
        if self.json() {
            tracing::error!(target: "prober::console", reason, error = message, "gate error");
        } else {
            eprintln!("error: {message}");
        }
    }

    /// [`Console::api_outage`] as the API-health record's sink.
    pub fn outage_sink(self) -> crate::apihealth::OutageSink {
        crate::apihealth::OutageSink::new(move |o, at_end| self.api_outage(o, at_end))
    }

    /// One line per API outage ([`crate::apihealth`]): when it began, how long the API
    /// server did not answer, the first error, and how many requests went unanswered;
    /// `at_end` when the run ended before the API answered again.
    pub fn api_outage(&self, o: &crate::apihealth::Outage, at_end: bool) {
        let seconds = o.seconds.unwrap_or_default();
        if self.json() {
            tracing::warn!(target: "prober::console", start = %o.start, seconds,
                first_error = %o.first_error, failed_requests = o.failed_requests,
                ongoing = at_end, "API server outage");
        } else if at_end {
            eprintln!(
                "API server not answering since {} ({seconds:.1}s, still at the end; first error: {}; {} request(s) unanswered)",
                o.start, o.first_error, o.failed_requests
            );
        } else {
            eprintln!(
                "API server did not answer for {seconds:.1}s from {} (first error: {}; {} request(s) unanswered); it answers again",
                o.start, o.first_error, o.failed_requests
            );
        }
    }

    /// The JSON report was written to `path`.
    pub fn report_written(&self, path: &std::path::Path) {
        // `--report -` printed it to stdout between markers.
        let to = if path.as_os_str() == STDOUT_PATH {
            "stdout".to_string()
        } else {
            path.display().to_string()
        };
        if self.json() {
            tracing::info!(target: "prober::console", path = %to, "report written");
        } else {
            eprintln!("report written to {to}");
        }
    }

    /// A file other than the report was written (`what`: `JUnit XML`, `baseline`).
    pub fn file_written(&self, what: &str, path: &std::path::Path) {
        if self.json() {
            tracing::info!(target: "prober::console", path = %path.display(), what, "file written");
        } else {
            eprintln!("{what} written to {}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstpacket_report::{PodRef, ProbeResult, Reason};
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn record() -> ProbeRecord {
        ProbeRecord {
            id: "abcdefgh-3".into(),
            kind: "cross_node".into(),
            source: PodRef {
                node: "node-1".into(),
                pod: "fp-abcdefgh-3-s".into(),
                ..Default::default()
            },
            target: PodRef {
                node: "node-2".into(),
                pod: "fp-abcdefgh-3-t".into(),
                ..Default::default()
            },
            result: ProbeResult::Slow,
            reason: Some(Reason::TtfpOverThreshold),
            detail: None,
            ttfp_seconds: Some(7.25),
            raw_ttfp_seconds: Some(7.25),
            target_ready_to_source_ready_seconds: None,
            attempts: Default::default(),
            hold: Default::default(),
            timeline: Default::default(),
            suspects: vec![],
            source_report: None,
            first_attempt_failures: 0,
            pre_ready_attempt_failures: 0,
            programming: None,
            api_writes: 4,
            recreate: None,
            burst: None,
            service: None,
            policy: None,
            paths: Vec::new(),
            drift: None,
        }
    }

    /// Runs `f` under the JSON subscriber `init_tracing` installs, returning the lines.
    fn json_lines(f: impl FnOnce()) -> Vec<serde_json::Value> {
        let buf = Buf::default();
        let writer = buf.clone();
        let sub = tracing_subscriber::fmt()
            .json()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::with_default(sub, f);
        let bytes = buf.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8(bytes)
            .expect("utf-8")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    #[test]
    fn json_console_emits_one_structured_event_per_notice() {
        let c = Console::new(LogFormat::Json);
        let lines = json_lines(|| {
            c.seed("gate-abcdefgh", 42);
            c.progress(3, 12, &record());
            c.early_stop("2 cross-node pairs failed");
            c.swept(2);
            c.error(Some("api_unreachable"), "cannot reach the Kubernetes API");
            c.report_written(std::path::Path::new("/tmp/r.json"));
        });
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert_eq!(lines[0]["fields"]["seed"], 42);
        let p = &lines[1]["fields"];
        assert_eq!(p["probe_id"], "abcdefgh-3");
        assert_eq!(p["kind"], "cross_node");
        assert_eq!(p["src_node"], "node-1");
        assert_eq!(p["dst_node"], "node-2");
        assert_eq!(p["result"], "slow");
        assert_eq!(p["reason"], "ttfp_over_threshold");
        assert_eq!(p["ttfp_seconds"], 7.25);
        assert_eq!(
            (p["done"].clone(), p["total"].clone()),
            (3.into(), 12.into())
        );
        assert_eq!(lines[2]["level"], "WARN");
        assert_eq!(lines[4]["level"], "ERROR");
        assert_eq!(lines[4]["fields"]["reason"], "api_unreachable");
        assert!(lines.iter().all(|l| l["target"] == "prober::console"));
    }

    #[test]
    fn plain_console_emits_no_tracing_events() {
        // Plain notices are eprintln! lines, as before; nothing reaches the subscriber.
        let c = Console::new(LogFormat::Plain);
        let lines = json_lines(|| {
            c.seed("gate-abcdefgh", 42);
            c.progress(1, 2, &record());
        });
        assert!(lines.is_empty(), "{lines:#?}");
    }
}
