//! Rendering the neutral result for the runtime's cniVersion, and reading a
//! `prevResult` of any supported version back.
//!
//! | field                              | 0.3.x/0.4.0 | 1.0.0 | 1.1.0 |
//! |------------------------------------|-------------|-------|-------|
//! | `ips[].version` ("4"/"6")          | yes         | no    | no    |
//! | `interfaces[].mtu/socketPath/pciID`| no          | no    | yes   |
//! | `routes[].mtu/advmss/priority/table/scope` | no  | no    | yes   |
//!
//! Fields a version does not define are dropped rather than passed through:
//! containerd 1.6 parses 1.0.0 results and we promise it exactly 1.0.0.

use serde_json::{json, Map, Value};

use crate::error::{code, CniError};
use crate::types::{AttachmentResult, Interface, IpConfig, Route};
use crate::version::CniVersion;

/// The ADD success JSON for `version`.
pub fn encode(result: &AttachmentResult, version: CniVersion) -> Value {
    let mut out = Map::new();
    out.insert("cniVersion".into(), version.as_str().into());
    if !result.interfaces.is_empty() {
        out.insert(
            "interfaces".into(),
            result
                .interfaces
                .iter()
                .map(|i| encode_interface(i, version))
                .collect(),
        );
    }
    if !result.ips.is_empty() {
        out.insert(
            "ips".into(),
            result.ips.iter().map(|ip| encode_ip(ip, version)).collect(),
        );
    }
    if !result.routes.is_empty() {
        out.insert(
            "routes".into(),
            result
                .routes
                .iter()
                .map(|r| encode_route(r, version))
                .collect(),
        );
    }
    // libcni always prints "dns" (possibly `{}`); so do we, for byte-for-byte
    // familiarity in runtime caches.
    out.insert(
        "dns".into(),
        serde_json::to_value(&result.dns).unwrap_or_else(|_| json!({})),
    );
    Value::Object(out)
}

fn encode_interface(i: &Interface, version: CniVersion) -> Value {
    let mut o = Map::new();
    o.insert("name".into(), i.name.clone().into());
    if let Some(mac) = &i.mac {
        o.insert("mac".into(), mac.clone().into());
    }
    if version >= CniVersion::V1_1_0 {
        if let Some(mtu) = i.mtu {
            o.insert("mtu".into(), mtu.into());
        }
    }
    if let Some(sandbox) = &i.sandbox {
        o.insert("sandbox".into(), sandbox.clone().into());
    }
    if version >= CniVersion::V1_1_0 {
        if let Some(p) = &i.socket_path {
            o.insert("socketPath".into(), p.clone().into());
        }
        if let Some(p) = &i.pci_id {
            o.insert("pciID".into(), p.clone().into());
        }
    }
    Value::Object(o)
}

fn encode_ip(ip: &IpConfig, version: CniVersion) -> Value {
    let mut o = Map::new();
    if version.has_ip_version_field() {
        let family = if ip.address.addr().is_ipv4() {
            "4"
        } else {
            "6"
        };
        o.insert("version".into(), family.into());
    }
    o.insert("address".into(), ip.address.to_string().into());
    if let Some(gw) = ip.gateway {
        o.insert("gateway".into(), gw.to_string().into());
    }
    if let Some(index) = ip.interface {
        o.insert("interface".into(), index.into());
    }
    Value::Object(o)
}

fn encode_route(r: &Route, version: CniVersion) -> Value {
    let mut o = Map::new();
    o.insert("dst".into(), r.dst.to_string().into());
    if let Some(gw) = r.gw {
        o.insert("gw".into(), gw.to_string().into());
    }
    if version >= CniVersion::V1_1_0 {
        let extras = [
            ("mtu", r.mtu),
            ("advmss", r.advmss),
            ("priority", r.priority),
            ("table", r.table),
            ("scope", r.scope.map(u32::from)),
        ];
        for (k, v) in extras {
            if let Some(v) = v {
                o.insert(k.into(), v.into());
            }
        }
    }
    Value::Object(o)
}

