//! Object-count quota (`ResourceQuota` `count/<resource>.<group>`),
//! enforced by the API server itself on create, as kube-apiserver's
//! `ResourceQuota` admission plugin does.
//!
//! How it stays exact under concurrent creates: `status.used` of each
//! quota is the ledger. A create first *charges* every quota of its
//! namespace that limits its kind: it reads the quota, checks
//! `used + 1 <= hard` and writes `used + 1` back with a compare-and-swap on
//! the quota's resourceVersion ([`Storage::update`]); a concurrent charge
//! that lost the swap re-reads and checks again. Only then is the object
//! created. A create that fails after its charge (the name exists, the store
//! fails) gives the charge back, and removing an object from the store
//! gives one back. The compare-and-swap is the only lock, so this holds
//! across API server replicas sharing one etcd, not just within a process
//! (a process-local mutex plus a count of the stored objects would not).
//!
//! A new quota's ledger starts from a count of the stored objects
//! ([`Storage::count`]) right after its create; a quota that still has no
//! `status.used` entry for a resource (that count failed, or a key was
//! added to `spec.hard` later) gets it counted by its first charge. Kubernetes' quota
//! controller recounts periodically; there is no controller here, so a
//! ledger can only drift upwards, when the process dies between a charge and
//! the create or give-back. Clearing `status.used` (a `/status` write)
//! makes the next create recount.
//!
//! Only `count/…` keys are enforced; other keys (`cpu`, `pods`, …) are
//! stored and mirrored into `status.hard` but not counted. A dryRun create
//! checks the quota without charging it.

use cozyplane_api::kinds::{FieldError, FieldErrorType, KindInfo};
use cozyplane_store::{ListOptions, StoreError};
use serde_json::{json, Map, Value};

use crate::keys;
use crate::registry::{self, KindEntry, Registry};
use crate::status::{self, ApiError};

/// How often a charge or give-back retries a lost compare-and-swap. Each
/// round at least one contender wins, so this bounds how many creates may
/// race on one quota at once before one answers 409 Conflict.
const MAX_QUOTA_RETRIES: usize = 256;

/// The quota resource name counting objects of `kind`:
/// `count/vpcs.sdn.cozystack.io`, or `count/pods` for the core group.
pub fn count_resource(kind: &KindInfo) -> String {
    format!("count/{}", status::qualified(kind.group, kind.plural))
}

