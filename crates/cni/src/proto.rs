//! The plugin ↔ node agent protocol.
//!
//! **Framing.** One request and one response per connection, each a single
//! line of compact JSON terminated by `\n` (compact JSON never contains a raw
//! newline). A line, newline included, is at most [`MAX_MESSAGE_BYTES`];
//! anything longer is a protocol error, so neither side can be made to
//! buffer without bound. Lines are easy to speak by hand (`socat`) when
//! debugging a node.
//!
//! **Shape.** A request is `{"v":1,"request":{"op":"add",...}}`; a response is
//! `{"status":"ok","result":{...}}` or `{"status":"error","error":{code,msg,details}}`.
//! Error codes are CNI codes and reach the runtime unchanged, so the agent
//! decides between "try again later" (11), "not available" (50/51) and real
//! failures. A request whose `v` differs from [`PROTOCOL_VERSION`] gets
//! [`code::PROTOCOL`]: during a rolling upgrade the plugin binary on disk
//! and the running agent can briefly differ.
//!
//! **Contract for the agent.** ADD must roll back everything if it fails *or
//! if writing the response fails* (the plugin may have timed out and the
//! runtime will call DEL anyway). DEL must succeed when the attachment is
//! unknown. The agent should bind its socket with [`crate::server::bind_atomic`]
//! so the path never disappears while an agent is installed: the plugin
//! treats a missing socket on DEL as "no agent on this node, nothing to clean".

use std::io::{BufRead, Write};

use cozyplane_errors::Chain;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::ValidAttachment;
use crate::env::PodIdentity;
use crate::error::{code, CniError};
use crate::types::AttachmentResult;

/// The protocol version spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest message (one line including its `\n`).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// One attachment: the spec's primary key plus what the agent needs to plumb it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// The network name from the config.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS`; absent on a DEL whose sandbox is already gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// The pod, from `CNI_ARGS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodIdentity>,
}

/// ADD: create the interface and claim addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddRequest {
    /// Which attachment.
    pub attachment: Attachment,
    /// The pod MTU from the config; `None` lets the agent choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Capability arguments (`runtimeConfig`), untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_config: Option<serde_json::Map<String, Value>>,
}

/// DEL: release everything of the attachment; idempotent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelRequest {
    /// Which attachment.
    pub attachment: Attachment,
    /// The ADD result, when the runtime still has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_result: Option<AttachmentResult>,
}

/// CHECK: verify the attachment against the ADD result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckRequest {
    /// Which attachment.
    pub attachment: Attachment,
    /// The ADD result (required by the spec for CHECK).
    pub prev_result: AttachmentResult,
}

/// STATUS: can the agent serve ADD now?
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusRequest {
    /// The network name.
    pub network: String,
}

/// GC: release what belongs to attachments not in `valid_attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcRequest {
    /// The network name.
    pub network: String,
    /// `cni.dev/valid-attachments`: keep these.
    pub valid_attachments: Vec<ValidAttachment>,
}

/// A request to the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// See [`AddRequest`].
    Add(AddRequest),
    /// See [`DelRequest`].
    Del(DelRequest),
    /// See [`CheckRequest`].
    Check(CheckRequest),
    /// See [`StatusRequest`].
    Status(StatusRequest),
    /// See [`GcRequest`].
    Gc(GcRequest),
}

impl Request {
    /// The operation name, for logs.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Add(_) => "add",
            Request::Del(_) => "del",
            Request::Check(_) => "check",
            Request::Status(_) => "status",
            Request::Gc(_) => "gc",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    v: u32,
    request: T,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Response {
    /// Success; ADD carries the result, the others carry none.
    Ok {
        /// The attachment result (ADD).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<AttachmentResult>,
    },
    /// Failure with a CNI error code.
    Error {
        /// The error to report to the runtime.
        error: CniError,
    },
}

impl Response {
    /// Success without a result.
    pub fn ok() -> Self {
        Response::Ok { result: None }
    }
}

/// Framing and decoding failures.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The peer sent more than [`MAX_MESSAGE_BYTES`] without a newline.
    #[error("message exceeds {MAX_MESSAGE_BYTES} bytes")]
    TooLarge,
    /// The peer closed the connection before a full line.
    #[error("connection closed before a complete message ({0} bytes received)")]
    Truncated(usize),
    /// The line is not the expected JSON.
    #[error("cannot decode message: {0}")]
    Decode(String),
    /// The request speaks another protocol version.
    #[error("protocol version {got} not supported (this side speaks {PROTOCOL_VERSION})")]
    Version {
        /// The version the peer sent.
        got: u64,
    },
    /// Reading or writing the socket failed.
    #[error("socket I/O")]
    Io(#[from] std::io::Error),
}

impl ProtoError {
    /// The CNI error a peer should see for this failure.
    pub fn to_cni_error(&self) -> CniError {
        CniError::new(code::PROTOCOL, "plugin/agent protocol error")
            .with_details(Chain(self).to_string())
    }
}

/// Writes one message as a JSON line.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), ProtoError> {
    let mut line = serde_json::to_vec(msg).map_err(|e| ProtoError::Decode(e.to_string()))?;
    line.push(b'\n');
    if line.len() > MAX_MESSAGE_BYTES {
        return Err(ProtoError::TooLarge);
    }
    w.write_all(&line)?;
    w.flush()?;
    Ok(())
}

