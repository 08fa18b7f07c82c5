//! `--extra-port`: one more port answered over TCP and UDP like the main
//! ones (policy tests tell port 80 from 81 apart), announced on the ready
//! line.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use cozyplane_probe::client::run_plan;
use cozyplane_probe::server::{Server, ServerConfig};
use cozyplane_probe::{Check, Plan, Proto};

#[tokio::test]
async fn the_extra_port_answers_tcp_and_udp_with_the_name() {
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let cfg = ServerConfig {
        name: "x-a".into(),
        bind: lo,
        tcp_port: 0,
        udp_port: 0,
        http_port: 0,
    };
    // a free port for the extra listener (bound, then released)
    let port = std::net::TcpListener::bind((lo, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let srv = Server::bind(&cfg)
        .await
        .unwrap()
        .with_extra(lo, port)
        .await
        .expect("bind the extra port");
    assert!(
        srv.ready_line()
            .unwrap()
            .contains(&format!(" extra {port} as x-a")),
        "{}",
        srv.ready_line().unwrap()
    );
    tokio::spawn(srv.serve(std::future::pending()));
    let target = SocketAddr::new(lo, port).to_string();
    let check = |proto| Check {
        id: format!("{proto:?}"),
        proto,
        target: target.clone(),
        expect: Some("x-a".into()),
        timeout_ms: 3000,
        expect_blocked: false,
    };
    let r = run_plan(&Plan {
        checks: vec![check(Proto::Tcp), check(Proto::Udp)],
    })
    .await;
    for o in &r.results {
        assert!(o.ok, "{o:?}");
    }
}
