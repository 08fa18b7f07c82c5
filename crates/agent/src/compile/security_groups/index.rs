//! The SecurityGroup compiler's input as compact records, kept up to date
//! at watch time ([`SgIndex`]; the parent module's docs, "Cost", say why).
//!
//! * **Interning.** Every string the compile compares — label keys and
//!   values, and the `namespace/name` of VPCs, groups and pods as one
//!   length-prefixed key — is interned once, when its object is applied, to
//!   a dense [`Sym`]. The interner's table is std's `HashMap` with its keyed
//!   SipHash (`RandomState`): the strings are tenants' input, so they must
//!   not be able to choose colliding keys. It is reference-counted: a record
//!   holds every sym it took and gives them back when it is replaced or
//!   removed, so the table holds only strings some live object uses (a
//!   tenant churning labels cannot grow it), and a freed sym is reused.
//! * **Records.** A Port becomes its VPC's sym, the VNI its name claims, its
//!   member key (claim VNI + parsed `spec.ip`), its pod's sym and its parsed
//!   `pod-labels` snapshot as sorted `(key, value)` syms; a pod becomes its
//!   labels the same way; a VPC its VNI (in a table indexed by the VPC's
//!   sym); a SecurityGroup its hashed id seed, its `podSelector` as an
//!   integer matcher (or the selector's error, which never depends on the
//!   labels) and its rules with their port specs expanded into prefixes,
//!   peers as syms and its CIDR classes already built (they depend on the
//!   group alone). The compile then reads integers and small slices.
//! * **Reuse.** Applying an object whose key the index knows with the same
//!   `resourceVersion` does nothing (a relist re-delivers every object).
//! * **Order.** Records live in slabs; the compile walks them in slot order.
//!   With unique keys (as the API server guarantees) the output does not
//!   depend on that order. [`SgIndex::from_objects`] keeps every entry of
//!   its lists, duplicates too, in list order, so the pure
//!   [`super::compile_security_groups`] gives exactly the output it gave
//!   before the index (duplicates included).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use cozyplane_api::labels::ANNOTATION_POD_LABELS;
use cozyplane_api::names::FIRST_VPC_VNI;
use cozyplane_api::sdn::{SecurityGroupPeer, SecurityGroupPort};
use cozyplane_api::selector::{selector_matches, SelectorError};
use cozyplane_api::{Port, SecurityGroup, VPC};
use cozyplane_datapath::abi::{port_range_prefixes, sg_member_key, EpKey};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

use super::{
    fnv1a32, in_key_space, is_v4_key, key_contains, port_specs, KeyPrefix, PortSpec, NAT64_KEY,
};

/// An interned string: a dense index into the interner's table.
pub(super) type Sym = u32;

/// "No entry" in the sym-indexed tables.
pub(super) const ABSENT: u32 = u32::MAX;

/// Reference-counted string interning; see the module docs.
#[derive(Debug, Default)]
struct Interner {
    /// String → sym, with std's keyed SipHash (tenants' strings).
    ids: HashMap<Arc<str>, Sym>,
    /// Sym → its string and how many references records hold; `None`
    /// when freed (and on `free`).
    slots: Vec<Option<(Arc<str>, u32)>>,
    free: Vec<Sym>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> Sym {
        if let Some(&sym) = self.ids.get(s) {
            if let Some(Some((_, refs))) = self.slots.get_mut(sym as usize) {
                *refs += 1;
            }
            return sym;
        }
        let s: Arc<str> = Arc::from(s);
        let sym = match self.free.pop() {
            Some(sym) => {
                if let Some(slot) = self.slots.get_mut(sym as usize) {
                    *slot = Some((s.clone(), 1));
                }
                sym
            }
            None => {
                self.slots.push(Some((s.clone(), 1)));
                u32::try_from(self.slots.len() - 1).unwrap_or(ABSENT)
            }
        };
        self.ids.insert(s, sym);
        sym
    }

