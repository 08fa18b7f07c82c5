//! Authentication: who a request comes from.
//!
//! The chain is kube-apiserver's: a client certificate verified during the
//! TLS handshake against the client CA (CN = user, O = groups), else a
//! bearer token (the static token file in `--token-auth-file` format, and
//! whatever else is plugged in as a [`TokenAuthenticator`]), else no
//! credentials. A presented credential that does not verify is a 401, never
//! a fall-back to anonymous. A request with no credentials is
//! `system:anonymous` on the public health paths only and a 401 elsewhere,
//! as kube-apiserver answers with anonymous access restricted to those
//! endpoints (its `AuthenticationConfiguration` anonymous conditions).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::UserInfo;
use crate::status::ApiError;

/// The identity in a client certificate that the TLS layer verified.
/// Computed once per connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// CN and O of the certificate.
    pub user: UserInfo,
    /// The certificate's end of validity, checked on every request of a
    /// long-lived connection.
    pub not_after: SystemTime,
    /// Whether the certificate is a front proxy's (it chains to the
    /// request-header CA and its CN is an allowed name): the user is then
    /// in the request headers, not in the certificate.
    pub front_proxy: bool,
}

/// Front-proxy (request-header) authentication, as kube's aggregation
/// layer uses it: kube-apiserver proxies a request to an aggregated API
/// server over TLS with a client certificate from the request-header CA,
/// and names the user in headers. The headers count only on such a
/// connection; anywhere else they are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaderConfig {
    /// CNs a front-proxy certificate may have; empty allows any.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefixes: Vec<String>,
}

impl Default for RequestHeaderConfig {
    fn default() -> Self {
        RequestHeaderConfig {
            allowed_names: Vec::new(),
            username_headers: vec!["X-Remote-User".into()],
            uid_headers: vec!["X-Remote-Uid".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_headers_prefixes: vec!["X-Remote-Extra-".into()],
        }
    }
}

impl RequestHeaderConfig {
    /// The user a front proxy names in `headers`; `None` without a user
    /// name header.
    pub fn user(&self, headers: &http::HeaderMap) -> Option<UserInfo> {
        let first = |names: &[String]| {
            names.iter().find_map(|n| {
                headers
                    .get(n.as_str())
                    .and_then(|v| v.to_str().ok())
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)
            })
        };
        let name = first(&self.username_headers)?;
        let uid = first(&self.uid_headers).unwrap_or_default();
        let groups = self
            .group_headers
            .iter()
            .flat_map(|n| headers.get_all(n.as_str()).iter())
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect();
        let mut extra: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (k, v) in headers {
            let key = k.as_str();
            for prefix in &self.extra_headers_prefixes {
                let p = prefix.to_ascii_lowercase();
                if let Some(rest) = key.strip_prefix(p.as_str()) {
                    // Extra keys are percent-encoded in header names.
                    let k = percent_encoding::percent_decode_str(rest)
                        .decode_utf8_lossy()
                        .to_lowercase();
                    if let Ok(v) = v.to_str() {
                        extra.entry(k).or_default().push(v.to_string());
                    }
                }
            }
        }
        Some(UserInfo {
            name,
            uid,
            groups,
            extra,
        })
    }
}

/// Classifies verified client certificates: a front proxy's (chains to the
/// request-header CA, allowed CN) or a user's (chains to the client CA).
pub struct CertAuthority {
    client: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    proxy: Option<(
        Arc<dyn rustls::server::danger::ClientCertVerifier>,
        Vec<String>,
    )>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority")
            .field("client", &self.client.is_some())
            .field("proxy", &self.proxy.is_some())
            .finish()
    }
}

impl CertAuthority {
    pub fn new(
        client: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
        proxy: Option<(
            Arc<dyn rustls::server::danger::ClientCertVerifier>,
            Vec<String>,
        )>,
    ) -> Self {
        CertAuthority { client, proxy }
    }

    /// The identity of a presented chain (end entity first), or `None`
    /// when it verifies against neither CA (or has no CN).
    pub fn identify(
        &self,
        chain: &[rustls::pki_types::CertificateDer<'_>],
    ) -> Option<PeerIdentity> {
        let (end, intermediates) = chain.split_first()?;
        let now = rustls::pki_types::UnixTime::now();
        let mut id = PeerIdentity::from_der(end)?;
        if let Some((v, allowed)) = &self.proxy {
            if v.verify_client_cert(end, intermediates, now).is_ok()
                && (allowed.is_empty() || allowed.contains(&id.user.name))
            {
                id.front_proxy = true;
                return Some(id);
            }
        }
        let client = self.client.as_ref()?;
        client.verify_client_cert(end, intermediates, now).ok()?;
        Some(id)
    }
}

impl PeerIdentity {
    /// The identity in a DER certificate: the subject's common name is the
    /// user, each organization a group. `None` without a common name.
    pub fn from_der(der: &[u8]) -> Option<PeerIdentity> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())?
            .to_string();
        if name.is_empty() {
            return None;
        }
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .map(str::to_string)
            .collect();
        let secs = u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0);
        Some(PeerIdentity {
            user: UserInfo {
                name,
                groups,
                ..UserInfo::default()
            },
            not_after: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs),
            front_proxy: false,
        })
    }
}

