//! Middle tier: the prober's RBAC, `manifests/base/rbac.yaml`, against the book's "RBAC"
//! table.
//!
//! - the table lists exactly what `rbac.yaml` grants (no cluster needed);
//! - for each row of that table, one test takes that (verb, resource) away — the testbed
//!   Store's [`Store::deny`](testbed::api::Store::deny) / `deny_in`, the refusal `testbed
//!   api deny` makes, worded as kube-apiserver's RBAC authorizer words it — and checks
//!   that the prober does what the row's "without it" column says: **exit 2** with the
//!   verb and resource named in `errors[]` (or the record of the probe that ended on it),
//!   or a **warning** naming them (in the report's `warnings`, or a WARN log line) with
//!   the gate passing; for rows marked "`prober run` only", `prober run --leader-elect`
//!   in-process keeps running and logs a warning naming them. Rows get further checks of
//!   what their cell promises where this tier can see it (a Lease left behind, no Event
//!   written, the stored baseline kept, standby without probes, stepping down).
//!
//! The in-process cluster of `tests/cluster` (each test in its own network namespace,
//! only loopback): the probe namespace is `manifests/base/namespace.yaml` (Pod Security
//! `restricted`), as in a real install. That `rbac.yaml` grants no more and no less than
//! what gate and run use, judged from kube-apiserver's audit log, stays end to end
//! (`testbed/tests/e2e_rbac.rs`, the real control plane).

use crate::cluster;

use cluster::{run_logged, Cluster, Logs};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use testbed::api::{Kind, WatchEventType};
use tokio::task::JoinHandle;

/// The probe namespace and ServiceAccount `rbac.yaml` is written for.
const NAMESPACE: &str = "firstpacket";
const SERVICE_ACCOUNT: &str = "firstpacket";

/// `prober run`'s admin server (each test has its own network namespace).
const ADMIN_ADDR: &str = "127.0.0.1:9090";

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_file(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Where a grant applies: every namespace and the cluster scope (a ClusterRole bound by
/// a ClusterRoleBinding), or one namespace (a RoleBinding).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Everywhere,
    Namespace(String),
}

/// One (verb, resource, scope) of `rbac.yaml`; `resource` as RBAC names it
/// (`pods/proxy` for a subresource).
type Grant = (String, String, Scope);

fn yaml_docs(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML document"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// Everything `rbac.yaml` grants ServiceAccount `firstpacket/firstpacket`: each rule of
/// each Role/ClusterRole a binding of that subject refers to, expanded per verb and
/// resource. Panics on rules this check cannot judge (other API groups, resourceNames,
/// wildcards), so they cannot slip through.
fn granted(yaml: &str) -> BTreeSet<Grant> {
    let docs = yaml_docs(yaml);
    let rules_of = |kind: &str, name: &str, ns: Option<&str>| -> Vec<Value> {
        let role = docs
            .iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && (kind == "ClusterRole" || d["metadata"]["namespace"].as_str() == ns)
            })
            .unwrap_or_else(|| panic!("rbac.yaml binds {kind} {name} but does not define it"));
        role["rules"].as_array().cloned().unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for b in &docs {
        let scope = match b["kind"].as_str() {
            Some("ClusterRoleBinding") => Scope::Everywhere,
            Some("RoleBinding") => Scope::Namespace(
                b["metadata"]["namespace"]
                    .as_str()
                    .expect("RoleBinding namespace")
                    .to_owned(),
            ),
            _ => continue,
        };
        let ours = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == SERVICE_ACCOUNT
                && s["namespace"] == NAMESPACE
        });
        if !ours {
            continue;
        }
        let ns = match &scope {
            Scope::Namespace(n) => Some(n.as_str()),
            Scope::Everywhere => None,
        };
        let kind = b["roleRef"]["kind"].as_str().expect("roleRef.kind");
        let name = b["roleRef"]["name"].as_str().expect("roleRef.name");
        for rule in rules_of(kind, name, ns) {
            // The core group, coordination.k8s.io for the instance Leases and
            // networking.k8s.io for the probe NetworkPolicies (resource names do not
            // collide, so grants are keyed by resource name).
            assert!(
                rule["apiGroups"] == json!([""])
                    || rule["apiGroups"] == json!(["coordination.k8s.io"])
                    || rule["apiGroups"] == json!(["networking.k8s.io"]),
                "{rule}"
            );
            assert!(rule["resourceNames"].is_null(), "{rule}");
            for r in rule["resources"].as_array().expect("resources") {
                for v in rule["verbs"].as_array().expect("verbs") {
                    let (r, v) = (r.as_str().unwrap(), v.as_str().unwrap());
                    assert!(r != "*" && v != "*", "wildcard in {rule}");
                    out.insert((v.to_owned(), r.to_owned(), scope.clone()));
                }
            }
        }
    }
    out
}

