//! The API server on an etcd that requires client certificates
//! (`--client-cert-auth`), configured by `--etcd-cafile`, `--etcd-certfile`
//! and `--etcd-keyfile` exactly as `cozyplane apiserver` parses and opens
//! them, serving the real kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::sync::Arc;

use clap::Parser;
use cozyplane_apiserver::args::{self, ApiserverArgs};
use cozyplane_apiserver::ServerError;
use cozyplane_store::etcd::ConnectError;
use cozyplane_store::testing::{shared_tls_etcd, unique_prefix};
use cozyplane_testkit::{kubectl as find_kubectl, needs};
use support::Harness;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: ApiserverArgs,
}

fn parse(flags: &[&str]) -> ApiserverArgs {
    let argv = std::iter::once("cozyplane-apiserver").chain(flags.iter().copied());
    match Cli::try_parse_from(argv) {
        Ok(c) => c.args,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_serves_kubectl_over_an_etcd_requiring_client_certificates() {
    let Some(bin) = needs!().ready_with(find_kubectl()) else {
        return;
    };
    let Some((endpoint, files)) = needs!().ready_with(shared_tls_etcd()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let prefix = unique_prefix("apiserver-etcd-tls");
    let path = |p: &std::path::Path| p.display().to_string();
    let (ca, cert, key, kc, certs) = (
        path(&files.ca),
        path(&files.cert),
        path(&files.key),
        path(&kubeconfig),
        path(&dir.path().join("certs")),
    );
    let etcd_flags = [
        "--storage",
        "etcd",
        "--etcd-endpoints",
        endpoint.as_str(),
        "--etcd-prefix",
        prefix.as_str(),
    ];
    let mut flags = vec![
        "--standalone",
        "--bind-address",
        "127.0.0.1",
        "--port",
        "0",
        "--cert-dir",
        certs.as_str(),
        "--write-kubeconfig",
        kc.as_str(),
        "--etcd-cafile",
        ca.as_str(),
        "--etcd-certfile",
        cert.as_str(),
        "--etcd-keyfile",
        key.as_str(),
    ];
    flags.extend(etcd_flags);
    let args = parse(&flags);
    let store = args::open_store(&args).await.unwrap();
    let server = args::builder(&args, store.clone(), args::served_kinds(true))
        .unwrap()
        .start()
        .await
        .unwrap();
    let h = Harness {
        server,
        client: support::raw_client(&kubeconfig).await,
        kubeconfig: kubeconfig.clone(),
        store: Arc::clone(&store),
        dir,
    };

    let vpc = h.dir.path().join("vpc.yaml");
    std::fs::write(
        &vpc,
        "apiVersion: sdn.cozystack.io/v1alpha1\nkind: VPC\nmetadata:\n  name: over-tls\nspec:\n  cidrs:\n  - 10.61.0.0/16\n",
    )
    .unwrap();
    let create = support::kubectl_as(&bin, &h, &kubeconfig, &["create", "-f", &path(&vpc)]).await;
    assert!(create.ok, "{}", create.stderr);
    assert!(
        create.stdout.contains("over-tls created"),
        "{}",
        create.stdout
    );
    let get = support::kubectl_as(
        &bin,
        &h,
        &kubeconfig,
        &["get", "vpc", "over-tls", "-o", "jsonpath={.spec.cidrs[0]}"],
    )
    .await;
    assert!(get.ok, "{}", get.stderr);
    assert_eq!(get.stdout, "10.61.0.0/16");
    // It is in that etcd, under the prefix.
    let stored = h.store.list(&Default::default()).await.unwrap();
    assert!(
        stored.items.iter().any(|kv| kv.key.contains("over-tls")),
        "{:?}",
        stored.items.iter().map(|kv| &kv.key).collect::<Vec<_>>()
    );

    // Without the client certificate the server does not start, and says why.
    let mut without = vec!["--etcd-cafile", ca.as_str()];
    without.extend(etcd_flags);
    match args::open_store(&parse(&without)).await {
        Err(ServerError::Etcd(e @ ConnectError::Tls { .. })) => {
            let msg = cozyplane_errors::Chain(&e).to_string();
            assert!(msg.contains("client certificate"), "{msg}");
        }
        Err(e) => panic!("expected a TLS error, got {e:?}"),
        Ok(_) => panic!("opened an etcd that requires a client certificate without one"),
    }
}

/// A certificate without its key (or the other way round) is refused by
/// the flags parser.
#[test]
fn etcd_certificate_and_key_flags_go_together() {
    for flags in [["--etcd-certfile", "/c"], ["--etcd-keyfile", "/k"]] {
        let argv = std::iter::once("x").chain(flags);
        assert!(Cli::try_parse_from(argv).is_err(), "{flags:?}");
    }
}
