//! The Services benchmark (issue #11, `cozyplane-bench services`): our
//! socket-level load balancer next to kube-proxy's iptables shape, in one
//! run, each figure beside its baseline.
//!
//! Three measurements:
//!
//! 1. **Connect to the last of N Services** (N = 1k / 10k / 100k by default,
//!    2 endpoints each), TCP_CRR with the bench's own client, against a direct
//!    connect to the backend pod's address. Per round and N, two identical
//!    topologies are built (the peer baselines' "direct" one: client pod →
//!    node 1 → underlay → node 2 → server pod, plain routing): on the first the
//!    client connects to the pod address (**direct**, from a cgroup nothing is
//!    attached to) and to the Service address (**cozyplane**, from the cgroup
//!    where the socket-LB programs are attached, N Services synced into the
//!    maps through the agent's compiler); on the second node 1 holds
//!    kube-proxy's rules for the same N Services (restored with
//!    `iptables-legacy-restore`, timed) and the client connects to the Service
//!    address (**kube-proxy**). The kube-proxy variant has its own topology
//!    because its client's TCP timestamps differ from the others' (the
//!    destination it connects to differs), which trips the server's TIME_WAIT
//!    checks on reused ports (the artifact `peer-baselines.md` describes).
//!    The three variants are measured back to back, order reversed each round.
//! 2. **Programming 10k Services × 10 backends from empty maps**: the compile
//!    (Kubernetes objects → tables → desired maps) and `SvcMaps::sync`, timed
//!    apart, against `iptables-legacy-restore --noflush` of the same Services
//!    in kube-proxy's shape in a fresh network namespace (initial, then again:
//!    kube-proxy's resync), alternating which goes first.
//! 3. **A backend change with 10k Services programmed**: one Service's
//!    EndpointSlice gains or loses a backend; timed are the compile and the
//!    sync, until the frontend in the kernel map names a range of the new
//!    size (read back from the map after each sample), two ways in alternate
//!    pairs of samples: the agent's path (the slice applied to its
//!    `ServiceIndex`, the touched Service recompiled, `SvcMaps::sync_changes`
//!    of the changed frontends) and, as the baseline, the full path the agent
//!    took before (every Service compiled, `SvcMaps::sync` reading the maps
//!    back and comparing everything). Not measured: the API server and the
//!    watch.
//!
//! Everything created carries the run's prefix and is removed on the way out
//! (drop guards: network namespaces, the server processes, the cgroups, the
//! socket-LB links, the private bpffs). Speed is only reported, never asserted.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cozyplane_agent::compile::services::{compile_services, to_desired, NodeView, ServiceIndex};
use cozyplane_datapath::abi::{SvcKey, SVC_SCOPE_INTERNAL};
use cozyplane_datapath::service::{SvcDesired, SvcSyncReport};
use cozyplane_datapath::{detach_socket_lb, ensure_bpffs, ensure_cgroup2, Datapath};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::error::{BenchError, Result};
use crate::kubeproxy::{self, ServiceSet, SERVICE_PORT, TARGET_PORT};
use crate::rr::RrReport;
use crate::runner::Pinning;
use crate::stats::{median, percentile_sorted, ratio};

/// Report markers in `docs/benchmarks.md`.
pub const BEGIN: &str = "<!-- services-bench:begin -->";
/// End marker.
pub const END: &str = "<!-- services-bench:end -->";

/// The server pod's two addresses: the endpoints of the measured Services.
pub const BACKENDS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 244, 2, 10), Ipv4Addr::new(10, 244, 2, 11)];
/// The RR port of the server (unused here, but `serve` wants one).
const RR_PORT: u16 = 7001;
/// Extra time a client gets beyond its nominal duration before it is killed.
const GRACE: Duration = Duration::from_secs(30);
/// IP protocol number of TCP.
const TCP: u8 = 6;

/// What to run.
#[derive(Clone, Debug)]
pub struct SvcConfig {
    /// Rounds of each measurement.
    pub rounds: u32,
    /// CRR measuring period, seconds.
    pub seconds: u32,
    /// CRR warm-up, seconds.
    pub warmup: f64,
    /// Service counts of the connect measurement.
    pub sizes: Vec<u32>,
    /// Largest N the kube-proxy variant of the connect measurement runs at.
    pub iptables_max: u32,
    /// Services of the programming and change measurements.
    pub program_services: u32,
    /// Backends per Service there.
    pub program_backends: u32,
    /// Samples of the change measurement.
    pub change_samples: u32,
    /// Which parts: connect, program, change.
    pub parts: Parts,
    /// The `iptables-restore` of the kube-proxy shape.
    pub iptables_restore: PathBuf,
    /// This binary (`serve` and `client` run it).
    pub tool: PathBuf,
    /// Name prefix of everything created.
    pub prefix: String,
    /// CPUs of client and server.
    pub pin: Option<Pinning>,
}

/// Which measurements to run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Parts {
    /// Connect latency/rate.
    pub connect: bool,
    /// Programming from empty.
    pub program: bool,
    /// Backend change.
    pub change: bool,
    /// Cross-node ClusterIP CRR through the eBPF datapath (`svc_crossnode`).
    pub crossnode: bool,
    /// Cross-node RR/CRR with 100 NetworkPolicies vs none (`policy_crossnode`).
    pub policy: bool,
}