    fn release(&mut self, sym: Sym) {
        let Some(slot) = self.slots.get_mut(sym as usize) else {
            return;
        };
        let Some((s, refs)) = slot else {
            return;
        };
        *refs -= 1;
        if *refs == 0 {
            self.ids.remove(&**s);
            *slot = None;
            self.free.push(sym);
        }
    }

    /// Every sym is below this.
    fn bound(&self) -> usize {
        self.slots.len()
    }
}

/// Interns for one record and remembers what it took, to give it back.
struct Taker<'a> {
    interner: &'a mut Interner,
    held: Vec<Sym>,
}

impl<'a> Taker<'a> {
    fn new(interner: &'a mut Interner) -> Self {
        Self {
            interner,
            held: Vec::new(),
        }
    }

    fn sym(&mut self, s: &str) -> Sym {
        let sym = self.interner.intern(s);
        self.held.push(sym);
        sym
    }

    /// The key of an object (or a reference to one): one string, its
    /// namespace length-prefixed so no two pairs share it.
    fn object(&mut self, ns: &str, name: &str) -> Sym {
        self.sym(&object_key(ns, name))
    }

    fn labels(&mut self, labels: &BTreeMap<String, String>) -> Labels {
        let mut out: Vec<(Sym, Sym)> = labels
            .iter()
            .map(|(k, v)| (self.sym(k), self.sym(v)))
            .collect();
        out.sort_unstable(); // keys are distinct: sorted by key
        out.into_boxed_slice()
    }

    fn done(self) -> Box<[Sym]> {
        self.held.into_boxed_slice()
    }
}

fn object_key(ns: &str, name: &str) -> String {
    format!("{}:{ns}/{name}", ns.len())
}

/// `(namespace, name)` of an object, borrowed (absent ones are `""`).
pub(super) fn ns_name(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// Labels as interned `(key, value)` pairs, sorted by key.
pub(super) type Labels = Box<[(Sym, Sym)]>;

/// The value of `key` in `labels`.
fn label(labels: &[(Sym, Sym)], key: Sym) -> Option<Sym> {
    labels
        .binary_search_by_key(&key, |&(k, _)| k)
        .ok()
        .and_then(|i| labels.get(i))
        .map(|&(_, v)| v)
}

/// A slab: records in slots, freed slots reused.
#[derive(Debug)]
pub(super) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    fn insert(&mut self, t: T) -> usize {
        match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.items.get_mut(i) {
                    *slot = Some(t);
                }
                i
            }
            None => {
                self.items.push(Some(t));
                self.items.len() - 1
            }
        }
    }

    fn replace(&mut self, i: usize, t: T) -> Option<T> {
        self.items.get_mut(i).and_then(|slot| slot.replace(t))
    }

    fn remove(&mut self, i: usize) -> Option<T> {
        let old = self.items.get_mut(i).and_then(Option::take);
        if old.is_some() {
            self.free.push(i);
        }
        old
    }

    pub(super) fn get(&self, i: usize) -> Option<&T> {
        self.items.get(i).and_then(Option::as_ref)
    }

    /// The records in slot order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter().flatten()
    }

    pub(super) fn len(&self) -> usize {
        self.items.len() - self.free.len()
    }
}

/// "No VNI" in the VNI table (a VPC's VNI is at least `FIRST_VPC_VNI`).
const NO_VNI: u32 = 0;

/// Sets `table[sym]`, growing the table with `fill`.
fn set_at(table: &mut Vec<u32>, sym: Sym, value: u32, fill: u32) {
    let i = sym as usize;
    if table.len() <= i {
        table.resize(i + 1, fill);
    }
    if let Some(e) = table.get_mut(i) {
        *e = value;
    }
}

/// A VPC: its VNI if it has a usable one.
#[derive(Debug)]
struct VpcRecord {
    sym: Sym,
    version: Option<String>,
}

/// The VNI of a VPC, if it has one and it is a VPC's.
fn vpc_vni(v: &VPC) -> Option<u32> {
    let vni = v.status.as_ref()?.vni?;
    u32::try_from(vni).ok().filter(|v| *v >= FIRST_VPC_VNI)
}

