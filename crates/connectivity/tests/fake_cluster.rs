//! `connectivity test` end to end against the project's real API server (standalone,
//! in-process, embedded store) and a fake kubelet in this test.
//!
//! The fake kubelet runs the probe pods the way the lab kubelet does, but without network
//! namespaces: each pod gets its own loopback address (127.X.1.N; hostNetwork pods the
//! node's 127.X.0.1N), its server is the real `cozyplane_probe` server and its client
//! the real plan runner, and status goes through PATCH /status. This exercises the whole
//! orchestration (nodes, namespace, reuse, delete-and-wait, waits, report parsing, the
//! exit status) without root; the datapath itself is covered by the lab test.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use cozyplane_api::VPCBinding;
use cozyplane_api::{VPCPeering, VPC};
use cozyplane_connectivity::report::Verdict;
use cozyplane_connectivity::run::{execute, Summary};
use cozyplane_connectivity::{ConnectivityError, TestArgs};
use cozyplane_probe::server::{Server, ServerConfig};
use cozyplane_probe::stream::{run_stream, StreamSpec};
use cozyplane_probe::Plan;
use cozyplane_testkit::apiserver::TestServer;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;

/// Distinct 127.X/16 per test so parallel tests never share an address.
static NEXT_NET: AtomicU8 = AtomicU8::new(10);

/// How the fake kubelet misbehaves, per test.
#[derive(Default, Clone)]
struct Quirks {
    /// Pod name → the name its server answers with (a misdelivery).
    answer_as: HashMap<String, String>,
    /// Nodes whose pods are never started (a dead kubelet).
    dead_nodes: HashSet<String>,
    /// Client pods end with this message instead of their report.
    client_message: Option<String>,
}

struct Cluster {
    _api: TestServer,
    kubeconfig: std::path::PathBuf,
    client: Client,
    net: u8,
    kubelet: tokio::task::JoinHandle<()>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kubelet.abort();
    }
}

fn node_ip(net: u8, i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, net, 0, 10 + i))
}

async fn cluster(nodes: u8, quirks: Quirks) -> Cluster {
    let net = NEXT_NET.fetch_add(1, Ordering::SeqCst);
    let server = cozyplane_testkit::apiserver::standalone().await;
    let (client, kubeconfig) = (server.client.clone(), server.kubeconfig.clone());

    let api: Api<Node> = Api::all(client.clone());
    let mut ips = HashMap::new();
    for i in 1..=nodes {
        let name = format!("node{i}");
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).expect("node");
        api.create(&PostParams::default(), &node)
            .await
            .expect("create node");
        let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": node_ip(net, i).to_string()}]}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("node status");
        ips.insert(name, node_ip(net, i));
    }
    let kubelet = tokio::spawn(fake_kubelet(client.clone(), net, ips, quirks));
    Cluster {
        _api: server,
        kubeconfig,
        client,
        net,
        kubelet,
    }
}

fn args(c: &Cluster) -> TestArgs {
    TestArgs {
        kubeconfig: Some(c.kubeconfig.clone()),
        context: None,
        namespace: "cozyplane-connectivity".into(),
        image: "test-image:1".into(),
        node_a: None,
        node_b: None,
        external_target: None,
        external_name: None,
        timeout: 20,
        check_timeout_secs: 2,
        cleanup: false,
        tenancy: false,
        policy: false,
        tenancy_cidr: cozyplane_connectivity::tenancy::DEFAULT_CIDR.into(),
        tenancy_peer_cidr: cozyplane_connectivity::tenancy::DEFAULT_PEER_CIDR.into(),
        // No datapath here: nothing would load-balance the Services.
        no_services: true,
    }
}