impl Parts {
    /// Parses `connect,program,change`.
    pub fn parse(s: &str) -> Result<Parts> {
        let mut p = Parts::default();
        for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "connect" => p.connect = true,
                "program" => p.program = true,
                "change" => p.change = true,
                "crossnode" => p.crossnode = true,
                "policy" => p.policy = true,
                other => {
                    return Err(BenchError::Invalid(format!(
                        "unknown part {other:?} (want connect, program, change, crossnode, policy)"
                    )))
                }
            }
        }
        if !(p.connect || p.program || p.change || p.crossnode || p.policy) {
            return Err(BenchError::Invalid("no part selected".into()));
        }
        if p.policy && (p.connect || p.program || p.change || p.crossnode) {
            return Err(BenchError::Invalid(
                "policy runs alone (its report has a block of its own)".into(),
            ));
        }
        if p.crossnode && (p.connect || p.program || p.change) {
            return Err(BenchError::Invalid(
                "crossnode runs alone (its report has a block of its own)".into(),
            ));
        }
        Ok(p)
    }

    /// The report markers of the selected parts.
    pub fn markers(&self) -> (&'static str, &'static str) {
        if self.policy {
            (crate::policy_crossnode::BEGIN, crate::policy_crossnode::END)
        } else if self.crossnode {
            (crate::svc_crossnode::BEGIN, crate::svc_crossnode::END)
        } else {
            (BEGIN, END)
        }
    }
}

/// One CRR measurement.
#[derive(Clone, Debug)]
pub struct Crr {
    /// Round.
    pub round: u32,
    /// Services.
    pub n: u32,
    /// Which variant.
    pub variant: ConnectVariant,
    /// What the client measured.
    pub report: RrReport,
}

/// The variants of the connect measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectVariant {
    /// Straight to the pod address, no Service.
    Direct,
    /// The Service address, translated by our socket-LB.
    Cozyplane,
    /// The Service address, DNAT by kube-proxy's iptables rules on node 1.
    KubeProxy,
}

impl ConnectVariant {
    fn label(self) -> &'static str {
        match self {
            ConnectVariant::Direct => "direct to the pod IP (no Service)",
            ConnectVariant::Cozyplane => "cozyplane socket-LB",
            ConnectVariant::KubeProxy => "kube-proxy iptables-legacy",
        }
    }
}

/// Per round and N: what programming took on each side.
#[derive(Clone, Debug)]
pub struct Programmed {
    /// Round.
    pub round: u32,
    /// Services.
    pub n: u32,
    /// Backends per Service.
    pub backends: u32,
    /// Compile (objects → desired maps), seconds.
    pub compile_s: f64,
    /// `SvcMaps::sync` from empty maps, seconds.
    pub sync_s: f64,
    /// What the sync wrote.
    pub writes: String,
    /// `iptables-restore --noflush`, chains new, seconds (None: not run).
    pub restore_s: Option<f64>,
    /// The same again over existing chains (kube-proxy's full resync), seconds.
    pub resync_s: Option<f64>,
    /// Rules restored (nat).
    pub nat_rules: u64,
}

/// The change measurement's samples, seconds.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// Services programmed.
    pub n: u32,
    /// Backends per Service.
    pub backends: u32,
    /// The agent's path (index, sync of changes).
    pub incremental: ChangePath,
    /// The full path (every Service compiled, a full sync): the baseline.
    pub full: ChangePath,
}

/// One way of handling a change: its samples, seconds.
#[derive(Clone, Debug, Default)]
pub struct ChangePath {
    /// Compile per sample.
    pub compile: Vec<f64>,
    /// Sync per sample.
    pub sync: Vec<f64>,
    /// Compile + sync + reading the frontend back, per sample.
    pub total: Vec<f64>,
    /// Frontend values written per sample (should be 1).
    pub frontends_written: Vec<usize>,
}

/// Everything one run measured.
#[derive(Clone, Debug, Default)]
pub struct SvcResult {
    /// Connect measurements.
    pub crr: Vec<Crr>,
    /// Programming at the connect sizes (2 backends) and the programming size.
    pub programmed: Vec<Programmed>,
    /// The change measurement.
    pub changes: Option<Changes>,
    /// The cross-node ClusterIP measurement.
    pub crossnode: Vec<crate::svc_crossnode::CrossRun>,
    /// The cross-node NetworkPolicy measurement.
    pub policy: Vec<crate::policy_crossnode::PolicyRun>,
    /// N values at which the kube-proxy variant was skipped, and why.
    pub skipped: Vec<String>,
}

