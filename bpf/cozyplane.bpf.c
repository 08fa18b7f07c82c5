// SPDX-License-Identifier: GPL-2.0
/*
 * cozyplane.bpf.c - the cozyplane datapath programs (tcx, SEC("classifier")
 * because aya 0.14 rejects SEC("tc")/SEC("tcx/...")).
 *
 *   from_pod     tcx ingress of every host-side pod veth: RPF, then same-node
 *                redirect, cross-node encap, pod->node encap, else kernel.
 *   to_pod       tcx egress of every host-side pod veth: the destination gate
 *                for what the kernel routes into a pod; from_pod and
 *                from_overlay run the same gate inline before they
 *                redirect_peer into a pod (bpf/deliver.h: the invariant).
 *   from_overlay tcx ingress of the overlay device: sender and VNI checks,
 *                learning of unknown remote sources, local delivery.
 *   to_overlay   tcx egress of the overlay device: encapsulation of what the
 *                node's own stack routes into the overlay (node -> remote pod).
 *   to_uplink    tcx egress of the uplink: masquerade SNAT.
 *   from_uplink  tcx ingress of the uplink: per-packet Service load
 *                balancing (NodePort, LoadBalancer, externalIPs: bpf/lb.h),
 *                masquerade reverse; in tc tunnel mode the overlay's packets
 *                for local pods go to tc_decap (bpf/encap.h).
 *
 *   sock_*       cgroup sock_addr hooks at --cgroup-root: socket-level
 *                Service load balancing (bpf/service.h): connect, UDP
 *                sendmsg forward, UDP recvmsg and getpeername reverse.
 *
 * Packets that are not ours are handed on with CP_PASS (TCX_NEXT) so other
 * tcx users chained after us still see them.
 */
#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "rpf.h"
#include "encap.h"
#include "masq.h"
#include "ct.h"
#include "policy.h"
#include "netpol.h"
#include "deliver.h"
#include "learn.h"
#include "meter.h"
#include "vpc.h"
#include "bridge.h"
#include "service.h"
#include "lb.h"
#include "hostfw.h"
#include "abi.h"

char LICENSE[] SEC("license") = "GPL";

/* from_pod's and from_uplink's tail calls (lb_from_pod, tc_decap). Pinned, so an agent restart keeps
 * the entries (a prog array is cleared when its last user reference goes);
 * every load points them at its own programs. */
enum cp_prog_slots {
	CP_PROG_LB_FROM_POD = 0,
	CP_PROG_TC_DECAP = 1,
	CP_PROG_SLOTS = 2,
};

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, CP_PROG_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} cp_progs SEC(".maps");

