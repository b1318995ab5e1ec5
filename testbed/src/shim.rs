//! The container shim: turns the current (single-threaded) process into a pod's
//! container and `execve`s the image's binary.
//!
//! The kubelet runs `testbed shim --netns NS --dev-dir DIR --hostname POD -- BIN ARGS…`.
//! The shim, in order:
//! 1. joins the pod's network namespace `/run/netns/NS` (`setns(2)`, `CLONE_NEWNET`);
//! 2. unshares a mount and a UTS namespace and makes every mount private, so nothing it
//!    mounts is visible on the host;
//!    with `--rootfs ROOT` (an OCI image's unpacked root file system) it bind-mounts
//!    ROOT onto itself and mounts `proc` in it; steps 3–4 then mount inside ROOT, and
//!    the service account goes to `/var/run/secrets/kubernetes.io/serviceaccount` in it;
//! 3. bind-mounts the host's `null`, `zero`, `random`, `urandom` and `full` devices onto
//!    empty files the kubelet prepared in `DIR`, then `DIR` over `/dev` — `DIR` also
//!    holds the pod's termination-message file (`/dev/termination-log`, read back by the
//!    kubelet after exit, as the real kubelet bind-mounts a per-container file there) —
//!    and mounts a private tmpfs on `/dev/shm` (mode 1777, 64 MiB: containerd's default
//!    for a pod; libfaketime keeps its semaphore there);
//! 4. optionally mounts a tmpfs on `/run` and bind-mounts `--sa-dir` at
//!    `/run/secrets/kubernetes.io/serviceaccount` (`/var/run` is a symlink to `/run`);
//! 5. sets the hostname to the pod name (a real pod's hostname is its name);
//! 6. with `--clock-offset S` (fault `clock_skew`), unshares a time namespace and
//!    writes `S` as its monotonic and boot-time offsets (`time_namespaces(7)`; the
//!    exec below enters it, Linux ≥ 5.16 for a namespace unshared by the caller);
//! 7. with `--rootfs`, `chroot`s into ROOT: the container sees the image's files only
//!    (and what was mounted into them), as under a container runtime;
//!    with `readOnlyRootFilesystem`, makes every mount read-only except `/dev` and
//!    `/dev/shm` (after step 6: `/proc` turns read-only too);
//! 8. takes the container's identity ([`crate::security::apply`]: capability sets,
//!    supplementary groups, gid, uid, `no_new_privs`);
//! 9. `execvp`s the binary with the environment it was given.
//!
//! It must run before any thread is started: `setns(CLONE_NEWNET)`/`unshare(CLONE_NEWNS)`
//! act on the calling thread only, and `unshare(CLONE_NEWNS)` fails in a multi-threaded
//! process.

use nix::mount::{mount, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Device nodes the shim exposes in a pod's `/dev` (bind mounts of the host's).
pub const POD_DEVICES: [&str; 5] = ["null", "zero", "random", "urandom", "full"];

/// Where the service-account files appear inside a pod (Kubernetes docs, "Configure
/// Service Accounts for Pods").
pub const SERVICE_ACCOUNT_DIR: &str = "/run/secrets/kubernetes.io/serviceaccount";

/// What the shim needs to know; parsed from its command line by the `testbed` binary.
#[derive(Debug, Clone)]
pub struct ShimSpec {
    /// Network namespace name under `/run/netns`.
    pub netns: String,
    /// Prepared directory that becomes the pod's `/dev`.
    pub dev_dir: PathBuf,
    /// Pod name, set as the hostname.
    pub hostname: String,
    /// Optional directory bind-mounted at [`SERVICE_ACCOUNT_DIR`].
    pub sa_dir: Option<PathBuf>,
    /// Identity the container runs with (uid, gid, groups, capabilities).
    pub identity: crate::security::Identity,
    /// Binary to exec (absolute path) and its arguments (without argv\[0\]).
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Offset of the container's `CLOCK_MONOTONIC`/`CLOCK_BOOTTIME` (fault `clock_skew`).
    pub clock_offset: Option<crate::fault::ClockSkew>,
    /// An OCI image's unpacked root file system: the container sees it as `/`
    /// (`program` is then a path inside it).
    pub rootfs: Option<PathBuf>,
    /// An inherited fd (close-on-exec) the shim writes the wall time of its `execve` to
    /// (Unix seconds, text) just before it: the kubelet's `container_started` truth.
    pub exec_fd: Option<i32>,
}

/// Where the service-account files appear inside an image's root file system (the
/// path the kubelet mounts them at; images need not have the `/var/run` → `/run` link).
pub const IMAGE_SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `CLONE_NEWTIME` (linux/sched.h; nix 0.32 has no name for it).
const CLONE_NEWTIME: nix::libc::c_int = 0x80;

/// Size of a pod's `/dev/shm` (containerd's default `shm_size` for a sandbox).
pub const SHM_SIZE: &str = "64m";

/// Errors while entering the pod: each names the step and the path involved.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("open netns {path}: {source}")]
    OpenNetns {
        path: String,
        source: std::io::Error,
    },
    #[error("{step}: {source}")]
    Sys {
        step: String,
        source: nix::errno::Errno,
    },
    #[error("{step}: {source}")]
    Io {
        step: String,
        source: std::io::Error,
    },
    #[error("argument contains a NUL byte: {0:?}")]
    Nul(String),
}

