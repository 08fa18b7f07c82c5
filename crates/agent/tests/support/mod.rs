//! The pod-network harness: a lab topology (3 nodes + external host), the
//! project's API server in process (standalone, embedded store) reachable
//! from the nodes through a TCP relay in the fabric namespace, one real
//! agent process per node (the shipped `cozyplane agent`, spawned inside the
//! node's namespace by the lab) and pods plumbed by executing the real CNI
//! plugin binary with the CNI environment and stdin. Both binaries come from
//! `$COZYPLANE_BIN` and `$COZYPLANE_CNI_BIN` (`scripts/test` exports them),
//! else the test kit builds them.
//!
//! Needs root and `ping` (iputils-ping). Under CI a missing prerequisite fails
//! the test; elsewhere it is skipped with a `SKIP` line (the test kit's gate).
#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::FabricIP;
use cozyplane_apiserver::{RunningServer, ServerBuilder};
use cozyplane_datapath::netlink::{create_named_netns, delete_named_netns, Netns};
use cozyplane_lab::{bind_tcp_in, exec_in, LabHost, Topology, TopologySpec};
use cozyplane_store::Storage;
use cozyplane_testkit::{tools, Needs};
use k8s_openapi::api::core::v1::{Node as KNode, NodeAddress, NodeStatus};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;

pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
const API_PORT: u16 = 6443;
const METRICS: &str = "127.0.0.1:9411";

/// The test kit's gate for a cluster test: the calling test's `needs` (from
/// `needs!()`) plus root and `ping`. `false` means skipped.
pub fn prerequisites(needs: Needs) -> bool {
    needs.root().tool(&tools::PING).ready()
}

/// A pod: a named namespace plumbed through the real plugin.
pub struct Pod {
    pub name: String,
    pub netns: Netns,
    pub netns_path: PathBuf,
    pub container_id: String,
    pub uid: String,
    pub node: usize,
    pub ip: Ipv4Addr,
}

impl LabHost for Pod {
    fn name(&self) -> &str {
        &self.name
    }
    fn netns(&self) -> &Netns {
        &self.netns
    }
}

/// One agent process.
pub struct Agent {
    pub child: Option<Child>,
    pub args: Vec<String>,
    pub log: PathBuf,
    pub socket: PathBuf,
    pub conflist: PathBuf,
    pub bpffs: PathBuf,
}

pub struct Cluster {
    pub topo: Topology,
    pub server: Option<RunningServer>,
    pub client: kube::Client,
    pub agents: Vec<Agent>,
    pub cni: PathBuf,
    /// The `cozyplane` binary; the agents run as `cozyplane agent`.
    pub cozyplane: PathBuf,
    pub dir: tempfile::TempDir,
    relay: tokio::task::JoinHandle<()>,
    seq: std::sync::atomic::AtomicU32,
}

use cozyplane_testkit::apiserver::client as kube_client;

