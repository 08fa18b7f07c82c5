//! The core/v1 Pod rules the standalone API server implements on top of the
//! generic registry, as [`KindHooks`]: graceful deletion and the `binding`
//! subresource. Both follow kube-apiserver's pod strategy:
//!
//! - A DELETE of a pod bound to a node and not terminal only marks it
//!   (deletionTimestamp, deletionGracePeriodSeconds); the kubelet stops it
//!   and deletes it again with `gracePeriodSeconds=0`. The grace period is
//!   the request's, else `spec.terminationGracePeriodSeconds`, else 30; an
//!   unbound or terminal (Succeeded/Failed) pod gets 0, i.e. goes at once;
//!   a negative period becomes 1, one over 100 years becomes 100 years
//!   ([`MAX_GRACE_SECONDS`]).
//! - On every write, a negative `spec.terminationGracePeriodSeconds`
//!   becomes 1, as kube-apiserver's pod strategy makes it since 1.27
//!   (kubernetes#115606; kube validation does not refuse it), and a value
//!   that is not an int64 (`1.5`, `1e30`, `"30"`, 2^63) answers 400 as
//!   kube's decoder does. A huge one is kept; deletion clamps it.
//! - `POST pods/<name>/binding` sets `spec.nodeName` once: 409 when the pod
//!   is already bound or being deleted.

use cozyplane_api::kinds::{FieldError, FieldErrorType};
use serde_json::{json, Value};

use crate::hooks::{CreateSubresource, KindHooks};
use crate::limits::MAX_GRACE_SECONDS;
use crate::meta;
use crate::registry::now_rfc3339;
use crate::status::ApiError;

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;

/// The hooks of core/v1 pods.
pub fn hooks() -> KindHooks {
    KindHooks {
        grace_period: Some(grace_period),
        prepare: Some(prepare),
        create_subresources: &[BINDING],
        ..KindHooks::default()
    }
}

/// The `pods/binding` subresource.
pub const BINDING: CreateSubresource = CreateSubresource {
    name: "binding",
    kind: "Binding",
    validate: validate_binding,
    apply: apply_binding,
};

fn node_name(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The grace period a DELETE of `pod` gets (see the module doc).
pub fn grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let period = requested.unwrap_or_else(|| {
        pod.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_GRACE_SECONDS)
    });
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if node_name(pod).is_empty() || matches!(phase, "Succeeded" | "Failed") {
        return 0;
    }
    if period < 0 {
        return 1;
    }
    period.min(MAX_GRACE_SECONDS)
}

/// Normalize a pod about to be written (see the module doc).
pub fn prepare(pod: &mut Value) -> Result<(), ApiError> {
    let Some(g) = pod.pointer_mut("/spec/terminationGracePeriodSeconds") else {
        return Ok(());
    };
    match g.as_i64() {
        Some(v) if v < 0 => *g = json!(1),
        Some(_) => {}
        None if g.is_null() => {}
        None => {
            return Err(ApiError::bad_request(format!(
                "Pod in version \"v1\" cannot be handled as a Pod: \
                 spec.terminationGracePeriodSeconds: cannot unmarshal {g} into an int64"
            )))
        }
    }
    Ok(())
}

fn binding_invalid(name: &str, errs: &[FieldError]) -> ApiError {
    ApiError::invalid("", "Binding", name, errs)
}

