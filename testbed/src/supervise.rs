//! A real node daemon run and restarted the way a node's process supervisor does it
//! (calico-node runs Felix under runit; the kubelet restarts a crashed kube-proxy
//! container): real Felix and real kube-proxy on the testbed's nodes
//! ([`crate::calico::felix`], [`crate::kube_proxy_real`]).
//!
//! A [`Supervised`] process is spawned from the node's [`crate::netns::NetnsThread`]
//! runtime, so it enters only the node's network namespace (never `ip netns exec`, which
//! remounts `/sys` and hides the cgroup hierarchy), in a process group of its own, with
//! `PR_SET_PDEATHSIG(SIGKILL)` tied to that thread (it dies with the daemon even when
//! the daemon is killed). Optionally it runs in a private mount namespace with bind
//! mounts (Felix's `/var/run/calico`, `/var/lib/calico`, `/etc/calico`) and inside a
//! cgroup (fault `agent_cpu`), both set up by a `/bin/sh` prologue under
//! `unshare --mount --propagation private` before `exec`, so the process keeps its own
//! name (`calico-felix`, `kube-proxy`).
//!
//! Restarts: when the process exits without being asked to, it is started again after
//! a back-off — at once when it had run for [`BACKOFF_RESET`], else 1 s doubling up to
//! [`MAX_BACKOFF`] (runit waits 1 s before restarting a service that ran under a second;
//! the kubelet's CrashLoopBackOff doubles from 10 s — the shorter of the two keeps the
//! testbed's scenarios quick) — and [`Supervised::restarts`] goes up. Stdout and stderr
//! go to `<log>` (truncated at each start, the previous run's kept as `<log>.previous`,
//! as the kubelet keeps a container's current and previous logs).

use anyhow::{anyhow, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A process that ran this long is restarted without waiting.
pub const BACKOFF_RESET: Duration = Duration::from_secs(10);
/// Longest wait before restarting a process that keeps exiting.
pub const MAX_BACKOFF: Duration = Duration::from_secs(16);
/// How long a stop waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often the supervisor looks at its process and asks [`Spec::ready_url`].
const TICK: Duration = Duration::from_millis(200);

/// How to start the process (asked again at every start, so a version change or new
/// faults apply to the next start).
#[derive(Debug, Clone)]
pub struct Spec {
    /// Absolute path of the program.
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Environment (the process gets only this plus `PATH` when given here).
    pub env: Vec<(String, String)>,
    /// Stdout and stderr go here.
    pub log: PathBuf,
    /// `(source, target)` bind mounts made in a private mount namespace first.
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// A cgroup directory (v1 or v2) whose `cgroup.procs` the process joins first.
    pub cgroup: Option<PathBuf>,
}

/// The readiness check of a supervised process: `GET http://addr/path`, 200 = ready.
#[derive(Debug, Clone)]
pub struct ReadyCheck {
    pub addr: std::net::SocketAddr,
    pub path: String,
}

impl ReadyCheck {
    /// Asks once, as the kubelet's HTTP probe does (`User-Agent: kube-probe/…`, 1 s
    /// timeout): whether it answered 200.
    pub async fn ask(&self) -> bool {
        crate::httpc::request(
            self.addr,
            "GET",
            &self.path,
            &[("User-Agent", crate::httpc::KUBE_PROBE_USER_AGENT)],
            b"",
            Duration::from_secs(1),
        )
        .await
        .is_ok_and(|r| r.status == 200)
    }
}

type SpecFn = Box<dyn Fn() -> Result<Spec> + Send + Sync>;

struct Running {
    child: Child,
    started: Instant,
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    /// Whether it should run (false after [`Supervised::stop`]).
    wanted: bool,
    /// Not before this instant (back-off after an unrequested exit).
    next_start: Option<Instant>,
    backoff: Duration,
    /// SIGSTOPped now (fault `agent_pause`).
    paused: bool,
}

/// One supervised process (see the module docs). Share as `Arc`; dropping the last
/// handle ends the supervisor task, and the process with the node's thread.
pub struct Supervised {
    name: String,
    spec: SpecFn,
    ready: Option<ReadyCheck>,
    rt: tokio::runtime::Handle,
    state: Mutex<State>,
    restarts: AtomicU64,
    starts: AtomicU64,
    is_ready: AtomicBool,
    /// The log of the current (last) start.
    log: Mutex<Option<PathBuf>>,
}

impl std::fmt::Debug for Supervised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervised")
            .field("name", &self.name)
            .field("pid", &self.pid())
            .finish()
    }
}

