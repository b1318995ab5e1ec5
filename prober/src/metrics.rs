//! Prometheus metrics of `prober run` (docs/design.md §4 "Prometheus"): `firstpacket_` prefix,
//! base units (seconds), `_total` only on counters, no pod names/UIDs and no
//! per-(source, target) series (N² at 1 000 nodes; the pair matrix is on the status
//! page). Known label sets are pre-initialised ([`Metrics::new`] for kinds × results ×
//! reasons, [`Metrics::node_added`] per node), so series exist before the first event.
//! Per-node series are removed when their node leaves ([`Metrics::node_removed`]).
//! The process's own `process_*` metrics (CPU seconds, resident memory, open file
//! descriptors, start time; the `prometheus` crate's process collector, read from
//! `/proc/self`) are on the same page, on a standby too.
//!
//! Whether the prober can measure at all (issue 31, "the monitor monitored"):
//! `firstpacket_probes_total{result="inconclusive", reason}` (a bounded `reason`: the
//! closed set [`Reason::ALL`]), `firstpacket_engine_faults_total{fault}` (probe objects
//! refused by RBAC or admission), `firstpacket_agent_scrapes_total{profile, result}`
//! and `firstpacket_last_conclusive_probe_timestamp_seconds` (the last probe that said
//! something about the network: `firstpacket_last_probe_timestamp_seconds` is refreshed
//! by inconclusive probes too). The alerts reading them are in
//! `alerts/firstpacket.rules.yaml`.
//!
//! Paths (issue 33): when a run measures several paths per probe (`--protocols`,
//! `--payload`, `--ip-families`), `firstpacket_path_probes_total{kind, protocol,
//! family, payload, result, reason}` and `firstpacket_path_ttfp_seconds{kind,
//! protocol, family, payload}` count each path; every label is a closed set (2 × 2 × 2
//! paths per kind), so the series stay bounded. A run that asks for more than the main
//! path exports its paths' success and failure series at 0 from the start
//! ([`Metrics::initialise_paths`]); one that does not has none.
//!
//! [`Metrics::observe`] turns one finished probe record into every metric at once; the
//! continuous mode calls it under the same lock that appends the record to the recent
//! records, so `/metrics` and `/api/v1/probes` agree (a scrape sees
//! `firstpacket_ttfp_seconds_count{kind}` = the records of that kind with a non-null
//! `ttfp_seconds`, up to the `total` read with them).

use crate::kind::ProbeKind;
use crate::sync::lock;
use firstpacket_report::{ProbeRecord, ProbeResult, Reason, Signal};
use prometheus::{
    Counter, Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::collections::BTreeMap;

/// Buckets of `firstpacket_ttfp_seconds`, seconds: 50 ms steps below 0.5 s, 100–250 ms
/// steps up to 2 s, then coarser up to 120 s (the longest give-up worth measuring).
pub const TTFP_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25,
    1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
];

/// Buckets of `firstpacket_pod_startup_seconds`, seconds.
pub const STARTUP_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0,
];

/// The `reason` label of a record: its reason, or `none` (success).
pub fn reason_label(r: Option<Reason>) -> &'static str {
    r.map_or("none", |r| r.as_str())
}