/// Runs the probe pods of every node it serves until they are deleted.
async fn fake_kubelet(client: Client, net: u8, nodes: HashMap<String, IpAddr>, quirks: Quirks) {
    let pods: Api<Pod> = Api::all(client.clone());
    // Each pod's task and the sender that stops it (dropping the sender stops it too).
    type Running = (
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Sender<()>,
    );
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut next_ip = 1u8;
    loop {
        let Ok(list) = pods.list(&ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // Deleted pods first: stop their workload and wait until its sockets are closed,
        // so a replacement on the same address can bind.
        let seen: HashSet<String> = list
            .items
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let gone: Vec<String> = running
            .keys()
            .filter(|u| !seen.contains(*u))
            .cloned()
            .collect();
        for uid in gone {
            if let Some((h, stop)) = running.remove(&uid) {
                // A graceful stop, not an abort: the server closes its sockets before
                // the task ends (an aborted task's children may still hold them).
                let _ = stop.send(());
                let _ = h.await;
            }
        }
        for pod in list.items {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if pod.metadata.deletion_timestamp.is_some() {
                // Graceful deletion, as a kubelet does it: stop the workload,
                // then delete the pod for good (grace 0, this pod's UID only).
                if let Some((h, stop)) = running.remove(&uid) {
                    let _ = stop.send(());
                    let _ = h.await;
                }
                let ns = pod.metadata.namespace.clone().unwrap_or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                let _ = Api::<Pod>::namespaced(client.clone(), &ns)
                    .delete(&name, &params)
                    .await;
                continue;
            }
            if running.contains_key(&uid) {
                continue;
            }
            let spec = pod.spec.clone().unwrap_or_default();
            let Some(node) = spec.node_name.clone() else {
                continue;
            };
            let Some(&host_ip) = nodes.get(&node) else {
                continue;
            };
            if quirks.dead_nodes.contains(&node) {
                continue;
            }
            let ip = if spec.host_network == Some(true) {
                host_ip
            } else {
                next_ip += 1;
                IpAddr::V4(Ipv4Addr::new(127, net, 1, next_ip))
            };
            let (stop, stopped) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(run_pod(
                client.clone(),
                pod,
                ip,
                host_ip,
                quirks.clone(),
                stopped,
            ));
            running.insert(uid, (task, stop));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn flag(cmd: &[String], name: &str) -> Option<String> {
    cmd.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

async fn run_pod(
    client: Client,
    pod: Pod,
    ip: IpAddr,
    host_ip: IpAddr,
    quirks: Quirks,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let c = &pod.spec.as_ref().expect("spec").containers[0];
    let cmd = c.command.clone().unwrap_or_default();
    assert_eq!(
        &cmd[..2],
        ["cozyplane", "probe"],
        "probe pods run cozyplane probe"
    );
    let patch = |status: serde_json::Value| {
        let api = api.clone();
        let name = name.clone();
        async move {
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .map(|_| ())
        }
    };
    let base = |phase: &str, ready: bool, state: serde_json::Value| {
        json!({
            "phase": phase, "podIP": ip.to_string(), "hostIP": host_ip.to_string(),
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": [{"name": "probe", "image": "test-image:1", "imageID": "",
                "ready": ready, "restartCount": 0, "state": state}],
        })
    };
    // A VPC pod: refused without a binding in its namespace (the agent's error, where the
    // lab kubelet puts it), else its VPC address is stamped. The fake network is flat: a
    // "VPC address" is the pod's loopback address and nothing is isolated.
    let vpc = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("sdn.cozystack.io/vpc").cloned());
    if let Some(vpc) = vpc {
        let bindings: Api<VPCBinding> = Api::namespaced(api.clone().into_client(), &ns);
        let bound = bindings.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items.iter().any(|b| {
                let vns = b
                    .spec
                    .vpc_ref
                    .namespace
                    .clone()
                    .unwrap_or_else(|| ns.clone());
                format!("{vns}/{}", b.spec.vpc_ref.name) == vpc
            })
        });
        if !bound {
            let msg = format!(
                "CNI ADD (cozyplane) failed with code 102: VPC attachment failed: no VPCBinding \
                 in namespace {ns} references VPC {vpc} (attachment is denied by default)"
            );
            let _ = patch(
                json!({"phase": "Pending", "containerStatuses": [{"name": "probe",
                "image": "test-image:1", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating", "message": msg}}}]}),
            )
            .await;
            // … and the Warning event a kubelet records (`kubectl describe pod`).
            let event: Event = serde_json::from_value(json!({
                "metadata": {"name": format!("{name}.sandbox"), "namespace": ns},
                "involvedObject": {"kind": "Pod", "namespace": ns, "name": name,
                    "uid": pod.metadata.uid.clone().unwrap_or_default()},
                "type": "Warning", "reason": "FailedCreatePodSandBox",
                "message": format!("Failed to create pod sandbox: {msg}")}))
            .expect("event");
            let _ = Api::<Event>::namespaced(api.clone().into_client(), &ns)
                .create(&PostParams::default(), &event)
                .await;
            let _ = stopped.await;
            return;
        }
        let ann = json!({"metadata": {"annotations": {"sdn.cozystack.io/vpc-ip": ip.to_string()}}});
        let _ = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&ann))
            .await;
    }
    match cmd[2].as_str() {
        "server" => {
            let port = |f: &str| {
                flag(&cmd, f)
                    .and_then(|p| p.parse().ok())
                    .expect("port flag")
            };
            let cfg = ServerConfig {
                name: quirks
                    .answer_as
                    .get(&name)
                    .cloned()
                    .or_else(|| flag(&cmd, "--name"))
                    .unwrap_or_else(|| name.clone()),
                bind: ip,
                tcp_port: port("--tcp-port"),
                udp_port: port("--udp-port"),
                http_port: port("--http-port"),
            };
            let mut srv = Server::bind(&cfg).await.expect("fake kubelet: bind server");
            if let Some(p) = flag(&cmd, "--stream-port") {
                srv = srv
                    .with_stream(ip, p.parse().expect("stream port"))
                    .await
                    .expect("fake kubelet: bind stream port");
            }
            let _ = patch(base("Running", true, json!({"running": {}}))).await;
            let _ = srv
                .serve(async {
                    let _ = stopped.await;
                })
                .await;
        }
        "client" => {
            let _ = patch(base("Running", true, json!({"running": {}}))).await;
            let plan = Plan::parse(&flag(&cmd, "--plan").expect("--plan")).expect("valid plan");
            let report = cozyplane_probe::client::run_plan(&plan).await;
            let ok = report.failures().count() == 0;
            let message = match &quirks.client_message {
                Some(m) => m.clone(),
                None => report.to_line().expect("report"),
            };
            let exit = if ok { 0 } else { 1 };
            let phase = if ok { "Succeeded" } else { "Failed" };
            let _ = patch(base(
                phase,
                false,
                json!({"terminated": {"exitCode": exit, "reason": if ok { "Completed" } else { "Error" }, "message": message}}),
            ))
            .await;
        }
        "stream" => {
            // Ready once the stream is up, as the readiness probe on the ready port says
            // (a free port here: every fake pod shares the host's network namespace).
            let mut spec = StreamSpec::parse(&flag(&cmd, "--spec").expect("--spec")).expect("spec");
            let ready = std::net::TcpListener::bind("127.0.0.1:0")
                .expect("bind")
                .local_addr()
                .expect("addr");
            spec.ready_port = Some(ready.port());
            let _ = patch(base("Running", false, json!({"running": {}}))).await;
            let mut run = tokio::spawn(async move { run_stream(&spec).await });
            let mut stopped = stopped;
            let mut is_ready = false;
            let report = loop {
                tokio::select! {
                    r = &mut run => break r.expect("stream task"),
                    _ = &mut stopped => {
                        run.abort();
                        return;
                    }
                    () = tokio::time::sleep(Duration::from_millis(100)), if !is_ready => {
                        if tokio::net::TcpStream::connect(ready).await.is_ok() {
                            is_ready = true;
                            let _ = patch(base("Running", true, json!({"running": {}}))).await;
                        }
                    }
                }
            };
            let _ = patch(base(
                "Succeeded",
                false,
                json!({"terminated": {"exitCode": 0, "reason": "Completed",
                    "message": report.to_line().expect("report")}}),
            ))
            .await;
        }
        other => panic!("unexpected probe subcommand {other}"),
    }
}

fn verdict(s: &Summary, id: &str) -> Verdict {
    s.rows
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no row {id}"))
        .verdict
}

fn detail<'a>(s: &'a Summary, id: &str) -> &'a str {
    s.rows
        .iter()
        .find(|r| r.id == id)
        .and_then(|r| r.detail.as_deref())
        .unwrap_or("")
}

