//! The test run against a cluster: deploy, wait, collect, print.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use cozyplane_api::{SecurityGroup, VPCBinding, VPCPeering, VPC};
use cozyplane_probe::stream::{now_ms, StreamReport, StreamSpec};
use cozyplane_probe::{Outcome, Report};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use crate::config;
use crate::matrix::{self, External, Layout, NodeInfo, Runner, TenancyLayout, VpcEchoes};
use crate::pods::{self, ServerPod};
use crate::report::{self, ClientResult};
use crate::state;
use crate::tenancy::{self, NoBinding, Tenant};
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
    // Node C: only the tenancy group spreads its twin VPCs over a third node.
    let node_c = if args.tenancy {
        state::pick_node_c(&list.items, &node_a, node_b.as_ref())
    } else {
        None
    };
    let detail = match &node_c {
        Some(c) => format!("{detail}, C = {} (tenancy)", c.name),
        None if args.tenancy => format!("{detail} (no third node: the rows needing C are skipped)"),
        None => detail,
    };
    step.done(&detail);

    let ns = args.namespace.as_str();
    let step = Step::start(format!("creating namespace {ns}"));
    ensure_namespace(&client, ns).await?;
    step.done("");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // Servers: reuse the Ready ones made from the same spec, recreate the rest.
    let mut servers = pods::servers(&node_a.name, node_b.as_ref().map(|b| b.name.as_str()));
    if args.policy {
        servers.push(ServerPod {
            name: matrix::POLICY_ECHO,
            node: node_b.as_ref().unwrap_or(&node_a).name.clone(),
            host_network: false,
            vpc: None,
            answer: None,
            stream: false,
        });
    }
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
    // The policy group's NetworkPolicies, first: the agents have programmed
    // them by the time the clients start.
    if args.policy {
        let step = Step::start("creating NetworkPolicies cozyplane-connectivity-deny, -allow");
        ensure_policies(&client, ns).await?;
        step.done("");
    }
    let services = if args.no_services {
        None
    } else {
        let step = Step::start("creating Services svc-echo-a (etp Local), svc-echo-b");
        match ensure_services(&client, ns, node_b.is_some()).await {
            Ok(s) => {
                step.done(&format!(
                    "ClusterIP {} / {}",
                    s.a.cluster_ip,
                    match &s.b {
                        Some(b) => b.cluster_ip.to_string(),
                        None => "-".into(),
                    }
                ));
                Some(s)
            }
            Err(e) => {
                // The rows say why they are skipped; the rest of the matrix runs.
                println!("✗ creating Services: {e}");
                None
            }
        }
    };
    let tenancy_layout = if args.tenancy {
        Some(deploy_tenancy(&client, args, &node_a, node_b.as_ref(), node_c.as_ref()).await?)
    } else {
        None
    };
    let layout = Layout {
        tenancy: tenancy_layout,
        services,
        no_services: args.no_services,
        policy_echo_ip: match args.policy {
            true => Some(ip_of(matrix::POLICY_ECHO)?),
            false => None,
        },
        echo_a_ip: ip_of("echo-a")?,
        echo_b_ip: match &node_b {
            Some(_) => Some(ip_of("echo-b")?),
            None => None,
        },
        node_a: node_a.clone(),
        node_b: node_b.clone(),
        node_c: node_c.clone(),
        external,
        check_timeout_ms: args.check_timeout_secs.saturating_mul(1000),
    };
    let m = matrix::build(&layout);

    // Clients: always fresh, so a result is never last run's.
    let host_client_node = node_b.as_ref().unwrap_or(&node_a);
    let place = |runner: Runner| -> Option<(String, &str, bool, Option<String>)> {
        match runner {
            Runner::Client => Some((ns.to_string(), node_a.name.as_str(), false, None)),
            Runner::HostClient => {
                Some((ns.to_string(), host_client_node.name.as_str(), true, None))
            }
            Runner::VpcClient => Some((
                Tenant::T1.namespace(ns),
                node_a.name.as_str(),
                false,
                Some(Tenant::T1.vpc_annotation(ns)),
            )),
            Runner::PeerClient => Some((
                Tenant::T3.namespace(ns),
                node_a.name.as_str(),
                false,
                Some(Tenant::T3.vpc_annotation(ns)),
            )),
            Runner::SgWeb => Some((
                Tenant::T1.namespace(ns),
                node_a.name.as_str(),
                false,
                Some(Tenant::T1.vpc_annotation(ns)),
            )),
            Runner::Member(t, slot) => layout.node(slot).map(|n| {
                (
                    t.namespace(ns),
                    n.name.as_str(),
                    false,
                    Some(t.vpc_annotation(ns)),
                )
            }),
            Runner::PolicyClient => Some((ns.to_string(), node_a.name.as_str(), false, None)),
            Runner::Unbound | Runner::PeerStream | Runner::Revoked => None,
        }
    };
    let mut planned = Vec::new();
    for runner in Runner::ALL {
        if let (Some(plan), Some(p)) = (m.plan_for(runner), place(runner)) {
            planned.push((runner, plan, p));
        }
    }
    let step = Step::start("removing old client pods");
    let mut by_ns: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (runner, _, (pns, ..)) in &planned {
        by_ns
            .entry(pns.clone())
            .or_default()
            .push(runner.pod_name());
    }
    by_ns.entry(ns.to_string()).or_default();
    for name in [Runner::Client, Runner::HostClient].map(Runner::pod_name) {
        let v = by_ns.entry(ns.to_string()).or_default();
        if !v.contains(&name) {
            v.push(name);
        }
    }
    for (pns, names) in &by_ns {
        let api: Api<Pod> = Api::namespaced(client.clone(), pns);
        delete_and_wait(&api, names, args.timeout()).await?;
    }
    step.done("");

    let step = Step::start("starting client pods");
    let mut started = Vec::new();
    for (runner, plan, (pns, node, host_network, vpc)) in &planned {
        let json = plan.to_json().map_err(ConnectivityError::Plan)?;
        let mut pod = pods::client_pod(runner.pod_name(), node, *host_network, &args.image, &json);
        if let Some(v) = vpc {
            tenancy::attach(&mut pod, v);
        }
        if *runner == Runner::SgWeb {
            tenancy::join_group(&mut pod, "web");
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), pns);
        api.create(&PostParams::default(), &pod)
            .await
            .map_err(api_err(format!("creating pod {pns}/{}", runner.pod_name())))?;
        started.push(*runner);
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
    let mut done: HashMap<String, Pod> = HashMap::new();
    let mut pending: Vec<(String, Option<Pod>)> = Vec::new();
    let mut clients_by_ns: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (runner, _, (pns, ..)) in &planned {
        clients_by_ns
            .entry(pns.clone())
            .or_default()
            .push(runner.pod_name());
    }
    for (pns, names) in &clients_by_ns {
        let api: Api<Pod> = Api::namespaced(client.clone(), pns);
        let w = wait_for(&api, names, args.timeout(), state::finished).await?;
        done.extend(w.done);
        pending.extend(w.pending);
    }
    let waited = Waited { done, pending };
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
    if args.tenancy {
        let step = Step::start(format!(
            "checking that pod {}/{} is refused for lack of a VPCBinding",
            tenancy::unbound_namespace(ns),
            tenancy::UNBOUND
        ));
        let outcomes = judge_unbound(&client, ns, args.timeout()).await?;
        let refused = outcomes.iter().all(|o| o.ok);
        step.done(if refused { "refused" } else { "NOT refused" });
        results.insert(
            Runner::Unbound,
            ClientResult::Report(Report { results: outcomes }),
        );
        rejudge_own_holders(&client, ns, &m, &mut results).await?;
        if let Some(t) = &layout.tenancy {
            let peered = peered_phase(&client, args, &node_a, t).await?;
            results.insert(Runner::PeerStream, peered);
            let revoked = revoked_phase(&client, args, &node_a, t).await?;
            results.insert(Runner::Revoked, revoked);
        }
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
        let mut namespaces = vec![ns.to_string()];
        if args.tenancy {
            namespaces.extend(Tenant::ALL.map(|t| t.namespace(ns)));
            namespaces.push(tenancy::unbound_namespace(ns));
            namespaces.push(tenancy::revoke_namespace(ns));
        }
        for pns in namespaces {
            let step = Step::start(format!("deleting probe pods in {pns}"));
            let api: Api<Pod> = Api::namespaced(client.clone(), &pns);
            api.delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&pods::selector()),
            )
            .await
            .map_err(api_err(format!("deleting probe pods in {pns}")))?;
            step.done("");
        }
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

