//! Real kubelets and containerd on the testbed's nodes (`testbed up --control-plane real
//! --kubelet real`): per node a containerd (Debian's package, with runc and
//! `containerd-shim-runc-v2`) and a real kubelet of the control plane's version, both
//! entering only the node's network namespace (never `ip netns exec`: it remounts
//! `/sys` and runc then finds no cgroup mount), supervised like real Felix
//! ([`crate::supervise`]). Pods get their network from the testbed's own binary as
//! containerd's CNI plugin (`testbed cni`, through the wrapper [`CNI_PLUGIN`] in the
//! node's CNI `bin_dir`).
//!
//! Everything a node owns lives under `<state>/nodes/<node>/`: containerd's `root`,
//! `state` (where it mounts pod network namespaces, `netns_mounts_under_state_dir`),
//! socket and runc root, the CNI directories, the kubelet's `--root-dir`, its pod logs,
//! certificates and static pod manifests. Outside it: the node's cgroup root
//! (`/<netns prefix>-<node>` in every cgroup hierarchy), and the host paths every
//! kubelet shares whatever its `--root-dir` ([`SHARED_HOST_PATHS`]).
//!
//! What these machines need (checked by hand on Debian 12, containerd 1.6.20, runc
//! 1.1.5, kubelet v1.36.3):
//! - `restrict_oom_score_adj = true`: the machines withhold `CAP_SYS_RESOURCE`, so runc
//!   cannot set the sandbox's `oom_score_adj` of −998 (`nsexec: failed to update
//!   /proc/self/oom_score_adj: Permission denied`);
//! - the cgroups are v1 (hybrid): kubelet 1.36 runs there only with `failCgroupV1:
//!   false`; its `cgroupRoot` must exist in **every** v1 hierarchy first (with
//!   `cpuset.cpus`/`cpuset.mems` copied from the parent), else `cgroup ["X"] has some
//!   missing paths`;
//! - no registry is reachable: the project's images and the `pause` sandbox image
//!   (`scripts/image.sh`) are imported into each node's containerd with `ctr images
//!   import`; any other image fails to pull, as on an air-gapped node;
//! - the serving certificate carries the node IP (`kubectl logs/exec` go from the API
//!   server to `<node IP>:10250`); the client certificate is `system:node:<node>` in
//!   `system:nodes` (the Node authorizer and NodeRestriction admission).
//!
//! Teardown ([`RealNode::stop`]) leaves nothing: containerd's shims outlive containerd
//! (killed by PID with every process in the node's cgroups), its overlay, shm and netns
//! mounts live in the host mount namespace (unmounted), the cgroup directories are
//! removed depth-first in every hierarchy.

use crate::supervise::{ReadyCheck, Spec, Supervised};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable for `testbed up --kubelet`.
pub const KUBELET_ENV: &str = "FIRSTPACKET_KUBELET";

/// The CNI plugin's name (the `type` of the node's CNI network configuration and the
/// wrapper script in its `bin_dir` that runs `testbed cni`).
pub const CNI_PLUGIN: &str = "firstpacket-testbed";

/// The CNI network's name.
pub const CNI_NETWORK: &str = "firstpacket";

/// The kubelet's healthz port (on the node netns' loopback; its default).
pub const KUBELET_HEALTHZ_PORT: u16 = 10248;

/// The kubelet's API port (its default; `kubectl logs/exec` through the API server).
pub const KUBELET_PORT: u16 = 10250;

/// containerd's Kubernetes namespace (the CRI plugin's images and containers).
pub const CONTAINERD_K8S_NAMESPACE: &str = "k8s.io";

/// Host paths every kubelet and containerd use whatever their configured roots
/// (kubelet: the device-plugin socket directory and the `/var/log/containers`
/// symlinks; containerd: the CNI result cache, its fifo and shim socket directories).
/// [`SharedHostPaths`] removes those that did not exist before the first node started.
pub const SHARED_HOST_PATHS: &[&str] = &[
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/containerd/s",
    "/run/containerd/fifo",
    "/run/containerd",
];

/// The [`SHARED_HOST_PATHS`] that did not exist before a testbed's first real node
/// started: [`SharedHostPaths::remove`] deletes them at teardown.
#[derive(Debug, Clone, Default)]
pub struct SharedHostPaths {
    created: Vec<PathBuf>,
}

impl SharedHostPaths {
    /// Notes which shared host paths are missing now (call before the first node
    /// starts).
    pub fn record() -> SharedHostPaths {
        SharedHostPaths {
            created: SHARED_HOST_PATHS
                .iter()
                .map(PathBuf::from)
                .filter(|p| !p.exists())
                .collect(),
        }
    }

    /// The paths it would remove.
    pub fn created(&self) -> &[PathBuf] {
        &self.created
    }

