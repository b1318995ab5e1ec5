//! Accuracy of firstpacket next to what operators use today, what a long-lived mesh
//! sees during S2 and S3, and resolution vs `--dial-interval`.
//!
//! One 3-node testbed. Per program delay D (fault `program_delay` uniform in D ± 0.5 s on
//! every node, [`fault_around`]) one
//! `prober gate --kinds cross_node` runs; while it does, a watch on its probe pods
//! (`kubectl get pods --watch -o json`, i.e. what the API shows) starts, for each probe:
//! - (b) the operator's loop, at the target's Ready as seen through the API, inside the
//!   probe's fresh source pod's network namespace (`nsenter --net=/proc/PID/ns/net`, what
//!   `kubectl exec src` gives): `s=$(date +%s); until wget -qO- -T1 -t1
//!   http://$IP:8080/; do :; done; e=$(date +%s)` — whole seconds, 1 s timeouts
//!   (`-t1`: one try per call, as busybox's wget does; GNU wget retries 20 times);
//! - (c) a perf-tests-style poller, at the moment the target's IP appears in the API, from a
//!   long-lived pod on another node: `GET /` every 1 s (1 s timeout) until it answers.
//!
//! Each method's truth is the testbed's (docs/design.md §6): the earliest time the path
//! between its client pod and the target is up (both endpoints programmed, peer routes
//! present; [`testbed::truth::path_up_from`]) counted from the moment the method starts
//! timing (firstpacket: the source's `readiness_ok`, [`testbed::truth::truth_ttfp`]).
//! These runs use an agent that does not gate readiness (`agent: {gates_readiness:
//! false}`), so the delay lands after Ready, where all three methods look.
//!
//! The programming wait (issue 29): the same delays again on the simulated agent that
//! gates readiness (its default, as Calico does), and real Calico Felix with its
//! dataplane writes slowed (`agent_io`); in each run firstpacket's programming wait of
//! every probe pod, and what the operator's loop and the poller report for the target,
//! against the pod's true programming wait ([`testbed::truth::truth_programming_wait`]).
use super::{enter_netns_of, ms, stats, Opts, Table};
use crate::common::Testbed;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use testbed::truth::{path_up_from, truth_programming_wait, truth_ttfp, unix_now};

pub const ACCURACY: &str = "Accuracy against truth";
pub const MESH: &str = "What a long-lived mesh sees";
pub const RESOLUTION: &str = "Resolution vs --dial-interval";
pub const PROGRAMMING: &str = "Programming wait against truth";

const NODES: usize = 3;
/// Namespace of the long-lived pods.
const LL_NS: &str = "default";
const PORT: u16 = 8080;
/// Probe pods' namespace (the gate's default `--namespace`).
const PROBE_NS: &str = "firstpacket";

/// A long-lived pod: the clients of method (c) and of the mesh.
#[derive(Debug, Clone)]
struct LongLived {
    node: String,
    uid: String,
    ip: String,
    pid: i32,
}

/// What one method measured for one probe: measured and true seconds from its start.
#[derive(Debug, Clone, Copy)]
struct Sample {
    measured: f64,
    truth: f64,
}

impl Sample {
    fn error(&self) -> f64 {
        self.measured - self.truth
    }
}

pub fn run(opts: &Opts) -> Vec<Table> {
    let tb = Testbed::up(
        "bench-accuracy",
        NODES,
        &fault_delay(Duration::from_millis(300)),
        &["--node-labels", "node-2=os=debian13"],
    );
    let ll = long_lived_pods(&tb);
    let (acc, ungated) = accuracy(&tb, &ll, opts);
    let mut prog = programming_table(opts);
    add_programming_rows(&mut prog, "simulated, ungated", &ungated, false);
    let gated = programming_sim_gated(&tb, &ll, opts);
    add_programming_rows(&mut prog, "simulated, gates readiness", &gated, true);
    let res = resolution(&tb, opts);
    let mesh = mesh(&tb, &ll, opts);
    drop(tb);
    if let Some(real) = programming_real_felix(opts) {
        add_programming_rows(&mut prog, "real Felix", &real, true);
    }
    vec![acc, prog, mesh, res]
}

fn fault_delay(d: Duration) -> String {
    format!(
        "rules:\n  - nodes: {{all: true}}\n    program_delay: {}\n",
        humantime::format_duration(d)
    )
}

/// Half-width of the jitter around each program delay (see [`fault_around`]).
const JITTER: Duration = Duration::from_millis(500);

