//! The testbed's node components on the real control plane (`testbed up
//! --control-plane real`): real kubectl against kube-apiserver with pods the testbed's
//! kubelets run, the real ReplicaSet controller and garbage collector acting on them, a
//! pod's in-cluster kube-rs client reaching kube-apiserver through the `kubernetes`
//! Service, the real node-lifecycle controller reacting to `testbed node stop|start`,
//! and `testbed down` leaving no process behind.
//!
//! Needs root, `ip`, `kubectl`, the workspace binaries and the control plane's
//! binaries (`bash scripts/control-plane.sh`, or `FIRSTPACKET_CONTROL_PLANE_BIN`);
//! without the latter each test prints why and passes without checking anything.

mod common;

use common::{poll_until, Testbed, POD_GONE_TIMEOUT, SERIAL};
use serde_json::Value;
use std::time::{Duration, Instant};
use testbed::control_plane;

/// `kubectl get pod -o` this: the pod's Ready condition status.
const POD_READY: &str = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";

/// kube-controller-manager's `--node-monitor-grace-period` as the testbed sets it
/// (`control_plane::Config::for_plan`).
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(20);
/// Its `--node-monitor-period`.
const NODE_MONITOR_PERIOD: Duration = Duration::from_secs(2);

/// Whether `pid` is a live process (exists and is not a zombie waiting to be reaped).
fn runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// `testbed up` on the real control plane, or `None` after printing why not.
fn up_real(name: &str, nodes: usize) -> Option<Testbed> {
    Testbed::up_real(name, nodes, "rules: []\n", &[])
}

fn write_manifest(tb: &Testbed, name: &str, text: &str) -> String {
    let p = tb.state.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn json(tb: &Testbed, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = tb.kubectl(&a);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {out}"))
}

/// `name=phase/ready` of every pod with label `app=APP` that is not being deleted.
fn live_pods(tb: &Testbed, app: &str) -> Vec<(String, String, bool)> {
    let v = json(tb, &["get", "pods", "-l", &format!("app={app}")]);
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                p["status"]["phase"].as_str().unwrap_or("").to_owned(),
                ready,
            )
        })
        .collect()
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: webd}
spec:
  replicas: 1
  selector: {matchLabels: {app: webd}}
  template:
    metadata: {labels: {app: webd}}
    spec:
      containers:
      - name: web
        image: target-server
        args: [serve]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 1}
";

/// kubectl `get -o wide`, `describe node|pod`, `apply -f` of a Deployment whose pod the
/// real ReplicaSet controller recreates after a delete, and an ownerReference'd pod the
/// real garbage collector removes with its owner.
#[test]
fn real_kubectl_wide_describe_deployment_recreate_and_garbage_collection() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(tb) = up_real("rkubectl", 2) else {
        return;
    };
    let ready = tb.state.join("ready.json");
    let info: Value = serde_json::from_str(&std::fs::read_to_string(&ready).unwrap()).unwrap();
    assert_eq!(info["nodes"], serde_json::json!(["node-1", "node-2"]));
    assert_eq!(info["control_plane"], "real");

    let wide = tb.kubectl(&["get", "nodes", "-o", "wide"]);
    for n in ["node-1", "node-2"] {
        let line = wide
            .lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("{n} missing:\n{wide}"));
        assert!(line.contains(" Ready "), "{line}");
    }
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(tb.state.join("plan.json")).unwrap())
            .unwrap();
    let node1_ip = plan["nodes"][0]["ip"].as_str().unwrap().to_owned();
    assert!(wide.contains(&node1_ip), "INTERNAL-IP {node1_ip}:\n{wide}");
    let dn = tb.kubectl(&["describe", "node", "node-1"]);
    assert!(
        dn.contains("KubeletReady") && dn.contains(&node1_ip),
        "describe node node-1:\n{dn}"
    );

    let manifest = write_manifest(&tb, "webd.yaml", DEPLOYMENT);
    tb.kubectl(&["apply", "-f", &manifest]);
    let first = poll_until(
        Duration::from_secs(60),
        || live_pods(&tb, "webd"),
        |p| p.len() == 1 && p[0].1 == "Running" && p[0].2,
    );
    assert!(
        first.len() == 1 && first[0].2,
        "Deployment pod not Ready: {first:?}"
    );
    let pod = first[0].0.clone();
    let pw = tb.kubectl(&["get", "pod", &pod, "-o", "wide"]);
    assert!(pw.contains("Running") && pw.contains("node-"), "{pw}");
    let dp = tb.kubectl(&["describe", "pod", &pod]);
    // The real scheduler's and the kubelet's events.
    assert!(
        dp.contains("Scheduled") && dp.contains("default-scheduler"),
        "{dp}"
    );
    assert!(dp.contains("Ready") && dp.contains("True"), "{dp}");

    // The real ReplicaSet controller replaces a deleted pod.
    tb.kubectl(&["delete", "pod", &pod, "--wait=false"]);
    let next = poll_until(
        Duration::from_secs(60),
        || live_pods(&tb, "webd"),
        |p| p.len() == 1 && p[0].0 != pod && p[0].2,
    );
    assert!(
        next.len() == 1 && next[0].0 != pod && next[0].2,
        "no Ready replacement of {pod}: {next:?}"
    );
    // The deleted one is gone once its kubelet finished it (final DELETE with the UID
    // precondition).
    let gone = poll_until(
        POD_GONE_TIMEOUT,
        || {
            tb.exec(&["kubectl", "get", "pod", &pod, "-o", "name"])
                .status
                .success()
        },
        |exists| !exists,
    );
    assert!(!gone, "{pod} still listed after {POD_GONE_TIMEOUT:?}");

    // The real garbage collector: a pod owned by a ConfigMap goes with it.
    tb.kubectl(&["create", "configmap", "owner"]);
    let uid = tb.kubectl(&[
        "get",
        "configmap",
        "owner",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let owned = write_manifest(
        &tb,
        "owned.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: owned\n  labels: {{app: owned}}\n  ownerReferences:\n  - {{apiVersion: v1, kind: ConfigMap, name: owner, uid: {uid}}}\nspec:\n  containers:\n  - {{name: web, image: target-server, args: [serve]}}\n"
        ),
    );
    tb.kubectl(&["apply", "-f", &owned]);
    let running = poll_until(
        Duration::from_secs(60),
        || live_pods(&tb, "owned"),
        |p| p.len() == 1 && p[0].1 == "Running",
    );
    assert!(
        running.len() == 1 && running[0].1 == "Running",
        "{running:?}"
    );
    tb.kubectl(&["delete", "configmap", "owner"]);
    let left = poll_until(
        Duration::from_secs(60),
        || {
            tb.exec(&["kubectl", "get", "pod", "owned", "-o", "name"])
                .status
                .success()
        },
        |exists| !exists,
    );
    assert!(!left, "pod owned still there after its owner was deleted");
}

