//! Shared by the tests that drive the `cozyplane lab` binary (tests/cluster.rs,
//! tests/kubelet.rs): finding the binaries, the CI gate, running `lab …`.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KUBECTL_CANDIDATES: [&str; 2] = [
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.33",
    "/usr/bin/kubectl",
];

/// The `cozyplane` binary: `$COZYPLANE_BIN`, else `<target>/<profile>/cozyplane`.
pub fn cozyplane_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("COZYPLANE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // <target>/<profile>/deps/<test>-<hash> → <target>/<profile>/cozyplane
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

/// The binary and kubectl, or `None` (skip) / panic under CI when something
/// is missing: root, the binary with `lab`, kubectl, or one of `tools` (run
/// with `-V` to check they exist).
pub fn prerequisites(test: &str, tools: &[&str]) -> Option<(PathBuf, PathBuf)> {
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
    for tool in tools {
        if Command::new(tool).arg("-V").output().is_err() {
            missing.push(format!("{tool} (iproute2)"));
        }
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

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn lab(bin: &Path, args: &[&str]) -> Output {
    lab_cmd(bin, args).output().expect("run cozyplane lab")
}

pub fn lab_cmd(bin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("lab").args(args).env("COZYPLANE_BIN", bin);
    cmd
}

pub fn ok(what: &str, out: Output) -> String {
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
pub struct Down<'a>(pub &'a Path, pub &'a str);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = lab(self.0, &["down", "--name", self.1]);
    }
}

pub fn run_dir(name: &str) -> PathBuf {
    Path::new("/run/cozyplane-lab").join(name)
}

/// True if `pid` is still the process started at `start` and has not exited.
pub fn running(pid: i32, start: u64) -> bool {
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

pub fn netns_with_prefix(name: &str) -> Vec<String> {
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
