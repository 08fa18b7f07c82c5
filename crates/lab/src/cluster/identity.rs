//! Every lab component's own identity and least-privilege role.
//!
//! No component runs as `system:masters`: `up` issues each one a client
//! certificate from the lab API server's CA (CN = user, O = groups, read from
//! its `--cert-dir`), writes it an owner-only kubeconfig, and, as the admin,
//! creates the lab's roles and bindings through the API before starting it.
//! The agent and the controller get the product's roles from the API
//! server's bootstrap policy (`cozyplane:agent`, `cozyplane:controller`,
//! `cozyplane:controller:leader-election`); the lab-only components (the
//! scheduler, the EndpointSlice controller, the kubelets, the connectivity
//! test) get roles made here, each
//! granting exactly the requests that component's code makes:
//!
//! | identity | may |
//! |---|---|
//! | `cozyplane:agent:<node>` (group `cozyplane:agents`) | nodes get/list/watch; fabricips get/list/watch/create/patch/delete; pods get/list/watch/patch; ports; VPC kinds read; networkpolicies and namespaces read; services and endpointslices read; events get/create/patch |
//! | `cozyplane:controller` (group `cozyplane:controllers`) | pods get/list/watch; fabricips list/watch/delete; VPC VNIs (vpcs, vpcs/status, vniclaims; ports, vpcbindings read); in `kube-system`: leases create, get/update `cozyplane-controller` only |
//! | `cozyplane:lab:scheduler` | nodes list; pods list/watch; pods/binding create |
//! | `cozyplane:lab:endpoints` | services, pods, nodes list/watch; endpointslices list/watch/create/update/delete; events create |
//! | `system:node:<node>` (group `system:nodes`, kube's kubelet identity) | pods list/watch/delete; pods/status patch; events create/patch |
//! | `cozyplane:lab:connectivity` | nodes list; namespaces create; in `cozyplane-connectivity`: pods create/get/delete/deletecollection, services create/get, networkpolicies create/get/update |
//!
//! What RBAC cannot narrow (no resourceNames on list, watch or create, no
//! field selectors), the API server's node restriction does
//! (`cozyplane_apiserver::auth::node`, as kube's NodeRestriction): an agent
//! reads every Node but writes only its own node's FabricIPs; a kubelet sees
//! every pod (it asks only for its node's) but deletes or patches the status
//! only of its node's pods (docs/lab.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cozyplane_apiserver::auth::bootstrap::{
    AGENTS_GROUP, CONTROLLERS_GROUP, CONTROLLER_ELECTION_ROLE, CONTROLLER_LEASE,
};
use cozyplane_apiserver::tls::{self, TlsMaterial};
use cozyplane_errors::Chain;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::PostParams;
use kube::Api;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use super::error::{ClusterError, ClusterResult};

/// How long a component's client certificate is valid: as long as the admin's
/// (the API server issues that one for 365 days), so no component of a lab
/// left running loses its access before the user does.
const CERT_DAYS: i64 = 365;
/// The namespace the controller's Lease lives in (its `--lease-namespace` default).
pub const LEASE_NAMESPACE: &str = "kube-system";
/// The namespace `cozyplane connectivity test` deploys into (its `--namespace` default).
pub const CONNECTIVITY_NAMESPACE: &str = "cozyplane-connectivity";
/// The lab kubelets' group: kube's, so the API server's node restriction
/// applies to them as to real kubelets.
pub const KUBELETS_GROUP: &str = cozyplane_apiserver::auth::node::NODES_GROUP;
/// The lab scheduler's user.
pub const SCHEDULER_USER: &str = "cozyplane:lab:scheduler";
/// The lab EndpointSlice controller's user.
pub const ENDPOINTS_USER: &str = "cozyplane:lab:endpoints";
/// The connectivity test's user.
pub const CONNECTIVITY_USER: &str = "cozyplane:lab:connectivity";
/// The controller's user.
pub const CONTROLLER_USER: &str = "cozyplane:controller";
/// How long `up` waits for a new binding to take effect (RBAC applies bindings
/// within milliseconds, from a snapshot rebuilt in the background).
const RBAC_TIMEOUT: Duration = Duration::from_secs(10);

/// Who a component is: its certificate's CN and O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user (CN).
    pub user: String,
    /// The groups (O).
    pub groups: Vec<String>,
}

