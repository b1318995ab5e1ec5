//! The real Kubernetes control plane (`testbed up --control-plane real`): etcd,
//! kube-apiserver, kube-controller-manager and kube-scheduler, built from their Go
//! modules by `scripts/control-plane.sh`, run as processes inside the testbed's host
//! network namespace, with the testbed's CA and identities ([`pki`]) and an
//! authorization webhook the testbed serves ([`webhook`]) for `testbed api deny|allow`.
//!
//! Files (all under the state dir; `testbed down` removes them):
//! - `pki/` — the testbed CA (`ca.crt`, `ca.key`, shared with the built-in API server),
//!   kube-apiserver's serving certificate, the ServiceAccount key pair (`sa.key`,
//!   `sa.pub`) and one certificate + key per identity ([`pki::IDENTITIES`]);
//! - `control-plane/` — `etcd/` (data), `<component>.log` and `<component>.pid` for
//!   each of etcd, kube-apiserver, kube-controller-manager, kube-scheduler;
//!   `audit.log` (kube-apiserver's audit log, JSON lines, level Metadata for every
//!   request: who did what, with the response code); `<identity>.kubeconfig`;
//!   `audit-policy.yaml`, `authorization-config.yaml`, `authz-webhook.kubeconfig`.
//!
//! Processes: each runs in its own process group, stdout and stderr into its log, with
//! `PR_SET_PDEATHSIG(SIGKILL)` tied to the thread that spawned it (the control plane's
//! own thread inside the host netns, which lives as long as [`ControlPlane`]), so they
//! die with the daemon even when it is killed; [`sweep`] kills whatever the pid files
//! still name (what `testbed down` calls before removing the namespaces, whose sweep
//! kills every process left in them too).

pub mod daemon;
pub mod pki;
pub mod resources;
pub mod webhook;

use crate::netns::NetnsThread;
use crate::plan::{
    Ipv4Cidr, Plan, AUTHZ_WEBHOOK_PORT, CONTROLLER_MANAGER_PORT, ETCD_CLIENT_PORT, ETCD_PEER_PORT,
    SCHEDULER_PORT,
};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use webhook::DenyList;

/// Env var naming the directory with the control-plane binaries.
pub const BIN_ENV: &str = "FIRSTPACKET_CONTROL_PLANE_BIN";

/// Env var choosing the control plane (`builtin` or `real`) of `testbed up`.
pub const MODE_ENV: &str = "FIRSTPACKET_CONTROL_PLANE";

/// The binaries the real control plane needs in its bin dir.
pub const BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// Which control plane `testbed up` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// The testbed's own API server, scheduler and controllers (starts in milliseconds).
    #[default]
    Builtin,
    /// etcd, kube-apiserver, kube-controller-manager, kube-scheduler from
    /// `scripts/control-plane.sh`.
    Real,
}

impl Mode {
    /// `builtin` / `real`.
    pub fn as_arg(self) -> &'static str {
        match self {
            Mode::Builtin => "builtin",
            Mode::Real => "real",
        }
    }
}

