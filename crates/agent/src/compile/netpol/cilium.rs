//! The Cilium policy subset Cozystack writes (`cilium.io/v2`
//! CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy), translated into
//! the same resolved policies as NetworkPolicy, so both kinds add up in one
//! set of maps (`docs/policy.md`, "The Cilium subset").
//!
//! Cilium's semantics, as its documentation and API define them:
//! * A rule isolates the endpoints it selects per direction when it has
//!   rules (or deny rules) for that direction; `enableDefaultDeny` says
//!   otherwise explicitly. Allow rules add up across rules and policies.
//! * Selector keys may carry a source prefix (`k8s:`, `any:`); an
//!   endpoint's labels are its pod's plus `io.kubernetes.pod.namespace` and
//!   `io.cilium.k8s.namespace.labels.<key>` for each label of its
//!   namespace.
//! * A CiliumNetworkPolicy selects endpoints of its own namespace only, and
//!   its `fromEndpoints`/`toEndpoints` peers too, unless a peer selector
//!   names the namespace key or namespace labels.
//! * A rule with neither peers nor ports (`- {}`) admits nothing; ports
//!   without peers admit any peer on those ports; peers without ports, every
//!   protocol and port.
//! * Entities: `all`; `world` (anything outside the pod network, the
//!   nodes and the API server); `cluster` (the pod network and the nodes); `host` (this node);
//!   `remote-node` (the other nodes); `kube-apiserver` (the `kubernetes`
//!   Service's endpoints).
//!
//! * Deny rules (`ingressDeny`, `egressDeny`) refuse what they match over
//!   every allow (`cp_np_deny`).
//! * A clusterwide rule with `nodeSelector` is a host policy: when it
//!   selects this node, its rules are the node's own firewall's
//!   (`bpf/hostfw.h`), beside HostFirewall's.
//!
//! What is outside the subset is reported ([`NpDiagnostic::CiliumOutside`])
//! and fails closed: an unknown peer kind or an L7 rule makes its allow rule
//! admit nothing; in a deny rule, it makes the selected pods (or the node,
//! its structural exemptions and the API server aside) admit nothing in
//! that direction.

use std::collections::{BTreeMap, BTreeSet};

use cozyplane_api::cilium::{CiliumPeerRule, CiliumPort, CiliumRule};
use cozyplane_api::selector::selector_matches;
use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    Compiled, NpDiagnostic, NpHosts, Peer, PolicyInput, PortSpec, Rule, World, SCTP, TCP, UDP,
};

/// The endpoint label naming the pod's namespace.
const NS_KEY: &str = "io.kubernetes.pod.namespace";
/// The prefix of the endpoint labels carrying the namespace's labels.
const NS_LABELS: &str = "io.cilium.k8s.namespace.labels.";

const NOTHING: &str = "the rule admits nothing (fail closed)";
const BLOCKED: &str = "the selected pods admit nothing in that direction (fail closed)";
const IGNORED: &str = "ignored; it neither admits nor isolates";

/// One policy object's context.
struct Ctx<'p> {
    /// `CiliumNetworkPolicy ns/name` or `CiliumClusterwideNetworkPolicy name`.
    policy: String,
    /// The namespace of a CiliumNetworkPolicy; None for a clusterwide one.
    namespace: Option<&'p str>,
}

impl Ctx<'_> {
    fn outside(&self, diags: &mut Vec<NpDiagnostic>, field: String, effect: &'static str) {
        diags.push(NpDiagnostic::CiliumOutside {
            policy: self.policy.clone(),
            field,
            effect,
        });
    }
}

