//! core/v1 Service defaulting and validation, the essentials of kube's
//! `SetDefaults_Service`, `ValidateService` and `ValidateServiceUpdate`,
//! as pure functions of the object. What depends on the server's
//! configuration (the families and ranges it serves, the node port range)
//! and on the store (whether a value is taken) is checked by the allocator
//! ([`super::alloc`]), with the same 422 causes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cozyplane_api::kinds::{FieldError, FieldErrorType};
use serde_json::{json, Map, Value};

use super::config::Family;
use crate::meta;
use crate::status::ApiError;

pub const CLUSTER_IP: &str = "ClusterIP";
pub const NODE_PORT: &str = "NodePort";
pub const LOAD_BALANCER: &str = "LoadBalancer";
pub const EXTERNAL_NAME: &str = "ExternalName";
/// `spec.clusterIP` of a headless Service.
pub const NONE: &str = "None";
/// kube's default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT: i64 = 10800;
/// kube's largest ClientIP affinity timeout (1 day).
pub const MAX_AFFINITY_TIMEOUT: i64 = 86400;

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// `spec.type` (defaulted: `ClusterIP` when unset).
pub fn service_type(svc: &Value) -> &str {
    match s(svc, "/spec/type") {
        "" => CLUSTER_IP,
        t => t,
    }
}

/// `spec.clusterIPs`, else `[spec.clusterIP]` when set.
pub fn cluster_ips(svc: &Value) -> Vec<String> {
    let ips: Vec<String> = svc
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    if ips.is_empty() {
        let one = s(svc, "/spec/clusterIP");
        if !one.is_empty() {
            return vec![one.to_string()];
        }
    }
    ips
}

/// A headless Service (`clusterIP: None`).
pub fn is_headless(svc: &Value) -> bool {
    cluster_ips(svc).first().map(String::as_str) == Some(NONE)
}

/// Whether the Service has a cluster IP (or `None`) at all: every type
/// but ExternalName.
pub fn needs_cluster_ip(svc: &Value) -> bool {
    service_type(svc) != EXTERNAL_NAME
}

/// Whether node ports are allocated for the Service's ports: NodePort,
/// and LoadBalancer unless `allocateLoadBalancerNodePorts: false`.
pub fn allocates_node_ports(svc: &Value) -> bool {
    match service_type(svc) {
        NODE_PORT => true,
        LOAD_BALANCER => svc
            .pointer("/spec/allocateLoadBalancerNodePorts")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        _ => false,
    }
}

/// Whether the Service may have node ports at all.
pub fn may_have_node_ports(svc: &Value) -> bool {
    matches!(service_type(svc), NODE_PORT | LOAD_BALANCER)
}

/// Whether the Service gets a `healthCheckNodePort`: LoadBalancer with
/// `externalTrafficPolicy: Local`.
pub fn needs_health_check_node_port(svc: &Value) -> bool {
    service_type(svc) == LOAD_BALANCER && s(svc, "/spec/externalTrafficPolicy") == "Local"
}

/// kube's `ExternallyAccessible`: NodePort, LoadBalancer, or ClusterIP
/// with external IPs; only these take an `externalTrafficPolicy`.
pub fn externally_accessible(svc: &Value) -> bool {
    match service_type(svc) {
        NODE_PORT | LOAD_BALANCER => true,
        CLUSTER_IP => svc
            .pointer("/spec/externalIPs")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty()),
        _ => false,
    }
}

/// The ports as `(index, port)`.
pub fn ports(svc: &Value) -> Vec<(usize, &Value)> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|a| a.iter().enumerate().collect())
        .unwrap_or_default()
}

/// `protocol` of a port (defaulted: TCP).
pub fn protocol(port: &Value) -> &str {
    match s(port, "/protocol") {
        "" => "TCP",
        p => p,
    }
}

/// `nodePort` of a port; 0 when unset.
pub fn node_port(port: &Value) -> i64 {
    port.get("nodePort").and_then(Value::as_i64).unwrap_or(0)
}

