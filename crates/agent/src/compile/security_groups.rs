//! The SecurityGroup compiler: a pure function from the watched objects
//! (VPCs, SecurityGroups, Ports and the pods that claim them) to the entries
//! of the datapath's SecurityGroup maps (`bpf/policy.h`, synced by
//! [`cozyplane_datapath::sg`]).
//!
//! * **Group identity.** A group is `{net, id}`: `net` is its VPC's VNI,
//!   `id` a 32-bit number derived from the group's uid (FNV-1a), so it is
//!   stable for the group's lifetime and needs no allocator or status write.
//!   Ids never leave the node (no id is carried on the wire: every node
//!   compiles memberships and rules from the same objects), so they only
//!   need to be unique per net within one compile: on a collision the group
//!   created later (ties by namespace/name) moves to the next free id, and
//!   the collision is reported. `status.id` is not used.
//! * **Members** (`cp_sg_members`): every Port (cluster-wide: sources are
//!   recognised by their membership on the receiving node) whose pod's
//!   labels match a group's `podSelector` in the Port's VPC. The labels are
//!   the live pod's, else the Port's `sdn.cozystack.io/pod-labels`
//!   snapshot. An absent `podSelector` selects no pod; `{}` selects all the
//!   VPC's pods. An endpoint holds at most [`SG_MAX_GROUPS`] groups; beyond
//!   that the lowest ids are kept and the rest reported (fail closed: it
//!   loses allowances, never gains any).
//! * **Rules** (`cp_sg_rules`): one entry per port-range prefix
//!   ([`port_range_prefixes`]). A `group` peer names a SecurityGroup of the
//!   same namespace in the same VPC, or with `vpc` one in that VPC's
//!   namespace (a peered VPC); the rule is keyed by the peer's `{net, id}`.
//!   A `cidr` peer becomes a CIDR class (`cp_sg_cidrs`): one class per
//!   distinct prefix of the subject group and direction, holding the ports
//!   of every rule whose prefix contains it (same family), so the
//!   datapath's longest match alone decides. An IPv6 prefix never covers
//!   IPv4 sources (kept in `64:ff9b::/96`): a barrier class is added there.
//! * **Ports of a rule**: empty = TCP, UDP and ICMP, all ports; `port` 0 =
//!   every port of the protocol; `endPort` closes a range (any length).
//!   ICMP's "port" is the ICMP type; for IPv6 "any type" stays any, and a
//!   range containing echo request (8) admits ICMPv6 echo request (128).
//!
//! * **Cost** (`cargo bench -p cozyplane-agent --bench compile_security_groups`,
//!   docs/benchmarks.md): linear in the input. A VPC's groups are indexed
//!   by one `matchLabels` pair each, so a Port evaluates only the groups
//!   that can select it; a selector that is just that pair (or `{}`) needs
//!   no evaluation, and a selector's error (which never depends on the
//!   labels) is found once per group. Lookups borrow the objects' names
//!   (no `String` per lookup), with std's SipHash: names and labels are
//!   tenants' input, so the maps must not be open to chosen collisions.
//!   The output maps are built once from sorted lists, not by an insert
//!   per entry. A test checks the output against the compiler before this
//!   rework (`reference.rs`) on random inputs.
//!
//! Anything that cannot be compiled is skipped and reported as a
//! [`SgDiagnostic`]; a rule that is skipped allows nothing (fail closed),
//! and a group whose selector cannot be evaluated selects nobody.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use cozyplane_api::labels::ANNOTATION_POD_LABELS;
use cozyplane_api::names::FIRST_VPC_VNI;
use cozyplane_api::sdn::{SecurityGroupPeer, SecurityGroupPort};
use cozyplane_api::selector::{selector_matches, SelectorError};
use cozyplane_api::{Port, SecurityGroup, VPC};
use cozyplane_datapath::abi::{
    port_range_prefixes, sg_cidr_key, sg_member_key, EpKey, SgGroups, SgRule, SG_EGRESS,
    SG_INGRESS, SG_MAX_GROUPS, SG_PEER_CIDR, SG_RULE_FIXED_BITS,
};
use cozyplane_datapath::sg::{CidrEntry, RuleEntry, SgDesired};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

