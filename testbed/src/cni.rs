//! `testbed cni`: the testbed binary as a container runtime's CNI plugin, wiring real
//! pod sandboxes (containerd's) exactly as the simulated kubelet's sandboxes are wired.
//!
//! Two halves, one JSON line each way over a Unix socket:
//! - **plugin** ([`plugin_main`], [`run_plugin`]): what the runtime executes. It reads
//!   the CNI environment ([`CniEnv`]: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//!   `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`) and the network configuration on stdin
//!   ([`NetConf`]: `cniVersion`, `name`, `type` and our `"testbed": {"socket": PATH,
//!   "node": NODE}`), sends a [`DaemonRequest`] to the daemon's `cni.sock`, and prints
//!   the CNI result ([`CniResult`] for ADD, nothing for DEL/CHECK, [`VersionResult`]
//!   for VERSION) or a CNI error ([`CniError`], exit status 1).
//! - **daemon** ([`CniServer`]): served by the testbed daemon from `STATE/cni.sock`.
//!   ADD opens the runtime's netns file (as the plugin process sees it:
//!   `/proc/<plugin pid>/root/<CNI_NETNS>`, the pid from `SO_PEERCRED`, so a runtime
//!   in a mount namespace of its own works too), waits for fault `cni_add_delay`, then
//!   [`Dataplane::attach_pod`] (IP from the node's block, netns bind-mounted onto
//!   `/run/netns/<prefix>-p<n>`, Calico-style veth and routes) and
//!   [`Agent::endpoint_added`] (truth `endpoint_added`, then the simulated agent's
//!   programming with its faults, or real Felix's), as the simulated kubelet does.
//!   DEL waits for fault `teardown_delay`, then [`Agent::endpoint_removed`] and
//!   [`Dataplane::detach_pod`] (the bind mount only; the runtime's file and processes
//!   are left alone). CHECK is [`Dataplane::check_pod`]. Sandboxes are kept per
//!   container id until their DEL: a repeated ADD answers the first ADD's result, DEL
//!   of an unknown container succeeds (CNI spec: DEL is idempotent).
//!
//! A runtime executes a plugin by its `type` with no arguments, so the `testbed` binary
//! also runs as the plugin when started without arguments and with `CNI_COMMAND` set
//! (e.g. a symlink `CNI_BIN_DIR/testbed` → the binary, `"type": "testbed"`).
//!
//! Shapes and error codes follow the CNI specification 1.0
//! (<https://github.com/containernetworking/cni/blob/main/SPEC.md>, sections
//! "Parameters", "Section 5: Result Types": "ADD Success", "VERSION Success",
//! "Error"). Results for `cniVersion` 0.3.x/0.4.0 add `"version": "4"` to each IP, as
//! those versions' result format requires.

use crate::agent::Agent;
use crate::dataplane::{Dataplane, DataplaneError, PodNet, POD_GATEWAY, WORKLOAD_MAC};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// CNI versions this plugin speaks (`supportedVersions` of VERSION).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// The version answered when the configuration names none we can use.
pub const DEFAULT_VERSION: &str = "1.0.0";

/// CNI spec error code 1: "Incompatible CNI version".
pub const CODE_INCOMPATIBLE_VERSION: u32 = 1;
/// CNI spec error code 3: "Container unknown or does not exist" (CHECK of a container
/// this plugin never added).
pub const CODE_UNKNOWN_CONTAINER: u32 = 3;
/// CNI spec error code 4: "Invalid necessary environment variables, like
/// CNI_COMMAND, CNI_CONTAINERID, etc." (also `CNI_ARGS` without the pod's name, a
/// `CNI_NETNS` that is not a network namespace).
pub const CODE_INVALID_ENV: u32 = 4;
/// CNI spec error code 6: "Failed to decode content" (stdin is not JSON, or not an
/// object).
pub const CODE_DECODE: u32 = 6;
/// CNI spec error code 7: "Invalid network config" (a required key missing or wrong,
/// a node the daemon does not have).
pub const CODE_INVALID_CONFIG: u32 = 7;
/// CNI spec error code 11: "Try again later" (the daemon's socket cannot be reached,
/// or it closed the connection without answering).
pub const CODE_TRY_AGAIN: u32 = 11;
/// Plugin-specific (spec: codes 100 and up): the node's pod address block is full.
pub const CODE_BLOCK_EXHAUSTED: u32 = 901;
/// Plugin-specific: the node-side interface name (`cali…` of namespace.pod) belongs to
/// another sandbox still on the node.
pub const CODE_IFACE_IN_USE: u32 = 902;
/// Plugin-specific: CHECK found part of the wiring missing.
pub const CODE_CHECK_FAILED: u32 = 903;
/// Plugin-specific: any other failure (a command, a mount, the daemon's answer).
pub const CODE_INTERNAL: u32 = 999;

/// File name of the daemon's CNI socket in the state dir.
pub const SOCKET_FILE: &str = "cni.sock";

/// The daemon's CNI socket of state dir `state` (`STATE/cni.sock`): the
/// `testbed.socket` of the nodes' CNI configuration.
pub fn socket_path(state: &Path) -> PathBuf {
    state.join(SOCKET_FILE)
}

/// Longest request or answer line accepted (bytes).
const MAX_LINE: u64 = 64 * 1024;

/// A CNI operation (`CNI_COMMAND`). GC and STATUS (spec 1.1) are not supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CniCommand {
    Add,
    Del,
    Check,
    Version,
}

/// The CNI error result (spec "Error": `cniVersion`, `code`, `msg`, `details`), printed
/// on stdout with exit status 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("CNI error {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// One of the `CODE_*` constants.
    pub code: u32,
    pub msg: String,
    #[serde(default)]
    pub details: String,
}

