//! The bench's error type.

use std::io;

/// Everything that can go wrong in a benchmark run. A variant that wraps an
/// error names only the component or operation; the error is its `source()`
/// (the binary prints the chain).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad options or input.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// An I/O operation failed.
    #[error("{op}")]
    Io {
        /// What was being done.
        op: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A command (`ip`, `iperf3`, the RR client…) exited unsuccessfully.
    #[error("{what} failed ({status}): {stderr}")]
    Command {
        /// The command line, shortened.
        what: String,
        /// Its exit status.
        status: String,
        /// The tail of its stderr.
        stderr: String,
    },
    /// Output that could not be parsed.
    #[error("unexpected output from {what}: {reason}")]
    Output {
        /// The producing command.
        what: String,
        /// What was wrong with it.
        reason: String,
    },
    /// JSON (de)serialisation.
    #[error("json")]
    Json(#[from] serde_json::Error),
    /// The lab (topology build, exec, teardown).
    #[error("lab")]
    Lab(#[from] cozyplane_lab::LabError),
    /// The datapath (load, maps, attach).
    #[error("datapath")]
    Datapath(#[from] cozyplane_datapath::DatapathError),
    /// Netlink or namespace plumbing.
    #[error("netlink")]
    Netlink(#[from] cozyplane_datapath::netlink::Error),
    /// A node's bring-up (the agent's, `cozyplane_datapath::node`).
    #[error("node bring-up")]
    Node(#[from] cozyplane_datapath::node::NodeError),
    /// The run was interrupted (Ctrl-C / SIGTERM).
    #[error("interrupted")]
    Interrupted,
}

impl BenchError {
    /// An I/O error while doing `op`.
    pub fn io(op: impl Into<String>, source: io::Error) -> BenchError {
        BenchError::Io {
            op: op.into(),
            source,
        }
    }
}

/// Result with [`BenchError`].
pub type Result<T> = std::result::Result<T, BenchError>;
