//! Middle tier: the NetworkPolicy kinds (issue 32), `policy` and `policy_change`, the
//! engine against the in-process cluster of `tests/cluster`: the policies each probe
//! creates (and deletes), the intruder's isolation check, the `policy_change` source's
//! marks through the built-in API server's pod proxy, and every ending the policy
//! results add. The scripted kubelet plays the pods (no packets): whether a policy is
//! enforced is the script's [`Outcome`]; real enforcement is the testbed's
//! (`testbed/tests/netpol.rs`, `e2e_policy.rs`).

use crate::cluster;

use cluster::{endings, run, Act, Cluster, Outcome};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use testbed::api::Kind;

/// Every pod runs healthy (first answer `ttfp_ms` after Ready), with `outcome`.
fn every(ttfp_ms: u64, outcome: Outcome) -> cluster::Script {
    Arc::new(move |_: &cluster::PodView| Act::Run {
        ready_after: Duration::from_millis(20),
        ttfp: Some(Duration::from_millis(ttfp_ms)),
        outcome,
    })
}

fn probes(report: &Value) -> Vec<Value> {
    report["probes"].as_array().cloned().unwrap_or_default()
}

fn of_kind(report: &Value, kind: &str) -> Value {
    probes(report)
        .into_iter()
        .find(|p| p["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} probe in {report:#}"))
}

fn policies_left(c: &Cluster) -> Vec<Value> {
    c.store.list(Kind::NetworkPolicy, None).0
}

#[test]
fn policy_kinds_pass_create_their_policies_within_budget_and_leave_nothing() {
    run(|| async {
        let c = Cluster::start(2, every(150, Outcome::AsDialed)).await;
        let (code, report) = c
            .gate(&["--pairs", "1", "--kinds", "policy,policy_change"])
            .await;
        let report = report.expect("report");
        assert_eq!(code.expect("gate ran"), 0, "{report:#}");
        let p = of_kind(&report, "policy");
        assert_eq!(p["result"], "success", "{p:#}");
        assert_eq!(p["api_writes"], 10, "{p:#}");
        let id = p["id"].as_str().expect("id");
        assert_eq!(
            p["policy"]["policies"],
            serde_json::json!([format!("fp-{id}-isolate"), format!("fp-{id}-egress")])
        );
        let iso = &p["policy"]["isolation"];
        assert_eq!(iso["checked"], true, "{iso:#}");
        assert_eq!(iso["admitted"], 0, "{iso:#}");
        assert_eq!(iso["pod"], format!("fp-{id}-i"));
        let pc = of_kind(&report, "policy_change");
        assert_eq!(pc["result"], "success", "{pc:#}");
        assert_eq!(pc["api_writes"], 8, "{pc:#}");
        // The scripted source is admitted 150 ms after the allow mark.
        let ttfp = pc["ttfp_seconds"].as_f64().expect("ttfp");
        assert!(
            (ttfp - 0.15).abs() < 0.03,
            "policy_change ttfp {ttfp}: {pc:#}"
        );
        let sp = &pc["source_report"]["policy"];
        assert_eq!(sp["outcome"], "revoked", "{sp:#}");
        for mark in ["arm_at", "allow_at", "revoke_at"] {
            assert!(
                sp[mark].is_number(),
                "{mark} never reached the source: {sp:#}"
            );
        }
        assert!(
            pc["policy"]["allow_created_unix"].as_f64()
                < pc["policy"]["allow_deleted_unix"].as_f64()
        );
        // Every policy and pod is gone.
        assert!(policies_left(&c).is_empty(), "{:#?}", policies_left(&c));
        assert!(c.probe_pods().is_empty(), "{:?}", c.probe_pods());
    });
}

