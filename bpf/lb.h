/* SPDX-License-Identifier: GPL-2.0 */
/*
 * lb.h - per-packet Service load balancing: NodePort, LoadBalancer and
 * externalIP traffic that arrives from the wire, which no socket hook of
 * this cluster ever saw (docs/services.md, issue #11). TCP and UDP over
 * IPv4 and IPv6 (the same maps: their keys hold 128-bit addresses; the
 * IPv6 SNAT source is cp_params.node_ip6).
 *
 * Requests: a packet for a wire-scope frontend (cp_svc, scope EXTERNAL)
 * arriving on the uplink (from_uplink) or through the overlay from another
 * node (from_overlay: a pod or node elsewhere connecting to this node's
 * NodePort) gets a backend by Maglev (or its ClientIP affinity pin), its
 * destination rewritten to the backend, and goes there directly: into a
 * local pod through the destination gate, to another node's pod or the
 * node itself through the overlay, elsewhere (an external backend) out of
 * the uplink.
 *
 * Source: kept (the client's address reaches the pod) when the backend is a
 * pod on this node and the request came from the uplink - always so under
 * externalTrafficPolicy Local, whose frontends have local backends only.
 * Otherwise the source becomes this node's address and a port of the
 * masquerade range, so the reply comes back through this node, the only one
 * that can undo the translation (kube-proxy's masquerade for etp Cluster).
 *
 * State: cp_lb_fwd holds a flow's request tuple -> its backend (a flow keeps
 * its backend while the backend exists, whatever the backend set does), and
 * cp_lb_rev the reply tuple as the backend sends it -> the frontend and the
 * original client. Replies are translated back where they first appear on
 * this node: from_pod (a local backend's reply, which leaves for the client
 * or for this node's SNAT address), from_overlay and from_uplink (a remote
 * or external backend's reply to the SNAT address). The reverse lookups sit
 * on the paths pod -> node / outside and overlay -> node only, never on the
 * pod-to-pod fast path: a translated flow's reply always goes to a node
 * address or outside.
 *
 * Replies to a client on the wire leave through the uplink the request came
 * in on (bpf_redirect_neigh): the kernel would refuse to forward a packet
 * whose source is its own (NodePort) address.
 *
 * loadBalancerSourceRanges: a frontend flagged CP_SVC_F_SOURCE_RANGES takes
 * new flows only from sources listed in cp_lb_src under its rev_id.
 *
 * SNAT ports expire. The reverse entry of a SNATed flow holds the port and
 * an expiry (`expires_s`, CLOCK_MONOTONIC seconds) that every packet of the
 * flow renews: 60 s until the backend first replies (TCP; 30 s UDP), then
 * 6 h (TCP; 120 s UDP), 10 s once a FIN or RST was seen. A new flow whose
 * port is taken by an expired entry takes the port over (an atomic swap of
 * the expiry decides between two claimers), and an old flow whose port was
 * taken over is a new flow on its next packet (its forward entry no longer
 * matches the port's owner). Without this a port was taken until the LRU
 * evicted its entry, which never happens while claims fail: ~4.5k flows to
 * one backend (a client's, or spoofed SYNs from the wire) took every port
 * for good and the NodePort refused everyone after. An entry of an older
 * agent (expiry 0) is never taken over; its flow's next packet sets one.
 *
 * ICMP errors about a flow (path MTU, a backend's port unreachable) are
 * translated as the packet they quote was (cp_lb_icmp_error).
 *
 * ICMP errors about a pod's own per-packet ClusterIP flow (lb_from_pod's)
 * are translated at the destination gate, as its replies are
 * (cp_lb_inside_icmp_error, bpf/lbmaps.h).
 *
 * Not translated here: IPv4 fragments and headers with options (a later
 * fragment carries no port), IPv6 extension headers, SCTP (its checksum covers
 * the ports: no incremental update).
 */
#ifndef CP_LB_H
#define CP_LB_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"
#include "nat.h"
#include "encap.h"
#include "deliver.h"
#include "service.h"
#include "lbmaps.h"

/* cp_lb_request and cp_lb_reply are BPF-to-BPF calls (__noinline), not
 * inlined: their tuples and flow values get a stack frame of their own, so
 * from_pod's, already near the verifier's 512 bytes, does not grow. */

/* Not a translated packet: the caller goes on as before. */
#define CP_LB_MISS (-1000)
/* cp_lb_request: translated, to be sent on (cp_lb_send). */
#define CP_LB_SEND (-1001)

/* SNAT ports when masquerade is off (node.rs MASQ_PORTS: above the
 * kernel's ephemeral range, so no socket of the node's own collides). */
#define CP_LB_PORT_MIN 61000
#define CP_LB_PORT_MAX 65535

#define CP_MAX_LB_SRC 16384

/* loadBalancerSourceRanges: {rev_id of the frontend (in `net`), source
 * prefix} -> 1. Only frontends with CP_SVC_F_SOURCE_RANGES consult it. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_LB_SRC);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_lpm_key);
	__type(value, __u32);
} cp_lb_src SEC(".maps");

/* The SNAT port range: the masquerade's, or the default without one. */
static __always_inline void cp_lb_ports(const struct cp_params *cfg, __u32 *min, __u32 *max)
{
	if (cfg->masq_port_min && cfg->masq_port_max >= cfg->masq_port_min) {
		*min = cfg->masq_port_min;
		*max = cfg->masq_port_max;
	} else {
		*min = CP_LB_PORT_MIN;
		*max = CP_LB_PORT_MAX;
	}
}

/* This node's address of the packet's family (`v6`), the SNAT source:
 * 0, or -1 when the node has none (no IPv6 address on its uplink). */