/// Fault: `program_delay` uniform in [D − 0.5 s, D + 0.5 s] (floored at 0) on every node.
///
/// Not a fixed D: the testbed starts an endpoint's delay within milliseconds of the pod's
/// start, and the methods start their clocks at the pod's Ready or IP, so with a fixed
/// delay a 1 s loop's ticks (and the prober's dials) land on the moment the path comes up
/// every time; a first run with fixed delays measured the whole-second loop within 13 ms at
/// 2, 10 and 30 s. A real agent's delay has no such phase with an observer's clock.
///
/// `gated`: whether the simulated agent gates readiness (its default, as Calico does); off,
/// the delay lands after Ready, in TTFP.
pub(super) fn fault_around(d: Duration, gated: bool) -> String {
    let lo = d.saturating_sub(JITTER);
    format!(
        "rules:\n  - nodes: {{all: true}}\n    program_delay: {{uniform: [{}, {}]}}\n    agent: {{gates_readiness: {gated}}}\n",
        humantime::format_duration(lo),
        humantime::format_duration(d + JITTER)
    )
}

/// One Pod per node serving `/` like the probe pods, created once and left running:
/// their endpoints are long programmed when the measurements start.
fn long_lived_pods(tb: &Testbed) -> Vec<LongLived> {
    let mut out = Vec::new();
    for i in 1..=NODES {
        let name = format!("bench-longlived-{i}");
        let m = tb.manifest(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {LL_NS}}}\nspec:\n  nodeName: node-{i}\n  containers:\n  - name: c\n    image: \"{}\"\n    args: [serve, --port, \"{PORT}\"]\n    readinessProbe: {{httpGet: {{path: /readyz, port: {PORT}}}, periodSeconds: 1}}\n",
                prober::config::DEFAULT_IMAGE
            ),
        );
        tb.kubectl(&["apply", "-f", &m]);
    }
    for i in 1..=NODES {
        let name = format!("bench-longlived-{i}");
        assert!(
            tb.wait_pod_ready(LL_NS, &name, Duration::from_secs(60)),
            "long-lived pod {name} not Ready"
        );
        let pod: Value =
            serde_json::from_str(&tb.kubectl(&["get", "pod", "-n", LL_NS, &name, "-o", "json"]))
                .unwrap();
        let pid = tb
            .container_pid(LL_NS, &name)
            .unwrap_or_else(|| panic!("no container pid for {name}"));
        out.push(LongLived {
            node: pod["spec"]["nodeName"].as_str().unwrap().to_owned(),
            uid: pod["metadata"]["uid"].as_str().unwrap().to_owned(),
            ip: pod["status"]["podIP"].as_str().unwrap().to_owned(),
            pid,
        });
    }
    out
}

/// `GET /` to `ip:8080` from the calling thread's netns within `timeout`: the demo's mesh
/// check ([`testbed::demo::http_ok`]).
fn http_ok(ip: &str, timeout: Duration) -> bool {
    testbed::demo::http_ok(ip, PORT, timeout)
}

/// A probe's pods as the watch shows them.
#[derive(Debug, Default, Clone)]
struct Pair {
    source_uid: Option<String>,
    target_uid: Option<String>,
    started_b: bool,
    started_c: bool,
}

/// One method's result for one target pod, by its uid: (client pod uid, start (Unix
/// seconds), what it measured).
type Results = Mutex<HashMap<String, (String, f64, Option<f64>)>>;

/// Results of methods (b) and (c), by target pod uid.
#[derive(Default)]
struct Others {
    /// (source uid, start, measured seconds) of the operator's loop; measured `None`
    /// when the loop did not end (pod gone, deadline).
    loops: Results,
    /// Source pod uid by probe id, filled by the watcher: a source may be seen after its
    /// target is Ready, when the loop thread already waits for it.
    sources: Mutex<BTreeMap<String, String>>,
    /// (long-lived pod uid, start, success time) of the poller.
    polls: Results,
}

