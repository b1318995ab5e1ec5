//! Middle tier: the learned baseline and drift of `prober run`, and the saved baseline
//! of `prober gate` (`--save-baseline`, `--baseline`), against the in-process cluster of
//! `tests/cluster` (no root, no packets; each test in its own network namespace with
//! only loopback). The script sets each node's TTFP, so what is learned, when drift is
//! declared and what a gate compares are checked against known values (docs/design.md
//! §4 "Baseline & drift"; issue 14).
//!
//! A probe's TTFP is set by the slower of its two nodes ([`by_node`]): each node draws a
//! delay per pod from its range, the source's TTFP is the larger of its node's and its
//! target's node's draw — a slow node is slow with every peer, as a node slow to program
//! its endpoints is.
//!
//! `prober run` runs in-process ([`Run`]): `run_continuous` on a runtime of its own with
//! its `tracing` events captured, its admin server on `127.0.0.1:<fixed port>` (each
//! test has its own network namespace), scraped over plain HTTP/1.0. Stopping one drops
//! its runtime: the process dying, not a SIGTERM (a signal would reach every test's
//! prober in this process), so a standby takes over once the leader Lease expires, and
//! the baseline it restores is the last periodic save (`--baseline-save-interval 1s`),
//! not the one written at shutdown.

use crate::cluster;

use cluster::{run, Act, Cluster, Outcome, PodView, Script};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::api::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Each probe's target node by probe id (the source pod learns its peer's node here:
/// the target is bound and running before the source is created).
type Targets = Arc<Mutex<HashMap<String, String>>>;

/// Healthy TTFP range, ms (the testbed's S1 normal: 200–600 ms).
const NORMAL: (u64, u64) = (200, 600);

/// A slow node's range, ms: every draw is over 0.5 s (`--drift-floor`) above the
/// healthy median and ×2 of it.
const SLOW: (u64, u64) = (1200, 2000);

/// A deterministic draw in `[lo, hi)` ms from a pod name.
fn draw(name: &str, salt: u64, (lo, hi): (u64, u64)) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name, salt).hash(&mut h);
    lo + h.finish() % (hi - lo).max(1)
}

/// Every node draws from `normal`, the nodes in `slow` from `slow_ms`; a probe's TTFP is
/// the larger draw of its source's and its target's node.
fn by_node(targets: &Targets, normal: (u64, u64), slow: &[&str], slow_ms: (u64, u64)) -> Script {
    let targets = targets.clone();
    let slow: Vec<String> = slow.iter().map(|s| s.to_string()).collect();
    Arc::new(move |p: &PodView| {
        let id = p
            .labels
            .get("firstpacket.io/probe-id")
            .cloned()
            .unwrap_or_default();
        if p.role == "target" {
            cluster::lock(&targets).insert(id, p.node.clone());
            return cluster::ok(0);
        }
        let range = |n: &str| {
            if slow.iter().any(|s| s == n) {
                slow_ms
            } else {
                normal
            }
        };
        let peer = cluster::lock(&targets)
            .get(&id)
            .cloned()
            .unwrap_or_else(|| p.node.clone());
        let ms = draw(&p.name, 1, range(&p.node)).max(draw(&p.name, 2, range(&peer)));
        Act::Run {
            ready_after: Duration::from_millis(20),
            ttfp: Some(Duration::from_millis(ms)),
            outcome: Outcome::AsDialed,
        }
    })
}

/// Every source pod draws its TTFP from `ms`, whatever its nodes.
fn uniform(ms: (u64, u64)) -> Script {
    Arc::new(move |p: &PodView| Act::Run {
        ready_after: Duration::from_millis(20),
        ttfp: Some(Duration::from_millis(draw(&p.name, 3, ms))),
        outcome: Outcome::AsDialed,
    })
}

/// `GET path` on `addr` (HTTP/1.0: the body runs to the close): status and body.
async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// Flags of every `prober run` here: a probe every 100 ms, 4 at a time, short hold; a
/// 4 s recent window (~20 probes at this rate, as the defaults have in theirs) and 8
/// baseline samples so learning takes seconds; the baseline saved every second.
const RUN_FLAGS: &[&str] = &[
    "--probe-interval",
    "100ms",
    "--concurrency",
    "4",
    "--hold",
    "100ms",
    "--give-up",
    "10s",
    "--recent-window",
    "4s",
    "--baseline-window",
    "10m",
    "--baseline-min-samples",
    "8",
    "--baseline-save-interval",
    "1s",
];

/// Leader election fast enough for a test: a standby takes over ~2 s after the
/// leader's last renewal.
const LEADER_FLAGS: &[&str] = &[
    "--leader-elect",
    "--leader-elect-lease-duration",
    "2s",
    "--leader-elect-renew-deadline",
    "1s",
    "--leader-elect-retry-period",
    "200ms",
];

/// What one prober logged through `tracing` (INFO and up, plain format).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&cluster::lock(&self.0)).into_owned()
    }
}

struct LogsWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogsWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        cluster::lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = LogsWriter;
    fn make_writer(&'a self) -> LogsWriter {
        LogsWriter(self.0.clone())
    }
}