/// Appends the resolved form of every Cilium policy rule that selects a
/// local identity to `out`.
pub(super) fn compile(
    world: &World<'_>,
    input: &PolicyInput<'_>,
    local: &BTreeSet<usize>,
    hosts: &NpHosts,
    out: &mut Vec<Compiled>,
    diags: &mut Vec<NpDiagnostic>,
) {
    if input.cilium.is_empty() && input.cilium_clusterwide.is_empty() {
        return;
    }
    let labels = endpoint_labels(world);
    let policies = input
        .cilium
        .iter()
        .map(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let name = p.metadata.name.as_deref().unwrap_or_default();
            (
                Ctx {
                    policy: format!("CiliumNetworkPolicy {ns}/{name}"),
                    namespace: Some(ns),
                },
                p.spec.is_some(),
                p.rules().collect::<Vec<_>>(),
            )
        })
        .chain(input.cilium_clusterwide.iter().map(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            (
                Ctx {
                    policy: format!("CiliumClusterwideNetworkPolicy {name}"),
                    namespace: None,
                },
                p.spec.is_some(),
                p.rules().collect::<Vec<_>>(),
            )
        }));
    for (ctx, has_spec, rules) in policies {
        for (n, rule) in rules.into_iter().enumerate() {
            let at = match (has_spec, n) {
                (true, 0) => "spec".to_string(),
                (true, n) => format!("specs[{}]", n - 1),
                (false, n) => format!("specs[{n}]"),
            };
            if let Some(c) = compile_rule(world, &labels, &ctx, rule, &at, local, hosts, diags) {
                out.push(c);
            }
        }
    }
}

/// Every identity's endpoint labels: its pod's, its namespace's name and
/// its namespace's labels, as Cilium derives them.
fn endpoint_labels(world: &World<'_>) -> Vec<BTreeMap<String, String>> {
    world
        .keys
        .iter()
        .map(|k| {
            let mut l = k.labels.clone();
            l.insert(NS_KEY.to_string(), k.namespace.to_string());
            for (key, v) in world
                .ns_labels
                .get(k.namespace)
                .into_iter()
                .copied()
                .flatten()
            {
                l.insert(format!("{NS_LABELS}{key}"), v.clone());
            }
            l
        })
        .collect()
}

/// A selector with Cilium's source prefixes removed (`k8s:`, `any:`);
/// Err(key) for a key of another source (`reserved:`, `cidr:`…), which no
/// pod carries.
fn normalize(sel: &LabelSelector) -> Result<LabelSelector, String> {
    let key = |k: &str| -> Result<String, String> {
        match k.split_once(':') {
            None => Ok(k.to_string()),
            Some(("k8s" | "any", rest)) => Ok(rest.to_string()),
            Some(_) => Err(k.to_string()),
        }
    };
    let mut out = LabelSelector::default();
    if let Some(m) = &sel.match_labels {
        let mut labels = BTreeMap::new();
        for (k, v) in m {
            labels.insert(key(k)?, v.clone());
        }
        out.match_labels = Some(labels);
    }
    if let Some(exprs) = &sel.match_expressions {
        let mut v = Vec::with_capacity(exprs.len());
        for e in exprs {
            v.push(LabelSelectorRequirement {
                key: key(&e.key)?,
                ..e.clone()
            });
        }
        out.match_expressions = Some(v);
    }
    Ok(out)
}

/// Whether a (normalized) selector names the namespace or its labels.
fn names_namespace(sel: &LabelSelector) -> bool {
    let named = |k: &str| k == NS_KEY || k.starts_with(NS_LABELS);
    sel.match_labels.iter().flatten().any(|(k, _)| named(k))
        || sel
            .match_expressions
            .iter()
            .flatten()
            .any(|e| named(&e.key))
}

