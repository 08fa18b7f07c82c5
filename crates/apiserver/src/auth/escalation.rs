//! RBAC escalation prevention, with kube's semantics: a user may write a
//! Role or ClusterRole only with permissions they hold themselves, and bind
//! a role only when they hold every permission it grants, unless they hold
//! the verb that waives the check (`escalate` on the role for role writes,
//! `bind` on the referenced role for bindings).
//!
//! Without it, anyone allowed to write roles (kube's namespace `admin` role
//! may, in its namespace) could grant themselves anything: create a Role
//! with `*` on `*` and bind it. "Holds" is asked of the authorizer one
//! permission at a time: every rule of the role is broken down into single
//! (verb, group, resource, name) or (verb, URL) permissions, and each must
//! be allowed. Wildcards are literal in the breakdown (a role granting verb
//! `*` needs a rule of the writer's granting `*`), which is kube's
//! `Covers`. The breakdown is capped ([`MAX_PERMISSIONS`]): a role whose
//! rules multiply out further can only be written with `escalate`/`bind`.
//!
//! Writes that change only what the garbage collector changes (finalizers,
//! owner references) are not checked, as in kube, so a controller can
//! finalize a binding it could not have made. A ClusterRole with an
//! `aggregationRule` needs `escalate` outright: its rules come from other
//! roles, chosen by labels, so what it will grant is not known at write
//! time.

use k8s_openapi::api::rbac::v1 as rbac;
use serde_json::Value;

use super::rbac::{Rule, GROUP};
use super::Attributes;

/// The most single permissions a role write is broken down into before
/// the check gives up (the writer then needs `escalate` or `bind`).
pub const MAX_PERMISSIONS: usize = 10_000;

/// What an RBAC write must be checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    /// Held, this permission waives the check (`escalate` or `bind`).
    pub waiver: Attributes,
    /// Whether only the waiver can allow the write (an aggregated
    /// ClusterRole).
    pub waiver_only: bool,
    /// The namespace the granted rules apply in (empty: cluster-wide).
    pub namespace: String,
    /// The permissions granted.
    pub grants: Grants,
}

/// Where the granted rules are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grants {
    /// In the object written (a role).
    Rules(Vec<Rule>),
    /// In the role a binding refers to.
    RoleRef {
        /// `roles` or `clusterroles`.
        plural: &'static str,
        /// The role's namespace (empty for a ClusterRole).
        namespace: String,
        name: String,
    },
}

/// The check a write of an RBAC object (`plural` in the RBAC group) needs,
/// `None` when it needs none (other kinds; GC-only updates).
pub fn check_for(plural: &str, new: &Value, old: Option<&Value>) -> Option<Escalation> {
    if old.is_some_and(|old| only_gc_fields_differ(new, old)) {
        return None;
    }
    let ns = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let name = new
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let on = |verb: &str, resource: &str, namespace: &str, name: &str| Attributes {
        verb: verb.into(),
        group: GROUP.into(),
        resource: resource.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Attributes::default()
    };
    match plural {
        "roles" | "clusterroles" => {
            let rules: Vec<rbac::PolicyRule> = new
                .get("rules")
                .cloned()
                .and_then(|r| serde_json::from_value(r).ok())
                .unwrap_or_default();
            let aggregated = plural == "clusterroles"
                && new.get("aggregationRule").is_some_and(|a| !a.is_null());
            Some(Escalation {
                waiver: on("escalate", plural, &ns, &name),
                waiver_only: aggregated,
                namespace: ns,
                grants: Grants::Rules(rules.iter().map(Rule::from).collect()),
            })
        }
        "rolebindings" | "clusterrolebindings" => {
            let r = new.get("roleRef")?;
            let kind = r.get("kind").and_then(Value::as_str).unwrap_or_default();
            let role = r
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let (role_plural, role_ns) = match kind {
                "ClusterRole" => ("clusterroles", String::new()),
                _ => ("roles", ns.clone()),
            };
            Some(Escalation {
                waiver: on("bind", role_plural, &ns, &role),
                waiver_only: false,
                namespace: ns,
                grants: Grants::RoleRef {
                    plural: role_plural,
                    namespace: role_ns,
                    name: role,
                },
            })
        }
        _ => None,
    }
}