SEC("classifier")
int from_pod(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex;
	const struct cp_endpoint *ep;
	const struct cp_remote *rem;
	const struct cp_port *port;
	struct cp_lpm_key lk;
	struct cp_ep_key key;
	struct cp_pkt pkt;
	__u32 net;
	int sg;

	port = bpf_map_lookup_elem(&cp_ports, &ifindex);
	if (!port)
		return cp_drop(CP_DROP_NO_PORT);
	net = port->net;
	/* vpc: a severed port sends nothing, not even ARP or ND (bpf/vpc.h) */
	if (port->flags & CP_PORT_F_QUARANTINE)
		return cp_drop_net(skb, net, CP_DROP_QUARANTINED);

	switch (cp_parse(skb, &pkt)) {
	case CP_PARSE_IP4:
	case CP_PARSE_IP6:
		break;
	case CP_PARSE_ARP:
		return CP_PASS; /* the host veth answers by proxy_arp */
	case CP_PARSE_OTHER:
		return cp_drop_net(skb, net, CP_DROP_UNSUPPORTED_L3);
	default:
		return cp_drop_net(skb, net, CP_DROP_MALFORMED);
	}
	/* IPv6 link scope (a link-local or unspecified source, a multicast or
	 * link-local destination): the kernel never forwards it, and the pod
	 * may use it for ND/MLD with its host veth only (bpf/rpf.h). A global
	 * source must still be the pod's own. */
	if (pkt.flags & CP_PKT_V6_KERNEL) {
		/* bridge: a VPC pod's reply to fe80::1 of the node's flow (bpf/bridge.h) */
		if (net != CP_NET_DEFAULT && cp_bridge_to_gw(&pkt) == 2 &&
		    cp_rpf_ok(&key, net, &pkt, ifindex)) {
			int v = cp_bridge_from_pod(skb, &pkt, net);

			if (v != CP_BRIDGE_MISS)
				return v;
		}
		if (!cp_v6_nd_ok(skb, &pkt))
			return cp_drop_net(skb, net, CP_DROP_LINK_SCOPE);
		if (!(pkt.flags & CP_PKT_V6_LL_SRC) && !cp_rpf_ok(&key, net, &pkt, ifindex))
			return cp_drop_net(skb, net, CP_DROP_RPF);
		return CP_PASS;
	}

	if (!cp_rpf_ok(&key, net, &pkt, ifindex))
		return cp_drop_net(skb, net, CP_DROP_RPF);
	/* bridge: a VPC pod's reply to 169.254.1.1 of the node's flow goes back
	 * to the node, exempt from SecurityGroups like its request (bpf/bridge.h) */
	if (net != CP_NET_DEFAULT) {
		int v = cp_bridge_from_pod(skb, &pkt, net);

		if (v != CP_BRIDGE_MISS)
			return v;
	}
	/* NetworkPolicy egress on the default network (bpf/netpol.h),
	 * SecurityGroup egress on a VPC (bpf/policy.h); both stateful */
	if (net == CP_NET_DEFAULT)
		sg = cp_np_egress(skb, &pkt);
	else
		sg = cp_sg_egress(skb, &pkt, net, net);
	if (sg)
		return cp_drop_net(skb, net, sg);
	/* vpc: a VPC pod reaches its own VPC's endpoints only (bpf/vpc.h) */
	if (net != CP_NET_DEFAULT) {
		int v = cp_vpc_from_pod(skb, &pkt, net, &key);

		if (v != CP_VPC_OFF_NET)
			return v;
		return cp_drop_net(skb, net, CP_DROP_VPC_ISOLATED);
	}
	/* An IPv6 destination in 64:ff9b::/96 is a NAT64 gateway's business,
	 * never one of ours: its key is an IPv4 pod's or node's. */
	if (pkt.flags & CP_PKT_DST_NAT64)
		goto outside;

	/* same node: through the destination gate into the pod (deliver.h) */
	key.addr = pkt.dst;
	ep = bpf_map_lookup_elem(&cp_locals, &key);
	if (ep) {
		const struct cp_params *cfg;

		if (ep->ifindex == ifindex)
			return CP_PASS; /* to itself: let the kernel hairpin */
		if (net == CP_NET_DEFAULT) {
			cfg = cp_get_params();
			if (cfg && (cfg->flags & CP_PARAM_F_KERNEL_LOCAL))
				return CP_PASS;
		}
		return cp_deliver_local(skb, &pkt, net, ep, &key);
	}

	/* another node's pod */
	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = net;
	lk.addr = pkt.dst;
	rem = bpf_map_lookup_elem(&cp_remotes, &lk);
	if (rem)
		return cp_encap_redirect(skb, net, rem->tunnel_ip);

	/* another node itself: encapsulate so the underlay only ever carries
	 * node-sourced packets (spoof-guarding underlays drop pod sources) */
	if (net == CP_NET_DEFAULT) {
		rem = bpf_map_lookup_elem(&cp_node_remotes, &pkt.dst);
		if (rem) {
			const struct cp_params *cfg = cp_get_params();
			__be32 tip = rem->tunnel_ip;

			/* a node's VXLAN socket is no pod's business */
			if (cp_is_overlay_port(skb, &pkt))
				return cp_drop(CP_DROP_OVERLAY_PORT);
			/* lb: a backend's reply (or ICMP error) to a node
			 * (bpf/lb.h) */
			{
				int v = cp_lb_pod_reply(skb, &pkt);

				if (v != CP_LB_MISS)
					return v;
			}

			if (cfg && tip != cfg->node_ip)
				return cp_encap_redirect(skb, net, tip);
			return CP_PASS; /* this node */
		}
	}

	/* a pod the agent has not heard of yet, but whose packets came in from
	 * a known node: answer it there (bpf/learn.h) */
	{
		__be32 tip;

		if (cp_learned_tunnel(&key, net, &pkt.dst, &tip))
			return cp_encap_redirect(skb, net, tip);
	}
outside:
	/* Outside (masqueraded at the uplink), a Service, or a pod nobody
	 * knows yet. The overlay port is only ever a pod's (nested overlays
	 * between pods pass above): whatever the kernel does next - routing to
	 * a node, DNAT, masquerade - must not turn this into VXLAN from a
	 * node (bpf/encap.h). to_uplink checks again after the kernel's DNAT. */
	if (cp_is_overlay_port(skb, &pkt))
		return cp_drop(CP_DROP_OVERLAY_PORT);
	/* lb: a backend's reply (or ICMP error) to a client outside
	 * (bpf/lb.h), else perhaps a ClusterIP no socket hook translated: on
	 * in lb_from_pod */
	if (net == CP_NET_DEFAULT) {
		int v = cp_lb_pod_reply(skb, &pkt);

		if (v != CP_LB_MISS)
			return v;
		bpf_tail_call(skb, &cp_progs, CP_PROG_LB_FROM_POD);
	}
	return CP_PASS;
}

