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

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cozyplane_apiserver::tls::{self, KubeconfigUser, TlsMaterial};

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
    // API server, relay, 2 agents, controller, scheduler, endpointslice controller,
    // 2 kubelets, external probe server.
    assert_eq!(procs.len(), 10, "{procs:?}");

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

    // Every component on its own least-privilege identity; tenants cannot write
    // Nodes or FabricIPs; the API server listens on the service address only.
    identities_are_least_privilege(&name, &kubectl, &kubeconfig);

    // A user's VPC: the lab's controller (on its own identity) gives it a VNI.
    apply_example(&kubectl, &kubeconfig, "vpc.yaml");
    let shown = kubectl_until(
        &kubectl,
        &kubeconfig,
        &[
            "get",
            "vpc",
            "blue",
            "-n",
            "default",
            "-o",
            "jsonpath={.status.phase} {.status.vni}",
        ],
        |shown| shown.starts_with("Ready "),
    );
    let vni: u32 = shown
        .strip_prefix("Ready ")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the VPC never became Ready with a VNI: {shown:?}"));
    assert!(vni >= 100, "{shown}");
    let claims = ok(
        "kubectl get vniclaims",
        kubectl_as(&kubectl, &kubeconfig, &["get", "vniclaims"]),
    );
    assert!(
        claims.contains(&format!("vni-{vni} ")) && claims.contains("blue"),
        "{claims}"
    );
    // And two tenants' peering, as docs/tenancy.md tells a user to apply it.
    apply_example(&kubectl, &kubeconfig, "vpc-peering.yaml");
    let both_ready = |shown: &str| {
        shown
            .split_whitespace()
            .filter(|p| p.contains("=Ready/1"))
            .count()
            == 2
    };
    let peerings = kubectl_until(
        &kubectl,
        &kubeconfig,
        &[
            "get",
            "vpcpeerings",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.phase}/{.status.peerVNI} {end}",
        ],
        both_ready,
    );
    assert!(
        both_ready(&peerings),
        "both halves Ready with the peer's VNI: {peerings:?}"
    );

    // Pods in a tenant's VPC, as docs/tenancy.md shows them: both Running,
    // each stamped with its address inside the VPC.
    apply_example(&kubectl, &kubeconfig, "vpc-pods.yaml");
    let in_vpc = |shown: &str| {
        let rows: Vec<&str> = shown.split_whitespace().collect();
        rows.len() == 2
            && rows
                .iter()
                .all(|r| r.contains("=Running/10.20.0.") && !r.ends_with("10.20.0.1"))
    };
    let pods = kubectl_until(
        &kubectl,
        &kubeconfig,
        &[
            "get",
            "pods",
            "-n",
            "tenant-a",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.phase}/{.metadata.annotations.sdn\\.cozystack\\.io/vpc-ip} {end}",
        ],
        in_vpc,
    );
    assert!(
        in_vpc(&pods),
        "both VPC pods Running with a VPC address: {pods:?}"
    );

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

/// `kubectl apply -f examples/<file>`, as a user applies it.
fn apply_example(kubectl: &Path, kubeconfig: &Path, file: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    ok(
        &format!("kubectl apply -f examples/{file}"),
        kubectl_as(
            kubectl,
            kubeconfig,
            &["apply", "-f", &path.display().to_string()],
        ),
    );
}

