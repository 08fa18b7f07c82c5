/* SPDX-License-Identifier: GPL-2.0 */
/*
 * bridge.h - the dual-address bridge: the node reaches a VPC pod by the
 * pod's fabric (net 0) address, and the pod sees only its own VPC address
 * space.
 *
 * A VPC pod's interface holds only its VPC address. Its fabric address F
 * (a FabricIP claim) is never configured anywhere: the node routes F/32 to
 * the pod's host veth with a permanent neighbour entry (the pod's MAC), so
 * the node's own stack sends to F without ARP, and:
 *
 *   to_pod (egress of the host veth), cp_bridges[{0, F}] hit:
 *     node N:s -> F:d   becomes   169.254.1.1:P -> V:d
 *     (V the pod's VPC address, P a port claimed in cp_bridge_rev, so two
 *     node addresses with the same source port never share one);
 *   from_pod (ingress of the host veth), a VPC port, cp_bridge_rev hit:
 *     pod V:d -> 169.254.1.1:P   becomes   F:d -> N:s
 *     and the kernel takes it (N is this node's own address).
 *
 * ICMP echo uses the identifier as the port; ICMP errors (destination
 * unreachable incl. fragmentation needed, time exceeded) have their quote
 * rewritten both ways (bpf/nat.h, shared with the masquerade).
 *
 * Admission: only what this node's own stack sends (a socket of the node:
 * kubelet probes, node-local agents, hostNetwork pods) is bridged. A packet
 * the kernel forwards to F (another pod, the overlay, the uplink) carries
 * its input device in skb->ingress_ifindex and is dropped (`misdelivered`):
 * net-0 traffic never enters a VPC port. North-south traffic from other
 * nodes comes with Services (a later issue).
 *
 * SecurityGroups (bpf/policy.h) exempt these flows both ways, by where they
 * come from: the gate skips the ingress check for the translated packet,
 * and from_pod reverses the pod's reply before its egress check.
 *
 * IPv6 the same way with fe80::1 (every host veth holds it) as the source
 * the pod sees: the pod answers it from its global VPC address, and
 * from_pod reverses that before its link-scope filter; ICMPv6 errors
 * (destination unreachable, packet too big, time exceeded) are rewritten
 * like ICMPv4's. Not translated for IPv6: extension headers (fragments
 * included), dropped as untranslatable towards the pod; from it, the
 * link-scope filter drops them.
 */
#ifndef CP_BRIDGE_H
#define CP_BRIDGE_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "nat.h"
#include "deliver.h"

/* A VPC pod behind its fabric address (the value of cp_bridges). 24 bytes. */
struct cp_bridge {
	__u32 net;           /* the pod's VPC network (its VNI) */
	__u32 ifindex;       /* its host veth */
	struct addr128 vpc;  /* its VPC address */
};
CP_ABI_SIZE(struct cp_bridge, 24);
CP_ABI_OFFSET(struct cp_bridge, ifindex, 4);
CP_ABI_OFFSET(struct cp_bridge, vpc, 8);

/*
 * Bridge connection key: a wire 5-tuple on a network. Forward (the node's
 * packet before translation): net 0, node -> fabric address. Reverse (the
 * pod's reply after it): the pod's net, VPC address -> 169.254.1.1 with the
 * claimed port; the net keeps two VPCs with the same address apart. ICMP
 * echo: the identifier is the port of the side that chose it. 44 bytes.
 */
struct cp_bridge_key {
	__u32 net;
	struct cp_masq_key t;
};
CP_ABI_SIZE(struct cp_bridge_key, 44);
CP_ABI_ALIGN(struct cp_bridge_key, 4);
CP_ABI_OFFSET(struct cp_bridge_key, t, 4);

/*
 * Forward: addr = the VPC address, port = the claimed port; reverse:
 * addr = the node address, port = its port. Both: the fabric address.
 * 40 bytes.
 */
