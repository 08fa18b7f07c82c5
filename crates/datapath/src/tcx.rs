//! tcx attachment with pinned links.
//!
//! Links are pinned so the programs stay attached when the (short-lived or
//! restarting) process exits. Re-attaching never opens an unfiltered window:
//! - if a live link is pinned at the path, its program is swapped in place
//!   with `BPF_LINK_UPDATE` (atomic in the kernel);
//! - otherwise (no pin, or the pinned link is defunct because its device
//!   went away) a new link is created, pinned under a temporary name and
//!   renamed over the old pin. Between create and rename both links are
//!   attached, so every packet is filtered by at least one of them; the
//!   rename drops the old pin and with it the old link.
//!
//! The pin path must be unique per (interface, direction); callers own the
//! naming. Attach/pin sequences on one path are not safe to run concurrently
//! (docs/lessons.md #27): the agent serialises them.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use aya::programs::links::{FdLink, LinkError, PinnedLink};
use aya::programs::tc::{SchedClassifierLink, TcAttachOptions};
use aya::programs::{LinkOrder, MultiProgLink, TcAttachType};
use cozyplane_errors::Chain;
use nix::net::if_::{if_indextoname, if_nametoindex};

use crate::datapath::{Datapath, Program};
use crate::error::{DatapathError, Result};

/// Which side of an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Packets the interface receives.
    Ingress,
    /// Packets the interface sends.
    Egress,
}

impl Direction {
    fn attach_type(self) -> TcAttachType {
        match self {
            Direction::Ingress => TcAttachType::Ingress,
            Direction::Egress => TcAttachType::Egress,
        }
    }
}

/// An interface, by index or by name, in the caller's network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Iface<'a> {
    /// By ifindex.
    Index(u32),
    /// By name.
    Name(&'a str),
}

/// What `attach_tcx` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// No live link was pinned at the path; a new one was created and pinned.
    Created,
    /// The live pinned link now runs the new program (atomic update).
    Updated,
}

impl Datapath {
    /// Attach `program` on `iface`/`direction` with its tcx link pinned at
    /// `link_pin` (whose directory must exist on bpffs), replacing whatever
    /// that pin held without an unfiltered window. See the module docs.
    pub fn attach_tcx(
        &mut self,
        iface: Iface<'_>,
        program: Program,
        direction: Direction,
        link_pin: &Path,
    ) -> Result<Attached> {
        let name = iface_name(iface)?;
        let prog = self.program_mut(program)?;
        if let Some(link) = open_pinned(link_pin)? {
            match prog.attach_to_link(link) {
                Ok(id) => {
                    // Dropping our handle closes an fd only: the pin keeps the link.
                    let _handle = prog
                        .take_link(id)
                        .map_err(|e| DatapathError::program(program.name(), e))?;
                    return Ok(Attached::Updated);
                }
                Err(e) => {
                    // ENOLINK: the device is gone and the link defunct; fall
                    // through to a fresh link that replaces the pin.
                    tracing::info!(pin = %link_pin.display(), error = %Chain(&e),
                        "pinned tcx link cannot be updated, replacing it");
                }
            }
        }
        // Whatever is still pinned (a defunct link) is detached for certain
        // once the new one is in place.
        let old = open_pinned(link_pin)?;

        let id = prog
            .attach_with_options(
                &name,
                direction.attach_type(),
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(|e| DatapathError::program(program.name(), e))?;
        let link = prog
            .take_link(id)
            .map_err(|e| DatapathError::program(program.name(), e))?;
        let fd_link = FdLink::try_from(link)
            .map_err(|e| DatapathError::link(link_pin, "taking the new link as an fd link", e))?;

        // Pin under a temporary name, then rename over the old pin. If any
        // step fails, `fd_link`/the temporary pin is dropped and the new
        // link detaches: nothing half-made is left behind.
        let tmp = tmp_pin_path(link_pin);
        let _ = fs::remove_file(&tmp);
        let pinned = fd_link
            .pin(&tmp)
            .map_err(|e| DatapathError::link(&tmp, "pinning the new link", e))?;
        if let Err(e) = fs::rename(&tmp, link_pin) {
            let _ = pinned.unpin();
            return Err(DatapathError::link(
                link_pin,
                "renaming the new pin into place",
                e,
            ));
        }
        if let Some(old) = old {
            if let Err(e) = link_detach(&old) {
                tracing::warn!(pin = %link_pin.display(), error = %Chain(&e),
                    "replaced tcx link did not detach; it goes when its last reference does");
            }
        }
        Ok(Attached::Created)
    }
}

/// Detach the tcx link pinned at `link_pin` and remove the pin.
/// `Ok(false)` if nothing was pinned there.
///
/// Dropping the last reference to a link frees it only later (the kernel
/// defers it to a workqueue after an RCU grace period), so the link is
/// detached explicitly with `BPF_LINK_DETACH` first: when this returns, the
/// program no longer sees packets.
pub fn detach_tcx(link_pin: &Path) -> Result<bool> {
    let link = match open_pinned(link_pin)? {
        Some(link) => link,
        None => return Ok(false),
    };
    link_detach(&link).map_err(|e| DatapathError::link(link_pin, "BPF_LINK_DETACH", e))?;
    drop(link);
    match fs::remove_file(link_pin) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(DatapathError::link(link_pin, "removing the pin", e)),
    }
}

/// The tcx link pinned at `path`, `None` if there is no pin.
fn open_pinned(path: &Path) -> Result<Option<SchedClassifierLink>> {
    match PinnedLink::from_pin(path) {
        Ok(pinned) => SchedClassifierLink::try_from(FdLink::from(pinned))
            .map(Some)
            .map_err(|e| DatapathError::link(path, "the pinned object is not a tcx link", e)),
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DatapathError::link(path, "opening the pinned link", e)),
    }
}

/// `BPF_LINK_DETACH` (aya 0.14 has no wrapper). A link that is already
/// defunct (its device is gone) counts as detached.
fn link_detach(link: &SchedClassifierLink) -> io::Result<()> {
    let fd = link
        .fd()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    link_detach_fd(fd)
}

/// `BPF_LINK_DETACH` of the link behind `fd`; a defunct link counts as detached.
pub(crate) fn link_detach_fd(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    const BPF_LINK_DETACH: libc::c_long = 34;
    // `union bpf_attr` for BPF_LINK_DETACH: just `__u32 link_fd`, padded.
    let attr: [u32; 2] = [fd.as_raw_fd() as u32, 0];
    // SAFETY: `attr` is a valid, initialised buffer of the size passed; the
    // kernel only reads it. The fd is borrowed from a live link.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_DETACH,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOLINK) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

fn tmp_pin_path(link_pin: &Path) -> PathBuf {
    let mut name = link_pin
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    // bpffs reserves dots in names, so no ".tmp" suffix. The name is fixed
    // (no pid) so a swap pin left by a crashed attach is removed next time.
    name.push("-swap");
    link_pin.with_file_name(name)
}

/// The interface name (aya attaches by name), checking it exists.
fn iface_name(iface: Iface<'_>) -> Result<String> {
    match iface {
        Iface::Name(n) => match if_nametoindex(n) {
            Ok(_) => Ok(n.to_string()),
            Err(_) => Err(DatapathError::NoSuchInterface(n.to_string())),
        },
        Iface::Index(i) => match if_indextoname(i) {
            Ok(name) => Ok(name.to_string_lossy().into_owned()),
            Err(_) => Err(DatapathError::NoSuchInterface(format!("ifindex {i}"))),
        },
    }
}
