#![allow(clippy::unwrap_used, clippy::expect_used)] // test code

use serde_json::json;

use super::*;

/// One decoded field: number and value (varint, 64-bit, or bytes).
#[derive(Debug, Clone, PartialEq)]
enum F {
    Varint(u64),
    Fixed(u64),
    Bytes(Vec<u8>),
}

/// A minimal proto3 wire decoder (fails on anything malformed).
fn fields(mut b: &[u8]) -> Vec<(u32, F)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (first, rest) = b.split_first().expect("truncated varint");
            *b = rest;
            v |= u64::from(first & 0x7f) << shift;
            if first & 0x80 == 0 {
                return v;
            }
        }
        panic!("varint too long")
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let k = varint(&mut b);
        let field = u32::try_from(k >> 3).unwrap();
        match k & 7 {
            0 => out.push((field, F::Varint(varint(&mut b)))),
            1 => {
                let (x, rest) = b.split_at(8);
                b = rest;
                out.push((field, F::Fixed(u64::from_le_bytes(x.try_into().unwrap()))));
            }
            2 => {
                let n = usize::try_from(varint(&mut b)).unwrap();
                let (x, rest) = b.split_at(n);
                b = rest;
                out.push((field, F::Bytes(x.to_vec())));
            }
            w => panic!("wire type {w}"),
        }
    }
    out
}

fn bytes(fs: &[(u32, F)], field: u32) -> Vec<Vec<u8>> {
    fs.iter()
        .filter(|(f, _)| *f == field)
        .map(|(_, v)| match v {
            F::Bytes(b) => b.clone(),
            other => panic!("field {field}: {other:?}"),
        })
        .collect()
}

fn text(fs: &[(u32, F)], field: u32) -> Vec<String> {
    bytes(fs, field)
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect()
}

/// NamedSchema list → (name, Schema fields).
fn named(fs: &[(u32, F)]) -> Vec<(String, Vec<(u32, F)>)> {
    bytes(fs, 1)
        .iter()
        .map(|n| {
            let nf = fields(n);
            (text(&nf, 1)[0].clone(), fields(&bytes(&nf, 2)[0]))
        })
        .collect()
}

#[test]
fn a_document_decodes_field_by_field_as_gnostic_defines_it() {
    let doc = json!({
        "swagger": "2.0",
        "info": {"title": "cozyplane", "version": "v1.33.0"},
        "paths": {"/api/v1/pods": {}},
        "definitions": {
            "io.k8s.api.core.v1.Pod": {
                "description": "a pod",
                "type": "object",
                "required": ["spec", "metadata"],
                "properties": {
                    "spec": {"$ref": "#/definitions/spec"},
                    "ports": {"type": "array", "items": {"type": "integer", "format": "int32",
                        "minimum": 1, "maximum": 65535}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "open": {"type": "object", "additionalProperties": false},
                    "phase": {"type": "string", "enum": ["Pending", "Running"], "maxLength": 10,
                        "minLength": -1, "uniqueItems": true},
                },
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Pod"}],
                "nullable": true,
            },
        },
    });
    let pb = encode_document(&doc);
    let d = fields(&pb);
    assert_eq!(text(&d, 1), ["2.0"]);
    let info = fields(&bytes(&d, 2)[0]);
    assert_eq!(text(&info, 1), ["cozyplane"]);
    assert_eq!(text(&info, 2), ["v1.33.0"]);
    assert!(bytes(&d, 8).is_empty(), "no paths in this encoding");
    let defs = named(&fields(&bytes(&d, 9)[0]));
    assert_eq!(defs.len(), 1);
    let (name, pod) = &defs[0];
    assert_eq!(name, "io.k8s.api.core.v1.Pod");
    assert_eq!(text(pod, 4), ["a pod"]);
    assert_eq!(text(&fields(&bytes(pod, 22)[0]), 1), ["object"]);
    assert_eq!(text(pod, 19), ["spec", "metadata"]);
    // the vendor extension: name, and its value as YAML (JSON)
    let ext = fields(&bytes(pod, 31)[0]);
    assert_eq!(text(&ext, 1), ["x-kubernetes-group-version-kind"]);
    let yaml = &text(&fields(&bytes(&ext, 2)[0]), 2)[0];
    let gvk: Value = serde_json::from_str(yaml).unwrap();
    assert_eq!(gvk[0]["kind"], "Pod");
    // `nullable` has no v2 field: dropped, nothing unknown written
    assert!(pod.iter().all(|(f, _)| [4, 19, 22, 25, 31].contains(f)));

    let props: std::collections::BTreeMap<_, _> =
        named(&fields(&bytes(pod, 25)[0])).into_iter().collect();
    assert_eq!(text(&props["spec"], 1), ["#/definitions/spec"]);
    let items = fields(&bytes(&props["ports"], 23)[0]);
    let item = fields(&bytes(&items, 1)[0]);
    assert_eq!(text(&item, 2), ["int32"]);
    assert!(item.contains(&(9, F::Fixed(1f64.to_bits()))), "minimum");
    assert!(item.contains(&(7, F::Fixed(65535f64.to_bits()))), "maximum");
    let ap = fields(&bytes(&props["labels"], 21)[0]);
    let ap_schema = fields(&bytes(&ap, 1)[0]);
    assert_eq!(text(&fields(&bytes(&ap_schema, 22)[0]), 1), ["string"]);
    // additionalProperties: false is written (the oneof's boolean, 0)
    assert_eq!(fields(&bytes(&props["open"], 21)[0]), [(2, F::Varint(0))]);
    let phase = &props["phase"];
    let enums: Vec<String> = bytes(phase, 20)
        .iter()
        .map(|a| text(&fields(a), 2)[0].clone())
        .collect();
    assert_eq!(enums, ["\"Pending\"", "\"Running\""]);
    assert!(phase.contains(&(11, F::Varint(10))));
    assert!(phase.contains(&(12, F::Varint(u64::MAX))), "int64 -1");
    assert!(phase.contains(&(16, F::Varint(1))));
}

#[test]
fn varints_round_trip() {
    for v in [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX] {
        let mut b = Vec::new();
        key(&mut b, 1, 0);
        varint(&mut b, v);
        assert_eq!(fields(&b), [(1, F::Varint(v))]);
    }
}
