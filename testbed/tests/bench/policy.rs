//! NetworkPolicy programming latency (issue 32): firstpacket's `policy_change` next to
//! the methods of kube-burner (`netpolLatency`) and clusterloader2
//! (`NetworkPolicyEnforcement`), reproduced with their timers, timeouts and clocks, in
//! one run on one testbed, against the ruleset's truth (`policy_programmed`: the moment
//! the node's ruleset admits the pair).
//!
//! One 3-node testbed on the simulated agent. A long-lived target pod on node-2,
//! isolated by a deny-all ingress policy; two long-lived client pods (node-1, node-3).
//! Per policy delay D (fault `policy_delay: {uniform: [D − 0.5 s, D + 0.5 s]}` on every
//! node), `rounds` times: an allow policy admitting both clients is created, then
//! deleted once both were admitted (and revoked) — and meanwhile:
//! - (b) kube-burner's method: from the first client's network namespace, an HTTP `GET`
//!   every 1 s (a ticker from before the create; each request bounded by 1.5 s, so a
//!   tick that comes while one is in flight is skipped, as Go's `time.Ticker` drops it),
//!   latency = the client's clock at the first success − the policy's
//!   `creationTimestamp` (RFC 3339, whole seconds);
//! - (c) clusterloader2's method: from the second client's namespace,
//!   `curl --connect-timeout 1` in a loop (a dropped SYN costs its whole second),
//!   latency = its clock at the first success − the policy's `creationTimestamp`.
//!
//! Then (a) `prober gate --kinds policy_change --pairs N`: `policy.admitted_seconds` of
//! each probe. Each method's truth is `policy_programmed` for its client on the
//! target's node, counted from the moment the create call returned (on the same
//! machine: (a)'s `policy.allow_created_unix`, the benchmark's own for (b) and (c)).
use super::{enter_netns_of, ms, stats, Opts, Table};
use crate::common::Testbed;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::truth::{unix_now, TruthEvent, TruthKind};

pub const POLICY: &str = "NetworkPolicy latency against truth";

const NS: &str = "default";
const PORT: u16 = 8080;

/// A long-lived pod of the benchmark.
#[derive(Debug, Clone)]
struct Pod {
    uid: String,
    ip: String,
    pid: i32,
}

const METHODS: [&str; 3] = [
    "(a) firstpacket policy_change",
    "(b) kube-burner netpolLatency",
    "(c) clusterloader2 NetworkPolicyEnforcement",
];

fn delays(opts: &Opts) -> (Vec<f64>, usize) {
    if opts.smoke {
        (vec![0.5], 1)
    } else {
        (vec![0.0, 0.5, 2.0, 10.0, 30.0], 8)
    }
}

