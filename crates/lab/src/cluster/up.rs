//! `lab up`: topology, API server, relay, Nodes, agents, controller, scheduler,
//! EndpointSlice controller, kubelets, the external probe server, then detach.
//!
//! Any failure after the topology exists destroys the whole lab before the
//! error is returned, so a failed `up` leaves nothing behind (the error names
//! the log of the component that failed; the logs go with the run directory,
//! so the error also quotes the log's tail).

use std::fs::OpenOptions;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cozyplane_errors::Chain;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::unistd::dup2_raw;

use super::error::{ClusterError, ClusterResult};
use super::identity::{self, Ca, Identity};
use super::record::{ClusterRecord, Component};
use super::{api, preflight, probe, relay, UpArgs, BIN_ENV, CNI_BIN_ENV};
use crate::exec::LabHost;
use crate::{LabError, Topology, TopologySpec};

/// The API server's port inside the fabric.
const API_PORT: u16 = 6443;
/// The service-address slot of the API server (`198.18.0.2` by default).
const API_SLOT: u32 = 1;
/// Agents' health endpoint, on each node's loopback.
const AGENT_READYZ: &str = "127.0.0.1:9411";
/// The controller's health endpoint, on the fabric's loopback.
const CONTROLLER_READYZ: &str = "127.0.0.1:9412";
/// The scheduler's health endpoint, on the fabric's loopback.
const SCHEDULER_READYZ: &str = "127.0.0.1:9414";
/// The EndpointSlice controller's health endpoint, on the fabric's loopback.
const ENDPOINTS_READYZ: &str = "127.0.0.1:9415";
/// Kubelets' health endpoint, on each node's loopback.
const KUBELET_READYZ: &str = "127.0.0.1:9413";
/// The external probe server's ports (TCP and UDP; HTTP on [`EXTERNAL_HTTP`]).
const EXTERNAL_PORT: u16 = 8000;
/// The external probe server's HTTP port (any GET answers 200: its health check).
const EXTERNAL_HTTP: u16 = 8080;
/// The external probe server's name (what it answers with).
const EXTERNAL_NAME: &str = "external";
/// The pod CIDR of the lab.
const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The Service CIDR of the lab (IPv4 only, as the pod network; kubeadm's default).
const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The connectivity test's kubeconfig, in the run dir.
pub const CONNECTIVITY_KUBECONFIG: &str = "connectivity-kubeconfig";
/// How long one component may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The binaries `up` runs.
struct Binaries {
    /// `cozyplane` for `apiserver`, `agent`, `controller`, `probe` (and the pods' workloads).
    cozyplane: PathBuf,
    /// This executable, for `lab relay`, `lab scheduler`, `lab endpoints`, `lab kubelet`.
    lab: PathBuf,
    /// The CNI plugin the agents install, if there is one.
    cni: Option<PathBuf>,
}

fn binaries() -> ClusterResult<Binaries> {
    let cozyplane = super::cozyplane_binary()?;
    preflight::require_binary("the cozyplane binary", &cozyplane, BIN_ENV)?;
    let lab = std::env::current_exe()
        .map_err(|e| ClusterError::io("find the current executable", "/proc/self/exe", e))?;
    let cni = match std::env::var_os(CNI_BIN_ENV) {
        Some(p) => {
            let p = PathBuf::from(p);
            preflight::require_binary("the CNI plugin", &p, CNI_BIN_ENV)?;
            Some(p)
        }
        None => Some(cozyplane.with_file_name("cozyplane-cni")).filter(|p| p.is_file()),
    };
    Ok(Binaries {
        cozyplane,
        lab,
        cni,
    })
}

/// Brings the lab up and leaves it running; returns what it started.
pub async fn up(args: &UpArgs) -> ClusterResult<ClusterRecord> {
    preflight::check_host()?;
    let bins = binaries()?;
    let t0 = Instant::now();
    println!("building topology {} ({} nodes)", args.name, args.nodes);
    let mut topo = match Topology::build(TopologySpec::new(&args.name, args.nodes)).await {
        Ok(t) => t,
        Err(LabError::AlreadyExists { name, .. }) => return Err(ClusterError::Exists(name)),
        Err(e) => return Err(e.into()),
    };
    match start(&topo, &bins, args).await {
        Ok(record) => {
            let run_dir = topo.run_dir().to_path_buf();
            topo.detach();
            let kc = record.kubeconfig.display();
            println!(
                "lab {} is up in {:.1} s",
                record.name,
                t0.elapsed().as_secs_f64()
            );
            println!("kubeconfig: {kc}");
            println!("  kubectl --kubeconfig {kc} get nodes -o wide");
            println!("logs: {}", run_dir.display());
            println!(
                "connectivity test: cozyplane connectivity test --kubeconfig {}",
                run_dir.join(CONNECTIVITY_KUBECONFIG).display()
            );
            println!("status: cozyplane lab status --name {}", record.name);
            println!("remove: cozyplane lab down --name {}", record.name);
            Ok(record)
        }
        Err(e) => {
            eprintln!("lab up failed, removing lab {}", args.name);
            if let Err(cleanup) = topo.destroy() {
                eprintln!(
                    "removing lab {} failed too: {cleanup}; retry with `cozyplane lab down --name {}`",
                    args.name, args.name
                );
            }
            Err(e)
        }
    }
}

/// A started process: the child (to notice an early exit) and its record.
struct Started {
    child: Child,
    component: Component,
}

/// Starts `cmd` in `host` as a tracked lab process, stdout and stderr to `log`,
/// in its own process group (a Ctrl-C meant for `lab up` must not kill the lab).
fn spawn(
    topo: &Topology,
    host: &impl LabHost,
    mut cmd: Command,
    role: &str,
    log: PathBuf,
    readyz: Option<SocketAddr>,
) -> ClusterResult<Started> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|e| ClusterError::io("create", dir, e))?;
    }
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| ClusterError::io("open log", &log, e))?;
    let err = out
        .try_clone()
        .map_err(|e| ClusterError::io("dup log fd", &log, e))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let child = topo.spawn_in(host, &mut cmd)?;
    let stat = format!("/proc/{}/stat", child.id());
    let pid = i32::try_from(child.id())
        .map_err(|_| ClusterError::io("track", &stat, std::io::ErrorKind::InvalidData.into()))?;
    let start_time = crate::process::start_time(pid)
        .map_err(|e| ClusterError::io("read start time", &stat, e))?
        .ok_or_else(|| {
            ClusterError::io(
                "read start time",
                &stat,
                std::io::ErrorKind::NotFound.into(),
            )
        })?;
    Ok(Started {
        child,
        component: Component {
            role: role.to_string(),
            place: host.name().to_string(),
            pid,
            start_time,
            readyz,
            log,
        },
    })
}

