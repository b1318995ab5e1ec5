//! The NetworkPolicies of the `policy` and `policy_change` probes (issue 32) and the
//! pure rules that turn what their pods reported into the record.
//!
//! Every policy lives in the probe namespace, named `fp-<probe id>-<role>`, carries the
//! five labels of the probe's pods (docs/design.md §6; component [`POLICY_COMPONENT`])
//! and the prober pod as owner when in-cluster, so the start-up sweep, `prober cleanup`
//! and the garbage collector find it as they find the probe's pods. The rules use the
//! shapes of the Kubernetes NetworkPolicy API
//! (<https://kubernetes.io/docs/concepts/services-networking/network-policies/>):
//!
//! | policy | kind | selects | rule |
//! |---|---|---|---|
//! | `fp-<id>-isolate` | `policy` | the target | Ingress from pods with the probe id and component `probe-source` **in** namespaces labelled `kubernetes.io/metadata.name: <ns>` (pod + namespace selector), TCP 8080 |
//! | `fp-<id>-egress` | `policy` | the source | Egress to `ipBlock` `<target IP>/32` TCP 8080, and to the source node's IP (its own node dial) |
//! | `fp-<id>-isolate` | `policy_change` | the target | Ingress, no rule: deny all |
//! | `fp-<id>-allow` | `policy_change` | the target | Ingress from pods with the probe id and component `probe-source` (pod selector), TCP 8080 |
//!
//! Kubernetes allows traffic between a pod and its own node whatever the policies, so
//! the kubelet's readiness probes reach isolated pods.

use crate::kind::ProbeKind;
use crate::labels::{LABEL_COMPONENT, LABEL_INSTANCE, LABEL_PROBE_ID};
use crate::podspec::{probe_labels, PodConfig, PodRole, SERVER_PORT};
use firstpacket_report::{
    IsolationCheck, PolicyOutcome, ProbeRecord, ProbeResult, Reason, SourceReport,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use std::time::Duration;

/// `app.kubernetes.io/component` of a probe's NetworkPolicies.
pub const POLICY_COMPONENT: &str = "probe-policy";

/// The namespace label kube-apiserver sets on every Namespace (v1.21+,
/// `kubernetes.io/metadata.name`, Kubernetes docs "Well-Known Labels").
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Default `--isolation-window`: how long a `policy` probe's intruder dials the
/// isolated target from its first instant.
pub const DEFAULT_ISOLATION_WINDOW: Duration = Duration::from_secs(5);

/// The roles of a probe's policies (module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyRole {
    /// Isolates the target (`policy`: admits the source; `policy_change`: deny all).
    Isolate,
    /// `policy`: isolates the source's egress, admitting the target's IP.
    Egress,
    /// `policy_change`: admits the source to the target.
    Allow,
}

impl PolicyRole {
    fn suffix(self) -> &'static str {
        match self {
            PolicyRole::Isolate => "isolate",
            PolicyRole::Egress => "egress",
            PolicyRole::Allow => "allow",
        }
    }
}

/// `fp-<probe id>-<isolate|egress|allow>`.
pub fn policy_name(probe_id: &str, role: PolicyRole) -> String {
    format!("fp-{probe_id}-{}", role.suffix())
}

fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        match_expressions: None,
    }
}

/// The pods of this probe in `role`.
fn probe_pods(cfg: &PodConfig, probe_id: &str, role: PodRole) -> LabelSelector {
    selector(&[
        (LABEL_INSTANCE, &cfg.instance),
        (LABEL_PROBE_ID, probe_id),
        (LABEL_COMPONENT, role.component()),
    ])
}

fn tcp_server_port() -> Vec<NetworkPolicyPort> {
    vec![NetworkPolicyPort {
        protocol: Some("TCP".into()),
        port: Some(IntOrString::Int(SERVER_PORT)),
        end_port: None,
    }]
}

fn object(cfg: &PodConfig, probe_id: &str, kind: ProbeKind, role: PolicyRole) -> ObjectMeta {
    let mut labels = probe_labels(&cfg.instance, probe_id, kind.as_str(), PodRole::Target);
    labels.insert(LABEL_COMPONENT.into(), POLICY_COMPONENT.into());
    ObjectMeta {
        name: Some(policy_name(probe_id, role)),
        namespace: Some(cfg.namespace.clone()),
        labels: Some(labels),
        owner_references: cfg.owner.clone().map(|o| vec![o]),
        ..Default::default()
    }
}

