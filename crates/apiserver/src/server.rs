//! The HTTPS server: a builder usable from tests and from `run`, the accept
//! loop (rustls + hyper, HTTP/1.1 and HTTP/2), standalone bootstrap
//! objects, and a handle for shutdown and for forcing watch breaks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::kinds::KindInfo;
use cozyplane_store::Storage;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::authn::{
    AuthenticatorChain, CertAuthority, RequestHeaderConfig, StaticTokens, TokenAuthenticator,
    TokenFileError,
};
use crate::auth::delegated::{self, ExtensionAuthentication};
use crate::auth::rbac::Rbac;
use crate::auth::serviceaccount::{self, ServiceAccountTokens, TokenSigner};
use crate::auth::{Auth, Authorizer, MastersOnly, UserInfo, MASTERS};
use crate::connections::{accept_loop, ServerSettings};
use crate::core_kinds;
use crate::http::AppState;
use crate::metrics::Metrics;
use crate::openapi::OpenApi;
use crate::registry::{Registry, WriteOptions};
use crate::tls::{self, TlsError, TlsMaterial};
use crate::watch::{WatchSlots, DEFAULT_MAX_WATCHES_PER_USER};

/// Server start-up errors. A variant that wraps an error says what was being
/// done; the error is its `source()` (`cozyplane apiserver` prints the chain).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("bind {addr}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The embedded store's data directory could not be created.
    #[error("creating the data directory {}", path.display())]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The storage backend could not be opened or reached.
    #[error("opening the storage backend")]
    Storage(#[source] cozyplane_store::StoreError),
    /// etcd's TLS files are unusable, or etcd refused or did not answer.
    #[error("opening the storage backend")]
    Etcd(#[source] cozyplane_store::etcd::ConnectError),
    #[error("bootstrap object {name}: {message}")]
    Bootstrap { name: String, message: String },
    /// The SIGTERM handler could not be installed.
    #[error("installing the SIGTERM handler")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
    #[error("delegating to the main API server")]
    Delegation(#[from] crate::auth::delegated::DelegationError),
    #[error("service account signing key: {0}")]
    ServiceAccountKey(String),
    /// The RBAC policy could not be read at start.
    #[error("reading the RBAC policy: {0}")]
    Rbac(String),
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    /// Generate a CA + serving cert in memory.
    Generate,
    /// Reuse or create them in this directory.
    CertDir(PathBuf),
    /// Use this material.
    Material(TlsMaterial),
}

/// Builder for an API server.
pub struct ServerBuilder {
    store: Arc<dyn Storage>,
    kinds: Vec<KindInfo>,
    standalone: bool,
    bind: SocketAddr,
    tls: TlsSource,
    extra_names: Vec<String>,
    kubeconfig: Option<PathBuf>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    client_ca: Option<String>,
    request_header: Option<(String, RequestHeaderConfig)>,
    token_authenticators: Vec<Arc<dyn TokenAuthenticator>>,
    bookmark_interval: Duration,
    authorizer: Option<Arc<dyn Authorizer>>,
    connections: ServerSettings,
    max_watches_per_user: usize,
    services: crate::services::ServiceSettings,
    agent_accounts: Vec<String>,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("bind", &self.bind)
            .field("standalone", &self.standalone)
            .finish_non_exhaustive()
    }
}

/// A running server.
pub struct RunningServer {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    pub addr: SocketAddr,
    /// The CA clients must trust.
    pub ca_pem: String,
    /// The serving material (its CA key issues client certificates in tests).
    pub tls: TlsMaterial,
    /// An admin bearer token (`system:masters`), held in memory only.
    pub token: String,
    /// Where the kubeconfig was written, if asked.
    pub kubeconfig: Option<PathBuf>,
    shutdown: watch::Sender<bool>,
    closer: watch::Sender<u64>,
    watches: Arc<WatchSlots>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl RunningServer {
    /// End every open watch now (clients see the stream close and resume).
    /// Used by tests to force a watch break; shutdown uses it too.
    pub fn break_watches(&self) {
        self.closer.send_modify(|g| *g += 1);
    }

    /// How many watches are open (each holds a store watch while it is).
    pub fn open_watches(&self) -> usize {
        self.watches.open()
    }

    /// Stop accepting, close watches and connections, and wait.
    pub async fn shutdown(self) {
        self.break_watches();
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }

    /// Wait until the server stops (it only stops on shutdown).
    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl ServerBuilder {
    /// A server over `store` serving `kinds`, on 127.0.0.1 with an
    /// ephemeral port and a generated certificate.
    pub fn new(store: Arc<dyn Storage>, kinds: Vec<KindInfo>) -> Self {
        ServerBuilder {
            store,
            kinds,
            standalone: false,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: TlsSource::Generate,
            extra_names: Vec::new(),
            kubeconfig: None,
            token: None,
            token_file: None,
            client_ca: None,
            request_header: None,
            token_authenticators: Vec::new(),
            bookmark_interval: Duration::from_secs(60),
            authorizer: None,
            connections: ServerSettings::default(),
            max_watches_per_user: DEFAULT_MAX_WATCHES_PER_USER,
            services: crate::services::ServiceSettings::default(),
            agent_accounts: Vec::new(),
        }
    }

    /// The Service cluster IP range(s) (standalone mode; default
    /// 10.0.0.0/24, kube-apiserver's).
    pub fn service_cidrs(mut self, cidrs: crate::services::ServiceCidrs) -> Self {
        self.services.cidrs = cidrs;
        self
    }

    /// The node port range (default 30000-32767).
    pub fn node_port_range(mut self, range: crate::services::PortRange) -> Self {
        self.services.node_ports = range;
        self
    }

    /// How often the Service allocation repair runs, and how old a claim
    /// without its Service must be before it is deleted (defaults 3 min
    /// and 60 s; see [`crate::services::repair`]).
    pub fn service_repair(mut self, interval: Duration, grace: Duration) -> Self {
        self.services.repair_interval = interval;
        self.services.repair_grace = grace;
        self
    }

    /// Standalone mode: also serve the core kinds (RBAC included), create
    /// the default namespaces and the bootstrap RBAC policy, authorize
    /// with RBAC, and accept client certificates signed by the server's CA.
    pub fn standalone(mut self, on: bool) -> Self {
        self.standalone = on;
        self
    }

    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    pub fn tls(mut self, tls: TlsSource) -> Self {
        self.tls = tls;
        self
    }

    /// Extra DNS names / IPs for the generated serving certificate.
    pub fn extra_names(mut self, names: Vec<String>) -> Self {
        self.extra_names = names;
        self
    }

    pub fn write_kubeconfig(mut self, path: PathBuf) -> Self {
        self.kubeconfig = Some(path);
        self
    }

    /// An admin bearer token (`system:masters`; random when unset). For
    /// programs that embed the server; the command line takes no secrets.
    pub fn token(mut self, token: String) -> Self {
        self.token = Some(token);
        self
    }

    /// Bearer tokens from a file in kube-apiserver's `--token-auth-file`
    /// format.
    pub fn token_file(mut self, path: PathBuf) -> Self {
        self.token_file = Some(path);
        self
    }

    /// The CA (PEM) client certificates must chain to. Standalone mode
    /// uses the server's own CA when none is given.
    pub fn client_ca(mut self, pem: String) -> Self {
        self.client_ca = Some(pem);
        self
    }

    /// Front-proxy authentication: certificates chaining to `ca_pem` (PEM)
    /// with an allowed CN name the user in request headers.
    pub fn request_header(mut self, ca_pem: String, config: RequestHeaderConfig) -> Self {
        self.request_header = Some((ca_pem, config));
        self
    }

    /// Another bearer-token authenticator (delegated TokenReview), asked
    /// after the token file.
    pub fn token_authenticator(mut self, t: Arc<dyn TokenAuthenticator>) -> Self {
        self.token_authenticators.push(t);
        self
    }

    /// How often idle watches with bookmarks get a BOOKMARK.
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = d;
        self
    }

    /// The most connections open at once (default: 10 000, or fewer when
    /// `RLIMIT_NOFILE` leaves room for fewer; see [`crate::connections`]).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.connections.max_connections = n.max(1);
        self
    }

    /// How long a connection has to finish its TLS handshake and send its
    /// first request's headers (default 10 s).
    pub fn tls_handshake_timeout(mut self, d: Duration) -> Self {
        self.connections.handshake_timeout = d;
        self
    }

    /// How long an HTTP/1 connection has to send a request's headers, and
    /// may idle between requests (default 30 s).
    pub fn header_read_timeout(mut self, d: Duration) -> Self {
        self.connections.header_read_timeout = d;
        self
    }

    /// How long an established connection may have no request in flight
    /// before it is closed (default 90 s; see [`crate::connections`]).
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.connections.idle_timeout = d;
        self
    }

    /// HTTP/2 keep-alive: a PING after `interval` without a frame from the
    /// peer, and the connection closed when its ACK has not come within
    /// `timeout` (defaults 30 s and 15 s).
    pub fn http2_keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.connections.keepalive_interval = interval;
        self.connections.keepalive_timeout = timeout;
        self
    }

    /// The most watches one user may have open (default 100; users in
    /// `system:masters` are not limited). Over it a watch answers 429.
    pub fn max_watches_per_user(mut self, n: usize) -> Self {
        self.max_watches_per_user = n;
        self
    }

    /// The agents' ServiceAccount users (`system:serviceaccount:<ns>:<name>`):
    /// each is node-restricted to the node its bound token names
    /// (`auth/node.rs`), as the lab's `cozyplane:agent:<node>` users are.
    pub fn agent_service_accounts(mut self, users: Vec<String>) -> Self {
        self.agent_accounts = users;
        self
    }

    /// Override the authorizer (the seam delegated authorization uses).
    pub fn authorizer(mut self, a: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(a);
        self
    }

    /// Bind, bootstrap and start serving.
    pub async fn start(self) -> Result<RunningServer, ServerError> {
        let material = match &self.tls {
            TlsSource::Generate => tls::generate(&self.extra_names)?,
            TlsSource::CertDir(d) => tls::load_or_generate(d, &self.extra_names)?,
            TlsSource::Material(m) => m.clone(),
        };
        let client_ca = match (&self.client_ca, self.standalone) {
            (Some(ca), _) => Some(ca.clone()),
            (None, true) => Some(material.ca_pem.clone()),
            (None, false) => None,
        };
        // The handshake accepts certificates of either CA; each connection
        // is then classified (a user's, or a front proxy's).
        let bundle: Option<String> = match (&client_ca, &self.request_header) {
            (None, None) => None,
            (a, b) => Some(format!(
                "{}\n{}",
                a.as_deref().unwrap_or(""),
                b.as_ref().map(|(ca, _)| ca.as_str()).unwrap_or("")
            )),
        };
        let acceptor =
            tokio_rustls::TlsAcceptor::from(tls::server_config(&material, bundle.as_deref())?);
        let cert_authority = Arc::new(CertAuthority::new(
            client_ca.as_deref().map(tls::client_verifier).transpose()?,
            self.request_header
                .as_ref()
                .map(|(ca, cfg)| tls::client_verifier(ca).map(|v| (v, cfg.allowed_names.clone())))
                .transpose()?,
        ));
        let listener = TcpListener::bind(self.bind)
            .await
            .map_err(|source| ServerError::Bind {
                addr: self.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: self.bind,
            source,
        })?;
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let url = format!("https://{host}:{}", addr.port());

        let mut kinds: Vec<_> = self
            .kinds
            .into_iter()
            .map(|k| {
                let hooks = crate::tenancy::hooks_for(&k);
                (k, hooks)
            })
            .collect();
        if self.standalone {
            let allocator = Arc::new(crate::services::ServiceAllocator::new(
                self.services.cidrs.clone(),
                self.services.node_ports,
            ));
            kinds.extend(core_kinds::standalone_kinds_with_service_hooks(
                crate::services::hooks(Some(allocator)),
            ));
        }
        let registry = Arc::new(Registry::with_hooks(self.store, kinds));
        if self.standalone {
            bootstrap_namespaces(&registry).await?;
            bootstrap_rbac(&registry).await?;
            bootstrap_service_cidr(&registry, &self.services.cidrs).await?;
            // Claims a crash left out of step with their Services, before
            // anything is allocated (see `services::repair`).
            match crate::services::repair::repair(registry.store(), self.services.repair_grace)
                .await
            {
                Ok(report) if !report.is_empty() => {
                    tracing::info!(?report, "repaired Service allocations")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e.message, "the Service allocation repair pass failed")
                }
            }
            // Publish what an aggregated server needs to trust us, as
            // kube-apiserver does.
            publish_extension_authentication(
                &registry,
                &ExtensionAuthentication {
                    client_ca: client_ca.clone(),
                    request_header: self.request_header.clone(),
                },
            )
            .await?;
        }
        let token = self.token.unwrap_or_else(random_token);
        let mut tokens = match &self.token_file {
            Some(p) => StaticTokens::load(p)?,
            None => StaticTokens::default(),
        };
        tokens.insert(&token, UserInfo::new("cozyplane-admin", &[MASTERS]));
        let mut chain = AuthenticatorChain::default();
        let mut sa_tokens = None;
        if self.standalone {
            let key_pem = match &self.tls {
                TlsSource::CertDir(d) => tls::load_or_generate_key(&d.join("sa.key"))?,
                _ => rcgen::KeyPair::generate()
                    .map_err(TlsError::from)?
                    .serialize_pem(),
            };
            let signer = Arc::new(
                TokenSigner::from_pem(&key_pem, serviceaccount::DEFAULT_ISSUER)
                    .map_err(|e| ServerError::ServiceAccountKey(e.to_string()))?,
            );
            let audiences = vec![serviceaccount::DEFAULT_ISSUER.to_string()];
            chain = chain.with_tokens(Arc::new(ServiceAccountTokens {
                signer: signer.clone(),
                audiences: audiences.clone(),
                registry: registry.clone(),
            }));
            sa_tokens = Some(Arc::new(serviceaccount::Issuer {
                signer,
                default_audiences: audiences,
            }));
        }
        let mut background = Vec::new();
        if self.standalone {
            // Written once before serving, then kept (see `services::kubernetes`).
            if let Err(e) =
                crate::services::kubernetes::reconcile(&registry, &self.services.cidrs, addr).await
            {
                tracing::warn!(error = %e.message, "could not write the kubernetes Service and its EndpointSlice");
            }
            background.push(crate::services::kubernetes::spawn(
                registry.clone(),
                self.services.cidrs.clone(),
                addr,
            ));
            background.push(crate::services::repair::spawn(
                registry.store().clone(),
                self.services.repair_interval,
                self.services.repair_grace,
            ));
        }
        let authorizer: Arc<dyn Authorizer> = match (self.authorizer, self.standalone) {
            (Some(a), _) => a,
            (None, true) => {
                let rbac = Arc::new(Rbac::default());
                rbac.refresh(&registry)
                    .await
                    .map_err(|e| ServerError::Rbac(e.message))?;
                background.push(rbac.spawn_refresher(registry.clone()));
                rbac
            }
            (None, false) => Arc::new(MastersOnly),
        };
        let auth = Auth {
            authenticator: Arc::new({
                let mut chain = chain.with_tokens(Arc::new(tokens));
                for t in self.token_authenticators {
                    chain = chain.with_tokens(t);
                }
                if let Some((_, cfg)) = &self.request_header {
                    chain = chain.with_request_header(cfg.clone());
                }
                chain
            }),
            authorizer,
            agent_accounts: self.agent_accounts.into(),
        };
        let openapi = OpenApi::build(registry.kinds(), env!("CARGO_PKG_VERSION"));
        let (closer_tx, closer_rx) = watch::channel(0u64);
        let metrics = Metrics::default();
        let watches = WatchSlots::new(self.max_watches_per_user, metrics.watchers.clone());
        let state = Arc::new(AppState {
            registry,
            openapi,
            metrics,
            watches: watches.clone(),
            auth,
            reviews: if self.standalone {
                crate::auth::reviews::REVIEWS
            } else {
                &[]
            },
            sa_tokens,
            closer: closer_rx,
            bookmark_interval: self.bookmark_interval,
            server_address: format!("{host}:{}", addr.port()),
            version: json!({
                "major": "1", "minor": "33", "gitVersion": format!("v1.33.0-cozyplane.{}", env!("CARGO_PKG_VERSION")),
                "gitCommit": "", "gitTreeState": "clean", "buildDate": "", "goVersion": "", "compiler": "rustc",
                "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
            }),
        });
        if let Some(path) = &self.kubeconfig {
            // The admin kubeconfig holds a client certificate in
            // system:masters when the server has a CA to issue it (and
            // trusts that CA); else the in-memory admin token.
            let user = if material.ca_key_pem.is_some()
                && client_ca.as_deref() == Some(material.ca_pem.as_str())
            {
                tls::issue_client_cert(&material, "cozyplane-admin", &[MASTERS], 365)?
            } else {
                tls::KubeconfigUser::Token(token.clone())
            };
            tls::write_kubeconfig(path, &url, &material.ca_pem, &user)?;
        }
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let connections = self.connections;
        let task = tokio::spawn(async move {
            accept_loop(
                listener,
                acceptor,
                cert_authority,
                state,
                connections,
                shutdown_rx,
            )
            .await;
            for t in background {
                t.abort();
            }
        });
        Ok(RunningServer {
            url,
            addr,
            ca_pem: material.ca_pem.clone(),
            tls: material,
            token,
            kubeconfig: self.kubeconfig,
            shutdown: shutdown_tx,
            closer: closer_tx,
            watches,
            task,
        })
    }
}

