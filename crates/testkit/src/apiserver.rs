//! The standalone API server in process, on the embedded store or on a
//! throw-away etcd, and a kube client from the kubeconfig it writes (feature
//! `apiserver`), for the tests of the crates that talk to an API server
//! (agent, controller, connectivity). Test code: it panics with a message
//! instead of returning errors.
//!
//! The API server's own tests keep their harness in
//! `crates/apiserver/tests/support`: they need more than a running server
//! (the store handle, builder hooks such as the bookmark interval, clients
//! without retries for raw HTTP, every test on both backends).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cozyplane_apiserver::{RunningServer, ServerBuilder};
use cozyplane_store::Storage;

use crate::Needs;

/// A running standalone API server and a client for it.
pub struct TestServer {
    /// The server (call `shutdown` to stop it early).
    pub server: RunningServer,
    /// A client authenticated as the admin.
    pub client: kube::Client,
    /// The kubeconfig the server wrote.
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

/// The standalone server on the embedded store (runs everywhere).
pub async fn standalone() -> TestServer {
    standalone_on(false, "embedded")
        .await
        .expect("the embedded store always runs")
}

/// The standalone server on the embedded store, or on etcd
/// (`/usr/bin/etcd`, package `etcd-server`) under a prefix unique to
/// `test`. Without etcd the gate decides: under CI this panics, elsewhere
/// the test is skipped (`None`).
pub async fn standalone_on(etcd: bool, test: &str) -> Option<TestServer> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Storage> = if etcd {
        let endpoint = Needs::new(test).ready_with(cozyplane_store::testing::shared_etcd())?;
        let prefix = cozyplane_store::testing::unique_prefix(test);
        Arc::new(
            cozyplane_store::EtcdStore::connect(&[endpoint], &prefix)
                .await
                .expect("etcd connect"),
        )
    } else {
        Arc::new(
            cozyplane_store::EmbeddedStore::open(dir.path().join("store.redb"))
                .expect("embedded store"),
        )
    };
    let kubeconfig = dir.path().join("kubeconfig");
    let server = ServerBuilder::new(store, cozyplane_apiserver::args::served_kinds(true))
        .standalone(true)
        .write_kubeconfig(kubeconfig.clone())
        .start()
        .await
        .expect("server start");
    let client = client(&kubeconfig).await;
    Some(TestServer {
        server,
        client,
        kubeconfig,
        _dir: dir,
    })
}

/// A kube client from a kubeconfig file.
pub async fn client(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    kube::Client::try_from(cfg).expect("client")
}
