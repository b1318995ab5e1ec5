//! Real Calico Felix and real kube-proxy on the testbed's nodes (`testbed up
//! --control-plane real --agent calico --kube-proxy real`; issue 27, docs/design.md §5
//! "Real node components"): the gate against them with truth read from the nodes'
//! rulesets, faults acting on the real agent, a rolling 3.29.5 → 3.31.7 upgrade, the
//! simulated agent's `gates_readiness` judged by the real one, IPv6 through real Felix
//! on a dual-stack testbed (the healthy gates' testbed), and nothing left after `down`.
//!
//! Needs root, the real control plane (`bash scripts/control-plane.sh`, which also builds
//! kube-proxy) and Felix builds (`FIRSTPACKET_CALICO_SOURCE=… bash scripts/calico.sh`);
//! a test whose builds are missing prints `SKIPPED` and passes (`.ci/run` builds them
//! when the Calico sources are there). The tests run serially (`common::SERIAL`).

mod common;

use common::{node_ips, poll_until, sample, Testbed, SERIAL};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use testbed::calico::{Builds, DEFAULT_VERSION};
use testbed::truth::{TruthEvent, TruthKind};

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The Felix versions a test needs are built, or it prints why it is skipped.
fn felix_built(versions: &[&str]) -> bool {
    match Builds::locate().require(versions.iter().copied()) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            false
        }
    }
}

/// `testbed up` on the real control plane with real Felix (`agent`) and real
/// kube-proxy; `None` when something it needs is not built.
fn up_real_agents(
    name: &str,
    nodes: usize,
    fault: &str,
    agent: &str,
    extra: &[&str],
) -> Option<Testbed> {
    let version = agent.strip_prefix("calico:").unwrap_or(DEFAULT_VERSION);
    if !felix_built(&[version]) {
        return None;
    }
    let mut args = vec!["--agent", agent, "--kube-proxy", "real"];
    args.extend_from_slice(extra);
    Testbed::up_real(name, nodes, fault, &args)
}

/// The pid of the real Felix of `node` in testbed `tb` (its environment names the
/// node and the state dir).
fn felix_pid(tb: &Testbed, node: &str) -> Option<i32> {
    let state = tb.state.display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        if comm.trim() != "calico-felix" {
            return None;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let env = String::from_utf8_lossy(&env);
        let mine = env
            .split('\0')
            .any(|v| v == format!("FELIX_FELIXHOSTNAME={node}"))
            && env
                .split('\0')
                .any(|v| v.starts_with("KUBECONFIG=") && v.contains(&state));
        mine.then_some(pid)
    })
}

/// Each node's Felix page (`http://NODE_IP:9091/metrics` from the host netns).
fn felix_page(tb: &Testbed, node_ip: &str) -> String {
    common::curl(tb, &format!("http://{node_ip}:9091/metrics")).unwrap_or_default()
}

/// Per pod uid: (node, container_started t, endpoint_programmed t, readiness_ok t), for
/// pods whose three events are in the truth log.
fn pod_timelines(truth: &[TruthEvent]) -> BTreeMap<String, (String, f64, f64, f64)> {
    let first = |kind: TruthKind| {
        let mut m: BTreeMap<String, (String, f64)> = BTreeMap::new();
        for e in truth.iter().filter(|e| e.event == kind) {
            if let (Some(uid), Some(node)) = (&e.uid, &e.node) {
                m.entry(uid.clone()).or_insert((node.clone(), e.t));
            }
        }
        m
    };
    let (started, programmed, ready) = (
        first(TruthKind::ContainerStarted),
        first(TruthKind::EndpointProgrammed),
        first(TruthKind::ReadinessOk),
    );
    started
        .into_iter()
        .filter_map(|(uid, (node, s))| {
            let p = programmed.get(&uid)?.1;
            let r = ready.get(&uid)?.1;
            Some((uid, (node, s, p, r)))
        })
        .collect()
}

/// The slack either side of a programming wait's allowed range [0, dial interval] around
/// the truth, seconds: issue 29's 50 ms. The ruleset truth is stamped when a thread
/// reading only the node's `nft monitor` pipe reads the commit's line (before, the
/// node's busy runtime read it, up to 0.3 s late under a full CI run, and this was
/// 0.35 s); with it every wait was within 50 ms idle and beside two and four busy
/// loops on the two cores.
const TRUTH_SLACK: f64 = 0.05;

/// Every programming wait the gate measured in its pods (`probes[].programming`, issue
/// 29) is within [−[`TRUTH_SLACK`], dial interval + [`TRUTH_SLACK`]] of the truth
/// (`endpoint_programmed` − `container_started` of the same pod), and every source's
/// and target's was measured by the node dial. Returns the number checked.
fn assert_programming_waits_near_truth(truth: &[TruthEvent], report: &Value, out: &str) -> usize {
    let t = pod_timelines(truth);
    let mut checked = 0;
    for p in report["probes"].as_array().unwrap() {
        for role in ["source", "target"] {
            let w = &p["programming"][role];
            assert_eq!(
                w["method"], "node_dial",
                "probe {} {role}: programming {:#}\n{out}",
                p["id"], p["programming"]
            );
            let uid = p[role]["uid"].as_str().unwrap();
            let (_, started, programmed, _) = t
                .get(uid)
                .unwrap_or_else(|| panic!("no truth timeline for {} {role} {uid}", p["id"]));
            let want = programmed - started;
            let got = w["wait_seconds"].as_f64().unwrap();
            let err = got - want;
            let measured = if role == "source" {
                &p["source_report"]["programming"]
            } else {
                &p["source_report"]["target_programming"]
            };
            assert!(
                (-TRUTH_SLACK..=common::DIAL_INTERVAL + TRUTH_SLACK).contains(&err),
                "probe {} {role} on {}: programming wait {got:.3}s vs truth {want:.3}s \
                 (container_started {started:.6}, endpoint_programmed {programmed:.6}); \
                 the pod's measurement {measured:#}\n{out}",
                p["id"],
                p[role]["node"]
            );
            checked += 1;
        }
    }
    checked
}

