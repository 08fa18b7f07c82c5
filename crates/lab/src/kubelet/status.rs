//! Pod status building: what the kubelet observed → `PodStatus` (pure, so the
//! phase, condition and container-state rules are unit-tested).
//!
//! The kubelet keeps one [`Observed`] per pod, changes it as things happen,
//! and patches the pod's status with [`pod_status`] of it. Condition
//! transition times live in [`Conditions`], which only moves a time when the
//! value changes, as the API conventions require.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::plan::WorkloadPlan;

/// The pod phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Not running yet (network or workload being set up, or failing to).
    Pending,
    /// The workload was started (and, with restartPolicy Always, keeps being restarted).
    Running,
    /// Ended with exit code 0 and will not restart.
    Succeeded,
    /// Ended otherwise and will not restart.
    Failed,
}

impl Phase {
    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }

    /// Succeeded or Failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// How a run of the workload ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Termination {
    /// Exit code (128 + signal for a signalled process, as a shell reports it).
    pub exit_code: i32,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// The termination-log file (≤ 4096 bytes).
    pub message: String,
    /// When it started.
    pub started_at: Timestamp,
    /// When it ended.
    pub finished_at: Timestamp,
}

/// The container's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Container {
    /// Not running: why (`ContainerCreating`, `CrashLoopBackOff`, `CreateContainerConfigError`…).
    Waiting {
        /// A CamelCase reason.
        reason: String,
        /// Details (a CNI error text, say).
        message: Option<String>,
    },
    /// Running since.
    Running {
        /// Start time.
        started_at: Timestamp,
    },
    /// Ended (terminal pods).
    Terminated(Termination),
}

/// Conditions with their last transition times.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Conditions {
    /// `(type, status, lastTransitionTime)` in API order.
    pub list: Vec<(String, bool, Timestamp)>,
}

impl Conditions {
    /// Sets condition `type_` to `value`; the transition time moves only on a change.
    pub fn set(&mut self, type_: &str, value: bool, now: Timestamp) {
        match self.list.iter_mut().find(|(t, _, _)| t == type_) {
            Some((_, v, since)) if *v != value => {
                *v = value;
                *since = now;
            }
            Some(_) => {}
            None => self.list.push((type_.to_string(), value, now)),
        }
    }

    /// The value of `type_`, if set.
    pub fn get(&self, type_: &str) -> Option<bool> {
        self.list
            .iter()
            .find(|(t, _, _)| t == type_)
            .map(|(_, v, _)| *v)
    }
}

/// Everything the kubelet knows about one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// Phase.
    pub phase: Phase,
    /// The pod address(es), once the network is up (kept after a terminal pod's network is gone).
    pub pod_ips: Vec<IpAddr>,
    /// The node's address.
    pub host_ip: IpAddr,
    /// When the kubelet took the pod on.
    pub start_time: Timestamp,
    /// The container's state.
    pub container: Container,
    /// The previous run's end, after a restart.
    pub last_termination: Option<Termination>,
    /// Readiness of the running workload.
    pub ready: bool,
    /// Restarts so far.
    pub restart_count: u32,
    /// Conditions and their transition times.
    pub conditions: Conditions,
}

impl Observed {
    /// A pod just taken on: Pending, `ContainerCreating`, scheduled.
    pub fn new(host_ip: IpAddr, now: Timestamp) -> Observed {
        let mut conditions = Conditions::default();
        conditions.set("PodScheduled", true, now);
        let mut o = Observed {
            phase: Phase::Pending,
            pod_ips: Vec::new(),
            host_ip,
            start_time: now,
            container: Container::Waiting {
                reason: "ContainerCreating".into(),
                message: None,
            },
            last_termination: None,
            ready: false,
            restart_count: 0,
            conditions,
        };
        o.sync_conditions(now);
        o
    }

    /// Waiting with a reason (and stays Pending unless it ran before).
    pub fn waiting(&mut self, reason: &str, message: Option<String>, now: Timestamp) {
        self.container = Container::Waiting {
            reason: reason.into(),
            message,
        };
        self.ready = false;
        self.sync_conditions(now);
    }

    /// The workload started.
    pub fn running(&mut self, started_at: Timestamp, now: Timestamp) {
        self.phase = Phase::Running;
        self.container = Container::Running { started_at };
        self.ready = false;
        self.sync_conditions(now);
    }

