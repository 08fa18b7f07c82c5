//! Claim garbage collection: FabricIPs and VPC Ports whose pod is gone, or
//! whose pod was re-created with another UID, are deleted. The CNI DEL and
//! the agent's CNI GC release them on a live node; this is the backstop
//! for a node that died (or was deleted) with its pods' claims.
//!
//! # Cache to find, live read to decide (lesson 28)
//! Pods, FabricIPs and Ports are mirrored by watch caches (kube-rs reflectors), and
//! [`decide::garbage`] picks candidates from them. The caches may lag: a pod
//! created a moment ago may not be in the cache yet. So every candidate is
//! confirmed with a live `GET` of its pod, and deleted with two
//! preconditions on the claim — its UID (a claim re-made for the same
//! address is a different object) and its resourceVersion (a claim changed
//! since we judged it is judged again next pass).
//!
//! # Grace period
//! The CNI ADD claims an address before the kubelet has necessarily made the
//! pod visible to every watcher, and a claim can outlive a deleted pod for a
//! moment while DEL runs. Claims younger than `grace` are never judged;
//! a pass is scheduled for the moment the youngest one matures.
//!
//! # When a pass runs
//! After any watch event (coalesced over a short debounce), at the next
//! claim maturity, and at least every `resync` — and only while this
//! replica is the leader, re-checked before every delete.

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::{FabricIP, Port};
use cozyplane_errors::Chain;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::leader::Leadership;
use crate::metrics::Metrics;
use decide::{confirmed, garbage, next_maturity, young, Candidate, PodIndex};

/// GC timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcConfig {
    /// Claims younger than this are never collected.
    pub grace: Duration,
    /// A full pass runs at least this often.
    pub resync: Duration,
    /// Watch events within this window are coalesced into one pass.
    pub debounce: Duration,
}

impl Default for GcConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(60),
            resync: Duration::from_secs(300),
            debounce: Duration::from_secs(1),
        }
    }
}

/// What happened to one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The claim was deleted.
    Deleted,
    /// The live read found the claimant pod: the cache lagged.
    Alive,
    /// The claim changed or was re-created since it was judged.
    Conflict,
    /// Gone already (DEL or another pass won).
    AlreadyGone,
    /// Leadership was lost before the delete.
    NotLeader,
}

/// The GC worker: watch caches plus the live APIs.
pub struct Gc {
    client: Client,
    pods: Api<Pod>,
    claims: Api<FabricIP>,
    ports: Api<Port>,
    config: GcConfig,
    metrics: Arc<Metrics>,
    leadership: Leadership,
}