/// A pod: its live labels.
#[derive(Debug)]
pub(super) struct PodRecord {
    pub(super) labels: Labels,
    sym: Sym,
    version: Option<String>,
    held: Box<[Sym]>,
}

/// A Port, as the member selection reads it.
#[derive(Debug)]
pub(super) struct PortRecord {
    /// Its VPC (`spec.vpcRef`); `None` when the reference has no namespace.
    pub(super) vpc: Option<Sym>,
    /// The VNI its name claims.
    pub(super) claimed: Option<u32>,
    /// Its member key (the claimed VNI and `spec.ip`), if both parse.
    pub(super) key: Option<EpKey>,
    /// Its pod (`spec.podNamespace`/`podName`).
    pub(super) pod: Sym,
    /// The parsed `pod-labels` snapshot (empty when absent or unparsable).
    pub(super) snapshot: Labels,
    /// What only diagnostics and updates read.
    pub(super) cold: Box<PortCold>,
}

/// The parts of a Port record the compile reads only for a diagnostic.
#[derive(Debug)]
pub(super) struct PortCold {
    pub(super) name: String,
    pub(super) vpc_namespace: String,
    pub(super) vpc_name: String,
    version: Option<String>,
    held: Box<[Sym]>,
}

/// One port spec expanded: protocol, first port, prefix bits.
pub(super) type Prefix = (u8, u16, u8);

fn prefixes(specs: &[PortSpec]) -> Box<[Prefix]> {
    specs
        .iter()
        .flat_map(|&(proto, lo, hi)| {
            port_range_prefixes(lo, hi)
                .into_iter()
                .map(move |(start, bits)| (proto, start, bits))
        })
        .collect()
}

/// A rule of a group, resolved as far as the group alone allows.
#[derive(Debug)]
pub(super) enum Rule {
    /// Its ports are malformed: skipped, reported.
    BadPort(String),
    /// Its peer is malformed: skipped, reported.
    BadPeer(String),
    /// A group peer, resolved at compile time (ids are per compile).
    Group {
        /// The peer's VPC (`vpc`); `None`: the subject's own.
        vpc: Option<Sym>,
        /// The peer group's key.
        group: Sym,
        /// `namespace/name` of the peer, for its diagnostic.
        peer: String,
        prefixes: Box<[Prefix]>,
    },
}

/// A CIDR class of one group and direction (`emit_cidr_classes` before).
#[derive(Debug)]
pub(super) struct CidrClass {
    pub(super) prefix: KeyPrefix,
    pub(super) prefixes: Box<[Prefix]>,
}

/// The rules of one direction.
#[derive(Debug, Default)]
pub(super) struct Direction {
    /// Group peers and what was skipped, in rule order.
    pub(super) rules: Vec<Rule>,
    /// The CIDR classes; class `i + 1` is `classes[i]`.
    pub(super) classes: Vec<CidrClass>,
}

/// How a selector is decided for a Port's labels.
#[derive(Debug)]
pub(super) enum Test {
    /// Being a candidate proves the match: the selector is `{}`, or its one
    /// requirement is the `matchLabels` pair the group is indexed by.
    Implied,
    /// Evaluate these requirements.
    Evaluate {
        /// `matchLabels`.
        pairs: Labels,
        /// `matchExpressions`.
        exprs: Box<[Expr]>,
    },
    /// It cannot be evaluated (the error does not depend on the labels).
    Bad(SelectorError),
}

