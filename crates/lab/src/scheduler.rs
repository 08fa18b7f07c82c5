//! The lab's trivial scheduler (`cozyplane lab scheduler`, hidden; one per
//! lab, in the fabric namespace).
//!
//! It binds every pod that has no `spec.nodeName` to the schedulable node
//! running the fewest unfinished pods (ties by name) through the
//! `pods/<name>/binding` subresource, as kube-scheduler does: the API server
//! sets `spec.nodeName` only if it is still empty, so a 409 means someone
//! else bound the pod (or it is being deleted), and the watch brings its new
//! version. The binding names the pod's UID, so a pod deleted and recreated
//! under the same name meanwhile is not bound by mistake. No
//! resources, affinities or taints: the lab's pods are small and equal.
//! A pass runs on every pod event and every 2 s (a pod that could not be
//! bound because there was no node yet gets bound once there is one).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cozyplane_errors::Chain;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;

use crate::cluster::{ClusterError, ClusterResult};
use crate::kubelet::klog;

/// Arguments of `cozyplane lab scheduler`.
#[derive(Debug, Clone, clap::Args)]
pub struct SchedulerArgs {
    /// Kubeconfig of the lab's API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Where `/readyz` answers.
    #[arg(long, default_value = "127.0.0.1:9414")]
    pub readyz_bind: SocketAddr,
}

/// What the scheduler knows of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its UID (the precondition of the binding).
    pub uid: String,
    /// The node it is bound to, if any.
    pub node: Option<String>,
    /// Succeeded or Failed (not counted against its node).
    pub finished: bool,
}

impl PodView {
    fn of(p: &Pod) -> Option<(String, PodView)> {
        let m = &p.metadata;
        if m.deletion_timestamp.is_some() {
            return None;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Some((
            m.uid.clone()?,
            PodView {
                namespace: m.namespace.clone().unwrap_or_default(),
                name: m.name.clone()?,
                uid: m.uid.clone()?,
                node: p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .filter(|n| !n.is_empty()),
                finished: matches!(phase, Some("Succeeded" | "Failed")),
            },
        ))
    }
}

/// The node for the next pod: fewest unfinished pods, then by name. `None` without nodes.
pub fn pick_node<'a>(
    nodes: &'a [String],
    pods: impl IntoIterator<Item = &'a PodView>,
) -> Option<&'a str> {
    let mut load: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
    for p in pods {
        if let Some(n) = p.node.as_deref().filter(|_| !p.finished) {
            if let Some(c) = load.get_mut(n) {
                *c += 1;
            }
        }
    }
    load.into_iter()
        .min_by_key(|(name, count)| (*count, *name))
        .map(|(n, _)| n)
}

/// The `v1.Binding` of pod `name` (with UID `uid`) to `node`.
pub fn binding(name: &str, uid: &str, node: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    })
}