/// One row of the book's RBAC table.
#[derive(Debug, Clone)]
struct Row {
    resource: String,
    verb: String,
    scope: Scope,
    /// The "without it" cell.
    without: String,
}

impl Row {
    fn fatal(&self) -> bool {
        self.without.starts_with("**exit 2**")
    }
    fn run_only(&self) -> bool {
        self.without.contains("`prober run` only")
    }
}

/// the book's RBAC table (the book's `docs/src/install.md`), row by row.
fn readme_rbac_rows() -> Vec<Row> {
    let readme = read("docs/src/install.md");
    let start = readme
        .find("\n## RBAC")
        .expect("docs/src/install.md has a `## RBAC` section");
    let section = &readme[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    section[..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect();
            assert_eq!(cells.len(), 4, "RBAC table row {l:?}");
            Row {
                resource: cells[0].clone(),
                verb: cells[1].clone(),
                scope: readme_scope(&cells[2]),
                without: cells[3].clone(),
            }
        })
        .collect()
}

/// The RBAC table's "where" cell as a scope: `every namespace` or `cluster` (a ClusterRole
/// bound cluster-wide), or `namespace NAME`.
fn readme_scope(cell: &str) -> Scope {
    if cell == "every namespace" || cell == "cluster" {
        Scope::Everywhere
    } else if let Some(ns) = cell.strip_prefix("namespace ") {
        Scope::Namespace(ns.trim_matches('`').to_owned())
    } else {
        panic!("RBAC table where-cell {cell:?}: want `every namespace` or `namespace NAME`")
    }
}

/// The RBAC table's row of `verb` `resource`.
fn row(resource: &str, verb: &str) -> Row {
    readme_rbac_rows()
        .into_iter()
        .find(|r| r.resource == resource && r.verb == verb)
        .unwrap_or_else(|| panic!("the book's RBAC table has no row {verb} {resource}"))
}

#[test]
fn readme_rbac_table_lists_exactly_what_rbac_yaml_grants() {
    let rows = readme_rbac_rows();
    assert!(!rows.is_empty(), "the book's RBAC table has no rows");
    let documented: BTreeSet<Grant> = rows
        .iter()
        .map(|r| (r.verb.clone(), r.resource.clone(), r.scope.clone()))
        .collect();
    assert_eq!(documented.len(), rows.len(), "a RBAC table row is repeated");
    assert_eq!(
        documented,
        granted(&read("manifests/base/rbac.yaml")),
        "RBAC table table vs rbac.yaml"
    );
    for r in &rows {
        assert!(
            r.fatal() || r.without.starts_with("**warning**"),
            "RBAC table row {} {}: the without-it cell starts with **exit 2** or **warning**: {:?}",
            r.verb,
            r.resource,
            r.without
        );
    }
}

/// Every RBAC table row has its test below (a row added to the table and `rbac.yaml` without
/// one fails here).
#[test]
fn every_readme_rbac_row_has_a_take_away_test() {
    let src = read("prober/tests/engine_rbac.rs");
    for r in readme_rbac_rows() {
        let name = format!("fn without_{}_{}", r.verb, r.resource.replace('/', "_"));
        assert!(
            src.contains(&name),
            "no test `{name}…` for the RBAC table's row {} {}",
            r.verb,
            r.resource
        );
    }
}

