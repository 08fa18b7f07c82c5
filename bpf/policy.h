/* SPDX-License-Identifier: GPL-2.0 */
/*
 * policy.h - the SecurityGroup engine: per-endpoint ingress (at the
 * destination gate, bpf/deliver.h) and egress (in from_pod), stateful
 * through the connection tracker (bpf/ct.h). docs/datapath.md,
 * "SecurityGroups", has the semantics; the agent compiles the maps
 * (crates/agent/src/compile/security_groups.rs).
 *
 * Identities, not bitmaps: a group is {net, id} with a 32-bit id (the agent
 * derives it), so a VPC has no group cap. Maps:
 *
 *   cp_sg_members  {net, addr} -> the endpoint's groups (at most
 *                  CP_SG_MAX_GROUPS). No entry: the endpoint is in no
 *                  group and unrestricted.
 *   cp_sg_rules    LPM {net, group, peer net, peer, dir, proto | port bits}
 *                  -> 1. The subject is the group whose rule it is (the
 *                  destination's for ingress, the source's for egress); the
 *                  peer is a group {peer net, id} - peer net differs for a
 *                  group of a peered VPC - or, with peer net
 *                  CP_SG_PEER_CIDR, a CIDR class from cp_sg_cidrs. A port
 *                  range is a handful of prefixes over the 16 port bits
 *                  (at most 30 for any range, 1 for "any port"), so one
 *                  lookup answers "is this port in any allowed range"
 *                  without a loop over ranges; the ICMP "port" is the type.
 *   cp_sg_cidrs    LPM {net, group, dir | address bits} -> CIDR class: the
 *                  longest CIDR of the group's rules containing the peer
 *                  address. The agent gives each class the union of the
 *                  ports of every rule whose CIDR contains it, so the
 *                  longest match alone decides.
 *
 * Cost for an endpoint in no group: one hash lookup (cp_sg_members miss).
 * For a policed one: the ct lookups, then per subject group (n <= 16) one
 * rule lookup per peer group (m <= 16) and two for CIDRs - n * (m + 2) LPM
 * lookups for a new flow in the worst case, 1-3 in the common one (one
 * group each side); established flows stop at the ct.
 */
#ifndef CP_POLICY_H
#define CP_POLICY_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "ct.h"

enum cp_sg_abi {
	/* Groups an endpoint can be a member of. */
	CP_SG_MAX_GROUPS = 16,
	/* cp_sg_rules.peer_net of a CIDR class peer. */
	CP_SG_PEER_CIDR = 0xffffffff,
	/* cp_sg_rules.dir / cp_sg_cidrs.dir */
	CP_SG_INGRESS = 1,
	CP_SG_EGRESS = 2,
	/* Fixed bits of a rule key before the port (all but the port). */
	CP_SG_RULE_FIXED_BITS = 144,
	/* Fixed bits of a CIDR key before the address. */
	CP_SG_CIDR_FIXED_BITS = 96,
};

/* An endpoint's groups (cp_sg_members value). 68 bytes. */
struct cp_sg_groups {
	__u32 count;
	__u32 ids[CP_SG_MAX_GROUPS];
};
CP_ABI_SIZE(struct cp_sg_groups, 68);
CP_ABI_OFFSET(struct cp_sg_groups, ids, 4);

/* cp_sg_rules key. 24 bytes; prefixlen counts the bits after it. */
struct cp_sg_rule_key {
	__u32 prefixlen;
	__u32 net;       /* the subject group's network */
	__u32 group;     /* the subject group */
	__u32 peer_net;  /* the peer group's network, or CP_SG_PEER_CIDR */
	__u32 peer;      /* the peer group, or a CIDR class */
	__u8 dir;        /* CP_SG_INGRESS / CP_SG_EGRESS */
	__u8 proto;      /* IP protocol */
	__be16 port;     /* destination port, or the ICMP type; network order */
};
CP_ABI_SIZE(struct cp_sg_rule_key, 24);
CP_ABI_OFFSET(struct cp_sg_rule_key, net, 4);
CP_ABI_OFFSET(struct cp_sg_rule_key, group, 8);
CP_ABI_OFFSET(struct cp_sg_rule_key, peer_net, 12);
CP_ABI_OFFSET(struct cp_sg_rule_key, peer, 16);
CP_ABI_OFFSET(struct cp_sg_rule_key, dir, 20);
CP_ABI_OFFSET(struct cp_sg_rule_key, proto, 21);
CP_ABI_OFFSET(struct cp_sg_rule_key, port, 22);

