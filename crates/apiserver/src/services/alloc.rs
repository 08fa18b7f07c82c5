//! Cluster IP and node port allocation for core/v1 Services, as
//! kube-apiserver 1.33 allocates them, with every claim an atomic
//! create-if-absent write ([`Storage::create`]) so two writers never get
//! the same value, within one process or across several sharing one etcd.
//!
//! - **Cluster IPs**: each allocated IP is an `IPAddress` object
//!   (`networking.k8s.io/v1`, cluster-scoped, named by the IP in canonical
//!   form, `spec.parentRef` = `{group: "", resource: services, namespace,
//!   name}`), kube's `IPAddress` allocator. A requested IP that is taken is
//!   422 `provided IP is already allocated`; a random pick that loses a
//!   race to another writer picks again; an exhausted range is 500
//!   `failed to allocate a serviceIP: range is full`, as kube answers.
//!   Random picks avoid the lower band of the range (1/16 of it, 16 to
//!   256 addresses), which is kept for Services that ask for an IP, while
//!   the upper band has room (kube's static/dynamic split). The network
//!   address is never given out, nor the broadcast address of an IPv4 range.
//! - **Node ports**: one claim key per port number,
//!   `/ranges/servicenodeports/<port>`, holding `{metadata: {name,
//!   creationTimestamp}, spec: {parentRef}}` like an IPAddress. The port
//!   number is the unit, as in kube's bitmap: a Service's TCP and UDP ports
//!   with the same port number share one node port; two Services never
//!   share one, whatever the protocols. `healthCheckNodePort` comes from
//!   the same range.
//!
//! Claims are made after validation and admission, just before the
//! Service is written, and undone when that write fails ([`Claims`]); what
//! an update gives up is released after it is stored, and everything when
//! the Service leaves the store. A crash between the claim and the write
//! (or between the delete and the release) leaves a claim without its
//! Service: [`super::repair`] removes such claims once they are older than
//! a grace period, and re-creates missing claims of stored Services.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use cozyplane_api::kinds::{FieldError, FieldErrorType};
use cozyplane_store::{ListOptions, Revision, Storage, StoreError};
use ipnet::IpNet;
use serde_json::{json, Value};

use super::config::{Family, PortRange, ServiceCidrs};
use super::validate::{self as v, NONE};
use crate::hooks::{Allocate, Claims};
use crate::meta;
use crate::registry::now_rfc3339;
use crate::status::ApiError;

/// The storage prefix of the IPAddress objects.
pub const IP_ADDRESS_PREFIX: &str = "/networking.k8s.io/ipaddresses/";
/// The storage prefix of the node port claims.
pub const NODE_PORT_PREFIX: &str = "/ranges/servicenodeports/";
/// The `ipaddress.kubernetes.io/managed-by` label of the IPAddresses the
/// allocator makes (kube's).
pub const MANAGED_BY: &str = "ipallocator.k8s.io";
/// Random picks tried before the allocator lists what is taken.
const RANDOM_TRIES: usize = 8;
/// Rounds of "list what is taken, claim a free one" before giving up
/// on a range that other writers keep filling.
const LIST_ROUNDS: usize = 8;

/// The key of the IPAddress of `ip`.
pub fn ip_key(ip: &IpAddr) -> String {
    format!("{IP_ADDRESS_PREFIX}{ip}")
}

/// The key of the claim of node port `port`.
pub fn node_port_key(port: i64) -> String {
    format!("{NODE_PORT_PREFIX}{port}")
}

/// The `parentRef` naming Service `namespace/name`.
pub fn parent_ref(namespace: &str, name: &str) -> Value {
    json!({"group": "", "resource": "services", "namespace": namespace, "name": name})
}

/// The `parentRef` of a Service object.
pub fn parent_of(svc: &Value) -> Value {
    parent_ref(
        meta::meta_str(svc, "namespace").unwrap_or(""),
        meta::meta_str(svc, "name").unwrap_or(""),
    )
}

