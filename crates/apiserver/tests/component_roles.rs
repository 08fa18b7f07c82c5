//! The components' bootstrap roles (`cozyplane:agent`, `cozyplane:controller`,
//! `cozyplane:controller:leader-election`) grant what the components do and
//! nothing more, and no tenant identity (client certificate or ServiceAccount
//! token) may write a Node or a FabricIP: the addresses the datapath trusts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::path::PathBuf;
use std::time::Duration;

use cozyplane_apiserver::auth::bootstrap::{
    AGENTS_GROUP, CONTROLLERS_GROUP, CONTROLLER_ELECTION_ROLE, CONTROLLER_LEASE,
};
use cozyplane_apiserver::tls::{self, KubeconfigUser};
use cozyplane_testkit::eventually_async;
use serde_json::{json, Value};
use support::{Backend, Harness};

/// A client authenticating with a client certificate for `user` in `groups`.
async fn cert_client(h: &Harness, user: &str, groups: &[&str]) -> kube::Client {
    let cert = tls::issue_client_cert(&h.server.tls, user, groups, 1).unwrap();
    bearer_or_cert_client(h, user, &cert).await
}

async fn bearer_or_cert_client(h: &Harness, name: &str, user: &KubeconfigUser) -> kube::Client {
    let p: PathBuf = h
        .dir
        .path()
        .join(format!("kubeconfig-{}", name.replace(':', "-")));
    tls::write_kubeconfig(&p, &h.server.url, &h.server.ca_pem, user).unwrap();
    support::raw_client(&p).await
}

/// The status code of `method path` with `body` as the client's identity.
async fn status(c: &kube::Client, method: &str, path: &str, body: Option<&Value>) -> u16 {
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(match body {
            Some(b) => kube::client::Body::from(serde_json::to_vec(b).unwrap()),
            None => kube::client::Body::empty(),
        })
        .unwrap();
    c.send(req).await.unwrap().status().as_u16()
}

/// A valid FabricIP: `f-10-244-0-7` claims 10.244.0.7.
fn fip(name: &str, node: &str) -> Value {
    let address = name.trim_start_matches("f-").replace('-', ".");
    json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "FabricIP", "metadata": {"name": name},
           "spec": {"address": address, "node": node, "podNamespace": "default", "podName": "p", "podUID": "u-1"}})
}

const FIPS: &str = "/apis/local.sdn.cozystack.io/v1alpha1/fabricips";
const NODES: &str = "/api/v1/nodes";
const PORTS: &str = "/apis/sdn.cozystack.io/v1alpha1/ports";

async fn admin_create(h: &Harness, path: &str, body: Value) {
    let r = h.post(path, &body).await;
    assert!(
        r.status == 201 || r.status == 409,
        "{path}: {} {}",
        r.status,
        r.text
    );
}

