//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), an
//! approximation of strategic merge patch, and server-side apply.
//!
//! Strategic merge patch (SMP) in kube is driven by per-field Go struct tags
//! (`patchStrategy`, `patchMergeKey`). We approximate the tags: SMP is a JSON
//! merge patch, except that lists of objects under well-known field names
//! are merged element-wise by their merge key (`containers` by `name`,
//! `volumeMounts` by `mountPath`, `conditions` by `type`, `ports` by
//! `containerPort` or `port`, ...) and lists of scalars with merge
//! semantics in kube (`finalizers`) are unioned; any other list is
//! replaced. For those lists the merge follows kube's (apimachinery
//! `strategicpatch.mergeSlice`/`mergePatchIntoOriginal`), order included:
//!
//! - the patch's elements come in the patch's order, and each element only
//!   the server had stays where it was relative to them: it goes before a
//!   patch element only if both were on the server and it came first there.
//!   So `finalizers: [c]` on `[a, b]` gives `[c, a, b]`, and an element the
//!   patch changes keeps its place among the server's;
//! - `$setElementOrder/<f>` (kubectl sends it) orders the listed elements
//!   as listed, the server's others as above; the patch list must follow
//!   its order (400 otherwise, as in kube);
//! - `$patch: delete` in a list element removes every element with its key,
//!   `$patch: replace` makes the list the patch's other elements, `$patch:
//!   merge` is refused (400, as in kube); duplicates of a key on the server
//!   merge into the first one and stay after it;
//! - `$deleteFromPrimitiveList/<f>` removes those scalars; `$retainKeys`
//!   clears the fields not listed, and a field the patch sets must be
//!   listed (400 otherwise).
//!
//! Where we differ from kube: a map value `{"$patch": "delete"}` removes the
//! field (kube leaves `{}`); nulls and directives inside an element or map
//! the server did not have are applied rather than stored verbatim; an
//! element without the merge key on the server is kept but never matched
//! (kube fails the patch).
//!
//! Every lookup is a hash lookup on the element's identity (its merge-key
//! value, or the scalar), so the merge is linear in the sizes of the object
//! and the patch, n log n where an order is restored (0.44 s for 300 000
//! finalizers added to 300 000, where a search per patch element took 19
//! minutes: `benches/smp.rs`); lists are bounded by
//! [`MAX_SMP_LIST_ITEMS`], and the registry runs the merge on a blocking
//! thread.

use cozyplane_errors::Chain;
use serde_json::{Map, Value};

use std::collections::{HashMap, HashSet};

use crate::limits::{
    deeper_than, MAX_JSON_PATCH_COPY_BYTES, MAX_JSON_PATCH_OPERATIONS, MAX_OBJECT_DEPTH,
    MAX_SMP_LIST_ITEMS,
};
use crate::status::ApiError;

/// The patch types of the `Content-Type` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    /// Parse a `Content-Type` (parameters ignored).
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }

    /// The media type string.
    pub fn media_type(self) -> &'static str {
        match self {
            PatchType::Merge => "application/merge-patch+json",
            PatchType::Json => "application/json-patch+json",
            PatchType::Strategic => "application/strategic-merge-patch+json",
            PatchType::Apply => "application/apply-patch+yaml",
        }
    }
}

/// Apply an RFC 6902 JSON patch; failures are 422 as in kube.
///
/// Bounded as kube-apiserver bounds it (see [`crate::limits`]): more than
/// [`MAX_JSON_PATCH_OPERATIONS`] operations answer 413; `copy` operations
/// that together would add more than [`MAX_JSON_PATCH_COPY_BYTES`] answer
/// 422 before the copy that crosses the bound is made, so a patch of
/// self-doubling copies never materialises its result; an operation that
/// would nest the object deeper than [`MAX_OBJECT_DEPTH`] answers 422
/// before it is applied, so no operation ever works on a deeper value.
pub fn apply_json_patch(doc: &Value, patch: &Value) -> Result<Value, ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {}", Chain(&e))))?;
    if ops.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                ops.0.len()
            ),
        ));
    }
    let mut out = doc.clone();
    let mut copied: usize = 0;
    for (i, op) in ops.0.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(c) = op {
            if let Some(from) = out.pointer(c.from.as_str()) {
                copied = copied.saturating_add(encoded_len(from));
                if copied > MAX_JSON_PATCH_COPY_BYTES {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the JSON patch could not be applied: operation {i} (copy from {:?}): \
                             the copy operations of the patch add {copied} bytes, more than the \
                             limit of {MAX_JSON_PATCH_COPY_BYTES}",
                            c.from.as_str()
                        ),
                    ));
                }
            }
        }
        // The value an operation puts at `path` lies inside one container
        // per token of the path: refuse it before it nests the result past
        // the limit (copies into their own leaf double the depth per
        // operation, so checking only the result could be too late).
        let placed = match op {
            json_patch::PatchOperation::Add(a) => Some((&a.path, Some(&a.value))),
            json_patch::PatchOperation::Replace(r) => Some((&r.path, Some(&r.value))),
            json_patch::PatchOperation::Copy(c) => Some((&c.path, out.pointer(c.from.as_str()))),
            json_patch::PatchOperation::Move(m) => Some((&m.path, out.pointer(m.from.as_str()))),
            _ => None,
        };
        if let Some((path, Some(value))) = placed {
            let above = path.as_str().matches('/').count();
            if above > MAX_OBJECT_DEPTH || deeper_than(value, MAX_OBJECT_DEPTH - above) {
                let mut e = ApiError::too_deep(MAX_OBJECT_DEPTH);
                e.message = format!(
                    "the JSON patch could not be applied: operation {i}: {}",
                    e.message
                );
                return Err(e);
            }
        }
        // One operation at a time on a private copy: a failure discards
        // `out`, so no undo log is needed.
        json_patch::patch_unsafe(&mut out, std::slice::from_ref(op)).map_err(|e| {
            ApiError::new(
                422,
                "Invalid",
                format!(
                    "the JSON patch could not be applied: operation '/{i}' failed at path '{}': {}",
                    e.path, e.kind
                ),
            )
        })?;
    }
    Ok(out)
}

