//! `cozyplane probe server`: answers TCP, UDP and HTTP (and, when asked, SCTP) with
//! one name.
//!
//! The answer is the pod's name so that a check can tell *which* pod answered: a
//! misdelivered packet (wrong pod, stale IP, NAT to the wrong backend) shows up as a
//! wrong answer instead of a false PASS. Each protocol is as small as it can be so the
//! server works with any client (`nc`, `curl`) and needs no configuration.
use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinSet;

use crate::ProbeError;

/// How long an HTTP client may take to send its request head before we give up on it.
const HTTP_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request head we read; the probe only needs the request line.
const HTTP_MAX_HEAD: usize = 8 * 1024;

/// Where and as whom the server listens.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The name every protocol answers with.
    pub name: String,
    /// Address all three sockets bind to.
    pub bind: IpAddr,
    /// TCP port (0 = any free port, for tests).
    pub tcp_port: u16,
    /// UDP port (0 = any).
    pub udp_port: u16,
    /// HTTP port (0 = any).
    pub http_port: u16,
}

/// A server whose sockets are all bound: binding is done before anything is announced,
/// so the `ready:` line is only printed when every port answers.
#[derive(Debug)]
pub struct Server {
    name: String,
    tcp: TcpListener,
    udp: UdpSocket,
    http: TcpListener,
    /// The optional stream port (`--stream-port`, [`crate::stream`]).
    stream: Option<TcpListener>,
    /// The optional extra TCP and UDP port (`--extra-port`).
    extra: Option<(TcpListener, UdpSocket)>,
    /// The optional SCTP responder (`--sctp-port`).
    sctp: Option<crate::sctp::Responder>,
}

impl Server {
    /// Binds the three sockets; fails with the address that could not be bound.
    pub async fn bind(cfg: &ServerConfig) -> Result<Self, ProbeError> {
        let bind_err = |what: &'static str, addr: SocketAddr| {
            move |source| ProbeError::Bind { what, addr, source }
        };
        let tcp_addr = SocketAddr::new(cfg.bind, cfg.tcp_port);
        let udp_addr = SocketAddr::new(cfg.bind, cfg.udp_port);
        let http_addr = SocketAddr::new(cfg.bind, cfg.http_port);
        let tcp = TcpListener::bind(tcp_addr)
            .await
            .map_err(bind_err("tcp", tcp_addr))?;
        let udp = UdpSocket::bind(udp_addr)
            .await
            .map_err(bind_err("udp", udp_addr))?;
        let http = TcpListener::bind(http_addr)
            .await
            .map_err(bind_err("http", http_addr))?;
        Ok(Self {
            name: cfg.name.clone(),
            tcp,
            udp,
            http,
            stream: None,
            extra: None,
            sctp: None,
        })
    }

    /// Also serves the stream protocol ([`crate::stream::serve_stream`]) on `port` of
    /// `bind` (0 = any free port).
    pub async fn with_stream(mut self, bind: IpAddr, port: u16) -> Result<Self, ProbeError> {
        let addr = SocketAddr::new(bind, port);
        let l = TcpListener::bind(addr)
            .await
            .map_err(|source| ProbeError::Bind {
                what: "stream",
                addr,
                source,
            })?;
        self.stream = Some(l);
        Ok(self)
    }

    /// Also answers TCP and UDP on `port` of `bind`, like the main ports.
    pub async fn with_extra(mut self, bind: IpAddr, port: u16) -> Result<Self, ProbeError> {
        let addr = SocketAddr::new(bind, port);
        let bind_err = |what: &'static str| move |source| ProbeError::Bind { what, addr, source };
        let tcp = TcpListener::bind(addr).await.map_err(bind_err("extra"))?;
        let udp = UdpSocket::bind(addr).await.map_err(bind_err("extra"))?;
        self.extra = Some((tcp, udp));
        Ok(self)
    }

    /// Also answers SCTP INITs to `ports` on `bind` ([`crate::sctp::Responder`]).
    pub fn with_sctp(mut self, bind: IpAddr, ports: BTreeSet<u16>) -> Result<Self, ProbeError> {
        let r = crate::sctp::Responder::bind(bind, ports, &self.name).map_err(ProbeError::Sctp)?;
        self.sctp = Some(r);
        Ok(self)
    }

    /// The stream port's address, if it serves one.
    pub fn stream_addr(&self) -> Option<SocketAddr> {
        self.stream.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The bound addresses (tcp, udp, http): with port 0 these carry the real ports.
    pub fn local_addrs(&self) -> Result<(SocketAddr, SocketAddr, SocketAddr), ProbeError> {
        Ok((
            self.tcp.local_addr().map_err(ProbeError::Io)?,
            self.udp.local_addr().map_err(ProbeError::Io)?,
            self.http.local_addr().map_err(ProbeError::Io)?,
        ))
    }

    /// The line announcing readiness: `ready: tcp 8000 udp 8000 http 8080 as N`.
    pub fn ready_line(&self) -> Result<String, ProbeError> {
        let (t, u, h) = self.local_addrs()?;
        let stream = self
            .stream_addr()
            .map(|s| format!(" stream {}", s.port()))
            .unwrap_or_default();
        let extra = self
            .extra
            .as_ref()
            .and_then(|(t, _)| t.local_addr().ok())
            .map(|s| format!(" extra {}", s.port()))
            .unwrap_or_default();
        let sctp = self
            .sctp
            .as_ref()
            .map(|r| {
                let ports: Vec<String> = r.ports().iter().map(u16::to_string).collect();
                format!(" sctp {}", ports.join(","))
            })
            .unwrap_or_default();
        Ok(format!(
            "ready: tcp {} udp {} http {}{stream}{extra}{sctp} as {}",
            t.port(),
            u.port(),
            h.port(),
            self.name
        ))
    }

    /// Serves until `shutdown` completes, then stops accepting and returns.
    ///
    /// Connection handlers run as tasks owned by this call, and they are all aborted
    /// *and awaited* before it returns: when it returns, the sockets are closed, so
    /// nothing keeps answering and a successor can bind the same ports at once.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), ProbeError> {
        let mut tasks = JoinSet::new();
        let answer = format!("{}\n", self.name);
        tasks.spawn(accept_loop(self.tcp, answer.clone(), Mode::Tcp));
        tasks.spawn(accept_loop(self.http, answer.clone(), Mode::Http));
        if let Some(l) = self.stream {
            tasks.spawn(accept_loop(l, self.name.clone(), Mode::Stream));
        }
        if let Some((tcp, udp)) = self.extra {
            tasks.spawn(accept_loop(tcp, answer.clone(), Mode::Tcp));
            tasks.spawn(udp_loop(udp, answer.clone()));
        }
        if let Some(r) = self.sctp {
            tasks.spawn(r.serve());
        }
        tasks.spawn(udp_loop(self.udp, answer));
        let res = tokio::select! {
            () = shutdown => Ok(()),
            // The loops only end on a fatal socket error; surface it.
            Some(res) = tasks.join_next() => match res {
                Ok(Err(e)) => Err(ProbeError::Io(e)),
                Ok(Ok(())) => Ok(()),
                Err(e) => Err(ProbeError::Io(std::io::Error::other(e))),
            },
        };
        tasks.shutdown().await;
        res
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Tcp,
    Http,
    /// `answer` is the bare name here.
    Stream,
}

