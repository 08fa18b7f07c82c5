//! The probe workload: `cozyplane probe server` answers TCP, UDP and HTTP with its pod
//! name; `cozyplane probe client` runs a plan of checks and reports one line of JSON.
//!
//! The connectivity test deploys both in pods, and the lab kubelet runs the server for any
//! pod whose command is not `cozyplane …`. The plan and report types ([`plan`]) are shared
//! with the connectivity test, so both ends use the same (de)serialisation.
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use cozyplane_errors::Chain;
use thiserror::Error;

pub mod client;
pub mod plan;
pub mod sctp;
pub mod server;
pub mod stream;

pub use plan::{Check, Outcome, Plan, PlanError, Proto, Report};

/// `cozyplane probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// What to run.
    #[command(subcommand)]
    pub cmd: ProbeCmd,
}

/// The `cozyplane probe` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ProbeCmd {
    /// Answer TCP, UDP and HTTP with this pod's name until SIGTERM/SIGINT.
    Server(ServerArgs),
    /// Run a plan of checks once, print a JSON report, exit 1 if any check failed.
    Client(ClientArgs),
    /// Hold one TCP stream to a server's stream port until it is cut, then try to
    /// reconnect for a while; print a JSON report of the times (exit 0 with a report).
    Stream(StreamArgs),
}

/// `cozyplane probe stream`.
#[derive(Debug, clap::Args)]
pub struct StreamArgs {
    /// The spec as JSON: {"target":"IP:PORT","expect":NAME,"intervalMs","echoTimeoutMs","connectTimeoutMs","maxStreamMs","holdMs","reconnectEveryMs","stopOnReconnect"?,"readyPort"?}.
    #[arg(long)]
    pub spec: String,
}

/// `cozyplane probe client`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("plan-source").required(true).args(["plan", "plan_file"])))]
pub struct ClientArgs {
    /// The plan as JSON: {"checks":[{"id","proto":"tcp|udp|http|peer|icmp|sctp","target":"IP:PORT","expect":NAME|null,"timeoutMs":N,"expectBlocked":true?}]} (expectBlocked: pass only if the target never answers).
    #[arg(long)]
    pub plan: Option<String>,
    /// Read the plan from this file instead.
    #[arg(long, value_name = "FILE")]
    pub plan_file: Option<PathBuf>,
}

/// `cozyplane probe server`.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// The name to answer with [default: $POD_NAME, else the hostname].
    #[arg(long, env = "POD_NAME")]
    pub name: Option<String>,
    /// TCP port: answers `NAME\n` and closes.
    #[arg(long, default_value_t = 8000)]
    pub tcp_port: u16,
    /// UDP port: answers every datagram with `NAME\n`.
    #[arg(long, default_value_t = 8000)]
    pub udp_port: u16,
    /// HTTP port: `GET` answers 200 with body `NAME\n` and header `X-Pod-Name`.
    #[arg(long, default_value_t = 8080)]
    pub http_port: u16,
    /// Stream port (off unless given): greets with `NAME\n`, then answers every line `L`
    /// with `NAME L\n` for as long as the client stays (`cozyplane probe stream`).
    #[arg(long)]
    pub stream_port: Option<u16>,
    /// One more port answered like the TCP and UDP ports, both protocols (off
    /// unless given): policy tests tell "port 80 allowed, 81 not" apart.
    #[arg(long)]
    pub extra_port: Option<u16>,
    /// Answer SCTP on this port (repeatable; off unless given): every INIT gets an
    /// INIT ACK whose State Cookie is the name, on a raw socket, so it works on kernels
    /// without SCTP ([`sctp`]). Needs CAP_NET_RAW; only `--bind`'s address family.
    #[arg(long = "sctp-port", value_name = "PORT")]
    pub sctp_ports: Vec<u16>,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
}

