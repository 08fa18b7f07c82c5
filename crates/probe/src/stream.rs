//! `cozyplane probe stream`: one long-lived TCP stream, timed to the millisecond, for the
//! checks that are about *live* traffic being cut (a revoked VPCBinding, a deleted
//! peering half).
//!
//! The server side is the probe server's `--stream-port`: it greets a connection with
//! `NAME\n` and answers every line `L` with `NAME L\n`, for as long as the peer stays.
//! The client connects (retrying until `connectTimeoutMs`), checks the greeting, sends a
//! numbered line every `intervalMs` and expects its echo within `echoTimeoutMs`. Once the
//! stream is up it listens on `readyPort` (a TCP readiness probe on that port tells the
//! test "streaming"), and the first echo that does not come back ends the stream: the
//! *cut*. It then tries fresh connections (connect, greeting, one echo) every
//! `reconnectEveryMs` for `holdMs` (until the first success with `stopOnReconnect`), so
//! the test can tell "stays cut" from "comes back". Every time in the report is wall-clock
//! Unix milliseconds: the test compares them with the moment it deleted an object, on its
//! own clock (the lab shares one clock; a real cluster needs synchronised clocks).
//!
//! The report is one JSON line, also written to the termination log, and it always fits
//! its 4096 bytes: consecutive reconnect attempts with the same result are merged.
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::plan::{truncate_chars, MAX_ERROR_CHARS, MAX_REPORT_BYTES, MAX_TIMEOUT_MS};

/// Longest line the stream server or client reads.
const MAX_LINE: usize = 256;

/// What a stream client does (the `--spec` JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamSpec {
    /// `IP:PORT` of a probe server's stream port.
    pub target: String,
    /// The server's name (its greeting and the prefix of every echo).
    pub expect: String,
    /// Pause between two echoes.
    pub interval_ms: u64,
    /// How long one echo (or one reconnect attempt) may take.
    pub echo_timeout_ms: u64,
    /// How long to keep trying to bring the stream up.
    pub connect_timeout_ms: u64,
    /// How long the stream may run without being cut before the client gives up.
    pub max_stream_ms: u64,
    /// How long to keep trying fresh connections after the cut.
    pub hold_ms: u64,
    /// Pause between two reconnect attempts.
    pub reconnect_every_ms: u64,
    /// Stop at the first reconnect that works.
    #[serde(default)]
    pub stop_on_reconnect: bool,
    /// Listen on this port while the stream is up (for a readiness probe).
    #[serde(default)]
    pub ready_port: Option<u16>,
}

/// A spec the client cannot run.
#[derive(Debug, thiserror::Error)]
pub enum StreamSpecError {
    /// Not valid JSON for a spec.
    #[error("the stream spec is not valid JSON for {{\"target\",\"expect\",\"intervalMs\",\"echoTimeoutMs\",\"connectTimeoutMs\",\"maxStreamMs\",\"holdMs\",\"reconnectEveryMs\",\"stopOnReconnect\"?,\"readyPort\"?}}")]
    Json(#[from] serde_json::Error),
    /// A field out of range.
    #[error("stream spec: {0}")]
    Bad(String),
}

impl StreamSpec {
    /// Parses and validates a spec.
    pub fn parse(json: &str) -> Result<Self, StreamSpecError> {
        let s: StreamSpec = serde_json::from_str(json)?;
        s.validate()?;
        Ok(s)
    }

    /// Checks the ranges the client relies on.
    pub fn validate(&self) -> Result<(), StreamSpecError> {
        let bad = |m: String| Err(StreamSpecError::Bad(m));
        if self.target.parse::<SocketAddr>().is_err() {
            return bad(format!("target {:?} is not IP:PORT", self.target));
        }
        if self.expect.trim().is_empty() || self.expect.contains('\n') {
            return bad("expect must be a non-empty name on one line".into());
        }
        for (name, v) in [
            ("intervalMs", self.interval_ms),
            ("echoTimeoutMs", self.echo_timeout_ms),
            ("connectTimeoutMs", self.connect_timeout_ms),
            ("maxStreamMs", self.max_stream_ms),
            ("holdMs", self.hold_ms),
            ("reconnectEveryMs", self.reconnect_every_ms),
        ] {
            if v == 0 || v > MAX_TIMEOUT_MS {
                return bad(format!(
                    "{name} must be between 1 and {MAX_TIMEOUT_MS}, got {v}"
                ));
            }
        }
        if self.ready_port == Some(0) {
            return bad("readyPort must not be 0".into());
        }
        Ok(())
    }

