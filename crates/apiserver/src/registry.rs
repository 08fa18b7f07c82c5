//! The generic registry: every kind's REST semantics over [`Storage`],
//! driven by its [`KindInfo`] "strategy" (validation, scope, status
//! subresource, field selectors). Objects are unstructured JSON.
//!
//! Objects are stored without `metadata.resourceVersion`; it is set from the
//! store's mod revision on every read, so it can never go stale.

use std::sync::Arc;

use cozyplane_api::kinds::{FieldError, KindInfo};
use cozyplane_errors::Chain;
use cozyplane_store::{KeyValue, ListOptions, Revision, Storage, StoreError};
use serde_json::{json, Map, Value};

use crate::hooks::{Claims, KindHooks};
use crate::keys;
use crate::limits::{
    deeper_than, raw_deeper_than, DECODE_DEPTH, MAX_GRACE_SECONDS, MAX_OBJECT_BYTES,
    MAX_OBJECT_DEPTH,
};
use crate::meta;
use crate::patch::{self, PatchType};
use crate::schema;
use crate::selectors::Selectors;
use crate::status::{self, ApiError};

/// A registered kind with its precomputed schema.
#[derive(Debug)]
pub struct KindEntry {
    pub info: KindInfo,
    /// `(info.schema)()`, computed once at registration.
    pub schema: Value,
    /// Kind-specific behaviour (graceful deletion, extra subresources).
    pub hooks: KindHooks,
}

impl KindEntry {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.info.group.is_empty() {
            self.info.version.to_string()
        } else {
            format!("{}/{}", self.info.group, self.info.version)
        }
    }
}

/// `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(s: Option<&str>) -> Result<Self, ApiError> {
        match s {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

/// A check run just before a write is stored, with what the registry
/// will store (after defaulting, patching and validation) and, on update,
/// what is stored now. The HTTP layer uses it to ask the authorizer the
/// kind's second questions with the requesting user.
#[async_trait::async_trait]
pub trait Admit: Send + Sync {
    async fn admit(
        &self,
        kind: &KindEntry,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError>;

    /// A check run just before a delete (or, with finalizers, the marking
    /// for deletion): `old` is what is stored, `None` when it cannot be
    /// decoded.
    async fn admit_delete(
        &self,
        _kind: &KindEntry,
        _old: Option<&Value>,
        _name: &str,
    ) -> Result<(), ApiError> {
        Ok(())
    }
}

/// Options common to writes.
#[derive(Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    pub field_manager: Option<String>,
    pub admit: Option<Arc<dyn Admit>>,
}

impl std::fmt::Debug for WriteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteOptions")
            .field("dry_run", &self.dry_run)
            .field("field_validation", &self.field_validation)
            .field("field_manager", &self.field_manager)
            .field("admit", &self.admit.is_some())
            .finish()
    }
}

/// The result of a write: the object as stored (or as it would be stored
/// under dryRun), and warnings for the `Warning` header.
#[derive(Debug, Clone)]
pub struct Written {
    pub object: Value,
    pub warnings: Vec<String>,
    /// True when the write created the object (201 instead of 200).
    pub created: bool,
}

/// Parameters of a list.
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    pub selectors: Selectors,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

/// Parsed `DeleteOptions` (body and query).
#[derive(Clone, Default)]
pub struct DeleteOptions {
    pub dry_run: bool,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    /// Accepted for compatibility; there is no garbage collector to honour it.
    pub propagation_policy: Option<String>,
    /// `gracePeriodSeconds`; only kinds with a graceful-deletion hook use it.
    pub grace_period_seconds: Option<i64>,
    /// Checked before the delete, with the stored object.
    pub admit: Option<Arc<dyn Admit>>,
}

impl std::fmt::Debug for DeleteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeleteOptions")
            .field("dry_run", &self.dry_run)
            .field("precondition_uid", &self.precondition_uid)
            .field("precondition_rv", &self.precondition_rv)
            .field("propagation_policy", &self.propagation_policy)
            .field("grace_period_seconds", &self.grace_period_seconds)
            .field("admit", &self.admit.is_some())
            .finish()
    }
}

/// How many times a read-modify-write retries on a concurrent write.
const MAX_RETRIES: usize = 8;

/// The registry over one store.
pub struct Registry {
    store: Arc<dyn Storage>,
    kinds: Vec<Arc<KindEntry>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("kinds", &self.kinds)
            .finish_non_exhaustive()
    }
}

/// Parse a resourceVersion string.
pub fn parse_rv(s: &str) -> Result<Revision, ApiError> {
    s.parse::<Revision>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

/// Decode a stored value, setting `metadata.resourceVersion`.
pub fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    let mut v: Value = serde_json::from_slice(&kv.value).map_err(|e| {
        ApiError::internal(format!(
            "stored object {} is corrupt: {}",
            kv.key,
            Chain(&e)
        ))
    })?;
    if let Some(m) = meta::meta_mut(&mut v) {
        m.insert(
            "resourceVersion".into(),
            Value::String(kv.mod_revision.to_string()),
        );
    }
    Ok(v)
}

/// [`decode`] for lists and watches: an object the server cannot decode (a
/// corrupt value, or one nested past the decoder's limit by an older
/// server) is left out with a warning instead of failing the whole list or
/// watch; it can still be deleted by name.
pub fn decode_or_skip(kv: &KeyValue) -> Option<Value> {
    match decode(kv) {
        Ok(v) => Some(v),
        Err(e) => {
            warn_undecodable(&kv.key, &e.message);
            None
        }
    }
}

fn warn_undecodable(key: &str, why: &str) {
    tracing::warn!(
        %key,
        error = %why,
        "left out of a list or watch: the stored object cannot be decoded (delete it by name)"
    );
}

