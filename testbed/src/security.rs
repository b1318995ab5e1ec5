//! A container's process identity from its pod's `securityContext`, as the real
//! kubelet and container runtime derive it, and the shim-side code that applies it.
//!
//! Sources: Kubernetes API reference (`PodSecurityContext`, `SecurityContext`), the
//! kubelet's `verifyRunAsNonRoot` (pkg/kubelet/kuberuntime, the error texts below) and
//! containerd's default capability set (`oci.WithDefaultCapabilities`), which the CRI
//! starts from before `capabilities.drop`/`add`.
//!
//! The testbed's images are binaries in its bin dir with no `USER` of their own: they
//! run as uid 0, gid 0 unless the spec says otherwise (as an image without `USER`).

use serde_json::Value;

/// Capability names by number (`linux/capability.h`, 0 … 40), without `CAP_`.
pub const CAP_NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// containerd's default set for a non-privileged container: CHOWN, DAC_OVERRIDE,
/// FSETID, FOWNER, MKNOD, NET_RAW, SETGID, SETUID, SETFCAP, SETPCAP,
/// NET_BIND_SERVICE, SYS_CHROOT, KILL, AUDIT_WRITE (`0xa80425fb` as in
/// `/proc/PID/status` `CapEff` of a root container).
pub const DEFAULT_CAPS: u64 = 0xa804_25fb;

/// Every capability this table knows (a privileged container).
pub const ALL_CAPS: u64 = (1u64 << CAP_NAMES.len()) - 1;

/// What the shim applies before `execve`: ids, supplementary groups, the capability
/// set the container keeps (bounding set; also permitted/effective when `uid` is 0)
/// and `no_new_privs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (`supplementalGroups`, then `fsGroup`), without `gid`.
    pub groups: Vec<u32>,
    /// Bit N = capability N kept.
    pub caps: u64,
    /// `PR_SET_NO_NEW_PRIVS` (when `allowPrivilegeEscalation: false`).
    pub no_new_privs: bool,
    /// `readOnlyRootFilesystem: true`: every mount of the container's view read-only
    /// except its `/dev` (which holds the termination-message file).
    pub read_only_root: bool,
}

impl Identity {
    /// Root with the default capabilities (a container without a securityContext).
    pub fn root_default() -> Identity {
        Identity {
            uid: 0,
            gid: 0,
            groups: vec![],
            caps: DEFAULT_CAPS,
            no_new_privs: false,
            read_only_root: false,
        }
    }

    /// The shim's command-line form: `--uid U --gid G [--groups A,B] --caps HEX
    /// [--no-new-privs]`.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--uid".to_owned(),
            self.uid.to_string(),
            "--gid".to_owned(),
            self.gid.to_string(),
            "--caps".to_owned(),
            format!("{:x}", self.caps),
        ];
        if !self.groups.is_empty() {
            let g: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            a.push("--groups".to_owned());
            a.push(g.join(","));
        }
        if self.no_new_privs {
            a.push("--no-new-privs".to_owned());
        }
        if self.read_only_root {
            a.push("--read-only-root".to_owned());
        }
        a
    }
}

/// Capability number of a Kubernetes capability name (`NET_ADMIN`, also `CAP_NET_ADMIN`,
/// any case); `None` when unknown.
pub fn cap_number(name: &str) -> Option<u32> {
    let n = name.to_ascii_uppercase();
    let n = n.strip_prefix("CAP_").unwrap_or(&n);
    CAP_NAMES.iter().position(|c| *c == n).map(|i| i as u32)
}

fn id_field(v: &Value) -> Option<i64> {
    v.as_i64()
}

