//! The probe pods as Kubernetes objects (pure: building only, no API calls).
//!
//! Pods are placed with `spec.nodeName`, so the test works with or without a scheduler
//! (the lab has only a trivial one) and lands exactly on the nodes it means to test.
//! A server pod carries a hash of its own spec in [`SPEC_ANNOTATION`]; a later run reuses
//! a Ready server only when the hash matches, so changing the image, ports or node
//! recreates it instead of silently testing the old one.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, Probe,
    TCPSocketAction, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::matrix::{
    HOST_ECHO_PORT, HOST_HTTP_PORT, POD_ECHO_PORT, POD_HTTP_PORT, STREAM_PORT, STREAM_READY_PORT,
};

/// Label on every probe pod (used by `--cleanup`).
pub const APP_LABEL: &str = "app.kubernetes.io/name";
/// Its value.
pub const APP_VALUE: &str = "cozyplane-connectivity";
/// Label naming the pod's role.
pub const ROLE_LABEL: &str = "cozyplane.io/probe";
/// Annotation holding the spec hash of a server pod.
pub const SPEC_ANNOTATION: &str = "cozyplane.io/probe-spec";
/// The only container's name.
pub const CONTAINER: &str = "probe";

/// A server pod to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPod {
    /// `echo-a`, `echo-b`, `host-echo-a`, `host-echo-b`.
    pub name: &'static str,
    /// The node it runs on.
    pub node: String,
    /// hostNetwork server (ports 4250/4251) or pod network (8000/8080).
    pub host_network: bool,
    /// The VPC to attach to (`sdn.cozystack.io/vpc` annotation), for the tenancy group.
    pub vpc: Option<String>,
    /// What it answers with (`--name`) instead of its pod name: the tenancy servers answer
    /// `t1/echo-a`, so twin VPCs' same-named pods are told apart.
    pub answer: Option<String>,
    /// Also serve the stream protocol on [`STREAM_PORT`] (the tenancy servers, for the
    /// rows about cutting a live stream).
    pub stream: bool,
}

/// The servers of a run: `echo-a`/`host-echo-a` on node A, `echo-b`/`host-echo-b` on B.
pub fn servers(node_a: &str, node_b: Option<&str>) -> Vec<ServerPod> {
    let mut out = Vec::new();
    let on = |out: &mut Vec<ServerPod>, names: [&'static str; 2], node: &str| {
        for (name, host_network) in names.into_iter().zip([false, true]) {
            out.push(ServerPod {
                name,
                node: node.to_string(),
                host_network,
                vpc: None,
                answer: None,
                stream: false,
            });
        }
    };
    on(&mut out, ["echo-a", "host-echo-a"], node_a);
    if let Some(b) = node_b {
        on(&mut out, ["echo-b", "host-echo-b"], b);
    }
    out
}

/// The label selector matching every probe pod.
pub fn selector() -> String {
    format!("{APP_LABEL}={APP_VALUE}")
}

fn labels(role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_LABEL.to_string(), APP_VALUE.to_string()),
        (ROLE_LABEL.to_string(), role.to_string()),
    ])
}

