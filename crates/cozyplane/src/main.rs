//! The `cozyplane` command: one binary, one subcommand per component.
use std::future::Future;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cozyplane_errors::Chain;
use tracing_subscriber::EnvFilter;

mod healthcheck;

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
    /// Policy tools: `explain` tells which policies decide a flow.
    Policy(cozyplane_agent::explain_cli::PolicyArgs),
    /// The probe workload the connectivity test and the lab kubelet run in pods.
    Probe(cozyplane_probe::ProbeArgs),
    /// Exec probe: GET a loopback health endpoint, exit 0 on a 2xx.
    Healthcheck(healthcheck::HealthcheckArgs),
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Version => {
            println!("cozyplane {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Cmd::Healthcheck(args) => match healthcheck::check(&args.url) {
            Ok(_) => ExitCode::SUCCESS,
            Err(why) => {
                eprintln!("error: {why}");
                ExitCode::FAILURE
            }
        },
        Cmd::Apiserver(args) => {
            init_logging();
            run(cozyplane_apiserver::run(args))
        }
        Cmd::Agent(args) => {
            init_logging();
            run(cozyplane_agent::runtime::run(args))
        }
        Cmd::Controller(args) => {
            init_logging();
            run(cozyplane_controller::run(args))
        }
        Cmd::Lab(args) => run(cozyplane_lab::cluster::run(args)),
        Cmd::Connectivity(args) => run(cozyplane_connectivity::run(args)),
        Cmd::Probe(args) => run(cozyplane_probe::run(args)),
        Cmd::Policy(args) => run(cozyplane_agent::explain_cli::run(args)),
    }
}

/// Runs a subcommand on a new tokio runtime. A failure (for the lab, the
/// connectivity test and the probe also an expected outcome, such as a failed
/// check) is one line on stderr, `error: <what failed>: <cause>: …` with each
/// cause once (`cozyplane_errors::Chain`), and exit code 1: no backtrace, even
/// under RUST_BACKTRACE.
fn run<E: std::error::Error>(command: impl Future<Output = Result<(), E>>) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => fail(format_args!(
            "cannot start the tokio runtime: {}",
            Chain(&e)
        )),
    };
    match rt.block_on(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(Chain(&e)),
    }
}

/// Prints `error: <message>` and exits 1 at once, without waiting for the
/// runtime's tasks to wind down.
fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1)
}
