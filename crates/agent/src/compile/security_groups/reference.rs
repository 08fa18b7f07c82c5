//! The SecurityGroup compiler as it was before its performance rework
//! (main at 461438a), kept verbatim as the oracle of the equivalence test
//! (`tests.rs`, `the_compiler_matches_its_reference_on_random_worlds`): the
//! reworked compiler must produce exactly this output for every input.
//! Test-only code.
#![allow(clippy::all, clippy::pedantic)]

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};

use cozyplane_api::labels::ANNOTATION_POD_LABELS;
use cozyplane_api::names::FIRST_VPC_VNI;
use cozyplane_api::sdn::{SecurityGroupPeer, SecurityGroupPort};
use cozyplane_api::selector::selector_matches;
use cozyplane_api::{Port, SecurityGroup, VPC};
use cozyplane_datapath::abi::{
    port_range_prefixes, sg_cidr_key, sg_member_key, SgGroups, SgRule, SG_EGRESS, SG_INGRESS,
    SG_MAX_GROUPS, SG_PEER_CIDR, SG_RULE_FIXED_BITS,
};
use cozyplane_datapath::sg::{CidrEntry, RuleEntry, SgDesired};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;

use super::{CompiledSecurityGroups, SgDiagnostic};

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// FNV-1a, 32 bits.
fn fnv1a32(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn ns_name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// One port spec: protocol and an inclusive range.
type PortSpec = (u8, u16, u16);

/// The specs of a rule's `ports`; see the module docs.
fn port_specs(ports: &[SecurityGroupPort]) -> Result<Vec<PortSpec>, String> {
    if ports.is_empty() {
        return Ok(vec![
            (TCP, 0, u16::MAX),
            (UDP, 0, u16::MAX),
            (ICMP, 0, 255),
            (ICMPV6, 0, 255),
        ]);
    }
    let mut out = Vec::new();
    for p in ports {
        let proto = match p.protocol.to_ascii_uppercase().as_str() {
            "TCP" => TCP,
            "UDP" => UDP,
            "ICMP" => ICMP,
            other => return Err(format!("protocol {other:?} is not TCP, UDP or ICMP")),
        };
        let max: i32 = if proto == ICMP { 255 } else { 65535 };
        let (lo, hi) = match (p.port, p.end_port) {
            (0, None) => (0, max),
            (0, Some(_)) => return Err("endPort needs a port".into()),
            (port, end) => {
                let end = end.unwrap_or(port);
                if port < 0 || port > max || end < port || end > max {
                    return Err(format!("port range {port}-{end} is outside 0-{max}"));
                }
                (port, end)
            }
        };
        let (lo, hi) = (
            u16::try_from(lo).map_err(|e| e.to_string())?,
            u16::try_from(hi).map_err(|e| e.to_string())?,
        );
        out.push((proto, lo, hi));
        if proto == ICMP {
            if p.port == 0 {
                out.push((ICMPV6, 0, 255));
            } else if (lo..=hi).contains(&8) {
                out.push((ICMPV6, 128, 128)); // echo request
            }
        }
    }
    Ok(out)
}

fn emit_rules(
    rules: &mut BTreeMap<RuleEntry, u32>,
    subject: (u32, u32),
    dir: u8,
    peer: (u32, u32),
    specs: &[PortSpec],
) {
    for &(proto, lo, hi) in specs {
        for (start, bits) in port_range_prefixes(lo, hi) {
            let rule = SgRule {
                net: subject.0,
                group: subject.1,
                peer_net: peer.0,
                peer: peer.1,
                dir,
                proto,
                port: start.to_be_bytes(),
            };
            rules.insert(
                RuleEntry {
                    prefix_len: SG_RULE_FIXED_BITS + u32::from(bits),
                    rule,
                },
                1,
            );
        }
    }
}

/// A prefix in the datapath's 128-bit key space (IPv4 under `64:ff9b::/96`).
type KeyPrefix = (u128, u8);

/// `64:ff9b::/96`, where IPv4 keys live.
const NAT64_KEY: KeyPrefix = (0x0064_ff9b_u128 << 96, 96);

fn in_key_space(n: &IpNet) -> KeyPrefix {
    match n {
        IpNet::V4(v4) => (
            NAT64_KEY.0 | u128::from(u32::from(v4.network())),
            96 + v4.prefix_len(),
        ),
        IpNet::V6(v6) => (u128::from(v6.network()), v6.prefix_len()),
    }
}

/// Does `outer` contain `inner` (both in the key space)?
fn key_contains(outer: KeyPrefix, inner: KeyPrefix) -> bool {
    if outer.1 > inner.1 {
        return false;
    }
    let mask = if outer.1 == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(outer.1))
    };
    (outer.0 & mask) == (inner.0 & mask)
}