/// The metrics of one prober instance and their registry.
pub struct Metrics {
    registry: Registry,
    ttfp: HistogramVec,
    probes: IntCounterVec,
    /// Issue 33: per path, when the run measures more than the main one.
    path_probes: IntCounterVec,
    path_ttfp: HistogramVec,
    pod_startup: HistogramVec,
    hold_failures: IntCounterVec,
    first_attempt_failures: IntCounterVec,
    node_last_ttfp: GaugeVec,
    node_probes: IntCounterVec,
    programming_wait: HistogramVec,
    node_programming_slow: IntCounterVec,
    node_last_programming_wait: GaugeVec,
    suspects: IntCounterVec,
    agent_scrapes: IntCounterVec,
    /// Agent scrape counts already added (the watcher keeps absolute counts).
    agent_seen: std::sync::Mutex<BTreeMap<(String, String), u64>>,
    /// `firstpacket_probes_in_flight`.
    pub in_flight: IntGauge,
    last_probe: Gauge,
    /// `firstpacket_last_conclusive_probe_timestamp_seconds`: Unix time the last
    /// conclusive probe (success, slow, failed) finished; 0 until the first.
    last_conclusive_probe: Gauge,
    /// `firstpacket_lap_seconds`: how long the last complete lap took.
    pub lap_seconds: Gauge,
    /// `firstpacket_lap_expected_seconds`: eligible nodes × --probe-interval (the lap
    /// time the settings give when probes are not held back by --concurrency).
    pub lap_expected_seconds: Gauge,
    /// `firstpacket_eligible_nodes`.
    pub eligible_nodes: IntGauge,
    /// `firstpacket_state_entries{structure}`: sizes of the prober's bounded structures.
    pub state_entries: IntGaugeVec,
    /// `firstpacket_state_bound{structure}`: the stated bound of each structure
    /// ([`crate::bounds`]); entries above it are a leak.
    pub state_bound: IntGaugeVec,
    /// `firstpacket_api_outages_total`: API outages lived through ([`crate::apihealth`]).
    pub api_outages: IntCounter,
    /// `firstpacket_api_outage_seconds_total`: their summed length, seconds.
    pub api_outage_seconds: Counter,
    /// `firstpacket_node_events_total{reason}`: Node Events written.
    pub node_events: IntCounterVec,
    /// `firstpacket_leader`: 1 on the replica that probes (the leader under
    /// `--leader-elect`, always without it), 0 on a standby.
    pub leader: IntGauge,
    /// `firstpacket_engine_faults_total{fault}`: forbidden creates/deletes
    /// (`create_forbidden`, `delete_forbidden`) and admission rejections
    /// (`admission_rejected`).
    pub engine_faults: IntCounterVec,
    baseline_seconds: GaugeVec,
    baseline_samples: GaugeVec,
    recent_median: GaugeVec,
    drift_ratio: GaugeVec,
    drift_active: GaugeVec,
    node_drift_ratio: GaugeVec,
    node_drift_active: GaugeVec,
    /// `firstpacket_drift_threshold_ratio`: `--drift-ratio`.
    pub drift_threshold_ratio: Gauge,
    /// `firstpacket_drift_floor_seconds`: `--drift-floor`.
    pub drift_floor_seconds: Gauge,
    /// `firstpacket_baseline_writes_total{result}`: baseline ConfigMap writes (`ok`,
    /// `error`), counted apart from the probes' API writes.
    pub baseline_writes: IntCounterVec,
    /// Nodes with per-node drift series (added by [`Metrics::node_added`]).
    drift_nodes: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    // Names are static and distinct: registering cannot fail but for a programming error.
    if let Err(e) = r.register(Box::new(c.clone())) {
        tracing::error!(error = %e, "metric registration failed");
    }
    c
}