impl CniError {
    /// An error with `code`, `msg` and `details`, version [`DEFAULT_VERSION`] (the
    /// plugin sets the configuration's before printing).
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            cni_version: DEFAULT_VERSION.to_owned(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }
}

/// The CNI environment of one invocation (spec "Parameters").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: CniCommand,
    /// `CNI_CONTAINERID` (empty for VERSION).
    pub container_id: String,
    /// `CNI_NETNS`: path of the sandbox's netns file (may be absent for DEL).
    pub netns: Option<String>,
    /// `CNI_IFNAME`: the interface to create in the sandbox (e.g. `eth0`).
    pub ifname: String,
    /// `CNI_ARGS`, parsed.
    pub args: CniArgs,
    /// `CNI_PATH` split on `:` (unused: this plugin delegates to none).
    pub path: Vec<PathBuf>,
}

/// The Kubernetes keys of `CNI_ARGS` (`K8S_POD_NAMESPACE=…;K8S_POD_NAME=…;
/// K8S_POD_UID=…;K8S_POD_INFRA_CONTAINER_ID=…`, as the kubelet/containerd pass them).
/// Unknown keys (and `IgnoreUnknown`) are accepted and ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
}

impl CniArgs {
    /// Parses `K=V;K=V`. Errors: an item without `=` (code 4).
    pub fn parse(s: &str) -> Result<CniArgs, CniError> {
        let mut a = CniArgs::default();
        for item in s.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| {
                CniError::new(
                    CODE_INVALID_ENV,
                    "invalid CNI_ARGS",
                    format!("item {item:?} is not KEY=VALUE"),
                )
            })?;
            let v = (!v.is_empty()).then(|| v.to_owned());
            match k {
                "K8S_POD_NAMESPACE" => a.pod_namespace = v,
                "K8S_POD_NAME" => a.pod_name = v,
                "K8S_POD_UID" => a.pod_uid = v,
                _ => {}
            }
        }
        Ok(a)
    }
}

/// Whether `s` is a usable interface name (1–15 bytes, no `/`, `:` or whitespace, not
/// `.`/`..`; the kernel's `dev_valid_name`).
fn valid_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && !s.chars().any(|c| c == '/' || c == ':' || c.is_whitespace())
}

impl CniEnv {
    /// Reads the CNI variables through `var` (e.g. `|k| std::env::var(k).ok()`).
    /// Errors (code 4): `CNI_COMMAND` missing or not ADD/DEL/CHECK/VERSION; for
    /// ADD/DEL/CHECK `CNI_CONTAINERID` missing or not of `[A-Za-z0-9_.-]` (spec),
    /// `CNI_IFNAME` missing or invalid, `CNI_NETNS` missing or relative (ADD, CHECK);
    /// `CNI_ARGS` malformed.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<CniEnv, CniError> {
        let bad = |msg: &str, details: String| CniError::new(CODE_INVALID_ENV, msg, details);
        let cmd = var("CNI_COMMAND").unwrap_or_default();
        let command = match cmd.as_str() {
            "ADD" => CniCommand::Add,
            "DEL" => CniCommand::Del,
            "CHECK" => CniCommand::Check,
            "VERSION" => CniCommand::Version,
            "" => return Err(bad("CNI_COMMAND is not set", String::new())),
            other => {
                return Err(bad(
                    "unsupported CNI_COMMAND",
                    format!("{other:?} (supported: ADD, DEL, CHECK, VERSION)"),
                ))
            }
        };
        let path = var("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        let args = CniArgs::parse(&var("CNI_ARGS").unwrap_or_default())?;
        let mut env = CniEnv {
            command,
            container_id: String::new(),
            netns: var("CNI_NETNS").filter(|s| !s.is_empty()),
            ifname: var("CNI_IFNAME").unwrap_or_default(),
            args,
            path,
        };
        if command == CniCommand::Version {
            return Ok(env);
        }
        env.container_id = var("CNI_CONTAINERID").unwrap_or_default();
        if env.container_id.is_empty()
            || !env
                .container_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return Err(bad(
                "invalid CNI_CONTAINERID",
                format!(
                    "{:?}: must be non-empty, of letters, digits, '_', '.' and '-'",
                    env.container_id
                ),
            ));
        }
        if !valid_ifname(&env.ifname) {
            return Err(bad(
                "invalid CNI_IFNAME",
                format!("{:?}: an interface name of 1–15 characters", env.ifname),
            ));
        }
        if command != CniCommand::Del {
            match &env.netns {
                Some(p) if p.starts_with('/') => {}
                Some(p) => return Err(bad("invalid CNI_NETNS", format!("{p:?} is not absolute"))),
                None => return Err(bad("CNI_NETNS is not set", String::new())),
            }
        }
        Ok(env)
    }
}

/// The testbed's own keys of the network configuration (`"testbed": {…}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestbedConf {
    /// The daemon's CNI socket, `STATE/cni.sock`.
    pub socket: PathBuf,
    /// The node (`node-<i>`) whose runtime calls this plugin.
    pub node: String,
}

/// The network configuration on stdin (spec "Section 1: Network configuration format";
/// other keys such as `prevResult`, `runtimeConfig`, `args` are ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    pub testbed: TestbedConf,
}

