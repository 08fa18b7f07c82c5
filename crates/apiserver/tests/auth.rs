//! Authentication and RBAC as users meet them: the real kubectl with a
//! token from the token file and with a client certificate signed by the
//! server's CA, RoleBindings to the bootstrap `edit` role, the review
//! kinds, and what a request without credentials or with a bad one gets.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cozyplane_apiserver::tls::{self, KubeconfigUser};
use cozyplane_testkit::{eventually_async, kubectl as find_kubectl, needs};
use serde_json::{json, Value};
use support::{Backend, Harness};

const ALICE_TOKEN: &str = "alice-0123456789abcdef0123456789";

use support::kubectl_as as kubectl;

/// A kubeconfig for the harness's server as `user`.
fn kubeconfig_for(h: &Harness, name: &str, user: &KubeconfigUser) -> PathBuf {
    let p = h.dir.path().join(format!("kubeconfig-{name}"));
    tls::write_kubeconfig(&p, &h.server.url, &h.server.ca_pem, user).unwrap();
    p
}

fn vpc_yaml(dir: &Path, ns: &str) -> String {
    let p = dir.join(format!("vpc-{ns}.yaml"));
    std::fs::write(
        &p,
        format!(
            "apiVersion: sdn.cozystack.io/v1alpha1\nkind: VPC\nmetadata:\n  name: net\n  namespace: {ns}\nspec:\n  cidrs:\n  - 10.60.0.0/16\n"
        ),
    )
    .unwrap();
    p.display().to_string()
}

async fn start(test: &str, backend: Backend) -> Option<Harness> {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, format!("{ALICE_TOKEN},alice,1001,\"tenants-a\"\n")).unwrap();
    let h = support::start_with(backend, test, move |b| b.token_file(tokens)).await;
    drop(dir);
    h
}

async fn admin_create(h: &Harness, path: &str, body: Value) {
    let r = h.post(path, &body).await;
    assert!(
        r.status == 201 || r.status == 409,
        "{path}: {} {}",
        r.status,
        r.text
    );
}