    /// Removes the recorded paths (deepest first) unless a kubelet or containerd still
    /// runs on the machine (another testbed's, or the host's own: then they are theirs
    /// to keep). Errors are logged.
    pub fn remove(&self) {
        if self.created.is_empty() {
            return;
        }
        if let Some(pid) = running_node_daemon() {
            tracing::info!(
                pid,
                "a kubelet or containerd still runs: shared host paths kept"
            );
            return;
        }
        let mut paths = self.created.clone();
        paths.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in paths {
            if let Err(e) = std::fs::remove_dir_all(&p) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %p.display(), error = %e, "remove shared host path");
                }
            }
        }
    }
}

/// The PID of a running `kubelet` or `containerd` process, if any (from
/// `/proc/PID/comm`).
fn running_node_daemon() -> Option<i32> {
    let rd = std::fs::read_dir("/proc").ok()?;
    rd.flatten().find_map(|e| {
        let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        matches!(comm.trim(), "kubelet" | "containerd").then_some(pid)
    })
}

/// The testbed's node implementation: the simulated kubelet (`sim`, the default) or a
/// real kubelet with containerd (`real`, needs the real control plane).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KubeletChoice {
    /// This project's kubelet: pods are processes in network
    /// namespaces.
    #[default]
    Sim,
    /// A real kubelet and containerd per node: pods are runc containers.
    Real,
}

impl KubeletChoice {
    /// Which fault primitives apply to this kubelet.
    pub fn kind(self) -> crate::fault::KubeletKind {
        match self {
            KubeletChoice::Sim => crate::fault::KubeletKind::Simulated,
            KubeletChoice::Real => crate::fault::KubeletKind::Real,
        }
    }

    /// The value as given on the command line.
    pub fn as_arg(self) -> &'static str {
        match self {
            KubeletChoice::Sim => "sim",
            KubeletChoice::Real => "real",
        }
    }
}

/// Where the node-side binaries come from.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The real kubelet (built with the control plane, `scripts/control-plane.sh`).
    pub kubelet: PathBuf,
    /// `containerd` (Debian's package).
    pub containerd: PathBuf,
    /// `ctr`, containerd's client (imports the images).
    pub ctr: PathBuf,
    /// The testbed's own binary (`testbed cni`).
    pub testbed: PathBuf,
}

impl Binaries {
    /// Finds the kubelet in `control_plane_bin` and containerd, `ctr`, runc and
    /// `containerd-shim-runc-v2` on `PATH`. Errors: which one is missing and how to get
    /// it.
    pub fn locate(control_plane_bin: &Path, testbed: &Path) -> Result<Binaries> {
        let kubelet = control_plane_bin.join("kubelet");
        if !kubelet.is_file() {
            bail!(
                "no kubelet in {} (build it with `bash scripts/control-plane.sh`)",
                control_plane_bin.display()
            );
        }
        let find = |name: &str| -> Result<PathBuf> {
            which(name).ok_or_else(|| {
                anyhow!("{name} not found on PATH (install Debian's `containerd` and `runc` packages: `bash scripts/setup.sh`)")
            })
        };
        find("runc")?;
        find("containerd-shim-runc-v2")?;
        Ok(Binaries {
            kubelet,
            containerd: find("containerd")?,
            ctr: find("ctr")?,
            testbed: testbed.to_path_buf(),
        })
    }
}

/// The first executable `name` on `PATH`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The images every real node imports (`scripts/image.sh` writes them as
/// `NAME.oci.tar` beside an OCI layout `NAME/`), the pause image last.
pub const NODE_IMAGES: &[&str] = &["target-server", "prober", "pause"];

/// The OCI archives of [`NODE_IMAGES`] in `image_dir` and the pause image's reference
/// (its layout's `io.containerd.image.name` annotation). Errors: a missing image, naming
/// `scripts/image.sh`.
pub fn node_images(image_dir: &Path) -> Result<(Vec<PathBuf>, String)> {
    let mut tars = Vec::new();
    for n in NODE_IMAGES {
        let t = image_dir.join(format!("{n}.oci.tar"));
        if !t.is_file() {
            bail!(
                "--kubelet real needs the project's images in {}: no {n}.oci.tar there (build them with `bash scripts/image.sh`, or point --image-dir at them)",
                image_dir.display()
            );
        }
        tars.push(t);
    }
    let index = image_dir.join("pause").join("index.json");
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&index).with_context(|| format!("read {}", index.display()))?,
    )
    .with_context(|| format!("parse {}", index.display()))?;
    let reference = v["manifests"][0]["annotations"]["io.containerd.image.name"]
        .as_str()
        .ok_or_else(|| {
            anyhow!(
                "{} names no image (io.containerd.image.name)",
                index.display()
            )
        })?
        .to_owned();
    Ok((tars, reference))
}

