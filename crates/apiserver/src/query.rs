//! Query-string and media-type parsing for API requests.

use crate::status::ApiError;

/// Checks what `form_urlencoded` would let through silently: a `%` not
/// followed by two hex digits (it keeps them literally) and escapes that do
/// not decode to UTF-8 (it substitutes U+FFFD). Both are a 400 here.
fn check_encoding(q: &str) -> Result<(), ApiError> {
    let b = q.as_bytes();
    let bad_escape = b.iter().enumerate().any(|(i, c)| {
        *c == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if bad_escape {
        return Err(ApiError::bad_request(format!(
            "invalid percent-encoding in query {q:?}"
        )));
    }
    // `&`, `=` and `+` are ASCII, so the whole decodes to UTF-8 exactly when
    // every key and value does.
    percent_encoding::percent_decode_str(q)
        .decode_utf8()
        .map_err(|_| ApiError::bad_request("query is not UTF-8"))?;
    Ok(())
}

/// Parsed query parameters, in order, repeated keys kept.
#[derive(Debug, Clone, Default)]
pub struct Query(pub Vec<(String, String)>);

impl Query {
    /// Parses `application/x-www-form-urlencoded` text with `form_urlencoded`
    /// (`&` separates pairs, empty pairs are skipped, a key without `=` has an
    /// empty value, `+` is a space), after [`check_encoding`].
    pub fn parse(q: Option<&str>) -> Result<Self, ApiError> {
        let q = q.unwrap_or("");
        check_encoding(q)?;
        Ok(Query(
            form_urlencoded::parse(q.as_bytes()).into_owned().collect(),
        ))
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A boolean flag (`true`/`1`); anything else that is set is an error.
    pub fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None | Some("") | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(v) => Err(ApiError::bad_request(format!(
                "{key}: invalid boolean {v:?}"
            ))),
        }
    }

    /// A non-negative integer parameter.
    pub fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("{key}: invalid integer {v:?}"))),
        }
    }

    /// `dryRun=All` (the only value kube accepts).
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        let mut dry = false;
        for (k, v) in &self.0 {
            if k == "dryRun" {
                match v.as_str() {
                    "All" => dry = true,
                    "" => {}
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                        )))
                    }
                }
            }
        }
        Ok(dry)
    }
}

/// Whether an `Accept` header asks for `as=<what>;g=<group>;v=<version>`.
pub fn accept_wants(accept: &str, what: &str, group: &str, version: &str) -> bool {
    accept.split(',').any(|range| {
        let params: Vec<(String, String)> = range
            .split(';')
            .skip(1)
            .filter_map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            })
            .collect();
        let has = |k: &str, v: &str| params.iter().any(|(pk, pv)| pk == k && pv == v);
        has("as", what) && has("g", group) && has("v", version)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_queries() {
        let q = Query::parse(Some("labelSelector=app+in+%28a%2Cb%29&watch=1&dryRun=All"))
            .ok()
            .unwrap_or_default();
        assert_eq!(q.get("labelSelector"), Some("app in (a,b)"));
        assert_eq!(q.flag("watch").ok(), Some(true));
        assert_eq!(q.dry_run().ok(), Some(true));
        assert!(Query::parse(Some("a=%zz")).is_err());
        let bad = Query::parse(Some("dryRun=Some")).ok().unwrap_or_default();
        assert!(bad.dry_run().is_err());
    }

    fn pairs(q: &str) -> Vec<(String, String)> {
        match Query::parse(Some(q)) {
            Ok(Query(v)) => v,
            Err(e) => panic!("{q:?}: {e:?}"),
        }
    }

    fn own(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pairs_split_and_decode_like_forms() {
        for (q, want) in [
            // repeated keys keep their order; `get` takes the first
            ("a=1&a=2", own(&[("a", "1"), ("a", "2")])),
            // empty pairs are skipped, a key without `=` has an empty value
            ("&&watch&&limit=&", own(&[("watch", ""), ("limit", "")])),
            ("=x", own(&[("", "x")])),
            // only the first `=` separates
            ("a=b=c", own(&[("a", "b=c")])),
            // `+` is a space, `%2B` a plus, in keys and values
            ("a+b=c+d%2Be", own(&[("a b", "c d+e")])),
            // escaped separators are data
            ("a=x%26b%3Dy", own(&[("a", "x&b=y")])),
            ("a%3Db=c", own(&[("a=b", "c")])),
            // upper- and lower-case hex, multi-byte UTF-8
            ("n=%c3%A9t%C3%a9", own(&[("n", "été")])),
            ("", own(&[])),
        ] {
            assert_eq!(pairs(q), want, "{q:?}");
        }
        assert_eq!(Query::parse(None).map(|q| q.0.len()).ok(), Some(0));
        let q = Query::parse(Some("a=1&a=2")).ok().unwrap_or_default();
        assert_eq!(q.get("a"), Some("1"));
    }

    #[test]
    fn bad_encodings_are_refused() {
        for q in ["a=%", "a=%2", "a=%zz", "%g0=1", "a=1&b=%2", "a=%%41"] {
            let e = Query::parse(Some(q)).err();
            assert!(
                e.as_ref()
                    .is_some_and(|e| e.to_string().contains("invalid percent-encoding")),
                "{q:?}: {e:?}"
            );
        }
        // escapes that are not UTF-8 (a lone continuation byte, a cut sequence)
        for q in ["a=%80", "a=%C3", "%C3=1", "a=%C3&b=%A9"] {
            let e = Query::parse(Some(q)).err();
            assert!(
                e.as_ref()
                    .is_some_and(|e| e.to_string().contains("not UTF-8")),
                "{q:?}: {e:?}"
            );
        }
    }

    #[test]
    fn flags_numbers_and_dry_run_over_repeats_and_empties() {
        let q = |s: &str| Query::parse(Some(s)).ok().unwrap_or_default();
        assert_eq!(q("watch=&limit=").flag("watch").ok(), Some(false));
        assert_eq!(q("watch=&limit=").number("limit").ok(), Some(None));
        assert_eq!(q("watch").flag("watch").ok(), Some(false));
        assert!(q("watch=yes").flag("watch").is_err());
        assert!(q("limit=-1").number("limit").is_err());
        assert!(
            q("limit=1+").number("limit").is_err(),
            "`+` decodes to a space"
        );
        assert_eq!(q("limit=500&limit=1").number("limit").ok(), Some(Some(500)));
        // every dryRun counts, not only the first
        assert_eq!(q("dryRun=&dryRun=All").dry_run().ok(), Some(true));
        assert!(q("dryRun=All&dryRun=Bad").dry_run().is_err());
        assert_eq!(q("dryRun=").dry_run().ok(), Some(false));
    }

    #[test]
    fn accept_negotiation() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert!(accept_wants(kubectl, "Table", "meta.k8s.io", "v1"));
        assert!(!accept_wants(
            "application/json",
            "Table",
            "meta.k8s.io",
            "v1"
        ));
        let disc =
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
        assert!(accept_wants(
            disc,
            "APIGroupDiscoveryList",
            "apidiscovery.k8s.io",
            "v2"
        ));
    }
}