fn edit_binding(ns: &str, subject: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": "tenant-edit", "namespace": ns},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
           "subjects": [subject]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_get_what_their_role_bindings_grant_through_kubectl() {
    let Some(bin) = needs!().ready_with(find_kubectl()) else {
        return;
    };
    let Some(h) = start("auth_kubectl", Backend::Embedded).await else {
        return;
    };
    for ns in ["a", "b"] {
        admin_create(
            &h,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    // alice (token file) by name; bob (client certificate, O=tenants-b)
    // through his group.
    admin_create(
        &h,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings",
        edit_binding(
            "a",
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}),
        ),
    )
    .await;
    admin_create(
        &h,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/b/rolebindings",
        edit_binding(
            "b",
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "tenants-b"}),
        ),
    )
    .await;
    let alice = kubeconfig_for(&h, "alice", &KubeconfigUser::Token(ALICE_TOKEN.into()));
    let bob_cert = tls::issue_client_cert(&h.server.tls, "bob", &["tenants-b"], 1).unwrap();
    let bob = kubeconfig_for(&h, "bob", &bob_cert);

    // `kubectl auth can-i` gives the RBAC answer (exit 0 "yes", 1 "no").
    let can_i = |kc: PathBuf, args: Vec<&'static str>| {
        let (bin, h) = (&bin, &h);
        async move {
            let mut a = vec!["auth", "can-i"];
            a.extend(args);
            let o = kubectl(bin, h, &kc, &a).await;
            if !o.stderr.is_empty() {
                eprintln!("kubectl {a:?}: {}", o.stderr.trim());
            }
            (o.ok, o.stdout.trim().to_string())
        }
    };
    eventually_async("alice's binding applies", Duration::from_secs(10), || {
        let f = can_i(
            alice.clone(),
            vec!["create", "vpcs.sdn.cozystack.io", "-n", "a"],
        );
        async move { f.await == (true, "yes".to_string()) }
    })
    .await;
    for (kc, args, want) in [
        (
            &alice,
            vec!["create", "vpcs.sdn.cozystack.io", "-n", "b"],
            "no",
        ),
        (&alice, vec!["list", "nodes"], "no"),
        (&alice, vec!["create", "rolebindings", "-n", "a"], "no"),
        (
            &alice,
            vec![
                "update",
                "vpcs.sdn.cozystack.io",
                "--subresource=status",
                "-n",
                "a",
            ],
            "no",
        ),
        (&alice, vec!["get", "pods", "-n", "a"], "yes"),
        (
            &bob,
            vec!["create", "vpcs.sdn.cozystack.io", "-n", "b"],
            "yes",
        ),
        (
            &bob,
            vec!["create", "vpcs.sdn.cozystack.io", "-n", "a"],
            "no",
        ),
        (
            &bob,
            vec!["create", "fabricips.local.sdn.cozystack.io"],
            "no",
        ),
        (&h.kubeconfig, vec!["delete", "nodes"], "yes"),
    ] {
        let got = can_i(kc.clone(), args.clone()).await;
        assert_eq!(got.1, want, "can-i {args:?} as {}", kc.display());
        assert_eq!(got.0, want == "yes");
    }

    // What the answers promise holds for the real requests.
    let o = kubectl(
        &bin,
        &h,
        &alice,
        &["apply", "-f", &vpc_yaml(h.dir.path(), "a")],
    )
    .await;
    assert!(o.ok, "alice creates a VPC in a: {}", o.stderr);
    let o = kubectl(
        &bin,
        &h,
        &alice,
        &["apply", "-f", &vpc_yaml(h.dir.path(), "b")],
    )
    .await;
    assert!(!o.ok);
    assert!(
        o.stderr.contains("User \"alice\" cannot") && o.stderr.contains("in the namespace \"b\""),
        "{}",
        o.stderr
    );
    let o = kubectl(&bin, &h, &alice, &["get", "nodes"]).await;
    assert!(!o.ok);
    assert!(
        o.stderr.contains("nodes is forbidden: User \"alice\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
        "{}",
        o.stderr
    );
    let o = kubectl(
        &bin,
        &h,
        &bob,
        &["apply", "-f", &vpc_yaml(h.dir.path(), "b")],
    )
    .await;
    assert!(o.ok, "bob creates a VPC in b: {}", o.stderr);
    let o = kubectl(&bin, &h, &bob, &["get", "vpcs", "-n", "a"]).await;
    assert!(!o.ok, "bob cannot read a's VPCs");

    // `kubectl auth whoami` (SelfSubjectReview) names the certificate's user.
    let o = kubectl(&bin, &h, &bob, &["auth", "whoami", "-o", "json"]).await;
    assert!(o.ok, "{}", o.stderr);
    let who: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(who["status"]["userInfo"]["username"], "bob");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        json!(["tenants-b", "system:authenticated"])
    );

    // The aggregated `edit` role shows what it gathered.
    let o = kubectl(
        &bin,
        &h,
        &h.kubeconfig,
        &["get", "clusterrole", "edit", "-o", "json"],
    )
    .await;
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout.contains("\"vpcs\""),
        "edit lists the tenant kinds: {}",
        o.stdout
    );

    // A wrong token is a 401 for kubectl, not an anonymous request.
    let bad = kubeconfig_for(&h, "bad", &KubeconfigUser::Token("nope".into()));
    let o = kubectl(&bin, &h, &bad, &["get", "vpcs", "-n", "a"]).await;
    assert!(!o.ok);
    assert!(
        o.stderr.contains("Unauthorized") || o.stderr.contains("must be logged in"),
        "{}",
        o.stderr
    );
    h.server.shutdown().await;
}

/// A plain HTTPS client trusting the server's CA, with no credentials.
fn anonymous_client(h: &Harness) -> kube::Client {
    let mut cfg = kube::Config::new(h.server.url.parse().unwrap());
    cfg.root_cert = Some(vec![pem_der(&h.server.ca_pem)]);
    cfg.default_retry = false;
    kube::Client::try_from(cfg).unwrap()
}

