//! Socket-level load balancing on the real kernel (`bpf/service.h`): the
//! cgroup programs attached to a private cgroup, a client process moved into
//! it (this test binary, re-executed), real TCP and UDP sockets on loopback.
//! Needs root.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bpf_support::*;
use cozyplane_datapath::abi::{
    Addr128, Affinity, AffinityKey, Backend, SockRevKey, Svc, SvcKey, SVC_F_AFFINITY,
    SVC_SCOPE_EXTERNAL, SVC_SCOPE_INTERNAL,
};
use cozyplane_datapath::netlink::{create_named_netns, delete_named_netns, Netns};
use cozyplane_datapath::service::{DesiredFrontend, SvcDesired};
use cozyplane_datapath::{detach_socket_lb, ensure_cgroup2, Datapath};

const CHILD_ENV: &str = "COZYPLANE_SOCKLB_CHILD";
/// A TEST-NET-1 address: nothing answers it unless the programs translate it.
const VIP: &str = "192.0.2.10";
const VIP6: &str = "2001:db8::10";

/// The client half, run by the re-executed test binary inside the cgroup.
/// `COZYPLANE_SOCKLB_CHILD` = `<cgroup dir>|<op>|<addr>|<count>`; prints one
/// `RESULT ...` line per attempt. A no-op in a normal run.
#[test]
fn child_client() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let (cgroup, op, addr, count) = (parts[0], parts[1], parts[2], parts[3]);
    std::fs::write(
        Path::new(cgroup).join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .expect("join the cgroup");
    let addr: SocketAddr = addr.parse().unwrap();
    for _ in 0..count.parse::<usize>().unwrap() {
        match op {
            "tcp" => match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(mut s) => {
                    let peer = s.peer_addr().unwrap();
                    s.write_all(b"ping\n").unwrap();
                    let mut line = String::new();
                    BufReader::new(&mut s).read_line(&mut line).unwrap();
                    println!("RESULT ok peer={peer} reply={}", line.trim());
                }
                Err(e) => println!("RESULT err={:?}", e.kind()),
            },
            "udp" => {
                let bind: SocketAddr = if addr.is_ipv4() {
                    "0.0.0.0:0".parse().unwrap()
                } else {
                    "[::]:0".parse().unwrap()
                };
                let s = UdpSocket::bind(bind).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                match s.send_to(b"ping", addr) {
                    Ok(_) => {
                        let mut buf = [0u8; 64];
                        match s.recv_from(&mut buf) {
                            Ok((n, from)) => println!(
                                "RESULT ok from={from} reply={}",
                                String::from_utf8_lossy(&buf[..n])
                            ),
                            Err(e) => println!("RESULT err={:?}", e.kind()),
                        }
                    }
                    Err(e) => println!("RESULT err={:?}", e.kind()),
                }
            }
            // Translated now, reversed later: connect (or send), say HELD, wait for a
            // line on stdin, then getpeername (or receive the reply).
            "tcp-hold" => {
                let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
                hold();
                println!("RESULT peer={}", s.peer_addr().unwrap());
            }
            "udp-conn-hold" => {
                let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                s.connect(addr).unwrap();
                s.send(b"ping").unwrap();
                hold();
                let mut buf = [0u8; 64];
                let (n, from) = s.recv_from(&mut buf).unwrap();
                println!(
                    "RESULT from={from} reply={}",
                    String::from_utf8_lossy(&buf[..n])
                );
            }
            "udp-hold" => {
                let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                s.send_to(b"ping", addr).unwrap();
                hold();
                let mut buf = [0u8; 64];
                let (n, from) = s.recv_from(&mut buf).unwrap();
                println!(
                    "RESULT from={from} reply={}",
                    String::from_utf8_lossy(&buf[..n])
                );
            }
            other => panic!("unknown op {other}"),
        }
    }
}

/// Tells the parent the socket is set up and waits for its go (a line on stdin).
fn hold() {
    println!("HELD");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
}

