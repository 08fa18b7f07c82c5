//! The one error type of the lab.
//!
//! Kernel errors from the datapath's netlink module are wrapped, not flattened, so a
//! caller can still ask them for their errno.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while building, using or tearing down a lab topology.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The [`crate::TopologySpec`] (or a name passed in) is unusable; nothing was made.
    #[error("invalid topology spec: {0}")]
    InvalidSpec(String),
    /// Something carrying this topology's prefix already exists: another topology of
    /// the same name is running, or a crashed one left state behind.
    #[error(
        "topology {name} already exists ({what}); if it is a leftover, remove it with \
         destroy_by_prefix({name:?}) (or `cozyplane lab down`)"
    )]
    AlreadyExists {
        /// The topology name (its prefix).
        name: String,
        /// What was found.
        what: String,
    },
    /// A kernel networking operation (namespace, link, address, route, sysctl) failed.
    #[error(transparent)]
    Netlink(#[from] cozyplane_datapath::netlink::Error),
    /// A file system or process operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file, directory or `/proc` entry involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The state file could not be parsed.
    #[error("state file {}: {source}", path.display())]
    StateFile {
        /// The state file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A node name that is not part of the topology.
    #[error("topology has no node named {0:?}")]
    NoSuchNode(String),
    /// The topology was already destroyed; its namespaces are gone.
    #[error("topology {0} has been destroyed")]
    Destroyed(String),
    /// Starting a process inside a lab namespace failed.
    #[error("starting {program:?} in {place}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The node (or other lab host) it was to run in.
        place: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// [`crate::wait_for`] gave up.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        timeout: Duration,
    },
    /// Building failed, and removing what had been made failed too: both are reported
    /// because the second means something may have leaked.
    #[error("{source}; cleaning up the half-built topology also failed: {cleanup}")]
    RollbackFailed {
        /// Why building failed.
        #[source]
        source: Box<LabError>,
        /// Why the cleanup failed.
        cleanup: Box<LabError>,
    },
    /// Teardown did what it could but some steps failed; running it again retries them.
    #[error("teardown of {prefix} incomplete: {}", errors.join("; "))]
    Teardown {
        /// The topology name (prefix).
        prefix: String,
        /// One line per failed step.
        errors: Vec<String>,
    },
}

/// Shorthand used across the crate.
pub type Result<T, E = LabError> = std::result::Result<T, E>;

impl LabError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        LabError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