impl Cluster {
    /// Builds everything and waits until every agent is ready.
    pub async fn start(lab: &str, nodes: usize) -> Cluster {
        let _ = cozyplane_lab::destroy_by_prefix(lab);
        let topo = Topology::build(TopologySpec::new(lab, nodes))
            .await
            .expect("lab topology");
        let dir = tempfile::tempdir().expect("tempdir");
        let svc_ip = topo.add_service_address(1).await.expect("service address");

        let store: Arc<dyn Storage> = Arc::new(
            cozyplane_store::EmbeddedStore::open(dir.path().join("store.redb"))
                .expect("embedded store"),
        );
        let kubeconfig = dir.path().join("kubeconfig");
        let server = ServerBuilder::new(store, cozyplane_apiserver::args::served_kinds(true))
            .standalone(true)
            .extra_names(vec![svc_ip.to_string()])
            .write_kubeconfig(kubeconfig.clone())
            .start()
            .await
            .expect("api server");
        // The agents' kubeconfig names the relay in the fabric.
        let agent_kc = dir.path().join("agent-kubeconfig");
        cozyplane_apiserver::tls::write_kubeconfig(
            &agent_kc,
            &format!("https://{svc_ip}:{API_PORT}"),
            &server.ca_pem,
            &cozyplane_apiserver::tls::KubeconfigUser::Token(server.token.clone()),
        )
        .expect("agent kubeconfig");
        let relay = start_relay(&topo, SocketAddr::from((svc_ip, API_PORT)), server.addr);
        let client = kube_client(&kubeconfig).await;

        // Node objects with InternalIP = underlay address.
        let api: Api<KNode> = Api::all(client.clone());
        for n in topo.nodes() {
            let mut node = KNode::default();
            node.metadata.name = Some(n.name.clone());
            node.status = Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: n.ip().to_string(),
                }]),
                ..NodeStatus::default()
            });
            api.create(&PostParams::default(), &node)
                .await
                .expect("create node");
            let status = serde_json::json!({"status": {"addresses": [
                {"type": "InternalIP", "address": n.ip().to_string()}]}});
            api.patch_status(&n.name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .expect("node status");
        }

        let cni = cozyplane_testkit::cni_plugin_bin();
        let cozyplane = cozyplane_testkit::cozyplane_bin();
        let mut agents = Vec::new();
        for n in topo.nodes() {
            let base = dir.path().join(&n.name);
            let bpffs = base.join("bpffs");
            let socket = base.join("run/agent.sock");
            let conf_dir = base.join("net.d");
            let args: Vec<String> = vec![
                "--node-name".into(),
                n.name.clone(),
                "--kubeconfig".into(),
                agent_kc.display().to_string(),
                "--cluster-cidr".into(),
                CLUSTER_CIDR.into(),
                "--bpffs".into(),
                bpffs.display().to_string(),
                "--run-dir".into(),
                base.join("run").display().to_string(),
                "--cni-conf-dir".into(),
                conf_dir.display().to_string(),
                "--metrics-bind".into(),
                METRICS.into(),
                "--sync-debounce-ms".into(),
                "20".into(),
            ];
            agents.push(Agent {
                child: None,
                args,
                log: base.join("agent.log"),
                socket,
                conflist: conf_dir.join("10-cozyplane.conflist"),
                bpffs,
            });
        }
        let mut c = Cluster {
            topo,
            server: Some(server),
            client,
            agents,
            cni,
            cozyplane,
            dir,
            relay,
            seq: std::sync::atomic::AtomicU32::new(0),
        };
        for i in 0..c.agents.len() {
            c.start_agent(i);
        }
        for i in 0..c.agents.len() {
            c.wait_ready(i);
        }
        c
    }

    /// Starts node `i`'s agent (appending to its log).
    pub fn start_agent(&mut self, i: usize) {
        let a = &self.agents[i];
        std::fs::create_dir_all(a.log.parent().expect("parent")).expect("agent dir");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&a.log)
            .expect("agent log");
        let mut cmd = Command::new(&self.cozyplane);
        cmd.arg("agent")
            .args(&a.args)
            .env("RUST_LOG", "info,cozyplane_agent=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        let child = self
            .topo
            .spawn_in_node(&self.topo.nodes()[i], &mut cmd)
            .expect("spawn agent");
        self.agents[i].child = Some(child);
    }

    /// SIGKILLs node `i`'s agent.
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for `/readyz` of node `i`'s agent and its conflist; panics with
    /// the agent's log when it exits or is not ready within 60 s.
    pub fn wait_ready(&mut self, i: usize) {
        let ready = cozyplane_testkit::poll(
            &format!("agent {i} to be ready with its conflist"),
            Duration::from_secs(60),
            || {
                if let Some(Ok(Some(status))) = self.agents[i].child.as_mut().map(Child::try_wait) {
                    panic!(
                        "agent {i} exited with {status}; log:\n{}",
                        self.agent_log(i)
                    );
                }
                // Ready first, the conflist right after it (written last).
                match self.http_get(i, "/readyz") {
                    Ok((200, _)) if self.agents[i].conflist.exists() => Ok(()),
                    Ok((200, _)) => Err("ready, no conflist yet".to_string()),
                    Ok((code, body)) => Err(format!("/readyz: {code} {body}")),
                    Err(e) => Err(format!("/readyz: {e}")),
                }
            },
        );
        if let Err(e) = ready {
            panic!("{e}; log:\n{}", self.agent_log(i));
        }
    }

    pub fn agent_log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.agents[i].log).unwrap_or_default()
    }

    /// GET on node `i`'s metrics address (from inside the node).
    pub fn http_get(&self, i: usize, path: &str) -> std::io::Result<(u16, String)> {
        let addr: SocketAddr = METRICS.parse().expect("addr");
        let mut s = self.topo.nodes()[i]
            .netns
            .netns
            .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)))
            .map_err(std::io::Error::other)??;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let code = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }

    /// A metric value of node `i` (first sample whose line starts with `prefix`).
    pub fn metric(&self, i: usize, prefix: &str) -> u64 {
        let (code, body) = self.http_get(i, "/metrics").expect("metrics");
        assert_eq!(code, 200, "metrics: {body}");
        body.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {prefix} in\n{body}"))
    }

    fn plugin_conf(&self, node: usize) -> String {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "cozyplane",
            "type": "cozyplane",
            "agentSocket": self.agents[node].socket,
        })
        .to_string()
    }

    /// Runs the plugin with the CNI environment and `stdin`.
    pub fn run_plugin(
        &self,
        command: &str,
        container_id: &str,
        netns: Option<&Path>,
        cni_args: &str,
        stdin: &str,
    ) -> Output {
        let mut cmd = Command::new(&self.cni);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/opt/cni/bin")
            .env("CNI_ARGS", cni_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(n) = netns {
            cmd.env("CNI_NETNS", n);
        }
        if !container_id.is_empty() {
            cmd.env("CNI_CONTAINERID", container_id);
        }
        let mut child = cmd.spawn().expect("spawn plugin");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("plugin output")
    }

    pub fn pod_args(name: &str, uid: &str) -> String {
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID={uid}")
    }

    /// Creates a pod namespace (named after the lab, so teardown finds it).
    pub fn new_pod_netns(&self) -> (String, Netns, PathBuf) {
        let n = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{}-p{n}", self.topo.name());
        let netns = create_named_netns(&name).expect("pod netns");
        let path = cozyplane_datapath::netlink::named_netns_path(&name);
        (name, netns, path)
    }

    /// The Pod object `name` in `default`, bound to node `node`, as the
    /// kubelet has it before it calls the runtime: the agent reads it at ADD
    /// (the VPC it may ask for). Returns its UID, which the runtime passes as
    /// `K8S_POD_UID`. Needs a multi-thread runtime (the test's).
    pub fn pod_object(&self, name: &str, node: usize) -> String {
        self.pod_object_annotated(name, node, serde_json::json!({}))
    }

    /// [`Cluster::pod_object`] with `annotations` (a JSON object).
    pub fn pod_object_annotated(
        &self,
        name: &str,
        node: usize,
        annotations: serde_json::Value,
    ) -> String {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"nodeName": self.topo.nodes()[node].name,
                     "containers": [{"name": "c", "image": "probe"}]}
        }))
        .expect("pod object");
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), "default");
        let created = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(api.create(&PostParams::default(), &pod))
        })
        .expect("create the pod object");
        created.metadata.uid.expect("a UID")
    }

    /// ADD through the plugin; panics on failure.
    pub fn add_pod(&self, node: usize) -> Pod {
        self.add_pod_annotated(node, serde_json::json!({}))
    }

    /// [`Cluster::add_pod`] of a pod object with `annotations`.
    pub fn add_pod_annotated(&self, node: usize, annotations: serde_json::Value) -> Pod {
        let (name, netns, path) = self.new_pod_netns();
        let uid = self.pod_object_annotated(&name, node, annotations);
        let cid = format!("cid{}", name.replace('-', ""));
        let out = self.run_plugin(
            "ADD",
            &cid,
            Some(&path),
            &Self::pod_args(&name, &uid),
            &self.plugin_conf(node),
        );
        assert!(
            out.status.success(),
            "ADD {name} on node {node}: {}\n{}\nagent log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.agent_log(node)
        );
        let ip = result_ip(&out.stdout);
        Pod {
            name,
            netns,
            netns_path: path,
            container_id: cid,
            uid,
            node,
            ip,
        }
    }

    /// DEL through the plugin (with netns); returns the output.
    pub fn del(&self, pod: &Pod) -> Output {
        self.run_plugin(
            "DEL",
            &pod.container_id,
            Some(&pod.netns_path),
            &Self::pod_args(&pod.name, &pod.uid),
            &self.plugin_conf(pod.node),
        )
    }

    /// DEL, then the pod namespace is removed.
    pub fn remove_pod(&self, pod: Pod) {
        let out = self.del(&pod);
        assert!(
            out.status.success(),
            "DEL {}: {}{}",
            pod.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let name = pod.name.clone();
        drop(pod);
        delete_named_netns(&name).expect("delete pod netns");
    }

    /// Conf for a raw invocation against node `node`.
    pub fn conf(&self, node: usize) -> String {
        self.plugin_conf(node)
    }

    pub async fn fabric_ips(&self) -> Vec<FabricIP> {
        Api::<FabricIP>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .expect("list FabricIPs")
            .items
    }

    /// Pod veths (`cph…`) on node `i`, with their aliases (the records).
    pub async fn pod_veth_links(&self, i: usize) -> Vec<cozyplane_datapath::netlink::LinkInfo> {
        self.topo.nodes()[i]
            .netns
            .nl
            .list_links()
            .await
            .expect("links")
            .into_iter()
            .filter(|l| l.name.starts_with("cph"))
            .collect()
    }

    /// Names of the pod veths (`cph…`) on node `i`.
    pub async fn pod_veths(&self, i: usize) -> Vec<String> {
        self.pod_veth_links(i)
            .await
            .into_iter()
            .map(|l| l.name)
            .collect()
    }
}

