//! TCP request/response benchmark (TCP_RR and TCP_CRR), with the semantics of the
//! `rrbench` tool of the peer baselines (`peer-baselines.md`, Appendix A), so our
//! figures compare with the published ones.
//!
//! * **RR**: one connection; the client writes `size` bytes, the server echoes them, in
//!   a loop for the measuring period after a warm-up. Each transaction is timed.
//! * **CRR**: per transaction the client connects, writes `size` bytes, reads the echo,
//!   then waits for the server's FIN and closes. The server closes first, so *it* holds
//!   TIME_WAIT and the client never runs out of ephemeral ports. Connect time and the
//!   whole connect + request + response time are recorded.
//!
//! Both ends set `TCP_NODELAY`. Times come from [`Instant`] (CLOCK_MONOTONIC).
//! The server and client run as subcommands of the bench binary inside the pod
//! namespaces (see `crate::measure`); this module is plain `std` and needs no
//! privilege, so its unit tests run over loopback.

use std::io::{self, BufWriter, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::stats::percentile_sorted;

/// Most samples kept (as `rrbench`): bounds memory on very fast paths.
const MAX_SAMPLES: usize = 4_000_000;
/// A transaction taking longer than this is a broken path, not a slow one.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// CRR gives up after this many failed connections.
const MAX_CONNECT_ERRORS: u64 = 1000;

/// Which benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Request/response on one connection.
    Rr,
    /// Connect, request, response, close, per transaction.
    Crr,
}

/// What the client is asked to do.
#[derive(Clone, Copy, Debug)]
pub struct ClientSpec {
    /// RR or CRR.
    pub mode: Mode,
    /// The server.
    pub server: SocketAddr,
    /// Measuring period.
    pub duration: Duration,
    /// Warm-up before measuring (transactions run but are not counted).
    pub warmup: Duration,
    /// Request and response size in bytes (≥ 1).
    pub size: usize,
}

/// Latency percentiles of one kind of sample, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

impl Latency {
    /// Percentiles of `samples` (nanoseconds; sorted in place). `None` if empty.
    pub fn of(samples: &mut [u64]) -> Option<Latency> {
        samples.sort_unstable();
        let us = |q: f64| percentile_sorted(samples, q).map(|ns| ns as f64 / 1e3);
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        Some(Latency {
            p50_us: us(0.50)?,
            p90_us: us(0.90)?,
            p99_us: us(0.99)?,
            mean_us: sum as f64 / samples.len() as f64 / 1e3,
            max_us: *samples.last()? as f64 / 1e3,
        })
    }
}

/// What the client measured: one JSON line on its stdout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RrReport {
    /// RR or CRR.
    pub mode: Mode,
    /// Transactions completed in the measuring period.
    pub n: u64,
    /// Failed transactions (CRR: failed connects or exchanges).
    pub errors: u64,
    /// Length of the measuring period as it ran.
    pub elapsed_s: f64,
    /// Transactions (RR) or connections (CRR) per second.
    pub rate_per_s: f64,
    /// RR: one request/response; CRR: connect + request + response.
    pub txn: Option<Latency>,
    /// CRR only: `connect()` alone.
    pub connect: Option<Latency>,
}

/// Runs the server: RR on `rr_port`, CRR on `crr_port`, both on all addresses, one
/// thread each, connections served one after another (as `rrbench srv`). Calls
/// `ready` once both sockets listen, then serves until the process is killed.
pub fn serve(rr_port: u16, crr_port: u16, size: usize, ready: impl FnOnce()) -> Result<()> {
    let size = size.max(1);
    let bind = |port: u16| {
        let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
        TcpListener::bind(addr).map_err(|e| BenchError::io(format!("bind {addr}"), e))
    };
    let (rr, crr) = (bind(rr_port)?, bind(crr_port)?);
    ready();
    let rr = std::thread::Builder::new()
        .name("rr".into())
        .spawn(move || accept_loop(rr, size, Some(IO_TIMEOUT), serve_rr))
        .map_err(|e| BenchError::io("spawn rr server thread", e))?;
    // No per-connection read timeout for CRR: one syscall per connection more than
    // rrbench's server, on the measured path.
    accept_loop(crr, size, None, serve_crr);
    // accept_loop only returns if the listener breaks; report it.
    let _ = rr.join();
    Err(BenchError::io(
        "serve",
        io::Error::other("listener stopped accepting"),
    ))
}