/// Watches the probe pods while `gate` runs and starts methods (b) and (c) for each
/// probe; returns the gate's result and what (b) and (c) measured.
fn gate_with_others(
    tb: &Testbed,
    ll: &[LongLived],
    gate_args: &[String],
    deadline: Duration,
) -> ((i32, Value, String), Arc<Others>) {
    let mut watch = tb.cmd();
    watch
        .args(["exec", "--", "kubectl", "get", "pods", "-n", PROBE_NS])
        .args([
            "-l",
            "app.kubernetes.io/name=firstpacket",
            "--watch",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut watch, 0);
    let mut child = watch.spawn().expect("kubectl watch");
    let stdout = child.stdout.take().unwrap();
    let others = Arc::new(Others::default());
    let state = tb.state.clone();
    let ll = ll.to_vec();
    let o2 = others.clone();
    let watcher = std::thread::spawn(move || {
        let mut pairs: BTreeMap<String, Pair> = BTreeMap::new();
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let stream = serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout))
            .into_iter::<Value>();
        for pod in stream {
            let Ok(pod) = pod else { break };
            let labels = &pod["metadata"]["labels"];
            let Some(id) = labels["firstpacket.io/probe-id"].as_str() else {
                continue;
            };
            let comp = labels["app.kubernetes.io/component"].as_str().unwrap_or("");
            let p = pairs.entry(id.to_owned()).or_default();
            let uid = pod["metadata"]["uid"].as_str().map(str::to_owned);
            let node = pod["spec"]["nodeName"].as_str().map(str::to_owned);
            let ready = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let ip = pod["status"]["podIP"].as_str().filter(|s| !s.is_empty());
            match comp {
                "probe-source" => {
                    p.source_uid = uid;
                }
                "probe-target" => {
                    p.target_uid = uid.clone();
                    if let (Some(ip), Some(tuid), false) = (ip, &uid, p.started_c) {
                        // (c) from a long-lived pod on another node than the target's.
                        if let Some(client) =
                            ll.iter().find(|l| Some(&l.node) != node.as_ref()).cloned()
                        {
                            p.started_c = true;
                            threads.push(spawn_poller(
                                client,
                                ip.to_owned(),
                                tuid.clone(),
                                deadline,
                                o2.clone(),
                            ));
                        }
                    }
                    if let (true, Some(ip), Some(tuid), false) = (ready, ip, &uid, p.started_b) {
                        p.started_b = true;
                        threads.push(spawn_loop(
                            state.clone(),
                            id.to_owned(),
                            p.source_uid.clone(),
                            ip.to_owned(),
                            tuid.clone(),
                            deadline,
                            o2.clone(),
                        ));
                    }
                }
                _ => {}
            }
            if let Some(su) = &p.source_uid {
                o2.sources.lock().unwrap().insert(id.to_owned(), su.clone());
            }
        }
        for t in threads {
            let _ = t.join();
        }
    });
    let out = tb.gate(&gate_args.iter().map(String::as_str).collect::<Vec<_>>());
    // Let the last loops and pollers end (they stop at success or their deadline).
    std::thread::sleep(Duration::from_secs(5));
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
    let _ = watcher.join();
    (out, others)
}

/// Method (b): waits for the probe's source pod's container (the kubelet's pid file),
/// then runs the operator's loop in its netns.
fn spawn_loop(
    state: std::path::PathBuf,
    probe_id: String,
    source_uid: Option<String>,
    ip: String,
    target_uid: String,
    deadline: Duration,
    out: Arc<Others>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let give_up = Instant::now() + deadline;
        let mut pid = None;
        let mut suid = source_uid;
        while pid.is_none() && Instant::now() < give_up {
            if suid.is_none() {
                suid = out.sources.lock().unwrap().get(&probe_id).cloned();
            }
            pid = suid.as_ref().and_then(|u| {
                std::fs::read_to_string(state.join("pods").join(u).join("pid"))
                    .ok()?
                    .trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|p| *p > 0)
            });
            if pid.is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let (Some(pid), Some(suid)) = (pid, suid) else {
            return;
        };
        let script = "s=$(date +%s); until wget -qO- -T1 -t1 \"http://$IP:8080/\" >/dev/null 2>&1; do :; done; e=$(date +%s); echo \"$s $e\"";
        let start = unix_now();
        let res = Command::new("timeout")
            .arg(deadline.as_secs().max(1).to_string())
            .arg("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["sh", "-c", script])
            .env("IP", &ip)
            .stderr(Stdio::null())
            .output();
        let measured = res.ok().filter(|o| o.status.success()).and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let mut it = text.split_whitespace().map(|v| v.parse::<i64>());
            match (it.next(), it.next()) {
                (Some(Ok(s)), Some(Ok(e))) => Some((e - s) as f64),
                _ => None,
            }
        });
        out.loops
            .lock()
            .unwrap()
            .insert(target_uid, (suid, start, measured));
    })
}

