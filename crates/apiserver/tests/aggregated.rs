//! Aggregated mode end to end: server A stands in for kube-apiserver
//! (standalone: RBAC, TokenReview, SubjectAccessReview, and the
//! `extension-apiserver-authentication` ConfigMap naming its client CA and
//! front-proxy CA); server B is configured as a user configures an
//! aggregated cozyplane API server (`--authentication-kubeconfig`,
//! `--authorization-kubeconfig` pointing at A) and must trust a user only
//! as A vouches for them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use cozyplane_apiserver::auth::authn::RequestHeaderConfig;
use cozyplane_apiserver::tls::{self, KubeconfigUser, TlsMaterial};
use cozyplane_apiserver::{ApiserverArgs, RunningServer, ServerBuilder};
use cozyplane_testkit::eventually_async;
use serde_json::json;
use support::{Backend, Harness};

const ALICE_TOKEN: &str = "alice-token-0123456789abcdef0123";

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: ApiserverArgs,
}

/// A client of `url` trusting `ca_pem`, presenting `user` (a certificate or
/// nothing).
async fn client(
    dir: &Path,
    name: &str,
    url: &str,
    ca_pem: &str,
    user: Option<&KubeconfigUser>,
) -> kube::Client {
    let path = dir.join(format!("kc-{name}"));
    let user = user.cloned().unwrap_or(KubeconfigUser::Anonymous);
    tls::write_kubeconfig(&path, url, ca_pem, &user).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.default_retry = false;
    kube::Client::try_from(cfg).unwrap()
}

async fn status(c: &kube::Client, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut b = http::Request::builder().uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    match c.send(b.body(kube::client::Body::empty()).unwrap()).await {
        Ok(r) => r.status().as_u16(),
        // A refused handshake: no status.
        Err(_) => 0,
    }
}

/// The agents' ServiceAccount B node-restricts (`--agent-service-account`).
const AGENT_SA: &str = "system:serviceaccount:cozy:cozyplane-agent";

struct Setup {
    a: Harness,
    b: RunningServer,
    proxy_ca: TlsMaterial,
    dir: tempfile::TempDir,
}

