//! Structural schemas: turning generated JSON Schemas into self-contained
//! OpenAPI schemas, and finding unknown fields for `fieldValidation`.

use serde_json::{Map, Value};

/// References nested deeper than this are cut off as "any object": it keeps
/// recursive types (none of ours today) finite.
const MAX_DEPTH: usize = 32;

/// Inline every `$ref` into `#/$defs/...` (schemars output) so the schema
/// is self-contained, the form the OpenAPI documents and field validation use.
/// Keys next to a `$ref` (such as `description`) win over the referenced ones.
pub fn inline_refs(root: &Value) -> Value {
    let defs = root
        .get("$defs")
        .or_else(|| root.get("definitions"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = inline(root, &defs, 0);
    if let Some(o) = out.as_object_mut() {
        o.remove("$defs");
        o.remove("definitions");
        o.remove("$schema");
        o.remove("title");
    }
    out
}

fn inline(v: &Value, defs: &Map<String, Value>, depth: usize) -> Value {
    match v {
        Value::Object(o) => {
            if let Some(r) = o.get("$ref").and_then(Value::as_str) {
                let name = r.rsplit('/').next().unwrap_or("");
                let mut base = match defs.get(name) {
                    Some(def) if depth < MAX_DEPTH => inline(def, defs, depth + 1),
                    _ => {
                        serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
                    }
                };
                if let Some(b) = base.as_object_mut() {
                    for (k, val) in o {
                        if k != "$ref" {
                            b.insert(k.clone(), inline(val, defs, depth));
                        }
                    }
                }
                return base;
            }
            let mut m = Map::new();
            for (k, val) in o {
                if k == "$defs" || k == "definitions" {
                    continue;
                }
                m.insert(k.clone(), inline(val, defs, depth));
            }
            Value::Object(m)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| inline(x, defs, depth)).collect()),
        other => other.clone(),
    }
}

/// Whether a schema node accepts arbitrary keys.
fn is_open(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
        || schema
            .get("additionalProperties")
            .is_some_and(|a| a != &Value::Bool(false))
        || schema.get("properties").is_none()
}

/// Paths of fields in `obj` that `schema` does not declare, kube style
/// (`spec.foo`, `spec.items[0].bar`).
pub fn unknown_fields(obj: &Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(obj, schema, "", &mut out);
    out
}

fn walk(obj: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    match obj {
        Value::Object(o) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in o {
                    let child = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    match props.get(k) {
                        Some(s) => walk(v, s, &child, out),
                        None if !is_open(schema) => out.push(child),
                        None => {}
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for (k, v) in o {
                    walk(v, ap, &format!("{path}.{k}"), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    walk(v, is, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// Convert an OpenAPI v3 schema to Swagger 2.0 form: v2 has no `nullable`,
/// `oneOf`/`anyOf`/`not`, and `type` must be a single string.
pub fn to_v2(schema: &Value) -> Value {
    match schema {
        Value::Object(o) => {
            let mut m = Map::new();
            for (k, v) in o {
                match k.as_str() {
                    "nullable" | "oneOf" | "anyOf" | "not" | "$schema" => {}
                    "type" => {
                        if let Some(arr) = v.as_array() {
                            if let Some(t) = arr.iter().find(|t| t.as_str() != Some("null")) {
                                m.insert(k.clone(), t.clone());
                            }
                        } else {
                            m.insert(k.clone(), v.clone());
                        }
                    }
                    "properties" => {
                        let props = v
                            .as_object()
                            .map(|p| {
                                p.iter()
                                    .map(|(pk, pv)| (pk.clone(), to_v2(pv)))
                                    .collect::<Map<_, _>>()
                            })
                            .unwrap_or_default();
                        m.insert(k.clone(), Value::Object(props));
                    }
                    _ => {
                        m.insert(k.clone(), to_v2(v));
                    }
                }
            }
            Value::Object(m)
        }
        Value::Array(a) => Value::Array(a.iter().map(to_v2).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inlines_refs_keeping_descriptions() {
        let root = json!({
            "$schema": "x", "type": "object",
            "properties": {"spec": {"$ref": "#/$defs/Spec", "description": "the spec"}},
            "$defs": {"Spec": {"type": "object", "description": "old", "properties": {"a": {"type": "string"}}}}
        });
        let out = inline_refs(&root);
        assert_eq!(
            out,
            json!({"type": "object", "properties": {"spec": {"type": "object", "description": "the spec", "properties": {"a": {"type": "string"}}}}})
        );
    }

    #[test]
    fn recursive_refs_are_cut() {
        let root = json!({"$ref": "#/$defs/N", "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}});
        let out = inline_refs(&root);
        let mut v = &out;
        let mut depth = 0;
        while let Some(n) = v.get("properties").and_then(|p| p.get("next")) {
            v = n;
            depth += 1;
        }
        assert_eq!(depth, MAX_DEPTH);
        assert_eq!(
            v.get("x-kubernetes-preserve-unknown-fields"),
            Some(&json!(true))
        );
    }

    #[test]
    fn finds_unknown_fields() {
        let schema = json!({"type": "object", "properties": {
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {"mtu": {"type": "integer"},
                "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}}});
        let obj = json!({"metadata": {"anything": 1}, "spec": {"mtu": 1, "foo": 2, "items": [{"a": "x", "b": 1}], "labels": {"k": "v"}}, "extra": 1});
        let mut got = unknown_fields(&obj, &schema);
        got.sort();
        assert_eq!(got, vec!["extra", "spec.foo", "spec.items[0].b"]);
    }

    #[test]
    fn v2_conversion() {
        let s = json!({"type": ["string", "null"], "nullable": true, "properties": {"x": {"anyOf": [{}], "type": "integer"}}});
        assert_eq!(
            to_v2(&s),
            json!({"type": "string", "properties": {"x": {"type": "integer"}}})
        );
    }
}