static __always_inline int cp_lb_node_addr(const struct cp_params *cfg, int v6,
					   struct addr128 *out)
{
	if (!v6) {
		addr_from_ip4(out, cfg->node_ip);
		return cfg->node_ip ? 0 : -1;
	}
	*out = cfg->node_ip6;
	return (out->w[0] | out->w[1] | out->w[2] | out->w[3]) ? 0 : -1;
}

/* Rewrite the source (`dst` 0) or destination address `old` -> `new` of
 * an IPv4 (`v6` 0) or IPv6 packet, and its port at `port_off`, with the
 * checksums (bpf/nat.h). */
static __always_inline int cp_lb_rewrite_inet(struct __sk_buff *skb,
					      const struct cp_l4_layout *l, int v6, int dst,
					      const struct addr128 *old, const struct addr128 *new,
					      __u32 port_off, __be16 old_port, __be16 new_port)
{
	if (v6)
		return cp_nat_rewrite6(skb, l, dst ? CP_IP6_DADDR_OFF : CP_IP6_SADDR_OFF, old, new,
				       port_off, old_port, new_port);
	return cp_nat_rewrite(skb, l, dst ? CP_IP4_DADDR_OFF : CP_IP4_SADDR_OFF, old->w[3],
			      new->w[3], port_off, old_port, new_port);
}

/* cp_lb_rewrite_inet, or for SCTP (`l` from cp_sctp_tuple_at, where the
 * caller `may_sctp` see it) the addresses so and the port stored on its
 * own, its CRC updated later (bpf/nat.h cp_sctp_port). A branch only where
 * SCTP may come keeps the other callers' frames as they were. */
static __always_inline int cp_lb_rewrite(struct __sk_buff *skb, const struct cp_l4_layout *l,
					 int v6, int dst, const struct addr128 *old,
					 const struct addr128 *new, __u32 port_off,
					 __be16 old_port, __be16 new_port, const int may_sctp)
{
	if (may_sctp && (l->csum_flags & CP_L4_SCTP))
		return cp_sctp_rewrite(skb, l, v6,
				       v6 ? (dst ? CP_IP6_DADDR_OFF : CP_IP6_SADDR_OFF)
					  : (dst ? CP_IP4_DADDR_OFF : CP_IP4_SADDR_OFF),
				       old, new, port_off, old_port, new_port);
	return cp_lb_rewrite_inet(skb, l, v6, dst, old, new, port_off, old_port, new_port);
}

/*
 * The backend of a new flow `k` to `svc`: the client's affinity pin while
 * it holds and its backend exists, else the Maglev table's slot for the
 * flow's hash (every node computes the same table, so a flow that moves
 * between nodes keeps its backend), else a hash over the range.
 */
static __always_inline const struct cp_backend *
cp_lb_pick(const struct cp_svc *svc, const struct cp_masq_key *k, __u32 *id_out)
{
	struct cp_affinity_key akey = {};
	const struct cp_backend *b;
	__u64 now = 0;
	__u32 slot, index, *id;

	if (svc->count == 0)
		return NULL;
	if (svc->flags & CP_SVC_F_AFFINITY) {
		akey.client = k->src;
		akey.rev_id = svc->rev_id;
		now = bpf_ktime_get_ns();
		b = cp_affinity_follow(svc, &akey, now, id_out);
		if (b)
			return b;
	}
	if (svc->maglev_m) {
		index = cp_nat_hash(k) % svc->maglev_m;
		slot = svc->maglev_base + index;
		index |= CP_AFFINITY_MAGLEV;
	} else {
		index = cp_nat_hash(k) % svc->count;
		slot = svc->base + index;
	}
	id = bpf_map_lookup_elem(&cp_svc_slots, &slot);
	if (!id)
		return NULL;
	*id_out = *id;
	b = bpf_map_lookup_elem(&cp_backends, id);
	if (b && (svc->flags & CP_SVC_F_AFFINITY))
		b = cp_affinity_pin(svc, &akey, now, b, id_out, index);
	return b;
}

#ifdef CP_TEST_HOOKS
#define CP_TEST_DELIVER_NEIGH 2 /* cp_test_deliver.peer: bpf_redirect_neigh */
#endif

/* Renews SNATed reverse entry `v` for a packet with TCP flags `tcp` (a
 * reply when `reply`): its state flags, then its expiry (bpf/nat.h). */
static __always_inline void cp_lb_renew(struct cp_lb_val *v, __u8 proto, __u8 tcp, int reply,
					__u32 now)
{
	__u32 flags = v->flags, exp;

	if (reply)
		flags |= CP_LB_F_REPLIED;
	if (tcp & (CP_TCP_FIN | CP_TCP_RST))
		flags |= CP_LB_F_CLOSING;
	if (flags != v->flags)
		v->flags = flags;
	exp = now + cp_nat_ttl(proto, flags & CP_LB_F_REPLIED, flags & CP_LB_F_CLOSING);
	/* one store a second at most */
	if (v->expires_s != exp)
		v->expires_s = exp;
}

/* A SNAT port for the flow whose reverse entry is `rv`: free, or expired
 * and taken over (bpf/nat.h). */
static __always_inline __be16 cp_lb_claim(struct cp_masq_key *rk, const struct cp_lb_val *rv,
					  __u32 hash, __u32 min, __u32 max, __u32 now)
{
	struct cp_lb_val *old;
	__be16 port;

	port = cp_nat_claim_expiring(&cp_lb_rev, rk, &rk->dport, rv,
				     offsetof(struct cp_lb_val, expires_s), hash, min, max, now,
				     (void **)&old);
	if (port && old) {
		old->client = rv->client;
		old->client_port = rv->client_port;
		old->rev_id = rv->rev_id;
		old->ifindex = rv->ifindex;
		old->flags = rv->flags;
	}
	return port;
}

