//! The bounds the server puts on what a client can make it do, in one place
//! so the docs (docs/apiserver.md, "Limits") and the code cannot drift.
//!
//! Every bound is tied to the request body limit: a request that fits in the
//! body limit must not be able to make the server store, or hold in memory,
//! much more than that.
//!
//! The bounds on connections are in [`crate::connections`], the per-user
//! limit on open watches in [`crate::watch`].

use serde_json::Value;

/// The largest request body accepted (kube-apiserver's `MaxRequestBodyBytes`,
/// 3 MiB); larger bodies answer 413 RequestEntityTooLarge.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The largest object the server stores, encoded: a write whose result
/// would be larger (a patch that grows an object, an update near the body
/// limit plus the server's own metadata) answers 413, as kube-apiserver does
/// when etcd refuses a too-large request.
pub const MAX_OBJECT_BYTES: usize = MAX_BODY_BYTES;

/// The most operations one JSON patch may have (kube-apiserver's
/// `maxJSONPatchOperations`); more answer 413, as in kube.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The most bytes the `copy` operations of one JSON patch may add in total
/// (kube-apiserver's `JSONPatchMaxCopyBytes`, equal to the body limit);
/// past it the patch answers 422, as kube's json-patch library fails it.
/// Without it a ~1 KiB patch of 17 self-doubling copies stores a 6 MB object.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = MAX_BODY_BYTES;

/// The most elements a list of a strategic merge patch, or a list the
/// merge produces, may have (2^20); more answer 413, as a JSON patch over
/// its operation limit does. A 3 MiB body holds at most ~1.5 M elements of
/// the shortest encoding (`0,`), so only lists no real object has are
/// refused, and the merge's own output stays bounded before the size of
/// the result is checked. (kube has no such bound.)
pub const MAX_SMP_LIST_ITEMS: usize = 1 << 20;

/// The longest grace period a DELETE (`gracePeriodSeconds`) or a pod
/// (`spec.terminationGracePeriodSeconds`) gets: 100 years. kube only clamps
/// negative periods (to 1) and relies on Go's saturating time arithmetic;
/// here a larger period would overflow the deletion timestamp (and past
/// year 9999 it would not be an RFC 3339 time clients can parse), so it is
/// clamped to a bound no real grace period reaches.
pub const MAX_GRACE_SECONDS: i64 = 100 * 365 * 24 * 3600;

/// The deepest an object may be nested (`{}` is 1 deep, `{"a":[]}` 2):
/// a create, update or patch whose result is deeper answers 422 before it
/// is stored. Below [`DECODE_DEPTH`] with room to spare, so an object stays
/// readable inside a list (+2), a watch event (+1) or a Table row (+3) by a
/// client whose decoder has serde_json's limit (kube-rs); no real object
/// comes near it.
pub const MAX_OBJECT_DEPTH: usize = 100;

/// The deepest JSON serde_json reads (its recursion limit of 128 allows
/// 127 nested arrays or objects): a stored value deeper than this cannot be
/// decoded by the server.
pub const DECODE_DEPTH: usize = 127;

/// Whether `v` is nested deeper than `max` (recursing at most `max + 1`
/// levels, so it is safe on values of any depth the decoder produced).
pub fn deeper_than(v: &Value, max: usize) -> bool {
    let mut children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Array(a) => Box::new(a.iter()),
        Value::Object(o) => Box::new(o.values()),
        _ => return false,
    };
    match max.checked_sub(1) {
        None => true,
        Some(below) => children.any(|c| deeper_than(c, below)),
    }
}

/// Whether the JSON text `raw` nests arrays/objects deeper than `max`,
/// without parsing it. Cheap for the objects lists copy verbatim: text with
/// no more than `max` brackets in all cannot be deeper, and is not scanned.
pub fn raw_deeper_than(raw: &[u8], max: usize) -> bool {
    if raw.iter().filter(|b| matches!(b, b'{' | b'[')).count() <= max {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in raw {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: usize) -> Value {
        (1..n).fold(Value::Array(Vec::new()), |inner, _| {
            Value::Array(vec![inner])
        })
    }

    #[test]
    fn decode_depth_is_serde_jsons() {
        let text = |n: usize| "[".repeat(n) + &"]".repeat(n);
        assert!(serde_json::from_str::<Value>(&text(DECODE_DEPTH)).is_ok());
        assert!(serde_json::from_str::<Value>(&text(DECODE_DEPTH + 1)).is_err());
    }

    #[test]
    fn depth_is_measured_on_values_and_text() {
        let v = serde_json::json!({"a": {"b": [1, {"c": chain(3)}]}, "d": 1});
        // {} a{} b[] {} chain(3) = 4 + 3
        assert!(!deeper_than(&v, 7));
        assert!(deeper_than(&v, 6));
        assert!(!deeper_than(&Value::Null, 0));
        assert!(deeper_than(&chain(1), 0));
        let text = v.to_string();
        assert!(!raw_deeper_than(text.as_bytes(), 7));
        // Brackets inside strings do not count; escaped quotes do not end them.
        let tricky = br#"{"s":"[[[[\"[[[[","t":[[]]}"#;
        assert!(!raw_deeper_than(tricky, 3));
        assert!(raw_deeper_than(tricky, 2));
        assert!(raw_deeper_than(&text_of(200), 127));
        assert!(!raw_deeper_than(&text_of(127), 127));
    }

    fn text_of(n: usize) -> Vec<u8> {
        ("[".repeat(n) + &"]".repeat(n)).into_bytes()
    }
}
