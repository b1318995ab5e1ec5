//! Shared harness of the testbed end-to-end tests (`e2e*.rs`): a testbed per test in
//! its own state dir, torn down by a drop guard; `SERIAL` runs the tests of one binary
//! one at a time (docs/design.md §5 "Isolation"). A check of an asynchronous effect (a truth
//! event, pods gone, an agent pod up, a metric after an action) polls with a deadline
//! ([`poll_until`], [`Testbed::truth_until`], [`Testbed::wait_no_probe_pods`]) and
//! then asserts on what it last saw.
#![allow(dead_code)]

pub mod monitoring;
pub mod paths;
pub mod policy;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use testbed::truth::TruthEvent;

pub static SERIAL: Mutex<()> = Mutex::new(());

/// Whether the long tests run (`FIRSTPACKET_LONG_TESTS=1`: soaks, many-node runs,
/// repeated gates); the default run has small versions of them.
pub fn long_tests() -> bool {
    std::env::var("FIRSTPACKET_LONG_TESTS").is_ok_and(|v| v.trim() == "1")
}

/// A scenario's fault file (`testbed/faults/NAME`, docs/scenarios.md), as text; panics
/// naming the file when it cannot be read.
pub fn fault_file(name: &str) -> String {
    let path = repo_file("testbed/faults").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A file of the repository (the workspace root is this crate's parent directory), e.g.
/// `repo_file("manifests/base/rbac.yaml")`.
pub fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

pub fn bin(name: &str) -> PathBuf {
    let tb = PathBuf::from(env!("CARGO_BIN_EXE_testbed"));
    let p = tb.parent().unwrap().join(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

/// A `--bin-dir` for `testbed up` at `$TMPDIR/fp-bin-NAME-PID`: symlinks to the
/// workspace's image binaries (`prober`, `target-server`) plus `extra` (file name → host
/// executable), so a pod whose image is one of those names runs it. Removed when dropped,
/// also when the test panics; declare it before the [`Testbed`] that uses it.
pub struct BinDir(PathBuf);

impl BinDir {
    pub fn new(name: &str, extra: &[(&str, PathBuf)]) -> BinDir {
        let dir = std::env::temp_dir().join(format!("fp-bin-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("bin dir");
        let own = [
            ("prober", bin("prober")),
            ("target-server", bin("target-server")),
        ];
        for (file, target) in own.iter().chain(extra) {
            std::os::unix::fs::symlink(target, dir.join(file)).expect("symlink");
        }
        BinDir(dir)
    }

    /// The directory as a `--bin-dir` argument.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("temp dir path is UTF-8")
    }
}

impl Drop for BinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The image directory `bash scripts/image.sh` writes (`target/images`, beside the
/// bin dir of the binaries under test), after checking it holds both images: panics
/// naming the command to run when not.
pub fn built_image_dir() -> PathBuf {
    let bin_dir = bin("testbed").parent().unwrap().to_path_buf();
    let dir = testbed::cli::default_image_dir(&bin_dir);
    for name in ["target-server", "prober"] {
        assert!(
            dir.join(name).join("index.json").is_file()
                && dir.join(format!("{name}.digest")).is_file(),
            "no {name} image in {}: build the images first (`bash scripts/image.sh`)",
            dir.display()
        );
    }
    dir
}

/// The manifest digest (`sha256:…`) of image `name` in `dir`, as `scripts/image.sh`
/// recorded it.
pub fn built_image_digest(dir: &std::path::Path, name: &str) -> String {
    let p = dir.join(format!("{name}.digest"));
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .trim()
        .to_owned()
}

pub struct Testbed {
    pub state: PathBuf,
}

/// Whether the tests run on the real control plane: `FIRSTPACKET_CONTROL_PLANE=real`
/// (which `testbed up` reads too, so every [`Testbed::up`] then starts etcd,
/// kube-apiserver, kube-controller-manager and kube-scheduler).
pub fn on_real_control_plane() -> bool {
    std::env::var("FIRSTPACKET_CONTROL_PLANE").is_ok_and(|v| v.trim() == "real")
}

/// How long after `testbed node stop` a node (and its pods) may take to turn NotReady:
/// at once on the built-in control plane (10 s of slack); on the real one the
/// node-lifecycle controller acts once its grace (20 s) has passed since the last
/// Lease renewal (every 10 s), checking every 2 s.
pub fn node_not_ready_within() -> Duration {
    if on_real_control_plane() {
        Duration::from_secs(20 + 2 + 10)
    } else {
        Duration::from_secs(10)
    }
}

/// On the real control plane: prints why the test is skipped there (`reason` names
/// the issue that will fix it) and returns true; on the built-in one returns false.
pub fn skip_on_real(reason: &str) -> bool {
    if on_real_control_plane() {
        eprintln!("SKIPPED on the real control plane: {reason}");
        return true;
    }
    false
}

impl Testbed {
    /// [`Testbed::up`] with `--control-plane real` (the `extra` flags after it), or
    /// `None` after printing why not: not root, or the control plane's binaries are not
    /// built (`bash scripts/control-plane.sh`).
    pub fn up_real(name: &str, nodes: usize, fault: &str, extra: &[&str]) -> Option<Testbed> {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIPPED: needs root (network namespaces)");
            return None;
        }
        if let Err(e) = testbed::control_plane::locate_binaries(None) {
            eprintln!("SKIPPED: {e}");
            return None;
        }
        let mut args = vec!["--control-plane", "real"];
        args.extend_from_slice(extra);
        Some(Testbed::up(name, nodes, fault, &args))
    }

    /// [`Testbed::up_real`] with real kubelets (containerd, runc, the built images of
    /// [`built_image_dir`]) and `extra`, or `None` after printing why not (no
    /// containerd, runc or ctr on PATH, or what `up_real` skips for).
    pub fn up_real_nodes(name: &str, nodes: usize, fault: &str, extra: &[&str]) -> Option<Testbed> {
        for tool in ["containerd", "runc", "ctr"] {
            if !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .any(|d| d.join(tool).is_file())
            {
                eprintln!("SKIPPED: no {tool} on PATH (bash scripts/setup.sh)");
                return None;
            }
        }
        let images = built_image_dir();
        let mut args = vec![
            "--kubelet",
            "real",
            "--image-dir",
            images.to_str().expect("path"),
        ];
        args.extend_from_slice(extra);
        Testbed::up_real(name, nodes, fault, &args)
    }

    pub fn up(name: &str, nodes: usize, fault: &str, extra: &[&str]) -> Testbed {
        bin("prober");
        bin("target-server");
        let state = std::env::temp_dir().join(format!("fp-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&state);
        let fault_path =
            std::env::temp_dir().join(format!("fp-e2e-{name}-{}.yaml", std::process::id()));
        std::fs::write(&fault_path, fault).unwrap();
        let tb = Testbed { state };
        let mut up = tb.cmd();
        up.args(["up", "--nodes", &nodes.to_string(), "--fault"])
            .arg(&fault_path)
            .args(extra);
        // Tests run the freshly built bin-dir binaries unless they ask for the OCI
        // images (`--image-dir`, e.g. [`built_image_dir`]): an image directory left
        // from an earlier `scripts/image.sh` may hold older code.
        if !extra.contains(&"--image-dir") {
            up.arg("--image-dir").arg(tb.state.join("no-images"));
        }
        let out = output_within(up, command_timeout());
        let _ = std::fs::remove_file(&fault_path);
        assert!(
            out.status.success(),
            "testbed up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Real kubelets run no agent pods (the simulated kubelet writes theirs).
        if !extra.windows(2).any(|w| w == ["--kubelet", "real"]) {
            tb.wait_agent_pods(nodes, AGENTS_UP_TIMEOUT);
        }
        tb
    }

    /// Waits until each of the `nodes` nodes runs its calico-node pod (phase Running):
    /// the testbed creates them after `up` returns, and tests (and the gates they run)
    /// read the agents at once. Panics with the last listing after `timeout`.
    pub fn wait_agent_pods(&self, nodes: usize, timeout: Duration) {
        let mut want: Vec<String> = (1..=nodes).map(|n| format!("node-{n} Running")).collect();
        want.sort();
        let sorted = |o: &str| {
            let mut l: Vec<String> = o.lines().map(str::to_owned).collect();
            l.sort();
            l
        };
        let got = self.kubectl_until(
            &[
                "get",
                "pods",
                "-n",
                "kube-system",
                "-l",
                "k8s-app=calico-node",
                "-o",
                "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase}{\"\\n\"}{end}",
            ],
            timeout,
            |o| sorted(o) == want,
        );
        assert_eq!(
            sorted(&got),
            want,
            "calico-node pods not Running on every node within {timeout:?}"
        );
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_testbed"));
        c.arg("--state-dir").arg(&self.state);
        c
    }

    /// `testbed exec -- ARGS…`, killed (with everything it started) after
    /// [`command_timeout`] so a hang fails the test instead of blocking CI.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut c = self.cmd();
        c.arg("exec").arg("--").args(args);
        output_within(c, command_timeout())
    }

    pub fn gate(&self, extra: &[&str]) -> (i32, Value, String) {
        let report = self.state.join(format!("report-{}.json", rand_suffix()));
        let mut args = vec!["prober", "gate", "--report", report.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = self.exec(&args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let text = std::fs::read_to_string(&report)
            .unwrap_or_else(|e| panic!("no report ({e}); stdout:\n{stdout}\nstderr:\n{stderr}"));
        let _ = std::fs::remove_file(&report);
        // The output cites only files of the repository (the team's design notes are
        // not shipped; see tests/docs.rs).
        for word in [
            "DESIGN",
            concat!("SCENARIOS", ".md"),
            concat!("shared", "/"),
        ] {
            assert!(
                !stdout.contains(word) && !stderr.contains(word),
                "gate output cites {word:?}:\n{stdout}\n{stderr}"
            );
        }
        (
            out.status.code().unwrap_or(-1),
            serde_json::from_str(&text).unwrap(),
            format!("{stdout}\n{stderr}"),
        )
    }

    /// `testbed fault set` with `yaml` (written to a file in the state dir); panics
    /// with the command's stderr when it is refused.
    pub fn set_fault(&self, yaml: &str) {
        let fault = self.state.join(format!("fault-{}.yaml", rand_suffix()));
        std::fs::write(&fault, yaml).expect("fault file");
        let out = self
            .cmd()
            .args(["fault", "set"])
            .arg(&fault)
            .output()
            .expect("fault set");
        let _ = std::fs::remove_file(&fault);
        assert!(
            out.status.success(),
            "fault set: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The truth log (`testbed truth`), parsed.
    pub fn truth(&self) -> Vec<TruthEvent> {
        let mut c = self.cmd();
        c.arg("truth");
        let out = output_within(c, command_timeout());
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("truth line {l:?}: {e}")))
            .collect()
    }

    /// kube-apiserver's audit log (`audit.k8s.io/v1` Events, one JSON object per line,
    /// level Metadata, stages ResponseStarted/ResponseComplete/Panic) of a testbed on the
    /// real control plane; empty on the built-in one, which keeps no audit log.
    pub fn audit_events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.state.join("control-plane/audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// A kubeconfig for ServiceAccount `namespace/name` (the cluster and CA of the
    /// testbed's own kubeconfig, a 2 h token from `kubectl create token`), written into
    /// the state dir: what an in-cluster prober authenticates as, for a prober run on the
    /// host. The ServiceAccount must exist.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.kubectl(&["create", "token", name, "-n", namespace, "--duration", "2h"]);
        let field = |path: &str| {
            self.kubectl(&[
                "config",
                "view",
                "--raw",
                "--minify",
                "--flatten",
                "-o",
                &format!("jsonpath={{.clusters[0].cluster.{path}}}"),
            ])
        };
        let (server, ca) = (field("server"), field("certificate-authority-data"));
        assert!(!server.is_empty(), "no server in the testbed's kubeconfig");
        let ca_line = if ca.is_empty() {
            String::new()
        } else {
            format!("    certificate-authority-data: {ca}\n")
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n{ca_line}users:\n- name: {name}\n  user:\n    token: {}\ncontexts:\n- name: {name}\n  context: {{cluster: testbed, user: {name}, namespace: {namespace}}}\ncurrent-context: {name}\n",
            token.trim()
        );
        let path = self.state.join(format!("kubeconfig-sa-{namespace}-{name}"));
        std::fs::write(&path, text).expect("write ServiceAccount kubeconfig");
        path
    }

    /// `kubectl ARGS…` through `testbed exec`; panics with its output unless it exits 0.
    /// Returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut a = vec!["kubectl"];
        a.extend_from_slice(args);
        let out = self.exec(&a);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Names (`kind/name`) of every object of `resource` carrying the firstpacket label.
    pub fn labelled(&self, resource: &str) -> Vec<String> {
        self.kubectl(&[
            "get",
            resource,
            "-A",
            "-l",
            "app.kubernetes.io/name=firstpacket",
            "-o",
            "name",
        ])
        .lines()
        .map(str::to_owned)
        .collect()
    }

    /// Every probe pod (`pod/NAME`) in the cluster, including pods being deleted (a
    /// deleted pod stays listed, with `metadata.deletionTimestamp`, until its kubelet
    /// has finished the graceful termination).
    pub fn probe_pods(&self) -> Vec<String> {
        self.labelled("pods")
    }

    /// The probe pods (`pod/NAME`) that carry a `metadata.deletionTimestamp`: deleted,
    /// still listed while their kubelet terminates them.
    pub fn terminating_probe_pods(&self) -> Vec<String> {
        self.kubectl(&[
            "get",
            "pods",
            "-A",
            "-l",
            "app.kubernetes.io/name=firstpacket",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ])
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(_, ts)| !ts.is_empty())
        .map(|(name, _)| format!("pod/{name}"))
        .collect()
    }

    /// Polls (every [`POLL_INTERVAL`], at most `timeout`) until no object of
    /// `resource` carries the firstpacket label; returns what was listed last (empty
    /// when they all went). Objects being deleted count as still there.
    pub fn wait_no_labelled(&self, resource: &str, timeout: Duration) -> Vec<String> {
        poll_until(timeout, || self.labelled(resource), |l| l.is_empty())
    }

    /// [`Testbed::wait_no_labelled`] for probe pods: a pod the prober deleted is gone
    /// only once its kubelet finished it, so checks after a gate wait for that (use
    /// [`POD_GONE_TIMEOUT`]). Returns the pods still listed at the end.
    pub fn wait_no_probe_pods(&self, timeout: Duration) -> Vec<String> {
        self.wait_no_labelled("pods", timeout)
    }

    /// Polls the truth log (every [`POLL_INTERVAL`], at most `timeout`) until `done`
    /// holds for it; returns the log as last read, so the caller asserts on what it
    /// really saw (the kubelet logs e.g. `pod_deleted` only after the graceful
    /// termination, which may end after the gate that deleted the pod exited).
    pub fn truth_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[TruthEvent]) -> bool,
    ) -> Vec<TruthEvent> {
        poll_until(timeout, || self.truth(), |t| done(t))
    }

    /// Polls `kubectl ARGS…` (which must succeed) until `done` holds for its stdout
    /// or `timeout` passes; returns the last stdout.
    pub fn kubectl_until(
        &self,
        args: &[&str],
        timeout: Duration,
        mut done: impl FnMut(&str) -> bool,
    ) -> String {
        poll_until(timeout, || self.kubectl(args), |o| done(o))
    }

    /// Each node's calico-node pod: node → [name, uid, image, restartCount, Ready].
    pub fn agent_pods(&self) -> std::collections::BTreeMap<String, [String; 5]> {
        self.kubectl(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "k8s-app=calico-node",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name} {.metadata.uid} {.spec.containers[0].image} {.status.containerStatuses[0].restartCount} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ])
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 6).then(|| (w[0].to_owned(), [1, 2, 3, 4, 5].map(|i| w[i].to_owned())))
        })
        .collect()
    }

    pub fn prefix(&self) -> String {
        let plan: Value =
            serde_json::from_str(&std::fs::read_to_string(self.state.join("plan.json")).unwrap())
                .unwrap();
        plan["prefix"].as_str().unwrap().to_owned()
    }
}

impl Drop for Testbed {
    /// `testbed down`, then the test's own leftovers in the state dir (reports,
    /// manifests) — only when down succeeded, so a failed teardown stays inspectable.
    fn drop(&mut self) {
        let mut down = self.cmd();
        down.arg("down");
        let ok = down.status().is_ok_and(|s| s.success());
        if ok && !self.state.join("daemon.pid").exists() {
            let _ = std::fs::remove_dir_all(&self.state);
        }
    }
}

/// How often the polling helpers look again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How long `testbed up` may take to have every node's agent pods Running after it
/// returned.
pub const AGENTS_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a deleted pod may take to disappear: on a real control plane deletion
/// goes through the kubelet's graceful termination (SIGTERM, grace, SIGKILL, then
/// the final DELETE), so this is generous.
pub const POD_GONE_TIMEOUT: Duration = Duration::from_secs(30);

/// Calls `probe` until `done` holds for its value or `timeout` has passed (looking
/// every [`POLL_INTERVAL`]; always at least once); returns the last value, so the
/// caller asserts on what it last saw and says so in the message.
pub fn poll_until<T>(
    timeout: Duration,
    mut probe: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let v = probe();
        if done(&v) || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

pub fn rand_suffix() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// How long one harness command (`testbed up`, `testbed exec …`, `testbed truth`) may
/// take: `FP_E2E_COMMAND_TIMEOUT` (humantime), default 300 s — longer than any gate
/// these tests run, far shorter than CI's limit.
pub fn command_timeout() -> Duration {
    std::env::var("FP_E2E_COMMAND_TIMEOUT")
        .ok()
        .and_then(|v| humantime::parse_duration(&v).ok())
        .unwrap_or(Duration::from_secs(300))
}

/// Runs `cmd` in its own process group with stdout/stderr captured; after `timeout`
/// kills the whole group (SIGKILL) and panics with what it printed so far.
pub fn output_within(mut cmd: Command, timeout: Duration) -> Output {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("start {shown}: {e}"));
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > timeout {
            let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            let (o, e) = (out.join().unwrap(), err.join().unwrap());
            panic!(
                "{shown} still running after {timeout:?}: killed\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The dial interval the gates in these tests use (the default, 100 ms).
pub const DIAL_INTERVAL: f64 = 0.1;

/// Asserts a probe's TTFP is within [−50 ms, dial interval + 50 ms] of the ground truth
/// (docs/design.md §7 accuracy target); returns the TTFP (seconds). `ctx` goes into messages.
pub fn assert_ttfp_near_truth(truth: &[TruthEvent], p: &Value, ctx: &str) -> f64 {
    let ttfp = p["ttfp_seconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("no TTFP: {p:#}\n{ctx}"));
    let (src, dst) = (
        p["source"]["uid"].as_str().unwrap(),
        p["target"]["uid"].as_str().unwrap(),
    );
    let want = testbed::truth::truth_ttfp(truth, src, dst).unwrap_or_else(|| {
        // Which part of the path the log lacks: the two pods' events and every route event.
        let related: Vec<String> = truth
            .iter()
            .filter(|e| {
                e.uid.as_deref().is_some_and(|u| u == src || u == dst)
                    || matches!(
                        e.event,
                        testbed::truth::TruthKind::PeerRouteRemoved
                            | testbed::truth::TruthKind::PeerRouteRestored
                    )
            })
            .map(|e| serde_json::to_string(e).unwrap_or_default())
            .collect();
        panic!(
            "no truth for {} (source uid {src}, target uid {dst}); their truth events:\n{}\nprobe: {p:#}",
            p["id"],
            related.join("\n")
        )
    });
    let err = ttfp - want;
    assert!(
        (-0.05..=DIAL_INTERVAL + 0.05).contains(&err),
        "probe {} {} {}→{}: TTFP {ttfp:.3}s vs truth {want:.3}s (error {err:+.3}s)\n{ctx}",
        p["id"],
        p["kind"],
        p["source"]["node"],
        p["target"]["node"]
    );
    ttfp
}

/// `ip netns list` as text.
pub fn netns_list() -> String {
    String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

pub fn validate(report: &Value) {
    let schema: Value = serde_json::from_str(firstpacket_report::GATE_REPORT_SCHEMA).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = v
        .iter_errors(report)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "report does not match the schema: {errors:#?}"
    );
}

impl Testbed {
    /// Writes `text` as `name` into the state dir and returns its path (for `kubectl
    /// apply -f`).
    pub fn manifest(&self, name: &str, text: &str) -> String {
        let p = self.state.join(name);
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        p.display().to_string()
    }

    /// Polls until pod `ns/name` has condition Ready=True; returns whether it did.
    pub fn wait_pod_ready(&self, ns: &str, name: &str, timeout: Duration) -> bool {
        let got = self.kubectl_until(
            &[
                "get",
                "pod",
                "-n",
                ns,
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
            timeout,
            |o| o.trim() == "True",
        );
        got.trim() == "True"
    }

    /// The host pid of pod `ns/name`'s container process, read on the node side: the
    /// pod's UID from the API, then the pid file the kubelet writes
    /// (`STATE/pods/UID/pid`). `None` while the pod has no running container.
    pub fn container_pid(&self, ns: &str, name: &str) -> Option<i32> {
        let uid = self.kubectl(&[
            "get",
            "pod",
            "-n",
            ns,
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        let text =
            std::fs::read_to_string(self.state.join("pods").join(uid.trim()).join("pid")).ok()?;
        text.trim().parse().ok().filter(|p| *p > 0)
    }
}

/// `/proc/PID/status` as `field → value` (values trimmed; e.g. `Uid` →
/// `"65532\t65532\t65532\t65532"`, `CapEff` → `"0000000000000000"`); empty when the
/// process is gone.
pub fn proc_status(pid: i32) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// `curl -sf -m 5 URL` inside the testbed's host netns (where out-of-cluster probers
/// listen); the body on a 2xx answer, `None` otherwise.
#[allow(dead_code)]
pub fn curl(tb: &Testbed, url: &str) -> Option<String> {
    let out = tb.exec(&["curl", "-sf", "-m", "5", url]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until the `prober run` admin server at `base` answers `/readyz` with 200:
/// panics (with `logs()`) when it has not within 60 s or the process exited first.
#[allow(dead_code)]
pub fn wait_ready(
    tb: &Testbed,
    base: &str,
    run: &mut std::process::Child,
    logs: &dyn Fn() -> String,
) {
    let start = Instant::now();
    while curl(tb, &format!("{base}/readyz")).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "/readyz never 200\n{}",
            logs()
        );
        assert!(
            run.try_wait().expect("wait").is_none(),
            "prober exited\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs `testbed ARGS…` against `tb` (e.g. `["api", "deny", "create", "pods"]`) and
/// panics with its stderr unless it exits 0.
#[allow(dead_code)]
pub fn testbed_ok(tb: &Testbed, args: &[&str]) {
    let out = tb.cmd().args(args).output().expect("testbed");
    assert!(
        out.status.success(),
        "testbed {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wall-clock start time of a probe record (Unix seconds, from `timeline.started_at`).
pub fn started_unix(p: &Value) -> f64 {
    let s = p["timeline"]["started_at"].as_str().expect("started_at");
    let ts: k8s_openapi::jiff::Timestamp = s.parse().expect("RFC 3339");
    ts.as_millisecond() as f64 / 1000.0
}

/// Node name → node IP (InternalIP).
pub fn node_ips(tb: &Testbed) -> std::collections::BTreeMap<String, String> {
    tb.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.addresses[?(@.type==\"InternalIP\")].address}{\"\\n\"}{end}",
    ])
    .lines()
    .filter_map(|l| l.split_once(' '))
    .map(|(n, ip)| (n.to_owned(), ip.to_owned()))
    .collect()
}

/// The value of a sample line `name{…} value` / `name value` in a page (first match).
pub fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