const TCP: u8 = 6;
const UDP: u8 = 17;
const ICMP: u8 = 1;
const ICMPV6: u8 = 58;

/// Something the SecurityGroup compiler skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum SgDiagnostic {
    /// The group's VPC does not exist or has no VNI yet: the group is skipped.
    VpcNotReady {
        /// `namespace/name` of the group.
        group: String,
        /// `namespace/name` of the VPC.
        vpc: String,
    },
    /// The group's `podSelector` cannot be evaluated: it selects nobody.
    BadSelector {
        /// The group.
        group: String,
        /// Why.
        error: String,
    },
    /// A rule's peer is malformed (neither or both of group and cidr, an
    /// unparsable CIDR, a `vpc` without a group): the rule is skipped.
    BadPeer {
        /// The group.
        group: String,
        /// What is wrong.
        detail: String,
    },
    /// A rule names a group that does not exist, is not in the VPC the rule
    /// names (its own without `vpc`), or whose VPC is not ready: the rule is
    /// skipped.
    UnknownPeerGroup {
        /// The group.
        group: String,
        /// `namespace/name` of the named group.
        peer: String,
    },
    /// A rule's port entry is malformed (protocol, range): the rule is skipped.
    BadPort {
        /// The group.
        group: String,
        /// What is wrong.
        detail: String,
    },
    /// A Port whose name is no claim, whose `vpcRef` lacks its namespace, or
    /// whose VPC now has another VNI (a stale claim): not a member of anything.
    BadClaim {
        /// The Port name.
        port: String,
        /// What is wrong.
        detail: String,
    },
    /// A Port is selected by more groups than an endpoint holds.
    TooManyGroups {
        /// The Port name.
        port: String,
        /// How many select it.
        selected: usize,
    },
    /// Two groups of one VPC hashed to one id; the later one moved.
    IdCollision {
        /// The group that moved.
        group: String,
        /// The id it got.
        id: u32,
    },
}

impl fmt::Display for SgDiagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SgDiagnostic::VpcNotReady { group, vpc } => {
                write!(f, "SecurityGroup {group}: VPC {vpc} is unknown or has no VNI yet")
            }
            SgDiagnostic::BadSelector { group, error } => {
                write!(f, "SecurityGroup {group}: podSelector selects nobody: {error}")
            }
            SgDiagnostic::BadPeer { group, detail } => {
                write!(f, "SecurityGroup {group}: rule skipped: {detail}")
            }
            SgDiagnostic::UnknownPeerGroup { group, peer } => write!(
                f,
                "SecurityGroup {group}: rule skipped: group {peer} does not exist or its VPC is not ready"
            ),
            SgDiagnostic::BadPort { group, detail } => {
                write!(f, "SecurityGroup {group}: rule skipped: {detail}")
            }
            SgDiagnostic::BadClaim { port, detail } => write!(f, "Port {port}: {detail}"),
            SgDiagnostic::TooManyGroups { port, selected } => write!(
                f,
                "Port {port}: selected by {selected} SecurityGroups, kept the {SG_MAX_GROUPS} lowest ids"
            ),
            SgDiagnostic::IdCollision { group, id } => {
                write!(f, "SecurityGroup {group}: id collision, moved to {id}")
            }
        }
    }
}

/// The compiler's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompiledSecurityGroups {
    /// What the maps should hold.
    pub desired: SgDesired,
    /// Every compiled group's `{net, id}`, by `(namespace, name)`.
    pub ids: BTreeMap<(String, String), (u32, u32)>,
    /// What was skipped, sorted.
    pub diagnostics: Vec<SgDiagnostic>,
}