/// `spec.healthCheckNodePort`; 0 when unset.
pub fn health_check_node_port(svc: &Value) -> i64 {
    svc.pointer("/spec/healthCheckNodePort")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// The hooks' `prepare`: kube's defaulting of a Service, on every write.
pub fn prepare(obj: &mut Value) -> Result<(), ApiError> {
    let Some(o) = obj.as_object_mut() else {
        return Ok(());
    };
    let spec = o.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return Err(ApiError::bad_request("spec: must be an object"));
    };
    if spec
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        spec.insert("type".into(), json!(CLUSTER_IP));
    }
    if spec
        .get("sessionAffinity")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        spec.insert("sessionAffinity".into(), json!("None"));
    }
    if spec.get("sessionAffinity").and_then(Value::as_str) == Some("ClientIP")
        && spec
            .get("sessionAffinityConfig")
            .and_then(|c| c.pointer("/clientIP/timeoutSeconds"))
            .is_none()
    {
        let cfg = spec
            .entry("sessionAffinityConfig")
            .or_insert_with(|| json!({}));
        if let Some(cfg) = cfg.as_object_mut() {
            let ip = cfg.entry("clientIP").or_insert_with(|| json!({}));
            if let Some(ip) = ip.as_object_mut() {
                ip.insert("timeoutSeconds".into(), json!(DEFAULT_AFFINITY_TIMEOUT));
            }
        }
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            if p.get("protocol")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                p.insert("protocol".into(), json!("TCP"));
            }
            let unset = match p.get("targetPort") {
                None | Some(Value::Null) => true,
                Some(Value::String(t)) => t.is_empty(),
                Some(Value::Number(n)) => n.as_i64() == Some(0),
                _ => false,
            };
            if unset {
                if let Some(port) = p.get("port").cloned() {
                    p.insert("targetPort".into(), port);
                }
            }
        }
    }
    // clusterIP and clusterIPs say the same thing: fill the one left empty.
    let ip = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let ips_empty = spec
        .get("clusterIPs")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if !ip.is_empty() && ips_empty {
        spec.insert("clusterIPs".into(), json!([ip]));
    } else if ip.is_empty() && !ips_empty {
        if let Some(first) = spec
            .get("clusterIPs")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .map(str::to_string)
        {
            spec.insert("clusterIP".into(), json!(first));
        }
    }
    let kind = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or(CLUSTER_IP)
        .to_string();
    let view = json!({"spec": Value::Object(spec.clone())});
    if externally_accessible(&view)
        && spec
            .get("externalTrafficPolicy")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        spec.insert("externalTrafficPolicy".into(), json!("Cluster"));
    }
    if kind != EXTERNAL_NAME
        && spec
            .get("internalTrafficPolicy")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        spec.insert("internalTrafficPolicy".into(), json!("Cluster"));
    }
    if kind == LOAD_BALANCER && spec.get("allocateLoadBalancerNodePorts").is_none() {
        spec.insert("allocateLoadBalancerNodePorts".into(), json!(true));
    }
    Ok(())
}

/// The hooks' `prepare_update`, before [`prepare`] on an update of `old`:
/// kube's `patchAllocatedValues` (a write that leaves out what was
/// allocated — `kubectl apply` of a manifest without `clusterIP` — keeps
/// it) and `dropTypeDependentFields` (a type change that leaves the fields
/// of the old type as they were drops them, so `kubectl edit` of the type
/// alone works).
pub fn prepare_update(new: &mut Value, old: &Value) {
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let old_spec = old
        .get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let view = |m: &Map<String, Value>| json!({"spec": Value::Object(m.clone())});
    let new_view = view(&*spec);
    let same = |spec: &Map<String, Value>, k: &str| spec.get(k) == old_spec.get(k);
    let unset = |spec: &Map<String, Value>, k: &str| match spec.get(k) {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    };
    if needs_cluster_ip(old) && needs_cluster_ip(&new_view) {
        if unset(&*spec, "clusterIP") && unset(&*spec, "clusterIPs") {
            for k in ["clusterIP", "clusterIPs"] {
                if let Some(v) = old_spec.get(k) {
                    spec.insert(k.into(), v.clone());
                }
            }
        }
        for k in ["ipFamilies", "ipFamilyPolicy"] {
            if unset(&*spec, k) {
                if let Some(v) = old_spec.get(k) {
                    spec.insert(k.into(), v.clone());
                }
            }
        }
    }
    // A downgrade to SingleStack gives up the secondary IP and family.
    if needs_cluster_ip(old)
        && needs_cluster_ip(&new_view)
        && spec.get("ipFamilyPolicy").and_then(Value::as_str) == Some("SingleStack")
        && old_spec.get("ipFamilyPolicy").and_then(Value::as_str) != Some("SingleStack")
    {
        for k in ["clusterIPs", "ipFamilies"] {
            if same(&*spec, k) {
                if let Some(a) = spec.get_mut(k).and_then(Value::as_array_mut) {
                    a.truncate(1);
                }
            }
        }
    }
    if needs_cluster_ip(old) && !needs_cluster_ip(&new_view) {
        for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if same(&*spec, k) {
                spec.remove(k);
            }
        }
    }
    let old_ports: Vec<(i64, String, i64)> = ports(old)
        .into_iter()
        .map(|(_, p)| {
            (
                p.get("port").and_then(Value::as_i64).unwrap_or(0),
                protocol(p).to_string(),
                node_port(p),
            )
        })
        .collect();
    let keep_node_ports = may_have_node_ports(old) && may_have_node_ports(&new_view);
    let drop_node_ports = may_have_node_ports(old) && !may_have_node_ports(&new_view);
    if let Some(ps) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ps.iter_mut().filter_map(Value::as_object_mut) {
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            let proto = p
                .get("protocol")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or("TCP")
                .to_string();
            let np = p.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
            if keep_node_ports && np == 0 {
                if let Some((_, _, old_np)) = old_ports
                    .iter()
                    .find(|(op, oproto, onp)| *op == port && *oproto == proto && *onp != 0)
                {
                    p.insert("nodePort".into(), json!(old_np));
                }
            }
            if drop_node_ports && np != 0 && old_ports.iter().any(|(_, _, onp)| *onp == np) {
                p.remove("nodePort");
            }
        }
    }
    let new_view = view(&*spec);
    let new_hc = health_check_node_port(&new_view);
    if needs_health_check_node_port(old) && needs_health_check_node_port(&new_view) && new_hc == 0 {
        if let Some(v) = old_spec.get("healthCheckNodePort") {
            spec.insert("healthCheckNodePort".into(), v.clone());
        }
    }
    if needs_health_check_node_port(old)
        && !needs_health_check_node_port(&new_view)
        && same(&*spec, "healthCheckNodePort")
    {
        spec.remove("healthCheckNodePort");
    }
    if externally_accessible(old)
        && !externally_accessible(&new_view)
        && same(&*spec, "externalTrafficPolicy")
    {
        spec.remove("externalTrafficPolicy");
    }
    if service_type(old) == LOAD_BALANCER && service_type(&new_view) != LOAD_BALANCER {
        for k in ["allocateLoadBalancerNodePorts", "loadBalancerClass"] {
            if same(&*spec, k) {
                spec.remove(k);
            }
        }
    }
    if service_type(&new_view) == EXTERNAL_NAME && same(&*spec, "internalTrafficPolicy") {
        spec.remove("internalTrafficPolicy");
    }
}

