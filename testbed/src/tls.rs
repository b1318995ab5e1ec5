//! The testbed's own PKI: a CA and the API server's serving certificate, and the
//! rustls server configuration that serves with them.
//!
//! kube-rs' in-cluster config (`Config::incluster`) is https-only: it reads
//! `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt` and dials
//! `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`. So the API server needs a
//! certificate whose subjectAltNames cover the address pods use (the bridge IP) plus the
//! names kube-apiserver's own serving certificate carries (`kubernetes`,
//! `kubernetes.default`, `kubernetes.default.svc`, `kubernetes.default.svc.cluster.local`;
//! kubeadm `pkg/util/pkiutil` `GetAPIServerAltNames`).
//!
//! Files in the PKI directory (kubeadm's names under `/etc/kubernetes/pki`):
//! `ca.crt`, `ca.key`, `apiserver.crt`, `apiserver.key`; keys are written with mode 0600.
//! The CA is kept across calls of [`ensure_pki`] (so pods' `ca.crt` stays valid across
//! `testbed api restart`); the serving certificate is issued anew each time.
//!
//! Crypto: rustls with the `ring` provider chosen explicitly (kube-rs links `ring`; a
//! second provider would make rustls panic at the first handshake, a known rustls
//! pitfall).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Errors of certificate generation, PKI files and TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen could not build or sign a certificate or key.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// A PKI file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// PEM text held no usable certificate or key.
    #[error("bad PEM ({what}): {detail}")]
    Pem {
        /// `certificate` or `private key`.
        what: &'static str,
        /// Parser message.
        detail: String,
    },
    /// rustls rejected the certificate/key pair.
    #[error("rustls server config: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The CA and serving certificate, PEM encoded.
#[derive(Clone, Debug)]
pub struct Pki {
    /// CA certificate (`ca.crt`; what kubeconfigs' `certificate-authority` and pods'
    /// service-account `ca.crt` hold).
    pub ca_cert_pem: String,
    /// Serving certificate of the API server (`apiserver.crt`).
    pub cert_pem: String,
    /// Private key of the serving certificate (`apiserver.key`, PKCS#8).
    pub key_pem: String,
    /// Directory the files are in (`None` when generated in memory only).
    pub dir: Option<PathBuf>,
}

impl Pki {
    /// Path of `ca.crt`, when the PKI lives in a directory.
    pub fn ca_path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join("ca.crt"))
    }

    /// A rustls server configuration serving this certificate (see [`server_config`]).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        server_config(&self.cert_pem, &self.key_pem)
    }
}

/// The subjectAltNames the API server certificate gets: `localhost`, `127.0.0.1`,
/// `kubernetes`, `kubernetes.default`, `kubernetes.default.svc`,
/// `kubernetes.default.svc.cluster.local` (kubeadm's `GetAPIServerAltNames`) plus
/// `extra_ips` (e.g. the bridge IP) and `extra_names`, without duplicates.
pub fn api_server_sans(extra_ips: &[IpAddr], extra_names: &[&str]) -> Vec<String> {
    let mut sans: Vec<String> = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "127.0.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    sans.extend(extra_ips.iter().map(|ip| ip.to_string()));
    sans.extend(extra_names.iter().map(|s| s.to_string()));
    let mut seen = std::collections::HashSet::new();
    sans.retain(|s| seen.insert(s.clone()));
    sans
}

const CA_CN: &str = "testbed-ca";

fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_CN);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Long enough for any test run, short of rcgen's far-future default.
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2099, 1, 1);
    Ok(p)
}

fn serving_cert(sans: &[String], ca_key: &KeyPair) -> Result<(String, String), TlsError> {
    leaf_cert(
        "kube-apiserver",
        &[],
        sans,
        ExtendedKeyUsagePurpose::ServerAuth,
        ca_key,
    )
}