/// The identity container `container` of `pod` (JSON objects as the API returns them)
/// runs with: container `securityContext` fields override the pod's; `privileged`
/// keeps every capability; otherwise [`DEFAULT_CAPS`], `drop` (`ALL` empties it), then
/// `add` (`ALL` = every capability).
///
/// The user is `runAsUser`, else the image's (`image_user`: an OCI image config's
/// `User`; root for bin-dir binaries); the group is `runAsGroup`, else the image's
/// group when the image's user is used, else 0 (the testbed's images have no
/// `/etc/passwd` to look a group up in).
///
/// Errors (the kubelet reports them as `CreateContainerConfigError`, with the real
/// kubelet's texts, k8s.io/kubernetes `pkg/kubelet/kuberuntime/security_context_others.go`
/// `verifyRunAsNonRoot`): `runAsNonRoot: true` with no `runAsUser` and an image user
/// that is root ("container has runAsNonRoot and image will run as root (pod:
/// "NAME_NS(UID)", container: C)") or not numeric ("… image has non-numeric user (U),
/// cannot verify user is non-root …"), or with `runAsUser: 0` ("container's runAsUser
/// breaks non-root policy …"); an image user given by name without `runAsUser` (no
/// passwd file to resolve it); an id outside 0 … 2³²−2; an unknown capability name.
pub fn container_identity(
    pod: &Value,
    container: &Value,
    image_user: &crate::image::ImageUser,
) -> Result<Identity, String> {
    use crate::image::ImageUser;
    let psc = &pod["spec"]["securityContext"];
    let csc = &container["securityContext"];
    let pick = |key: &str| -> Option<&Value> {
        if !csc[key].is_null() {
            Some(&csc[key])
        } else if !psc[key].is_null() {
            Some(&psc[key])
        } else {
            None
        }
    };
    let meta = &pod["metadata"];
    let who = format!(
        "(pod: \"{}_{}({})\", container: {})",
        meta["name"].as_str().unwrap_or_default(),
        meta["namespace"].as_str().unwrap_or("default"),
        meta["uid"].as_str().unwrap_or_default(),
        container["name"].as_str().unwrap_or_default()
    );
    let to_id = |key: &str, v: &Value| -> Result<u32, String> {
        match id_field(v) {
            Some(n) if (0..u32::MAX as i64).contains(&n) => Ok(n as u32),
            _ => Err(format!(
                "securityContext.{key}: {v} is not a valid id {who}"
            )),
        }
    };
    let run_as_user = pick("runAsUser")
        .map(|v| to_id("runAsUser", v))
        .transpose()?;
    if pick("runAsNonRoot").is_some_and(|v| *v == true) {
        match (run_as_user, image_user) {
            (Some(0), _) => {
                return Err(format!(
                    "container's runAsUser breaks non-root policy {who}"
                ))
            }
            (Some(_), _) | (None, ImageUser::Numeric { uid: 1.., .. }) => {}
            (None, ImageUser::Named(name)) => {
                return Err(format!(
                    "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root {who}"
                ))
            }
            (None, _) => {
                return Err(format!(
                    "container has runAsNonRoot and image will run as root {who}"
                ))
            }
        }
    }
    let (uid, image_gid) = match (run_as_user, image_user) {
        (Some(u), _) => (u, None),
        (None, ImageUser::Numeric { uid, gid }) => (*uid, *gid),
        (None, ImageUser::Unset) => (0, None),
        (None, ImageUser::Named(name)) => {
            return Err(format!(
                "unable to find user {name}: no matching entries in passwd file {who}"
            ))
        }
    };
    let gid = pick("runAsGroup")
        .map(|v| to_id("runAsGroup", v))
        .transpose()?
        .or(image_gid)
        .unwrap_or(0);
    let mut groups = Vec::new();
    for g in psc["supplementalGroups"].as_array().into_iter().flatten() {
        groups.push(to_id("supplementalGroups", g)?);
    }
    if !psc["fsGroup"].is_null() {
        groups.push(to_id("fsGroup", &psc["fsGroup"])?);
    }
    groups.retain(|g| *g != gid);
    groups.dedup();

    let privileged = csc["privileged"] == true;
    let caps = if privileged {
        ALL_CAPS
    } else {
        let mut caps = DEFAULT_CAPS;
        let list = |key: &str| -> Result<Vec<Option<u32>>, String> {
            csc["capabilities"][key]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let name = c.as_str().unwrap_or_default();
                    if name.eq_ignore_ascii_case("ALL") {
                        Ok(None)
                    } else {
                        cap_number(name)
                            .map(Some)
                            .ok_or_else(|| format!("unknown capability {name:?} {who}"))
                    }
                })
                .collect()
        };
        for c in list("drop")? {
            caps &= !c.map_or(ALL_CAPS, |n| 1 << n);
        }
        for c in list("add")? {
            caps |= c.map_or(ALL_CAPS, |n| 1 << n);
        }
        caps
    };
    Ok(Identity {
        uid,
        gid,
        groups,
        caps,
        no_new_privs: csc["allowPrivilegeEscalation"] == false && !privileged,
        read_only_root: csc["readOnlyRootFilesystem"] == true,
    })
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const AT_RECURSIVE: nix::libc::c_uint = 0x8000;