/// Reads one JSON line (without its `\n`), bounded by [`MAX_MESSAGE_BYTES`].
pub fn read_line(r: &mut impl BufRead) -> Result<Vec<u8>, ProtoError> {
    let mut buf = Vec::new();
    let limit = u64::try_from(MAX_MESSAGE_BYTES).unwrap_or(u64::MAX);
    let n = std::io::Read::take(&mut *r, limit).read_until(b'\n', &mut buf)?;
    match buf.last() {
        Some(b'\n') => {
            buf.pop();
            Ok(buf)
        }
        _ if n >= MAX_MESSAGE_BYTES => Err(ProtoError::TooLarge),
        _ => Err(ProtoError::Truncated(n)),
    }
}

/// Encodes a request line (the client side).
pub fn write_request(w: &mut impl Write, req: &Request) -> Result<(), ProtoError> {
    write_message(
        w,
        &Envelope {
            v: PROTOCOL_VERSION,
            request: req,
        },
    )
}

/// Decodes a request line, checking the protocol version first so that a
/// newer peer's unknown shape is reported as version skew, not as junk.
pub fn decode_request(line: &[u8]) -> Result<Request, ProtoError> {
    let value: Value =
        serde_json::from_slice(line).map_err(|e| ProtoError::Decode(e.to_string()))?;
    match value.get("v").and_then(Value::as_u64) {
        Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
        Some(got) => return Err(ProtoError::Version { got }),
        None => return Err(ProtoError::Decode("missing protocol version \"v\"".into())),
    }
    let env: Envelope<Request> =
        serde_json::from_value(value).map_err(|e| ProtoError::Decode(e.to_string()))?;
    Ok(env.request)
}

/// Decodes a response line.
pub fn decode_response(line: &[u8]) -> Result<Response, ProtoError> {
    serde_json::from_slice(line).map_err(|e| ProtoError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn add() -> Request {
        Request::Add(AddRequest {
            attachment: Attachment {
                network: "cozyplane".into(),
                container_id: "c1".into(),
                ifname: "eth0".into(),
                netns: Some("/run/netns/p".into()),
                pod: Some(PodIdentity {
                    namespace: "default".into(),
                    name: "web".into(),
                    uid: Some("u-1".into()),
                    infra_container_id: None,
                }),
            },
            mtu: Some(1450),
            runtime_config: None,
        })
    }

    #[test]
    fn request_wire_form_is_stable() {
        let mut buf = Vec::new();
        write_request(&mut buf, &add()).unwrap();
        assert_eq!(
            String::from_utf8(buf.clone()).unwrap(),
            concat!(
                r#"{"v":1,"request":{"op":"add","attachment":{"network":"cozyplane","containerId":"c1","#,
                r#""ifname":"eth0","netns":"/run/netns/p","pod":{"namespace":"default","name":"web","uid":"u-1"}},"mtu":1450}}"#,
                "\n"
            )
        );
        let line = read_line(&mut Cursor::new(buf)).unwrap();
        assert_eq!(decode_request(&line).unwrap(), add());
    }

    #[test]
    fn response_wire_forms() {
        let err = Response::Error {
            error: CniError::new(50, "agent not ready"),
        };
        let mut buf = Vec::new();
        write_message(&mut buf, &err).unwrap();
        assert_eq!(
            buf,
            b"{\"status\":\"error\",\"error\":{\"code\":50,\"msg\":\"agent not ready\"}}\n"
        );
        let line = read_line(&mut Cursor::new(buf)).unwrap();
        assert_eq!(decode_response(&line).unwrap(), err);
        assert_eq!(
            decode_response(br#"{"status":"ok"}"#).unwrap(),
            Response::ok()
        );
    }

    #[test]
    fn version_skew_and_junk_are_told_apart() {
        assert!(matches!(
            decode_request(br#"{"v":2,"request":{"op":"teleport"}}"#),
            Err(ProtoError::Version { got: 2 })
        ));
        assert!(matches!(
            decode_request(br#"{"request":{}}"#),
            Err(ProtoError::Decode(_))
        ));
        assert!(matches!(
            decode_request(br#"{"v":1,"request":{"op":"teleport"}}"#),
            Err(ProtoError::Decode(_))
        ));
        assert!(matches!(
            decode_request(b"not json"),
            Err(ProtoError::Decode(_))
        ));
        assert_eq!(
            ProtoError::Version { got: 2 }.to_cni_error().code,
            code::PROTOCOL
        );
    }

    #[test]
    fn framing_is_bounded() {
        let big = vec![b'x'; MAX_MESSAGE_BYTES + 10];
        assert!(matches!(
            read_line(&mut Cursor::new(big)),
            Err(ProtoError::TooLarge)
        ));
        assert!(matches!(
            read_line(&mut Cursor::new(b"{\"a\":1}".to_vec())),
            Err(ProtoError::Truncated(7))
        ));
        assert!(matches!(
            read_line(&mut Cursor::new(Vec::new())),
            Err(ProtoError::Truncated(0))
        ));
        // exactly at the limit (newline included) is fine
        let mut at_limit = vec![b' '; MAX_MESSAGE_BYTES - 1];
        at_limit.push(b'\n');
        assert_eq!(
            read_line(&mut Cursor::new(at_limit)).unwrap().len(),
            MAX_MESSAGE_BYTES - 1
        );
        // a message that would not fit is refused before anything is written
        let huge = "y".repeat(MAX_MESSAGE_BYTES);
        let mut out = Vec::new();
        assert!(matches!(
            write_message(&mut out, &huge),
            Err(ProtoError::TooLarge)
        ));
        assert!(out.is_empty());
    }
}
