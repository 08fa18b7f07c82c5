/* SPDX-License-Identifier: GPL-2.0 */
/*
 * netpol.h - Kubernetes NetworkPolicy on the default network (net 0):
 * ingress at the destination gate (bpf/deliver.h), egress in from_pod,
 * stateful through the connection tracker (bpf/ct.h). docs/policy.md has
 * the semantics; the agent compiles the maps (crates/agent/src/compile/
 * netpol.rs).
 *
 * Identities, not addresses, in the rules: pods with the same namespace,
 * labels and named container ports share an identity (a 31-bit id the
 * agent derives), so one rule serves every replica. Maps:
 *
 *   cp_np_eps    {net 0, addr} -> {identity, isolation flags}: every pod
 *                the agent knows (peers); the flags matter for this node's
 *                pods (subjects). No entry: a peer of no identity (it can
 *                match ipBlocks only), a subject that is not isolated.
 *   cp_np_rules  LPM {subject identity, dir, peer, proto | port bits} -> 1:
 *                the subject's policies admit `dir` traffic with the peer
 *                - an identity, CP_NP_PEER_ANY (a rule without peers), or
 *                CP_NP_PEER_CIDR | a CIDR class - on that protocol and
 *                destination port. Prefix 96: any protocol and port; 104:
 *                any port of the protocol; 112 + n: a port prefix (a range
 *                is a few prefixes, so one lookup answers a range).
 *   cp_np_cidrs  LPM {subject identity, dir | address bits} -> CIDR class:
 *                the longest ipBlock boundary (a cidr or an except) of the
 *                subject's rules containing the peer address. The agent
 *                gives each class the union of the ports of the rules whose
 *                ipBlock contains it and does not except it, so the longest
 *                match alone decides.
 *   cp_np_deny   the same keys as cp_np_rules: what the subject's deny rules
 *                (Cilium's ingressDeny/egressDeny) refuse. Consulted first,
 *                only for subjects flagged CP_NP_F_DENY_*; a deny wins over
 *                every allow and applies to non-isolated subjects too. The
 *                CIDR classes serve both maps.
 *   cp_np_epoch  the policy epoch: the agent bumps it after every sync that
 *                changed the maps above.
 *
 * Connection tracking: every net-0 flow of a pod is tracked, policed or
 * not, so a flow established before a policy appeared keeps its replies.
 * A packet is admitted when its flow's originating direction is admitted
 * by the current policy of this node's endpoint in it: the originator's
 * egress when the endpoint opened the flow, the responder's ingress when
 * it accepted it. The verdict is cached in the ct entry for one epoch;
 * after a policy change each flow's next packet is judged again, so a
 * change that denies a flow cuts the established ones too. The local
 * node's own flows into its pods (kubelet probes) are exempt, as
 * Kubernetes requires, and so are their replies (CP_CT_F_NP_NODE).
 */
#ifndef CP_NETPOL_H
#define CP_NETPOL_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "ct.h"

enum cp_np_abi {
	/* cp_np_ep.flags */
	CP_NP_F_ISOLATED_IN = 0x1,   /* a policy selects the pod for ingress */
	CP_NP_F_ISOLATED_OUT = 0x2,  /* a policy selects the pod for egress */
	CP_NP_F_DENY_IN = 0x4,       /* the pod has ingress deny rules (cp_np_deny) */
	CP_NP_F_DENY_OUT = 0x8,      /* the pod has egress deny rules */
	/* cp_np_rule_key.dir / cp_np_cidr_key.dir */
	CP_NP_INGRESS = 1,
	CP_NP_EGRESS = 2,
	/* cp_np_rule_key.peer: any peer; a CIDR class has the high bit set */
	CP_NP_PEER_ANY = 0xffffffff,
	CP_NP_PEER_CIDR = 0x80000000,
	/* Fixed bits of a rule key before the protocol (subject, dir, peer). */
	CP_NP_RULE_FIXED_BITS = 96,
	/* Fixed bits of a CIDR key before the address. */
	CP_NP_CIDR_FIXED_BITS = 64,
};

