//! `testbed demo`: the problem firstpacket exists for, shown on this machine in under a
//! minute (issue 31 point 8).
//!
//! Without `--fault`, two acts on one 4-node testbed (`node-2` and `node-3` labelled
//! `os=debian13`): a `prober gate` on the healthy cluster (S1), then the same gate
//! while the debian13 nodes' dataplane is stuck in an apply loop (S2, the XDP incident,
//! docs/scenarios.md). Beside both gates, long-lived pods — one per node, up since
//! before the fault — `GET /` each other every second, as a Goldpinger-style mesh does.
//! The demo ends with both side by side: the mesh stays green through S2 (endpoints that
//! already exist keep their programming) while every new pod on node-2 and node-3 is
//! dark, which the gate catches and blames on those nodes' agents. Exit 0 when the
//! healthy gate passed and the S2 gate failed, as expected; 1 otherwise.
//!
//! With `--fault FILE|SCENARIO`, one gate on that fault (a file, or a scenario shipped
//! in the binary: `s1`…`s9`, or a name like `s2-apply-loop`); the gate's exit code.
//!
//! The testbed is torn down in every case; the reports are copied next to the caller
//! first and only the copies are named.

use crate::cli::{down, exec_child, fault_set_quiet, ready_info, up_with, UpArgs};
use anyhow::{anyhow, bail, Context, Result};
use firstpacket_report::{GateReport, Verdict};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The scenario fault files (testbed/faults), shipped in the binary so the demo needs no
/// checkout: (file stem, text).
pub const SCENARIOS: &[(&str, &str)] = &[
    ("s1-healthy", include_str!("../faults/s1-healthy.yaml")),
    (
        "s2-apply-loop",
        include_str!("../faults/s2-apply-loop.yaml"),
    ),
    (
        "s2-apply-loop-ungated",
        include_str!("../faults/s2-apply-loop-ungated.yaml"),
    ),
    (
        "s2-real-felix",
        include_str!("../faults/s2-real-felix.yaml"),
    ),
    (
        "s3-name-reuse",
        include_str!("../faults/s3-name-reuse.yaml"),
    ),
    (
        "s4-cross-node",
        include_str!("../faults/s4-cross-node.yaml"),
    ),
    ("s5-slower-os", include_str!("../faults/s5-slower-os.yaml")),
    (
        "s6-pair-broken",
        include_str!("../faults/s6-pair-broken.yaml"),
    ),
    (
        "s7-stale-routes",
        include_str!("../faults/s7-stale-routes.yaml"),
    ),
    (
        "s8-first-connections",
        include_str!("../faults/s8-first-connections.yaml"),
    ),
    ("s9-churn", include_str!("../faults/s9-churn.yaml")),
];

/// `testbed demo` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Number of nodes (the two-act demo needs at least 3: node-2 and node-3 are the
    /// apply-loop nodes).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// One gate on this fault instead of the two acts: a fault file, or a scenario
    /// shipped with the testbed (`s1`…`s9`, or e.g. `s2-apply-loop`; docs/scenarios.md).
    #[arg(long, value_name = "FILE|SCENARIO")]
    pub fault: Option<String>,
    /// Where to copy the gate report (JSON); the two-act demo writes `-healthy` and
    /// `-apply-loop` before the extension.
    #[arg(long, default_value = "firstpacket-report.json")]
    pub report: PathBuf,
    /// Extra arguments passed to every `prober gate`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub gate_args: Vec<String>,
}

/// A scenario's text by name: the file stem (`s2-apply-loop`, with or without
/// `.yaml`) or its number (`s2`: the first file of that number). `None` when unknown.
pub fn scenario(name: &str) -> Option<&'static str> {
    let name = name.trim_end_matches(".yaml");
    SCENARIOS
        .iter()
        .find(|(stem, _)| *stem == name)
        .or_else(|| {
            SCENARIOS
                .iter()
                .find(|(stem, _)| stem.split('-').next() == Some(name))
        })
        .map(|(_, text)| *text)
}