    /// The readiness check passed (or failed).
    pub fn set_ready(&mut self, ready: bool, now: Timestamp) {
        self.ready = ready && matches!(self.container, Container::Running { .. });
        self.sync_conditions(now);
    }

    /// The workload exited and will be restarted after a backoff.
    pub fn exited_will_restart(&mut self, t: Termination, now: Timestamp) {
        self.last_termination = Some(t);
        self.restart_count += 1;
        self.waiting("CrashLoopBackOff", None, now);
    }

    /// The workload exited for good.
    pub fn terminated(&mut self, t: Termination, now: Timestamp) {
        self.phase = if t.exit_code == 0 {
            Phase::Succeeded
        } else {
            Phase::Failed
        };
        self.container = Container::Terminated(t);
        self.ready = false;
        self.sync_conditions(now);
    }

    fn sync_conditions(&mut self, now: Timestamp) {
        // Initialized: no init containers in the lab, so true once the pod is taken on.
        self.conditions.set("Initialized", true, now);
        self.conditions.set("ContainersReady", self.ready, now);
        self.conditions.set("Ready", self.ready, now);
    }
}

fn time(t: Timestamp) -> Option<Time> {
    Some(Time(t))
}

fn state(c: &Container, container_id: &str) -> ContainerState {
    match c {
        Container::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..ContainerState::default()
        },
        Container::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time(*started_at),
            }),
            ..ContainerState::default()
        },
        Container::Terminated(t) => ContainerState {
            terminated: Some(terminated(t, container_id)),
            ..ContainerState::default()
        },
    }
}

fn terminated(t: &Termination, container_id: &str) -> ContainerStateTerminated {
    ContainerStateTerminated {
        container_id: Some(container_id.to_string()),
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(
            if t.exit_code == 0 {
                "Completed"
            } else {
                "Error"
            }
            .into(),
        ),
        message: (!t.message.is_empty()).then(|| t.message.clone()),
        started_at: time(t.started_at),
        finished_at: time(t.finished_at),
    }
}