/// A fresh CA and a serving certificate for `sans` (IP strings become IP SANs, the rest
/// DNS SANs), in memory. ECDSA P-256 keys (rcgen's default). Errors:
/// [`TlsError::Generate`] for an invalid DNS name.
pub fn generate(sans: &[String]) -> Result<Pki, TlsError> {
    let ca_key = KeyPair::generate()?;
    let ca = ca_params()?.self_signed(&ca_key)?;
    let (cert_pem, key_pem) = serving_cert(sans, &ca_key)?;
    Ok(Pki {
        ca_cert_pem: ca.pem(),
        cert_pem,
        key_pem,
        dir: None,
    })
}

fn write(path: &Path, text: &str, private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)
}

fn read(path: &Path) -> Result<Option<String>, TlsError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TlsError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The PKI in `dir` (created if needed): keeps an existing `ca.crt`/`ca.key` pair, or
/// makes a new CA; then issues a new serving certificate for `sans` and writes
/// `apiserver.crt`/`apiserver.key` (temp file + rename, keys 0600). Errors: file I/O,
/// an unreadable `ca.key`, certificate generation.
pub fn ensure_pki(dir: &Path, sans: &[String]) -> Result<Pki, TlsError> {
    let ca = Ca::load_or_create(dir)?;
    let (ca_pem, ca_key) = (ca.cert_pem, ca.key);
    let (cert_pem, key_pem) = serving_cert(sans, &ca_key)?;
    write(&dir.join("apiserver.key"), &key_pem, true)?;
    write(&dir.join("apiserver.crt"), &cert_pem, false)?;
    Ok(Pki {
        ca_cert_pem: ca_pem,
        cert_pem,
        key_pem,
        dir: Some(dir.to_path_buf()),
    })
}

/// The testbed CA with its private key, for issuing further certificates (the real
/// control plane's identities, [`crate::control_plane`]).
pub struct Ca {
    /// CA certificate, PEM (`ca.crt`).
    pub cert_pem: String,
    key: KeyPair,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// The CA in `dir` (`ca.crt` + `ca.key`), created (and written, key 0600) when
    /// either file is missing; the same CA [`ensure_pki`] keeps. Errors: file I/O, an
    /// unreadable `ca.key`, generation.
    pub fn load_or_create(dir: &Path) -> Result<Ca, TlsError> {
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        match (read(&dir.join("ca.crt"))?, read(&dir.join("ca.key"))?) {
            (Some(c), Some(k)) => Ok(Ca {
                cert_pem: c,
                key: KeyPair::from_pem(&k)?,
            }),
            _ => {
                let key = KeyPair::generate()?;
                let cert = ca_params()?.self_signed(&key)?;
                write(&dir.join("ca.key"), &key.serialize_pem(), true)?;
                write(&dir.join("ca.crt"), &cert.pem(), false)?;
                Ok(Ca {
                    cert_pem: cert.pem(),
                    key,
                })
            }
        }
    }

    /// A serving certificate (`ServerAuth`) with common name `cn` for `sans` (IP strings
    /// become IP SANs, the rest DNS SANs): `(cert_pem, key_pem)`, ECDSA P-256, PKCS#8.
    /// Errors: [`TlsError::Generate`] for an invalid DNS name.
    pub fn issue_serving(&self, cn: &str, sans: &[String]) -> Result<(String, String), TlsError> {
        leaf_cert(
            cn,
            &[],
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
            &self.key,
        )
    }

    /// A client certificate (`ClientAuth`) as kube-apiserver's x509 authenticator reads
    /// it: user name = common name `user`, groups = one Organization each. Returns
    /// `(cert_pem, key_pem)`, ECDSA P-256, PKCS#8. Errors: [`TlsError::Generate`].
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<(String, String), TlsError> {
        leaf_cert(
            user,
            groups,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            &self.key,
        )
    }
}

/// A fresh ECDSA P-256 key pair as `(private_key_pem PKCS#8, public_key_pem SPKI)`, e.g.
/// the ServiceAccount token signing key (`sa.key`/`sa.pub`, ES256).
pub fn key_pair_pem() -> Result<(String, String), TlsError> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

