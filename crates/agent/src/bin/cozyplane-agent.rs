//! `cozyplane-agent`: the node agent as a standalone process, for the lab
//! and the integration tests until the `cozyplane` binary wires
//! [`cozyplane_agent::runtime::run`] as `cozyplane agent`.

use clap::Parser;
use cozyplane_agent::runtime::{run, AgentArgs};

#[derive(Parser)]
#[command(name = "cozyplane-agent", about = "The cozyplane node agent")]
struct Cli {
    #[command(flatten)]
    agent: AgentArgs,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cozyplane-agent: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli.agent)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "agent stopped");
            std::process::ExitCode::FAILURE
        }
    }
}
