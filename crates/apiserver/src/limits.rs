//! The bounds the server puts on what a client can make it do, in one place
//! so the docs (docs/apiserver.md, "Limits") and the code cannot drift.
//!
//! Every bound is tied to the request body limit: a request that fits in the
//! body limit must not be able to make the server store, or hold in memory,
//! much more than that.

/// The largest request body accepted (kube-apiserver's `MaxRequestBodyBytes`,
/// 3 MiB); larger bodies answer 413 RequestEntityTooLarge.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The largest object the server stores, encoded: a write whose result
/// would be larger (a patch that grows an object, an update near the body
/// limit plus the server's own metadata) answers 413, as kube-apiserver does
/// when etcd refuses a too-large request.
pub const MAX_OBJECT_BYTES: usize = MAX_BODY_BYTES;

/// The most operations one JSON patch may have (kube-apiserver's
/// `maxJSONPatchOperations`); more answer 413, as in kube.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The most bytes the `copy` operations of one JSON patch may add in total
/// (kube-apiserver's `JSONPatchMaxCopyBytes`, equal to the body limit);
/// past it the patch answers 422, as kube's json-patch library fails it.
/// Without it a ~1 KiB patch of 17 self-doubling copies stores a 6 MB object.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = MAX_BODY_BYTES;

/// The longest grace period a DELETE (`gracePeriodSeconds`) or a pod
/// (`spec.terminationGracePeriodSeconds`) gets: 100 years. kube only clamps
/// negative periods (to 1) and relies on Go's saturating time arithmetic;
/// here a larger period would overflow the deletion timestamp (and past
/// year 9999 it would not be an RFC 3339 time clients can parse), so it is
/// clamped to a bound no real grace period reaches.
pub const MAX_GRACE_SECONDS: i64 = 100 * 365 * 24 * 3600;