async fn schedulable_nodes(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        })
        .filter_map(|n| n.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Binds every unbound pod in `pods` (updating the view of those it bound).
async fn pass(client: &kube::Client, pods: &mut HashMap<String, PodView>) {
    let mut unbound: Vec<String> = pods
        .iter()
        .filter(|(_, p)| p.node.is_none() && !p.finished)
        .map(|(u, _)| u.clone())
        .collect();
    if unbound.is_empty() {
        return;
    }
    unbound.sort_by_key(|u| pods.get(u).map(|p| (p.namespace.clone(), p.name.clone())));
    let nodes = match schedulable_nodes(client).await {
        Ok(n) => n,
        Err(e) => {
            klog!("listing nodes: {}", Chain(&e));
            return;
        }
    };
    for uid in unbound {
        let Some(node) = pick_node(&nodes, pods.values()).map(str::to_string) else {
            klog!("no schedulable node yet");
            return;
        };
        let Some(p) = pods.get_mut(&uid) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
        let body = binding(&p.name, &p.uid, &node);
        let res: Result<serde_json::Value, _> = api
            .create_subresource("binding", &p.name, &PostParams::default(), &body)
            .await;
        match res {
            Ok(_) => {
                klog!("bound {}/{} to {node}", p.namespace, p.name);
                p.node = Some(node);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Someone else bound it (or it is being deleted, or replaced):
                // the watch brings its new version.
                klog!(
                    "binding {}/{}: {} (left alone)",
                    p.namespace,
                    p.name,
                    s.message
                );
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                // Gone meanwhile: the watch brings the deletion.
            }
            Err(e) => klog!("binding {}/{}: {}", p.namespace, p.name, Chain(&e)),
        }
    }
}

/// Runs the scheduler until its watch ends.
pub async fn run(args: SchedulerArgs) -> ClusterResult<()> {
    let client = crate::cluster::api_client(&args.kubeconfig).await?;
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(args.readyz_bind)
        .await
        .map_err(|e| ClusterError::io("bind", args.readyz_bind.to_string(), e))?;
    tokio::spawn(crate::kubelet::serve_readyz(listener, ready.clone()));
    klog!("scheduler starting");
    let api: Api<Pod> = Api::all(client.clone());
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut pods: HashMap<String, PodView> = HashMap::new();
    let mut listing: HashMap<String, PodView> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            ev = events.next() => {
                let Some(ev) = ev else { break };
                match ev {
                    Ok(Event::Init) => listing.clear(),
                    Ok(Event::InitApply(p)) => listing.extend(PodView::of(&p)),
                    Ok(Event::InitDone) => {
                        pods = std::mem::take(&mut listing);
                        ready.store(true, Ordering::Relaxed);
                    }
                    Ok(Event::Apply(p)) => match PodView::of(&p) {
                        Some((uid, v)) => { pods.insert(uid, v); }
                        None => { if let Some(u) = p.metadata.uid { pods.remove(&u); } }
                    },
                    Ok(Event::Delete(p)) => { if let Some(u) = p.metadata.uid { pods.remove(&u); } }
                    Err(e) => { klog!("watching pods: {} (retrying)", Chain(&e)); continue; }
                }
                pass(&client, &mut pods).await;
            }
            _ = tick.tick() => pass(&client, &mut pods).await,
        }
    }
    Err(ClusterError::Api("the pod watch ended".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(node: Option<&str>, finished: bool) -> PodView {
        PodView {
            namespace: "d".into(),
            name: "p".into(),
            uid: "u".into(),
            node: node.map(str::to_string),
            finished,
        }
    }

    #[test]
    fn the_least_loaded_node_wins_and_ties_go_by_name() {
        let nodes = vec!["n2".to_string(), "n1".to_string(), "n3".to_string()];
        assert_eq!(pick_node(&nodes, &[]), Some("n1"));
        let pods = [
            view(Some("n1"), false),
            view(Some("n2"), false),
            view(Some("n3"), true),    // finished: does not count
            view(Some("gone"), false), // a node that no longer exists
            view(None, false),
        ];
        assert_eq!(pick_node(&nodes, &pods), Some("n3"));
        assert_eq!(pick_node(&[], &pods), None);
    }

    #[test]
    fn the_binding_targets_the_node_and_names_the_pod_uid() {
        let b = binding("p1", "u-42", "lab-node2");
        assert_eq!(b["kind"], "Binding");
        assert_eq!(b["metadata"]["name"], "p1");
        assert_eq!(b["metadata"]["uid"], "u-42");
        assert_eq!(b["target"]["kind"], "Node");
        assert_eq!(b["target"]["name"], "lab-node2");
    }

    #[test]
    fn deleted_pods_are_not_viewed_and_empty_node_names_are_unbound() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "d", "uid": "u", "resourceVersion": "7"},
            "spec": {"nodeName": "", "containers": []},
            "status": {"phase": "Succeeded"}}))
        .expect("pod");
        let (uid, v) = PodView::of(&p).expect("view");
        assert_eq!(uid, "u");
        assert_eq!(v.node, None);
        assert!(v.finished);
        let mut gone = p.clone();
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(PodView::of(&gone), None);
    }
}