/// A cgroup of our own under a private cgroup2 mount, removed on drop.
struct Cgroup {
    mount: PathBuf,
    dir: PathBuf,
}

impl Cgroup {
    fn new(name: &str) -> Self {
        let mount = std::env::temp_dir().join(format!("cp-cg2-{name}-{}", std::process::id()));
        ensure_cgroup2(&mount).expect("mount cgroup2");
        let dir = mount.join(format!("cp-socklb-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { mount, dir }
    }

    /// Runs `op` against `addr` `count` times from a process in the cgroup.
    fn run(&self, op: &str, addr: &str, count: usize) -> Vec<String> {
        self.run_in(None, op, addr, count)
    }

    /// Like [`Cgroup::run`], from inside network namespace `netns` if given.
    fn run_in(&self, netns: Option<&Netns>, op: &str, addr: &str, count: usize) -> Vec<String> {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_client", "--nocapture", "--test-threads=1"])
            .env(
                CHILD_ENV,
                format!("{}|{op}|{addr}|{count}", self.dir.display()),
            );
        if let Some(ns) = netns {
            ns.enter_before_exec(&mut cmd).unwrap();
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let results: Vec<String> = stdout
            .lines()
            // The harness prints "test child_client ... " before the first line.
            .filter_map(|l| l.find("RESULT ").map(|i| l[i + 7..].to_string()))
            .collect();
        assert_eq!(results.len(), count, "{stdout}");
        results
    }
}

impl Cgroup {
    /// Runs a `*-hold` `op` against `addr` from a process in the cgroup inside `netns`:
    /// calls `between` once the socket is translated, then lets the child reverse it.
    fn run_held(&self, netns: &Netns, op: &str, addr: &str, between: impl FnOnce()) -> String {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "child_client", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{}|{op}|{addr}|1", self.dir.display()))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        netns.enter_before_exec(&mut cmd).unwrap();
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            assert_ne!(out.read_line(&mut line).unwrap(), 0, "child ended: {seen}");
            seen.push_str(&line);
            if line.contains("HELD") {
                break;
            }
        }
        between();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin).unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert!(
            child.wait().unwrap().success(),
            "child failed: {seen}{rest}"
        );
        rest.lines()
            .find_map(|l| l.find("RESULT ").map(|i| l[i + 7..].to_string()))
            .unwrap_or_else(|| panic!("no result: {seen}{rest}"))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
        if let Ok(c) = std::ffi::CString::new(self.mount.as_os_str().as_encoded_bytes()) {
            // SAFETY: `c` is a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// A TCP server answering every line with `<name>`.
fn tcp_backend(ip: &str, name: &'static str) -> SocketAddr {
    serve_tcp(
        TcpListener::bind((ip.parse::<IpAddr>().unwrap(), 0)).unwrap(),
        name,
    )
}

/// Answers every connection to `l` with `<name>`.
fn serve_tcp(l: TcpListener, name: &'static str) -> SocketAddr {
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 16];
                if s.read(&mut buf).is_ok() {
                    let _ = writeln!(s, "{name}");
                }
            });
        }
    });
    addr
}

/// A UDP server answering every datagram with `<name>`.
fn udp_backend(ip: &str, name: &'static str) -> SocketAddr {
    serve_udp(
        UdpSocket::bind((ip.parse::<IpAddr>().unwrap(), 0)).unwrap(),
        name,
    )
}

/// Answers every datagram to `s` with `<name>`.
fn serve_udp(s: UdpSocket, name: &'static str) -> SocketAddr {
    let addr = s.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok((_, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(name.as_bytes(), from);
        }
    });
    addr
}

