//! The error type of the CRI harness.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// What can go wrong while preparing, running or talking to containerd. A
/// variant that wraps an error says only what was being done; the error is its
/// `source()` (print it with `cozyplane_errors::Chain`). A failed RPC's
/// `tonic::Status` is its message (containerd puts the CNI plugin's error
/// there), printed inline.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// A file system operation failed.
    #[error("{op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A helper program (`gcc`, `tar`, `ctr`, `containerd`) could not be started.
    #[error("cannot run {program}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A helper program ran and failed.
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        /// The command line, for the log.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// A configuration value cannot be used (a socket path too long, a bad name).
    #[error("invalid CRI harness setting: {0}")]
    Invalid(String),
    /// containerd did not start answering, or a call did not finish, in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The limit.
        timeout: Duration,
    },
    /// containerd exited on its own; its log tail explains why.
    #[error("containerd exited ({status}); log tail:\n{log_tail}")]
    Exited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },
    /// The gRPC channel could not be opened.
    #[error("CRI transport")]
    Transport(#[from] tonic::transport::Error),
    /// A CRI call returned an error status.
    #[error("CRI {call}: {status}")]
    Rpc {
        /// The RPC name.
        call: &'static str,
        /// The gRPC status (containerd puts the CNI plugin's error in its message).
        status: Box<tonic::Status>,
    },
    /// A CRI answer lacked a field the harness needs.
    #[error("CRI {call} answered without {field}")]
    Missing {
        /// The RPC name.
        call: &'static str,
        /// The field.
        field: &'static str,
    },
}

impl CriError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        CriError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Results of the CRI harness.
pub type Result<T, E = CriError> = std::result::Result<T, E>;
