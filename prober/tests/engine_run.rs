//! Middle tier: `prober run` (continuous mode, `prober::run_mode::run_continuous`)
//! against the in-process cluster of `tests/cluster` (no root, no packets; each test in
//! its own network namespace with only loopback, so every run's admin server listens on
//! the same [`ADMIN`] address). Each test scripts what the pods do, changes the cluster
//! through the API [`Store`] (Nodes, Leases, agent pods, the API server itself) and
//! checks what the run did: probe pods in the Store, `/metrics`, `/api/v1/probes`,
//! `/readyz`, Events.
//!
//! - the run loop probes every node pair and its `/metrics` agree with its records;
//! - leader election: a Lease taken by another holder stops the probing; expired or
//!   released, it is taken back and probing resumes;
//! - the janitor and the reaper: a dead instance's probe objects and this instance's own
//!   leftovers are deleted, a live instance's pods are not;
//! - change triggers: a node that turns Ready, or whose agent pod restarts or is
//!   replaced, is probed at once, not at its turn in the rotation;
//! - slow nodes get slow Events and metrics, the healthy side none;
//! - an API server outage mid-run: the run carries on and probes again.
//!
//! Stopping: `run_continuous` ends only on SIGINT/SIGTERM (no shutdown hook), and a
//! signal would reach every test of this binary; so each run is a spawned task aborted
//! when the test ends ([`Run`]'s drop), and the test's runtime shutdown ends the tasks
//! it spawned (watches, admin server, Lease renewals). The SIGTERM path (exit 0, probe
//! pods deleted) stays end-to-end (testbed `e2e_run`, the in-cluster Deployment).

use crate::cluster;

use clap::Parser;
use cluster::{eventually, lock, ok, run, Act, Cluster, Outcome, PodView, Script};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::api::{Kind, Store};
use tokio::task::JoinHandle;

/// The admin server of every run (each test has a network namespace of its own).
const ADMIN: &str = "127.0.0.1:19090";

/// The probe namespace (the `--namespace` default).
const NS: &str = "firstpacket";