/// Pods `PREFIX-NODE-I` (I < `per_node`) running `target-server serve` pinned to each of
/// `nodes`, with a 1 s readiness probe unless `probe` is false, as one manifest applied
/// with kubectl; returns its path (for `kubectl delete -f`).
fn apply_servers(
    tb: &Testbed,
    prefix: &str,
    nodes: &[&str],
    per_node: usize,
    probe: bool,
) -> String {
    let readiness = if probe {
        "    readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}\n"
    } else {
        ""
    };
    let mut pods = String::new();
    for node in nodes {
        for i in 0..per_node {
            pods.push_str(&format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {prefix}-{node}-{i}, namespace: default}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: s\n    image: target-server\n    args: [serve]\n{readiness}"
            ));
        }
    }
    let path = tb.manifest(&format!("{prefix}.yaml"), &pods);
    tb.kubectl(&["apply", "-f", &path]);
    path
}

/// [`pod_timelines`] of the truth since `t0`, polled until it holds `n` pods or `within`
/// passed.
fn timelines_since(
    tb: &Testbed,
    t0: f64,
    n: usize,
    within: Duration,
) -> BTreeMap<String, (String, f64, f64, f64)> {
    poll_until(
        within,
        || {
            pod_timelines(
                &tb.truth()
                    .into_iter()
                    .filter(|e| e.t >= t0)
                    .collect::<Vec<_>>(),
            )
        },
        |t| t.len() >= n,
    )
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// `cross_node` and `service` probes against real Felix and real kube-proxy with no
/// fault (S1 on real agents): the gate passes; every TTFP is within [−50 ms, dial
/// interval + 50 ms] of the truth read from the rulesets (for `service`, including the
/// source node's first `service_programmed` for the target); the agents table shows
/// calico-felix and kube-proxy scraped on every node; Felix's own endpoint status files
/// agree with the ruleset's truth. Then S2 on real Felix (`agent_io: {delay: 1s}` on the
/// two `os=debian13` nodes): those nodes' endpoints are programmed late, their apply time
/// rises, and their probe pods turn Ready late by about the same; every programming wait
/// the pods measured (both phases) is within [−50 ms, dial interval + 50 ms] of the
/// ruleset truth, `warnings[]` name `dataplane_apply_slow` on exactly those nodes, and
/// against the baseline S1 saved, the gate exits 1 on exactly those nodes' programming
/// waits.
/// Then `{delay: 5s}` there (issue 29): the gate exits 1 on the programming wait's p95,
/// its suspects name exactly those nodes, and each `endpoint_programming_slow` blames
/// only pods on them.
#[test]
fn s1_passes_on_real_felix_and_kube_proxy_and_s2_programs_late_on_its_nodes() {
    let _g = lock();
    let Some(tb) = up_real_agents(
        "calico-s1",
        4,
        "rules: []\n",
        "calico",
        &["--node-labels", "node-2=os=debian13,node-3=os=debian13"],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let baseline = dir.path().join("baseline.json");
    let (code, report, out) = tb.gate(&[
        "--kinds",
        "cross_node,service",
        "--pairs",
        "8",
        "--give-up",
        "20s",
        "--hold",
        "1s",
        "--save-baseline",
        baseline.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "S1 on real agents must pass:\n{out}");
    let truth = tb.truth();
    let probes = report["probes"].as_array().unwrap();
    assert!(probes.len() >= 8, "{out}");
    for p in probes {
        assert_eq!(p["result"], "success", "{p:#}");
        let programmed_by_ruleset = truth.iter().any(|e| {
            e.event == TruthKind::EndpointProgrammed
                && e.uid.as_deref() == p["target"]["uid"].as_str()
                && e.detail["method"] == "ruleset"
        });
        assert!(programmed_by_ruleset, "no ruleset truth for {}", p["id"]);
        if p["kind"] == "service" {
            let ttfp = p["ttfp_seconds"].as_f64().unwrap();
            let want = testbed::truth::truth_service_ttfp(
                &truth,
                p["source"]["uid"].as_str().unwrap(),
                p["target"]["uid"].as_str().unwrap(),
                p["source"]["node"].as_str().unwrap(),
            )
            .unwrap_or_else(|| panic!("no service truth for {}", p["id"]));
            let err = ttfp - want;
            assert!(
                (-0.05..=common::DIAL_INTERVAL + 0.05).contains(&err),
                "service probe {}: TTFP {ttfp:.3}s vs truth {want:.3}s",
                p["id"]
            );
        } else {
            common::assert_ttfp_near_truth(&truth, p, &out);
        }
    }
    for profile in ["calico-felix", "kube-proxy"] {
        let a = &report["agents"]["profiles"][profile];
        assert_eq!(
            a["nodes_with_agent"], 4,
            "{profile}: {:#}",
            report["agents"]
        );
        assert_eq!(a["nodes_ok"], 4, "{profile}: {:#}", report["agents"]);
    }
    // kubectl sees Calico's resources and Felix's log as the calico-node pod's log.
    let crs = tb.kubectl(&["get", "felixconfigurations,ippools", "-o", "name"]);
    assert!(
        crs.contains("felixconfiguration.crd.projectcalico.org/default")
            && crs.contains("ippool.crd.projectcalico.org/default-ipv4-ippool"),
        "{crs}"
    );
    let pod = tb.agent_pods()["node-1"][0].clone();
    let logs = tb.kubectl(&["logs", "-n", "kube-system", &pod, "--tail", "2000"]);
    assert!(
        logs.contains("felix/"),
        "calico-node logs are not Felix's: {logs:.400}"
    );
    let n = assert_programming_waits_near_truth(&truth, &report, &out);
    println!("S1 on real agents: {n} programming waits within tolerance of the ruleset truth");
    println!(
        "S1 on real agents: {}",
        out.lines()
            .filter(|l| l.contains("agents"))
            .collect::<Vec<_>>()
            .join(" | ")
    );

    // S2 on real Felix: every dataplane write 1 s slower on the debian13 nodes.
    let ips = node_ips(&tb);
    let apply = |node: &str| {
        let page = felix_page(&tb, &ips[node]);
        (
            sample(&page, "felix_int_dataplane_apply_time_seconds_sum").unwrap_or(0.0),
            sample(&page, "felix_int_dataplane_apply_time_seconds_count").unwrap_or(0.0),
        )
    };
    let before: BTreeMap<String, (f64, f64)> = ips.keys().map(|n| (n.clone(), apply(n))).collect();
    let t0 = testbed::truth::unix_now();
    tb.set_fault("rules:\n  - nodes: {labels: {os: debian13}}\n    agent_io: {delay: 1s}\n");
    let (code, report, out) = tb.gate(&[
        "--pairs",
        "8",
        "--give-up",
        "30s",
        "--hold",
        "1s",
        "--baseline",
        baseline.to_str().unwrap(),
    ]);
    let truth: Vec<TruthEvent> = tb.truth().into_iter().filter(|e| e.t >= t0).collect();
    let mut wait: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut ready: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (node, s, p, r) in pod_timelines(&truth).into_values() {
        wait.entry(node.clone()).or_default().push(p - s);
        ready.entry(node).or_default().push(r - s);
    }
    let mut mean_apply = BTreeMap::new();
    for (node, (s0, c0)) in &before {
        let (s1, c1) = apply(node);
        let m = if c1 > *c0 {
            (s1 - s0) / (c1 - c0)
        } else {
            f64::NAN
        };
        mean_apply.insert(node.clone(), m);
    }
    println!("S2 on real Felix (agent_io delay 1s on node-2, node-3): gate exit {code}, verdict {}, diagnosis {}", report["verdict"], report["summary"]["diagnosis"]);
    let n = assert_programming_waits_near_truth(&truth, &report, &out);
    println!(
        "S2 on real Felix: {n} programming waits within tolerance of the ruleset truth; {}",
        programming_text(&out)
    );
    for node in ips.keys() {
        println!(
            "  {node}: programming wait mean {:.2}s (n={}), container→Ready mean {:.2}s, Felix mean apply {:.3}s",
            mean(wait.get(node).map_or(&[][..], |v| v)),
            wait.get(node).map_or(0, Vec::len),
            mean(ready.get(node).map_or(&[][..], |v| v)),
            mean_apply[node]
        );
    }
    let slow = ["node-2", "node-3"];
    let fast = ["node-1", "node-4"];
    let m = |map: &BTreeMap<String, Vec<f64>>, nodes: &[&str]| {
        mean(
            &nodes
                .iter()
                .flat_map(|n| map.get(*n).cloned().unwrap_or_default())
                .collect::<Vec<_>>(),
        )
    };
    let (wait_slow, wait_fast) = (m(&wait, &slow), m(&wait, &fast));
    let (ready_slow, ready_fast) = (m(&ready, &slow), m(&ready, &fast));
    assert!(
        wait_slow > wait_fast + 0.7,
        "debian13 endpoints not programmed late: {wait_slow:.2}s vs {wait_fast:.2}s\n{out}"
    );
    for n in slow {
        for f in fast {
            assert!(
                mean_apply[n] > 5.0 * mean_apply[f] && mean_apply[n] > 0.2,
                "apply time {n} {:.3}s vs {f} {:.3}s",
                mean_apply[n],
                mean_apply[f]
            );
        }
    }
    // Felix gates readiness: the Ready delay follows the programming delay.
    let (dw, dr) = (wait_slow - wait_fast, ready_slow - ready_fast);
    assert!(
        (dr - dw).abs() < 1.2,
        "Ready late by {dr:.2}s where programming is late by {dw:.2}s"
    );
    let named = |list: &Value| -> BTreeSet<String> {
        list.as_array()
            .map(|a| {
                a.iter()
                    .filter(|s| s["signal"] == "dataplane_apply_slow")
                    .filter_map(|s| s["node"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let all_suspects = |report: &Value| -> BTreeSet<String> {
        report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| named(&p["suspects"]))
            .collect()
    };
    println!(
        "S2 1s: warnings on {:?}, suspects on {:?}",
        named(&report["warnings"]),
        all_suspects(&report)
    );
    let want: BTreeSet<String> = slow.iter().map(|s| s.to_string()).collect();
    // A 1 s slower dataplane is named on every node that has it, and on no other.
    assert_eq!(named(&report["warnings"]), want, "{out}");
    // Against the baseline S1 saved on this testbed, those nodes' programming waits
    // regressed (TTFP did not move), and no other node's did.
    assert_eq!(code, 1, "S2 1s against the S1 baseline:\n{out}");
    let regressed: BTreeSet<String> = report["baseline"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["regressed"] == true)
        .map(|e| {
            format!(
                "{}:{}",
                e["node"].as_str().unwrap_or("*"),
                e["metric"].as_str().unwrap_or("")
            )
        })
        .collect();
    let want_regressed: BTreeSet<String> = slow
        .iter()
        .map(|n| format!("{n}:programming_wait"))
        .collect();
    assert_eq!(regressed, want_regressed, "{:#}\n{out}", report["baseline"]);

    // S2 with every dataplane write 5 s slower there: the pods on those nodes wait
    // over the slow threshold before Ready; the gate fails on the programming wait and
    // names exactly those nodes' agents.
    tb.set_fault("rules:\n  - nodes: {labels: {os: debian13}}\n    agent_io: {delay: 5s}\n");
    let t0 = testbed::truth::unix_now();
    let (code, report, out) = tb.gate(&["--pairs", "8", "--give-up", "40s", "--hold", "1s"]);
    let truth: Vec<TruthEvent> = tb.truth().into_iter().filter(|e| e.t >= t0).collect();
    println!(
        "S2 5s on real Felix: gate exit {code}, verdict {}, diagnosis {}, suspects on {:?}; {}",
        report["verdict"],
        report["summary"]["diagnosis"],
        all_suspects(&report),
        programming_text(&out)
    );
    assert_eq!(code, 1, "S2 5s must fail the gate:\n{out}");
    assert!(
        report["verdict_reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str().unwrap_or("").starts_with("programming wait p95")),
        "{out}"
    );
    assert_eq!(all_suspects(&report), want, "{out}");
    for p in report["probes"].as_array().unwrap() {
        if p["reason"] == "endpoint_programming_slow" {
            let g = &p["programming"];
            for role in ["source", "target"] {
                if g[role]["over_threshold"] == true {
                    let node = p[role]["node"].as_str().unwrap();
                    assert!(slow.contains(&node), "{node} blamed: {p:#}");
                }
            }
        }
    }
    assert_programming_waits_near_truth(&truth, &report, &out);
}

/// Real-agent faults act on their node only: `agent: {restarts}` restarts Felix (the
/// calico-node pod's restartCount, a new `process_start_time_seconds`), `agent_cpu` and
/// `agent_pause` slow programming there (truth) while the other node stays fast; and a
/// simulated-agent primitive is refused naming its line.
#[test]
fn real_agent_faults_restart_starve_and_pause_felix_on_their_node_only() {
    let _g = lock();
    if !felix_built(&["v3.29.5", "v3.31.7"]) {
        return;
    }
    // node-3 starts at another version than the rest (`agent_version` at `up`).
    let Some(tb) = up_real_agents(
        "calico-faults",
        3,
        "rules:\n  - nodes: {names: [node-3]}\n    agent_version: v3.29.5\n",
        "calico",
        &[],
    ) else {
        return;
    };
    let pods = tb.agent_pods();
    for (node, [.., image, _, _]) in &pods {
        let want = if node == "node-3" {
            ":v3.29.5"
        } else {
            ":v3.31.7"
        };
        assert!(image.ends_with(want), "agent_version at up: {pods:?}");
    }
    let ips = node_ips(&tb);
    let start_time =
        |node: &str| sample(&felix_page(&tb, &ips[node]), "process_start_time_seconds");
    let before = start_time("node-1").expect("Felix page on node-1");

    // A simulated-agent primitive does not apply to real Felix.
    let bad = tb.state.join("bad-fault.yaml");
    std::fs::write(
        &bad,
        "rules:\n  - nodes: {all: true}\n    program_delay: 2s\n",
    )
    .unwrap();
    let out = tb.cmd().args(["fault", "set"]).arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("line 3") && err.contains("program_delay"),
        "{err}"
    );

    tb.set_fault(
        "rules:\n  - nodes: {names: [node-1]}\n    until: 6s\n    agent: {restarts: {every: 3s}}\n",
    );
    let restarts = poll_until(
        Duration::from_secs(40),
        || tb.agent_pods()["node-1"].clone(),
        |[.., restarts, ready]| restarts.parse::<u32>().is_ok_and(|n| n >= 1) && ready == "True",
    );
    assert!(
        ["1", "2"].contains(&restarts[3].as_str()) && restarts[4] == "True",
        "restartCount/Ready: {restarts:?}"
    );
    let after = poll_until(
        Duration::from_secs(20),
        || start_time("node-1"),
        |v| v.is_some_and(|v| v > before),
    );
    assert!(
        after.is_some_and(|a| a > before),
        "process_start_time_seconds {before} → {after:?}"
    );

    // agent_cpu on node-2, agent_pause on node-3: new pods there wait; node-1 does not.
    let t0 = testbed::truth::unix_now();
    tb.set_fault(
        "rules:\n  - nodes: {names: [node-2]}\n    agent_cpu: {quota: 2%}\n  - nodes: {names: [node-3]}\n    agent_pause: {every: 10s, for: 6s}\n",
    );
    // Create the pods while node-3's Felix is stopped (its first pause starts 10 s in and lasts 6 s).
    wait_felix_paused(&tb, "node-3", Duration::from_secs(15));
    let path = apply_servers(&tb, "w", &["node-1", "node-2", "node-3"], 2, true);
    let timelines = timelines_since(&tb, t0, 6, Duration::from_secs(90));
    tb.set_fault("rules: []\n");
    // Felix's own word agrees with the ruleset: its endpoint status file
    // (EndpointStatusPathPrefix) is written just after the dispatch is in.
    let truth = tb.truth();
    for node in ["node-1", "node-3"] {
        for i in 0..2 {
            let pod = format!("w-{node}-{i}");
            let programmed = truth
                .iter()
                .find(|e| {
                    e.event == TruthKind::EndpointProgrammed
                        && e.pod.as_deref() == Some(pod.as_str())
                })
                .map(|e| e.t)
                .expect("programmed");
            let file = tb
                .state
                .join("calico")
                .join(node)
                .join("run/endpoint-status")
                .join(format!("k8s default%2F{pod} eth0"));
            let written = std::fs::metadata(&file)
                .and_then(|m| m.modified())
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            let lag = written - programmed;
            println!("{pod}: Felix status file {lag:+.3}s after the ruleset's endpoint_programmed");
            assert!(
                (-0.05..1.0).contains(&lag),
                "{pod}: status file {lag:+.3}s from truth"
            );
        }
    }
    let mut wait: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (node, s, p, _) in timelines.values() {
        wait.entry(node.clone()).or_default().push(p - s);
    }
    println!("programming waits under agent_cpu (node-2) / agent_pause (node-3): {wait:?}");
    assert_eq!(
        timelines.len(),
        6,
        "every pod programmed and Ready: {timelines:?}"
    );
    let w = |n: &str| mean(&wait[n]);
    assert!(w("node-1") < 1.0, "node-1 untouched: {:.2}s", w("node-1"));
    // 2 % of a CPU: Felix's few milliseconds of work for two endpoints take 0.5–1.5 s
    // of wall time (depending on where in its CFS periods the work lands), against a few
    // tens of ms on node-1; a CI run measured 0.53 s against 0.04 s.
    assert!(
        w("node-2") > (w("node-1") + 0.3).max(4.0 * w("node-1")),
        "agent_cpu: {:.2}s vs {:.2}s",
        w("node-2"),
        w("node-1")
    );
    assert!(
        w("node-3") > w("node-1") + 1.0,
        "agent_pause: {:.2}s vs {:.2}s",
        w("node-3"),
        w("node-1")
    );
    tb.kubectl(&["delete", "-f", &path, "--wait=false"]);

    // `policies: N`: N NetworkPolicies in a namespace of their own, then none.
    let count = || {
        tb.kubectl(&[
            "get",
            "networkpolicies",
            "-n",
            "testbed-policy-load",
            "-o",
            "name",
        ])
        .lines()
        .count()
    };
    tb.set_fault("rules:\n  - nodes: {all: true}\n    policies: 25\n");
    assert_eq!(poll_until(Duration::from_secs(30), count, |n| *n == 25), 25);
    tb.set_fault("rules: []\n");
    assert_eq!(poll_until(Duration::from_secs(30), count, |n| *n == 0), 0);

    // agent_io failures: Felix gives up after its retries and exits; its supervisor
    // restarts it (the pod's restartCount goes up again).
    let restart_count = || tb.agent_pods()["node-3"][3].parse::<u32>().unwrap_or(0);
    let before = restart_count();
    tb.set_fault("rules:\n  - nodes: {names: [node-3]}\n    agent_io: {fail: 1}\n");
    // A new pod makes Felix write (and fail) at once.
    apply_servers(&tb, "f", &["node-3"], 1, false);
    let after = poll_until(Duration::from_secs(90), restart_count, |n| *n > before);
    tb.set_fault("rules: []\n");
    assert!(
        after > before,
        "Felix on node-3 did not exit and restart: restartCount {before} → {after}"
    );
    let log = std::fs::read_to_string(tb.state.join("calico/node-3/log/felix.log.previous"))
        .unwrap_or_default();
    assert!(
        log.contains("agent_io"),
        "the failed writes are in the previous Felix's log"
    );

    // The files since `up` name no `agent_version`: node-3 is back at the `--agent`
    // version, like every other primitive the file stopped naming.
    let pods = poll_until(
        Duration::from_secs(30),
        || tb.agent_pods(),
        |p| p.get("node-3").is_some_and(|p| p[2].ends_with(":v3.31.7")),
    );
    assert!(pods["node-3"][2].ends_with(":v3.31.7"), "{pods:?}");

    // Nothing outlives `testbed down`: no Felix, kube-proxy or monitor of this testbed,
    // no cgroup.
    let prefix = tb.prefix();
    let cgroup = std::path::Path::new("/sys/fs/cgroup/cpu").join(format!("testbed-{prefix}"));
    assert!(cgroup.join("node-2").is_dir() || !std::path::Path::new("/sys/fs/cgroup/cpu").exists());
    let state = tb.state.display().to_string();
    drop(tb);
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let (cmd, env) = (String::from_utf8_lossy(&cmd), String::from_utf8_lossy(&env));
            (cmd.contains(&state) || env.contains(&state))
                .then(|| format!("{pid} {}", cmd.replace('\0', " ")))
        })
        .collect();
    assert!(left.is_empty(), "processes left after down: {left:?}");
    assert!(
        !cgroup.exists(),
        "cgroup {} left after down",
        cgroup.display()
    );
    for comm in ["calico-felix", "kube-proxy"] {
        let out = std::process::Command::new("pgrep")
            .args(["-x", comm])
            .output()
            .unwrap();
        assert!(
            out.stdout.is_empty(),
            "{comm} still running: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// On a 3-node testbed at v3.29.5, `agent roll --all --image …:v3.31.7 --interval 10s`
/// replaces each node's Felix in turn (new pod UID and image tag; a v3.31.7 process on
/// the page), while pods programmed before never lose their programming for longer than
/// a Felix start-up; a version not built is refused before anything changes.
#[test]
fn rolling_upgrade_from_3_29_5_to_3_31_7_keeps_programmed_endpoints() {
    let _g = lock();
    if !felix_built(&["v3.29.5", "v3.31.7"]) {
        return;
    }
    let Some(tb) = up_real_agents("calico-roll", 3, "rules: []\n", "calico:v3.29.5", &[]) else {
        return;
    };
    let path = apply_servers(&tb, "keep", &["node-1", "node-2", "node-3"], 1, true);
    for node in ["node-1", "node-2", "node-3"] {
        assert!(tb.wait_pod_ready(
            "default",
            &format!("keep-{node}-0"),
            Duration::from_secs(60)
        ));
    }
    let before: BTreeSet<String> = tb.agent_pods().values().map(|p| p[1].clone()).collect();
    // The page tells the versions apart: v3.31.7 added this family (v3.29.5 lacks it).
    const V3_31_FAMILY: &str = "# TYPE felix_int_dataplane_initial_resync_time_seconds";
    let ips = node_ips(&tb);
    for (node, ip) in &ips {
        let page = felix_page(&tb, ip);
        assert!(
            page.contains("felix_int_dataplane_apply_time_seconds"),
            "{node}: no Felix page"
        );
        assert!(!page.contains(V3_31_FAMILY), "{node} does not run v3.29.5");
    }

    let refused = tb
        .cmd()
        .args([
            "agent",
            "roll",
            "--all",
            "--image",
            "docker.io/calico/node:v3.99.0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("scripts/calico.sh"),
        "{err}"
    );

    // v3.31.7 brings CRDs v3.29.5 lacks; the first roll to it applies them.
    let staged = "stagednetworkpolicies.crd.projectcalico.org";
    let crds = || tb.kubectl(&["get", "crd", "-o", "name"]);
    assert!(!crds().contains(staged), "v3.29.5 has no {staged}");
    let t0 = testbed::truth::unix_now();
    let out = tb
        .cmd()
        .args([
            "agent",
            "roll",
            "--all",
            "--image",
            "docker.io/calico/node:v3.31.7",
            "--interval",
            "10s",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = tb.agent_pods();
    for (node, [_, uid, image, _, _]) in &after {
        assert!(
            !before.contains(uid),
            "{node}'s calico-node pod not replaced: {after:?}"
        );
        assert!(image.ends_with(":v3.31.7"), "{after:?}");
    }
    for (node, ip) in &ips {
        let page = poll_until(
            Duration::from_secs(20),
            || felix_page(&tb, ip),
            |p| p.contains(V3_31_FAMILY),
        );
        assert!(
            page.contains(V3_31_FAMILY),
            "{node}'s page is not v3.31.7's"
        );
    }
    let truth: Vec<TruthEvent> = tb.truth().into_iter().filter(|e| e.t >= t0).collect();
    let rolled: Vec<&TruthEvent> = truth
        .iter()
        .filter(|e| e.event == TruthKind::AgentRolled)
        .collect();
    assert_eq!(rolled.len(), 3, "one agent_rolled per node");
    let gaps: Vec<f64> = rolled.windows(2).map(|w| w[1].t - w[0].t).collect();
    assert!(
        gaps.iter().all(|g| *g >= 10.0),
        "nodes rolled one after another, 10 s apart: {gaps:?}"
    );
    // No kept endpoint loses its programming for longer than a Felix start-up.
    let revoked = truth
        .iter()
        .filter(|e| e.event == TruthKind::EndpointRevoked)
        .count();
    println!("rolled 3 nodes 3.29.5 → 3.31.7, gaps {gaps:?}; endpoint_revoked during the roll: {revoked}");
    for e in truth
        .iter()
        .filter(|e| e.event == TruthKind::EndpointRevoked)
    {
        let back = truth
            .iter()
            .find(|x| x.event == TruthKind::EndpointProgrammed && x.uid == e.uid && x.t >= e.t)
            .map(|x| x.t - e.t);
        assert!(
            back.is_some_and(|b| b < 10.0),
            "{:?} revoked at {} and back after {back:?}",
            e.pod,
            e.t
        );
    }
    assert!(
        crds().contains(staged),
        "the roll to v3.31.7 applied its CRDs"
    );
    // A fault file's `agent_version` rolls the nodes it names (and only those).
    tb.set_fault("rules:\n  - nodes: {names: [node-2]}\n    agent_version: v3.29.5\n");
    let pods = poll_until(
        Duration::from_secs(60),
        || tb.agent_pods(),
        |p| p.get("node-2").is_some_and(|p| p[2].ends_with(":v3.29.5")),
    );
    for (node, [.., image, _, _]) in &pods {
        let want = if node == "node-2" {
            ":v3.29.5"
        } else {
            ":v3.31.7"
        };
        assert!(image.ends_with(want), "agent_version: {pods:?}");
    }
    tb.kubectl(&["delete", "-f", &path, "--wait=false"]);
}

/// `--agent calico` is refused without the real control plane, and a Felix version
/// that is not built is refused before anything starts, naming scripts/calico.sh.
#[test]
fn real_agents_are_refused_without_the_real_control_plane_or_a_build() {
    let _g = lock();
    let state = std::env::temp_dir().join(format!("fp-calico-refuse-{}", std::process::id()));
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_testbed"))
            .arg("--state-dir")
            .arg(&state)
            .arg("up")
            .args(args)
            .env_remove("FIRSTPACKET_CONTROL_PLANE")
            .output()
            .unwrap()
    };
    let out = run(&["--agent", "calico", "--control-plane", "builtin"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--control-plane real"),
        "{err}"
    );
    let out = run(&["--kube-proxy", "real"]);
    assert!(!out.status.success());
    let out = run(&["--agent", "calico:v3.0.99", "--control-plane", "real"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("scripts/calico.sh") && err.contains("v3.0.99"),
        "{err}"
    );
    assert!(!state.join("daemon.pid").exists(), "nothing started");
    let _ = std::fs::remove_dir_all(&state);
}

/// Side by side: real Felix with every dataplane write slowed on one node, and the
/// simulated agent with `gates_readiness: true` whose `program_delay` on each node is
/// the programming wait measured on real Felix there: readiness-probed pods on the slowed
/// node turn Ready later than on the other by the same amount, within 1.2 s (the
/// kubelet's 1 s probe period plus jitter).
#[test]
fn simulated_readiness_gating_delays_ready_like_real_felix() {
    let _g = lock();
    let Some(real) = up_real_agents(
        "calico-gate",
        2,
        "rules:\n  - nodes: {names: [node-2]}\n    agent_io: {delay: 1500ms}\n",
        "calico",
        &[],
    ) else {
        return;
    };
    let sim = Testbed::up("sim-gate", 2, "rules: []\n", &[]);
    let measure = |tb: &Testbed| {
        let t0 = testbed::truth::unix_now();
        let path = apply_servers(tb, "g", &["node-1", "node-2"], 3, true);
        let t = timelines_since(tb, t0, 6, Duration::from_secs(60));
        tb.kubectl(&["delete", "-f", &path, "--wait=false"]);
        let mut by_node: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for (node, s, p, r) in t.values() {
            let e = by_node.entry(node.clone()).or_default();
            e.0.push(p - s);
            e.1.push(r - s);
        }
        by_node
    };
    let real_t = measure(&real);
    let wait_real = mean(&real_t["node-2"].0);
    // Each simulated node programs as late as real Felix did on the same node: Felix
    // takes its own time on the unslowed node too (about 1 s under CI load), and Ready
    // there is late by that much, so only matching both nodes compares like with like.
    let delay_ms = |node: &str| (mean(&real_t[node].0).max(0.0) * 1000.0) as u64;
    sim.set_fault(&format!(
        "rules:\n  - nodes: {{all: true}}\n    agent: {{gates_readiness: true}}\n  - nodes: {{names: [node-1]}}\n    program_delay: {}ms\n  - nodes: {{names: [node-2]}}\n    program_delay: {}ms\n",
        delay_ms("node-1"),
        delay_ms("node-2")
    ));
    let sim_t = measure(&sim);
    // The gate measures the same wait in its own pods on the simulated agent.
    let t0 = testbed::truth::unix_now();
    let (_, report, out) = sim.gate(&["--pairs", "2", "--give-up", "20s", "--hold", "1s"]);
    let truth: Vec<TruthEvent> = sim.truth().into_iter().filter(|e| e.t >= t0).collect();
    let n = assert_programming_waits_near_truth(&truth, &report, &out);
    assert!(n >= 4, "{out}");
    let ready =
        |t: &BTreeMap<String, (Vec<f64>, Vec<f64>)>| mean(&t["node-2"].1) - mean(&t["node-1"].1);
    let (r_real, r_sim) = (ready(&real_t), ready(&sim_t));
    println!(
        "Ready late on node-2: real Felix {r_real:.2}s (programming wait {wait_real:.2}s, node-1 {:.2}s), simulated gates_readiness {r_sim:.2}s",
        mean(&real_t["node-1"].0)
    );
    assert!(r_real > 0.8, "real Felix did not delay Ready: {r_real:.2}s");
    assert!(
        (r_real - r_sim).abs() < 1.2,
        "real {r_real:.2}s vs simulated {r_sim:.2}s"
    );
}

/// Waits up to `limit` for `node`'s Felix to be stopped (fault `agent_pause`: process
/// state `T`); panics when it is not.
fn wait_felix_paused(tb: &Testbed, node: &str, limit: Duration) {
    let stopped = poll_until(
        limit,
        || {
            felix_pid(tb, node).map(|pid| {
                common::proc_status(pid)
                    .get("State")
                    .cloned()
                    .unwrap_or_default()
            })
        },
        |s| s.as_deref().is_some_and(|s| s.starts_with('T')),
    );
    assert!(
        stopped.as_deref().is_some_and(|s| s.starts_with('T')),
        "{node}'s Felix not paused: {stopped:?}"
    );
}

/// The gate text's programming-wait lines (the prober gate module's `programming_lines`), on one
/// line, for the test's printout.
fn programming_text(out: &str) -> String {
    out.lines()
        .filter(|l| {
            ["programming wait", "where the delay", "pods waiting"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Every node the gate's output names for Felix: suspects and warnings from the
/// calico-felix profile, but for `agent_not_ready` (agent pods turn Ready a moment
/// after `up` on a loaded machine, and kube-proxy's readiness flaps there: not what
/// these faults are about), and nodes whose pods' programming wait was over the slow
/// threshold.
fn named_nodes(report: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let felix = |s: &Value| {
        let e = &s["evidence"];
        s["signal"] != "agent_not_ready"
            && (e["profile"] == "calico-felix" || e["by_profile"].get("calico-felix").is_some())
    };
    let mut add = |list: &Value| {
        for s in list.as_array().into_iter().flatten().filter(|s| felix(s)) {
            if let Some(n) = s["node"].as_str() {
                out.insert(n.to_string());
            }
        }
    };
    add(&report["warnings"]);
    for p in report["probes"].as_array().unwrap() {
        add(&p["suspects"]);
    }
    for p in report["probes"].as_array().unwrap() {
        for role in ["source", "target"] {
            if p["programming"][role]["over_threshold"] == true {
                out.insert(p[role]["node"].as_str().unwrap().to_string());
            }
        }
    }
    out
}

/// Healthy real Felix: 5 gates in a row (100 with `FIRSTPACKET_LONG_TESTS=1`), none
/// fails and none has a probe other than `success`: the programming wait and the
/// agents' pages raise no false alarm (issue 29). Warnings are counted and printed.
///
/// The testbed is dual-stack (`--ip-families ipv4,ipv6`, so the simulated kube-proxy:
/// `testbed up` refuses real kube-proxy with IPv6), and Felix programs IPv6 too: one more
/// gate with every path (`--protocols tcp,udp --payload mtu --ip-families ipv4,ipv6`)
/// passes with each IPv4 and IPv6 path `success`, each path's TTFP within tolerance of
/// the truth read from the nodes' rulesets (on a dual-stack node an endpoint is
/// programmed once `table ip filter` and `table ip6 filter` both dispatch it and both
/// its `/32` and `/128` are routed: testbed/src/ruleset.rs); and a pod's interface is
/// dispatched by Felix's own chains in the node's `table ip6 filter`
/// (felix/rules/dispatch.go), behind the dispatch chains' final drop of unknown
/// interfaces: with node-2's Felix stopped a new pod there is not dispatched, has no
/// `endpoint_programmed`, and TCP over IPv6 to it fails, dropped by that rule (its
/// counter grows); once Felix runs again the pod is dispatched, its
/// `endpoint_programmed` is written, and the same connection succeeds.
#[test]
fn healthy_gates_on_real_felix_have_no_false_failures() {
    let _g = lock();
    if !felix_built(&[DEFAULT_VERSION]) {
        return;
    }
    let Some(tb) = Testbed::up_real(
        "calico-healthy",
        3,
        "rules: []\n",
        &["--agent", "calico", "--ip-families", "ipv4,ipv6"],
    ) else {
        return;
    };
    let runs = if common::long_tests() { 100 } else { 5 };
    let mut failures = Vec::new();
    let mut warned = 0;
    let mut max_wait: f64 = 0.0;
    for i in 0..runs {
        let (code, report, out) = tb.gate(&["--pairs", "3", "--give-up", "20s", "--hold", "1s"]);
        max_wait = max_wait.max(
            report["summary"]["programming_wait_max"]
                .as_f64()
                .unwrap_or(0.0),
        );
        // A false failure: the gate fails, or a probe is not a success (that blames its
        // nodes). Warnings are not failures (an agent pod that turns Ready a moment after
        // `up` on a loaded machine is one); they are counted.
        let blamed: BTreeSet<String> = report["probes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["result"] != "success")
            .flat_map(|p| [p["source"]["node"].clone(), p["target"]["node"].clone()])
            .filter_map(|n| n.as_str().map(String::from))
            .collect();
        if code != 0 || !blamed.is_empty() {
            failures.push(format!("gate {i}: exit {code}, blamed {blamed:?}\n{out}"));
        }
        warned += report["warnings"].as_array().map_or(0, Vec::len);
    }
    println!(
        "healthy gates on real Felix: {runs} run, {} false failures, {warned} warnings, longest programming wait {max_wait:.2}s",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // IPv6 through Felix's real rules: every path of fresh pod pairs passes.
    let t6 = std::time::Instant::now();
    let (code, report, out) =
        common::paths::gate_every_path(&tb, 2, &["--give-up", "10s", "--ip-families", "ipv4,ipv6"]);
    assert_eq!(code, 0, "{out}");
    let got = common::paths::paths(&report);
    let probes = report["probes"].as_array().unwrap().len();
    assert!(probes >= 2, "{out}");
    assert_eq!(
        got.len(),
        8 * probes,
        "eight paths per probe: {got:?}\n{out}"
    );
    assert_eq!(
        got.iter()
            .filter(|(_, p, _, _)| p.contains("/ipv6/"))
            .count(),
        4 * probes,
        "{out}"
    );
    for (kind, path, result, reason) in &got {
        assert_eq!(
            (result.as_str(), reason.as_str()),
            ("success", "none"),
            "{kind} {path}\n{out}"
        );
    }
    common::paths::paths_near_truth(&tb.truth(), &report, &out);

    // IPv6 passes only once Felix programs it. node-2's Felix is stopped (SIGSTOP)
    // while a pod starts there: the pod has its IPv6 address and /128 route (the
    // testbed's CNI), but its interface is not in Felix's dispatch chains of the node's
    // `table ip6 filter` (iptables-nft), whose final rule drops unknown `cali*`
    // interfaces, and TCP over IPv6 from node-1 to it gets nowhere. After SIGCONT Felix
    // dispatches the interface both ways and the same connection succeeds.
    let felix = felix_pid(&tb, "node-2").expect("node-2's Felix");
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &felix.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    };
    /// Resumes the stopped Felix however the check ends.
    struct Resume<F: Fn(&str) -> bool>(F);
    impl<F: Fn(&str) -> bool> Drop for Resume<F> {
        fn drop(&mut self) {
            (self.0)("-CONT");
        }
    }
    let iface = testbed::dataplane::calico_iface_name("default", "v6-node-2-0");
    let prefix = tb.prefix();
    let in_netns = |node: &str, argv: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &format!("{prefix}-{node}")])
            .args(argv)
            .output()
            .expect("ip netns exec");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let ip6_filter = || in_netns("node-2", &["nft", "list", "table", "ip6", "filter"]).1;
    let (from, to) = (
        format!("iifname \"{iface}\""),
        format!("oifname \"{iface}\""),
    );
    let dispatched = |t: &str| {
        t.lines()
            .any(|l| l.contains(&from) && l.contains(&format!("goto cali-fw-{iface}")))
            && t.lines()
                .any(|l| l.contains(&to) && l.contains(&format!("goto cali-tw-{iface}")))
    };
    assert!(signal("-STOP"), "kill -STOP {felix}");
    let resume = Resume(signal);
    let path = apply_servers(&tb, "v6", &["node-2"], 1, false);
    let pod_ip6 = tb.kubectl_until(
        &[
            "get",
            "pod",
            "v6-node-2-0",
            "-o",
            "jsonpath={.status.podIPs[1].ip}",
        ],
        Duration::from_secs(20),
        |o| o.contains(':'),
    );
    let pod_ip6 = pod_ip6.trim().to_owned();
    let url = format!("http://[{pod_ip6}]:8080/readyz");
    let dial = |max_time: &str| {
        in_netns(
            "node-1",
            &["curl", "-gsf", "--noproxy", "*", "-m", max_time, &url],
        )
        .0
    };
    // Packets the drops of Felix's to-workload dispatch chains (`cali-to-wl-dispatch`
    // and its prefix subchains, "Unknown interface": felix/rules/dispatch.go) counted.
    let unknown_drops = |t: &str| {
        let mut chain = "";
        let mut n = 0u64;
        for l in t.lines().map(str::trim) {
            if let Some(c) = l.strip_prefix("chain ") {
                chain = c.trim_end_matches(" {").trim();
            } else if chain.starts_with("cali-to-wl-dispatch") && l.ends_with("drop") {
                n += l
                    .split_whitespace()
                    .skip_while(|w| *w != "packets")
                    .nth(1)
                    .and_then(|w| w.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        n
    };
    let uid = tb.kubectl(&[
        "get",
        "pod",
        "v6-node-2-0",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let programmed_at = || {
        tb.truth()
            .into_iter()
            .find(|e| e.event == TruthKind::EndpointProgrammed && e.uid.as_deref() == Some(&uid))
            .map(|e| e.detail["families"].clone())
    };
    let drops0 = unknown_drops(&ip6_filter());
    let connected = dial("1");
    let t = ip6_filter();
    let before = (
        dispatched(&t),
        connected,
        unknown_drops(&t) > drops0,
        programmed_at().is_some(),
    );
    let routes = in_netns("node-2", &["ip", "-6", "route", "show", "dev", &iface]).1;
    drop(resume);
    assert!(
        pod_ip6.contains(':') && routes.lines().any(|l| l.starts_with(&pod_ip6)),
        "{pod_ip6:?} not routed to {iface}: {routes}"
    );
    assert_eq!(
        before,
        (false, false, true, false),
        "with Felix stopped, {iface} (dispatched, IPv6 connected, dropped by Felix's \
         unknown-interface rule, endpoint_programmed) to {pod_ip6}"
    );
    let ip6 = poll_until(Duration::from_secs(20), ip6_filter, |t| dispatched(t));
    assert!(
        dispatched(&ip6),
        "{iface} not dispatched in ip6 filter:\n{ip6}"
    );
    for chain in ["cali-from-wl-dispatch", "cali-to-wl-dispatch"] {
        let c = in_netns("node-2", &["nft", "list", "chain", "ip6", "filter", chain]).1;
        let last = c
            .lines()
            .rev()
            .find(|l| l.contains("counter"))
            .unwrap_or("");
        assert!(
            last.contains("drop"),
            "{chain} does not end in a drop:\n{c}"
        );
    }
    let after = poll_until(Duration::from_secs(10), || dial("2"), |ok| *ok);
    assert!(
        after,
        "IPv6 to {pod_ip6} still fails after Felix programmed {iface}"
    );
    let families = poll_until(Duration::from_secs(10), programmed_at, Option::is_some);
    assert_eq!(
        families,
        Some(serde_json::json!(["ipv4", "ipv6"])),
        "endpoint_programmed for {uid} after Felix resumed, from both families' rules"
    );
    tb.kubectl(&["delete", "-f", &path, "--wait=false"]);
    println!(
        "dual-stack paths gate and ip6 ruleset check on real Felix: {:.1}s",
        t6.elapsed().as_secs_f64()
    );
}

/// Real Felix starved of CPU (`agent_cpu: {quota: 2%}`) on node-2, then paused for 20 s
/// on node-3 while the gate's probes start there: each gate names its faulty node and no
/// other (issue 29).
#[test]
fn gates_name_a_starved_and_a_paused_felix_and_no_other_node() {
    let _g = lock();
    let Some(tb) = up_real_agents("calico-named", 3, "rules: []\n", "calico", &[]) else {
        return;
    };
    tb.set_fault("rules:\n  - nodes: {names: [node-2]}\n    agent_cpu: {quota: 2%}\n");
    let (code, report, out) = tb.gate(&["--pairs", "6", "--give-up", "40s", "--hold", "1s"]);
    println!(
        "agent_cpu 2% on node-2: gate exit {code}, named {:?}; {}",
        named_nodes(&report),
        programming_text(&out)
    );
    assert_eq!(
        named_nodes(&report),
        BTreeSet::from(["node-2".to_string()]),
        "{out}"
    );

    // node-3's Felix stops 21 s after the fault is set, for 20 s: start the gate then.
    tb.set_fault("rules:\n  - nodes: {names: [node-3]}\n    agent_pause: {every: 21s, for: 20s}\n");
    wait_felix_paused(&tb, "node-3", Duration::from_secs(30));
    let (code, report, out) = tb.gate(&["--pairs", "6", "--give-up", "40s", "--hold", "1s"]);
    tb.set_fault("rules: []\n");
    println!(
        "agent_pause 20s on node-3: gate exit {code}, named {:?}; {}",
        named_nodes(&report),
        programming_text(&out)
    );
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        named_nodes(&report),
        BTreeSet::from(["node-3".to_string()]),
        "{out}"
    );
}