/// kube's `IsValidPortName` (IANA_SVC_NAME): at most 15 characters of
/// `[a-z0-9-]`, at least one letter, no hyphen at either end or twice in
/// a row.
pub fn is_iana_svc_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 15
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && n.bytes().any(|b| b.is_ascii_lowercase())
        && !n.starts_with('-')
        && !n.ends_with('-')
        && !n.contains("--")
}

/// kube's DNS-1035 label (Service names): a DNS-1123 label starting with a
/// letter.
pub fn is_dns1035_label(n: &str) -> bool {
    meta::is_dns1123_label(n) && n.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
}

fn err(kind: FieldErrorType, field: impl Into<String>, msg: impl Into<String>) -> FieldError {
    FieldError::new(kind, field, msg)
}

fn invalid(field: impl Into<String>, value: &Value, why: &str) -> FieldError {
    err(
        FieldErrorType::Invalid,
        field,
        format!("Invalid value: {value}: {why}"),
    )
}

fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> FieldError {
    let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
    err(
        FieldErrorType::NotSupported,
        field,
        format!(
            "Unsupported value: {value}: supported values: {}",
            list.join(", ")
        ),
    )
}

fn forbidden(field: impl Into<String>, why: &str) -> FieldError {
    err(
        FieldErrorType::Forbidden,
        field,
        format!("Forbidden: {why}"),
    )
}

fn required(field: impl Into<String>) -> FieldError {
    err(FieldErrorType::Required, field, "Required value")
}

fn check_enum(errs: &mut Vec<FieldError>, svc: &Value, ptr: &str, field: &str, allowed: &[&str]) {
    if let Some(v) = svc.pointer(ptr) {
        if !v.as_str().is_some_and(|x| allowed.contains(&x)) {
            errs.push(not_supported(field, v, allowed));
        }
    }
}

fn int_field(
    errs: &mut Vec<FieldError>,
    v: Option<&Value>,
    field: &str,
    lo: i64,
    hi: i64,
) -> Option<i64> {
    let v = v?;
    match v.as_i64() {
        Some(n) if (lo..=hi).contains(&n) => Some(n),
        _ => {
            errs.push(invalid(
                field,
                v,
                &format!("must be between {lo} and {hi}, inclusive"),
            ));
            None
        }
    }
}

