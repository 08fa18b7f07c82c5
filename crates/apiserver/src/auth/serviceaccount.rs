//! ServiceAccount tokens, signed and checked by the server itself, as
//! kube-apiserver does in a cluster without an external issuer.
//!
//! A token is a JWS (ES256, P-256 key kept in `--cert-dir` as `sa.key`)
//! over kube's bound-token claims: issuer, `sub` =
//! `system:serviceaccount:<ns>:<name>`, audiences, expiry, and under
//! `kubernetes.io` the namespace, the ServiceAccount (name, uid) and, for a
//! token bound to a pod, the pod (name, uid). Tokens come only from the
//! TokenRequest subresource (`serviceaccounts/<name>/token`); there are no
//! legacy secret-based tokens.
//!
//! A token authenticates only while its signature, issuer, audience and
//! expiry hold **and** its ServiceAccount still exists with the same uid
//! **and** (bound tokens) its pod still exists with the same uid, so
//! deleting either revokes every token issued for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use cozyplane_api::kinds::{FieldError, FieldErrorType};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::authn::TokenAuthenticator;
use super::UserInfo;
use crate::registry::Registry;
use crate::status::ApiError;

/// The issuer and default audience of tokens (kube's default).
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// Shortest and longest lifetime a TokenRequest may ask (kube: 10 min
/// minimum; the maximum is ours: one year).
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
pub const MAX_EXPIRATION_SECONDS: i64 = 365 * 24 * 3600;
/// Lifetime when the request gives none (kube's default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// Signing key errors.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("the service account signing key is not a PKCS#8 P-256 key")]
    BadKey,
    #[error("signing failed")]
    Sign,
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
}

/// A name and uid in the claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

/// The `kubernetes.io` claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeClaims {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
}

/// The claims of a ServiceAccount token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kube: KubeClaims,
}

/// Signs and verifies tokens with one key.
pub struct TokenSigner {
    key: EcdsaKeyPair,
    issuer: String,
    key_id: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("issuer", &self.issuer)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl TokenSigner {
    /// A signer over a PKCS#8 (DER) P-256 key.
    pub fn from_pkcs8(der: &[u8], issuer: &str) -> Result<Self, SignerError> {
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng)
            .map_err(|_| SignerError::BadKey)?;
        // The key id is a digest of the public key, as kube derives it.
        use sha2::Digest;
        let key_id = b64(&sha2::Sha256::digest(key.public_key().as_ref()));
        Ok(TokenSigner {
            key,
            issuer: issuer.to_string(),
            key_id,
            rng,
        })
    }

    /// A signer over a PEM private key (what `sa.key` holds).
    pub fn from_pem(pem: &str, issuer: &str) -> Result<Self, SignerError> {
        let der = rustls_pemfile::private_key(&mut pem.as_bytes())
            .ok()
            .flatten()
            .ok_or(SignerError::BadKey)?;
        Self::from_pkcs8(der.secret_der(), issuer)
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The signed token for `claims`.
    pub fn sign(&self, claims: &Claims) -> Result<String, SignerError> {
        let header = serde_json::json!({"alg": "ES256", "kid": self.key_id, "typ": "JWT"});
        let payload = serde_json::to_vec(claims).map_err(|_| SignerError::Sign)?;
        let signing_input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(&payload));
        let sig = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| SignerError::Sign)?;
        Ok(format!("{signing_input}.{}", b64(sig.as_ref())))
    }

    /// The claims of `token` when its signature verifies, it is ours
    /// (issuer), it is for one of `audiences` and `now` (Unix seconds) is
    /// within its validity. Anything else: `None`.
    pub fn verify(&self, token: &str, audiences: &[String], now: i64) -> Option<Claims> {
        let mut parts = token.split('.');
        let (h, p, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let header: Value = serde_json::from_slice(&unb64(h)?).ok()?;
        if header.get("alg").and_then(Value::as_str) != Some("ES256") {
            return None;
        }
        let public = signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            self.key.public_key().as_ref(),
        );
        public
            .verify(format!("{h}.{p}").as_bytes(), &unb64(s)?)
            .ok()?;
        let claims: Claims = serde_json::from_slice(&unb64(p)?).ok()?;
        let fresh = claims.nbf <= now + 60 && now < claims.exp;
        let ours = claims.iss == self.issuer;
        let heard = claims.aud.iter().any(|a| audiences.contains(a));
        (fresh && ours && heard).then_some(claims)
    }
}

