//! The VPC controller: every VPC gets a VNI of its own, shows it in
//! `status.vni` with phase Ready, and keeps it until the VPC is deleted and
//! nothing uses it any more.
//!
//! # Allocation by claim, from live reads (lesson 28)
//! A VNI is held by a `VNIClaim` named `vni-<n>` whose `spec.vpcUID` is the
//! VPC's UID. Creating the claim is the allocation: the API server refuses a
//! second object of the same name, so two controllers (a leadership handover,
//! a restart, a split brain) can never give one VNI to two VPCs, and
//! `status.vni` only ever names a VNI the VPC holds ([`decide::plan`]). Every
//! pass reads both lists live (never a watch cache) — the claims first, then
//! the VPCs, so a claim made for a VPC newer than the VPC list is not in the
//! claim list either and is never taken for an orphan.
//!
//! # Deletion
//! Each VPC carries the finalizer [`decide::FINALIZER`], added before a claim
//! is made. A VPC being deleted keeps its VNI while any Port (a pod's address
//! in it) or VPCBinding (a namespace's right to attach to it) references it:
//! its `Ready` condition says so (reason `InUse`). Once none does, its claims
//! are released and the finalizer removed.
//!
//! # Revocation
//! A pod's Port needs a live VPCBinding of the pod's namespace to the Port's
//! VPC; each pass deletes the Ports none grants (Ports listed live before
//! the bindings, [`decide::ungranted_ports`]) — the agents then drop those
//! pods' datapath entries. Every binding carries the finalizer
//! [`decide::BINDING_FINALIZER`], removed only in a pass that has already
//! severed what the binding alone granted, so the binding outlives its
//! Ports; the grant check also catches a binding deleted before it got the
//! finalizer. Re-creating the binding reconnects nothing: a severed pod has
//! no Port, and gets one only by a new attach.
//!
//! # Peerings
//! Each pass also writes every VPCPeering half's status from the VPCs it
//! listed and a live list of the halves ([`decide::peering_status`]): phase
//! Ready, with the peer's VNI, only while both halves reference each other,
//! both VPCs are Ready and their CIDRs are disjoint; conditions
//! `PeerMatched`, `VPCReady`, `PeerVPCReady`, `CIDRsDisjoint` say which part
//! is missing. Status reports; it grants nothing (tenants cannot write it,
//! and the datapath is to decide from the halves themselves).
//!
//! # When a pass runs
//! After VPC, VNIClaim, Port, VPCBinding or VPCPeering watch events (coalesced over a
//! short debounce; the watches only wake the loop, they decide nothing), and
//! at least every `resync` — only while this replica is the leader.

pub mod decide;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::sdn::{ObjectRef, VNIClaimSpec, VPCPeeringStatus, VPCStatus};
use cozyplane_api::{Port, VNIClaim, VPCBinding, VPCPeering, VPC};
use cozyplane_errors::Chain;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::Client;
use serde_json::json;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::gc::{drive, wait_true};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use decide::{
    peering_status, plan, plan_bindings, ungranted_ports, Action, BindingAction, BindingView,
    ClaimView, PeerVpc, PeeringView, PortView, VpcView, BINDING_FINALIZER, FINALIZER,
};

/// VPC controller timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VpcConfig {
    /// A full pass runs at least this often.
    pub resync: Duration,
    /// Watch events within this window are coalesced into one pass.
    pub debounce: Duration,
}

impl Default for VpcConfig {
    fn default() -> Self {
        Self {
            resync: Duration::from_secs(60),
            debounce: Duration::from_millis(100),
        }
    }
}

/// The VPC worker.
pub struct Vpcs {
    client: Client,
    vpcs: Api<VPC>,
    claims: Api<VNIClaim>,
    config: VpcConfig,
    metrics: Arc<Metrics>,
    leadership: Leadership,
}

impl Vpcs {
    /// A VPC worker over `client`.
    pub fn new(
        client: Client,
        config: VpcConfig,
        metrics: Arc<Metrics>,
        leadership: Leadership,
    ) -> Self {
        Self {
            vpcs: Api::all(client.clone()),
            claims: Api::all(client.clone()),
            client,
            config,
            metrics,
            leadership,
        }
    }

