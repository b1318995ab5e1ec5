//! The shipped OCI images (`bash scripts/image.sh`, run by `.ci/run` before the
//! tests): what they hold, publishing them to a registry (`crane push` to one served on
//! loopback, pulled back with the same digest), a gate whose probe pods run the
//! target-server image itself (the testbed's `--image-dir`, docs/design.md §6 pod-spec
//! contract), one whose probe pods pull it from that loopback registry, and fault
//! `clock_skew` with that static image.

mod common;

use common::{
    assert_ttfp_near_truth, built_image_digest, built_image_dir, poll_until, repo_file, Testbed,
    SERIAL,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use testbed::truth::{TruthEvent, TruthKind};

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn read_json(p: &Path) -> Value {
    let text = std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

/// crane, built (or found cached) by the image script.
fn crane() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo_file("scripts/image.sh"))
        .arg("--crane")
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/image.sh --crane");
    assert!(out.status.success(), "scripts/image.sh --crane failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `crane registry serve` on 127.0.0.1 (a free port), killed on drop.
struct Registry {
    child: std::process::Child,
    addr: String,
    log: PathBuf,
}

impl Registry {
    fn start(crane: &Path) -> Registry {
        // One log per registry: tests of this binary may run side by side.
        let log = std::env::temp_dir().join(format!(
            "fp-registry-{}-{}.log",
            std::process::id(),
            common::rand_suffix()
        ));
        let child = Command::new(crane)
            .args(["registry", "serve", "--address", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start crane registry serve");
        let mut reg = Registry {
            child,
            addr: String::new(),
            log,
        };
        let port = poll_until(
            Duration::from_secs(10),
            || {
                let text = std::fs::read_to_string(&reg.log).unwrap_or_default();
                text.split("serving on port ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .map(str::to_owned)
            },
            Option::is_some,
        )
        .expect("crane registry serve did not report its port");
        reg.addr = format!("127.0.0.1:{port}");
        reg
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[test]
fn built_images_hold_one_static_binary_and_round_trip_through_a_loopback_registry() {
    let dir = built_image_dir();
    let crane = crane();
    let reg = Registry::start(&crane);
    let tmp = std::env::temp_dir().join(format!("fp-images-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for name in ["target-server", "prober"] {
        let layout = dir.join(name);
        let digest = built_image_digest(&dir, name);
        let index = read_json(&layout.join("index.json"));
        let manifests = index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 1, "{name}: {index:#}");
        let reference = format!("ghcr.io/firstpacket/{name}:{VERSION}");
        assert_eq!(
            manifests[0]["annotations"]["org.opencontainers.image.ref.name"], reference,
            "{index:#}"
        );
        assert_eq!(manifests[0]["digest"], digest.as_str());

        // One layer, the binary alone (no shell, nothing else); non-root numeric user;
        // the binary is the entrypoint.
        let manifest = read_json(&blob(&layout, &digest));
        assert_eq!(
            manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json",
            "{manifest:#}"
        );
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1, "{manifest:#}");
        let config = read_json(&blob(
            &layout,
            manifest["config"]["digest"].as_str().unwrap(),
        ));
        assert_eq!(config["config"]["User"], "65532:65532", "{config:#}");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!([format!("/{name}")])
        );
        assert_eq!(config["os"], "linux");
        assert_eq!(config["architecture"], "amd64");
        let listing = run(Command::new("tar")
            .arg("-tzf")
            .arg(blob(&layout, layers[0]["digest"].as_str().unwrap())));
        assert_eq!(listing, name, "{name}: layer holds more than the binary");

        // Statically linked; target-server within its 5 MB budget (docs/design.md §7).
        let img = testbed::image::find_and_unpack(&dir, &reference, &tmp.join("unpacked"))
            .unwrap()
            .expect("the testbed finds the image by its reference");
        let bin = img.rootfs.join(name);
        assert!(
            testbed::image::is_static_elf(&bin),
            "{name} is not statically linked"
        );
        let size = std::fs::metadata(&bin).unwrap().len();
        println!("{name}: {size} bytes (static, in image {digest})");
        if name == "target-server" {
            assert!(size <= 5_000_000, "target-server is {size} bytes (> 5 MB)");
        }

        // The OCI archive holds the same layout.
        let archive = run(Command::new("tar")
            .arg("-tf")
            .arg(dir.join(format!("{name}.oci.tar"))));
        for want in [
            "oci-layout".to_owned(),
            "index.json".to_owned(),
            format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")),
        ] {
            assert!(
                archive.lines().any(|l| l == want),
                "{name}.oci.tar lacks {want}:\n{archive}"
            );
        }

        // Publish as docs/src/install.md says (`crane push LAYOUT REF`), pull back: same digest.
        let pushed_ref = format!("{}/firstpacket/{name}:{VERSION}", reg.addr);
        let pushed = run(Command::new(&crane)
            .arg("push")
            .arg(&layout)
            .arg(&pushed_ref));
        assert!(
            pushed.ends_with(&format!("@{digest}")),
            "push printed {pushed}"
        );
        assert_eq!(
            run(Command::new(&crane).args(["digest", &pushed_ref])),
            digest
        );
        let back = tmp.join(format!("pulled-{name}"));
        run(Command::new(&crane)
            .args(["pull", "--format", "oci", &pushed_ref])
            .arg(&back));
        let pulled = read_json(&back.join("index.json"));
        assert_eq!(pulled["manifests"][0]["digest"], digest.as_str());
        assert!(blob(&back, layers[0]["digest"].as_str().unwrap()).is_file());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A pod spec on `node` running `image` with `args`, a readiness probe on 8080 and
/// no securityContext (so the image's user is what runs).
fn pod(name: &str, node: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: \"{image}\"\n    args: [serve]\n    readinessProbe: {{httpGet: {{path: /readyz, port: 8080}}, periodSeconds: 1}}\n"
    )
}

/// Polls until pod `name` (namespace default) waits with `reason`; returns
/// `REASON|MESSAGE` as last seen.
fn waiting(tb: &Testbed, name: &str, reason: &str) -> String {
    tb.kubectl_until(
        &[
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}",
        ],
        READY_TIMEOUT,
        |o| o.starts_with(&format!("{reason}|")),
    )
}

fn readiness_events<'a>(truth: &'a [TruthEvent], ns: &str) -> Vec<&'a TruthEvent> {
    truth
        .iter()
        .filter(|e| e.event == TruthKind::ReadinessOk && e.namespace.as_deref() == Some(ns))
        .collect()
}

/// Runs a 2-pair gate (`extra` flags added) that must pass with every TTFP true to the
/// testbed, and checks that each probe pod ran image `image_id` (`NAME@sha256:…`, the
/// truth log's `readiness_ok` detail).
fn gate_runs_image(tb: &Testbed, extra: &[&str], image_id: &str) {
    let mut args = vec!["--pairs", "2", "--hold", "1s"];
    args.extend_from_slice(extra);
    let (code, report, out) = tb.gate(&args);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    for p in report["probes"].as_array().unwrap() {
        assert_ttfp_near_truth(&truth, p, &out);
    }
    let probe_pods = readiness_events(&truth, "firstpacket");
    assert!(probe_pods.len() >= 4, "{probe_pods:#?}");
    for e in &probe_pods {
        assert_eq!(
            e.detail["image_id"], image_id,
            "probe pod {:?} did not run the image: {e:?}",
            e.pod
        );
    }
}

#[test]
fn a_gate_runs_the_built_target_server_image() {
    let _g = serial();
    let dir = built_image_dir();
    let digest = built_image_digest(&dir, "target-server");
    let image_id = format!("ghcr.io/firstpacket/target-server@{digest}");
    let dir_s = dir.display().to_string();
    let tb = Testbed::up("images", 2, "rules: []\n", &["--image-dir", &dir_s]);

    // The prober's default --image is the one the script built, and every probe pod
    // ran it: the testbed records the image digest it ran (truth `readiness_ok`).
    gate_runs_image(&tb, &[], &image_id);

    // A pod of that image: imageID is the repo digest (as a real kubelet reports it),
    // the process runs the image's binary as the image's user (no securityContext);
    // the same image by digest runs too; an unknown tag falls back to the bin dir's
    // binary of that name (pod-spec contract), an unknown name is ErrImagePull.
    let m = tb.manifest(
        "pods.yaml",
        &[
            pod(
                "bytag",
                "node-1",
                &format!("ghcr.io/firstpacket/target-server:{VERSION}"),
            ),
            pod("bydigest", "node-2", &image_id),
            pod(
                "fallback",
                "node-1",
                "ghcr.io/firstpacket/target-server:0.0.0-none",
            ),
            pod("missing", "node-1", "ghcr.io/firstpacket/nothing-like-it:1"),
        ]
        .join("---\n"),
    );
    tb.kubectl(&["apply", "-f", &m]);
    for name in ["bytag", "bydigest", "fallback"] {
        assert!(
            tb.wait_pod_ready("default", name, READY_TIMEOUT),
            "{name} not Ready"
        );
    }
    let image_id_of = |name: &str| {
        tb.kubectl(&[
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.status.containerStatuses[0].imageID}",
        ])
        .trim()
        .to_owned()
    };
    assert_eq!(image_id_of("bytag"), image_id);
    assert_eq!(image_id_of("bydigest"), image_id);
    assert_eq!(
        image_id_of("fallback"),
        "testbed://ghcr.io/firstpacket/target-server:0.0.0-none"
    );
    let pid = tb.container_pid("default", "bytag").expect("bytag pid");
    let st = common::proc_status(pid);
    assert_eq!(st["Uid"], "65532\t65532\t65532\t65532", "{st:#?}");
    assert_eq!(st["Gid"], "65532\t65532\t65532\t65532", "{st:#?}");
    // Its root is the image's: the binary and what the runtime mounts (/dev, /proc,
    // the service account under /var/run/secrets), nothing of the host (no shell, no
    // /etc).
    let mut root: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/root"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    root.sort();
    assert_eq!(
        root,
        ["dev", "proc", "target-server", "var"],
        "bytag's root"
    );
    let token = format!("/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token");
    assert!(
        Path::new(&token).is_file(),
        "no service-account token at {token}"
    );
    let pid = tb
        .container_pid("default", "fallback")
        .expect("fallback pid");
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/exe")).unwrap(),
        common::bin("target-server").canonicalize().unwrap()
    );
    let got = waiting(&tb, "missing", "ErrImagePull");
    assert!(got.starts_with("ErrImagePull|"), "{got}");

    // The prober image talks to the API from inside its own root (no CA bundle, no
    // /etc): the service account's token and CA are all it has. On the real control
    // plane the default service account needs the right to list pods first.
    if common::on_real_control_plane() {
        tb.kubectl(&[
            "create",
            "clusterrolebinding",
            "fp-e2e-images-default",
            "--clusterrole=cluster-admin",
            "--serviceaccount=default:default",
        ]);
    }
    let m = tb.manifest(
        "prober.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: prober}}\nspec:\n  restartPolicy: Never\n  securityContext: {{runAsNonRoot: true}}\n  containers:\n  - name: c\n    image: ghcr.io/firstpacket/prober:{VERSION}\n    args: [cleanup, --namespace, default]\n    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n"
        ),
    );
    tb.kubectl(&["apply", "-f", &m]);
    let phase = tb.kubectl_until(
        &["get", "pod", "prober", "-o", "jsonpath={.status.phase}"],
        READY_TIMEOUT,
        |o| o == "Succeeded" || o == "Failed",
    );
    let logs = tb.kubectl(&["logs", "prober"]);
    assert_eq!(
        phase, "Succeeded",
        "prober cleanup in the prober image:\n{logs}"
    );
    assert_eq!(
        image_id_of("prober"),
        format!(
            "ghcr.io/firstpacket/prober@{}",
            built_image_digest(&dir, "prober")
        )
    );
}