/// `validate_create` of Service: kube's `ValidateService` essentials
/// (every write runs it; [`validate_service_update`] adds the update rules).
pub fn validate_service(svc: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(name) = meta::meta_str(svc, "name").filter(|n| !n.is_empty()) {
        if !is_dns1035_label(name) {
            errs.push(invalid("metadata.name", &json!(name), "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character"));
        }
    }
    let ty = service_type(svc);
    check_enum(
        &mut errs,
        svc,
        "/spec/type",
        "spec.type",
        &[CLUSTER_IP, NODE_PORT, LOAD_BALANCER, EXTERNAL_NAME],
    );
    let ips = cluster_ips(svc);
    let headless = is_headless(svc);

    // Cluster IPs.
    let ip = s(svc, "/spec/clusterIP");
    if !ip.is_empty() && ips.first().map(String::as_str) != Some(ip) {
        errs.push(invalid(
            "spec.clusterIPs",
            &json!(ips),
            "must be empty or the first value must match spec.clusterIP",
        ));
    }
    if ty == EXTERNAL_NAME {
        if !ips.is_empty() {
            errs.push(forbidden(
                "spec.clusterIPs",
                "may not be set for ExternalName services",
            ));
        }
        if svc
            .pointer("/spec/ipFamilyPolicy")
            .is_some_and(|v| !v.is_null())
        {
            errs.push(forbidden(
                "spec.ipFamilyPolicy",
                "may not be set for ExternalName services",
            ));
        }
        if svc
            .pointer("/spec/ipFamilies")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            errs.push(forbidden(
                "spec.ipFamilies",
                "may not be set for ExternalName services",
            ));
        }
        let ext = s(svc, "/spec/externalName");
        let trimmed = ext.strip_suffix('.').unwrap_or(ext);
        if ext.is_empty() {
            errs.push(required("spec.externalName"));
        } else if !meta::is_dns1123_subdomain(trimmed) {
            errs.push(invalid("spec.externalName", &json!(ext), "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
        }
    }
    if ips.len() > 2 {
        errs.push(invalid(
            "spec.clusterIPs",
            &json!(ips),
            "may contain at most 2 entries",
        ));
    }
    let mut ip_families: Vec<Option<Family>> = Vec::new();
    for (i, v) in ips.iter().enumerate() {
        if v == NONE {
            if i > 0 || ips.len() > 1 {
                errs.push(invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &json!(v),
                    "'None' must be the first and only value",
                ));
            }
            ip_families.push(None);
            continue;
        }
        match v.parse::<IpAddr>() {
            Ok(a) if a.to_string() == *v => {
                if a.is_unspecified() || a.is_loopback() || a.is_multicast() {
                    errs.push(invalid(
                        format!("spec.clusterIPs[{i}]"),
                        &json!(v),
                        "must be a unicast, non-loopback IP address",
                    ));
                }
                ip_families.push(Some(Family::of(&a)));
            }
            Ok(_) => {
                errs.push(invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &json!(v),
                    "must be in canonical form",
                ));
                ip_families.push(None);
            }
            Err(_) => {
                errs.push(invalid(
                    format!("spec.clusterIPs[{i}]"),
                    &json!(v),
                    "must be a valid IP address (e.g. 10.9.8.7 or 2001:db8::ffff), or 'None'",
                ));
                ip_families.push(None);
            }
        }
    }
    if let [Some(a), Some(b)] = ip_families[..] {
        if a == b {
            errs.push(invalid(
                "spec.clusterIPs[1]",
                &json!(ips[1]),
                "may not have the same IP family as spec.clusterIPs[0]",
            ));
        }
    }
    if headless && matches!(ty, NODE_PORT | LOAD_BALANCER) {
        errs.push(invalid(
            "spec.clusterIPs[0]",
            &json!(NONE),
            &format!("may not be set to 'None' for {ty} services"),
        ));
    }

    // IP families and policy.
    check_enum(
        &mut errs,
        svc,
        "/spec/ipFamilyPolicy",
        "spec.ipFamilyPolicy",
        &["SingleStack", "PreferDualStack", "RequireDualStack"],
    );
    let families: Vec<&Value> = svc
        .pointer("/spec/ipFamilies")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if families.len() > 2 {
        errs.push(invalid(
            "spec.ipFamilies",
            &json!(families),
            "may contain at most 2 entries",
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, f) in families.iter().enumerate() {
        match f.as_str().and_then(Family::parse) {
            None => errs.push(not_supported(
                format!("spec.ipFamilies[{i}]"),
                f,
                &["IPv4", "IPv6"],
            )),
            Some(fam) => {
                if !seen.insert(fam) {
                    errs.push(err(
                        FieldErrorType::Duplicate,
                        format!("spec.ipFamilies[{i}]"),
                        format!("Duplicate value: {f}"),
                    ));
                }
                if let Some(Some(ipf)) = ip_families.get(i) {
                    if *ipf != fam {
                        errs.push(invalid(
                            format!("spec.clusterIPs[{i}]"),
                            &json!(ips[i]),
                            &format!(
                                "expected an {} value as indicated by `ipFamilies[{i}]`",
                                fam.name()
                            ),
                        ));
                    }
                }
            }
        }
    }
    let policy = s(svc, "/spec/ipFamilyPolicy");
    let many = families.len() > 1 || ips.iter().filter(|i| *i != NONE).count() > 1;
    if many && (policy.is_empty() || policy == "SingleStack") && ty != EXTERNAL_NAME {
        errs.push(invalid("spec.ipFamilyPolicy", &json!(policy), "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"));
    }

    // Ports.
    let ports = ports(svc);
    if ports.is_empty() && !headless && ty != EXTERNAL_NAME {
        errs.push(required("spec.ports"));
    }
    let mut names = BTreeSet::new();
    let mut port_protos = BTreeSet::new();
    let mut node_ports: BTreeMap<(i64, String), usize> = BTreeMap::new();
    for (i, p) in &ports {
        let f = |k: &str| format!("spec.ports[{i}].{k}");
        let name = s(p, "/name");
        if ports.len() > 1 && name.is_empty() {
            errs.push(required(f("name")));
        }
        if !name.is_empty() {
            if !meta::is_dns1123_label(name) {
                errs.push(invalid(f("name"), &json!(name), "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"));
            }
            if !names.insert(name) {
                errs.push(err(
                    FieldErrorType::Duplicate,
                    f("name"),
                    format!("Duplicate value: \"{name}\""),
                ));
            }
        }
        let port = match p.get("port") {
            None => {
                errs.push(required(f("port")));
                None
            }
            v => int_field(&mut errs, v, &f("port"), 1, 65535),
        };
        let proto = protocol(p);
        if !matches!(proto, "TCP" | "UDP" | "SCTP") {
            errs.push(not_supported(
                f("protocol"),
                &json!(proto),
                &["SCTP", "TCP", "UDP"],
            ));
        }
        if let Some(port) = port {
            if !port_protos.insert((port, proto.to_string())) {
                errs.push(err(
                    FieldErrorType::Duplicate,
                    format!("spec.ports[{i}]"),
                    format!("Duplicate value: {{\"port\":{port},\"protocol\":\"{proto}\"}}"),
                ));
            }
        }
        match p.get("targetPort") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) => {
                if !is_iana_svc_name(t) {
                    errs.push(invalid(f("targetPort"), &json!(t), "must contain only lowercase alphanumeric characters or '-', at most 15 characters, at least one letter, and no '-' at either end or twice in a row (IANA_SVC_NAME)"));
                }
            }
            v => {
                int_field(&mut errs, v, &f("targetPort"), 1, 65535);
            }
        }
        let np = match p.get("nodePort") {
            None | Some(Value::Null) => 0,
            v => int_field(&mut errs, v, &f("nodePort"), 0, 65535).unwrap_or(0),
        };
        if np != 0 {
            if !may_have_node_ports(svc) {
                errs.push(forbidden(
                    f("nodePort"),
                    &format!("may not be used when `type` is '{ty}'"),
                ));
            }
            if node_ports.insert((np, proto.to_string()), *i).is_some() {
                errs.push(err(
                    FieldErrorType::Duplicate,
                    f("nodePort"),
                    format!("Duplicate value: {np}"),
                ));
            }
        }
    }

    // Traffic policies.
    if let Some(v) = svc
        .pointer("/spec/externalTrafficPolicy")
        .filter(|v| !v.is_null())
    {
        if !externally_accessible(svc) {
            errs.push(invalid(
                "spec.externalTrafficPolicy",
                v,
                "may only be set for externally-accessible services",
            ));
        } else {
            check_enum(
                &mut errs,
                svc,
                "/spec/externalTrafficPolicy",
                "spec.externalTrafficPolicy",
                &["Cluster", "Local"],
            );
        }
    }
    check_enum(
        &mut errs,
        svc,
        "/spec/internalTrafficPolicy",
        "spec.internalTrafficPolicy",
        &["Cluster", "Local"],
    );
    let hc = svc
        .pointer("/spec/healthCheckNodePort")
        .filter(|v| !v.is_null());
    if let Some(v) = hc {
        if int_field(&mut errs, Some(v), "spec.healthCheckNodePort", 0, 65535)
            .is_some_and(|n| n != 0)
        {
            if !needs_health_check_node_port(svc) {
                errs.push(invalid("spec.healthCheckNodePort", v, "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"));
            } else if node_ports.keys().any(|(np, _)| Some(*np) == v.as_i64()) {
                errs.push(invalid(
                    "spec.healthCheckNodePort",
                    v,
                    "provided port is already allocated",
                ));
            }
        }
    }
    if svc
        .pointer("/spec/allocateLoadBalancerNodePorts")
        .is_some_and(|v| !v.is_null())
        && ty != LOAD_BALANCER
    {
        errs.push(forbidden(
            "spec.allocateLoadBalancerNodePorts",
            "may only be used when `type` is 'LoadBalancer'",
        ));
    }
    if svc
        .pointer("/spec/loadBalancerClass")
        .is_some_and(|v| !v.is_null())
        && ty != LOAD_BALANCER
    {
        errs.push(forbidden(
            "spec.loadBalancerClass",
            "may only be used when `type` is 'LoadBalancer'",
        ));
    }

    // Session affinity.
    check_enum(
        &mut errs,
        svc,
        "/spec/sessionAffinity",
        "spec.sessionAffinity",
        &["ClientIP", "None"],
    );
    let affinity = s(svc, "/spec/sessionAffinity");
    let timeout = svc.pointer("/spec/sessionAffinityConfig/clientIP/timeoutSeconds");
    if affinity == "ClientIP" {
        match timeout {
            None => errs.push(required(
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            )),
            v => {
                int_field(
                    &mut errs,
                    v,
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    1,
                    MAX_AFFINITY_TIMEOUT,
                );
            }
        }
    } else if svc
        .pointer("/spec/sessionAffinityConfig")
        .is_some_and(|v| !v.is_null())
    {
        errs.push(forbidden(
            "spec.sessionAffinityConfig",
            &format!("must not be set when `sessionAffinity` is {affinity}"),
        ));
    }

    // Addresses.
    for (i, r) in svc
        .pointer("/spec/loadBalancerSourceRanges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let cidr = r.as_str().map(|r| r.trim().parse::<ipnet::IpNet>());
        if !matches!(cidr, Some(Ok(_))) {
            errs.push(invalid(
                format!("spec.loadBalancerSourceRanges[{i}]"),
                r,
                "must be a list of IP ranges. For example, 10.240.0.0/24,10.250.0.0/24 ",
            ));
        }
    }
    for (i, a) in svc
        .pointer("/spec/externalIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let ok = a
            .as_str()
            .and_then(|a| a.parse::<IpAddr>().ok())
            .is_some_and(|a| !a.is_unspecified() && !a.is_loopback() && !a.is_multicast());
        if !ok {
            errs.push(invalid(
                format!("spec.externalIPs[{i}]"),
                a,
                "must be a valid unicast, non-loopback IP address",
            ));
        }
    }
    errs
}