/// The user a ServiceAccount token stands for.
pub fn user_of(c: &Claims) -> UserInfo {
    let ns = &c.kube.namespace;
    let mut extra = BTreeMap::new();
    extra.insert(
        "authentication.kubernetes.io/credential-id".to_string(),
        vec![format!("JTI={}", c.jti)],
    );
    if let Some(pod) = &c.kube.pod {
        extra.insert(
            "authentication.kubernetes.io/pod-name".to_string(),
            vec![pod.name.clone()],
        );
        extra.insert(
            "authentication.kubernetes.io/pod-uid".to_string(),
            vec![pod.uid.clone()],
        );
    }
    UserInfo {
        name: format!("system:serviceaccount:{ns}:{}", c.kube.serviceaccount.name),
        uid: c.kube.serviceaccount.uid.clone(),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{ns}"),
        ],
        extra,
    }
}

/// Authenticates ServiceAccount tokens against the registry.
pub struct ServiceAccountTokens {
    pub signer: Arc<TokenSigner>,
    pub audiences: Vec<String>,
    pub registry: Arc<Registry>,
}

impl std::fmt::Debug for ServiceAccountTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountTokens")
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl ServiceAccountTokens {
    async fn uid_of(&self, plural: &str, ns: &str, name: &str) -> Option<String> {
        let kind = self.registry.find("", "v1", plural)?;
        let obj = self.registry.get(&kind, Some(ns), name).await.ok()?;
        if obj.pointer("/metadata/deletionTimestamp").is_some() && plural == "pods" {
            // A pod being deleted no longer vouches for its tokens.
            return None;
        }
        obj.pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_string)
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for ServiceAccountTokens {
    async fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        // Cheap rejection of what is not a JWS before any crypto.
        if token.matches('.').count() != 2 {
            return None;
        }
        let c = self.signer.verify(token, &self.audiences, now())?;
        let ns = &c.kube.namespace;
        let sa = &c.kube.serviceaccount;
        if self
            .uid_of("serviceaccounts", ns, &sa.name)
            .await
            .as_deref()
            != Some(&sa.uid)
        {
            return None;
        }
        if let Some(pod) = &c.kube.pod {
            if self.uid_of("pods", ns, &pod.name).await.as_deref() != Some(&pod.uid) {
                return None;
            }
        }
        Some(user_of(&c))
    }
}

/// Issues tokens through the TokenRequest subresource.
#[derive(Debug, Clone)]
pub struct Issuer {
    pub signer: Arc<TokenSigner>,
    /// Audiences a request without any gets (the API server's own).
    pub default_audiences: Vec<String>,
}

fn field_error(path: &str, message: String) -> ApiError {
    ApiError::invalid(
        "authentication.k8s.io",
        "TokenRequest",
        "",
        &[FieldError::new(FieldErrorType::Invalid, path, message)],
    )
}

