//! The plugin's network configuration, as the runtime passes it on stdin.
//!
//! Error codes follow the spec and libcni's skeleton:
//! not JSON / not an object / a field of the wrong JSON type → 6 (decode),
//! a version we do not speak → 1, a value that parses but is not acceptable → 7,
//! a well-known key we deliberately do not support (`ipam`) → 2.

use std::path::PathBuf;
use std::time::Duration;

use cozyplane_errors::Chain;
use serde::Deserialize;
use serde_json::Value;

use crate::env::{validate_container_id, validate_ifname};
use crate::error::{code, CniError};
use crate::types::Dns;
use crate::version::CniVersion;

/// Where the node agent listens unless `agentSocket` says otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/cozyplane/agent.sock";
/// How long ADD/DEL/CHECK/GC wait for the agent unless `agentTimeoutSeconds` says otherwise.
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest `agentTimeoutSeconds` accepted.
pub const MAX_AGENT_TIMEOUT_SECS: u64 = 600;
/// Smallest pod MTU: IPv6 needs 1280, and the pod network is dual-stack ready.
pub const MIN_MTU: u32 = 1280;
/// Largest pod MTU (an IP packet's length field).
pub const MAX_MTU: u32 = 65535;
/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// One attachment the runtime still considers valid (GC input).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, Deserialize)]
pub struct ValidAttachment {
    /// `CNI_CONTAINERID` of the ADD.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `CNI_IFNAME` of the ADD.
    pub ifname: String,
}

/// The typed view of the fields we read; everything else is ignored.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    name: Option<String>,
    #[serde(rename = "type")]
    plugin_type: Option<String>,
    cni_versions: Option<Vec<String>>,
    mtu: Option<u32>,
    agent_socket: Option<String>,
    agent_timeout_seconds: Option<u64>,
    runtime_config: Option<serde_json::Map<String, Value>>,
    dns: Option<Dns>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<ValidAttachment>>,
}

/// The parsed, validated network configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// The protocol version the runtime selected.
    pub cni_version: CniVersion,
    /// The `cniVersions` list, if the runtime passed one (informational).
    pub cni_versions: Vec<String>,
    /// The network name.
    pub name: String,
    /// The `type` (our binary's name as the runtime knows it).
    pub plugin_type: Option<String>,
    /// The pod MTU; `None` lets the agent choose (underlay MTU − 50).
    pub mtu: Option<u32>,
    /// The agent's unix socket.
    pub agent_socket: PathBuf,
    /// How long to wait for the agent.
    pub agent_timeout: Duration,
    /// Capability arguments from the runtime, passed to the agent untouched.
    pub runtime_config: Option<serde_json::Map<String, Value>>,
    /// DNS settings to report when the agent reports none.
    pub dns: Option<Dns>,
    /// The raw `prevResult`, decoded by the command that needs it.
    pub prev_result: Option<Value>,
    /// GC: the attachments that must be kept.
    pub valid_attachments: Option<Vec<ValidAttachment>>,
}

/// The `cniVersion` of a config, if it is a supported one; used to label
/// error output even when the rest of the config is bad.
pub fn sniff_version(stdin: &[u8]) -> Option<CniVersion> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    CniVersion::parse(v.get("cniVersion")?.as_str()?).ok()
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_NETWORK_CONFIG, msg)
}

/// A network name: an alphanumeric first character, then `[A-Za-z0-9_.-]`.
fn validate_network_name(name: &str) -> Result<(), CniError> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(invalid(format!("invalid network name {name:?}")).with_details(
            "a network name starts with a letter or digit, followed by letters, digits, '_', '.' or '-'",
        ))
    }
}

