//! `cozyplane probe client`: runs every check of a plan at once and reports.
//!
//! Checks retry until they succeed or their timeout passes, because a probe pod often
//! starts before the datapath has programmed every path to it (a fresh pod, a fresh node):
//! the first refused connection is not a verdict. A wrong answer is retried too, and stays
//! a failure if it persists: a misdelivered packet must never count as a PASS.
//!
//! A blocked check (`expectBlocked`) is the mirror image: it keeps trying for its whole
//! timeout, because a path that is not programmed *yet* must not pass for an isolated
//! one, and fails on the first answer. "Answer" means the target was reached: a TCP
//! connection was established (even if it then closed or reset), an HTTP response or a
//! UDP datagram, an ICMP echo reply or an SCTP INIT ACK came back. No reply, a refused
//! connection, an SCTP ABORT and an ICMP error do not count. A probe that cannot send at
//! all (no raw ICMP or SCTP socket without CAP_NET_RAW) fails a blocked check at once: its silence would prove nothing.
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cozyplane_errors::Chain;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::plan::{truncate_chars, Check, Outcome, Plan, Proto, Report, MAX_ERROR_CHARS};

/// Longest single attempt: a black-holed SYN or datagram is retried after this.
const ATTEMPT_MAX: Duration = Duration::from_secs(2);
/// First pause between attempts; doubles up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// UDP: resend the datagram this often while waiting for an answer.
const UDP_RESEND: Duration = Duration::from_millis(300);
/// TCP: an answer longer than this is not a probe answer.
const TCP_MAX_ANSWER: usize = 256;
/// HTTP: largest response read.
const HTTP_MAX_RESPONSE: usize = 64 * 1024;
/// Kubernetes' default terminationMessagePath.
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// Why one attempt of a check failed; its text (with the cause) becomes the
/// outcome's error when the check runs out of time.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The target's name did not resolve.
    #[error("cannot resolve")]
    Resolve(#[source] io::Error),
    /// The target's name resolved to nothing.
    #[error("resolves to no address")]
    NoAddress,
    /// A socket operation failed (`connect`, `read`, `send`, …).
    #[error("{op}")]
    Socket {
        /// The operation.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A TCP answer longer than a probe's.
    #[error("answer longer than {TCP_MAX_ANSWER} bytes")]
    TooLong,
    /// The HTTP response is not a 200 with a readable body.
    #[error(transparent)]
    Http(#[from] HttpError),
}

/// An HTTP response the probe does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// No end of the header block.
    #[error("incomplete HTTP response")]
    Incomplete,
    /// The status line is not HTTP/1.x (the first characters).
    #[error("not an HTTP/1 response: {0:?}")]
    NotHttp1(String),
    /// The status is not 200 (the status line, shortened).
    #[error("HTTP status {0}")]
    Status(String),
    /// A chunked body ends early.
    #[error("truncated chunked body")]
    TruncatedChunk,
    /// A chunk size is not hexadecimal.
    #[error("bad chunk size")]
    BadChunkSize,
}

impl AttemptError {
    /// Whether the attempt got far enough to prove the target reachable: a TCP
    /// connection was established (a later read/write error, an over-long answer) or an
    /// HTTP response came back. Connect, send and receive errors (refused, unreachable,
    /// ICMP errors) and resolution failures do not.
    pub fn reached_target(&self) -> bool {
        match self {
            AttemptError::Socket { op, .. } => matches!(*op, "read" | "write"),
            AttemptError::TooLong | AttemptError::Http(_) => true,
            AttemptError::Resolve(_) | AttemptError::NoAddress => false,
        }
    }
}

impl AttemptError {
    /// Whether the probe itself cannot run the check (no ICMP socket without
    /// CAP_NET_RAW, a failed task): says nothing about the network, so a blocked check
    /// must not pass on it.
    pub fn cannot_probe(&self) -> bool {
        matches!(self, AttemptError::Socket { op, .. } if [ICMP_SOCKET, "icmp task", SCTP_SOCKET, "sctp task"].contains(op))
    }
}

/// The operation named when the raw ICMP socket cannot be opened.
const ICMP_SOCKET: &str = "icmp socket (needs CAP_NET_RAW)";
const SCTP_SOCKET: &str = "raw sctp socket (needs CAP_NET_RAW)";

fn socket(op: &'static str) -> impl FnOnce(io::Error) -> AttemptError {
    move |source| AttemptError::Socket { op, source }
}

/// Runs all checks concurrently; results come back in plan order.
pub async fn run_plan(plan: &Plan) -> Report {
    let results = join_all_spawned(plan.checks.iter().cloned().map(run_check)).await;
    Report { results }
}

/// Spawns every check (so they run in parallel on the runtime) and collects in order.
async fn join_all_spawned<F: std::future::Future<Output = Outcome> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<Outcome> {
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(match h.await {
            Ok(o) => o,
            // A panicking check must still produce a (failed) line, not lose the report.
            Err(e) => Outcome {
                id: String::new(),
                ok: false,
                ms: 0.0,
                answer: None,
                error: Some(truncate_chars(
                    &format!("check task failed: {e}"),
                    MAX_ERROR_CHARS,
                )),
            },
        });
    }
    out
}

