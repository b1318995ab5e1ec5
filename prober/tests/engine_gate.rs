//! Middle tier: the gate's policy and the engine's robustness, `prober gate` (and `prober
//! cleanup`) in-process against the cluster of `tests/cluster` (no root, no packets; each
//! test in its own network namespace with only loopback). What the gate does when
//! admission rejects its pods, when the API server goes away or answers 403 / 410 Gone,
//! when its early stop or `--timeout` cuts probes short, when it is killed mid-probe,
//! which nodes it skips, when it may create its namespace, and when an unschedulable pod
//! is given up on (docs/design.md §2 "Results", §4 "Gate", §6). Each test checks the
//! gate's JSON report (validated against the schema), its exit code, and the pods left
//! in the API afterwards.

use crate::cluster;

use cluster::{endings, eventually, ok, run, Act, Cluster, Outcome, PodView};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::api::Kind;

/// The probe namespace of the gate's defaults.
const NS: &str = "firstpacket";

type GateOutcome = (Result<i32, prober::Error>, Option<Value>);

/// `prober gate` with [`Cluster::gate_args`]`(extra)` as a future that does not borrow
/// the cluster: the test can stop and start the API server meanwhile, or drop the
/// future mid-probe (the in-process `kill -9`: its probes and its Lease renewal stop at
/// once; only background tasks it spawned, such as its pod watch and Lease reaper,
/// outlive it).
fn gate_owned(c: &Cluster, extra: &[&str]) -> impl Future<Output = GateOutcome> + 'static {
    let argv = c.gate_args(extra);
    let report = c.report_path();
    async move {
        use clap::Parser;
        let cli = prober::config::Cli::try_parse_from(argv).expect("gate args");
        let prober::config::Command::Gate(args) = cli.command else {
            unreachable!()
        };
        let _ = std::fs::remove_file(&report);
        let code = prober::gate_run::run_gate(args).await;
        let report = std::fs::read_to_string(&report)
            .ok()
            .map(|s| serde_json::from_str(&s).expect("report is JSON"));
        (code, report)
    }
}

/// The exit code `main` gives the gate's result (an `Err` is exit 2).
fn exit_code(code: &Result<i32, prober::Error>) -> i32 {
    match code {
        Ok(c) => *c,
        Err(_) => 2,
    }
}

/// The report, which must exist and match the published JSON Schema.
fn checked(report: Option<Value>) -> Value {
    let report = report.expect("the gate wrote its report");
    let schema: Value =
        serde_json::from_str(firstpacket_report::GATE_REPORT_SCHEMA).expect("schema json");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&report)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "schema violations: {errors:#?}\n{report:#}"
    );
    report
}

fn probes(report: &Value) -> Vec<Value> {
    report["probes"].as_array().cloned().unwrap_or_default()
}

fn errors_text(report: &Value) -> String {
    report["errors"].to_string()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

/// Seconds from the probe's start to its record (prober clock).
fn probe_seconds(p: &Value) -> f64 {
    p["timeline"]["finished"]
        .as_f64()
        .expect("timeline.finished")
}

/// A source that gets no answer before its `--give-up`; every other pod healthy.
fn sources_never_answer() -> cluster::Script {
    Arc::new(|p: &PodView| {
        if p.role == "source" {
            Act::Run {
                ready_after: Duration::from_millis(20),
                ttfp: None,
                outcome: Outcome::AsDialed,
            }
        } else {
            ok(100)
        }
    })
}

/// The probe pods in the store labelled with `instance`.
fn pods_of(c: &Cluster, instance: &str) -> Vec<Value> {
    c.probe_pods()
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["firstpacket.io/instance"] == instance)
        .collect()
}

fn instances(c: &Cluster) -> BTreeSet<String> {
    c.probe_pods()
        .iter()
        .filter_map(|p| p["metadata"]["labels"]["firstpacket.io/instance"].as_str())
        .map(str::to_owned)
        .collect()
}

fn terminating(pods: &[Value]) -> Vec<String> {
    pods.iter()
        .filter(|p| !p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| str_of(&p["metadata"], "name").to_owned())
        .collect()
}

fn lease_exists(c: &Cluster, instance: &str) -> bool {
    c.store
        .get(Kind::Lease, Some(NS), &prober::lease::lease_name(instance))
        .is_ok()
}

/// Starts a gate with `extra` and drops it (the in-process `kill -9`) once it has `n`
/// probe pods in the API; its instance id.
async fn kill_gate(c: &Cluster, extra: &[&str], n: usize) -> String {
    let before = instances(c);
    let new_with_pods = || {
        instances(c)
            .into_iter()
            .find(|i| !before.contains(i) && pods_of(c, i).len() >= n)
    };
    let gate = gate_owned(c, extra);
    let found = async {
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(i) = new_with_pods() {
                return i;
            }
            assert!(Instant::now() < end, "the gate never had {n} probe pods");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        (code, report) = gate => panic!("the gate ended before it was killed: {code:?} {report:#?}"),
        i = found => i,
    }
}

