//! The agent's side of the socket, shared so the agent and the tests speak
//! exactly the framing the plugin does.
//!
//! The helpers are synchronous on purpose: one request per connection and a
//! handler that does the work; an async agent can call
//! [`serve_connection`] from a blocking task, or reuse
//! [`crate::proto::decode_request`] / [`crate::proto::write_message`].

use std::fs;
use std::io::{self, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use crate::proto::{decode_request, read_line, write_message, ProtoError, Request, Response};

/// How long the server waits for a client to send its request or take the
/// response: a stuck client must not pin an agent thread.
pub const SERVER_IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection: reads the request, runs `handler`, writes the
/// response. A request that cannot be read or decoded is answered with a
/// protocol error (when the socket still works) and the handler is not run.
///
/// Returns the request that was handled, so callers can log it; an `Err`
/// after the handler ran means the response could not be delivered, which
/// for ADD obliges the caller to roll back.
pub fn serve_connection<F>(stream: &UnixStream, handler: F) -> Result<Request, ProtoError>
where
    F: FnOnce(&Request) -> Response,
{
    stream.set_read_timeout(Some(SERVER_IO_TIMEOUT))?;
    stream.set_write_timeout(Some(SERVER_IO_TIMEOUT))?;
    let decoded = read_line(&mut BufReader::new(stream)).and_then(|line| decode_request(&line));
    let req = match decoded {
        Ok(req) => req,
        Err(e) => {
            // best effort: the peer may already be gone
            let _ = write_message(
                &mut &*stream,
                &Response::Error {
                    error: e.to_cni_error(),
                },
            );
            return Err(e);
        }
    };
    let resp = handler(&req);
    write_message(&mut &*stream, &resp)?;
    Ok(req)
}

/// Binds a listener at `path` without the path ever being absent: bind a
/// temporary name next to it, restrict it to the owner (the plugin runs as
/// root; nobody else may ask for interfaces), then rename it over `path`.
/// A stale socket from a crashed agent is replaced in the same step.
pub fn bind_atomic(path: &Path) -> io::Result<UnixListener> {
    let file_name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "socket path has no file name")
    })?;
    let mut tmp_name = file_name.to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&tmp)?;
    let placed = fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::FileTypeExt;
    use std::thread;

    use super::*;
    use crate::client::{Client, ClientError};
    use crate::error::code;
    use crate::proto::StatusRequest;

    fn status() -> Request {
        Request::Status(StatusRequest {
            network: "n".into(),
        })
    }

    #[test]
    fn client_and_server_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = bind_atomic(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let server = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            serve_connection(&s, |req| {
                assert_eq!(req.op(), "status");
                Response::Error {
                    error: crate::error::CniError::new(51, "degraded"),
                }
            })
            .unwrap()
        });
        let resp = Client::new(&path, Duration::from_secs(5))
            .call(&status())
            .unwrap();
        assert_eq!(
            resp,
            Response::Error {
                error: crate::error::CniError::new(51, "degraded")
            }
        );
        assert_eq!(server.join().unwrap(), status());
    }

    #[test]
    fn bind_atomic_replaces_a_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        drop(UnixListener::bind(&path).unwrap()); // a crashed agent's leftover
        let err = Client::new(&path, Duration::from_secs(1))
            .call(&status())
            .unwrap_err();
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
        let _listener = bind_atomic(&path).unwrap();
        assert!(fs::metadata(&path).unwrap().file_type().is_socket());
        // no temporary left behind
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn missing_socket_and_silent_agent_are_distinguished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let err = Client::new(&path, Duration::from_secs(1))
            .call(&status())
            .unwrap_err();
        assert!(matches!(err, ClientError::SocketMissing(_)), "{err}");

        // an agent that accepts but never answers
        let listener = bind_atomic(&path).unwrap();
        let hold = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            thread::sleep(Duration::from_millis(1500));
            drop(s);
        });
        let err = Client::new(&path, Duration::from_millis(200))
            .call(&status())
            .unwrap_err();
        assert!(matches!(err, ClientError::Timeout(_)), "{err}");
        hold.join().unwrap();
    }

    #[test]
    fn undeliverable_response_is_reported_so_add_can_roll_back() {
        // the plugin timed out and left; the agent finishes the work and must
        // learn that nobody received the result
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = bind_atomic(&path).unwrap();
        let server = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            serve_connection(&s, |_| {
                thread::sleep(Duration::from_millis(1000));
                Response::ok()
            })
        });
        let err = Client::new(&path, Duration::from_millis(100))
            .call(&status())
            .unwrap_err();
        assert!(matches!(err, ClientError::Timeout(_)), "{err}");
        // the client is dropped by now: its socket is closed
        match server.join().unwrap() {
            Err(ProtoError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::BrokenPipe),
            other => panic!("expected a broken pipe, got {other:?}"),
        }
    }

    #[test]
    fn garbage_gets_a_protocol_error_and_no_handler_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let listener = bind_atomic(&path).unwrap();
        let server = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            serve_connection(&s, |_| panic!("handler must not run"))
        });
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"{\"v\":7,\"request\":{}}\n").unwrap();
        let line = read_line(&mut BufReader::new(&c)).unwrap();
        match crate::proto::decode_response(&line).unwrap() {
            Response::Error { error } => {
                assert_eq!(error.code, code::PROTOCOL);
                assert!(error.details.contains("version 7"), "{}", error.details);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            server.join().unwrap(),
            Err(ProtoError::Version { got: 7 })
        ));
    }
}