/* An endpoint (cp_np_eps value). 8 bytes. */
struct cp_np_ep {
	__u32 id;     /* identity, 1..=0x7fffffff */
	__u32 flags;  /* CP_NP_F_* */
};
CP_ABI_SIZE(struct cp_np_ep, 8);
CP_ABI_OFFSET(struct cp_np_ep, flags, 4);

/* cp_np_rules key. 20 bytes; prefixlen counts the bits after it. */
struct cp_np_rule_key {
	__u32 prefixlen;
	__u32 subject;   /* the identity whose policies these are */
	__u8 dir;        /* CP_NP_INGRESS / CP_NP_EGRESS */
	__u8 pad[3];
	__u32 peer;      /* identity, CP_NP_PEER_ANY or CP_NP_PEER_CIDR | class */
	__u8 proto;      /* IP protocol */
	__u8 pad2;
	__be16 port;     /* destination port, network order */
};
CP_ABI_SIZE(struct cp_np_rule_key, 20);
CP_ABI_OFFSET(struct cp_np_rule_key, subject, 4);
CP_ABI_OFFSET(struct cp_np_rule_key, dir, 8);
CP_ABI_OFFSET(struct cp_np_rule_key, pad, 9);
CP_ABI_OFFSET(struct cp_np_rule_key, peer, 12);
CP_ABI_OFFSET(struct cp_np_rule_key, proto, 16);
CP_ABI_OFFSET(struct cp_np_rule_key, pad2, 17);
CP_ABI_OFFSET(struct cp_np_rule_key, port, 18);

/* cp_np_cidrs key. 28 bytes. */
struct cp_np_cidr_key {
	__u32 prefixlen;
	__u32 subject;
	__u8 dir;
	__u8 pad[3];
	struct addr128 addr;
};
CP_ABI_SIZE(struct cp_np_cidr_key, 28);
CP_ABI_OFFSET(struct cp_np_cidr_key, subject, 4);
CP_ABI_OFFSET(struct cp_np_cidr_key, dir, 8);
CP_ABI_OFFSET(struct cp_np_cidr_key, pad, 9);
CP_ABI_OFFSET(struct cp_np_cidr_key, addr, 12);

#define CP_MAX_NP_EPS 65536
#define CP_MAX_NP_RULES 131072
#define CP_MAX_NP_CIDRS 16384
#define CP_MAX_NP_DENY 16384

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_NP_EPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_ep_key);
	__type(value, struct cp_np_ep);
} cp_np_eps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_NP_RULES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_np_rule_key);
	__type(value, __u32);
} cp_np_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_NP_DENY);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_np_rule_key);
	__type(value, __u32);
} cp_np_deny SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_NP_CIDRS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_np_cidr_key);
	__type(value, __u32);
} cp_np_cidrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} cp_np_epoch SEC(".maps");

/* Working memory of one check (the hooks' stacks have no room for it). */
struct cp_np_scratch {
	struct cp_ct_pkt t;          /* the packet's tuple */
	struct cp_ct_pkt rel;        /* an ICMP error's quoted tuple */
	struct cp_ct_key swapped;
	struct cp_np_rule_key rk;
	struct cp_np_cidr_key ck;
	struct cp_ep_key ek;
};

/* Per-CPU, like cp_scratch_sg (bpf/policy.h): not state, never pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct cp_np_scratch));
} cp_scratch_np SEC(".maps");

static __always_inline int cp_np_ported(__u8 proto)
{
	return proto == IPPROTO_TCP_ || proto == IPPROTO_UDP_ || proto == IPPROTO_SCTP_;
}

/*
 * Does `rules` (cp_np_rules or cp_np_deny) hold a rule of identity
 * s->rk.subject for s->rk.dir traffic with the peer at s->ek.addr, protocol
 * s->rk.proto, destination port s->rk.port? The peer's identity, any peer,
 * then the peer's CIDR class: 1 or 0.
 */