/// Probe errors.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// A server socket could not be bound.
    #[error("cannot bind the {what} socket on {addr} (is another process using the port? choose another with --{what}-port)")]
    Bind {
        /// tcp, udp or http.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The raw SCTP socket could not be opened (`--sctp-port`).
    #[error("cannot open the raw SCTP socket for --sctp-port (it needs CAP_NET_RAW)")]
    Sctp(#[source] std::io::Error),
    /// The signal handlers could not be installed.
    #[error("cannot install the SIGTERM/SIGINT handlers")]
    Signal(#[source] std::io::Error),
    /// No `--name`, no `$POD_NAME` and no readable hostname.
    #[error("no name to answer with: pass --name or set POD_NAME (reading the hostname failed)")]
    Hostname(#[source] std::io::Error),
    /// The plan file could not be read.
    #[error("cannot read the plan file {path}")]
    PlanFile {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The plan is invalid.
    #[error("invalid plan")]
    Plan(#[from] PlanError),
    /// The stream spec is invalid.
    #[error("invalid stream spec")]
    StreamSpec(#[from] stream::StreamSpecError),
    /// The report could not be serialised (never expected).
    #[error("cannot serialise the report")]
    Report(#[source] serde_json::Error),
    /// Some checks failed (the report says which): exit 1.
    #[error("{failed} of {total} checks failed")]
    ChecksFailed {
        /// Failed checks.
        failed: usize,
        /// All checks.
        total: usize,
    },
    /// A socket failed in a way the server cannot continue from.
    #[error("i/o error")]
    Io(#[source] std::io::Error),
}

/// Runs a `cozyplane probe` subcommand.
pub async fn run(args: ProbeArgs) -> Result<(), ProbeError> {
    match args.cmd {
        ProbeCmd::Server(a) => run_server(a).await,
        ProbeCmd::Client(a) => {
            let log = client::termination_log_path(
                std::env::var("COZYPLANE_TERMINATION_LOG").ok().as_deref(),
            );
            run_client(a, log.as_deref()).await
        }
        ProbeCmd::Stream(a) => {
            let log = client::termination_log_path(
                std::env::var("COZYPLANE_TERMINATION_LOG").ok().as_deref(),
            );
            run_stream_client(&a, log.as_deref()).await
        }
    }
}

/// Runs a stream client: its report on stdout (last line) and in `termination_log`.
pub async fn run_stream_client(
    a: &StreamArgs,
    termination_log: Option<&Path>,
) -> Result<(), ProbeError> {
    let spec = match stream::StreamSpec::parse(&a.spec) {
        Ok(s) => s,
        Err(e) => {
            if let Some(path) = termination_log {
                let _ = std::fs::write(path, format!("probe stream: {}", Chain(&e)));
            }
            return Err(e.into());
        }
    };
    let report = stream::run_stream(&spec).await;
    let line = report.to_line().map_err(ProbeError::Report)?;
    print_line(&line);
    if let Some(path) = termination_log {
        let _ = std::fs::write(path, &line);
    }
    Ok(())
}

/// Runs a client: report on stdout (last line) and in `termination_log` if given.
///
/// An unusable plan also ends up in the termination log (as plain text), so whoever
/// reads the pod's status sees why there is no report.
pub async fn run_client(a: ClientArgs, termination_log: Option<&Path>) -> Result<(), ProbeError> {
    let plan = match load_plan(&a) {
        Ok(p) => p,
        Err(e) => {
            if let Some(path) = termination_log {
                let _ = std::fs::write(path, format!("probe client: {}", Chain(&e)));
            }
            return Err(e);
        }
    };
    let report = client::run_plan(&plan).await;
    for (o, c) in report.results.iter().zip(&plan.checks) {
        let verdict = if o.ok { "PASS" } else { "FAIL" };
        let detail = o.error.as_deref().unwrap_or_default();
        eprintln!(
            "{verdict}  {:<34} {} {:>9.3} ms  {detail}",
            o.id, c.target, o.ms
        );
    }
    let line = report.to_line().map_err(ProbeError::Report)?;
    print_line(&line);
    if let Some(path) = termination_log {
        // The contract: errors writing the file are ignored (stdout has the report too).
        let _ = std::fs::write(path, &line);
    }
    let failed = report.failures().count();
    if failed > 0 {
        return Err(ProbeError::ChecksFailed {
            failed,
            total: report.results.len(),
        });
    }
    Ok(())
}

fn load_plan(a: &ClientArgs) -> Result<Plan, ProbeError> {
    let text = match (&a.plan, &a.plan_file) {
        (Some(json), _) => json.clone(),
        (None, Some(path)) => {
            std::fs::read_to_string(path).map_err(|source| ProbeError::PlanFile {
                path: path.clone(),
                source,
            })?
        }
        (None, None) => return Err(ProbeError::Plan(PlanError::Empty)),
    };
    Ok(Plan::parse(&text)?)
}

async fn run_server(a: ServerArgs) -> Result<(), ProbeError> {
    let name = match a.name.filter(|n| !n.trim().is_empty()) {
        Some(n) => n,
        None => server::hostname()?,
    };
    let cfg = server::ServerConfig {
        name,
        bind: a.bind,
        tcp_port: a.tcp_port,
        udp_port: a.udp_port,
        http_port: a.http_port,
    };
    // Handlers first: a SIGTERM right after `ready:` must still end in a clean exit 0.
    let shutdown = server::shutdown_signal().await?;
    let mut srv = server::Server::bind(&cfg).await?;
    if let Some(p) = a.stream_port {
        srv = srv.with_stream(a.bind, p).await?;
    }
    if let Some(p) = a.extra_port {
        srv = srv.with_extra(a.bind, p).await?;
    }
    if !a.sctp_ports.is_empty() {
        srv = srv.with_sctp(a.bind, a.sctp_ports.iter().copied().collect())?;
    }
    print_line(&srv.ready_line()?);
    srv.serve(shutdown).await
}

/// Prints one line on stdout, flushed; a closed stdout is not a reason to stop serving.
fn print_line(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: ProbeCmd,
    }

    fn parse(args: &[&str]) -> Result<ProbeCmd, clap::Error> {
        Cli::try_parse_from(std::iter::once("probe").chain(args.iter().copied())).map(|c| c.cmd)
    }

    #[test]
    fn server_defaults_follow_the_contract() {
        let ProbeCmd::Server(a) = parse(&["server", "--name", "echo-a"]).expect("parse") else {
            panic!("not server");
        };
        assert_eq!(a.name.as_deref(), Some("echo-a"));
        assert_eq!((a.tcp_port, a.udp_port, a.http_port), (8000, 8000, 8080));
        assert_eq!(a.bind.to_string(), "0.0.0.0");
        let ProbeCmd::Server(a) = parse(&[
            "server",
            "--tcp-port",
            "4250",
            "--udp-port",
            "4250",
            "--http-port",
            "4251",
        ])
        .expect("parse") else {
            panic!("not server");
        };
        assert_eq!((a.tcp_port, a.udp_port, a.http_port), (4250, 4250, 4251));
    }

    #[test]
    fn client_needs_exactly_one_plan_source() {
        assert!(parse(&["client"]).is_err());
        assert!(parse(&["client", "--plan", "{}", "--plan-file", "/x"]).is_err());
        let ProbeCmd::Client(a) = parse(&["client", "--plan-file", "/x"]).expect("parse") else {
            panic!("not client");
        };
        assert_eq!(a.plan_file.as_deref(), Some(Path::new("/x")));
    }
}
