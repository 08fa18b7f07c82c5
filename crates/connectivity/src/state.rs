//! Reading cluster objects (pure): which nodes to use, is a pod Ready or finished, what its
//! report says, and how to describe a stuck pod to a human.
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Node, Pod};

use cozyplane_probe::Report;

use crate::matrix::NodeInfo;
use crate::report::ClientResult;
use crate::ConnectivityError;

/// A node's InternalIP (the first one that parses).
pub fn internal_ip(node: &Node) -> Option<IpAddr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse().ok())
}

/// Schedulable: not cordoned and no NoSchedule/NoExecute taint. Probe pods bypass the
/// scheduler, so we apply the rule ourselves to stay off nodes the admin fenced off.
pub fn schedulable(node: &Node) -> bool {
    let Some(spec) = &node.spec else {
        return true;
    };
    if spec.unschedulable == Some(true) {
        return false;
    }
    !spec
        .taints
        .iter()
        .flatten()
        .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
}

/// Picks node A and B: the flags if given, else the first two schedulable nodes in name
/// order. One node → B is `None` (cross-node checks are skipped).
pub fn pick_nodes(
    nodes: &[Node],
    want_a: Option<&str>,
    want_b: Option<&str>,
) -> Result<(NodeInfo, Option<NodeInfo>), ConnectivityError> {
    let info = |n: &Node| -> Result<NodeInfo, ConnectivityError> {
        let name = n.metadata.name.clone().unwrap_or_default();
        let ip = internal_ip(n).ok_or_else(|| ConnectivityError::Nodes(format!(
            "node {name} has no InternalIP in status.addresses: hostNetwork probes need one (is its kubelet/agent up?)"
        )))?;
        Ok(NodeInfo {
            name,
            internal_ip: ip,
        })
    };
    let by_name = |want: &str| -> Result<NodeInfo, ConnectivityError> {
        let n = nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(want))
            .ok_or_else(|| {
                ConnectivityError::Nodes(format!(
                    "node {want} not found (kubectl get nodes lists the names)"
                ))
            })?;
        info(n)
    };
    let mut auto: Vec<&Node> = nodes.iter().filter(|n| schedulable(n)).collect();
    auto.sort_by(|x, y| x.metadata.name.cmp(&y.metadata.name));
    let a = match want_a {
        Some(w) => by_name(w)?,
        None => match auto.first() {
            Some(n) => info(n)?,
            None => {
                return Err(ConnectivityError::Nodes(
                    "no schedulable node (all cordoned or tainted, or none registered): check kubectl get nodes, or pick one with --node-a".into(),
                ))
            }
        },
    };
    let b = match want_b {
        Some(w) => Some(by_name(w)?),
        None => match auto
            .iter()
            .find(|n| n.metadata.name.as_deref() != Some(a.name.as_str()))
        {
            Some(n) => Some(info(n)?),
            None => None,
        },
    };
    if b.as_ref().is_some_and(|b| b.name == a.name) {
        return Err(ConnectivityError::Nodes(format!(
            "--node-a and --node-b are both {}: pick two different nodes",
            a.name
        )));
    }
    Ok((a, b))
}

/// Node C of the tenancy group: the first schedulable node by name that is neither A nor
/// B; `None` when there is none (its rows are then skipped). A node without an InternalIP
/// is passed over (its VPC rows need none, but its node row does).
pub fn pick_node_c(nodes: &[Node], a: &NodeInfo, b: Option<&NodeInfo>) -> Option<NodeInfo> {
    let mut auto: Vec<&Node> = nodes.iter().filter(|n| schedulable(n)).collect();
    auto.sort_by(|x, y| x.metadata.name.cmp(&y.metadata.name));
    auto.into_iter().find_map(|n| {
        let name = n.metadata.name.clone()?;
        let taken = name == a.name || b.is_some_and(|b| b.name == name);
        let internal_ip = internal_ip(n)?;
        (!taken).then_some(NodeInfo { name, internal_ip })
    })
}

/// Running, Ready and not being deleted.
pub fn running_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The pod's IP once it has one.
pub fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()
}

/// The first container's terminated state, if it has ended.
pub fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

/// A client pod is done when its phase is terminal or its container has terminated.
pub fn finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed")) || terminated(pod).is_some()
}