impl Identity {
    /// The agent of `node`.
    pub fn agent(node: &str) -> Self {
        Self::new(&format!("cozyplane:agent:{node}"), &[AGENTS_GROUP])
    }

    /// The controller.
    pub fn controller() -> Self {
        Self::new(CONTROLLER_USER, &[CONTROLLERS_GROUP])
    }

    /// The lab scheduler.
    pub fn scheduler() -> Self {
        Self::new(SCHEDULER_USER, &[])
    }

    /// The lab EndpointSlice controller.
    pub fn endpoints() -> Self {
        Self::new(ENDPOINTS_USER, &[])
    }

    /// The lab kubelet of `node`.
    pub fn kubelet(node: &str) -> Self {
        Self::new(
            &format!(
                "{}{node}",
                cozyplane_apiserver::auth::node::NODE_USER_PREFIX
            ),
            &[KUBELETS_GROUP],
        )
    }

    /// `cozyplane connectivity test` run against the lab.
    pub fn connectivity() -> Self {
        Self::new(CONNECTIVITY_USER, &[])
    }

    fn new(user: &str, groups: &[&str]) -> Self {
        Self {
            user: user.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }
}

/// The lab API server's CA, as `--cert-dir` keeps it (`ca.crt`, `ca.key`).
pub struct Ca {
    material: TlsMaterial,
}

impl Ca {
    /// Reads the CA the standalone API server made in `cert_dir`.
    pub fn load(cert_dir: &Path) -> ClusterResult<Self> {
        let read = |name: &str| {
            let p = cert_dir.join(name);
            std::fs::read_to_string(&p).map_err(|e| ClusterError::io("read", p, e))
        };
        Ok(Self {
            material: TlsMaterial {
                ca_pem: read("ca.crt")?,
                ca_key_pem: Some(read("ca.key")?),
                // Only the CA signs client certificates; no serving material here.
                cert_pem: String::new(),
                key_pem: String::new(),
            },
        })
    }

    /// Writes an owner-only kubeconfig at `path` for `url`, authenticating as `who`
    /// with a fresh client certificate.
    pub fn write_kubeconfig(&self, path: &Path, url: &str, who: &Identity) -> ClusterResult<()> {
        let bad = |e: tls::TlsError| ClusterError::BadFile {
            path: path.to_path_buf(),
            detail: format!("kubeconfig for {}: {}", who.user, Chain(&e)),
        };
        let groups: Vec<&str> = who.groups.iter().map(String::as_str).collect();
        let user =
            tls::issue_client_cert(&self.material, &who.user, &groups, CERT_DAYS).map_err(bad)?;
        tls::write_kubeconfig(path, url, &self.material.ca_pem, &user).map_err(bad)
    }
}

/// Where a component's kubeconfig goes, under the run dir.
pub fn kubeconfig_path(run: &Path, component: &str, node: Option<&str>) -> PathBuf {
    match node {
        Some(n) => run
            .join("nodes")
            .join(n)
            .join(format!("{component}.kubeconfig")),
        None => run.join(component).join("kubeconfig"),
    }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": [group], "resources": resources, "verbs": verbs})
}

fn subject(kind: &str, name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name})
}

fn role_ref(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name})
}

/// The lab's own ClusterRoles and their ClusterRoleBindings (name, rules, subject).
fn lab_roles() -> Vec<(&'static str, Value, Value)> {
    vec![
        (
            "cozyplane:lab:scheduler",
            json!([
                rule("", &["nodes"], &["list"]),
                rule("", &["pods"], &["list", "watch"]),
                rule("", &["pods/binding"], &["create"])
            ]),
            subject("User", SCHEDULER_USER),
        ),
        (
            "cozyplane:lab:endpoints",
            json!([
                rule("", &["services", "pods", "nodes"], &["list", "watch"]),
                rule(
                    "discovery.k8s.io",
                    &["endpointslices"],
                    &["list", "watch", "create", "update", "delete"]
                ),
                rule("", &["events"], &["create"])
            ]),
            subject("User", ENDPOINTS_USER),
        ),
        (
            "cozyplane:lab:kubelet",
            json!([
                rule("", &["pods"], &["list", "watch", "delete"]),
                rule("", &["pods/status"], &["patch"]),
                rule("", &["events"], &["create", "patch"])
            ]),
            subject("Group", KUBELETS_GROUP),
        ),
        (
            "cozyplane:lab:connectivity",
            json!([
                rule("", &["nodes"], &["list"]),
                rule("", &["namespaces"], &["create"])
            ]),
            subject("User", CONNECTIVITY_USER),
        ),
    ]
}

