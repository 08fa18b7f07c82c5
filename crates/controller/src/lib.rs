//! The cozyplane controller (`cozyplane controller`): FabricIP garbage
//! collection and VPC VNI allocation behind leader election.
//!
//! - [`gc`]: finds claims whose pod is gone or re-created (from watch caches),
//!   confirms each with a live read and deletes it with preconditions;
//! - [`vpc`]: gives every VPC a VNI by claim (a `VNIClaim` per VNI) from live
//!   reads, shows it in status, keeps it until nothing uses the VPC;
//! - [`leader`]: a `coordination.k8s.io/v1` Lease elector so that of several
//!   replicas only one collects;
//! - [`metrics`]: `/healthz`, `/readyz`, `/metrics`;
//! - [`args`]: the command-line surface and [`run`].

pub mod args;
pub mod gc;
pub mod leader;
pub mod metrics;
pub mod vpc;

use std::net::SocketAddr;
use std::sync::Arc;

use cozyplane_errors::Chain;
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use args::{run, ControllerArgs};
use gc::{Gc, GcConfig};
use leader::{ElectionConfig, ElectionConfigError, Elector, Leadership};
use metrics::Metrics;
use vpc::{VpcConfig, Vpcs};

/// Why the controller could not start. A variant that wraps an error says what
/// was being done; the error is its `source()` (`cozyplane controller` prints the
/// chain).
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Bad leader-election settings.
    #[error("invalid leader election settings")]
    Election(#[from] ElectionConfigError),
    /// A bad setting.
    #[error("invalid setting: {0}")]
    Invalid(String),
    /// The kubeconfig file could not be read or used.
    #[error("cannot use kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig given and none could be inferred.
    #[error("cannot infer a Kubernetes client configuration")]
    Infer(#[from] kube::config::InferConfigError),
    /// The client could not be built.
    #[error("cannot build a Kubernetes client")]
    Client(#[source] kube::Error),
    /// The metrics address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signal(#[source] std::io::Error),
}

/// Everything [`Controller::start`] needs besides a client.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Leader election; `None` runs GC unconditionally (a single replica).
    pub election: Option<ElectionConfig>,
    /// GC timing.
    pub gc: GcConfig,
    /// VPC controller timing.
    pub vpc: VpcConfig,
    /// Where to serve `/healthz`, `/readyz` and `/metrics`; `None`: nowhere.
    pub metrics_bind: Option<SocketAddr>,
}

/// Entry point for embedding (tests, `cozyplane controller`).
pub struct Controller;

/// A started controller. [`RunningController::shutdown`] stops it cleanly
/// (releasing the Lease); dropping it instead aborts every task at once,
/// like a killed process: the Lease is left to expire.
pub struct RunningController {
    leadership: Leadership,
    metrics: Arc<Metrics>,
    metrics_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    gc_stop: watch::Sender<bool>,
    gc_task: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Controller {
    /// Starts the elector (if any), the GC worker and the HTTP endpoints.
    pub async fn start(
        client: Client,
        config: ControllerConfig,
    ) -> Result<RunningController, ControllerError> {
        if config.gc.resync.is_zero() {
            return Err(ControllerError::Invalid("--resync must be positive".into()));
        }
        let (shutdown, shutdown_rx) = watch::channel(false);
        let metrics = Arc::new(Metrics::default());
        let mut tasks = Vec::new();
        let (elector, leadership) = match config.election {
            Some(election) => {
                let (elector, leadership) = Elector::new(client.clone(), election)?;
                (Some(elector), leadership)
            }
            None => (None, Leadership::unconditional()),
        };
        let mut metrics_addr = None;
        if let Some(addr) = config.metrics_bind {
            let (bound, serve) = metrics::serve(
                addr,
                Arc::clone(&metrics),
                leadership.clone(),
                shutdown_rx.clone(),
            )
            .await
            .map_err(|source| ControllerError::Bind { addr, source })?;
            metrics_addr = Some(bound);
            tasks.push(tokio::spawn(async move {
                if let Err(e) = serve.await {
                    tracing::error!(error = %Chain(&e), "metrics endpoint failed");
                }
            }));
        }
        if let Some(elector) = elector {
            tasks.push(tokio::spawn(elector.run(shutdown_rx.clone())));
        }
        // GC has its own stop signal: on shutdown it stops before the Lease is
        // released, so a successor never collects alongside it.
        let (gc_stop, gc_stop_rx) = watch::channel(false);
        let vpcs = Vpcs::new(
            client.clone(),
            config.vpc,
            Arc::clone(&metrics),
            leadership.clone(),
        );
        // Stops with GC, before the Lease is released.
        tasks.push(tokio::spawn(vpcs.run(gc_stop_rx.clone())));
        let gc = Gc::new(client, config.gc, Arc::clone(&metrics), leadership.clone());
        let gc_task = Some(tokio::spawn(gc.run(gc_stop_rx)));
        Ok(RunningController {
            leadership,
            metrics,
            metrics_addr,
            shutdown,
            gc_stop,
            gc_task,
            tasks,
        })
    }
}

impl RunningController {
    /// Whether this replica may act as leader now.
    pub fn is_leader(&self) -> bool {
        self.leadership.is_leader()
    }

    /// A clone of the leadership view.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The bound metrics address (useful with port 0).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops GC (waiting for an in-flight delete), then releases the Lease
    /// if held and stops the endpoints.
    pub async fn shutdown(mut self) {
        self.gc_stop.send_replace(true);
        if let Some(gc) = self.gc_task.take() {
            if let Err(e) = gc.await {
                tracing::warn!(error = %Chain(&e), "GC task ended abnormally");
            }
        }
        self.shutdown.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            if let Err(e) = task.await {
                tracing::warn!(error = %Chain(&e), "controller task ended abnormally");
            }
        }
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        for task in self.tasks.iter().chain(self.gc_task.as_ref()) {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube's `KubeconfigError` prints its io error and returns it as source too;
    /// the chain still shows every cause once.
    #[test]
    fn a_missing_kubeconfig_is_reported_with_each_cause_once() {
        let path = std::path::PathBuf::from("/nonexistent/kubeconfig");
        let source = kube::config::Kubeconfig::read_from(&path).unwrap_err();
        let err = ControllerError::Kubeconfig { path, source };
        assert_eq!(
            err.to_string(),
            "cannot use kubeconfig /nonexistent/kubeconfig"
        );
        let text = Chain(&err).to_string();
        assert!(
            text.starts_with("cannot use kubeconfig /nonexistent/kubeconfig: "),
            "{text}"
        );
        assert_eq!(
            text.matches("No such file or directory").count(),
            1,
            "{text}"
        );
    }
}
