//! Spec conformance of the real plugin binary: env + stdin in, JSON out,
//! against a test double of the node agent on a real unix socket.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod common;

use std::time::Duration;

use common::{exec_plugin, fake_netns, FakeAgent};
use cozyplane_cni::config::ValidAttachment;
use cozyplane_cni::env::PodIdentity;
use cozyplane_cni::proto::{Request, Response};
use cozyplane_cni::types::{AttachmentResult, Interface, IpConfig, Route};
use cozyplane_cni::CniError;
use serde_json::{json, Value};

const CONTAINER: &str = "4f1c2a9e0b7d";
const POD_ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_UID=7d3c-11ee;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=4f1c2a9e0b7d";

fn conf(version: &str, socket: &std::path::Path, extra: Value) -> String {
    let mut c = json!({
        "cniVersion": version,
        "name": "cozyplane",
        "type": "cozyplane",
        "mtu": 1450,
        "agentSocket": socket,
        "agentTimeoutSeconds": 5,
    });
    if let (Some(c), Value::Object(extra)) = (c.as_object_mut(), extra) {
        c.extend(extra);
    }
    c.to_string()
}

/// What a real agent answers for a pod: host veth, pod eth0 with a /32 and
/// an on-link default route.
fn agent_result(netns: &str) -> AttachmentResult {
    AttachmentResult {
        interfaces: vec![
            Interface {
                name: "cph4f1c2a9e0b7".into(),
                mac: Some("ee:ee:ee:ee:ee:ee".into()),
                mtu: Some(1450),
                ..Default::default()
            },
            Interface {
                name: "eth0".into(),
                mac: Some("0a:58:0a:f4:01:05".into()),
                mtu: Some(1450),
                sandbox: Some(netns.into()),
                ..Default::default()
            },
        ],
        ips: vec![IpConfig {
            address: "10.244.1.5/32".parse().expect("cidr"),
            gateway: Some("169.254.1.1".parse().expect("ip")),
            interface: Some(1),
        }],
        routes: vec![Route::new(
            "0.0.0.0/0".parse().expect("cidr"),
            Some("169.254.1.1".parse().expect("ip")),
        )],
        dns: Default::default(),
    }
}

fn add_env(netns: &str) -> Vec<(&str, &str)> {
    vec![
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", CONTAINER),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", POD_ARGS),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
}

fn answering_add(
    result: AttachmentResult,
) -> impl Fn(&Request) -> Response + Send + Sync + 'static {
    move |req| match req {
        Request::Add(_) => Response::Ok {
            result: Some(result.clone()),
        },
        _ => Response::ok(),
    }
}

#[test]
fn version_reports_every_supported_version() {
    let run = exec_plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.json(),
        json!({"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn malformed_config_is_code_6_on_stdout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let run = exec_plugin(&add_env(&ns), r#"{"cniVersion": "1.0.0", "name": "#);
    let v = run.expect_error(6);
    assert!(
        v["msg"].as_str().unwrap_or("").contains("not valid JSON"),
        "{v}"
    );
    assert_eq!(v["cniVersion"], "1.1.0"); // nothing decodable: our newest
}

#[test]
fn unsupported_version_is_code_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let run = exec_plugin(
        &add_env(&ns),
        r#"{"cniVersion":"0.2.0","name":"cozyplane","type":"cozyplane"}"#,
    );
    let v = run.expect_error(1);
    assert!(v["details"].as_str().unwrap_or("").contains("1.1.0"), "{v}");
}

#[test]
fn add_without_netns_is_code_4_naming_the_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = FakeAgent::start(dir.path(), |_| Response::ok());
    let env: Vec<_> = add_env("")
        .into_iter()
        .filter(|(k, _)| *k != "CNI_NETNS")
        .collect();
    let v = exec_plugin(&env, &conf("1.0.0", &agent.socket, json!({}))).expect_error(4);
    assert!(v["msg"].as_str().unwrap_or("").contains("CNI_NETNS"), "{v}");
    assert!(agent.requests().is_empty(), "nothing must reach the agent");
}

#[test]
fn bad_env_is_code_4_before_anything_reaches_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = FakeAgent::start(dir.path(), |_| Response::ok());
    let ns = fake_netns(dir.path(), "ns");
    let stdin = conf("1.0.0", &agent.socket, json!({}));
    let cases: Vec<(&str, &str, &str)> = vec![
        ("CNI_IFNAME", "this-name-is-too-long", "CNI_IFNAME"),
        ("CNI_IFNAME", "..", "CNI_IFNAME"),
        ("CNI_CONTAINERID", "-bad", "CNI_CONTAINERID"),
        ("CNI_ARGS", "K8S_POD_NAME=x;SURPRISE=1", "CNI_ARGS"),
        (
            "CNI_NETNS",
            "/proc/self/ns/net",
            "own (host) network namespace",
        ),
        ("CNI_NETNS", "/nonexistent/netns", "does not exist"),
        ("CNI_COMMAND", "ATTACH", "CNI_COMMAND"),
    ];
    for (key, value, needle) in cases {
        let env: Vec<_> = add_env(&ns)
            .into_iter()
            .map(|(k, v)| if k == key { (k, value) } else { (k, v) })
            .collect();
        let v = exec_plugin(&env, &stdin).expect_error(4);
        assert!(
            v["msg"].as_str().unwrap_or("").contains(needle),
            "{key}={value}: {v}"
        );
    }
    assert!(agent.requests().is_empty());
}

