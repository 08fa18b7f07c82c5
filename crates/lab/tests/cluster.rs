//! `cozyplane lab up/status/down` end to end, with the real `cozyplane` binary
//! (`$COZYPLANE_BIN`, else built by the test kit) and the real kubectl
//! (`$COZYPLANE_KUBECTL`, else the SDK's kubectl 1.33, else `/usr/bin/kubectl`).
//!
//! Needs root, bpffs, cgroup2 and kubectl. Under CI a missing prerequisite fails
//! the test; elsewhere it is skipped with a `SKIP` line (the test kit's gate).
//!
//! Run: `cargo test -p cozyplane-lab --test cluster`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use cozyplane_testkit::needs;
use lab_support::{
    lab, lab_cmd, netns_with_prefix, ok, prerequisites, run_dir, running, text, Down,
};

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

fn assert_all_gone(procs: &[(i32, u64)]) {
    for &(pid, start) in procs {
        assert!(!running(pid, start), "process {pid} survived lab down");
    }
}

#[test]
fn lab_up_status_kubectl_and_down_twice() {
    let Some((bin, kubectl)) = prerequisites(needs!()) else {
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
    // API server, relay, 2 agents, controller, scheduler, 2 kubelets, external probe server.
    assert_eq!(procs.len(), 9, "{procs:?}");

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
    let err = text(&again.stderr);
    assert!(
        err.contains(&format!("lab {name} already exists"))
            && err.contains(&format!("cozyplane lab down --name {name}")),
        "the refusal says what to do: {err}"
    );
    assert!(!err.contains("backtrace"), "an error, not a crash: {err}");
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
    let Some((bin, _)) = prerequisites(needs!()) else {
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
    let Some((bin, _)) = prerequisites(needs!()) else {
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