impl Cluster {
    /// Waits until node `i` has no pod veth (DEL deletes them in the
    /// background); panics with the leftovers after 10 s.
    pub async fn wait_no_pod_veths(&self, i: usize) {
        let gone = cozyplane_testkit::poll_async(
            &format!("node {i} to have no pod veths"),
            Duration::from_secs(10),
            || async move {
                let left = self.pod_veths(i).await;
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?}"))
                }
            },
        )
        .await;
        if let Err(e) = gone {
            let links: Vec<String> = self.topo.nodes()[i]
                .netns
                .nl
                .list_links()
                .await
                .expect("links")
                .into_iter()
                .filter(|l| l.name.starts_with("cph"))
                .map(|l| format!("{} alias {:?} up {}", l.name, l.alias, l.up))
                .collect();
            panic!("{e}\nlinks: {links:?}\nagent log:\n{}", self.agent_log(i));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.agents.len() {
            self.kill_agent(i);
        }
        self.relay.abort();
        for a in &self.agents {
            if let Ok(c) = CString::new(a.bpffs.as_os_str().as_encoded_bytes()) {
                // SAFETY: `c` is a valid NUL-terminated path; MNT_DETACH only
                // unmounts, failure (not mounted) is ignored.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        if let Err(e) = self.topo.destroy() {
            eprintln!("lab teardown: {e}");
        }
    }
}

