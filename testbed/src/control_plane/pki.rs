//! Certificates, keys and config files of the real control plane, issued by the testbed
//! CA ([`crate::tls::Ca`], `pki/ca.crt`).
//!
//! - `apiserver.crt/.key`: kube-apiserver's serving certificate; SANs `localhost`,
//!   `127.0.0.1`, the advertise (bridge) IP, the `kubernetes` Service's ClusterIP (first
//!   address of the service CIDR) and `kubernetes`, `kubernetes.default`,
//!   `kubernetes.default.svc`, `kubernetes.default.svc.cluster.local`.
//! - `sa.key` / `sa.pub`: the ServiceAccount token key pair (ECDSA P-256, ES256).
//! - One client certificate per identity in [`IDENTITIES`] (`<name>.crt/.key`; user =
//!   CN, groups = O), and `control-plane/<name>.kubeconfig` for each.

use super::Config;
use crate::tls::{self, Ca};
use anyhow::{anyhow, Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::IpAddr;
use std::sync::Arc;

/// One identity of the control plane.
#[derive(Debug, Clone, Copy)]
pub struct IdentitySpec {
    /// File stem (`pki/<name>.crt`, `control-plane/<name>.kubeconfig`).
    pub name: &'static str,
    /// User name (certificate CN).
    pub user: &'static str,
    /// Groups (certificate O).
    pub groups: &'static [&'static str],
    /// ClusterRole the testbed binds the user to at bootstrap (ClusterRoleBinding
    /// named after the user); `None`: none (system:masters, or the built-in
    /// `system:kube-*` bindings kube-apiserver creates itself).
    pub cluster_role: Option<&'static str>,
    /// Whether its kubeconfig points at `https://127.0.0.1:<port>` (components in the
    /// host netns) rather than the advertise URL.
    pub loopback: bool,
}

/// The testbed's own bootstrap identity, in `system:masters` (authorized before any
/// authorizer, so `api deny` cannot reach it): creates the bindings below; kept only in
/// the state dir, never handed to pods or users.
pub const BOOTSTRAP: &str = "bootstrap";
/// The user `testbed exec`'s kubeconfig carries: `firstpacket-admin`, bound to
/// `cluster-admin` by RBAC (not `system:masters`, so `api deny` reaches it).
pub const ADMIN: &str = "admin";
/// kube-controller-manager (`system:kube-controller-manager`; it runs its controllers
/// with their own ServiceAccount credentials).
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";
/// kube-scheduler (`system:kube-scheduler`).
pub const SCHEDULER: &str = "kube-scheduler";
/// The testbed's node components (kubelets, agents, service proxy):
/// `firstpacket-node-components`, bound to `cluster-admin`.
pub const NODE_COMPONENTS: &str = "node-components";
/// kube-apiserver's client certificate towards kubelets (`kubectl logs`, `exec`):
/// `kube-apiserver-kubelet-client`, bound to `system:kubelet-api-admin`.
pub const APISERVER_KUBELET_CLIENT: &str = "apiserver-kubelet-client";

/// Every identity the testbed issues.
pub const IDENTITIES: &[IdentitySpec] = &[
    IdentitySpec {
        name: BOOTSTRAP,
        user: "firstpacket-bootstrap",
        groups: &["system:masters"],
        cluster_role: None,
        loopback: true,
    },
    IdentitySpec {
        name: ADMIN,
        user: "firstpacket-admin",
        groups: &[],
        cluster_role: Some("cluster-admin"),
        loopback: false,
    },
    IdentitySpec {
        name: CONTROLLER_MANAGER,
        user: "system:kube-controller-manager",
        groups: &[],
        cluster_role: None,
        loopback: true,
    },
    IdentitySpec {
        name: SCHEDULER,
        user: "system:kube-scheduler",
        groups: &[],
        cluster_role: None,
        loopback: true,
    },
    IdentitySpec {
        name: NODE_COMPONENTS,
        user: "firstpacket-node-components",
        groups: &[],
        cluster_role: Some("cluster-admin"),
        loopback: false,
    },
    IdentitySpec {
        name: APISERVER_KUBELET_CLIENT,
        user: "kube-apiserver-kubelet-client",
        groups: &[],
        cluster_role: Some("system:kubelet-api-admin"),
        loopback: true,
    },
];

/// The user name of identity `name` of [`IDENTITIES`] (empty for an unknown name).
pub fn identity_user(name: &str) -> &'static str {
    IDENTITIES
        .iter()
        .find(|i| i.name == name)
        .map(|i| i.user)
        .unwrap_or("")
}

