//! The CNI error result: `{cniVersion, code, msg, details}` on stdout, exit non-zero.
//!
//! Every failure the plugin can report is a [`CniError`] carrying one of the
//! spec's well-known codes (0–99 are reserved by the spec) or one of our own
//! plugin-specific codes (100+). The agent returns the same shape over the
//! socket, so an agent-side failure reaches the runtime unchanged.

use serde::{Deserialize, Serialize};

/// Well-known error codes from the CNI spec (section 5, "Error") and ours (100+).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in network configuration (the message names key and value).
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist; the runtime need not clean up.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables (the message names them).
    pub const INVALID_ENVIRONMENT: u32 = 4;
    /// I/O failure, e.g. reading the config from stdin.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content, e.g. the config is not JSON.
    pub const DECODING_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// Try again later: a transient condition (agent restarting, busy, slow).
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot service ADD requests.
    pub const NOT_AVAILABLE: u32 = 50;
    /// STATUS: not available, and existing containers may have limited connectivity.
    pub const NOT_AVAILABLE_LIMITED_CONNECTIVITY: u32 = 51;
    /// Plugin-specific: the node agent failed internally.
    pub const AGENT_INTERNAL: u32 = 100;
    /// Plugin-specific: the plugin and the agent could not understand each other
    /// (bad framing, oversized message, protocol version skew).
    pub const PROTOCOL: u32 = 101;
    /// Plugin-specific: the pod asks for a network it may not join (no
    /// VPCBinding, unknown VPC, malformed annotation); the message names why.
    pub const ATTACHMENT_DENIED: u32 = 102;
}

/// A CNI error as defined by the spec, without the `cniVersion` (added on output).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("CNI error {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
pub struct CniError {
    /// The numeric code (see [`code`]).
    pub code: u32,
    /// A short message characterising the error.
    pub msg: String,
    /// A longer description; empty when there is nothing more to say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// An error with a code and a message, without details.
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Adds a longer description.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The spec's error JSON for the given protocol version.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut obj = serde_json::Map::new();
        obj.insert("cniVersion".into(), cni_version.into());
        obj.insert("code".into(), self.code.into());
        obj.insert("msg".into(), self.msg.clone().into());
        if !self.details.is_empty() {
            obj.insert("details".into(), self.details.clone().into());
        }
        serde_json::Value::Object(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_the_spec_shape() {
        let e = CniError::new(code::INVALID_NETWORK_CONFIG, "Invalid Configuration")
            .with_details("mtu 10 is below 1280");
        assert_eq!(
            e.to_json("1.1.0"),
            serde_json::json!({
                "cniVersion": "1.1.0",
                "code": 7,
                "msg": "Invalid Configuration",
                "details": "mtu 10 is below 1280"
            })
        );
        // no details → no key (the spec's Go types omit it when empty)
        let e = CniError::new(code::TRY_AGAIN_LATER, "agent busy");
        assert_eq!(
            e.to_json("1.0.0"),
            serde_json::json!({"cniVersion": "1.0.0", "code": 11, "msg": "agent busy"})
        );
    }

    #[test]
    fn display_includes_details_only_when_present() {
        assert_eq!(CniError::new(4, "bad").to_string(), "CNI error 4: bad");
        assert_eq!(
            CniError::new(4, "bad")
                .with_details("CNI_IFNAME")
                .to_string(),
            "CNI error 4: bad (CNI_IFNAME)"
        );
    }
}
