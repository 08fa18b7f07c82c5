//! `cozyplane connectivity test`: deploys probe pods on any cluster (the lab or a real
//! one) and runs a PASS/FAIL matrix of checks, in the spirit of `cilium connectivity test`.
//!
//! Layout: [`matrix`] builds the checks from the cluster layout (pure), [`pods`] builds
//! the pod objects (pure), [`state`] reads pod and node state (pure), [`report`] turns
//! client reports into the printed matrix (pure), [`config`] finds the cluster and
//! [`run`] is the only part that talks to the API server.
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

pub mod config;
pub mod matrix;
pub mod pods;
pub mod report;
pub mod run;
pub mod state;
pub mod tenancy;

/// `cozyplane connectivity`.
#[derive(Debug, clap::Args)]
pub struct ConnectivityArgs {
    /// What to run.
    #[command(subcommand)]
    pub cmd: ConnectivityCmd,
}

/// The `cozyplane connectivity` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ConnectivityCmd {
    /// Deploy probe pods and run the check matrix (exit 1 on any failure).
    Test(TestArgs),
}

/// Default image: the release matching this binary.
pub const DEFAULT_IMAGE: &str = concat!("ghcr.io/cozystack/cozyplane:", env!("CARGO_PKG_VERSION"));

/// `cozyplane connectivity test`.
#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config, else in-cluster].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use [default: the current context].
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace for the probe pods (created if missing).
    #[arg(long, default_value = "cozyplane-connectivity")]
    pub namespace: String,
    /// Image of the probe pods (it must contain the `cozyplane` binary).
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Node A (client, echo-a, host-echo-a) [default: first schedulable node by name].
    #[arg(long, value_name = "NODE")]
    pub node_a: Option<String>,
    /// Node B (host-client, echo-b, host-echo-b) [default: next schedulable node].
    #[arg(long, value_name = "NODE")]
    pub node_b: Option<String>,
    /// TCP target outside the cluster for pod-to-external [default: the lab's, from the
    /// kubeconfig extension cozyplane.io/lab; else the check is skipped].
    #[arg(long, value_name = "IP:PORT")]
    pub external_target: Option<String>,
    /// Answer expected from --external-target [default: any answer].
    #[arg(long, value_name = "NAME", requires = "external_target")]
    pub external_name: Option<String>,
    /// Seconds to wait for each step (pods Ready, clients finished, pods deleted).
    #[arg(long, value_name = "SECONDS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Seconds each check retries before it fails.
    #[arg(long = "check-timeout", value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub check_timeout_secs: u64,
    /// Delete the probe pods at the end (they stay by default, for kubectl).
    #[arg(long)]
    pub cleanup: bool,
    /// Also run the tenancy group: two tenants' VPCs with the same CIDR, VPC probes and
    /// isolation checks, a third VPC peered with the first (cut by deleting a peering
    /// half) and a revoked binding cutting a live stream. Needs rights to create and
    /// delete namespaces, VPCs, VPCBindings and VPCPeerings (on the lab: the admin
    /// kubeconfig).
    #[arg(long)]
    pub tenancy: bool,
    /// CIDR of both tenants' VPCs (the same on purpose: overlapping twins).
    #[arg(long, value_name = "CIDR", default_value = tenancy::DEFAULT_CIDR, requires = "tenancy")]
    pub tenancy_cidr: String,
    /// CIDR of the peer tenant t3's VPC, peered with t1's (must not overlap --tenancy-cidr).
    #[arg(long, value_name = "CIDR", default_value = tenancy::DEFAULT_PEER_CIDR, requires = "tenancy")]
    pub tenancy_peer_cidr: String,
    /// Leave out the services group (it creates the NodePort Services svc-echo-a and
    /// svc-echo-b in the test namespace), e.g. without the rights to create Services.
    #[arg(long)]
    pub no_services: bool,
    /// Also run the policy group: a server `echo-policy` that a deny-all
    /// NetworkPolicy isolates and a second one opens to the pod
    /// `policy-client` on the echo port (TCP and UDP) only; `client` must be
    /// refused, `policy-client` answered on that port and refused on HTTP.
    /// Needs rights to create NetworkPolicies in the test namespace.
    #[arg(long)]
    pub policy: bool,
}

