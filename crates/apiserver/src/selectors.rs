//! Label and field selectors, parsed from the `labelSelector` and
//! `fieldSelector` query parameters with kube's grammar, and evaluated on
//! unstructured objects. The same selectors filter lists and watches.

use serde_json::Value;

use crate::meta;
use crate::status::ApiError;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: all requirements must hold. Empty selects all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelReq>);

impl LabelSelector {
    /// Byte strings that every object this selector matches contains in its
    /// stored form (compact JSON written by serde_json, as the registry's
    /// `encode` writes every object): `"key":"value"` for each equality
    /// requirement. An object missing one cannot match, so a list can skip
    /// decoding it; one that has them all is still decoded and matched (the
    /// pair may sit elsewhere, in an annotation, say).
    pub fn stored_needles(&self) -> Vec<Vec<u8>> {
        self.0
            .iter()
            .filter_map(|r| match r {
                LabelReq::Eq(k, v) => {
                    let mut n = serde_json::to_vec(k).ok()?;
                    n.push(b':');
                    n.extend(serde_json::to_vec(v).ok()?);
                    Some(n)
                }
                _ => None,
            })
            .collect()
    }
}

/// Split on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, ApiError> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(ApiError::bad_request(format!(
                        "unable to parse requirement: unbalanced ')' in {s:?}"
                    )));
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(ApiError::bad_request(format!(
            "unable to parse requirement: unbalanced '(' in {s:?}"
        )));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn check_key(k: &str, whole: &str) -> Result<String, ApiError> {
    if meta::is_qualified_name(k) {
        Ok(k.to_string())
    } else {
        Err(ApiError::bad_request(format!(
            "unable to parse requirement: invalid label key {k:?} in {whole:?}"
        )))
    }
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: expected '(' set ')' in {whole:?}"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parse `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top_level(s)? {
            let p = part.trim();
            if p.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: empty requirement in {s:?}"
                )));
            }
            if let Some(k) = p.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(check_key(k.trim(), s)?));
            } else if let Some((k, v)) = p.split_once("!=") {
                reqs.push(LabelReq::NotEq(
                    check_key(k.trim(), s)?,
                    v.trim().to_string(),
                ));
            } else if let Some((k, v)) = p.split_once("==") {
                reqs.push(LabelReq::Eq(check_key(k.trim(), s)?, v.trim().to_string()));
            } else if let Some((k, v)) = p.split_once('=') {
                reqs.push(LabelReq::Eq(check_key(k.trim(), s)?, v.trim().to_string()));
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                reqs.push(LabelReq::NotIn(
                    check_key(k.trim(), s)?,
                    parse_set(rest, s)?,
                ));
            } else if let Some((k, rest)) = p.split_once(" in ") {
                reqs.push(LabelReq::In(check_key(k.trim(), s)?, parse_set(rest, s)?));
            } else {
                reqs.push(LabelReq::Exists(check_key(p, s)?));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels = meta::labels(obj);
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// One field requirement (`=`/`==` or `!=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldReq {
    pub path: String,
    pub value: String,
    pub negate: bool,
}

/// A parsed field selector over the fields a kind supports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldReq>);

impl FieldSelector {
    /// Parse `metadata.name=x,spec.nodeName!=n`, allowing only
    /// `metadata.name`, `metadata.namespace` and the kind's extra fields.
    pub fn parse(s: &str, extra: &[&str]) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(reqs));
        }
        for part in s.split(',') {
            let p = part.trim();
            let (path, value, negate) = if let Some((k, v)) = p.split_once("!=") {
                (k, v, true)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, v, false)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: {s:?}; can't understand {p:?}"
                )));
            };
            let path = path.trim();
            if path != "metadata.name" && path != "metadata.namespace" && !extra.contains(&path) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {path}"
                )));
            }
            reqs.push(FieldReq {
                path: path.to_string(),
                value: value.trim().to_string(),
                negate,
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// The name this selector pins (`metadata.name=x`), if any: lets a
    /// single-object watch (`kubectl get x -w`) skip other objects early.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|r| r.path == "metadata.name" && !r.negate)
            .map(|r| r.value.as_str())
    }

    /// Whether every requirement holds. A missing field reads as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = match meta::field_path(obj, &r.path) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                Some(other) => other.to_string(),
            };
            (actual == r.value) != r.negate
        })
    }
}

/// Both selectors of a list or watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    pub fn is_empty(&self) -> bool {
        self.labels.0.is_empty() && self.fields.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn equality_requirements_name_the_bytes_a_stored_match_holds() {
        let s = LabelSelector::parse("a=b,c==d,e!=f,g in (h),i,!j").unwrap();
        let needles = s.stored_needles();
        assert_eq!(needles, [b"\"a\":\"b\"".to_vec(), b"\"c\":\"d\"".to_vec()]);
        // as the registry stores an object (compact serde_json)
        let stored =
            serde_json::to_vec(&serde_json::json!({"metadata": {"labels": {"c": "d", "a": "b"}}}))
                .unwrap();
        for n in &needles {
            assert!(stored.windows(n.len()).any(|w| w == n.as_slice()));
        }
    }

    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "p1", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn all_label_operators() {
        let o = obj(json!({"app": "web", "tier": "fe", "sdn.cozystack.io/vpc": "v"}));
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app in (web,db)",
            "app notin (db)",
            "tier",
            "!missing",
            "sdn.cozystack.io/vpc=v",
            "app=web,tier in (fe, be)",
            "missing notin (x)",
            "",
        ];
        for s in yes {
            assert!(
                LabelSelector::parse(s)
                    .map(|l| l.matches(&o))
                    .unwrap_or(false),
                "{s} should match"
            );
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "app notin (web)",
            "missing",
            "!app",
            "missing in (x)",
        ];
        for s in no {
            assert!(
                !LabelSelector::parse(s)
                    .map(|l| l.matches(&o))
                    .unwrap_or(true),
                "{s} should not match"
            );
        }
    }

    #[test]
    fn bad_label_selectors_are_400() {
        for s in ["app in (a", "bad key=1", "a=b,,c", "x in a,b"] {
            let e = LabelSelector::parse(s).err();
            assert_eq!(e.map(|e| e.code), Some(400), "{s}");
        }
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let extra = ["spec.nodeName", "status.phase"];
        let ok = |s: &str| {
            FieldSelector::parse(s, &extra)
                .map(|f| f.matches(&o))
                .unwrap_or(false)
        };
        assert!(ok("metadata.name=p1"));
        assert!(ok("metadata.namespace==ns,spec.nodeName=n1"));
        assert!(ok("status.phase!=Pending"));
        assert!(ok("spec.nodeName!="));
        assert!(!ok("spec.nodeName="));
        assert!(!ok("metadata.name=p2"));
        let e = FieldSelector::parse("spec.foo=x", &extra).err();
        assert_eq!(
            e.map(|e| e.message),
            Some("field label not supported: spec.foo".to_string())
        );
        assert_eq!(
            FieldSelector::parse("metadata.name=a", &[])
                .ok()
                .and_then(|f| f.pinned_name().map(str::to_string)),
            Some("a".into())
        );
    }
}
