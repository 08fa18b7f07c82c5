//! `cozyplane controller`: flags and the process lifecycle.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kube::Client;

use crate::gc::GcConfig;
use crate::leader::ElectionConfig;
use crate::{Controller, ControllerConfig, ControllerError};

/// Flags of `cozyplane controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Kubeconfig to use; without it the in-cluster service account (or
    /// `$KUBECONFIG` / `~/.kube/config`) is used.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Elect a leader on a Lease so several replicas are safe; with
    /// `--leader-elect=false` this replica always collects.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "cozyplane-controller")]
    pub lease_name: String,
    /// Namespace of the leader-election Lease.
    #[arg(long, default_value = "kube-system")]
    pub lease_namespace: String,
    /// Holder identity in the Lease (default: `<hostname>_<pid>`).
    #[arg(long)]
    pub identity: Option<String>,
    /// Lease duration in seconds (at least 3 × the renew interval).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub lease_duration: u64,
    /// Lease renew interval in seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1200))]
    pub renew_interval: u64,
    /// Seconds a FabricIP must exist before GC may judge it (protects an ADD
    /// in flight whose pod is not visible yet).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    pub gc_grace: u64,
    /// Seconds between full GC passes (event-driven passes run in between).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub resync: u64,
    /// Address of `/healthz`, `/readyz` and `/metrics`. Loopback by default:
    /// the endpoints are unauthenticated, so exposing them is an explicit choice
    /// (behind an authenticating proxy such as kube-rbac-proxy).
    #[arg(long, default_value = "127.0.0.1:9412")]
    pub metrics_bind: SocketAddr,
}

/// `<hostname>_<pid>`: unique per process, readable in `kubectl get lease`.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string());
    format!("{host}_{}", std::process::id())
}

impl ControllerArgs {
    /// The controller configuration these flags describe.
    pub fn config(&self) -> Result<ControllerConfig, ControllerError> {
        let election = if self.leader_elect {
            let identity = self.identity.clone().unwrap_or_else(default_identity);
            let mut e = ElectionConfig::new(&self.lease_namespace, &self.lease_name, &identity);
            e.lease_duration = Duration::from_secs(self.lease_duration);
            e.renew_interval = Duration::from_secs(self.renew_interval);
            e.validate()?;
            Some(e)
        } else {
            None
        };
        Ok(ControllerConfig {
            election,
            gc: GcConfig {
                grace: Duration::from_secs(self.gc_grace),
                resync: Duration::from_secs(self.resync),
                ..GcConfig::default()
            },
            vpc: crate::vpc::VpcConfig {
                resync: Duration::from_secs(self.resync),
                ..crate::vpc::VpcConfig::default()
            },
            metrics_bind: Some(self.metrics_bind),
        })
    }

    /// A client from `--kubeconfig`, else the inferred configuration.
    pub async fn client(&self) -> Result<Client, ControllerError> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let wrap = |source| ControllerError::Kubeconfig {
                    path: path.clone(),
                    source,
                };
                let kc = kube::config::Kubeconfig::read_from(path).map_err(wrap)?;
                kube::Config::from_custom_kubeconfig(
                    kc,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(wrap)?
            }
            None => kube::Config::infer().await?,
        };
        Client::try_from(config).map_err(ControllerError::Client)
    }
}

/// Runs the controller until SIGTERM or SIGINT, then shuts down cleanly
/// (releasing the Lease so a standby takes over at once).
pub async fn run(args: ControllerArgs) -> Result<(), ControllerError> {
    let config = args.config()?;
    let client = args.client().await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ControllerError::Signal)?;
    let running = Controller::start(client, config).await?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        r = tokio::signal::ctrl_c() => {
            r.map_err(ControllerError::Signal)?;
            tracing::info!("SIGINT: shutting down");
        }
    }
    running.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    fn parse(argv: &[&str]) -> Result<ControllerArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("controller").chain(argv.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn defaults_elect_a_leader_on_the_documented_lease() {
        let a = parse(&[]).expect("parse");
        let c = a.config().expect("config");
        let e = c.election.expect("leader election on by default");
        assert_eq!(
            (e.namespace.as_str(), e.name.as_str()),
            ("kube-system", "cozyplane-controller")
        );
        assert_eq!(e.lease_duration, Duration::from_secs(15));
        assert_eq!(e.renew_interval, Duration::from_secs(5));
        assert!(
            e.identity.ends_with(&format!("_{}", std::process::id())),
            "{}",
            e.identity
        );
        assert_eq!(c.gc.grace, Duration::from_secs(60));
        assert_eq!(
            c.metrics_bind,
            Some("127.0.0.1:9412".parse().expect("addr"))
        );
    }

    #[test]
    fn flags_override_and_leader_election_can_be_disabled() {
        let a = parse(&[
            "--leader-elect=false",
            "--gc-grace",
            "5",
            "--resync",
            "30",
            "--metrics-bind",
            "127.0.0.1:0",
        ])
        .expect("parse");
        let c = a.config().expect("config");
        assert!(c.election.is_none());
        assert_eq!(c.gc.grace, Duration::from_secs(5));
        assert_eq!(c.gc.resync, Duration::from_secs(30));
        let a = parse(&["--identity", "ctrl-a", "--lease-name", "x"]).expect("parse");
        let e = a.config().expect("config").election.expect("on");
        assert_eq!((e.identity.as_str(), e.name.as_str()), ("ctrl-a", "x"));
    }

    #[test]
    fn unsafe_timing_and_bad_values_are_refused() {
        let a = parse(&["--lease-duration", "10", "--renew-interval", "5"]).expect("parse");
        assert!(matches!(a.config(), Err(ControllerError::Election(_))));
        assert!(parse(&["--resync", "0"]).is_err());
        assert!(parse(&["--gc-grace", "99999999999"]).is_err());
        assert!(parse(&["--leader-elect", "maybe"]).is_err());
        assert!(parse(&["--metrics-bind", "not-an-addr"]).is_err());
    }
}
