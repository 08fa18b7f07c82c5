//! The hooks of the tenant kinds of `sdn.cozystack.io`: the virtual verbs
//! on VPCs that tenancy hangs on.
//!
//! - A `VPCBinding` brings a VPC into the binding's namespace: its writer
//!   must hold verb `export` on that VPC (`vpcs/<name>` in the VPC's
//!   namespace), at create and whenever an update changes `spec.vpcRef`
//!   (so writes that keep the reference, such as the controller's
//!   finalizers, need no export right).
//! - A `VPCPeering` is one half of a peering of a local VPC: its creator
//!   must hold verb `peer` on that VPC (the spec is immutable, so create is
//!   the only time to ask).
//!
//! kube's edit role gets both verbs on VPCs of its namespace
//! (`auth/bootstrap.rs`); an owner grants `export` of one VPC to another
//! tenant with a Role naming it in `resourceNames`.

use cozyplane_api::kinds::KindInfo;
use serde_json::Value;

use crate::auth::Attributes;
use crate::hooks::KindHooks;

fn on_vpc(verb: &str, namespace: &str, name: &str) -> Attributes {
    Attributes {
        verb: verb.into(),
        group: cozyplane_api::labels::SDN_GROUP.into(),
        resource: "vpcs".into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Attributes::default()
    }
}

/// The VPC a binding names: (namespace, name), the namespace defaulting
/// to the binding's.
fn bound_vpc(obj: &Value) -> (String, String) {
    let r = obj.pointer("/spec/vpcRef").cloned().unwrap_or(Value::Null);
    let own = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let ns = r
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(own);
    let name = r.get("name").and_then(Value::as_str).unwrap_or_default();
    (ns.to_string(), name.to_string())
}

fn binding_questions(new: &Value, old: Option<&Value>) -> Vec<Attributes> {
    let vpc = bound_vpc(new);
    if old.map(bound_vpc).as_ref() == Some(&vpc) {
        return Vec::new();
    }
    vec![on_vpc("export", &vpc.0, &vpc.1)]
}

fn peering_questions(new: &Value, old: Option<&Value>) -> Vec<Attributes> {
    if old.is_some() {
        return Vec::new();
    }
    let ns = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = new
        .pointer("/spec/vpcRef/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    vec![on_vpc("peer", ns, name)]
}

/// The hooks of a kind served by the server (none for most).
pub fn hooks_for(info: &KindInfo) -> KindHooks {
    let questions: Option<crate::hooks::SecondQuestions> = match (info.group, info.plural) {
        (cozyplane_api::labels::SDN_GROUP, "vpcbindings") => Some(binding_questions),
        (cozyplane_api::labels::SDN_GROUP, "vpcpeerings") => Some(peering_questions),
        _ => None,
    };
    KindHooks {
        second_questions: questions,
        ..KindHooks::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bindings_ask_export_on_create_and_on_retarget_only() {
        let b = |ns: Option<&str>, name: &str| {
            let mut r = json!({"name": name});
            if let Some(ns) = ns {
                r["namespace"] = json!(ns);
            }
            json!({"metadata": {"namespace": "b", "name": "x"}, "spec": {"vpcRef": r}})
        };
        let q = binding_questions(&b(Some("a"), "net"), None);
        assert_eq!(q, [on_vpc("export", "a", "net")]);
        assert_eq!(
            binding_questions(&b(None, "own"), None),
            [on_vpc("export", "b", "own")]
        );
        assert!(binding_questions(&b(Some("a"), "net"), Some(&b(Some("a"), "net"))).is_empty());
        assert_eq!(
            binding_questions(&b(Some("a"), "other"), Some(&b(Some("a"), "net"))),
            [on_vpc("export", "a", "other")]
        );
        let p = json!({"metadata": {"namespace": "a"}, "spec": {"vpcRef": {"name": "net"}}});
        assert_eq!(peering_questions(&p, None), [on_vpc("peer", "a", "net")]);
        assert!(peering_questions(&p, Some(&p)).is_empty());
    }
}
