//! The bench's error type.

use std::io;

/// Everything that can go wrong in a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Bad options or input.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// An I/O operation failed.
    #[error("{op}: {source}")]
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
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The lab (topology build, exec, teardown).
    #[error("lab: {0}")]
    Lab(#[from] cozyplane_lab::LabError),
    /// The datapath (load, maps, attach).
    #[error("datapath: {0}")]
    Datapath(#[from] cozyplane_datapath::DatapathError),
    /// Netlink or namespace plumbing.
    #[error("netlink: {0}")]
    Netlink(#[from] cozyplane_datapath::netlink::Error),
    /// A node's bring-up (the agent's, `cozyplane_datapath::node`).
    #[error("node bring-up: {0}")]
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
