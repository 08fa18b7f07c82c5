/* SPDX-License-Identifier: GPL-2.0 */
/*
 * service.h - Services without kube-proxy: the service maps and the
 * socket-level load balancer (docs/services.md, issue #11).
 *
 * A frontend (a Service address as a client uses it) is looked up by
 * {net, address, port, protocol, scope} in cp_svc. Its backends are the
 * range [base, base + count) of cp_svc_slots, each slot a backend id of
 * cp_backends. The agent writes a changed backend set into a fresh range and
 * then replaces the frontend value in one update, which a reader sees whole:
 * a connect never picks from a half-written range.
 *
 * Socket-LB: the cgroup sock_addr programs below translate a Service address
 * into a backend once per connect() (TCP, connected UDP) or per sendmsg()
 * (unconnected UDP), before the kernel routes anything, so every packet of
 * the flow carries the backend's address and the rest of the datapath (RPF,
 * the overlay, the destination gate, policy) sees real endpoints only. The
 * reverse translation that the application observes - the source of UDP
 * replies (recvmsg) and getpeername() - comes from the socket's own storage
 * (cp_sock_own) for a connect()ed socket, freed with the socket, and from
 * cp_sock_rev, keyed by the socket's cookie and the backend, for what an
 * unconnected UDP socket sent (several backends per socket).
 *
 * A frontend without backends (count 0) refuses: connect() fails at once
 * (EPERM from the hook) instead of timing out against an address nobody
 * answers on, as kube-proxy's REJECT does.
 */
#ifndef CP_SERVICE_H
#define CP_SERVICE_H

#include "common.h"

#define CP_MAX_SVC 131072
#define CP_MAX_SVC_SLOTS (1 << 20)
#define CP_MAX_BACKENDS 262144
#define CP_MAX_SVC_REVS 131072
#define CP_MAX_SOCK_REV 65536
#define CP_MAX_AFFINITY 65536
#define CP_MAX_NETNS 65536

#define CP_AF_INET 2
#define CP_AF_INET6 10

enum cp_svc_abi {
	/* cp_svc_key.scope: seen from a socket on this node (socket-LB). */
	CP_SVC_SCOPE_INTERNAL = 0,
	/* cp_svc_key.scope: seen on the wire (per-packet LB, later). */
	CP_SVC_SCOPE_EXTERNAL = 1,
	/* cp_svc.flags: sessionAffinity ClientIP (affinity_s is the timeout). */
	CP_SVC_F_AFFINITY = 0x1,
	/* cp_svc.flags: loadBalancerSourceRanges: a new flow's source must be in
	 * cp_lb_src under the frontend's rev_id (bpf/lb.h). */
	CP_SVC_F_SOURCE_RANGES = 0x2,
	/* cp_backend.flags: the backend runs on this node. */
	CP_BACKEND_F_LOCAL = 0x1,
	/* cp_backend.flags: the endpoint is terminating (used as a fallback). */
	CP_BACKEND_F_TERMINATING = 0x2,
};

/* A frontend's key. 24 bytes. */
struct cp_svc_key {
	__u32 net;
	struct addr128 addr;
	__be16 port;
	__u8 proto;
	__u8 scope;          /* CP_SVC_SCOPE_* */
};
CP_ABI_SIZE(struct cp_svc_key, 24);
CP_ABI_OFFSET(struct cp_svc_key, addr, 4);
CP_ABI_OFFSET(struct cp_svc_key, port, 20);
CP_ABI_OFFSET(struct cp_svc_key, proto, 22);
CP_ABI_OFFSET(struct cp_svc_key, scope, 23);

/* A frontend. 32 bytes. */
struct cp_svc {
	__u32 rev_id;        /* cp_svc_revs key: this frontend, for reversing */
	__u32 base;          /* first slot of the backend range */
	__u32 count;         /* backends; 0 refuses */
	__u32 local_count;   /* the first local_count backends are this node's */
	__u32 maglev_base;   /* first slot of the Maglev table (wire scope) */
	__u32 maglev_m;      /* Maglev table size, 0 without one */
	__u32 affinity_s;    /* ClientIP affinity timeout, seconds */
	__u32 flags;         /* CP_SVC_F_* */
};
CP_ABI_SIZE(struct cp_svc, 32);
CP_ABI_OFFSET(struct cp_svc, base, 4);
CP_ABI_OFFSET(struct cp_svc, count, 8);
CP_ABI_OFFSET(struct cp_svc, local_count, 12);
CP_ABI_OFFSET(struct cp_svc, maglev_base, 16);
CP_ABI_OFFSET(struct cp_svc, maglev_m, 20);
CP_ABI_OFFSET(struct cp_svc, affinity_s, 24);
CP_ABI_OFFSET(struct cp_svc, flags, 28);