struct cp_bridge_ct {
	struct addr128 addr;
	struct addr128 fabric;
	__be16 port;
	__u16 pad;
	__u32 flags;         /* reserved, 0 */
};
CP_ABI_SIZE(struct cp_bridge_ct, 40);
CP_ABI_OFFSET(struct cp_bridge_ct, fabric, 16);
CP_ABI_OFFSET(struct cp_bridge_ct, port, 32);
CP_ABI_OFFSET(struct cp_bridge_ct, pad, 34);
CP_ABI_OFFSET(struct cp_bridge_ct, flags, 36);

/*
 * The ports 169.254.1.1 speaks from to a pod (host order, inclusive). The
 * reverse key holds the pod's address and port, so the range is per pod
 * and peer port: 64512 concurrent node flows to one pod port. Below 1024
 * is left out so no pod mistakes the node for a privileged client.
 */
enum cp_bridge_ports {
	CP_BRIDGE_PORT_MIN = 1024,
	CP_BRIDGE_PORT_MAX = 65535,
};

#define CP_MAX_BRIDGES 65536
#define CP_MAX_BRIDGE_CT 16384

/* {0, fabric address} -> the VPC pod behind it. Written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_BRIDGES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_ep_key);
	__type(value, struct cp_bridge);
} cp_bridges SEC(".maps");

/* Bridged flows, forward (the node's tuple -> translation). Datapath. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_BRIDGE_CT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_bridge_key);
	__type(value, struct cp_bridge_ct);
} cp_bridge_fwd SEC(".maps");

/* Bridged flows, reverse (the pod's reply tuple -> node side). Datapath. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_BRIDGE_CT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_bridge_key);
	__type(value, struct cp_bridge_ct);
} cp_bridge_rev SEC(".maps");

/* Not a tc verdict: the packet is not the bridge's, carry on. */
#define CP_BRIDGE_MISS 0x100

/* The pod's gateway, the source it sees the node as: 169.254.1.1 (in the
 * 64:ff9b:: form of every IPv4 key) or fe80::1. */
static __always_inline void cp_bridge_gw(struct addr128 *a, int v6)
{
	if (v6) {
		a->w[0] = bpf_htonl(0xfe800000);
		a->w[1] = 0;
		a->w[2] = 0;
		a->w[3] = bpf_htonl(1);
	} else {
		addr_from_ip4(a, bpf_htonl(CP_GW4));
	}
}

/* Is `pkt` for the pod's gateway: 0 no, 1 169.254.1.1 (IPv4), 2 fe80::1.
 * An IPv6 64:ff9b::169.254.1.1 is flagged and no IPv4 packet. */
static __always_inline int cp_bridge_to_gw(const struct cp_pkt *pkt)
{
	struct addr128 gw;

	cp_bridge_gw(&gw, 0);
	if (cp_addr_eq(&pkt->dst, &gw) && !(pkt->flags & CP_PKT_DST_NAT64))
		return 1;
	cp_bridge_gw(&gw, 1);
	if (cp_addr_eq(&pkt->dst, &gw) && !(pkt->flags & CP_PKT_V6_LL_SRC))
		return 2;
	return 0;
}

/*
 * The port of forward flow `k` (node -> fabric address, translated by
 * bridge `b` to its VPC address) with its reverse entry in place: the one the
 * flow has while its reverse entry still says so, else a new one. `rk` is
 * left as the reverse key. Returns the port (network order) or 0.
 */
static __always_inline __be16 cp_bridge_port(const struct cp_bridge_key *k,
					     const struct cp_bridge *b, int v6,
					     struct cp_bridge_key *rk,
					     struct cp_bridge_ct *v)
{
	const struct cp_bridge_ct *fv = bpf_map_lookup_elem(&cp_bridge_fwd, k);
	const struct cp_bridge_ct *rv;
	__be16 port;

	/* reply tuple: VPC address -> 169.254.1.1 (fe80::1) */
	rk->net = b->net;
	rk->t.src = b->vpc;
	cp_bridge_gw(&rk->t.dst, v6);
	rk->t.sport = k->t.dport;
	rk->t.proto = k->t.proto;
	rk->t.pad[0] = 0;
	rk->t.pad[1] = 0;
	rk->t.pad[2] = 0;