fn leaf_cert(
    cn: &str,
    orgs: &[&str],
    sans: &[String],
    usage: ExtendedKeyUsagePurpose,
    ca_key: &KeyPair,
) -> Result<(String, String), TlsError> {
    let mut p = CertificateParams::new(sans.to_vec())?;
    let mut dn = DistinguishedName::new();
    for o in orgs {
        dn.push(DnType::OrganizationName, *o);
    }
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![usage];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2099, 1, 1);
    p.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate()?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let cert = p.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes `text` to `path` atomically (temp file + rename), mode 0600 when `private`
/// else 0644. Errors: [`TlsError::Io`].
pub fn write_pem(path: &Path, text: &str, private: bool) -> Result<(), TlsError> {
    write(path, text, private)
}

/// A serving certificate with common name `cn` for `sans`, signed by the CA in `dir`
/// (made by [`ensure_pki`]); returns (certificate PEM, key PEM). Nothing is written.
/// Used for the kubelets' API (`<node IP>:10250`). Errors: no/unreadable `ca.key`,
/// certificate generation.
pub fn issue_serving_cert(
    dir: &Path,
    cn: &str,
    sans: &[String],
) -> Result<(String, String), TlsError> {
    let path = dir.join("ca.key");
    let key = read(&path)?.ok_or_else(|| TlsError::Io {
        path: path.clone(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })?;
    leaf_cert(
        cn,
        &[],
        sans,
        ExtendedKeyUsagePurpose::ServerAuth,
        &KeyPair::from_pem(&key)?,
    )
}

/// The DER certificates in `pem` (kube-rs' `Config::root_cert` takes these). Errors:
/// [`TlsError::Pem`] when there is none.
pub fn certs_der(pem: &str) -> Result<Vec<Vec<u8>>, TlsError> {
    let certs: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate",
            detail: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// A rustls server configuration with the `ring` provider, TLS 1.2 and 1.3, no client
/// authentication (the testbed API is anonymous), ALPN `http/1.1` only (the front end
/// speaks HTTP/1.1; Go's and kube-rs' clients fall back to it). `cert_pem` may hold a
/// chain; `key_pem` a PKCS#8, PKCS#1 or SEC1 key. Errors: [`TlsError::Pem`],
/// [`TlsError::Rustls`].
pub fn server_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate",
            detail: "no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| TlsError::Pem {
        what: "private key",
        detail: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sans_include_kubernetes_names_and_extra_ips_once() {
        let ip: IpAddr = "172.20.3.1".parse().unwrap();
        let sans = api_server_sans(&[ip, "127.0.0.1".parse().unwrap()], &["testbed"]);
        assert!(sans.contains(&"kubernetes.default.svc".to_string()));
        assert!(sans.contains(&"172.20.3.1".to_string()));
        assert_eq!(sans.iter().filter(|s| *s == "127.0.0.1").count(), 1);
        assert_eq!(sans.last().map(String::as_str), Some("testbed"));
    }

    #[test]
    fn ensure_pki_keeps_the_ca_and_reissues_the_serving_cert() {
        let dir = std::env::temp_dir().join(format!("testbed-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sans = api_server_sans(&[], &[]);
        let a = ensure_pki(&dir, &sans).unwrap();
        let b = ensure_pki(&dir, &sans).unwrap();
        assert_eq!(a.ca_cert_pem, b.ca_cert_pem);
        assert_ne!(a.cert_pem, b.cert_pem);
        assert!(a.server_config().is_ok());
        assert_eq!(certs_der(&a.ca_cert_pem).unwrap().len(), 1);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "ca.key must not be group/other readable");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn server_config_rejects_text_without_pem_blocks() {
        assert!(matches!(
            server_config("nope", "nope"),
            Err(TlsError::Pem { .. })
        ));
    }
}