/// The fault for `--fault`: an existing file (its text and path, so errors name it), else
/// a scenario (its text). Errors name both choices.
fn resolve_fault(arg: &str) -> Result<(String, Option<PathBuf>)> {
    let p = Path::new(arg);
    if p.is_file() {
        let text = std::fs::read_to_string(p).with_context(|| format!("read {arg}"))?;
        return Ok((text, Some(p.to_path_buf())));
    }
    scenario(arg).map(|t| (t.to_owned(), None)).ok_or_else(|| {
        anyhow!(
            "--fault {arg}: no such file, and not a scenario (one of {}, or s1…s9)",
            SCENARIOS
                .iter()
                .map(|(s, _)| *s)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The node labels a scenario's header asks for: the `--node-labels` value of its
/// `# testbed up …` comment line (S2's `node-2=os=debian13,node-3=os=debian13`: its
/// rules select nodes by label, so without them they select none). `None` without one.
pub fn header_labels(text: &str) -> Option<String> {
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .filter(|l| l.contains("testbed up"))
        .find_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "--node-labels")?;
            words.next().map(str::to_owned)
        })
}

/// `firstpacket-report.json` + `healthy` → `firstpacket-report-healthy.json`.
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "firstpacket-report".into());
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}-{suffix}{ext}"))
}

/// Runs the demo (module docs); returns the process exit code. The testbed goes down
/// whatever happened.
pub fn demo(state: &Path, args: &DemoArgs) -> Result<i32> {
    std::fs::create_dir_all(state)?;
    let single = args.fault.as_deref().map(resolve_fault).transpose()?;
    if single.is_none() && args.nodes < 3 {
        bail!("--nodes {}: the two-act demo needs at least 3 (node-2 and node-3 are the apply-loop nodes)", args.nodes);
    }
    // The two acts start healthy; node-2/node-3 carry S2's label from the start.
    let (text, user_file) = single
        .clone()
        .unwrap_or_else(|| (scenario("s1-healthy").unwrap_or_default().to_owned(), None));
    let labels = match &single {
        None => Some("node-2=os=debian13,node-3=os=debian13".to_string()),
        Some(_) => header_labels(&text),
    };
    if let Some(l) = &labels {
        let named = crate::cli::parse_node_labels(std::slice::from_ref(l))?;
        if let Some(n) = named.keys().find(|n| {
            n.strip_prefix("node-")
                .and_then(|i| i.parse::<usize>().ok())
                .is_none_or(|i| i > args.nodes)
        }) {
            bail!(
                "--nodes {}: the fault's rules select nodes by the labels {l}, which name {n}; \
                 give --nodes {} or more",
                args.nodes,
                n.trim_start_matches("node-")
            );
        }
    }
    let fault = match user_file {
        Some(f) => f,
        None => {
            let f = state.join("demo-fault.yaml");
            std::fs::write(&f, &text)?;
            f
        }
    };
    if let (Some(name), Some(l)) = (&args.fault, &labels) {
        eprintln!("testbed: {name}: node labels {l} (its rules select nodes by them)");
    }
    let up_args = UpArgs {
        nodes: args.nodes,
        fault: Some(fault),
        node_labels: labels.into_iter().collect(),
        hostname_label_suffix: None,
        bin_dir: None,
        image_dir: None,
        kube_proxy_metrics: Default::default(),
        timeout: None,
        control_plane: Default::default(),
        control_plane_bin: None,
        hollow_nodes: 0,
        hollow_ttfp: crate::hollow::DEFAULT_TTFP,
        hollow_direct_scrapes: Default::default(),
        agent: Default::default(),
        kube_proxy: Default::default(),
        kubelet: Default::default(),
        ip_families: vec![crate::plan::IpFamily::Ipv4],
    };
    up_with(state, &up_args, false)?;
    let result = match single {
        Some(_) => gate(state, args, &args.report, &[]).map(|(code, _)| code),
        None => two_acts(state, args),
    };
    let down_result = down(state);
    for f in ["demo-fault.yaml", "demo-s2.yaml"] {
        let _ = std::fs::remove_file(state.join(f));
    }
    let code = result?;
    down_result?;
    Ok(code)
}

/// One `prober gate` writing its report straight to `report` (made absolute: the gate
/// runs in the testbed's host network namespace, same file system); its exit code and
/// the parsed report (`None` when it wrote none).
fn gate(
    state: &Path,
    args: &DemoArgs,
    report: &Path,
    extra: &[&str],
) -> Result<(i32, Option<GateReport>)> {
    let abs = std::env::current_dir()?.join(report);
    let _ = std::fs::remove_file(&abs);
    let mut cmd: Vec<String> = vec!["prober".into(), "gate".into()];
    cmd.extend(extra.iter().map(|s| s.to_string()));
    cmd.extend(args.gate_args.iter().cloned());
    cmd.extend(["--report".into(), abs.display().to_string()]);
    eprintln!("testbed: running {}", cmd.join(" "));
    let code = exec_child(state, &cmd)?;
    // The gate names the report itself ("report written to …").
    let parsed = std::fs::read_to_string(&abs)
        .ok()
        .and_then(|t| serde_json::from_str::<GateReport>(&t).ok());
    Ok((code, parsed))
}