/* A backend, and (cp_svc_revs) a frontend's address for reversing. 24 bytes. */
struct cp_backend {
	__u32 net;
	struct addr128 addr;
	__be16 port;
	__u8 proto;
	__u8 flags;          /* CP_BACKEND_F_* (backends), 0 (revs) */
};
CP_ABI_SIZE(struct cp_backend, 24);
CP_ABI_OFFSET(struct cp_backend, addr, 4);
CP_ABI_OFFSET(struct cp_backend, port, 20);
CP_ABI_OFFSET(struct cp_backend, proto, 22);
CP_ABI_OFFSET(struct cp_backend, flags, 23);

/* A translated socket's backend, for the reverse translation. 32 bytes. */
struct cp_sock_rev_key {
	__u64 cookie;        /* bpf_get_socket_cookie */
	struct addr128 addr; /* the backend's address */
	__be16 port;         /* the backend's port */
	__u8 pad[6];
};
CP_ABI_SIZE(struct cp_sock_rev_key, 32);
CP_ABI_ALIGN(struct cp_sock_rev_key, 8);
CP_ABI_OFFSET(struct cp_sock_rev_key, addr, 8);
CP_ABI_OFFSET(struct cp_sock_rev_key, port, 24);
CP_ABI_OFFSET(struct cp_sock_rev_key, pad, 26);

/* A connected socket's translation, kept in the socket's own storage. 24 bytes. */
struct cp_sock_own {
	struct addr128 addr; /* the backend's address */
	__be16 port;         /* the backend's port */
	__u16 pad;
	__u32 rev_id;        /* the frontend */
};
CP_ABI_SIZE(struct cp_sock_own, 24);
CP_ABI_OFFSET(struct cp_sock_own, port, 16);
CP_ABI_OFFSET(struct cp_sock_own, rev_id, 20);

/* A client's pinned backend (sessionAffinity ClientIP). 32 bytes. The
 * client is its network namespace for socket-LB (at connect() the source
 * address is not chosen yet), its address for per-packet LB. */
struct cp_affinity_key {
	__u64 netns;         /* bpf_get_netns_cookie, 0 for per-packet */
	struct addr128 client; /* 0 for socket-LB */
	__u32 rev_id;        /* the frontend */
	__u32 pad;
};
CP_ABI_SIZE(struct cp_affinity_key, 32);
CP_ABI_ALIGN(struct cp_affinity_key, 8);
CP_ABI_OFFSET(struct cp_affinity_key, client, 8);
CP_ABI_OFFSET(struct cp_affinity_key, rev_id, 24);
CP_ABI_OFFSET(struct cp_affinity_key, pad, 28);

/* 16 bytes. */
struct cp_affinity {
	__u64 last_ns;       /* bpf_ktime_get_ns of the last pick */
	__u32 backend_id;
	__u32 slot;          /* where the backend was: an index into the range, or
			      * CP_AFFINITY_MAGLEV | an index into the Maglev table */
};
CP_ABI_SIZE(struct cp_affinity, 16);
CP_ABI_OFFSET(struct cp_affinity, backend_id, 8);
CP_ABI_OFFSET(struct cp_affinity, slot, 12);

/* cp_affinity.slot: the index is the Maglev table's. */
#define CP_AFFINITY_MAGLEV 0x80000000u
/* Slots of a range searched for a pinned backend that moved. */
#define CP_AFFINITY_SEARCH 32


/*
 * A pod network namespace that is not on the default network (a VPC pod),
 * keyed by its netns cookie in cp_netns. 8 bytes.
 */
struct cp_netns_val {
	__u32 net;           /* the VPC's network id (never 0) */
	__u32 ifindex;       /* the pod's host veth: the agent's witness for pruning */
};
CP_ABI_SIZE(struct cp_netns_val, 8);
CP_ABI_OFFSET(struct cp_netns_val, ifindex, 4);

