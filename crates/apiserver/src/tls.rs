//! Serving certificates and the client kubeconfig.
//!
//! With no certificate given, the server makes its own CA and a serving
//! certificate signed by it (rcgen), stored in `--cert-dir` so restarts keep
//! the same CA (clients' kubeconfigs stay valid), and writes a kubeconfig
//! carrying the CA and a bearer token.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::json;

/// TLS set-up errors.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate generation failed")]
    Generate(#[from] rcgen::Error),
    #[error("{path}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no {what} found in PEM")]
    MissingPem { path: PathBuf, what: &'static str },
    #[error("invalid subject alternative name {0:?}")]
    BadName(String),
    #[error("TLS configuration")]
    Rustls(#[from] rustls::Error),
    #[error("encoding the kubeconfig")]
    Kubeconfig(#[source] serde_saphyr::ser::Error),
    #[error("client certificate verifier: {0}")]
    ClientVerifier(String),
    #[error("no CA key to sign client certificates with (the serving certificate was given, not generated)")]
    NoCaKey,
    #[error("{path}: no certificate in the client CA file")]
    EmptyClientCa { path: PathBuf },
}

/// PEM-encoded serving material.
#[derive(Debug, Clone)]
pub struct TlsMaterial {
    pub cert_pem: String,
    pub key_pem: String,
    /// The CA clients should trust.
    pub ca_pem: String,
    /// The CA's key, when the server made the CA: it then signs client
    /// certificates (the admin kubeconfig's, the lab components').
    pub ca_key_pem: Option<String>,
}

/// How a written kubeconfig authenticates.
#[derive(Debug, Clone)]
pub enum KubeconfigUser {
    /// No credentials.
    Anonymous,
    Token(String),
    /// A client certificate and its key (PEM).
    Cert {
        cert_pem: String,
        key_pem: String,
    },
}

/// Issues a client certificate for `user` in `groups` (CN and O, as
/// kube-apiserver reads them), valid for `days`, signed by the CA in `m`.
pub fn issue_client_cert(
    m: &TlsMaterial,
    user: &str,
    groups: &[&str],
    days: i64,
) -> Result<KubeconfigUser, TlsError> {
    let ca_key_pem = m.ca_key_pem.as_deref().ok_or(TlsError::NoCaKey)?;
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&m.ca_pem, ca_key)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, user);
    for g in groups {
        params.distinguished_name.push(DnType::OrganizationName, *g);
    }
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(days);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(KubeconfigUser::Cert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Replaces `path` with `data`, owner-only, atomically and durably: a new
/// temporary file with a random name beside it, created exclusively and
/// never through a symlink (a name planted in a shared directory cannot
/// redirect the write), synced, renamed over `path`, and the directory
/// synced so the rename survives a crash.
pub fn write_private(path: &Path, data: &str) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    let written = f.write_all(data.as_bytes()).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(&tmp)(e));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path)(e));
    }
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(&dir))
}

/// Generate a CA and a serving certificate for `127.0.0.1`, `::1`,
/// `localhost` and `extra_names` (IPs or DNS names).
pub fn generate(extra_names: &[String]) -> Result<TlsMaterial, TlsError> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "cozyplane-apiserver-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "cozyplane-apiserver");
    let mut names: Vec<String> = vec!["127.0.0.1".into(), "::1".into(), "localhost".into()];
    names.extend(extra_names.iter().cloned());
    for n in names {
        let san = match n.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) if crate::meta::is_dns1123_subdomain(n.trim_start_matches("*.")) => {
                SanType::DnsName(
                    n.clone()
                        .try_into()
                        .map_err(|_| TlsError::BadName(n.clone()))?,
                )
            }
            Err(_) => return Err(TlsError::BadName(n)),
        };
        if !params.subject_alt_names.contains(&san) {
            params.subject_alt_names.push(san);
        }
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(TlsMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: ca_cert.pem(),
        ca_key_pem: Some(ca_key_pem),
    })
}

