//! The `cozyplane` command: one binary, one subcommand per component.
use std::io::IsTerminal;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "cozyplane",
    version,
    about = "Multi-tenant eBPF CNI for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the sdn.cozystack.io API (etcd in production; --standalone for one machine).
    Apiserver(cozyplane_apiserver::ApiserverArgs),
    /// Node agent: loads the eBPF datapath, serves the CNI plugin, owns IPAM, programs the maps.
    Agent(cozyplane_agent::runtime::AgentArgs),
    /// Cluster-wide controller: FabricIP garbage collection, behind a Lease (leader election on by default).
    Controller(cozyplane_controller::ControllerArgs),
    /// Multi-node cluster in network namespaces on this machine (root): up, down, status.
    Lab(cozyplane_lab::cluster::LabArgs),
    /// Check a cluster's network end to end: deploys probe pods and runs a PASS/FAIL matrix.
    Connectivity(cozyplane_connectivity::ConnectivityArgs),
    /// The probe workload the connectivity test and the lab kubelet run in pods.
    Probe(cozyplane_probe::ProbeArgs),
    /// Print the version and exit.
    Version,
}

fn init_logging() {
    // RUST_LOG overrides; info by default. Logs go to stderr so stdout stays machine-readable.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Version => {
            println!("cozyplane {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Cmd::Apiserver(args) => {
            init_logging();
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(cozyplane_apiserver::run(args))?;
            Ok(())
        }
        Cmd::Agent(args) => {
            init_logging();
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(cozyplane_agent::runtime::run(args))?;
            Ok(())
        }
        // The lab's errors say what to do; print them, not a backtrace.
        Cmd::Lab(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            if let Err(e) = rt.block_on(cozyplane_lab::cluster::run(args)) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
        // A failed check is an expected outcome of these two, not a crash: one line
        // on stderr and exit 1 (no anyhow backtrace, even under RUST_BACKTRACE).
        Cmd::Connectivity(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            if let Err(e) = rt.block_on(cozyplane_connectivity::run(args)) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Probe(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            if let Err(e) = rt.block_on(cozyplane_probe::run(args)) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Controller(args) => {
            init_logging();
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(cozyplane_controller::run(args))?;
            Ok(())
        }
    }
}