/*
 * from_pod's tail call for a default-network packet bound "outside": a
 * ClusterIP (or another inside-scope frontend) that no socket hook
 * translated - a KubeVirt guest's packet, whose sockets live in the guest -
 * gets a backend per packet, keeps the pod's source, and goes on like a pod
 * -> pod packet; the destination gate reverses the replies (bpf/lbmaps.h).
 * Anything else passes as from_pod would have let it. A program of its own
 * (a tail call), not a subprogram: from_pod's chain of calls is at the
 * verifier's 512-byte stack limit already.
 */
SEC("classifier")
int lb_from_pod(struct __sk_buff *skb)
{
	struct cp_svc_key sk = {};
	struct cp_pkt pkt;
	int v;

	v = cp_parse(skb, &pkt);
	if ((v != CP_PARSE_IP4 && v != CP_PARSE_IP6) || !cp_lb_family(skb, &pkt))
		return CP_PASS;
	/* Most of what comes here is bound for the internet: one hash lookup
	 * (is the destination a frontend at all?) before the flow table's. A
	 * flow whose frontend is gone is not translated either way. */
	sk.net = CP_NET_DEFAULT;
	sk.addr = pkt.dst;
	if (bpf_skb_load_bytes(skb, pkt.l4_off + 2, &sk.port, sizeof(sk.port)) < 0)
		return CP_PASS;
	sk.proto = pkt.l4proto;
	sk.scope = CP_SVC_SCOPE_INTERNAL;
	if (!bpf_map_lookup_elem(&cp_svc, &sk))
		return CP_PASS;
	v = cp_lb_ingress(skb, &pkt, skb->ingress_ifindex, 1);
	if (v == CP_LB_MISS)
		return CP_PASS;
	return v;
}