#[test]
fn add_sends_the_attachment_and_prints_the_result_in_each_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "cni-1234");
    let agent = FakeAgent::start(dir.path(), answering_add(agent_result(&ns)));
    let expected_ifaces_pre_1_1 = json!([
        {"name": "cph4f1c2a9e0b7", "mac": "ee:ee:ee:ee:ee:ee"},
        {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": ns}
    ]);
    let cases = [
        (
            "0.4.0",
            json!({
                "cniVersion": "0.4.0",
                "interfaces": expected_ifaces_pre_1_1,
                "ips": [{"version": "4", "address": "10.244.1.5/32", "gateway": "169.254.1.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                "dns": {}
            }),
        ),
        (
            "1.0.0",
            json!({
                "cniVersion": "1.0.0",
                "interfaces": expected_ifaces_pre_1_1,
                "ips": [{"address": "10.244.1.5/32", "gateway": "169.254.1.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                "dns": {}
            }),
        ),
        (
            "1.1.0",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "cph4f1c2a9e0b7", "mac": "ee:ee:ee:ee:ee:ee", "mtu": 1450},
                    {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "mtu": 1450, "sandbox": ns}
                ],
                "ips": [{"address": "10.244.1.5/32", "gateway": "169.254.1.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                "dns": {}
            }),
        ),
    ];
    for (i, (version, want)) in cases.iter().enumerate() {
        let stdin = conf(
            version,
            &agent.socket,
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}}),
        );
        let run = exec_plugin(&add_env(&ns), &stdin);
        assert_eq!(run.code, 0, "{version}: {run:?}");
        assert_eq!(&run.json(), want, "{version}");

        let reqs = agent.requests();
        assert_eq!(reqs.len(), i + 1);
        let Request::Add(add) = &reqs[i] else {
            panic!("expected ADD, got {:?}", reqs[i]);
        };
        assert_eq!(add.attachment.network, "cozyplane");
        assert_eq!(add.attachment.container_id, CONTAINER);
        assert_eq!(add.attachment.ifname, "eth0");
        assert_eq!(add.attachment.netns.as_deref(), Some(ns.as_str()));
        assert_eq!(
            add.attachment.pod,
            Some(PodIdentity {
                namespace: "team-a".into(),
                name: "web-0".into(),
                uid: Some("7d3c-11ee".into()),
                infra_container_id: Some(CONTAINER.into()),
            })
        );
        assert_eq!(add.mtu, Some(1450));
        assert_eq!(
            add.runtime_config
                .as_ref()
                .map(|m| m["portMappings"][0]["hostPort"].clone()),
            Some(json!(8080))
        );
    }
}

