//! One task per pod: network, workload, readiness, restarts, status, teardown.
//!
//! A pod ends in one of two ways ([`Ending`]): marked for deletion (the API
//! server's graceful deletion: `deletionTimestamp` set), then the task stops
//! the workload (SIGTERM, SIGKILL after the grace period, at most
//! [`workload::STOP_GRACE`]), removes its network and only then deletes the
//! pod with `gracePeriodSeconds=0` and a UID precondition, so `kubectl delete`
//! returns once the pod is really gone; or already removed (a user's grace-0
//! delete), then the task only tears down.
//!
//! Every step that makes something records it first ([`PodRecord`]), and
//! every failure undoes what the step made before it is reported: a netns
//! whose ADD failed gets a DEL and is removed, so a retry starts clean and a
//! kubelet crash at any point leaves a record naming everything there is.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_datapath::netlink::{
    create_named_netns, delete_named_netns, named_netns_path, Netns, NlHandle,
};
use cozyplane_errors::Chain;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::Api;
use tokio::sync::watch;

use super::cni::{result_ips, Attachment, CniError};
use super::plan::{plan, restart_backoff, AfterExit, Readiness, WorkloadPlan};
use super::record::PodRecord;
use super::status::{pod_status, unrunnable, Observed, Termination};
use super::workload;
use super::{klog, Ctx};

/// How often readiness is checked until it passes.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// How long a DEL is retried while the agent asks to try again later.
const DEL_RETRY_FOR: Duration = Duration::from_secs(30);

/// How long a teardown that failed (the agent unreachable for the DEL)
/// waits before it is tried again for a pod marked for deletion.
const TEARDOWN_RETRY: Duration = Duration::from_secs(5);

/// Why a pod task ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Marked for deletion with this grace period: tear down, then delete
    /// the pod (grace 0, UID precondition).
    Deleting { grace: Duration },
    /// Removed from the API server already: tear down only.
    Gone,
}

impl Ending {
    /// How long the workload gets between SIGTERM and SIGKILL.
    pub fn kill_grace(ending: Option<Ending>) -> Duration {
        match ending {
            Some(Ending::Deleting { grace }) => grace.min(workload::STOP_GRACE),
            _ => workload::STOP_GRACE,
        }
    }
}

/// The stop signal of a pod task: `Some` once the pod is to go.
pub type StopRx = watch::Receiver<Option<Ending>>;

