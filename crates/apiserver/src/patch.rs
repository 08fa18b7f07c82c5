//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), an
//! approximation of strategic merge patch, and server-side apply.
//!
//! Strategic merge patch (SMP) in kube is driven by per-field Go struct tags
//! (`patchStrategy`, `patchMergeKey`). We approximate it: it is a JSON merge
//! patch, except that lists of objects under well-known field names are
//! merged element-wise by their merge key (`containers` by `name`,
//! `volumeMounts` by `mountPath`, `conditions` by `type`, `ports` by
//! `containerPort` or `port`, ...), and the directives kubectl emits are
//! honoured: `$patch: delete|replace` (maps and list elements),
//! `$retainKeys`, `$deleteFromPrimitiveList/<f>` and `$setElementOrder/<f>`
//! (order hints, ignored). Lists of scalars with merge semantics in kube
//! (`finalizers`) are unioned. Anything else is replaced, as merge patch does.

use cozyplane_errors::Chain;
use serde_json::{Map, Value};

use crate::limits::{
    deeper_than, MAX_JSON_PATCH_COPY_BYTES, MAX_JSON_PATCH_OPERATIONS, MAX_OBJECT_DEPTH,
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
fn merge_key(field: &str, patch_items: &[Value]) -> Option<&'static str> {
    let has = |k: &str| {
        patch_items
            .iter()
            .filter_map(Value::as_object)
            .any(|o| o.contains_key(k))
    };
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "readinessGates" => Some(if field == "readinessGates" {
            "conditionType"
        } else {
            "name"
        }),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" | "addresses" => Some("type"),
        "taints" => Some("key"),
        "hostAliases" => Some("ip"),
        "ports" if has("containerPort") => Some("containerPort"),
        "ports" if has("port") => Some("port"),
        _ => None,
    }
}

/// Scalar lists kube merges (union) instead of replacing.
fn is_merged_scalar_list(field: &str) -> bool {
    matches!(field, "finalizers")
}

/// Apply the SMP approximation described in the module docs.
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
    smp_map(&mut out, p)?;
    Ok(out)
}

fn smp_map(target: &mut Value, patch: &Map<String, Value>) -> Result<(), ApiError> {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch.clone();
        replaced.remove("$patch");
        *target = Value::Object(replaced);
        return Ok(());
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(t) = target.as_object_mut() else {
        return Err(ApiError::internal("smp target is not an object"));
    };
    for (k, v) in patch {
        if k == "$patch" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if k == "$retainKeys" {
            let keep: Vec<&str> = v
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            t.retain(|key, _| keep.contains(&key.as_str()) || patch.contains_key(key));
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let drop: Vec<&Value> = v.as_array().map(|a| a.iter().collect()).unwrap_or_default();
            if let Some(Value::Array(items)) = t.get_mut(field) {
                items.retain(|i| !drop.contains(&i));
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
                smp_map(entry, po)?;
            }
            Value::Array(items) => {
                let merged = smp_list(k, t.get(k), items)?;
                t.insert(k.clone(), merged);
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    Ok(())
}

fn smp_list(field: &str, current: Option<&Value>, patch: &[Value]) -> Result<Value, ApiError> {
    let current: Vec<Value> = current
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if is_merged_scalar_list(field) {
        let mut out = current;
        for p in patch {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        return Ok(Value::Array(out));
    }
    let Some(key) = merge_key(field, patch) else {
        let cleaned: Vec<Value> = patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(Value::Array(cleaned));
    };
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        let cleaned: Vec<Value> = patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(Value::Array(cleaned));
    }
    let mut out = current;
    for p in patch {
        let Some(po) = p.as_object() else {
            return Err(ApiError::bad_request(format!(
                "strategic merge patch: list {field:?} needs objects with key {key:?}"
            )));
        };
        let Some(kv) = po.get(key) else {
            return Err(ApiError::bad_request(format!(
                "strategic merge patch: element of {field:?} lacks merge key {key:?}"
            )));
        };
        let pos = out.iter().position(|e| e.get(key) == Some(kv));
        let delete = po.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => smp_map(&mut out[i], po)?,
            (None, false) => {
                let mut fresh = Value::Object(Map::new());
                smp_map(&mut fresh, po)?;
                out.push(fresh);
            }
        }
    }
    Ok(Value::Array(out))
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
        "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
        "containers": [
            {"name": "a", "image": "a:2", "ports": [{"containerPort": 443}]},
            {"name": "b", "$patch": "delete"},
            {"name": "c", "image": "c:1"}
        ]}});
        let out = apply_strategic_merge_patch(&doc, &patch).ok();
        assert_eq!(
            out,
            Some(json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}]},
                {"name": "c", "image": "c:1"}
            ]}}))
        );
    }

    #[test]
    fn smp_directives() {
        let doc = json!({"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}}, "spec": {"tolerations": [{"key": "k"}]}});
        let patch = json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"x": null}},
                           "spec": {"tolerations": [{"key": "z"}]}});
        let out = apply_strategic_merge_patch(&doc, &patch).ok();
        assert_eq!(
            out,
            Some(
                json!({"metadata": {"finalizers": ["b", "c"], "labels": {"y": "2"}}, "spec": {"tolerations": [{"key": "z"}]}})
            )
        );
        let retained = apply_strategic_merge_patch(
            &json!({"s": {"a": 1, "b": 2}}),
            &json!({"s": {"$retainKeys": ["a"], "a": 3}}),
        )
        .ok();
        assert_eq!(retained, Some(json!({"s": {"a": 3}})));
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
