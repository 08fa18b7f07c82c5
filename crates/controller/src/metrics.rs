//! Counters and the `/healthz`, `/readyz`, `/metrics` endpoints.
//!
//! The metrics live in a prometheus-client registry and are served in the
//! Prometheus text format 0.0.4, like the agent's and the API server's.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::leader::Leadership;

/// A gauge of a count (never negative).
pub type CountGauge = Gauge<u64, AtomicU64>;

/// A metric holding one count: a [`Counter`] or a [`CountGauge`].
pub trait CountValue {
    /// The current value.
    fn count(&self) -> u64;
}

impl CountValue for Counter {
    fn count(&self) -> u64 {
        self.get()
    }
}

impl CountValue for CountGauge {
    fn count(&self) -> u64 {
        self.get()
    }
}

/// What the GC loop counts. All counters are monotonic.
#[derive(Debug)]
pub struct Metrics {
    /// FabricIPs deleted by GC.
    pub deletions: Counter,
    /// Cache candidates a live pod read proved alive (cache lag).
    pub saved_by_live_read: Counter,
    /// Deletes refused by the UID / resourceVersion precondition.
    pub precondition_conflicts: Counter,
    /// API errors during GC.
    pub errors: Counter,
    /// Completed GC passes.
    pub passes: Counter,
    /// VNIClaims created (VNIs allocated).
    pub vni_claims: Counter,
    /// VNI claims refused because another writer held the VNI.
    pub vni_claim_conflicts: Counter,
    /// API errors of the VPC controller.
    pub vpc_errors: Counter,
    /// Claims in the cache at the last pass.
    pub claims: CountGauge,
    /// Claims inside their grace period at the last pass.
    pub young_claims: CountGauge,
    /// Both watch caches have listed once.
    pub caches_synced: AtomicBool,
    /// 1 while this replica leads; set from [`Leadership`] at each scrape.
    leader: Gauge,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Metrics {
            deletions: Counter::default(),
            saved_by_live_read: Counter::default(),
            precondition_conflicts: Counter::default(),
            errors: Counter::default(),
            passes: Counter::default(),
            vni_claims: Counter::default(),
            vni_claim_conflicts: Counter::default(),
            vpc_errors: Counter::default(),
            claims: CountGauge::default(),
            young_claims: CountGauge::default(),
            caches_synced: AtomicBool::new(false),
            leader: Gauge::default(),
            registry: Registry::default(),
        };
        m.with_registry()
    }
}

impl Metrics {
    /// Registers every metric (counters get `_total` when encoded; help texts
    /// get their full stop).
    fn with_registry(mut self) -> Self {
        let r = &mut self.registry;
        for (name, help, counter) in [
            (
                "cozyplane_controller_gc_deletions",
                "FabricIP claims deleted by garbage collection",
                &self.deletions,
            ),
            (
                "cozyplane_controller_gc_saved_by_live_read",
                "Claims the watch cache judged garbage but a live pod read proved alive",
                &self.saved_by_live_read,
            ),
            (
                "cozyplane_controller_gc_precondition_conflicts",
                "Claim deletions refused because the claim changed or was re-created",
                &self.precondition_conflicts,
            ),
            (
                "cozyplane_controller_gc_errors",
                "API errors during garbage collection",
                &self.errors,
            ),
            (
                "cozyplane_controller_gc_passes",
                "Completed garbage collection passes",
                &self.passes,
            ),
            (
                "cozyplane_controller_vni_claims",
                "VNIs allocated to VPCs (VNIClaims created)",
                &self.vni_claims,
            ),
            (
                "cozyplane_controller_vni_claim_conflicts",
                "VNI claims refused because another writer held the VNI",
                &self.vni_claim_conflicts,
            ),
            (
                "cozyplane_controller_vpc_errors",
                "API errors of the VPC controller",
                &self.vpc_errors,
            ),
        ] {
            r.register(name, help, counter.clone());
        }
        for (name, help, gauge) in [
            (
                "cozyplane_controller_fabricips",
                "FabricIP claims in the watch cache at the last GC pass",
                &self.claims,
            ),
            (
                "cozyplane_controller_fabricips_in_grace",
                "FabricIP claims too young to be judged at the last GC pass",
                &self.young_claims,
            ),
        ] {
            r.register(name, help, gauge.clone());
        }
        r.register(
            "cozyplane_controller_leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
        self
    }

    /// Adds one to a counter.
    pub fn inc(counter: &Counter) {
        counter.inc();
    }

    /// Sets a gauge.
    pub fn set(gauge: &CountGauge, value: usize) {
        gauge.set(u64::try_from(value).unwrap_or(u64::MAX));
    }

    /// Reads a counter or a count gauge.
    pub fn get(metric: &impl CountValue) -> u64 {
        metric.count()
    }

    /// The Prometheus text exposition of every counter plus the leader gauge.
    pub fn render(&self, leader: bool) -> String {
        self.leader.set(i64::from(leader));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
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
        [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
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
        Metrics::set(&m.claims, 3);
        let text = m.render(true);
        // names, help and types as before the registry (dashboards use them)
        assert!(
            text.contains(
                "# HELP cozyplane_controller_gc_deletions_total FabricIP claims deleted by garbage collection.\n\
                 # TYPE cozyplane_controller_gc_deletions_total counter\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "# TYPE cozyplane_controller_fabricips gauge\ncozyplane_controller_fabricips 3\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("\ncozyplane_controller_fabricips_in_grace 0\n"),
            "{text}"
        );
        assert!(
            text.contains("\ncozyplane_controller_gc_passes_total 0\n"),
            "{text}"
        );
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
