//! HostFirewall rules (`docs/policy.md`, "Host firewall").
//!
//! * `policyTypes`: `Ingress` and/or `Egress`, each at most once.
//! * Peers: `cidr` and every `except` canonical CIDRs (the error names the
//!   canonical form), each `except` inside its `cidr` and of its family.
//! * Ports: protocol `TCP`, `UDP` or `SCTP`; `port` 0..=65535 (0 or absent:
//!   every port); `endPort` needs a `port` > 0 and is at least it, at most
//!   65535. Any range length: the datapath matches ranges as a few prefixes,
//!   there is no 64-port cap.
//! * `nodeSelector`: a valid label selector.

use crate::kinds::{FieldError, FieldErrorType};
use crate::sdn::{HostFirewall, HostFirewallPeer, HostFirewallPort};
use crate::selector::selector_matches;

use super::net::parse_canonical_cidr;
use super::{decode, invalid};

/// Validate a HostFirewall (create, and the new object of an update).
pub fn validate_host_firewall(obj: &serde_json::Value) -> Vec<FieldError> {
    let fw: HostFirewall = match decode(obj) {
        Ok(f) => f,
        Err(e) => return vec![e],
    };
    let mut errs = Vec::new();
    let spec = &fw.spec;
    if let Some(sel) = &spec.node_selector {
        if let Err(e) = selector_matches(sel, &Default::default()) {
            errs.push(invalid("spec.nodeSelector", "", e));
        }
    }
    for (i, t) in spec.policy_types.iter().enumerate() {
        let field = format!("spec.policyTypes[{i}]");
        if t != "Ingress" && t != "Egress" {
            errs.push(FieldError::new(
                FieldErrorType::NotSupported,
                field,
                format!("{t:?}: supported values: \"Ingress\", \"Egress\""),
            ));
        } else if spec.policy_types[..i].contains(t) {
            errs.push(FieldError::new(
                FieldErrorType::Duplicate,
                field,
                format!("{t:?}"),
            ));
        }
    }
    for (i, r) in spec.ingress.iter().enumerate() {
        peers(&r.from, &format!("spec.ingress[{i}].from"), &mut errs);
        ports(&r.ports, &format!("spec.ingress[{i}].ports"), &mut errs);
    }
    for (i, r) in spec.egress.iter().enumerate() {
        peers(&r.to, &format!("spec.egress[{i}].to"), &mut errs);
        ports(&r.ports, &format!("spec.egress[{i}].ports"), &mut errs);
    }
    errs
}

/// Update: the same rules on the new object.
pub fn validate_host_firewall_update(
    new: &serde_json::Value,
    _old: &serde_json::Value,
) -> Vec<FieldError> {
    validate_host_firewall(new)
}

fn peers(list: &[HostFirewallPeer], at: &str, errs: &mut Vec<FieldError>) {
    for (i, p) in list.iter().enumerate() {
        let field = format!("{at}[{i}].cidr");
        let cidr = match parse_canonical_cidr(&p.cidr) {
            Ok(c) => c,
            Err(e) => {
                errs.push(invalid(field, &p.cidr, e));
                continue;
            }
        };
        for (j, e) in p.except.iter().enumerate() {
            let field = format!("{at}[{i}].except[{j}]");
            match parse_canonical_cidr(e) {
                Ok(x) if x.is_ipv6() == cidr.is_ipv6() && cidr.net().contains(&x.net()) => {}
                Ok(_) => errs.push(invalid(field, e, format!("must be inside {}", p.cidr))),
                Err(err) => errs.push(invalid(field, e, err)),
            }
        }
    }
}

fn ports(list: &[HostFirewallPort], at: &str, errs: &mut Vec<FieldError>) {
    for (i, p) in list.iter().enumerate() {
        if let Some(proto) = &p.protocol {
            if !matches!(proto.as_str(), "TCP" | "UDP" | "SCTP") {
                errs.push(FieldError::new(
                    FieldErrorType::NotSupported,
                    format!("{at}[{i}].protocol"),
                    format!("{proto:?}: supported values: \"TCP\", \"UDP\", \"SCTP\""),
                ));
            }
        }
        if let Some(port) = p.port {
            if !(0..=65535).contains(&port) {
                errs.push(invalid(
                    format!("{at}[{i}].port"),
                    &port.to_string(),
                    "must be between 0 and 65535, inclusive",
                ));
            }
        }
        if let Some(end) = p.end_port {
            let field = format!("{at}[{i}].endPort");
            match p.port {
                None | Some(0) => errs.push(invalid(field, &end.to_string(), "needs a port > 0")),
                Some(port) if end < port || end > 65535 => errs.push(invalid(
                    field,
                    &end.to_string(),
                    format!("must be between port ({port}) and 65535, inclusive"),
                )),
                Some(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fw(spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "HostFirewall",
               "metadata": {"name": "f"}, "spec": spec})
    }

    #[test]
    fn a_good_firewall_passes_with_a_range_of_any_length() {
        let errs = validate_host_firewall(&fw(json!({
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}],
                         "ports": [{"protocol": "UDP", "port": 1, "endPort": 65535}]}],
            "egress": [{"to": [{"cidr": "2001:db8::/32"}], "ports": [{"port": 443}]}]
        })));
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn every_bad_field_is_named() {
        let errs = validate_host_firewall(&fw(json!({
            "policyTypes": ["Ingress", "Sideways", "Ingress"],
            "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Between"}]},
            "ingress": [{"from": [{"cidr": "10.0.0.1/8", "except": ["192.168.0.0/16"]}],
                         "ports": [{"protocol": "ICMP", "port": 70000},
                                   {"port": 100, "endPort": 99},
                                   {"endPort": 5}]}]
        })));
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.nodeSelector",
                "spec.policyTypes[1]",
                "spec.policyTypes[2]",
                "spec.ingress[0].from[0].cidr",
                "spec.ingress[0].ports[0].protocol",
                "spec.ingress[0].ports[0].port",
                "spec.ingress[0].ports[1].endPort",
                "spec.ingress[0].ports[2].endPort",
            ],
            "{errs:?}"
        );
        let errs = validate_host_firewall(&fw(json!({
            "ingress": [{"from": [{"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16", "::/0"]}]}]
        })));
        assert_eq!(errs.len(), 2, "{errs:?}");
    }
}
