//! Soak of `prober run`: one 90 s cycle (100 s) by default, 30 minutes with `FIRSTPACKET_LONG_TESTS=1`, on a
//! 4-node testbed whose nodes are stopped, started and cordoned, whose API server is
//! restarted and whose RBAC for pods is removed and restored, in a cycle. Throughout,
//! every structure the prober exports (`firstpacket_state_entries{structure}`) stays
//! within its stated bound (`firstpacket_state_bound{structure}`, prober's `bounds`
//! module); the resident set size after warm-up (30 s; minute 5 in the long run)
//! and at the end is printed, and growth beyond 20 MiB fails as a leak; no probe pod
//! remains after SIGTERM.

mod common;

use common::{curl, proc_status, testbed_ok, wait_ready, Testbed, POD_GONE_TIMEOUT, SERIAL};
use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const FAULT: &str = "rules:\n  - nodes: {all: true}\n    program_delay: 100ms\n";

/// Growth of the resident set between warm-up and the end that counts as a leak.
const LEAK_MIB: f64 = 20.0;

/// `curl` in the testbed's host netns (where the prober listens).
/// `firstpacket_state_entries` and `firstpacket_state_bound` by structure.
type Sizes = BTreeMap<String, (f64, Option<f64>)>;

fn state_sizes(metrics: &str) -> Sizes {
    let lines = metrics.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("exposition text");
    let mut out: Sizes = BTreeMap::new();
    for s in &scrape.samples {
        let v = match s.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        let Some(name) = s.labels.get("structure") else {
            continue;
        };
        match s.metric.as_str() {
            "firstpacket_state_entries" => out.entry(name.to_owned()).or_default().0 = v,
            "firstpacket_state_bound" => out.entry(name.to_owned()).or_default().1 = Some(v),
            _ => {}
        }
    }
    out
}

/// The prober's pid: the process whose command line has `marker` (its admin address).
fn prober_pid(marker: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains("prober run") && cmd.contains(marker)).then_some(pid)
    })
}