/// Reuse the material in `dir` when complete, else generate and store it.
pub fn load_or_generate(dir: &Path, extra_names: &[String]) -> Result<TlsMaterial, TlsError> {
    let (ca, ca_key, crt, key) = (
        dir.join("ca.crt"),
        dir.join("ca.key"),
        dir.join("apiserver.crt"),
        dir.join("apiserver.key"),
    );
    // A directory from before the CA key was kept (no ca.key) is
    // regenerated: without the key no client certificate can be issued.
    if ca.exists() && ca_key.exists() && crt.exists() && key.exists() {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(io_err(p));
        return Ok(TlsMaterial {
            ca_pem: read(&ca)?,
            ca_key_pem: Some(read(&ca_key)?),
            cert_pem: read(&crt)?,
            key_pem: read(&key)?,
        });
    }
    create_private_dir(dir)?;
    let m = generate(extra_names)?;
    write_private(&key, &m.key_pem)?;
    write_private(&crt, &m.cert_pem)?;
    if let Some(k) = &m.ca_key_pem {
        write_private(&ca_key, k)?;
    }
    write_private(&ca, &m.ca_pem)?;
    Ok(m)
}

/// Load a certificate and key given on the command line; clients are told
/// to trust the certificate file itself (a self-signed cert or a chain).
pub fn load_files(cert: &Path, key: &Path) -> Result<TlsMaterial, TlsError> {
    let cert_pem = std::fs::read_to_string(cert).map_err(io_err(cert))?;
    let key_pem = std::fs::read_to_string(key).map_err(io_err(key))?;
    Ok(TlsMaterial {
        ca_pem: cert_pem.clone(),
        cert_pem,
        key_pem,
        ca_key_pem: None,
    })
}

/// The PEM private key at `path`, generated (P-256, mode 0600) when the
/// file does not exist.
pub fn load_or_generate_key(path: &Path) -> Result<String, TlsError> {
    match std::fs::read_to_string(path) {
        Ok(pem) => Ok(pem),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                create_private_dir(parent)?;
            }
            let pem = KeyPair::generate()?.serialize_pem();
            write_private(path, &pem)?;
            Ok(pem)
        }
        Err(e) => Err(io_err(path)(e)),
    }
}

/// Creates `dir` (and parents) with mode 0700 for the last component.
fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

/// Reads a PEM bundle of CA certificates (`--client-ca-file`).
pub fn load_client_ca(path: &Path) -> Result<String, TlsError> {
    let pem = std::fs::read_to_string(path).map_err(io_err(path))?;
    let n = rustls_pemfile::certs(&mut pem.as_bytes())
        .filter(Result::is_ok)
        .count();
    if n == 0 {
        return Err(TlsError::EmptyClientCa {
            path: path.to_path_buf(),
        });
    }
    Ok(pem)
}

/// A verifier of client certificates chaining to the CAs in `pem` (a
/// bundle); clients without a certificate are let through (they may
/// authenticate by token, or be anonymous on health paths).
pub fn client_verifier(
    pem: &str,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut pem.as_bytes()) {
        let c = c.map_err(|e| TlsError::Io {
            path: "client CA".into(),
            source: e,
        })?;
        roots.add(c)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::ClientVerifier(e.to_string()))
}