/// `fp-<id>-isolate` (module table): for `policy` it admits this probe's source (pod
/// and namespace selector, TCP 8080); for `policy_change` (`deny_all`) nothing.
pub fn isolate_policy(cfg: &PodConfig, probe_id: &str, kind: ProbeKind) -> NetworkPolicy {
    let ingress = if kind == ProbeKind::PolicyChange {
        Vec::new()
    } else {
        vec![NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(probe_pods(cfg, probe_id, PodRole::Source)),
                namespace_selector: Some(selector(&[(NAMESPACE_NAME_LABEL, &cfg.namespace)])),
                ip_block: None,
            }]),
            ports: Some(tcp_server_port()),
        }]
    };
    NetworkPolicy {
        metadata: object(cfg, probe_id, kind, PolicyRole::Isolate),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(probe_pods(cfg, probe_id, PodRole::Target)),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            egress: None,
        }),
    }
}

/// `fp-<id>-egress` (`policy`): isolates the source's egress, admitting `target_ip`/32
/// on TCP 8080 (`ipBlock`) and, when known, `node_ip`/32 on any port (the source's
/// dial of its own node, which Calico would otherwise subject to the egress policy).
pub fn egress_policy(
    cfg: &PodConfig,
    probe_id: &str,
    target_ip: &str,
    node_ip: Option<&str>,
) -> NetworkPolicy {
    let block = |ip: &str| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: host_cidr(ip),
            except: None,
        }),
        ..Default::default()
    };
    let mut egress = vec![NetworkPolicyEgressRule {
        to: Some(vec![block(target_ip)]),
        ports: Some(tcp_server_port()),
    }];
    if let Some(node) = node_ip {
        egress.push(NetworkPolicyEgressRule {
            to: Some(vec![block(node)]),
            ports: None,
        });
    }
    NetworkPolicy {
        metadata: object(cfg, probe_id, ProbeKind::Policy, PolicyRole::Egress),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(probe_pods(cfg, probe_id, PodRole::Source)),
            policy_types: Some(vec!["Egress".into()]),
            ingress: None,
            egress: Some(egress),
        }),
    }
}

/// `fp-<id>-allow` (`policy_change`): admits this probe's source to its target (pod
/// selector, same namespace, TCP 8080).
pub fn allow_policy(cfg: &PodConfig, probe_id: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: object(cfg, probe_id, ProbeKind::PolicyChange, PolicyRole::Allow),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(probe_pods(cfg, probe_id, PodRole::Target)),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(probe_pods(cfg, probe_id, PodRole::Source)),
                    ..Default::default()
                }]),
                ports: Some(tcp_server_port()),
            }]),
            egress: None,
        }),
    }
}

/// `IP/32`, or `IP/128` for an IPv6 address.
pub fn host_cidr(ip: &str) -> String {
    if ip.contains(':') {
        format!("{ip}/128")
    } else {
        format!("{ip}/32")
    }
}

/// The isolation check from the intruder's report (`None`: it left none; `why` says
/// why). Pure.
pub fn isolation_check(
    pod: &str,
    window: Duration,
    report: Option<&SourceReport>,
    why: Option<String>,
) -> IsolationCheck {
    match report {
        Some(r) => {
            let answered = r.first_success_sent.is_some();
            IsolationCheck {
                pod: pod.to_string(),
                checked: true,
                attempts: r.attempts_before_success + u64::from(answered) + r.hold.attempts,
                admitted: if answered {
                    1 + r.hold.attempts - r.hold.failures
                } else {
                    0
                },
                first_admitted_seconds: r.first_success_sent,
                window_seconds: window.as_secs_f64(),
                detail: None,
            }
        }
        None => IsolationCheck {
            pod: pod.to_string(),
            checked: false,
            window_seconds: window.as_secs_f64(),
            detail: why,
            ..Default::default()
        },
    }
}