/// The stored IPAddress claiming `ip` for `owner`.
pub fn ip_address_object(ip: &IpAddr, owner: &Value) -> Value {
    json!({
        "metadata": {
            "name": ip.to_string(),
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": now_rfc3339(),
            "generation": 1,
            "labels": {
                "ipaddress.kubernetes.io/ip-family": Family::of(ip).name(),
                "ipaddress.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "apiVersion": "networking.k8s.io/v1",
        "kind": "IPAddress",
        "spec": {"parentRef": owner},
    })
}

/// The stored claim of node port `port` for `owner`.
pub fn node_port_object(port: i64, owner: &Value) -> Value {
    json!({
        "metadata": {"name": port.to_string(), "creationTimestamp": now_rfc3339()},
        "spec": {"parentRef": owner},
    })
}

/// The usable addresses of a service range: offsets `1..=last` from the
/// network address (an IPv4 range's broadcast address excluded).
#[derive(Debug, Clone, Copy)]
pub struct IpRange {
    pub net: IpNet,
    base: u128,
    /// How many usable addresses (offsets 1..=count).
    count: u128,
}

impl IpRange {
    pub fn new(net: IpNet) -> IpRange {
        let host_bits = u32::from(net.max_prefix_len() - net.prefix_len());
        let size = 1u128 << host_bits;
        let (base, count) = match net {
            IpNet::V4(n) => (u128::from(u32::from(n.network())), size.saturating_sub(2)),
            IpNet::V6(n) => (u128::from(n.network()), size.saturating_sub(1)),
        };
        IpRange { net, base, count }
    }

    /// How many addresses can be given out.
    pub fn count(&self) -> u128 {
        self.count
    }

    /// The address `index` (0-based) among the usable ones.
    pub fn nth(&self, index: u128) -> Option<IpAddr> {
        if index >= self.count {
            return None;
        }
        let raw = self.base + 1 + index;
        Some(match self.net {
            IpNet::V4(_) => IpAddr::V4(u32::try_from(raw).ok()?.into()),
            IpNet::V6(_) => IpAddr::V6(raw.into()),
        })
    }

    /// The index of `ip` among the usable addresses, if it is one.
    pub fn index_of(&self, ip: &IpAddr) -> Option<u128> {
        if !self.net.contains(ip) {
            return None;
        }
        let raw = match ip {
            IpAddr::V4(a) => u128::from(u32::from(*a)),
            IpAddr::V6(a) => u128::from(*a),
        };
        let index = raw.checked_sub(self.base + 1)?;
        (index < self.count).then_some(index)
    }

    /// How many low addresses random picks avoid while the rest has room:
    /// 1/16 of the range, at least 16 and at most 256 (none for ranges
    /// under 16 addresses).
    pub fn static_band(&self) -> u128 {
        if self.count < 16 {
            0
        } else {
            (self.count / 16).clamp(16, 256)
        }
    }
}

fn random() -> u128 {
    uuid::Uuid::new_v4().as_u128()
}

/// One kind of value to allocate: the candidates (indices `0..count`) and
/// how each is claimed.
trait Pool: Sync {
    fn count(&self) -> u128;
    fn band(&self) -> u128;
    fn key(&self, index: u128) -> Option<String>;
    /// The index a stored key under [`Pool::prefix`] stands for.
    fn index_of_key(&self, key: &str) -> Option<u128>;
    fn prefix(&self) -> &'static str;
    fn object(&self, index: u128, owner: &Value) -> Option<Value>;
}

impl Pool for IpRange {
    fn count(&self) -> u128 {
        self.count
    }
    fn band(&self) -> u128 {
        self.static_band()
    }
    fn key(&self, index: u128) -> Option<String> {
        self.nth(index).map(|ip| ip_key(&ip))
    }
    fn index_of_key(&self, key: &str) -> Option<u128> {
        let ip: IpAddr = key.strip_prefix(IP_ADDRESS_PREFIX)?.parse().ok()?;
        self.index_of(&ip)
    }
    fn prefix(&self) -> &'static str {
        IP_ADDRESS_PREFIX
    }
    fn object(&self, index: u128, owner: &Value) -> Option<Value> {
        self.nth(index).map(|ip| ip_address_object(&ip, owner))
    }
}

impl Pool for PortRange {
    fn count(&self) -> u128 {
        u128::from(self.size())
    }
    fn band(&self) -> u128 {
        0
    }
    fn key(&self, index: u128) -> Option<String> {
        Some(node_port_key(
            i64::from(self.first) + i64::try_from(index).ok()?,
        ))
    }
    fn index_of_key(&self, key: &str) -> Option<u128> {
        let port: i64 = key.strip_prefix(NODE_PORT_PREFIX)?.parse().ok()?;
        if !self.contains(port) {
            return None;
        }
        u128::try_from(port - i64::from(self.first)).ok()
    }
    fn prefix(&self) -> &'static str {
        NODE_PORT_PREFIX
    }
    fn object(&self, index: u128, owner: &Value) -> Option<Value> {
        Some(node_port_object(
            i64::from(self.first) + i64::try_from(index).ok()?,
            owner,
        ))
    }
}