/// Programs frontend `vip:port` (`proto`, `scope`) with `backends` as ids
/// `first_id..`, its range at slot `base`, reverse id `rev_id`.
#[allow(clippy::too_many_arguments)]
fn program(
    dp: &mut Datapath,
    vip: &str,
    port: u16,
    proto: u8,
    scope: u8,
    rev_id: u32,
    base: u32,
    first_id: u32,
    backends: &[SocketAddr],
    flags: u32,
    affinity_s: u32,
) {
    let ids: Vec<u32> = (first_id..).take(backends.len()).collect();
    for (id, b) in ids.iter().zip(backends) {
        dp.svc
            .backends
            .insert(id, &Backend::new(0, b.ip(), b.port(), proto, 0))
            .unwrap();
    }
    dp.svc.put_slots(base, &ids).unwrap();
    let vip: IpAddr = vip.parse().unwrap();
    dp.svc
        .revs
        .insert(&rev_id, &Backend::new(0, vip, port, proto, 0))
        .unwrap();
    dp.svc
        .frontends
        .insert(
            &SvcKey::new(0, vip, port, proto, scope),
            &Svc {
                rev_id,
                base,
                count: backends.len() as u32,
                flags,
                affinity_s,
                ..Svc::default()
            },
        )
        .unwrap();
}

fn setup(name: &str) -> Option<(PinDir, Datapath, Cgroup)> {
    if !needs!().root().ready() {
        return None;
    }
    let pins = PinDir::new(name);
    let mut dp = Datapath::load(pins.path()).expect("load");
    let cg = Cgroup::new(name);
    dp.attach_socket_lb(&cg.dir, pins.path())
        .expect("attach socket-LB");
    Some((pins, dp, cg))
}

#[test]
fn tcp_connects_to_a_service_reach_its_backends_and_see_the_service_as_peer() {
    let Some((pins, mut dp, cg)) = setup("tcp") else {
        return;
    };
    let a = tcp_backend("127.0.0.1", "a");
    let b = tcp_backend("127.0.0.2", "b");
    program(
        &mut dp,
        VIP,
        80,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        1,
        0,
        10,
        &[a, b],
        0,
        0,
    );

    let results = cg.run("tcp", &format!("{VIP}:80"), 24);
    let (mut seen_a, mut seen_b) = (0, 0);
    for r in &results {
        // getpeername() says the Service, whichever backend answered.
        assert!(r.starts_with(&format!("ok peer={VIP}:80 reply=")), "{r}");
        if r.ends_with("reply=a") {
            seen_a += 1;
        } else if r.ends_with("reply=b") {
            seen_b += 1;
        }
    }
    assert_eq!(seen_a + seen_b, 24, "{results:?}");
    // Random picks over 24 connects: both backends (a miss has odds 2^-23).
    assert!(seen_a > 0 && seen_b > 0, "{results:?}");

    // A process outside the cgroup is not translated: nothing answers the VIP.
    let outside = TcpStream::connect_timeout(
        &format!("{VIP}:80").parse().unwrap(),
        Duration::from_millis(300),
    );
    assert!(outside.is_err(), "{outside:?}");

    // The wire scope is not what sockets see: a port only there is not translated.
    program(
        &mut dp,
        VIP,
        81,
        PROTO_TCP,
        SVC_SCOPE_EXTERNAL,
        2,
        2,
        20,
        &[a],
        0,
        0,
    );
    let r = cg.run("tcp", &format!("{VIP}:81"), 1);
    assert!(r[0].starts_with("err="), "{r:?}");

    // Detached: the VIP is dead again from inside too.
    assert_eq!(detach_socket_lb(pins.path()).unwrap(), 8);
    let r = cg.run("tcp", &format!("{VIP}:80"), 1);
    assert!(r[0].starts_with("err="), "{r:?}");
}

#[test]
fn a_service_without_backends_refuses_at_once() {
    let Some((_pins, mut dp, cg)) = setup("empty") else {
        return;
    };
    program(
        &mut dp,
        VIP,
        80,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        1,
        0,
        10,
        &[],
        0,
        0,
    );
    let r = cg.run("tcp", &format!("{VIP}:80"), 1);
    assert_eq!(r, ["err=PermissionDenied"]);
}

