//! `cozyplane-bench`: the datapath benchmark (see the library docs), plus the RR/CRR
//! server and client it runs inside the pod namespaces.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use cozyplane_bench::report::{self, Context};
use cozyplane_bench::rr::{self, ClientSpec, Mode};
use cozyplane_bench::runner::{parse_metrics, parse_pinning, parse_variants, Pinning};
use cozyplane_bench::{BenchError, Config, Result, Variant};
use cozyplane_errors::Chain;

/// Datapath benchmark: (a) plain routing, (b) bridge + kernel VXLAN, (c) cozyplane eBPF,
/// (d) cozyplane eBPF with VPC pods, interleaved, on lab topologies. Needs root, iproute2
/// and iperf3.
#[derive(Parser, Debug)]
#[command(name = "cozyplane-bench", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Rounds; each builds every selected variant and measures each metric on all of
    /// them back to back, in a, b, c, d or d, c, b, a order alternately.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Seconds per iperf3 run and per RR/CRR measuring period.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// RR/CRR warm-up before measuring, seconds.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Variants to run: any of a (limit), b (peer), c (cozyplane), d (cozyplane with
    /// both pods in one VPC), e (c again, built after d: an A/A control of the method),
    /// f (c with the kernel's VXLAN device tunnel instead of tc).
    #[arg(long, default_value = "a,b,c,d")]
    only: String,
    /// Metrics to measure: any of tcp1, tcp4, rr, crr.
    #[arg(long, default_value = "tcp1,tcp4,rr,crr")]
    metrics: String,
    /// Also write the report into this file, between the datapath-bench markers
    /// (replacing the previous block; appended if the file has none).
    #[arg(long)]
    write: Option<PathBuf>,
    /// Underlay MTU of the lab topologies.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Topology name prefix (≤ 9 characters, [a-z][a-z0-9]*); default `cb<pid>`.
    #[arg(long)]
    prefix: Option<String>,
    /// CPUs of the measuring processes, CLIENT,SERVER (every client on the first,
    /// every server on the second, in every variant), or `none`; default 0,1 on a
    /// machine with two or more CPUs, else none.
    #[arg(long)]
    pin: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// RR and CRR server (run inside the server pod by the bench).
    Serve {
        /// RR port.
        #[arg(long, default_value_t = 7001)]
        rr_port: u16,
        /// CRR port.
        #[arg(long, default_value_t = 7002)]
        crr_port: u16,
        /// Request/response size, bytes.
        #[arg(long, default_value_t = 1)]
        size: usize,
    },
    /// RR or CRR client; prints one JSON line (run inside the client pod by the bench).
    Client {
        /// rr or crr.
        #[arg(long, value_enum)]
        mode: Mode,
        /// Server address, ip:port.
        #[arg(long)]
        server: SocketAddr,
        /// Measuring period, seconds.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Warm-up, seconds.
        #[arg(long, default_value_t = 1.0)]
        warmup: f64,
        /// Request/response size, bytes.
        #[arg(long, default_value_t = 1)]
        size: usize,
        /// Join this cgroup (v2 directory) before the first socket: the
        /// Services benchmark's clients, inside or outside the socket-LB.
        #[arg(long)]
        cgroup: Option<PathBuf>,
    },
    /// The Services benchmark (issue #11): connect to the last of N Services
    /// through our socket-LB vs direct vs kube-proxy's iptables shape, programming
    /// 10k Services from empty vs iptables-restore, and a backend change's
    /// compile + sync time, in one run. Needs root, iproute2 and iptables-legacy.
    Services(ServicesArgs),
}