    /// The spec as one compact JSON string (what goes into a pod's args).
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// Consecutive reconnect attempts with one result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRun {
    /// Whether they worked (connect, greeting and one echo).
    pub ok: bool,
    /// Start of the first attempt (Unix ms).
    pub from: u64,
    /// End of the last attempt (Unix ms).
    pub to: u64,
    /// How many attempts.
    pub count: u32,
    /// The first failed attempt's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a stream client saw; all times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamReport {
    /// When the stream came up (greeting and first echo done).
    pub connected_at: Option<u64>,
    /// Echoes that came back.
    pub echoes: u64,
    /// When the last echo came back.
    pub last_echo_at: Option<u64>,
    /// When the first echo that failed was given up on.
    pub cut_at: Option<u64>,
    /// Why it failed.
    pub cut_error: Option<String>,
    /// The reconnect attempts after the cut.
    pub reconnects: Vec<AttemptRun>,
    /// Why the run ended without a cut (never connected, never cut, a bad answer).
    pub error: Option<String>,
}

impl StreamReport {
    /// Parses a report line.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text.trim())
    }

    /// Records one reconnect attempt, merged into the last run when the result is the same.
    pub fn record(&mut self, ok: bool, from: u64, to: u64, error: Option<String>) {
        match self.reconnects.last_mut() {
            Some(last) if last.ok == ok => {
                last.to = to;
                last.count = last.count.saturating_add(1);
            }
            _ => self.reconnects.push(AttemptRun {
                ok,
                from,
                to,
                count: 1,
                error: error.map(|e| truncate_chars(&e, MAX_ERROR_CHARS)),
            }),
        }
    }

    /// One compact JSON line of at most [`MAX_REPORT_BYTES`] bytes: errors are dropped,
    /// then the middle runs, until it fits (the first and last runs are what matter).
    pub fn to_line(&self) -> Result<String, serde_json::Error> {
        let mut r = self.clone();
        let mut line = serde_json::to_string(&r)?;
        while line.len() > MAX_REPORT_BYTES {
            if let Some(run) = r.reconnects.iter_mut().rev().find(|x| x.error.is_some()) {
                run.error = None;
            } else if r.reconnects.len() > 2 {
                r.reconnects.remove(1);
            } else {
                r.cut_error = None;
                r.error = r.error.map(|e| truncate_chars(&e, 40));
                line = serde_json::to_string(&r)?;
                break;
            }
            line = serde_json::to_string(&r)?;
        }
        Ok(line)
    }
}

/// Wall-clock Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A stream connection: reader and writer.
struct Conn {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    seq: u64,
}

/// Reads one line (without its newline), at most [`MAX_LINE`] bytes.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(rd: &mut R) -> Result<String, String> {
    let mut buf = Vec::new();
    let mut limited = tokio::io::AsyncReadExt::take(&mut *rd, MAX_LINE as u64);
    let n = limited
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if n == 0 {
        return Err("closed by the peer".into());
    }
    if buf.last() != Some(&b'\n') {
        return Err("line too long or cut short".into());
    }
    buf.pop();
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

impl Conn {
    /// Connects and checks the greeting.
    async fn open(addr: SocketAddr, expect: &str) -> Result<Self, String> {
        let s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = s.set_nodelay(true);
        let (rd, wr) = s.into_split();
        let mut c = Conn {
            rd: BufReader::new(rd),
            wr,
            seq: 0,
        };
        let hello = read_line(&mut c.rd).await?;
        if hello != expect {
            return Err(format!("greeted by {hello:?}, not {expect:?}"));
        }
        Ok(c)
    }