/// `validate_update` of Service: kube's `ValidateServiceUpdate` — cluster
/// IPs may not change once set (but a secondary may be added or removed
/// with the policy), nor the primary family, except to or from
/// ExternalName. Runs after [`prepare_update`], so a write that leaves
/// them out keeps them.
pub fn validate_service_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !needs_cluster_ip(old) || !needs_cluster_ip(new) {
        return errs;
    }
    let (n, o) = (cluster_ips(new), cluster_ips(old));
    if let Some(first) = o.first() {
        if n.first() != Some(first) {
            errs.push(invalid(
                "spec.clusterIPs[0]",
                &json!(n.first().map(String::as_str).unwrap_or("")),
                "may not change once set",
            ));
        }
    }
    if let (Some(a), Some(b)) = (o.get(1), n.get(1)) {
        if a != b {
            errs.push(invalid(
                "spec.clusterIPs[1]",
                &json!(b),
                "may not change once set",
            ));
        }
    }
    if o.len() == 2 && n.len() == 1 && s(new, "/spec/ipFamilyPolicy") != "SingleStack" {
        errs.push(invalid(
            "spec.clusterIPs",
            &json!(n),
            "may not be removed when `ipFamilyPolicy` is not 'SingleStack'",
        ));
    }
    let fam = |v: &Value| {
        v.pointer("/spec/ipFamilies/0")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    if !fam(old).is_empty() && fam(new) != fam(old) {
        errs.push(invalid(
            "spec.ipFamilies[0]",
            &json!(fam(new)),
            "may not change once set",
        ));
    }
    errs
}

