//! Real kube-proxy on the testbed's nodes (`testbed up --control-plane real
//! --kube-proxy real`; docs/design.md §5 "Real node components").
//!
//! One `kube-proxy` per node (built by `scripts/control-plane.sh` with the control
//! plane, same version), spawned on the node's netns thread ([`Supervised`]) — or, on a
//! real kubelet's node, that kubelet's static pod ([`static_pod`]) — in
//! nftables mode — its tables `ip kube-proxy`/`ip6 kube-proxy` live in the node netns
//! only — with the flags checked on these machines: `--hostname-override=NODE` (the
//! Node's InternalIP is its node IP), `--cluster-cidr` = the pods' CIDR, metrics where
//! `testbed up --kube-proxy-metrics` says (default `0.0.0.0:10249`, as clusters that
//! scrape kube-proxy set it; `localhost`: its own default 127.0.0.1), health on `:10256`, and `--conntrack-max-per-core=0` (leave the host-wide
//! `nf_conntrack_max` alone). It replaces the simulated service proxy
//! ([`crate::services`]) on its node; the `kube-proxy-NODE` pod stays in the API, its
//! readiness following kube-proxy's `/healthz`. Ground truth (`service_programmed`) is
//! read from its ruleset ([`crate::ruleset`]).
//!
//! kube-proxy v1.36 labels its histograms with `ip_family`
//! (`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`), and
//! `kubeproxy_network_programming_duration_seconds` appears only after the first
//! endpoint change it sees after start-up.

use crate::supervise::{ReadyCheck, Spec, Supervised};
use anyhow::{bail, Result};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Env var choosing the service proxy of `testbed up` (`sim` or `real`).
pub const KUBE_PROXY_ENV: &str = "FIRSTPACKET_KUBE_PROXY";

/// kube-proxy's health port (`--healthz-bind-address` default `0.0.0.0:10256`).
pub const HEALTHZ_PORT: u16 = 10256;

/// Which service proxy the testbed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ProxyChoice {
    /// The testbed's own kube-proxy-like programmer (testbed/src/services.rs).
    #[default]
    Sim,
    /// Real kube-proxy (nftables mode), from `scripts/control-plane.sh`.
    Real,
}

impl ProxyChoice {
    /// Which fault primitives apply to this service proxy.
    pub fn kind(self) -> crate::fault::ProxyKind {
        match self {
            ProxyChoice::Sim => crate::fault::ProxyKind::Simulated,
            ProxyChoice::Real => crate::fault::ProxyKind::Real,
        }
    }

    /// `sim` / `real`.
    pub fn as_arg(self) -> &'static str {
        match self {
            ProxyChoice::Sim => "sim",
            ProxyChoice::Real => "real",
        }
    }
}

/// What one node's kube-proxy needs.
#[derive(Debug, Clone)]
pub struct KubeProxyConfig {
    pub node: String,
    pub node_ip: Ipv4Addr,
    /// The pods' CIDR (`--cluster-cidr`).
    pub cluster_cidr: String,
    /// `STATE/kube-proxy/NODE`: kubeconfig and log.
    pub dir: PathBuf,
    /// Kubeconfig (YAML).
    pub kubeconfig: String,
    /// The `kube-proxy` binary.
    pub binary: PathBuf,
    /// `--metrics-bind-address` (`testbed up --kube-proxy-metrics`: `0.0.0.0:10249` for
    /// `all`, `127.0.0.1:10249`, kube-proxy's own default, for `localhost` and `none`).
    pub metrics_bind: SocketAddr,
}

/// The kube-proxy binary beside the control plane's binaries in `bin_dir`. Errors (one
/// line): missing — run `bash scripts/control-plane.sh`.
pub fn locate(bin_dir: &Path) -> Result<PathBuf> {
    let p = bin_dir.join("kube-proxy");
    if !p.is_file() {
        bail!(
            "real kube-proxy is not built ({} is missing): run `bash scripts/control-plane.sh`",
            p.display()
        );
    }
    Ok(p)
}

/// The arguments kube-proxy runs with (module docs).
pub fn args(cfg: &KubeProxyConfig) -> Vec<String> {
    vec![
        "--proxy-mode=nftables".into(),
        format!("--hostname-override={}", cfg.node),
        format!("--kubeconfig={}", cfg.dir.join("kubeconfig").display()),
        format!("--cluster-cidr={}", cfg.cluster_cidr),
        format!("--metrics-bind-address={}", cfg.metrics_bind),
        format!("--healthz-bind-address=0.0.0.0:{HEALTHZ_PORT}"),
        "--conntrack-max-per-core=0".into(),
        "--v=2".into(),
    ]
}

