//! Services in the kernel (`bpf/service.h`, `docs/services.md`): typed access
//! to the service maps, and the socket-level load balancer's cgroup programs.
//!
//! The socket-LB programs attach to a cgroup v2 directory (`--cgroup-root`:
//! the root on a real node, one cgroup per node in the lab) with their links
//! pinned, so they stay attached while the agent restarts. Re-attaching
//! creates the new link before the old one goes (both attached, in
//! multi-attach mode, for a moment): the translation is idempotent (a
//! backend address is no frontend), so a connect that both run is translated
//! once, and none runs with neither.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use aya::maps::{Array, IterableMap, MapData};
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSockAddr};
use aya::Ebpf;

use crate::abi::{
    Affinity, AffinityKey, Backend, LbVal, LpmKey, MasqKey, NetnsVal, SockRevKey, Svc, SvcKey,
    MAX_SVC_SLOTS,
};
use crate::datapath::Datapath;
use crate::error::{DatapathError, Result};
use crate::tables::{HashTable, LpmTable};

mod sync;
pub use sync::{
    sync_service_changes, sync_services, DesiredFrontend, SvcDesired, SvcShadow, SvcSyncReport,
    SvcTables,
};

/// The socket-LB programs (`SEC("cgroup/...")` in `bpf/cozyplane.bpf.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SockProgram {
    /// `connect()` over IPv4: forward translation.
    Connect4,
    /// `connect()` over IPv6 (and v4-mapped): forward translation.
    Connect6,
    /// Unconnected UDP `sendmsg()` over IPv4: forward translation.
    Sendmsg4,
    /// The same over IPv6.
    Sendmsg6,
    /// UDP `recvmsg()` over IPv4: a reply's source back to the frontend.
    Recvmsg4,
    /// The same over IPv6.
    Recvmsg6,
    /// `getpeername()` over IPv4: the peer back to the frontend.
    Getpeername4,
    /// The same over IPv6.
    Getpeername6,
}

impl SockProgram {
    /// Every socket-LB program.
    pub const ALL: [SockProgram; 8] = [
        SockProgram::Connect4,
        SockProgram::Connect6,
        SockProgram::Sendmsg4,
        SockProgram::Sendmsg6,
        SockProgram::Recvmsg4,
        SockProgram::Recvmsg6,
        SockProgram::Getpeername4,
        SockProgram::Getpeername6,
    ];

    /// The function name in `bpf/cozyplane.bpf.c`, also its link's pin name.
    pub fn name(self) -> &'static str {
        match self {
            SockProgram::Connect4 => "sock_connect4",
            SockProgram::Connect6 => "sock_connect6",
            SockProgram::Sendmsg4 => "sock_sendmsg4",
            SockProgram::Sendmsg6 => "sock_sendmsg6",
            SockProgram::Recvmsg4 => "sock_recvmsg4",
            SockProgram::Recvmsg6 => "sock_recvmsg6",
            SockProgram::Getpeername4 => "sock_getpeername4",
            SockProgram::Getpeername6 => "sock_getpeername6",
        }
    }
}

/// The service maps of a loaded datapath.
pub struct SvcMaps {
    /// `cp_svc`: frontends.
    pub frontends: HashTable<SvcKey, Svc>,
    /// `cp_svc_slots`: backend ranges and Maglev tables (slot → backend id).
    pub slots: Array<MapData, u32>,
    /// `cp_backends`: backend id → backend.
    pub backends: HashTable<u32, Backend>,
    /// `cp_svc_revs`: a frontend's `rev_id` → its address.
    pub revs: HashTable<u32, Backend>,
    /// `cp_sock_rev`: translated sockets (the datapath writes it).
    pub sock_rev: HashTable<SockRevKey, u32>,
    /// `cp_affinity`: ClientIP affinity (the datapath writes it).
    pub affinity: HashTable<AffinityKey, Affinity>,
    /// `cp_lb_fwd`: per-packet flows by request tuple (the datapath writes it).
    pub lb_fwd: HashTable<MasqKey, LbVal>,
    /// `cp_lb_rev`: per-packet flows by reply tuple (the datapath writes it).
    pub lb_rev: HashTable<MasqKey, LbVal>,
    /// `cp_lb_src`: `loadBalancerSourceRanges`, `{rev_id, prefix}` (the sync writes it).
    pub lb_src: LpmTable<u32>,
    /// `cp_netns`: network namespace cookie → the VPC its sockets are on
    /// (the agent writes it per VPC pod; a miss is net 0).
    pub netns: HashTable<u64, NetnsVal>,
    /// What the maps hold, as the sync last wrote or read them.
    pub(crate) shadow: SvcShadow,
    /// How many of `cp_svc_slots`' slots the sync may use (all unless
    /// [`SvcMaps::limit_slots`]).
    pub(crate) slot_limit: u32,
}

