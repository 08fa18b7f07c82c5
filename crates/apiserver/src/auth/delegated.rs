//! Delegated authentication and authorization: how an aggregated API
//! server behind kube-apiserver trusts it, as every server built on
//! k8s.io/apiserver does.
//!
//! - The client CA and the front-proxy (request-header) settings come from
//!   the `kube-system/extension-apiserver-authentication` ConfigMap the
//!   main API server publishes (read at start; flags override it).
//! - Bearer tokens are checked by a `TokenReview` against the main API
//!   server, and every decision is a `SubjectAccessReview` against it, each
//!   cached for a short TTL (10 s, kube's default) so a burst of requests
//!   costs one round trip. The caches are bounded.
//!
//! The health paths and `system:masters` are allowed without asking, as
//! kube's delegating authorizer does.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::authn::{is_public_path, RequestHeaderConfig, TokenAuthenticator};
use super::reviews::strings;
use super::{Attributes, Authorizer, Decision, UserInfo, MASTERS};

/// How long an answer of the main API server is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Most answers kept per cache; past it expired ones are dropped, then all.
const CACHE_MAX: usize = 10_000;

/// Errors reaching the main API server.
#[derive(Debug, thiserror::Error)]
pub enum DelegationError {
    #[error("reading the kubeconfig {}", path.display())]
    Kubeconfig {
        path: std::path::PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("building a client for the main API server")]
    Client(#[source] kube::Error),
    #[error("the in-cluster configuration (ServiceAccount token, KUBERNETES_SERVICE_HOST)")]
    InCluster(#[source] kube::config::InClusterError),
    #[error("asking the main API server: {0}")]
    Request(String),
}

/// A client of the main API server.
#[derive(Clone)]
pub struct Remote {
    client: kube::Client,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Remote")
    }
}

impl Remote {
    /// A client from the pod's ServiceAccount (no `--*-kubeconfig` given, in
    /// a pod: what every server built on k8s.io/apiserver falls back to).
    pub fn in_cluster() -> Result<Self, DelegationError> {
        let cfg = kube::Config::incluster().map_err(DelegationError::InCluster)?;
        let client = kube::Client::try_from(cfg).map_err(DelegationError::Client)?;
        Ok(Remote { client })
    }

    /// Whether this process runs in a pod (the in-cluster variables are set).
    pub fn in_a_pod() -> bool {
        std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
            && std::env::var_os("KUBERNETES_SERVICE_PORT").is_some()
    }

    /// A client from a kubeconfig file (`--authentication-kubeconfig`).
    pub async fn from_kubeconfig(path: &Path) -> Result<Self, DelegationError> {
        let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| {
            DelegationError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            }
        })?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|source| DelegationError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            })?;
        let client = kube::Client::try_from(cfg).map_err(DelegationError::Client)?;
        Ok(Remote { client })
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, DelegationError> {
        let bytes =
            serde_json::to_vec(body).map_err(|e| DelegationError::Request(e.to_string()))?;
        let req = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(bytes)
            .map_err(|e| DelegationError::Request(e.to_string()))?;
        self.client
            .request::<Value>(req)
            .await
            .map_err(|e| DelegationError::Request(cozyplane_errors::Chain(&e).to_string()))
    }

    async fn get(&self, path: &str) -> Result<Value, DelegationError> {
        let req = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| DelegationError::Request(e.to_string()))?;
        self.client
            .request::<Value>(req)
            .await
            .map_err(|e| DelegationError::Request(cozyplane_errors::Chain(&e).to_string()))
    }

    /// The authentication settings the main API server publishes.
    pub async fn extension_authentication(
        &self,
    ) -> Result<ExtensionAuthentication, DelegationError> {
        let cm = self
            .get("/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication")
            .await?;
        Ok(ExtensionAuthentication::from_config_map(&cm))
    }
}

/// What `extension-apiserver-authentication` says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtensionAuthentication {
    pub client_ca: Option<String>,
    pub request_header: Option<(String, RequestHeaderConfig)>,
}

/// The name of the ConfigMap and its namespace.
pub const CONFIG_MAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

