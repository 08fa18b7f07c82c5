//! `cozyplane policy explain`: which policies decide a flow between two
//! endpoints (a pod, a node, or any address), read from the API server and
//! compiled as the nodes' agents compile them
//! ([`crate::compile::netpol::explain`], `docs/policy.md`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use cozyplane_api::cilium::{CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy};
use cozyplane_api::HostFirewall;
use cozyplane_datapath::abi::{NP_EGRESS, NP_INGRESS};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::compile::netpol::explain::{explain, SideExplanation, Subject};
use crate::compile::netpol::{members_of_pods, pod_ips, NpHosts, PolicyInput};
use crate::compile::services::node_addresses;

/// `cozyplane policy`.
#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    /// What to do.
    #[command(subcommand)]
    pub cmd: PolicyCmd,
}

/// The `cozyplane policy` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCmd {
    /// Which NetworkPolicies, Cilium policies and HostFirewalls isolate,
    /// admit or deny a new flow from one endpoint to another, on each side.
    Explain(ExplainArgs),
}

/// `cozyplane policy explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The source: `<namespace>/<pod>`, or an address (a node's: its firewall).
    #[arg(long)]
    pub from: String,
    /// The destination: `<namespace>/<pod>`, or an address.
    #[arg(long)]
    pub to: String,
    /// Destination port.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// TCP, UDP, SCTP or ICMP.
    #[arg(long, default_value = "TCP")]
    pub protocol: String,
    /// The pod network, as the agents' `--cluster-cidr` (Cilium's `world`).
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cluster_cidr: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Why `policy explain` failed.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The kubeconfig could not be used.
    #[error("cannot use the kubeconfig")]
    Config(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A request failed.
    #[error("{what}")]
    Api {
        /// What was asked.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// Bad input.
    #[error("{0}")]
    Invalid(String),
}

/// An endpoint of the flow.
#[derive(Debug, Clone)]
struct End {
    /// What the user named, for the output.
    name: String,
    ip: IpAddr,
    /// The pod's node, or the node whose address it is.
    node: Option<String>,
    /// A pod (else an address, maybe a node's).
    pod: bool,
}

/// The flow explained, both sides.
#[derive(Debug, serde::Serialize)]
struct Explanation {
    from: String,
    to: String,
    protocol: String,
    port: u16,
    allowed: bool,
    sides: Vec<(String, SideExplanation)>,
    notes: Vec<String>,
}

async fn list<K>(client: &Client, what: &'static str) -> Result<Vec<K>, ExplainError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| ExplainError::Api { what, source })
}

/// Runs `cozyplane policy`.
pub async fn run(args: PolicyArgs) -> Result<(), ExplainError> {
    let PolicyCmd::Explain(a) = args.cmd;
    let proto: u8 = match a.protocol.to_ascii_uppercase().as_str() {
        "TCP" => 6,
        "UDP" => 17,
        "SCTP" => 132,
        "ICMP" => 1,
        other => return Err(ExplainError::Invalid(format!("unknown protocol {other:?}"))),
    };
    let cluster_cidrs: Vec<ipnet::IpNet> = a
        .cluster_cidr
        .split(',')
        .map(|c| {
            c.trim()
                .parse()
                .map_err(|_| ExplainError::Invalid(format!("--cluster-cidr: {c:?} is no CIDR")))
        })
        .collect::<Result<_, _>>()?;
    let config = match &a.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| ExplainError::Config(Box::new(e)))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ExplainError::Config(Box::new(e)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ExplainError::Config(Box::new(e)))?,
    };
    let client = Client::try_from(config).map_err(|e| ExplainError::Config(Box::new(e)))?;

    let pods: Vec<Pod> = list(&client, "list pods").await?;
    let namespaces: Vec<Namespace> = list(&client, "list namespaces").await?;
    let nodes: Vec<Node> = list(&client, "list nodes").await?;
    let policies: Vec<NetworkPolicy> = list(&client, "list networkpolicies").await?;
    let firewalls: Vec<HostFirewall> = list(&client, "list hostfirewalls").await?;
    let (cnps, ccnps): (
        Vec<CiliumNetworkPolicy>,
        Vec<CiliumClusterwideNetworkPolicy>,
    ) = if crate::runtime::watch::serves_cilium(&client).await {
        (
            list(&client, "list ciliumnetworkpolicies").await?,
            list(&client, "list ciliumclusterwidenetworkpolicies").await?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let apiserver: Vec<IpAddr> = Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels("kubernetes.io/service-name=kubernetes"))
        .await
        .map_err(|source| ExplainError::Api {
            what: "list the kubernetes Service's EndpointSlices",
            source,
        })?
        .items
        .iter()
        .flat_map(|s| {
            s.endpoints
                .iter()
                .flatten()
                .flat_map(|e| e.addresses.iter())
        })
        .filter_map(|a| a.parse().ok())
        .collect();

    let node_of_addr: BTreeMap<IpAddr, String> = nodes
        .iter()
        .flat_map(|n| {
            let name = n.metadata.name.clone().unwrap_or_default();
            node_addresses(n)
                .into_iter()
                .map(move |ip| (ip, name.clone()))
        })
        .collect();
    let resolve = |s: &str| -> Result<End, ExplainError> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(End {
                name: s.to_string(),
                ip,
                node: node_of_addr.get(&ip).cloned(),
                pod: false,
            });
        }
        let (ns, name) = s.split_once('/').ok_or_else(|| {
            ExplainError::Invalid(format!("{s:?} is neither <namespace>/<pod> nor an address"))
        })?;
        let pod = pods
            .iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata.name.as_deref() == Some(name)
            })
            .ok_or_else(|| ExplainError::Invalid(format!("no pod {s}")))?;
        let ip = *pod_ips(pod).first().ok_or_else(|| {
            ExplainError::Invalid(format!("pod {s} has no address on the pod network"))
        })?;
        Ok(End {
            name: s.to_string(),
            ip,
            node: pod.spec.as_ref().and_then(|sp| sp.node_name.clone()),
            pod: true,
        })
    };
    let (from, to) = (resolve(&a.from)?, resolve(&a.to)?);

    let input = PolicyInput {
        network_policies: &policies,
        cilium: &cnps,
        cilium_clusterwide: &ccnps,
        host_firewalls: &firewalls,
    };
    let all_nodes: Vec<IpAddr> = node_of_addr.keys().copied().collect();
    // one side: the subject `me` on its node, the peer `other`
    let side = |me: &End, other: &End, dir: u8| -> Option<(String, SideExplanation)> {
        let node = me.node.clone()?;
        let subject = if me.pod {
            Subject::Pod(me.ip)
        } else {
            Subject::Host
        };
        let hosts = NpHosts {
            nodes: all_nodes.clone(),
            local_node: node_of_addr
                .iter()
                .filter(|(_, n)| **n == node)
                .map(|(ip, _)| *ip)
                .collect(),
            cluster_cidrs: cluster_cidrs.clone(),
            apiserver: apiserver.clone(),
            node_labels: nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
                .and_then(|n| n.metadata.labels.clone())
                .unwrap_or_default(),
        };
        let members = members_of_pods(&pods, &node);
        let what = if me.pod {
            format!(
                "{} of pod {} (node {node})",
                if dir == NP_INGRESS {
                    "ingress"
                } else {
                    "egress"
                },
                me.name
            )
        } else {
            format!(
                "{} of node {node} (host firewall)",
                if dir == NP_INGRESS {
                    "ingress"
                } else {
                    "egress"
                }
            )
        };
        let e = explain(
            input,
            &members,
            &namespaces,
            &hosts,
            subject,
            other.ip,
            dir,
            proto,
            a.port,
        );
        Some((what, e))
    };
    let mut notes = Vec::new();
    let mut sides = Vec::new();
    let own_probe = !from.pod && to.pod && from.node.is_some() && from.node == to.node;
    if own_probe {
        notes.push(format!(
            "{} is the node of pod {}: its own traffic into its pods (the kubelet's probes) is always admitted",
            from.name, to.name
        ));
    } else if from.node.is_some() && !from.pod && to.node.is_some() && !to.pod {
        notes.push(
            "node to node: always admitted (the host firewall exempts the other nodes)".into(),
        );
    } else {
        sides.extend(side(&from, &to, NP_EGRESS));
        sides.extend(side(&to, &from, NP_INGRESS));
    }
    if proto == 1 && sides.iter().any(|(w, _)| w.contains("host firewall")) {
        notes.push("ICMP is never judged by the host firewall".into());
    }
    let allowed = sides
        .iter()
        .all(|(w, s)| s.admitted || (proto == 1 && w.contains("host firewall")));
    let out = Explanation {
        from: format!("{} ({})", from.name, from.ip),
        to: format!("{} ({})", to.name, to.ip),
        protocol: a.protocol.to_ascii_uppercase(),
        port: a.port,
        allowed,
        sides,
        notes,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).unwrap_or_else(|_| "{}".into())
        );
        return Ok(());
    }
    println!(
        "{} {} -> {} port {}: {}",
        out.protocol,
        out.from,
        out.to,
        out.port,
        if out.allowed { "ALLOWED" } else { "DENIED" }
    );
    for (what, s) in &out.sides {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        println!(
            "  {what}: {}",
            if s.admitted { "admitted" } else { "refused" }
        );
        if s.isolated_by.is_empty() {
            println!(
                "    not isolated (no policy selects it for {})",
                s.direction
            );
        } else {
            println!("    isolated by: {}", list(&s.isolated_by));
            println!("    admitted by: {}", list(&s.admitted_by));
        }
        if !s.denied_by.is_empty() {
            println!("    denied by:   {}", list(&s.denied_by));
        }
    }
    for n in &out.notes {
        println!("  note: {n}");
    }
    Ok(())
}