/// A pod running kube-rs with in-cluster config (the prober's `gate`, one pair) reaches
/// kube-apiserver through the `kubernetes` Service with its kube-api-access token:
/// kube-apiserver's audit log shows the pod's ServiceAccount listing nodes and pods from
/// the pod's IP. `kubectl logs` of it goes through the kubelet API.
#[test]
fn real_in_cluster_kube_rs_lists_pods_through_the_kubernetes_service() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(tb) = up_real("rincluster", 2) else {
        return;
    };
    // A real cluster authorizes ServiceAccounts by RBAC (the built-in API server lets
    // every request through): the in-cluster prober gets its own, bound to
    // cluster-admin (it lists nodes and creates, watches and deletes pods).
    tb.kubectl(&["create", "serviceaccount", "incluster"]);
    tb.kubectl(&[
        "create",
        "clusterrolebinding",
        "incluster-admin",
        "--clusterrole=cluster-admin",
        "--serviceaccount=default:incluster",
    ]);
    let manifest = write_manifest(
        &tb,
        "incluster.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: incluster}\nspec:\n  serviceAccountName: incluster\n  restartPolicy: Never\n  containers:\n  - name: prober\n    image: ghcr.io/firstpacket/prober:0.1.0\n    args: [gate, --pairs, '1', --timeout, 60s]\n",
    );
    tb.kubectl(&["apply", "-f", &manifest]);
    let phase = tb.kubectl_until(
        &["get", "pod", "incluster", "-o", "jsonpath={.status.phase}"],
        Duration::from_secs(120),
        |p| p == "Succeeded" || p == "Failed",
    );
    let logs = tb.kubectl(&["logs", "incluster"]);
    eprintln!("in-cluster prober ({phase}):\n{logs}");
    assert!(
        phase == "Succeeded" || phase == "Failed",
        "in-cluster prober still {phase:?}:\n{logs}"
    );
    assert!(
        !logs.trim().is_empty(),
        "kubectl logs incluster printed nothing"
    );
    let pod = json(&tb, &["get", "pod", "incluster"]);
    let pod_ip = pod["status"]["podIP"].as_str().unwrap_or("").to_owned();
    let has_volume = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| {
            v["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("kube-api-access-"))
        });
    assert!(has_volume, "no kube-api-access volume: {pod}");
    let audit = tb.state.join("control-plane/audit.log");
    let user = "system:serviceaccount:default:incluster";
    let mine: Vec<Value> = tb
        .audit_events()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == user
                && e["responseStatus"]["code"] == 200
                && e["sourceIPs"]
                    .as_array()
                    .is_some_and(|ips| ips.iter().any(|ip| ip == pod_ip.as_str()))
        })
        .collect();
    for resource in ["nodes", "pods"] {
        assert!(
            mine.iter()
                .any(|e| e["verb"] == "list" && e["objectRef"]["resource"] == resource),
            "no list {resource} by {user} from {pod_ip} in {}; its requests: {:?}",
            audit.display(),
            mine.iter()
                .map(|e| format!("{} {}", e["verb"], e["objectRef"]["resource"]))
                .collect::<Vec<_>>()
        );
    }
}

