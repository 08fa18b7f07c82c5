//! The default pod network end to end: real agents, the real CNI plugin,
//! the real kernel, the project's API server. See `support/mod.rs` for the
//! harness and its prerequisites (root, `ping`).
//!
//! Run: `cargo test -p cozyplane-agent --test pod_network -- --test-threads=1`
//! (the tests also serialise themselves: each builds a 3-node lab).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use cozyplane_testkit::{eventually, needs};
use support::*;

/// One lab at a time: the machine is small and the tests are heavy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_reach_pods_nodes_and_the_outside() {
    if !prerequisites(needs!()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let c = Cluster::start("cpnet1", 3).await;
    let a = c.add_pod(0);
    let b = c.add_pod(0); // same node as a
    let r = c.add_pod(1); // another node
    let fips = c.fabric_ips().await;
    assert_eq!(fips.len(), 3, "one FabricIP per pod");

    // cross-node and same-node pod <-> pod, ICMP / TCP / UDP; the server
    // always sees the client pod's own address (no NAT inside the cluster)
    assert!(ping(&a, r.ip), "a -> r (cross node) ICMP");
    assert!(ping(&r, a.ip), "r -> a (cross node) ICMP");
    assert!(ping(&a, b.ip), "a -> b (same node) ICMP");
    assert_eq!(tcp_echo(&r, r.ip, &a, 7001), a.ip, "a -> r TCP");
    assert_eq!(tcp_echo(&a, a.ip, &r, 7002), r.ip, "r -> a TCP");
    assert_eq!(tcp_echo(&b, b.ip, &a, 7003), a.ip, "a -> b TCP");
    assert_eq!(udp_echo(&r, r.ip, &a, 7004), a.ip, "a -> r UDP");
    assert_eq!(udp_echo(&b, b.ip, &a, 7005), a.ip, "a -> b UDP");

    // node <-> pod, both ways, local and remote
    let nodes = c.topo.nodes();
    assert!(ping(&nodes[0], a.ip), "node1 -> local pod");
    assert!(ping(&nodes[0], r.ip), "node1 -> remote pod");
    assert!(ping(&a, nodes[2].ip()), "pod -> remote node");
    assert_eq!(tcp_echo(&r, r.ip, &nodes[2], 7006), nodes[2].ip());
    assert_eq!(tcp_echo(&nodes[1], nodes[1].ip(), &a, 7007), a.ip);

    // pod -> external: masqueraded to the node address, replies delivered
    let ext = c.topo.external().expect("external host");
    assert!(ping(&a, ext.ip), "pod -> external ICMP");
    assert_eq!(
        tcp_echo(ext, ext.ip, &a, 7008),
        nodes[0].ip(),
        "external sees the node address"
    );
    assert_eq!(udp_echo(ext, ext.ip, &r, 7009), nodes[1].ip());

    // metrics: the map counts match what was plumbed
    assert_eq!(c.metric(0, "cozyplane_map_entries{map=\"cp_locals\"}"), 2);
    assert_eq!(c.metric(1, "cozyplane_map_entries{map=\"cp_locals\"}"), 1);
    assert_eq!(c.metric(1, "cozyplane_map_entries{map=\"cp_remotes\"}"), 2);
    assert!(c.metric(0, "cozyplane_map_memlock_bytes{map=\"cp_masq_fwd\"}") > 0);
    assert_eq!(c.metric(0, "cozyplane_drops_total{reason=\"rpf\"}"), 0);
    // every ADD the plugin ran on node 0 was timed
    assert_eq!(
        c.metric(
            0,
            "cozyplane_cni_request_duration_seconds_count{op=\"ADD\",result=\"ok\"}"
        ),
        2
    );

    // DEL twice: both succeed, the second finds nothing to do
    for _ in 0..2 {
        let out = c.del(&r);
        assert!(
            out.status.success(),
            "DEL: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    c.wait_no_pod_veths(1).await;
    assert_eq!(c.fabric_ips().await.len(), 2, "r's claim is released");
    // the other nodes drop r's remote entry
    eventually("node1 to stop routing r", Duration::from_secs(10), || {
        c.metric(0, "cozyplane_map_entries{map=\"cp_remotes\"}") == 0
    });
    // DEL without netns (containerd's second DEL) also succeeds
    let out = c.run_plugin(
        "DEL",
        &r.container_id,
        None,
        &Cluster::pod_args(&r.name, &r.uid),
        &c.conf(1),
    );
    assert!(out.status.success());
    assert!(ping(&a, b.ip), "the other pods are unaffected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_restart_keeps_established_streams() {
    if !prerequisites(needs!()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let mut c = Cluster::start("cpnet2", 3).await;
    let a = c.add_pod(0);
    let r = c.add_pod(1);

    // a TCP stream a -> r, echoing continuously
    let addr = SocketAddr::from((r.ip, 7100));
    let stream = EchoStream::start("a -> r (cross node)", &r, addr, &a, addr);
    assert!(stream.progressed(), "stream runs before the restart");
    let locals_before = c.metric(1, "cozyplane_map_entries{map=\"cp_locals\"}");
    for node in [0, 1] {
        c.kill_agent(node);
        assert!(stream.progressed(), "stream runs with agent {node} dead");
        std::fs::remove_file(&c.agents[node].conflist).expect("remove conflist");
        if node == 1 {
            // An upgrade that changed the CNI-written maps: their pins are
            // gone, so the new agent starts with empty ones and must refill
            // them from the veth records before swapping the programs.
            // cp_vteps too: as after an upgrade from a release without
            // it, the sender check must not cut node 0's traffic off
            // before the first sync (the agent seeds it).
            for map in ["cp_locals", "cp_ports", "cp_vteps"] {
                std::fs::remove_file(c.agents[1].bpffs.join("cozyplane").join(map))
                    .expect("remove map pin");
            }
        }
        c.start_agent(node);
        c.wait_ready(node);
        assert!(
            stream.progressed(),
            "stream runs after agent {node} restarted"
        );
    }
    assert_eq!(
        c.metric(1, "cozyplane_map_entries{map=\"cp_locals\"}"),
        locals_before,
        "the rebuild refilled the replaced locals map"
    );
    assert_eq!(c.metric(1, "cozyplane_map_entries{map=\"cp_ports\"}"), 1);
    // the fresh cp_vteps was seeded before the new programs went in: no
    // packet of the running stream was refused as coming from a stranger
    assert_eq!(c.metric(1, "cozyplane_map_entries{map=\"cp_vteps\"}"), 2);
    assert_eq!(
        c.metric(1, "cozyplane_drops_total{reason=\"unknown_vtep\"}"),
        0
    );
    stream.finish().expect("stream intact across restarts");
    // the restarted agents still plumb and route new pods
    let n = c.add_pod(0);
    assert!(ping(&n, r.ip), "new pod after restart reaches a remote pod");
    assert!(ping(&r, n.ip));
    assert!(ping(&r, a.ip), "old pod still reachable");
}

/// The user-visible proof of remote learning (docs/datapath.md): a pod
/// that has just been added on node 0 sends ONE datagram to a pod on node
/// 1, and the answer to that very datagram comes back. Node 1's agent is
/// stopped first, so node 1 cannot have the new pod's `cp_remotes` entry:
/// the answer can only be placed by what node 1 learned from the incoming
/// packet. Without learning node 1 drops it (`no_remote`) and UDP needs a
/// resend after the agent's sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_pod_is_answered_on_its_first_datagram() {
    if !prerequisites(needs!()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let mut c = Cluster::start("cpnet5", 3).await;
    let r = c.add_pod(1);
    // node 0 must know r already (that is the agent's ordinary job)
    eventually("node 0 to learn r's claim", Duration::from_secs(10), || {
        c.metric(0, "cozyplane_map_entries{map=\"cp_remotes\"}") == 1
    });
    // every agent trusts exactly the two other nodes as senders
    for i in 0..3 {
        assert_eq!(c.metric(i, "cozyplane_map_entries{map=\"cp_vteps\"}"), 2);
    }
    assert_eq!(
        c.metric(1, "cozyplane_map_entries{map=\"cp_remotes\"}"),
        0,
        "node 1 knows no remote pod yet"
    );

    c.kill_agent(1);
    let n = c.add_pod(0);
    assert!(
        udp_first_reply(&r, r.ip, &n, 7200, Duration::from_secs(2)),
        "the new pod's first datagram got its answer"
    );
    // and TCP connects without waiting for the agent
    assert_eq!(tcp_echo(&r, r.ip, &n, 7201), n.ip, "new pod -> r TCP");

    // node 1 placed the replies from what it learned, not from a claim
    std::fs::remove_file(&c.agents[1].conflist).expect("remove conflist");
    c.start_agent(1);
    c.wait_ready(1);
    assert!(c.metric(1, "cozyplane_map_entries{map=\"cp_learned\"}") >= 1);
    for i in 0..3 {
        for reason in ["unknown_vtep", "no_remote"] {
            assert_eq!(
                c.metric(i, &format!("cozyplane_drops_total{{reason=\"{reason}\"}}")),
                0,
                "node {i}: {reason} drops"
            );
        }
    }
    // the restarted agent now has the authoritative entry as well
    assert_eq!(c.metric(1, "cozyplane_map_entries{map=\"cp_remotes\"}"), 1);
    assert!(ping(&r, n.ip), "r -> new pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_pods_added_and_deleted_leak_nothing() {
    if !prerequisites(needs!()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let c = Cluster::start("cpnet3", 3).await;
    let pods: Vec<_> = (0..100).map(|i| c.add_pod(i % 3)).collect();
    let mut ips: Vec<_> = pods.iter().map(|p| p.ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 100, "every pod got its own address");
    assert_eq!(c.fabric_ips().await.len(), 100);
    // spot check: the first and last pods talk across nodes
    assert!(ping(&pods[0], pods[99].ip));
    // DEL everything first and check with the pod namespaces still alive,
    // so it is DEL (not the namespace's death) that removes the veths.
    for p in &pods {
        let out = c.del(p);
        assert!(out.status.success(), "DEL {}", p.name);
    }
    assert!(c.fabric_ips().await.is_empty(), "no FabricIP left");
    for i in 0..3 {
        c.wait_no_pod_veths(i).await;
        for map in ["cp_locals", "cp_ports"] {
            assert_eq!(
                c.metric(i, &format!("cozyplane_map_entries{{map=\"{map}\"}}")),
                0,
                "node {i} {map}"
            );
        }
        eventually(
            &format!("node {i} to drop its remote entries"),
            Duration::from_secs(10),
            || c.metric(i, "cozyplane_map_entries{map=\"cp_remotes\"}") == 0,
        );
        let links = std::fs::read_dir(c.agents[i].bpffs.join("cozyplane/links"))
            .expect("links dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("cph"))
            .count();
        assert_eq!(links, 0, "node {i} keeps pod link pins");
    }
    for p in pods {
        let name = p.name.clone();
        drop(p);
        cozyplane_datapath::netlink::delete_named_netns(&name).expect("delete pod netns");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_killed_during_add_recovers() {
    if !prerequisites(needs!()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let mut c = Cluster::start("cpnet4", 2).await;
    let peer = c.add_pod(1);

    // Kill the agent at several points of an ADD; each time restart it,
    // re-ADD (must work and deliver traffic) and DEL (must clean up).
    // `interrupted` counts kills that left state of the ADD behind (a
    // veth or a claim): the cases this test exists for.
    let mut interrupted = 0;
    for delay_ms in [0u64, 3, 6, 10, 15, 25, 40] {
        let (name, netns, path) = c.new_pod_netns();
        let uid = c.pod_object(&name, 0);
        let cid = format!("cid{}", name.replace('-', ""));
        let args = Cluster::pod_args(&name, &uid);
        let conf = c.conf(0);
        let cni = c.cni.clone();
        let (cid2, args2, conf2, path2) = (cid.clone(), args.clone(), conf.clone(), path.clone());
        let add = std::thread::spawn(move || {
            let mut cmd = std::process::Command::new(cni);
            cmd.env_clear()
                .env("CNI_COMMAND", "ADD")
                .env("CNI_CONTAINERID", &cid2)
                .env("CNI_IFNAME", "eth0")
                .env("CNI_NETNS", &path2)
                .env("CNI_PATH", "/opt/cni/bin")
                .env("CNI_ARGS", &args2)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let mut child = cmd.spawn().expect("plugin");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(conf2.as_bytes())
                .expect("stdin");
            child.wait_with_output().expect("output")
        });
        std::thread::sleep(Duration::from_millis(delay_ms));
        c.kill_agent(0);
        let first = add.join().expect("ADD thread");
        c.start_agent(0);
        c.wait_ready(0);
        let veths = c.pod_veths(0).await.len();
        let claims = c.fabric_ips().await.len() - 1;
        eprintln!(
            "kill at {delay_ms} ms: first ADD {}, left {veths} veth(s), {claims} claim(s)",
            first.status
        );
        if !first.status.success() && veths + claims > 0 {
            interrupted += 1;
        }

        // the runtime retries the ADD
        let out = c.run_plugin("ADD", &cid, Some(&path), &args, &conf);
        assert!(
            out.status.success(),
            "re-ADD after a kill at {delay_ms} ms (first ADD: {}): {}\nlog:\n{}",
            first.status,
            String::from_utf8_lossy(&out.stdout),
            c.agent_log(0)
        );
        let ip = result_ip(&out.stdout);
        let pod = Pod {
            name: name.clone(),
            netns,
            netns_path: path.clone(),
            container_id: cid.clone(),
            uid: uid.clone(),
            node: 0,
            ip,
        };
        assert!(ping(&pod, peer.ip), "re-added pod reaches a remote pod");
        assert!(ping(&peer, pod.ip), "and is reached");
        c.remove_pod(pod);
        c.wait_no_pod_veths(0).await;
        assert_eq!(
            c.fabric_ips().await.len(),
            1,
            "only the peer's claim is left"
        );
        assert_eq!(c.metric(0, "cozyplane_map_entries{map=\"cp_locals\"}"), 0);
    }

    assert!(
        interrupted > 0,
        "no kill landed inside an ADD; the delays need retuning"
    );

    // A killed ADD that the runtime abandons: CNI GC cleans it up.
    let (name, _netns, path) = c.new_pod_netns();
    let uid = c.pod_object(&name, 0);
    let cid = format!("cid{}", name.replace('-', ""));
    let conf = c.conf(0);
    let add = {
        let (cni, cid, path, args, conf) = (
            c.cni.clone(),
            cid.clone(),
            path.clone(),
            Cluster::pod_args(&name, &uid),
            conf.clone(),
        );
        std::thread::spawn(move || {
            let mut child = std::process::Command::new(cni)
                .env_clear()
                .env("CNI_COMMAND", "ADD")
                .env("CNI_CONTAINERID", &cid)
                .env("CNI_IFNAME", "eth0")
                .env("CNI_NETNS", &path)
                .env("CNI_PATH", "/opt/cni/bin")
                .env("CNI_ARGS", &args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("plugin");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(conf.as_bytes())
                .expect("stdin");
            child.wait_with_output().expect("output")
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    c.kill_agent(0);
    let _ = add.join();
    c.start_agent(0);
    c.wait_ready(0);
    // Whatever that kill left, make sure GC meets both kinds of record-less
    // pod veth: one with no alias (a plumb killed between creating the
    // pair and writing its alias: deleted) and one whose alias this version
    // cannot read (maybe a newer agent's record: kept).
    let (orphan_ns_name, orphan_ns, _) = c.new_pod_netns();
    let orphan = cozyplane_datapath::netlink::host_veth_name("cidorphan", "eth0");
    let foreign = cozyplane_datapath::netlink::host_veth_name("cidforeign", "eth0");
    let node0 = &c.topo.nodes()[0].netns.nl;
    for (name, peer) in [(&orphan, "eth0"), (&foreign, "eth1")] {
        node0
            .create_veth(&cozyplane_datapath::netlink::VethSpec {
                name,
                peer_name: peer,
                peer_netns: Some(&orphan_ns),
                mtu: None,
                peer_mac: None,
                up: true,
            })
            .await
            .expect("record-less veth");
    }
    let foreign_link = node0
        .link_by_name(&foreign)
        .await
        .expect("link")
        .expect("foreign veth");
    node0
        .set_alias(foreign_link.index, "cozyplane-v999 a newer record")
        .await
        .expect("alias");
    let gc_conf = serde_json::json!({
        "cniVersion": "1.1.0",
        "name": "cozyplane",
        "type": "cozyplane",
        "agentSocket": c.agents[0].socket,
        "cni.dev/valid-attachments": [],
    })
    .to_string();
    let out = c.run_plugin("GC", "", None, "", &gc_conf);
    assert!(
        out.status.success(),
        "GC: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // (a recorded veth GC tore down is deleted in the background)
    let kept = cozyplane_testkit::poll_async(
        "GC to leave only the unreadable record",
        Duration::from_secs(10),
        || async {
            let left = c.pod_veths(0).await;
            if left == [foreign.clone()] {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;
    assert!(
        kept.is_ok(),
        "GC deletes the alias-less veth and keeps the unreadable record: {kept:?}\nlog:\n{}",
        c.agent_log(0)
    );
    node0.delete_link(foreign_link.index).await.expect("delete");
    drop(orphan_ns);
    cozyplane_datapath::netlink::delete_named_netns(&orphan_ns_name).expect("netns");
    c.wait_no_pod_veths(0).await;
    assert_eq!(c.fabric_ips().await.len(), 1, "GC released the claim");
    assert_eq!(c.metric(0, "cozyplane_map_entries{map=\"cp_locals\"}"), 0);
    assert_eq!(c.metric(0, "cozyplane_map_entries{map=\"cp_ports\"}"), 0);
}

/// Issue #10's restart proof for VPC pods: SIGKILLing the agent under live
/// VPC streams loses none, and the restarted agent holds the same VPC
/// state. Live TCP streams: a -> b (same node, VPC addresses), a -> r
/// (cross node, carried with the VPC's VNI) and node 0 -> b's fabric
/// address (the dual-address bridge). A fourth pod, s, is severed (its
/// Port deleted, as a revoked binding does) and must stay quarantined; a
/// fifth, g, loses its sandbox while node 0's agent is dead and no DEL
/// follows, so the rebuild must prune what it left (its bridge included:
/// a stale one would refuse the next pod given its fabric address).
/// Node 0's agent restarts over its pins; node 1's as after an upgrade
/// that replaced the per-pod and VNI maps, so its rebuild starts from the
/// veth records alone (`n<vni>` / `s<vni>`, `c<netns cookie>`, docs/agent.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agent_restart_keeps_vpc_streams_and_state() {
    if !prerequisites(needs!()) {
        return;
    }
    const VNI: u32 = 100;
    let _g = SERIAL.lock().await;
    let mut c = Cluster::start("cpnet6", 2).await;
    c.create_vpc("net", "10.20.0.0/24", VNI).await;
    let a = c.add_vpc_pod(0, "net");
    let b = c.add_vpc_pod(0, "net");
    let r = c.add_vpc_pod(1, "net");
    let s = c.add_vpc_pod(1, "net");
    let g = c.add_vpc_pod(0, "net");
    assert!(ping(&a, r.vpc_ip), "a -> r (cross node) in the VPC");

    let node0 = &c.topo.nodes()[0];
    let at = |p: &VpcPod, port: u16| SocketAddr::from((p.vpc_ip, port));
    let streams = [
        EchoStream::start("a -> b (same node)", &b, at(&b, 7300), &a, at(&b, 7300)),
        EchoStream::start("a -> r (cross node)", &r, at(&r, 7301), &a, at(&r, 7301)),
        EchoStream::start(
            "node 0 -> b's fabric address (bridge)",
            &b,
            at(&b, 7302),
            node0,
            SocketAddr::from((b.pod.ip, 7302)),
        ),
    ];
    for st in &streams {
        assert!(st.progressed(), "{} runs before the restarts", st.what);
    }

    // Revocation: s's Port goes, node 1 severs s (quarantined, out of the
    // VPC's maps, its record marked `s<vni>`).
    let port = cozyplane_api::names::port_name(VNI, s.vpc_ip.into());
    kube::Api::<cozyplane_api::Port>::all(c.client.clone())
        .delete(&port, &Default::default())
        .await
        .expect("delete s's Port");
    eventually("node 1 to sever s", Duration::from_secs(10), || {
        c.metric(1, "cozyplane_vpc_severed_total") == 1
    });

    let connected = format!("n{VNI}");
    let severed = format!("s{VNI}");
    assert_eq!(
        vpc_records(&c, 0).await,
        [connected.clone(), connected.clone(), connected.clone()]
    );
    assert_eq!(
        vpc_records(&c, 1).await,
        [connected.clone(), severed.clone()]
    );

    let before = [c.map_state(0), c.map_state(1)];
    // What the VPC state is, so "the same after the rebuild" means something.
    for p in [&a, &b] {
        let local = format!("{VNI} {} -> ", p.vpc_ip);
        assert!(
            before[0].locals.iter().any(|l| l.starts_with(&local)),
            "{local}: {before:#?}"
        );
        let bridge = format!("{} -> net {VNI} {} on ", p.pod.ip, p.vpc_ip);
        assert!(
            before[0].bridges.iter().any(|l| l.starts_with(&bridge)),
            "{bridge}: {before:#?}"
        );
    }
    // Every VPC pod's namespace is recorded on its VPC for socket-LB (the
    // severed one too: it is still no net-0 pod).
    let netns_of = |p: &VpcPod| {
        let cookie = p.pod.netns.cookie().expect("netns cookie");
        format!("{cookie} -> net {VNI} on ")
    };
    for (node, p) in [(0, &a), (0, &b), (0, &g), (1, &r), (1, &s)] {
        let want = netns_of(p);
        assert!(
            before[node].netns.iter().any(|l| l.starts_with(&want)),
            "{want}: {before:#?}"
        );
    }
    assert_eq!((before[0].netns.len(), before[1].netns.len()), (3, 2));
    let remote_r = format!("{VNI} {}/32 -> {}", r.vpc_ip, c.topo.nodes()[1].ip());
    assert!(
        before[0].remotes.contains(&remote_r),
        "{remote_r}: {before:#?}"
    );
    assert!(before[0].vnis.contains(&format!("{VNI} -> {VNI}")));
    let quarantined: Vec<&String> = before[1]
        .ports
        .iter()
        .filter(|p| p.ends_with(&format!("net {VNI} flags 0x1")))
        .collect();
    assert_eq!(quarantined.len(), 1, "s quarantined: {before:#?}");
    assert!(
        !before[1]
            .locals
            .iter()
            .any(|l| l.starts_with(&format!("{VNI} {} ", s.vpc_ip))),
        "s still in its VPC's locals: {before:#?}"
    );
    assert!(
        !before[1]
            .bridges
            .iter()
            .any(|l| l.starts_with(&format!("{} ", s.pod.ip))),
        "s still bridged: {before:#?}"
    );
    // After node 0's restart: the same, less what g left behind (its port,
    // its two locals and its bridge).
    let g_bridge = format!("{} -> net {VNI} {} on ", g.pod.ip, g.vpc_ip);
    let g_ifindex = before[0]
        .bridges
        .iter()
        .find_map(|l| l.strip_prefix(&g_bridge))
        .unwrap_or_else(|| panic!("{g_bridge}: {before:#?}"))
        .to_string();
    let mut after = before.clone();
    after[0]
        .ports
        .retain(|l| !l.starts_with(&format!("{g_ifindex} ")));
    after[0]
        .locals
        .retain(|l| !l.contains(&format!(" -> {g_ifindex} ")));
    after[0]
        .bridges
        .retain(|l| !l.ends_with(&format!(" on {g_ifindex}")));
    after[0]
        .netns
        .retain(|l| !l.ends_with(&format!(" on {g_ifindex}")));
    assert_eq!(before[0].ports.len() - after[0].ports.len(), 1);
    assert_eq!(before[0].locals.len() - after[0].locals.len(), 2);
    assert_eq!(before[0].bridges.len() - after[0].bridges.len(), 1);
    assert_eq!(before[0].netns.len() - after[0].netns.len(), 1);
    let ingress =
        "cozyplane_vpc_packets_total{namespace=\"default\",vpc=\"net\",direction=\"ingress\"}";
    let metered = c.metric(0, ingress);
    assert!(metered > 0, "node 0 meters the VPC's traffic");

    let mut gone = Some(g);
    for node in [0, 1] {
        c.kill_agent(node);
        for st in &streams {
            assert!(st.progressed(), "{} runs with agent {node} dead", st.what);
        }
        if let Some(g) = gone.take().filter(|_| node == 0) {
            // its sandbox's namespace goes, and the veth pair with it
            let name = g.pod.name.clone();
            drop(g);
            cozyplane_datapath::netlink::delete_named_netns(&name).expect("delete g's netns");
            eventually("g's veth to go", Duration::from_secs(10), || {
                let veths = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(c.pod_veths(0))
                });
                veths.len() == 2
            });
        }
        std::fs::remove_file(&c.agents[node].conflist).expect("remove conflist");
        if node == 1 {
            // An upgrade that replaced these maps: the new agent starts
            // with empty ones and refills them (rebuild, then sync).
            for map in ["cp_locals", "cp_ports", "cp_bridges", "cp_vnis", "cp_netns"] {
                std::fs::remove_file(c.agents[1].bpffs.join("cozyplane").join(map))
                    .expect("remove map pin");
            }
        }
        c.start_agent(node);
        c.wait_ready(node);
        for st in &streams {
            assert!(
                st.progressed(),
                "{} runs after agent {node} restarted",
                st.what
            );
        }
        assert_eq!(
            c.map_state(node),
            after[node],
            "node {node}: the restarted agent's VPC state differs"
        );
    }
    for st in streams {
        st.finish().expect("stream intact across the restarts");
    }
    assert_eq!(
        vpc_records(&c, 0).await,
        [connected.clone(), connected.clone()]
    );
    assert_eq!(vpc_records(&c, 1).await, [connected.clone(), severed]);
    // The meters are pinned: the restart did not reset them.
    assert!(c.metric(0, ingress) >= metered, "node 0's VPC meters reset");
    for i in 0..2 {
        assert_eq!(
            c.metric(i, "cozyplane_drops_total{reason=\"unknown_vni\"}"),
            0,
            "node {i}: VPC traffic refused for an unknown VNI"
        );
    }

    // The restarted agents attach a new VPC pod, which reaches the old ones
    // both ways; the severed pod stays cut off.
    let n = c.add_vpc_pod(1, "net");
    // Only the live pods' addresses are taken: the severed pod's Port was
    // reaped, so its address is free again (the walk starts at an offset
    // hashed from the UID, so it comes up about once in 250 runs) and its
    // cut-off veth can neither send as nor receive for the new holder.
    assert!(
        ![a.vpc_ip, b.vpc_ip, r.vpc_ip].contains(&n.vpc_ip),
        "a fresh VPC address: {} (a {}, b {}, r {})",
        n.vpc_ip,
        a.vpc_ip,
        b.vpc_ip,
        r.vpc_ip
    );
    assert!(ping(&n, a.vpc_ip), "new pod -> a (cross node)");
    assert!(ping(&a, n.vpc_ip), "a -> new pod");
    assert!(ping(&n, r.vpc_ip), "new pod -> r (same node)");
    assert!(!ping(&s, r.vpc_ip), "the severed pod reaches its VPC again");
}

/// The network fields (`n<vni>` / `s<vni>`) of the VPC pods' veth records
/// on node `i`, sorted.
async fn vpc_records(c: &Cluster, i: usize) -> Vec<String> {
    let mut records: Vec<String> = c
        .pod_veth_links(i)
        .await
        .into_iter()
        .filter_map(|l| l.alias)
        .filter_map(|alias| alias.split(' ').nth(5).map(str::to_string))
        .collect();
    records.sort();
    records
}

/// The sync loop's sever pass (runtime/sever.rs) nominates a local VPC
/// endpoint whose Port is not in its cache, and the cache may lag a fresh
/// ADD. Such a pod must be left untouched, its veth record included: a
/// record marked `s<vni>` would make the next restart restore a connected
/// pod quarantined. The pass runs here in the test process over node 0's
/// pins and links, with an empty (lagging) Port cache, while the agent is
/// stopped so nothing else writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_port_cache_leaves_vpc_pods_connected_across_a_restart() {
    if !prerequisites(needs!()) {
        return;
    }
    use cozyplane_agent::runtime::kernel::SharedDatapath;
    use cozyplane_agent::runtime::plumber::NetlinkPlumber;
    use cozyplane_datapath::netlink::NetnsHandle;
    const VNI: u32 = 100;
    let _g = SERIAL.lock().await;
    let mut c = Cluster::start("cpnet7", 1).await;
    c.create_vpc("net", "10.20.0.0/24", VNI).await;
    let a = c.add_vpc_pod(0, "net");
    let b = c.add_vpc_pod(0, "net");
    assert!(ping(&a, b.vpc_ip), "a -> b in the VPC");

    c.kill_agent(0);
    let pins = c.agents[0].bpffs.join("cozyplane");
    let node = &c.topo.nodes()[0];
    let dp = SharedDatapath::new(
        cozyplane_datapath::Datapath::load(&pins).expect("open the node's datapath"),
        pins.join("links"),
        node.netns.nl.clone(),
    )
    .expect("the pod programs");
    let plumber = NetlinkPlumber::new(NetnsHandle {
        netns: node.netns.netns.try_clone().expect("node netns"),
        nl: node.netns.nl.clone(),
    });
    let cut =
        cozyplane_agent::runtime::sever::sever_unclaimed(&c.client, &dp, &plumber, &[], &node.name)
            .await;
    assert_eq!(cut, 0, "a pod whose Port is live was severed");
    let connected = format!("n{VNI}");
    assert_eq!(
        vpc_records(&c, 0).await,
        [connected.clone(), connected],
        "a live VPC pod's record was marked severed"
    );
    drop(dp);

    // what the record decides: the restarted agent restores both connected
    std::fs::remove_file(&c.agents[0].conflist).expect("remove conflist");
    c.start_agent(0);
    c.wait_ready(0);
    assert!(ping(&a, b.vpc_ip), "a -> b after the restart");
    assert_eq!(
        c.metric(0, "cozyplane_drops_total{reason=\"quarantined\"}"),
        0
    );
}

/// DEL answers before the kernel deletes the veth (docs/agent.md, "Latency
/// of ADD and DEL"): the node's route to the pod is gone when DEL returns,
/// a retried ADD of the same container right after its DEL works (the doomed
/// veth of that name is deleted first), a veth a killed agent left doomed is
/// deleted at the next start, and the reaper deletes the rest in the
/// background.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doomed_veths_are_reaped_and_a_restart_finishes_them() {
    use cozyplane_agent::runtime::plumber::DOOMED_GROUP;
    use cozyplane_agent::runtime::record::DELETING;
    use cozyplane_datapath::netlink::{host_veth_name, IpPrefix};
    if !prerequisites(needs!()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let mut c = Cluster::start("cpnet8", 1).await;
    let a = c.add_pod(0);
    let b = c.add_pod(0);
    let nl = c.topo.nodes()[0].netns.nl.clone();
    let route_to = |ip: std::net::Ipv4Addr| {
        let nl = nl.clone();
        async move {
            let dst = IpPrefix::host(std::net::IpAddr::V4(ip));
            nl.list_routes(false)
                .await
                .expect("routes")
                .iter()
                .any(|r| r.dst == dst)
        }
    };
    assert!(route_to(a.ip).await, "a is routed while it lives");

    let out = c.del(&a);
    assert!(out.status.success(), "DEL a");
    assert!(
        !route_to(a.ip).await,
        "the node still routes a's released address after DEL"
    );

    // the runtime retries the sandbox: ADD of the same container at once
    let again = c.run_plugin(
        "ADD",
        &a.container_id,
        Some(&a.netns_path),
        &Cluster::pod_args(&a.name, &a.uid),
        &c.conf(0),
    );
    assert!(
        again.status.success(),
        "ADD right after DEL: {}{}\n{}",
        String::from_utf8_lossy(&again.stdout),
        String::from_utf8_lossy(&again.stderr),
        c.agent_log(0)
    );
    let a_ip = result_ip(&again.stdout);
    assert!(ping(&a, b.ip), "the re-added pod reaches b");
    assert!(ping(&b, a_ip), "b reaches the re-added pod");

    // a DEL the agent was killed in: b's veth doomed, its claims kept
    c.kill_agent(0);
    let veth = host_veth_name(&b.container_id, "eth0");
    let link = nl.link_by_name(&veth).await.unwrap().expect("b's veth");
    nl.set_alias_and_group(link.index, DELETING, DOOMED_GROUP)
        .await
        .unwrap();
    std::fs::remove_file(&c.agents[0].conflist).expect("remove conflist");
    c.start_agent(0);
    c.wait_ready(0);
    assert!(
        nl.link_by_name(&veth).await.unwrap().is_none(),
        "the restarted agent left b's doomed veth"
    );
    assert!(ping(&a, c.topo.nodes()[0].ip()), "a is restored");
    // the runtime's retried DEL finds no veth and releases b's address
    assert!(c.del(&b).status.success(), "retried DEL of b");

    assert!(c.del(&a).status.success(), "DEL a");
    c.wait_no_pod_veths(0).await;
    assert!(c.fabric_ips().await.is_empty(), "no FabricIP left");
    for p in [a, b] {
        let name = p.name.clone();
        drop(p);
        cozyplane_datapath::netlink::delete_named_netns(&name).expect("delete pod netns");
    }
}
