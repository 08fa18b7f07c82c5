//! The image recipe (`images/cozyplane/build`, `check-arch`; docs/packaging.md,
//! "Image"): two builds of the same binaries give the same index digest, the
//! architecture check passes the real image and names the leg and the file of
//! a wrong one (the prior project shipped an arm64 leg holding amd64
//! binaries), and the image imports into a real containerd and runs
//! `cozyplane version`.
//!
//! The binaries are the workspace's debug builds (`$COZYPLANE_BIN`,
//! `$COZYPLANE_CNI_BIN`, else built by the test kit), stripped into a temp dir
//! first: the debug `cozyplane` is ~180 MB, mostly DWARF, and `strip` is
//! deterministic, so the digests compare the same bytes.
//!
//! Needs python3 and binutils' `strip`; the containerd test also root,
//! containerd, ctr, runc and util-linux's `umount`. Under CI a missing piece
//! fails the test; elsewhere it is skipped with a `SKIP` line.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cozyplane_testkit::{needs, Needs, Tool};
use serde_json::Value;

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

const PYTHON3: Tool = Tool::new("python3", &["--version"], "python3");
const STRIP: Tool = Tool::new("strip", &["--version"], "binutils");
const LDD: Tool = Tool::new("ldd", &["--version"], "libc-bin");
const CONTAINERD: Tool = Tool::new("containerd", &["--version"], "containerd");
const CTR: Tool = Tool::new("ctr", &["--version"], "containerd");
const RUNC: Tool = Tool::new("runc", &["--version"], "runc");
const UMOUNT: Tool = Tool::new("umount", &["--version"], "mount");

/// What every build needs: the recipe's interpreter, `strip` for the debug
/// binaries, and `ldd`, which the recipe cross-checks a native leg against.
fn recipe_needs(needs: Needs) -> Needs {
    needs.tool(&PYTHON3).tool(&STRIP).tool(&LDD)
}

fn script(name: &str) -> PathBuf {
    Path::new(WORKSPACE).join("images/cozyplane").join(name)
}

/// This host's architecture as OCI names it, and another one: a leg of the
/// other one built from this host's binaries is the wrong image.
fn arches() -> (&'static str, &'static str) {
    match std::env::consts::ARCH {
        "x86_64" => ("amd64", "arm64"),
        "aarch64" => ("arm64", "amd64"),
        other => panic!("the image recipe knows amd64 and arm64 hosts, not {other}"),
    }
}