/// VmRSS of `pid`, MiB.
fn rss_mib(pid: i32) -> Option<f64> {
    let kb: f64 = proc_status(pid)
        .get("VmRSS")?
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// One step of the churn cycle at `at` seconds into it.
struct Step {
    at: u64,
    what: &'static str,
    run: fn(&Testbed),
}

/// The churn cycle (90 s): a node stopped and started, another cordoned and uncordoned,
/// an API server restart, pods' RBAC removed and restored.
fn cycle() -> Vec<Step> {
    vec![
        Step {
            at: 5,
            what: "node stop node-3",
            run: |tb| testbed_ok(tb, &["node", "stop", "node-3"]),
        },
        Step {
            at: 25,
            what: "node start node-3",
            run: |tb| testbed_ok(tb, &["node", "start", "node-3"]),
        },
        Step {
            at: 35,
            what: "cordon node-2",
            run: |tb| {
                tb.kubectl(&["cordon", "node-2"]);
            },
        },
        Step {
            at: 50,
            what: "uncordon node-2",
            run: |tb| {
                tb.kubectl(&["uncordon", "node-2"]);
            },
        },
        Step {
            at: 55,
            what: "api restart",
            run: |tb| testbed_ok(tb, &["api", "restart"]),
        },
        Step {
            at: 65,
            what: "api deny * pods",
            run: |tb| testbed_ok(tb, &["api", "deny", "*", "pods"]),
        },
        Step {
            at: 75,
            what: "api allow all",
            run: |tb| testbed_ok(tb, &["api", "allow", "all"]),
        },
    ]
}

const CYCLE_SECONDS: u64 = 90;

fn spawn_run(tb: &Testbed, addr: &str, log: &std::path::Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    tb.cmd()
        .args([
            "exec",
            "--",
            "prober",
            "run",
            "--probe-interval",
            "1s",
            "--concurrency",
            "2",
            "--hold",
            "1s",
            "--give-up",
            "15s",
            "--admin-addr",
            addr,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn prober run")
}

#[test]
fn prober_run_stays_within_its_bounds_through_churn_restarts_and_rbac_loss() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let long = common::long_tests();
    let (total, warm_up) = if long {
        (Duration::from_secs(30 * 60), Duration::from_secs(5 * 60))
    } else {
        (Duration::from_secs(100), Duration::from_secs(30))
    };
    let tb = Testbed::up("soak", 4, FAULT, &[]);
    let port = 20_000 + (std::process::id() % 20_000) as u16 + 7;
    let addr = format!("127.0.0.1:{port}");
    let base = format!("http://{addr}");
    let log = tb.state.join("prober-soak.log");
    let mut run = spawn_run(&tb, &addr, &log);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_ready(&tb, &base, &mut run, &logs);
    let pid = prober_pid(&addr).expect("the prober's pid");
    let t0 = Instant::now();
    let steps = cycle();
    let mut next_step = 0usize;
    let mut cycle_start = t0;
    let mut warm_rss: Option<f64> = None;
    let mut max_seen: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut violations: Vec<String> = Vec::new();
    let mut samples = 0u32;
    let mut last_sample = Instant::now() - Duration::from_secs(10);
    while t0.elapsed() < total {
        assert!(
            run.try_wait().expect("wait").is_none(),
            "prober exited\n{}",
            logs()
        );
        if next_step < steps.len()
            && cycle_start.elapsed() >= Duration::from_secs(steps[next_step].at)
        {
            eprintln!(
                "soak {:>4.0}s: {}",
                t0.elapsed().as_secs_f64(),
                steps[next_step].what
            );
            (steps[next_step].run)(&tb);
            next_step += 1;
        }
        if cycle_start.elapsed() >= Duration::from_secs(CYCLE_SECONDS) {
            cycle_start = Instant::now();
            next_step = 0;
        }
        if warm_rss.is_none() && t0.elapsed() >= warm_up {
            warm_rss = rss_mib(pid);
            eprintln!(
                "soak: RSS after warm-up ({warm_up:?}): {:.1} MiB",
                warm_rss.unwrap_or(-1.0)
            );
        }
        if last_sample.elapsed() >= Duration::from_secs(3) {
            last_sample = Instant::now();
            // The API may be down or pods denied: the admin server still answers.
            if let Some(m) = curl(&tb, &format!("{base}/metrics")) {
                samples += 1;
                for (name, (size, bound)) in state_sizes(&m) {
                    let e = max_seen.entry(name.clone()).or_insert((0.0, f64::MAX));
                    e.0 = e.0.max(size);
                    match bound {
                        Some(b) => {
                            e.1 = e.1.min(b);
                            if size > b {
                                violations.push(format!(
                                    "{:.0}s: {name} = {size} > bound {b}",
                                    t0.elapsed().as_secs_f64()
                                ));
                            }
                        }
                        None => violations.push(format!("{name} has no stated bound")),
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Leave the cluster whole before the end.
    testbed_ok(&tb, &["api", "allow", "all"]);
    testbed_ok(&tb, &["node", "start", "node-3"]);
    tb.kubectl(&["uncordon", "node-2"]);
    let end_rss = rss_mib(pid).expect("RSS at the end");
    eprintln!(
        "soak: {:.0}s, {samples} metric samples; RSS after warm-up {:.1} MiB, at the end {end_rss:.1} MiB",
        t0.elapsed().as_secs_f64(),
        warm_rss.unwrap_or(-1.0)
    );
    for (name, (max, bound)) in &max_seen {
        eprintln!("soak: {name:<22} max {max:>6} bound {bound}");
    }
    let term = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    assert!(term.is_ok(), "SIGTERM: {term:?}");
    let _ = run.wait();
    assert!(
        samples >= 10,
        "too few metric samples ({samples})\n{}",
        logs()
    );
    assert!(
        max_seen.contains_key("tracked_pods") && max_seen["tracked_pods"].0 > 0.0,
        "the prober never tracked a probe pod: {max_seen:?}\n{}",
        logs()
    );
    assert!(violations.is_empty(), "bounds broken: {violations:#?}");
    let warm = warm_rss.expect("RSS after warm-up");
    assert!(
        end_rss - warm <= LEAK_MIB,
        "RSS grew {:.1} MiB (from {warm:.1} to {end_rss:.1}): a leak",
        end_rss - warm
    );
    let left = tb.wait_no_probe_pods(POD_GONE_TIMEOUT);
    assert!(left.is_empty(), "probe pods left after SIGTERM: {left:?}");
}