	/* what the reverse path restores */
	v->addr = k->t.src;
	v->fabric = k->t.dst;
	v->port = k->t.sport;
	v->pad = 0;
	v->flags = 0;

	if (fv && cp_addr_eq(&fv->addr, &b->vpc)) {
		port = fv->port;
		rk->t.dport = port;
		rv = bpf_map_lookup_elem(&cp_bridge_rev, rk);
		if (rv && cp_addr_eq(&rv->addr, &v->addr) && rv->port == v->port)
			return port;
		/* the LRU evicted it: re-create it unless another flow took it */
		if (!rv && bpf_map_update_elem(&cp_bridge_rev, rk, v, BPF_NOEXIST) == 0)
			return port;
	}

	port = cp_nat_claim(&cp_bridge_rev, rk, &rk->t.dport, v, cp_nat_hash(&k->t),
			    CP_BRIDGE_PORT_MIN, CP_BRIDGE_PORT_MAX);
	if (port) {
		struct cp_bridge_ct fwd = {};

		fwd.addr = b->vpc;
		fwd.fabric = k->t.dst;
		fwd.port = port;
		if (bpf_map_update_elem(&cp_bridge_fwd, k, &fwd, BPF_ANY) < 0) {
			bpf_map_delete_elem(&cp_bridge_rev, rk);
			return 0;
		}
	}
	return port;
}

/*
 * to_pod, an ICMPv4 error from the node about a flow the pod answered: it
 * quotes the *reversed* reply (F:d -> N:s), whose swapped tuple is the
 * flow's forward key. Outer N -> F becomes 169.254.1.1 -> V, the quote
 * V:d -> 169.254.1.1:P, as the pod sent it.
 */