/// Stripped copies of `cozyplane` and `cozyplane-cni` in a fresh temp dir.
fn stripped_binaries() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("cozyplane-image-bins-")
        .tempdir()
        .unwrap();
    for (src, name) in [
        (cozyplane_testkit::cozyplane_bin(), "cozyplane"),
        (cozyplane_testkit::static_cni_plugin_bin(), "cozyplane-cni"),
    ] {
        let out = Command::new("strip")
            .arg("--strip-all")
            .arg("-o")
            .arg(dir.path().join(name))
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "strip {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// Runs the recipe with `args` (and `env`); the whole output, success or not.
fn run_build(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(script("build"));
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Runs the recipe, which must succeed; the digest from its last stdout line.
fn build(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run_build(args, env);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "build {args:?} failed ({}):\n{stderr}",
        out.status
    );
    let digest = stdout.lines().next_back().unwrap_or_default().to_string();
    assert!(
        is_digest(&digest),
        "last stdout line {digest:?}, stdout:\n{stdout}"
    );
    digest
}

fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn arch_arg(arch: &str, dir: &Path) -> String {
    format!("{arch}={}", dir.display())
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn blob(layout: &Path, digest: &str) -> Value {
    read_json(
        &layout
            .join("blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap()),
    )
}

/// The one image `index.json` of a layout names: its descriptor.
fn layout_image(layout: &Path) -> Value {
    let index = read_json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "index.json: {index}");
    manifests[0].clone()
}

/// The image config of each leg of the image index at `digest`, by architecture.
fn leg_configs(layout: &Path, digest: &str) -> Vec<(String, Value)> {
    let index = blob(layout, digest);
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|leg| {
            let manifest = blob(layout, leg["digest"].as_str().unwrap());
            let config = blob(layout, manifest["config"]["digest"].as_str().unwrap());
            (
                leg["platform"]["architecture"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                config,
            )
        })
        .collect()
}

/// Guards against an image that changes with the clock, the build dir or the
/// build host's file metadata: then every rebuild would need a new chart.
#[test]
fn builds_twice_with_the_same_digest() {
    if !recipe_needs(needs!()).ready() {
        return;
    }
    let (native, _) = arches();
    let bins = stripped_binaries();
    let leg = arch_arg(native, bins.path());
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (la, lb, lc) = (
        a.path().join("layout"),
        b.path().join("layout"),
        c.path().join("layout"),
    );
    let epoch0 = [("SOURCE_DATE_EPOCH", "0")];
    let first = build(&["--out", la.to_str().unwrap(), "--arch", &leg], &epoch0);
    let second = build(&["--out", lb.to_str().unwrap(), "--arch", &leg], &epoch0);
    assert_eq!(first, second, "two builds of the same binaries");
    for layout in [&la, &lb] {
        let image = layout_image(layout);
        assert_eq!(image["digest"], first.as_str(), "{}", layout.display());
        assert_eq!(
            image["mediaType"], "application/vnd.oci.image.index.v1+json",
            "the layout names the multi-arch index, not a single manifest"
        );
    }

    // What the chart and `cozyplane version` rely on, in the config.
    let configs = leg_configs(&la, &first);
    assert_eq!(configs.len(), 1);
    let (arch, config) = &configs[0];
    assert_eq!(arch, native);
    assert_eq!(config["architecture"], native);
    assert_eq!(config["os"], "linux");
    assert_eq!(config["created"], "1970-01-01T00:00:00Z");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/cozyplane"])
    );
    assert!(config.get("history").is_none(), "no history: {config}");
    let labels = &config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.licenses"],
        "Apache-2.0 AND GPL-2.0-only"
    );
    assert!(
        labels["org.opencontainers.image.version"].is_string(),
        "{labels}"
    );

    // The timestamp is an input, not noise: another SOURCE_DATE_EPOCH is
    // another image (this is what makes the first equality meaningful).
    let later = build(
        &["--out", lc.to_str().unwrap(), "--arch", &leg],
        &[("SOURCE_DATE_EPOCH", "1700000000")],
    );
    assert_ne!(later, first, "SOURCE_DATE_EPOCH must reach the image");
}

/// Guards against the prior project's failure: an arm64 leg holding amd64
/// binaries, which pulls fine and dies with `exec format error` on arm64 nodes.
#[test]
fn arch_check_passes_on_the_real_image_and_fails_on_a_wrong_leg() {
    if !recipe_needs(needs!()).ready() {
        return;
    }
    let (native, other) = arches();
    let bins = stripped_binaries();
    let work = tempfile::tempdir().unwrap();

    let good = work.path().join("good.tar");
    build(
        &[
            "--out",
            good.to_str().unwrap(),
            "--arch",
            &arch_arg(native, bins.path()),
        ],
        &[],
    );
    let out = Command::new(script("check-arch"))
        .arg(good)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the real image fails the check:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("ok: leg linux/{native}")),
        "{stderr}"
    );

    // The native binaries and libraries as the other architecture's leg.
    let wrong_legs = [
        "--arch".to_string(),
        arch_arg(native, bins.path()),
        "--arch".to_string(),
        arch_arg(other, bins.path()),
        "--sysroot".to_string(),
        format!("{other}=/"),
    ];
    let wrong_legs: Vec<&str> = wrong_legs.iter().map(String::as_str).collect();

    // The recipe itself refuses to build it...
    let refused = work.path().join("refused.tar");
    let mut args = vec!["--out", refused.to_str().unwrap()];
    args.extend(&wrong_legs);
    let out = run_build(&args, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the recipe built a wrong leg:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("--arch {other}=")) && stderr.contains("cozyplane"),
        "the refusal names the leg and the binary:\n{stderr}"
    );
    assert!(!refused.exists(), "a refused build leaves no archive");

    // ...so make it on purpose, and the check must catch it.
    let wrong = work.path().join("wrong.tar");
    let mut args = vec!["--out", wrong.to_str().unwrap(), "--no-arch-check"];
    args.extend(&wrong_legs);
    build(&args, &[]);
    let out = Command::new(script("check-arch"))
        .arg(wrong)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "check-arch on the wrong image:\n{stderr}"
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    let wrong_leg = format!("leg linux/{other} ");
    for file in ["/usr/local/bin/cozyplane ", "/usr/local/bin/cozyplane-cni "] {
        assert!(
            errors
                .iter()
                .any(|l| l.contains(&wrong_leg) && l.contains(file)),
            "no error names {file}in the {other} leg:\n{stderr}"
        );
    }
    assert!(
        errors.iter().all(|l| l.contains(&wrong_leg)),
        "only the {other} leg is wrong:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("ok: leg linux/{native}")),
        "the {native} leg is still right:\n{stderr}"
    );
}