/// Whether `new` and `old` differ only in what the garbage collector and
/// the server change (kube's `IsOnlyMutatingGCFields`).
fn only_gc_fields_differ(new: &Value, old: &Value) -> bool {
    const IGNORED: [&str; 9] = [
        "finalizers",
        "ownerReferences",
        "resourceVersion",
        "managedFields",
        "generation",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ];
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in IGNORED {
                m.remove(k);
            }
        }
        v
    };
    strip(new) == strip(old)
}

/// Too many single permissions to check one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the rules grant more than {MAX_PERMISSIONS} single permissions")]
pub struct TooMany;

/// Every single permission `rules` grant in `namespace`, as authorizer
/// questions (kube's `BreakdownRule`).
pub fn breakdown(rules: &[Rule], namespace: &str) -> Result<Vec<Attributes>, TooMany> {
    let mut out = Vec::new();
    let mut push = |a: Attributes| {
        if out.len() >= MAX_PERMISSIONS {
            return Err(TooMany);
        }
        out.push(a);
        Ok(())
    };
    for r in rules {
        for verb in &r.verbs {
            for group in &r.api_groups {
                for res in &r.resources {
                    let (resource, subresource) = match res.split_once('/') {
                        Some((r, s)) => (r, s),
                        None => (res.as_str(), ""),
                    };
                    let one = |name: &str| Attributes {
                        verb: verb.clone(),
                        group: group.clone(),
                        resource: resource.into(),
                        subresource: subresource.into(),
                        namespace: namespace.into(),
                        name: name.into(),
                        path: String::new(),
                    };
                    if r.resource_names.is_empty() {
                        push(one(""))?;
                    }
                    for name in &r.resource_names {
                        push(one(name))?;
                    }
                }
            }
            for url in &r.non_resource_urls {
                push(Attributes::non_resource(verb, url))?;
            }
        }
    }
    Ok(out)
}

