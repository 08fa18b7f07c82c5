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
//! # When a pass runs
//! After VPC, VNIClaim, Port or VPCBinding watch events (coalesced over a
//! short debounce; the watches only wake the loop, they decide nothing), and
//! at least every `resync` — only while this replica is the leader.

pub mod decide;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::sdn::{ObjectRef, VNIClaimSpec, VPCStatus};
use cozyplane_api::{Port, VNIClaim, VPCBinding, VPC};
use cozyplane_errors::Chain;
use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::Client;
use serde_json::json;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::leader::Leadership;
use crate::metrics::Metrics;
use decide::{plan, Action, ClaimView, VpcView, FINALIZER};

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

/// Wakes `notify` on every event of a watch (errors are retried with
/// kube-rs' default backoff).
async fn wake_on<S, K>(stream: S, notify: Arc<Notify>, what: &'static str)
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    futures::pin_mut!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(_) => notify.notify_one(),
            Err(e) => tracing::warn!(error = %Chain(&e), watch = what, "watch failed; retrying"),
        }
    }
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
            tokio::spawn(wake_on(
                watcher(self.vpcs.clone(), cfg()).default_backoff(),
                Arc::clone(&notify),
                "vpcs",
            )),
            tokio::spawn(wake_on(
                watcher(self.claims.clone(), cfg()).default_backoff(),
                Arc::clone(&notify),
                "vniclaims",
            )),
            tokio::spawn(wake_on(
                watcher(Api::<Port>::all(self.client.clone()), cfg()).default_backoff(),
                Arc::clone(&notify),
                "ports",
            )),
            tokio::spawn(wake_on(
                watcher(Api::<VPCBinding>::all(self.client.clone()), cfg()).default_backoff(),
                Arc::clone(&notify),
                "vpcbindings",
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
        let vpcs: Vec<VpcView> = self
            .vpcs
            .list(&lp)
            .await?
            .items
            .iter()
            .filter_map(VpcView::of)
            .collect();
        let actions = plan(&vpcs, &claims);
        let acted = !actions.is_empty();
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
        Ok(acted)
    }

    async fn execute(&self, a: &Action) -> Result<(), kube::Error> {
        match a {
            Action::AddFinalizer(v) => {
                let api: Api<VPC> = Api::namespaced(self.client.clone(), &v.namespace);
                let patch = json!({"metadata": {"resourceVersion": v.resource_version,
                    "finalizers": [FINALIZER]}});
                // A JSON merge patch replaces the list: add ours to what is there.
                let live = api.get(&v.name).await?;
                let mut fins = live.metadata.finalizers.unwrap_or_default();
                if !fins.iter().any(|f| f == FINALIZER) {
                    fins.push(FINALIZER.to_string());
                }
                let mut patch = patch;
                patch["metadata"]["finalizers"] = json!(fins);
                api.patch(
                    &v.name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await?;
                Ok(())
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
        let live = api.get(&v.name).await?;
        if live.metadata.uid.as_deref() != Some(v.uid.as_str()) {
            return Ok(());
        }
        let fins: Vec<String> = live
            .metadata
            .finalizers
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != FINALIZER)
            .collect();
        let patch = json!({"metadata": {"resourceVersion": live.metadata.resource_version,
            "finalizers": fins}});
        api.patch(
            &v.name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
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

/// Resolves once the shutdown flag is true or its sender is gone.
async fn wait_true(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}