pub fn run(opts: &Opts) -> Vec<Table> {
    let tb = Testbed::up("bench-policy", 3, "rules: []\n", &[]);
    let target = pod(&tb, "bench-np-target", "node-2", "bench-np: target");
    let kb = pod(&tb, "bench-np-kb", "node-1", "bench-np: client");
    let cl = pod(&tb, "bench-np-cl", "node-3", "bench-np: client");
    let isolate = tb.manifest(
        "bench-np-isolate.yaml",
        &format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: bench-np-isolate, namespace: {NS}}}\nspec:\n  podSelector: {{matchLabels: {{bench-np: target}}}}\n  policyTypes: [Ingress]\n"
        ),
    );
    tb.kubectl(&["apply", "-f", &isolate]);
    // Isolated before anything is timed.
    let shut = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        !reachable(kb.pid, &target.ip) && !reachable(cl.pid, &target.ip)
    });
    assert!(shut, "the deny-all policy never isolated the target");
    let (delays, rounds) = delays(opts);
    let mut t = Table::new(
        POLICY,
        &format!(
            "Signed error = measured − truth (ms) of the time from a NetworkPolicy's creation \
             until it admits a new peer, per policy delay D (fault `policy_delay: {{uniform: \
             [D − 0.5 s, D + 0.5 s]}}` on every node of the simulated agent, floored at 0). \
             Truth: the testbed's `policy_programmed` for the client on the target's node (the \
             moment its ruleset admits the pair) − the moment the create call returned. (a) \
             firstpacket: `prober gate --kinds policy_change --pairs {rounds}`, each probe's \
             `policy.admitted_seconds` (the source's first answered attempt − the prober's mark \
             right after the create returned, on the pod's clock; attempts every 100 ms). (b) \
             kube-burner's `netpolLatency` method, {rounds} policies per delay: HTTP `GET` every \
             1 s with a 1.5 s timeout from a client pod, the client's clock at the first success − \
             the policy's `creationTimestamp` (whole seconds). (c) clusterloader2's \
             `NetworkPolicyEnforcement` method, same policies: `curl --connect-timeout 1` in a \
             loop from another client pod, its clock at the first success − the policy's \
             `creationTimestamp`. *p95 |err| ratio* = the method's p95 of |error| over \
             firstpacket's. Target: firstpacket within [−50 ms, dial interval + 50 ms], p95 \
             |error| ≥ 5× smaller than (b)'s and (c)'s."
        ),
        &[
            "delay D (±0.5 s)",
            "method",
            "n",
            "p5",
            "p50",
            "p95",
            "max",
            "min",
            "p95 |err|",
            "p95 |err| ratio",
        ],
    );
    let mut misses = Vec::new();
    for d in delays {
        let delay = Duration::from_secs_f64(d);
        let label = humantime::format_duration(delay).to_string();
        eprintln!("policy: policy_delay {label} (±0.5 s), {rounds} rounds");
        tb.set_fault(&fault_around(delay));
        let mut errs: [Vec<f64>; 3] = Default::default();
        let mut lost = [0usize; 3];
        let limit = delay + Duration::from_secs(15);
        for r in 0..rounds {
            match round(&tb, &target, &kb, &cl, r, limit) {
                Some((b, c)) => {
                    for (i, e) in [(1, b), (2, c)] {
                        match e {
                            Some(e) => errs[i].push(e),
                            None => lost[i] += 1,
                        }
                    }
                }
                None => {
                    lost[1] += 1;
                    lost[2] += 1;
                }
            }
        }
        let (a, a_lost) = firstpacket(&tb, rounds, limit);
        errs[0] = a;
        lost[0] = a_lost;
        let s: Vec<[f64; 6]> = errs.iter().map(|e| stats(e)).collect();
        for (i, name) in METHODS.iter().enumerate() {
            let ratio = if i == 0 {
                "1".to_owned()
            } else if s[0][5] > 0.0 {
                format!("{:.1}×", s[i][5] / s[0][5])
            } else {
                "n/a (firstpacket 0)".into()
            };
            t.row(vec![
                label.clone(),
                (*name).into(),
                if lost[i] > 0 {
                    format!("{} ({} lost)", errs[i].len(), lost[i])
                } else {
                    errs[i].len().to_string()
                },
                ms(s[i][0]),
                ms(s[i][1]),
                ms(s[i][2]),
                ms(s[i][3]),
                ms(s[i][4]),
                format!("{:.0}", s[i][5] * 1000.0),
                ratio,
            ]);
            if i > 0 && (s[i][5] < 5.0 * s[0][5] || s[i][5].is_nan()) {
                misses.push(format!(
                    "delay {label}: {name} p95 |err| {:.0} ms is not ≥ 5× firstpacket's {:.0} ms",
                    s[i][5] * 1e3,
                    s[0][5] * 1e3
                ));
            }
        }
        if errs[0].is_empty() {
            misses.push(format!(
                "delay {label}: no firstpacket probe had a latency and a truth"
            ));
        } else if s[0][4] < -0.05 || s[0][3] > 0.15 {
            misses.push(format!(
                "delay {label}: firstpacket's error ranged {:+.0}..{:+.0} ms, outside [−50, 150] ms",
                s[0][4] * 1e3,
                s[0][3] * 1e3
            ));
        }
    }
    if misses.is_empty() {
        t.notes.push("Every target met at every delay.".into());
    } else {
        t.notes.extend(misses);
    }
    vec![t]
}