/// `--tenancy`: namespaces, the twin VPCs and their bindings, the VPC servers (Ready, with
/// their VPC address stamped) and a fresh `unbound` pod; returns the servers' addresses.
async fn deploy_tenancy(
    client: &Client,
    args: &TestArgs,
    node_a: &NodeInfo,
    node_b: Option<&NodeInfo>,
    node_c: Option<&NodeInfo>,
) -> Result<TenancyLayout, ConnectivityError> {
    let base = args.namespace.as_str();
    let step = Step::start(
        "setting up tenants t1, t2 and t3 (namespaces, VPCs, bindings, the t1-t3 peering)",
    );
    let mut namespaces: Vec<String> = Tenant::ALL.iter().map(|t| t.namespace(base)).collect();
    namespaces.push(tenancy::unbound_namespace(base));
    namespaces.push(tenancy::revoke_namespace(base));
    for n in &namespaces {
        let api: Api<Namespace> = Api::all(client.clone());
        let obj = Namespace {
            metadata: tenancy::namespace_meta(n),
            ..Default::default()
        };
        create_or_get(&api, &obj, n)
            .await
            .map_err(tenancy_err(format!("creating namespace {n}")))?;
    }
    for t in Tenant::ALL {
        let tns = t.namespace(base);
        let vpcs: Api<VPC> = Api::namespaced(client.clone(), &tns);
        let want = tenancy::vpc(t, base, t.cidr(&args.tenancy_cidr, &args.tenancy_peer_cidr));
        let have = create_or_get(&vpcs, &want, tenancy::VPC_NAME)
            .await
            .map_err(tenancy_err(format!(
                "creating VPC {tns}/{}",
                tenancy::VPC_NAME
            )))?;
        if let Some(why) = tenancy::vpc_mismatch(&have, &want) {
            return Err(ConnectivityError::Tenancy(why));
        }
        let bindings: Api<VPCBinding> = Api::namespaced(client.clone(), &tns);
        let want = tenancy::binding(t, base);
        let have = create_or_get(&bindings, &want, tenancy::VPC_NAME)
            .await
            .map_err(tenancy_err(format!(
                "creating VPCBinding {tns}/{}",
                tenancy::VPC_NAME
            )))?;
        if let Some(why) = tenancy::binding_mismatch(&have, &want) {
            return Err(ConnectivityError::Tenancy(why));
        }
    }
    // The revoked group's own binding (deleted and re-created by its phase; a run cut
    // short in between left it deleted, so it is made here again).
    ensure_binding(client, &tenancy::revoke_binding(base)).await?;
    for (local, remote) in [(Tenant::T1, Tenant::T3), (Tenant::T3, Tenant::T1)] {
        ensure_peering(client, &tenancy::peering(local, remote, base)).await?;
    }
    step.done(&format!(
        "CIDR {} in t1 and t2, {} in t3",
        args.tenancy_cidr, args.tenancy_peer_cidr
    ));

    let step = Step::start("waiting for VPCs t1/net, t2/net and t3/net to be Ready");
    let deadline = Instant::now() + args.timeout();
    for t in Tenant::ALL {
        let tns = t.namespace(base);
        let vpcs: Api<VPC> = Api::namespaced(client.clone(), &tns);
        loop {
            let v = vpcs
                .get_opt(tenancy::VPC_NAME)
                .await
                .map_err(api_err(format!("reading VPC {tns}/{}", tenancy::VPC_NAME)))?;
            if v.as_ref().is_some_and(tenancy::vpc_ready) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(ConnectivityError::Timeout {
                    what: format!("VPC {tns}/{} to be Ready", tenancy::VPC_NAME),
                    waited: args.timeout(),
                    hint: format!(
                        "the controller assigns its VNI: kubectl -n {tns} describe vpc {} \
                         shows its conditions; is the cozyplane controller running?",
                        tenancy::VPC_NAME
                    ),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
    step.done("");

    let step = Step::start("waiting for the peering halves t1/peer and t3/peer to be Ready");
    for t in [Tenant::T1, Tenant::T3] {
        wait_peering(client, &t.namespace(base), deadline, args.timeout(), true).await?;
    }
    step.done("");

    // The unbound pod first: it is judged last, after it has had time to be refused.
    let step = Step::start("starting pod unbound (t1's VPC, no binding)");
    let uns = tenancy::unbound_namespace(base);
    let unbound: Api<Pod> = Api::namespaced(client.clone(), &uns);
    delete_and_wait(&unbound, &[tenancy::UNBOUND], args.timeout()).await?;
    unbound
        .create(
            &PostParams::default(),
            &tenancy::unbound_pod(base, &node_a.name, &args.image),
        )
        .await
        .map_err(api_err(format!("creating pod {uns}/{}", tenancy::UNBOUND)))?;
    step.done("");

    let mut echoes = Vec::new();
    for t in Tenant::ALL {
        let tns = t.namespace(base);
        let api: Api<Pod> = Api::namespaced(client.clone(), &tns);
        // The twins spread over all three nodes; t3 (the peering rows) needs two.
        let c = node_c.filter(|_| t != Tenant::T3).map(|c| c.name.as_str());
        let servers = tenancy::servers(t, base, &node_a.name, node_b.map(|b| b.name.as_str()), c);
        let step = Step::start(format!("deploying VPC probe servers in {tns}"));
        let (reused, created) = ensure_servers(&api, &servers, &args.image, args.timeout()).await?;
        step.done(&format!(
            "reused [{}], created [{}]",
            reused.join(", "),
            created.join(", ")
        ));
        echoes.push((t, tns, api, servers));
    }
    let mut addrs: HashMap<(Tenant, &str), std::net::IpAddr> = HashMap::new();
    for (t, tns, api, servers) in &echoes {
        let names: Vec<&str> = servers.iter().map(|s| s.name).collect();
        let step = Step::start(format!(
            "waiting for pods {} in {tns} to be Ready with a VPC address",
            names.join(", ")
        ));
        let waited = wait_for(api, &names, args.timeout(), ready_in_vpc).await?;
        if !waited.pending.is_empty() {
            waited.print_pending("Ready with a VPC address", args.timeout());
            return Err(ConnectivityError::Timeout {
                what: format!(
                    "pods {} in {tns} to be Ready with a VPC address",
                    waited.pending_names()
                ),
                waited: args.timeout(),
                hint: format!(
                    "a VPC pod gets its address at CNI ADD (the agent stamps \
                     {}); the state above shows the CNI error if the attach failed",
                    cozyplane_api::labels::ANNOTATION_VPC_IP
                ),
            });
        }
        let mut shown = Vec::new();
        for (name, pod) in &waited.done {
            if let Some(ip) = tenancy::vpc_ip(pod) {
                addrs.insert((*t, servers_name(servers, name)), ip);
                shown.push(format!("{}={ip}", t.answer(name)));
            }
        }
        shown.sort();
        step.done(&shown.join(", "));
    }
    let sg_api = deploy_sg_server(client, args, node_b.unwrap_or(node_a)).await?;
    let echoes_of = |t: Tenant| -> Result<VpcEchoes, ConnectivityError> {
        let a = addrs.get(&(t, "echo-a")).copied().ok_or_else(|| {
            ConnectivityError::Pods(format!("{} has no VPC address", t.answer("echo-a")))
        })?;
        Ok(VpcEchoes {
            echo_a: a,
            echo_b: addrs.get(&(t, "echo-b")).copied(),
            echo_c: addrs.get(&(t, "echo-c")).copied(),
        })
    };
    Ok(TenancyLayout {
        t1: echoes_of(Tenant::T1)?,
        t2: echoes_of(Tenant::T2)?,
        t3: echoes_of(Tenant::T3)?,
        sg_api,
    })
}

/// The security-group rows' groups and their policed server `sg-api` (always fresh);
/// returns its VPC address once it is Ready, which needs its kubelet's probe to pass.
async fn deploy_sg_server(
    client: &Client,
    args: &TestArgs,
    node: &NodeInfo,
) -> Result<std::net::IpAddr, ConnectivityError> {
    let base = args.namespace.as_str();
    let tns = Tenant::T1.namespace(base);
    let step = Step::start(format!(
        "SecurityGroups api and web in {tns}, pod {} (group api)",
        tenancy::SG_API
    ));
    let groups: Api<SecurityGroup> = Api::namespaced(client.clone(), &tns);
    for want in tenancy::security_groups(base) {
        let name = want.metadata.name.clone().unwrap_or_default();
        let have = create_or_get(&groups, &want, &name)
            .await
            .map_err(tenancy_err(format!("creating SecurityGroup {tns}/{name}")))?;
        if have.spec != want.spec {
            let mut fixed = want.clone();
            fixed.metadata.resource_version = have.metadata.resource_version.clone();
            groups
                .replace(&name, &PostParams::default(), &fixed)
                .await
                .map_err(tenancy_err(format!("updating SecurityGroup {tns}/{name}")))?;
        }
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &tns);
    delete_and_wait(&api, &[tenancy::SG_API], args.timeout()).await?;
    let mut pod = pods::server_pod(&tenancy::sg_server(base, &node.name), &args.image);
    tenancy::join_group(&mut pod, "api");
    api.create(&PostParams::default(), &pod)
        .await
        .map_err(api_err(format!("creating pod {tns}/{}", tenancy::SG_API)))?;
    let waited = wait_for(&api, &[tenancy::SG_API], args.timeout(), ready_in_vpc).await?;
    let ip = waited.done.get(tenancy::SG_API).and_then(tenancy::vpc_ip);
    let Some(ip) = ip else {
        waited.print_pending("Ready with a VPC address", args.timeout());
        return Err(ConnectivityError::Timeout {
            what: format!(
                "pod {tns}/{} to be Ready with a VPC address",
                tenancy::SG_API
            ),
            waited: args.timeout(),
            hint: "it is in SecurityGroup api, which admits only TCP 8000 from group web: \
                   its kubelet's readiness probe must still pass (the node's bridged flows \
                   are exempt); check the agent's log on its node"
                .into(),
        });
    };
    step.done(&format!("{}={ip}", Tenant::T1.answer(tenancy::SG_API)));
    Ok(ip)
}

/// Creates the binding, or checks the one there.
async fn ensure_binding(client: &Client, want: &VPCBinding) -> Result<(), ConnectivityError> {
    let ns = want.metadata.namespace.clone().unwrap_or_default();
    let api: Api<VPCBinding> = Api::namespaced(client.clone(), &ns);
    let have = create_or_get(&api, want, tenancy::VPC_NAME)
        .await
        .map_err(tenancy_err(format!(
            "creating VPCBinding {ns}/{}",
            tenancy::VPC_NAME
        )))?;
    match tenancy::binding_mismatch(&have, want) {
        Some(why) => Err(ConnectivityError::Tenancy(why)),
        None => Ok(()),
    }
}

/// Creates the peering half, or checks the one there.
async fn ensure_peering(client: &Client, want: &VPCPeering) -> Result<(), ConnectivityError> {
    let ns = want.metadata.namespace.clone().unwrap_or_default();
    let api: Api<VPCPeering> = Api::namespaced(client.clone(), &ns);
    let have = create_or_get(&api, want, tenancy::PEERING_NAME)
        .await
        .map_err(tenancy_err(format!(
            "creating VPCPeering {ns}/{}",
            tenancy::PEERING_NAME
        )))?;
    match tenancy::peering_mismatch(&have, want) {
        Some(why) => Err(ConnectivityError::Tenancy(why)),
        None => Ok(()),
    }
}

/// Polls the peering half in `ns` until it is Ready (`ready`) or gone (`!ready`).
async fn wait_peering(
    client: &Client,
    ns: &str,
    deadline: Instant,
    timeout: Duration,
    ready: bool,
) -> Result<(), ConnectivityError> {
    let api: Api<VPCPeering> = Api::namespaced(client.clone(), ns);
    loop {
        let p = api
            .get_opt(tenancy::PEERING_NAME)
            .await
            .map_err(api_err(format!(
                "reading VPCPeering {ns}/{}",
                tenancy::PEERING_NAME
            )))?;
        let done = if ready {
            p.as_ref().is_some_and(tenancy::peering_ready)
        } else {
            p.is_none()
        };
        if done {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ConnectivityError::Timeout {
                what: format!(
                    "VPCPeering {ns}/{} to be {}",
                    tenancy::PEERING_NAME,
                    if ready { "Ready" } else { "gone" }
                ),
                waited: timeout,
                hint: format!(
                    "kubectl -n {ns} describe vpcpeering {} shows its conditions (PeerMatched, \
                     VPCReady, PeerVPCReady, CIDRsDisjoint: --tenancy-peer-cidr must not overlap \
                     --tenancy-cidr); is the cozyplane controller running?",
                    tenancy::PEERING_NAME
                ),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The object a stream phase takes away and gives back.
enum Revocable {
    /// A VPCBinding (the revoked group).
    Binding(VPCBinding),
    /// A VPCPeering half (the peered group).
    Peering(VPCPeering),
}

impl Revocable {
    fn ns(&self) -> String {
        match self {
            Revocable::Binding(b) => b.metadata.namespace.clone(),
            Revocable::Peering(p) => p.metadata.namespace.clone(),
        }
        .unwrap_or_default()
    }

    fn name(&self) -> &'static str {
        match self {
            Revocable::Binding(_) => tenancy::VPC_NAME,
            Revocable::Peering(_) => tenancy::PEERING_NAME,
        }
    }

    /// `VPCBinding <ns>-revoke/net`.
    fn what(&self) -> String {
        let kind = match self {
            Revocable::Binding(_) => "VPCBinding",
            Revocable::Peering(_) => "VPCPeering",
        };
        format!("{kind} {}/{}", self.ns(), self.name())
    }

    async fn delete(&self, client: &Client) -> Result<(), ConnectivityError> {
        let (ns, name) = (self.ns(), self.name());
        let res = match self {
            Revocable::Binding(_) => Api::<VPCBinding>::namespaced(client.clone(), &ns)
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ()),
            Revocable::Peering(_) => Api::<VPCPeering>::namespaced(client.clone(), &ns)
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ()),
        };
        match res {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(tenancy_err(format!("deleting {}", self.what()))(e)),
        }
    }

    /// Waits until it is gone (a binding's finalizer reaps its Ports first).
    async fn wait_gone(&self, client: &Client, timeout: Duration) -> Result<(), ConnectivityError> {
        let (ns, name) = (self.ns(), self.name());
        let deadline = Instant::now() + timeout;
        loop {
            let there = match self {
                Revocable::Binding(_) => Api::<VPCBinding>::namespaced(client.clone(), &ns)
                    .get_opt(name)
                    .await
                    .map(|o| o.is_some()),
                Revocable::Peering(_) => Api::<VPCPeering>::namespaced(client.clone(), &ns)
                    .get_opt(name)
                    .await
                    .map(|o| o.is_some()),
            }
            .map_err(api_err(format!("reading {}", self.what())))?;
            if !there {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ConnectivityError::Timeout {
                    what: format!("{} to be gone after its delete", self.what()),
                    waited: timeout,
                    hint: format!(
                        "a finalizer holds it: kubectl -n {ns} get {} {name} -o yaml shows which; \
                         is the cozyplane controller running?",
                        match self {
                            Revocable::Binding(_) => "vpcbinding",
                            Revocable::Peering(_) => "vpcpeering",
                        }
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn create(&self, client: &Client) -> Result<(), ConnectivityError> {
        match self {
            Revocable::Binding(b) => ensure_binding(client, b).await,
            Revocable::Peering(p) => ensure_peering(client, p).await,
        }
    }
}

/// One stream phase: who streams where, and what is taken away under it.
struct StreamPhase {
    /// The stream client's namespace and pod name.
    ns: String,
    pod: &'static str,
    /// Its `sdn.cozystack.io/vpc` annotation.
    vpc: String,
    /// The server's stream address and name.
    target: std::net::SocketAddr,
    expect: String,
    /// Reconnect attempts after the cut: for how long, and whether the first success ends them.
    hold_ms: u64,
    stop_on_reconnect: bool,
    /// Taken away once the stream is up, given back `give_back_after` after the delete.
    object: Revocable,
    give_back_after: Duration,
}

/// What a stream phase saw.
struct StreamRun {
    window: tenancy::Window,
    /// The report, or why there is none.
    report: Result<StreamReport, String>,
    /// The pod as read `give_back_after` after the delete, and its uid when it was Ready.
    pod_after: Option<Pod>,
    uid: Option<String>,
}

/// Starts the stream client, waits until it streams, deletes the object, reads the pod,
/// re-creates the object, and waits for the client's report.
async fn stream_phase(
    client: &Client,
    args: &TestArgs,
    node: &NodeInfo,
    ph: &StreamPhase,
) -> Result<Result<StreamRun, String>, ConnectivityError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &ph.ns);
    delete_and_wait(&api, &[ph.pod], args.timeout()).await?;
    let cap = |ms: u64| ms.min(cozyplane_probe::plan::MAX_TIMEOUT_MS);
    let timeout_ms = args.timeout.saturating_mul(1000);
    let spec = StreamSpec {
        target: ph.target.to_string(),
        expect: ph.expect.clone(),
        interval_ms: tenancy::STREAM_INTERVAL_MS,
        echo_timeout_ms: tenancy::ECHO_TIMEOUT_MS,
        connect_timeout_ms: cap(timeout_ms),
        max_stream_ms: cap(timeout_ms.saturating_add(60_000)),
        hold_ms: ph.hold_ms,
        reconnect_every_ms: tenancy::RECONNECT_EVERY_MS,
        stop_on_reconnect: ph.stop_on_reconnect,
        ready_port: Some(crate::matrix::STREAM_READY_PORT),
    };
    let json = spec.to_json().map_err(ConnectivityError::Plan)?;
    let pod = pods::stream_pod(ph.pod, &node.name, &ph.vpc, &args.image, &json);
    api.create(&PostParams::default(), &pod)
        .await
        .map_err(api_err(format!("creating pod {}/{}", ph.ns, ph.pod)))?;
    let waited = wait_for(&api, &[ph.pod], args.timeout(), state::running_ready).await?;
    let Some(up) = waited.done.get(ph.pod) else {
        let pod = waited.pending.first().and_then(|(_, p)| p.clone());
        let report = pod.as_ref().and_then(stream_report);
        let why = match report {
            Some(r) => r
                .error
                .unwrap_or_else(|| "it ended without streaming".into()),
            None => describe_opt(ph.pod, pod.as_ref()),
        };
        return Ok(Err(format!(
            "the stream never came up within {}s: {why}",
            args.timeout
        )));
    };
    let uid = up.metadata.uid.clone();
    // A few echoes before the cut, so "up" is not a single lucky exchange.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let issued = now_ms();
    ph.object.delete(client).await?;
    let returned = now_ms();
    tokio::time::sleep(ph.give_back_after).await;
    let pod_after = api
        .get_opt(ph.pod)
        .await
        .map_err(api_err(format!("reading pod {}/{}", ph.ns, ph.pod)))?;
    // A failure to give the object back is the rows' failure, not the run's: the matrix
    // still prints (the next run creates the object again).
    let back = match ph.object.wait_gone(client, args.timeout()).await {
        Ok(()) => ph.object.create(client).await,
        Err(e) => Err(e),
    };
    if let Err(e) = back {
        let _ = api.delete(ph.pod, &DeleteParams::default()).await;
        return Ok(Err(format!(
            "could not re-create {}: {}",
            ph.object.what(),
            cozyplane_errors::Chain(&e)
        )));
    }
    let recreated = now_ms();
    let window = tenancy::Window {
        issued,
        returned,
        recreated: Some(recreated),
    };
    // The client holds for hold_ms after its cut, which came before the re-create.
    let wait = Duration::from_millis(
        recreated.saturating_sub(returned) + ph.hold_ms + tenancy::ECHO_TIMEOUT_MS,
    ) + Duration::from_secs(10);
    let done = wait_for(&api, &[ph.pod], wait, state::finished).await?;
    let report = match done.done.get(ph.pod) {
        Some(p) => stream_report(p)
            .ok_or_else(|| format!("the stream client gave no report: {}", state::describe(p))),
        None => {
            // Still streaming: never cut. It would stream on for minutes; stop it.
            let _ = api.delete(ph.pod, &DeleteParams::default()).await;
            Err(format!(
                "the stream client was still running {}s after {} was deleted: the stream \
                 was never cut",
                Duration::from_millis(now_ms().saturating_sub(returned)).as_secs(),
                ph.object.what()
            ))
        }
    };
    Ok(Ok(StreamRun {
        window,
        report,
        pod_after,
        uid,
    }))
}

/// The stream report in a finished pod's termination message.
fn stream_report(pod: &Pod) -> Option<StreamReport> {
    state::terminated(pod)
        .and_then(|t| t.message.as_deref())?
        .lines()
        .rev()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| StreamReport::parse(l).ok())
}

/// An outcome of a judged row.
fn judged_outcome(id: &str, j: tenancy::Judged) -> Outcome {
    Outcome {
        id: id.into(),
        ok: j.ok,
        ms: j.ms,
        answer: j.ok.then(|| j.text.clone()),
        error: (!j.ok).then_some(j.text),
    }
}

/// Fails every row of a phase with one reason.
fn all_failed(ids: &[&str], why: &str) -> ClientResult {
    ClientResult::Report(Report {
        results: ids
            .iter()
            .map(|id| {
                judged_outcome(
                    id,
                    tenancy::Judged {
                        ok: false,
                        ms: 0.0,
                        text: why.to_string(),
                    },
                )
            })
            .collect(),
    })
}

/// The peered group's stream: `peer-stream` (t1) → t3's far server; t3's half is deleted
/// under it and re-created.
async fn peered_phase(
    client: &Client,
    args: &TestArgs,
    node_a: &NodeInfo,
    t: &TenancyLayout,
) -> Result<ClientResult, ConnectivityError> {
    const IDS: [&str; 2] = [
        "tenancy/peered/half-deleted",
        "tenancy/peered/half-restored",
    ];
    let base = args.namespace.as_str();
    let (server, ip) = match t.t3.echo_b {
        Some(b) => ("echo-b", b),
        None => ("echo-a", t.t3.echo_a),
    };
    let half = tenancy::peering(Tenant::T3, Tenant::T1, base);
    let ph = StreamPhase {
        ns: Tenant::T1.namespace(base),
        pod: tenancy::PEER_STREAM,
        vpc: Tenant::T1.vpc_annotation(base),
        target: std::net::SocketAddr::new(ip, crate::matrix::STREAM_PORT),
        expect: Tenant::T3.answer(server),
        hold_ms: tenancy::PEER_HOLD_MS,
        stop_on_reconnect: true,
        object: Revocable::Peering(half),
        give_back_after: Duration::from_millis(tenancy::UNPEER_DEADLINE_MS + 500),
    };
    let step = Step::start(format!(
        "peered: streaming t1 → {} ({}), deleting and re-creating {}",
        Tenant::T3.answer(server),
        ph.target,
        ph.object.what()
    ));
    let run = stream_phase(client, args, node_a, &ph).await?;
    // Live again for the next run (and for whoever looks at the cluster afterwards).
    // Not fatal: the half-restored row already says whether traffic came back.
    let deadline = Instant::now() + args.timeout();
    for t in [Tenant::T1, Tenant::T3] {
        if let Err(e) =
            wait_peering(client, &t.namespace(base), deadline, args.timeout(), true).await
        {
            println!("! {e}");
        }
    }
    let run = match run {
        Ok(r) => r,
        Err(why) => {
            step.done(&why);
            return Ok(all_failed(&IDS, &why));
        }
    };
    let what = ph.object.what();
    let results = match &run.report {
        Ok(r) => {
            let mut cut = tenancy::cut_verdict(r, &run.window, tenancy::UNPEER_DEADLINE_MS, &what);
            if let Some(why) = tenancy::no_reconnect_before(r, &run.window, &what) {
                cut.ok = false;
                cut.text = format!("{}; but {why}", cut.text);
            }
            let back = tenancy::comes_back_verdict(r, &run.window, &what);
            vec![judged_outcome(IDS[0], cut), judged_outcome(IDS[1], back)]
        }
        Err(why) => {
            step.done(why);
            return Ok(all_failed(&IDS, why));
        }
    };
    step.done("");
    Ok(ClientResult::Report(Report { results }))
}

/// The revoked group: `stream-client` (`<ns>-revoke`, t1's VPC) → t1's far server; that
/// namespace's binding is deleted under it and re-created.
async fn revoked_phase(
    client: &Client,
    args: &TestArgs,
    node_a: &NodeInfo,
    t: &TenancyLayout,
) -> Result<ClientResult, ConnectivityError> {
    const IDS: [&str; 3] = [
        "tenancy/revoked/stream-cut",
        "tenancy/revoked/pod-running",
        "tenancy/revoked/no-reconnect",
    ];
    let base = args.namespace.as_str();
    let (server, ip) = match t.t1.echo_b {
        Some(b) => ("echo-b", b),
        None => ("echo-a", t.t1.echo_a),
    };
    let ph = StreamPhase {
        ns: tenancy::revoke_namespace(base),
        pod: tenancy::REVOKE_STREAM,
        vpc: Tenant::T1.vpc_annotation(base),
        target: std::net::SocketAddr::new(ip, crate::matrix::STREAM_PORT),
        expect: Tenant::T1.answer(server),
        hold_ms: tenancy::REVOKE_HOLD_MS,
        stop_on_reconnect: false,
        object: Revocable::Binding(tenancy::revoke_binding(base)),
        give_back_after: Duration::from_millis(tenancy::REVOKE_DEADLINE_MS + 500),
    };
    let step = Step::start(format!(
        "revoked: streaming {}/{} → {} ({}), deleting and re-creating {}",
        ph.ns,
        ph.pod,
        Tenant::T1.answer(server),
        ph.target,
        ph.object.what()
    ));
    let run = match stream_phase(client, args, node_a, &ph).await? {
        Ok(r) => r,
        Err(why) => {
            step.done(&why);
            return Ok(all_failed(&IDS, &why));
        }
    };
    let running = tenancy::still_running_verdict(run.pod_after.as_ref(), run.uid.as_deref());
    let results = match &run.report {
        Ok(r) => vec![
            judged_outcome(
                IDS[0],
                tenancy::cut_verdict(
                    r,
                    &run.window,
                    tenancy::REVOKE_DEADLINE_MS,
                    &ph.object.what(),
                ),
            ),
            judged_outcome(IDS[1], running),
            judged_outcome(
                IDS[2],
                tenancy::stays_cut_verdict(r, &run.window, tenancy::STAYS_CUT_MS),
            ),
        ],
        Err(why) => vec![
            judged_outcome(
                IDS[0],
                tenancy::Judged {
                    ok: false,
                    ms: 0.0,
                    text: why.clone(),
                },
            ),
            judged_outcome(IDS[1], running),
            judged_outcome(
                IDS[2],
                tenancy::Judged {
                    ok: false,
                    ms: 0.0,
                    text: why.clone(),
                },
            ),
        ],
    };
    step.done("");
    Ok(ClientResult::Report(Report { results }))
}

/// The static name of a server (the map keys borrow it).
fn servers_name(servers: &[ServerPod], name: &str) -> &'static str {
    servers
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.name)
        .unwrap_or("")
}

/// Ready, and its VPC address stamped by the agent.
fn ready_in_vpc(p: &Pod) -> bool {
    state::running_ready(p) && tenancy::vpc_ip(p).is_some()
}

/// Judges the unbound pod: `tenancy/no-binding` (it never starts, and its status or an
/// event names the missing binding) and `tenancy/no-binding/event` (a Warning event says
/// so, as `kubectl describe pod` shows it). Waits for both up to `timeout`.
async fn judge_unbound(
    client: &Client,
    base: &str,
    timeout: Duration,
) -> Result<Vec<Outcome>, ConnectivityError> {
    let uns = tenancy::unbound_namespace(base);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &uns);
    let events: Api<Event> = Api::namespaced(client.clone(), &uns);
    let t0 = Instant::now();
    let outcome = |id: &str, ok: bool, text: String| Outcome {
        id: id.into(),
        ok,
        ms: t0.elapsed().as_secs_f64() * 1000.0,
        answer: ok.then(|| cozyplane_probe::plan::truncate_chars(&text, 200)),
        error: (!ok).then_some(text),
    };
    const ROW: &str = "tenancy/no-binding";
    const EVENT_ROW: &str = "tenancy/no-binding/event";
    let mut verdict: Option<Outcome> = None;
    loop {
        let pod = pods
            .get_opt(tenancy::UNBOUND)
            .await
            .map_err(api_err(format!("reading pod {uns}/{}", tenancy::UNBOUND)))?;
        let Some(pod) = pod else {
            let gone = format!("pod {uns}/{} is gone", tenancy::UNBOUND);
            return Ok(vec![
                outcome(ROW, false, gone.clone()),
                outcome(EVENT_ROW, false, gone),
            ]);
        };
        // A cluster that does not serve events fails only the event row.
        let uid = pod.metadata.uid.clone();
        let (listed, listing_error) = match events.list(&ListParams::default()).await {
            Ok(list) => (list.items, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        let messages: Vec<String> = listed
            .iter()
            .filter(|e| e.involved_object.uid.is_some() && e.involved_object.uid == uid)
            .filter_map(|e| e.message.clone())
            .collect();
        let event = tenancy::no_binding_event(base, uid.as_deref(), &listed);
        if verdict.is_none() {
            verdict = match tenancy::no_binding_verdict(base, &pod, &messages) {
                NoBinding::Refused(text) => Some(outcome(ROW, true, text)),
                NoBinding::Started(why) => Some(outcome(ROW, false, why)),
                NoBinding::Pending => None,
            };
        }
        let late = t0.elapsed() >= timeout;
        match (&verdict, event) {
            (Some(v), Some(ev)) => return Ok(vec![v.clone(), outcome(EVENT_ROW, true, ev)]),
            (Some(v), None) if late || !v.ok => {
                let why = format!(
                    "no Warning {} event on pod {uns}/{} names the missing binding (\"{}\") \
                     within {}s{}",
                    tenancy::FAILED_CREATE_POD_SANDBOX,
                    tenancy::UNBOUND,
                    tenancy::no_binding_message(base),
                    timeout.as_secs(),
                    listing_error
                        .map(|e| format!(" (listing events: {e})"))
                        .unwrap_or_default()
                );
                return Ok(vec![v.clone(), outcome(EVENT_ROW, false, why)]);
            }
            (None, _) if late => {
                let why = format!(
                    "no status or event named the missing binding (\"{}\") within {}s: {}",
                    tenancy::no_binding_message(base),
                    timeout.as_secs(),
                    state::describe(&pod)
                );
                return Ok(vec![
                    outcome(ROW, false, why.clone()),
                    outcome(EVENT_ROW, false, why),
                ]);
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

/// The blocked ICMP rows whose target a pod of the client's own VPC holds (known only
/// once the clients ran): their echo reply is that pod's ([`tenancy::own_holder_outcome`]).
async fn rejudge_own_holders(
    client: &Client,
    base: &str,
    m: &matrix::Matrix,
    results: &mut HashMap<Runner, ClientResult>,
) -> Result<(), ConnectivityError> {
    let mut vpc_pods = Vec::new();
    for pns in Tenant::ALL
        .map(|t| t.namespace(base))
        .into_iter()
        .chain([tenancy::revoke_namespace(base)])
    {
        let api: Api<Pod> = Api::namespaced(client.clone(), &pns);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(api_err(format!("listing pods in {pns}")))?;
        vpc_pods.extend(list.items);
    }
    for c in &m.checks {
        let Some(t) = c.runner.vpc_tenant() else {
            continue;
        };
        let Some(ClientResult::Report(r)) = results.get_mut(&c.runner) else {
            continue;
        };
        let holders = tenancy::vpc_holders(&vpc_pods, &t.vpc_annotation(base));
        for o in r.results.iter_mut().filter(|o| o.id == c.id) {
            if let Some(judged) = tenancy::own_holder_outcome(c, o, &holders) {
                *o = judged;
            }
        }
    }
    Ok(())
}

/// Creates `obj`, or reads the one already there.
/// Makes (or finds) the services group's Services and reads back what the API server
/// allocated: `svc-echo-a` (externalTrafficPolicy Local) over `echo-a`, and with two
/// nodes `svc-echo-b` (Cluster) over `echo-b`; each NodePort with the pod's ports.
async fn ensure_services(
    client: &Client,
    ns: &str,
    two_nodes: bool,
) -> Result<matrix::ServicesLayout, ConnectivityError> {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let mut made = Vec::new();
    let names: &[(&str, &str, &str)] = if two_nodes {
        &[
            ("svc-echo-a", "echo-a", "Local"),
            ("svc-echo-b", "echo-b", "Cluster"),
        ]
    } else {
        &[("svc-echo-a", "echo-a", "Local")]
    };
    for &(name, pod, etp) in names {
        let svc = pods::echo_service(name, pod, etp);
        let got = create_or_get(&api, &svc, name)
            .await
            .map_err(api_err(format!("creating Service {ns}/{name}")))?;
        made.push(svc_addrs(&got).ok_or_else(|| {
            ConnectivityError::Pods(format!(
                "Service {ns}/{name} has no ClusterIP or nodePorts: the API server did not \
                 allocate them"
            ))
        })?);
    }
    Ok(matrix::ServicesLayout {
        a: made[0],
        b: made.get(1).copied(),
    })
}

/// The ClusterIP and the TCP / UDP / HTTP nodePorts of an echo Service.
fn svc_addrs(svc: &Service) -> Option<matrix::SvcAddrs> {
    let spec = svc.spec.as_ref()?;
    let cluster_ip = spec.cluster_ip.as_deref()?.parse().ok()?;
    let port = |name: &str| -> Option<u16> {
        let p = spec
            .ports
            .as_ref()?
            .iter()
            .find(|p| p.name.as_deref() == Some(name))?;
        u16::try_from(p.node_port?).ok().filter(|&p| p != 0)
    };
    Some(matrix::SvcAddrs {
        cluster_ip,
        tcp_node_port: port("tcp")?,
        udp_node_port: port("udp")?,
        http_node_port: port("http")?,
    })
}

async fn create_or_get<K>(api: &Api<K>, obj: &K, name: &str) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(o) => Ok(o),
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(name).await,
        Err(e) => Err(e),
    }
}

/// The policy group's NetworkPolicies in `ns` (`--policy`): `echo-policy`
/// isolated for ingress, then opened to `policy-client` on the echo port,
/// TCP and UDP. Selected by the probe role label every pod of the test has.
pub fn policy_objects(ns: &str) -> [NetworkPolicy; 2] {
    use k8s_openapi::api::networking::v1::{
        NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    let role = |v: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([(
            pods::ROLE_LABEL.to_string(),
            v.to_string(),
        )])),
        ..LabelSelector::default()
    };
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..ObjectMeta::default()
    };
    let port = |proto: &str| NetworkPolicyPort {
        protocol: Some(proto.into()),
        port: Some(IntOrString::Int(i32::from(matrix::POD_ECHO_PORT))),
        end_port: None,
    };
    [
        NetworkPolicy {
            metadata: meta("cozyplane-connectivity-deny"),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(role(matrix::POLICY_ECHO)),
                policy_types: Some(vec!["Ingress".into()]),
                ..NetworkPolicySpec::default()
            }),
        },
        NetworkPolicy {
            metadata: meta("cozyplane-connectivity-allow"),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(role(matrix::POLICY_ECHO)),
                ingress: Some(vec![NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        pod_selector: Some(role(matrix::POLICY_CLIENT)),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: Some(vec![port("TCP"), port("UDP")]),
                }]),
                ..NetworkPolicySpec::default()
            }),
        },
    ]
}

/// Creates (or replaces) the policy group's NetworkPolicies.
async fn ensure_policies(client: &Client, ns: &str) -> Result<(), ConnectivityError> {
    let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    for p in policy_objects(ns) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let action = format!("creating NetworkPolicy {ns}/{name}");
        match api.create(&PostParams::default(), &p).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let mut want = p.clone();
                let have = api.get(&name).await.map_err(api_err(action.clone()))?;
                want.metadata.resource_version = have.metadata.resource_version;
                api.replace(&name, &PostParams::default(), &want)
                    .await
                    .map_err(api_err(action))?;
            }
            Err(e) => return Err(api_err(action)(e)),
        }
    }
    Ok(())
}

/// Maps a refusal (403) to the error naming the rights `--tenancy` needs.
fn tenancy_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ConnectivityError {
    let action = action.into();
    move |source| match &source {
        kube::Error::Api(s) if s.code == 403 => {
            ConnectivityError::TenancyForbidden { action, source }
        }
        _ => ConnectivityError::Api { action, source },
    }
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
