//! The simulated agent enforces Kubernetes NetworkPolicy with real packets in the
//! nodes' nftables (`testbed::netpol`, `testbed::policy_sync`), its faults
//! (`policy_delay`, `policy_never`, `isolation_lag`) and its ground truth
//! (`policy_programmed` / `policy_revoked`), on a 2-node testbed of either control plane
//! (`FIRSTPACKET_CONTROL_PLANE` picks one). Pods run `target-server serve`; the test
//! dials them from inside other pods' network namespaces and compares what its dial
//! loops saw with the truth log.
//!
//! Needs root, `ip`, `nft`, `kubectl` and the workspace binaries.

mod common;

use common::{poll_until, Testbed, SERIAL};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::truth::{read_truth, unix_now, TruthEvent, TruthKind};

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const NS: &str = "np";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an asynchronous effect (a truth line, a first success) may take.
const EFFECT: Duration = Duration::from_secs(10);
/// Dial-loop spacing and the per-attempt budget (a dropped SYN is retransmitted only
/// after 1 s, so an attempt denied at its start fails within the budget).
const EVERY: Duration = Duration::from_millis(20);
const ATTEMPT: Duration = Duration::from_millis(300);
/// Agreement asked between a truth stamp and what a dial loop saw.
const TOLERANCE: f64 = 0.1;

/// The namespace and the policies the pods are created under: `isolate` (targets admit
/// sources' TCP 8080, by pod and namespace selector together, as the prober's
/// `fp-<id>-isolate`) and `deny` (dark pods admit nobody).
const POLICIES: &str = "apiVersion: v1
kind: Namespace
metadata: {name: np}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: np}
spec:
  podSelector: {matchLabels: {role: target}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: source}}
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: np}}
    ports: [{protocol: TCP, port: 8080}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: np}
spec:
  podSelector: {matchLabels: {role: dark}}
  policyTypes: [Ingress]
";

/// `allow`: dark pods admit `other` pods (every port).
const ALLOW: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow, namespace: np}
spec:
  podSelector: {matchLabels: {role: dark}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: other}}}]
";

fn pod(name: &str, role: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}, labels: {{role: {role}}}}}\n\
         spec:\n  nodeName: {node}\n  containers:\n  - name: main\n    image: target-server\n    args: [serve]\n    \
         readinessProbe: {{httpGet: {{path: /readyz, port: 8080}}, periodSeconds: 1}}\n"
    )
}

/// `kubectl apply` of `text`, retried while the namespace's ServiceAccount is not there
/// yet (the real control plane's ServiceAccount admission refuses pods until then).
fn apply(tb: &Testbed, name: &str, text: &str) {
    let path = tb.manifest(name, text);
    let out = poll_until(
        Duration::from_secs(30),
        || tb.exec(&["kubectl", "apply", "-f", &path]),
        |o| o.status.success(),
    );
    assert!(
        out.status.success(),
        "kubectl apply {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn field(tb: &Testbed, pod: &str, path: &str) -> String {
    tb.kubectl(&[
        "get",
        "pod",
        "-n",
        NS,
        pod,
        "-o",
        &format!("jsonpath={{{path}}}"),
    ])
    .trim()
    .to_owned()
}

/// A pod of the test as the test dials it.
struct Pod {
    uid: String,
    ip: Ipv4Addr,
    /// Its container process (its network namespace is `/proc/PID/ns/net`).
    pid: i32,
}

/// Waits until `name` is Ready and returns it.
fn ready(tb: &Testbed, name: &'static str) -> Pod {
    assert!(
        tb.wait_pod_ready(NS, name, READY_TIMEOUT),
        "pod {name} not Ready within {READY_TIMEOUT:?} (the kubelet probes it from its node)"
    );
    let pid = poll_until(
        READY_TIMEOUT,
        || tb.container_pid(NS, name),
        Option::is_some,
    )
    .unwrap_or_else(|| panic!("pod {name}: no container process"));
    Pod {
        uid: field(tb, name, ".metadata.uid"),
        ip: field(tb, name, ".status.podIP").parse().expect("pod IP"),
        pid,
    }
}

/// One `GET /` on a new TCP connection to `ip:port` from the calling thread's netns,
/// within [`ATTEMPT`]: whether it answered `HTTP/1.1 200`.
fn get_ok(ip: Ipv4Addr, port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&SocketAddr::from((ip, port)), ATTEMPT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(ATTEMPT));
    let _ = s.set_write_timeout(Some(ATTEMPT));
    if s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && &head == b"HTTP/1.1 200"
}

