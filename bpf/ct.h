/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ct.h - connection tracking, independent of any one policy.
 *
 * One LRU entry per flow, keyed by {zone, 5-tuple} in the direction the
 * flow's first tracked packet took (the originator's). A packet is looked
 * up as is (a hit: the originator's direction) and then swapped (a hit:
 * the reply direction). The policy engines (bpf/policy.h, NetworkPolicy
 * later) own the meaning of the entry's CP_CT_F_*_OK bits: the tracker
 * only keeps state and time.
 *
 * Tracked: TCP, UDP and SCTP by ports, ICMP/ICMPv6 echo by identifier (an
 * echo request is {id, 0}, an echo reply {0, id}, so a reply's swapped key
 * is its request's). Other ICMP types and other protocols have no ports
 * (0, 0); an ICMP error is related to the flow its quoted header names
 * (cp_ct_related()).
 *
 * Timeouts (idle; every tracked packet renews): see enum cp_ct_timeouts.
 * An expired entry is a miss and is overwritten by the next new flow; the
 * LRU bounds memory and evicts the least recently used flows when full
 * (CP_MAX_CT), which is fail closed for policed endpoints: the next packet
 * is a new flow and is checked against the policy again.
 *
 * The zone is the network the flow lives in (its VPC's net); a flow between
 * two networks (peering) must use the same zone in both directions, so the
 * policy passes min(src net, dst net).
 */
#ifndef CP_CT_H
#define CP_CT_H

#include "common.h"
#include "parse.h"

/* The tracked 5-tuple in one direction. 44 bytes. */
struct cp_ct_key {
	__u32 zone;
	struct addr128 src;
	struct addr128 dst;
	__be16 sport;        /* or the echo id (request) / 0 (reply) */
	__be16 dport;        /* or 0 (request) / the echo id (reply) */
	__u8 proto;
	__u8 pad[3];
};
CP_ABI_SIZE(struct cp_ct_key, 44);
CP_ABI_ALIGN(struct cp_ct_key, 4);
CP_ABI_OFFSET(struct cp_ct_key, src, 4);
CP_ABI_OFFSET(struct cp_ct_key, dst, 20);
CP_ABI_OFFSET(struct cp_ct_key, sport, 36);
CP_ABI_OFFSET(struct cp_ct_key, dport, 38);
CP_ABI_OFFSET(struct cp_ct_key, proto, 40);
CP_ABI_OFFSET(struct cp_ct_key, pad, 41);

/* A tracked flow. 16 bytes. */
struct cp_ct_entry {
	__u64 expires_ns;    /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u32 flags;         /* CP_CT_F_* */
	__u32 epoch;         /* NetworkPolicy: the cp_np_epoch its CP_CT_F_NP_* bits hold for */
};
CP_ABI_SIZE(struct cp_ct_entry, 16);
CP_ABI_ALIGN(struct cp_ct_entry, 8);
CP_ABI_OFFSET(struct cp_ct_entry, flags, 8);
CP_ABI_OFFSET(struct cp_ct_entry, epoch, 12);

enum cp_ct_flags {
	CP_CT_F_SEEN_REPLY = 0x1,  /* a packet went the reply direction */
	CP_CT_F_FIN_ORIG = 0x2,    /* the originator sent FIN */
	CP_CT_F_FIN_REPLY = 0x4,   /* the responder sent FIN */
	CP_CT_F_CLOSED = 0x8,      /* RST seen, or FIN both ways */
	/* Policy verdicts (the tracker never sets these): the originator's
	 * egress admitted the flow on this node / the responder's ingress did. */
	CP_CT_F_SRC_OK = 0x100,
	CP_CT_F_DST_OK = 0x200,
	/* NetworkPolicy's verdicts (bpf/netpol.h), valid for the entry's
	 * epoch only: the originator's egress admitted the flow, the
	 * responder's ingress did; the flow is the local node's own (exempt). */
	CP_CT_F_NP_SRC = 0x1000,
	CP_CT_F_NP_DST = 0x2000,
	CP_CT_F_NP_NODE = 0x4000,
};

/* Idle timeouts, nanoseconds. A 64-bit enum so the object records them. */
enum cp_ct_timeouts {
	CP_CT_TCP_SYN_NS = 60ULL * 1000 * 1000 * 1000,          /* no reply yet */
	CP_CT_TCP_EST_NS = 6ULL * 3600 * 1000 * 1000 * 1000,    /* established */
	CP_CT_TCP_CLOSE_NS = 10ULL * 1000 * 1000 * 1000,        /* RST / FIN both ways */
	CP_CT_UDP_NS = 60ULL * 1000 * 1000 * 1000,              /* UDP and other */
	CP_CT_ICMP_NS = 30ULL * 1000 * 1000 * 1000,             /* echo */
	CP_CT_SCTP_EST_NS = 3600ULL * 1000 * 1000 * 1000,       /* SCTP, answered */
	/* an idle timer is rewritten only when this much of it has run down,
	 * not on every packet (one cache line written per flow per second) */
	CP_CT_RENEW_SLACK_NS = 1ULL * 1000 * 1000 * 1000,
};

/* Where the packet lies in its flow. */
enum cp_ct_dir {
	CP_CT_NEW = 0,   /* no live entry */
	CP_CT_ORIG = 1,  /* the originator's direction */
	CP_CT_REPLY = 2, /* the reply direction */
};

#define CP_MAX_CT 65536

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_CT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_ct_key);
	__type(value, struct cp_ct_entry);
} cp_ct SEC(".maps");