/// Create the bootstrap RBAC policy objects that are missing.
async fn bootstrap_rbac(registry: &Registry) -> Result<(), ServerError> {
    let cluster = crate::auth::bootstrap::objects()
        .into_iter()
        .map(|(plural, obj)| (plural, None, obj));
    let namespaced = crate::auth::bootstrap::namespaced_objects()
        .into_iter()
        .map(|(plural, ns, obj)| (plural, Some(ns), obj));
    for (plural, ns, obj) in cluster.chain(namespaced) {
        let Some(kind) = registry.find(crate::auth::rbac::GROUP, "v1", plural) else {
            continue;
        };
        let name = obj
            .pointer("/metadata/name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string();
        match registry
            .create(&kind, ns, obj, &WriteOptions::default())
            .await
        {
            Ok(_) => {}
            Err(e) if e.reason == "AlreadyExists" => {}
            Err(e) => {
                return Err(ServerError::Bootstrap {
                    name,
                    message: e.message,
                })
            }
        }
    }
    Ok(())
}

/// Write `kube-system/extension-apiserver-authentication`.
async fn publish_extension_authentication(
    registry: &Registry,
    e: &ExtensionAuthentication,
) -> Result<(), ServerError> {
    let Some(kind) = registry.find("", "v1", "configmaps") else {
        return Ok(());
    };
    let (ns, name) = delegated::CONFIG_MAP;
    let fail = |message: String| ServerError::Bootstrap {
        name: name.into(),
        message,
    };
    let want = e.to_config_map();
    for _ in 0..5 {
        match registry
            .create(&kind, Some(ns), want.clone(), &WriteOptions::default())
            .await
        {
            Ok(_) => return Ok(()),
            Err(err) if err.reason == "AlreadyExists" => {}
            Err(err) => return Err(fail(err.message)),
        }
        let mut have = match registry.get(&kind, Some(ns), name).await {
            Ok(v) => v,
            Err(err) if err.code == 404 => continue,
            Err(err) => return Err(fail(err.message)),
        };
        have["data"] = want["data"].clone();
        match registry
            .update(&kind, Some(ns), name, have, false, &WriteOptions::default())
            .await
        {
            Ok(_) => return Ok(()),
            Err(err) if err.code == 409 || err.code == 404 => continue,
            Err(err) => return Err(fail(err.message)),
        }
    }
    Err(fail("kept conflicting with other writers".into()))
}

/// Write the ServiceCIDR `kubernetes` with the server's service ranges, as
/// kube-apiserver does; replaced when the flag changed since the last
/// start (its `spec.cidrs` is refused to clients).
async fn bootstrap_service_cidr(
    registry: &Registry,
    cidrs: &crate::services::ServiceCidrs,
) -> Result<(), ServerError> {
    let Some(kind) = registry.find("networking.k8s.io", "v1", "servicecidrs") else {
        return Ok(());
    };
    let name = crate::services::validate::DEFAULT_SERVICE_CIDR_NAME;
    let list: Vec<String> = cidrs.cidrs().iter().map(|c| c.to_string()).collect();
    let want = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": name},
        "spec": {"cidrs": list},
        "status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "", "message": "Kubernetes Service CIDR is ready",
            "lastTransitionTime": crate::registry::now_rfc3339(),
        }]},
    });
    let fail = |message: String| ServerError::Bootstrap {
        name: name.into(),
        message,
    };
    for _ in 0..5 {
        match registry.get(&kind, None, name).await {
            Ok(have) if have.pointer("/spec/cidrs") == want.pointer("/spec/cidrs") => return Ok(()),
            Ok(_) => match registry
                .delete(
                    &kind,
                    None,
                    name,
                    &crate::registry::DeleteOptions::default(),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 || e.code == 409 => continue,
                Err(e) => return Err(fail(e.message)),
            },
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(fail(e.message)),
        }
        match registry
            .create(&kind, None, want.clone(), &WriteOptions::default())
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.reason == "AlreadyExists" => continue,
            Err(e) => return Err(fail(e.message)),
        }
    }
    Err(fail("kept conflicting with other writers".into()))
}

/// Create the namespaces every cluster has, as kube-apiserver does.
async fn bootstrap_namespaces(registry: &Registry) -> Result<(), ServerError> {
    let Some(ns_kind) = registry.find("", "v1", "namespaces") else {
        return Ok(());
    };
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}});
        match registry
            .create(&ns_kind, None, obj, &WriteOptions::default())
            .await
        {
            Ok(_) => {}
            Err(e) if e.reason == "AlreadyExists" => {}
            Err(e) => {
                return Err(ServerError::Bootstrap {
                    name: name.into(),
                    message: e.message,
                })
            }
        }
    }
    Ok(())
}
