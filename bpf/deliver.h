/* SPDX-License-Identifier: GPL-2.0 */
/*
 * deliver.h - THE destination gate, and delivery into a local pod.
 *
 * Invariant (placement independence): every packet that enters a pod has
 * passed cp_dst_gate() for that pod's host veth, whichever way it came:
 *
 *   - from_pod (same node) and from_overlay (cross node) deliver with
 *     bpf_redirect_peer() straight into the ingress of the pod-side veth.
 *     That skips the host veth's egress hook (and the veth transmit plus
 *     backlog hop it costs: the RR/CRR latency), so cp_deliver_local()
 *     runs the gate inline before redirecting - it is the only way either
 *     program hands a packet to a pod;
 *   - everything the kernel routes into a pod (node -> pod, a pod to
 *     itself, PARAM_F_KERNEL_LOCAL, PARAM_F_DELIVER_EGRESS) leaves through
 *     the host veth's egress, where to_pod runs the same gate.
 *
 * Destination checks (today the delivery guard, policy later) therefore go
 * into cp_dst_gate() and nowhere else: no path into a pod can miss them.
 *
 * bpf_redirect_peer needs the pod-side veth in another network namespace
 * than the host side (always so for a CNI pod) and up; otherwise the
 * kernel drops the packet. It also makes pod-bound traffic invisible to
 * tcpdump on the host veth: PARAM_F_DELIVER_EGRESS restores the old
 * bpf_redirect-to-egress delivery for debugging (the gate then runs twice),
 * on the default network only: the gate refuses kernel-path traffic into a
 * VPC port (bpf/vpc.h), so VPC deliveries always go straight in.
 */
#ifndef CP_DELIVER_H
#define CP_DELIVER_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "meter.h"
#include "parse.h"
#include "policy.h"
#include "netpol.h"
#include "lbmaps.h"

/* Verdicts of the destination gate. */
enum cp_gate_verdict {
	CP_GATE_ADMIT = 0,        /* the packet may enter the pod */
	CP_GATE_NO_PORT = 1,      /* the veth is not a pod port we know */
	CP_GATE_MISDELIVERED = 2, /* the destination is not this veth's pod */
	CP_GATE_QUARANTINED = 3,  /* the port is severed (bpf/vpc.h) */
	CP_GATE_VPC_KERNEL = 4,   /* kernel-routed, into a VPC port (bpf/vpc.h) */
	CP_GATE_SG_INGRESS = 5,   /* a SecurityGroup of the pod does not admit it */
	CP_GATE_SG_NO_L4 = 6,     /* the pod is policed and the packet has no L4 header */
	CP_GATE_NP_INGRESS = 7,   /* the pod's NetworkPolicies do not admit it */
	CP_GATE_NP_NO_L4 = 8,     /* the pod is isolated and the packet has no L4 header */
};

/* cp_dst_gate()'s `policy`: how the packet is judged. */
enum cp_gate_policy {
	CP_GATE_POLICY_NONE = 0,  /* the bridge's node flows into a VPC pod: exempt */
	CP_GATE_POLICY_CHECK = 1, /* SecurityGroups or NetworkPolicies judge it */
	CP_GATE_POLICY_NODE = 2,  /* the local node's own packet: NetworkPolicy exempts it */
};

/* The drop reason of a gate verdict other than CP_GATE_ADMIT / CP_GATE_NO_PORT. */
static __always_inline __u32 cp_gate_reason(int verdict)
{
	switch (verdict) {
	case CP_GATE_QUARANTINED:
		return CP_DROP_QUARANTINED;
	case CP_GATE_VPC_KERNEL:
		return CP_DROP_VPC_KERNEL_PATH;
	case CP_GATE_SG_INGRESS:
		return CP_DROP_SG_INGRESS;
	case CP_GATE_SG_NO_L4:
		return CP_DROP_SG_NO_L4;
	case CP_GATE_NP_INGRESS:
		return CP_DROP_NP_INGRESS;
	case CP_GATE_NP_NO_L4:
		return CP_DROP_NP_NO_L4;
	default:
		return CP_DROP_MISDELIVERED;
	}
}

#ifdef CP_TEST_HOOKS
/* Test build only: how the last local delivery was made. */
struct cp_test_deliver {
	__u32 ifindex; /* redirect target (host-side veth) */
	__u32 peer;    /* 1: bpf_redirect_peer, 0: bpf_redirect to egress */
	__u32 count;   /* deliveries so far */
	__u32 pad;
};
CP_ABI_SIZE(struct cp_test_deliver, 16);
CP_ABI_OFFSET(struct cp_test_deliver, peer, 4);
CP_ABI_OFFSET(struct cp_test_deliver, count, 8);
CP_ABI_OFFSET(struct cp_test_deliver, pad, 12);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cp_test_deliver);
} cp_test_deliver SEC(".maps");

static __always_inline void cp_test_record_deliver(__u32 ifindex, __u32 peer)
{
	__u32 zero = 0;
	struct cp_test_deliver *t = bpf_map_lookup_elem(&cp_test_deliver, &zero);

	if (t) {
		t->ifindex = ifindex;
		t->peer = peer;
		t->count += 1;
	}
}
#endif

/* cp_dst_gate(): the packet's network is unknown (the kernel routed it). */
#define CP_NET_ANY 0xffffffffu