/// Runs `cmd` to completion; its stdout, or an error naming it.
fn run_ok(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| BenchError::io(format!("run {what}"), e))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err
            .chars()
            .rev()
            .take(400)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(BenchError::Command {
            what: what.to_string(),
            status: out.status.to_string(),
            stderr: tail,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<()> {
    run_ok(
        Command::new("ip").args(args),
        &format!("ip {}", args.join(" ")),
    )
    .map(|_| ())
}

fn in_ns(ns: &str, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).args(args);
    run_ok(&mut cmd, &format!("{ns}: {}", args.join(" "))).map(|_| ())
}

/// Deletes network namespace `ns`, killing what runs in it first.
fn delete_netns(ns: &str) {
    if let Ok(pids) = run_ok(
        Command::new("ip").args(["netns", "pids", ns]),
        "ip netns pids",
    ) {
        for pid in pids.split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
}

/// The peer baselines' "direct" topology: pods `<prefix>p1` (10.244.1.10)
/// and `<prefix>p2` (10.244.2.10 and .11) behind nodes `<prefix>n1` and
/// `<prefix>n2`, routed over a veth underlay. Removed on drop, with the
/// server running in it.
pub struct Topo {
    prefix: String,
    server: Option<Child>,
}

impl Topo {
    /// The namespace of `which` (p1, n1, n2, p2).
    pub fn ns(&self, which: &str) -> String {
        format!("{}{which}", self.prefix)
    }

    /// Builds it and starts the CRR server (port [`TARGET_PORT`]) in p2.
    pub fn build(prefix: &str, tool: &Path, server_cpu: Option<usize>) -> Result<Topo> {
        let mut t = Topo {
            prefix: prefix.to_string(),
            server: None,
        };
        let (p1, n1, n2, p2) = (t.ns("p1"), t.ns("n1"), t.ns("n2"), t.ns("p2"));
        for n in [&n1, &n2] {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
            in_ns(n, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        }
        ip(&[
            "link", "add", "ul0", "netns", &n1, "type", "veth", "peer", "name", "ul0", "netns", &n2,
        ])?;
        ip(&["-n", &n1, "addr", "add", "192.168.77.1/24", "dev", "ul0"])?;
        ip(&["-n", &n2, "addr", "add", "192.168.77.2/24", "dev", "ul0"])?;
        ip(&["-n", &n1, "link", "set", "ul0", "up"])?;
        ip(&["-n", &n2, "link", "set", "ul0", "up"])?;
        for (pod, node, host_if, addr, gw) in [
            (&p1, &n1, "vethp1", "10.244.1.10/24", "10.244.1.1"),
            (&p2, &n2, "vethp2", "10.244.2.10/24", "10.244.2.1"),
        ] {
            ip(&["netns", "add", pod])?;
            ip(&["-n", pod, "link", "set", "lo", "up"])?;
            ip(&[
                "link", "add", "eth0", "netns", pod, "type", "veth", "peer", "name", host_if,
                "netns", node,
            ])?;
            ip(&["-n", pod, "addr", "add", addr, "dev", "eth0"])?;
            ip(&["-n", pod, "link", "set", "eth0", "up"])?;
            ip(&["-n", pod, "route", "add", "default", "via", gw])?;
            in_ns(pod, &["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])?;
            ip(&[
                "-n",
                node,
                "addr",
                "add",
                &format!("{gw}/24"),
                "dev",
                host_if,
            ])?;
            ip(&["-n", node, "link", "set", host_if, "up"])?;
        }
        ip(&["-n", &p2, "addr", "add", "10.244.2.11/24", "dev", "eth0"])?;
        ip(&[
            "-n",
            &n1,
            "route",
            "add",
            "10.244.2.0/24",
            "via",
            "192.168.77.2",
        ])?;
        ip(&[
            "-n",
            &n2,
            "route",
            "add",
            "10.244.1.0/24",
            "via",
            "192.168.77.1",
        ])?;

        let tool = tool.to_string_lossy().into_owned();
        let cpu = server_cpu.map(|c| c.to_string());
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &p2]);
        if let Some(cpu) = &cpu {
            cmd.args(["taskset", "-c", cpu]);
        }
        cmd.args([
            &tool,
            "serve",
            "--rr-port",
            &RR_PORT.to_string(),
            "--crr-port",
            &TARGET_PORT.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .map_err(|e| BenchError::io("start the CRR server", e))?;
        let pid = child.id();
        t.server = Some(child);
        wait_listening(pid, TARGET_PORT)?;
        // Resolve neighbours before measuring (as the reference does with a ping).
        in_ns(&p1, &["ping", "-c", "1", "-q", "-W", "2", "10.244.2.10"])?;
        in_ns(&p1, &["ping", "-c", "1", "-q", "-W", "2", "10.244.2.11"])?;
        Ok(t)
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for w in ["p1", "p2", "n1", "n2"] {
            delete_netns(&self.ns(w));
        }
    }
}

/// Waits until process `pid` listens on TCP `port` (its namespace's
/// `/proc/<pid>/net/tcp`).
fn wait_listening(pid: u32, port: u16) -> Result<()> {
    let want = format!(":{port:04X} 00000000:0000 0A");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if let Ok(tcp) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) {
            if tcp.contains(&want) {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(BenchError::Command {
        what: "CRR server".into(),
        status: "timeout".into(),
        stderr: format!("not listening on {port} after 10 s"),
    })
}

/// A cgroup v2 mount of our own with two cgroups: `lb` (the socket-LB
/// programs attached) and `plain` (nothing attached). Removed on drop.
pub struct Cgroups {
    mount: PathBuf,
    /// Where the socket-LB is attached.
    pub lb: PathBuf,
    /// Where nothing is.
    pub plain: PathBuf,
}

impl Cgroups {
    /// Mounts cgroup2 at `<tmp>/<prefix>-cg2` and creates both cgroups.
    pub(crate) fn new(prefix: &str) -> Result<Cgroups> {
        let mount = std::env::temp_dir().join(format!("{prefix}-cg2"));
        ensure_cgroup2(&mount)?;
        let cg = Cgroups {
            lb: mount.join(format!("{prefix}-lb")),
            plain: mount.join(format!("{prefix}-plain")),
            mount,
        };
        for d in [&cg.lb, &cg.plain] {
            std::fs::create_dir_all(d)
                .map_err(|e| BenchError::io(format!("create cgroup {}", d.display()), e))?;
        }
        Ok(cg)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.lb);
        let _ = std::fs::remove_dir(&self.plain);
        umount(&self.mount);
    }
}

fn umount(dir: &Path) {
    let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(dir);
}

/// The datapath loaded into a private bpffs, the socket-LB attached at
/// `cgroups.lb`. Detached, unpinned and unmounted on drop.
struct Loaded {
    dp: Datapath,
    bpffs: PathBuf,
    pins: PathBuf,
    cgroups: Cgroups,
}

impl Loaded {
    fn new(prefix: &str) -> Result<Loaded> {
        let bpffs = std::env::temp_dir().join(format!("{prefix}-bpffs"));
        ensure_bpffs(&bpffs)?;
        let pins = bpffs.join("pins");
        let cgroups = match Cgroups::new(prefix) {
            Ok(c) => c,
            Err(e) => {
                umount(&bpffs);
                return Err(e);
            }
        };
        let mut dp = match Datapath::load(&pins) {
            Ok(dp) => dp,
            Err(e) => {
                remove_tree(&pins);
                umount(&bpffs);
                return Err(e.into());
            }
        };
        let l_err = dp.attach_socket_lb(&cgroups.lb, &pins);
        let loaded = Loaded {
            dp,
            bpffs,
            pins,
            cgroups,
        };
        l_err?;
        Ok(loaded)
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        let _ = detach_socket_lb(&self.pins);
        remove_tree(&self.pins);
        umount(&self.bpffs);
    }
}

/// bpffs has no recursive removal: unlink bottom-up.
fn remove_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                remove_tree(&p);
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// This node's view for the compiler: every endpoint of the generated sets
/// is in 10.0.0.0/8, allowed as an external backend (the bench has no pod
/// claims to make them cluster addresses).
fn node_view() -> NodeView {
    NodeView {
        name: "bench".into(),
        external_backends: vec![ipnet::IpNet::V4(
            ipnet::Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), 8).unwrap_or_default(),
        )],
        ..NodeView::default()
    }
}

/// Compile: objects → desired maps, as the agent's watch loop does it.
fn compile(services: &[Service], slices: &[EndpointSlice], view: &NodeView) -> SvcDesired {
    to_desired(&compile_services(services, slices, view))
}

fn describe(r: &SvcSyncReport) -> String {
    format!(
        "{} frontends, {} backend/reverse entries, {} slots written",
        r.frontends_written, r.backends_written, r.slots_written
    )
}

/// Syncs `desired`, failing unless it converged.
fn sync_converged(dp: &mut Datapath, desired: &SvcDesired) -> Result<SvcSyncReport> {
    let r = dp.svc.sync(desired)?;
    if !r.converged() {
        return Err(BenchError::Output {
            what: "SvcMaps::sync".into(),
            reason: format!(
                "did not converge: {} unfitted, failures {:?}",
                r.unfitted.len(),
                r.failures
            ),
        });
    }
    Ok(r)
}

/// `iptables-restore --noflush < input` in `ns`, timed (the process's wall time).
fn restore(cfg: &SvcConfig, ns: &str, input: &str) -> Result<f64> {
    use std::io::Write as _;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(&cfg.iptables_restore)
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // The input is generated before the clock starts and handed over by a
    // thread, so the time is iptables-restore reading, building and
    // committing the tables (plus one `ip netns exec`, ~1 ms).
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| BenchError::io("start iptables-restore", e))?;
    let mut stdin = child.stdin.take().ok_or_else(|| BenchError::Output {
        what: "iptables-restore".into(),
        reason: "no stdin".into(),
    })?;
    let out = std::thread::scope(|s| {
        let writer = s.spawn(move || {
            let r = stdin.write_all(input.as_bytes());
            drop(stdin);
            r
        });
        let out = child.wait_with_output();
        let w = writer.join();
        (out, w)
    });
    let elapsed = started.elapsed().as_secs_f64();
    let (out, w) = out;
    let out = out.map_err(|e| BenchError::io("wait for iptables-restore", e))?;
    if let Ok(Err(e)) = w {
        return Err(BenchError::io("feed iptables-restore", e));
    }
    if !out.status.success() {
        return Err(BenchError::Command {
            what: format!("{} --noflush in {ns}", cfg.iptables_restore.display()),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr)
                .chars()
                .take(400)
                .collect(),
        });
    }
    Ok(elapsed)
}

/// Runs the CRR client in `ns` (and cgroup `cgroup`) against `server`.
pub(crate) fn crr(
    cfg: &SvcConfig,
    ns: &str,
    cgroup: &Path,
    server: SocketAddr,
) -> Result<RrReport> {
    client_run(cfg, ns, cgroup, server, crate::rr::Mode::Crr)
}

/// Runs the bench's RR or CRR client in netns `ns`, joining `cgroup`.
pub(crate) fn client_run(
    cfg: &SvcConfig,
    ns: &str,
    cgroup: &Path,
    server: SocketAddr,
    mode: crate::rr::Mode,
) -> Result<RrReport> {
    let mode_arg = match mode {
        crate::rr::Mode::Rr => "rr",
        crate::rr::Mode::Crr => "crr",
    };
    let tool = cfg.tool.to_string_lossy().into_owned();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]);
    let cpu = cfg.pin.map(|p| p.client.to_string());
    if let Some(cpu) = &cpu {
        cmd.args(["taskset", "-c", cpu]);
    }
    cmd.args([
        tool.as_str(),
        "client",
        "--mode",
        mode_arg,
        "--server",
        &server.to_string(),
        "--seconds",
        &cfg.seconds.to_string(),
        "--warmup",
        &cfg.warmup.to_string(),
        "--cgroup",
        &cgroup.to_string_lossy(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| BenchError::io("start the CRR client", e))?;
    let deadline =
        Instant::now() + Duration::from_secs_f64(f64::from(cfg.seconds) + cfg.warmup) + GRACE;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BenchError::Command {
                    what: format!("CRR client to {server}"),
                    status: "timeout".into(),
                    stderr: String::new(),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(BenchError::io("wait for the CRR client", e)),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| BenchError::io("CRR client output", e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(BenchError::Command {
            what: format!("CRR client to {server}"),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let line = stdout.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(line)?)
}

/// Runs the selected parts; `log` gets progress lines.
pub fn run(cfg: &SvcConfig, log: impl Fn(&str)) -> Result<SvcResult> {
    if cfg.parts.policy {
        return Ok(SvcResult {
            policy: crate::policy_crossnode::run(cfg, &log)?,
            ..SvcResult::default()
        });
    }
    if cfg.parts.crossnode {
        return Ok(SvcResult {
            crossnode: crate::svc_crossnode::run(cfg, &log)?,
            ..SvcResult::default()
        });
    }
    let mut loaded = Loaded::new(&cfg.prefix)?;
    let view = node_view();
    let mut out = SvcResult::default();
    if cfg.parts.connect {
        connect(cfg, &mut loaded, &view, &log, &mut out)?;
    }
    if cfg.parts.program || cfg.parts.change {
        program(cfg, &mut loaded, &view, &log, &mut out)?;
    }
    // Leave the maps empty.
    sync_converged(&mut loaded.dp, &SvcDesired::new())?;
    Ok(out)
}

fn connect(
    cfg: &SvcConfig,
    loaded: &mut Loaded,
    view: &NodeView,
    log: &impl Fn(&str),
    out: &mut SvcResult,
) -> Result<()> {
    let server_cpu = cfg.pin.map(|p| p.server);
    for &n in &cfg.sizes {
        if n > cfg.iptables_max {
            out.skipped.push(format!(
                "N = {n}: above --iptables-max {} (kube-proxy variant not run)",
                cfg.iptables_max
            ));
        }
    }
    for round in 1..=cfg.rounds {
        for &n in &cfg.sizes {
            let set = ServiceSet {
                services: n,
                backends: 2,
                real: BACKENDS.to_vec(),
            };
            set.validate()?;
            let (services, slices) = set.objects();
            sync_converged(&mut loaded.dp, &SvcDesired::new())?;
            let t0 = Instant::now();
            let desired = compile(&services, &slices, view);
            let t1 = Instant::now();
            let rep = sync_converged(&mut loaded.dp, &desired)?;
            let t2 = Instant::now();
            let mut prog = Programmed {
                round,
                n,
                backends: 2,
                compile_s: (t1 - t0).as_secs_f64(),
                sync_s: (t2 - t1).as_secs_f64(),
                writes: describe(&rep),
                restore_s: None,
                resync_s: None,
                nat_rules: 0,
            };
            log(&format!(
                "round {round} N={n}: compiled in {:.3} s, synced in {:.3} s ({})",
                prog.compile_s, prog.sync_s, prog.writes
            ));
            let plain = Topo::build(&format!("{}a", cfg.prefix), &cfg.tool, server_cpu)?;
            let kp = if n <= cfg.iptables_max {
                let topo = Topo::build(&format!("{}k", cfg.prefix), &cfg.tool, server_cpu)?;
                let (rules, counts) = kubeproxy::service_rules(&set);
                restore(cfg, &topo.ns("n1"), kubeproxy::BASE_RULES)?;
                prog.restore_s = Some(restore(cfg, &topo.ns("n1"), &rules)?);
                prog.resync_s = Some(restore(cfg, &topo.ns("n1"), &rules)?);
                prog.nat_rules = counts.nat_rules;
                log(&format!(
                    "round {round} N={n}: iptables restore {:.3} s, resync {:.3} s ({} nat rules)",
                    prog.restore_s.unwrap_or_default(),
                    prog.resync_s.unwrap_or_default(),
                    counts.nat_rules
                ));
                Some(topo)
            } else {
                None
            };
            out.programmed.push(prog);
            let mut order = vec![ConnectVariant::Direct, ConnectVariant::Cozyplane];
            if kp.is_some() {
                order.push(ConnectVariant::KubeProxy);
            }
            if round % 2 == 0 {
                order.reverse();
            }
            let service = SocketAddr::from((set.last_ip(), SERVICE_PORT));
            for v in order {
                let report = match v {
                    ConnectVariant::Direct => crr(
                        cfg,
                        &plain.ns("p1"),
                        &loaded.cgroups.plain,
                        SocketAddr::from((BACKENDS[0], TARGET_PORT)),
                    )?,
                    ConnectVariant::Cozyplane => {
                        crr(cfg, &plain.ns("p1"), &loaded.cgroups.lb, service)?
                    }
                    ConnectVariant::KubeProxy => match &kp {
                        Some(k) => crr(cfg, &k.ns("p1"), &loaded.cgroups.plain, service)?,
                        None => continue,
                    },
                };
                log(&format!(
                    "round {round} N={n} {}: {:.0} conn/s, connect p50 {:.1} µs, {} errors",
                    v.label(),
                    report.rate_per_s,
                    report.connect.map(|c| c.p50_us).unwrap_or(f64::NAN),
                    report.errors
                ));
                if report.n == 0 {
                    return Err(BenchError::Output {
                        what: format!("CRR {}", v.label()),
                        reason: "no connection completed".into(),
                    });
                }
                out.crr.push(Crr {
                    round,
                    n,
                    variant: v,
                    report,
                });
            }
            drop(kp);
            drop(plain);
        }
    }
    Ok(())
}

fn program(
    cfg: &SvcConfig,
    loaded: &mut Loaded,
    view: &NodeView,
    log: &impl Fn(&str),
    out: &mut SvcResult,
) -> Result<()> {
    let set = ServiceSet {
        services: cfg.program_services,
        backends: cfg.program_backends,
        real: Vec::new(),
    };
    set.validate()?;
    let (services, mut slices) = set.objects();
    let (rules, counts) = kubeproxy::service_rules(&set);
    let ns = format!("{}ipt", cfg.prefix);
    let rounds = if cfg.parts.program { cfg.rounds } else { 0 };
    for round in 1..=rounds {
        let mut prog = Programmed {
            round,
            n: set.services,
            backends: set.backends,
            compile_s: 0.0,
            sync_s: 0.0,
            writes: String::new(),
            restore_s: None,
            resync_s: None,
            nat_rules: counts.nat_rules,
        };
        let ours = |prog: &mut Programmed, loaded: &mut Loaded| -> Result<()> {
            sync_converged(&mut loaded.dp, &SvcDesired::new())?;
            let t0 = Instant::now();
            let desired = compile(&services, &slices, view);
            let t1 = Instant::now();
            let rep = sync_converged(&mut loaded.dp, &desired)?;
            let t2 = Instant::now();
            prog.compile_s = (t1 - t0).as_secs_f64();
            prog.sync_s = (t2 - t1).as_secs_f64();
            prog.writes = describe(&rep);
            Ok(())
        };
        let theirs = |prog: &mut Programmed| -> Result<()> {
            delete_netns(&ns);
            ip(&["netns", "add", &ns])?;
            let r = (|| {
                restore(cfg, &ns, kubeproxy::BASE_RULES)?;
                prog.restore_s = Some(restore(cfg, &ns, &rules)?);
                prog.resync_s = Some(restore(cfg, &ns, &rules)?);
                Ok(())
            })();
            delete_netns(&ns);
            r
        };
        if round % 2 == 1 {
            ours(&mut prog, loaded)?;
            theirs(&mut prog)?;
        } else {
            theirs(&mut prog)?;
            ours(&mut prog, loaded)?;
        }
        log(&format!(
            "program round {round}: compile {:.3} s, sync {:.3} s ({}); iptables restore {:.3} s, resync {:.3} s",
            prog.compile_s,
            prog.sync_s,
            prog.writes,
            prog.restore_s.unwrap_or_default(),
            prog.resync_s.unwrap_or_default()
        ));
        out.programmed.push(prog);
    }
    if !cfg.parts.change {
        return Ok(());
    }
    // The change measurement starts from the programmed set, as the agent
    // holds it: every object in its index, one full sync.
    let mut index = ServiceIndex::new(view.clone());
    for svc in &services {
        index.apply_service(svc);
    }
    for slice in &slices {
        index.apply_slice(slice);
    }
    index.compile();
    index.take_changes();
    sync_converged(&mut loaded.dp, index.desired())?;
    let mut ch = Changes {
        n: set.services,
        backends: set.backends,
        ..Changes::default()
    };
    let extra = Ipv4Addr::new(10, 127, 0, 1);
    for s in 0..cfg.change_samples {
        // Pairs of samples: Service j gains a backend, then loses it again;
        // the pairs alternate between the two paths.
        let j = (s / 2).wrapping_mul(7919) % set.services;
        let mut eps = set.endpoints(j);
        if s % 2 == 0 {
            eps.push(extra);
        }
        let want = u32::try_from(eps.len()).unwrap_or(u32::MAX);
        slices[j as usize] = kubeproxy::slice_object(j, &eps);
        let incremental = (s / 2) % 2 == 0;
        let t0 = Instant::now();
        let (rep, t1) = if incremental {
            index.apply_slice(&slices[j as usize]);
            index.compile();
            let changed = index.take_changes();
            let t1 = Instant::now();
            let rep = loaded.dp.svc.sync_changes(index.desired(), &changed)?;
            (rep, t1)
        } else {
            let desired = compile(&services, &slices, view);
            let t1 = Instant::now();
            (loaded.dp.svc.sync(&desired)?, t1)
        };
        if !rep.converged() {
            return Err(BenchError::Output {
                what: "the sync after a change".into(),
                reason: format!("did not converge: {rep:?}"),
            });
        }
        let key = SvcKey::new(
            0,
            kubeproxy::cluster_ip(j).into(),
            SERVICE_PORT,
            TCP,
            SVC_SCOPE_INTERNAL,
        );
        let fe = loaded.dp.svc.frontends.get(&key)?;
        let t2 = Instant::now();
        if fe.map(|f| f.count) != Some(want) {
            return Err(BenchError::Output {
                what: "the frontend after a change".into(),
                reason: format!("want {want} backends, the map has {fe:?}"),
            });
        }
        let path = if incremental {
            &mut ch.incremental
        } else {
            // keep the index in step, untimed
            index.apply_slice(&slices[j as usize]);
            index.compile();
            index.take_changes();
            &mut ch.full
        };
        path.compile.push((t1 - t0).as_secs_f64());
        path.sync.push((t2 - t1).as_secs_f64());
        path.total.push((t2 - t0).as_secs_f64());
        path.frontends_written.push(rep.frontends_written);
    }
    log(&format!(
        "change: {} + {} samples, total p50 {:.2} ms (agent's path) / {:.1} ms (full)",
        ch.incremental.total.len(),
        ch.full.total.len(),
        pct(&ch.incremental.total, 0.5).unwrap_or(f64::NAN) * 1e3,
        pct(&ch.full.total, 0.5).unwrap_or(f64::NAN) * 1e3
    ));
    out.changes = Some(ch);
    Ok(())
}

fn pct(v: &[f64], q: f64) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    percentile_sorted(&s, q)
}

/// Machine state for the report.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    /// When (UTC).
    pub when: String,
    /// Kernel release.
    pub kernel: String,
    /// CPUs.
    pub cpus: usize,
    /// Load average before.
    pub load_before: String,
    /// Load average after.
    pub load_after: String,
    /// The command.
    pub command: String,
    /// `iptables-restore --version`.
    pub iptables: String,
}

fn f1(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.1}")).unwrap_or_else(|| "–".into())
}
fn f2(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "–".into())
}