/// `prober cleanup ARGS…` in-process against the cluster.
async fn cleanup(c: &Cluster, extra: &[&str]) -> Result<i32, prober::Error> {
    use clap::Parser;
    let kubeconfig = c.kubeconfig.display().to_string();
    let mut argv = vec!["prober", "cleanup", "--kubeconfig", kubeconfig.as_str()];
    argv.extend_from_slice(extra);
    let cli = prober::config::Cli::try_parse_from(argv).expect("cleanup args");
    let prober::config::Command::Cleanup(args) = cli.command else {
        unreachable!()
    };
    prober::cleanup::run_cleanup(args).await
}

fn cordon(c: &Cluster, node: &str) {
    c.store
        .modify(Kind::Node, None, node, |n| {
            n["spec"]["unschedulable"] = json!(true);
            Ok(())
        })
        .expect("cordon");
}

/// Waits until the scripted kubelet started `n` source pods (so the probes are mid-run).
async fn sources_started(c: &Cluster, n: usize) {
    let started = eventually(Duration::from_secs(10), || {
        cluster::lock(&c.kubelet.started)
            .iter()
            .filter(|(name, _)| name.ends_with("-s"))
            .count()
            >= n
    })
    .await;
    assert!(started, "{n} source pod(s) never started");
}

fn pod_phase(c: &Cluster, name: &str) -> String {
    c.store
        .get(Kind::Pod, Some(NS), name)
        .map(|p| str_of(&p["status"], "phase").to_owned())
        .unwrap_or_default()
}

/// Scenario: Pod Security admission rejects the probe pods (a namespace enforcing
/// `restricted`, the hidden `--unsafe-probe-pod-privileged` spec). Restricted admits the
/// normal spec; the privileged one is `inconclusive`/`admission_rejected` naming the
/// policy and field, and the gate stops on it (exit 2), not as an RBAC error.
#[test]
fn admission_rejection_is_inconclusive_and_stops_the_gate() {
    run(|| async {
        let c = Cluster::start(2, cluster::healthy(Duration::from_millis(100))).await;
        let ns = "fp-restricted";
        c.store
            .create(
                Kind::Namespace,
                json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": {
                    "name": ns,
                    "labels": { "pod-security.kubernetes.io/enforce": "restricted" } } }),
            )
            .expect("namespace");
        let (code, report) = c.gate(&["--namespace", ns, "--pairs", "1"]).await;
        let report = checked(report);
        assert_eq!(
            exit_code(&code),
            0,
            "restricted admits the probe pods: {report:#}"
        );
        assert_eq!(endings(&report), [("success".into(), String::new())]);

        let (code, report) = c
            .gate(&[
                "--namespace",
                ns,
                "--pairs",
                "2",
                "--unsafe-probe-pod-privileged",
            ])
            .await;
        let report = checked(report);
        assert_eq!(exit_code(&code), 2, "{report:#}");
        assert_eq!(report["verdict"], "inconclusive");
        let ps = probes(&report);
        assert!(!ps.is_empty(), "{report:#}");
        for p in &ps {
            assert_eq!(
                (p["result"].as_str(), p["reason"].as_str()),
                (Some("inconclusive"), Some("admission_rejected")),
                "{p:#}"
            );
            let d = str_of(p, "detail");
            assert!(
                d.contains("rejected by admission (PodSecurity \"restricted:latest\")")
                    && d.contains("privileged"),
                "the detail names the policy and the field: {d}"
            );
        }
        let first = report["errors"][0].as_str().unwrap_or_default();
        assert!(
            first.contains("rejected by admission") && first.contains("the gate stops"),
            "errors[0]: {first}"
        );
        assert!(
            !first.contains("cannot create") && !first.contains("RBAC"),
            "not an RBAC error: {first}"
        );
        assert!(c.probe_pods().is_empty(), "{:#?}", c.probe_pods());
    });
}

