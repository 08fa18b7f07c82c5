//! `cozyplane lab up/status/down` end to end, with the real `cozyplane` binary
//! (`$COZYPLANE_BIN`, else `cozyplane` in this test's target dir) and the real
//! kubectl (`$COZYPLANE_KUBECTL`, else the SDK's kubectl 1.33, else
//! `/usr/bin/kubectl`).
//!
//! Needs root, bpffs, cgroup2. Under `CI=true` a missing prerequisite fails the
//! test; elsewhere it is skipped with a note.
//!
//! Run: `cargo build -p cozyplane && cargo test -p cozyplane-lab --test cluster`

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KUBECTL_CANDIDATES: [&str; 2] = [
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.33",
    "/usr/bin/kubectl",
];

/// The `cozyplane` binary: `$COZYPLANE_BIN`, else `<target>/<profile>/cozyplane`.
fn cozyplane_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("COZYPLANE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // <target>/<profile>/deps/cluster-<hash> → <target>/<profile>/cozyplane
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("cozyplane"))
        .expect("test binary lives in <target>/<profile>/deps")
}

fn kubectl_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COZYPLANE_KUBECTL") {
        return Some(PathBuf::from(p));
    }
    KUBECTL_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The binary and kubectl, or `None` (skip) / panic under CI when something is missing.