/// A breach overrides the probe's result: `failed`/`isolation_breach`, whatever the
/// source met (the source's own result stays in the detail). Pure.
pub fn apply_isolation(record: &mut ProbeRecord, check: &IsolationCheck) {
    if check.admitted == 0 {
        return;
    }
    let was = match record.reason {
        Some(r) => format!("{}/{}", record.result.as_str(), r.as_str()),
        None => record.result.as_str().to_string(),
    };
    record.detail = Some(format!(
        "isolation breach: pod {} that no policy admits got {} answer(s) from the isolated \
         target, the first {:.3}s after its start (the source's own result: {was})",
        check.pod,
        check.admitted,
        check.first_admitted_seconds.unwrap_or(0.0)
    ));
    record.result = ProbeResult::Failed;
    record.reason = Some(Reason::IsolationBreach);
}

/// A `policy_change` record from its source's [`firstpacket_report::SourcePolicy`]:
/// TTFP is the admission latency (floored at 0; raw kept), and the result follows the
/// source's policy outcome (module docs of the `probe` module). Pure; a record
/// without a source report (or without `policy` in it) is left as built.
pub fn apply_policy_change(record: &mut ProbeRecord, slow_threshold: Duration) {
    let Some(p) = record.source_report.as_ref().and_then(|r| r.policy.clone()) else {
        return;
    };
    record.raw_ttfp_seconds = p.admitted_seconds;
    record.ttfp_seconds = p.admitted_seconds.map(|s| s.max(0.0));
    let info = record.policy.get_or_insert_with(Default::default);
    info.admitted_seconds = record.ttfp_seconds;
    info.revoked_seconds = p.revoked_seconds;
    let (result, reason, detail) = if p.admitted_before_arm > 0 {
        (
            ProbeResult::Failed,
            Some(Reason::IsolationBreach),
            Some(format!(
                "isolation breach: the source got {} answer(s) from the target isolated by a \
                 deny-all policy before any policy admitted it (the first sent {:.3}s after its start)",
                p.admitted_before_arm,
                p.first_admitted_before_arm_sent.unwrap_or(0.0)
            )),
        )
    } else {
        match p.outcome {
            PolicyOutcome::Terminated => (
                ProbeResult::Inconclusive,
                Some(Reason::Interrupted),
                Some("the source was stopped before the policy change was measured".into()),
            ),
            PolicyOutcome::NoAllowMark | PolicyOutcome::NoRevokeMark => (
                ProbeResult::Inconclusive,
                Some(Reason::ApiError),
                Some(format!(
                    "the source never got the prober's {} mark",
                    if p.outcome == PolicyOutcome::NoAllowMark {
                        "allow"
                    } else {
                        "revoke"
                    }
                )),
            ),
            PolicyOutcome::NotAdmitted => (
                ProbeResult::Failed,
                Some(Reason::NoSuccessBeforeGiveUp),
                Some(format!(
                    "no answer within {:.0}s of the allow policy's creation",
                    record
                        .source_report
                        .as_ref()
                        .map_or(0.0, |r| r.give_up_seconds)
                )),
            ),
            _ if p.hold_failures > 0 => (
                ProbeResult::Failed,
                Some(Reason::LostAfterSuccess),
                Some(format!(
                    "{} failure(s) during the hold after the policy admitted the source",
                    p.hold_failures
                )),
            ),
            PolicyOutcome::StillAdmitted => (
                ProbeResult::Failed,
                Some(Reason::RevocationNotEnforced),
                Some(format!(
                    "connections still answered {:.0}s after the allow policy was deleted",
                    record
                        .source_report
                        .as_ref()
                        .map_or(0.0, |r| r.give_up_seconds)
                )),
            ),
            PolicyOutcome::Revoked => {
                let slow = slow_threshold.as_secs_f64();
                let admitted = record.ttfp_seconds.unwrap_or(0.0);
                let revoked = p.revoked_seconds.unwrap_or(0.0);
                if admitted > slow || revoked > slow {
                    (
                        ProbeResult::Slow,
                        Some(Reason::TtfpOverThreshold),
                        Some(format!(
                            "policy admitted after {admitted:.3}s, revoked after {revoked:.3}s \
                             (threshold {slow}s)"
                        )),
                    )
                } else {
                    (ProbeResult::Success, None, None)
                }
            }
        }
    };
    record.result = result;
    record.reason = reason;
    record.detail = detail;
}