/// Enters the network namespace of process `pid` (the calling thread only).
fn enter(pid: i32) {
    let f = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("open pod netns");
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
}

/// One dial from inside `from` to `ip:port`.
fn dial(from: &Pod, ip: Ipv4Addr, port: u16) -> bool {
    let pid = from.pid;
    std::thread::spawn(move || {
        enter(pid);
        get_ok(ip, port)
    })
    .join()
    .expect("dial thread")
}

/// Dials until one succeeds (within [`EFFECT`]); whether one did.
fn reaches(from: &Pod, to: &Pod) -> bool {
    poll_until(EFFECT, || dial(from, to.ip, 8080), |ok| *ok)
}

/// Whether none of four dials from `from` to `ip:port`, started 100 ms apart, succeeds.
fn never_reaches(from: &Pod, ip: Ipv4Addr, port: u16) -> bool {
    let pid = from.pid;
    let dials: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                enter(pid);
                std::thread::sleep(Duration::from_millis(100 * i));
                get_ok(ip, port)
            })
        })
        .collect();
    dials.into_iter().all(|d| !d.join().expect("dial thread"))
}

/// A dial loop from inside `from` to `to:8080`: a new attempt every [`EVERY`], each on
/// its own thread (attempts overlap, as the prober's source does).
struct DialLoop {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(f64, bool)>>,
}

impl DialLoop {
    fn start(from: &Pod, to: Ipv4Addr) -> DialLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let (pid, stop2) = (from.pid, stop.clone());
        let thread = std::thread::spawn(move || {
            enter(pid); // attempt threads inherit the namespace
            let seen = Arc::new(Mutex::new(Vec::new()));
            let mut workers = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                let seen = seen.clone();
                workers.push(std::thread::spawn(move || {
                    let sent = unix_now();
                    let ok = get_ok(to, 8080);
                    seen.lock().unwrap().push((sent, ok));
                }));
                std::thread::sleep(EVERY);
            }
            for w in workers {
                let _ = w.join();
            }
            let mut v = std::mem::take(&mut *seen.lock().unwrap());
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            v
        });
        DialLoop { stop, thread }
    }

    /// Stops it; every attempt as (sent, succeeded), in sending order.
    fn stop(self) -> Vec<(f64, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("dial loop")
    }
}

/// The first success sent at or after `after`.
fn first_success(v: &[(f64, bool)], after: f64) -> Option<f64> {
    v.iter().find(|(t, ok)| *ok && *t >= after).map(|x| x.0)
}

/// When the path broke: the first failure after the successes, which must be one
/// unbroken run (`None` otherwise, or when nothing failed after them).
fn first_failure_after_success(v: &[(f64, bool)]) -> Option<f64> {
    let last_ok = v.iter().rposition(|(_, ok)| *ok)?;
    let first_ok = v.iter().position(|(_, ok)| *ok)?;
    v[first_ok..=last_ok]
        .iter()
        .all(|x| x.1)
        .then(|| v.get(last_ok + 1).map(|x| x.0))
        .flatten()
}

fn truth(tb: &Testbed) -> Vec<TruthEvent> {
    read_truth(&tb.state.join("truth.jsonl")).expect("truth log")
}

