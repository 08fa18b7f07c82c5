/* SPDX-License-Identifier: GPL-2.0 */
/*
 * lbmaps.h - the per-packet Service load balancer's flow state (bpf/lb.h),
 * apart so the destination gate (bpf/deliver.h) can reverse the replies of
 * a pod's own per-packet ClusterIP flows (cp_lb_inside_reply) without the
 * rest of lb.h.
 */
#ifndef CP_LBMAPS_H
#define CP_LBMAPS_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "nat.h"
#include "service.h"

#define CP_MAX_LB_CT 131072

enum cp_lb_abi {
	/* cp_lb_val.flags: the client's source was translated to the node. */
	CP_LB_F_SNAT = 0x1,
	/* reverse: the backend has replied */
	CP_LB_F_REPLIED = 0x2,
	/* reverse: a FIN or RST was seen (TCP) */
	CP_LB_F_CLOSING = 0x4,
	/* reverse: a pod's own per-packet ClusterIP flow whose backend is the
	 * pod itself, SNATed to the node; `ifindex` is the pod's host veth */
	CP_LB_F_HAIRPIN = 0x8,
};


/* A per-packet flow. 40 bytes. */
struct cp_lb_val {
	struct addr128 client; /* reverse: the client (restored as destination);
				* forward: the backend's address, to tell a reused id */
	__u32 backend_id;      /* forward: the flow's backend */
	__u32 rev_id;          /* the frontend (cp_svc_revs) */
	__be16 client_port;    /* reverse: the client's port; forward: the backend's */
	__be16 snat_port;      /* the node's port the client became, 0 without SNAT */
	__u32 ifindex;         /* reverse: the uplink the request came in on, 0: overlay;
				* hairpin: the client pod's host veth */
	__u32 flags;           /* CP_LB_F_* */
	__u32 expires_s;       /* reverse, SNATed: when the port may be taken
				* over (CLOCK_MONOTONIC s); 0: never (an older agent's) */
};
CP_ABI_SIZE(struct cp_lb_val, 40);
CP_ABI_OFFSET(struct cp_lb_val, backend_id, 16);
CP_ABI_OFFSET(struct cp_lb_val, rev_id, 20);
CP_ABI_OFFSET(struct cp_lb_val, client_port, 24);
CP_ABI_OFFSET(struct cp_lb_val, snat_port, 26);
CP_ABI_OFFSET(struct cp_lb_val, ifindex, 28);
CP_ABI_OFFSET(struct cp_lb_val, flags, 32);
CP_ABI_OFFSET(struct cp_lb_val, expires_s, 36);

/* Request tuple (client -> frontend) -> the flow. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_LB_CT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_masq_key);
	__type(value, struct cp_lb_val);
} cp_lb_fwd SEC(".maps");

/* Reply tuple as the backend sends it -> the frontend and the client. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_LB_CT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_masq_key);
	__type(value, struct cp_lb_val);
} cp_lb_rev SEC(".maps");

#define CP_MAX_LB_CLIENTS 65536

/* Pods from_pod translated a ClusterIP for, per packet (a client no socket
 * hook saw: a KubeVirt guest), by host veth ifindex & 0xffff -> 1. Only
 * deliveries into those look a reply up (cp_lb_inside_reply), so every
 * other pod's fast path pays one array load. Never cleared: a reused
 * ifindex only costs its new pod those lookups. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CP_MAX_LB_CLIENTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} cp_lb_clients SEC(".maps");

/*
 * Which family of packet the translation handles this one as: 4 for IPv4
 * whose TCP/UDP/SCTP header sits right after a 20-byte header, not a
 * fragment; 6 for IPv6 whose TCP/UDP/SCTP header follows the fixed header
 * (no extension headers, so no fragment either), with global addresses
 * outside 64:ff9b::/96 (whose keys are IPv4's, common.h); 0 for anything
 * else.
 */
static __always_inline int cp_lb_family(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	if (pkt->l4proto != IPPROTO_TCP_ && pkt->l4proto != IPPROTO_UDP_ &&
	    pkt->l4proto != IPPROTO_SCTP_)
		return 0;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return (pkt->flags & CP_PKT_FRAG) || pkt->l4_off != CP_L4_OFF ? 0 : 4;
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return (pkt->flags & (CP_PKT_V6_KERNEL | CP_PKT_SRC_NAT64 | CP_PKT_DST_NAT64)) ||
				       pkt->l4_off != CP_L6_OFF
			       ? 0
			       : 6;
	return 0;
}

/* An IPv4 candidate (cp_lb_family). */
static __always_inline int cp_lb_candidate(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	return cp_lb_family(skb, pkt) == 4;
}

/* Is the pod behind host veth `ifindex` one that cp_lb_request (inside)
 * translated a ClusterIP for? */
static __always_inline int cp_lb_client(__u32 ifindex)
{
	__u32 idx = ifindex & (CP_MAX_LB_CLIENTS - 1);
	__u32 *flag = bpf_map_lookup_elem(&cp_lb_clients, &idx);

	return flag && *flag;
}

