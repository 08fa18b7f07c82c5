/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nat.h - the address/port translation machinery shared by the uplink
 * masquerade (masq.h) and the dual-address bridge (bridge.h): the tuple of
 * a translatable IPv4 packet and where its port and checksum sit, the
 * incremental rewrite of an address and a port, the port allocator over a
 * reverse connection table, and the rewriting of ICMP errors (their quote).
 *
 * Each user keeps its own connection tables and policy (which packets,
 * which port range); only the mechanics live here.
 */
#ifndef CP_NAT_H
#define CP_NAT_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "ct.h" /* CP_TCP_* */

/* ports probed (hashed start, then linearly) before a flow gets none */
#define CP_NAT_TRIES 16

#define CP_IP4_CSUM_OFF (CP_IP4_OFF + offsetof(struct iphdr, check))
#define CP_IP4_SADDR_OFF (CP_IP4_OFF + offsetof(struct iphdr, saddr))
#define CP_IP4_DADDR_OFF (CP_IP4_OFF + offsetof(struct iphdr, daddr))
#define CP_L4_OFF (CP_IP4_OFF + sizeof(struct iphdr))

#define ICMP_DEST_UNREACH_ 3
#define ICMP_TIME_EXCEEDED_ 11

/* Where the translated port and the L4 checksum sit, per protocol. */
struct cp_l4_layout {
	__u32 csum_off;   /* absolute offset of the L4 checksum (SCTP: its CRC32c) */
	__u32 sport_off;  /* absolute offset of the source port / echo id */
	__u32 dport_off;  /* absolute offset of the destination port / echo id */
	__u32 csum_flags; /* extra flags for bpf_l4_csum_replace; SCTP: CP_L4_SCTP | CRC length */
	int pseudo;       /* L4 checksum covers the IP pseudo header */
};

/* csum_flags of an SCTP layout (cp_sctp_tuple_at): no Internet checksum,
 * so no helper flags; this bit and, below it, the bytes its CRC32c covers.
 * Kept in the flags, not a field of its own, so that no frame grows. */
#define CP_L4_SCTP (1u << 31)
#define CP_L4_SCTP_LEN(l) ((l)->csum_flags & 0xffff)

/* SCTP's common header: ports, verification tag, CRC32c (RFC 9260 3.1) */
#define CP_SCTP_HLEN 12
#define CP_SCTP_CRC_OFF 8
/* skb->cb[] words of a pending SCTP CRC update (cp_sctp_port) */
#define CP_SCTP_CB_MARK 0x53435450u /* "SCTP" */
#define CP_SCTP_CB_MARK_IDX 4
#define CP_SCTP_CB_PORTS_IDX 3
#define CP_SCTP_CB_AT_IDX 2 /* the SCTP header's offset, << 16 | the CRC's length */
#define CP_IP4_TOTLEN_OFF (CP_IP4_OFF + offsetof(struct iphdr, tot_len))
#define CP_IP6_PLEN_OFF (CP_IP4_OFF + offsetof(struct ipv6hdr, payload_len))

/* cp_nat_tuple() failures */
#define CP_NAT_UNSUPPORTED (-1) /* a protocol or ICMP type not translated */
#define CP_NAT_TRUNCATED (-2)   /* the L4 header is not all there */

/* IPv6: fixed header only (an extension header is no L4 we translate). */
#define CP_IP6_SADDR_OFF (CP_IP4_OFF + offsetof(struct ipv6hdr, saddr))
#define CP_IP6_DADDR_OFF (CP_IP4_OFF + offsetof(struct ipv6hdr, daddr))
#define CP_L6_OFF (CP_IP4_OFF + sizeof(struct ipv6hdr))

#define ICMPV6_ECHO_REQUEST_ 128
#define ICMPV6_ECHO_REPLY_ 129

/*
 * Fill `k` with the tuple of a packet whose L4 header is at `l4_off` (IPv4
 * with a 20-byte header, `v6` = 0; or IPv6 without extension headers,
 * `v6` = 1) and the layout to rewrite it. ICMP: only echo (`reply` selects
 * reply vs request); the identifier is the "port" of the side that chose it
 * (the source of a request, the destination of a reply), the other side
 * has 0. Returns 0 if the packet can be translated, else
 * CP_NAT_UNSUPPORTED or CP_NAT_TRUNCATED.
 */
static __always_inline int cp_nat_tuple_at(struct __sk_buff *skb, const struct cp_pkt *pkt,
					   int reply, int v6, __u32 l4_off,
					   struct cp_masq_key *k, struct cp_l4_layout *l)
{
	__be16 ports[2];
	__u8 icmp = v6 ? IPPROTO_ICMPV6_ : IPPROTO_ICMP_;

	k->src = pkt->src;
	k->dst = pkt->dst;
	k->proto = pkt->l4proto;
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;