/// Relays TCP from `listen` in the fabric namespace to `target` here.
fn start_relay(
    topo: &Topology,
    listen: SocketAddr,
    target: SocketAddr,
) -> tokio::task::JoinHandle<()> {
    let fabric = topo.fabric().expect("fabric");
    let l = bind_tcp_in(fabric, listen).expect("bind relay in the fabric");
    l.set_nonblocking(true).expect("nonblocking");
    let l = tokio::net::TcpListener::from_std(l).expect("tokio listener");
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    })
}

/// The pod IPv4 of an ADD result.
pub fn result_ip(stdout: &[u8]) -> Ipv4Addr {
    let v: serde_json::Value = serde_json::from_slice(stdout).expect("ADD result JSON");
    let addr = v["ips"][0]["address"].as_str().expect("ips[0].address");
    addr.split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("bad address {addr}"))
}

/// `ping` from `host` to `ip`; true on a reply.
pub fn ping(host: &impl LabHost, ip: Ipv4Addr) -> bool {
    let out = exec_in(
        host,
        &["ping", "-c", "3", "-i", "0.2", "-W", "2", &ip.to_string()],
    )
    .expect("run ping");
    out.status.success()
}

/// TCP echo of 64 KiB from `client` to `server`; returns the source address
/// the server saw.
pub fn tcp_echo(server: &impl LabHost, ip: Ipv4Addr, client: &impl LabHost, port: u16) -> Ipv4Addr {
    let addr = SocketAddr::from((ip, port));
    let listener = bind_tcp_in(server, addr).expect("bind server");
    let srv = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = vec![0u8; 64 * 1024];
        s.read_exact(&mut buf).expect("read");
        s.write_all(&buf).expect("echo");
        peer
    });
    let payload: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let mut c = client
        .netns()
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .expect("netns")
        .unwrap_or_else(|e| panic!("connect {addr} from {}: {e}", client.name()));
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c.write_all(&payload).expect("send");
    let mut back = vec![0u8; payload.len()];
    c.read_exact(&mut back).expect("echo back");
    assert!(back == payload, "echoed bytes differ");
    match srv.join().expect("server thread").ip() {
        std::net::IpAddr::V4(v4) => v4,
        other => panic!("unexpected peer {other}"),
    }
}