/// Drives a watch stream forever, waking `notify` on every event. Watch
/// errors are retried with kube-rs' default backoff. (The VPC controller's
/// watches only wake its loop too.)
pub(crate) async fn drive<S, K>(stream: S, notify: Arc<Notify>, what: &'static str)
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

impl Gc {
    /// A GC worker over `client`.
    pub fn new(
        client: Client,
        config: GcConfig,
        metrics: Arc<Metrics>,
        leadership: Leadership,
    ) -> Self {
        Self {
            pods: Api::all(client.clone()),
            claims: Api::all(client.clone()),
            ports: Api::all(client.clone()),
            client,
            config,
            metrics,
            leadership,
        }
    }

    /// Runs until `shutdown` flips to true (or its sender is dropped).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let notify = Arc::new(Notify::new());
        let (pod_store, pod_writer) = reflector::store::<Pod>();
        let (claim_store, claim_writer) = reflector::store::<FabricIP>();
        let pod_stream = watcher(self.pods.clone(), watcher::Config::default())
            .default_backoff()
            .reflect(pod_writer);
        let claim_stream = watcher(self.claims.clone(), watcher::Config::default())
            .default_backoff()
            .reflect(claim_writer);
        let (port_store, port_writer) = reflector::store::<Port>();
        let port_stream = watcher(self.ports.clone(), watcher::Config::default())
            .default_backoff()
            .reflect(port_writer);
        let pods_task = tokio::spawn(drive(pod_stream, Arc::clone(&notify), "pods"));
        let claims_task = tokio::spawn(drive(claim_stream, Arc::clone(&notify), "fabricips"));
        let ports_task = tokio::spawn(drive(port_stream, Arc::clone(&notify), "ports"));

        let synced = async {
            pod_store.wait_until_ready().await.is_ok()
                && claim_store.wait_until_ready().await.is_ok()
                && port_store.wait_until_ready().await.is_ok()
        };
        let go_on = tokio::select! {
            ok = synced => ok,
            _ = wait_true(&mut shutdown) => false,
        };
        if go_on {
            self.metrics
                .caches_synced
                .store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::info!("watch caches synced");
            self.main_loop(
                &pod_store,
                &claim_store,
                &port_store,
                &notify,
                &mut shutdown,
            )
            .await;
        }
        pods_task.abort();
        claims_task.abort();
        ports_task.abort();
    }

    async fn main_loop(
        &self,
        pods: &Store<Pod>,
        claims: &Store<FabricIP>,
        ports: &Store<Port>,
        notify: &Notify,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        let mut leadership = self.leadership.clone();
        let mut wake_at = Instant::now();
        loop {
            tokio::select! {
                _ = wait_true(shutdown) => return,
                _ = tokio::time::sleep_until(wake_at) => {}
                _ = notify.notified() => {
                    // Coalesce a burst of watch events into one pass.
                    tokio::time::sleep(self.config.debounce).await;
                }
                _ = leadership.changed() => {}
            }
            let mut next = Instant::now() + self.config.resync;
            if self.leadership.is_leader() {
                if let Some(mature) = self.pass(pods, claims, ports).await {
                    next = next.min(mature);
                }
            }
            wake_at = next;
        }
    }

    /// One pass over the caches; returns when the next young claim matures.
    pub async fn pass(
        &self,
        pods: &Store<Pod>,
        claims: &Store<FabricIP>,
        ports: &Store<Port>,
    ) -> Option<Instant> {
        let pod_list = pods.state();
        let index = PodIndex::from_pods(pod_list.iter().map(|p| p.as_ref()));
        let now = Timestamp::now();
        let claim_list = claims.state();
        let port_list = ports.state();
        Metrics::set(&self.metrics.claims, claim_list.len() + port_list.len());
        Metrics::set(
            &self.metrics.young_claims,
            young(
                claim_list.iter().map(|c| c.as_ref()),
                now,
                self.config.grace,
            ) + young(port_list.iter().map(|c| c.as_ref()), now, self.config.grace),
        );
        let fabric = garbage(
            claim_list.iter().map(|c| c.as_ref()),
            &index,
            now,
            self.config.grace,
        );
        let leading = self.sweep(&self.claims, &fabric, "FabricIP").await;
        if leading {
            let orphaned = garbage(
                port_list.iter().map(|c| c.as_ref()),
                &index,
                now,
                self.config.grace,
            );
            self.sweep(&self.ports, &orphaned, "Port").await;
        }
        Metrics::inc(&self.metrics.passes);
        let mature = [
            next_maturity(
                claim_list.iter().map(|c| c.as_ref()),
                now,
                self.config.grace,
            ),
            next_maturity(port_list.iter().map(|c| c.as_ref()), now, self.config.grace),
        ]
        .into_iter()
        .flatten()
        .min()?;
        let wait = now.duration_until(mature).unsigned_abs();
        // Land just after maturity, so the claim is past the boundary.
        Some(Instant::now() + wait + Duration::from_millis(50))
    }

    /// Collects each candidate of one kind; false when leadership was lost.
    async fn sweep<C>(&self, api: &Api<C>, candidates: &[Candidate], kind: &str) -> bool
    where
        C: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
    {
        for candidate in candidates {
            match self.collect_in(api, candidate, kind).await {
                Ok(Outcome::NotLeader) => return false,
                Ok(outcome) => tracing::debug!(kind, claim = %candidate.name, ?outcome, "gc"),
                Err(e) => {
                    Metrics::inc(&self.metrics.errors);
                    tracing::warn!(kind, claim = %candidate.name, error = %Chain(&e), "gc of a claim failed; retrying next pass");
                }
            }
        }
        true
    }

    /// [`Gc::collect_in`] for a FabricIP.
    pub async fn collect(&self, candidate: &Candidate) -> Result<Outcome, kube::Error> {
        self.collect_in(&self.claims, candidate, "FabricIP").await
    }

    /// [`Gc::collect_in`] for a Port.
    pub async fn collect_port(&self, candidate: &Candidate) -> Result<Outcome, kube::Error> {
        self.collect_in(&self.ports, candidate, "Port").await
    }

    /// Confirms one candidate with a live pod read and deletes it from
    /// `api` with UID and resourceVersion preconditions.
    pub async fn collect_in<C>(
        &self,
        api: &Api<C>,
        candidate: &Candidate,
        kind: &str,
    ) -> Result<Outcome, kube::Error>
    where
        C: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &candidate.pod_namespace);
        let live = pods.get_opt(&candidate.pod_name).await?;
        let live_uid = live.as_ref().and_then(|p| p.metadata.uid.as_deref());
        if !confirmed(candidate, live_uid) {
            Metrics::inc(&self.metrics.saved_by_live_read);
            return Ok(Outcome::Alive);
        }
        if !self.leadership.is_leader() {
            return Ok(Outcome::NotLeader);
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(candidate.uid.clone()),
                resource_version: Some(candidate.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&candidate.name, &dp).await {
            Ok(_) => {
                Metrics::inc(&self.metrics.deletions);
                tracing::info!(
                    claim = %candidate.name,
                    pod = %format!("{}/{}", candidate.pod_namespace, candidate.pod_name),
                    reason = ?candidate.reason,
                    kind,
                    "collected an orphaned claim"
                );
                Ok(Outcome::Deleted)
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Outcome::AlreadyGone),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                Metrics::inc(&self.metrics.precondition_conflicts);
                Ok(Outcome::Conflict)
            }
            Err(e) => Err(e),
        }
    }
}

/// Resolves once the shutdown flag is true or its sender is gone.
pub(crate) async fn wait_true(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}