	if (pkt->l4proto == IPPROTO_TCP_ || pkt->l4proto == IPPROTO_UDP_) {
		if (bpf_skb_load_bytes(skb, l4_off, ports, sizeof(ports)) < 0)
			return CP_NAT_TRUNCATED;
		k->sport = ports[0];
		k->dport = ports[1];
		l->sport_off = l4_off;
		l->dport_off = l4_off + 2;
		l->pseudo = 1;
		if (pkt->l4proto == IPPROTO_TCP_) {
			l->csum_off = l4_off + offsetof(struct tcphdr, check);
			l->csum_flags = 0;
		} else {
			l->csum_off = l4_off + offsetof(struct udphdr, check);
			/* a zero UDP checksum means "none" and must stay zero */
			l->csum_flags = BPF_F_MARK_MANGLED_0;
		}
		return 0;
	}
	if (pkt->l4proto == icmp) {
		__u8 type, want;
		__be16 id;

		if (v6)
			want = reply ? ICMPV6_ECHO_REPLY_ : ICMPV6_ECHO_REQUEST_;
		else
			want = reply ? ICMP_ECHOREPLY_ : ICMP_ECHO_;
		if (bpf_skb_load_bytes(skb, l4_off, &type, 1) < 0)
			return CP_NAT_TRUNCATED;
		if (type != want)
			return CP_NAT_UNSUPPORTED;
		if (bpf_skb_load_bytes(skb, l4_off + 4, &id, 2) < 0)
			return CP_NAT_TRUNCATED;
		k->sport = reply ? 0 : id;
		k->dport = reply ? id : 0;
		l->csum_off = l4_off + offsetof(struct icmphdr, checksum);
		l->sport_off = l4_off + 4;
		l->dport_off = l4_off + 4;
		l->csum_flags = 0;
		l->pseudo = v6; /* ICMPv6 has a pseudo header, ICMPv4 none */
		return 0;
	}
	return CP_NAT_UNSUPPORTED;
}

/*
 * cp_nat_tuple_at() for SCTP: the ports as TCP's, the CRC32c and the
 * length it covers (the IP payload's, not the frame's, which may carry an
 * Ethernet trailer). Apart from cp_nat_tuple_at() so that only the
 * per-packet load balancer, in global functions, walks it (the verifier
 * would walk it again in every caller of the TCP/UDP tuple). 0 or
 * CP_NAT_TRUNCATED.
 */
static __always_inline int cp_sctp_tuple_at(struct __sk_buff *skb, const struct cp_pkt *pkt,
					    int v6, __u32 l4_off, struct cp_masq_key *k,
					    struct cp_l4_layout *l)
{
	__be16 ports[2];
	__u32 crc_len;

	/* the length read into the ports' place keeps callers' frames */
	if (bpf_skb_load_bytes(skb, v6 ? CP_IP6_PLEN_OFF : CP_IP4_TOTLEN_OFF, ports,
			       sizeof(ports[0])) < 0)
		return CP_NAT_TRUNCATED;
	crc_len = bpf_ntohs(ports[0]);
	if (!v6)
		crc_len -= l4_off - CP_IP4_OFF; /* wraps if shorter: caught below */
	if (crc_len < CP_SCTP_HLEN || crc_len > 0xffff || l4_off + crc_len > skb->len)
		return CP_NAT_TRUNCATED;
	if (bpf_skb_load_bytes(skb, l4_off, ports, sizeof(ports)) < 0)
		return CP_NAT_TRUNCATED;
	k->src = pkt->src;
	k->dst = pkt->dst;
	k->proto = IPPROTO_SCTP_;
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;
	k->sport = ports[0];
	k->dport = ports[1];
	l->sport_off = l4_off;
	l->dport_off = l4_off + 2;
	l->csum_off = l4_off + CP_SCTP_CRC_OFF;
	l->csum_flags = CP_L4_SCTP | crc_len;
	l->pseudo = 0; /* no pseudo header: addresses change nothing */
	return 0;
}

/*
 * SCTP's CRC32c (RFC 9260 appendix B) changed in place. CRC32c is linear
 * over GF(2): for two packets of one length, crc(A) ^ crc(B) is the CRC,
 * without initial value or final inversion, of A ^ B. A translation
 * changes the four bytes of the ports, so the new CRC is the old one XOR
 * the register after those four bytes' change followed by the zeros up to
 * the end of what the CRC covers. Running the zeros through byte by byte would cost a packet
 * up to 64 KiB of steps; multiplying by x^(8n) modulo the polynomial costs
 * one product by x^(8 * 2^i) per set bit i of n. Values are in the CRC's
 * reflected form (x^0 is bit 31). Everything is unrolled and branch-free:
 * the verifier walks straight code once (a loop it would walk per
 * iteration, and a select, which BPF can only branch for, both ways).
 */
#define CP_CRC32C_POLY 0x82f63b78u

