//! The test run against a cluster: deploy, wait, collect, print.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use crate::config;
use crate::matrix::{self, External, Layout, Runner};
use crate::pods::{self, ServerPod};
use crate::report::{self, ClientResult};
use crate::state;
use crate::{ConnectivityError, TestArgs};

/// How often pods are polled while waiting (polling, not watching: works on any API
/// server, including the lab's, and the waits are short).
const POLL: Duration = Duration::from_millis(500);
/// How often a wait prints what it is still waiting for.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Prints a step and, when done, its duration.
struct Step {
    what: String,
    t0: Instant,
}

impl Step {
    fn start(what: impl Into<String>) -> Self {
        let what = what.into();
        println!("… {what}");
        Self {
            what,
            t0: Instant::now(),
        }
    }

    fn done(self, detail: &str) {
        let ms = report::format_ms(self.t0.elapsed().as_secs_f64() * 1000.0);
        if detail.is_empty() {
            println!("✓ {} ({ms})", self.what);
        } else {
            println!("✓ {}: {detail} ({ms})", self.what);
        }
    }
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ConnectivityError {
    let action = action.into();
    move |source| ConnectivityError::Api { action, source }
}

/// What a completed run found (the matrix was printed).
#[derive(Debug, Clone)]
pub struct Summary {
    /// Every row of the matrix, in order.
    pub rows: Vec<report::Row>,
    /// Passed checks.
    pub passed: usize,
    /// Failed checks.
    pub failed: usize,
    /// Skipped checks.
    pub skipped: usize,
    /// Server pods reused from an earlier run.
    pub reused: Vec<String>,
    /// Server pods created by this run.
    pub created: Vec<String>,
    /// Some client pod gave no parsable report.
    pub missing_report: bool,
}

/// Runs the whole test; `Err(Failed)` when any check failed.
pub async fn run(args: TestArgs) -> Result<(), ConnectivityError> {
    let s = execute(&args).await?;
    if s.failed > 0 {
        let ns = &args.namespace;
        return Err(ConnectivityError::Failed {
            passed: s.passed,
            failed: s.failed,
            skipped: s.skipped,
            hint: if s.missing_report {
                format!(
                    "a client pod gave no report: see its state above \
                     (kubectl -n {ns} describe pod <name>; raise --timeout if it was still running)"
                )
            } else {
                "each FAIL line names the broken path (from → to address) and the error the client saw"
                    .into()
            },
        });
    }
    Ok(())
}

/// Deploys, runs and prints the matrix; failing checks are in the summary, not an error.
pub async fn execute(args: &TestArgs) -> Result<Summary, ConnectivityError> {
    let t0 = Instant::now();
    let step = Step::start("connecting to the cluster");
    let cluster = config::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let client = cluster.client;
    let external = match &args.external_target {
        Some(t) => Some(External {
            target: config::parse_target(t)?,
            name: args.external_name.clone(),
        }),
        None => cluster.external,
    };
    step.done("");

    let step = Step::start("picking nodes");
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(api_err("listing nodes"))?;
    let (node_a, node_b) =
        state::pick_nodes(&list.items, args.node_a.as_deref(), args.node_b.as_deref())?;
    let detail = match &node_b {
        Some(b) => format!("A = {}, B = {}", node_a.name, b.name),
        None => format!(
            "A = {} (only one schedulable node: cross-node checks are skipped)",
            node_a.name
        ),
    };
    step.done(&detail);

    let ns = args.namespace.as_str();
    let step = Step::start(format!("creating namespace {ns}"));
    ensure_namespace(&client, ns).await?;
    step.done("");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // Servers: reuse the Ready ones made from the same spec, recreate the rest.
    let servers = pods::servers(&node_a.name, node_b.as_ref().map(|b| b.name.as_str()));
    let step = Step::start("deploying probe servers");
    let (reused, created) = ensure_servers(&pods, &servers, &args.image, args.timeout()).await?;
    step.done(&format!(
        "reused [{}], created [{}]",
        reused.join(", "),
        created.join(", ")
    ));

    let names: Vec<&str> = servers.iter().map(|s| s.name).collect();
    let step = Step::start(format!("waiting for pods {} to be Ready", names.join(", ")));
    let waited = wait_for(&pods, &names, args.timeout(), state::running_ready).await?;
    if !waited.pending.is_empty() {
        waited.print_pending("Ready", args.timeout());
        return Err(ConnectivityError::Timeout {
            what: format!("pods {} to be Ready", waited.pending_names()),
            waited: args.timeout(),
            hint: "check the state printed above: no status means no kubelet runs on that node; \
                   waiting or restarts mean the image or command fails (kubectl logs); \
                   Running but not Ready means the readiness probe cannot reach the pod \
                   (check the CNI and the node agent's logs)"
                .into(),
        });
    }
    let ready = waited.done;
    step.done("");

    let ip_of = |name: &str| -> Result<std::net::IpAddr, ConnectivityError> {
        ready.get(name).and_then(state::pod_ip).ok_or_else(|| {
            ConnectivityError::Pods(format!(
                "pod {name} is Ready but has no status.podIP: the kubelet/CNI did not report it"
            ))
        })
    };
    let layout = Layout {
        echo_a_ip: ip_of("echo-a")?,
        echo_b_ip: match &node_b {
            Some(_) => Some(ip_of("echo-b")?),
            None => None,
        },
        node_a: node_a.clone(),
        node_b: node_b.clone(),
        external,
        check_timeout_ms: args.check_timeout_secs.saturating_mul(1000),
    };
    let m = matrix::build(&layout);

    // Clients: always fresh, so a result is never last run's.
    let step = Step::start("removing old client pods");
    let client_names: Vec<&str> = Runner::ALL.iter().map(|r| r.pod_name()).collect();
    delete_and_wait(&pods, &client_names, args.timeout()).await?;
    step.done("");

    let host_client_node = node_b.as_ref().unwrap_or(&node_a);
    let step = Step::start("starting client pods");
    let mut started = Vec::new();
    for runner in Runner::ALL {
        let Some(plan) = m.plan_for(runner) else {
            continue;
        };
        let json = plan.to_json().map_err(ConnectivityError::Plan)?;
        let (node, host_network) = match runner {
            Runner::Client => (&node_a.name, false),
            Runner::HostClient => (&host_client_node.name, true),
        };
        let pod = pods::client_pod(runner.pod_name(), node, host_network, &args.image, &json);
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(api_err(format!("creating pod {ns}/{}", runner.pod_name())))?;
        started.push(runner);
    }
    step.done(
        &started
            .iter()
            .map(|r| r.pod_name())
            .collect::<Vec<_>>()
            .join(", "),
    );

    let started_names: Vec<&str> = started.iter().map(|r| r.pod_name()).collect();
    let step = Step::start(format!(
        "waiting for pods {} to finish",
        started_names.join(", ")
    ));
    let waited = wait_for(&pods, &started_names, args.timeout(), state::finished).await?;
    if waited.pending.is_empty() {
        step.done("");
    } else {
        // Still print the matrix: the finished client's results are worth having.
        waited.print_pending("finished", args.timeout());
    }

    let mut results = HashMap::new();
    for runner in &started {
        let name = runner.pod_name();
        let r = match waited.done.get(name) {
            Some(p) => state::client_result(p),
            None => {
                let pod = waited
                    .pending
                    .iter()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, p)| p.as_ref());
                ClientResult::Missing(format!(
                    "did not finish within {}s ({})",
                    args.timeout,
                    describe_opt(name, pod)
                ))
            }
        };
        if let ClientResult::Missing(why) = &r {
            println!("! pod {name} gave no report: {why}");
        }
        results.insert(*runner, r);
    }

    let rows = report::rows(&m, &results);
    println!();
    for line in report::format(&rows) {
        println!("{line}");
    }
    let (passed, failed, skipped) = report::counts(&rows);
    let total = report::format_ms(t0.elapsed().as_secs_f64() * 1000.0);
    if args.cleanup {
        println!("total {total}");
    } else {
        println!("total {total} (pods stay in namespace {ns}: kubectl -n {ns} get pods -o wide)");
    }

    if args.cleanup {
        let step = Step::start(format!("deleting probe pods in {ns}"));
        pods.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&pods::selector()),
        )
        .await
        .map_err(api_err(format!("deleting probe pods in {ns}")))?;
        step.done("");
    }

    Ok(Summary {
        passed,
        failed,
        skipped,
        reused,
        created,
        missing_report: results
            .values()
            .any(|r| matches!(r, ClientResult::Missing(_))),
        rows,
    })
}