fn fault_around(d: Duration) -> String {
    let lo = d.saturating_sub(Duration::from_millis(500));
    format!(
        "rules:\n  - nodes: {{all: true}}\n    policy_delay: {{uniform: [{}, {}]}}\n",
        humantime::format_duration(lo),
        humantime::format_duration(d + Duration::from_millis(500))
    )
}

/// A long-lived `target-server serve` pod on `node` with `label` (`key: value`), Ready.
fn pod(tb: &Testbed, name: &str, node: &str, label: &str) -> Pod {
    let m = tb.manifest(
        &format!("{name}.yaml"),
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}, labels: {{{label}}}}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: \"{}\"\n    args: [serve, --port, \"{PORT}\"]\n    readinessProbe: {{httpGet: {{path: /readyz, port: {PORT}}}, periodSeconds: 1}}\n",
            prober::config::DEFAULT_IMAGE
        ),
    );
    tb.kubectl(&["apply", "-f", &m]);
    assert!(
        tb.wait_pod_ready(NS, name, Duration::from_secs(60)),
        "{name} not Ready"
    );
    let p: Value =
        serde_json::from_str(&tb.kubectl(&["get", "pod", "-n", NS, name, "-o", "json"])).unwrap();
    Pod {
        uid: p["metadata"]["uid"].as_str().unwrap().to_owned(),
        ip: p["status"]["podIP"].as_str().unwrap().to_owned(),
        pid: tb
            .container_pid(NS, name)
            .unwrap_or_else(|| panic!("no container pid for {name}")),
    }
}

/// Whether one `GET /` from `pid`'s netns reaches `ip` within 300 ms.
fn reachable(pid: i32, ip: &str) -> bool {
    Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["curl", "-s", "-o", "/dev/null", "--max-time", "0.3"])
        .arg(format!("http://{ip}:{PORT}/"))
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// kube-burner's client: from `pid`'s netns, a `GET /` on every 1 s tick (1.5 s timeout;
/// a tick during a request is dropped) until one answers after `armed` turned true;
/// returns the Unix time of that success (the client's `time.Now()`).
fn kube_burner_client(
    pid: i32,
    ip: String,
    armed: Arc<AtomicBool>,
    limit: Duration,
) -> std::thread::JoinHandle<Option<f64>> {
    std::thread::spawn(move || {
        enter_netns_of(pid).ok()?;
        let t0 = Instant::now();
        let mut next = t0;
        while t0.elapsed() < limit {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let ok = testbed::demo::http_ok(&ip, PORT, Duration::from_millis(1500));
            let now = unix_now();
            if ok && armed.load(Ordering::SeqCst) {
                return Some(now);
            }
            // The next tick after now (dropped ticks are not made up).
            let since = t0.elapsed().as_secs_f64();
            next = t0 + Duration::from_secs(since.floor() as u64 + 1);
        }
        None
    })
}