/// A NodePort Service named `name` over the echo server pod `pod` (its role label),
/// with the pod's TCP and UDP echo ports and its HTTP port, and `externalTrafficPolicy`
/// `etp` (`Local` or `Cluster`).
pub fn echo_service(name: &str, pod: &str, etp: &str) -> k8s_openapi::api::core::v1::Service {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    let port = |pname: &str, proto: &str, n: u16| ServicePort {
        name: Some(pname.into()),
        protocol: Some(proto.into()),
        port: i32::from(n),
        target_port: Some(IntOrString::Int(i32::from(n))),
        ..Default::default()
    };
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                APP_LABEL.to_string(),
                APP_VALUE.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("NodePort".into()),
            external_traffic_policy: Some(etp.into()),
            selector: Some(labels(pod)),
            ports: Some(vec![
                port("tcp", "TCP", crate::matrix::POD_ECHO_PORT),
                port("udp", "UDP", crate::matrix::POD_ECHO_PORT),
                port("http", "TCP", crate::matrix::POD_HTTP_PORT),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `POD_NAME` from the downward API, so the server answers with its own name.
fn pod_name_env() -> EnvVar {
    EnvVar {
        name: "POD_NAME".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn base_spec(node: &str, host_network: bool, restart: &str, container: Container) -> PodSpec {
    PodSpec {
        node_name: Some(node.to_string()),
        host_network: host_network.then_some(true),
        restart_policy: Some(restart.into()),
        termination_grace_period_seconds: Some(2),
        // Placed by nodeName on nodes the user picked: do not get evicted by their taints.
        tolerations: Some(vec![Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }]),
        containers: vec![container],
        ..Default::default()
    }
}

/// The pod for one server.
pub fn server_pod(s: &ServerPod, image: &str) -> Pod {
    let (tcp, http) = if s.host_network {
        (HOST_ECHO_PORT, HOST_HTTP_PORT)
    } else {
        (POD_ECHO_PORT, POD_HTTP_PORT)
    };
    let port = |name: &str, p: u16, proto: &str| ContainerPort {
        name: Some(name.into()),
        container_port: i32::from(p),
        protocol: Some(proto.into()),
        ..Default::default()
    };
    let mut command = [
        "cozyplane".to_string(),
        "probe".into(),
        "server".into(),
        "--tcp-port".into(),
        tcp.to_string(),
        "--udp-port".into(),
        tcp.to_string(),
        "--http-port".into(),
        http.to_string(),
    ]
    .to_vec();
    if let Some(a) = &s.answer {
        command.extend(["--name".to_string(), a.clone()]);
    }
    let mut ports = vec![
        port("tcp", tcp, "TCP"),
        port("udp", tcp, "UDP"),
        port("http", http, "TCP"),
    ];
    if s.stream {
        command.extend(["--stream-port".to_string(), STREAM_PORT.to_string()]);
        ports.push(port("stream", STREAM_PORT, "TCP"));
    }
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        command: Some(command),
        env: Some(vec![pod_name_env()]),
        ports: Some(ports),
        // Not on a VPC server: the kubelet probes status.podIP, the pod's fabric address,
        // which reaches a VPC pod only through the dual-address bridge (issue #10, not
        // built yet); the tenancy rows retry for their timeout instead.
        readiness_probe: s.vpc.is_none().then(|| Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(tcp)),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    let spec = base_spec(&s.node, s.host_network, "Always", container);
    // The VPC annotation is part of what we asked for (a pod-network server is hashed
    // exactly as before, so existing servers stay reusable).
    let role = match &s.vpc {
        Some(v) => format!("{}\0{v}", s.name),
        None => s.name.to_string(),
    };
    let hash = spec_hash(&spec, &role);
    let mut annotations = BTreeMap::from([(SPEC_ANNOTATION.to_string(), hash)]);
    if let Some(v) = &s.vpc {
        annotations.insert(cozyplane_api::labels::ANNOTATION_VPC.into(), v.clone());
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(s.name.into()),
            labels: Some(labels(s.name)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    }
}

/// A one-shot client pod running `plan_json`; its report comes back as the termination
/// message (with the logs as fallback on a real kubelet if the file is empty).
pub fn client_pod(name: &str, node: &str, host_network: bool, image: &str, plan_json: &str) -> Pod {
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        command: Some(
            ["cozyplane", "probe", "client", "--plan", plan_json]
                .map(String::from)
                .to_vec(),
        ),
        env: Some(vec![pod_name_env()]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(name)),
            ..Default::default()
        },
        spec: Some(base_spec(node, host_network, "Never", container)),
        ..Default::default()
    }
}

/// A stream client pod (`cozyplane probe stream --spec JSON`, never restarted) in
/// `vpc`: Ready once its stream is up (a TCP readiness probe on [`STREAM_READY_PORT`]),
/// its report in the termination message when it ends.
pub fn stream_pod(name: &str, node: &str, vpc: &str, image: &str, spec_json: &str) -> Pod {
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        command: Some(
            ["cozyplane", "probe", "stream", "--spec", spec_json]
                .map(String::from)
                .to_vec(),
        ),
        env: Some(vec![pod_name_env()]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(STREAM_READY_PORT)),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels(name)),
            annotations: Some(BTreeMap::from([(
                cozyplane_api::labels::ANNOTATION_VPC.to_string(),
                vpc.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(base_spec(node, false, "Never", container)),
        ..Default::default()
    }
}

/// A stable hash of what we asked for (FNV-1a 64 over the spec's JSON and the role):
/// not a security boundary, only "is this the pod this version of the test would make".
fn spec_hash(spec: &PodSpec, role: &str) -> String {
    let json = serde_json::to_string(spec).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in role.bytes().chain([0]).chain(json.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Whether an existing pod was made from the same spec as `wanted`.
pub fn same_spec(existing: &Pod, wanted: &Pod) -> bool {
    let ann = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SPEC_ANNOTATION).cloned())
    };
    ann(wanted).is_some() && ann(existing) == ann(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo(host_network: bool, node: &str) -> ServerPod {
        ServerPod {
            name: if host_network {
                "host-echo-a"
            } else {
                "echo-a"
            },
            node: node.into(),
            host_network,
            vpc: None,
            answer: None,
            stream: false,
        }
    }

    #[test]
    fn server_pod_follows_the_contract() {
        let p = server_pod(&echo(false, "lab-node1"), "img:1");
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("lab-node1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.host_network, None);
        let c = &spec.containers[0];
        assert_eq!(
            c.command.as_deref().expect("command"),
            [
                "cozyplane",
                "probe",
                "server",
                "--tcp-port",
                "8000",
                "--udp-port",
                "8000",
                "--http-port",
                "8080"
            ]
        );
        let env = &c.env.as_ref().expect("env")[0];
        assert_eq!(env.name, "POD_NAME");
        assert_eq!(
            env.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            Some("metadata.name")
        );
        let probe = c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.tcp_socket.as_ref())
            .expect("tcp probe");
        assert_eq!(probe.port, IntOrString::Int(8000));
        let labels = p.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels.get(APP_LABEL).map(String::as_str), Some(APP_VALUE));
        assert_eq!(labels.get(ROLE_LABEL).map(String::as_str), Some("echo-a"));

        let h = server_pod(&echo(true, "lab-node1"), "img:1");
        let hspec = h.spec.as_ref().expect("spec");
        assert_eq!(hspec.host_network, Some(true));
        let hc = &hspec.containers[0];
        assert!(hc
            .command
            .as_deref()
            .expect("cmd")
            .windows(2)
            .any(|w| w == ["--tcp-port", "4250"]));
        assert!(hc
            .command
            .as_deref()
            .expect("cmd")
            .windows(2)
            .any(|w| w == ["--http-port", "4251"]));
    }

    #[test]
    fn servers_per_node() {
        let two = servers("n1", Some("n2"));
        let got: Vec<(&str, &str, bool)> = two
            .iter()
            .map(|s| (s.name, s.node.as_str(), s.host_network))
            .collect();
        assert_eq!(
            got,
            [
                ("echo-a", "n1", false),
                ("host-echo-a", "n1", true),
                ("echo-b", "n2", false),
                ("host-echo-b", "n2", true)
            ]
        );
        assert_eq!(servers("n1", None).len(), 2);
    }

    #[test]
    fn spec_hash_changes_with_image_node_and_role() {
        let base = server_pod(&echo(false, "n1"), "img:1");
        assert!(same_spec(&base, &server_pod(&echo(false, "n1"), "img:1")));
        assert!(!same_spec(&base, &server_pod(&echo(false, "n1"), "img:2")));
        assert!(!same_spec(&base, &server_pod(&echo(false, "n2"), "img:1")));
        let mut b = echo(false, "n1");
        b.name = "echo-b";
        assert!(!same_spec(&base, &server_pod(&b, "img:1")));
        // A pod without the annotation (made by hand, or by an older version) is never reused.
        let mut bare = base.clone();
        bare.metadata.annotations = None;
        assert!(!same_spec(&bare, &base));
    }

    #[test]
    fn client_pod_runs_the_plan_once() {
        let p = client_pod("host-client", "n2", true, "img:1", r#"{"checks":[]}"#);
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(spec.node_name.as_deref(), Some("n2"));
        assert_eq!(
            spec.containers[0].command.as_deref().expect("cmd"),
            ["cozyplane", "probe", "client", "--plan", r#"{"checks":[]}"#]
        );
        assert_eq!(selector(), "app.kubernetes.io/name=cozyplane-connectivity");
    }

    #[test]
    fn stream_pod_is_ready_only_once_it_streams() {
        let p = stream_pod(
            "stream-client",
            "n1",
            "ns-t1/net",
            "img:1",
            r#"{"target":"x"}"#,
        );
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.host_network, None);
        let c = &spec.containers[0];
        assert_eq!(
            c.command.as_deref().expect("cmd"),
            [
                "cozyplane",
                "probe",
                "stream",
                "--spec",
                r#"{"target":"x"}"#
            ]
        );
        assert_eq!(
            c.readiness_probe
                .as_ref()
                .and_then(|p| p.tcp_socket.as_ref())
                .map(|t| &t.port),
            Some(&IntOrString::Int(8002))
        );
        assert_eq!(
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(cozyplane_api::labels::ANNOTATION_VPC))
                .map(String::as_str),
            Some("ns-t1/net")
        );
        // Default-network servers do not change (their spec hash stays reusable).
        let plain = server_pod(&echo(false, "n1"), "img:1");
        assert!(!plain.spec.expect("spec").containers[0]
            .command
            .as_deref()
            .expect("cmd")
            .contains(&"--stream-port".to_string()));
    }
}
