//! A rtnetlink connection bound to one network namespace.

use super::error::{Error, Result};
use super::netns::Netns;

/// A rtnetlink handle whose socket lives in one network namespace.
///
/// The connection task runs on the current tokio runtime and ends by itself once the
/// last clone of the handle is dropped. All link/address/route/neighbour operations
/// are methods on this type (see the sibling modules).
#[derive(Clone, Debug)]
pub struct NlHandle {
    pub(crate) inner: rtnetlink::Handle,
}

impl NlHandle {
    /// A handle on the namespace of the calling process.
    pub fn current() -> Result<NlHandle> {
        let runtime = tokio::runtime::Handle::try_current().map_err(Error::NoRuntime)?;
        let (conn, handle, _unsolicited) = rtnetlink::new_connection().map_err(Error::Socket)?;
        runtime.spawn(conn);
        Ok(NlHandle { inner: handle })
    }

    /// A handle whose socket is opened inside `netns` (on a throwaway thread, see
    /// [`Netns`]), so every request it sends acts on that namespace.
    pub async fn connect(netns: &Netns) -> Result<NlHandle> {
        let runtime = tokio::runtime::Handle::try_current().map_err(Error::NoRuntime)?;
        let reactor = runtime.clone();
        let (conn, handle, _unsolicited) = netns
            .run_async(move || {
                // The socket registers with the caller's runtime, not with this thread.
                let _entered = reactor.enter();
                rtnetlink::new_connection()
            })
            .await?
            .map_err(Error::Socket)?;
        runtime.spawn(conn);
        Ok(NlHandle { inner: handle })
    }

    /// The underlying rtnetlink handle, for requests this module does not wrap.
    pub fn raw(&self) -> &rtnetlink::Handle {
        &self.inner
    }
}

/// A namespace together with a netlink handle bound to it: what plumbing needs for the
/// host side (netlink for links and routes, the namespace for per-device sysctls).
#[derive(Debug)]
pub struct NetnsHandle {
    /// The namespace.
    pub netns: Netns,
    /// A netlink handle whose socket lives in it.
    pub nl: NlHandle,
}

impl NetnsHandle {
    /// The calling process's own namespace (the agent's host namespace).
    pub fn current() -> Result<NetnsHandle> {
        Ok(NetnsHandle {
            netns: Netns::current()?,
            nl: NlHandle::current()?,
        })
    }

    /// The namespace at `path` (e.g. a lab node's `/run/netns/…`).
    pub async fn open(path: impl AsRef<std::path::Path>) -> Result<NetnsHandle> {
        let netns = Netns::open(path)?;
        let nl = NlHandle::connect(&netns).await?;
        Ok(NetnsHandle { netns, nl })
    }
}

impl NlHandle {
    /// Sends one request built outside rtnetlink's request builders and waits
    /// for its acknowledgement; `flags` come on top of `NLM_F_REQUEST | NLM_F_ACK`.
    pub(crate) async fn ack_request(
        &self,
        op: String,
        msg: netlink_packet_route::RouteNetlinkMessage,
        flags: u16,
    ) -> Result<()> {
        use futures::StreamExt;
        use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_REQUEST};
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        let mut handle = self.inner.clone();
        let mut response = handle.request(req).map_err(|e| Error::netlink(&op, e))?;
        while let Some(message) = response.next().await {
            if let NetlinkPayload::Error(err) = message.payload {
                if err.code.is_some() {
                    return Err(Error::netlink(op, rtnetlink::Error::NetlinkError(err)));
                }
            }
        }
        Ok(())
    }
}