fn json_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_str)
        .and_then(|s| serde_json::from_str::<Vec<String>>(s).ok())
        .unwrap_or_default()
}

impl ExtensionAuthentication {
    pub fn from_config_map(cm: &Value) -> Self {
        let data = &cm["data"];
        let s = |k: &str| data.get(k).and_then(Value::as_str).map(str::to_string);
        let request_header = s("requestheader-client-ca-file").map(|ca| {
            let d = RequestHeaderConfig::default();
            let or = |v: Vec<String>, d: Vec<String>| if v.is_empty() { d } else { v };
            (
                ca,
                RequestHeaderConfig {
                    allowed_names: json_list(data.get("requestheader-allowed-names")),
                    username_headers: or(
                        json_list(data.get("requestheader-username-headers")),
                        d.username_headers,
                    ),
                    uid_headers: or(
                        json_list(data.get("requestheader-uid-headers")),
                        d.uid_headers,
                    ),
                    group_headers: or(
                        json_list(data.get("requestheader-group-headers")),
                        d.group_headers,
                    ),
                    extra_headers_prefixes: or(
                        json_list(data.get("requestheader-extra-headers-prefix")),
                        d.extra_headers_prefixes,
                    ),
                },
            )
        });
        ExtensionAuthentication {
            client_ca: s("client-ca-file"),
            request_header,
        }
    }

    /// The ConfigMap a main API server publishes for these settings.
    pub fn to_config_map(&self) -> Value {
        let mut data = serde_json::Map::new();
        if let Some(ca) = &self.client_ca {
            data.insert("client-ca-file".into(), json!(ca));
        }
        if let Some((ca, c)) = &self.request_header {
            let list = |v: &Vec<String>| json!(serde_json::to_string(v).unwrap_or_default());
            data.insert("requestheader-client-ca-file".into(), json!(ca));
            data.insert("requestheader-allowed-names".into(), list(&c.allowed_names));
            data.insert(
                "requestheader-username-headers".into(),
                list(&c.username_headers),
            );
            data.insert("requestheader-uid-headers".into(), list(&c.uid_headers));
            data.insert("requestheader-group-headers".into(), list(&c.group_headers));
            data.insert(
                "requestheader-extra-headers-prefix".into(),
                list(&c.extra_headers_prefixes),
            );
        }
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": CONFIG_MAP.1, "namespace": CONFIG_MAP.0}, "data": data})
    }
}

/// A bounded TTL cache.
struct Cache<V> {
    entries: Mutex<HashMap<[u8; 32], (V, Instant)>>,
}

impl<V: Clone> Cache<V> {
    fn new() -> Self {
        Cache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, k: &[u8; 32]) -> Option<V> {
        let m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        m.get(k)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(v, _)| v.clone())
    }

    fn put(&self, k: [u8; 32], v: V) {
        let mut m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= CACHE_MAX {
            m.retain(|_, (_, at)| at.elapsed() < CACHE_TTL);
            if m.len() >= CACHE_MAX {
                m.clear();
            }
        }
        m.insert(k, (v, Instant::now()));
    }
}

/// Bearer tokens checked by TokenReview against the main API server.
pub struct DelegatedTokens {
    remote: Remote,
    audiences: Vec<String>,
    cache: Cache<Option<UserInfo>>,
}

impl std::fmt::Debug for DelegatedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedTokens").finish_non_exhaustive()
    }
}

impl DelegatedTokens {
    pub fn new(remote: Remote, audiences: Vec<String>) -> Self {
        DelegatedTokens {
            remote,
            audiences,
            cache: Cache::new(),
        }
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for DelegatedTokens {
    async fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cache.get(&key) {
            return hit;
        }
        let mut spec = json!({"token": token});
        if !self.audiences.is_empty() {
            spec["audiences"] = json!(self.audiences);
        }
        let review =
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec});
        let answer = match self
            .remote
            .post("/apis/authentication.k8s.io/v1/tokenreviews", &review)
            .await
        {
            Ok(a) => a,
            Err(e) => {
                // Not cached: the next request asks again.
                tracing::warn!(error = %cozyplane_errors::Chain(&e), "TokenReview failed");
                return None;
            }
        };
        let status = &answer["status"];
        let user = (status["authenticated"] == true).then(|| {
            let u = &status["user"];
            UserInfo {
                name: u["username"].as_str().unwrap_or_default().to_string(),
                uid: u["uid"].as_str().unwrap_or_default().to_string(),
                groups: strings(Some(&u["groups"])),
                extra: u["extra"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), strings(Some(v))))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        });
        let user = user.filter(|u| !u.name.is_empty());
        self.cache.put(key, user.clone());
        user
    }
}

