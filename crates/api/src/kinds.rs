//! What the API server needs to know about each kind, as data: the seam
//! between the types here and the generic registry in `cozyplane-apiserver`.
//! Everything is pure (no I/O), so every rule is unit-testable here.

use serde_json::Value;

/// The kind of a field error; each maps onto a Kubernetes `StatusCause.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorType {
    Required,
    Invalid,
    Forbidden,
    Duplicate,
    NotSupported,
    TooLong,
    TooMany,
}

impl FieldErrorType {
    /// The `StatusCause.reason` string kube-apiserver uses.
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorType::Required => "FieldValueRequired",
            FieldErrorType::Invalid => "FieldValueInvalid",
            FieldErrorType::Forbidden => "FieldValueForbidden",
            FieldErrorType::Duplicate => "FieldValueDuplicate",
            FieldErrorType::NotSupported => "FieldValueNotSupported",
            FieldErrorType::TooLong => "FieldValueTooLong",
            FieldErrorType::TooMany => "FieldValueTooMany",
        }
    }
}

/// One validation failure at a field path such as `spec.cidrs[1]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub kind: FieldErrorType,
    /// The field path, kube style: `metadata.name`, `spec.cidrs[0]`.
    pub field: String,
    /// Human-readable detail, e.g. `"10.0.0.1/8": not a canonical CIDR (use 10.0.0.0/8)`.
    pub message: String,
}

impl FieldError {
    pub fn new(kind: FieldErrorType, field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            kind,
            field: field.into(),
            message: message.into(),
        }
    }
}

/// An additional printer column, exactly as a CRD declares one
/// (`additionalPrinterColumns`): the server evaluates `json_path` on the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterColumn {
    pub name: &'static str,
    /// OpenAPI type: string, integer, number, boolean, date.
    pub type_: &'static str,
    /// Optional OpenAPI format, e.g. `date-time` (empty for none).
    pub format: &'static str,
    pub json_path: &'static str,
    pub description: &'static str,
    /// 0 = shown by default, >0 = only with `-o wide`.
    pub priority: i32,
}

/// Everything the registry needs about one kind.
#[derive(Clone)]
pub struct KindInfo {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Lower-case plural resource name (`vpcs`).
    pub plural: &'static str,
    /// Lower-case singular (`vpc`).
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub namespaced: bool,
    /// Serves the `/status` subresource (spec and status written separately).
    pub status_subresource: bool,
    /// The OpenAPI v3 schema of the whole object (apiVersion, kind, metadata, spec, status).
    pub schema: fn() -> Value,
    pub printer_columns: &'static [PrinterColumn],
    /// Extra field-selector paths beyond metadata.name / metadata.namespace.
    pub field_selectors: &'static [&'static str],
    /// Validate a new object (after defaulting). Empty means valid.
    pub validate_create: fn(&Value) -> Vec<FieldError>,
    /// Validate an update of `old` into `new` (immutability rules etc.). It
    /// includes every create rule applied to `new`, so the registry calls only
    /// this one on update (calling both would report errors twice).
    pub validate_update: fn(new: &Value, old: &Value) -> Vec<FieldError>,
}

impl std::fmt::Debug for KindInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindInfo")
            .field("group", &self.group)
            .field("version", &self.version)
            .field("kind", &self.kind)
            .field("plural", &self.plural)
            .finish_non_exhaustive()
    }
}
