//! The accept loop and what bounds a connection: a cap on open connections,
//! a deadline for the TLS handshake and the first request, a header-read
//! timeout for later requests, and a back-off on accept errors.
//!
//! Design (issue #9, "Connections"): idle sockets that never start TLS used
//! to exhaust the file descriptors, after which `accept` failed with EMFILE
//! in a loop that spun and logged millions of lines, and nothing was served.
//! Now:
//! - at most [`ServerSettings::max_connections`] connections are open (a
//!   semaphore). The default is derived from `RLIMIT_NOFILE`, keeping
//!   [`reserved_fds`] descriptors for the server itself, so the cap is reached
//!   before the descriptors run out;
//! - a connection is *handshaking* from its accept until its first request's
//!   headers arrive (the TLS handshake, then HTTP/2's preface or HTTP/1's
//!   request line). It is closed when that takes longer than the handshake
//!   timeout (10 s), and it is the one given up when room is needed: at the
//!   cap, or when `accept` fails for want of descriptors, the oldest
//!   handshaking connection is closed to serve the new one. Idle sockets
//!   therefore cannot keep out a client that talks: `/livez` answers at once
//!   with any number of them queued. A legitimate client loses a connection
//!   only when more new connections than the cap arrive during its own
//!   handshake;
//! - established connections are never shed. An HTTP/1 connection must send
//!   each request's headers within the header-read timeout (30 s, also the
//!   longest an HTTP/1 connection stays idle between requests). Any
//!   connection with no request in flight for the idle timeout (90 s,
//!   kube-apiserver's `IdleTimeout`) is closed: HTTP/2 with a GOAWAY. A
//!   request is in flight from its headers until its response body has been
//!   sent or dropped, so a connection carrying an open watch is never idle.
//!   HTTP/2 keep-alive: after 30 s without a frame from the peer the server
//!   sends a PING and closes the connection when no ACK comes within 15 s
//!   (client-go's `ReadIdleTimeout` and `PingTimeout`), so a dead peer's
//!   connection — and its watches — go within 45 s even with streams open.
//!   When the cap is reached with no handshaking connection, new connections
//!   wait in the listen backlog until one ends;
//! - an `accept` error for want of descriptors or memory first frees a
//!   descriptor by shedding; when there is nothing to shed the loop sleeps,
//!   doubling from 5 ms up to 1 s and resetting on the next success. Accept
//!   errors are logged at most once per 5 s, with the number left unlogged.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cozyplane_errors::Chain;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::auth::authn::CertAuthority;
use crate::auth::PeerIdentity;
use crate::http::{handle, AppState};

/// The most connections open at once by default (and the most the default
/// derived from `RLIMIT_NOFILE` gives).
pub const MAX_CONNECTIONS: usize = 10_000;

/// How long a connection has, from its accept, to finish the TLS handshake
/// and send its first request's headers.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1 connection has to send a request's headers, counted
/// from the end of the previous response (so also the longest it may idle);
/// kube-apiserver's `ReadHeaderTimeout` is 32 s.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an established connection may have no request in flight
/// before it is closed (kube-apiserver's `IdleTimeout`, for HTTP/1 and 2).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// HTTP/2 keep-alive: a PING goes out after this long without a frame from
/// the peer (client-go's `ReadIdleTimeout`)…
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// …and the connection is closed when its ACK has not come within this
/// (client-go's `PingTimeout`).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(15);

/// The first and the longest sleep after an accept error that shedding
/// could not answer.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// At most one log line per this interval for accept errors, and one for
/// reaching the connection cap.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// Connection bounds of a server.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            max_connections: default_max_connections(),
            handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            keepalive_interval: KEEPALIVE_INTERVAL,
            keepalive_timeout: KEEPALIVE_TIMEOUT,
        }
    }
}

/// Counts the requests in flight on one connection: one [`InFlight`] per
/// request, from its headers until its response body is done or dropped.
#[derive(Debug, Clone)]
struct Activity(Arc<watch::Sender<usize>>);

impl Activity {
    fn new() -> (Self, watch::Receiver<usize>) {
        let (tx, rx) = watch::channel(0);
        (Activity(Arc::new(tx)), rx)
    }

    fn enter(&self) -> InFlight {
        self.0.send_modify(|n| *n += 1);
        InFlight(self.0.clone())
    }
}

