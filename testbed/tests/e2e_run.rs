//! End-to-end test of `prober run` (continuous mode) on the testbed, out-of-cluster via
//! `testbed exec`: the admin server's `/metrics` and `/api/v1/probes` agree with each
//! other (TTFP histogram count = records with a TTFP up to the `total` read with them;
//! per-node counters = the records), every node is source and target, the recorded
//! TTFPs match the testbed's ground truth, the status page has a matrix cell for every
//! pair probed, and SIGTERM ends the run with exit 0 and no probe pod left.
//!
//! Needs root and the workspace binaries (`cargo build --workspace --bins`).

mod common;

use common::{assert_ttfp_near_truth, curl, started_unix, wait_ready, Testbed, SERIAL};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Healthy dataplane with a visible delay (endpoints programmed after 300 ms).
const FAULT: &str = "rules:\n  - nodes: {all: true}\n    program_delay: 300ms\n";

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

/// `/api/v1/probes`, `/metrics`, `/api/v1/probes` in one exec (the same second); retried
/// until both probe pages have the same `total`, so the metrics were read between two
/// identical states.
fn consistent_scrape(tb: &Testbed, base: &str) -> (Value, Vec<Sample>) {
    let script = format!(
        "curl -sf -m 5 {base}/api/v1/probes && echo && echo '=====' && curl -sf -m 5 {base}/metrics && echo '=====' && curl -sf -m 5 {base}/api/v1/probes"
    );
    for _ in 0..20 {
        let out = tb.exec(&["bash", "-c", &script]);
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let parts: Vec<&str> = text.split("=====").collect();
            if parts.len() == 3 {
                let a: Value = serde_json::from_str(parts[0].trim()).expect("probes JSON");
                let b: Value = serde_json::from_str(parts[2].trim()).expect("probes JSON");
                if a["total"] == b["total"] {
                    return (a, parse_metrics(parts[1]));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("no consistent scrape of {base} in 20 tries");
}

/// [`consistent_scrape`] from another pod, as Prometheus scrapes: one `curl` run in a
/// pod of namespace `default` (image `curlimages/curl`, which the testbed kubelet maps
/// to the host's curl in the pod's network namespace, see [`bin_dir_with_curl`]) fetches
/// `/api/v1/probes`, `/metrics`, `/api/v1/probes`; its log is the three bodies. Retried
/// (a new pod each time) until both probe pages have the same `total`.
fn consistent_scrape_from_pod(tb: &Testbed, base: &str) -> (Value, Vec<Sample>) {
    const SEP: &str = "=====";
    for attempt in 0..20 {
        let name = format!("scrape-{}-{attempt}", common::rand_suffix() % 100_000);
        let manifest = tb.state.join(format!("{name}.yaml"));
        std::fs::write(
            &manifest,
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: curl\n    image: curlimages/curl:8.11.1\n    args: [-sf, -m, '5', -w, '\\n{SEP}\\n', {base}/api/v1/probes, {base}/metrics, {base}/api/v1/probes]\n"
            ),
        )
        .expect("manifest");
        tb.kubectl(&["apply", "-f", manifest.to_str().expect("path")]);
        let phase = tb.kubectl_until(
            &[
                "get",
                "pod",
                "-n",
                "default",
                &name,
                "-o",
                "jsonpath={.status.phase}",
            ],
            Duration::from_secs(30),
            |p| p == "Succeeded" || p == "Failed",
        );
        let logs = tb.kubectl(&["logs", "-n", "default", &name]);
        tb.kubectl(&["delete", "pod", "-n", "default", &name, "--wait=false"]);
        let parts: Vec<&str> = logs.split(SEP).collect();
        if phase == "Succeeded" && parts.len() == 4 {
            let a: Value = serde_json::from_str(parts[0].trim()).expect("probes JSON");
            let b: Value = serde_json::from_str(parts[2].trim()).expect("probes JSON");
            if a["total"] == b["total"] {
                return (a, parse_metrics(parts[1]));
            }
        } else {
            eprintln!("scrape pod {name}: {phase}, log {logs:?}");
        }
    }
    panic!("no consistent scrape of {base} from a pod in 20 tries");
}

/// A `--bin-dir` for `testbed up`: the workspace's image binaries plus `curl` (the
/// host's), so a pod with image `curlimages/curl` runs curl in its own network
/// namespace. Removed when the returned guard drops.
fn bin_dir_with_curl(tb_name: &str) -> common::BinDir {
    let curl = ["/usr/bin/curl", "/bin/curl"]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
        .expect("curl (apt-get install curl; scripts/setup.sh installs it)");
    common::BinDir::new(tb_name, &[("curl", curl)])
}

/// The checks of a consistent scrape: TTFP histogram count and sum = the records with a
/// TTFP, probes_total = `total`, per-node counters and last-TTFP gauges = the records.
fn assert_metrics_agree_with_records(
    probes: &[Value],
    total: u64,
    samples: &[Sample],
    nodes: &BTreeSet<String>,
) {
    let samples = samples.to_vec();
    // The histogram count equals the records with a TTFP, per kind and overall.
    let with_ttfp = probes.iter().filter(|p| p["ttfp_seconds"].is_f64()).count();
    assert_eq!(
        sum(&samples, "firstpacket_ttfp_seconds_count", &[]) as usize,
        with_ttfp,
        "TTFP histogram count vs records with a TTFP (total {total})"
    );
    assert_eq!(
        sum(
            &samples,
            "firstpacket_ttfp_seconds_count",
            &[("kind", "cross_node")]
        ) as usize,
        with_ttfp
    );
    let ttfp_sum: f64 = probes
        .iter()
        .filter_map(|p| p["ttfp_seconds"].as_f64())
        .sum();
    assert!(
        (sum(&samples, "firstpacket_ttfp_seconds_sum", &[]) - ttfp_sum).abs() < 1e-6,
        "TTFP histogram sum vs records"
    );
    assert_eq!(sum(&samples, "firstpacket_probes_total", &[]) as u64, total);
    // Per-node counters agree with the records.
    for node in nodes {
        for (role, field) in [("source", "source"), ("target", "target")] {
            for result in ["success", "slow", "failed", "inconclusive"] {
                let want = probes
                    .iter()
                    .filter(|p| p[field]["node"] == node.as_str() && p["result"] == result)
                    .count();
                let got = sum(
                    &samples,
                    "firstpacket_node_probes_total",
                    &[("node", node), ("role", role), ("result", result)],
                );
                assert_eq!(got as usize, want, "{node} {role} {result}");
            }
        }
        let last = probes
            .iter()
            .rev()
            .find(|p| p["source"]["node"] == node.as_str() && p["ttfp_seconds"].is_f64())
            .and_then(|p| p["ttfp_seconds"].as_f64());
        if let Some(last) = last {
            let got = sum(
                &samples,
                "firstpacket_node_last_ttfp_seconds",
                &[("node", node), ("role", "source")],
            );
            assert!(
                (got - last).abs() < 1e-9,
                "{node} last TTFP {got} vs {last}"
            );
        }
    }
}

fn spawn_run(tb: &Testbed, addr: &str, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    tb.cmd()
        .args([
            "exec",
            "--",
            "prober",
            "run",
            "--probe-interval",
            "3s",
            "--hold",
            "2s",
            "--give-up",
            "20s",
            "--admin-addr",
            addr,
            "--log-format",
            "json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn prober run")
}

#[test]
fn run_metrics_agree_with_records_cover_every_node_and_sigterm_cleans_up() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("run", 4, FAULT, &[]);
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let base = format!("http://{addr}");
    let log = tb.state.join("prober-run.log");
    let mut run = spawn_run(&tb, &addr, &log);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    // Ready once the pod watch listed the (no) probe pods.
    wait_ready(&tb, &base, &mut run, &logs);
    assert_eq!(curl(&tb, &format!("{base}/livez")).as_deref(), Some("ok\n"));

    // Probe until every node was source and target (two laps at most), ≥ 8 records.
    let nodes: BTreeSet<String> = (1..=4).map(|i| format!("node-{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(150);
    let (page, samples) = loop {
        let (page, samples) = consistent_scrape(&tb, &base);
        let probes = page["probes"].as_array().cloned().unwrap_or_default();
        let conclusive: Vec<&Value> = probes
            .iter()
            .filter(|p| p["result"] != "inconclusive")
            .collect();
        let src: BTreeSet<String> = conclusive
            .iter()
            .filter_map(|p| p["source"]["node"].as_str().map(str::to_owned))
            .collect();
        let dst: BTreeSet<String> = conclusive
            .iter()
            .filter_map(|p| p["target"]["node"].as_str().map(str::to_owned))
            .collect();
        if src == nodes && dst == nodes && probes.len() >= 8 {
            break (page, samples);
        }
        assert!(
            Instant::now() < deadline,
            "not every node covered in time: sources {src:?}, targets {dst:?}, {} records\n{}",
            probes.len(),
            logs()
        );
        std::thread::sleep(Duration::from_secs(3));
    };
    let probes = page["probes"].as_array().expect("probes").clone();
    let total = page["total"].as_u64().expect("total");
    assert_eq!(
        probes.len() as u64,
        total,
        "ring holds every record this early"
    );

    assert_metrics_agree_with_records(&probes, total, &samples, &nodes);
    // Pre-initialised and always-present series.
    assert!(samples
        .iter()
        .any(|(n, l, _)| n == "firstpacket_probes_total"
            && l.get("reason").map(String::as_str) == Some("wrong_peer")));
    assert_eq!(sum(&samples, "firstpacket_build_info", &[]), 1.0);
    assert_eq!(sum(&samples, "firstpacket_eligible_nodes", &[]), 4.0);
    assert!(samples
        .iter()
        .any(|(n, _, _)| n == "firstpacket_probes_in_flight"));
    assert!(
        !samples
            .iter()
            .any(|(_, l, _)| l.contains_key("pod") || l.contains_key("source")),
        "no pod or pair labels"
    );
    let recent = sum(
        &samples,
        "firstpacket_state_entries",
        &[("structure", "recent_records")],
    );
    assert!(recent as u64 >= total.saturating_sub(2) && recent as u64 <= 500);

    // TTFP near the testbed's truth for every success.
    let truth = tb.truth();
    let mut checked = 0;
    for p in probes.iter().filter(|p| p["result"] == "success") {
        assert_ttfp_near_truth(&truth, p, "prober run");
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} successes:\n{page:#}");

    // The status page: a matrix cell for every pair probed, self-contained.
    let html = curl(&tb, &format!("{base}/")).expect("status page");
    let page2: Value =
        serde_json::from_str(&curl(&tb, &format!("{base}/api/v1/probes")).expect("probes"))
            .expect("json");
    for p in page2["probes"].as_array().expect("probes").iter().take(400) {
        let cell = format!(
            "data-source=\"{}\" data-target=\"{}\"",
            p["source"]["node"].as_str().unwrap_or("?"),
            p["target"]["node"].as_str().unwrap_or("?")
        );
        assert!(html.contains(&cell), "no matrix cell {cell}");
    }
    assert!(html.contains("<svg"), "no TTFP chart");
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));

    // A leftover of this instance that no probe in flight owns (as after a delete that
    // failed) is removed in-run.
    let instance = page["info"]["instance"]
        .as_str()
        .expect("instance")
        .to_string();
    let orphan = tb.state.join("orphan.yaml");
    std::fs::write(
        &orphan,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: fp-orphan-t\n  namespace: firstpacket\n  labels: {{app.kubernetes.io/name: firstpacket, firstpacket.io/instance: {instance}, firstpacket.io/probe-id: orphan-1}}\nspec:\n  nodeName: node-1\n  containers:\n  - name: t\n    image: ghcr.io/firstpacket/target-server:0.1.0\n    args: [serve]\n"
        ),
    )
    .expect("manifest");
    tb.kubectl(&["apply", "-f", orphan.to_str().expect("path")]);
    let deadline = Instant::now() + Duration::from_secs(45);
    while tb.probe_pods().iter().any(|p| p == "pod/fp-orphan-t") {
        assert!(
            Instant::now() < deadline,
            "leftover fp-orphan-t not removed within 45s\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }

    // SIGTERM: exit 0 within the grace period, no probe pod left.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let stop = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().expect("wait") {
            break s;
        }
        assert!(
            stop.elapsed() < Duration::from_secs(30),
            "prober run still running 30s after SIGTERM\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status.code(), Some(0), "exit after SIGTERM\n{}", logs());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = tb.probe_pods();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "probe pods left: {left:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every stderr line is one JSON object; one `probe done` per probe, `reason` always
    // present.
    let mut done = 0u64;
    for line in logs().lines().filter(|l| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_ne!(v["fields"]["message"], "probe finished", "{line}");
        if v["fields"]["message"] == "probe done" {
            done += 1;
            let f = &v["fields"];
            assert!(
                f["reason"].is_string() && f["probe_id"].is_string(),
                "{line}"
            );
            assert!(f["result"] != "success" || f["reason"] == "none", "{line}");
        }
    }
    assert!(done >= total, "{done} probe done events for {total} probes");
}

/// `restartCount` of node's calico-node pod (Σ over containers), `None` when absent.
fn agent_restarts(tb: &Testbed, node: &str) -> Option<(String, i64)> {
    let out = tb.exec(&[
        "kubectl",
        "get",
        "pods",
        "-A",
        "-l",
        "k8s-app=calico-node",
        "-o",
        "json",
        "--request-timeout=5s",
    ]);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["items"].as_array()?.iter().find_map(|p| {
        (p["spec"]["nodeName"] == node).then(|| {
            let uid = p["metadata"]["uid"].as_str().unwrap_or("").to_string();
            let n = p["status"]["containerStatuses"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                        .sum()
                })
                .unwrap_or(0);
            (uid, n)
        })
    })
}

/// Whether node is source or target of a record started in [from, from + within].
fn probed_within(probes: &[Value], node: &str, from: f64, within: f64) -> bool {
    probes.iter().any(|p| {
        (p["source"]["node"] == node || p["target"]["node"] == node) && {
            let s = started_unix(p);
            s >= from - 0.5 && s <= from + within
        }
    })
}

#[test]
fn a_node_that_turns_ready_or_whose_agent_restarts_or_rolls_is_probed_within_two_intervals() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up("runtrig", 6, FAULT, &[]);
    let port = 20_000 + ((std::process::id() + 7) % 20_000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let base = format!("http://{addr}");
    let log = tb.state.join("prober-run.log");
    let mut run = spawn_run(&tb, &addr, &log);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let interval = 3.0;
    let start = Instant::now();
    while curl(&tb, &format!("{base}/readyz")).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "/readyz\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(8));

    // node-3 goes NotReady and comes back: probed within two intervals of node_ready.
    let status = tb
        .cmd()
        .args(["node", "stop", "node-3"])
        .status()
        .expect("stop");
    assert!(status.success());
    // The prober sees nodes through the API: wait until the Node is NotReady there (at
    // once on the built-in control plane, after the node-lifecycle grace on the real one).
    let jsonpath = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
    let seen = tb.kubectl_until(
        &["get", "node", "node-3", "-o", jsonpath],
        common::node_not_ready_within(),
        |o| o.trim() != "True",
    );
    assert_ne!(seen.trim(), "True", "node-3 never NotReady in the API");
    std::thread::sleep(Duration::from_secs(8));
    let status = tb
        .cmd()
        .args(["node", "start", "node-3"])
        .status()
        .expect("start");
    assert!(status.success());
    let ready_at = tb
        .truth()
        .iter()
        .filter(|e| {
            e.node.as_deref() == Some("node-3") && e.event == testbed::truth::TruthKind::NodeReady
        })
        .map(|e| e.t)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(ready_at.is_finite(), "no node_ready for node-3");

    // Agent restarts on node-3 only, every 15 s.
    let fault = tb.state.join("restarts.yaml");
    std::fs::write(
        &fault,
        format!("{FAULT}  - nodes: {{names: [node-3]}}\n    agent: {{restarts: {{every: 15s}}}}\n"),
    )
    .expect("fault");
    let status = tb
        .cmd()
        .args(["fault", "set"])
        .arg(&fault)
        .status()
        .expect("fault set");
    assert!(status.success());
    let mut restarts = Vec::new();
    let mut last = agent_restarts(&tb, "node-3");
    let watch_until = Instant::now() + Duration::from_secs(40);
    while Instant::now() < watch_until {
        std::thread::sleep(Duration::from_millis(500));
        let now = agent_restarts(&tb, "node-3");
        if now.is_some() && now != last && last.is_some() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_secs_f64();
            restarts.push(t);
        }
        if now.is_some() {
            last = now;
        }
    }
    assert!(!restarts.is_empty(), "no agent restart seen on node-3");

    // Then node-3's agent pod rolled to a new image, as a DaemonSet rollout replaces it
    // (restarts off again first).
    let plain = tb.state.join("plain.yaml");
    std::fs::write(&plain, FAULT).expect("fault");
    let status = tb
        .cmd()
        .args(["fault", "set"])
        .arg(&plain)
        .status()
        .expect("fault set");
    assert!(status.success());
    std::thread::sleep(Duration::from_secs(2));
    let roll_started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let out = tb
        .cmd()
        .args(["agent", "roll", "node-3", "--image", "calico/node:v3.99.0"])
        .output()
        .expect("agent roll");
    assert!(out.status.success(), "agent roll: {out:?}");
    let rolled_at = tb
        .truth()
        .iter()
        .filter(|e| {
            e.node.as_deref() == Some("node-3") && e.event == testbed::truth::TruthKind::AgentRolled
        })
        .map(|e| e.t)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(rolled_at.is_finite(), "no agent_rolled for node-3");
    // Let the last triggered probe start.
    std::thread::sleep(Duration::from_secs(8));
    let page: Value =
        serde_json::from_str(&curl(&tb, &format!("{base}/api/v1/probes")).expect("probes"))
            .expect("json");
    let probes = page["probes"].as_array().expect("probes").clone();
    // The probes the prober says it started because of a change, by id → trigger.
    let triggered: BTreeMap<String, String> = logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "change-triggered probe")
        .filter_map(|v| {
            Some((
                v["fields"]["probe_id"].as_str()?.to_string(),
                v["fields"]["trigger"].as_str()?.to_string(),
            ))
        })
        .collect();
    let by_trigger = |what: &str| -> Vec<Value> {
        probes
            .iter()
            .filter(|p| {
                p["id"]
                    .as_str()
                    .and_then(|id| triggered.get(id))
                    .is_some_and(|t| t.contains("node-3") && t.contains(what))
            })
            .cloned()
            .collect()
    };
    // On the real control plane the Node is Ready again before the node-lifecycle
    // controller lifts its unreachable taint, so the prober's trigger names the last
    // obstacle that went ("became eligible") rather than "became Ready".
    let mut after_ready = by_trigger("became Ready");
    after_ready.extend(by_trigger("became eligible"));
    assert!(
        probed_within(&after_ready, "node-3", ready_at, 2.0 * interval),
        "no change-triggered probe of node-3 within 2 intervals of node_ready at {ready_at}: {triggered:?}\n{}",
        logs()
    );
    let after_agent = by_trigger("agent");
    assert!(
        !after_agent.is_empty(),
        "no agent-triggered probe of node-3: {triggered:?}"
    );
    assert!(
        probed_within(&probes, "node-3", ready_at, 2.0 * interval),
        "node-3 not probed within 2 intervals of turning Ready at {ready_at}\n{}",
        logs()
    );
    for t in &restarts {
        // The restart was seen by polling (≤ 0.5 s + one kubectl late).
        assert!(
            probed_within(&after_agent, "node-3", t - 1.5, 2.0 * interval + 1.5),
            "node-3 not probed within 2 intervals of the agent restart at {t}\n{}",
            logs()
        );
    }
    // The roll: a probe of node-3 the prober started for its replaced agent pod, from
    // the roll's start (the old pod's deletion) to two intervals after the new pod was
    // Running and Ready (`agent_rolled` in the truth log).
    let after_roll: Vec<Value> = after_agent
        .iter()
        .filter(|p| started_unix(p) >= roll_started)
        .cloned()
        .collect();
    assert!(
        probed_within(
            &after_roll,
            "node-3",
            roll_started,
            rolled_at - roll_started + 2.0 * interval
        ),
        "node-3 not probed within 2 intervals of its agent pod's roll ({roll_started}..{rolled_at}): {triggered:?}\n{}",
        logs()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let stop = Instant::now();
    while run.try_wait().expect("wait").is_none() {
        assert!(
            stop.elapsed() < Duration::from_secs(30),
            "still running\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// docs/scenarios.md S2 in short: new endpoints on the two `os=debian13` nodes wait 6–8 s
/// behind a slow dataplane apply (Felix apply time ≥ 1 s there).
const SLOW_NODES_FAULT: &str = "rules:
  - nodes: {all: true}
    program_delay: {uniform: [200ms, 600ms]}
  - nodes: {labels: {os: debian13}}
    program_delay: {uniform: [6s, 8s]}
    agent: {apply_time_floor: 1s}
";

#[test]
fn slow_nodes_get_slow_events_and_metrics_and_the_healthy_side_gets_none() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tb = Testbed::up(
        "runslow",
        4,
        SLOW_NODES_FAULT,
        &["--node-labels", "node-2=os=debian13,node-3=os=debian13"],
    );
    let port = 20_000 + ((std::process::id() + 13) % 20_000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let base = format!("http://{addr}");
    let log = tb.state.join("prober-run.log");
    let mut run = spawn_run(&tb, &addr, &log);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let slow_nodes = ["node-2", "node-3"];
    let touches_slow = |p: &Value| {
        slow_nodes
            .iter()
            .any(|n| p["source"]["node"] == *n || p["target"]["node"] == *n)
    };
    let events = || -> Vec<String> {
        let out = tb.kubectl(&["get", "events", "-n", "default", "-o", "json"]);
        let v: Value = serde_json::from_str(&out).expect("events JSON");
        v["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|e| e["reason"] == "FirstPacketSlow")
                    .filter_map(|e| e["involvedObject"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Within 10 probes touching the slow nodes: their last TTFP > 5 s and Events on both;
    // then on until 10 such probes, for Events on the healthy side to show up if wrong.
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut met = false;
    let (page, samples, on) = loop {
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            run.try_wait().expect("wait").is_none(),
            "prober exited\n{}",
            logs()
        );
        let Some(text) = curl(&tb, &format!("{base}/api/v1/probes")) else {
            continue;
        };
        let page: Value = serde_json::from_str(&text).expect("json");
        let probes = page["probes"].as_array().cloned().unwrap_or_default();
        let touching = probes.iter().filter(|p| touches_slow(p)).count();
        let samples = parse_metrics(&curl(&tb, &format!("{base}/metrics")).unwrap_or_default());
        let last = |n: &str| {
            ["source", "target"]
                .iter()
                .map(|r| {
                    sum(
                        &samples,
                        "firstpacket_node_last_ttfp_seconds",
                        &[("node", n), ("role", r)],
                    )
                })
                .fold(0.0, f64::max)
        };
        let on: BTreeSet<String> = events().into_iter().collect();
        let now_met = slow_nodes.iter().all(|n| last(n) > 5.0 && on.contains(*n));
        assert!(
            met || !now_met || touching <= 10,
            "needed {touching} probes touching the slow nodes (> 10) for TTFP and Events"
        );
        met |= now_met;
        if met && touching >= 10 {
            break (page, samples, on);
        }
        assert!(
            Instant::now() < deadline && (met || touching <= 10),
            "after {touching} probes touching node-2/node-3: last TTFP node-2 {} node-3 {}, Events on {on:?}\n{}",
            last("node-2"),
            last("node-3"),
            logs()
        );
    };
    // No Event on a node that only met them as the healthy side.
    assert!(
        on.iter().all(|n| slow_nodes.contains(&n.as_str())),
        "FirstPacketSlow Events on healthy nodes: {on:?}"
    );
    assert!(
        sum(
            &samples,
            "firstpacket_node_events_total",
            &[("reason", "FirstPacketSlow")]
        ) >= 2.0
    );
    // Slow probes name the slow nodes' Felix apply time, on the status page too.
    let probes = page["probes"].as_array().expect("probes");
    let with_suspect: Vec<&Value> = probes
        .iter()
        .filter(|p| p["result"] == "slow")
        .filter(|p| {
            p["suspects"].as_array().is_some_and(|s| {
                s.iter().any(|s| {
                    s["signal"] == "dataplane_apply_slow"
                        && slow_nodes.contains(&s["node"].as_str().unwrap_or(""))
                })
            })
        })
        .collect();
    assert!(
        !with_suspect.is_empty(),
        "no slow probe with a dataplane_apply_slow suspect: {page:#}"
    );
    let html = curl(&tb, &format!("{base}/")).expect("status page");
    assert!(
        html.contains("dataplane_apply_slow"),
        "status page lacks the suspects"
    );
    for p in &with_suspect {
        assert!(
            html.contains(p["id"].as_str().unwrap_or("?")),
            "{} not listed",
            p["id"]
        );
    }
    // Screenshot of the status page, kept with the test output when chromium exists.
    if std::path::Path::new("/usr/bin/chromium").exists() {
        let png = std::env::temp_dir().join("firstpacket-status-slow-nodes.png");
        let profile = tb.state.join("chromium-profile");
        let out = tb.exec(&[
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            &format!("--user-data-dir={}", profile.display()),
            "--window-size=1200,1100",
            &format!("--screenshot={}", png.display()),
            &format!("{base}/"),
        ]);
        assert!(out.status.success(), "chromium screenshot failed");
        assert!(png.metadata().map(|m| m.len() > 1000).unwrap_or(false));
        eprintln!("status page screenshot: {}", png.display());
        let dom = tb.exec(&[
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            &format!("{base}/"),
        ]);
        let dom = String::from_utf8_lossy(&dom.stdout);
        let pairs: BTreeSet<(String, String)> = probes
            .iter()
            .map(|p| {
                (
                    p["source"]["node"].as_str().unwrap_or("?").to_string(),
                    p["target"]["node"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        for (s, t) in pairs {
            assert!(
                dom.contains(&format!("data-source=\"{s}\" data-target=\"{t}\"")),
                "rendered DOM has no cell {s} → {t}"
            );
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let stop = Instant::now();
    while run.try_wait().expect("wait").is_none() {
        assert!(
            stop.elapsed() < Duration::from_secs(30),
            "still running\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// ServiceAccount `firstpacket/prober` with the verbs README's "RBAC of `prober run`"
/// lists (cluster-wide here for brevity).
const PROBER_DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: prober, namespace: firstpacket}
spec:
  replicas: 1
  selector: {matchLabels: {app: fp-prober}}
  template:
    metadata: {labels: {app: fp-prober}}
    spec:
      terminationGracePeriodSeconds: 30
      serviceAccountName: firstpacket
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: prober
        image: ghcr.io/firstpacket/prober:0.1.0
        args: [run, --probe-interval, 3s, --hold, 2s, --give-up, 20s, --log-format, json]
        env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
        readinessProbe: {httpGet: {path: /readyz, port: 9090}, periodSeconds: 1}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {drop: [ALL]}
";

/// The pid of the container process whose environment has `POD_UID=uid` (the testbed
/// runs containers as local processes).
fn container_pid(uid: &str) -> Option<i32> {
    let want = format!("POD_UID={uid}");
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if comm.trim() != "prober" {
            return None;
        }
        let env = std::fs::read(e.path().join("environ")).ok()?;
        env.split(|b| *b == 0)
            .any(|kv| kv == want.as_bytes())
            .then_some(pid)
    })
}

fn json(tb: &Testbed, args: &[&str]) -> Value {
    serde_json::from_str(&tb.kubectl(args)).expect("kubectl JSON")
}

/// Probe pods (`metadata`) in the namespace.
fn probe_pod_metas(tb: &Testbed) -> Vec<Value> {
    json(
        tb,
        &[
            "get",
            "pods",
            "-n",
            "firstpacket",
            "-l",
            "app.kubernetes.io/name=firstpacket",
            "-o",
            "json",
        ],
    )["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|p| p["metadata"].clone())
        .collect()
}

fn restart_count(tb: &Testbed, pod: &str) -> (i64, Option<i64>) {
    let p = json(tb, &["get", "pod", "-n", "firstpacket", pod, "-o", "json"]);
    let cs = &p["status"]["containerStatuses"][0];
    (
        cs["restartCount"].as_i64().unwrap_or(0),
        cs["lastState"]["terminated"]["exitCode"].as_i64(),
    )
}

#[test]
fn in_cluster_deployment_owns_its_probe_pods_exits_0_on_sigterm_and_cleans_up_after_kill_9() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let bin_dir = bin_dir_with_curl("runpod");
    let tb = Testbed::up("runpod", 4, FAULT, &["--bin-dir", bin_dir.arg()]);
    // The probe namespace (Pod Security `restricted`) and the prober's RBAC as a user
    // applies them: `kubectl apply -f manifests/base/namespace.yaml -f
    // manifests/base/rbac.yaml` (not the base's own Deployment: this test runs its own).
    // A real API server authorises the pod's ServiceAccount by exactly that RBAC (the
    // built-in one allows everything).
    if common::on_real_control_plane() {
        tb.kubectl(&[
            "apply",
            "-f",
            common::repo_file("manifests/base/namespace.yaml")
                .to_str()
                .expect("path"),
            "-f",
            common::repo_file("manifests/base/rbac.yaml")
                .to_str()
                .expect("path"),
        ]);
    } else {
        // The built-in API server has no RBAC types: the namespace and the
        // ServiceAccount only.
        tb.kubectl(&[
            "apply",
            "-f",
            common::repo_file("manifests/base/namespace.yaml")
                .to_str()
                .expect("path"),
        ]);
        let sa = tb.state.join("serviceaccount.yaml");
        std::fs::write(
            &sa,
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: firstpacket, namespace: firstpacket}\n",
        )
        .expect("manifest");
        tb.kubectl(&["apply", "-f", sa.to_str().expect("path")]);
    }
    let deployment = PROBER_DEPLOYMENT.to_string();
    let manifest = tb.state.join("prober-deployment.yaml");
    std::fs::write(&manifest, deployment).expect("manifest");
    tb.kubectl(&["apply", "-f", manifest.to_str().expect("path")]);

    // The prober pod: Ready (its /readyz) with an IP.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (pod, uid, ip) = loop {
        let list = json(
            &tb,
            &[
                "get",
                "pods",
                "-n",
                "firstpacket",
                "-l",
                "app=fp-prober",
                "-o",
                "json",
            ],
        );
        let ready = list["items"].as_array().and_then(|a| {
            a.iter().find(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
        });
        if let Some(p) = ready {
            break (
                p["metadata"]["name"].as_str().expect("name").to_string(),
                p["metadata"]["uid"].as_str().expect("uid").to_string(),
                p["status"]["podIP"].as_str().expect("ip").to_string(),
            );
        }
        assert!(
            Instant::now() < deadline,
            "prober pod never Ready: {list:#}"
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    let base = format!("http://{ip}:9090");
    let logs = || {
        let out = tb.exec(&["kubectl", "logs", "-n", "firstpacket", &pod]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // Metrics agree with the records; every node source and target.
    let nodes: BTreeSet<String> = (1..=4).map(|i| format!("node-{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let (page, samples) = consistent_scrape_from_pod(&tb, &base);
        let probes = page["probes"].as_array().cloned().unwrap_or_default();
        let src: BTreeSet<String> = probes
            .iter()
            .filter_map(|p| p["source"]["node"].as_str().map(str::to_owned))
            .collect();
        let dst: BTreeSet<String> = probes
            .iter()
            .filter_map(|p| p["target"]["node"].as_str().map(str::to_owned))
            .collect();
        if src == nodes && dst == nodes && probes.len() >= 6 {
            let total = page["total"].as_u64().expect("total");
            assert_metrics_agree_with_records(&probes, total, &samples, &nodes);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "coverage {src:?} {dst:?}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_secs(3));
    }

    // Probe pods are owned by the prober pod.
    let deadline = Instant::now() + Duration::from_secs(30);
    let metas = loop {
        let m = probe_pod_metas(&tb);
        if !m.is_empty() {
            break m;
        }
        assert!(Instant::now() < deadline, "no probe pod seen");
        std::thread::sleep(Duration::from_millis(300));
    };
    for m in &metas {
        let o = &m["ownerReferences"][0];
        assert_eq!(o["kind"], "Pod", "{m:#}");
        assert_eq!(o["name"], pod.as_str(), "{m:#}");
        assert_eq!(o["uid"], uid.as_str(), "{m:#}");
    }

    // SIGTERM to the container (as the kubelet sends it): exit 0, its probe pods deleted
    // by the prober itself (the owner pod still exists, so no garbage collection).
    let pid = container_pid(&uid).expect("prober container process");
    let before: BTreeSet<String> = probe_pod_metas(&tb)
        .iter()
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (restarts, code) = restart_count(&tb, &pod);
        if restarts >= 1 || code.is_some() {
            assert_eq!(code, Some(0), "exit code after SIGTERM");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prober did not exit within 30s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let left: Vec<String> = probe_pod_metas(&tb)
        .iter()
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .filter(|n| before.contains(n))
        .collect();
    assert!(left.is_empty(), "probe pods left after SIGTERM: {left:?}");
    if common::on_real_control_plane() {
        // Who deleted them: kube-apiserver's audit log names the prober's ServiceAccount
        // for every one, and the garbage collector for none (its owner still exists).
        let user = "system:serviceaccount:firstpacket:firstpacket";
        let gc = "system:serviceaccount:kube-system:generic-garbage-collector";
        let deletes: Vec<(String, String)> = tb
            .audit_events()
            .iter()
            .filter(|e| {
                e["verb"] == "delete"
                    && e["stage"] == "ResponseComplete"
                    && e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["namespace"] == "firstpacket"
            })
            .filter_map(|e| {
                Some((
                    e["objectRef"]["name"].as_str()?.to_owned(),
                    e["user"]["username"].as_str()?.to_owned(),
                ))
            })
            .collect();
        for name in &before {
            let by: Vec<&str> = deletes
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, u)| u.as_str())
                .collect();
            assert!(
                by.contains(&user) && !by.contains(&gc),
                "probe pod {name} deleted by {by:?}, want {user} and not the garbage collector"
            );
        }
    }

    // kill -9: the kubelet restarts the container in the same pod; the restarted prober
    // removes the previous incarnation's probe pods within 60 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (pid, killed) = loop {
        // Wait for the restarted container with probe pods of its own in flight.
        if let Some(pid) = container_pid(&uid) {
            let names: BTreeSet<String> = probe_pod_metas(&tb)
                .iter()
                .filter_map(|m| m["name"].as_str().map(str::to_owned))
                .collect();
            if !names.is_empty() {
                break (pid, names);
            }
        }
        assert!(
            Instant::now() < deadline,
            "restarted prober made no probe pod"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now: BTreeSet<String> = probe_pod_metas(&tb)
            .iter()
            .filter_map(|m| m["name"].as_str().map(str::to_owned))
            .collect();
        let left: Vec<&String> = killed.intersection(&now).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "previous incarnation's probe pods still there 60s after kill -9: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (restarts, _) = restart_count(&tb, &pod);
    assert!(restarts >= 2, "container restarted {restarts} time(s)");
    tb.kubectl(&["delete", "deployment", "-n", "firstpacket", "prober"]);
}
