//! The lab's components (agents, kubelets) as processes: found in
//! cluster.json, killed, started again as `lab up` started them.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cozyplane_lab::wait_for;
use serde_json::Value;

use super::hosts::Ns;
use super::{run_dir, running};

/// `(pid, start time)` of the component `role` in `place` from cluster.json, and its command line.
pub fn component_of(name: &str, role: &str, place: &str) -> ((i32, u64), Vec<String>) {
    let rec: Value = serde_json::from_slice(
        &std::fs::read(run_dir(name).join("cluster.json")).expect("cluster.json"),
    )
    .expect("json");
    let c = rec["components"]
        .as_array()
        .expect("components")
        .iter()
        .find(|c| c["role"] == role && c["place"] == place)
        .unwrap_or_else(|| panic!("no {role} in {place} in cluster.json"))
        .clone();
    let pid = i32::try_from(c["pid"].as_i64().expect("pid")).expect("pid");
    let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .expect("cmdline")
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    ((pid, c["start_time"].as_u64().expect("start_time")), argv)
}

/// SIGKILLs a component and waits until it is gone.
pub fn sigkill(what: &str, (pid, start): (i32, u64)) {
    assert!(running(pid, start), "{what} is not running");
    // SAFETY: kill(2) takes plain integers; pid was just checked to be the component.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_for(&format!("{what} to die"), Duration::from_secs(10), || {
        !running(pid, start)
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Starts `argv` again in `ns`, appending to `log`, as `lab up` did.
pub fn restart_in(ns: &Ns, argv: &[String], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(log)
        .expect("open log");
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup"))
        .stderr(log)
        .process_group(0);
    cozyplane_lab::exec::enter_before_exec(&mut cmd, &ns.1).expect("setns hook");
    cmd.spawn().expect("restart")
}