async fn setup(backend: Backend) -> Option<Setup> {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, format!("{ALICE_TOKEN},alice,1001,tenants\n")).unwrap();
    // The front-proxy CA is kube-apiserver's --requestheader-client-ca-file.
    let proxy_ca = tls::generate(&[]).unwrap();
    let proxy_pem = proxy_ca.ca_pem.clone();
    let a = support::start_with(backend, "aggregated_main", move |b| {
        b.token_file(tokens).request_header(
            proxy_pem,
            RequestHeaderConfig {
                allowed_names: vec!["front-proxy-client".into()],
                ..RequestHeaderConfig::default()
            },
        )
    })
    .await?;
    // On A: B may review tokens and access (system:auth-delegator, as the
    // aggregated server's install binds it), alice may edit in namespace a.
    for (path, body) in [
        (
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "cozyplane-b:auth-delegator"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "cozyplane-b"}]}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/rolebindings",
            json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "cozyplane-b:auth-reader", "namespace": "kube-system"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "extension-apiserver-authentication-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "cozyplane-b"}]}),
        ),
        (
            // the CNI chart's binding of its agents' ServiceAccount
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "cozyplane-agent-sa"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cozyplane:agent"},
            "subjects": [{"kind": "ServiceAccount", "name": "cozyplane-agent", "namespace": "cozy"}]}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings",
            json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "alice-edit", "namespace": "a"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}),
        ),
    ] {
        let r = a.post(path, &body).await;
        assert_eq!(r.status, 201, "{path}: {}", r.text);
    }
    // B's own identity towards A: a client certificate from A's CA.
    let b_cert = tls::issue_client_cert(&a.server.tls, "cozyplane-b", &[], 1).unwrap();
    let b_kc = dir.path().join("b-to-a");
    tls::write_kubeconfig(&b_kc, &a.server.url, &a.server.ca_pem, &b_cert).unwrap();
    let kc = b_kc.display().to_string();
    let cli = Cli::try_parse_from([
        "apiserver",
        "--authentication-kubeconfig",
        &kc,
        "--authorization-kubeconfig",
        &kc,
        "--agent-service-account",
        AGENT_SA,
    ])
    .unwrap();
    // The bindings apply once A's RBAC snapshot has them.
    let probe = tls::issue_client_cert(&a.server.tls, "cozyplane-b", &[], 1).unwrap();
    let probe = client(
        dir.path(),
        "b-probe",
        &a.server.url,
        &a.server.ca_pem,
        Some(&probe),
    )
    .await;
    eventually_async(
        "B may read the ConfigMap on A",
        Duration::from_secs(10),
        || async {
            status(
                &probe,
                "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
                &[],
            )
            .await
                == 200
        },
    )
    .await;
    let store = support::open_store(backend, "aggregated_b", dir.path()).await?;
    let builder = ServerBuilder::new(store, cozyplane_apiserver::args::served_kinds(false));
    let builder = cozyplane_apiserver::args::configure_delegation(&cli.args, builder)
        .await
        .unwrap();
    let b = builder
        .agent_service_accounts(cli.args.agent_service_account.clone())
        .start()
        .await
        .unwrap();
    Some(Setup {
        a,
        b,
        proxy_ca,
        dir,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregated_server_trusts_users_only_as_the_main_server_vouches() {
    for backend in [Backend::Embedded, Backend::Etcd] {
        let Some(s) = setup(backend).await else {
            return;
        };
        let dir = s.dir.path();
        let in_a = "/apis/sdn.cozystack.io/v1alpha1/namespaces/a/vpcs";
        let in_b = "/apis/sdn.cozystack.io/v1alpha1/namespaces/b/vpcs";
        let as_alice: &[(&str, &str)] =
            &[("X-Remote-User", "alice"), ("X-Remote-Group", "tenants")];

        // The front proxy (kube-apiserver) names alice: SAR on A decides.
        let proxy_cert = tls::issue_client_cert(&s.proxy_ca, "front-proxy-client", &[], 1).unwrap();
        let proxy = client(dir, "proxy", &s.b.url, &s.b.ca_pem, Some(&proxy_cert)).await;
        eventually_async(
            "alice's binding on A applies",
            Duration::from_secs(10),
            || async { status(&proxy, in_a, as_alice).await == 200 },
        )
        .await;
        assert_eq!(status(&proxy, in_b, as_alice).await, 403);
        assert_eq!(
            status(&proxy, "/apis/sdn.cozystack.io/v1alpha1/ports", as_alice).await,
            403,
            "cluster-scoped"
        );
        // A proxy naming nobody proves nothing.
        assert_eq!(status(&proxy, in_a, &[]).await, 401);

        // Forged headers without the front-proxy certificate: not alice.
        let nobody = client(dir, "nobody", &s.b.url, &s.b.ca_pem, None).await;
        assert_eq!(status(&nobody, in_a, as_alice).await, 401);
        // ... nor over a user's certificate from A's client CA: that user.
        let bob = tls::issue_client_cert(&s.a.server.tls, "bob", &[], 1).unwrap();
        let bob = client(dir, "bob", &s.b.url, &s.b.ca_pem, Some(&bob)).await;
        assert_eq!(status(&bob, in_a, as_alice).await, 403, "bob, not alice");
        // ... nor over a front-proxy-CA certificate with a name not allowed.
        let rogue = tls::issue_client_cert(&s.proxy_ca, "not-the-proxy", &[], 1).unwrap();
        let rogue = client(dir, "rogue", &s.b.url, &s.b.ca_pem, Some(&rogue)).await;
        assert_eq!(status(&rogue, in_a, as_alice).await, 401);
        // ... nor over a certificate from a CA neither server knows.
        let stranger = tls::generate(&[]).unwrap();
        let stranger = tls::issue_client_cert(&stranger, "front-proxy-client", &[], 1).unwrap();
        let stranger = client(dir, "stranger", &s.b.url, &s.b.ca_pem, Some(&stranger)).await;
        assert_ne!(status(&stranger, in_a, as_alice).await, 200);

        // A bearer token is checked by TokenReview on A.
        let bearer = format!("Bearer {ALICE_TOKEN}");
        assert_eq!(
            status(&nobody, in_a, &[("Authorization", &bearer)]).await,
            200
        );
        assert_eq!(
            status(&nobody, in_b, &[("Authorization", &bearer)]).await,
            403
        );
        assert_eq!(
            status(&nobody, in_a, &[("Authorization", "Bearer forged")]).await,
            401
        );

        // Revoking on A revokes on B once the short cache expires.
        let r =
            s.a.delete("/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings/alice-edit")
                .await;
        assert_eq!(r.status, 200, "{}", r.text);
        eventually_async(
            "alice loses access on B",
            cozyplane_apiserver::auth::delegated::CACHE_TTL + Duration::from_secs(10),
            || async { status(&proxy, in_a, as_alice).await == 403 },
        )
        .await;
        s.b.shutdown().await;
        s.a.server.shutdown().await;
    }
}

/// Behind kube-apiserver an agent is its DaemonSet's ServiceAccount, not a
/// per-node user: B takes its node from the bound token's node-name extra
/// (forwarded by the front proxy) and lets it write only that node's Ports,
/// as the lab's per-node agents are restricted. Without the extra it writes
/// no Port at all; RBAC alone would let any node's agent rewrite every
/// node's Ports (another tenant's VPC addresses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_service_account_writes_only_its_own_nodes_ports() {
    let Some(s) = setup(Backend::Embedded).await else {
        return;
    };
    let dir = s.dir.path();
    let proxy_cert = tls::issue_client_cert(&s.proxy_ca, "front-proxy-client", &[], 1).unwrap();
    let proxy = client(dir, "proxy", &s.b.url, &s.b.ca_pem, Some(&proxy_cert)).await;
    let ports = "/apis/sdn.cozystack.io/v1alpha1/ports";
    let post = |name: &str, ip: &str, node: &str, extra: Option<&str>| {
        let body = json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port", "metadata": {"name": name},
            "spec": {"vpcRef": {"namespace": "t1", "name": "net"}, "ip": ip, "node": node}});
        let mut b = http::Request::builder()
            .method("POST")
            .uri(ports)
            .header("Content-Type", "application/json")
            .header("X-Remote-User", AGENT_SA)
            .header("X-Remote-Group", "system:serviceaccounts")
            .header("X-Remote-Group", "system:authenticated");
        if let Some(node) = extra {
            b = b.header(
                "X-Remote-Extra-Authentication.kubernetes.io%2fnode-name",
                node,
            );
        }
        let req = b
            .body(kube::client::Body::from(body.to_string().into_bytes()))
            .unwrap();
        let proxy = proxy.clone();
        async move {
            let r = proxy.send(req).await.unwrap();
            r.status().as_u16()
        }
    };
    // RBAC (on A) allows the agent's ServiceAccount once the binding applies.
    eventually_async(
        "the agent's binding on A applies",
        Duration::from_secs(10),
        || {
            let created = post("v100.10.0.0.2", "10.0.0.2", "n1", Some("n1"));
            async move { created.await == 201 }
        },
    )
    .await;
    assert_eq!(
        post("v100.10.0.0.3", "10.0.0.3", "n2", Some("n1")).await,
        403,
        "n1's agent claims a Port for n2"
    );
    assert_eq!(
        post("v100.10.0.0.4", "10.0.0.4", "n1", None).await,
        403,
        "a token naming no node claims a Port"
    );
    assert_eq!(
        post("v100.10.0.0.5", "10.0.0.5", "n2", Some("n2")).await,
        201,
        "n2's agent claims for itself"
    );
    s.b.shutdown().await;
    s.a.server.shutdown().await;
}
