//! Validation rules run by the API server's strategies (see [`crate::kinds::KindInfo`]).
//!
//! Every kind first has to *decode* into its Rust type: a body that does not (a
//! wrong type, a missing required field) is reported as a single [`FieldError`]
//! at the deepest path serde can name, so a client learns which field is wrong
//! instead of getting an opaque 400. The kind-specific rules then run on the
//! typed object. Rules never stop at the first problem: they report every field
//! error they find, the way kube-apiserver does.

pub mod claims;
pub mod hostfw;
pub mod net;
pub mod vpc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::kinds::{FieldError, FieldErrorType};

/// Decode `obj` into `T`, turning a serde failure into a field error at its path.
///
/// serde's derived `Deserialize` also accepts a JSON *array* where a struct is
/// expected (fields by position); kube would never accept that, so after decoding
/// the typed value is re-serialized and every place where it has an object but
/// the input had an array is refused.
pub fn decode<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<T, FieldError> {
    if !obj.is_object() {
        return Err(FieldError::new(
            FieldErrorType::Invalid,
            "<root>",
            "an object must be a JSON object",
        ));
    }
    let typed = serde_path_to_error::deserialize::<_, T>(obj).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let msg = e.inner().to_string();
        // serde says "missing field `x`" at the parent: report Required at the field.
        if let Some(field) = msg
            .strip_prefix("missing field `")
            .and_then(|r| r.strip_suffix('`'))
        {
            let full = if path.is_empty() {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
            return FieldError::new(FieldErrorType::Required, full, "Required value");
        }
        let field = if path.is_empty() {
            "<root>".to_string()
        } else {
            path
        };
        FieldError::new(FieldErrorType::Invalid, field, msg)
    })?;
    let shape = serde_json::to_value(&typed).map_err(|e| {
        FieldError::new(
            FieldErrorType::Invalid,
            "<root>",
            format!("cannot re-encode: {e}"),
        )
    })?;
    check_shape(&shape, obj, "")?;
    Ok(typed)
}

/// Refuse an input array where the typed re-encoding has an object.
fn check_shape(typed: &Value, input: &Value, path: &str) -> Result<(), FieldError> {
    let shown = |p: &str| {
        if p.is_empty() {
            "<root>".to_string()
        } else {
            p.to_string()
        }
    };
    match (typed, input) {
        (Value::Object(_), Value::Array(_)) => Err(FieldError::new(
            FieldErrorType::Invalid,
            shown(path),
            "invalid type: sequence, expected an object",
        )),
        (Value::Object(t), Value::Object(i)) => {
            for (k, tv) in t {
                if let Some(iv) = i.get(k) {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    check_shape(tv, iv, &p)?;
                }
            }
            Ok(())
        }
        (Value::Array(t), Value::Array(i)) => {
            for (n, (tv, iv)) in t.iter().zip(i).enumerate() {
                check_shape(tv, iv, &format!("{path}[{n}]"))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Decode only (for kinds whose rules come later): a well-formed object is valid.
pub fn decode_only<T: DeserializeOwned + Serialize>(obj: &Value) -> Vec<FieldError> {
    match decode::<T>(obj) {
        Ok(_) => Vec::new(),
        Err(e) => vec![e],
    }
}

/// `"value": detail`, the message shape kube uses for FieldValueInvalid.
pub(crate) fn invalid(
    field: impl Into<String>,
    value: &str,
    detail: impl std::fmt::Display,
) -> FieldError {
    FieldError::new(
        FieldErrorType::Invalid,
        field,
        format!("{value:?}: {detail}"),
    )
}

/// kube's immutability error.
pub(crate) fn immutable(field: impl Into<String>, value: &str) -> FieldError {
    invalid(field, value, "field is immutable")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdn::VPC;
    use serde_json::json;

    #[test]
    fn decode_reports_the_path_of_a_type_error() {
        let obj = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC", "metadata": {"name": "a"},
                         "spec": {"cidrs": ["10.0.0.0/24", 5]}});
        let e = decode::<VPC>(&obj).unwrap_err();
        assert_eq!(e.kind, FieldErrorType::Invalid);
        assert_eq!(e.field, "spec.cidrs[1]");
        assert!(e.message.contains("expected a string"), "{}", e.message);
    }

    #[test]
    fn decode_reports_missing_fields_as_required() {
        let obj = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC", "metadata": {"name": "a"}, "spec": {}});
        let e = decode::<VPC>(&obj).unwrap_err();
        assert_eq!(
            (e.kind, e.field.as_str()),
            (FieldErrorType::Required, "spec.cidrs")
        );
        let obj = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC", "metadata": {"name": "a"}});
        let e = decode::<VPC>(&obj).unwrap_err();
        assert_eq!(
            (e.kind, e.field.as_str()),
            (FieldErrorType::Required, "spec")
        );
        let e = decode::<VPC>(&json!("vpc")).unwrap_err();
        assert_eq!(
            (e.kind, e.field.as_str()),
            (FieldErrorType::Invalid, "<root>")
        );
    }

    #[test]
    fn decode_refuses_arrays_in_place_of_objects() {
        let e = decode::<VPC>(
            &json!(["sdn.cozystack.io/v1alpha1", "VPC", {}, {"cidrs": ["10.0.0.0/24"]}]),
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.field.as_str()),
            (FieldErrorType::Invalid, "<root>")
        );
        let obj = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC", "metadata": {"name": "a"},
                         "spec": [["10.0.0.0/24"], 1500]});
        let e = decode::<VPC>(&obj).unwrap_err();
        assert_eq!(
            (e.kind, e.field.as_str()),
            (FieldErrorType::Invalid, "spec")
        );
        assert!(e.message.contains("expected an object"), "{}", e.message);
    }
}
