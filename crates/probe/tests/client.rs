//! The probe client against a real probe server on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use cozyplane_probe::client::run_plan;
use cozyplane_probe::server::{Server, ServerConfig};
use cozyplane_probe::{run_client, Check, ClientArgs, Plan, ProbeError, Proto, Report};

struct Addrs {
    tcp: SocketAddr,
    udp: SocketAddr,
    http: SocketAddr,
}

/// Starts a server that lives until the test's runtime ends.
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

fn check(
    id: &str,
    proto: Proto,
    target: SocketAddr,
    expect: Option<&str>,
    timeout_ms: u64,
) -> Check {
    Check {
        id: id.into(),
        proto,
        target: target.to_string(),
        expect: expect.map(str::to_string),
        timeout_ms,
        expect_blocked: false,
    }
}

/// Whether the test runs as root (raw sockets). Elsewhere it says SKIP, but
/// under CI a test that cannot run fails.
fn root_or_skip(test: &str) -> bool {
    // the effective uid, from /proc/self/status ("Uid: real effective saved fs")
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("uid line");
    if euid == "0" {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test} needs root under CI"
    );
    println!("SKIP {test}: needs root");
    false
}

/// A loopback port nobody listens on (bound, then released).
fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

#[tokio::test]
async fn peer_reports_the_name_and_the_address_the_server_saw() {
    let s = server("echo-p").await;
    let plan = Plan {
        checks: vec![
            check(
                "p/peer",
                Proto::Peer,
                s.http,
                Some("echo-p 127.0.0.1"),
                3000,
            ),
            check("p/peer-any", Proto::Peer, s.http, None, 3000),
        ],
    };
    let r = run_plan(&plan).await;
    for o in &r.results {
        assert!(o.ok, "{o:?}");
        assert_eq!(o.answer.as_deref(), Some("echo-p 127.0.0.1"));
    }
    // a plain GET still answers the bare name
    let r = run_plan(&Plan {
        checks: vec![check("p/http", Proto::Http, s.http, Some("echo-p"), 3000)],
    })
    .await;
    assert!(r.results[0].ok, "{:?}", r.results[0]);
}

#[tokio::test]
async fn all_protocols_pass_against_the_right_server() {
    let s = server("echo-b").await;
    let plan = Plan {
        checks: vec![
            check("p/tcp", Proto::Tcp, s.tcp, Some("echo-b"), 3000),
            check("p/udp", Proto::Udp, s.udp, Some("echo-b"), 3000),
            check("p/http", Proto::Http, s.http, Some("echo-b"), 3000),
            check("p/any", Proto::Tcp, s.tcp, None, 3000),
        ],
    };
    let r = run_plan(&plan).await;
    let ids: Vec<_> = r.results.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        ["p/tcp", "p/udp", "p/http", "p/any"],
        "plan order kept"
    );
    for o in &r.results {
        assert!(o.ok, "{o:?}");
        assert_eq!(o.answer.as_deref(), Some("echo-b"));
        assert_eq!(o.error, None);
        assert!(o.ms > 0.0 && o.ms < 3000.0, "{o:?}");
    }
}

