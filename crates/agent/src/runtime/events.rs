//! Events the agent records about Services: a Service whose frontends this
//! node could not program (the service maps' slots are full) gets a Warning
//! that `kubectl describe service` shows, besides the metric
//! (`cozyplane_service_unfitted_frontends`) and the log line. Issue #11: a
//! Service that does not fit is reported, never half-programmed.
//!
//! One Event per Service, node and reason, named after them: a repeat bumps
//! its `count` and `lastTimestamp` (as kube's recorder does) instead of piling
//! up objects. The agent records an Event when a Service *starts* not
//! fitting, not on each retry.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;

/// The reason of the Warning about a Service that does not fit.
pub const REASON_UNFITTED: &str = "FailedToProgramFrontends";

/// A Warning about a Service, to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceWarning {
    /// The Service's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid, if known.
    pub uid: Option<String>,
    /// The reason (`REASON_*`).
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

impl ServiceWarning {
    /// The Warning for `svc`, whose `frontends` (displayed) did not fit on `node`.
    pub fn unfitted(svc: &Service, frontends: &[String], node: &str) -> Self {
        let shown: Vec<&str> = frontends.iter().take(4).map(String::as_str).collect();
        let more = frontends.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Self {
            namespace: svc.metadata.namespace.clone().unwrap_or_default(),
            name: svc.metadata.name.clone().unwrap_or_default(),
            uid: svc.metadata.uid.clone(),
            reason: REASON_UNFITTED,
            message: format!(
                "node {node}: {} frontend(s) not programmed, the service maps' backend slots are full: {}{more}; \
                 a frontend that was programmed before keeps its old backends (metric cozyplane_service_unfitted_frontends)",
                frontends.len(),
                shown.join(", ")
            ),
        }
    }

    /// The Event as created (the first time).
    pub fn event(&self, node: &str, now: Timestamp) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(self.event_name(node)),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: Some(self.namespace.clone()),
                name: Some(self.name.clone()),
                uid: self.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some(self.reason.into()),
            message: Some(self.message.clone()),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(node.into()),
            source: Some(EventSource {
                component: Some(COMPONENT.into()),
                host: Some(node.into()),
            }),
            ..Event::default()
        }
    }

    /// `<service>.<hash of node and reason>`: one object per Service, node and reason.
    fn event_name(&self, node: &str) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in node.bytes().chain([0]).chain(self.reason.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{}.{h:016x}", self.name)
    }
}

const COMPONENT: &str = "cozyplane-agent";

/// Records `w` on the API server; failures are logged, never fatal.
pub async fn record(client: &Client, node: &str, w: &ServiceWarning) {
    let api: Api<Event> = Api::namespaced(client.clone(), &w.namespace);
    let now = Timestamp::now();
    let event = w.event(node, now);
    let name = event.metadata.name.clone().unwrap_or_default();
    let outcome = match api.create(&PostParams::default(), &event).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // A repeat: count it.
            let count = match api.get(&name).await {
                Ok(ev) => ev.count.unwrap_or(1) + 1,
                Err(_) => 2,
            };
            let patch = serde_json::json!({
                "count": count, "lastTimestamp": Time(now), "message": w.message,
            });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        Err(e) => Err(e),
    };
    if let Err(e) = outcome {
        tracing::warn!(service = %format!("{}/{}", w.namespace, w.name), reason = w.reason, error = %e, "recording an event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_names_the_service_its_frontends_and_the_node() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web", "uid": "u-1"},
        }))
        .unwrap();
        let fronts: Vec<String> = (0..6).map(|i| format!("10.96.0.{i}:80/TCP")).collect();
        let w = ServiceWarning::unfitted(&svc, &fronts, "n1");
        assert!(w
            .message
            .starts_with("node n1: 6 frontend(s) not programmed"));
        assert!(
            w.message.contains("10.96.0.3:80/TCP and 2 more"),
            "{}",
            w.message
        );
        let ev = w.event("n1", Timestamp::UNIX_EPOCH);
        assert_eq!(ev.involved_object.kind.as_deref(), Some("Service"));
        assert_eq!(ev.involved_object.uid.as_deref(), Some("u-1"));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.metadata.namespace.as_deref(), Some("shop"));
        // one object per Service, node and reason
        let name = ev.metadata.name.unwrap();
        assert!(name.starts_with("web."));
        assert_eq!(
            w.event("n1", Timestamp::UNIX_EPOCH).metadata.name.unwrap(),
            name
        );
        assert_ne!(
            w.event("n2", Timestamp::UNIX_EPOCH).metadata.name.unwrap(),
            name
        );
    }
}
