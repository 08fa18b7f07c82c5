//! The probe server on loopback: each protocol answers with the configured name.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use cozyplane_probe::server::{Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::oneshot;

struct Running {
    tcp: SocketAddr,
    udp: SocketAddr,
    http: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), cozyplane_probe::ProbeError>>,
}

async fn start(name: &str) -> Running {
    let cfg = ServerConfig {
        name: name.to_string(),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        tcp_port: 0,
        udp_port: 0,
        http_port: 0,
    };
    let srv = Server::bind(&cfg).await.expect("bind on loopback");
    let (tcp, udp, http) = srv.local_addrs().expect("local addrs");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(srv.serve(async move {
        let _ = rx.await;
    }));
    Running {
        tcp,
        udp,
        http,
        stop: Some(tx),
        task,
    }
}

async fn read_all(mut s: TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("server closed the connection")
        .expect("read");
    String::from_utf8(out).expect("utf-8")
}

#[tokio::test]
async fn tcp_answers_name_and_closes_without_input() {
    let r = start("echo-a").await;
    let s = TcpStream::connect(r.tcp).await.expect("connect");
    // We send nothing: the server must answer and close on its own.
    assert_eq!(read_all(s).await, "echo-a\n");
}

#[tokio::test]
async fn udp_answers_every_datagram_to_its_sender() {
    let r = start("echo-b").await;
    let c1 = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let c2 = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    for c in [&c1, &c2, &c1] {
        c.send_to(b"probe", r.udp).await.expect("send");
        let mut buf = [0u8; 64];
        let (n, from) = tokio::time::timeout(Duration::from_secs(5), c.recv_from(&mut buf))
            .await
            .expect("udp answer")
            .expect("recv");
        assert_eq!(from, r.udp);
        assert_eq!(&buf[..n], b"echo-b\n");
    }
}

#[tokio::test]
async fn http_get_answers_200_with_name_body_and_header() {
    let r = start("host-echo-a").await;
    let mut s = TcpStream::connect(r.http).await.expect("connect");
    s.write_all(b"GET /anything HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let resp = read_all(s).await;
    let (head, body) = resp.split_once("\r\n\r\n").expect("head and body");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("\r\ncontent-type: text/plain"), "{head}");
    assert!(lower.contains("\r\nx-pod-name: host-echo-a"), "{head}");
    assert!(lower.contains("\r\nconnection: close"), "{head}");
    assert!(lower.contains("\r\ncontent-length: 12"), "{head}");
    assert_eq!(body, "host-echo-a\n");
}

#[tokio::test]
async fn http_rejects_other_methods_and_garbage() {
    let r = start("echo-a").await;
    let mut s = TcpStream::connect(r.http).await.expect("connect");
    s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .await
        .expect("write");
    let resp = read_all(s).await;
    assert!(resp.starts_with("HTTP/1.1 405 "), "{resp}");
    assert!(resp.contains("Allow: GET"), "{resp}");

    let mut s = TcpStream::connect(r.http).await.expect("connect");
    s.write_all(b"hello\r\n\r\n").await.expect("write");
    assert!(read_all(s).await.starts_with("HTTP/1.1 400 "));
}

#[tokio::test]
async fn ready_line_reports_bound_ports_and_name() {
    let cfg = ServerConfig {
        name: "echo-a".into(),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        tcp_port: 0,
        udp_port: 0,
        http_port: 0,
    };
    let srv = Server::bind(&cfg).await.expect("bind");
    let (t, u, h) = srv.local_addrs().expect("addrs");
    assert_eq!(
        srv.ready_line().expect("line"),
        format!(
            "ready: tcp {} udp {} http {} as echo-a",
            t.port(),
            u.port(),
            h.port()
        )
    );
}

#[tokio::test]
async fn port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let cfg = ServerConfig {
        name: "x".into(),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        tcp_port: port,
        udp_port: 0,
        http_port: 0,
    };
    let err = Server::bind(&cfg).await.expect_err("port is taken");
    let msg = err.to_string();
    assert!(msg.contains("tcp socket"), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(msg.contains("--tcp-port"), "{msg}");
}

#[tokio::test]
async fn stops_answering_after_shutdown() {
    let mut r = start("echo-a").await;
    let s = TcpStream::connect(r.tcp).await.expect("connect");
    assert_eq!(read_all(s).await, "echo-a\n");
    r.stop
        .take()
        .expect("sender")
        .send(())
        .expect("server alive");
    tokio::time::timeout(Duration::from_secs(5), &mut r.task)
        .await
        .expect("serve returns after shutdown")
        .expect("no panic")
        .expect("clean shutdown");
    // The listener is dropped: connecting now is refused.
    assert!(TcpStream::connect(r.tcp).await.is_err());
    // Every socket is closed by the time serve returned: a successor (a
    // recreated pod on the same address) binds the very same ports at once.
    let again = ServerConfig {
        name: "echo-a2".into(),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        tcp_port: r.tcp.port(),
        udp_port: r.udp.port(),
        http_port: r.http.port(),
    };
    Server::bind(&again)
        .await
        .expect("the same ports are free once serve returned");
}
