//! Typed errors of the eBPF half of the datapath crate.
//!
//! A variant that wraps another error says only what was being done; the
//! wrapped error is its `source()` (print the chain with `cozyplane_errors::Chain`,
//! docs/architecture.md "Errors").

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong loading, pinning, attaching or reading the
/// eBPF datapath. aya's errors are boxed: they are large and would bloat
/// every `Result` on the happy path.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The pin directory could not be created or inspected.
    #[error("pin directory {path}")]
    PinDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The pin directory is not on a bpf filesystem, so nothing can be pinned.
    #[error(
        "pin directory {path} is not on a bpf filesystem (mount one with `mount -t bpf bpf <dir>`)"
    )]
    NotBpffs {
        /// The directory.
        path: PathBuf,
    },
    /// A pinned map exists but could not be inspected or removed.
    #[error("pinned map {path}")]
    StalePin {
        /// The pin.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The object failed to load (maps created, relocations applied).
    #[error("loading the eBPF object")]
    Load(#[from] Box<aya::EbpfError>),
    /// A program is missing, of the wrong kind, or the verifier rejected it.
    #[error("program {name}")]
    Program {
        /// Program name.
        name: &'static str,
        /// The underlying error.
        source: Box<aya::programs::ProgramError>,
    },
    /// A map the datapath needs is absent from the object.
    #[error("map {name} is missing from the eBPF object")]
    MissingMap {
        /// Map name.
        name: &'static str,
    },
    /// A map operation failed.
    #[error("map {name}")]
    Map {
        /// Map name.
        name: &'static str,
        /// The underlying error.
        source: Box<aya::maps::MapError>,
    },
    /// A value does not fit the map ABI (e.g. a prefix longer than the family).
    #[error("invalid map value: {0}")]
    InvalidValue(String),
    /// The interface to attach to does not exist.
    #[error("interface {0} not found")]
    NoSuchInterface(String),
    /// Creating, pinning or swapping a link (tcx or cgroup) failed.
    #[error("link {path}: {op}")]
    Link {
        /// The link pin path.
        path: PathBuf,
        /// The failing step, e.g. `renaming the new pin into place`.
        op: &'static str,
        /// The underlying error (an aya link or pin error, or the syscall's
        /// `io::Error` with its errno).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Attaching, checking or detaching a pod veth's programs (tc filters)
    /// failed in netlink.
    #[error("tc filters of link #{ifindex}")]
    Tc {
        /// The device.
        ifindex: u32,
        /// The kernel's answer.
        #[source]
        source: Box<crate::netlink::Error>,
    },
}

/// Result alias of this module.
pub type Result<T, E = DatapathError> = std::result::Result<T, E>;

impl DatapathError {
    pub(crate) fn map(name: &'static str, source: aya::maps::MapError) -> Self {
        Self::Map {
            name,
            source: Box::new(source),
        }
    }

    /// A tcx link step failed.
    pub fn link(
        path: impl Into<PathBuf>,
        op: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Link {
            path: path.into(),
            op,
            source: source.into(),
        }
    }

    pub(crate) fn program(name: &'static str, source: aya::programs::ProgramError) -> Self {
        Self::Program {
            name,
            source: Box::new(source),
        }
    }
}
