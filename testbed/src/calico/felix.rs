//! One real Felix per node (docs/design.md §5 "Real node components"): the process,
//! its configuration, and the faults that act on it (docs/design.md §6 "Faults on real
//! agents").
//!
//! The process is `calico-felix` of the node's version ([`super::Builds`]), started by a
//! [`Supervised`] on the node's netns thread in a private mount namespace whose
//! `/var/run/calico`, `/var/lib/calico` and `/etc/calico` are the node's own directories
//! under `STATE/calico/NODE/`, inside the node's CPU cgroup — or, on a real kubelet's
//! node (`--kubelet real`), as that kubelet's `calico-node` static pod
//! ([`FelixNode::start_static`], [`static_pod`]). Configuration comes from
//! the datastore's FelixConfiguration `default` ([`super::datastore`]) plus, per node,
//! the environment calico-node would give it: the Kubernetes datastore through a
//! kubeconfig, `FELIX_FELIXHOSTNAME`, the metrics and health listeners on the node IP
//! (`:9091`, `:9099`), and `FELIX_DebugSkipCTLBCleanup=true` (a Felix built without cgo
//! panics in its start-up BPF clean-up otherwise; felix/bpf/nat/connecttime.go).
//!
//! Faults:
//! - `agent_io: {delay, fail}` — Felix finds its dataplane tools on `PATH`
//!   (felix/environment/feature_detect_linux.go `FindBestBinary` looks up
//!   `iptables-nft-restore`; felix/ipsets/ipsets.go runs `ipset`), so the node's
//!   `STATE/calico/NODE/bin` comes first on its `PATH` with one wrapper per tool
//!   ([`WRAPPED_TOOLS`]) that reads `STATE/calico/NODE/agent-io` at every call, sleeps a
//!   sample of the delay and fails the call with the given probability before running
//!   the real tool. Only writes are slowed: `ipset list`/`nft list` and the `-save`
//!   tools pass through. Felix retries a failed restore with back-off and, after ten
//!   failures in a row, panics and exits (felix/iptables/table.go); the supervisor
//!   restarts it, as calico-node's runit does.
//! - `agent_cpu: {quota}` — the node's cgroup (`cpu` v1 hierarchy, or `cpu.max` on v2)
//!   gets `cpu.cfs_quota_us`/`cpu.cfs_period_us`; the dataplane tools Felix runs inherit
//!   it.
//! - `agent_pause: {every, for}` — SIGSTOP/SIGCONT of the Felix process.
//! - `agent: {restarts: {every}}` — SIGKILL; the supervisor restarts it (the calico-node
//!   pod's `restartCount` counts it; Felix's `process_start_time_seconds` moves).