async fn ensure_namespace(client: &Client, ns: &str) -> Result<(), ConnectivityError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let obj = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            // hostNetwork probes need the privileged Pod Security level on clusters that
            // enforce one (a namespace that already exists is left as it is).
            labels: Some(
                [
                    (pods::APP_LABEL.to_string(), pods::APP_VALUE.to_string()),
                    (
                        "pod-security.kubernetes.io/enforce".to_string(),
                        "privileged".to_string(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(api_err(format!("creating namespace {ns}"))(e)),
    }
}

/// Reuses Ready servers with a matching spec, deletes the others, creates what is missing.
async fn ensure_servers(
    pods: &Api<Pod>,
    servers: &[ServerPod],
    image: &str,
    timeout: Duration,
) -> Result<(Vec<String>, Vec<String>), ConnectivityError> {
    let mut reused = Vec::new();
    let mut stale = Vec::new();
    let mut to_create = Vec::new();
    for s in servers {
        let wanted = pods::server_pod(s, image);
        let existing = pods
            .get_opt(s.name)
            .await
            .map_err(api_err(format!("reading pod {}", s.name)))?;
        match existing {
            Some(p) if pods::same_spec(&p, &wanted) && state::running_ready(&p) => {
                reused.push(s.name.to_string());
            }
            Some(_) => {
                stale.push(s.name);
                to_create.push(wanted);
            }
            None => to_create.push(wanted),
        }
    }
    delete_and_wait(pods, &stale, timeout).await?;
    let mut created = Vec::new();
    for p in to_create {
        let name = p.metadata.name.clone().unwrap_or_default();
        pods.create(&PostParams::default(), &p)
            .await
            .map_err(api_err(format!("creating pod {name}")))?;
        created.push(name);
    }
    Ok((reused, created))
}

/// Deletes the named pods (absent ones are fine) and waits until they are gone.
async fn delete_and_wait(
    pods: &Api<Pod>,
    names: &[&str],
    timeout: Duration,
) -> Result<(), ConnectivityError> {
    for name in names {
        match pods.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_err(format!("deleting pod {name}"))(e)),
        }
    }
    let deadline = Instant::now() + timeout;
    let mut last_note = Instant::now();
    loop {
        let mut left = Vec::new();
        for name in names {
            if let Some(p) = pods
                .get_opt(name)
                .await
                .map_err(api_err(format!("reading pod {name}")))?
            {
                left.push(p);
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            for p in &left {
                println!("  {}", state::describe(p));
            }
            return Err(ConnectivityError::Timeout {
                what: format!(
                    "deleting pods {}",
                    left.iter().filter_map(|p| p.metadata.name.clone()).collect::<Vec<_>>().join(", ")
                ),
                waited: timeout,
                hint: "a pod stays while its node's kubelet has not confirmed it stopped: check that the kubelet on its node runs, or raise --timeout".into(),
            });
        }
        if last_note.elapsed() >= PROGRESS_EVERY {
            last_note = Instant::now();
            println!("  … waiting for {} pod(s) to be deleted", left.len());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The result of a wait: pods that reached the goal, and those that did not in time
/// (`None`: the pod is gone).
struct Waited {
    done: HashMap<String, Pod>,
    pending: Vec<(String, Option<Pod>)>,
}

impl Waited {
    /// Prints each pending pod's state (phase, conditions, containerStatuses).
    fn print_pending(&self, goal: &str, timeout: Duration) {
        println!(
            "! timed out after {}s waiting for pods to be {goal}:",
            timeout.as_secs()
        );
        for (name, p) in &self.pending {
            println!("  {}", describe_opt(name, p.as_ref()));
        }
    }

    fn pending_names(&self) -> String {
        let names: Vec<&str> = self.pending.iter().map(|(n, _)| n.as_str()).collect();
        names.join(", ")
    }
}

fn describe_opt(name: &str, pod: Option<&Pod>) -> String {
    match pod {
        Some(p) => state::describe(p),
        None => format!("{name}: gone (deleted by someone else?)"),
    }
}

/// Polls until `done` holds for every named pod, or the timeout passes.
async fn wait_for(
    pods: &Api<Pod>,
    names: &[&str],
    timeout: Duration,
    done: fn(&Pod) -> bool,
) -> Result<Waited, ConnectivityError> {
    let t0 = Instant::now();
    let mut last_note = Instant::now();
    loop {
        let mut got = HashMap::new();
        let mut pending = Vec::new();
        for name in names {
            match pods
                .get_opt(name)
                .await
                .map_err(api_err(format!("reading pod {name}")))?
            {
                Some(p) if done(&p) => {
                    got.insert(name.to_string(), p);
                }
                Some(p) => pending.push((name.to_string(), Some(p))),
                None => pending.push((name.to_string(), None)),
            }
        }
        if pending.is_empty() || t0.elapsed() >= timeout {
            return Ok(Waited { done: got, pending });
        }
        if last_note.elapsed() >= PROGRESS_EVERY {
            last_note = Instant::now();
            let states: Vec<String> = pending
                .iter()
                .map(|(n, p)| {
                    let phase = p
                        .as_ref()
                        .and_then(|p| p.status.as_ref())
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_else(|| "no status".into());
                    format!("{n} {phase}")
                })
                .collect();
            println!(
                "  … waiting for pods ({}s): {}",
                t0.elapsed().as_secs(),
                states.join(", ")
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