/// One request in flight (see [`Activity`]).
#[derive(Debug)]
struct InFlight(Arc<watch::Sender<usize>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A response body that keeps its request [`InFlight`] until hyper has sent
/// it to the end or dropped it (the stream was reset, the peer went away).
struct Tracked<B> {
    inner: B,
    _in_flight: InFlight,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Resolves once no request has been in flight for `timeout` (never when
/// the counter is gone: the connection has ended by then).
async fn idle_for(mut in_flight: watch::Receiver<usize>, timeout: Duration) {
    loop {
        if in_flight.wait_for(|n| *n == 0).await.is_err() {
            return std::future::pending().await;
        }
        // Any change (a new request) restarts the wait.
        if tokio::time::timeout(timeout, in_flight.changed())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The descriptors kept for the server itself (store, listener, logs,
/// outgoing connections) out of a soft limit of `soft`: an eighth, at
/// least 64.
pub fn reserved_fds(soft: u64) -> u64 {
    (soft / 8).max(64)
}

/// [`MAX_CONNECTIONS`], or fewer when `RLIMIT_NOFILE` allows fewer
/// connections beside the [`reserved_fds`] (at least 1).
pub fn default_max_connections() -> usize {
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => max_connections_for(soft),
        Err(_) => MAX_CONNECTIONS,
    }
}

fn max_connections_for(soft: u64) -> usize {
    let budget = soft.saturating_sub(reserved_fds(soft)).max(1);
    usize::try_from(budget)
        .unwrap_or(usize::MAX)
        .min(MAX_CONNECTIONS)
}

/// The handshaking connections, oldest first: each holds the receiver of
/// its entry and drops it once its first request arrived (or it ended).
#[derive(Debug, Default)]
struct Handshaking {
    queue: VecDeque<watch::Sender<bool>>,
    /// Queue length after the last sweep of finished entries.
    swept: usize,
}

impl Handshaking {
    /// A new handshaking connection; its receiver sees `true` when it is shed.
    fn register(&mut self) -> watch::Receiver<bool> {
        while self.queue.front().is_some_and(watch::Sender::is_closed) {
            self.queue.pop_front();
        }
        if self.queue.len() > 2 * self.swept + 64 {
            self.queue.retain(|s| !s.is_closed());
            self.swept = self.queue.len();
        }
        let (tx, rx) = watch::channel(false);
        self.queue.push_back(tx);
        rx
    }

    /// Tell the oldest connection still handshaking to close; its sender
    /// resolves `closed()` once it has (its socket is closed by then).
    fn shed_oldest(&mut self) -> Option<watch::Sender<bool>> {
        while let Some(tx) = self.queue.pop_front() {
            if tx.send(true).is_ok() {
                return Some(tx);
            }
        }
        None
    }
}

/// Exponential back-off between two bounds.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    fn new((min, max): (Duration, Duration)) -> Self {
        Backoff {
            next: min,
            min,
            max,
        }
    }

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(self.max);
        d
    }

    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Allows one event per interval and counts the ones it held back.
#[derive(Debug)]
struct RateLimited {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    fn new(every: Duration) -> Self {
        RateLimited {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(held back since the last allowed one)` when this one may go.
    fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|l| now.saturating_duration_since(l) < self.every)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// Whether an accept error means the process or system is out of
/// descriptors or memory (so retrying at once would fail again).
fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::EMFILE | nix::libc::ENFILE | nix::libc::ENOBUFS | nix::libc::ENOMEM)
    )
}

/// Whether an accept error concerns only the connection it was about.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || e.raw_os_error() == Some(nix::libc::EPROTO)
}

/// Accept and serve connections until `shutdown` changes.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    cert_authority: Arc<CertAuthority>,
    state: Arc<AppState>,
    settings: ServerSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let mut handshaking = Handshaking::default();
    let mut backoff = Backoff::new(ACCEPT_BACKOFF);
    let mut accept_warn = RateLimited::new(WARN_EVERY);
    let mut cap_warn = RateLimited::new(WARN_EVERY);
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(x) => {
                backoff.reset();
                x
            }
            Err(e) => {
                if let Some(suppressed) = accept_warn.allow(Instant::now()) {
                    tracing::warn!(error = %Chain(&e), suppressed, "accept failed");
                }
                if is_per_connection(&e) {
                    continue;
                }
                let freed = if is_exhaustion(&e) {
                    handshaking.shed_oldest()
                } else {
                    None
                };
                tokio::select! {
                    _ = shutdown.changed() => break,
                    () = async {
                        match &freed {
                            Some(victim) => victim.closed().await,
                            None => tokio::time::sleep(backoff.next()).await,
                        }
                    } => continue,
                }
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let shed = handshaking.shed_oldest().is_some();
                if let Some(suppressed) = cap_warn.allow(Instant::now()) {
                    tracing::warn!(
                        max = settings.max_connections,
                        shed_a_handshaking_connection = shed,
                        suppressed,
                        "connection limit reached"
                    );
                }
                tokio::select! {
                    _ = shutdown.changed() => break,
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                }
            }
        };
        let shed = handshaking.register();
        conns.spawn(serve(
            tcp,
            peer,
            shed,
            permit,
            (acceptor.clone(), cert_authority.clone()),
            state.clone(),
            settings.clone(),
        ));
    }
    conns.shutdown().await;
}

/// Serve one connection. The socket is always dropped before `shed` (it is
/// moved into the handshake, and the connection is a later local), so a
/// shedder waiting for `shed` to go finds the descriptor closed.
async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    mut shed: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
    (acceptor, cert_authority): (tokio_rustls::TlsAcceptor, Arc<CertAuthority>),
    state: Arc<AppState>,
    settings: ServerSettings,
) {
    let deadline = tokio::time::sleep(settings.handshake_timeout);
    tokio::pin!(deadline);
    let tls = tokio::select! {
        r = acceptor.accept(tcp) => match r {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(%peer, error = %Chain(&e), "TLS handshake failed");
                return;
            }
        },
        () = &mut deadline => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
        _ = shed.changed() => {
            tracing::debug!(%peer, "closed during its TLS handshake to make room");
            return;
        }
    };
    // The identity of a verified client certificate (a user's or a front
    // proxy's), once per connection.
    let identity: Option<Arc<PeerIdentity>> = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| cert_authority.identify(c))
        .map(Arc::new);
    let (started_tx, mut started) = watch::channel(false);
    let (activity, in_flight) = Activity::new();
    let svc = hyper::service::service_fn(move |req| {
        started_tx.send_if_modified(|s| !std::mem::replace(s, true));
        let request = activity.enter();
        let response = handle(state.clone(), identity.clone(), req);
        async move {
            let response = response.await?;
            Ok::<_, std::convert::Infallible>(response.map(|inner| Tracked {
                inner,
                _in_flight: request,
            }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_timeout);
    let served = builder.serve_connection(TokioIo::new(tls), svc);
    tokio::pin!(served);
    let result = tokio::select! {
        r = served.as_mut() => r,
        true = async { started.wait_for(|s| *s).await.is_ok() } => {
            // Established: no longer shed, nor bound by the handshake
            // deadline, but closed once idle.
            drop(shed);
            tokio::select! {
                r = served.as_mut() => r,
                () = idle_for(in_flight, settings.idle_timeout) => {
                    tracing::debug!(%peer, "closing an idle connection");
                    served.as_mut().graceful_shutdown();
                    served.await
                }
            }
        }
        () = &mut deadline => {
            tracing::debug!(%peer, "no request within the handshake timeout");
            return;
        }
        _ = shed.changed() => {
            tracing::debug!(%peer, "closed before its first request to make room");
            return;
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %Chain(&*e), "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::libc;

    #[test]
    fn the_default_cap_leaves_descriptors_for_the_server() {
        assert_eq!(max_connections_for(256), 192);
        assert_eq!(max_connections_for(1024), 896);
        assert_eq!(max_connections_for(1 << 20), MAX_CONNECTIONS);
        assert_eq!(max_connections_for(u64::MAX), MAX_CONNECTIONS);
        assert_eq!(max_connections_for(10), 1);
    }

    #[test]
    fn backoff_doubles_up_to_its_bound_and_resets() {
        let mut b = Backoff::new(ACCEPT_BACKOFF);
        let first: Vec<u64> = (0..10).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(first, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(5));
    }

    #[test]
    fn rate_limited_allows_one_per_interval_and_counts_the_rest() {
        let mut r = RateLimited::new(Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(r.allow(t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(r.allow(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(r.allow(t0 + Duration::from_secs(5)), Some(1000));
        assert_eq!(r.allow(t0 + Duration::from_secs(6)), None);
    }

    #[test]
    fn shedding_takes_the_oldest_still_handshaking() {
        let mut h = Handshaking::default();
        let a = h.register();
        let b = h.register();
        let c = h.register();
        drop(a); // a finished its handshake
        let victim = h.shed_oldest();
        assert!(victim.is_some());
        assert!(*b.borrow(), "b is the oldest still handshaking");
        assert!(!*c.borrow());
        drop(b);
        drop(c);
        assert!(h.shed_oldest().is_none());
    }

    #[test]
    fn finished_entries_are_swept() {
        let mut h = Handshaking::default();
        let keep = h.register();
        for _ in 0..10_000 {
            drop(h.register());
        }
        assert!(h.queue.len() < 200, "{}", h.queue.len());
        drop(keep);
    }

    #[test]
    fn errors_are_classified() {
        assert!(is_exhaustion(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(is_exhaustion(&io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!is_per_connection(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(is_per_connection(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }
}
