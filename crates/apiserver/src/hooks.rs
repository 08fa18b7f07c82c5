//! Per-kind behaviour beyond the generic strategy of [`crate::registry`]:
//! graceful deletion, normalization before writes, and extra subresources
//! (such as `pods/binding`).
//!
//! Why a hook table rather than `if kind == "pods"` in the registry: the
//! registry stays one generic implementation of the API conventions, and
//! every kind-specific rule lives next to its kind (see
//! [`crate::core_kinds`]), where it can be read and unit-tested on its own.
//! A kind without hooks ([`KindHooks::default`]) behaves exactly as before.

use serde_json::Value;

use crate::status::ApiError;

/// The extra behaviour of one kind. Every field is optional.
#[derive(Debug, Clone, Copy, Default)]
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
}

/// Normalizes an object about to be written, or answers the error.
pub type Prepare = fn(obj: &mut Value) -> Result<(), ApiError>;

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