/// The ClusterRole the connectivity test gets in its namespace (RoleBinding).
const CONNECTIVITY_PODS_ROLE: &str = "cozyplane:lab:connectivity-pods";

fn typed<T: DeserializeOwned>(v: Value) -> ClusterResult<T> {
    serde_json::from_value(v).map_err(|e| ClusterError::Api(format!("bad RBAC object: {e}")))
}

/// Creates `obj`, or replaces the existing one of its name (so `up` is idempotent).
async fn create_or_replace<K>(api: &Api<K>, obj: K) -> ClusterResult<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + Serialize + DeserializeOwned,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let err = |e: kube::Error| ClusterError::Api(format!("create {name}: {}", Chain(&e)));
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let current = api.get(&name).await.map_err(err)?;
            let mut obj = obj;
            obj.meta_mut().resource_version = current.meta().resource_version.clone();
            api.replace(&name, &PostParams::default(), &obj)
                .await
                .map(|_| ())
                .map_err(err)
        }
        Err(e) => Err(err(e)),
    }
}

/// Creates a namespace unless it exists.
async fn ensure_namespace(client: &kube::Client, name: &str, labels: Value) -> ClusterResult<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = typed(json!({"metadata": {"name": name, "labels": labels}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(ClusterError::Api(format!(
            "create namespace {name}: {}",
            Chain(&e)
        ))),
    }
}

/// Creates the lab's roles and bindings as the admin (`client`), then waits
/// until RBAC grants each identity a request it needs.
pub async fn create_roles(client: &kube::Client) -> ClusterResult<()> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for (name, rules, subj) in lab_roles() {
        let role = typed(json!({"metadata": {"name": name}, "rules": rules}))?;
        create_or_replace(&roles, role).await?;
        let binding = typed(
            json!({"metadata": {"name": name}, "roleRef": role_ref(name), "subjects": [subj]}),
        )?;
        create_or_replace(&bindings, binding).await?;
    }
    let pods_role = typed(json!({"metadata": {"name": CONNECTIVITY_PODS_ROLE},
        "rules": [rule("", &["pods"], &["create", "get", "delete", "deletecollection"]),
                  // the services group's NodePort Services (svc-echo-a, svc-echo-b)
                  rule("", &["services"], &["create", "get"]),
                  // the policy group's NetworkPolicies (--policy)
                  rule("networking.k8s.io", &["networkpolicies"], &["create", "get", "update"])]}))?;
    create_or_replace(&roles, pods_role).await?;

    // Namespaced bindings: the controller's Lease, the connectivity test's pods.
    ensure_namespace(client, LEASE_NAMESPACE, json!({})).await?;
    // The labels `cozyplane connectivity test` gives the namespace it creates.
    ensure_namespace(
        client,
        CONNECTIVITY_NAMESPACE,
        json!({"app.kubernetes.io/name": "cozyplane-connectivity",
               "pod-security.kubernetes.io/enforce": "privileged"}),
    )
    .await?;
    for (ns, role, subj) in [
        (
            LEASE_NAMESPACE,
            CONTROLLER_ELECTION_ROLE,
            subject("Group", CONTROLLERS_GROUP),
        ),
        (
            CONNECTIVITY_NAMESPACE,
            CONNECTIVITY_PODS_ROLE,
            subject("User", CONNECTIVITY_USER),
        ),
    ] {
        let api: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
        let binding = typed(json!({"metadata": {"name": role, "namespace": ns},
            "roleRef": role_ref(role), "subjects": [subj]}))?;
        create_or_replace(&api, binding).await?;
    }

    // One request per new binding, asked until allowed.
    for (who, attrs) in [
        (
            Identity::scheduler(),
            json!({"verb": "create", "resource": "pods", "subresource": "binding", "namespace": "default"}),
        ),
        (
            Identity::endpoints(),
            json!({"verb": "create", "group": "discovery.k8s.io", "resource": "endpointslices", "namespace": "default"}),
        ),
        (
            Identity::kubelet("any"),
            json!({"verb": "patch", "resource": "pods", "subresource": "status", "namespace": "default"}),
        ),
        (
            Identity::connectivity(),
            json!({"verb": "create", "resource": "pods", "namespace": CONNECTIVITY_NAMESPACE}),
        ),
        (
            Identity::controller(),
            json!({"verb": "update", "group": "coordination.k8s.io", "resource": "leases",
                   "name": CONTROLLER_LEASE, "namespace": LEASE_NAMESPACE}),
        ),
    ] {
        wait_allowed(client, &who, attrs).await?;
    }
    Ok(())
}

