//! The lab kubelet (`cozyplane lab kubelet`, hidden; one per node, started
//! by `lab up` inside the node's namespace).
//!
//! It runs the Pods bound to its node with no container runtime: a pod's
//! workload is a process of the lab's own `cozyplane` binary (see [`plan`]),
//! started in a named netns the kubelet creates and plumbs through the real
//! CNI plugin with the node's conflist ([`cni`]), exactly as a container
//! runtime would. It reports the pod's status ([`status`]) and tears the pod
//! down when it is deleted.
//!
//! Pieces:
//! - [`plan`]: pod spec → what to run (pure);
//! - [`status`]: what was observed → `PodStatus` (pure);
//! - [`cni`]: the plugin invocations;
//! - [`workload`]: the process, its stop, readiness checks;
//! - [`record`]: the per-pod record that makes a restart safe;
//! - `pod`: one task per pod (set up, run, restart, tear down);
//! - `reconcile`: the watch on the node's pods that starts and stops those tasks.
//!
//! Why processes in netns and not containerd: the lab must run on a machine
//! with nothing but the kernel, and what the connectivity test checks is the
//! pod network, which these pods get from the same plugin and agent as real ones.

pub mod cni;
mod events;
pub mod plan;
mod pod;
mod reconcile;
pub mod record;
pub mod status;
pub mod workload;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{ClusterError, ClusterResult};

/// Arguments of `cozyplane lab kubelet`.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeletArgs {
    /// The node this kubelet runs (its Kubernetes node name).
    #[arg(long)]
    pub node: String,
    /// The node's address (reported as hostIP, and podIP of hostNetwork pods).
    #[arg(long)]
    pub node_ip: IpAddr,
    /// Kubeconfig of the lab's API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The node's CNI conf dir (where its agent writes the conflist).
    #[arg(long)]
    pub cni_conf_dir: PathBuf,
    /// The node's CNI bin dir (where its agent installs the plugin).
    #[arg(long)]
    pub cni_bin_dir: PathBuf,
    /// Per-pod records, workload logs and termination logs.
    #[arg(long)]
    pub state_dir: PathBuf,
    /// The `cozyplane` binary workloads run.
    #[arg(long)]
    pub cozyplane_bin: PathBuf,
    /// Where `/readyz` answers (200 once the first list of pods is handled).
    #[arg(long, default_value = "127.0.0.1:9413")]
    pub readyz_bind: SocketAddr,
    /// The node's cgroup (v2): workloads start in it, as a real node's pods
    /// run below its cgroup, so the node's agent's socket-level Service load
    /// balancer (attached there) translates their connects, and no other
    /// node's agent does.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
}

/// What every pod task shares.
pub(crate) struct Ctx {
    pub node: String,
    pub node_ip: IpAddr,
    pub cni: cni::Cni,
    pub state_dir: PathBuf,
    pub cozyplane: PathBuf,
    pub client: kube::Client,
    pub cgroup: Option<PathBuf>,
}

/// One line in the kubelet log (stderr, which `lab up` sends to the node's `kubelet.log`).
macro_rules! klog {
    ($($arg:tt)*) => {
        eprintln!("{} {}", k8s_openapi::jiff::Timestamp::now(), format_args!($($arg)*))
    };
}
pub(crate) use klog;

/// Runs the kubelet until its watch fails for good.
pub async fn run(args: KubeletArgs) -> ClusterResult<()> {
    crate::cluster::require_root()?;
    std::fs::create_dir_all(&args.state_dir)
        .map_err(|e| ClusterError::io("create", &args.state_dir, e))?;
    let client = crate::cluster::api_client(&args.kubeconfig).await?;
    let ready = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind(args.readyz_bind)
        .await
        .map_err(|e| ClusterError::io("bind", args.readyz_bind.to_string(), e))?;
    tokio::spawn(serve_readyz(listener, ready.clone()));
    let ctx = Arc::new(Ctx {
        node: args.node.clone(),
        node_ip: args.node_ip,
        cni: cni::Cni {
            conf_dir: args.cni_conf_dir,
            bin_dir: args.cni_bin_dir,
        },
        state_dir: args.state_dir,
        cozyplane: args.cozyplane_bin,
        client,
        cgroup: args.cgroup,
    });
    klog!(
        "kubelet for {} ({}) starting; state in {}",
        ctx.node,
        ctx.node_ip,
        ctx.state_dir.display()
    );
    reconcile::run(ctx, ready).await
}

/// A minimal `/readyz`: 200 once `ready`, else 503 (any path, any method).
pub(crate) async fn serve_readyz(listener: tokio::net::TcpListener, ready: Arc<AtomicBool>) {
    while let Ok((mut s, _)) = listener.accept().await {
        let ready = ready.load(Ordering::Relaxed);
        tokio::spawn(async move {
            // Read the request head (a client that closes with unread data gets a reset).
            let mut buf = Vec::new();
            let mut chunk = [0u8; 512];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let reply: &[u8] = if ready {
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
            } else {
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot ready\n"
            };
            let _ = s.write_all(reply).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readyz_follows_the_flag() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let ready = Arc::new(AtomicBool::new(false));
        tokio::spawn(serve_readyz(l, ready.clone()));
        let get = move || {
            let own = cozyplane_datapath::netlink::Netns::current().expect("netns");
            crate::cluster::http_status(&own, addr, "/readyz")
        };
        let before = tokio::task::spawn_blocking(get).await.expect("join");
        assert_eq!(before, Some(503));
        ready.store(true, Ordering::Relaxed);
        let after = tokio::task::spawn_blocking(get).await.expect("join");
        assert_eq!(after, Some(200));
    }
}
