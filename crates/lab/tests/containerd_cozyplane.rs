//! The cozyplane plugin under containerd 1.6's CRI, against a stand-in agent.
//!
//! The real `cozyplane` plugin binary runs from containerd's `bin_dir`; its agent
//! side is a real unix-socket server built from `cozyplane_cni::server` whose
//! handler really plumbs the pod with `cozyplane_datapath::netlink::plumb` (veth,
//! address, routes) and answers per the plugin/agent protocol. Unlike the real agent
//! (`containerd_agent`), it records every request, so this test pins down the
//! runtime ↔ plugin contract: one ADD, then DEL on stop (with netns and
//! `prevResult`), then a second DEL on remove (without either).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod containerd_support;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use containerd_support::*;
use cozyplane_cni::proto::{Request, Response};
use cozyplane_cni::server::{bind_atomic, serve_connection};
use cozyplane_cni::types::{AttachmentResult, Interface, IpConfig, IpNet, Route};
use cozyplane_cni::CniError;
use cozyplane_cri_harness::cni_netns;
use cozyplane_datapath::netlink::{
    host_veth_name, plumb, unplumb, NetnsHandle, NlHandle, PlumbRequest, POD_GATEWAY_V4,
};
use cozyplane_testkit::needs;

/// What the stand-in agent saw.
#[derive(Debug, Clone)]
enum Seen {
    Add {
        container_id: String,
        pod_name: Option<String>,
        ip: Ipv4Addr,
        host_veth: String,
    },
    Del {
        container_id: String,
        netns: Option<String>,
        had_prev_result: bool,
        removed_veth: bool,
    },
    Other(&'static str),
}

impl Seen {
    fn op(&self) -> &'static str {
        match self {
            Seen::Add { .. } => "add",
            Seen::Del { .. } => "del",
            Seen::Other(op) => op,
        }
    }
}

/// A real unix-socket agent that plumbs pods with the datapath's `plumb` and hands
/// out addresses from 10.252.0.0/24.
struct StandInAgent {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    thread: Option<JoinHandle<()>>,
}

impl StandInAgent {
    fn start(socket: &Path) -> StandInAgent {
        let listener = bind_atomic(socket).expect("bind agent socket");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("agent runtime");
            let mut ipam = Ipam::default();
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let _ = serve_connection(&conn, |req| {
                    let (resp, event) = rt.block_on(handle(req, &mut ipam));
                    seen2.lock().unwrap_or_else(|e| e.into_inner()).push(event);
                    resp
                });
            }
        });
        StandInAgent {
            socket: socket.to_path_buf(),
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for StandInAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket); // wake accept()
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Default)]
struct Ipam {
    by_container: HashMap<String, Ipv4Addr>,
    next: u8,
}

impl Ipam {
    fn claim(&mut self, container_id: &str) -> Option<Ipv4Addr> {
        if let Some(ip) = self.by_container.get(container_id) {
            return Some(*ip);
        }
        let host = self.next.max(10).checked_add(1)?;
        self.next = host;
        let ip = Ipv4Addr::new(10, 252, 0, host);
        self.by_container.insert(container_id.to_string(), ip);
        Some(ip)
    }
}

