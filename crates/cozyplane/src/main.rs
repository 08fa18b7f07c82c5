//! The `cozyplane` command.
use clap::Parser;

#[derive(Parser)]
#[command(name = "cozyplane", version, about = "Multi-tenant eBPF CNI for Kubernetes")]
enum Cmd {}

fn main() -> anyhow::Result<()> {
    let cmd = Cmd::parse();
    match cmd {}
}
