//! The node's own firewall in the kernel (`bpf/hostfw.h`,
//! `docs/policy.md`, "Host firewall"): the two cgroup_skb programs and
//! their attachment at `--cgroup-root`. The rules are NetworkPolicy's maps
//! ([`crate::netpol`]) under the host's pseudo identity.
//!
//! The programs attach like the socket-LB's (links pinned, so they stay
//! attached while the agent restarts, replaced make before break). With no
//! host policy they return at their first lookup.

use std::fs::File;
use std::path::Path;

use aya::programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType};
use aya::Ebpf;

use crate::datapath::Datapath;
use crate::error::{DatapathError, Result};
use crate::service::{detach_links, install_link};

/// The host firewall's programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostProgram {
    /// What the node's sockets receive.
    Ingress,
    /// What the node's sockets send.
    Egress,
}

impl HostProgram {
    /// Both programs.
    pub const ALL: [HostProgram; 2] = [HostProgram::Ingress, HostProgram::Egress];

    /// The function name in `bpf/cozyplane.bpf.c`, also its link's pin name.
    pub fn name(self) -> &'static str {
        match self {
            HostProgram::Ingress => "host_ingress",
            HostProgram::Egress => "host_egress",
        }
    }

    fn attach_type(self) -> CgroupSkbAttachType {
        match self {
            HostProgram::Ingress => CgroupSkbAttachType::Ingress,
            HostProgram::Egress => CgroupSkbAttachType::Egress,
        }
    }
}

/// Loads and verifies both host firewall programs of `ebpf`.
pub(crate) fn load_host_programs(ebpf: &mut Ebpf) -> Result<()> {
    for p in HostProgram::ALL {
        host_program(ebpf, p)?
            .load()
            .map_err(|e| DatapathError::program(p.name(), e))?;
    }
    Ok(())
}

pub(crate) fn host_program(ebpf: &mut Ebpf, p: HostProgram) -> Result<&mut CgroupSkb> {
    crate::datapath::typed_program(ebpf, p.name())
}

impl Datapath {
    /// A loaded host firewall program.
    pub fn host_program_mut(&mut self, p: HostProgram) -> Result<&mut CgroupSkb> {
        host_program(self.ebpf_mut(), p)
    }

    /// Attaches both host firewall programs to the cgroup v2 directory
    /// `cgroup`, each link pinned as `<link_dir>/<program name>`, replacing
    /// what those pins held.
    pub fn attach_host_firewall(&mut self, cgroup: &Path, link_dir: &Path) -> Result<()> {
        let dir =
            File::open(cgroup).map_err(|e| DatapathError::link(cgroup, "opening the cgroup", e))?;
        for p in HostProgram::ALL {
            let prog = self.host_program_mut(p)?;
            let id = prog
                .attach(&dir, p.attach_type(), CgroupAttachMode::Single)
                .map_err(|e| DatapathError::program(p.name(), e))?;
            let link = prog
                .take_link(id)
                .map_err(|e| DatapathError::program(p.name(), e))?;
            install_link(link_dir, p.name(), link.try_into())?;
        }
        Ok(())
    }
}

/// Detaches the host firewall links pinned in `link_dir`; how many there
/// were.
pub fn detach_host_firewall(link_dir: &Path) -> Result<usize> {
    detach_links(link_dir, HostProgram::ALL.iter().map(|p| p.name()))
}
