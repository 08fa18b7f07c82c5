//! Counters and the `/healthz`, `/readyz`, `/metrics` endpoints.
//!
//! Hand-rolled Prometheus text (a handful of counters does not justify a
//! metrics registry dependency), like the agent's.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::leader::Leadership;

/// What the GC loop counts. All counters are monotonic.
#[derive(Debug, Default)]
pub struct Metrics {
    /// FabricIPs deleted by GC.
    pub deletions: AtomicU64,
    /// Cache candidates a live pod read proved alive (cache lag).
    pub saved_by_live_read: AtomicU64,
    /// Deletes refused by the UID / resourceVersion precondition.
    pub precondition_conflicts: AtomicU64,
    /// API errors during GC.
    pub errors: AtomicU64,
    /// Completed GC passes.
    pub passes: AtomicU64,
    /// Claims in the cache at the last pass (gauge).
    pub claims: AtomicU64,
    /// Claims inside their grace period at the last pass (gauge).
    pub young_claims: AtomicU64,
    /// Both watch caches have listed once.
    pub caches_synced: AtomicBool,
}

impl Metrics {
    /// Adds one to a counter.
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets a gauge.
    pub fn set(gauge: &AtomicU64, value: usize) {
        gauge.store(u64::try_from(value).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every counter plus the leader gauge.
    pub fn render(&self, leader: bool) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &AtomicU64); 5] = [
            (
                "cozyplane_controller_gc_deletions_total",
                "FabricIP claims deleted by garbage collection.",
                &self.deletions,
            ),
            (
                "cozyplane_controller_gc_saved_by_live_read_total",
                "Claims the watch cache judged garbage but a live pod read proved alive.",
                &self.saved_by_live_read,
            ),
            (
                "cozyplane_controller_gc_precondition_conflicts_total",
                "Claim deletions refused because the claim changed or was re-created.",
                &self.precondition_conflicts,
            ),
            (
                "cozyplane_controller_gc_errors_total",
                "API errors during garbage collection.",
                &self.errors,
            ),
            (
                "cozyplane_controller_gc_passes_total",
                "Completed garbage collection passes.",
                &self.passes,
            ),
        ];
        for (name, help, value) in counters {
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                Self::get(value)
            );
        }
        for (name, help, value) in [
            (
                "cozyplane_controller_fabricips",
                "FabricIP claims in the watch cache at the last GC pass.",
                &self.claims,
            ),
            (
                "cozyplane_controller_fabricips_in_grace",
                "FabricIP claims too young to be judged at the last GC pass.",
                &self.young_claims,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                Self::get(value)
            );
        }
        let _ = writeln!(
            out,
            "# HELP cozyplane_controller_leader 1 while this replica holds the leader lease.\n\
             # TYPE cozyplane_controller_leader gauge\ncozyplane_controller_leader {}",
            u8::from(leader)
        );
        out
    }
}

#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    leadership: Leadership,
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<Shared>) -> impl IntoResponse {
    if s.metrics.caches_synced.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watch caches not synced")
    }
}

async fn metrics_text(State(s): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(s.leadership.is_leader()),
    )
}

/// Binds `addr` now (so a port conflict fails startup) and returns the
/// bound address and the serving future, which ends when `shutdown` flips.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    leadership: Leadership,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(Shared {
            metrics,
            leadership,
        });
    let fut = async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                while !*shutdown.borrow() {
                    if shutdown.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await
    };
    Ok((local, fut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_exposes_counters_and_leader_gauge() {
        let m = Metrics::default();
        Metrics::inc(&m.deletions);
        Metrics::inc(&m.deletions);
        Metrics::inc(&m.errors);
        let text = m.render(true);
        assert!(
            text.contains("\ncozyplane_controller_gc_deletions_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains("\ncozyplane_controller_gc_errors_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "# TYPE cozyplane_controller_leader gauge\ncozyplane_controller_leader 1\n"
            ),
            "{text}"
        );
        assert!(m
            .render(false)
            .contains("\ncozyplane_controller_leader 0\n"));
    }
}