/// The gate flags of both acts: per-node rows by `os`, a 15 s give-up (S2's apply loop
/// holds new endpoints 15–42 s, so every probe touching node-2/node-3 fails within it)
/// and a 1 s hold, which keep each act under ~25 s.
const ACT_ARGS: &[&str] = &["--group-by-label", "os", "--give-up", "15s", "--hold", "1s"];

fn two_acts(state: &Path, args: &DemoArgs) -> Result<i32> {
    let info = ready_info(state)?;
    let mesh = Mesh::start(state, &info.kubeconfig, &info.nodes)?;
    eprintln!("\n=== act 1: a healthy cluster (S1) ===");
    mesh.reset();
    let (code1, rep1) = gate(state, args, &suffixed(&args.report, "healthy"), ACT_ARGS)?;
    let mesh1 = mesh.counts();
    eprintln!(
        "\n=== act 2: node-2 and node-3 stuck in a dataplane apply loop (S2, the XDP incident) ==="
    );
    let s2 = state.join("demo-s2.yaml");
    std::fs::write(&s2, scenario("s2-apply-loop").unwrap_or_default())?;
    fault_set_quiet(state, &s2)?;
    eprintln!(
        "testbed: S2 applied: new endpoints on node-2 and node-3 wait 15–42 s behind an apply loop"
    );
    mesh.reset();
    let (code2, rep2) = gate(state, args, &suffixed(&args.report, "apply-loop"), ACT_ARGS)?;
    let mesh2 = mesh.counts();
    mesh.stop();
    println!();
    println!(
        "{}",
        side_by_side(&[(code1, rep1.as_ref(), mesh1), (code2, rep2.as_ref(), mesh2)])
    );
    let slow = BTreeSet::from(["node-2".to_string(), "node-3".to_string()]);
    let named = rep2.as_ref().map(apply_slow_nodes).unwrap_or_default();
    let ok = code1 == 0 && code2 == 1 && !named.is_empty() && named.is_subset(&slow);
    if ok {
        println!(
            "What firstpacket saw that a long-lived mesh would not: the mesh's pods, up since \
             before the apply loop, kept answering ({} of {} checks failed during act 2), \
             because endpoints that already exist stay programmed; every new pod on {} waited \
             for its node's dataplane and the gate failed, naming those nodes' agents \
             (dataplane_apply_slow). Existing pods look fine while new ones are dark — the \
             state after a CNI upgrade that a mesh of old pods reports as healthy.",
            mesh2.1,
            mesh2.0,
            named.iter().cloned().collect::<Vec<_>>().join(" and ")
        );
        Ok(0)
    } else {
        println!(
            "demo: not as expected — wanted the healthy gate to pass (exit {code1}) and the \
             apply-loop gate to fail (exit {code2}) naming node-2/node-3 with \
             dataplane_apply_slow (named: {named:?})"
        );
        Ok(1)
    }
}

/// Nodes named by a `dataplane_apply_slow` suspect on a slow/failed probe.
fn apply_slow_nodes(r: &GateReport) -> BTreeSet<String> {
    r.probes
        .iter()
        .flat_map(|p| &p.suspects)
        .filter(|s| s.signal.as_str() == "dataplane_apply_slow")
        .map(|s| s.node.clone())
        .collect()
}

/// Row labels of [`side_by_side`].
const ROWS: [&str; 6] = [
    "firstpacket gate",
    "new-pod probes",
    "TTFP p95",
    "programming wait p95",
    "suspects",
    "long-lived mesh",
];

/// One act's column of [`side_by_side`], in [`ROWS`] order.
fn act_cells(code: i32, rep: Option<&GateReport>, (checks, failed): (u64, u64)) -> Vec<String> {
    let secs = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}s"));
    let mesh = format!("{checks} checks, {failed} failed");
    let Some(r) = rep else {
        let mut out = vec![format!("(no report, exit {code})")];
        out.extend(std::iter::repeat_n("-".to_string(), ROWS.len() - 2));
        out.push(mesh);
        return out;
    };
    let verdict = match r.verdict {
        Verdict::Pass => "PASS",
        Verdict::Fail => "FAIL",
        Verdict::Inconclusive => "INCONCLUSIVE",
    };
    let bad = r
        .probes
        .iter()
        .filter(|p| p.result.as_str() != "success")
        .count();
    let suspects: BTreeSet<String> = r
        .probes
        .iter()
        .flat_map(|p| &p.suspects)
        .map(|s| format!("{} {}", s.node, s.signal.as_str()))
        .collect();
    vec![
        format!("{verdict} (exit {code})"),
        format!("{} probes, {bad} not success", r.probes.len()),
        secs(r.summary.ttfp_p95),
        secs(r.summary.programming_wait_p95),
        if suspects.is_empty() {
            "none".into()
        } else {
            suspects.into_iter().collect::<Vec<_>>().join(", ")
        },
        mesh,
    ]
}

