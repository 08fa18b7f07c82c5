//! RBAC evaluated in-process with kube's semantics.
//!
//! Roles and bindings are read from the registry into an immutable
//! [`Snapshot`] indexed by subject (user, group; a ServiceAccount subject is
//! the user `system:serviceaccount:<ns>:<name>`), so a decision looks only
//! at the rules bound to the requesting user and its groups. A background
//! task rebuilds the snapshot when any of the four kinds changes (the
//! informer pattern kube-apiserver's RBAC authorizer uses; the same
//! eventual consistency: a new binding applies within milliseconds, not
//! within the write that made it).
//!
//! ClusterRole aggregation (`aggregationRule.clusterRoleSelectors`) is
//! resolved when the snapshot is built, and the refresher writes the
//! resolved rules back into the aggregated ClusterRole, as
//! kube-controller-manager's clusterrole-aggregation controller does, so
//! `kubectl get clusterrole edit -o yaml` shows what `edit` allows.
//!
//! `system:masters` is allowed everything without looking at RBAC, as in
//! kube-apiserver (its privileged-group authorizer).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::rbac::v1 as rbac;
use serde_json::Value;

use super::{Attributes, Authorizer, Decision, UserInfo, MASTERS};
use crate::registry::{ListParams, Registry, WriteOptions};
use crate::selectors::{LabelReq, LabelSelector};

/// The RBAC API group.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// One policy rule, as evaluated.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

impl From<&rbac::PolicyRule> for Rule {
    fn from(r: &rbac::PolicyRule) -> Self {
        Rule {
            verbs: r.verbs.clone(),
            api_groups: r.api_groups.clone().unwrap_or_default(),
            resources: r.resources.clone().unwrap_or_default(),
            resource_names: r.resource_names.clone().unwrap_or_default(),
            non_resource_urls: r.non_resource_urls.clone().unwrap_or_default(),
        }
    }
}

impl Rule {
    fn to_policy_rule(&self) -> rbac::PolicyRule {
        let opt = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        rbac::PolicyRule {
            verbs: self.verbs.clone(),
            api_groups: opt(&self.api_groups),
            resources: opt(&self.resources),
            resource_names: opt(&self.resource_names),
            non_resource_urls: opt(&self.non_resource_urls),
        }
    }

    /// Whether this rule allows `a` (kube's `RuleAllows`).
    pub fn allows(&self, a: &Attributes) -> bool {
        if !self.verbs.iter().any(|v| v == "*" || *v == a.verb) {
            return false;
        }
        if !a.is_resource() {
            return self.non_resource_urls.iter().any(|u| {
                u == "*"
                    || *u == a.path
                    || u.strip_suffix('*').is_some_and(|p| a.path.starts_with(p))
            });
        }
        if !self.api_groups.iter().any(|g| g == "*" || *g == a.group) {
            return false;
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let resource = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                || (!a.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(a.subresource.as_str()))
        });
        resource && (self.resource_names.is_empty() || self.resource_names.contains(&a.name))
    }
}

/// A binding subject as looked up.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Subject {
    User(String),
    Group(String),
}

fn subject_key(s: &rbac::Subject, binding_ns: &str) -> Option<Subject> {
    match s.kind.as_str() {
        "User" => Some(Subject::User(s.name.clone())),
        "Group" => Some(Subject::Group(s.name.clone())),
        "ServiceAccount" => {
            let ns = s
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            (!ns.is_empty())
                .then(|| Subject::User(format!("system:serviceaccount:{ns}:{}", s.name)))
        }
        _ => None,
    }
}

type Rules = Arc<[Rule]>;

/// Every role and binding, indexed for decisions.
#[derive(Debug, Default)]
pub struct Snapshot {
    cluster: HashMap<Subject, Vec<Rules>>,
    namespaced: HashMap<(String, Subject), Vec<Rules>>,
    /// The resolved rules of each aggregated ClusterRole, for write-back.
    aggregated: HashMap<String, Vec<Rule>>,
}

fn decode<T: serde::de::DeserializeOwned>(items: &[Value]) -> Vec<T> {
    items
        .iter()
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect()
}

