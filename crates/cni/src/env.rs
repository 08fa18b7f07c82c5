//! The invocation environment: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`.
//!
//! Every problem here is code 4 ("invalid necessary environment variables")
//! and the message names the variable, as the spec requires.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cozyplane_errors::Chain;

use crate::error::{code, CniError};

/// The operation requested by `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach the container.
    Add,
    /// Detach the container (idempotent, best-effort).
    Del,
    /// Verify an attachment.
    Check,
    /// Report readiness (1.1.0).
    Status,
    /// Remove resources of attachments no longer valid (1.1.0).
    Gc,
    /// Report supported versions.
    Version,
}

impl Command {
    /// Parses `CNI_COMMAND`.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::new(
                    code::INVALID_ENVIRONMENT,
                    format!("unknown CNI_COMMAND {other:?}"),
                )
                .with_details("CNI_COMMAND must be ADD, DEL, CHECK, STATUS, GC or VERSION"))
            }
        })
    }

    /// Whether the command names one attachment (container id + ifname).
    fn needs_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }

    /// Whether the command needs `CNI_NETNS`.
    fn needs_netns(self) -> bool {
        matches!(self, Command::Add | Command::Check)
    }
}

/// The pod a sandbox belongs to, from `CNI_ARGS` (Kubernetes runtimes set it).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodIdentity {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_UID`, when the runtime passes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`, when the runtime passes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infra_container_id: Option<String>,
}

/// Parsed `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `IgnoreUnknown=1|true`: unknown keys are tolerated.
    pub ignore_unknown: bool,
    /// The pod, when namespace and name are both present.
    pub pod: Option<PodIdentity>,
}

fn bad_args(msg: impl Into<String>) -> CniError {
    CniError::new(
        code::INVALID_ENVIRONMENT,
        format!("invalid CNI_ARGS: {}", msg.into()),
    )
}

/// A DNS-1123 label: Kubernetes namespace names.
fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 subdomain: Kubernetes object names such as pods.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A pod UID: Kubernetes writes a UUID; we accept any short `[A-Za-z0-9-]` token.
fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
}

impl CniArgs {
    /// Parses `K=V;K=V`. Unknown keys are an error unless `IgnoreUnknown` is
    /// true (wherever it appears); a repeated key is always an error, since
    /// two pod names for one sandbox cannot both be right.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for part in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad_args(format!("{part:?} is not KEY=VALUE")))?;
            if k.is_empty() || v.contains('=') {
                return Err(bad_args(format!("{part:?} is not KEY=VALUE")));
            }
            if pairs.iter().any(|(seen, _)| *seen == k) {
                return Err(bad_args(format!("key {k:?} appears twice")));
            }
            pairs.push((k, v));
        }
        let mut out = CniArgs::default();
        if let Some((_, v)) = pairs.iter().find(|(k, _)| *k == "IgnoreUnknown") {
            out.ignore_unknown = match v.to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => return Err(bad_args(format!("IgnoreUnknown={v:?} is not a boolean"))),
            };
        }
        let (mut ns, mut name, mut uid, mut infra) = (None, None, None, None);
        for (k, v) in pairs {
            // an empty value means "not given"
            let v = (!v.is_empty()).then(|| v.to_owned());
            match k {
                "IgnoreUnknown" => {}
                "K8S_POD_NAMESPACE" => ns = v,
                "K8S_POD_NAME" => name = v,
                "K8S_POD_UID" => uid = v,
                "K8S_POD_INFRA_CONTAINER_ID" => infra = v,
                // runtimes pass keys meant for other plugins in the chain
                _ if out.ignore_unknown => {}
                other => {
                    return Err(bad_args(format!(
                        "unknown key {other:?} (set IgnoreUnknown=1 to allow it)"
                    )))
                }
            }
        }
        if let Some(ns) = &ns {
            if !is_dns1123_label(ns) {
                return Err(bad_args(format!(
                    "K8S_POD_NAMESPACE {ns:?} is not a namespace name"
                )));
            }
        }
        if let Some(name) = &name {
            if !is_dns1123_subdomain(name) {
                return Err(bad_args(format!("K8S_POD_NAME {name:?} is not a pod name")));
            }
        }
        if let Some(uid) = &uid {
            if !is_uid(uid) {
                return Err(bad_args(format!("K8S_POD_UID {uid:?} is not a UID")));
            }
        }
        if let Some(id) = &infra {
            validate_container_id(id).map_err(|_| {
                bad_args(format!(
                    "K8S_POD_INFRA_CONTAINER_ID {id:?} is not a container id"
                ))
            })?;
        }
        out.pod = match (ns, name) {
            (Some(namespace), Some(name)) => Some(PodIdentity {
                namespace,
                name,
                uid,
                infra_container_id: infra,
            }),
            (None, None) if uid.is_none() => None,
            _ => {
                return Err(bad_args(
                    "K8S_POD_NAMESPACE and K8S_POD_NAME must be given together (and K8S_POD_UID only with them)",
                ))
            }
        };
        Ok(out)
    }
}

