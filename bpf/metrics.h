/* SPDX-License-Identifier: GPL-2.0 */
/*
 * metrics.h - drop counters by reason, per CPU (no atomics on the hot path;
 * the agent sums the CPUs). The reason numbers are ABI: the agent exports
 * them as the `reason` label (crates/datapath/src/abi.rs DropReason, whose
 * label is the enumerator's name after CP_DROP_, lower-cased; an
 * unprivileged test checks names, values and count against the object).
 */
#ifndef CP_METRICS_H
#define CP_METRICS_H

#include "common.h"

enum cp_drop_reason {
	CP_DROP_UNKNOWN = 0,
	CP_DROP_MALFORMED = 1,       /* truncated or unparsable headers */
	CP_DROP_UNSUPPORTED_L3 = 2,  /* neither IPv4, IPv6 nor ARP from a pod */
	CP_DROP_NO_PORT = 3,         /* from_pod on a veth without a cp_ports entry */
	CP_DROP_RPF = 4,             /* pod sent with a source that is not its own */
	CP_DROP_NO_TUNNEL_KEY = 5,   /* overlay packet without tunnel metadata */
	CP_DROP_UNKNOWN_VNI = 6,     /* VNI of a network this node does not serve */
	CP_DROP_NO_ENDPOINT = 7,     /* overlay packet for an unknown pod of a non-default net */
	CP_DROP_NO_CONFIG = 8,       /* cp_params missing the overlay device */
	CP_DROP_ENCAP = 9,           /* bpf_skb_set_tunnel_key failed */
	CP_DROP_MASQ_NO_PORT = 10,   /* masquerade port range exhausted */
	CP_DROP_MASQ_REWRITE = 11,   /* packet rewrite failed */
	CP_DROP_MISDELIVERED = 12,   /* to_pod: destination is not this veth's pod */
	CP_DROP_NO_REMOTE = 13,      /* to_overlay: routed into the overlay, no remote owns the address */
	CP_DROP_UNKNOWN_VTEP = 14,   /* from_overlay: outer source is no known node tunnel endpoint */
	CP_DROP_OVERLAY_PORT = 15,   /* pod traffic to the overlay port (UDP 4789) of anything but a pod */
	CP_DROP_MASQ_FRAGMENT = 16,  /* to_uplink: an IPv4 fragment the masquerade cannot translate */
	CP_DROP_MASQ_IP_OPTIONS = 17, /* to_uplink: an IPv4 header with options, not translated */
	CP_DROP_MASQ_PROTO = 18,     /* to_uplink: a protocol or ICMP type the masquerade cannot translate */
	CP_DROP_LINK_SCOPE = 19,     /* IPv6 link-scope/multicast traffic from a pod that is not ND/MLD */
	/* VPC isolation, quarantine (bpf/vpc.h): 20..=24 */
	CP_DROP_VPC_ISOLATED = 20,   /* from_pod: a VPC pod's packet for anything but its own VPC's endpoints */
	CP_DROP_VPC_SOURCE = 21,     /* from_overlay: VPC inner source is no Port of that VPC on another node */
	CP_DROP_VPC_SENDER = 22,     /* from_overlay: VPC inner source is a Port of another node than the sender */
	CP_DROP_VPC_KERNEL_PATH = 23, /* to_pod: the kernel routed something into a VPC port */
	CP_DROP_QUARANTINED = 24,    /* from/into a severed (quarantined) port */
	CP_DROP_BRIDGE_UNTRANSLATABLE = 25, /* to_pod: node -> fabric address the bridge cannot translate */
	CP_DROP_BRIDGE_NO_PORT = 26, /* to_pod: no free bridge port for the flow */
	CP_DROP_SG_INGRESS = 27,     /* SecurityGroup: no group of the destination admits it (bpf/policy.h) */
	CP_DROP_SG_EGRESS = 28,      /* SecurityGroup: no group of the source admits it */
	CP_DROP_SG_NO_L4 = 29,       /* SecurityGroup: a policed endpoint's packet without an L4 header (later fragment, truncated) */
	/* Per-packet Service load balancing (bpf/lb.h): 30..=32 */
	CP_DROP_LB_NO_BACKEND = 30,  /* a wire-scope Service frontend without a usable backend */
	CP_DROP_LB_NAT = 31,         /* per-packet Service translation failed: no SNAT port, rewrite, no way out */
	CP_DROP_LB_SOURCE_RANGE = 32, /* a LoadBalancer IP from a source outside its loadBalancerSourceRanges */
	/* NetworkPolicy (bpf/netpol.h): 33..=35 */
	CP_DROP_NP_INGRESS = 33,     /* NetworkPolicy: the destination pod's policies do not admit it */
	CP_DROP_NP_EGRESS = 34,      /* NetworkPolicy: the source pod's policies do not admit it */
	CP_DROP_NP_NO_L4 = 35,       /* NetworkPolicy: an isolated pod's packet without an L4 header */
	CP_DROP_HOST_INGRESS = 36,   /* host firewall: the node's policies do not admit it in */
	CP_DROP_HOST_EGRESS = 37,    /* host firewall: the node's policies do not let it out */
	CP_DROP_MAX = 48,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CP_DROP_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u64);
} cp_drops SEC(".maps");

/* Count a drop and return the verdict, so call sites read `return cp_drop(..)`. */
static __always_inline int cp_drop(__u32 reason)
{
	__u64 *cnt = bpf_map_lookup_elem(&cp_drops, &reason);

	if (cnt)
		*cnt += 1;
	return TC_ACT_SHOT;
}

#endif /* CP_METRICS_H */
