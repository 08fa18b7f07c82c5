//! Interface addresses.

use std::net::IpAddr;

use futures::TryStreamExt;
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use rtnetlink::AddressMessageBuilder;

use super::error::{Error, Result};
use super::handle::NlHandle;
use super::types::IpPrefix;

fn address_message(index: u32, prefix: IpPrefix) -> AddressMessage {
    match prefix.addr() {
        IpAddr::V4(a) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
            .index(index)
            .address(a, prefix.len())
            .build(),
        IpAddr::V6(a) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
            .index(index)
            .address(a, prefix.len())
            .build(),
    }
}

impl NlHandle {
    /// Adds `prefix` (address *and* its prefix length, e.g. `10.244.1.5/32`) to a link.
    ///
    /// IPv6 addresses skip duplicate address detection: our addresses are allocated
    /// cluster-unique, and a tentative address would make the first packets of a new pod
    /// fail. Fails with `EEXIST` ([`Error::is_exists`]) if the address is already there.
    pub async fn add_address(&self, index: u32, prefix: IpPrefix) -> Result<()> {
        let mut req = self.inner.address().add(index, prefix.addr(), prefix.len());
        if prefix.addr().is_ipv6() {
            req.message_mut().header.flags |= AddressHeaderFlags::Nodad;
        }
        req.execute()
            .await
            .map_err(|e| Error::netlink(format!("add address {prefix} on #{index}"), e))
    }

    /// Removes `prefix` from a link. Idempotent: `false` if it was not there.
    pub async fn del_address(&self, index: u32, prefix: IpPrefix) -> Result<bool> {
        let msg = address_message(index, prefix);
        match self.inner.address().del(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) => {
                let err = Error::netlink(format!("delete address {prefix} on #{index}"), e);
                if err.is_not_found() {
                    Ok(false)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// The addresses on a link, with their prefix lengths as the kernel holds them.
    pub async fn list_addresses(&self, index: u32) -> Result<Vec<IpPrefix>> {
        let msgs: Vec<AddressMessage> = self
            .inner
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| Error::netlink("list addresses", e))?;
        let mut out = Vec::new();
        for msg in msgs.iter().filter(|m| m.header.index == index) {
            // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on
            // point-to-point links); IPv6 only sends IFA_ADDRESS.
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let addr = local.or_else(|| {
                msg.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })
            });
            if let Some(addr) = addr {
                out.push(IpPrefix::new(addr, msg.header.prefix_len)?);
            }
        }
        Ok(out)
    }
}