/// The reference of the kube-proxy image `scripts/control-plane.sh`'s binary is packed
/// into for real kubelets (`registry.k8s.io/kube-proxy:VERSION`, VERSION from the
/// binary's `--version`). Errors: the binary does not run or says no version.
pub fn image_reference(binary: &Path) -> Result<String> {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| anyhow::anyhow!("run {} --version: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .find(|w| w.starts_with('v'))
        .ok_or_else(|| anyhow::anyhow!("{} --version said {text:?}", binary.display()))?;
    Ok(format!("registry.k8s.io/kube-proxy:{version}"))
}

/// kube-proxy as a real kubelet's static pod (`--kubelet real`): `kube-system/kube-proxy`
/// (mirror pod `kube-proxy-NODE`, `k8s-app=kube-proxy`) on the host network,
/// privileged, running `/kube-proxy` of `image` with [`args`]; the host's `/usr` (its
/// `nft` and `conntrack`) and `/lib/modules` mounted read-only, `cfg.dir` (the
/// kubeconfig) at the same path; ready when `/healthz` answers. Writes the kubeconfig.
/// Errors: file I/O.
pub fn static_pod(cfg: &KubeProxyConfig, image: &str) -> Result<crate::realnode::StaticPod> {
    std::fs::create_dir_all(&cfg.dir)?;
    std::fs::write(cfg.dir.join("kubeconfig"), &cfg.kubeconfig)?;
    let mut command = vec!["/kube-proxy".to_owned()];
    command.extend(args(cfg));
    let dir = cfg.dir.display().to_string();
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kube-proxy",
            "namespace": "kube-system",
            "labels": { "k8s-app": "kube-proxy" },
        },
        "spec": {
            "hostNetwork": true,
            "priorityClassName": "system-node-critical",
            "containers": [{
                "name": "kube-proxy",
                "image": image,
                "imagePullPolicy": "Never",
                "command": command,
                "securityContext": { "privileged": true },
                "readinessProbe": {
                    "httpGet": { "host": cfg.node_ip.to_string(), "path": "/healthz", "port": HEALTHZ_PORT },
                    "periodSeconds": 1,
                },
                "volumeMounts": [
                    { "name": "usr", "mountPath": "/usr", "readOnly": true },
                    { "name": "modules", "mountPath": "/lib/modules", "readOnly": true },
                    { "name": "state", "mountPath": dir, "readOnly": true },
                ],
            }],
            "volumes": [
                { "name": "usr", "hostPath": { "path": "/usr" } },
                { "name": "modules", "hostPath": { "path": "/lib/modules" } },
                { "name": "state", "hostPath": { "path": dir } },
            ],
        },
    });
    Ok(crate::realnode::StaticPod {
        file: "kube-proxy.json".to_owned(),
        manifest: serde_json::to_string_pretty(&pod)?,
    })
}

/// Starts the node's kube-proxy on `rt` (the node's netns thread runtime). Errors: file
/// I/O, the spawn.
pub async fn start(cfg: KubeProxyConfig, rt: tokio::runtime::Handle) -> Result<Arc<Supervised>> {
    std::fs::create_dir_all(&cfg.dir)?;
    std::fs::write(cfg.dir.join("kubeconfig"), &cfg.kubeconfig)?;
    let ready = ReadyCheck {
        addr: SocketAddr::from((cfg.node_ip, HEALTHZ_PORT)),
        path: "/healthz".into(),
    };
    let name = format!("kube-proxy[{}]", cfg.node);
    Supervised::start(
        &name,
        rt,
        move || {
            Ok(Spec {
                program: cfg.binary.clone(),
                args: args(&cfg),
                env: Vec::new(),
                log: cfg.dir.join("kube-proxy.log"),
                binds: Vec::new(),
                cgroup: None,
            })
        },
        Some(ready),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_runs_nftables_mode_for_its_node_with_reachable_metrics() {
        let cfg = KubeProxyConfig {
            node: "node-2".into(),
            node_ip: Ipv4Addr::new(172, 20, 7, 12),
            cluster_cidr: "10.7.0.0/16".into(),
            dir: "/s/kube-proxy/node-2".into(),
            kubeconfig: String::new(),
            binary: "/b/kube-proxy".into(),
            metrics_bind: "0.0.0.0:10249".parse().unwrap(),
        };
        let a = args(&cfg);
        for want in [
            "--proxy-mode=nftables",
            "--hostname-override=node-2",
            "--cluster-cidr=10.7.0.0/16",
            "--metrics-bind-address=0.0.0.0:10249",
            "--conntrack-max-per-core=0",
            "--kubeconfig=/s/kube-proxy/node-2/kubeconfig",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert!(locate(Path::new("/nonexistent"))
            .unwrap_err()
            .to_string()
            .contains("scripts/control-plane.sh"));
    }
}
