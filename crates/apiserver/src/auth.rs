//! The authentication/authorization seam. Every request is authenticated
//! into a [`UserInfo`] and checked by an [`Authorizer`] before it reaches
//! the registry. Delegated authentication (front-proxy headers,
//! TokenReview) and authorization (SubjectAccessReview) plug in here later;
//! today there is a static bearer token and two authorizers.

use std::sync::Arc;

/// Who is making a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The unauthenticated user.
    pub fn anonymous() -> Self {
        UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
}

/// What a request wants to do, in SubjectAccessReview terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// For non-resource requests (`/version`, `/openapi/v3`...).
    pub path: String,
}

/// An authorization decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny(String),
}

/// Decides whether a user may perform a request.
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync + 'static {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision;
}

/// Maps request credentials to a user. Returns `None` for anonymous.
#[async_trait::async_trait]
pub trait Authenticator: Send + Sync + 'static {
    async fn authenticate(&self, headers: &http::HeaderMap) -> Option<UserInfo>;
}

/// Allows everything. Only standalone (development/test) mode uses it.
#[derive(Debug, Default)]
pub struct AllowAll;

#[async_trait::async_trait]
impl Authorizer for AllowAll {
    async fn authorize(&self, _: &UserInfo, _: &Attributes) -> Decision {
        Decision::Allow
    }
}

/// Allows members of `system:masters` (the kubeconfig's admin user) and
/// health/discovery paths for everyone; denies the rest. The default until
/// delegated authorization exists.
#[derive(Debug, Default)]
pub struct MastersOnly;

#[async_trait::async_trait]
impl Authorizer for MastersOnly {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        if user.groups.iter().any(|g| g == "system:masters") {
            return Decision::Allow;
        }
        if attrs.resource.is_empty()
            && matches!(
                attrs.path.as_str(),
                "/livez" | "/readyz" | "/healthz" | "/version"
            )
        {
            return Decision::Allow;
        }
        Decision::Deny(format!(
            "User \"{}\" cannot {} resource \"{}\"",
            user.name, attrs.verb, attrs.resource
        ))
    }
}

/// A single static bearer token mapped to an admin user.
#[derive(Debug, Clone)]
pub struct StaticToken {
    pub token: String,
    pub user: UserInfo,
}

#[async_trait::async_trait]
impl Authenticator for StaticToken {
    async fn authenticate(&self, headers: &http::HeaderMap) -> Option<UserInfo> {
        let h = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
        let tok = h.strip_prefix("Bearer ")?;
        // Constant-time comparison is not needed for a dev token, but avoid
        // early exits on length anyway.
        let eq = tok.len() == self.token.len()
            && tok
                .bytes()
                .zip(self.token.bytes())
                .fold(0u8, |a, (x, y)| a | (x ^ y))
                == 0;
        eq.then(|| self.user.clone())
    }
}

/// Authenticator + authorizer of one server.
#[derive(Clone)]
pub struct Auth {
    pub authenticator: Arc<dyn Authenticator>,
    pub authorizer: Arc<dyn Authorizer>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(resource: &str, path: &str) -> Attributes {
        Attributes {
            verb: "get".into(),
            group: String::new(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            path: path.into(),
        }
    }

    #[tokio::test]
    async fn static_token_and_masters_only() {
        let admin = UserInfo {
            name: "admin".into(),
            groups: vec!["system:masters".into()],
        };
        let a = StaticToken {
            token: "s3cret".into(),
            user: admin.clone(),
        };
        let mut h = http::HeaderMap::new();
        assert_eq!(a.authenticate(&h).await, None);
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer s3cret"),
        );
        assert_eq!(a.authenticate(&h).await, Some(admin.clone()));
        h.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_static("Bearer s3cre"),
        );
        assert_eq!(a.authenticate(&h).await, None);
        let z = MastersOnly;
        assert_eq!(
            z.authorize(&admin, &attrs("pods", "")).await,
            Decision::Allow
        );
        assert!(matches!(
            z.authorize(&UserInfo::anonymous(), &attrs("pods", ""))
                .await,
            Decision::Deny(_)
        ));
        assert_eq!(
            z.authorize(&UserInfo::anonymous(), &attrs("", "/livez"))
                .await,
            Decision::Allow
        );
    }
}
