//! The Services the Services benchmark programs, in both shapes it compares:
//! as Kubernetes objects (Service + EndpointSlice, what our agent's compiler
//! reads) and as the rules kube-proxy's iptables mode writes for them (what
//! `iptables-restore` is fed). One [`ServiceSet`] yields both, so the two
//! sides of the comparison program the same addresses.
//!
//! The rule shape follows `peer-baselines.md` section (e) and its Appendix E
//! (kube-proxy's iptables proxier as of its upstream tests): per Service a
//! `KUBE-SERVICES` match jumping to a `KUBE-SVC-*` chain (masquerade mark for
//! off-cluster sources, then one `-m statistic` rule per endpoint but the last),
//! per endpoint a `KUBE-SEP-*` chain (hairpin mark, DNAT); chain names are the
//! prefix plus the first 16 characters of base32(sha256(…)); above 1000
//! endpoints in all the per-endpoint comments are dropped ("large cluster
//! mode"). The base rules (jumps from the built-in chains) are separate: they
//! are applied once, untimed, as in the reference method.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use crate::error::{BenchError, Result};

/// The Service port every generated Service exposes.
pub const SERVICE_PORT: u16 = 80;
/// The endpoints' port (the Service's targetPort).
pub const TARGET_PORT: u16 = 8080;
/// The cluster pod CIDR the masquerade rule exempts.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Where Service addresses come from: `10.96.0.0/12` (kube's default range).
const SERVICE_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
/// How many addresses `10.96.0.0/12` holds.
const SERVICE_RANGE: u32 = 1 << 20;
/// Unused endpoint addresses (never contacted): `10.128.0.0/10`.
const UNUSED_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);
/// How many addresses `10.128.0.0/10` holds.
const UNUSED_RANGE: u32 = 1 << 22;
/// Above this many endpoints kube-proxy leaves out per-endpoint comments.
const LARGE_CLUSTER_ENDPOINTS: u64 = 1000;

/// `services` ClusterIP Services of `backends` endpoints each. Service *i* is
/// `ns<i>/svc<i>`, port `http` 80 → 8080, ClusterIP [`cluster_ip`]`(i)`; the
/// first and the last Service have the `real` endpoints (the bench's server),
/// every other one unused addresses nothing answers.
#[derive(Clone, Debug)]
pub struct ServiceSet {
    /// How many Services.
    pub services: u32,
    /// Endpoints per Service (when not `real`).
    pub backends: u32,
    /// The endpoints of the first and the last Service; empty: unused ones too.
    pub real: Vec<Ipv4Addr>,
}

impl ServiceSet {
    /// Checks that the addresses fit their ranges.
    pub fn validate(&self) -> Result<()> {
        if self.services == 0 || self.backends == 0 {
            return Err(BenchError::Invalid(
                "a service set needs at least one Service and one backend".into(),
            ));
        }
        if self.services >= SERVICE_RANGE - 16 {
            return Err(BenchError::Invalid(format!(
                "{} Services do not fit 10.96.0.0/12",
                self.services
            )));
        }
        if u64::from(self.services) * u64::from(self.backends) >= u64::from(UNUSED_RANGE - 16) {
            return Err(BenchError::Invalid(format!(
                "{} × {} endpoints do not fit 10.128.0.0/10",
                self.services, self.backends
            )));
        }
        Ok(())
    }

    /// The ClusterIP of the last Service (the one the connect benchmark uses:
    /// the worst case for a linear rule walk).
    pub fn last_ip(&self) -> Ipv4Addr {
        cluster_ip(self.services.saturating_sub(1))
    }

    /// The endpoints of Service `i`.
    pub fn endpoints(&self, i: u32) -> Vec<Ipv4Addr> {
        if !self.real.is_empty() && (i == 0 || i + 1 == self.services) {
            return self.real.clone();
        }
        let first = u64::from(i) * u64::from(self.backends);
        (0..u64::from(self.backends))
            .map(|k| {
                // validate() keeps this below 2^22: no truncation.
                let off = u32::try_from(first + k + 1).unwrap_or(u32::MAX);
                Ipv4Addr::from(UNUSED_BASE + off)
            })
            .collect()
    }

    /// The Services and their EndpointSlices, as the API server would list them.
    pub fn objects(&self) -> (Vec<Service>, Vec<EndpointSlice>) {
        let mut services = Vec::with_capacity(self.services as usize);
        let mut slices = Vec::with_capacity(self.services as usize);
        for i in 0..self.services {
            services.push(service_object(i));
            slices.push(slice_object(i, &self.endpoints(i)));
        }
        (services, slices)
    }
}

/// The ClusterIP of Service `i`: `10.96.0.0 + 10 + i`.
pub fn cluster_ip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(SERVICE_BASE + 10 + i)
}

