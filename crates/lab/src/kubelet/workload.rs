//! The workload process: started in the pod's netns (or the node's, for
//! hostNetwork pods), stopped through a pidfd after checking its start time,
//! probed for readiness from the node.

use std::fs::OpenOptions;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use cozyplane_datapath::netlink::Netns;
use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process;

/// How long a stopped workload gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// The most of the termination-log file reported (Kubernetes' limit).
pub const MESSAGE_LIMIT: usize = 4096;
/// The PATH workloads get (the kubelet's own environment is not passed on).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A started workload.
#[derive(Debug)]
pub struct Started {
    /// The child (awaited for its exit).
    pub child: tokio::process::Child,
    /// Its pid.
    pub pid: i32,
    /// Its start time (clock ticks since boot): its identity for a later kill.
    pub start_time: u64,
    /// When it started.
    pub started_at: Timestamp,
}

/// Starts `bin args` with exactly `env`, inside `netns` if given, in the
/// cgroup `cgroup` if given (joined before it execs, so not one of its
/// syscalls runs elsewhere), output appended to `log`, in its own process
/// group (signals meant for the kubelet do not reach it, so a restarted
/// kubelet finds it and stops it).
pub fn spawn(
    bin: &Path,
    args: &[String],
    env: &[(String, String)],
    netns: Option<&Netns>,
    cgroup: Option<&Path>,
    log: &Path,
) -> crate::Result<Started> {
    let io_err = |op, e| crate::LabError::io(op, log, e);
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| io_err("open workload log", e))?;
    let err = out.try_clone().map_err(|e| io_err("dup log fd", e))?;
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args)
        .env_clear()
        .env("PATH", PATH)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    if let Some(ns) = netns {
        crate::exec::enter_before_exec(&mut cmd, ns)?;
    }
    if let Some(dir) = cgroup {
        join_cgroup_before_exec(&mut cmd, dir)?;
    }
    let child = tokio::process::Command::from(cmd)
        .spawn()
        .map_err(|source| crate::LabError::Spawn {
            program: bin.display().to_string(),
            place: netns
                .map(|n| n.path().display().to_string())
                .unwrap_or_else(|| "the node".into()),
            source,
        })?;
    let started_at = Timestamp::now();
    let stat = || io_err("read start time", io::ErrorKind::NotFound.into());
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(stat)?;
    // The child is not reaped before we wait on it, so its /proc entry exists.
    let start_time = process::start_time(pid)
        .map_err(|e| io_err("read start time", e))?
        .ok_or_else(stat)?;
    Ok(Started {
        child,
        pid,
        start_time,
        started_at,
    })
}

/// Makes `cmd` join the cgroup v2 directory `dir` between fork and exec: the
/// child writes "0" (itself) into `cgroup.procs`, through an fd opened here.
fn join_cgroup_before_exec(cmd: &mut std::process::Command, dir: &Path) -> crate::Result<()> {
    let procs = dir.join("cgroup.procs");
    let file = OpenOptions::new()
        .write(true)
        .open(&procs)
        .map_err(|e| crate::LabError::io("open", &procs, e))?;
    // SAFETY: the closure runs in the forked child before exec and only calls
    // write(2) (rustix's direct syscall, async-signal-safe, no allocation) on
    // an fd the parent opened, kept alive by the closure owning `file`.
    unsafe {
        cmd.pre_exec(move || match rustix::io::write(&file, b"0") {
            Ok(1) => Ok(()),
            Ok(_) => Err(io::Error::from(io::ErrorKind::WriteZero)),
            Err(e) => Err(io::Error::from(e)),
        });
    }
    Ok(())
}

/// Stops the process `pid` if it is still the one started at `start_time`:
/// SIGTERM, SIGKILL after [`STOP_GRACE`]. `Ok(false)` if it was gone already.
pub async fn stop(pid: i32, start_time: u64) -> io::Result<bool> {
    stop_within(pid, start_time, STOP_GRACE).await
}

/// [`stop`] with SIGKILL after `grace` (a deleted pod's grace period,
/// capped by the caller).
pub async fn stop_within(pid: i32, start_time: u64, grace: Duration) -> io::Result<bool> {
    tokio::task::spawn_blocking(move || {
        process::terminate_verified(
            pid,
            |p| process::start_time(p).ok().flatten() == Some(start_time),
            grace,
        )
    })
    .await
    .map_err(io::Error::other)?
}

/// `(exit code, signal)`; a signalled process reports 128 + signal, as a shell does.
pub fn exit_code(status: ExitStatus) -> (i32, Option<i32>) {
    match (status.code(), status.signal()) {
        (Some(c), _) => (c, None),
        (None, Some(s)) => (128 + s, Some(s)),
        (None, None) => (-1, None),
    }
}