/// Finds the control-plane binaries: `explicit` when given, else
/// `$FIRSTPACKET_CONTROL_PLANE_BIN` when set, else the
/// directory `scripts/control-plane.sh --print` names, the script searched upwards from
/// this executable, from the current directory and from this crate's source. Checks
/// that all of [`BINARIES`] are there. Errors (one line): the dir or a binary is missing
/// — "run `bash scripts/control-plane.sh`".
pub fn locate_binaries(explicit: Option<&Path>) -> Result<PathBuf> {
    let from_env = std::env::var_os(BIN_ENV).filter(|d| !d.is_empty());
    let dir = match explicit
        .map(Path::to_path_buf)
        .or(from_env.map(PathBuf::from))
    {
        Some(d) => d,
        _ => {
            let script = find_script().ok_or_else(|| {
                anyhow!(
                    "the real control plane needs scripts/control-plane.sh (not found above {} or the current directory); set {BIN_ENV} to a directory with {}",
                    std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
                    BINARIES.join(", ")
                )
            })?;
            let out = Command::new("bash")
                .arg(&script)
                .arg("--print")
                .output()
                .with_context(|| format!("run bash {} --print", script.display()))?;
            if !out.status.success() {
                bail!(
                    "bash {} --print failed: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    for b in BINARIES {
        if !dir.join(b).is_file() {
            bail!(
                "the real control plane is not built ({} is missing): run `bash scripts/control-plane.sh` (or set {BIN_ENV})",
                dir.join(b).display()
            );
        }
    }
    Ok(dir)
}

fn find_script() -> Option<PathBuf> {
    let rel = Path::new("scripts").join("control-plane.sh");
    let starts = [
        std::env::current_exe().ok(),
        std::env::current_dir().ok(),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
    ];
    starts
        .into_iter()
        .flatten()
        .flat_map(|s| s.ancestors().map(Path::to_path_buf).collect::<Vec<_>>())
        .map(|d| d.join(&rel))
        .find(|p| p.is_file())
}

/// What the control plane is started with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The testbed's state dir (files go to `pki/` and `control-plane/` in it).
    pub state_dir: PathBuf,
    /// Network namespace every process runs in (the testbed's host netns).
    pub netns: String,
    /// kube-apiserver's `--advertise-address` (the bridge IP): the `kubernetes`
    /// Service's endpoint, a SAN of its certificate.
    pub advertise_ip: Ipv4Addr,
    /// kube-apiserver's secure port on every address of the netns (6443).
    pub api_port: u16,
    /// `--service-cluster-ip-range`; its first address is the `kubernetes` Service's
    /// ClusterIP (a SAN too).
    pub service_cidr: Ipv4Cidr,
    /// Directory with [`BINARIES`].
    pub bin_dir: PathBuf,
    /// kube-controller-manager's `--node-monitor-grace-period` (how long a silent node
    /// stays Ready; real default 50 s, here sized for tests).
    pub node_monitor_grace: Duration,
    /// kube-controller-manager's `--node-monitor-period`.
    pub node_monitor_period: Duration,
    /// Deadline of each readiness wait (etcd health, `/readyz`, each leader election).
    pub ready_timeout: Duration,
}

impl Config {
    /// The configuration for a testbed plan: its host netns, bridge IP, API port and
    /// service CIDR; node-monitor grace 20 s / period 2 s; 120 s readiness deadlines.
    pub fn for_plan(plan: &Plan, bin_dir: &Path) -> Config {
        Config {
            state_dir: plan.state_dir.clone(),
            netns: plan.host_netns.clone(),
            advertise_ip: plan.bridge_ip,
            api_port: plan.api_port,
            service_cidr: crate::api::service_cidr(plan.index),
            bin_dir: bin_dir.to_path_buf(),
            node_monitor_grace: Duration::from_secs(20),
            node_monitor_period: Duration::from_secs(2),
            ready_timeout: Duration::from_secs(120),
        }
    }

    /// `<state>/control-plane`.
    pub fn dir(&self) -> PathBuf {
        self.state_dir.join("control-plane")
    }

    /// `<state>/pki`.
    pub fn pki_dir(&self) -> PathBuf {
        self.state_dir.join("pki")
    }

    /// Log file of a component (`etcd`, `kube-apiserver`, …).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir().join(format!("{component}.log"))
    }

    /// kube-apiserver's audit log (JSON lines, `audit.k8s.io/v1` Events).
    pub fn audit_log_path(&self) -> PathBuf {
        self.dir().join("audit.log")
    }

    /// The kubeconfig of identity `name` ([`pki::IDENTITIES`]).
    pub fn kubeconfig_path(&self, name: &str) -> PathBuf {
        self.dir().join(format!("{name}.kubeconfig"))
    }

    /// `https://<advertise IP>:<port>`: the URL pods, node components and `testbed exec`
    /// use.
    pub fn api_url(&self) -> String {
        format!("https://{}:{}", self.advertise_ip, self.api_port)
    }

    /// The `kubernetes` Service's ClusterIP (first address of the service CIDR).
    pub fn kubernetes_service_ip(&self) -> Ipv4Addr {
        self.service_cidr.nth(1)
    }
}

/// Where an API client of this control plane connects and who it is: the shape the
/// node components' `ClusterEndpoint` takes.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `https://<bridge IP>:6443`.
    pub url: String,
    /// The testbed CA, PEM.
    pub ca_pem: String,
    /// Client certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
    /// The user name kube-apiserver sees (the certificate's CN).
    pub user: String,
}

/// How long a component may take to exit after SIGTERM before it gets SIGKILL.
/// kube-apiserver v1.36.3 stops listening at once on SIGTERM but did not exit within
/// 10 s here (it keeps waiting on long-running requests such as the controllers'
/// watches), so a longer grace would only slow `api restart` down.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// One running component.
struct Proc {
    child: Child,
}

/// The processes of one control plane, shared with its supervisor task.
struct Procs {
    cfg: Config,
    /// Runtime of the thread inside the netns (spawns happen there).
    rt: tokio::runtime::Handle,
    map: Mutex<BTreeMap<&'static str, Proc>>,
    /// Components that should run (started and not stopped on purpose).
    wanted: Mutex<std::collections::BTreeSet<&'static str>>,
    restarts: Mutex<BTreeMap<&'static str, u32>>,
    /// Set once the whole control plane was up: during start a dying component is
    /// an error to report, not something to restart.
    supervising: std::sync::atomic::AtomicBool,
}