/// What a request presents.
#[derive(Debug, Clone, Copy)]
pub struct Credentials<'a> {
    pub headers: &'a http::HeaderMap,
    /// The verified client certificate's identity, if one was presented.
    pub peer: Option<&'a PeerIdentity>,
}

/// The result of authenticating one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authn {
    /// Authenticated; `system:authenticated` is among the groups.
    User(UserInfo),
    /// Nothing presented.
    NoCredentials,
    /// A credential was presented and did not verify (why, for the log).
    Rejected(&'static str),
}

/// Maps a request's credentials to a user.
#[async_trait::async_trait]
pub trait Authenticator: Send + Sync + 'static {
    async fn authenticate(&self, creds: &Credentials<'_>) -> Authn;

    /// Authenticates a bare bearer token (TokenReview asks this).
    async fn authenticate_token(&self, token: &str) -> Option<UserInfo>;
}

/// Verifies bearer tokens.
#[async_trait::async_trait]
pub trait TokenAuthenticator: Send + Sync + 'static {
    /// The token's user (without `system:authenticated`), or `None`.
    async fn authenticate_token(&self, token: &str) -> Option<UserInfo>;
}

/// The paths a request without credentials may reach (as
/// `system:anonymous`): health and version, which load balancers and
/// probes ask without credentials.
pub fn is_public_path(path: &str) -> bool {
    ["/livez", "/readyz", "/healthz"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
        || path == "/version"
        || path == "/version/"
}

/// The authenticator chain of a server: front proxy (request headers),
/// client certificate, then bearer tokens.
#[derive(Default, Clone)]
pub struct AuthenticatorChain {
    tokens: Vec<Arc<dyn TokenAuthenticator>>,
    request_header: Option<RequestHeaderConfig>,
}

impl std::fmt::Debug for AuthenticatorChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthenticatorChain")
            .field("token_authenticators", &self.tokens.len())
            .finish()
    }
}

impl AuthenticatorChain {
    /// Adds a bearer token authenticator (asked in order).
    pub fn with_tokens(mut self, t: Arc<dyn TokenAuthenticator>) -> Self {
        self.tokens.push(t);
        self
    }

    /// Accepts users named by a front proxy's request headers.
    pub fn with_request_header(mut self, c: RequestHeaderConfig) -> Self {
        self.request_header = Some(c);
        self
    }
}

#[async_trait::async_trait]
impl Authenticator for AuthenticatorChain {
    async fn authenticate(&self, creds: &Credentials<'_>) -> Authn {
        if let Some(peer) = creds.peer {
            if SystemTime::now() > peer.not_after {
                return Authn::Rejected("client certificate expired");
            }
            if !peer.front_proxy {
                return Authn::User(peer.user.clone().authenticated());
            }
            // A front proxy without a user header proves nothing about
            // the user: fall through to the request's own credentials.
            if let Some(u) = self
                .request_header
                .as_ref()
                .and_then(|c| c.user(creds.headers))
            {
                return Authn::User(u.authenticated());
            }
        }
        let Some(h) = creds.headers.get(http::header::AUTHORIZATION) else {
            return Authn::NoCredentials;
        };
        let Some(token) = h.to_str().ok().and_then(bearer) else {
            // Basic and other schemes are not accepted (kube dropped
            // basic auth); as in kube they count as no credentials.
            return Authn::NoCredentials;
        };
        match Authenticator::authenticate_token(self, token).await {
            Some(u) => Authn::User(u),
            None => Authn::Rejected("invalid bearer token"),
        }
    }

    async fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        for t in &self.tokens {
            if let Some(u) = t.authenticate_token(token).await {
                return Some(u.authenticated());
            }
        }
        None
    }
}

/// The token of an `Authorization: Bearer <token>` value.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user of a request, or the 401 to answer: no credentials is
/// `system:anonymous` on the public paths only.
pub async fn resolve(
    authenticator: &dyn Authenticator,
    creds: &Credentials<'_>,
    path: &str,
) -> Result<UserInfo, ApiError> {
    match authenticator.authenticate(creds).await {
        Authn::User(u) => Ok(u),
        Authn::NoCredentials if is_public_path(path) => Ok(UserInfo::anonymous()),
        Authn::NoCredentials => Err(ApiError::unauthorized()),
        Authn::Rejected(why) => {
            tracing::debug!(why, path, "authentication failed");
            Err(ApiError::unauthorized())
        }
    }
}