/// One UDP datagram and its echo; returns the source the server saw.
pub fn udp_echo(server: &impl LabHost, ip: Ipv4Addr, client: &impl LabHost, port: u16) -> Ipv4Addr {
    let addr = SocketAddr::from((ip, port));
    let s = server
        .netns()
        .run(move || UdpSocket::bind(addr))
        .expect("netns")
        .expect("bind udp");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let c = client
        .netns()
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .expect("netns")
        .expect("bind udp client");
    c.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let srv = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let (n, peer) = s.recv_from(&mut buf).expect("udp recv");
        s.send_to(&buf[..n], peer).expect("udp reply");
        peer
    });
    // UDP is lossy while neighbours resolve: retry the datagram.
    let mut got = None;
    for _ in 0..10 {
        c.send_to(b"cozyplane-udp", addr).expect("udp send");
        let mut buf = [0u8; 64];
        if let Ok((n, _)) = c.recv_from(&mut buf) {
            got = Some(buf[..n].to_vec());
            break;
        }
    }
    assert_eq!(got.as_deref(), Some(&b"cozyplane-udp"[..]), "no UDP echo");
    match srv.join().expect("server thread").ip() {
        std::net::IpAddr::V4(v4) => v4,
        other => panic!("unexpected peer {other}"),
    }
}

/// Sends exactly one UDP datagram from `client` to a server at `ip` that
/// echoes it, and waits up to `wait` for the echo: no resend, so a datagram
/// or reply the datapath cannot place yet shows as `false`.
pub fn udp_first_reply(
    server: &impl LabHost,
    ip: Ipv4Addr,
    client: &impl LabHost,
    port: u16,
    wait: Duration,
) -> bool {
    let addr = SocketAddr::from((ip, port));
    let s = server
        .netns()
        .run(move || UdpSocket::bind(addr))
        .expect("netns")
        .expect("bind udp");
    s.set_read_timeout(Some(wait + Duration::from_secs(1)))
        .expect("timeout");
    let c = client
        .netns()
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .expect("netns")
        .expect("bind udp client");
    c.set_read_timeout(Some(wait)).expect("timeout");
    let srv = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        if let Ok((n, peer)) = s.recv_from(&mut buf) {
            let _ = s.send_to(&buf[..n], peer);
        }
    });
    c.send_to(b"cozyplane-first", addr).expect("udp send");
    let mut buf = [0u8; 64];
    let got = matches!(c.recv_from(&mut buf), Ok((n, _)) if &buf[..n] == b"cozyplane-first");
    let _ = srv.join();
    got
}

/// A pod in a VPC: its fabric (net 0) address is `pod.ip`, the one the ADD
/// result names and the node reaches it at through the bridge; `vpc_ip` is
/// its address inside the VPC, the only one it holds.
pub struct VpcPod {
    pub pod: Pod,
    pub vpc_ip: Ipv4Addr,
}