#[test]
fn chained_add_keeps_the_previous_result_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), answering_add(agent_result(&ns)));
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "lo", "sandbox": ns}],
        "ips": [{"address": "127.0.0.1/8", "interface": 0}],
        "dns": {"nameservers": ["10.96.0.10"]}
    });
    let run = exec_plugin(
        &add_env(&ns),
        &conf("1.0.0", &agent.socket, json!({"prevResult": prev})),
    );
    assert_eq!(run.code, 0, "{run:?}");
    let v = run.json();
    assert_eq!(v["interfaces"][0]["name"], "lo");
    assert_eq!(v["interfaces"][2]["name"], "eth0");
    assert_eq!(
        v["ips"][0],
        json!({"address": "127.0.0.1/8", "interface": 0})
    );
    assert_eq!(
        v["ips"][1]["interface"], 2,
        "our index shifted past the earlier interfaces"
    );
    assert_eq!(v["dns"]["nameservers"], json!(["10.96.0.10"]));
}

#[test]
fn config_dns_fills_in_when_the_agent_reports_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), answering_add(agent_result(&ns)));
    let stdin = conf(
        "1.0.0",
        &agent.socket,
        json!({"dns": {"nameservers": ["10.96.0.10"], "search": ["cluster.local"]}}),
    );
    let v = exec_plugin(&add_env(&ns), &stdin).json();
    assert_eq!(
        v["dns"],
        json!({"nameservers": ["10.96.0.10"], "search": ["cluster.local"]})
    );
}

#[test]
fn agent_errors_reach_the_runtime_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), |_| Response::Error {
        error: CniError::new(110, "address pool exhausted")
            .with_details("10.244.0.0/16 has no free address"),
    });
    let v = exec_plugin(&add_env(&ns), &conf("1.0.0", &agent.socket, json!({}))).expect_error(110);
    assert_eq!(
        v,
        json!({"cniVersion": "1.0.0", "code": 110, "msg": "address pool exhausted", "details": "10.244.0.0/16 has no free address"})
    );
}

#[test]
fn inconsistent_agent_result_is_a_protocol_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let mut bad = agent_result(&ns);
    bad.ips[0].interface = Some(9);
    let agent = FakeAgent::start(dir.path(), answering_add(bad));
    exec_plugin(&add_env(&ns), &conf("1.0.0", &agent.socket, json!({}))).expect_error(101);
}

#[test]
fn add_with_agent_not_listening_is_try_again_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    // no socket at all
    let missing = dir.path().join("absent.sock");
    exec_plugin(&add_env(&ns), &conf("1.0.0", &missing, json!({}))).expect_error(11);
    // a stale socket file whose agent died
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    let v = exec_plugin(&add_env(&ns), &conf("1.0.0", &stale, json!({}))).expect_error(11);
    assert!(
        v["details"]
            .as_str()
            .unwrap_or("")
            .contains("not accepting"),
        "{v}"
    );
}

#[test]
fn add_with_a_hung_agent_times_out_as_try_again_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), |_| {
        std::thread::sleep(Duration::from_millis(2500));
        Response::ok()
    });
    let stdin = conf("1.0.0", &agent.socket, json!({"agentTimeoutSeconds": 1}));
    let v = exec_plugin(&add_env(&ns), &stdin).expect_error(11);
    assert!(
        v["details"]
            .as_str()
            .unwrap_or("")
            .contains("did not answer"),
        "{v}"
    );
}

fn del_env(netns: &str) -> Vec<(&str, &str)> {
    let mut env = add_env(netns);
    env[0] = ("CNI_COMMAND", "DEL");
    env
}

#[test]
fn del_twice_second_without_netns_or_prev_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), |_| Response::ok());
    let prev = cozyplane_cni::result::encode(
        &agent_result(&ns),
        cozyplane_cni::version::CniVersion::V1_0_0,
    );
    // StopPodSandbox: netns and prevResult
    exec_plugin(
        &del_env(&ns),
        &conf("1.0.0", &agent.socket, json!({"prevResult": prev})),
    )
    .expect_silent_success();
    // RemovePodSandbox: empty CNI_NETNS, no prevResult (containerd 1.6)
    let mut env = del_env("");
    env.retain(|(k, _)| *k != "CNI_PATH");
    exec_plugin(&env, &conf("1.0.0", &agent.socket, json!({}))).expect_silent_success();

    let reqs = agent.requests();
    assert_eq!(reqs.len(), 2);
    let (Request::Del(first), Request::Del(second)) = (&reqs[0], &reqs[1]) else {
        panic!("expected two DELs: {reqs:?}");
    };
    assert_eq!(first.attachment.netns.as_deref(), Some(ns.as_str()));
    assert_eq!(
        first
            .prev_result
            .as_ref()
            .map(|p| p.ips[0].address.to_string()),
        Some("10.244.1.5/32".into())
    );
    assert_eq!(
        first.attachment.pod.as_ref().map(|p| p.name.as_str()),
        Some("web-0")
    );
    assert_eq!(second.attachment.container_id, CONTAINER);
    assert_eq!(second.attachment.ifname, "eth0");
    assert_eq!(second.attachment.netns, None);
    assert_eq!(second.prev_result, None);
}