/// Runs one check with retries until success or its timeout.
pub async fn run_check(check: Check) -> Outcome {
    if check.expect_blocked {
        return run_blocked(check).await;
    }
    let start = Instant::now();
    let deadline = start + Duration::from_millis(check.timeout_ms);
    let mut backoff = BACKOFF_START;
    let mut attempts = 0u32;
    let mut last_err = String::from("no attempt made");
    let mut last_answer = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let budget = (deadline - now).min(ATTEMPT_MAX);
        attempts += 1;
        let t0 = Instant::now();
        match tokio::time::timeout(budget, attempt(&check)).await {
            Ok(Ok(answer)) => match &check.expect {
                Some(want) if *want != answer => {
                    last_err = format!("answered {answer:?}, expected {want:?}");
                    last_answer = Some(answer);
                }
                _ => {
                    return Outcome {
                        id: check.id,
                        ok: true,
                        ms: millis(t0.elapsed()),
                        answer: Some(truncate_chars(&answer, crate::plan::MAX_ANSWER_CHARS)),
                        error: None,
                    }
                }
            },
            Ok(Err(e)) => last_err = Chain(&e).to_string(),
            Err(_) => last_err = format!("no answer within {} ms", budget.as_millis()),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    let spent = start.elapsed();
    Outcome {
        id: check.id,
        ok: false,
        ms: millis(spent),
        answer: last_answer.map(|a| truncate_chars(&a, crate::plan::MAX_ANSWER_CHARS)),
        error: Some(truncate_chars(
            &format!(
                "{} {}: {last_err} ({attempts} attempts in {} ms)",
                check.proto,
                check.target,
                spent.as_millis()
            ),
            MAX_ERROR_CHARS,
        )),
    }
}

/// Runs a blocked check: tries until its timeout, fails on the first answer.
async fn run_blocked(check: Check) -> Outcome {
    let start = Instant::now();
    let deadline = start + Duration::from_millis(check.timeout_ms);
    let mut backoff = BACKOFF_START;
    let mut attempts = 0u32;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let budget = (deadline - now).min(ATTEMPT_MAX);
        attempts += 1;
        let reached = match tokio::time::timeout(budget, attempt(&check)).await {
            Ok(Ok(answer)) => Some((Some(answer), "answered".to_string())),
            Ok(Err(e)) if e.reached_target() => Some((None, Chain(&e).to_string())),
            // Silence from a probe that cannot send is no proof of isolation.
            Ok(Err(e)) if e.cannot_probe() => {
                return Outcome {
                    id: check.id,
                    ok: false,
                    ms: millis(start.elapsed()),
                    answer: None,
                    error: Some(truncate_chars(
                        &format!(
                            "{} {}: cannot probe, so silence proves nothing: {}",
                            check.proto,
                            check.target,
                            Chain(&e)
                        ),
                        MAX_ERROR_CHARS,
                    )),
                };
            }
            Ok(Err(_)) | Err(_) => None,
        };
        if let Some((answer, how)) = reached {
            let how = match &answer {
                Some(a) => format!("answered {a:?}"),
                None => format!("connected, then {how}"),
            };
            return Outcome {
                id: check.id,
                ok: false,
                ms: millis(start.elapsed()),
                answer: answer.map(|a| truncate_chars(&a, crate::plan::MAX_ANSWER_CHARS)),
                error: Some(truncate_chars(
                    &format!(
                        "{} {}: expected no answer (blocked), but {how} (attempt {attempts})",
                        check.proto, check.target
                    ),
                    MAX_ERROR_CHARS,
                )),
            };
        }
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(backoff.min(left)).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    Outcome {
        id: check.id,
        ok: true,
        ms: millis(start.elapsed()),
        answer: None,
        error: None,
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One exchange; the answer is the trimmed text.
async fn attempt(check: &Check) -> Result<String, AttemptError> {
    let addr = resolve(&check.target).await?;
    match check.proto {
        Proto::Tcp => tcp(addr).await,
        Proto::Udp => udp(addr).await,
        Proto::Http => http(addr, &check.target, "/").await,
        Proto::Peer => http(addr, &check.target, "/peer").await,
        Proto::Icmp => icmp(addr.ip()).await,
        Proto::Sctp => sctp(addr).await,
    }
}

/// One SCTP INIT → INIT ACK exchange with `addr` on a raw socket connected to its
/// address, in a blocking task ([`crate::sctp`]); the answer is the INIT ACK's State
/// Cookie. Only an INIT ACK from the target's port to this attempt's port with this
/// attempt's tag counts; the INIT is resent every [`UDP_RESEND`] until [`ATTEMPT_MAX`].
async fn sctp(addr: SocketAddr) -> Result<String, AttemptError> {
    tokio::task::spawn_blocking(move || sctp_blocking(addr))
        .await
        .map_err(|e| AttemptError::Socket {
            op: "sctp task",
            source: io::Error::other(e),
        })?
}

fn sctp_blocking(addr: SocketAddr) -> Result<String, AttemptError> {
    use crate::sctp::{payload, random_u32, raw_socket, Chunk, Packet};
    use socket2::SockAddr;
    use std::io::Read;
    let ip = addr.ip();
    let s = raw_socket(ip).map_err(socket(SCTP_SOCKET))?;
    s.connect(&SockAddr::from(SocketAddr::new(ip, 0)))
        .map_err(socket("sctp connect"))?;
    let tag = random_u32();
    // the kernel allocates no port to a raw socket: an ephemeral one of its own
    let port = 49_152 + u16::try_from(random_u32() % 16_384).unwrap_or(0);
    let init = Packet {
        src_port: port,
        dst_port: addr.port(),
        vtag: 0,
        chunk: Chunk::Init { tag },
    }
    .encode();
    let deadline = Instant::now() + ATTEMPT_MAX;
    let mut buf = [0u8; 2048];
    loop {
        s.send(&init).map_err(socket("sctp send"))?;
        let resend = Instant::now() + UDP_RESEND;
        loop {
            let until = resend.min(deadline);
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s.set_read_timeout(Some(left))
                .map_err(socket("sctp recv"))?;
            let n = match (&s).read(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break
                }
                Err(e) => return Err(socket("sctp recv")(e)),
            };
            let Some(p) = buf
                .get(..n)
                .and_then(|d| payload(ip, d))
                .and_then(Packet::decode)
            else {
                continue;
            };
            if p.src_port != addr.port() || p.dst_port != port || p.vtag != tag {
                continue;
            }
            if let Chunk::InitAck { cookie, .. } = p.chunk {
                return Ok(String::from_utf8_lossy(&cookie).trim().to_string());
            }
        }
        if Instant::now() >= deadline {
            return Err(AttemptError::Socket {
                op: "sctp recv",
                source: io::ErrorKind::TimedOut.into(),
            });
        }
    }
}

/// One ICMP echo exchange on a raw socket connected to `ip` (so only its packets are
/// read), in a blocking task; the reply must carry this request's identifier and
/// sequence. ICMP errors and other echoes are skipped until [`ATTEMPT_MAX`].
async fn icmp(ip: IpAddr) -> Result<String, AttemptError> {
    tokio::task::spawn_blocking(move || icmp_blocking(ip))
        .await
        .map_err(|e| AttemptError::Socket {
            op: "icmp task",
            source: io::Error::other(e),
        })?
}

fn icmp_blocking(ip: IpAddr) -> Result<String, AttemptError> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    use std::io::Read;
    use std::sync::atomic::{AtomicU16, Ordering};
    static SEQ: AtomicU16 = AtomicU16::new(1);
    let (domain, proto, request, reply) = match ip {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8, 0u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128u8, 129u8),
    };
    let s = Socket::new(domain, Type::from(libc::SOCK_RAW), Some(proto))
        .map_err(socket(ICMP_SOCKET))?;
    let target = SockAddr::from(SocketAddr::new(ip, 0));
    s.connect(&target).map_err(socket("icmp connect"))?;
    let id = (std::process::id() as u16).rotate_left(3);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut pkt = vec![request, 0, 0, 0];
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    pkt.extend_from_slice(b"cozyplane-probe");
    if ip.is_ipv4() {
        // ICMPv6's checksum covers a pseudo-header: the kernel fills it for raw sockets.
        let c = icmp_checksum(&pkt);
        pkt[2..4].copy_from_slice(&c.to_be_bytes());
    }
    s.send(&pkt).map_err(socket("icmp send"))?;
    let deadline = Instant::now() + ATTEMPT_MAX;
    let mut buf = [0u8; 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AttemptError::Socket {
                op: "icmp recv",
                source: io::ErrorKind::TimedOut.into(),
            });
        }
        s.set_read_timeout(Some(left))
            .map_err(socket("icmp recv"))?;
        let n = (&s).read(&mut buf).map_err(socket("icmp recv"))?;
        // A raw ICMPv4 socket reads the IP header too; ICMPv6 does not.
        let at = if ip.is_ipv4() {
            usize::from(buf[0] & 0x0f) * 4
        } else {
            0
        };
        let Some(m) = buf.get(at..n) else { continue };
        if m.len() >= 8
            && m[0] == reply
            && m[4..6] == id.to_be_bytes()
            && m[6..8] == seq.to_be_bytes()
        {
            return Ok(format!("echo reply from {ip}"));
        }
    }
}