/// An issued identity.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Its spec.
    pub spec: IdentitySpec,
    /// User name (= `spec.user`).
    pub user: &'static str,
    /// Client certificate, PEM.
    pub cert_pem: String,
    /// Its key, PEM (PKCS#8).
    pub key_pem: String,
}

/// Everything [`Files::issue`] made.
#[derive(Debug, Clone)]
pub struct Files {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// kube-apiserver's serving certificate SANs.
    pub apiserver_sans: Vec<String>,
    ids: Vec<Issued>,
}

impl Files {
    /// Issues (and writes into `pki/`) the serving certificate, the ServiceAccount key
    /// pair and every identity of [`IDENTITIES`]; keeps an existing CA. Errors: file
    /// I/O, generation.
    pub fn issue(cfg: &Config) -> Result<Files> {
        let dir = cfg.pki_dir();
        let ca = Ca::load_or_create(&dir).context("the testbed CA")?;
        let sans = tls::api_server_sans(
            &[
                IpAddr::V4(cfg.advertise_ip),
                IpAddr::V4(cfg.kubernetes_service_ip()),
            ],
            &[],
        );
        let (crt, key) = ca.issue_serving("kube-apiserver", &sans)?;
        tls::write_pem(&dir.join("apiserver.crt"), &crt, false)?;
        tls::write_pem(&dir.join("apiserver.key"), &key, true)?;
        let (sa_key, sa_pub) = tls::key_pair_pem()?;
        tls::write_pem(&dir.join("sa.key"), &sa_key, true)?;
        tls::write_pem(&dir.join("sa.pub"), &sa_pub, false)?;
        let mut ids = Vec::new();
        for spec in IDENTITIES {
            let (cert_pem, key_pem) = ca.issue_client(spec.user, spec.groups)?;
            tls::write_pem(&dir.join(format!("{}.crt", spec.name)), &cert_pem, false)?;
            tls::write_pem(&dir.join(format!("{}.key", spec.name)), &key_pem, true)?;
            ids.push(Issued {
                spec: *spec,
                user: spec.user,
                cert_pem,
                key_pem,
            });
        }
        Ok(Files {
            ca_pem: ca.cert_pem.clone(),
            apiserver_sans: sans,
            ids,
        })
    }

    /// The identity named `name`. Errors: not one of [`IDENTITIES`].
    pub fn identity(&self, name: &str) -> Result<&Issued> {
        self.ids
            .iter()
            .find(|i| i.spec.name == name)
            .ok_or_else(|| anyhow!("no identity {name:?}"))
    }

    /// A rustls client configuration (`ring`, TLS 1.2/1.3, ALPN http/1.1) trusting the
    /// testbed CA and presenting identity `name`. Errors: unknown identity, bad PEM.
    pub fn client_config(&self, name: &str) -> Result<Arc<rustls::ClientConfig>> {
        let id = self.identity(name)?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots
                .add(c.context("CA PEM")?)
                .context("add the CA to the trust store")?;
        }
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .context("client certificate PEM")?;
        let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).context("client key PEM")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut c = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(c))
    }
}

/// A kubeconfig for identity `name` at `server`, referring to the files in `pki/`.
/// Errors: unknown identity.
pub fn kubeconfig(cfg: &Config, files: &Files, name: &str, server: &str) -> Result<String> {
    let id = files.identity(name)?;
    let pki = cfg.pki_dir();
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\ncontexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {user}\n    namespace: default\ncurrent-context: testbed\nusers:\n- name: {user}\n  user:\n    client-certificate: {crt}\n    client-key: {key}\n",
        ca = pki.join("ca.crt").display(),
        user = id.user,
        crt = pki.join(format!("{name}.crt")).display(),
        key = pki.join(format!("{name}.key")).display(),
    ))
}

/// kube-apiserver's audit policy: level Metadata (user, verb, resource, namespace,
/// name, response code; no bodies) for every request, stage RequestReceived omitted
/// (one line per request).
pub const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";

/// kube-apiserver's `--authorization-config`: the testbed's webhook first (no caching,
/// so `api deny|allow` acts on the next request; no opinion when the daemon is gone),
/// then Node and RBAC.
pub fn authorization_config(webhook_kubeconfig: &std::path::Path) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthorizationConfiguration\nauthorizers:\n- type: Webhook\n  name: testbed-api-deny\n  webhook:\n    timeout: 3s\n    authorizedTTL: 1s\n    unauthorizedTTL: 1s\n    cacheAuthorizedRequests: false\n    cacheUnauthorizedRequests: false\n    subjectAccessReviewVersion: v1\n    matchConditionSubjectAccessReviewVersion: v1\n    failurePolicy: NoOpinion\n    connectionInfo:\n      type: KubeConfigFile\n      kubeConfigFile: {}\n- type: Node\n  name: node\n- type: RBAC\n  name: rbac\n",
        webhook_kubeconfig.display()
    )
}