/*
 * Send a translated packet on to `pkt->dst` (already rewritten): a local
 * pod through the destination gate (`local`: requests; a reply's client is
 * never a pod of this node, whose sockets the socket-LB translates, so the
 * reply path leaves a local destination to the kernel and keeps its stack
 * frame small), another node's pod or another node through the overlay,
 * this node to its own stack, anything else out of uplink `out_ifindex`
 * (the request's, or the configured uplink).
 */
static __always_inline int cp_lb_send(struct __sk_buff *skb, const struct cp_pkt *pkt,
				      const struct cp_params *cfg, __u32 out_ifindex, int local)
{
	const struct cp_remote *rem;
	struct cp_lpm_key lk;

	if (local) {
		const struct cp_endpoint *ep;
		struct cp_ep_key key;

		key.net = CP_NET_DEFAULT;
		key.addr = pkt->dst;
		ep = bpf_map_lookup_elem(&cp_locals, &key);
		if (ep)
			return cp_deliver_local(skb, pkt, CP_NET_DEFAULT, ep, &key);
	}
	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = CP_NET_DEFAULT;
	lk.addr = pkt->dst;
	rem = bpf_map_lookup_elem(&cp_remotes, &lk);
	if (!rem)
		rem = bpf_map_lookup_elem(&cp_node_remotes, &pkt->dst);
	if (rem) {
		if (rem->tunnel_ip == cfg->node_ip)
			return CP_PASS; /* this node's own address */
		return cp_encap_redirect(skb, CP_NET_DEFAULT, rem->tunnel_ip);
	}
	if (!out_ifindex)
		out_ifindex = cfg->uplink_ifindex;
	if (!out_ifindex)
		return cp_drop(CP_DROP_LB_NAT);
#ifdef CP_TEST_HOOKS
	cp_test_record_deliver(out_ifindex, CP_TEST_DELIVER_NEIGH);
#endif
	return bpf_redirect_neigh(out_ifindex, NULL, 0, 0);
}

/* A reply (or an ICMP error) for a per-packet flow's client, translated:
 * out of the uplink the request came in on (`ifindex`; the pod's host veth
 * for a hairpin flow), else on by cp_lb_send. */
static __always_inline int cp_lb_to_client(struct __sk_buff *skb, const struct cp_pkt *pkt,
					   const struct cp_params *cfg, __u32 ifindex)
{
	if (ifindex) {
#ifdef CP_TEST_HOOKS
		cp_test_record_deliver(ifindex, CP_TEST_DELIVER_NEIGH);
#endif
		return bpf_redirect_neigh(ifindex, NULL, 0, 0);
	}
	return cp_lb_send(skb, pkt, cfg, 0, 0);
}

/*
 * A request for a wire-scope frontend, or a later packet of such a flow:
 * pick, track, translate. `in_ifindex` is the uplink it arrived on, 0 for
 * the overlay. With `inside`, a pod's packet for an inside-scope frontend
 * (a ClusterIP) that no socket hook translated - a KubeVirt guest's, say -
 * from the pod behind host veth `in_ifindex`: never SNATed (the backend
 * sees the pod), and the pod is flagged in cp_lb_clients so the destination
 * gate reverses the replies (cp_lb_inside_reply, bpf/lbmaps.h). Returns
 * CP_LB_MISS (not a Service's: go on as before), CP_LB_SEND (translated,
 * `pkt` updated) or a drop verdict. Sending is the caller's
 * (cp_lb_ingress), so the destination gate's calls do not stack on this
 * frame. `v6`: the packet's family (cp_lb_family), a constant in each of
 * the two subprograms below.
 */