impl TestArgs {
    /// `--timeout` as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

/// Connectivity-test errors. A variant that wraps an error says what was being
/// done; the error is its `source()` (the CLI prints the chain).
#[derive(Debug, Error)]
pub enum ConnectivityError {
    /// No usable kubeconfig.
    #[error("{what}")]
    Kubeconfig {
        /// What was tried.
        what: String,
        /// The cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An API call failed.
    #[error(
        "{action} (check the kubeconfig's server and credentials: kubectl get nodes must work)"
    )]
    Api {
        /// What we were doing.
        action: String,
        /// The cause.
        source: kube::Error,
    },
    /// No nodes to test on.
    #[error("{0}")]
    Nodes(String),
    /// Probe pods in a state the test cannot use.
    #[error("{0}")]
    Pods(String),
    /// A bad external target.
    #[error("{0}")]
    BadExternalTarget(String),
    /// `--tenancy` was refused an object it must create.
    #[error(
        "{action} was forbidden: --tenancy needs rights to create namespaces, VPCs and \
         VPCBindings (and verb export on the VPCs), and to create and delete VPCBindings and \
         VPCPeerings (verb peer on the VPCs); use an admin kubeconfig (on the lab: \
         /run/cozyplane-lab/<name>/kubeconfig, not the connectivity-kubeconfig)"
    )]
    TenancyForbidden {
        /// What was refused.
        action: String,
        /// The API's answer.
        source: kube::Error,
    },
    /// The tenancy objects exist in a shape the test cannot use.
    #[error("{0}")]
    Tenancy(String),
    /// A plan could not be serialised (never expected).
    #[error("cannot serialise a client plan")]
    Plan(#[source] serde_json::Error),
    /// A wait timed out.
    #[error("timed out after {}s waiting for {what}; {hint}", waited.as_secs())]
    Timeout {
        /// What we waited for.
        what: String,
        /// How long.
        waited: Duration,
        /// What to check.
        hint: String,
    },
    /// Some checks failed.
    #[error(
        "connectivity test failed: {passed} passed, {failed} failed, {skipped} skipped; {hint}"
    )]
    Failed {
        /// Passed checks.
        passed: usize,
        /// Failed checks.
        failed: usize,
        /// Skipped checks.
        skipped: usize,
        /// What to look at.
        hint: String,
    },
}

/// Runs a `cozyplane connectivity` subcommand.
pub async fn run(args: ConnectivityArgs) -> Result<(), ConnectivityError> {
    match args.cmd {
        ConnectivityCmd::Test(a) => run::run(a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: ConnectivityCmd,
    }

    fn parse(args: &[&str]) -> Result<TestArgs, clap::Error> {
        let cli = Cli::try_parse_from(
            ["connectivity", "test"]
                .into_iter()
                .chain(args.iter().copied()),
        )?;
        let ConnectivityCmd::Test(a) = cli.cmd;
        Ok(a)
    }

    #[test]
    fn defaults_follow_the_contract() {
        let a = parse(&[]).expect("parse");
        assert_eq!(a.namespace, "cozyplane-connectivity");
        assert_eq!(
            a.image,
            format!("ghcr.io/cozystack/cozyplane:{}", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(a.timeout(), Duration::from_secs(120));
        assert_eq!(a.check_timeout_secs, 5);
        assert!(!a.cleanup);
        assert!(!a.tenancy);
        assert_eq!(a.tenancy_cidr, "10.250.0.0/24");
        assert_eq!(a.tenancy_peer_cidr, "10.251.0.0/24");
        assert_eq!(a.kubeconfig, None);
        assert_eq!(a.context, None);
    }

    #[test]
    fn flags_are_validated() {
        let a = parse(&[
            "--kubeconfig",
            "/k",
            "--node-a",
            "n1",
            "--node-b",
            "n2",
            "--timeout",
            "30",
            "--cleanup",
        ])
        .expect("parse");
        assert_eq!(a.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(
            (a.node_a.as_deref(), a.node_b.as_deref()),
            (Some("n1"), Some("n2"))
        );
        assert_eq!(a.timeout, 30);
        assert!(a.cleanup);
        assert!(parse(&["--timeout", "0"]).is_err());
        assert!(
            parse(&["--external-name", "x"]).is_err(),
            "needs --external-target"
        );
        let a = parse(&["--tenancy", "--tenancy-cidr", "10.9.0.0/24"]).expect("parse");
        assert!(a.tenancy);
        assert_eq!(a.tenancy_cidr, "10.9.0.0/24");
        assert!(
            parse(&["--tenancy-cidr", "10.9.0.0/24"]).is_err(),
            "needs --tenancy"
        );
        let a = parse(&["--tenancy", "--tenancy-peer-cidr", "10.8.0.0/24"]).expect("parse");
        assert_eq!(a.tenancy_peer_cidr, "10.8.0.0/24");
        assert!(
            parse(&["--tenancy-peer-cidr", "10.8.0.0/24"]).is_err(),
            "needs --tenancy"
        );
    }
}