/// What nobody but the admin may do to Nodes and FabricIPs; every request must be 403
/// (deleting a FabricIP too, unless `collects`: the controller's job).
async fn cannot_write_nodes_or_fabricips(c: &kube::Client, who: &str, collects: bool) {
    let node_patch =
        json!({"status": {"addresses": [{"type": "InternalIP", "address": "6.6.6.6"}]}});
    for (method, path, body) in [
        (
            "POST",
            NODES.to_string(),
            Some(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "evil"}})),
        ),
        ("PATCH", format!("{NODES}/n1"), Some(node_patch.clone())),
        ("PATCH", format!("{NODES}/n1/status"), Some(node_patch)),
        ("DELETE", format!("{NODES}/n1"), None),
        ("POST", FIPS.to_string(), Some(fip("f-10-244-0-9", "n1"))),
        (
            "PATCH",
            format!("{FIPS}/f-10-244-0-7"),
            Some(json!({"spec": {"node": "n2"}})),
        ),
        ("DELETE", format!("{FIPS}/f-10-244-0-7"), None),
    ] {
        if collects && method == "DELETE" && path.starts_with(FIPS) {
            continue;
        }
        assert_eq!(
            status(c, method, &path, body.as_ref()).await,
            403,
            "{who}: {method} {path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_get_their_roles_and_tenants_never_write_nodes_or_fabricips() {
    for backend in [Backend::Embedded, Backend::Etcd] {
        let Some(h) = support::start(backend, "component_roles").await else {
            return;
        };
        admin_create(
            &h,
            NODES,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}),
        )
        .await;
        admin_create(&h, FIPS, fip("f-10-244-0-7", "n1")).await;
        admin_create(
            &h,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t1"}}),
        )
        .await;

        // The agent: reads Nodes, claims and releases FabricIPs; writes no Node, no Pod.
        let agent = cert_client(&h, "cozyplane:agent:n1", &[AGENTS_GROUP]).await;
        for path in [
            NODES.to_string(),
            format!("{NODES}/n1"),
            format!("{NODES}?watch=1&timeoutSeconds=1"),
            FIPS.to_string(),
            format!("{FIPS}/f-10-244-0-7"),
        ] {
            assert_eq!(
                status(&agent, "GET", &path, None).await,
                200,
                "agent GET {path}"
            );
        }
        assert_eq!(
            status(&agent, "POST", FIPS, Some(&fip("f-10-244-0-8", "n1"))).await,
            201
        );
        assert_eq!(
            status(&agent, "DELETE", &format!("{FIPS}/f-10-244-0-8"), None).await,
            200
        );
        // Node restriction: the same role, but n2's agent may neither claim an
        // address for n1 nor release n1's claim (RBAC alone cannot say so).
        let other = cert_client(&h, "cozyplane:agent:n2", &[AGENTS_GROUP]).await;
        assert_eq!(
            status(&other, "POST", FIPS, Some(&fip("f-10-244-0-10", "n1"))).await,
            403,
            "n2's agent claims for n1"
        );
        assert_eq!(
            status(&other, "DELETE", &format!("{FIPS}/f-10-244-0-7"), None).await,
            403,
            "n2's agent releases n1's claim"
        );
        assert_eq!(
            status(&other, "POST", FIPS, Some(&fip("f-10-244-0-10", "n2"))).await,
            201,
            "n2's agent claims for itself"
        );
        assert_eq!(
            status(&other, "DELETE", &format!("{FIPS}/f-10-244-0-10"), None).await,
            200
        );
        assert_eq!(
            status(&agent, "GET", &format!("{FIPS}/f-10-244-0-7"), None).await,
            200,
            "n1's claim survives"
        );
        // VPC attach: the agent claims Ports on its own node only, reads
        // VPCs and bindings, and stamps only the VPC self-discovery
        // annotations on its own node's pods.
        let port = |name: &str, ip: &str, node: &str| {
            json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port", "metadata": {"name": name},
                   "spec": {"vpcRef": {"namespace": "t1", "name": "net"}, "ip": ip, "node": node}})
        };
        assert_eq!(
            status(
                &agent,
                "POST",
                PORTS,
                Some(&port("v100.10.0.0.2", "10.0.0.2", "n1"))
            )
            .await,
            201,
            "agent claims a Port on its node"
        );
        assert_eq!(
            status(
                &other,
                "POST",
                PORTS,
                Some(&port("v100.10.0.0.3", "10.0.0.3", "n1"))
            )
            .await,
            403,
            "n2's agent claims a Port for n1"
        );
        assert_eq!(
            status(&other, "DELETE", &format!("{PORTS}/v100.10.0.0.2"), None).await,
            403,
            "n2's agent releases n1's Port"
        );
        for path in [
            "/apis/sdn.cozystack.io/v1alpha1/namespaces/t1/vpcs".to_string(),
            "/apis/sdn.cozystack.io/v1alpha1/namespaces/t1/vpcbindings".to_string(),
            // Services and EndpointSlices, for the socket-level load balancer.
            "/api/v1/services?watch=1&timeoutSeconds=1".to_string(),
            "/apis/discovery.k8s.io/v1/endpointslices?watch=1&timeoutSeconds=1".to_string(),
        ] {
            assert_eq!(
                status(&agent, "GET", &path, None).await,
                200,
                "agent GET {path}"
            );
        }
        // ... and writes neither.
        assert_eq!(
            status(
                &agent,
                "POST",
                "/api/v1/namespaces/t1/services",
                Some(
                    &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
                              "spec": {"ports": [{"port": 80}]}})
                )
            )
            .await,
            403
        );
        assert_eq!(
            status(&agent, "DELETE", &format!("{PORTS}/v100.10.0.0.2"), None).await,
            200
        );
        for (name, node) in [("on-n1", "n1"), ("on-n2", "n2")] {
            admin_create(
                &h,
                "/api/v1/namespaces/t1/pods",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}),
            )
            .await;
        }
        let stamp = json!({"metadata": {"annotations": {"sdn.cozystack.io/vpc-ip": "10.0.0.2",
                                                         "sdn.cozystack.io/vpc-mac": "0a:58:0a:00:00:02"}}});
        assert_eq!(
            status(
                &agent,
                "PATCH",
                "/api/v1/namespaces/t1/pods/on-n1",
                Some(&stamp)
            )
            .await,
            200,
            "agent stamps its own node's pod"
        );
        assert_eq!(
            status(
                &agent,
                "PATCH",
                "/api/v1/namespaces/t1/pods/on-n2",
                Some(&stamp)
            )
            .await,
            403,
            "agent stamps another node's pod"
        );
        // SecurityGroups: the agent reads the groups, lists and watches only
        // its own node's pods (their labels), and refreshes the label
        // snapshot of its own node's Ports only.
        assert_eq!(
            status(
                &agent,
                "GET",
                "/apis/sdn.cozystack.io/v1alpha1/securitygroups",
                None
            )
            .await,
            200,
            "agent lists SecurityGroups"
        );
        let own = "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1";
        assert_eq!(
            status(&agent, "GET", own, None).await,
            200,
            "agent lists its pods"
        );
        assert_eq!(
            status(
                &agent,
                "GET",
                &format!("{own}&watch=true&timeoutSeconds=1"),
                None
            )
            .await,
            200,
            "agent watches its pods"
        );
        for path in [
            "/api/v1/pods",
            "/api/v1/namespaces/t1/pods",
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn2",
            "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dn2",
            "/api/v1/pods?fieldSelector=spec.nodeName%21%3Dn1",
        ] {
            assert_eq!(
                status(&agent, "GET", path, None).await,
                403,
                "agent GET {path}"
            );
        }
        for (name, ip, node) in [
            ("v100.10.0.0.4", "10.0.0.4", "n1"),
            ("v100.10.0.0.5", "10.0.0.5", "n2"),
        ] {
            admin_create(&h, PORTS, port(name, ip, node)).await;
        }
        let snapshot = json!({"metadata": {"annotations": {"sdn.cozystack.io/pod-labels": "{\"role\":\"web\"}"}}});
        assert_eq!(
            status(
                &agent,
                "PATCH",
                &format!("{PORTS}/v100.10.0.0.4"),
                Some(&snapshot)
            )
            .await,
            200,
            "agent refreshes its own Port's label snapshot"
        );
        assert_eq!(
            status(
                &agent,
                "PATCH",
                &format!("{PORTS}/v100.10.0.0.5"),
                Some(&snapshot)
            )
            .await,
            403,
            "agent writes another node's Port"
        );
        assert_eq!(
            status(
                &agent,
                "PATCH",
                &format!("{PORTS}/v100.10.0.0.4"),
                Some(&json!({"spec": {"node": "n2"}}))
            )
            .await,
            403,
            "agent moves its Port to another node"
        );
        for evil in [
            json!({"metadata": {"annotations": {"sdn.cozystack.io/vpc": "t2/net"}}}),
            json!({"metadata": {"labels": {"role": "web"}}}),
        ] {
            assert_eq!(
                status(
                    &agent,
                    "PATCH",
                    "/api/v1/namespaces/t1/pods/on-n1",
                    Some(&evil)
                )
                .await,
                403,
                "agent changes {evil}"
            );
        }
        let node_patch =
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "6.6.6.6"}]}});
        for (method, path, body) in [
            (
                "PATCH",
                format!("{NODES}/n1/status"),
                Some(node_patch.clone()),
            ),
            ("PATCH", format!("{NODES}/n1"), Some(node_patch)),
            ("DELETE", format!("{NODES}/n1"), None),
            (
                "PATCH",
                format!("{FIPS}/f-10-244-0-7"),
                Some(json!({"spec": {"node": "n2"}})),
            ),
            (
                "POST",
                "/api/v1/namespaces/t1/pods".to_string(),
                Some(
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                            "spec": {"containers": [{"name": "c", "image": "x"}]}}),
                ),
            ),
        ] {
            assert_eq!(
                status(&agent, method, &path, body.as_ref()).await,
                403,
                "agent {method} {path}"
            );
        }

        // The controller: reads pods, collects FabricIPs, elects on its own Lease only.
        let controller = cert_client(&h, "cozyplane:controller", &[CONTROLLERS_GROUP]).await;
        for path in ["/api/v1/pods", FIPS] {
            assert_eq!(status(&controller, "GET", path, None).await, 200, "{path}");
        }
        // ...and gives VPCs their VNIs: reads VPCs and what uses them, claims
        // VNIs; it creates and deletes no VPC and writes no binding.
        let sdn = "/apis/sdn.cozystack.io/v1alpha1";
        for path in ["vpcs", "vniclaims", "ports", "vpcbindings"] {
            let path = format!("{sdn}/{path}");
            assert_eq!(status(&controller, "GET", &path, None).await, 200, "{path}");
        }
        assert_eq!(
            status(
                &controller,
                "POST",
                &format!("{sdn}/namespaces/t1/vpcs"),
                Some(&support::vpc("x", "10.9.0.0/16"))
            )
            .await,
            403
        );
        assert_eq!(
            status(
                &controller,
                "DELETE",
                &format!("{sdn}/namespaces/t1/vpcs/x"),
                None
            )
            .await,
            403
        );
        assert_eq!(
            status(&controller, "POST", &format!("{sdn}/namespaces/t1/vpcbindings"), Some(&json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPCBinding", "metadata": {"name": "b"}, "spec": {"vpcRef": {"name": "x"}}}))).await,
            403
        );
        assert_eq!(
            status(&controller, "POST", FIPS, Some(&fip("f-10-244-0-9", "n1"))).await,
            403
        );
        let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
        let lease = |name: &str| {
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                        "metadata": {"name": name}, "spec": {"holderIdentity": "c1"}})
        };
        assert_eq!(
            status(&controller, "POST", leases, Some(&lease(CONTROLLER_LEASE))).await,
            403,
            "no election without the RoleBinding in the Lease's namespace"
        );
        admin_create(
            &h,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "election", "namespace": "kube-system"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CONTROLLER_ELECTION_ROLE},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": CONTROLLERS_GROUP}]}),
        )
        .await;
        eventually_async(
            "the election binding applies",
            Duration::from_secs(10),
            || async {
                status(&controller, "POST", leases, Some(&lease(CONTROLLER_LEASE))).await == 201
            },
        )
        .await;
        let own = format!("{leases}/{CONTROLLER_LEASE}");
        assert_eq!(status(&controller, "GET", &own, None).await, 200);
        let mut current: Value = h.get(&own).await.body;
        current["spec"]["holderIdentity"] = json!("c2");
        assert_eq!(status(&controller, "PUT", &own, Some(&current)).await, 200);
        admin_create(&h, leases, lease("someone-else")).await;
        let other = format!("{leases}/someone-else");
        assert_eq!(status(&controller, "GET", &other, None).await, 403);
        let mut theirs: Value = h.get(&other).await.body;
        theirs["spec"]["holderIdentity"] = json!("c2");
        assert_eq!(status(&controller, "PUT", &other, Some(&theirs)).await, 403);
        assert_eq!(
            status(
                &controller,
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/t1/leases",
                None
            )
            .await,
            403
        );
        cannot_write_nodes_or_fabricips(&controller, "controller", true).await;

        // A tenant with `edit` in its namespace, by client certificate and by
        // ServiceAccount token (what a pod would hold).
        admin_create(
            &h,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/t1/rolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": {"name": "tenant-edit", "namespace": "t1"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "tenants"},
                                {"kind": "ServiceAccount", "name": "default", "namespace": "t1"}]}),
        )
        .await;
        admin_create(
            &h,
            "/api/v1/namespaces/t1/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        )
        .await;
        let r = h
            .post(
                "/api/v1/namespaces/t1/serviceaccounts/default/token",
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let token = r.body["status"]["token"].as_str().unwrap().to_string();
        let sa = bearer_or_cert_client(&h, "sa", &KubeconfigUser::Token(token)).await;
        let tenant = cert_client(&h, "bob", &["tenants"]).await;
        // Both really are the tenant: their namespace's pods are theirs to write.
        for (c, who) in [(&tenant, "tenant"), (&sa, "service account")] {
            eventually_async(
                "the tenant binding applies",
                Duration::from_secs(10),
                || async { status(c, "GET", "/api/v1/namespaces/t1/pods", None).await == 200 },
            )
            .await;
            cannot_write_nodes_or_fabricips(c, who, false).await;
        }
        // Nothing was changed by any of it.
        let n1 = h.get(&format!("{NODES}/n1")).await;
        assert!(n1.body["status"]["addresses"].is_null(), "{}", n1.text);
        assert_eq!(h.get(&format!("{NODES}/evil")).await.status, 404);
        let f = h.get(&format!("{FIPS}/f-10-244-0-7")).await;
        assert_eq!(f.body["spec"]["node"], "n1", "{}", f.text);
        assert_eq!(h.get(&format!("{FIPS}/f-10-244-0-9")).await.status, 404);
        h.server.shutdown().await;
    }
}