#[test]
fn the_policies_select_the_probes_pods_and_carry_its_labels() {
    run(|| async {
        // Seen while the probe runs: the scripted source holds 2 s.
        let c = Cluster::start(2, every(100, Outcome::AsDialed)).await;
        let store = c.store.clone();
        let seen = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
        let sink = seen.clone();
        let watcher = tokio::spawn(async move {
            loop {
                for p in store.list(Kind::NetworkPolicy, None).0 {
                    let mut v = cluster::lock(&sink);
                    if !v
                        .iter()
                        .any(|q| q["metadata"]["name"] == p["metadata"]["name"])
                    {
                        v.push(p);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let (code, report) = c
            .gate(&["--pairs", "1", "--kinds", "policy", "--hold", "1s"])
            .await;
        watcher.abort();
        assert_eq!(code.expect("gate ran"), 0, "{report:#?}");
        let seen = cluster::lock(&seen).clone();
        assert_eq!(seen.len(), 2, "{seen:#?}");
        for np in &seen {
            let labels = &np["metadata"]["labels"];
            assert_eq!(labels["app.kubernetes.io/component"], "probe-policy");
            assert_eq!(labels["firstpacket.io/kind"], "policy");
            assert!(labels["firstpacket.io/instance"].is_string());
        }
        let isolate = seen
            .iter()
            .find(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .ends_with("-isolate")
            })
            .expect("isolate policy");
        let from = &isolate["spec"]["ingress"][0]["from"][0];
        assert_eq!(
            from["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
            "probe-source"
        );
        assert_eq!(
            from["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "firstpacket"
        );
        let egress = seen
            .iter()
            .find(|p| p["metadata"]["name"].as_str().unwrap().ends_with("-egress"))
            .expect("egress policy");
        let cidr = egress["spec"]["egress"][0]["to"][0]["ipBlock"]["cidr"]
            .as_str()
            .expect("cidr");
        let report = report.expect("report");
        let target_ip = of_kind(&report, "policy")["target"]["ip"]
            .as_str()
            .expect("ip")
            .to_string();
        assert_eq!(cidr, format!("{target_ip}/32"));
        // The source's node's InternalIP is admitted too (its own node dial).
        assert!(egress["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"]
            .as_str()
            .is_some_and(|c| c.starts_with("127.0.1.")));
    });
}

#[test]
fn an_intruder_answered_is_an_isolation_breach_and_fails_the_gate() {
    run(|| async {
        let c = Cluster::start(2, every(100, Outcome::Breach)).await;
        let (code, report) = c.gate(&["--pairs", "1", "--kinds", "policy"]).await;
        let report = report.expect("report");
        assert_eq!(code.expect("gate ran"), 1, "{report:#}");
        let p = of_kind(&report, "policy");
        assert_eq!(
            (p["result"].as_str(), p["reason"].as_str()),
            (Some("failed"), Some("isolation_breach")),
            "{p:#}"
        );
        let detail = p["detail"].as_str().expect("detail");
        assert!(
            detail.contains("fp-") && detail.contains("success"),
            "{detail}"
        );
        assert!(p["policy"]["isolation"]["admitted"].as_u64() >= Some(1));
        assert!(policies_left(&c).is_empty());
    });
}

/// One `policy_change` gate (`extra` flags): exit 1 and the single probe `failed` with
/// `reason`.
async fn policy_change_fails_with(c: &Cluster, extra: &[&str], reason: &str) {
    let mut args = vec!["--pairs", "1", "--kinds", "policy_change"];
    args.extend_from_slice(extra);
    let (code, report) = c.gate(&args).await;
    let report = report.expect("report");
    assert_eq!(code.expect("gate ran"), 1, "{report:#}");
    assert_eq!(endings(&report), vec![("failed".into(), reason.into())]);
}

#[test]
fn policy_change_endings_breach_not_revoked_and_never_admitted() {
    run(|| async {
        let c = Cluster::start(2, every(100, Outcome::Breach)).await;
        policy_change_fails_with(&c, &[], "isolation_breach").await;

        c.set_script(every(100, Outcome::NotRevoked));
        policy_change_fails_with(&c, &["--give-up", "1s"], "revocation_not_enforced").await;

        c.set_script(Arc::new(|_: &cluster::PodView| Act::Run {
            ready_after: Duration::from_millis(20),
            ttfp: None,
            outcome: Outcome::AsDialed,
        }));
        policy_change_fails_with(&c, &["--give-up", "1s"], "no_success_before_give_up").await;

        // Never admitted, and the prober's reads of its status hang (a pod gone under
        // the proxied connection): its own report still decides, not an `api_error`
        // from marking a source that has ended.
        c.set_script(Arc::new(|_: &cluster::PodView| Act::Run {
            ready_after: Duration::from_millis(20),
            ttfp: None,
            outcome: Outcome::StatusUnanswered,
        }));
        policy_change_fails_with(&c, &["--give-up", "1s"], "no_success_before_give_up").await;
        assert!(policies_left(&c).is_empty());
    });
}
