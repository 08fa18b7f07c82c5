//! A pod veth's programs: `from_pod` on the host veth's ingress and `to_pod` on its
//! egress, as direct-action `bpf` filters of a `clsact` qdisc (see
//! [`crate::netlink`]'s `tc` module for why not tcx links here).
//!
//! No pins: the filters belong to the device and go with it, and they outlive the
//! agent's process (a restarted agent replaces their programs in place, so a pod is
//! never left unfiltered). Every pod veth carries them at one fixed priority and
//! handle per hook, which is how [`attach_pod_programs`] finds the ones to replace,
//! [`check_pod_programs`] the ones to verify and [`detach_pod_programs`] the ones
//! to remove.

use std::os::fd::AsFd;

use aya::programs::ProgramFd;

use crate::datapath::{Datapath, Program};
use crate::error::{DatapathError, Result};
use crate::netlink::{BpfFilterSpec, NlHandle, TcHook};

/// The filter priority of the pod programs (lower runs first; ours are the only ones).
pub const POD_FILTER_PRIORITY: u16 = 1;
/// The filter handle of the pod programs within that priority.
pub const POD_FILTER_HANDLE: u32 = 1;

/// Open handles on the loaded `from_pod` and `to_pod` (cloned fds, so they can be
/// used without holding the datapath), with their kernel ids.
#[derive(Debug)]
pub struct PodPrograms {
    from_pod: ProgramFd,
    to_pod: ProgramFd,
    from_pod_id: u32,
    to_pod_id: u32,
}

impl PodPrograms {
    /// The kernel id of `program` (`FromPod` or `ToPod`).
    pub fn id(&self, hook: TcHook) -> u32 {
        match hook {
            TcHook::Ingress => self.from_pod_id,
            TcHook::Egress => self.to_pod_id,
        }
    }

    fn spec(&self, hook: TcHook) -> BpfFilterSpec<'_> {
        let (prog, name) = match hook {
            TcHook::Ingress => (&self.from_pod, Program::FromPod.name()),
            TcHook::Egress => (&self.to_pod, Program::ToPod.name()),
        };
        BpfFilterSpec {
            hook,
            priority: POD_FILTER_PRIORITY,
            handle: POD_FILTER_HANDLE,
            prog: prog.as_fd(),
            name,
        }
    }
}

impl Datapath {
    /// Handles on the pod programs, for [`attach_pod_programs`] and
    /// [`check_pod_programs`].
    pub fn pod_programs(&mut self) -> Result<PodPrograms> {
        let mut handle = |p: Program| -> Result<(ProgramFd, u32)> {
            let prog = self.program_mut(p)?;
            let fd = prog
                .fd()
                .map_err(|e| DatapathError::program(p.name(), e))?
                .try_clone()
                .map_err(|e| DatapathError::program(p.name(), e.into()))?;
            let id = prog
                .info()
                .map_err(|e| DatapathError::program(p.name(), e))?
                .id();
            Ok((fd, id))
        };
        let (from_pod, from_pod_id) = handle(Program::FromPod)?;
        let (to_pod, to_pod_id) = handle(Program::ToPod)?;
        Ok(PodPrograms {
            from_pod,
            to_pod,
            from_pod_id,
            to_pod_id,
        })
    }
}

fn tc_error(ifindex: u32) -> impl FnOnce(crate::netlink::Error) -> DatapathError {
    move |e| DatapathError::Tc {
        ifindex,
        source: Box::new(e),
    }
}

/// Attaches the pod programs to host veth `ifindex`, or replaces the programs of the
/// filters already there (atomically, per hook). `from_pod` goes first: until it is
/// in place nothing the pod sends is filtered, so an ADD writes its map entries
/// before and runs this last.
pub async fn attach_pod_programs(nl: &NlHandle, ifindex: u32, progs: &PodPrograms) -> Result<()> {
    nl.add_clsact(ifindex).await.map_err(tc_error(ifindex))?;
    for hook in [TcHook::Ingress, TcHook::Egress] {
        nl.put_bpf_filter(ifindex, &progs.spec(hook))
            .await
            .map_err(tc_error(ifindex))?;
    }
    Ok(())
}

/// Removes the pod programs from host veth `ifindex`; idempotent (a gone device or
/// filter counts as removed).
pub async fn detach_pod_programs(nl: &NlHandle, ifindex: u32) -> Result<()> {
    for hook in [TcHook::Ingress, TcHook::Egress] {
        nl.del_bpf_filter(ifindex, hook, POD_FILTER_PRIORITY, POD_FILTER_HANDLE)
            .await
            .map_err(tc_error(ifindex))?;
    }
    Ok(())
}

/// What is wrong with host veth `ifindex`'s pod programs: `None` if both hooks run
/// this datapath's programs at the pod priority and handle, in direct-action mode.
pub async fn check_pod_programs(
    nl: &NlHandle,
    ifindex: u32,
    progs: &PodPrograms,
) -> Result<Option<String>> {
    for hook in [TcHook::Ingress, TcHook::Egress] {
        let filters = nl
            .bpf_filters(ifindex, hook)
            .await
            .map_err(tc_error(ifindex))?;
        let ours = filters
            .iter()
            .find(|f| f.priority == POD_FILTER_PRIORITY && f.handle == POD_FILTER_HANDLE);
        let want = progs.id(hook);
        match ours {
            Some(f) if f.prog_id == Some(want) && f.direct_action => {}
            Some(f) => {
                return Ok(Some(format!(
                    "the {hook} filter of link #{ifindex} runs program {:?} (direct action {}), want {want}",
                    f.prog_id, f.direct_action
                )))
            }
            None => {
                return Ok(Some(format!(
                    "link #{ifindex} has no {hook} program filter"
                )))
            }
        }
    }
    Ok(None)
}