impl NetConf {
    /// Parses stdin. Errors: not a JSON object (code 6); `cniVersion` missing (code 7)
    /// or not in [`SUPPORTED_VERSIONS`] (code 1); `name`, `type`, `testbed.socket` or
    /// `testbed.node` missing or not strings (code 7).
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let v: serde_json::Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                CODE_DECODE,
                "cannot decode the network configuration",
                e.to_string(),
            )
        })?;
        if !v.is_object() {
            return Err(CniError::new(
                CODE_DECODE,
                "cannot decode the network configuration",
                "not a JSON object",
            ));
        }
        let string = |ptr: &str| -> Result<String, CniError> {
            match v.pointer(ptr).and_then(|x| x.as_str()) {
                Some(s) if !s.is_empty() => Ok(s.to_owned()),
                _ => Err(CniError::new(
                    CODE_INVALID_CONFIG,
                    "invalid network configuration",
                    format!(
                        "{} must be a non-empty string",
                        ptr.trim_start_matches('/').replace('/', ".")
                    ),
                )),
            }
        };
        let cni_version = string("/cniVersion")?;
        if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
            return Err(CniError::new(
                CODE_INCOMPATIBLE_VERSION,
                "incompatible CNI version",
                format!(
                    "cniVersion {cni_version:?}; supported: {}",
                    SUPPORTED_VERSIONS.join(", ")
                ),
            ));
        }
        Ok(NetConf {
            name: string("/name")?,
            plugin_type: string("/type")?,
            testbed: TestbedConf {
                socket: PathBuf::from(string("/testbed/socket")?),
                node: string("/testbed/node")?,
            },
            cni_version,
        })
    }
}

/// One interface of a result (spec "ADD Success": `interfaces`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniInterface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The sandbox (netns path) of a container-side interface; absent on the host side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// One IP of a result (spec "ADD Success": `ips`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniIp {
    /// `"4"`, only in 0.3.x/0.4.0 results (removed in 1.0.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// CIDR notation, `10.X.i.n/32`.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Index into `interfaces` of the interface carrying it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// One route of a result (spec "ADD Success": `routes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniRoute {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// The ADD result (spec "ADD Success"): `cniVersion`, `interfaces` (0: the node-side
/// `cali…` veth with MAC `ee:ee:ee:ee:ee:ee`; 1: `CNI_IFNAME` with its MAC and
/// `sandbox` = `CNI_NETNS`), `ips` (the pod IP `/32` on interface 1, gateway
/// 169.254.1.1), `routes` (default via 169.254.1.1) and an empty `dns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub interfaces: Vec<CniInterface>,
    pub ips: Vec<CniIp>,
    pub routes: Vec<CniRoute>,
    pub dns: serde_json::Map<String, serde_json::Value>,
}

impl CniResult {
    /// The result for `net` (wired in sandbox `netns` as `ifname`, pod-side MAC
    /// `pod_mac`) in the shape of `cni_version`.
    pub fn for_pod(
        net: &PodNet,
        netns: &str,
        ifname: &str,
        pod_mac: Option<String>,
        cni_version: &str,
    ) -> CniResult {
        CniResult {
            cni_version: DEFAULT_VERSION.to_owned(),
            interfaces: vec![
                CniInterface {
                    name: net.iface.clone(),
                    mac: Some(WORKLOAD_MAC.to_owned()),
                    sandbox: None,
                },
                CniInterface {
                    name: ifname.to_owned(),
                    mac: pod_mac,
                    sandbox: Some(netns.to_owned()),
                },
            ],
            ips: vec![CniIp {
                version: None,
                address: format!("{}/32", net.ip),
                gateway: Some(POD_GATEWAY.to_string()),
                interface: Some(1),
            }],
            routes: vec![CniRoute {
                dst: "0.0.0.0/0".to_owned(),
                gw: Some(POD_GATEWAY.to_string()),
            }],
            dns: serde_json::Map::new(),
        }
        .in_version(cni_version)
    }

    /// The same result in the shape of `cni_version` (0.x: `"version": "4"` per IP).
    pub fn in_version(mut self, cni_version: &str) -> CniResult {
        let old = cni_version.starts_with("0.");
        for ip in &mut self.ips {
            ip.version = old.then(|| "4".to_owned());
        }
        self.cni_version = cni_version.to_owned();
        self
    }
}

/// The VERSION result (spec "VERSION Success").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionResult {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<String>,
}

/// What the plugin asks the daemon (one JSON line on `cni.sock`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonRequest {
    /// ADD, DEL or CHECK.
    pub command: CniCommand,
    pub cni_version: String,
    pub container_id: String,
    /// `CNI_NETNS` as the plugin sees it (absolute; may be absent for DEL).
    pub netns: Option<String>,
    pub ifname: String,
    pub node: String,
    /// Pod namespace, name and uid (`CNI_ARGS`; uid defaults to the container id).
    /// Empty for DEL and CHECK, which go by container id.
    pub namespace: String,
    pub pod: String,
    pub uid: String,
}

/// The daemon's answer (one JSON line): `{"ok": RESULT-or-null}` or `{"error": ERROR}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DaemonReply {
    Ok(Option<CniResult>),
    Error(CniError),
}

/// What one plugin run prints and exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOutcome {
    /// Everything for stdout (a JSON document and a newline, or empty).
    pub stdout: String,
    /// 0 on success, 1 on a CNI error (spec: "a non-zero return code").
    pub exit_code: i32,
}

impl PluginOutcome {
    fn json(v: &impl Serialize, exit_code: i32) -> PluginOutcome {
        PluginOutcome {
            stdout: format!(
                "{}\n",
                serde_json::to_string(v).unwrap_or_else(|_| "{}".to_owned())
            ),
            exit_code,
        }
    }
}

/// One plugin invocation: CNI variables through `var`, the network configuration
/// `stdin`. Talks to the daemon (blocking) for ADD/DEL/CHECK. Never fails: errors are
/// CNI error results with exit code 1, in the configuration's `cniVersion` when it
/// could be read.
pub fn run_plugin(var: impl Fn(&str) -> Option<String>, stdin: &[u8]) -> PluginOutcome {
    let version_hint = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v["cniVersion"].as_str().map(str::to_owned))
        .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| DEFAULT_VERSION.to_owned());
    match plugin(var, stdin, &version_hint) {
        Ok(Some(out)) => out,
        Ok(None) => PluginOutcome {
            stdout: String::new(),
            exit_code: 0,
        },
        Err(mut e) => {
            e.cni_version = version_hint;
            PluginOutcome::json(&e, 1)
        }
    }
}