impl NetConf {
    /// Parses and validates the stdin bytes.
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(code::DECODING_FAILURE, "network config is not valid JSON")
                .with_details(Chain(&e).to_string())
        })?;
        let Value::Object(mut obj) = value else {
            return Err(CniError::new(
                code::DECODING_FAILURE,
                "network config must be a JSON object",
            ));
        };
        let cni_version =
            match obj.get("cniVersion") {
                None => return Err(CniError::new(
                    code::INCOMPATIBLE_VERSION,
                    "network config has no cniVersion (that means 0.1.0, which is not supported)",
                )
                .with_details(format!(
                    "supported versions: {}",
                    crate::version::supported_list()
                ))),
                Some(Value::String(s)) => CniVersion::parse(s)?,
                Some(other) => {
                    return Err(CniError::new(
                        code::DECODING_FAILURE,
                        format!("cniVersion must be a string, got {other}"),
                    ))
                }
            };
        let prev_result = obj.remove("prevResult").filter(|v| !v.is_null());
        let raw: Raw = serde_json::from_value(Value::Object(obj.clone())).map_err(|e| {
            CniError::new(code::DECODING_FAILURE, "cannot decode network config")
                .with_details(Chain(&e).to_string())
        })?;
        if let Some(ipam) = obj.get("ipam") {
            return Err(CniError::new(
                code::UNSUPPORTED_FIELD,
                format!("unsupported field \"ipam\" = {ipam}"),
            )
            .with_details("cozyplane's node agent owns IPAM; remove the ipam section"));
        }
        let name = raw
            .name
            .ok_or_else(|| invalid("network config has no name"))?;
        validate_network_name(&name)?;
        if let Some(mtu) = raw.mtu {
            if !(MIN_MTU..=MAX_MTU).contains(&mtu) {
                return Err(invalid(format!(
                    "mtu {mtu} is outside {MIN_MTU}..={MAX_MTU}"
                )));
            }
        }
        let agent_socket = match raw.agent_socket {
            None => PathBuf::from(DEFAULT_AGENT_SOCKET),
            Some(p) => {
                if !p.starts_with('/') || p.contains('\0') {
                    return Err(invalid(format!(
                        "agentSocket {p:?} must be an absolute path"
                    )));
                }
                if p.len() > MAX_SOCKET_PATH {
                    return Err(invalid(format!(
                        "agentSocket is {} bytes long; a unix socket path holds at most {MAX_SOCKET_PATH}",
                        p.len()
                    )));
                }
                PathBuf::from(p)
            }
        };
        let agent_timeout = match raw.agent_timeout_seconds {
            None => DEFAULT_AGENT_TIMEOUT,
            Some(s) if (1..=MAX_AGENT_TIMEOUT_SECS).contains(&s) => Duration::from_secs(s),
            Some(s) => {
                return Err(invalid(format!(
                    "agentTimeoutSeconds {s} is outside 1..={MAX_AGENT_TIMEOUT_SECS}"
                )))
            }
        };
        if let Some(list) = &raw.valid_attachments {
            for (i, a) in list.iter().enumerate() {
                validate_container_id(&a.container_id)
                    .and_then(|()| validate_ifname(&a.ifname))
                    .map_err(|e| {
                        invalid(format!("cni.dev/valid-attachments[{i}] is invalid"))
                            .with_details(e.msg)
                    })?;
            }
        }
        Ok(NetConf {
            cni_version,
            cni_versions: raw.cni_versions.unwrap_or_default(),
            name,
            plugin_type: raw.plugin_type,
            mtu: raw.mtu,
            agent_socket,
            agent_timeout,
            runtime_config: raw.runtime_config,
            dns: raw.dns.filter(|d| !d.is_empty()),
            prev_result,
            valid_attachments: raw.valid_attachments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NetConf, CniError> {
        NetConf::parse(s.as_bytes())
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(r#"{"cniVersion":"1.0.0","name":"cozyplane","type":"cozyplane"}"#).unwrap();
        assert_eq!(c.cni_version, CniVersion::V1_0_0);
        assert_eq!(c.name, "cozyplane");
        assert_eq!(c.plugin_type.as_deref(), Some("cozyplane"));
        assert_eq!(c.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        assert_eq!(c.agent_timeout, DEFAULT_AGENT_TIMEOUT);
        assert_eq!(c.mtu, None);
        assert_eq!(c.prev_result, None);
    }

    #[test]
    fn full_config_is_read() {
        let c = parse(
            r#"{"cniVersion":"1.1.0","cniVersions":["1.0.0","1.1.0"],"name":"net0","type":"cozyplane",
                "mtu":1450,"agentSocket":"/tmp/a.sock","agentTimeoutSeconds":5,
                "runtimeConfig":{"portMappings":[]},"dns":{"nameservers":["10.96.0.10"]},
                "prevResult":{"cniVersion":"1.1.0","ips":[]},
                "cni.dev/valid-attachments":[{"containerID":"abc","ifname":"eth0"}],
                "capabilities":{"portMappings":true},"somethingElse":1}"#,
        )
        .unwrap();
        assert_eq!(c.cni_versions, vec!["1.0.0", "1.1.0"]);
        assert_eq!(c.mtu, Some(1450));
        assert_eq!(c.agent_socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(c.agent_timeout, Duration::from_secs(5));
        assert!(c.runtime_config.unwrap().contains_key("portMappings"));
        assert_eq!(c.dns.unwrap().nameservers, vec!["10.96.0.10"]);
        assert!(c.prev_result.is_some());
        assert_eq!(
            c.valid_attachments.unwrap(),
            vec![ValidAttachment {
                container_id: "abc".into(),
                ifname: "eth0".into()
            }]
        );
    }

    #[test]
    fn error_codes_follow_the_spec() {
        let cases: &[(&str, u32, &str)] = &[
            ("", 6, "not valid JSON"),
            ("{", 6, "not valid JSON"),
            ("[1]", 6, "JSON object"),
            (r#"{"name":"n"}"#, 1, "no cniVersion"),
            (r#"{"cniVersion":"0.2.0","name":"n"}"#, 1, "incompatible"),
            (r#"{"cniVersion":"2.0.0","name":"n"}"#, 1, "incompatible"),
            (r#"{"cniVersion":1,"name":"n"}"#, 6, "must be a string"),
            (r#"{"cniVersion":"1.0.0","name":5}"#, 6, "cannot decode"),
            (
                r#"{"cniVersion":"1.0.0","name":"n","mtu":"big"}"#,
                6,
                "cannot decode",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","mtu":-1}"#,
                6,
                "cannot decode",
            ),
            (r#"{"cniVersion":"1.0.0"}"#, 7, "no name"),
            (
                r#"{"cniVersion":"1.0.0","name":"-bad"}"#,
                7,
                "invalid network name",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"a/b"}"#,
                7,
                "invalid network name",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","mtu":1000}"#,
                7,
                "mtu 1000",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","agentSocket":"rel.sock"}"#,
                7,
                "absolute",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","agentTimeoutSeconds":0}"#,
                7,
                "agentTimeoutSeconds",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"host-local"}}"#,
                2,
                "\"ipam\" = {\"type\":\"host-local\"}",
            ),
            (
                r#"{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"containerID":"-x","ifname":"eth0"}]}"#,
                7,
                "valid-attachments[0]",
            ),
        ];
        for (input, want, needle) in cases {
            let e = parse(input).expect_err(input);
            assert_eq!(e.code, *want, "{input}: {e}");
            assert!(e.msg.contains(needle), "{input}: {e}");
        }
        let long = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","agentSocket":"/{}"}}"#,
            "x".repeat(120)
        );
        assert!(parse(&long).unwrap_err().msg.contains("at most 107"));
    }

    #[test]
    fn sniff_version_only_reports_supported_versions() {
        assert_eq!(
            sniff_version(br#"{"cniVersion":"0.4.0"}"#),
            Some(CniVersion::V0_4_0)
        );
        assert_eq!(sniff_version(br#"{"cniVersion":"9.9.9"}"#), None);
        assert_eq!(sniff_version(b"junk"), None);
    }
}