#[test]
fn udp_replies_come_from_the_service_address() {
    let Some((_pins, mut dp, cg)) = setup("udp") else {
        return;
    };
    let u = udp_backend("127.0.0.1", "dns");
    program(
        &mut dp,
        VIP,
        53,
        PROTO_UDP,
        SVC_SCOPE_INTERNAL,
        1,
        0,
        10,
        &[u],
        0,
        0,
    );
    let r = cg.run("udp", &format!("{VIP}:53"), 3);
    for line in &r {
        assert_eq!(line, &format!("ok from={VIP}:53 reply=dns"));
    }
    // A TCP frontend does not take UDP to its address and port.
    let t = tcp_backend("127.0.0.1", "tcp");
    program(
        &mut dp,
        VIP,
        54,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        2,
        1,
        20,
        &[t],
        0,
        0,
    );
    let r = cg.run("udp", &format!("{VIP}:54"), 1);
    assert!(r[0].starts_with("err="), "{r:?}");
}

#[test]
fn ipv6_services_and_v4_services_through_dual_stack_sockets() {
    let Some((_pins, mut dp, cg)) = setup("v6") else {
        return;
    };
    let a = tcp_backend("::1", "six");
    program(
        &mut dp,
        VIP6,
        80,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        1,
        0,
        10,
        &[a],
        0,
        0,
    );
    let r = cg.run("tcp", &format!("[{VIP6}]:80"), 1);
    assert_eq!(r, [format!("ok peer=[{VIP6}]:80 reply=six")]);
    let u = udp_backend("::1", "six-udp");
    program(
        &mut dp,
        VIP6,
        53,
        PROTO_UDP,
        SVC_SCOPE_INTERNAL,
        2,
        1,
        20,
        &[u],
        0,
        0,
    );
    let r = cg.run("udp", &format!("[{VIP6}]:53"), 1);
    assert_eq!(r, [format!("ok from=[{VIP6}]:53 reply=six-udp")]);
    // A v4 Service from an IPv6 socket (::ffff:a.b.c.d): std connects v4
    // addresses over AF_INET, so send from a v6 UDP socket instead.
    let u4 = udp_backend("127.0.0.1", "mapped");
    program(
        &mut dp,
        VIP,
        53,
        PROTO_UDP,
        SVC_SCOPE_INTERNAL,
        3,
        2,
        30,
        &[u4],
        0,
        0,
    );
    let r = cg.run("udp", &format!("[::ffff:{VIP}]:53"), 1);
    assert_eq!(r, [format!("ok from=[::ffff:{VIP}]:53 reply=mapped")]);
}

#[test]
fn client_ip_affinity_keeps_a_client_on_its_backend_until_it_expires() {
    let Some((_pins, mut dp, cg)) = setup("affinity") else {
        return;
    };
    let a = tcp_backend("127.0.0.1", "a");
    let b = tcp_backend("127.0.0.2", "b");
    program(
        &mut dp,
        VIP,
        80,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        7,
        0,
        10,
        &[a, b],
        SVC_F_AFFINITY,
        60,
    );

    let r = cg.run("tcp", &format!("{VIP}:80"), 12);
    let first = r[0].clone();
    assert!(
        r.iter().all(|x| *x == first),
        "one backend for the client: {r:?}"
    );
    // The pin is per network namespace and frontend: exactly one entry.
    let pins: Vec<(AffinityKey, Affinity)> = dp.svc.affinity.entries().unwrap();
    assert_eq!(pins.len(), 1, "{pins:?}");
    let (key, val) = pins[0];
    assert_eq!(key.rev_id, 7);
    assert_ne!(key.netns, 0);
    let pinned = if first.ends_with("reply=a") { 10 } else { 11 };
    assert_eq!(val.backend_id, pinned);

    // Pin the other backend: the datapath follows the map.
    let other = 21 - pinned;
    dp.svc
        .affinity
        .insert(
            &key,
            &Affinity {
                last_ns: val.last_ns,
                backend_id: other,
                slot: 0,
            },
        )
        .unwrap();
    let r = cg.run("tcp", &format!("{VIP}:80"), 4);
    let want = if other == 10 { "reply=a" } else { "reply=b" };
    assert!(r.iter().all(|x| x.ends_with(want)), "{r:?}");

    // An expired pin (last used at boot) to a backend that no longer exists
    // is ignored: the connect picks anew and succeeds.
    dp.svc
        .affinity
        .insert(
            &key,
            &Affinity {
                last_ns: 0,
                backend_id: 999,
                slot: 0,
            },
        )
        .unwrap();
    let r = cg.run("tcp", &format!("{VIP}:80"), 1);
    assert!(r[0].starts_with(&format!("ok peer={VIP}:80")), "{r:?}");
    let (_, now) = dp.svc.affinity.entries().unwrap()[0];
    assert!(now.backend_id == 10 || now.backend_id == 11, "{now:?}");
}

