//! Network namespaces: open, create/delete named ones, and run code inside one.
//!
//! # Why a fresh OS thread per namespace switch
//!
//! `setns(2)` changes the namespace of the *calling thread* only. Doing it on a tokio
//! worker would silently move every other task that later runs on that worker into the
//! pod's namespace (and a panic between `setns` and the switch back would leave it there
//! for good). So every switch happens on a new, short-lived `std::thread` that enters
//! the namespace, does its work and exits: the namespace can never leak into another
//! task, and nothing has to be restored. A thread spawn costs tens of microseconds, far
//! below the cost of the netlink round trips it surrounds.
//!
//! Netlink sockets and `/proc/sys/net` files are bound to the namespace of the thread
//! that *opens* them, so a socket opened on such a thread keeps talking to that
//! namespace after the thread is gone (see [`super::NlHandle::connect`]).
//!
//! Named namespaces follow `ip netns`: a bind mount of the namespace file under
//! `/run/netns/<name>` (a shared mount point, so other mount namespaces such as
//! containerd's see it), which is what makes `ip netns exec <name>` work.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use super::error::{Error, Result};

/// Where named namespaces live, as with `ip netns`.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// Serialises the one-time "make /run/netns a shared mount" step inside this process:
/// two threads racing through it would stack two bind mounts.
static RUN_DIR_SETUP: Mutex<()> = Mutex::new(());

/// An open handle on a network namespace (an fd on its nsfs file).
///
/// Holding it keeps the namespace alive even if its bind mount is removed.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    path: PathBuf,
}

impl Netns {
    /// Opens the namespace behind `path` (`/run/netns/x`, `/proc/<pid>/ns/net`, or a
    /// CNI `CNI_NETNS` path).
    pub fn open(path: impl AsRef<Path>) -> Result<Netns> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| Error::Netns {
            path: path.clone(),
            op: "open",
            source,
        })?;
        // Every namespace file lives on the one nsfs filesystem: compare devices with
        // our own namespace file so a wrong path is a clear error, not a later EINVAL.
        let dev = |f: &File, p: &Path| {
            f.metadata()
                .map(|m| m.dev())
                .map_err(|source| Error::Netns {
                    path: p.to_path_buf(),
                    op: "fstat",
                    source,
                })
        };
        let own_path = Path::new("/proc/thread-self/ns/net");
        let own = File::open(own_path).map_err(|source| Error::Netns {
            path: own_path.to_path_buf(),
            op: "open",
            source,
        })?;
        if dev(&file, &path)? != dev(&own, own_path)? {
            return Err(Error::invalid(
                "netns path",
                format!("{} is not a namespace file", path.display()),
            ));
        }
        Ok(Netns {
            fd: file.into(),
            path,
        })
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Netns> {
        Netns::open("/proc/thread-self/ns/net")
    }

    /// The path this handle was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's inode number: two handles with the same inode (and nsfs device)
    /// are the same namespace.
    pub fn inode(&self) -> Result<u64> {
        let meta = File::from(self.fd_clone()?)
            .metadata()
            .map_err(|source| self.err("fstat", source))?;
        Ok(meta.ino())
    }

    /// The namespace's cookie: what `bpf_get_netns_cookie` returns for its
    /// sockets (read as `SO_NETNS_COOKIE` of a socket opened inside it, on a
    /// fresh thread, see [`Netns::run`]). Unique while the machine is up,
    /// never reused. Blocking: from async code use [`Netns::cookie_async`].
    pub fn cookie(&self) -> Result<u64> {
        self.run(socket_netns_cookie)?
            .map_err(|source| self.err("read the cookie of", source))
    }

    /// Like [`Netns::cookie`], but awaits the thread.
    pub async fn cookie_async(&self) -> Result<u64> {
        self.run_async(socket_netns_cookie)
            .await?
            .map_err(|source| self.err("read the cookie of", source))
    }

    /// A second handle on the same namespace.
    pub fn try_clone(&self) -> Result<Netns> {
        Ok(Netns {
            fd: self.fd_clone()?,
            path: self.path.clone(),
        })
    }

    fn fd_clone(&self) -> Result<OwnedFd> {
        self.fd
            .try_clone()
            .map_err(|source| self.err("dup", source))
    }

    fn err(&self, op: &'static str, source: io::Error) -> Error {
        Error::Netns {
            path: self.path.clone(),
            op,
            source,
        }
    }

    /// Runs `f` on a fresh OS thread that has entered this namespace, and waits for it.
    ///
    /// Blocking: from async code use [`Netns::run_async`].
    pub fn run<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let fd = self.fd.as_fd();
        std::thread::scope(|scope| {
            scope
                .spawn(move || enter(fd).map(|()| f()))
                .join()
                .map_err(|_| Error::NetnsThreadPanicked(self.path.clone()))?
                .map_err(|source| self.err("setns", source))
        })
    }

    /// Like [`Netns::run`], but awaits the thread instead of blocking the executor.
    pub async fn run_async<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let fd = self.fd_clone()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("cp-netns".into())
            .spawn(move || {
                let out = enter(fd.as_fd()).map(|()| f());
                // The receiver is gone only if the caller stopped waiting: nothing to do.
                let _ = tx.send(out);
            })
            .map_err(|source| self.err("spawn thread", source))?;
        rx.await
            .map_err(|_| Error::NetnsThreadPanicked(self.path.clone()))?
            .map_err(|source| self.err("setns", source))
    }

    /// Makes `cmd` enter this namespace in the forked child, just before it execs
    /// (a `pre_exec` hook), so the program starts inside it while the caller's
    /// thread never moves. Unlike `ip netns exec` this keeps the caller's mount
    /// namespace (and so the bpffs under `/sys/fs/bpf`).
    ///
    /// The hook owns a close-on-exec duplicate of the namespace fd, which lives as
    /// long as `cmd`: the program never inherits it.
    pub fn enter_before_exec(&self, cmd: &mut Command) -> Result<()> {
        let fd = self.fd_clone()?;
        // SAFETY: the hook runs in the forked child before exec and only calls
        // setns(2) (through nix, which adds an errno read), which is
        // async-signal-safe; it takes no locks and allocates nothing.
        unsafe {
            cmd.pre_exec(move || enter(fd.as_fd()));
        }
        Ok(())
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `SO_NETNS_COOKIE` (asm-generic/socket.h, Linux 5.14; the value of every
/// architecture we build for; `libc` does not export it for them).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The netns cookie of the calling thread's namespace, from a socket opened
/// in it (an unbound Unix socket: it needs no interface up).
fn socket_netns_cookie() -> io::Result<u64> {
    let sock = std::os::unix::net::UnixDatagram::unbound()?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `sock` is an open socket for the duration of the call, and
    // `cookie`/`len` point at a live u64 and its size, which the kernel
    // writes at most `len` bytes into.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<u64>() || cookie == 0 {
        return Err(io::Error::other(format!(
            "SO_NETNS_COOKIE returned {len} bytes, cookie {cookie}"
        )));
    }
    Ok(cookie)
}

/// Moves the calling thread into the namespace behind `fd`.
fn enter(fd: BorrowedFd<'_>) -> io::Result<()> {
    setns(fd, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// The path of the named namespace `name`.
pub fn named_netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_RUN_DIR).join(name)
}

fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 255 || name.contains('/') || name == "." || name == ".." {
        return Err(Error::invalid(
            "netns name",
            format!("{name:?}: must be 1-255 chars, no '/', not . or .."),
        ));
    }
    Ok(())
}