/// One `matchExpressions` requirement, interned.
#[derive(Debug)]
pub(super) struct Expr {
    key: Sym,
    op: Op,
    values: Box<[Sym]>,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// A `podSelector` as the compile uses it.
#[derive(Debug)]
pub(super) struct Selector {
    /// The `matchLabels` pair the group is indexed by (its first).
    pub(super) index: Option<(Sym, Sym)>,
    pub(super) test: Test,
}

impl Selector {
    fn new(t: &mut Taker<'_>, sel: &LabelSelector) -> Self {
        let index = sel
            .match_labels
            .as_ref()
            .and_then(|m| m.iter().next())
            .map(|(k, v)| (t.sym(k), t.sym(v)));
        let pairs = sel.match_labels.as_ref().map_or(0, BTreeMap::len);
        let exprs = sel.match_expressions.as_ref().map_or(0, Vec::len);
        // an error does not depend on the labels: find it once
        let test = match selector_matches(sel, &BTreeMap::new()) {
            Err(e) => Test::Bad(e),
            Ok(_) if exprs == 0 && pairs <= 1 => Test::Implied,
            Ok(_) => Self::requirements(t, sel),
        };
        Self { index, test }
    }

    fn requirements(t: &mut Taker<'_>, sel: &LabelSelector) -> Test {
        let pairs = sel
            .match_labels
            .as_ref()
            .map(|m| t.labels(m))
            .unwrap_or_default();
        let mut exprs = Vec::new();
        for req in sel.match_expressions.iter().flatten() {
            let op = match req.operator.as_str() {
                "In" => Op::In,
                "NotIn" => Op::NotIn,
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                // found by `selector_matches` already; kept total
                other => {
                    return Test::Bad(SelectorError::UnknownOperator {
                        key: req.key.clone(),
                        operator: other.to_string(),
                    })
                }
            };
            let values = req
                .values
                .iter()
                .flatten()
                .map(|v| t.sym(v))
                .collect::<Vec<_>>()
                .into_boxed_slice();
            exprs.push(Expr {
                key: t.sym(&req.key),
                op,
                values,
            });
        }
        Test::Evaluate {
            pairs,
            exprs: exprs.into_boxed_slice(),
        }
    }
}

/// Do `pairs` and `exprs` select `labels` (`selector_matches` on syms)?
pub(super) fn evaluate(pairs: &[(Sym, Sym)], exprs: &[Expr], labels: &[(Sym, Sym)]) -> bool {
    pairs.iter().all(|&(k, v)| label(labels, k) == Some(v))
        && exprs.iter().all(|e| {
            let have = label(labels, e.key);
            match e.op {
                Op::In => have.is_some_and(|h| e.values.contains(&h)),
                Op::NotIn => !have.is_some_and(|h| e.values.contains(&h)),
                Op::Exists => have.is_some(),
                Op::DoesNotExist => have.is_none(),
            }
        })
}

/// A SecurityGroup, as far as it alone decides.
#[derive(Debug)]
pub(super) struct GroupRecord {
    pub(super) namespace: String,
    pub(super) name: String,
    /// `namespace/name`, for diagnostics.
    pub(super) display: String,
    /// `spec.vpcRef.name`, for its diagnostic.
    pub(super) vpc_name: String,
    /// The group's key.
    pub(super) sym: Sym,
    /// Its VPC.
    pub(super) vpc: Sym,
    pub(super) created: Option<Time>,
    /// The id it gets unless that collides: FNV-1a of its uid.
    pub(super) hash: u32,
    /// `None`: selects nobody.
    pub(super) selector: Option<Selector>,
    pub(super) ingress: Direction,
    pub(super) egress: Direction,
    version: Option<String>,
    held: Box<[Sym]>,
}

impl GroupRecord {
    fn new(interner: &mut Interner, g: &SecurityGroup) -> Self {
        let mut t = Taker::new(interner);
        let (ns, name) = ns_name(&g.metadata);
        let hash = match g.metadata.uid.as_deref() {
            Some(uid) => fnv1a32(uid),
            None => fnv1a32(&format!("{ns}/{name}")),
        };
        let sym = t.object(ns, name);
        let vpc = t.object(ns, &g.spec.vpc_ref.name);
        let selector = g
            .spec
            .pod_selector
            .as_ref()
            .map(|s| Selector::new(&mut t, s));
        let ingress = direction(
            &mut t,
            ns,
            g.spec.ingress.iter().map(|r| (&r.from, &r.ports[..])),
        );
        let egress = direction(
            &mut t,
            ns,
            g.spec.egress.iter().map(|r| (&r.to, &r.ports[..])),
        );
        Self {
            namespace: ns.to_string(),
            name: name.to_string(),
            display: format!("{ns}/{name}"),
            vpc_name: g.spec.vpc_ref.name.clone(),
            sym,
            vpc,
            created: g.metadata.creation_timestamp.clone(),
            hash,
            selector,
            ingress,
            egress,
            version: g.metadata.resource_version.clone(),
            held: t.done(),
        }
    }
}

/// The rules of one direction of a group in namespace `ns`.
fn direction<'r>(
    t: &mut Taker<'_>,
    ns: &str,
    rules: impl Iterator<Item = (&'r SecurityGroupPeer, &'r [SecurityGroupPort])>,
) -> Direction {
    let mut out = Vec::new();
    let mut cidrs: Vec<(IpNet, Vec<PortSpec>)> = Vec::new();
    for (peer, ports) in rules {
        let specs = match port_specs(ports) {
            Ok(s) => s,
            Err(detail) => {
                out.push(Rule::BadPort(detail));
                continue;
            }
        };
        let bad = |detail: &str| Rule::BadPeer(detail.to_string());
        match (&peer.group, &peer.cidr) {
            (Some(g), None) => {
                // the group's own VPC, or the named (peered) one
                let (pns, vpc) = match peer.vpc.as_ref() {
                    None => (ns, None),
                    Some(v) => (v.namespace.as_str(), Some(t.object(&v.namespace, &v.name))),
                };
                out.push(Rule::Group {
                    vpc,
                    group: t.object(pns, g),
                    peer: format!("{pns}/{g}"),
                    prefixes: prefixes(&specs),
                });
            }
            (None, Some(c)) if peer.vpc.is_none() => match c.parse::<IpNet>() {
                Ok(n) => cidrs.push((n.trunc(), specs)),
                Err(_) => out.push(Rule::BadPeer(format!("{c:?} is not a CIDR"))),
            },
            (None, Some(_)) => out.push(bad("a peer vpc needs a group, not a cidr")),
            (Some(_), Some(_)) => out.push(bad("a peer has both group and cidr")),
            (None, None) => out.push(bad("a peer has neither group nor cidr")),
        }
    }
    Direction {
        rules: out,
        classes: cidr_classes(&cidrs),
    }
}

