//! What authorization costs (a benchmark, not a test): the same requests
//! from the same tenant user (a bearer token from the token file, bound to
//! `edit` in its namespace) against two servers in one run, one authorizing
//! with RBAC (among 1000 other RoleBindings and 100 ClusterRoleBindings),
//! one with authorization off (`AllowAll`). Rounds alternate between them.
//!
//! `cargo bench -p cozyplane-apiserver --bench authz` (embedded store).
//! Sizes: `COZYPLANE_BENCH_N` objects listed (default 10000), rounds
//! `COZYPLANE_BENCH_ROUNDS` (default 3).
#![allow(clippy::unwrap_used, clippy::expect_used)] // bench code: a failed step is a failed run

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cozyplane_apiserver::auth::AllowAll;
use cozyplane_apiserver::tls::{self, KubeconfigUser};
use serde_json::{json, Value};
use support::{vpc, vpcs, Backend, Harness};

const TOKEN: &str = "tenant-bench-0123456789abcdef0123";

async fn tenant_client(h: &Harness) -> kube::Client {
    let p = h.dir.path().join("kubeconfig-tenant");
    tls::write_kubeconfig(
        &p,
        &h.server.url,
        &h.server.ca_pem,
        &KubeconfigUser::Token(TOKEN.into()),
    )
    .unwrap();
    support::raw_client(&p).await
}

async fn post(h: &Harness, path: &str, body: Value) {
    let r = h.post(path, &body).await;
    assert_eq!(r.status, 201, "{path}: {}", r.text);
}

fn binding(kind: &str, ns: Option<&str>, name: &str, role: &str, subject: Value) -> Value {
    let mut meta = json!({"name": name});
    if let Some(ns) = ns {
        meta["namespace"] = json!(ns);
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": [subject]})
}

/// Creates `n` VPCs named `<prefix>NNNNNN`, 32 concurrent; creates/s.
async fn creates(c: &kube::Client, ns: &str, prefix: &str, n: usize) -> f64 {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, next, ns, prefix) = (c.clone(), next.clone(), ns.to_string(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let body = vpc(&format!("{prefix}{i:06}"), "10.70.0.0/16")
                    .to_string()
                    .into_bytes();
                let req = http::Request::post(vpcs(&ns))
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body))
                    .unwrap();
                let r = c.send(req).await.unwrap();
                assert_eq!(r.status().as_u16(), 201);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// p50 of `iters` lists of the namespace, to the last body byte.
async fn list_p50(c: &kube::Client, ns: &str, iters: usize) -> Duration {
    use http_body_util::BodyExt;
    let mut out = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        let req = http::Request::get(vpcs(ns))
            .body(kube::client::Body::empty())
            .unwrap();
        let r = c.send(req).await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let _ = r.into_body().collect().await.unwrap();
        out.push(t.elapsed());
    }
    out.sort();
    out[out.len() / 2]
}

async fn server(rbac: bool, tokens: std::path::PathBuf) -> Harness {
    let name = if rbac { "bench-rbac" } else { "bench-allow" };
    let h = support::start_with(Backend::Embedded, name, move |b| {
        let b = b.token_file(tokens);
        if rbac {
            b
        } else {
            b.authorizer(Arc::new(AllowAll))
        }
    })
    .await
    .unwrap();
    post(
        &h,
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}}),
    )
    .await;
    let user = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "tenant"});
    post(
        &h,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/bench/rolebindings",
        binding("RoleBinding", Some("bench"), "tenant-edit", "edit", user),
    )
    .await;
    // Other tenants' bindings, as on a shared cluster.
    for i in 0..100 {
        post(
            &h,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("t{i}")}}),
        )
        .await;
    }
    for i in 0..1000 {
        let ns = format!("t{}", i % 100);
        let u = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": format!("user{i}")});
        post(
            &h,
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
            binding("RoleBinding", Some(&ns), &format!("b{i}"), "edit", u),
        )
        .await;
    }
    for i in 0..100 {
        let g = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": format!("group{i}")});
        post(
            &h,
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            binding("ClusterRoleBinding", None, &format!("cb{i}"), "view", g),
        )
        .await;
    }
    h
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let n: usize = std::env::var("COZYPLANE_BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let rounds: usize = std::env::var("COZYPLANE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(&tokens, format!("{TOKEN},tenant,1000\n")).unwrap();
        let on = server(true, tokens.clone()).await;
        let off = server(false, tokens).await;
        let (c_on, c_off) = (tenant_client(&on).await, tenant_client(&off).await);
        // The tenant's binding has reached the RBAC snapshot.
        for _ in 0..100 {
            let req = http::Request::get(vpcs("bench")).body(kube::client::Body::empty()).unwrap();
            if c_on.send(req).await.unwrap().status().as_u16() == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Fill both to n objects, alternating halves.
        creates(&c_on, "bench", "fill", n).await;
        creates(&c_off, "bench", "fill", n).await;
        println!("| round | creates/s RBAC | creates/s off | ratio | list ≥ {n} p50 RBAC | list p50 off | ratio |");
        println!("|---|---|---|---|---|---|---|");
        let (mut cr, mut lr) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            let prefix = format!("r{r}-");
            let (a, b) = if r % 2 == 0 {
                let a = creates(&c_on, "bench", &prefix, 2000).await;
                (a, creates(&c_off, "bench", &prefix, 2000).await)
            } else {
                let b = creates(&c_off, "bench", &prefix, 2000).await;
                (creates(&c_on, "bench", &prefix, 2000).await, b)
            };
            let (la, lb) = if r % 2 == 0 {
                let la = list_p50(&c_on, "bench", 15).await;
                (la, list_p50(&c_off, "bench", 15).await)
            } else {
                let lb = list_p50(&c_off, "bench", 15).await;
                (list_p50(&c_on, "bench", 15).await, lb)
            };
            cr.push(a / b);
            lr.push(la.as_secs_f64() / lb.as_secs_f64());
            println!(
                "| {r} | {a:.0} | {b:.0} | {:.3} | {:.1} ms | {:.1} ms | {:.3} |",
                a / b,
                la.as_secs_f64() * 1e3,
                lb.as_secs_f64() * 1e3,
                la.as_secs_f64() / lb.as_secs_f64()
            );
        }
        cr.sort_by(f64::total_cmp);
        lr.sort_by(f64::total_cmp);
        println!(
            "median: creates/s RBAC/off {:.3} (≥ 0.95 means ≤ 5 % cost); list p50 RBAC/off {:.3} (≤ 1.05)",
            cr[cr.len() / 2],
            lr[lr.len() / 2]
        );
        on.server.shutdown().await;
        off.server.shutdown().await;
    });
}