// ---- taking rules away ----------------------------------------------------------------

/// Whether `text` names `word` as a whole word (`/` and `_` count as word characters:
/// `pods` is not named by `pods/proxy`).
fn has_word(text: &str, word: &str) -> bool {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '/' || c == '_';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

/// Whether `text` names both the verb and the resource of `row`.
fn names(text: &str, row: &Row) -> bool {
    has_word(text, &row.verb) && has_word(text, &row.resource)
}

/// The in-process cluster with `nodes` nodes running `script`, and the probe namespace
/// as `manifests/base/namespace.yaml` makes it (Pod Security `restricted`).
async fn cluster_with(nodes: usize, script: cluster::Script) -> Cluster {
    let c = Cluster::start(nodes, script).await;
    let ns = yaml_docs(&read("manifests/base/namespace.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "Namespace")
        .expect("namespace.yaml has a Namespace");
    assert_eq!(ns["metadata"]["name"], NAMESPACE);
    c.store
        .create(Kind::Namespace, ns)
        .expect("create the probe namespace");
    c
}

/// Healthy: every probe's first packet after 100 ms.
async fn healthy_cluster() -> Cluster {
    cluster_with(3, cluster::healthy(Duration::from_millis(100))).await
}

/// Takes `row` away: its verb on its resource is refused (403, as RBAC refuses it) where
/// the row grants it. A Namespace object is cluster-scoped in the Store's deny (RBAC
/// counts `GET namespaces/NS` as a request in NS): `namespaces` is refused everywhere.
fn take_away(c: &Cluster, row: &Row) {
    match &row.scope {
        Scope::Namespace(_) if row.resource == "namespaces" => {
            c.store.deny(&row.verb, &row.resource)
        }
        Scope::Everywhere => c.store.deny(&row.verb, &row.resource),
        Scope::Namespace(ns) => c.store.deny_in(&row.verb, &row.resource, Some(ns)),
    }
}

/// The probe records' `detail`s.
fn details(report: &Value) -> Vec<String> {
    report["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["detail"].as_str().map(str::to_owned))
        .collect()
}

/// What a gate without one rule did.
struct Gated {
    row: Row,
    report: Value,
    log: String,
}

/// Takes the RBAC table's row `verb` `resource` away, runs `prober gate --pairs 1` (+ `flags`),
/// and checks what the row's cell says: **exit 2** with the verb and resource named in
/// `errors[]` or a probe's detail; or a **warning** naming them (report `warnings`, or a
/// WARN log line) and a passing gate (this cluster is healthy: exit 0).
async fn gate_without(
    c: &Cluster,
    logs: &Logs,
    resource: &str,
    verb: &str,
    flags: &[&str],
) -> Gated {
    let row = row(resource, verb);
    assert!(
        !row.run_only(),
        "{verb} {resource}: a `prober run` only row"
    );
    take_away(c, &row);
    let mut args = vec!["--log-format", "json"];
    if !flags.contains(&"--pairs") {
        args.extend(["--pairs", "1"]);
    }
    args.extend(flags);
    let (result, report) = c.gate(&args).await;
    let log = logs.text();
    let label = format!("without {verb} {resource}");
    // An error ends the gate with exit 2 (after writing the report), as `main` does.
    let code = *result.as_ref().unwrap_or(&2);
    let report = report.unwrap_or_else(|| panic!("{label}: no report ({result:?})\n{log}"));
    if row.fatal() {
        assert_eq!(
            code, 2,
            "{label}: the RBAC table says exit 2 ({})\n{report:#}\n{log}",
            row.without
        );
        let details = details(&report);
        assert!(
            names(&report["errors"].to_string(), &row) || details.iter().any(|d| names(d, &row)),
            "{label}: neither errors[] nor a probe names {verb} {resource}: {} {details:?}",
            report["errors"]
        );
    } else {
        assert_eq!(
            code, 0,
            "{label}: the RBAC table says a warning ({}); a healthy cluster passes\n{report:#}\n{log}",
            row.without
        );
        let logged = logs.warnings().iter().any(|l| names(l, &row));
        assert!(
            names(&report["warnings"].to_string(), &row) || logged,
            "{label}: no warning names {verb} {resource}: {}\n{log}",
            report["warnings"]
        );
    }
    Gated { row, report, log }
}

/// `prober run --leader-elect` in-process against `c` (a probe every 300 ms, 200 ms
/// holds, the baseline saved every second, `--log-format json` so its notices reach
/// [`Logs`]), `extra` flags last.
fn spawn_run(c: &Cluster, extra: &[&str]) -> JoinHandle<Result<i32, prober::Error>> {
    use clap::Parser;
    let mut args: Vec<String> = [
        "prober",
        "run",
        "--kubeconfig",
        &c.kubeconfig.display().to_string(),
        "--leader-elect",
        "--probe-interval",
        "300ms",
        "--hold",
        "200ms",
        "--give-up",
        "3s",
        "--admin-addr",
        ADMIN_ADDR,
        "--log-format",
        "json",
        "--baseline-save-interval",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let cli = prober::config::Cli::try_parse_from(args).expect("run args");
    let prober::config::Command::Run(args) = cli.command else {
        unreachable!()
    };
    tokio::spawn(prober::run_mode::run_continuous(args))
}

/// Takes the RBAC table's `prober run` only row `verb` `resource` away, starts [`spawn_run`]
/// with `extra`, and waits (at most `within`) for a WARN line naming the verb and the
/// resource; checks the run is still going. Returns the run (abort it at the end).
async fn run_without(
    c: &Cluster,
    logs: &Logs,
    resource: &str,
    verb: &str,
    extra: &[&str],
    within: Duration,
) -> (Row, JoinHandle<Result<i32, prober::Error>>) {
    let row = row(resource, verb);
    assert!(
        row.run_only(),
        "{verb} {resource}: not a `prober run` only row"
    );
    assert!(
        !row.fatal(),
        "{verb} {resource}: a `prober run` only row that is fatal"
    );
    take_away(c, &row);
    let run = spawn_run(c, extra);
    let warned = cluster::eventually(within, || {
        logs.warnings().iter().any(|l| names(l, &row)) || run.is_finished()
    })
    .await;
    let run = still_running(run, &format!("without {verb} {resource}"), logs).await;
    assert!(
        warned && logs.warnings().iter().any(|l| names(l, &row)),
        "without {verb} {resource}: no warning naming it within {within:?}:\n{}",
        logs.text()
    );
    (row, run)
}

/// Panics, with the run's result and log, when the run ended; else gives it back.
async fn still_running(
    run: JoinHandle<Result<i32, prober::Error>>,
    label: &str,
    logs: &Logs,
) -> JoinHandle<Result<i32, prober::Error>> {
    if run.is_finished() {
        let r = run.await;
        panic!(
            "{label}: prober run must keep running; it ended: {r:?}\n{}",
            logs.text()
        );
    }
    run
}

/// How many pods the scripted kubelet has started (probe pods: the tests create no
/// others unless they say so).
fn started(c: &Cluster) -> usize {
    cluster::lock(&c.kubelet.started).len()
}

/// The instance Leases (`app.kubernetes.io/component=instance-lease`) in the probe
/// namespace.
fn instance_leases(c: &Cluster) -> Vec<String> {
    c.store
        .list(Kind::Lease, Some(NAMESPACE))
        .0
        .iter()
        .filter(|l| l["metadata"]["labels"]["app.kubernetes.io/component"] == "instance-lease")
        .filter_map(|l| l["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// The changes to instance Leases `rx` saw (subscribed before the gate), in order.
fn lease_changes(
    rx: &mut tokio::sync::broadcast::Receiver<testbed::api::StoreEvent>,
) -> Vec<WatchEventType> {
    use tokio::sync::broadcast::error::TryRecvError;
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(ev) if ev.kind == Kind::Lease => {
                if ev.object["metadata"]["labels"]["app.kubernetes.io/component"]
                    == "instance-lease"
                {
                    out.push(ev.ty);
                }
            }
            Ok(_) => {}
            Err(TryRecvError::Lagged(n)) => panic!("missed {n} store events"),
            Err(_) => return out,
        }
    }
}

// -- exit 2 ------------------------------------------------------------------------------

/// Of `total` planned probes, how many the gate reports as not started (its errors[]).
fn not_started(report: &Value, total: usize) -> usize {
    let suffix = format!(" of {total} planned probe(s) not started");
    report["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str()?.strip_suffix(&suffix)?.parse().ok())
        .next()
        .unwrap_or(0)
}

#[test]
fn without_create_pods() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let flags = ["--pairs", "3", "--concurrency", "1"];
        let g = gate_without(&c, &logs, "pods", "create", &flags).await;
        // errors[] names the namespace too; no probe pod was ever made.
        let errors = g.report["errors"].to_string();
        assert!(has_word(&errors, NAMESPACE), "{errors}");
        assert_eq!(started(&c), 0, "{}", g.log);
        // "the gate stops at the first probe": the plan is not run to its end. (One more
        // probe may start after the refusal: the gate's start check misses the run-wide
        // stop until a forwarding task has passed it on.)
        let probes = g.report["probes"].as_array().map_or(0, Vec::len);
        assert!(
            (1..=2).contains(&probes) && not_started(&g.report, 3) == 3 - probes,
            "the gate went on after the first probe: {probes} probes, errors {errors}"
        );
    });
}

#[test]
fn without_delete_pods() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let flags = ["--pairs", "3", "--concurrency", "1"];
        let g = gate_without(&c, &logs, "pods", "delete", &flags).await;
        // "stops after the first probe": the plan is not run to its end.
        let probes = g.report["probes"].as_array().map_or(0, Vec::len);
        assert!(
            (1..=2).contains(&probes) && not_started(&g.report, 3) == 3 - probes,
            "the gate went on after the first probe: {probes} probes, errors {}",
            g.report["errors"]
        );
        // "its pods end by activeDeadlineSeconds": the probe pods are still there, each
        // with its deadline.
        let left = c.probe_pods();
        assert_eq!(left.len(), 2 * probes, "{left:#?}");
        for p in &left {
            assert!(
                p["spec"]["activeDeadlineSeconds"]
                    .as_u64()
                    .is_some_and(|s| s > 0),
                "probe pod without activeDeadlineSeconds: {p:#}"
            );
        }
    });
}

#[test]
fn without_list_pods() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        gate_without(&c, &logs, "pods", "list", &[]).await;
        assert_eq!(started(&c), 0, "no probe without the pod watch");
    });
}

