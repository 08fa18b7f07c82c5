//! Query-string and media-type parsing for API requests.

use crate::status::ApiError;

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decode `application/x-www-form-urlencoded` text (`+` is a space).
pub fn percent_decode(s: &str) -> Result<String, ApiError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let v = b
                    .get(i + 1)
                    .and_then(|x| hex(*x))
                    .zip(b.get(i + 2).and_then(|x| hex(*x)));
                let Some((h, l)) = v else {
                    return Err(ApiError::bad_request(format!(
                        "invalid percent-encoding in query {s:?}"
                    )));
                };
                out.push(h * 16 + l);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ApiError::bad_request("query is not UTF-8"))
}

/// Parsed query parameters, in order, repeated keys kept.
#[derive(Debug, Clone, Default)]
pub struct Query(pub Vec<(String, String)>);

impl Query {
    pub fn parse(q: Option<&str>) -> Result<Self, ApiError> {
        let mut v = Vec::new();
        for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, val) = pair.split_once('=').unwrap_or((pair, ""));
            v.push((percent_decode(k)?, percent_decode(val)?));
        }
        Ok(Query(v))
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