/* Frontends. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_SVC);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_svc_key);
	__type(value, struct cp_svc);
} cp_svc SEC(".maps");

/* Backend ranges and Maglev tables: slot -> backend id. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CP_MAX_SVC_SLOTS);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} cp_svc_slots SEC(".maps");

/* Backend id -> backend. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_BACKENDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct cp_backend);
} cp_backends SEC(".maps");

/* rev_id -> the frontend's {net, address, port, proto}. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_SVC_REVS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct cp_backend);
} cp_svc_revs SEC(".maps");

/* A connect()ed socket's translation, in its own storage (written by the
 * datapath): it goes with the socket, so connection churn never fills a map
 * or evicts anyone else's entry. (The LRU below did both: at ~12k connects
 * per second it was full within seconds, every connect then paid an LRU
 * eviction - connect() p99 +20 us in docs/benchmarks.md - and a long-lived
 * socket's entry could be evicted, its replies then showing the backend.) */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, int);
	__type(value, struct cp_sock_own);
} cp_sock_own SEC(".maps");

/* {socket, backend} -> rev_id for unconnected UDP sends (written by the
 * datapath), and for a connected socket whose storage could not be
 * allocated. Socket cookies are never reused while the machine is up, so a
 * closed socket's entries only age out of the LRU. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_SOCK_REV);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_sock_rev_key);
	__type(value, __u32);
} cp_sock_rev SEC(".maps");

/* Session affinity (written by the datapath). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_AFFINITY);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_affinity_key);
	__type(value, struct cp_affinity);
} cp_affinity SEC(".maps");

/*
 * Network namespace cookie -> the network its sockets are on, written by the
 * agent at CNI ADD of a VPC pod (before the ADD returns, so the pod's first
 * connect is covered) and removed at DEL. A miss is net 0: host processes and
 * default-network pods share the hooked cgroup with VPC pods, and a VPC pod's
 * sockets must never be translated against (or reversed from) the default
 * network's frontends: its VPC may use the service CIDR too. A plain hash,
 * not an LRU: an evicted entry would silently turn a VPC pod into net 0.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_NETNS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u64);
	__type(value, struct cp_netns_val);
} cp_netns SEC(".maps");

/* The network of the sockets of network namespace `netns` (a cookie). */
static __always_inline __u32 cp_sock_net(__u64 netns)
{
	const struct cp_netns_val *v = bpf_map_lookup_elem(&cp_netns, &netns);

	return v ? v->net : CP_NET_DEFAULT;
}

/*
 * Is backend `id` one of `svc`'s now? Ids are reused, so a pin's id alone
 * could name another Service's backend: it counts only where this
 * frontend's slots hold it. `hint` (cp_affinity.slot) is where it was; a
 * changed backend set has new ranges, so the first CP_AFFINITY_SEARCH slots
 * are searched too. Returns the hint to keep, or -1 (re-pick).
 */
static __always_inline __s64 cp_svc_member(const struct cp_svc *svc, __u32 id, __u32 hint)
{
	__u32 s, *v;

	if (hint & CP_AFFINITY_MAGLEV) {
		__u32 i = hint & ~CP_AFFINITY_MAGLEV;

		if (i < svc->maglev_m) {
			s = svc->maglev_base + i;
			v = bpf_map_lookup_elem(&cp_svc_slots, &s);
			if (v && *v == id)
				return hint;
		}
	} else if (hint < svc->count) {
		s = svc->base + hint;
		v = bpf_map_lookup_elem(&cp_svc_slots, &s);
		if (v && *v == id)
			return hint;
	}
	for (__u32 j = 0; j < CP_AFFINITY_SEARCH; j++) {
		if (j >= svc->count)
			break;
		s = svc->base + j;
		v = bpf_map_lookup_elem(&cp_svc_slots, &s);
		if (v && *v == id)
			return j;
	}
	return -1;
}

/*
 * The backend `akey`'s client is pinned to on `svc`, if the pin is younger
 * than the affinity timeout and the frontend still has that backend (ids
 * are reused: cp_svc_member); the pin is then refreshed. NULL: pick anew.
 */
static __always_inline const struct cp_backend *
cp_affinity_follow(const struct cp_svc *svc, const struct cp_affinity_key *akey, __u64 now,
		   __u32 *id_out)
{
	struct cp_affinity *aff = bpf_map_lookup_elem(&cp_affinity, akey);
	const struct cp_backend *b;
	__u32 pinned;
	__s64 at;

	if (!aff || now - aff->last_ns >= (__u64)svc->affinity_s * 1000000000ULL)
		return NULL;
	pinned = aff->backend_id;
	at = cp_svc_member(svc, pinned, aff->slot);
	if (at < 0)
		return NULL;
	b = bpf_map_lookup_elem(&cp_backends, &pinned);
	if (b) {
		aff->last_ns = now;
		aff->slot = (__u32)at;
		*id_out = pinned;
	}
	return b;
}