#[derive(Args, Debug)]
struct ServicesArgs {
    /// Rounds of each measurement (variants alternate order by round).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// CRR measuring period, seconds.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// CRR warm-up, seconds.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Service counts of the connect measurement.
    #[arg(long, default_value = "1000,10000,100000", value_delimiter = ',')]
    sizes: Vec<u32>,
    /// Largest N at which the kube-proxy variant of the connect measurement runs.
    #[arg(long, default_value_t = 100_000)]
    iptables_max: u32,
    /// Services of the programming and change measurements.
    #[arg(long, default_value_t = 10_000)]
    program_services: u32,
    /// Backends per Service there.
    #[arg(long, default_value_t = 10)]
    program_backends: u32,
    /// Samples of the change measurement.
    #[arg(long, default_value_t = 200)]
    change_samples: u32,
    /// Parts to run: any of connect, program, change; or crossnode (cross-node
    /// ClusterIP CRR through the eBPF datapath) alone, or policy (cross-node
    /// RR/CRR with 100 NetworkPolicies vs none) alone: each has its own report block.
    #[arg(long, default_value = "connect,program,change")]
    parts: String,
    /// The iptables-restore of the kube-proxy shape.
    #[arg(long, default_value = "/usr/sbin/iptables-legacy-restore")]
    iptables_restore: PathBuf,
    /// Name prefix of namespaces, cgroups and mounts (≤ 9 characters); default `cs<pid>`.
    #[arg(long)]
    prefix: Option<String>,
    /// CPUs CLIENT,SERVER, or `none`; default 0,1 on two or more CPUs.
    #[arg(long)]
    pin: Option<String>,
    /// Also write the report into this file, between the services-bench markers.
    #[arg(long)]
    write: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.cmd {
        Some(Cmd::Serve {
            rr_port,
            crr_port,
            size,
        }) => rr::serve(rr_port, crr_port, size, || {}),
        Some(Cmd::Client {
            mode,
            server,
            seconds,
            warmup,
            size,
            cgroup,
        }) => client(mode, server, seconds, warmup, size, cgroup.as_deref()),
        Some(Cmd::Services(args)) => services(args),
        None => bench(cli.run),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(BenchError::Interrupted) => {
            eprintln!("cozyplane-bench: interrupted; everything it created was removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("cozyplane-bench: {}", Chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| BenchError::Invalid(format!("{what} {s}: want a non-negative number")))
}

fn client(
    mode: Mode,
    server: SocketAddr,
    seconds: f64,
    warmup: f64,
    size: usize,
    cgroup: Option<&std::path::Path>,
) -> Result<()> {
    if let Some(dir) = cgroup {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .map_err(|e| BenchError::io(format!("join {}", procs.display()), e))?;
    }
    let report = rr::run_client(&ClientSpec {
        mode,
        server,
        duration: secs(seconds, "--seconds")?,
        warmup: secs(warmup, "--warmup")?,
        size,
    })?;
    rr::print_report(&report)
}

/// The command line that produced the report (arguments with spaces quoted): the
/// `cargo run` form when started by cargo (which sets `CARGO_MANIFEST_DIR`), else the
/// binary as invoked.
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'') {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a
            }
        })
        .collect();
    let mut line = if std::env::var_os("CARGO_MANIFEST_DIR").is_some() {
        let profile = if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        };
        format!("cargo run{profile} -p cozyplane-bench --")
    } else {
        std::env::args()
            .next()
            .unwrap_or_else(|| "cozyplane-bench".into())
    };
    for a in args {
        line.push(' ');
        line.push_str(&a);
    }
    line
}