impl Metrics {
    /// All metrics, registered, with the label sets of `kinds` pre-initialised:
    /// `firstpacket_probes_total{kind, result, reason}` for every reason of each result
    /// (`none` for success), ttfp/hold/first-attempt series per kind, startup phases per
    /// role, `firstpacket_build_info{version}` = 1, `firstpacket_leader` = 1.
    // A table of data: one entry per metric (name, help, labels), read as a list.
    #[allow(clippy::too_many_lines)]
    pub fn new(kinds: &[ProbeKind]) -> Metrics {
        let r = Registry::new();
        let hist = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid histogram")
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter")
        };
        let m = Metrics {
            ttfp: reg(&r, hist(
                "firstpacket_ttfp_seconds",
                "Time to first packet of probes that saw a success (seconds; source-node monotonic clock).",
                TTFP_BUCKETS,
                &["kind"],
            )),
            probes: reg(&r, counter(
                "firstpacket_probes_total",
                "Finished probes by kind, result and reason (reason none for success).",
                &["kind", "result", "reason"],
            )),
            path_probes: reg(&r, counter(
                "firstpacket_path_probes_total",
                "Finished paths of probes that measure several (--protocols, --payload, --ip-families) by kind, protocol (tcp, udp), family (ipv4, ipv6), payload (small, mtu), result and reason (reason none for success).",
                &["kind", "protocol", "family", "payload", "result", "reason"],
            )),
            path_ttfp: reg(&r, hist(
                "firstpacket_path_ttfp_seconds",
                "Time to first packet per path of probes that measure several and saw a success on it (seconds; source-node monotonic clock).",
                TTFP_BUCKETS,
                &["kind", "protocol", "family", "payload"],
            )),
            pod_startup: reg(&r, hist(
                "firstpacket_pod_startup_seconds",
                "Probe pod start-up: create to scheduled / ip_assigned / ready (seconds).",
                STARTUP_BUCKETS,
                &["role", "phase"],
            )),
            hold_failures: reg(&r, counter(
                "firstpacket_hold_failures_total",
                "Failed attempts after the first success, during --hold.",
                &["kind"],
            )),
            first_attempt_failures: reg(&r, counter(
                "firstpacket_first_attempt_failures_total",
                "Attempts sent after the source was Ready that failed before the first success.",
                &["kind"],
            )),
            node_last_ttfp: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_node_last_ttfp_seconds", "TTFP of the last probe with a TTFP that had the node in this role (seconds)."),
                &["node", "role"],
            ).expect("valid gauge")),
            node_probes: reg(&r, counter(
                "firstpacket_node_probes_total",
                "Finished probes by node, role and result.",
                &["node", "role", "result"],
            )),
            programming_wait: reg(&r, hist(
                "firstpacket_programming_wait_seconds",
                "Probe pods' own programming wait: container start to the first moment the pod's own path to its node worked (seconds; the pod's clock), by kind and role.",
                TTFP_BUCKETS,
                &["kind", "role"],
            )),
            node_programming_slow: reg(&r, counter(
                "firstpacket_node_programming_slow_total",
                "Probe pods on the node whose programming wait was over --slow-threshold.",
                &["node"],
            )),
            node_last_programming_wait: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_node_last_programming_wait_seconds", "Programming wait of the last probe pod measured on the node (either role), seconds."),
                &["node"],
            ).expect("valid gauge")),
            suspects: reg(&r, counter(
                "firstpacket_suspects_total",
                "Node-agent suspects named on slow/failed probes, by node and signal.",
                &["node", "signal"],
            )),
            agent_scrapes: reg(&r, counter(
                "firstpacket_agent_scrapes_total",
                "Node-agent metric scrapes by profile and result (ok or the failure reason).",
                &["profile", "result"],
            )),
            agent_seen: Default::default(),
            in_flight: reg(&r, IntGauge::new("firstpacket_probes_in_flight", "Probes running now.").expect("gauge")),
            last_probe: reg(&r, Gauge::new("firstpacket_last_probe_timestamp_seconds", "Unix time the last probe finished (any result, inconclusive included).").expect("gauge")),
            last_conclusive_probe: reg(&r, Gauge::new("firstpacket_last_conclusive_probe_timestamp_seconds", "Unix time the last conclusive probe (success, slow or failed) finished; 0 until the first.").expect("gauge")),
            lap_seconds: reg(&r, Gauge::new("firstpacket_lap_seconds", "Duration of the last complete lap (every eligible node source and target once), seconds.").expect("gauge")),
            lap_expected_seconds: reg(&r, Gauge::new("firstpacket_lap_expected_seconds", "Eligible nodes x --probe-interval: the lap time of the settings, seconds.").expect("gauge")),
            eligible_nodes: reg(&r, IntGauge::new("firstpacket_eligible_nodes", "Nodes probes can go to now (Ready, not cordoned, matching, tolerated).").expect("gauge")),
            state_entries: reg(&r, IntGaugeVec::new(
                Opts::new("firstpacket_state_entries", "Entries in the prober's bounded in-memory structures."),
                &["structure"],
            ).expect("gauge")),
            state_bound: reg(&r, IntGaugeVec::new(
                Opts::new("firstpacket_state_bound", "Stated bound of each bounded in-memory structure (a function of nodes, --concurrency, --burst-size and agent profiles); entries above it are a leak."),
                &["structure"],
            ).expect("gauge")),
            api_outages: reg(&r, IntCounter::new("firstpacket_api_outages_total", "API server outages the prober lived through (transport errors or HTTP 502/503/504 until the next answer).").expect("counter")),
            api_outage_seconds: reg(&r, Counter::new("firstpacket_api_outage_seconds_total", "Summed length of the API server outages, seconds.").expect("counter")),
            node_events: reg(&r, counter(
                "firstpacket_node_events_total",
                "Kubernetes Events written on Nodes, by reason.",
                &["reason"],
            )),
            leader: reg(&r, IntGauge::new("firstpacket_leader", "1 on the replica that probes (the leader with --leader-elect), 0 on a standby.").expect("gauge")),
            engine_faults: reg(&r, counter(
                "firstpacket_engine_faults_total",
                "Forbidden probe-object creates/deletes (RBAC) and admission rejections, by fault.",
                &["fault"],
            )),
            baseline_seconds: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_baseline_seconds", "Baseline TTFP (learned, or --baseline-ttfp) by kind and quantile, seconds; NaN until the baseline has --baseline-min-samples."),
                &["kind", "quantile"],
            ).expect("gauge")),
            baseline_samples: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_baseline_samples", "Successful probes in the baseline window (excluding the recent window and drifting probes), by kind."),
                &["kind"],
            ).expect("gauge")),
            recent_median: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_recent_median_seconds", "Median TTFP in the recent window by kind, seconds; NaN when empty."),
                &["kind"],
            ).expect("gauge")),
            drift_ratio: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_drift_ratio", "Recent median / max(baseline median, dial interval) by kind; NaN until computable."),
                &["kind"],
            ).expect("gauge")),
            drift_active: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_drift_active", "1 when the kind drifts: ratio >= --drift-ratio and recent - baseline > --drift-floor with enough samples."),
                &["kind"],
            ).expect("gauge")),
            node_drift_ratio: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_node_drift_ratio", "A node's drift ratio (its probes in either role, its best peer's recent median) / max(its baseline median, dial interval); NaN until computable."),
                &["node"],
            ).expect("gauge")),
            node_drift_active: reg(&r, GaugeVec::new(
                Opts::new("firstpacket_node_drift_active", "1 when the node drifts (ratio and floor, above its baseline p90, enough samples)."),
                &["node"],
            ).expect("gauge")),
            drift_threshold_ratio: reg(&r, Gauge::new("firstpacket_drift_threshold_ratio", "--drift-ratio: the ratio drift needs.").expect("gauge")),
            drift_floor_seconds: reg(&r, Gauge::new("firstpacket_drift_floor_seconds", "--drift-floor: the absolute rise drift needs, seconds.").expect("gauge")),
            baseline_writes: reg(&r, counter(
                "firstpacket_baseline_writes_total",
                "Writes of the baseline ConfigMap, by result (ok, error); apart from the probes' API writes.",
                &["result"],
            )),
            drift_nodes: Default::default(),
            registry: r,
        };
        let build = reg(
            &m.registry,
            IntGaugeVec::new(
                Opts::new("firstpacket_build_info", "Build of the prober (always 1)."),
                &["version"],
            )
            .expect("gauge"),
        );
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
        // process_max_fds, process_virtual_memory_bytes, process_start_time_seconds,
        // process_threads (read from /proc/self at each scrape).
        #[cfg(target_os = "linux")]
        if let Err(e) = m.registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        )) {
            tracing::error!(error = %e, "process metrics registration failed");
        }
        m.initialise_series(kinds);
        m
    }

    /// The series that must exist before their first change (a dashboard or an alert
    /// sees 0 / NaN, not nothing): per kind, the baseline and drift gauges, the probe
    /// counters of every result and reason; the start-up phases, Event reasons and
    /// engine faults; the leader gauge at 1 (`--leader-elect` sets 0 until a term).
    fn initialise_series(&self, kinds: &[ProbeKind]) {
        // A replica without leader election probes; `--leader-elect` sets 0 until its
        // first term.
        self.leader.set(1);
        self.drift_threshold_ratio.set(f64::NAN);
        self.drift_floor_seconds.set(f64::NAN);
        for r in ["ok", "error"] {
            self.baseline_writes.with_label_values(&[r]);
        }
        for k in kinds {
            let k = k.as_str();
            for (q, _) in crate::baseline::QUANTILES {
                self.baseline_seconds
                    .with_label_values(&[k, q])
                    .set(f64::NAN);
            }
            self.baseline_samples.with_label_values(&[k]).set(0.0);
            self.recent_median.with_label_values(&[k]).set(f64::NAN);
            self.drift_ratio.with_label_values(&[k]).set(f64::NAN);
            self.drift_active.with_label_values(&[k]).set(0.0);
            self.ttfp.with_label_values(&[k]);
            self.hold_failures.with_label_values(&[k]);
            self.first_attempt_failures.with_label_values(&[k]);
            for role in ["source", "target"] {
                self.programming_wait.with_label_values(&[k, role]);
            }
            self.probes.with_label_values(&[k, "success", "none"]);
            for reason in Reason::ALL {
                self.probes
                    .with_label_values(&[k, reason.result().as_str(), reason.as_str()]);
            }
        }
        for role in ["source", "target"] {
            for phase in ["scheduled", "ip_assigned", "ready"] {
                self.pod_startup.with_label_values(&[role, phase]);
            }
        }
        for reason in ["FirstPacketFailed", "FirstPacketSlow"] {
            self.node_events.with_label_values(&[reason]);
        }
        for f in ["create_forbidden", "delete_forbidden", "admission_rejected"] {
            self.engine_faults.with_label_values(&[f]);
        }
    }

    /// Sets the baseline and drift gauges from `kinds` (per kind in `--kinds`) and
    /// `nodes` (per node that has a series: others keep NaN / 0). Pure data in:
    /// [`crate::baseline::Baselines::kinds`] / `nodes`.
    pub fn set_drift(
        &self,
        kinds: &BTreeMap<String, crate::baseline::DriftStatus>,
        nodes: &BTreeMap<String, crate::baseline::DriftStatus>,
    ) {
        let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
        for (k, st) in kinds {
            for (q, _) in crate::baseline::QUANTILES {
                self.baseline_seconds
                    .with_label_values(&[k, q])
                    .set(nan(st.baseline.and_then(|b| b.get(q))));
            }
            self.baseline_samples
                .with_label_values(&[k])
                .set(st.baseline_samples as f64);
            self.recent_median
                .with_label_values(&[k])
                .set(nan(st.recent_median));
            self.drift_ratio.with_label_values(&[k]).set(nan(st.ratio));
            self.drift_active
                .with_label_values(&[k])
                .set(f64::from(u8::from(st.active)));
        }
        for (n, st) in nodes {
            // Only nodes the prober knows (node_added): a probe of a node that just
            // left must not bring its series back.
            if !lock(&self.drift_nodes).contains(n) {
                continue;
            }
            self.node_drift_ratio
                .with_label_values(&[n])
                .set(nan(st.ratio));
            self.node_drift_active
                .with_label_values(&[n])
                .set(f64::from(u8::from(st.active)));
        }
    }

    /// Pre-initialises the per-node series of `node`: probes by role × result, the
    /// programming and drift series, and `firstpacket_suspects_total` for every agent
    /// signal ([`Signal::ALL`], 8), so a dashboard or alert sees 0 before the first
    /// suspect (2 × 4 + 8 + 3 = 19 series a node).
    pub fn node_added(&self, node: &str) {
        self.node_drift_ratio
            .with_label_values(&[node])
            .set(f64::NAN);
        self.node_drift_active.with_label_values(&[node]).set(0.0);
        lock(&self.drift_nodes).insert(node.to_string());
        self.node_programming_slow.with_label_values(&[node]);
        for role in ["source", "target"] {
            for result in ProbeResult::ALL {
                self.node_probes
                    .with_label_values(&[node, role, result.as_str()]);
            }
        }
        for signal in Signal::ALL {
            self.suspects.with_label_values(&[node, signal.as_str()]);
        }
    }

    /// Removes every per-node series of `node` (it left the cluster or the selector).
    pub fn node_removed(&self, node: &str) {
        let _ = self.node_drift_ratio.remove_label_values(&[node]);
        let _ = self.node_drift_active.remove_label_values(&[node]);
        lock(&self.drift_nodes).remove(node);
        let _ = self.node_programming_slow.remove_label_values(&[node]);
        let _ = self.node_last_programming_wait.remove_label_values(&[node]);
        for role in ["source", "target"] {
            let _ = self.node_last_ttfp.remove_label_values(&[node, role]);
            for result in ProbeResult::ALL {
                let _ = self
                    .node_probes
                    .remove_label_values(&[node, role, result.as_str()]);
            }
        }
        for signal in Signal::ALL {
            let _ = self.suspects.remove_label_values(&[node, signal.as_str()]);
        }
    }

    /// Issue 33: `firstpacket_path_probes_total` at 0 for each of `kinds` that measures
    /// paths (the pod-to-pod ones) and each path of `ids`
    /// ([`crate::paths::PathsConfig::metric_ids`]), results `success` and `failed` with
    /// the reasons a path fails with, so an alert's `increase()` counts a path's first
    /// failure. Nothing for an empty `ids` (a run that measures the main path only).
    pub fn initialise_paths(&self, kinds: &[ProbeKind], ids: &[firstpacket_report::PathId]) {
        for kind in kinds.iter().filter(|k| k.pod_to_pod()) {
            for id in ids {
                let mut reasons = vec![
                    ("success", "none"),
                    ("failed", Reason::NoSuccessBeforeGiveUp.as_str()),
                    ("failed", Reason::LostAfterSuccess.as_str()),
                ];
                if id.payload == firstpacket_report::Payload::Mtu {
                    reasons.push(("failed", Reason::MtuBlackHole.as_str()));
                }
                for (result, reason) in reasons {
                    let _ = self.path_probe_counter(kind.as_str(), id, result, reason);
                }
            }
        }
    }

    /// The `firstpacket_path_probes_total` series of one kind, path, result and reason.
    fn path_probe_counter(
        &self,
        kind: &str,
        id: &firstpacket_report::PathId,
        result: &str,
        reason: &str,
    ) -> prometheus::IntCounter {
        self.path_probes.with_label_values(&[
            kind,
            id.protocol.as_str(),
            id.family.as_str(),
            id.payload.as_str(),
            result,
            reason,
        ])
    }

    /// Counts one finished probe everywhere (module docs), `now_unix` = wall time.
    pub fn observe(&self, rec: &ProbeRecord, now_unix: f64) {
        let kind = rec.kind.as_str();
        let result = rec.result.as_str();
        self.probes
            .with_label_values(&[kind, result, reason_label(rec.reason)])
            .inc();
        if let Some(t) = rec.ttfp_seconds {
            self.ttfp.with_label_values(&[kind]).observe(t);
        }
        for p in &rec.paths {
            let id = p.id();
            self.path_probe_counter(kind, &id, p.result.as_str(), reason_label(p.reason))
                .inc();
            if let Some(t) = p.ttfp_seconds {
                self.path_ttfp
                    .with_label_values(&[
                        kind,
                        id.protocol.as_str(),
                        id.family.as_str(),
                        id.payload.as_str(),
                    ])
                    .observe(t);
            }
        }
        self.hold_failures
            .with_label_values(&[kind])
            .inc_by(rec.hold.failures);
        self.first_attempt_failures
            .with_label_values(&[kind])
            .inc_by(rec.first_attempt_failures);
        for (role, tl) in [
            ("source", &rec.timeline.source),
            ("target", &rec.timeline.target),
        ] {
            let Some(created) = tl.created else { continue };
            for (phase, at) in [
                ("scheduled", tl.scheduled),
                ("ip_assigned", tl.ip_assigned),
                ("ready", tl.ready),
            ] {
                if let Some(at) = at {
                    self.pod_startup
                        .with_label_values(&[role, phase])
                        .observe((at - created).max(0.0));
                }
            }
        }
        for (role, node) in [("source", &rec.source.node), ("target", &rec.target.node)] {
            self.node_probes
                .with_label_values(&[node, role, result])
                .inc();
            if let Some(t) = rec.ttfp_seconds {
                self.node_last_ttfp.with_label_values(&[node, role]).set(t);
            }
        }
        if let Some(g) = &rec.programming {
            for (role, node, w) in [
                ("source", &rec.source.node, &g.source),
                ("target", &rec.target.node, &g.target),
            ] {
                let Some(w) = w else { continue };
                self.programming_wait
                    .with_label_values(&[kind, role])
                    .observe(w.wait_seconds);
                self.node_last_programming_wait
                    .with_label_values(&[node])
                    .set(w.wait_seconds);
                if w.over_threshold {
                    self.node_programming_slow.with_label_values(&[node]).inc();
                }
            }
        }
        for s in &rec.suspects {
            self.suspects
                .with_label_values(&[&s.node, s.signal.as_str()])
                .inc();
        }
        self.last_probe.set(now_unix);
        if rec.result.is_conclusive() {
            self.last_conclusive_probe.set(now_unix);
        }
    }

    /// Brings `firstpacket_agent_scrapes_total` up to the watcher's absolute counts.
    pub fn sync_agent_scrapes(&self, counts: &BTreeMap<(String, String), u64>) {
        let mut seen = self.agent_seen.lock().unwrap_or_else(|p| p.into_inner());
        for ((profile, result), n) in counts {
            let before = seen.entry((profile.clone(), result.clone())).or_insert(0);
            if *n > *before {
                self.agent_scrapes
                    .with_label_values(&[profile, result])
                    .inc_by(*n - *before);
                *before = *n;
            }
        }
    }

    /// The text exposition (`text/plain; version=0.0.4`): every family on the replica
    /// that probes; on a standby (`firstpacket_leader` 0) only [`STANDBY_FAMILIES`], so
    /// a standby's page carries no probe series (a former leader's stale counts stay
    /// hidden until it leads again).
    pub fn render(&self) -> String {
        let mut families = self.registry.gather();
        if self.leader.get() == 0 {
            families.retain(|f| STANDBY_FAMILIES.contains(&f.name()));
        }
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// The metric families a standby serves (allow-list): what describes the process, not
/// the probes (the process collector's families included).
pub const STANDBY_FAMILIES: &[&str] = &[
    "firstpacket_build_info",
    "firstpacket_leader",
    "firstpacket_state_entries",
    "firstpacket_state_bound",
    "firstpacket_api_outages_total",
    "firstpacket_api_outage_seconds_total",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_threads",
];

#[cfg(test)]
mod tests {
    use super::*;
    use firstpacket_report::{ProbeProgramming, ProgrammingMethod, ProgrammingWait};

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn programming_waits_feed_the_histogram_and_name_the_waiting_node_only() {
        let m = Metrics::new(&[ProbeKind::CrossNode]);
        m.node_added("node-1");
        m.node_added("node-2");
        let text = m.render();
        // Pre-initialised: the series exist before the first probe.
        assert_eq!(
            value(
                &text,
                r#"firstpacket_programming_wait_seconds_count{kind="cross_node",role="target"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                r#"firstpacket_node_programming_slow_total{node="node-2"}"#
            ),
            Some(0.0)
        );
        let w = |wait: f64| {
            Some(ProgrammingWait {
                method: ProgrammingMethod::NodeDial,
                wait_seconds: wait,
                resolution_seconds: 0.1,
                over_threshold: wait > 5.0,
            })
        };
        let mut rec = crate::record::test_record("p", "node-1", "node-2", ProbeResult::Slow);
        rec.programming = Some(ProbeProgramming {
            source: w(0.05),
            target: w(7.2),
            readiness_gated: Some(true),
        });
        m.observe(&rec, 1.0);
        let text = m.render();
        assert_eq!(
            value(
                &text,
                r#"firstpacket_programming_wait_seconds_sum{kind="cross_node",role="target"}"#
            ),
            Some(7.2)
        );
        assert_eq!(
            value(
                &text,
                r#"firstpacket_node_programming_slow_total{node="node-2"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                r#"firstpacket_node_programming_slow_total{node="node-1"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                r#"firstpacket_node_last_programming_wait_seconds{node="node-1"}"#
            ),
            Some(0.05)
        );
        m.node_removed("node-2");
        let text = m.render();
        assert!(!text.contains(r#"node="node-2""#), "{text}");
    }

    #[test]
    fn a_multi_path_run_exports_its_paths_series_at_zero_and_a_main_only_run_none() {
        let main_only = crate::paths::PathsConfig::default();
        assert!(main_only.metric_ids().is_empty());
        let m = Metrics::new(&[ProbeKind::CrossNode, ProbeKind::Service]);
        let cfg = crate::paths::PathsConfig::new(
            &[firstpacket_report::PathProtocol::Udp],
            firstpacket_report::Payload::Mtu,
            &[firstpacket_report::IpFamily::Ipv4],
        );
        // tcp (the main path's protocol) and udp, small and mtu, on IPv4.
        assert_eq!(cfg.metric_ids().len(), 4);
        m.initialise_paths(
            &[ProbeKind::CrossNode, ProbeKind::Service],
            &cfg.metric_ids(),
        );
        let text = m.render();
        assert_eq!(
            value(
                &text,
                r#"firstpacket_path_probes_total{family="ipv4",kind="cross_node",payload="mtu",protocol="udp",reason="mtu_black_hole",result="failed"}"#
            ),
            Some(0.0),
            "{text}"
        );
        assert!(
            !text.contains(r#"kind="service",payload"#),
            "service measures no paths: {text}"
        );
    }

    #[test]
    fn each_path_is_counted_by_its_bounded_labels_and_its_ttfp_observed() {
        use firstpacket_report::{IpFamily, PathProtocol, PathResult, Payload};
        let m = Metrics::new(&[ProbeKind::CrossNode]);
        assert!(!m.render().contains("firstpacket_path_probes_total{"));
        let mut rec = crate::record::test_record("a", "node-1", "node-2", ProbeResult::Failed);
        rec.reason = Some(Reason::MtuBlackHole);
        let path = |protocol, payload, result, reason, ttfp| {
            let id = firstpacket_report::PathId {
                protocol,
                family: IpFamily::Ipv4,
                payload,
            };
            PathResult::new(id, result, reason, ttfp)
        };
        rec.paths = vec![
            path(
                PathProtocol::Tcp,
                Payload::Small,
                ProbeResult::Success,
                None,
                Some(0.3),
            ),
            path(
                PathProtocol::Udp,
                Payload::Mtu,
                ProbeResult::Failed,
                Some(Reason::MtuBlackHole),
                None,
            ),
        ];
        m.observe(&rec, 1.0);
        let text = m.render();
        assert_eq!(
            value(
                &text,
                r#"firstpacket_path_probes_total{family="ipv4",kind="cross_node",payload="mtu",protocol="udp",reason="mtu_black_hole",result="failed"}"#
            ),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            value(
                &text,
                r#"firstpacket_path_ttfp_seconds_count{family="ipv4",kind="cross_node",payload="small",protocol="tcp"}"#
            ),
            Some(1.0)
        );
        assert!(!text.contains(
            r#"firstpacket_path_ttfp_seconds_count{family="ipv4",kind="cross_node",payload="mtu""#
        ));
    }

    #[test]
    fn inconclusive_probes_leave_the_last_conclusive_timestamp_alone() {
        let m = Metrics::new(&[ProbeKind::CrossNode]);
        let conclusive = "firstpacket_last_conclusive_probe_timestamp_seconds ";
        let any = "firstpacket_last_probe_timestamp_seconds ";
        assert_eq!(value(&m.render(), conclusive), Some(0.0));
        let ok = crate::record::test_record("a", "node-1", "node-2", ProbeResult::Success);
        m.observe(&ok, 100.0);
        let mut blind =
            crate::record::test_record("b", "node-1", "node-2", ProbeResult::Inconclusive);
        blind.reason = Some(Reason::ApiError);
        m.observe(&blind, 160.0);
        let text = m.render();
        assert_eq!(value(&text, conclusive), Some(100.0));
        assert_eq!(value(&text, any), Some(160.0));
        assert_eq!(
            value(
                &text,
                r#"firstpacket_probes_total{kind="cross_node",reason="api_error",result="inconclusive"}"#
            ),
            Some(1.0)
        );
        let failed = crate::record::test_record("c", "node-1", "node-2", ProbeResult::Failed);
        m.observe(&failed, 170.0);
        assert_eq!(value(&m.render(), conclusive), Some(170.0));
    }

    #[test]
    fn suspects_and_engine_faults_exist_at_zero_and_process_metrics_are_served_on_a_standby() {
        let m = Metrics::new(&[ProbeKind::CrossNode]);
        m.node_added("node-1");
        let text = m.render();
        for s in Signal::ALL {
            let series = format!(
                r#"firstpacket_suspects_total{{node="node-1",signal="{}"}}"#,
                s.as_str()
            );
            assert_eq!(value(&text, &series), Some(0.0), "{series}");
        }
        for f in ["create_forbidden", "delete_forbidden", "admission_rejected"] {
            let series = format!(r#"firstpacket_engine_faults_total{{fault="{f}"}}"#);
            assert_eq!(value(&text, &series), Some(0.0), "{series}");
        }
        let started = value(&text, "process_start_time_seconds ").expect("process metrics");
        assert!(started > 1.0e9, "{started}");
        assert!(value(&text, "process_resident_memory_bytes ").is_some_and(|b| b > 0.0));
        m.leader.set(0);
        let standby = m.render();
        assert!(standby.contains("process_cpu_seconds_total "), "{standby}");
        assert!(standby.contains("firstpacket_build_info"), "{standby}");
        assert!(!standby.contains("firstpacket_suspects_total"), "{standby}");
        m.leader.set(1);
        m.node_removed("node-1");
        assert!(!m.render().contains("firstpacket_suspects_total{"));
    }
}
