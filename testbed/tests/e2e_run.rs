//! End-to-end test of `prober run` (continuous mode) on the testbed, in-cluster: the
//! prober as a Deployment with the book's RBAC, scraped from another pod (`/metrics`
//! and `/api/v1/probes` agree, every node source and target), its probe pods owned by
//! its pod, SIGTERM to the container → exit 0 with its probe pods deleted by the prober
//! itself, and after `kill -9` the restarted container removes its previous
//! incarnation's probe pods.
//!
//! The run loop's engine logic (metrics vs records, leader election, the janitor and
//! the reaper, change-triggered probes, slow-node Events, API outages) is tested without
//! root in `prober/tests/engine_run.rs`.
//!
//! Needs root and the workspace binaries (`cargo build --workspace --bins`).

mod common;

use common::{Testbed, SERIAL};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
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

/// A consistent scrape from another pod, as Prometheus scrapes: one `curl` run in a
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

/// ServiceAccount `firstpacket/prober` with the verbs docs/src/install.md's "RBAC"
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