fn selector_of(s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> LabelSelector {
    let mut reqs = Vec::new();
    for (k, v) in s.match_labels.iter().flatten() {
        reqs.push(LabelReq::Eq(k.clone(), v.clone()));
    }
    for e in s.match_expressions.iter().flatten() {
        let vals = e.values.clone().unwrap_or_default();
        reqs.push(match e.operator.as_str() {
            "In" => LabelReq::In(e.key.clone(), vals),
            "NotIn" => LabelReq::NotIn(e.key.clone(), vals),
            "Exists" => LabelReq::Exists(e.key.clone()),
            "DoesNotExist" => LabelReq::NotExists(e.key.clone()),
            // An unknown operator selects nothing (kube rejects it on write).
            _ => LabelReq::In(e.key.clone(), Vec::new()),
        });
    }
    LabelSelector(reqs)
}

impl Snapshot {
    /// Builds the index from the stored objects of the four kinds.
    pub fn build(
        cluster_roles: &[Value],
        roles: &[Value],
        cluster_bindings: &[Value],
        bindings: &[Value],
    ) -> Snapshot {
        let crs: Vec<(Value, rbac::ClusterRole)> = cluster_roles
            .iter()
            .filter_map(|v| Some((v.clone(), serde_json::from_value(v.clone()).ok()?)))
            .collect();
        let own: HashMap<String, Vec<Rule>> = crs
            .iter()
            .map(|(_, cr)| {
                let rules = cr.rules.iter().flatten().map(Rule::from).collect();
                (cr.metadata.name.clone().unwrap_or_default(), rules)
            })
            .collect();
        // Aggregation: an aggregated role's rules are the union of the
        // rules of the roles its selectors match; chains of aggregated
        // roles settle in at most as many passes as there are roles.
        let mut resolved = own.clone();
        let mut aggregated = HashMap::new();
        for _ in 0..=crs.len().min(16) {
            let mut changed = false;
            for (_, cr) in &crs {
                let Some(rule) = &cr.aggregation_rule else {
                    continue;
                };
                let name = cr.metadata.name.clone().unwrap_or_default();
                let selectors: Vec<LabelSelector> = rule
                    .cluster_role_selectors
                    .iter()
                    .flatten()
                    .map(selector_of)
                    .collect();
                let mut set: BTreeSet<Rule> = BTreeSet::new();
                for (other, ocr) in &crs {
                    let oname = ocr.metadata.name.clone().unwrap_or_default();
                    if oname == name || !selectors.iter().any(|s| s.matches(other)) {
                        continue;
                    }
                    set.extend(resolved.get(&oname).into_iter().flatten().cloned());
                }
                let rules: Vec<Rule> = set.into_iter().collect();
                if resolved.get(&name) != Some(&rules) {
                    resolved.insert(name.clone(), rules.clone());
                    changed = true;
                }
                aggregated.insert(name, rules);
            }
            if !changed {
                break;
            }
        }
        let cluster_rules: HashMap<String, Rules> = resolved
            .into_iter()
            .map(|(n, r)| (n, Rules::from(r)))
            .collect();
        let role_rules: HashMap<(String, String), Rules> = decode::<rbac::Role>(roles)
            .into_iter()
            .map(|r| {
                let rules: Vec<Rule> = r.rules.iter().flatten().map(Rule::from).collect();
                (
                    (
                        r.metadata.namespace.unwrap_or_default(),
                        r.metadata.name.unwrap_or_default(),
                    ),
                    Rules::from(rules),
                )
            })
            .collect();
        let mut snap = Snapshot {
            aggregated,
            ..Snapshot::default()
        };
        for b in decode::<rbac::ClusterRoleBinding>(cluster_bindings) {
            if b.role_ref.kind != "ClusterRole" {
                continue;
            }
            let Some(rules) = cluster_rules.get(&b.role_ref.name) else {
                continue;
            };
            for s in b.subjects.iter().flatten() {
                if let Some(k) = subject_key(s, "") {
                    snap.cluster.entry(k).or_default().push(rules.clone());
                }
            }
        }
        for b in decode::<rbac::RoleBinding>(bindings) {
            let ns = b.metadata.namespace.clone().unwrap_or_default();
            let rules = match b.role_ref.kind.as_str() {
                "ClusterRole" => cluster_rules.get(&b.role_ref.name),
                "Role" => role_rules.get(&(ns.clone(), b.role_ref.name.clone())),
                _ => None,
            };
            let Some(rules) = rules else {
                continue;
            };
            for s in b.subjects.iter().flatten() {
                if let Some(k) = subject_key(s, &ns) {
                    snap.namespaced
                        .entry((ns.clone(), k))
                        .or_default()
                        .push(rules.clone());
                }
            }
        }
        snap
    }

    /// The decision for `user` doing `a`.
    pub fn decide(&self, user: &UserInfo, a: &Attributes) -> Decision {
        if user.in_group(MASTERS) {
            return Decision::Allow;
        }
        let subjects = std::iter::once(Subject::User(user.name.clone()))
            .chain(user.groups.iter().map(|g| Subject::Group(g.clone())));
        for s in subjects {
            let cluster = self.cluster.get(&s).into_iter().flatten();
            let local = if a.namespace.is_empty() {
                None
            } else {
                self.namespaced.get(&(a.namespace.clone(), s))
            };
            if cluster
                .chain(local.into_iter().flatten())
                .any(|rules| rules.iter().any(|r| r.allows(a)))
            {
                return Decision::Allow;
            }
        }
        Decision::Deny(String::new())
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide ones
    /// included), for SelfSubjectRulesReview.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<Rule> {
        let subjects = std::iter::once(Subject::User(user.name.clone()))
            .chain(user.groups.iter().map(|g| Subject::Group(g.clone())));
        let mut out = BTreeSet::new();
        for s in subjects {
            for rules in self.cluster.get(&s).into_iter().flatten() {
                out.extend(rules.iter().cloned());
            }
            for rules in self
                .namespaced
                .get(&(namespace.to_string(), s))
                .into_iter()
                .flatten()
            {
                out.extend(rules.iter().cloned());
            }
        }
        out.into_iter().collect()
    }
}

/// The RBAC authorizer: decisions from the current snapshot.
#[derive(Debug, Default)]
pub struct Rbac {
    snapshot: RwLock<Arc<Snapshot>>,
}

impl Rbac {
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set(&self, s: Snapshot) {
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(s);
    }

    /// Builds the snapshot from the registry now. Returns the aggregated
    /// roles whose stored rules differ from their resolved rules.
    pub async fn refresh(&self, registry: &Registry) -> Result<(), crate::status::ApiError> {
        let list = |plural: &'static str| async move {
            let Some(kind) = registry.find(GROUP, "v1", plural) else {
                return Ok(Vec::new());
            };
            let v = registry.list(&kind, None, &ListParams::default()).await?;
            Ok::<_, crate::status::ApiError>(
                v.get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        let crs = list("clusterroles").await?;
        let snap = Snapshot::build(
            &crs,
            &list("roles").await?,
            &list("clusterrolebindings").await?,
            &list("rolebindings").await?,
        );
        let stale: Vec<(Value, Vec<Rule>)> = crs
            .iter()
            .filter_map(|obj| {
                let name = obj.pointer("/metadata/name")?.as_str()?;
                let want = snap.aggregated.get(name)?;
                let have: Vec<Rule> = serde_json::from_value::<rbac::ClusterRole>(obj.clone())
                    .ok()?
                    .rules
                    .iter()
                    .flatten()
                    .map(Rule::from)
                    .collect();
                let have_set: BTreeSet<&Rule> = have.iter().collect();
                let want_set: BTreeSet<&Rule> = want.iter().collect();
                (have_set != want_set).then(|| (obj.clone(), want.clone()))
            })
            .collect();
        self.set(snap);
        if let Some(kind) = registry.find(GROUP, "v1", "clusterroles") {
            for (mut obj, rules) in stale {
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let rules: Vec<rbac::PolicyRule> = rules.iter().map(Rule::to_policy_rule).collect();
                obj["rules"] = serde_json::to_value(rules).unwrap_or(Value::Null);
                // A conflict means someone wrote it meanwhile; the watch
                // brings us back here.
                if let Err(e) = registry
                    .update(&kind, None, &name, obj, false, &WriteOptions::default())
                    .await
                {
                    tracing::debug!(role = %name, error = %e.message, "writing aggregated rules");
                }
            }
        }
        Ok(())
    }

    /// Keeps the snapshot current: rebuilds after any change of the four
    /// kinds (debounced), and retries after storage errors.
    pub fn spawn_refresher(
        self: &Arc<Self>,
        registry: Arc<Registry>,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let prefixes: Vec<String> = [
                "clusterroles",
                "roles",
                "clusterrolebindings",
                "rolebindings",
            ]
            .iter()
            .filter_map(|p| registry.find(GROUP, "v1", p))
            .map(|k| crate::keys::collection_prefix(&k.info, None))
            .collect();
            loop {
                let rev = match registry.store().current_revision().await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %cozyplane_errors::Chain(&e), "RBAC: reading the revision");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                if let Err(e) = me.refresh(&registry).await {
                    tracing::warn!(error = %e.message, "RBAC: rebuilding the snapshot");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
                let mut watchers = tokio::task::JoinSet::new();
                for p in &prefixes {
                    let store = registry.store().clone();
                    let (p, tx) = (p.clone(), tx.clone());
                    watchers.spawn(async move {
                        use futures::StreamExt;
                        let Ok(mut w) = store.watch(&p, rev).await else {
                            return;
                        };
                        while let Some(ev) = w.next().await {
                            if ev.is_err() || tx.send(()).await.is_err() {
                                return;
                            }
                        }
                    });
                }
                drop(tx);
                // Wait for a change (or for every watch to end), then let
                // a burst of writes settle before rebuilding.
                let _ = rx.recv().await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                watchers.shutdown().await;
            }
        })
    }
}