#[test]
fn without_watch_pods() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        gate_without(&c, &logs, "pods", "watch", &[]).await;
        assert_eq!(started(&c), 0, "no probe without the pod watch");
    });
}

#[test]
fn without_list_services() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        gate_without(&c, &logs, "services", "list", &[]).await;
    });
}

#[test]
fn without_create_services() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let g = gate_without(&c, &logs, "services", "create", &["--kinds", "service"]).await;
        assert!(
            c.store.list(Kind::Service, Some(NAMESPACE)).0.is_empty(),
            "{}",
            g.log
        );
    });
}

#[test]
fn without_delete_services() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        gate_without(&c, &logs, "services", "delete", &["--kinds", "service"]).await;
        // It was made and could not be deleted.
        assert_eq!(c.store.list(Kind::Service, Some(NAMESPACE)).0.len(), 1);
    });
}

#[test]
fn without_list_networkpolicies() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        gate_without(&c, &logs, "networkpolicies", "list", &["--kinds", "policy"]).await;
    });
}

#[test]
fn without_create_networkpolicies() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let g = gate_without(
            &c,
            &logs,
            "networkpolicies",
            "create",
            &["--kinds", "policy"],
        )
        .await;
        // The isolation comes first: no pod was made without it.
        assert!(c.probe_pods().is_empty(), "{}", g.log);
        assert!(c.store.list(Kind::NetworkPolicy, None).0.is_empty());
    });
}