#define IPPROTO_SCTP_ 132
#define CP_TCP_FIN 0x01
#define CP_TCP_SYN 0x02
#define CP_TCP_RST 0x04
#define ICMPV6_ECHO_REQUEST_ 128
#define ICMPV6_ECHO_REPLY_ 129

/* What the tracker reads from a packet besides its key. */
struct cp_ct_pkt {
	struct cp_ct_key key;
	__u8 tcp_flags;  /* TCP only */
	__u8 icmp_type;  /* ICMP/ICMPv6 only */
	__u8 echo;       /* 1: echo request, 2: echo reply, 0: neither */
	__u8 pad;
};

/*
 * Fill `t` from the parsed packet. Returns 0, or -1 when the L4 header is
 * missing (a later IPv4 fragment) or truncated: no tuple, the caller
 * decides (a policy fails closed).
 */
static __always_inline int cp_ct_tuple(struct __sk_buff *skb, const struct cp_pkt *pkt,
				       __u32 zone, struct cp_ct_pkt *t)
{
	__u8 l4[14];
	__u8 proto = pkt->l4proto;

	t->key.zone = zone;
	t->key.src = pkt->src;
	t->key.dst = pkt->dst;
	t->key.sport = 0;
	t->key.dport = 0;
	t->key.proto = proto;
	t->key.pad[0] = 0;
	t->key.pad[1] = 0;
	t->key.pad[2] = 0;
	t->tcp_flags = 0;
	t->icmp_type = 0;
	t->echo = 0;
	t->pad = 0;
	if (pkt->flags & CP_PKT_LATER_FRAG)
		return -1;
	if (proto == IPPROTO_TCP_) {
		if (bpf_skb_load_bytes(skb, pkt->l4_off, l4, 14) < 0)
			return -1;
		__builtin_memcpy(&t->key.sport, &l4[0], 2);
		__builtin_memcpy(&t->key.dport, &l4[2], 2);
		t->tcp_flags = l4[13];
		return 0;
	}
	if (proto == IPPROTO_UDP_ || proto == IPPROTO_SCTP_) {
		if (bpf_skb_load_bytes(skb, pkt->l4_off, l4, 4) < 0)
			return -1;
		__builtin_memcpy(&t->key.sport, &l4[0], 2);
		__builtin_memcpy(&t->key.dport, &l4[2], 2);
		return 0;
	}
	if (proto == IPPROTO_ICMP_ || proto == IPPROTO_ICMPV6_) {
		__u8 req = proto == IPPROTO_ICMP_ ? ICMP_ECHO_ : ICMPV6_ECHO_REQUEST_;
		__u8 rep = proto == IPPROTO_ICMP_ ? ICMP_ECHOREPLY_ : ICMPV6_ECHO_REPLY_;

		if (bpf_skb_load_bytes(skb, pkt->l4_off, l4, 8) < 0)
			return -1;
		t->icmp_type = l4[0];
		if (l4[0] == req) {
			__builtin_memcpy(&t->key.sport, &l4[4], 2);
			t->echo = 1;
		} else if (l4[0] == rep) {
			__builtin_memcpy(&t->key.dport, &l4[4], 2);
			t->echo = 2;
		}
		return 0;
	}
	return 0;
}