/// The Internet checksum of `data`.
fn icmp_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]);
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

async fn resolve(target: &str) -> Result<SocketAddr, AttemptError> {
    if let Ok(a) = target.parse() {
        return Ok(a);
    }
    let mut addrs = tokio::net::lookup_host(target)
        .await
        .map_err(AttemptError::Resolve)?;
    addrs.next().ok_or(AttemptError::NoAddress)
}

async fn tcp(addr: SocketAddr) -> Result<String, AttemptError> {
    let mut s = TcpStream::connect(addr).await.map_err(socket("connect"))?;
    let mut buf = Vec::new();
    (&mut s)
        .take(TCP_MAX_ANSWER as u64 + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(socket("read"))?;
    if buf.len() > TCP_MAX_ANSWER {
        return Err(AttemptError::TooLong);
    }
    Ok(String::from_utf8_lossy(&buf).trim().to_string())
}

async fn udp(addr: SocketAddr) -> Result<String, AttemptError> {
    let local: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let s = UdpSocket::bind(local).await.map_err(socket("bind"))?;
    // Connected, so only the target's answer is accepted and ICMP errors are reported.
    s.connect(addr).await.map_err(socket("connect"))?;
    let mut buf = [0u8; 512];
    loop {
        s.send(b"probe").await.map_err(socket("send"))?;
        match tokio::time::timeout(UDP_RESEND, s.recv(&mut buf)).await {
            Ok(Ok(n)) => return Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string()),
            Ok(Err(e)) => return Err(socket("recv")(e)),
            Err(_) => continue,
        }
    }
}