impl Procs {
    async fn spawn(&self, component: &'static str) -> Result<()> {
        let bin = self.cfg.bin_dir.join(component);
        let args = component_args(&self.cfg, component);
        let log_path = self.cfg.log_path(component);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .current_dir(self.cfg.dir());
        crate::supervise::die_with_spawning_thread(&mut cmd);
        // Spawned on the thread inside the netns: the child inherits the netns, and
        // PR_SET_PDEATHSIG fires when that thread ends.
        let child = self
            .rt
            .spawn(async move { cmd.spawn() })
            .await
            .map_err(|e| anyhow!("spawn task: {e}"))?
            .with_context(|| format!("start {}", bin.display()))?;
        let pid_file = self.cfg.dir().join(format!("{component}.pid"));
        std::fs::write(&pid_file, child.id().to_string())
            .with_context(|| format!("write {}", pid_file.display()))?;
        tracing::info!(component, pid = child.id(), log = %log_path.display(), "started");
        if let Some(mut old) = self.lock().insert(component, Proc { child }) {
            let _ = old.child.wait(); // an exited predecessor: reap it
        }
        self.wanted().insert(component);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Proc>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wanted(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<&'static str>> {
        self.wanted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops `component`: SIGTERM to its process group, SIGKILL after [`STOP_GRACE`],
    /// reaped. Nothing to do when it is not running.
    async fn stop_one(&self, component: &str) {
        self.wanted().remove(component);
        let Some(mut p) = self.lock().remove(component) else {
            return;
        };
        let pgid = nix::unistd::Pid::from_raw(-(p.child.id() as i32));
        let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            match p.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
                    let _ = p.child.wait();
                    break;
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        // Anything else left in the group (none of these fork, but be sure).
        let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = std::fs::remove_file(self.cfg.dir().join(format!("{component}.pid")));
        tracing::info!(component, "stopped");
    }

    /// Whether `component` runs (started and not exited).
    pub fn is_running(&self, component: &str) -> bool {
        self.lock()
            .get_mut(component)
            .is_some_and(|p| matches!(p.child.try_wait(), Ok(None)))
    }

    /// Restarts a component that exits on its own (as the kubelet restarts static
    /// pods; kube-controller-manager and kube-scheduler exit when they lose their
    /// leader Lease, e.g. while kube-apiserver is stopped), at most every 5 s each;
    /// components stopped on purpose (`api stop`, [`ControlPlane::stop`]) stay
    /// stopped. Ends when the `Procs` is dropped.
    async fn supervise(me: std::sync::Weak<Procs>) {
        let mut last: BTreeMap<&'static str, Instant> = BTreeMap::new();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(p) = me.upgrade() else { return };
            if !p.supervising.load(std::sync::atomic::Ordering::Relaxed) {
                continue;
            }
            for c in BINARIES {
                if !p.wanted().contains(c) || p.is_running(c) {
                    continue;
                }
                if last
                    .get(c)
                    .is_some_and(|t| t.elapsed() < Duration::from_secs(5))
                {
                    continue;
                }
                last.insert(c, Instant::now());
                tracing::warn!(component = c, "exited on its own; restarting");
                match p.spawn(c).await {
                    Ok(()) => {
                        *p.restarts
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .entry(c)
                            .or_default() += 1;
                    }
                    Err(e) => tracing::error!(component = c, error = %e, "restart"),
                }
            }
        }
    }
}

/// The running control plane. Dropping it without [`ControlPlane::stop`] still kills
/// every process (its spawning thread ends, `PR_SET_PDEATHSIG`).
pub struct ControlPlane {
    cfg: Config,
    pki: pki::Files,
    ns: NetnsThread,
    deny: Arc<DenyList>,
    client: Arc<rustls::ClientConfig>,
    procs: Arc<Procs>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("netns", &self.cfg.netns)
            .field("api", &self.cfg.api_url())
            .finish_non_exhaustive()
    }
}

/// Last `n` lines of a log file ("(empty)" / "(unreadable)" otherwise).
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(t) if t.trim().is_empty() => "(empty)".into(),
        Ok(t) => {
            let lines: Vec<&str> = t.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(unreadable: {e})"),
    }
}

fn dur(d: Duration) -> String {
    format!("{}s", d.as_secs().max(1))
}