/// The CIDR classes of one group and direction: one per distinct prefix,
/// holding the ports of every same-family prefix that contains it.
fn cidr_classes(cidrs: &[(IpNet, Vec<PortSpec>)]) -> Vec<CidrClass> {
    // distinct prefixes (the IPv4 /0 and 64:ff9b::/96 are one key)
    let mut classes: BTreeMap<KeyPrefix, Vec<PortSpec>> = BTreeMap::new();
    for (c, _) in cidrs {
        classes.entry(in_key_space(c)).or_default();
        // an IPv6 prefix over 64:ff9b::/96 must not admit IPv4 sources
        if c.addr().is_ipv6() && key_contains(in_key_space(c), NAT64_KEY) {
            classes.entry(NAT64_KEY).or_default();
        }
    }
    for (c, specs) in cidrs {
        let outer = in_key_space(c);
        for (&class, class_specs) in classes.iter_mut() {
            if c.addr().is_ipv4() == is_v4_key(class) && key_contains(outer, class) {
                class_specs.extend_from_slice(specs);
            }
        }
    }
    classes
        .into_iter()
        .map(|(prefix, specs)| CidrClass {
            prefix,
            prefixes: prefixes(&specs),
        })
        .collect()
}

impl PortRecord {
    fn new(interner: &mut Interner, port: &Port) -> Self {
        let mut t = Taker::new(interner);
        let name = port.metadata.name.as_deref().unwrap_or_default();
        let vref = &port.spec.vpc_ref;
        let vpc = vref
            .namespace
            .as_deref()
            .map(|vns| t.object(vns, &vref.name));
        // the name is validated at create, so its VNI prefix and spec.ip
        // are the claim
        let claimed = name
            .strip_prefix('v')
            .and_then(|r| r.split_once('.'))
            .and_then(|(d, _)| d.parse::<u32>().ok());
        let ip = port.spec.ip.parse::<IpAddr>().ok();
        let pod = t.object(
            port.spec.pod_namespace.as_deref().unwrap_or_default(),
            port.spec.pod_name.as_deref().unwrap_or_default(),
        );
        let snapshot = port
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_POD_LABELS))
            .and_then(|raw| serde_json::from_str::<BTreeMap<String, String>>(raw).ok())
            .map(|labels| t.labels(&labels))
            .unwrap_or_default();
        Self {
            vpc,
            claimed,
            key: claimed.zip(ip).map(|(vni, ip)| sg_member_key(vni, ip)),
            pod,
            snapshot,
            cold: Box::new(PortCold {
                name: name.to_string(),
                vpc_namespace: vref.namespace.clone().unwrap_or_default(),
                vpc_name: vref.name.clone(),
                version: port.metadata.resource_version.clone(),
                held: t.done(),
            }),
        }
    }
}