/// Where a claim attempt stands.
enum Claim {
    /// Made at this revision (or, under dryRun, free: revision 0).
    Made(Revision),
    /// Already claimed by someone.
    Taken,
}

async fn try_claim(
    store: &Arc<dyn Storage>,
    key: &str,
    obj: &Value,
    dry_run: bool,
) -> Result<Claim, ApiError> {
    if dry_run {
        return match store.get(key).await.map_err(ApiError::from_store)? {
            Some(_) => Ok(Claim::Taken),
            None => Ok(Claim::Made(0)),
        };
    }
    let raw = crate::registry::encode(obj)?;
    match store.create(key, raw).await {
        Ok(rev) => Ok(Claim::Made(rev)),
        Err(StoreError::AlreadyExists { .. }) => Ok(Claim::Taken),
        Err(e) => Err(ApiError::from_store(e)),
    }
}

/// Claim value `index` of `pool` for `owner`; `Ok(None)` when it is taken.
async fn attempt(
    store: &Arc<dyn Storage>,
    pool: &dyn Pool,
    owner: &Value,
    index: u128,
    dry_run: bool,
) -> Result<Option<(u128, Revision)>, ApiError> {
    let (Some(key), Some(obj)) = (pool.key(index), pool.object(index, owner)) else {
        return Ok(None);
    };
    match try_claim(store, &key, &obj, dry_run).await? {
        Claim::Made(rev) => Ok(Some((index, rev))),
        Claim::Taken => Ok(None),
    }
}

/// Claim a random free value of `pool` for `owner`, skipping `skip`
/// (indices this write holds already). `Ok(None)`: the pool is full.
async fn claim_random(
    store: &Arc<dyn Storage>,
    pool: &dyn Pool,
    owner: &Value,
    skip: &BTreeSet<u128>,
    dry_run: bool,
) -> Result<Option<(u128, Revision)>, ApiError> {
    let count = pool.count();
    if count == 0 {
        return Ok(None);
    }
    let band = pool.band();
    for _ in 0..RANDOM_TRIES {
        let index = if count > band {
            band + random() % (count - band)
        } else {
            random() % count
        };
        if skip.contains(&index) {
            continue;
        }
        if let Some(done) = attempt(store, pool, owner, index, dry_run).await? {
            return Ok(Some(done));
        }
    }
    // Crowded: list what is taken and pick among the rest.
    for _ in 0..LIST_ROUNDS {
        let listed = store
            .list(&ListOptions {
                prefix: pool.prefix().to_string(),
                ..ListOptions::default()
            })
            .await
            .map_err(ApiError::from_store)?;
        let mut taken: BTreeSet<u128> = listed
            .items
            .iter()
            .filter_map(|kv| pool.index_of_key(&kv.key))
            .collect();
        taken.extend(skip.iter().copied());
        let free_upper = (band..count).filter(|i| !taken.contains(i));
        let upper: Vec<u128> = free_upper.collect();
        let free: Vec<u128> = if upper.is_empty() {
            (0..band.min(count))
                .filter(|i| !taken.contains(i))
                .collect()
        } else {
            upper
        };
        if free.is_empty() {
            return Ok(None);
        }
        let at = usize::try_from(random() % (free.len() as u128)).unwrap_or(0);
        let pick = free[at];
        if let Some(done) = attempt(store, pool, owner, pick, dry_run).await? {
            return Ok(Some(done));
        }
    }
    Err(ApiError::new(
        409,
        "Conflict",
        "could not allocate: other writers kept taking the free values; try again",
    ))
}

