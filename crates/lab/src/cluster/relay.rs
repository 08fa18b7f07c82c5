//! `lab relay`: forwards the host's `127.0.0.1:<port>` to the API server in the
//! fabric namespace.
//!
//! `up` binds the host-side listener itself (so it knows the port before the
//! relay runs and two labs never race for one) and hands it to this process as
//! an inherited file descriptor; the relay runs in the fabric namespace, so its
//! outgoing connections reach the API server there, and teardown finds it with
//! the lab's other processes. Bytes are copied both ways; TLS is end to end
//! between kubectl and the API server.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;

use super::error::{ClusterError, ClusterResult};

/// The fd number the listener is passed as.
pub const LISTEN_FD: RawFd = 3;

/// Arguments of the hidden `lab relay` subcommand.
#[derive(Debug, clap::Args)]
pub struct RelayArgs {
    /// An inherited listening TCP socket.
    #[arg(long, default_value_t = LISTEN_FD)]
    pub listen_fd: RawFd,
    /// Where to forward to (from this process's namespace).
    #[arg(long)]
    pub to: SocketAddr,
}

/// Accepts on the inherited socket forever, forwarding each connection to `to`.
pub async fn run(args: RelayArgs) -> ClusterResult<()> {
    let fd_path = PathBuf::from(format!("/proc/self/fd/{}", args.listen_fd));
    if !fd_path.exists() {
        return Err(ClusterError::io(
            "relay: no inherited listener at",
            fd_path,
            std::io::ErrorKind::NotFound.into(),
        ));
    }
    // SAFETY: the fd was checked to be open; `up` passes a listening TCP socket
    // there and nothing else in this process uses or closes it, so the listener
    // becomes its only owner.
    let std_listener = unsafe { std::net::TcpListener::from_raw_fd(args.listen_fd) };
    std_listener
        .set_nonblocking(true)
        .map_err(|e| ClusterError::io("relay: set_nonblocking", &fd_path, e))?;
    let listener = tokio::net::TcpListener::from_std(std_listener)
        .map_err(|e| ClusterError::io("relay: register listener", &fd_path, e))?;
    serve(listener, args.to).await
}

/// The accept loop (also used by the tests with an ordinary listener).
pub async fn serve(listener: tokio::net::TcpListener, to: SocketAddr) -> ClusterResult<()> {
    loop {
        let (mut inbound, _) = match listener.accept().await {
            Ok(c) => c,
            // A connection that died before we accepted it is not our problem.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => continue,
            Err(e) => return Err(ClusterError::io("relay: accept on", to.to_string(), e)),
        };
        tokio::spawn(async move {
            // The client sees the connection close if the API server is down.
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_go_both_ways() {
        let backend = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let to = backend.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = backend.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let front = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let front_addr = front.local_addr().expect("addr");
        tokio::spawn(serve(front, to));
        for msg in [&b"hello"[..], b"second connection"] {
            let mut c = tokio::net::TcpStream::connect(front_addr)
                .await
                .expect("connect");
            c.write_all(msg).await.expect("write");
            let mut back = vec![0u8; msg.len()];
            c.read_exact(&mut back).await.expect("read");
            assert_eq!(back, msg);
        }
    }

    #[tokio::test]
    async fn a_closed_fd_is_a_clear_error() {
        let err = run(RelayArgs {
            listen_fd: 999_999,
            to: "127.0.0.1:1".parse().expect("addr"),
        })
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("no inherited listener"), "{err}");
    }
}