impl SvcMaps {
    /// Lets the sync use only the first `n` slots of `cp_svc_slots`, so a
    /// test can make a Service not fit without filling 2²⁰ slots (the agent's
    /// hidden `--service-slots`). The next sync reads the maps back: a
    /// frontend whose slots lie past `n` is placed again, or reported unfitted.
    pub fn limit_slots(&mut self, n: u32) -> Result<()> {
        if n == 0 || n > MAX_SVC_SLOTS {
            return Err(DatapathError::InvalidValue(format!(
                "a slot limit of {n}: needs 1..={MAX_SVC_SLOTS} (the slots of cp_svc_slots)"
            )));
        }
        self.slot_limit = n;
        self.shadow = SvcShadow::default();
        Ok(())
    }

    /// Makes the service maps hold `desired`, reading them back first (a
    /// full sync, [`sync_services`]).
    pub fn sync(&mut self, desired: &SvcDesired) -> Result<SvcSyncReport> {
        let mut shadow = std::mem::take(&mut self.shadow);
        let out = sync_services(self, &mut shadow, desired);
        self.shadow = shadow;
        out
    }

    /// Makes the service maps hold `desired`, visiting only the frontends in
    /// `changed` while the mirror of the maps is trusted
    /// ([`sync_service_changes`]); otherwise a full sync.
    pub fn sync_changes(
        &mut self,
        desired: &SvcDesired,
        changed: &std::collections::BTreeSet<SvcKey>,
    ) -> Result<SvcSyncReport> {
        let mut shadow = std::mem::take(&mut self.shadow);
        let out = sync_service_changes(self, &mut shadow, desired, changed);
        self.shadow = shadow;
        out
    }

    /// Records that the sockets of the network namespace with cookie
    /// `cookie` are on network `net` (a VPC's, not 0), for the pod behind
    /// host veth `ifindex`: the socket-LB programs then look frontends up
    /// under `net` only, so the default network's Services are invisible to
    /// them. Overwrites.
    pub fn put_netns(&mut self, cookie: u64, net: u32, ifindex: u32) -> Result<()> {
        if net == crate::abi::NET_DEFAULT || cookie == 0 {
            return Err(DatapathError::InvalidValue(format!(
                "cp_netns[{cookie}] = net {net}: needs a namespace cookie and a VPC's network"
            )));
        }
        self.netns.insert(&cookie, &NetnsVal { net, ifindex })
    }

    /// Removes `cp_netns[cookie]`; with `Some(ifindex)` only if it still
    /// belongs to that veth. Returns whether an entry went.
    pub fn delete_netns(&mut self, cookie: u64, ifindex: Option<u32>) -> Result<bool> {
        if let Some(want) = ifindex {
            match self.netns.get(&cookie)? {
                Some(have) if have.ifindex == want => {}
                _ => return Ok(false),
            }
        }
        self.netns.remove(&cookie)
    }

    /// Writes `backends` into the slots from `base` on.
    pub fn put_slots(&mut self, base: u32, backends: &[u32]) -> Result<()> {
        let end = u64::from(base) + backends.len() as u64;
        if end > u64::from(MAX_SVC_SLOTS) {
            return Err(DatapathError::InvalidValue(format!(
                "slots {base}..{end} exceed cp_svc_slots ({MAX_SVC_SLOTS})"
            )));
        }
        for (i, id) in (base..).zip(backends) {
            self.slots
                .set(i, id, 0)
                .map_err(|e| DatapathError::map("cp_svc_slots", e))?;
        }
        Ok(())
    }
}