/*
 * The frontend of a pod's own per-packet ClusterIP flow (cp_lb_request,
 * inside) whose reply tuple is `k`, or NULL: not such a flow (no entry, a
 * SNATed one, or one delivered to a host veth), or its frontend is gone.
 */
static __always_inline const struct cp_backend *cp_lb_inside_frontend(const struct cp_masq_key *k)
{
	const struct cp_lb_val *v = bpf_map_lookup_elem(&cp_lb_rev, k);
	__u32 rev_id;

	if (!v || (v->flags & CP_LB_F_SNAT) || v->ifindex)
		return NULL;
	rev_id = v->rev_id;
	return bpf_map_lookup_elem(&cp_svc_revs, &rev_id);
}

/*
 * A reply of a pod's own per-packet ClusterIP flow (cp_lb_request, inside),
 * about to enter the client pod: its source back to the frontend. The
 * destination gate calls it for flagged clients only (cp_lb_client).
 * Returns 0 (rewritten, or not such a reply: untouched) or a drop verdict.
 */
static __noinline int cp_lb_inside_reply(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	const struct cp_backend *fe;
	struct cp_l4_layout l = {};
	struct cp_masq_key k;

	if (!cp_lb_candidate(skb, pkt))
		return 0;
	if (cp_nat_tuple(skb, pkt, 0, &k, &l) < 0)
		return 0;
	fe = cp_lb_inside_frontend(&k);
	if (!fe)
		return 0; /* not a pod's own ClusterIP flow, or its frontend is gone */
	if (cp_nat_rewrite(skb, &l, CP_IP4_SADDR_OFF, k.src.w[3], fe->addr.w[3], l.sport_off,
			   k.sport, fe->port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	return 0;
}

/* The tuple of the flow an ICMPv4 error is about, swapped as a reply of
 * it would carry it (cp_icmp_quote_tuple), for an error addressed to the
 * quote's source and quoting TCP, UDP or SCTP. 0, or -1 for anything else. */
static __always_inline int cp_lb_icmp_key(struct __sk_buff *skb, const struct cp_pkt *pkt,
					  struct cp_masq_key *k)
{
	struct cp_icmp_quote q;
	__u32 sport_off;
	__u8 type;

	if (skb->protocol != bpf_htons(ETH_P_IP) || pkt->l4proto != IPPROTO_ICMP_ ||
	    (pkt->flags & CP_PKT_FRAG) || pkt->l4_off != CP_L4_OFF)
		return -1;
	if (bpf_skb_load_bytes(skb, CP_L4_OFF, &type, 1) < 0 || !cp_icmp_is_error(type))
		return -1;
	if (cp_icmp_quote_tuple(skb, &q, k, &sport_off) < 0)
		return -1;
	if (k->proto != IPPROTO_TCP_ && k->proto != IPPROTO_UDP_ && k->proto != IPPROTO_SCTP_)
		return -1;
	/* the error goes to the quote's source, whoever sent it */
	if (!cp_addr_eq(&pkt->dst, &k->dst))
		return -1;
	return 0;
}

/*
 * An ICMPv4 error about a pod's own per-packet ClusterIP flow, about to
 * enter the client pod (a flagged client, as cp_lb_inside_reply). It quotes
 * the translated request (the pod -> the backend), so the quote's tuple
 * swapped is the flow's reply tuple (cp_lb_rev): the quoted destination
 * gets the frontend back, and the outer source too when the backend itself
 * sent it, so that the guest's socket, which talks to the ClusterIP, takes
 * it (a port unreachable, a path MTU). Returns 0 (rewritten, or not such an
 * error: untouched) or a drop verdict.
 */
static __noinline int cp_lb_inside_icmp_error(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	const struct cp_backend *fe;
	struct cp_masq_key k;

	if (cp_lb_icmp_key(skb, pkt, &k) < 0)
		return 0;
	fe = cp_lb_inside_frontend(&k);
	if (!fe)
		return 0; /* not a pod's own ClusterIP flow, or its frontend is gone */

	__be32 backend = k.src.w[3];

	if (cp_icmp_quoted_addr(skb, CP_QIP_DADDR_OFF, backend, fe->addr.w[3]) < 0 ||
	    cp_icmp_word(skb, CP_QL4_OFF + 2, k.sport, fe->port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	if (cp_addr_eq(&pkt->src, &k.src) &&
	    cp_icmp_outer_addr(skb, CP_IP4_SADDR_OFF, backend, fe->addr.w[3]) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	return 0;
}

/* The swapped tuple of the flow an ICMPv6 error is about (cp_lb_icmp_key
 * for IPv6): an error with global addresses outside 64:ff9b::/96,
 * addressed to the quote's source, quoting TCP, UDP or SCTP between such
 * addresses. 0, or -1 for anything else. */
static __always_inline int cp_lb_icmp6_key(struct __sk_buff *skb, const struct cp_pkt *pkt,
					   struct cp_masq_key *k)
{
	struct cp_icmp6_quote q;
	__u32 sport_off;
	__u8 type;

	if (skb->protocol != bpf_htons(ETH_P_IPV6) || pkt->l4proto != IPPROTO_ICMPV6_ ||
	    pkt->l4_off != CP_L6_OFF ||
	    (pkt->flags & (CP_PKT_V6_KERNEL | CP_PKT_SRC_NAT64 | CP_PKT_DST_NAT64)))
		return -1;
	if (bpf_skb_load_bytes(skb, CP_L6_OFF, &type, 1) < 0 || !cp_icmp6_is_error(type))
		return -1;
	if (cp_icmp6_quote_tuple(skb, &q, k, &sport_off) < 0)
		return -1;
	if (k->proto != IPPROTO_TCP_ && k->proto != IPPROTO_UDP_ && k->proto != IPPROTO_SCTP_)
		return -1;
	if (ip6_is_nat64((const struct in6_addr *)&k->src) ||
	    ip6_is_nat64((const struct in6_addr *)&k->dst))
		return -1; /* an IPv4 address's key */
	if (!cp_addr_eq(&pkt->dst, &k->dst))
		return -1;
	return 0;
}

/*
 * cp_lb_inside_reply for IPv6: the reply of a pod's own per-packet
 * ClusterIP flow, its source back to the frontend. A global function, so
 * the verifier checks it once rather than in every program that delivers
 * into a pod (see cp_lb_request4, bpf/lb.h). 0 or a drop verdict.
 */
__noinline int cp_lb_inside_reply6(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	const struct cp_backend *fe;
	struct cp_l4_layout l = {};
	struct cp_masq_key k;

	if (!pkt || cp_lb_family(skb, pkt) != 6)
		return 0;
	if (cp_nat_tuple_at(skb, pkt, 0, 1, CP_L6_OFF, &k, &l) < 0)
		return 0;
	fe = cp_lb_inside_frontend(&k);
	if (!fe)
		return 0; /* not a pod's own ClusterIP flow, or its frontend is gone */
	if (cp_nat_rewrite6(skb, &l, CP_IP6_SADDR_OFF, &k.src, &fe->addr, l.sport_off, k.sport,
			    fe->port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	return 0;
}

/* cp_lb_inside_reply for SCTP of either family (a global function, as
 * above); the caller updates the CRC (cp_sctp_crc). 0 or a drop verdict. */
__noinline int cp_lb_inside_reply_sctp(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	const struct cp_backend *fe;
	struct cp_l4_layout l = {};
	struct cp_masq_key k;
	int v6;

	if (!pkt || pkt->l4proto != IPPROTO_SCTP_)
		return 0;
	v6 = cp_lb_family(skb, pkt) == 6;
	if (!v6 && cp_lb_family(skb, pkt) != 4)
		return 0;
	if (cp_sctp_tuple_at(skb, pkt, v6, v6 ? CP_L6_OFF : CP_L4_OFF, &k, &l) < 0)
		return 0;
	fe = cp_lb_inside_frontend(&k);
	if (!fe)
		return 0; /* not a pod's own ClusterIP flow, or its frontend is gone */
	if (cp_sctp_rewrite(skb, &l, v6, v6 ? CP_IP6_SADDR_OFF : CP_IP4_SADDR_OFF, &k.src,
			    &fe->addr, l.sport_off, k.sport, fe->port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	return 0;
}

/* cp_lb_inside_icmp_error for ICMPv6 (a global function, as above). 0 or
 * a drop verdict. */
__noinline int cp_lb_inside_icmp6_error(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	const struct cp_backend *fe;
	struct cp_masq_key k;

	if (!pkt || cp_lb_icmp6_key(skb, pkt, &k) < 0)
		return 0;
	fe = cp_lb_inside_frontend(&k);
	if (!fe)
		return 0;
	if (cp_icmp6_quoted_addr(skb, CP_QIP6_DADDR_OFF, &k.src, &fe->addr) < 0 ||
	    cp_icmp6_word(skb, CP_QL6_OFF + 2, k.sport, fe->port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	if (cp_addr_eq(&pkt->src, &k.src) &&
	    cp_icmp6_outer_addr(skb, CP_IP6_SADDR_OFF, &k.src, &fe->addr) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	return 0;
}

/* What the destination gate asks for a flagged client (cp_lb_client): the
 * reply of its own per-packet ClusterIP flow, or an ICMP error about one,
 * of either family. 0 (rewritten, or not such a packet) or a drop. */
static __always_inline int cp_lb_inside(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	if (pkt->l4proto == IPPROTO_ICMP_)
		return cp_lb_inside_icmp_error(skb, pkt);
	if (pkt->l4proto == IPPROTO_ICMPV6_)
		return cp_lb_inside_icmp6_error(skb, pkt);
	if (pkt->l4proto == IPPROTO_SCTP_) {
		int v;

		cp_sctp_begin(skb);
		v = cp_lb_inside_reply_sctp(skb, pkt);

		/* the CRC at this depth, not below the gate's frames */
		if (!v && cp_sctp_crc(skb) < 0)
			return cp_drop(CP_DROP_LB_NAT);
		return v;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return cp_lb_inside_reply6(skb, pkt);
	return cp_lb_inside_reply(skb, pkt);
}

#endif /* CP_LBMAPS_H */