#[cfg(test)]
mod tests {
    use super::*;
    use firstpacket_report::SourcePolicy;

    use crate::podspec::tests::cfg;

    /// A source report that succeeded 0.2 s after Ready and held 5 s without failure.
    fn source_report() -> SourceReport {
        serde_json::from_value(serde_json::json!({
            "schema": 1, "pod": "fp-x-s", "target": "10.0.2.5:8080", "expect_pod": "fp-x-t",
            "interval_seconds": 0.1, "attempt_timeout_seconds": 0.9, "give_up_seconds": 60.0,
            "hold_seconds": 5.0, "process_start_unix": 1.7e9, "process_start": 0.0,
            "first_attempt": 0.01, "ready_at": 1.0, "first_success_sent": 1.2,
            "first_success_received": 1.21, "ttfp_seconds": 0.2, "raw_ttfp_seconds": 0.2,
            "attempts_before_success": 12, "failures_before_success": 0, "errors": {},
            "last_error": null, "wrong_peer": null,
            "hold": {"seconds": 5.0, "attempts": 50, "failures": 0, "failures_per_second": []},
            "outcome": "success"
        }))
        .expect("a source report")
    }

    /// A `success` record carrying [`source_report`].
    fn success_record() -> ProbeRecord {
        let meta = crate::record::ProbeMeta {
            id: "x".into(),
            kind: "policy".into(),
            namespace: "probes".into(),
            source_node: "node-1".into(),
            target_node: "node-2".into(),
            source_pod: "fp-x-s".into(),
            target_pod: "fp-x-t".into(),
            started: std::time::Instant::now(),
            started_at: "2026-01-01T00:00:00Z".into(),
        };
        let ending = crate::record::Ending::Aborted {
            reason: Reason::Interrupted,
            detail: String::new(),
        };
        let mut r = crate::record::build_record(
            &meta,
            None,
            None,
            &ending,
            Duration::from_secs(2),
            std::time::Instant::now(),
        );
        r.result = ProbeResult::Success;
        r.reason = None;
        r.detail = None;
        r.source_report = Some(source_report());
        r
    }