/// The length of `v` encoded as compact JSON, without building the encoding.
pub fn encoded_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a `Value` into an infallible writer cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Apply an RFC 7386 merge patch.
pub fn apply_merge_patch(doc: &Value, patch: &Value) -> Result<Value, ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request("a merge patch must be a JSON object"));
    }
    let mut out = doc.clone();
    json_patch::merge(&mut out, patch);
    Ok(out)
}

/// The merge key of a list field under SMP, or `None` to replace the list.
fn merge_key<'a>(field: &str, mut items: impl Iterator<Item = &'a Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        "readinessGates" => Some("conditionType"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" | "addresses" => Some("type"),
        "taints" => Some("key"),
        "hostAliases" => Some("ip"),
        "ports" => {
            // One pass: `containerPort` wins over `port` wherever it appears.
            let mut key = None;
            for o in items.by_ref().filter_map(Value::as_object) {
                if o.contains_key("containerPort") {
                    return Some("containerPort");
                }
                if o.contains_key("port") {
                    key = Some("port");
                }
            }
            key
        }
        _ => None,
    }
}

/// Scalar lists kube merges (union) instead of replacing.
fn is_merged_scalar_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// How the elements of a merged list are identified.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// A list of scalars (`finalizers`): an element is its own identity.
    Scalars,
    /// A list of objects merged by the value of this key.
    Keyed(&'static str),
}

/// The merge strategy of list `field`, or `None` when the list is replaced;
/// `items` are the patch's elements (and `$setElementOrder` entries), which
/// pick the merge key of `ports`.
fn shape_of<'a>(field: &str, items: impl Iterator<Item = &'a Value>) -> Option<Shape> {
    if is_merged_scalar_list(field) {
        return Some(Shape::Scalars);
    }
    merge_key(field, items).map(Shape::Keyed)
}

/// The identity of a list element (its merge-key value, or the scalar
/// itself), hashable so that every lookup is O(1): this is what makes the
/// merge linear where a search per patch element made it quadratic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Ident {
    /// An object without the merge key: never matches a patch element
    /// (those must have the key).
    Absent,
    Null,
    Bool(bool),
    Num(serde_json::Number),
    Str(String),
    /// An array or object, by its compact encoding.
    Json(String),
}

impl Ident {
    fn of(v: Option<&Value>) -> Self {
        match v {
            None => Ident::Absent,
            Some(Value::Null) => Ident::Null,
            Some(Value::Bool(b)) => Ident::Bool(*b),
            Some(Value::Number(n)) => Ident::Num(n.clone()),
            Some(Value::String(s)) => Ident::Str(s.clone()),
            Some(other) => Ident::Json(other.to_string()),
        }
    }

    fn of_element(shape: Shape, v: &Value) -> Self {
        match shape {
            Shape::Scalars => Ident::of(Some(v)),
            Shape::Keyed(key) => Ident::of(v.get(key)),
        }
    }
}

/// Where in the patched object the merge is, for error messages; built on
/// the stack, rendered only when an error names it.
#[derive(Clone, Copy)]
struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    seg: &'a str,
}

impl<'a> Path<'a> {
    const ROOT: Path<'static> = Path {
        parent: None,
        seg: "",
    };

    fn child(&'a self, seg: &'a str) -> Path<'a> {
        Path {
            parent: Some(self),
            seg,
        }
    }
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(p) = self.parent {
            if p.parent.is_some() {
                write!(f, "{p}")?;
                if !self.seg.starts_with('[') {
                    f.write_str(".")?;
                }
            }
        }
        f.write_str(self.seg)
    }
}

