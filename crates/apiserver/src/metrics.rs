//! Prometheus metrics: request counts per verb, resource and code, a
//! latency histogram per verb and resource, and the number of open watches,
//! in a prometheus-client registry
//! served in the Prometheus text format 0.0.4. Label cardinality is bounded by
//! the registered kinds and verbs.

use std::time::Duration;

use prometheus_client::encoding::{prometheus_text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`Metrics::render`] writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Histogram bucket upper bounds, in seconds (kube-apiserver's coarse set).
const BUCKETS: [f64; 11] = [
    0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    verb: String,
    resource: String,
}

/// The server's metrics registry.
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    /// Open watches (kube-apiserver's `apiserver_registered_watchers`,
    /// without its per-kind labels); [`crate::watch::WatchSlots`] moves it.
    pub watchers: Gauge,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let new: fn() -> Histogram = || Histogram::new(BUCKETS);
        let latency = Family::new_with_constructor(new);
        let mut registry = Registry::default();
        // counters get `_total` when encoded; help texts get their full stop
        registry.register(
            "apiserver_request",
            "Counter of API requests by verb, resource and HTTP code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency by verb and resource",
            latency.clone(),
        );
        let watchers = Gauge::default();
        registry.register(
            "apiserver_registered_watchers",
            "Number of currently open watches",
            watchers.clone(),
        );
        Metrics {
            requests,
            latency,
            watchers,
            registry,
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Record one finished request. Watches record their setup latency.
    pub fn observe(&self, verb: &str, resource: &str, code: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
                code,
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Render the text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_buckets() {
        let m = Metrics::default();
        m.observe("get", "vpcs", 200, Duration::from_millis(10));
        m.observe("get", "vpcs", 200, Duration::from_millis(300));
        m.observe("get", "vpcs", 404, Duration::from_millis(1));
        let t = m.render();
        assert!(
            t.contains("apiserver_request_total{verb=\"get\",resource=\"vpcs\",code=\"200\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("apiserver_request_total{verb=\"get\",resource=\"vpcs\",code=\"404\"} 1")
        );
        assert!(t.contains("apiserver_request_duration_seconds_bucket{verb=\"get\",resource=\"vpcs\",le=\"0.025\"} 2"), "{t}");
        assert!(t.contains(
            "apiserver_request_duration_seconds_count{verb=\"get\",resource=\"vpcs\"} 3"
        ));
        // names, help and types as before the registry (dashboards use them)
        assert!(t.contains(
            "# HELP apiserver_request_total Counter of API requests by verb, resource and HTTP code.\n\
             # TYPE apiserver_request_total counter\n"
        ), "{t}");
        assert!(t.contains(
            "# HELP apiserver_request_duration_seconds Response latency by verb and resource.\n\
             # TYPE apiserver_request_duration_seconds histogram\n"
        ), "{t}");
        assert!(t.contains("apiserver_request_duration_seconds_bucket{verb=\"get\",resource=\"vpcs\",le=\"60\"} 3"), "{t}");
        assert!(t.contains("apiserver_request_duration_seconds_bucket{verb=\"get\",resource=\"vpcs\",le=\"+Inf\"} 3"), "{t}");
        assert!(t.contains("apiserver_registered_watchers 0\n"), "{t}");
    }
}