/// A non-negative integer quantity (`"5"` or `5`); count quotas take no
/// fractions or suffixes.
fn count_quantity(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// `validate_create` of ResourceQuota: every `count/…` key of `spec.hard`
/// must be a non-negative integer.
pub fn validate_quota(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(hard) = obj.pointer("/spec/hard").and_then(Value::as_object) else {
        return errs;
    };
    for (k, v) in hard {
        if k.starts_with("count/") && count_quantity(v).is_none() {
            errs.push(FieldError::new(
                FieldErrorType::Invalid,
                format!("spec.hard[{k}]"),
                format!("Invalid value: {v}: must be a non-negative integer"),
            ));
        }
    }
    errs
}

/// The quotas a create charged: their storage keys, to give back when the
/// create fails.
#[derive(Debug, Default)]
#[must_use = "a charge must be given back when the create fails"]
pub struct Charge {
    keys: Vec<String>,
    resource: String,
}

/// What one attempt on one quota decided.
enum Step {
    /// The quota was written (or needs no write): go on.
    Done,
    /// The quota is gone or does not limit this resource.
    Skip,
    /// Another write won the compare-and-swap: read again.
    Retry,
}

impl Registry {
    /// The served ResourceQuota kind, if any (standalone mode).
    fn quota_kind(&self) -> Option<std::sync::Arc<KindEntry>> {
        self.find("", "v1", "resourcequotas")
    }

    /// The storage keys of the quotas in `namespace`.
    async fn quota_keys(
        &self,
        quota: &KindEntry,
        namespace: &str,
    ) -> Result<Vec<String>, ApiError> {
        let opts = ListOptions {
            prefix: keys::collection_prefix(&quota.info, Some(namespace)),
            ..ListOptions::default()
        };
        let list = self
            .store()
            .list(&opts)
            .await
            .map_err(ApiError::from_store)?;
        Ok(list.items.into_iter().map(|kv| kv.key).collect())
    }

    /// Charge one object of `kind` in `namespace` to every quota that limits
    /// it (403 Forbidden "exceeded quota" when one is full). With `dry_run`
    /// nothing is written. Give the [`Charge`] back with
    /// [`Registry::quota_release`] when the create fails.
    pub(crate) async fn quota_charge(
        &self,
        kind: &KindEntry,
        namespace: Option<&str>,
        name: &str,
        dry_run: bool,
    ) -> Result<Charge, ApiError> {
        let resource = count_resource(&kind.info);
        let mut charge = Charge {
            keys: Vec::new(),
            resource,
        };
        let (Some(quota), Some(ns), true) = (self.quota_kind(), namespace, kind.info.namespaced)
        else {
            return Ok(charge);
        };
        for key in self.quota_keys(&quota, ns).await? {
            let mut attempts = 0;
            loop {
                attempts += 1;
                if attempts > MAX_QUOTA_RETRIES {
                    self.quota_release(charge).await;
                    return Err(ApiError::conflict(
                        kind.info.group,
                        kind.info.plural,
                        name,
                        "too many concurrent quota updates; please try again",
                    ));
                }
                match self
                    .charge_one(kind, ns, name, &key, &charge.resource, dry_run)
                    .await
                {
                    Ok(Step::Done) => {
                        if !dry_run {
                            charge.keys.push(key);
                        }
                        break;
                    }
                    Ok(Step::Skip) => break,
                    Ok(Step::Retry) => tokio::task::yield_now().await,
                    Err(e) => {
                        self.quota_release(charge).await;
                        return Err(e);
                    }
                }
            }
        }
        Ok(charge)
    }

    /// One compare-and-swap attempt to add 1 to `resource` on the quota at
    /// `key`.
    async fn charge_one(
        &self,
        kind: &KindEntry,
        namespace: &str,
        name: &str,
        key: &str,
        resource: &str,
        dry_run: bool,
    ) -> Result<Step, ApiError> {
        let Some(kv) = self.store().get(key).await.map_err(ApiError::from_store)? else {
            return Ok(Step::Skip);
        };
        let mut quota = registry::decode(&kv)?;
        let Some(hard) = quota
            .pointer("/spec/hard")
            .and_then(|h| h.get(resource))
            .and_then(count_quantity)
        else {
            return Ok(Step::Skip);
        };
        let used = match quota
            .pointer("/status/used")
            .and_then(|u| u.get(resource))
            .and_then(count_quantity)
        {
            Some(u) => u,
            None => {
                let prefix = keys::collection_prefix(&kind.info, Some(namespace));
                self.store()
                    .count(&prefix)
                    .await
                    .map_err(ApiError::from_store)?
            }
        };
        if used.saturating_add(1) > hard {
            let quota_name = crate::meta::meta_str(&quota, "name").unwrap_or("");
            return Err(ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: exceeded quota: {quota_name}, requested: {resource}=1, used: {resource}={used}, limited: {resource}={hard}",
                status::qualified(kind.info.group, kind.info.plural),
            ))
            .with_details(kind.info.group, kind.info.plural, name));
        }
        if dry_run {
            return Ok(Step::Done);
        }
        set_used(&mut quota, resource, used + 1);
        self.write_quota(key, &quota, kv.mod_revision).await
    }

    /// A ResourceQuota was just created at `key`: fill its `status` (hard
    /// mirrored, used counted for every `count/…` key of a served kind), as
    /// kube's quota controller does shortly after, so `kubectl describe
    /// quota` shows usage before the first charge. Best effort: keys a
    /// concurrent charge already set are left alone, and on failure the
    /// first charge counts instead.
    pub(crate) async fn quota_created(&self, kind: &KindEntry, key: &str) {
        match self.quota_kind() {
            Some(q) if q.info.plural == kind.info.plural && q.info.group == kind.info.group => {}
            _ => return,
        }
        for _ in 0..MAX_QUOTA_RETRIES {
            match self.fill_status(key).await {
                Ok(Step::Retry) => tokio::task::yield_now().await,
                Ok(Step::Done | Step::Skip) => return,
                Err(e) => {
                    tracing::warn!(%key, error = %e.message, "quota: cannot fill the status of a new quota; the first charge counts instead");
                    return;
                }
            }
        }
    }

    async fn fill_status(&self, key: &str) -> Result<Step, ApiError> {
        let Some(kv) = self.store().get(key).await.map_err(ApiError::from_store)? else {
            return Ok(Step::Skip);
        };
        let mut quota = registry::decode(&kv)?;
        let namespace = crate::meta::meta_str(&quota, "namespace")
            .unwrap_or("")
            .to_string();
        let hard: Vec<String> = quota
            .pointer("/spec/hard")
            .and_then(Value::as_object)
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default();
        let mut counted = Vec::new();
        for resource in hard {
            if quota
                .pointer("/status/used")
                .and_then(|u| u.get(&resource))
                .is_some()
            {
                continue;
            }
            let Some(counted_kind) = self
                .kinds()
                .iter()
                .find(|k| k.info.namespaced && count_resource(&k.info) == resource)
            else {
                continue;
            };
            let prefix = keys::collection_prefix(&counted_kind.info, Some(&namespace));
            let n = self
                .store()
                .count(&prefix)
                .await
                .map_err(ApiError::from_store)?;
            counted.push((resource, n));
        }
        if counted.is_empty() {
            return Ok(Step::Skip);
        }
        for (resource, n) in counted {
            set_used(&mut quota, &resource, n);
        }
        self.write_quota(key, &quota, kv.mod_revision).await
    }

    /// Write a quota back guarded by its revision.
    async fn write_quota(
        &self,
        key: &str,
        quota: &Value,
        rev: cozyplane_store::Revision,
    ) -> Result<Step, ApiError> {
        let raw = registry::encode(quota)?;
        match self.store().update(key, raw, rev).await {
            Ok(_) => Ok(Step::Done),
            Err(StoreError::Conflict { .. }) => Ok(Step::Retry),
            Err(StoreError::NotFound { .. }) => Ok(Step::Skip),
            Err(e) => Err(ApiError::from_store(e)),
        }
    }

    /// Give back a charge (the create it was for failed). Best effort: a
    /// failure is logged and leaves the ledger one too high.
    pub(crate) async fn quota_release(&self, charge: Charge) {
        for key in &charge.keys {
            self.give_back(key, &charge.resource).await;
        }
    }

    /// An object of `kind` in `namespace` left the store: give one back to
    /// every quota of the namespace that counts it.
    pub(crate) async fn quota_removed(&self, kind: &KindEntry, namespace: Option<&str>) {
        let (Some(quota), Some(ns), true) = (self.quota_kind(), namespace, kind.info.namespaced)
        else {
            return;
        };
        let resource = count_resource(&kind.info);
        match self.quota_keys(&quota, ns).await {
            Ok(keys) => {
                for key in keys {
                    self.give_back(&key, &resource).await;
                }
            }
            Err(e) => {
                tracing::warn!(namespace = ns, %resource, error = %e.message, "quota: cannot list the quotas to give back a removed object");
            }
        }
    }

    /// Subtract 1 from `resource` in the ledger of the quota at `key`
    /// (never below 0; a quota with no ledger for it is left alone: its
    /// first charge counts).
    async fn give_back(&self, key: &str, resource: &str) {
        for _ in 0..MAX_QUOTA_RETRIES {
            let step = async {
                let Some(kv) = self.store().get(key).await.map_err(ApiError::from_store)? else {
                    return Ok(Step::Skip);
                };
                let mut quota = registry::decode(&kv)?;
                let Some(used) = quota
                    .pointer("/status/used")
                    .and_then(|u| u.get(resource))
                    .and_then(count_quantity)
                else {
                    return Ok(Step::Skip);
                };
                set_used(&mut quota, resource, used.saturating_sub(1));
                self.write_quota(key, &quota, kv.mod_revision).await
            };
            match step.await {
                Ok(Step::Done | Step::Skip) => return,
                Ok(Step::Retry) => tokio::task::yield_now().await,
                Err(e) => {
                    tracing::warn!(%key, %resource, error = %e.message, "quota: cannot give back a charge; the ledger stays one too high");
                    return;
                }
            }
        }
        tracing::warn!(%key, %resource, "quota: too many concurrent updates to give back a charge; the ledger stays one too high");
    }
}