fn pem_der(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

async fn status_of(c: &kube::Client, method: &str, path: &str, auth: Option<&str>) -> u16 {
    let mut b = http::Request::builder().method(method).uri(path);
    if let Some(a) = auth {
        b = b.header(http::header::AUTHORIZATION, a);
    }
    let req = b.body(kube::client::Body::empty()).unwrap();
    c.send(req).await.map(|r| r.status().as_u16()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_only_health_answers_and_a_bad_credential_never_does() {
    for backend in [Backend::Embedded, Backend::Etcd] {
        let Some(h) = start("auth_anonymous", backend).await else {
            return;
        };
        let c = anonymous_client(&h);
        for path in ["/livez", "/readyz", "/healthz", "/version"] {
            assert_eq!(status_of(&c, "GET", path, None).await, 200, "{path}");
            assert_eq!(
                status_of(&c, "GET", path, Some("Bearer wrong")).await,
                401,
                "a bad token on {path}"
            );
        }
        for path in [
            "/api",
            "/apis",
            "/api/v1/namespaces",
            "/apis/sdn.cozystack.io/v1alpha1/vpcs",
            "/metrics",
            "/openapi/v2",
        ] {
            assert_eq!(status_of(&c, "GET", path, None).await, 401, "{path}");
        }
        assert_eq!(
            status_of(
                &c,
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                None
            )
            .await,
            401
        );
        // A token-file user sees discovery (system:discovery) but no objects.
        let alice = format!("Bearer {ALICE_TOKEN}");
        assert_eq!(status_of(&c, "GET", "/apis", Some(&alice)).await, 200);
        assert_eq!(
            status_of(&c, "GET", "/api/v1/namespaces", Some(&alice)).await,
            403
        );
        assert_eq!(status_of(&c, "GET", "/metrics", Some(&alice)).await, 403);
        h.server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_and_token_reviews_answer_for_others_only_to_the_privileged() {
    let Some(h) = start("auth_reviews", Backend::Embedded).await else {
        return;
    };
    admin_create(
        &h,
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}),
    )
    .await;
    admin_create(
        &h,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings",
        edit_binding(
            "a",
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "tenants-a"}),
        ),
    )
    .await;
    let sar = |ns: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "alice", "groups": ["tenants-a"],
                 "resourceAttributes": {"namespace": ns, "verb": "create", "group": "sdn.cozystack.io", "resource": "vpcs"}}})
    };
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    eventually_async("the binding applies", Duration::from_secs(10), || async {
        let r = h.post(path, &sar("a")).await;
        r.status == 201 && r.body["status"]["allowed"] == true
    })
    .await;
    let r = h.post(path, &sar("b")).await;
    assert_eq!(r.body["status"]["allowed"], false, "{}", r.text);
    // Neither user nor group: 422 naming the field.
    let r = h
        .post(
            path,
            &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}}),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert_eq!(r.body["details"]["causes"][0]["field"], "spec.user");
    // Both attribute kinds at once: 422.
    let r = h
        .post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}, "nonResourceAttributes": {"verb": "get", "path": "/x"}}}))
        .await;
    assert_eq!(r.status, 422, "{}", r.text);

    let review = |token: &str| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
    let r = h
        .post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &review(ALICE_TOKEN),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["status"]["authenticated"], true);
    assert_eq!(r.body["status"]["user"]["username"], "alice");
    assert_eq!(r.body["status"]["user"]["uid"], "1001");
    assert!(
        r.body["spec"].get("token").is_none(),
        "the token is not echoed: {}",
        r.text
    );
    let r = h
        .post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &review("nope"),
        )
        .await;
    assert_eq!(r.body["status"]["authenticated"], false, "{}", r.text);

    // alice may not ask about others, nor review tokens.
    let c = anonymous_client(&h);
    let alice = format!("Bearer {ALICE_TOKEN}");
    let post = |path: &'static str, body: Value| {
        let (c, alice) = (&c, &alice);
        async move {
            let req = http::Request::builder()
                .method("POST")
                .uri(path)
                .header(http::header::AUTHORIZATION, alice.as_str())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap();
            c.send(req).await.map(|r| r.status().as_u16()).unwrap()
        }
    };
    assert_eq!(post(path, sar("a")).await, 403);
    assert_eq!(
        post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            review(ALICE_TOKEN)
        )
        .await,
        403
    );
    assert_eq!(
        post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": "a", "verb": "create", "group": "sdn.cozystack.io", "resource": "vpcs"}}})).await,
        201
    );
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused() {
    let Some(h) = start("auth_foreign_ca", Backend::Embedded).await else {
        return;
    };
    let other = tls::generate(&[]).unwrap();
    let cert = tls::issue_client_cert(&other, "mallory", &["system:masters"], 1).unwrap();
    let kc = kubeconfig_for(&h, "mallory", &cert);
    let kc = kube::config::Kubeconfig::read_from(&kc).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let c = kube::Client::try_from(cfg).unwrap();
    let req = http::Request::builder()
        .uri("/api/v1/namespaces")
        .body(kube::client::Body::empty())
        .unwrap();
    // The handshake fails (or the request is refused): never a 200.
    match c.send(req).await {
        Ok(r) => assert_ne!(r.status().as_u16(), 200),
        Err(e) => eprintln!("refused as expected: {e}"),
    }
    h.server.shutdown().await;
}