/// Polls a SubjectAccessReview for `who` doing `attrs` until it is allowed.
async fn wait_allowed(client: &kube::Client, who: &Identity, attrs: Value) -> ClusterResult<()> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let review: SubjectAccessReview = typed(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": who.user, "groups": who.groups, "resourceAttributes": attrs}}))?;
    let t0 = Instant::now();
    loop {
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ClusterError::Api(format!("SubjectAccessReview: {}", Chain(&e))))?;
        if answer.status.is_some_and(|s| s.allowed) {
            return Ok(());
        }
        if t0.elapsed() > RBAC_TIMEOUT {
            return Err(ClusterError::Api(format!(
                "RBAC still denies {} {attrs} after {RBAC_TIMEOUT:?}",
                who.user
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_identity_is_in_system_masters_and_node_ones_name_their_node() {
        let all = [
            Identity::agent("lab-node1"),
            Identity::controller(),
            Identity::scheduler(),
            Identity::kubelet("lab-node1"),
            Identity::connectivity(),
            Identity::endpoints(),
        ];
        for who in &all {
            assert!(!who.groups.iter().any(|g| g == "system:masters"), "{who:?}");
        }
        assert_eq!(all[0].user, "cozyplane:agent:lab-node1");
        assert_eq!(all[0].groups, [AGENTS_GROUP]);
        assert_eq!(all[3].user, "system:node:lab-node1");
    }

    #[test]
    fn the_lab_roles_write_no_node_and_no_fabricip() {
        for (name, rules, _) in lab_roles() {
            for r in rules.as_array().expect("rules") {
                let resources = r["resources"].as_array().expect("resources");
                let verbs = r["verbs"].as_array().expect("verbs");
                assert!(!verbs.iter().any(|v| v == "*"), "{name}: {r}");
                assert!(!resources.iter().any(|x| x == "*"), "{name}: {r}");
                if resources.iter().any(|x| x == "nodes") {
                    // Read only: the EndpointSlice controller watches them, the others list.
                    let read: &[Value] = match name {
                        "cozyplane:lab:endpoints" => &[json!("list"), json!("watch")],
                        _ => &[json!("list")],
                    };
                    assert_eq!(verbs, read, "{name}: {r}");
                }
                assert!(!resources.iter().any(|x| x == "fabricips"), "{name}: {r}");
            }
        }
    }

    #[test]
    fn the_endpoints_role_writes_only_endpointslices_and_events() {
        let (_, rules, subj) = lab_roles()
            .into_iter()
            .find(|(n, _, _)| *n == "cozyplane:lab:endpoints")
            .expect("the endpoints role");
        assert_eq!(subj["name"], ENDPOINTS_USER);
        for r in rules.as_array().expect("rules") {
            let resources = r["resources"].as_array().expect("resources");
            let writes = r["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .any(|v| !matches!(v.as_str(), Some("get" | "list" | "watch")));
            if writes {
                assert!(
                    resources == &[json!("endpointslices")] || resources == &[json!("events")],
                    "{r}"
                );
            }
            if resources.iter().any(|x| x == "events") {
                assert_eq!(r["verbs"], json!(["create"]), "{r}");
            }
        }
    }

    #[test]
    fn kubeconfigs_carry_the_identity_and_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        tls::load_or_generate(&certs, &[]).expect("CA");
        let ca = Ca::load(&certs).expect("load");
        let path = kubeconfig_path(dir.path(), "agent", Some("lab-node1"));
        ca.write_kubeconfig(
            &path,
            "https://198.18.0.2:6443",
            &Identity::agent("lab-node1"),
        )
        .expect("write");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let kc = kube::config::Kubeconfig::read_from(&path).expect("kube reads it");
        let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
        assert!(user.client_certificate_data.is_some() && user.token.is_none());
        assert!(Ca::load(&dir.path().join("nowhere")).is_err());
    }
}