fn plugin(
    var: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
    version_hint: &str,
) -> Result<Option<PluginOutcome>, CniError> {
    let env = CniEnv::from_vars(var)?;
    if env.command == CniCommand::Version {
        return Ok(Some(PluginOutcome::json(
            &VersionResult {
                cni_version: version_hint.to_owned(),
                supported_versions: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
            },
            0,
        )));
    }
    let plugin_type = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned));
    if plugin_type.as_deref() == Some(LOOPBACK) {
        return loopback(&env, version_hint).map(Some);
    }
    let conf = NetConf::parse(stdin)?;
    if env.command == CniCommand::Check && conf.cni_version.starts_with("0.3") {
        return Err(CniError::new(
            CODE_INCOMPATIBLE_VERSION,
            "CHECK needs cniVersion 0.4.0 or later",
            format!("cniVersion {}", conf.cni_version),
        ));
    }
    let (namespace, pod, uid) = if env.command == CniCommand::Add {
        let missing = |k: &str| {
            CniError::new(
                CODE_INVALID_ENV,
                "invalid CNI_ARGS",
                format!("{k} is missing (the pod's namespace and name are required)"),
            )
        };
        let a = &env.args;
        (
            a.pod_namespace
                .clone()
                .ok_or_else(|| missing("K8S_POD_NAMESPACE"))?,
            a.pod_name.clone().ok_or_else(|| missing("K8S_POD_NAME"))?,
            a.pod_uid
                .clone()
                .unwrap_or_else(|| env.container_id.clone()),
        )
    } else {
        Default::default()
    };
    let req = DaemonRequest {
        command: env.command,
        cni_version: conf.cni_version.clone(),
        container_id: env.container_id.clone(),
        netns: env.netns.clone(),
        ifname: env.ifname.clone(),
        node: conf.testbed.node.clone(),
        namespace,
        pod,
        uid,
    };
    match ask_daemon(&conf.testbed.socket, &req)? {
        DaemonReply::Ok(Some(result)) => Ok(Some(PluginOutcome::json(&result, 0))),
        DaemonReply::Ok(None) => Ok(None),
        DaemonReply::Error(e) => Err(e),
    }
}

/// Sends `req` to the daemon at `socket` and reads its one-line answer. Errors: the
/// socket cannot be reached or the daemon hung up without answering (code 11), an
/// answer that is not a [`DaemonReply`] (code 999).
pub fn ask_daemon(socket: &Path, req: &DaemonRequest) -> Result<DaemonReply, CniError> {
    let again = |what: &str, e: std::io::Error| {
        CniError::new(
            CODE_TRY_AGAIN,
            format!("the testbed daemon is not reachable: {what}"),
            format!("{}: {e}", socket.display()),
        )
    };
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|e| again("cannot connect", e))?;
    let mut line = serde_json::to_vec(req)
        .map_err(|e| CniError::new(CODE_INTERNAL, "cannot encode the request", e.to_string()))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| again("cannot send", e))?;
    let mut answer = String::new();
    std::io::BufReader::new(stream.take(MAX_LINE))
        .read_line(&mut answer)
        .map_err(|e| again("no answer", e))?;
    if answer.trim().is_empty() {
        return Err(again(
            "it closed the connection without answering",
            std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
        ));
    }
    serde_json::from_str(&answer).map_err(|e| {
        CniError::new(
            CODE_INTERNAL,
            "the testbed daemon's answer cannot be read",
            format!("{e}: {answer:?}"),
        )
    })
}

/// `testbed cni` (or the binary run with no arguments and `CNI_COMMAND` set): reads
/// the process environment and stdin, prints the outcome on stdout, returns the exit
/// code.
pub fn plugin_main() -> i32 {
    let mut stdin = Vec::new();
    // VERSION may come with an empty stdin; a read error is a decode error below.
    let _ = std::io::stdin().take(MAX_LINE).read_to_end(&mut stdin);
    let out = run_plugin(|k| std::env::var(k).ok(), &stdin);
    let mut so = std::io::stdout().lock();
    let _ = so.write_all(out.stdout.as_bytes());
    let _ = so.flush();
    out.exit_code
}

/// The `type` of the loopback network a container runtime configures for every
/// sandbox before the pod network (containerd's CRI plugin: `{"cniVersion": "0.3.1",
/// "name": "cni-loopback", "plugins": [{"type": "loopback"}]}`), served by this binary
/// too (the wrapper of that name in the node's CNI `bin_dir`).
pub const LOOPBACK: &str = "loopback";

