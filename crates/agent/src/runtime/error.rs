//! Errors of the agent runtime.

use std::path::PathBuf;

/// Why the agent could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// An argument is unusable.
    #[error("invalid argument {arg}: {reason}")]
    InvalidArg {
        /// The argument.
        arg: &'static str,
        /// Why.
        reason: String,
    },
    /// The eBPF datapath failed.
    #[error("datapath: {0}")]
    Datapath(#[from] cozyplane_datapath::DatapathError),
    /// The node's bring-up (`cozyplane_datapath::node`) failed.
    #[error(transparent)]
    Node(#[from] cozyplane_datapath::node::NodeError),
    /// Netlink, namespaces or sysctls failed.
    #[error("netlink: {0}")]
    Netlink(#[from] cozyplane_datapath::netlink::Error),
    /// A file operation failed.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The Kubernetes client could not be set up.
    #[error("kubernetes client: {0}")]
    Kube(String),
    /// A background task died.
    #[error("{0} stopped: {1}")]
    TaskStopped(&'static str, String),
}

impl AgentError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        AgentError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