/* cp_sg_cidrs key. 32 bytes. */
struct cp_sg_cidr_key {
	__u32 prefixlen;
	__u32 net;
	__u32 group;
	__u8 dir;
	__u8 pad[3];
	struct addr128 addr;
};
CP_ABI_SIZE(struct cp_sg_cidr_key, 32);
CP_ABI_OFFSET(struct cp_sg_cidr_key, net, 4);
CP_ABI_OFFSET(struct cp_sg_cidr_key, group, 8);
CP_ABI_OFFSET(struct cp_sg_cidr_key, dir, 12);
CP_ABI_OFFSET(struct cp_sg_cidr_key, pad, 13);
CP_ABI_OFFSET(struct cp_sg_cidr_key, addr, 16);

#define CP_MAX_SG_MEMBERS 65536
#define CP_MAX_SG_RULES 65536
#define CP_MAX_SG_CIDRS 16384

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_SG_MEMBERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_ep_key);
	__type(value, struct cp_sg_groups);
} cp_sg_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_SG_RULES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_sg_rule_key);
	__type(value, __u32);
} cp_sg_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_SG_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_sg_cidr_key);
	__type(value, __u32);
} cp_sg_cidrs SEC(".maps");

/*
 * A rule query (the subject, the peer, what the packet is). The evaluation
 * is a global BPF function, verified once on its own: inlined, its nested
 * bounded loops would be re-walked at every call site and on every path
 * reaching it, and to_pod alone then hit the verifier's 1M instruction
 * limit. A global function's pointer argument must point at initialised
 * memory of the struct's size: callers fill every field.
 */
struct cp_sg_query {
	struct cp_ep_key subj;       /* the endpoint whose groups' rules apply */
	struct cp_ep_key peer;       /* the other side */
	struct cp_sg_rule_key rk;    /* scratch */
	struct cp_sg_cidr_key ck;    /* scratch */
	__u8 dir;
	__u8 proto;
	__be16 port;                 /* destination port, or the ICMP type */
};

/*
 * Does any group of the subject allow `dir` traffic with the peer, protocol
 * `proto`, destination port (or ICMP type) `port`? 1 or 0.
 */
__attribute__((noinline)) int cp_sg_rules_allow(struct cp_sg_query *q)
{
	const struct cp_sg_groups *subj, *peer;
	__u32 n, m = 0, i, j;

	if (!q)
		return 0;
	subj = bpf_map_lookup_elem(&cp_sg_members, &q->subj);
	if (!subj)
		return 0;
	n = subj->count;
	peer = bpf_map_lookup_elem(&cp_sg_members, &q->peer);
	if (peer)
		m = peer->count;

	q->rk.net = q->subj.net;
	q->rk.dir = q->dir;
	q->rk.proto = q->proto;
	q->rk.port = q->port;
	q->ck.prefixlen = CP_SG_CIDR_FIXED_BITS + 128;
	q->ck.net = q->subj.net;
	q->ck.dir = q->dir;
	q->ck.pad[0] = 0;
	q->ck.pad[1] = 0;
	q->ck.pad[2] = 0;
	q->ck.addr = q->peer.addr;
	for (i = 0; i < CP_SG_MAX_GROUPS; i++) {
		const __u32 *class;

		if (i >= n)
			break;
		q->rk.prefixlen = CP_SG_RULE_FIXED_BITS + 16;
		q->rk.group = subj->ids[i];
		q->rk.peer_net = q->peer.net;
		for (j = 0; j < CP_SG_MAX_GROUPS; j++) {
			if (j >= m || !peer)
				break;
			q->rk.peer = peer->ids[j];
			if (bpf_map_lookup_elem(&cp_sg_rules, &q->rk))
				return 1;
		}
		q->ck.group = subj->ids[i];
		class = bpf_map_lookup_elem(&cp_sg_cidrs, &q->ck);
		if (class) {
			q->rk.peer_net = CP_SG_PEER_CIDR;
			q->rk.peer = *class;
			if (bpf_map_lookup_elem(&cp_sg_rules, &q->rk))
				return 1;
		}
	}
	return 0;
}

/* Scratch for one check (kept off the hook's own variables). */
struct cp_sg_scratch {
	struct cp_ct_pkt t;
	struct cp_ct_key swapped;
	struct cp_sg_query q;
};

/*
 * Per-CPU working memory for cp_sg_check(): the stack of from_pod, the
 * bridge and the gate together leaves no 240 bytes for it (BPF's 512-byte
 * limit covers the whole call chain). A tc program runs to completion on
 * its CPU and the checks run one after the other, so one slot per CPU is
 * enough. Not state: unpinned, and its value is raw bytes (no ABI struct);
 * the ABI check knows `cp_scratch_*` maps as such.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct cp_sg_scratch));
} cp_scratch_sg SEC(".maps");

/*
 * The check of one endpoint (the subject, {subj_net, subj_addr}) for one
 * packet in direction `dir`: 0 to admit, else the drop reason. Stateful:
 * a packet of a flow this endpoint's side already admitted passes on the ct
 * alone; a new flow the rules admit is tracked.
 */