#[test]
fn without_delete_networkpolicies() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let g = gate_without(
            &c,
            &logs,
            "networkpolicies",
            "delete",
            &["--kinds", "policy"],
        )
        .await;
        // Both were made and could not be deleted; the pods could.
        assert_eq!(
            c.store.list(Kind::NetworkPolicy, Some(NAMESPACE)).0.len(),
            2,
            "{}",
            g.log
        );
        assert!(c.probe_pods().is_empty(), "{}", g.log);
    });
}

#[test]
fn without_create_pods_proxy() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let g = gate_without(
            &c,
            &logs,
            "pods/proxy",
            "create",
            &["--kinds", "policy_change"],
        )
        .await;
        let p = &g.report["probes"][0];
        assert_eq!(
            (p["result"].as_str(), p["reason"].as_str()),
            (Some("inconclusive"), Some("api_error")),
            "{p:#}"
        );
        assert!(
            c.store.list(Kind::NetworkPolicy, None).0.is_empty(),
            "{}",
            g.log
        );
    });
}

#[test]
fn without_list_nodes() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        gate_without(&c, &logs, "nodes", "list", &[]).await;
        assert_eq!(started(&c), 0, "no probe without the node list");
    });
}

// -- gate warnings -----------------------------------------------------------------------

#[test]
fn without_get_namespaces() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let g = gate_without(&c, &logs, "namespaces", "get", &[]).await;
        assert!(
            logs.warnings()
                .iter()
                .any(|l| l.contains("cannot get resource \"namespaces\"")),
            "the warning carries the API's words:\n{}",
            g.log
        );
    });
}

