//! The controller's view of the cluster and its work queue (pure: fed watch
//! events and the results of its own writes, it says which Services to sync
//! when, and what to write for one).
//!
//! - Four caches (Services, Pods, Nodes, this controller's EndpointSlices),
//!   each replaced whole when its watch relists (after a `410 Gone`, say).
//! - A Service is queued when it, a pod it selects (before or after the
//!   change), or one of its slices changes; every Service when a cache is
//!   relisted or a node's zone (or presence) changes. Syncing is idempotent
//!   and reads only the caches, so why it was queued does not matter.
//! - Stale slice events: the controller puts what it wrote into its cache at
//!   once (so a slice it just created is never created twice), and ignores a
//!   watch event that is older than its own write (a lower
//!   `metadata.generation`) or that is about a slice it has deleted, as
//!   kube's `EndpointSliceTracker` does. A relist resets this.
//! - The error policy: a conflict (the cache was behind) is retried after
//!   [`CONFLICT_RETRY`]; any other failure after 1 s, doubling up to
//!   [`MAX_BACKOFF`]; an event about the Service syncs it at once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;

use super::desired::{self, Desired, NodeZones, SERVICE_NAME_LABEL, ZONE_LABEL};
use super::reconcile::{self, Plan};

/// Retry delay after a conflict.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(500);
/// The longest retry delay after failures.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// `namespace/name`.
pub fn key_of(m: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

/// The objects of namespace `ns` in a map keyed by [`key_of`] (a range: keys
/// are ordered and a namespace has no `/`).
fn in_namespace<'a, K>(
    objects: &'a BTreeMap<String, K>,
    ns: &str,
) -> impl Iterator<Item = (&'a String, &'a K)> + 'a {
    let prefix = format!("{ns}/");
    objects
        .range(prefix.clone()..)
        .take_while(move |(k, _)| k.starts_with(&prefix))
}

/// The key of the Service a slice belongs to (by its label).
fn owner_key(s: &EndpointSlice) -> Option<String> {
    let name = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(format!(
        "{}/{name}",
        s.metadata.namespace.as_deref().unwrap_or_default()
    ))
}

/// What one watch event did to a cache.
#[derive(Debug)]
pub enum Change<K> {
    /// Nothing visible yet (a relist in progress).
    None,
    /// Added or modified (`old` is the cached version before).
    Applied {
        /// The version cached before.
        old: Option<K>,
        /// The new version.
        new: K,
    },
    /// Deleted (the last version known).
    Deleted(K),
    /// Replaced by a complete list.
    Relisted,
}

/// One watched kind: its objects by `namespace/name`.
#[derive(Debug)]
pub struct Watched<K> {
    /// The current objects.
    pub objects: BTreeMap<String, K>,
    listing: Option<BTreeMap<String, K>>,
    /// A first list has been received.
    pub synced: bool,
}

impl<K> Default for Watched<K> {
    fn default() -> Self {
        Watched {
            objects: BTreeMap::new(),
            listing: None,
            synced: false,
        }
    }
}

impl<K: kube::Resource + Clone> Watched<K> {
    /// Applies a watcher event.
    pub fn handle(&mut self, ev: Event<K>) -> Change<K> {
        match ev {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                Change::None
            }
            Event::InitApply(o) => {
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key_of(o.meta()), o);
                Change::None
            }
            Event::InitDone => {
                self.objects = self.listing.take().unwrap_or_default();
                self.synced = true;
                Change::Relisted
            }
            Event::Apply(o) => {
                let old = self.objects.insert(key_of(o.meta()), o.clone());
                Change::Applied { old, new: o }
            }
            Event::Delete(o) => {
                let old = self.objects.remove(&key_of(o.meta()));
                Change::Deleted(old.unwrap_or(o))
            }
        }
    }
}

/// The slices this controller wrote, to tell stale watch events from new ones.
#[derive(Debug, Default)]
struct Tracker {
    /// UID → the generation of the controller's last write.
    written: HashMap<String, i64>,
    /// UIDs of slices it deleted (until the watch reports the deletion).
    deleted: HashSet<String>,
}

impl Tracker {
    fn stale(&self, s: &EndpointSlice) -> bool {
        let Some(uid) = s.metadata.uid.as_deref() else {
            return false;
        };
        let generation = s.metadata.generation.unwrap_or(0);
        self.deleted.contains(uid) || self.written.get(uid).is_some_and(|g| generation < *g)
    }
}

