//! Running the measurements inside the pods: iperf3 for throughput, the bench's own
//! RR/CRR client ([`crate::rr`]) for request/response, servers in the server pod.
//!
//! Every client runs as a child process inside the client pod's namespace (the lab's
//! `exec_in_async`, which enters the namespace between fork and exec) and is killed if
//! the bench is interrupted. Every server is started with the lab's `spawn_in`, which
//! records it, so the topology's teardown kills it even after a crash of the bench.
//!
//! With a CPU given ([`crate::runner::Pinning`]), a client or server runs under
//! `taskset -c <cpu>` (which execs it in place: same pid, so the lab's tracking holds),
//! so every variant's processes sit on the same CPUs; see `docs/benchmarks.md`,
//! "Method of (c) against (d)".

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cozyplane_errors::Chain;
use cozyplane_lab::{exec_in_async, wait_for_async, LabHost, Topology};
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::pods::{run_ok, tail, Pod};
use crate::rr::{Mode, RrReport};

/// iperf3 server port.
pub const IPERF_PORT: u16 = 5201;
/// RR server port (as in the peer baselines).
pub const RR_PORT: u16 = 7001;
/// CRR server port (as in the peer baselines).
pub const CRR_PORT: u16 = 7002;
/// Extra time a client gets beyond its nominal duration before it is killed.
const GRACE: Duration = Duration::from_secs(30);
/// How long servers may take to listen.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(10);

/// The servers of one topology; killed and reaped on drop (the topology's teardown
/// would kill them too, but reaping is ours).
pub struct Servers {
    children: Vec<Child>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `argv` run on `cpu` (under `taskset -c <cpu>`), or as it is.
pub fn pinned<'a>(cpu: Option<&'a str>, argv: &[&'a str]) -> Vec<&'a str> {
    let mut out = Vec::with_capacity(argv.len() + 3);
    if let Some(cpu) = cpu {
        out.extend(["taskset", "-c", cpu]);
    }
    out.extend_from_slice(argv);
    out
}

/// A [`Command`] for `argv` (non-empty) on `cpu`, see [`pinned`].
fn command(cpu: Option<&str>, argv: &[&str]) -> Command {
    let argv = pinned(cpu, argv);
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// Starts `iperf3 -s` and the RR/CRR server (`tool serve`) in `pod`, on CPU `cpu` if
/// given, and waits until all three ports listen.
pub async fn start_servers(
    topo: &Topology,
    pod: &Pod,
    tool: &Path,
    cpu: Option<usize>,
) -> Result<Servers> {
    let mut servers = Servers {
        children: Vec::with_capacity(2),
    };
    let quiet = |cmd: &mut Command| {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let cpu = cpu.map(|c| c.to_string());
    let cpu = cpu.as_deref();
    let mut iperf = command(cpu, &["iperf3", "-s", "-p", &IPERF_PORT.to_string()]);
    quiet(&mut iperf);
    servers.children.push(topo.spawn_in(pod, &mut iperf)?);
    let tool = tool.to_string_lossy();
    let mut rr = command(
        cpu,
        &[
            &tool,
            "serve",
            "--rr-port",
            &RR_PORT.to_string(),
            "--crr-port",
            &CRR_PORT.to_string(),
        ],
    );
    quiet(&mut rr);
    servers.children.push(topo.spawn_in(pod, &mut rr)?);

    // Poll until all three ports listen; a server that exits instead (bad binary,
    // port in use) fails the wait at once, naming itself.
    let ports = [IPERF_PORT, RR_PORT, CRR_PORT];
    let started = Instant::now();
    let mut interval = Duration::from_millis(5);
    loop {
        for c in &mut servers.children {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(BenchError::Command {
                    what: format!("server in {}", pod.name),
                    status: status.to_string(),
                    stderr: "exited before listening".into(),
                });
            }
        }
        let out = run_ok(pod, &["ss", "-Hltn"]).await?;
        if ports.iter().all(|p| listens_on(&out, *p)) {
            break;
        }
        if started.elapsed() > SERVER_START_TIMEOUT {
            return Err(BenchError::Command {
                what: format!("servers in {}", pod.name),
                status: format!("not listening after {SERVER_START_TIMEOUT:?}"),
                stderr: out,
            });
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(100));
    }
    Ok(servers)
}

/// True if `ss -Hltn` output shows a listener on `port`.
pub fn listens_on(ss: &str, port: u16) -> bool {
    let want = format!(":{port}");
    ss.lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .any(|local| local.ends_with(&want))
}

/// Waits until `from` reaches `to` with ping (ARP resolved, routes and programs in
/// place); returns how long that took.
pub async fn wait_reachable(from: &Pod, to: Ipv4Addr) -> Result<Duration> {
    let to = to.to_string();
    let what = format!("{} to reach {to}", from.name);
    let took = wait_for_async(&what, Duration::from_secs(10), || async {
        exec_in_async(from, &["ping", "-c1", "-W1", "-q", &to])
            .await
            .is_ok_and(|o| o.status.success())
    })
    .await?;
    Ok(took)
}

/// One iperf3 run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Receiver-side rate, Gbit/s.
    pub gbps: f64,
    /// Sender retransmits over the run.
    pub retransmits: u64,
}

/// Runs `iperf3 -c <server> -t <secs> -J [-P streams]` in `client`, on CPU `cpu` if
/// given.
pub async fn iperf(
    client: &Pod,
    server: Ipv4Addr,
    secs: u32,
    streams: u32,
    cpu: Option<usize>,
) -> Result<Throughput> {
    let (server, t, p, port, cpu) = (
        server.to_string(),
        secs.to_string(),
        streams.to_string(),
        IPERF_PORT.to_string(),
        cpu.map(|c| c.to_string()),
    );
    let argv = pinned(
        cpu.as_deref(),
        &[
            "iperf3", "-c", &server, "-p", &port, "-t", &t, "-P", &p, "-J",
        ],
    );
    let limit = Duration::from_secs(u64::from(secs)) + GRACE;
    let out = tokio::time::timeout(limit, exec_in_async(client, &argv))
        .await
        .map_err(|_| BenchError::Command {
            what: argv.join(" "),
            status: format!("no result after {limit:?}"),
            stderr: String::new(),
        })??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let parsed = parse_iperf(&stdout);
    if !out.status.success() {
        let reason = match &parsed {
            Err(BenchError::Command { stderr, .. }) => stderr.clone(),
            _ => tail(&String::from_utf8_lossy(&out.stderr), 400),
        };
        return Err(BenchError::Command {
            what: argv.join(" "),
            status: out.status.to_string(),
            stderr: reason,
        });
    }
    parsed
}

/// Extracts the receiver rate and sender retransmits from `iperf3 -J` output.
pub fn parse_iperf(json: &str) -> Result<Throughput> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        return Err(BenchError::Command {
            what: "iperf3".into(),
            status: "error".into(),
            stderr: err.to_string(),
        });
    }
    let bad = |reason: &str| BenchError::Output {
        what: "iperf3 -J".into(),
        reason: reason.into(),
    };
    let end = v.get("end").ok_or_else(|| bad("no \"end\" section"))?;
    let bps = end
        .pointer("/sum_received/bits_per_second")
        .and_then(|b| b.as_f64())
        .ok_or_else(|| bad("no end.sum_received.bits_per_second"))?;
    let retransmits = end
        .pointer("/sum_sent/retransmits")
        .and_then(|r| r.as_u64())
        .unwrap_or(0);
    Ok(Throughput {
        gbps: bps / 1e9,
        retransmits,
    })
}