fn smp_error(path: &Path<'_>, what: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("strategic merge patch: {}: {what}", at(path)))
}

/// `path` for a message: the root is "the object".
fn at(path: &Path<'_>) -> String {
    let p = path.to_string();
    if p.is_empty() {
        "the object".into()
    } else {
        p
    }
}

/// 413 for a list over [`MAX_SMP_LIST_ITEMS`], as a JSON patch over its
/// operation limit is 413.
fn check_list_len(path: &Path<'_>, what: &str, len: usize) -> Result<(), ApiError> {
    if len > MAX_SMP_LIST_ITEMS {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "strategic merge patch: {}: the {what} has {len} items, more than the limit of {MAX_SMP_LIST_ITEMS}",
                at(path)
            ),
        ));
    }
    Ok(())
}

/// Apply a strategic merge patch as described in the module docs.
///
/// CPU-bound and linear (n log n where an order is restored) in the sizes
/// of the object and the patch; callers on an async runtime run it on a
/// blocking thread (see [`crate::registry`]). A list of the patch or of the
/// result with more than [`MAX_SMP_LIST_ITEMS`] elements answers 413.
pub fn apply_strategic_merge_patch(doc: &Value, patch: &Value) -> Result<Value, ApiError> {
    let Some(p) = patch.as_object() else {
        return Err(ApiError::bad_request(
            "a strategic merge patch must be a JSON object",
        ));
    };
    let mut out = doc.clone();
    if !out.is_object() {
        out = Value::Object(Map::new());
    }
    smp_map(&mut out, p, &Path::ROOT)?;
    Ok(out)
}

const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

