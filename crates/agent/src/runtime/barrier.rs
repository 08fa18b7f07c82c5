//! The policy barrier: a CNI ADD answers only once the node's datapath holds
//! the new pod's policy state, so a pod never runs, even for a moment, with
//! less policy than it is under.
//!
//! Why: the policy maps are written by the sync loop from the watches
//! (watch.rs), after the ADD's claims (the FabricIP, a VPC pod's Port with
//! its labels snapshot) reach the agent's watch and a sync compiles them.
//! Until then the datapath does not know the new pod's SecurityGroups or
//! NetworkPolicy identity: a pod in a group whose egress is restricted
//! could send anywhere for the first ~50–100 ms of its life (found by the
//! connectivity test once an ADD took 5 ms instead of 36). Cilium's CNI
//! waits for the endpoint's first policy build for the same reason.
//!
//! How: the ADD waits until the watch holds each of its claims (by name and
//! UID) and the pod itself (a local pod's identity is its live labels), then for a sync that *started* after that (syncs are numbered as
//! they start and as they complete), waking the sync loop and letting it
//! skip its debounce while an ADD waits. Only where policy can apply: a
//! NetworkPolicy in the pod's namespace, any Cilium policy, or (a VPC pod)
//! a SecurityGroup in its VPC's namespace; elsewhere the ADD does not wait.
//! A barrier that does not clear within [`TIMEOUT`] fails the ADD (rolled
//! back; the runtime retries): fail closed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cozyplane_api::cilium::{CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy};
use cozyplane_api::{FabricIP, Port, SecurityGroup};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use tokio::sync::{watch, Notify};

use crate::cni_handler::{BarrierClaims, PolicyGate};

/// How long an ADD waits for its policy at most.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// How often the watch is looked at for the claims.
const POLL: Duration = Duration::from_millis(1);

/// The watch stores the barrier reads (handed over by the watch).
pub struct Stores {
    /// FabricIPs.
    pub fabric_ips: Store<FabricIP>,
    /// Ports.
    pub ports: Store<Port>,
    /// This node's pods.
    pub pods: Store<k8s_openapi::api::core::v1::Pod>,
    /// NetworkPolicies.
    pub policies: Store<NetworkPolicy>,
    /// SecurityGroups.
    pub groups: Store<SecurityGroup>,
    /// Cilium policies, when the API serves them.
    pub cilium: Option<(
        Store<CiliumNetworkPolicy>,
        Store<CiliumClusterwideNetworkPolicy>,
    )>,
}

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct PolicyBarrier(Arc<Inner>);

struct Inner {
    stores: OnceLock<Stores>,
    started: AtomicU64,
    completed: watch::Sender<u64>,
    waiters: AtomicUsize,
    notify: Arc<Notify>,
    /// Cuts a debounce short once an ADD's claims are in the watch.
    kick: Notify,
}

impl Default for PolicyBarrier {
    fn default() -> Self {
        Self(Arc::new(Inner {
            stores: OnceLock::new(),
            started: AtomicU64::new(0),
            completed: watch::Sender::new(0),
            waiters: AtomicUsize::new(0),
            notify: Arc::new(Notify::new()),
            kick: Notify::new(),
        }))
    }
}

impl std::fmt::Debug for PolicyBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyBarrier")
            .field("started", &self.0.started.load(Ordering::SeqCst))
            .field("completed", &*self.0.completed.borrow())
            .finish()
    }
}

/// Decrements the waiter count when an ADD stops waiting.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl PolicyBarrier {
    /// The sync loop's wake-up (watch events and waiting ADDs).
    pub fn notify(&self) -> Arc<Notify> {
        self.0.notify.clone()
    }

    /// Hands over the watch's stores (the first call wins).
    pub fn set_stores(&self, stores: Stores) {
        let _ = self.0.stores.set(stores);
    }

    /// The sync loop: a sync starts (before it snapshots the stores).
    pub fn sync_started(&self) -> u64 {
        self.0.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The sync loop: sync `n` (as [`PolicyBarrier::sync_started`]
    /// numbered it) is done, its maps written.
    pub fn sync_completed(&self, n: u64) {
        self.0.completed.send_replace(n);
    }

    /// The sync loop's debounce after an event: `d`, skipped while an ADD
    /// waits for its policy and cut short when one starts to (its claims
    /// may have been the event that began it).
    pub async fn debounce(&self, d: Duration) {
        if self.0.waiters.load(Ordering::SeqCst) > 0 {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.0.kick.notified() => {}
        }
    }

    fn applies(stores: &Stores, claims: &BarrierClaims) -> bool {
        fn any_in<K: kube::Resource<DynamicType = ()> + Clone>(store: &Store<K>, ns: &str) -> bool {
            store
                .state()
                .iter()
                .any(|o| ResourceExt::namespace(&**o).as_deref() == Some(ns))
        }
        any_in(&stores.policies, &claims.namespace)
            || stores
                .cilium
                .as_ref()
                .is_some_and(|(cnp, ccnp)| !cnp.state().is_empty() || !ccnp.state().is_empty())
            || claims
                .vpc_namespace
                .as_deref()
                .is_some_and(|vns| any_in(&stores.groups, vns))
    }

    fn visible(stores: &Stores, claims: &BarrierClaims) -> bool {
        let fabric = claims.fabric_ips.iter().all(|(name, uid)| {
            stores
                .fabric_ips
                .get(&ObjectRef::new(name))
                .is_some_and(|o| o.metadata.uid.as_deref() == Some(uid.as_str()))
        });
        let ports = claims.ports.iter().all(|(name, uid)| {
            let ns = claims.vpc_namespace.as_deref().unwrap_or_default();
            stores
                .ports
                .get(&ObjectRef::new(name).within(ns))
                .or_else(|| stores.ports.get(&ObjectRef::new(name)))
                .is_some_and(|o| o.metadata.uid.as_deref() == Some(uid.as_str()))
        });
        let (name, uid) = &claims.pod;
        let pod = stores
            .pods
            .get(&ObjectRef::new(name).within(&claims.namespace))
            .is_some_and(|o| o.metadata.uid.as_deref() == Some(uid.as_str()));
        fabric && ports && pod
    }
}

#[async_trait]
impl PolicyGate for PolicyBarrier {
    async fn wait(&self, claims: &BarrierClaims) -> Result<bool, String> {
        let Some(stores) = self.0.stores.get() else {
            return Err("the agent's watches have not started".into());
        };
        if !Self::applies(stores, claims) {
            return Ok(false);
        }
        self.0.waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.0.waiters);
        let deadline = Instant::now() + TIMEOUT;
        while !Self::visible(stores, claims) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "the agent's watch did not show the pod and its address claims within {TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(POLL).await;
        }
        let after = self.0.started.load(Ordering::SeqCst);
        self.0.notify.notify_one();
        self.0.kick.notify_one();
        let mut completed = self.0.completed.subscribe();
        let left = deadline.saturating_duration_since(Instant::now());
        let synced = tokio::time::timeout(left, async {
            completed.wait_for(|c| *c > after).await.is_ok()
        })
        .await;
        match synced {
            Ok(true) => Ok(true),
            Ok(false) => Err("the agent's sync loop stopped".into()),
            Err(_) => Err(format!("no sync wrote the pod's policy within {TIMEOUT:?}")),
        }
    }
}