/// Token file errors.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("reading the token file {}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file line {line}: {what}")]
    Line { line: usize, what: &'static str },
}

/// Static bearer tokens: kube-apiserver's `--token-auth-file` CSV
/// (`token,user,uid,"group1,group2"`), or tokens given by the embedding
/// program. Tokens are kept as SHA-256 digests, so a lookup compares
/// digests, not secrets.
#[derive(Debug, Default, Clone)]
pub struct StaticTokens {
    users: HashMap<[u8; 32], UserInfo>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl StaticTokens {
    /// Reads a token file.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses token file text. Blank lines and `#` comments are skipped;
    /// a line needs a token, a user and a uid; a token given twice is an
    /// error (kube keeps the last one silently, which hides a mistake).
    pub fn parse(text: &str) -> Result<Self, TokenFileError> {
        let mut t = StaticTokens::default();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let raw = raw.trim();
            if raw.is_empty() || raw.starts_with('#') {
                continue;
            }
            let fields = csv_fields(raw).ok_or(TokenFileError::Line {
                line,
                what: "unbalanced quotes",
            })?;
            if fields.len() < 3 {
                return Err(TokenFileError::Line {
                    line,
                    what: "needs at least 3 columns: token,user,uid",
                });
            }
            if fields[0].is_empty() || fields[1].is_empty() {
                return Err(TokenFileError::Line {
                    line,
                    what: "empty token or user",
                });
            }
            let groups = fields
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let user = UserInfo {
                name: fields[1].clone(),
                uid: fields[2].clone(),
                groups,
                ..UserInfo::default()
            };
            if t.users.insert(digest(&fields[0]), user).is_some() {
                return Err(TokenFileError::Line {
                    line,
                    what: "this token is already given on an earlier line",
                });
            }
        }
        Ok(t)
    }