SEC("classifier")
int to_pod(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct cp_ep_key key;
	struct cp_pkt pkt;
	int parsed = cp_parse(skb, &pkt);
	int gate;

	switch (parsed) {
	case CP_PARSE_IP4:
	case CP_PARSE_IP6:
		break;
	case CP_PARSE_BAD:
		/* on a veth that is no pod port of ours, not our business */
		if (!bpf_map_lookup_elem(&cp_ports, &ifindex))
			return CP_PASS;
		return cp_drop(CP_DROP_MALFORMED);
	default:
		return CP_PASS; /* ARP from the host side */
	}
	/* vpc: link scope into a VPC or severed port is ND/ICMPv6 only (bpf/vpc.h) */
	if (pkt.flags & CP_PKT_V6_KERNEL)
		return cp_vpc_to_pod_link_scope(skb, &pkt, ifindex);
	/* bridge: the node's own traffic to a VPC pod's fabric address (bpf/bridge.h) */
	{
		int v = cp_bridge_to_pod(skb, &pkt, parsed == CP_PARSE_IP6, ifindex, &key);

		if (v != CP_BRIDGE_MISS)
			return v;
	}

	/* what the kernel routes into a pod: the same gate as the inline
	 * deliveries of from_pod/from_overlay (bpf/deliver.h) */
	/* a packet the node itself sent (no input device: the kubelet's
	 * probes) is exempt from NetworkPolicy, as Kubernetes requires; what
	 * the kernel forwards (from a pod, the uplink) is judged */
	gate = cp_dst_gate(skb, ifindex, &pkt, &pkt.dst, CP_NET_ANY, NULL, &key,
			   skb->ingress_ifindex ? CP_GATE_POLICY_CHECK : CP_GATE_POLICY_NODE);
	switch (gate) {
	case CP_GATE_ADMIT:
		/* an IPv6 64:ff9b::/96 destination matched an IPv4 pod's key */
		if (pkt.flags & CP_PKT_DST_NAT64)
			return cp_drop(CP_DROP_MISDELIVERED);
		cp_meter_ingress(skb, key.net); /* vpc: net 0 is not metered */
		return CP_PASS;
	case CP_GATE_NO_PORT:
		return CP_PASS; /* not a pod veth we know */
	case CP_GATE_VPC_KERNEL:
		/* bridge: node -> this pod's fabric IP is translated to its VPC
		 * address (source 169.254.1.1 / fe80::1) and admitted here;
		 * everything else the kernel routes into a VPC port is dropped */
		return cp_drop_net(skb, key.net, CP_DROP_VPC_KERNEL_PATH);
	default:
		return cp_drop_net(skb, key.net, cp_gate_reason(gate));
	}
}

/*
 * A decapsulated packet on network `net` from tunnel endpoint `sender`,
 * both already checked: from_overlay (device mode) and tc_decap (tc mode,
 * for a local endpoint) share everything after the outer headers. `keyp`
 * is the caller's scratch (tc_decap's frame is at the stack limit).
 */
static __always_inline int cp_overlay_rcv(struct __sk_buff *skb, __u32 net, __be32 sender,
					  struct cp_ep_key *keyp)
{
	const struct cp_endpoint *ep;
	struct cp_pkt pkt;

	switch (cp_parse(skb, &pkt)) {
	case CP_PARSE_IP4:
	case CP_PARSE_IP6:
		break;
	case CP_PARSE_ARP:
		return CP_PASS;
	case CP_PARSE_OTHER:
		return cp_drop_net(skb, net, CP_DROP_UNSUPPORTED_L3);
	default:
		return cp_drop_net(skb, net, CP_DROP_MALFORMED);
	}

	/* IPv6 link scope never crosses nodes: from_pod keeps it on the pod's
	 * link and to_overlay drops the device's own, so no honest node sends
	 * it */
	if (pkt.flags & CP_PKT_V6_KERNEL)
		return cp_drop_net(skb, net, CP_DROP_LINK_SCOPE);

	if (net != CP_NET_DEFAULT) {
		/* vpc: no learning; the source must be a Port of this VPC on
		 * the sending node (bpf/vpc.h) */
		int reason = cp_vpc_source_check(&pkt, net, sender);

		if (reason)
			return cp_drop_net(skb, net, reason);
	} else if (!(pkt.flags & CP_PKT_SRC_NAT64)) {
		/* where the source lives, if the agent does not know yet; an
		 * IPv6 source in 64:ff9b::/96 would be learned under an IPv4
		 * pod's key */
		cp_learn(keyp, net, &pkt.src, sender);
	}

