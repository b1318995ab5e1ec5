//! Middle tier: every probe ending of `prober gate`, the engine against the in-process
//! cluster of `tests/cluster` (no root, no packets; each test in its own network
//! namespace with only loopback). Each test scripts what the pods do and checks the
//! probe records the gate reports (docs/design.md §2 "Results").

use crate::cluster;

use cluster::{endings, ok, run, Act, Cluster, Outcome};
use std::sync::Arc;
use std::time::Duration;

/// Every pod does `act`.
fn every(act: Act) -> cluster::Script {
    Arc::new(move |_: &cluster::PodView| act.clone())
}

/// Pods of `role` do `act`; the others are healthy (first success 100 ms after Ready).
fn only(role: &'static str, act: Act) -> cluster::Script {
    Arc::new(
        move |p: &cluster::PodView| {
            if p.role == role {
                act.clone()
            } else {
                ok(100)
            }
        },
    )
}

fn ending(report: &serde_json::Value) -> (String, String) {
    let e = endings(report);
    assert_eq!(e.len(), 1, "one probe expected: {e:?}");
    e[0].clone()
}

#[test]
fn success_is_pass_with_the_sources_ttfp() {
    run(|| async {
        let c = Cluster::start(2, cluster::healthy(Duration::from_millis(300))).await;
        let (code, report) = c.gate(&["--pairs", "1"]).await;
        let report = report.expect("report");
        assert_eq!(code.expect("gate ran"), 0, "{report:#}");
        assert_eq!(ending(&report).0, "success");
        let ttfp = report["probes"][0]["ttfp_seconds"].as_f64().expect("ttfp");
        assert!((ttfp - 0.3).abs() < 0.05, "ttfp {ttfp} vs scripted 0.3 s");
        assert!(
            c.probe_pods().is_empty(),
            "probe pods left: {:?}",
            c.probe_pods()
        );
    });
}

#[test]
fn ttfp_over_the_slow_threshold_is_slow() {
    run(|| async {
        let c = Cluster::start(2, cluster::healthy(Duration::from_millis(700))).await;
        let (code, report) = c
            .gate(&[
                "--pairs",
                "1",
                "--slow-threshold",
                "500ms",
                "--max-ttfp",
                "10s",
            ])
            .await;
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("slow".into(), "ttfp_over_threshold".into())
        );
        assert_eq!(code.expect("gate ran"), 0, "slow under --max-ttfp passes");
    });
}

#[test]
fn no_success_before_give_up_is_failed() {
    run(|| async {
        let c = Cluster::start(
            2,
            every(Act::Run {
                ready_after: Duration::from_millis(20),
                ttfp: None,
                outcome: Outcome::AsDialed,
            }),
        )
        .await;
        let (code, report) = c.gate(&["--pairs", "1", "--give-up", "1s"]).await;
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("failed".into(), "no_success_before_give_up".into())
        );
        assert_eq!(code.expect("gate ran"), 1);
    });
}

#[test]
fn failures_during_the_hold_are_lost_after_success() {
    run(|| async {
        let c = Cluster::start(
            2,
            every(Act::Run {
                ready_after: Duration::from_millis(20),
                ttfp: Some(Duration::from_millis(100)),
                outcome: Outcome::LostAfterSuccess,
            }),
        )
        .await;
        let (code, report) = c.gate(&["--pairs", "1", "--hold", "1s"]).await;
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("failed".into(), "lost_after_success".into())
        );
        assert_eq!(code.expect("gate ran"), 1);
    });
}

#[test]
fn answers_from_another_pod_are_wrong_peer() {
    run(|| async {
        let c = Cluster::start(
            2,
            every(Act::Run {
                ready_after: Duration::from_millis(20),
                ttfp: None,
                outcome: Outcome::WrongPeer,
            }),
        )
        .await;
        let (code, report) = c.gate(&["--pairs", "1", "--give-up", "1s"]).await;
        let report = report.expect("report");
        assert_eq!(ending(&report), ("failed".into(), "wrong_peer".into()));
        assert_eq!(code.expect("gate ran"), 1);
    });
}

