//! Classic tc for BPF programs: a `clsact` qdisc and `bpf` filters in direct-action
//! mode, over rtnetlink.
//!
//! Why not tcx here: every tcx attach and detach swaps the device's program array and
//! then waits for a full RCU grace period while holding RTNL (`tcx_entry_sync`), about
//! 14 ms each on our machines, two per pod veth: most of a CNI ADD, and every other
//! netlink user of the node queues behind it. A `bpf` filter is inserted under RTNL
//! without waiting for a grace period (0.03–0.3 ms measured). The agent uses this for
//! the pod veths, which are ours alone (no other program needs ordering beside ours
//! there); the node's uplink and overlay devices, attached once per node, keep tcx
//! links (docs/datapath.md, "Attachment").
//!
//! A filter is addressed by (device, direction, priority, handle). [`NlHandle::put_bpf_filter`]
//! creates it or, if it exists, replaces its program in place (`cls_bpf_change` swaps
//! the program under RCU: no packet sees an empty hook). Deleting the device removes
//! its qdisc and filters with it.

use std::os::fd::{AsRawFd, BorrowedFd};

use futures::StreamExt;
use netlink_packet_route::tc::{
    TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption,
};
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{
    NetlinkMessage, NetlinkPayload, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};

use super::error::{Error, Result};
use super::handle::NlHandle;

/// `ETH_P_ALL`: a filter that sees every protocol.
const ETH_P_ALL: u16 = 0x0003;

/// Which hook of the `clsact` qdisc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcHook {
    /// Packets the device receives.
    Ingress,
    /// Packets the device sends.
    Egress,
}

impl TcHook {
    fn parent(self) -> TcHandle {
        TcHandle {
            major: u16::MAX,
            minor: match self {
                TcHook::Ingress => TcHandle::MIN_INGRESS,
                TcHook::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }
}

impl std::fmt::Display for TcHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TcHook::Ingress => "ingress",
            TcHook::Egress => "egress",
        })
    }
}

/// A `bpf` filter as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpfFilter {
    /// Its priority.
    pub priority: u16,
    /// Its handle.
    pub handle: u32,
    /// The attached program's id.
    pub prog_id: Option<u32>,
    /// The name given at attach.
    pub name: Option<String>,
    /// Direct-action mode (the program's return code is the verdict).
    pub direct_action: bool,
}

/// Where a filter sits and what it runs.
#[derive(Clone, Copy, Debug)]
pub struct BpfFilterSpec<'a> {
    /// The hook.
    pub hook: TcHook,
    /// Filter priority (lower runs first).
    pub priority: u16,
    /// Filter handle within the priority.
    pub handle: u32,
    /// The program.
    pub prog: BorrowedFd<'a>,
    /// A name for `tc filter show` (the program's).
    pub name: &'a str,
}

fn tc_message(index: u32, handle: TcHandle, parent: TcHandle, info: u32) -> Result<TcMessage> {
    let index = i32::try_from(index)
        .map_err(|_| Error::invalid("ifindex", format!("{index} out of range")))?;
    let mut msg = TcMessage::default();
    msg.header = TcHeader {
        index,
        handle,
        parent,
        info,
        ..TcHeader::default()
    };
    Ok(msg)
}