/// `prober run` in-process, on a runtime of its own (a thread started from the test's
/// runtime, so in the test's network namespace) whose `tracing` events go to [`Logs`].
/// Dropping it drops that runtime: every task of the prober ends at once (its election,
/// admin server, probes), as when its process dies.
struct Run {
    addr: String,
    logs: Logs,
    /// Dropped with the `Run`: the prober's thread then shuts its runtime down.
    _stop: tokio::sync::oneshot::Sender<()>,
    /// How `run_continuous` ended, if it ended by itself.
    ended: Arc<Mutex<Option<String>>>,
}

impl Run {
    /// Starts `prober run` with [`RUN_FLAGS`] (a flag `extra` gives replaces its pair)
    /// and `extra`, its admin server on `127.0.0.1:port`; returns once `/readyz` is 200.
    async fn start(c: &Cluster, port: u16, extra: &[&str]) -> Run {
        use clap::Parser;
        let addr = format!("127.0.0.1:{port}");
        let mut args: Vec<String> = vec![
            "prober".into(),
            "run".into(),
            "--kubeconfig".into(),
            c.kubeconfig.display().to_string(),
            "--admin-addr".into(),
            addr.clone(),
        ];
        for pair in RUN_FLAGS.chunks(2) {
            if !extra.contains(&pair[0]) {
                args.extend(pair.iter().map(|s| s.to_string()));
            }
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let cli = prober::config::Cli::try_parse_from(&args).expect("run args");
        let prober::config::Command::Run(a) = cli.command else {
            unreachable!()
        };
        let logs = Logs::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let ended = Arc::new(Mutex::new(None));
        {
            let (logs, ended) = (logs.clone(), ended.clone());
            std::thread::Builder::new()
                .name(format!("prober-{port}"))
                .spawn(move || {
                    let dispatch = tracing::Dispatch::new(
                        tracing_subscriber::fmt()
                            .with_writer(logs)
                            .with_ansi(false)
                            .with_max_level(tracing::Level::INFO)
                            .finish(),
                    );
                    let _here = tracing::dispatcher::set_default(&dispatch);
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .on_thread_start(move || {
                            std::mem::forget(tracing::dispatcher::set_default(&dispatch))
                        })
                        .build()
                        .expect("prober runtime");
                    let out = rt.block_on(async {
                        tokio::select! {
                            r = prober::run_mode::run_continuous(a) => Some(format!("{r:?}")),
                            _ = stopped => None,
                        }
                    });
                    *cluster::lock(&ended) = out;
                    rt.shutdown_background();
                })
                .expect("prober thread");
        }
        let run = Run {
            addr,
            logs,
            _stop: stop,
            ended,
        };
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(e) = cluster::lock(&run.ended).clone() {
                panic!("prober run ended at start: {e}\n{}", run.logs.text());
            }
            if http_get(&run.addr, "/readyz")
                .await
                .is_some_and(|r| r.0 == 200)
            {
                return run;
            }
            assert!(
                Instant::now() < end,
                "prober run not ready within 10 s\n{}",
                run.logs.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metrics(&self) -> String {
        http_get(&self.addr, "/metrics")
            .await
            .map(|r| r.1)
            .unwrap_or_default()
    }

    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        metric(&self.metrics().await, name, labels)
    }

    /// `/api/v1/probes`.
    async fn page(&self) -> Value {
        http_get(&self.addr, "/api/v1/probes")
            .await
            .and_then(|r| serde_json::from_str::<Value>(&r.1).ok())
            .unwrap_or(Value::Null)
    }

    async fn probes(&self) -> Vec<Value> {
        self.page().await["probes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until the cross_node baseline has its minimum samples; its p50.
    async fn learned_p50(&self, within: Duration) -> f64 {
        self.baseline_of(1, within).await
    }

    /// Waits until the cross_node baseline is learned from at least `n` samples; its
    /// p50. (The first samples to reach the baseline window are the probes that
    /// finished first, the shorter ones: a median of the first 8 is biased low by as
    /// much as the comparisons' tolerance.)
    async fn baseline_of(&self, n: u64, within: Duration) -> f64 {
        let end = Instant::now() + within;
        loop {
            let text = self.metrics().await;
            let p50 = metric(
                &text,
                "firstpacket_baseline_seconds",
                &[("kind", "cross_node"), ("quantile", "0.5")],
            );
            let samples = metric(
                &text,
                "firstpacket_baseline_samples",
                &[("kind", "cross_node")],
            );
            if let Some(v) = p50.filter(|v| !v.is_nan()) {
                if samples.is_some_and(|s| s >= n as f64) {
                    return v;
                }
            }
            assert!(
                Instant::now() < end,
                "no baseline of {n} samples learned within {within:?}\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every node of `nodes` has a learned baseline: its
    /// `firstpacket_node_drift_ratio` is a number (NaN until a role of the node has half
    /// of `--baseline-min-samples` in its baseline and a probe in its recent window).
    async fn nodes_learned(&self, nodes: &[&str], within: Duration) {
        let end = Instant::now() + within;
        loop {
            let text = self.metrics().await;
            let missing: Vec<&&str> = nodes
                .iter()
                .filter(|n| {
                    metric(&text, "firstpacket_node_drift_ratio", &[("node", n)])
                        .is_none_or(f64::is_nan)
                })
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                Instant::now() < end,
                "{missing:?}: no baseline learned within {within:?}\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls `/api/v1/probes` until `done` holds (at most `within`); the last probes.
    async fn probes_until(&self, within: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let end = Instant::now() + within;
        loop {
            let ps = self.probes().await;
            if done(&ps) || Instant::now() >= end {
                return ps;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The value of `name{labels…}` in a text exposition (the first matching line).
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' ']).next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
}

fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

fn started_unix(p: &Value) -> f64 {
    let s = p["timeline"]["started_at"].as_str().expect("started_at");
    let ts: k8s_openapi::jiff::Timestamp = s.parse().expect("RFC 3339");
    ts.as_millisecond() as f64 / 1000.0
}

fn touches(p: &Value, node: &str) -> bool {
    p["source"]["node"] == node || p["target"]["node"] == node
}

fn counted_for(p: &Value, node: &str) -> bool {
    p["drift"]["nodes"]
        .as_array()
        .is_some_and(|a| a.iter().any(|n| n == node))
}

/// Records of `node` started after `from`, oldest first, with TTFP.
fn after(probes: &[Value], node: &str, from: f64) -> Vec<Value> {
    let mut v: Vec<Value> = probes
        .iter()
        .filter(|p| touches(p, node) && started_unix(p) >= from && p["ttfp_seconds"].is_f64())
        .cloned()
        .collect();
    v.sort_by(|a, b| started_unix(a).total_cmp(&started_unix(b)));
    v
}

/// `a` within max(20 %, 100 ms) of `b`.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= (0.2 * b).max(0.1)
}

/// The stored baseline (ConfigMap `firstpacket-baseline` or `name`) and its `cross_node`
/// samples; `None` when there is none.
fn stored(c: &Cluster, name: &str) -> Option<(Value, Vec<Value>)> {
    let cm = c
        .store
        .get(Kind::ConfigMap, Some("firstpacket"), name)
        .ok()?;
    let snap: Value = serde_json::from_str(cm["data"]["baseline.json"].as_str()?).ok()?;
    let samples = snap["kinds"]["cross_node"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Some((snap, samples))
}

const NODES: [&str; 4] = ["node-1", "node-2", "node-3", "node-4"];

// ---------------------------------------------------------------------------------
// prober run: learning, drift, and the baseline kept across leaders and restarts.
// ---------------------------------------------------------------------------------

/// S1 learned; node-1 and node-4 turn slow at runtime (S5) and back: the kind's and
/// those nodes' drift pass the thresholds within 10 probes touching them, end within
/// 10 probes after the switch back, and the baseline after the episode is the one from
/// before (the episode, in the baseline window by then, was not absorbed).
#[test]
fn run_drift_follows_slow_nodes_at_runtime_and_back_without_absorbing_them() {
    run(|| async {
        let targets = Targets::default();
        let c = Cluster::start(4, by_node(&targets, NORMAL, &[], SLOW)).await;
        let r = Run::start(&c, 9101, &[]).await;
        let before = learn_s1(&r).await;
        let slow = ["node-1", "node-4"];
        c.set_script(by_node(&targets, NORMAL, &slow, SLOW));
        drifts_within_10_probes(&r, &slow, now_unix()).await;
        // Two seconds more of S5: the episode's slow probes would be a visible part of
        // the baseline had they been absorbed.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let back = now_unix();
        c.set_script(by_node(&targets, NORMAL, &[], SLOW));
        drift_ends_within_10_probes(&r, &slow, back).await;
        baseline_is_the_one_from_before(&r, &c, &slow, before, back).await;
    });
}

/// Thresholds exported, series NaN until learned, then the S1 baseline learned (its
/// p50) and every node's.
async fn learn_s1(r: &Run) -> f64 {
    // Series exist from the start, NaN until learned; thresholds exported.
    let text = r.metrics().await;
    assert_eq!(
        metric(&text, "firstpacket_drift_threshold_ratio", &[]),
        Some(1.5),
        "{text}"
    );
    assert_eq!(
        metric(&text, "firstpacket_drift_floor_seconds", &[]),
        Some(0.5)
    );
    assert!(
        metric(
            &text,
            "firstpacket_baseline_seconds",
            &[("kind", "cross_node"), ("quantile", "0.5")]
        )
        .is_some_and(f64::is_nan),
        "{text}"
    );
    let before = r.baseline_of(40, Duration::from_secs(40)).await;
    // The larger of two draws in 0.2–0.6 s: median ~0.48 s.
    assert!((0.38..0.58).contains(&before), "S1 baseline p50 {before}");
    r.nodes_learned(&NODES, Duration::from_secs(30)).await;
    before
}

/// S5 switched on at `switched`: drift counted within 10 probes touching each slow
/// node, their gauges and the kind's active.
async fn drifts_within_10_probes(r: &Run, slow: &[&str], switched: f64) {
    // S5 at runtime: drift within 10 probes touching node-1 / node-4.
    let probes = r
        .probes_until(Duration::from_secs(40), |ps| {
            slow.iter()
                .all(|n| after(ps, n, switched).iter().any(|p| counted_for(p, n)))
        })
        .await;
    for n in slow {
        let mine = after(&probes, n, switched);
        let first = mine.iter().position(|p| counted_for(p, n));
        assert!(
            first.is_some_and(|i| i < 10),
            "{n}: drift not counted within 10 probes touching it (first at {first:?} of {})",
            mine.len()
        );
    }
    // The gauges show it too (polled: a node's best-peer median moves with each
    // probe).
    let mut seen = BTreeSet::new();
    let end = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = r.metrics().await;
        for n in slow {
            if metric(&text, "firstpacket_node_drift_active", &[("node", n)]) == Some(1.0) {
                seen.insert(n);
            }
        }
        let kind = metric(&text, "firstpacket_drift_active", &[("kind", "cross_node")]);
        if (seen.len() == slow.len() && kind == Some(1.0)) || Instant::now() >= end {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        seen.len(),
        slow.len(),
        "node drift gauges seen active: {seen:?}\n{text}"
    );
    assert_eq!(
        metric(&text, "firstpacket_drift_active", &[("kind", "cross_node")]),
        Some(1.0),
        "kind drift not active in S5\n{text}"
    );
    let ratio = metric(&text, "firstpacket_drift_ratio", &[("kind", "cross_node")]).expect("ratio");
    // 10 of the 12 pairs slow (≥ 1.2 s) against a ~0.48 s median: ×2.5 and more.
    assert!(ratio >= 2.0, "drift ratio {ratio}\n{text}");
}

/// Back to S1 at `back`: drift ends within 10 probes touching each slow node.
async fn drift_ends_within_10_probes(r: &Run, slow: &[&str], back: f64) {
    // Back to S1: drift ends within 10 probes (started after the switch back).
    let probes = r
        .probes_until(Duration::from_secs(40), |ps| {
            slow.iter().all(|n| after(ps, n, back).len() >= 10)
        })
        .await;
    for n in slow {
        let mine = after(&probes, n, back);
        assert!(
            mine.len() >= 10,
            "{n}: only {} probes after the switch back",
            mine.len()
        );
        assert!(
            !counted_for(&mine[9], n),
            "{n}: still drifting 10 probes after the switch back: {:?}",
            mine.iter().map(|p| counted_for(p, n)).collect::<Vec<_>>()
        );
    }
    let text = r.metrics().await;
    for n in slow {
        assert_eq!(
            metric(&text, "firstpacket_node_drift_active", &[("node", n)]),
            Some(0.0),
            "{n}\n{text}"
        );
    }
    let ratio = metric(&text, "firstpacket_drift_ratio", &[("kind", "cross_node")]).expect("ratio");
    assert!(ratio < 1.5, "ratio after the episode {ratio}");
}

/// Once the episode is in the baseline window, the baseline is the one from before
/// (`before`, its p50), overall and for the slow nodes: of the episode's slow probes at
/// most those still running at the switch back (≤ `--concurrency`) are in it — they
/// finish after their nodes' drift ended, so they count as taken while not drifting.
/// The status page draws the band.
async fn baseline_is_the_one_from_before(
    r: &Run,
    c: &Cluster,
    slow: &[&str],
    before: f64,
    back: f64,
) {
    // Once the episode's probes are all older than the recent window (4 s; the last
    // slow probes finish up to 2.5 s after the switch back), they are in the baseline
    // window: the baseline is the one from before.
    let wait = (back + 4.0 + 2.5 - now_unix()).max(0.0);
    tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    let after_p50 = r.learned_p50(Duration::from_secs(1)).await;
    assert!(
        close(after_p50, before),
        "baseline p50 {before:.3}s before the episode, {after_p50:.3}s after"
    );
    let page = r.page().await;
    for n in slow {
        let p50 = page["info"]["node_drift"][n]["baseline"]["p50"]
            .as_f64()
            .unwrap_or_else(|| panic!("{n}: no baseline\n{:#}", page["info"]["node_drift"]));
        assert!(
            p50 <= 0.65,
            "{n}'s baseline absorbed the episode: p50 {p50}"
        );
    }
    // The episode was long enough to tell: many slow probes.
    let episode = page["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["ttfp_seconds"].as_f64().is_some_and(|t| t >= 1.0))
        .count();
    assert!(episode >= 10, "only {episode} slow probes in the episode");
    // The baseline as saved (every second: its eligible samples), slow ones by series.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (snap, kind) = stored(c, "firstpacket-baseline").expect("saved baseline");
    let slow_in = |v: &Value| {
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|s| s[1].as_f64().is_some_and(|t| t >= 1.0))
            .count()
    };
    let kind_slow = slow_in(&Value::from(kind));
    assert!(
        kind_slow <= 4,
        "{kind_slow} of the episode's {episode} slow probes in the cross_node baseline"
    );
    for n in slow {
        let node_slow = slow_in(&snap["nodes"][n]) + slow_in(&snap["nodes_as_target"][n]);
        assert!(
            node_slow <= 4,
            "{node_slow} of the episode's {episode} slow probes in {n}'s baseline"
        );
    }
    // Status page: the baseline band behind the chart.
    let (code, status) = http_get(&r.addr, "/").await.expect("status page");
    assert_eq!(code, 200);
    assert!(
        status.contains("class=\"baseline-band\" data-kind=\"cross_node\""),
        "no band"
    );
}

/// A leader change keeps the baseline: a standby (learning nothing while it stands by)
/// takes over when the leader is gone and starts from the saved baseline (the
/// ConfigMap) before it learned anything itself; so does a restarted prober without
/// election.
#[test]
fn run_baseline_survives_a_leader_change_and_a_restart() {
    run(|| async {
        let targets = Targets::default();
        let c = Cluster::start(4, by_node(&targets, NORMAL, &[], SLOW)).await;
        let leader = Run::start(&c, 9101, LEADER_FLAGS).await;
        let learned = leader.baseline_of(40, Duration::from_secs(40)).await;
        assert!((0.38..0.58).contains(&learned), "S1 baseline p50 {learned}");
        assert_eq!(leader.metric("firstpacket_leader", &[]).await, Some(1.0));
        let standby = Run::start(&c, 9102, LEADER_FLAGS).await;
        // Saved meanwhile (every second), labelled as firstpacket's.
        assert!(
            cluster::eventually(Duration::from_secs(5), || stored(
                &c,
                "firstpacket-baseline"
            )
            .is_some_and(|s| s.1.len() >= 8))
            .await,
            "no baseline saved: {:?}",
            stored(&c, "firstpacket-baseline")
        );
        let cm = c
            .store
            .get(Kind::ConfigMap, Some("firstpacket"), "firstpacket-baseline")
            .expect("configmap");
        assert_eq!(
            cm["metadata"]["labels"]["app.kubernetes.io/name"], "firstpacket",
            "{cm:#}"
        );
        // A standby probes nothing and learns nothing.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let text = standby.metrics().await;
        assert_eq!(
            metric(&text, "firstpacket_leader", &[]),
            Some(0.0),
            "{text}"
        );
        assert_eq!(
            metric(
                &text,
                "firstpacket_state_entries",
                &[("structure", "baseline_samples")]
            ),
            Some(0.0),
            "{text}"
        );
        assert!(standby.probes().await.is_empty());
        let p50 = leader.learned_p50(Duration::from_secs(1)).await;
        let samples_before = leader
            .metric("firstpacket_baseline_samples", &[("kind", "cross_node")])
            .await
            .expect("samples");

        // The leader is gone (its election with it): the standby takes over once the
        // Lease expires and starts from the saved baseline.
        drop(leader);
        let end = Instant::now() + Duration::from_secs(15);
        let (samples, own) = loop {
            let text = standby.metrics().await;
            let samples = metric(
                &text,
                "firstpacket_baseline_samples",
                &[("kind", "cross_node")],
            )
            .unwrap_or(0.0);
            if samples > 0.0 {
                break (samples, standby.probes().await.len());
            }
            assert!(
                Instant::now() < end,
                "the standby restored no baseline within 15 s\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(standby.metric("firstpacket_leader", &[]).await, Some(1.0));
        assert!(
            samples >= 8.0 && own < 8,
            "the new leader's baseline ({samples} samples, the old one had {samples_before}) is its own ({own} probes)"
        );
        let restored = standby.learned_p50(Duration::from_secs(1)).await;
        assert!(close(restored, p50), "restored p50 {restored} vs {p50}");
        assert!(
            standby.logs.text().contains("baseline restored"),
            "{}",
            standby.logs.text()
        );

        // A restart (a new prober, no election): it starts from the saved baseline too.
        drop(standby);
        let restarted = Run::start(&c, 9103, &[]).await;
        let restored = restarted.learned_p50(Duration::from_secs(5)).await;
        let own = restarted.probes().await.len();
        let samples = restarted
            .metric("firstpacket_baseline_samples", &[("kind", "cross_node")])
            .await
            .unwrap_or(0.0);
        assert!(
            samples >= 8.0 && own < 8,
            "the restarted prober's baseline ({samples} samples) is its own ({own} probes)"
        );
        assert!(close(restored, p50), "restored p50 {restored} vs {p50}");
        assert!(
            restarted.logs.text().contains("baseline restored"),
            "{}",
            restarted.logs.text()
        );
    });
}

/// A slower normal (1–1.5 s, more than twice S1's and more than its median + the 0.5 s
/// floor) is learned as it is, without drift; doubling it drifts. The ranges make both
/// halves certain for a correct engine: 1.5 s against a baseline median ≥ 1 s is under
/// ×1.5 and +0.5 s, and doubled the recent median is ×2 of the baseline's.
#[test]
fn a_slower_normal_is_learned_without_drift_and_doubling_it_drifts() {
    run(|| async {
        let c = Cluster::start(3, uniform((1000, 1500))).await;
        let r = Run::start(&c, 9101, &[]).await;
        let p50 = r.learned_p50(Duration::from_secs(40)).await;
        assert!((1.0..1.5).contains(&p50), "1–1.5 s normal learned as {p50}");
        r.nodes_learned(&NODES[..3], Duration::from_secs(30)).await;
        // Learned: a few more probes, none counted as drift, gauges 0.
        let learned_at = now_unix();
        let probes = r
            .probes_until(Duration::from_secs(30), |ps| {
                ps.iter().filter(|p| started_unix(p) >= learned_at).count() >= 4
            })
            .await;
        assert!(
            probes
                .iter()
                .filter(|p| started_unix(p) >= learned_at)
                .count()
                >= 4,
            "fewer than 4 probes after learning"
        );
        let drifting: Vec<(&Value, &Value, &Value)> = probes
            .iter()
            .filter(|p| p["drift"]["counted"] == true)
            .map(|p| (&p["id"], &p["ttfp_seconds"], &p["drift"]))
            .collect();
        assert!(
            drifting.is_empty(),
            "drift on a healthy slower normal: {drifting:?}"
        );
        assert_eq!(
            r.metric("firstpacket_drift_active", &[("kind", "cross_node")])
                .await,
            Some(0.0)
        );
        // Doubled: drift.
        c.set_script(uniform((2000, 3000)));
        let end = Instant::now() + Duration::from_secs(40);
        loop {
            let active = r
                .metric("firstpacket_drift_active", &[("kind", "cross_node")])
                .await;
            if active == Some(1.0) {
                break;
            }
            assert!(
                Instant::now() < end,
                "no drift after doubling the normal\n{}",
                r.metrics().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// The stored baseline survives a refused read: nothing is written until a read works,
/// then the stored samples are merged with what was learned (forged kinds and samples
/// dated in the future dropped).
#[test]
fn a_refused_baseline_read_never_overwrites_the_stored_baseline_and_a_later_read_merges_it() {
    run(|| async {
        let c = Cluster::start(3, by_node(&Targets::default(), NORMAL, &[], SLOW)).await;
        // A stored baseline of 40 samples (4.321 s: no probe here takes that long) over
        // the last 5 minutes, plus one sample dated an hour ahead (a clock that ran ahead)
        // and a kind this run does not probe.
        let now = now_unix();
        let mut samples: Vec<[f64; 2]> = (0..40)
            .map(|i| [(now - 300.0 + 6.0 * i as f64).round(), 4.321])
            .collect();
        samples.push([now + 3600.0, 10.0]);
        let snap = json!({
            "version": 1,
            "saved_at": now,
            "kinds": {"cross_node": samples, "no_such_kind": [[now - 100.0, 1.0]]},
            "nodes": {},
            "nodes_as_target": {},
        });
        let _ = c.store.create(
            Kind::Namespace,
            json!({"metadata": {"name": "firstpacket"}}),
        );
        c.store
            .create(
                Kind::ConfigMap,
                json!({"metadata": {"name": "firstpacket-baseline", "namespace": "firstpacket",
                          "labels": {"app.kubernetes.io/name": "firstpacket"}},
                       "data": {"baseline.json": snap.to_string()}}),
            )
            .expect("configmap");
        let before = stored(&c, "firstpacket-baseline").expect("stored").1;
        assert_eq!(before.len(), 41);

        // The read is refused: the run learns meanwhile but writes nothing.
        c.store.deny("get", "configmaps");
        let r = Run::start(&c, 9101, &[]).await;
        r.probes_until(Duration::from_secs(20), |ps| ps.len() >= 3)
            .await;
        tokio::time::sleep(Duration::from_millis(1500)).await; // > one --baseline-save-interval
        assert!(r.probes().await.len() >= 3, "no probes");
        assert_eq!(
            stored(&c, "firstpacket-baseline").expect("stored").1,
            before
        );
        let text = r.metrics().await;
        for result in ["ok", "error"] {
            assert_eq!(
                metric(
                    &text,
                    "firstpacket_baseline_writes_total",
                    &[("result", result)]
                ),
                Some(0.0),
                "a write without a read\n{text}"
            );
        }
        assert!(
            r.logs
                .text()
                .contains("nothing is written until a read succeeds"),
            "{}",
            r.logs.text()
        );

        // Allowed again: the next save reads first, adds the stored samples (not the one
        // from the future, not the unknown kind) to what was learned, then writes.
        c.store.allow_all();
        assert!(
            cluster::eventually(Duration::from_secs(10), || stored(
                &c,
                "firstpacket-baseline"
            )
            .is_some_and(|s| s.1.len() != before.len()))
            .await,
            "nothing written after the read was allowed again"
        );
        let (snap, after) = stored(&c, "firstpacket-baseline").expect("stored");
        let t_max = now + 120.0;
        assert!(
            after.len() > 40
                && after
                    .iter()
                    .all(|s| s[0].as_f64().unwrap_or(f64::MAX) < t_max),
            "stored after the merge: {after:?}"
        );
        let kept = after
            .iter()
            .filter(|s| s[1].as_f64() == Some(4.321))
            .count();
        assert_eq!(kept, 40, "the stored samples survive: {after:?}");
        // What was learned is in it too: a TTFP one of this run's probes measured.
        let measured: Vec<f64> = r
            .probes()
            .await
            .iter()
            .filter_map(|p| p["ttfp_seconds"].as_f64())
            .collect();
        assert!(
            after.iter().any(|s| s[1]
                .as_f64()
                .is_some_and(|v| measured.iter().any(|m| (m - v).abs() < 0.001))),
            "no measured TTFP {measured:?} in {after:?}"
        );
        assert!(snap["kinds"].get("no_such_kind").is_none(), "{snap}");
        assert!(r
            .metric("firstpacket_baseline_writes_total", &[("result", "ok")])
            .await
            .is_some_and(|v| v >= 1.0));
    });
}

/// A `--baseline-configmap` that is not firstpacket's (no label) is never written.
#[test]
fn a_baseline_configmap_that_is_not_firstpackets_is_left_alone() {
    run(|| async {
        let c = Cluster::start(3, by_node(&Targets::default(), NORMAL, &[], SLOW)).await;
        let _ = c.store.create(
            Kind::Namespace,
            json!({"metadata": {"name": "firstpacket"}}),
        );
        c.store
            .create(
                Kind::ConfigMap,
                json!({"metadata": {"name": "someone-elses", "namespace": "firstpacket"},
                       "data": {"keep": "me"}}),
            )
            .expect("configmap");
        let r = Run::start(&c, 9101, &["--baseline-configmap", "someone-elses"]).await;
        r.probes_until(Duration::from_secs(20), |ps| ps.len() >= 2)
            .await;
        tokio::time::sleep(Duration::from_millis(1500)).await; // > one --baseline-save-interval
        let probes = r.probes().await;
        assert!(
            probes.iter().filter(|p| p["ttfp_seconds"].is_f64()).count() >= 2,
            "nothing learned: {probes:?}"
        );
        let theirs = c
            .store
            .get(Kind::ConfigMap, Some("firstpacket"), "someone-elses")
            .expect("someone-elses");
        assert_eq!(theirs["data"], json!({"keep": "me"}), "{theirs}");
        assert!(theirs["metadata"]["labels"].is_null(), "{theirs}");
        let text = r.metrics().await;
        for result in ["ok", "error"] {
            assert_eq!(
                metric(
                    &text,
                    "firstpacket_baseline_writes_total",
                    &[("result", result)]
                ),
                Some(0.0),
                "{text}"
            );
        }
        assert!(c
            .store
            .get(Kind::ConfigMap, Some("firstpacket"), "firstpacket-baseline")
            .is_err());
        assert!(
            r.logs.text().contains("is not firstpacket's"),
            "{}",
            r.logs.text()
        );
    });
}

// ---------------------------------------------------------------------------------
// prober gate: --save-baseline and --baseline.
// ---------------------------------------------------------------------------------

/// junitparser's view of a JUnit file: (classname, name, failure message or "").
fn junit_cases(path: &std::path::Path) -> Vec<(String, String, String)> {
    let venv = std::env::var("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache")
        })
        .join("firstpacket/venv-junitparser-5.0.3/bin/python3");
    assert!(
        venv.is_file(),
        "{} missing: run `bash scripts/setup.sh`",
        venv.display()
    );
    let script = r#"
import json, sys
from junitparser import JUnitXml, Failure
xml = JUnitXml.fromfile(sys.argv[1])
out = []
for suite in xml:
    for case in suite:
        msg = ""
        for r in case.result:
            if isinstance(r, Failure):
                msg = r.message or ""
        out.append([case.classname, case.name, msg])
print(json.dumps(out))
"#;
    let out = std::process::Command::new(&venv)
        .args(["-c", script])
        .arg(path)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "junitparser: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("junitparser output")
}

/// The report matches the published JSON schema.
fn validate(report: &Value) {
    let schema: Value =
        serde_json::from_str(firstpacket_report::GATE_REPORT_SCHEMA).expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(report)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
}

const GATE_ARGS: &[&str] = &["--pairs", "12", "--concurrency", "12", "--seed", "7"];

/// `--save-baseline` on a healthy cluster (every ordered pair once: 12 probes, 6 per
/// node).
async fn save_healthy(c: &Cluster, saved: &std::path::Path) -> Value {
    let mut args = GATE_ARGS.to_vec();
    args.extend(["--save-baseline", saved.to_str().unwrap()]);
    let (code, report) = c.gate(&args).await;
    assert_eq!(code.expect("gate ran"), 0, "healthy gate\n{report:#?}");
    let b: Value =
        serde_json::from_str(&std::fs::read_to_string(saved).expect("saved")).expect("json");
    assert_eq!(b["kinds"]["cross_node"]["n"], 12, "{b:#}");
    let p95 = b["kinds"]["cross_node"]["p95"].as_f64().expect("p95");
    assert!((0.3..0.7).contains(&p95), "saved p95 {p95}\n{b:#}");
    for n in NODES {
        let node = &b["kinds"]["cross_node"]["nodes"][n];
        assert_eq!(node["n"], 6, "{b:#}");
        assert_eq!(node["as_source"]["n"], 3, "{b:#}");
        assert_eq!(node["as_target"]["n"], 3, "{b:#}");
    }
    assert_eq!(b["settings"]["drift_ratio"], 1.5);
    b
}

/// node-2 and node-3 slow against a healthy saved baseline: exit 1, the kind and
/// exactly node-2 and node-3 regressed, named in the verdict and in the JUnit file.
#[test]
fn gate_against_a_saved_baseline_fails_naming_exactly_the_slow_nodes() {
    run(|| async {
        let targets = Targets::default();
        let c = Cluster::start(4, by_node(&targets, NORMAL, &[], SLOW)).await;
        let saved = c.dir.path().join("baseline.json");
        let junit = c.dir.path().join("junit.xml");
        save_healthy(&c, &saved).await;

        // S2: node-2 and node-3 slow (every probe still under the thresholds).
        c.set_script(by_node(
            &targets,
            NORMAL,
            &["node-2", "node-3"],
            (2000, 3000),
        ));
        let mut args = GATE_ARGS.to_vec();
        args.extend(["--max-ttfp", "60s", "--slow-threshold", "60s"]);
        args.extend([
            "--baseline",
            saved.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
        ]);
        let (code, report) = c.gate(&args).await;
        let report = report.expect("report");
        validate(&report);
        assert_eq!(
            code.expect("gate ran"),
            1,
            "slow nodes against the baseline"
        );
        assert!(
            cluster::endings(&report).iter().all(|e| e.0 == "success"),
            "{:?}",
            cluster::endings(&report)
        );
        let cmp = &report["baseline"];
        assert_eq!(cmp["regressed"], true, "{cmp:#}");
        assert_eq!(cmp["quantile"], "p95");
        let regressed: BTreeSet<String> = cmp["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["regressed"] == true)
            .map(|e| e["node"].as_str().unwrap_or("*").to_string())
            .collect();
        assert_eq!(
            regressed,
            ["*", "node-2", "node-3"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            "{cmp:#}"
        );
        // node-2's p95 now is its slow draws' (2–3 s), against the saved ≤ 0.6 s.
        let node2 = cmp["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .find(|e| e["node"] == "node-2")
            .expect("node-2 entry");
        let now = node2["current_seconds"].as_f64().expect("now");
        assert!(
            (1.95..3.1).contains(&now),
            "node-2 p95 now {now}\n{node2:#}"
        );
        // Too few samples (3 per node role, 12 per kind, below 20): a warning, compared
        // anyway.
        assert_eq!(cmp["few_samples"], true);
        let gate: firstpacket_report::GateReport =
            serde_json::from_value(report.clone()).expect("report shape");
        let text = prober::gate::render_baseline_text(&gate);
        assert!(text.contains("fewer than 20 samples"), "{text}");
        let reasons: Vec<&str> = report["verdict_reasons"]
            .as_array()
            .expect("reasons")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with("baseline regression: cross_node node-2: p95")),
            "{reasons:?}"
        );
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("node-3") && r.contains("vs baseline")),
            "{reasons:?}"
        );
        assert!(
            !reasons.iter().any(|r| {
                r.starts_with("baseline regression: cross_node node-1")
                    || r.starts_with("baseline regression: cross_node node-4")
            }),
            "{reasons:?}"
        );
        junit_fails_exactly_the_slow_nodes(&junit);
        assert!(
            cluster::eventually(Duration::from_secs(10), || c.probe_pods().is_empty()).await,
            "probe pods left: {:?}",
            c.probe_pods()
        );
    });
}

/// The JUnit file of a gate where node-2 and node-3 regressed, read by junitparser: a
/// testcase per kind and node, failures on exactly node-2 and node-3 and the baseline
/// comparison.
fn junit_fails_exactly_the_slow_nodes(junit: &std::path::Path) {
    // JUnit, read by junitparser: a testcase per kind and node, failures on
    // node-2/3.
    let cases = junit_cases(junit);
    let names: BTreeSet<(String, String)> =
        cases.iter().map(|c| (c.0.clone(), c.1.clone())).collect();
    for n in NODES {
        assert!(
            names.contains(&("firstpacket.node".into(), n.into())),
            "{cases:?}"
        );
    }
    assert!(
        names.contains(&("firstpacket.kind".into(), "cross_node".into())),
        "{cases:?}"
    );
    let failing: BTreeSet<String> = cases
        .iter()
        .filter(|c| c.0 == "firstpacket.node" && !c.2.is_empty())
        .map(|c| c.1.clone())
        .collect();
    assert_eq!(
        failing,
        ["node-2", "node-3"].iter().map(|s| s.to_string()).collect(),
        "{cases:?}"
    );
    let baseline_case = cases
        .iter()
        .find(|c| c.0 == "firstpacket.baseline")
        .expect("baseline case");
    assert!(
        baseline_case.2.contains("node-2") && baseline_case.2.contains("vs baseline"),
        "{baseline_case:?}"
    );
    let node2 = cases.iter().find(|c| c.1 == "node-2").expect("node-2");
    assert!(
        node2.2.contains("p95") && node2.2.contains("best peer"),
        "{node2:?}"
    );
}

/// The same healthy cluster against its own saved baseline: exit 0, every time.
#[test]
fn gate_against_a_saved_baseline_passes_on_the_same_healthy_cluster_every_time() {
    run(|| async {
        let targets = Targets::default();
        let c = Cluster::start(4, by_node(&targets, NORMAL, &[], SLOW)).await;
        let saved = c.dir.path().join("baseline.json");
        let junit = c.dir.path().join("junit.xml");
        save_healthy(&c, &saved).await;
        for i in 0..5 {
            let mut args = GATE_ARGS.to_vec();
            args.extend([
                "--baseline",
                saved.to_str().unwrap(),
                "--junit",
                junit.to_str().unwrap(),
            ]);
            let (code, report) = c.gate(&args).await;
            let report = report.expect("report");
            assert_eq!(code.expect("gate ran"), 0, "run {i}\n{report:#}");
            let cmp = &report["baseline"];
            assert_eq!(cmp["regressed"], false, "run {i}: {cmp:#}");
            // Compared: the kind and the four nodes, each with this run's samples.
            let entries = cmp["entries"].as_array().expect("entries");
            assert_eq!(entries.len(), 5, "run {i}: {cmp:#}");
            assert!(
                entries.iter().all(|e| e["current_seconds"].is_f64()),
                "run {i}: {cmp:#}"
            );
            let cases = junit_cases(&junit);
            assert_eq!(cases.len(), 4 + 1 + 1, "run {i}: {cases:?}");
            assert!(cases.iter().all(|c| c.2.is_empty()), "run {i}: {cases:?}");
        }
    });
}