#[test]
fn a_gate_runs_the_image_pushed_to_a_loopback_registry() {
    let _g = serial();
    let dir = built_image_dir();
    let digest = built_image_digest(&dir, "target-server");
    let crane = crane();
    let reg = Registry::start(&crane);
    let reference = format!("{}/firstpacket/target-server:{VERSION}", reg.addr);
    run(Command::new(&crane)
        .arg("push")
        .arg(dir.join("target-server"))
        .arg(&reference));
    // No image directory: the kubelet pulls from the registry, as a real one would.
    let tb = Testbed::up("pull", 2, "rules: []\n", &[]);
    let want = format!("{}/firstpacket/target-server@{digest}", reg.addr);
    gate_runs_image(&tb, &["--image", &reference], &want);
    // A tag the registry does not have is ErrImagePull, even though a bin-dir binary
    // has the image's name: a registry reference is pulled or nothing.
    let m = tb.manifest(
        "pods.yaml",
        &pod(
            "unknown-tag",
            "node-1",
            &format!("{}/firstpacket/target-server:0.0.0-none", reg.addr),
        ),
    );
    tb.kubectl(&["apply", "-f", &m]);
    let got = waiting(&tb, "unknown-tag", "ErrImagePull");
    assert!(
        got.starts_with("ErrImagePull|") && got.contains("HTTP 404"),
        "{got}"
    );
}

