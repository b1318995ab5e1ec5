//! Real Calico Felix on the testbed's nodes (`testbed up --control-plane real --agent
//! calico[:VERSION]`; docs/design.md §5 "Real node components").
//!
//! Felix is built from Calico's own sources by `scripts/calico.sh` into the cache beside
//! the real control plane (`<cache>/calico-vX.Y.Z/bin/calico-felix` and that version's
//! CustomResourceDefinitions in `crd/`), one build per release ([`Builds`]). The
//! testbed installs the CRDs and the few resources Felix needs ([`datastore`]) and runs
//! one Felix per node inside the node's network namespace, supervised as calico-node's
//! runit supervises it ([`felix`]). Felix programs the node's iptables (nf_tables
//! backend) dataplane itself; the testbed's own allow-set gate is off on such nodes, and
//! ground truth is read from the node's ruleset ([`crate::ruleset`]), never from Felix.
//!
//! Dual-stack (`testbed up --agent calico --ip-families ipv4,ipv6`, with the simulated
//! kubelet and kube-proxy): Felix runs with `ipv6Support` and an IPv6 IPPool is in the
//! datastore ([`datastore`]); Felix takes each pod's IPv6 address from `status.podIPs`
//! into its WorkloadEndpoint's `ipNetworks` as a `/128`
//! (libcalico-go/lib/backend/k8s/conversion/conversion.go `getPodIPs`,
//! workload_endpoint_default.go) and programs the node's `ip6 filter`/`raw`/`mangle`/`nat`
//! tables (through `ip6tables-nft-restore`, wrapped for `agent_io` like the IPv4 tool),
//! the pod's `/128` route and the interface's IPv6 sysctls (`proxy_ndp`, `forwarding`,
//! `accept_ra`: felix/dataplane/linux/endpoint_mgr.go `configureProcSysForInterface`).
//! The truth is read from both families' real state: on a dual-stack node an endpoint
//! is programmed once `table ip filter` and `table ip6 filter` both dispatch its
//! interface and its `/32` and `/128` are both routed to it ([`crate::ruleset`],
//! [`crate::truth_watch::Watching::ipv6`]); the policy truth ([`crate::ipset_watch`])
//! reads the IPv4 IP sets only.
//!
//! Versions: `calico` alone means [`DEFAULT_VERSION`] (the version the XDP apply-loop
//! incident upgraded to, docs/scenarios.md S2); the calico-node pods' image tag names the
//! version a node runs (`docker.io/calico/node:vX.Y.Z`), so `testbed agent roll --image
//! …:vX.Y.Z` rolls a node to another build.

pub mod datastore;
pub mod felix;

use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};

/// Env var choosing the node agent of `testbed up` (`sim` or `calico[:VERSION]`).
pub const AGENT_ENV: &str = "FIRSTPACKET_AGENT";

/// The Felix version `--agent calico` runs when no version is named: v3.31.7, the
/// release the XDP apply-loop incident upgraded to (docs/scenarios.md S2).
pub const DEFAULT_VERSION: &str = "v3.31.7";

/// Felix's health port (`HealthPort` default 9099, felix/config/config_params.go); the
/// testbed binds it to the node IP (`HealthHost`).
pub const HEALTH_PORT: u16 = 9099;

/// Felix's Prometheus port (`PrometheusMetricsPort` default 9091), bound to the node IP
/// where the simulated agent's page is served in the other mode.
pub const METRICS_PORT: u16 = crate::felix::FELIX_METRICS_PORT;

/// The image the calico-node pods of a node running `version` carry (the tag selects
/// the Felix build on `agent roll`).
pub fn node_image(version: &str) -> String {
    format!("docker.io/calico/node:{version}")
}

/// Which node agent the testbed runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AgentChoice {
    /// The testbed's own simulated agent ([`crate::agent`]).
    #[default]
    Sim,
    /// Real Calico Felix of this version (`vX.Y.Z`).
    Calico { version: String },
}

impl AgentChoice {
    /// `sim`, `calico` or `calico:vX.Y.Z`.
    pub fn as_arg(&self) -> String {
        match self {
            AgentChoice::Sim => "sim".to_owned(),
            AgentChoice::Calico { version } => format!("calico:{version}"),
        }
    }

