//! Scale: the prober at 10, 100 and 1 000 nodes (hollow beyond the netns ones), its API
//! cost per probe and per hour, its start-up with direct agent scrapes failing, the
//! gate's wall time to cover every node, and `prober run`'s lap time (issue 17).
//!
//! Every testbed runs on the real control plane when its binaries are built
//! (`bash scripts/control-plane.sh`): only it keeps an audit log, which is where the API
//! numbers come from. Without it the API cells say so.
//!
//! Knobs for partial runs (environment): `FP_BENCH_SCALE_SIZES` (comma list of node
//! counts, default `10,100,1000`, smoke `10`: one size shows every table complete),
//! `FP_BENCH_SCALE_RUN_SECS` (length of each `prober run`, default 600, smoke 15),
//! `FP_BENCH_SCALE_NETNS` (netns nodes of the gate wall-time table, default 10, smoke 3),
//! `FP_BENCH_SCALE_GRID=0` (skip the extra `prober run` grid points),
//! `FP_BENCH_SCALE_DEBUG=1` (print each audit window and any repeated deletes).
use super::{mib, proc_cpu_seconds, proc_kib, Opts, Table};
use crate::common::{self, Testbed};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const FOOTPRINT: &str = "Prober footprint vs node count";
pub const API: &str = "Prober API requests per probe";
pub const STARTUP: &str = "Start-up to the first probe with direct agent scrapes failing";
pub const GATE_WALL: &str = "Gate wall time to cover every node";
pub const RUN_GRID: &str = "prober run: lap time and API writes per hour";

/// Titles of the tables [`run`] returns.
pub const TITLES: &[&str] = &[FOOTPRINT, API, STARTUP, GATE_WALL, RUN_GRID];

/// What an API cell says on the built-in control plane (no audit log).
const NEEDS_REAL: &str = "needs --control-plane real";

/// The TTFP hollow sources are given (`testbed up --hollow-ttfp`).
const HOLLOW_TTFP: &str = "1500ms";
const HOLLOW_SELECTOR: &str = "testbed.firstpacket.io/hollow=true";
/// Healthy netns nodes with a visible delay (endpoints programmed after 300 ms).
const HEALTHY: &str = "rules:\n  - nodes: {all: true}\n    program_delay: 300ms\n";
/// The user `testbed exec`'s kubeconfig carries on the real control plane (the prober
/// and the harness's `kubectl` share it; `kubectl`'s requests are told apart by their
/// `userAgent`).
const EXEC_USER: &str = "firstpacket-admin";
const LEADER_LEASE: &str = "firstpacket-leader";
/// Design budgets (docs/design.md §7).
const RSS_TARGET_MIB: f64 = 40.0;
const WRITES_PER_PROBE_TARGET: f64 = 4.0;
const STARTUP_TARGET_S: f64 = 10.0;
const GATE_100_TARGET_S: f64 = 180.0;
const GATE_CONCURRENCY: usize = 16;
/// Per-hour budgets of the writes counted apart from the probes'.
const INSTANCE_LEASE_PER_H: f64 = 3600.0 / 5.0; // renewed every 5 s
const LEADER_LEASE_PER_H: f64 = 3600.0 / 2.0; // --leader-elect-retry-period 2s
const EVENTS_PER_NODE_H: f64 = 24.0;

fn env_num(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// What this run measures.
struct Plan {
    sizes: Vec<usize>,
    gate_pairs: usize,
    run_secs: u64,
    run_interval: &'static str,
    run_concurrency: usize,
    netns: usize,
    /// Extra `prober run` points (interval, concurrency, seconds) on the testbed of
    /// `grid_size` nodes.
    grid: Vec<(&'static str, usize, u64)>,
    grid_size: usize,
    real: bool,
}

impl Plan {
    fn new(opts: &Opts) -> Plan {
        let sizes = std::env::var("FP_BENCH_SCALE_SIZES")
            .ok()
            .map(|v| {
                v.split(',')
                    .filter_map(|s| s.trim().parse().ok())
                    .filter(|n| *n >= 3)
                    .collect::<Vec<usize>>()
            })
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| {
                if opts.smoke {
                    vec![10]
                } else {
                    vec![10, 100, 1000]
                }
            });
        let grid_size = if sizes.contains(&100) {
            100
        } else {
            *sizes.iter().max().unwrap()
        };
        let grid = if opts.smoke || env_num("FP_BENCH_SCALE_GRID") == Some(0) {
            Vec::new()
        } else {
            vec![("1s", 8, 120), ("30s", 2, 240)]
        };
        Plan {
            sizes,
            gate_pairs: if opts.smoke { 10 } else { 20 },
            run_secs: env_num("FP_BENCH_SCALE_RUN_SECS").unwrap_or(if opts.smoke {
                15
            } else {
                600
            }),
            run_interval: if opts.smoke { "1s" } else { "2s" },
            run_concurrency: if opts.smoke { 4 } else { 2 },
            netns: env_num("FP_BENCH_SCALE_NETNS")
                .map(|n| n as usize)
                .unwrap_or(if opts.smoke { 3 } else { 10 })
                .max(2),
            grid,
            grid_size,
            real: nix::unistd::Uid::effective().is_root()
                && testbed::control_plane::locate_binaries(None).is_ok(),
        }
    }

    fn control_plane(&self) -> &'static str {
        if self.real {
            "real (kube-apiserver + etcd)"
        } else {
            "built-in"
        }
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn rfc3339_unix(s: &str) -> Option<f64> {
    let ts: k8s_openapi::jiff::Timestamp = s.parse().ok()?;
    Some(ts.as_microsecond() as f64 / 1e6)
}

fn f1(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.1}")
    }
}

fn f2(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.2}")
    }
}

fn f0(x: f64) -> String {
    if x.is_nan() {
        "n/a".into()
    } else {
        format!("{x:.0}")
    }
}