static __always_inline int cp_sg_check(struct __sk_buff *skb, const struct cp_pkt *pkt,
				       __u32 subj_net, const struct addr128 *subj_addr,
				       __u32 peer_net, const struct addr128 *peer_addr, __u8 dir)
{
	const struct cp_sg_groups *subj;
	struct cp_sg_scratch *s;
	struct cp_ct_entry *e;
	__u32 need, own, zero = 0;
	__be16 port;
	__u8 d;

	s = bpf_map_lookup_elem(&cp_scratch_sg, &zero);
	if (!s)
		return dir == CP_SG_INGRESS ? CP_DROP_SG_INGRESS : CP_DROP_SG_EGRESS;
	s->q.subj.net = subj_net;
	s->q.subj.addr = *subj_addr;
	subj = bpf_map_lookup_elem(&cp_sg_members, &s->q.subj);
	if (!subj)
		return 0; /* in no group: unrestricted */
	/* to itself (the kernel hairpins it) */
	if (subj_net == peer_net && pkt->src.w[0] == pkt->dst.w[0] &&
	    pkt->src.w[1] == pkt->dst.w[1] && pkt->src.w[2] == pkt->dst.w[2] &&
	    pkt->src.w[3] == pkt->dst.w[3])
		return 0;
	if (cp_ct_tuple(skb, pkt, subj_net < peer_net ? subj_net : peer_net, &s->t) < 0)
		return CP_DROP_SG_NO_L4;

	own = dir == CP_SG_INGRESS ? CP_CT_F_DST_OK : CP_CT_F_SRC_OK;
	e = cp_ct_find(&s->t, &s->swapped, &d);
	/* Admitted already if this endpoint admitted the flow in its role in
	 * it: `own` in the originator's direction (its packet has this
	 * direction's role); in the reply direction the subject plays the
	 * other role (the responder sends, the originator receives). */
	need = d == CP_CT_REPLY ? (own ^ (CP_CT_F_SRC_OK | CP_CT_F_DST_OK)) : own;
	if (e && (e->flags & need)) {
		cp_ct_touch(e, &s->t, d, 0);
		return 0;
	}

	if (s->t.key.proto == IPPROTO_ICMP_ || s->t.key.proto == IPPROTO_ICMPV6_)
		port = bpf_htons(s->t.icmp_type);
	else
		port = s->t.key.dport;
	__builtin_memset(&s->q, 0, sizeof(s->q));
	s->q.subj.net = subj_net;
	s->q.subj.addr = *subj_addr;
	s->q.peer.net = peer_net;
	s->q.peer.addr = *peer_addr;
	s->q.dir = dir;
	s->q.proto = s->t.key.proto;
	s->q.port = port;
	if (!cp_sg_rules_allow(&s->q))
		return dir == CP_SG_INGRESS ? CP_DROP_SG_INGRESS : CP_DROP_SG_EGRESS;

	if (!e)
		cp_ct_create(&s->t, own, 0);
	else
		/* the originator's direction gains this side's verdict; a
		 * reply-direction packet the rules admit on their own adds none */
		cp_ct_touch(e, &s->t, d, d == CP_CT_ORIG ? own : 0);
	return 0;
}

/*
 * Ingress: may `pkt` enter the endpoint {net, pkt->dst}? The source is
 * {src_net, pkt->src}; src_net is `net` except for traffic between peered
 * networks. 0 or the drop reason.
 *
 * No source address is exempt here: the node's flows through the fabric-IP
 * bridge (kubelet probes, from 169.254.1.1 or fe80::1) are exempt by where
 * they come from, not by their address - the bridge's gate skips this check
 * for the packets it translates, and from_pod reverses their replies before
 * the egress check (bpf/bridge.h). A packet merely claiming the gateway as
 * its source is judged like any other.
 */
static __noinline int cp_sg_ingress(struct __sk_buff *skb, const struct cp_pkt *pkt,
					 __u32 net, __u32 src_net)
{
	return cp_sg_check(skb, pkt, net, &pkt->dst, src_net, &pkt->src, CP_SG_INGRESS);
}

/* Egress: may the endpoint {net, pkt->src} send `pkt`? 0 or the drop reason. */
static __noinline int cp_sg_egress(struct __sk_buff *skb, const struct cp_pkt *pkt,
					__u32 net, __u32 dst_net)
{
	return cp_sg_check(skb, pkt, net, &pkt->src, dst_net, &pkt->dst, CP_SG_EGRESS);
}

#endif /* CP_POLICY_H */