/// Everything the controller knows, and its queue.
#[derive(Debug, Default)]
pub struct State {
    /// Services.
    pub services: Watched<Service>,
    /// Pods.
    pub pods: Watched<Pod>,
    /// Nodes.
    pub nodes: Watched<Node>,
    /// The slices managed by this controller.
    pub slices: Watched<EndpointSlice>,
    zones: NodeZones,
    tracker: Tracker,
    /// Service key → when to sync it.
    queue: BTreeMap<String, Instant>,
    /// Service key → failures in a row.
    failures: HashMap<String, u32>,
    /// The first pass over everything was queued.
    started: bool,
}

impl State {
    /// Every cache has its first list.
    pub fn synced(&self) -> bool {
        self.services.synced && self.pods.synced && self.nodes.synced && self.slices.synced
    }

    fn queue(&mut self, key: String, now: Instant) {
        let at = self.queue.entry(key).or_insert(now);
        *at = (*at).min(now);
    }

    /// Queues every Service and every Service a slice names.
    fn queue_all(&mut self, now: Instant) {
        let keys: BTreeSet<String> = self
            .services
            .objects
            .keys()
            .cloned()
            .chain(self.slices.objects.values().filter_map(owner_key))
            .collect();
        for k in keys {
            self.queue(k, now);
        }
    }

    /// A Service event.
    pub fn on_service(&mut self, ev: Event<Service>, now: Instant) {
        match self.services.handle(ev) {
            Change::None => {}
            Change::Applied { new, .. } => self.queue(key_of(&new.metadata), now),
            Change::Deleted(old) => self.queue(key_of(&old.metadata), now),
            Change::Relisted => self.queue_all(now),
        }
    }

    /// Queues the Services of `pod`'s namespace that select it.
    fn queue_selecting(&mut self, pod: &Pod, now: Instant) {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let keys: Vec<String> = in_namespace(&self.services.objects, ns)
            .filter(|(_, s)| {
                desired::selector(s)
                    .is_some_and(|sel| desired::selects(sel, pod.metadata.labels.as_ref()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.queue(k, now);
        }
    }

    /// A Pod event.
    pub fn on_pod(&mut self, ev: Event<Pod>, now: Instant) {
        match self.pods.handle(ev) {
            Change::None => {}
            Change::Applied { old, new } => {
                if let Some(old) = old {
                    self.queue_selecting(&old, now);
                }
                self.queue_selecting(&new, now);
            }
            Change::Deleted(old) => self.queue_selecting(&old, now),
            Change::Relisted => self.queue_all(now),
        }
    }

    /// A Node event: only the set of nodes and their zones matter.
    pub fn on_node(&mut self, ev: Event<Node>, now: Instant) {
        if matches!(self.nodes.handle(ev), Change::None) {
            return;
        }
        let zones: NodeZones = self
            .nodes
            .objects
            .values()
            .filter_map(|n| {
                let zone = n
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ZONE_LABEL))
                    .cloned();
                Some((n.metadata.name.clone()?, zone))
            })
            .collect();
        if zones != self.zones {
            self.zones = zones;
            self.queue_all(now);
        }
    }

    /// An EndpointSlice event (of this controller's slices).
    pub fn on_slice(&mut self, ev: Event<EndpointSlice>, now: Instant) {
        match &ev {
            Event::Apply(s) if self.tracker.stale(s) => return,
            Event::Delete(s) => {
                if let Some(uid) = s.metadata.uid.as_deref() {
                    self.tracker.written.remove(uid);
                    self.tracker.deleted.remove(uid);
                }
            }
            Event::InitDone => self.tracker = Tracker::default(),
            _ => {}
        }
        match self.slices.handle(ev) {
            Change::None => {}
            Change::Applied { old, new } => {
                for k in old.iter().chain([&new]).filter_map(owner_key) {
                    self.queue(k, now);
                }
            }
            Change::Deleted(old) => {
                if let Some(k) = owner_key(&old) {
                    self.queue(k, now);
                }
            }
            Change::Relisted => self.queue_all(now),
        }
    }

    /// The Services due at `now` (none before every cache is synced; the
    /// first call after that queues everything).
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        if !self.synced() {
            return Vec::new();
        }
        if !self.started {
            self.started = true;
            self.queue_all(now);
        }
        self.queue
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// When the next queued Service is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.queue.values().min().copied()
    }

    /// What the slices of Service `key` should hold and what to write for it.
    pub fn plan(&self, key: &str, max: usize) -> (Option<Desired>, Plan) {
        let ns = key.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
        let desired = self.services.objects.get(key).and_then(|svc| {
            let pods = in_namespace(&self.pods.objects, ns).map(|(_, p)| p);
            desired::desired(svc, pods, &self.zones)
        });
        let existing: Vec<EndpointSlice> = in_namespace(&self.slices.objects, ns)
            .map(|(_, s)| s)
            .filter(|s| owner_key(s).as_deref() == Some(key))
            .cloned()
            .collect();
        let plan = reconcile::plan(desired.as_ref(), &existing, max);
        (desired, plan)
    }

