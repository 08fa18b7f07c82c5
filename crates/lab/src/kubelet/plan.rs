//! Pod spec → workload plan: what the kubelet will run for a pod, decided
//! without touching anything (pure, so every rule here is unit-tested).
//!
//! The lab runs no container images. The workload of a pod is its first
//! container, interpreted as the issue-4 contract says:
//! - `command[0]` whose basename is `cozyplane` runs the lab's own `cozyplane`
//!   binary with `command[1..] ++ args` (the connectivity test's probes);
//! - anything else runs the built-in server, `cozyplane probe server`, so any
//!   pod answers TCP, UDP and HTTP with its own name.
//!
//! The kubelet runs workloads as root on the node, so it runs the probe and
//! nothing else: a `cozyplane` command must be `probe server` with its
//! listening flags, `probe client --plan JSON` or `probe stream --spec JSON`
//! ([`probe_args`]; not
//! `--plan-file`, which would read a file of the node), and the environment is
//! limited to the downward-API names in [`ALLOWED_ENV`] (the probe reads only
//! `POD_NAME`), so no pod sets `LD_PRELOAD`, `GLIBC_TUNABLES`, `PATH` or the
//! kubelet's own `COZYPLANE_TERMINATION_LOG`. Anything else is refused with
//! `CreateContainerConfigError` before anything is made.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Why a pod cannot be run. Reported in the pod's status
/// (`CreateContainerConfigError`) and the kubelet log; the pod stays Pending.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The pod has no metadata.uid / name / namespace (never from a real API server).
    #[error("the pod has no {0}")]
    Missing(&'static str),
    /// The pod has no containers.
    #[error("the pod has no containers")]
    NoContainers,
    /// An env var whose value source the lab does not support.
    #[error("env {name}: {detail}")]
    Env {
        /// The variable.
        name: String,
        /// What is unsupported.
        detail: String,
    },
    /// A readiness probe the lab cannot run.
    #[error("readinessProbe: {0}")]
    Probe(String),
    /// A `cozyplane` command other than the probe workload.
    #[error(
        "command {command:?}: {detail}; the lab runs only the probe workload: `cozyplane probe \
         server` (--name, --tcp-port, --udp-port, --http-port, --stream-port, --extra-port, \
         --sctp-port, --bind), `cozyplane probe client --plan JSON` or `cozyplane probe stream --spec JSON`"
    )]
    Command {
        /// The command and args as given.
        command: Vec<String>,
        /// What is not allowed.
        detail: String,
    },
}

/// The environment variables a pod may set: the names the downward API
/// conventionally fills (the probe reads `POD_NAME`; the rest are accepted
/// for manifests written for a real cluster). Nothing that the dynamic
/// loader, libc or the Rust runtime reads.
pub const ALLOWED_ENV: &[&str] = &[
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_UID",
    "POD_IP",
    "HOST_IP",
    "NODE_NAME",
    "NODE_IP",
    "SERVICE_ACCOUNT",
];

/// What the workload process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// The built-in server (`cozyplane probe server`).
    BuiltinServer,
    /// The lab's `cozyplane` binary with these arguments.
    Cozyplane(Vec<String>),
}

impl Program {
    /// The arguments after the `cozyplane` binary.
    pub fn args(&self) -> Vec<String> {
        match self {
            Program::BuiltinServer => vec!["probe".into(), "server".into()],
            Program::Cozyplane(a) => a.clone(),
        }
    }
}

/// The value of one environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// Known now.
    Literal(String),
    /// `status.podIP`: known once the network is up.
    PodIp,
    /// `status.hostIP`: the node's address.
    HostIp,
}

/// How the kubelet decides the pod is Ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Ready once the workload started.
    Started,
    /// A TCP connect to podIP:port succeeds.
    Tcp(u16),
    /// `GET path` on podIP:port answers 200–399.
    Http {
        /// The port.
        port: u16,
        /// The path.
        path: String,
    },
}

/// `spec.restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart on every exit (the default).
    Always,
    /// Restart on a non-zero exit.
    OnFailure,
    /// Never restart.
    Never,
}