static __always_inline int cp_lb_request_of(struct __sk_buff *skb, struct cp_pkt *pkt,
					    __u32 in_ifindex, int inside, const int v6)
{
	const struct cp_params *cfg = cp_get_params();
	const struct cp_backend *b = NULL;
	const struct cp_lb_val *fv;
	const struct cp_svc *svc;
	struct cp_svc_key sk = {};
	struct cp_lb_val rv = {};
	struct cp_masq_key k, rk;
	struct cp_l4_layout l = {};
	__u32 id = 0, rev_id = 0;
	__be16 snat_port = 0;
	__u32 min, max, now;
	struct cp_lb_val *cur;
	__u8 tcp;
	int snat, hairpin;

	if (!cfg || cp_lb_family(skb, pkt) != (v6 ? 6 : 4))
		return CP_LB_MISS;
	if (pkt->l4proto == IPPROTO_SCTP_
		    ? cp_sctp_tuple_at(skb, pkt, v6, v6 ? CP_L6_OFF : CP_L4_OFF, &k, &l) < 0
		    : cp_nat_tuple_at(skb, pkt, 0, v6, v6 ? CP_L6_OFF : CP_L4_OFF, &k, &l) < 0)
		return CP_LB_MISS;
	/* the underlay's VXLAN, the bulk of an uplink, is never a Service */
	if (k.proto == IPPROTO_UDP_ && k.dport == bpf_htons(CP_VXLAN_PORT))
		return CP_LB_MISS;

	fv = bpf_map_lookup_elem(&cp_lb_fwd, &k);
	if (fv) {
		const struct cp_backend *fe;

		id = fv->backend_id;
		rev_id = fv->rev_id;
		snat_port = fv->snat_port;
		b = bpf_map_lookup_elem(&cp_backends, &id);
		/* Ids are reused: the flow is only still this one while its
		 * frontend is still this packet's Service and its backend id
		 * still names the backend it was given. Otherwise it is a new
		 * flow (picked, and checked against source ranges, afresh):
		 * never sent to whatever a reused id names now. */
		fe = bpf_map_lookup_elem(&cp_svc_revs, &rev_id);
		if (b && (!fe || fe->port != k.dport || fe->proto != k.proto ||
			  !cp_addr_eq(&fe->addr, &k.dst) || !cp_addr_eq(&b->addr, &fv->client) ||
			  b->port != fv->client_port))
			b = NULL;
	}
	if (!b) {
		/* a new flow, or its backend is gone: (re)pick */
		sk.net = CP_NET_DEFAULT;
		sk.addr = k.dst;
		sk.port = k.dport;
		sk.proto = k.proto;
		sk.scope = inside ? CP_SVC_SCOPE_INTERNAL : CP_SVC_SCOPE_EXTERNAL;
		svc = bpf_map_lookup_elem(&cp_svc, &sk);
		if (!svc)
			return CP_LB_MISS;
		rev_id = svc->rev_id;
		/* loadBalancerSourceRanges: new flows from listed sources only
		 * (a flow admitted earlier keeps going, as with kube-proxy's
		 * conntrack) */
		if (svc->flags & CP_SVC_F_SOURCE_RANGES) {
			struct cp_lpm_key src = {};

			src.prefixlen = CP_LPM_NET_BITS + 128;
			src.net = rev_id;
			src.addr = k.src;
			if (!bpf_map_lookup_elem(&cp_lb_src, &src))
				return cp_drop(CP_DROP_LB_SOURCE_RANGE);
		}
		b = cp_lb_pick(svc, &k, &id);
		if (!b)
			return cp_drop(CP_DROP_LB_NO_BACKEND);
		snat_port = 0;
		fv = NULL;
	}
	/* a frontend's backends are of its own family */
	if (b->net != CP_NET_DEFAULT || ip6_is_nat64((const struct in6_addr *)&b->addr) == v6)
		return cp_drop(CP_DROP_LB_NO_BACKEND);

	/* The source stays for a pod of this node reached from the wire, and
	 * for a pod's own ClusterIP flow - unless the pod is its own backend
	 * (hairpin): delivered back into it with its own address as the
	 * source, the request would be answered inside the pod and the reply
	 * never reversed, so it comes from this node's address instead, as
	 * kube-proxy masquerades it, and the reply leaves the pod to be
	 * reversed and sent back in (cp_lb_reply). */
	hairpin = inside && cp_addr_eq(&b->addr, &k.src);
	snat = hairpin || (!inside && !(in_ifindex && (b->flags & CP_BACKEND_F_LOCAL)));

	/* The reply tuple as the backend will send it. */
	rk.src = b->addr;
	rk.sport = b->port;
	rk.proto = k.proto;
	rk.pad[0] = 0;
	rk.pad[1] = 0;
	rk.pad[2] = 0;
	rv.rev_id = rev_id;
	rv.client = k.src;
	rv.client_port = k.sport;
	rv.ifindex = inside && !hairpin ? 0 : in_ifindex;
	if (inside) {
		__u32 idx = in_ifindex & (CP_MAX_LB_CLIENTS - 1);
		__u32 *flag = bpf_map_lookup_elem(&cp_lb_clients, &idx);

		if (flag && !*flag)
			*flag = 1;
	}
	if (snat) {
		if (cp_lb_node_addr(cfg, v6, &rk.dst) < 0)
			return cp_drop(CP_DROP_LB_NAT); /* no address to SNAT to */
		rv.flags = hairpin ? CP_LB_F_SNAT | CP_LB_F_HAIRPIN : CP_LB_F_SNAT;
		now = cp_nat_now_s();
		tcp = cp_nat_tcp_flags(skb, pkt);
		if (snat_port) {
			rk.dport = snat_port;
			cur = bpf_map_lookup_elem(&cp_lb_rev, &rk);
			if (!cur) {
				/* re-create the reverse entry if the LRU evicted it */
				cp_lb_renew(&rv, k.proto, tcp, 0, now);
				bpf_map_update_elem(&cp_lb_rev, &rk, &rv, BPF_ANY);
			} else if (cur->client_port != k.sport || !cp_addr_eq(&cur->client, &k.src) ||
				   cur->rev_id != rev_id) {
				/* the port expired and another flow took it over:
				 * this is a new flow */
				snat_port = 0;
				fv = NULL;
			} else {
				cp_lb_renew(cur, k.proto, tcp, 0, now);
			}
		}
		if (!snat_port) {
			cp_lb_ports(cfg, &min, &max);
			cp_lb_renew(&rv, k.proto, tcp, 0, now);
			snat_port = cp_lb_claim(&rk, &rv, cp_nat_hash(&k), min, max, now);
			if (!snat_port)
				return cp_drop(CP_DROP_LB_NAT);
		}
	} else {
		rk.dst = k.src;
		rk.dport = k.sport;
		snat_port = 0;
		if (!fv || !bpf_map_lookup_elem(&cp_lb_rev, &rk))
			bpf_map_update_elem(&cp_lb_rev, &rk, &rv, BPF_ANY);
	}
	if (!fv) {
		/* the reverse entry is written: its value's stack becomes the
		 * forward entry's (one value less keeps the IPv6 frame within
		 * the verifier's 512 bytes under from_overlay) */
		__builtin_memset(&rv, 0, sizeof(rv));
		rv.client = b->addr;
		rv.client_port = b->port;
		rv.backend_id = id;
		rv.rev_id = rev_id;
		rv.snat_port = snat_port;
		rv.flags = snat ? CP_LB_F_SNAT : 0;
		if (bpf_map_update_elem(&cp_lb_fwd, &k, &rv, BPF_ANY) < 0) {
			if (snat)
				bpf_map_delete_elem(&cp_lb_rev, &rk);
			return cp_drop(CP_DROP_LB_NAT);
		}
	}

	/* destination -> the backend; source -> this node if SNATed */
	if (cp_lb_rewrite(skb, &l, v6, 1, &k.dst, &b->addr, l.dport_off, k.dport, b->port, 1) <
	    0)
		return cp_drop(CP_DROP_LB_NAT);
	pkt->dst = b->addr;
	if (snat) {
		if (cp_lb_rewrite(skb, &l, v6, 0, &k.src, &rk.dst, l.sport_off, k.sport,
				  snat_port, 1) < 0)
			return cp_drop(CP_DROP_LB_NAT);
		pkt->src = rk.dst;
	}
	return CP_LB_SEND;
}

