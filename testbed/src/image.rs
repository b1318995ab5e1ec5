//! Container images for the testbed kubelet (docs/design.md §6 pod-spec contract).
//!
//! A pod's image reference resolves, in this order, to
//! 1. an OCI image in the testbed's image directory (`testbed up --image-dir DIR`):
//!    every OCI image layout in `DIR` or one level below it (a directory with an
//!    `oci-layout` file and an `index.json`, as `bash scripts/image.sh` writes) whose
//!    index names a manifest with the reference (`io.containerd.image.name` or
//!    `org.opencontainers.image.ref.name`, compared after Docker's normalisation:
//!    `docker.io/library/` for bare names, `:latest` when no tag), or, for a reference
//!    by digest (`NAME@sha256:…`), the manifest with that digest under that name. The
//!    image's layers are checked against their digests and unpacked (GNU `tar`, in
//!    order, whiteouts not applied) once per manifest into the state directory; the
//!    config's `Entrypoint`, `Cmd`, `Env` and `User` then run with the pod's
//!    `command`/`args`/`env` as a container runtime combines them (Kubernetes docs,
//!    "Define a Command and Arguments for a Container"). The container's status
//!    reports `imageID` `NAME@sha256:<manifest digest>`, as the real kubelet does;
//! 2. for a reference on a registry on this machine's loopback (`127.0.0.1:PORT/…`,
//!    `localhost:PORT/…`, e.g. `crane registry serve`): the image pulled from it over
//!    plain HTTP ([`pull_and_unpack`]), and run as in 1; a failed pull is `ErrImagePull`
//!    (no fallback: a real node would not find a binary by name either);
//! 3. the local binary named by the reference's last path component without `:tag` or
//!    `@digest` in the bin dir (`target-server`, `prober`), run as root;
//! 4. nothing: `ErrImagePull`.
//!
//! An OCI image's process runs `chroot`ed into the unpacked root file system, with the
//! pod's `/dev` (and `/dev/shm`), `/proc` and the service account
//! (`/var/run/secrets/kubernetes.io/serviceaccount`) mounted in it ([`crate::shim`]);
//! no `/etc/hosts` or `/etc/resolv.conf` is provided (the testbed has no cluster DNS).
//! The unpacked tree is shared by the image's containers (mount-point directories are
//! created in it once). Bin-dir binaries keep the host's file system.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// Errors reading an image directory or an image in it (reported as `ErrImagePull`).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    Invalid { path: String, msg: String },
    #[error("blob {digest}: content has digest {actual}")]
    DigestMismatch { digest: String, actual: String },
    #[error("unpack layer {digest}: {msg}")]
    Unpack { digest: String, msg: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn invalid(path: &Path, msg: impl Into<String>) -> ImageError {
    ImageError::Invalid {
        path: path.display().to_string(),
        msg: msg.into(),
    }
}

/// An image reference split as Docker normalises it (`nginx` →
/// `docker.io/library/nginx:latest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry and repository, e.g. `ghcr.io/firstpacket/target-server`.
    pub name: String,
    /// Tag (`latest` when neither tag nor digest was given).
    pub tag: Option<String>,
    /// `sha256:…` when given.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses `[REGISTRY/]REPO[:TAG][@DIGEST]` (distribution/reference's grammar, without
    /// checking every character). `None` for an empty name.
    pub fn parse(s: &str) -> Option<Reference> {
        let s = s.trim();
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d.to_owned())),
            None => (s, None),
        };
        // A tag is the part after the last ':' that follows the last '/'.
        let slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[slash..].rfind(':') {
            Some(i) => (&rest[..slash + i], Some(rest[slash + i + 1..].to_owned())),
            None => (rest, None),
        };
        if name.is_empty() || tag.as_deref() == Some("") {
            return None;
        }
        let first = name.split('/').next().unwrap_or_default();
        let has_domain = name.contains('/')
            && (first.contains('.') || first.contains(':') || first == "localhost");
        let mut name = if has_domain {
            name.to_owned()
        } else {
            format!("docker.io/{name}")
        };
        if name.starts_with("docker.io/") && name.matches('/').count() == 1 {
            name = name.replacen("docker.io/", "docker.io/library/", 1);
        }
        let tag = match (tag, &digest) {
            (None, None) => Some("latest".to_owned()),
            (t, _) => t,
        };
        Some(Reference { name, tag, digest })
    }
}