/// Scenario: the API server stops while the probes wait for their targets, and comes
/// back after `DOWN`. The waits run out while nothing answers: the probes are
/// `inconclusive`/`api_error` (their targets never turn Ready: without the outage they
/// would be `target_never_ready`), the report is still written, and it holds **one**
/// outage that starts when the server stopped and lasts about as long as it was down.
/// The final cleanup, retried, removes every probe pod once the API is back.
#[test]
fn api_down_mid_probe_is_api_error_and_one_outage_of_its_length() {
    const DOWN: Duration = Duration::from_secs(4);
    run(|| async {
        let mut c = Cluster::start(
            3,
            Arc::new(|p: &PodView| {
                if p.role == "target" {
                    Act::NeverReady
                } else {
                    ok(100)
                }
            }),
        )
        .await;
        let gate = gate_owned(
            &c,
            &["--pairs", "2", "--concurrency", "2", "--give-up", "2s"],
        );
        let outage = async {
            let targets = eventually(Duration::from_secs(10), || {
                cluster::lock(&c.kubelet.started).len() >= 2
            })
            .await;
            assert!(targets, "the target pods never started");
            let stopped_at = k8s_openapi::jiff::Timestamp::now();
            let t0 = Instant::now();
            c.server.stop().await;
            tokio::time::sleep(DOWN).await;
            c.server.start().expect("restart the API server");
            (stopped_at, t0.elapsed().as_secs_f64())
        };
        let ((code, report), (stopped_at, down)) = tokio::join!(gate, outage);
        let report = checked(report);
        assert_eq!(exit_code(&code), 2, "{report:#}");
        assert_eq!(report["verdict"], "inconclusive");
        let ps = probes(&report);
        assert_eq!(ps.len(), 2, "{report:#}");
        for p in &ps {
            assert_eq!(
                (p["result"].as_str(), p["reason"].as_str()),
                (Some("inconclusive"), Some("api_error")),
                "{p:#}"
            );
            let d = str_of(p, "detail");
            assert!(
                d.contains("Kubernetes API failed while waiting for the target pod"),
                "{d}"
            );
        }
        let outages = report["api_outages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(outages.len(), 1, "one outage: {outages:#?}");
        let o = &outages[0];
        assert_eq!(o["ongoing"], false, "{o}");
        let start: k8s_openapi::jiff::Timestamp = str_of(o, "start").parse().expect("start");
        let late = (start.as_millisecond() - stopped_at.as_millisecond()) as f64 / 1000.0;
        // The first request after the stop fails at once (the watches reconnect).
        assert!(
            (-0.1..=1.0).contains(&late),
            "outage start {late:.2}s after the stop: {o}"
        );
        // It ends at the first answer: the next recovery ping (every 0.5 s) after the
        // restart.
        let seconds = o["seconds"].as_f64().expect("seconds");
        println!(
            "outage: start {late:.2}s after the stop, {seconds:.2}s long; API down {down:.2}s"
        );
        assert!(
            (down - 1.0..=down + 1.0).contains(&seconds),
            "outage {seconds:.2}s, API down {down:.2}s: {o}"
        );
        assert!(o["failed_requests"].as_u64().unwrap_or(0) >= 1, "{o}");
        assert!(c.probe_pods().is_empty(), "{:#?}", c.probe_pods());
    });
}

/// Scenario: the API server starts refusing the prober's reads of pods (watch, list and
/// get denied, the server restarted so the running watch ends) while the probes wait for
/// their targets: the waits run out with the pods unreadable, the probes are
/// `inconclusive`/`api_error` naming the 403 (not `target_never_ready`, what the pods
/// did), each probe still deletes its own pods (delete is allowed), and the report is
/// written with the final cleanup's failure (it cannot list the pods).
#[test]
fn api_refusing_pod_reads_mid_probe_is_api_error_and_still_reported() {
    run(|| async {
        let mut c = Cluster::start(
            3,
            Arc::new(|p: &PodView| {
                if p.role == "target" {
                    Act::NeverReady
                } else {
                    ok(100)
                }
            }),
        )
        .await;
        let gate = gate_owned(
            &c,
            &["--pairs", "2", "--concurrency", "2", "--give-up", "2s"],
        );
        let refuse = async {
            let targets = eventually(Duration::from_secs(10), || {
                cluster::lock(&c.kubelet.started).len() >= 2
            })
            .await;
            assert!(targets, "the target pods never started");
            for verb in ["watch", "list", "get"] {
                c.store.deny(verb, "pods");
            }
            c.server.restart().await.expect("restart");
        };
        let ((code, report), ()) = tokio::join!(gate, refuse);
        let report = checked(report);
        assert_eq!(exit_code(&code), 2, "{report:#}");
        assert_eq!(report["verdict"], "inconclusive");
        assert_eq!(report["summary"]["diagnosis"], "inconclusive");
        let ps = probes(&report);
        assert_eq!(ps.len(), 2, "{report:#}");
        for p in &ps {
            assert_eq!(
                (p["result"].as_str(), p["reason"].as_str()),
                (Some("inconclusive"), Some("api_error")),
                "{p:#}"
            );
            let d = str_of(p, "detail");
            assert!(
                d.contains("Kubernetes API failed while waiting for the target pod")
                    && d.contains("403"),
                "{d}"
            );
        }
        assert!(
            errors_text(&report).contains("final cleanup"),
            "{}",
            report["errors"]
        );
        assert!(c.probe_pods().is_empty(), "{:#?}", c.probe_pods());
    });
}

/// Scenario: a 410 Gone mid-probe. The pod watch is cut (watch denied, API server
/// restarted) while the source measures; the source terminates unseen; the watch history
/// is expired (`expire_watches`) and watching allowed again: the resume gets 410 Gone,
/// the watch re-lists and sees the source terminated. The probe ends with its real
/// result, long before the wait's deadline (give-up + hold + the source margin) would
/// have fetched the pod by name.
#[test]
fn expired_pod_watch_relists_and_the_probe_still_measures() {
    run(|| async {
        let mut c = Cluster::start(2, cluster::healthy(Duration::from_secs(1))).await;
        let gate = gate_owned(&c, &["--pairs", "1"]);
        let cut = async {
            sources_started(&c, 1).await;
            let source = cluster::lock(&c.kubelet.started)
                .iter()
                .find(|(n, _)| n.ends_with("-s"))
                .map(|(n, _)| n.clone())
                .expect("source");
            c.store.deny("watch", "pods");
            c.server.restart().await.expect("restart");
            let done = eventually(Duration::from_secs(10), || {
                pod_phase(&c, &source) == "Succeeded"
            })
            .await;
            assert!(done, "the source never terminated");
            c.store.expire_watches();
            assert!(c.store.allow("watch", "pods"));
        };
        let ((code, report), ()) = tokio::join!(gate, cut);
        let report = checked(report);
        assert_eq!(exit_code(&code), 0, "{report:#}");
        let p = &probes(&report)[0];
        assert_eq!(p["result"], "success", "{p:#}");
        let ttfp = p["ttfp_seconds"].as_f64().expect("ttfp");
        assert!((ttfp - 1.0).abs() < 0.05, "ttfp {ttfp} vs scripted 1 s");
        let took = probe_seconds(p);
        assert!(
            took < prober::probe::SOURCE_FINISH_MARGIN.as_secs_f64(),
            "the probe took {took:.1}s: the termination came from the deadline's read, \
             not from the re-list"
        );
        assert!(c.probe_pods().is_empty(), "{:#?}", c.probe_pods());
    });
}

/// Scenario: the shared pod watch (`prober::podwatch::PodWatch`) notices a deletion it
/// never got an event for: the watch is cut, the pod deleted, the history expired, and
/// once watching is allowed again the resume's 410 Gone makes it re-list without the
/// pod, which the mark-and-sweep marks deleted.
#[test]
fn relist_after_410_marks_a_pod_deleted_meanwhile() {
    run(|| async {
        let mut c = Cluster::start(1, Arc::new(|_: &PodView| Act::Ignore)).await;
        let selector = "firstpacket.io/instance=relist-test";
        c.store
            .create(
                Kind::Pod,
                json!({ "apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": "w-a", "namespace": "default",
                    "labels": { "firstpacket.io/instance": "relist-test" } },
                    "spec": { "nodeName": "node-1", "containers": [
                        { "name": "target-server", "image": "target-server", "args": ["serve"] }] } }),
            )
            .expect("pod");
        let conn = prober::engine::connect(Some(&c.kubeconfig), None)
            .await
            .expect("client");
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(conn.client.clone(), "default");
        let watch = prober::podwatch::PodWatch::start(pods, selector);
        watch
            .wait_ready(&conn.url, Duration::from_secs(10))
            .await
            .expect("pod watch ready");
        let seen = eventually(Duration::from_secs(10), || {
            watch.snapshot("w-a").and_then(|s| s.uid).is_some()
        })
        .await;
        assert!(seen, "w-a never seen by the pod watch");
        c.store.deny("watch", "pods");
        c.server.restart().await.expect("restart");
        c.store
            .delete(Kind::Pod, Some("default"), "w-a", Some(0), None)
            .expect("delete w-a");
        c.store.expire_watches();
        assert!(
            watch.snapshot("w-a").is_some_and(|s| s.deleted.is_none()),
            "the deletion reached the watch before the cut: the test cut nothing"
        );
        c.store.allow_all();
        // kube-runtime backs off after the denied resumes (0.8 s, doubling).
        let marked = eventually(Duration::from_secs(20), || {
            watch.snapshot("w-a").is_some_and(|s| s.deleted.is_some())
        })
        .await;
        assert!(
            marked,
            "the pod watch never noticed w-a's deletion after the re-list"
        );
    });
}

/// Scenario: the pod watch is lost for good (watch and list of pods denied, API server
/// restarted) while two sources measure, but a GET of a pod still works: at the wait's
/// deadline (give-up + hold + the source margin) each probe reads its source by name and
/// records the real measurement. The final cleanup cannot list the pods: a run error,
/// exit 2 (not a pass).
#[test]
fn lost_watch_is_recovered_by_reading_the_source_pod() {
    run(|| async {
        let mut c = Cluster::start(3, cluster::healthy(Duration::from_millis(500))).await;
        let (give_up, hold) = (Duration::from_secs(1), Duration::from_millis(200));
        let gate = gate_owned(
            &c,
            &["--pairs", "2", "--concurrency", "2", "--give-up", "1s"],
        );
        let cut = async {
            sources_started(&c, 2).await;
            c.store.deny("watch", "pods");
            c.store.deny("list", "pods");
            c.server.restart().await.expect("restart");
        };
        let ((code, report), ()) = tokio::join!(gate, cut);
        let report = checked(report);
        let ps = probes(&report);
        assert_eq!(ps.len(), 2, "{report:#}");
        let deadline = (give_up + hold + prober::probe::SOURCE_FINISH_MARGIN).as_secs_f64();
        for p in &ps {
            assert_eq!(p["result"], "success", "{p:#}");
            let ttfp = p["ttfp_seconds"].as_f64().expect("ttfp");
            assert!((ttfp - 0.5).abs() < 0.05, "ttfp {ttfp} vs scripted 0.5 s");
            let took = probe_seconds(p);
            assert!(
                took >= deadline - 0.5,
                "the probe ended after {took:.1}s, before its deadline ({deadline:.1}s): \
                 the watch was not cut before the source ended"
            );
        }
        assert_eq!(exit_code(&code), 2, "a run error: {report:#}");
        assert!(
            errors_text(&report).contains("final cleanup"),
            "{}",
            report["errors"]
        );
    });
}

/// Scenario: RBAC forbids a verb on pods (watch, create, delete: one fresh cluster
/// each): the gate stops at once with exit 2 and the API server's 403 (verb, resource,
/// namespace) first in `errors[]`, never waiting for `--timeout` nor going on through
/// its plan. A forbidden delete leaves the pods it could not delete (they end by their
/// `activeDeadlineSeconds`) and says that cleanup cannot work.
#[test]
fn forbidden_watch_create_or_delete_stops_the_gate_with_the_403() {
    let args = ["--pairs", "3", "--concurrency", "1", "--timeout", "40s"];
    let give_up = 3.0; // the tier's default
    run(|| async {
        let forbidding = |verb: &'static str| async move {
            let c = Cluster::start(3, cluster::healthy(Duration::from_millis(100))).await;
            c.store.deny(verb, "pods");
            let (code, report) = c.gate(&args).await;
            (c, code, checked(report))
        };

        // The list works, the watch never could: a start-up error.
        let (c, code, report) = forbidding("watch").await;
        assert!(code.is_err(), "a start-up error: {code:?}");
        assert_eq!(report["verdict"], "inconclusive");
        let errors = errors_text(&report);
        assert!(
            errors.contains(&format!("refused watch pods in namespace {NS}"))
                && errors.contains("403"),
            "{errors}"
        );
        assert!(!errors.contains("--timeout"), "{errors}");
        assert!(probes(&report).is_empty(), "{report:#}");
        assert!(report["duration_seconds"].as_f64().unwrap() < give_up);
        assert!(c.probe_pods().is_empty());
        // Its instance Lease is given back: the next prober must not wait it out as a
        // dead instance's.
        let leases: Vec<String> = c
            .store
            .list(testbed::api::Kind::Lease, Some(NS))
            .0
            .iter()
            .filter_map(|l| l["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        assert!(
            leases.is_empty(),
            "Leases left by the failed start-up: {leases:?}"
        );

        // The first create stops the run.
        let (c, code, report) = forbidding("create").await;
        assert_eq!(exit_code(&code), 2, "{report:#}");
        let first = report["errors"][0].as_str().unwrap_or_default();
        assert!(
            first.contains(&format!("refused create pod {NS}/")) && first.contains("403"),
            "{report:#}"
        );
        assert!(!errors_text(&report).contains("--timeout"), "{report:#}");
        assert!(
            probes(&report).len() <= 1,
            "no probe after the refused one: {report:#}"
        );
        assert!(report["duration_seconds"].as_f64().unwrap() < give_up);
        assert!(c.probe_pods().is_empty());

        // The first probe measures, its cleanup fails, the run stops (no more leaked
        // pairs).
        let (c, code, report) = forbidding("delete").await;
        assert_eq!(exit_code(&code), 2, "{report:#}");
        let first = report["errors"][0].as_str().unwrap_or_default();
        assert!(
            first.contains(&format!("refused delete pod {NS}/"))
                && first.contains("cleanup cannot work"),
            "{report:#}"
        );
        let errors = errors_text(&report);
        assert!(errors.contains("final cleanup cannot work"), "{errors}");
        assert!(!errors.contains("--timeout"), "{errors}");
        assert_eq!(
            endings(&report),
            [("success".into(), String::new())],
            "the first probe measured, no other ran"
        );
        // Left, and not being deleted (one read right after the gate: a delete the API
        // accepted would show at once).
        let left = c.probe_pods();
        assert_eq!(left.len(), 2, "the first probe's pods stay: {left:#?}");
        assert!(terminating(&left).is_empty(), "{left:#?}");
    });
}

/// Scenario: the early stop (`prober::gate::early_stop`). Every cross-node pair gets no
/// answer while the same_node controls pass: once two silent pairs with no node in
/// common and a passing control are in, the verdict is certain; the gate cuts the
/// remaining cross-node pairs short (`interrupted`, "stopped early"), diagnoses
/// `cross_node_broken` and fails (exit 1).
#[test]
fn cross_node_broken_stops_the_gate_early() {
    run(|| async {
        let c = Cluster::start(
            6,
            Arc::new(|p: &PodView| {
                let cross =
                    p.labels.get("firstpacket.io/kind").map(String::as_str) == Some("cross_node");
                if p.role == "source" && cross {
                    Act::Run {
                        ready_after: Duration::from_millis(20),
                        ttfp: None,
                        outcome: Outcome::AsDialed,
                    }
                } else {
                    ok(50)
                }
            }),
        )
        .await;
        let (code, report) = c
            .gate(&[
                "--kinds",
                "same_node,cross_node",
                "--concurrency",
                "2",
                "--give-up",
                "1s",
            ])
            .await;
        let report = checked(report);
        assert_eq!(exit_code(&code), 1, "{report:#}");
        assert_eq!(report["summary"]["diagnosis"], "cross_node_broken");
        assert!(
            str_of(&report, "stopped_early").contains("cross-node path is broken"),
            "{}",
            report["stopped_early"]
        );
        let stopped = |p: &Value| {
            p["result"] == "inconclusive"
                && p["reason"] == "interrupted"
                && str_of(p, "detail").contains("stopped early")
        };
        let of_kind = |k: &str| -> Vec<Value> {
            probes(&report)
                .into_iter()
                .filter(|p| p["kind"] == k)
                .collect()
        };
        let same = of_kind("same_node");
        assert_eq!(same.len(), 6, "every planned control has a record");
        assert!(same.iter().all(|p| p["result"] == "success" || stopped(p)));
        assert!(same.iter().any(|p| p["result"] == "success"));
        let cross = of_kind("cross_node");
        assert_eq!(cross.len(), 6, "every planned pair has a record");
        let failed: Vec<&Value> = cross.iter().filter(|p| p["result"] == "failed").collect();
        assert!(failed.len() >= 2, "{report:#}");
        assert!(failed
            .iter()
            .all(|p| p["reason"] == "no_success_before_give_up"));
        let cut = cross.iter().filter(|p| stopped(p)).count();
        assert_eq!(failed.len() + cut, 6, "{report:#}");
        assert!(cut >= 1, "no cross-node pair was stopped early: {report:#}");
        assert!(c.probe_pods().is_empty(), "{:#?}", c.probe_pods());
    });
}

/// Scenario: `--timeout` reached while probes wait for answers that never come: the
/// running probes end `interrupted` (their pods deleted), the ones not started get no
/// record (the run error counts them), exit 2, long before the give-up.
#[test]
fn timeout_interrupts_the_running_probes_and_leaves_no_pod() {
    run(|| async {
        let c = Cluster::start(3, sources_never_answer()).await;
        let (code, report) = c
            .gate(&[
                "--pairs",
                "3",
                "--concurrency",
                "2",
                "--give-up",
                "10s",
                "--timeout",
                "1s",
            ])
            .await;
        let report = checked(report);
        assert_eq!(exit_code(&code), 2, "{report:#}");
        assert_eq!(report["verdict"], "inconclusive");
        let e = endings(&report);
        assert_eq!(
            e,
            vec![("inconclusive".to_string(), "interrupted".to_string()); 2],
            "{report:#}"
        );
        let errors = errors_text(&report);
        assert!(errors.contains("--timeout 1s reached"), "{errors}");
        assert!(
            errors.contains("1 of 3 planned probe(s) not started"),
            "{errors}"
        );
        let took = report["duration_seconds"].as_f64().expect("duration");
        assert!((1.0..10.0).contains(&took), "took {took:.1}s");
        assert!(c.probe_pods().is_empty(), "{:#?}", c.probe_pods());
    });
}

/// Scenario: a gate killed mid-probe (its future dropped: nothing of it runs any more)
/// leaves its pods, each with the `activeDeadlineSeconds` of its flags, and its instance
/// Lease. `prober cleanup --instance` lists them and deletes nothing; with `--yes` the
/// pods and the Lease go at once.
#[test]
fn killed_gate_leaves_deadlined_pods_and_a_lease_for_prober_cleanup() {
    run(|| async {
        let c = Cluster::start(3, sources_never_answer()).await;
        let killed = kill_gate(
            &c,
            &["--pairs", "2", "--concurrency", "2", "--give-up", "30s"],
            4,
        )
        .await;
        let left = pods_of(&c, &killed);
        assert_eq!(left.len(), 4, "{left:#?}");
        let deadline = prober::podspec::active_deadline_seconds(
            Duration::from_secs(30),
            Duration::from_millis(200),
        );
        for p in &left {
            assert_eq!(
                p["spec"]["activeDeadlineSeconds"].as_i64(),
                Some(deadline),
                "{p:#}"
            );
        }
        assert!(lease_exists(&c, &killed), "no Lease of {killed}");

        assert_eq!(
            cleanup(&c, &["--instance", &killed])
                .await
                .expect("dry run"),
            0
        );
        let still = pods_of(&c, &killed);
        assert_eq!(still.len(), 4, "the dry run deleted something");
        assert!(terminating(&still).is_empty(), "{still:#?}");
        assert!(lease_exists(&c, &killed));

        assert_eq!(
            cleanup(&c, &["--instance", &killed, "--yes"])
                .await
                .expect("cleanup"),
            0
        );
        let gone = eventually(Duration::from_secs(2), || pods_of(&c, &killed).is_empty()).await;
        assert!(gone, "left: {:#?}", pods_of(&c, &killed));
        assert!(!lease_exists(&c, &killed), "the Lease of {killed} remains");
    });
}

/// Scenario: the next gate after two killed ones. The one whose Lease remains is dead
/// once nobody renewed the Lease for `LEASE_DURATION`: the next gate deletes its pods
/// and Lease (waiting for that before it ends). The one whose Lease is gone (an older
/// prober, or no RBAC for Leases) is not provably dead: its young pods are kept, not
/// deleted. The next gate itself passes.
#[test]
fn next_gate_reaps_a_killed_gate_by_its_lease_and_keeps_unleased_pods() {
    run(|| async {
        let c = Cluster::start(3, sources_never_answer()).await;
        let flags = ["--pairs", "1", "--give-up", "30s"];
        // In this order, so that no killed gate saw another's Lease at its start: a
        // dropped gate's Lease reaper task outlives it (a real kill ends it too), and
        // would otherwise do the next gate's work.
        let unleased = kill_gate(&c, &flags, 2).await;
        c.store
            .delete(
                Kind::Lease,
                Some(NS),
                &prober::lease::lease_name(&unleased),
                None,
                None,
            )
            .expect("delete the Lease");
        let leased = kill_gate(&c, &flags, 2).await;
        assert!(lease_exists(&c, &leased));
        let kept = pods_of(&c, &unleased);
        assert_eq!(kept.len(), 2);

        c.set_script(cluster::healthy(Duration::from_millis(100)));
        let (code, report) = c.gate(&["--pairs", "1"]).await;
        let report = checked(report);
        assert_eq!(exit_code(&code), 0, "{report:#}");
        let took = report["duration_seconds"].as_f64().expect("duration");
        assert!(
            took >= prober::lease::LEASE_DURATION.as_secs_f64(),
            "a Lease is dead only after {:?} unrenewed; the gate took {took:.1}s",
            prober::lease::LEASE_DURATION
        );
        assert!(
            pods_of(&c, &leased).is_empty(),
            "{:#?}",
            pods_of(&c, &leased)
        );
        assert!(
            !lease_exists(&c, &leased),
            "the dead instance's Lease remains"
        );
        let now = pods_of(&c, &unleased);
        assert_eq!(now.len(), kept.len(), "kept pods were deleted: {now:#?}");
        assert!(terminating(&now).is_empty(), "{now:#?}");
    });
}

/// Scenario: a cordoned node and a NotReady node are left out of the plan and listed in
/// `skipped_nodes` with why; one pair per remaining node, none on the skipped ones.
#[test]
fn cordoned_and_not_ready_nodes_are_skipped() {
    run(|| async {
        let c = Cluster::start(4, cluster::healthy(Duration::from_millis(100))).await;
        cordon(&c, "node-3");
        c.set_node_ready("node-4", false);
        let (code, report) = c.gate(&[]).await;
        let report = checked(report);
        assert_eq!(exit_code(&code), 0, "{report:#}");
        let skipped: Vec<(String, String)> = report["skipped_nodes"]
            .as_array()
            .expect("skipped_nodes")
            .iter()
            .map(|s| (str_of(s, "node").to_owned(), str_of(s, "reason").to_owned()))
            .collect();
        assert_eq!(
            skipped,
            [
                ("node-3".to_string(), "cordoned".to_string()),
                ("node-4".to_string(), "not Ready".to_string())
            ]
        );
        let ps = probes(&report);
        assert_eq!(ps.len(), 2, "one pair per schedulable, Ready node");
        for p in &ps {
            for role in ["source", "target"] {
                let node = str_of(&p[role], "node");
                assert!(node == "node-1" || node == "node-2", "{p:#}");
            }
        }
    });
}

/// Scenario: the probe namespace is missing. A gate that may not create namespaces stops
/// with one error saying what to create and grant (exit 2, nothing probed); a namespace
/// an administrator created is used as it is; a forbidden GET of the Namespace is not
/// fatal; a gate that may create namespaces creates its missing one.
#[test]
fn a_missing_namespace_is_created_only_when_allowed() {
    run(|| async {
        let c = Cluster::start(2, cluster::healthy(Duration::from_millis(100))).await;
        let ns = "fp-made-by-admin";
        let args = ["--namespace", ns, "--pairs", "1"];
        c.store.deny("create", "namespaces");
        let (code, report) = c.gate(&args).await;
        let report = checked(report);
        assert!(
            matches!(code, Err(prober::Error::NamespaceMissing { .. })),
            "{code:?}"
        );
        let first = report["errors"][0].as_str().unwrap_or_default();
        assert!(
            first.contains(&format!("namespace {ns} does not exist"))
                && first.contains(&format!("kubectl create namespace {ns}"))
                && first.contains("grant create on namespaces"),
            "the error says what to create: {first}"
        );
        assert!(probes(&report).is_empty());
        assert!(c.store.get(Kind::Namespace, None, ns).is_err());

        c.store
            .create(
                Kind::Namespace,
                json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } }),
            )
            .expect("the administrator creates it");
        let (code, report) = c.gate(&args).await;
        let report = checked(report);
        assert_eq!(
            exit_code(&code),
            0,
            "an existing namespace is used: {report:#}"
        );
        assert_eq!(endings(&report), [("success".into(), String::new())]);

        c.store.deny("get", "namespaces");
        let (code, report) = c.gate(&args).await;
        let report = checked(report);
        assert_eq!(
            exit_code(&code),
            0,
            "a forbidden GET is not fatal: {report:#}"
        );

        c.store.allow_all();
        let made = "fp-made-by-the-gate";
        let (code, report) = c.gate(&["--namespace", made, "--pairs", "1"]).await;
        let report = checked(report);
        assert_eq!(exit_code(&code), 0, "{report:#}");
        assert!(
            c.store.get(Kind::Namespace, None, made).is_ok(),
            "the gate did not create {made}"
        );
    });
}

