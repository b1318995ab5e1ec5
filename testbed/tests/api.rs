//! Loopback tests of the testbed API server with real clients: kube-rs (client and
//! runtime watcher) and the installed `kubectl` (v1.32 dispatcher).

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Api, Client, Config};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testbed::api::{self, Kind, Store};

const WAIT: Duration = Duration::from_secs(20);

/// Starts the HTTP front end on 127.0.0.1:0; returns its base URL.
async fn start(store: Arc<Store>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(api::serve(store, listener));
    format!("http://{addr}")
}

fn client(url: &str) -> Client {
    let uri = url.parse().expect("url");
    Client::try_from(Config::new(uri)).expect("kube client")
}

fn node_json(name: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": api::rfc3339_now(), "lastTransitionTime": api::rfc3339_now()}],
            "nodeInfo": {"kubeletVersion": "v1.32.4", "osImage": "Debian GNU/Linux 12 (bookworm)", "kernelVersion": "6.1.0",
                         "containerRuntimeVersion": "testbed://0.1.0", "architecture": "amd64", "operatingSystem": "linux",
                         "bootID": "", "machineID": "", "systemUUID": "", "kubeProxyVersion": ""}
        }
    })
}

fn pod_json(ns: &str, name: &str, app: &str, node: Option<&str>) -> Value {
    let mut p = json!({
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"containers": [{"name": "main", "image": "target-server:latest", "args": ["serve"]}]}
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

/// Marks a pod Running and Ready with an IP, as the kubelet would.
fn run_pod(store: &Store, ns: &str, name: &str, ip: &str) {
    store
        .modify(Kind::Pod, Some(ns), name, |p| {
            let now = api::rfc3339_now();
            p["status"]["phase"] = json!("Running");
            p["status"]["podIP"] = json!(ip);
            p["status"]["podIPs"] = json!([{"ip": ip}]);
            p["status"]["conditions"] = json!([{"type": "Ready", "status": "True", "lastTransitionTime": now}]);
            p["status"]["containerStatuses"] = json!([{"name": "main", "ready": true, "restartCount": 0,
                "image": "target-server:latest", "imageID": "", "started": true, "state": {"running": {"startedAt": now}}}]);
            Ok(())
        })
        .expect("run pod");
}

#[tokio::test]
async fn kube_client_creates_gets_lists_with_selectors_and_deletes() {
    let store = Store::new();
    store
        .create(Kind::Node, node_json("node-1", "10.0.0.1"))
        .unwrap();
    let url = start(store.clone()).await;
    let c = client(&url);

    let nss: Api<Namespace> = Api::all(c.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "probe"}})).unwrap();
    nss.create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");

    let pods: Api<Pod> = Api::namespaced(c.clone(), "probe");
    let mut p: Pod = serde_json::from_value(pod_json("probe", "", "x", None)).unwrap();
    p.metadata.name = None;
    p.metadata.generate_name = Some("probe-t-".into());
    let created = pods
        .create(&PostParams::default(), &p)
        .await
        .expect("create pod");
    let name = created.metadata.name.clone().expect("generated name");
    assert!(
        name.starts_with("probe-t-") && name.len() == "probe-t-".len() + 5,
        "{name}"
    );
    assert!(created.metadata.uid.is_some());
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );

    let got = pods.get(&name).await.expect("get pod");
    assert_eq!(got.metadata.uid, created.metadata.uid);

    let other: Pod =
        serde_json::from_value(pod_json("probe", "other", "y", Some("node-1"))).unwrap();
    pods.create(&PostParams::default(), &other)
        .await
        .expect("create other");

    let by_label = pods
        .list(&ListParams::default().labels("app=x"))
        .await
        .unwrap();
    assert_eq!(by_label.items.len(), 1);
    assert_eq!(
        by_label.items[0].metadata.name.as_deref(),
        Some(name.as_str())
    );
    let by_set = pods
        .list(&ListParams::default().labels("app in (x,y),app!=y"))
        .await
        .unwrap();
    assert_eq!(by_set.items.len(), 1);
    let by_field = pods
        .list(&ListParams::default().fields("spec.nodeName=node-1"))
        .await
        .unwrap();
    assert_eq!(by_field.items.len(), 1);
    assert_eq!(by_field.items[0].metadata.name.as_deref(), Some("other"));
    let all: Api<Pod> = Api::all(c.clone());
    let unbound = all
        .list(&ListParams::default().fields("spec.nodeName="))
        .await
        .unwrap();
    assert_eq!(unbound.items.len(), 1);

    // Unbound pod: deleted at once.
    pods.delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    match pods.get(&name).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.message, format!("pods \"{name}\" not found"));
        }
        other => panic!("expected 404, got {other:?}"),
    }

    // Bound pod: graceful, the kubelet finishes.
    let out = pods
        .delete("other", &DeleteParams::default())
        .await
        .expect("delete bound");
    let left = out.left().expect("object returned");
    assert!(left.metadata.deletion_timestamp.is_some());
    assert_eq!(left.metadata.deletion_grace_period_seconds, Some(30));
    let uid = left.metadata.uid.clone().unwrap();
    store
        .remove(Kind::Pod, Some("probe"), "other", &uid)
        .unwrap();
    assert!(pods.get_opt("other").await.unwrap().is_none());

    // Duplicate create → 409 AlreadyExists.
    let dup: Pod = serde_json::from_value(pod_json("probe", "dup", "x", None)).unwrap();
    pods.create(&PostParams::default(), &dup).await.unwrap();
    match pods.create(&PostParams::default(), &dup).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"))
        }
        other => panic!("expected 409, got {other:?}"),
    }
    // Missing namespace → 404; invalid pod → 422 with causes.
    let ghost: Api<Pod> = Api::namespaced(c.clone(), "ghost");
    let mut homeless = dup.clone();
    homeless.metadata.namespace = None;
    match ghost.create(&PostParams::default(), &homeless).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.message, "namespaces \"ghost\" not found"),
        other => panic!("expected 404, got {other:?}"),
    }
    let mut bad = dup.clone();
    bad.metadata.name = Some("bad".into());
    if let Some(spec) = bad.spec.as_mut() {
        spec.containers[0].image = None;
    }
    match pods.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert_eq!(
                s.message,
                "Pod \"bad\" is invalid: spec.containers[0].image: Required value"
            );
        }
        other => panic!("expected 422, got {other:?}"),
    }
    // `testbed api deny VERB RESOURCE` → 403 like missing RBAC.
    store.deny("list", "pods");
    match pods.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403);
            assert_eq!(s.message, "pods is forbidden: User \"system:anonymous\" cannot list resource \"pods\" in API group \"\" in the namespace \"probe\"");
        }
        other => panic!("expected 403, got {other:?}"),
    }
    assert!(pods.get("dup").await.is_ok());
    // `testbed api allow VERB RESOURCE` lifts exactly that deny.
    assert!(store.allow("list", "pods"));
    assert!(!store.allow("list", "pods"), "nothing left to lift");
    assert!(pods.list(&ListParams::default()).await.is_ok());
}

async fn next_ok(
    stream: &mut (impl futures::Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Unpin),
) -> watcher::Event<Pod> {
    loop {
        match tokio::time::timeout(WAIT, stream.next()).await {
            Ok(Some(Ok(ev))) => return ev,
            Ok(Some(Err(_))) => continue,
            Ok(None) => panic!("watcher ended"),
            Err(_) => panic!("no watcher event within {WAIT:?}"),
        }
    }
}