/// FNV-1a, 32 bits.
fn fnv1a32(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// `(namespace, name)` of an object, borrowed (absent ones are `""`).
fn ns_name(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// A map keyed by borrowed names (SipHash: see the module docs on cost).
type Map<K, V> = HashMap<K, V>;

/// A map from a list where a later entry for a key replaces an earlier one,
/// as repeated `insert`s would: a stable sort, the last of each run kept in
/// place (no second list: at 5 000 members that is a 440 KB buffer whose
/// fresh pages cost more than the copy), and the tree built in one pass
/// from the sorted input (no insert per entry).
fn last_wins<K: Ord, V>(mut entries: Vec<(K, V)>) -> BTreeMap<K, V> {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    // `dedup_by` keeps the first of a run: swap the later value into it
    entries.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            std::mem::swap(later, kept);
        }
        same
    });
    entries.into_iter().collect()
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
    rules: &mut Vec<(RuleEntry, u32)>,
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
            rules.push((
                RuleEntry {
                    prefix_len: SG_RULE_FIXED_BITS + u32::from(bits),
                    rule,
                },
                1,
            ));
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

/// The rule and CIDR entries being collected (made maps at the end).
#[derive(Default)]
struct Emitted {
    rules: Vec<(RuleEntry, u32)>,
    cidrs: Vec<(CidrEntry, u32)>,
}

/// The CIDR classes of one subject group and direction.
fn emit_cidr_classes(
    out: &mut Emitted,
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
        out.cidrs.push((CidrEntry::from(key), class));
        emit_rules(&mut out.rules, subject, dir, (SG_PEER_CIDR, class), specs);
    }
}

/// Labels of the pod a Port belongs to: the live pod's, else the Port's snapshot.
fn port_labels<'a>(
    port: &'a Port,
    pods: &Map<(&str, &str), &'a Pod>,
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

/// How a candidate group's selector is decided for a Port's labels, worked
/// out once per group.
enum Test<'a> {
    /// Being a candidate proves the match: the selector is `{}`, or its one
    /// requirement is the `matchLabels` pair the group is indexed by.
    Implied,
    /// Evaluate the selector.
    Evaluate(&'a LabelSelector),
    /// It cannot be evaluated (its error does not depend on the labels):
    /// selects nobody, reported once it was a candidate.
    Bad(SelectorError),
}

/// A group ready to select members.
struct Selecting<'a> {
    id: u32,
    /// `(namespace, name)`, for its diagnostic.
    name: (&'a str, &'a str),
    test: Test<'a>,
    /// Was it a candidate with a bad selector (then it is reported)?
    reported: bool,
}

/// The groups of one VPC that select members, indexed by one `matchLabels`
/// pair each, so a Port evaluates only the groups that can select it.
struct VpcGroups<'a> {
    /// The VPC's VNI (`None` only for duplicate group names).
    vni: Option<u32>,
    groups: Vec<Selecting<'a>>,
    keyed: Map<&'a str, Map<&'a str, Vec<usize>>>,
    unkeyed: Vec<usize>,
}