/* x^(8 * 2^i) modulo the polynomial, i = 0..15 (x^8, x^16, x^32, ...);
 * the kernel tests check rewritten CRCs against a full computation. */
#define CP_CRC32C_X8_POW2                                                                    \
	{ 0x00800000u, 0x00008000u, 0x82f63b78u, 0x6ea2d55cu, 0x18b8ea18u, 0x510ac59au,      \
	  0xb82be955u, 0xb8fdb1e7u, 0x88e56f72u, 0x74c360a4u, 0xe4172b16u, 0x0d65762au,      \
	  0x35d73a62u, 0x28461564u, 0xbf455269u, 0xe2ea32dcu }

/* `b` times x: one step of the register. The low bit picks the polynomial
 * by a product, hidden from the compiler: it would make a mask by shifts
 * (x << 31 s>> 31), and the verifier splits its states on each such mask,
 * 2^n of them over n steps. */
static __always_inline __u32 cp_crc32c_x(__u32 b)
{
	__u32 low = b & 1;

	asm volatile("" : "+r"(low));
	return (b >> 1) ^ (low * CP_CRC32C_POLY);
}

/* a * b modulo the CRC32c polynomial (`a` a constant: its bits fold). */
static __always_inline __u32 cp_crc32c_mul(const __u32 a, __u32 b)
{
	__u32 p = 0;

#pragma unroll
	for (int i = 0; i < 32; i++) {
		if ((a >> (31 - i)) & 1)
			p ^= b;
		b = cp_crc32c_x(b);
	}
	return p;
}

/* What a CRC32c changes by when the four bytes `change` (old ^ new, as
 * they lie in memory: little endian) are followed by `tail` (< 65536)
 * bytes up to the end of what it covers: the register after the change
 * from zero, times x^(8 * tail). A global function: checked once. */
__noinline __u32 cp_crc32c_delta(__u32 change, __u32 tail)
{
	const __u32 k[16] = CP_CRC32C_X8_POW2;
	__u32 crc = change;

#pragma unroll
	for (int i = 0; i < 32; i++)
		crc = cp_crc32c_x(crc);
#pragma unroll
	for (int i = 0; i < 16; i++) {
		__u32 by = cp_crc32c_mul(k[i], crc), take = (tail >> i) & 1;

		asm volatile("" : "+r"(take));
		crc ^= (by ^ crc) * take; /* by if bit i of the tail is set */
	}
	return crc;
}

/*
 * An SCTP port rewrite is two steps. The rewrite stores the port and, the
 * first time in this program run, keeps the packet's original ports (and
 * where its CRC is) in skb->cb; cp_sctp_crc() then, once the translation
 * is done, updates the CRC for all ports changed at once. The CRC's work
 * thus runs at the program's own call depth, not below the load
 * balancer's frames, where the verifier's 512 bytes of stack are spent.
 * cb[] is the tc hook's scratch space, and a packet may bring words from
 * where it was before: the callers clear the mark (cp_sctp_begin) before
 * anything can set it, so a mark cp_sctp_crc() honours is always this
 * run's.
 */
static __always_inline void cp_sctp_begin(struct __sk_buff *skb)
{
	skb->cb[CP_SCTP_CB_MARK_IDX] = 0;
}

static __always_inline int cp_sctp_port(struct __sk_buff *skb, const struct cp_l4_layout *l,
					__u32 port_off, __be16 new_port)
{
	__u32 l4_off = l->csum_off - CP_SCTP_CRC_OFF, ports;

	if (skb->cb[CP_SCTP_CB_MARK_IDX] != CP_SCTP_CB_MARK) {
		if (bpf_skb_load_bytes(skb, l4_off, &ports, sizeof(ports)) < 0)
			return -1;
		skb->cb[CP_SCTP_CB_PORTS_IDX] = ports;
		skb->cb[CP_SCTP_CB_AT_IDX] = (l4_off << 16) | CP_L4_SCTP_LEN(l);
		skb->cb[CP_SCTP_CB_MARK_IDX] = CP_SCTP_CB_MARK;
	}
	if (bpf_skb_store_bytes(skb, port_off, &new_port, sizeof(new_port),
				BPF_F_RECOMPUTE_CSUM) < 0)
		return -1;
	return 0;
}

/* Rewrite an SCTP packet's address `old` -> `new` at `addr_off` (IPv6 if
 * `v6`) and its port at `port_off` (the CRC later: cp_sctp_port). No
 * pseudo header: the addresses change no L4 checksum. 0 or -1. */
