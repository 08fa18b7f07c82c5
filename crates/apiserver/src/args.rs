//! Command-line arguments and `run`, which the `cozyplane apiserver`
//! subcommand calls.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use cozyplane_api::kinds::KindInfo;
use cozyplane_store::Storage;

use crate::server::{ServerBuilder, ServerError, TlsSource};
use crate::tls;

/// Which storage backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StorageKind {
    /// The embedded crash-safe store in --data-dir (default).
    Embedded,
    /// etcd v3 at --etcd-endpoints.
    Etcd,
}

/// Arguments of `cozyplane apiserver`.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiserverArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// HTTPS port.
    #[arg(long, default_value_t = 6443)]
    pub port: u16,
    /// Standalone mode, FOR DEVELOPMENT AND TESTS ONLY: also serves core/v1
    /// namespaces, nodes, pods, services, endpointslices, networkpolicies,
    /// the cilium.io/v2 policy kinds, leases and RBAC (stored, no
    /// controllers), authorizes with RBAC, and
    /// accepts client certificates signed by the server's own CA.
    #[arg(long)]
    pub standalone: bool,
    /// Storage backend.
    #[arg(long, value_enum, default_value_t = StorageKind::Embedded)]
    pub storage: StorageKind,
    /// Data directory of the embedded store.
    #[arg(long, default_value = "/var/lib/cozyplane/apiserver")]
    pub data_dir: PathBuf,
    /// etcd endpoints (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/cozyplane")]
    pub etcd_prefix: String,
    /// CA bundle (PEM) etcd's serving certificates must chain to. Without
    /// it an https:// endpoint is checked against the system's roots.
    #[arg(long)]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate (PEM) shown to etcd (etcd's --client-cert-auth).
    #[arg(long, requires = "etcd_keyfile")]
    pub etcd_certfile: Option<PathBuf>,
    /// Private key (PEM) of --etcd-certfile.
    #[arg(long, requires = "etcd_certfile")]
    pub etcd_keyfile: Option<PathBuf>,
    /// Directory for the generated CA and serving certificate (reused across restarts).
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// Serving certificate (PEM); with --tls-private-key-file, replaces the generated one.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving private key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Extra DNS names or IPs for the generated serving certificate.
    #[arg(long, value_delimiter = ',')]
    pub tls_san: Vec<String>,
    /// Write a kubeconfig for this server here.
    #[arg(long)]
    pub write_kubeconfig: Option<PathBuf>,
    /// Bearer tokens, in kube-apiserver's --token-auth-file CSV format
    /// (`token,user,uid,"group1,group2"`). Tokens never go on the command
    /// line: /proc/<pid>/cmdline is world-readable.
    #[arg(long)]
    pub token_auth_file: Option<PathBuf>,
    /// CA bundle (PEM) that client certificates must chain to (CN = user,
    /// O = groups). Standalone mode trusts its own CA when unset.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// CA bundle (PEM) of front-proxy client certificates: a request over
    /// such a certificate names its user in the request headers.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Common names a front-proxy certificate may have (empty: any).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers naming the user (default X-Remote-User).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_username_headers: Vec<String>,
    /// Headers naming the groups (default X-Remote-Group).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_group_headers: Vec<String>,
    /// Header prefixes of user extras (default X-Remote-Extra-).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Kubeconfig of the main API server (kube-apiserver) this server sits
    /// behind: bearer tokens are checked there by TokenReview, and the
    /// client CA and front-proxy settings are read from its
    /// kube-system/extension-apiserver-authentication ConfigMap (the flags
    /// above override them). Without it, a server that is not standalone and
    /// runs in a pod uses its ServiceAccount (in-cluster configuration).
    #[arg(long)]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the main API server that authorizes every request by
    /// SubjectAccessReview. Without it: as `--authentication-kubeconfig`.
    #[arg(long)]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// The agents' ServiceAccounts, as users
    /// (`system:serviceaccount:<namespace>:<name>`, comma list): behind
    /// kube-apiserver each is restricted to writing the Ports of the node
    /// its bound token names, as kube's NodeRestriction does for kubelets.
    #[arg(long, value_delimiter = ',', value_parser = parse_service_account)]
    pub agent_service_account: Vec<String>,
    /// The most connections open at once [default: 10000, or fewer when
    /// the open-files limit (RLIMIT_NOFILE) leaves room for fewer].
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// The most watches one user may have open (users in system:masters
    /// are not limited); over it a watch answers 429 TooManyRequests.
    #[arg(long, default_value_t = crate::watch::DEFAULT_MAX_WATCHES_PER_USER)]
    pub max_watches_per_user: usize,
    /// Standalone mode: the range(s) Service cluster IPs come from, as
    /// kube-apiserver's flag: one CIDR, or one IPv4 and one IPv6 CIDR
    /// separated by a comma for dual-stack (the first is the primary
    /// family). At most 2^20 addresses each (IPv4 /12, IPv6 /108)
    /// [default: 10.0.0.0/24, kube-apiserver's, with a warning].
    #[arg(long)]
    pub service_cluster_ip_range: Option<crate::services::ServiceCidrs>,
    /// Standalone mode: the range NodePort and LoadBalancer Services' node
    /// ports come from (`first-last`, or `first+count`).
    #[arg(long, default_value = "30000-32767")]
    pub service_node_port_range: crate::services::PortRange,
}