/// A `v1.Binding` must name the pod of the URL (or no pod) and target a
/// node by name.
fn validate_binding(body: &Value, parent_name: &str) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("a Binding must be a JSON object"));
    }
    let name = meta::meta_str(body, "name").unwrap_or("");
    if !name.is_empty() && name != parent_name {
        return Err(ApiError::bad_request(format!(
            "name in URL ({parent_name}) does not match name in Binding object ({name})"
        )));
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str) {
        if !k.is_empty() && k != "Binding" {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind (Binding)"
            )));
        }
    }
    let mut errs = Vec::new();
    let target = body.get("target");
    let target_kind = target
        .and_then(|t| t.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if !target_kind.is_empty() && target_kind != "Node" {
        errs.push(FieldError::new(
            FieldErrorType::NotSupported,
            "target.kind",
            format!("Unsupported value: {target_kind:?}: supported values: \"Node\", \"<empty>\""),
        ));
    }
    let target_name = target
        .and_then(|t| t.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if target_name.is_empty() {
        errs.push(FieldError::new(
            FieldErrorType::Required,
            "target.name",
            "Required value",
        ));
    } else if !meta::is_dns1123_subdomain(target_name) {
        errs.push(FieldError::new(
            FieldErrorType::Invalid,
            "target.name",
            format!("Invalid value: {target_name:?}: must be a valid node name"),
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(binding_invalid(parent_name, &errs))
    }
}

/// Bind `pod` to the binding's node: set `spec.nodeName`, add the binding's
/// annotations and a `PodScheduled=True` condition, as kube's binding
/// storage does.
fn apply_binding(pod: &Value, body: &Value) -> Result<Value, ApiError> {
    let name = meta::meta_str(pod, "name").unwrap_or("");
    let conflict = |why: String| ApiError::conflict("", "pods", name, &why);
    if let Some(uid) = meta::meta_str(body, "uid").filter(|u| !u.is_empty()) {
        let actual = meta::meta_str(pod, "uid").unwrap_or("");
        if uid != actual {
            return Err(conflict(format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
            )));
        }
    }
    if meta::meta_str(pod, "deletionTimestamp").is_some() {
        return Err(conflict(format!(
            "pod {name} is being deleted, cannot be assigned to a host"
        )));
    }
    let bound = node_name(pod);
    if !bound.is_empty() {
        return Err(conflict(format!(
            "pod {name} is already assigned to node {bound:?}"
        )));
    }
    let node = body
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut new = pod.clone();
    let Some(obj) = new.as_object_mut() else {
        return Err(ApiError::internal("stored pod is not an object"));
    };
    let spec = obj.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return Err(ApiError::internal("stored pod spec is not an object"));
    };
    spec.insert("nodeName".into(), Value::String(node.to_string()));
    if let Some(extra) = body
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .filter(|a| !a.is_empty())
    {
        if let Some(m) = meta::meta_mut(&mut new) {
            let ann = m.entry("annotations").or_insert_with(|| json!({}));
            if let Some(ann) = ann.as_object_mut() {
                for (k, v) in extra {
                    ann.insert(k.clone(), v.clone());
                }
            }
        }
    }
    set_scheduled_condition(&mut new);
    Ok(new)
}

fn set_scheduled_condition(pod: &mut Value) {
    let Some(obj) = pod.as_object_mut() else {
        return;
    };
    let status = obj.entry("status").or_insert_with(|| json!({}));
    let Some(status) = status.as_object_mut() else {
        return;
    };
    let conds = status.entry("conditions").or_insert_with(|| json!([]));
    let Some(conds) = conds.as_array_mut() else {
        return;
    };
    conds.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
    conds.push(json!({
        "type": "PodScheduled",
        "status": "True",
        "lastProbeTime": null,
        "lastTransitionTime": now_rfc3339(),
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, phase: &str, tgps: Option<i64>) -> Value {
        let mut p = json!({"metadata": {"name": "p", "uid": "u1"}, "spec": {"containers": []}, "status": {}});
        if !node.is_empty() {
            p["spec"]["nodeName"] = json!(node);
        }
        if !phase.is_empty() {
            p["status"]["phase"] = json!(phase);
        }
        if let Some(t) = tgps {
            p["spec"]["terminationGracePeriodSeconds"] = json!(t);
        }
        p
    }

    #[test]
    fn prepare_clamps_negative_and_refuses_non_integer_grace() {
        let with = |g: Value| json!({"spec": {"terminationGracePeriodSeconds": g}});
        for (given, stored) in [
            (json!(-5), json!(1)),
            (json!(i64::MIN), json!(1)),
            (json!(0), json!(0)),
            (json!(i64::MAX), json!(i64::MAX)),
            (Value::Null, Value::Null),
        ] {
            let mut p = with(given.clone());
            assert!(prepare(&mut p).is_ok(), "{given}");
            assert_eq!(p, with(stored), "{given}");
        }
        for bad in [json!(1e30), json!(1.5), json!("30"), json!(u64::MAX)] {
            let e = prepare(&mut with(bad.clone())).err();
            assert_eq!(e.map(|e| e.code), Some(400), "{bad}");
        }
        let mut no_spec = json!({"metadata": {}});
        assert!(prepare(&mut no_spec).is_ok());
    }

    #[test]
    fn grace_follows_request_then_spec_then_default() {
        assert_eq!(grace_period(&pod("n", "Running", None), None), 30);
        assert_eq!(grace_period(&pod("n", "Running", Some(7)), None), 7);
        assert_eq!(grace_period(&pod("n", "Running", Some(7)), Some(3)), 3);
        assert_eq!(grace_period(&pod("n", "Pending", None), Some(0)), 0);
        assert_eq!(grace_period(&pod("n", "Running", None), Some(-5)), 1);
        assert_eq!(grace_period(&pod("n", "Running", None), Some(i64::MIN)), 1);
        assert_eq!(
            grace_period(&pod("n", "Running", None), Some(i64::MAX)),
            MAX_GRACE_SECONDS
        );
        assert_eq!(
            grace_period(&pod("n", "Running", Some(i64::MAX)), None),
            MAX_GRACE_SECONDS
        );
    }

    #[test]
    fn unbound_and_terminal_pods_go_at_once() {
        assert_eq!(grace_period(&pod("", "Pending", Some(9)), None), 0);
        assert_eq!(grace_period(&pod("", "", None), Some(20)), 0);
        assert_eq!(grace_period(&pod("n", "Succeeded", None), None), 0);
        assert_eq!(grace_period(&pod("n", "Failed", None), Some(10)), 0);
    }

    #[test]
    fn binding_sets_the_node_once() {
        let body = json!({"metadata": {"name": "p", "annotations": {"a": "b"}}, "target": {"kind": "Node", "name": "n1"}});
        assert!(validate_binding(&body, "p").is_ok());
        let bound = apply_binding(&pod("", "Pending", None), &body);
        let bound = bound.unwrap_or_default();
        assert_eq!(bound["spec"]["nodeName"], "n1");
        assert_eq!(bound["metadata"]["annotations"]["a"], "b");
        assert_eq!(bound["status"]["conditions"][0]["type"], "PodScheduled");
        let again = apply_binding(&bound, &body)
            .err()
            .map(|e| (e.code, e.message));
        assert_eq!(
            again,
            Some((
                409,
                "Operation cannot be fulfilled on pods \"p\": pod p is already assigned to node \"n1\"".to_string()
            ))
        );
    }

    #[test]
    fn binding_refuses_a_pod_being_deleted_or_another_uid() {
        let body = json!({"target": {"name": "n1"}, "metadata": {"uid": "other"}});
        assert_eq!(
            apply_binding(&pod("", "", None), &body)
                .err()
                .map(|e| e.code),
            Some(409)
        );
        let mut p = pod("", "", None);
        p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let body = json!({"target": {"name": "n1"}});
        let e = apply_binding(&p, &body).err();
        assert!(e.is_some_and(|e| e.code == 409 && e.message.contains("being deleted")));
    }

    #[test]
    fn bad_bindings_are_invalid() {
        for body in [
            json!({"target": {"kind": "Pod", "name": "n1"}}),
            json!({"target": {"kind": "Node"}}),
            json!({}),
            json!({"target": {"name": "Not_A_Node"}}),
        ] {
            let e = validate_binding(&body, "p").err();
            assert_eq!(e.as_ref().map(|e| e.code), Some(422), "{body}");
        }
        let e = validate_binding(
            &json!({"metadata": {"name": "q"}, "target": {"name": "n"}}),
            "p",
        );
        assert_eq!(e.err().map(|e| e.code), Some(400));
    }
}
