//! One plugin invocation: read env and stdin, ask the agent, print the result.
//!
//! Kept apart from `main` so the dispatch is testable without spawning a
//! process. The agent-unreachable policy, per command:
//!
//! | command | socket missing | refused / busy / timeout | protocol error |
//! |---------|----------------|--------------------------|----------------|
//! | ADD     | 11             | 11                       | 101            |
//! | DEL     | **success**    | 11                       | 101            |
//! | CHECK   | 11             | 11                       | 101            |
//! | STATUS  | 50             | 50                       | 50             |
//! | GC      | 11             | 11                       | 101            |
//!
//! DEL succeeds without a socket because the agent owns every resource of an
//! attachment and creates its socket before it creates anything: no socket
//! means no agent on this node, hence nothing to release here (the netns and
//! veth die with the sandbox, and the controller reclaims address claims of
//! deleted pods). Failing instead would wedge pod removal forever on a node
//! whose CNI was uninstalled. A socket that exists but does not answer is
//! an agent restarting, so DEL asks the runtime to retry (11) rather than
//! leak what the agent still holds.

use std::io::{Read, Write};
use std::time::Duration;

use cozyplane_errors::Chain;
use serde_json::{json, Value};

use crate::client::{Client, ClientError};
use crate::config::{sniff_version, NetConf};
use crate::env::{inspect_netns, CniArgs, Command, Env, Getenv, NetnsState, PodIdentity};
use crate::error::{code, CniError};
use crate::proto::{
    AddRequest, Attachment, CheckRequest, DelRequest, GcRequest, Request, Response, StatusRequest,
};
use crate::result::{decode_prev_result, encode};
use crate::version::{CniVersion, SUPPORTED};

/// The largest config accepted on stdin.
pub const MAX_STDIN_BYTES: usize = 512 * 1024;
/// STATUS is polled (kubelet, about every 5 s), so it never waits longer than this.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// What the process should print and how it should exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Bytes for stdout (a result, a version report, an error, or nothing).
    pub stdout: Vec<u8>,
    /// 0 on success, 1 on error.
    pub exit_code: u8,
}

impl Outcome {
    fn success(v: Option<Value>) -> Self {
        Outcome {
            stdout: v.map(|v| format!("{v}\n").into_bytes()).unwrap_or_default(),
            exit_code: 0,
        }
    }

    fn failure(e: &CniError, version: CniVersion) -> Self {
        Outcome {
            stdout: format!("{}\n", e.to_json(version.as_str())).into_bytes(),
            exit_code: 1,
        }
    }
}

fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    let limit = u64::try_from(MAX_STDIN_BYTES).unwrap_or(u64::MAX) + 1;
    stdin.take(limit).read_to_end(&mut buf).map_err(|e| {
        CniError::new(code::IO_FAILURE, "cannot read network config from stdin")
            .with_details(Chain(&e).to_string())
    })?;
    if buf.len() > MAX_STDIN_BYTES {
        return Err(CniError::new(
            code::INVALID_NETWORK_CONFIG,
            format!("network config exceeds {MAX_STDIN_BYTES} bytes"),
        ));
    }
    Ok(buf)
}

/// Runs one invocation.
pub fn run(getenv: Getenv<'_>, stdin: &mut dyn Read, log: &mut dyn Write) -> Outcome {
    let env = match Env::from_getenv(getenv) {
        Ok(env) => env,
        Err(e) => return Outcome::failure(&e, CniVersion::LATEST),
    };
    let input = match read_stdin(stdin) {
        Ok(b) => b,
        Err(e) if env.command == Command::Version => {
            let _ = writeln!(
                log,
                "cozyplane-cni: VERSION: ignoring unreadable stdin: {e}"
            );
            Vec::new()
        }
        Err(e) => return Outcome::failure(&e, CniVersion::LATEST),
    };
    if env.command == Command::Version {
        return Outcome::success(Some(version_report(&input)));
    }
    let err_version = sniff_version(&input).unwrap_or(CniVersion::LATEST);
    let conf = match NetConf::parse(&input) {
        Ok(c) => c,
        Err(e) => return Outcome::failure(&e, err_version),
    };
    let outcome = match env.command {
        Command::Add => cmd_add(&env, &conf),
        Command::Del => cmd_del(&env, &conf, log),
        Command::Check => cmd_check(&env, &conf),
        Command::Status => cmd_status(&conf),
        Command::Gc => cmd_gc(&conf),
        Command::Version => Ok(None),
    };
    match outcome {
        Ok(v) => Outcome::success(v),
        Err(e) => {
            let _ = writeln!(
                log,
                "cozyplane-cni: {:?} {} failed: {e}",
                env.command,
                env.container_id.as_deref().unwrap_or("-")
            );
            Outcome::failure(&e, conf.cni_version)
        }
    }
}

