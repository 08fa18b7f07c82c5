//! Events about pods, as a kubelet records them: `kubectl get events` and
//! `kubectl describe pod` show why a pod does not start (a CNI ADD refused
//! by the network, say) without reading the kubelet's log.
//!
//! One Event per pod, reason and message, named after them (kube's
//! `<pod>.<hash>` scheme): a repeat bumps its `count` and `lastTimestamp`
//! instead of piling up objects while the kubelet retries.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::plan::WorkloadPlan;
use super::{klog, Ctx};

/// kube's reason for a pod whose network cannot be set up.
pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";

/// Records a Warning about `pod`; failures are logged, never fatal.
pub(crate) async fn warn(ctx: &Ctx, pod: &WorkloadPlan, reason: &str, message: &str) {
    let api: Api<Event> = Api::namespaced(ctx.client.clone(), &pod.namespace);
    let name = event_name(pod, reason, message);
    let now = Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: None::<MicroTime>,
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(ctx.node.clone()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(ctx.node.clone()),
        }),
        ..Event::default()
    };
    match api.create(&PostParams::default(), &event).await {
        Ok(_) => return,
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => {
            klog!(
                "pod {}/{}: recording event {reason}: {e}",
                pod.namespace,
                pod.name
            );
            return;
        }
    }
    // A repeat: count it.
    let count = match api.get(&name).await {
        Ok(ev) => ev.count.unwrap_or(1) + 1,
        Err(_) => 2,
    };
    let patch = serde_json::json!({"count": count, "lastTimestamp": Time(now)});
    if let Err(e) = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        klog!(
            "pod {}/{}: counting event {reason}: {e}",
            pod.namespace,
            pod.name
        );
    }
}

/// `<pod>.<16 hex digits>`: FNV-1a of the pod UID, reason and message, so
/// a restarted kubelet finds the same Event again.
fn event_name(pod: &WorkloadPlan, reason: &str, message: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [pod.uid.as_str(), reason, message] {
        for b in part.bytes().chain(std::iter::once(0)) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{}.{h:016x}", pod.name)
}
