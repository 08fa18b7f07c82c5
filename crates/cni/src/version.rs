//! CNI spec versions: which we speak, and which commands each version allows.
//!
//! Versions are compared as exact strings from a closed list: the spec only
//! ever released these, and accepting "1.0" or "v1.0.0" would let a runtime
//! believe we agreed to something we never tested.

use std::fmt;

use crate::error::{code, CniError};

/// A CNI spec version this plugin supports, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.3.0: rich result, plugin chaining.
    V0_3_0,
    /// 0.3.1: a typo fix over 0.3.0.
    V0_3_1,
    /// 0.4.0: CHECK, prevResult on DEL.
    V0_4_0,
    /// 1.0.0: `ips[].version` removed.
    V1_0_0,
    /// 1.1.0: STATUS, GC, `cniVersions`, route/interface extras.
    V1_1_0,
}

/// Every version we support, in the order VERSION reports them.
pub const SUPPORTED: [CniVersion; 5] = [
    CniVersion::V0_3_0,
    CniVersion::V0_3_1,
    CniVersion::V0_4_0,
    CniVersion::V1_0_0,
    CniVersion::V1_1_0,
];

impl CniVersion {
    /// The newest version we speak; used for output when the input names none.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// The version string as it appears in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Parses a supported version string; anything else is code 1.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        SUPPORTED
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| {
                CniError::new(
                    code::INCOMPATIBLE_VERSION,
                    format!("incompatible CNI version {s:?}"),
                )
                .with_details(format!("supported versions: {}", supported_list()))
            })
    }

    /// Whether CHECK exists in this version (0.4.0 and later).
    pub fn has_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// Whether STATUS and GC exist in this version (1.1.0 and later).
    pub fn has_status_and_gc(self) -> bool {
        self >= CniVersion::V1_1_0
    }

    /// Whether results carry `ips[].version` (before 1.0.0).
    pub fn has_ip_version_field(self) -> bool {
        self < CniVersion::V1_0_0
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The supported versions as a comma-separated list, for messages.
pub fn supported_list() -> String {
    SUPPORTED
        .iter()
        .map(|v| v.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exactly_the_released_versions() {
        for v in SUPPORTED {
            assert_eq!(CniVersion::parse(v.as_str()), Ok(v));
        }
        for bad in ["", "1.0", "v1.0.0", "0.2.0", "0.1.0", "1.2.0", "1.0.0 "] {
            let e = CniVersion::parse(bad).expect_err(bad);
            assert_eq!(e.code, code::INCOMPATIBLE_VERSION, "{bad:?}");
        }
    }

    #[test]
    fn command_availability_follows_the_spec_history() {
        assert!(!CniVersion::V0_3_1.has_check());
        assert!(CniVersion::V0_4_0.has_check());
        assert!(!CniVersion::V1_0_0.has_status_and_gc());
        assert!(CniVersion::V1_1_0.has_status_and_gc());
        assert!(CniVersion::V0_4_0.has_ip_version_field());
        assert!(!CniVersion::V1_0_0.has_ip_version_field());
    }
}