    /// Adds one token.
    pub fn insert(&mut self, token: &str, user: UserInfo) {
        self.users.insert(digest(token), user);
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for StaticTokens {
    async fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        self.users.get(&digest(token)).cloned()
    }
}

/// Splits one CSV record (RFC 4180 quoting: `"a,b"`, `""` for a quote).
/// `None` when a quote is left open.
fn csv_fields(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' if quoted => quoted = false,
            '"' if at_start => quoted = true,
            ',' if !quoted => {
                fields.push(std::mem::take(&mut cur));
                at_start = true;
                continue;
            }
            c => cur.push(c),
        }
        at_start = false;
    }
    if quoted {
        return None;
    }
    fields.push(cur);
    Some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&'static str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(a) = auth {
            h.insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_static(a),
            );
        }
        h
    }

    #[test]
    fn token_files_parse_as_kube_reads_them() {
        let t = StaticTokens::parse(
            "# tenants\n\nt0k3n,alice,1001,\"tenants,devs\"\nother,bob,1002\n\"q\"\"uoted\",carol,3,ops\n",
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let alice = rt.block_on(t.authenticate_token("t0k3n")).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.uid, "1001");
        assert_eq!(alice.groups, ["tenants", "devs"]);
        let bob = rt.block_on(t.authenticate_token("other")).unwrap();
        assert!(bob.groups.is_empty());
        let carol = rt.block_on(t.authenticate_token("q\"uoted")).unwrap();
        assert_eq!(carol.groups, ["ops"]);
        assert_eq!(rt.block_on(t.authenticate_token("t0k3")), None);
    }

    #[test]
    fn bad_token_files_name_the_line() {
        for (text, want) in [
            (
                "a,b\n",
                "token file line 1: needs at least 3 columns: token,user,uid",
            ),
            (
                "ok,u,1\n\"open,u,1\n",
                "token file line 2: unbalanced quotes",
            ),
            (",u,1\n", "token file line 1: empty token or user"),
            (
                "a,u,1\na,v,2\n",
                "token file line 2: this token is already given on an earlier line",
            ),
        ] {
            let e = StaticTokens::parse(text).err().unwrap();
            assert_eq!(e.to_string(), want, "{text:?}");
        }
    }

    #[tokio::test]
    async fn the_chain_rejects_bad_credentials_and_admits_anonymous_on_health_only() {
        let mut tokens = StaticTokens::default();
        tokens.insert("good", UserInfo::new("alice", &["tenants"]));
        let chain = AuthenticatorChain::default().with_tokens(Arc::new(tokens));
        let creds = |h: &'static http::HeaderMap| Credentials {
            headers: h,
            peer: None,
        };
        static GOOD: std::sync::LazyLock<http::HeaderMap> =
            std::sync::LazyLock::new(|| headers(Some("Bearer good")));
        static BAD: std::sync::LazyLock<http::HeaderMap> =
            std::sync::LazyLock::new(|| headers(Some("Bearer bad")));
        static NONE: std::sync::LazyLock<http::HeaderMap> =
            std::sync::LazyLock::new(|| headers(None));
        static BASIC: std::sync::LazyLock<http::HeaderMap> =
            std::sync::LazyLock::new(|| headers(Some("Basic YTpi")));
        let u = resolve(&chain, &creds(&GOOD), "/api/v1/pods")
            .await
            .unwrap();
        assert_eq!(u.groups, ["tenants", "system:authenticated"]);
        for path in ["/api/v1/pods", "/livez"] {
            let e = resolve(&chain, &creds(&BAD), path).await.err().unwrap();
            assert_eq!(e.code, 401, "a bad token is never anonymous ({path})");
        }
        let e = resolve(&chain, &creds(&NONE), "/api/v1/pods")
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, 401);
        let e = resolve(&chain, &creds(&BASIC), "/apis")
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, 401);
        for path in ["/livez", "/readyz", "/healthz", "/livez/ping", "/version"] {
            let u = resolve(&chain, &creds(&NONE), path).await.unwrap();
            assert_eq!(u, UserInfo::anonymous(), "{path}");
        }
        for path in ["/livezz", "/metrics", "/api", "/openapi/v2"] {
            assert!(
                resolve(&chain, &creds(&NONE), path).await.is_err(),
                "{path}"
            );
        }
    }

    #[tokio::test]
    async fn a_verified_certificate_is_the_user_until_it_expires() {
        let chain = AuthenticatorChain::default();
        let h = http::HeaderMap::new();
        let mut peer = PeerIdentity {
            user: UserInfo::new("node-1", &["system:nodes"]),
            not_after: SystemTime::now() + std::time::Duration::from_secs(60),
            front_proxy: false,
        };
        let got = chain
            .authenticate(&Credentials {
                headers: &h,
                peer: Some(&peer),
            })
            .await;
        assert_eq!(
            got,
            Authn::User(UserInfo::new(
                "node-1",
                &["system:nodes", "system:authenticated"]
            ))
        );
        peer.not_after = SystemTime::now() - std::time::Duration::from_secs(1);
        let got = chain
            .authenticate(&Credentials {
                headers: &h,
                peer: Some(&peer),
            })
            .await;
        assert_eq!(got, Authn::Rejected("client certificate expired"));
    }

    #[tokio::test]
    async fn request_headers_count_only_from_a_front_proxy() {
        let chain =
            AuthenticatorChain::default().with_request_header(RequestHeaderConfig::default());
        let mut h = http::HeaderMap::new();
        h.insert("x-remote-user", http::HeaderValue::from_static("alice"));
        h.append("x-remote-group", http::HeaderValue::from_static("tenants"));
        h.append("x-remote-group", http::HeaderValue::from_static("devs"));
        h.insert(
            "x-remote-extra-scopes%2Fa",
            http::HeaderValue::from_static("x"),
        );
        let mut proxy = PeerIdentity {
            user: UserInfo::new("front-proxy-client", &[]),
            not_after: SystemTime::now() + std::time::Duration::from_secs(60),
            front_proxy: true,
        };
        let got = chain
            .authenticate(&Credentials {
                headers: &h,
                peer: Some(&proxy),
            })
            .await;
        let Authn::User(u) = got else {
            panic!("{got:?}")
        };
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, ["tenants", "devs", "system:authenticated"]);
        assert_eq!(u.extra["scopes/a"], ["x"]);
        // The same headers from a user's certificate or from nobody: ignored.
        proxy.front_proxy = false;
        let got = chain
            .authenticate(&Credentials {
                headers: &h,
                peer: Some(&proxy),
            })
            .await;
        assert_eq!(
            got,
            Authn::User(UserInfo::new(
                "front-proxy-client",
                &["system:authenticated"]
            ))
        );
        let got = chain
            .authenticate(&Credentials {
                headers: &h,
                peer: None,
            })
            .await;
        assert_eq!(got, Authn::NoCredentials);
        // A proxy that names nobody proves nothing.
        proxy.front_proxy = true;
        let empty = http::HeaderMap::new();
        let got = chain
            .authenticate(&Credentials {
                headers: &empty,
                peer: Some(&proxy),
            })
            .await;
        assert_eq!(got, Authn::NoCredentials);
    }
}
