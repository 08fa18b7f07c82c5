//! The plugin's side of the agent socket.
//!
//! The connect never blocks: the socket is non-blocking while connecting, so
//! a listener whose backlog is full answers `EAGAIN` at once ("agent busy")
//! instead of stalling the runtime. After connecting, one deadline covers
//! writing the request and reading the response.

use std::io::{BufReader, ErrorKind};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use socket2::{Domain, SockAddr, Socket, Type};

use crate::proto::{decode_response, read_line, write_request, ProtoError, Request, Response};

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing at the socket path: no agent is installed or it never started.
    #[error("agent socket {0} does not exist")]
    SocketMissing(PathBuf),
    /// A socket file exists but nobody accepts (agent stopped or restarting),
    /// or the listener's backlog is full.
    #[error("agent at {path} is not accepting connections")]
    Unreachable {
        /// The socket path.
        path: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The agent did not answer within the deadline.
    #[error("agent did not answer within {0:?}")]
    Timeout(Duration),
    /// The exchange failed (framing, decoding, I/O after connecting).
    #[error(transparent)]
    Proto(#[from] ProtoError),
}

/// A client for one agent socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

impl Client {
    /// A client for `socket` whose calls give up after `timeout`.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn connect(&self) -> Result<UnixStream, ClientError> {
        let unreachable = |source| ClientError::Unreachable {
            path: self.socket.clone(),
            source,
        };
        let addr = SockAddr::unix(&self.socket).map_err(unreachable)?;
        // socket2 sets close-on-exec on new sockets
        let sock = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(unreachable)?;
        sock.set_nonblocking(true).map_err(unreachable)?;
        match sock.connect(&addr) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(ClientError::SocketMissing(self.socket.clone()))
            }
            Err(e) => return Err(unreachable(e)),
        }
        sock.set_nonblocking(false).map_err(unreachable)?;
        Ok(UnixStream::from(OwnedFd::from(sock)))
    }

    /// Sends one request and waits for its response.
    pub fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let stream = self.connect()?;
        let timed_out = |e: ProtoError| match e {
            ProtoError::Io(io) if is_timeout(&io) => ClientError::Timeout(self.timeout),
            other => ClientError::Proto(other),
        };
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(|e| ClientError::Proto(e.into()))?;
        write_request(&mut &stream, req).map_err(timed_out)?;
        let remaining = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(ClientError::Timeout(self.timeout))?;
        stream
            .set_read_timeout(Some(remaining))
            .map_err(|e| ClientError::Proto(e.into()))?;
        let line = read_line(&mut BufReader::new(&stream)).map_err(timed_out)?;
        Ok(decode_response(&line)?)
    }
}
