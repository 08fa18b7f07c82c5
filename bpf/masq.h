/* SPDX-License-Identifier: GPL-2.0 */
/*
 * masq.h - cluster-egress masquerade (IPv4, TCP/UDP/ICMP echo) with the
 * datapath's own LRU connection table; no kernel conntrack, no kfuncs
 * (aya 0.14 cannot load them).
 *
 * SNAT runs at tcx egress of the uplink (after the kernel routed the pod's
 * packet out), the reverse at tcx ingress of the uplink (before netfilter,
 * so the kernel sees an ordinary reply to the pod's own address).
 *
 * ICMP errors (destination unreachable, time exceeded) about a masqueraded
 * flow are translated back too, so path-MTU discovery and traceroute work
 * from pods (see cp_masq_icmp_error).
 *
 * A pod's packet bound outside leaves translated or not at all: IPv4
 * fragments, packets with IP options and protocols (or ICMP types) the
 * masquerade cannot translate are dropped and counted by reason, never
 * passed with the pod's own source; so is UDP to the overlay port, which
 * translated would be VXLAN from this node (bpf/encap.h).
 */
#ifndef CP_MASQ_H
#define CP_MASQ_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"

#define CP_MASQ_TRIES 16

#define CP_IP4_CSUM_OFF (CP_IP4_OFF + offsetof(struct iphdr, check))
#define CP_IP4_SADDR_OFF (CP_IP4_OFF + offsetof(struct iphdr, saddr))
#define CP_IP4_DADDR_OFF (CP_IP4_OFF + offsetof(struct iphdr, daddr))
#define CP_L4_OFF (CP_IP4_OFF + sizeof(struct iphdr))

/* Where the translated port and the L4 checksum sit, per protocol. */
struct cp_l4_layout {
	__u32 csum_off;   /* absolute offset of the L4 checksum */
	__u32 sport_off;  /* absolute offset of the pod-side port/id in egress packets */
	__u32 dport_off;  /* absolute offset of the pod-side port/id in reply packets */
	__u32 csum_flags; /* extra flags for bpf_l4_csum_replace */
	int pseudo;       /* L4 checksum covers the IP pseudo header */
};

/* cp_masq_tuple() failures */
#define CP_MASQ_UNSUPPORTED (-1) /* a protocol or ICMP type not translated */
#define CP_MASQ_TRUNCATED (-2)   /* the L4 header is not all there */

/*
 * Fill `k` with the tuple of an IPv4 packet with a 20-byte header and
 * the layout to rewrite it. `reply` selects ICMP echo reply vs request.
 * Returns 0 if the packet can be translated, else CP_MASQ_UNSUPPORTED or
 * CP_MASQ_TRUNCATED.
 */
static __always_inline int cp_masq_tuple(struct __sk_buff *skb, const struct cp_pkt *pkt,
					 int reply, struct cp_masq_key *k,
					 struct cp_l4_layout *l)
{
	__be16 ports[2];

	k->src = pkt->src;
	k->dst = pkt->dst;
	k->proto = pkt->l4proto;
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;

	if (pkt->l4proto == IPPROTO_TCP_ || pkt->l4proto == IPPROTO_UDP_) {
		if (bpf_skb_load_bytes(skb, CP_L4_OFF, ports, sizeof(ports)) < 0)
			return CP_MASQ_TRUNCATED;
		k->sport = ports[0];
		k->dport = ports[1];
		l->sport_off = CP_L4_OFF;
		l->dport_off = CP_L4_OFF + 2;
		l->pseudo = 1;
		if (pkt->l4proto == IPPROTO_TCP_) {
			l->csum_off = CP_L4_OFF + offsetof(struct tcphdr, check);
			l->csum_flags = 0;
		} else {
			l->csum_off = CP_L4_OFF + offsetof(struct udphdr, check);
			/* a zero UDP checksum means "none" and must stay zero */
			l->csum_flags = BPF_F_MARK_MANGLED_0;
		}
		return 0;
	}
	if (pkt->l4proto == IPPROTO_ICMP_) {
		__u8 type;
		__be16 id;

		if (bpf_skb_load_bytes(skb, CP_L4_OFF, &type, 1) < 0)
			return CP_MASQ_TRUNCATED;
		if (type != (reply ? ICMP_ECHOREPLY_ : ICMP_ECHO_))
			return CP_MASQ_UNSUPPORTED;
		if (bpf_skb_load_bytes(skb, CP_L4_OFF + 4, &id, 2) < 0)
			return CP_MASQ_TRUNCATED;
		/* the identifier is the pod-side "port"; the peer side has none */
		k->sport = reply ? 0 : id;
		k->dport = reply ? id : 0;
		l->csum_off = CP_L4_OFF + offsetof(struct icmphdr, checksum);
		l->sport_off = CP_L4_OFF + 4;
		l->dport_off = CP_L4_OFF + 4;
		l->csum_flags = 0;
		l->pseudo = 0; /* ICMPv4 has no pseudo header */
		return 0;
	}
	return CP_MASQ_UNSUPPORTED;
}