/// Parses a `prevResult` of any supported version into the neutral form.
///
/// `ips[].version` (pre-1.0) is accepted and checked against the address;
/// fields newer than the result's version are accepted as-is.
pub fn decode_prev_result(v: &Value) -> Result<AttachmentResult, CniError> {
    let bad = |details: String| {
        CniError::new(code::INVALID_NETWORK_CONFIG, "invalid prevResult").with_details(details)
    };
    if !v.is_object() {
        return Err(bad("prevResult must be a JSON object".into()));
    }
    if let Some(ips) = v.get("ips").and_then(Value::as_array) {
        for (i, ip) in ips.iter().enumerate() {
            let Some(family) = ip.get("version") else {
                continue;
            };
            let addr = ip.get("address").and_then(Value::as_str).unwrap_or("");
            let is_v4 = addr.split('/').next().is_some_and(|a| a.contains('.'));
            let ok = matches!(
                (family.as_str(), is_v4),
                (Some("4"), true) | (Some("6"), false)
            );
            if !ok {
                return Err(bad(format!(
                    "ips[{i}].version {family} does not match address {addr:?}"
                )));
            }
        }
    }
    let result: AttachmentResult =
        serde_json::from_value(v.clone()).map_err(|e| bad(e.to_string()))?;
    result.validate().map_err(|e| bad(e.to_string()))?;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Dns;

    /// What the agent returns for a dual-stack pod with every 1.1 extra set.
    fn sample() -> AttachmentResult {
        AttachmentResult {
            interfaces: vec![
                Interface {
                    name: "cph0123456789a".into(),
                    mac: Some("02:00:00:00:00:01".into()),
                    mtu: Some(1450),
                    ..Default::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("0a:58:0a:f4:00:05".into()),
                    mtu: Some(1450),
                    sandbox: Some("/var/run/netns/cni-1".into()),
                    socket_path: Some("/run/x.sock".into()),
                    pci_id: Some("0000:00:01.0".into()),
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.244.0.5/32".parse().unwrap(),
                    gateway: Some("169.254.1.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00:10:244::5/128".parse().unwrap(),
                    gateway: Some("fe80::1".parse().unwrap()),
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("169.254.1.1".parse().unwrap()),
                mtu: Some(1400),
                advmss: Some(1360),
                priority: Some(10),
                table: Some(254),
                scope: Some(0),
            }],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                search: vec!["svc.cluster.local".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn encodes_1_1_0_with_every_extra() {
        assert_eq!(
            encode(&sample(), CniVersion::V1_1_0),
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "cph0123456789a", "mac": "02:00:00:00:00:01", "mtu": 1450},
                    {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "mtu": 1450,
                     "sandbox": "/var/run/netns/cni-1", "socketPath": "/run/x.sock",
                     "pciID": "0000:00:01.0"}
                ],
                "ips": [
                    {"address": "10.244.0.5/32", "gateway": "169.254.1.1", "interface": 1},
                    {"address": "fd00:10:244::5/128", "gateway": "fe80::1", "interface": 1}
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "169.254.1.1", "mtu": 1400, "advmss": 1360,
                     "priority": 10, "table": 254, "scope": 0}
                ],
                "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
            })
        );
    }

    #[test]
    fn encodes_1_0_0_without_1_1_extras_or_ip_version() {
        assert_eq!(
            encode(&sample(), CniVersion::V1_0_0),
            json!({
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "cph0123456789a", "mac": "02:00:00:00:00:01"},
                    {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/cni-1"}
                ],
                "ips": [
                    {"address": "10.244.0.5/32", "gateway": "169.254.1.1", "interface": 1},
                    {"address": "fd00:10:244::5/128", "gateway": "fe80::1", "interface": 1}
                ],
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
            })
        );
    }

    #[test]
    fn encodes_0_4_0_and_0_3_x_with_ip_version() {
        for v in [CniVersion::V0_4_0, CniVersion::V0_3_1, CniVersion::V0_3_0] {
            assert_eq!(
                encode(&sample(), v),
                json!({
                    "cniVersion": v.as_str(),
                    "interfaces": [
                        {"name": "cph0123456789a", "mac": "02:00:00:00:00:01"},
                        {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/cni-1"}
                    ],
                    "ips": [
                        {"version": "4", "address": "10.244.0.5/32", "gateway": "169.254.1.1", "interface": 1},
                        {"version": "6", "address": "fd00:10:244::5/128", "gateway": "fe80::1", "interface": 1}
                    ],
                    "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                    "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
                }),
                "{v}"
            );
        }
    }

    #[test]
    fn exact_bytes_for_a_minimal_1_0_0_result() {
        let r = AttachmentResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                sandbox: Some("/run/netns/p".into()),
                ..Default::default()
            }],
            ips: vec![IpConfig {
                address: "10.0.0.2/32".parse().unwrap(),
                gateway: None,
                interface: Some(0),
            }],
            ..Default::default()
        };
        // serde_json's map is ordered by key, so the bytes are stable
        assert_eq!(
            encode(&r, CniVersion::V1_0_0).to_string(),
            r#"{"cniVersion":"1.0.0","dns":{},"interfaces":[{"name":"eth0","sandbox":"/run/netns/p"}],"ips":[{"address":"10.0.0.2/32","interface":0}]}"#
        );
    }

    #[test]
    fn every_encoding_decodes_back_to_what_that_version_can_hold() {
        for v in crate::version::SUPPORTED {
            let decoded = decode_prev_result(&encode(&sample(), v)).unwrap();
            if v == CniVersion::V1_1_0 {
                assert_eq!(decoded, sample());
            } else {
                assert_eq!(decoded.ips, sample().ips, "{v}");
                assert_eq!(decoded.interfaces[1].mtu, None, "{v}");
                assert_eq!(decoded.routes[0].mtu, None, "{v}");
            }
        }
    }

    #[test]
    fn prev_result_errors_name_the_problem() {
        let cases = [
            (json!([]), "must be a JSON object"),
            (json!({"ips": [{"address": "10.0.0.1"}]}), "invalid CIDR"),
            (
                json!({"ips": [{"version": "6", "address": "10.0.0.1/32"}]}),
                "does not match",
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/32", "interface": 3}]}),
                "only 0 interfaces",
            ),
            (json!({"interfaces": [{"name": 5}]}), "invalid type"),
        ];
        for (input, needle) in cases {
            let e = decode_prev_result(&input).expect_err(needle);
            assert_eq!(e.code, code::INVALID_NETWORK_CONFIG);
            assert!(e.details.contains(needle), "{needle}: {}", e.details);
        }
        // an empty object is a valid (empty) result: DEL may see one
        assert_eq!(
            decode_prev_result(&json!({})),
            Ok(AttachmentResult::default())
        );
    }
}