impl ControlPlane {
    /// Starts the control plane: issues the PKI, serves the authorization webhook,
    /// starts etcd (waits for `/health`), kube-apiserver (waits for `/readyz`), creates
    /// the ClusterRoleBindings of the testbed's identities, starts
    /// kube-controller-manager and kube-scheduler and waits for each to hold its leader
    /// Lease. etcd starts with an empty data dir. Errors: a missing binary, PKI file
    /// I/O, a component that exits or is not ready within [`Config::ready_timeout`]
    /// (the error names its log and quotes its last lines); whatever was started is
    /// stopped again before returning the error.
    pub async fn start(cfg: Config) -> Result<ControlPlane> {
        for b in BINARIES {
            let p = cfg.bin_dir.join(b);
            if !p.is_file() {
                bail!(
                    "{} is missing: run `bash scripts/control-plane.sh`",
                    p.display()
                );
            }
        }
        let dir = cfg.dir();
        let _ = std::fs::remove_dir_all(dir.join("etcd"));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let pki = pki::Files::issue(&cfg).context("issue the control plane's certificates")?;
        pki::write_configs(&cfg, &pki).context("write kubeconfigs and config files")?;
        let client = pki.client_config(pki::BOOTSTRAP)?;
        let ns = NetnsThread::spawn(&cfg.netns)
            .with_context(|| format!("start a thread in netns {}", cfg.netns))?;
        let deny = Arc::new(DenyList::default());
        // `testbed api deny` spares the node components unless `--nodes-too`.
        deny.spare(pki::identity_user(pki::NODE_COMPONENTS));
        let procs = Arc::new(Procs {
            cfg: cfg.clone(),
            rt: ns.handle(),
            map: Mutex::new(BTreeMap::new()),
            wanted: Mutex::new(Default::default()),
            restarts: Mutex::new(BTreeMap::new()),
            supervising: false.into(),
        });
        ns.handle().spawn(Procs::supervise(Arc::downgrade(&procs)));
        let cp = ControlPlane {
            cfg,
            pki,
            ns,
            deny,
            client,
            procs,
        };
        match cp.start_all().await {
            Ok(()) => Ok(cp),
            Err(e) => {
                cp.stop().await;
                Err(e)
            }
        }
    }