/// Guards against an image that builds and checks fine but cannot start:
/// a missing loader or library, a wrong path, an archive containerd rejects.
#[test]
fn imports_into_containerd_and_runs_version() {
    let ready = recipe_needs(needs!().root())
        .tool(&CONTAINERD)
        .tool(&CTR)
        .tool(&RUNC)
        .tool(&UMOUNT)
        .ready();
    if !ready {
        return;
    }
    let (native, _) = arches();
    let bins = stripped_binaries();
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("image.tar");
    let reference = "ghcr.io/cozystack/cozyplane:image-test";
    build(
        &[
            "--out",
            archive.to_str().unwrap(),
            "--arch",
            &arch_arg(native, bins.path()),
            "--tag",
            "image-test",
        ],
        &[],
    );

    let containerd = PrivateContainerd::start();
    let out = containerd
        .ctr(&["images", "import"])
        .arg(archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr images import: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        containerd.log_tail()
    );
    let out = containerd.ctr(&["images", "ls", "-q"]).output().unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.lines().any(|l| l == reference), "imported: {listed}");

    // The entrypoint (builds_twice_with_the_same_digest pins it) plus
    // `version`: what a pod spec's `args: [version]` runs. ctr takes the whole
    // command line, so it is spelled out.
    let (status, stdout, stderr) =
        containerd.run(reference, &["/usr/local/bin/cozyplane", "version"]);
    assert!(
        status.success() && stdout.starts_with("cozyplane "),
        "cozyplane version in the image: {status}\nstdout: {stdout}\nstderr: {stderr}\n{}",
        containerd.log_tail()
    );
}

/// A containerd of our own, everything under one short temp dir (the socket
/// path must fit in 107 bytes). containerd 1.6 still puts shim sockets in
/// `/run/containerd`, so this takes the same machine-wide lock as
/// cozyplane-cri-harness and removes `/run/containerd` again when it made it.
/// Dropping it stops everything it started, on success or panic.
struct PrivateContainerd {
    dir: tempfile::TempDir,
    child: Option<Child>,
    created_run_dir: bool,
    /// Held (locked) until after `drop` has cleaned up.
    _lock: File,
}

/// The lock cozyplane-cri-harness takes for the same shared host paths.
const HOST_LOCK: &str = "/run/cozyplane-cri.lock";
const HOST_RUN_DIR: &str = "/run/containerd";
const NAMESPACE: &str = "cozyplane-image";

impl PrivateContainerd {
    fn start() -> Self {
        let lock = lock_host();
        let dir = tempfile::Builder::new()
            .prefix("cpimg")
            .tempdir_in("/tmp")
            .unwrap();
        let d = dir.path();
        // Only what `ctr images import` and `ctr run` use: no CRI (it would
        // want CNI configs and a sandbox image), everything under `d`.
        let config = format!(
            "version = 2\nroot = {root:?}\nstate = {state:?}\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = {sock:?}\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt:?}\n",
            root = d.join("root"),
            state = d.join("state"),
            sock = d.join("c.sock"),
            opt = d.join("opt"),
        );
        fs::write(d.join("config.toml"), config).unwrap();
        let log = File::create(d.join("containerd.log")).unwrap();
        let created_run_dir = !Path::new(HOST_RUN_DIR).exists();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        // From here on, Drop cleans up whatever fails.
        let mut me = PrivateContainerd {
            dir,
            child: Some(child),
            created_run_dir,
            _lock: lock,
        };
        me.wait_ready();
        me
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("c.sock")
    }

