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
//!   docs/benchmarks.md): the work per object that does not depend on the
//!   others is done once, when the object is watched, not per compile. The
//!   agent keeps an [`SgIndex`] (`index.rs`) that every watch event of a
//!   VPC, SecurityGroup, Port or pod updates: label keys and values and
//!   object names are interned to integers (std's keyed SipHash: names and
//!   labels are tenants' input, so the table must not be open to chosen
//!   collisions), a Port's claim, address and parsed `pod-labels` snapshot,
//!   a pod's labels and a group's selector (as an integer matcher), port
//!   ranges (as prefixes), peers and CIDR classes are kept as compact
//!   records, reused while the object's `resourceVersion` stays. A compile
//!   then reads integers and small slices: group ids, rules (peers resolved
//!   by id), members. A VPC's groups are indexed by one `matchLabels` pair
//!   each, so a Port evaluates only the groups that can select it; a
//!   selector that is just that pair (or `{}`) needs no evaluation, and a
//!   selector's error (which never depends on the labels) is found once
//!   per group. The output maps are built once from sorted lists, not by an
//!   insert per entry. [`compile_security_groups`] builds an index from
//!   lists and compiles it; a test checks it against the compiler before
//!   the rework (`reference.rs`) on random inputs, and an index kept by
//!   random updates against one built from scratch.
//!
//! Anything that cannot be compiled is skipped and reported as a
//! [`SgDiagnostic`]; a rule that is skipped allows nothing (fail closed),
//! and a group whose selector cannot be evaluated selects nobody.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use cozyplane_api::sdn::SecurityGroupPort;
use cozyplane_api::{Port, SecurityGroup, VPC};
use cozyplane_datapath::abi::{
    sg_cidr_key, EpKey, SgGroups, SgRule, SG_EGRESS, SG_INGRESS, SG_MAX_GROUPS, SG_PEER_CIDR,
    SG_RULE_FIXED_BITS,
};
use cozyplane_datapath::sg::{CidrEntry, RuleEntry, SgDesired};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;

mod index;

use index::{evaluate, GroupRecord, Prefix, Rule, Sym, Test, ABSENT};
pub use index::{SgIndex, SgIndexed, SgKind};

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

/// A map from a list where a later entry for a key replaces an earlier one,
/// as repeated `insert`s would: a stable sort, the last of each run kept in
/// place (no second list: at 5 000 members that is a 440 KB buffer whose
/// fresh pages cost more than the copy), and the tree built in one pass
/// from the sorted input (no insert per entry).
fn last_wins<K: Ord, V>(mut entries: Vec<(K, V)>) -> BTreeMap<K, V> {
    dedup_last(&mut entries);
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

/// Sorts by key; of equal keys the last stays (as repeated `insert`s into
/// a map would leave it), in place.
fn dedup_last<K: Ord, V>(entries: &mut Vec<(K, V)>) {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    // `dedup_by` keeps the first of a run: swap the later value into it
    entries.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            std::mem::swap(later, kept);
        }
        same
    });
}

fn emit_rules(
    rules: &mut Vec<(RuleEntry, u32)>,
    subject: (u32, u32),
    dir: u8,
    peer: (u32, u32),
    prefixes: &[Prefix],
) {
    for &(proto, start, bits) in prefixes {
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

/// A group as member selection uses it.
struct Selecting<'a> {
    id: u32,
    group: &'a GroupRecord,
    test: &'a Test,
    /// Was it a candidate with a bad selector (then it is reported)?
    reported: bool,
}

/// The groups of one VPC that select members, indexed by one `matchLabels`
/// pair each, so a Port evaluates only the groups that can select it.
struct VpcGroups<'a> {
    /// The VPC's VNI (`None` only for duplicate group names).
    vni: Option<u32>,
    groups: Vec<Selecting<'a>>,
    /// `(pair, group)`, sorted.
    keyed: Vec<((Sym, Sym), u32)>,
    unkeyed: Vec<u32>,
}

/// Compiles the SecurityGroup maps from the objects; see the module docs.
/// The agent keeps an [`SgIndex`] up to date at watch time and calls
/// [`SgIndex::compile`]; this builds the index from the lists first.
pub fn compile_security_groups(
    vpcs: &[VPC],
    groups: &[SecurityGroup],
    ports: &[Port],
    pods: &[Pod],
) -> CompiledSecurityGroups {
    SgIndex::from_objects(vpcs, groups, ports, pods).compile()
}