async fn status_with_token(h: &Harness, path: &str, token: &str) -> (u16, Value) {
    let (status, text) = as_token(h, token, "GET", path, None).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_live_as_long_as_their_account_and_pod() {
    for backend in [Backend::Embedded, Backend::Etcd] {
        let Some(h) = start("auth_sa_tokens", backend).await else {
            return;
        };
        admin_create(
            &h,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t1"}}),
        )
        .await;
        for sa in ["bot", "other"] {
            admin_create(
                &h,
                "/api/v1/namespaces/t1/serviceaccounts",
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
            )
            .await;
        }
        admin_create(
            &h,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/t1/rolebindings",
            edit_binding(
                "t1",
                json!({"kind": "ServiceAccount", "name": "bot", "namespace": "t1"}),
            ),
        )
        .await;
        let token_path = "/api/v1/namespaces/t1/serviceaccounts/bot/token";
        let request = |spec: Value| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
        let r = h.post(token_path, &request(json!({}))).await;
        assert_eq!(r.status, 201, "{}", r.text);
        assert_eq!(r.body["spec"]["expirationSeconds"], 3600);
        let token = r.body["status"]["token"].as_str().unwrap().to_string();

        // The token is the ServiceAccount, with its RoleBinding's rights.
        let (code, who) = status_with_token(
            &h,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &token,
        )
        .await;
        assert_eq!(code, 405, "selfsubjectreviews is POST only: {who}");
        let vpcs = "/apis/sdn.cozystack.io/v1alpha1/namespaces/t1/vpcs";
        eventually_async(
            "the SA binding applies",
            Duration::from_secs(10),
            || async { status_with_token(&h, vpcs, &token).await.0 == 200 },
        )
        .await;
        assert_eq!(
            status_with_token(
                &h,
                "/apis/sdn.cozystack.io/v1alpha1/namespaces/default/vpcs",
                &token
            )
            .await
            .0,
            403
        );
        // A TokenReview names it as kube does.
        let r = h
            .post("/apis/authentication.k8s.io/v1/tokenreviews", &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}))
            .await;
        assert_eq!(
            r.body["status"]["user"]["username"], "system:serviceaccount:t1:bot",
            "{}",
            r.text
        );
        assert_eq!(
            r.body["status"]["user"]["groups"],
            json!([
                "system:serviceaccounts",
                "system:serviceaccounts:t1",
                "system:authenticated"
            ])
        );

        // Bad requests: 422 on the lifetime, 400 binding another account's pod.
        let r = h
            .post(token_path, &request(json!({"expirationSeconds": 599})))
            .await;
        assert_eq!(r.status, 422, "{}", r.text);
        assert_eq!(
            r.body["details"]["causes"][0]["field"],
            "spec.expirationSeconds"
        );
        admin_create(
            &h,
            "/api/v1/namespaces/t1/pods",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "spec": {"serviceAccountName": "bot", "containers": [{"name": "c", "image": "x"}]}}),
        )
        .await;
        let r = h
            .post(
                "/api/v1/namespaces/t1/serviceaccounts/other/token",
                &request(
                    json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}),
                ),
            )
            .await;
        assert_eq!(r.status, 400, "{}", r.text);
        let r = h
            .post(token_path, &request(json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "not-its-uid"}})))
            .await;
        assert_eq!(r.status, 409, "{}", r.text);

        // A pod-bound token dies with its pod.
        let r = h
            .post(
                token_path,
                &request(
                    json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}),
                ),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let bound = r.body["status"]["token"].as_str().unwrap().to_string();
        assert_eq!(status_with_token(&h, vpcs, &bound).await.0, 200);
        let r = h
            .delete("/api/v1/namespaces/t1/pods/p?gracePeriodSeconds=0")
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(
            status_with_token(&h, vpcs, &bound).await.0,
            401,
            "the pod is gone"
        );
        assert_eq!(
            status_with_token(&h, vpcs, &token).await.0,
            200,
            "the unbound token lives on"
        );

        // Deleting the account revokes its tokens; a new account of the
        // same name (new uid) does not revive them.
        let r = h.delete("/api/v1/namespaces/t1/serviceaccounts/bot").await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(status_with_token(&h, vpcs, &token).await.0, 401);
        admin_create(
            &h,
            "/api/v1/namespaces/t1/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}}),
        )
        .await;
        assert_eq!(status_with_token(&h, vpcs, &token).await.0, 401);
        // A token for another audience is not for us.
        let r = h
            .post(token_path, &request(json!({"audiences": ["vault"]})))
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
        let vault = r.body["status"]["token"].as_str().unwrap();
        assert_eq!(status_with_token(&h, vpcs, vault).await.0, 401);
        h.server.shutdown().await;
    }
}