async fn accept_loop(listener: TcpListener, answer: String, mode: Mode) -> std::io::Result<()> {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(c) => c,
                    // Per-connection errors (ECONNABORTED, EMFILE under load) must not stop
                    // the server; back off briefly so EMFILE does not spin.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let answer = answer.clone();
                conns.spawn(async move {
                    // A client that goes away mid-answer is its own problem.
                    let _ = match mode {
                        Mode::Tcp => answer_tcp(stream, &answer).await,
                        Mode::Http => answer_http(stream, &answer, peer.ip()).await,
                        Mode::Stream => crate::stream::serve_stream(stream, &answer).await,
                    };
                });
            }
            // Reap finished connection tasks so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// TCP: the name, then close; never waits for input, so a client that sends nothing works.
async fn answer_tcp(mut stream: TcpStream, answer: &str) -> std::io::Result<()> {
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}

/// HTTP/1.1, just enough: read the head, answer `GET` with the name (`GET /peer`: the
/// name and the client's address as this socket sees it), anything else 405.
async fn answer_http(mut stream: TcpStream, answer: &str, peer: IpAddr) -> std::io::Result<()> {
    let head = match tokio::time::timeout(HTTP_READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()),
    };
    let name = answer.trim_end();
    let request_line = head.lines().next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let response = match (parts.next(), parts.next(), parts.next()) {
        (Some("GET"), Some(path), Some(v)) if v.starts_with("HTTP/") => {
            let body = if path == "/peer" {
                format!("{name} {peer}\n")
            } else {
                answer.to_string()
            };
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                 X-Pod-Name: {name}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }
        (Some(_), Some(_), Some(v)) if v.starts_with("HTTP/") => {
            let body = "only GET is served\n";
            format!(
                "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET\r\nContent-Type: text/plain\r\n\
                 Content-Length: {}\r\nX-Pod-Name: {name}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }
        _ => {
            let body = "bad request\n";
            format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                 X-Pod-Name: {name}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        }
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads until the blank line ending the head (or EOF, or the size limit).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while buf.len() < HTTP_MAX_HEAD {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// UDP: every datagram gets the name back, whatever it carried.
async fn udp_loop(socket: UdpSocket, answer: String) -> std::io::Result<()> {
    let mut buf = [0u8; 2048];
    loop {
        let peer = match socket.recv_from(&mut buf).await {
            Ok((_, peer)) => peer,
            // e.g. ICMP errors reported on the socket: not fatal for a server.
            Err(_) => continue,
        };
        let _ = socket.send_to(answer.as_bytes(), peer).await;
    }
}

/// Resolves when the process gets SIGTERM or SIGINT.
pub async fn shutdown_signal() -> Result<impl Future<Output = ()>, ProbeError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(ProbeError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ProbeError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// The default name: `$POD_NAME` is handled by clap; this is the hostname fallback.
pub fn hostname() -> Result<String, ProbeError> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(ProbeError::Hostname)?;
    let name = raw.trim();
    if name.is_empty() {
        return Err(ProbeError::Hostname(std::io::Error::other(
            "the hostname is empty",
        )));
    }
    Ok(name.to_string())
}