impl NlHandle {
    /// Adds a `clsact` qdisc to device `index`; `Ok(false)` if it already has one.
    pub async fn add_clsact(&self, index: u32) -> Result<bool> {
        let mut msg = tc_message(
            index,
            TcHandle {
                major: u16::MAX,
                minor: 0,
            },
            TcHandle::CLSACT,
            0,
        )?;
        msg.attributes.push(TcAttribute::Kind("clsact".into()));
        match self
            .ack_request(
                format!("add clsact qdisc to link #{index}"),
                RouteNetlinkMessage::NewQueueDiscipline(msg),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_exists() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates the direct-action `bpf` filter `spec` on device `index`, or replaces the
    /// program of the one already there (atomically). The device needs a `clsact`
    /// qdisc ([`NlHandle::add_clsact`]).
    pub async fn put_bpf_filter(&self, index: u32, spec: &BpfFilterSpec<'_>) -> Result<()> {
        let info = (u32::from(spec.priority) << 16) | u32::from(ETH_P_ALL.to_be());
        let mut msg = tc_message(index, TcHandle::from(spec.handle), spec.hook.parent(), info)?;
        let fd = u32::try_from(spec.prog.as_raw_fd())
            .map_err(|_| Error::invalid("program fd", "negative"))?;
        msg.attributes.push(TcAttribute::Kind("bpf".into()));
        msg.attributes.push(TcAttribute::Options(vec![
            TcOption::Bpf(TcFilterBpfOption::ProgFd(fd)),
            TcOption::Bpf(TcFilterBpfOption::ProgName(spec.name.to_string())),
            TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
        ]));
        // NLM_F_CREATE without NLM_F_EXCL: create, or change the existing filter.
        self.ack_request(
            format!(
                "put bpf filter {} on link #{index} {} (prio {} handle {})",
                spec.name, spec.hook, spec.priority, spec.handle
            ),
            RouteNetlinkMessage::NewTrafficFilter(msg),
            NLM_F_CREATE,
        )
        .await
    }

    /// Deletes the filter at (`hook`, `priority`, `handle`) of device `index`.
    /// Idempotent: `Ok(false)` if it (or the device, or its qdisc) is gone.
    pub async fn del_bpf_filter(
        &self,
        index: u32,
        hook: TcHook,
        priority: u16,
        handle: u32,
    ) -> Result<bool> {
        let info = (u32::from(priority) << 16) | u32::from(ETH_P_ALL.to_be());
        let mut msg = tc_message(index, TcHandle::from(handle), hook.parent(), info)?;
        msg.attributes.push(TcAttribute::Kind("bpf".into()));
        match self
            .ack_request(
                format!("delete bpf filter on link #{index} {hook} (prio {priority})"),
                RouteNetlinkMessage::DelTrafficFilter(msg),
                0,
            )
            .await
        {
            Ok(()) => Ok(true),
            // ENOENT: no such filter; ENODEV: no such device; EINVAL: no clsact qdisc
            Err(e) if e.is_not_found() || e.errno() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The `bpf` filters on `hook` of device `index` (empty without a `clsact` qdisc).
    pub async fn bpf_filters(&self, index: u32, hook: TcHook) -> Result<Vec<BpfFilter>> {
        let msg = tc_message(index, TcHandle::UNSPEC, hook.parent(), 0)?;
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetTrafficFilter(msg));
        req.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let op = || format!("list the {hook} filters of link #{index}");
        let mut handle = self.inner.clone();
        let mut response = handle.request(req).map_err(|e| Error::netlink(op(), e))?;
        let mut out = Vec::new();
        while let Some(message) = response.next().await {
            match message.payload {
                NetlinkPayload::Error(err) if err.code.is_some() => {
                    let e = Error::netlink(op(), rtnetlink::Error::NetlinkError(err));
                    if e.is_not_found() || e.errno() == Some(libc::EINVAL) {
                        return Ok(Vec::new());
                    }
                    return Err(e);
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(m)) => {
                    if let Some(f) = bpf_filter(&m) {
                        out.push(f);
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

/// The `bpf` filter a dump message describes (`None` for the per-priority header
/// entries and other kinds).
fn bpf_filter(m: &TcMessage) -> Option<BpfFilter> {
    let is_bpf = m
        .attributes
        .iter()
        .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
    if !is_bpf {
        return None;
    }
    let mut f = BpfFilter {
        priority: (m.header.info >> 16) as u16,
        handle: u32::from(m.header.handle),
        prog_id: None,
        name: None,
        direct_action: false,
    };
    let mut has_options = false;
    for a in &m.attributes {
        if let TcAttribute::Options(opts) = a {
            for o in opts {
                has_options = true;
                match o {
                    TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => f.prog_id = Some(*id),
                    TcOption::Bpf(TcFilterBpfOption::ProgName(n)) => f.name = Some(n.clone()),
                    TcOption::Bpf(TcFilterBpfOption::Flags(fl)) => {
                        f.direct_action = fl.contains(TcBpfFlags::DirectAction)
                    }
                    _ => {}
                }
            }
        }
    }
    has_options.then_some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_address_the_clsact_minor_handles() {
        assert_eq!(u32::from(TcHook::Ingress.parent()), 0xffff_fff2);
        assert_eq!(u32::from(TcHook::Egress.parent()), 0xffff_fff3);
    }
}