fn prerequisites(test: &str) -> Option<(PathBuf, PathBuf)> {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root".to_string());
    }
    let bin = cozyplane_bin();
    let has_lab = Command::new(&bin)
        .args(["lab", "--help"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_lab {
        missing.push(format!(
            "a cozyplane binary with the `lab` subcommand at {} (cargo build -p cozyplane, or set COZYPLANE_BIN)",
            bin.display()
        ));
    }
    let kubectl = kubectl_bin().filter(|k| {
        Command::new(k)
            .args(["version", "--client"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if kubectl.is_none() {
        missing.push("kubectl (set COZYPLANE_KUBECTL)".into());
    }
    if missing.is_empty() {
        return Some((bin, kubectl?));
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{test}: cannot run under CI=true, missing: {}",
            missing.join("; ")
        );
    }
    eprintln!("SKIP {test}: missing {}", missing.join("; "));
    None
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn lab(bin: &Path, args: &[&str]) -> Output {
    lab_cmd(bin, args).output().expect("run cozyplane lab")
}

fn lab_cmd(bin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("lab").args(args).env("COZYPLANE_BIN", bin);
    cmd
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `lab down` however the test ends, so a failed assertion leaves no lab.
struct Down<'a>(&'a Path, &'a str);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = lab(self.0, &["down", "--name", self.1]);
    }
}

fn run_dir(name: &str) -> PathBuf {
    Path::new("/run/cozyplane-lab").join(name)
}

/// `(pid, start time)` of every component `up` recorded.
fn recorded_processes(name: &str) -> Vec<(i32, u64)> {
    let path = run_dir(name).join("cluster.json");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read cluster.json")).expect("json");
    rec["components"]
        .as_array()
        .expect("components")
        .iter()
        .map(|c| {
            (
                c["pid"]
                    .as_i64()
                    .and_then(|p| i32::try_from(p).ok())
                    .expect("pid"),
                c["start_time"].as_u64().expect("start_time"),
            )
        })
        .collect()
}

/// True if `pid` is still the process started at `start` and has not exited.
fn running(pid: i32, start: u64) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // After `up` exited its processes belong to init; one that was killed but
    // not yet reaped (state Z) is gone.
    fields.len() > 19
        && fields[19].parse::<u64>().ok() == Some(start)
        && fields[0] != "Z"
        && fields[0] != "X"
}

fn assert_all_gone(procs: &[(i32, u64)]) {
    for &(pid, start) in procs {
        assert!(!running(pid, start), "process {pid} survived lab down");
    }
}

fn netns_with_prefix(name: &str) -> Vec<String> {
    let prefix = format!("{name}-");
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn lab_up_status_kubectl_and_down_twice() {
    let test = "lab_up_status_kubectl_and_down_twice";
    let Some((bin, kubectl)) = prerequisites(test) else {
        return;
    };
    let name = format!("cl{}", std::process::id() % 100_000);
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);

    let up = ok(
        "lab up",
        lab(&bin, &["up", "--name", &name, "--nodes", "2"]),
    );
    for n in 1..=2 {
        let line = format!("starting node {name}-node{n} … ready");
        assert!(up.contains(&line), "no progress line {line:?}:\n{up}");
    }
    let kubeconfig = up
        .lines()
        .find_map(|l| l.strip_prefix("kubeconfig: "))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no kubeconfig line:\n{up}"));
    assert!(
        up.contains(&format!("kubectl --kubeconfig {}", kubeconfig.display())),
        "{up}"
    );
    let procs = recorded_processes(&name);
    // API server, relay, 2 agents, controller.
    assert_eq!(procs.len(), 5, "{procs:?}");

    // `up` has exited; the lab keeps running and is healthy.
    let status = ok("lab status", lab(&bin, &["status", "--name", &name]));
    assert!(status.contains("nodes: 2/2 ready"), "{status}");
    assert!(status.contains("pods: 0"), "{status}");
    assert!(status.contains("healthy: yes"), "{status}");

    // The real kubectl, from the host, with the printed kubeconfig.
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--request-timeout=10s", "get", "nodes", "-o", "wide"])
        .output()
        .expect("run kubectl");
    let nodes = ok("kubectl get nodes", out);
    for (n, ip) in [(1, "198.18.0.11"), (2, "198.18.0.12")] {
        let line = nodes
            .lines()
            .find(|l| l.starts_with(&format!("{name}-node{n} ")))
            .unwrap_or_else(|| panic!("node {n} missing:\n{nodes}"));
        assert!(
            line.contains(ip),
            "node {n} without InternalIP {ip}: {line}"
        );
    }

    // A second `up` of the same name fails clearly and breaks nothing.
    let again = lab(&bin, &["up", "--name", &name, "--nodes", "2"]);
    assert!(!again.status.success(), "a second up must fail");
    assert!(
        text(&again.stderr).contains("already exists"),
        "{}",
        text(&again.stderr)
    );
    let status = ok(
        "lab status after a refused up",
        lab(&bin, &["status", "--name", &name]),
    );
    assert!(status.contains("healthy: yes"), "{status}");

    // Down removes every namespace, process and the run dir; a second down is fine.
    ok("lab down", lab(&bin, &["down", "--name", &name]));
    assert_eq!(netns_with_prefix(&name), Vec::<String>::new());
    assert_all_gone(&procs);
    assert!(!run_dir(&name).exists(), "run dir left behind");
    let second = ok("second lab down", lab(&bin, &["down", "--name", &name]));
    assert!(second.contains("nothing to remove"), "{second}");
    let status = lab(&bin, &["status", "--name", &name]);
    assert!(
        !status.status.success(),
        "status of a removed lab must fail"
    );
    assert!(
        text(&status.stderr).contains("no lab named"),
        "{}",
        text(&status.stderr)
    );
}

#[test]
fn a_failed_up_leaves_nothing_and_says_why() {
    let test = "a_failed_up_leaves_nothing_and_says_why";
    let Some((bin, _)) = prerequisites(test) else {
        return;
    };
    let name = format!("cf{}", std::process::id() % 100_000);
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);

    // The components' binary exits at once: the API server never comes up.
    let out = lab_cmd(&bin, &["up", "--name", &name, "--nodes", "2"])
        .env("COZYPLANE_BIN", "/bin/false")
        .output()
        .expect("run lab up");
    assert!(!out.status.success(), "up with a broken binary must fail");
    let err = text(&out.stderr);
    assert!(
        err.contains("the API server did not become ready") && err.contains("exited"),
        "{err}"
    );
    assert_eq!(
        netns_with_prefix(&name),
        Vec::<String>::new(),
        "namespaces left"
    );
    assert!(!run_dir(&name).exists(), "run dir left behind");

    // A missing binary is refused before anything is made.
    let out = lab_cmd(&bin, &["up", "--name", &name])
        .env("COZYPLANE_BIN", "/nonexistent/cozyplane")
        .output()
        .expect("run lab up");
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("/nonexistent/cozyplane") && err.contains("COZYPLANE_BIN"),
        "{err}"
    );
    assert!(!run_dir(&name).exists(), "run dir made before the checks");

    // Not root: a clear error, nothing made.
    let out = lab_cmd(&bin, &["up", "--name", &name])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run lab up as nobody");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("needs root"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn down_after_a_crashed_up_removes_everything() {
    let test = "down_after_a_crashed_up_removes_everything";
    let Some((bin, _)) = prerequisites(test) else {
        return;
    };
    let name = format!("cc{}", std::process::id() % 100_000);
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);

    let mut up = lab_cmd(&bin, &["up", "--name", &name, "--nodes", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn lab up");
    // SIGKILL `up` once it has started processes (the topology's state file lists them).
    let state = run_dir(&name).join("state.json");
    let tracked = || -> Vec<(i32, u64)> {
        std::fs::read(&state)
            .ok()
            .and_then(|b| serde_json::from_slice::<cozyplane_lab::LabState>(&b).ok())
            .map(|s| s.processes.iter().map(|p| (p.pid, p.start_time)).collect())
            .unwrap_or_default()
    };
    cozyplane_lab::wait_for(
        "lab up to start a process",
        std::time::Duration::from_secs(60),
        || !tracked().is_empty(),
    )
    .expect("lab up started nothing");
    up.kill().expect("kill lab up");
    up.wait().expect("reap lab up");
    let procs = tracked();

    let status = lab(&bin, &["status", "--name", &name]);
    assert!(!status.status.success());
    assert!(
        text(&status.stderr).contains("is incomplete"),
        "{}",
        text(&status.stderr)
    );

    ok(
        "lab down after a crash",
        lab(&bin, &["down", "--name", &name]),
    );
    assert_eq!(
        netns_with_prefix(&name),
        Vec::<String>::new(),
        "namespaces left"
    );
    assert_all_gone(&procs);
    assert!(!run_dir(&name).exists(), "run dir left behind");
    let second = ok("second lab down", lab(&bin, &["down", "--name", &name]));
    assert!(second.contains("nothing to remove"), "{second}");
}