/// Method (c): from `client`'s netns, `GET /` every 1 s (1 s timeout) until it answers.
fn spawn_poller(
    client: LongLived,
    ip: String,
    target_uid: String,
    deadline: Duration,
    out: Arc<Others>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        if enter_netns_of(client.pid).is_err() {
            return;
        }
        let start = unix_now();
        let t0 = Instant::now();
        let mut ok = None;
        let mut k = 0u32;
        while t0.elapsed() < deadline {
            let tick = t0 + Duration::from_secs(u64::from(k));
            std::thread::sleep(tick.saturating_duration_since(Instant::now()));
            if http_ok(&ip, Duration::from_secs(1)) {
                ok = Some(unix_now());
                break;
            }
            k += 1;
        }
        out.polls
            .lock()
            .unwrap()
            .insert(target_uid, (client.uid, start, ok));
    })
}

fn probes(report: &Value) -> Vec<Value> {
    report["probes"].as_array().cloned().unwrap_or_default()
}

/// One gate run at one delay with methods (b) and (c) beside it, each judged against its
/// truth: `ttfp` (and `lost`) for (a), (b), (c) against the path truth from each
/// method's start; `programming` for (a) every probe pod's programming wait, (b) and (c)
/// what they report for the target, against the pod's true programming wait.
struct Run {
    label: String,
    ttfp: [Vec<Sample>; 3],
    lost: [usize; 3],
    programming: [Vec<Sample>; 3],
}

/// Runs one gate of `pairs` `cross_node` probes with the operator's loop and the poller
/// beside it (the fault must already be set) and judges every method (see [`Run`]).
/// `give_up`: the gate's `--give-up` and the other methods' deadline.
fn measure_run(
    tb: &Testbed,
    ll: &[LongLived],
    label: String,
    pairs: usize,
    give_up: Duration,
) -> Run {
    let give_up_arg = humantime::format_duration(give_up).to_string();
    let args = cross_node_gate_args(pairs, &["--give-up", &give_up_arg, "--max-ttfp", "10m"]);
    let ((code, report, text), others) = gate_with_others(tb, ll, &args, give_up);
    assert!(code == 0 || code == 1, "gate exit {code}:\n{text}");
    let truth = tb.truth();
    let mut a = Vec::new();
    let mut a_prog = Vec::new();
    for p in probes(&report) {
        for role in ["source", "target"] {
            let (Some(got), Some(uid)) = (
                p["programming"][role]["wait_seconds"].as_f64(),
                p[role]["uid"].as_str(),
            ) else {
                continue;
            };
            if let Some(want) = truth_programming_wait(&truth, uid) {
                a_prog.push(Sample {
                    measured: got,
                    truth: want,
                });
            }
        }
        let (Some(ttfp), Some(s), Some(tg)) = (
            p["ttfp_seconds"].as_f64(),
            p["source"]["uid"].as_str(),
            p["target"]["uid"].as_str(),
        ) else {
            continue;
        };
        if let Some(want) = truth_ttfp(&truth, s, tg) {
            a.push(Sample {
                measured: ttfp,
                truth: want,
            });
        }
    }
    // (measured against the path truth, measured against the target's programming wait, lost)
    let judge = |m: &Results, absolute: bool| {
        let (mut v, mut w) = (Vec::new(), Vec::new());
        let mut lost = 0;
        for (target, (client, start, got)) in m.lock().unwrap().iter() {
            let Some(g) = got else {
                lost += 1;
                continue;
            };
            let measured = if absolute { g - start } else { *g };
            if let Some(wait) = truth_programming_wait(&truth, target) {
                w.push(Sample {
                    measured,
                    truth: wait,
                });
            }
            match path_up_from(&truth, client, target, *start) {
                Some(up) => v.push(Sample {
                    measured,
                    truth: up - start,
                }),
                None => lost += 1,
            }
        }
        (v, w, lost)
    };
    let (b, b_prog, lost_b) = judge(&others.loops, false);
    let (c, c_prog, lost_c) = judge(&others.polls, true);
    Run {
        label,
        ttfp: [a, b, c],
        lost: [0, lost_b, lost_c],
        programming: [a_prog, b_prog, c_prog],
    }
}

