//! The plugin against real network namespaces (needs root and iproute2's
//! `ip`): a sandbox netns is accepted and handed to the agent, and a named
//! netns that is really the host's own (the bind-mount trick) is refused for
//! ADD and DEL before anything reaches the agent.
//!
//! Under CI a missing prerequisite fails the test; elsewhere it is skipped
//! with a `SKIP` line (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod common;

use std::process::Command;

use common::{exec_plugin, FakeAgent};
use cozyplane_cni::proto::{Request, Response};
use cozyplane_cni::types::{AttachmentResult, Interface};
use cozyplane_testkit::{needs, tools};
use serde_json::json;

/// A named netns under /run/netns, deleted on drop.
struct NamedNetns(String);

impl NamedNetns {
    fn add(name: String) -> Self {
        ip(&["netns", "add", &name]);
        NamedNetns(name)
    }

    /// Names the netns of process `pid` (here: our own, i.e. the host's).
    fn attach(name: String, pid: u32) -> Self {
        ip(&["netns", "attach", &name, &pid.to_string()]);
        NamedNetns(name)
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn real_sandbox_netns_is_accepted_and_host_netns_is_refused() {
    if !needs!().root().tool(&tools::IP).ready() {
        return;
    }
    let pid = std::process::id();
    let sandbox = NamedNetns::add(format!("cpcni-pod-{pid}"));
    let host_alias = NamedNetns::attach(format!("cpcni-host-{pid}"), pid);

    let dir = tempfile::tempdir().expect("tempdir");
    let sandbox_path = sandbox.path();
    let agent = FakeAgent::start(dir.path(), move |req| match req {
        Request::Add(a) => Response::Ok {
            result: Some(AttachmentResult {
                interfaces: vec![Interface {
                    name: a.attachment.ifname.clone(),
                    sandbox: a.attachment.netns.clone(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        },
        _ => Response::ok(),
    });
    let conf = json!({"cniVersion": "1.0.0", "name": "cozyplane", "type": "cozyplane", "agentSocket": agent.socket}).to_string();
    let env = |cmd: &'static str, netns: &str| -> Vec<(&'static str, String)> {
        vec![
            ("CNI_COMMAND", cmd.into()),
            ("CNI_CONTAINERID", "netnstest".into()),
            ("CNI_NETNS", netns.into()),
            ("CNI_IFNAME", "eth0".into()),
        ]
    };
    let exec = |cmd: &'static str, netns: &str| {
        let e = env(cmd, netns);
        let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
        exec_plugin(&e, &conf)
    };

    let run = exec("ADD", &sandbox_path);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["interfaces"][0]["sandbox"], sandbox_path);

    for cmd in ["ADD", "DEL"] {
        let v = exec(cmd, &host_alias.path()).expect_error(4);
        assert!(
            v["msg"].as_str().unwrap_or("").contains("own (host)"),
            "{cmd}: {v}"
        );
    }
    let reqs = agent.requests();
    assert_eq!(
        reqs.len(),
        1,
        "only the sandbox ADD may reach the agent: {reqs:?}"
    );
}