static __always_inline void cp_ct_swap(const struct cp_ct_key *k, struct cp_ct_key *out)
{
	out->zone = k->zone;
	out->src = k->dst;
	out->dst = k->src;
	out->sport = k->dport;
	out->dport = k->sport;
	out->proto = k->proto;
	out->pad[0] = 0;
	out->pad[1] = 0;
	out->pad[2] = 0;
}

static __always_inline __u64 cp_ct_timeout(__u8 proto, __u32 flags)
{
	if (proto == IPPROTO_TCP_) {
		if (flags & CP_CT_F_CLOSED)
			return CP_CT_TCP_CLOSE_NS;
		return (flags & CP_CT_F_SEEN_REPLY) ? CP_CT_TCP_EST_NS : CP_CT_TCP_SYN_NS;
	}
	if (proto == IPPROTO_ICMP_ || proto == IPPROTO_ICMPV6_)
		return CP_CT_ICMP_NS;
	if (proto == IPPROTO_SCTP_ && (flags & CP_CT_F_SEEN_REPLY))
		return CP_CT_SCTP_EST_NS;
	return CP_CT_UDP_NS;
}

/*
 * The live entry of the packet's flow, or NULL (*dir = CP_CT_NEW). `scratch`
 * holds the swapped key. Does not change the entry: cp_ct_touch() does,
 * once the caller has admitted the packet.
 */
static __always_inline struct cp_ct_entry *cp_ct_find(const struct cp_ct_pkt *t,
						      struct cp_ct_key *scratch, __u8 *dir)
{
	struct cp_ct_entry *e;
	__u64 now = bpf_ktime_get_ns();

	*dir = CP_CT_NEW;
	e = bpf_map_lookup_elem(&cp_ct, &t->key);
	if (e && e->expires_ns > now) {
		*dir = CP_CT_ORIG;
		return e;
	}
	cp_ct_swap(&t->key, scratch);
	e = bpf_map_lookup_elem(&cp_ct, scratch);
	if (e && e->expires_ns > now) {
		*dir = CP_CT_REPLY;
		return e;
	}
	return NULL;
}

/* Account an admitted packet of a known flow: state and idle timer. */
static __always_inline void cp_ct_touch(struct cp_ct_entry *e, const struct cp_ct_pkt *t,
					__u8 dir, __u32 set_flags)
{
	__u32 flags = e->flags | set_flags;

	if (dir == CP_CT_REPLY)
		flags |= CP_CT_F_SEEN_REPLY;
	if (t->key.proto == IPPROTO_TCP_) {
		if (t->tcp_flags & CP_TCP_RST)
			flags |= CP_CT_F_CLOSED;
		if (t->tcp_flags & CP_TCP_FIN)
			flags |= dir == CP_CT_REPLY ? CP_CT_F_FIN_REPLY : CP_CT_F_FIN_ORIG;
		if ((flags & (CP_CT_F_FIN_ORIG | CP_CT_F_FIN_REPLY)) ==
		    (CP_CT_F_FIN_ORIG | CP_CT_F_FIN_REPLY))
			flags |= CP_CT_F_CLOSED;
		/* a new SYN on a closed tuple (port reuse) starts over */
		if ((t->tcp_flags & (CP_TCP_SYN | CP_TCP_RST)) == CP_TCP_SYN &&
		    dir == CP_CT_ORIG && (flags & CP_CT_F_CLOSED))
			flags &= ~(CP_CT_F_CLOSED | CP_CT_F_FIN_ORIG | CP_CT_F_FIN_REPLY |
				   CP_CT_F_SEEN_REPLY);
	}
	{
		__u64 now = bpf_ktime_get_ns();
		__u64 timeout = cp_ct_timeout(t->key.proto, flags);

		/* unchanged state and a fresh timer: no write */
		if (flags == e->flags && e->expires_ns + CP_CT_RENEW_SLACK_NS > now + timeout)
			return;
		e->flags = flags;
		e->expires_ns = now + timeout;
	}
}