    /// `ctr` on this containerd, in our namespace, with `args`.
    fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.socket())
            .args(["-n", NAMESPACE])
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "containerd log tail:\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("containerd exited: {status}\n{}", self.log_tail());
            }
            let up = self.socket().exists()
                && self
                    .ctr(&["version"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer within 30 s\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ctr run --rm <reference> <id> <command…>`, its runc state and IO FIFOs
    /// under our dir; killed after 2 minutes. Exit status, stdout, stderr.
    fn run(&self, reference: &str, command: &[&str]) -> (std::process::ExitStatus, String, String) {
        let d = self.dir.path();
        let (out_path, err_path) = (d.join("run.out"), d.join("run.err"));
        let mut child = self
            .ctr(&["run", "--rm", "--runc-root"])
            .arg(d.join("runc"))
            .arg("--fifo-dir")
            .arg(d.join("fifo"))
            .args([reference, "cozyplane-version"])
            .args(command)
            .stdout(File::create(&out_path).unwrap())
            .stderr(File::create(&err_path).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ctr run did not finish within 2 minutes\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        (
            status,
            fs::read_to_string(out_path).unwrap(),
            fs::read_to_string(err_path).unwrap(),
        )
    }

    /// Stops containerd by pid and removes all it left: containers runc still
    /// knows, shims serving our socket, mounts under our dir, the dir, and
    /// `/run/containerd` if we made it. Errors go to stderr (this runs in Drop).
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let runc_root = self.dir.path().join("runc");
        if let Ok(ids) = fs::read_dir(&runc_root) {
            for id in ids.flatten() {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "--force"])
                    .arg(id.file_name())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        signal(child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for pid in shims_of(&self.socket()) {
            signal(pid, "KILL");
        }
        detach_mounts_under(self.dir.path());
        if self.created_run_dir {
            detach_mounts_under(Path::new(HOST_RUN_DIR));
            if let Err(e) = fs::remove_dir_all(HOST_RUN_DIR) {
                eprintln!("image test: cannot remove {HOST_RUN_DIR}: {e}");
            }
        }
        // The TempDir removes the dir itself when it drops, after this.
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The exclusive lock on [`HOST_LOCK`], polled so a stuck holder is a
/// failure with a message, not a hung test.
fn lock_host() -> File {
    let deadline = Instant::now() + Duration::from_secs(300);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(HOST_LOCK)
        .unwrap();
    loop {
        match file.try_lock() {
            Ok(()) => return file,
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(TryLockError::WouldBlock) => {
                panic!("another containerd test held {HOST_LOCK} for 5 minutes")
            }
            Err(TryLockError::Error(e)) => panic!("lock {HOST_LOCK}: {e}"),
        }
    }
}

/// `kill -<sig> <pid>`: one process, by its id.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Pids of `containerd-shim*` processes whose command line names `socket`:
/// the shims that served our containerd and would outlive it.
fn shims_of(socket: &Path) -> Vec<u32> {
    let needle = socket.as_os_str().as_encoded_bytes();
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
                let mut args = cmd.split(|b| *b == 0);
                let is_shim = args
                    .next()
                    .and_then(|a| a.rsplit(|b| *b == b'/').next())
                    .is_some_and(|a| a.starts_with(b"containerd-shim"));
                is_shim && args.any(|a| a == needle)
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
        let ok = Command::new("umount")
            .arg("-l")
            .arg(&p)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("image test: cannot unmount {}", p.display());
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
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// Guards against a plugin the node cannot run: the agent copies
/// `cozyplane-cni` onto the node, where the container runtime executes it
/// against the node's libraries, and a node without glibc (Talos) has
/// none. The recipe refuses a dynamically linked plugin, and the check
/// names it in an image made anyway.
#[test]
fn a_dynamically_linked_cni_plugin_is_refused() {
    if !recipe_needs(needs!()).ready() {
        return;
    }
    let (native, _) = arches();
    let bins = stripped_binaries();
    let dynamic = cozyplane_testkit::cni_plugin_bin();
    fs::copy(&dynamic, bins.path().join("cozyplane-cni")).unwrap();
    let work = tempfile::tempdir().unwrap();
    let refused = work.path().join("refused.tar");
    let arch = arch_arg(native, bins.path());
    let out = run_build(&["--out", refused.to_str().unwrap(), "--arch", &arch], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "built with a dynamic plugin:\n{stderr}"
    );
    assert!(
        stderr.contains("must be statically linked") && stderr.contains("crt-static"),
        "{stderr}"
    );
    assert!(!refused.exists());
    let made = work.path().join("made.tar");
    build(
        &[
            "--out",
            made.to_str().unwrap(),
            "--no-arch-check",
            "--arch",
            &arch,
        ],
        &[],
    );
    let out = Command::new(script("check-arch"))
        .arg(&made)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("error:")
            && l.contains("/usr/local/bin/cozyplane-cni")
            && l.contains("must be static")),
        "{stderr}"
    );
}