/// The kubeconfig kube-apiserver uses to reach the webhook (plain HTTP on the host
/// netns' loopback).
pub fn webhook_kubeconfig() -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed-authz\n  cluster:\n    server: http://127.0.0.1:{}/authorize\nusers:\n- name: kube-apiserver\n  user: {{}}\ncontexts:\n- name: webhook\n  context:\n    cluster: testbed-authz\n    user: kube-apiserver\ncurrent-context: webhook\n",
        crate::plan::AUTHZ_WEBHOOK_PORT
    )
}

/// Writes every identity's kubeconfig, the audit policy, the authorization config and
/// the webhook kubeconfig into `control-plane/`. Errors: file I/O.
pub fn write_configs(cfg: &Config, files: &Files) -> Result<()> {
    let dir = cfg.dir();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))
    };
    let loopback = format!("https://127.0.0.1:{}", cfg.api_port);
    for spec in IDENTITIES {
        let server = if spec.loopback {
            loopback.clone()
        } else {
            cfg.api_url()
        };
        let text = kubeconfig(cfg, files, spec.name, &server)?;
        write(&format!("{}.kubeconfig", spec.name), &text)?;
    }
    write("audit-policy.yaml", AUDIT_POLICY)?;
    let wk = dir.join("authz-webhook.kubeconfig");
    write("authz-webhook.kubeconfig", &webhook_kubeconfig())?;
    write("authorization-config.yaml", &authorization_config(&wk))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::Duration;

    fn cfg(dir: &std::path::Path) -> Config {
        Config {
            state_dir: dir.to_path_buf(),
            netns: "x".into(),
            advertise_ip: "172.20.9.1".parse().unwrap(),
            api_port: 6443,
            service_cidr: "10.201.0.0/18".parse().unwrap(),
            bin_dir: PathBuf::from("/nonexistent"),
            node_monitor_grace: Duration::from_secs(20),
            node_monitor_period: Duration::from_secs(2),
            ready_timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn identities_are_issued_with_sans_groups_and_kubeconfigs() {
        let dir = std::env::temp_dir().join(format!("fp-cp-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = cfg(&dir);
        std::fs::create_dir_all(c.dir()).unwrap();
        let f = Files::issue(&c).unwrap();
        for want in [
            "172.20.9.1",
            "10.201.0.1",
            "127.0.0.1",
            "kubernetes.default.svc.cluster.local",
        ] {
            assert!(f.apiserver_sans.iter().any(|s| s == want), "{want}");
        }
        // The admin is not in system:masters; the bootstrap identity is.
        let admin = IDENTITIES.iter().find(|i| i.name == ADMIN).unwrap();
        assert!(!admin.groups.contains(&"system:masters"));
        assert_eq!(admin.cluster_role, Some("cluster-admin"));
        let boot = IDENTITIES.iter().find(|i| i.name == BOOTSTRAP).unwrap();
        assert_eq!(boot.groups, ["system:masters"]);
        // Certificates are signed by the CA file that stays.
        assert_eq!(
            std::fs::read_to_string(dir.join("pki/ca.crt")).unwrap(),
            f.ca_pem
        );
        for spec in IDENTITIES {
            assert!(dir.join(format!("pki/{}.key", spec.name)).is_file());
            assert!(f.client_config(spec.name).is_ok());
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("pki/sa.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0);
        write_configs(&c, &f).unwrap();
        let kc = std::fs::read_to_string(c.kubeconfig_path(ADMIN)).unwrap();
        assert!(kc.contains("server: https://172.20.9.1:6443"), "{kc}");
        assert!(kc.contains("user: firstpacket-admin"));
        let kc = std::fs::read_to_string(c.kubeconfig_path(CONTROLLER_MANAGER)).unwrap();
        assert!(kc.contains("server: https://127.0.0.1:6443"), "{kc}");
        let az = std::fs::read_to_string(c.dir().join("authorization-config.yaml")).unwrap();
        let webhook = az.find("type: Webhook").unwrap();
        assert!(webhook < az.find("type: Node").unwrap());
        assert!(az.find("type: Node").unwrap() < az.find("type: RBAC").unwrap());
        assert!(az.contains("cacheUnauthorizedRequests: false"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
