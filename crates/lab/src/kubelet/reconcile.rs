//! The watch on this node's pods (`fieldSelector=spec.nodeName=<node>`) and
//! the pod tasks it starts and stops.
//!
//! A pod task starts on the first sight of a pod uid and is told to end
//! when the pod is marked for deletion ([`Ending::Deleting`]: the task tears
//! down, then deletes the pod with grace 0), deleted or missing from a
//! (re)list ([`Ending::Gone`]). A pod marked for deletion whose task has
//! ended without deleting it (say the final delete failed) gets a new task,
//! which finds nothing left to tear down and deletes it. After the
//! first complete list, the records an earlier kubelet left are sorted out:
//! the wanted ones were handed to their pod tasks, the others are torn down.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cozyplane_errors::Chain;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::watch;

use super::pod::{self, Ending};
use super::record::PodRecord;
use super::{klog, Ctx};
use crate::cluster::{ClusterError, ClusterResult};

/// The running pod tasks, by uid.
struct Tasks {
    ctx: Arc<Ctx>,
    stops: HashMap<String, watch::Sender<Option<Ending>>>,
    /// Records of an earlier kubelet, until the first complete list sorts them out.
    leftover: Option<HashMap<String, PodRecord>>,
}

impl Tasks {
    fn ensure(&mut self, p: Pod) {
        let Some(uid) = p.metadata.uid.clone() else {
            return;
        };
        let ending = p.metadata.deletion_timestamp.as_ref().map(|_| {
            let secs = p.metadata.deletion_grace_period_seconds.unwrap_or(0);
            Ending::Deleting {
                grace: Duration::from_secs(u64::try_from(secs).unwrap_or(0)),
            }
        });
        if let Some(tx) = self.stops.get(&uid).filter(|tx| !tx.is_closed()) {
            // Pods are immutable where it matters (status echoes of our own
            // patches land here); only the deletion mark is news.
            if let Some(e) = ending {
                tx.send_if_modified(|cur| {
                    let news = cur.is_none();
                    if news {
                        *cur = Some(e);
                    }
                    news
                });
            }
            return;
        }
        if self.stops.contains_key(&uid) && ending.is_none() {
            return; // its task ended (the pod finished): nothing to restart
        }
        let record = self.leftover.as_mut().and_then(|l| l.remove(&uid));
        if record.is_some() {
            klog!(
                "pod {}/{}: adopting what an earlier kubelet made",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            );
        }
        let (tx, rx) = watch::channel(ending);
        self.stops.insert(uid, tx);
        tokio::spawn(pod::run(self.ctx.clone(), p, record, rx));
    }

    /// The pod is gone from the API server: its task only tears down.
    fn stop(&mut self, uid: &str) {
        if let Some(tx) = self.stops.remove(uid) {
            let _ = tx.send(Some(Ending::Gone));
        }
    }

    /// After a complete list: stop what is gone, start what is new, and
    /// (the first time) tear down leftovers of pods no longer wanted.
    fn relisted(&mut self, pods: Vec<Pod>) {
        let seen: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let gone: Vec<String> = self
            .stops
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            klog!("pod uid {uid}: gone at relist");
            self.stop(&uid);
        }
        for p in pods {
            self.ensure(p);
        }
        if let Some(left) = self.leftover.take() {
            for (_, rec) in left {
                let ctx = self.ctx.clone();
                tokio::spawn(async move {
                    pod::teardown_record(&ctx, rec).await;
                });
            }
        }
    }
}

/// Watches the node's pods forever.
pub async fn run(ctx: Arc<Ctx>, ready: Arc<AtomicBool>) -> ClusterResult<()> {
    let (records, bad) = PodRecord::load_all(&ctx.state_dir);
    for (path, err) in bad {
        klog!(
            "unreadable pod record {} (left alone): {err}",
            path.display()
        );
    }
    klog!("{} pod records from an earlier kubelet", records.len());
    let mut tasks = Tasks {
        ctx: ctx.clone(),
        stops: HashMap::new(),
        leftover: Some(records.into_iter().map(|r| (r.uid.clone(), r)).collect()),
    };
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node));
    let mut events = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut listing: Vec<Pod> = Vec::new();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(p)) => listing.push(p),
            Ok(Event::InitDone) => {
                tasks.relisted(std::mem::take(&mut listing));
                if !ready.swap(true, Ordering::Relaxed) {
                    klog!("first list handled: ready");
                }
            }
            Ok(Event::Apply(p)) => tasks.ensure(p),
            Ok(Event::Delete(p)) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    tasks.stop(uid);
                }
            }
            Err(e) => klog!("watching pods: {} (retrying)", Chain(&e)),
        }
    }
    Err(ClusterError::Api("the pod watch ended".into()))
}