/// A child process (`testbed exec -- prober …`, the same pid as the prober: `testbed
/// exec` and `ip netns exec` exec in place) that is stopped when the guard drops, also
/// on panic: SIGTERM, up to 30 s for the prober's own cleanup, then SIGKILL to its
/// process group.
struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM and wait (≤ 30 s, then SIGKILL); returns the exit code.
    fn stop(&mut self) -> Option<i32> {
        if let Ok(Some(s)) = self.child.try_wait() {
            return s.code();
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `Z`, …); `None` when gone.
fn proc_state(pid: u32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text[text.rfind(')')? + 1..].trim_start().chars().next()
}

/// The memory and CPU of a process, sampled from `/proc`.
#[derive(Default, Clone, Copy)]
struct Usage {
    rss_kib: u64,
    hwm_kib: u64,
    cpu_s: f64,
}

impl Usage {
    fn sample(&mut self, pid: u32) {
        if let Some(r) = proc_kib(pid, "VmRSS") {
            self.rss_kib = r;
        }
        if let Some(h) = proc_kib(pid, "VmHWM") {
            self.hwm_kib = self.hwm_kib.max(h);
        }
        if let Some(c) = proc_cpu_seconds(pid) {
            self.cpu_s = self.cpu_s.max(c);
        }
    }
}

// ---------------------------------------------------------------------------------
// The audit log.

/// The prober's requests of one time window, from kube-apiserver's audit log.
#[derive(Default)]
struct ApiUse {
    /// (verb, resource[/subresource]) → completed requests.
    by: BTreeMap<(String, String), u64>,
    /// Watch requests started in the window (auditIDs).
    watches: u64,
    /// Watches open at the window's `open_at` instant.
    watches_open: u64,
    /// Pod and Service writes; of them received at or after `open_at` (a run's SIGTERM:
    /// the shutdown's cancellations and final sweep).
    probe_writes: u64,
    probe_writes_shutdown: u64,
    /// Pod and Service writes answered ≥ 400, and deletes of an object already deleted
    /// once in the window.
    probe_writes_failed: u64,
    repeated_deletes: u64,
    events: Writes,
    instance_lease: Writes,
    leader_lease: Writes,
    configmaps: Writes,
    other_writes: u64,
}

/// Writes of one purpose: creates and deletes (one-offs) apart from updates and patches
/// (renewals, saves).
#[derive(Default, Clone, Copy)]
struct Writes {
    create_delete: u64,
    update: u64,
}

impl Writes {
    fn total(&self) -> u64 {
        self.create_delete + self.update
    }

    fn add(&mut self, verb: &str) {
        if verb == "update" || verb == "patch" {
            self.update += 1;
        } else {
            self.create_delete += 1;
        }
    }

    /// `N (c create/delete + u update/patch; x/h)`, x the per-hour rate of all of them.
    fn cell(&self, secs: f64) -> String {
        format!(
            "{} ({} create/delete + {} update/patch; {:.0}/h)",
            self.total(),
            self.create_delete,
            self.update,
            self.total() as f64 * 3600.0 / secs
        )
    }
}

const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

fn is_prober(e: &Value) -> bool {
    e["user"]["username"] == EXEC_USER
        && !e["userAgent"].as_str().unwrap_or("").starts_with("kubectl")
}

/// The audit log's events of user [`EXEC_USER`], read line by line and parsed only
/// when the line names that user ([`Testbed::audit_events`] parses every line, and
/// hollow nodes' Lease renewals make the log large: about 100 requests per second at
/// 1 000 nodes).
fn prober_audit_events(tb: &Testbed) -> Vec<Value> {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open(tb.state.join("control-plane/audit.log")) else {
        return Vec::new();
    };
    let needle = format!("\"username\":\"{EXEC_USER}\"");
    std::io::BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter(|l| l.contains(&needle))
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

/// The prober's requests received in `[t0, t1]` (Unix seconds): completed ones by verb
/// and resource, writes by purpose, watch requests; `open_at`: the instant at which open
/// watches are counted (started by then, not completed by then).
fn api_use(tb: &Testbed, t0: f64, t1: f64, open_at: f64) -> ApiUse {
    // The audit log backend writes each event as the request passes a stage; give the
    // last ones a moment.
    std::thread::sleep(Duration::from_millis(500));
    let mut u = ApiUse::default();
    let mut watch_started: BTreeMap<String, f64> = BTreeMap::new();
    let mut watch_done: BTreeMap<String, f64> = BTreeMap::new();
    let mut deleted: BTreeMap<String, u64> = BTreeMap::new();
    for e in prober_audit_events(tb) {
        if !is_prober(&e) {
            continue;
        }
        let Some(received) = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(rfc3339_unix)
        else {
            continue;
        };
        if received < t0 || received > t1 {
            continue;
        }
        let verb = e["verb"].as_str().unwrap_or("").to_owned();
        let stage = e["stage"].as_str().unwrap_or("");
        let at = e["stageTimestamp"]
            .as_str()
            .and_then(rfc3339_unix)
            .unwrap_or(received);
        let id = e["auditID"].as_str().unwrap_or("").to_owned();
        if verb == "watch" {
            match stage {
                "ResponseStarted" => {
                    watch_started.insert(id.clone(), at);
                }
                "ResponseComplete" | "Panic" => {
                    watch_started.entry(id.clone()).or_insert(received);
                    watch_done.insert(id.clone(), at);
                }
                _ => {}
            }
        }
        if stage != "ResponseComplete" {
            continue;
        }
        let o = &e["objectRef"];
        let mut resource = o["resource"].as_str().unwrap_or("(none)").to_owned();
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        *u.by.entry((verb.clone(), resource.clone())).or_default() += 1;
        if !WRITE_VERBS.contains(&verb.as_str()) {
            continue;
        }
        let name = o["name"].as_str().unwrap_or("");
        match resource.as_str() {
            "events" => u.events.add(&verb),
            "leases" if name == LEADER_LEASE => u.leader_lease.add(&verb),
            "leases" => u.instance_lease.add(&verb),
            "configmaps" => u.configmaps.add(&verb),
            r if r.starts_with("pods") || r.starts_with("services") => {
                if verb == "delete" {
                    *deleted.entry(format!("{r}/{name}")).or_default() += 1;
                }
                if e["responseStatus"]["code"].as_u64().unwrap_or(0) >= 400 {
                    u.probe_writes_failed += 1;
                }
                u.probe_writes += 1;
                if received >= open_at {
                    u.probe_writes_shutdown += 1;
                }
            }
            _ => u.other_writes += 1,
        }
    }
    u.repeated_deletes = deleted.values().map(|n| n - 1).sum();
    if std::env::var_os("FP_BENCH_SCALE_DEBUG").is_some() {
        let dups: Vec<_> = deleted.iter().filter(|(_, n)| **n > 1).take(5).collect();
        eprintln!("scale debug: window {t0:.3}..{t1:.3}, repeated deletes {dups:?}");
    }
    u.watches = watch_started.len() as u64;
    u.watches_open = watch_started
        .iter()
        .filter(|(id, s)| **s <= open_at && watch_done.get(*id).is_none_or(|d| *d > open_at))
        .count() as u64;
    u
}

impl ApiUse {
    /// `verb resource n/probe` for every (verb, resource), most first.
    fn per_probe(&self, probes: f64) -> String {
        let mut v: Vec<(&(String, String), &u64)> = self.by.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .map(|((verb, res), n)| format!("{verb} {res} {:.2}", **n as f64 / probes))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn total(&self) -> u64 {
        self.by.values().sum()
    }
}

// ---------------------------------------------------------------------------------
// Testbeds and prober processes.

/// `testbed up --nodes 1 --hollow-nodes N-1 --hollow-ttfp 1500ms [--control-plane real]
/// EXTRA…`, then waits until all N Nodes are Ready.
fn up_hollow(plan: &Plan, name: &str, nodes: usize, extra: &[&str]) -> Testbed {
    common::bin("prober");
    common::bin("target-server");
    let state = std::env::temp_dir().join(format!("fp-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).expect("state dir");
    let tb = Testbed { state };
    let mut up = tb.cmd();
    up.args(["up", "--nodes", "1"])
        .args(["--hollow-nodes", &(nodes - 1).to_string()])
        .args(["--hollow-ttfp", HOLLOW_TTFP])
        .args(extra)
        .arg("--image-dir")
        .arg(tb.state.join("no-images"));
    if plan.real {
        up.args(["--control-plane", "real"]);
    }
    let t = Instant::now();
    let out = common::output_within(up, common::command_timeout());
    assert!(
        out.status.success(),
        "testbed up failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ready = || {
        tb.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ])
        .lines()
        .filter(|l| l.trim() == "True")
        .count()
    };
    let got = common::poll_until(Duration::from_secs(180), ready, |n| *n >= nodes);
    assert!(got >= nodes, "{got} of {nodes} Nodes Ready after 180 s");
    eprintln!(
        "scale: testbed up with {nodes} nodes (1 netns + {} hollow{}): {:.1}s",
        nodes - 1,
        if extra.is_empty() {
            String::new()
        } else {
            format!(", {}", extra.join(" "))
        },
        t.elapsed().as_secs_f64()
    );
    tb
}

/// One `prober gate` measured from outside.
struct GateRun {
    code: i32,
    report: Value,
    wall: f64,
    usage: Usage,
    t0: f64,
    t1: f64,
}

impl GateRun {
    fn probes(&self) -> Vec<Value> {
        self.report["probes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// First probe start − command start (s).
    fn startup(&self) -> f64 {
        let first = self
            .probes()
            .iter()
            .map(common::started_unix)
            .fold(f64::INFINITY, f64::min);
        if first.is_finite() {
            first - self.t0
        } else {
            f64::NAN
        }
    }

    /// Agent scrapes (ok + failed, every profile) of the report.
    fn scrapes(&self) -> u64 {
        self.report["agents"]["profiles"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(_, p)| {
                p["scrapes_ok"].as_u64().unwrap_or(0) + p["scrapes_failed"].as_u64().unwrap_or(0)
            })
            .sum()
    }

    fn felix(&self, field: &str) -> String {
        self.report["agents"]["profiles"]["calico-felix"][field]
            .as_u64()
            .map_or_else(|| "n/a".into(), |n| n.to_string())
    }
}

/// `testbed exec -- prober gate --report R ARGS…`, sampling the process's `/proc`
/// every 50 ms until it exits (VmHWM is the high-water mark, CPU the last reading, taken
/// from the zombie before it is reaped).
fn measure_gate(tb: &Testbed, args: &[&str]) -> GateRun {
    let report = tb
        .state
        .join(format!("scale-gate-{}.json", common::rand_suffix()));
    let log = tb
        .state
        .join(format!("scale-gate-{}.log", common::rand_suffix()));
    let t0 = now_unix();
    let start = Instant::now();
    let child = tb
        .cmd()
        .args(["exec", "--", "prober", "gate", "--report"])
        .arg(&report)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(&log).expect("log")))
        .stderr(Stdio::from(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&log)
                .expect("log"),
        ))
        .process_group(0)
        .spawn()
        .expect("spawn prober gate");
    let mut g = ChildGuard { child };
    let pid = g.pid();
    let mut usage = Usage::default();
    let timeout = common::command_timeout() * 2;
    loop {
        match proc_state(pid) {
            None => break,
            Some('Z') => {
                if let Some(c) = proc_cpu_seconds(pid) {
                    usage.cpu_s = usage.cpu_s.max(c);
                }
                break;
            }
            _ => usage.sample(pid),
        }
        assert!(
            start.elapsed() < timeout,
            "prober gate {args:?} still running after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let code = g.child.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
    let wall = start.elapsed().as_secs_f64();
    let t1 = now_unix();
    let text = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "prober gate {args:?}: no report ({e}); output:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let _ = std::fs::remove_file(&report);
    GateRun {
        code,
        report: serde_json::from_str(&text).expect("report JSON"),
        wall,
        usage,
        t0,
        t1,
    }
}

/// The samples of a `/metrics` page as (name, labels, value), read with the prober's own
/// exposition parser (`prober::agents::expo`); an unparsable page gives none.
fn parse_metrics(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let Ok(page) = prober::agents::expo::parse(text) else {
        return Vec::new();
    };
    page.families
        .values()
        .flat_map(|f| f.samples.iter())
        .map(|s| {
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (s.name.to_string(), labels, s.value)
        })
        .collect()
}

fn metric_sum(m: &[(String, BTreeMap<String, String>, f64)], name: &str) -> f64 {
    let v: Vec<f64> = m.iter().filter(|s| s.0 == name).map(|s| s.2).collect();
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum()
    }
}

/// One `prober run` measured from outside.
struct RunResult {
    nodes: usize,
    interval: &'static str,
    concurrency: usize,
    secs: f64,
    probes: f64,
    usage: Usage,
    scrapes: f64,
    lap: f64,
    lap_expected: f64,
    startup: f64,
    api: Option<ApiUse>,
}

fn admin_port() -> u16 {
    20_000 + ((std::process::id() as usize * 7 + common::rand_suffix() * 131) % 20_000) as u16
}

/// `testbed exec -- prober run --leader-elect --node-selector HOLLOW --kinds
/// cross_node,same_node --probe-interval I --concurrency C --hold 1s --give-up 20s
/// --admin-addr … --log-format json` for `secs` seconds, then SIGTERM.
fn measure_run(
    plan: &Plan,
    tb: &Testbed,
    nodes: usize,
    interval: &'static str,
    concurrency: usize,
    secs: u64,
) -> RunResult {
    let addr = format!("127.0.0.1:{}", admin_port());
    let base = format!("http://{addr}");
    let log = tb
        .state
        .join(format!("scale-run-{}.log", common::rand_suffix()));
    let conc = concurrency.to_string();
    let t0 = now_unix();
    let start = Instant::now();
    let child = tb
        .cmd()
        .args([
            "exec",
            "--",
            "prober",
            "run",
            "--leader-elect",
            "--node-selector",
            HOLLOW_SELECTOR,
            "--kinds",
            "cross_node,same_node",
            "--probe-interval",
            interval,
            "--concurrency",
            &conc,
            "--hold",
            "1s",
            "--give-up",
            "20s",
            "--admin-addr",
            &addr,
            "--log-format",
            "json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).expect("log")))
        .process_group(0)
        .spawn()
        .expect("spawn prober run");
    let mut g = ChildGuard { child };
    let pid = g.pid();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    common::wait_ready(tb, &base, &mut g.child, &logs);
    let mut usage = Usage::default();
    let mut startup = f64::NAN;
    let mut last_note = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        usage.sample(pid);
        assert!(
            g.child.try_wait().ok().flatten().is_none(),
            "prober run exited early\n{}",
            logs()
        );
        if startup.is_nan() {
            if let Some(page) = common::curl(tb, &format!("{base}/api/v1/probes")) {
                let v: Value = serde_json::from_str(&page).unwrap_or(Value::Null);
                let first = v["probes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["timeline"]["started_at"].as_str().and_then(rfc3339_unix))
                    .fold(f64::INFINITY, f64::min);
                if first.is_finite() {
                    startup = first - t0;
                }
            }
        }
        if last_note.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "scale: prober run on {nodes} nodes: {:.0}/{secs} s, RSS {} MiB",
                start.elapsed().as_secs_f64(),
                mib(usage.rss_kib)
            );
            last_note = Instant::now();
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    usage.sample(pid);
    let metrics = common::curl(tb, &format!("{base}/metrics")).unwrap_or_default();
    let m = parse_metrics(&metrics);
    let open_at = now_unix();
    let code = g.stop();
    let t1 = now_unix();
    let elapsed = start.elapsed().as_secs_f64();
    let text = logs();
    let done = text
        .lines()
        .filter(|l| l.contains("\"probe done\""))
        .count() as f64;
    assert!(
        code == Some(0),
        "prober run exit {code:?} after SIGTERM\n{}",
        text.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
    let probes = if done > 0.0 {
        done
    } else {
        metric_sum(&m, "firstpacket_probes_total")
    };
    let api = plan.real.then(|| api_use(tb, t0, t1, open_at));
    eprintln!(
        "scale: prober run on {nodes} nodes, interval {interval}, concurrency {concurrency}: {probes} probes in {elapsed:.0}s"
    );
    RunResult {
        nodes,
        interval,
        concurrency,
        secs: elapsed,
        probes,
        usage,
        scrapes: metric_sum(&m, "firstpacket_agent_scrapes_total"),
        lap: metric_sum(&m, "firstpacket_lap_seconds"),
        lap_expected: metric_sum(&m, "firstpacket_lap_expected_seconds"),
        startup,
        api,
    }
}

/// The probe namespace's leftover probe pods gone (the gate deletes its own; a pod being
/// terminated may still be listed a moment).
fn wait_clean(tb: &Testbed) {
    let left = tb.wait_no_probe_pods(common::POD_GONE_TIMEOUT);
    assert!(left.is_empty(), "probe pods left: {left:?}");
}

// ---------------------------------------------------------------------------------
// The section.

/// One gate row of the footprint and API tables.
struct GateRow {
    nodes: usize,
    kind: &'static str,
    gate: GateRun,
    api: Option<ApiUse>,
}

pub fn run(opts: &Opts) -> Vec<Table> {
    let plan = Plan::new(opts);
    let cp = plan.control_plane();
    eprintln!(
        "scale: sizes {:?}, control plane {cp}, prober run {} s per point",
        plan.sizes, plan.run_secs
    );
    let pairs = plan.gate_pairs.to_string();
    let mut gates: Vec<GateRow> = Vec::new();
    let mut runs: Vec<RunResult> = Vec::new();

    for &n in &plan.sizes {
        let tb = up_hollow(&plan, &format!("scale-{n}"), n, &[]);
        for kind in ["cross_node", "same_node"] {
            eprintln!("scale: gate --kinds {kind} --pairs {pairs} on {n} nodes");
            let gate = measure_gate(
                &tb,
                &[
                    "--node-selector",
                    HOLLOW_SELECTOR,
                    "--kinds",
                    kind,
                    "--pairs",
                    &pairs,
                    "--concurrency",
                    "16",
                    "--hold",
                    "1s",
                ],
            );
            let api = plan.real.then(|| api_use(&tb, gate.t0, gate.t1, gate.t1));
            eprintln!(
                "scale: gate {kind} on {n} nodes: exit {}, {:.1}s, VmHWM {} MiB",
                gate.code,
                gate.wall,
                mib(gate.usage.hwm_kib)
            );
            gates.push(GateRow {
                nodes: n,
                kind,
                gate,
                api,
            });
            wait_clean(&tb);
        }
        eprintln!("scale: prober run for {} s on {n} nodes", plan.run_secs);
        runs.push(measure_run(
            &plan,
            &tb,
            n,
            plan.run_interval,
            plan.run_concurrency,
            plan.run_secs,
        ));
        if n == plan.grid_size {
            for &(interval, conc, secs) in &plan.grid {
                eprintln!(
                    "scale: prober run grid point {interval}/{conc} for {secs} s on {n} nodes"
                );
                runs.push(measure_run(&plan, &tb, n, interval, conc, secs));
            }
        }
        wait_clean(&tb);
        drop(tb);
    }

    // Start-up with every direct scrape unanswered, at the largest size.
    let big = *plan.sizes.iter().max().unwrap();
    let (startup_gate, startup_run) = {
        let tb = up_hollow(
            &plan,
            &format!("scale-startup-{big}"),
            big,
            &["--hollow-direct-scrapes", "hold"],
        );
        eprintln!("scale: start-up gate on {big} nodes, direct scrapes failing");
        let gate = measure_gate(
            &tb,
            &[
                "--node-selector",
                HOLLOW_SELECTOR,
                "--pairs",
                "16",
                "--concurrency",
                "16",
                "--hold",
                "1s",
            ],
        );
        wait_clean(&tb);
        eprintln!("scale: start-up prober run on {big} nodes, direct scrapes failing");
        let run = measure_run(&plan, &tb, big, "2s", 2, 25);
        wait_clean(&tb);
        (gate, run)
    };

    // Gate wall time over netns nodes.
    let netns_gate = {
        let n = plan.netns;
        let mut extra: Vec<&str> = Vec::new();
        if plan.real {
            extra.extend(["--control-plane", "real"]);
        }
        let t = Instant::now();
        let tb = Testbed::up(&format!("scale-netns-{n}"), n, HEALTHY, &extra);
        eprintln!(
            "scale: testbed up with {n} netns nodes: {:.1}s; gate --pairs {n} --concurrency 16",
            t.elapsed().as_secs_f64()
        );
        let pairs = n.to_string();
        let gate = measure_gate(&tb, &["--pairs", &pairs, "--concurrency", "16"]);
        wait_clean(&tb);
        gate
    };

    vec![
        footprint_table(&plan, &gates, &runs),
        api_table(&plan, &gates, &runs),
        startup_table(&plan, &startup_gate, &startup_run),
        gate_wall_table(&plan, &netns_gate, &gates),
        run_grid_table(&plan, &runs),
    ]
}

fn footprint_table(plan: &Plan, gates: &[GateRow], runs: &[RunResult]) -> Table {
    let method = format!(
        "Each node count N is one testbed on the {cp} control plane: `testbed up --nodes 1 \
         --hollow-nodes N−1 --hollow-ttfp {HOLLOW_TTFP}` (one netns node, the rest hollow \
         Nodes that live only in the API, each with a calico-node and a kube-proxy pod \
         whose metrics pages answer). The prober probes the hollow nodes only (mixed \
         hollow/netns pairs cannot pass packets) but lists, watches and sweeps all N. \
         **gate** rows: `testbed exec -- prober gate --node-selector {HOLLOW_SELECTOR} \
         --kinds KIND --pairs {pairs} --concurrency 16 --hold 1s --report R`; the bench \
         reads the process's `/proc/PID/status` and `/proc/PID/stat` every 50 ms while it \
         runs (`testbed exec` and `ip netns exec` exec in place, so the child's pid is the \
         prober's): VmRSS is the last reading before exit, VmHWM the peak resident set, \
         CPU user+system seconds read from the exited process before it is reaped; wall is \
         spawn to exit; start-up is the first probe's `timeline.started_at` minus the \
         spawn time; agent scrapes are `scrapes_ok + scrapes_failed` summed over the \
         report's `agents.profiles`. **run** rows: `testbed exec -- prober run \
         --leader-elect --node-selector {HOLLOW_SELECTOR} --kinds cross_node,same_node \
         --probe-interval {iv} --concurrency {c} --hold 1s --give-up 20s --admin-addr … \
         --log-format json` for {secs} s (RSS sampled every 2 s, then `/metrics` read and \
         SIGTERM); probes are its `probe done` log events, agent scrapes the sum of \
         `firstpacket_agent_scrapes_total`, start-up the first record's `started_at` \
         (`/api/v1/probes`) minus the spawn time. CPU per probe divides the process's \
         whole CPU time (start-up, node watch, agent sweeps included) by its probes. \
         Binaries: the {profile} build beside the bench (`cargo bench` uses release ones; \
         the `bench_smoke` test debug ones, whose RSS and CPU are higher).",
        profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        cp = plan.control_plane(),
        pairs = plan.gate_pairs,
        iv = plan.run_interval,
        c = plan.run_concurrency,
        secs = plan.run_secs,
    );
    let mut t = Table::new(
        FOOTPRINT,
        &method,
        &[
            "nodes",
            "mode",
            "probes",
            "wall s",
            "start-up s",
            "VmRSS MiB",
            "VmHWM MiB",
            "CPU s",
            "CPU ms/probe",
            "agent scrapes/probe",
        ],
    );
    for g in gates {
        let probes = g.gate.probes().len() as f64;
        t.row(vec![
            g.nodes.to_string(),
            format!("gate {} (exit {})", g.kind, g.gate.code),
            f0(probes),
            f1(g.gate.wall),
            f1(g.gate.startup()),
            mib(g.gate.usage.rss_kib),
            mib(g.gate.usage.hwm_kib),
            f2(g.gate.usage.cpu_s),
            f0(g.gate.usage.cpu_s * 1000.0 / probes),
            f2(g.gate.scrapes() as f64 / probes),
        ]);
    }
    for r in runs
        .iter()
        .filter(|r| r.interval == plan.run_interval && r.concurrency == plan.run_concurrency)
    {
        t.row(vec![
            r.nodes.to_string(),
            format!("run {} s", f0(r.secs)),
            f0(r.probes),
            f1(r.secs),
            f1(r.startup),
            mib(r.usage.rss_kib),
            mib(r.usage.hwm_kib),
            f2(r.usage.cpu_s),
            f0(r.usage.cpu_s * 1000.0 / r.probes),
            f2(r.scrapes / r.probes),
        ]);
    }
    let big = *plan.sizes.iter().max().unwrap();
    let hwm = gates
        .iter()
        .filter(|g| g.nodes == big)
        .map(|g| g.gate.usage.hwm_kib)
        .chain(
            runs.iter()
                .filter(|r| r.nodes == big)
                .map(|r| r.usage.hwm_kib),
        )
        .max()
        .unwrap_or(0);
    let hwm_mib = hwm as f64 / 1024.0;
    if big >= 1000 {
        t.notes.push(format!(
            "Design target prober RSS ≤ {RSS_TARGET_MIB:.0} MiB at 1 000 nodes: **{}** \
             (peak VmHWM {hwm_mib:.1} MiB at {big} nodes, gate and run).",
            if hwm_mib <= RSS_TARGET_MIB {
                "met"
            } else {
                "not met"
            }
        ));
    } else {
        t.notes.push(format!(
            "Design target prober RSS ≤ {RSS_TARGET_MIB:.0} MiB at 1 000 nodes: not judged \
             (largest size here {big} nodes; peak VmHWM {hwm_mib:.1} MiB there).",
        ));
    }
    let per_node: Vec<String> = plan
        .sizes
        .iter()
        .map(|n| {
            let h = gates
                .iter()
                .filter(|g| g.nodes == *n && g.kind == "cross_node")
                .map(|g| g.gate.usage.hwm_kib)
                .max()
                .unwrap_or(0);
            format!("{n} nodes {} MiB", mib(h))
        })
        .collect();
    t.notes.push(format!(
        "Gate peak RSS (cross_node) by node count: {}.",
        per_node.join(", ")
    ));
    t
}

fn api_table(plan: &Plan, gates: &[GateRow], runs: &[RunResult]) -> Table {
    let method = format!(
        "The same gates and runs as in *{FOOTPRINT}*. On the real control plane \
         kube-apiserver writes an audit log (level Metadata, `$STATE_DIR/control-plane/\
         audit.log`); the prober's requests are the events of user `{EXEC_USER}` (the \
         identity of `testbed exec`'s kubeconfig) whose `userAgent` is not `kubectl/…` \
         (the harness's own kubectl calls) and whose `requestReceivedTimestamp` lies \
         between the prober's spawn and its exit (the steps run one after another, so \
         the windows do not overlap). Requests are counted once, at stage \
         `ResponseComplete`, grouped by `verb` and `objectRef.resource[/subresource]`, \
         divided by the probes. Refused = probe writes answered with a code ≥ 400; \
         repeated deletes = deletes of a pod or Service already deleted once in the \
         window. Watches: the distinct `auditID`s of `watch` requests (a watch logs \
         ResponseStarted when it opens); \"open\" counts the watches started \
         and not completed at the gate's exit (none: they close with it) or, for a run, \
         just before its SIGTERM. Writes (`create`/`update`/`patch`/`delete`/\
         `deletecollection`) are split by purpose: probe writes = pods and services; \
         Events; the instance Lease (`firstpacket-<instance>`; created, renewed every 5 s, \
         deleted); the leader Lease (`{LEADER_LEASE}`, `--leader-elect`, renewed every 2 s); \
         baseline ConfigMaps; others (e.g. the namespace, created once). For a run, probe \
         writes per probe count those received before its SIGTERM (the writes after it — \
         in-flight probes cancelled, the final sweep of the instance's pods — are shown \
         apart, per probe), and each other purpose shows its creates/deletes apart from \
         its updates/patches and the rate of all of them per hour of the run's wall time \
         (short runs inflate the rate of the one-off creates and deletes). Control plane: \
         {cp}.",
        cp = plan.control_plane()
    );
    let mut t = Table::new(
        API,
        &method,
        &[
            "nodes",
            "mode",
            "probes",
            "requests/probe by verb and resource",
            "all requests/probe",
            "watch requests (open)",
            "probe writes/probe",
            "probe writes refused / repeated deletes",
            "Events",
            "instance Lease writes",
            "leader Lease writes",
            "baseline ConfigMap writes",
            "other writes",
        ],
    );
    let mut writes_by_kind: BTreeMap<&str, f64> = BTreeMap::new();
    let mut watches_by_size: BTreeMap<usize, u64> = BTreeMap::new();
    let mut open_by_size: BTreeMap<usize, u64> = BTreeMap::new();
    for g in gates {
        let probes = g.gate.probes().len() as f64;
        let mode = format!("gate {}", g.kind);
        match &g.api {
            Some(a) => {
                let wpp = a.probe_writes as f64 / probes;
                let w = writes_by_kind.entry(g.kind).or_insert(0.0);
                *w = w.max(wpp);
                if g.kind == "cross_node" {
                    watches_by_size.insert(g.nodes, a.watches);
                }
                t.row(vec![
                    g.nodes.to_string(),
                    mode,
                    f0(probes),
                    a.per_probe(probes),
                    f1(a.total() as f64 / probes),
                    format!("{} ({})", a.watches, a.watches_open),
                    f2(wpp),
                    format!("{} / {}", a.probe_writes_failed, a.repeated_deletes),
                    a.events.total().to_string(),
                    a.instance_lease.total().to_string(),
                    a.leader_lease.total().to_string(),
                    a.configmaps.total().to_string(),
                    a.other_writes.to_string(),
                ]);
            }
            None => {
                let mut row = vec![g.nodes.to_string(), mode, f0(probes)];
                row.extend(std::iter::repeat_n(NEEDS_REAL.to_owned(), 10));
                t.row(row);
            }
        }
    }
    for r in runs {
        let mode = format!(
            "run {} s (interval {}, concurrency {})",
            f0(r.secs),
            r.interval,
            r.concurrency
        );
        match &r.api {
            Some(a) => {
                // Per probe: the writes received before SIGTERM (the shutdown's
                // cancellations and final sweep are one-offs, shown apart).
                let wpp = (a.probe_writes - a.probe_writes_shutdown) as f64 / r.probes;
                if r.interval == plan.run_interval && r.concurrency == plan.run_concurrency {
                    open_by_size.insert(r.nodes, a.watches_open);
                }
                let w = writes_by_kind
                    .entry("run (cross_node + same_node)")
                    .or_insert(0.0);
                *w = w.max(wpp);
                t.row(vec![
                    r.nodes.to_string(),
                    mode,
                    f0(r.probes),
                    a.per_probe(r.probes),
                    f1(a.total() as f64 / r.probes),
                    format!("{} ({})", a.watches, a.watches_open),
                    format!(
                        "{} (+ {} at shutdown)",
                        f2(wpp),
                        f2(a.probe_writes_shutdown as f64 / r.probes)
                    ),
                    format!("{} / {}", a.probe_writes_failed, a.repeated_deletes),
                    a.events.cell(r.secs),
                    a.instance_lease.cell(r.secs),
                    a.leader_lease.cell(r.secs),
                    a.configmaps.cell(r.secs),
                    format!(
                        "{} ({:.0}/h)",
                        a.other_writes,
                        a.other_writes as f64 * 3600.0 / r.secs
                    ),
                ]);
            }
            None => {
                let mut row = vec![r.nodes.to_string(), mode, f0(r.probes)];
                row.extend(std::iter::repeat_n(NEEDS_REAL.to_owned(), 10));
                t.row(row);
            }
        }
    }
    if !plan.real {
        t.notes.push(format!(
            "API columns not measured: the built-in control plane keeps no audit log ({NEEDS_REAL})."
        ));
        return t;
    }
    for (kind, w) in &writes_by_kind {
        t.notes.push(format!(
            "Design target ≤ {WRITES_PER_PROBE_TARGET:.0} API writes per probe, {kind}: **{}** \
             (worst {w:.2} per probe over the node counts).",
            if *w <= WRITES_PER_PROBE_TARGET {
                "met"
            } else {
                "not met"
            }
        ));
    }
    let w: BTreeSet<u64> = watches_by_size.values().copied().collect();
    t.notes.push(format!(
        "Design target: watches independent of node count — gate cross_node watch requests \
         by node count {:?}: **{}**; watches open at the end of each run by node count {:?}: \
         **{}**.",
        watches_by_size,
        if watches_by_size.len() < 2 {
            "one node count only, not judged"
        } else if w.len() == 1 {
            "same at every size"
        } else {
            "they differ (per-probe pod watches vary with timing, not with nodes: compare per probe)"
        },
        open_by_size,
        if open_by_size.len() < 2 {
            "one node count only, not judged"
        } else if open_by_size.values().collect::<BTreeSet<_>>().len() == 1 {
            "independent"
        } else {
            "they differ"
        }
    ));
    for r in runs.iter().filter(|r| r.api.is_some()) {
        let a = r.api.as_ref().unwrap();
        let h = 3600.0 / r.secs;
        // What the design allows in a window of this length: Events at most one per node
        // and reason (slow, failed) per 5 minutes; the instance Lease renewed every 5 s
        // (plus its create and delete); the leader Lease renewed every 2 s (plus acquire
        // and release); the baseline ConfigMap saved at most every 5 minutes (plus the
        // first save and one at shutdown).
        let windows5m = (r.secs / 300.0).floor() + 1.0;
        let ev_allowed = r.nodes as f64 * 2.0 * windows5m;
        let inst_allowed = (r.secs / 5.0).ceil() + 1.0;
        let leader_allowed = (r.secs / 2.0).ceil() + 2.0;
        let cm_allowed = (r.secs / 300.0).floor() + 2.0;
        let ok = a.events.total() as f64 <= ev_allowed
            && a.instance_lease.update as f64 <= inst_allowed
            && a.leader_lease.total() as f64 <= leader_allowed
            && a.configmaps.total() as f64 <= cm_allowed;
        t.notes.push(format!(
            "Run on {} nodes (interval {}, concurrency {}, {:.0} s), writes counted apart from \
             the probes': Events {} (allowed {ev_allowed:.0}: one per node and reason per 5 min, \
             ≤ {EVENTS_PER_NODE_H:.0} per node and hour); instance Lease {} renewals = {:.0}/h \
             (budget {INSTANCE_LEASE_PER_H:.0}/h) + {} create/delete; leader Lease {} writes = \
             {:.0}/h (budget {LEADER_LEASE_PER_H:.0}/h at the 2 s retry period, + acquire and \
             release); baseline ConfigMap {} writes (allowed {cm_allowed:.0}: one per 5 min, \
             ≤ 12/h, + the first save and one at shutdown): **{}**.",
            r.nodes,
            r.interval,
            r.concurrency,
            r.secs,
            a.events.total(),
            a.instance_lease.update,
            a.instance_lease.update as f64 * h,
            a.instance_lease.create_delete,
            a.leader_lease.total(),
            a.leader_lease.total() as f64 * h,
            a.configmaps.total(),
            if ok { "within budget" } else { "over budget" }
        ));
    }
    t
}

fn startup_table(plan: &Plan, gate: &GateRun, run: &RunResult) -> Table {
    let big = run.nodes;
    let method = format!(
        "`testbed up --nodes 1 --hollow-nodes {} --hollow-ttfp {HOLLOW_TTFP} \
         --hollow-direct-scrapes hold` ({cp} control plane): every agent request that does \
         not come through the API server's pod proxy is left unanswered, as for a prober \
         that cannot reach node ports. Gate: `prober gate --node-selector \
         {HOLLOW_SELECTOR} --pairs 16 --concurrency 16 --hold 1s`, start-up = the first \
         probe's `timeline.started_at` minus the spawn time of `testbed exec -- prober \
         gate`. Run: `prober run --leader-elect --node-selector {HOLLOW_SELECTOR} \
         --probe-interval 2s --concurrency 2 --hold 1s` for 25 s, start-up = the first \
         record's `started_at` in `/api/v1/probes` minus the spawn time. The calico-felix \
         columns are the gate report's `agents.profiles.calico-felix` counters.",
        big - 1,
        cp = plan.control_plane()
    );
    let mut t = Table::new(
        STARTUP,
        &method,
        &[
            "nodes",
            "mode",
            "start-up s",
            "wall s",
            "felix nodes scraped",
            "felix via proxy",
            "felix scrapes failed",
            "target",
        ],
    );
    t.row(vec![
        big.to_string(),
        format!("gate (exit {})", gate.code),
        f2(gate.startup()),
        f1(gate.wall),
        gate.felix("nodes_scraped"),
        gate.felix("nodes_via_proxy"),
        gate.felix("scrapes_failed"),
        format!("≤ {STARTUP_TARGET_S:.0} s at 1 000 nodes"),
    ]);
    t.row(vec![
        big.to_string(),
        "run".into(),
        f2(run.startup),
        f1(run.secs),
        "n/a (run)".into(),
        "n/a (run)".into(),
        "n/a (run)".into(),
        format!("≤ {STARTUP_TARGET_S:.0} s at 1 000 nodes"),
    ]);
    let worst = gate.startup().max(run.startup);
    if big >= 1000 {
        t.notes.push(format!(
            "Design target start-up to first probe ≤ {STARTUP_TARGET_S:.0} s at 1 000 nodes with \
             direct scrapes failing: **{}** (gate {:.2} s, run {:.2} s at {big} nodes).",
            if worst <= STARTUP_TARGET_S {
                "met"
            } else {
                "not met"
            },
            gate.startup(),
            run.startup
        ));
    } else {
        t.notes.push(format!(
            "Design target start-up ≤ {STARTUP_TARGET_S:.0} s at 1 000 nodes: not judged (largest \
             size here {big} nodes: gate {:.2} s, run {:.2} s).",
            gate.startup(),
            run.startup
        ));
    }
    t
}

fn gate_wall_table(plan: &Plan, gate: &GateRun, hollow: &[GateRow]) -> Table {
    let n = plan.netns;
    let probes = gate.probes();
    let p = probes.len();
    let durations: Vec<f64> = probes
        .iter()
        .filter_map(|p| p["timeline"]["finished"].as_f64())
        .collect();
    let mean = if durations.is_empty() {
        f64::NAN
    } else {
        durations.iter().sum::<f64>() / durations.len() as f64
    };
    let setup = gate.startup();
    let last_end = probes
        .iter()
        .filter_map(|p| Some(common::started_unix(p) + p["timeline"]["finished"].as_f64()?))
        .fold(f64::NEG_INFINITY, f64::max);
    let tail = if last_end.is_finite() {
        (gate.t0 + gate.wall - last_end).max(0.0)
    } else {
        f64::NAN
    };
    let c = GATE_CONCURRENCY as f64;
    let rounds = |probes: usize| (probes as f64 / c).ceil();
    let predict = |setup: f64, probes: usize| setup + rounds(probes) * mean + tail;
    // Set-up at 100 nodes: the measured cross_node gate start-up on the hollow testbed
    // closest to 100 nodes (it includes listing and sweeping every node).
    let (setup_n, setup_100) = hollow
        .iter()
        .filter(|g| g.kind == "cross_node")
        .min_by_key(|g| g.nodes.abs_diff(100))
        .map_or((n, setup), |g| (g.nodes, g.gate.startup()));
    let pred_100 = predict(setup_100, 100);
    let method = format!(
        "`testbed up --nodes {n}` ({cp} control plane, every node healthy with endpoints \
         programmed after 300 ms), then `testbed exec -- prober gate --pairs {n} \
         --concurrency {GATE_CONCURRENCY}` (default `--hold 5s`, `--kinds cross_node`): one \
         lap, every node source once and target once. Wall = spawn to exit. Formula: wall ≈ \
         setup + ⌈probes / {GATE_CONCURRENCY}⌉ × mean probe duration + tail, with setup = \
         first probe start − spawn, probe duration = each record's `timeline.finished` \
         (start to both pods deleted), tail = exit − last probe end, all from this gate. \
         For 100 nodes (100 probes) the setup is the cross_node gate start-up measured at \
         {setup_n} nodes in *{FOOTPRINT}* (listing and sweeping every node), the rest as \
         measured here; the gate refills its {GATE_CONCURRENCY} slots as probes end, so \
         whole rounds over-estimate a little.",
        cp = plan.control_plane()
    );
    let mut t = Table::new(
        GATE_WALL,
        &method,
        &[
            "netns nodes",
            "concurrency",
            "probes",
            "exit",
            "wall s",
            "setup s",
            "mean probe s",
            "tail s",
            "formula for these nodes s",
            "formula for 100 nodes s",
            "target for 100 nodes",
        ],
    );
    t.row(vec![
        n.to_string(),
        GATE_CONCURRENCY.to_string(),
        p.to_string(),
        gate.code.to_string(),
        f1(gate.wall),
        f1(setup),
        f2(mean),
        f1(tail),
        f1(predict(setup, p)),
        f1(pred_100),
        format!("≤ {GATE_100_TARGET_S:.0} s"),
    ]);
    t.notes.push(format!(
        "Design target 100 nodes covered as source and target in ≤ 3 min at --concurrency 16: \
         **{}** by the formula ({:.0} s = {setup_100:.1} s setup + {} rounds × {mean:.2} s + \
         {tail:.1} s tail); measured on {n} netns nodes: {:.1} s.",
        if pred_100 <= GATE_100_TARGET_S {
            "met"
        } else {
            "not met"
        },
        pred_100,
        rounds(100),
        gate.wall
    ));
    t
}

fn run_grid_table(plan: &Plan, runs: &[RunResult]) -> Table {
    let method = format!(
        "Each row one `prober run --leader-elect --node-selector {HOLLOW_SELECTOR} --kinds \
         cross_node,same_node --probe-interval I --concurrency C --hold 1s --give-up 20s` on \
         the hollow testbeds of *{FOOTPRINT}* ({cp} control plane), for the duration shown. \
         Lap expected = `firstpacket_lap_expected_seconds` (eligible nodes × interval), last \
         lap = `firstpacket_lap_seconds` (0 or n/a: no lap completed in the run). Probes/h \
         = `probe done` log events ÷ wall time. Writes from the audit log as in *{API}*: \
         probe writes (pods, services) per hour, and every write of the prober per hour \
         (probe writes, Events, instance and leader Lease, baseline ConfigMap, other).",
        cp = plan.control_plane()
    );
    let mut t = Table::new(
        RUN_GRID,
        &method,
        &[
            "nodes",
            "interval",
            "concurrency",
            "duration s",
            "probes",
            "probes/h",
            "lap expected s",
            "last lap s",
            "probe writes/h",
            "all writes/h",
        ],
    );
    for r in runs {
        let h = 3600.0 / r.secs;
        let (pw, all) = match &r.api {
            Some(a) => {
                let all = a.probe_writes
                    + a.events.total()
                    + a.instance_lease.total()
                    + a.leader_lease.total()
                    + a.configmaps.total()
                    + a.other_writes;
                (f0(a.probe_writes as f64 * h), f0(all as f64 * h))
            }
            None => (NEEDS_REAL.to_owned(), NEEDS_REAL.to_owned()),
        };
        t.row(vec![
            r.nodes.to_string(),
            r.interval.to_owned(),
            r.concurrency.to_string(),
            f0(r.secs),
            f0(r.probes),
            f0(r.probes * h),
            f0(r.lap_expected),
            if r.lap.is_nan() || r.lap == 0.0 {
                "no lap completed".into()
            } else {
                f1(r.lap)
            },
            pw,
            all,
        ]);
    }
    t.notes.push(
        "Probe writes per hour scale with 3600 / interval × writes per probe, independent of \
         the node count; a lap takes nodes × interval, so at 1 000 nodes and the default 30 s \
         interval one lap is about 8.3 h."
            .into(),
    );
    t
}