/*
 * Pins `akey`'s client to backend `b` (`*id`, found at `slot`:
 * cp_affinity.slot) and returns the backend the flow takes. Concurrent
 * first flows of one client (other CPUs, the same moment) all missed the
 * pin and may have picked differently: the first pin made wins (a create
 * that fails on an existing entry), and a flow that lost follows it (*id
 * then names the winner's backend). An expired or stale pin is replaced.
 */
static __always_inline const struct cp_backend *
cp_affinity_pin(const struct cp_svc *svc, const struct cp_affinity_key *akey, __u64 now,
		const struct cp_backend *b, __u32 *id, __u32 slot)
{
	struct cp_affinity val = { .last_ns = now, .backend_id = *id, .slot = slot };
	const struct cp_backend *won;

	if (bpf_map_update_elem(&cp_affinity, akey, &val, BPF_NOEXIST) == 0)
		return b;
	won = cp_affinity_follow(svc, akey, now, id);
	if (won)
		return won;
	bpf_map_update_elem(&cp_affinity, akey, &val, BPF_ANY);
	return b;
}

/*
 * Picks a backend of `svc` for a socket in network namespace `netns`:
 * the pinned one while the affinity holds and the backend still exists,
 * else a uniformly random slot of the range. NULL when there is none.
 */
static __always_inline const struct cp_backend *
cp_svc_pick_sock(const struct cp_svc *svc, __u64 netns)
{
	struct cp_affinity_key akey = {};
	__u32 pinned;
	const struct cp_backend *b;
	__u64 now = 0;
	__u32 slot, index, *id;

	if (svc->count == 0)
		return NULL;
	if (svc->flags & CP_SVC_F_AFFINITY) {
		akey.netns = netns;
		akey.rev_id = svc->rev_id;
		now = bpf_ktime_get_ns();
		b = cp_affinity_follow(svc, &akey, now, &pinned);
		if (b)
			return b;
	}
	index = bpf_get_prandom_u32() % svc->count;
	slot = svc->base + index;
	id = bpf_map_lookup_elem(&cp_svc_slots, &slot);
	if (!id)
		return NULL;
	b = bpf_map_lookup_elem(&cp_backends, id);
	if (b && (svc->flags & CP_SVC_F_AFFINITY)) {
		pinned = *id;
		b = cp_affinity_pin(svc, &akey, now, b, &pinned, index);
	}
	return b;
}

/* Records {socket, backend} -> frontend for recvmsg and getpeername: in the
 * socket's storage when it connects, else (an unconnected send, or no
 * memory for the storage) in cp_sock_rev. */
static __always_inline void cp_sock_rev_put(struct bpf_sock_addr *ctx,
					    const struct cp_backend *b,
					    __u32 rev_id, int connected)
{
	struct cp_sock_rev_key k = {};
	struct cp_sock_own *own;
	struct bpf_sock *sk = ctx->sk;

	if (connected && sk) {
		own = bpf_sk_storage_get(&cp_sock_own, sk, 0,
					 BPF_SK_STORAGE_GET_F_CREATE);
		if (own) {
			own->addr = b->addr;
			own->port = b->port;
			own->rev_id = rev_id;
			return;
		}
	}
	k.cookie = bpf_get_socket_cookie(ctx);
	k.addr = b->addr;
	k.port = b->port;
	bpf_map_update_elem(&cp_sock_rev, &k, &rev_id, BPF_ANY);
}

/*
 * Forward translation of ctx's destination, IPv4 (ctx->user_ip4) or
 * IPv4-mapped IPv6 (the v4 service reached from a dual-stack socket) or
 * IPv6, at connect() (`connected`) or an unconnected sendmsg(). Returns 1
 * (go on) or 0 (refuse: a frontend without backends).
 */