#[test]
fn a_target_that_never_turns_ready_is_target_never_ready() {
    run(|| async {
        let c = Cluster::start(2, only("target", Act::NeverReady)).await;
        let (code, report) = c.gate(&["--pairs", "1", "--give-up", "2s"]).await;
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("failed".into(), "target_never_ready".into())
        );
        assert_eq!(code.expect("gate ran"), 1);
        assert!(c.probe_pods().is_empty(), "probe pods left");
    });
}

#[test]
fn a_source_that_never_turns_ready_is_source_never_ready() {
    run(|| async {
        let c = Cluster::start(2, only("source", Act::NeverReady)).await;
        let (code, report) = c.gate(&["--pairs", "1", "--give-up", "2s"]).await;
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("failed".into(), "source_never_ready".into())
        );
        assert_eq!(code.expect("gate ran"), 1);
    });
}

#[test]
fn an_image_that_cannot_be_pulled_is_inconclusive_image_pull() {
    run(|| async {
        let c = Cluster::start(2, only("target", Act::ImagePull)).await;
        let (code, report) = c.gate(&["--pairs", "1"]).await;
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("inconclusive".into(), "image_pull".into())
        );
        assert_eq!(code.expect("gate ran"), 2, "inconclusive: exit 2");
    });
}

#[test]
fn a_container_that_exits_at_start_is_inconclusive_container_failed() {
    run(|| async {
        let c = Cluster::start(2, only("source", Act::Crash)).await;
        let (code, report) = c.gate(&["--pairs", "1"]).await;
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("inconclusive".into(), "container_failed".into())
        );
        assert_eq!(code.expect("gate ran"), 2);
    });
}

#[test]
fn a_pod_no_node_can_take_is_inconclusive_unschedulable() {
    run(|| async {
        let c = Cluster::start(2, cluster::healthy(Duration::from_millis(100))).await;
        // Both nodes fill up after the gate chose them and created its first pod.
        c.pause_scheduling(true);
        let gate = c.gate(&["--pairs", "1"]);
        let taint = async {
            let created =
                cluster::eventually(Duration::from_secs(10), || !c.probe_pods().is_empty()).await;
            assert!(created, "the gate created no probe pod");
            for n in ["node-1", "node-2"] {
                c.store
                    .modify(testbed::api::Kind::Node, None, n, |node| {
                        node["spec"]["taints"] = serde_json::json!([{
                            "key": "example.com/full", "effect": "NoSchedule" }]);
                        Ok(())
                    })
                    .expect("taint");
            }
            c.pause_scheduling(false);
        };
        let ((code, report), ()) = tokio::join!(gate, taint);
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("inconclusive".into(), "unschedulable".into()),
            "{report:#}"
        );
        let detail = report["probes"][0]["detail"].as_str().unwrap_or("");
        assert!(detail.contains("untolerated taint"), "{detail}");
        assert_eq!(code.expect("gate ran"), 2);
    });
}

#[test]
fn a_node_that_goes_not_ready_mid_probe_is_inconclusive_node_not_ready() {
    run(|| async {
        // The source never reaches its target; its node's kubelet stops reporting.
        let c = Cluster::start(
            2,
            every(Act::Run {
                ready_after: Duration::from_millis(20),
                ttfp: None,
                outcome: Outcome::AsDialed,
            }),
        )
        .await;
        let gate = c.gate(&["--pairs", "1", "--give-up", "2s"]);
        let flip = async {
            let started = cluster::eventually(Duration::from_secs(5), || {
                c.kubelet.started.lock().unwrap().len() >= 2
            })
            .await;
            assert!(started, "probe pods started");
            let source_node = {
                let pods = c.probe_pods();
                pods.iter()
                    .find(|p| p["spec"]["containers"][0]["args"][0] == "probe")
                    .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
            };
            c.set_node_ready(&source_node.expect("source pod bound"), false);
        };
        let ((code, report), ()) = tokio::join!(gate, flip);
        let report = report.expect("report");
        assert_eq!(
            ending(&report),
            ("inconclusive".into(), "node_not_ready".into())
        );
        assert_eq!(code.expect("gate ran"), 2);
    });
}