impl PodRecord {
    fn new(interner: &mut Interner, pod: &Pod) -> Self {
        let mut t = Taker::new(interner);
        let (ns, name) = ns_name(&pod.metadata);
        let sym = t.object(ns, name);
        let labels = pod
            .metadata
            .labels
            .as_ref()
            .map(|l| t.labels(l))
            .unwrap_or_default();
        Self {
            labels,
            sym,
            version: pod.metadata.resource_version.clone(),
            held: t.done(),
        }
    }
}

/// The kinds the index holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SgKind {
    /// VPCs (their VNIs).
    Vpc,
    /// SecurityGroups.
    SecurityGroup,
    /// Ports (every node's).
    Port,
    /// Pods (the live labels; on a node, its own pods).
    Pod,
}

/// An object the index holds: its kind and key, and how it is applied.
pub trait SgIndexed {
    /// Its kind.
    const KIND: SgKind;
    /// The key the index knows it by ([`SgIndex::keys`], [`SgIndex::remove`]).
    fn index_key(&self) -> String;
    /// Adds or replaces it in `index`.
    fn apply_to(&self, index: &mut SgIndex);
}

impl SgIndexed for VPC {
    const KIND: SgKind = SgKind::Vpc;
    fn index_key(&self) -> String {
        let (ns, name) = ns_name(&self.metadata);
        object_key(ns, name)
    }
    fn apply_to(&self, index: &mut SgIndex) {
        index.apply_vpc(self);
    }
}

impl SgIndexed for SecurityGroup {
    const KIND: SgKind = SgKind::SecurityGroup;
    fn index_key(&self) -> String {
        let (ns, name) = ns_name(&self.metadata);
        object_key(ns, name)
    }
    fn apply_to(&self, index: &mut SgIndex) {
        index.apply_group(self);
    }
}

impl SgIndexed for Port {
    const KIND: SgKind = SgKind::Port;
    fn index_key(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }
    fn apply_to(&self, index: &mut SgIndex) {
        index.apply_port(self);
    }
}

impl SgIndexed for Pod {
    const KIND: SgKind = SgKind::Pod;
    fn index_key(&self) -> String {
        let (ns, name) = ns_name(&self.metadata);
        object_key(ns, name)
    }
    fn apply_to(&self, index: &mut SgIndex) {
        index.apply_pod(self);
    }
}

/// Is `version` the one already recorded (so the record can be reused)?
fn unchanged(recorded: Option<&str>, version: Option<&str>) -> bool {
    version.is_some() && recorded == version
}