/// An image found in the image directory, ready to run.
#[derive(Debug, Clone)]
pub struct OciImage {
    /// `NAME@sha256:…` (the container status's `imageID`).
    pub image_id: String,
    /// Manifest digest, `sha256:…`.
    pub digest: String,
    /// The unpacked root file system.
    pub rootfs: PathBuf,
    /// The image config's `Entrypoint`, `Cmd`, `Env` (`K=V`) and `User`.
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub user: String,
}

/// The image user as the runtime reads `User`: `UID[:GID]` numeric, or a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageUser {
    /// No `User` (root).
    Unset,
    Numeric {
        uid: u32,
        gid: Option<u32>,
    },
    /// A user or group given by name (needs `/etc/passwd` in the image).
    Named(String),
}

impl ImageUser {
    /// Parses a config's `User` field (`""`, `65532`, `65532:65532`, `nobody`).
    pub fn parse(s: &str) -> ImageUser {
        let s = s.trim();
        if s.is_empty() {
            return ImageUser::Unset;
        }
        let (u, g) = match s.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (s, None),
        };
        match (u.parse::<u32>(), g.map(str::parse::<u32>)) {
            (Ok(uid), None) => ImageUser::Numeric { uid, gid: None },
            (Ok(uid), Some(Ok(gid))) => ImageUser::Numeric {
                uid,
                gid: Some(gid),
            },
            _ => ImageUser::Named(s.to_owned()),
        }
    }
}

fn read_json(path: &Path) -> Result<Value, ImageError> {
    let text = std::fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&text).map_err(|e| invalid(path, e.to_string()))
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Path of blob `digest` in layout `layout`, refusing anything but `sha256:<64 hex>`.
fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf, ImageError> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| invalid(layout, format!("unsupported digest {digest:?}")))?;
    Ok(layout.join("blobs").join("sha256").join(hex))
}

/// Reads blob `digest` and checks its content against the digest.
fn read_blob(layout: &Path, digest: &str) -> Result<Vec<u8>, ImageError> {
    let p = blob_path(layout, digest)?;
    let data = std::fs::read(&p).map_err(io_err(&p))?;
    let actual = sha256_digest(&data);
    if actual != digest {
        return Err(ImageError::DigestMismatch {
            digest: digest.to_owned(),
            actual,
        });
    }
    Ok(data)
}

/// OCI layouts in `dir` and in its direct subdirectories.
fn layouts(dir: &Path) -> Vec<PathBuf> {
    let is_layout = |p: &Path| p.join("oci-layout").is_file() && p.join("index.json").is_file();
    let mut out = Vec::new();
    if is_layout(dir) {
        out.push(dir.to_path_buf());
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut subs: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| is_layout(p))
            .collect();
        subs.sort();
        out.extend(subs);
    }
    out
}

/// The manifest descriptor of `want` in layout `layout`'s index, if any.
fn find_in_layout(layout: &Path, want: &Reference) -> Result<Option<Value>, ImageError> {
    let index = read_json(&layout.join("index.json"))?;
    for desc in index["manifests"].as_array().into_iter().flatten() {
        let ann = &desc["annotations"];
        let names = [
            "io.containerd.image.name",
            "org.opencontainers.image.ref.name",
        ];
        let matched = names.iter().any(|k| {
            let Some(r) = ann[*k].as_str().and_then(Reference::parse) else {
                return false;
            };
            if r.name != want.name {
                return false;
            }
            match &want.digest {
                Some(d) => desc["digest"].as_str() == Some(d.as_str()),
                None => r.tag == want.tag,
            }
        });
        if matched {
            return Ok(Some(desc.clone()));
        }
    }
    Ok(None)
}

/// Media types of an image index (OCI and Docker's manifest list).
fn is_index(media_type: &str) -> bool {
    media_type == "application/vnd.oci.image.index.v1+json"
        || media_type == "application/vnd.docker.distribution.manifest.list.v2+json"
}