/*
 * cp_lb_request_of for each family, with the family a constant. Global
 * functions, not static ones: the verifier walks a global function once,
 * on its own, and its callers see only its result. A static one is walked
 * again for every state it is called in, and everything after it once
 * per way it can return: with both families, from_overlay and from_uplink
 * took ~880k of the verifier's million instructions (one IPv4 function:
 * ~390k).
 */
__noinline int cp_lb_request4(struct __sk_buff *skb, struct cp_pkt *pkt, __u32 in_ifindex,
			      int inside)
{
	if (!pkt)
		return CP_LB_MISS;
	return cp_lb_request_of(skb, pkt, in_ifindex, inside, 0);
}

__noinline int cp_lb_request6(struct __sk_buff *skb, struct cp_pkt *pkt, __u32 in_ifindex,
			      int inside)
{
	if (!pkt)
		return CP_LB_MISS;
	return cp_lb_request_of(skb, pkt, in_ifindex, inside, 1);
}

static __always_inline int cp_lb_request(struct __sk_buff *skb, struct cp_pkt *pkt,
					 __u32 in_ifindex, int inside)
{
	int v;

	if (pkt->l4proto == IPPROTO_SCTP_)
		cp_sctp_begin(skb);
	switch (cp_lb_family(skb, pkt)) {
	case 4:
		v = cp_lb_request4(skb, pkt, in_ifindex, inside);
		break;
	case 6:
		v = cp_lb_request6(skb, pkt, in_ifindex, inside);
		break;
	default:
		return CP_LB_MISS;
	}
	/* SCTP's CRC, for the ports rewritten (bpf/nat.h cp_sctp_port) */
	if (v == CP_LB_SEND && pkt->l4proto == IPPROTO_SCTP_ && cp_sctp_crc(skb) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	return v;
}

/* cp_lb_request, then on to the backend. CP_LB_MISS or the tc verdict. */
static __always_inline int cp_lb_ingress(struct __sk_buff *skb, struct cp_pkt *pkt,
					 __u32 in_ifindex, int inside)
{
	const struct cp_params *cfg;
	int v = cp_lb_request(skb, pkt, in_ifindex, inside);

	if (v != CP_LB_SEND)
		return v;
	cfg = cp_get_params();
	if (!cfg)
		return cp_drop(CP_DROP_NO_CONFIG);
	return cp_lb_send(skb, pkt, cfg, 0, 1);
}

/*
 * A backend's reply of a per-packet flow: the source back to the frontend,
 * the destination back to the client if it was SNATed, then on to the
 * client (out of the uplink the request came in on). `snat_only`: only a
 * reply to this node's SNAT address can be one here (the overlay and the
 * uplink), so anything else leaves before the lookup. `v6`: the packet's
 * family (cp_lb_family), a constant in each of the two subprograms below.
 * Returns CP_LB_MISS or the tc verdict.
 */
static __always_inline int cp_lb_reply_of(struct __sk_buff *skb, struct cp_pkt *pkt,
					  int snat_only, const int v6, const int sctp)
{
	const struct cp_params *cfg = cp_get_params();
	const struct cp_backend *fe;
	struct cp_lb_val *v;
	struct cp_l4_layout l = {};
	struct cp_masq_key k;
	__u32 rev_id, ifindex, min, max;

	/* checked here again, not only by the caller, and the protocols of
	 * this instance too: it tells the compiler that no ICMP (or SCTP)
	 * case of the tuple is left, which keeps the frames within from_pod's
	 * chain */
	if (!cfg || cp_lb_family(skb, pkt) != (v6 ? 6 : 4) ||
	    (sctp ? pkt->l4proto != IPPROTO_SCTP_
		  : pkt->l4proto != IPPROTO_TCP_ && pkt->l4proto != IPPROTO_UDP_))
		return CP_LB_MISS;
	if (snat_only &&
	    (v6 ? !cp_addr_eq(&pkt->dst, &cfg->node_ip6) : pkt->dst.w[3] != cfg->node_ip))
		return CP_LB_MISS; /* (without node_ip6 no flow is SNATed to ::, so a
				    * packet to it finds no entry below) */
	if (sctp ? cp_sctp_tuple_at(skb, pkt, v6, v6 ? CP_L6_OFF : CP_L4_OFF, &k, &l) < 0
		 : cp_nat_tuple_at(skb, pkt, 0, v6, v6 ? CP_L6_OFF : CP_L4_OFF, &k, &l) < 0)
		return CP_LB_MISS;
	if (snat_only) {
		__u32 port = bpf_ntohs(k.dport);

		cp_lb_ports(cfg, &min, &max);
		if (port < min || port > max)
			return CP_LB_MISS;
	}
	v = bpf_map_lookup_elem(&cp_lb_rev, &k);
	if (!v)
		return CP_LB_MISS;
	rev_id = v->rev_id;
	fe = bpf_map_lookup_elem(&cp_svc_revs, &rev_id);
	if (!fe)
		return CP_LB_MISS; /* the frontend is gone: nothing to restore */

	const struct addr128 *client = &v->client;
	__be16 client_port = v->client_port;
	__u32 flags = v->flags;

	/* a hairpin flow's reply only ever comes from the pod itself, never
	 * from afar */
	if (snat_only && (flags & CP_LB_F_HAIRPIN))
		return cp_drop(CP_DROP_LB_NAT);

	ifindex = v->ifindex;
	if (flags & CP_LB_F_SNAT)
		cp_lb_renew(v, k.proto, cp_nat_tcp_flags(skb, pkt), 1, cp_nat_now_s());
	if (cp_lb_rewrite(skb, &l, v6, 0, &k.src, &fe->addr, l.sport_off, k.sport, fe->port,
			  sctp) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	pkt->src = fe->addr;
	if (flags & CP_LB_F_SNAT) {
		if (cp_lb_rewrite(skb, &l, v6, 1, &k.dst, client, l.dport_off, k.dport,
				  client_port, sctp) < 0)
			return cp_drop(CP_DROP_LB_NAT);
		pkt->dst = *client;
	}
	return cp_lb_to_client(skb, pkt, cfg, ifindex);
}

/* cp_lb_reply_of for each family, a subprogram of its own so that the IPv6
 * addresses do not grow the IPv4 frame: from_pod's chain of calls is at
 * the verifier's 512 bytes of stack. */
static __noinline int cp_lb_reply4(struct __sk_buff *skb, struct cp_pkt *pkt, int snat_only)
{
	return cp_lb_reply_of(skb, pkt, snat_only, 0, 0);
}

static __noinline int cp_lb_reply6(struct __sk_buff *skb, struct cp_pkt *pkt, int snat_only)
{
	return cp_lb_reply_of(skb, pkt, snat_only, 1, 0);
}

/* SCTP's replies, each family's in a global function: walked once, not in
 * every state the TCP/UDP ones are (their CRC32c, bpf/nat.h). */
__noinline int cp_lb_reply_sctp4(struct __sk_buff *skb, struct cp_pkt *pkt, int snat_only)
{
	if (!pkt)
		return CP_LB_MISS;
	return cp_lb_reply_of(skb, pkt, snat_only, 0, 1);
}

__noinline int cp_lb_reply_sctp6(struct __sk_buff *skb, struct cp_pkt *pkt, int snat_only)
{
	if (!pkt)
		return CP_LB_MISS;
	return cp_lb_reply_of(skb, pkt, snat_only, 1, 1);
}

/* A backend's reply of a per-packet flow (cp_lb_reply_of), of either
 * family. CP_LB_MISS or the tc verdict. */
static __always_inline int cp_lb_reply(struct __sk_buff *skb, struct cp_pkt *pkt, int snat_only)
{
	int v;

	switch (cp_lb_family(skb, pkt)) {
	case 4:
		if (pkt->l4proto != IPPROTO_SCTP_)
			return cp_lb_reply4(skb, pkt, snat_only);
		cp_sctp_begin(skb);
		v = cp_lb_reply_sctp4(skb, pkt, snat_only);
		break;
	case 6:
		if (pkt->l4proto != IPPROTO_SCTP_)
			return cp_lb_reply6(skb, pkt, snat_only);
		cp_sctp_begin(skb);
		v = cp_lb_reply_sctp6(skb, pkt, snat_only);
		break;
	default:
		return CP_LB_MISS;
	}
	/* SCTP's CRC, for the ports rewritten (bpf/nat.h cp_sctp_port); the
	 * packet is sent once the program returns */
	if (v != CP_LB_MISS && cp_sctp_crc(skb) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	return v;
}

/* cp_lb_icmp_error's first case: an error about a request, for the client.
 * CP_LB_MISS or the tc verdict. */
static __noinline int cp_lb_icmp_request_error(struct __sk_buff *skb, struct cp_pkt *pkt)
{
	const struct cp_params *cfg = cp_get_params();
	const struct cp_backend *fe;
	const struct cp_lb_val *v;
	struct cp_masq_key k;
	__u32 id;

	if (!cfg || cp_lb_icmp_key(skb, pkt, &k) < 0)
		return CP_LB_MISS;
	/* k is the flow's reply tuple */
	v = bpf_map_lookup_elem(&cp_lb_rev, &k);
	if (!v)
		return CP_LB_MISS;

	__be32 backend = k.src.w[3], client = v->client.w[3];
	__be16 client_port = v->client_port;
	__u32 flags = v->flags, ifindex = v->ifindex;

	id = v->rev_id;
	if (!(flags & CP_LB_F_SNAT) && !ifindex)
		return CP_LB_MISS; /* a pod's own ClusterIP flow */
	fe = bpf_map_lookup_elem(&cp_svc_revs, &id);
	if (!fe)
		return CP_LB_MISS;
	if (cp_icmp_quoted_addr(skb, CP_QIP_DADDR_OFF, backend, fe->addr.w[3]) < 0 ||
	    cp_icmp_word(skb, CP_QL4_OFF + 2, k.sport, fe->port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	if (flags & CP_LB_F_SNAT) {
		if (cp_icmp_addr(skb, CP_IP4_DADDR_OFF, CP_QIP_SADDR_OFF, k.dst.w[3], client) < 0 ||
		    cp_icmp_word(skb, CP_QL4_OFF, k.dport, client_port) < 0)
			return cp_drop(CP_DROP_LB_NAT);
		addr_from_ip4(&pkt->dst, client);
	}
	if (cp_addr_eq(&pkt->src, &k.src)) {
		if (cp_icmp_outer_addr(skb, CP_IP4_SADDR_OFF, backend, fe->addr.w[3]) < 0)
			return cp_drop(CP_DROP_LB_NAT);
		pkt->src = fe->addr;
	}
	return cp_lb_to_client(skb, pkt, cfg, ifindex);
}

/* Does per-packet flow `v` (a cp_lb_fwd entry) still have the backend it
 * was given? Ids are reused (see cp_lb_request_of): a flow whose id now
 * names another backend is no longer one to translate for. */
static __always_inline int cp_lb_flow_current(const struct cp_lb_val *v)
{
	__u32 id = v->backend_id;
	const struct cp_backend *b = bpf_map_lookup_elem(&cp_backends, &id);

	return b && cp_addr_eq(&b->addr, &v->client) && b->port == v->client_port;
}

/* cp_lb_icmp_error's second case: an error about a reply, for the backend.
 * CP_LB_MISS, CP_LB_SEND (`pkt->dst` is the backend) or a drop. */
static __noinline int cp_lb_icmp_reply_error(struct __sk_buff *skb, struct cp_pkt *pkt)
{
	const struct cp_params *cfg = cp_get_params();
	const struct cp_lb_val *v;
	struct cp_masq_key k;

	if (!cfg || cp_lb_icmp_key(skb, pkt, &k) < 0)
		return CP_LB_MISS;
	/* k is the flow's request tuple */
	v = bpf_map_lookup_elem(&cp_lb_fwd, &k);
	if (!v || !cp_lb_flow_current(v))
		return CP_LB_MISS;

	__be32 frontend = k.dst.w[3], backend = v->client.w[3];
	__be16 backend_port = v->client_port, snat_port = v->snat_port;
	__u32 flags = v->flags;

	if (cp_icmp_addr(skb, CP_IP4_DADDR_OFF, CP_QIP_SADDR_OFF, frontend, backend) < 0 ||
	    cp_icmp_word(skb, CP_QL4_OFF, k.dport, backend_port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	if (flags & CP_LB_F_SNAT) {
		if (cp_icmp_quoted_addr(skb, CP_QIP_DADDR_OFF, k.src.w[3], cfg->node_ip) < 0 ||
		    cp_icmp_word(skb, CP_QL4_OFF + 2, k.sport, snat_port) < 0)
			return cp_drop(CP_DROP_LB_NAT);
	}
	addr_from_ip4(&pkt->dst, backend);
	return CP_LB_SEND;
}

/*
 * ICMPv6 errors (destination unreachable, packet too big, time exceeded)
 * about an IPv6 per-packet flow: the two cases of cp_lb_icmp_error (below),
 * with the ICMPv6 checksum's pseudo header covering the outer addresses. Packet
 * too big matters most here: IPv6 routers never fragment, so a client
 * whose path MTU is below the backend's learns it only through the error
 * about a reply, translated to the backend.
 */

/*
 * The first case, for the client: an error about a request (quoting the
 * client or this node's SNAT address -> the backend). A global function,
 * checked once by the verifier (see cp_lb_request4). CP_LB_MISS or the tc
 * verdict.
 */
__noinline int cp_lb_icmp6_request_error(struct __sk_buff *skb, struct cp_pkt *pkt)
{
	const struct cp_params *cfg = cp_get_params();
	const struct cp_backend *fe;
	const struct cp_lb_val *v;
	struct cp_masq_key k;
	__u32 flags, ifindex, id;

	if (!pkt || !cfg || cp_lb_icmp6_key(skb, pkt, &k) < 0)
		return CP_LB_MISS;
	/* k is the flow's reply tuple */
	v = bpf_map_lookup_elem(&cp_lb_rev, &k);
	if (!v)
		return CP_LB_MISS;
	flags = v->flags;
	ifindex = v->ifindex;
	id = v->rev_id;
	if (!(flags & CP_LB_F_SNAT) && !ifindex)
		return CP_LB_MISS; /* not a flow from the wire or another node */
	fe = bpf_map_lookup_elem(&cp_svc_revs, &id);
	if (!fe)
		return CP_LB_MISS;
	/* the values are read in place (each helper copies the new address
	 * before use): copies here would take this frame past from_pod's
	 * 512 bytes of stack */
	if (cp_icmp6_quoted_addr(skb, CP_QIP6_DADDR_OFF, &k.src, &fe->addr) < 0 ||
	    cp_icmp6_word(skb, CP_QL6_OFF + 2, k.sport, fe->port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	if (flags & CP_LB_F_SNAT) {
		if (cp_icmp6_addr(skb, CP_IP6_DADDR_OFF, CP_QIP6_SADDR_OFF, &k.dst, &v->client) < 0 ||
		    cp_icmp6_word(skb, CP_QL6_OFF, k.dport, v->client_port) < 0)
			return cp_drop(CP_DROP_LB_NAT);
		pkt->dst = v->client;
	}
	if (cp_addr_eq(&pkt->src, &k.src)) {
		if (cp_icmp6_outer_addr(skb, CP_IP6_SADDR_OFF, &k.src, &fe->addr) < 0)
			return cp_drop(CP_DROP_LB_NAT);
		pkt->src = fe->addr;
	}
	return cp_lb_to_client(skb, pkt, cfg, ifindex);
}

/*
 * The second case, for the backend: an error about a reply this node sent
 * for a frontend (quoting the frontend -> the client), addressed to the
 * frontend. CP_LB_MISS, CP_LB_SEND (`pkt->dst` is the backend) or a drop.
 */
__noinline int cp_lb_icmp6_reply_error(struct __sk_buff *skb, struct cp_pkt *pkt)
{
	const struct cp_params *cfg = cp_get_params();
	const struct cp_lb_val *v;
	struct addr128 backend, node;
	struct cp_masq_key k;
	__be16 backend_port, snat_port;
	__u32 flags;

	if (!pkt || !cfg || cp_lb_icmp6_key(skb, pkt, &k) < 0)
		return CP_LB_MISS;
	/* k is the flow's request tuple */
	v = bpf_map_lookup_elem(&cp_lb_fwd, &k);
	if (!v || !cp_lb_flow_current(v))
		return CP_LB_MISS;
	backend = v->client;
	backend_port = v->client_port;
	snat_port = v->snat_port;
	flags = v->flags;
	if (cp_icmp6_addr(skb, CP_IP6_DADDR_OFF, CP_QIP6_SADDR_OFF, &k.dst, &backend) < 0 ||
	    cp_icmp6_word(skb, CP_QL6_OFF, k.dport, backend_port) < 0)
		return cp_drop(CP_DROP_LB_NAT);
	if (flags & CP_LB_F_SNAT) {
		node = cfg->node_ip6;
		if (cp_icmp6_quoted_addr(skb, CP_QIP6_DADDR_OFF, &k.src, &node) < 0 ||
		    cp_icmp6_word(skb, CP_QL6_OFF + 2, k.sport, snat_port) < 0)
			return cp_drop(CP_DROP_LB_NAT);
	}
	pkt->dst = backend;
	return CP_LB_SEND;
}

/*
 * An ICMP error of either family (destination unreachable - path MTU
 * included - time exceeded, ICMPv6's packet too big) about a per-packet
 * flow, translated as the packet it quotes was, so that path MTU discovery and a backend's "port unreachable" work
 * through a NodePort, a LoadBalancer IP or an externalIP:
 *
 * - About a request sent on to a backend (the quote: the client, or this
 *   node's SNAT address, -> the backend), from the backend or a hop before
 *   it, addressed to the quote's source: the quote's tuple swapped is the
 *   flow's reply tuple (cp_lb_rev). The error goes to the client as one
 *   about its own request: the quoted destination becomes the frontend,
 *   the outer destination and the quoted source the client when the flow
 *   is SNATed, and the outer source the frontend when the backend itself
 *   sent it (as kube-proxy's conntrack rewrites it).
 * - About a reply this node sent for a frontend (the
 *   quote: the frontend -> the client), from a hop towards the client,
 *   addressed to the frontend: the quote swapped is the flow's request
 *   tuple (cp_lb_fwd). The error goes to the backend as one about its own
 *   reply: the outer destination and the quoted source become the
 *   backend's, the quoted destination this node's SNAT address and port
 *   when the flow is SNATed. Such errors arrive on the uplink or the
 *   overlay, never from a pod: from_pod asks for the first case only.
 *
 * Each case is a subprogram of its own, so that from_pod's chain of calls
 * stays within the verifier's 512 bytes of stack.
 *
 * Anything else - not an error, a quote we cannot vouch for, no flow, a
 * frontend or backend that is gone, an error about a pod's own ClusterIP
 * flow (the gate's: cp_lb_inside_icmp_error) - returns CP_LB_MISS
 * untouched: the node's own ICMP, never ours to drop. A rewrite that fails
 * drops.
 *
 * Returns CP_LB_MISS or the tc verdict.
 */
static __always_inline int cp_lb_icmp_error(struct __sk_buff *skb, struct cp_pkt *pkt)
{
	const struct cp_params *cfg;
	int v6 = pkt->l4proto == IPPROTO_ICMPV6_;
	int v = v6 ? cp_lb_icmp6_request_error(skb, pkt) : cp_lb_icmp_request_error(skb, pkt);

	if (v != CP_LB_MISS)
		return v;
	v = v6 ? cp_lb_icmp6_reply_error(skb, pkt) : cp_lb_icmp_reply_error(skb, pkt);
	if (v != CP_LB_SEND)
		return v;
	cfg = cp_get_params();
	if (!cfg)
		return cp_drop(CP_DROP_NO_CONFIG);
	return cp_lb_send(skb, pkt, cfg, 0, 1);
}

/* What from_pod asks of the per-packet load balancer on its way to a node
 * or outside: a backend's reply, or an ICMP error of either family about a
 * request (the first case only). CP_LB_MISS or the tc verdict. */
static __always_inline int cp_lb_pod_reply(struct __sk_buff *skb, struct cp_pkt *pkt)
{
	if (pkt->l4proto == IPPROTO_ICMP_)
		return cp_lb_icmp_request_error(skb, pkt);
	if (pkt->l4proto == IPPROTO_ICMPV6_)
		return cp_lb_icmp6_request_error(skb, pkt);
	return cp_lb_reply(skb, pkt, 0);
}

/* What from_uplink and from_overlay ask for first: an ICMP error about a
 * flow, of either family, else a reply to this node's SNAT address.
 * CP_LB_MISS or the tc verdict. */
static __always_inline int cp_lb_wire_reply(struct __sk_buff *skb, struct cp_pkt *pkt)
{
	if (pkt->l4proto == IPPROTO_ICMP_ || pkt->l4proto == IPPROTO_ICMPV6_) {
		int v = cp_lb_icmp_error(skb, pkt);

		if (v != CP_LB_MISS)
			return v;
	}
	return cp_lb_reply(skb, pkt, 1);
}

#endif /* CP_LB_H */
