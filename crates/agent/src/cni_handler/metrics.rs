//! What the handler measures: the time to serve each plugin request, by CNI
//! command and outcome. The runtime registers it with the agent's registry
//! (`runtime::metrics`); the handler only observes.

use std::time::Duration;

use cozyplane_cni::proto::Request;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Bucket upper bounds in seconds: an ADD takes tens of milliseconds on an
/// idle node (docs/agent.md) and up to about a second under a burst.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The labels of one histogram: the CNI command (`ADD`, `DEL`, `CHECK`,
/// `STATUS`, `GC`) and `ok` or `error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CniRequestLabels {
    op: &'static str,
    result: &'static str,
}

type Histograms = Family<CniRequestLabels, Histogram, fn() -> Histogram>;

/// `cozyplane_cni_request_duration_seconds`. Cloning shares the histograms.
#[derive(Clone, Debug)]
pub struct CniMetrics {
    duration: Histograms,
}

impl Default for CniMetrics {
    fn default() -> Self {
        let new: fn() -> Histogram = || Histogram::new(BUCKETS);
        CniMetrics {
            duration: Family::new_with_constructor(new),
        }
    }
}

impl CniMetrics {
    /// Adds the histogram to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cozyplane_cni_request_duration_seconds",
            "Time the agent took to serve a CNI plugin request, by command and outcome",
            self.duration.clone(),
        );
    }

    /// Records one served request: `op` is its [`command`], `ok` is false
    /// when the answer was a CNI error or could not be delivered.
    pub fn observe(&self, op: &'static str, ok: bool, elapsed: Duration) {
        let labels = CniRequestLabels {
            op,
            result: if ok { "ok" } else { "error" },
        };
        self.duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}

/// The request's `CNI_COMMAND`.
pub fn command(req: &Request) -> &'static str {
    match req {
        Request::Add(_) => "ADD",
        Request::Del(_) => "DEL",
        Request::Check(_) => "CHECK",
        Request::Status(_) => "STATUS",
        Request::Gc(_) => "GC",
    }
}