    /// Which fault primitives apply to this agent.
    pub fn kind(&self) -> crate::fault::AgentKind {
        match self {
            AgentChoice::Sim => crate::fault::AgentKind::Simulated,
            AgentChoice::Calico { .. } => crate::fault::AgentKind::Calico,
        }
    }

    /// The Felix version for the real agent.
    pub fn version(&self) -> Option<&str> {
        match self {
            AgentChoice::Sim => None,
            AgentChoice::Calico { version } => Some(version),
        }
    }
}

impl std::str::FromStr for AgentChoice {
    type Err = String;

    /// `sim`; `calico` ([`DEFAULT_VERSION`]); `calico:vX.Y.Z` (a leading `v` may be
    /// left out). Errors name what is accepted.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "sim" => Ok(AgentChoice::Sim),
            "calico" => Ok(AgentChoice::Calico {
                version: DEFAULT_VERSION.to_owned(),
            }),
            other => match other.strip_prefix("calico:") {
                Some(v) => check_version(v).map(|version| AgentChoice::Calico { version }),
                None => Err(format!(
                    "unknown agent {other:?}: use sim, calico or calico:vX.Y.Z (e.g. calico:{DEFAULT_VERSION})"
                )),
            },
        }
    }
}

/// `vX.Y.Z` (a missing leading `v` is added) with numeric parts. Errors: anything else.
pub fn check_version(v: &str) -> Result<String, String> {
    let v = v.trim();
    let bare = v.strip_prefix('v').unwrap_or(v);
    let parts: Vec<&str> = bare.split('.').collect();
    if parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        Ok(format!("v{bare}"))
    } else {
        Err(format!(
            "{v:?} is not a Calico release version (vX.Y.Z, e.g. {DEFAULT_VERSION})"
        ))
    }
}

/// The Felix version a calico-node image names by its tag (`…/calico/node:v3.31.7` →
/// `v3.31.7`), `None` when the image is not `calico/node` or the tag is not a release
/// version.
pub fn version_of_image(image: &str) -> Option<String> {
    let without_digest = image.split('@').next()?;
    let (repo, tag) = without_digest.rsplit_once(':')?;
    if tag.contains('/') || !(repo == "calico/node" || repo.ends_with("/calico/node")) {
        return None;
    }
    check_version(tag).ok()
}

/// The Felix builds `scripts/calico.sh` left in the cache. Clones share the record of
/// which versions' CRDs were applied ([`Builds::apply_crds_once`]).
#[derive(Debug, Clone)]
pub struct Builds {
    root: PathBuf,
    applied: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

impl Builds {
    /// The cache `scripts/calico.sh` writes: `$FIRSTPACKET_CONTROL_PLANE_CACHE`, else
    /// `$XDG_CACHE_HOME/firstpacket/control-plane`, else
    /// `$HOME/.cache/firstpacket/control-plane` (the script's own rule).
    pub fn locate() -> Builds {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let root = env("FIRSTPACKET_CONTROL_PLANE_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                env("XDG_CACHE_HOME").map(|x| Path::new(&x).join("firstpacket/control-plane"))
            })
            .unwrap_or_else(|| {
                let home = env("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| "/root".into());
                home.join(".cache/firstpacket/control-plane")
            });
        Builds::at(&root)
    }

    /// Builds in `root` (tests).
    pub fn at(root: &Path) -> Builds {
        Builds {
            root: root.to_path_buf(),
            applied: Default::default(),
        }
    }

    /// Applies `version`'s CRDs ([`datastore::apply_crds`]) unless this set of builds
    /// already did. Errors: as `apply_crds`.
    pub async fn apply_crds_once(
        &self,
        api: &crate::client::ApiClient,
        version: &str,
    ) -> Result<()> {
        if self
            .applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(version)
        {
            return Ok(());
        }
        datastore::apply_crds(api, &self.crd_dir(version)).await?;
        self.applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(version.to_owned());
        Ok(())
    }

    /// Records that `version`'s CRDs are in (installed at start-up).
    pub fn mark_applied(&self, version: &str) {
        self.applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(version.to_owned());
    }

    /// `<cache>/calico-<version>`.
    pub fn dir(&self, version: &str) -> PathBuf {
        self.root.join(format!("calico-{version}"))
    }