/// `{cniVersion, supportedVersions}`; `cniVersion` echoes the input's, as the spec says.
fn version_report(input: &[u8]) -> Value {
    let echoed = serde_json::from_slice::<Value>(input)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| CniVersion::LATEST.as_str().to_owned());
    json!({
        "cniVersion": echoed,
        "supportedVersions": SUPPORTED.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
    })
}

fn attachment(
    env: &Env,
    conf: &NetConf,
    netns: Option<String>,
    pod: Option<PodIdentity>,
) -> Result<Attachment, CniError> {
    // Env::from_getenv guarantees both for ADD/DEL/CHECK; keep the check
    // local anyway rather than trust a distant invariant
    let missing = |name: &str| {
        CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("required env variables [{name}] missing"),
        )
    };
    Ok(Attachment {
        network: conf.name.clone(),
        container_id: env
            .container_id
            .clone()
            .ok_or_else(|| missing("CNI_CONTAINERID"))?,
        ifname: env.ifname.clone().ok_or_else(|| missing("CNI_IFNAME"))?,
        netns,
        pod,
    })
}

/// ADD and CHECK need a netns that exists and is not the host's.
fn required_netns(env: &Env) -> Result<String, CniError> {
    let path = env.netns.as_ref().ok_or_else(|| {
        CniError::new(
            code::INVALID_ENVIRONMENT,
            "required env variables [CNI_NETNS] missing",
        )
    })?;
    match inspect_netns(path)? {
        NetnsState::Present => Ok(path.to_string_lossy().into_owned()),
        NetnsState::Missing => Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("CNI_NETNS {} does not exist", path.display()),
        )),
        NetnsState::Own => Err(own_netns_error(&path.to_string_lossy())),
    }
}

fn own_netns_error(path: &str) -> CniError {
    CniError::new(
        code::INVALID_ENVIRONMENT,
        format!("CNI_NETNS {path} is the plugin's own (host) network namespace"),
    )
}

fn transient(e: &ClientError) -> CniError {
    CniError::new(
        code::TRY_AGAIN_LATER,
        "cozyplane node agent is not reachable, try again later",
    )
    .with_details(Chain(e).to_string())
}

fn client_error(e: ClientError) -> CniError {
    match e {
        ClientError::Proto(p) => p.to_cni_error(),
        other => transient(&other),
    }
}

/// Maps an answer that carries no result (DEL, CHECK, STATUS, GC).
fn expect_ok(resp: Response) -> Result<Option<Value>, CniError> {
    match resp {
        Response::Ok { .. } => Ok(None),
        Response::Error { error } => Err(error),
    }
}

fn cmd_add(env: &Env, conf: &NetConf) -> Result<Option<Value>, CniError> {
    let args = CniArgs::parse(env.args.as_deref().unwrap_or(""))?;
    let netns = required_netns(env)?;
    let prev = conf
        .prev_result
        .as_ref()
        .map(decode_prev_result)
        .transpose()?;
    let req = Request::Add(AddRequest {
        attachment: attachment(env, conf, Some(netns), args.pod)?,
        mtu: conf.mtu,
        runtime_config: conf.runtime_config.clone(),
    });
    let resp = Client::new(&conf.agent_socket, conf.agent_timeout)
        .call(&req)
        .map_err(client_error)?;
    let mut result = match resp {
        Response::Ok { result: Some(r) } => r,
        Response::Ok { result: None } => {
            return Err(CniError::new(
                code::PROTOCOL,
                "agent answered ADD without a result",
            ))
        }
        Response::Error { error } => return Err(error),
    };
    result.validate().map_err(|e| {
        CniError::new(code::PROTOCOL, "agent returned an inconsistent result")
            .with_details(Chain(&e).to_string())
    })?;
    if result.dns.is_empty() {
        if let Some(dns) = &conf.dns {
            result.dns = dns.clone();
        }
    }
    if let Some(prev) = prev {
        result = result.chained_after(prev);
    }
    Ok(Some(encode(&result, conf.cni_version)))
}

