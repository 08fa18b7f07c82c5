//! A Service, the pods and the nodes → what the Service's EndpointSlices
//! should hold (pure), with kube's EndpointSlice controller's rules
//! (`pkg/controller/endpointslice`, `staging/.../endpointslice/util`):
//!
//! - only Services with a non-empty selector that are not `ExternalName`
//!   get slices (headless ones too);
//! - the address types are the Service's `spec.ipFamilies`, else the family
//!   of its cluster IP, else (a headless Service without families) both;
//! - a selected pod is an endpoint unless it is Succeeded or Failed, has no
//!   IP, is not scheduled, or names a node that does not exist (that one is
//!   kept with `publishNotReadyAddresses`); its addresses per type are its
//!   `status.podIPs` of that family (so a VPC pod's fabric, net 0, address);
//! - conditions: `serving` = the pod's Ready condition, `terminating` = a
//!   deletionTimestamp, `ready` = serving and not terminating, or always
//!   with `publishNotReadyAddresses`;
//! - ports: per Service port its name, protocol and the target port, a
//!   named one looked up in the pod's containers (name and protocol); a pod
//!   that lacks the name leaves the port out, so endpoints are grouped by
//!   the port set they resolve to, one group per slice family.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The label naming a slice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming a slice's manager.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// kube-controller-manager's value of [`MANAGED_BY_LABEL`], which this controller stands in for.
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The label on slices of a Service without a cluster IP.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The node label copied into an endpoint's `zone`.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// kube's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// An EndpointSlice's `addressType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressType {
    /// `IPv4`.
    IPv4,
    /// `IPv6`.
    IPv6,
}

impl AddressType {
    /// The API string.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressType::IPv4 => "IPv4",
            AddressType::IPv6 => "IPv6",
        }
    }

    /// `IPv4` or `IPv6` (`FQDN` and anything else: `None`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "IPv4" => Some(AddressType::IPv4),
            "IPv6" => Some(AddressType::IPv6),
            _ => None,
        }
    }

    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => AddressType::IPv4,
            IpAddr::V6(_) => AddressType::IPv6,
        }
    }
}

/// One port of a slice: kube's `EndpointPort`, ordered so that port lists can key a map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortSpec {
    /// The Service port's name (`""` for an unnamed one, as kube writes it).
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: Option<String>,
    /// The port on the pod.
    pub port: Option<i32>,
    /// The Service port's appProtocol.
    pub app_protocol: Option<String>,
}

impl PortSpec {
    /// As the API writes it.
    pub fn to_api(&self) -> EndpointPort {
        EndpointPort {
            name: self.name.clone(),
            protocol: self.protocol.clone(),
            port: self.port,
            app_protocol: self.app_protocol.clone(),
        }
    }

    /// From the API.
    pub fn from_api(p: &EndpointPort) -> Self {
        PortSpec {
            name: p.name.clone(),
            protocol: p.protocol.clone(),
            port: p.port,
            app_protocol: p.app_protocol.clone(),
        }
    }
}

/// What a group of endpoints shares: one slice holds endpoints of one address
/// type that resolve the Service's ports to the same list.
pub type SliceKey = (AddressType, Vec<PortSpec>);

/// How an endpoint is recognised from one sync to the next: the pod it stands
/// for and its addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointKey {
    /// The target pod's name (`""` without a targetRef).
    pub pod: String,
    /// The endpoint's addresses.
    pub addresses: Vec<String>,
}

impl EndpointKey {
    /// The key of an endpoint.
    pub fn of(e: &Endpoint) -> Self {
        EndpointKey {
            pod: e
                .target_ref
                .as_ref()
                .and_then(|r| r.name.clone())
                .unwrap_or_default(),
            addresses: e.addresses.clone(),
        }
    }
}

/// Why a pod the Service selects is not one of its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Succeeded or Failed.
    Finished,
    /// No `status.podIPs` (nor `podIP`) yet.
    NoAddress,
    /// No `spec.nodeName`.
    NotScheduled,
    /// Its node does not exist (kept with `publishNotReadyAddresses`).
    NodeMissing,
}

