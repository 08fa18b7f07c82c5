//! Repair of Service allocations, kube's repair controllers in one pass:
//! run once when the server starts (before it serves) and then every
//! [`super::ServiceSettings::repair_interval`].
//!
//! Claims and Services are written one after the other, not in one
//! transaction, so a process that dies in between leaves them out of
//! step:
//! - a claim (IPAddress or node port) whose Service is gone or no longer
//!   holds it — a crash after the claim and before the Service's create,
//!   or after its delete and before the release — is deleted once it is
//!   older than the grace period (a claim younger than that may belong to
//!   a write still in flight);
//! - a cluster IP or node port a stored Service holds without a claim (a
//!   claim deleted by hand, or Services stored before this allocator) is
//!   claimed again; when another Service claimed it meanwhile, the clash is
//!   logged and left for an operator (kube emits an Event there).
//!
//! IPAddress objects that are not the allocator's (label
//! `ipaddress.kubernetes.io/managed-by: ipallocator.k8s.io`, a `parentRef`
//! to a Service) are not touched: an operator may reserve an IP by
//! creating one.
//! A pass reads a snapshot and races with writes made during it: a claim
//! it re-creates for a Service deleted meanwhile is an orphan the next
//! pass removes. Until then the value stays unavailable, never given out
//! twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_errors::Chain;
use cozyplane_store::{ListOptions, Storage, StoreError};
use serde_json::Value;

use super::alloc::{
    held_ips, held_node_ports, ip_address_object, ip_key, node_port_key, node_port_object,
    parent_of, IP_ADDRESS_PREFIX, MANAGED_BY, NODE_PORT_PREFIX,
};
use crate::status::ApiError;

/// The storage prefix of the Services.
const SERVICES_PREFIX: &str = "/core/services/";

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// Claims deleted (their Service gone or not holding them).
    pub removed: Vec<String>,
    /// Claims made again for Services that hold them.
    pub restored: Vec<String>,
    /// Values a Service holds that another Service has claimed.
    pub clashes: Vec<String>,
}

impl RepairReport {
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.restored.is_empty() && self.clashes.is_empty()
    }
}

async fn list(
    store: &Arc<dyn Storage>,
    prefix: &str,
) -> Result<Vec<cozyplane_store::KeyValue>, ApiError> {
    let opts = ListOptions {
        prefix: prefix.to_string(),
        ..ListOptions::default()
    };
    Ok(store.list(&opts).await.map_err(ApiError::from_store)?.items)
}

/// One repair pass (see the module doc).
pub async fn repair(store: &Arc<dyn Storage>, grace: Duration) -> Result<RepairReport, ApiError> {
    let mut report = RepairReport::default();
    // What the stored Services hold: claim key -> owner.
    let mut held: BTreeMap<String, Value> = BTreeMap::new();
    for kv in list(store, SERVICES_PREFIX).await? {
        let Ok(svc) = crate::registry::decode(&kv) else {
            continue;
        };
        let owner = parent_of(&svc);
        let keys = held_ips(&svc)
            .into_iter()
            .map(|ip| ip_key(&ip))
            .chain(held_node_ports(&svc).into_iter().map(node_port_key));
        for key in keys {
            if let Some(first) = held.get(&key) {
                if *first != owner {
                    report
                        .clashes
                        .push(format!("{key} is held by {first} and {owner}"));
                }
                continue;
            }
            held.insert(key, owner.clone());
        }
    }
    let now = chrono::Utc::now();
    let mut claimed: BTreeMap<String, Value> = BTreeMap::new();
    let mut claims = list(store, IP_ADDRESS_PREFIX).await?;
    claims.extend(list(store, NODE_PORT_PREFIX).await?);
    for kv in claims {
        let claim: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
        let owner = claim
            .pointer("/spec/parentRef")
            .cloned()
            .unwrap_or(Value::Null);
        let is_port = kv.key.starts_with(NODE_PORT_PREFIX);
        let ours = claim
            .pointer("/metadata/labels/ipaddress.kubernetes.io~1managed-by")
            .and_then(Value::as_str)
            == Some(MANAGED_BY);
        if !is_port && (owner.get("resource").and_then(Value::as_str) != Some("services") || !ours)
        {
            continue;
        }
        if held.get(&kv.key) == Some(&owner) {
            claimed.insert(kv.key.clone(), owner);
            continue;
        }
        let created = claim
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc));
        let old_enough = created.is_none_or(|t| {
            now.signed_duration_since(t)
                .to_std()
                .is_ok_and(|age| age >= grace)
        });
        if !old_enough {
            // Possibly a write in flight; looked at again next pass.
            claimed.insert(kv.key.clone(), owner);
            continue;
        }
        match store.delete(&kv.key, Some(kv.mod_revision)).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => {
                tracing::info!(key = %kv.key, %owner, "released a claim whose Service does not hold it");
                report.removed.push(kv.key.clone());
            }
            Err(StoreError::Conflict { .. }) => {}
            Err(e) => return Err(ApiError::from_store(e)),
        }
    }
    for (key, owner) in held {
        if let Some(other) = claimed.get(&key) {
            if *other != owner {
                report
                    .clashes
                    .push(format!("{key} is claimed by {other} but held by {owner}"));
            }
            continue;
        }
        let obj = if let Some(port) = key.strip_prefix(NODE_PORT_PREFIX) {
            port.parse().ok().map(|p| node_port_object(p, &owner))
        } else {
            key.strip_prefix(IP_ADDRESS_PREFIX)
                .and_then(|ip| ip.parse().ok())
                .map(|ip| ip_address_object(&ip, &owner))
        };
        let Some(obj) = obj else { continue };
        match store.create(&key, crate::registry::encode(&obj)?).await {
            Ok(_) => {
                tracing::info!(%key, %owner, "claimed again what a stored Service holds");
                report.restored.push(key);
            }
            Err(StoreError::AlreadyExists { .. }) => {
                report
                    .clashes
                    .push(format!("{key} is held by {owner} but claimed by another"));
            }
            Err(e) => return Err(ApiError::from_store(e)),
        }
    }
    for clash in &report.clashes {
        tracing::warn!(%clash, "a Service holds a cluster IP or node port another Service has claimed; change one of them");
    }
    Ok(report)
}

/// Repeat [`repair`] every `interval` (the first pass after one interval:
/// the server runs one before it serves).
pub fn spawn(
    store: Arc<dyn Storage>,
    interval: Duration,
    grace: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            if let Err(e) = repair(&store, grace).await {
                tracing::warn!(error = %Chain(&e), "the Service allocation repair pass failed; next pass in {interval:?}");
            }
        }
    })
}