/// Finds `reference` among the OCI images in `image_dir` and unpacks it into
/// `unpack_root/<manifest hex>/rootfs` (once; concurrent callers each unpack into a
/// temporary directory and the first rename wins). `Ok(None)`: no image there has that
/// reference (also when `image_dir` does not exist).
///
/// Errors: an unreadable or malformed layout, a blob whose content does not match its
/// digest, no `linux/amd64` manifest in an index, a layer `tar` cannot unpack.
pub fn find_and_unpack(
    image_dir: &Path,
    reference: &str,
    unpack_root: &Path,
) -> Result<Option<OciImage>, ImageError> {
    let Some(want) = Reference::parse(reference) else {
        return Ok(None);
    };
    for layout in layouts(image_dir) {
        let Some(mut desc) = find_in_layout(&layout, &want)? else {
            continue;
        };
        let mut digest = desc["digest"].as_str().unwrap_or_default().to_owned();
        let mut manifest: Value = serde_json::from_slice(&read_blob(&layout, &digest)?)
            .map_err(|e| invalid(&layout, format!("manifest {digest}: {e}")))?;
        if is_index(desc["mediaType"].as_str().unwrap_or_default())
            || is_index(manifest["mediaType"].as_str().unwrap_or_default())
        {
            // A multi-platform image: the linux/amd64 manifest (what this machine runs).
            let pick = manifest["manifests"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| {
                    m["platform"]["os"] == "linux" && m["platform"]["architecture"] == "amd64"
                })
                .cloned()
                .ok_or_else(|| {
                    invalid(&layout, format!("index {digest} has no linux/amd64 image"))
                })?;
            desc = pick;
            digest = desc["digest"].as_str().unwrap_or_default().to_owned();
            manifest = serde_json::from_slice(&read_blob(&layout, &digest)?)
                .map_err(|e| invalid(&layout, format!("manifest {digest}: {e}")))?;
        }
        let config_digest = manifest["config"]["digest"]
            .as_str()
            .ok_or_else(|| invalid(&layout, format!("manifest {digest} has no config")))?;
        let config: Value = serde_json::from_slice(&read_blob(&layout, config_digest)?)
            .map_err(|e| invalid(&layout, format!("config {config_digest}: {e}")))?;
        let hex = digest.trim_start_matches("sha256:").to_owned();
        let dest = unpack_root.join(&hex);
        let rootfs = dest.join("rootfs");
        if !rootfs.is_dir() {
            unpack(&layout, &manifest, &dest)?;
        }
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        let c = &config["config"];
        return Ok(Some(OciImage {
            image_id: format!("{}@{digest}", want.name),
            digest,
            rootfs,
            entrypoint: strings(&c["Entrypoint"]),
            cmd: strings(&c["Cmd"]),
            env: strings(&c["Env"]),
            user: c["User"].as_str().unwrap_or_default().to_owned(),
        }));
    }
    Ok(None)
}