/*
 * May a packet for `dst` on network `net` enter the pod behind host veth
 * `ifindex`? Only if the veth is a pod port of that network and `dst` is
 * that pod's own address there: this catches mis-delivery by stale routes,
 * maps or reused ifindexes at the last hop, and a packet never crosses
 * from one network into another's pod. `net` is CP_NET_ANY where the
 * kernel routed the packet (to_pod): then the port's network is taken.
 * A severed port (CP_PORT_F_QUARANTINE) takes nothing, and the kernel's
 * path into a VPC port is the dual-address bridge's alone (bpf/vpc.h): a
 * kernel-routed packet into one is refused. SecurityGroups join here
 * (cp_sg_ingress, bpf/policy.h), and on the default network NetworkPolicy
 * (cp_np_ingress, bpf/netpol.h), judging `pkt` as `policy` says
 * (enum cp_gate_policy: the kubelet's probes are exempt, by the path they
 * take); `dst` is the address the pod is looked up by (the bridge's
 * translated one).
 *
 * `resolved` is the cp_locals entry the caller already found for
 * {net, dst}, or NULL; once the port is known to be on `net`, the gate's
 * own lookup would be that very one, so it is reused. `key` is scratch; when
 * the port exists, key->net is its network on return (to_pod meters by it).
 */
static __always_inline int cp_dst_gate(struct __sk_buff *skb, __u32 ifindex,
				       const struct cp_pkt *pkt, const struct addr128 *dst,
				       __u32 net, const struct cp_endpoint *resolved,
				       struct cp_ep_key *key, int policy)
{
	const struct cp_port *port = bpf_map_lookup_elem(&cp_ports, &ifindex);
	const struct cp_endpoint *ep = resolved;
	int sg;

	if (!port)
		return CP_GATE_NO_PORT;
	key->net = port->net;
	/* vpc: a severed port takes nothing (bpf/vpc.h) */
	if (port->flags & CP_PORT_F_QUARANTINE)
		return CP_GATE_QUARANTINED;
	if (net != CP_NET_ANY && port->net != net)
		return CP_GATE_MISDELIVERED;
	/* vpc: the host routes no VPC address; the bridge's node -> fabric IP
	 * translation is the only kernel path into a VPC port (bpf/vpc.h) */
	if (net == CP_NET_ANY && port->net != CP_NET_DEFAULT)
		return CP_GATE_VPC_KERNEL;
	if (!ep) {
		key->addr = *dst;
		ep = bpf_map_lookup_elem(&cp_locals, key);
	}
	if (!ep || ep->ifindex != ifindex)
		return CP_GATE_MISDELIVERED;
	/* SecurityGroup ingress, stateful (bpf/policy.h); not for the
	 * bridge's node flows, which no group selects */
	if (policy == CP_GATE_POLICY_NONE)
		return CP_GATE_ADMIT;
	if (port->net == CP_NET_DEFAULT) {
		/* NetworkPolicy ingress, stateful (bpf/netpol.h) */
		sg = cp_np_ingress(skb, pkt, policy == CP_GATE_POLICY_NODE);
		if (sg)
			return sg == CP_DROP_NP_NO_L4 ? CP_GATE_NP_NO_L4 : CP_GATE_NP_INGRESS;
		return CP_GATE_ADMIT;
	}
	sg = cp_sg_ingress(skb, pkt, port->net, port->net);
	if (sg)
		return sg == CP_DROP_SG_NO_L4 ? CP_GATE_SG_NO_L4 : CP_GATE_SG_INGRESS;
	return CP_GATE_ADMIT;
}

/*
 * Deliver to local pod `ep`, found in cp_locals for {net, pkt->dst}: the
 * destination gate, then the pod's MAC, then straight into the pod.
 * Returns the tc verdict.
 */
static __always_inline int cp_deliver_local(struct __sk_buff *skb, const struct cp_pkt *pkt,
					    __u32 net, const struct cp_endpoint *ep,
					    struct cp_ep_key *key)
{
	const struct cp_params *cfg;
	__u32 target = ep->ifindex;
	int gate;

	/* lb: a reply of the pod's own per-packet ClusterIP flow (bpf/lbmaps.h) */
	if (net == CP_NET_DEFAULT && cp_lb_client(target)) {
		gate = cp_lb_inside(skb, pkt);
		if (gate)
			return gate;
	}
	gate = cp_dst_gate(skb, target, pkt, &pkt->dst, net, ep, key, CP_GATE_POLICY_CHECK);
	if (gate != CP_GATE_ADMIT)
		return cp_drop_net(skb, net, cp_gate_reason(gate));
	if (cp_set_dst_mac(skb, ep->mac) < 0)
		return cp_drop_net(skb, net, CP_DROP_MALFORMED);
	cp_meter_ingress(skb, net);

	cfg = cp_get_params();
	/* vpc: not for a VPC, whose port egress (to_pod) takes no delivery but
	 * the bridge's (bpf/vpc.h) */
	if (cfg && (cfg->flags & CP_PARAM_F_DELIVER_EGRESS) && net == CP_NET_DEFAULT) {
#ifdef CP_TEST_HOOKS
		cp_test_record_deliver(target, 0);
#endif
		return bpf_redirect(target, 0);
	}
#ifdef CP_TEST_HOOKS
	cp_test_record_deliver(target, 1);
#endif
	return bpf_redirect_peer(target, 0);
}

#endif /* CP_DELIVER_H */
