//! `/healthz`, `/readyz` and Prometheus `/metrics`.
//!
//! * `/healthz`: the process serves (200 always).
//! * `/readyz`: 200 once the datapath is set up and the first sync of the
//!   overlay maps converged; 503 before.
//! * `/metrics`: entries and memlock bytes per map (map memory is charged to
//!   the agent's cgroup and once OOM-killed the prior agent, lessons 8.3
//!   #21), drops by reason from `cp_drops`, sync counters. Read from the
//!   kernel at scrape time, so they are never stale.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use cozyplane_datapath::Datapath;
use cozyplane_errors::Chain;
use tokio::sync::watch;

use super::error::AgentError;
use super::kernel::SharedDatapath;
use super::watch::SyncStats;

/// What the endpoints read.
#[derive(Clone)]
pub struct HttpState {
    /// The datapath (maps).
    pub dp: SharedDatapath,
    /// Sync counters.
    pub stats: Arc<SyncStats>,
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

async fn metrics(State(s): State<HttpState>) -> (StatusCode, String) {
    let dp = s.dp.clone();
    let stats = s.stats.clone();
    let out = tokio::task::spawn_blocking(move || render(&dp.lock(), &stats)).await;
    match out {
        Ok(Ok(text)) => (StatusCode::OK, text),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", Chain(&e)),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\n", Chain(&e)),
        ),
    }
}

/// The metrics text (Prometheus exposition format 0.0.4).
pub fn render(
    dp: &Datapath,
    stats: &SyncStats,
) -> Result<String, cozyplane_datapath::DatapathError> {
    let counts: [(&str, usize); 11] = [
        (dp.locals.name(), dp.locals.entries()?.len()),
        (dp.remotes.name(), dp.remotes.entries()?.len()),
        (dp.node_remotes.name(), dp.node_remotes.entries()?.len()),
        (dp.ports.name(), dp.ports.entries()?.len()),
        (dp.vnis.name(), dp.vnis.entries()?.len()),
        (dp.vteps.name(), dp.vteps.entries()?.len()),
        (dp.learned.name(), dp.learned.entries()?.len()),
        (dp.masq_fwd.name(), dp.masq_fwd.entries()?.len()),
        (dp.masq_rev.name(), dp.masq_rev.entries()?.len()),
        (dp.masq_srcs.name(), dp.masq_srcs.entries()?.len()),
        (dp.internal.name(), dp.internal.entries()?.len()),
    ];
    let mut o = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        o,
        "# HELP cozyplane_map_entries Entries in a pinned datapath map."
    );
    let _ = writeln!(o, "# TYPE cozyplane_map_entries gauge");
    for (name, n) in counts {
        let _ = writeln!(o, "cozyplane_map_entries{{map=\"{name}\"}} {n}");
    }
    let _ = writeln!(
        o,
        "# HELP cozyplane_map_memlock_bytes Kernel memory charged to a map."
    );
    let _ = writeln!(o, "# TYPE cozyplane_map_memlock_bytes gauge");
    for m in dp.map_stats()? {
        let _ = writeln!(
            o,
            "cozyplane_map_memlock_bytes{{map=\"{}\"}} {}",
            m.name, m.memlock_bytes
        );
    }
    let _ = writeln!(
        o,
        "# HELP cozyplane_drops_total Packets dropped by the datapath."
    );
    let _ = writeln!(o, "# TYPE cozyplane_drops_total counter");
    for (reason, n) in dp.drops()? {
        let _ = writeln!(
            o,
            "cozyplane_drops_total{{reason=\"{}\"}} {n}",
            reason.label()
        );
    }
    for (name, help, v) in [
        (
            "cozyplane_syncs_total",
            "Overlay map syncs run.",
            &stats.syncs,
        ),
        (
            "cozyplane_sync_failures_total",
            "Overlay map syncs that did not converge.",
            &stats.failed_syncs,
        ),
        (
            "cozyplane_sync_changes_total",
            "Overlay map entries written or removed.",
            &stats.changes,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} counter");
        let _ = writeln!(o, "{name} {}", v.load(Ordering::Relaxed));
    }
    let _ = writeln!(
        o,
        "# HELP cozyplane_compile_diagnostics Objects the last compile skipped."
    );
    let _ = writeln!(o, "# TYPE cozyplane_compile_diagnostics gauge");
    let _ = writeln!(
        o,
        "cozyplane_compile_diagnostics {}",
        stats.diagnostics.load(Ordering::Relaxed)
    );
    Ok(o)
}