/// `testbed node stop node-2`: the real node-lifecycle controller turns the Node's Ready
/// condition Unknown and taints it `node.kubernetes.io/unreachable` once its grace has
/// passed since the last Lease renewal (not at once), and marks its pod not Ready; `node
/// start` brings node and pod back Ready, the node without the taints. node-1 stays Ready throughout. `testbed down` then leaves no
/// process of the control plane, the node components or the pods.
#[test]
fn real_node_stop_goes_not_ready_and_unreachable_within_grace_and_down_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(tb) = up_real("rnode", 2) else {
        return;
    };
    let node = |name: &str| json(&tb, &["get", "node", name]);
    let ready_status = |n: &Value| {
        n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["status"].as_str())
            .unwrap_or("")
            .to_owned()
    };
    let unreachable = |n: &Value| {
        n["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["key"] == "node.kubernetes.io/unreachable")
            .count()
    };
    // A pod on node-2 without a readiness probe (it also puts a container in the
    // process list checked at the end).
    let manifest = write_manifest(
        &tb,
        "p.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {app: p}}\nspec:\n  nodeName: node-2\n  containers:\n  - {name: web, image: target-server, args: [serve]}\n",
    );
    tb.kubectl(&["apply", "-f", &manifest]);
    let pod_ready = tb.kubectl_until(
        &["get", "pod", "p", "-o", POD_READY],
        Duration::from_secs(60),
        |r| r == "True",
    );
    assert_eq!(pod_ready, "True", "pod p on node-2 never Ready");
    let out = tb.cmd().args(["node", "stop", "node-2"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stopped = Instant::now();
    let mut first_seen = None;
    let n2 = poll_until(
        NODE_MONITOR_GRACE + testbed::kubelet::HEARTBEAT + Duration::from_secs(20),
        || {
            let n = node("node-2");
            if first_seen.is_none() && ready_status(&n) != "True" {
                first_seen = Some(stopped.elapsed());
            }
            n
        },
        |n| ready_status(n) == "Unknown" && unreachable(n) == 2,
    );
    let took = stopped.elapsed();
    assert_eq!(ready_status(&n2), "Unknown", "{n2}");
    assert_eq!(unreachable(&n2), 2, "NoSchedule + NoExecute taints: {n2}");
    let first = first_seen.unwrap_or(took);
    // The Lease was last renewed at most one heartbeat before the stop: the controller
    // may act from grace − heartbeat on, and at the latest a monitor period (plus the
    // polling and kubectl time) after the grace.
    let earliest = NODE_MONITOR_GRACE - testbed::kubelet::HEARTBEAT - Duration::from_secs(1);
    let latest = NODE_MONITOR_GRACE + NODE_MONITOR_PERIOD + Duration::from_secs(5);
    assert!(
        first >= earliest && first <= latest,
        "node-2 NotReady {first:?} after node stop, expected within [{earliest:?}, {latest:?}]"
    );
    assert_eq!(ready_status(&node("node-1")), "True");
    // kube-controller-manager marks the unreachable node's pods not Ready.
    let pod_ready = tb.kubectl_until(
        &["get", "pod", "p", "-o", POD_READY],
        Duration::from_secs(15),
        |r| r == "False",
    );
    assert_eq!(
        pod_ready, "False",
        "pod p still Ready on the unreachable node-2"
    );
    let out = tb.cmd().args(["node", "start", "node-2"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let back = poll_until(
        Duration::from_secs(30),
        || node("node-2"),
        |n| ready_status(n) == "True" && unreachable(n) == 0,
    );
    assert_eq!(ready_status(&back), "True", "{back}");
    assert_eq!(unreachable(&back), 0, "taints left: {back}");

    // The pod on node-2 (no readiness probe): Ready again once its kubelet is back, as
    // the real kubelet's status manager re-syncs the status the controller changed.
    let pod_ready = tb.kubectl_until(
        &["get", "pod", "p", "-o", POD_READY],
        Duration::from_secs(30),
        |r| r == "True",
    );
    assert_eq!(
        pod_ready, "True",
        "pod p on node-2 not Ready after node start"
    );
    let state = tb.state.display().to_string();
    let prefix = tb.prefix();
    let mut pids: Vec<i32> =
        testbed::dataplane::netns_pids(&testbed::dataplane::list_netns(&prefix));
    let daemon: i32 = std::fs::read_to_string(tb.state.join("daemon.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    pids.push(daemon);
    for b in control_plane::BINARIES {
        if let Ok(p) = std::fs::read_to_string(tb.state.join(format!("control-plane/{b}.pid"))) {
            pids.push(p.trim().parse().unwrap());
        }
    }
    assert!(
        pids.len() >= 6,
        "daemon, 4 control-plane processes, a container: {pids:?}"
    );
    let out = tb.cmd().arg("down").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let alive: Vec<String> = pids
        .iter()
        .filter(|p| runs(**p))
        .map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            format!("{p}: {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect();
    assert!(alive.is_empty(), "left after testbed down: {alive:#?}");
    // Nor anything else naming the state dir.
    let others: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            if !runs(pid) {
                return None;
            }
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(&state).then(|| format!("{pid}: {cmd}"))
        })
        .collect();
    assert!(others.is_empty(), "left after testbed down: {others:#?}");
    assert!(testbed::dataplane::list_netns(&prefix).is_empty());
}