/// The Service allocator: cluster IPs from `--service-cluster-ip-range`,
/// node ports from `--service-node-port-range`.
#[derive(Debug, Clone)]
pub struct ServiceAllocator {
    cidrs: ServiceCidrs,
    node_ports: PortRange,
}

fn invalid(svc: &Value, errs: Vec<FieldError>) -> ApiError {
    ApiError::invalid(
        "",
        "Service",
        meta::meta_str(svc, "name").unwrap_or(""),
        &errs,
    )
}

fn field(kind: FieldErrorType, f: impl Into<String>, msg: impl Into<String>) -> FieldError {
    FieldError::new(kind, f, msg)
}

impl ServiceAllocator {
    pub fn new(cidrs: ServiceCidrs, node_ports: PortRange) -> Self {
        ServiceAllocator { cidrs, node_ports }
    }

    pub fn cidrs(&self) -> &ServiceCidrs {
        &self.cidrs
    }

    pub fn node_ports(&self) -> PortRange {
        self.node_ports
    }

    /// The families and policy of `svc` (kube's `initIPFamilyFields`):
    /// families from the cluster IPs given, then `ipFamilies`, then the
    /// policy (SingleStack by default; PreferDualStack adds the other
    /// family when the server has it; RequireDualStack needs it), each
    /// family one the server serves.
    fn families(&self, svc: &Value) -> Result<(Vec<Family>, String), Vec<FieldError>> {
        let mut errs = Vec::new();
        let ips = v::cluster_ips(svc);
        let headless = v::is_headless(svc);
        let mut families: Vec<Family> = svc
            .pointer("/spec/ipFamilies")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str().and_then(Family::parse))
                    .collect()
            })
            .unwrap_or_default();
        for (i, ip) in ips.iter().enumerate() {
            if let Ok(a) = ip.parse::<IpAddr>() {
                if families.len() <= i {
                    families.push(Family::of(&a));
                }
            }
        }
        let selectorless = svc
            .pointer("/spec/selector")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty());
        let given = svc
            .pointer("/spec/ipFamilyPolicy")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty());
        let policy = match given {
            Some(p) => p.to_string(),
            // A headless Service without a selector has endpoints of any
            // family: kube gives it both when it can.
            None if headless && selectorless && self.cidrs.dual_stack() => {
                "RequireDualStack".to_string()
            }
            None => "SingleStack".to_string(),
        };
        if families.is_empty() {
            families.push(self.cidrs.primary());
        }
        for (i, f) in families.iter().enumerate() {
            if self.cidrs.of(*f).is_none() {
                errs.push(field(
                    FieldErrorType::Invalid,
                    format!("spec.ipFamilies[{i}]"),
                    format!(
                        "Invalid value: \"{}\": not configured on this cluster (service ranges: {})",
                        f.name(),
                        self.cidrs.to_flag()
                    ),
                ));
            }
        }
        match policy.as_str() {
            "RequireDualStack" if !self.cidrs.dual_stack() => errs.push(field(
                FieldErrorType::Invalid,
                "spec.ipFamilyPolicy",
                "Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services",
            )),
            "RequireDualStack" | "PreferDualStack" if self.cidrs.dual_stack() && families.len() == 1 => {
                let other = families[0].other();
                families.push(other);
            }
            _ => {}
        }
        if policy == "SingleStack" {
            families.truncate(1);
        }
        if errs.is_empty() {
            Ok((families, policy))
        } else {
            Err(errs)
        }
    }

    /// Fill in and claim `new`'s cluster IPs and node ports; `old` is the
    /// stored object of an update.
    async fn fill(
        &self,
        store: &Arc<dyn Storage>,
        old: Option<&Value>,
        new: &mut Value,
        dry_run: bool,
        claims: &mut Claims,
    ) -> Result<(), ApiError> {
        let owner = parent_of(new);
        self.fill_ips(store, old, new, &owner, dry_run, claims)
            .await?;
        self.fill_node_ports(store, old, new, &owner, dry_run, claims)
            .await
    }

    async fn fill_ips(
        &self,
        store: &Arc<dyn Storage>,
        old: Option<&Value>,
        new: &mut Value,
        owner: &Value,
        dry_run: bool,
        claims: &mut Claims,
    ) -> Result<(), ApiError> {
        let old_ips: Vec<String> = old
            .filter(|o| v::needs_cluster_ip(o))
            .map(v::cluster_ips)
            .unwrap_or_default();
        let mut kept: Vec<String> = Vec::new();
        if v::needs_cluster_ip(new) {
            let (families, policy) = self.families(new).map_err(|e| invalid(&*new, e))?;
            let requested = v::cluster_ips(new);
            let headless = v::is_headless(new);
            let mut ips: Vec<String> = Vec::new();
            if headless {
                ips.push(NONE.to_string());
            }
            let to_fill: &[Family] = if headless { &[] } else { &families };
            for (i, family) in to_fill.iter().enumerate() {
                let Some(cidr) = self.cidrs.of(*family) else {
                    continue;
                };
                let range = IpRange::new(*cidr);
                let f = format!("spec.clusterIPs[{i}]");
                if let Some(want) = requested.get(i) {
                    let Ok(ip) = want.parse::<IpAddr>() else {
                        continue; // validation reported it
                    };
                    if old_ips.contains(want) {
                        kept.push(want.clone());
                        ips.push(want.clone());
                        continue;
                    }
                    if range.index_of(&ip).is_none() {
                        return Err(invalid(new, vec![field(FieldErrorType::Invalid, f, format!(
                            "Invalid value: \"{want}\": failed to allocate IP {want}: the provided IP ({want}) is not in the valid range. The range of valid IPs is {cidr}"
                        ))]));
                    }
                    match try_claim(store, &ip_key(&ip), &ip_address_object(&ip, owner), dry_run)
                        .await?
                    {
                        Claim::Made(rev) => {
                            if !dry_run {
                                claims.made.push((ip_key(&ip), rev));
                            }
                        }
                        Claim::Taken => {
                            return Err(invalid(new, vec![field(FieldErrorType::Invalid, f, format!(
                                "Invalid value: \"{want}\": failed to allocate IP {want}: provided IP is already allocated"
                            ))]));
                        }
                    }
                    ips.push(want.clone());
                } else {
                    let Some((index, rev)) =
                        claim_random(store, &range, owner, &BTreeSet::new(), dry_run).await?
                    else {
                        return Err(ApiError::internal(format!(
                            "failed to allocate a serviceIP: range is full (the {} service range {cidr} has no free address)",
                            family.name()
                        )));
                    };
                    let Some(ip) = range.nth(index) else {
                        return Err(ApiError::internal("allocated an address outside its range"));
                    };
                    if !dry_run {
                        claims.made.push((ip_key(&ip), rev));
                    }
                    ips.push(ip.to_string());
                }
            }
            let families: Vec<&str> = families.iter().map(|f| f.name()).collect();
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert(
                    "clusterIP".into(),
                    json!(ips.first().cloned().unwrap_or_default()),
                );
                spec.insert("clusterIPs".into(), json!(ips));
                spec.insert("ipFamilies".into(), json!(families));
                spec.insert("ipFamilyPolicy".into(), json!(policy));
            }
        }
        for ip in old_ips.iter().filter(|ip| !kept.contains(ip)) {
            if let Ok(a) = ip.parse::<IpAddr>() {
                claims.release.push((ip_key(&a), owner.clone()));
            }
        }
        Ok(())
    }

    async fn fill_node_ports(
        &self,
        store: &Arc<dyn Storage>,
        old: Option<&Value>,
        new: &mut Value,
        owner: &Value,
        dry_run: bool,
        claims: &mut Claims,
    ) -> Result<(), ApiError> {
        let old_held: BTreeSet<i64> = old.map(held_node_ports).unwrap_or_default();
        // Node ports this write holds: kept from `old` or claimed now.
        let mut held: BTreeSet<i64> = BTreeSet::new();
        let range = self.node_ports;
        // First the ports asked for.
        let mut requested = Vec::new();
        if v::may_have_node_ports(new) {
            for (i, p) in v::ports(new) {
                let np = v::node_port(p);
                if np != 0 {
                    requested.push((format!("spec.ports[{i}].nodePort"), np));
                }
            }
        }
        if v::needs_health_check_node_port(new) {
            let hc = v::health_check_node_port(new);
            if hc != 0 {
                requested.push(("spec.healthCheckNodePort".to_string(), hc));
            }
        }
        for (f, np) in requested {
            if held.contains(&np) {
                continue;
            }
            if old_held.contains(&np) {
                held.insert(np);
                continue;
            }
            if !range.contains(np) {
                return Err(invalid(new, vec![field(FieldErrorType::Invalid, f, format!(
                    "Invalid value: {np}: provided port is not in the valid range. The range of valid ports is {range}"
                ))]));
            }
            let key = node_port_key(np);
            match try_claim(store, &key, &node_port_object(np, owner), dry_run).await? {
                Claim::Made(rev) => {
                    if !dry_run {
                        claims.made.push((key, rev));
                    }
                    held.insert(np);
                }
                Claim::Taken => {
                    return Err(invalid(
                        new,
                        vec![field(
                            FieldErrorType::Invalid,
                            f,
                            format!("Invalid value: {np}: provided port is already allocated"),
                        )],
                    ));
                }
            }
        }
        // Then a node port for each port without one: shared by the ports
        // with the same port number (TCP and UDP of one service port).
        let mut by_port: BTreeMap<i64, i64> = BTreeMap::new();
        for (_, p) in v::ports(new) {
            let np = v::node_port(p);
            if np != 0 {
                if let Some(port) = p.get("port").and_then(Value::as_i64) {
                    by_port.entry(port).or_insert(np);
                }
            }
        }
        let mut assign: Vec<(usize, i64)> = Vec::new();
        if v::allocates_node_ports(new) {
            let wanted: Vec<(usize, i64)> = v::ports(new)
                .into_iter()
                .filter(|(_, p)| v::node_port(p) == 0)
                .map(|(i, p)| (i, p.get("port").and_then(Value::as_i64).unwrap_or(0)))
                .collect();
            for (i, port) in wanted {
                let np = match by_port.get(&port) {
                    Some(np) => *np,
                    None => {
                        let np = self
                            .random_port(store, owner, &held, dry_run, claims)
                            .await?;
                        by_port.insert(port, np);
                        held.insert(np);
                        np
                    }
                };
                assign.push((i, np));
            }
        }
        let mut hc_assign = None;
        if v::needs_health_check_node_port(new) && v::health_check_node_port(new) == 0 {
            let np = self
                .random_port(store, owner, &held, dry_run, claims)
                .await?;
            held.insert(np);
            hc_assign = Some(np);
        }
        if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
            if let Some(ps) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for (i, np) in assign {
                    if let Some(p) = ps.get_mut(i).and_then(Value::as_object_mut) {
                        p.insert("nodePort".into(), json!(np));
                    }
                }
            }
            if let Some(np) = hc_assign {
                spec.insert("healthCheckNodePort".into(), json!(np));
            }
        }
        for np in old_held.difference(&held) {
            claims.release.push((node_port_key(*np), owner.clone()));
        }
        Ok(())
    }

    async fn random_port(
        &self,
        store: &Arc<dyn Storage>,
        owner: &Value,
        held: &BTreeSet<i64>,
        dry_run: bool,
        claims: &mut Claims,
    ) -> Result<i64, ApiError> {
        let first = i64::from(self.node_ports.first);
        let skip: BTreeSet<u128> = held
            .iter()
            .filter(|p| self.node_ports.contains(**p))
            .filter_map(|p| u128::try_from(*p - first).ok())
            .collect();
        let Some((i, rev)) = claim_random(store, &self.node_ports, owner, &skip, dry_run).await?
        else {
            return Err(ApiError::internal(format!(
                "failed to allocate a nodePort: range is full (no free port in {})",
                self.node_ports
            )));
        };
        let np = i64::from(self.node_ports.first) + i64::try_from(i).unwrap_or(0);
        if !dry_run {
            claims.made.push((node_port_key(np), rev));
        }
        Ok(np)
    }
}