/// The SecurityGroup compiler's input, kept at watch time; see the module
/// docs. The agent applies every watch event of VPCs, SecurityGroups,
/// Ports and its pods to one index and compiles from it
/// ([`SgIndex::compile`]).
#[derive(Debug, Default)]
pub struct SgIndex {
    interner: Interner,
    vpcs: HashMap<String, VpcRecord>,
    /// VPC sym → its VNI (`NO_VNI`: none).
    vni_of: Vec<u32>,
    pub(super) groups: Slab<GroupRecord>,
    group_slots: HashMap<String, usize>,
    pub(super) ports: Slab<PortRecord>,
    port_slots: HashMap<String, usize>,
    pods: Slab<PodRecord>,
    pod_slots: HashMap<String, usize>,
    /// Pod sym → its slot ([`ABSENT`]: no live pod).
    pod_of: Vec<u32>,
}

impl SgIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// An index of these lists, as the pure compile takes them: every
    /// group and Port entry is kept in list order (duplicates too, which
    /// watch updates never make); of VPCs with one name the last with a
    /// VNI counts, of pods the last.
    pub fn from_objects(
        vpcs: &[VPC],
        groups: &[SecurityGroup],
        ports: &[Port],
        pods: &[Pod],
    ) -> Self {
        let mut index = Self::new();
        for v in vpcs.iter().filter(|v| vpc_vni(v).is_some()) {
            index.apply_vpc(v);
        }
        for g in groups {
            let record = GroupRecord::new(&mut index.interner, g);
            index.groups.insert(record);
        }
        for p in pods {
            index.apply_pod(p);
        }
        for p in ports {
            let record = PortRecord::new(&mut index.interner, p);
            index.ports.insert(record);
        }
        index
    }

    /// Adds or replaces an object (a watch's apply event).
    pub fn apply<K: SgIndexed>(&mut self, object: &K) {
        object.apply_to(self);
    }

    /// Removes an object (a watch's delete event).
    pub fn delete<K: SgIndexed>(&mut self, object: &K) {
        self.remove(K::KIND, &object.index_key());
    }

    /// The keys of every object of `kind` ([`SgIndexed::index_key`]), for a
    /// relist: what the relist does not deliver again is gone.
    pub fn keys(&self, kind: SgKind) -> Vec<String> {
        match kind {
            SgKind::Vpc => self.vpcs.keys().cloned().collect(),
            SgKind::SecurityGroup => self.group_slots.keys().cloned().collect(),
            SgKind::Port => self.port_slots.keys().cloned().collect(),
            SgKind::Pod => self.pod_slots.keys().cloned().collect(),
        }
    }

    /// Removes the object of `kind` with `key`, if the index has it.
    pub fn remove(&mut self, kind: SgKind, key: &str) {
        match kind {
            SgKind::Vpc => {
                if let Some(old) = self.vpcs.remove(key) {
                    set_at(&mut self.vni_of, old.sym, NO_VNI, NO_VNI);
                    self.interner.release(old.sym);
                }
            }
            SgKind::SecurityGroup => {
                let old = self
                    .group_slots
                    .remove(key)
                    .and_then(|s| self.groups.remove(s));
                if let Some(old) = old {
                    self.release(&old.held);
                }
            }
            SgKind::Port => {
                let old = self
                    .port_slots
                    .remove(key)
                    .and_then(|s| self.ports.remove(s));
                if let Some(old) = old {
                    self.release(&old.cold.held);
                }
            }
            SgKind::Pod => {
                let old = self.pod_slots.remove(key).and_then(|s| self.pods.remove(s));
                if let Some(old) = old {
                    set_at(&mut self.pod_of, old.sym, ABSENT, ABSENT);
                    self.release(&old.held);
                }
            }
        }
    }

    /// How many objects of `kind` the index holds.
    pub fn len(&self, kind: SgKind) -> usize {
        match kind {
            SgKind::Vpc => self.vpcs.len(),
            SgKind::SecurityGroup => self.groups.len(),
            SgKind::Port => self.ports.len(),
            SgKind::Pod => self.pods.len(),
        }
    }

    /// How many distinct strings are interned (only those live records use).
    pub fn interned(&self) -> usize {
        self.interner.ids.len()
    }

    fn release(&mut self, held: &[Sym]) {
        for &sym in held {
            self.interner.release(sym);
        }
    }

    fn apply_vpc(&mut self, v: &VPC) {
        let (ns, name) = ns_name(&v.metadata);
        let version = v.metadata.resource_version.as_deref();
        let sym = match self.vpcs.entry(object_key(ns, name)) {
            Entry::Occupied(mut e) => {
                if unchanged(e.get().version.as_deref(), version) {
                    return;
                }
                e.get_mut().version = version.map(str::to_string);
                e.get().sym
            }
            Entry::Vacant(e) => {
                let sym = self.interner.intern(e.key());
                e.insert(VpcRecord {
                    sym,
                    version: version.map(str::to_string),
                });
                sym
            }
        };
        set_at(&mut self.vni_of, sym, vpc_vni(v).unwrap_or(NO_VNI), NO_VNI);
    }

    fn apply_group(&mut self, g: &SecurityGroup) {
        let key = g.index_key();
        let slot = self.group_slots.get(&key).copied();
        if let Some(old) = slot.and_then(|s| self.groups.get(s)) {
            if unchanged(
                old.version.as_deref(),
                g.metadata.resource_version.as_deref(),
            ) {
                return;
            }
        }
        // the new record first: the syms both share are not freed and re-made
        let record = GroupRecord::new(&mut self.interner, g);
        match slot {
            Some(s) => {
                if let Some(old) = self.groups.replace(s, record) {
                    self.release(&old.held);
                }
            }
            None => {
                let s = self.groups.insert(record);
                self.group_slots.insert(key, s);
            }
        }
    }

    fn apply_port(&mut self, p: &Port) {
        let key = p.index_key();
        let slot = self.port_slots.get(&key).copied();
        if let Some(old) = slot.and_then(|s| self.ports.get(s)) {
            if unchanged(
                old.cold.version.as_deref(),
                p.metadata.resource_version.as_deref(),
            ) {
                return;
            }
        }
        let record = PortRecord::new(&mut self.interner, p);
        match slot {
            Some(s) => {
                if let Some(old) = self.ports.replace(s, record) {
                    self.release(&old.cold.held);
                }
            }
            None => {
                let s = self.ports.insert(record);
                self.port_slots.insert(key, s);
            }
        }
    }

    fn apply_pod(&mut self, p: &Pod) {
        let key = p.index_key();
        let slot = self.pod_slots.get(&key).copied();
        if let Some(old) = slot.and_then(|s| self.pods.get(s)) {
            if unchanged(
                old.version.as_deref(),
                p.metadata.resource_version.as_deref(),
            ) {
                return;
            }
        }
        let record = PodRecord::new(&mut self.interner, p);
        let sym = record.sym;
        let s = match slot {
            Some(s) => {
                if let Some(old) = self.pods.replace(s, record) {
                    self.release(&old.held);
                }
                s
            }
            None => {
                let s = self.pods.insert(record);
                self.pod_slots.insert(key, s);
                s
            }
        };
        set_at(
            &mut self.pod_of,
            sym,
            u32::try_from(s).unwrap_or(ABSENT),
            ABSENT,
        );
    }

    /// The VNI of the VPC `vpc`, if it has one.
    pub(super) fn vni(&self, vpc: Sym) -> Option<u32> {
        self.vni_of
            .get(vpc as usize)
            .copied()
            .filter(|v| *v != NO_VNI)
    }

    /// The live labels of the pod `pod`, if the index has the pod.
    pub(super) fn pod_labels(&self, pod: Sym) -> Option<&[(Sym, Sym)]> {
        let slot = self
            .pod_of
            .get(pod as usize)
            .copied()
            .filter(|s| *s != ABSENT)?;
        self.pods.get(slot as usize).map(|p| &*p.labels)
    }

    /// Every sym is below this (for sym-indexed scratch tables).
    pub(super) fn sym_bound(&self) -> usize {
        self.interner.bound()
    }
}
