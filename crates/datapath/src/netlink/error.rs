//! The one error type of the netlink module.
//!
//! Kernel answers are kept as errno values so callers can tell "not found" (idempotent
//! deletes succeed on it) and "already exists" (a name or route conflict) apart from real
//! failures without matching on strings.
//!
//! A variant that wraps another error names only the operation; the wrapped
//! error is its `source()` (docs/architecture.md "Errors").

use std::io;
use std::path::PathBuf;

use cozyplane_errors::Chain;

/// Everything that can go wrong while talking to the kernel about links, addresses,
/// routes, namespaces and sysctls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A netlink request was answered with an error (or the connection failed).
    #[error("netlink {op}")]
    Netlink {
        /// What was being done, e.g. `add veth cph0123 (peer eth0)`.
        op: String,
        #[source]
        source: rtnetlink::Error,
    },
    /// Opening a netlink socket failed.
    #[error("opening a netlink socket")]
    Socket(#[source] io::Error),
    /// A link that must exist does not.
    #[error("link {0} not found")]
    LinkNotFound(String),
    /// A link exists but is not what the caller asked for (wrong kind or mode).
    #[error("link {name} exists but does not match: {reason}")]
    LinkMismatch {
        /// The link's name.
        name: String,
        /// What differs.
        reason: String,
    },
    /// The caller passed something the kernel would reject or misread.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// Which argument.
        what: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// A namespace operation (open, create, bind mount, setns) failed.
    #[error("netns {path}: {op}")]
    Netns {
        /// The namespace file.
        path: PathBuf,
        /// The failing step.
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// A named namespace already exists.
    #[error("netns {0} already exists")]
    NetnsExists(String),
    /// Reading or writing a sysctl failed.
    #[error("sysctl {key}")]
    Sysctl {
        /// The `/proc/sys` relative key, e.g. `net/ipv4/ip_forward`.
        key: String,
        #[source]
        source: io::Error,
    },
    /// The helper thread that ran a closure inside a namespace died (panicked).
    #[error("the thread running inside netns {0} panicked")]
    NetnsThreadPanicked(PathBuf),
    /// A spawned task died (panicked) or its runtime shut down before it finished.
    #[error("netlink task failed")]
    TaskFailed(#[source] tokio::task::JoinError),
    /// There is no tokio runtime to drive the netlink connection.
    #[error("netlink needs a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
    /// Plumbing failed and rolling back failed too: both are reported, because the
    /// second one means state may have leaked and needs attention. Two errors,
    /// so no `source()`: the message prints both chains.
    #[error("{}; rollback also failed: {}", Chain(&**.error), Chain(&**.rollback))]
    RollbackFailed {
        /// The original failure.
        error: Box<Error>,
        /// Why the rollback failed.
        rollback: Box<Error>,
    },
}

/// Shorthand used across the module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps a netlink error with a description of the operation.
    pub(crate) fn netlink(op: impl Into<String>, source: rtnetlink::Error) -> Self {
        Error::Netlink {
            op: op.into(),
            source,
        }
    }

    /// The positive errno the kernel answered with, if this is a kernel answer.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink {
                source: rtnetlink::Error::NetlinkError(msg),
                ..
            } => msg.code.map(|c| -c.get()),
            Error::Netns { source, .. } | Error::Sysctl { source, .. } => source.raw_os_error(),
            Error::RollbackFailed { error, .. } => error.errno(),
            _ => None,
        }
    }

    /// The kernel said the object does not exist (`ENODEV`, `ENOENT`, `ESRCH`,
    /// `EADDRNOTAVAIL`): deletes treat this as success.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::LinkNotFound(_))
            || matches!(
                self.errno(),
                Some(libc::ENODEV | libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL)
            )
    }

    /// The kernel said the object already exists (`EEXIST`).
    pub fn is_exists(&self) -> bool {
        matches!(self, Error::NetnsExists(_)) || self.errno() == Some(libc::EEXIST)
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            what,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeError;

    fn netns_denied() -> Error {
        Error::Netns {
            path: PathBuf::from("/run/netns/cp-a"),
            op: "open",
            source: io::Error::from_raw_os_error(libc::EACCES),
        }
    }

    #[test]
    fn a_nested_error_prints_each_cause_once() {
        let e = NodeError::from(netns_denied());
        assert_eq!(e.to_string(), "netns /run/netns/cp-a: open");
        let text = Chain(&e).to_string();
        assert_eq!(
            text,
            "netns /run/netns/cp-a: open: Permission denied (os error 13)"
        );
        assert_eq!(text.matches("Permission denied").count(), 1, "{text}");
        // the errno survives the wrapping
        assert_eq!(netns_denied().errno(), Some(libc::EACCES));
    }

    #[test]
    fn a_failed_rollback_prints_both_chains_once() {
        let e = Error::RollbackFailed {
            error: Box::new(netns_denied()),
            rollback: Box::new(Error::Sysctl {
                key: "net/ipv4/ip_forward".into(),
                source: io::Error::from_raw_os_error(libc::EROFS),
            }),
        };
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(
            Chain(&e).to_string(),
            "netns /run/netns/cp-a: open: Permission denied (os error 13); rollback also \
             failed: sysctl net/ipv4/ip_forward: Read-only file system (os error 30)"
        );
        assert_eq!(e.errno(), Some(libc::EACCES));
    }
}