/// The name of the IPAddress for `ip`: its canonical text.
pub fn ip_address_name(ip: &IpAddr) -> String {
    ip.to_string()
}

/// `validate_create` of IPAddress: the name is an IP in canonical form,
/// and `spec.parentRef` names a resource and an object.
pub fn validate_ip_address(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta::meta_str(obj, "name").unwrap_or("");
    match name.parse::<IpAddr>() {
        Ok(ip) if ip_address_name(&ip) == name => {}
        Ok(ip) => errs.push(invalid(
            "metadata.name",
            &json!(name),
            &format!("must be in canonical form (\"{ip}\")"),
        )),
        Err(_) => errs.push(invalid(
            "metadata.name",
            &json!(name),
            "must be a valid IP address",
        )),
    }
    for k in ["resource", "name"] {
        if s(obj, &format!("/spec/parentRef/{k}")).is_empty() {
            errs.push(required(format!("spec.parentRef.{k}")));
        }
    }
    errs
}

/// `validate_update` of IPAddress: `spec` is immutable.
pub fn validate_ip_address_update(new: &Value, old: &Value) -> Vec<FieldError> {
    if new.get("spec") != old.get("spec") {
        return vec![invalid(
            "spec",
            new.get("spec").unwrap_or(&Value::Null),
            "field is immutable",
        )];
    }
    Vec::new()
}