/// An "external" probe server for the pod-to-external check.
async fn external(net: u8) -> String {
    let cfg = ServerConfig {
        name: "external".into(),
        bind: IpAddr::V4(Ipv4Addr::new(127, net, 2, 2)),
        tcp_port: 0,
        udp_port: 0,
        http_port: 0,
    };
    let srv = Server::bind(&cfg).await.expect("external");
    let (tcp, _, _) = srv.local_addrs().expect("addr");
    tokio::spawn(srv.serve(std::future::pending()));
    tcp.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_all_pass_and_a_second_run_reuses_the_servers() {
    let c = cluster(2, Quirks::default()).await;
    let mut a = args(&c);
    a.external_target = Some(external(c.net).await);
    a.external_name = Some("external".into());

    let s = execute(&a).await.expect("run");
    assert_eq!((s.passed, s.failed, s.skipped), (15, 0, 0), "{:#?}", s.rows);
    let mut created = s.created.clone();
    created.sort();
    assert_eq!(created, ["echo-a", "echo-b", "host-echo-a", "host-echo-b"]);
    assert!(s.reused.is_empty());

    // The servers are where the contract says.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "cozyplane-connectivity");
    let node_of = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    for (name, node) in [
        ("echo-a", "node1"),
        ("host-echo-a", "node1"),
        ("echo-b", "node2"),
        ("host-echo-b", "node2"),
        ("client", "node1"),
        ("host-client", "node2"),
    ] {
        let p = pods.get(name).await.expect(name);
        assert_eq!(node_of(&p), node, "{name}");
    }

    let s = execute(&a).await.expect("second run");
    assert_eq!((s.passed, s.failed, s.skipped), (15, 0, 0), "{:#?}", s.rows);
    assert_eq!(
        s.reused.len(),
        4,
        "Ready servers with the same spec are reused"
    );
    assert!(s.created.is_empty());

    // Another image: the spec hash differs, every server is recreated.
    a.image = "test-image:2".into();
    let s = execute(&a).await.expect("third run");
    assert_eq!(s.created.len(), 4);
    assert_eq!(s.failed, 0, "{:#?}", s.rows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misdelivered_answer_is_a_failure() {
    let quirks = Quirks {
        answer_as: HashMap::from([("echo-b".to_string(), "echo-a".to_string())]),
        ..Default::default()
    };
    let c = cluster(2, quirks).await;
    let s = execute(&args(&c)).await.expect("run");
    for id in [
        "pod-to-pod/cross-node/tcp",
        "pod-to-pod/cross-node/udp",
        "pod-to-pod/cross-node/http",
        "node-to-pod/same-node/tcp",
        "node-to-pod/same-node/http",
    ] {
        assert_eq!(verdict(&s, id), Verdict::Fail, "{id}");
        assert!(
            detail(&s, id).contains(r#"answered "echo-a", expected "echo-b""#),
            "{id}: {}",
            detail(&s, id)
        );
    }
    assert_eq!(verdict(&s, "pod-to-pod/same-node/tcp"), Verdict::Pass);
    assert_eq!(verdict(&s, "pod-to-external/tcp"), Verdict::Skip);
    assert_eq!((s.passed, s.failed, s.skipped), (9, 5, 1));

    // Through the public entry point the failures become an error (exit 1).
    let err = cozyplane_connectivity::run::run(args(&c))
        .await
        .expect_err("failures");
    assert!(
        matches!(err, ConnectivityError::Failed { failed: 5, .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_skips_cross_node_checks() {
    let c = cluster(1, Quirks::default()).await;
    let mut a = args(&c);
    a.cleanup = true;
    let s = execute(&a).await.expect("run");
    assert_eq!((s.passed, s.failed, s.skipped), (6, 0, 9), "{:#?}", s.rows);
    assert_eq!(verdict(&s, "node-to-pod/same-node/http"), Verdict::Pass);
    assert_eq!(verdict(&s, "pod-to-pod/cross-node/udp"), Verdict::Skip);
    // --cleanup deleted the probe pods; they go once the kubelet has stopped them.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "cozyplane-connectivity");
    let gone = cozyplane_testkit::poll_async(
        "the probe pods to go after --cleanup",
        Duration::from_secs(10),
        || async {
            let left = pods.list(&ListParams::default()).await.expect("list").items;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{} left", left.len()))
            }
        },
    )
    .await;
    if let Err(e) = gone {
        panic!("{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_never_get_ready_time_out_naming_them() {
    let quirks = Quirks {
        dead_nodes: HashSet::from(["node2".to_string()]),
        ..Default::default()
    };
    let c = cluster(2, quirks).await;
    let mut a = args(&c);
    a.timeout = 2;
    let err = execute(&a).await.expect_err("node2 never runs its pods");
    let msg = err.to_string();
    assert!(matches!(err, ConnectivityError::Timeout { .. }), "{msg}");
    assert!(
        msg.contains("echo-b") && msg.contains("host-echo-b"),
        "{msg}"
    );
    assert!(!msg.contains("echo-a"), "echo-a is Ready: {msg}");
    assert!(msg.contains("no kubelet"), "says what to check: {msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_report_fails_every_one_of_its_checks() {
    let quirks = Quirks {
        client_message: Some("exec format error".into()),
        ..Default::default()
    };
    let c = cluster(2, quirks).await;
    let s = execute(&args(&c)).await.expect("run");
    assert!(s.missing_report);
    assert_eq!((s.passed, s.failed, s.skipped), (0, 14, 1), "{:#?}", s.rows);
    assert!(detail(&s, "node-to-pod/cross-node/tcp").contains("no report from pod host-client"));
}

/// Plays the controller for VPCs (Ready with a VNI as soon as they exist) and peerings
/// (a half is Ready while its mirror exists, else Pending).
async fn fake_vpc_controller(client: Client) {
    let vpcs: Api<VPC> = Api::all(client.clone());
    let peerings: Api<VPCPeering> = Api::all(client.clone());
    loop {
        if let Ok(list) = peerings.list(&ListParams::default()).await {
            for p in &list.items {
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                let mirrored = list.items.iter().any(|q| {
                    q.metadata.namespace.as_deref() == Some(p.spec.peer_ref.namespace.as_str())
                        && q.spec.peer_ref.namespace == ns
                });
                let phase = if mirrored { "Ready" } else { "Pending" };
                if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase) {
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let _ = Api::<VPCPeering>::namespaced(client.clone(), &ns)
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": {"phase": phase}})),
                    )
                    .await;
            }
        }
        if let Ok(list) = vpcs.list(&ListParams::default()).await {
            for (i, v) in list.items.iter().enumerate() {
                if v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Ready") {
                    continue;
                }
                let ns = v.metadata.namespace.clone().unwrap_or_default();
                let name = v.metadata.name.clone().unwrap_or_default();
                let status = json!({"status": {"phase": "Ready", "vni": 100 + i}});
                let _ = Api::<VPC>::namespaced(client.clone(), &ns)
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// On a flat network (the fake one isolates nothing) the tenancy group still deploys over
/// three nodes, its positive rows pass (every twin-VPC client reaches every server of its
/// VPC), the unbound pod is judged refused from its status and its Warning event, and
/// every isolation row FAILs naming who answered: the rows detect a network without
/// isolation. Blocked ICMP rows fail too: as root the echo is answered; as another user
/// the probe cannot open a raw socket and says so (silence would prove nothing).
/// The peered and revoked streams are never cut there: those rows FAIL saying so (the
/// severed pod's "still Running" passes, it is), and the run puts back what it deleted.
/// Nothing polices SecurityGroups there either: only `web-to-api/tcp` passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_on_a_flat_network_fails_every_isolation_row() {
    let c = cluster(3, Quirks::default()).await;
    let controller = tokio::spawn(fake_vpc_controller(c.client.clone()));
    let mut a = args(&c);
    a.tenancy = true;
    let s = execute(&a).await.expect("run");
    controller.abort();
    let rows: Vec<_> = s
        .rows
        .iter()
        .filter(|r| r.id.starts_with("tenancy/"))
        .collect();
    // 34 isolation rows; 9 rows of each of the six twin-VPC clients to the servers of
    // its VPC, and 7 of five of them (6 twin, 1 to their node); 14 peered/revoked;
    // 5 security-group.
    assert_eq!(rows.len(), 34 + 6 * 9 + 5 * 7 + 14 + 5, "{rows:#?}");
    assert!(rows.iter().all(|r| r.verdict != Verdict::Skip), "{rows:#?}");
    // ICMP needs a raw socket: as root (CI) the echo is answered on loopback.
    let root = std::fs::read_to_string("/proc/self/status")
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        .expect("uid");
    let streams = [
        "tenancy/peered/half-deleted",
        "tenancy/peered/half-restored",
        "tenancy/revoked/stream-cut",
        "tenancy/revoked/no-reconnect",
    ];
    for r in &rows {
        let icmp = r.id.ends_with("/icmp");
        let positive = ((r.id.starts_with("tenancy/same-vpc/")
            || r.id == "tenancy/default-to-default/same-node/icmp")
            && (root || !icmp))
            || r.id == "tenancy/no-binding"
            || r.id == "tenancy/no-binding/event"
            || r.id.starts_with("tenancy/peered/same-node/")
            || r.id.starts_with("tenancy/peered/cross-node/")
            || r.id.starts_with("tenancy/peered/reverse/")
            || r.id == "tenancy/revoked/pod-running"
            || r.id == "tenancy/security-group/web-to-api/tcp";
        let want = if positive {
            Verdict::Pass
        } else {
            Verdict::Fail
        };
        assert_eq!(r.verdict, want, "{r:#?}");
        let d = r.detail.as_deref().unwrap_or("");
        if streams.contains(&r.id.as_str()) {
            assert!(d.contains("never cut"), "{r:#?}");
        } else if !positive && r.path.contains(" ↛ ") {
            let why = if icmp && !root {
                "cannot probe, so silence proves nothing"
            } else {
                "expected no answer (blocked)"
            };
            assert!(d.contains(why), "{r:#?}");
        }
    }
    // The event row shows the event it found.
    let ev = detail(&s, "tenancy/no-binding/event");
    assert!(
        ev.starts_with("Warning FailedCreatePodSandBox: Failed to create pod sandbox: ")
            && ev.contains("no VPCBinding in namespace cozyplane-connectivity-unbound"),
        "{ev}"
    );
    assert_eq!(
        detail(&s, "tenancy/revoked/pod-running"),
        "phase Running, container running, 0 restarts"
    );
    // What the phases deleted is back.
    let ns = "cozyplane-connectivity";
    assert!(
        Api::<VPCBinding>::namespaced(c.client.clone(), &format!("{ns}-revoke"))
            .get_opt("net")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        Api::<VPCPeering>::namespaced(c.client.clone(), &format!("{ns}-t3"))
            .get_opt("peer")
            .await
            .expect("get")
            .is_some()
    );
    // The twin VPC's server answered as itself: t2's pod was reached, which is the breach.
    assert!(
        detail(&s, "tenancy/twin-vpc/cross-node/tcp").contains("answered \"t2/echo-b\""),
        "{}",
        detail(&s, "tenancy/twin-vpc/cross-node/tcp")
    );
    assert_eq!(verdict(&s, "pod-to-pod/cross-node/tcp"), Verdict::Pass);
}