/// Copies image layout `from` to `to`, naming its manifest `reference`.
fn copy_layout(from: &Path, to: &Path, reference: &str) {
    run(Command::new("cp").arg("-a").arg(from).arg(to));
    let p = to.join("index.json");
    let mut index = read_json(&p);
    index["manifests"][0]["annotations"] = serde_json::json!({
        "org.opencontainers.image.ref.name": reference,
    });
    std::fs::write(&p, serde_json::to_vec(&index).unwrap()).unwrap();
}

const SKEW_FAULT: &str = "rules:
  - nodes: {names: [node-1]}
    clock_skew: 30s
  - nodes: {names: [node-2]}
    clock_skew: -45s
";

#[test]
fn clock_skew_shifts_the_static_images_pods_and_ttfp_stays_true() {
    let _g = serial();
    let built = built_image_dir();
    let digest = built_image_digest(&built, "target-server");
    let image_id = format!("ghcr.io/firstpacket/target-server@{digest}");
    // The built images, plus the target-server image under a name no bin-dir binary
    // has: skewing that one has no mechanism (static, no dynamic build to run instead).
    let images = std::env::temp_dir().join(format!("fp-skew-images-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&images);
    std::fs::create_dir_all(&images).unwrap();
    run(Command::new("cp")
        .arg("-a")
        .arg(built.join("target-server"))
        .arg(images.join("target-server")));
    copy_layout(
        &built.join("target-server"),
        &images.join("static-only"),
        "example.com/static-only:1",
    );
    let images_s = images.display().to_string();
    let tb = Testbed::up("skew", 3, SKEW_FAULT, &["--image-dir", &images_s]);
    let skew_of = |node: &str| match node {
        "node-1" => 30.0,
        "node-2" => -45.0,
        _ => 0.0,
    };

    // Every node as a source twice (3-node ring), each probe still true to the
    // testbed's clock, while the source's wall clock shows its node's skew.
    let (code, report, out) = tb.gate(&["--pairs", "6", "--hold", "1s"]);
    assert_eq!(code, 0, "{out}");
    let truth = tb.truth();
    let probes = report["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 6, "{out}");
    let mut skewed_sources = 0;
    for p in probes {
        assert_ttfp_near_truth(&truth, p, &out);
        let node = p["source"]["node"].as_str().unwrap();
        let uid = p["source"]["uid"].as_str().unwrap();
        let ready = truth
            .iter()
            .find(|e| e.event == TruthKind::ReadinessOk && e.uid.as_deref() == Some(uid))
            .unwrap_or_else(|| panic!("no readiness_ok for source {uid}"));
        // The source's wall clock when it saw its first kube-probe (process start on
        // its own wall clock + the monotonic time to Ready) vs the testbed's stamp of
        // that same moment.
        let r = &p["source_report"];
        let wall_ready =
            r["process_start_unix"].as_f64().unwrap() + r["ready_at"].as_f64().unwrap();
        let shown = wall_ready - ready.t;
        let want = skew_of(node);
        println!("source on {node}: wall clock off by {shown:+.3}s (skew {want:+}s)");
        assert!(
            (shown - want).abs() < 0.5,
            "source on {node}: wall clock off by {shown:+.3}s, skew is {want:+}s\n{p:#}"
        );
        assert_eq!(ready.detail["image_id"], image_id.as_str(), "{ready:?}");
        if want != 0.0 {
            skewed_sources += 1;
            // The static image binary cannot take libfaketime: the dynamically linked
            // build of the same name ran instead.
            assert_eq!(
                ready.detail["program"],
                common::bin("target-server").display().to_string(),
                "{ready:?}"
            );
            assert!(ready.detail["clock_skew"].is_string(), "{ready:?}");
        } else {
            assert!(ready.detail["program"].is_null(), "{ready:?}");
        }
    }
    assert_eq!(skewed_sources, 4, "{out}");

    // A long-lived pod on node-2: its monotonic and boot-time clocks are offset in its
    // own time namespace, libfaketime is preloaded, /dev/shm is a writable tmpfs.
    let m = tb.manifest(
        "pods.yaml",
        &[
            pod(
                "skewed",
                "node-2",
                &format!("ghcr.io/firstpacket/target-server:{VERSION}"),
            ),
            pod(
                "noskew",
                "node-3",
                &format!("ghcr.io/firstpacket/target-server:{VERSION}"),
            ),
            pod("static-only", "node-1", "example.com/static-only:1"),
        ]
        .join("---\n"),
    );
    tb.kubectl(&["apply", "-f", &m]);
    for name in ["skewed", "noskew"] {
        assert!(
            tb.wait_pod_ready("default", name, READY_TIMEOUT),
            "{name} not Ready"
        );
    }
    // `/proc/PID/timens_offsets`: `monotonic S N` and `boottime S N`, space-padded.
    let offsets = |name: &str| -> Vec<Vec<String>> {
        let pid = tb.container_pid("default", name).expect("pid");
        std::fs::read_to_string(format!("/proc/{pid}/timens_offsets"))
            .unwrap()
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let want = |s: &str| -> Vec<Vec<String>> {
        ["monotonic", "boottime"]
            .iter()
            .map(|c| vec![c.to_string(), s.to_owned(), "0".to_owned()])
            .collect()
    };
    assert_eq!(offsets("skewed"), want("-45"));
    assert_eq!(offsets("noskew"), want("0"));
    let pid = tb.container_pid("default", "skewed").unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("FAKETIME=-45"), "{environ}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts")).unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.starts_with("shm /dev/shm tmpfs rw")),
        "{mounts}"
    );

    // No mechanism for the static-only image: the container does not start, and says why.
    let got = waiting(&tb, "static-only", "CreateContainerError");
    assert!(
        got.starts_with("CreateContainerError|clock_skew: ") && got.contains("statically linked"),
        "{got}"
    );
    drop(tb);
    let _ = std::fs::remove_dir_all(&images);
}