fn cmd_del(env: &Env, conf: &NetConf, log: &mut dyn Write) -> Result<Option<Value>, CniError> {
    // DEL is best-effort: input that only *helps* (pod identity, prevResult,
    // the netns) is dropped with a note rather than failing the DEL.
    let pod = match CniArgs::parse(env.args.as_deref().unwrap_or("")) {
        Ok(a) => a.pod,
        Err(e) => {
            let _ = writeln!(log, "cozyplane-cni: DEL: ignoring CNI_ARGS: {e}");
            None
        }
    };
    let netns = match &env.netns {
        None => None,
        Some(p) => match inspect_netns(p) {
            Ok(NetnsState::Present) => Some(p.to_string_lossy().into_owned()),
            Ok(NetnsState::Missing) => None,
            // never let the agent delete interfaces in the host namespace
            Ok(NetnsState::Own) => return Err(own_netns_error(&p.to_string_lossy())),
            Err(e) => {
                let _ = writeln!(log, "cozyplane-cni: DEL: {e}; passing the path on");
                Some(p.to_string_lossy().into_owned())
            }
        },
    };
    let prev_result = match conf
        .prev_result
        .as_ref()
        .map(decode_prev_result)
        .transpose()
    {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(log, "cozyplane-cni: DEL: ignoring prevResult: {e}");
            None
        }
    };
    let req = Request::Del(DelRequest {
        attachment: attachment(env, conf, netns, pod)?,
        prev_result,
    });
    match Client::new(&conf.agent_socket, conf.agent_timeout).call(&req) {
        Ok(resp) => expect_ok(resp),
        Err(ClientError::SocketMissing(path)) => {
            let _ = writeln!(
                log,
                "cozyplane-cni: DEL: no agent socket at {}; no agent on this node, nothing to release",
                path.display()
            );
            Ok(None)
        }
        Err(e) => Err(client_error(e)),
    }
}

fn cmd_check(env: &Env, conf: &NetConf) -> Result<Option<Value>, CniError> {
    if !conf.cni_version.has_check() {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "config version {} does not allow CHECK (0.4.0 or later)",
                conf.cni_version
            ),
        ));
    }
    let args = CniArgs::parse(env.args.as_deref().unwrap_or(""))?;
    let netns = required_netns(env)?;
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::new(code::INVALID_NETWORK_CONFIG, "CHECK requires prevResult"))?;
    let req = Request::Check(CheckRequest {
        attachment: attachment(env, conf, Some(netns), args.pod)?,
        prev_result: decode_prev_result(prev)?,
    });
    let resp = Client::new(&conf.agent_socket, conf.agent_timeout)
        .call(&req)
        .map_err(client_error)?;
    expect_ok(resp)
}

fn require_1_1(conf: &NetConf, what: &str) -> Result<(), CniError> {
    if conf.cni_version.has_status_and_gc() {
        Ok(())
    } else {
        Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "config version {} does not allow {what} (1.1.0 or later)",
                conf.cni_version
            ),
        ))
    }
}

fn cmd_status(conf: &NetConf) -> Result<Option<Value>, CniError> {
    require_1_1(conf, "STATUS")?;
    let req = Request::Status(StatusRequest {
        network: conf.name.clone(),
    });
    let timeout = conf.agent_timeout.min(STATUS_TIMEOUT);
    match Client::new(&conf.agent_socket, timeout).call(&req) {
        Ok(resp) => expect_ok(resp),
        Err(e) => Err(
            CniError::new(code::NOT_AVAILABLE, "cozyplane node agent is not available")
                .with_details(Chain(&e).to_string()),
        ),
    }
}

