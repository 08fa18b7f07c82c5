//! Blocked (negative) checks: PASS only when the target stays silent for the whole
//! timeout, FAIL on the first answer; and the plan JSON stays what it was for plans
//! that do not use them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use cozyplane_probe::client::run_plan;
use cozyplane_probe::server::{Server, ServerConfig};
use cozyplane_probe::{Check, Plan, Proto};

struct Addrs {
    tcp: SocketAddr,
    udp: SocketAddr,
    http: SocketAddr,
}

async fn server(name: &str) -> Addrs {
    let cfg = ServerConfig {
        name: name.into(),
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        tcp_port: 0,
        udp_port: 0,
        http_port: 0,
    };
    let srv = Server::bind(&cfg).await.expect("bind");
    let (tcp, udp, http) = srv.local_addrs().expect("addrs");
    tokio::spawn(srv.serve(std::future::pending()));
    Addrs { tcp, udp, http }
}

fn blocked(id: &str, proto: Proto, target: SocketAddr, timeout_ms: u64) -> Check {
    Check {
        id: id.into(),
        proto,
        target: target.to_string(),
        expect: None,
        timeout_ms,
        expect_blocked: true,
    }
}

/// A loopback TCP port nobody listens on (bound, then released): connect is refused.
fn closed_tcp_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

#[tokio::test]
async fn a_silent_or_refusing_target_passes_after_the_whole_timeout() {
    // UDP: a socket that never answers (a black hole); and a closed port (ICMP error).
    let hole = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let closed_udp = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.local_addr().expect("addr")
    };
    let plan = Plan {
        checks: vec![
            blocked("b/tcp-refused", Proto::Tcp, closed_tcp_port(), 1200),
            blocked("b/http-refused", Proto::Http, closed_tcp_port(), 1200),
            blocked(
                "b/udp-silent",
                Proto::Udp,
                hole.local_addr().expect("addr"),
                1200,
            ),
            blocked("b/udp-closed", Proto::Udp, closed_udp, 1200),
        ],
    };
    let r = run_plan(&plan).await;
    for o in &r.results {
        assert!(o.ok, "{o:?}");
        assert_eq!(o.answer, None, "{o:?}");
        assert_eq!(o.error, None, "{o:?}");
        // It listened for the whole timeout: an early verdict would pass a path that is
        // merely not programmed yet.
        assert!(o.ms >= 1200.0, "{o:?}");
    }
}

#[tokio::test]
async fn an_answer_fails_a_blocked_check_at_once_and_names_who_answered() {
    let s = server("t2/echo-a").await;
    let plan = Plan {
        checks: vec![
            blocked("b/tcp", Proto::Tcp, s.tcp, 5000),
            blocked("b/udp", Proto::Udp, s.udp, 5000),
            blocked("b/http", Proto::Http, s.http, 5000),
        ],
    };
    let r = run_plan(&plan).await;
    for o in &r.results {
        assert!(!o.ok, "{o:?}");
        assert_eq!(o.answer.as_deref(), Some("t2/echo-a"), "{o:?}");
        let e = o.error.as_deref().expect("error");
        assert!(
            e.contains("expected no answer (blocked)") && e.contains("answered \"t2/echo-a\""),
            "{e}"
        );
        assert!(
            o.ms < 2000.0,
            "fails on the first answer, not at the timeout: {o:?}"
        );
    }
}

#[tokio::test]
async fn an_established_connection_counts_as_reached_even_without_an_answer() {
    // Accepts and closes at once: no name comes back, but the path is open.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            drop(s);
        }
    });
    let r = run_plan(&Plan {
        checks: vec![
            blocked("b/tcp", Proto::Tcp, addr, 3000),
            blocked("b/http", Proto::Http, addr, 3000),
        ],
    })
    .await;
    for o in &r.results {
        assert!(!o.ok, "{o:?}");
        let e = o.error.as_deref().expect("error");
        assert!(e.contains("expected no answer (blocked)"), "{e}");
    }
}

#[test]
fn plans_without_expect_blocked_read_and_write_as_before() {
    let old = r#"{"checks":[{"id":"pod-to-pod/cross-node/tcp","proto":"tcp","target":"10.244.2.3:8000","expect":"echo-b","timeoutMs":3000}]}"#;
    let plan = Plan::parse(old).expect("an old plan still parses");
    assert!(!plan.checks[0].expect_blocked);
    assert_eq!(
        plan.to_json().expect("json"),
        old,
        "byte for byte: no new key"
    );

    let neg = r#"{"checks":[{"id":"tenancy/twin-vpc/cross-node/tcp","proto":"tcp","target":"10.250.0.3:8000","expect":null,"timeoutMs":3000,"expectBlocked":true}]}"#;
    let plan = Plan::parse(neg).expect("parse");
    assert!(plan.checks[0].expect_blocked);
    assert_eq!(plan.to_json().expect("json"), neg);
}

#[test]
fn a_blocked_check_cannot_also_expect_an_answer() {
    let bad = r#"{"checks":[{"id":"x","proto":"tcp","target":"10.250.0.3:8000","expect":"echo-a","timeoutMs":3000,"expectBlocked":true}]}"#;
    let e = Plan::parse(bad).expect_err("contradiction").to_string();
    assert!(
        e.contains("expectBlocked and expect exclude each other"),
        "{e}"
    );
}

/// A probe that cannot open a raw ICMP socket (no CAP_NET_RAW) fails a blocked ICMP check
/// at once, saying why, instead of passing on its own silence. As root the test runs
/// itself again without CAP_NET_RAW (`setpriv`); as another user it has none already.
#[test]
fn a_blocked_icmp_check_fails_when_the_probe_cannot_ping() {
    const CHILD: &str = "COZYPLANE_PROBE_TEST_NO_NET_RAW";
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let net_raw = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .expect("CapEff")
        & (1 << 13)
        != 0;
    if net_raw {
        assert!(
            std::env::var_os(CHILD).is_none(),
            "setpriv did not drop CAP_NET_RAW"
        );
        let exe = std::env::current_exe().expect("test binary");
        let out = std::process::Command::new("setpriv")
            .args(["--bounding-set", "-net_raw", "--inh-caps", "-net_raw", "--"])
            .arg(exe)
            .args([
                "--exact",
                "a_blocked_icmp_check_fails_when_the_probe_cannot_ping",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .expect("run setpriv (util-linux)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "the test without CAP_NET_RAW:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let target: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let r = rt.block_on(run_plan(&Plan {
        checks: vec![blocked("b/icmp", Proto::Icmp, target, 3000)],
    }));
    let o = &r.results[0];
    assert!(!o.ok, "{o:?}");
    let e = o.error.as_deref().expect("error");
    assert!(
        e.contains("cannot probe, so silence proves nothing")
            && e.contains("icmp socket (needs CAP_NET_RAW)"),
        "{e}"
    );
    assert!(o.ms < 1000.0, "fails at once, not at the timeout: {o:?}");
}