fn mount_setattr(path: &str, recursive: bool, set: u64, clr: u64) -> nix::Result<()> {
    let p = std::ffi::CString::new(path).map_err(|_| nix::errno::Errno::EINVAL)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clr,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr(2) reads `attr` (size given) and the NUL-terminated path.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_mount_setattr,
            nix::libc::AT_FDCWD,
            p.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// `readOnlyRootFilesystem`: makes every mount under `/` of the calling process's
/// (private) mount namespace read-only, then `/dev` (the pod's device and
/// termination-message directory) and `/dev/shm` writable again (both are in a real
/// container too).
/// Call it after the container's mounts are in place. Errors name the step.
pub fn make_root_read_only() -> Result<(), (String, nix::errno::Errno)> {
    mount_setattr("/", true, MOUNT_ATTR_RDONLY, 0)
        .map_err(|e| ("make / read-only (mount_setattr)".to_owned(), e))?;
    mount_setattr("/dev", false, 0, MOUNT_ATTR_RDONLY)
        .map_err(|e| ("make /dev writable (mount_setattr)".to_owned(), e))?;
    mount_setattr("/dev/shm", false, 0, MOUNT_ATTR_RDONLY)
        .map_err(|e| ("make /dev/shm writable (mount_setattr)".to_owned(), e))
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn cap_header() -> CapHeader {
    CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    }
}

/// (effective, permitted, inheritable) of the calling thread.
fn capget() -> nix::Result<(u64, u64, u64)> {
    let hdr = cap_header();
    let mut data = [CapData::default(); 2];
    // SAFETY: capget(2) fills two data structs (version 3).
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_capget,
            &hdr as *const CapHeader,
            data.as_mut_ptr(),
        )
    };
    nix::errno::Errno::result(r)?;
    let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
    Ok((
        join(data[0].effective, data[1].effective),
        join(data[0].permitted, data[1].permitted),
        join(data[0].inheritable, data[1].inheritable),
    ))
}

fn capset(effective: u64, permitted: u64, inheritable: u64) -> nix::Result<()> {
    let hdr = cap_header();
    let split = |v: u64| [(v & 0xffff_ffff) as u32, (v >> 32) as u32];
    let (e, p, i) = (split(effective), split(permitted), split(inheritable));
    let data = [
        CapData {
            effective: e[0],
            permitted: p[0],
            inheritable: i[0],
        },
        CapData {
            effective: e[1],
            permitted: p[1],
            inheritable: i[1],
        },
    ];
    // SAFETY: capset(2) reads one header and two data structs (version 3).
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_capset,
            &hdr as *const CapHeader,
            data.as_ptr(),
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

fn prctl(op: nix::libc::c_int, arg: nix::libc::c_ulong) -> nix::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let r = unsafe {
        nix::libc::prctl(
            op,
            arg,
            0 as nix::libc::c_ulong,
            0 as nix::libc::c_ulong,
            0 as nix::libc::c_ulong,
        )
    };
    nix::errno::Errno::result(r).map(drop)
}