async fn http(addr: SocketAddr, host: &str, path: &str) -> Result<String, AttemptError> {
    let mut s = TcpStream::connect(addr).await.map_err(socket("connect"))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: cozyplane-probe\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.map_err(socket("write"))?;
    let mut buf = Vec::new();
    (&mut s)
        .take(HTTP_MAX_RESPONSE as u64)
        .read_to_end(&mut buf)
        .await
        .map_err(socket("read"))?;
    Ok(parse_http_response(&buf)?)
}

/// Status must be 200; the answer is the trimmed body (de-chunked if needed).
fn parse_http_response(raw: &[u8]) -> Result<String, HttpError> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(HttpError::Incomplete)?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or_default(), parts.next());
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::NotHttp1(truncate_chars(status_line, 40)));
    }
    if code != Some("200") {
        return Err(HttpError::Status(truncate_chars(status_line, 60)));
    }
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.to_ascii_lowercase().contains("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok(String::from_utf8_lossy(&body).trim().to_string())
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, HttpError> {
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(HttpError::TruncatedChunk)?;
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| HttpError::BadChunkSize)?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size {
            return Err(HttpError::TruncatedChunk);
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

/// Where the report file goes: `$COZYPLANE_TERMINATION_LOG` (the lab kubelet sets it),
/// else `/dev/termination-log` if it exists (Kubernetes mounts it), else nowhere.
pub fn termination_log_path(env_value: Option<&str>) -> Option<PathBuf> {
    match env_value.filter(|v| !v.is_empty()) {
        Some(v) => Some(PathBuf::from(v)),
        None => {
            let p = Path::new(DEFAULT_TERMINATION_LOG);
            p.exists().then(|| p.to_path_buf())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_response_parsing() {
        assert_eq!(
            parse_http_response(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\necho-a\n"),
            Ok("echo-a".to_string())
        );
        assert_eq!(
            parse_http_response(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\necho\r\n3;x=y\r\n-b\n\r\n0\r\n\r\n"
            ),
            Ok("echo-b".to_string())
        );
        let e = parse_http_response(b"HTTP/1.1 503 Service Unavailable\r\n\r\nx").expect_err("503");
        assert!(e.to_string().contains("503"), "{e}");
        assert!(parse_http_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_http_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_http_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nab"
        )
        .is_err());
    }

    #[test]
    fn an_attempt_error_reads_as_before_with_its_cause_once() {
        let e = AttemptError::Socket {
            op: "connect",
            source: io::Error::from_raw_os_error(111),
        };
        assert_eq!(e.to_string(), "connect");
        assert_eq!(
            Chain(&e).to_string(),
            "connect: Connection refused (os error 111)"
        );
        let e = AttemptError::from(HttpError::Status("HTTP/1.1 503".into()));
        assert_eq!(Chain(&e).to_string(), "HTTP status HTTP/1.1 503");
    }

    #[test]
    fn termination_log_prefers_the_env() {
        assert_eq!(
            termination_log_path(Some("/tmp/x.log")),
            Some(PathBuf::from("/tmp/x.log"))
        );
        let fallback = termination_log_path(Some(""));
        assert_eq!(
            fallback.is_some(),
            Path::new(DEFAULT_TERMINATION_LOG).exists()
        );
        assert_eq!(termination_log_path(None), fallback);
    }
}
