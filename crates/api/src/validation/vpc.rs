//! VPC rules.
//!
//! # Bounds and why
//! * `spec.cidrs`: 1 or 2 entries, **at most one per family** (like a Service's
//!   `clusterIPs`): a VPC is single- or dual-stack, and the CNI, the gateway NAT
//!   (one address per family) and the `.1` gateway convention all assume one range
//!   per family.
//! * Every CIDR must be canonical (host bits zero, RFC 5952 for IPv6); the error
//!   names the canonical form so the fix is a copy-paste.
//! * Prefix length: IPv4 `/8`..=`/30`, IPv6 `/48`..=`/126`. Shorter prefixes are
//!   almost certainly typos that would shadow whole address plans in the VPC's
//!   scope; longer ones leave no room for the network address, the `.1` gateway
//!   leg and at least one pod (the CNI allocates from network+2).
//! * Reserved ranges cannot be used because the datapath gives them meaning:
//!   IPv4 `0.0.0.0/8`, loopback `127.0.0.0/8`, link-local `169.254.0.0/16`
//!   (the pod's on-link gateway `169.254.1.1`), multicast and class E
//!   `224.0.0.0/3`; IPv6 `::/8` (unspecified, loopback, IPv4-mapped),
//!   `64:ff9b::/96` (how the datapath stores IPv4), link-local `fe80::/10`
//!   (the pod gateway `fe80::1`) and multicast `ff00::/8`.
//! * `spec.mtu`: 576..=9000 (the IPv4 minimum to a jumbo frame); with an IPv6
//!   CIDR at least 1280, the IPv6 minimum link MTU (RFC 8200).

use crate::kinds::{FieldError, FieldErrorType};
use crate::sdn::VPC;

use super::net::{parse_canonical_cidr, Cidr};
use super::{decode, invalid};

/// Most CIDRs a VPC may have (one per family).
pub const MAX_CIDRS: usize = 2;
/// Shortest IPv4 prefix.
pub const MIN_PREFIX_V4: u8 = 8;
/// Longest IPv4 prefix.
pub const MAX_PREFIX_V4: u8 = 30;
/// Shortest IPv6 prefix.
pub const MIN_PREFIX_V6: u8 = 48;
/// Longest IPv6 prefix.
pub const MAX_PREFIX_V6: u8 = 126;
/// Smallest MTU.
pub const MIN_MTU: i32 = 576;
/// Smallest MTU when the VPC has an IPv6 CIDR.
pub const MIN_MTU_V6: i32 = 1280;
/// Largest MTU.
pub const MAX_MTU: i32 = 9000;

/// Ranges no VPC CIDR may overlap (see the module docs).
const RESERVED: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/3",
    "::/8",
    "64:ff9b::/96",
    "fe80::/10",
    "ff00::/8",
];

/// Validate a VPC object (create, and the new object of an update).
pub fn validate_vpc(obj: &serde_json::Value) -> Vec<FieldError> {
    let vpc: VPC = match decode(obj) {
        Ok(v) => v,
        Err(e) => return vec![e],
    };
    let mut errs = Vec::new();
    let cidrs = &vpc.spec.cidrs;
    if cidrs.is_empty() {
        errs.push(FieldError::new(
            FieldErrorType::Required,
            "spec.cidrs",
            "at least one CIDR is required",
        ));
    }
    if cidrs.len() > MAX_CIDRS {
        errs.push(FieldError::new(
            FieldErrorType::TooMany,
            "spec.cidrs",
            format!(
                "must have at most {MAX_CIDRS} items (one IPv4 and one IPv6 CIDR), has {}",
                cidrs.len()
            ),
        ));
    }
    let mut seen: Vec<Cidr> = Vec::new();
    for (i, s) in cidrs.iter().enumerate() {
        let field = format!("spec.cidrs[{i}]");
        let cidr = match parse_canonical_cidr(s) {
            Ok(c) => c,
            Err(e) => {
                errs.push(invalid(field, s, e));
                continue;
            }
        };
        if seen.contains(&cidr) {
            errs.push(FieldError::new(
                FieldErrorType::Duplicate,
                field,
                format!("{s:?}: duplicate CIDR"),
            ));
            continue;
        }
        if seen.iter().any(|c| c.is_ipv6() == cidr.is_ipv6()) {
            let fam = if cidr.is_ipv6() { "IPv6" } else { "IPv4" };
            errs.push(invalid(
                field,
                s,
                format!("a VPC has at most one {fam} CIDR"),
            ));
            seen.push(cidr);
            continue;
        }
        seen.push(cidr);
        let (lo, hi) = if cidr.is_ipv6() {
            (MIN_PREFIX_V6, MAX_PREFIX_V6)
        } else {
            (MIN_PREFIX_V4, MAX_PREFIX_V4)
        };
        if cidr.prefix() < lo || cidr.prefix() > hi {
            errs.push(invalid(
                field,
                s,
                format!("prefix length must be between /{lo} and /{hi}"),
            ));
            continue;
        }
        if let Some(r) = RESERVED
            .iter()
            .filter_map(|r| parse_canonical_cidr(r).ok())
            .find(|r| r.overlaps(&cidr))
        {
            errs.push(invalid(
                field,
                s,
                format!("overlaps the reserved range {r}"),
            ));
        }
    }
    if let Some(mtu) = vpc.spec.mtu {
        let v6 = seen.iter().any(Cidr::is_ipv6);
        let lo = if v6 { MIN_MTU_V6 } else { MIN_MTU };
        if !(lo..=MAX_MTU).contains(&mtu) {
            let why = if v6 {
                " (IPv6 needs at least 1280)"
            } else {
                ""
            };
            errs.push(FieldError::new(
                FieldErrorType::Invalid,
                "spec.mtu",
                format!("{mtu}: must be between {lo} and {MAX_MTU}{why}"),
            ));
        }
    }
    errs
}