    async fn start_all(&self) -> Result<()> {
        let listener = {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, AUTHZ_WEBHOOK_PORT));
            crate::netns::run_in_netns(&self.cfg.netns, move || std::net::TcpListener::bind(addr))
                .and_then(|r| r)
                .with_context(|| format!("bind the authorization webhook on {addr}"))?
        };
        let deny = self.deny.clone();
        self.ns.handle().spawn(async move {
            if let Err(e) = webhook::serve(listener, deny).await {
                tracing::error!(error = %e, "authorization webhook");
            }
        });
        self.spawn("etcd").await?;
        self.wait_etcd().await?;
        self.spawn("kube-apiserver").await?;
        self.wait_apiserver().await?;
        self.bootstrap_rbac().await?;
        self.spawn("kube-controller-manager").await?;
        self.spawn("kube-scheduler").await?;
        self.wait_leader("kube-controller-manager").await?;
        self.wait_leader("kube-scheduler").await?;
        self.procs
            .supervising
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The deny rules the authorization webhook enforces (`testbed api deny|allow`).
    pub fn deny_list(&self) -> &Arc<DenyList> {
        &self.deny
    }

    /// The endpoint of identity `name` ([`pki::IDENTITIES`], e.g. [`pki::ADMIN`],
    /// [`pki::NODE_COMPONENTS`]) at [`Config::api_url`]. Errors: an unknown name.
    pub fn endpoint(&self, name: &str) -> Result<Endpoint> {
        let id = self.pki.identity(name)?;
        Ok(Endpoint {
            url: self.cfg.api_url(),
            ca_pem: self.pki.ca_pem.clone(),
            cert_pem: id.cert_pem.clone(),
            key_pem: id.key_pem.clone(),
            user: id.user.to_owned(),
        })
    }

    /// The endpoint the node components (kubelets, agents, service proxy) use: identity
    /// [`pki::NODE_COMPONENTS`], bound to `cluster-admin`.
    pub fn node_endpoint(&self) -> Endpoint {
        self.endpoint(pki::NODE_COMPONENTS)
            .expect("NODE_COMPONENTS is one of IDENTITIES")
    }

    /// A per-node kubelet identity, `system:node:<node>` in group `system:nodes`, as the
    /// Node authorizer (second in the chain) expects from a real kubelet; issued anew by
    /// the testbed CA on each call. Errors: CA file I/O, generation.
    pub fn node_identity(&self, node: &str) -> Result<Endpoint> {
        let ca = crate::tls::Ca::load_or_create(&self.cfg.pki_dir())?;
        let user = format!("system:node:{node}");
        let (cert_pem, key_pem) = ca.issue_client(&user, &["system:nodes"])?;
        Ok(Endpoint {
            url: self.cfg.api_url(),
            ca_pem: self.pki.ca_pem.clone(),
            cert_pem,
            key_pem,
            user,
        })
    }

    /// A kubelet serving certificate for `node` at `ip` (SANs: the IP and the node
    /// name), signed by the testbed CA, which kube-apiserver checks
    /// (`--kubelet-certificate-authority`) when it calls the kubelet for `kubectl logs`:
    /// `(cert_pem, key_pem)`. Errors: CA file I/O, generation.
    pub fn kubelet_serving_cert(&self, node: &str, ip: Ipv4Addr) -> Result<(String, String)> {
        let ca = crate::tls::Ca::load_or_create(&self.cfg.pki_dir())?;
        Ok(ca.issue_serving(node, &[ip.to_string(), node.to_owned()])?)
    }

    /// Writes a kubeconfig for identity `name` pointing at `server` to `path` (file
    /// paths to the certificates in `pki/`). Errors: unknown identity, file I/O.
    pub fn write_kubeconfig(&self, name: &str, server: &str, path: &Path) -> Result<()> {
        let text = pki::kubeconfig(&self.cfg, &self.pki, name, server)?;
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
    }

    /// The command line of `component` (one of [`BINARIES`]).
    pub fn args(&self, component: &str) -> Vec<String> {
        component_args(&self.cfg, component)
    }

    async fn spawn(&self, component: &'static str) -> Result<()> {
        self.procs.spawn(component).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Proc>> {
        self.procs.lock()
    }

    async fn stop_one(&self, component: &str) {
        self.procs.stop_one(component).await
    }

    /// Whether `component` runs (started and not exited).
    pub fn is_running(&self, component: &str) -> bool {
        self.procs.is_running(component)
    }

    /// Pids of the running components.
    pub fn pids(&self) -> BTreeMap<String, u32> {
        self.lock()
            .iter()
            .map(|(k, p)| (k.to_string(), p.child.id()))
            .collect()
    }

    /// How many times the supervisor restarted `component` after it exited on its own.
    pub fn restarts(&self, component: &str) -> u32 {
        self.procs
            .restarts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(component)
            .copied()
            .unwrap_or(0)
    }

    /// Stops everything (scheduler, controller-manager, API server, etcd; each SIGTERM
    /// then SIGKILL after [`STOP_GRACE`]). Idempotent.
    pub async fn stop(&self) {
        for c in [
            "kube-scheduler",
            "kube-controller-manager",
            "kube-apiserver",
            "etcd",
        ] {
            self.stop_one(c).await;
        }
    }

    /// `testbed api stop`: stops kube-apiserver (etcd and the data stay; every API
    /// connection is refused). Idempotent.
    pub async fn api_stop(&self) {
        self.stop_one("kube-apiserver").await;
    }

    /// `testbed api start`: starts kube-apiserver again (same flags, same etcd) and
    /// waits for `/readyz`. Errors: already running; not ready in time (log tail).
    pub async fn api_start(&self) -> Result<()> {
        if self.is_running("kube-apiserver") {
            bail!("kube-apiserver is already running");
        }
        self.spawn("kube-apiserver").await?;
        self.wait_apiserver().await
    }

    /// `testbed api restart`: [`ControlPlane::api_stop`] then
    /// [`ControlPlane::api_start`]; objects and resourceVersions stay (etcd keeps them).
    pub async fn api_restart(&self) -> Result<()> {
        self.api_stop().await;
        self.api_start().await
    }

    /// `testbed api expire-watches`: compacts etcd at its current revision, then
    /// restarts kube-apiserver so its watch cache starts over: a watch resumed from any
    /// earlier resourceVersion gets 410 Gone ("too old resource version"). Returns the
    /// compacted revision. Errors: etcd's gateway refused; the restart failed.
    pub async fn expire_watches(&self) -> Result<u64> {
        let rev = self.etcd_compact().await?;
        self.api_restart().await?;
        Ok(rev)
    }

    async fn etcd_compact(&self) -> Result<u64> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ETCD_CLIENT_PORT));
        let post = |path: &'static str, body: Value| {
            let body = body.to_string();
            self.ns.handle().spawn(async move {
                crate::httpc::request(
                    addr,
                    "POST",
                    path,
                    &[("Content-Type", "application/json")],
                    body.as_bytes(),
                    Duration::from_secs(10),
                )
                .await
            })
        };
        // The revision is in every response header; a one-key range is cheapest.
        let r = post("/v3/kv/range", json!({"key": "L3JlZ2lzdHJ5", "limit": 1}))
            .await
            .map_err(|e| anyhow!("etcd task: {e}"))?
            .context("etcd range (for the current revision)")?;
        let v: Value = serde_json::from_slice(&r.body).context("etcd range answer")?;
        let rev: u64 = v["header"]["revision"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| v["header"]["revision"].as_u64())
            .ok_or_else(|| anyhow!("etcd range answer has no revision: {v}"))?;
        let r = post(
            "/v3/kv/compaction",
            json!({"revision": rev.to_string(), "physical": true}),
        )
        .await
        .map_err(|e| anyhow!("etcd task: {e}"))?
        .context("etcd compaction")?;
        let body = String::from_utf8_lossy(&r.body);
        if r.status != 200 && !body.contains("compacted") {
            bail!(
                "etcd compaction at revision {rev}: HTTP {}: {body}",
                r.status
            );
        }
        Ok(rev)
    }

    /// Error for a component that failed `what`: names its log and quotes its tail.
    fn failure(&self, component: &str, what: &str) -> anyhow::Error {
        let log = self.cfg.log_path(component);
        anyhow!(
            "{component} {what}; its log {}, last lines:\n{}",
            log.display(),
            log_tail(&log, 20)
        )
    }

    /// Polls `probe` every 200 ms until it returns `Some`, `component` exits, or the
    /// deadline passes (errors name the component's log).
    async fn wait_for<T, F, Fut>(&self, component: &str, what: &str, mut probe: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + self.cfg.ready_timeout;
        loop {
            if let Some(v) = probe().await {
                return Ok(v);
            }
            if !self.is_running(component) {
                return Err(self.failure(component, &format!("exited before {what}")));
            }
            if Instant::now() > deadline {
                return Err(self.failure(
                    component,
                    &format!("not {what} within {:?}", self.cfg.ready_timeout),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_etcd(&self) -> Result<()> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ETCD_CLIENT_PORT));
        self.wait_for("etcd", "healthy", || {
            let h = self.ns.handle();
            async move {
                let r = h
                    .spawn(crate::httpc::request(
                        addr,
                        "GET",
                        "/health",
                        &[],
                        b"",
                        Duration::from_secs(2),
                    ))
                    .await
                    .ok()?
                    .ok()?;
                (r.status == 200 && String::from_utf8_lossy(&r.body).contains("true")).then_some(())
            }
        })
        .await
    }

    async fn wait_apiserver(&self) -> Result<()> {
        self.wait_for("kube-apiserver", "ready (/readyz)", || async {
            let (status, body) = self.request("GET", "/readyz", None).await.ok()?;
            (status == 200 && body.starts_with(b"ok")).then_some(())
        })
        .await
    }

    async fn wait_leader(&self, component: &str) -> Result<String> {
        let path =
            format!("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{component}");
        let what = format!("leader (Lease kube-system/{component})");
        self.wait_for(component, &what, || {
            let path = path.clone();
            async move {
                let (status, body) = self.request("GET", &path, None).await.ok()?;
                if status != 200 {
                    return None;
                }
                let v: Value = serde_json::from_slice(&body).ok()?;
                v["spec"]["holderIdentity"]
                    .as_str()
                    .filter(|h| !h.is_empty())
                    .map(str::to_owned)
            }
        })
        .await
    }

    /// The ClusterRoleBindings of the testbed's identities ([`pki::IDENTITIES`] with a
    /// role), created with the bootstrap identity; existing ones are kept.
    async fn bootstrap_rbac(&self) -> Result<()> {
        for id in pki::IDENTITIES {
            let Some(role) = id.cluster_role else {
                continue;
            };
            let crb = json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": { "name": id.user, "labels": { "app.kubernetes.io/managed-by": "testbed" } },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
                "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": id.user }],
            });
            let (status, body) = self
                .request(
                    "POST",
                    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                    Some(&crb),
                )
                .await
                .with_context(|| format!("create ClusterRoleBinding {}", id.user))?;
            if status != 201 && status != 409 {
                bail!(
                    "create ClusterRoleBinding {} → {role}: HTTP {status}: {}",
                    id.user,
                    String::from_utf8_lossy(&body)
                );
            }
        }
        Ok(())
    }

    /// One HTTPS request to kube-apiserver (`https://127.0.0.1:<port>` inside the netns)
    /// as the bootstrap identity (`system:masters`; the testbed's own use only):
    /// `(status, body)`. Errors: connect, TLS, a timeout (10 s), a malformed answer.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Vec<u8>)> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.cfg.api_port));
        let client = self.client.clone();
        let (method, path) = (method.to_owned(), path.to_owned());
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.ns
            .handle()
            .spawn(async move {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    https_exchange(addr, client, &method, &path, body.as_bytes()),
                )
                .await
                .map_err(|_| anyhow!("{method} {path}: no answer within 10s"))?
            })
            .await
            .map_err(|e| anyhow!("request task: {e}"))?
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Normally stopped already; make sure nothing outlives us.
        self.procs.wanted().clear();
        for (_, mut p) in std::mem::take(&mut *self.lock()) {
            let pgid = nix::unistd::Pid::from_raw(-(p.child.id() as i32));
            let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = p.child.wait();
        }
    }
}