/// A single permission as kube's escalation message prints it.
pub fn describe(a: &Attributes) -> String {
    if !a.is_resource() {
        return format!(
            "{{NonResourceURLs:[\"{}\"], Verbs:[\"{}\"]}}",
            a.path, a.verb
        );
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let names = if a.name.is_empty() {
        String::new()
    } else {
        format!(" ResourceNames:[\"{}\"],", a.name)
    };
    format!(
        "{{APIGroups:[\"{}\"], Resources:[\"{resource}\"],{names} Verbs:[\"{}\"]}}",
        a.group, a.verb
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> Rule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        Rule {
            verbs: v(verbs),
            api_groups: v(groups),
            resources: v(resources),
            resource_names: v(names),
            non_resource_urls: Vec::new(),
        }
    }

    #[test]
    fn breakdown_multiplies_out_rules_with_literal_wildcards() {
        let got = breakdown(
            &[
                rule(&["get", "*"], &[""], &["pods", "pods/log"], &[]),
                rule(&["update"], &["apps"], &["deployments"], &["a", "b"]),
            ],
            "t1",
        )
        .unwrap_or_default();
        let short: Vec<(String, String, String, String)> = got
            .iter()
            .map(|a| {
                assert_eq!(a.namespace, "t1");
                (
                    a.verb.clone(),
                    a.resource.clone(),
                    a.subresource.clone(),
                    a.name.clone(),
                )
            })
            .collect();
        let s = |v: &str, r: &str, sub: &str, n: &str| (v.into(), r.into(), sub.into(), n.into());
        assert_eq!(
            short,
            [
                s("get", "pods", "", ""),
                s("get", "pods", "log", ""),
                s("*", "pods", "", ""),
                s("*", "pods", "log", ""),
                s("update", "deployments", "", "a"),
                s("update", "deployments", "", "b"),
            ]
        );
        let urls = Rule {
            verbs: vec!["get".into()],
            non_resource_urls: vec!["/metrics".into(), "/api/*".into()],
            ..Rule::default()
        };
        let got = breakdown(&[urls], "").unwrap_or_default();
        assert_eq!(
            got,
            [
                Attributes::non_resource("get", "/metrics"),
                Attributes::non_resource("get", "/api/*")
            ]
        );
    }

    #[test]
    fn covers_is_rule_allows_on_the_breakdown() {
        let owner = rule(&["get", "list"], &[""], &["pods", "*/status"], &[]);
        let covered = |servant: Rule| {
            breakdown(&[servant], "")
                .unwrap_or_default()
                .iter()
                .all(|a| owner.allows(a))
        };
        assert!(covered(rule(&["get"], &[""], &["pods"], &[])));
        assert!(covered(rule(&["get"], &[""], &["pods"], &["x"])));
        assert!(covered(rule(&["list"], &[""], &["nodes/status"], &[])));
        assert!(!covered(rule(&["*"], &[""], &["pods"], &[])));
        assert!(!covered(rule(&["get"], &["*"], &["pods"], &[])));
        assert!(!covered(rule(&["get"], &[""], &["*"], &[])));
        assert!(!covered(rule(&["delete"], &[""], &["pods"], &[])));
        let named = rule(&["get"], &[""], &["secrets"], &["a"]);
        let named_covered = |servant: Rule| {
            breakdown(&[servant], "")
                .unwrap_or_default()
                .iter()
                .all(|a| named.allows(a))
        };
        assert!(named_covered(rule(&["get"], &[""], &["secrets"], &["a"])));
        assert!(!named_covered(rule(&["get"], &[""], &["secrets"], &[])));
        assert!(!named_covered(rule(
            &["get"],
            &[""],
            &["secrets"],
            &["a", "b"]
        )));
    }

    #[test]
    fn breakdown_is_capped() {
        let many: Vec<String> = (0..200).map(|i| format!("r{i}")).collect();
        let r = Rule {
            verbs: (0..100).map(|i| format!("v{i}")).collect(),
            api_groups: vec![String::new()],
            resources: many,
            ..Rule::default()
        };
        assert_eq!(breakdown(&[r], ""), Err(TooMany));
    }

    #[test]
    fn checks_name_the_waiver_and_the_grants() {
        let role = json!({"metadata": {"namespace": "t1", "name": "r"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]});
        let e = check_for("roles", &role, None).expect("a role write is checked");
        assert_eq!(e.waiver.verb, "escalate");
        assert_eq!(
            (e.waiver.namespace.as_str(), e.waiver.name.as_str()),
            ("t1", "r")
        );
        assert!(!e.waiver_only);
        assert_eq!(e.namespace, "t1");
        assert_eq!(
            e.grants,
            Grants::Rules(vec![rule(&["get"], &[""], &["pods"], &[])])
        );

        let agg =
            json!({"metadata": {"name": "c"}, "aggregationRule": {"clusterRoleSelectors": []}});
        assert!(check_for("clusterroles", &agg, None).is_some_and(|e| e.waiver_only));

        let rb = json!({"metadata": {"namespace": "t1", "name": "b"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "admin"}, "subjects": []});
        let e = check_for("rolebindings", &rb, None).expect("a binding write is checked");
        assert_eq!(e.waiver.verb, "bind");
        assert_eq!(e.waiver.resource, "clusterroles");
        assert_eq!(
            (e.waiver.namespace.as_str(), e.waiver.name.as_str()),
            ("t1", "admin")
        );
        assert_eq!(e.namespace, "t1");
        assert_eq!(
            e.grants,
            Grants::RoleRef {
                plural: "clusterroles",
                namespace: String::new(),
                name: "admin".into()
            }
        );
        let rb_role = json!({"metadata": {"namespace": "t1", "name": "b"},
            "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "own"}});
        let e = check_for("rolebindings", &rb_role, None).expect("checked");
        assert_eq!(
            e.grants,
            Grants::RoleRef {
                plural: "roles",
                namespace: "t1".into(),
                name: "own".into()
            }
        );

        // Only GC fields changed: not checked; anything else: checked.
        let mut fin = rb.clone();
        fin["metadata"]["finalizers"] = json!(["x"]);
        fin["metadata"]["resourceVersion"] = json!("9");
        assert!(check_for("rolebindings", &fin, Some(&rb)).is_none());
        let mut subj = rb.clone();
        subj["subjects"] = json!([{"kind": "User", "name": "mallory"}]);
        assert!(check_for("rolebindings", &subj, Some(&rb)).is_some());
        let mut relabel = role.clone();
        relabel["metadata"]["labels"] =
            json!({"rbac.authorization.k8s.io/aggregate-to-admin": "true"});
        assert!(check_for("roles", &relabel, Some(&role)).is_some());
        assert!(check_for("pods", &role, None).is_none());
    }
}
