//! `continue` tokens: the store revision of the first page and the last key
//! returned, so every page reads the same snapshot. A token whose revision
//! was compacted answers 410 Expired, as kube-apiserver does.

use base64::Engine;
use cozyplane_store::Revision;
use serde_json::json;

use crate::status::ApiError;

/// The 410 message for an expired token.
pub const TOO_OLD: &str = "The provided continue parameter is too old to display a consistent list result (continue token too old). You can start a new list without the continue parameter.";

/// Encode a token.
pub fn encode(rev: Revision, last_key: &str) -> String {
    let raw = json!({"v": "meta.k8s.io/v1", "rv": rev, "start": last_key}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

/// Decode a token into (revision, last key).
pub fn decode(token: &str) -> Result<(Revision, String), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: serde_json::Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v
        .get("rv")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(bad)?;
    let key = v
        .get("start")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(bad)?;
    Ok((rev, key.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let t = encode(42, "/core/pods/ns/p");
        assert_eq!(decode(&t).ok(), Some((42, "/core/pods/ns/p".to_string())));
        assert_eq!(decode("!!!").err().map(|e| e.code), Some(400));
        assert_eq!(decode("e30").err().map(|e| e.code), Some(400));
    }
}
