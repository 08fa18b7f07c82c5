//! Well-known annotation, label and finalizer keys: the user-facing contract on
//! objects cozyplane does not own (pods, services, nodes) and the reverse-lookup
//! labels on its own claims. Keep these identical to the prior implementation so
//! existing manifests keep working.

/// The main API group (served by the cozyplane API server).
pub const SDN_GROUP: &str = "sdn.cozystack.io";
/// The node-local group (FabricIP, a CRD on a real cluster).
pub const LOCAL_GROUP: &str = "local.sdn.cozystack.io";
/// The only version of both groups.
pub const VERSION: &str = "v1alpha1";

// --- Pod / Service annotations (the user contract) ---

/// Pod/Service annotation `[<owner-ns>/]<vpc>`: attach the pod (or Service) to a VPC.
pub const ANNOTATION_VPC: &str = "sdn.cozystack.io/vpc";
/// Pod annotation `[<ns>/]<vpc>`: the pod is a gateway leg of that VPC.
pub const ANNOTATION_GATEWAY_FOR: &str = "sdn.cozystack.io/gateway-for";
/// Pod annotation stamped by the CNI: the pod's VPC address (a cache, never read back).
pub const ANNOTATION_VPC_IP: &str = "sdn.cozystack.io/vpc-ip";
/// Pod annotation stamped by the CNI: the pod's VPC MAC address.
pub const ANNOTATION_VPC_MAC: &str = "sdn.cozystack.io/vpc-mac";
/// Port and FabricIP annotation: JSON snapshot of the claimant pod's labels.
pub const ANNOTATION_POD_LABELS: &str = "sdn.cozystack.io/pod-labels";
/// FabricIP annotation: JSON snapshot of the claimant pod's named container
/// ports (`[{"name", "protocol", "port"}]`, sorted), which NetworkPolicy
/// resolves per destination pod.
pub const ANNOTATION_POD_PORTS: &str = "sdn.cozystack.io/pod-ports";
/// Service annotation passed through to the address-controller.
pub const ANNOTATION_IP_ADDRESS_CLAIM: &str = "local.sdn.cozystack.io/ip-address-claim";
/// Node annotation published by each agent: its extra source addresses.
pub const ANNOTATION_NODE_ADDRESSES: &str = "cozyplane.io/node-addresses";

// --- Labels on Ports ---

/// Port label: the VPC name.
pub const LABEL_VPC: &str = "sdn.cozystack.io/vpc";
/// Port label: the VPC's namespace.
pub const LABEL_VPC_NAMESPACE: &str = "sdn.cozystack.io/vpc-namespace";
/// Port label: the claimant pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "sdn.cozystack.io/pod-namespace";
/// Port label: the claimant pod's name.
pub const LABEL_POD_NAME: &str = "sdn.cozystack.io/pod-name";
/// Port label: the claimant pod's UID.
pub const LABEL_POD_UID: &str = "sdn.cozystack.io/pod-uid";
/// Port label: the node the claim was made on (the agent's CNI GC lists by it).
pub const LABEL_NODE: &str = "sdn.cozystack.io/node";
/// Port label: marks a persistent (KubeVirt VM) Port, exempt from pod GC.
pub const LABEL_VM_NAME: &str = "sdn.cozystack.io/vm-name";

// --- Labels on Services cozyplane owns ---

/// Service label naming the owning FloatingIP.
pub const LABEL_FLOATING_IP: &str = "sdn.cozystack.io/floating-ip";
/// Service label naming the owning VPCGateway.
pub const LABEL_VPC_GATEWAY: &str = "sdn.cozystack.io/vpc-gateway";
/// Service label: the address family (`IPv4`/`IPv6`) of an owned Service.
pub const LABEL_ADDRESS_FAMILY: &str = "sdn.cozystack.io/address-family";
/// Standard label that keeps other proxies off Services cozyplane serves.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// The value of [`LABEL_SERVICE_PROXY_NAME`] on cozyplane's Services.
pub const SERVICE_PROXY_NAME: &str = "cozyplane";

// --- Labels on FabricIPs (reverse lookup) ---

/// FabricIP label: the claimant pod's UID.
pub const LABEL_FABRIC_POD_UID: &str = "local.sdn.cozystack.io/pod-uid";
/// FabricIP label: the claimant pod's namespace.
pub const LABEL_FABRIC_POD_NAMESPACE: &str = "local.sdn.cozystack.io/pod-namespace";
/// FabricIP label: the node holding the claim.
pub const LABEL_FABRIC_NODE: &str = "local.sdn.cozystack.io/node";

// --- Namespace-selector entity label for NetworkPolicy peers ---

/// `policy.cozyplane.io/entity: nodes | local-pods | local-node`.
pub const LABEL_POLICY_ENTITY: &str = "policy.cozyplane.io/entity";

// --- Finalizers ---

/// On Ports: held until the node's agent has severed the port.
pub const FINALIZER_SEVER: &str = "sdn.cozystack.io/sever";
/// On VPCBindings: the controller reaps the consumer's Ports first.
pub const FINALIZER_REAP_PORTS: &str = "sdn.cozystack.io/reap-ports";

/// A parsed `[<namespace>/]<vpc>` annotation value (see [`ANNOTATION_VPC`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VpcAnnotation {
    pub namespace: String,
    pub name: String,
}

/// Why an annotation value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected [<namespace>/]<vpc>, each a DNS-1123 label")]
pub struct VpcAnnotationError(pub String);

/// Parse the value of [`ANNOTATION_VPC`] / [`ANNOTATION_GATEWAY_FOR`]:
/// `<vpc>` (in `default_namespace`, the annotated object's) or `<namespace>/<vpc>`.
/// Both parts must be DNS-1123 labels, the rule for namespace and VPC names.
pub fn parse_vpc_annotation(
    value: &str,
    default_namespace: &str,
) -> Result<VpcAnnotation, VpcAnnotationError> {
    let (ns, name) = match value.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (default_namespace, value),
    };
    if !is_dns1123_label(ns) || !is_dns1123_label(name) {
        return Err(VpcAnnotationError(value.to_string()));
    }
    Ok(VpcAnnotation {
        namespace: ns.to_string(),
        name: name.to_string(),
    })
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vpc_annotation() {
        let a = |ns: &str, n: &str| VpcAnnotation {
            namespace: ns.into(),
            name: n.into(),
        };
        assert_eq!(
            parse_vpc_annotation("blue", "tenant-a"),
            Ok(a("tenant-a", "blue"))
        );
        assert_eq!(
            parse_vpc_annotation("owner/blue", "tenant-a"),
            Ok(a("owner", "blue"))
        );
        for bad in [
            "",
            "/blue",
            "owner/",
            "a/b/c",
            "Blue",
            "blue-",
            "owner/blue.x",
            &"x".repeat(64),
        ] {
            assert_eq!(
                parse_vpc_annotation(bad, "tenant-a"),
                Err(VpcAnnotationError(bad.to_string())),
                "{bad}"
            );
        }
    }
}