/// Open the configured storage backend.
pub async fn open_store(args: &ApiserverArgs) -> Result<Arc<dyn Storage>, ServerError> {
    match args.storage {
        StorageKind::Embedded => {
            // Owner-only: the store holds every object, Secrets-to-be included.
            {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&args.data_dir)
                    .map_err(|source| ServerError::DataDir {
                        path: args.data_dir.clone(),
                        source,
                    })?;
            }
            let file = args.data_dir.join("store.redb");
            let store =
                cozyplane_store::EmbeddedStore::open(&file).map_err(ServerError::Storage)?;
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).map_err(
                    |source| ServerError::DataDir {
                        path: file.clone(),
                        source,
                    },
                )?;
            }
            Ok(Arc::new(store))
        }
        StorageKind::Etcd => {
            let tls = cozyplane_store::etcd::EtcdTls::from_files(
                args.etcd_cafile.as_deref(),
                args.etcd_certfile.as_deref(),
                args.etcd_keyfile.as_deref(),
            )
            .map_err(ServerError::Etcd)?;
            let options = cozyplane_store::EtcdOptions {
                tls,
                ..Default::default()
            };
            let store = cozyplane_store::EtcdStore::connect_with(
                &args.etcd_endpoints,
                &args.etcd_prefix,
                options,
            )
            .await
            .map_err(ServerError::Etcd)?;
            Ok(Arc::new(store))
        }
    }
}

fn parse_service_account(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("system:serviceaccount:")
        .ok_or_else(|| format!("{s:?}: expected system:serviceaccount:<namespace>:<name>"))?;
    match rest.split_once(':') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => {
            Ok(s.to_string())
        }
        _ => Err(format!(
            "{s:?}: expected system:serviceaccount:<namespace>:<name>"
        )),
    }
}

/// The kinds a server serves: every `sdn.cozystack.io` kind, plus
/// `local.sdn.cozystack.io` (a CRD on real clusters) in standalone mode.
/// The core kinds of standalone mode are added by the server builder.
pub fn served_kinds(standalone: bool) -> Vec<KindInfo> {
    let mut kinds = cozyplane_api::sdn_kinds();
    if standalone {
        kinds.extend(cozyplane_api::local_kinds());
    }
    kinds
}