impl SvcTables for SvcMaps {
    fn frontends(&self) -> Result<Vec<(SvcKey, Svc)>> {
        self.frontends.entries()
    }
    fn put_frontend(&mut self, key: &SvcKey, svc: &Svc) -> Result<()> {
        self.frontends.insert(key, svc)
    }
    fn remove_frontend(&mut self, key: &SvcKey) -> Result<()> {
        self.frontends.remove(key).map(|_| ())
    }
    fn backends(&self) -> Result<Vec<(u32, Backend)>> {
        self.backends.entries()
    }
    fn put_backend(&mut self, id: u32, b: &Backend) -> Result<()> {
        self.backends.insert(&id, b)
    }
    fn put_backends(&mut self, entries: &[(u32, Backend)]) -> Result<(), (usize, DatapathError)> {
        self.backends.insert_batch(entries)
    }
    fn remove_backend(&mut self, id: u32) -> Result<()> {
        self.backends.remove(&id).map(|_| ())
    }
    fn revs(&self) -> Result<Vec<(u32, Backend)>> {
        self.revs.entries()
    }
    fn put_rev(&mut self, id: u32, b: &Backend) -> Result<()> {
        self.revs.insert(&id, b)
    }
    fn remove_rev(&mut self, id: u32) -> Result<()> {
        self.revs.remove(&id).map(|_| ())
    }
    fn slot(&self, i: u32) -> Result<u32> {
        self.slots
            .get(&i, 0)
            .map_err(|e| DatapathError::map("cp_svc_slots", e))
    }
    fn set_slot(&mut self, i: u32, id: u32) -> Result<()> {
        self.slots
            .set(i, id, 0)
            .map_err(|e| DatapathError::map("cp_svc_slots", e))
    }
    fn capacity(&self) -> u32 {
        self.slot_limit
    }
    fn source_ranges(&self) -> Result<Vec<LpmKey>> {
        Ok(self.lb_src.entries()?.into_iter().map(|(k, _)| k).collect())
    }
    fn put_source_range(&mut self, key: &LpmKey) -> Result<()> {
        self.lb_src.insert(key, &1)
    }
    fn remove_source_range(&mut self, key: &LpmKey) -> Result<()> {
        self.lb_src.remove(key).map(|_| ())
    }
    fn set_slots(&mut self, start: u32, ids: &[u32]) -> Result<(), (usize, DatapathError)> {
        // One BPF_MAP_UPDATE_BATCH per range (the kernel checks each index).
        let keys: Vec<u32> = (start..).take(ids.len()).collect();
        if keys.len() < ids.len() {
            return Err((
                0,
                DatapathError::InvalidValue(format!("slots from {start} overflow")),
            ));
        }
        match crate::batch::update(self.slots.map().fd().as_fd(), &keys, ids) {
            Ok(()) => Ok(()),
            Err((0, e)) if crate::batch::unsupported(&e) => {
                for (n, (i, id)) in keys.iter().zip(ids).enumerate() {
                    self.set_slot(*i, *id).map_err(|e| (n, e))?;
                }
                Ok(())
            }
            Err((n, e)) => Err((
                n,
                DatapathError::map(
                    "cp_svc_slots",
                    aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                        call: "bpf_map_update_batch",
                        io_error: e,
                    }),
                ),
            )),
        }
    }
}

/// Loads and verifies every socket-LB program of `ebpf`.
pub(crate) fn load_sock_programs(ebpf: &mut Ebpf) -> Result<()> {
    for p in SockProgram::ALL {
        sock_program(ebpf, p)?
            .load()
            .map_err(|e| DatapathError::program(p.name(), e))?;
    }
    Ok(())
}

pub(crate) fn sock_program(ebpf: &mut Ebpf, p: SockProgram) -> Result<&mut CgroupSockAddr> {
    crate::datapath::typed_program(ebpf, p.name())
}

impl Datapath {
    /// Attaches every socket-LB program to the cgroup v2 directory `cgroup`,
    /// each link pinned as `<link_dir>/<program name>` (`link_dir` must exist
    /// on bpffs), replacing what those pins held. See the module docs.
    pub fn attach_socket_lb(&mut self, cgroup: &Path, link_dir: &Path) -> Result<()> {
        let dir =
            File::open(cgroup).map_err(|e| DatapathError::link(cgroup, "opening the cgroup", e))?;
        for p in SockProgram::ALL {
            let prog = self.sock_program_mut(p)?;
            let id = prog
                .attach(&dir, CgroupAttachMode::Single)
                .map_err(|e| DatapathError::program(p.name(), e))?;
            let link = prog
                .take_link(id)
                .map_err(|e| DatapathError::program(p.name(), e))?;
            install_link(link_dir, p.name(), link.try_into())?;
        }
        Ok(())
    }
}