fn smp_map(
    target: &mut Value,
    patch: &Map<String, Value>,
    path: &Path<'_>,
) -> Result<(), ApiError> {
    match patch.get("$patch") {
        None => {}
        Some(Value::String(d)) if d == "replace" => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        // Reached for the patch's root only: a field whose value is a
        // `$patch: delete` map is removed by its parent.
        Some(Value::String(d)) if d == "delete" => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some(other) => {
            return Err(smp_error(
                path,
                format_args!("unknown patch type {other} in a map"),
            ))
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else {
        return Err(ApiError::internal("smp target is not an object"));
    };
    // As kube's mergeMap: `$retainKeys` first, then the lists with a
    // `$setElementOrder`, then every other field.
    if let Some(keep) = patch.get("$retainKeys") {
        retain_keys(t, patch, keep, path)?;
    }
    let mut ordered: Vec<&str> = Vec::new();
    for (k, order) in patch {
        if let Some(field) = k.strip_prefix(SET_ELEMENT_ORDER) {
            if set_element_order(t, patch, field, order, path)? {
                ordered.push(field);
            }
        }
    }
    for (k, v) in patch {
        if k == "$patch"
            || k == "$retainKeys"
            || k.starts_with(SET_ELEMENT_ORDER)
            || ordered.contains(&k.as_str())
        {
            continue;
        }
        if let Some(field) = k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let Value::Array(drop) = v else {
                return Err(smp_error(
                    &path.child(k),
                    "the deletion list must be a list",
                ));
            };
            check_list_len(&path.child(k), "deletion list", drop.len())?;
            if let Some(Value::Array(items)) = t.get_mut(field) {
                let drop: HashSet<Ident> = drop.iter().map(|d| Ident::of(Some(d))).collect();
                items.retain(|i| !drop.contains(&Ident::of(Some(i))));
            }
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(po) => {
                if po.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                    continue;
                }
                let entry = t
                    .entry(k.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                smp_map(entry, po, &path.child(k))?;
            }
            Value::Array(items) => {
                let current = take_list(t, k);
                let merged = smp_list(k, current, items, &path.child(k))?;
                t.insert(k.clone(), Value::Array(merged));
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    Ok(())
}

/// The list stored at `t[k]`, moved out (an absent or non-list value is
/// an empty list, as merge patch replaces it).
fn take_list(t: &mut Map<String, Value>, k: &str) -> Vec<Value> {
    match t.get_mut(k).map(Value::take) {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    }
}

/// `$retainKeys`: clear every field not in the list; as in kube, a field
/// the patch sets (non-null) must be in it.
fn retain_keys(
    t: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    keep: &Value,
    path: &Path<'_>,
) -> Result<(), ApiError> {
    let bad = || smp_error(path, "$retainKeys must be a list of field names");
    let Value::Array(keep) = keep else {
        return Err(bad());
    };
    check_list_len(&path.child("$retainKeys"), "$retainKeys list", keep.len())?;
    let keep = keep
        .iter()
        .map(|k| k.as_str().ok_or_else(bad))
        .collect::<Result<HashSet<&str>, _>>()?;
    for (k, v) in patch {
        if v.is_null()
            || k == "$patch"
            || k == "$retainKeys"
            || k.starts_with(SET_ELEMENT_ORDER)
            || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
        {
            continue;
        }
        if !keep.contains(k.as_str()) {
            return Err(smp_error(
                path,
                format_args!("the patch sets {k:?}, which is not in its $retainKeys list"),
            ));
        }
    }
    t.retain(|key, _| keep.contains(key.as_str()));
    Ok(())
}

/// `$setElementOrder/<field>`: merge the patch's list for `field` (if any)
/// and order the result as kube does — the listed elements in the listed
/// order, the elements only the server has kept where they were relative
/// to the listed ones. Returns whether `field` was handled (not for lists
/// that are replaced rather than merged: there the directive has no use).
fn set_element_order(
    t: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    field: &str,
    order: &Value,
    path: &Path<'_>,
) -> Result<bool, ApiError> {
    let here = path.child(field);
    let Value::Array(order) = order else {
        return Err(smp_error(&here, "$setElementOrder must be a list"));
    };
    check_list_len(&here, "$setElementOrder list", order.len())?;
    let plist = match patch.get(field) {
        None => None,
        Some(Value::Array(p)) => Some(p.as_slice()),
        // null or a non-list: the field is removed or replaced; no order.
        Some(_) => return Ok(false),
    };
    let patch_items = plist.unwrap_or_default();
    let Some(shape) = shape_of(field, patch_items.iter().chain(order)) else {
        return Ok(false);
    };
    check_order_matches(patch_items, order, shape, &here)?;
    let current = match t.get(field) {
        Some(Value::Array(_)) => Some(take_list(t, field)),
        _ => None,
    };
    let server_order = current
        .as_deref()
        .map(|c| first_positions(shape, c))
        .unwrap_or_default();
    let merged = match (current, plist) {
        (Some(c), None) => c,
        (c, Some(p)) => smp_list(field, c.unwrap_or_default(), p, &here)?,
        (None, None) => return Ok(true),
    };
    let ordered = order_by(shape, merged, order, &server_order);
    t.insert(field.to_string(), Value::Array(ordered));
    Ok(true)
}

/// kube's check of a `$setElementOrder` list against the patch list: the
/// patch's elements (deletions aside) appear in the order list, in the
/// same relative order.
fn check_order_matches(
    patch: &[Value],
    order: &[Value],
    shape: Shape,
    path: &Path<'_>,
) -> Result<(), ApiError> {
    if patch.is_empty() || order.is_empty() {
        return Ok(());
    }
    let mut order_ids = order.iter().map(|o| Ident::of_element(shape, o));
    for p in patch {
        if p.get("$patch").is_some() {
            continue;
        }
        let want = Ident::of_element(shape, p);
        if !order_ids.by_ref().any(|o| o == want) {
            return Err(smp_error(
                path,
                "the order of the patch list does not match its $setElementOrder list",
            ));
        }
    }
    Ok(())
}

/// The position of the first element with each identity.
fn first_positions(shape: Shape, items: &[Value]) -> HashMap<Ident, usize> {
    let mut at = HashMap::with_capacity(items.len());
    for (i, v) in items.iter().enumerate() {
        at.entry(Ident::of_element(shape, v)).or_insert(i);
    }
    at
}

/// Order `merged` by `order` (a `$setElementOrder` list): kube's
/// normalizeElementOrder, with hash lookups instead of a linear search per
/// comparison.
fn order_by(
    shape: Shape,
    merged: Vec<Value>,
    order: &[Value],
    server_order: &HashMap<Ident, usize>,
) -> Vec<Value> {
    let wanted = first_positions(shape, order);
    let mut listed: Vec<(usize, Option<usize>, Value)> = Vec::new();
    let mut server_only: Vec<(Option<usize>, Value)> = Vec::new();
    for v in merged {
        let id = Ident::of_element(shape, &v);
        let in_server = server_order.get(&id).copied();
        match wanted.get(&id) {
            Some(&w) => listed.push((w, in_server, v)),
            None => server_only.push((in_server, v)),
        }
    }
    listed.sort_by_key(|(w, _, _)| *w);
    server_only.sort_by_key(|(s, _)| s.unwrap_or(usize::MAX));
    interleave(
        server_only,
        listed.into_iter().map(|(_, s, v)| (s, v)).collect(),
    )
}

/// kube's mergeSortedSlice: merge the server-only elements (`left`) into
/// the patch's (`right`), each list keeping its order. An element of the
/// left goes first only when both it and the next right one were on the
/// server and it came before it there; so elements the server did not
/// have go before the server's remaining ones.
fn interleave(left: Vec<(Option<usize>, Value)>, right: Vec<(Option<usize>, Value)>) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut l = left.into_iter().peekable();
    let mut r = right.into_iter().peekable();
    loop {
        let take_left = match (l.peek(), r.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((Some(a), _)), Some((Some(b), _))) => a < b,
            (Some(_), Some(_)) => false,
        };
        let next = if take_left { l.next() } else { r.next() };
        if let Some((_, v)) = next {
            out.push(v);
        }
    }
    out
}

/// Merge the patch's list `patch` for `field` into the stored `current`.
fn smp_list(
    field: &str,
    current: Vec<Value>,
    patch: &[Value],
    path: &Path<'_>,
) -> Result<Vec<Value>, ApiError> {
    check_list_len(path, "patch list", patch.len())?;
    let out = match shape_of(field, patch.iter()) {
        None => patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .cloned()
            .collect(),
        Some(Shape::Scalars) => merge_scalars(current, patch),
        Some(Shape::Keyed(key)) => merge_keyed(key, current, patch, path)?,
    };
    check_list_len(path, "merged list", out.len())?;
    Ok(out)
}

/// kube's merge of a list of scalars: the union without duplicates, the
/// patch's elements in the patch's order, each element only the server
/// had where it was relative to them (see [`interleave`]).
fn merge_scalars(current: Vec<Value>, patch: &[Value]) -> Vec<Value> {
    let ids: Vec<Ident> = current.iter().map(|v| Ident::of(Some(v))).collect();
    let mut server_at: HashMap<&Ident, usize> = HashMap::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        server_at.entry(id).or_insert(i);
    }
    let mut in_patch: HashSet<Ident> = HashSet::with_capacity(patch.len());
    let mut right = Vec::with_capacity(patch.len());
    for p in patch {
        let id = Ident::of(Some(p));
        let at = server_at.get(&id).copied();
        if in_patch.insert(id) {
            right.push((at, p.clone()));
        }
    }
    let mut left = Vec::new();
    for (i, v) in current.into_iter().enumerate() {
        let id = &ids[i];
        // Only the first of duplicates the server had stays.
        if !in_patch.contains(id) && server_at.get(id) == Some(&i) {
            left.push((Some(i), v));
        }
    }
    interleave(left, right)
}

/// kube's merge of a list of objects by `key`: `$patch: delete` elements
/// remove every element with their key, `$patch: replace` makes the list
/// the patch's other elements, any other element is merged into the first
/// one with its key or added; then the patch's elements come in the
/// patch's order with the server's others kept where they were relative
/// to them (see [`interleave`]).
fn merge_keyed(
    key: &'static str,
    current: Vec<Value>,
    patch: &[Value],
    path: &Path<'_>,
) -> Result<Vec<Value>, ApiError> {
    let mut deleted: HashSet<Ident> = HashSet::new();
    let mut replace = false;
    let mut plain: Vec<&Map<String, Value>> = Vec::with_capacity(patch.len());
    for p in patch {
        let Some(po) = p.as_object() else {
            return Err(smp_error(
                path,
                format_args!("the list needs objects with merge key {key:?}"),
            ));
        };
        let keyed = || {
            po.get(key)
                .ok_or_else(|| smp_error(path, format_args!("an element lacks merge key {key:?}")))
        };
        match po.get("$patch") {
            None => {
                keyed()?;
                plain.push(po);
            }
            Some(Value::String(d)) if d == "delete" => {
                deleted.insert(Ident::of(Some(keyed()?)));
            }
            // `{"$patch": "replace"}` needs no key (kubectl sends none).
            Some(Value::String(d)) if d == "replace" => replace = true,
            Some(Value::String(d)) if d == "merge" => {
                return Err(smp_error(
                    path,
                    "merging lists cannot yet be specified in the patch",
                ))
            }
            Some(other) => {
                return Err(smp_error(
                    path,
                    format_args!("unknown patch type {other} in a list element"),
                ))
            }
        }
    }
    if replace {
        return Ok(plain.into_iter().cloned().map(Value::Object).collect());
    }
    let mut out: Vec<Value> = Vec::with_capacity(current.len() + plain.len());
    let mut ids: Vec<Ident> = Vec::with_capacity(current.len() + plain.len());
    for v in current {
        let id = Ident::of(v.get(key));
        if !deleted.contains(&id) {
            out.push(v);
            ids.push(id);
        }
    }
    let on_server = out.len();
    let mut at: HashMap<Ident, usize> = HashMap::with_capacity(out.len() + plain.len());
    for (i, id) in ids.iter().enumerate() {
        at.entry(id.clone()).or_insert(i);
    }
    let mut patch_pos: HashMap<Ident, usize> = HashMap::with_capacity(plain.len());
    let element = path.child("[]");
    for (pi, po) in plain.into_iter().enumerate() {
        let id = Ident::of(po.get(key));
        patch_pos.entry(id.clone()).or_insert(pi);
        match at.get(&id) {
            Some(&i) => smp_map(&mut out[i], po, &element)?,
            None => {
                let mut fresh = Value::Object(Map::new());
                smp_map(&mut fresh, po, &element)?;
                at.insert(id.clone(), out.len());
                out.push(fresh);
                ids.push(id);
            }
        }
    }
    let server_at = |id: &Ident| at.get(id).copied().filter(|&i| i < on_server);
    let mut left: Vec<(usize, Value)> = Vec::new();
    let mut right: Vec<(usize, Option<usize>, Value)> = Vec::new();
    for (v, id) in out.into_iter().zip(&ids) {
        match patch_pos.get(id) {
            Some(&p) => right.push((p, server_at(id), v)),
            None => left.push((server_at(id).unwrap_or(usize::MAX), v)),
        }
    }
    // Stable: duplicates of one key stay in their order, after the first.
    left.sort_by_key(|(s, _)| *s);
    right.sort_by_key(|(p, _, _)| *p);
    Ok(interleave(
        left.into_iter().map(|(s, v)| (Some(s), v)).collect(),
        right.into_iter().map(|(_, s, v)| (s, v)).collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_removes_nulls() {
        let doc = json!({"a": 1, "b": {"c": 2, "d": 3}});
        let out = apply_merge_patch(&doc, &json!({"a": null, "b": {"c": 5}})).ok();
        assert_eq!(out, Some(json!({"b": {"c": 5, "d": 3}})));
        assert_eq!(
            apply_merge_patch(&doc, &json!([1])).err().map(|e| e.code),
            Some(400)
        );
    }

    #[test]
    fn json_patch_ops_and_failures() {
        let doc = json!({"spec": {"cidrs": ["10.0.0.0/8"]}});
        let out = apply_json_patch(
            &doc,
            &json!([{"op": "add", "path": "/spec/cidrs/-", "value": "fd00::/64"}]),
        )
        .ok();
        assert_eq!(
            out,
            Some(json!({"spec": {"cidrs": ["10.0.0.0/8", "fd00::/64"]}}))
        );
        let failed = apply_json_patch(
            &doc,
            &json!([{"op": "test", "path": "/spec/cidrs/0", "value": "x"}]),
        );
        assert_eq!(failed.err().map(|e| e.code), Some(422));
        assert_eq!(
            apply_json_patch(&doc, &json!({"op": "x"}))
                .err()
                .map(|e| e.code),
            Some(400)
        );
    }

    #[test]
    fn smp_merges_containers_by_name() {
        let doc = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "ports": [{"containerPort": 80, "name": "http"}]},
            {"name": "b", "image": "b:1"}
        ]}});
        let patch = json!({"spec": {
        "$setElementOrder/containers": [{"name": "a"}, {"name": "c"}],
        "containers": [
            {"name": "a", "image": "a:2", "ports": [{"containerPort": 443}]},
            {"name": "b", "$patch": "delete"},
            {"name": "c", "image": "c:1"}
        ]}});
        let out = apply_strategic_merge_patch(&doc, &patch).ok();
        // `ports` has no order directive: the patch's new port goes first,
        // as in kube.
        assert_eq!(
            out,
            Some(json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "ports": [{"containerPort": 443}, {"containerPort": 80, "name": "http"}]},
                {"name": "c", "image": "c:1"}
            ]}}))
        );
        // An order list that leaves out an element the patch sets is refused, as in kube.
        let mut bad = patch.clone();
        bad["spec"]["$setElementOrder/containers"] = json!([{"name": "a"}, {"name": "b"}]);
        let e = apply_strategic_merge_patch(&doc, &bad).err();
        assert_eq!(e.as_ref().map(|e| e.code), Some(400), "{e:?}");
        assert!(e.is_some_and(
            |e| e.message.contains("spec.containers") && e.message.contains("$setElementOrder")
        ),);
    }

    #[test]
    fn smp_directives() {
        let doc = json!({"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}}, "spec": {"tolerations": [{"key": "k"}]}});
        let patch = json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"x": null}},
                           "spec": {"tolerations": [{"key": "z"}]}});
        let out = apply_strategic_merge_patch(&doc, &patch).ok();
        // The patch's finalizer goes before the server's (kube's order).
        assert_eq!(
            out,
            Some(
                json!({"metadata": {"finalizers": ["c", "b"], "labels": {"y": "2"}}, "spec": {"tolerations": [{"key": "z"}]}})
            )
        );
        let retained = apply_strategic_merge_patch(
            &json!({"s": {"a": 1, "b": 2}}),
            &json!({"s": {"$retainKeys": ["a"], "a": 3}}),
        )
        .ok();
        assert_eq!(retained, Some(json!({"s": {"a": 3}})));
    }

    fn smp(doc: Value, patch: Value) -> Result<Value, ApiError> {
        apply_strategic_merge_patch(&doc, &patch)
    }

    fn fin(list: Value) -> Value {
        json!({"metadata": {"finalizers": list}})
    }

    fn names(v: &Value, list: &str) -> Vec<String> {
        v["spec"][list]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| c["name"].as_str().unwrap_or("?").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The order kube's merge produces: the patch's elements in its order,
    /// each server-only element before a patch element only when both were
    /// on the server and it came first there.
    #[test]
    fn smp_order_is_kubes() {
        let ok = |doc, patch| smp(doc, patch).map_err(|e| e.message);
        assert_eq!(
            ok(fin(json!(["a", "b"])), fin(json!(["c"]))),
            Ok(fin(json!(["c", "a", "b"])))
        );
        assert_eq!(
            ok(fin(json!(["a", "b", "c"])), fin(json!(["b", "d"]))),
            Ok(fin(json!(["a", "b", "d", "c"])))
        );
        // Already there: no change, no move.
        assert_eq!(
            ok(fin(json!(["a", "b"])), fin(json!(["b"]))),
            Ok(fin(json!(["a", "b"])))
        );
        // The patch's own order wins over the server's.
        assert_eq!(
            ok(fin(json!(["a", "b"])), fin(json!(["b", "a"]))),
            Ok(fin(json!(["b", "a"])))
        );
        // What kubectl sends for [a, b] -> [b, c].
        let kubectl = json!({"metadata": {"$setElementOrder/finalizers": ["b", "c"],
            "finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}});
        assert_eq!(
            ok(fin(json!(["a", "b"])), kubectl),
            Ok(fin(json!(["b", "c"])))
        );

        let pod = |names: &[&str]| json!({"spec": {"containers": names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>()}});
        // A changed element keeps its place; a new one goes first.
        let out = smp(
            pod(&["a", "b", "c"]),
            json!({"spec": {"containers": [{"name": "b", "image": "x"}, {"name": "n"}]}}),
        )
        .unwrap();
        assert_eq!(names(&out, "containers"), ["a", "b", "n", "c"]);
        assert_eq!(out["spec"]["containers"][1]["image"], "x");
    }

    #[test]
    fn smp_set_element_order() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        // Order only, no list: the stored elements are reordered.
        let out = smp(
            pod.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}]}}),
        )
        .unwrap();
        assert_eq!(names(&out, "containers"), ["c", "a", "b"]);
        // An element left out of the order list stays where it was relative
        // to the listed ones.
        let out = smp(
            pod.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "d"}],
                            "containers": [{"name": "d"}]}}),
        )
        .unwrap();
        assert_eq!(names(&out, "containers"), ["a", "b", "c", "d"]);
        // The patch list out of the order list's order: 400.
        let e = smp(
            pod,
            json!({"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                            "containers": [{"name": "b"}, {"name": "a"}]}}),
        )
        .err();
        assert_eq!(e.map(|e| e.code), Some(400));
        // A list that is replaced, not merged: the directive has no effect.
        let out = smp(
            json!({"spec": {"args": ["x"]}}),
            json!({"spec": {"$setElementOrder/args": ["z", "y"], "args": ["y", "z"]}}),
        )
        .unwrap();
        assert_eq!(out, json!({"spec": {"args": ["y", "z"]}}));
    }

    #[test]
    fn smp_duplicates() {
        // Scalars: the union has no duplicates; the first of the server's stays.
        assert_eq!(
            smp(fin(json!(["a", "b", "a"])), fin(json!(["c", "c"]))).ok(),
            Some(fin(json!(["c", "a", "b"])))
        );
        // Objects: the patch merges into the first with its key; the
        // server's duplicate follows it.
        let doc = json!({"spec": {"containers": [
            {"name": "x", "image": "1"}, {"name": "y"}, {"name": "x", "image": "2"}]}});
        let out = smp(
            doc.clone(),
            json!({"spec": {"containers": [{"name": "x", "image": "3"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "x", "image": "3"}, {"name": "x", "image": "2"}, {"name": "y"}])
        );
        // Two patch elements with one key make one element.
        let out = smp(
            json!({"spec": {}}),
            json!({"spec": {"containers": [{"name": "n", "image": "i"}, {"name": "n", "args": ["a"]}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "n", "image": "i", "args": ["a"]}])
        );
        // `$patch: delete` removes every element with the key.
        let out = smp(
            doc,
            json!({"spec": {"containers": [{"name": "x", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "y"}]));
        // `$deleteFromPrimitiveList` removes every copy.
        assert_eq!(
            smp(
                fin(json!(["a", "b", "a", "c"])),
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a", "z"]}})
            )
            .ok(),
            Some(fin(json!(["b", "c"])))
        );
    }

    #[test]
    fn smp_patch_directives() {
        let doc = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}],
                                  "securityContext": {"runAsUser": 1, "fsGroup": 2}}});
        // replace, on a list (kubectl sends the marker without a key) and on a map.
        let out = smp(
            doc.clone(),
            json!({"spec": {"containers": [{"name": "c"}, {"$patch": "replace"}],
                            "securityContext": {"$patch": "replace", "runAsUser": 5}}}),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"spec": {"containers": [{"name": "c"}], "securityContext": {"runAsUser": 5}}})
        );
        // delete, of a map field and of a list element.
        let out = smp(
            doc.clone(),
            json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}],
                            "securityContext": {"$patch": "delete"}}}),
        )
        .unwrap();
        assert_eq!(out, json!({"spec": {"containers": [{"name": "b"}]}}));
        // merge is not a list directive in kube, and no map directive.
        for bad in [
            json!({"spec": {"containers": [{"name": "a", "$patch": "merge"}]}}),
            json!({"spec": {"securityContext": {"$patch": "merge"}}}),
            json!({"spec": {"containers": [{"name": "a", "$patch": "bogus"}]}}),
            json!({"spec": {"containers": [{"image": "no-name"}]}}),
            json!({"spec": {"containers": ["not-an-object"]}}),
        ] {
            let e = smp(doc.clone(), bad.clone()).err();
            assert_eq!(e.map(|e| e.code), Some(400), "{bad}");
        }
    }

    #[test]
    fn smp_retain_keys() {
        let doc = json!({"s": {"a": 1, "b": 2, "c": {"d": 1}}});
        assert_eq!(
            smp(
                doc.clone(),
                json!({"s": {"$retainKeys": ["a", "e"], "e": 3}})
            )
            .ok(),
            Some(json!({"s": {"a": 1, "e": 3}}))
        );
        // Nulls need not be listed; a field the patch sets must be.
        assert_eq!(
            smp(doc.clone(), json!({"s": {"$retainKeys": ["c"], "a": null}})).ok(),
            Some(json!({"s": {"c": {"d": 1}}}))
        );
        let e = smp(doc.clone(), json!({"s": {"$retainKeys": ["a"], "b": 5}})).err();
        assert_eq!(e.map(|e| e.code), Some(400));
        let e = smp(doc, json!({"s": {"$retainKeys": "a"}})).err();
        assert_eq!(e.map(|e| e.code), Some(400));
    }

    /// The case: 300 000 finalizers added to an object with
    /// 300 000 (the speed is measured by `benches/smp.rs`, not here).
    #[test]
    fn smp_300k_finalizers() {
        const N: usize = 300_000;
        let list = |from: usize| -> Value {
            Value::Array(
                (from..from + N)
                    .map(|i| Value::String(format!("example.com/f-{i}")))
                    .collect(),
            )
        };
        let out = smp(fin(list(0)), fin(list(N))).unwrap();
        let got = out["metadata"]["finalizers"].as_array().unwrap();
        assert_eq!(got.len(), 2 * N);
        // New ones first (in the patch's order), then the server's.
        assert_eq!(Value::Array(got[..N].to_vec()), list(N));
        assert_eq!(Value::Array(got[N..].to_vec()), list(0));
        // Half of the patch already there: the union, no duplicates.
        let out = smp(fin(list(0)), fin(list(N / 2))).unwrap();
        let got = out["metadata"]["finalizers"].as_array().unwrap();
        assert_eq!(got.len(), N + N / 2);
        let unique: HashSet<&str> = got.iter().filter_map(Value::as_str).collect();
        assert_eq!(unique.len(), got.len());
        // And removing them all again.
        let out = smp(
            fin(list(0)),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": list(0)}}),
        )
        .unwrap();
        assert_eq!(out, fin(json!([])));
    }

    #[test]
    fn smp_list_caps() {
        let n = |len: usize, from: usize| -> Value {
            Value::Array((from..from + len).map(|i| json!(i)).collect())
        };
        // The patch list over the limit.
        let e = smp(fin(json!([])), fin(n(MAX_SMP_LIST_ITEMS + 1, 0))).err();
        assert_eq!(e.as_ref().map(|e| e.code), Some(413), "{e:?}");
        let msg = e.map(|e| e.message).unwrap_or_default();
        assert!(
            msg.contains("metadata.finalizers")
                && msg.contains(&format!("{} items", MAX_SMP_LIST_ITEMS + 1))
                && msg.contains(&format!("limit of {MAX_SMP_LIST_ITEMS}")),
            "{msg}"
        );
        // At the limit: fine. One more than the limit in the result: 413.
        assert!(smp(fin(json!([])), fin(n(MAX_SMP_LIST_ITEMS, 0))).is_ok());
        let e = smp(fin(n(MAX_SMP_LIST_ITEMS, 0)), fin(n(1, MAX_SMP_LIST_ITEMS))).err();
        assert_eq!(e.as_ref().map(|e| e.code), Some(413), "{e:?}");
        assert!(e.is_some_and(|e| e.message.contains("merged list")));
        for directive in [
            "$deleteFromPrimitiveList/finalizers",
            "$setElementOrder/finalizers",
        ] {
            let mut p = json!({"metadata": {}});
            p["metadata"][directive] = n(MAX_SMP_LIST_ITEMS + 1, 0);
            let e = smp(fin(json!([])), p).err();
            assert_eq!(e.map(|e| e.code), Some(413), "{directive}");
        }
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
    }
}