/// Build the server described by `args` over `store`, serving `kinds`.
/// Fails when given certificate files cannot be read.
pub fn builder(
    args: &ApiserverArgs,
    store: Arc<dyn Storage>,
    kinds: Vec<KindInfo>,
) -> Result<ServerBuilder, ServerError> {
    let tls = match (
        &args.tls_cert_file,
        &args.tls_private_key_file,
        &args.cert_dir,
    ) {
        (Some(c), Some(k), _) => TlsSource::Material(tls::load_files(c, k)?),
        (_, _, Some(d)) => TlsSource::CertDir(d.clone()),
        _ => TlsSource::Generate,
    };
    let mut b = ServerBuilder::new(store, kinds)
        .standalone(args.standalone)
        .bind(SocketAddr::new(args.bind_address, args.port))
        .tls(tls)
        .extra_names(args.tls_san.clone())
        .max_watches_per_user(args.max_watches_per_user)
        .node_port_range(args.service_node_port_range)
        .agent_service_accounts(args.agent_service_account.clone());
    match &args.service_cluster_ip_range {
        Some(cidrs) => b = b.service_cidrs(cidrs.clone()),
        None if args.standalone => tracing::warn!(
            "no --service-cluster-ip-range given: Service cluster IPs come from the default {}",
            crate::services::config::DEFAULT_SERVICE_CIDR
        ),
        None => {}
    }
    if let Some(n) = args.max_connections {
        b = b.max_connections(n);
    }
    if let Some(p) = &args.write_kubeconfig {
        b = b.write_kubeconfig(p.clone());
    }
    if let Some(p) = &args.token_auth_file {
        b = b.token_file(p.clone());
    }
    if let Some(p) = &args.client_ca_file {
        b = b.client_ca(tls::load_client_ca(p)?);
    }
    Ok(b)
}

/// Adds delegated authentication and authorization (an aggregated server
/// behind kube-apiserver) and the front-proxy settings to `b`.
pub async fn configure_delegation(
    args: &ApiserverArgs,
    mut b: ServerBuilder,
) -> Result<ServerBuilder, ServerError> {
    use crate::auth::authn::RequestHeaderConfig;
    use crate::auth::delegated::{DelegatedAuthorizer, DelegatedTokens, Remote};
    let mut published = crate::auth::delegated::ExtensionAuthentication::default();
    // Behind kube-apiserver in a pod without the kubeconfig flags, the pod's
    // ServiceAccount reaches it (as k8s.io/apiserver's delegating options do).
    let in_cluster = !args.standalone && Remote::in_a_pod();
    let authn = match &args.authentication_kubeconfig {
        Some(path) => Some(Remote::from_kubeconfig(path).await?),
        None if in_cluster => Some(Remote::in_cluster()?),
        None => None,
    };
    if let Some(remote) = authn {
        published = remote.extension_authentication().await?;
        b = b.token_authenticator(std::sync::Arc::new(DelegatedTokens::new(
            remote,
            Vec::new(),
        )));
    }
    if args.client_ca_file.is_none() {
        if let Some(ca) = published.client_ca.take() {
            b = b.client_ca(ca);
        }
    }
    let ca = match &args.requestheader_client_ca_file {
        Some(p) => Some(tls::load_client_ca(p)?),
        None => published.request_header.as_ref().map(|(ca, _)| ca.clone()),
    };
    if let Some(ca) = ca {
        let mut c = published
            .request_header
            .map(|(_, c)| c)
            .unwrap_or_else(RequestHeaderConfig::default);
        let set = |dst: &mut Vec<String>, flag: &Vec<String>| {
            if !flag.is_empty() {
                *dst = flag.clone();
            }
        };
        set(&mut c.allowed_names, &args.requestheader_allowed_names);
        set(
            &mut c.username_headers,
            &args.requestheader_username_headers,
        );
        set(&mut c.group_headers, &args.requestheader_group_headers);
        set(
            &mut c.extra_headers_prefixes,
            &args.requestheader_extra_headers_prefix,
        );
        b = b.request_header(ca, c);
    }
    let authz = match &args.authorization_kubeconfig {
        Some(path) => Some(Remote::from_kubeconfig(path).await?),
        None if in_cluster => Some(Remote::in_cluster()?),
        None => None,
    };
    if let Some(remote) = authz {
        b = b.authorizer(std::sync::Arc::new(DelegatedAuthorizer::new(remote)));
    }
    Ok(b)
}

