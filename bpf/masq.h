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
 * Ports expire (bpf/nat.h): every packet of a flow renews its reverse
 * entry's expiry, and a new flow takes over a port whose entry expired. Before,
 * a port stayed taken until the LRU evicted its entry: ~4.5k flows over
 * time from pods to one external address and port (DNS queries from fresh
 * sockets to an upstream resolver, say) took every port of the range for
 * that peer, and its masquerade failed for good (masq_no_port).
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
#include "nat.h"

/*
 * The tuple, rewrite, hash, port claim and ICMP-error helpers are shared
 * with the dual-address bridge (bpf/nat.h).
 */

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
 * Find or allocate the translated port of forward tuple `k` (a packet with
 * TCP flags `tcp`), making sure the reverse entry exists and renewing it.
 * Returns the port (network order) or 0.
 */
static __always_inline __be16 cp_masq_port(const struct cp_params *cfg,
					   const struct cp_masq_key *k,
					   struct cp_masq_key *rk,
					   struct cp_masq_val *v, __u8 tcp)
{
	const struct cp_masq_val *fv = bpf_map_lookup_elem(&cp_masq_fwd, k);
	__u32 min = cfg->masq_port_min, max = cfg->masq_port_max;
	__u32 now = cp_nat_now_s();
	struct cp_masq_val *cur;
	__be16 port;

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
	v->state = 0;
	v->expires_s = 0;
	cp_nat_renew(&v->state, &v->expires_s, k->proto, tcp, 0, now);

	if (fv) {
		port = fv->port;
		rk->dport = port;
		cur = bpf_map_lookup_elem(&cp_masq_rev, rk);
		if (!cur) {
			/* re-create the reverse entry if the LRU evicted it */
			bpf_map_update_elem(&cp_masq_rev, rk, v, BPF_ANY);
			return port;
		}
		if (cur->port == k->sport && cp_addr_eq(&cur->addr, &k->src)) {
			cp_nat_renew(&cur->state, &cur->expires_s, k->proto, tcp, 0, now);
			return port;
		}
		/* the port expired and another flow took it over: a new flow */
	}

	port = cp_nat_claim_expiring(&cp_masq_rev, rk, &rk->dport, v,
				     offsetof(struct cp_masq_val, expires_s), cp_nat_hash(k), min,
				     max, now, (void **)&cur);
	if (port && cur) {
		cur->addr = v->addr;
		cur->port = v->port;
		cur->state = v->state;
	}
	if (port) {
		struct cp_masq_val fwd = {};

		fwd.addr = rk->dst;
		fwd.port = port;
		if (bpf_map_update_elem(&cp_masq_fwd, k, &fwd, BPF_ANY) < 0) {
			bpf_map_delete_elem(&cp_masq_rev, rk);
			return 0;
		}
	}
	return port;
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
	err = cp_nat_tuple(skb, &pkt, 0, &k, &l);
	if (err == CP_NAT_TRUNCATED)
		return cp_drop(CP_DROP_MALFORMED);
	if (err < 0)
		return cp_drop(CP_DROP_MASQ_PROTO);
	/* After the kernel's DNAT too (a Service whose endpoint is some node's
	 * overlay port): translated, this would be VXLAN from this node. */
	if (k.proto == IPPROTO_UDP_ && k.dport == bpf_htons(CP_VXLAN_PORT))
		return cp_drop(CP_DROP_OVERLAY_PORT);

	port = cp_masq_port(cfg, &k, &rk, &v, cp_nat_tcp_flags(skb, &pkt));
	if (!port)
		return cp_drop(CP_DROP_MASQ_NO_PORT);
	if (cp_nat_rewrite(skb, &l, CP_IP4_SADDR_OFF, k.src.w[3], cfg->masq_ip,
			    l.sport_off, k.sport, port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
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
	__be16 orig_port;
	__be32 orig_ip;

	if (cp_icmp_quote_tuple(skb, &q, &k, &port_off) < 0)
		return CP_PASS;
	if (k.dst.w[3] != cfg->masq_ip)
		return CP_PASS;

	__u16 hport = bpf_ntohs(k.dport);

	if (hport < cfg->masq_port_min || hport > cfg->masq_port_max)
		return CP_PASS;
	v = bpf_map_lookup_elem(&cp_masq_rev, &k);
	if (!v)
		return CP_PASS; /* not a masqueraded flow: the node's own */
	orig_ip = v->addr.w[3];
	orig_port = v->port;

	/* outer destination and quoted source: masquerade address -> pod */
	if (cp_icmp_addr(skb, CP_IP4_DADDR_OFF, CP_QIP_SADDR_OFF, cfg->masq_ip, orig_ip) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	/* quoted source port / echo id */
	if (cp_icmp_word(skb, port_off, k.dport, orig_port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

/* Ingress of the uplink: reply to the masquerade address -> pod. */
static __always_inline int cp_masq_reverse(struct __sk_buff *skb)
{
	const struct cp_params *cfg = cp_get_params();
	struct cp_masq_val *v;
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
		if (cp_icmp_is_error(type))
			return cp_masq_icmp_error(skb, cfg);
	}
	if (cp_nat_tuple(skb, &pkt, 1, &k, &l) < 0)
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

	cp_nat_renew(&v->state, &v->expires_s, k.proto, cp_nat_tcp_flags(skb, &pkt), 1,
		     cp_nat_now_s());
	if (cp_nat_rewrite(skb, &l, CP_IP4_DADDR_OFF, k.dst.w[3], orig_ip,
			    l.dport_off, k.dport, orig_port) < 0)
		return cp_drop(CP_DROP_MASQ_REWRITE);
	return CP_PASS;
}

#endif /* CP_MASQ_H */