fn desired(vip: &str, port: u16, backends: &[SocketAddr]) -> SvcDesired {
    let vip: IpAddr = vip.parse().unwrap();
    [(
        SvcKey::new(0, vip, port, PROTO_TCP, SVC_SCOPE_INTERNAL),
        DesiredFrontend {
            addr: Backend::new(0, vip, port, PROTO_TCP, 0),
            backends: backends
                .iter()
                .map(|b| Backend::new(0, b.ip(), b.port(), PROTO_TCP, 0))
                .collect(),
            ..DesiredFrontend::default()
        },
    )]
    .into_iter()
    .collect()
}

#[test]
fn the_sync_programs_the_kernel_maps_and_a_reloaded_agent_rewrites_nothing() {
    let Some((pins, mut dp, cg)) = setup("sync") else {
        return;
    };
    let a = tcp_backend("127.0.0.1", "a");
    let b = tcp_backend("127.0.0.2", "b");
    let r = dp.svc.sync(&desired(VIP, 80, &[a])).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_eq!(
        cg.run("tcp", &format!("{VIP}:80"), 3),
        vec![format!("ok peer={VIP}:80 reply=a"); 3]
    );

    // The backend changes, synced as a change (the agent's path: the
    // mirror is trusted, only the named frontend is visited): new connects
    // go to the new one, and a is gone from the kernel's backend map.
    let want = desired(VIP, 80, &[b]);
    let changed = want.keys().copied().collect();
    let r = dp.svc.sync_changes(&want, &changed).unwrap();
    assert!(
        r.converged() && !r.full && r.frontends_written == 1,
        "{r:?}"
    );
    assert_eq!(
        cg.run("tcp", &format!("{VIP}:80"), 3),
        vec![format!("ok peer={VIP}:80 reply=b"); 3]
    );
    let kernel: Vec<Backend> = dp
        .svc
        .backends
        .entries()
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(kernel, want.values().next().unwrap().backends);

    // A restarted agent (a fresh load over the same pins, links still pinned)
    // finds everything in place and writes nothing; connects keep working.
    drop(dp);
    let mut dp = Datapath::load(pins.path()).expect("reload");
    let r = dp.svc.sync(&desired(VIP, 80, &[b])).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_eq!(
        (
            r.frontends_written,
            r.slots_written,
            r.backends_written,
            r.backends_removed
        ),
        (0, 0, 0, 0),
        "{r:?}"
    );
    assert_eq!(
        cg.run("tcp", &format!("{VIP}:80"), 1),
        vec![format!("ok peer={VIP}:80 reply=b")]
    );

    // Nothing desired: the frontend goes and the VIP is dead again.
    let r = dp.svc.sync(&SvcDesired::new()).unwrap();
    assert_eq!(r.frontends_removed, 1);
    assert!(dp.svc.backends.entries().unwrap().is_empty());
    assert!(dp.svc.revs.entries().unwrap().is_empty());
    assert!(cg.run("tcp", &format!("{VIP}:80"), 1)[0].starts_with("err="));
}