/// A client presenting `token`.
async fn as_token(
    h: &Harness,
    token: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, String) {
    let c = anonymous_client(h);
    let mut b = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    let body = match body {
        Some(v) => {
            b = b.header(http::header::CONTENT_TYPE, "application/json");
            kube::client::Body::from(serde_json::to_vec(&v).unwrap())
        }
        None => kube::client::Body::empty(),
    };
    let resp = c.send(b.body(body).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    use http_body_util::BodyExt;
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_a_vpc_needs_export_on_it_and_peering_needs_peer() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "alice-tok,alice,1\nbob-tok,bob,2\ncarol-tok,carol,3\n",
    )
    .unwrap();
    let Some(h) = support::start_with(Backend::Embedded, "auth_virtual_verbs", move |b| {
        b.token_file(tokens)
    })
    .await
    else {
        return;
    };
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    for ns in ["a", "b"] {
        admin_create(
            &h,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    let user =
        |n: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": n});
    admin_create(
        &h,
        &format!("{rbac}/namespaces/a/rolebindings"),
        edit_binding("a", user("alice")),
    )
    .await;
    let mut bob_edit = edit_binding("b", user("bob"));
    bob_edit["metadata"]["name"] = json!("bob-edit");
    admin_create(&h, &format!("{rbac}/namespaces/b/rolebindings"), bob_edit).await;
    // carol may create peerings in a, but holds no `peer` on its VPCs.
    admin_create(&h, &format!("{rbac}/namespaces/a/roles"), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "peering-writer", "namespace": "a"},
        "rules": [{"apiGroups": ["sdn.cozystack.io"], "resources": ["vpcpeerings"], "verbs": ["create"]}]})).await;
    admin_create(&h, &format!("{rbac}/namespaces/a/rolebindings"), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "carol", "namespace": "a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "peering-writer"},
        "subjects": [user("carol")]})).await;
    let vpcs_a = "/apis/sdn.cozystack.io/v1alpha1/namespaces/a/vpcs";
    let bindings_b = "/apis/sdn.cozystack.io/v1alpha1/namespaces/b/vpcbindings";
    eventually_async(
        "alice's binding applies",
        Duration::from_secs(10),
        || async { as_token(&h, "alice-tok", "GET", vpcs_a, None).await.0 == 200 },
    )
    .await;
    for name in ["net", "other"] {
        let (code, text) = as_token(
            &h,
            "alice-tok",
            "POST",
            vpcs_a,
            Some(support::vpc(name, "10.80.0.0/16")),
        )
        .await;
        assert_eq!(code, 201, "{text}");
    }
    let binding = |name: &str, vpc: &str| {
        json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPCBinding",
        "metadata": {"name": name}, "spec": {"vpcRef": {"namespace": "a", "name": vpc}}})
    };

    // bob may create bindings in b, but not of a's VPC without `export`.
    eventually_async("bob's binding applies", Duration::from_secs(10), || async {
        as_token(&h, "bob-tok", "GET", bindings_b, None).await.0 == 200
    })
    .await;
    let (code, text) = as_token(&h, "bob-tok", "POST", bindings_b, Some(binding("x", "net"))).await;
    assert_eq!(code, 403, "{text}");
    assert!(
        text.contains("cannot export resource \\\"vpcs\\\"")
            && text.contains("in the namespace \\\"a\\\""),
        "{text}"
    );
    // The owner exports net (only net) to bob.
    admin_create(&h, &format!("{rbac}/namespaces/a/roles"), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "export-net", "namespace": "a"},
        "rules": [{"apiGroups": ["sdn.cozystack.io"], "resources": ["vpcs"], "verbs": ["export"], "resourceNames": ["net"]}]})).await;
    admin_create(
        &h,
        &format!("{rbac}/namespaces/a/rolebindings"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "export-net-to-bob", "namespace": "a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "export-net"},
        "subjects": [user("bob")]}),
    )
    .await;
    eventually_async("the export applies", Duration::from_secs(10), || async {
        as_token(&h, "bob-tok", "POST", bindings_b, Some(binding("x", "net")))
            .await
            .0
            == 201
    })
    .await;
    // Writes that keep the reference need no export; retargeting does.
    let x = format!("{bindings_b}/x");
    let (code, text) = as_token(&h, "bob-tok", "GET", &x, None).await;
    assert_eq!(code, 200, "{text}");
    let mut obj: Value = serde_json::from_str(&text).unwrap();
    obj["metadata"]["labels"] = json!({"team": "blue"});
    let (code, text) = as_token(&h, "bob-tok", "PUT", &x, Some(obj.clone())).await;
    assert_eq!(code, 200, "{text}");
    let mut obj: Value = serde_json::from_str(&text).unwrap();
    obj["spec"]["vpcRef"]["name"] = json!("other");
    let (code, text) = as_token(&h, "bob-tok", "PUT", &x, Some(obj)).await;
    assert_eq!(code, 403, "retarget to a VPC not exported: {text}");
    let (code, text) = as_token(
        &h,
        "bob-tok",
        "POST",
        bindings_b,
        Some(binding("y", "other")),
    )
    .await;
    assert_eq!(code, 403, "{text}");

    // Peering: alice (edit in a) holds `peer`; carol may create peerings but not `peer` net.
    let peering = |name: &str| {
        json!({"apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPCPeering",
        "metadata": {"name": name}, "spec": {"vpcRef": {"name": "net"}, "peerRef": {"namespace": "b", "name": "theirs"}}})
    };
    let peerings_a = "/apis/sdn.cozystack.io/v1alpha1/namespaces/a/vpcpeerings";
    let (code, text) = as_token(&h, "alice-tok", "POST", peerings_a, Some(peering("p1"))).await;
    assert_eq!(code, 201, "{text}");
    let (code, text) = as_token(&h, "carol-tok", "POST", peerings_a, Some(peering("p2"))).await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("cannot peer resource"), "{text}");
    h.server.shutdown().await;
}