/// The endpoints one Service's slices should hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The Service's UID (the slices' owner).
    pub uid: String,
    /// The labels every slice carries.
    pub labels: BTreeMap<String, String>,
    /// The address types the Service has slices of.
    pub families: BTreeSet<AddressType>,
    /// The endpoints by address type and port list.
    pub groups: BTreeMap<SliceKey, BTreeMap<EndpointKey, Endpoint>>,
    /// Selected pods that are no endpoint, and why (for the log).
    pub skipped: Vec<(String, Skip)>,
}

/// The nodes: name → its zone label, if it has one. A missing name is a missing node.
pub type NodeZones = BTreeMap<String, Option<String>>;

/// The Service's selector, if this controller manages its slices: a
/// non-empty selector (an empty one, as kube stores it, is none) and not
/// `ExternalName`.
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.selector.as_ref().filter(|s| !s.is_empty())
}

/// Whether `labels` has every `key=value` of `selector`.
pub fn selects(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// kube's `getAddressTypesForService`.
fn families(svc: &Service) -> BTreeSet<AddressType> {
    let spec = svc.spec.as_ref();
    let declared: BTreeSet<AddressType> = spec
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|f| AddressType::parse(f))
        .collect();
    if !declared.is_empty() {
        return declared;
    }
    match cluster_ip(svc) {
        Some(ip) => BTreeSet::from([AddressType::of(ip)]),
        // Headless without families (or no cluster IP assigned): kube assumes both.
        None => BTreeSet::from([AddressType::IPv4, AddressType::IPv6]),
    }
}

/// The Service's (first) cluster IP; `None` for a headless one or none assigned.
fn cluster_ip(svc: &Service) -> Option<IpAddr> {
    svc.spec
        .as_ref()?
        .cluster_ip
        .as_deref()
        .filter(|ip| !ip.is_empty() && *ip != "None")?
        .parse()
        .ok()
}

/// The labels of the Service's slices (kube's `setEndpointSliceLabels`): the
/// Service's own but the reserved ones, the headless label when it has no
/// cluster IP, its name and the manager.
fn slice_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = svc
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                SERVICE_NAME_LABEL | MANAGED_BY_LABEL | HEADLESS_LABEL
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let ip_set = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None");
    if !ip_set {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    labels.insert(
        SERVICE_NAME_LABEL.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.into(), CONTROLLER_NAME.into());
    labels
}

/// kube's `podutil.FindPort`: the pod port a Service port targets.
fn find_port(pod: &Pod, sp: &ServicePort, protocol: &str) -> Option<i32> {
    match &sp.target_port {
        // The API server defaults an unset, 0 or "" targetPort to the port.
        None => Some(sp.port),
        Some(IntOrString::Int(0)) => Some(sp.port),
        Some(IntOrString::String(s)) if s.is_empty() => Some(sp.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            let spec = pod.spec.as_ref()?;
            // Containers, then sidecars (init containers that keep running).
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port)
        }
    }
}