/* Rewrite the IPv4 address at `addr_off` and the port at `port_off`. */
static __always_inline int cp_masq_rewrite(struct __sk_buff *skb, const struct cp_l4_layout *l,
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

/* Avalanche the tuple so consecutive pod ports spread over the range. */
static __always_inline __u32 cp_masq_hash(const struct cp_masq_key *k)
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

/* Does the pod tuple qualify: pod source, non-internal destination. */
static __always_inline int cp_masq_wanted(const struct cp_pkt *pkt)
{
	struct cp_lpm_key lk = {};

	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = CP_NET_DEFAULT;
	lk.addr = pkt->src;
	if (!bpf_map_lookup_elem(&cp_masq_srcs, &lk))
		return 0;
	lk.addr = pkt->dst;
	if (bpf_map_lookup_elem(&cp_internal, &lk))
		return 0;
	return 1;
}

/*
 * Find or allocate the translated port of forward tuple `k`, making sure
 * the reverse entry exists. Returns the port (network order) or 0.
 */
static __always_inline __be16 cp_masq_port(const struct cp_params *cfg,
					   const struct cp_masq_key *k,
					   struct cp_masq_key *rk,
					   struct cp_masq_val *v)
{
	const struct cp_masq_val *fv = bpf_map_lookup_elem(&cp_masq_fwd, k);
	__u32 min = cfg->masq_port_min, max = cfg->masq_port_max;

	/* reply tuple: peer -> masquerade address */
	rk->src = k->dst;
	rk->dst.w[0] = CP_NAT64_W0;
	rk->dst.w[1] = 0;
	rk->dst.w[2] = 0;
	rk->dst.w[3] = cfg->masq_ip;
	rk->sport = k->dport;
	rk->proto = k->proto;
	rk->pad[0] = 0;
	rk->pad[1] = 0;
	rk->pad[2] = 0;

	/* original pod source, what the reverse path restores */
	v->addr = k->src;
	v->port = k->sport;
	v->pad = 0;
	v->flags = 0;

	if (fv) {
		__be16 port = fv->port;

		rk->dport = port;
		/* re-create the reverse entry if the LRU evicted it */
		if (!bpf_map_lookup_elem(&cp_masq_rev, rk))
			bpf_map_update_elem(&cp_masq_rev, rk, v, BPF_ANY);
		return port;
	}

	if (min == 0 || max < min)
		return 0;
	__u32 span = max - min + 1;
	__u32 start = (__u32)(((__u64)cp_masq_hash(k) * span) >> 32);

	for (__u32 i = 0; i < CP_MASQ_TRIES; i++) {
		if (i >= span)
			break; /* fewer ports than tries: each tried once */
		__u32 off = start + i;


		if (off >= span)
			off -= span;
		__be16 port = bpf_htons((__u16)(min + off));

		rk->dport = port;
		if (bpf_map_update_elem(&cp_masq_rev, rk, v, BPF_NOEXIST) == 0) {
			struct cp_masq_val fwd = {};

			fwd.addr = rk->dst;
			fwd.port = port;
			if (bpf_map_update_elem(&cp_masq_fwd, k, &fwd, BPF_ANY) < 0) {
				bpf_map_delete_elem(&cp_masq_rev, rk);
				return 0;
			}
			return port;
		}
	}
	return 0;
}

/* Egress of the uplink: pod -> outside SNAT to the masquerade address. */
static __always_inline int cp_masq_snat(struct __sk_buff *skb)
{
	const struct cp_params *cfg = cp_get_params();
	struct cp_pkt pkt;
	struct cp_masq_key k, rk;
	struct cp_masq_val v;
	/* zeroed: clang spills it on the drop paths, where the verifier
	 * refuses a read of registers nothing has written */
	struct cp_l4_layout l = {};
	__be16 port;
	int err;

	if (!cfg || !cfg->masq_ip)
		return CP_PASS;
	if (cp_parse(skb, &pkt) != CP_PARSE_IP4)
		return CP_PASS;
	/* The node's own traffic - above all the VXLAN underlay packets, the
	 * bulk of the uplink - leaves before the LPM lookups: a pod source is
	 * never the node or masquerade address. */
	if (pkt.src.w[3] == cfg->masq_ip || pkt.src.w[3] == cfg->node_ip)
		return CP_PASS;
	if (!cp_masq_wanted(&pkt))
		return CP_PASS;
	/* A pod's packet bound outside: translated, or not at all. A later
	 * fragment has no ports to translate and the first one's translation
	 * is not remembered for it, so fragments go (docs/datapath.md). */
	if (pkt.flags & CP_PKT_FRAG)
		return cp_drop(CP_DROP_MASQ_FRAGMENT);
	if (pkt.l4_off != CP_L4_OFF)
		return cp_drop(CP_DROP_MASQ_IP_OPTIONS);
	err = cp_masq_tuple(skb, &pkt, 0, &k, &l);
	if (err == CP_MASQ_TRUNCATED)
		return cp_drop(CP_DROP_MALFORMED);
	if (err < 0)
		return cp_drop(CP_DROP_MASQ_PROTO);
	/* After the kernel's DNAT too (a Service whose endpoint is some node's
	 * overlay port): translated, this would be VXLAN from this node. */
	if (k.proto == IPPROTO_UDP_ && k.dport == bpf_htons(CP_VXLAN_PORT))
		return cp_drop(CP_DROP_OVERLAY_PORT);

	port = cp_masq_port(cfg, &k, &rk, &v);
	if (!port)
		return cp_drop(CP_DROP_MASQ_NO_PORT);
	if (cp_masq_rewrite(skb, &l, CP_IP4_SADDR_OFF, k.src.w[3], cfg->masq_ip,
			    l.sport_off, k.sport, port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

#define ICMP_DEST_UNREACH_ 3
#define ICMP_TIME_EXCEEDED_ 11

/* Offsets inside an ICMPv4 error: 8-byte ICMP header, then the quoted
 * IPv4 header (20 bytes, no options) and the first 8 bytes of its L4. */
#define CP_ICMP_CSUM_OFF (CP_L4_OFF + offsetof(struct icmphdr, checksum))
#define CP_QIP_OFF (CP_L4_OFF + 8)
#define CP_QIP_CSUM_OFF (CP_QIP_OFF + offsetof(struct iphdr, check))
#define CP_QIP_SADDR_OFF (CP_QIP_OFF + offsetof(struct iphdr, saddr))
#define CP_QL4_OFF (CP_QIP_OFF + sizeof(struct iphdr))

/* What an ICMP error quotes: the offending packet's header + 8 L4 bytes. */
struct cp_icmp_quote {
	struct iphdr ip;
	__u8 l4[8];
};

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
 * Ingress of the uplink: an ICMPv4 error (type 3 or 11, outer destination
 * already known to be the masquerade address) about a masqueraded flow.
 * The quote is the *translated* outgoing packet (masq IP:port -> remote),
 * so the state is the reply tuple of that packet - the quoted tuple
 * swapped - in cp_masq_rev, exactly what a reply would look up. On a hit
 * the outer destination, the quoted source address and the quoted source
 * port (or echo id) get the pod's values back, with the outer IP, quoted
 * IP and ICMP checksums updated incrementally. The quoted L4 checksum is
 * left alone: it covers bytes the quote does not carry.
 *
 * Anything we cannot vouch for (truncated, quoted IP options, fragments,
 * unknown protocols, no state) passes untouched: these are the node's own
 * ICMP messages then, never ours to drop.
 */
static __always_inline int cp_masq_icmp_error(struct __sk_buff *skb,
					      const struct cp_params *cfg)
{
	const struct cp_masq_val *v;
	struct cp_icmp_quote q;
	struct cp_masq_key k;
	__u32 port_off;
	__be16 qport, orig_port, ncsum;
	__be32 orig_ip;

	if (bpf_skb_load_bytes(skb, CP_QIP_OFF, &q, sizeof(q)) < 0)
		return CP_PASS; /* truncated quote */
	if (q.ip.version != 4 || q.ip.ihl != 5)
		return CP_PASS; /* quoted options: L4 not where we look */
	if (q.ip.frag_off & bpf_htons(IP_OFFSET_))
		return CP_PASS; /* a non-first fragment quotes no ports */
	if (q.ip.saddr != cfg->masq_ip)
		return CP_PASS;

	addr_from_ip4(&k.src, q.ip.daddr);
	addr_from_ip4(&k.dst, q.ip.saddr);
	k.proto = q.ip.protocol;
	k.pad[0] = 0;
	k.pad[1] = 0;
	k.pad[2] = 0;
	if (q.ip.protocol == IPPROTO_TCP_ || q.ip.protocol == IPPROTO_UDP_) {
		__builtin_memcpy(&qport, &q.l4[0], sizeof(qport));
		__builtin_memcpy(&k.sport, &q.l4[2], sizeof(k.sport));
		port_off = CP_QL4_OFF;
	} else if (q.ip.protocol == IPPROTO_ICMP_) {
		if (q.l4[0] != ICMP_ECHO_)
			return CP_PASS; /* only echo requests are masqueraded */
		__builtin_memcpy(&qport, &q.l4[4], sizeof(qport));
		k.sport = 0;
		port_off = CP_QL4_OFF + 4;
	} else {
		return CP_PASS;
	}
	k.dport = qport;

	__u16 hport = bpf_ntohs(qport);

	if (hport < cfg->masq_port_min || hport > cfg->masq_port_max)
		return CP_PASS;
	v = bpf_map_lookup_elem(&cp_masq_rev, &k);
	if (!v)
		return CP_PASS; /* not a masqueraded flow: the node's own */
	orig_ip = v->addr.w[3];
	orig_port = v->port;

	/* outer destination: the IP header checksum only (no pseudo header) */
	if (bpf_l3_csum_replace(skb, CP_IP4_CSUM_OFF, cfg->masq_ip, orig_ip,
				sizeof(orig_ip)) < 0 ||
	    bpf_skb_store_bytes(skb, CP_IP4_DADDR_OFF, &orig_ip, sizeof(orig_ip), 0) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);

	/* quoted source address: quoted IP checksum, then the ICMP checksum
	 * for both the address and the quoted checksum word it changed */
	if (bpf_l3_csum_replace(skb, CP_QIP_CSUM_OFF, cfg->masq_ip, orig_ip,
				sizeof(orig_ip)) < 0 ||
	    bpf_l4_csum_replace(skb, CP_ICMP_CSUM_OFF, cfg->masq_ip, orig_ip,
				sizeof(orig_ip)) < 0 ||
	    bpf_skb_store_bytes(skb, CP_QIP_SADDR_OFF, &orig_ip, sizeof(orig_ip), 0) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	if (bpf_skb_load_bytes(skb, CP_QIP_CSUM_OFF, &ncsum, sizeof(ncsum)) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	/* the word is already stored: fold the change into the ICMP sum only */
	if (ncsum != q.ip.check &&
	    bpf_l4_csum_replace(skb, CP_ICMP_CSUM_OFF, q.ip.check, ncsum, sizeof(ncsum)) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);

	/* quoted source port / echo id */
	if (cp_icmp_word(skb, port_off, qport, orig_port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

/* Ingress of the uplink: reply to the masquerade address -> pod. */
static __always_inline int cp_masq_reverse(struct __sk_buff *skb)
{
	const struct cp_params *cfg = cp_get_params();
	const struct cp_masq_val *v;
	struct cp_pkt pkt;
	struct cp_masq_key k;
	struct cp_l4_layout l;

	if (!cfg || !cfg->masq_ip)
		return CP_PASS;
	if (cp_parse(skb, &pkt) != CP_PARSE_IP4)
		return CP_PASS;
	if (pkt.dst.w[3] != cfg->masq_ip)
		return CP_PASS;
	if ((pkt.flags & CP_PKT_FRAG) || pkt.l4_off != CP_L4_OFF)
		return CP_PASS;
	if (pkt.l4proto == IPPROTO_ICMP_) {
		__u8 type;

		if (bpf_skb_load_bytes(skb, CP_L4_OFF, &type, 1) < 0)
			return CP_PASS;
		if (type == ICMP_DEST_UNREACH_ || type == ICMP_TIME_EXCEEDED_)
			return cp_masq_icmp_error(skb, cfg);
	}
	if (cp_masq_tuple(skb, &pkt, 1, &k, &l) < 0)
		return CP_PASS;
	/* Every translated port (or ICMP id) lies in the configured range, so
	 * anything else - the VXLAN underlay on port 4789, the node's own
	 * connections on ephemeral ports - leaves before the LRU lookup.
	 * Contract: narrowing the range strands flows translated outside it
	 * (their replies are no longer reversed), so whoever narrows it
	 * flushes cp_masq_fwd/cp_masq_rev with it. */
	__u16 dport = bpf_ntohs(k.dport);

	if (dport < cfg->masq_port_min || dport > cfg->masq_port_max)
		return CP_PASS;
	v = bpf_map_lookup_elem(&cp_masq_rev, &k);
	if (!v)
		return CP_PASS; /* not ours: the node's own traffic */

	__be32 orig_ip = v->addr.w[3];
	__be16 orig_port = v->port;

	if (cp_masq_rewrite(skb, &l, CP_IP4_DADDR_OFF, k.dst.w[3], orig_ip,
			    l.dport_off, k.dport, orig_port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

#endif /* CP_MASQ_H */
