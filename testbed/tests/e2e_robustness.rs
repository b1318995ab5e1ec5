//! End-to-end robustness of `prober gate` on the testbed (real processes in netns), for
//! what needs real processes, packets or the real control plane: `--log-format json` on
//! a real run (every stderr line one JSON object, progress events with structured
//! fields); the report's `agents` object (which node agents were scraped, or that
//! correlation is off); a `recreate` probe surviving expired watches; SIGKILLed probers
//! whose pods go by their Leases and `prober cleanup`; a prober whose clock runs ahead
//! not sweeping a live gate's pods; the API server down mid-gate reported as one outage
//! (and one stderr line).
//!
//! The engine's side of the API failing mid-run (`api_error`, a lost watch recovered by
//! a read, 410 re-lists), RBAC denials stopping the gate, a missing namespace, the
//! unschedulable grace and killed gates are tested in-process, without root, by
//! `prober/tests/engine_gate.rs`.
//!
//! Needs root and the workspace binaries (`cargo build --workspace --bins`).

mod common;

use common::{poll_until, testbed_ok, Testbed, POD_GONE_TIMEOUT, SERIAL};
use serde_json::Value;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testbed::truth::{TruthEvent, TruthKind};

/// Healthy dataplane (endpoints programmed after 100 ms).
const FAULT: &str = "rules:\n  - nodes: {all: true}\n    program_delay: 100ms\n";

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn report_path(tb: &Testbed, name: &str) -> std::path::PathBuf {
    tb.state.join(format!("robustness-{name}.json"))
}

/// `testbed exec -- prober gate ARGS…` as a child with piped output.
fn spawn_gate(tb: &Testbed, args: &[&str]) -> Child {
    let mut c: Command = tb.cmd();
    c.arg("exec").arg("--").arg("prober").arg("gate").args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().expect("spawn the gate")
}

/// A gate of 3 pairs all at once, each held 8 s after its first success (so all three
/// are in flight when the API is broken), writing `report`.
fn spawn_three_pairs_in_parallel(tb: &Testbed, report: &std::path::Path) -> Child {
    spawn_gate(
        tb,
        &[
            "--pairs",
            "3",
            "--concurrency",
            "3",
            "--give-up",
            "10s",
            "--hold",
            "8s",
            "--timeout",
            "3m",
            "--report",
            report.to_str().expect("path"),
        ],
    )
}