/// The status to report for `plan` given what was observed.
pub fn pod_status(plan: &WorkloadPlan, o: &Observed) -> PodStatus {
    let container_id = format!("lab://{}", plan.container_id);
    let started = matches!(o.container, Container::Running { .. });
    let ips: Vec<String> = o.pod_ips.iter().map(ToString::to_string).collect();
    PodStatus {
        phase: Some(o.phase.as_str().into()),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        host_ip: Some(o.host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: o.host_ip.to_string(),
        }]),
        start_time: time(o.start_time),
        conditions: Some(
            o.conditions
                .list
                .iter()
                .map(|(t, v, since)| PodCondition {
                    type_: t.clone(),
                    status: if *v { "True" } else { "False" }.into(),
                    last_transition_time: time(*since),
                    ..PodCondition::default()
                })
                .collect(),
        ),
        container_statuses: Some(vec![ContainerStatus {
            name: plan.container.clone(),
            image: plan.image.clone(),
            image_id: String::new(),
            container_id: Some(container_id.clone()),
            ready: o.ready,
            started: Some(started),
            restart_count: i32::try_from(o.restart_count).unwrap_or(i32::MAX),
            state: Some(state(&o.container, &container_id)),
            last_state: o.last_termination.as_ref().map(|t| ContainerState {
                terminated: Some(terminated(t, &container_id)),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    }
}

/// A status for a pod the kubelet cannot run at all (its spec is unusable):
/// Pending, `CreateContainerConfigError` with the reason.
pub fn unrunnable(host_ip: IpAddr, message: &str, now: Timestamp) -> PodStatus {
    PodStatus {
        phase: Some("Pending".into()),
        host_ip: Some(host_ip.to_string()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "True".into(),
            last_transition_time: time(now),
            ..PodCondition::default()
        }]),
        message: Some(message.to_string()),
        reason: Some("CreateContainerConfigError".into()),
        ..PodStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::plan::plan;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("timestamp")
    }

    fn test_plan() -> WorkloadPlan {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "d", "uid": "abcd-1234"},
            "spec": {"containers": [{"name": "main", "image": "img"}]}}))
        .expect("pod");
        plan(&pod, "lab-node1").expect("plan")
    }

    fn cond(s: &PodStatus, t: &str) -> (String, Option<Time>) {
        let c = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no condition {t}"));
        (c.status.clone(), c.last_transition_time.clone())
    }

    #[test]
    fn a_new_pod_is_pending_and_creating() {
        let host: IpAddr = "198.18.0.11".parse().expect("ip");
        let o = Observed::new(host, ts(0));
        let s = pod_status(&test_plan(), &o);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(s.pod_ip, None);
        assert_eq!(s.host_ip.as_deref(), Some("198.18.0.11"));
        assert_eq!(cond(&s, "PodScheduled").0, "True");
        assert_eq!(cond(&s, "Ready").0, "False");
        let cs = &s.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(cs.container_id.as_deref(), Some("lab://abcd1234"));
        assert_eq!(cs.name, "main");
        let w = cs
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .expect("waiting");
        assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
    }

    #[test]
    fn running_then_ready_moves_only_the_changed_conditions() {
        let mut o = Observed::new("198.18.0.11".parse().expect("ip"), ts(0));
        o.pod_ips = vec!["10.244.1.7".parse().expect("ip")];
        o.running(ts(5), ts(5));
        let s = pod_status(&test_plan(), &o);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.1.7"));
        assert_eq!(cond(&s, "Ready"), ("False".into(), Some(Time(ts(0)))));
        o.set_ready(true, ts(7));
        let s = pod_status(&test_plan(), &o);
        assert_eq!(cond(&s, "Ready"), ("True".into(), Some(Time(ts(7)))));
        assert_eq!(cond(&s, "ContainersReady").0, "True");
        assert_eq!(cond(&s, "PodScheduled"), ("True".into(), Some(Time(ts(0)))));
        let cs = &s.container_statuses.as_ref().expect("statuses")[0];
        assert!(cs.ready && cs.started == Some(true));
        // Setting the same value again keeps the time.
        o.set_ready(true, ts(9));
        assert_eq!(
            cond(&pod_status(&test_plan(), &o), "Ready").1,
            Some(Time(ts(7)))
        );
    }

    #[test]
    fn a_restart_counts_and_keeps_the_last_state() {
        let mut o = Observed::new("198.18.0.11".parse().expect("ip"), ts(0));
        o.running(ts(1), ts(1));
        o.set_ready(true, ts(2));
        o.exited_will_restart(
            Termination {
                exit_code: 137,
                signal: Some(9),
                message: String::new(),
                started_at: ts(1),
                finished_at: ts(3),
            },
            ts(3),
        );
        let s = pod_status(&test_plan(), &o);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").0, "False");
        let cs = &s.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(cs.restart_count, 1);
        let last = cs
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .expect("last state");
        assert_eq!(
            (last.exit_code, last.reason.as_deref()),
            (137, Some("Error"))
        );
    }

    #[test]
    fn terminal_pods_carry_the_report_and_keep_their_ip() {
        let mut o = Observed::new("198.18.0.11".parse().expect("ip"), ts(0));
        o.pod_ips = vec!["10.244.1.7".parse().expect("ip")];
        o.running(ts(1), ts(1));
        o.terminated(
            Termination {
                exit_code: 0,
                signal: None,
                message: "{\"results\":[]}".into(),
                started_at: ts(1),
                finished_at: ts(4),
            },
            ts(4),
        );
        let s = pod_status(&test_plan(), &o);
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.1.7"));
        let t = s.container_statuses.as_ref().expect("statuses")[0]
            .state
            .as_ref()
            .and_then(|st| st.terminated.clone())
            .expect("terminated");
        assert_eq!(t.reason.as_deref(), Some("Completed"));
        assert_eq!(t.message.as_deref(), Some("{\"results\":[]}"));
        assert_eq!(t.finished_at, Some(Time(ts(4))));

        o.terminated(
            Termination {
                exit_code: 1,
                signal: None,
                message: String::new(),
                started_at: ts(1),
                finished_at: ts(4),
            },
            ts(5),
        );
        let s = pod_status(&test_plan(), &o);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn an_unrunnable_pod_says_why() {
        let s = unrunnable("198.18.0.11".parse().expect("ip"), "env S: bad", ts(0));
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(s.reason.as_deref(), Some("CreateContainerConfigError"));
        assert_eq!(s.message.as_deref(), Some("env S: bad"));
    }
}