#[test]
fn del_of_a_vanished_netns_still_asks_the_agent_without_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = FakeAgent::start(dir.path(), |_| Response::ok());
    let gone = dir.path().join("gone-ns");
    exec_plugin(
        &del_env(gone.to_str().expect("utf8")),
        &conf("1.0.0", &agent.socket, json!({})),
    )
    .expect_silent_success();
    let reqs = agent.requests();
    let [Request::Del(del)] = reqs.as_slice() else {
        panic!("{reqs:?}");
    };
    assert_eq!(del.attachment.netns, None);
}

#[test]
fn del_tolerates_junk_args_and_prev_result_but_not_the_host_netns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), |_| Response::ok());
    let mut env = del_env(&ns);
    env[4] = ("CNI_ARGS", "NOT-A-PAIR");
    let run = exec_plugin(
        &env,
        &conf(
            "1.0.0",
            &agent.socket,
            json!({"prevResult": {"ips": [{"address": "nope"}]}}),
        ),
    );
    run.expect_silent_success();
    assert!(
        run.stderr.contains("ignoring CNI_ARGS") && run.stderr.contains("ignoring prevResult"),
        "{run:?}"
    );
    let reqs = agent.requests();
    let [Request::Del(del)] = reqs.as_slice() else {
        panic!("{reqs:?}");
    };
    assert_eq!(
        (del.attachment.pod.clone(), del.prev_result.clone()),
        (None, None)
    );

    exec_plugin(
        &del_env("/proc/self/ns/net"),
        &conf("1.0.0", &agent.socket, json!({})),
    )
    .expect_error(4);
    assert_eq!(
        agent.requests().len(),
        1,
        "host netns must never reach the agent"
    );
}

#[test]
fn del_without_agent_socket_succeeds_but_a_dead_agent_is_try_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent.sock");
    let run = exec_plugin(&del_env(""), &conf("1.0.0", &missing, json!({})));
    run.expect_silent_success();
    assert!(run.stderr.contains("nothing to release"), "{run:?}");

    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    exec_plugin(&del_env(""), &conf("1.0.0", &stale, json!({}))).expect_error(11);
}

#[test]
fn check_sends_prev_result_and_reports_agent_verdict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    let agent = FakeAgent::start(dir.path(), |req| match req {
        Request::Check(c) if c.prev_result.ips.is_empty() => Response::Error {
            error: CniError::new(7, "prevResult lists no address"),
        },
        _ => Response::ok(),
    });
    let mut env = add_env(&ns);
    env[0] = ("CNI_COMMAND", "CHECK");
    let prev = cozyplane_cni::result::encode(
        &agent_result(&ns),
        cozyplane_cni::version::CniVersion::V0_4_0,
    );
    exec_plugin(
        &env,
        &conf("0.4.0", &agent.socket, json!({"prevResult": prev})),
    )
    .expect_silent_success();
    exec_plugin(
        &env,
        &conf(
            "1.1.0",
            &agent.socket,
            json!({"prevResult": {"cniVersion": "1.1.0"}}),
        ),
    )
    .expect_error(7);
    // CHECK without prevResult never reaches the agent
    exec_plugin(&env, &conf("1.1.0", &agent.socket, json!({}))).expect_error(7);

    let reqs = agent.requests();
    assert_eq!(reqs.len(), 2);
    let Request::Check(check) = &reqs[0] else {
        panic!("{reqs:?}");
    };
    assert_eq!(check.attachment.container_id, CONTAINER);
    assert_eq!(check.attachment.netns.as_deref(), Some(ns.as_str()));
    assert_eq!(check.prev_result, {
        // 0.4.0 cannot carry interface MTUs
        let mut r = agent_result(&ns);
        r.interfaces.iter_mut().for_each(|i| i.mtu = None);
        r
    });
}