fn ev_name(ev: &watcher::Event<Pod>) -> (String, String) {
    match ev {
        watcher::Event::Apply(p) => ("apply".into(), p.metadata.name.clone().unwrap_or_default()),
        watcher::Event::Delete(p) => ("delete".into(), p.metadata.name.clone().unwrap_or_default()),
        watcher::Event::InitApply(p) => (
            "init_apply".into(),
            p.metadata.name.clone().unwrap_or_default(),
        ),
        watcher::Event::Init => ("init".into(), String::new()),
        watcher::Event::InitDone => ("init_done".into(), String::new()),
    }
}

#[tokio::test]
async fn watcher_sees_added_modified_deleted_filtered_by_label() {
    let store = Store::new();
    store
        .create(Kind::Node, node_json("node-1", "10.0.0.1"))
        .unwrap();
    store
        .create(Kind::Pod, pod_json("default", "before", "w", None))
        .unwrap();
    let url = start(store.clone()).await;
    let pods: Api<Pod> = Api::all(client(&url));
    let mut s = watcher(pods, watcher::Config::default().labels("app=w")).boxed();
    assert_eq!(ev_name(&next_ok(&mut s).await).0, "init");
    assert_eq!(
        ev_name(&next_ok(&mut s).await),
        ("init_apply".into(), "before".into())
    );
    assert_eq!(ev_name(&next_ok(&mut s).await).0, "init_done");

    store
        .create(Kind::Pod, pod_json("default", "other-app", "z", None))
        .unwrap();
    store
        .create(Kind::Pod, pod_json("default", "fresh", "w", Some("node-1")))
        .unwrap();
    assert_eq!(
        ev_name(&next_ok(&mut s).await),
        ("apply".into(), "fresh".into())
    );
    run_pod(&store, "default", "fresh", "10.244.1.5");
    match next_ok(&mut s).await {
        watcher::Event::Apply(p) => {
            assert_eq!(p.status.and_then(|s| s.pod_ip), Some("10.244.1.5".into()))
        }
        other => panic!("expected modified, got {:?}", ev_name(&other)),
    }
    store
        .delete(Kind::Pod, Some("default"), "before", None, None)
        .unwrap();
    assert_eq!(
        ev_name(&next_ok(&mut s).await),
        ("delete".into(), "before".into())
    );
    // A label change that leaves the selector looks like a deletion to the watcher.
    store
        .modify(Kind::Pod, Some("default"), "fresh", |p| {
            p["metadata"]["labels"]["app"] = json!("gone");
            Ok(())
        })
        .unwrap();
    assert_eq!(
        ev_name(&next_ok(&mut s).await),
        ("delete".into(), "fresh".into())
    );
}

#[tokio::test]
async fn watcher_recovers_from_410_by_relisting() {
    let store = Store::with_history(4);
    let url = start(store.clone()).await;
    let c = client(&url);

    // An old resourceVersion answers 200 with one ERROR 410 event.
    for i in 0..10 {
        store
            .create(Kind::Pod, pod_json("default", &format!("p{i}"), "r", None))
            .unwrap();
    }
    let req =
        axum::http::Request::get("/api/v1/namespaces/default/pods?watch=true&resourceVersion=2")
            .body(Vec::new())
            .unwrap();
    let text = c.request_text(req).await.expect("watch answered 200");
    let first: Value = serde_json::from_str(text.lines().next().unwrap_or("")).unwrap();
    assert_eq!(first["type"], "ERROR");
    assert_eq!(first["object"]["code"], 410);
    assert_eq!(first["object"]["reason"], "Expired");

    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let mut s = watcher(pods, watcher::Config::default().labels("app=r")).boxed();
    let mut seen_init_done = 0;
    while seen_init_done == 0 {
        if ev_name(&next_ok(&mut s).await).0 == "init_done" {
            seen_init_done += 1;
        }
    }
    // Drop the history and end open watches: the resume gets 410 and kube-rs re-lists.
    for i in 10..20 {
        store
            .create(
                Kind::Pod,
                pod_json("default", &format!("p{i}"), "other", None),
            )
            .unwrap();
    }
    store.expire_watches();
    let mut relisted = false;
    loop {
        let (ty, _) = ev_name(&next_ok(&mut s).await);
        if ty == "init" {
            relisted = true;
        }
        if ty == "init_done" {
            break;
        }
    }
    assert!(relisted, "watcher did not re-list after 410");
    store
        .create(Kind::Pod, pod_json("default", "after", "r", None))
        .unwrap();
    loop {
        if ev_name(&next_ok(&mut s).await) == ("apply".into(), "after".into()) {
            break;
        }
    }
}