/// Node restriction for kube's kubelet identity (`system:node:<name>` in
/// `system:nodes`): with a role that lets every kubelet delete pods and
/// write their status, one node's kubelet still cannot touch another
/// node's pods, or create pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_writes_only_the_pods_of_its_node() {
    let Some(h) = support::start(Backend::Embedded, "node_restriction").await else {
        return;
    };
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    admin_create(&h, &format!("{rbac}/clusterroles"), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kubelet"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
                  {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]})).await;
    admin_create(&h, &format!("{rbac}/clusterrolebindings"), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "kubelets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kubelet"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]})).await;
    let pods = "/api/v1/namespaces/default/pods";
    let pod = |name: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})
    };
    admin_create(&h, pods, pod("on-n1", "n1")).await;
    admin_create(&h, pods, pod("on-n2", "n2")).await;
    let n1 = cert_client(&h, "system:node:n1", &["system:nodes"]).await;
    eventually_async(
        "the kubelets' binding applies",
        Duration::from_secs(10),
        || async {
            status(
                &n1,
                "GET",
                &format!("{pods}?fieldSelector=spec.nodeName%3Dn1"),
                None,
            )
            .await
                == 200
        },
    )
    .await;
    // It lists and watches only its own node's pods (kube's node authorizer
    // with AuthorizeNodeWithSelectors).
    for path in [
        pods.to_string(),
        format!("{pods}?fieldSelector=spec.nodeName%3Dn2"),
        format!("{pods}?watch=true"),
    ] {
        assert_eq!(
            status(&n1, "GET", &path, None).await,
            403,
            "kubelet GET {path}"
        );
    }
    let running = json!({"status": {"phase": "Running"}});
    assert_eq!(
        status(
            &n1,
            "PATCH",
            &format!("{pods}/on-n2/status"),
            Some(&running)
        )
        .await,
        403,
        "n1's kubelet writes n2's pod status"
    );
    assert_eq!(
        status(
            &n1,
            "DELETE",
            &format!("{pods}/on-n2?gracePeriodSeconds=0"),
            None
        )
        .await,
        403,
        "n1's kubelet deletes n2's pod"
    );
    assert_eq!(
        status(&n1, "POST", pods, Some(&pod("made", "n1"))).await,
        403,
        "a kubelet creates a pod"
    );
    assert_eq!(
        status(
            &n1,
            "PATCH",
            &format!("{pods}/on-n1/status"),
            Some(&running)
        )
        .await,
        200
    );
    assert_eq!(
        status(
            &n1,
            "DELETE",
            &format!("{pods}/on-n1?gracePeriodSeconds=0"),
            None
        )
        .await,
        200
    );
    // Without the group, the name is just a name: RBAC alone (no binding) says no.
    let pretender = cert_client(&h, "system:node:n2", &[]).await;
    assert_eq!(status(&pretender, "GET", pods, None).await, 403);
    let r = h.get(&format!("{pods}/on-n2")).await;
    assert_eq!(r.status, 200, "n2's pod survives: {}", r.text);
    h.server.shutdown().await;
}