    /// Sends the next number and checks its echo.
    async fn echo(&mut self, expect: &str) -> Result<(), String> {
        self.seq += 1;
        self.wr
            .write_all(format!("{}\n", self.seq).as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let got = read_line(&mut self.rd).await?;
        let want = format!("{expect} {}", self.seq);
        if got != want {
            return Err(format!("echo {got:?}, not {want:?}"));
        }
        Ok(())
    }
}

async fn timed<T>(
    ms: u64,
    what: &str,
    f: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(Duration::from_millis(ms), f).await {
        Ok(r) => r,
        Err(_) => Err(format!("{what}: no answer within {ms} ms")),
    }
}

/// One fresh connection: connect, greeting, one echo.
async fn attempt(addr: SocketAddr, spec: &StreamSpec) -> Result<Conn, String> {
    timed(spec.echo_timeout_ms, "connect", async {
        let mut c = Conn::open(addr, &spec.expect).await?;
        c.echo(&spec.expect).await?;
        Ok(c)
    })
    .await
}

/// Runs the stream as `spec` says (see the module docs); never fails: what went wrong is
/// in the report.
pub async fn run_stream(spec: &StreamSpec) -> StreamReport {
    let mut report = StreamReport::default();
    let Ok(addr) = spec.target.parse::<SocketAddr>() else {
        report.error = Some(format!("target {:?} is not IP:PORT", spec.target));
        return report;
    };
    // Up: retry until the connect timeout.
    let t0 = Instant::now();
    let mut conn = loop {
        match attempt(addr, spec).await {
            Ok(c) => break c,
            Err(e) if t0.elapsed() >= Duration::from_millis(spec.connect_timeout_ms) => {
                report.error = Some(truncate_chars(
                    &format!("never connected within {} ms: {e}", spec.connect_timeout_ms),
                    MAX_ERROR_CHARS,
                ));
                return report;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(spec.reconnect_every_ms)).await,
        }
    };
    let up = now_ms();
    report.connected_at = Some(up);
    report.echoes = 1;
    report.last_echo_at = Some(up);
    // "Streaming" for a readiness probe; it stays open until the process ends.
    let _ready = match spec.ready_port {
        Some(p) => match TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], p))).await {
            Ok(l) => Some(tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    drop(s);
                }
            })),
            Err(e) => {
                report.error = Some(format!("cannot listen on ready port {p}: {e}"));
                return report;
            }
        },
        None => None,
    };
    let streaming = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(spec.interval_ms)).await;
        match timed(spec.echo_timeout_ms, "echo", conn.echo(&spec.expect)).await {
            Ok(()) => {
                report.echoes += 1;
                report.last_echo_at = Some(now_ms());
            }
            Err(e) => {
                report.cut_at = Some(now_ms());
                report.cut_error = Some(truncate_chars(&e, MAX_ERROR_CHARS));
                break;
            }
        }
        if streaming.elapsed() >= Duration::from_millis(spec.max_stream_ms) {
            report.error = Some(format!("never cut within {} ms", spec.max_stream_ms));
            return report;
        }
    }
    drop(conn);
    // Held: does it come back?
    let held = Instant::now();
    while held.elapsed() < Duration::from_millis(spec.hold_ms) {
        let from = now_ms();
        let r = attempt(addr, spec).await;
        let ok = r.is_ok();
        report.record(ok, from, now_ms(), r.err());
        if ok && spec.stop_on_reconnect {
            break;
        }
        tokio::time::sleep(Duration::from_millis(spec.reconnect_every_ms)).await;
    }
    report
}

/// The server side: greet with `name`, then echo every line as `name LINE`.
pub async fn serve_stream(stream: TcpStream, name: &str) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    wr.write_all(format!("{name}\n").as_bytes()).await?;
    while let Ok(line) = read_line(&mut rd).await {
        wr.write_all(format!("{name} {line}\n").as_bytes()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> StreamSpec {
        StreamSpec {
            target: "10.250.0.3:8001".into(),
            expect: "t1/echo-b".into(),
            interval_ms: 50,
            echo_timeout_ms: 500,
            connect_timeout_ms: 60_000,
            max_stream_ms: 120_000,
            hold_ms: 8000,
            reconnect_every_ms: 200,
            stop_on_reconnect: false,
            ready_port: Some(8002),
        }
    }

    #[test]
    fn specs_round_trip_and_are_validated() {
        let s = spec();
        assert_eq!(
            StreamSpec::parse(&s.to_json().expect("json")).expect("parse"),
            s
        );
        let mut bad = spec();
        bad.target = "nowhere".into();
        assert!(StreamSpec::parse(&bad.to_json().expect("json")).is_err());
        let mut bad = spec();
        bad.interval_ms = 0;
        assert!(bad.validate().is_err());
        let mut bad = spec();
        bad.expect = "a\nb".into();
        assert!(bad.validate().is_err());
        let mut bad = spec();
        bad.ready_port = Some(0);
        assert!(bad.validate().is_err());
    }

    #[test]
    fn attempts_merge_by_result_and_the_line_always_fits() {
        let mut r = StreamReport::default();
        r.record(false, 1, 2, Some("connect: timed out".into()));
        r.record(false, 3, 4, Some("other".into()));
        r.record(true, 5, 6, None);
        assert_eq!(
            r.reconnects,
            vec![
                AttemptRun {
                    ok: false,
                    from: 1,
                    to: 4,
                    count: 2,
                    error: Some("connect: timed out".into())
                },
                AttemptRun {
                    ok: true,
                    from: 5,
                    to: 6,
                    count: 1,
                    error: None
                },
            ]
        );
        // Alternating results cannot merge: the line is still shrunk to fit.
        let mut big = StreamReport::default();
        for i in 0..500u64 {
            big.record(i % 2 == 0, i, i, Some("x".repeat(200)));
        }
        let line = big.to_line().expect("line");
        assert!(line.len() <= MAX_REPORT_BYTES, "{}", line.len());
        let back = StreamReport::parse(&line).expect("parse");
        assert_eq!(
            back.reconnects.first(),
            big.reconnects
                .first()
                .map(|r| AttemptRun {
                    error: None,
                    ..r.clone()
                })
                .as_ref()
        );
        assert_eq!(back.reconnects.last().map(|r| r.to), Some(499));
    }
}
