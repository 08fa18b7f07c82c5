/* SPDX-License-Identifier: GPL-2.0 */
/*
 * parse.h - Ethernet/IPv4/IPv6 parsing into a small family-neutral struct.
 *
 * The struct is deliberately tiny (40 bytes) because it lives on the stack
 * of the hottest hook; the 512-byte verifier stack limit dominates the
 * design (docs/lessons.md #19). Only the fields the programs need are kept;
 * code that rewrites IPv4 headers re-reads them at the known offsets.
 */
#ifndef CP_PARSE_H
#define CP_PARSE_H

#include "common.h"

enum cp_parse_result {
	CP_PARSE_BAD = 0,   /* truncated or invalid */
	CP_PARSE_IP4 = 1,
	CP_PARSE_IP6 = 2,
	CP_PARSE_ARP = 3,
	CP_PARSE_OTHER = 4, /* some other ethertype */
};

#define CP_PKT_FRAG 0x01         /* IPv4 fragment (non-first or MF set) */
#define CP_PKT_V6_KERNEL 0x02    /* IPv6 link scope: link-local/unspecified source, or a
				  * multicast or link-local destination (NDP & co) */
#define CP_PKT_V6_LL_SRC 0x04    /* IPv6 link-local or unspecified source */
#define CP_PKT_SRC_NAT64 0x08    /* IPv6 source inside 64:ff9b::/96: aliases an IPv4 key */
#define CP_PKT_DST_NAT64 0x10    /* IPv6 destination inside 64:ff9b::/96: likewise */
#define CP_PKT_LATER_FRAG 0x20   /* IPv4 fragment with offset > 0: no L4 header */

struct cp_pkt {
	struct addr128 src;
	struct addr128 dst;
	__u32 l4_off;   /* offset of the L4 header from the frame start */
	__u8 l4proto;
	__u8 flags;
	__u16 pad;
};

#define CP_ETH_HLEN 14
#define CP_IP4_OFF CP_ETH_HLEN

static __always_inline int cp_parse(struct __sk_buff *skb, struct cp_pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return CP_PARSE_BAD;

	__u16 proto = bpf_ntohs(eth->h_proto);

	if (proto == ETH_P_IP) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > data_end)
			return CP_PARSE_BAD;
		if (ip->version != 4 || ip->ihl < 5)
			return CP_PARSE_BAD;
		addr_from_ip4(&p->src, ip->saddr);
		addr_from_ip4(&p->dst, ip->daddr);
		p->l4_off = CP_ETH_HLEN + ip->ihl * 4;
		p->l4proto = ip->protocol;
		p->flags = (ip->frag_off & bpf_htons(IP_MF_ | IP_OFFSET_)) ? CP_PKT_FRAG : 0;
		if (ip->frag_off & bpf_htons(IP_OFFSET_))
			p->flags |= CP_PKT_LATER_FRAG;
		p->pad = 0;
		return CP_PARSE_IP4;
	}
	if (proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return CP_PARSE_BAD;
		if (ip6->version != 6)
			return CP_PARSE_BAD;
		addr_from_ip6(&p->src, &ip6->saddr);
		addr_from_ip6(&p->dst, &ip6->daddr);
		p->l4_off = CP_ETH_HLEN + sizeof(struct ipv6hdr);
		p->l4proto = ip6->nexthdr;
		p->flags = 0;
		if (ip6_is_link_local(&ip6->saddr) || ip6_is_unspecified(&ip6->saddr))
			p->flags |= CP_PKT_V6_KERNEL | CP_PKT_V6_LL_SRC;
		if (ip6_is_multicast(&ip6->daddr) || ip6_is_link_local(&ip6->daddr))
			p->flags |= CP_PKT_V6_KERNEL;
		/* An IPv6 address in the RFC 6052 prefix has the very key of an
		 * IPv4 address (common.h): flagged, so no lookup takes one for
		 * the other (bpf/rpf.h, cozyplane.bpf.c). */
		if (ip6_is_nat64(&ip6->saddr))
			p->flags |= CP_PKT_SRC_NAT64;
		if (ip6_is_nat64(&ip6->daddr))
			p->flags |= CP_PKT_DST_NAT64;
		p->pad = 0;
		return CP_PARSE_IP6;
	}
	if (proto == ETH_P_ARP)
		return CP_PARSE_ARP;
	return CP_PARSE_OTHER;
}

/* Rewrite the Ethernet destination MAC (offset 0). */
static __always_inline int cp_set_dst_mac(struct __sk_buff *skb, const __u8 *mac)
{
	return bpf_skb_store_bytes(skb, 0, mac, ETH_ALEN, 0);
}

#endif /* CP_PARSE_H */