/// Scenario: every node is cordoned once the first probe is under way: the next
/// probe's target stays `Unschedulable`; it is recorded `inconclusive`/`unschedulable`
/// after the scheduling grace (`UNSCHEDULABLE_GRACE`), not after the 30 s give-up.
#[test]
fn unschedulable_target_ends_after_the_grace_not_the_give_up() {
    run(|| async {
        let c = Cluster::start(3, cluster::healthy(Duration::from_millis(100))).await;
        let give_up = 30.0;
        let gate = c.gate(&["--pairs", "2", "--concurrency", "1", "--give-up", "30s"]);
        let fill = async {
            sources_started(&c, 1).await;
            for n in ["node-1", "node-2", "node-3"] {
                cordon(&c, n);
            }
        };
        let ((code, report), ()) = tokio::join!(gate, fill);
        let report = checked(report);
        assert_eq!(exit_code(&code), 2, "{report:#}");
        let ps = probes(&report);
        assert_eq!(ps.len(), 2, "{report:#}");
        assert_eq!(ps[0]["result"], "success", "{report:#}");
        let p = &ps[1];
        assert_eq!(
            (p["result"].as_str(), p["reason"].as_str()),
            (Some("inconclusive"), Some("unschedulable")),
            "{p:#}"
        );
        assert!(str_of(p, "detail").contains("grace"), "{p:#}");
        let grace = prober::probe::UNSCHEDULABLE_GRACE.as_secs_f64();
        let took = probe_seconds(p);
        // The wait re-checks every second (prober::podwatch::RECHECK_INTERVAL).
        assert!(
            (grace..grace + 2.0).contains(&took) && took < give_up,
            "recorded after {took:.1}s (grace {grace}s, give-up {give_up}s)"
        );
        assert!(c.probe_pods().is_empty(), "{:#?}", c.probe_pods());
    });
}