/// The last lines of a log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Polls `ready` until it holds, failing early if the process exits.
async fn wait_ready(
    what: &str,
    started: &mut Started,
    mut ready: impl FnMut() -> bool,
) -> ClusterResult<Duration> {
    let t0 = Instant::now();
    loop {
        let not_ready = |detail: String| ClusterError::NotReady {
            what: what.to_string(),
            detail: format!(
                "{detail}; last log lines:\n{}",
                log_tail(&started.component.log)
            ),
            log: started.component.log.clone(),
        };
        if let Ok(Some(status)) = started.child.try_wait() {
            return Err(not_ready(format!("exited with {status}")));
        }
        if ready() {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > READY_TIMEOUT {
            return Err(not_ready(format!("not ready after {READY_TIMEOUT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where one lab node's agent runs: what differs from a node of a real
/// cluster (paths, its kubeconfig, the API server's address).
#[derive(Debug, Clone)]
pub struct AgentPlace<'a> {
    /// The node's name.
    pub node: &'a str,
    /// The agent's kubeconfig (its own identity).
    pub kubeconfig: &'a Path,
    /// The node's state directory (bpffs, run dir, CNI dirs below it).
    pub dir: &'a Path,
    /// The node's cgroup (the socket-level load balancer's root).
    pub cgroup: &'a Path,
    /// The API server's address as a CIDR (an allowed external backend).
    pub apiserver: &'a str,
    /// `--kube-proxy-replacement`.
    pub kube_proxy_replacement: bool,
    /// `--service-slots` (a test's; the chart never sets it).
    pub service_slots: Option<u32>,
    /// The CNI plugin to install, if any.
    pub cni_plugin: Option<&'a Path>,
}

/// The lab agent's command line (after the binary). The settings are the
/// `cozyplane` chart's (charts/cozyplane/templates/agent.yaml: a chart test
/// parses both and compares them); only the places differ.
pub fn agent_args(p: &AgentPlace<'_>) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = Vec::new();
    let mut flag = |k: &str, v: &std::ffi::OsStr| {
        let mut f = std::ffi::OsString::from(format!("--{k}="));
        f.push(v);
        a.push(f);
    };
    flag("node-name", p.node.as_ref());
    flag("kubeconfig", p.kubeconfig.as_os_str());
    flag("cluster-cidr", CLUSTER_CIDR.as_ref());
    flag("bpffs", p.dir.join("bpffs").as_os_str());
    flag("run-dir", p.dir.join("run").as_os_str());
    flag("cni-conf-dir", p.dir.join("net.d").as_os_str());
    flag("cni-conf-name", "10-cozyplane.conflist".as_ref());
    flag("cni-bin-dir", p.dir.join("cni-bin").as_os_str());
    flag("cgroup-root", p.cgroup.as_os_str());
    flag("masquerade", "bpf".as_ref());
    // The API server runs in the fabric, not on a node (a managed control
    // plane): the `kubernetes` Service's endpoint is allowed by name, as an
    // operator of such a cluster would.
    flag("service-external-backends", p.apiserver.as_ref());
    flag("metrics-bind", AGENT_READYZ.as_ref());
    flag(
        "kube-proxy-replacement",
        p.kube_proxy_replacement.to_string().as_ref(),
    );
    if let Some(n) = p.service_slots {
        flag("service-slots", n.to_string().as_ref());
    }
    if let Some(cni) = p.cni_plugin {
        flag("cni-plugin", cni.as_os_str());
    }
    a.insert(0, "agent".into());
    a
}

/// The lab controller's command line (after the binary); as the chart's
/// (charts/cozyplane/templates/controller.yaml), but for the kubeconfig and
/// the Lease's namespace.
pub fn controller_args(kubeconfig: &Path) -> Vec<std::ffi::OsString> {
    let mut kc = std::ffi::OsString::from("--kubeconfig=");
    kc.push(kubeconfig);
    vec![
        "controller".into(),
        kc,
        "--leader-elect=true".into(),
        format!("--lease-namespace={}", identity::LEASE_NAMESPACE).into(),
        format!("--metrics-bind={CONTROLLER_READYZ}").into(),
    ]
}

async fn start(topo: &Topology, bins: &Binaries, args: &UpArgs) -> ClusterResult<ClusterRecord> {
    let run = topo.run_dir().to_path_buf();
    let fabric = topo
        .fabric()
        .ok_or_else(|| LabError::Destroyed(topo.name().to_string()))?;
    let svc_ip = topo.add_service_address(API_SLOT).await?;
    let mut started: Vec<Started> = Vec::new();

    // The API server, in the fabric, on the service address only: the nodes reach it
    // on-link, the host through the relay; no other fabric address (the router's, the
    // external segment's) listens.
    let api_dir = run.join("apiserver");
    let written_kc = api_dir.join("kubeconfig.json");
    let api_url = format!("https://{svc_ip}:{API_PORT}");
    let mut cmd = Command::new(&bins.cozyplane);
    cmd.args([
        "apiserver",
        "--standalone",
        "--bind-address",
        &svc_ip.to_string(),
    ])
    .args(["--port", &API_PORT.to_string()])
    .arg("--data-dir")
    .arg(api_dir.join("data"))
    .arg("--cert-dir")
    .arg(api_dir.join("certs"))
    .args(["--tls-san", &svc_ip.to_string()])
    .args(["--service-cluster-ip-range", SERVICE_CIDR])
    .arg("--write-kubeconfig")
    .arg(&written_kc);
    print!("starting the API server … ");
    flush();
    let api_t0 = Instant::now();
    let mut apiserver = spawn(
        topo,
        fabric,
        cmd,
        "apiserver",
        api_dir.join("apiserver.log"),
        None,
    )?;
    // The kubeconfig appears (atomically) once the server serves.
    wait_ready("the API server", &mut apiserver, || {
        std::fs::read(&written_kc)
            .ok()
            .and_then(|b| serde_saphyr::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|kc| kc.get("clusters").is_some())
    })
    .await?;
    started.push(apiserver);

    // The host's admin kubeconfig (through the relay); the components get their own below.
    let host_listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| ClusterError::io("bind", "127.0.0.1:0", e))?;
    let host_port = host_listener
        .local_addr()
        .map_err(|e| ClusterError::io("local address of", "127.0.0.1:0", e))?
        .port();
    let host_kc = run.join("kubeconfig");
    let host_url = format!("https://127.0.0.1:{host_port}");
    api::rewrite_kubeconfig(&written_kc, &host_kc, &host_url)?;

    // The relay: accepts on the host listener, connects inside the fabric.
    let mut cmd = Command::new(&bins.lab);
    cmd.args(["lab", "relay", "--listen-fd", &relay::LISTEN_FD.to_string()])
        .args(["--to", &format!("{svc_ip}:{API_PORT}")]);
    pass_fd(&mut cmd, &host_listener)?;
    let mut relay_proc = spawn(topo, fabric, cmd, "relay", api_dir.join("relay.log"), None)?;
    drop(host_listener); // the relay holds its own copy
    let client = api::client(&host_kc).await?;
    let mut api_up = false;
    let mut last_err = String::new();
    let t0 = Instant::now();
    while !api_up {
        if let Ok(Some(status)) = relay_proc.child.try_wait() {
            return Err(ClusterError::NotReady {
                what: "the API relay".into(),
                detail: format!(
                    "exited with {status}: {}",
                    log_tail(&relay_proc.component.log)
                ),
                log: relay_proc.component.log.clone(),
            });
        }
        match api::nodes(&client).await {
            Ok(_) => api_up = true,
            Err(e) if t0.elapsed() < READY_TIMEOUT => {
                last_err = Chain(&e).to_string();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                return Err(ClusterError::NotReady {
                    what: "the API server (through the relay)".into(),
                    detail: format!("{} (earlier: {last_err})", Chain(&e)),
                    log: started[0].component.log.clone(),
                })
            }
        }
    }
    println!("ready ({:.1} s)", api_t0.elapsed().as_secs_f64());
    started.push(relay_proc);

    // Nodes, the components' roles and identities, then one agent per node (all
    // started, then awaited in order).
    for n in topo.nodes() {
        api::register_node(&client, &n.name, &n.ip().to_string()).await?;
    }
    identity::create_roles(&client).await?;
    let ca = Ca::load(&api_dir.join("certs"))?;
    let readyz: SocketAddr = parse_addr(AGENT_READYZ)?;
    // Each node's cgroup (recorded for teardown before it exists: the nodes'
    // first, their parent last, as rmdir needs).
    let mount = Path::new(super::LAB_CGROUP_MOUNT);
    cozyplane_datapath::ensure_cgroup2(mount).map_err(|e| {
        ClusterError::io(
            "mount cgroup2 at",
            mount,
            std::io::Error::other(Chain(&e).to_string()),
        )
    })?;
    for n in topo.nodes() {
        topo.record_cgroup(super::node_cgroup(topo.name(), &n.name))?;
    }
    if let Some(parent) = topo.nodes().first().and_then(|n| {
        super::node_cgroup(topo.name(), &n.name)
            .parent()
            .map(Path::to_path_buf)
    }) {
        topo.record_cgroup(parent)?;
    }
    for n in topo.nodes() {
        let cg = super::node_cgroup(topo.name(), &n.name);
        std::fs::create_dir_all(&cg)
            .map_err(|e| ClusterError::io("create the node cgroup", &cg, e))?;
    }
    let mut agents = Vec::new();
    for n in topo.nodes() {
        let dir = run.join("nodes").join(&n.name);
        let kc = identity::kubeconfig_path(&run, "agent", Some(&n.name));
        ca.write_kubeconfig(&kc, &api_url, &Identity::agent(&n.name))?;
        let mut cmd = Command::new(&bins.cozyplane);
        cmd.args(agent_args(&AgentPlace {
            node: &n.name,
            kubeconfig: &kc,
            dir: &dir,
            cgroup: &super::node_cgroup(topo.name(), &n.name),
            apiserver: &format!("{svc_ip}/32"),
            kube_proxy_replacement: args.kube_proxy_replacement,
            service_slots: args.service_slots,
            cni_plugin: bins.cni.as_deref(),
        }));
        let conflist = dir.join("net.d").join("10-cozyplane.conflist");
        let agent = spawn(topo, n, cmd, "agent", dir.join("agent.log"), Some(readyz))?;
        agents.push((n, agent, conflist));
    }
    for (n, mut agent, conflist) in agents {
        print!("starting node {} … ", n.name);
        flush();
        let name = format!("the agent of {}", n.name);
        // Ready first, the conflist right after it (the agent writes it last).
        let took = wait_ready(&name, &mut agent, || {
            probe::http_status(n.netns(), readyz, "/readyz") == Some(200) && conflist.exists()
        })
        .await?;
        println!("ready ({:.1} s)", took.as_secs_f64());
        started.push(agent);
    }

    // The controller, in the fabric.
    let creadyz = parse_addr(CONTROLLER_READYZ)?;
    let kc = identity::kubeconfig_path(&run, "controller", None);
    ca.write_kubeconfig(&kc, &api_url, &Identity::controller())?;
    let mut cmd = Command::new(&bins.cozyplane);
    cmd.args(controller_args(&kc));
    print!("starting the controller … ");
    flush();
    let log = run.join("controller").join("controller.log");
    let mut controller = spawn(topo, fabric, cmd, "controller", log, Some(creadyz))?;
    let took = wait_ready("the controller", &mut controller, || {
        probe::http_status(fabric.netns(), creadyz, "/readyz") == Some(200)
    })
    .await?;
    println!("ready ({:.1} s)", took.as_secs_f64());
    started.push(controller);

    start_pod_runtime(topo, bins, &ca, &api_url, &mut started).await?;
    // The connectivity test's own kubeconfig (from the host, through the relay).
    let conn_kc = run.join(CONNECTIVITY_KUBECONFIG);
    ca.write_kubeconfig(&conn_kc, &host_url, &Identity::connectivity())?;
    if let Some(ext) = topo.external() {
        started.push(start_external(topo, bins, ext).await?);
        let lab_ext = serde_json::json!({
            "externalTarget": format!("{}:{EXTERNAL_PORT}", ext.ip),
            "externalName": EXTERNAL_NAME,
        });
        api::add_context_extension(&host_kc, lab_ext.clone())?;
        api::add_context_extension(&conn_kc, lab_ext)?;
    }

    let record = ClusterRecord {
        name: topo.name().to_string(),
        nodes: topo.nodes().iter().map(|n| n.name.clone()).collect(),
        kubeconfig: host_kc,
        components: started.into_iter().map(|s| s.component).collect(),
        service_cidrs: vec![SERVICE_CIDR.to_string()],
    };
    record.save(&run)?;
    Ok(record)
}

/// The scheduler and the EndpointSlice controller (in the fabric) and one
/// kubelet per node, each awaited with a progress line.
async fn start_pod_runtime(
    topo: &Topology,
    bins: &Binaries,
    ca: &Ca,
    api_url: &str,
    started: &mut Vec<Started>,
) -> ClusterResult<()> {
    let run = topo.run_dir().to_path_buf();
    let fabric = topo
        .fabric()
        .ok_or_else(|| LabError::Destroyed(topo.name().to_string()))?;
    let sreadyz = parse_addr(SCHEDULER_READYZ)?;
    let kc = identity::kubeconfig_path(&run, "scheduler", None);
    ca.write_kubeconfig(&kc, api_url, &Identity::scheduler())?;
    let mut cmd = Command::new(&bins.lab);
    cmd.args(["lab", "scheduler", "--kubeconfig"])
        .arg(&kc)
        .args(["--readyz-bind", SCHEDULER_READYZ]);
    print!("starting the scheduler … ");
    flush();
    let log = run.join("scheduler").join("scheduler.log");
    let mut scheduler = spawn(topo, fabric, cmd, "scheduler", log, Some(sreadyz))?;
    let took = wait_ready("the scheduler", &mut scheduler, || {
        probe::http_status(fabric.netns(), sreadyz, "/readyz") == Some(200)
    })
    .await?;
    println!("ready ({:.1} s)", took.as_secs_f64());
    started.push(scheduler);

    let ereadyz = parse_addr(ENDPOINTS_READYZ)?;
    let kc = identity::kubeconfig_path(&run, "endpoints", None);
    ca.write_kubeconfig(&kc, api_url, &Identity::endpoints())?;
    let mut cmd = Command::new(&bins.lab);
    cmd.args(["lab", "endpoints", "--kubeconfig"])
        .arg(&kc)
        .args(["--readyz-bind", ENDPOINTS_READYZ]);
    print!("starting the endpointslice controller … ");
    flush();
    let log = run.join("endpoints").join("endpoints.log");
    let mut endpoints = spawn(topo, fabric, cmd, "endpoints", log, Some(ereadyz))?;
    let took = wait_ready("the endpointslice controller", &mut endpoints, || {
        probe::http_status(fabric.netns(), ereadyz, "/readyz") == Some(200)
    })
    .await?;
    println!("ready ({:.1} s)", took.as_secs_f64());
    started.push(endpoints);

    let kreadyz = parse_addr(KUBELET_READYZ)?;
    let mut kubelets = Vec::new();
    for n in topo.nodes() {
        let dir = run.join("nodes").join(&n.name);
        let kc = identity::kubeconfig_path(&run, "kubelet", Some(&n.name));
        ca.write_kubeconfig(&kc, api_url, &Identity::kubelet(&n.name))?;
        let mut cmd = Command::new(&bins.lab);
        cmd.args(["lab", "kubelet", "--node", &n.name])
            .args(["--node-ip", &n.ip().to_string(), "--kubeconfig"])
            .arg(&kc)
            .arg("--cni-conf-dir")
            .arg(dir.join("net.d"))
            .arg("--cni-bin-dir")
            .arg(dir.join("cni-bin"))
            .arg("--state-dir")
            .arg(dir.join("kubelet"))
            .arg("--cozyplane-bin")
            .arg(&bins.cozyplane)
            .arg("--cgroup")
            .arg(super::node_cgroup(topo.name(), &n.name))
            .args(["--readyz-bind", KUBELET_READYZ]);
        let log = dir.join("kubelet.log");
        kubelets.push((n, spawn(topo, n, cmd, "kubelet", log, Some(kreadyz))?));
    }
    for (n, mut kubelet) in kubelets {
        print!("starting the kubelet of {} … ", n.name);
        flush();
        let what = format!("the kubelet of {}", n.name);
        let took = wait_ready(&what, &mut kubelet, || {
            probe::http_status(n.netns(), kreadyz, "/readyz") == Some(200)
        })
        .await?;
        println!("ready ({:.1} s)", took.as_secs_f64());
        started.push(kubelet);
    }
    Ok(())
}

/// The probe server on the external host: the target of pod → outside checks.
async fn start_external(
    topo: &Topology,
    bins: &Binaries,
    ext: &crate::External,
) -> ClusterResult<Started> {
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, EXTERNAL_HTTP));
    let mut cmd = Command::new(&bins.cozyplane);
    cmd.args(["probe", "server", "--name", EXTERNAL_NAME])
        .args(["--tcp-port", &EXTERNAL_PORT.to_string()])
        .args(["--udp-port", &EXTERNAL_PORT.to_string()])
        .args(["--http-port", &EXTERNAL_HTTP.to_string()]);
    print!("starting the external probe server on {} … ", ext.ip);
    flush();
    let log = topo.run_dir().join("external").join("probe.log");
    let mut server = spawn(topo, ext, cmd, "external", log, Some(http))?;
    let took = wait_ready("the external probe server", &mut server, || {
        probe::http_status(ext.netns(), http, "/") == Some(200)
    })
    .await?;
    println!("ready ({:.1} s)", took.as_secs_f64());
    Ok(server)
}

fn parse_addr(s: &str) -> ClusterResult<SocketAddr> {
    s.parse().map_err(|e| ClusterError::BadFile {
        path: PathBuf::from(s),
        detail: format!("not a socket address: {}", Chain(&e)),
    })
}

fn flush() {
    // Progress output only; a closed stdout is not worth failing `up` for.
    let _ = std::io::stdout().flush();
}

/// Makes `listener` the child's [`relay::LISTEN_FD`], open across exec.
fn pass_fd(cmd: &mut Command, listener: &impl AsFd) -> ClusterResult<()> {
    // A close-on-exec duplicate owned by the hook: it lives as long as `cmd`, so the
    // caller may drop its listener once the child is spawned.
    let fd: OwnedFd = listener
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| ClusterError::io("dup the relay listener", "127.0.0.1", e))?;
    let target = relay::LISTEN_FD;
    // SAFETY: the hook runs in the forked child before exec and only calls fcntl(2)
    // or dup2(2) (through nix), which are async-signal-safe and allocate nothing.
    // `dup2_raw` hands back an owner of `target`: nothing else in the child owns that
    // number (a descriptor there was close-on-exec or stray, and dup2 closes it), and
    // the owner is released unclosed because the program the child execs needs it.
    unsafe {
        cmd.pre_exec(move || {
            if fd.as_raw_fd() == target {
                // Already the right number: only the close-on-exec flag must go.
                fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
            } else {
                // dup2 leaves close-on-exec off on the copy.
                let _ = dup2_raw(&fd, target)?.into_raw_fd();
            }
            Ok(())
        });
    }
    Ok(())
}
