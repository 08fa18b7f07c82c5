//! A private containerd started as a child process, for tests that need a real
//! container runtime to drive a CNI plugin through the CRI.
//!
//! # What is private and what is not
//!
//! Everything configurable lives under one scratch directory: `root`, `state`, the
//! gRPC socket, runc's state root, the `opt` plugin's directory, the CNI `bin_dir` and
//! `conf_dir` (the caller's, never the host's `/opt/cni/bin` or `/etc/cni/net.d`), the
//! pause image and containerd's log. containerd 1.6 nevertheless uses two host paths:
//!
//! * `/run/containerd`, for the shims' sockets (`/run/containerd/s/…`, hard-coded);
//! * `/var/run/netns/cni-<uuid>`, the pod network namespaces its CRI creates.
//!
//! Because of these shared paths, harnesses run one at a time machine-wide: each holds
//! an exclusive `flock` on [`HOST_LOCK`] from start until it has cleaned up (so
//! parallel test processes, e.g. under nextest, queue instead of colliding). The
//! harness removes `/run/containerd` on stop if it was not there before start.
//!
//! Pod netns are removed by containerd on `RemovePodSandbox`;
//! [`Containerd::shutdown`] removes every sandbox through the CRI first, so a clean
//! run leaves none. If a test panics and only [`Drop`] runs, the fallback kills the
//! sandboxes with runc, detaches the mounts under the scratch directory and deletes
//! the `cni-*` netns that appeared since start.
//!
//! # Two settings the test machines need (no CAP_SYS_RESOURCE, no image registry)
//!
//! * `restrict_oom_score_adj = true`: root here lacks `CAP_SYS_RESOURCE`, so the
//!   sandbox's `oomScoreAdj: -998` would make runc fail.
//! * `sandbox_image` names the locally built [`PAUSE_IMAGE`](crate::PAUSE_IMAGE),
//!   imported before any pod is run, because nothing can be pulled.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cozyplane_errors::Chain;
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::client::CriClient;
use crate::error::{CriError, Result};
use crate::pause::{build_pause_image, PAUSE_IMAGE};
use crate::run_checked;

/// How long containerd may take to answer its first CRI call (it boots in well under
/// a second here; the margin is for a loaded CI machine).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM'd containerd may take before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// A unix socket path holds at most this many bytes (`sun_path` minus the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Where containerd's CRI puts pod network namespaces (1.6: not configurable).
pub const NETNS_DIR: &str = "/var/run/netns";
/// containerd 1.6's hard-coded state root for shim sockets.
const HOST_RUN_DIR: &str = "/run/containerd";
/// The machine-wide lock file that serializes harnesses (see the module docs).
pub const HOST_LOCK: &str = "/run/cozyplane-cri.lock";
/// How long a harness waits for another one to finish.
pub const HOST_LOCK_TIMEOUT: Duration = Duration::from_secs(300);

/// Where containerd looks for CNI plugins and configs.
#[derive(Clone, Debug)]
pub struct CniDirs {
    /// Plugin binaries (`bin_dir`); must hold `loopback` for the pod's `lo`.
    pub bin_dir: PathBuf,
    /// Network configs (`conf_dir`); containerd loads the first `.conflist` and
    /// watches the directory, so a config may be written after start.
    pub conf_dir: PathBuf,
}

/// A running private containerd. Stop it with [`Containerd::shutdown`]; dropping it
/// stops it too, less gracefully (see the module docs).
#[derive(Debug)]
pub struct Containerd {
    dir: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
    created_run_dir: bool,
    netns_before: BTreeSet<String>,
    /// Held until after [`Drop`] has cleaned up (fields drop after `drop` runs).
    _host_lock: Flock<File>,
}