/// Runs the bench's RR/CRR client (`tool client …`) in `client` against `server`, on
/// CPU `cpu` if given.
pub async fn request_response(
    client: &Pod,
    tool: &Path,
    mode: Mode,
    server: Ipv4Addr,
    secs: f64,
    warmup: f64,
    cpu: Option<usize>,
) -> Result<RrReport> {
    let port = match mode {
        Mode::Rr => RR_PORT,
        Mode::Crr => CRR_PORT,
    };
    let tool = tool.to_string_lossy();
    let cpu = cpu.map(|c| c.to_string());
    let (mode_s, addr, s, w) = (
        match mode {
            Mode::Rr => "rr",
            Mode::Crr => "crr",
        },
        SocketAddr::from((server, port)).to_string(),
        secs.to_string(),
        warmup.to_string(),
    );
    let argv = pinned(
        cpu.as_deref(),
        &[
            tool.as_ref(),
            "client",
            "--mode",
            mode_s,
            "--server",
            &addr,
            "--seconds",
            &s,
            "--warmup",
            &w,
        ],
    );
    let limit = Duration::from_secs_f64(secs + warmup) + GRACE;
    let out = tokio::time::timeout(limit, run_ok(client, &argv))
        .await
        .map_err(|_| BenchError::Command {
            what: argv.join(" "),
            status: format!("no result after {limit:?}"),
            stderr: String::new(),
        })??;
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| BenchError::Output {
        what: format!("{mode_s} client in {}", client.name()),
        reason: format!("{}: {}", Chain(&e), tail(&out, 200)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rate_and_retransmits_from_iperf_json() {
        let json = r#"{"start":{},"intervals":[],"end":{
            "sum_sent":{"bits_per_second":2.1e10,"retransmits":17},
            "sum_received":{"bits_per_second":2.0e10}}}"#;
        let t = parse_iperf(json).unwrap();
        assert_eq!(t.gbps, 20.0);
        assert_eq!(t.retransmits, 17);
    }

    #[test]
    fn iperf_errors_and_truncated_output_are_errors() {
        let err = parse_iperf(r#"{"start":{},"end":{},"error":"unable to connect to server"}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unable to connect"), "{err}");
        assert!(matches!(
            parse_iperf(r#"{"end":{"sum_sent":{}}}"#),
            Err(BenchError::Output { .. })
        ));
        assert!(parse_iperf("iperf3: error").is_err());
    }

    #[test]
    fn pinned_commands_run_under_taskset() {
        assert_eq!(pinned(None, &["iperf3", "-s"]), ["iperf3", "-s"]);
        assert_eq!(
            pinned(Some("1"), &["iperf3", "-s"]),
            ["taskset", "-c", "1", "iperf3", "-s"]
        );
        let cmd = command(Some("0"), &["tool", "serve"]);
        assert_eq!(cmd.get_program(), "taskset");
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(args, ["-c", "0", "tool", "serve"]);
    }

    #[test]
    fn finds_listeners_in_ss_output() {
        let ss = "LISTEN 0      4096         0.0.0.0:7001      0.0.0.0:*\n\
                  LISTEN 0      5                  *:5201            *:*\n";
        assert!(listens_on(ss, 7001));
        assert!(listens_on(ss, 5201));
        assert!(!listens_on(ss, 7002));
        assert!(!listens_on(ss, 700));
    }
}