/// The identities `sel` selects, within `namespace` when given; Err(()) when
/// it cannot be evaluated (reported).
fn select(
    world: &World<'_>,
    labels: &[BTreeMap<String, String>],
    sel: &LabelSelector,
    namespace: Option<&str>,
    ctx: &Ctx<'_>,
    field: &str,
    diags: &mut Vec<NpDiagnostic>,
) -> Result<Vec<usize>, ()> {
    let candidates: Box<dyn Iterator<Item = usize>> = match namespace {
        Some(ns) => Box::new(world.by_ns.get(ns).into_iter().flatten().copied()),
        None => Box::new(0..world.keys.len()),
    };
    let mut out = Vec::new();
    for i in candidates {
        match selector_matches(sel, &labels[i]) {
            Ok(true) => out.push(i),
            Ok(false) => {}
            Err(e) => {
                diags.push(NpDiagnostic::BadSelector {
                    policy: ctx.policy.clone(),
                    what: "a Cilium selector",
                    error: format!("{field}: {e}"),
                });
                return Err(());
            }
        }
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn compile_rule(
    world: &World<'_>,
    labels: &[BTreeMap<String, String>],
    ctx: &Ctx<'_>,
    rule: &CiliumRule,
    at: &str,
    local: &BTreeSet<usize>,
    hosts: &NpHosts,
    diags: &mut Vec<NpDiagnostic>,
) -> Option<Compiled> {
    for k in rule.other.keys() {
        ctx.outside(diags, format!("{at}.{k}"), IGNORED);
    }
    if let Some(ns_sel) = &rule.node_selector {
        // a host policy: this node's firewall, when it selects this node
        let field = format!("{at}.nodeSelector");
        if ctx.namespace.is_some() {
            ctx.outside(diags, field, IGNORED);
            return None;
        }
        let selected = match normalize(ns_sel) {
            Ok(sel) => match selector_matches(&sel, &hosts.node_labels) {
                Ok(m) => m,
                Err(e) => {
                    diags.push(NpDiagnostic::BadSelector {
                        policy: ctx.policy.clone(),
                        what: "a Cilium nodeSelector",
                        error: format!("{field}: {e}"),
                    });
                    false
                }
            },
            Err(key) => {
                ctx.outside(diags, format!("{field} key {key:?}"), IGNORED);
                false
            }
        };
        if !selected {
            return None;
        }
        return Some(rules_of(
            world,
            labels,
            ctx,
            rule,
            at,
            Vec::new(),
            true,
            diags,
        ));
    }
    let Some(es) = &rule.endpoint_selector else {
        ctx.outside(diags, format!("{at} without endpointSelector"), IGNORED);
        return None;
    };
    let field = format!("{at}.endpointSelector");
    let selects: Vec<usize> = match normalize(es) {
        Ok(mut sel) => {
            if ctx.namespace.is_some() {
                // a namespaced policy selects its own namespace, whatever
                // the selector says about namespaces (as Cilium does)
                if let Some(m) = sel.match_labels.as_mut() {
                    m.remove(NS_KEY);
                }
                if let Some(e) = sel.match_expressions.as_mut() {
                    e.retain(|r| r.key != NS_KEY);
                }
            }
            match select(world, labels, &sel, ctx.namespace, ctx, &field, diags) {
                Ok(v) => v,
                Err(()) => {
                    // fail closed: every pod it could have meant, nothing admitted
                    let all: Vec<usize> = match ctx.namespace {
                        Some(ns) => world.by_ns.get(ns).cloned().unwrap_or_default(),
                        None => (0..world.keys.len()).collect(),
                    };
                    let dirs = directions(rule);
                    return Some(Compiled {
                        name: ctx.policy.clone(),
                        selects: all.into_iter().filter(|i| local.contains(i)).collect(),
                        blocked: dirs,
                        ..Compiled::default()
                    });
                }
            }
        }
        Err(key) => {
            // a reserved identity (host, init…): no pod is one
            ctx.outside(diags, format!("{field} key {key:?}"), IGNORED);
            return None;
        }
    };
    let selects: Vec<usize> = selects.into_iter().filter(|i| local.contains(i)).collect();
    if selects.is_empty() {
        return None;
    }
    Some(rules_of(
        world, labels, ctx, rule, at, selects, false, diags,
    ))
}

/// The rule's isolation, deny and allow rules for `selects` (or the host).
#[allow(clippy::too_many_arguments)]
fn rules_of(
    world: &World<'_>,
    labels: &[BTreeMap<String, String>],
    ctx: &Ctx<'_>,
    rule: &CiliumRule,
    at: &str,
    selects: Vec<usize>,
    host: bool,
    diags: &mut Vec<NpDiagnostic>,
) -> Compiled {
    let [ing, eg] = directions(rule);
    let default_deny = rule.enable_default_deny.as_ref();
    let isolate = [
        default_deny.and_then(|d| d.ingress).unwrap_or(ing),
        default_deny.and_then(|d| d.egress).unwrap_or(eg),
    ];
    let mut c = Compiled {
        name: ctx.policy.clone(),
        selects,
        host,
        open: [!isolate[0], !isolate[1]],
        ..Compiled::default()
    };
    for (k, ingress, allow, deny) in [
        (0, true, &rule.ingress, &rule.ingress_deny),
        (1, false, &rule.egress, &rule.egress_deny),
    ] {
        let (name, deny_name) = if ingress {
            ("ingress", "ingressDeny")
        } else {
            ("egress", "egressDeny")
        };
        for (n, r) in deny.iter().flatten().enumerate() {
            let field = format!("{at}.{deny_name}[{n}]");
            match peer_rule(world, labels, ctx, r, ingress, true, &field, diags) {
                Ok(Some(r)) => c.deny[k].push(r),
                Ok(None) => {}
                // a deny we cannot read: refuse everything it might have
                Err(()) => c.blocked[k] = true,
            }
        }
        let rules: Vec<Rule> = allow
            .iter()
            .flatten()
            .enumerate()
            .filter_map(|(n, r)| {
                let field = format!("{at}.{name}[{n}]");
                peer_rule(world, labels, ctx, r, ingress, false, &field, diags)
                    .ok()
                    .flatten()
            })
            .collect();
        // a direction the rule neither isolates nor has rules for is left alone
        let speaks = if ingress { ing } else { eg };
        let list = (isolate[k] || speaks).then_some(rules);
        if ingress {
            c.ingress = list;
        } else {
            c.egress = list;
        }
    }
    c
}

/// Whether the rule has rules for [ingress, egress].
fn directions(rule: &CiliumRule) -> [bool; 2] {
    let some = |v: &Option<Vec<_>>| v.as_ref().is_some_and(|v: &Vec<_>| !v.is_empty());
    [
        some(&rule.ingress) || rule.ingress_deny.as_ref().is_some_and(|v| !v.is_empty()),
        some(&rule.egress) || rule.egress_deny.as_ref().is_some_and(|v| !v.is_empty()),
    ]
}

/// One `ingress`/`egress` (or deny) entry as a rule; Ok(None) when it
/// matches nothing, Err when part of it is outside the subset (reported:
/// an allow then admits nothing, a deny blocks its direction).
#[allow(clippy::too_many_arguments)]
fn peer_rule(
    world: &World<'_>,
    labels: &[BTreeMap<String, String>],
    ctx: &Ctx<'_>,
    r: &CiliumPeerRule,
    ingress: bool,
    deny: bool,
    at: &str,
    diags: &mut Vec<NpDiagnostic>,
) -> Result<Option<Rule>, ()> {
    let effect = if deny { BLOCKED } else { NOTHING };
    let (eps, cidrs, sets, entities) = if ingress {
        (
            &r.from_endpoints,
            &r.from_cidr,
            &r.from_cidr_set,
            &r.from_entities,
        )
    } else {
        (&r.to_endpoints, &r.to_cidr, &r.to_cidr_set, &r.to_entities)
    };
    let wrong: Vec<&str> = if ingress {
        [
            ("toEndpoints", r.to_endpoints.is_some()),
            ("toCIDR", r.to_cidr.is_some()),
            ("toCIDRSet", r.to_cidr_set.is_some()),
            ("toEntities", r.to_entities.is_some()),
        ]
    } else {
        [
            ("fromEndpoints", r.from_endpoints.is_some()),
            ("fromCIDR", r.from_cidr.is_some()),
            ("fromCIDRSet", r.from_cidr_set.is_some()),
            ("fromEntities", r.from_entities.is_some()),
        ]
    }
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(k, _)| k)
    .collect();
    // anything unknown (toFQDNs, toServices, fromRequires, icmps…): the
    // whole rule admits nothing
    let mut outside = false;
    for k in r.other.keys().map(String::as_str).chain(wrong) {
        ctx.outside(diags, format!("{at}.{k}"), effect);
        outside = true;
    }
    if outside {
        return Err(());
    }

    // ports: None = every protocol and port
    let ports: Vec<PortSpec> = match &r.to_ports {
        None => vec![PortSpec::Any],
        Some(list) if list.is_empty() => vec![PortSpec::Any],
        Some(list) => {
            let mut v = Vec::new();
            for (n, pr) in list.iter().enumerate() {
                if let Some(k) = pr.other.keys().next() {
                    // an L7 rule narrows the port: not enforcing it would widen
                    ctx.outside(diags, format!("{at}.toPorts[{n}].{k}"), effect);
                    if deny {
                        return Err(());
                    }
                    continue;
                }
                match pr.ports.as_deref() {
                    None | Some([]) => v.push(PortSpec::Any),
                    Some(ps) => {
                        for (m, p) in ps.iter().enumerate() {
                            v.extend(port(
                                p,
                                ctx,
                                &format!("{at}.toPorts[{n}].ports[{m}]"),
                                diags,
                            ));
                        }
                    }
                }
            }
            if v.is_empty() {
                return Ok(None);
            }
            v
        }
    };

    let l3 = eps.is_some() || cidrs.is_some() || sets.is_some() || entities.is_some();
    if !l3 {
        // ports alone: any peer; nothing at all (`- {}`): nothing
        return Ok(r
            .to_ports
            .as_ref()
            .is_some_and(|p| !p.is_empty())
            .then(|| Rule {
                peers: vec![Peer::Any],
                ports,
            }));
    }
    let mut peers = Vec::new();
    for (n, sel) in eps.iter().flatten().enumerate() {
        let field = format!(
            "{at}.{}[{n}]",
            if ingress {
                "fromEndpoints"
            } else {
                "toEndpoints"
            }
        );
        match normalize(sel) {
            Ok(sel) => {
                let scope = if names_namespace(&sel) {
                    None
                } else {
                    ctx.namespace
                };
                if let Ok(ids) = select(world, labels, &sel, scope, ctx, &field, diags) {
                    peers.push(Peer::Pods(ids));
                }
            }
            Err(key) => ctx.outside(diags, format!("{field} key {key:?}"), NOTHING),
        }
    }
    let mut block =
        |cidr: &str, except: &[String], field: String, diags: &mut Vec<NpDiagnostic>| {
            let parsed: Result<Vec<IpNet>, _> = std::iter::once(cidr)
                .chain(except.iter().map(String::as_str))
                .map(parse_cidr)
                .collect();
            match parsed {
                Ok(v) => peers.push(Peer::Block(v[0], v[1..].to_vec())),
                Err(bad) => diags.push(NpDiagnostic::BadCidr {
                    policy: ctx.policy.clone(),
                    cidr: format!("{field}: {bad}"),
                }),
            }
        };
    let cidr_name = if ingress { "fromCIDR" } else { "toCIDR" };
    for (n, c) in cidrs.iter().flatten().enumerate() {
        block(c, &[], format!("{at}.{cidr_name}[{n}]"), diags);
    }
    for (n, s) in sets.iter().flatten().enumerate() {
        let field = format!("{at}.{cidr_name}Set[{n}]");
        if let Some(k) = s.other.keys().next() {
            ctx.outside(diags, format!("{field}.{k}"), NOTHING);
            continue;
        }
        match &s.cidr {
            Some(c) => block(c, s.except.as_deref().unwrap_or_default(), field, diags),
            None => ctx.outside(diags, format!("{field} without cidr"), NOTHING),
        }
    }
    let ent_name = if ingress {
        "fromEntities"
    } else {
        "toEntities"
    };
    for (n, e) in entities.iter().flatten().enumerate() {
        match entity(world, e) {
            Some(v) => peers.extend(v),
            None => ctx.outside(diags, format!("{at}.{ent_name}[{n}] {e:?}"), NOTHING),
        }
    }
    if peers.is_empty() {
        return Ok(None);
    }
    Ok(Some(Rule { peers, ports }))
}

/// A CIDR or a bare address (a host prefix), truncated.
fn parse_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .map(|n| n.trunc())
        .map_err(|_| s.to_string())
}