fn accept_loop(
    listener: TcpListener,
    size: usize,
    timeout: Option<Duration>,
    handle: fn(TcpStream, &mut [u8]),
) {
    let mut buf = vec![0u8; size];
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                if timeout.is_some() {
                    let _ = stream.set_read_timeout(timeout);
                }
                handle(stream, &mut buf);
            }
            // EINTR, ECONNABORTED, EMFILE…: keep serving, as rrbench does.
            Err(_) => continue,
        }
    }
}

fn serve_rr(mut stream: TcpStream, buf: &mut [u8]) {
    while stream.read_exact(buf).is_ok() {
        if stream.write_all(buf).is_err() {
            break;
        }
    }
}

fn serve_crr(mut stream: TcpStream, buf: &mut [u8]) {
    if stream.read_exact(buf).is_ok() {
        let _ = stream.write_all(buf);
    }
    // Dropping the stream closes it: the server sends the first FIN.
}

/// Runs the client and returns what it measured.
pub fn run_client(spec: &ClientSpec) -> Result<RrReport> {
    if spec.size == 0 {
        return Err(BenchError::Invalid(
            "request size must be at least 1".into(),
        ));
    }
    match spec.mode {
        Mode::Rr => client_rr(spec),
        Mode::Crr => client_crr(spec),
    }
}

/// Tracks the warm-up / measuring / done phases of a client loop.
struct Clock {
    measure_from: Instant,
    end: Instant,
    started: Option<Instant>,
}

impl Clock {
    fn new(spec: &ClientSpec) -> Clock {
        let now = Instant::now();
        let measure_from = now + spec.warmup;
        Clock {
            measure_from,
            end: measure_from + spec.duration,
            started: None,
        }
    }

    /// Called before each transaction with its start time: false once time is up.
    fn keep_going(&mut self, now: Instant) -> bool {
        if self.started.is_none() && now >= self.measure_from {
            self.started = Some(now);
        }
        now < self.end
    }

    fn measuring(&self) -> bool {
        self.started.is_some()
    }