/// HTTP/1.1 over TLS, one request per connection.
async fn https_exchange(
    addr: SocketAddr,
    client: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    let mut tls = tokio_rustls::TlsConnector::from(client)
        .connect(name, tcp)
        .await
        .with_context(|| format!("TLS handshake with {addr}"))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: application/json\r\nContent-Type: application/json\r\nUser-Agent: testbed\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await?;
    tls.write_all(body).await?;
    tls.flush().await?;
    let mut buf = Vec::new();
    match tls.read_to_end(&mut buf).await {
        Ok(_) => {}
        // A peer closing without close_notify: keep what arrived.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => {}
        Err(e) => return Err(anyhow!("read from {addr}: {e}")),
    }
    let r = crate::httpc::parse(addr, &buf).map_err(|e| anyhow!("{e}"))?;
    Ok((r.status, r.body))
}

/// The command line of `component` (one of [`BINARIES`]) for `cfg`.
pub fn component_args(cfg: &Config, component: &str) -> Vec<String> {
    let dir = cfg.dir();
    let pki = cfg.pki_dir();
    let p = |name: &str| pki.join(name).display().to_string();
    let d = |name: &str| dir.join(name).display().to_string();
    let etcd_url = format!("http://127.0.0.1:{ETCD_CLIENT_PORT}");
    let peer_url = format!("http://127.0.0.1:{ETCD_PEER_PORT}");
    let a: Vec<String> = match component {
        "etcd" => vec![
            "--name=testbed".into(),
            format!("--data-dir={}", d("etcd")),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=testbed={peer_url}"),
            "--initial-cluster-state=new".into(),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ],
        "kube-apiserver" => vec![
            format!("--advertise-address={}", cfg.advertise_ip),
            "--bind-address=0.0.0.0".into(),
            format!("--secure-port={}", cfg.api_port),
            format!("--etcd-servers={etcd_url}"),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--authorization-config={}", d("authorization-config.yaml")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!("--service-cluster-ip-range={}", cfg.service_cidr),
            "--endpoint-reconciler-type=lease".into(),
            "--allow-privileged=true".into(),
            format!("--audit-policy-file={}", d("audit-policy.yaml")),
            format!("--audit-log-path={}", d("audit.log")),
            "--audit-log-mode=blocking".into(),
            format!(
                "--kubelet-client-certificate={}",
                p(&format!("{}.crt", pki::APISERVER_KUBELET_CLIENT))
            ),
            format!(
                "--kubelet-client-key={}",
                p(&format!("{}.key", pki::APISERVER_KUBELET_CLIENT))
            ),
            format!("--kubelet-certificate-authority={}", p("ca.crt")),
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            format!("--cert-dir={}", d("apiserver-certs")),
            "--profiling=false".into(),
        ],
        "kube-controller-manager" => {
            let kc = cfg
                .kubeconfig_path(pki::CONTROLLER_MANAGER)
                .display()
                .to_string();
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={CONTROLLER_MANAGER_PORT}"),
                format!("--cert-dir={}", d("controller-manager-certs")),
                "--controllers=*".into(),
                "--leader-elect=true".into(),
                // Both exit when they cannot renew their Lease within the renew
                // deadline: long enough to ride out `testbed api restart` (the
                // supervisor restarts them after a longer `api stop`).
                "--leader-elect-lease-duration=40s".into(),
                "--leader-elect-renew-deadline=35s".into(),
                "--leader-elect-retry-period=2s".into(),
                "--use-service-account-credentials=true".into(),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                "--cluster-name=testbed".into(),
                "--allocate-node-cidrs=false".into(),
                format!("--node-monitor-period={}", dur(cfg.node_monitor_period)),
                format!(
                    "--node-monitor-grace-period={}",
                    dur(cfg.node_monitor_grace)
                ),
                "--profiling=false".into(),
            ]
        }
        "kube-scheduler" => {
            let kc = cfg.kubeconfig_path(pki::SCHEDULER).display().to_string();
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={SCHEDULER_PORT}"),
                format!("--cert-dir={}", d("scheduler-certs")),
                "--leader-elect=true".into(),
                // Both exit when they cannot renew their Lease within the renew
                // deadline: long enough to ride out `testbed api restart` (the
                // supervisor restarts them after a longer `api stop`).
                "--leader-elect-lease-duration=40s".into(),
                "--leader-elect-renew-deadline=35s".into(),
                "--leader-elect-retry-period=2s".into(),
                "--profiling=false".into(),
            ]
        }
        _ => vec![],
    };
    a
}