impl Supervised {
    /// Starts `name` (for logs) from `spec` on `rt` (the node netns thread's runtime)
    /// and supervises it there, asking `ready` every 200 ms. Errors: the first start
    /// (the spec or the spawn).
    pub async fn start(
        name: &str,
        rt: tokio::runtime::Handle,
        spec: impl Fn() -> Result<Spec> + Send + Sync + 'static,
        ready: Option<ReadyCheck>,
    ) -> Result<Arc<Supervised>> {
        let s = Arc::new(Supervised {
            name: name.to_owned(),
            spec: Box::new(spec),
            ready,
            rt: rt.clone(),
            state: Mutex::new(State {
                wanted: true,
                backoff: Duration::from_secs(1),
                ..State::default()
            }),
            restarts: AtomicU64::new(0),
            starts: AtomicU64::new(0),
            is_ready: AtomicBool::new(false),
            log: Mutex::new(None),
        });
        s.spawn_now().await?;
        rt.spawn(supervise(Arc::downgrade(&s)));
        Ok(s)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.lock().running.as_ref().map(|r| r.child.id())
    }

    /// Unrequested exits that were restarted (the pod's `restartCount` follows it).
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// The log file of the current (or last) run.
    pub fn log_path(&self) -> Option<PathBuf> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Processes started so far (first start, restarts and starts after a stop).
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Whether the last readiness check answered 200 (false while stopped, paused or
    /// without a check, once the process is gone).
    pub fn is_ready(&self) -> bool {
        self.is_ready.load(Ordering::Relaxed)
    }

    /// Whether the process runs now.
    pub fn is_running(&self) -> bool {
        let mut st = self.lock();
        match st.running.as_mut() {
            Some(r) => matches!(r.child.try_wait(), Ok(None)),
            None => false,
        }
    }

    async fn spawn_now(&self) -> Result<()> {
        let spec = (self.spec)().with_context(|| format!("prepare {}", self.name))?;
        let child = spawn(&self.rt, &spec)
            .await
            .with_context(|| format!("start {} ({})", self.name, spec.program.display()))?;
        tracing::info!(process = %self.name, pid = child.id(), log = %spec.log.display(), "started");
        self.starts.fetch_add(1, Ordering::Relaxed);
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = Some(spec.log.clone());
        let mut st = self.lock();
        st.running = Some(Running {
            child,
            started: Instant::now(),
        });
        st.paused = false;
        st.next_start = None;
        Ok(())
    }

    /// Stops the process (SIGTERM to its group, SIGKILL after [`STOP_GRACE`]) and keeps
    /// it stopped until [`Supervised::resume`]; not a restart.
    pub async fn stop(&self) {
        let running = {
            let mut st = self.lock();
            st.wanted = false;
            st.running.take()
        };
        self.is_ready.store(false, Ordering::Relaxed);
        if let Some(r) = running {
            terminate(r.child).await;
            tracing::info!(process = %self.name, "stopped");
        }
    }

    /// Starts it again after [`Supervised::stop`] (the spec is asked again: a changed
    /// version applies). Errors: the spawn.
    pub async fn resume(&self) -> Result<()> {
        self.lock().wanted = true;
        if self.lock().running.is_some() {
            return Ok(());
        }
        self.spawn_now().await
    }

    /// Kills the process (SIGKILL to its group) as a crash would: the supervisor
    /// restarts it and counts a restart.
    pub fn kill(&self) {
        if let Some(pid) = self.pid() {
            signal_group(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to the process itself (fault
    /// `agent_pause`; children it is waiting on keep running, as with a stopped
    /// Felix). Idempotent.
    pub fn set_paused(&self, paused: bool) {
        let mut st = self.lock();
        if st.paused == paused {
            return;
        }
        if let Some(r) = st.running.as_ref() {
            let sig = if paused {
                nix::sys::signal::Signal::SIGSTOP
            } else {
                nix::sys::signal::Signal::SIGCONT
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(r.child.id() as i32), sig);
        }
        st.paused = paused;
    }

    /// Whether it is SIGSTOPped now.
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// One supervisor step: reap an exited process and restart it when due.
    async fn step(&self) {
        let restart_due = {
            let mut st = self.lock();
            if let Some(r) = st.running.as_mut() {
                if let Ok(Some(status)) = r.child.try_wait() {
                    let ran = r.started.elapsed();
                    tracing::warn!(process = %self.name, %status, ran_s = ran.as_secs_f64(), "exited on its own");
                    st.running = None;
                    st.paused = false;
                    if st.wanted {
                        let wait = if ran >= BACKOFF_RESET {
                            st.backoff = Duration::from_secs(1);
                            Duration::ZERO
                        } else {
                            let w = st.backoff;
                            st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                            w
                        };
                        st.next_start = Some(Instant::now() + wait);
                    }
                }
            }
            st.wanted && st.running.is_none() && st.next_start.is_some_and(|t| Instant::now() >= t)
        };
        if restart_due {
            self.is_ready.store(false, Ordering::Relaxed);
            match self.spawn_now().await {
                Ok(()) => {
                    self.restarts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(process = %self.name, error = %format!("{e:#}"), "restart failed");
                    let mut st = self.lock();
                    let w = st.backoff;
                    st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                    st.next_start = Some(Instant::now() + w);
                }
            }
        }
    }

    async fn check_ready(&self) {
        let Some(check) = &self.ready else { return };
        let alive = {
            let st = self.lock();
            st.running.is_some() && !st.paused
        };
        let ok = alive && check.ask().await;
        self.is_ready.store(ok, Ordering::Relaxed);
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        let mut st = self.lock();
        if let Some(mut r) = st.running.take() {
            if st.paused {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(r.child.id() as i32),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
            signal_group(r.child.id(), nix::sys::signal::Signal::SIGKILL);
            let _ = r.child.wait();
        }
    }
}

async fn supervise(me: Weak<Supervised>) {
    let mut last_ready = Instant::now() - Duration::from_secs(60);
    loop {
        tokio::time::sleep(TICK).await;
        let Some(s) = me.upgrade() else { return };
        s.step().await;
        if last_ready.elapsed() >= TICK {
            last_ready = Instant::now();
            s.check_ready().await;
        }
    }
}

fn signal_group(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-(pid as i32)), sig);
}

/// SIGTERM to the child's group, SIGKILL after [`STOP_GRACE`], reaped.
async fn terminate(mut child: Child) {
    let pid = child.id();
    // A stopped process would not see SIGTERM.
    signal_group(pid, nix::sys::signal::Signal::SIGCONT);
    signal_group(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => break,
            Ok(None) if Instant::now() > deadline => {
                signal_group(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                break;
            }
            Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    signal_group(pid, nix::sys::signal::Signal::SIGKILL);
}

/// The `/bin/sh` prologue: join the cgroup, make the bind mounts, `exec` the program
/// (`$0`, arguments `$@`).
pub fn prologue(spec: &Spec) -> String {
    let q = |p: &Path| shell_quote(&p.to_string_lossy());
    let mut s = String::from("set -e\n");
    if let Some(cg) = &spec.cgroup {
        s.push_str(&format!("echo $$ > {}\n", q(&cg.join("cgroup.procs"))));
    }
    for (src, dst) in &spec.binds {
        s.push_str(&format!("mount --bind {} {}\n", q(src), q(dst)));
    }
    s.push_str("exec \"$0\" \"$@\"\n");
    s
}

/// Single-quotes `s` for `/bin/sh`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Makes `cmd`'s child the leader of its own process group and gets it SIGKILL when the
/// thread that spawns it ends (`PR_SET_PDEATHSIG`), or at once if the daemon already
/// died between fork and exec: spawn it from a thread that lives as long as the child
/// should (a node's or the control plane's netns thread).
pub fn die_with_spawning_thread(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let parent = std::process::id() as i32;
    // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            if nix::unistd::getppid().as_raw() != parent {
                return Err(std::io::Error::other("parent exited"));
            }
            Ok(())
        });
    }
}

/// Spawns `spec` from `rt`'s thread (see the module docs).
async fn spawn(rt: &tokio::runtime::Handle, spec: &Spec) -> Result<Child> {
    if let Some(parent) = spec.log.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    if spec.log.exists() {
        let mut prev = spec.log.clone().into_os_string();
        prev.push(".previous");
        let _ = std::fs::rename(&spec.log, PathBuf::from(prev));
    }
    let log = std::fs::File::create(&spec.log)
        .with_context(|| format!("create {}", spec.log.display()))?;
    for (_, dst) in &spec.binds {
        std::fs::create_dir_all(dst)
            .with_context(|| format!("create the mount point {}", dst.display()))?;
    }
    let mut cmd = if spec.binds.is_empty() && spec.cgroup.is_none() {
        let mut c = Command::new(&spec.program);
        c.args(&spec.args);
        c
    } else {
        let mut c = Command::new("unshare");
        if !spec.binds.is_empty() {
            c.args(["--mount", "--propagation", "private"]);
        }
        c.args(["--", "/bin/sh", "-c", &prologue(spec)])
            .arg(&spec.program)
            .args(&spec.args);
        c
    };
    cmd.env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if !spec.env.iter().any(|(k, _)| k == "PATH") {
        cmd.env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
    }
    die_with_spawning_thread(&mut cmd);
    rt.spawn(async move { cmd.spawn() })
        .await
        .map_err(|e| anyhow!("spawn task: {e}"))?
        .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prologue_joins_the_cgroup_mounts_then_execs() {
        let spec = Spec {
            program: "/x/calico-felix".into(),
            args: vec![],
            env: vec![],
            log: "/tmp/l".into(),
            binds: vec![("/s/run it".into(), "/var/run/calico".into())],
            cgroup: Some("/sys/fs/cgroup/cpu/t/n".into()),
        };
        let p = prologue(&spec);
        let cg = p.find("cgroup.procs").unwrap();
        let mount = p
            .find("mount --bind '/s/run it' '/var/run/calico'")
            .unwrap();
        let exec = p.find("exec \"$0\" \"$@\"").unwrap();
        assert!(cg < mount && mount < exec, "{p}");
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
    }
}
