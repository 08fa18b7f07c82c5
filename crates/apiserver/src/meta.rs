//! Object metadata rules shared by every kind: names, labels, annotations,
//! and the small JSON accessors the registry needs.

use cozyplane_api::kinds::{FieldError, FieldErrorType};
use serde_json::{Map, Value};

/// DNS-1123 subdomain: at most 253 characters of `[a-z0-9.-]`, starting and
/// ending with an alphanumeric (kube's rule for most object names).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// DNS-1123 label: at most 63 characters of `[a-z0-9-]`, alphanumeric ends.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns1123_subdomain(s)
}

/// A label value or the name part of a qualified key: at most 63 characters
/// of `[A-Za-z0-9_.-]`, alphanumeric at both ends (empty allowed for values).
fn is_label_value(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let b = s.as_bytes();
    s.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// A qualified name (label and annotation keys): `[prefix/]name`.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if !is_dns1123_subdomain(p) {
            return false;
        }
    }
    !name.is_empty() && is_label_value(name)
}

/// Validate `metadata` generically (names, labels, annotations, namespace).
/// Which names a kind accepts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NameRule {
    /// A DNS-1123 subdomain (most kinds).
    #[default]
    Dns1123Subdomain,
    /// Any path segment: not `.` or `..`, no `/` or `%` (RBAC kinds, whose
    /// names such as `system:discovery` carry colons).
    PathSegment,
}

impl NameRule {
    /// Why `name` is not acceptable, if it is not.
    pub fn check(self, name: &str) -> Option<String> {
        match self {
            NameRule::Dns1123Subdomain if !is_dns1123_subdomain(name) => Some(format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")),
            NameRule::PathSegment if name == "." || name == ".." => {
                Some(format!("Invalid value: {name:?}: may not be '.' or '..'"))
            }
            NameRule::PathSegment if name.contains('/') || name.contains('%') => {
                Some(format!("Invalid value: {name:?}: may not contain '/' or '%'"))
            }
            NameRule::PathSegment if name.len() > 253 => {
                Some(format!("Invalid value: {name:?}: must be no more than 253 characters"))
            }
            _ => None,
        }
    }
}

pub fn validate_metadata(obj: &Value, namespaced: bool) -> Vec<FieldError> {
    validate_metadata_with(obj, namespaced, NameRule::default())
}

/// [`validate_metadata`] with the kind's name rule.
pub fn validate_metadata_with(obj: &Value, namespaced: bool, names: NameRule) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = obj.get("metadata").and_then(Value::as_object);
    let Some(meta) = meta else {
        errs.push(FieldError::new(
            FieldErrorType::Required,
            "metadata",
            "metadata is required",
        ));
        return errs;
    };
    match meta.get("name").and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::new(
            FieldErrorType::Required,
            "metadata.name",
            "name or generateName is required",
        )),
        Some(n) => {
            if let Some(why) = names.check(n) {
                errs.push(FieldError::new(
                    FieldErrorType::Invalid,
                    "metadata.name",
                    why,
                ));
            }
        }
    }
    let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::new(
                FieldErrorType::Required,
                "metadata.namespace",
                "namespace is required",
            ));
        } else if !is_dns1123_label(ns) {
            errs.push(FieldError::new(
                FieldErrorType::Invalid,
                "metadata.namespace",
                format!("Invalid value: {ns:?}: not a DNS-1123 label"),
            ));
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::new(
            FieldErrorType::Forbidden,
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    validate_string_map(meta, "labels", true, &mut errs);
    validate_string_map(meta, "annotations", false, &mut errs);
    if let Some(f) = meta.get("finalizers") {
        match f.as_array() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    if !item.as_str().is_some_and(is_qualified_name) {
                        errs.push(FieldError::new(
                            FieldErrorType::Invalid,
                            format!("metadata.finalizers[{i}]"),
                            format!("Invalid value: {item}: a finalizer must be a qualified name"),
                        ));
                    }
                }
            }
            None => errs.push(FieldError::new(
                FieldErrorType::Invalid,
                "metadata.finalizers",
                "must be a list of strings",
            )),
        }
    }
    errs
}

const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

fn validate_string_map(
    meta: &Map<String, Value>,
    field: &str,
    values_are_labels: bool,
    errs: &mut Vec<FieldError>,
) {
    let Some(v) = meta.get(field) else { return };
    if v.is_null() {
        return;
    }
    let Some(map) = v.as_object() else {
        errs.push(FieldError::new(
            FieldErrorType::Invalid,
            format!("metadata.{field}"),
            "must be a map of strings",
        ));
        return;
    };
    let mut total = 0usize;
    for (k, v) in map {
        let path = format!("metadata.{field}");
        if !is_qualified_name(k) {
            errs.push(FieldError::new(
                FieldErrorType::Invalid,
                path.clone(),
                format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, with an optional DNS subdomain prefix and '/'"),
            ));
        }
        let Some(s) = v.as_str() else {
            errs.push(FieldError::new(
                FieldErrorType::Invalid,
                format!("{path}[{k}]"),
                "value must be a string",
            ));
            continue;
        };
        total += k.len() + s.len();
        if values_are_labels && !is_label_value(s) {
            errs.push(FieldError::new(
                FieldErrorType::Invalid,
                format!("{path}[{k}]"),
                format!("Invalid value: {s:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)"),
            ));
        }
    }
    if !values_are_labels && total > MAX_ANNOTATIONS_BYTES {
        errs.push(FieldError::new(
            FieldErrorType::TooLong,
            "metadata.annotations",
            "may not be more than 262144 bytes",
        ));
    }
}

/// `metadata` as a mutable map, created when missing.
pub fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let o = obj.as_object_mut()?;
    let m = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut()
}

/// `metadata.<field>` as a string.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// The object's labels (empty when absent).
pub fn labels(obj: &Value) -> Map<String, Value> {
    obj.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The object's finalizers.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Look up a dotted field path (`spec.nodeName`) in an object.
pub fn field_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(obj, |v, seg| v.get(seg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("a.b-c.d1"));
        assert!(!is_dns1123_subdomain("A"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(is_dns1123_label("kube-system"));
        assert!(!is_dns1123_label("a.b"));
    }

    #[test]
    fn qualified_names() {
        assert!(is_qualified_name("app"));
        assert!(is_qualified_name("sdn.cozystack.io/vpc"));
        assert!(!is_qualified_name("a/b/c"));
        assert!(!is_qualified_name("-x"));
        assert!(!is_qualified_name("UPPER.example/ok"));
    }

    #[test]
    fn metadata_errors_name_the_field() {
        let obj =
            json!({"metadata": {"name": "Bad_Name", "labels": {"ok": "v", "k": "bad value"}}});
        let errs = validate_metadata(&obj, true);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"metadata.name"), "{fields:?}");
        assert!(fields.contains(&"metadata.namespace"), "{fields:?}");
        assert!(fields.contains(&"metadata.labels[k]"), "{fields:?}");
        assert!(!fields.contains(&"metadata.labels[ok]"));
    }

    #[test]
    fn cluster_scoped_rejects_namespace() {
        let obj = json!({"metadata": {"name": "n", "namespace": "x"}});
        let errs = validate_metadata(&obj, false);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.namespace");
    }

    #[test]
    fn field_paths() {
        let obj = json!({"spec": {"nodeName": "n1"}});
        assert_eq!(field_path(&obj, "spec.nodeName"), Some(&json!("n1")));
        assert_eq!(field_path(&obj, "status.phase"), None);
    }
}
