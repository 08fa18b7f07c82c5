/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hostfw.h - the node's own firewall: HostFirewall and Cilium host policies
 * (docs/policy.md, "Host firewall"), at the cgroup v2 socket hooks
 * (cgroup_skb ingress/egress at --cgroup-root): every packet a socket of
 * the node receives or sends passes them, whichever device or path it took
 * (the uplink, the overlay, a pod's veth), and nothing that is only
 * forwarded (pod traffic) does.
 *
 * The rules are NetworkPolicy's engine (bpf/netpol.h) for one more
 * subject: the host's pseudo identity CP_NP_HOST_ID, whose flags live in
 * cp_np_eps under the key {CP_NP_HOST_NET, ::}. Judged: packets whose local
 * address (destination in, source out) is one of this node's addresses
 * (cp_node_remotes entries pointing at this node), so a pod's own sockets
 * (its netns, its address) and loopback are not. Structurally exempt, so
 * the firewall never locks the node out of its cluster: traffic with
 * another node's address (the overlay, kubelets, the control plane on
 * nodes), ICMP (errors, PMTU), and the node's own flows into its pods.
 *
 * State: TCP is judged on its SYN (a connection attempt); everything else
 * of a connection belongs to a socket the kernel's TCP state machine only
 * keeps for admitted connections. UDP and SCTP are judged per flow and
 * tracked in cp_ct (zone CP_CT_ZONE_HOST), so the replies of an admitted
 * flow pass both ways. A policy change applies to new connections and
 * flows; established ones continue (the ct entry idles out).
 */
#ifndef CP_HOSTFW_H
#define CP_HOSTFW_H

#include "netpol.h"

enum cp_hostfw_abi {
	/* cp_np_eps key net of the host's pseudo endpoint (address ::) */
	CP_NP_HOST_NET = 0xffffffff,
	/* the host's identity in cp_np_rules/cp_np_deny/cp_np_cidrs */
	CP_NP_HOST_ID = 0x7fffffff,
	/* cp_ct zone of the node's own UDP/SCTP flows */
	CP_CT_ZONE_HOST = 0xfffffffe,
};

#define CP_TCP_ACK 0x10

/* An IP packet at a cgroup_skb hook (the data starts at the IP header). */
static __always_inline int cp_parse_l3(struct __sk_buff *skb, struct cp_pkt *p)
{
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
			return CP_PARSE_BAD;
		if (ip.version != 4 || ip.ihl < 5)
			return CP_PARSE_BAD;
		addr_from_ip4(&p->src, ip.saddr);
		addr_from_ip4(&p->dst, ip.daddr);
		p->l4_off = ip.ihl * 4;
		p->l4proto = ip.protocol;
		p->flags = (ip.frag_off & bpf_htons(IP_MF_ | IP_OFFSET_)) ? CP_PKT_FRAG : 0;
		if (ip.frag_off & bpf_htons(IP_OFFSET_))
			p->flags |= CP_PKT_LATER_FRAG;
		p->pad = 0;
		return CP_PARSE_IP4;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
			return CP_PARSE_BAD;
		if (ip6.version != 6)
			return CP_PARSE_BAD;
		addr_from_ip6(&p->src, &ip6.saddr);
		addr_from_ip6(&p->dst, &ip6.daddr);
		p->l4_off = sizeof(struct ipv6hdr);
		p->l4proto = ip6.nexthdr;
		p->flags = 0;
		p->pad = 0;
		return CP_PARSE_IP6;
	}
	return CP_PARSE_OTHER;
}

/* 1 to let the packet through, 0 to drop it (cgroup_skb's verdicts). */
static __noinline int cp_host_check(struct __sk_buff *skb, __u8 dir)
{
	__u32 flags_dir = dir == CP_NP_INGRESS ? CP_NP_F_ISOLATED_IN | CP_NP_F_DENY_IN
					       : CP_NP_F_ISOLATED_OUT | CP_NP_F_DENY_OUT;
	__u32 reason = dir == CP_NP_INGRESS ? CP_DROP_HOST_INGRESS : CP_DROP_HOST_EGRESS;
	const struct cp_params *cfg;
	const struct cp_remote *rem;
	const struct cp_np_ep *host;
	struct cp_np_scratch *s;
	struct cp_ct_entry *e;
	struct cp_pkt pkt;
	__u32 zero = 0, flags;
	__u8 d;
	int parsed;

	s = bpf_map_lookup_elem(&cp_scratch_np, &zero);
	if (!s)
		return 1;
	s->ek.net = CP_NP_HOST_NET;
	__builtin_memset(&s->ek.addr, 0, sizeof(s->ek.addr));
	host = bpf_map_lookup_elem(&cp_np_eps, &s->ek);
	if (!host || !(host->flags & flags_dir))
		return 1; /* no host policy for this direction: the common case */
	flags = host->flags;
	parsed = cp_parse_l3(skb, &pkt);
	if (parsed != CP_PARSE_IP4 && parsed != CP_PARSE_IP6)
		return 1; /* not IP: not ours to judge */

	/* only the node's own addresses: not a pod's sockets, not loopback */
	rem = bpf_map_lookup_elem(&cp_node_remotes,
				  dir == CP_NP_INGRESS ? &pkt.dst : &pkt.src);
	cfg = cp_get_params();
	if (!rem || !cfg || rem->tunnel_ip != cfg->node_ip)
		return 1;
	/* structural exemptions: the other nodes, ICMP */
	if (bpf_map_lookup_elem(&cp_node_remotes, dir == CP_NP_INGRESS ? &pkt.src : &pkt.dst))
		return 1;
	if (pkt.l4proto == IPPROTO_ICMP_ || pkt.l4proto == IPPROTO_ICMPV6_)
		return 1;
	/* the node's own flows into its pods (the kubelet's probes) */
	if (dir == CP_NP_EGRESS) {
		s->ek.net = CP_NET_DEFAULT;
		s->ek.addr = pkt.dst;
		if (bpf_map_lookup_elem(&cp_locals, &s->ek))
			return 1;
	}

	if (cp_ct_tuple(skb, &pkt, CP_CT_ZONE_HOST, &s->t) < 0) {
		cp_drop(reason); /* no L4 header to judge: fail closed */
		return 0;
	}
	if (s->t.key.proto == IPPROTO_TCP_) {
		/* only a connection attempt is judged; the rest of a TCP
		 * connection belongs to a socket the kernel keeps only for
		 * admitted connections */
		if (!(s->t.tcp_flags & CP_TCP_SYN) || (s->t.tcp_flags & CP_TCP_ACK))
			return 1;
	} else {
		e = cp_ct_find(&s->t, &s->swapped, &d);
		if (e) {
			cp_ct_touch(e, &s->t, d, 0);
			return 1;
		}
	}
	if (!cp_np_judge(s, CP_NP_HOST_ID, flags, dir, s->t.key.proto, s->t.key.dport,
			 dir == CP_NP_INGRESS ? &pkt.src : &pkt.dst)) {
		cp_drop(reason);
		return 0;
	}
	if (s->t.key.proto != IPPROTO_TCP_)
		cp_ct_create(&s->t, 0, 0);
	return 1;
}

#endif /* CP_HOSTFW_H */