static __always_inline int cp_sctp_rewrite(struct __sk_buff *skb, const struct cp_l4_layout *l,
					   int v6, __u32 addr_off, const struct addr128 *old,
					   const struct addr128 *new, __u32 port_off,
					   __be16 old_port, __be16 new_port)
{
	if (v6) {
		struct addr128 to = *new;

		if (bpf_skb_store_bytes(skb, addr_off, &to, sizeof(to), 0) < 0)
			return -1;
	} else {
		__be32 to = new->w[3];

		if (bpf_l3_csum_replace(skb, CP_IP4_CSUM_OFF, old->w[3], to, sizeof(to)) < 0 ||
		    bpf_skb_store_bytes(skb, addr_off, &to, sizeof(to), 0) < 0)
			return -1;
	}
	return old_port == new_port ? 0 : cp_sctp_port(skb, l, port_off, new_port);
}

/*
 * The CRC32c of an SCTP packet whose ports cp_sctp_port() rewrote, for
 * all of them at once; nothing for any other packet. A CRC of 0 is left
 * alone: a local SCTP stack that leaves the CRC to the device
 * (CHECKSUM_PARTIAL; a veth offers it) sends 0, and the CRC computed later
 * covers the rewritten ports (a real CRC of 0, one packet in 2^32, is then
 * dropped by the peer and sent again). The store keeps a CHECKSUM_COMPLETE
 * sum true: no Internet checksum compensates for it. A global function.
 * 0 or -1.
 */
__noinline int cp_sctp_crc(struct __sk_buff *skb)
{
	__u32 at, l4_off, crc_len, ports, crc;

	if (!skb || skb->cb[CP_SCTP_CB_MARK_IDX] != CP_SCTP_CB_MARK)
		return 0;
	skb->cb[CP_SCTP_CB_MARK_IDX] = 0;
	at = skb->cb[CP_SCTP_CB_AT_IDX];
	l4_off = at >> 16;
	crc_len = at & 0xffff;
	if (crc_len < CP_SCTP_HLEN)
		return -1;
	if (bpf_skb_load_bytes(skb, l4_off, &ports, sizeof(ports)) < 0 ||
	    bpf_skb_load_bytes(skb, l4_off + CP_SCTP_CRC_OFF, &crc, sizeof(crc)) < 0)
		return -1;
	ports ^= skb->cb[CP_SCTP_CB_PORTS_IDX];
	if (!ports || !crc)
		return 0;
	crc ^= cp_crc32c_delta(ports, crc_len - sizeof(ports));
	if (bpf_skb_store_bytes(skb, l4_off + CP_SCTP_CRC_OFF, &crc, sizeof(crc),
				BPF_F_RECOMPUTE_CSUM) < 0)
		return -1;
	return 0;
}

/* cp_nat_tuple_at() for IPv4 with a 20-byte header. */
static __always_inline int cp_nat_tuple(struct __sk_buff *skb, const struct cp_pkt *pkt,
					int reply, struct cp_masq_key *k,
					struct cp_l4_layout *l)
{
	return cp_nat_tuple_at(skb, pkt, reply, 0, CP_L4_OFF, k, l);
}

/* Rewrite the IPv4 address at `addr_off` and the port at `port_off` (the
 * port only if it changes), with the IP and L4 checksums. */
static __always_inline int cp_nat_rewrite(struct __sk_buff *skb, const struct cp_l4_layout *l,
					  __u32 addr_off, __be32 old_ip, __be32 new_ip,
					  __u32 port_off, __be16 old_port, __be16 new_port)
{
	if (l->pseudo &&
	    bpf_l4_csum_replace(skb, l->csum_off, old_ip, new_ip,
				BPF_F_PSEUDO_HDR | l->csum_flags | sizeof(new_ip)) < 0)
		return -1;
	if (bpf_l3_csum_replace(skb, CP_IP4_CSUM_OFF, old_ip, new_ip, sizeof(new_ip)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, addr_off, &new_ip, sizeof(new_ip), 0) < 0)
		return -1;
	if (old_port == new_port)
		return 0;
	if (bpf_l4_csum_replace(skb, l->csum_off, old_port, new_port,
				l->csum_flags | sizeof(new_port)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, port_off, &new_port, sizeof(new_port), 0) < 0)
		return -1;
	return 0;
}

/* Rewrite the IPv6 address at `addr_off` and the port at `port_off` (the
 * port only if it changes), with the L4 checksum (IPv6 has no header
 * checksum; the L4 one, ICMPv6's too, covers the addresses). `old_ip` is
 * read in place (callers pass their own stack copy: a tuple's); `new_ip`
 * is copied first, so that a map value changing meanwhile cannot make the
 * checksum disagree with the bytes stored. */
