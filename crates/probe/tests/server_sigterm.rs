//! SIGTERM ends the server cleanly. Its own test binary (one test, one process): the
//! signal goes to this whole process, which must have the handler installed first.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use cozyplane_probe::server::{shutdown_signal, Server, ServerConfig};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn sigterm_stops_the_server_with_success() {
    let shutdown = shutdown_signal().await.expect("install handlers");
    let cfg = ServerConfig {
        name: "echo-a".into(),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        tcp_port: 0,
        udp_port: 0,
        http_port: 0,
    };
    let srv = Server::bind(&cfg).await.expect("bind");
    let (tcp, _, _) = srv.local_addrs().expect("addrs");
    let task = tokio::spawn(srv.serve(shutdown));

    let mut s = TcpStream::connect(tcp).await.expect("connect");
    let mut got = String::new();
    s.read_to_string(&mut got).await.expect("read");
    assert_eq!(got, "echo-a\n");

    // SAFETY: kill(2) on our own pid with a signal whose handler is installed above;
    // no memory is shared or touched.
    let rc = unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    assert_eq!(rc, 0, "kill(SIGTERM) failed");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("server stops after SIGTERM")
        .expect("no panic")
        .expect("exit without error");
}
