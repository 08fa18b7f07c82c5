//! The one error type of the lab.
//!
//! Kernel errors from the datapath's netlink module are wrapped, not flattened, so a
//! caller can still ask them for their errno. A variant that wraps an error says only
//! what was being done; the error is its `source()` (print it with
//! `cozyplane_errors::Chain`).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use cozyplane_errors::Chain;

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
    #[error("{op} {}", path.display())]
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
    #[error("state file {}", path.display())]
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
    #[error("starting {program:?} in {place}")]
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
    /// because the second means something may have leaked. Two errors, so no
    /// `source()`: the message prints both chains.
    #[error(
        "{}; cleaning up the half-built topology also failed: {}",
        Chain(&**.error),
        Chain(&**.cleanup)
    )]
    RollbackFailed {
        /// Why building failed.
        error: Box<LabError>,
        /// Why the cleanup failed.
        cleanup: Box<LabError>,
    },
    /// Teardown did what it could but some steps failed; running it again retries them.
    #[error("teardown of {prefix} incomplete: {}", errors.join("; "))]
    Teardown {
        /// The topology name (prefix).
        prefix: String,
        /// One entry per failed step, each with its causes.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rollback_prints_each_cause_once() {
        let e = LabError::RollbackFailed {
            error: Box::new(LabError::io(
                "create",
                "/run/cozyplane-lab/t1",
                io::Error::from_raw_os_error(28),
            )),
            cleanup: Box::new(LabError::Netlink(
                cozyplane_datapath::netlink::Error::NetnsExists("t1-a".into()),
            )),
        };
        assert!(std::error::Error::source(&e).is_none());
        let text = Chain(&e).to_string();
        assert_eq!(
            text,
            "create /run/cozyplane-lab/t1: No space left on device (os error 28); cleaning up \
             the half-built topology also failed: netns t1-a already exists"
        );
        assert_eq!(text.matches("No space left").count(), 1, "{text}");
    }
}