/// The loopback plugin (what CNI's reference `loopback` plugin does): ADD sets `lo` up
/// in the sandbox (`nsenter --net=CNI_NETNS ip link set lo up`) and reports it with
/// `127.0.0.1/8`; DEL does nothing (`lo` goes with the namespace); CHECK passes.
/// Errors: ADD without `CNI_NETNS` (code 4), the command failing (code 999).
fn loopback(env: &CniEnv, cni_version: &str) -> Result<PluginOutcome, CniError> {
    if env.command != CniCommand::Add {
        return Ok(PluginOutcome {
            stdout: String::new(),
            exit_code: 0,
        });
    }
    let netns = env
        .netns
        .clone()
        .ok_or_else(|| CniError::new(CODE_INVALID_ENV, "CNI_NETNS is missing", "loopback ADD"))?;
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "link", "set", "lo", "up"])
        .output()
        .map_err(|e| CniError::new(CODE_INTERNAL, "cannot run nsenter", e.to_string()))?;
    if !out.status.success() {
        return Err(CniError::new(
            CODE_INTERNAL,
            "cannot set lo up in the sandbox",
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    let mut ip = serde_json::json!({"interface": 0, "address": "127.0.0.1/8"});
    if cni_version.starts_with("0.") {
        ip["version"] = "4".into();
    }
    Ok(PluginOutcome::json(
        &serde_json::json!({
            "cniVersion": cni_version,
            "interfaces": [{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": netns}],
            "ips": [ip],
            "dns": {},
        }),
        0,
    ))
}

/// Whether this process was started as a CNI plugin: no arguments and `CNI_COMMAND`
/// set (a runtime executes the plugin binary named by the configuration's `type`
/// without arguments).
pub fn invoked_as_plugin() -> bool {
    std::env::args_os().len() == 1 && std::env::var_os("CNI_COMMAND").is_some()
}

// ---------------------------------------------------------------------------------
// Daemon side.

/// A sandbox wired by ADD, kept until its DEL.
#[derive(Debug, Clone)]
struct Sandbox {
    net: PodNet,
    ifname: String,
    result: CniResult,
}

/// One container id's state; its lock orders the ADD/DEL/CHECK of that container.
type Slot = Arc<tokio::sync::Mutex<Option<Sandbox>>>;

struct ServerState {
    dataplane: Arc<Dataplane>,
    /// Node name → its agent; a node of the plan without one yet answers "try again
    /// later".
    agents: std::sync::RwLock<BTreeMap<String, Arc<Agent>>>,
    /// Container id → slot; an entry exists while its sandbox exists or a request for
    /// it runs.
    slots: Mutex<HashMap<String, Slot>>,
}

/// The daemon's CNI endpoint on a Unix socket (module docs). Dropping it stops
/// accepting; [`CniServer::shutdown`] also tears down every sandbox still known.
pub struct CniServer {
    path: PathBuf,
    state: Arc<ServerState>,
    accept: tokio::task::AbortHandle,
}

impl std::fmt::Debug for CniServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CniServer")
            .field("path", &self.path)
            .finish()
    }
}

impl CniServer {
    /// Binds `path` (a stale file there is replaced; mode 0600) and serves it on the
    /// current tokio runtime, each connection in its own task: node name → that node's
    /// agent in `agents` (more with [`CniServer::add_agents`]; a request for a node of
    /// the plan without an agent yet answers code 11, try again later), sandboxes wired
    /// on `dataplane`. Errors: the bind.
    pub fn start(
        path: &Path,
        dataplane: Arc<Dataplane>,
        agents: BTreeMap<String, Arc<Agent>>,
    ) -> std::io::Result<CniServer> {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(
            path,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
        )?;
        let state = Arc::new(ServerState {
            dataplane,
            agents: std::sync::RwLock::new(agents),
            slots: Mutex::new(HashMap::new()),
        });
        let st = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = st.clone();
                tokio::spawn(async move { st.serve(stream).await });
            }
        })
        .abort_handle();
        Ok(CniServer {
            path: path.to_owned(),
            state,
            accept,
        })
    }

    /// Adds (or replaces) node agents, e.g. once the nodes' components are up.
    pub fn add_agents(&self, agents: BTreeMap<String, Arc<Agent>>) {
        self.state
            .agents
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend(agents);
    }

    /// Stops accepting, removes the socket file and tears down every sandbox still
    /// known as DEL would (without `teardown_delay`): the agent forgets the endpoint,
    /// the veth goes and the netns bind mount is removed; the runtime's netns files and
    /// processes are not touched.
    pub async fn shutdown(self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.path);
        let slots: Vec<(String, Slot)> = self.state.lock_slots().drain().collect();
        for (id, slot) in slots {
            let Some(sb) = slot.lock().await.take() else {
                continue;
            };
            let st = self.state.clone();
            let r = tokio::task::spawn_blocking(move || st.teardown(&sb.net)).await;
            if !matches!(r, Ok(Ok(()))) {
                tracing::warn!(container = %id, "cni: teardown at shutdown failed: {r:?}");
            }
        }
    }
}

impl Drop for CniServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn dataplane_error(e: DataplaneError) -> CniError {
    let code = match &e {
        DataplaneError::UnknownNode(_) => CODE_INVALID_CONFIG,
        DataplaneError::BlockExhausted { .. } => CODE_BLOCK_EXHAUSTED,
        DataplaneError::IfaceInUse { .. } => CODE_IFACE_IN_USE,
        DataplaneError::Missing { .. } => CODE_CHECK_FAILED,
        _ => CODE_INTERNAL,
    };
    CniError::new(code, "testbed dataplane", e.to_string())
}

fn join_error(e: tokio::task::JoinError) -> CniError {
    CniError::new(CODE_INTERNAL, "testbed daemon task failed", e.to_string())
}

impl ServerState {
    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The locked slot of `id`, created if missing. A slot removed from the map while
    /// we waited for its lock is stale: look again.
    async fn slot(&self, id: &str) -> (Slot, tokio::sync::OwnedMutexGuard<Option<Sandbox>>) {
        loop {
            let slot = self.lock_slots().entry(id.to_owned()).or_default().clone();
            let guard = slot.clone().lock_owned().await;
            if self
                .lock_slots()
                .get(id)
                .is_some_and(|s| Arc::ptr_eq(s, &slot))
            {
                return (slot, guard);
            }
        }
    }

    /// Drops the map entry of an empty slot (under its lock, so waiters look again).
    fn release(
        &self,
        id: &str,
        slot: &Slot,
        guard: &tokio::sync::OwnedMutexGuard<Option<Sandbox>>,
    ) {
        if guard.is_none() {
            let mut slots = self.lock_slots();
            if slots.get(id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                slots.remove(id);
            }
        }
    }