    #[test]
    fn the_policy_kind_isolates_the_target_for_its_source_only_and_the_source_to_the_target() {
        let p = isolate_policy(&cfg(), "abc", ProbeKind::Policy);
        assert_eq!(p.metadata.name.as_deref(), Some("fp-abc-isolate"));
        let labels = p.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels[LABEL_COMPONENT], POLICY_COMPONENT);
        assert_eq!(labels[LABEL_INSTANCE], cfg().instance);
        let spec = p.spec.expect("spec");
        let sel = spec
            .pod_selector
            .and_then(|s| s.match_labels)
            .expect("selector");
        assert_eq!(sel[LABEL_COMPONENT], "probe-target");
        assert_eq!(sel[LABEL_PROBE_ID], "abc");
        let rule = &spec.ingress.expect("ingress")[0];
        let peer = &rule.from.as_ref().expect("from")[0];
        let from = peer
            .pod_selector
            .clone()
            .and_then(|s| s.match_labels)
            .expect("pods");
        assert_eq!(from[LABEL_COMPONENT], "probe-source");
        let ns = peer
            .namespace_selector
            .clone()
            .and_then(|s| s.match_labels)
            .expect("ns");
        assert_eq!(ns[NAMESPACE_NAME_LABEL], cfg().namespace);
        let e = egress_policy(&cfg(), "abc", "10.1.2.3", Some("192.168.1.2"));
        let spec = e.spec.expect("spec");
        assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
        let rules = spec.egress.expect("egress");
        let cidr = |i: usize| {
            rules[i].to.as_ref().unwrap()[0]
                .ip_block
                .clone()
                .unwrap()
                .cidr
        };
        assert_eq!(cidr(0), "10.1.2.3/32");
        assert_eq!(cidr(1), "192.168.1.2/32");
        assert_eq!(host_cidr("fd00::5"), "fd00::5/128");
    }

    #[test]
    fn the_policy_change_kind_isolates_with_no_rule_and_allows_by_pod_selector() {
        let p = isolate_policy(&cfg(), "x", ProbeKind::PolicyChange);
        assert_eq!(p.spec.unwrap().ingress, Some(vec![]));
        let a = allow_policy(&cfg(), "x");
        assert_eq!(a.metadata.name.as_deref(), Some("fp-x-allow"));
        let peer = &a.spec.unwrap().ingress.unwrap()[0].from.clone().unwrap()[0];
        assert!(peer.namespace_selector.is_none() && peer.ip_block.is_none());
    }

    fn record_with(policy: SourcePolicy) -> ProbeRecord {
        let mut r = success_record();
        r.source_report.as_mut().expect("report").policy = Some(policy);
        r
    }

    #[test]
    fn policy_change_results_follow_the_sources_outcome() {
        let base = SourcePolicy {
            arm_at: Some(2.0),
            allow_at: Some(2.1),
            revoke_at: Some(6.0),
            first_admitted_sent: Some(2.4),
            admitted_seconds: Some(0.3),
            revoked_seconds: Some(0.2),
            outcome: PolicyOutcome::Revoked,
            ..Default::default()
        };
        let t = Duration::from_secs(2);
        let mut r = record_with(base.clone());
        apply_policy_change(&mut r, t);
        assert_eq!((r.result, r.reason), (ProbeResult::Success, None));
        assert_eq!(r.ttfp_seconds, Some(0.3));
        assert_eq!(r.policy.as_ref().unwrap().revoked_seconds, Some(0.2));
        for (p, want) in [
            (
                SourcePolicy {
                    admitted_before_arm: 2,
                    ..base.clone()
                },
                Reason::IsolationBreach,
            ),
            (
                SourcePolicy {
                    outcome: PolicyOutcome::StillAdmitted,
                    revoked_seconds: None,
                    ..base.clone()
                },
                Reason::RevocationNotEnforced,
            ),
            (
                SourcePolicy {
                    outcome: PolicyOutcome::NotAdmitted,
                    admitted_seconds: None,
                    ..base.clone()
                },
                Reason::NoSuccessBeforeGiveUp,
            ),
            (
                SourcePolicy {
                    hold_failures: 3,
                    ..base.clone()
                },
                Reason::LostAfterSuccess,
            ),
            (
                SourcePolicy {
                    admitted_seconds: Some(4.0),
                    ..base.clone()
                },
                Reason::TtfpOverThreshold,
            ),
            (
                SourcePolicy {
                    outcome: PolicyOutcome::NoRevokeMark,
                    ..base.clone()
                },
                Reason::ApiError,
            ),
        ] {
            let mut r = record_with(p.clone());
            apply_policy_change(&mut r, t);
            assert_eq!(r.reason, Some(want), "{p:?}: {:?}", r.detail);
            assert_eq!(r.result, want.result());
        }
        // A negative raw latency (the answer came before the mark) floors at 0.
        let mut r = record_with(SourcePolicy {
            admitted_seconds: Some(-0.01),
            ..base
        });
        apply_policy_change(&mut r, t);
        assert_eq!(
            (r.ttfp_seconds, r.raw_ttfp_seconds),
            (Some(0.0), Some(-0.01))
        );
    }

    #[test]
    fn an_intruders_answer_fails_the_probe_as_an_isolation_breach() {
        let mut intruder = source_report();
        let w = Duration::from_secs(5);
        let mut r = success_record();
        let check = isolation_check("fp-x-i", w, Some(&intruder), None);
        assert_eq!(
            check.admitted,
            1 + intruder.hold.attempts - intruder.hold.failures
        );
        apply_isolation(&mut r, &check);
        assert_eq!(
            (r.result, r.reason),
            (ProbeResult::Failed, Some(Reason::IsolationBreach))
        );
        assert!(
            r.detail.as_deref().unwrap().contains("fp-x-i"),
            "{:?}",
            r.detail
        );
        // Isolation held: nothing answered.
        intruder.first_success_sent = None;
        intruder.hold = Default::default();
        let mut r = success_record();
        let check = isolation_check("fp-x-i", w, Some(&intruder), None);
        assert!(check.checked && check.admitted == 0);
        apply_isolation(&mut r, &check);
        assert_eq!(r.result, ProbeResult::Success);
        let unchecked = isolation_check("fp-x-i", w, None, Some("never scheduled".into()));
        assert!(!unchecked.checked);
        assert_eq!(unchecked.detail.as_deref(), Some("never scheduled"));
    }
}
