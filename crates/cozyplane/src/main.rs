//! The `cozyplane` command: one binary, one subcommand per component.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cozyplane", version, about = "Multi-tenant eBPF CNI for Kubernetes")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the version and exit.
    Version,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Version => println!("cozyplane {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