    /// One connection: one request line, one answer line.
    async fn serve(self: Arc<Self>, stream: tokio::net::UnixStream) {
        let pid = stream.peer_cred().ok().and_then(|c| c.pid());
        let (r, mut w) = stream.into_split();
        let mut line = String::new();
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::BufReader::new(r.take(MAX_LINE)).read_line(&mut line),
        )
        .await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            return;
        }
        let reply = match serde_json::from_str::<DaemonRequest>(&line) {
            Ok(req) => {
                let started = std::time::Instant::now();
                let r = self.handle(&req, pid).await;
                tracing::info!(command = ?req.command, container = %req.container_id, node = %req.node, pod = %format!("{}/{}", req.namespace, req.pod), ms = started.elapsed().as_secs_f64() * 1e3, error = r.as_ref().err().map(|e| e.to_string()), "cni");
                match r {
                    Ok(res) => DaemonReply::Ok(res),
                    Err(e) => DaemonReply::Error(CniError {
                        cni_version: req.cni_version.clone(),
                        ..e
                    }),
                }
            }
            Err(e) => DaemonReply::Error(CniError::new(
                CODE_DECODE,
                "the testbed daemon cannot read the request",
                e.to_string(),
            )),
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        let _ = w.write_all(&out).await;
    }

    async fn handle(
        &self,
        req: &DaemonRequest,
        pid: Option<i32>,
    ) -> Result<Option<CniResult>, CniError> {
        match req.command {
            CniCommand::Add => self.add(req, pid).await.map(Some),
            CniCommand::Del => self.del(req).await.map(|()| None),
            CniCommand::Check => self.check(req).await.map(|()| None),
            CniCommand::Version => Err(CniError::new(
                CODE_INVALID_ENV,
                "VERSION is answered by the plugin",
                String::new(),
            )),
        }
    }

    /// The agent of `node`. Errors: a node of the plan whose agent is not up yet
    /// (code 11), a node not in the plan (code 7).
    fn agent(&self, node: &str) -> Result<Arc<Agent>, CniError> {
        if let Some(a) = self.known_agent(node) {
            return Ok(a);
        }
        let plan = self.dataplane.plan();
        if plan.node(node).is_some() {
            return Err(CniError::new(
                CODE_TRY_AGAIN,
                "the node's agent is not running yet",
                format!("node {node}"),
            ));
        }
        Err(CniError::new(
            CODE_INVALID_CONFIG,
            "invalid network configuration",
            format!(
                "testbed.node {node:?} is not a node of this testbed (nodes: {})",
                plan.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    }

    fn known_agent(&self, node: &str) -> Option<Arc<Agent>> {
        self.agents
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
    }

    async fn add(&self, req: &DaemonRequest, pid: Option<i32>) -> Result<CniResult, CniError> {
        let agent = self.agent(&req.node)?;
        let netns = req
            .netns
            .clone()
            .filter(|p| p.starts_with('/'))
            .ok_or_else(|| CniError::new(CODE_INVALID_ENV, "CNI_NETNS is not set", ""))?;
        if req.namespace.is_empty() || req.pod.is_empty() || req.uid.is_empty() {
            return Err(CniError::new(
                CODE_INVALID_ENV,
                "invalid CNI_ARGS",
                "the pod's namespace, name and uid are required",
            ));
        }
        let (slot, mut guard) = self.slot(&req.container_id).await;
        if let Some(sb) = guard.as_ref() {
            // A repeated ADD (e.g. a runtime retry): the first one's result.
            return Ok(sb.result.clone().in_version(&req.cni_version));
        }
        let r = self.wire(req, &agent, pid, &netns).await;
        if let Ok(sb) = &r {
            *guard = Some(sb.clone());
        }
        self.release(&req.container_id, &slot, &guard);
        r.map(|sb| sb.result)
    }

    async fn wire(
        &self,
        req: &DaemonRequest,
        agent: &Arc<Agent>,
        pid: Option<i32>,
        netns: &str,
    ) -> Result<Sandbox, CniError> {
        // The runtime's netns file as the plugin sees it, held open from now on.
        let file = open_netns(pid, netns)?;
        let delay = agent.cni_add_delay();
        if !delay.is_zero() {
            tracing::debug!(container = %req.container_id, ?delay, "cni_add_delay");
            tokio::time::sleep(delay).await;
        }
        let (dp, agent, req2, netns2) = (
            self.dataplane.clone(),
            agent.clone(),
            req.clone(),
            netns.to_owned(),
        );
        tokio::task::spawn_blocking(move || {
            let src = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            let net = dp
                .attach_pod(
                    &req2.node,
                    &req2.namespace,
                    &req2.pod,
                    &req2.uid,
                    &src,
                    &req2.ifname,
                )
                .map_err(dataplane_error)?;
            drop(file);
            let mac = dp.pod_iface_mac(&net, &req2.ifname).ok();
            // As the simulated kubelet: truth `endpoint_added`, then the agent's work.
            agent.endpoint_added(&net);
            let result = CniResult::for_pod(&net, &netns2, &req2.ifname, mac, &req2.cni_version);
            Ok(Sandbox {
                net,
                ifname: req2.ifname,
                result,
            })
        })
        .await
        .map_err(join_error)?
    }

    async fn del(&self, req: &DaemonRequest) -> Result<(), CniError> {
        let (slot, mut guard) = self.slot(&req.container_id).await;
        let Some(sb) = guard.take() else {
            // Unknown container: nothing to do (spec: DEL must succeed).
            self.release(&req.container_id, &slot, &guard);
            return Ok(());
        };
        let agent = self.known_agent(&sb.net.node);
        if let Some(agent) = &agent {
            let d = agent.teardown_delay();
            if !d.is_zero() {
                tracing::debug!(container = %req.container_id, delay = ?d, "teardown_delay");
                tokio::time::sleep(d).await;
            }
        }
        let st_net = sb.net.clone();
        let dp = self.dataplane.clone();
        let r = tokio::task::spawn_blocking(move || {
            if let Some(a) = agent {
                a.endpoint_removed(&st_net);
            }
            dp.detach_pod(&st_net)
        })
        .await
        .map_err(join_error)
        .and_then(|r| r.map_err(dataplane_error));
        if r.is_err() {
            // Keep it: the runtime retries DEL, and teardown is idempotent.
            *guard = Some(sb);
        }
        self.release(&req.container_id, &slot, &guard);
        r
    }

    async fn check(&self, req: &DaemonRequest) -> Result<(), CniError> {
        let (slot, guard) = self.slot(&req.container_id).await;
        let Some(sb) = guard.clone() else {
            self.release(&req.container_id, &slot, &guard);
            return Err(CniError::new(
                CODE_UNKNOWN_CONTAINER,
                "container unknown",
                format!("no sandbox was added for container {}", req.container_id),
            ));
        };
        let dp = self.dataplane.clone();
        let r = tokio::task::spawn_blocking(move || dp.check_pod(&sb.net, &sb.ifname))
            .await
            .map_err(join_error)?;
        drop(guard);
        r.map_err(dataplane_error)
    }

    /// DEL's teardown without the delay (shutdown).
    fn teardown(&self, net: &PodNet) -> Result<(), DataplaneError> {
        if let Some(a) = self.known_agent(&net.node) {
            a.endpoint_removed(net);
        }
        self.dataplane.detach_pod(net)
    }
}

/// Opens `netns` as process `pid` (the plugin) sees it (`/proc/PID/root/NETNS`; the
/// path itself without a pid) and checks it is a namespace file (nsfs). Errors
/// (code 4): cannot be opened, not a namespace.
fn open_netns(pid: Option<i32>, netns: &str) -> Result<std::fs::File, CniError> {
    let path = match pid {
        Some(pid) => PathBuf::from(format!("/proc/{pid}/root{netns}")),
        None => PathBuf::from(netns),
    };
    let bad = |details: String| CniError::new(CODE_INVALID_ENV, "invalid CNI_NETNS", details);
    let file = std::fs::File::open(&path).map_err(|e| bad(format!("{netns}: {e}")))?;
    match nix::sys::statfs::fstatfs(&file) {
        Ok(s) if s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC => Ok(file),
        Ok(_) => Err(bad(format!("{netns} is not a namespace file"))),
        Err(e) => Err(bad(format!("{netns}: fstatfs: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "0123abcd_x.y-z"),
        ("CNI_NETNS", "/var/run/netns/cni-1234"),
        ("CNI_IFNAME", "eth0"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=0123abcd;K8S_POD_UID=5f1c",
        ),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    fn with(over: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = ADD
            .iter()
            .filter(|(k, _)| !over.iter().any(|(o, _)| o == k))
            .copied()
            .collect();
        v.extend(over.iter().filter(|(_, val)| !val.is_empty()).copied());
        v
    }

    #[test]
    fn env_and_args_parse() {
        let env = CniEnv::from_vars(vars(ADD)).unwrap();
        assert_eq!(env.command, CniCommand::Add);
        assert_eq!(env.container_id, "0123abcd_x.y-z");
        assert_eq!(env.netns.as_deref(), Some("/var/run/netns/cni-1234"));
        assert_eq!(env.ifname, "eth0");
        assert_eq!(
            env.args,
            CniArgs {
                pod_namespace: Some("default".into()),
                pod_name: Some("web-0".into()),
                pod_uid: Some("5f1c".into()),
            }
        );
        assert_eq!(
            env.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        // DEL without a netns is fine; VERSION needs nothing else.
        let del =
            CniEnv::from_vars(vars(&with(&[("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")]))).unwrap();
        assert_eq!((del.command, del.netns), (CniCommand::Del, None));
        let v = CniEnv::from_vars(vars(&[("CNI_COMMAND", "VERSION")])).unwrap();
        assert_eq!(v.command, CniCommand::Version);
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(
            CniArgs::parse("K8S_POD_NAME=a;")
                .unwrap()
                .pod_name
                .as_deref(),
            Some("a")
        );
    }

    #[test]
    fn bad_env_is_code_4_naming_the_variable() {
        for (over, name) in [
            (vec![("CNI_COMMAND", "")], "CNI_COMMAND"),
            (vec![("CNI_COMMAND", "GC")], "CNI_COMMAND"),
            (vec![("CNI_CONTAINERID", "")], "CNI_CONTAINERID"),
            (vec![("CNI_CONTAINERID", "a/b")], "CNI_CONTAINERID"),
            (vec![("CNI_IFNAME", "")], "CNI_IFNAME"),
            (vec![("CNI_IFNAME", "a-very-long-ifname0")], "CNI_IFNAME"),
            (vec![("CNI_NETNS", "")], "CNI_NETNS"),
            (vec![("CNI_NETNS", "relative/ns")], "CNI_NETNS"),
            (vec![("CNI_ARGS", "K8S_POD_NAME")], "CNI_ARGS"),
        ] {
            let e = CniEnv::from_vars(vars(&with(&over))).unwrap_err();
            assert_eq!(e.code, CODE_INVALID_ENV, "{over:?}: {e}");
            assert!(e.msg.contains(name), "{over:?}: {e}");
        }
    }

    const CONF: &str = r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"testbed","testbed":{"socket":"/tmp/x/cni.sock","node":"node-2"},"runtimeConfig":{}}"#;

    #[test]
    fn netconf_parses_and_rejects_with_spec_codes() {
        let c = NetConf::parse(CONF.as_bytes()).unwrap();
        assert_eq!(c.cni_version, "1.0.0");
        assert_eq!(c.name, "k8s-pod-network");
        assert_eq!(c.plugin_type, "testbed");
        assert_eq!(c.testbed.socket, PathBuf::from("/tmp/x/cni.sock"));
        assert_eq!(c.testbed.node, "node-2");
        assert_eq!(NetConf::parse(b"{not json").unwrap_err().code, CODE_DECODE);
        assert_eq!(NetConf::parse(b"[1]").unwrap_err().code, CODE_DECODE);
        let e =
            NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n","type":"testbed"}"#).unwrap_err();
        assert_eq!(e.code, CODE_INVALID_CONFIG);
        assert!(e.details.contains("testbed.socket"), "{e}");
        let e = NetConf::parse(CONF.replace("node-2", "").as_bytes()).unwrap_err();
        assert!(
            e.code == CODE_INVALID_CONFIG && e.details.contains("testbed.node"),
            "{e}"
        );
        let e = NetConf::parse(CONF.replace("1.0.0", "2.0.0").as_bytes()).unwrap_err();
        assert_eq!(e.code, CODE_INCOMPATIBLE_VERSION);
    }

    fn net() -> PodNet {
        PodNet {
            node: "node-1".into(),
            namespace: "default".into(),
            pod: "web-0".into(),
            uid: "u1".into(),
            ip: Ipv4Addr::new(10, 7, 1, 5),
            ip6: None,
            iface: "calic440f455693".into(),
            netns: "fp123456-p3".into(),
        }
    }

    #[test]
    fn add_result_has_the_spec_1_0_shape() {
        let r = CniResult::for_pod(
            &net(),
            "/var/run/netns/cni-1",
            "eth0",
            Some("2a:00:00:00:00:01".into()),
            "1.0.0",
        );
        let v = serde_json::to_value(&r).unwrap();
        let want = serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "calic440f455693", "mac": "ee:ee:ee:ee:ee:ee"},
                {"name": "eth0", "mac": "2a:00:00:00:00:01", "sandbox": "/var/run/netns/cni-1"}
            ],
            "ips": [{"address": "10.7.1.5/32", "gateway": "169.254.1.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
            "dns": {}
        });
        assert_eq!(v, want);
        // 0.x results carry the IP version; 1.0.0 dropped it.
        let old = serde_json::to_value(r.clone().in_version("0.4.0")).unwrap();
        assert_eq!(old["cniVersion"], "0.4.0");
        assert_eq!(old["ips"][0]["version"], "4");
        let back = serde_json::to_value(r.in_version("0.4.0").in_version("1.0.0")).unwrap();
        assert_eq!(back, want);
    }

    #[test]
    fn error_and_version_results_have_the_spec_shape() {
        let e = CniError::new(CODE_TRY_AGAIN, "daemon down", "connect: refused");
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"cniVersion": "1.0.0", "code": 11, "msg": "daemon down", "details": "connect: refused"})
        );
        let out = run_plugin(
            vars(&[("CNI_COMMAND", "VERSION")]),
            br#"{"cniVersion":"0.4.0"}"#,
        );
        assert_eq!(out.exit_code, 0);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["cniVersion"], "0.4.0");
        let sv: Vec<&str> = v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        assert!(sv.contains(&"0.4.0") && sv.contains(&"1.0.0"), "{sv:?}");
    }

    #[test]
    fn plugin_errors_print_cni_errors_and_exit_1() {
        // No daemon at the socket: try again later, in the configuration's version.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cni.sock");
        let conf = CONF
            .replace("/tmp/x/cni.sock", sock.to_str().unwrap())
            .replace("1.0.0", "0.4.0");
        let out = run_plugin(vars(ADD), conf.as_bytes());
        assert_eq!(out.exit_code, 1);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["code"], CODE_TRY_AGAIN);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert!(v["details"].as_str().unwrap().contains("cni.sock"), "{v}");
        // Malformed stdin and a config without our keys.
        let out = run_plugin(vars(ADD), b"cniVersion: 1.0.0");
        assert_eq!(out.exit_code, 1);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["code"], CODE_DECODE);
        let out = run_plugin(
            vars(ADD),
            br#"{"cniVersion":"1.0.0","name":"n","type":"t"}"#,
        );
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!((out.exit_code, v["code"].as_u64()), (1, Some(7)));
        // ADD without the pod's name in CNI_ARGS.
        let out = run_plugin(
            vars(&with(&[("CNI_ARGS", "K8S_POD_NAMESPACE=default")])),
            CONF.as_bytes(),
        );
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["code"], CODE_INVALID_ENV);
        assert!(
            v["details"].as_str().unwrap().contains("K8S_POD_NAME"),
            "{v}"
        );
    }

    #[test]
    fn daemon_wire_format_round_trips() {
        let r = DaemonReply::Ok(None);
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"ok":null}"#);
        let e = DaemonReply::Error(CniError::new(CODE_INTERNAL, "x", ""));
        let s = serde_json::to_string(&e).unwrap();
        assert!(s.starts_with(r#"{"error":{"cniVersion""#), "{s}");
        assert_eq!(serde_json::from_str::<DaemonReply>(&s).unwrap(), e);
        let req = DaemonRequest {
            command: CniCommand::Add,
            cni_version: "1.0.0".into(),
            container_id: "c".into(),
            netns: Some("/x".into()),
            ifname: "eth0".into(),
            node: "node-1".into(),
            namespace: "default".into(),
            pod: "p".into(),
            uid: "u".into(),
        };
        let s = serde_json::to_string(&req).unwrap();
        assert!(s.contains(r#""command":"ADD""#), "{s}");
        assert_eq!(serde_json::from_str::<DaemonRequest>(&s).unwrap(), req);
    }
}
