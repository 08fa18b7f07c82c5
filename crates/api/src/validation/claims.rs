//! Rules for the name-is-the-claim kinds: Port, ServiceVIP, FabricIP and VNIClaim.
//!
//! The object name must be exactly the claim name of the address in the spec
//! (see [`crate::names`]): otherwise two objects could hold the same address
//! under different names and the store's name uniqueness would no longer make
//! allocation atomic. For the same reason the address (and, for VPC claims, the
//! VPC reference) is immutable: re-pointing a claim would silently move an
//! address between owners.

use std::net::IpAddr;

use serde_json::Value;

use crate::kinds::{FieldError, FieldErrorType};
use crate::local::FabricIP;
use crate::names::{
    fabric_ip_name, parse_fabric_ip_name, parse_port_name, parse_service_vip_name,
    parse_vni_claim_name, port_name, service_vip_name, NameError, FIRST_VPC_VNI, MAX_VNI,
};
use crate::sdn::{Port, ServiceVIP, VNIClaim, VPCRef};

use super::net::{check_not_ipv4_alias, parse_canonical_ip};
use super::{decode, immutable, invalid};

/// Check an address field: canonical text, and not an IPv4 alias.
fn check_ip(field: &str, s: &str, errs: &mut Vec<FieldError>) -> Option<IpAddr> {
    if s.is_empty() {
        errs.push(FieldError::new(
            FieldErrorType::Required,
            field,
            "Required value",
        ));
        return None;
    }
    match parse_canonical_ip(s).and_then(|ip| check_not_ipv4_alias(ip).map(|()| ip)) {
        Ok(ip) => Some(ip),
        Err(e) => {
            errs.push(invalid(field, s, e));
            None
        }
    }
}

/// A cluster-scoped VPC claim must name its VPC fully.
fn check_vpc_ref(r: &VPCRef, errs: &mut Vec<FieldError>) {
    if r.namespace.as_deref().unwrap_or("").is_empty() {
        errs.push(FieldError::new(
            FieldErrorType::Required,
            "spec.vpcRef.namespace",
            "Required value",
        ));
    }
    if r.name.is_empty() {
        errs.push(FieldError::new(
            FieldErrorType::Required,
            "spec.vpcRef.name",
            "Required value",
        ));
    }
}

/// Shared body of the Port and ServiceVIP rules.
fn check_vpc_claim(
    name: Option<&str>,
    vpc_ref: &VPCRef,
    ip: &str,
    pattern: &str,
    parse: fn(&str) -> Result<(u32, IpAddr), NameError>,
    build: fn(u32, IpAddr) -> String,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    check_vpc_ref(vpc_ref, &mut errs);
    let spec_ip = check_ip("spec.ip", ip, &mut errs);
    match name {
        None | Some("") => errs.push(FieldError::new(
            FieldErrorType::Required,
            "metadata.name",
            "Required value",
        )),
        Some(name) => match parse(name) {
            Err(e) => errs.push(invalid(
                "metadata.name",
                name,
                format!("must be the claim name {pattern}: {e}"),
            )),
            Ok((vni, name_ip)) => {
                if let Some(spec_ip) = spec_ip {
                    if spec_ip != name_ip {
                        let want = build(vni, spec_ip);
                        errs.push(invalid(
                            "metadata.name",
                            name,
                            format!("must be the claim name of spec.ip {ip:?}: {want:?} (or another VNI)"),
                        ));
                    }
                }
            }
        },
    }
    errs
}

/// Validate a Port.
pub fn validate_port(obj: &Value) -> Vec<FieldError> {
    match decode::<Port>(obj) {
        Err(e) => vec![e],
        Ok(p) => check_vpc_claim(
            p.metadata.name.as_deref(),
            &p.spec.vpc_ref,
            &p.spec.ip,
            "v<vni>.<escaped ip>",
            parse_port_name,
            port_name,
        ),
    }
}

/// Validate a Port update: all create rules, plus `spec.ip` and `spec.vpcRef` immutable.
pub fn validate_port_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = validate_port(new);
    if let (Ok(n), Ok(o)) = (decode::<Port>(new), decode::<Port>(old)) {
        immutable_vpc_claim(
            &n.spec.ip,
            &o.spec.ip,
            &n.spec.vpc_ref,
            &o.spec.vpc_ref,
            &mut errs,
        );
    }
    errs
}

fn immutable_vpc_claim(
    new_ip: &str,
    old_ip: &str,
    new_ref: &VPCRef,
    old_ref: &VPCRef,
    errs: &mut Vec<FieldError>,
) {
    if new_ip != old_ip {
        errs.push(immutable("spec.ip", new_ip));
    }
    if new_ref != old_ref {
        let shown = format!(
            "{}/{}",
            new_ref.namespace.as_deref().unwrap_or(""),
            new_ref.name
        );
        errs.push(immutable("spec.vpcRef", &shown));
    }
}

