/* SPDX-License-Identifier: GPL-2.0 */
/*
 * learn.h - the overlay's sender check and remote learning.
 *
 * Why learning: remotes are per-pod /32s the agent compiles from FabricIP
 * claims it learns through a watch plus a debounce. A brand-new pod on node
 * A that talks to node B at once gets its first replies dropped on B (no
 * cp_remotes entry for it yet). But B already holds the proof of where the
 * pod lives: the packet that just came in from A. from_overlay records
 * {net, inner source} -> outer source in cp_learned, and the reply path
 * falls back to it on a cp_remotes miss.
 *
 * Why it cannot be abused (docs/datapath.md, "Learning"):
 *   - only senders in cp_vteps (the other nodes' tunnel endpoints) are
 *     accepted at all, so a learned entry always points at a cluster node;
 *   - an honest origin node has enforced RPF on the inner source at the
 *     pod's veth (bpf/rpf.h), so a pod cannot make its node claim another
 *     pod's address;
 *   - on the default network only pod addresses (cp_masq_srcs, the pod
 *     CIDRs) are learned, never an outside address;
 *   - authoritative knowledge always wins: an address in cp_remotes,
 *     cp_node_remotes or cp_locals is never learned, and a learned entry is
 *     only consulted when cp_remotes has nothing;
 *   - entries expire after CP_LEARN_TTL_NS and the LRU bounds their number.
 *
 * Only the default network learns (from_overlay calls cp_learn for net 0
 * only): a VPC's sources must be its Ports, known in advance (bpf/vpc.h).
 */
#ifndef CP_LEARN_H
#define CP_LEARN_H

#include "common.h"
#include "maps.h"
#include "parse.h"

/* Is `sender` (outer IPv4 source, network order) a known tunnel endpoint? */
static __always_inline int cp_sender_known(__be32 sender)
{
	return bpf_map_lookup_elem(&cp_vteps, &sender) != NULL;
}

/*
 * Record that `src` on `net` was just seen behind tunnel endpoint `sender`,
 * unless something authoritative already knows `src`. A fresh entry with the
 * same sender is left alone (no map write per packet); it is refreshed once
 * half of its lifetime has passed, so a source that keeps talking stays
 * reachable until the agent's entry arrives. `key` is caller scratch.
 */
static __always_inline void cp_learn(struct cp_ep_key *key, __u32 net,
				     const struct addr128 *src, __be32 sender)
{
	const struct cp_learned *have;
	struct cp_learned val = {};
	struct cp_lpm_key lk;
	__u64 now;

	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = net;
	lk.addr = *src;
	if (bpf_map_lookup_elem(&cp_remotes, &lk))
		return; /* the agent knows it: the common case, one lookup */
	if (net == CP_NET_DEFAULT) {
		if (bpf_map_lookup_elem(&cp_node_remotes, src))
			return; /* a node's own address */
		/* only pod addresses: a node must never be able to attract
		 * other nodes' traffic to an outside address */
		if (!bpf_map_lookup_elem(&cp_masq_srcs, &lk))
			return;
	}
	key->net = net;
	key->addr = *src;
	if (bpf_map_lookup_elem(&cp_locals, key))
		return; /* ours: never learned as remote */

	now = bpf_ktime_get_ns();
	have = bpf_map_lookup_elem(&cp_learned, key);
	if (have && have->tunnel_ip == sender && have->expires_ns > now + CP_LEARN_TTL_NS / 2)
		return;
	val.tunnel_ip = sender;
	val.expires_ns = now + CP_LEARN_TTL_NS;
	bpf_map_update_elem(&cp_learned, key, &val, BPF_ANY);
}

/*
 * The tunnel endpoint learned for `dst` on `net`, if there is an entry that
 * has not expired. Only called after a cp_remotes miss. Returns 1 and sets
 * `*tip` (network order) on a hit. `key` is caller scratch.
 */
static __always_inline int cp_learned_tunnel(struct cp_ep_key *key, __u32 net,
					     const struct addr128 *dst, __be32 *tip)
{
	const struct cp_learned *l;

	key->net = net;
	key->addr = *dst;
	l = bpf_map_lookup_elem(&cp_learned, key);
	if (!l || l->expires_ns <= bpf_ktime_get_ns())
		return 0;
	*tip = l->tunnel_ip;
	return 1;
}

#endif /* CP_LEARN_H */