/// The other half of the `get namespaces` row: the namespace assumed to exist is missing,
/// so the first pod create fails as `admission_rejected` (`NamespaceLifecycle`).
#[test]
fn without_get_namespaces_a_missing_namespace_is_admission_rejected() {
    run_logged(|logs| async move {
        let c = Cluster::start(3, cluster::healthy(Duration::from_millis(100))).await;
        take_away(&c, &row("namespaces", "get"));
        let (code, report) = c.gate(&["--pairs", "1", "--log-format", "json"]).await;
        let report = report.unwrap_or_else(|| panic!("no report: {code:?}\n{}", logs.text()));
        assert_eq!(code.expect("gate ran"), 2, "{report:#}");
        assert_eq!(
            cluster::endings(&report),
            vec![("inconclusive".to_string(), "admission_rejected".to_string())],
            "{report:#}"
        );
        assert!(
            report.to_string().contains("NamespaceLifecycle"),
            "{report:#}"
        );
        assert!(
            c.store.get(Kind::Namespace, None, NAMESPACE).is_err(),
            "the prober created the namespace"
        );
    });
}

/// kube-proxy on every node (`kube-system`, `k8s-app=kube-proxy`, host network): agents
/// the gate finds and scrapes (nothing serves their metrics).
fn add_kube_proxies(c: &Cluster) {
    for n in &c.nodes {
        c.store
            .create(
                Kind::Pod,
                json!({
                    "metadata": {"name": format!("kube-proxy-{n}"), "namespace": "kube-system",
                                 "labels": {"k8s-app": "kube-proxy"}},
                    "spec": {"nodeName": n, "hostNetwork": true,
                             "containers": [{"name": "kube-proxy",
                                             "image": "registry.k8s.io/kube-proxy:v1.31.0"}]},
                }),
            )
            .expect("kube-proxy pod");
    }
}

