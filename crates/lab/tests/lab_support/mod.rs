//! Shared by the tests that drive the `cozyplane lab` binary (tests/cluster.rs,
//! tests/kubelet.rs, tests/service_unfitted.rs, …): what they need, the
//! binaries, running `lab …`.
#![allow(dead_code)] // each test binary uses a different subset

pub mod components;
pub mod hosts;
pub mod kubectl;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cozyplane_testkit::Needs;

/// The `cozyplane` binary and kubectl, when the calling test's `needs` plus
/// root and kubectl are met; `None` means skipped (the test kit's gate fails
/// the test under CI instead). The binary comes from `$COZYPLANE_BIN`, else
/// it is built (the test kit's workspace-binary finder).
pub fn prerequisites(needs: Needs) -> Option<(PathBuf, PathBuf)> {
    let kubectl = needs.root().ready_with(cozyplane_testkit::kubectl())?;
    Some((cozyplane_testkit::cozyplane_bin(), kubectl))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn lab(bin: &Path, args: &[&str]) -> Output {
    lab_cmd(bin, args).output().expect("run cozyplane lab")
}

/// `cozyplane lab <args>` running `bin` as every component and the CNI plugin
/// of this workspace (`$COZYPLANE_CNI_BIN`, else built).
pub fn lab_cmd(bin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("lab")
        .args(args)
        .env("COZYPLANE_BIN", bin)
        .env("COZYPLANE_CNI_BIN", cozyplane_testkit::cni_plugin_bin());
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