/// Validate a ServiceVIP (the mirror of the Port rules with the `sv` claim).
pub fn validate_service_vip(obj: &Value) -> Vec<FieldError> {
    match decode::<ServiceVIP>(obj) {
        Err(e) => vec![e],
        Ok(s) => check_vpc_claim(
            s.metadata.name.as_deref(),
            &s.spec.vpc_ref,
            &s.spec.ip,
            "sv<vni>.<escaped ip>",
            parse_service_vip_name,
            service_vip_name,
        ),
    }
}

/// Validate a ServiceVIP update: all create rules, plus `spec.ip` and `spec.vpcRef` immutable.
pub fn validate_service_vip_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = validate_service_vip(new);
    if let (Ok(n), Ok(o)) = (decode::<ServiceVIP>(new), decode::<ServiceVIP>(old)) {
        immutable_vpc_claim(
            &n.spec.ip,
            &o.spec.ip,
            &n.spec.vpc_ref,
            &o.spec.vpc_ref,
            &mut errs,
        );
    }
    errs
}

/// Validate a FabricIP: name is `f-<escaped spec.address>`, address canonical.
pub fn validate_fabric_ip(obj: &Value) -> Vec<FieldError> {
    let f = match decode::<FabricIP>(obj) {
        Err(e) => return vec![e],
        Ok(f) => f,
    };
    let mut errs = Vec::new();
    let addr = check_ip("spec.address", &f.spec.address, &mut errs);
    match f.metadata.name.as_deref() {
        None | Some("") => errs.push(FieldError::new(
            FieldErrorType::Required,
            "metadata.name",
            "Required value",
        )),
        Some(name) => match parse_fabric_ip_name(name) {
            Err(e) => errs.push(invalid(
                "metadata.name",
                name,
                format!("must be the claim name f-<escaped address>: {e}"),
            )),
            Ok(name_ip) => {
                if let Some(addr) = addr {
                    if addr != name_ip {
                        let want = fabric_ip_name(addr);
                        errs.push(invalid(
                            "metadata.name",
                            name,
                            format!("must be the claim name of spec.address: {want:?}"),
                        ));
                    }
                }
            }
        },
    }
    errs
}

/// Validate a FabricIP update: all create rules, plus `spec.address` immutable.
pub fn validate_fabric_ip_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = validate_fabric_ip(new);
    if let (Ok(n), Ok(o)) = (decode::<FabricIP>(new), decode::<FabricIP>(old)) {
        if n.spec.address != o.spec.address {
            errs.push(immutable("spec.address", &n.spec.address));
        }
    }
    errs
}

/// Validate a VNIClaim: the name is `vni-<vni>` with a VPC VNI
/// ([`FIRST_VPC_VNI`] to [`MAX_VNI`]), and the VPC is named fully, with its UID.
pub fn validate_vni_claim(obj: &Value) -> Vec<FieldError> {
    let c = match decode::<VNIClaim>(obj) {
        Err(e) => return vec![e],
        Ok(c) => c,
    };
    let mut errs = Vec::new();
    let required = |field: &str| FieldError::new(FieldErrorType::Required, field, "Required value");
    match c.metadata.name.as_deref() {
        None | Some("") => errs.push(required("metadata.name")),
        Some(name) => {
            if let Err(e) = parse_vni_claim_name(name) {
                errs.push(invalid(
                    "metadata.name",
                    name,
                    format!("must be the claim name vni-<vni>, {FIRST_VPC_VNI} <= vni <= {MAX_VNI}: {e}"),
                ));
            }
        }
    }
    for (field, v) in [
        ("spec.vpcRef.namespace", &c.spec.vpc_ref.namespace),
        ("spec.vpcRef.name", &c.spec.vpc_ref.name),
        ("spec.vpcUID", &c.spec.vpc_uid),
    ] {
        if v.is_empty() {
            errs.push(required(field));
        }
    }
    errs
}

/// Validate a VNIClaim update: all create rules, and the spec is immutable (a
/// claim never moves to another VPC; it is deleted and made anew).
pub fn validate_vni_claim_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = validate_vni_claim(new);
    if new.get("spec") != old.get("spec") {
        errs.push(immutable(
            "spec",
            &new.get("spec").map(Value::to_string).unwrap_or_default(),
        ));
    }
    errs
}

#[cfg(test)]
mod tests {