static __always_inline int cp_nat_rewrite6(struct __sk_buff *skb, const struct cp_l4_layout *l,
					   __u32 addr_off, const struct addr128 *old_ip,
					   const struct addr128 *new_ip, __u32 port_off,
					   __be16 old_port, __be16 new_port)
{
	struct addr128 to = *new_ip;
	__s64 diff = bpf_csum_diff((__be32 *)old_ip->w, sizeof(*old_ip), to.w, sizeof(to), 0);

	if (diff < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, l->csum_off, 0, (__u32)diff,
				BPF_F_PSEUDO_HDR | l->csum_flags) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, addr_off, &to, sizeof(to), 0) < 0)
		return -1;
	if (old_port == new_port)
		return 0;
	if (bpf_l4_csum_replace(skb, l->csum_off, old_port, new_port,
				l->csum_flags | sizeof(new_port)) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, port_off, &new_port, sizeof(new_port), 0) < 0)
		return -1;
	return 0;
}

/* Avalanche the tuple so consecutive ports spread over the range. */
static __always_inline __u32 cp_nat_hash(const struct cp_masq_key *k)
{
	__u32 h = k->src.w[3] * 0x9e3779b1u;

	h ^= k->dst.w[3] * 0x85ebca6bu;
	h ^= (((__u32)k->sport << 16) | k->dport) * 0xc2b2ae35u;
	h ^= k->proto;
	h ^= h >> 16;
	h *= 0x7feb352du;
	h ^= h >> 15;
	h *= 0x846ca68bu;
	h ^= h >> 16;
	return h;
}

/*
 * Claimed ports expire (bpf/lb.h, bpf/masq.h): a reverse entry holds its
 * port until an expiry (CLOCK_MONOTONIC seconds) that every packet of the
 * flow renews; an expired port may be taken over by a new flow. Lifetimes,
 * seconds: until the peer first replies, after, and once a TCP FIN or RST
 * was seen either way (as Cilium's CT: SYN 60 s, TCP 6 h, close 10 s;
 * non-TCP 30 s unreplied, 120 s after a reply).
 */
enum cp_nat_timeouts {
	CP_NAT_TCP_OPENING_S = 60,
	CP_NAT_TCP_OPEN_S = 21600,
	CP_NAT_TCP_CLOSING_S = 10,
	CP_NAT_OTHER_OPENING_S = 30,
	CP_NAT_OTHER_OPEN_S = 120,
};

static __always_inline __u32 cp_nat_now_s(void)
{
	return (__u32)(bpf_ktime_get_ns() / 1000000000ULL);
}

/* The TCP flags of `pkt` (0 for anything else or a truncated header). */
static __always_inline __u8 cp_nat_tcp_flags(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	__u8 f = 0;

	if (pkt->l4proto == IPPROTO_TCP_)
		bpf_skb_load_bytes(skb, pkt->l4_off + 13, &f, 1);
	return f;
}

/* A claimed port's lifetime for a flow that has (`replied`) seen a reply
 * and (`closing`) a FIN or RST. */
static __always_inline __u32 cp_nat_ttl(__u8 proto, int replied, int closing)
{
	if (proto != IPPROTO_TCP_)
		return replied ? CP_NAT_OTHER_OPEN_S : CP_NAT_OTHER_OPENING_S;
	if (closing)
		return CP_NAT_TCP_CLOSING_S;
	return replied ? CP_NAT_TCP_OPEN_S : CP_NAT_TCP_OPENING_S;
}

/* State bits of the masquerade's reverse entries (cp_masq_val.state). */
enum cp_nat_state {
	CP_NAT_S_REPLIED = 0x1,
	CP_NAT_S_CLOSING = 0x2,
};

/* Renews a reverse entry's `*state` and `*expires_s` for a packet of its
 * flow (a reply when `reply`) with TCP flags `tcp`. */
static __always_inline void cp_nat_renew(__u16 *state, __u32 *expires_s, __u8 proto, __u8 tcp,
					 int reply, __u32 now)
{
	__u16 st = *state;
	__u32 exp;

	if (reply)
		st |= CP_NAT_S_REPLIED;
	if (tcp & (CP_TCP_FIN | CP_TCP_RST))
		st |= CP_NAT_S_CLOSING;
	if (st != *state)
		*state = st;
	exp = now + cp_nat_ttl(proto, st & CP_NAT_S_REPLIED, st & CP_NAT_S_CLOSING);
	/* one store a second at most */
	if (*expires_s != exp)
		*expires_s = exp;
}

/*
 * cp_nat_claim with expiry: a port whose reverse entry has expired (its
 * u32 expiry at `exp_off` is below `now`; 0 means an older agent's entry,
 * never expired) is taken over. The atomic swap of the expiry to `v`'s
 * makes one of two claimers the winner; the winner gets the entry in
 * `*took` to fill in (NULL when the port was free and `v` was inserted).
 */