/// RBAC escalation prevention: a namespace admin (kube's `admin` role,
/// which writes Roles and RoleBindings) can grant only what they hold;
/// `bind` and `escalate` waive the check, as in kube.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_writers_cannot_grant_more_than_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "dana-tok,dana,1\n").unwrap();
    let Some(h) = support::start_with(Backend::Embedded, "auth_escalation", move |b| {
        b.token_file(tokens)
    })
    .await
    else {
        return;
    };
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    for ns in ["a", "b"] {
        admin_create(
            &h,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
    }
    let user =
        |n: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": n});
    let binding = |name: &str, kind: &str, role: &str, subject: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
               "subjects": [user(subject)]})
    };
    let role = |name: &str, rules: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": name}, "rules": rules})
    };
    let mut admin_binding = binding("dana-admin", "ClusterRole", "admin", "dana");
    admin_binding["metadata"]["namespace"] = json!("a");
    admin_create(
        &h,
        &format!("{rbac}/namespaces/a/rolebindings"),
        admin_binding,
    )
    .await;
    let roles_a = format!("{rbac}/namespaces/a/roles");
    let bindings_a = format!("{rbac}/namespaces/a/rolebindings");
    eventually_async(
        "dana's binding applies",
        Duration::from_secs(10),
        || async { as_token(&h, "dana-tok", "GET", &roles_a, None).await.0 == 200 },
    )
    .await;
    let dana = |method: &'static str, path: String, body: Option<Value>| {
        let h = &h;
        async move { as_token(h, "dana-tok", method, &path, body).await }
    };

    // What she holds, she may grant.
    let pods_reader = role(
        "pods-reader",
        json!([{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]),
    );
    let (code, text) = dana("POST", roles_a.clone(), Some(pods_reader)).await;
    assert_eq!(code, 201, "{text}");
    for (name, kind, r) in [
        ("eve-reader", "Role", "pods-reader"),
        ("eve-edit", "ClusterRole", "edit"),
        ("eve-admin", "ClusterRole", "admin"),
    ] {
        let (code, text) = dana(
            "POST",
            bindings_a.clone(),
            Some(binding(name, kind, r, "eve")),
        )
        .await;
        assert_eq!(code, 201, "binding {r}: {text}");
    }

    // What she does not, she may not: a wider role, a wider update, a
    // binding of a wider role, a binding of a role that does not exist.
    let everything = role(
        "everything",
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
    );
    let (code, text) = dana("POST", roles_a.clone(), Some(everything.clone())).await;
    assert_eq!(code, 403, "{text}");
    assert!(
        text.contains("is attempting to grant RBAC permissions not currently held")
            && text.contains("Resources:[\\\"*\\\"]"),
        "{text}"
    );
    let (code, text) = dana("GET", format!("{roles_a}/pods-reader"), None).await;
    assert_eq!(code, 200, "{text}");
    let mut wider: Value = serde_json::from_str(&text).unwrap();
    wider["rules"][0]["verbs"] = json!([
        "get",
        "list",
        "delete",
        "deletecollection",
        "create",
        "escalate"
    ]);
    let (code, text) = dana("PUT", format!("{roles_a}/pods-reader"), Some(wider)).await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("Verbs:[\\\"escalate\\\"]"), "{text}");
    let (code, text) = dana(
        "POST",
        bindings_a.clone(),
        Some(binding("dana-root", "ClusterRole", "cluster-admin", "dana")),
    )
    .await;
    assert_eq!(code, 403, "{text}");
    let (code, text) = dana(
        "POST",
        bindings_a.clone(),
        Some(binding("ghost", "Role", "not-yet", "dana")),
    )
    .await;
    assert_eq!(code, 403, "{text}");
    assert!(text.contains("does not exist"), "{text}");
    // Nor in a namespace where she holds nothing (plain RBAC).
    let (code, _) = dana(
        "POST",
        format!("{rbac}/namespaces/b/rolebindings"),
        Some(binding("x", "ClusterRole", "view", "dana")),
    )
    .await;
    assert_eq!(code, 403);

    // `bind` on one role waives the check for that role only; `escalate`
    // on roles waives it for role writes.
    admin_create(&h, &roles_a, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "binder", "namespace": "a"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]},
                  {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]})).await;
    let mut waiver = binding("dana-binder", "Role", "binder", "dana");
    waiver["metadata"]["namespace"] = json!("a");
    admin_create(&h, &bindings_a, waiver).await;
    eventually_async("the waivers apply", Duration::from_secs(10), || async {
        dana(
            "POST",
            bindings_a.clone(),
            Some(binding("dana-root", "ClusterRole", "cluster-admin", "dana")),
        )
        .await
        .0 == 201
    })
    .await;
    let (code, text) = dana("POST", roles_a.clone(), Some(everything)).await;
    assert_eq!(code, 201, "{text}");
    h.server.shutdown().await;
}
