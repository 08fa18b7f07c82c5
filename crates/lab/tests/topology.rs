//! Privileged tests of the lab topology builder against the real kernel.
//!
//! They need root plus `ip` (iproute2) and `ping` (iputils-ping). Under CI a missing
//! prerequisite fails the test; elsewhere it is skipped with a `SKIP` line (the test kit's gate). Each test
//! uses its own topology name (so tests run in parallel), and `iproute2`, `ping` and
//! `/proc` serve as independent oracles for what the kernel holds.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::Ipv4Addr;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cozyplane_datapath::netlink::{create_named_netns, named_netns_path};
use cozyplane_lab::{
    bind_tcp_in, destroy_by_prefix, exec_in, wait_for, LabError, LabHost, Topology, TopologySpec,
};
use cozyplane_testkit::{needs, tools};

// ---------------------------------------------------------------------------------------
// Harness

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A topology name unique to this test process and call (`l<pid><seq>`, ≤ 10 chars).
fn unique_name() -> String {
    format!(
        "l{}x{}",
        std::process::id() % 1_000_000,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs a host command and returns stdout; panics with stderr on failure.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One ping from `host` to `ip`: true if answered.
fn pings(host: &impl LabHost, ip: Ipv4Addr) -> bool {
    let ip = ip.to_string();
    exec_in(host, &["ping", "-c", "1", "-W", "1", "-q", &ip])
        .unwrap_or_else(|e| panic!("ping from {}: {e}", host.name()))
        .status
        .success()
}

/// A ping that may need a moment for ARP and the bridge to learn: retried up to 3 s.
fn reaches(host: &impl LabHost, ip: Ipv4Addr) -> bool {
    wait_for(
        &format!("{} to reach {ip}", host.name()),
        Duration::from_secs(3),
        || pings(host, ip),
    )
    .is_ok()
}

/// Everything of topology `name` visible from the host: `/run/netns` entries,
/// `ip netns list` lines, host links, and mounts carrying the prefix.
fn leftovers(name: &str) -> Vec<String> {
    let ours = |s: &str| s.starts_with(&format!("{name}-")) || s == name;
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/run/netns") {
        for e in dir.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if ours(&n) {
                out.push(format!("/run/netns/{n}"));
            }
        }
    }
    for line in run("ip", &["netns", "list"]).lines() {
        if line.split_whitespace().next().is_some_and(ours) {
            out.push(format!("ip netns list: {line}"));
        }
    }
    for line in run("ip", &["-o", "link"]).lines() {
        // "<idx>: <name>[@peer]: <flags> …"
        let ifname = line.split(": ").nth(1).unwrap_or("");
        let ifname = ifname.split('@').next().unwrap_or("");
        if ours(ifname) {
            out.push(format!("host link: {line}"));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mountinfo.lines() {
        let point = line.split(' ').nth(4).unwrap_or("");
        let last = point.rsplit('/').next().unwrap_or("");
        if ours(last) || point.contains(&format!("/cozyplane-lab/{name}")) {
            out.push(format!("mount: {point}"));
        }
    }
    if std::path::Path::new("/run/cozyplane-lab")
        .join(name)
        .exists()
    {
        out.push(format!("run dir /run/cozyplane-lab/{name}"));
    }
    out
}

/// True while `pid` runs (a zombie has exited: it no longer holds its namespaces).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or("");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Waits (briefly) until `pid` has exited, so a broken kill fails fast instead of
/// hanging the test on a 300 s sleep.
fn gone(pid: u32) {
    wait_for(
        &format!("pid {pid} to exit"),
        Duration::from_secs(5),
        || !running(pid),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// An untracked process inside namespace `ns`, started the way a user would
/// (`ip netns exec`), so only discovery can find it.
fn untracked_sleep(ns: &str) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", ns, "sleep", "300"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_and_an_external_host_reach_each_other_over_the_underlay() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let name = unique_name();
    let started = std::time::Instant::now();
    let mut topo = Topology::build(TopologySpec::new(&name, 3)).await.unwrap();
    eprintln!("built 3 nodes + external in {:?}", started.elapsed());
    let ext = topo.external().unwrap();
    assert_eq!(topo.nodes().len(), 3);

    // What the kernel holds, read back with iproute2 and /proc inside each node.
    for node in topo.nodes() {
        let ns = node.name.as_str();
        let addr = run("ip", &["-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"]);
        assert!(addr.contains(&format!("{}/24", node.ip())), "{ns}: {addr}");
        let routes = run("ip", &["-n", ns, "-4", "route", "show", "default"]);
        assert!(
            routes.contains(&format!("default via {} dev eth0", node.gateway)),
            "{ns}: {routes}"
        );
        let link = run("ip", &["-n", ns, "-o", "link", "show", "dev", "eth0"]);
        assert!(
            link.contains("mtu 1500") && link.contains("state UP"),
            "{ns}: {link}"
        );
        for (key, want) in [
            ("ipv4/ip_forward", "1"),
            ("ipv4/conf/all/rp_filter", "0"),
            ("ipv4/conf/default/rp_filter", "0"),
            ("ipv4/conf/eth0/rp_filter", "0"),
        ] {
            let path = format!("/proc/sys/net/{key}");
            let out = exec_in(node, &["cat", &path]).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                want,
                "{ns}: {key}"
            );
        }
        assert_eq!(topo.node_ip(ns).unwrap(), node.ip());
    }
    let fabric = topo.fabric().unwrap().name.clone();
    let ports = run(
        "ip",
        &[
            "-n",
            &fabric,
            "-o",
            "link",
            "show",
            "master",
            &format!("{name}-br"),
        ],
    );
    for i in 1..=3 {
        assert!(ports.contains(&format!("{name}-n{i}@")), "{ports}");
    }
    assert!(matches!(topo.node_ip("nope"), Err(LabError::NoSuchNode(_))));

    // Full mesh over the underlay, plus every node to and from the external host.
    for a in topo.nodes() {
        for b in topo.nodes() {
            if a.name != b.name {
                assert!(reaches(a, b.ip()), "{} cannot reach {}", a.name, b.name);
            }
        }
        assert!(
            reaches(a, ext.ip),
            "{} cannot reach the external host",
            a.name
        );
        assert!(
            reaches(ext, a.ip()),
            "external host cannot reach {}",
            a.name
        );
    }

    let started = std::time::Instant::now();
    // The async variant, as async tests would use it.
    let out = cozyplane_lab::exec_in_async(
        &topo.nodes()[0],
        &["ip", "-4", "-o", "addr", "show", "dev", "eth0"],
    )
    .await
    .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("198.18.0.11/24"));
    let err = exec_in(&topo.nodes()[0], &[]).unwrap_err();
    assert!(err.to_string().contains("empty command"), "{err}");

    let report = topo.destroy().unwrap();
    eprintln!("destroyed in {:?}", started.elapsed());
    assert_eq!(report.netns.len(), 5, "{report:?}");
    assert_eq!(leftovers(&name), Vec::<String>::new());
    assert!(topo.nodes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_is_sealed_off_from_the_host_and_the_external_host_from_pods() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let name = unique_name();
    let topo = Topology::build(TopologySpec::new(&name, 2)).await.unwrap();
    let ext = topo.external().unwrap();
    let node = &topo.nodes()[0];

    // No lab link is in the host.
    let host_links = run("ip", &["-o", "link"]);
    assert!(!host_links.contains(&format!("{name}-")), "{host_links}");

    // The external host routes only to the underlay: nothing to pod CIDRs, no default.
    let routes = run("ip", &["-n", &ext.name, "-4", "route", "show"]);
    let mut lines: Vec<&str> = routes.lines().map(str::trim).collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{routes}");
    assert!(
        lines[0].starts_with("198.18.0.0/24 via 198.19.0.1 dev eth0"),
        "{routes}"
    );
    assert!(lines[1].starts_with("198.19.0.0/24 dev eth0"), "{routes}");
    for pod_ip in ["10.244.1.5", "10.0.0.1", "172.16.0.1", "8.8.8.8"] {
        let out = Command::new("ip")
            .args(["-n", &ext.name, "route", "get", pod_ip])
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "external host has a route to {pod_ip}"
        );
    }

    // Neither the external host nor a node reaches any of the host's own addresses.
    let host_addrs = run("ip", &["-4", "-o", "addr", "show"]);
    let host_ips: Vec<Ipv4Addr> = host_addrs
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
        .filter(|ip: &Ipv4Addr| !ip.is_loopback())
        .collect();
    for ip in &host_ips {
        assert!(!pings(ext, *ip), "external host reaches host address {ip}");
        assert!(!pings(node, *ip), "{} reaches host address {ip}", node.name);
    }
    // And the host does not reach the lab.
    let out = Command::new("ping")
        .args(["-c", "1", "-W", "1", "-q", &node.ip().to_string()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "host reaches {}", node.ip());
    // Sanity: the same ping does work inside the lab, so the negatives above mean something.
    assert!(reaches(ext, node.ip()));

    // What the masquerade tests rely on: traffic from a node address is answered,
    // traffic from a pod address (not masqueraded) reaches the external host but gets
    // no reply, because the external host has no route back to pods.
    run(
        "ip",
        &[
            "-n",
            &node.name,
            "addr",
            "add",
            "10.244.1.5/32",
            "dev",
            "lo",
        ],
    );
    let ext_ip = ext.ip.to_string();
    let from = |src: &str| {
        exec_in(
            node,
            &["ping", "-c", "1", "-W", "1", "-q", "-I", src, &ext_ip],
        )
        .unwrap()
        .status
        .success()
    };
    assert!(from(&node.ip().to_string()));
    assert!(
        !from("10.244.1.5"),
        "the external host answered a pod address"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_removes_namespaces_mounts_and_processes_and_is_idempotent() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let name = unique_name();
    let mut topo = Topology::build(TopologySpec::new(&name, 2)).await.unwrap();
    let node = &topo.nodes()[1];

    // A tracked process: it really runs inside the node (its view of eth0).
    let mut tracked = topo
        .spawn_in_node(node, Command::new("sleep").arg("300"))
        .unwrap();
    let probe = topo
        .spawn_in_node(
            node,
            Command::new("ip")
                .args(["-4", "-o", "addr", "show", "dev", "eth0"])
                .stdout(Stdio::piped()),
        )
        .unwrap()
        .wait_with_output()
        .unwrap();
    let seen = String::from_utf8_lossy(&probe.stdout);
    assert!(seen.contains(&node.ip().to_string()), "{seen}");
    let state = std::fs::read_to_string(topo.run_dir().join("state.json")).unwrap();
    assert!(
        state.contains(&format!("\"pid\": {}", tracked.id())),
        "{state}"
    );

    // An untracked one, found only by its namespace.
    let mut stray = untracked_sleep(&node.name);
    let stray_pid = stray.id();
    wait_for(
        "the stray to enter the node",
        Duration::from_secs(5),
        || {
            let ns = std::fs::metadata(named_netns_path(&topo.nodes()[1].name)).ok();
            let inside = std::fs::metadata(format!("/proc/{stray_pid}/ns/net")).ok();
            use std::os::unix::fs::MetadataExt;
            matches!((ns, inside), (Some(a), Some(b)) if a.ino() == b.ino())
        },
    )
    .unwrap();

    let report = topo.destroy().unwrap();
    assert!(
        report
            .processes
            .contains(&(i32::try_from(tracked.id()).unwrap())),
        "{report:?}"
    );
    assert!(
        report
            .processes
            .contains(&(i32::try_from(stray_pid).unwrap())),
        "{report:?}"
    );
    gone(tracked.id());
    gone(stray_pid);
    assert_eq!(tracked.wait().unwrap().signal(), Some(libc::SIGKILL));
    stray.wait().unwrap();
    assert_eq!(leftovers(&name), Vec::<String>::new());

    // Twice is fine, through either door.
    assert!(topo.destroy().unwrap().is_empty());
    assert!(destroy_by_prefix(&name).unwrap().is_empty());
    drop(topo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_by_prefix_cleans_up_after_a_crash() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let name = unique_name();
    let topo = Topology::build(TopologySpec::new(&name, 3)).await.unwrap();
    let mut child = topo
        .spawn_in_node(&topo.nodes()[0], Command::new("sleep").arg("300"))
        .unwrap();
    let pid = child.id();
    // The crash: no destroy, no Drop.
    std::mem::forget(topo);
    assert_eq!(
        leftovers(&name)
            .iter()
            .filter(|l| l.starts_with("/run/netns/"))
            .count(),
        5,
        "the crash should have left the namespaces behind"
    );
    assert!(running(pid));

    let report = destroy_by_prefix(&name).unwrap();
    assert_eq!(report.netns.len(), 5, "{report:?}");
    assert!(
        report.processes.contains(&i32::try_from(pid).unwrap()),
        "{report:?}"
    );
    gone(pid);
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_eq!(leftovers(&name), Vec::<String>::new());
    assert!(destroy_by_prefix(&name).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_topologies_with_the_same_ranges_coexist() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let (a, b) = (unique_name(), unique_name());
    let (ta, tb) = tokio::join!(
        Topology::build(TopologySpec::new(&a, 2)),
        Topology::build(TopologySpec::new(&b, 2))
    );
    let mut ta = ta.unwrap();
    let tb = tb.unwrap();
    // Same addresses, separate worlds.
    assert_eq!(ta.nodes()[1].ip(), tb.nodes()[1].ip());
    assert!(reaches(&ta.nodes()[0], ta.nodes()[1].ip()));
    assert!(reaches(&tb.nodes()[0], tb.nodes()[1].ip()));
    // Prove the separation: take a's node2 down; b's node2, same address, still answers.
    run(
        "ip",
        &["-n", &ta.nodes()[1].name, "link", "set", "eth0", "down"],
    );
    assert!(!pings(&ta.nodes()[0], ta.nodes()[1].ip()));
    assert!(reaches(&tb.nodes()[0], tb.nodes()[1].ip()));

    ta.destroy().unwrap();
    assert_eq!(leftovers(&a), Vec::<String>::new());
    assert!(
        reaches(&tb.nodes()[0], tb.nodes()[1].ip()),
        "destroying a hurt b"
    );
    drop(tb); // the Drop guard
    assert_eq!(leftovers(&b), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_name_is_refused_and_nothing_is_touched() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let name = unique_name();
    let topo = Topology::build(TopologySpec::new(&name, 1)).await.unwrap();
    let err = Topology::build(TopologySpec::new(&name, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, LabError::AlreadyExists { .. }), "{err}");
    // The running topology is intact.
    assert!(reaches(&topo.nodes()[0], topo.fabric().unwrap().router_ip));
    drop(topo);

    // A leftover namespace with the prefix (a crashed run without state) is refused,
    // not adopted, and left alone, and no run directory is left behind.
    let other = unique_name();
    let leftover = format!("{other}-node1");
    let _ns = create_named_netns(&leftover).unwrap();
    let err = Topology::build(TopologySpec::new(&other, 2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&leftover), "{err}");
    assert!(named_netns_path(&leftover).exists());
    assert!(!std::path::Path::new("/run/cozyplane-lab")
        .join(&other)
        .exists());
    // Discovery alone (no state file) removes it.
    let report = destroy_by_prefix(&other).unwrap();
    assert_eq!(report.netns, vec![leftover]);
    assert_eq!(leftovers(&other), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_topology_with_pin_dirs_is_removed_by_name_later() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let name = unique_name();
    let mut spec = TopologySpec::new(&name, 1);
    spec.external = false;
    let topo = Topology::build(spec).await.unwrap();
    assert!(topo.external().is_none());
    // A pin directory as an agent would have it (a plain directory stands in for bpffs).
    let pins = std::env::temp_dir().join(format!("{name}-pins"));
    topo.record_pin_dir(&pins).unwrap();
    std::fs::create_dir_all(pins.join("maps")).unwrap();
    std::fs::write(pins.join("maps/m"), "pin").unwrap();
    let mut child = topo
        .spawn_in_node(&topo.nodes()[0], Command::new("sleep").arg("300"))
        .unwrap();

    // `lab up` exits, the lab stays.
    let detached = topo.detach();
    assert_eq!(detached, name);
    let left = leftovers(&name);
    assert_eq!(
        left.iter().filter(|l| l.starts_with("/run/netns/")).count(),
        2,
        "{left:?}"
    );
    assert!(
        cozyplane_lab::known_topologies(std::path::Path::new("/run/cozyplane-lab"))
            .unwrap()
            .contains(&name)
    );
    assert!(running(child.id()));

    // `lab down`, from anywhere.
    let report = destroy_by_prefix(&name).unwrap();
    assert!(report.dirs.contains(&pins), "{report:?}");
    assert!(
        report
            .processes
            .contains(&i32::try_from(child.id()).unwrap()),
        "{report:?}"
    );
    assert!(!pins.exists());
    gone(child.id());
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_eq!(leftovers(&name), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_address_in_the_fabric_serves_every_node() {
    if !needs!().root().tools(tools::NETNS).ready() {
        return;
    }
    let name = unique_name();
    let topo = Topology::build(TopologySpec::new(&name, 2)).await.unwrap();
    let ip = topo.add_service_address(1).await.unwrap();
    assert_eq!(ip, Ipv4Addr::new(198, 18, 0, 2));
    assert_eq!(
        topo.add_service_address(1).await.unwrap(),
        ip,
        "not idempotent"
    );
    assert!(matches!(
        topo.add_service_address(10).await,
        Err(LabError::InvalidSpec(_))
    ));

    // A server in this (host) process, its socket in the fabric namespace.
    let listener = bind_tcp_in(topo.fabric().unwrap(), (ip, 0).into()).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let mut peers = Vec::new();
        for _ in 0..2 {
            let (mut conn, peer) = listener.accept().unwrap();
            std::io::Write::write_all(&mut conn, b"hello").unwrap();
            peers.push(peer.ip());
        }
        peers
    });
    // Every node connects with a plain client (bash's /dev/tcp), from its own address.
    for node in topo.nodes() {
        let script = format!("exec 3<>/dev/tcp/{ip}/{port} && head -c 5 <&3");
        let out = exec_in(node, &["timeout", "5", "bash", "-c", &script]).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello",
            "{}",
            node.name
        );
    }
    let peers = server.join().unwrap();
    let want: Vec<std::net::IpAddr> = topo.nodes().iter().map(|n| n.ip().into()).collect();
    assert_eq!(peers, want);
    // Not reachable from the host: the listener lives in the fabric only.
    let host = std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_millis(300));
    assert!(host.is_err(), "the host reached a fabric service");
    // Nor from the external host (the outside world), though it routes to the
    // underlay: the router answers "prohibited" for service addresses arriving on
    // the external segment, yet still forwards it to the nodes.
    // (The kernel answers pings of any local address, so a ping is the probe.)
    let ext = topo.external().unwrap();
    assert!(!pings(ext, ip), "the external host pings a service address");
    assert!(
        reaches(ext, topo.nodes()[0].ip()),
        "the external host lost the nodes"
    );
    let rules = run(
        "ip",
        &["-n", &topo.fabric().unwrap().name, "-4", "rule", "show"],
    );
    let refusals = rules
        .lines()
        .filter(|l| l.contains(&format!("to {ip} iif {name}-ext")) && l.ends_with("prohibit"))
        .count();
    assert_eq!(refusals, 1, "one refusal rule after two calls: {rules}");
    assert_eq!(rules.matches("lookup local").count(), 1, "{rules}");
}