/// The node ports `svc` holds: its ports' and its health check's.
pub fn held_node_ports(svc: &Value) -> BTreeSet<i64> {
    let mut out: BTreeSet<i64> = v::ports(svc)
        .into_iter()
        .map(|(_, p)| v::node_port(p))
        .filter(|p| *p != 0)
        .collect();
    let hc = v::health_check_node_port(svc);
    if hc != 0 {
        out.insert(hc);
    }
    out
}

/// The cluster IPs `svc` holds (not `None`).
pub fn held_ips(svc: &Value) -> Vec<IpAddr> {
    if !v::needs_cluster_ip(svc) {
        return Vec::new();
    }
    v::cluster_ips(svc)
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

#[async_trait::async_trait]
impl Allocate for ServiceAllocator {
    async fn create(
        &self,
        store: &Arc<dyn Storage>,
        obj: &mut Value,
        dry_run: bool,
    ) -> Result<Claims, ApiError> {
        let mut claims = Claims::default();
        match self.fill(store, None, obj, dry_run, &mut claims).await {
            Ok(()) => Ok(claims),
            Err(e) => {
                claims.revert(store).await;
                Err(e)
            }
        }
    }

    async fn update(
        &self,
        store: &Arc<dyn Storage>,
        old: &Value,
        new: &mut Value,
        dry_run: bool,
    ) -> Result<Claims, ApiError> {
        let mut claims = Claims::default();
        if new.get("spec") == old.get("spec") {
            return Ok(claims);
        }
        match self.fill(store, Some(old), new, dry_run, &mut claims).await {
            Ok(()) => Ok(claims),
            Err(e) => {
                claims.revert(store).await;
                Err(e)
            }
        }
    }

    async fn removed(&self, store: &Arc<dyn Storage>, old: &Value) {
        let owner = parent_of(old);
        let mut claims = Claims::default();
        for ip in held_ips(old) {
            claims.release.push((ip_key(&ip), owner.clone()));
        }
        for np in held_node_ports(old) {
            claims.release.push((node_port_key(np), owner.clone()));
        }
        claims.commit(store).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_give_out_neither_network_nor_broadcast() {
        let r = IpRange::new("10.96.0.0/16".parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(r.count(), 65534);
        assert_eq!(r.nth(0).map(|a| a.to_string()), Some("10.96.0.1".into()));
        assert_eq!(
            r.nth(65533).map(|a| a.to_string()),
            Some("10.96.255.254".into())
        );
        assert_eq!(r.nth(65534), None);
        assert_eq!(
            r.index_of(&"10.96.0.0".parse().unwrap_or_else(|_| unreachable!())),
            None
        );
        assert_eq!(
            r.index_of(&"10.96.255.255".parse().unwrap_or_else(|_| unreachable!())),
            None
        );
        assert_eq!(
            r.index_of(&"10.97.0.1".parse().unwrap_or_else(|_| unreachable!())),
            None
        );
        assert_eq!(r.static_band(), 256);
        let v6 = IpRange::new("fd00::/124".parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(v6.count(), 15);
        assert_eq!(v6.nth(14).map(|a| a.to_string()), Some("fd00::f".into()));
        assert_eq!(v6.static_band(), 0);
        assert_eq!(
            IpRange::new("10.0.0.0/24".parse().unwrap_or_else(|_| unreachable!())).static_band(),
            16
        );
    }
}