/// Validate a VPC update: the same rules on the new object (CIDRs may change:
/// growing a VPC or adding a family is a supported operation).
pub fn validate_vpc_update(new: &serde_json::Value, _old: &serde_json::Value) -> Vec<FieldError> {
    validate_vpc(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn vpc(spec: Value) -> Value {
        json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC",
               "metadata": {"name": "blue", "namespace": "tenant-a"}, "spec": spec})
    }

    /// (kind, field) of every error, plus the messages for content checks.
    fn errs(spec: Value) -> Vec<(FieldErrorType, String, String)> {
        validate_vpc(&vpc(spec))
            .into_iter()
            .map(|e| (e.kind, e.field, e.message))
            .collect()
    }

    fn one(spec: Value) -> (FieldErrorType, String, String) {
        let mut e = errs(spec.clone());
        assert_eq!(e.len(), 1, "{spec}: {e:?}");
        e.remove(0)
    }

    #[test]
    fn valid_vpcs() {
        for spec in [
            json!({"cidrs": ["10.0.0.0/24"]}),
            json!({"cidrs": ["10.0.0.0/8"], "mtu": 576}),
            json!({"cidrs": ["192.168.0.0/30"], "mtu": 9000}),
            json!({"cidrs": ["fd00:1::/64"], "mtu": 1280}),
            json!({"cidrs": ["10.1.0.0/16", "fd00:1::/64"], "mtu": 1450}),
            json!({"cidrs": ["2001:db8::/48"]}),
            json!({"cidrs": ["fd00::/126"]}),
        ] {
            assert_eq!(errs(spec.clone()), vec![], "{spec}");
        }
    }

    #[test]
    fn cidrs_required() {
        let (k, f, _) = one(json!({"cidrs": []}));
        assert_eq!((k, f.as_str()), (FieldErrorType::Required, "spec.cidrs"));
        let (k, f, _) = one(json!({}));
        assert_eq!((k, f.as_str()), (FieldErrorType::Required, "spec.cidrs"));
    }

    #[test]
    fn non_canonical_cidr_names_the_canonical_form() {
        let (k, f, m) = one(json!({"cidrs": ["10.0.0.1/8"]}));
        assert_eq!((k, f.as_str()), (FieldErrorType::Invalid, "spec.cidrs[0]"));
        assert!(
            m.contains("\"10.0.0.1/8\"") && m.contains("use 10.0.0.0/8"),
            "{m}"
        );
        let (_, f, m) = one(json!({"cidrs": ["10.0.0.0/16", "FD00:0::/64"]}));
        assert_eq!(f, "spec.cidrs[1]");
        assert!(m.contains("use fd00::/64"), "{m}");
    }

    #[test]
    fn unparsable_cidr() {
        let (k, f, m) = one(json!({"cidrs": ["banana"]}));
        assert_eq!((k, f.as_str()), (FieldErrorType::Invalid, "spec.cidrs[0]"));
        assert!(m.contains("not a CIDR"), "{m}");
        let (_, _, m) = one(json!({"cidrs": ["10.0.0.0/33"]}));
        assert!(m.contains("0-32"), "{m}");
    }

    #[test]
    fn duplicates_and_families() {
        let (k, f, _) = one(json!({"cidrs": ["10.0.0.0/24", "10.0.0.0/24"]}));
        assert_eq!(
            (k, f.as_str()),
            (FieldErrorType::Duplicate, "spec.cidrs[1]")
        );
        let (k, f, m) = one(json!({"cidrs": ["10.0.0.0/24", "10.1.0.0/24"]}));
        assert_eq!((k, f.as_str()), (FieldErrorType::Invalid, "spec.cidrs[1]"));
        assert!(m.contains("at most one IPv4"), "{m}");
        let (_, f, m) = one(json!({"cidrs": ["fd00::/64", "fd01::/64"]}));
        assert_eq!(f, "spec.cidrs[1]");
        assert!(m.contains("at most one IPv6"), "{m}");
        let e = errs(json!({"cidrs": ["10.0.0.0/24", "fd00::/64", "10.2.0.0/24"]}));
        assert!(
            e.iter()
                .any(|(k, f, _)| *k == FieldErrorType::TooMany && f == "spec.cidrs"),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|(k, f, _)| *k == FieldErrorType::Invalid && f == "spec.cidrs[2]"),
            "{e:?}"
        );
    }

    #[test]
    fn prefix_bounds() {
        for (c, ok) in [
            ("10.0.0.0/7", false),
            ("10.0.0.0/8", true),
            ("10.0.0.0/30", true),
            ("10.0.0.0/31", false),
            ("10.0.0.1/32", false),
            ("fd00::/47", false),
            ("fd00::/48", true),
            ("fd00::/126", true),
            ("fd00::/127", false),
            ("fd00::/128", false),
        ] {
            let e = errs(json!({"cidrs": [c]}));
            assert_eq!(e.is_empty(), ok, "{c}: {e:?}");
            if !ok {
                assert_eq!(e[0].1, "spec.cidrs[0]");
                assert!(e[0].2.contains("prefix length must be between"), "{e:?}");
            }
        }
    }

    #[test]
    fn reserved_ranges() {
        for c in [
            "127.0.0.0/8",
            "169.254.0.0/16",
            "169.254.1.0/24",
            "224.0.0.0/8",
            "240.0.0.0/8",
            "64:ff9b::/96",
            "fe80::/64",
            "ff02::/64",
            "::/64",
        ] {
            let (k, f, m) = one(json!({"cidrs": [c]}));
            assert_eq!(
                (k, f.as_str()),
                (FieldErrorType::Invalid, "spec.cidrs[0]"),
                "{c}"
            );
            assert!(m.contains("reserved range"), "{c}: {m}");
        }
    }

    #[test]
    fn mtu_range() {
        for (spec, bad) in [
            (json!({"cidrs": ["10.0.0.0/24"], "mtu": 575}), true),
            (json!({"cidrs": ["10.0.0.0/24"], "mtu": 9001}), true),
            (json!({"cidrs": ["10.0.0.0/24"], "mtu": -1}), true),
            (json!({"cidrs": ["10.0.0.0/24"], "mtu": 1000}), false),
            (
                json!({"cidrs": ["10.0.0.0/24", "fd00::/64"], "mtu": 1000}),
                true,
            ),
            (json!({"cidrs": ["fd00::/64"], "mtu": 1279}), true),
        ] {
            let e = errs(spec.clone());
            if bad {
                assert_eq!(e.len(), 1, "{spec}: {e:?}");
                assert_eq!(
                    (e[0].0, e[0].1.as_str()),
                    (FieldErrorType::Invalid, "spec.mtu")
                );
            } else {
                assert!(e.is_empty(), "{spec}: {e:?}");
            }
        }
        let (_, _, m) = one(json!({"cidrs": ["fd00::/64"], "mtu": 1000}));
        assert!(m.contains("1280"), "{m}");
    }

    #[test]
    fn reports_every_error() {
        let e = errs(json!({"cidrs": ["10.0.0.1/24", "fd00::1/64"], "mtu": 100}));
        let fields: Vec<&str> = e.iter().map(|x| x.1.as_str()).collect();
        assert_eq!(fields, ["spec.cidrs[0]", "spec.cidrs[1]", "spec.mtu"]);
    }

    #[test]
    fn update_applies_the_same_rules() {
        let old = vpc(json!({"cidrs": ["10.0.0.0/24"]}));
        assert!(
            validate_vpc_update(&vpc(json!({"cidrs": ["10.0.0.0/23", "fd00::/64"]})), &old)
                .is_empty()
        );
        assert_eq!(
            validate_vpc_update(&vpc(json!({"cidrs": []})), &old).len(),
            1
        );
    }
}
