//! `meta.k8s.io/v1` Table output (`Accept: application/json;as=Table;...`),
//! what `kubectl get` asks for: NAME, the kind's printer columns and AGE.
//! Like kube-apiserver, every column is sent; kubectl hides those with
//! priority > 0 unless `-o wide`.

use cozyplane_api::kinds::PrinterColumn;
use serde_json::{json, Value};

use crate::registry::KindEntry;

/// `includeObject` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: Option<&str>) -> Result<Self, crate::status::ApiError> {
        match s {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(o) => Err(crate::status::ApiError::bad_request(format!(
                "includeObject: Unsupported value: {o:?}"
            ))),
        }
    }
}

/// Evaluate a simple JSONPath (`.spec.cidrs`, `.a[0].b`, `.ports[*].port`).
/// Returns every value reached.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut cur: Vec<&Value> = vec![obj];
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        let (field, index) = match seg.split_once('[') {
            Some((f, rest)) => (f, Some(rest.trim_end_matches(']'))),
            None => (seg, None),
        };
        let mut next = Vec::new();
        for v in cur {
            let v = if field.is_empty() {
                Some(v)
            } else {
                v.get(field)
            };
            let Some(v) = v else { continue };
            match index {
                None => next.push(v),
                Some("*") => next.extend(v.as_array().into_iter().flatten()),
                Some(i) => {
                    if let Some(x) = i.parse::<usize>().ok().and_then(|i| v.get(i)) {
                        next.push(x);
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

/// kube's `duration.HumanDuration`, as shown in AGE columns.
pub fn human_duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60).replace("m0s", "m"),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => {
            let (h, m) = (s / 3600, (s % 3600) / 60);
            if m == 0 {
                format!("{h}h")
            } else {
                format!("{h}h{m}m")
            }
        }
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s if s < 8 * 86400 => {
            let (d, h) = (s / 86400, (s % 86400) / 3600);
            if h == 0 {
                format!("{d}d")
            } else {
                format!("{d}d{h}h")
            }
        }
        s if s < 2 * 365 * 86400 => format!("{}d", s / 86400),
        s => format!("{}y", s / (365 * 86400)),
    }
}

fn age(ts: Option<&str>) -> Value {
    let Some(t) = ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return json!("<unknown>");
    };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds();
    json!(human_duration(secs))
}

fn cell(obj: &Value, col: &PrinterColumn) -> Value {
    let vals = json_path(obj, col.json_path);
    if col.type_ == "date" {
        return age(vals.first().and_then(|v| v.as_str()));
    }
    match vals.as_slice() {
        [] => Value::Null,
        [Value::String(s)] => json!(s),
        [v @ (Value::Number(_) | Value::Bool(_))] if col.type_ != "string" => (*v).clone(),
        [v] => json!(match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }),
        many => json!(many
            .iter()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(",")),
    }
}

fn has_age_column(kind: &KindEntry) -> bool {
    kind.info
        .printer_columns
        .iter()
        .any(|c| c.json_path == ".metadata.creationTimestamp")
}

/// The column definitions of a kind's table.
pub fn columns(kind: &KindEntry) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for c in kind.info.printer_columns {
        cols.push(json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}));
    }
    if !has_age_column(kind) {
        cols.push(json!({"name": "Age", "type": "date", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    }
    cols
}

fn row(kind: &KindEntry, obj: &Value, include: IncludeObject) -> Value {
    let mut cells = vec![json!(crate::meta::meta_str(obj, "name").unwrap_or(""))];
    cells.extend(kind.info.printer_columns.iter().map(|c| cell(obj, c)));
    if !has_age_column(kind) {
        cells.push(age(crate::meta::meta_str(obj, "creationTimestamp")));
    }
    let mut r = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Object => r["object"] = obj.clone(),
        IncludeObject::Metadata => {
            r["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            })
        }
    }
    r
}

/// A Table for one object or a list (`items`).
pub fn to_table(kind: &KindEntry, obj_or_list: &Value, include: IncludeObject) -> Value {
    let (rows, metadata) = match obj_or_list.get("items").and_then(Value::as_array) {
        Some(items) => (
            items
                .iter()
                .map(|o| row(kind, o, include))
                .collect::<Vec<_>>(),
            obj_or_list.get("metadata").cloned().unwrap_or(json!({})),
        ),
        None => (
            vec![row(kind, obj_or_list, include)],
            json!({"resourceVersion": crate::meta::meta_str(obj_or_list, "resourceVersion").unwrap_or("")}),
        ),
    };
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns(kind), "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths() {
        let o = json!({"spec": {"cidrs": ["10.0.0.0/8", "fd00::/64"], "ports": [{"port": 80}, {"port": 443}]}});
        assert_eq!(json_path(&o, ".spec.cidrs[1]"), vec![&json!("fd00::/64")]);
        assert_eq!(json_path(&o, ".spec.ports[*].port").len(), 2);
        assert!(json_path(&o, ".spec.missing").is_empty());
        let c = PrinterColumn {
            name: "CIDRs",
            type_: "string",
            format: "",
            json_path: ".spec.cidrs",
            description: "",
            priority: 0,
        };
        assert_eq!(cell(&o, &c), json!(r#"["10.0.0.0/8","fd00::/64"]"#));
        let p = PrinterColumn {
            json_path: ".spec.ports[*].port",
            ..c
        };
        assert_eq!(cell(&o, &p), json!("80,443"));
    }

    #[test]
    fn human_durations_match_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(1800), "30m");
        assert_eq!(human_duration(3 * 3600 + 600), "3h10m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400), "3d");
        assert_eq!(human_duration(400 * 86400), "400d");
    }
}