/// A `toPorts` port: one spec per protocol (`ANY` is TCP, UDP and SCTP).
fn port(
    p: &CiliumPort,
    ctx: &Ctx<'_>,
    field: &str,
    diags: &mut Vec<NpDiagnostic>,
) -> Vec<PortSpec> {
    let bad = |diags: &mut Vec<NpDiagnostic>, why: &'static str| {
        ctx.outside(diags, format!("{field} ({why})"), NOTHING);
        Vec::new()
    };
    if let Some(k) = p.other.keys().next() {
        ctx.outside(diags, format!("{field}.{k}"), NOTHING);
        return Vec::new();
    }
    let protos: &[u8] = match p
        .protocol
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        None | Some("ANY") => &[TCP, UDP, SCTP],
        Some("TCP") => &[TCP],
        Some("UDP") => &[UDP],
        Some("SCTP") => &[SCTP],
        Some(_) => return bad(diags, "unknown protocol"),
    };
    let number = match &p.port {
        None => Some(0),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(s)) if s.is_empty() => Some(0),
        Some(IntOrString::String(s)) => s.parse::<i32>().ok(),
    };
    match number {
        Some(0) if p.end_port.is_none() => protos.iter().map(|&pr| PortSpec::Proto(pr)).collect(),
        Some(n) => {
            let lo = u16::try_from(n).ok().filter(|n| *n > 0);
            let hi = match p.end_port {
                None => lo,
                Some(e) => u16::try_from(e).ok(),
            };
            match (lo, hi) {
                (Some(lo), Some(hi)) if lo <= hi => protos
                    .iter()
                    .map(|&pr| PortSpec::Range(pr, lo, hi))
                    .collect(),
                _ => bad(diags, "port out of range"),
            }
        }
        None if p.end_port.is_some() => bad(diags, "endPort on a named port"),
        None => match &p.port {
            Some(IntOrString::String(name)) => protos
                .iter()
                .map(|&pr| PortSpec::Named(pr, name.clone()))
                .collect(),
            _ => Vec::new(),
        },
    }
}