/// The report's warnings say `agent_unreachable`, naming `get pods/proxy`.
fn assert_proxy_refusal_warned(g: &Gated) {
    let warnings = g.report["warnings"].to_string();
    assert!(
        warnings.contains("agent_unreachable") && names(&warnings, &g.row),
        "RBAC table: agent_unreachable, naming get pods/proxy: {warnings}\n{}",
        g.log
    );
}

#[test]
fn without_get_pods_proxy() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        add_kube_proxies(&c);
        let flags = ["--agent-scrape", "proxy"];
        let g = gate_without(&c, &logs, "pods/proxy", "get", &flags).await;
        assert_proxy_refusal_warned(&g);
    });
}

/// "or `auto` when a node's port is unreachable": nothing listens on the nodes'
/// addresses (loopback here), so auto goes to the proxy, which is refused.
#[test]
fn without_get_pods_proxy_auto_falls_back_to_the_refused_proxy() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        add_kube_proxies(&c);
        let g = gate_without(&c, &logs, "pods/proxy", "get", &["--agent-scrape", "auto"]).await;
        assert_proxy_refusal_warned(&g);
    });
}

#[test]
fn without_create_leases() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let mut rx = c.store.subscribe();
        let g = gate_without(&c, &logs, "leases", "create", &[]).await;
        // "no instance Lease".
        assert_eq!(lease_changes(&mut rx), vec![], "{}", g.log);
    });
}

#[test]
fn without_patch_leases() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let mut rx = c.store.subscribe();
        // Renewals come every 5 s: a gate whose probe holds 6 s renews once or twice.
        let g = gate_without(&c, &logs, "leases", "patch", &["--hold", "6s"]).await;
        // "each outage logged once".
        let n = logs.warnings().iter().filter(|l| names(l, &g.row)).count();
        assert_eq!(n, 1, "{}", g.log);
        // "the instance Lease is not renewed": created, never changed, deleted at the end.
        assert_eq!(
            lease_changes(&mut rx),
            vec![WatchEventType::Added, WatchEventType::Deleted],
            "{}",
            g.log
        );
    });
}

#[test]
fn without_list_leases() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        gate_without(&c, &logs, "leases", "list", &[]).await;
    });
}

#[test]
fn without_delete_leases() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let g = gate_without(&c, &logs, "leases", "delete", &[]).await;
        // "the instance Lease stays after a clean exit".
        let instance = g.report["instance"].as_str().unwrap_or("").to_owned();
        assert_eq!(
            instance_leases(&c),
            vec![format!("firstpacket-{instance}")],
            "{}",
            g.log
        );
    });
}

// -- `prober run` only -------------------------------------------------------------------

#[test]
fn without_get_leases() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let (_, run) = run_without(&c, &logs, "leases", "get", &[], Duration::from_secs(10)).await;
        // "stays standby (no probes)".
        tokio::time::sleep(Duration::from_secs(2)).await;
        let run = still_running(run, "without get leases", &logs).await;
        assert_eq!(
            started(&c),
            0,
            "probes without the leader Lease:\n{}",
            logs.text()
        );
        assert!(!logs.text().contains("became leader"), "{}", logs.text());
        run.abort();
    });
}

#[test]
fn without_update_leases() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let timing = [
            "--leader-elect-lease-duration",
            "3s",
            "--leader-elect-renew-deadline",
            "2s",
            "--leader-elect-retry-period",
            "500ms",
        ];
        let (_, run) = run_without(
            &c,
            &logs,
            "leases",
            "update",
            &timing,
            Duration::from_secs(10),
        )
        .await;
        // The replica that created the leader Lease leads, then steps down at the renew
        // deadline and probes no more.
        let stepped = cluster::eventually(Duration::from_secs(8), || {
            logs.text().contains("stepping down")
        })
        .await;
        let text = logs.text();
        assert!(
            text.contains("became leader") && stepped,
            "lead, then step down:\n{text}"
        );
        // A probe under way at the step-down may still make its second pod.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = started(&c);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let run = still_running(run, "without update leases", &logs).await;
        assert_eq!(
            started(&c),
            after,
            "probes after stepping down:\n{}",
            logs.text()
        );
        run.abort();
    });
}