use crate::fault::DurationDist;
use crate::supervise::{ReadyCheck, Spec, Supervised};
use anyhow::{anyhow, bail, Context, Result};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The dataplane tools wrapped for `agent_io`: (name, arguments that make it a read,
/// which pass through untouched).
pub const WRAPPED_TOOLS: [(&str, &[&str]); 4] = [
    ("iptables-nft-restore", &[]),
    ("ip6tables-nft-restore", &[]),
    (
        "ipset",
        &["list", "-L", "save", "-S", "version", "-v", "--version"],
    ),
    ("nft", &["list", "-j", "--json", "-v", "--version"]),
];

/// Where the system's own tools are looked up (never the wrapper dir).
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What a node's Felix needs to start.
#[derive(Debug, Clone)]
pub struct FelixConfig {
    /// Node name (`FELIX_FELIXHOSTNAME`).
    pub node: String,
    /// The node's IP: metrics and health listen here.
    pub node_ip: Ipv4Addr,
    /// `STATE/calico/NODE`: bind-mounted dirs, wrappers, kubeconfig, logs.
    pub dir: PathBuf,
    /// Kubeconfig (YAML) Felix reaches the API server with.
    pub kubeconfig: String,
    /// The node's CPU cgroup (created by [`NodeCgroup::create`]), if any.
    pub cgroup: Option<NodeCgroup>,
}

/// The CPU cgroup of one node's agent (fault `agent_cpu`): `cpu/testbed-PREFIX/NODE` on
/// a v1 hierarchy, `testbed-PREFIX/NODE` with `cpu.max` on v2. Removed by
/// [`NodeCgroup::remove`] (or [`sweep_cgroups`] after a crash).
#[derive(Debug, Clone)]
pub struct NodeCgroup {
    dir: PathBuf,
    v2: bool,
}

/// The cgroup root the testbed uses: the v1 `cpu` hierarchy when mounted, else the v2
/// unified hierarchy.
fn cgroup_base() -> Option<(PathBuf, bool)> {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Some((v1.to_path_buf(), false));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    v2.join("cgroup.controllers")
        .exists()
        .then(|| (v2.to_path_buf(), true))
}

impl NodeCgroup {
    /// Creates the node's cgroup under `testbed-<prefix>`. Errors: no CPU controller
    /// mounted, or the directories cannot be made.
    pub fn create(prefix: &str, node: &str) -> Result<NodeCgroup> {
        let (base, v2) = cgroup_base().ok_or_else(|| {
            anyhow!(
                "no cgroup CPU controller (neither /sys/fs/cgroup/cpu nor cgroup v2) for agent_cpu"
            )
        })?;
        let parent = base.join(format!("testbed-{prefix}"));
        if v2 {
            // Children get the cpu controller only when their parents delegate it.
            let _ = std::fs::write(base.join("cgroup.subtree_control"), "+cpu");
            std::fs::create_dir_all(&parent)
                .with_context(|| format!("create cgroup {}", parent.display()))?;
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+cpu");
        }
        let dir = parent.join(node);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("create cgroup {}", dir.display()))?;
        Ok(NodeCgroup { dir, v2 })
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CPU cgroup process `pid` is in now (its `cpu` line of `/proc/PID/cgroup` on
    /// v1, the unified path on v2). Errors: the process is gone, no CPU controller.
    pub fn of_process(pid: i32) -> Result<NodeCgroup> {
        let (base, v2) = cgroup_base().ok_or_else(|| anyhow!("no cgroup CPU controller"))?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("read /proc/{pid}/cgroup"))?;
        let path = text
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
                let cpu = if v2 {
                    ctrls.is_empty()
                } else {
                    ctrls.split(',').any(|c| c == "cpu")
                };
                cpu.then(|| path.trim_start_matches('/').to_owned())
            })
            .next()
            .ok_or_else(|| anyhow!("process {pid} has no CPU cgroup"))?;
        Ok(NodeCgroup {
            dir: base.join(path),
            v2,
        })
    }

    /// Sets (`Some((period_us, quota_us))`) or lifts (`None`) the CPU quota. Errors: the
    /// cgroup files.
    pub fn set_quota(&self, q: Option<(u64, u64)>) -> Result<()> {
        let w = |f: &str, v: String| {
            std::fs::write(self.dir.join(f), &v)
                .with_context(|| format!("write {v:?} to {}", self.dir.join(f).display()))
        };
        match (self.v2, q) {
            (false, Some((period, quota))) => {
                // Lower the quota before a shorter period can make it invalid, and so on.
                w("cpu.cfs_quota_us", "-1".into())?;
                w("cpu.cfs_period_us", period.to_string())?;
                w("cpu.cfs_quota_us", quota.to_string())
            }
            (false, None) => w("cpu.cfs_quota_us", "-1".into()),
            (true, Some((period, quota))) => w("cpu.max", format!("{quota} {period}")),
            (true, None) => w("cpu.max", "max 100000".into()),
        }
    }

    /// Removes the cgroup (its processes must be gone: they are moved to the parent
    /// first, in case). Idempotent.
    pub fn remove(&self) {
        remove_cgroup_dir(&self.dir);
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Moves any process left in `dir` to the root cgroup and removes `dir`.
fn remove_cgroup_dir(dir: &Path) {
    if let (Ok(procs), Some((base, _))) = (
        std::fs::read_to_string(dir.join("cgroup.procs")),
        cgroup_base(),
    ) {
        for pid in procs.lines() {
            let _ = std::fs::write(base.join("cgroup.procs"), pid);
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Removes every node cgroup of testbed `prefix` (what `testbed down` does after a
/// crash). Returns the directories that could not be removed.
pub fn sweep_cgroups(prefix: &str) -> Vec<PathBuf> {
    let Some((base, _)) = cgroup_base() else {
        return Vec::new();
    };
    let parent = base.join(format!("testbed-{prefix}"));
    for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            remove_cgroup_dir(&e.path());
        }
    }
    let _ = std::fs::remove_dir(&parent);
    [parent].into_iter().filter(|p| p.exists()).collect()
}

/// The `agent-io` file's line for a delay and a failure probability:
/// `KIND A B FAIL` — `none 0 0 P`, `fixed S 0 P`, `uniform A B P` (seconds),
/// `lognormal MEDIAN SIGMA P` (σ = ln(p99/median)/2.326, as [`DurationDist::sample`]).
pub fn agent_io_line(delay: Option<&DurationDist>, fail: f64) -> String {
    let fail = fail.clamp(0.0, 1.0);
    match delay {
        None => format!("none 0 0 {fail}"),
        Some(DurationDist::Fixed(d)) => format!("fixed {} 0 {fail}", d.as_secs_f64()),
        Some(DurationDist::Uniform(a, b)) => {
            format!("uniform {} {} {fail}", a.as_secs_f64(), b.as_secs_f64())
        }
        Some(DurationDist::Lognormal { median, p99 }) => {
            let m = median.as_secs_f64();
            let sigma = (p99.as_secs_f64() / m).ln() / 2.326_347_874_040_840_8;
            format!("lognormal {m} {sigma} {fail}")
        }
    }
}

/// The wrapper script for `tool` (real binary `real`), reading `conf` (module docs).
pub fn wrapper_script(tool: &str, real: &Path, reads: &[&str], conf: &Path) -> String {
    let q = |s: &str| crate::supervise::shell_quote(s);
    let reads = reads
        .iter()
        .map(|r| {
            format!(
                "  {})\n    exec {} \"$@\" ;;\n",
                q(r),
                q(&real.to_string_lossy())
            )
        })
        .collect::<String>();
    format!(
        "#!/bin/bash\n\
         # testbed fault `agent_io` ({tool}): every dataplane write Felix makes is delayed and\n\
         # may fail, as configured in the node's agent-io file (testbed/src/calico/felix.rs).\n\
         case \"${{1:-}}\" in\n{reads}esac\n\
         conf={conf}\n\
         kind=none; fail=0\n\
         [ -s \"$conf\" ] && {{ read -r kind a b fail < \"$conf\" || true; }}\n\
         if [ \"$kind\" != none ] || [ \"$fail\" != 0 ]; then\n\
         \x20 read -r delay failnow < <(awk -v k=\"$kind\" -v a=\"$a\" -v b=\"$b\" -v f=\"$fail\" -v s=\"$RANDOM$$\" 'BEGIN {{\n\
         \x20   srand(s); d = 0\n\
         \x20   if (k == \"fixed\") d = a\n\
         \x20   else if (k == \"uniform\") d = a + (b - a) * rand()\n\
         \x20   else if (k == \"lognormal\") {{ u = rand(); if (u < 1e-12) u = 1e-12; z = sqrt(-2 * log(u)) * cos(6.283185307179586 * rand()); d = a * exp(b * z); if (d > 86400) d = 86400 }}\n\
         \x20   printf \"%.6f %d\\n\", d, (rand() < f)\n\
         \x20 }}')\n\
         \x20 case \"$delay\" in 0.000000|'') ;; *) sleep \"$delay\" ;; esac\n\
         \x20 if [ \"$failnow\" = 1 ]; then\n\
         \x20   cat > /dev/null 2>&1 || true\n\
         \x20   echo \"{tool}: failed by the testbed's agent_io fault\" >&2\n\
         \x20   exit 1\n\
         \x20 fi\n\
         fi\n\
         exec {real} \"$@\"\n",
        conf = q(&conf.to_string_lossy()),
        real = q(&real.to_string_lossy()),
    )
}

/// Finds `tool` on [`SYSTEM_PATH`].
fn system_tool(tool: &str) -> Option<PathBuf> {
    SYSTEM_PATH
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// Writes the node's wrappers into `DIR/bin` (module docs). Tools missing on this
/// machine get no wrapper. Errors: `iptables-nft-restore` or `ipset` missing (Felix
/// needs them: `scripts/setup.sh` installs Debian's `iptables` and `ipset`), file I/O.
pub fn write_wrappers(dir: &Path) -> Result<()> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("create {}", bin.display()))?;
    let conf = dir.join("agent-io");
    if !conf.exists() {
        std::fs::write(&conf, agent_io_line(None, 0.0) + "\n")?;
    }
    for (tool, reads) in WRAPPED_TOOLS {
        let Some(real) = system_tool(tool) else {
            if matches!(tool, "iptables-nft-restore" | "ipset") {
                bail!("{tool} is not installed: real Felix needs it (run `bash scripts/setup.sh`, or apt-get install iptables ipset)");
            }
            continue;
        };
        let path = bin.join(tool);
        std::fs::write(&path, wrapper_script(tool, &real, reads, &conf))
            .with_context(|| format!("write {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// How a node's Felix runs: supervised by the testbed beside the simulated kubelet, or
/// as a real kubelet's static pod (`--kubelet real`).
#[derive(Debug, Clone)]
pub enum FelixProcess {
    /// [`Supervised`] on the node's netns thread.
    Supervised(Arc<Supervised>),
    /// The `calico-node` static pod's container, run by the real kubelet.
    StaticPod(Arc<crate::realnode::PodProcess>),
}

impl FelixProcess {
    /// Whether Felix's `/readiness` answered 200 at the last look.
    pub fn is_ready(&self) -> bool {
        match self {
            FelixProcess::Supervised(s) => s.is_ready(),
            FelixProcess::StaticPod(p) => p.is_ready(),
        }
    }

    /// Restarts after unrequested exits.
    pub fn restarts(&self) -> u64 {
        match self {
            FelixProcess::Supervised(s) => s.restarts(),
            FelixProcess::StaticPod(p) => p.restarts(),
        }
    }

    /// SIGSTOP / SIGCONT (fault `agent_pause`).
    pub fn set_paused(&self, paused: bool) {
        match self {
            FelixProcess::Supervised(s) => s.set_paused(paused),
            FelixProcess::StaticPod(p) => p.set_paused(paused),
        }
    }

    /// SIGKILL as a crash (fault `agent: {restarts}`): its supervisor (the testbed's,
    /// or the kubelet) starts it again.
    pub fn kill(&self) {
        match self {
            FelixProcess::Supervised(s) => s.kill(),
            FelixProcess::StaticPod(p) => p.kill(),
        }
    }
}

/// One node's real Felix (see the module docs).
pub struct FelixNode {
    cfg: FelixConfig,
    builds: super::Builds,
    version: Arc<Mutex<String>>,
    process: FelixProcess,
}

impl std::fmt::Debug for FelixNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FelixNode")
            .field("node", &self.cfg.node)
            .field("version", &self.version())
            .finish()
    }
}

impl FelixNode {
    /// Prepares the node's directories, kubeconfig and wrappers and starts Felix
    /// `version` on `rt` (the node's netns thread runtime). Errors: the build missing,
    /// file I/O, the spawn.
    pub async fn start(
        cfg: FelixConfig,
        builds: super::Builds,
        version: &str,
        rt: tokio::runtime::Handle,
    ) -> Result<FelixNode> {
        builds.felix(version)?;
        for d in ["run", "lib", "etc", "log"] {
            std::fs::create_dir_all(cfg.dir.join(d))
                .with_context(|| format!("create {}", cfg.dir.join(d).display()))?;
        }
        std::fs::write(cfg.dir.join("kubeconfig"), &cfg.kubeconfig)?;
        write_wrappers(&cfg.dir)?;
        let version = Arc::new(Mutex::new(version.to_owned()));
        let spec = {
            let (cfg, builds, version) = (cfg.clone(), builds.clone(), version.clone());
            move || {
                let v = version.lock().unwrap_or_else(|p| p.into_inner()).clone();
                felix_spec(&cfg, &builds.felix(&v)?)
            }
        };
        let ready = ReadyCheck {
            addr: SocketAddr::from((cfg.node_ip, super::HEALTH_PORT)),
            path: "/readiness".into(),
        };
        let process = Supervised::start(
            &format!("calico-felix[{}]", cfg.node),
            rt,
            spec,
            Some(ready),
        )
        .await?;
        Ok(FelixNode {
            cfg,
            builds,
            version,
            process: FelixProcess::Supervised(process),
        })
    }

    /// Felix `version` as the `calico-node` static pod of `node`'s real kubelet: the
    /// node's directories, kubeconfig and wrappers as in [`FelixNode::start`], the image
    /// (the version's `calico-felix` alone, packed once into `images_dir`) imported into
    /// the node's containerd, the manifest ([`static_pod`]) written; the process is then
    /// found on the node side ([`crate::realnode::PodProcess`]). Errors: the build
    /// missing, packing or importing the image, file I/O.
    pub async fn start_static(
        cfg: FelixConfig,
        builds: super::Builds,
        version: &str,
        node: &crate::realnode::RealNode,
        images_dir: &Path,
        rt: tokio::runtime::Handle,
    ) -> Result<FelixNode> {
        let bin = builds.felix(version)?;
        for d in ["run", "lib", "etc", "log"] {
            std::fs::create_dir_all(cfg.dir.join(d))
                .with_context(|| format!("create {}", cfg.dir.join(d).display()))?;
        }
        std::fs::write(cfg.dir.join("kubeconfig"), &cfg.kubeconfig)?;
        write_wrappers(&cfg.dir)?;
        let image = super::node_image(version);
        let tar = images_dir.join(format!("calico-node-{version}.oci.tar"));
        if !tar.is_file() {
            std::fs::create_dir_all(images_dir)?;
            let tmp = tar.with_extension("tmp");
            crate::realnode::pack_binary_image(&bin, &image, &tmp)
                .with_context(|| format!("pack calico-felix {version} into an image"))?;
            std::fs::rename(&tmp, &tar)?;
        }
        node.import_image(&tar)?;
        node.add_static_pod(&static_pod(&cfg, &bin, &image)?)?;
        let ready = ReadyCheck {
            addr: SocketAddr::from((cfg.node_ip, super::HEALTH_PORT)),
            path: "/readiness".into(),
        };
        let process = crate::realnode::PodProcess::start(
            "calico-felix",
            &node.config().cgroup_root,
            Some(ready),
            &rt,
        );
        Ok(FelixNode {
            cfg,
            builds,
            version: Arc::new(Mutex::new(version.to_owned())),
            process: FelixProcess::StaticPod(process),
        })
    }

    /// The node.
    pub fn node(&self) -> &str {
        &self.cfg.node
    }

    /// The version it runs (or will run at its next start).
    pub fn version(&self) -> String {
        self.version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The builds it starts from.
    pub fn builds(&self) -> &super::Builds {
        &self.builds
    }

    /// Its process.
    pub fn process(&self) -> &FelixProcess {
        &self.process
    }

    /// Felix's log file (the calico-node pod's container log).
    pub fn log_path(&self) -> PathBuf {
        self.cfg.dir.join("log").join("felix.log")
    }

    /// Where Felix writes its endpoint status files (`EndpointStatusPathPrefix` =
    /// `/var/run/calico` inside its mount namespace): `DIR/run/endpoint-status`.
    pub fn endpoint_status_dir(&self) -> PathBuf {
        self.cfg.dir.join("run").join("endpoint-status")
    }

    /// Stops Felix (its calico-node pod is being replaced). Not a restart. A static
    /// pod's Felix is the kubelet's to stop.
    pub async fn stop(&self) {
        if let FelixProcess::Supervised(s) = &self.process {
            s.stop().await;
        }
    }

    /// Starts Felix `version` after [`FelixNode::stop`] (a new calico-node pod).
    /// Errors: that version not built, the spawn.
    pub async fn start_version(&self, version: &str) -> Result<()> {
        self.builds.felix(version)?;
        match &self.process {
            FelixProcess::Supervised(s) => {
                *self.version.lock().unwrap_or_else(|p| p.into_inner()) = version.to_owned();
                s.resume().await
            }
            FelixProcess::StaticPod(_) => {
                bail!("{}: Felix is a static pod of the real kubelet; it is not rolled by the testbed", self.cfg.node)
            }
        }
    }

    /// Fault `agent_cpu` now: `Some((period_us, quota_us))` or `None` (no quota).
    /// Errors: no cgroup for this node, the cgroup files.
    pub fn set_cpu_quota(&self, q: Option<(u64, u64)>) -> Result<()> {
        if let FelixProcess::StaticPod(p) = &self.process {
            // The container's own CPU cgroup (the kubelet made it; a restarted
            // container gets a new one, which the next change of the fault reaches).
            let pid = p
                .pid()
                .ok_or_else(|| anyhow!("agent_cpu: Felix on {} is not running", self.cfg.node))?;
            return NodeCgroup::of_process(pid)?.set_quota(q);
        }
        match &self.cfg.cgroup {
            Some(cg) => cg.set_quota(q),
            None if q.is_none() => Ok(()),
            None => bail!("agent_cpu: {} has no CPU cgroup", self.cfg.node),
        }
    }

    /// Removes the node's cgroup (after the process is gone).
    pub fn remove_cgroup(&self) {
        if let Some(cg) = &self.cfg.cgroup {
            cg.remove();
        }
    }

    /// Fault `agent_io` now: `None` lifts it. Errors: the file.
    pub fn set_io(&self, delay: Option<&DurationDist>, fail: f64) -> Result<()> {
        let conf = self.cfg.dir.join("agent-io");
        let tmp = self.cfg.dir.join("agent-io.tmp");
        std::fs::write(&tmp, agent_io_line(delay, fail) + "\n")?;
        std::fs::rename(&tmp, &conf).with_context(|| format!("write {}", conf.display()))
    }
}

/// Felix as the real kubelet's `calico-node` static pod (`kube-system`, mirror pod
/// `calico-node-NODE`, `k8s-app=calico-node`, the sim's agent pods' name and label):
/// host network, privileged, image `image` (`calico-felix` alone, entrypoint
/// `/calico-felix`), the environment of [`felix_spec`]; the host's `/usr` read-only
/// (its `iptables-nft-restore`, `ipset`, `nft` and the wrappers' shell) and
/// `/etc/alternatives` (Debian's `iptables` link), the node's
/// directory at the same path (kubeconfig, wrappers, `agent-io`), its `run`, `lib`,
/// `etc` at `/var/run/calico`, `/var/lib/calico`, `/etc/calico`; ready when
/// `/readiness` answers on the node IP. (`agent_cpu` then acts on the container's own
/// CPU cgroup: [`FelixNode::set_cpu_quota`].)
pub fn static_pod(
    cfg: &FelixConfig,
    bin: &Path,
    image: &str,
) -> Result<crate::realnode::StaticPod> {
    let spec = felix_spec(cfg, bin)?;
    let env: Vec<serde_json::Value> = spec
        .env
        .iter()
        .map(|(k, v)| serde_json::json!({ "name": k, "value": v }))
        .collect();
    let d = cfg.dir.display().to_string();
    let mounts = vec![
        serde_json::json!({ "name": "usr", "mountPath": "/usr", "readOnly": true }),
        serde_json::json!({ "name": "modules", "mountPath": "/lib/modules", "readOnly": true }),
        serde_json::json!({ "name": "alternatives", "mountPath": "/etc/alternatives", "readOnly": true }),
        serde_json::json!({ "name": "node", "mountPath": d }),
        serde_json::json!({ "name": "run", "mountPath": "/var/run/calico" }),
        serde_json::json!({ "name": "lib", "mountPath": "/var/lib/calico" }),
        serde_json::json!({ "name": "etc", "mountPath": "/etc/calico" }),
    ];
    let host = |name: &str, path: String| serde_json::json!({ "name": name, "hostPath": { "path": path } });
    let volumes = vec![
        host("usr", "/usr".into()),
        host("modules", "/lib/modules".into()),
        // Debian's `iptables` is an alternatives link (Felix asks it its version).
        host("alternatives", "/etc/alternatives".into()),
        host("node", d.clone()),
        host("run", cfg.dir.join("run").display().to_string()),
        host("lib", cfg.dir.join("lib").display().to_string()),
        host("etc", cfg.dir.join("etc").display().to_string()),
    ];
    let command = serde_json::json!(["/calico-felix"]);
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "calico-node",
            "namespace": "kube-system",
            "labels": { "k8s-app": "calico-node" },
        },
        "spec": {
            "hostNetwork": true,
            "priorityClassName": "system-node-critical",
            "containers": [{
                "name": "calico-node",
                "image": image,
                "imagePullPolicy": "Never",
                "command": command,
                "env": env,
                "ports": [{ "name": "http-metrics", "containerPort": super::METRICS_PORT, "hostPort": super::METRICS_PORT, "protocol": "TCP" }],
                "securityContext": { "privileged": true },
                "readinessProbe": {
                    "httpGet": { "host": cfg.node_ip.to_string(), "path": "/readiness", "port": super::HEALTH_PORT },
                    "periodSeconds": 1,
                },
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    });
    Ok(crate::realnode::StaticPod {
        file: "calico-node.json".to_owned(),
        manifest: serde_json::to_string_pretty(&pod)?,
    })
}

/// The process spec of Felix `bin` for node `cfg` (module docs).
fn felix_spec(cfg: &FelixConfig, bin: &Path) -> Result<Spec> {
    let d = &cfg.dir;
    let ip = cfg.node_ip.to_string();
    let env = [
        ("PATH", format!("{}:{SYSTEM_PATH}", d.join("bin").display())),
        ("KUBECONFIG", d.join("kubeconfig").display().to_string()),
        ("FELIX_DATASTORETYPE", "kubernetes".into()),
        ("FELIX_FELIXHOSTNAME", cfg.node.clone()),
        ("FELIX_IPTABLESBACKEND", "NFT".into()),
        ("FELIX_DebugSkipCTLBCleanup", "true".into()),
        ("FELIX_PROMETHEUSMETRICSENABLED", "true".into()),
        ("FELIX_PROMETHEUSMETRICSHOST", ip.clone()),
        (
            "FELIX_PROMETHEUSMETRICSPORT",
            super::METRICS_PORT.to_string(),
        ),
        ("FELIX_HEALTHENABLED", "true".into()),
        ("FELIX_HEALTHHOST", ip),
        ("FELIX_HEALTHPORT", super::HEALTH_PORT.to_string()),
        ("FELIX_ENDPOINTSTATUSPATHPREFIX", "/var/run/calico".into()),
        ("FELIX_LOGFILEPATH", "none".into()),
        ("FELIX_LOGSEVERITYSYS", "none".into()),
        ("FELIX_LOGSEVERITYSCREEN", "info".into()),
        ("FELIX_USAGEREPORTINGENABLED", "false".into()),
    ];
    Ok(Spec {
        program: bin.to_path_buf(),
        args: Vec::new(),
        env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        log: d.join("log").join("felix.log"),
        binds: vec![
            (d.join("run"), PathBuf::from("/var/run/calico")),
            (d.join("lib"), PathBuf::from("/var/lib/calico")),
            (d.join("etc"), PathBuf::from("/etc/calico")),
        ],
        cgroup: cfg.cgroup.as_ref().map(|c| c.dir().to_path_buf()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn agent_io_lines_carry_the_distribution_in_seconds() {
        assert_eq!(agent_io_line(None, 0.0), "none 0 0 0");
        assert_eq!(
            agent_io_line(
                Some(&DurationDist::Fixed(Duration::from_millis(1500))),
                0.25
            ),
            "fixed 1.5 0 0.25"
        );
        assert_eq!(
            agent_io_line(
                Some(&DurationDist::Uniform(
                    Duration::from_secs(1),
                    Duration::from_secs(2)
                )),
                2.0
            ),
            "uniform 1 2 1"
        );
        let l = agent_io_line(
            Some(&DurationDist::Lognormal {
                median: Duration::from_secs(1),
                p99: Duration::from_secs(10),
            }),
            0.0,
        );
        let sigma: f64 = l.split(' ').nth(2).unwrap().parse().unwrap();
        assert!((sigma - 10f64.ln() / 2.326_347_874).abs() < 1e-6, "{l}");
    }

    /// Runs the generated wrapper around `/bin/echo` and `/bin/cat`: a fixed delay is
    /// slept, a certain failure fails without running the tool, reads pass through.
    #[test]
    fn the_wrapper_delays_fails_and_passes_reads_through() {
        let dir = std::env::temp_dir().join(format!("fp-agentio-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("agent-io");
        let script = dir.join("tool");
        std::fs::write(
            &script,
            wrapper_script("tool", Path::new("/bin/echo"), &["list"], &conf),
        )
        .unwrap();
        let run = |args: &[&str]| {
            let t = std::time::Instant::now();
            let out = std::process::Command::new("bash")
                .arg(&script)
                .args(args)
                .output()
                .unwrap();
            (out, t.elapsed())
        };
        std::fs::write(&conf, agent_io_line(None, 0.0)).unwrap();
        let (out, _) = run(&["hello"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
        std::fs::write(
            &conf,
            agent_io_line(Some(&DurationDist::Fixed(Duration::from_millis(300))), 0.0),
        )
        .unwrap();
        let (out, took) = run(&["hi"]);
        assert!(out.status.success());
        assert!(took >= Duration::from_millis(300), "{took:?}");
        let (_, took) = run(&["list"]);
        assert!(
            took < Duration::from_millis(300),
            "reads are not delayed: {took:?}"
        );
        std::fs::write(&conf, agent_io_line(None, 1.0)).unwrap();
        let (out, _) = run(&["x"]);
        assert!(!out.status.success());
        assert!(out.stdout.is_empty());
        assert!(String::from_utf8_lossy(&out.stderr).contains("agent_io"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