/// Give a schema whose `metadata` is a bare `object` (CRD-style schemas)
/// the full `ObjectMeta` schema, keeping its description: unknown metadata
/// fields are then detected and `kubectl explain` shows metadata fields.
fn with_object_meta(mut schema: Value) -> Value {
    let Some(meta) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("metadata"))
    else {
        return schema;
    };
    if meta.get("properties").is_some() {
        return schema;
    }
    let description = meta.get("description").cloned();
    let root = schemars::SchemaGenerator::default()
        .into_root_schema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(
    );
    let mut full = crate::schema::inline_refs(&root.to_value());
    if let (Some(d), Some(o)) = (description, full.as_object_mut()) {
        o.insert("description".into(), d);
    }
    *meta = full;
    schema
}

/// The first bytes of every object [`encode`] writes.
const CANONICAL_PREFIX: &[u8] = b"{\"metadata\":{";

/// Encode an object for storage, without `metadata.resourceVersion`, in the
/// canonical layout `{"metadata":{...},<other fields>}`: metadata first, so
/// reads can splice the resourceVersion in without parsing (see
/// [`splice_rv`]).
pub(crate) fn encode(obj: &Value) -> Result<Vec<u8>, ApiError> {
    let err = |e: serde_json::Error| ApiError::internal(format!("encode: {}", Chain(&e)));
    let Some(o) = obj.as_object() else {
        return Err(ApiError::internal("encode: not an object"));
    };
    let mut m = o
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    m.remove("resourceVersion");
    let mut out = b"{\"metadata\":".to_vec();
    serde_json::to_writer(&mut out, &m).map_err(err)?;
    for (k, v) in o.iter().filter(|(k, _)| k.as_str() != "metadata") {
        out.push(b',');
        serde_json::to_writer(&mut out, k).map_err(err)?;
        out.push(b':');
        serde_json::to_writer(&mut out, v).map_err(err)?;
    }
    out.push(b'}');
    Ok(out)
}

/// [`encode`], refusing an object nested deeper (422) or larger (413) than
/// the server stores.
fn encode_bounded(obj: &Value) -> Result<Vec<u8>, ApiError> {
    if deeper_than(obj, MAX_OBJECT_DEPTH) {
        return Err(ApiError::too_deep(MAX_OBJECT_DEPTH));
    }
    let raw = encode(obj)?;
    if raw.len() > MAX_OBJECT_BYTES {
        return Err(ApiError::object_too_large(raw.len(), MAX_OBJECT_BYTES));
    }
    Ok(raw)
}

/// Append `raw` (an object in the canonical layout) to `out` with
/// `"resourceVersion":"<rev>"` inserted first in its metadata. Returns false,
/// appending nothing, when `raw` is not in the canonical layout.
fn splice_rv(raw: &[u8], rev: Revision, out: &mut Vec<u8>) -> bool {
    let Some(rest) = raw.strip_prefix(CANONICAL_PREFIX) else {
        return false;
    };
    out.extend_from_slice(CANONICAL_PREFIX);
    out.extend_from_slice(b"\"resourceVersion\":\"");
    out.extend_from_slice(rev.to_string().as_bytes());
    out.push(b'"');
    if !rest.starts_with(b"}") {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    true
}

fn set_rv(obj: &mut Value, rev: Revision) {
    if let Some(m) = meta::meta_mut(obj) {
        m.insert("resourceVersion".into(), Value::String(rev.to_string()));
    }
}

/// RFC 3339 UTC with seconds, kube's `metav1.Time` format.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// `metadata.generation` follows spec changes: one more than `old`'s when
/// `new` changes anything but metadata and status.
fn bump_generation(old: &Value, new: &mut Value) {
    if spec_part(new) == spec_part(old) {
        return;
    }
    let gen = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        + 1;
    if let Some(m) = meta::meta_mut(new) {
        m.insert("generation".into(), json!(gen));
    }
}

/// The parts of an object that are neither metadata nor status: a change
/// in them bumps `metadata.generation`.
fn spec_part(obj: &Value) -> Map<String, Value> {
    obj.as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn dedup(mut errs: Vec<FieldError>) -> Vec<FieldError> {
    let mut out: Vec<FieldError> = Vec::new();
    for e in errs.drain(..) {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// Apply a patch to `old` on a blocking thread, returning `old` with the
/// result: the patch functions are CPU-bound and linear in the sizes of the
/// object and the patch — megabytes near the limits, hundreds of
/// milliseconds for a strategic merge of 300 000 finalizers — which on an
/// async worker would hold up every other request and watch it serves. A
/// panic in the patch is resumed here, so the handler's own panic guard
/// answers it 500 as before.
async fn apply_patch(
    ptype: PatchType,
    old: Value,
    body: Arc<Value>,
) -> Result<(Value, Value), ApiError> {
    let job = tokio::task::spawn_blocking(move || {
        let patched = match ptype {
            PatchType::Merge | PatchType::Apply => patch::apply_merge_patch(&old, &body),
            PatchType::Json => patch::apply_json_patch(&old, &body),
            PatchType::Strategic => patch::apply_strategic_merge_patch(&old, &body),
        };
        patched.map(|p| (old, p))
    });
    match job.await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(ApiError::internal(format!(
            "the patch could not be computed: {}",
            Chain(&e)
        ))),
    }
}

/// `metadata.deletionGracePeriodSeconds`, if set.
fn deletion_grace(obj: &Value) -> Option<i64> {
    obj.pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64)
}

/// What a DELETE does to an object that is not simply removed.
#[derive(Debug, PartialEq, Eq)]
enum Mark {
    /// Already marked with a grace period no longer than the request's.
    Unchanged,
    /// Write these deletion fields and keep the object.
    Set { timestamp: String, grace: i64 },
    /// Nothing keeps the object: remove it.
    Remove,
}

/// The deletion mark of an object that has finalizers or gets a grace
/// period `grace` > 0. As in Kubernetes, `deletionTimestamp` is the time
/// the object is due (now + grace), a second DELETE may only shorten the
/// grace period (moving the timestamp earlier by the difference), and an
/// object without finalizers whose grace drops to 0 is removed.
fn deletion_mark(obj: &Value, grace: i64) -> Mark {
    let has_finalizers = !meta::finalizers(obj).is_empty();
    let existing = meta::meta_str(obj, "deletionTimestamp")
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc));
    // Checked arithmetic throughout: the periods come from clients (and
    // from stored objects), and chrono panics on overflow.
    let secs = |s: i64| chrono::TimeDelta::try_seconds(s).unwrap_or(chrono::TimeDelta::MAX);
    let (timestamp, grace) = match (existing, deletion_grace(obj)) {
        (Some(_), Some(old)) if old <= grace => return Mark::Unchanged,
        (Some(ts), Some(old)) => (
            ts.checked_sub_signed(secs(old.saturating_sub(grace)))
                .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC),
            grace,
        ),
        (Some(_), None) => return Mark::Unchanged,
        (None, _) => (
            chrono::Utc::now()
                .checked_add_signed(secs(grace))
                .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
            grace,
        ),
    };
    if grace == 0 && !has_finalizers {
        return Mark::Remove;
    }
    Mark::Set {
        timestamp: timestamp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        grace,
    }
}

