/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rpf.h - reverse-path filtering at the origin veth.
 *
 * A pod may only send with a source address that cp_locals maps to this
 * very host veth. Doing it at the origin is the only place it can be done
 * with certainty: an overlay identity computed by the sender's node from
 * a spoofable source proves nothing (docs/lessons.md #41).
 */
#ifndef CP_RPF_H
#define CP_RPF_H

#include "maps.h"
#include "parse.h"

/*
 * `key` is caller-provided scratch (keeps the hot hook's stack flat).
 * Returns 1 when `pkt->src` belongs to the pod behind `ifindex` on `net`.
 * An IPv6 source inside 64:ff9b::/96 never does: its key is an IPv4
 * address's (common.h), so it would pass as the pod's own IPv4 address.
 */
static __always_inline int cp_rpf_ok(struct cp_ep_key *key, __u32 net,
				     const struct cp_pkt *pkt, __u32 ifindex)
{
	const struct cp_endpoint *ep;

	if (pkt->flags & CP_PKT_SRC_NAT64)
		return 0;
	key->net = net;
	key->addr = pkt->src;
	ep = bpf_map_lookup_elem(&cp_locals, key);
	return ep && ep->ifindex == ifindex;
}

#define IPPROTO_HOPOPTS_ 0
#define ICMPV6_MLD_REPORT_ 131
#define ICMPV6_MLD_DONE_ 132
#define ICMPV6_ROUTER_SOLICIT_ 133
#define ICMPV6_NEIGH_SOLICIT_ 135
#define ICMPV6_NEIGH_ADVERT_ 136
#define ICMPV6_MLD2_REPORT_ 143

/*
 * IPv6 link-scope traffic from a pod (CP_PKT_V6_KERNEL: a link-local or
 * unspecified source, or a multicast or link-local destination) is for its
 * host veth only and the kernel never forwards it. What a pod needs there
 * is neighbour discovery with its gateway fe80::1 (router and neighbour
 * solicitations, neighbour advertisements, DAD from ::) and its MLD
 * listener reports, which carry a hop-by-hop router-alert header. Returns
 * 1 for exactly that: an ND/MLD message to a link-scope destination
 * (ff02::/16 or fe80::/10). Router advertisements and redirects (a pod
 * posing as a router), MLD queries, and anything else (TCP to fe80::1, mDNS,
 * pings to ff02::1, wider multicast scopes) return 0.
 */
static __always_inline int cp_v6_nd_ok(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	struct in6_addr dst;
	__u32 off = pkt->l4_off;
	__u8 proto = pkt->l4proto;
	__u8 type;

	__builtin_memcpy(&dst, &pkt->dst, sizeof(dst));
	if (!ip6_is_link_scope(&dst))
		return 0;
	if (proto == IPPROTO_HOPOPTS_) {
		__u8 hbh[2];

		if (bpf_skb_load_bytes(skb, off, hbh, sizeof(hbh)) < 0)
			return 0;
		proto = hbh[0];
		off += ((__u32)hbh[1] + 1) * 8;
	}
	if (proto != IPPROTO_ICMPV6_)
		return 0;
	if (bpf_skb_load_bytes(skb, off, &type, 1) < 0)
		return 0;
	switch (type) {
	case ICMPV6_ROUTER_SOLICIT_:
	case ICMPV6_NEIGH_SOLICIT_:
	case ICMPV6_NEIGH_ADVERT_:
	case ICMPV6_MLD_REPORT_:
	case ICMPV6_MLD_DONE_:
	case ICMPV6_MLD2_REPORT_:
		return 1;
	default:
		return 0;
	}
}

#endif /* CP_RPF_H */