/// Runs `kubectl <args>` until `done` holds for its stdout or 30 s pass;
/// returns the last stdout.
fn kubectl_until(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let shown = text(&kubectl_as(kubectl, kubeconfig, args).stdout);
        if done(&shown) || std::time::Instant::now() > deadline {
            return shown;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn kubectl_as(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=10s")
        .args(args)
        .output()
        .expect("run kubectl")
}

/// `kubectl auth whoami` as the kubeconfig's identity: (user, groups).
fn whoami(kubectl: &Path, kubeconfig: &Path) -> (String, Vec<String>) {
    let out = ok(
        "kubectl auth whoami",
        kubectl_as(kubectl, kubeconfig, &["auth", "whoami", "-o", "json"]),
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let info = &v["status"]["userInfo"];
    let groups = info["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    (
        info["username"].as_str().unwrap_or_default().to_string(),
        groups,
    )
}

/// The value after `--kubeconfig` on the command line of `pid`.
fn kubeconfig_of(pid: i64) -> PathBuf {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    // `--kubeconfig <path>` or `--kubeconfig=<path>`
    args.iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix("--kubeconfig") {
            Some("") => args.get(i + 1).map(PathBuf::from),
            Some(v) => v.strip_prefix('=').map(PathBuf::from),
            None => None,
        })
        .unwrap_or_else(|| panic!("no --kubeconfig in {args:?}"))
}

/// A copy of the component kubeconfig `kc` that reaches the lab from the host
/// (the components' kubeconfigs name the in-lab service address).
fn from_host(kc: &Path, host_kc: &Path, out: &Path) -> PathBuf {
    let host: serde_json::Value =
        serde_saphyr::from_slice(&std::fs::read(host_kc).expect("read")).expect("kubeconfig");
    let mut v: serde_json::Value =
        serde_saphyr::from_slice(&std::fs::read(kc).expect("read")).expect("kubeconfig");
    v["clusters"][0]["cluster"]["server"] = host["clusters"][0]["cluster"]["server"].clone();
    std::fs::write(out, serde_json::to_vec(&v).expect("json")).expect("write");
    out.to_path_buf()
}

fn forbidden(what: &str, out: Output) {
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("forbidden"),
        "{what} must be forbidden:\nstdout: {}\nstderr: {err}",
        text(&out.stdout)
    );
}

fn identities_are_least_privilege(name: &str, kubectl: &Path, host_kc: &Path) {
    let run = run_dir(name);
    let tmp = tempfile::tempdir().expect("tempdir");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("cluster.json")).expect("cluster.json"))
            .expect("json");
    let mut seen = Vec::new();
    for c in rec["components"].as_array().expect("components") {
        let role = c["role"].as_str().expect("role");
        let place = c["place"].as_str().expect("place");
        let want_user = match role {
            "agent" => format!("cozyplane:agent:{place}"),
            "kubelet" => format!("system:node:{place}"),
            "controller" => "cozyplane:controller".to_string(),
            "scheduler" => "cozyplane:lab:scheduler".to_string(),
            "endpoints" => "cozyplane:lab:endpoints".to_string(),
            _ => continue, // the API server, the relay and the external probe use no kubeconfig
        };
        let kc = kubeconfig_of(c["pid"].as_i64().expect("pid"));
        let mode = std::fs::metadata(&kc).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{} is not owner-only", kc.display());
        let copy = from_host(&kc, host_kc, &tmp.path().join(format!("{role}-{place}")));
        let (user, groups) = whoami(kubectl, &copy);
        assert_eq!(user, want_user, "{role} on {place} ({})", kc.display());
        assert!(
            !groups.iter().any(|g| g == "system:masters"),
            "{role} on {place} is in system:masters: {groups:?}"
        );
        seen.push((role.to_string(), copy));
    }
    assert_eq!(
        seen.len(),
        7,
        "2 agents, 2 kubelets, controller, scheduler, endpoints"
    );
    let conn = run.join("connectivity-kubeconfig");
    let (user, groups) = whoami(kubectl, &conn);
    assert_eq!(user, "cozyplane:lab:connectivity");
    assert!(!groups.iter().any(|g| g == "system:masters"), "{groups:?}");

    // Neither a component nor a tenant may write a Node or a FabricIP.
    let node = format!("{name}-node1");
    let tenant_kc = tmp.path().join("tenant");
    let sa_kc = tmp.path().join("sa");
    let certs = run.join("apiserver/certs");
    let read = |f: &str| std::fs::read_to_string(certs.join(f)).expect("CA file");
    let ca = TlsMaterial {
        ca_pem: read("ca.crt"),
        ca_key_pem: Some(read("ca.key")),
        cert_pem: String::new(),
        key_pem: String::new(),
    };
    let host: serde_json::Value =
        serde_saphyr::from_slice(&std::fs::read(host_kc).expect("read")).expect("kubeconfig");
    let url = host["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("server");
    let cert = tls::issue_client_cert(&ca, "mallory", &["tenants"], 1).expect("cert");
    tls::write_kubeconfig(&tenant_kc, url, &ca.ca_pem, &cert).expect("write");
    // A pod's credential: a ServiceAccount token of the default namespace.
    // (Files and --raw: kubectl's typed `create serviceaccount`/`create token` speak protobuf.)
    let sa = tmp.path().join("sa.json");
    std::fs::write(
        &sa,
        r#"{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "pod-sa", "namespace": "default"}}"#,
    )
    .expect("write");
    ok(
        "create serviceaccount",
        kubectl_as(
            kubectl,
            host_kc,
            &["create", "-f", sa.to_str().expect("utf-8")],
        ),
    );
    let req = tmp.path().join("token-request.json");
    std::fs::write(
        &req,
        r#"{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}"#,
    )
    .expect("write");
    let answer = ok(
        "create token",
        kubectl_as(
            kubectl,
            host_kc,
            &[
                "create",
                "--raw",
                "/api/v1/namespaces/default/serviceaccounts/pod-sa/token",
                "-f",
                req.to_str().expect("utf-8"),
            ],
        ),
    );
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("TokenRequest");
    let token = answer["status"]["token"].as_str().expect("token");
    let user = KubeconfigUser::Token(token.to_string());
    tls::write_kubeconfig(&sa_kc, url, &ca.ca_pem, &user).expect("write");
    let fip = tmp.path().join("fip.json");
    std::fs::write(
        &fip,
        serde_json::json!({"apiVersion": "local.sdn.cozystack.io/v1alpha1", "kind": "FabricIP",
            "metadata": {"name": "f-10-244-99-9"},
            "spec": {"address": "10.244.99.9", "node": node, "podNamespace": "default",
                     "podName": "p", "podUID": "u-1"}})
        .to_string(),
    )
    .expect("write");
    let mut writers: Vec<(String, PathBuf)> = vec![
        ("tenant".into(), tenant_kc),
        ("service account".into(), sa_kc),
    ];
    writers.extend(
        seen.into_iter()
            .filter(|(role, _)| role != "agent")
            .chain([("connectivity".to_string(), conn)]),
    );
    for (who, kc) in &writers {
        forbidden(
            &format!("{who}: patch node status"),
            kubectl_as(
                kubectl,
                kc,
                &[
                    "patch",
                    "node",
                    &node,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    r#"{"status":{"addresses":[{"type":"InternalIP","address":"6.6.6.6"}]}}"#,
                ],
            ),
        );
        forbidden(
            &format!("{who}: create a FabricIP"),
            kubectl_as(kubectl, kc, &["create", "-f", fip.to_str().expect("utf-8")]),
        );
    }
    // The agent claims FabricIPs, but writes no Node either.
    let agent = tmp.path().join(format!("agent-{node}"));
    forbidden(
        "agent: patch node status",
        kubectl_as(
            kubectl,
            &agent,
            &[
                "patch",
                "node",
                &node,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"addresses":[{"type":"InternalIP","address":"6.6.6.6"}]}}"#,
            ],
        ),
    );

    // The API server listens on the service address only (its netns's sockets).
    let api = rec["components"]
        .as_array()
        .expect("components")
        .iter()
        .find(|c| c["role"] == "apiserver")
        .expect("apiserver");
    let tcp = std::fs::read_to_string(format!("/proc/{}/net/tcp", api["pid"])).expect("net/tcp");
    let listening: Vec<&str> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(3) == Some(&"0A") && f[1].ends_with(":192B")).then_some(f[1])
        })
        .collect();
    // 198.18.0.2:6443, little-endian hex.
    assert_eq!(listening, ["020012C6:192B"], "{tcp}");
    assert!(
        !std::fs::read_to_string(format!("/proc/{}/net/tcp6", api["pid"]))
            .unwrap_or_default()
            .contains(":192B 00000000000000000000000000000000:0000 0A"),
        "no IPv6 listener"
    );
}