fn context() -> Context {
    let when = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Context {
        when,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        command: command_line(),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn services(args: ServicesArgs) -> Result<()> {
    use cozyplane_bench::services::{self, Machine, Parts, SvcConfig};
    if !nix::unistd::geteuid().is_root() {
        return Err(BenchError::Invalid(
            "needs root (network namespaces, cgroups, bpffs, BPF programs)".into(),
        ));
    }
    let prefix = args
        .prefix
        .unwrap_or_else(|| format!("cs{}", std::process::id() % 1_000_000));
    if prefix.len() > 9 || !prefix.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(BenchError::Invalid(format!(
            "--prefix {prefix:?}: want at most 9 letters and digits"
        )));
    }
    let pin = match &args.pin {
        Some(p) => parse_pinning(p)?,
        None => Pinning::default_for(std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let cfg = SvcConfig {
        rounds: args.rounds.max(1),
        seconds: args.seconds.max(1),
        warmup: args.warmup,
        sizes: args.sizes,
        iptables_max: args.iptables_max,
        program_services: args.program_services,
        program_backends: args.program_backends,
        change_samples: args.change_samples,
        parts: Parts::parse(&args.parts)?,
        tool: std::env::current_exe().map_err(|e| BenchError::io("locate own binary", e))?,
        iptables_restore: args.iptables_restore,
        prefix,
        pin,
    };
    let version = std::process::Command::new(&cfg.iptables_restore)
        .arg("--version")
        .output()
        .map(|o| {
            let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if out.is_empty() {
                String::from_utf8_lossy(&o.stderr).trim().to_string()
            } else {
                out
            }
        })
        .unwrap_or_else(|e| format!("{}: {e}", cfg.iptables_restore.display()));
    let ctx = context();
    let load_before = load_average();
    let result = services::run(&cfg, |line| eprintln!("cozyplane-bench: {line}"))?;
    let machine = Machine {
        when: ctx.when,
        kernel: ctx.kernel,
        cpus: ctx.cpus,
        load_before,
        load_after: load_average(),
        command: ctx.command,
        iptables: version,
    };
    let block = services::render(&cfg, &result, &machine);
    println!("{block}");
    if let Some(path) = &args.write {
        let (begin, end) = cfg.parts.markers();
        report::write_block_between(path, &block, begin, end)?;
        eprintln!("cozyplane-bench: wrote the report into {}", path.display());
    }
    Ok(())
}

fn bench(args: RunArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(BenchError::Invalid(
            "needs root (network namespaces, bpffs, BPF programs)".into(),
        ));
    }
    let tool = std::env::current_exe().map_err(|e| BenchError::io("locate own binary", e))?;
    let pin = match &args.pin {
        Some(p) => parse_pinning(p)?,
        None => Pinning::default_for(std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let cfg = Config {
        rounds: args.rounds,
        seconds: args.seconds,
        warmup: args.warmup,
        variants: parse_variants(&args.only)?,
        metrics: parse_metrics(&args.metrics)?,
        tool,
        prefix: args
            .prefix
            .unwrap_or_else(|| format!("cb{}", std::process::id() % 1_000_000)),
        underlay_mtu: args.mtu,
        pin,
    };
    cfg.validate()?;
    let ctx = context();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("start the async runtime", e))?;
    let result = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| BenchError::io("install SIGTERM handler", e))?;
        // Dropping the run future on a signal drops the live topology, whose guard tears
        // it down; the kill-on-drop clients die with it.
        tokio::select! {
            r = cozyplane_bench::run(&cfg, |line| eprintln!("cozyplane-bench: {line}")) => r,
            _ = tokio::signal::ctrl_c() => Err(BenchError::Interrupted),
            _ = term.recv() => Err(BenchError::Interrupted),
        }
    });
    if matches!(result, Err(BenchError::Interrupted)) {
        // Belt and braces: the drop guard ran, but make sure nothing is left.
        for v in Variant::ALL {
            if let Err(e) = cozyplane_lab::destroy_by_prefix(&cfg.topology_name(v)) {
                eprintln!(
                    "cozyplane-bench: teardown of {}: {}",
                    cfg.topology_name(v),
                    Chain(&e)
                );
            }
        }
    }
    let result = result?;
    let block = report::render(&cfg, &result, &ctx);
    println!("{block}");
    if let Some(path) = &args.write {
        report::write_block(path, &block)?;
        eprintln!("cozyplane-bench: wrote the report into {}", path.display());
    }
    Ok(())
}