impl Registry {
    /// Build a registry of kinds without hooks; each kind's schema is
    /// computed once here.
    pub fn new(store: Arc<dyn Storage>, kinds: Vec<KindInfo>) -> Self {
        let kinds = kinds
            .into_iter()
            .map(|k| (k, KindHooks::default()))
            .collect();
        Self::with_hooks(store, kinds)
    }

    /// Build a registry of kinds, each with its [`KindHooks`].
    pub fn with_hooks(store: Arc<dyn Storage>, kinds: Vec<(KindInfo, KindHooks)>) -> Self {
        let kinds = kinds
            .into_iter()
            .map(|(info, hooks)| {
                let schema = with_object_meta((info.schema)());
                Arc::new(KindEntry {
                    info,
                    schema,
                    hooks,
                })
            })
            .collect();
        Registry { store, kinds }
    }

    pub fn store(&self) -> &Arc<dyn Storage> {
        &self.store
    }

    pub fn kinds(&self) -> &[Arc<KindEntry>] {
        &self.kinds
    }

    /// The kind served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<KindEntry>> {
        self.kinds
            .iter()
            .find(|k| k.info.group == group && k.info.version == version && k.info.plural == plural)
            .cloned()
    }

    fn err_not_found(kind: &KindEntry, name: &str) -> ApiError {
        ApiError::not_found(kind.info.group, kind.info.plural, name)
    }

    /// Check apiVersion/kind against the URL and fill them in when absent.
    fn check_type(kind: &KindEntry, obj: &mut Value) -> Result<(), ApiError> {
        let Some(o) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON or YAML object",
            ));
        };
        let want_av = kind.api_version();
        match o.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => {
                o.insert("apiVersion".into(), Value::String(want_av));
            }
            Some(av) if av == want_av => {}
            Some(av) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )))
            }
        }
        match o.get("kind").and_then(Value::as_str) {
            None | Some("") => {
                o.insert("kind".into(), Value::String(kind.info.kind.to_string()));
            }
            Some(k) if k == kind.info.kind => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    kind.info.kind
                )))
            }
        }
        Ok(())
    }

    /// Check metadata.namespace against the URL and set it.
    fn check_namespace(
        kind: &KindEntry,
        obj: &mut Value,
        namespace: Option<&str>,
    ) -> Result<(), ApiError> {
        let body_ns = meta::meta_str(obj, "namespace").map(str::to_string);
        let m = meta::meta_mut(obj)
            .ok_or_else(|| ApiError::bad_request("the request body must be an object"))?;
        if kind.info.namespaced {
            let Some(ns) = namespace else {
                return Err(ApiError::bad_request(
                    "a namespace is required for a namespaced resource",
                ));
            };
            if let Some(b) = body_ns.filter(|b| !b.is_empty()) {
                if b != ns {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
            m.insert("namespace".into(), Value::String(ns.to_string()));
        } else {
            m.remove("namespace");
        }
        Ok(())
    }

    /// Unknown-field handling per `fieldValidation`.
    fn field_validation(
        kind: &KindEntry,
        obj: &Value,
        fv: FieldValidation,
    ) -> Result<Vec<String>, ApiError> {
        if fv == FieldValidation::Ignore {
            return Ok(Vec::new());
        }
        let unknown = schema::unknown_fields(obj, &kind.schema);
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let msgs: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        if fv == FieldValidation::Strict {
            return Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                msgs.join(", ")
            )));
        }
        Ok(msgs)
    }

    fn validate(kind: &KindEntry, obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
        let mut errs = meta::validate_metadata_with(obj, kind.info.namespaced, kind.hooks.names);
        errs.extend((kind.info.validate_create)(obj));
        if let Some(old) = old {
            errs.extend((kind.info.validate_update)(obj, old));
        }
        let errs = dedup(errs);
        if errs.is_empty() {
            Ok(())
        } else {
            let name = meta::meta_str(obj, "name").unwrap_or("");
            Err(ApiError::invalid(
                kind.info.group,
                kind.info.kind,
                name,
                &errs,
            ))
        }
    }

    /// GET one object.
    pub async fn get(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let key = keys::object_key(&kind.info, namespace, name);
        match self.store.get(&key).await.map_err(ApiError::from_store)? {
            Some(kv) => decode(&kv),
            None => Err(Self::err_not_found(kind, name)),
        }
    }

    /// Namespace lifecycle admission, as kube's `NamespaceLifecycle`
    /// plugin: where namespaces are served (standalone mode), a namespaced
    /// object may only be created in a namespace that exists (404
    /// `namespaces "x" not found`) and is not being deleted (403). Without
    /// served namespaces (behind kube-apiserver) the main API server owns
    /// them and nothing is checked.
    async fn admit_namespace(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(), ApiError> {
        let (Some(ns), true) = (namespace, kind.info.namespaced) else {
            return Ok(());
        };
        let Some(ns_kind) = self.find("", "v1", "namespaces") else {
            return Ok(());
        };
        let key = keys::object_key(&ns_kind.info, None, ns);
        let Some(kv) = self.store.get(&key).await.map_err(ApiError::from_store)? else {
            return Err(ApiError::not_found("", "namespaces", ns));
        };
        // An undecodable namespace is not known to be terminating.
        let terminating = decode(&kv).is_ok_and(|n| {
            meta::meta_str(&n, "deletionTimestamp").is_some()
                || n.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating")
        });
        if terminating {
            return Err(ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                status::qualified(kind.info.group, kind.info.plural)
            ))
            .with_details(kind.info.group, kind.info.plural, name));
        }
        Ok(())
    }

    /// POST: create an object.
    pub async fn create(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        mut obj: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        Self::check_type(kind, &mut obj)?;
        Self::check_namespace(kind, &mut obj, namespace)?;
        let warnings = Self::field_validation(kind, &obj, opts.field_validation)?;
        let m = meta::meta_mut(&mut obj)
            .ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
        let has_name = m
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if !has_name {
            if let Some(prefix) = m
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
            {
                let generated = format!("{prefix}{}", random_suffix());
                m.insert("name".into(), Value::String(generated));
            }
        }
        m.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        m.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        m.insert("generation".into(), json!(1));
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(k);
        }
        if kind.info.status_subresource {
            if let Some(o) = obj.as_object_mut() {
                o.remove("status");
            }
        }
        if let Some(prepare) = kind.hooks.prepare {
            prepare(&mut obj)?;
        }
        Self::validate(kind, &obj, None)?;
        if let Some(a) = &opts.admit {
            a.admit(kind, &obj, None).await?;
        }
        let mut raw = encode_bounded(&obj)?;
        let name = meta::meta_str(&obj, "name").unwrap_or("").to_string();
        self.admit_namespace(kind, namespace, &name).await?;
        if opts.dry_run {
            let _checked = self.quota_charge(kind, namespace, &name, true).await?;
            if let Some(a) = &kind.hooks.allocate {
                // Checks and fills in what would be allocated; claims nothing.
                a.create(&self.store, &mut obj, true)
                    .await?
                    .revert(&self.store)
                    .await;
                encode_bounded(&obj)?;
            }
            return Ok(Written {
                object: obj,
                warnings,
                created: true,
            });
        }
        let key = keys::object_key(&kind.info, namespace, &name);
        // Admission: quota is charged before the write and given back when
        // the write fails (see `quota`); allocations likewise (`hooks`).
        let charge = self.quota_charge(kind, namespace, &name, false).await?;
        let mut claims = Claims::default();
        if let Some(a) = &kind.hooks.allocate {
            // `a.create` gives back its own claims when it fails.
            let step = match a.create(&self.store, &mut obj, false).await {
                Ok(made) => {
                    claims = made;
                    encode_bounded(&obj)
                }
                Err(e) => Err(e),
            };
            match step {
                Ok(r) => raw = r,
                Err(e) => {
                    claims.revert(&self.store).await;
                    self.quota_release(charge).await;
                    return Err(e);
                }
            }
        }
        let err = match self.store.create(&key, raw).await {
            Ok(rev) => {
                claims.commit(&self.store).await;
                set_rv(&mut obj, rev);
                self.quota_created(kind, &key).await;
                return Ok(Written {
                    object: obj,
                    warnings,
                    created: true,
                });
            }
            Err(StoreError::AlreadyExists { .. }) => {
                ApiError::already_exists(kind.info.group, kind.info.plural, &name)
            }
            Err(e) => ApiError::from_store(e),
        };
        claims.revert(&self.store).await;
        self.quota_release(charge).await;
        Err(err)
    }

    /// Merge an incoming full object onto the stored one the way kube's
    /// strategies do: system metadata is kept, status (or everything but
    /// status, for the /status subresource) comes from the old object, and
    /// `generation` follows spec changes.
    fn prepare_update(kind: &KindEntry, old: &Value, incoming: Value, status_only: bool) -> Value {
        let mut new = if status_only {
            let mut n = old.clone();
            if let Some(o) = n.as_object_mut() {
                match incoming.get("status") {
                    Some(s) => {
                        o.insert("status".into(), s.clone());
                    }
                    None => {
                        o.remove("status");
                    }
                }
            }
            n
        } else {
            let mut n = incoming;
            if kind.info.status_subresource {
                if let Some(o) = n.as_object_mut() {
                    match old.get("status") {
                        Some(s) => {
                            o.insert("status".into(), s.clone());
                        }
                        None => {
                            o.remove("status");
                        }
                    }
                }
            }
            n
        };
        let old_meta = old
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if let Some(m) = meta::meta_mut(&mut new) {
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "name",
                "namespace",
                "generation",
            ] {
                match old_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            m.remove("resourceVersion");
        }
        bump_generation(old, &mut new);
        if let Some(rv) = old_meta.get("resourceVersion") {
            if let Some(m) = meta::meta_mut(&mut new) {
                m.insert("resourceVersion".into(), rv.clone());
            }
        }
        new
    }

    /// Validate and write `new` over `old` (stored at `rev`). `Ok(None)`
    /// means a concurrent write won and the caller may retry.
    async fn commit(
        &self,
        kind: &KindEntry,
        key: &str,
        old: &Value,
        rev: Revision,
        mut new: Value,
        opts: &WriteOptions,
    ) -> Result<Option<Value>, ApiError> {
        if let Some(prepare_update) = kind.hooks.prepare_update {
            prepare_update(&mut new, old);
        }
        if let Some(prepare) = kind.hooks.prepare {
            prepare(&mut new)?;
        }
        Self::validate(kind, &new, Some(old))?;
        if &new == old {
            return Ok(Some(new));
        }
        if let Some(a) = &opts.admit {
            a.admit(kind, &new, Some(old)).await?;
        }
        // Only an object whose deletion is due (grace period 0) goes when
        // its last finalizer does; one in graceful deletion (a terminating
        // pod) stays until its owner deletes it again with grace 0.
        let finalizing = meta::meta_str(&new, "deletionTimestamp").is_some()
            && deletion_grace(&new).unwrap_or(0) == 0
            && meta::finalizers(&new).is_empty();
        // Allocations the update adds are claimed now, given back when it
        // fails; what it gives up is released once it is stored.
        let mut claims = Claims::default();
        if let (Some(a), false) = (&kind.hooks.allocate, finalizing) {
            claims = a.update(&self.store, old, &mut new, opts.dry_run).await?;
        }
        // Checked under dryRun too; not when the write removes the object.
        let raw = if finalizing {
            Vec::new()
        } else {
            match encode_bounded(&new) {
                Ok(raw) => raw,
                Err(e) => {
                    claims.revert(&self.store).await;
                    return Err(e);
                }
            }
        };
        if opts.dry_run {
            claims.revert(&self.store).await;
            return Ok(Some(new));
        }
        if finalizing {
            return match self.store.delete(key, Some(rev)).await {
                Ok((_, del_rev)) => {
                    self.quota_removed(kind, meta::meta_str(old, "namespace"))
                        .await;
                    if let Some(a) = &kind.hooks.allocate {
                        a.removed(&self.store, old).await;
                    }
                    set_rv(&mut new, del_rev);
                    Ok(Some(new))
                }
                Err(StoreError::Conflict { .. }) => Ok(None),
                Err(StoreError::NotFound { .. }) => Err(Self::err_not_found(
                    kind,
                    meta::meta_str(old, "name").unwrap_or(""),
                )),
                Err(e) => Err(ApiError::from_store(e)),
            };
        }
        let result = self.store.update(key, raw, rev).await;
        if result.is_ok() {
            claims.commit(&self.store).await;
        } else {
            claims.revert(&self.store).await;
        }
        match result {
            Ok(new_rev) => {
                set_rv(&mut new, new_rev);
                Ok(Some(new))
            }
            Err(StoreError::Conflict { .. }) => Ok(None),
            Err(StoreError::NotFound { .. }) => Err(Self::err_not_found(
                kind,
                meta::meta_str(old, "name").unwrap_or(""),
            )),
            Err(e) => Err(ApiError::from_store(e)),
        }
    }

    /// PUT: replace an object (or its status), with optimistic concurrency
    /// when the body carries a resourceVersion.
    pub async fn update(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        name: &str,
        mut obj: Value,
        status_only: bool,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        Self::check_type(kind, &mut obj)?;
        Self::check_namespace(kind, &mut obj, namespace)?;
        match meta::meta_str(&obj, "name") {
            Some(n) if n == name => {}
            None | Some("") => {
                if let Some(m) = meta::meta_mut(&mut obj) {
                    m.insert("name".into(), Value::String(name.to_string()));
                }
            }
            Some(n) => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
        }
        let warnings = Self::field_validation(kind, &obj, opts.field_validation)?;
        let expected = match meta::meta_str(&obj, "resourceVersion") {
            None | Some("") => None,
            Some(s) => Some(parse_rv(s)?),
        };
        let key = keys::object_key(&kind.info, namespace, name);
        for _ in 0..MAX_RETRIES {
            let Some(kv) = self.store.get(&key).await.map_err(ApiError::from_store)? else {
                return Err(Self::err_not_found(kind, name));
            };
            if expected.is_some_and(|e| e != kv.mod_revision) {
                return Err(ApiError::modified(kind.info.group, kind.info.plural, name));
            }
            let old = decode(&kv)?;
            let new = Self::prepare_update(kind, &old, obj.clone(), status_only);
            if let Some(object) = self
                .commit(kind, &key, &old, kv.mod_revision, new, opts)
                .await?
            {
                return Ok(Written {
                    object,
                    warnings,
                    created: false,
                });
            }
            if expected.is_some() {
                return Err(ApiError::modified(kind.info.group, kind.info.plural, name));
            }
        }
        Err(ApiError::modified(kind.info.group, kind.info.plural, name))
    }

    /// PATCH an object (or its status). Server-side apply creates the
    /// object when it is missing and otherwise merges the applied
    /// configuration onto it (an approximation: no managedFields, no
    /// field ownership conflicts).
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        name: &str,
        ptype: PatchType,
        body: &Value,
        status_only: bool,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        if ptype == PatchType::Apply && opts.field_manager.as_deref().is_none_or(str::is_empty) {
            return Err(ApiError::bad_request("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"));
        }
        let key = keys::object_key(&kind.info, namespace, name);
        let shared = Arc::new(body.clone());
        for _ in 0..MAX_RETRIES {
            let kv = self.store.get(&key).await.map_err(ApiError::from_store)?;
            let Some(kv) = kv else {
                if ptype == PatchType::Apply && !status_only {
                    let mut obj = body.clone();
                    if meta::meta_str(&obj, "name").is_none() {
                        if let Some(m) = meta::meta_mut(&mut obj) {
                            m.insert("name".into(), Value::String(name.to_string()));
                        }
                    }
                    if meta::meta_str(&obj, "name") != Some(name) {
                        return Err(ApiError::bad_request(
                            "the name of the object does not match the name on the URL",
                        ));
                    }
                    match self.create(kind, namespace, obj, opts).await {
                        Err(e) if e.reason == "AlreadyExists" => continue,
                        other => return other,
                    }
                }
                return Err(Self::err_not_found(kind, name));
            };
            let (old, mut patched) = apply_patch(ptype, decode(&kv)?, shared.clone()).await?;
            if meta::meta_str(&patched, "name") != Some(name) {
                return Err(ApiError::bad_request(
                    "metadata.name may not be changed by a patch",
                ));
            }
            if meta::meta_str(&patched, "namespace") != meta::meta_str(&old, "namespace") {
                return Err(ApiError::bad_request(
                    "metadata.namespace may not be changed by a patch",
                ));
            }
            Self::check_type(kind, &mut patched)?;
            if meta::meta_str(&patched, "resourceVersion")
                != meta::meta_str(&old, "resourceVersion")
            {
                return Err(ApiError::modified(kind.info.group, kind.info.plural, name));
            }
            let warnings = Self::field_validation(kind, &patched, opts.field_validation)?;
            let new = Self::prepare_update(kind, &old, patched, status_only);
            if let Some(object) = self
                .commit(kind, &key, &old, kv.mod_revision, new, opts)
                .await?
            {
                return Ok(Written {
                    object,
                    warnings,
                    created: false,
                });
            }
        }
        Err(ApiError::modified(kind.info.group, kind.info.plural, name))
    }

    /// DELETE one object. With finalizers the object only gets a
    /// deletionTimestamp; it is removed when an update drops the last one.
    pub async fn delete(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let key = keys::object_key(&kind.info, namespace, name);
        for _ in 0..MAX_RETRIES {
            let Some(kv) = self.store.get(&key).await.map_err(ApiError::from_store)? else {
                return Err(Self::err_not_found(kind, name));
            };
            let mut obj = match decode(&kv) {
                Ok(obj) => obj,
                Err(e) => match self
                    .delete_undecodable(kind, namespace, &kv, name, opts, &e)
                    .await?
                {
                    Some(done) => return Ok(done),
                    None => continue,
                },
            };
            if let Some(uid) = &opts.precondition_uid {
                let actual = meta::meta_str(&obj, "uid").unwrap_or("");
                if uid != actual {
                    return Err(ApiError::conflict(kind.info.group, kind.info.plural, name, &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    )));
                }
            }
            if let Some(rv) = &opts.precondition_rv {
                if parse_rv(rv)? != kv.mod_revision {
                    return Err(ApiError::conflict(kind.info.group, kind.info.plural, name, &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        kv.mod_revision
                    )));
                }
            }
            if let Some(a) = &opts.admit {
                a.admit_delete(kind, Some(&obj), name).await?;
            }
            let grace = kind
                .hooks
                .grace_period
                .map(|f| f(&obj, opts.grace_period_seconds))
                .unwrap_or(0)
                .min(MAX_GRACE_SECONDS);
            let has_finalizers = !meta::finalizers(&obj).is_empty();
            let mark = if grace > 0 || has_finalizers {
                deletion_mark(&obj, grace)
            } else {
                Mark::Remove
            };
            match mark {
                Mark::Unchanged => return Ok(obj),
                Mark::Set { timestamp, grace } => {
                    if let Some(m) = meta::meta_mut(&mut obj) {
                        m.insert("deletionTimestamp".into(), Value::String(timestamp));
                        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                    }
                    if opts.dry_run {
                        return Ok(obj);
                    }
                    match self
                        .store
                        .update(&key, encode(&obj)?, kv.mod_revision)
                        .await
                    {
                        Ok(rev) => {
                            set_rv(&mut obj, rev);
                            return Ok(obj);
                        }
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(StoreError::NotFound { .. }) => {
                            return Err(Self::err_not_found(kind, name))
                        }
                        Err(e) => return Err(ApiError::from_store(e)),
                    }
                }
                Mark::Remove => {}
            }
            if opts.dry_run {
                return Ok(obj);
            }
            match self.store.delete(&key, Some(kv.mod_revision)).await {
                Ok(_) => {
                    self.quota_removed(kind, namespace).await;
                    if let Some(a) = &kind.hooks.allocate {
                        a.removed(&self.store, &obj).await;
                    }
                    return Ok(obj);
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(StoreError::NotFound { .. }) => return Err(Self::err_not_found(kind, name)),
                Err(e) => return Err(ApiError::from_store(e)),
            }
        }
        Err(ApiError::modified(kind.info.group, kind.info.plural, name))
    }

    /// DELETE of a stored object that cannot be decoded: nothing of it can
    /// be read (grace period, finalizers, UID), but it must not stay
    /// undeletable, so it is removed at once. A UID precondition cannot be
    /// checked (409); a resourceVersion one is. `Ok(None)`: a concurrent
    /// write won, retry.
    async fn delete_undecodable(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        kv: &KeyValue,
        name: &str,
        opts: &DeleteOptions,
        why: &ApiError,
    ) -> Result<Option<Value>, ApiError> {
        let (group, plural) = (kind.info.group, kind.info.plural);
        if opts.precondition_uid.is_some() {
            return Err(ApiError::conflict(
                group,
                plural,
                name,
                "Precondition failed: the stored object cannot be decoded, so its UID cannot be checked",
            ));
        }
        if let Some(rv) = &opts.precondition_rv {
            if parse_rv(rv)? != kv.mod_revision {
                let why = format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    kv.mod_revision
                );
                return Err(ApiError::conflict(group, plural, name, &why));
            }
        }
        if let Some(a) = &opts.admit {
            a.admit_delete(kind, None, name).await?;
        }
        let done = status::success_status(group, plural, Some(name));
        if opts.dry_run {
            return Ok(Some(done));
        }
        match self.store.delete(&kv.key, Some(kv.mod_revision)).await {
            Ok(_) => {
                tracing::warn!(key = %kv.key, error = %why.message, "deleted a stored object that cannot be decoded");
                self.quota_removed(kind, namespace).await;
                Ok(Some(done))
            }
            Err(StoreError::Conflict { .. }) => Ok(None),
            Err(StoreError::NotFound { .. }) => Err(Self::err_not_found(kind, name)),
            Err(e) => Err(ApiError::from_store(e)),
        }
    }

    /// POST to a create-only subresource (see
    /// [`crate::hooks::CreateSubresource`]): validate the body, read the
    /// parent (404 when gone), let the hook compute the new parent and
    /// write it guarded by its resourceVersion, retrying when another write
    /// won. Returns the parent as written.
    pub async fn create_subresource(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        name: &str,
        subresource: &str,
        body: &Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let Some(hook) = kind.hooks.create_subresource(subresource) else {
            return Err(ApiError::not_found(kind.info.group, kind.info.plural, name));
        };
        (hook.validate)(body, name)?;
        let key = keys::object_key(&kind.info, namespace, name);
        for _ in 0..MAX_RETRIES {
            let Some(kv) = self.store.get(&key).await.map_err(ApiError::from_store)? else {
                return Err(Self::err_not_found(kind, name));
            };
            let old = decode(&kv)?;
            let mut new = (hook.apply)(&old, body)?;
            bump_generation(&old, &mut new);
            if let Some(object) = self
                .commit(kind, &key, &old, kv.mod_revision, new, opts)
                .await?
            {
                return Ok(object);
            }
        }
        Err(ApiError::modified(kind.info.group, kind.info.plural, name))
    }

    /// DELETE a collection: every selected object, one by one (objects
    /// with finalizers get their deletionTimestamp).
    pub async fn delete_collection(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        params: &ListParams,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let list = self.list(kind, namespace, params).await?;
        let items = list
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let per_item = DeleteOptions {
            precondition_uid: None,
            precondition_rv: None,
            ..opts.clone()
        };
        for item in items {
            let name = meta::meta_str(&item, "name").unwrap_or("").to_string();
            let ns = meta::meta_str(&item, "namespace").map(str::to_string);
            match self.delete(kind, ns.as_deref(), &name, &per_item).await {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(status::success_status(
            kind.info.group,
            kind.info.plural,
            None,
        ))
    }

    /// LIST with selectors, pagination and resourceVersion semantics.
    pub async fn list(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<Value, ApiError> {
        let (kvs, metadata) = self.list_kvs(kind, namespace, params).await?;
        let items: Vec<Value> = kvs.iter().filter_map(decode_or_skip).collect();
        Ok(json!({
            "kind": format!("{}List", kind.info.kind),
            "apiVersion": kind.api_version(),
            "metadata": metadata,
            "items": items,
        }))
    }

    /// [`Registry::list`] rendered straight to JSON bytes. Objects stored in
    /// the canonical layout (see [`encode`]) are copied into the response
    /// with their resourceVersion spliced in, without being parsed: a large
    /// unfiltered list costs little more than the storage scan.
    pub async fn list_json(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<Vec<u8>, ApiError> {
        let (kvs, metadata) = self.list_kvs(kind, namespace, params).await?;
        let head = json!({
            "kind": format!("{}List", kind.info.kind),
            "apiVersion": kind.api_version(),
            "metadata": metadata,
        });
        let mut out = serde_json::to_vec(&head)
            .map_err(|e| ApiError::internal(format!("encode: {}", Chain(&e))))?;
        out.pop(); // the closing brace
        let total: usize = kvs.iter().map(|kv| kv.value.len() + 40).sum();
        out.reserve(total + 16);
        out.extend_from_slice(b",\"items\":[");
        let mut first = true;
        for kv in &kvs {
            // Copied verbatim, an object too deep for the decoder would make
            // the whole response unreadable: leave it out, as `list` does.
            if raw_deeper_than(&kv.value, DECODE_DEPTH) {
                warn_undecodable(&kv.key, "nested deeper than the decoder's limit");
                continue;
            }
            let comma = out.len();
            if !first {
                out.push(b',');
            }
            if !splice_rv(&kv.value, kv.mod_revision, &mut out) {
                let Some(obj) = decode_or_skip(kv) else {
                    out.truncate(comma);
                    continue;
                };
                serde_json::to_writer(&mut out, &obj)
                    .map_err(|e| ApiError::internal(format!("encode: {}", Chain(&e))))?;
            }
            first = false;
        }
        out.extend_from_slice(b"]}");
        Ok(out)
    }

    /// The stored items of a list (selected, paginated) and its metadata.
    async fn list_kvs(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<(Vec<KeyValue>, Value), ApiError> {
        let prefix = keys::collection_prefix(&kind.info, namespace);
        let (mut revision, mut start_after) = match &params.continue_token {
            Some(tok) => {
                if params
                    .resource_version
                    .as_deref()
                    .is_some_and(|rv| !rv.is_empty())
                {
                    return Err(ApiError::bad_request(
                        "specifying resource version is not allowed when using continue",
                    ));
                }
                let (rev, key) = crate::continuation::decode(tok)?;
                if !key.starts_with(&prefix) {
                    return Err(ApiError::bad_request(
                        "the continue token does not belong to this list",
                    ));
                }
                (Some(rev), Some(key))
            }
            None => (self.list_revision(params).await?, None),
        };
        let limit = params.limit.filter(|l| *l > 0);
        let filtering = !params.selectors.is_empty();
        // An equality label requirement is first looked for in the stored
        // bytes: a label-selected list (an agent's claims of one pod among
        // every claim of the cluster) then decodes only its candidates.
        let needles: Vec<memchr::memmem::Finder<'static>> = params
            .selectors
            .labels
            .stored_needles()
            .iter()
            .map(|n| memchr::memmem::Finder::new(n).into_owned())
            .collect();
        let may_match = |raw: &[u8]| {
            !raw.starts_with(CANONICAL_PREFIX) || needles.iter().all(|f| f.find(raw).is_some())
        };
        let mut items = Vec::new();
        let mut next_key: Option<String> = None;
        let mut remaining: Option<u64> = None;
        let read_rev;
        loop {
            let page = match limit {
                Some(l) if filtering => Some((l - items.len()).max(64)),
                Some(l) => Some(l - items.len()),
                None => None,
            };
            let res = self
                .store
                .list(&ListOptions {
                    prefix: prefix.clone(),
                    start_after: start_after.clone(),
                    limit: page,
                    revision,
                })
                .await;
            let res = match res {
                Ok(r) => r,
                Err(StoreError::Compacted { .. }) if params.continue_token.is_some() => {
                    return Err(ApiError::expired(crate::continuation::TOO_OLD));
                }
                Err(e) => return Err(ApiError::from_store(e)),
            };
            revision = Some(res.revision);
            let page_len = res.items.len();
            let (res_remaining, res_revision) = (res.remaining, res.revision);
            let mut stopped_early = false;
            for (i, kv) in res.items.into_iter().enumerate() {
                start_after = Some(kv.key.clone());
                let selected = !filtering
                    || (may_match(&kv.value)
                        && decode_or_skip(&kv).is_some_and(|o| params.selectors.matches(&o)));
                let key = kv.key.clone();
                if selected {
                    items.push(kv);
                }
                if limit.is_some_and(|l| items.len() >= l) {
                    let more_in_page = i + 1 < page_len;
                    if more_in_page || res_remaining > 0 {
                        next_key = Some(key);
                        if !filtering {
                            remaining = Some(res_remaining + (page_len - i - 1) as u64);
                        }
                    }
                    stopped_early = true;
                    break;
                }
            }
            if stopped_early || res_remaining == 0 || page.is_none() {
                read_rev = res_revision;
                break;
            }
        }
        let mut metadata = json!({"resourceVersion": read_rev.to_string()});
        if let Some(k) = next_key {
            metadata["continue"] = Value::String(crate::continuation::encode(read_rev, &k));
            if let Some(r) = remaining.filter(|r| *r > 0) {
                metadata["remainingItemCount"] = json!(r);
            }
        }
        Ok((items, metadata))
    }

    /// The revision a list reads at, from resourceVersion/resourceVersionMatch.
    async fn list_revision(&self, params: &ListParams) -> Result<Option<Revision>, ApiError> {
        let rv = params.resource_version.as_deref().filter(|s| !s.is_empty());
        match (rv, params.resource_version_match.as_deref().filter(|s| !s.is_empty())) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(ApiError::bad_request("resourceVersionMatch is forbidden unless resourceVersion is provided")),
            (Some("0"), None) | (Some("0"), Some("NotOlderThan")) => Ok(None),
            (Some(rv), Some("Exact")) => {
                let rev = parse_rv(rv)?;
                if rev == 0 {
                    return Err(ApiError::bad_request("resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\""));
                }
                Ok(Some(rev))
            }
            (Some(rv), None) | (Some(rv), Some("NotOlderThan")) => {
                let rev = parse_rv(rv)?;
                let current = self.store.current_revision().await.map_err(ApiError::from_store)?;
                if rev > current {
                    return Err(ApiError::too_large_resource_version(rev, current));
                }
                Ok(None)
            }
            (Some(_), Some(other)) => Err(ApiError::bad_request(format!(
                "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_metadata_gets_object_meta() {
        let s = with_object_meta(
            json!({"type": "object", "properties": {"metadata": {"type": "object", "description": "d"}}}),
        );
        assert_eq!(s["properties"]["metadata"]["description"], "d");
        assert_eq!(
            s["properties"]["metadata"]["properties"]["labels"]["type"],
            "object"
        );
        let unknown =
            crate::schema::unknown_fields(&json!({"metadata": {"name": "a", "labelz": {}}}), &s);
        assert_eq!(unknown, vec!["metadata.labelz"]);
    }

    #[test]
    fn deletion_marks_only_shorten() {
        let fresh = json!({"metadata": {"name": "a"}});
        let Mark::Set { timestamp, grace } = deletion_mark(&fresh, 30) else {
            panic!("a first graceful delete marks");
        };
        assert_eq!(grace, 30);
        let due = chrono::DateTime::parse_from_rfc3339(&timestamp).map(|t| t.timestamp());
        let now = chrono::Utc::now().timestamp();
        assert!(
            due.is_ok_and(|d| (now + 29..=now + 31).contains(&d)),
            "{timestamp}"
        );

        let marked = json!({"metadata": {"name": "a", "deletionTimestamp": "2030-01-01T00:01:00Z", "deletionGracePeriodSeconds": 60}});
        assert_eq!(deletion_mark(&marked, 60), Mark::Unchanged);
        assert_eq!(deletion_mark(&marked, 90), Mark::Unchanged);
        assert_eq!(
            deletion_mark(&marked, 10),
            Mark::Set {
                timestamp: "2030-01-01T00:00:10Z".into(),
                grace: 10
            }
        );
        assert_eq!(deletion_mark(&marked, 0), Mark::Remove);
        // Periods from clients or stored objects never overflow the time.
        assert!(matches!(deletion_mark(&fresh, i64::MAX), Mark::Set { .. }));
        let odd = json!({"metadata": {"name": "a", "deletionTimestamp": "2030-01-01T00:01:00Z", "deletionGracePeriodSeconds": i64::MAX}});
        assert!(matches!(
            deletion_mark(&odd, -1),
            Mark::Set { grace: -1, .. }
        ));
        let mut kept = marked.clone();
        kept["metadata"]["finalizers"] = json!(["x"]);
        assert_eq!(
            deletion_mark(&kept, 0),
            Mark::Set {
                timestamp: "2030-01-01T00:00:00Z".into(),
                grace: 0
            }
        );
    }

    #[test]
    fn canonical_encoding_splices_the_resource_version() {
        for obj in [
            json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "resourceVersion": "9"}, "spec": {"z": [1, {"k": "v"}]}}),
            json!({"metadata": {}, "b": null}),
            json!({"kind": "NoMeta"}),
        ] {
            let raw = encode(&obj).unwrap_or_default();
            assert!(raw.starts_with(CANONICAL_PREFIX));
            let mut out = Vec::new();
            assert!(splice_rv(&raw, 42, &mut out));
            let spliced: Value = serde_json::from_slice(&out).unwrap_or_default();
            let kv = KeyValue {
                key: "k".into(),
                value: raw,
                create_revision: 1,
                mod_revision: 42,
            };
            assert_eq!(Some(spliced), decode(&kv).ok(), "{obj}");
        }
        let mut out = Vec::new();
        assert!(!splice_rv(
            br#"{"apiVersion":"v1","metadata":{}}"#,
            1,
            &mut out
        ));
        assert!(out.is_empty());
    }
}