/// What happens after the workload exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// Start it again (after a backoff).
    Restart,
    /// The pod is done: `Succeeded` (true) or `Failed` (false).
    Terminal {
        /// Exit code 0.
        succeeded: bool,
    },
}

impl RestartPolicy {
    /// Kubernetes' rule for restartPolicy and the exit code.
    pub fn after_exit(self, exit_code: i32) -> AfterExit {
        match (self, exit_code) {
            (RestartPolicy::Always, _) => AfterExit::Restart,
            (RestartPolicy::OnFailure, 0) => AfterExit::Terminal { succeeded: true },
            (RestartPolicy::OnFailure, _) => AfterExit::Restart,
            (RestartPolicy::Never, code) => AfterExit::Terminal {
                succeeded: code == 0,
            },
        }
    }
}

/// Delay before restart number `restarts + 1`: 1 s doubling up to 10 s
/// (Kubernetes goes to 5 min; a lab wants to see a fixed pod soon).
pub fn restart_backoff(restarts: u32) -> Duration {
    Duration::from_secs(1u64 << restarts.min(4)).min(Duration::from_secs(10))
}

/// Everything the kubelet needs to run one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPlan {
    /// metadata.uid.
    pub uid: String,
    /// metadata.namespace.
    pub namespace: String,
    /// metadata.name.
    pub name: String,
    /// The first container's name.
    pub container: String,
    /// Its image (reported, never pulled).
    pub image: String,
    /// What runs.
    pub program: Program,
    /// Its environment, in order (later entries win, as in Kubernetes).
    pub env: Vec<(String, EnvValue)>,
    /// `spec.hostNetwork`.
    pub host_network: bool,
    /// The pod's named netns (`None` for hostNetwork pods).
    pub netns: Option<String>,
    /// The CNI container id (stable for the pod: a retried ADD after a crash is the same attachment).
    pub container_id: String,
    /// Readiness.
    pub readiness: Readiness,
    /// Restart policy.
    pub restart: RestartPolicy,
}

/// The pod's netns name: `<node>-p<first 8 hex digits of the uid>`. It
/// carries the lab prefix (the node name starts with `<lab>-`), so lab
/// teardown finds it, and the 8 hex digits keep it unique among a node's pods.
pub fn netns_name(node: &str, uid: &str) -> String {
    let hex: String = uid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .take(8)
        .collect();
    format!("{node}-p{hex}")
}

/// The CNI container id of a pod: its uid without dashes (CNI allows
/// `[a-zA-Z0-9][a-zA-Z0-9_.-]*`; a uid is hex and dashes, so anything else is dropped).
pub fn container_id(uid: &str) -> String {
    uid.chars().filter(char::is_ascii_alphanumeric).collect()
}

/// Plans the pod `pod` bound to node `node`.
pub fn plan(pod: &Pod, node: &str) -> Result<WorkloadPlan, PlanError> {
    let meta = &pod.metadata;
    let uid = meta.uid.clone().ok_or(PlanError::Missing("metadata.uid"))?;
    let name = meta
        .name
        .clone()
        .ok_or(PlanError::Missing("metadata.name"))?;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let spec = pod.spec.as_ref().ok_or(PlanError::Missing("spec"))?;
    let c = spec.containers.first().ok_or(PlanError::NoContainers)?;
    let host_network = spec.host_network.unwrap_or(false);
    let restart = match spec.restart_policy.as_deref() {
        Some("Never") => RestartPolicy::Never,
        Some("OnFailure") => RestartPolicy::OnFailure,
        _ => RestartPolicy::Always,
    };
    let mut fields = BTreeMap::new();
    fields.insert("metadata.name", name.clone());
    fields.insert("metadata.namespace", namespace.clone());
    fields.insert("metadata.uid", uid.clone());
    fields.insert("spec.nodeName", node.to_string());
    fields.insert(
        "spec.serviceAccountName",
        spec.service_account_name
            .clone()
            .unwrap_or_else(|| "default".into()),
    );
    Ok(WorkloadPlan {
        program: program(c)?,
        env: env(c, &fields, &name, &namespace)?,
        readiness: readiness(c)?,
        netns: (!host_network).then(|| netns_name(node, &uid)),
        container_id: container_id(&uid),
        container: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        host_network,
        restart,
        uid,
        namespace,
        name,
    })
}