	if (!(pkt.flags & CP_PKT_DST_NAT64)) {
		keyp->net = net;
		keyp->addr = pkt.dst;
		ep = bpf_map_lookup_elem(&cp_locals, keyp);
		if (ep) {
			/* An iptables kube-proxy DNATed this flow on this node (a
			 * local pod's request to a ClusterIP with a remote
			 * backend): the reply must pass the kernel's conntrack to
			 * get its ClusterIP source back, as from_pod does for the
			 * same node. The kernel routes it to the pod's veth, where
			 * to_pod runs the gate. */
			if (net == CP_NET_DEFAULT) {
				const struct cp_params *cfg = cp_get_params();

				if (cfg && (cfg->flags & CP_PARAM_F_KERNEL_LOCAL))
					return CP_PASS;
			}
			return cp_deliver_local(skb, &pkt, net, ep, keyp);
		}
	}
	/* net 0 to a node address: the kernel takes it (the inner dst MAC is the
	 * shared overlay MAC, i.e. this device's, so it is PACKET_HOST) - but
	 * never to its own VXLAN socket: a tunnel inside the tunnel would be
	 * decapsulated again with an outer source the sending node's pod chose
	 * (bpf/encap.h) */
	if (net == CP_NET_DEFAULT) {
		int v;

		if (cp_is_overlay_port(skb, &pkt))
			return cp_drop(CP_DROP_OVERLAY_PORT);
		/* lb: a remote backend's reply or ICMP error, or a request for
		 * this node's NodePort from another node (bpf/lb.h) */
		v = cp_lb_wire_reply(skb, &pkt);
		if (v != CP_LB_MISS)
			return v;
		v = cp_lb_ingress(skb, &pkt, 0, 0);
		if (v != CP_LB_MISS)
			return v;
		return CP_PASS;
	}
	return cp_drop_net(skb, net, CP_DROP_NO_ENDPOINT);
}

SEC("classifier")
int from_overlay(struct __sk_buff *skb)
{
	struct cp_ep_key key;
	const __u32 *netp;
	__be32 sender;
	__u32 vni;

	if (cp_tunnel_meta(skb, &vni, &sender) < 0)
		return cp_drop(CP_DROP_NO_TUNNEL_KEY);
	/* only the other nodes may send into the overlay (bpf/learn.h) */
	if (!cp_sender_known(sender))
		return cp_drop(CP_DROP_UNKNOWN_VTEP);
	netp = bpf_map_lookup_elem(&cp_vnis, &vni);
	if (!netp)
		return cp_drop(CP_DROP_UNKNOWN_VNI);
	return cp_overlay_rcv(skb, *netp, sender, &key);
}

/*
 * tc mode: VXLAN for this node arriving on the uplink. The sender and VNI
 * checks run here, before anything else; a packet for a local endpoint is
 * decapsulated and delivered at once (cp_overlay_rcv). Anything else - for
 * the node itself, a Service, an iptables kube-proxy (KERNEL_LOCAL) - goes
 * on to the VXLAN device as before, where from_overlay judges it again: the
 * kernel's decapsulation resets the offload state a forwarded packet needs
 * (bpf_skb_adjust_room leaves the tunnel GSO bits of a received
 * super-packet set), and only a local pod's own stack receives ours.
 * Returns CP_MISS_TUNNEL when the frame is not for tc decapsulation.
 */