/// `prober run` in a task, aborted on drop (module docs).
struct Run {
    task: JoinHandle<Result<i32, prober::Error>>,
    /// `info.instance` of `/api/v1/probes`.
    instance: String,
    /// When `/readyz` first answered 200.
    ready_at: Instant,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Run {
    /// Panics when the run has ended (it only ends on a signal or a start-up error).
    fn assert_running(&self, when: &str) {
        assert!(!self.task.is_finished(), "prober run ended {when}");
    }
}

/// `prober run` flags: kubeconfig and admin address, `extra`, then this file's defaults
/// for the flags `extra` leaves out (`--probe-interval 1s`, `--hold 200ms`,
/// `--give-up 3s`).
fn run_args(c: &Cluster, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "prober".into(),
        "run".into(),
        "--kubeconfig".into(),
        c.kubeconfig.display().to_string(),
        "--admin-addr".into(),
        ADMIN.into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    for (flag, value) in [
        ("--probe-interval", "1s"),
        ("--hold", "200ms"),
        ("--give-up", "3s"),
    ] {
        if !extra.contains(&flag) {
            a.extend([flag.to_string(), value.to_string()]);
        }
    }
    a
}

/// Starts `prober run` with [`run_args`] and waits (≤ 20 s) for its `/readyz`.
async fn start_run(c: &Cluster, extra: &[&str]) -> Run {
    let cli = prober::config::Cli::try_parse_from(run_args(c, extra)).expect("run args");
    let prober::config::Command::Run(args) = cli.command else {
        unreachable!()
    };
    let task = tokio::spawn(prober::run_mode::run_continuous(args));
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if task.is_finished() {
            panic!("prober run ended at start-up: {:?}", task.await);
        }
        if matches!(get("/readyz").await, Some((200, _))) {
            break;
        }
        assert!(Instant::now() < end, "/readyz not 200 within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready_at = Instant::now();
    let page = probes_page().await;
    let instance = page["info"]["instance"]
        .as_str()
        .expect("info.instance")
        .to_string();
    Run {
        task,
        instance,
        ready_at,
    }
}

/// `GET path` on the admin server: status and body; `None` when it does not answer.
async fn get(path: &str) -> Option<(u16, String)> {
    let addr: SocketAddr = ADMIN.parse().expect("admin address");
    let r = testbed::httpc::request(addr, "GET", path, &[], b"", Duration::from_secs(5))
        .await
        .ok()?;
    Some((r.status, String::from_utf8_lossy(&r.body).into_owned()))
}

async fn probes_page() -> Value {
    let (status, body) = get("/api/v1/probes").await.expect("admin server answers");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("/api/v1/probes is JSON")
}

async fn metrics() -> Vec<Sample> {
    let (status, body) = get("/metrics").await.expect("admin server answers");
    assert_eq!(status, 200, "{body}");
    parse_metrics(&body)
}

/// `/api/v1/probes`, `/metrics`, `/api/v1/probes`, retried until both pages have the
/// same `total`: the metrics were read between two identical states.
async fn consistent_scrape() -> (Value, Vec<Sample>) {
    for _ in 0..50 {
        let a = probes_page().await;
        let samples = metrics().await;
        let b = probes_page().await;
        if a["total"] == b["total"] {
            return (a, samples);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no consistent scrape in 50 tries");
}

/// One sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the Prometheus text format (the subset the prober writes: no escapes in
/// label values).
fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((head, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => {
                let body = rest.trim_end_matches('}');
                let labels = body
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.to_string(), v.trim_matches('"').to_string()))
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (head.to_string(), BTreeMap::new()),
        };
        out.push((name, labels, value));
    }
    out
}

/// Sum of the samples of `name` whose labels include `want`.
fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

fn has(samples: &[Sample], name: &str) -> bool {
    samples.iter().any(|(n, _, _)| n == name)
}

/// The checks of a consistent scrape: TTFP histogram count and sum = the records with a
/// TTFP, probes_total = `total`, per-node counters and last-TTFP gauges = the records.
fn assert_metrics_agree_with_records(
    probes: &[Value],
    total: u64,
    samples: &[Sample],
    nodes: &[String],
) {
    let with_ttfp = probes.iter().filter(|p| p["ttfp_seconds"].is_f64()).count();
    assert_eq!(
        sum(samples, "firstpacket_ttfp_seconds_count", &[]) as usize,
        with_ttfp,
        "TTFP histogram count vs records with a TTFP (total {total})"
    );
    assert_eq!(
        sum(
            samples,
            "firstpacket_ttfp_seconds_count",
            &[("kind", "cross_node")]
        ) as usize,
        with_ttfp
    );
    let ttfp_sum: f64 = probes
        .iter()
        .filter_map(|p| p["ttfp_seconds"].as_f64())
        .sum();
    let got_sum = sum(samples, "firstpacket_ttfp_seconds_sum", &[]);
    assert!(
        (got_sum - ttfp_sum).abs() < 1e-6,
        "TTFP histogram sum {got_sum} vs records {ttfp_sum}"
    );
    assert_eq!(sum(samples, "firstpacket_probes_total", &[]) as u64, total);
    for node in nodes {
        for role in ["source", "target"] {
            for result in ["success", "slow", "failed", "inconclusive"] {
                let want = probes
                    .iter()
                    .filter(|p| p[role]["node"] == node.as_str() && p["result"] == result)
                    .count();
                let got = sum(
                    samples,
                    "firstpacket_node_probes_total",
                    &[("node", node), ("role", role), ("result", result)],
                );
                assert_eq!(got as usize, want, "{node} {role} {result}");
            }
            let last = probes
                .iter()
                .rev()
                .find(|p| p[role]["node"] == node.as_str() && p["ttfp_seconds"].is_f64())
                .and_then(|p| p["ttfp_seconds"].as_f64());
            if let Some(last) = last {
                let got = sum(
                    samples,
                    "firstpacket_node_last_ttfp_seconds",
                    &[("node", node), ("role", role)],
                );
                assert!(
                    (got - last).abs() < 1e-9,
                    "{node} {role} last TTFP {got} vs {last}"
                );
            }
        }
    }
}

/// Probe starts as the API saw them: probe id → when its first pod was created (this
/// test's clock) and the nodes its pods were bound to. Set to `None` if the recorder
/// missed Store events (then every question about it panics).
#[derive(Clone)]
struct Starts(Arc<Mutex<Option<StartMap>>>);

/// Probe id → (first pod created, nodes of its pods).
type StartMap = BTreeMap<String, (Instant, BTreeSet<String>)>;

impl Starts {
    /// Records every pod carrying `firstpacket.io/probe-id` from now on.
    fn record(store: &Arc<Store>) -> Starts {
        let starts = Starts(Arc::new(Mutex::new(Some(BTreeMap::new()))));
        let mut rx = store.subscribe();
        let inner = starts.0.clone();
        tokio::spawn(async move {
            loop {
                let ev = match rx.recv().await {
                    Ok(ev) => ev,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        *lock(&inner) = None;
                        return;
                    }
                    Err(_) => return,
                };
                if ev.kind != Kind::Pod {
                    continue;
                }
                let pod = &*ev.object;
                let Some(id) = pod["metadata"]["labels"]["firstpacket.io/probe-id"].as_str() else {
                    continue;
                };
                let mut g = lock(&inner);
                let Some(g) = g.as_mut() else { return };
                let e = g
                    .entry(id.to_string())
                    .or_insert_with(|| (Instant::now(), BTreeSet::new()));
                if let Some(n) = pod["spec"]["nodeName"].as_str() {
                    e.1.insert(n.to_string());
                }
            }
        });
        starts
    }

    /// What was recorded (panics if the recorder missed events).
    fn map(&self) -> StartMap {
        lock(&self.0)
            .clone()
            .expect("the probe start recorder lagged behind the Store's events")
    }

    /// Probes that started in (`from`, `to`), by id.
    fn between(&self, from: Instant, to: Instant) -> Vec<String> {
        self.map()
            .iter()
            .filter(|(_, (at, _))| *at > from && *at < to)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Probes that started before `t`, with their nodes.
    fn before(&self, t: Instant) -> Vec<(String, BTreeSet<String>)> {
        self.map()
            .iter()
            .filter(|(_, (at, _))| *at < t)
            .map(|(id, (_, nodes))| (id.clone(), nodes.clone()))
            .collect()
    }

    /// The first probe that started after `t`: (id, start).
    fn first_after(&self, t: Instant) -> Option<(String, Instant)> {
        self.map()
            .iter()
            .filter(|(_, (at, _))| *at > t)
            .min_by_key(|(_, (at, _))| *at)
            .map(|(id, (at, _))| (id.clone(), *at))
    }

    /// Waits (≤ `within`) for a probe start after `t`.
    async fn next_after(&self, t: Instant, within: Duration) -> (String, Instant) {
        let mut found = None;
        let ok = eventually(within, || {
            found = self.first_after(t);
            found.is_some()
        })
        .await;
        assert!(ok, "no probe started within {within:?}");
        found.expect("found")
    }

    /// The nodes of probe `id`, once both its pods were bound (≤ 3 s).
    async fn nodes(&self, id: &str) -> BTreeSet<String> {
        let mut nodes = BTreeSet::new();
        let ok = eventually(Duration::from_secs(3), || {
            nodes = self.map().get(id).map(|e| e.1.clone()).unwrap_or_default();
            nodes.len() == 2
        })
        .await;
        assert!(ok, "probe {id} bound to {nodes:?}, not two nodes");
        nodes
    }
}

/// Pods of `instance` in the probe namespace (names, sorted).
fn instance_pods(c: &Cluster, instance: &str) -> Vec<String> {
    let mut v: Vec<String> = c
        .pods(Some(NS))
        .iter()
        .filter(|p| p["metadata"]["labels"]["firstpacket.io/instance"] == instance)
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    v.sort();
    v
}

/// Probe pod `name` of `instance` (probe id `id`) bound to node-1, as a prober creates
/// a target.
fn probe_pod(name: &str, instance: &str, id: &str) -> Value {
    json!({
        "metadata": { "name": name, "namespace": NS, "labels": {
            "app.kubernetes.io/name": "firstpacket",
            "app.kubernetes.io/component": "probe-target",
            "firstpacket.io/instance": instance,
            "firstpacket.io/probe-id": id,
        } },
        "spec": {
            "nodeName": "node-1",
            "restartPolicy": "Never",
            "containers": [{ "name": "target-server",
                "image": "ghcr.io/firstpacket/target-server:0.1.0", "args": ["serve"] }],
        },
    })
}

/// The instance Lease of `instance` as [`prober::lease::lease_object`] writes it.
fn instance_lease(instance: &str) -> Value {
    json!({
        "metadata": { "name": format!("firstpacket-{instance}"), "namespace": NS, "labels": {
            "app.kubernetes.io/name": "firstpacket",
            "app.kubernetes.io/component": "instance-lease",
            "firstpacket.io/instance": instance,
        } },
        "spec": {
            "holderIdentity": instance,
            "leaseDurationSeconds": 15,
            "acquireTime": testbed::api::rfc3339_now(),
            "renewTime": testbed::api::rfc3339_now(),
        },
    })
}

fn ensure_probe_namespace(store: &Store) {
    store
        .create(Kind::Namespace, json!({ "metadata": { "name": NS } }))
        .expect("create the probe namespace");
}

/// `n` probe records at least (≤ `within`), from `/api/v1/probes`.
async fn wait_records(n: u64, within: Duration) -> Value {
    let end = Instant::now() + within;
    loop {
        let page = probes_page().await;
        if page["total"].as_u64().unwrap_or(0) >= n {
            return page;
        }
        assert!(
            Instant::now() < end,
            "fewer than {n} records within {within:?}: {page:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ttfp_ms(node: &str) -> u64 {
    // node-i → 100·i ms.
    100 * node
        .strip_prefix("node-")
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(1)
}

/// Scrapes (consistently) until every one of `nodes` was source and target of a
/// conclusive probe and a lap ended (≤ 25 s).
async fn scrape_until_every_node_probed_and_a_lap_ended(nodes: &[String]) -> (Value, Vec<Sample>) {
    let all: BTreeSet<String> = nodes.iter().cloned().collect();
    let end = Instant::now() + Duration::from_secs(25);
    loop {
        let (page, samples) = consistent_scrape().await;
        let probes = page["probes"].as_array().cloned().unwrap_or_default();
        let role = |r: &str| -> BTreeSet<String> {
            probes
                .iter()
                .filter(|p| p["result"] != "inconclusive")
                .filter_map(|p| p[r]["node"].as_str().map(str::to_owned))
                .collect()
        };
        let lap = sum(&samples, "firstpacket_lap_seconds", &[]);
        if role("source") == all && role("target") == all && lap > 0.0 {
            return (page, samples);
        }
        assert!(
            Instant::now() < end,
            "after 25 s: sources {:?}, targets {:?}, lap {lap}: {page:#}",
            role("source"),
            role("target")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every probe a cross_node success with its source's scripted TTFP ([`ttfp_ms`]); the
/// first lap (probe ids end in the run's probe counter) has each node once as source and
/// once as target.
fn assert_probes_follow_the_script_and_the_rotation(probes: &[Value], nodes: &[String]) {
    for p in probes {
        assert_eq!(p["result"], "success", "{p:#}");
        assert_eq!(p["kind"], "cross_node", "{p:#}");
        let src = p["source"]["node"].as_str().expect("source node");
        assert_ne!(p["target"]["node"].as_str(), Some(src), "{p:#}");
        let ttfp = p["ttfp_seconds"].as_f64().expect("ttfp");
        let want = ttfp_ms(src) as f64 / 1000.0;
        assert!(
            (ttfp - want).abs() < 0.05,
            "{src}: TTFP {ttfp} vs scripted {want}"
        );
    }
    let mut by_start = probes.to_vec();
    by_start.sort_by_key(|p| {
        p["id"]
            .as_str()
            .and_then(|id| id.rsplit('-').next())
            .and_then(|n| n.parse::<u64>().ok())
            .expect("probe id ends in a counter")
    });
    for node in nodes {
        for role in ["source", "target"] {
            let n = by_start
                .iter()
                .take(nodes.len())
                .filter(|p| p[role]["node"] == node.as_str())
                .count();
            assert_eq!(n, 1, "{node} as {role} in the first lap: {probes:#?}");
        }
    }
}

/// The run's own series with 4 nodes at `--probe-interval 1s` and `total` records: the
/// lap time (4 × 1 s ± 20 %, read at the loop's next wake-up, ≤ 1 s later),
/// pre-initialised and always-present series, no pod or pair labels, the ring's size.
fn assert_run_series(samples: &[Sample], total: u64) {
    assert_eq!(sum(samples, "firstpacket_lap_expected_seconds", &[]), 4.0);
    let lap = sum(samples, "firstpacket_lap_seconds", &[]);
    assert!((3.0..=6.5).contains(&lap), "lap {lap} s vs 4 × 1 s");
    assert!(samples
        .iter()
        .any(|(n, l, _)| n == "firstpacket_probes_total"
            && l.get("reason").map(String::as_str) == Some("wrong_peer")));
    assert_eq!(sum(samples, "firstpacket_build_info", &[]), 1.0);
    assert_eq!(sum(samples, "firstpacket_leader", &[]), 1.0);
    assert_eq!(sum(samples, "firstpacket_eligible_nodes", &[]), 4.0);
    assert!(has(samples, "firstpacket_probes_in_flight"));
    assert!(
        !samples
            .iter()
            .any(|(_, l, _)| l.contains_key("pod") || l.contains_key("source")),
        "no pod or pair labels"
    );
    let recent = sum(
        samples,
        "firstpacket_state_entries",
        &[("structure", "recent_records")],
    ) as u64;
    assert!(
        recent <= total && recent + 2 >= total,
        "recent_records {recent} vs {total} records"
    );
}

/// The status page: a matrix cell for every pair of `probes`, the chart, self-contained.
async fn assert_status_page_has_every_pair(probes: &[Value]) {
    let (status, html) = get("/").await.expect("status page");
    assert_eq!(status, 200);
    for p in probes {
        let cell = format!(
            "data-source=\"{}\" data-target=\"{}\"",
            p["source"]["node"].as_str().unwrap_or("?"),
            p["target"]["node"].as_str().unwrap_or("?")
        );
        assert!(html.contains(&cell), "no matrix cell {cell}");
    }
    assert!(html.contains("<svg"), "no TTFP chart");
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
}

#[test]
fn the_run_loop_probes_every_pair_and_its_metrics_agree_with_its_records() {
    run(|| async {
        // Each source's first success comes 100 ms × its node number after Ready.
        let script: Script = Arc::new(|p: &PodView| ok(ttfp_ms(&p.node)));
        let c = Cluster::start(4, script).await;
        let r = start_run(&c, &["--probe-interval", "1s"]).await;
        assert_eq!(get("/livez").await, Some((200, "ok\n".to_string())));
        assert!(r.instance.starts_with("run-"), "{}", r.instance);

        let (page, samples) = scrape_until_every_node_probed_and_a_lap_ended(&c.nodes).await;
        r.assert_running("while probing");
        let probes = page["probes"].as_array().expect("probes").clone();
        let total = page["total"].as_u64().expect("total");
        assert_eq!(probes.len() as u64, total, "the ring holds every record");
        assert_metrics_agree_with_records(&probes, total, &samples, &c.nodes);
        assert_probes_follow_the_script_and_the_rotation(&probes, &c.nodes);
        assert_run_series(&samples, total);
        assert_status_page_has_every_pair(&probes).await;
    });
}

/// Sets the leader Lease's holder: `holder` (empty: released) with `duration` seconds,
/// renewed now, as another replica writes it.
fn write_leader_lease(store: &Store, holder: &str, duration: i64) {
    store
        .modify(Kind::Lease, Some(NS), "firstpacket-leader", |l| {
            let transitions = l["spec"]["leaseTransitions"].as_i64().unwrap_or(0);
            let now = testbed::api::rfc3339_now();
            l["spec"]["holderIdentity"] = json!(holder);
            l["spec"]["leaseDurationSeconds"] = json!(duration);
            l["spec"]["acquireTime"] = json!(now);
            l["spec"]["renewTime"] = json!(now);
            l["spec"]["leaseTransitions"] = json!(transitions + 1);
            Ok(())
        })
        .expect("write the leader Lease");
}

fn leader_holder(store: &Store) -> Option<String> {
    store
        .get(Kind::Lease, Some(NS), "firstpacket-leader")
        .ok()
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

/// `firstpacket_leader` as served, polled every 50 ms until it is `want` (≤ `within`);
/// when it was seen.
async fn leader_gauge_becomes(want: f64, within: Duration) -> Option<Instant> {
    let end = Instant::now() + within;
    loop {
        if sum(&metrics().await, "firstpacket_leader", &[]) == want {
            return Some(Instant::now());
        }
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `prober run --leader-elect` (Lease 4 s, renew deadline 3 s, retries every 500 ms)
/// leads, names itself in the Lease and probes; its identity.
async fn leads_and_probes(c: &Cluster) -> String {
    let page = wait_records(2, Duration::from_secs(15)).await;
    let me = page["info"]["leadership"]["identity"]
        .as_str()
        .expect("identity")
        .to_string();
    assert_eq!(page["info"]["leadership"]["leading"], true, "{page:#}");
    assert_eq!(page["info"]["leadership"]["terms"], 1);
    assert_eq!(leader_holder(&c.store).as_deref(), Some(me.as_str()));
    let m = metrics().await;
    assert_eq!(sum(&m, "firstpacket_leader", &[]), 1.0);
    assert!(has(&m, "firstpacket_probes_total"), "leader serves probes");
    me
}

/// Another replica takes the Lease for 3 s and never renews it: the run stands by at
/// its next retry (no probe series, no probe pods, no probe starts) and takes the Lease
/// back once the record expired on its clock, then probes in term 2.
async fn loses_the_lease_until_the_other_holders_record_expires(
    c: &Cluster,
    starts: &Starts,
    r: &Run,
    me: &str,
) {
    let taken = Instant::now();
    write_leader_lease(&c.store, "other-replica", 3);
    let down = leader_gauge_becomes(0.0, Duration::from_secs(3))
        .await
        .expect("firstpacket_leader 0 within 3 s of losing the Lease");
    assert!(
        down - taken < Duration::from_millis(1500),
        "stepped down {:?} after the Lease was taken (retry period 500 ms)",
        down - taken
    );
    // A standby serves no probe series; its page names the holder.
    assert!(
        !has(&metrics().await, "firstpacket_probes_total"),
        "standby serves probes"
    );
    let page = probes_page().await;
    assert_eq!(page["info"]["leadership"]["leading"], false, "{page:#}");
    assert_eq!(page["info"]["leadership"]["holder"], "other-replica");
    // The lost term's probes are cancelled: their pods go.
    assert!(
        eventually(Duration::from_secs(2), || instance_pods(c, &r.instance)
            .is_empty())
        .await,
        "probe pods of the lost term left: {:?}",
        instance_pods(c, &r.instance)
    );
    // The record expires 3 s after the standby first saw it: taken back then.
    assert!(
        eventually(Duration::from_secs(8), || leader_holder(&c.store)
            .as_deref()
            == Some(me))
        .await,
        "Lease not taken back within 8 s: holder {:?}",
        leader_holder(&c.store)
    );
    let back = Instant::now();
    let took = back - taken;
    assert!(
        took >= Duration::from_millis(2900) && took <= Duration::from_millis(5500),
        "taken back {took:?} after another holder wrote a 3 s Lease"
    );
    // No probe started between the step-down (plus the pod creates already sent) and
    // the earliest moment the Lease could be ours again.
    let standby = starts.between(
        down + Duration::from_millis(300),
        taken + Duration::from_millis(2900),
    );
    assert!(
        standby.is_empty(),
        "probes started while another replica held the Lease: {standby:?}"
    );
    assert!(
        leader_gauge_becomes(1.0, Duration::from_secs(2))
            .await
            .is_some(),
        "firstpacket_leader not 1 after the Lease was taken back"
    );
    let (id, at) = starts.next_after(back, Duration::from_secs(3)).await;
    assert!(at - back < Duration::from_millis(2500), "probe {id} late");
    let page = probes_page().await;
    assert_eq!(page["info"]["leadership"]["terms"], 2, "{page:#}");
}

/// Another replica takes the Lease for 30 s and releases it (holder cleared) 1 s later:
/// the run leaves a valid record alone and takes the released one at its next retry,
/// then probes in term 3.
async fn loses_the_lease_until_the_other_holder_releases_it(
    c: &Cluster,
    starts: &Starts,
    me: &str,
) {
    write_leader_lease(&c.store, "other-replica", 30);
    leader_gauge_becomes(0.0, Duration::from_secs(3))
        .await
        .expect("stepped down again");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        leader_holder(&c.store).as_deref(),
        Some("other-replica"),
        "a valid Lease of another holder was taken"
    );
    let released = Instant::now();
    write_leader_lease(&c.store, "", 1);
    assert!(
        eventually(Duration::from_secs(3), || leader_holder(&c.store)
            .as_deref()
            == Some(me))
        .await,
        "released Lease not taken within 3 s"
    );
    assert!(
        released.elapsed() < Duration::from_millis(1500),
        "released Lease taken {:?} later (retry period 500 ms)",
        released.elapsed()
    );
    // Panics when no probe starts within 3 s.
    starts.next_after(released, Duration::from_secs(3)).await;
    assert_eq!(probes_page().await["info"]["leadership"]["terms"], 3);
}

#[test]
fn a_leader_that_loses_its_lease_stops_probing_and_probes_again_once_it_expires_or_is_released() {
    run(|| async {
        let c = Cluster::start(3, cluster::healthy(Duration::from_millis(100))).await;
        let starts = Starts::record(&c.store);
        let r = start_run(
            &c,
            &[
                "--leader-elect",
                "--leader-elect-lease-duration",
                "4s",
                "--leader-elect-renew-deadline",
                "3s",
                "--leader-elect-retry-period",
                "500ms",
            ],
        )
        .await;
        let me = leads_and_probes(&c).await;
        loses_the_lease_until_the_other_holders_record_expires(&c, &starts, &r, &me).await;
        loses_the_lease_until_the_other_holder_releases_it(&c, &starts, &me).await;
        r.assert_running("after the leadership changes");
    });
}

#[test]
fn the_janitor_deletes_a_dead_instances_and_its_own_leftovers_but_not_a_live_instances_pods() {
    run(|| async {
        let c = Cluster::start(2, cluster::healthy(Duration::from_millis(100))).await;
        ensure_probe_namespace(&c.store);
        // A dead instance (a Lease nobody renews) and a live one (renewed every 2 s),
        // each with two probe pods; the dead one also with a probe Service.
        for (instance, tag) in [("run-dead0001", "dead"), ("run-live0001", "live")] {
            c.store
                .create(Kind::Lease, instance_lease(instance))
                .expect("lease");
            for i in 1..=2 {
                let name = format!("fp-{tag}-{i}-t");
                c.store
                    .create(Kind::Pod, probe_pod(&name, instance, &format!("{tag}-{i}")))
                    .expect("pod");
            }
        }
        c.store
            .create(
                Kind::Service,
                json!({
                    "metadata": { "name": "fp-dead-1-svc", "namespace": NS, "labels": {
                        "app.kubernetes.io/name": "firstpacket",
                        "firstpacket.io/instance": "run-dead0001",
                        "firstpacket.io/probe-id": "dead-1",
                    } },
                    "spec": { "ports": [{ "port": 80, "targetPort": 8080 }] },
                }),
            )
            .expect("service");
        let renew = {
            let store = c.store.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let _ = store.modify(Kind::Lease, Some(NS), "firstpacket-run-live0001", |l| {
                        l["spec"]["renewTime"] = json!(testbed::api::rfc3339_now());
                        Ok(())
                    });
                }
            })
        };
        let spawned = Instant::now();
        let r = start_run(&c, &[]).await;
        // Kept at start: neither instance is provably dead yet (no owner, not a gate).
        assert_eq!(instance_pods(&c, "run-dead0001").len(), 2);
        assert_eq!(instance_pods(&c, "run-live0001").len(), 2);
        // This instance's own leftover (a probe id no probe in flight owns).
        c.store
            .create(Kind::Pod, probe_pod("fp-orphan-t", &r.instance, "orphan-1"))
            .expect("orphan");

        // The dead instance: its Lease unchanged for 15 s → pods, Service, Lease deleted
        // at the next reaper pass (every 5 s).
        assert!(
            eventually(Duration::from_secs(25), || instance_pods(
                &c,
                "run-dead0001"
            )
            .is_empty())
            .await,
            "dead instance's pods left: {:?}",
            instance_pods(&c, "run-dead0001")
        );
        let reaped = spawned.elapsed();
        assert!(
            reaped >= Duration::from_secs(15) && reaped <= Duration::from_secs(23),
            "dead instance reaped {reaped:?} after start (Lease 15 s, passes every 5 s)"
        );
        assert!(
            eventually(Duration::from_secs(2), || {
                c.store
                    .get(Kind::Lease, Some(NS), "firstpacket-run-dead0001")
                    .is_err()
                    && c.store
                        .get(Kind::Service, Some(NS), "fp-dead-1-svc")
                        .is_err()
            })
            .await,
            "dead instance's Lease or Service left"
        );

        // Its own leftover: at the first janitor pass, 30 s after the loop started.
        assert!(
            eventually(Duration::from_secs(40), || !instance_pods(&c, &r.instance)
                .contains(&"fp-orphan-t".to_string()))
            .await,
            "own leftover fp-orphan-t not deleted"
        );
        let janitor = r.ready_at.elapsed();
        assert!(
            janitor >= Duration::from_secs(29) && janitor <= Duration::from_secs(34),
            "own leftover deleted {janitor:?} after ready (janitor every 30 s)"
        );

        // The live instance: everything kept, 30 s on.
        assert_eq!(
            instance_pods(&c, "run-live0001"),
            ["fp-live-1-t", "fp-live-2-t"]
        );
        assert!(c
            .store
            .get(Kind::Lease, Some(NS), "firstpacket-run-live0001")
            .is_ok());
        // Meanwhile the run probed as usual.
        let page = probes_page().await;
        assert!(page["total"].as_u64().unwrap_or(0) >= 10, "{page:#}");
        r.assert_running("after the janitor passes");
        renew.abort();
    });
}

/// calico-node pod of `node` (the built-in calico-felix profile's selector).
fn agent_pod(name: &str, node: &str, image: &str) -> Value {
    json!({
        "metadata": { "name": name, "namespace": "kube-system",
            "labels": { "k8s-app": "calico-node" } },
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "containers": [{ "name": "calico-node", "image": image }],
        },
    })
}

/// Waits (≤ 5 s) until the scripted kubelet started `n` pods of `ns`. The kubelet
/// subscribes to the Store on its own task, which may run after pods created right after
/// [`Cluster::start`]: pods it has not started are touched again (a MODIFIED event).
async fn kubelet_runs(c: &Cluster, ns: &str, n: usize) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let started: BTreeSet<String> = lock(&c.kubelet.started)
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
        let waiting: Vec<String> = c
            .pods(Some(ns))
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .filter(|name| !started.contains(name))
            .collect();
        if waiting.is_empty() && started.len() >= n {
            return;
        }
        assert!(
            Instant::now() < end,
            "pods of {ns} not started: {waiting:?}"
        );
        for name in &waiting {
            let _ = c.store.modify(Kind::Pod, Some(ns), name, |p| {
                let touched = p["metadata"]["annotations"]["touched"]
                    .as_str()
                    .and_then(|t| t.parse::<u64>().ok())
                    .unwrap_or(0);
                p["metadata"]["annotations"]["touched"] = json!((touched + 1).to_string());
                Ok(())
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_node_that_turns_ready_or_whose_agent_restarts_or_rolls_is_probed_at_once_not_at_its_turn() {
    run(|| async {
        let c = Cluster::start(5, cluster::healthy(Duration::from_millis(50))).await;
        for node in &c.nodes {
            let name = format!("calico-node-{node}");
            c.store
                .create(
                    Kind::Pod,
                    agent_pod(&name, node, "docker.io/calico/node:v3.29.0"),
                )
                .expect("agent pod");
        }
        kubelet_runs(&c, "kube-system", 5).await;
        c.set_node_ready("node-5", false);
        let starts = Starts::record(&c.store);
        let t0 = Instant::now();
        // 3 s ± 20 %: after a scheduled probe starts, the next is ≥ 2.4 s away, so a
        // probe within 2 s of a change was started by the change.
        let _r = start_run(&c, &["--probe-interval", "3s"]).await;

        // Each change right after a scheduled probe started (one not caused by the
        // previous change: its second queued role goes at the next tick).
        let change = |what: &str| match what {
            "node-5 turns Ready" => c.set_node_ready("node-5", true),
            "node-2's agent restarts" => {
                c.store
                    .modify(Kind::Pod, Some("kube-system"), "calico-node-node-2", |p| {
                        p["status"]["containerStatuses"][0]["restartCount"] = json!(1);
                        Ok(())
                    })
                    .expect("restart");
            }
            _ => {
                // A DaemonSet rollout: a new pod with another image replaces the old.
                c.store
                    .create(
                        Kind::Pod,
                        agent_pod(
                            "calico-node-node-3-v2",
                            "node-3",
                            "docker.io/calico/node:v3.29.1",
                        ),
                    )
                    .expect("new agent pod");
                c.store
                    .delete(
                        Kind::Pod,
                        Some("kube-system"),
                        "calico-node-node-3",
                        Some(0),
                        None,
                    )
                    .expect("delete the old agent pod");
            }
        };
        let mut after = t0;
        let mut turned_ready = None;
        for (what, node, within) in [
            // The node watch: at once.
            ("node-5 turns Ready", "node-5", Duration::from_millis(1000)),
            // Agent pods are compared every second.
            (
                "node-2's agent restarts",
                "node-2",
                Duration::from_millis(2000),
            ),
            (
                "node-3's agent pod is replaced",
                "node-3",
                Duration::from_millis(2000),
            ),
        ] {
            let (tick, _) = starts.next_after(after, Duration::from_secs(5)).await;
            let changed = Instant::now();
            change(what);
            turned_ready.get_or_insert(changed);
            let (id, started) = starts.next_after(changed, Duration::from_secs(5)).await;
            let nodes = starts.nodes(&id).await;
            assert!(
                nodes.contains(node) && started - changed < within,
                "{what}: the next probe ({id} on {nodes:?}) started {:?} later (scheduled \
                 probe {tick} just before; want {node} within {within:?})",
                started - changed
            );
            after = started;
        }
        // node-5 was not probed while NotReady.
        let before = starts.before(turned_ready.expect("changed"));
        assert!(!before.is_empty());
        for (id, nodes) in before {
            assert!(
                !nodes.contains("node-5"),
                "{id} on {nodes:?} while node-5 was NotReady"
            );
        }
    });
}

/// Events of `reason` in namespace `default`.
fn events(c: &Cluster, reason: &str) -> Vec<Value> {
    c.store
        .list(Kind::Event, Some("default"))
        .0
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// Every probe from node-2 slow with the scripted 1.5 s, every other a success with
/// 100 ms; how many came from node-2 (≥ 3).
fn assert_only_node_2s_probes_are_slow(probes: &[Value]) -> usize {
    for p in probes {
        let ttfp = p["ttfp_seconds"].as_f64().expect("ttfp");
        if p["source"]["node"] == "node-2" {
            assert_eq!(p["result"], "slow", "{p:#}");
            assert_eq!(p["reason"], "ttfp_over_threshold", "{p:#}");
            assert!((ttfp - 1.5).abs() < 0.1, "TTFP {ttfp} vs scripted 1.5 s");
        } else {
            assert_eq!(p["result"], "success", "{p:#}");
            assert!((ttfp - 0.1).abs() < 0.05, "TTFP {ttfp} vs scripted 0.1 s");
        }
    }
    let from_slow = probes
        .iter()
        .filter(|p| p["source"]["node"] == "node-2")
        .count();
    assert!(from_slow >= 3, "{from_slow} probes from node-2");
    from_slow
}

/// One FirstPacketSlow Event (5 min rate limit), on the Node node-2 (name and UID),
/// counted in `firstpacket_node_events_total`; no FirstPacketFailed.
fn assert_one_slow_event_on_node_2(c: &Cluster, samples: &[Sample]) {
    let slow = events(c, "FirstPacketSlow");
    let on: Vec<&str> = slow
        .iter()
        .filter_map(|e| e["involvedObject"]["name"].as_str())
        .collect();
    assert_eq!(on, ["node-2"], "FirstPacketSlow Events: {slow:#?}");
    let node2 = c.store.get(Kind::Node, None, "node-2").expect("node-2");
    assert_eq!(slow[0]["involvedObject"]["kind"], "Node");
    assert_eq!(slow[0]["involvedObject"]["uid"], node2["metadata"]["uid"]);
    assert_eq!(slow[0]["type"], "Warning");
    assert!(events(c, "FirstPacketFailed").is_empty());
    assert_eq!(
        sum(
            samples,
            "firstpacket_node_events_total",
            &[("reason", "FirstPacketSlow")]
        ),
        1.0
    );
}

/// Per node as source: node-2's last TTFP the slow one and its `from_slow` slow probes;
/// the healthy nodes' last TTFP ~100 ms and no slow probe.
fn assert_per_node_series(samples: &[Sample], nodes: &[String], from_slow: usize) {
    for node in nodes {
        let last = sum(
            samples,
            "firstpacket_node_last_ttfp_seconds",
            &[("node", node), ("role", "source")],
        );
        let slow = sum(
            samples,
            "firstpacket_node_probes_total",
            &[("node", node), ("role", "source"), ("result", "slow")],
        );
        if node == "node-2" {
            assert!((last - 1.5).abs() < 0.1, "node-2 last TTFP {last}");
            assert_eq!(slow as usize, from_slow);
        } else {
            assert!(last > 0.0 && last < 0.2, "{node} last TTFP {last}");
            assert_eq!(slow, 0.0, "{node} slow as source");
        }
    }
}

#[test]
fn slow_nodes_get_slow_events_and_metrics_and_the_healthy_side_gets_none() {
    run(|| async {
        // Sources on node-2 see their first success 1.5 s after Ready, others 100 ms.
        let script: Script = Arc::new(|p: &PodView| Act::Run {
            ready_after: Duration::from_millis(20),
            ttfp: Some(Duration::from_millis(if p.node == "node-2" {
                1500
            } else {
                100
            })),
            outcome: Outcome::AsDialed,
        });
        let c = Cluster::start(4, script).await;
        let flags = [
            "--probe-interval",
            "700ms",
            "--slow-threshold",
            "1s",
            "--concurrency",
            "4",
        ];
        let r = start_run(&c, &flags).await;
        // 20 probes: every slow probe's blame decided (a healthy node is cleared within
        // 3 laps; an undecided blame falls back to both nodes after 16 probes).
        let end = Instant::now() + Duration::from_secs(40);
        loop {
            let total = probes_page().await["total"].as_u64().unwrap_or(0);
            if total >= 20 && !events(&c, "FirstPacketSlow").is_empty() {
                break;
            }
            assert!(
                Instant::now() < end,
                "{total} probes, Events {:?}",
                events(&c, "FirstPacketSlow")
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // Let the last probes' Events go out.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (page, samples) = consistent_scrape().await;
        let probes = page["probes"].as_array().expect("probes").clone();
        let total = page["total"].as_u64().expect("total");
        let from_slow = assert_only_node_2s_probes_are_slow(&probes);
        assert_one_slow_event_on_node_2(&c, &samples);
        assert_metrics_agree_with_records(&probes, total, &samples, &c.nodes);
        assert_per_node_series(&samples, &c.nodes, from_slow);
        r.assert_running("after the slow probes");
    });
}

#[test]
fn an_api_outage_mid_run_does_not_end_the_run_and_probing_resumes_after_it() {
    run(|| async {
        let mut c = Cluster::start(3, cluster::healthy(Duration::from_millis(100))).await;
        let starts = Starts::record(&c.store);
        let r = start_run(&c, &[]).await;
        wait_records(2, Duration::from_secs(10)).await;

        // 4 s without an API server.
        c.server.stop().await;
        let stopped = Instant::now();
        tokio::time::sleep(Duration::from_secs(4)).await;
        r.assert_running("during the API outage");
        assert_eq!(get("/livez").await, Some((200, "ok\n".to_string())));
        assert_eq!(get("/readyz").await.map(|r| r.0), Some(200));
        c.server.start().expect("API server back");
        let restarted = Instant::now();
        let outage = restarted - stopped;

        // Probes start and succeed again.
        let (id, _) = starts.next_after(restarted, Duration::from_secs(5)).await;
        let end = Instant::now() + Duration::from_secs(10);
        let page = loop {
            let page = probes_page().await;
            let done = page["probes"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["id"] == id.as_str()));
            if done {
                break page;
            }
            assert!(Instant::now() < end, "probe {id} not recorded: {page:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let rec = page["probes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["id"] == id.as_str()))
            .expect("record");
        assert_eq!(rec["result"], "success", "{rec:#}");
        // An outage is not a network failure: no failed or slow probe.
        for p in page["probes"].as_array().expect("probes") {
            assert!(
                p["result"] == "success" || p["result"] == "inconclusive",
                "{p:#}"
            );
        }
        // One outage, about as long as the server was down.
        let m = metrics().await;
        assert_eq!(sum(&m, "firstpacket_api_outages_total", &[]), 1.0);
        let secs = sum(&m, "firstpacket_api_outage_seconds_total", &[]);
        let want = outage.as_secs_f64();
        assert!(
            secs > want - 1.0 && secs < want + 1.5,
            "outage seconds {secs} vs {want} down"
        );
        r.assert_running("after the API outage");
    });
}

/// `prober run --kinds policy,policy_change` (issue 32): the policy kinds in the run loop,
/// counted and timed under their own `kind` label (probes, TTFP histogram, baseline),
/// with the policies of each probe gone once it ended.
#[test]
fn the_run_loop_probes_the_policy_kinds_under_their_own_kind_label() {
    run(|| async {
        let c = Cluster::start(2, Arc::new(|_: &PodView| ok(100))).await;
        let _r = start_run(&c, &["--kinds", "policy,policy_change"]).await;
        let succeeded = |page: &Value| -> BTreeSet<String> {
            page["probes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["result"] == "success")
                .filter_map(|p| p["kind"].as_str().map(str::to_owned))
                .collect()
        };
        let end = Instant::now() + Duration::from_secs(60);
        let page = loop {
            let page = probes_page().await;
            if succeeded(&page).len() == 2 {
                break page;
            }
            assert!(Instant::now() < end, "no success of both kinds: {page:#}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let samples = metrics().await;
        for kind in ["policy", "policy_change"] {
            assert!(
                sum(
                    &samples,
                    "firstpacket_probes_total",
                    &[("kind", kind), ("result", "success")]
                ) >= 1.0,
                "{kind} not counted: {page:#}"
            );
            assert!(
                sum(
                    &samples,
                    "firstpacket_ttfp_seconds_count",
                    &[("kind", kind)]
                ) >= 1.0,
                "{kind} has no TTFP histogram"
            );
            assert!(
                samples
                    .iter()
                    .any(|(n, l, _)| n == "firstpacket_baseline_samples"
                        && l.get("kind").map(String::as_str) == Some(kind)),
                "{kind} has no baseline series"
            );
        }
        // The policies of the ended probes are gone: at most the in-flight probe's
        // (its isolate and egress, or its isolate and allow) remain.
        let ids: BTreeSet<String> = c
            .store
            .list(Kind::NetworkPolicy, Some(NS))
            .0
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .filter_map(|n| {
                n.strip_prefix("fp-")?
                    .rsplit_once('-')
                    .map(|(id, _)| id.to_owned())
            })
            .collect();
        assert!(
            ids.len() <= 1,
            "policies of {} probes left: {ids:?}",
            ids.len()
        );
    });
}