/// Creates the named namespace `name` (like `ip netns add`) and returns a handle on it.
///
/// Fails with [`Error::NetnsExists`] if the name is taken. On any failure nothing is
/// left behind.
pub fn create_named_netns(name: &str) -> Result<Netns> {
    validate_name(name)?;
    ensure_run_dir()?;
    let path = named_netns_path(name);
    let ns_err = |op, source| Error::Netns {
        path: path.clone(),
        op,
        source,
    };
    // The mount point: an empty file, created exclusively so two callers cannot share one.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&path)
        .map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                Error::NetnsExists(name.to_string())
            } else {
                ns_err("create mount point", source)
            }
        })?;
    let target = path.clone();
    let made = std::thread::spawn(move || -> io::Result<()> {
        unshare(CloneFlags::CLONE_NEWNET)?;
        // /proc/thread-self, not /proc/self: only this thread is in the new namespace.
        mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        Ok(())
    })
    .join();
    let made = match made {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(ns_err("unshare + bind mount", source)),
        Err(_) => Err(Error::NetnsThreadPanicked(path.clone())),
    };
    if let Err(e) = made {
        // Never leave an empty mount point behind: `ip netns` would list it.
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Netns::open(&path)
}

/// Deletes the named namespace `name` (like `ip netns del`). Idempotent: a name that
/// does not exist is success. Processes or fds still inside keep the namespace alive.
pub fn delete_named_netns(name: &str) -> Result<()> {
    validate_name(name)?;
    let path = named_netns_path(name);
    match umount2(&path, MntFlags::MNT_DETACH) {
        // EINVAL: not a mount point (a stale file); ENOENT: gone already.
        Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
        Err(e) => {
            return Err(Error::Netns {
                path,
                op: "umount",
                source: e.into(),
            })
        }
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Netns {
            path,
            op: "remove mount point",
            source,
        }),
    }
}

/// Makes sure `/run/netns` exists and is a shared mount point, as `ip netns add` does,
/// so namespace mounts propagate to other mount namespaces.
fn ensure_run_dir() -> Result<()> {
    let _guard = RUN_DIR_SETUP
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = Path::new(NETNS_RUN_DIR);
    let err = |op, source| Error::Netns {
        path: dir.to_path_buf(),
        op,
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| err("mkdir", e))?;
    let shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
    match mount(None::<&str>, dir, Some("none"), shared, None::<&str>) {
        Ok(()) => Ok(()),
        Err(Errno::EINVAL) => {
            // Not a mount point yet: bind it onto itself, then make it shared.
            mount(
                Some(dir),
                dir,
                Some("none"),
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(|e| err("bind mount onto itself", e.into()))?;
            mount(None::<&str>, dir, Some("none"), shared, None::<&str>)
                .map_err(|e| err("make shared", e.into()))
        }
        Err(e) => Err(err("make shared", e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_names_that_escape_the_run_dir() {
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(
                matches!(validate_name(bad), Err(Error::InvalidInput { .. })),
                "{bad:?} accepted"
            );
        }
        assert!(validate_name("cpt-ok_1.x").is_ok());
        assert_eq!(named_netns_path("cpt-a"), PathBuf::from("/run/netns/cpt-a"));
    }

    #[test]
    fn open_refuses_files_that_are_not_namespaces() {
        let err = Netns::open("/proc/self/status").unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
        assert!(Netns::open("/proc/self/ns/net").is_ok());
    }

    #[test]
    fn open_reports_the_path_of_a_missing_namespace() {
        let err = Netns::open("/run/netns/cpt-does-not-exist-xyz").unwrap_err();
        assert!(err.to_string().contains("cpt-does-not-exist-xyz"), "{err}");
        assert_eq!(err.errno(), Some(libc::ENOENT));
    }
}