impl Issuer {
    /// `POST /api/v1/namespaces/<ns>/serviceaccounts/<name>/token`.
    pub async fn token_request(
        &self,
        registry: &Registry,
        ns: &str,
        name: &str,
        mut body: Value,
    ) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("a TokenRequest must be an object"));
        }
        let spec = body.get("spec").cloned().unwrap_or(json!({}));
        let audiences: Vec<String> = match spec.get("audiences").and_then(Value::as_array) {
            Some(a) if !a.is_empty() => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .ok_or_else(|| {
                            field_error("spec.audiences", "must be non-empty strings".into())
                        })
                })
                .collect::<Result<_, _>>()?,
            _ => self.default_audiences.clone(),
        };
        let expiration = match spec.get("expirationSeconds") {
            None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
            Some(v) => v
                .as_i64()
                .filter(|s| (MIN_EXPIRATION_SECONDS..=MAX_EXPIRATION_SECONDS).contains(s))
                .ok_or_else(|| {
                    field_error(
                        "spec.expirationSeconds",
                        format!(
                            "must be between {MIN_EXPIRATION_SECONDS} and {MAX_EXPIRATION_SECONDS} seconds"
                        ),
                    )
                })?,
        };
        let sa_kind = registry
            .find("", "v1", "serviceaccounts")
            .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
        let sa = registry.get(&sa_kind, Some(ns), name).await?;
        let sa_uid = sa
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let pod = match spec.get("boundObjectRef").filter(|v| !v.is_null()) {
            None => None,
            Some(r) => {
                let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
                if kind != "Pod" {
                    return Err(field_error(
                        "spec.boundObjectRef.kind",
                        format!("{kind:?}: only a Pod can be bound"),
                    ));
                }
                let pod_name = r.get("name").and_then(Value::as_str).unwrap_or("");
                let pod_kind = registry
                    .find("", "v1", "pods")
                    .ok_or_else(|| ApiError::not_found("", "pods", pod_name))?;
                let pod = registry.get(&pod_kind, Some(ns), pod_name).await?;
                let uid = pod
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                if let Some(want) = r
                    .get("uid")
                    .and_then(Value::as_str)
                    .filter(|u| !u.is_empty())
                {
                    if want != uid {
                        return Err(ApiError::conflict(
                            "",
                            "pods",
                            pod_name,
                            &format!("the UID in the bound object reference ({want}) does not match the UID in record ({uid})"),
                        ));
                    }
                }
                let runs_as = pod
                    .pointer("/spec/serviceAccountName")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .unwrap_or("default");
                if runs_as != name {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind a token for serviceaccount {name:?} to pod {pod_name:?} running as serviceaccount {runs_as:?}"
                    )));
                }
                Some(Ref {
                    name: pod_name.to_string(),
                    uid,
                })
            }
        };
        let now = now();
        let claims = Claims {
            iss: self.signer.issuer().to_string(),
            sub: format!("system:serviceaccount:{ns}:{name}"),
            aud: audiences.clone(),
            exp: now + expiration,
            iat: now,
            nbf: now,
            jti: uuid::Uuid::new_v4().to_string(),
            kube: KubeClaims {
                namespace: ns.to_string(),
                serviceaccount: Ref {
                    name: name.to_string(),
                    uid: sa_uid,
                },
                pod: pod.clone(),
            },
        };
        let token = self
            .signer
            .sign(&claims)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let expires = chrono::DateTime::from_timestamp(claims.exp, 0)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default();
        body["apiVersion"] = json!("authentication.k8s.io/v1");
        body["kind"] = json!("TokenRequest");
        body["metadata"] = json!({"name": name, "namespace": ns, "creationTimestamp": crate::registry::now_rfc3339()});
        body["spec"]["audiences"] = json!(audiences);
        body["spec"]["expirationSeconds"] = json!(expiration);
        if let Some(p) = &pod {
            body["spec"]["boundObjectRef"] =
                json!({"kind": "Pod", "apiVersion": "v1", "name": p.name, "uid": p.uid});
        }
        body["status"] = json!({"token": token, "expirationTimestamp": expires});
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> TokenSigner {
        let key = rcgen::KeyPair::generate().unwrap();
        TokenSigner::from_pem(&key.serialize_pem(), DEFAULT_ISSUER).unwrap()
    }

    fn claims(now: i64) -> Claims {
        Claims {
            iss: DEFAULT_ISSUER.into(),
            sub: "system:serviceaccount:t1:bot".into(),
            aud: vec![DEFAULT_ISSUER.into()],
            exp: now + 600,
            iat: now,
            nbf: now,
            jti: "j1".into(),
            kube: KubeClaims {
                namespace: "t1".into(),
                serviceaccount: Ref {
                    name: "bot".into(),
                    uid: "u-sa".into(),
                },
                pod: Some(Ref {
                    name: "p".into(),
                    uid: "u-pod".into(),
                }),
            },
        }
    }

    #[test]
    fn tokens_verify_only_as_signed_for_their_audience_and_lifetime() {
        let s = signer();
        let now = 1_800_000_000;
        let aud = vec![DEFAULT_ISSUER.to_string()];
        let t = s.sign(&claims(now)).unwrap();
        assert_eq!(s.verify(&t, &aud, now), Some(claims(now)));
        assert_eq!(s.verify(&t, &aud, now + 600), None, "expired");
        assert_eq!(s.verify(&t, &aud, now - 3600), None, "not yet valid");
        assert_eq!(
            s.verify(&t, &["other".into()], now),
            None,
            "another audience"
        );
        // Another key's signature, a changed payload, alg none: refused.
        assert_eq!(signer().verify(&t, &aud, now), None);
        let mut forged = claims(now);
        forged.kube.serviceaccount.name = "admin".into();
        let parts: Vec<&str> = t.split('.').collect();
        let payload = b64(&serde_json::to_vec(&forged).unwrap());
        assert_eq!(
            s.verify(&format!("{}.{payload}.{}", parts[0], parts[2]), &aud, now),
            None
        );
        let none = b64(br#"{"alg":"none"}"#);
        assert_eq!(s.verify(&format!("{none}.{}.", parts[1]), &aud, now), None);
        assert_eq!(s.verify("a.b", &aud, now), None);
        let u = user_of(&claims(now));
        assert_eq!(u.name, "system:serviceaccount:t1:bot");
        assert_eq!(
            u.groups,
            ["system:serviceaccounts", "system:serviceaccounts:t1"]
        );
        assert_eq!(u.extra["authentication.kubernetes.io/pod-uid"], ["u-pod"]);
    }
}
