/* SPDX-License-Identifier: GPL-2.0 */
/*
 * encap.h - THE seam for the overlay tunnel.
 *
 * Everything tunnel-specific lives here: how a network id maps to a VNI,
 * how the tunnel key is written on the way out and read on the way in.
 * Today the overlay is VXLAN in external (collect_md) mode because this
 * kernel has no Geneve; a Geneve device in external mode takes the same
 * bpf_skb_{set,get}_tunnel_key calls, and options (TLVs) would be added
 * here with bpf_skb_{set,get}_tunnel_opt only.
 *
 * Test builds (CP_TEST_HOOKS, a separate object that production never
 * loads) cannot observe tunnel metadata through BPF_PROG_TEST_RUN: the
 * kernel does not hand it back and a test-run skb carries none on input.
 * So in that build only, the chosen key is recorded in cp_test_encap and
 * the receive side reads {vni, sender} from skb->cb[0..1].
 */
#ifndef CP_ENCAP_H
#define CP_ENCAP_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "parse.h"

/* VNI of a network: net 0 rides VNI 1, other networks use their id. */
static __always_inline __u32 cp_net_to_vni(__u32 net)
{
	return net == CP_NET_DEFAULT ? CP_VNI_DEFAULT : net;
}

#ifdef CP_TEST_HOOKS
struct cp_test_encap {
	__u32 vni;
	__be32 remote;       /* as stored in the maps: network order */
	__u32 ifindex;       /* redirect target, 0 if not redirected */
	__u32 count;         /* how many packets were encapsulated */
	__u32 key_remote;    /* what the helper got: host order */
	__u32 key_local;     /* the outer source the helper got: host order */
};
CP_ABI_SIZE(struct cp_test_encap, 24);
CP_ABI_OFFSET(struct cp_test_encap, remote, 4);
CP_ABI_OFFSET(struct cp_test_encap, ifindex, 8);
CP_ABI_OFFSET(struct cp_test_encap, count, 12);
CP_ABI_OFFSET(struct cp_test_encap, key_remote, 16);
CP_ABI_OFFSET(struct cp_test_encap, key_local, 20);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cp_test_encap);
} cp_test_encap SEC(".maps");

static __always_inline void cp_test_record(__u32 vni, __be32 remote, __u32 key_remote,
					   __u32 key_local, __u32 ifindex)
{
	__u32 zero = 0;
	struct cp_test_encap *t = bpf_map_lookup_elem(&cp_test_encap, &zero);

	if (t) {
		t->vni = vni;
		t->remote = remote;
		t->key_remote = key_remote;
		t->key_local = key_local;
		t->ifindex = ifindex;
		t->count += 1;
	}
}
#endif

static const __u8 cp_overlay_mac[ETH_ALEN] = {
	CP_OVERLAY_MAC0, CP_OVERLAY_MAC_BYTE, CP_OVERLAY_MAC_BYTE,
	CP_OVERLAY_MAC_BYTE, CP_OVERLAY_MAC_BYTE, CP_OVERLAY_MAC_BYTE,
};

enum cp_marks {
	/*
	 * skb->mark bit: "the tunnel key is already set" (from_pod redirected
	 * the packet to the overlay device); to_overlay clears it and lets it
	 * through.
	 */
	CP_MARK_ENCAP = 0x00800000,
};

/*
 * Write the tunnel metadata for `remote` (tunnel endpoint, network order)
 * on network `net` and point the inner frame at the shared overlay MAC.
 * `local` (network order) is this node's own tunnel endpoint: the outer
 * source is pinned to it, because receivers accept only the endpoints they
 * know (cp_vteps, bpf/learn.h) and on a multi-homed node the kernel's own
 * choice of source could be another address. 0 leaves the choice to the
 * kernel. `redirect_to` is only recorded by test builds. Returns 0 or a
 * drop reason.
 */
static __always_inline int cp_encap_set(struct __sk_buff *skb, __u32 net, __be32 remote,
					__be32 local, __u32 redirect_to)
{
	struct bpf_tunnel_key key = {};
	__u32 vni = cp_net_to_vni(net);

	if (cp_set_dst_mac(skb, cp_overlay_mac) < 0)
		return CP_DROP_MALFORMED;

	key.tunnel_id = vni;
	key.remote_ipv4 = bpf_ntohl(remote); /* the helper wants host order */
	key.local_ipv4 = bpf_ntohl(local);
	key.tunnel_ttl = CP_TUNNEL_TTL;
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), BPF_F_ZERO_CSUM_TX) < 0)
		return CP_DROP_ENCAP;
#ifdef CP_TEST_HOOKS
	cp_test_record(vni, remote, key.remote_ipv4, key.local_ipv4, redirect_to);
#endif
	return 0;
}

/*
 * Encapsulate towards `remote` on network `net` and redirect to the overlay
 * device (its egress, where to_overlay lets marked packets through).
 * Returns the tc verdict.
 */
static __always_inline int cp_encap_redirect(struct __sk_buff *skb, __u32 net,
					     __be32 remote)
{
	const struct cp_params *cfg = cp_get_params();
	__u32 vxlan;
	int reason;

	if (!cfg || !cfg->vxlan_ifindex)
		return cp_drop(CP_DROP_NO_CONFIG);
	vxlan = cfg->vxlan_ifindex;

	reason = cp_encap_set(skb, net, remote, cfg->node_ip, vxlan);
	if (reason)
		return cp_drop(reason);
	skb->mark |= CP_MARK_ENCAP;
	return bpf_redirect(vxlan, 0);
}

/*
 * Is `pkt` UDP to the overlay's port (CP_VXLAN_PORT)? Such a packet handed
 * to a node would reach its VXLAN socket, and masqueraded it would leave as
 * node-sourced VXLAN that other nodes' sender check accepts, with a VNI and
 * inner frame of the sender's choosing. IPv4: an unfragmented packet or a
 * first fragment (a later fragment carries no port, and its first was
 * checked). IPv6: UDP right after the fixed header (extension headers are
 * not walked; IPv6 is never masqueraded and reaches no node's IPv4 VXLAN
 * socket with a node's source).
 */
static __always_inline int cp_is_overlay_port(struct __sk_buff *skb, const struct cp_pkt *pkt)
{
	__be16 dport;

	if (pkt->l4proto != IPPROTO_UDP_ || (pkt->flags & CP_PKT_LATER_FRAG))
		return 0;
	if (bpf_skb_load_bytes(skb, pkt->l4_off + 2, &dport, sizeof(dport)) < 0)
		return 0;
	return dport == bpf_htons(CP_VXLAN_PORT);
}

/*
 * Read the tunnel metadata of a decapsulated packet: its VNI and the outer
 * IPv4 source (`sender`, network order, like every address in the maps).
 * The VXLAN device is in external (collect_md) mode, so the kernel hands
 * both over. Returns 0 on success.
 *
 * Test build: skb->cb[0] is the VNI (0 = no metadata) and skb->cb[1] the
 * sender in host order, i.e. what bpf_skb_get_tunnel_key() reports.
 */
static __always_inline int cp_tunnel_meta(struct __sk_buff *skb, __u32 *vni, __be32 *sender)
{
#ifdef CP_TEST_HOOKS
	__u32 v = skb->cb[0];

	if (!v)
		return -1;
	*vni = v;
	*sender = bpf_htonl(skb->cb[1]);
	return 0;
#else
	struct bpf_tunnel_key key = {};

	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) < 0)
		return -1;
	*vni = key.tunnel_id;
	*sender = bpf_htonl(key.remote_ipv4); /* the helper reports host order */
	return 0;
#endif
}

#endif /* CP_ENCAP_H */
