//! The lab's EndpointSlice controller (`cozyplane lab endpoints`, hidden;
//! one per lab, in the fabric namespace, next to the scheduler).
//!
//! On a real cluster kube-controller-manager's endpointslice controller
//! gives every Service with a selector its EndpointSlices; the lab has no
//! kube-controller-manager, so this stands in for it, with the same labels
//! (`kubernetes.io/service-name`, `endpointslice.kubernetes.io/managed-by:
//! endpointslice-controller.k8s.io`), ownership (a controller reference to
//! the Service) and endpoint rules ([`desired`]), and writes as little
//! ([`reconcile`]). What consumes the slices (the agent's Service load
//! balancing) cannot tell the difference.
//!
//! How it runs, kube-rs style: four watches (Services, Pods, Nodes, and its
//! own slices by the managed-by label) through `kube::runtime::watcher`,
//! which lists, watches from the list's resourceVersion, relists on `410
//! Gone` and backs off on errors; the events feed the caches and the queue
//! ([`state`]); every queued Service is synced from the caches alone
//! (desired → plan → creates, updates, deletes; make before break). The API
//! server has no garbage collector, so the controller deletes the slices of
//! a Service that is gone, lost its selector or was replaced by another of
//! the same name (another UID) itself. A failed sync is retried with
//! backoff and reported as a Warning Event on the Service
//! (`FailedToUpdateEndpointSlices`, as kube), once per run of failures (the
//! role may create Events, not update them; the log has every retry).
//! `/readyz` turns 200 after the first pass over every Service.

pub mod desired;
pub mod reconcile;
pub mod state;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cozyplane_errors::Chain;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{
    Event as KubeEvent, EventSource, Node, ObjectReference, Pod, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;

use crate::cluster::{ClusterError, ClusterResult};
use crate::kubelet::klog;
use desired::{CONTROLLER_NAME, MANAGED_BY_LABEL};
use state::State;

/// The component name in Events (kube's).
const COMPONENT: &str = "endpointslice-controller";
/// kube's Event reason for a failed sync.
pub const FAILED_TO_UPDATE: &str = "FailedToUpdateEndpointSlices";
/// At most this many events are taken in one go before syncing.
const BATCH: usize = 256;

/// Arguments of `cozyplane lab endpoints`.
#[derive(Debug, Clone, clap::Args)]
pub struct EndpointsArgs {
    /// Kubeconfig of the lab's API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Where `/readyz` answers (200 after the first pass over every Service).
    #[arg(long, default_value = "127.0.0.1:9415")]
    pub readyz_bind: SocketAddr,
    /// At most this many endpoints per slice (kube-controller-manager's flag of the same name).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub max_endpoints_per_slice: u16,
}

/// Why one sync failed.
enum SyncError {
    /// A write raced another (the cache was behind): retried soon, not reported.
    Conflict(String),
    /// Anything else: retried with backoff and reported.
    Failed(String),
}

fn classify(what: String, e: kube::Error) -> SyncError {
    match e {
        kube::Error::Api(s) if s.code == 409 => {
            SyncError::Conflict(format!("{what}: {}", s.message))
        }
        e => SyncError::Failed(format!("{what}: {}", Chain(&e))),
    }
}

/// Syncs the slices of Service `key` (`namespace/name`) from the caches.
async fn sync(
    client: &kube::Client,
    st: &mut State,
    key: &str,
    max: usize,
) -> Result<(), SyncError> {
    let (desired, plan) = st.plan(key, max);
    if plan.is_empty() {
        return Ok(());
    }
    let ns = key.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    let name = |s: &EndpointSlice| s.metadata.name.clone().unwrap_or_default();
    for s in &plan.create {
        let made = api
            .create(&pp, s)
            .await
            .map_err(|e| classify(format!("creating a slice of {key}"), e))?;
        st.wrote(made);
    }
    for s in &plan.update {
        let made = api
            .replace(&name(s), &pp, s)
            .await
            .map_err(|e| classify(format!("updating slice {}", name(s)), e))?;
        st.wrote(made);
    }
    for s in &plan.delete {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: s.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name(s), &dp).await {
            Ok(_) => st.deleted(s),
            Err(kube::Error::Api(e)) if e.code == 404 => st.deleted(s),
            Err(e) => return Err(classify(format!("deleting slice {}", name(s)), e)),
        }
    }
    let endpoints: usize = desired
        .as_ref()
        .map(|d| d.groups.values().map(|g| g.len()).sum())
        .unwrap_or(0);
    klog!(
        "{key}: {} endpoints; slices created {}, updated {}, deleted {}",
        endpoints,
        plan.create.len(),
        plan.update.len(),
        plan.delete.len()
    );
    Ok(())
}