/// Unpacks the manifest's layers, in order, into `dest/rootfs` (via a temporary
/// directory renamed at the end).
fn unpack(layout: &Path, manifest: &Value, dest: &Path) -> Result<(), ImageError> {
    std::fs::create_dir_all(dest).map_err(io_err(dest))?;
    // Unique per call: kubelets of several nodes may unpack the same image at once.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dest.join(format!("rootfs.tmp-{}-{seq}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    let result = (|| {
        for layer in manifest["layers"].as_array().into_iter().flatten() {
            let d = layer["digest"].as_str().unwrap_or_default();
            // Checked before unpacking: a corrupt layer is an error, never a half rootfs.
            read_blob(layout, d)?;
            let blob = blob_path(layout, d)?;
            // GNU tar recognises gzip/zstd compression when reading a file.
            let out = std::process::Command::new("tar")
                .arg("-x")
                .arg("--no-same-owner")
                .arg("-f")
                .arg(&blob)
                .arg("-C")
                .arg(&tmp)
                .output()
                .map_err(|e| ImageError::Unpack {
                    digest: d.to_owned(),
                    msg: format!("run tar: {e}"),
                })?;
            if !out.status.success() {
                return Err(ImageError::Unpack {
                    digest: d.to_owned(),
                    msg: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                });
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let rootfs = dest.join("rootfs");
    if std::fs::rename(&tmp, &rootfs).is_err() {
        // Someone else finished first: theirs is the same content.
        let _ = std::fs::remove_dir_all(&tmp);
        if !rootfs.is_dir() {
            return Err(invalid(
                dest,
                "could not place the unpacked root file system",
            ));
        }
    }
    Ok(())
}

/// Whether `reference` names an image on a registry on this machine's loopback
/// (`127.0.0.1:PORT/…`, `localhost:PORT/…`): the only registries the testbed pulls from
/// ([`pull_loopback`]).
pub fn is_loopback_registry(reference: &str) -> bool {
    let Some(r) = Reference::parse(reference) else {
        return false;
    };
    let host = r.name.split('/').next().unwrap_or_default();
    host.starts_with("127.0.0.1:") || host.starts_with("localhost:")
}

/// Media types a pull accepts for a manifest (OCI and Docker, single and multi-platform).
const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

/// Largest manifest or blob a pull accepts (bytes).
const MAX_PULL_BYTES: usize = 512 * 1024 * 1024;

/// One plain-HTTP GET (HTTP/1.0, so the body ends with the connection) to
/// `addr` (`127.0.0.1:PORT` or `localhost:PORT`), following up to 3 redirects on the
/// same registry; the 200 answer's body.
fn http_get(addr: &str, path: &str, accept: &str) -> Result<Vec<u8>, String> {
    use std::io::{Read, Write};
    let mut path = path.to_owned();
    for _ in 0..4 {
        let sock: std::net::SocketAddr = addr
            .replacen("localhost:", "127.0.0.1:", 1)
            .parse()
            .map_err(|e| format!("registry address {addr}: {e}"))?;
        let mut s = std::net::TcpStream::connect_timeout(&sock, std::time::Duration::from_secs(5))
            .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\nUser-Agent: testbed-kubelet\r\n\r\n"
        )
        .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        let mut raw = Vec::new();
        s.take(MAX_PULL_BYTES as u64 + 64 * 1024)
            .read_to_end(&mut raw)
            .map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| format!("GET http://{addr}{path}: malformed answer"))?;
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("GET http://{addr}{path}: malformed status line"))?;
        if (300..400).contains(&status) {
            let loc = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("location")
                        .then(|| v.trim().to_owned())
                })
                .ok_or_else(|| format!("GET http://{addr}{path}: {status} without Location"))?;
            path = match loc.strip_prefix(&format!("http://{addr}")) {
                Some(p) => p.to_owned(),
                None if loc.starts_with('/') => loc,
                None => {
                    return Err(format!(
                        "GET http://{addr}{path}: redirect off the registry to {loc}"
                    ))
                }
            };
            continue;
        }
        if status != 200 {
            return Err(format!("GET http://{addr}{path}: HTTP {status}"));
        }
        return Ok(raw[split + 4..].to_vec());
    }
    Err(format!("GET http://{addr}{path}: too many redirects"))
}

