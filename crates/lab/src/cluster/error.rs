//! Errors of `cozyplane lab up/down/status`: each says what to do about it.

use std::path::PathBuf;

use crate::LabError;

/// A `cozyplane lab` command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Not running as root.
    #[error("the lab needs root (network namespaces, eBPF): run it with sudo")]
    NotRoot,
    /// A kernel facility is missing.
    #[error("{what} is missing ({}): {hint}", path.display())]
    MissingFilesystem {
        /// bpffs or cgroup2.
        what: &'static str,
        /// Where it is expected.
        path: PathBuf,
        /// How to fix it.
        hint: &'static str,
    },
    /// A binary the lab runs is missing.
    #[error("{what} not found at {}: build it (cargo build --bin cozyplane) or set {env}", path.display())]
    MissingBinary {
        /// What it is.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// The environment variable that overrides it.
        env: &'static str,
    },
    /// The topology (namespaces, processes, teardown) failed.
    #[error(transparent)]
    Lab(#[from] LabError),
    /// A file or process operation failed.
    #[error("{op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A kubeconfig or record file is malformed.
    #[error("{}: {detail}", path.display())]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Talking to the lab's API server failed.
    #[error("API server: {0}")]
    Api(String),
    /// A component did not come up; `log` names its log file.
    #[error("{what} did not become ready: {detail} (log: {})", log.display())]
    NotReady {
        /// The component.
        what: String,
        /// Why (timeout, exit status).
        detail: String,
        /// Its log file.
        log: PathBuf,
    },
    /// `up` found a lab (or what a crashed one left) under the same name; nothing was touched.
    #[error(
        "lab {0} already exists: look at it with `cozyplane lab status --name {0}`, or remove it \
         with `cozyplane lab down --name {0}` (also what to do after a crash)"
    )]
    Exists(String),
    /// `lab status` on a lab that does not exist.
    #[error("no lab named {0} is up (start one with `cozyplane lab up --name {0}`)")]
    NoSuchLab(String),
    /// `lab status` on a lab whose `up` never finished (crashed or still running).
    #[error("lab {0} is incomplete: its `lab up` did not finish (still running, or it crashed); remove it with `cozyplane lab down --name {0}`")]
    Incomplete(String),
    /// `lab status` found a component down.
    #[error("lab {0} is not healthy (see above; `cozyplane lab down --name {0}` and up again)")]
    Unhealthy(String),
}

/// Result of the lab commands.
pub type ClusterResult<T> = std::result::Result<T, ClusterError>;

impl ClusterError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ClusterError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