/// Packs the static binary `binary` into an OCI image archive `out` (what `ctr images
/// import` reads) named `reference`: one layer holding the binary as `/NAME` and the
/// Debian root's symlinks (`bin`, `sbin`, `lib`, `lib64` → `usr/…`) for a host `/usr`
/// mounted read-only over `/usr` (the node tools a real agent execs: `nft`, `conntrack`,
/// `iptables-nft-restore`, `ipset`); entrypoint `/NAME`. Layout per the OCI image
/// spec (image-layout, manifest, config); the layer is written by GNU tar (sorted, owner
/// 0, mtime 0). Errors: file I/O, tar.
pub fn pack_binary_image(binary: &Path, reference: &str, out: &Path) -> Result<()> {
    use crate::image::sha256_digest;
    let name = binary
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{}: no file name", binary.display()))?;
    let work = out.with_extension("work");
    let _ = std::fs::remove_dir_all(&work);
    let root = work.join("rootfs");
    std::fs::create_dir_all(&root)?;
    std::fs::copy(binary, root.join(name)).with_context(|| format!("copy {}", binary.display()))?;
    for d in ["usr", "etc", "tmp", "var", "run", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    for (link, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(target, root.join(link))?;
    }
    let layer_path = work.join("layer.tar");
    let tar = |dir: &Path, out: &Path, what: &[&str]| -> Result<()> {
        let st = std::process::Command::new("tar")
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mtime=@0",
                "-C",
            ])
            .arg(dir)
            .arg("-cf")
            .arg(out)
            .args(what)
            .status()
            .context("run tar")?;
        if !st.success() {
            bail!("tar of {} failed ({st})", dir.display());
        }
        Ok(())
    };
    tar(&root, &layer_path, &["."])?;
    let layer = std::fs::read(&layer_path)?;
    let layer_digest = sha256_digest(&layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Entrypoint": [format!("/{name}")] },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    }))?;
    let config_digest = sha256_digest(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len() },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len() }],
    }))?;
    let manifest_digest = sha256_digest(&manifest);
    let layout = work.join("layout");
    let blobs = layout.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs)?;
    for (digest, data) in [
        (&layer_digest, &layer),
        (&config_digest, &config),
        (&manifest_digest, &manifest),
    ] {
        std::fs::write(blobs.join(digest.trim_start_matches("sha256:")), data)?;
    }
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest.len(),
                "annotations": {
                    "io.containerd.image.name": reference,
                    "org.opencontainers.image.ref.name": reference,
                },
            }],
        }))?,
    )?;
    tar(&layout, out, &["oci-layout", "index.json", "blobs"])?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// A static pod of a node agent (kube-proxy, Felix) in the kubelet's `staticPodPath`:
/// the kubelet runs it and publishes its mirror pod, so the agent's readiness,
/// `restartCount` and logs come from the real kubelet.
#[derive(Debug, Clone)]
pub struct StaticPod {
    /// The manifest's file name in `staticPodPath`.
    pub file: String,
    /// The Pod (YAML or JSON).
    pub manifest: String,
}