impl LabHost for VpcPod {
    fn name(&self) -> &str {
        &self.pod.name
    }
    fn netns(&self) -> &Netns {
        &self.pod.netns
    }
}

impl Cluster {
    /// VPC `default/<name>` with `cidr`, Ready with `vni` as the controller
    /// leaves it (no controller runs here), and the VPCBinding that lets
    /// namespace `default` attach to it.
    pub async fn create_vpc(&self, name: &str, cidr: &str, vni: u32) {
        let vpcs: Api<cozyplane_api::VPC> = Api::namespaced(self.client.clone(), "default");
        let vpc: cozyplane_api::VPC = serde_json::from_value(serde_json::json!({
            "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"cidrs": [cidr]}
        }))
        .expect("VPC object");
        vpcs.create(&PostParams::default(), &vpc)
            .await
            .expect("create the VPC");
        let status = serde_json::json!({"status": {"vni": vni, "phase": "Ready"}});
        vpcs.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("VPC status");
        let bindings: Api<cozyplane_api::VPCBinding> =
            Api::namespaced(self.client.clone(), "default");
        let binding: cozyplane_api::VPCBinding = serde_json::from_value(serde_json::json!({
            "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPCBinding",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"vpcRef": {"name": name}}
        }))
        .expect("VPCBinding object");
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .expect("create the VPCBinding");
    }

    /// ADD of a pod that asks for VPC `default/<vpc>` (annotation
    /// `sdn.cozystack.io/vpc`); its VPC address is the one the agent
    /// annotated the pod with (`sdn.cozystack.io/vpc-ip`).
    pub fn add_vpc_pod(&self, node: usize, vpc: &str) -> VpcPod {
        use cozyplane_api::labels::{ANNOTATION_VPC, ANNOTATION_VPC_IP};
        let pod = self.add_pod_annotated(node, serde_json::json!({ ANNOTATION_VPC: vpc }));
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), "default");
        let stored = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(api.get(&pod.name))
        })
        .expect("read the pod object");
        let vpc_ip = stored
            .metadata
            .annotations
            .and_then(|a| a.get(ANNOTATION_VPC_IP).cloned())
            .and_then(|ip| ip.parse().ok())
            .unwrap_or_else(|| panic!("{} has no IPv4 {ANNOTATION_VPC_IP}", pod.name));
        VpcPod { pod, vpc_ip }
    }

    /// The datapath state of node `i` that the agent writes per pod and per
    /// VPC, read from its pinned maps (the test process opens the same
    /// pins): `cp_ports`, `cp_locals`, `cp_bridges`, `cp_vnis` and
    /// `cp_remotes`, one line per entry.
    pub fn map_state(&self, i: usize) -> MapState {
        let dp = cozyplane_datapath::Datapath::load(self.agents[i].bpffs.join("cozyplane"))
            .expect("open the node's pinned datapath");
        assert!(
            dp.replaced_pins().is_empty(),
            "reading node {i}'s maps replaced {:?}",
            dp.replaced_pins()
        );
        let lines = |v: Vec<String>| v.into_iter().collect::<std::collections::BTreeSet<_>>();
        MapState {
            ports: lines(
                dp.ports
                    .entries()
                    .expect("cp_ports")
                    .iter()
                    .map(|(ifindex, p)| format!("{ifindex} net {} flags {:#x}", p.net, p.flags))
                    .collect(),
            ),
            locals: lines(
                dp.locals
                    .entries()
                    .expect("cp_locals")
                    .iter()
                    .map(|(k, e)| {
                        format!(
                            "{} {} -> {} {:02x?}",
                            k.net,
                            k.addr.to_ip(),
                            e.ifindex,
                            e.mac
                        )
                    })
                    .collect(),
            ),
            bridges: lines(
                dp.bridges
                    .entries()
                    .expect("cp_bridges")
                    .iter()
                    .map(|(k, b)| {
                        format!(
                            "{} -> net {} {} on {}",
                            k.addr.to_ip(),
                            b.net,
                            b.vpc.to_ip(),
                            b.ifindex
                        )
                    })
                    .collect(),
            ),
            vnis: lines(
                dp.vnis
                    .entries()
                    .expect("cp_vnis")
                    .iter()
                    .map(|(vni, net)| format!("{vni} -> {net}"))
                    .collect(),
            ),
            remotes: lines(
                dp.remotes
                    .entries()
                    .expect("cp_remotes")
                    .iter()
                    .map(|(k, r)| {
                        let addr = k.data().addr.to_ip();
                        // the key counts the network's bits, and IPv4 is v4-mapped
                        let skip = cozyplane_datapath::abi::LPM_NET_BITS
                            + if addr.is_ipv4() { 96 } else { 0 };
                        let len = k.prefix_len().saturating_sub(skip);
                        format!("{} {addr}/{len} -> {}", k.data().net, r.tunnel_ip())
                    })
                    .collect(),
            ),
            netns: lines(
                dp.svc
                    .netns
                    .entries()
                    .expect("cp_netns")
                    .iter()
                    .map(|(cookie, v)| format!("{cookie} -> net {} on {}", v.net, v.ifindex))
                    .collect(),
            ),
        }
    }
}

