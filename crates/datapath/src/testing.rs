//! Test support shared by every privileged test of the project (feature
//! `test-util`): one place that applies the rule "under `CI=true` a test that
//! cannot run fails; elsewhere it is skipped with a note".

use std::process::Command;

/// Whether the calling test can run: it needs root and each of `tools`, given
/// as `(binary, what to install)` pairs and probed with `<binary> -V`. Under
/// `CI=true` anything missing panics naming it; otherwise the test should
/// return early (a note is printed) when this answers false.
pub fn prerequisites(test: &str, tools: &[(&str, &str)]) -> bool {
    let mut missing: Vec<&str> = Vec::new();
    if !is_root() {
        missing.push("root");
    }
    for (bin, what) in tools {
        let found = Command::new(bin)
            .arg("-V")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            missing.push(what);
        }
    }
    if missing.is_empty() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "{test}: cannot run under CI=true, missing: {}",
            missing.join(", ")
        );
    }
    eprintln!("SKIP {test}: missing {}", missing.join(", "));
    false
}

/// The ip (iproute2) and ping tools network-namespace tests drive.
pub const NETNS_TOOLS: &[(&str, &str)] =
    &[("ip", "ip (iproute2)"), ("ping", "ping (iputils-ping)")];

/// Whether the effective uid is 0 (read from /proc, no unsafe needed).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}