#[async_trait::async_trait]
impl Authorizer for Rbac {
    async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        self.snapshot().decide(user, attrs)
    }

    fn rules_for(&self, user: &UserInfo, namespace: &str) -> Option<Vec<Rule>> {
        Some(self.snapshot().rules_for(user, namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn res(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            path: String::new(),
        }
    }

    fn rule(v: Value) -> Rule {
        Rule::from(&serde_json::from_value::<rbac::PolicyRule>(v).unwrap())
    }

    #[test]
    fn rules_match_as_kube_matches_them() {
        let r = rule(
            json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "pods/log"]}),
        );
        assert!(r.allows(&res("get", "", "pods", "", "a", "p")));
        assert!(r.allows(&res("get", "", "pods", "log", "a", "p")));
        assert!(!r.allows(&res("get", "", "pods", "status", "a", "p")));
        assert!(!r.allows(&res("create", "", "pods", "", "a", "")));
        assert!(!r.allows(&res("get", "apps", "pods", "", "a", "p")));
        let r = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*/status"]}));
        assert!(r.allows(&res("update", "x", "vpcs", "status", "", "v")));
        assert!(!r.allows(&res("update", "x", "vpcs", "", "", "v")));
        let r = rule(
            json!({"verbs": ["get", "update"], "apiGroups": ["sdn.cozystack.io"], "resources": ["vpcs"], "resourceNames": ["blue"]}),
        );
        assert!(r.allows(&res("get", "sdn.cozystack.io", "vpcs", "", "t", "blue")));
        assert!(!r.allows(&res("get", "sdn.cozystack.io", "vpcs", "", "t", "red")));
        assert!(!r.allows(&res("list", "sdn.cozystack.io", "vpcs", "", "t", "")));
        let r = rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]}));
        assert!(r.allows(&Attributes::non_resource("get", "/healthz")));
        assert!(r.allows(&Attributes::non_resource("get", "/apis/sdn.cozystack.io")));
        assert!(!r.allows(&Attributes::non_resource("get", "/apis")));
        assert!(!r.allows(&Attributes::non_resource("post", "/healthz")));
        // A non-resource rule never allows a resource request.
        assert!(!r.allows(&res("get", "", "healthz", "", "", "")));
    }

    fn binding(
        kind: &str,
        ns: &str,
        name: &str,
        role_kind: &str,
        role: &str,
        subjects: Value,
    ) -> Value {
        let mut m = json!({"name": name});
        if !ns.is_empty() {
            m["namespace"] = json!(ns);
        }
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": m,
               "roleRef": {"apiGroup": GROUP, "kind": role_kind, "name": role}, "subjects": subjects})
    }

    #[test]
    fn bindings_grant_in_their_namespace_only_and_match_users_groups_and_service_accounts() {
        let crs = vec![json!({"metadata": {"name": "vpc-edit"}, "rules": [
            {"verbs": ["create", "get"], "apiGroups": ["sdn.cozystack.io"], "resources": ["vpcs"]}]})];
        let roles = vec![
            json!({"metadata": {"name": "reader", "namespace": "b"}, "rules": [
            {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
        ];
        let rbs = vec![
            binding(
                "RoleBinding",
                "a",
                "x",
                "ClusterRole",
                "vpc-edit",
                json!([{"kind": "User", "name": "alice"}]),
            ),
            binding(
                "RoleBinding",
                "b",
                "y",
                "Role",
                "reader",
                json!([{"kind": "Group", "name": "tenants"}]),
            ),
            binding(
                "RoleBinding",
                "a",
                "z",
                "Role",
                "reader",
                json!([{"kind": "User", "name": "alice"}]),
            ),
            binding(
                "RoleBinding",
                "c",
                "sa",
                "ClusterRole",
                "vpc-edit",
                json!([{"kind": "ServiceAccount", "name": "bot", "namespace": "c"}]),
            ),
        ];
        let s = Snapshot::build(&crs, &roles, &[], &rbs);
        let alice = UserInfo::new("alice", &["system:authenticated"]);
        let tenant = UserInfo::new("bob", &["tenants"]);
        let bot = UserInfo::new("system:serviceaccount:c:bot", &["system:serviceaccounts"]);
        let vpc = |ns: &str| res("create", "sdn.cozystack.io", "vpcs", "", ns, "");
        assert!(s.decide(&alice, &vpc("a")).allowed());
        assert!(!s.decide(&alice, &vpc("b")).allowed());
        assert!(
            !s.decide(&alice, &vpc("")).allowed(),
            "a RoleBinding is not cluster-wide"
        );
        assert!(s
            .decide(&tenant, &res("get", "", "pods", "", "b", "p"))
            .allowed());
        assert!(!s
            .decide(&tenant, &res("get", "", "pods", "", "a", "p"))
            .allowed());
        // The Role "reader" lives in b; a binding in a cannot reach it.
        assert!(!s
            .decide(&alice, &res("get", "", "pods", "", "a", "p"))
            .allowed());
        assert!(s.decide(&bot, &vpc("c")).allowed());
        assert!(!s.decide(&UserInfo::new("bot", &[]), &vpc("c")).allowed());
        assert!(s
            .decide(
                &UserInfo::new("x", &[MASTERS]),
                &res("delete", "", "nodes", "", "", "n")
            )
            .allowed());
    }

    #[test]
    fn aggregated_roles_gather_the_rules_of_the_roles_they_select_and_chain() {
        let crs = vec![
            json!({"metadata": {"name": "edit", "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
                   "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}]}}),
            json!({"metadata": {"name": "admin"},
                   "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}}]}}),
            json!({"metadata": {"name": "sdn-edit", "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
                   "rules": [{"verbs": ["create"], "apiGroups": ["sdn.cozystack.io"], "resources": ["vpcs"]}]}),
            json!({"metadata": {"name": "unrelated"}, "rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}),
        ];
        let rbs = vec![binding(
            "ClusterRoleBinding",
            "",
            "x",
            "ClusterRole",
            "admin",
            json!([{"kind": "User", "name": "carol"}]),
        )];
        let s = Snapshot::build(&crs, &[], &rbs, &[]);
        let carol = UserInfo::new("carol", &[]);
        assert!(s
            .decide(
                &carol,
                &res("create", "sdn.cozystack.io", "vpcs", "", "t", "")
            )
            .allowed());
        assert!(!s
            .decide(
                &carol,
                &res("delete", "sdn.cozystack.io", "vpcs", "", "t", "v")
            )
            .allowed());
        assert_eq!(s.aggregated.get("edit").map(Vec::len), Some(1));
        assert_eq!(s.aggregated.get("admin").map(Vec::len), Some(1));
    }
}