/// An entity's peers; None for an entity outside the subset.
fn entity(world: &World<'_>, e: &str) -> Option<Vec<Peer>> {
    let hosts = |entity: &'static str, addrs: Vec<IpNet>| Peer::Hosts {
        entity,
        addrs,
        ingress_only: false,
    };
    Some(match e {
        "all" => vec![Peer::Any],
        "world" | "world-ipv4" | "world-ipv6" => {
            let mut v = Vec::new();
            let families: &[(&str, IpNet)] = &[
                ("world-ipv4", IpNet::V4(Default::default())),
                ("world-ipv6", IpNet::V6(Default::default())),
            ];
            for (name, all) in families {
                if e != "world" && e != *name {
                    continue;
                }
                let except: Vec<IpNet> = world
                    .cluster_cidrs
                    .iter()
                    .chain(&world.nodes)
                    .chain(&world.local_node)
                    .chain(&world.apiserver)
                    .filter(|n| n.addr().is_ipv4() == all.addr().is_ipv4())
                    .copied()
                    .collect();
                v.push(Peer::Block(*all, except));
            }
            v
        }
        "cluster" => {
            let mut v: Vec<Peer> = world
                .cluster_cidrs
                .iter()
                .map(|c| Peer::Block(*c, Vec::new()))
                .collect();
            let mut nodes = world.nodes.clone();
            nodes.extend(&world.local_node);
            v.push(hosts("cluster", nodes));
            v
        }
        "host" => vec![hosts("host", world.local_node.clone())],
        "remote-node" => vec![hosts(
            "remote-node",
            world
                .nodes
                .iter()
                .filter(|n| !world.local_node.contains(n))
                .copied()
                .collect(),
        )],
        "kube-apiserver" => vec![hosts("kube-apiserver", world.apiserver.clone())],
        _ => return None,
    })
}
