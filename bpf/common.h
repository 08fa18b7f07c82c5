/* SPDX-License-Identifier: GPL-2.0 */
/*
 * common.h - constants and the family-neutral address type shared by every
 * cozyplane program.
 *
 * Every address the datapath keys on is a 16-byte addr128 in network byte
 * order. IPv4 is stored in its RFC 6052 form 64:ff9b::a.b.c.d (never
 * ::ffff:a.b.c.d) so that IPv6 and a future NAT64/SIIT translator slot in
 * without changing any map ABI.
 */
#ifndef CP_COMMON_H
#define CP_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* tc verdicts: these are #defines in uapi pkt_cls.h, which vmlinux.h lacks. */
#define TC_ACT_UNSPEC (-1)
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define TC_ACT_REDIRECT 7

/*
 * "Pass the packet on". On tcx, TC_ACT_OK (TCX_PASS) ends the whole tcx
 * chain and skips every later program and legacy filter; TCX_NEXT (-1)
 * lets the next program decide and otherwise behaves like TC_ACT_OK.
 * cozyplane always hands packets on with CP_PASS so it chains politely.
 */
#define CP_PASS TC_ACT_UNSPEC

#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_ARP 0x0806
#define ETH_P_IPV6 0x86DD

#define IPPROTO_ICMP_ 1
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define IPPROTO_ICMPV6_ 58

#define ICMP_ECHOREPLY_ 0
#define ICMP_ECHO_ 8

#define IP_MF_ 0x2000
#define IP_OFFSET_ 0x1FFF

/*
 * Constants userspace mirrors (crates/datapath/src/abi.rs) are enumerators,
 * not #defines: a #define leaves no trace in the compiled object, an enum
 * is recorded in its BTF (bpf/abi.h anchors every such enum), so an
 * unprivileged test checks the Rust mirror against the object.
 */
enum cp_abi_common {
	/* Network id of the default (system) pod network. */
	CP_NET_DEFAULT = 0,
	/* VXLAN/Geneve VNI that carries net 0 between nodes. */
	CP_VNI_DEFAULT = 1,
	/*
	 * Every node's overlay device carries the MAC 02:cf:cf:cf:cf:cf and
	 * the encap path rewrites the inner destination MAC to it, so
	 * decapsulated frames are PACKET_HOST on the receiver (a foreign MAC
	 * would make them PACKET_OTHERHOST and the kernel would drop them
	 * instead of routing).
	 */
	CP_OVERLAY_MAC0 = 0x02,
	CP_OVERLAY_MAC_BYTE = 0xcf,
	/* On-link IPv4 gateway the pod routes through (answered by the host
	 * veth): 169.254.1.1, host order. */
	CP_GW4 = 0xa9fe0101,
	/* Bits of a scoped LPM key (struct cp_lpm_key) before the address:
	 * the network id, always fully specified. */
	CP_LPM_NET_BITS = 32,
	/* UDP port of the overlay (the VXLAN device's dstport). Pod traffic
	 * to it is only ever delivered to pods (cozyplane.bpf.c, masq.h). */
	CP_VXLAN_PORT = 4789,
};

/* TTL of the outer (underlay) header. */
#define CP_TUNNEL_TTL 64

/*
 * Compile-time layout checks for the structs userspace mirrors byte for
 * byte (crates/datapath/src/abi.rs) and pinned maps keep across agent
 * restarts: a drifted layout fails the clang build, not a later run.
 */
#define CP_ABI_SIZE(type, size)                                             \
	_Static_assert(sizeof(type) == (size),                              \
		       "map ABI: sizeof(" #type ") must be " #size)
#define CP_ABI_OFFSET(type, field, off)                                     \
	_Static_assert(__builtin_offsetof(type, field) == (off),            \
		       "map ABI: offsetof(" #type ", " #field ") must be " #off)
#define CP_ABI_ALIGN(type, align)                                           \
	_Static_assert(_Alignof(type) == (align),                           \
		       "map ABI: " #type " must be " #align "-byte aligned")

/* A 128-bit address, network byte order. 16 bytes, 4-byte aligned. */
struct addr128 {
	__u32 w[4];
};
CP_ABI_SIZE(struct addr128, 16);
CP_ABI_ALIGN(struct addr128, 4);

/* 64:ff9b::/96 prefix in network order, word by word. */
#define CP_NAT64_W0 bpf_htonl(0x0064ff9b)

/* Are `a` and `b` the same address? */
static __always_inline int cp_addr_eq(const struct addr128 *a, const struct addr128 *b)
{
	return ((a->w[0] ^ b->w[0]) | (a->w[1] ^ b->w[1]) | (a->w[2] ^ b->w[2]) |
		(a->w[3] ^ b->w[3])) == 0;
}

/* Store IPv4 address `ip4` (network order) as 64:ff9b::a.b.c.d. */
static __always_inline void addr_from_ip4(struct addr128 *a, __be32 ip4)
{
	a->w[0] = CP_NAT64_W0;
	a->w[1] = 0;
	a->w[2] = 0;
	a->w[3] = ip4;
}

static __always_inline void addr_from_ip6(struct addr128 *a,
					  const struct in6_addr *ip6)
{
	a->w[0] = ip6->in6_u.u6_addr32[0];
	a->w[1] = ip6->in6_u.u6_addr32[1];
	a->w[2] = ip6->in6_u.u6_addr32[2];
	a->w[3] = ip6->in6_u.u6_addr32[3];
}

/* fe80::/10: link-local, used by NDP; the kernel handles it. */
static __always_inline int ip6_is_link_local(const struct in6_addr *a)
{
	return (a->in6_u.u6_addr8[0] == 0xfe) &&
	       ((a->in6_u.u6_addr8[1] & 0xc0) == 0x80);
}

static __always_inline int ip6_is_multicast(const struct in6_addr *a)
{
	return a->in6_u.u6_addr8[0] == 0xff;
}

/* 64:ff9b::/96, where IPv4 keys live (addr_from_ip4) */
static __always_inline int ip6_is_nat64(const struct in6_addr *a)
{
	return a->in6_u.u6_addr32[0] == CP_NAT64_W0 && a->in6_u.u6_addr32[1] == 0 &&
	       a->in6_u.u6_addr32[2] == 0;
}

/* ff02::/16 (link-local scope multicast, any flags) or fe80::/10 */
static __always_inline int ip6_is_link_scope(const struct in6_addr *a)
{
	if (a->in6_u.u6_addr8[0] == 0xff)
		return (a->in6_u.u6_addr8[1] & 0x0f) == 0x02;
	return ip6_is_link_local(a);
}

static __always_inline int ip6_is_unspecified(const struct in6_addr *a)
{
	return (a->in6_u.u6_addr32[0] | a->in6_u.u6_addr32[1] |
		a->in6_u.u6_addr32[2] | a->in6_u.u6_addr32[3]) == 0;
}

#endif /* CP_COMMON_H */
