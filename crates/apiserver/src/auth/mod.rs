//! Authentication and authorization. Every request is authenticated into a
//! [`UserInfo`] ([`authn`]) and checked by an [`Authorizer`] before it
//! reaches the registry; standalone mode authorizes with RBAC evaluated
//! in-process ([`rbac`]) and serves the review kinds kubectl asks
//! (`kubectl auth can-i`, `kubectl auth whoami`; [`reviews`]).
//!
//! The shape follows k8s.io/apiserver's: an authenticator chain (client
//! certificate, bearer tokens, anonymous on health paths only), then one
//! authorizer answering SubjectAccessReview-shaped [`Attributes`]. The same
//! authorizer answers registry strategies' second questions (virtual verbs
//! such as `export` on a VPC).

use std::collections::BTreeMap;
use std::sync::Arc;

pub mod authn;
pub mod bootstrap;
pub mod delegated;
pub mod escalation;
pub mod node;
pub mod proto;
pub mod rbac;
pub mod reviews;
pub mod serviceaccount;

pub use authn::{Authenticator, Authn, Credentials, PeerIdentity};

/// The group every authenticated user is in.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group of the anonymous user.
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
/// The group whose members are allowed everything without RBAC.
pub const MASTERS: &str = "system:masters";
/// The anonymous user's name.
pub const ANONYMOUS: &str = "system:anonymous";

/// Who is making a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with a name and groups (no uid, no extra).
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        }
    }

    /// The unauthenticated user.
    pub fn anonymous() -> Self {
        UserInfo::new(ANONYMOUS, &[UNAUTHENTICATED])
    }

    /// Adds `system:authenticated` unless present, as kube's authenticator
    /// chain does for every user it authenticated.
    pub fn authenticated(mut self) -> Self {
        if !self.groups.iter().any(|g| g == AUTHENTICATED) {
            self.groups.push(AUTHENTICATED.into());
        }
        self
    }

    /// Whether the user is in `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// What a request wants to do, in SubjectAccessReview terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

impl Attributes {
    /// A `get` of a non-resource path.
    pub fn non_resource(verb: &str, path: &str) -> Self {
        Attributes {
            verb: verb.into(),
            path: path.into(),
            ..Attributes::default()
        }
    }

    /// Whether this is a resource request (else a non-resource URL).
    pub fn is_resource(&self) -> bool {
        !self.resource.is_empty()
    }

    /// The message kube-apiserver answers a denial with
    /// (`vpcs.sdn.cozystack.io is forbidden: User "alice" cannot create
    /// resource "vpcs" in API group "sdn.cozystack.io" in the namespace
    /// "b"`), and the authorizer's reason after it when there is one.
    pub fn forbidden_message(&self, user: &UserInfo, reason: &str) -> String {
        let mut m = if !self.is_resource() {
            format!(
                "forbidden: User \"{}\" cannot {} path \"{}\"",
                user.name, self.verb, self.path
            )
        } else {
            let qualified = if self.group.is_empty() {
                self.resource.clone()
            } else {
                format!("{}.{}", self.resource, self.group)
            };
            let what = if self.name.is_empty() {
                qualified
            } else {
                format!("{qualified} \"{}\"", self.name)
            };
            let resource = if self.subresource.is_empty() {
                self.resource.clone()
            } else {
                format!("{}/{}", self.resource, self.subresource)
            };
            let scope = if self.namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace \"{}\"", self.namespace)
            };
            format!(
                "{what} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
                user.name, self.verb, self.group
            )
        };
        if !reason.is_empty() {
            m.push_str(": ");
            m.push_str(reason);
        }
        m
    }
}

/// An authorization decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied, with the reason (empty when nothing more can be said).
    Deny(String),
}

impl Decision {
    pub fn allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }
}

/// Decides whether a user may perform a request.
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync + 'static {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision;

    /// Every rule that applies to `user` in `namespace`, when the
    /// authorizer can enumerate them (RBAC can; a webhook cannot).
    fn rules_for(&self, _user: &UserInfo, _namespace: &str) -> Option<Vec<rbac::Rule>> {
        None
    }
}

/// Allows everything. Only tests that are not about authorization use it.
#[derive(Debug, Default)]
pub struct AllowAll;

#[async_trait::async_trait]
impl Authorizer for AllowAll {
    async fn authorize(&self, _: &UserInfo, _: &Attributes) -> Decision {
        Decision::Allow
    }
}

/// Allows members of `system:masters` and health/version paths for
/// everyone; denies the rest. The authorizer of a non-standalone server
/// until delegated authorization (SubjectAccessReview) is configured.
#[derive(Debug, Default)]
pub struct MastersOnly;

#[async_trait::async_trait]
impl Authorizer for MastersOnly {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        if user.in_group(MASTERS) {
            return Decision::Allow;
        }
        if !attrs.is_resource() && authn::is_public_path(&attrs.path) {
            return Decision::Allow;
        }
        Decision::Deny(String::new())
    }
}

/// Authenticator + authorizer of one server.
#[derive(Clone)]
pub struct Auth {
    pub authenticator: Arc<dyn Authenticator>,
    pub authorizer: Arc<dyn Authorizer>,
    /// The agents' ServiceAccount users (node restriction, `node.rs`).
    pub agent_accounts: Arc<[String]>,
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
            resource: resource.into(),
            path: path.into(),
            ..Attributes::default()
        }
    }

    #[tokio::test]
    async fn masters_only_allows_masters_and_public_paths() {
        let admin = UserInfo::new("admin", &[MASTERS]);
        let z = MastersOnly;
        assert_eq!(
            z.authorize(&admin, &attrs("pods", "")).await,
            Decision::Allow
        );
        assert!(!z
            .authorize(&UserInfo::anonymous(), &attrs("pods", ""))
            .await
            .allowed());
        assert!(z
            .authorize(&UserInfo::anonymous(), &attrs("", "/livez"))
            .await
            .allowed());
        assert!(!z
            .authorize(&UserInfo::anonymous(), &attrs("", "/metrics"))
            .await
            .allowed());
    }

    #[test]
    fn denial_messages_read_as_kube_apiserver_writes_them() {
        let u = UserInfo::new("alice", &[]);
        let a = Attributes {
            verb: "create".into(),
            group: "sdn.cozystack.io".into(),
            resource: "vpcs".into(),
            namespace: "b".into(),
            ..Attributes::default()
        };
        assert_eq!(
            a.forbidden_message(&u, ""),
            "vpcs.sdn.cozystack.io is forbidden: User \"alice\" cannot create resource \"vpcs\" in API group \"sdn.cozystack.io\" in the namespace \"b\""
        );
        let a = Attributes {
            verb: "get".into(),
            resource: "nodes".into(),
            subresource: "status".into(),
            name: "n1".into(),
            ..Attributes::default()
        };
        assert_eq!(
            a.forbidden_message(&u, "no binding"),
            "nodes \"n1\" is forbidden: User \"alice\" cannot get resource \"nodes/status\" in API group \"\" at the cluster scope: no binding"
        );
        assert_eq!(
            Attributes::non_resource("get", "/metrics").forbidden_message(&u, ""),
            "forbidden: User \"alice\" cannot get path \"/metrics\""
        );
    }
}