/// See [`Cluster::map_state`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapState {
    pub ports: std::collections::BTreeSet<String>,
    pub locals: std::collections::BTreeSet<String>,
    pub bridges: std::collections::BTreeSet<String>,
    pub vnis: std::collections::BTreeSet<String>,
    pub remotes: std::collections::BTreeSet<String>,
    /// `cp_netns`: `<netns cookie> -> net <net> on <ifindex>`.
    pub netns: std::collections::BTreeSet<String>,
}

/// A TCP stream from `client` to an echo server in `server` at `addr`,
/// echoing 8-byte rounds every 5 ms on a thread, each round bounded by a
/// 5 s read timeout (a stall past it, a reset or a wrong echo ends the
/// stream with an error).
pub struct EchoStream {
    stop: Arc<std::sync::atomic::AtomicBool>,
    rounds: Arc<std::sync::atomic::AtomicU64>,
    thread: std::thread::JoinHandle<Result<(), String>>,
    pub what: String,
}

impl EchoStream {
    /// Listens in `server` on `listen`, connects from `client` to `to`
    /// (the same address, or the fabric address the bridge translates to
    /// `listen`), and starts the rounds.
    pub fn start(
        what: &str,
        server: &impl LabHost,
        listen: SocketAddr,
        client: &impl LabHost,
        to: SocketAddr,
    ) -> EchoStream {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let listener = bind_tcp_in(server, listen).expect("bind");
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let mut stream = client
            .netns()
            .run(move || TcpStream::connect_timeout(&to, Duration::from_secs(5)))
            .expect("netns")
            .unwrap_or_else(|e| panic!("{what}: connect {to}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let (s2, r2) = (stop.clone(), rounds.clone());
        let thread = std::thread::spawn(move || -> Result<(), String> {
            let mut i = 0u64;
            while !s2.load(Ordering::Relaxed) {
                let msg = i.to_be_bytes();
                stream
                    .write_all(&msg)
                    .map_err(|e| format!("write {i}: {e}"))?;
                let mut back = [0u8; 8];
                stream
                    .read_exact(&mut back)
                    .map_err(|e| format!("read {i}: {e}"))?;
                if back != msg {
                    return Err(format!("round {i}: echoed {back:?}"));
                }
                i += 1;
                r2.store(i, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        });
        EchoStream {
            stop,
            rounds,
            thread,
            what: what.to_string(),
        }
    }

    /// Did the stream complete a round within the next 300 ms?
    pub fn progressed(&self) -> bool {
        use std::sync::atomic::Ordering;
        let before = self.rounds.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        self.rounds.load(Ordering::Relaxed) > before
    }

    /// Stops the rounds; the stream's error, if it broke.
    pub fn finish(self) -> Result<u64, String> {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::Relaxed);
        let what = self.what;
        self.thread
            .join()
            .map_err(|_| format!("{what}: the stream thread panicked"))?
            .map_err(|e| format!("{what}: {e}"))?;
        Ok(self.rounds.load(Ordering::Relaxed))
    }
}