/// The one ServiceCIDR served.
pub const DEFAULT_SERVICE_CIDR_NAME: &str = "kubernetes";

/// `validate_create` of ServiceCIDR: only `kubernetes` (written by the
/// server from `--service-cluster-ip-range`); more ranges are not
/// supported.
pub fn validate_service_cidr(obj: &Value) -> Vec<FieldError> {
    let name = meta::meta_str(obj, "name").unwrap_or("");
    if name != DEFAULT_SERVICE_CIDR_NAME {
        return vec![forbidden("metadata.name", "only the default ServiceCIDR \"kubernetes\" (from --service-cluster-ip-range) is supported; this server does not take more service ranges")];
    }
    Vec::new()
}

/// `validate_update` of ServiceCIDR: `spec.cidrs` is the server's, set
/// from its flag at start.
pub fn validate_service_cidr_update(new: &Value, old: &Value) -> Vec<FieldError> {
    if new.pointer("/spec/cidrs") != old.pointer("/spec/cidrs") {
        return vec![forbidden(
            "spec.cidrs",
            "set from --service-cluster-ip-range when the server starts",
        )];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(spec: Value) -> Value {
        let mut v = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "d"}, "spec": spec});
        let _ = prepare(&mut v);
        v
    }

    fn fields(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn defaults_are_kubes() {
        let v = svc(json!({"ports": [{"port": 80}], "sessionAffinity": "ClientIP"}));
        assert_eq!(v["spec"]["type"], "ClusterIP");
        assert_eq!(v["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(v["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(v["spec"]["internalTrafficPolicy"], "Cluster");
        assert!(v["spec"].get("externalTrafficPolicy").is_none());
        assert_eq!(
            v["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"],
            10800
        );
        let lb = svc(
            json!({"type": "LoadBalancer", "ports": [{"port": 80}], "clusterIPs": ["10.0.0.9"]}),
        );
        assert_eq!(lb["spec"]["externalTrafficPolicy"], "Cluster");
        assert_eq!(lb["spec"]["allocateLoadBalancerNodePorts"], true);
        assert_eq!(lb["spec"]["clusterIP"], "10.0.0.9");
        assert!(
            validate_service(&v).is_empty(),
            "{:?}",
            fields(&validate_service(&v))
        );
    }

    #[test]
    fn bad_services_get_one_cause_per_field() {
        let cases = [
            (
                json!({"type": "Bogus", "ports": [{"port": 1}]}),
                "spec.type",
            ),
            (json!({"ports": []}), "spec.ports"),
            (json!({"ports": [{"port": 0}]}), "spec.ports[0].port"),
            (json!({"ports": [{"port": 70000}]}), "spec.ports[0].port"),
            (
                json!({"ports": [{"port": 80, "protocol": "ICMP"}]}),
                "spec.ports[0].protocol",
            ),
            (
                json!({"ports": [{"port": 80, "name": "a"}, {"port": 81}]}),
                "spec.ports[1].name",
            ),
            (
                json!({"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "a"}]}),
                "spec.ports[1].name",
            ),
            (
                json!({"ports": [{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]}),
                "spec.ports[1]",
            ),
            (
                json!({"ports": [{"port": 80, "targetPort": "-web"}]}),
                "spec.ports[0].targetPort",
            ),
            (
                json!({"ports": [{"port": 80, "targetPort": 0x10000}]}),
                "spec.ports[0].targetPort",
            ),
            (
                json!({"ports": [{"port": 80, "nodePort": 30001}]}),
                "spec.ports[0].nodePort",
            ),
            (
                json!({"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80}]}),
                "spec.clusterIPs[0]",
            ),
            (
                json!({"ports": [{"port": 80}], "clusterIP": "10.0.0.300"}),
                "spec.clusterIPs[0]",
            ),
            (
                json!({"ports": [{"port": 80}], "externalTrafficPolicy": "Local"}),
                "spec.externalTrafficPolicy",
            ),
            (
                json!({"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}}),
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ),
            (
                json!({"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}),
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ),
            (
                json!({"type": "LoadBalancer", "ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0/33"]}),
                "spec.loadBalancerSourceRanges[0]",
            ),
            (
                json!({"ports": [{"port": 80}], "ipFamilies": ["IPv4", "IPv4"], "ipFamilyPolicy": "PreferDualStack"}),
                "spec.ipFamilies[1]",
            ),
            (
                json!({"ports": [{"port": 80}], "ipFamilies": ["IPv4", "IPv6"]}),
                "spec.ipFamilyPolicy",
            ),
            (
                json!({"ports": [{"port": 80}], "clusterIPs": ["10.0.0.1", "10.0.0.2"], "ipFamilyPolicy": "RequireDualStack"}),
                "spec.clusterIPs[1]",
            ),
            (
                json!({"type": "ExternalName", "clusterIP": "10.0.0.1", "externalName": "a.b"}),
                "spec.clusterIPs",
            ),
            (json!({"type": "ExternalName"}), "spec.externalName"),
            (
                json!({"type": "ClusterIP", "ports": [{"port": 80}], "healthCheckNodePort": 30000}),
                "spec.healthCheckNodePort",
            ),
        ];
        for (spec, field) in cases {
            let errs = validate_service(&svc(spec.clone()));
            assert!(
                errs.iter().any(|e| e.field == field),
                "{spec}: want {field}, got {:?}",
                fields(&errs)
            );
        }
        // Headless and ExternalName Services need no ports; a port number
        // may repeat with another protocol, and then share its node port.
        for ok in [
            json!({"clusterIP": "None"}),
            json!({"type": "ExternalName", "externalName": "db.example.com."}),
            json!({"type": "NodePort", "ports": [{"name": "a", "port": 53, "nodePort": 30053}, {"name": "b", "port": 53, "protocol": "UDP", "nodePort": 30053}]}),
            json!({"ports": [{"port": 80, "targetPort": "http-web"}]}),
        ] {
            let errs = validate_service(&svc(ok.clone()));
            assert!(errs.is_empty(), "{ok}: {:?}", fields(&errs));
        }
    }

    #[test]
    fn cluster_ips_are_immutable_and_omitted_ones_kept() {
        let old = svc(
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}], "clusterIP": "10.0.0.9", "clusterIPs": ["10.0.0.9"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack"}),
        );
        // A manifest without the allocated values keeps them.
        let mut new = json!({"metadata": {"name": "web"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        prepare_update(&mut new, &old);
        let _ = prepare(&mut new);
        assert_eq!(new["spec"]["clusterIP"], "10.0.0.9");
        assert_eq!(new["spec"]["ports"][0]["nodePort"], 30080);
        assert!(validate_service_update(&new, &old).is_empty());
        let mut moved = old.clone();
        moved["spec"]["clusterIP"] = json!("10.0.0.8");
        moved["spec"]["clusterIPs"] = json!(["10.0.0.8"]);
        let errs = validate_service_update(&moved, &old);
        assert_eq!(
            fields(&errs),
            ["spec.clusterIPs[0]: Invalid value: \"10.0.0.8\": may not change once set"]
        );
        // Changing only the type drops what the old type had.
        let mut to_cip = old.clone();
        to_cip["spec"]["type"] = json!("ClusterIP");
        prepare_update(&mut to_cip, &old);
        let _ = prepare(&mut to_cip);
        assert!(to_cip["spec"]["ports"][0].get("nodePort").is_none());
        assert!(to_cip["spec"].get("externalTrafficPolicy").is_none());
        assert!(
            validate_service(&to_cip).is_empty(),
            "{:?}",
            fields(&validate_service(&to_cip))
        );
        let mut to_ext = old.clone();
        to_ext["spec"]["type"] = json!("ExternalName");
        to_ext["spec"]["externalName"] = json!("a.example");
        prepare_update(&mut to_ext, &old);
        assert!(validate_service(&to_ext)
            .iter()
            .all(|e| !e.field.starts_with("spec.clusterIP")));
        assert!(validate_service_update(&to_ext, &old).is_empty());
    }

    #[test]
    fn ip_address_names_are_canonical_ips() {
        let ipa = |name: &str| json!({"metadata": {"name": name}, "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "d", "name": "web"}}});
        assert!(validate_ip_address(&ipa("10.0.0.1")).is_empty());
        assert!(validate_ip_address(&ipa("fd00::1")).is_empty());
        assert_eq!(validate_ip_address(&ipa("fd00:0::1")).len(), 1);
        assert_eq!(validate_ip_address(&ipa("web")).len(), 1);
        assert_eq!(
            validate_ip_address(&json!({"metadata": {"name": "10.0.0.1"}, "spec": {}})).len(),
            2
        );
    }
}