/// Waits (≤ 30 s) until `n` probe source pods exist, so the gate is mid-run.
fn wait_for_sources(tb: &Testbed, n: usize) {
    let start = Instant::now();
    loop {
        let out = tb.exec(&[
            "kubectl",
            "get",
            "pods",
            "-n",
            "firstpacket",
            "-l",
            "app.kubernetes.io/component=probe-source",
            "-o",
            "name",
        ]);
        let found = String::from_utf8_lossy(&out.stdout).lines().count();
        if found >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {found} of {n} source pods after 30s: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("gate output")
}

fn read_report(path: &std::path::Path, out: &Output) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "no report ({e}); stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let value: Value = serde_json::from_str(&text).expect("report JSON");
    let schema: Value =
        serde_json::from_str(firstpacket_report::GATE_REPORT_SCHEMA).expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema violations: {errors:#?}");
    value
}

fn probes(report: &Value) -> Vec<Value> {
    report["probes"].as_array().cloned().unwrap_or_default()
}

#[test]
fn json_log_format_makes_every_stderr_line_json_on_a_real_run() {
    let _g = serial();
    let tb = Testbed::up("robust-json", 3, FAULT, &[]);
    let report = report_path(&tb, "json");
    let out = tb.exec(&[
        "prober",
        "gate",
        "--pairs",
        "3",
        "--hold",
        "1s",
        "--log-format",
        "json",
        "--report",
        report.to_str().expect("path"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let done: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "probe done")
        .collect();
    assert_eq!(done.len(), 3, "{stderr}");
    for d in &done {
        let f = &d["fields"];
        assert_eq!(f["result"], "success", "{d}");
        assert!(
            f["probe_id"].is_string() && f["src_node"].is_string(),
            "{d}"
        );
        assert!(f["ttfp_seconds"].is_number(), "{d}");
    }
    assert!(lines.iter().any(|l| l["fields"]["seed"].is_number()));
    assert!(lines
        .iter()
        .any(|l| l["fields"]["message"] == "report written"));
    // The result stays human on stdout.
    assert!(stdout.contains("verdict: PASS (exit 0)"), "{stdout}");
    read_report(&report, &out);
}

/// `tb.gate(ARGS)` timed: (exit code, report, stdout + stderr, wall time). The report is
/// validated against the JSON Schema.
fn timed_gate(tb: &Testbed, args: &[&str]) -> (i32, Value, String, Duration) {
    let started = Instant::now();
    let (code, report, out) = tb.gate(args);
    let took = started.elapsed();
    common::validate(&report);
    (code, report, out, took)
}

/// The report shows that node-agent correlation ran: `agents` with the scrape mode and
/// per-profile counts (the testbed runs a Felix-compatible calico-node per node), and the
/// text output has the one-line summary.
#[test]
fn report_shows_which_node_agents_were_scraped() {
    let _g = serial();
    let tb = Testbed::up("robust-agents", 3, FAULT, &[]);
    let (code, v, out, _) = timed_gate(&tb, &["--pairs", "3", "--hold", "1s"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(v["agents"]["scrape_mode"], "auto", "{:#}", v["agents"]);
    let felix = &v["agents"]["profiles"]["calico-felix"];
    assert_eq!(felix["nodes_with_agent"], 3, "{:#}", v["agents"]);
    assert!(felix["scrapes_ok"].as_u64().unwrap_or(0) >= 3, "{felix:#}");
    assert_eq!(felix["nodes_ok"], 3, "{felix:#}");
    assert_eq!(
        v["agents"]["profiles"]["aws-node"]["nodes_with_agent"], 0,
        "{:#}",
        v["agents"]
    );
    assert!(
        out.contains("node agents (scrape auto): calico-felix 3/3 nodes scraped ok"),
        "{out}"
    );

    // Every profile disabled: correlation off, and the report says so.
    let cfg = tb.state.join("agents-off.yaml");
    std::fs::write(
        &cfg,
        "disable: [calico-felix, cilium-agent, kube-proxy, aws-node]\n",
    )
    .expect("write agent config");
    let (code, v, out, _) = timed_gate(
        &tb,
        &[
            "--pairs",
            "2",
            "--hold",
            "1s",
            "--agent-config",
            cfg.to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(v["agents"]["profiles"], serde_json::json!({}), "{v:#}");
    assert!(out.contains("correlation off"), "{out}");
}

/// A `recreate` probe waiting for its previous target's deletion survives the watch
/// history expiring under it (issue: objects deleted while kube-runtime re-lists after
/// a 410 produced no `Delete`, and the wait ran out as `api_error`). The fault
/// `teardown_delay: 3s` keeps the deleted incarnation in the API for 3 s after its
/// container stopped; once the prober has deleted it (its `deletionTimestamp` is set,
/// no `pod_deleted` in the truth log yet), the pod watch is cut (`api deny watch pods`,
/// then `api expire-watches`, which ends the running watches and makes their resume a
/// 410 Gone; on the real control plane it compacts etcd and restarts kube-apiserver,
/// and the kubelet's final delete waits for it), the kubelet finishes the deletion while nobody watches, and watching is
/// allowed again. The probe must still end with its real result (`success`, TTFP) and
/// the report must name the deleted incarnation's UID as `previous_uid`.
#[test]
fn recreate_waiting_for_the_old_pod_survives_expired_watches() {
    let _g = serial();
    let fault =
        "rules:\n  - nodes: {all: true}\n    program_delay: 100ms\n    teardown_delay: 3s\n";
    let tb = Testbed::up("robust-rec", 2, fault, &[]);
    let report = report_path(&tb, "recreate");
    let child = spawn_gate(
        &tb,
        &[
            "--kinds",
            "recreate",
            "--pairs",
            "1",
            "--give-up",
            "90s",
            "--timeout",
            "4m",
            "--report",
            report.to_str().expect("path"),
        ],
    );
    // The first incarnation T0 is created, turns Ready, and is deleted by the prober.
    let selector = "app.kubernetes.io/component=probe-target";
    let listed = tb.kubectl_until(
        &[
            "get",
            "pods",
            "-n",
            "firstpacket",
            "-l",
            selector,
            "-o",
            "json",
        ],
        Duration::from_secs(60),
        |o| {
            serde_json::from_str::<Value>(o).is_ok_and(|v| {
                v["items"].as_array().is_some_and(|items| {
                    items
                        .iter()
                        .any(|p| !p["metadata"]["deletionTimestamp"].is_null())
                })
            })
        },
    );
    let items: Value = serde_json::from_str(&listed).expect("pod list");
    let old = items["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|p| !p["metadata"]["deletionTimestamp"].is_null())
        })
        .unwrap_or_else(|| panic!("no target pod with a deletionTimestamp within 60 s: {listed}"));
    let old_uid = old["metadata"]["uid"].as_str().expect("uid").to_owned();
    let old_name = old["metadata"]["name"].as_str().expect("name").to_owned();
    let gone = |t: &[TruthEvent]| {
        t.iter()
            .any(|e| e.event == TruthKind::PodDeleted && e.uid.as_deref() == Some(old_uid.as_str()))
    };
    testbed_ok(&tb, &["api", "deny", "watch", "pods"]);
    // One write the prober's watch does not see, so the resourceVersion it resumes from
    // is older than the compaction (with none, a resume from the newest revision is
    // legal and replays the deletion: nothing would be lost).
    tb.kubectl(&[
        "annotate",
        "node",
        "node-1",
        "--overwrite",
        "firstpacket.io/rv-bump=1",
    ]);
    let before = tb.truth();
    testbed_ok(&tb, &["api", "expire-watches"]);
    assert!(
        !gone(&before),
        "{old_name} ({old_uid}) was gone before the watches expired: the test cut nothing \
         (teardown_delay not in force?)"
    );
    // The kubelet finishes the deletion while the pod watch is down.
    let truth = tb.truth_until(Duration::from_secs(30), &gone);
    assert!(gone(&truth), "{old_name} ({old_uid}) never deleted");
    // The kubelet logs `pod_deleted` before its final DELETE: wait for the object too.
    let uid_path = "jsonpath={.items[*].metadata.uid}";
    let uids = tb.kubectl_until(
        &[
            "get",
            "pods",
            "-n",
            "firstpacket",
            "-l",
            selector,
            "-o",
            uid_path,
        ],
        Duration::from_secs(30),
        |o| !o.contains(old_uid.as_str()),
    );
    assert!(
        !uids.contains(old_uid.as_str()),
        "{old_name} ({old_uid}) still in the API"
    );
    testbed_ok(&tb, &["api", "allow", "all"]);
    let out = finish(child);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v = read_report(&report, &out);
    let ps = probes(&v);
    assert_eq!(ps.len(), 1, "{stdout}\n{stderr}");
    let p = &ps[0];
    assert_eq!(p["kind"], "recreate", "{p:#}");
    assert_eq!(p["result"], "success", "{p:#}\n{stderr}");
    assert!(p["ttfp_seconds"].is_number(), "{p:#}");
    assert_eq!(p["recreate"]["previous_uid"], old_uid.as_str(), "{p:#}");
    assert_eq!(p["target"]["pod"], old_name.as_str(), "{p:#}");
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
}

/// Probe pods whose prober was SIGKILLed go long before their `activeDeadlineSeconds`:
/// every instance holds a Lease (`firstpacket-<instance>`) renewed every 5 s. A gate
/// (`gate-…`) and an out-of-cluster `prober run` (`run-…`) are killed with pods in
/// flight; `prober cleanup` without `--yes` lists both as dead and deletes nothing;
/// `prober cleanup --instance GATE --yes` removes the gate's objects at once; a new gate
/// started right after removes the run's (its Lease stayed unrenewed for 15 s) and
/// passes; no Lease of a dead instance remains.
#[test]
fn pods_of_killed_probers_go_by_their_leases_and_prober_cleanup() {
    let _g = serial();
    let tb = Testbed::up("robust-kill", 3, FAULT, &[]);
    let mut gate = spawn_gate(
        &tb,
        &[
            "--pairs",
            "3",
            "--concurrency",
            "3",
            "--hold",
            "60s",
            "--give-up",
            "60s",
        ],
    );
    let mut run: Child = {
        let mut c: Command = tb.cmd();
        c.args([
            "exec",
            "--",
            "prober",
            "run",
            "--probe-interval",
            "1s",
            "--hold",
            "60s",
        ])
        .args(["--admin-addr", "127.0.0.1:0"]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().expect("spawn prober run")
    };
    let selector = "app.kubernetes.io/component=probe-source";
    let instances_with_sources =
        |tb: &Testbed| -> std::collections::BTreeSet<String> {
            let out = tb.kubectl(&[
            "get", "pods", "-n", "firstpacket", "-l", selector, "-o",
            "jsonpath={range .items[*]}{.metadata.labels.firstpacket\\.io/instance}{\"\\n\"}{end}",
        ]);
            out.lines().map(str::to_owned).collect()
        };
    let start = Instant::now();
    let instances = loop {
        let i = instances_with_sources(&tb);
        if i.iter().any(|x| x.starts_with("gate-")) && i.iter().any(|x| x.starts_with("run-")) {
            break i;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no source pods of both: {i:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    gate.kill().expect("SIGKILL the gate");
    run.kill().expect("SIGKILL prober run");
    let _ = gate.wait();
    let _ = run.wait();
    let gate_id = instances
        .iter()
        .find(|i| i.starts_with("gate-"))
        .unwrap()
        .clone();
    let run_id = instances
        .iter()
        .find(|i| i.starts_with("run-"))
        .unwrap()
        .clone();
    let objects_of = |tb: &Testbed, i: &str| -> Vec<String> {
        let out = tb.kubectl(&[
            "get",
            "pods,services",
            "-n",
            "firstpacket",
            "-l",
            &format!("firstpacket.io/instance={i}"),
            "-o",
            "name",
        ]);
        out.lines().map(str::to_owned).collect()
    };
    assert!(
        !objects_of(&tb, &gate_id).is_empty(),
        "the killed gate left nothing to test"
    );
    assert!(
        !objects_of(&tb, &run_id).is_empty(),
        "the killed run left nothing to test"
    );
    let leases = tb.kubectl(&["get", "leases", "-n", "firstpacket", "-o", "name"]);
    for i in [&gate_id, &run_id] {
        assert!(
            leases.contains(&format!("firstpacket-{i}")),
            "no Lease of {i}: {leases}"
        );
    }
    // Dry run: both dead, nothing deleted.
    let dry = tb.exec(&["prober", "cleanup"]);
    let dry_out = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(
        dry.status.success(),
        "{dry_out}{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    for i in [&gate_id, &run_id] {
        assert!(
            dry_out
                .lines()
                .any(|l| l.starts_with(i.as_str()) && l.contains("dead")),
            "{i} not listed dead:\n{dry_out}"
        );
        assert!(
            !objects_of(&tb, i).is_empty(),
            "the dry run deleted {i}'s objects"
        );
    }
    // One named instance, now.
    let named = tb.exec(&["prober", "cleanup", "--instance", &gate_id, "--yes"]);
    assert!(
        named.status.success(),
        "{}",
        String::from_utf8_lossy(&named.stderr)
    );
    let left = objects_of(&tb, &gate_id);
    assert!(
        left.is_empty() || tb.terminating_probe_pods().len() >= left.len(),
        "cleanup --instance left {left:?}"
    );
    assert!(
        !objects_of(&tb, &run_id).is_empty(),
        "cleanup --instance touched {run_id}"
    );
    // The next gate reaps the killed run by its Lease and passes.
    let (code, report, out) = tb.gate(&["--pairs", "2"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(report["verdict"], "pass", "{out}");
    assert!(out.contains(&format!("instance {run_id} is dead")), "{out}");
    let gone = poll_until(
        POD_GONE_TIMEOUT,
        || (objects_of(&tb, &run_id), objects_of(&tb, &gate_id)),
        |(r, g)| r.is_empty() && g.is_empty(),
    );
    assert_eq!(
        gone,
        (Vec::new(), Vec::new()),
        "objects of the killed probers remain"
    );
    let leases = tb.kubectl(&["get", "leases", "-n", "firstpacket", "-o", "name"]);
    assert!(!leases.contains("firstpacket-"), "Leases remain: {leases}");
}

/// A gate whose wall clock runs 5 minutes ahead of the API server (libfaketime preloaded
/// into a dynamically linked prober) starts while another gate's probe pods are a few
/// seconds old: its start-up sweep must age them by the API server's clock (the `Date`
/// header), not its own, so it deletes nothing and the other gate passes. By the
/// prober's own clock those pods are 5 minutes old, past their age limit
/// (activeDeadlineSeconds 130 s + 60 s grace with these flags).
#[test]
fn a_prober_with_a_clock_ahead_does_not_sweep_a_live_gates_pods() {
    let _g = serial();
    let tb = Testbed::up("robust-clock", 3, FAULT, &[]);
    let report_a = tb.state.join("clock-a.json");
    let a = spawn_gate(
        &tb,
        &[
            "--pairs",
            "3",
            "--concurrency",
            "3",
            "--give-up",
            "20s",
            "--hold",
            "30s",
            "--report",
            report_a.to_str().unwrap(),
        ],
    );
    let selector = "app.kubernetes.io/component=probe-source";
    let sources = poll_until(
        Duration::from_secs(60),
        || {
            tb.kubectl(&[
                "get",
                "pods",
                "-n",
                "firstpacket",
                "-l",
                selector,
                "-o",
                "name",
            ])
        },
        |names| !names.trim().is_empty(),
    );
    assert!(
        !sources.trim().is_empty(),
        "gate A created no source pod in 60 s"
    );
    let skew = testbed::fault::ClockSkew { seconds: 300.0 };
    let mut args: Vec<String> = vec!["exec".into(), "--".into(), "env".into()];
    args.extend(
        skew.faketime_env()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}")),
    );
    let report_b = tb.state.join("clock-b.json");
    args.extend(
        [
            "prober",
            "gate",
            "--pairs",
            "1",
            "--report",
            report_b.to_str().unwrap(),
        ]
        .map(str::to_owned),
    );
    let b = tb.cmd().args(&args).output().expect("gate B");
    let b_err = String::from_utf8_lossy(&b.stderr).into_owned();
    let rb: Value = serde_json::from_str(&std::fs::read_to_string(&report_b).unwrap_or_default())
        .unwrap_or_else(|e| panic!("gate B wrote no report ({e}):\n{b_err}"));
    // The preload took: B's own clock says 5 minutes ahead.
    let b_start: k8s_openapi::jiff::Timestamp = rb["started_at"].as_str().unwrap().parse().unwrap();
    let ahead = b_start.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(
        (240..=330).contains(&ahead),
        "gate B's clock is not 5 minutes ahead ({ahead}s): is libfaketime installed?"
    );
    assert_eq!(b.status.code(), Some(0), "gate B:\n{b_err}");
    assert!(
        !b_err.contains("swept"),
        "gate B swept gate A's pods:\n{b_err}"
    );
    let a_out = a.wait_with_output().expect("gate A");
    let ra: Value = serde_json::from_str(&std::fs::read_to_string(&report_a).unwrap()).unwrap();
    assert_eq!(
        a_out.status.code(),
        Some(0),
        "gate A failed (its pods swept?):\n{}",
        String::from_utf8_lossy(&a_out.stderr)
    );
    assert!(
        ra["probes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["result"] == "success"),
        "{ra:#}"
    );
}

/// The API server down for 6 s mid-gate (`testbed api stop`, then `api start`: a restart
/// with a downtime the test knows; `api restart` of the built-in server is over in
/// milliseconds) while three probes are in flight: the gate survives it and reports it
/// as **one** outage — `api_outages[0]` starting when the API stopped answering and
/// lasting as long as it was down (tolerances: the prober notices the stop at its next
/// request, ≤ 2 s with its watches re-connecting; the end within its 0.5 s recovery
/// ping; the real kube-apiserver's graceful shutdown makes "stopped" a window from
/// `api stop` starting to it returning) — and stderr carries one line for it, not one
/// raw error per watcher.
#[test]
fn api_down_mid_gate_is_reported_as_one_outage_with_start_and_length() {
    let _g = serial();
    let tb = Testbed::up("robust-outage", 3, FAULT, &[]);
    let report = report_path(&tb, "outage");
    let child = spawn_three_pairs_in_parallel(&tb, &report);
    wait_for_sources(&tb, 3);
    // The stop is a window, not an instant: the real kube-apiserver shuts down
    // gracefully on SIGTERM (it answers for a few more seconds); `api stop` returns
    // once it has exited.
    let stopping = k8s_openapi::jiff::Timestamp::now();
    let t0 = Instant::now();
    testbed_ok(&tb, &["api", "stop"]);
    let stop_took = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(6));
    testbed_ok(&tb, &["api", "start"]);
    let down_max = t0.elapsed().as_secs_f64();
    let down_min = down_max - stop_took;
    let out = finish(child);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = read_report(&report, &out);
    let outages = v["api_outages"].as_array().cloned().unwrap_or_default();
    assert_eq!(outages.len(), 1, "{outages:#?}\n{stderr}");
    let o = &outages[0];
    assert_eq!(o["ongoing"], false, "{o}");
    let start: k8s_openapi::jiff::Timestamp = o["start"].as_str().unwrap().parse().unwrap();
    let late = (start.as_millisecond() - stopping.as_millisecond()) as f64 / 1000.0;
    assert!(
        (-0.5..=stop_took + 2.5).contains(&late),
        "outage start {late:.2}s after `api stop` began (it took {stop_took:.2}s): {o}"
    );
    let seconds = o["seconds"].as_f64().unwrap();
    println!(
        "outage: start {late:.2}s after `api stop` began (stop took {stop_took:.2}s), \
         {seconds:.2}s long; API down {down_min:.2}–{down_max:.2}s"
    );
    assert!(
        (down_min - 3.0..=down_max + 1.5).contains(&seconds),
        "outage {seconds:.2}s, API down {down_min:.2}–{down_max:.2}s: {o}"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("API server did not answer"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per outage:\n{stderr}");
    let raw: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            !l.contains("API server did not answer")
                && (l.contains("close_notify")
                    || l.contains("Connection refused")
                    || l.contains("connection refused"))
        })
        .collect();
    assert!(raw.is_empty(), "raw connection errors on stderr: {raw:#?}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(v["errors"].as_array().unwrap().is_empty(), "{v:#}");
}