#[tokio::test]
async fn watch_stream_sends_initial_added_and_bookmark_end_and_times_out() {
    let store = Store::new();
    store
        .create(Kind::Pod, pod_json("default", "a", "b", None))
        .unwrap();
    let url = start(store.clone()).await;
    let c = client(&url);
    let req = axum::http::Request::get(
        "/api/v1/namespaces/default/pods?watch=1&resourceVersion=0&timeoutSeconds=1&fieldSelector=metadata.name%3Da",
    )
    .body(Vec::new())
    .unwrap();
    let text = c.request_text(req).await.unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[0]["object"]["kind"], "Pod");

    let req = axum::http::Request::get(
        "/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
    )
    .body(Vec::new())
    .unwrap();
    let text = c.request_text(req).await.unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap_or("")).unwrap();
    assert_eq!(last["type"], "BOOKMARK");
    assert_eq!(
        last["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test]
async fn scheduler_binds_pods_and_retries_when_a_node_is_uncordoned() {
    let store = Store::new();
    let mut n = node_json("node-1", "10.0.0.1");
    n["spec"]["unschedulable"] = json!(true);
    store.create(Kind::Node, n).unwrap();
    tokio::spawn(testbed::scheduler::run(store.clone()));
    store
        .create(Kind::Pod, pod_json("default", "waiting", "s", None))
        .unwrap();
    let cond = |store: &Store| {
        store.get(Kind::Pod, Some("default"), "waiting").unwrap()["status"]["conditions"][0].clone()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while cond(&store)["reason"] != "Unschedulable" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Unschedulable condition"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        cond(&store)["message"],
        "0/1 nodes are available: 1 node(s) were unschedulable. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    );
    store
        .modify(Kind::Node, None, "node-1", |n| {
            n["spec"]["unschedulable"] = Value::Null;
            Ok(())
        })
        .unwrap();
    while store.get(Kind::Pod, Some("default"), "waiting").unwrap()["spec"]["nodeName"] != "node-1"
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod not bound after uncordon"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cond(&store)["status"], "True");
    // The scheduler records its Event right after the binding: poll for it.
    let has = |events: &[Value], reason: &str| events.iter().any(|e| e["reason"] == reason);
    let events = loop {
        let (events, _) = store.list(Kind::Event, Some("default"));
        if (has(&events, "Scheduled") && has(&events, "FailedScheduling"))
            || tokio::time::Instant::now() >= deadline
        {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let reasons: Vec<&Value> = events.iter().map(|e| &e["reason"]).collect();
    assert!(has(&events, "Scheduled"), "events: {reasons:?}");
    assert!(has(&events, "FailedScheduling"), "events: {reasons:?}");
}

// ---------------------------------------------------------------- kubectl

static DIRS: AtomicUsize = AtomicUsize::new(0);

struct Kubectl {
    home: PathBuf,
}

impl Kubectl {
    fn new(url: &str) -> Kubectl {
        let home = std::env::temp_dir().join(format!(
            "testbed-api-kubectl-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&home).unwrap();
        let cfg = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {url}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: t\n    user: u\n    namespace: default\ncurrent-context: c\n"
        );
        std::fs::write(home.join("kubeconfig"), cfg).unwrap();
        Kubectl { home }
    }

    /// Runs kubectl; returns (exit code, stdout, stderr).
    async fn run(&self, args: &[&str]) -> (i32, String, String) {
        let home = self.home.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let out = Command::new("/usr/bin/kubectl")
                .args(&args)
                .env("HOME", &home)
                .env("KUBECONFIG", home.join("kubeconfig"))
                .current_dir(&home)
                .output()
                .expect("run kubectl");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .unwrap()
    }

    fn path(&self) -> &Path {
        &self.home
    }
}

impl Drop for Kubectl {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// The header line and the row starting with `name` (columns split on whitespace).
fn row<'a>(out: &'a str, first: &str) -> Vec<&'a str> {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_cordon_delete_and_errors_work() {
    let store = Store::new();
    store
        .create(Kind::Node, node_json("node-1", "10.0.0.1"))
        .unwrap();
    store
        .create(Kind::Node, node_json("node-2", "10.0.0.2"))
        .unwrap();
    store
        .create(Kind::Pod, pod_json("default", "web-1", "x", Some("node-1")))
        .unwrap();
    store
        .create(Kind::Pod, pod_json("default", "web-2", "x", Some("node-2")))
        .unwrap();
    store
        .create(
            Kind::Pod,
            pod_json("kube-system", "agent-1", "calico", Some("node-1")),
        )
        .unwrap();
    store
        .create(Kind::Pod, pod_json("default", "loose", "y", None))
        .unwrap();
    run_pod(&store, "default", "web-1", "10.244.1.7");
    run_pod(&store, "default", "web-2", "10.244.2.9");
    let url = start(store.clone()).await;
    let k = Kubectl::new(&url);

    let (rc, out, err) = k.run(&["get", "nodes", "-o", "wide"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        row(&out, "NAME")[..7],
        [
            "NAME",
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP"
        ]
    );
    let n1 = row(&out, "node-1");
    assert_eq!((n1[1], n1[5]), ("Ready", "10.0.0.1"), "{out}");

    let (rc, out, err) = k.run(&["get", "pods", "-A", "-o", "wide"]).await;
    assert_eq!(rc, 0, "{err}");
    let header = row(&out, "NAMESPACE");
    assert!(header.contains(&"IP") && header.contains(&"NODE"), "{out}");
    let w = row(&out, "default");
    assert!(!w.is_empty(), "{out}");
    let web1: Vec<&str> = out
        .lines()
        .find(|l| l.contains("web-1"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(web1[..4], ["default", "web-1", "1/1", "Running"], "{out}");
    assert!(
        web1.contains(&"10.244.1.7") && web1.contains(&"node-1"),
        "{out}"
    );
    assert!(out.contains("kube-system"), "{out}");
    let loose: Vec<&str> = out
        .lines()
        .find(|l| l.contains("loose"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(loose[2..4], ["0/1", "Pending"], "{out}");

    let (rc, out, err) = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=x",
            "--field-selector",
            "spec.nodeName=node-2",
        ])
        .await;
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("web-2") && !out.contains("web-1") && !out.contains("loose"),
        "{out}"
    );

    let (rc, out, err) = k.run(&["cordon", "node-1"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("node/node-1 cordoned"), "{out}");
    assert_eq!(
        store.get(Kind::Node, None, "node-1").unwrap()["spec"]["unschedulable"],
        true
    );
    let (_, out, _) = k.run(&["get", "no"]).await;
    assert_eq!(row(&out, "node-1")[1], "Ready,SchedulingDisabled", "{out}");
    let (rc, out, err) = k.run(&["uncordon", "node-1"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("node/node-1 uncordoned"), "{out}");
    let n1 = store.get(Kind::Node, None, "node-1").unwrap();
    assert!(n1["spec"].get("unschedulable").is_none(), "{n1}");
    assert_eq!(n1["spec"]["podCIDR"], "10.244.1.0/24");

    // Unbound pod: gone at once.
    let (rc, out, err) = k.run(&["delete", "pod", "loose"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("pod \"loose\" deleted"), "{out}");
    // Bound pod: graceful; a stand-in kubelet finishes it, kubectl waits for DELETED.
    let kubelet_store = store.clone();
    let kubelet = tokio::spawn(async move {
        loop {
            if let Ok(p) = kubelet_store.get(Kind::Pod, Some("default"), "web-1") {
                if !p["metadata"]["deletionTimestamp"].is_null() {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let uid = p["metadata"]["uid"].as_str().unwrap_or("").to_string();
                    kubelet_store
                        .remove(Kind::Pod, Some("default"), "web-1", &uid)
                        .unwrap();
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (rc, out, err) = k.run(&["delete", "pod", "web-1"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("pod \"web-1\" deleted"), "{out}");
    tokio::time::timeout(WAIT, kubelet).await.unwrap().unwrap();

    let (rc, _, err) = k.run(&["get", "pod", "nope"]).await;
    assert_eq!(rc, 1);
    assert!(
        err.contains("Error from server (NotFound): pods \"nope\" not found"),
        "{err}"
    );
    let (rc, _, err) = k.run(&["delete", "pod", "nope"]).await;
    assert_eq!(rc, 1);
    assert!(
        err.contains("Error from server (NotFound): pods \"nope\" not found"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_run_describe_and_wait_work() {
    let store = Store::new();
    store
        .create(Kind::Node, node_json("node-1", "10.0.0.1"))
        .unwrap();
    let url = start(store.clone()).await;
    let k = Kubectl::new(&url);
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels:\n    role: target\nspec:\n  nodeName: node-1\n  containers:\n  - name: main\n    image: target-server:v1\n";
    std::fs::write(k.path().join("pod.yaml"), manifest).unwrap();
    // Default --validate=strict needs the minimal OpenAPI.
    let (rc, out, err) = k.run(&["apply", "-f", "pod.yaml"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("pod/web created"), "{out}");
    let (rc, out, err) = k.run(&["apply", "-f", "pod.yaml"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("pod/web unchanged"), "{out}");
    let changed = manifest.replace("target-server:v1", "target-server:v2");
    std::fs::write(k.path().join("pod.yaml"), changed).unwrap();
    let (rc, out, err) = k.run(&["apply", "-f", "pod.yaml"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("pod/web configured"), "{out}");
    let web = store.get(Kind::Pod, Some("default"), "web").unwrap();
    assert_eq!(web["spec"]["containers"][0]["image"], "target-server:v2");
    assert_eq!(web["spec"]["containers"].as_array().unwrap().len(), 1);
    let (rc, _, err) = k.run(&["create", "-f", "pod.yaml"]).await;
    assert_eq!(rc, 1);
    assert!(err.contains("Error from server (AlreadyExists): error when creating \"pod.yaml\": pods \"web\" already exists"), "{err}");

    let (rc, out, err) = k.run(&["run", "x", "--image=target-server"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("pod/x created"), "{out}");
    assert_eq!(
        store.get(Kind::Pod, Some("default"), "x").unwrap()["metadata"]["labels"]["run"],
        "x"
    );

    run_pod(&store, "default", "web", "10.244.1.3");
    let (rc, out, err) = k
        .run(&["wait", "--for=condition=Ready", "pod/web", "--timeout=10s"])
        .await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("pod/web condition met"), "{out}");
    let (rc, _, _) = k
        .run(&["wait", "--for=condition=Ready", "pod/x", "--timeout=2s"])
        .await;
    assert_eq!(rc, 1, "pod x is not Ready and must not be reported as such");

    let (rc, out, err) = k.run(&["describe", "pod", "web"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("10.244.1.3") && out.contains("node-1"),
        "{out}"
    );
    let (rc, out, err) = k.run(&["describe", "node", "node-1"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("default") && out.contains("web"), "{out}");

    let (rc, out, err) = k.run(&["get", "events"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.is_empty() || out.contains("LAST SEEN"), "{out}");
    store
        .create(
            Kind::Event,
            json!({"metadata": {"name": "web.1", "namespace": "default"},
                   "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
                   "reason": "Started", "message": "Started container main", "type": "Normal",
                   "firstTimestamp": api::rfc3339_now(), "lastTimestamp": api::rfc3339_now(), "count": 1}),
        )
        .unwrap();
    let (rc, out, err) = k.run(&["get", "ev"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("pod/web") && out.contains("Started container main"),
        "{out}"
    );

    // `get pods -w`: one header, then one Table row per event. Its lines arrive as
    // kubectl prints them: wait for the initial rows before the delete and for the
    // delete's row after it.
    let mut watch = Command::new("/usr/bin/kubectl")
        .args(["get", "pods", "-w"])
        .env("HOME", k.path())
        .env("KUBECONFIG", k.path().join("kubeconfig"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let watch_out = watch.stdout.take().expect("kubectl stdout");
    let (line_tx, mut line_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(watch_out)
            .lines()
            .map_while(Result::ok)
        {
            if line_tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut lines: Vec<String> = Vec::new();
    let x_rows = |lines: &[String]| lines.iter().filter(|l| l.starts_with("x ")).count();
    lines_until(&mut lines, &mut line_rx, WAIT, |l| {
        x_rows(l) == 1 && l.iter().any(|r| r.starts_with("web "))
    })
    .await;
    assert_eq!(
        x_rows(&lines),
        1,
        "initial rows within {WAIT:?}: {lines:#?}"
    );
    store
        .delete(Kind::Pod, Some("default"), "x", None, None)
        .unwrap();
    lines_until(&mut lines, &mut line_rx, WAIT, |l| x_rows(l) >= 2).await;
    // No further rows must follow (one per event): a bounded wait, then stop kubectl.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let _ = watch.kill();
    let _ = tokio::task::spawn_blocking(move || {
        let _ = watch.wait();
        let _ = reader.join();
    })
    .await;
    while let Ok(l) = line_rx.try_recv() {
        lines.push(l);
    }
    let stdout = lines.join("\n");
    assert_eq!(stdout.matches("NAME").count(), 1, "{stdout}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("x ")).count(),
        2,
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("web ") && l.contains("Running")),
        "{stdout}"
    );
}

/// Moves lines from `rx` into `lines` until `done(lines)` holds, the sender is gone or
/// `limit` has passed.
async fn lines_until(
    lines: &mut Vec<String>,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    limit: Duration,
    done: impl Fn(&[String]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done(lines) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(l)) => lines.push(l),
            _ => return,
        }
    }
}

// ---------------------------------------------------------------- TLS and restarts

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "testbed-api-{tag}-{}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A kube-rs client for `https://addr` trusting only the testbed CA in `ca_pem`.
fn tls_client(addr: std::net::SocketAddr, ca_pem: &str) -> Client {
    let mut cfg = Config::new(format!("https://{addr}").parse().expect("url"));
    cfg.root_cert = Some(testbed::tls::certs_der(ca_pem).expect("ca der"));
    Client::try_from(cfg).expect("kube client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_the_testbed_ca_serves_kube_rs_and_kubectl_and_rejects_other_cas() {
    let dir = tmp_dir("tls");
    let sans = testbed::tls::api_server_sans(&[], &[]);
    let pki = testbed::tls::ensure_pki(&dir.join("pki"), &sans).expect("pki");
    let store = Store::new();
    store
        .create(Kind::Pod, pod_json("default", "web", "x", None))
        .unwrap();
    let mut server = api::ApiServer::new(store.clone());
    let addr = server
        .listen(
            "127.0.0.1:0".parse().unwrap(),
            Some(pki.server_config().expect("server config")),
            None,
        )
        .expect("listen");

    let pods: Api<Pod> = Api::default_namespaced(tls_client(addr, &pki.ca_cert_pem));
    let names: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .expect("list over https")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, ["web"]);

    // A client trusting another CA must fail the handshake.
    let other = testbed::tls::generate(&sans).expect("other pki");
    let stranger: Api<Pod> = Api::default_namespaced(tls_client(addr, &other.ca_cert_pem));
    assert!(stranger.list(&ListParams::default()).await.is_err());

    // kubectl with `certificate-authority` in its kubeconfig. Over https kubectl
    // prompts for a username when the user has no credentials at all, so the user
    // carries a token (the testbed API ignores it).
    let k = Kubectl::new(&format!("https://{addr}"));
    let ca = pki.ca_path().expect("ca path");
    let cfg = std::fs::read_to_string(k.path().join("kubeconfig"))
        .unwrap()
        .replace(
            &format!("server: https://{addr}"),
            &format!(
                "server: https://{addr}\n    certificate-authority: {}",
                ca.display()
            ),
        )
        .replace("user: {}", "user:\n    token: testbed");
    std::fs::write(k.path().join("kubeconfig"), cfg).unwrap();
    let (rc, out, err) = k.run(&["get", "pods"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(row(&out, "web").len() >= 3, "{out}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Collects watcher events (errors skipped) into a channel.
fn spawn_watcher(client: Client) -> tokio::sync::mpsc::UnboundedReceiver<(String, String)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let mut s = watcher(pods, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            if let Ok(ev) = ev {
                if tx.send(ev_name(&ev)).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Waits for the `apply` of `name`, returning everything seen up to and including it.
async fn until_apply(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    name: &str,
) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(ev)) => {
                let done = ev.0 == "apply" && ev.1 == name;
                seen.push(ev);
                if done {
                    return seen;
                }
            }
            Ok(None) => panic!("watcher ended; seen {seen:?}"),
            Err(_) => panic!("no apply of {name} within {WAIT:?}; seen {seen:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_survives_restart_and_reload_from_disk_without_missing_or_duplicating() {
    let dir = tmp_dir("restart");
    let pki = testbed::tls::generate(&testbed::tls::api_server_sans(&[], &[])).expect("pki");
    let store = Store::load_from(&dir.join("etcd")).expect("load fresh store");
    let mut server = api::ApiServer::new(store.clone());
    let addr = server
        .listen(
            "127.0.0.1:0".parse().unwrap(),
            Some(pki.server_config().expect("config")),
            None,
        )
        .expect("listen");
    let mut rx = spawn_watcher(tls_client(addr, &pki.ca_cert_pem));
    loop {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(ev)) if ev.0 == "init_done" => break,
            Ok(Some(_)) => {}
            other => panic!("no initial list: {other:?}"),
        }
    }
    store
        .create(Kind::Pod, pod_json("default", "a", "x", None))
        .unwrap();
    let first = until_apply(&mut rx, "a").await;
    assert_eq!(first.len(), 1, "{first:?}");

    // 1. Restart the HTTP front end with the store living on; a pod is created while
    //    the port is closed.
    server.stop().await;
    assert!(!server.is_running());
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "port must be closed"
    );
    store
        .create(Kind::Pod, pod_json("default", "b", "x", None))
        .unwrap();
    server.start().expect("start again on the same address");
    let after_restart = until_apply(&mut rx, "b").await;

    // 2. Reload the store from disk (as after a daemon restart) and serve that.
    store
        .create(Kind::Pod, pod_json("default", "c", "x", None))
        .unwrap();
    let after_c = until_apply(&mut rx, "c").await;
    let rv_before = store.current_rv();
    server.stop().await;
    drop(store);
    let reloaded = Store::load_from(&dir.join("etcd")).expect("reload");
    assert_eq!(
        reloaded.current_rv(),
        rv_before,
        "resourceVersion counter survives"
    );
    assert!(reloaded.get(Kind::Pod, Some("default"), "c").is_ok());
    server
        .restart_with(reloaded.clone())
        .await
        .expect("serve the reloaded store");
    let d = reloaded
        .create(Kind::Pod, pod_json("default", "d", "x", None))
        .unwrap();
    assert_eq!(
        d["metadata"]["resourceVersion"],
        (rv_before + 1).to_string()
    );
    let after_reload = until_apply(&mut rx, "d").await;

    let later: Vec<&(String, String)> = after_restart
        .iter()
        .chain(&after_c)
        .chain(&after_reload)
        .collect();
    // No relist (a relist starts with `init`), no duplicate, nothing missed.
    assert!(later.iter().all(|e| e.0 == "apply"), "{later:?}");
    let names: Vec<&str> = later.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(names, ["b", "c", "d"]);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------- controllers

/// A fake kubelet: every 100 ms marks Pending Pods Running and Ready, and Pods of
/// `restartPolicy: Never` Succeeded.
fn spawn_fake_kubelet(store: Arc<Store>) {
    tokio::spawn(async move {
        let mut ip = 10;
        loop {
            for p in store.list(Kind::Pod, None).0 {
                if p["status"]["phase"] != "Pending" {
                    continue;
                }
                let ns = p["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
                if p["spec"]["restartPolicy"] == "Never" {
                    let _ = store.modify(Kind::Pod, Some(&ns), &name, |p| {
                        p["status"]["phase"] = json!("Succeeded");
                        Ok(())
                    });
                } else {
                    ip += 1;
                    run_pod(&store, &ns, &name, &format!("10.244.1.{ip}"));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_deployment_and_a_job_validates_and_they_reach_ready_and_complete() {
    let store = Store::new();
    tokio::spawn(testbed::controllers::run(store.clone()));
    spawn_fake_kubelet(store.clone());
    let url = start(store.clone()).await;
    let k = Kubectl::new(&url);
    let deploy = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  selector:\n    matchLabels:\n      app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n      - name: main\n        image: target-server:v1\n        args: [serve]\n";
    std::fs::write(k.path().join("deploy.yaml"), deploy).unwrap();
    let (rc, out, err) = k.run(&["apply", "-f", "deploy.yaml"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("deployment.apps/web created"), "{out}");
    let (rc, out, err) = k
        .run(&["rollout", "status", "deployment/web", "--timeout=20s"])
        .await;
    assert_eq!(rc, 0, "{err}{out}");
    assert!(out.contains("successfully rolled out"), "{out}");
    let (rc, out, err) = k.run(&["get", "deploy"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        row(&out, "NAME")[..5],
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    assert_eq!(row(&out, "web")[1..4], ["2/2", "2", "2"], "{out}");
    let (rc, out, _) = k.run(&["get", "pods", "-l", "app=web"]).await;
    assert_eq!(rc, 0);
    assert_eq!(
        out.lines().filter(|l| l.starts_with("web-")).count(),
        2,
        "{out}"
    );

    let job = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: once\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: target-server:v1\n";
    std::fs::write(k.path().join("job.yaml"), job).unwrap();
    let (rc, out, err) = k.run(&["create", "-f", "job.yaml"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("job.batch/once created"), "{out}");
    let (rc, out, err) = k
        .run(&[
            "wait",
            "--for=condition=Complete",
            "job/once",
            "--timeout=20s",
        ])
        .await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("condition met"), "{out}");
    let (rc, out, err) = k.run(&["get", "jobs"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        row(&out, "NAME")[..5],
        ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    );
    assert_eq!(row(&out, "once")[1..3], ["Complete", "1/1"], "{out}");

    let bad = job
        .replace("Never", "Always")
        .replace("name: once", "name: bad");
    std::fs::write(k.path().join("bad.yaml"), bad).unwrap();
    let (rc, _, err) = k.run(&["apply", "-f", "bad.yaml"]).await;
    assert_eq!(rc, 1);
    assert!(err.contains("spec.template.spec.restartPolicy"), "{err}");

    let (rc, _, err) = k.run(&["delete", "deployment", "web"]).await;
    assert_eq!(rc, 0, "{err}");
    // The garbage collector removes the Deployment's pods after kubectl returned: poll.
    let web_pods = || -> Vec<String> {
        store
            .list(Kind::Pod, Some("default"))
            .0
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .filter(|n| n.starts_with("web-"))
            .collect()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut left = web_pods();
    while !left.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = web_pods();
    }
    assert!(
        left.is_empty(),
        "pods of the deleted Deployment left after {WAIT:?}: {left:?}"
    );
}

// ---------------------------------------------------------------- logs

/// A log source that follows: "one\n" at once, "two\n" after 600 ms, then the
/// container ends.
struct SlowLogs;

impl api::LogSource for SlowLogs {
    fn read(&self, _: &str, _: &str, _: &str, _: &api::LogQuery) -> Option<String> {
        Some("one\n".into())
    }

    fn follow(&self, _: &str, _: &str, _: &str, _: &api::LogQuery) -> Option<api::LogStream> {
        let s = futures::stream::once(async { b"one\n".to_vec() }).chain(futures::stream::once(
            async {
                tokio::time::sleep(Duration::from_millis(600)).await;
                b"two\n".to_vec()
            },
        ));
        Some(s.boxed())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_follow_streams_until_the_container_ends() {
    let store = Store::new();
    store
        .create(Kind::Pod, pod_json("default", "web", "x", None))
        .unwrap();
    store.set_log_source(Arc::new(SlowLogs));
    let url = start(store.clone()).await;
    let k = Kubectl::new(&url);
    let (rc, out, err) = k.run(&["logs", "web"]).await;
    assert_eq!((rc, out.as_str()), (0, "one\n"), "{err}");
    let t0 = std::time::Instant::now();
    let (rc, out, err) = k.run(&["logs", "-f", "web"]).await;
    assert_eq!((rc, out.as_str()), (0, "one\ntwo\n"), "{err}");
    assert!(t0.elapsed() >= Duration::from_millis(600));
}

/// The node components' client ([`testbed::client`]) against the built-in server: a
/// status patch carrying a stale `metadata.uid` and a DELETE with a stale UID
/// precondition both answer 409 and leave the new pod alone; with the right UID the
/// patch lands only in `status` and the grace-0 DELETE removes a bound pod at once;
/// `spec.nodeName` field selectors filter lists.
#[tokio::test]
async fn uid_preconditions_guard_status_patches_and_final_deletes() {
    let store = Store::new();
    store
        .create(Kind::Node, node_json("node-1", "10.0.0.1"))
        .expect("node");
    let url = start(store.clone()).await;
    let api = testbed::client::ClusterEndpoint {
        url,
        ca_pem: None,
        identity: testbed::client::ClientIdentity::Token("t".into()),
    }
    .client()
    .await
    .expect("client");
    let created = store
        .create(Kind::Pod, pod_json("default", "p", "web", Some("node-1")))
        .expect("pod");
    let uid = created["metadata"]["uid"].as_str().expect("uid").to_owned();
    let status = "/api/v1/namespaces/default/pods/p/status";
    let stale = json!({"metadata": {"uid": "not-the-uid"}, "status": {"phase": "Running"}});
    let e = api
        .patch(status, testbed::client::PatchKind::Merge, &stale)
        .await
        .expect_err("stale uid patch");
    assert_eq!(e.code, 409, "{e}");
    let good = json!({"metadata": {"uid": uid}, "status": {"phase": "Running"},
                      "spec": {"nodeName": "elsewhere"}});
    let out = api
        .patch(status, testbed::client::PatchKind::Merge, &good)
        .await
        .expect("status patch");
    assert_eq!(out["status"]["phase"], "Running");
    assert_eq!(
        out["spec"]["nodeName"], "node-1",
        "status patch left spec alone"
    );

    let list = api
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1")
        .await
        .expect("list");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    let list = api
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-2")
        .await
        .expect("list");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0));

    let path = "/api/v1/namespaces/default/pods/p";
    let opts = |u: &str| json!({"gracePeriodSeconds": 0, "preconditions": {"uid": u}});
    let e = api
        .delete(path, &opts("not-the-uid"))
        .await
        .expect_err("stale uid delete");
    assert_eq!(e.code, 409, "{e}");
    assert!(e.message.contains("Precondition failed"), "{e}");
    assert!(store.get(Kind::Pod, Some("default"), "p").is_ok());
    api.delete(path, &opts(&uid)).await.expect("final delete");
    assert_eq!(
        store
            .get(Kind::Pod, Some("default"), "p")
            .map(|_| ())
            .unwrap_err()
            .code,
        404,
        "grace 0 removes a bound pod at once"
    );
}

// ---------------------------------------------------------------- NetworkPolicy

fn netpol(name: &str, labels: Value, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }))
    .expect("NetworkPolicy")
}

/// The 422 `Status` of `r`, or a panic naming what came instead.
fn invalid_status<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) if s.code == 422 && s.reason == "Invalid" => *s,
        other => panic!("expected 422 Invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn network_policies_are_created_defaulted_listed_watched_and_deleted_through_kube_rs() {
    let store = Store::new();
    let url = start(store.clone()).await;
    let c = client(&url);
    let nss: Api<Namespace> = Api::all(c.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "probe"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let np: Api<NetworkPolicy> = Api::namespaced(c.clone(), "probe");

    let deny = np
        .create(
            &PostParams::default(),
            &netpol("deny-all", json!({"app": "firstpacket"}), json!({})),
        )
        .await
        .expect("create deny-all");
    assert_eq!(deny.metadata.generation, Some(1));
    assert!(deny.metadata.uid.is_some() && deny.metadata.resource_version.is_some());
    let spec = deny.spec.clone().expect("spec");
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let raw = store
        .get(Kind::NetworkPolicy, Some("probe"), "deny-all")
        .unwrap();
    assert_eq!(raw["spec"]["podSelector"], json!({}), "{raw}");
    assert_eq!(raw["apiVersion"], "networking.k8s.io/v1");

    let allow = np
        .create(
            &PostParams::default(),
            &netpol(
                "allow-src",
                json!({"app": "firstpacket", "probe": "p1"}),
                json!({"podSelector": {"matchLabels": {"role": "dst"}},
                   "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "probe"}},
                                          "podSelector": {"matchLabels": {"role": "src"}}}],
                                "ports": [{"port": 8080}]}],
                   "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}}]}]}),
            ),
        )
        .await
        .expect("create allow-src");
    let spec = allow.spec.clone().expect("spec");
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );
    let port = &spec.ingress.as_ref().unwrap()[0].ports.as_ref().unwrap()[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));

    let by_label = np
        .list(&ListParams::default().labels("probe=p1"))
        .await
        .unwrap();
    let names: Vec<_> = by_label
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, ["allow-src"]);
    let by_field = np
        .list(&ListParams::default().fields("metadata.name=deny-all"))
        .await
        .unwrap();
    assert_eq!(by_field.items.len(), 1);
    let everywhere: Api<NetworkPolicy> = Api::all(c.clone());
    assert_eq!(
        everywhere
            .list(&ListParams::default().labels("app=firstpacket"))
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // A watch resumed from the list's resourceVersion sees exactly the later changes.
    let rv = by_label.metadata.resource_version.clone().expect("list rv");
    let mut w = np
        .watch(&WatchParams::default().labels("app=firstpacket"), &rv)
        .await
        .expect("watch")
        .boxed();
    let patched = np
        .patch(
            "deny-all",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"policyTypes": ["Ingress", "Egress"]}})),
        )
        .await
        .expect("merge patch");
    assert_eq!(patched.metadata.generation, Some(2), "spec change");
    np.delete("allow-src", &DeleteParams::default())
        .await
        .expect("delete");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(WAIT, w.try_next()).await {
            Ok(Ok(Some(WatchEvent::Modified(p)))) => {
                seen.push(("MODIFIED", p.metadata.name.unwrap_or_default()))
            }
            Ok(Ok(Some(WatchEvent::Deleted(p)))) => {
                seen.push(("DELETED", p.metadata.name.unwrap_or_default()))
            }
            Ok(Ok(Some(WatchEvent::Bookmark(_)))) => {}
            other => panic!("after {seen:?}: {other:?}"),
        }
    }
    assert_eq!(
        seen,
        [
            ("MODIFIED", "deny-all".to_string()),
            ("DELETED", "allow-src".to_string())
        ]
    );
    assert!(np.get_opt("allow-src").await.unwrap().is_none());

    // Replacing with an invalid spec is refused like a create.
    let mut bad = np.get("deny-all").await.unwrap();
    bad.spec.as_mut().unwrap().policy_types = Some(vec!["Sideways".into()]);
    let s = invalid_status(np.replace("deny-all", &PostParams::default(), &bad).await);
    assert_eq!(s.message, "NetworkPolicy.networking.k8s.io \"deny-all\" is invalid: spec.policyTypes[0]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"");

    // Owned by a pod: garbage collected with it. All gone with the namespace.
    let owner = store
        .create(Kind::Pod, pod_json("probe", "prober", "x", None))
        .unwrap();
    let mut owned = netpol("owned", json!({}), json!({}));
    owned.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "name": "prober", "uid": owner["metadata"]["uid"]}))
    .unwrap()]);
    np.create(&PostParams::default(), &owned).await.unwrap();
    store
        .delete(Kind::Pod, Some("probe"), "prober", None, None)
        .unwrap();
    assert!(np.get_opt("owned").await.unwrap().is_none(), "GC");
    nss.delete("probe", &DeleteParams::default()).await.unwrap();
    assert!(store.list(Kind::NetworkPolicy, None).0.is_empty());
    assert!(nss.get_opt("probe").await.unwrap().is_none());
}

#[tokio::test]
async fn malformed_network_policies_are_refused_naming_the_field() {
    let store = Store::new();
    let url = start(store.clone()).await;
    let np: Api<NetworkPolicy> = Api::namespaced(client(&url), "default");
    let create = |name: &str, spec: Value| {
        let np = np.clone();
        let p = netpol(name, json!({}), spec);
        async move { np.create(&PostParams::default(), &p).await }
    };
    let s = invalid_status(create("types", json!({"policyTypes": ["Ingress", "Sideways"]})).await);
    assert_eq!(s.message, "NetworkPolicy.networking.k8s.io \"types\" is invalid: spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"");
    let s = invalid_status(
        create(
            "cidr",
            json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]}]}),
        )
        .await,
    );
    assert_eq!(s.message, "NetworkPolicy.networking.k8s.io \"cidr\" is invalid: spec.egress[0].to[0].ipBlock.cidr: Invalid value: \"10.0.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)");
    let s = invalid_status(
        create(
            "except",
            json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}]}]}),
        )
        .await,
    );
    assert_eq!(s.message, "NetworkPolicy.networking.k8s.io \"except\" is invalid: spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.1.0.0/24\": must be a strict subset of `cidr`");
    let s = invalid_status(
        create(
            "proto",
            json!({"ingress": [{"ports": [{"port": 80, "protocol": "ICMP"}]}]}),
        )
        .await,
    );
    assert_eq!(s.message, "NetworkPolicy.networking.k8s.io \"proto\" is invalid: spec.ingress[0].ports[0].protocol: Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\"");
    let details = s.details.clone().expect("details");
    assert_eq!(details.group, "networking.k8s.io");
    assert_eq!(details.causes[0].field, "spec.ingress[0].ports[0].protocol");
    assert_eq!(details.causes[0].reason, "FieldValueNotSupported");
    // Several causes: one message in brackets, one cause each.
    let s = invalid_status(
        create(
            "many",
            json!({"ingress": [{"from": [{}], "ports": [{"port": 0}]}]}),
        )
        .await,
    );
    assert_eq!(s.message, "NetworkPolicy.networking.k8s.io \"many\" is invalid: [spec.ingress[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive, spec.ingress[0].from[0]: Required value: must specify a peer]");
    assert!(
        store.list(Kind::NetworkPolicy, None).0.is_empty(),
        "nothing invalid stored"
    );
    // A field of the wrong JSON type is a decoding error (400), as in kube-apiserver.
    let e = store
        .create(
            Kind::NetworkPolicy,
            json!({"metadata": {"name": "x", "namespace": "default"}, "spec": {"policyTypes": "Ingress"}}),
        )
        .unwrap_err();
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"), "{e}");
    // A missing podSelector is fine: it defaults to {} (every pod of the namespace).
    let ok = create("empty", json!({"policyTypes": ["Egress"]}))
        .await
        .unwrap();
    assert_eq!(
        ok.spec.and_then(|s| s.policy_types),
        Some(vec!["Egress".to_string()])
    );
}

#[tokio::test]
async fn namespaces_carry_their_name_label_which_updates_cannot_change() {
    let store = Store::new();
    let url = start(store.clone()).await;
    let nss: Api<Namespace> = Api::all(client(&url));
    for sys in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let n = nss.get(sys).await.unwrap();
        assert_eq!(
            n.metadata
                .labels
                .unwrap_or_default()
                .get(api::NAMESPACE_NAME_LABEL),
            Some(&sys.to_string())
        );
    }
    let gen: Namespace =
        serde_json::from_value(json!({"metadata": {"generateName": "probe-"}})).unwrap();
    let made = nss.create(&PostParams::default(), &gen).await.unwrap();
    let name = made.metadata.name.clone().unwrap();
    assert_eq!(
        made.metadata
            .labels
            .unwrap_or_default()
            .get(api::NAMESPACE_NAME_LABEL),
        Some(&name),
        "the generated name, not the prefix"
    );
    let patched = nss
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {api::NAMESPACE_NAME_LABEL: "other", "team": "a"}}}),
            ),
        )
        .await
        .unwrap();
    let labels = patched.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get(api::NAMESPACE_NAME_LABEL), Some(&name));
    assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    let listed = nss
        .list(&ListParams::default().labels(&format!("{}={name}", api::NAMESPACE_NAME_LABEL)))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
}

#[tokio::test]
async fn discovery_serves_networking_k8s_io_with_network_policies() {
    let store = Store::new();
    let url = start(store).await;
    let c = client(&url);
    let get = |path: &str| {
        let c = c.clone();
        let req = axum::http::Request::get(path).body(Vec::new()).unwrap();
        async move { c.request::<Value>(req).await.expect("discovery") }
    };
    let groups = get("/apis").await;
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "networking.k8s.io"
                && g["preferredVersion"]["groupVersion"] == "networking.k8s.io/v1"),
        "{groups}"
    );
    let list = get("/apis/networking.k8s.io/v1").await;
    assert_eq!(list["groupVersion"], "networking.k8s.io/v1");
    let r = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "networkpolicies")
        .cloned()
        .unwrap_or_else(|| panic!("{list}"));
    assert_eq!(r["kind"], "NetworkPolicy");
    assert_eq!(r["namespaced"], true);
    assert_eq!(r["shortNames"], json!(["netpol"]));
    assert_eq!(r["singularName"], "networkpolicy");
    // kube-rs' own discovery finds the kind.
    let d = kube::Discovery::new(c.clone())
        .run()
        .await
        .expect("discovery");
    let (ar, _) = d
        .resolve_gvk(&kube::core::GroupVersionKind::gvk(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
        ))
        .expect("NetworkPolicy discovered");
    assert_eq!(ar.plural, "networkpolicies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_lists_and_refuses_network_policies() {
    let store = Store::new();
    let url = start(store.clone()).await;
    let k = Kubectl::new(&url);
    let manifest = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: allow-src\nspec:\n  podSelector:\n    matchLabels:\n      role: dst\n  ingress:\n  - from:\n    - podSelector:\n        matchLabels:\n          role: src\n";
    std::fs::write(k.path().join("np.yaml"), manifest).unwrap();
    let (rc, out, err) = k.run(&["apply", "-f", "np.yaml"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("networkpolicy.networking.k8s.io/allow-src created"),
        "{out}"
    );
    let (rc, out, err) = k.run(&["apply", "-f", "np.yaml"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("unchanged"), "{out}");
    store
        .create(
            Kind::NetworkPolicy,
            json!({"metadata": {"name": "deny-all", "namespace": "default"}, "spec": {}}),
        )
        .unwrap();
    let (rc, out, err) = k.run(&["get", "netpol"]).await;
    assert_eq!(rc, 0, "{err}");
    assert_eq!(row(&out, "NAME"), ["NAME", "POD-SELECTOR", "AGE"], "{out}");
    assert_eq!(row(&out, "allow-src")[1], "role=dst", "{out}");
    assert_eq!(row(&out, "deny-all")[1], "<none>", "{out}");
    let bad = manifest
        .replace("allow-src", "bad")
        .replace("  ingress:", "  policyTypes: [Sideways]\n  ingress:");
    std::fs::write(k.path().join("bad.yaml"), bad).unwrap();
    let (rc, _, err) = k.run(&["apply", "-f", "bad.yaml"]).await;
    assert_eq!(rc, 1);
    assert!(
        err.contains("\"bad\" is invalid: spec.policyTypes[0]: Unsupported value: \"Sideways\""),
        "{err}"
    );
    let (rc, out, err) = k.run(&["delete", "netpol", "allow-src"]).await;
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("deleted"), "{out}");
}

// ---------------------------------------------------------------- pod proxy

/// What the echo pod saw of one request.
#[derive(Debug, serde::Deserialize)]
struct Echoed {
    method: String,
    uri: String,
    content_type: String,
    authorization: String,
    forwarded_for: String,
    body: String,
}

/// A tiny HTTP server standing for a pod on `ip`: answers `/missing` with a plain-text
/// 404, anything else with 200 (201 for POST) and a JSON [`Echoed`].
async fn echo_pod(ip: &str) -> std::net::SocketAddr {
    async fn echo(req: axum::extract::Request) -> axum::response::Response {
        use axum::response::IntoResponse;
        if req.uri().path() == "/missing" {
            return (axum::http::StatusCode::NOT_FOUND, "no such page\n").into_response();
        }
        let (method, uri, content_type, authorization, forwarded_for) = {
            let header = |n: &str| {
                req.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string()
            };
            (
                req.method().to_string(),
                req.uri().to_string(),
                header("content-type"),
                header("authorization"),
                header("x-forwarded-for"),
            )
        };
        let code = if method == "POST" { 201 } else { 200 };
        let body = axum::body::to_bytes(req.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let v = json!({"method": method, "uri": uri, "content_type": content_type,
            "authorization": authorization, "forwarded_for": forwarded_for,
            "body": String::from_utf8_lossy(&body)});
        (
            axum::http::StatusCode::from_u16(code).unwrap(),
            [("content-type", "application/json; charset=utf-8")],
            v.to_string(),
        )
            .into_response()
    }
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .expect("bind the echo pod");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, axum::Router::new().fallback(echo)).await;
    });
    addr
}

/// One plain HTTP/1.1 request to the API server at `base` (`http://ADDR`); returns
/// (status, Content-Type, body).
async fn raw_request(
    base: &str,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let headers: Vec<(&str, &str)> = content_type
        .map(|ct| ("content-type", ct))
        .into_iter()
        .collect();
    raw_request_with(base, method, path, &headers, body).await
}

/// [`raw_request`] with any request `headers` (beside `Host` and an `Authorization`).
async fn raw_request_with(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use http_body_util::BodyExt;
    let addr = base.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("authorization", "Bearer secret");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = tokio::time::timeout(WAIT, tx.send_request(req))
        .await
        .expect("answer in time")
        .expect("answer");
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, ct, String::from_utf8_lossy(&body).into_owned())
}

fn status_of(body: &str) -> (String, String) {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not a Status: {body}"));
    assert_eq!(v["kind"], "Status", "{v}");
    (
        v["reason"].as_str().unwrap_or("").to_string(),
        v["message"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn pod_proxy_forwards_get_and_post_with_query_body_and_content_type() {
    let store = Store::new();
    let pod_addr = echo_pod("127.0.0.23").await;
    let mut p = pod_json("default", "echo", "echo", Some("node-1"));
    p["spec"]["containers"][0]["ports"] = json!([{"containerPort": pod_addr.port()}]);
    store.create(Kind::Pod, p).unwrap();
    run_pod(&store, "default", "echo", "127.0.0.23");
    let url = start(store.clone()).await;

    // GET: the first containerPort; path and raw query as sent.
    let (code, ct, body) = raw_request(
        &url,
        "GET",
        "/api/v1/namespaces/default/pods/echo/proxy/a/b%2Fc/?x=1&y=a%20b&x=2",
        None,
        "",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(ct, "application/json; charset=utf-8");
    let e: Echoed = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (e.method.as_str(), e.uri.as_str()),
        ("GET", "/a/b%2Fc/?x=1&y=a%20b&x=2")
    );
    assert_eq!(e.authorization, "", "the API's credentials stay behind");
    // Who asked, as kube-apiserver's proxy (Go's httputil.ReverseProxy) says it.
    assert_eq!(e.forwarded_for, "127.0.0.1");

    // POST to an explicit port: body and Content-Type go through, the status comes back.
    let (code, _, body) = raw_request(
        &url,
        "POST",
        &format!(
            "/api/v1/namespaces/default/pods/echo:{}/proxy/dial?timeout=1s",
            pod_addr.port()
        ),
        Some("application/x-www-form-urlencoded"),
        "host=10.0.0.1&port=8080",
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let e: Echoed = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (e.method.as_str(), e.uri.as_str(), e.body.as_str()),
        ("POST", "/dial?timeout=1s", "host=10.0.0.1&port=8080")
    );
    assert_eq!(e.content_type, "application/x-www-form-urlencoded");

    // A client's own X-Forwarded-For is kept, the client's address appended.
    let (code, _, body) = raw_request_with(
        &url,
        "GET",
        "/api/v1/namespaces/default/pods/echo/proxy/x",
        &[("X-Forwarded-For", "192.0.2.7")],
        "",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let e: Echoed = serde_json::from_str(&body).unwrap();
    assert_eq!(e.forwarded_for, "192.0.2.7, 127.0.0.1");

    // The pod's own error status and body pass through untouched.
    let (code, ct, body) = raw_request(
        &url,
        "GET",
        "/api/v1/namespaces/default/pods/echo/proxy/missing",
        None,
        "",
    )
    .await;
    assert_eq!(
        (code, ct.as_str(), body.as_str()),
        (404, "text/plain; charset=utf-8", "no such page\n")
    );

    // kube-rs through the same path (what the prober uses).
    let text = client(&url)
        .request_text(
            axum::http::Request::get("/api/v1/namespaces/default/pods/echo/proxy/hello")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .expect("kube-rs proxied GET");
    assert!(text.contains("\"uri\":\"/hello\""), "{text}");
}

#[tokio::test]
async fn pod_proxy_answers_404_400_503_and_403_like_kube_apiserver() {
    let store = Store::new();
    store
        .create(Kind::Pod, pod_json("default", "no-ip", "x", Some("node-1")))
        .unwrap();
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.24:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut refused = pod_json("default", "refused", "x", Some("node-1"));
    refused["spec"]["containers"][0]["ports"] = json!([{"containerPort": closed_port}]);
    store.create(Kind::Pod, refused).unwrap();
    run_pod(&store, "default", "refused", "127.0.0.24");
    let pod_addr = echo_pod("127.0.0.25").await;
    store
        .create(Kind::Pod, pod_json("default", "echo", "x", Some("node-1")))
        .unwrap();
    run_pod(&store, "default", "echo", "127.0.0.25");
    let url = start(store.clone()).await;
    let path = |id: &str| format!("/api/v1/namespaces/default/pods/{id}/proxy/metrics");

    let (code, _, body) = raw_request(&url, "GET", &path("ghost:80"), None, "").await;
    assert_eq!(code, 404);
    assert_eq!(
        status_of(&body),
        ("NotFound".into(), "pods \"ghost\" not found".into())
    );
    let (code, _, body) = raw_request(&url, "GET", &path("no-ip:80"), None, "").await;
    assert_eq!(code, 400);
    assert_eq!(
        status_of(&body),
        ("BadRequest".into(), "address not allowed".into())
    );
    let (code, _, body) = raw_request(&url, "GET", &path("refused"), None, "").await;
    assert_eq!(code, 503, "{body}");
    assert_eq!(
        status_of(&body),
        (
            "ServiceUnavailable".into(),
            format!("error trying to reach service: dial tcp 127.0.0.24:{closed_port}: connect: connection refused")
        )
    );
    let (code, _, body) = raw_request(&url, "GET", &path("a:b:c:d"), None, "").await;
    assert_eq!(
        (code, status_of(&body).1),
        (400, "invalid pod request \"a:b:c:d\"".into())
    );

    // RBAC: pods/proxy is its own resource; GET needs `get`, POST `create`.
    let echo = path(&format!("echo:{}", pod_addr.port()));
    store.deny("create", "pods/proxy");
    let (code, _, body) = raw_request(&url, "POST", &echo, None, "x").await;
    assert_eq!(code, 403);
    assert!(
        status_of(&body).1.ends_with(
            "cannot create resource \"pods/proxy\" in API group \"\" in the namespace \"default\""
        ),
        "{body}"
    );
    let (code, _, body) = raw_request(&url, "GET", &echo, None, "").await;
    assert_eq!(code, 200, "{body}");
    store.deny("get", "pods");
    let (code, _, _) = raw_request(&url, "GET", &echo, None, "").await;
    assert_eq!(code, 200, "`pods` does not cover `pods/proxy`");
    store.deny("get", "pods/proxy");
    let (code, _, body) = raw_request(&url, "GET", &echo, None, "").await;
    assert_eq!(code, 403, "{body}");
}