    /// The controller created or replaced `s` (the API server's answer).
    pub fn wrote(&mut self, s: EndpointSlice) {
        if let Some(uid) = s.metadata.uid.clone() {
            self.tracker.deleted.remove(&uid);
            self.tracker
                .written
                .insert(uid, s.metadata.generation.unwrap_or(0));
        }
        self.slices.objects.insert(key_of(&s.metadata), s);
    }

    /// The controller deleted `s` (or found it gone).
    pub fn deleted(&mut self, s: &EndpointSlice) {
        if let Some(uid) = s.metadata.uid.clone() {
            self.tracker.written.remove(&uid);
            self.tracker.deleted.insert(uid);
        }
        self.slices.objects.remove(&key_of(&s.metadata));
    }

    /// Service `key` is in sync.
    pub fn succeeded(&mut self, key: &str) {
        self.queue.remove(key);
        self.failures.remove(key);
    }

    /// Syncing Service `key` failed: when to retry (the error policy).
    pub fn failed(&mut self, key: &str, conflict: bool, now: Instant) -> Duration {
        let delay = if conflict {
            CONFLICT_RETRY
        } else {
            let n = self.failures.entry(key.to_string()).or_insert(0);
            *n += 1;
            Duration::from_secs(1u64 << (*n - 1).min(8)).min(MAX_BACKOFF)
        };
        self.queue.insert(key.to_string(), now + delay);
        delay
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::desired::{CONTROLLER_NAME, MANAGED_BY_LABEL};
    use super::*;

    fn svc(name: &str, app: &str) -> Service {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "d", "uid": format!("u-{name}")},
            "spec": {"selector": {"app": app}, "clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}),
        )
        .expect("service")
    }