fn program(c: &Container) -> Result<Program, PlanError> {
    let command = c.command.clone().unwrap_or_default();
    let is_cozyplane = command
        .first()
        .and_then(|c0| c0.rsplit('/').next())
        .is_some_and(|base| base == "cozyplane");
    if is_cozyplane {
        let mut args: Vec<String> = command[1..].to_vec();
        args.extend(c.args.clone().unwrap_or_default());
        probe_args(&args).map_err(|detail| PlanError::Command {
            command: command.iter().take(1).chain(&args).cloned().collect(),
            detail,
        })?;
        Ok(Program::Cozyplane(args))
    } else {
        Ok(Program::BuiltinServer)
    }
}

/// Checks that `args` (after `cozyplane`) run the probe workload and nothing
/// else: `probe server` with only its listening flags (valid values),
/// `probe client --plan JSON` or `probe stream --spec JSON`. Flags as `--flag value` or `--flag=value`.
pub fn probe_args(args: &[String]) -> Result<(), String> {
    let (allowed, rest): (&[&str], &[String]) = match args {
        [p, s, rest @ ..] if p == "probe" && s == "server" => (
            &[
                "--name",
                "--tcp-port",
                "--udp-port",
                "--http-port",
                "--stream-port",
                "--extra-port",
                "--sctp-port",
                "--bind",
            ],
            rest,
        ),
        [p, c, rest @ ..] if p == "probe" && c == "client" => (&["--plan"], rest),
        [p, c, rest @ ..] if p == "probe" && c == "stream" => (&["--spec"], rest),
        _ => return Err("not `probe server`, `probe client` or `probe stream`".into()),
    };
    let mut seen = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, v.to_string()),
            _ => (
                a.as_str(),
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{a} without a value"))?,
            ),
        };
        if !allowed.contains(&flag) {
            return Err(format!("argument {flag:?} is not allowed"));
        }
        // the one flag a server takes more than once (a port each)
        if seen.contains(&flag) && flag != "--sctp-port" {
            return Err(format!("{flag} given twice"));
        }
        seen.push(flag);
        let valid = match flag {
            "--tcp-port" | "--udp-port" | "--http-port" | "--stream-port" | "--extra-port"
            | "--sctp-port" => value.parse::<u16>().is_ok_and(|p| p > 0),
            "--bind" => value.parse::<IpAddr>().is_ok(),
            _ => !value.starts_with('-'),
        };
        if !valid {
            return Err(format!("{flag} {value:?} is not a valid value"));
        }
    }
    if allowed == ["--plan"] && seen.is_empty() {
        return Err("probe client needs --plan".into());
    }
    if allowed == ["--spec"] && seen.is_empty() {
        return Err("probe stream needs --spec".into());
    }
    Ok(())
}

fn env(
    c: &Container,
    fields: &BTreeMap<&str, String>,
    name: &str,
    namespace: &str,
) -> Result<Vec<(String, EnvValue)>, PlanError> {
    let mut out = Vec::new();
    for e in c.env.iter().flatten() {
        if !ALLOWED_ENV.contains(&e.name.as_str()) {
            return Err(PlanError::Env {
                name: e.name.clone(),
                detail: format!(
                    "the lab kubelet passes only {} (it runs the probe workload, nothing else)",
                    ALLOWED_ENV.join(", ")
                ),
            });
        }
        let value = match (&e.value, &e.value_from) {
            (_, Some(from)) => {
                let Some(path) = from.field_ref.as_ref().map(|f| f.field_path.as_str()) else {
                    return Err(PlanError::Env {
                        name: e.name.clone(),
                        detail: "only value and valueFrom.fieldRef are supported in the lab".into(),
                    });
                };
                match path {
                    "status.podIP" => EnvValue::PodIp,
                    "status.hostIP" => EnvValue::HostIp,
                    p => {
                        EnvValue::Literal(fields.get(p).cloned().ok_or_else(|| PlanError::Env {
                            name: e.name.clone(),
                            detail: format!("fieldRef {p:?} is not supported in the lab"),
                        })?)
                    }
                }
            }
            (v, None) => EnvValue::Literal(v.clone().unwrap_or_default()),
        };
        out.push((e.name.clone(), value));
    }
    for (k, v) in [("POD_NAME", name), ("POD_NAMESPACE", namespace)] {
        if !out.iter().any(|(n, _)| n == k) {
            out.push((k.to_string(), EnvValue::Literal(v.to_string())));
        }
    }
    Ok(out)
}