/// Run the API server described by `args` until Ctrl-C / SIGTERM.
pub async fn run(args: ApiserverArgs) -> Result<(), ServerError> {
    let store = open_store(&args).await?;
    let kinds = served_kinds(args.standalone);
    run_with(args, store, kinds).await
}

/// [`run`] over a given store and kinds.
pub async fn run_with(
    args: ApiserverArgs,
    store: Arc<dyn Storage>,
    kinds: Vec<KindInfo>,
) -> Result<(), ServerError> {
    if args.standalone {
        tracing::warn!("standalone mode: a development and test mode; serves core kinds without their controllers");
    }
    let b = builder(&args, store, kinds)?;
    let server = configure_delegation(&args, b).await?.start().await?;
    tracing::info!(url = %server.url, standalone = args.standalone, kubeconfig = ?server.kubeconfig, "cozyplane apiserver serving");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServerError::Signal)?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ApiserverArgs,
    }

    #[test]
    fn flags_parse_and_help_says_development_mode() {
        let cli = Cli::try_parse_from([
            "x",
            "--standalone",
            "--port",
            "7443",
            "--storage",
            "etcd",
            "--etcd-endpoints",
            "http://a:2379,http://b:2379",
        ]);
        let cli = match cli {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert!(cli.args.standalone);
        assert_eq!(cli.args.port, 7443);
        assert_eq!(cli.args.storage, StorageKind::Etcd);
        assert_eq!(cli.args.etcd_endpoints, ["http://a:2379", "http://b:2379"]);
        let help = <Cli as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(help.contains("FOR DEVELOPMENT AND TESTS ONLY"), "{help}");
        assert!(
            Cli::try_parse_from(["x", "--tls-cert-file", "/c"]).is_err(),
            "cert needs a key"
        );
    }

    #[test]
    fn service_ranges_default_as_kube_and_bad_ones_are_refused() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.args.service_cluster_ip_range, None);
        assert_eq!(cli.args.service_node_port_range.to_string(), "30000-32767");
        let cli = Cli::try_parse_from([
            "x",
            "--service-cluster-ip-range",
            "10.96.0.0/16,fd00:10:96::/112",
            "--service-node-port-range",
            "31000-31999",
        ])
        .unwrap();
        let cidrs = cli.args.service_cluster_ip_range.unwrap();
        assert_eq!(cidrs.to_flag(), "10.96.0.0/16,fd00:10:96::/112");
        assert_eq!(cli.args.service_node_port_range.to_string(), "31000-31999");
        let err =
            Cli::try_parse_from(["x", "--service-cluster-ip-range", "10.0.0.0/24,10.1.0.0/24"])
                .unwrap_err()
                .to_string();
        assert!(err.contains("both IPv4"), "{err}");
        let err = Cli::try_parse_from(["x", "--service-node-port-range", "30000-20000"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("first no larger than the last"), "{err}");
    }

    /// The data directory and the database are the owner's only.
    #[tokio::test]
    async fn the_data_dir_and_database_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("a/data");
        let cli = Cli::try_parse_from(["x", "--data-dir", data_dir.to_str().unwrap()]).unwrap();
        let _store = open_store(&cli.args).await.unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&data_dir), 0o700);
        assert_eq!(mode(&data_dir.join("store.redb")), 0o600);
    }

    /// The start-up error names the directory and the OS error, each once.
    #[tokio::test]
    async fn an_unusable_data_dir_is_reported_with_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let data_dir = file.join("data");
        let cli = Cli::try_parse_from(["x", "--data-dir", data_dir.to_str().unwrap()]).unwrap();
        let err = open_store(&cli.args).await.err().unwrap();
        assert_eq!(
            cozyplane_errors::Chain(&err).to_string(),
            format!(
                "creating the data directory {}: Not a directory (os error 20)",
                data_dir.display()
            )
        );
    }
}