/// The client's report from its termination message (the report is its last JSON line;
/// with FallbackToLogsOnError a real kubelet may hand us the log tail instead).
pub fn client_result(pod: &Pod) -> ClientResult {
    let msg = terminated(pod)
        .and_then(|t| t.message.as_deref())
        .unwrap_or("");
    let parsed = msg
        .lines()
        .rev()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| Report::parse(l).ok());
    match parsed {
        Some(r) => ClientResult::Report(r),
        None => ClientResult::Missing(describe(pod)),
    }
}

/// One line on a pod's state: phase, conditions, container state, for stuck or failed pods.
pub fn describe(pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let Some(st) = &pod.status else {
        return format!(
            "{name}: no status yet (no kubelet has picked it up: is the node's kubelet running?)"
        );
    };
    let mut parts = vec![format!(
        "phase {}",
        st.phase.as_deref().unwrap_or("unknown")
    )];
    if let Some(m) = st.message.as_deref().filter(|m| !m.is_empty()) {
        parts.push(format!("message {m:?}"));
    }
    let conds: Vec<String> = st
        .conditions
        .iter()
        .flatten()
        .map(|c| {
            let mut s = format!("{}={}", c.type_, c.status);
            if let Some(r) = &c.reason {
                s.push_str(&format!("({r})"));
            }
            s
        })
        .collect();
    if !conds.is_empty() {
        parts.push(format!("conditions {}", conds.join(",")));
    }
    for cs in st.container_statuses.iter().flatten() {
        let state = match &cs.state {
            Some(s) if s.running.is_some() => "running".to_string(),
            Some(s) => match (&s.waiting, &s.terminated) {
                (Some(w), _) => format!(
                    "waiting {} {}",
                    w.reason.as_deref().unwrap_or(""),
                    w.message.as_deref().unwrap_or("")
                )
                .trim_end()
                .to_string(),
                (_, Some(t)) => format!(
                    "terminated exit {} {} message {:?}",
                    t.exit_code,
                    t.reason.as_deref().unwrap_or(""),
                    truncate(t.message.as_deref().unwrap_or(""), 200)
                ),
                _ => "unknown".into(),
            },
            None => "unknown".into(),
        };
        parts.push(format!(
            "container {} {state}, ready={}, restarts={}",
            cs.name, cs.ready, cs.restart_count
        ));
    }
    format!("{name}: {}", parts.join("; "))
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ip: Option<&str>, extra_spec: serde_json::Value) -> Node {
        let addrs: Vec<serde_json::Value> = ip
            .map(|i| vec![serde_json::json!({"type": "InternalIP", "address": i})])
            .unwrap_or_default();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": extra_spec,
            "status": {"addresses": addrs},
        }))
        .expect("node json")
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "client"}, "status": status}),
        )
        .expect("pod json")
    }

    #[test]
    fn picks_first_two_schedulable_nodes_in_name_order() {
        let nodes = vec![
            node("n3", Some("198.18.0.13"), serde_json::json!({})),
            node(
                "n0",
                Some("198.18.0.10"),
                serde_json::json!({"unschedulable": true}),
            ),
            node("n2", Some("198.18.0.12"), serde_json::json!({})),
            node(
                "n1",
                Some("198.18.0.11"),
                serde_json::json!({"taints": [{"key": "k", "effect": "NoSchedule"}]}),
            ),
            node(
                "n4",
                Some("198.18.0.14"),
                serde_json::json!({"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}),
            ),
        ];
        let (a, b) = pick_nodes(&nodes, None, None).expect("nodes");
        assert_eq!(a.name, "n2");
        assert_eq!(a.internal_ip.to_string(), "198.18.0.12");
        assert_eq!(b.expect("b").name, "n3");

        // Flags win, even for a tainted node.
        let (a, b) = pick_nodes(&nodes, Some("n1"), Some("n0")).expect("flags");
        assert_eq!((a.name.as_str(), b.expect("b").name.as_str()), ("n1", "n0"));
        // --node-a alone: B is the first other schedulable node.
        let (a, b) = pick_nodes(&nodes, Some("n3"), None).expect("a only");
        assert_eq!(
            (a.name.as_str(), b.as_ref().expect("b").name.as_str()),
            ("n3", "n2")
        );
        // C is the first schedulable node that is neither A nor B (n4 prefers no pods,
        // and is still schedulable), none when A and B took them all.
        let c = pick_node_c(&nodes, &a, b.as_ref()).expect("c");
        assert_eq!(c.name, "n4");
        let (a, b) = pick_nodes(&nodes, None, None).expect("nodes");
        assert_eq!(
            pick_node_c(&nodes, &a, b.as_ref()).map(|c| c.name),
            Some("n4".to_string())
        );
        let two = &nodes[2..4];
        let (a, b) = pick_nodes(two, None, None).expect("two");
        assert_eq!(pick_node_c(two, &a, b.as_ref()), None);
    }

    #[test]
    fn node_errors_say_what_to_do() {
        let one = vec![node("solo", Some("10.0.0.1"), serde_json::json!({}))];
        let (a, b) = pick_nodes(&one, None, None).expect("one node");
        assert_eq!(a.name, "solo");
        assert!(b.is_none());

        let e = pick_nodes(&one, Some("nope"), None)
            .expect_err("missing")
            .to_string();
        assert!(e.contains("node nope not found"), "{e}");
        let e = pick_nodes(&one, Some("solo"), Some("solo"))
            .expect_err("same")
            .to_string();
        assert!(e.contains("two different nodes"), "{e}");
        let e = pick_nodes(&[], None, None).expect_err("none").to_string();
        assert!(e.contains("no schedulable node"), "{e}");
        let noip = vec![node("x", None, serde_json::json!({}))];
        let e = pick_nodes(&noip, None, None)
            .expect_err("no ip")
            .to_string();
        assert!(e.contains("no InternalIP"), "{e}");
    }

    #[test]
    fn readiness_and_termination() {
        let ready = pod(
            serde_json::json!({"phase": "Running", "podIP": "10.244.1.5",
            "conditions": [{"type": "Ready", "status": "True"}]}),
        );
        assert!(running_ready(&ready));
        assert_eq!(
            pod_ip(&ready).map(|i| i.to_string()).as_deref(),
            Some("10.244.1.5")
        );
        assert!(!finished(&ready));
        let not_ready = pod(serde_json::json!({"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}]}));
        assert!(!running_ready(&not_ready));
        assert!(!running_ready(&pod(
            serde_json::json!({"phase": "Pending"})
        )));
        assert!(finished(&pod(serde_json::json!({"phase": "Failed"}))));
    }

    #[test]
    fn report_is_read_from_the_termination_message() {
        let line = r#"{"results":[{"id":"x","ok":true,"ms":1.0,"answer":"echo-a","error":null}]}"#;
        let done = pod(
            serde_json::json!({"phase": "Succeeded", "containerStatuses": [{
            "name": "probe", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                "message": format!("PASS x 1.0 ms\n{line}\n")}}}]}),
        );
        match client_result(&done) {
            ClientResult::Report(r) => assert_eq!(r.results[0].id, "x"),
            ClientResult::Missing(m) => panic!("expected a report, got {m}"),
        }
        let broken = pod(
            serde_json::json!({"phase": "Failed", "containerStatuses": [{
            "name": "probe", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 2, "reason": "Error",
                "message": "probe client: invalid plan: the plan has no checks"}}}]}),
        );
        match client_result(&broken) {
            ClientResult::Missing(m) => {
                assert!(m.contains("phase Failed"), "{m}");
                assert!(m.contains("terminated exit 2 Error"), "{m}");
                assert!(m.contains("invalid plan"), "{m}");
            }
            ClientResult::Report(r) => panic!("unexpected report {r:?}"),
        }
    }

    #[test]
    fn describe_a_stuck_pod() {
        let p = pod(serde_json::json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{"name": "probe", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}}]}));
        assert_eq!(
            describe(&p),
            "client: phase Pending; conditions PodScheduled=True,Ready=False(ContainersNotReady); \
             container probe waiting CrashLoopBackOff back-off 10s, ready=false, restarts=3"
        );
        let fresh: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "echo-a"}}))
                .expect("pod");
        assert!(describe(&fresh).contains("no kubelet has picked it up"));
    }
}