static __always_inline int cp_np_rules_match(struct cp_np_scratch *s, void *rules)
{
	const struct cp_np_ep *peer;
	const __u32 *class;

	s->rk.prefixlen = CP_NP_RULE_FIXED_BITS + 32;
	s->rk.pad[0] = 0;
	s->rk.pad[1] = 0;
	s->rk.pad[2] = 0;
	s->rk.pad2 = 0;
	s->ek.net = CP_NET_DEFAULT;
	peer = bpf_map_lookup_elem(&cp_np_eps, &s->ek);
	if (peer && peer->id) {
		s->rk.peer = peer->id;
		if (bpf_map_lookup_elem(rules, &s->rk))
			return 1;
	}
	s->rk.peer = CP_NP_PEER_ANY;
	if (bpf_map_lookup_elem(rules, &s->rk))
		return 1;
	s->ck.prefixlen = CP_NP_CIDR_FIXED_BITS + 128;
	s->ck.subject = s->rk.subject;
	s->ck.dir = s->rk.dir;
	s->ck.pad[0] = 0;
	s->ck.pad[1] = 0;
	s->ck.pad[2] = 0;
	s->ck.addr = s->ek.addr;
	class = bpf_map_lookup_elem(&cp_np_cidrs, &s->ck);
	if (class) {
		s->rk.peer = CP_NP_PEER_CIDR | *class;
		if (bpf_map_lookup_elem(rules, &s->rk))
			return 1;
	}
	return 0;
}

/*
 * The verdict of identity `subject` (flags `flags`) on a new `dir` flow with
 * the peer at `peer`, protocol `proto`, destination port `dport`: its deny
 * rules first (when it has any), then, when it is isolated for `dir`, its
 * allow rules. 1 to admit, 0 to refuse.
 */
static __always_inline int cp_np_judge(struct cp_np_scratch *s, __u32 subject, __u32 flags,
				       __u8 dir, __u8 proto, __be16 dport,
				       const struct addr128 *peer)
{
	__u32 deny = dir == CP_NP_INGRESS ? CP_NP_F_DENY_IN : CP_NP_F_DENY_OUT;
	__u32 iso = dir == CP_NP_INGRESS ? CP_NP_F_ISOLATED_IN : CP_NP_F_ISOLATED_OUT;

	if (!(flags & (deny | iso)))
		return 1;
	s->rk.subject = subject;
	s->rk.dir = dir;
	s->rk.proto = proto;
	s->rk.port = cp_np_ported(proto) ? dport : 0;
	s->ek.addr = *peer;
	if ((flags & deny) && cp_np_rules_match(s, &cp_np_deny))
		return 0;
	if (!(flags & iso))
		return 1;
	/* the deny lookup left rk.peer behind: the match sets it again */
	return cp_np_rules_match(s, &cp_np_rules);
}

/*
 * The NetworkPolicy check of a net-0 pod of this node for one packet:
 * `dir` is the pod's side of it (CP_NP_EGRESS: the pod, pkt->src, sends it
 * - from_pod; CP_NP_INGRESS: the pod, pkt->dst, receives it - the gate).
 * `node`: the local node's own packet into the pod (ingress only), exempt.
 * 0 to admit, else the drop reason.
 */