/* Track a new flow in the packet's direction with the policy bits `flags`
 * (NetworkPolicy's valid for `epoch`). */
static __always_inline void cp_ct_create(const struct cp_ct_pkt *t, __u32 flags, __u32 epoch)
{
	struct cp_ct_entry e = {};

	if (t->key.proto == IPPROTO_TCP_ && (t->tcp_flags & CP_TCP_RST))
		flags |= CP_CT_F_CLOSED;
	e.flags = flags;
	e.epoch = epoch;
	e.expires_ns = bpf_ktime_get_ns() + cp_ct_timeout(t->key.proto, flags);
	bpf_map_update_elem(&cp_ct, &t->key, &e, BPF_ANY);
}

/* Is ICMP(v6) type `type` an error that quotes the offending packet? */
static __always_inline int cp_ct_icmp_error(__u8 proto, __u8 type)
{
	if (proto == IPPROTO_ICMP_)
		return type == 3 || type == 11 || type == 12; /* unreachable, time exceeded, parameter */
	if (proto == IPPROTO_ICMPV6_)
		return type >= 1 && type <= 4; /* unreachable, too big, time exceeded, parameter */
	return 0;
}

/*
 * An ICMP error's related flow: the key, in `out`, of the packet it quotes
 * (IPv4 without options or IPv6 without extension headers, then the first
 * 4 bytes of a TCP, UDP or SCTP header or an echo's identifier), so that
 * cp_ct_find() on it finds the flow in either direction. 0, or -1 when the
 * error quotes nothing this tracker keys.
 */
static __always_inline int cp_ct_related(struct __sk_buff *skb, const struct cp_pkt *pkt,
					 __u32 zone, struct cp_ct_pkt *out)
{
	__u32 off = pkt->l4_off + 8;
	__u8 h[40];
	__u8 l4[6];
	__u8 proto;

	out->key.zone = zone;
	out->key.sport = 0;
	out->key.dport = 0;
	out->key.pad[0] = 0;
	out->key.pad[1] = 0;
	out->key.pad[2] = 0;
	out->tcp_flags = 0;
	out->icmp_type = 0;
	out->echo = 0;
	out->pad = 0;
	if (pkt->l4proto == IPPROTO_ICMP_) {
		if (bpf_skb_load_bytes(skb, off, h, 20) < 0 || h[0] != 0x45)
			return -1;
		proto = h[9];
		addr_from_ip4(&out->key.src, *(__be32 *)&h[12]);
		addr_from_ip4(&out->key.dst, *(__be32 *)&h[16]);
		off += 20;
	} else {
		if (bpf_skb_load_bytes(skb, off, h, 40) < 0 || (h[0] >> 4) != 6)
			return -1;
		proto = h[6];
		__builtin_memcpy(&out->key.src, &h[8], 16);
		__builtin_memcpy(&out->key.dst, &h[24], 16);
		off += 40;
	}
	out->key.proto = proto;
	if (bpf_skb_load_bytes(skb, off, l4, 6) < 0)
		return -1;
	if (proto == IPPROTO_TCP_ || proto == IPPROTO_UDP_ || proto == IPPROTO_SCTP_) {
		__builtin_memcpy(&out->key.sport, &l4[0], 2);
		__builtin_memcpy(&out->key.dport, &l4[2], 2);
		return 0;
	}
	/* a quoted echo request {id, 0}; a quoted echo reply {0, id} */
	if ((proto == IPPROTO_ICMP_ && l4[0] == ICMP_ECHO_) ||
	    (proto == IPPROTO_ICMPV6_ && l4[0] == ICMPV6_ECHO_REQUEST_)) {
		__builtin_memcpy(&out->key.sport, &l4[4], 2);
		return 0;
	}
	if ((proto == IPPROTO_ICMP_ && l4[0] == ICMP_ECHOREPLY_) ||
	    (proto == IPPROTO_ICMPV6_ && l4[0] == ICMPV6_ECHO_REPLY_)) {
		__builtin_memcpy(&out->key.dport, &l4[4], 2);
		return 0;
	}
	return -1;
}

#endif /* CP_CT_H */