fn f3(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.3}")).unwrap_or_else(|| "–".into())
}
fn f0(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.0}")).unwrap_or_else(|| "–".into())
}

fn mmm(v: &[f64], scale: f64, digits: usize) -> String {
    let mut s: Vec<f64> = v.iter().map(|x| x * scale).collect();
    s.sort_by(f64::total_cmp);
    match (s.first(), median(&s), s.last()) {
        (Some(a), Some(m), Some(b)) => {
            format!("{a:.digits$} / {m:.digits$} / {b:.digits$}")
        }
        _ => "–".into(),
    }
}

/// Renders the report block (with markers).
pub fn render(cfg: &SvcConfig, r: &SvcResult, m: &Machine) -> String {
    let mut s = String::new();
    let (begin, end) = cfg.parts.markers();
    let _ = writeln!(s, "{begin}");
    let _ = writeln!(
        s,
        "Measured {} on kernel {}, {} CPUs; load average (1/5/15 min) {} before, {} after. {}. {} round(s); CRR {} s after a {} s warm-up{}.",
        m.when,
        m.kernel,
        m.cpus,
        m.load_before,
        m.load_after,
        m.iptables,
        cfg.rounds,
        cfg.seconds,
        cfg.warmup,
        cfg.pin
            .map(|p| format!(", {p}"))
            .unwrap_or_default()
    );
    let _ = writeln!(s, "\nProduced by:\n\n```\n{}\n```", m.command);
    if !r.crr.is_empty() {
        let _ = writeln!(
            s,
            "\n**Connect to the last of N Services** (2 endpoints each), TCP_CRR; medians over rounds; ratio = median of the per-round ratios against direct in the same round (min–max). Goal: cozyplane ≥ 0.95× at every N.\n"
        );
        let _ = writeln!(
            s,
            "| N | variant | connections/s | connect() p50 µs | connect() p99 µs | connect+req+resp p50 µs | ratio conn/s vs direct | per round |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for &n in &cfg.sizes {
            for v in [
                ConnectVariant::Direct,
                ConnectVariant::Cozyplane,
                ConnectVariant::KubeProxy,
            ] {
                let rows: Vec<&Crr> = r
                    .crr
                    .iter()
                    .filter(|c| c.n == n && c.variant == v)
                    .collect();
                if rows.is_empty() {
                    continue;
                }
                let med = |f: &dyn Fn(&RrReport) -> Option<f64>| {
                    median(&rows.iter().filter_map(|c| f(&c.report)).collect::<Vec<_>>())
                };
                let ratios: Vec<f64> = rows
                    .iter()
                    .filter_map(|c| {
                        let d = r.crr.iter().find(|d| {
                            d.n == n && d.round == c.round && d.variant == ConnectVariant::Direct
                        })?;
                        ratio(Some(c.report.rate_per_s), Some(d.report.rate_per_s))
                    })
                    .collect();
                let (lo, hi) = ratios
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                        (a.min(x), b.max(x))
                    });
                let rm = median(&ratios);
                let goal = if v == ConnectVariant::Cozyplane {
                    match rm {
                        Some(x) if x >= 0.95 => " (goal met)",
                        Some(_) => " (**goal missed**)",
                        None => "",
                    }
                } else {
                    ""
                };
                let _ = writeln!(
                    s,
                    "| {n} | {} | {} | {} | {} | {} | {}{goal} | {} |",
                    v.label(),
                    f0(med(&|x| Some(x.rate_per_s))),
                    f1(med(&|x| x.connect.map(|c| c.p50_us))),
                    f1(med(&|x| x.connect.map(|c| c.p99_us))),
                    f1(med(&|x| x.txn.map(|c| c.p50_us))),
                    f3(rm),
                    if ratios.is_empty() {
                        "–".into()
                    } else {
                        format!("{lo:.3}–{hi:.3}")
                    },
                );
            }
        }
        for sk in &r.skipped {
            let _ = writeln!(s, "\n{sk}.");
        }
        let _ = writeln!(
            s,
            "\nPer run (round, N, variant: conn/s, connect p50/p99 µs, errors):\n"
        );
        for c in &r.crr {
            let _ = writeln!(
                s,
                "- {} {} {}: {:.0}, {} / {}, {}",
                c.round,
                c.n,
                c.variant.label(),
                c.report.rate_per_s,
                f1(c.report.connect.map(|x| x.p50_us)),
                f1(c.report.connect.map(|x| x.p99_us)),
                c.report.errors
            );
        }
    }
    if !r.programmed.is_empty() {
        let _ = writeln!(
            s,
            "\n**Programming N Services from empty**, seconds, min / median / max over rounds. Ours: compile (objects → desired maps, `compile_services` + `to_desired`) and `SvcMaps::sync` into empty maps; kube-proxy: `iptables-restore --noflush` of the KUBE-* chains (initial, then the same again: the resync). Goal at 10k × 10: ≤ 0.5 s.\n"
        );
        let _ = writeln!(
            s,
            "| N × backends | compile s | sync s | compile + sync s | iptables-restore s | resync s | nat rules | sync wrote |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        let mut keys: Vec<(u32, u32)> = r.programmed.iter().map(|p| (p.n, p.backends)).collect();
        keys.sort_unstable();
        keys.dedup();
        for (n, b) in keys {
            let rows: Vec<&Programmed> = r
                .programmed
                .iter()
                .filter(|p| p.n == n && p.backends == b)
                .collect();
            let col = |f: &dyn Fn(&Programmed) -> Option<f64>| {
                let v: Vec<f64> = rows.iter().filter_map(|p| f(p)).collect();
                mmm(&v, 1.0, 3)
            };
            let _ = writeln!(
                s,
                "| {n} × {b} | {} | {} | {} | {} | {} | {} | {} |",
                col(&|p| Some(p.compile_s)),
                col(&|p| Some(p.sync_s)),
                col(&|p| Some(p.compile_s + p.sync_s)),
                col(&|p| p.restore_s),
                col(&|p| p.resync_s),
                rows.iter()
                    .map(|p| p.nat_rules)
                    .max()
                    .filter(|&x| x > 0)
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "–".into()),
                rows.first().map(|p| p.writes.as_str()).unwrap_or_default(),
            );
        }
    }
    if let Some(ch) = &r.changes {
        let _ = writeln!(
            s,
            "\n**A backend change with {} Services × {} backends programmed**: one Service's EndpointSlice gains a backend, then loses it again; pairs of samples alternate between the agent's path ({} samples: the slice applied to its `ServiceIndex`, the touched Service recompiled, `sync_changes` of the changed frontends) and the full path it replaced ({} samples: every Service compiled, a full `sync` reading the maps back). Timed: compile, and sync until the frontend read back from the kernel map has the new backend count. ms. Goal: p99 ≤ 100 ms (from the EndpointSlice change; the API server and watch are not in this figure).\n",
            ch.n,
            ch.backends,
            ch.incremental.total.len(),
            ch.full.total.len()
        );
        let _ = writeln!(s, "| path | step | p50 ms | p90 ms | p99 ms | max ms |");
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for (path, c) in [
            ("agent (incremental)", &ch.incremental),
            ("full (baseline)", &ch.full),
        ] {
            for (name, v) in [
                ("compile", &c.compile),
                ("sync (+ read-back)", &c.sync),
                ("total", &c.total),
            ] {
                let p = |q: f64| f2(pct(v, q).map(|x| x * 1e3));
                let _ = writeln!(
                    s,
                    "| {path} | {name} | {} | {} | {} | {} |",
                    p(0.5),
                    p(0.9),
                    p(0.99),
                    f2(v.iter().copied().reduce(f64::max).map(|x| x * 1e3))
                );
            }
        }
        let fw: usize = ch.incremental.frontends_written.iter().sum();
        let _ = writeln!(
            s,
            "\nFrontend values written by the agent's path over its samples: {fw} (one per change)."
        );
    }
    if !r.crossnode.is_empty() {
        s.push_str(&crate::svc_crossnode::render(&r.crossnode));
    }
    if !r.policy.is_empty() {
        s.push_str(&crate::policy_crossnode::render(&r.policy));
    }
    let _ = write!(s, "{end}");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse() {
        let p = Parts::parse("connect,change").unwrap();
        assert!(p.connect && !p.program && p.change);
        assert_eq!(p.markers(), (BEGIN, END));
        let p = Parts::parse("crossnode").unwrap();
        assert!(p.crossnode && p.markers().0.contains("crossnode"));
        assert!(Parts::parse("crossnode,connect").is_err());
        assert!(Parts::parse("").is_err());
        assert!(Parts::parse("nope").is_err());
    }

    #[test]
    fn the_report_names_the_goal_and_the_baseline() {
        let cfg = SvcConfig {
            rounds: 1,
            seconds: 1,
            warmup: 0.0,
            sizes: vec![1000],
            iptables_max: 1000,
            program_services: 10,
            program_backends: 2,
            change_samples: 2,
            parts: Parts::parse("connect").unwrap(),
            iptables_restore: "/usr/sbin/iptables-legacy-restore".into(),
            tool: "x".into(),
            prefix: "t".into(),
            pin: None,
        };
        let rep = |rate: f64| RrReport {
            mode: crate::rr::Mode::Crr,
            n: 10,
            errors: 0,
            elapsed_s: 1.0,
            rate_per_s: rate,
            txn: None,
            connect: None,
        };
        let r = SvcResult {
            crr: vec![
                Crr {
                    round: 1,
                    n: 1000,
                    variant: ConnectVariant::Direct,
                    report: rep(100.0),
                },
                Crr {
                    round: 1,
                    n: 1000,
                    variant: ConnectVariant::Cozyplane,
                    report: rep(97.0),
                },
                Crr {
                    round: 1,
                    n: 1000,
                    variant: ConnectVariant::KubeProxy,
                    report: rep(50.0),
                },
            ],
            ..SvcResult::default()
        };
        let text = render(&cfg, &r, &Machine::default());
        assert!(text.starts_with(BEGIN) && text.ends_with(END), "{text}");
        assert!(text.contains("| 0.970 (goal met) |"), "{text}");
        assert!(text.contains("| 0.500 |"), "{text}");
    }
}
