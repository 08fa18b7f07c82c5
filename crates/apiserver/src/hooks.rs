//! Per-kind behaviour beyond the generic strategy of [`crate::registry`]:
//! graceful deletion, normalization before writes, and extra subresources
//! (such as `pods/binding`).
//!
//! Why a hook table rather than `if kind == "pods"` in the registry: the
//! registry stays one generic implementation of the API conventions, and
//! every kind-specific rule lives next to its kind (see
//! [`crate::core_kinds`]), where it can be read and unit-tested on its own.
//! A kind without hooks ([`KindHooks::default`]) behaves exactly as before.
//!
//! Most hooks are pure functions. [`Allocate`] is the one that reaches the
//! store: it claims what a write allocates (a Service's cluster IPs and
//! node ports) with atomic create-if-absent writes before the object is
//! stored, and the registry gives the claims back ([`Claims::revert`]) when
//! the write then fails, so a failed write leaves no claim behind.

use std::sync::Arc;

use cozyplane_store::{Revision, Storage, StoreError};
use serde_json::Value;

use crate::status::ApiError;

/// The extra behaviour of one kind. Every field is optional.
#[derive(Debug, Clone, Default)]
pub struct KindHooks {
    /// Graceful deletion: given the stored object and the request's
    /// `gracePeriodSeconds`, the grace period the DELETE gets. `0` removes
    /// the object at once (finalizers still apply); more than zero only
    /// marks it (`deletionTimestamp` = now + grace,
    /// `deletionGracePeriodSeconds` = grace) for its owner (the kubelet) to
    /// finish. `None` = the kind has no graceful deletion and the request's
    /// grace period is ignored.
    pub grace_period: Option<fn(obj: &Value, requested: Option<i64>) -> i64>,
    /// Kind-specific normalization of an object about to be written
    /// (create, update, patch, status), run before validation: kube's
    /// `PrepareForCreate`/`PrepareForUpdate`, and the type checks its
    /// decoder makes for the fields the kind's rules read. An error is the
    /// answer (400 for a value of the wrong type, as kube's decoder).
    pub prepare: Option<Prepare>,
    /// Run on an update before [`KindHooks::prepare`], with the stored
    /// object: kube's `PrepareForUpdate` rules that need the old object
    /// (keeping values a write leaves out, dropping fields a type change
    /// leaves behind).
    pub prepare_update: Option<PrepareUpdate>,
    /// Subresources served by `POST .../<plural>/<name>/<subresource>`.
    pub create_subresources: &'static [CreateSubresource],
    /// Create-only subresources whose answer the server computes without
    /// changing the parent (`serviceaccounts/token`); the HTTP layer
    /// dispatches them by name, discovery lists them.
    pub computed_subresources: &'static [ComputedSubresource],
    /// The names the kind accepts.
    pub names: crate::meta::NameRule,
    /// Second questions for the authorizer (virtual verbs): given the
    /// object to be stored and the stored one (updates), further
    /// permissions the writer must hold, such as `export` on the VPC a
    /// VPCBinding names. Asked by the HTTP layer's admission step just
    /// before the write; any denial is a 403.
    pub second_questions: Option<SecondQuestions>,
    /// Allocation with the write (a Service's cluster IPs and node ports):
    /// see [`Allocate`].
    pub allocate: Option<Arc<dyn Allocate>>,
}

/// What a kind allocates from shared ranges when its objects are written,
/// claimed in the store so that two writers never get the same value, also
/// across API server processes sharing one etcd.
///
/// The registry calls [`Allocate::create`] or [`Allocate::update`] after
/// validation and admission, just before the write, and then either
/// [`Claims::commit`] (the write was stored) or [`Claims::revert`] (it was
/// not: a name taken, a lost compare-and-swap, a store error). When an
/// object leaves the store it calls [`Allocate::removed`]. Under dryRun the
/// hooks check and fill in values but claim nothing.
#[async_trait::async_trait]
pub trait Allocate: Send + Sync + std::fmt::Debug {
    /// Fill in and claim what a new object allocates (`obj` is written
    /// as the hook leaves it). An error is the answer (422 for a value
    /// that is taken or out of range); nothing stays claimed then.
    async fn create(
        &self,
        store: &Arc<dyn Storage>,
        obj: &mut Value,
        dry_run: bool,
    ) -> Result<Claims, ApiError>;

    /// The same for an update of `old` to `new`: keep what `new` still
    /// uses, claim what it adds, and list what it gives up for release
    /// once the update is stored.
    async fn update(
        &self,
        store: &Arc<dyn Storage>,
        old: &Value,
        new: &mut Value,
        dry_run: bool,
    ) -> Result<Claims, ApiError>;

    /// `old` has left the store: release everything it held.
    async fn removed(&self, store: &Arc<dyn Storage>, old: &Value);
}

/// Claims made for one write: keys created for it (undone when the write
/// fails) and keys it gives up (released once the write is stored). Each
/// claim value names its owner at `/spec/parentRef`; a release deletes a
/// key only while it still names the same owner, so it never frees what
/// another object claimed meanwhile.
#[derive(Debug, Default)]
#[must_use = "claims must be committed or reverted"]
pub struct Claims {
    /// Keys created by this write, at the revision of their creation.
    pub made: Vec<(String, Revision)>,
    /// Keys to release after the write, with the owner they must name.
    pub release: Vec<(String, Value)>,
}