/// Pins the new link `fd_link` of program `name` as `<link_dir>/<name>`,
/// replacing (and detaching) whatever link that pin held: make before
/// break, so the program is never detached in between.
pub(crate) fn install_link(
    link_dir: &Path,
    name: &str,
    fd_link: std::result::Result<FdLink, aya::programs::links::LinkError>,
) -> Result<()> {
    let pin = link_dir.join(name);
    let fd_link =
        fd_link.map_err(|e| DatapathError::link(&pin, "taking the new link as an fd link", e))?;
    let old = obj_get(&pin).map_err(|e| DatapathError::link(&pin, "opening the pinned link", e))?;
    // bpffs reserves dots in names: no extension.
    let tmp = link_dir.join(format!("{name}-swap"));
    let _ = fs::remove_file(&tmp);
    let pinned = fd_link
        .pin(&tmp)
        .map_err(|e| DatapathError::link(&tmp, "pinning the new link", e))?;
    if let Err(e) = fs::rename(&tmp, &pin) {
        let _ = pinned.unpin();
        return Err(DatapathError::link(
            &pin,
            "renaming the new pin into place",
            e,
        ));
    }
    if let Some(old) = old {
        // The old link's pin went with the rename; detach it now rather
        // than when its last reference goes.
        crate::tcx::link_detach_fd(old.as_fd())
            .map_err(|e| DatapathError::link(&pin, "BPF_LINK_DETACH of the old link", e))?;
    }
    Ok(())
}

/// Detaches the links of `names` pinned in `link_dir` and removes the pins;
/// how many there were.
pub(crate) fn detach_links<'a>(
    link_dir: &Path,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<usize> {
    let mut n = 0;
    for name in names {
        let pin = link_dir.join(name);
        let link =
            obj_get(&pin).map_err(|e| DatapathError::link(&pin, "opening the pinned link", e))?;
        if let Some(link) = link {
            crate::tcx::link_detach_fd(link.as_fd())
                .map_err(|e| DatapathError::link(&pin, "BPF_LINK_DETACH", e))?;
            n += 1;
        }
        match fs::remove_file(&pin) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(DatapathError::link(&pin, "removing the pin", e)),
        }
    }
    Ok(n)
}

/// Makes `dir` a cgroup v2 mount (creating it, and mounting cgroup2 there
/// unless it already is one): where the socket-LB programs attach. Mounting
/// the unified hierarchy again elsewhere is harmless (every mount shows the
/// one hierarchy), and it works on hosts that mount cgroup v1 at
/// `/sys/fs/cgroup` with v2 beside it (`unified`) or nowhere.
pub fn ensure_cgroup2(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)
        .map_err(|e| DatapathError::link(dir, "creating the cgroup mount point", e))?;
    if is_cgroup2(dir)? {
        return Ok(());
    }
    nix::mount::mount(
        Some("cgroup2"),
        dir,
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| DatapathError::link(dir, "mounting cgroup2", io::Error::from(e)))
}

/// Whether `dir` is on a cgroup v2 file system.
pub fn is_cgroup2(dir: &Path) -> Result<bool> {
    let st = nix::sys::statfs::statfs(dir)
        .map_err(|e| DatapathError::link(dir, "statfs", io::Error::from(e)))?;
    Ok(st.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// Detaches the socket-LB links pinned in `link_dir` and removes the pins;
/// how many there were.
pub fn detach_socket_lb(link_dir: &Path) -> Result<usize> {
    detach_links(link_dir, SockProgram::ALL.iter().map(|p| p.name()))
}

/// `BPF_OBJ_GET`: a new fd for the object pinned at `path`, `None` if
/// nothing is pinned there (aya's `PinnedLink` cannot hand its fd out).
fn obj_get(path: &Path) -> io::Result<Option<OwnedFd>> {
    const BPF_OBJ_GET: libc::c_long = 7;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // `union bpf_attr` for BPF_OBJ_GET: pathname (u64), bpf_fd, file_flags.
    #[repr(C)]
    struct ObjGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let attr = ObjGet {
        pathname: c.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    // SAFETY: `attr` is a valid, initialised buffer of the size passed and
    // `pathname` points at a NUL-terminated string that outlives the call;
    // the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &attr as *const ObjGet,
            std::mem::size_of::<ObjGet>(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::NotFound => Ok(None),
            _ => Err(e),
        };
    }
    let fd = i32::try_from(rc).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}