/// Checks `CNI_CONTAINERID` syntax: an alphanumeric first character, then
/// `[A-Za-z0-9_.-]`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if first_ok
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && id.len() <= 1024
    {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("invalid CNI_CONTAINERID {id:?}"),
        )
        .with_details("a container id starts with a letter or digit, followed by letters, digits, '_', '.' or '-'"))
    }
}

/// Checks `CNI_IFNAME` against Linux's rules: 1–15 bytes, not `.`/`..`, no
/// `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let problem = if name.is_empty() {
        Some("is empty")
    } else if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("must not be '.' or '..'")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("must not contain '/', ':' or whitespace")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("invalid CNI_IFNAME {name:?}: {p}"),
        )),
    }
}

/// The parsed environment for one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID` (ADD, DEL, CHECK).
    pub container_id: Option<String>,
    /// `CNI_NETNS`; empty counts as absent (containerd's second DEL sends it empty).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (ADD, DEL, CHECK).
    pub ifname: Option<String>,
    /// `CNI_ARGS` as given (parsed by the command, since DEL is lenient).
    pub args: Option<String>,
    /// `CNI_PATH`; we delegate to nothing, so it is only recorded.
    pub path: Option<String>,
}

/// Reads one variable: `Ok(None)` when unset or empty; an error when not UTF-8.
pub type Getenv<'a> = &'a dyn Fn(&str) -> Result<Option<String>, CniError>;

/// Reads a variable from the process environment.
pub fn process_getenv(name: &str) -> Result<Option<String>, CniError> {
    match std::env::var(name) {
        Ok(s) if s.is_empty() => Ok(None),
        Ok(s) => Ok(Some(s)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("{name} is not valid UTF-8"),
        )),
    }
}

impl Env {
    /// Reads and validates the variables the command needs; all missing
    /// required variables are named in one error.
    pub fn from_getenv(getenv: Getenv<'_>) -> Result<Self, CniError> {
        let command = match getenv("CNI_COMMAND")? {
            Some(c) => Command::parse(&c)?,
            None => {
                return Err(CniError::new(
                    code::INVALID_ENVIRONMENT,
                    "required env variables [CNI_COMMAND] missing",
                ))
            }
        };
        let container_id = getenv("CNI_CONTAINERID")?;
        let netns = getenv("CNI_NETNS")?;
        let ifname = getenv("CNI_IFNAME")?;
        let mut missing = Vec::new();
        if command.needs_attachment() {
            if container_id.is_none() {
                missing.push("CNI_CONTAINERID");
            }
            if command.needs_netns() && netns.is_none() {
                missing.push("CNI_NETNS");
            }
            if ifname.is_none() {
                missing.push("CNI_IFNAME");
            }
        }
        if !missing.is_empty() {
            return Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                format!("required env variables [{}] missing", missing.join(",")),
            ));
        }
        if command.needs_attachment() {
            if let Some(id) = &container_id {
                validate_container_id(id)?;
            }
            if let Some(name) = &ifname {
                validate_ifname(name)?;
            }
        }
        let netns = netns.map(PathBuf::from);
        if let Some(p) = &netns {
            if command.needs_attachment() && !p.is_absolute() {
                return Err(CniError::new(
                    code::INVALID_ENVIRONMENT,
                    format!("CNI_NETNS {} must be an absolute path", p.display()),
                ));
            }
        }
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args: getenv("CNI_ARGS")?,
            path: getenv("CNI_PATH")?,
        })
    }
}

/// What [`inspect_netns`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsState {
    /// The path exists and is not our own namespace.
    Present,
    /// Nothing at that path (the sandbox is gone).
    Missing,
    /// The path is the plugin's own network namespace, i.e. the host's: the
    /// agent must never be asked to create or delete interfaces there.
    Own,
}