#[tokio::test]
async fn wrong_name_fails_with_a_clear_error() {
    let s = server("echo-a").await;
    let plan = Plan {
        checks: vec![
            check("w/tcp", Proto::Tcp, s.tcp, Some("echo-b"), 400),
            check("w/udp", Proto::Udp, s.udp, Some("echo-b"), 400),
            check("w/http", Proto::Http, s.http, Some("echo-b"), 400),
        ],
    };
    let r = run_plan(&plan).await;
    for o in &r.results {
        assert!(!o.ok, "{o:?}");
        assert_eq!(o.answer.as_deref(), Some("echo-a"), "{o:?}");
        let e = o.error.as_deref().expect("error");
        assert!(e.contains(r#"answered "echo-a", expected "echo-b""#), "{e}");
    }
}

#[tokio::test]
async fn closed_port_fails_within_its_timeout() {
    let target = closed_port();
    let timeout_ms = 600;
    let plan = Plan {
        checks: vec![
            check("c/tcp", Proto::Tcp, target, Some("x"), timeout_ms),
            check("c/udp", Proto::Udp, target, Some("x"), timeout_ms),
            check("c/http", Proto::Http, target, Some("x"), timeout_ms),
        ],
    };
    let t0 = Instant::now();
    let r = run_plan(&plan).await;
    let wall = t0.elapsed();
    // The checks ran concurrently and each stopped at its deadline (with slack for a busy
    // machine): this bounds behaviour, it is not a speed measurement.
    assert!(
        wall < Duration::from_millis(timeout_ms + 2000),
        "took {wall:?}"
    );
    for o in &r.results {
        assert!(!o.ok, "{o:?}");
        assert!(
            o.ms >= timeout_ms as f64,
            "retried until the timeout: {o:?}"
        );
        assert_eq!(o.answer, None);
        let e = o.error.as_deref().expect("error");
        assert!(e.contains(&target.to_string()), "{e}");
        assert!(e.contains("refused"), "{e}");
        assert!(e.contains("attempts"), "{e}");
    }
}

#[tokio::test]
async fn report_for_twenty_real_checks_fits_the_termination_message() {
    let good = server("echo-a").await;
    let bad = closed_port();
    let mut checks = Vec::new();
    for i in 0..10 {
        checks.push(check(
            &format!("pod-to-pod/cross-node/tcp-{i}"),
            Proto::Tcp,
            good.tcp,
            Some("echo-a"),
            3000,
        ));
        checks.push(check(
            &format!("pod-to-pod/cross-node/http-{i}"),
            Proto::Http,
            bad,
            Some("echo-b"),
            300,
        ));
    }
    let r = run_plan(&Plan { checks }).await;
    let line = r.to_line().expect("line");
    assert!(line.len() <= 4096, "{} bytes: {line}", line.len());
    assert!(!line.contains('\n'));
    let back = Report::parse(&line).expect("parse");
    assert_eq!(back.results.len(), 20);
    assert_eq!(back.failures().count(), 10);
}

#[tokio::test]
async fn client_writes_the_termination_log_and_fails_on_any_failure() {
    let s = server("echo-a").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("termination-log");
    let plan = Plan {
        checks: vec![
            check("ok", Proto::Tcp, s.tcp, Some("echo-a"), 2000),
            check("bad", Proto::Tcp, closed_port(), None, 200),
        ],
    };
    let args = ClientArgs {
        plan: Some(plan.to_json().expect("json")),
        plan_file: None,
    };
    let err = run_client(args, Some(&log))
        .await
        .expect_err("one check fails");
    assert!(
        matches!(
            err,
            ProbeError::ChecksFailed {
                failed: 1,
                total: 2
            }
        ),
        "{err}"
    );
    let written = std::fs::read_to_string(&log).expect("termination log written");
    let r = Report::parse(&written).expect("log holds the report");
    assert!(r.results[0].ok);
    assert!(!r.results[1].ok);

    // All passing: Ok, and the file is rewritten with the new report.
    let plan_file = dir.path().join("plan.json");
    let ok_plan = Plan {
        checks: vec![check("ok", Proto::Udp, s.udp, Some("echo-a"), 2000)],
    };
    std::fs::write(&plan_file, ok_plan.to_json().expect("json")).expect("write plan");
    let args = ClientArgs {
        plan: None,
        plan_file: Some(plan_file),
    };
    run_client(args, Some(&log)).await.expect("all pass");
    let r = Report::parse(&std::fs::read_to_string(&log).expect("log")).expect("report");
    assert_eq!(r.results.len(), 1);
    assert!(r.results[0].ok);
}

#[tokio::test]
async fn bad_plan_is_reported_in_the_termination_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("termination-log");
    let args = ClientArgs {
        plan: Some(r#"{"checks":[]}"#.into()),
        plan_file: None,
    };
    let err = run_client(args, Some(&log)).await.expect_err("empty plan");
    let chain = cozyplane_errors::Chain(&err).to_string();
    assert_eq!(chain, "invalid plan: the plan has no checks");
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.contains("invalid plan: the plan has no checks"),
        "{text}"
    );

    let missing = dir.path().join("nope.json");
    let args = ClientArgs {
        plan: None,
        plan_file: Some(missing.clone()),
    };
    let err = run_client(args, None).await.expect_err("missing file");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

/// ICMP echo on loopback (v4 and v6) is answered, as a positive and as a blocked check
/// (which must then fail: the answer is seen). A raw socket needs root: elsewhere this
/// test says SKIP, under CI it must run.
#[tokio::test]
async fn icmp_echo_is_answered_and_silence_is_blocked() {
    if !root_or_skip("icmp_echo_is_answered_and_silence_is_blocked") {
        return;
    }
    let v4: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let v6: SocketAddr = "[::1]:0".parse().unwrap();
    let mut answered = check("p/icmp-blocked", Proto::Icmp, v4, None, 600);
    answered.expect_blocked = true;
    let plan = Plan {
        checks: vec![
            check(
                "p/icmp4",
                Proto::Icmp,
                v4,
                Some("echo reply from 127.0.0.1"),
                3000,
            ),
            check(
                "p/icmp6",
                Proto::Icmp,
                v6,
                Some("echo reply from ::1"),
                3000,
            ),
            answered,
        ],
    };
    let r = run_plan(&plan).await;
    for o in &r.results[..2] {
        assert!(o.ok, "{o:?}");
    }
    let o = &r.results[2];
    assert!(!o.ok, "{o:?}");
    assert!(
        o.error
            .as_deref()
            .unwrap_or("")
            .contains("expected no answer (blocked)"),
        "{o:?}"
    );
}

/// SCTP on loopback (v4 and v6), on raw sockets, so it runs on kernels without SCTP:
/// a served port answers the server's name, an unserved one stays silent (a blocked
/// check passes), and a blocked check against a served port fails on the answer.
/// Root only: elsewhere this test says SKIP, under CI it must run.
#[tokio::test]
async fn sctp_init_is_answered_with_the_name_and_other_ports_stay_silent() {
    if !root_or_skip("sctp_init_is_answered_with_the_name_and_other_ports_stay_silent") {
        return;
    }
    for (bind, host) in [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")] {
        let bind: IpAddr = bind.parse().unwrap();
        let cfg = ServerConfig {
            name: "echo-s".into(),
            bind,
            tcp_port: 0,
            udp_port: 0,
            http_port: 0,
        };
        let srv = Server::bind(&cfg)
            .await
            .expect("bind")
            .with_sctp(bind, [7001, 7002].into())
            .expect("sctp");
        assert!(
            srv.ready_line()
                .unwrap()
                .contains(" sctp 7001,7002 as echo-s"),
            "{}",
            srv.ready_line().unwrap()
        );
        let stop = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(srv.serve(async move {
            let _ = stop.1.await;
        }));
        let at = |port: u16| format!("{host}:{port}").parse::<SocketAddr>().unwrap();
        let mut silent = check("s/unserved", Proto::Sctp, at(7003), None, 700);
        silent.expect_blocked = true;
        let mut answered = check("s/blocked-but-served", Proto::Sctp, at(7002), None, 700);
        answered.expect_blocked = true;
        let plan = Plan {
            checks: vec![
                check("s/7001", Proto::Sctp, at(7001), Some("echo-s"), 3000),
                check("s/7002", Proto::Sctp, at(7002), Some("echo-s"), 3000),
                silent,
                answered,
            ],
        };
        let r = run_plan(&plan).await;
        for o in &r.results[..3] {
            assert!(o.ok, "{bind}: {o:?}");
        }
        assert_eq!(r.results[0].answer.as_deref(), Some("echo-s"));
        let o = &r.results[3];
        assert!(!o.ok, "{bind}: {o:?}");
        assert!(
            o.error
                .as_deref()
                .unwrap_or("")
                .contains("expected no answer (blocked)"),
            "{o:?}"
        );
        let _ = stop.0.send(());
        task.await.unwrap().unwrap();
    }
}