/// The two acts in columns: verdict, probe counts, TTFP and programming-wait p95,
/// suspects, and the mesh's checks.
fn side_by_side(acts: &[(i32, Option<&GateReport>, (u64, u64))]) -> String {
    let cols: Vec<Vec<String>> = acts
        .iter()
        .map(|(code, rep, mesh)| act_cells(*code, *rep, *mesh))
        .collect();
    let mut out = format!(
        "{:<22}  {:<42}  {}\n",
        "", "healthy (S1)", "apply loop on node-2, node-3 (S2)"
    );
    for (i, label) in ROWS.iter().enumerate() {
        out.push_str(&format!(
            "{label:<22}  {:<42}  {}\n",
            cols[0][i], cols[1][i]
        ));
    }
    out
}

/// Long-lived pods, one per node, checking each other every second from their own
/// network namespaces (the testbed's own: this process enters them by the pod's PID).
struct Mesh {
    stop: Arc<AtomicBool>,
    checks: Arc<std::sync::atomic::AtomicU64>,
    failed: Arc<std::sync::atomic::AtomicU64>,
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// Namespace of the mesh's pods.
const MESH_NS: &str = "demo-mesh";
/// Port target-server serves on in the mesh's pods.
const MESH_PORT: u16 = 8080;

impl Mesh {
    /// Creates the pods through the API (`kubeconfig`: the testbed's, for this
    /// machine), waits until they are Ready (60 s), then starts one checking thread per
    /// pod. Errors: the API refused, a pod not Ready in time, no PID for a pod.
    fn start(state: &Path, kubeconfig: &Path, nodes: &[String]) -> Result<Mesh> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let pods = rt.block_on(create_pods(kubeconfig, nodes))?;
        let mut members = Vec::new();
        for (uid, ip) in pods {
            let pid: i32 = std::fs::read_to_string(state.join("pods").join(&uid).join("pid"))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| anyhow!("no PID for the mesh pod {uid}"))?;
            members.push((pid, ip));
        }
        let mesh = Mesh {
            stop: Arc::new(AtomicBool::new(false)),
            checks: Arc::default(),
            failed: Arc::default(),
            threads: Default::default(),
        };
        for (pid, ip) in &members {
            let peers: Vec<String> = members
                .iter()
                .filter(|(_, p)| p != ip)
                .map(|(_, p)| p.clone())
                .collect();
            let (pid, stop) = (*pid, mesh.stop.clone());
            let (checks, failed) = (mesh.checks.clone(), mesh.failed.clone());
            let t = std::thread::spawn(move || {
                let Ok(ns) = std::fs::File::open(format!("/proc/{pid}/ns/net")) else {
                    return;
                };
                if nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).is_err() {
                    return;
                }
                while !stop.load(Ordering::Relaxed) {
                    for ip in &peers {
                        checks.fetch_add(1, Ordering::Relaxed);
                        if !http_ok(ip, MESH_PORT, Duration::from_secs(1)) {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let next = Instant::now() + Duration::from_secs(1);
                    while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            });
            mesh.threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(t);
        }
        Ok(mesh)
    }

    fn reset(&self) {
        self.checks.store(0, Ordering::Relaxed);
        self.failed.store(0, Ordering::Relaxed);
    }

    /// (checks, failed checks) since the last [`Mesh::reset`].
    fn counts(&self) -> (u64, u64) {
        (
            self.checks.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = t.join();
        }
    }
}

/// Creates the namespace and one `target-server serve` pod per node; waits until each
/// is Ready; returns (uid, pod IP) per pod.
async fn create_pods(kubeconfig: &Path, nodes: &[String]) -> Result<Vec<(String, String)>> {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::{Api, PostParams};
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let client = kube::Client::try_from(cfg)?;
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MESH_NS}
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("create the mesh's namespace")?;
    let pods: Api<Pod> = Api::namespaced(client, MESH_NS);
    for n in nodes {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("mesh-{n}"), "labels": {"app": "demo-mesh"}},
            "spec": {
                "nodeName": n,
                "containers": [{
                    "name": "c", "image": "target-server",
                    "args": ["serve", "--port", MESH_PORT.to_string()],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": MESH_PORT}, "periodSeconds": 1}
                }]
            }
        }))?;
        pods.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("create the mesh pod on {n}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    for n in nodes {
        let name = format!("mesh-{n}");
        loop {
            let p = pods.get(&name).await?;
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
            if let (true, Some(ip), Some(uid)) = (ready, ip, p.metadata.uid.clone()) {
                out.push((uid, ip));
                break;
            }
            if Instant::now() > deadline {
                bail!("the mesh pod {name} was not Ready within 60s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(out)
}

/// `GET /` to `ip:port` from the calling thread's network namespace, connect and answer
/// together within `timeout`; whether an HTTP `200` came back. Blocking (the mesh's
/// threads and the benchmark's clients each sit in a pod's netns).
pub fn http_ok(ip: &str, port: u16, timeout: Duration) -> bool {
    let Ok(addr) = format!("{ip}:{port}").parse::<SocketAddr>() else {
        return false;
    };
    let deadline = Instant::now() + timeout;
    let Ok(mut s) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let _ = s.set_read_timeout(Some(left));
    let _ = s.set_write_timeout(Some(left));
    if s.write_all(b"GET / HTTP/1.0\r\nHost: testbed\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 16];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    buf[..n].starts_with(b"HTTP/1.1 200") || buf[..n].starts_with(b"HTTP/1.0 200")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_resolve_by_stem_and_number_and_parse() {
        assert!(scenario("s2").unwrap().contains("apply loop"));
        assert_eq!(scenario("s2-apply-loop.yaml"), scenario("s2"));
        assert!(scenario("s2-apply-loop-ungated")
            .unwrap()
            .contains("gates_readiness"));
        assert!(scenario("s10").is_none() && scenario("").is_none());
        for (stem, text) in SCENARIOS {
            crate::fault::FaultFile::parse(text).unwrap_or_else(|e| panic!("{stem}: {e}"));
        }
        assert_eq!(
            header_labels(scenario("s2").unwrap()).as_deref(),
            Some("node-2=os=debian13,node-3=os=debian13")
        );
        assert_eq!(
            header_labels(scenario("s5").unwrap()).as_deref(),
            Some("node-1=os=ubuntu2004,node-4=os=ubuntu2004")
        );
        assert_eq!(header_labels(scenario("s4").unwrap()), None);
        // Every scenario whose rules select by label says which labels in its header.
        for (stem, text) in SCENARIOS {
            if text.contains("labels: {") {
                assert!(
                    header_labels(text).is_some(),
                    "{stem}: no --node-labels in its header"
                );
            }
        }
        let e = resolve_fault("no-such").unwrap_err().to_string();
        assert!(
            e.contains("s2-apply-loop") && e.contains("no such file"),
            "{e}"
        );
    }

    #[test]
    fn every_scenario_file_is_shipped() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("faults");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                n.ends_with(".yaml")
                    && n.starts_with('s')
                    && n[1..].starts_with(|c: char| c.is_ascii_digit())
            })
            .map(|n| n.trim_end_matches(".yaml").to_owned())
            .collect();
        files.sort();
        let mut shipped: Vec<String> = SCENARIOS.iter().map(|(s, _)| s.to_string()).collect();
        shipped.sort();
        assert_eq!(files, shipped);
    }

    #[test]
    fn the_table_has_every_row_also_without_a_report() {
        let t = side_by_side(&[(0, None, (3, 0)), (2, None, (5, 1))]);
        assert_eq!(t.lines().count(), 1 + ROWS.len(), "{t}");
        let mesh = t
            .lines()
            .find(|l| l.starts_with("long-lived mesh"))
            .unwrap();
        assert!(mesh.contains("3 checks, 0 failed") && mesh.contains("5 checks, 1 failed"));
        assert!(t.contains("(no report, exit 2)"), "{t}");
    }

    #[test]
    fn reports_get_the_act_before_the_extension() {
        assert_eq!(
            suffixed(Path::new("out/r.json"), "healthy"),
            PathBuf::from("out/r-healthy.json")
        );
        assert_eq!(suffixed(Path::new("r"), "x"), PathBuf::from("r-x"));
    }
}