#define CP_MISS_TUNNEL (-2)
static __always_inline int cp_uplink_tunnel(struct __sk_buff *skb, const struct cp_params *cfg)
{
	const struct cp_endpoint *ep;
	struct cp_ep_key key;
	const __u32 *netp;
	__be16 inner_proto;
	__be32 sender;
	__u32 vni, net;
	/* the inner IP header's destination, after outer Ethernet + room */
	const __u32 inner_ip = CP_ETH_HLEN + CP_VXLAN_ROOM;

	if (!cp_vxlan_rx(skb, cfg->node_ip, &vni, &sender, &inner_proto))
		return CP_MISS_TUNNEL;
	if (!cp_sender_known(sender))
		return cp_drop(CP_DROP_UNKNOWN_VTEP);
	netp = bpf_map_lookup_elem(&cp_vnis, &vni);
	if (!netp)
		return cp_drop(CP_DROP_UNKNOWN_VNI);
	net = *netp;
	if (net == CP_NET_DEFAULT && (cfg->flags & CP_PARAM_F_KERNEL_LOCAL))
		return CP_PASS;

	key.net = net;
	if (inner_proto == bpf_htons(ETH_P_IP)) {
		__be32 dst;

		if (bpf_skb_load_bytes(skb, inner_ip + offsetof(struct iphdr, daddr), &dst,
				       sizeof(dst)) < 0)
			return CP_PASS;
		addr_from_ip4(&key.addr, dst);
	} else if (inner_proto == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, inner_ip + offsetof(struct ipv6hdr, daddr), &key.addr,
				       sizeof(key.addr)) < 0)
			return CP_PASS;
		/* 64:ff9b::/96 has an IPv4 pod's key: never ours here */
		if (key.addr.w[0] == CP_NAT64_W0 && !key.addr.w[1] && !key.addr.w[2])
			return CP_PASS;
	} else {
		return CP_PASS;
	}
	ep = bpf_map_lookup_elem(&cp_locals, &key);
	if (!ep)
		return CP_PASS;
	if (cp_decap_tc(skb, inner_proto) < 0)
		return CP_PASS;
	return cp_overlay_rcv(skb, net, sender, &key);
}

/*
 * from_uplink's tail call in tc mode, for VXLAN to this node. A program of
 * its own (a tail call): inline, from_uplink's frame and its deepest call
 * chain passed the verifier's 512-byte stack limit.
 */
SEC("classifier")
int tc_decap(struct __sk_buff *skb)
{
	const struct cp_params *cfg = cp_get_params();
	int v;

	if (!cfg)
		return CP_PASS;
	v = cp_uplink_tunnel(skb, cfg);
	return v == CP_MISS_TUNNEL ? CP_PASS : v;
}

/*
 * The node's own stack routes the pod CIDRs into the overlay device (via a
 * permanent neighbour with the overlay MAC, so no ARP ever goes out here).
 * Packets from_pod redirected here already carry their tunnel key and the
 * CP_MARK_ENCAP bit; everything else is node-originated traffic on net 0.
 */
SEC("classifier")
int to_overlay(struct __sk_buff *skb)
{
	const struct cp_params *cfg;
	const struct cp_remote *rem;
	struct cp_lpm_key lk;
	struct cp_pkt pkt;
	__u32 mark = skb->mark;
	__be32 tip;
	int reason;

	if (mark & CP_MARK_ENCAP) {
		skb->mark = mark & ~CP_MARK_ENCAP;
		return CP_PASS;
	}
	switch (cp_parse(skb, &pkt)) {
	case CP_PARSE_IP4:
	case CP_PARSE_IP6:
		break;
	case CP_PARSE_BAD:
		return cp_drop(CP_DROP_MALFORMED);
	default:
		/* the device's own ARP & co: link-scope, never crosses nodes.
		 * Expected noise, so not counted. */
		return TC_ACT_SHOT;
	}
	if (pkt.flags & CP_PKT_V6_KERNEL)
		return TC_ACT_SHOT; /* the device's own RS/MLD/NDP: as above */
	/* 64:ff9b::/96 would find an IPv4 pod's remote: no pod of ours */
	if (pkt.flags & CP_PKT_DST_NAT64)
		return cp_drop(CP_DROP_NO_REMOTE);

	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = CP_NET_DEFAULT;
	lk.addr = pkt.dst;
	rem = bpf_map_lookup_elem(&cp_remotes, &lk);
	if (rem) {
		tip = rem->tunnel_ip;
	} else {
		struct cp_ep_key key;

		/* a reply to a pod the agent has not heard of yet (bpf/learn.h) */
		if (!cp_learned_tunnel(&key, CP_NET_DEFAULT, &pkt.dst, &tip))
			return cp_drop(CP_DROP_NO_REMOTE);
	}

	/* The frame's source MAC is this device's, i.e. the shared overlay MAC,
	 * and the receiving VXLAN device drops frames sourced from its own MAC
	 * as loops. Use a per-node MAC 02:cf:<node IPv4> instead. */
	cfg = cp_get_params();
	if (cfg) {
		__u8 src[ETH_ALEN] = { CP_OVERLAY_MAC0, CP_OVERLAY_MAC_BYTE };

		__builtin_memcpy(&src[2], &cfg->node_ip, 4);
		if (bpf_skb_store_bytes(skb, ETH_ALEN, src, ETH_ALEN, 0) < 0)
			return cp_drop(CP_DROP_MALFORMED);
	}
	/* tc mode: straight to the uplink (bpf/encap.h) */
	if (cfg && (cfg->flags & CP_PARAM_F_TC_TUNNEL) && cfg->uplink_ifindex) {
		reason = cp_encap_tc(skb, CP_VNI_DEFAULT, tip, cfg->node_ip);
		if (!reason)
			return bpf_redirect_neigh(cfg->uplink_ifindex, NULL, 0, 0);
		if (reason != CP_ENCAP_FALLBACK)
			return cp_drop(reason);
	}
	reason = cp_encap_set(skb, CP_NET_DEFAULT, tip, cfg ? cfg->node_ip : 0, 0);
	if (reason)
		return cp_drop(reason);
	return CP_PASS;
}

