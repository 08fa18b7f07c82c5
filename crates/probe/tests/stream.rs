//! The stream probe on loopback: the server's stream port echoes, the client streams until
//! the server goes away (the cut), reports the times, and tells "stays cut" from "comes
//! back" by its reconnect attempts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use cozyplane_probe::server::{Server, ServerConfig};
use cozyplane_probe::stream::{now_ms, run_stream, StreamReport, StreamSpec};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A server answering as `name` with a stream port (`port`, 0 = any); stopped by the sender.
async fn server(name: &str, port: u16) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let cfg = ServerConfig {
        name: name.into(),
        bind: lo,
        tcp_port: 0,
        udp_port: 0,
        http_port: 0,
    };
    let srv = Server::bind(&cfg)
        .await
        .expect("bind")
        .with_stream(lo, port)
        .await
        .expect("bind stream");
    let addr = srv.stream_addr().expect("stream addr");
    assert!(
        srv.ready_line()
            .expect("line")
            .contains(&format!(" stream {} as {name}", addr.port())),
        "{}",
        srv.ready_line().expect("line")
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(srv.serve(async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

fn spec(target: SocketAddr, expect: &str) -> StreamSpec {
    StreamSpec {
        target: target.to_string(),
        expect: expect.into(),
        interval_ms: 20,
        echo_timeout_ms: 300,
        connect_timeout_ms: 2000,
        max_stream_ms: 10_000,
        hold_ms: 600,
        reconnect_every_ms: 50,
        stop_on_reconnect: false,
        ready_port: None,
    }
}

#[tokio::test]
async fn the_stream_port_greets_and_echoes_every_line_with_the_name() {
    let (addr, _stop) = server("t1/echo-b", 0).await;
    let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (rd, mut wr) = s.into_split();
    let mut lines = BufReader::new(rd).lines();
    assert_eq!(
        lines.next_line().await.expect("read").as_deref(),
        Some("t1/echo-b")
    );
    for n in ["1", "2", "hello"] {
        wr.write_all(format!("{n}\n").as_bytes())
            .await
            .expect("write");
        assert_eq!(
            lines.next_line().await.expect("read"),
            Some(format!("t1/echo-b {n}"))
        );
    }
}

#[tokio::test]
async fn a_cut_stream_is_timed_and_stays_cut_while_the_server_is_gone() {
    let (addr, stop) = server("t1/echo-b", 0).await;
    let s = spec(addr, "t1/echo-b");
    let client = tokio::spawn(async move { run_stream(&s).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = now_ms();
    drop(stop);
    let r = client.await.expect("join");
    let after = now_ms();
    assert_eq!(r.error, None, "{r:?}");
    assert!(r.echoes >= 5, "{r:?}");
    let (up, last, cut) = (
        r.connected_at.expect("up"),
        r.last_echo_at.expect("last"),
        r.cut_at.expect("cut"),
    );
    assert!(up <= before && last <= cut, "{r:?}");
    assert!(
        cut >= before && cut <= before + 1000,
        "cut {cut} vs stop {before}: {r:?}"
    );
    assert!(
        r.cut_error.as_deref().is_some_and(|e| !e.is_empty()),
        "{r:?}"
    );
    // Nothing listens any more: every reconnect attempt failed, for the whole hold.
    assert!(
        !r.reconnects.is_empty() && r.reconnects.iter().all(|a| !a.ok),
        "{r:?}"
    );
    assert!(r.reconnects.last().expect("run").to >= cut + 500, "{r:?}");
    assert!(after >= cut + 600, "held for holdMs");
    let line = r.to_line().expect("line");
    assert_eq!(StreamReport::parse(&line).expect("parse"), r);
}

#[tokio::test]
async fn a_stream_that_comes_back_stops_at_the_first_reconnect() {
    let (addr, stop) = server("t3/echo-b", 0).await;
    let mut s = spec(addr, "t3/echo-b");
    s.hold_ms = 5000;
    s.stop_on_reconnect = true;
    s.ready_port = Some(free_port());
    let ready = SocketAddr::from(([127, 0, 0, 1], s.ready_port.expect("port")));
    let client = tokio::spawn(async move { run_stream(&s).await });
    // The ready port opens once the stream is up.
    let mut up = false;
    for _ in 0..40 {
        if tokio::net::TcpStream::connect(ready).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "ready port never opened");
    drop(stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = now_ms();
    let (_addr, _stop) = server("t3/echo-b", addr.port()).await;
    let r = client.await.expect("join");
    let last = r.reconnects.last().expect("runs");
    assert!(
        last.ok && last.count == 1 && last.from + 100 >= back,
        "{r:?}"
    );
    assert!(r.reconnects.iter().rev().skip(1).all(|a| !a.ok), "{r:?}");
}

#[tokio::test]
async fn a_wrong_greeting_never_counts_as_connected() {
    let (addr, _stop) = server("t2/echo-b", 0).await;
    let mut s = spec(addr, "t1/echo-b");
    s.connect_timeout_ms = 300;
    let r = run_stream(&s).await;
    assert_eq!(r.connected_at, None);
    let e = r.error.expect("error");
    assert!(
        e.contains("never connected") && e.contains("t2/echo-b"),
        "{e}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}