static __noinline int cp_np_check(struct __sk_buff *skb, const struct cp_pkt *pkt, __u8 dir,
				  int node)
{
	const struct cp_ct_pkt *t;
	const struct cp_ct_key *orig;
	const struct cp_np_ep *ep;
	const __u32 *cur;
	struct cp_np_scratch *s;
	struct cp_ct_entry *e;
	__u32 zero = 0, epoch = 0, id = 0, flags = 0, bit;
	__u32 deny = dir == CP_NP_INGRESS ? CP_DROP_NP_INGRESS : CP_DROP_NP_EGRESS;
	int error = 0;
	__u8 d, role;

	s = bpf_map_lookup_elem(&cp_scratch_np, &zero);
	if (!s)
		return deny;
	/* to itself (the kernel hairpins it) */
	if (cp_addr_eq(&pkt->src, &pkt->dst))
		return 0;
	s->ek.net = CP_NET_DEFAULT;
	s->ek.addr = dir == CP_NP_INGRESS ? pkt->dst : pkt->src;
	ep = bpf_map_lookup_elem(&cp_np_eps, &s->ek);
	if (ep) {
		id = ep->id;
		flags = ep->flags;
	}
	cur = bpf_map_lookup_elem(&cp_np_epoch, &zero);
	if (cur)
		epoch = *cur;

	if (cp_ct_tuple(skb, pkt, CP_NET_DEFAULT, &s->t) < 0) {
		/* no L4 header to judge (a later fragment, a truncated one) */
		if (node || !(flags & (dir == CP_NP_INGRESS
					       ? CP_NP_F_ISOLATED_IN | CP_NP_F_DENY_IN
					       : CP_NP_F_ISOLATED_OUT | CP_NP_F_DENY_OUT)))
			return 0;
		return CP_DROP_NP_NO_L4;
	}
	t = &s->t;
	/* an ICMP error is judged as the flow it quotes, when there is one */
	if (cp_ct_icmp_error(s->t.key.proto, s->t.icmp_type)) {
		error = 1;
		if (cp_ct_related(skb, pkt, CP_NET_DEFAULT, &s->rel) == 0) {
			e = cp_ct_find(&s->rel, &s->swapped, &d);
			if (e)
				t = &s->rel;
			else
				e = cp_ct_find(&s->t, &s->swapped, &d);
		} else {
			e = cp_ct_find(&s->t, &s->swapped, &d);
		}
	} else {
		e = cp_ct_find(&s->t, &s->swapped, &d);
	}

	if (!e) {
		/* a new flow: this packet is its originator's */
		if (!node && !cp_np_judge(s, id, flags, dir, t->key.proto, t->key.dport,
					  dir == CP_NP_INGRESS ? &pkt->src : &pkt->dst))
			return deny;
		/* an error starts no flow */
		if (!error)
			cp_ct_create(t, node ? CP_CT_F_NP_NODE
					     : (dir == CP_NP_INGRESS ? CP_CT_F_NP_DST : CP_CT_F_NP_SRC),
				     epoch);
		return 0;
	}
	/* the node's own flow into its pod, and the pod's replies */
	if (e->flags & CP_CT_F_NP_NODE) {
		if (!error)
			cp_ct_touch(e, t, d, 0);
		return 0;
	}
	/* The flow in its originating direction, and the pod's role in it:
	 * the originator (its egress judges) or the responder (its ingress). */
	orig = d == CP_CT_ORIG ? &t->key : &s->swapped;
	role = cp_addr_eq(&orig->src, &s->ek.addr) ? CP_NP_EGRESS : CP_NP_INGRESS;
	bit = role == CP_NP_EGRESS ? CP_CT_F_NP_SRC : CP_CT_F_NP_DST;
	if (e->epoch != epoch || !(e->flags & bit)) {
		if (!cp_np_judge(s, id, flags, role, orig->proto, orig->dport,
				 role == CP_NP_EGRESS ? &orig->dst : &orig->src))
			return deny;
		if (error)
			return 0;
		/* the verdicts of an older epoch are void */
		if (e->epoch != epoch) {
			e->flags &= ~(CP_CT_F_NP_SRC | CP_CT_F_NP_DST);
			e->epoch = epoch;
		}
		e->flags |= bit;
	}
	if (!error)
		cp_ct_touch(e, t, d, 0);
	return 0;
}

/* Ingress of the net-0 pod pkt->dst; `node`: the local node's own packet. */
static __always_inline int cp_np_ingress(struct __sk_buff *skb, const struct cp_pkt *pkt, int node)
{
	return cp_np_check(skb, pkt, CP_NP_INGRESS, node);
}

/* Egress of the net-0 pod pkt->src. */
static __always_inline int cp_np_egress(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	return cp_np_check(skb, pkt, CP_NP_EGRESS, 0);
}

#endif /* CP_NETPOL_H */