fn cmd_gc(conf: &NetConf) -> Result<Option<Value>, CniError> {
    require_1_1(conf, "GC")?;
    // without the list, "keep nothing" would be the only reading: refuse
    let valid = conf.valid_attachments.clone().ok_or_else(|| {
        CniError::new(
            code::INVALID_NETWORK_CONFIG,
            "GC requires cni.dev/valid-attachments",
        )
    })?;
    let req = Request::Gc(GcRequest {
        network: conf.name.clone(),
        valid_attachments: valid,
    });
    let resp = Client::new(&conf.agent_socket, conf.agent_timeout)
        .call(&req)
        .map_err(client_error)?;
    expect_ok(resp)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn run_with(vars: &[(&str, &str)], stdin: &str) -> (Value, u8, String) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = move |k: &str| Ok(map.get(k).filter(|v| !v.is_empty()).cloned());
        let mut log = Vec::new();
        let out = run(&get, &mut stdin.as_bytes(), &mut log);
        let v = if out.stdout.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&out.stdout).unwrap()
        };
        (v, out.exit_code, String::from_utf8(log).unwrap())
    }

    #[test]
    fn version_echoes_input_version_and_lists_ours() {
        let (v, rc, _) = run_with(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
        assert_eq!(rc, 0);
        assert_eq!(
            v,
            json!({"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
        );
        let (v, _, _) = run_with(&[("CNI_COMMAND", "VERSION")], "");
        assert_eq!(v["cniVersion"], "1.1.0");
    }

    #[test]
    fn old_versions_cannot_check_status_or_gc() {
        let dir = tempfile::tempdir().unwrap();
        let ns = dir.path().join("ns");
        std::fs::write(&ns, b"").unwrap();
        let ns = ns.to_str().unwrap();
        let (v, rc, _) = run_with(
            &[
                ("CNI_COMMAND", "CHECK"),
                ("CNI_CONTAINERID", "c"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS", ns),
            ],
            r#"{"cniVersion":"0.3.1","name":"n","prevResult":{}}"#,
        );
        assert_eq!((rc, v["code"].as_u64()), (1, Some(1)));
        assert_eq!(v["cniVersion"], "0.3.1");
        for cmd in ["STATUS", "GC"] {
            let (v, rc, _) = run_with(
                &[("CNI_COMMAND", cmd)],
                r#"{"cniVersion":"1.0.0","name":"n"}"#,
            );
            assert_eq!((rc, v["code"].as_u64()), (1, Some(1)), "{cmd}");
            assert!(v["msg"].as_str().unwrap().contains(cmd));
        }
    }

    #[test]
    fn gc_without_valid_attachments_is_refused() {
        let (v, rc, _) = run_with(
            &[("CNI_COMMAND", "GC")],
            r#"{"cniVersion":"1.1.0","name":"n"}"#,
        );
        assert_eq!((rc, v["code"].as_u64()), (1, Some(7)));
    }

    #[test]
    fn oversized_stdin_is_refused() {
        let big = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","pad":"{}"}}"#,
            "x".repeat(MAX_STDIN_BYTES)
        );
        let (v, rc, _) = run_with(&[("CNI_COMMAND", "STATUS")], &big);
        assert_eq!((rc, v["code"].as_u64()), (1, Some(7)));
    }

    /// The runtime sees every cause of an unreachable agent once, down to the
    /// connect error.
    #[test]
    fn an_unreachable_agent_is_reported_with_its_cause_once() {
        let e = ClientError::Unreachable {
            path: "/run/cozyplane/cni.sock".into(),
            source: std::io::Error::from_raw_os_error(111),
        };
        assert_eq!(
            e.to_string(),
            "agent at /run/cozyplane/cni.sock is not accepting connections"
        );
        let err = client_error(e);
        assert_eq!(err.code, code::TRY_AGAIN_LATER);
        assert_eq!(
            err.details,
            "agent at /run/cozyplane/cni.sock is not accepting connections: \
             Connection refused (os error 111)"
        );
        let io = client_error(ClientError::Proto(crate::proto::ProtoError::Io(
            std::io::Error::from_raw_os_error(32),
        )));
        assert_eq!(io.details, "socket I/O: Broken pipe (os error 32)");
    }
}