    fn pod(name: &str, app: &str, ready: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "d", "uid": format!("u-{name}"), "labels": {"app": app}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.1.1"}],
                       "conditions": [{"type": "Ready", "status": ready}]}}))
        .expect("pod")
    }

    fn node(name: &str, zone: Option<&str>) -> Node {
        let labels = zone.map(|z| json!({ZONE_LABEL: z})).unwrap_or(json!({}));
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("node")
    }

    fn slice(name: &str, svc: &str, uid: &str, generation: i64) -> EndpointSlice {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "d", "uid": uid,
            "generation": generation,
            "labels": {SERVICE_NAME_LABEL: svc, MANAGED_BY_LABEL: CONTROLLER_NAME}},
            "addressType": "IPv4", "endpoints": []}),
        )
        .expect("slice")
    }

    fn listed<K>(objs: Vec<K>) -> Vec<Event<K>> {
        let mut v = vec![Event::Init];
        v.extend(objs.into_iter().map(Event::InitApply));
        v.push(Event::InitDone);
        v
    }

    /// A state with Services web (app=web) and db (app=db), node n1 and no pods, everything synced once.
    fn started(now: Instant) -> State {
        let mut st = State::default();
        for ev in listed(vec![svc("web", "web"), svc("db", "db")]) {
            st.on_service(ev, now);
        }
        for ev in listed(vec![]) {
            st.on_pod(ev, now);
        }
        for ev in listed(vec![node("n1", None)]) {
            st.on_node(ev, now);
        }
        assert!(
            st.due(now).is_empty(),
            "nothing before every cache is synced"
        );
        for ev in listed(vec![slice("old-x", "old", "s0", 1)]) {
            st.on_slice(ev, now);
        }
        assert_eq!(
            st.due(now),
            ["d/db", "d/old", "d/web"],
            "everything, orphans included"
        );
        for k in ["d/db", "d/old", "d/web"] {
            st.succeeded(k);
        }
        st
    }

    #[test]
    fn pods_queue_the_services_selecting_them_before_and_after() {
        let now = Instant::now();
        let mut st = started(now);
        st.on_pod(Event::Apply(pod("a", "web", "True")), now);
        assert_eq!(st.due(now), ["d/web"]);
        st.succeeded("d/web");
        // Relabelled from web to db: both.
        st.on_pod(Event::Apply(pod("a", "db", "True")), now);
        assert_eq!(st.due(now), ["d/db", "d/web"]);
        st.succeeded("d/db");
        st.succeeded("d/web");
        st.on_pod(Event::Delete(pod("a", "db", "True")), now);
        assert_eq!(st.due(now), ["d/db"]);
        st.succeeded("d/db");
        // A pod nobody selects queues nothing.
        st.on_pod(Event::Apply(pod("z", "none", "True")), now);
        assert!(st.due(now).is_empty());
    }

    #[test]
    fn nodes_queue_everything_only_when_zones_or_presence_change() {
        let now = Instant::now();
        let mut st = started(now);
        st.on_node(Event::Apply(node("n1", None)), now);
        assert!(
            st.due(now).is_empty(),
            "a status update of a node changes nothing"
        );
        st.on_node(Event::Apply(node("n1", Some("a"))), now);
        assert_eq!(st.due(now).len(), 3);
        for k in st.due(now) {
            st.succeeded(&k);
        }
        st.on_node(Event::Apply(node("n2", None)), now);
        assert_eq!(st.due(now).len(), 3);
    }

    #[test]
    fn own_writes_are_cached_and_stale_echoes_ignored() {
        let now = Instant::now();
        let mut st = started(now);
        st.wrote(slice("web-1", "web", "s1", 2));
        // An older version of it arrives from the watch: ignored.
        st.on_slice(Event::Apply(slice("web-1", "web", "s1", 1)), now);
        assert_eq!(st.slices.objects["d/web-1"].metadata.generation, Some(2));
        assert!(st.due(now).is_empty());
        // Its own echo and later versions are taken.
        st.on_slice(Event::Apply(slice("web-1", "web", "s1", 3)), now);
        assert_eq!(st.slices.objects["d/web-1"].metadata.generation, Some(3));
        assert_eq!(st.due(now), ["d/web"]);
        st.succeeded("d/web");

        // Deleted by the controller: a late update does not bring it back, the deletion event clears it.
        let s = st.slices.objects["d/web-1"].clone();
        st.deleted(&s);
        st.on_slice(Event::Apply(slice("web-1", "web", "s1", 3)), now);
        assert!(!st.slices.objects.contains_key("d/web-1"));
        st.on_slice(Event::Delete(slice("web-1", "web", "s1", 3)), now);
        assert_eq!(st.due(now), ["d/web"]);
        assert!(st.tracker.deleted.is_empty() && st.tracker.written.is_empty());
    }

    #[test]
    fn a_relist_replaces_the_cache_and_queues_everything() {
        let now = Instant::now();
        let mut st = started(now);
        st.wrote(slice("web-1", "web", "s1", 5));
        for ev in listed(vec![slice("web-2", "web", "s2", 1)]) {
            st.on_slice(ev, now);
        }
        assert_eq!(st.slices.objects.keys().collect::<Vec<_>>(), ["d/web-2"]);
        assert!(st.tracker.written.is_empty());
        assert_eq!(st.due(now), ["d/db", "d/web"]);
    }

    #[test]
    fn failures_back_off_conflicts_retry_soon_and_events_sync_at_once() {
        let now = Instant::now();
        let mut st = started(now);
        let delays: Vec<Duration> = (0..6).map(|_| st.failed("d/web", false, now)).collect();
        let secs: Vec<u64> = delays.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
        assert!(st.due(now).is_empty());
        assert_eq!(st.next_due(), Some(now + MAX_BACKOFF));
        assert_eq!(st.due(now + MAX_BACKOFF), ["d/web"]);
        assert_eq!(st.failed("d/web", true, now), CONFLICT_RETRY);
        // A change to the Service: due now.
        st.on_service(Event::Apply(svc("web", "web")), now);
        assert_eq!(st.due(now), ["d/web"]);
        st.succeeded("d/web");
        assert_eq!(
            st.failed("d/web", false, now).as_secs(),
            1,
            "success resets the backoff"
        );
    }

    #[test]
    fn namespaces_are_ranges_of_the_keys() {
        let m: BTreeMap<String, u8> = ["a/x", "ab/y", "b/z", "b/z2", "c/w"]
            .iter()
            .map(|k| (k.to_string(), 0))
            .collect();
        let keys =
            |ns: &str| -> Vec<String> { in_namespace(&m, ns).map(|(k, _)| k.clone()).collect() };
        assert_eq!(keys("a"), ["a/x"]);
        assert_eq!(keys("b"), ["b/z", "b/z2"]);
        assert!(keys("d").is_empty());
    }

    #[test]
    fn the_plan_reads_the_caches() {
        let now = Instant::now();
        let mut st = started(now);
        st.on_pod(Event::Apply(pod("a", "web", "True")), now);
        let (d, p) = st.plan("d/web", 100);
        assert!(d.is_some());
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (1, 0, 0));
        assert_eq!(reconcile::endpoints_of(&p.create[0]).len(), 1);
        // The orphan's Service does not exist: its slice goes.
        let (d, p) = st.plan("d/old", 100);
        assert!(d.is_none());
        assert_eq!(p.delete.len(), 1);
    }
}
