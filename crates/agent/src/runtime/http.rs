//! `/healthz`, `/readyz` and Prometheus `/metrics`.
//!
//! * `/healthz`: the process serves (200 always).
//! * `/readyz`: 200 once the datapath is set up and the first sync of the
//!   overlay maps converged (Service frontends that did not fit the slots
//!   aside: reported and retried, see `watch::run`); 503 before.
//! * `/metrics`: the agent's registry (`runtime::metrics`) in the Prometheus
//!   text format 0.0.4: entries and memlock bytes per map, drops by reason
//!   (read from the kernel at scrape time), sync counters and the CNI request
//!   latency histogram.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use cozyplane_errors::Chain;
use tokio::sync::watch;

use super::error::AgentError;
use super::kernel::SharedDatapath;
use super::metrics::{AgentMetrics, CONTENT_TYPE};

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// The datapath (maps).
    pub dp: SharedDatapath,
    /// The registry.
    pub metrics: Arc<AgentMetrics>,
    /// The sync loop's state (the served VPCs' names label the meters).
    pub stats: Arc<super::watch::SyncStats>,
    /// Readiness.
    pub ready: watch::Receiver<bool>,
}

/// Binds `addr` (before any other setup, so a bad address fails fast) and
/// returns the server future.
pub async fn serve(
    addr: SocketAddr,
    state: HttpState,
) -> Result<impl std::future::Future<Output = std::io::Result<()>>, AgentError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| AgentError::io("bind metrics", addr.to_string(), e))?;
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    Ok(async move { axum::serve(listener, app).await })
}

async fn readyz(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    if *s.ready.borrow() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(s): State<HttpState>) -> Response {
    let dp = s.dp.clone();
    let metrics = s.metrics.clone();
    let names = s.stats.vpc_names();
    let out = tokio::task::spawn_blocking(move || {
        let guard = dp.lock();
        metrics.read_maps(&guard)?;
        metrics.read_vpcs(&guard, &names)?;
        Ok::<_, cozyplane_datapath::DatapathError>(metrics.encode())
    })
    .await;
    match out {
        Ok(Ok(text)) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", Chain(&e)),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", Chain(&e)),
        )
            .into_response(),
    }
}