fn sys(step: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> ShimError {
    let step = step.into();
    move |source| ShimError::Sys { step, source }
}

fn bind(src: &Path, dst: &Path, recursive: bool) -> Result<(), ShimError> {
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(sys(format!(
        "bind-mount {} on {}",
        src.display(),
        dst.display()
    )))
}

/// Enters the pod described by `spec` and replaces the process image.
///
/// Returns only on error (on success `execvp` does not return).
pub fn enter_and_exec(spec: &ShimSpec) -> Result<std::convert::Infallible, ShimError> {
    // Prepare every C string before touching namespaces.
    let prog = CString::new(spec.program.as_os_str().as_bytes())
        .map_err(|_| ShimError::Nul(spec.program.display().to_string()))?;
    let mut argv = vec![prog.clone()];
    for a in &spec.args {
        argv.push(CString::new(a.as_bytes()).map_err(|_| ShimError::Nul(a.clone()))?);
    }

    let ns_path = format!("/run/netns/{}", spec.netns);
    let ns = File::open(&ns_path).map_err(|source| ShimError::OpenNetns {
        path: ns_path.clone(),
        source,
    })?;
    setns(&ns, CloneFlags::CLONE_NEWNET).map_err(sys(format!("setns {ns_path}")))?;
    drop(ns);

    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWUTS)
        .map_err(sys("unshare mount+uts namespaces"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(sys("make / private"))?;
    let mkdir = |p: &Path| {
        std::fs::create_dir_all(p).map_err(|source| ShimError::Io {
            step: format!("mkdir {}", p.display()),
            source,
        })
    };
    // An image's root: a mount of its own (so `readOnlyRootFilesystem` can act on it),
    // with the container's /dev, /proc and service account mounted inside.
    let root = match &spec.rootfs {
        Some(r) => {
            bind(r, r, true)?;
            mkdir(&r.join("proc"))?;
            mount(
                Some("proc"),
                &r.join("proc"),
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .map_err(sys(format!("mount proc on {}/proc", r.display())))?;
            r.clone()
        }
        None => PathBuf::from("/"),
    };
    let dev = root.join("dev");
    mkdir(&dev)?;

    for dev in POD_DEVICES {
        let dst = spec.dev_dir.join(dev);
        if !dst.exists() {
            File::create(&dst).map_err(|source| ShimError::Io {
                step: format!("create {}", dst.display()),
                source,
            })?;
        }
        bind(&Path::new("/dev").join(dev), &dst, false)?;
    }
    bind(&spec.dev_dir, &dev, true)?;
    mkdir(&dev.join("shm"))?;
    mount(
        Some("shm"),
        &dev.join("shm"),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("mode=1777,size={SHM_SIZE}").as_str()),
    )
    .map_err(sys("mount tmpfs on /dev/shm"))?;

    if let (Some(sa), Some(_)) = (&spec.sa_dir, &spec.rootfs) {
        let dst = root.join(IMAGE_SERVICE_ACCOUNT_DIR.trim_start_matches('/'));
        mkdir(&dst)?;
        bind(sa, &dst, false)?;
    } else if let Some(sa) = &spec.sa_dir {
        mount(
            Some("tmpfs"),
            "/run",
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=755"),
        )
        .map_err(sys("mount tmpfs on /run"))?;
        std::fs::create_dir_all(SERVICE_ACCOUNT_DIR).map_err(|source| ShimError::Io {
            step: format!("mkdir {SERVICE_ACCOUNT_DIR}"),
            source,
        })?;
        bind(sa, Path::new(SERVICE_ACCOUNT_DIR), false)?;
    }

    nix::unistd::sethostname(&spec.hostname).map_err(sys("sethostname"))?;

    if let Some(skew) = &spec.clock_offset {
        unshare(CloneFlags::from_bits_retain(CLONE_NEWTIME))
            .map_err(sys("unshare time namespace"))?;
        std::fs::write("/proc/self/timens_offsets", skew.timens_offsets()).map_err(|source| {
            ShimError::Io {
                step: format!(
                    "write /proc/self/timens_offsets ({})",
                    skew.timens_offsets().trim()
                ),
                source,
            }
        })?;
    }

    if spec.rootfs.is_some() {
        nix::unistd::chroot(&root).map_err(sys(format!("chroot {}", root.display())))?;
        nix::unistd::chdir("/").map_err(sys("chdir /"))?;
    }

    if spec.identity.read_only_root {
        crate::security::make_root_read_only()
            .map_err(|(step, source)| ShimError::Sys { step, source })?;
    }

    crate::security::apply(&spec.identity)
        .map_err(|(step, source)| ShimError::Sys { step, source })?;

    if let Some(fd) = spec.exec_fd {
        let now = crate::truth::unix_now();
        let text = format!("{now:.6}\n");
        // SAFETY: a plain write of a buffer we own to an fd we were given; a failure
        // only loses the precise stamp (the kubelet then stamps at EOF).
        unsafe {
            nix::libc::write(fd, text.as_ptr().cast(), text.len());
        }
    }
    nix::unistd::execvp(&prog, &argv).map_err(sys(format!("exec {}", spec.program.display())))
}