/// Waits until the pod is to go (or the kubelet drops the sender).
async fn stopped(stop: &mut StopRx) {
    while stop.borrow_and_update().is_none() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// Deletes the pod for good after its teardown: grace 0, guarded by its
/// UID (a newer pod of the same name is left alone). A pod already gone
/// (404) or replaced (409) needs nothing more.
async fn final_delete(ctx: &Ctx, ns: &str, name: &str, uid: &str) {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    for attempt in 0..5u32 {
        match api.delete(name, &params).await {
            Ok(_) => {
                klog!("pod {ns}/{name}: deleted");
                return;
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
            Err(e) => {
                klog!(
                    "pod {ns}/{name}: final delete failed (attempt {}): {}",
                    attempt + 1,
                    Chain(&e)
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Sleeps `d` unless the pod goes away first; `true` if it did.
async fn sleep_or_stop(stop: &mut StopRx, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stopped(stop) => true,
    }
}

struct PodTask {
    ctx: Arc<Ctx>,
    plan: WorkloadPlan,
    rec: PodRecord,
    obs: Observed,
}

/// Runs pod `pod` until it is deleted; `record` is what an earlier kubelet left.
pub async fn run(ctx: Arc<Ctx>, pod: Pod, record: Option<PodRecord>, mut stop: StopRx) {
    let p = match plan(&pod, &ctx.node) {
        Ok(p) => p,
        Err(e) => {
            let (ns, name) = (
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default(),
            );
            klog!("pod {ns}/{name}: cannot run it: {}", Chain(&e));
            if stop.borrow().is_none() {
                let status = unrunnable(ctx.node_ip, &Chain(&e).to_string(), Timestamp::now());
                patch_status(&ctx, &ns, &name, &status).await;
            }
            stopped(&mut stop).await;
            let clean = match record {
                Some(rec) => teardown_record(&ctx, rec).await,
                None => true,
            };
            let deleting = matches!(*stop.borrow(), Some(Ending::Deleting { .. }));
            if clean && deleting {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                final_delete(&ctx, &ns, &name, &uid).await;
            }
            return;
        }
    };
    let already_done = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
    if already_done && record.is_none() {
        // Finished under an earlier kubelet whose record is gone: never run a pod twice.
        stopped(&mut stop).await;
        if matches!(*stop.borrow(), Some(Ending::Deleting { .. })) {
            final_delete(&ctx, &p.namespace, &p.name, &p.uid).await;
        }
        return;
    }
    let rec = record.unwrap_or_else(|| PodRecord {
        uid: p.uid.clone(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        netns: p.netns.clone(),
        container_id: p.container_id.clone(),
        cni_result: None,
        needs_del: false,
        pod_ips: Vec::new(),
        workload: None,
        observed: None,
    });
    let obs = rec
        .observed
        .clone()
        .unwrap_or_else(|| Observed::new(ctx.node_ip, Timestamp::now()));
    let mut task = PodTask {
        ctx,
        plan: p,
        rec,
        obs,
    };
    task.run(&mut stop).await;
}

impl PodTask {
    fn who(&self) -> String {
        format!("pod {}/{}", self.plan.namespace, self.plan.name)
    }

    async fn run(&mut self, stop: &mut StopRx) {
        // A pod already marked for deletion (seen first by a restarted
        // kubelet) is not started: what an earlier kubelet made is torn down.
        if stop.borrow().is_none() {
            if !self.obs.phase.is_terminal() {
                self.adopt_workload().await;
                if self.live(stop).await {
                    // The pod ended: its network goes, its record stays until it is deleted.
                    self.teardown_network().await;
                    self.save();
                    stopped(stop).await;
                }
            } else {
                stopped(stop).await;
            }
        }
        self.finish(stop).await;
    }

    /// Teardown, then (for a pod marked for deletion) the final delete.
    /// The pod is deleted only once nothing of it is left; a failed
    /// teardown is retried every [`TEARDOWN_RETRY`] meanwhile (the pod
    /// shows as Terminating), until it succeeds or a user removes the pod
    /// with grace 0.
    async fn finish(&mut self, stop: &mut StopRx) {
        loop {
            let ending = *stop.borrow_and_update();
            let clean = self.teardown(Ending::kill_grace(ending)).await;
            match ending {
                Some(Ending::Deleting { .. }) if clean => {
                    final_delete(
                        &self.ctx,
                        &self.plan.namespace,
                        &self.plan.name,
                        &self.plan.uid,
                    )
                    .await;
                    return;
                }
                Some(Ending::Deleting { .. }) => {
                    klog!(
                        "{}: teardown incomplete, pod kept Terminating; retrying in {TEARDOWN_RETRY:?}",
                        self.who()
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(TEARDOWN_RETRY) => {}
                        _ = stop.changed() => {}
                    }
                }
                _ => return,
            }
        }
    }

    /// Network up, then run (and restart) the workload. Returns true if the
    /// pod reached a terminal phase, false if it was deleted.
    async fn live(&mut self, stop: &mut StopRx) -> bool {
        if self.obs.phase == super::status::Phase::Pending {
            self.report().await; // taken on: Pending, ContainerCreating
        }
        let mut attempt = 0;
        while let Err(e) = self.setup_network().await {
            let msg = Chain(&e).to_string();
            klog!("{}: network setup failed: {msg}", self.who());
            super::events::warn(
                &self.ctx,
                &self.plan,
                super::events::FAILED_CREATE_POD_SANDBOX,
                &format!("Failed to create pod sandbox: {msg}"),
            )
            .await;
            self.obs
                .waiting("ContainerCreating", Some(msg), Timestamp::now());
            self.report().await;
            if sleep_or_stop(stop, restart_backoff(attempt)).await {
                return false;
            }
            attempt += 1;
        }
        self.obs.pod_ips = if self.plan.host_network {
            vec![self.ctx.node_ip]
        } else {
            self.rec.pod_ips.clone()
        };
        let netns = match self.plan.netns.as_deref() {
            Some(n) => match Netns::open(named_netns_path(n)) {
                Ok(ns) => Some(ns),
                Err(e) => {
                    klog!("{}: opening its netns: {}", self.who(), Chain(&e));
                    None
                }
            },
            None => None,
        };
        let mut attempt = 0;
        loop {
            let exit = match self.run_once(netns.as_ref(), stop).await {
                RunEnd::Deleted => return false,
                RunEnd::SpawnFailed(msg) => {
                    klog!("{}: starting the workload failed: {msg}", self.who());
                    self.obs
                        .waiting("RunContainerError", Some(msg), Timestamp::now());
                    self.report().await;
                    if sleep_or_stop(stop, restart_backoff(attempt)).await {
                        return false;
                    }
                    attempt += 1;
                    continue;
                }
                RunEnd::Exited(t) => t,
            };
            klog!(
                "{}: workload exited with code {}",
                self.who(),
                exit.exit_code
            );
            match self.plan.restart.after_exit(exit.exit_code) {
                AfterExit::Terminal { .. } => {
                    self.obs.terminated(exit, Timestamp::now());
                    self.report().await;
                    return true;
                }
                AfterExit::Restart => {
                    let delay = restart_backoff(self.obs.restart_count);
                    self.obs.exited_will_restart(exit, Timestamp::now());
                    self.report().await;
                    if sleep_or_stop(stop, delay).await {
                        return false;
                    }
                }
            }
        }
    }

    /// A workload an earlier kubelet started is stopped (it is restarted
    /// like any exited workload, in the network that is kept).
    async fn adopt_workload(&mut self) {
        if let Some((pid, start_time)) = self.rec.workload.take() {
            match workload::stop(pid, start_time).await {
                Ok(true) => klog!(
                    "{}: stopped the workload pid {pid} of an earlier kubelet",
                    self.who()
                ),
                Ok(false) => {}
                Err(e) => klog!(
                    "{}: stopping the earlier workload pid {pid}: {}",
                    self.who(),
                    Chain(&e)
                ),
            }
            if self.obs.phase == super::status::Phase::Running {
                self.obs.restart_count += 1;
            }
            self.save();
        }
    }

    fn termination_log(&self) -> std::path::PathBuf {
        PodRecord::dir(&self.ctx.state_dir, &self.plan.uid).join("termination-log")
    }

    async fn run_once(&mut self, netns: Option<&Netns>, stop: &mut StopRx) -> RunEnd {
        let dir = PodRecord::dir(&self.ctx.state_dir, &self.plan.uid);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            return RunEnd::SpawnFailed(format!("create {}: {}", dir.display(), Chain(&e)));
        }
        let tlog = self.termination_log();
        let _ = std::fs::remove_file(&tlog);
        let env = self.plan.resolved_env(
            self.obs.pod_ips.first().copied(),
            self.ctx.node_ip,
            &tlog.display().to_string(),
        );
        if self.plan.netns.is_some() && netns.is_none() {
            return RunEnd::SpawnFailed("the pod's netns is gone".into());
        }
        let mut w = match workload::spawn(
            &self.ctx.cozyplane,
            &self.plan.program.args(),
            &env,
            netns,
            self.ctx.cgroup.as_deref(),
            &dir.join("workload.log"),
        ) {
            Ok(w) => w,
            Err(e) => return RunEnd::SpawnFailed(Chain(&e).to_string()),
        };
        self.rec.workload = Some((w.pid, w.start_time));
        self.save();
        klog!("{}: workload started, pid {}", self.who(), w.pid);
        let now = Timestamp::now();
        self.obs.running(w.started_at, now);
        if self.plan.readiness == Readiness::Started {
            self.obs.set_ready(true, now);
        }
        self.report().await;
        let target = self.obs.pod_ips.first().copied();
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        let status = loop {
            tokio::select! {
                st = w.child.wait() => break st,
                _ = tick.tick(), if !self.obs.ready => {
                    if self.check_ready(target).await {
                        klog!("{}: ready", self.who());
                        self.obs.set_ready(true, Timestamp::now());
                        self.report().await;
                    }
                }
                _ = stopped(stop) => {
                    let grace = Ending::kill_grace(*stop.borrow());
                    if let Err(e) = workload::stop_within(w.pid, w.start_time, grace).await {
                        klog!("{}: stopping the workload: {}", self.who(), Chain(&e));
                    }
                    let _ = w.child.wait().await;
                    self.rec.workload = None;
                    return RunEnd::Deleted;
                }
            }
        };
        self.rec.workload = None;
        let (exit_code, signal) = match status {
            Ok(s) => workload::exit_code(s),
            Err(_) => (-1, None),
        };
        RunEnd::Exited(Termination {
            exit_code,
            signal,
            message: workload::termination_message(&tlog),
            started_at: w.started_at,
            finished_at: Timestamp::now(),
        })
    }

    async fn check_ready(&self, target: Option<IpAddr>) -> bool {
        let Some(ip) = target else { return false };
        match &self.plan.readiness {
            Readiness::Started => true,
            Readiness::Tcp(port) => workload::probe(ip, *port, None).await,
            Readiness::Http { port, path } => workload::probe(ip, *port, Some(path)).await,
        }
    }

    /// Netns + lo + CNI ADD; on failure everything made here is undone: one
    /// DEL (if the agent cannot be reached, `needs_del` stays set and the
    /// pod's teardown retries it) and the netns removed, so the next attempt
    /// starts clean and no half-plumbed namespace is left.
    async fn setup_network(&mut self) -> Result<(), NetworkError> {
        let Some(name) = self.plan.netns.clone() else {
            return Ok(());
        };
        let exists = named_netns_path(&name).exists();
        if exists && self.rec.cni_result.is_some() {
            return Ok(()); // adopted: the network an earlier kubelet made stays
        }
        if exists {
            // Made by an earlier kubelet that crashed before the ADD completed: start clean.
            self.undo_failed_add(&name).await?;
        }
        self.rec.netns = Some(name.clone());
        self.rec.cni_result = None;
        self.rec.needs_del = true;
        self.save(); // intent first
        match self.make_network(&name).await {
            Ok(result) => {
                let ips = result_ips(&result);
                klog!("{}: network up in {name}: {ips:?}", self.who());
                self.rec.pod_ips = ips;
                self.rec.cni_result = Some(result);
                self.save();
                Ok(())
            }
            Err(error) => match self.undo_failed_add(&name).await {
                Ok(()) => Err(error),
                Err(undo) => Err(NetworkError::UndoFailed {
                    error: Box::new(error),
                    undo: Box::new(undo),
                }),
            },
        }
    }

    /// After a failed ADD: one DEL, then the netns goes whatever the DEL said.
    async fn undo_failed_add(&mut self, name: &str) -> Result<(), NetworkError> {
        match self.del(name, None, false).await {
            Ok(()) => self.rec.needs_del = false,
            Err(e) => klog!(
                "{}: DEL after the failed ADD failed too (retried when the pod goes): {}",
                self.who(),
                Chain(&e)
            ),
        }
        let removed = remove_netns(name).await;
        self.save();
        removed
    }

    async fn make_network(&self, name: &str) -> Result<serde_json::Value, NetworkError> {
        let n = name.to_string();
        let in_netns = |what| {
            move |source| NetworkError::Netlink {
                what,
                name: name.to_string(),
                source,
            }
        };
        let netns = tokio::task::spawn_blocking(move || create_named_netns(&n))
            .await?
            .map_err(in_netns("creating netns"))?;
        let nl = NlHandle::connect(&netns)
            .await
            .map_err(in_netns("netlink in"))?;
        if let Some(lo) = nl.link_by_name("lo").await.map_err(in_netns("lo in"))? {
            nl.set_up(lo.index).await.map_err(in_netns("lo up in"))?;
        }
        let path = named_netns_path(name);
        let result = self.ctx.cni.add(&self.attachment(Some(&path))).await?;
        if result_ips(&result).is_empty() {
            return Err(NetworkError::NoAddress(result));
        }
        Ok(result)
    }

    fn attachment<'a>(&'a self, netns: Option<&'a std::path::Path>) -> Attachment<'a> {
        Attachment {
            container_id: &self.plan.container_id,
            netns,
            namespace: &self.plan.namespace,
            name: &self.plan.name,
            uid: &self.plan.uid,
        }
    }

    /// CNI DEL for the pod (with its netns if that still exists); `patient`:
    /// retried for [`DEL_RETRY_FOR`] while the agent says "try again later".
    async fn del(
        &self,
        name: &str,
        prev: Option<&serde_json::Value>,
        patient: bool,
    ) -> Result<(), CniError> {
        let path = named_netns_path(name);
        let netns = path.exists().then_some(path.as_path());
        let t0 = std::time::Instant::now();
        loop {
            match self.ctx.cni.del(&self.attachment(netns), prev).await {
                Ok(()) => return Ok(()),
                Err(e) if patient && t0.elapsed() < DEL_RETRY_FOR && e.is_transient() => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The network of a pod that ended or was deleted (podIP stays in the
    /// status). `false` if a DEL failed: then the netns and the record stay, so
    /// a later kubelet (or the next deletion pass) can still DEL with it.
    async fn teardown_network(&mut self) -> bool {
        let Some(name) = self.rec.netns.clone() else {
            return true;
        };
        let exists = named_netns_path(&name).exists();
        if !self.rec.needs_del && self.rec.cni_result.is_none() && !exists {
            return true;
        }
        if self.rec.needs_del || self.rec.cni_result.is_some() {
            let prev = self.rec.cni_result.clone();
            if let Err(e) = self.del(&name, prev.as_ref(), true).await {
                klog!(
                    "{}: DEL failed, network kept for a later attempt: {}",
                    self.who(),
                    Chain(&e)
                );
                return false;
            }
            self.rec.needs_del = false;
            self.rec.cni_result = None;
            self.save();
        }
        match remove_netns(&name).await {
            Ok(()) => {
                klog!("{}: network removed", self.who());
                true
            }
            Err(e) => {
                klog!("{}: {}", self.who(), Chain(&e));
                false
            }
        }
    }

    /// Everything of a deleted pod: workload (SIGKILL after `grace`),
    /// network, record. `false` if something is left (the record then
    /// stays, naming it).
    async fn teardown(&mut self, grace: Duration) -> bool {
        if let Some((pid, st)) = self.rec.workload {
            match workload::stop_within(pid, st, grace).await {
                Ok(_) => self.rec.workload = None,
                Err(e) => {
                    klog!("{}: stopping the workload: {}", self.who(), Chain(&e));
                    self.save();
                    return false;
                }
            }
        }
        if self.teardown_network().await {
            if let Err(e) = PodRecord::remove(&self.ctx.state_dir, &self.plan.uid) {
                klog!("{}: removing its record: {}", self.who(), Chain(&e));
                return false;
            }
            klog!("{}: removed", self.who());
            true
        } else {
            self.save();
            false
        }
    }

    fn save(&mut self) {
        self.rec.observed = Some(self.obs.clone());
        if let Err(e) = self.rec.save(&self.ctx.state_dir) {
            klog!("{}: writing its record: {}", self.who(), Chain(&e));
        }
    }

    async fn report(&mut self) {
        self.save();
        let status = pod_status(&self.plan, &self.obs);
        patch_status(&self.ctx, &self.plan.namespace, &self.plan.name, &status).await;
    }
}

/// Why a pod's network could not be made or removed. The pod's status
/// message and the kubelet's log print it with its chain.
#[derive(Debug, thiserror::Error)]
enum NetworkError {
    /// A netns or netlink step (`creating netns`, `lo up in`, `removing netns`).
    #[error("{what} {name}")]
    Netlink {
        /// The step.
        what: &'static str,
        /// The netns.
        name: String,
        /// The kernel's error.
        #[source]
        source: cozyplane_datapath::netlink::Error,
    },
    /// The blocking task that runs the netns step died.
    #[error("the netns task failed")]
    Task(#[from] tokio::task::JoinError),
    /// The CNI plugin failed.
    #[error(transparent)]
    Cni(#[from] CniError),
    /// ADD succeeded but the result holds no address.
    #[error("CNI ADD returned no address: {0}")]
    NoAddress(serde_json::Value),
    /// The ADD failed and undoing it failed too. Two errors, so no
    /// `source()`: the message prints both chains.
    #[error("{}; undoing it also failed: {}", Chain(&**.error), Chain(&**.undo))]
    UndoFailed {
        /// Why the network could not be made.
        error: Box<NetworkError>,
        /// Why undoing it failed.
        undo: Box<NetworkError>,
    },
}

/// Removes the named netns (idempotent).
async fn remove_netns(name: &str) -> Result<(), NetworkError> {
    let n = name.to_string();
    tokio::task::spawn_blocking(move || delete_named_netns(&n))
        .await?
        .map_err(|source| NetworkError::Netlink {
            what: "removing netns",
            name: name.to_string(),
            source,
        })
}

enum RunEnd {
    Exited(Termination),
    SpawnFailed(String),
    Deleted,
}

/// Merge-patches the pod's status; a pod already gone is not an error.
async fn patch_status(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    status: &k8s_openapi::api::core::v1::PodStatus,
) {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({ "status": status });
    for attempt in 0..3u32 {
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 404 => return,
            Err(e) => {
                klog!(
                    "pod {ns}/{name}: status update failed (attempt {}): {}",
                    attempt + 1,
                    Chain(&e)
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
}

/// Tears down what a record names, for a pod that is no longer wanted;
/// `false` if something is left.
pub async fn teardown_record(ctx: &Arc<Ctx>, rec: PodRecord) -> bool {
    let fake_plan = WorkloadPlan {
        uid: rec.uid.clone(),
        namespace: rec.namespace.clone(),
        name: rec.name.clone(),
        container: String::new(),
        image: String::new(),
        program: super::plan::Program::BuiltinServer,
        env: Vec::new(),
        host_network: rec.netns.is_none(),
        netns: rec.netns.clone(),
        container_id: rec.container_id.clone(),
        readiness: Readiness::Started,
        restart: super::plan::RestartPolicy::Never,
    };
    let obs = rec
        .observed
        .clone()
        .unwrap_or_else(|| Observed::new(ctx.node_ip, Timestamp::now()));
    let mut task = PodTask {
        ctx: ctx.clone(),
        plan: fake_plan,
        rec,
        obs,
    };
    klog!(
        "{}: no longer wanted on this node, tearing down",
        task.who()
    );
    task.teardown(workload::STOP_GRACE).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::cni::Cni;

    #[test]
    fn a_deleted_pod_gets_its_grace_period_up_to_the_stop_grace() {
        let deleting = |secs| {
            Some(Ending::Deleting {
                grace: Duration::from_secs(secs),
            })
        };
        assert_eq!(Ending::kill_grace(None), workload::STOP_GRACE);
        assert_eq!(Ending::kill_grace(Some(Ending::Gone)), workload::STOP_GRACE);
        assert_eq!(Ending::kill_grace(deleting(30)), workload::STOP_GRACE);
        assert_eq!(Ending::kill_grace(deleting(1)), Duration::from_secs(1));
        assert_eq!(Ending::kill_grace(deleting(0)), Duration::ZERO);
    }

    /// A plugin that logs its calls and fails every ADD (and every DEL once
    /// `fail-del` exists next to it) with a CNI error.
    const FAILING_PLUGIN: &str = r#"#!/bin/sh
cat > /dev/null
echo "$CNI_COMMAND $CNI_NETNS $CNI_CONTAINERID" >> "$(dirname "$0")/calls"
if [ "$CNI_COMMAND" = ADD ] || [ -e "$(dirname "$0")/fail-del" ]; then
  echo '{"cniVersion":"1.0.0","code":11,"msg":"agent not ready","details":"socket refused"}'
  exit 1
fi
exit 0
"#;

    #[tokio::test]
    async fn a_failed_add_is_undone_and_recorded() {
        use std::os::unix::fs::PermissionsExt;
        if !cozyplane_testkit::needs!().root().ready() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let bin_dir = dir.path().join("bin");
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&bin_dir).expect("mkdir");
        std::fs::create_dir_all(&conf_dir).expect("mkdir");
        let plugin = bin_dir.join("failing");
        std::fs::write(&plugin, FAILING_PLUGIN).expect("write plugin");
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(
            conf_dir.join("10-failing.conflist"),
            r#"{"cniVersion":"1.0.0","name":"t","plugins":[{"type":"failing"}]}"#,
        )
        .expect("conflist");
        // Never contacted: setup_network does not talk to the API server.
        let cfg = kube::Config::new("https://127.0.0.1:1".parse().expect("uri"));
        let client = kube::Client::try_from(cfg).expect("client");
        let node = format!("kbu{}-node1", std::process::id() % 100_000);
        let ctx = Arc::new(Ctx {
            node: node.clone(),
            node_ip: "198.18.0.11".parse().expect("ip"),
            cni: Cni {
                conf_dir,
                bin_dir: bin_dir.clone(),
            },
            state_dir: dir.path().join("state"),
            cozyplane: std::path::PathBuf::from("/bin/false"),
            client,
            cgroup: None,
        });
        let uid = format!("{:08x}-0000-4000-8000-000000000001", std::process::id());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "d", "uid": uid},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]}}))
        .expect("pod");
        let plan = plan(&pod, &node).expect("plan");
        let netns = plan.netns.clone().expect("netns name");
        let mut task = PodTask {
            ctx: ctx.clone(),
            rec: PodRecord {
                uid: plan.uid.clone(),
                namespace: "d".into(),
                name: "p".into(),
                netns: None,
                container_id: plan.container_id.clone(),
                cni_result: None,
                needs_del: false,
                pod_ips: Vec::new(),
                workload: None,
                observed: None,
            },
            obs: Observed::new(ctx.node_ip, Timestamp::now()),
            plan,
        };
        let err = task.setup_network().await.expect_err("ADD fails");
        let err = Chain(&err).to_string();
        assert!(
            err.contains("code 11") && err.contains("agent not ready"),
            "{err}"
        );
        // The netns made for the ADD is gone, after a DEL for the same attachment.
        assert!(!named_netns_path(&netns).exists(), "netns {netns} left");
        let calls = std::fs::read_to_string(bin_dir.join("calls")).expect("calls");
        let path = named_netns_path(&netns).display().to_string();
        let cid = task.plan.container_id.clone();
        assert_eq!(
            calls.lines().collect::<Vec<_>>(),
            [format!("ADD {path} {cid}"), format!("DEL {path} {cid}")],
            "{calls}"
        );
        // The record names the netns (intent) but no network.
        let (records, bad) = PodRecord::load_all(&ctx.state_dir);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].netns.as_deref(), Some(netns.as_str()));
        assert!(records[0].cni_result.is_none());
        assert!(!records[0].needs_del, "the DEL succeeded");

        // The agent unreachable for the DEL too: the netns still goes, and the
        // record keeps `needs_del` so the pod's teardown DELs again.
        std::fs::write(bin_dir.join("fail-del"), "").expect("flag");
        let err = task.setup_network().await.expect_err("ADD fails");
        let err = Chain(&err).to_string();
        assert!(err.contains("agent not ready"), "{err}");
        assert!(!named_netns_path(&netns).exists(), "netns {netns} left");
        let (records, _) = PodRecord::load_all(&ctx.state_dir);
        assert!(records[0].needs_del);
        std::fs::remove_file(bin_dir.join("fail-del")).expect("unflag");
        assert!(task.teardown_network().await, "teardown DELs and succeeds");
        assert!(!task.rec.needs_del);
        let calls = std::fs::read_to_string(bin_dir.join("calls")).expect("calls");
        let commands: Vec<&str> = calls.lines().filter_map(|l| l.split(' ').next()).collect();
        assert_eq!(commands, ["ADD", "DEL", "ADD", "DEL", "DEL"], "{calls}");
        // And the status says why.
        task.obs
            .waiting("ContainerCreating", Some(err.clone()), Timestamp::now());
        let status = pod_status(&task.plan, &task.obs);
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let waiting = status.container_statuses.expect("statuses")[0]
            .state
            .clone()
            .and_then(|s| s.waiting)
            .expect("waiting");
        assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
        assert_eq!(waiting.message, Some(err));
    }
}