/// Applies `id` to the calling (single-threaded, root) process, as runc does before
/// `execve`: ambient set cleared, bounding set reduced to `id.caps`, inheritable =
/// `id.caps`, supplementary groups, gid, uid (a non-zero uid loses permitted and
/// effective capabilities; after `execve` a root process gets `id.caps` as permitted
/// and effective from the bounding set), then `no_new_privs`. Returns the step that
/// failed.
pub fn apply(id: &Identity) -> Result<(), (String, nix::errno::Errno)> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(CAP_NAMES.len() as u32 - 1);
    let step = |s: &str| {
        let s = s.to_owned();
        move |e| (s, e)
    };
    prctl(
        nix::libc::PR_CAP_AMBIENT,
        nix::libc::PR_CAP_AMBIENT_CLEAR_ALL as nix::libc::c_ulong,
    )
    .map_err(step("clear ambient capabilities"))?;
    for cap in 0..=last {
        if cap >= 64 || id.caps & (1u64 << cap) == 0 {
            prctl(nix::libc::PR_CAPBSET_DROP, cap as nix::libc::c_ulong).map_err(step(
                &format!("drop capability {cap} from the bounding set"),
            ))?;
        }
    }
    // Effective/permitted stay (setgroups/setgid/setuid need them) until setuid drops
    // them; inheritable becomes the kept set.
    let (eff, perm, _) = capget().map_err(step("capget"))?;
    capset(eff, perm, id.caps & perm).map_err(step("capset inheritable"))?;
    let groups: Vec<nix::unistd::Gid> = id
        .groups
        .iter()
        .map(|g| nix::unistd::Gid::from_raw(*g))
        .collect();
    nix::unistd::setgroups(&groups).map_err(step("setgroups"))?;
    let gid = nix::unistd::Gid::from_raw(id.gid);
    nix::unistd::setresgid(gid, gid, gid).map_err(step("setresgid"))?;
    let uid = nix::unistd::Uid::from_raw(id.uid);
    nix::unistd::setresuid(uid, uid, uid).map_err(step("setresuid"))?;
    if id.uid == 0 {
        let keep = id.caps & perm;
        capset(keep, keep, keep).map_err(step("capset"))?;
    }
    if id.no_new_privs {
        prctl(nix::libc::PR_SET_NO_NEW_PRIVS, 1).map_err(step("set no_new_privs"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ImageUser;
    use serde_json::json;

    fn pod(psc: Value, csc: Value) -> (Value, Value) {
        let c = json!({"name": "c", "image": "target-server", "securityContext": csc});
        (
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
                   "spec": {"securityContext": psc, "containers": [c.clone()]}}),
            c,
        )
    }

    #[test]
    fn default_is_root_with_the_runtime_default_capabilities() {
        let (p, c) = pod(json!({}), Value::Null);
        assert_eq!(
            container_identity(&p, &c, &ImageUser::Unset).unwrap(),
            Identity::root_default()
        );
        let names: Vec<&str> = (0..41)
            .filter(|n| DEFAULT_CAPS & (1 << n) != 0)
            .map(|n| CAP_NAMES[n])
            .collect();
        assert_eq!(names.len(), 14, "{names:?}");
        assert!(names.contains(&"NET_RAW") && names.contains(&"AUDIT_WRITE"));
    }

    #[test]
    fn container_overrides_pod_and_drop_all_then_add() {
        let (p, c) = pod(
            json!({"runAsUser": 1000, "runAsGroup": 1000, "supplementalGroups": [5, 1000], "fsGroup": 7}),
            json!({"runAsUser": 65532, "allowPrivilegeEscalation": false,
                   "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}),
        );
        let id = container_identity(&p, &c, &ImageUser::Unset).unwrap();
        assert_eq!((id.uid, id.gid), (65532, 1000));
        assert_eq!(id.groups, vec![5, 7]);
        assert_eq!(id.caps, 1 << 10);
        assert!(id.no_new_privs);
        assert!(id.to_args().contains(&"--no-new-privs".to_owned()));
    }

    #[test]
    fn run_as_non_root_without_user_fails_as_the_kubelet_says() {
        let (p, c) = pod(json!({"runAsNonRoot": true}), Value::Null);
        assert_eq!(
            container_identity(&p, &c, &ImageUser::Unset).unwrap_err(),
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u-1)\", container: c)"
        );
        let (p, c) = pod(json!({"runAsNonRoot": true}), json!({"runAsUser": 0}));
        assert!(container_identity(&p, &c, &ImageUser::Unset)
            .unwrap_err()
            .starts_with("container's runAsUser breaks non-root policy"));
        let (p, c) = pod(json!({"runAsNonRoot": true, "runAsUser": 10}), Value::Null);
        assert_eq!(
            container_identity(&p, &c, &ImageUser::Unset).unwrap().uid,
            10
        );
        let (p, c) = pod(json!({}), json!({"capabilities": {"add": ["NOPE"]}}));
        assert!(container_identity(&p, &c, &ImageUser::Unset).is_err());
    }

    #[test]
    fn the_image_user_runs_unless_run_as_user_overrides_it() {
        let nonroot = ImageUser::Numeric {
            uid: 65532,
            gid: Some(65532),
        };
        let (p, c) = pod(json!({"runAsNonRoot": true}), Value::Null);
        let id = container_identity(&p, &c, &nonroot).unwrap();
        assert_eq!((id.uid, id.gid), (65532, 65532));
        // runAsUser wins, and the image's group goes with the image's user.
        let (p, c) = pod(json!({"runAsUser": 1000}), Value::Null);
        let id = container_identity(&p, &c, &nonroot).unwrap();
        assert_eq!((id.uid, id.gid), (1000, 0));
        let (p, c) = pod(json!({"runAsGroup": 7}), Value::Null);
        let id = container_identity(&p, &c, &nonroot).unwrap();
        assert_eq!((id.uid, id.gid), (65532, 7));
        // Image user root by number, or by name: runAsNonRoot refuses as the kubelet does.
        let (p, c) = pod(json!({"runAsNonRoot": true}), Value::Null);
        let root = ImageUser::Numeric { uid: 0, gid: None };
        assert!(container_identity(&p, &c, &root)
            .unwrap_err()
            .starts_with("container has runAsNonRoot and image will run as root"));
        assert!(container_identity(&p, &c, &ImageUser::Named("app".into()))
            .unwrap_err()
            .starts_with("container has runAsNonRoot and image has non-numeric user (app)"));
        let (p, c) = pod(json!({}), Value::Null);
        assert!(container_identity(&p, &c, &ImageUser::Named("app".into()))
            .unwrap_err()
            .starts_with("unable to find user app"));
    }

    #[test]
    fn privileged_keeps_everything() {
        let (p, c) = pod(
            json!({}),
            json!({"privileged": true, "capabilities": {"drop": ["ALL"]}}),
        );
        assert_eq!(
            container_identity(&p, &c, &ImageUser::Unset).unwrap().caps,
            ALL_CAPS
        );
    }
}