    /// The `calico-felix` binary of `version`. Errors (one line): not built — names
    /// `scripts/calico.sh` and `FIRSTPACKET_CALICO_SOURCE`, and the versions that are.
    pub fn felix(&self, version: &str) -> Result<PathBuf> {
        let bin = self.dir(version).join("bin").join("calico-felix");
        if bin.is_file() && self.crd_dir(version).is_dir() {
            return Ok(bin);
        }
        let have = self.versions();
        let have = if have.is_empty() {
            "none is".to_owned()
        } else {
            format!("{} built", have.join(", "))
        };
        bail!(
            "Calico Felix {version} is not built ({have} in {}): run `FIRSTPACKET_CALICO_SOURCE=<calico checkout at {version}> bash scripts/calico.sh`",
            self.root.display()
        )
    }

    /// That version's CRDs (`crd/*.yaml`).
    pub fn crd_dir(&self, version: &str) -> PathBuf {
        self.dir(version).join("crd")
    }

    /// Versions built, sorted.
    pub fn versions(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let ver = name.strip_prefix("calico-")?.to_owned();
                e.path().join("bin/calico-felix").is_file().then_some(ver)
            })
            .collect();
        v.sort();
        v
    }

    /// Checks that every version in `versions` is built (the start-up check of `testbed
    /// up`, before anything starts). Errors: the first one that is not.
    pub fn require<'a>(&self, versions: impl IntoIterator<Item = &'a str>) -> Result<()> {
        for v in versions {
            self.felix(v)?;
        }
        Ok(())
    }
}

/// The version a node runs: its fault file's `agent_version` when set, else `default`.
pub fn version_for(default: &str, override_version: Option<&str>) -> Result<String> {
    match override_version {
        None => Ok(default.to_owned()),
        Some(v) => check_version(v).map_err(|e| anyhow!("agent_version: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_choice_parses_sim_calico_and_versions() {
        assert_eq!("sim".parse::<AgentChoice>(), Ok(AgentChoice::Sim));
        assert_eq!(
            "calico".parse::<AgentChoice>().unwrap().version(),
            Some(DEFAULT_VERSION)
        );
        assert_eq!(
            "calico:3.29.5".parse::<AgentChoice>().unwrap().as_arg(),
            "calico:v3.29.5"
        );
        assert!("cilium"
            .parse::<AgentChoice>()
            .unwrap_err()
            .contains("use sim, calico"));
        assert!("calico:latest"
            .parse::<AgentChoice>()
            .unwrap_err()
            .contains("not a Calico release version"));
    }

    #[test]
    fn image_tags_name_versions() {
        assert_eq!(
            version_of_image("docker.io/calico/node:v3.31.7").as_deref(),
            Some("v3.31.7")
        );
        assert_eq!(
            version_of_image("localhost:5000/calico/node:v3.29.5@sha256:ab").as_deref(),
            Some("v3.29.5")
        );
        assert_eq!(version_of_image("docker.io/calico/node:latest"), None);
        assert_eq!(version_of_image("quay.io/cilium/cilium:v1.16.0"), None);
        assert_eq!(
            version_of_image("quay.io/calico/node:v3.31.7").as_deref(),
            Some("v3.31.7")
        );
        assert_eq!(version_of_image("calico/node"), None);
        assert_eq!(node_image("v3.29.5"), "docker.io/calico/node:v3.29.5");
    }

    #[test]
    fn a_missing_build_names_the_script_and_what_is_built() {
        let dir = std::env::temp_dir().join(format!("fp-calico-builds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("calico-v3.29.5/bin")).unwrap();
        std::fs::create_dir_all(dir.join("calico-v3.29.5/crd")).unwrap();
        std::fs::write(dir.join("calico-v3.29.5/bin/calico-felix"), b"").unwrap();
        let b = Builds::at(&dir);
        assert_eq!(b.versions(), vec!["v3.29.5".to_owned()]);
        assert!(b.felix("v3.29.5").is_ok());
        let e = b.felix("v3.31.7").unwrap_err().to_string();
        assert!(
            e.contains("scripts/calico.sh") && e.contains("v3.29.5 built"),
            "{e}"
        );
        assert!(b.require(["v3.29.5", "v3.31.7"]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