/// Kills every control-plane process the pid files in `<state>/control-plane` still
/// name (SIGKILL to its process group, only when `/proc/PID/cmdline` still runs that
/// binary, so a recycled pid is left alone) and removes the pid files. For `testbed
/// down` after a crashed daemon; idempotent.
pub fn sweep(state_dir: &Path) {
    let dir = state_dir.join("control-plane");
    for b in BINARIES {
        let f = dir.join(format!("{b}.pid"));
        let Some(pid) = std::fs::read_to_string(&f)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            continue;
        };
        if process_runs(pid, b) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(-pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = std::fs::remove_file(&f);
    }
}

/// Whether `pid` runs a program whose file name is `binary` (first word of
/// `/proc/PID/cmdline`).
pub fn process_runs(pid: i32, binary: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|c| {
            let argv0 = c.split(|&b| b == 0).next()?.to_vec();
            let argv0 = String::from_utf8(argv0).ok()?;
            Some(Path::new(&argv0).file_name()? == binary)
        })
        .unwrap_or(false)
}

/// Pids of processes whose executable is one of [`BINARIES`] in `bin_dir` (any
/// testbed's: for tests checking that nothing outlives `down`).
pub fn processes_from(bin_dir: &Path) -> Vec<(i32, String)> {
    let wanted: Vec<PathBuf> = BINARIES
        .iter()
        .map(|b| bin_dir.join(b).canonicalize().unwrap_or(bin_dir.join(b)))
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            wanted
                .contains(&exe)
                .then(|| (pid, exe.display().to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config {
            state_dir: PathBuf::from("/s"),
            netns: "fpx-host".into(),
            advertise_ip: Ipv4Addr::new(172, 20, 7, 1),
            api_port: 6443,
            service_cidr: "10.201.0.0/18".parse().unwrap(),
            bin_dir: PathBuf::from("/b"),
            node_monitor_grace: Duration::from_secs(20),
            node_monitor_period: Duration::from_secs(2),
            ready_timeout: Duration::from_secs(60),
        }
    }

    fn has(args: &[String], want: &str) -> bool {
        args.iter().any(|a| a == want)
    }

    #[test]
    fn apiserver_flags_carry_the_plan_and_files() {
        let a = component_args(&cfg(), "kube-apiserver");
        assert!(has(&a, "--advertise-address=172.20.7.1"));
        assert!(has(&a, "--secure-port=6443"));
        assert!(has(&a, "--service-cluster-ip-range=10.201.0.0/18"));
        assert!(has(&a, "--etcd-servers=http://127.0.0.1:2379"));
        assert!(has(&a, "--client-ca-file=/s/pki/ca.crt"));
        assert!(has(
            &a,
            "--authorization-config=/s/control-plane/authorization-config.yaml"
        ));
        assert!(has(&a, "--audit-log-path=/s/control-plane/audit.log"));
        assert!(has(&a, "--kubelet-certificate-authority=/s/pki/ca.crt"));
        assert!(has(&a, "--endpoint-reconciler-type=lease"));
        // --authorization-mode cannot be combined with --authorization-config.
        assert!(!a.iter().any(|x| x.starts_with("--authorization-mode")));
        // Admission: kube-apiserver's defaults (no plugin list given).
        assert!(!a.iter().any(|x| x.contains("admission-plugins")));
    }

    #[test]
    fn controller_manager_flags_size_node_lifecycle_for_tests() {
        let a = component_args(&cfg(), "kube-controller-manager");
        assert!(has(&a, "--node-monitor-grace-period=20s"));
        assert!(has(&a, "--node-monitor-period=2s"));
        assert!(has(&a, "--root-ca-file=/s/pki/ca.crt"));
        assert!(has(&a, "--use-service-account-credentials=true"));
        assert!(has(&a, "--controllers=*"));
        assert!(has(&a, "--allocate-node-cidrs=false"));
        assert!(has(
            &a,
            "--kubeconfig=/s/control-plane/kube-controller-manager.kubeconfig"
        ));
        let s = component_args(&cfg(), "kube-scheduler");
        assert!(has(
            &s,
            "--kubeconfig=/s/control-plane/kube-scheduler.kubeconfig"
        ));
        let e = component_args(&cfg(), "etcd");
        assert!(has(&e, "--unsafe-no-fsync=true"));
        assert!(has(&e, "--data-dir=/s/control-plane/etcd"));
    }

    #[test]
    fn config_derives_urls_from_the_plan() {
        let c = cfg();
        assert_eq!(c.api_url(), "https://172.20.7.1:6443");
        assert_eq!(c.kubernetes_service_ip(), Ipv4Addr::new(10, 201, 0, 1));
        let dir = std::env::temp_dir().join(format!("fp-cp-plan-{}", std::process::id()));
        let plan = Plan::new(&dir, 1).unwrap();
        let c = Config::for_plan(&plan, Path::new("/b"));
        assert_eq!(c.advertise_ip, plan.bridge_ip);
        assert_eq!(c.netns, plan.host_netns);
        assert_eq!(c.service_cidr, crate::api::service_cidr(plan.index));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn locate_binaries_names_the_script_when_the_dir_lacks_them() {
        // A directory without the binaries.
        let empty = std::env::temp_dir().join(format!("fp-cp-empty-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let e = locate_binaries(Some(&empty)).unwrap_err().to_string();
        assert!(e.contains("bash scripts/control-plane.sh"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn process_runs_checks_the_binary_name() {
        let me = std::process::id() as i32;
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        assert!(process_runs(me, name));
        assert!(!process_runs(me, "kube-apiserver"));
    }
}