impl SgIndex {
    /// Compiles the SecurityGroup maps from the index; see the module docs.
    pub fn compile(&self) -> CompiledSecurityGroups {
        let mut diagnostics = Vec::new();
        let entries: Vec<&GroupRecord> = self.groups.iter().collect();

        // ids: per net, older groups first keep their hash
        let mut ordered = entries.clone();
        ordered.sort_by(|a, b| {
            let created = |g: &GroupRecord| g.created.as_ref().map(|t| t.0);
            (created(a), &a.namespace, &a.name).cmp(&(created(b), &b.namespace, &b.name))
        });
        let mut ids: BTreeMap<(String, String), (u32, u32)> = BTreeMap::new();
        let mut by_sym: Vec<(Sym, (u32, u32))> = Vec::with_capacity(entries.len());
        // ids hash tenants' uids (or names): a keyed hasher here too
        let mut taken: HashMap<u32, HashSet<u32>> = HashMap::new();
        for g in ordered {
            let Some(net) = self.vni(g.vpc) else {
                diagnostics.push(SgDiagnostic::VpcNotReady {
                    group: g.display.clone(),
                    vpc: format!("{}/{}", g.namespace, g.vpc_name),
                });
                continue;
            };
            let used = taken.entry(net).or_default();
            let mut id = g.hash.max(1);
            let first = id;
            while used.contains(&id) {
                id = id.wrapping_add(1).max(1);
            }
            if id != first {
                diagnostics.push(SgDiagnostic::IdCollision {
                    group: g.display.clone(),
                    id,
                });
            }
            used.insert(id);
            ids.insert((g.namespace.clone(), g.name.clone()), (net, id));
            by_sym.push((g.sym, (net, id)));
        }
        // a group's `{net, id}` by its key: the entry `ids` kept
        dedup_last(&mut by_sym);
        let id_of = |sym: Sym| -> Option<(u32, u32)> {
            let i = by_sym.binary_search_by_key(&sym, |e| e.0).ok()?;
            by_sym.get(i).map(|e| e.1)
        };

        // rules
        let mut rules: Vec<(RuleEntry, u32)> = Vec::new();
        let mut cidrs: Vec<(CidrEntry, u32)> = Vec::new();
        for g in &entries {
            let Some(subject) = id_of(g.sym) else {
                continue;
            };
            for (dir, d) in [(SG_INGRESS, &g.ingress), (SG_EGRESS, &g.egress)] {
                for rule in &d.rules {
                    match rule {
                        Rule::BadPort(detail) => diagnostics.push(SgDiagnostic::BadPort {
                            group: g.display.clone(),
                            detail: detail.clone(),
                        }),
                        Rule::BadPeer(detail) => diagnostics.push(SgDiagnostic::BadPeer {
                            group: g.display.clone(),
                            detail: detail.clone(),
                        }),
                        Rule::Group {
                            vpc,
                            group,
                            peer,
                            prefixes,
                        } => {
                            // the group's own VPC, or the named (peered) one
                            let net = match vpc {
                                None => Some(subject.0),
                                Some(v) => self.vni(*v),
                            };
                            match (id_of(*group), net) {
                                (Some((gnet, id)), Some(net)) if gnet == net => {
                                    emit_rules(&mut rules, subject, dir, (net, id), prefixes);
                                }
                                _ => diagnostics.push(SgDiagnostic::UnknownPeerGroup {
                                    group: g.display.clone(),
                                    peer: peer.clone(),
                                }),
                            }
                        }
                    }
                }
                for (i, class) in d.classes.iter().enumerate() {
                    let n = u32::try_from(i + 1).unwrap_or(u32::MAX);
                    let (addr, len) = class.prefix;
                    let Some(key) = sg_cidr_key(
                        subject.0,
                        subject.1,
                        dir,
                        IpAddr::V6(Ipv6Addr::from(addr)),
                        len,
                    ) else {
                        continue; // lengths come from parsed prefixes: never too long
                    };
                    cidrs.push((CidrEntry::from(key), n));
                    emit_rules(&mut rules, subject, dir, (SG_PEER_CIDR, n), &class.prefixes);
                }
            }
        }

        // members: candidate groups per VPC, indexed by one matchLabels pair
        let mut by_vpc: Vec<VpcGroups> = Vec::new();
        // VPC sym → its entry in `by_vpc`
        let mut vpc_slot: Vec<u32> = vec![ABSENT; self.sym_bound()];
        for &g in &entries {
            let Some((_, id)) = id_of(g.sym) else {
                continue;
            };
            let Some(sel) = g.selector.as_ref() else {
                continue; // selects nobody
            };
            let Some(slot) = vpc_slot.get_mut(g.vpc as usize) else {
                continue; // every sym is below the bound
            };
            if *slot == ABSENT {
                *slot = u32::try_from(by_vpc.len()).unwrap_or(ABSENT);
                by_vpc.push(VpcGroups {
                    vni: self.vni(g.vpc),
                    groups: Vec::new(),
                    keyed: Vec::new(),
                    unkeyed: Vec::new(),
                });
            }
            let Some(vg) = by_vpc.get_mut(*slot as usize) else {
                continue;
            };
            let idx = u32::try_from(vg.groups.len()).unwrap_or(u32::MAX);
            vg.groups.push(Selecting {
                id,
                group: g,
                test: &sel.test,
                reported: false,
            });
            match sel.index {
                Some(pair) => vg.keyed.push((pair, idx)),
                None => vg.unkeyed.push(idx),
            }
        }
        for vg in &mut by_vpc {
            vg.keyed.sort_unstable();
        }
        let mut candidates: Vec<u32> = Vec::new();
        let mut selected: Vec<u32> = Vec::new();
        let mut members: Vec<(EpKey, SgGroups)> = Vec::with_capacity(self.ports.len());
        for port in self.ports.iter() {
            let Some(vpc) = port.vpc else {
                diagnostics.push(SgDiagnostic::BadClaim {
                    port: port.cold.name.clone(),
                    detail: "spec.vpcRef has no namespace".into(),
                });
                continue;
            };
            let Some(vg) = vpc_slot
                .get(vpc as usize)
                .and_then(|&s| by_vpc.get_mut(s as usize))
            else {
                continue; // no group selects anything in this VPC
            };
            // the claim's VNI must be the VPC's (a stale claim of a
            // re-created VPC is not a member)
            let vni = vg.vni;
            let (Some(_), Some(key)) = (vni.filter(|v| Some(*v) == port.claimed), port.key) else {
                diagnostics.push(SgDiagnostic::BadClaim {
                    port: port.cold.name.clone(),
                    detail: format!(
                        "not a claim of VPC {}/{} (its VNI {vni:?}) with a valid spec.ip",
                        port.cold.vpc_namespace, port.cold.vpc_name
                    ),
                });
                continue;
            };
            // the live pod's labels, else the Port's snapshot
            let labels = self.pod_labels(port.pod).unwrap_or(&port.snapshot[..]);
            candidates.clear();
            candidates.extend_from_slice(&vg.unkeyed);
            if !vg.keyed.is_empty() {
                for &pair in labels {
                    let from = vg.keyed.partition_point(|e| e.0 < pair);
                    let hits = vg.keyed.get(from..).unwrap_or_default();
                    candidates.extend(hits.iter().take_while(|e| e.0 == pair).map(|e| e.1));
                }
            }
            selected.clear();
            for &i in &candidates {
                let Some(s) = vg.groups.get_mut(i as usize) else {
                    continue;
                };
                match s.test {
                    Test::Implied => selected.push(s.id),
                    Test::Evaluate { pairs, exprs } => {
                        if evaluate(pairs, exprs, labels) {
                            selected.push(s.id);
                        }
                    }
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
                    port: port.cold.name.clone(),
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
            if let Some(dst) = value.ids.get_mut(..selected.len()) {
                dst.copy_from_slice(&selected);
            }
            value.count = u32::try_from(selected.len()).unwrap_or(0);
            members.push((key, value));
        }
        let mut bad_selectors: BTreeMap<String, String> = BTreeMap::new();
        for vg in &by_vpc {
            for s in &vg.groups {
                if let (Test::Bad(e), true) = (s.test, s.reported) {
                    bad_selectors.insert(s.group.display.clone(), e.to_string());
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
                rules: last_wins(rules),
                cidrs: last_wins(cidrs),
            },
            ids,
            diagnostics,
        }
    }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