/// Pulls `reference` from its loopback registry ([`is_loopback_registry`]) over plain
/// HTTP with the OCI distribution API (`GET /v2/NAME/manifests/REF`, `GET
/// /v2/NAME/blobs/DIGEST`; for an index, its linux/amd64 manifest), checking every
/// digest, into a new OCI image layout `dest` (which must not exist) whose index names
/// the manifest `reference`. The calling thread must be in the network namespace
/// where the registry listens.
///
/// Errors: the registry's answer (e.g. `HTTP 404` for an unknown tag), a digest
/// mismatch, an unreadable manifest, a file that cannot be written.
pub fn pull_loopback(reference: &str, dest: &Path) -> Result<(), String> {
    let r = Reference::parse(reference).ok_or_else(|| format!("bad reference {reference:?}"))?;
    let (addr, repo) = r
        .name
        .split_once('/')
        .ok_or_else(|| format!("{reference}: no registry"))?;
    let blobs = dest.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs).map_err(|e| format!("mkdir {}: {e}", blobs.display()))?;
    let put = |digest: &str, data: &[u8]| -> Result<(), String> {
        let actual = sha256_digest(data);
        if actual != digest {
            return Err(format!("blob {digest}: content has digest {actual}"));
        }
        let p = blob_path(dest, digest).map_err(|e| e.to_string())?;
        std::fs::write(&p, data).map_err(|e| format!("write {}: {e}", p.display()))
    };
    let want = r.digest.clone().or(r.tag.clone()).unwrap_or_default();
    let mut body = http_get(
        addr,
        &format!("/v2/{repo}/manifests/{want}"),
        MANIFEST_ACCEPT,
    )?;
    let mut digest = sha256_digest(&body);
    if let Some(d) = &r.digest {
        put(d, &body)?;
    }
    let mut manifest: Value =
        serde_json::from_slice(&body).map_err(|e| format!("manifest of {reference}: {e}"))?;
    if is_index(manifest["mediaType"].as_str().unwrap_or_default()) {
        put(&digest, &body)?;
        let pick = manifest["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == "amd64")
            .and_then(|m| m["digest"].as_str().map(str::to_owned))
            .ok_or_else(|| format!("{reference}: the index has no linux/amd64 image"))?;
        body = http_get(
            addr,
            &format!("/v2/{repo}/manifests/{pick}"),
            MANIFEST_ACCEPT,
        )?;
        digest = pick;
        manifest = serde_json::from_slice(&body).map_err(|e| format!("manifest {digest}: {e}"))?;
    }
    put(&digest, &body)?;
    let mut wanted: Vec<String> = manifest["config"]["digest"]
        .as_str()
        .map(str::to_owned)
        .into_iter()
        .collect();
    for l in manifest["layers"].as_array().into_iter().flatten() {
        wanted.extend(l["digest"].as_str().map(str::to_owned));
    }
    for d in wanted {
        let data = http_get(addr, &format!("/v2/{repo}/blobs/{d}"), "*/*")?;
        put(&d, &data)?;
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": manifest["mediaType"].as_str().unwrap_or("application/vnd.oci.image.manifest.v1+json"),
            "digest": digest,
            "size": body.len(),
            "annotations": { "org.opencontainers.image.ref.name": reference },
        }],
    });
    let write = |name: &str, data: &[u8]| {
        std::fs::write(dest.join(name), data).map_err(|e| format!("write {name}: {e}"))
    };
    write("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    write("index.json", index.to_string().as_bytes())
}