    #[test]
    fn vni_claims_name_their_vni_and_their_vpc_fully_and_never_move() {
        let claim = |name: &str, ns: &str, vpc: &str, uid: &str| {
            serde_json::json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VNIClaim",
                "metadata": {"name": name},
                "spec": {"vpcRef": {"namespace": ns, "name": vpc}, "vpcUID": uid}})
        };
        let ok = claim("vni-100", "t1", "blue", "u-1");
        assert_eq!(validate_vni_claim(&ok), vec![]);
        let fields = |errs: Vec<FieldError>| errs.into_iter().map(|e| e.field).collect::<Vec<_>>();
        assert_eq!(
            fields(validate_vni_claim(&claim("vni-7", "t1", "blue", "u-1"))),
            ["metadata.name"]
        );
        assert_eq!(
            fields(validate_vni_claim(&claim("blue", "t1", "blue", "u-1"))),
            ["metadata.name"]
        );
        assert_eq!(
            fields(validate_vni_claim(&claim("vni-100", "", "", ""))),
            ["spec.vpcRef.namespace", "spec.vpcRef.name", "spec.vpcUID"]
        );
        assert_eq!(validate_vni_claim_update(&ok, &ok), vec![]);
        assert_eq!(
            fields(validate_vni_claim_update(
                &claim("vni-100", "t2", "blue", "u-9"),
                &ok
            )),
            ["spec"]
        );
    }

    use super::*;
    use serde_json::json;

    fn port(name: &str, ip: &str) -> Value {
        json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port", "metadata": {"name": name},
               "spec": {"vpcRef": {"namespace": "tenant-a", "name": "blue"}, "ip": ip, "node": "n1"}})
    }

    fn summary(e: Vec<FieldError>) -> Vec<(FieldErrorType, String)> {
        e.into_iter().map(|e| (e.kind, e.field)).collect()
    }

    #[test]
    fn valid_ports() {
        for (n, ip) in [
            ("v100.10.0.0.5", "10.0.0.5"),
            ("v1.fd00--5", "fd00::5"),
            ("v8388607.2001-db8--1-0-0-1", "2001:db8::1:0:0:1"),
        ] {
            assert_eq!(validate_port(&port(n, ip)), vec![], "{n}");
        }
    }

    #[test]
    fn port_name_must_be_the_claim_of_spec_ip() {
        let e = validate_port(&port("v100.10.0.0.6", "10.0.0.5"));
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "metadata.name".to_string())]
        );
        assert!(
            e[0].message.contains("\"v100.10.0.0.5\""),
            "{}",
            e[0].message
        );
        for bad in [
            "web-1",
            "v0.10.0.0.5",
            "v100.10.0.0.05",
            "v100.10-0-0-5",
            "sv100.10.0.0.5",
        ] {
            let e = validate_port(&port(bad, "10.0.0.5"));
            assert_eq!(
                summary(e.clone()),
                [(FieldErrorType::Invalid, "metadata.name".to_string())],
                "{bad}"
            );
            assert!(
                e[0].message.contains("v<vni>.<escaped ip>"),
                "{}",
                e[0].message
            );
        }
        let mut nameless = port("x", "10.0.0.5");
        nameless["metadata"] = json!({});
        assert_eq!(
            summary(validate_port(&nameless)),
            [(FieldErrorType::Required, "metadata.name".to_string())]
        );
    }

    #[test]
    fn port_ip_must_be_canonical() {
        let e = validate_port(&port("v100.fd00--5", "fd00:0::5"));
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "spec.ip".to_string())]
        );
        assert!(e[0].message.contains("use fd00::5"), "{}", e[0].message);
        let e = validate_port(&port("v100.0--ffff-a00-5", "::ffff:10.0.0.5"));
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "spec.ip".to_string())]
        );
        assert!(e[0].message.contains("IPv4-mapped"), "{}", e[0].message);
        let e = validate_port(&port("v100.10.0.0.5", "not-an-ip"));
        assert_eq!(
            summary(e),
            [(FieldErrorType::Invalid, "spec.ip".to_string())]
        );
        let e = validate_port(&port("v100.10.0.0.5", ""));
        assert_eq!(
            summary(e),
            [(FieldErrorType::Required, "spec.ip".to_string())]
        );
    }

    #[test]
    fn port_vpc_ref_must_be_complete() {
        let mut p = port("v100.10.0.0.5", "10.0.0.5");
        p["spec"]["vpcRef"] = json!({"name": ""});
        assert_eq!(
            summary(validate_port(&p)),
            [
                (
                    FieldErrorType::Required,
                    "spec.vpcRef.namespace".to_string()
                ),
                (FieldErrorType::Required, "spec.vpcRef.name".to_string())
            ]
        );
        p["spec"]["vpcRef"] = json!("blue");
        assert_eq!(
            summary(validate_port(&p)),
            [(FieldErrorType::Invalid, "spec.vpcRef".to_string())]
        );
    }

    #[test]
    fn port_update_immutability() {
        let old = port("v100.10.0.0.5", "10.0.0.5");
        let mut same = old.clone();
        same["spec"]["node"] = json!("n2");
        same["metadata"]["labels"] = json!({"a": "b"});
        assert_eq!(validate_port_update(&same, &old), vec![]);

        let moved = port("v100.10.0.0.6", "10.0.0.6");
        let e = validate_port_update(&moved, &old);
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "spec.ip".to_string())]
        );
        assert!(
            e[0].message.ends_with("field is immutable"),
            "{}",
            e[0].message
        );

        let mut rehomed = old.clone();
        rehomed["spec"]["vpcRef"]["name"] = json!("red");
        let e = validate_port_update(&rehomed, &old);
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "spec.vpcRef".to_string())]
        );
        assert!(
            e[0].message.contains("tenant-a/red") && e[0].message.contains("immutable"),
            "{}",
            e[0].message
        );
    }

    fn vip(name: &str, ip: &str) -> Value {
        json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "ServiceVIP", "metadata": {"name": name},
               "spec": {"vpcRef": {"namespace": "tenant-a", "name": "blue"}, "ip": ip,
                        "serviceRef": {"namespace": "tenant-a", "name": "web"}, "ports": [{"port": 80, "protocol": "TCP"}]}})
    }

    #[test]
    fn service_vip_mirrors_port() {
        assert_eq!(
            validate_service_vip(&vip("sv100.10.0.0.9", "10.0.0.9")),
            vec![]
        );
        assert_eq!(
            summary(validate_service_vip(&vip("v100.10.0.0.9", "10.0.0.9"))),
            [(FieldErrorType::Invalid, "metadata.name".to_string())]
        );
        assert_eq!(
            summary(validate_service_vip(&vip("sv100.10.0.0.8", "10.0.0.9"))),
            [(FieldErrorType::Invalid, "metadata.name".to_string())]
        );
        let old = vip("sv100.10.0.0.9", "10.0.0.9");
        assert_eq!(
            summary(validate_service_vip_update(
                &vip("sv100.10.0.0.8", "10.0.0.8"),
                &old
            )),
            [(FieldErrorType::Invalid, "spec.ip".to_string())]
        );
    }

    fn fip(name: &str, addr: &str) -> Value {
        json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "FabricIP", "metadata": {"name": name},
               "spec": {"address": addr, "node": "n1", "podNamespace": "default", "podName": "p", "podUID": "u-1"}})
    }

    #[test]
    fn fabric_ip_rules() {
        assert_eq!(
            validate_fabric_ip(&fip("f-10-244-0-7", "10.244.0.7")),
            vec![]
        );
        assert_eq!(
            validate_fabric_ip(&fip("f-fd00-10--7", "fd00:10::7")),
            vec![]
        );
        let e = validate_fabric_ip(&fip("f-10-244-0-8", "10.244.0.7"));
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "metadata.name".to_string())]
        );
        assert!(
            e[0].message.contains("\"f-10-244-0-7\""),
            "{}",
            e[0].message
        );
        let e = validate_fabric_ip(&fip("pod-ip", "10.244.0.7"));
        assert_eq!(
            summary(e),
            [(FieldErrorType::Invalid, "metadata.name".to_string())]
        );
        let e = validate_fabric_ip(&fip("f-fd00-10--7", "FD00:10::7"));
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "spec.address".to_string())]
        );
        assert!(e[0].message.contains("use fd00:10::7"), "{}", e[0].message);
        let e = validate_fabric_ip(&fip("f-0--ffff-af4-7", "::ffff:10.244.0.7"));
        assert_eq!(
            summary(e),
            [(FieldErrorType::Invalid, "spec.address".to_string())]
        );
        let mut missing = fip("f-10-244-0-7", "10.244.0.7");
        missing["spec"].as_object_mut().map(|m| m.remove("address"));
        assert_eq!(
            summary(validate_fabric_ip(&missing)),
            [(FieldErrorType::Required, "spec.address".to_string())]
        );
    }

    #[test]
    fn fabric_ip_address_immutable() {
        let old = fip("f-10-244-0-7", "10.244.0.7");
        let mut relabeled = old.clone();
        relabeled["spec"]["node"] = json!("n2");
        assert_eq!(validate_fabric_ip_update(&relabeled, &old), vec![]);
        let e = validate_fabric_ip_update(&fip("f-10-244-0-8", "10.244.0.8"), &old);
        assert_eq!(
            summary(e.clone()),
            [(FieldErrorType::Invalid, "spec.address".to_string())]
        );
        assert!(e[0].message.contains("field is immutable"));
    }
}