/// Is this class an IPv4 prefix (or the barrier at `64:ff9b::/96`)?
fn is_v4_key(k: KeyPrefix) -> bool {
    key_contains(NAT64_KEY, k)
}

/// The CIDR classes of one subject group and direction.
fn emit_cidr_classes(
    out: &mut SgDesired,
    subject: (u32, u32),
    dir: u8,
    cidrs: &[(IpNet, Vec<PortSpec>)],
) {
    // distinct prefixes (the IPv4 /0 and 64:ff9b::/96 are one key)
    let mut classes: BTreeMap<KeyPrefix, Vec<PortSpec>> = BTreeMap::new();
    for (c, _) in cidrs {
        classes.entry(in_key_space(c)).or_default();
        // an IPv6 prefix over 64:ff9b::/96 must not admit IPv4 sources
        if c.addr().is_ipv6() && key_contains(in_key_space(c), NAT64_KEY) {
            classes.entry(NAT64_KEY).or_default();
        }
    }
    // each class: the ports of every same-family prefix containing it
    for (c, specs) in cidrs {
        let outer = in_key_space(c);
        for (&class, class_specs) in classes.iter_mut() {
            if c.addr().is_ipv4() == is_v4_key(class) && key_contains(outer, class) {
                class_specs.extend_from_slice(specs);
            }
        }
    }
    for (i, (&(addr, len), specs)) in classes.iter().enumerate() {
        let class = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let Some(key) = sg_cidr_key(
            subject.0,
            subject.1,
            dir,
            IpAddr::V6(Ipv6Addr::from(addr)),
            len,
        ) else {
            continue; // lengths come from parsed prefixes: never too long
        };
        out.cidrs.insert(CidrEntry::from(key), class);
        emit_rules(&mut out.rules, subject, dir, (SG_PEER_CIDR, class), specs);
    }
}

/// Labels of the pod a Port belongs to: the live pod's, else the Port's snapshot.
fn port_labels<'a>(
    port: &'a Port,
    pods: &HashMap<(&str, &str), &'a Pod>,
    snapshot: &'a mut Option<BTreeMap<String, String>>,
) -> Option<&'a BTreeMap<String, String>> {
    let ns = port.spec.pod_namespace.as_deref().unwrap_or_default();
    let name = port.spec.pod_name.as_deref().unwrap_or_default();
    if let Some(pod) = pods.get(&(ns, name)) {
        return pod.metadata.labels.as_ref();
    }
    let raw = port
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_POD_LABELS)?;
    *snapshot = serde_json::from_str(raw).ok();
    snapshot.as_ref()
}

/// A group ready to select members.
struct Selecting<'a> {
    id: u32,
    group: &'a SecurityGroup,
}