/// A node agent's process that a real kubelet runs (a static pod's container), as the
/// testbed's faults and readiness see it: found on the node side by its command name
/// (`comm`) in a cgroup below the node's cgroup root, looked at every 200 ms. The
/// kubelet restarts it after an exit (`restartCount` is the kubelet's); SIGKILL
/// ([`PodProcess::kill`]) and SIGSTOP ([`PodProcess::set_paused`]) act on the process
/// itself, as on a real node.
#[derive(Debug)]
pub struct PodProcess {
    comm: String,
    cgroup_marker: String,
    ready: Option<ReadyCheck>,
    state: std::sync::Mutex<PodProcessState>,
    is_ready: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct PodProcessState {
    pid: Option<i32>,
    /// Distinct processes seen.
    starts: u64,
    paused: bool,
}

impl PodProcess {
    /// Watches for process `comm` under the cgroup root `/<cgroup_root>/` from `rt`
    /// (the node netns thread's runtime: `ready` is asked from there). The watch ends
    /// when the returned handle is dropped.
    pub fn start(
        comm: &str,
        cgroup_root: &str,
        ready: Option<ReadyCheck>,
        rt: &tokio::runtime::Handle,
    ) -> Arc<PodProcess> {
        let p = Arc::new(PodProcess {
            comm: comm.to_owned(),
            cgroup_marker: format!("/{cgroup_root}/"),
            ready,
            state: Default::default(),
            is_ready: Default::default(),
        });
        let weak = Arc::downgrade(&p);
        rt.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Some(p) = weak.upgrade() else { return };
                p.look().await;
            }
        });
        p
    }

    async fn look(&self) {
        let found = find_process(&self.comm, &self.cgroup_marker);
        {
            let mut st = self.lock();
            if found.is_some() && found != st.pid {
                st.starts += 1;
                st.paused = false;
            }
            st.pid = found;
        }
        let ok = match (&self.ready, found) {
            (Some(check), Some(_)) if !self.is_paused() => check.ask().await,
            _ => false,
        };
        self.is_ready
            .store(ok, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PodProcessState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its pid now, if it runs.
    pub fn pid(&self) -> Option<i32> {
        self.lock().pid
    }

    /// Whether its readiness check answered 200 at the last look.
    pub fn is_ready(&self) -> bool {
        self.is_ready.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Processes seen after the first (the kubelet's restarts, as seen from the node).
    pub fn restarts(&self) -> u64 {
        self.lock().starts.saturating_sub(1)
    }

    /// SIGKILL, as a crash: the kubelet restarts the container.
    pub fn kill(&self) {
        if let Some(pid) = self.pid() {
            kill_pids(&[pid]);
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`). Idempotent.
    pub fn set_paused(&self, paused: bool) {
        let mut st = self.lock();
        if st.paused == paused {
            return;
        }
        if let Some(pid) = st.pid {
            let sig = if paused {
                nix::sys::signal::Signal::SIGSTOP
            } else {
                nix::sys::signal::Signal::SIGCONT
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
        st.paused = paused;
    }

    /// Whether it is SIGSTOPped now.
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }
}

/// The pid of a process named `comm` whose cgroup path contains `marker`.
fn find_process(comm: &str, marker: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let c = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if c.trim() != comm {
            return None;
        }
        let cg = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
        cg.contains(marker).then_some(pid)
    })
}

/// One real node's configuration.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Node name (`node-<i>`).
    pub node: String,
    /// Node IP (its address on the testbed bridge).
    pub node_ip: Ipv4Addr,
    /// The node's pod block (`spec.podCIDR`).
    pub pod_cidr: String,
    /// Node labels (`--node-labels`).
    pub labels: BTreeMap<String, String>,
    /// `<state>/nodes/<node>`.
    pub dir: PathBuf,
    /// The cgroup root's name (`<netns prefix>-<node>`), one directory below every
    /// hierarchy's root.
    pub cgroup_root: String,
    /// The API server's URL as nodes reach it.
    pub api_url: String,
    /// The testbed CA's directory (`<state>/pki`: `ca.crt`, `ca.key`).
    pub pki_dir: PathBuf,
    /// OCI archives imported into containerd before the kubelet starts (the project's
    /// images and `pause.oci.tar`).
    pub images: Vec<PathBuf>,
    /// containerd's `sandbox_image` (the reference of the imported pause image).
    pub sandbox_image: String,
    /// The testbed daemon's CNI socket (`testbed cni` forwards to it).
    pub cni_socket: PathBuf,
    /// The binaries.
    pub bins: Binaries,
    /// Node agents run as static pods (written before the kubelet starts).
    pub static_pods: Vec<StaticPod>,
}

impl NodeConfig {
    fn containerd_dir(&self) -> PathBuf {
        self.dir.join("containerd")
    }
    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.containerd_dir().join("containerd.sock")
    }
    fn cni_bin_dir(&self) -> PathBuf {
        self.dir.join("cni").join("bin")
    }
    fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni").join("net.d")
    }
    fn kubelet_dir(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    /// The kubelet's static pod directory (`staticPodPath`).
    pub fn static_pod_dir(&self) -> PathBuf {
        self.dir.join("manifests")
    }
    fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }
}

/// containerd's configuration (version 2, containerd 1.6): every path under the node's
/// directory, runc without systemd cgroups, overlayfs, the CNI plugin's directories,
/// the pause image, `restrict_oom_score_adj` (module docs), no metrics or debug
/// listeners.
pub fn containerd_config(c: &NodeConfig) -> String {
    let d = c.containerd_dir();
    let p = |x: &Path| x.display().to_string();
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
oom_score = 0

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"#,
        root = p(&d.join("root")),
        state = p(&d.join("state")),
        sock = p(&c.containerd_socket()),
        opt = p(&d.join("opt")),
        sandbox = c.sandbox_image,
        runc = p(&d.join("runc")),
        cni_bin = p(&c.cni_bin_dir()),
        cni_conf = p(&c.cni_conf_dir()),
    )
}

/// The node's CNI network configuration list (CNI spec 1.0.0): one plugin,
/// [`CNI_PLUGIN`], told the daemon's socket and the node (`testbed` key).
pub fn cni_conflist(c: &NodeConfig) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": CNI_PLUGIN,
            "testbed": {
                "socket": c.cni_socket,
                "node": c.node,
            },
        }],
    }))
    .unwrap_or_default()
}

/// The wrapper containerd runs as the CNI plugin: `testbed cni` with the CNI
/// environment and stdin as given.
pub fn cni_wrapper(testbed: &Path) -> String {
    format!(
        "#!/bin/sh\nexec {} cni \"$@\"\n",
        crate::supervise::shell_quote(&testbed.to_string_lossy())
    )
}

/// The kubelet's `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1). Sources: the
/// Kubernetes "Kubelet Configuration (v1beta1)" reference; the cgroup v1, swap and
/// eviction settings are what these machines need (module docs).
pub fn kubelet_config(c: &NodeConfig) -> String {
    let p = |x: PathBuf| x.display().to_string();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
containerRuntimeEndpoint: unix://{sock}
address: {ip}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
tlsCertFile: {crt}
tlsPrivateKeyFile: {key}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
failSwapOn: false
resolvConf: ""
serializeImagePulls: false
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
staticPodPath: {manifests}
fileCheckFrequency: 5s
podCIDR: {pod_cidr}
podLogsDir: {pod_logs}
clusterDomain: cluster.local
maxPods: 110
containerLogMaxSize: 1Mi
"#,
        cgroup_root = c.cgroup_root,
        sock = c.containerd_socket().display(),
        ip = c.node_ip,
        port = KUBELET_PORT,
        healthz = KUBELET_HEALTHZ_PORT,
        crt = p(c.pki().join("kubelet.crt")),
        key = p(c.pki().join("kubelet.key")),
        ca = p(c.pki().join("ca.crt")),
        manifests = p(c.static_pod_dir()),
        pod_cidr = c.pod_cidr,
        pod_logs = p(c.dir.join("pod-logs")),
    )
}

/// The kubelet's command line.
pub fn kubelet_args(c: &NodeConfig) -> Vec<String> {
    let mut a = vec![
        format!("--config={}", c.kubelet_dir().join("config.yaml").display()),
        format!(
            "--kubeconfig={}",
            c.kubelet_dir().join("kubeconfig").display()
        ),
        format!("--root-dir={}", c.kubelet_dir().join("root").display()),
        format!("--cert-dir={}", c.pki().display()),
        format!("--hostname-override={}", c.node),
        format!("--node-ip={}", c.node_ip),
        "--v=2".to_owned(),
    ];
    if !c.labels.is_empty() {
        let labels: Vec<String> = c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        a.push(format!("--node-labels={}", labels.join(",")));
    }
    a
}

/// Every cgroup hierarchy mounted under `/sys/fs/cgroup` (v1 controllers and the
/// unified v2 one), from `/proc/self/mountinfo`.
pub fn cgroup_hierarchies() -> Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("read mountinfo")?;
    Ok(parse_cgroup_mounts(&info))
}

/// The `cgroup`/`cgroup2` mount points under `/sys/fs/cgroup` of a mountinfo text
/// (proc(5): field 5 is the mount point, the type follows the ` - ` separator).
pub fn parse_cgroup_mounts(mountinfo: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split_whitespace().next().unwrap_or("");
        let Some(mount_point) = left.split_whitespace().nth(4) else {
            continue;
        };
        if matches!(fstype, "cgroup" | "cgroup2") && mount_point.starts_with("/sys/fs/cgroup") {
            let p = PathBuf::from(mount_point);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// Creates `/<name>` in every hierarchy (cpuset's values copied from the parent, which
/// a v1 cpuset child needs before a task can join). Returns the directories made.
/// Errors: the first failing `mkdir` or write.
pub fn create_cgroup_root(name: &str) -> Result<Vec<PathBuf>> {
    let mut made = Vec::new();
    for h in cgroup_hierarchies()? {
        let dir = h.join(name);
        if !dir.exists() {
            std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        }
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let parent = h.join(f);
            if parent.exists() && dir.join(f).exists() {
                let v = std::fs::read_to_string(&parent)
                    .with_context(|| format!("read {}", parent.display()))?;
                std::fs::write(dir.join(f), v.trim())
                    .with_context(|| format!("write {}", dir.join(f).display()))?;
            }
        }
        made.push(dir);
    }
    Ok(made)
}

/// Every PID in `dir` and its descendants' `cgroup.procs`.
fn cgroup_pids(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    pids
}

/// Removes `dir` and every cgroup below it, deepest first (a cgroup directory is
/// removed with `rmdir`; its files go with it). Errors: the first directory that stays
/// (e.g. still holding a process).
pub fn remove_cgroup_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut dirs = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        dirs.push(d);
    }
    // Children were pushed after their parents: remove in reverse.
    for d in dirs.iter().rev() {
        if let Err(e) = std::fs::remove_dir(d) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(e).with_context(|| format!("remove cgroup {}", d.display()));
            }
        }
    }
    Ok(())
}