static __always_inline int cp_sock_xlate_fwd(struct bpf_sock_addr *ctx, int v6,
					     int connected)
{
	struct cp_svc_key key = {};
	const struct cp_svc *svc;
	const struct cp_backend *b;
	__u64 netns;
	int mapped = 0;

	if (ctx->protocol != IPPROTO_TCP_ && ctx->protocol != IPPROTO_UDP_)
		return 1;
	if (!v6) {
		addr_from_ip4(&key.addr, ctx->user_ip4);
	} else {
		struct in6_addr a;

		a.in6_u.u6_addr32[0] = ctx->user_ip6[0];
		a.in6_u.u6_addr32[1] = ctx->user_ip6[1];
		a.in6_u.u6_addr32[2] = ctx->user_ip6[2];
		a.in6_u.u6_addr32[3] = ctx->user_ip6[3];
		if (a.in6_u.u6_addr32[0] == 0 && a.in6_u.u6_addr32[1] == 0 &&
		    a.in6_u.u6_addr32[2] == bpf_htonl(0x0000ffff)) {
			mapped = 1;
			addr_from_ip4(&key.addr, a.in6_u.u6_addr32[3]);
		} else {
			addr_from_ip6(&key.addr, &a);
		}
	}
	/* The socket's own network: a VPC pod sees only its VPC's frontends. */
	netns = bpf_get_netns_cookie(ctx);
	key.net = cp_sock_net(netns);
	key.port = (__be16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;
	key.scope = CP_SVC_SCOPE_INTERNAL;
	svc = bpf_map_lookup_elem(&cp_svc, &key);
	if (!svc)
		return 1;
	b = cp_svc_pick_sock(svc, netns);
	if (!b)
		return 0;
	/* A backend of the other family than the socket cannot be reached
	 * through it; the compiler never mixes families, so refuse. */
	if (ip6_is_nat64((const struct in6_addr *)&b->addr) == (v6 && !mapped))
		return 0;
	if (!v6) {
		ctx->user_ip4 = b->addr.w[3];
	} else if (mapped) {
		ctx->user_ip6[3] = b->addr.w[3];
	} else {
		ctx->user_ip6[0] = b->addr.w[0];
		ctx->user_ip6[1] = b->addr.w[1];
		ctx->user_ip6[2] = b->addr.w[2];
		ctx->user_ip6[3] = b->addr.w[3];
	}
	ctx->user_port = (__u32)b->port;
	cp_sock_rev_put(ctx, b, svc->rev_id, connected);
	return 1;
}

/* Reverse translation of ctx's address (a UDP reply's source, the peer of
 * getpeername) back to the frontend the socket was translated from. */
static __always_inline int cp_sock_xlate_rev(struct bpf_sock_addr *ctx, int v6)
{
	struct cp_sock_rev_key k = {};
	const struct cp_backend *fe;
	struct cp_sock_own *own;
	struct bpf_sock *sk = ctx->sk;
	__u32 *rev = NULL;
	int mapped = 0;

	if (!v6) {
		addr_from_ip4(&k.addr, ctx->user_ip4);
	} else {
		struct in6_addr a;

		a.in6_u.u6_addr32[0] = ctx->user_ip6[0];
		a.in6_u.u6_addr32[1] = ctx->user_ip6[1];
		a.in6_u.u6_addr32[2] = ctx->user_ip6[2];
		a.in6_u.u6_addr32[3] = ctx->user_ip6[3];
		if (a.in6_u.u6_addr32[0] == 0 && a.in6_u.u6_addr32[1] == 0 &&
		    a.in6_u.u6_addr32[2] == bpf_htonl(0x0000ffff)) {
			mapped = 1;
			addr_from_ip4(&k.addr, a.in6_u.u6_addr32[3]);
		} else {
			addr_from_ip6(&k.addr, &a);
		}
	}
	k.port = (__be16)ctx->user_port;
	/* The socket's own record first: the peer it connected to. */
	if (sk) {
		own = bpf_sk_storage_get(&cp_sock_own, sk, 0, 0);
		if (own && own->port == k.port && cp_addr_eq(&own->addr, &k.addr))
			rev = &own->rev_id;
	}
	if (!rev) {
		k.cookie = bpf_get_socket_cookie(ctx);
		rev = bpf_map_lookup_elem(&cp_sock_rev, &k);
	}
	if (!rev)
		return 1;
	fe = bpf_map_lookup_elem(&cp_svc_revs, rev);
	if (!fe)
		return 1;
	/* Only a frontend of the socket's own network (the forward side
	 * guarantees it; this keeps it true for a socket translated before
	 * its namespace was recorded). */
	if (fe->net != cp_sock_net(bpf_get_netns_cookie(ctx)))
		return 1;
	if (!v6) {
		ctx->user_ip4 = fe->addr.w[3];
	} else if (mapped) {
		ctx->user_ip6[3] = fe->addr.w[3];
	} else {
		ctx->user_ip6[0] = fe->addr.w[0];
		ctx->user_ip6[1] = fe->addr.w[1];
		ctx->user_ip6[2] = fe->addr.w[2];
		ctx->user_ip6[3] = fe->addr.w[3];
	}
	ctx->user_port = (__u32)fe->port;
	return 1;
}

#endif /* CP_SERVICE_H */