/// A rustls server config (ring provider, HTTP/2 and HTTP/1.1 by ALPN).
/// With `client_cas` (a PEM bundle: the client CA and the request-header
/// CA), client certificates are asked for and, when presented, must chain
/// to one of them.
pub fn server_config(
    m: &TlsMaterial,
    client_cas: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut m.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Io {
            path: "certificate".into(),
            source: e,
        })?;
    if certs.is_empty() {
        return Err(TlsError::MissingPem {
            path: "certificate".into(),
            what: "certificate",
        });
    }
    let key = rustls_pemfile::private_key(&mut m.key_pem.as_bytes())
        .map_err(|e| TlsError::Io {
            path: "private key".into(),
            source: e,
        })?
        .ok_or(TlsError::MissingPem {
            path: "private key".into(),
            what: "private key",
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?;
    let builder = match client_cas {
        None => builder.with_no_client_auth(),
        Some(pem) => builder.with_client_cert_verifier(client_verifier(pem)?),
    };
    let mut cfg = builder.with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Write a kubeconfig for `url`, trusting `ca_pem`, authenticating as
/// `user`, default namespace `default`. Written atomically with mode 0600.
pub fn write_kubeconfig(
    path: &Path,
    url: &str,
    ca_pem: &str,
    user: &KubeconfigUser,
) -> Result<(), TlsError> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = b64(ca_pem);
    let user = match user {
        KubeconfigUser::Anonymous => json!({}),
        KubeconfigUser::Token(token) => json!({"token": token}),
        KubeconfigUser::Cert { cert_pem, key_pem } => json!({
            "client-certificate-data": b64(cert_pem),
            "client-key-data": b64(key_pem),
        }),
    };
    let cfg = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "cozyplane", "preferences": {},
        "clusters": [{"name": "cozyplane", "cluster": {"server": url, "certificate-authority-data": ca}}],
        "users": [{"name": "cozyplane-admin", "user": user}],
        "contexts": [{"name": "cozyplane", "context": {"cluster": "cozyplane", "user": "cozyplane-admin", "namespace": "default"}}],
    });
    // Plain scalars only (no folded `>-` block for the long CA data): the same bytes
    // serde_yaml wrote, one line per field as kubectl writes kubeconfigs.
    let mut opts = serde_saphyr::SerializerOptions::default();
    opts.prefer_block_scalars = false;
    let text = serde_saphyr::to_string_with_options(&cfg, opts).map_err(TlsError::Kubeconfig)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            create_private_dir(parent)?;
        }
    }
    write_private(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_material_builds_a_server_config() {
        let m = generate(&["cozyplane.example".into(), "10.1.2.3".into()]);
        let m = match m {
            Ok(m) => m,
            Err(e) => panic!("generate: {e}"),
        };
        assert!(m.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server_config(&m, None).is_ok());
        assert!(server_config(&m, Some(&m.ca_pem)).is_ok());
        assert!(generate(&["bad name!".into()]).is_err());
    }

    #[test]
    fn kubeconfig_bytes_are_what_serde_yaml_wrote_and_kube_reads_them() {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("tempdir: {e}"),
        };
        let path = dir.path().join("kubeconfig");
        // A real CA: its base64 is far longer than a line, and must stay on one.
        let m = match generate(&[]) {
            Ok(m) => m,
            Err(e) => panic!("generate: {e}"),
        };
        let token = "0123456789abcdef0123456789abcdef";
        let user = KubeconfigUser::Token(token.into());
        if let Err(e) = write_kubeconfig(&path, "https://127.0.0.1:6443", &m.ca_pem, &user) {
            panic!("write: {e}");
        }
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&m.ca_pem);
        // The layout serde_yaml 0.9 produced (sorted keys, compact lists, plain scalars).
        let expected = format!(
            "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://127.0.0.1:6443
  name: cozyplane
contexts:
- context:
    cluster: cozyplane
    namespace: default
    user: cozyplane-admin
  name: cozyplane
current-context: cozyplane
kind: Config
preferences: {{}}
users:
- name: cozyplane-admin
  user:
    token: {token}
"
        );
        assert_eq!(std::fs::read_to_string(&path).ok(), Some(expected));
        let kc = match kube::config::Kubeconfig::read_from(&path) {
            Ok(kc) => kc,
            Err(e) => panic!("kube cannot read it: {e}"),
        };
        assert_eq!(kc.current_context.as_deref(), Some("cozyplane"));
        let cluster = kc.clusters.first().and_then(|c| c.cluster.as_ref());
        assert_eq!(
            cluster.and_then(|c| c.certificate_authority_data.as_deref()),
            Some(ca.as_str())
        );
    }

    /// A file planted where the old code put its temporary file (a symlink
    /// to something the server can write) is not written through.
    #[test]
    fn kubeconfigs_are_never_written_through_a_planted_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let path = dir.path().join("kubeconfig");
        std::os::unix::fs::symlink(&victim, path.with_extension("tmp")).unwrap();
        let m = generate(&[]).unwrap();
        write_kubeconfig(
            &path,
            "https://127.0.0.1:6443",
            &m.ca_pem,
            &KubeconfigUser::Token("t".into()),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".tmp") && n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // A symlink at the destination is replaced, not followed.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write_kubeconfig(
            &path,
            "https://127.0.0.1:6443",
            &m.ca_pem,
            &KubeconfigUser::Token("t".into()),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn cert_dir_is_reused() {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("tempdir: {e}"),
        };
        let a = load_or_generate(dir.path(), &[]).map(|m| m.ca_pem).ok();
        let b = load_or_generate(dir.path(), &[]).map(|m| m.ca_pem).ok();
        assert!(a.is_some());
        assert_eq!(a, b);
    }
}
