//! Errors of the agent runtime.
//!
//! A variant that wraps another error says only what was being done; the
//! wrapped error is its `source()`, and `cozyplane agent` prints the chain
//! (docs/architecture.md "Errors").

use std::path::PathBuf;

use crate::cni_handler::StepError;

use super::watch::WatchError;

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
    #[error(transparent)]
    Datapath(#[from] cozyplane_datapath::DatapathError),
    /// The node's bring-up (`cozyplane_datapath::node`) failed.
    #[error(transparent)]
    Node(#[from] cozyplane_datapath::node::NodeError),
    /// Netlink, namespaces or sysctls failed.
    #[error(transparent)]
    Netlink(#[from] cozyplane_datapath::netlink::Error),
    /// A file operation failed.
    #[error("{op} {}", .path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {}", .path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Without `--kubeconfig`, no client configuration could be inferred.
    #[error("cannot infer a Kubernetes client configuration")]
    InferConfig(#[source] kube::config::InferConfigError),
    /// The Kubernetes client could not be built from its configuration.
    #[error("cannot build a Kubernetes client")]
    Client(#[source] kube::Error),
    /// The per-pod datapath state could not be rebuilt from the veths.
    #[error("rebuilding the pods' datapath state")]
    Rebuild(#[source] StepError),
    /// A background task the agent cannot go on without ended.
    #[error("the {task} task stopped")]
    TaskStopped {
        /// The task.
        task: &'static str,
        /// How it ended.
        #[source]
        cause: TaskEnd,
    },
}

/// How a background task ended.
#[derive(Debug, thiserror::Error)]
pub enum TaskEnd {
    /// It returned without an error (it should never).
    #[error("it returned")]
    Returned,
    /// The watches ended.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// The metrics server failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Its ready signal's sender is gone (the task that owned it ended).
    #[error(transparent)]
    Closed(#[from] tokio::sync::watch::error::RecvError),
    /// It panicked or was cancelled.
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
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
