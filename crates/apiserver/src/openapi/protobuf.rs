//! `/openapi/v2` in protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`),
//! the encoding kubectl asks for when it validates on the client: it does
//! so for what the server cannot validate, which is every `kind: List` (a
//! client-side kind: kubectl validates its items one by one against the v2
//! definitions, as with kube-apiserver).
//!
//! The message is gnostic's `openapi.v2.Document`, written field by field
//! from the JSON document (proto3 wire format: varint keys, length-delimited
//! strings and messages, zero values omitted). It carries `swagger`, `info`
//! and `definitions` — what clients read from this encoding (validation,
//! patch metadata); the paths are served in the JSON document and per
//! group-version in `/openapi/v3`.

use serde_json::{Map, Value};

/// The Content-Type it is sent with. Clients ask for
/// `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`, but that
/// is no valid media type (`@` is not a token character: Go's
/// `mime.ParseMediaType`, which client-go runs on the answer, rejects it),
/// so kube-apiserver answers with `application/octet-stream`, and so do we.
pub const CONTENT_TYPE: &str = "application/octet-stream";

/// Encodes a Swagger 2.0 JSON document as an `openapi.v2.Document`.
pub fn encode_document(doc: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    string(&mut out, 1, doc["swagger"].as_str().unwrap_or("2.0"));
    if let Some(info) = doc["info"].as_object() {
        let mut m = Vec::new();
        for (field, key) in [(1, "title"), (2, "version"), (3, "description")] {
            if let Some(s) = info.get(key).and_then(Value::as_str) {
                string(&mut m, field, s);
            }
        }
        message(&mut out, 2, &m);
    }
    if let Some(defs) = doc["definitions"].as_object() {
        let mut m = Vec::new();
        named_schemas(&mut m, 1, defs);
        message(&mut out, 9, &m);
    }
    out
}

/// `repeated NamedSchema` (`Definitions`, `Properties`) as field `field`.
fn named_schemas(out: &mut Vec<u8>, field: u32, map: &Map<String, Value>) {
    for (name, s) in map {
        let mut named = Vec::new();
        string(&mut named, 1, name);
        message(&mut named, 2, &schema(s));
        message(out, field, &named);
    }
}

/// An `openapi.v2.Schema`. Keys the message has no field for (v3-only
/// keywords) are left out, as a v2 document has none of them.
fn schema(s: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(o) = s.as_object() else {
        return out;
    };
    for (k, v) in o {
        match (k.as_str(), v) {
            ("$ref", Value::String(x)) => string(&mut out, 1, x),
            ("format", Value::String(x)) => string(&mut out, 2, x),
            ("title", Value::String(x)) => string(&mut out, 3, x),
            ("description", Value::String(x)) => string(&mut out, 4, x),
            ("default", x) => message(&mut out, 5, &any(x)),
            ("multipleOf", x) => double(&mut out, 6, x),
            ("maximum", x) => double(&mut out, 7, x),
            ("exclusiveMaximum", Value::Bool(b)) => boolean(&mut out, 8, *b),
            ("minimum", x) => double(&mut out, 9, x),
            ("exclusiveMinimum", Value::Bool(b)) => boolean(&mut out, 10, *b),
            ("maxLength", x) => int64(&mut out, 11, x),
            ("minLength", x) => int64(&mut out, 12, x),
            ("pattern", Value::String(x)) => string(&mut out, 13, x),
            ("maxItems", x) => int64(&mut out, 14, x),
            ("minItems", x) => int64(&mut out, 15, x),
            ("uniqueItems", Value::Bool(b)) => boolean(&mut out, 16, *b),
            ("maxProperties", x) => int64(&mut out, 17, x),
            ("minProperties", x) => int64(&mut out, 18, x),
            ("required", Value::Array(xs)) => {
                for x in xs.iter().filter_map(Value::as_str) {
                    string(&mut out, 19, x);
                }
            }
            ("enum", Value::Array(xs)) => {
                for x in xs {
                    message(&mut out, 20, &any(x));
                }
            }
            ("additionalProperties", Value::Bool(b)) => {
                // oneof: always written, false included
                let mut m = Vec::new();
                key(&mut m, 2, 0);
                varint(&mut m, u64::from(*b));
                message(&mut out, 21, &m);
            }
            ("additionalProperties", x @ Value::Object(_)) => {
                let mut m = Vec::new();
                message(&mut m, 1, &schema(x));
                message(&mut out, 21, &m);
            }
            ("type", x) => {
                let mut m = Vec::new();
                match x {
                    Value::String(t) => string(&mut m, 1, t),
                    Value::Array(ts) => {
                        for t in ts.iter().filter_map(Value::as_str) {
                            string(&mut m, 1, t);
                        }
                    }
                    _ => {}
                }
                message(&mut out, 22, &m);
            }
            ("items", x) => {
                let mut m = Vec::new();
                match x {
                    Value::Array(xs) => {
                        for x in xs {
                            message(&mut m, 1, &schema(x));
                        }
                    }
                    x => message(&mut m, 1, &schema(x)),
                }
                message(&mut out, 23, &m);
            }
            ("allOf", Value::Array(xs)) => {
                for x in xs {
                    message(&mut out, 24, &schema(x));
                }
            }
            ("properties", Value::Object(props)) => {
                let mut m = Vec::new();
                named_schemas(&mut m, 1, props);
                message(&mut out, 25, &m);
            }
            ("discriminator", Value::String(x)) => string(&mut out, 26, x),
            ("readOnly", Value::Bool(b)) => boolean(&mut out, 27, *b),
            ("example", x) => message(&mut out, 30, &any(x)),
            (name, x) if name.starts_with("x-") => {
                let mut named = Vec::new();
                string(&mut named, 1, name);
                message(&mut named, 2, &any(x));
                message(&mut out, 31, &named);
            }
            _ => {}
        }
    }
    out
}

/// An `openapi.v2.Any`: the value as YAML (field 2), which clients parse
/// with a YAML decoder; JSON is YAML.
fn any(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    string(&mut out, 2, &v.to_string());
    out
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (proto3 omits an empty string; an empty
/// message is kept, since its presence can mean something).
fn message(out: &mut Vec<u8>, field: u32, body: &[u8]) {
    key(out, field, 2);
    varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        message(out, field, s.as_bytes());
    }
}

fn boolean(out: &mut Vec<u8>, field: u32, b: bool) {
    if b {
        key(out, field, 0);
        varint(out, 1);
    }
}

fn int64(out: &mut Vec<u8>, field: u32, v: &Value) {
    if let Some(n) = v.as_i64().filter(|n| *n != 0) {
        key(out, field, 0);
        // two's complement, as proto's int64 (a negative takes ten bytes)
        varint(out, n as u64);
    }
}

fn double(out: &mut Vec<u8>, field: u32, v: &Value) {
    if let Some(x) = v.as_f64().filter(|x| *x != 0.0) {
        key(out, field, 1);
        out.extend_from_slice(&x.to_le_bytes());
    }
}

#[cfg(test)]
mod tests;