/// Set `status.used[resource]` to `used` and mirror `spec.hard` into
/// `status.hard`, as kube's quota controller does.
fn set_used(quota: &mut Value, resource: &str, used: u64) {
    let hard = quota.pointer("/spec/hard").cloned().unwrap_or(json!({}));
    let Some(o) = quota.as_object_mut() else {
        return;
    };
    let status = o
        .entry("status")
        .or_insert_with(|| Value::Object(Map::new()));
    if !status.is_object() {
        *status = Value::Object(Map::new());
    }
    let Some(s) = status.as_object_mut() else {
        return;
    };
    s.insert("hard".into(), hard);
    let used_map = s.entry("used").or_insert_with(|| Value::Object(Map::new()));
    if !used_map.is_object() {
        *used_map = Value::Object(Map::new());
    }
    if let Some(u) = used_map.as_object_mut() {
        u.insert(resource.into(), Value::String(used.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_follow_kube() {
        let pods = crate::core_kinds::pods();
        assert_eq!(count_resource(&pods), "count/pods");
        let np = crate::core_kinds::network_policies();
        assert_eq!(
            count_resource(&np),
            "count/networkpolicies.networking.k8s.io"
        );
    }

    #[test]
    fn count_hard_values_must_be_integers() {
        let q = json!({"spec": {"hard": {"count/vpcs.sdn.cozystack.io": "1.5", "cpu": "500m", "count/pods": "3"}}});
        let errs = validate_quota(&q);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.hard[count/vpcs.sdn.cozystack.io]");
    }

    #[test]
    fn used_is_written_with_hard_mirrored() {
        let mut q =
            json!({"spec": {"hard": {"count/pods": "3"}}, "status": {"used": {"cpu": "1"}}});
        set_used(&mut q, "count/pods", 2);
        assert_eq!(
            q["status"],
            json!({"hard": {"count/pods": "3"}, "used": {"cpu": "1", "count/pods": "2"}})
        );
    }
}