#[test]
fn without_watch_nodes() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let (_, run) = run_without(&c, &logs, "nodes", "watch", &[], Duration::from_secs(10)).await;
        assert!(
            logs.warnings()
                .iter()
                .any(|l| l.contains("node watch error")
                    && l.contains("cannot watch resource \"nodes\"")),
            "{}",
            logs.text()
        );
        // Probing goes on on the nodes listed.
        let probing = cluster::eventually(Duration::from_secs(10), || started(&c) >= 2).await;
        assert!(probing, "no probe without the node watch:\n{}", logs.text());
        run.abort();
    });
}

#[test]
fn without_create_events() {
    run_logged(|logs| async move {
        // Sources on node-3 see their first packet late: slow probes blamed on node-3.
        let script: cluster::Script =
            Arc::new(|p: &cluster::PodView| cluster::ok(if p.node == "node-3" { 600 } else { 50 }));
        let c = cluster_with(3, script).await;
        let (_, run) = run_without(
            &c,
            &logs,
            "events",
            "create",
            &["--slow-threshold", "300ms"],
            Duration::from_secs(40),
        )
        .await;
        assert!(
            logs.warnings()
                .iter()
                .any(|l| l.contains("cannot create Node Event")),
            "{}",
            logs.text()
        );
        let events = c.store.list(Kind::Event, Some("default")).0;
        assert!(
            !events.iter().any(|e| e["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("FirstPacket"))),
            "an Event was written anyway: {events:?}"
        );
        run.abort();
    });
}

/// The baseline ConfigMap of `prober run` (`--baseline-configmap` default).
const BASELINE: &str = "firstpacket-baseline";

#[test]
fn without_get_configmaps() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        // A stored baseline (not one this prober could use: read, it would be replaced).
        let stored = c
            .store
            .create(
                Kind::ConfigMap,
                json!({"metadata": {"name": BASELINE, "namespace": NAMESPACE},
                       "data": {"baseline.json": "{}"}}),
            )
            .expect("baseline ConfigMap");
        let (_, run) =
            run_without(&c, &logs, "configmaps", "get", &[], Duration::from_secs(10)).await;
        // Probes finish and saves come due: nothing is written, the stored one is kept.
        let probed = cluster::eventually(Duration::from_secs(10), || started(&c) >= 4).await;
        assert!(probed, "no probes:\n{}", logs.text());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let run = still_running(run, "without get configmaps", &logs).await;
        let now = c
            .store
            .get(Kind::ConfigMap, Some(NAMESPACE), BASELINE)
            .expect("stored baseline");
        assert_eq!(
            now["metadata"]["resourceVersion"],
            stored["metadata"]["resourceVersion"],
            "the stored baseline was overwritten:\n{}",
            logs.text()
        );
        run.abort();
    });
}

#[test]
fn without_patch_configmaps() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let (_, run) = run_without(
            &c,
            &logs,
            "configmaps",
            "patch",
            &[],
            Duration::from_secs(20),
        )
        .await;
        assert!(
            c.store
                .get(Kind::ConfigMap, Some(NAMESPACE), BASELINE)
                .is_err(),
            "the baseline was saved anyway"
        );
        run.abort();
    });
}

#[test]
fn without_create_configmaps() {
    run_logged(|logs| async move {
        let c = healthy_cluster().await;
        let (_, run) = run_without(
            &c,
            &logs,
            "configmaps",
            "create",
            &[],
            Duration::from_secs(20),
        )
        .await;
        assert!(
            c.store
                .get(Kind::ConfigMap, Some(NAMESPACE), BASELINE)
                .is_err(),
            "the baseline was saved anyway"
        );
        run.abort();
    });
}