/// clusterloader2's client: `until curl --connect-timeout 1 http://IP:8080/; do :; done`
/// in `pid`'s netns, started once `armed`; returns its clock at the first success.
fn cl2_client(pid: i32, ip: String, limit: Duration) -> std::thread::JoinHandle<Option<f64>> {
    std::thread::spawn(move || {
        let script = "until curl -s -o /dev/null --connect-timeout 1 \"http://$IP:8080/\"; do :; done; date +%s.%N";
        let out = Command::new("timeout")
            .arg(limit.as_secs().max(1).to_string())
            .arg("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["sh", "-c", script])
            .env("IP", &ip)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<f64>()
            .ok()
    })
}

/// One allow policy admitting both clients: created, timed by (b) and (c), deleted once
/// both were admitted (or `limit` passed), and its revocation awaited. Returns the
/// signed errors of (b) and (c) (`None`: lost), or `None` when the create failed.
fn round(
    tb: &Testbed,
    target: &Pod,
    kb: &Pod,
    cl: &Pod,
    r: usize,
    limit: Duration,
) -> Option<(Option<f64>, Option<f64>)> {
    let name = format!("bench-np-allow-{r}");
    let m = tb.manifest(
        &format!("{name}.yaml"),
        &format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  podSelector: {{matchLabels: {{bench-np: target}}}}\n  ingress:\n  - from:\n    - podSelector: {{matchLabels: {{bench-np: client}}}}\n"
        ),
    );
    let armed = Arc::new(AtomicBool::new(false));
    let b = kube_burner_client(kb.pid, target.ip.clone(), armed.clone(), limit);
    // The ticker runs before the policy exists, as kube-burner's clients do.
    std::thread::sleep(Duration::from_millis(1300));
    armed.store(true, Ordering::SeqCst);
    let c = cl2_client(cl.pid, target.ip.clone(), limit);
    let out = tb.kubectl(&["create", "-f", &m, "-o", "json"]);
    let created = unix_now();
    let obj: Value = serde_json::from_str(&out).ok()?;
    let stamp = obj["metadata"]["creationTimestamp"].as_str()?;
    // RFC 3339 in whole seconds, as the API server stores it.
    let creation_ts = stamp
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()?
        .as_second() as f64;
    let got_b = b.join().ok().flatten();
    let got_c = c.join().ok().flatten();
    // From before the delete call: with no policy delay the agent revokes before
    // kubectl has returned.
    let deleted = unix_now();
    tb.kubectl(&["delete", "-f", &m, "--wait=false"]);
    // Revoked for both before the next round.
    let gone = (0..((limit.as_secs() + 5) * 10)).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let truth = tb.truth();
        [&kb.uid, &cl.uid]
            .iter()
            .all(|u| at(&truth, TruthKind::PolicyRevoked, u, deleted).is_some())
    });
    if !gone {
        eprintln!("policy round {r}: not revoked for both clients");
    }
    let truth = tb.truth();
    let err = |got: Option<f64>, client: &Pod| {
        let admitted = at(
            &truth,
            TruthKind::PolicyProgrammed,
            &client.uid,
            created - 2.0,
        )?;
        Some((got? - creation_ts) - (admitted - created))
    };
    Some((err(got_b, kb), err(got_c, cl)))
}

/// The first `kind` event at or after `from` whose `uid` is `peer`.
fn at(truth: &[TruthEvent], kind: TruthKind, peer: &str, from: f64) -> Option<f64> {
    truth
        .iter()
        .filter(|e| e.event == kind && e.uid.as_deref() == Some(peer) && e.t >= from)
        .map(|e| e.t)
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))))
}

/// (a): one gate of `pairs` `policy_change` probes; each probe's `admitted_seconds`
/// against its truth. Returns the errors and how many probes had none.
fn firstpacket(tb: &Testbed, pairs: usize, limit: Duration) -> (Vec<f64>, usize) {
    let give_up = humantime::format_duration(limit).to_string();
    let pairs_s = pairs.to_string();
    let (code, report, text) = tb.gate(&[
        "--kinds",
        "policy_change",
        "--pairs",
        &pairs_s,
        "--concurrency",
        "2",
        "--give-up",
        &give_up,
        "--hold",
        "1s",
        "--slow-threshold",
        "10m",
    ]);
    assert!(code == 0 || code == 1, "gate exit {code}:\n{text}");
    let truth = tb.truth();
    let mut errs = Vec::new();
    let mut lost = 0;
    for p in report["probes"].as_array().into_iter().flatten() {
        let got = p["policy"]["admitted_seconds"].as_f64();
        let raw = p["raw_ttfp_seconds"].as_f64();
        let created = p["policy"]["allow_created_unix"].as_f64();
        let (Some(_), Some(raw), Some(created), Some(src)) =
            (got, raw, created, p["source"]["uid"].as_str())
        else {
            lost += 1;
            continue;
        };
        match at(&truth, TruthKind::PolicyProgrammed, src, created - 2.0) {
            Some(admitted) => errs.push(raw - (admitted - created)),
            None => lost += 1,
        }
    }
    (errs, lost)
}