impl Claims {
    /// The write was stored: release what it gave up.
    pub async fn commit(self, store: &Arc<dyn Storage>) {
        for (key, owner) in self.release {
            release_owned(store, &key, &owner).await;
        }
    }

    /// The write failed: delete the claims it made (only as they were
    /// made: a claim changed since is left alone).
    pub async fn revert(self, store: &Arc<dyn Storage>) {
        for (key, rev) in self.made {
            match store.delete(&key, Some(rev)).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(%key, error = %cozyplane_errors::Chain(&e), "could not give back a claim of a failed write; the repair loop will")
                }
            }
        }
    }
}

/// Delete the claim at `key` if it still names `owner` at
/// `/spec/parentRef`. Failures are logged: the repair loop finds claims
/// whose owner no longer holds them.
pub async fn release_owned(store: &Arc<dyn Storage>, key: &str, owner: &Value) {
    for _ in 0..4 {
        let kv = match store.get(key).await {
            Ok(Some(kv)) => kv,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(%key, error = %cozyplane_errors::Chain(&e), "could not release a claim; the repair loop will");
                return;
            }
        };
        let named = serde_json::from_slice::<Value>(&kv.value)
            .ok()
            .and_then(|v| v.pointer("/spec/parentRef").cloned());
        if named.as_ref() != Some(owner) {
            return;
        }
        match store.delete(key, Some(kv.mod_revision)).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => return,
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => {
                tracing::warn!(%key, error = %cozyplane_errors::Chain(&e), "could not release a claim; the repair loop will");
                return;
            }
        }
    }
}

/// Normalizes an object about to be written, or answers the error.
pub type Prepare = fn(obj: &mut Value) -> Result<(), ApiError>;

/// Normalizes an update of `old` before [`Prepare`].
pub type PrepareUpdate = fn(new: &mut Value, old: &Value);

/// Given the object to be stored and the stored one (updates), the
/// further permissions its writer must hold.
pub type SecondQuestions = fn(new: &Value, old: Option<&Value>) -> Vec<crate::auth::Attributes>;

/// A create-only subresource answered by the server, not stored.
#[derive(Debug, Clone, Copy)]
pub struct ComputedSubresource {
    pub name: &'static str,
    /// The request and response kind (`authentication.k8s.io/v1` `TokenRequest`).
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
}

impl KindHooks {
    /// The `create` subresource called `name`, if the kind serves one.
    pub fn create_subresource(&self, name: &str) -> Option<&'static CreateSubresource> {
        self.create_subresources.iter().find(|s| s.name == name)
    }
}

/// A subresource whose only verb is `create` and whose effect is a change
/// of the parent object (like `pods/binding`). The registry reads the
/// parent, calls [`CreateSubresource::apply`] and writes the result with
/// optimistic concurrency, retrying when another write won.
#[derive(Debug, Clone, Copy)]
pub struct CreateSubresource {
    /// The subresource path segment (`binding`).
    pub name: &'static str,
    /// The kind of the request body, for discovery (`Binding`).
    pub kind: &'static str,
    /// Check the request body before the parent is read (so a bad body is
    /// a 422 even when the parent is missing, as in Kubernetes).
    /// `parent_name` is the name on the URL.
    pub validate: fn(body: &Value, parent_name: &str) -> Result<(), ApiError>,
    /// The parent as it must be stored after the request, or the error to
    /// answer (for example 409 when the change is no longer allowed).
    pub apply: fn(parent: &Value, body: &Value) -> Result<Value, ApiError>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn releases_only_what_the_owner_holds_and_reverts_only_what_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Storage> =
            Arc::new(cozyplane_store::EmbeddedStore::open(dir.path().join("s.redb")).unwrap());
        let (a, b) = (json!({"name": "a"}), json!({"name": "b"}));
        let claim = |o: &Value| serde_json::to_vec(&json!({"spec": {"parentRef": o}})).unwrap();
        store.create("/k/1", claim(&b)).await.unwrap();
        release_owned(&store, "/k/1", &a).await;
        assert!(
            store.get("/k/1").await.unwrap().is_some(),
            "b's claim stays"
        );
        release_owned(&store, "/k/1", &b).await;
        assert!(store.get("/k/1").await.unwrap().is_none());
        release_owned(&store, "/k/1", &b).await; // gone already: fine
                                                 // A revert deletes a claim only as it was made.
        let made = store.create("/k/2", claim(&a)).await.unwrap();
        let changed = store.update("/k/2", claim(&b), made).await.unwrap();
        let stale = Claims {
            made: vec![("/k/2".into(), made)],
            release: Vec::new(),
        };
        stale.revert(&store).await;
        assert!(
            store.get("/k/2").await.unwrap().is_some(),
            "changed since: left"
        );
        let current = Claims {
            made: vec![("/k/2".into(), changed)],
            release: Vec::new(),
        };
        current.revert(&store).await;
        assert!(store.get("/k/2").await.unwrap().is_none());
    }
}