    /// Runs until `shutdown` flips to true (or its sender is dropped).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        use kube::runtime::WatchStreamExt;
        let notify = Arc::new(Notify::new());
        let cfg = watcher::Config::default;
        let tasks = [
            tokio::spawn(drive(
                watcher(self.vpcs.clone(), cfg()).default_backoff(),
                Arc::clone(&notify),
                "vpcs",
            )),
            tokio::spawn(drive(
                watcher(self.claims.clone(), cfg()).default_backoff(),
                Arc::clone(&notify),
                "vniclaims",
            )),
            tokio::spawn(drive(
                watcher(Api::<Port>::all(self.client.clone()), cfg()).default_backoff(),
                Arc::clone(&notify),
                "ports",
            )),
            tokio::spawn(drive(
                watcher(Api::<VPCBinding>::all(self.client.clone()), cfg()).default_backoff(),
                Arc::clone(&notify),
                "vpcbindings",
            )),
            tokio::spawn(drive(
                watcher(Api::<VPCPeering>::all(self.client.clone()), cfg()).default_backoff(),
                Arc::clone(&notify),
                "vpcpeerings",
            )),
        ];
        let mut leadership = self.leadership.clone();
        let mut wake_at = Instant::now();
        loop {
            tokio::select! {
                _ = wait_true(&mut shutdown) => break,
                _ = tokio::time::sleep_until(wake_at) => {}
                _ = notify.notified() => {
                    tokio::time::sleep(self.config.debounce).await;
                }
                _ = leadership.changed() => {}
            }
            wake_at = Instant::now() + self.config.resync;
            if !self.leadership.is_leader() {
                continue;
            }
            match self.pass().await {
                // Something was written or refused: look again soon, the
                // watch will also wake us.
                Ok(true) => wake_at = Instant::now() + self.config.debounce,
                Ok(false) => {}
                Err(e) => {
                    Metrics::inc(&self.metrics.vpc_errors);
                    tracing::warn!(error = %Chain(&e), "VPC pass failed; retrying");
                    wake_at = Instant::now() + Duration::from_secs(1);
                }
            }
        }
        for t in tasks {
            t.abort();
        }
    }

    /// One pass: live lists, [`plan`], execute. `Ok(true)` when it acted
    /// (or lost a race) and another pass should follow.
    pub async fn pass(&self) -> Result<bool, kube::Error> {
        let lp = ListParams::default();
        let claims: Vec<ClaimView> = self
            .claims
            .list(&lp)
            .await?
            .items
            .iter()
            .filter_map(ClaimView::of)
            .collect();
        let listed = self.vpcs.list(&lp).await?.items;
        let vpcs: Vec<VpcView> = listed.iter().filter_map(VpcView::of).collect();
        let actions = plan(&vpcs, &claims);
        let mut acted = !actions.is_empty();
        for a in actions {
            if !self.leadership.is_leader() {
                return Ok(true);
            }
            if let Err(e) = self.execute(&a).await {
                match &e {
                    kube::Error::Api(s) if s.is_conflict() || s.is_not_found() => {
                        tracing::debug!(action = ?a, error = %Chain(&e), "lost a race; next pass");
                    }
                    _ => return Err(e),
                }
            }
        }
        acted |= self.peerings(&listed).await?;
        acted |= self.bindings().await?;
        Ok(acted)
    }

    /// Revocation: Ports no live binding grants are deleted, then every
    /// live binding gets [`BINDING_FINALIZER`] and every deleting one loses
    /// it — so a binding is gone only after what it alone granted. Ports are
    /// listed before the bindings ([`ungranted_ports`]). `Ok(true)` when it
    /// acted.
    async fn bindings(&self) -> Result<bool, kube::Error> {
        let ports_api: Api<Port> = Api::all(self.client.clone());
        let ports: Vec<PortView> = ports_api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|p| {
                Some(PortView {
                    name: p.metadata.name?,
                    uid: p.metadata.uid?,
                    // Ports of no pod (none yet) are not a binding's to revoke.
                    pod_namespace: p.spec.pod_namespace.filter(|n| !n.is_empty())?,
                    vpc: (
                        p.spec.vpc_ref.namespace.unwrap_or_default(),
                        p.spec.vpc_ref.name,
                    ),
                })
            })
            .collect();
        let all: Api<VPCBinding> = Api::all(self.client.clone());
        let views: Vec<BindingView> = all
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|b| {
                let ns = b.metadata.namespace.clone()?;
                let vpc_ns = b
                    .spec
                    .vpc_ref
                    .namespace
                    .clone()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| ns.clone());
                Some(BindingView {
                    vpc: (vpc_ns, b.spec.vpc_ref.name.clone()),
                    name: b.metadata.name.clone()?,
                    uid: b.metadata.uid.clone()?,
                    resource_version: b.metadata.resource_version.clone().unwrap_or_default(),
                    deleting: b.metadata.deletion_timestamp.is_some(),
                    has_finalizer: b
                        .metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| f.iter().any(|x| x == BINDING_FINALIZER)),
                    namespace: ns,
                })
            })
            .collect();
        let mut acted = false;
        for p in ungranted_ports(&ports, &views) {
            if !self.leadership.is_leader() {
                return Ok(true);
            }
            acted = true;
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(p.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match ports_api.delete(&p.name, &dp).await {
                Ok(_) => {
                    tracing::info!(port = %p.name, pod_namespace = %p.pod_namespace, "severed: no binding grants its VPC")
                }
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        for a in plan_bindings(&views) {
            if !self.leadership.is_leader() {
                return Ok(true);
            }
            acted = true;
            let (b, op) = match &a {
                BindingAction::AddFinalizer(b) => (b, Finalizers::Add),
                BindingAction::RemoveFinalizer(b) => (b, Finalizers::Remove),
            };
            let api: Api<VPCBinding> = Api::namespaced(self.client.clone(), &b.namespace);
            match set_finalizer(&api, &b.name, &b.uid, BINDING_FINALIZER, op).await {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(acted)
    }

    /// Writes every peering half's status from the VPCs just listed and a
    /// live list of the halves. `Ok(true)` when one was written.
    async fn peerings(&self, listed: &[VPC]) -> Result<bool, kube::Error> {
        let all: Api<VPCPeering> = Api::all(self.client.clone());
        let halves = all.list(&ListParams::default()).await?.items;
        let views: Vec<PeeringView> = halves
            .iter()
            .filter_map(|h| {
                Some(PeeringView {
                    namespace: h.metadata.namespace.clone()?,
                    name: h.metadata.name.clone()?,
                    vpc: h.spec.vpc_ref.name.clone(),
                    peer_namespace: h.spec.peer_ref.namespace.clone(),
                    peer: h.spec.peer_ref.name.clone(),
                })
            })
            .collect();
        let vpcs: BTreeMap<(String, String), PeerVpc> = listed
            .iter()
            .filter_map(|v| {
                let view = VpcView::of(v)?;
                let peer = PeerVpc {
                    vni: view.vni,
                    ready: view.ready && !view.deleting,
                    cidrs: v.spec.cidrs.clone(),
                };
                Some(((view.namespace, view.name), peer))
            })
            .collect();
        let mut wrote = false;
        for (h, view) in halves.iter().zip(&views) {
            let want = peering_status(view, &vpcs, &views);
            let prior = h.status.clone().unwrap_or_default();
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let conditions: Vec<Condition> = want
                .conditions
                .iter()
                .map(|(t, ok, reason, message)| {
                    let status = if *ok { "True" } else { "False" };
                    let kept = prior
                        .conditions
                        .iter()
                        .find(|c| c.type_ == *t && c.status == status)
                        .map(|c| c.last_transition_time.clone());
                    Condition {
                        type_: (*t).into(),
                        status: status.into(),
                        reason: (*reason).into(),
                        message: message.clone(),
                        observed_generation: h.metadata.generation,
                        last_transition_time: kept.unwrap_or_else(|| now.clone()),
                    }
                })
                .collect();
            let status = VPCPeeringStatus {
                phase: Some(if want.ready { "Ready" } else { "Pending" }.into()),
                peer_vni: want.peer_vni.and_then(|n| i32::try_from(n).ok()),
                conditions,
            };
            let same = prior.phase == status.phase
                && prior.peer_vni == status.peer_vni
                && prior.conditions.len() == status.conditions.len()
                && prior
                    .conditions
                    .iter()
                    .zip(&status.conditions)
                    .all(|(a, b)| {
                        (&a.type_, &a.status, &a.reason, &a.message)
                            == (&b.type_, &b.status, &b.reason, &b.message)
                    });
            if same || !self.leadership.is_leader() {
                continue;
            }
            let mut new = h.clone();
            new.status = Some(status);
            let api: Api<VPCPeering> = Api::namespaced(self.client.clone(), &view.namespace);
            match api
                .replace_status(&view.name, &PostParams::default(), &new)
                .await
            {
                Ok(_) => {
                    wrote = true;
                    tracing::info!(peering = %format!("{}/{}", view.namespace, view.name), ready = want.ready, "peering status");
                }
                Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => wrote = true,
                Err(e) => return Err(e),
            }
        }
        Ok(wrote)
    }

    async fn execute(&self, a: &Action) -> Result<(), kube::Error> {
        match a {
            Action::AddFinalizer(v) => {
                let api: Api<VPC> = Api::namespaced(self.client.clone(), &v.namespace);
                set_finalizer(&api, &v.name, &v.uid, FINALIZER, Finalizers::Add).await
            }
            Action::Claim { vpc, vni } => {
                let claim = VNIClaim {
                    metadata: ObjectMeta {
                        name: Some(cozyplane_api::names::vni_claim_name(*vni)),
                        ..ObjectMeta::default()
                    },
                    spec: VNIClaimSpec {
                        vpc_ref: ObjectRef {
                            namespace: vpc.namespace.clone(),
                            name: vpc.name.clone(),
                        },
                        vpc_uid: vpc.uid.clone(),
                    },
                };
                match self.claims.create(&PostParams::default(), &claim).await {
                    Ok(_) => {
                        Metrics::inc(&self.metrics.vni_claims);
                        tracing::info!(vpc = %vpc.key(), vni, "claimed a VNI");
                        Ok(())
                    }
                    // Another writer holds it: the next pass picks another.
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        Metrics::inc(&self.metrics.vni_claim_conflicts);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Action::SetReady { vpc, vni } => {
                self.write_status(
                    vpc,
                    Some(*vni),
                    "True",
                    "VNIAssigned",
                    &format!("VNI {vni}"),
                )
                .await
            }
            Action::Release(c) => self.release(c).await,
            Action::Finalize { vpc, claims } => self.finalize(vpc, claims).await,
        }
    }

    async fn release(&self, c: &ClaimView) -> Result<(), kube::Error> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(c.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.claims.delete(&c.name, &dp).await {
            Ok(_) => {
                tracing::info!(claim = %c.name, "released a VNI");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes status (phase and the Ready condition), guarded by the
    /// resourceVersion the decision was made on.
    async fn write_status(
        &self,
        v: &VpcView,
        vni: Option<u32>,
        ready: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let api: Api<VPC> = Api::namespaced(self.client.clone(), &v.namespace);
        let mut live = api.get_status(&v.name).await?;
        if live.metadata.uid.as_deref() != Some(v.uid.as_str()) {
            return Ok(());
        }
        let status = live.status.take().unwrap_or_default();
        let prior = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .cloned();
        let changed = prior
            .as_ref()
            .is_none_or(|p| p.status != ready || p.reason != reason);
        let condition = Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: live.metadata.generation,
            last_transition_time: match (&prior, changed) {
                (Some(p), false) => p.last_transition_time.clone(),
                _ => Time(k8s_openapi::jiff::Timestamp::now()),
            },
        };
        let vni_i32 = vni.and_then(|n| i32::try_from(n).ok());
        let new = VPCStatus {
            vni: vni_i32.or(status.vni),
            phase: Some(if ready == "True" { "Ready" } else { "Pending" }.into()),
            conditions: status
                .conditions
                .iter()
                .filter(|c| c.type_ != "Ready")
                .cloned()
                .chain(std::iter::once(condition))
                .collect(),
        };
        if !changed && status.vni == new.vni && status.phase == new.phase {
            return Ok(());
        }
        live.status = Some(new);
        api.replace_status(&v.name, &PostParams::default(), &live)
            .await?;
        Ok(())
    }

    async fn finalize(&self, v: &VpcView, claims: &[ClaimView]) -> Result<(), kube::Error> {
        let (ports, bindings) = self.users(v).await?;
        if ports + bindings > 0 {
            let why = format!(
                "deletion waits: {ports} Port(s) and {bindings} VPCBinding(s) still reference this VPC"
            );
            return self.write_status(v, None, "False", "InUse", &why).await;
        }
        for c in claims {
            self.release(c).await?;
        }
        let api: Api<VPC> = Api::namespaced(self.client.clone(), &v.namespace);
        set_finalizer(&api, &v.name, &v.uid, FINALIZER, Finalizers::Remove).await?;
        tracing::info!(vpc = %v.key(), "VPC released");
        Ok(())
    }

    /// How many Ports and VPCBindings reference the VPC (live reads).
    async fn users(&self, v: &VpcView) -> Result<(usize, usize), kube::Error> {
        let by_ref = format!(
            "spec.vpcRef.namespace={},spec.vpcRef.name={}",
            v.namespace, v.name
        );
        let ports = Api::<Port>::all(self.client.clone())
            .list_metadata(&ListParams::default().fields(&by_ref))
            .await?
            .items
            .len();
        // A binding's vpcRef.namespace defaults to its own namespace.
        let named = format!("spec.vpcRef.name={}", v.name);
        let bindings = Api::<VPCBinding>::all(self.client.clone())
            .list(&ListParams::default().fields(&named))
            .await?
            .items
            .iter()
            .filter(|b| {
                let ns = b
                    .spec
                    .vpc_ref
                    .namespace
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .or(b.metadata.namespace.as_deref());
                ns == Some(v.namespace.as_str())
            })
            .count();
        Ok((ports, bindings))
    }
}

/// VNIs held, by VPC key, as listed live (for tests and diagnostics).
pub async fn held_vnis(client: &Client) -> Result<BTreeMap<String, Vec<u32>>, kube::Error> {
    let claims: Api<VNIClaim> = Api::all(client.clone());
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for c in claims.list(&ListParams::default()).await?.items {
        if let Some(view) = ClaimView::of(&c) {
            out.entry(format!(
                "{}/{}",
                c.spec.vpc_ref.namespace, c.spec.vpc_ref.name
            ))
            .or_default()
            .push(view.vni);
        }
    }
    Ok(out)
}

/// Whether to add or remove a finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finalizers {
    Add,
    Remove,
}

/// Adds or removes `finalizer` on the live object `name` (if it is still
/// the one with `uid`), with a merge patch guarded by the resourceVersion
/// just read: a concurrent write makes it a 409 for the next pass.
async fn set_finalizer<K>(
    api: &Api<K>,
    name: &str,
    uid: &str,
    finalizer: &str,
    op: Finalizers,
) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + for<'de> k8s_openapi::serde::Deserialize<'de> + std::fmt::Debug,
{
    let live = api.get(name).await?;
    let meta = live.meta();
    if meta.uid.as_deref() != Some(uid) {
        return Ok(());
    }
    let mut fins = meta.finalizers.clone().unwrap_or_default();
    let has = fins.iter().any(|f| f == finalizer);
    match op {
        Finalizers::Add if !has => fins.push(finalizer.to_string()),
        Finalizers::Remove if has => fins.retain(|f| f != finalizer),
        _ => return Ok(()),
    }
    let patch = json!({"metadata": {"resourceVersion": meta.resource_version, "finalizers": fins}});
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}
