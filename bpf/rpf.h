/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rpf.h - reverse-path filtering at the origin veth.
 *
 * A pod may only send with a source address that cp_locals maps to this
 * very host veth. Doing it at the origin is the only place it can be done
 * with certainty: an overlay identity computed by the sender's node from
 * a spoofable source proves nothing (docs/lessons.md #41).
 */
#ifndef CP_RPF_H
#define CP_RPF_H

#include "maps.h"
#include "parse.h"

/*
 * `key` is caller-provided scratch (keeps the hot hook's stack flat).
 * Returns 1 when `pkt->src` belongs to the pod behind `ifindex` on `net`.
 */
static __always_inline int cp_rpf_ok(struct cp_ep_key *key, __u32 net,
				     const struct cp_pkt *pkt, __u32 ifindex)
{
	const struct cp_endpoint *ep;

	key->net = net;
	key->addr = pkt->src;
	ep = bpf_map_lookup_elem(&cp_locals, key);
	return ep && ep->ifindex == ifindex;
}

#endif /* CP_RPF_H */