/// Compiles the SecurityGroup maps; see the module docs.
pub(super) fn compile_security_groups(
    vpcs: &[VPC],
    groups: &[SecurityGroup],
    ports: &[Port],
    pods: &[Pod],
) -> CompiledSecurityGroups {
    let mut diagnostics = Vec::new();
    let mut out = SgDesired::default();

    let vnis: HashMap<(String, String), u32> = vpcs
        .iter()
        .filter_map(|v| {
            let vni = v.status.as_ref()?.vni?;
            let vni = u32::try_from(vni).ok().filter(|v| *v >= FIRST_VPC_VNI)?;
            Some((ns_name(&v.metadata), vni))
        })
        .collect();

    // ids: per net, older groups first keep their hash
    let mut ordered: Vec<&SecurityGroup> = groups.iter().collect();
    ordered.sort_by(|a, b| {
        let key = |g: &SecurityGroup| {
            (
                g.metadata.creation_timestamp.as_ref().map(|t| t.0),
                ns_name(&g.metadata),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut ids: BTreeMap<(String, String), (u32, u32)> = BTreeMap::new();
    let mut taken: BTreeMap<u32, std::collections::BTreeSet<u32>> = BTreeMap::new();
    for g in ordered {
        let (ns, name) = ns_name(&g.metadata);
        let vpc = (ns.clone(), g.spec.vpc_ref.name.clone());
        let Some(&net) = vnis.get(&vpc) else {
            diagnostics.push(SgDiagnostic::VpcNotReady {
                group: format!("{ns}/{name}"),
                vpc: format!("{}/{}", vpc.0, vpc.1),
            });
            continue;
        };
        let seed = g
            .metadata
            .uid
            .clone()
            .unwrap_or_else(|| format!("{ns}/{name}"));
        let used = taken.entry(net).or_default();
        let mut id = fnv1a32(&seed).max(1);
        let first = id;
        while used.contains(&id) {
            id = id.wrapping_add(1).max(1);
        }
        if id != first {
            diagnostics.push(SgDiagnostic::IdCollision {
                group: format!("{ns}/{name}"),
                id,
            });
        }
        used.insert(id);
        ids.insert((ns, name), (net, id));
    }

    // rules
    for g in groups {
        let (ns, name) = ns_name(&g.metadata);
        let Some(&subject) = ids.get(&(ns.clone(), name.clone())) else {
            continue;
        };
        let gname = format!("{ns}/{name}");
        for (dir, rules) in [
            (
                SG_INGRESS,
                g.spec
                    .ingress
                    .iter()
                    .map(|r| (&r.from, &r.ports))
                    .collect::<Vec<_>>(),
            ),
            (
                SG_EGRESS,
                g.spec.egress.iter().map(|r| (&r.to, &r.ports)).collect(),
            ),
        ] {
            let mut cidrs: Vec<(IpNet, Vec<PortSpec>)> = Vec::new();
            for (peer, ports) in rules {
                let specs = match port_specs(ports) {
                    Ok(s) => s,
                    Err(detail) => {
                        diagnostics.push(SgDiagnostic::BadPort {
                            group: gname.clone(),
                            detail,
                        });
                        continue;
                    }
                };
                match resolve_peer(peer, &ns, subject.0, &ids, &vnis) {
                    Ok(Peer::Group(net, id)) => {
                        emit_rules(&mut out.rules, subject, dir, (net, id), &specs)
                    }
                    Ok(Peer::Cidr(c)) => cidrs.push((c, specs)),
                    Err(d) => diagnostics.push(d(gname.clone())),
                }
            }
            if !cidrs.is_empty() {
                emit_cidr_classes(&mut out, subject, dir, &cidrs);
            }
        }
    }

    // members: candidate groups per VPC, indexed by one matchLabels pair
    let mut by_vpc: HashMap<(&str, &str), VpcGroups> = HashMap::new();
    for g in groups {
        let (ns, name) = ns_name(&g.metadata);
        let Some(&(_, id)) = ids.get(&(ns, name)) else {
            continue;
        };
        let Some(sel) = g.spec.pod_selector.as_ref() else {
            continue; // selects nobody
        };
        let entry = by_vpc
            .entry((
                g.metadata.namespace.as_deref().unwrap_or_default(),
                g.spec.vpc_ref.name.as_str(),
            ))
            .or_default();
        let idx = entry.groups.len();
        entry.groups.push(Selecting { id, group: g });
        match sel.match_labels.as_ref().and_then(|m| m.iter().next()) {
            Some((k, v)) => entry
                .keyed
                .entry(k.as_str())
                .or_default()
                .entry(v.as_str())
                .or_default()
                .push(idx),
            None => entry.unkeyed.push(idx),
        }
    }
    let pods_by_name: HashMap<(&str, &str), &Pod> = pods
        .iter()
        .map(|p| {
            (
                (
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                ),
                p,
            )
        })
        .collect();
    let mut bad_selectors: BTreeMap<String, String> = BTreeMap::new();
    let no_labels = BTreeMap::new();
    let mut candidates: Vec<usize> = Vec::new();
    let mut selected: Vec<u32> = Vec::new();
    let vnis_ref: HashMap<(&str, &str), u32> = vnis
        .iter()
        .map(|((ns, n), v)| ((ns.as_str(), n.as_str()), *v))
        .collect();
    for port in ports {
        let pname = port.metadata.name.as_deref().unwrap_or_default();
        let vref = &port.spec.vpc_ref;
        let Some(vns) = vref.namespace.as_deref() else {
            diagnostics.push(SgDiagnostic::BadClaim {
                port: pname.to_string(),
                detail: "spec.vpcRef has no namespace".into(),
            });
            continue;
        };
        let Some(vpc_groups) = by_vpc.get(&(vns, vref.name.as_str())) else {
            continue; // no group selects anything in this VPC
        };
        // the claim's VNI must be the VPC's (a stale claim of a re-created
        // VPC is not a member); the name is validated at create, so its
        // VNI prefix and spec.ip are the claim
        let claimed = pname
            .strip_prefix('v')
            .and_then(|r| r.split_once('.'))
            .and_then(|(d, _)| d.parse::<u32>().ok());
        let vni = vnis_ref.get(&(vns, vref.name.as_str())).copied();
        let (Some(vni), Ok(ip)) = (
            vni.filter(|v| Some(*v) == claimed),
            port.spec.ip.parse::<IpAddr>(),
        ) else {
            diagnostics.push(SgDiagnostic::BadClaim {
                port: pname.to_string(),
                detail: format!(
                    "not a claim of VPC {vns}/{} (its VNI {vni:?}) with a valid spec.ip",
                    vref.name
                ),
            });
            continue;
        };
        let mut snapshot = None;
        let labels = port_labels(port, &pods_by_name, &mut snapshot).unwrap_or(&no_labels);
        candidates.clear();
        candidates.extend_from_slice(&vpc_groups.unkeyed);
        for (k, v) in labels {
            if let Some(hit) = vpc_groups
                .keyed
                .get(k.as_str())
                .and_then(|m| m.get(v.as_str()))
            {
                candidates.extend_from_slice(hit);
            }
        }
        selected.clear();
        for &i in &candidates {
            let s = &vpc_groups.groups[i];
            let Some(sel) = s.group.spec.pod_selector.as_ref() else {
                continue;
            };
            match selector_matches(sel, labels) {
                Ok(true) => selected.push(s.id),
                Ok(false) => {}
                Err(e) => {
                    let (ns, name) = ns_name(&s.group.metadata);
                    bad_selectors.insert(format!("{ns}/{name}"), e.to_string());
                }
            }
        }
        if selected.is_empty() {
            continue;
        }
        selected.sort_unstable();
        selected.dedup();
        if selected.len() > SG_MAX_GROUPS {
            diagnostics.push(SgDiagnostic::TooManyGroups {
                port: pname.to_string(),
                selected: selected.len(),
            });
            selected.truncate(SG_MAX_GROUPS);
        }
        if let Some(value) = SgGroups::new(&selected) {
            out.members.insert(sg_member_key(vni, ip), value);
        }
    }
    diagnostics.extend(
        bad_selectors
            .into_iter()
            .map(|(group, error)| SgDiagnostic::BadSelector { group, error }),
    );
    diagnostics.sort();
    diagnostics.dedup();
    CompiledSecurityGroups {
        desired: out,
        ids,
        diagnostics,
    }
}

#[derive(Default)]
struct VpcGroups<'a> {
    groups: Vec<Selecting<'a>>,
    keyed: HashMap<&'a str, HashMap<&'a str, Vec<usize>>>,
    unkeyed: Vec<usize>,
}

enum Peer {
    Group(u32, u32),
    Cidr(IpNet),
}

type DiagFor = Box<dyn FnOnce(String) -> SgDiagnostic>;

fn resolve_peer(
    peer: &SecurityGroupPeer,
    ns: &str,
    own_net: u32,
    ids: &BTreeMap<(String, String), (u32, u32)>,
    vnis: &HashMap<(String, String), u32>,
) -> Result<Peer, DiagFor> {
    let bad = |detail: String| -> DiagFor {
        Box::new(move |group| SgDiagnostic::BadPeer { group, detail })
    };
    match (&peer.group, &peer.cidr) {
        (Some(g), None) => {
            // the group's own VPC, or the named (peered) one
            let (pns, net) = match peer.vpc.as_ref() {
                None => (ns, Some(own_net)),
                Some(v) => (
                    v.namespace.as_str(),
                    vnis.get(&(v.namespace.clone(), v.name.clone())).copied(),
                ),
            };
            match (ids.get(&(pns.to_string(), g.clone())), net) {
                (Some(&(gnet, id)), Some(net)) if gnet == net => Ok(Peer::Group(net, id)),
                _ => {
                    let peer = format!("{pns}/{g}");
                    Err(Box::new(move |group| SgDiagnostic::UnknownPeerGroup {
                        group,
                        peer,
                    }))
                }
            }
        }
        (None, Some(c)) if peer.vpc.is_none() => c
            .parse::<IpNet>()
            .map(|n| Peer::Cidr(n.trunc()))
            .map_err(|_| bad(format!("{c:?} is not a CIDR"))),
        (None, Some(_)) => Err(bad("a peer vpc needs a group, not a cidr".into())),
        (Some(_), Some(_)) => Err(bad("a peer has both group and cidr".into())),
        (None, None) => Err(bad("a peer has neither group nor cidr".into())),
    }
}