/// Polls the truth log (every 20 ms, at most [`EFFECT`]) for an event matching `want`.
fn wait_truth(tb: &Testbed, what: &str, want: impl Fn(&TruthEvent) -> bool) -> TruthEvent {
    let deadline = Instant::now() + EFFECT;
    loop {
        let log = truth(tb);
        if let Some(e) = log.iter().find(|e| want(e)) {
            return e.clone();
        }
        if Instant::now() > deadline {
            let policy: Vec<String> = log
                .iter()
                .filter(|e| {
                    matches!(
                        e.event,
                        TruthKind::PolicyProgrammed | TruthKind::PolicyRevoked
                    )
                })
                .map(|e| serde_json::to_string(e).unwrap_or_default())
                .collect();
            panic!(
                "no truth {what} within {EFFECT:?}; policy events:\n{}",
                policy.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `kind` for pod `pod` admitting (or no longer admitting) peer `peer_uid`.
fn peer_event(
    kind: TruthKind,
    pod: &str,
    peer_uid: &str,
    after: f64,
) -> impl Fn(&TruthEvent) -> bool {
    let (pod, peer_uid) = (pod.to_owned(), peer_uid.to_owned());
    move |e| {
        e.event == kind
            && e.pod.as_deref() == Some(pod.as_str())
            && e.uid.as_deref() == Some(peer_uid.as_str())
            && e.detail.get("isolated").is_none()
            && e.t >= after
    }
}

fn isolation_event(pod: &str) -> impl Fn(&TruthEvent) -> bool {
    let pod = pod.to_owned();
    move |e| {
        e.event == TruthKind::PolicyProgrammed
            && e.pod.as_deref() == Some(pod.as_str())
            && e.detail["isolated"] == true
    }
}

fn endpoint_programmed(tb: &Testbed, uid: &str) -> f64 {
    wait_truth(tb, "endpoint_programmed", |e| {
        e.event == TruthKind::EndpointProgrammed && e.uid.as_deref() == Some(uid)
    })
    .t
}

fn node_ip(tb: &Testbed, node: usize) -> Ipv4Addr {
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tb.state.join("plan.json")).unwrap())
            .unwrap();
    plan["nodes"][node]["ip"].as_str().unwrap().parse().unwrap()
}

#[test]
fn isolated_pods_admit_only_their_peers_and_allow_policies_admit_and_revoke_on_time() {
    let _g = serial();
    let started = Instant::now();
    let tb = Testbed::up("netpol", 2, "rules: []\n", &[]);
    apply(&tb, "policies.yaml", POLICIES);
    apply(
        &tb,
        "pods.yaml",
        &[
            pod("t", "target", "node-2"),
            pod("d", "dark", "node-2"),
            pod("x", "other", "node-1"),
        ]
        .join("---\n"),
    );
    // As the prober's `fp-<id>-egress`: created once the target has its IP, before the
    // source.
    let t_ip = poll_until(
        READY_TIMEOUT,
        || field(&tb, "t", ".status.podIP"),
        |ip| !ip.is_empty(),
    );
    apply(
        &tb,
        "egress.yaml",
        &format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: egress, namespace: {NS}}}\n\
             spec:\n  podSelector: {{matchLabels: {{role: source}}}}\n  policyTypes: [Egress]\n  egress:\n  \
             - to: [{{ipBlock: {{cidr: {t_ip}/32}}}}]\n    ports: [{{protocol: TCP, port: 8080}}]\n"
        ),
    );
    apply(&tb, "source.yaml", &pod("s", "source", "node-1"));
    // Every pod turns Ready: the kubelet's probes come from the pod's own node, which
    // policy never blocks.
    let (t, d, x, s) = (
        ready(&tb, "t"),
        ready(&tb, "d"),
        ready(&tb, "x"),
        ready(&tb, "s"),
    );

    // The admitted source reaches the target; nobody else does.
    assert!(
        reaches(&s, &t),
        "s → t (admitted by isolate and by s's egress)"
    );
    assert!(never_reaches(&x, t.ip, 8080), "x → t got through isolate");
    assert!(never_reaches(&x, d.ip, 8080), "x → d got through deny");
    assert!(
        never_reaches(&s, x.ip, 8080),
        "s → x got through s's egress isolation"
    );
    assert!(
        never_reaches(&s, t.ip, 9091),
        "s → t:9091: only 8080 is admitted"
    );
    // A pod's traffic with its own node always flows (Felix's metrics port on the node);
    // another node is a peer like any other.
    assert!(dial(&s, node_ip(&tb, 0), 9091), "s → its own node");
    assert!(dial(&t, node_ip(&tb, 1), 9091), "t → its own node");
    assert!(
        never_reaches(&s, node_ip(&tb, 1), 9091),
        "s → node-2 under egress isolation"
    );
    // Not isolated for egress: t dials x (and x's replies flow).
    assert!(reaches(&t, &x), "t → x");

    // Truth: the new target's deny went in with its endpoint, the source's admissions
    // name the peers, with the policy, direction and ports.
    let iso = wait_truth(&tb, "t isolated", isolation_event("t"));
    let t_prog = endpoint_programmed(&tb, &t.uid);
    assert!(
        (iso.t - t_prog).abs() < 0.005 && iso.detail["lag_seconds"] == 0.0,
        "t's isolation {iso:?} not with its endpoint ({t_prog})"
    );
    assert_eq!(iso.uid.as_deref(), Some(t.uid.as_str()));
    assert_eq!(
        (
            iso.detail["policy"].as_str(),
            iso.detail["direction"].as_str()
        ),
        (Some("np/isolate"), Some("ingress"))
    );
    let ing = wait_truth(
        &tb,
        "t admits s",
        peer_event(TruthKind::PolicyProgrammed, "t", &s.uid, 0.0),
    );
    assert_eq!(ing.node.as_deref(), Some("node-2"));
    assert_eq!(ing.ip.as_deref(), Some(s.ip.to_string().as_str()));
    assert_eq!(
        ing.detail["peer"],
        serde_json::json!({"kind": "pod", "namespace": NS, "pod": "s"})
    );
    assert_eq!(ing.detail["ports"], serde_json::json!(["8080/tcp"]));
    let eg = wait_truth(
        &tb,
        "s admits t",
        peer_event(TruthKind::PolicyProgrammed, "s", &t.uid, 0.0),
    );
    assert_eq!(
        (
            eg.node.as_deref(),
            eg.detail["direction"].as_str(),
            eg.detail["policy"].as_str()
        ),
        (Some("node-1"), Some("egress"), Some("np/egress")),
        "{eg:?}"
    );
    let s_prog = endpoint_programmed(&tb, &s.uid);
    assert!(
        (eg.t - s_prog).abs() < 0.005,
        "s's egress admission {eg:?} not with its endpoint ({s_prog})"
    );
    let log = truth(&tb);
    assert!(
        !log.iter()
            .any(|e| e.event == TruthKind::PolicyProgrammed
                && e.uid.as_deref() == Some(x.uid.as_str())),
        "x was never admitted anywhere"
    );

    // An allow policy admits x to d, and its deletion revokes it, when the truth says.
    let dl = DialLoop::start(&x, d.ip);
    std::thread::sleep(Duration::from_millis(200));
    let before = unix_now();
    apply(&tb, "allow.yaml", ALLOW);
    let admitted = wait_truth(
        &tb,
        "d admits x",
        peer_event(TruthKind::PolicyProgrammed, "d", &x.uid, before),
    );
    // Let the loop see half a second of successes.
    std::thread::sleep(Duration::from_secs_f64(
        (admitted.t + 0.5 - unix_now()).max(0.0),
    ));
    let before_delete = unix_now();
    tb.kubectl(&["delete", "networkpolicy", "-n", NS, "allow"]);
    let revoked = wait_truth(
        &tb,
        "d revokes x",
        peer_event(TruthKind::PolicyRevoked, "d", &x.uid, before_delete),
    );
    std::thread::sleep(Duration::from_millis(400));
    let seen = dl.stop();
    let ok = first_success(&seen, before).expect("the dial loop never got through after allow");
    assert!(
        (ok - admitted.t).abs() <= TOLERANCE,
        "first success {:.3} s vs policy_programmed (delay {})",
        ok - admitted.t,
        admitted.detail["delay_seconds"]
    );
    assert!(
        seen.iter()
            .all(|(t, ok)| !ok || *t >= admitted.t - TOLERANCE),
        "a success before the admission"
    );
    let broke =
        first_failure_after_success(&seen).expect("the dial loop never failed after delete");
    assert!(
        (broke - revoked.t).abs() <= TOLERANCE,
        "first failure {:.3} s vs policy_revoked",
        broke - revoked.t
    );
    assert_eq!(revoked.detail["policy"], "np/allow");
    eprintln!(
        "admitted {:.3} s after the create, revoked {:.3} s after the delete; test took {:.1} s",
        admitted.t - before,
        revoked.t - before_delete,
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn policy_faults_delay_skip_and_lag_the_rules() {
    let _g = serial();
    let started = Instant::now();
    let tb = Testbed::up("netpol-faults", 2, "rules: []\n", &[]);
    apply(&tb, "policies.yaml", POLICIES);
    apply(
        &tb,
        "pods.yaml",
        &[pod("d", "dark", "node-2"), pod("x", "other", "node-1")].join("---\n"),
    );
    let (d, x) = (ready(&tb, "d"), ready(&tb, "x"));
    assert!(never_reaches(&x, d.ip, 8080), "x → d got through deny");

    // policy_delay: the admission lands 2 s after the agent learned it.
    tb.set_fault("rules:\n- nodes: {names: [node-2]}\n  policy_delay: 2s\n");
    let dl = DialLoop::start(&x, d.ip);
    let before = unix_now();
    apply(&tb, "allow.yaml", ALLOW);
    let created = unix_now();
    let admitted = wait_truth(
        &tb,
        "delayed admission",
        peer_event(TruthKind::PolicyProgrammed, "d", &x.uid, before),
    );
    let seen_t = admitted.detail["seen_t"].as_f64().unwrap();
    assert_eq!(admitted.detail["delay_seconds"], 2.0);
    assert!(
        (admitted.t - seen_t - 2.0).abs() < TOLERANCE && (before..created + 0.2).contains(&seen_t),
        "programmed {:.3} s after being learned ({:.3} s after the create)",
        admitted.t - seen_t,
        admitted.t - before
    );
    std::thread::sleep(Duration::from_millis(300));
    let seen = dl.stop();
    let ok = first_success(&seen, before).expect("never got through with policy_delay");
    assert!(
        (ok - admitted.t).abs() <= TOLERANCE,
        "first success {:.3} s vs truth",
        ok - admitted.t
    );

    // The revocation waits 2 s too; a new file re-plans it at once. Then policy_never
    // keeps a new admission out for good, until the fault is lifted.
    let before_delete = unix_now();
    tb.kubectl(&["delete", "networkpolicy", "-n", NS, "allow"]);
    tb.set_fault("rules:\n- nodes: {names: [node-2]}\n  policy_never: 1\n");
    let revoked = wait_truth(
        &tb,
        "revocation",
        peer_event(TruthKind::PolicyRevoked, "d", &x.uid, before_delete),
    );
    assert!(
        revoked.t - before_delete < 1.5,
        "revoked {:.3} s after the delete: the new file did not re-plan it",
        revoked.t - before_delete
    );
    let before = unix_now();
    apply(&tb, "allow.yaml", ALLOW);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        never_reaches(&x, d.ip, 8080),
        "x → d got through under policy_never: 1"
    );
    assert!(
        !truth(&tb)
            .iter()
            .any(peer_event(TruthKind::PolicyProgrammed, "d", &x.uid, before)),
        "policy_programmed under policy_never: 1"
    );
    tb.set_fault("rules: []\n");
    let lifted = unix_now();
    let admitted = wait_truth(
        &tb,
        "admission once lifted",
        peer_event(TruthKind::PolicyProgrammed, "d", &x.uid, before),
    );
    assert!(
        admitted.t - lifted < 1.0,
        "admitted {:.3} s after the fault was lifted",
        admitted.t - lifted
    );
    assert!(reaches(&x, &d), "x → d once policy_never is lifted");
    tb.kubectl(&["delete", "networkpolicy", "-n", NS, "allow"]);

    // isolation_lag: a new pod `deny` isolates is reachable for 3 s after its endpoint.
    tb.set_fault("rules:\n- nodes: {names: [node-2]}\n  isolation_lag: 3s\n");
    apply(&tb, "late.yaml", &pod("late", "dark", "node-2"));
    let ip: Ipv4Addr = poll_until(
        READY_TIMEOUT,
        || field(&tb, "late", ".status.podIP"),
        |ip| !ip.is_empty(),
    )
    .parse()
    .expect("late's IP");
    let dl = DialLoop::start(&x, ip);
    let late = ready(&tb, "late");
    let iso = wait_truth(&tb, "late isolated", isolation_event("late"));
    std::thread::sleep(Duration::from_millis(400));
    let seen = dl.stop();
    let programmed = endpoint_programmed(&tb, &late.uid);
    assert_eq!(iso.detail["lag_seconds"], 3.0, "{iso:?}");
    assert!(
        (iso.t - programmed - 3.0).abs() < TOLERANCE,
        "deny {:.3} s after the endpoint",
        iso.t - programmed
    );
    let first = first_success(&seen, 0.0).expect("late was never reachable during its lag");
    assert!(
        first < programmed + 1.0,
        "first success {:.3} s after the endpoint",
        first - programmed
    );
    let broke = first_failure_after_success(&seen).expect("late never became isolated");
    assert!(
        (broke - iso.t).abs() <= TOLERANCE,
        "first failure {:.3} s vs the deny",
        broke - iso.t
    );
    eprintln!("test took {:.1} s", started.elapsed().as_secs_f64());
}