static __always_inline int cp_bridge_icmp_in(struct __sk_buff *skb, const struct cp_bridge *b,
					     __be32 node, __be32 fabric)
{
	const struct cp_bridge_ct *fv;
	struct cp_bridge_key k;
	struct cp_icmp_quote q;
	__be32 gw = bpf_htonl(CP_GW4);
	__u32 sport_off;

	k.net = CP_NET_DEFAULT;
	if (cp_icmp_quote_tuple(skb, &q, &k.t, &sport_off) < 0 ||
	    k.t.proto == IPPROTO_ICMP_ || k.t.src.w[3] != node || k.t.dst.w[3] != fabric)
		return cp_drop(CP_DROP_BRIDGE_UNTRANSLATABLE);
	fv = bpf_map_lookup_elem(&cp_bridge_fwd, &k);
	if (!fv || fv->addr.w[3] != b->vpc.w[3])
		return cp_drop(CP_DROP_BRIDGE_UNTRANSLATABLE);
	/* the quoted destination port is the node's: the claimed one instead */
	if (cp_icmp_addr(skb, CP_IP4_SADDR_OFF, CP_QIP_DADDR_OFF, node, gw) < 0 ||
	    cp_icmp_addr(skb, CP_IP4_DADDR_OFF, CP_QIP_SADDR_OFF, fabric, b->vpc.w[3]) < 0 ||
	    cp_icmp_word(skb, CP_QL4_OFF + 2, k.t.sport, fv->port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

/* cp_bridge_icmp_in() for ICMPv6: outer N -> F becomes fe80::1 -> V, the
 * quote V:d -> fe80::1:P. */
static __always_inline int cp_bridge_icmp6_in(struct __sk_buff *skb, const struct cp_bridge *b,
					      const struct cp_pkt *pkt)
{
	const struct cp_bridge_ct *fv;
	struct cp_icmp6_quote q;
	struct cp_bridge_key k;
	struct addr128 gw;
	__be16 port;
	__u32 sport_off;

	k.net = CP_NET_DEFAULT;
	if (cp_icmp6_quote_tuple(skb, &q, &k.t, &sport_off) < 0 ||
	    k.t.proto == IPPROTO_ICMPV6_ || !cp_addr_eq(&k.t.src, &pkt->src) ||
	    !cp_addr_eq(&k.t.dst, &pkt->dst))
		return cp_drop(CP_DROP_BRIDGE_UNTRANSLATABLE);
	fv = bpf_map_lookup_elem(&cp_bridge_fwd, &k);
	if (!fv || !cp_addr_eq(&fv->addr, &b->vpc))
		return cp_drop(CP_DROP_BRIDGE_UNTRANSLATABLE);
	port = fv->port;
	cp_bridge_gw(&gw, 1);
	if (cp_icmp6_addr(skb, CP_IP6_SADDR_OFF, CP_QIP6_DADDR_OFF, &k.t.src, &gw) < 0 ||
	    cp_icmp6_addr(skb, CP_IP6_DADDR_OFF, CP_QIP6_SADDR_OFF, &k.t.dst, &b->vpc) < 0 ||
	    cp_icmp6_word(skb, CP_QL6_OFF + 2, k.t.sport, port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

/* cp_bridge_icmp_out() for ICMPv6: outer V -> fe80::1 becomes F -> N, the
 * quote N:s -> F:d. */
static __always_inline int cp_bridge_icmp6_out(struct __sk_buff *skb, __u32 net,
					       const struct cp_pkt *pkt)
{
	const struct cp_bridge_ct *rv;
	struct cp_icmp6_quote q;
	struct cp_bridge_key k;
	struct addr128 node, fabric;
	__be16 node_port;
	__u32 sport_off;

	k.net = net;
	if (cp_icmp6_quote_tuple(skb, &q, &k.t, &sport_off) < 0 ||
	    !cp_addr_eq(&k.t.src, &pkt->src))
		return CP_BRIDGE_MISS;
	rv = bpf_map_lookup_elem(&cp_bridge_rev, &k);
	if (!rv)
		return CP_BRIDGE_MISS;
	node = rv->addr;
	fabric = rv->fabric;
	node_port = rv->port;
	if (cp_icmp6_addr(skb, CP_IP6_SADDR_OFF, CP_QIP6_DADDR_OFF, &k.t.src, &fabric) < 0 ||
	    cp_icmp6_addr(skb, CP_IP6_DADDR_OFF, CP_QIP6_SADDR_OFF, &k.t.dst, &node) < 0 ||
	    cp_icmp6_word(skb, sport_off, k.t.dport, node_port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

/*
 * to_pod: the node's packet for a fabric address (`v6`: an IPv6 packet).
 * Returns CP_BRIDGE_MISS if `pkt->dst` is no bridged fabric address, else
 * the tc verdict. `key` is scratch.
 */
/* Not inlined: its frame stays off the SecurityGroup call chain of to_pod
 * (BPF allows 512 bytes of stack for a whole chain). */
static __noinline int cp_bridge_to_pod(struct __sk_buff *skb, const struct cp_pkt *pkt,
					    int v6, __u32 ifindex, struct cp_ep_key *key)
{
	struct cp_l4_layout l = {};
	struct cp_bridge_key k, rk;
	const struct cp_bridge *b;
	struct cp_bridge_ct v;
	struct addr128 gw;
	__be16 port;
	int err;

	/* an IPv6 64:ff9b:: destination would find an IPv4 key */
	if (pkt->flags & CP_PKT_DST_NAT64)
		return CP_BRIDGE_MISS;
	key->net = CP_NET_DEFAULT;
	key->addr = pkt->dst;
	b = bpf_map_lookup_elem(&cp_bridges, key);
	if (!b)
		return CP_BRIDGE_MISS;
	/* Only the node's own stack: a forwarded packet (another pod, the
	 * overlay, the uplink) has an input device. Net 0 never enters a VPC. */
	if (skb->ingress_ifindex != 0 || b->ifindex != ifindex)
		return cp_drop(CP_DROP_MISDELIVERED);
	/* the translated packet must pass the gate of the VPC port (not its
	 * SecurityGroups: the node's own probes are exempt, bpf/policy.h) */
	{
		int gate = cp_dst_gate(skb, ifindex, pkt, &b->vpc, b->net, NULL, key,
				      CP_GATE_POLICY_NONE);

		if (gate != CP_GATE_ADMIT)
			return cp_drop_net(skb, b->net, cp_gate_reason(gate));
	}

	k.net = CP_NET_DEFAULT;
	if (v6) {
		if (pkt->l4proto == IPPROTO_ICMPV6_) {
			__u8 type;

			if (bpf_skb_load_bytes(skb, CP_L6_OFF, &type, 1) < 0)
				return cp_drop(CP_DROP_MALFORMED);
			if (cp_icmp6_is_error(type))
				return cp_bridge_icmp6_in(skb, b, pkt);
		}
		/* extension headers (fragments included) are not translated:
		 * the tuple refuses them */
		err = cp_nat_tuple_at(skb, pkt, 0, 1, CP_L6_OFF, &k.t, &l);
	} else {
		if ((pkt->flags & CP_PKT_FRAG) || pkt->l4_off != CP_L4_OFF)
			return cp_drop(CP_DROP_BRIDGE_UNTRANSLATABLE);
		if (pkt->l4proto == IPPROTO_ICMP_) {
			__u8 type;

			if (bpf_skb_load_bytes(skb, CP_L4_OFF, &type, 1) < 0)
				return cp_drop(CP_DROP_MALFORMED);
			if (cp_icmp_is_error(type))
				return cp_bridge_icmp_in(skb, b, pkt->src.w[3], pkt->dst.w[3]);
		}
		err = cp_nat_tuple(skb, pkt, 0, &k.t, &l);
	}
	if (err == CP_NAT_TRUNCATED)
		return cp_drop(CP_DROP_MALFORMED);
	if (err < 0)
		return cp_drop(CP_DROP_BRIDGE_UNTRANSLATABLE);

	port = cp_bridge_port(&k, b, v6, &rk, &v);
	if (!port)
		return cp_drop(CP_DROP_BRIDGE_NO_PORT);
	/* destination fabric -> VPC address, then source node:s -> gateway:P */
	cp_bridge_gw(&gw, v6);
	if (v6) {
		if (cp_nat_rewrite6(skb, &l, CP_IP6_DADDR_OFF, &k.t.dst, &b->vpc,
				    l.dport_off, k.t.dport, k.t.dport) < 0 ||
		    cp_nat_rewrite6(skb, &l, CP_IP6_SADDR_OFF, &k.t.src, &gw,
				    l.sport_off, k.t.sport, port) < 0)
			return cp_drop(CP_DROP_MASQ_REWRITE);
		return CP_PASS;
	}
	if (cp_nat_rewrite(skb, &l, CP_IP4_DADDR_OFF, k.t.dst.w[3], b->vpc.w[3],
			   l.dport_off, k.t.dport, k.t.dport) < 0 ||
	    cp_nat_rewrite(skb, &l, CP_IP4_SADDR_OFF, k.t.src.w[3], gw.w[3],
			   l.sport_off, k.t.sport, port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

/*
 * from_pod, a VPC pod's ICMPv4 error to 169.254.1.1 about a bridged packet:
 * it quotes 169.254.1.1:P -> V:d, whose swapped tuple is the reverse key.
 * Outer V -> 169.254.1.1 becomes F -> N, the quote N:s -> F:d.
 */
static __always_inline int cp_bridge_icmp_out(struct __sk_buff *skb, __u32 net, __be32 vpc)
{
	const struct cp_bridge_ct *rv;
	struct cp_bridge_key k;
	struct cp_icmp_quote q;
	__be32 gw = bpf_htonl(CP_GW4);
	__u32 sport_off;

	k.net = net;
	if (cp_icmp_quote_tuple(skb, &q, &k.t, &sport_off) < 0 || k.t.src.w[3] != vpc)
		return CP_BRIDGE_MISS;
	rv = bpf_map_lookup_elem(&cp_bridge_rev, &k);
	if (!rv)
		return CP_BRIDGE_MISS;

	__be32 node = rv->addr.w[3], fabric = rv->fabric.w[3];
	__be16 node_port = rv->port;

	if (cp_icmp_addr(skb, CP_IP4_SADDR_OFF, CP_QIP_DADDR_OFF, vpc, fabric) < 0 ||
	    cp_icmp_addr(skb, CP_IP4_DADDR_OFF, CP_QIP_SADDR_OFF, gw, node) < 0 ||
	    cp_icmp_word(skb, sport_off, k.t.dport, node_port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

/*
 * from_pod, after RPF and before the SecurityGroup egress check (the node's
 * flows are exempt both ways), for a VPC port (`net` != 0): a reply to the
 * pod's gateway (169.254.1.1, fe80::1) of a bridged flow goes back to the
 * node as from the fabric address. Returns CP_BRIDGE_MISS if the packet is no such
 * reply (the reverse entry is authoritative: without one nothing is
 * rewritten), else the tc verdict: CP_PASS, the kernel delivers it to the
 * node's socket.
 */
static __always_inline int cp_bridge_from_pod(struct __sk_buff *skb, const struct cp_pkt *pkt,
					      __u32 net)
{
	const struct cp_bridge_ct *rv;
	struct cp_l4_layout l = {};
	struct cp_bridge_key k;
	struct addr128 node, fabric;
	__be16 node_port;
	int gw = cp_bridge_to_gw(pkt);

	if (!gw)
		return CP_BRIDGE_MISS;
	k.net = net;
	if (gw == 2) {
		if (pkt->l4_off != CP_L6_OFF)
			return CP_BRIDGE_MISS;
		if (pkt->l4proto == IPPROTO_ICMPV6_) {
			__u8 type;

			if (bpf_skb_load_bytes(skb, CP_L6_OFF, &type, 1) < 0)
				return CP_BRIDGE_MISS;
			if (cp_icmp6_is_error(type))
				return cp_bridge_icmp6_out(skb, net, pkt);
		}
		if (cp_nat_tuple_at(skb, pkt, 1, 1, CP_L6_OFF, &k.t, &l) < 0)
			return CP_BRIDGE_MISS;
	} else {
		if ((pkt->flags & CP_PKT_FRAG) || pkt->l4_off != CP_L4_OFF)
			return CP_BRIDGE_MISS;
		if (pkt->l4proto == IPPROTO_ICMP_) {
			__u8 type;

			if (bpf_skb_load_bytes(skb, CP_L4_OFF, &type, 1) < 0)
				return CP_BRIDGE_MISS;
			if (cp_icmp_is_error(type))
				return cp_bridge_icmp_out(skb, net, pkt->src.w[3]);
		}
		if (cp_nat_tuple(skb, pkt, 1, &k.t, &l) < 0)
			return CP_BRIDGE_MISS;
	}
	rv = bpf_map_lookup_elem(&cp_bridge_rev, &k);
	if (!rv)
		return CP_BRIDGE_MISS;
	node = rv->addr;
	fabric = rv->fabric;
	node_port = rv->port;

	/* source VPC address -> fabric, destination gateway:P -> node:s */
	if (gw == 2) {
		if (cp_nat_rewrite6(skb, &l, CP_IP6_SADDR_OFF, &k.t.src, &fabric,
				    l.sport_off, k.t.sport, k.t.sport) < 0 ||
		    cp_nat_rewrite6(skb, &l, CP_IP6_DADDR_OFF, &k.t.dst, &node,
				    l.dport_off, k.t.dport, node_port) < 0)
			return cp_drop(CP_DROP_MASQ_REWRITE);
		return CP_PASS;
	}
	if (cp_nat_rewrite(skb, &l, CP_IP4_SADDR_OFF, k.t.src.w[3], fabric.w[3],
			   l.sport_off, k.t.sport, k.t.sport) < 0 ||
	    cp_nat_rewrite(skb, &l, CP_IP4_DADDR_OFF, k.t.dst.w[3], node.w[3],
			   l.dport_off, k.t.dport, node_port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

#endif /* CP_BRIDGE_H */
