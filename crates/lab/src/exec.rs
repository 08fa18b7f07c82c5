//! Running programs inside a lab namespace.
//!
//! The child enters the namespace with `setns(2)` between `fork` and `exec` (the
//! datapath's `Netns::enter_before_exec` hook) instead of going through `ip netns exec`. That keeps the caller's
//! mount namespace: `ip netns exec` remounts `/sys` in a private mount namespace, which
//! would hide the bpffs under `/sys/fs/bpf` that agents pin their maps to. It also
//! saves an exec per command. (Tools that read `/sys/class/net` see the host's
//! interfaces there; netlink-based tools such as `ip` and `ping` are unaffected.)

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Output};

use cozyplane_datapath::netlink::Netns;

use crate::error::{LabError, Result};

/// Something in the lab that has its own network namespace: a node, the external
/// host, or the fabric.
pub trait LabHost {
    /// Its name (its namespace's name).
    fn name(&self) -> &str;
    /// Its network namespace.
    fn netns(&self) -> &Netns;
}

/// Makes `cmd` enter `netns` before it execs (see
/// [`Netns::enter_before_exec`](cozyplane_datapath::netlink::Netns::enter_before_exec)).
pub fn enter_before_exec(cmd: &mut Command, netns: &Netns) -> Result<()> {
    Ok(netns.enter_before_exec(cmd)?)
}

fn command_in(host: &impl LabHost, argv: &[&str]) -> Result<Command> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| LabError::InvalidSpec(format!("empty command for {}", host.name())))?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    enter_before_exec(&mut cmd, host.netns())?;
    Ok(cmd)
}

fn spawn_err(host: &impl LabHost, argv: &[&str], source: std::io::Error) -> LabError {
    LabError::Spawn {
        program: argv.first().map(|s| s.to_string()).unwrap_or_default(),
        place: host.name().to_string(),
        source,
    }
}

/// Runs `argv` inside `host`'s namespace to completion and returns its output (exit
/// status, stdout, stderr). A non-zero exit is *not* an error: look at `status`.
/// Blocking; from async code use [`exec_in_async`].
pub fn exec_in(host: &impl LabHost, argv: &[&str]) -> Result<Output> {
    command_in(host, argv)?
        .output()
        .map_err(|e| spawn_err(host, argv, e))
}

/// [`exec_in`] for async callers: the child is awaited, not blocked on.
pub async fn exec_in_async(host: &impl LabHost, argv: &[&str]) -> Result<Output> {
    let cmd = tokio::process::Command::from(command_in(host, argv)?);
    let mut cmd = cmd;
    cmd.kill_on_drop(true)
        .output()
        .await
        .map_err(|e| spawn_err(host, argv, e))
}

/// Binds a TCP listener inside `host`'s namespace, for a server in *this* process
/// (a socket belongs to the namespace it was created in, whatever thread later uses
/// it). For tokio, `set_nonblocking(true)` and `tokio::net::TcpListener::from_std`.
pub fn bind_tcp_in(host: &impl LabHost, addr: SocketAddr) -> Result<TcpListener> {
    host.netns()
        .run(move || TcpListener::bind(addr))?
        .map_err(|e| LabError::io("bind", format!("{addr} in {}", host.name()), e))
}