/// Mount points at or below `dir` in the host mount namespace, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(dir))
        .collect();
    v.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    v.dedup();
    v
}

/// mountinfo's octal escapes (`\040` for a space) decoded.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (b[i], octal) {
            (b'\\', Some(v)) => {
                out.push(v);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// PIDs of `containerd-shim-runc-v2` processes serving a containerd socket at or
/// below `socket` (their command line names it after `-address`).
fn shim_pids(socket: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.ends_with("containerd-shim-runc-v2"));
        if is_shim
            && args
                .windows(2)
                .any(|w| w[0] == "-address" && Path::new(&w[1]).starts_with(socket))
        {
            out.push(pid);
        }
    }
    out
}

fn kill_pids(pids: &[i32]) {
    for p in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Removes what real nodes under `nodes_dir` (`<state>/nodes`) left on the host, for a
/// testbed whose daemon is gone or stopping: every process in the cgroup roots named
/// `<prefix>-node-…`, containerd shims serving a socket under `nodes_dir`, the mounts
/// under it (overlay, shm, netns), the cgroup roots in every hierarchy. Idempotent;
/// failures are logged.
pub fn sweep(nodes_dir: &Path, prefix: &str) {
    let roots: Vec<PathBuf> = cgroup_hierarchies()
        .unwrap_or_default()
        .iter()
        .filter_map(|h| std::fs::read_dir(h).ok())
        .flat_map(|rd| rd.flatten())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&format!("{prefix}-node-")))
                && e.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|e| e.path())
        .collect();
    release(nodes_dir, &roots);
}