/// A named network namespace with `lo` up and `addrs` on it, deleted on drop:
/// a VPC pod's namespace.
struct PodNetns {
    name: String,
    ns: Netns,
}

impl PodNetns {
    fn new(name: &str, addrs: &[&str]) -> Self {
        let name = format!("cp-socklb-{name}-{}", std::process::id());
        let ns = create_named_netns(&name).expect("create netns");
        let ip = |args: &[&str]| {
            let st = Command::new("ip")
                .args(["-n", &name])
                .args(args)
                .status()
                .unwrap();
            assert!(st.success(), "ip {args:?}");
        };
        ip(&["link", "set", "lo", "up"]);
        for a in addrs {
            ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        Self { name, ns }
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        let _ = delete_named_netns(&self.name);
    }
}

/// The network namespace of a VPC pod sits in the same cgroup as net-0
/// sockets; its VPC may use the service CIDR, so one of its peers may have
/// the very address of a net-0 Service. Its sockets are looked up under its
/// own network (cp_netns): a net-0 frontend never rewrites them, while a
/// net-0 process beside it is still translated, and a frontend of its own
/// network is.
#[test]
fn a_vpc_pods_sockets_are_never_translated_against_net_0_frontends() {
    let Some((_pins, mut dp, cg)) = setup("vpc") else {
        return;
    };
    const NET: u32 = 7;
    // The VPC's own peer at the Service address (and a VPC backend).
    const VPC_BACKEND: &str = "198.51.100.7";
    let pod = PodNetns::new("vpc", &[VIP, VPC_BACKEND]);
    let peer_tcp = pod
        .ns
        .run(|| TcpListener::bind((VIP, 80)).unwrap())
        .unwrap();
    serve_tcp(peer_tcp, "vpc-peer");
    let peer_udp = pod.ns.run(|| UdpSocket::bind((VIP, 53)).unwrap()).unwrap();
    serve_udp(peer_udp, "vpc-dns");
    let vpc_backend = pod
        .ns
        .run(|| TcpListener::bind((VPC_BACKEND, 8081)).unwrap())
        .unwrap();
    let vpc_backend = serve_tcp(vpc_backend, "vpc-backend");

    // net-0 Services at VIP:80/tcp and VIP:53/udp, backends on this
    // namespace's loopback (nothing listens there inside the pod's).
    let a = tcp_backend("127.0.0.1", "a");
    let u = udp_backend("127.0.0.1", "dns");
    program(
        &mut dp,
        VIP,
        80,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        1,
        0,
        10,
        &[a],
        0,
        0,
    );
    program(
        &mut dp,
        VIP,
        53,
        PROTO_UDP,
        SVC_SCOPE_INTERNAL,
        2,
        1,
        20,
        &[u],
        0,
        0,
    );
    // A frontend of the VPC's own network at VIP:81.
    program_net(&mut dp, NET, VIP, 81, PROTO_TCP, 3, 2, 30, &[vpc_backend]);

    let cookie = pod.ns.cookie().expect("netns cookie");
    assert_ne!(cookie, Netns::current().unwrap().cookie().unwrap());
    dp.svc.put_netns(cookie, NET, 42).unwrap();

    // The VPC pod reaches its own peer, over TCP and UDP, and sees it as such.
    let r = cg.run_in(Some(&pod.ns), "tcp", &format!("{VIP}:80"), 3);
    assert_eq!(r, vec![format!("ok peer={VIP}:80 reply=vpc-peer"); 3]);
    let r = cg.run_in(Some(&pod.ns), "udp", &format!("{VIP}:53"), 2);
    assert_eq!(r, vec![format!("ok from={VIP}:53 reply=vpc-dns"); 2]);
    // Its own network's frontend is translated for it.
    let r = cg.run_in(Some(&pod.ns), "tcp", &format!("{VIP}:81"), 2);
    assert_eq!(r, vec![format!("ok peer={VIP}:81 reply=vpc-backend"); 2]);
    // Nothing was recorded for reversing against a net-0 frontend.
    assert!(dp
        .svc
        .sock_rev
        .entries()
        .unwrap()
        .iter()
        .all(|(_, rev)| *rev == 3));

    // A net-0 process in the same cgroup still gets the Services, and not
    // the VPC's frontend.
    let r = cg.run("tcp", &format!("{VIP}:80"), 2);
    assert_eq!(r, vec![format!("ok peer={VIP}:80 reply=a"); 2]);
    let r = cg.run("udp", &format!("{VIP}:53"), 1);
    assert_eq!(r, [format!("ok from={VIP}:53 reply=dns")]);
    let r = cg.run("tcp", &format!("{VIP}:81"), 1);
    assert!(r[0].starts_with("err="), "{r:?}");

    // An entry of another veth is not removed; the pod's own is, and then
    // the namespace is net 0 again: its connect is rewritten to the net-0
    // backend, which does not exist inside it.
    assert!(!dp.svc.delete_netns(cookie, Some(43)).unwrap());
    assert!(dp.svc.delete_netns(cookie, Some(42)).unwrap());
    let r = cg.run_in(Some(&pod.ns), "tcp", &format!("{VIP}:80"), 1);
    assert_eq!(r, ["err=ConnectionRefused"]);
    // Net 0 cannot be recorded.
    assert!(dp.svc.put_netns(cookie, 0, 42).is_err());
}

/// Programs a one-port frontend of network `net` (inside scope).
#[allow(clippy::too_many_arguments)]
fn program_net(
    dp: &mut Datapath,
    net: u32,
    vip: &str,
    port: u16,
    proto: u8,
    rev_id: u32,
    base: u32,
    first_id: u32,
    backends: &[SocketAddr],
) {
    let ids: Vec<u32> = (first_id..).take(backends.len()).collect();
    for (id, b) in ids.iter().zip(backends) {
        dp.svc
            .backends
            .insert(id, &Backend::new(net, b.ip(), b.port(), proto, 0))
            .unwrap();
    }
    dp.svc.put_slots(base, &ids).unwrap();
    let vip: IpAddr = vip.parse().unwrap();
    dp.svc
        .revs
        .insert(&rev_id, &Backend::new(net, vip, port, proto, 0))
        .unwrap();
    dp.svc
        .frontends
        .insert(
            &SvcKey::new(net, vip, port, proto, SVC_SCOPE_INTERNAL),
            &Svc {
                rev_id,
                base,
                count: backends.len() as u32,
                ..Svc::default()
            },
        )
        .unwrap();
}

/// A socket translated while its namespace counted as net 0 (say, opened before the
/// agent recorded it) is not reversed to the net-0 Service once the namespace is a
/// VPC's: the reverse hooks restore only a frontend of the socket's own network.
#[test]
fn a_vpc_pods_sockets_are_never_reversed_to_net_0_frontends() {
    let Some((_pins, mut dp, cg)) = setup("vpcrev") else {
        return;
    };
    const BACKEND: &str = "198.51.100.7";
    let pod = PodNetns::new("vpcrev", &[BACKEND]);
    let tcp = pod
        .ns
        .run(|| TcpListener::bind((BACKEND, 8082)).unwrap())
        .unwrap();
    let tcp = serve_tcp(tcp, "held");
    let udp = pod
        .ns
        .run(|| UdpSocket::bind((BACKEND, 5354)).unwrap())
        .unwrap();
    let udp = serve_udp(udp, "held");
    program(
        &mut dp,
        VIP,
        82,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        1,
        0,
        10,
        &[tcp],
        0,
        0,
    );
    program(
        &mut dp,
        VIP,
        54,
        PROTO_UDP,
        SVC_SCOPE_INTERNAL,
        2,
        1,
        20,
        &[udp],
        0,
        0,
    );
    let cookie = pod.ns.cookie().unwrap();

    // As net 0 the namespace is translated and sees the Service (the control).
    let r = cg.run_held(&pod.ns, "tcp-hold", &format!("{VIP}:82"), || {});
    assert_eq!(r, format!("peer={VIP}:82"));
    let r = cg.run_held(&pod.ns, "udp-hold", &format!("{VIP}:54"), || {});
    assert_eq!(r, format!("from={VIP}:54 reply=held"));

    // Recorded as a VPC's between the translation and the reverse: the socket
    // sees the address it is really connected to.
    let r = cg.run_held(&pod.ns, "tcp-hold", &format!("{VIP}:82"), || {
        dp.svc.put_netns(cookie, 7, 42).unwrap();
    });
    assert_eq!(r, format!("peer={tcp}"));
    dp.svc.delete_netns(cookie, None).unwrap();
    let r = cg.run_held(&pod.ns, "udp-hold", &format!("{VIP}:54"), || {
        dp.svc.put_netns(cookie, 7, 42).unwrap();
    });
    assert_eq!(r, format!("from={udp} reply=held"));
}

/// A connect()ed socket's reverse translation lives in the socket's own
/// storage (`cp_sock_own`): connection churn leaves `cp_sock_rev` empty (no
/// LRU eviction per connect), and a flood of that LRU (what churn of
/// unconnected sends does) cannot evict a live socket's translation. With
/// the LRU for every socket (the code before) both fail: the connects fill
/// it, and the flood evicts the held sockets' entries, whose peer and reply
/// source then show the backend.
#[test]
fn connected_sockets_keep_their_translation_whatever_the_lru_holds() {
    let Some((_pins, mut dp, cg)) = setup("own") else {
        return;
    };
    let a = tcp_backend("127.0.0.1", "a");
    let u = udp_backend("127.0.0.1", "held");
    program(
        &mut dp,
        VIP,
        80,
        PROTO_TCP,
        SVC_SCOPE_INTERNAL,
        1,
        0,
        10,
        &[a],
        0,
        0,
    );
    program(
        &mut dp,
        VIP,
        53,
        PROTO_UDP,
        SVC_SCOPE_INTERNAL,
        2,
        1,
        20,
        &[u],
        0,
        0,
    );

    let r = cg.run("tcp", &format!("{VIP}:80"), 40);
    assert_eq!(r, vec![format!("ok peer={VIP}:80 reply=a"); 40]);
    assert!(dp.svc.sock_rev.entries().unwrap().is_empty());

    let flood = |dp: &mut Datapath| {
        for i in 0..70_000u64 {
            let key = SockRevKey {
                cookie: u64::MAX - i,
                addr: Addr128::from_v4("198.51.100.1".parse().unwrap()),
                port: 9u16.to_be_bytes(),
                pad: [0; 6],
            };
            dp.svc.sock_rev.insert(&key, &1).unwrap();
        }
    };
    let here = Netns::current().unwrap();
    let r = cg.run_held(&here, "tcp-hold", &format!("{VIP}:80"), || flood(&mut dp));
    assert_eq!(r, format!("peer={VIP}:80"));
    let r = cg.run_held(&here, "udp-conn-hold", &format!("{VIP}:53"), || {
        flood(&mut dp)
    });
    assert_eq!(r, format!("from={VIP}:53 reply=held"));
    // an unconnected send still records in the LRU, and is reversed from it
    let r = cg.run("udp", &format!("{VIP}:53"), 1);
    assert_eq!(r, [format!("ok from={VIP}:53 reply=held")]);
    assert!(dp
        .svc
        .sock_rev
        .entries()
        .unwrap()
        .iter()
        .any(|(_, rev)| *rev == 2));
}