/// The termination message: the first [`MESSAGE_LIMIT`] bytes of the file
/// (cut at a character boundary), trailing whitespace removed; empty if none.
pub fn termination_message(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let mut end = bytes.len().min(MESSAGE_LIMIT);
    while end > 0 && std::str::from_utf8(&bytes[..end]).is_err() {
        end -= 1;
    }
    String::from_utf8_lossy(&bytes[..end])
        .trim_end()
        .to_string()
}

/// One readiness check: TCP connect, or `GET path` answering 200–399.
pub async fn probe(ip: IpAddr, port: u16, http_path: Option<&str>) -> bool {
    let addr = SocketAddr::new(ip, port);
    let check = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let Some(path) = http_path else {
            return Some(true);
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: cozyplane-lab-kubelet\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 256];
        while !buf.contains(&b'\n') && buf.len() < 4096 {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let line = String::from_utf8_lossy(&buf);
        let code: u16 = line.split(' ').nth(1)?.trim().parse().ok()?;
        Some((200..400).contains(&code))
    };
    tokio::time::timeout(Duration::from_secs(1), check)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal::SIGTERM;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), (0, None));
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), (3, None));
        assert_eq!(exit_code(ExitStatus::from_raw(9)), (137, Some(9)));
    }

    #[test]
    fn termination_messages_are_capped_and_trimmed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("log");
        assert_eq!(termination_message(&f), "");
        std::fs::write(&f, "{\"results\":[]}\n").expect("write");
        assert_eq!(termination_message(&f), "{\"results\":[]}");
        std::fs::write(&f, "é".repeat(3000)).expect("write");
        let m = termination_message(&f);
        assert!(
            m.len() <= MESSAGE_LIMIT && m.len() >= MESSAGE_LIMIT - 1,
            "{}",
            m.len()
        );
    }

    #[tokio::test]
    async fn a_workload_runs_with_exactly_its_env_and_stops_on_sigterm() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("out.log");
        let env = vec![("POD_NAME".to_string(), "p1".to_string())];
        let args = vec![
            "-c".to_string(),
            "echo name=$POD_NAME home=${HOME:-none}; exec sleep 30".to_string(),
        ];
        let mut w = spawn(Path::new("/bin/sh"), &args, &env, None, None, &log).expect("spawn");
        crate::wait_for_async("the workload to log", Duration::from_secs(5), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move { text.contains("name=p1 home=none") }
        })
        .await
        .expect("log line");
        // A wrong identity is left alone; the right one is stopped with SIGTERM.
        assert!(!stop(w.pid, w.start_time + 1).await.expect("stop"));
        assert!(stop(w.pid, w.start_time).await.expect("stop"));
        let status = w.child.wait().await.expect("wait");
        assert_eq!(
            exit_code(status),
            (128 + SIGTERM as i32, Some(SIGTERM as i32))
        );
        assert!(!stop(w.pid, w.start_time).await.expect("stop again"));
    }

    #[tokio::test]
    async fn a_workload_starts_inside_its_nodes_cgroup() {
        if !cozyplane_testkit::needs!().root().ready() {
            return;
        }
        let mount = Path::new(crate::cluster::LAB_CGROUP_MOUNT);
        cozyplane_datapath::ensure_cgroup2(mount).expect("cgroup2");
        let rel = format!("cozyplane-lab-test-{}", std::process::id());
        let cg = mount.join(&rel);
        std::fs::create_dir_all(&cg).expect("create the cgroup");
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("out.log");
        let args = vec!["-c".to_string(), "cat /proc/self/cgroup".to_string()];
        let mut w = spawn(Path::new("/bin/sh"), &args, &[], None, Some(&cg), &log).expect("spawn");
        let status = w.child.wait().await.expect("wait");
        assert!(status.success());
        let text = std::fs::read_to_string(&log).expect("log");
        assert!(
            text.lines()
                .any(|l| l.starts_with("0::/") && l.ends_with(&rel)),
            "{text}"
        );
        std::fs::remove_dir(&cg).expect("rmdir the emptied cgroup");
        // A cgroup that cannot be joined fails the spawn, not the workload later.
        let missing = mount.join(format!("{rel}-missing"));
        assert!(spawn(Path::new("/bin/true"), &[], &[], None, Some(&missing), &log).is_err());
    }

    #[tokio::test]
    async fn probes_tell_listening_from_closed_ports_and_check_http_codes() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut s, _)) = l.accept().await {
                n += 1;
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
                let reply: &[u8] = if n == 1 {
                    b"HTTP/1.1 200 OK\r\n\r\n"
                } else {
                    b"HTTP/1.1 503 No\r\n\r\n"
                };
                let _ = s.write_all(reply).await;
            }
        });
        assert!(probe(lo, port, Some("/ready")).await);
        assert!(!probe(lo, port, Some("/ready")).await, "503 is not ready");
        assert!(probe(lo, port, None).await);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed_port = closed.local_addr().expect("addr").port();
        drop(closed);
        assert!(!probe(lo, closed_port, None).await);
    }
}
