//! Events the agent records:
//!
//! * about Services: a Service whose frontends this node could not program
//!   (the service maps' slots are full) gets a Warning that `kubectl
//!   describe service` shows, besides the metric
//!   (`cozyplane_service_unfitted_frontends`) and the log line. Issue #11: a
//!   Service that does not fit is reported, never half-programmed.
//! * about policies: a NetworkPolicy, Cilium policy or HostFirewall that the
//!   compile could not enforce as written (enforced fail closed, or a part
//!   outside the Cilium subset) gets a Warning naming what and how
//!   (`docs/policy.md`), besides the metric and the log line.
//!
//! One Event per object, node, reason (and, for policies, diagnostic),
//! named after them: a repeat bumps its `count` and `lastTimestamp` (as
//! kube's recorder does) instead of piling up objects. The agent records an
//! Event when a condition *starts*, not on each retry. Events about
//! cluster-scoped objects go to `default`, as kube's do.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Service};

use crate::compile::netpol::NpDiagnostic;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;

/// The reason of the Warning about a Service that does not fit.
pub const REASON_UNFITTED: &str = "FailedToProgramFrontends";
/// The reason of the Warning about a policy not enforced as written.
pub const REASON_POLICY: &str = "PolicyNotEnforcedAsWritten";

/// A Warning about an object, to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The object's `apiVersion`.
    pub api_version: &'static str,
    /// Its kind.
    pub kind: &'static str,
    /// Its namespace; empty for a cluster-scoped object (the Event goes to
    /// `default`).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid, if known.
    pub uid: Option<String>,
    /// The reason (`REASON_*`).
    pub reason: &'static str,
    /// The message.
    pub message: String,
    /// Tells apart Events of one object, node and reason (empty: one).
    pub distinct: String,
}

/// The name Services' warnings had before policies had any.
pub type ServiceWarning = Warning;

impl Warning {
    /// The Warning about the policy a compile diagnostic names, on `node`.
    pub fn policy(d: &NpDiagnostic, node: &str) -> Self {
        let (api_version, kind, namespace, name) = d.object();
        let message = format!("node {node}: {d}");
        Self {
            api_version,
            kind,
            namespace,
            name,
            uid: None,
            reason: REASON_POLICY,
            distinct: d.to_string(),
            message,
        }
    }

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
            api_version: "v1",
            kind: "Service",
            distinct: String::new(),
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
                namespace: Some(self.event_namespace().into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(self.api_version.into()),
                kind: Some(self.kind.into()),
                namespace: (!self.namespace.is_empty()).then(|| self.namespace.clone()),
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

    /// Where the Event lives: the object's namespace, else `default`.
    pub fn event_namespace(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }

    /// `<object>.<hash of node, reason and distinct>`: one Event per object,
    /// node, reason (and diagnostic).
    fn event_name(&self, node: &str) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in node
            .bytes()
            .chain([0])
            .chain(self.reason.bytes())
            .chain([0])
            .chain(self.distinct.bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{}.{h:016x}", self.name)
    }
}

const COMPONENT: &str = "cozyplane-agent";

/// Records `w` on the API server; failures are logged, never fatal.
pub async fn record(client: &Client, node: &str, w: &Warning) {
    let api: Api<Event> = Api::namespaced(client.clone(), w.event_namespace());
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
        tracing::warn!(kind = w.kind, object = %format!("{}/{}", w.namespace, w.name), reason = w.reason, error = %e, "recording an event failed");
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

    #[test]
    fn a_policy_warning_names_its_object_and_lands_where_kube_puts_it() {
        let d = NpDiagnostic::CiliumOutside {
            policy: "CiliumNetworkPolicy shop/web".into(),
            field: "spec.egress[0].toFQDNs".into(),
            effect: "the rule admits nothing (fail closed)",
        };
        let w = Warning::policy(&d, "n1");
        let ev = w.event("n1", Timestamp::UNIX_EPOCH);
        assert_eq!(ev.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(
            ev.involved_object.kind.as_deref(),
            Some("CiliumNetworkPolicy")
        );
        assert_eq!(
            ev.involved_object.api_version.as_deref(),
            Some("cilium.io/v2")
        );
        assert_eq!(ev.involved_object.name.as_deref(), Some("web"));
        assert_eq!(ev.reason.as_deref(), Some(REASON_POLICY));
        assert!(
            w.message
                .starts_with("node n1: CiliumNetworkPolicy shop/web: spec.egress[0].toFQDNs"),
            "{}",
            w.message
        );
        // cluster-scoped: the Event goes to default, the reference has no namespace
        let d = NpDiagnostic::BadPort {
            policy: "HostFirewall edge".into(),
            port: "ICMP/None-None".into(),
        };
        let ev = Warning::policy(&d, "n1").event("n1", Timestamp::UNIX_EPOCH);
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(ev.involved_object.namespace, None);
        assert_eq!(ev.involved_object.kind.as_deref(), Some("HostFirewall"));
        // a plain NetworkPolicy; two diagnostics of one object are two Events
        let a = NpDiagnostic::BadCidr {
            policy: "x/p".into(),
            cidr: "nope".into(),
        };
        let b = NpDiagnostic::BadCidr {
            policy: "x/p".into(),
            cidr: "nah".into(),
        };
        let (wa, wb) = (Warning::policy(&a, "n1"), Warning::policy(&b, "n1"));
        assert_eq!(wa.kind, "NetworkPolicy");
        assert_eq!((wa.namespace.as_str(), wa.name.as_str()), ("x", "p"));
        assert_ne!(wa.event_name("n1"), wb.event_name("n1"));
    }
}