/// Service `i` as an object.
pub fn service_object(i: u32) -> Service {
    let ip = cluster_ip(i).to_string();
    Service {
        metadata: ObjectMeta {
            name: Some(format!("svc{i}")),
            namespace: Some(format!("ns{i}")),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip.clone()),
            cluster_ips: Some(vec![ip]),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: i32::from(SERVICE_PORT),
                target_port: Some(IntOrString::Int(i32::from(TARGET_PORT))),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Service `i`'s EndpointSlice with `endpoints` (all ready).
pub fn slice_object(i: u32, endpoints: &[Ipv4Addr]) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("svc{i}-x")),
            namespace: Some(format!("ns{i}")),
            labels: Some(
                [(
                    cozyplane_agent::compile::services::LABEL_SERVICE_NAME.to_string(),
                    format!("svc{i}"),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: Some(
            endpoints
                .iter()
                .map(|a| Endpoint {
                    addresses: vec![a.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        serving: Some(true),
                        terminating: Some(false),
                    }),
                    ..Endpoint::default()
                })
                .collect(),
        ),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(i32::from(TARGET_PORT)),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

/// kube-proxy's chain-name hash: the first 16 characters of
/// base32(sha256(`s`)) (RFC 4648 alphabet).
pub fn chain_hash(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(s.as_bytes());
    let mut out = String::with_capacity(16);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &byte in digest.iter() {
        acc = (acc << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 && out.len() < 16 {
            bits -= 5;
            out.push(char::from(ALPHABET[((acc >> bits) & 31) as usize]));
        }
        acc &= (1 << bits) - 1;
        if out.len() == 16 {
            break;
        }
    }
    out
}

/// The rules applied once before timing: kube-proxy's jumps from the
/// built-in chains (filter and nat).
pub const BASE_RULES: &str = r#"*filter
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
"#;

/// What [`service_rules`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleCounts {
    /// `-A` rules in the nat table.
    pub nat_rules: u64,
    /// Chains declared in the nat table.
    pub nat_chains: u64,
    /// `-A` rules in the filter table.
    pub filter_rules: u64,
}

/// The `iptables-restore --noflush` input of kube-proxy's full sync for
/// `set`: the KUBE-* chains of the filter and nat tables.
pub fn service_rules(set: &ServiceSet) -> (String, RuleCounts) {
    let endpoints_total = u64::from(set.services) * u64::from(set.backends);
    let large = endpoints_total > LARGE_CLUSTER_ENDPOINTS;
    let comment = |text: &str| {
        if large {
            String::new()
        } else {
            format!(" -m comment --comment \"{text}\"")
        }
    };
    let mut chains = String::new();
    let mut rules = String::new();
    let mut counts = RuleCounts {
        nat_rules: 0,
        nat_chains: 4,
        filter_rules: 3,
    };
    for i in 0..set.services {
        let spn = format!("ns{i}/svc{i}:http");
        let ip = cluster_ip(i);
        let svc = format!("KUBE-SVC-{}", chain_hash(&format!("{spn}tcp")));
        let _ = writeln!(chains, ":{svc} - [0:0]");
        counts.nat_chains += 1;
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -m comment --comment \"{spn} cluster IP\" -m tcp -p tcp -d {ip} --dport {SERVICE_PORT} -j {svc}"
        );
        let _ = writeln!(
            rules,
            "-A {svc} -m comment --comment \"{spn} cluster IP\" -m tcp -p tcp -d {ip} --dport {SERVICE_PORT} ! -s {CLUSTER_CIDR} -j KUBE-MARK-MASQ"
        );
        counts.nat_rules += 2;
        let eps = set.endpoints(i);
        let n = eps.len();
        let mut seps = Vec::with_capacity(n);
        for (k, ep) in eps.iter().enumerate() {
            let sep = format!(
                "KUBE-SEP-{}",
                chain_hash(&format!("{spn}tcp{ep}:{TARGET_PORT}"))
            );
            let _ = writeln!(chains, ":{sep} - [0:0]");
            counts.nat_chains += 1;
            let c = comment(&format!("{spn} -> {ep}:{TARGET_PORT}"));
            if k + 1 < n {
                // kube-proxy: probability 1/(n - k), printed with 10 decimals.
                let p = 1.0 / (n - k) as f64;
                let _ = writeln!(
                    rules,
                    "-A {svc}{c} -m statistic --mode random --probability {p:.10} -j {sep}"
                );
            } else {
                let _ = writeln!(rules, "-A {svc}{c} -j {sep}");
            }
            counts.nat_rules += 1;
            seps.push((sep, ep));
        }
        for (sep, ep) in seps {
            let c = comment(&spn);
            let _ = writeln!(rules, "-A {sep}{c} -s {ep}/32 -j KUBE-MARK-MASQ");
            let _ = writeln!(
                rules,
                "-A {sep}{c} -m tcp -p tcp -j DNAT --to-destination {ep}:{TARGET_PORT}"
            );
            counts.nat_rules += 2;
        }
    }
    let _ = writeln!(
        rules,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    counts.nat_rules += 5; // the last KUBE-SERVICES rule, 3 KUBE-POSTROUTING, 1 KUBE-MARK-MASQ
    let mut out = String::with_capacity(chains.len() + rules.len() + 2048);
    out.push_str(
        r#"*filter
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
"#,
    );
    out.push_str(&chains);
    out.push_str(
        r#"-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
"#,
    );
    out.push_str(&rules);
    out.push_str("COMMIT\n");
    (out, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_hashes_are_kube_proxys() {
        // base32(sha256("")) = "4OYMIQUY7QOBJGX3..." (RFC 4648).
        assert_eq!(chain_hash(""), "4OYMIQUY7QOBJGX3");
        let h = chain_hash("ns0/svc0:httptcp");
        assert_eq!(h.len(), 16);
        assert!(h
            .bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b)));
    }

    #[test]
    fn addresses_stay_in_their_ranges_and_the_real_endpoints_go_first_and_last() {
        let set = ServiceSet {
            services: 100_000,
            backends: 2,
            real: vec![Ipv4Addr::new(10, 244, 2, 10), Ipv4Addr::new(10, 244, 2, 11)],
        };
        set.validate().unwrap();
        assert_eq!(cluster_ip(0), Ipv4Addr::new(10, 96, 0, 10));
        assert_eq!(set.last_ip(), Ipv4Addr::from(SERVICE_BASE + 10 + 99_999));
        assert_eq!(set.endpoints(0), set.real);
        assert_eq!(set.endpoints(99_999), set.real);
        let mid = set.endpoints(5);
        assert_eq!(
            mid,
            [Ipv4Addr::new(10, 128, 0, 11), Ipv4Addr::new(10, 128, 0, 12)]
        );
        let too_many = ServiceSet {
            services: 1 << 20,
            ..set
        };
        assert!(too_many.validate().is_err());
    }

    #[test]
    fn rules_have_kube_proxys_shape_and_counts() {
        let set = ServiceSet {
            services: 3,
            backends: 2,
            real: vec![],
        };
        let (text, counts) = service_rules(&set);
        // 8 per Service and 5 more; with the 3 base jumps that is
        // peer-baselines.md's count (16 nat rules for N = 1, 8008 for 1000).
        assert_eq!(counts.nat_rules, 3 * 8 + 5);
        let nat_rules = text
            .split("*nat")
            .nth(1)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("-A "))
            .count();
        assert_eq!(nat_rules as u64, counts.nat_rules);
        let nat_chains = text
            .split("*nat")
            .nth(1)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(':'))
            .count();
        assert_eq!(nat_chains as u64, counts.nat_chains);
        assert_eq!(counts.nat_chains, 4 + 3 * 3);
        assert!(text.contains("--probability 0.5000000000 -j KUBE-SEP-"));
        // Small sets keep the per-endpoint comments.
        assert!(text.contains("--comment \"ns1/svc1:http -> 10.128.0.3:8080\""));
        assert_eq!(text.matches("COMMIT").count(), 2);
        let big = ServiceSet {
            services: 501,
            backends: 2,
            real: vec![],
        };
        let (text, counts) = service_rules(&big);
        assert_eq!(counts.nat_rules, 501 * 8 + 5);
        assert!(
            !text.contains(" -> 10.128."),
            "large cluster mode drops them"
        );
        // Ten backends: 1/10, 1/9, … 1/2, then the last without statistic.
        let ten = ServiceSet {
            services: 1,
            backends: 10,
            real: vec![],
        };
        let (text, _) = service_rules(&ten);
        assert!(text.contains("--probability 0.1000000000"));
        assert!(text.contains("--probability 0.1111111111"));
        assert_eq!(text.matches("--probability").count(), 9);
    }

    #[test]
    fn objects_compile_to_one_frontend_per_service() {
        use cozyplane_agent::compile::services::{compile_services, to_desired, NodeView};
        let set = ServiceSet {
            services: 5,
            backends: 3,
            real: vec![],
        };
        let (svcs, slices) = set.objects();
        let view = NodeView {
            external_backends: vec!["10.0.0.0/8".parse().unwrap()],
            ..NodeView::default()
        };
        let tables = compile_services(&svcs, &slices, &view);
        assert!(tables.diagnostics.is_empty(), "{:?}", tables.diagnostics);
        let desired = to_desired(&tables);
        assert_eq!(desired.len(), 5);
        assert!(desired.values().all(|f| f.backends.len() == 3));
    }
}