async fn handle(req: &Request, ipam: &mut Ipam) -> (Response, Seen) {
    match req {
        Request::Add(add) => {
            let a = &add.attachment;
            let fail = |msg: String| Response::Error {
                error: CniError::new(11, "stand-in agent ADD failed").with_details(msg),
            };
            let (Some(netns), Some(ip)) = (a.netns.as_deref(), ipam.claim(&a.container_id)) else {
                return (
                    fail("no netns or no address".into()),
                    Seen::Other("add-rejected"),
                );
            };
            let host_veth = host_veth_name(&a.container_id, &a.ifname);
            let alias = format!("cri-test {}", a.container_id);
            let plumbed = async {
                let host = NetnsHandle::current()?;
                plumb(
                    &host,
                    &PlumbRequest {
                        pod_netns: Path::new(netns),
                        ifname: &a.ifname,
                        host_ifname: &host_veth,
                        mtu: add.mtu.unwrap_or(1450),
                        ipv4: Some(ip),
                        ipv6: None,
                        pod_mac: None,
                        alias: &alias,
                        host_routes: None,
                    },
                )
                .await
            }
            .await;
            let event = Seen::Add {
                container_id: a.container_id.clone(),
                pod_name: a.pod.as_ref().map(|p| p.name.clone()),
                ip,
                host_veth,
            };
            let plumbed = match plumbed {
                Ok(p) => p,
                Err(e) => return (fail(e.to_string()), event),
            };
            let gw = IpAddr::V4(POD_GATEWAY_V4);
            let result = AttachmentResult {
                interfaces: vec![Interface {
                    name: a.ifname.clone(),
                    mac: Some(plumbed.pod_mac.to_string()),
                    sandbox: Some(netns.to_string()),
                    ..Interface::default()
                }],
                ips: vec![IpConfig {
                    address: IpNet::from(IpAddr::V4(ip)),
                    gateway: Some(gw),
                    interface: Some(0),
                }],
                // IpNet's default is 0.0.0.0/0
                routes: vec![Route::new(IpNet::default(), Some(gw))],
                ..AttachmentResult::default()
            };
            (
                Response::Ok {
                    result: Some(result),
                },
                event,
            )
        }
        Request::Del(del) => {
            let a = &del.attachment;
            let host_veth = host_veth_name(&a.container_id, &a.ifname);
            let removed = async { unplumb(&NlHandle::current()?, &host_veth).await }.await;
            ipam.by_container.remove(&a.container_id);
            let event = |removed_veth| Seen::Del {
                container_id: a.container_id.clone(),
                netns: a.netns.clone(),
                had_prev_result: del.prev_result.is_some(),
                removed_veth,
            };
            match removed {
                Ok(removed) => (Response::ok(), event(removed)),
                Err(e) => (
                    Response::Error {
                        error: CniError::new(11, "stand-in agent DEL failed")
                            .with_details(e.to_string()),
                    },
                    event(false),
                ),
            }
        }
        other => (Response::ok(), Seen::Other(other.op())),
    }
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cozyplane_plugin_runs_a_sandbox_through_cri() {
    if !requirements_met(needs!()) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let plugin = plugin_binary();
    assert!(plugin.is_file(), "no plugin binary at {}", plugin.display());
    let base = scratch();
    let cni = cni_dirs(base.path());
    std::os::unix::fs::symlink(&plugin, cni.bin_dir.join("cozyplane")).expect("link plugin");
    let agent = StandInAgent::start(&base.path().join("agent.sock"));
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "cozyplane",
        "plugins": [{ "type": "cozyplane", "agentSocket": agent.socket }],
    });
    std::fs::write(
        cni.conf_dir.join("10-cozyplane.conflist"),
        conflist.to_string(),
    )
    .expect("write conflist");

    let (ctd, mut cri) = start(base.path(), &cni).await;
    let netns_before = cni_netns().expect("list netns");
    let log_dir = base.path().join("logs");
    std::fs::create_dir_all(&log_dir).expect("create log dir");
    let t0 = std::time::Instant::now();
    let id = cri
        .run_pod_sandbox(pod("web").sandbox_config(&log_dir))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "RunPodSandbox: {e}\nagent saw {:?}\n{}",
                agent.seen(),
                ctd.log()
            )
        });
    eprintln!(
        "RunPodSandbox (cozyplane plugin + stand-in agent) took {:?}",
        t0.elapsed()
    );

    // ADD reached our side exactly once, for this sandbox and pod
    let seen = agent.seen();
    let (ip, host_veth) = match seen.as_slice() {
        [Seen::Add {
            container_id,
            pod_name,
            ip,
            host_veth,
        }] => {
            assert_eq!(container_id, &id);
            assert_eq!(pod_name.as_deref(), Some("web"));
            (*ip, host_veth.clone())
        }
        other => panic!("expected one ADD, agent saw {other:?}"),
    };
    // the runtime reports the address our side assigned
    assert_eq!(
        cri.pod_ip(&id).await.expect("PodSandboxStatus IP"),
        ip.to_string()
    );
    // and the pod really has it: eth0 with the /32, lo from the loopback plugin
    let ns = new_netns(&netns_before);
    let eth0 = addrs_in(&ns, "eth0");
    assert!(eth0.contains(&format!("inet {ip}/32")), "{eth0}");
    assert!(addrs_in(&ns, "lo").contains("inet 127.0.0.1/8"));
    assert!(
        host_link_exists(&host_veth),
        "host veth {host_veth} missing"
    );

    // Stop: DEL with the netns and the ADD result; the veth goes
    cri.stop_pod_sandbox(&id).await.expect("StopPodSandbox");
    assert!(
        !host_link_exists(&host_veth),
        "veth {host_veth} left after stop"
    );
    let seen = agent.seen();
    match &seen[1..] {
        [Seen::Del {
            container_id,
            netns,
            had_prev_result,
            removed_veth,
        }] => {
            assert_eq!(container_id, &id);
            assert!(netns.is_some(), "first DEL should carry the netns");
            assert!(*had_prev_result, "first DEL should carry prevResult");
            assert!(*removed_veth, "first DEL should have removed the veth");
        }
        other => panic!("expected one DEL after stop, agent saw {other:?}"),
    }

    // Remove: a second DEL, without netns or prevResult, succeeds with nothing to do
    cri.remove_pod_sandbox(&id).await.expect("RemovePodSandbox");
    let seen = agent.seen();
    match &seen[2..] {
        [Seen::Del {
            container_id,
            netns,
            had_prev_result,
            removed_veth,
        }] => {
            assert_eq!(container_id, &id);
            assert_eq!(netns, &None, "second DEL comes without a netns");
            assert!(!had_prev_result, "second DEL comes without prevResult");
            assert!(!removed_veth, "nothing was left for the second DEL");
        }
        other => panic!("expected a second DEL after remove, agent saw {other:?}"),
    }
    assert!(cri.list_pod_sandbox().await.expect("list").is_empty());
    assert_eq!(
        cni_netns().expect("list netns"),
        netns_before,
        "pod netns left behind"
    );
    assert!(!host_link_exists(&host_veth));
    // containerd 1.6 made no CHECK, STATUS or GC calls in this lifecycle
    let ops: Vec<_> = agent.seen().iter().map(Seen::op).collect();
    assert_eq!(ops, ["add", "del", "del"]);
    ctd.shutdown().await.expect("shutdown");
    drop(agent);
}