/// `prober gate` arguments for `pairs` `cross_node` probes, 5 at a time, then `extra`
/// (the accuracy, programming and resolution runs all probe this way).
fn cross_node_gate_args(pairs: usize, extra: &[&str]) -> Vec<String> {
    let pairs = pairs.to_string();
    [
        "--kinds",
        "cross_node",
        "--pairs",
        &pairs,
        "--concurrency",
        "5",
    ]
    .iter()
    .chain(extra)
    .map(|s| (*s).to_owned())
    .collect()
}

const METHODS: [&str; 3] = [
    "(a) firstpacket",
    "(b) operator's wget loop",
    "(c) 1 s poller",
];

/// The delays of the simulated runs, and probes per run.
fn delays(opts: &Opts) -> (Vec<f64>, usize) {
    if opts.smoke {
        (vec![0.5], 2)
    } else {
        (vec![0.0, 0.5, 2.0, 10.0, 30.0], 10)
    }
}

/// The TTFP accuracy table, from runs on an agent that does not gate readiness; returns
/// those runs too (their programming waits go into [`PROGRAMMING`]).
fn accuracy(tb: &Testbed, ll: &[LongLived], opts: &Opts) -> (Table, Vec<Run>) {
    let (delays, pairs) = delays(opts);
    let mut t = Table::new(
        ACCURACY,
        &format!(
            "Signed error = measured − truth (ms), per program delay D (fault `program_delay: \
             {{uniform: [D − 0.5 s, D + 0.5 s]}}` on every node, floored at 0: a fixed delay \
             would start within milliseconds of each method's clock and phase-lock its ticks \
             to the moment the path comes up), on an agent that does not gate readiness \
             (`agent: {{gates_readiness: false}}`: the delay lands after Ready; where it \
             gates, see \"Programming wait against truth\"), {pairs} `cross_node` probes per delay in one \
             `prober gate --kinds cross_node --pairs {pairs} --concurrency 5` each. (a) firstpacket's TTFP against \
             the §6 truth from the source's Ready; (b) the operator's loop `until wget -qO- -T1 \
             -t1 http://$IP:8080/; do :; done` timed with `date +%s`, run in the probe's fresh \
             source pod's network namespace from the moment the watch shows the target Ready; \
             (c) a perf-tests-style poller `GET /` every 1 s from a long-lived pod on another \
             node, from the moment the watch shows the target's IP. Each method's truth is the \
             time its path came up (both endpoints programmed, peer routes present) after the \
             moment it started timing. *p95 |err| ratio* = the method's p95 of |error| over \
             firstpacket's in the same run. Target: firstpacket's p95 within [0, dial interval \
             + 50 ms] and ≥ 5× smaller than (b)'s and (c)'s; never below −50 ms."
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
    let mut failures_of_target = Vec::new();
    let mut runs = Vec::new();
    for d in delays {
        let delay = Duration::from_secs_f64(d);
        eprintln!("accuracy: program_delay {d}s, {pairs} probes, agent not gating readiness");
        tb.set_fault(&fault_around(delay, false));
        let run = measure_run(
            tb,
            ll,
            format!("{} (±0.5 s)", humantime::format_duration(delay)),
            pairs,
            delay + Duration::from_secs(30),
        );
        let errs = |v: &[Sample]| v.iter().map(Sample::error).collect::<Vec<_>>();
        let sa = stats(&errs(&run.ttfp[0]));
        for (i, name) in METHODS.iter().enumerate() {
            let (v, lost) = (&run.ttfp[i], run.lost[i]);
            let s = stats(&errs(v));
            let ratio = if i == 0 {
                "1".to_owned()
            } else if sa[5] > 0.0 {
                format!("{:.1}×", s[5] / sa[5])
            } else {
                "n/a (firstpacket 0)".into()
            };
            t.row(vec![
                format!("{}", humantime::format_duration(delay)),
                (*name).into(),
                if lost > 0 {
                    format!("{} ({lost} lost)", v.len())
                } else {
                    v.len().to_string()
                },
                ms(s[0]),
                ms(s[1]),
                ms(s[2]),
                ms(s[3]),
                ms(s[4]),
                format!("{:.0}", s[5] * 1000.0),
                ratio,
            ]);
            if i > 0 && (s[5] < 5.0 * sa[5] || s[5].is_nan()) {
                failures_of_target.push(format!(
                    "delay {}: {name} p95 |err| {:.0} ms is not ≥ 5× firstpacket's {:.0} ms",
                    humantime::format_duration(delay),
                    s[5] * 1e3,
                    sa[5] * 1e3
                ));
            }
        }
        if run.ttfp[0].is_empty() {
            failures_of_target.push(format!(
                "delay {}: no firstpacket probe had a TTFP and a truth",
                humantime::format_duration(delay)
            ));
        }
        if sa[4] < -0.05 {
            failures_of_target.push(format!(
                "delay {}: firstpacket's error reached {:.0} ms (< −50 ms)",
                humantime::format_duration(delay),
                sa[4] * 1e3
            ));
        }
        if !(0.0..=0.15).contains(&sa[2]) {
            failures_of_target.push(format!(
                "delay {}: firstpacket's p95 error {:+.0} ms is outside [0, 150] ms",
                humantime::format_duration(delay),
                sa[2] * 1e3
            ));
        }
        runs.push(run);
    }
    if failures_of_target.is_empty() {
        t.notes
            .push("Every accuracy target met at every delay.".into());
    } else {
        t.notes.extend(failures_of_target);
    }
    (t, runs)
}

/// The [`PROGRAMMING`] table, empty.
fn programming_table(opts: &Opts) -> Table {
    let (_, pairs) = delays(opts);
    Table::new(
        PROGRAMMING,
        &format!(
            "Signed error = reported − truth (ms), where truth is the pod's own programming \
             wait: `endpoint_programmed` − `container_started` of the same pod (on real Felix \
             `endpoint_programmed` is read from the node's ruleset). Runs of {pairs} \
             `cross_node` probes (`prober gate --kinds cross_node --pairs {pairs} --concurrency \
             5`): the simulated agent at each `program_delay` D (±0.5 s) of the table above, \
             once not gating readiness (those very runs) and once gating it as Calico does \
             (its default); real Calico Felix v3.31.7 with every dataplane write D slower \
             (`agent_io: {{delay: D}}` on every node). (a) firstpacket's programming wait of \
             each probe pod, source and target (the pod dials its own node every 100 ms from \
             its first instant); (b) what the operator's loop reports (seconds from the \
             target's Ready to its first answer; it runs in the fresh source pod, which on a \
             gating CNI first waits for its own programming, so there it reports the source's \
             wait, not the target's) and (c) what the 1 s poller reports (seconds from the \
             target's IP to its first answer), each against the target's true wait. Target for (a) where \
             the CNI gates readiness: within [−50 ms, dial interval + 50 ms]. Where it does \
             not, a pod reaches its own node at once, so the programming wait reads about 0 \
             (error ≈ −D) by design: the delay is after Ready and TTFP measures it (table \
             above)."
        ),
        &[
            "agent",
            "delay D",
            "method",
            "n",
            "p50",
            "p95",
            "max",
            "min",
            "p95 |err|",
        ],
    )
}

/// Appends `runs` to the [`PROGRAMMING`] table; `judged`: whether (a) is held to its
/// target (the agent gates readiness).
fn add_programming_rows(t: &mut Table, agent: &str, runs: &[Run], judged: bool) {
    let mut misses = Vec::new();
    for run in runs {
        for (i, name) in METHODS.iter().enumerate() {
            let errs: Vec<f64> = run.programming[i].iter().map(Sample::error).collect();
            let s = stats(&errs);
            t.row(vec![
                agent.into(),
                run.label.clone(),
                (*name).into(),
                errs.len().to_string(),
                ms(s[1]),
                ms(s[2]),
                ms(s[3]),
                ms(s[4]),
                format!("{:.0}", s[5] * 1000.0),
            ]);
            if judged && i == 0 && (errs.is_empty() || s[4] < -0.05 || s[3] > 0.15) {
                misses.push(format!(
                    "{} (n {}, min {:+.0} ms, max {:+.0} ms)",
                    run.label,
                    errs.len(),
                    s[4] * 1e3,
                    s[3] * 1e3
                ));
            }
        }
    }
    if judged {
        t.notes.push(if misses.is_empty() {
            format!(
                "{agent}: every programming wait within [−50 ms, dial interval + 50 ms] of truth."
            )
        } else {
            format!(
                "{agent}: **outside [−50 ms, dial interval + 50 ms]** at {}",
                misses.join("; ")
            )
        });
    }
}

/// The simulated agent gating readiness (its default), at each delay of [`delays`].
fn programming_sim_gated(tb: &Testbed, ll: &[LongLived], opts: &Opts) -> Vec<Run> {
    let (delays, pairs) = delays(opts);
    delays
        .into_iter()
        .map(|d| {
            let delay = Duration::from_secs_f64(d);
            eprintln!("programming: program_delay {d}s, {pairs} probes, agent gating readiness");
            tb.set_fault(&fault_around(delay, true));
            measure_run(
                tb,
                ll,
                format!("{} (±0.5 s)", humantime::format_duration(delay)),
                pairs,
                2 * delay + Duration::from_secs(30),
            )
        })
        .collect()
}

/// Real Calico Felix (3 nodes, real control plane) with every dataplane write D slower;
/// `None` (a line on stderr) without the real control plane or a Felix build, and in the
/// smoke run (e2e_calico checks the same measurement against truth there).
fn programming_real_felix(opts: &Opts) -> Option<Vec<Run>> {
    if opts.smoke {
        eprintln!("programming: real Felix left out of the smoke run");
        return None;
    }
    if let Err(e) = testbed::calico::Builds::locate().require([testbed::calico::DEFAULT_VERSION]) {
        eprintln!("programming: real Felix left out: {e}");
        return None;
    }
    let tb = Testbed::up_real("bench-felix", NODES, "rules: []\n", &["--agent", "calico"])?;
    let ll = long_lived_pods(&tb);
    let pairs = delays(opts).1;
    let mut runs = Vec::new();
    for d in [0u64, 1, 3] {
        eprintln!("programming: real Felix, agent_io delay {d}s, {pairs} probes");
        tb.set_fault(&if d == 0 {
            "rules: []\n".to_owned()
        } else {
            format!("rules:\n  - nodes: {{all: true}}\n    agent_io: {{delay: {d}s}}\n")
        });
        runs.push(measure_run(
            &tb,
            &ll,
            format!("agent_io {d}s"),
            pairs,
            Duration::from_secs(60 + 20 * d),
        ));
    }
    Some(runs)
}

fn resolution(tb: &Testbed, opts: &Opts) -> Table {
    let pairs = if opts.smoke { 2 } else { 10 };
    let delay = Duration::from_secs(2);
    let mut t = Table::new(
        RESOLUTION,
        &format!(
            "firstpacket's signed error (ms) against truth at `program_delay: {{uniform: [1.5s, \
             2.5s]}}`, {pairs} \
             `cross_node` probes per `--dial-interval` (`prober gate --kinds cross_node --pairs \
             {pairs} --concurrency 5 --dial-interval I`). The error is bounded by the spacing \
             of new connections: a dial lands at most one interval after the path comes up. \
             perf-tests' reachability probe polls every 1 s. Target: ≤ 100 ms at the default \
             (100 ms)."
        ),
        &["--dial-interval", "n", "p50", "p95", "max", "min"],
    );
    tb.set_fault(&fault_around(delay, false));
    for interval in ["20ms", "50ms", "100ms"] {
        eprintln!("resolution: --dial-interval {interval}");
        let args = cross_node_gate_args(pairs, &["--dial-interval", interval]);
        let (code, report, text) = tb.gate(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(code == 0 || code == 1, "gate exit {code}:\n{text}");
        let truth = tb.truth();
        let errs: Vec<f64> = probes(&report)
            .iter()
            .filter_map(|p| {
                let ttfp = p["ttfp_seconds"].as_f64()?;
                let want = truth_ttfp(
                    &truth,
                    p["source"]["uid"].as_str()?,
                    p["target"]["uid"].as_str()?,
                )?;
                Some(ttfp - want)
            })
            .collect();
        let s = stats(&errs);
        t.row(vec![
            interval.into(),
            errs.len().to_string(),
            ms(s[1]),
            ms(s[2]),
            ms(s[3]),
            ms(s[4]),
        ]);
        let dial = humantime::parse_duration(interval).map_or(0.1, |d| d.as_secs_f64());
        if s[4] < -0.05 || s[2] > dial + 0.05 {
            t.notes.push(format!(
                "{interval}: error outside [−50 ms, interval + 50 ms] (p95 {:+.0} ms, min {:+.0} ms)",
                s[2] * 1e3,
                s[4] * 1e3
            ));
        }
        if interval == "100ms" {
            t.notes.push(format!(
                "default 100 ms: p95 error {:+.0} ms ≤ 100 ms: {}",
                s[2] * 1e3,
                if s[2] <= 0.1 { "met" } else { "**not met**" }
            ));
        }
    }
    t
}

/// Long-lived pods probing each other (every ordered cross-node pair) every 5 s until
/// `stop`; returns (checks, failed checks).
fn mesh_round_robin(ll: &[LongLived], stop: Arc<AtomicBool>) -> Vec<JoinHandle<(u32, u32)>> {
    ll.iter()
        .map(|me| {
            let me = me.clone();
            let peers: Vec<String> = ll
                .iter()
                .filter(|p| p.node != me.node)
                .map(|p| p.ip.clone())
                .collect();
            let stop = stop.clone();
            std::thread::spawn(move || {
                if enter_netns_of(me.pid).is_err() {
                    return (0, 0);
                }
                let (mut checks, mut failed) = (0, 0);
                let t0 = Instant::now();
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for ip in &peers {
                        checks += 1;
                        if !http_ok(ip, Duration::from_secs(1)) {
                            failed += 1;
                        }
                    }
                    k += 1;
                    let next = t0 + Duration::from_secs(5 * k);
                    while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                (checks, failed)
            })
        })
        .collect()
}

fn mesh(tb: &Testbed, ll: &[LongLived], opts: &Opts) -> Table {
    // S3 needs a recreate probe whose target lands on node-2: one per node at least.
    let pairs = if opts.smoke { NODES } else { 2 * NODES };
    // S2's slow endpoints come after 15–42 s: the full run waits for them (slow probes);
    // the smoke run gives up after 20 s (failed probes), which is quicker.
    let s2_give_up = if opts.smoke { "20s" } else { "60s" };
    let mut t = Table::new(
        MESH,
        &format!(
            "During each scenario, the long-lived pods (one per node, up since before it) \
             `GET /` each other (every cross-node pair, 1 s timeout) every 5 s, as a \
             Goldpinger/kubenurse-style mesh does; firstpacket runs one gate in the same \
             window (S2: `--kinds cross_node --pairs {pairs} --give-up {s2_give_up}`; S3: `--kinds \
             recreate,cross_node --pairs {pairs} --give-up 10s`). S2: new endpoints on \
             node-2 (label os=debian13) are programmed only after 15–42 s (apply loop). S3: a \
             pod recreated on node-2 under its old name loses its route (name-reuse race). \
             *Failure share* = failed checks / checks (mesh) and probes not `success` / probes \
             (firstpacket)."
        ),
        &["scenario", "method", "checks", "failed", "failure share"],
    );
    let s2 = std::fs::read_to_string(crate::common::repo_file(
        "testbed/faults/s2-apply-loop.yaml",
    ))
    .expect("S2 fault");
    let s3 = std::fs::read_to_string(crate::common::repo_file(
        "testbed/faults/s3-name-reuse.yaml",
    ))
    .expect("S3 fault");
    let pairs_s = pairs.to_string();
    let runs: [(&str, &str, Vec<&str>); 2] = [
        (
            "S2 apply loop",
            &s2,
            vec![
                "--kinds",
                "cross_node",
                "--pairs",
                &pairs_s,
                "--give-up",
                s2_give_up,
            ],
        ),
        (
            "S3 name reuse",
            &s3,
            vec![
                "--kinds",
                "recreate,cross_node",
                "--pairs",
                &pairs_s,
                "--give-up",
                "10s",
                "--hold",
                "1s",
            ],
        ),
    ];
    for (name, fault, args) in runs {
        eprintln!("mesh: {name}");
        tb.set_fault(fault);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = mesh_round_robin(ll, stop.clone());
        let (code, report, text) = tb.gate(&args);
        stop.store(true, Ordering::Relaxed);
        assert!(code == 0 || code == 1, "gate exit {code}:\n{text}");
        let (mut checks, mut failed) = (0, 0);
        for th in threads {
            let (c, f) = th.join().unwrap_or((0, 0));
            checks += c;
            failed += f;
        }
        let ps = probes(&report);
        let bad = ps.iter().filter(|p| p["result"] != "success").count();
        let share = |f: usize, n: usize| {
            if n == 0 {
                "n/a".to_owned()
            } else {
                format!("{:.0} %", 100.0 * f as f64 / n as f64)
            }
        };
        t.row(vec![
            name.into(),
            "long-lived mesh, 5 s".into(),
            checks.to_string(),
            failed.to_string(),
            share(failed as usize, checks as usize),
        ]);
        t.row(vec![
            name.into(),
            "firstpacket gate".into(),
            ps.len().to_string(),
            bad.to_string(),
            share(bad, ps.len()),
        ]);
    }
    t
}