impl Containerd {
    /// Starts containerd with all its state under `dir` (created if missing; keep
    /// the path short, the socket lives in it), waits until its CRI answers, and
    /// imports the pause image. On error nothing keeps running.
    ///
    /// The harness owns `dir`: stopping removes it with everything in it.
    ///
    /// Needs root, `containerd`, `runc`, `ctr`, `gcc` and `tar`.
    pub async fn start(dir: &Path, cni: &CniDirs) -> Result<Containerd> {
        let socket = dir.join("containerd.sock");
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(CriError::Invalid(format!(
                "socket path {} is longer than {MAX_SOCKET_PATH} bytes; use a shorter dir",
                socket.display()
            )));
        }
        // Wait for our turn before touching anything.
        let host_lock = lock_host().await?;
        fs::create_dir_all(dir).map_err(|e| CriError::io("create", dir, e))?;
        // Build the image first: a compile error should not leave a daemon behind.
        let image_tar = build_pause_image(dir)?;
        let config = dir.join("config.toml");
        fs::write(&config, render_config(dir, &socket, cni))
            .map_err(|e| CriError::io("write", &config, e))?;
        let log_path = dir.join("containerd.log");
        let log = File::create(&log_path).map_err(|e| CriError::io("create", &log_path, e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| CriError::io("clone", &log_path, e))?;

        let created_run_dir = !Path::new(HOST_RUN_DIR).exists();
        let netns_before = cni_netns()?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| CriError::Spawn {
                program: "containerd".into(),
                source,
            })?;
        // From here on, Drop cleans up whatever fails.
        let mut me = Containerd {
            dir: dir.to_path_buf(),
            socket,
            child: Some(child),
            created_run_dir,
            netns_before,
            _host_lock: host_lock,
        };
        me.wait_cri().await?;
        run_checked(
            Command::new("ctr")
                .arg("--address")
                .arg(&me.socket)
                .args(["-n", "k8s.io", "images", "import"])
                .arg(&image_tar),
        )?;
        Ok(me)
    }

    /// The CRI (and containerd API) socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The scratch directory holding all of this containerd's state.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's log so far (stdout and stderr), for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// A new CRI client on this containerd.
    pub async fn client(&self) -> Result<CriClient> {
        CriClient::connect(&self.socket).await
    }

    /// Waits until the runtime reports `RuntimeReady` and `NetworkReady`, i.e. it
    /// has loaded a CNI config from `conf_dir`.
    pub async fn wait_network_ready(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut client = self.client().await?;
        loop {
            self.check_alive()?;
            if client.ready().await? {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                let conditions = client.status().await?;
                return Err(CriError::Timeout {
                    what: format!("CRI NetworkReady (conditions: {conditions:?})"),
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Removes every pod sandbox through the CRI (so containerd runs CNI DEL and
    /// deletes each netns), then stops containerd and cleans up. Prefer this to
    /// dropping.
    pub async fn shutdown(mut self) -> Result<()> {
        let removed = match self.client().await {
            Ok(mut client) => client.remove_all_sandboxes().await.map(|_| ()),
            Err(e) => Err(e),
        };
        self.stop();
        removed
    }

    /// Polls the CRI `Version` call until it answers, failing early if containerd
    /// exits (bad config) so the error carries its log.
    async fn wait_cri(&mut self) -> Result<()> {
        let start = Instant::now();
        loop {
            self.check_alive()?;
            if self.socket.exists() {
                if let Ok(mut client) = CriClient::connect(&self.socket).await {
                    if client.version().await.is_ok() {
                        return Ok(());
                    }
                }
            }
            if start.elapsed() >= START_TIMEOUT {
                return Err(CriError::Timeout {
                    what: format!("containerd's CRI; log tail:\n{}", tail(&self.log(), 20)),
                    timeout: START_TIMEOUT,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Err(CriError::Invalid("containerd was already stopped".into()));
        };
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(CriError::Exited {
                status,
                log_tail: tail(&self.log(), 20),
            }),
            Err(e) => Err(CriError::io("wait for", "containerd", e)),
        }
    }

    /// Stops containerd by pid and removes everything it left. Idempotent; errors
    /// are reported on stderr, since this also runs from `Drop`.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
        self.kill_leftover_sandboxes();
        self.remove_new_netns();
        detach_mounts_under(&self.dir);
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("cri: cannot remove {}: {}", self.dir.display(), Chain(&e));
        }
        if self.created_run_dir {
            detach_mounts_under(Path::new(HOST_RUN_DIR));
            if let Err(e) = fs::remove_dir_all(HOST_RUN_DIR) {
                eprintln!("cri: cannot remove {HOST_RUN_DIR}: {}", Chain(&e));
            }
        }
    }

    /// Sandboxes still known to runc (a test failed before removing them): their
    /// shims and pause processes would outlive containerd, so force-delete them
    /// with runc, which kills by the pid it recorded, and then end the shims that
    /// served this containerd (found by our socket in their command line).
    fn kill_leftover_sandboxes(&self) {
        let runc_root = self.dir.join("runc").join("k8s.io");
        if let Ok(entries) = fs::read_dir(&runc_root) {
            for entry in entries.flatten() {
                let id = entry.file_name();
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "--force"])
                    .arg(&id)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for pid in shims_of(&self.socket) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    /// Removes `cni-*` namespaces created since start. Only a failed test leaves
    /// any (a clean run removes each sandbox through the CRI).
    fn remove_new_netns(&self) {
        let Ok(now) = cni_netns() else { return };
        for name in now.difference(&self.netns_before) {
            let path = Path::new(NETNS_DIR).join(name);
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
            if let Err(e) = fs::remove_file(&path) {
                eprintln!("cri: cannot remove {}: {}", path.display(), Chain(&e));
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Takes the exclusive lock on [`HOST_LOCK`], polling so a stuck holder turns into
/// a timeout error rather than a hung test.
async fn lock_host() -> Result<Flock<File>> {
    let start = Instant::now();
    loop {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HOST_LOCK)
            .map_err(|e| CriError::io("open", HOST_LOCK, e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((_, Errno::EWOULDBLOCK)) if start.elapsed() < HOST_LOCK_TIMEOUT => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(CriError::Timeout {
                    what: format!("another CRI harness to release {HOST_LOCK}"),
                    timeout: HOST_LOCK_TIMEOUT,
                })
            }
            Err((_, errno)) => return Err(CriError::io("lock", HOST_LOCK, errno.into())),
        }
    }
}

/// The config file: version 2, everything under `dir`, CNI from `cni`.
fn render_config(dir: &Path, socket: &Path, cni: &CniDirs) -> String {
    let d = |p: &Path| toml_str(&p.to_string_lossy());
    format!(
        r#"version = 2
root = {root}
state = {state}

[grpc]
  address = {socket}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {image}
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = {runc}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {bin_dir}
    conf_dir = {conf_dir}
    max_conf_num = 1
"#,
        root = d(&dir.join("root")),
        state = d(&dir.join("state")),
        socket = d(socket),
        opt = d(&dir.join("opt")),
        image = toml_str(PAUSE_IMAGE),
        runc = d(&dir.join("runc")),
        bin_dir = d(&cni.bin_dir),
        conf_dir = d(&cni.conf_dir),
    )
}

/// A TOML basic string (quotes and backslashes escaped; paths hold nothing else
/// that needs it).
fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The `cni-*` entries of [`NETNS_DIR`].
pub fn cni_netns() -> Result<BTreeSet<String>> {
    let entries = match fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(CriError::io("list", NETNS_DIR, e)),
    };
    Ok(entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("cni-"))
        .collect())
}

/// Pids of `containerd-shim*` processes whose command line names `socket`.
fn shims_of(socket: &Path) -> Vec<i32> {
    let needle = socket.as_os_str().as_bytes();
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
                let mut args = cmd.split(|b| *b == 0);
                let is_shim = args
                    .next()
                    .and_then(|a| a.rsplit(|b| *b == b'/').next())
                    .is_some_and(|a| a.starts_with(b"containerd-shim"));
                is_shim && cmd.split(|b| *b == 0).any(|a| a == needle)
            })
        })
        .collect()
}

/// Lazily unmounts every mount point at or below `dir`, deepest first.
fn detach_mounts_under(dir: &Path) {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        if let Err(e) = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("cri: cannot unmount {}: {}", p.display(), Chain(&e));
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(o)) => {
                out.push((o[0] - b'0') * 64 + (o[1] - b'0') * 8 + (o[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from(
        String::from_utf8_lossy(&out).into_owned(),
    ))
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_keeps_everything_under_the_scratch_dir() {
        let cni = CniDirs {
            bin_dir: "/tmp/x/bin".into(),
            conf_dir: "/tmp/x/net.d".into(),
        };
        let cfg = render_config(Path::new("/tmp/x"), Path::new("/tmp/x/c.sock"), &cni);
        assert!(cfg.contains("root = \"/tmp/x/root\""), "{cfg}");
        assert!(cfg.contains("state = \"/tmp/x/state\""), "{cfg}");
        assert!(cfg.contains("address = \"/tmp/x/c.sock\""), "{cfg}");
        assert!(cfg.contains("bin_dir = \"/tmp/x/bin\""), "{cfg}");
        assert!(cfg.contains("conf_dir = \"/tmp/x/net.d\""), "{cfg}");
        assert!(cfg.contains("restrict_oom_score_adj = true"), "{cfg}");
        assert!(
            cfg.contains(&format!("sandbox_image = \"{PAUSE_IMAGE}\"")),
            "{cfg}"
        );
        assert!(
            !cfg.contains("/etc/cni") && !cfg.contains("/opt/cni"),
            "{cfg}"
        );
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            unescape_mount_path(r"/run/a\040b\134c"),
            PathBuf::from(r"/run/a b\c")
        );
        assert_eq!(unescape_mount_path(r"/x\04"), PathBuf::from(r"/x\04"));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