static __always_inline __be16 cp_nat_claim_expiring(void *rev, void *rk, __be16 *slot,
						     const void *v, __u32 exp_off, __u32 hash,
						     __u32 min, __u32 max, __u32 now, void **took)
{
	*took = NULL;
	if (min == 0 || max < min)
		return 0;
	__u32 span = max - min + 1;
	__u32 start = (__u32)(((__u64)hash * span) >> 32);
	__u32 want = *(const __u32 *)((const char *)v + exp_off);

	for (__u32 i = 0; i < CP_NAT_TRIES; i++) {
		__u32 *exp, seen;
		void *old;

		if (i >= span)
			break;
		__u32 off = start + i;

		if (off >= span)
			off -= span;
		*slot = bpf_htons((__u16)(min + off));
		if (bpf_map_update_elem(rev, rk, v, BPF_NOEXIST) == 0)
			return *slot;
		old = bpf_map_lookup_elem(rev, rk);
		if (!old)
			continue;
		exp = (__u32 *)((char *)old + exp_off);
		seen = *exp;
		if (seen == 0 || seen > now)
			continue;
		if (__sync_val_compare_and_swap(exp, seen, want) != seen)
			continue;
		*took = old;
		return *slot;
	}
	return 0;
}

/*
 * Claim a translated port in [min, max]: write candidates into `*slot` (the
 * port field of the reverse key `rk`) and insert `rev[rk] = v` with
 * BPF_NOEXIST until one is free, starting at a hashed offset and probing
 * CP_NAT_TRIES ports. The reverse table is the arbiter: a port is taken
 * iff its reply tuple is in it. Returns the port (network order) or 0.
 */
static __always_inline __be16 cp_nat_claim(void *rev, void *rk, __be16 *slot, const void *v,
					   __u32 hash, __u32 min, __u32 max)
{
	if (min == 0 || max < min)
		return 0;
	__u32 span = max - min + 1;
	__u32 start = (__u32)(((__u64)hash * span) >> 32);

	for (__u32 i = 0; i < CP_NAT_TRIES; i++) {
		if (i >= span)
			break; /* fewer ports than tries: each tried once */
		__u32 off = start + i;

		if (off >= span)
			off -= span;
		*slot = bpf_htons((__u16)(min + off));
		if (bpf_map_update_elem(rev, rk, v, BPF_NOEXIST) == 0)
			return *slot;
	}
	return 0;
}

/*
 * ICMPv4 errors (destination unreachable, time exceeded): the 8-byte ICMP
 * header, then the quoted IPv4 header (20 bytes, no options) and the first
 * 8 bytes of its L4.
 */
#define CP_ICMP_CSUM_OFF (CP_L4_OFF + offsetof(struct icmphdr, checksum))
#define CP_QIP_OFF (CP_L4_OFF + 8)
#define CP_QIP_CSUM_OFF (CP_QIP_OFF + offsetof(struct iphdr, check))
#define CP_QIP_SADDR_OFF (CP_QIP_OFF + offsetof(struct iphdr, saddr))
#define CP_QIP_DADDR_OFF (CP_QIP_OFF + offsetof(struct iphdr, daddr))
#define CP_QL4_OFF (CP_QIP_OFF + sizeof(struct iphdr))

/* What an ICMP error quotes: the offending packet's header + 8 L4 bytes. */
struct cp_icmp_quote {
	struct iphdr ip;
	__u8 l4[8];
};

/* Is this ICMPv4 type an error that quotes a packet we may have translated? */
static __always_inline int cp_icmp_is_error(__u8 type)
{
	return type == ICMP_DEST_UNREACH_ || type == ICMP_TIME_EXCEEDED_;
}

/*
 * Read the quote of an ICMPv4 error and fill `k` with the quoted packet's
 * tuple *swapped*: the tuple a reply of the quoted flow has, i.e. exactly
 * the key the translation of such a reply looks up (src = quoted dst,
 * sport = quoted dport, dport = quoted sport; a quoted echo request gives
 * sport 0, dport = its id). `*sport_off` is the offset of the quoted source
 * port or echo id. Returns 0, or -1 for a quote that cannot be vouched for
 * (truncated, quoted IP options, a quoted non-first fragment, a protocol
 * other than TCP/UDP/echo request).
 */
static __always_inline int cp_icmp_quote_tuple(struct __sk_buff *skb, struct cp_icmp_quote *q,
					       struct cp_masq_key *k, __u32 *sport_off)
{
	if (bpf_skb_load_bytes(skb, CP_QIP_OFF, q, sizeof(*q)) < 0)
		return -1; /* truncated quote */
	if (q->ip.version != 4 || q->ip.ihl != 5)
		return -1; /* quoted options: L4 not where we look */
	if (q->ip.frag_off & bpf_htons(IP_OFFSET_))
		return -1; /* a non-first fragment quotes no ports */