SEC("classifier")
int to_uplink(struct __sk_buff *skb)
{
	return cp_masq_snat(skb);
}

SEC("classifier")
int from_uplink(struct __sk_buff *skb)
{
	const struct cp_params *cfg = cp_get_params();
	struct cp_pkt pkt;
	int v;

	/* tc mode: the overlay's packets (bpf/encap.h); should the slot be
	 * empty, the VXLAN device takes them */
	if (cfg && (cfg->flags & CP_PARAM_F_TC_TUNNEL)) {
		__be16 proto;
		__be32 sender;
		__u32 vni;

		if (cp_vxlan_rx(skb, cfg->node_ip, &vni, &sender, &proto))
			bpf_tail_call(skb, &cp_progs, CP_PROG_TC_DECAP);
	}
	/* lb: an external backend's reply, an ICMP error about a flow, or a
	 * request for a NodePort, LoadBalancer IP or externalIP (bpf/lb.h) */
	v = cp_parse(skb, &pkt);
	if (v == CP_PARSE_IP4 || v == CP_PARSE_IP6) {
		v = cp_lb_wire_reply(skb, &pkt);
		if (v != CP_LB_MISS)
			return v;
		v = cp_lb_ingress(skb, &pkt, skb->ingress_ifindex, 0);
		if (v != CP_LB_MISS)
			return v;
	}
	return cp_masq_reverse(skb);
}

/* Socket-level load balancing (bpf/service.h). A sock_addr program returns
 * 1 to let the call proceed (with the address as rewritten) and 0 to fail
 * it with EPERM; recvmsg and getpeername must return 1. */
SEC("cgroup/connect4")
int sock_connect4(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_fwd(ctx, 0, 1);
}

SEC("cgroup/connect6")
int sock_connect6(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_fwd(ctx, 1, 1);
}

SEC("cgroup/sendmsg4")
int sock_sendmsg4(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_fwd(ctx, 0, 0);
}

SEC("cgroup/sendmsg6")
int sock_sendmsg6(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_fwd(ctx, 1, 0);
}

SEC("cgroup/recvmsg4")
int sock_recvmsg4(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_rev(ctx, 0);
}

SEC("cgroup/recvmsg6")
int sock_recvmsg6(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_rev(ctx, 1);
}

SEC("cgroup/getpeername4")
int sock_getpeername4(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_rev(ctx, 0);
}

SEC("cgroup/getpeername6")
int sock_getpeername6(struct bpf_sock_addr *ctx)
{
	return cp_sock_xlate_rev(ctx, 1);
}

/* The node's own firewall (bpf/hostfw.h) at --cgroup-root: cgroup_skb
 * programs return 1 to let a packet through, 0 to drop it. */
SEC("cgroup_skb/ingress")
int host_ingress(struct __sk_buff *skb)
{
	return cp_host_check(skb, CP_NP_INGRESS);
}

SEC("cgroup_skb/egress")
int host_egress(struct __sk_buff *skb)
{
	return cp_host_check(skb, CP_NP_EGRESS);
}