/// An integer port, or a named one looked up in the container's ports.
fn port(c: &Container, p: &IntOrString) -> Result<u16, PlanError> {
    let n = match p {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => match s.parse::<i32>() {
            Ok(n) => n,
            Err(_) => c
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(s.as_str()))
                .map(|cp| cp.container_port)
                .ok_or_else(|| PlanError::Probe(format!("no container port named {s:?}")))?,
        },
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| PlanError::Probe(format!("port {n} out of range")))
}

fn readiness(c: &Container) -> Result<Readiness, PlanError> {
    let Some(probe) = &c.readiness_probe else {
        return Ok(Readiness::Started);
    };
    if let Some(t) = &probe.tcp_socket {
        return Ok(Readiness::Tcp(port(c, &t.port)?));
    }
    if let Some(h) = &probe.http_get {
        return Ok(Readiness::Http {
            port: port(c, &h.port)?,
            path: h.path.clone().unwrap_or_else(|| "/".into()),
        });
    }
    Err(PlanError::Probe(
        "only tcpSocket and httpGet are supported in the lab".into(),
    ))
}

impl WorkloadPlan {
    /// The environment with the IPs filled in, plus the termination-log path
    /// (`COZYPLANE_TERMINATION_LOG`, which the probe client writes its report to).
    pub fn resolved_env(
        &self,
        pod_ip: Option<IpAddr>,
        host_ip: IpAddr,
        termination_log: &str,
    ) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .env
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    EnvValue::Literal(s) => s.clone(),
                    EnvValue::PodIp => pod_ip.map(|ip| ip.to_string()).unwrap_or_default(),
                    EnvValue::HostIp => host_ip.to_string(),
                };
                (k.clone(), v)
            })
            .collect();
        out.push((
            "COZYPLANE_TERMINATION_LOG".into(),
            termination_log.to_string(),
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    fn base(container: serde_json::Value) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "echo-a", "namespace": "ns1",
                         "uid": "3F2504E0-4F89-11D3-9A0C-0305E82C3301"},
            "spec": {"nodeName": "lab-node1", "containers": [container]},
        }))
    }

    #[test]
    fn cozyplane_commands_run_the_lab_binary_and_others_the_builtin_server() {
        let p = plan(
            &base(serde_json::json!({"name": "c", "image": "img:1",
                "command": ["/usr/bin/cozyplane", "probe"], "args": ["client", "--plan", "{}"]})),
            "lab-node1",
        )
        .expect("plan");
        assert_eq!(
            p.program,
            Program::Cozyplane(vec![
                "probe".into(),
                "client".into(),
                "--plan".into(),
                "{}".into()
            ])
        );
        assert_eq!(p.image, "img:1");
        for other in [
            serde_json::json!({"name": "c", "command": ["nginx"]}),
            serde_json::json!({"name": "c", "command": ["cozyplane-x"]}),
            serde_json::json!({"name": "c"}),
        ] {
            let p = plan(&base(other), "n").expect("plan");
            assert_eq!(p.program, Program::BuiltinServer);
            assert_eq!(p.program.args(), ["probe", "server"]);
        }
    }

    #[test]
    fn names_are_derived_from_the_uid() {
        let p = plan(&base(serde_json::json!({"name": "c"})), "lab-node1").expect("plan");
        assert_eq!(p.netns.as_deref(), Some("lab-node1-p3f2504e0"));
        assert_eq!(p.container_id, "3F2504E04F8911D39A0C0305E82C3301");
        assert_eq!(p.restart, RestartPolicy::Always);
        assert_eq!(p.readiness, Readiness::Started);
        assert!(!p.host_network);
    }

    #[test]
    fn host_network_pods_have_no_netns() {
        let mut p = base(serde_json::json!({"name": "c"}));
        if let Some(s) = p.spec.as_mut() {
            s.host_network = Some(true);
            s.restart_policy = Some("Never".into());
        }
        let w = plan(&p, "lab-node2").expect("plan");
        assert!(w.host_network && w.netns.is_none());
        assert_eq!(w.restart, RestartPolicy::Never);
    }

    #[test]
    fn env_resolves_field_refs_and_adds_pod_name_unless_set() {
        let p = plan(
            &base(serde_json::json!({"name": "c", "env": [
                {"name": "NODE_IP", "value": "1"},
                {"name": "POD_NAME", "value": "custom"},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "SERVICE_ACCOUNT", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            ]})),
            "lab-node1",
        )
        .expect("plan");
        let env = p.resolved_env(
            Some("10.244.1.2".parse().expect("ip")),
            "198.18.0.11".parse().expect("ip"),
            "/x/termination-log",
        );
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or("<unset>")
        };
        assert_eq!(get("NODE_IP"), "1");
        assert_eq!(get("POD_NAME"), "custom");
        assert_eq!(get("POD_NAMESPACE"), "ns1");
        assert_eq!(get("POD_IP"), "10.244.1.2");
        assert_eq!(get("HOST_IP"), "198.18.0.11");
        assert_eq!(get("NODE_NAME"), "lab-node1");
        assert_eq!(get("POD_UID"), "3F2504E0-4F89-11D3-9A0C-0305E82C3301");
        assert_eq!(get("SERVICE_ACCOUNT"), "default");
        assert_eq!(get("COZYPLANE_TERMINATION_LOG"), "/x/termination-log");
        assert_eq!(env.iter().filter(|(n, _)| n == "POD_NAME").count(), 1);
    }

    #[test]
    fn unsupported_env_sources_are_clear_errors() {
        let err = plan(
            &base(serde_json::json!({"name": "c", "env": [
                {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})),
            "n",
        )
        .expect_err("secret refs are unsupported");
        assert!(err.to_string().contains("env S"), "{err}");
        let err = plan(
            &base(serde_json::json!({"name": "c", "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x']"}}}]})),
            "n",
        )
        .expect_err("labels are unsupported");
        assert!(err.to_string().contains("not supported"), "{err}");
    }

    #[test]
    fn only_the_probe_workload_runs() {
        let refused = |command: serde_json::Value, args: serde_json::Value| {
            let c = serde_json::json!({"name": "c", "command": command, "args": args});
            match plan(&base(c), "n") {
                Err(PlanError::Command { detail, .. }) => detail,
                other => panic!("{command} {args}: want a refusal, got {other:?}"),
            }
        };
        for (command, args) in [
            // Another subcommand: the agent as root, the API server, the lab itself.
            (
                serde_json::json!(["cozyplane", "agent", "--node-name", "x"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["/usr/bin/cozyplane"]),
                serde_json::json!(["apiserver", "--standalone"]),
            ),
            (
                serde_json::json!(["cozyplane", "lab", "down"]),
                serde_json::json!([]),
            ),
            (serde_json::json!(["cozyplane"]), serde_json::json!([])),
            (
                serde_json::json!(["cozyplane", "probe"]),
                serde_json::json!([]),
            ),
            // The probe, with a flag it does not take here or a bad value.
            (
                serde_json::json!(["cozyplane", "probe", "client"]),
                serde_json::json!(["--plan-file", "/etc/shadow"]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "client"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--tcp-port", "0"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--bind=nowhere"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--name"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--name", "a", "--name", "b"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "extra"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--help"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--stream-port", "0"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--sctp-port", "sctp"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "stream"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "stream", "--plan", "{}"]),
                serde_json::json!([]),
            ),
        ] {
            let detail = refused(command.clone(), args.clone());
            assert!(!detail.is_empty(), "{command} {args}");
        }
        let err = plan(
            &base(serde_json::json!({"name": "c", "command": ["cozyplane", "agent"]})),
            "n",
        )
        .expect_err("refused");
        assert!(err.to_string().contains("only the probe workload"), "{err}");

        for (command, args) in [
            (
                serde_json::json!(["cozyplane", "probe", "server"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!([
                    "cozyplane",
                    "probe",
                    "server",
                    "--tcp-port",
                    "4250",
                    "--udp-port",
                    "4250"
                ]),
                serde_json::json!(["--http-port=4251", "--name", "x", "--bind", "::"]),
            ),
            // the one repeatable flag
            (
                serde_json::json!(["cozyplane", "probe", "server", "--sctp-port", "80"]),
                serde_json::json!(["--sctp-port=81"]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "client", "--plan", "{\"checks\": []}"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe"]),
                serde_json::json!(["client", "--plan={}"]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "server", "--stream-port", "8001"]),
                serde_json::json!([]),
            ),
            (
                serde_json::json!(["cozyplane", "probe", "stream", "--spec", "{}"]),
                serde_json::json!([]),
            ),
        ] {
            let c = serde_json::json!({"name": "c", "command": command, "args": args});
            assert!(
                matches!(
                    plan(&base(c), "n"),
                    Ok(WorkloadPlan {
                        program: Program::Cozyplane(_),
                        ..
                    })
                ),
                "{command} {args} must run"
            );
        }
    }

    #[test]
    fn environment_outside_the_allowlist_is_refused() {
        for name in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "GLIBC_TUNABLES",
            "MALLOC_CONF",
            "PATH",
            "RUST_LOG",
            "COZYPLANE_TERMINATION_LOG",
            "A",
        ] {
            let c = serde_json::json!({"name": "c", "command": ["cozyplane", "probe", "server"],
                "env": [{"name": name, "value": "/tmp/evil.so"}]});
            match plan(&base(c), "n") {
                Err(PlanError::Env { name: n, detail }) => {
                    assert_eq!(n, name);
                    assert!(detail.contains("POD_NAME"), "{detail}");
                }
                other => panic!("{name}: want a refusal, got {other:?}"),
            }
        }
        // Also for pods that run the built-in server.
        let c = serde_json::json!({"name": "c", "env": [{"name": "LD_PRELOAD", "value": "x"}]});
        assert!(matches!(plan(&base(c), "n"), Err(PlanError::Env { .. })));
    }

    #[test]
    fn readiness_probes_resolve_ports() {
        let c = serde_json::json!({"name": "c",
            "ports": [{"name": "http", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"port": "http", "path": "/ok"}}});
        assert_eq!(
            plan(&base(c), "n").expect("plan").readiness,
            Readiness::Http {
                port: 8080,
                path: "/ok".into()
            }
        );
        let c = serde_json::json!({"name": "c", "readinessProbe": {"tcpSocket": {"port": 8000}}});
        assert_eq!(
            plan(&base(c), "n").expect("plan").readiness,
            Readiness::Tcp(8000)
        );
        let c = serde_json::json!({"name": "c", "readinessProbe": {"tcpSocket": {"port": 70000}}});
        assert!(plan(&base(c), "n").is_err());
        let c = serde_json::json!({"name": "c", "readinessProbe": {"exec": {"command": ["true"]}}});
        assert!(matches!(plan(&base(c), "n"), Err(PlanError::Probe(_))));
    }

    #[test]
    fn restart_rules_and_backoff() {
        use AfterExit::*;
        assert_eq!(RestartPolicy::Always.after_exit(0), Restart);
        assert_eq!(
            RestartPolicy::OnFailure.after_exit(0),
            Terminal { succeeded: true }
        );
        assert_eq!(RestartPolicy::OnFailure.after_exit(2), Restart);
        assert_eq!(
            RestartPolicy::Never.after_exit(1),
            Terminal { succeeded: false }
        );
        assert_eq!(restart_backoff(0), Duration::from_secs(1));
        assert_eq!(restart_backoff(2), Duration::from_secs(4));
        assert_eq!(restart_backoff(40), Duration::from_secs(10));
    }

    #[test]
    fn a_pod_without_containers_or_uid_is_refused() {
        let p = pod(serde_json::json!({"metadata": {"name": "x", "uid": "u"},
            "spec": {"containers": []}}));
        assert_eq!(plan(&p, "n"), Err(PlanError::NoContainers));
        let p = pod(serde_json::json!({"metadata": {"name": "x"},
            "spec": {"containers": [{"name": "c"}]}}));
        assert_eq!(plan(&p, "n"), Err(PlanError::Missing("metadata.uid")));
    }
}