/// The ports of `pod`'s endpoint, in the Service's order; a port the pod
/// cannot resolve is left out.
fn pod_ports(ports: &[ServicePort], pod: &Pod) -> Vec<PortSpec> {
    ports
        .iter()
        .filter_map(|sp| {
            let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
            let port = find_port(pod, sp, &protocol)?;
            Some(PortSpec {
                name: Some(sp.name.clone().unwrap_or_default()),
                protocol: Some(protocol),
                port: Some(port),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// The pod's addresses: `status.podIPs` (else `podIP`), parsed.
fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(st) = pod.status.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<&str> = st.pod_ips.iter().flatten().map(|p| p.ip.as_str()).collect();
    let raw: Vec<&str> = if listed.is_empty() {
        st.pod_ip.as_deref().into_iter().collect()
    } else {
        listed
    };
    raw.into_iter().filter_map(|s| s.parse().ok()).collect()
}

/// The pod's Ready condition is True.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// What `svc`'s slices should hold given every pod and node; `None` if the
/// Service gets no slices from this controller (no selector, ExternalName).
pub fn desired<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
    nodes: &NodeZones,
) -> Option<Desired> {
    let selector = selector(svc)?;
    let spec = svc.spec.as_ref()?;
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone()?;
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let ports = spec.ports.as_deref().unwrap_or_default();
    let mut d = Desired {
        namespace: namespace.clone(),
        service: name.clone(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        labels: slice_labels(svc),
        families: families(svc),
        groups: BTreeMap::new(),
        skipped: Vec::new(),
    };
    for pod in pods {
        let m = &pod.metadata;
        if m.namespace.as_deref().unwrap_or_default() != namespace
            || !selects(selector, m.labels.as_ref())
        {
            continue;
        }
        let pod_name = m.name.clone().unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty());
        let ips = pod_ips(pod);
        let skip = if matches!(phase, Some("Succeeded" | "Failed")) {
            Some(Skip::Finished)
        } else if ips.is_empty() {
            Some(Skip::NoAddress)
        } else if node.is_none() {
            Some(Skip::NotScheduled)
        } else if node.is_some_and(|n| !nodes.contains_key(n)) && !publish_not_ready {
            Some(Skip::NodeMissing)
        } else {
            None
        };
        if let Some(why) = skip {
            d.skipped.push((pod_name, why));
            continue;
        }
        let zone = node.and_then(|n| nodes.get(n).cloned().flatten());
        let serving = pod_ready(pod);
        let terminating = m.deletion_timestamp.is_some();
        let ready = publish_not_ready || (serving && !terminating);
        let hostname = pod
            .spec
            .as_ref()
            .filter(|s| s.subdomain.as_deref() == Some(name.as_str()))
            .and_then(|s| s.hostname.clone())
            .filter(|h| !h.is_empty());
        let resolved = pod_ports(ports, pod);
        for af in &d.families {
            let addresses: Vec<String> = ips
                .iter()
                .filter(|ip| AddressType::of(**ip) == *af)
                .map(ToString::to_string)
                .collect();
            if addresses.is_empty() {
                continue;
            }
            let ep = Endpoint {
                addresses,
                conditions: Some(EndpointConditions {
                    ready: Some(ready),
                    serving: Some(serving),
                    terminating: Some(terminating),
                }),
                hostname: hostname.clone(),
                node_name: node.map(str::to_string),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    namespace: Some(namespace.clone()),
                    name: Some(pod_name.clone()),
                    uid: m.uid.clone(),
                    ..ObjectReference::default()
                }),
                zone: zone.clone(),
                ..Endpoint::default()
            };
            d.groups
                .entry((*af, resolved.clone()))
                .or_default()
                .insert(EndpointKey::of(&ep), ep);
        }
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn svc(v: serde_json::Value) -> Service {
        let mut base = json!({"metadata": {"name": "web", "namespace": "d", "uid": "svc-uid"},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                               {"name": "metrics", "port": 9090}]}});
        merge(&mut base, v);
        serde_json::from_value(base).expect("service")
    }

    /// A scheduled, running, Ready pod `name` on `node` with `ip`, its
    /// container port `http` at 8080.
    pub(crate) fn pod(name: &str, node: &str, ip: &str, v: serde_json::Value) -> Pod {
        let mut base = json!({
            "metadata": {"name": name, "namespace": "d", "uid": format!("uid-{name}"),
                         "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c",
                     "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                       "conditions": [{"type": "Ready", "status": "True"}]}});
        merge(&mut base, v);
        serde_json::from_value(base).expect("pod")
    }

    fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    match b.get_mut(&k) {
                        // An empty object replaces (to clear a map); others merge.
                        Some(slot) if v.as_object().is_some_and(|o| !o.is_empty()) => {
                            merge(slot, v)
                        }
                        _ => {
                            b.insert(k, v);
                        }
                    }
                }
            }
            (b, p) => *b = p,
        }
    }

    pub(crate) fn nodes() -> NodeZones {
        BTreeMap::from([
            ("n1".to_string(), Some("zone-a".to_string())),
            ("n2".to_string(), None),
        ])
    }

    fn port(name: &str, port: i32) -> PortSpec {
        PortSpec {
            name: Some(name.into()),
            protocol: Some("TCP".into()),
            port: Some(port),
            app_protocol: None,
        }
    }

    fn one(d: &Desired, key: &SliceKey, pod: &str) -> Endpoint {
        d.groups[key]
            .values()
            .find(|e| EndpointKey::of(e).pod == pod)
            .cloned()
            .unwrap_or_else(|| panic!("{pod} not in {key:?}: {d:#?}"))
    }

    fn cond(e: &Endpoint) -> (bool, bool, bool) {
        let c = e.conditions.clone().expect("conditions");
        (
            c.ready.expect("ready"),
            c.serving.expect("serving"),
            c.terminating.expect("terminating"),
        )
    }

    #[test]
    fn a_ready_pod_is_a_ready_endpoint_with_node_zone_and_target() {
        let d = desired(
            &svc(json!({})),
            &[pod("a", "n1", "10.244.1.5", json!({}))],
            &nodes(),
        )
        .expect("managed");
        let key = (
            AddressType::IPv4,
            vec![port("http", 8080), port("metrics", 9090)],
        );
        assert_eq!(d.groups.len(), 1, "{d:#?}");
        let e = one(&d, &key, "a");
        assert_eq!(e.addresses, ["10.244.1.5"]);
        assert_eq!(cond(&e), (true, true, false));
        assert_eq!(e.node_name.as_deref(), Some("n1"));
        assert_eq!(e.zone.as_deref(), Some("zone-a"));
        let t = e.target_ref.expect("targetRef");
        assert_eq!(
            (
                t.kind.as_deref(),
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.uid.as_deref()
            ),
            (Some("Pod"), Some("d"), Some("a"), Some("uid-a"))
        );
        assert_eq!(d.families, BTreeSet::from([AddressType::IPv4]));
        assert_eq!(d.labels[SERVICE_NAME_LABEL], "web");
        assert_eq!(d.labels[MANAGED_BY_LABEL], CONTROLLER_NAME);
        assert!(!d.labels.contains_key(HEADLESS_LABEL));
    }

    #[test]
    fn conditions_follow_readiness_and_termination() {
        let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let terminating = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
        let term_unready = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let no_conditions = json!({"status": {"conditions": []}});
        let pods = [
            pod("nr", "n1", "10.244.1.1", not_ready),
            pod("t", "n1", "10.244.1.2", terminating),
            pod("tu", "n1", "10.244.1.3", term_unready),
            pod("nc", "n2", "10.244.2.1", no_conditions),
        ];
        let key = (
            AddressType::IPv4,
            vec![port("http", 8080), port("metrics", 9090)],
        );
        let d = desired(&svc(json!({})), &pods, &nodes()).expect("managed");
        assert_eq!(cond(&one(&d, &key, "nr")), (false, false, false));
        assert_eq!(cond(&one(&d, &key, "t")), (false, true, true));
        assert_eq!(cond(&one(&d, &key, "tu")), (false, false, true));
        assert_eq!(cond(&one(&d, &key, "nc")), (false, false, false));
        assert_eq!(one(&d, &key, "nc").zone, None, "n2 has no zone label");

        // publishNotReadyAddresses: ready regardless, serving/terminating as they are.
        let publish = svc(json!({"spec": {"publishNotReadyAddresses": true}}));
        let d = desired(&publish, &pods, &nodes()).expect("managed");
        assert_eq!(cond(&one(&d, &key, "nr")), (true, false, false));
        assert_eq!(cond(&one(&d, &key, "t")), (true, true, true));
    }

    #[test]
    fn pods_without_address_node_or_life_are_skipped() {
        let pods = [
            pod(
                "noip",
                "n1",
                "",
                json!({"status": {"podIP": null, "podIPs": []}}),
            ),
            pod("unbound", "", "10.244.1.9", json!({})),
            pod("lost", "gone", "10.244.1.8", json!({})),
            pod(
                "done",
                "n1",
                "10.244.1.7",
                json!({"status": {"phase": "Succeeded"}}),
            ),
            pod(
                "failed",
                "n1",
                "10.244.1.6",
                json!({"status": {"phase": "Failed"}}),
            ),
            pod(
                "other",
                "n1",
                "10.244.1.5",
                json!({"metadata": {"labels": {"app": "db"}}}),
            ),
            pod(
                "elsewhere",
                "n1",
                "10.244.1.4",
                json!({"metadata": {"namespace": "e"}}),
            ),
        ];
        let d = desired(&svc(json!({})), &pods, &nodes()).expect("managed");
        assert!(d.groups.is_empty(), "{d:#?}");
        assert_eq!(
            d.skipped,
            [
                ("noip".to_string(), Skip::NoAddress),
                ("unbound".to_string(), Skip::NotScheduled),
                ("lost".to_string(), Skip::NodeMissing),
                ("done".to_string(), Skip::Finished),
                ("failed".to_string(), Skip::Finished),
            ]
        );
        // A pod on a missing node is published with publishNotReadyAddresses (as kube does).
        let publish = svc(json!({"spec": {"publishNotReadyAddresses": true}}));
        let d = desired(&publish, &pods[2..3], &nodes()).expect("managed");
        assert_eq!(d.groups.values().map(BTreeMap::len).sum::<usize>(), 1);
    }

    #[test]
    fn named_target_ports_resolve_per_pod_and_group_endpoints() {
        let pods = [
            pod("a", "n1", "10.244.1.1", json!({})),
            // Another port number for the name: its own group.
            pod(
                "b",
                "n1",
                "10.244.1.2",
                json!({"spec": {"containers": [{"name": "c",
                "ports": [{"name": "http", "containerPort": 8081}]}]}}),
            ),
            // No port of that name (and one of the name on UDP): only the numeric port.
            pod(
                "c",
                "n2",
                "10.244.2.1",
                json!({"spec": {"containers": [{"name": "c",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "UDP"}]}]}}),
            ),
            // The name on a sidecar (an init container that keeps running).
            pod(
                "s",
                "n2",
                "10.244.2.2",
                json!({"spec": {"containers": [{"name": "c"}],
                "initContainers": [{"name": "side", "restartPolicy": "Always",
                    "ports": [{"name": "http", "containerPort": 8080}]}]}}),
            ),
        ];
        let d = desired(&svc(json!({})), &pods, &nodes()).expect("managed");
        let full = (
            AddressType::IPv4,
            vec![port("http", 8080), port("metrics", 9090)],
        );
        let other = (
            AddressType::IPv4,
            vec![port("http", 8081), port("metrics", 9090)],
        );
        let numeric = (AddressType::IPv4, vec![port("metrics", 9090)]);
        let keys: Vec<&SliceKey> = d.groups.keys().collect();
        assert_eq!(keys.len(), 3, "{keys:?}");
        let pods_of =
            |k: &SliceKey| -> Vec<String> { d.groups[k].keys().map(|e| e.pod.clone()).collect() };
        assert_eq!(pods_of(&full), ["a", "s"]);
        assert_eq!(pods_of(&other), ["b"]);
        assert_eq!(pods_of(&numeric), ["c"]);

        // Unset, 0 and "" targetPorts are the port; UDP and appProtocol carried; an unnamed port is "".
        let s = svc(json!({"spec": {"ports": [
            {"port": 53, "protocol": "UDP"},
            {"name": "a", "port": 81, "targetPort": 0, "appProtocol": "http"},
            {"name": "b", "port": 82, "targetPort": ""}]}}));
        let d = desired(&s, &pods[..1], &nodes()).expect("managed");
        let key = d.groups.keys().next().expect("one group").clone();
        assert_eq!(
            key.1,
            [
                PortSpec {
                    name: Some(String::new()),
                    protocol: Some("UDP".into()),
                    port: Some(53),
                    app_protocol: None
                },
                PortSpec {
                    app_protocol: Some("http".into()),
                    ..port("a", 81)
                },
                port("b", 82),
            ]
        );
    }

    #[test]
    fn address_types_follow_the_service_families_and_pod_ips() {
        let dual = json!({"status": {"podIPs": [{"ip": "10.244.1.1"}, {"ip": "fd00::1"}]}});
        let pods = [pod("a", "n1", "10.244.1.1", dual)];
        let fams = |s: &Service| desired(s, &pods, &nodes()).expect("managed").families;
        let groups = |s: &Service| -> Vec<(AddressType, Vec<String>)> {
            desired(s, &pods, &nodes())
                .expect("managed")
                .groups
                .iter()
                .flat_map(|((af, _), eps)| eps.values().map(move |e| (*af, e.addresses.clone())))
                .collect()
        };
        // Declared families win.
        let both = svc(json!({"spec": {"ipFamilies": ["IPv4", "IPv6"]}}));
        assert_eq!(
            groups(&both),
            [
                (AddressType::IPv4, vec!["10.244.1.1".to_string()]),
                (AddressType::IPv6, vec!["fd00::1".to_string()])
            ]
        );
        let v6 = svc(json!({"spec": {"ipFamilies": ["IPv6"]}}));
        assert_eq!(
            groups(&v6),
            [(AddressType::IPv6, vec!["fd00::1".to_string()])]
        );
        // Else the cluster IP's family.
        let by_ip = svc(json!({"spec": {"clusterIP": "fd00:96::a"}}));
        assert_eq!(fams(&by_ip), BTreeSet::from([AddressType::IPv6]));
        // Headless without families: both, and the headless label.
        let headless = svc(json!({"spec": {"clusterIP": "None"}}));
        assert_eq!(
            fams(&headless),
            BTreeSet::from([AddressType::IPv4, AddressType::IPv6])
        );
        let d = desired(&headless, &pods, &nodes()).expect("managed");
        assert_eq!(d.labels.get(HEADLESS_LABEL).map(String::as_str), Some(""));
    }

    #[test]
    fn only_selector_services_are_managed_and_labels_are_copied_but_reserved() {
        let pods = [pod("a", "n1", "10.244.1.1", json!({}))];
        assert!(desired(&svc(json!({"spec": {"selector": null}})), &pods, &nodes()).is_none());
        assert!(desired(&svc(json!({"spec": {"selector": {}}})), &pods, &nodes()).is_none());
        let ext = svc(json!({"spec": {"type": "ExternalName", "externalName": "x.example"}}));
        assert!(desired(&ext, &pods, &nodes()).is_none());

        let labelled = svc(json!({"metadata": {"labels": {"team": "x",
            SERVICE_NAME_LABEL: "spoof", MANAGED_BY_LABEL: "me", HEADLESS_LABEL: "x"}}}));
        let d = desired(&labelled, &pods, &nodes()).expect("managed");
        assert_eq!(
            d.labels,
            BTreeMap::from([
                ("team".to_string(), "x".to_string()),
                (SERVICE_NAME_LABEL.to_string(), "web".to_string()),
                (MANAGED_BY_LABEL.to_string(), CONTROLLER_NAME.to_string()),
            ])
        );
    }

    #[test]
    fn hostname_is_set_for_the_pods_subdomain_service_only() {
        let named = json!({"spec": {"hostname": "h0", "subdomain": "web"}});
        let other = json!({"spec": {"hostname": "h1", "subdomain": "db"}});
        let pods = [
            pod("a", "n1", "10.244.1.1", named),
            pod("b", "n1", "10.244.1.2", other),
        ];
        let d = desired(&svc(json!({})), &pods, &nodes()).expect("managed");
        let key = (
            AddressType::IPv4,
            vec![port("http", 8080), port("metrics", 9090)],
        );
        assert_eq!(one(&d, &key, "a").hostname.as_deref(), Some("h0"));
        assert_eq!(one(&d, &key, "b").hostname, None);
    }
}
