//! Prometheus metrics: request counts per verb, resource and code, and a
//! latency histogram per verb and resource, in the text exposition format.
//! Label cardinality is bounded by the registered kinds and verbs.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket upper bounds, in seconds (kube-apiserver's coarse set).
const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; 11],
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, String, u16), u64>,
    latency: BTreeMap<(String, String), Histogram>,
}

/// The server's metrics registry.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Record one finished request. Watches record their setup latency.
    pub fn observe(&self, verb: &str, resource: &str, code: u16, elapsed: Duration) {
        let Ok(mut m) = self.inner.lock() else { return };
        *m.requests
            .entry((verb.to_string(), resource.to_string(), code))
            .or_default() += 1;
        let h = m
            .latency
            .entry((verb.to_string(), resource.to_string()))
            .or_default();
        let secs = elapsed.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                h.counts[i] += 1;
            }
        }
        h.sum += secs;
        h.count += 1;
    }

    /// Render the text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let Ok(m) = self.inner.lock() else { return out };
        out.push_str("# HELP apiserver_request_total Counter of API requests by verb, resource and HTTP code.\n");
        out.push_str("# TYPE apiserver_request_total counter\n");
        for ((verb, resource, code), n) in &m.requests {
            let _ = writeln!(out, "apiserver_request_total{{verb=\"{verb}\",resource=\"{resource}\",code=\"{code}\"}} {n}");
        }
        out.push_str(
            "# HELP apiserver_request_duration_seconds Response latency by verb and resource.\n",
        );
        out.push_str("# TYPE apiserver_request_duration_seconds histogram\n");
        for ((verb, resource), h) in &m.latency {
            let l = format!("verb=\"{verb}\",resource=\"{resource}\"");
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "apiserver_request_duration_seconds_bucket{{{l},le=\"{b}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "apiserver_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "apiserver_request_duration_seconds_sum{{{l}}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "apiserver_request_duration_seconds_count{{{l}}} {}",
                h.count
            );
        }
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
    }
}