/// Kills the processes of `cgroups` and the shims under `dir`, unmounts what is
/// mounted under `dir`, removes the cgroup trees.
fn release(dir: &Path, cgroups: &[PathBuf]) {
    for _ in 0..5 {
        let mut pids: Vec<i32> = cgroups.iter().flat_map(|d| cgroup_pids(d)).collect();
        pids.extend(shim_pids(dir));
        if pids.is_empty() {
            break;
        }
        kill_pids(&pids);
        std::thread::sleep(Duration::from_millis(100));
    }
    for m in mounts_under(dir) {
        if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(mount = %m.display(), error = %e, "unmount");
        }
    }
    for d in cgroups {
        if let Err(e) = remove_cgroup_tree(d) {
            tracing::warn!(error = %format!("{e:#}"), "cgroup");
        }
    }
}

/// One running real node: its containerd and kubelet.
pub struct RealNode {
    cfg: NodeConfig,
    containerd: Arc<Supervised>,
    kubelet: Arc<Supervised>,
    cgroups: Vec<PathBuf>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("node", &self.cfg.node)
            .finish()
    }
}

/// How long [`RealNode::start`] waits for containerd's socket to answer.
pub const CONTAINERD_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes the node's files: containerd's config, the CNI configuration and wrapper,
/// the kubelet's config, kubeconfig and certificates (issued by the testbed CA).
/// Errors: file I/O, certificate issuance.
pub fn write_files(c: &NodeConfig) -> Result<()> {
    for d in [
        c.containerd_dir(),
        c.cni_bin_dir(),
        c.cni_conf_dir(),
        c.kubelet_dir(),
        c.static_pod_dir(),
        c.pki(),
        c.dir.join("pod-logs"),
    ] {
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    std::fs::write(c.containerd_dir().join("config.toml"), containerd_config(c))?;
    std::fs::write(
        c.cni_conf_dir().join(format!("10-{CNI_NETWORK}.conflist")),
        cni_conflist(c),
    )?;
    // The pod network's plugin and the loopback one containerd runs first, both
    // `testbed cni`.
    for name in [CNI_PLUGIN, crate::cni::LOOPBACK] {
        let wrapper = c.cni_bin_dir().join(name);
        std::fs::write(&wrapper, cni_wrapper(&c.bins.testbed))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::write(c.kubelet_dir().join("config.yaml"), kubelet_config(c))?;
    for p in &c.static_pods {
        std::fs::write(c.static_pod_dir().join(&p.file), &p.manifest)?;
    }
    let ca = crate::tls::Ca::load_or_create(&c.pki_dir).context("the testbed CA")?;
    crate::tls::write_pem(&c.pki().join("ca.crt"), &ca.cert_pem, false)?;
    let (crt, key) = ca.issue_serving(
        &format!("{}@kubelet", c.node),
        &[c.node_ip.to_string(), c.node.clone()],
    )?;
    crate::tls::write_pem(&c.pki().join("kubelet.crt"), &crt, false)?;
    crate::tls::write_pem(&c.pki().join("kubelet.key"), &key, true)?;
    let (client_crt, client_key) =
        ca.issue_client(&format!("system:node:{}", c.node), &["system:nodes"])?;
    let ep = crate::client::ClusterEndpoint {
        url: c.api_url.clone(),
        ca_pem: Some(ca.cert_pem.clone()),
        identity: crate::client::ClientIdentity::Certificate {
            cert_pem: client_crt,
            key_pem: client_key,
        },
    };
    std::fs::write(c.kubelet_dir().join("kubeconfig"), ep.kubeconfig_yaml())?;
    Ok(())
}

/// `ctr` against the node's containerd, in the Kubernetes namespace. Errors: spawn, or
/// a non-zero exit (with its stderr).
fn ctr(c: &NodeConfig, args: &[&str]) -> Result<String> {
    let sock = c.containerd_socket();
    let out = std::process::Command::new(&c.bins.ctr)
        .arg("--address")
        .arg(&sock)
        .arg("--namespace")
        .arg(CONTAINERD_K8S_NAMESPACE)
        .args(args)
        .output()
        .with_context(|| format!("run {}", c.bins.ctr.display()))?;
    if !out.status.success() {
        bail!(
            "ctr {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl RealNode {
    /// Starts the node: cgroup root, files, containerd (waits for its socket), the
    /// images imported, then the kubelet (ready when its healthz answers; the Node
    /// registers itself). `rt` is the node netns thread's runtime. Errors: each step,
    /// with the node named; what was started is stopped again.
    pub async fn start(c: NodeConfig, rt: tokio::runtime::Handle) -> Result<RealNode> {
        let cgroups = create_cgroup_root(&c.cgroup_root)
            .with_context(|| format!("cgroup root /{} of {}", c.cgroup_root, c.node))?;
        write_files(&c)?;
        let containerd = {
            let c2 = c.clone();
            Supervised::start(
                &format!("containerd[{}]", c.node),
                rt.clone(),
                move || {
                    Ok(Spec {
                        program: c2.bins.containerd.clone(),
                        args: vec![
                            "--config".into(),
                            c2.containerd_dir()
                                .join("config.toml")
                                .display()
                                .to_string(),
                        ],
                        env: Vec::new(),
                        log: c2.dir.join("containerd.log"),
                        binds: Vec::new(),
                        cgroup: None,
                    })
                },
                None,
            )
            .await?
        };
        let node = RealNode {
            kubelet: Arc::clone(&containerd),
            cfg: c.clone(),
            containerd,
            cgroups,
        };
        // From here on, a failure stops what runs.
        match node.finish_start(rt).await {
            Ok(kubelet) => Ok(RealNode { kubelet, ..node }),
            Err(e) => {
                node.stop().await;
                Err(e)
            }
        }
    }

    async fn finish_start(&self, rt: tokio::runtime::Handle) -> Result<Arc<Supervised>> {
        let c = &self.cfg;
        let t0 = Instant::now();
        loop {
            if c.containerd_socket().exists() && ctr(c, &["version"]).is_ok() {
                break;
            }
            if !self.containerd.is_running() && t0.elapsed() > Duration::from_secs(2) {
                bail!(
                    "containerd of {} exited at start; its log {}:\n{}",
                    c.node,
                    c.dir.join("containerd.log").display(),
                    crate::control_plane::log_tail(&c.dir.join("containerd.log"), 20)
                );
            }
            if t0.elapsed() > CONTAINERD_START_TIMEOUT {
                bail!(
                    "containerd of {} did not answer on {} within {:?}",
                    c.node,
                    c.containerd_socket().display(),
                    CONTAINERD_START_TIMEOUT
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for img in &c.images {
            let path = img.to_string_lossy().into_owned();
            ctr(c, &["images", "import", "--no-unpack", &path])
                .with_context(|| format!("import {} into {}'s containerd", path, c.node))?;
        }
        let c2 = c.clone();
        let kubelet = Supervised::start(
            &format!("kubelet[{}]", c.node),
            rt,
            move || {
                Ok(Spec {
                    program: c2.bins.kubelet.clone(),
                    args: kubelet_args(&c2),
                    env: Vec::new(),
                    log: c2.dir.join("kubelet.log"),
                    binds: Vec::new(),
                    cgroup: None,
                })
            },
            Some(ReadyCheck {
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, KUBELET_HEALTHZ_PORT)),
                path: "/healthz".into(),
            }),
        )
        .await?;
        Ok(kubelet)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.cfg.node
    }

    /// Imports the OCI archive `tar` into the node's containerd. Errors: `ctr`'s.
    pub fn import_image(&self, tar: &Path) -> Result<()> {
        let path = tar.to_string_lossy().into_owned();
        ctr(&self.cfg, &["images", "import", "--no-unpack", &path])
            .with_context(|| format!("import {path} into {}'s containerd", self.cfg.node))
            .map(drop)
    }

    /// Writes `pod` into the kubelet's static pod directory (the kubelet picks it up
    /// within its file check). Errors: file I/O.
    pub fn add_static_pod(&self, pod: &StaticPod) -> Result<()> {
        let path = self.cfg.static_pod_dir().join(&pod.file);
        std::fs::write(&path, &pod.manifest).with_context(|| format!("write {}", path.display()))
    }

    /// Its configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    /// The kubelet process.
    pub fn kubelet(&self) -> &Arc<Supervised> {
        &self.kubelet
    }

    /// The containerd process.
    pub fn containerd(&self) -> &Arc<Supervised> {
        &self.containerd
    }

    /// Stops the kubelet and containerd (as a powered-off node: nothing tidies the pods
    /// up) and keeps them stopped until [`RealNode::resume`].
    pub async fn pause_node(&self) {
        self.kubelet.stop().await;
        self.containerd.stop().await;
    }

    /// Starts containerd and the kubelet again after [`RealNode::pause_node`]. Errors:
    /// the spawns.
    pub async fn resume(&self) -> Result<()> {
        self.containerd.resume().await?;
        self.kubelet.resume().await
    }

    /// Stops everything of this node and removes what it left on the host (module
    /// docs). Best effort: each failure is logged and the rest still done.
    pub async fn stop(&self) {
        self.kubelet.stop().await;
        self.containerd.stop().await;
        // Then the pods' processes and the shims (they outlive containerd), the mounts
        // and the cgroups.
        let (dir, cgroups) = (self.cfg.dir.clone(), self.cgroups.clone());
        let _ = tokio::task::spawn_blocking(move || release(&dir, &cgroups)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NodeConfig {
        NodeConfig {
            node: "node-2".into(),
            node_ip: Ipv4Addr::new(172, 20, 7, 12),
            pod_cidr: "10.7.2.0/24".into(),
            labels: [("os".to_owned(), "debian13".to_owned())].into(),
            dir: "/s/nodes/node-2".into(),
            cgroup_root: "fpabc123-node-2".into(),
            api_url: "https://172.20.7.1:6443".into(),
            pki_dir: "/s/pki".into(),
            images: vec![],
            sandbox_image: "ghcr.io/firstpacket/pause:0.1.0".into(),
            cni_socket: "/s/cni.sock".into(),
            static_pods: Vec::new(),
            bins: Binaries {
                kubelet: "/b/kubelet".into(),
                containerd: "/usr/bin/containerd".into(),
                ctr: "/usr/bin/ctr".into(),
                testbed: "/t/testbed".into(),
            },
        }
    }

    #[test]
    fn containerd_keeps_everything_under_the_node_dir_and_restricts_oom_score_adj() {
        let t = containerd_config(&cfg());
        let v: toml_edit::DocumentMut = t.parse().expect("valid TOML");
        assert_eq!(v["root"].as_str(), Some("/s/nodes/node-2/containerd/root"));
        assert_eq!(
            v["state"].as_str(),
            Some("/s/nodes/node-2/containerd/state")
        );
        assert_eq!(
            v["grpc"]["address"].as_str(),
            Some("/s/nodes/node-2/containerd/containerd.sock")
        );
        let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["restrict_oom_score_adj"].as_bool(), Some(true));
        assert_eq!(cri["netns_mounts_under_state_dir"].as_bool(), Some(true));
        assert_eq!(
            cri["sandbox_image"].as_str(),
            Some("ghcr.io/firstpacket/pause:0.1.0")
        );
        assert_eq!(
            cri["cni"]["bin_dir"].as_str(),
            Some("/s/nodes/node-2/cni/bin")
        );
        let runc = &cri["containerd"]["runtimes"]["runc"]["options"];
        assert_eq!(runc["SystemdCgroup"].as_bool(), Some(false));
        assert_eq!(
            runc["Root"].as_str(),
            Some("/s/nodes/node-2/containerd/runc")
        );
    }

    #[test]
    fn kubelet_runs_on_cgroup_v1_under_its_own_root_with_the_node_ip() {
        let c = cfg();
        let t = kubelet_config(&c);
        let v: serde_json::Value = serde_yaml_ng::from_str(&t).expect("valid YAML");
        assert_eq!(v["failCgroupV1"], false);
        assert_eq!(v["cgroupRoot"], "/fpabc123-node-2");
        assert_eq!(v["cgroupDriver"], "cgroupfs");
        assert_eq!(v["address"], "172.20.7.12");
        assert_eq!(v["readOnlyPort"], 0);
        assert_eq!(v["failSwapOn"], false);
        assert_eq!(
            v["containerRuntimeEndpoint"],
            "unix:///s/nodes/node-2/containerd/containerd.sock"
        );
        assert_eq!(v["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(v["staticPodPath"], "/s/nodes/node-2/manifests");
        let a = kubelet_args(&c);
        for want in [
            "--hostname-override=node-2",
            "--node-ip=172.20.7.12",
            "--node-labels=os=debian13",
            "--kubeconfig=/s/nodes/node-2/kubelet/kubeconfig",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
    }

    #[test]
    fn cni_config_names_the_plugin_socket_and_node() {
        let c = cfg();
        let v: serde_json::Value = serde_json::from_str(&cni_conflist(&c)).unwrap();
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["plugins"][0]["type"], CNI_PLUGIN);
        assert_eq!(v["plugins"][0]["testbed"]["socket"], "/s/cni.sock");
        assert_eq!(v["plugins"][0]["testbed"]["node"], "node-2");
        assert_eq!(
            cni_wrapper(Path::new("/t/test bed")),
            "#!/bin/sh\nexec '/t/test bed' cni \"$@\"\n"
        );
    }

    #[test]
    fn cgroup_mounts_are_read_from_mountinfo() {
        let info = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 25 0:27 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:28 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw
35 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw shared:14 - cgroup cgroup rw,cpu,cpuacct
36 31 0:32 / /sys/fs/cgroup/cpuset rw shared:15 - cgroup cgroup rw,cpuset
90 40 0:50 / /tmp/x/cgroup rw - cgroup cgroup rw,memory
";
        assert_eq!(
            parse_cgroup_mounts(info),
            vec![
                PathBuf::from("/sys/fs/cgroup/unified"),
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                PathBuf::from("/sys/fs/cgroup/cpuset"),
            ]
        );
        assert_eq!(unescape_mountinfo("/a\\040b/c"), "/a b/c");
    }
}