/// Decisions by SubjectAccessReview against the main API server.
pub struct DelegatedAuthorizer {
    remote: Remote,
    cache: Cache<Decision>,
}

impl std::fmt::Debug for DelegatedAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedAuthorizer")
            .finish_non_exhaustive()
    }
}

impl DelegatedAuthorizer {
    pub fn new(remote: Remote) -> Self {
        DelegatedAuthorizer {
            remote,
            cache: Cache::new(),
        }
    }
}

/// The SubjectAccessReview asking whether `user` may do `a`.
pub fn access_review(user: &UserInfo, a: &Attributes) -> Value {
    let mut spec = json!({"user": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        spec["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        spec["extra"] = json!(user.extra);
    }
    if a.is_resource() {
        spec["resourceAttributes"] = json!({
            "namespace": a.namespace, "verb": a.verb, "group": a.group,
            "resource": a.resource, "subresource": a.subresource, "name": a.name,
        });
    } else {
        spec["nonResourceAttributes"] = json!({"path": a.path, "verb": a.verb});
    }
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
}

#[async_trait::async_trait]
impl Authorizer for DelegatedAuthorizer {
    async fn authorize(&self, user: &UserInfo, a: &Attributes) -> Decision {
        if user.in_group(MASTERS) || (!a.is_resource() && is_public_path(&a.path)) {
            return Decision::Allow;
        }
        let review = access_review(user, a);
        let key: [u8; 32] = Sha256::digest(review.to_string().as_bytes()).into();
        if let Some(hit) = self.cache.get(&key) {
            return hit;
        }
        let d = match self
            .remote
            .post(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                &review,
            )
            .await
        {
            Ok(answer) if answer["status"]["allowed"] == true => Decision::Allow,
            Ok(answer) => Decision::Deny(
                answer["status"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
            Err(e) => {
                tracing::warn!(error = %cozyplane_errors::Chain(&e), "SubjectAccessReview failed");
                // Not cached: a transient failure denies this request only.
                return Decision::Deny("the authorizer could not be reached".into());
            }
        };
        self.cache.put(key, d.clone());
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_map_round_trips() {
        let e = ExtensionAuthentication {
            client_ca: Some("CA".into()),
            request_header: Some((
                "PROXY".into(),
                RequestHeaderConfig {
                    allowed_names: vec!["front-proxy-client".into()],
                    ..RequestHeaderConfig::default()
                },
            )),
        };
        let cm = e.to_config_map();
        assert_eq!(
            cm["data"]["requestheader-allowed-names"],
            "[\"front-proxy-client\"]"
        );
        assert_eq!(ExtensionAuthentication::from_config_map(&cm), e);
        assert_eq!(
            ExtensionAuthentication::from_config_map(&json!({"data": {}})),
            ExtensionAuthentication::default()
        );
    }

    #[test]
    fn access_reviews_carry_the_user_and_the_attributes() {
        let u = UserInfo::new("alice", &["tenants"]);
        let a = Attributes {
            verb: "create".into(),
            group: "sdn.cozystack.io".into(),
            resource: "vpcs".into(),
            namespace: "a".into(),
            ..Attributes::default()
        };
        let r = access_review(&u, &a);
        assert_eq!(r["spec"]["user"], "alice");
        assert_eq!(r["spec"]["resourceAttributes"]["resource"], "vpcs");
        let r = access_review(&u, &Attributes::non_resource("get", "/metrics"));
        assert_eq!(r["spec"]["nonResourceAttributes"]["path"], "/metrics");
    }
}