	addr_from_ip4(&k->src, q->ip.daddr);
	addr_from_ip4(&k->dst, q->ip.saddr);
	k->proto = q->ip.protocol;
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;
	/* SCTP's ports sit where TCP's do (the quote's 8 bytes: ports and tag) */
	if (q->ip.protocol == IPPROTO_TCP_ || q->ip.protocol == IPPROTO_UDP_ ||
	    q->ip.protocol == IPPROTO_SCTP_) {
		__builtin_memcpy(&k->dport, &q->l4[0], sizeof(k->dport));
		__builtin_memcpy(&k->sport, &q->l4[2], sizeof(k->sport));
		*sport_off = CP_QL4_OFF;
		return 0;
	}
	if (q->ip.protocol == IPPROTO_ICMP_ && q->l4[0] == ICMP_ECHO_) {
		__builtin_memcpy(&k->dport, &q->l4[4], sizeof(k->dport));
		k->sport = 0;
		*sport_off = CP_QL4_OFF + 4;
		return 0;
	}
	return -1;
}

/*
 * Replace the 16-bit word at `off` with `new` and fold the change into the
 * ICMP checksum, which covers the whole message (quote included) and has
 * no pseudo header (hence flags 0).
 */
static __always_inline int cp_icmp_word(struct __sk_buff *skb, __u32 off, __be16 old,
					__be16 new)
{
	if (old == new)
		return 0;
	if (bpf_l4_csum_replace(skb, CP_ICMP_CSUM_OFF, old, new, sizeof(new)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &new, sizeof(new), 0);
}

/*
 * An address of an ICMPv4 error's outer header, at `outer_off`, from `old`
 * to `new`: the IP header checksum only (ICMP has no pseudo header).
 * Returns 0 or -1.
 */
static __always_inline int cp_icmp_outer_addr(struct __sk_buff *skb, __u32 outer_off, __be32 old,
					      __be32 new)
{
	if (bpf_l3_csum_replace(skb, CP_IP4_CSUM_OFF, old, new, sizeof(new)) < 0 ||
	    bpf_skb_store_bytes(skb, outer_off, &new, sizeof(new), 0) < 0)
		return -1;
	return 0;
}

/*
 * An address of an ICMPv4 error's quote, at `quoted_off`, from `old` to
 * `new`: the quoted IP checksum, then the ICMP checksum for the address and
 * for the quoted checksum word it changed. The quoted L4 checksum is left
 * alone: it covers bytes the quote does not carry. Returns 0 or -1.
 */
static __always_inline int cp_icmp_quoted_addr(struct __sk_buff *skb, __u32 quoted_off,
					       __be32 old, __be32 new)
{
	__be16 before, after;

	if (bpf_skb_load_bytes(skb, CP_QIP_CSUM_OFF, &before, sizeof(before)) < 0)
		return -1;
	if (bpf_l3_csum_replace(skb, CP_QIP_CSUM_OFF, old, new, sizeof(new)) < 0 ||
	    bpf_l4_csum_replace(skb, CP_ICMP_CSUM_OFF, old, new, sizeof(new)) < 0 ||
	    bpf_skb_store_bytes(skb, quoted_off, &new, sizeof(new), 0) < 0)
		return -1;
	if (bpf_skb_load_bytes(skb, CP_QIP_CSUM_OFF, &after, sizeof(after)) < 0)
		return -1;
	/* the word is already stored: fold the change into the ICMP sum only */
	if (after != before &&
	    bpf_l4_csum_replace(skb, CP_ICMP_CSUM_OFF, before, after, sizeof(after)) < 0)
		return -1;
	return 0;
}

/*
 * Translate one address of an ICMPv4 error from `old` to `new`: the outer
 * header's at `outer_off` and its counterpart in the quote at `quoted_off`.
 * Returns 0 or -1.
 */
static __always_inline int cp_icmp_addr(struct __sk_buff *skb, __u32 outer_off, __u32 quoted_off,
					__be32 old, __be32 new)
{
	if (cp_icmp_outer_addr(skb, outer_off, old, new) < 0)
		return -1;
	return cp_icmp_quoted_addr(skb, quoted_off, old, new);
}

/*
 * ICMPv6 errors (destination unreachable, packet too big, time exceeded):
 * the 8-byte ICMPv6 header, then the quoted IPv6 header (40 bytes, its L4
 * right behind: no extension headers) and the first 8 bytes of its L4. The
 * ICMPv6 checksum covers the outer addresses (pseudo header) and the quote.
 */
#define ICMPV6_DEST_UNREACH_ 1
#define ICMPV6_PKT_TOOBIG_ 2
#define ICMPV6_TIME_EXCEED_ 3

#define CP_ICMP6_CSUM_OFF (CP_L6_OFF + 2)
#define CP_QIP6_OFF (CP_L6_OFF + 8)
#define CP_QIP6_SADDR_OFF (CP_QIP6_OFF + offsetof(struct ipv6hdr, saddr))
#define CP_QIP6_DADDR_OFF (CP_QIP6_OFF + offsetof(struct ipv6hdr, daddr))
#define CP_QL6_OFF (CP_QIP6_OFF + sizeof(struct ipv6hdr))

struct cp_icmp6_quote {
	struct ipv6hdr ip;
	__u8 l4[8];
};

static __always_inline int cp_icmp6_is_error(__u8 type)
{
	return type == ICMPV6_DEST_UNREACH_ || type == ICMPV6_PKT_TOOBIG_ ||
	       type == ICMPV6_TIME_EXCEED_;
}

/* cp_icmp_quote_tuple() for an ICMPv6 error: the quoted IPv6 packet's
 * tuple swapped, the offset of its source port / echo id. 0 or -1. */
static __always_inline int cp_icmp6_quote_tuple(struct __sk_buff *skb, struct cp_icmp6_quote *q,
						struct cp_masq_key *k, __u32 *sport_off)
{
	if (bpf_skb_load_bytes(skb, CP_QIP6_OFF, q, sizeof(*q)) < 0)
		return -1; /* truncated quote */
	if (q->ip.version != 6)
		return -1;
	addr_from_ip6(&k->src, &q->ip.daddr);
	addr_from_ip6(&k->dst, &q->ip.saddr);
	k->proto = q->ip.nexthdr;
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;
	if (q->ip.nexthdr == IPPROTO_TCP_ || q->ip.nexthdr == IPPROTO_UDP_ ||
	    q->ip.nexthdr == IPPROTO_SCTP_) {
		__builtin_memcpy(&k->dport, &q->l4[0], sizeof(k->dport));
		__builtin_memcpy(&k->sport, &q->l4[2], sizeof(k->sport));
		*sport_off = CP_QL6_OFF;
		return 0;
	}
	if (q->ip.nexthdr == IPPROTO_ICMPV6_ && q->l4[0] == ICMPV6_ECHO_REQUEST_) {
		__builtin_memcpy(&k->dport, &q->l4[4], sizeof(k->dport));
		k->sport = 0;
		*sport_off = CP_QL6_OFF + 4;
		return 0;
	}
	return -1; /* extension headers, other protocols */
}

/* cp_icmp_word() for ICMPv6 (the checksum sits elsewhere). */
static __always_inline int cp_icmp6_word(struct __sk_buff *skb, __u32 off, __be16 old,
					 __be16 new)
{
	if (old == new)
		return 0;
	if (bpf_l4_csum_replace(skb, CP_ICMP6_CSUM_OFF, old, new, sizeof(new)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &new, sizeof(new), 0);
}


/*
 * One address of an ICMPv6 error's outer header (at `outer_off`, in the
 * checksum's pseudo header) alone, `old` -> `new`. `old` is read in place
 * (a stack copy), `new` copied first (bpf/nat.h cp_nat_rewrite6). 0 or -1.
 */
static __always_inline int cp_icmp6_outer_addr(struct __sk_buff *skb, __u32 outer_off,
					       const struct addr128 *old,
					       const struct addr128 *new)
{
	struct addr128 to = *new;
	__s64 diff = bpf_csum_diff((__be32 *)old->w, sizeof(*old), to.w, sizeof(to), 0);

	if (diff < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, CP_ICMP6_CSUM_OFF, 0, (__u32)diff, BPF_F_PSEUDO_HDR) < 0 ||
	    bpf_skb_store_bytes(skb, outer_off, &to, sizeof(to), 0) < 0)
		return -1;
	return 0;
}

/*
 * One address of an ICMPv6 error's quote (at `quoted_off`, in the
 * checksummed message) alone, `old` -> `new`. The quoted L4 checksum is
 * left alone, as for ICMPv4 (cp_icmp_quoted_addr). 0 or -1.
 */
static __always_inline int cp_icmp6_quoted_addr(struct __sk_buff *skb, __u32 quoted_off,
						const struct addr128 *old,
						const struct addr128 *new)
{
	struct addr128 to = *new;
	__s64 diff = bpf_csum_diff((__be32 *)old->w, sizeof(*old), to.w, sizeof(to), 0);

	if (diff < 0)
		return -1;
	if (bpf_l4_csum_replace(skb, CP_ICMP6_CSUM_OFF, 0, (__u32)diff, 0) < 0 ||
	    bpf_skb_store_bytes(skb, quoted_off, &to, sizeof(to), 0) < 0)
		return -1;
	return 0;
}

/*
 * cp_icmp_addr() for ICMPv6: one address of the outer header (at
 * `outer_off`, in the checksum's pseudo header) and its counterpart in the
 * quote (at `quoted_off`, in the checksummed message), `old` -> `new`.
 * `old` is read in place: a stack copy, never the packet's own bytes.
 */
static __always_inline int cp_icmp6_addr(struct __sk_buff *skb, __u32 outer_off, __u32 quoted_off,
					 const struct addr128 *old, const struct addr128 *new)
{
	if (cp_icmp6_outer_addr(skb, outer_off, old, new) < 0)
		return -1;
	return cp_icmp6_quoted_addr(skb, quoted_off, old, new);
}

#endif /* CP_NAT_H */