    fn elapsed_s(&self) -> f64 {
        self.started
            .map(|s| s.elapsed().as_secs_f64())
            .unwrap_or(0.0)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn client_rr(spec: &ClientSpec) -> Result<RrReport> {
    let server = spec.server;
    let mut stream = TcpStream::connect_timeout(&server, IO_TIMEOUT)
        .map_err(|e| BenchError::io(format!("connect {server}"), e))?;
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| BenchError::io("socket options", e))?;
    let mut buf = vec![0u8; spec.size];
    let mut lat: Vec<u64> = Vec::with_capacity(1 << 16);
    let mut clock = Clock::new(spec);
    loop {
        let start = Instant::now();
        if !clock.keep_going(start) || lat.len() >= MAX_SAMPLES {
            break;
        }
        stream
            .write_all(&buf)
            .and_then(|()| stream.read_exact(&mut buf))
            .map_err(|e| BenchError::io(format!("request/response with {server}"), e))?;
        if clock.measuring() {
            lat.push(nanos(start.elapsed()));
        }
    }
    let elapsed_s = clock.elapsed_s();
    Ok(RrReport {
        mode: Mode::Rr,
        n: lat.len() as u64,
        errors: 0,
        elapsed_s,
        rate_per_s: rate(lat.len(), elapsed_s),
        txn: Latency::of(&mut lat),
        connect: None,
    })
}

fn client_crr(spec: &ClientSpec) -> Result<RrReport> {
    let server = spec.server;
    let mut buf = vec![0u8; spec.size];
    let mut txn: Vec<u64> = Vec::with_capacity(1 << 16);
    let mut conn: Vec<u64> = Vec::with_capacity(1 << 16);
    let mut errors = 0u64;
    let mut clock = Clock::new(spec);
    loop {
        let start = Instant::now();
        if !clock.keep_going(start) || txn.len() >= MAX_SAMPLES {
            break;
        }
        // A plain blocking connect(), as rrbench does: `connect_timeout` would add a
        // non-blocking connect, a poll and two fcntl calls to every measured connect.
        let mut stream = match TcpStream::connect(server) {
            Ok(s) => s,
            Err(e) => {
                errors += 1;
                if errors > MAX_CONNECT_ERRORS {
                    return Err(BenchError::io(format!("connect {server} (CRR)"), e));
                }
                continue;
            }
        };
        let connected = Instant::now();
        // No read timeout here (one more syscall per connection than rrbench): a path
        // that breaks mid-run is bounded by the orchestrator, which kills the client
        // after its nominal time plus a grace period.
        let exchanged = stream
            .set_nodelay(true)
            .and_then(|()| stream.write_all(&buf))
            .and_then(|()| stream.read_exact(&mut buf));
        let done = Instant::now();
        if exchanged.is_err() {
            errors += 1;
            continue;
        }
        // Wait for the server's FIN, so the server holds TIME_WAIT.
        let mut sink = [0u8; 16];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        drop(stream);
        if clock.measuring() {
            conn.push(nanos(connected - start));
            txn.push(nanos(done - start));
        }
    }
    let elapsed_s = clock.elapsed_s();
    Ok(RrReport {
        mode: Mode::Crr,
        n: txn.len() as u64,
        errors,
        elapsed_s,
        rate_per_s: rate(txn.len(), elapsed_s),
        txn: Latency::of(&mut txn),
        connect: Latency::of(&mut conn),
    })
}

fn rate(n: usize, elapsed_s: f64) -> f64 {
    if elapsed_s > 0.0 {
        n as f64 / elapsed_s
    } else {
        0.0
    }
}

/// Writes `report` as one JSON line (what the orchestrator parses).
pub fn print_report(report: &RrReport) -> Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    serde_json::to_writer(&mut out, report).map_err(BenchError::Json)?;
    writeln!(out)
        .and_then(|()| out.flush())
        .map_err(|e| BenchError::io("write report", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Starts a server on free loopback ports; returns (rr, crr) addresses.
    fn local_server() -> (SocketAddr, SocketAddr) {
        // Ask the kernel for two free ports, then release them for the server.
        let free = || {
            TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (rr, crr) = (free(), free());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || serve(rr, crr, 1, move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        (
            SocketAddr::from(([127, 0, 0, 1], rr)),
            SocketAddr::from(([127, 0, 0, 1], crr)),
        )
    }

    fn spec(mode: Mode, server: SocketAddr) -> ClientSpec {
        ClientSpec {
            mode,
            server,
            duration: Duration::from_millis(300),
            warmup: Duration::from_millis(50),
            size: 1,
        }
    }

    #[test]
    fn rr_counts_transactions_and_their_latency() {
        let (rr, _) = local_server();
        let r = run_client(&spec(Mode::Rr, rr)).unwrap();
        assert_eq!(r.mode, Mode::Rr);
        assert!(r.n > 0, "{r:?}");
        // Measuring starts with the first transaction after the warm-up, so the
        // period is the nominal one less at most one transaction.
        assert!((0.25..1.0).contains(&r.elapsed_s), "{r:?}");
        // The rate is the count over the measured period, not something else.
        assert!((r.rate_per_s - r.n as f64 / r.elapsed_s).abs() < 1e-6 * r.rate_per_s);
        let l = r.txn.unwrap();
        assert!(
            l.p50_us > 0.0 && l.p50_us <= l.p99_us && l.p99_us <= l.max_us,
            "{l:?}"
        );
        assert!(r.connect.is_none());
    }

    #[test]
    fn crr_opens_a_connection_per_transaction() {
        let (_, crr) = local_server();
        let r = run_client(&spec(Mode::Crr, crr)).unwrap();
        assert_eq!(r.mode, Mode::Crr);
        assert!(r.n > 0, "{r:?}");
        assert_eq!(r.errors, 0);
        let (c, t) = (r.connect.unwrap(), r.txn.unwrap());
        // connect() is part of the whole transaction, so it cannot be slower.
        assert!(c.p50_us <= t.p50_us, "{c:?} vs {t:?}");
    }

    #[test]
    fn a_dead_server_is_an_error_not_a_zero() {
        // A port nothing listens on (bound then released).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err =
            run_client(&spec(Mode::Rr, SocketAddr::from(([127, 0, 0, 1], port)))).unwrap_err();
        assert!(err.to_string().contains("connect"), "{err}");
        let bad = ClientSpec {
            size: 0,
            ..spec(Mode::Rr, SocketAddr::from(([127, 0, 0, 1], port)))
        };
        assert!(matches!(run_client(&bad), Err(BenchError::Invalid(_))));
    }

    #[test]
    fn reports_round_trip_through_json() {
        let mut samples = vec![3_000u64, 1_000, 2_000];
        let r = RrReport {
            mode: Mode::Crr,
            n: 3,
            errors: 1,
            elapsed_s: 1.5,
            rate_per_s: 2.0,
            txn: Latency::of(&mut samples),
            connect: None,
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.contains("\"mode\":\"crr\""), "{line}");
        let back: RrReport = serde_json::from_str(&line).unwrap();
        assert_eq!(back, r);
        let l = back.txn.unwrap();
        assert_eq!((l.p50_us, l.max_us, l.mean_us), (2.0, 3.0, 2.0));
    }
}