/// Compiles the SecurityGroup maps; see the module docs.
pub fn compile_security_groups(
    vpcs: &[VPC],
    groups: &[SecurityGroup],
    ports: &[Port],
    pods: &[Pod],
) -> CompiledSecurityGroups {
    let mut diagnostics = Vec::new();

    let mut vnis: Map<(&str, &str), u32> = Map::with_capacity(vpcs.len());
    for v in vpcs {
        let Some(vni) = v.status.as_ref().and_then(|s| s.vni) else {
            continue;
        };
        let Some(vni) = u32::try_from(vni).ok().filter(|v| *v >= FIRST_VPC_VNI) else {
            continue;
        };
        vnis.insert(ns_name(&v.metadata), vni);
    }

    // ids: per net, older groups first keep their hash
    let mut ordered: Vec<&SecurityGroup> = groups.iter().collect();
    ordered.sort_by(|a, b| {
        let created = |g: &SecurityGroup| g.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let ((a_ns, a_name), (b_ns, b_name)) = (ns_name(&a.metadata), ns_name(&b.metadata));
        (created(a), a_ns, a_name).cmp(&(created(b), b_ns, b_name))
    });
    let mut ids: BTreeMap<(String, String), (u32, u32)> = BTreeMap::new();
    let mut taken: Map<u32, HashSet<u32>> = Map::new();
    for g in ordered {
        let (ns, name) = ns_name(&g.metadata);
        let vpc = g.spec.vpc_ref.name.as_str();
        let Some(&net) = vnis.get(&(ns, vpc)) else {
            diagnostics.push(SgDiagnostic::VpcNotReady {
                group: format!("{ns}/{name}"),
                vpc: format!("{ns}/{vpc}"),
            });
            continue;
        };
        let hash = match g.metadata.uid.as_deref() {
            Some(uid) => fnv1a32(uid),
            None => fnv1a32(&format!("{ns}/{name}")),
        };
        let used = taken.entry(net).or_default();
        let mut id = hash.max(1);
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
        ids.insert((ns.to_string(), name.to_string()), (net, id));
    }
    let ids_by_name: Map<(&str, &str), (u32, u32)> = ids
        .iter()
        .map(|((ns, name), v)| ((ns.as_str(), name.as_str()), *v))
        .collect();

    // rules
    let mut rules = RuleCompiler {
        ids: &ids_by_name,
        vnis: &vnis,
        out: Emitted::default(),
        cidrs: Vec::new(),
        diagnostics: &mut diagnostics,
    };
    for g in groups {
        let (ns, name) = ns_name(&g.metadata);
        let Some(&subject) = ids_by_name.get(&(ns, name)) else {
            continue;
        };
        let ingress = g.spec.ingress.iter().map(|r| (&r.from, &r.ports[..]));
        rules.direction(g, subject, SG_INGRESS, ingress);
        let egress = g.spec.egress.iter().map(|r| (&r.to, &r.ports[..]));
        rules.direction(g, subject, SG_EGRESS, egress);
    }
    let emitted = rules.out;

    // members: candidate groups per VPC, indexed by one matchLabels pair
    let mut by_vpc: Map<(&str, &str), VpcGroups> = Map::new();
    for g in groups {
        let (ns, name) = ns_name(&g.metadata);
        let Some(&(_, id)) = ids_by_name.get(&(ns, name)) else {
            continue;
        };
        let Some(sel) = g.spec.pod_selector.as_ref() else {
            continue; // selects nobody
        };
        let entry = by_vpc
            .entry((ns, g.spec.vpc_ref.name.as_str()))
            .or_insert_with(|| VpcGroups {
                vni: vnis.get(&(ns, g.spec.vpc_ref.name.as_str())).copied(),
                groups: Vec::new(),
                keyed: Map::new(),
                unkeyed: Vec::new(),
            });
        let idx = entry.groups.len();
        let index_pair = sel.match_labels.as_ref().and_then(|m| m.iter().next());
        let pairs = sel.match_labels.as_ref().map_or(0, BTreeMap::len);
        let exprs = sel.match_expressions.as_ref().map_or(0, Vec::len);
        // an error does not depend on the labels: find it once
        let test = match selector_matches(sel, &BTreeMap::new()) {
            Err(e) => Test::Bad(e),
            Ok(_) if exprs == 0 && pairs <= 1 => Test::Implied,
            Ok(_) => Test::Evaluate(sel),
        };
        entry.groups.push(Selecting {
            id,
            name: (ns, name),
            test,
            reported: false,
        });
        match index_pair {
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
    let mut pods_by_name: Map<(&str, &str), &Pod> = Map::with_capacity(pods.len());
    for p in pods {
        pods_by_name.insert(ns_name(&p.metadata), p);
    }
    let mut bad_selectors: BTreeMap<String, String> = BTreeMap::new();
    let no_labels = BTreeMap::new();
    let mut candidates: Vec<usize> = Vec::new();
    let mut selected: Vec<u32> = Vec::new();
    let mut members: Vec<(EpKey, SgGroups)> = Vec::with_capacity(ports.len());
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
        let Some(vpc_groups) = by_vpc.get_mut(&(vns, vref.name.as_str())) else {
            continue; // no group selects anything in this VPC
        };
        // the claim's VNI must be the VPC's (a stale claim of a re-created
        // VPC is not a member); the name is validated at create, so its
        // VNI prefix and spec.ip are the claim
        let claimed = pname
            .strip_prefix('v')
            .and_then(|r| r.split_once('.'))
            .and_then(|(d, _)| d.parse::<u32>().ok());
        let vni = vpc_groups.vni;
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
        if !vpc_groups.keyed.is_empty() {
            for (k, v) in labels {
                if let Some(hit) = vpc_groups
                    .keyed
                    .get(k.as_str())
                    .and_then(|m| m.get(v.as_str()))
                {
                    candidates.extend_from_slice(hit);
                }
            }
        }
        selected.clear();
        for &i in &candidates {
            let Some(s) = vpc_groups.groups.get_mut(i) else {
                continue;
            };
            match &s.test {
                Test::Implied => selected.push(s.id),
                Test::Evaluate(sel) => match selector_matches(sel, labels) {
                    Ok(true) => selected.push(s.id),
                    Ok(false) => {}
                    Err(e) => {
                        let group = format!("{}/{}", s.name.0, s.name.1);
                        bad_selectors.insert(group, e.to_string());
                    }
                },
                Test::Bad(_) => s.reported = true,
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
        // SgGroups::new without its copy: `selected` is sorted, distinct
        // and at most SG_MAX_GROUPS long
        let mut value = SgGroups {
            count: 0,
            ids: [0; SG_MAX_GROUPS],
        };
        value.ids[..selected.len()].copy_from_slice(&selected);
        value.count = u32::try_from(selected.len()).unwrap_or(0);
        members.push((sg_member_key(vni, ip), value));
    }
    for vpc_groups in by_vpc.values() {
        for s in &vpc_groups.groups {
            if let (Test::Bad(e), true) = (&s.test, s.reported) {
                let group = format!("{}/{}", s.name.0, s.name.1);
                bad_selectors.insert(group, e.to_string());
            }
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
        desired: SgDesired {
            members: last_wins(members),
            rules: last_wins(emitted.rules),
            cidrs: last_wins(emitted.cidrs),
        },
        ids,
        diagnostics,
    }
}

/// Compiles the rules of one group and direction into [`Emitted`].
struct RuleCompiler<'a, 'd> {
    ids: &'a Map<(&'a str, &'a str), (u32, u32)>,
    vnis: &'a Map<(&'a str, &'a str), u32>,
    out: Emitted,
    /// Scratch: the CIDR peers of the direction being compiled.
    cidrs: Vec<(IpNet, Vec<PortSpec>)>,
    diagnostics: &'d mut Vec<SgDiagnostic>,
}

impl<'a> RuleCompiler<'a, '_> {
    fn direction<'r>(
        &mut self,
        g: &SecurityGroup,
        subject: (u32, u32),
        dir: u8,
        rules: impl Iterator<Item = (&'r SecurityGroupPeer, &'r [SecurityGroupPort])>,
    ) {
        let (ns, name) = ns_name(&g.metadata);
        self.cidrs.clear();
        for (peer, ports) in rules {
            let specs = match port_specs(ports) {
                Ok(s) => s,
                Err(detail) => {
                    self.diagnostics.push(SgDiagnostic::BadPort {
                        group: format!("{ns}/{name}"),
                        detail,
                    });
                    continue;
                }
            };
            match resolve_peer(peer, ns, subject.0, self.ids, self.vnis) {
                Ok(Peer::Group(net, id)) => {
                    emit_rules(&mut self.out.rules, subject, dir, (net, id), &specs)
                }
                Ok(Peer::Cidr(c)) => self.cidrs.push((c, specs)),
                Err(d) => self.diagnostics.push(d(format!("{ns}/{name}"))),
            }
        }
        if !self.cidrs.is_empty() {
            emit_cidr_classes(&mut self.out, subject, dir, &self.cidrs);
        }
    }
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
    ids: &Map<(&str, &str), (u32, u32)>,
    vnis: &Map<(&str, &str), u32>,
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
                    vnis.get(&(v.namespace.as_str(), v.name.as_str())).copied(),
                ),
            };
            match (ids.get(&(pns, g.as_str())), net) {
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

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