/// Compares `path` with `/proc/self/ns/net` by device and inode.
pub fn inspect_netns(path: &Path) -> Result<NetnsState, CniError> {
    let target = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(NetnsState::Missing),
        Err(e) => {
            return Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                format!("CNI_NETNS {} cannot be inspected", path.display()),
            )
            .with_details(Chain(&e).to_string()))
        }
    };
    let own = fs::metadata("/proc/self/ns/net").map_err(|e| {
        CniError::new(code::IO_FAILURE, "cannot inspect /proc/self/ns/net")
            .with_details(Chain(&e).to_string())
    })?;
    if (target.dev(), target.ino()) == (own.dev(), own.ino()) {
        Ok(NetnsState::Own)
    } else {
        Ok(NetnsState::Present)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = move |k: &str| Ok(map.get(k).filter(|v| !v.is_empty()).cloned());
        Env::from_getenv(&get)
    }

    #[test]
    fn add_needs_container_netns_and_ifname_and_names_all_missing() {
        let e = env_of(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert_eq!(
            e.msg,
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing"
        );
        let e = env_of(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert_eq!(e.msg, "required env variables [CNI_NETNS] missing");
    }

    #[test]
    fn del_does_not_need_netns_and_status_needs_nothing() {
        let env = env_of(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", ""),
        ])
        .unwrap();
        assert_eq!(env.netns, None);
        assert_eq!(
            env_of(&[("CNI_COMMAND", "STATUS")]).unwrap().command,
            Command::Status
        );
        assert_eq!(
            env_of(&[("CNI_COMMAND", "GC")]).unwrap().command,
            Command::Gc
        );
        assert_eq!(
            env_of(&[("CNI_COMMAND", "VERSION")]).unwrap().command,
            Command::Version
        );
    }

    #[test]
    fn command_is_required_and_must_be_known() {
        assert!(env_of(&[]).unwrap_err().msg.contains("CNI_COMMAND"));
        let e = env_of(&[("CNI_COMMAND", "add")]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("unknown CNI_COMMAND"));
    }

    #[test]
    fn relative_netns_is_rejected() {
        let e = env_of(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "netns/x"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("CNI_NETNS"));
    }

    #[test]
    fn ifname_rules() {
        for ok in ["eth0", "a", "net1.100", "x-y_z", "123456789012345"] {
            assert_eq!(validate_ifname(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "1234567890123456",
        ] {
            let e = validate_ifname(bad).expect_err(bad);
            assert!(e.msg.contains("CNI_IFNAME"), "{bad}");
        }
    }

    #[test]
    fn container_id_rules() {
        for ok in ["a", "0123abcdef", "pod_1.2-3"] {
            assert_eq!(validate_container_id(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "_a", ".a", "a/b", "a b", "ä"] {
            let e = validate_container_id(bad).expect_err(bad);
            assert!(e.msg.contains("CNI_CONTAINERID"), "{bad}");
        }
    }

    #[test]
    fn cni_args_reads_the_pod_identity_in_any_order() {
        let a = CniArgs::parse(
            "K8S_POD_UID=0e8f-11aa;IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=default;K8S_POD_INFRA_CONTAINER_ID=abc123;FOO=bar",
        )
        .unwrap();
        assert!(a.ignore_unknown);
        assert_eq!(
            a.pod,
            Some(PodIdentity {
                namespace: "default".into(),
                name: "web-0".into(),
                uid: Some("0e8f-11aa".into()),
                infra_container_id: Some("abc123".into()),
            })
        );
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert!(
            CniArgs::parse("IgnoreUnknown=true;")
                .unwrap()
                .ignore_unknown
        );
    }

    #[test]
    fn cni_args_errors() {
        let cases = [
            ("FOO=bar", "unknown key \"FOO\""),
            ("FOO=bar;IgnoreUnknown=0", "unknown key"),
            ("IgnoreUnknown=maybe", "not a boolean"),
            ("novalue", "not KEY=VALUE"),
            ("=x", "not KEY=VALUE"),
            ("A=b=c;IgnoreUnknown=1", "not KEY=VALUE"),
            (
                "K8S_POD_NAME=a;K8S_POD_NAME=b;K8S_POD_NAMESPACE=n",
                "appears twice",
            ),
            ("K8S_POD_NAME=a", "given together"),
            ("K8S_POD_UID=u", "given together"),
            (
                "K8S_POD_NAMESPACE=Bad_NS;K8S_POD_NAME=a",
                "not a namespace name",
            ),
            ("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=-a", "not a pod name"),
            (
                "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=a;K8S_POD_UID=a/b",
                "not a UID",
            ),
            (
                "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=a;K8S_POD_INFRA_CONTAINER_ID=-x",
                "not a container id",
            ),
        ];
        for (input, needle) in cases {
            let e = CniArgs::parse(input).expect_err(input);
            assert_eq!(e.code, code::INVALID_ENVIRONMENT, "{input}");
            assert!(
                e.msg.contains("CNI_ARGS") && e.msg.contains(needle),
                "{input}: {}",
                e.msg
            );
        }
    }

    #[test]
    fn own_netns_is_detected_and_missing_is_reported() {
        assert_eq!(
            inspect_netns(Path::new("/proc/self/ns/net")),
            Ok(NetnsState::Own)
        );
        assert_eq!(
            inspect_netns(Path::new("/nonexistent/cozyplane/netns")),
            Ok(NetnsState::Missing)
        );
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ns");
        fs::write(&f, b"").unwrap();
        assert_eq!(inspect_netns(&f), Ok(NetnsState::Present));
    }
}