/// Records a Warning Event about `svc` (create only, a new name each time;
/// failures are logged, never fatal).
async fn warn(client: &kube::Client, svc: &Service, message: &str) {
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let now = Timestamp::now();
    let event = KubeEvent {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(ns.clone()),
            name: Some(name.clone()),
            uid: svc.metadata.uid.clone(),
            resource_version: svc.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(FAILED_TO_UPDATE.into()),
        message: Some(format!(
            "Error updating Endpoint Slices for Service {ns}/{name}: {message}"
        )),
        type_: Some("Warning".into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        reporting_component: Some(COMPONENT.into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: None,
        }),
        ..KubeEvent::default()
    };
    let api: Api<KubeEvent> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        klog!(
            "{ns}/{name}: recording event {FAILED_TO_UPDATE}: {}",
            Chain(&e)
        );
    }
}

fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, config).default_backoff()
}

/// Runs the controller until a watch ends (they do not: they retry).
pub async fn run(args: EndpointsArgs) -> ClusterResult<()> {
    let client = crate::cluster::api_client(&args.kubeconfig).await?;
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(args.readyz_bind)
        .await
        .map_err(|e| ClusterError::io("bind", args.readyz_bind.to_string(), e))?;
    tokio::spawn(crate::kubelet::serve_readyz(listener, ready.clone()));
    let max = usize::from(args.max_endpoints_per_slice);
    klog!("endpointslice controller starting (at most {max} endpoints per slice)");

    let all = watcher::Config::default();
    let mut services = watch(Api::<Service>::all(client.clone()), all.clone()).boxed();
    let mut pods = watch(Api::<Pod>::all(client.clone()), all.clone()).boxed();
    let mut nodes = watch(Api::<Node>::all(client.clone()), all.clone()).boxed();
    let ours = all.labels(&format!("{MANAGED_BY_LABEL}={CONTROLLER_NAME}"));
    let mut slices = watch(Api::<EndpointSlice>::all(client.clone()), ours).boxed();

    let mut st = State::default();
    // Services failing since their Event was recorded (so a retry loop records one).
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        let wake = st.next_due().map(tokio::time::Instant::from_std);
        let far = tokio::time::Instant::now() + Duration::from_secs(3600);
        // One event (or the next due time), then whatever else is already there.
        tokio::select! {
            Some(ev) = services.next() => on(&mut st, "services", ev, State::on_service),
            Some(ev) = pods.next() => on(&mut st, "pods", ev, State::on_pod),
            Some(ev) = nodes.next() => on(&mut st, "nodes", ev, State::on_node),
            Some(ev) = slices.next() => on(&mut st, "endpointslices", ev, State::on_slice),
            _ = tokio::time::sleep_until(wake.unwrap_or(far)) => {}
            else => break,
        }
        for _ in 0..BATCH {
            if let Some(Some(ev)) = services.next().now_or_never() {
                on(&mut st, "services", ev, State::on_service);
            } else if let Some(Some(ev)) = pods.next().now_or_never() {
                on(&mut st, "pods", ev, State::on_pod);
            } else if let Some(Some(ev)) = nodes.next().now_or_never() {
                on(&mut st, "nodes", ev, State::on_node);
            } else if let Some(Some(ev)) = slices.next().now_or_never() {
                on(&mut st, "endpointslices", ev, State::on_slice);
            } else {
                break;
            }
        }

        let now = Instant::now();
        let due = st.due(now);
        for key in &due {
            match sync(&client, &mut st, key, max).await {
                Ok(()) => {
                    st.succeeded(key);
                    reported.remove(key);
                }
                Err(SyncError::Conflict(msg)) => {
                    let after = st.failed(key, true, Instant::now());
                    klog!("{key}: {msg} (retrying in {after:?})");
                }
                Err(SyncError::Failed(msg)) => {
                    let after = st.failed(key, false, Instant::now());
                    klog!("{key}: {msg} (retrying in {after:?})");
                    if reported.insert(key.clone()) {
                        if let Some(svc) = st.services.objects.get(key) {
                            warn(&client, svc, &msg).await;
                        }
                    }
                }
            }
        }
        if st.synced() && !ready.load(Ordering::Relaxed) {
            klog!("first pass done: {} services", st.services.objects.len());
            ready.store(true, Ordering::Relaxed);
        }
    }
    Err(ClusterError::Api("the watches ended".into()))
}

/// Feeds one watch item to the state (errors are logged: the watcher retries them).
fn on<K>(
    st: &mut State,
    what: &str,
    ev: Result<Event<K>, watcher::Error>,
    apply: fn(&mut State, Event<K>, Instant),
) {
    match ev {
        Ok(ev) => apply(st, ev, Instant::now()),
        Err(e) => klog!("watching {what}: {} (retrying)", Chain(&e)),
    }
}
