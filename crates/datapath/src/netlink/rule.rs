//! Policy routing rules, as far as cozyplane needs them: keeping traffic that
//! arrives on one interface from an address of this host.

use std::net::Ipv4Addr;

use futures::TryStreamExt;

use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleHeader, RuleMessage};
use netlink_packet_route::AddressFamily;

use super::error::{Error, Result};
use super::handle::NlHandle;

/// The kernel's main routing table number that holds local addresses.
const TABLE_LOCAL: u8 = 255;
/// Where the local-table rule is moved to, from 0, so rules can come first.
pub const LOCAL_RULE_PRIORITY: u32 = 100;
/// Where [`NlHandle::refuse_local_from`] puts its rules: before the local table.
pub const REFUSE_RULE_PRIORITY: u32 = 10;

fn local_rule(priority: u32) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header = RuleHeader {
        family: AddressFamily::Inet,
        table: TABLE_LOCAL,
        action: RuleAction::ToTable,
        ..RuleHeader::default()
    };
    m.attributes.push(RuleAttribute::Priority(priority));
    m.attributes
        .push(RuleAttribute::Table(u32::from(TABLE_LOCAL)));
    m
}

impl NlHandle {
    /// Whether the IPv4 local-table rule still sits at priority 0.
    async fn local_rule_at_zero(&self) -> Result<bool> {
        let mut rules = self.inner.rule().get(rtnetlink::IpVersion::V4).execute();
        while let Some(r) = rules
            .try_next()
            .await
            .map_err(|e| Error::netlink("list rules", e))?
        {
            let priority = r.attributes.iter().find_map(|a| match a {
                RuleAttribute::Priority(p) => Some(*p),
                _ => None,
            });
            let table = r.attributes.iter().find_map(|a| match a {
                RuleAttribute::Table(t) => Some(*t),
                _ => None,
            });
            let local = table.unwrap_or(u32::from(r.header.table)) == u32::from(TABLE_LOCAL);
            if local && priority.unwrap_or(0) == 0 && r.header.action == RuleAction::ToTable {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Makes IPv4 packets that arrive on interface `iif` for the local
    /// address `dst` unroutable (the sender gets ICMP "administratively
    /// prohibited"), while every other interface still reaches it: a
    /// routing rule at priority [`REFUSE_RULE_PRIORITY`], ahead of the
    /// local table, whose rule moves from priority 0 to
    /// [`LOCAL_RULE_PRIORITY`] (no firewall needed). Idempotent.
    pub async fn refuse_local_from(&self, iif: &str, dst: Ipv4Addr) -> Result<()> {
        let exists_ok = |r: std::result::Result<(), rtnetlink::Error>, what: &str| match r
            .map_err(|e| Error::netlink(what, e))
        {
            Err(e) if !e.is_exists() => Err(e),
            _ => Ok(()),
        };
        let add = self.inner.rule().add();
        let mut add = add.v4();
        *add.message_mut() = local_rule(LOCAL_RULE_PRIORITY);
        exists_ok(
            add.execute().await,
            "add the local-table rule at priority 100",
        )?;
        // Delete the priority-0 rule only when it is there: the kernel reads
        // priority 0 in a delete as "any priority", so a second call would
        // delete the rule just moved.
        if self.local_rule_at_zero().await? {
            self.inner
                .rule()
                .del(local_rule(0))
                .execute()
                .await
                .map_err(|e| Error::netlink("delete the local-table rule at priority 0", e))?;
        }
        let refuse = self
            .inner
            .rule()
            .add()
            .v4()
            .input_interface(iif)
            .destination_prefix(dst, 32)
            .priority(REFUSE_RULE_PRIORITY)
            .action(RuleAction::Prohibit);
        exists_ok(
            refuse.execute().await,
            &format!("refuse {dst} to packets from {iif}"),
        )
    }
}