/// Pulls `reference` from its loopback registry into a fresh layout under
/// `unpack_root/pulls/` ([`pull_loopback`]) and unpacks it as [`find_and_unpack`] does;
/// the pulled layout is removed afterwards (the unpacked root file system stays, keyed
/// by manifest digest). The pull runs on a thread of its own that first enters the
/// network namespace of this process's main thread: the testbed daemon's, the machine's,
/// where a registry on 127.0.0.1 listens (the calling kubelet's thread is in its node's).
///
/// Errors: as [`pull_loopback`], or the namespace cannot be entered.
pub fn pull_and_unpack(reference: &str, unpack_root: &Path) -> Result<OciImage, String> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = unpack_root
        .join("pulls")
        .join(format!("{}-{seq}", std::process::id()));
    let layout = dir.join("image");
    let pulled = std::thread::scope(|sc| {
        sc.spawn(|| -> Result<(), String> {
            let ns_path = format!("/proc/{}/ns/net", std::process::id());
            let ns = std::fs::File::open(&ns_path).map_err(|e| format!("open {ns_path}: {e}"))?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("setns {ns_path}: {e}"))?;
            pull_loopback(reference, &layout)
        })
        .join()
        .unwrap_or_else(|_| Err("the pull thread panicked".to_owned()))
    });
    let result = pulled.and_then(|()| {
        find_and_unpack(&dir, reference, unpack_root)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the pulled layout does not name the reference".to_owned())
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The process a container runs: the executable (a host path) and its arguments, as
/// a runtime combines the image config with the container's `command`/`args`:
/// `command` replaces `Entrypoint` (and drops `Cmd`), `args` replaces `Cmd`. The
/// executable is looked up in the image's root file system: an absolute path as is, a
/// bare name along the image's `PATH`.
///
/// Errors: nothing to run, or the executable is not in the image.
pub fn process_for(
    img: &OciImage,
    command: Option<Vec<String>>,
    args: Option<Vec<String>>,
) -> Result<(PathBuf, Vec<String>), String> {
    let mut argv = match (command, args) {
        (Some(c), Some(a)) => c.into_iter().chain(a).collect::<Vec<_>>(),
        (Some(c), None) => c,
        (None, Some(a)) => img.entrypoint.iter().cloned().chain(a).collect(),
        (None, None) => img.entrypoint.iter().chain(&img.cmd).cloned().collect(),
    };
    if argv.is_empty() {
        return Err(format!(
            "image {} has no entrypoint or cmd and the container gives no command",
            img.image_id
        ));
    }
    let exe = argv.remove(0);
    let in_root = |p: &str| img.rootfs.join(p.trim_start_matches('/'));
    let path = if exe.starts_with('/') {
        Some(in_root(&exe))
    } else {
        let path_var = img
            .env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        path_var
            .split(':')
            .map(|d| in_root(d).join(&exe))
            .find(|p| p.is_file())
    };
    match path {
        Some(p) if p.is_file() => Ok((p, argv)),
        _ => Err(format!(
            "exec: {exe:?}: executable file not found in image {}",
            img.image_id
        )),
    }
}

/// Whether the ELF executable at `path` is statically linked (no `PT_INTERP` program
/// header, so the dynamic loader never runs and `LD_PRELOAD` cannot reach it). `false`
/// for anything that is not a 64-bit little-endian ELF file.
pub fn is_static_elf(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    const PT_INTERP: u32 = 3;
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut h = [0u8; 64];
    if f.read_exact(&mut h).is_err() || &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return false;
    }
    let phoff = u64::from_le_bytes(h[0x20..0x28].try_into().unwrap_or_default());
    let phentsize = u16::from_le_bytes([h[0x36], h[0x37]]) as usize;
    let phnum = u16::from_le_bytes([h[0x38], h[0x39]]) as usize;
    if phentsize < 4 || f.seek(SeekFrom::Start(phoff)).is_err() {
        return false;
    }
    let mut ph = vec![0u8; phentsize * phnum];
    if f.read_exact(&mut ph).is_err() {
        return false;
    }
    !ph.chunks(phentsize)
        .any(|e| u32::from_le_bytes([e[0], e[1], e[2], e[3]]) == PT_INTERP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalise_as_docker_does() {
        let r = |s| Reference::parse(s).unwrap();
        assert_eq!(
            r("ghcr.io/firstpacket/target-server:0.1.0"),
            Reference {
                name: "ghcr.io/firstpacket/target-server".into(),
                tag: Some("0.1.0".into()),
                digest: None
            }
        );
        assert_eq!(r("nginx").name, "docker.io/library/nginx");
        assert_eq!(r("nginx").tag.as_deref(), Some("latest"));
        assert_eq!(r("calico/node:v3").name, "docker.io/calico/node");
        let p = r("127.0.0.1:5000/fp/ts@sha256:abc");
        assert_eq!(p.name, "127.0.0.1:5000/fp/ts");
        assert_eq!(p.tag, None);
        assert_eq!(p.digest.as_deref(), Some("sha256:abc"));
        assert_eq!(r("localhost/x:1").name, "localhost/x");
        assert!(Reference::parse("x:").is_none());
    }

    #[test]
    fn only_loopback_registries_are_pulled_from() {
        assert!(is_loopback_registry("127.0.0.1:5000/fp/ts:1"));
        assert!(is_loopback_registry("localhost:40123/ts@sha256:ab"));
        assert!(!is_loopback_registry(
            "ghcr.io/firstpacket/target-server:0.1.0"
        ));
        assert!(!is_loopback_registry("target-server"));
        assert!(!is_loopback_registry("127.0.0.1.example.com/ts:1"));
    }

    #[test]
    fn image_users_parse_as_the_runtime_reads_them() {
        assert_eq!(ImageUser::parse(""), ImageUser::Unset);
        assert_eq!(
            ImageUser::parse("65532:65532"),
            ImageUser::Numeric {
                uid: 65532,
                gid: Some(65532)
            }
        );
        assert_eq!(
            ImageUser::parse("1000"),
            ImageUser::Numeric {
                uid: 1000,
                gid: None
            }
        );
        assert_eq!(
            ImageUser::parse("nobody"),
            ImageUser::Named("nobody".into())
        );
    }

    /// Writes a one-layer OCI layout named `reference` holding `/bin/app` (a copy of
    /// `exe`); returns the manifest digest.
    fn layout(dir: &Path, reference: &str, exe: &Path) -> String {
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::copy(exe, root.join("bin/app")).unwrap();
        let blobs = dir.join("img/blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let layer_tar = dir.join("layer.tar");
        let st = std::process::Command::new("tar")
            .arg("-czf")
            .arg(&layer_tar)
            .arg("-C")
            .arg(&root)
            .arg("bin")
            .status()
            .unwrap();
        assert!(st.success());
        let put = |data: &[u8]| -> String {
            let d = sha256_digest(data);
            std::fs::write(blobs.join(d.trim_start_matches("sha256:")), data).unwrap();
            d
        };
        let layer = std::fs::read(&layer_tar).unwrap();
        let layer_d = put(&layer);
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/bin/app"], "Cmd": ["--default"], "User": "65532:65532",
                       "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": []}
        }))
        .unwrap();
        let config_d = put(&config);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_d, "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_d, "size": layer.len()}]
        }))
        .unwrap();
        let manifest_d = put(&manifest);
        std::fs::write(
            dir.join("img/oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("img/index.json"),
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_d, "size": manifest.len(),
                    "annotations": {"org.opencontainers.image.ref.name": reference}}]
            }))
            .unwrap(),
        )
        .unwrap();
        manifest_d
    }

    #[test]
    fn an_image_is_found_by_tag_or_digest_unpacked_and_its_process_combined() {
        let dir = std::env::temp_dir().join(format!("tb-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let exe = std::env::current_exe().unwrap();
        let d = layout(&dir, "example.com/fp/app:1", &exe);
        let unpack = dir.join("unpacked");
        let images = dir.clone();
        let img = find_and_unpack(&images, "example.com/fp/app:1", &unpack)
            .unwrap()
            .expect("found by tag");
        assert_eq!(img.image_id, format!("example.com/fp/app@{d}"));
        assert_eq!(img.user, "65532:65532");
        assert!(img.rootfs.join("bin/app").is_file());
        let by_digest = find_and_unpack(&images, &format!("example.com/fp/app@{d}"), &unpack)
            .unwrap()
            .expect("found by digest");
        assert_eq!(by_digest.digest, d);
        // Other tags, other names: not this image.
        for other in ["example.com/fp/app:2", "example.com/fp/other:1", "app:1"] {
            assert!(
                find_and_unpack(&images, other, &unpack).unwrap().is_none(),
                "{other}"
            );
        }
        assert!(
            find_and_unpack(&dir.join("missing"), "example.com/fp/app:1", &unpack)
                .unwrap()
                .is_none()
        );

        // Entrypoint + Cmd; args replace Cmd; command replaces both.
        let (p, a) = process_for(&img, None, None).unwrap();
        assert_eq!(p, img.rootfs.join("bin/app"));
        assert_eq!(a, vec!["--default"]);
        let (_, a) = process_for(&img, None, Some(vec!["serve".into()])).unwrap();
        assert_eq!(a, vec!["serve"]);
        let (p, a) = process_for(&img, Some(vec!["app".into()]), None).unwrap();
        assert_eq!(p, img.rootfs.join("bin/app"));
        assert!(a.is_empty());
        assert!(process_for(&img, Some(vec!["/bin/sh".into()]), None)
            .unwrap_err()
            .contains("not found"));

        // A tampered blob is an error, never a silently different image.
        let hex = d.trim_start_matches("sha256:");
        let mpath = dir.join("img/blobs/sha256").join(hex);
        let mut m = std::fs::read(&mpath).unwrap();
        m.push(b' ');
        std::fs::write(&mpath, m).unwrap();
        let err = find_and_unpack(&images, "example.com/fp/app:1", &unpack).unwrap_err();
        assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn static_executables_are_told_from_dynamic_ones() {
        // The test binary itself is dynamically linked (std on the gnu target).
        assert!(!is_static_elf(&std::env::current_exe().unwrap()));
        assert!(!is_static_elf(Path::new("/nonexistent")));
        let dir = std::env::temp_dir().join(format!("tb-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("script"), "#!/bin/sh\n").unwrap();
        assert!(!is_static_elf(&dir.join("script")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