#[test]
fn status_is_ready_not_ready_or_unavailable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = ready.clone();
    let agent = FakeAgent::start(dir.path(), move |_| {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            Response::ok()
        } else {
            Response::Error {
                error: CniError::new(50, "datapath not loaded yet"),
            }
        }
    });
    let env = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")];
    exec_plugin(&env, &conf("1.1.0", &agent.socket, json!({}))).expect_silent_success();
    ready.store(false, std::sync::atomic::Ordering::SeqCst);
    let v = exec_plugin(&env, &conf("1.1.0", &agent.socket, json!({}))).expect_error(50);
    assert_eq!(v["msg"], "datapath not loaded yet");
    assert!(
        matches!(agent.requests().as_slice(), [Request::Status(s), Request::Status(_)] if s.network == "cozyplane")
    );

    let missing = dir.path().join("absent.sock");
    exec_plugin(&env, &conf("1.1.0", &missing, json!({}))).expect_error(50);
}

#[test]
fn gc_passes_the_valid_attachments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = FakeAgent::start(dir.path(), |_| Response::ok());
    let env = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")];
    let stdin = conf(
        "1.1.0",
        &agent.socket,
        json!({"cniVersions": ["1.0.0", "1.1.0"], "cni.dev/valid-attachments": [
            {"containerID": "aaa", "ifname": "eth0"},
            {"containerID": "bbb", "ifname": "net1"}
        ]}),
    );
    exec_plugin(&env, &stdin).expect_silent_success();
    let reqs = agent.requests();
    let [Request::Gc(gc)] = reqs.as_slice() else {
        panic!("{reqs:?}");
    };
    assert_eq!(gc.network, "cozyplane");
    assert_eq!(
        gc.valid_attachments,
        vec![
            ValidAttachment {
                container_id: "aaa".into(),
                ifname: "eth0".into()
            },
            ValidAttachment {
                container_id: "bbb".into(),
                ifname: "net1".into()
            },
        ]
    );
    // an empty list is a real answer ("nothing is valid") and is forwarded
    exec_plugin(
        &env,
        &conf(
            "1.1.0",
            &agent.socket,
            json!({"cni.dev/valid-attachments": []}),
        ),
    )
    .expect_silent_success();
    assert!(
        matches!(agent.requests().last(), Some(Request::Gc(gc)) if gc.valid_attachments.is_empty())
    );
    // no agent → the runtime should retry later
    let missing = dir.path().join("absent.sock");
    exec_plugin(
        &env,
        &conf("1.1.0", &missing, json!({"cni.dev/valid-attachments": []})),
    )
    .expect_error(11);
}

#[test]
fn concurrent_adds_each_get_their_own_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = fake_netns(dir.path(), "ns");
    // the fake agent derives the address from the container id, so a mixed-up
    // response would show as a wrong address
    let agent = FakeAgent::start(dir.path(), |req| match req {
        Request::Add(a) => {
            let n: u8 = a
                .attachment
                .container_id
                .trim_start_matches('c')
                .parse()
                .unwrap_or(0);
            let mut r = AttachmentResult::default();
            r.interfaces.push(Interface {
                name: "eth0".into(),
                ..Default::default()
            });
            r.ips.push(IpConfig {
                address: format!("10.244.0.{n}/32").parse().expect("cidr"),
                gateway: None,
                interface: Some(0),
            });
            Response::Ok { result: Some(r) }
        }
        _ => Response::ok(),
    });
    let stdin = conf("1.0.0", &agent.socket, json!({}));
    let handles: Vec<_> = (1..=20u8)
        .map(|n| {
            let (ns, stdin) = (ns.clone(), stdin.clone());
            std::thread::spawn(move || {
                let id = format!("c{n}");
                let mut env = add_env(&ns);
                env[1] = ("CNI_CONTAINERID", id.as_str());
                env[4] = ("CNI_ARGS", "");
                (n, exec_plugin(&env, &stdin))
            })
        })
        .collect();
    for h in handles {
        let (n, run) = h.join().expect("thread");
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(run.json()["ips"][0]["address"], format!("10.244.0.{n}/32"));
    }
    assert_eq!(agent.requests().len(), 20);
}
