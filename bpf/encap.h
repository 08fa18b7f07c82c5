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
 * tc mode (CP_PARAM_F_TC_TUNNEL): the VXLAN headers are built here and the
 * packet goes straight to the uplink, so the kernel's VXLAN transmit (a
 * route lookup per packet once the key comes from BPF) and receive (UDP,
 * vxlan_rcv, a gro_cells softirq hop) are skipped. The wire format is the
 * device's: a node in either mode talks to a node in the other.
 *
 * The room is outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14),
 * inserted after the frame's Ethernet header, which becomes the outer one.
 */
enum cp_tc_tunnel {
	CP_VXLAN_ROOM = 50,
	/* VXLAN flags word with the I bit (a valid VNI follows), host order */
	CP_VXLAN_FLAG_I = 0x08000000,
	/* outer UDP source ports, by flow hash (RFC 7348: 49152-65535) */
	CP_VXLAN_SPORT_BASE = 0xc000,
	CP_VXLAN_SPORT_MASK = 0x3fff,
};

/* cp_encap_tc could not take the packet: the device path does. */
#define CP_ENCAP_FALLBACK (-1)

/*
 * Encapsulate in place towards `remote` (network order) on VNI `vni`, the
 * outer source `local`. The pod MTU already leaves room for the 50 bytes,
 * so a GSO packet keeps its segment size (FIXED_GSO) and is segmented, with
 * its tunnel headers, where the uplink needs it (SKB_GSO_UDP_TUNNEL).
 * Returns 0, CP_ENCAP_FALLBACK before anything was changed (a packet that
 * already carries an encapsulation, a GSO type the helper refuses), or a
 * drop reason.
 */
static __always_inline int cp_encap_tc(struct __sk_buff *skb, __u32 vni, __be32 remote,
				       __be32 local)
{
	const __u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
			    BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
			    ((__u64)CP_ETH_HLEN << BPF_ADJ_ROOM_ENCAP_L2_SHIFT);
	__be16 inner_proto = skb->protocol;
	__u32 hash = bpf_get_hash_recalc(skb);
	/* the outer IPv4 packet: the room less its inner Ethernet header, and
	 * the frame less its Ethernet header, which becomes the outer one */
	__u32 tot = skb->len + CP_VXLAN_ROOM - CP_ETH_HLEN;
	struct ethhdr *eth, *inner;
	struct udphdr *udp;
	struct iphdr *ip;
	void *data, *data_end;
	__u16 *w;
	__be32 *vx;
	__u32 sum = 0;

	if (!local || skb->len < CP_ETH_HLEN)
		return CP_ENCAP_FALLBACK;
	/* a GSO packet's outer lengths are rewritten per segment */
	if (tot > 0xffff)
		tot = 0xffff;
	if (bpf_skb_adjust_room(skb, CP_VXLAN_ROOM, BPF_ADJ_ROOM_MAC, flags) < 0)
		return CP_ENCAP_FALLBACK;

	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	vx = (void *)(udp + 1);
	inner = (void *)(vx + 2);
	if ((void *)(inner + 1) > data_end)
		return CP_DROP_ENCAP;

	eth->h_proto = bpf_htons(ETH_P_IP);
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(tot);
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000); /* DF: the pod MTU leaves the room */
	ip->ttl = CP_TUNNEL_TTL;
	ip->protocol = IPPROTO_UDP_;
	ip->check = 0;
	ip->saddr = local;
	ip->daddr = remote;
	w = (void *)ip;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ip->check = (__u16)~sum;

	hash ^= hash >> 16;
	udp->source = bpf_htons(CP_VXLAN_SPORT_BASE | (hash & CP_VXLAN_SPORT_MASK));
	udp->dest = bpf_htons(CP_VXLAN_PORT);
	udp->len = bpf_htons(tot - sizeof(struct iphdr));
	udp->check = 0; /* IPv4: none, as the device sends with BPF_F_ZERO_CSUM_TX */
	vx[0] = bpf_htonl(CP_VXLAN_FLAG_I);
	vx[1] = bpf_htonl(vni << 8);

	/* inner frame: to the shared overlay MAC (PACKET_HOST on a receiver in
	 * device mode), from this node's own 02:cf:<node IPv4> (a device
	 * drops frames from its own MAC as loops) */
	__builtin_memcpy(inner->h_dest, cp_overlay_mac, ETH_ALEN);
	inner->h_source[0] = CP_OVERLAY_MAC0;
	inner->h_source[1] = CP_OVERLAY_MAC_BYTE;
	__builtin_memcpy(&inner->h_source[2], &local, 4);
	inner->h_proto = inner_proto;
	return 0;
}

/*
 * Is this frame VXLAN for this node, as tc mode decapsulates it: outer IPv4
 * without options, unfragmented, to `node_ip`, UDP to CP_VXLAN_PORT, the I
 * flag set? Then its VNI, outer source (network order) and the inner
 * frame's ethertype. Returns 1 if so, 0 for anything else (which goes on to
 * the kernel: the device path still takes odd VXLAN, and from_overlay
 * judges it there).
 */
static __always_inline int cp_vxlan_rx(struct __sk_buff *skb, __be32 node_ip, __u32 *vni,
				       __be32 *sender, __be16 *inner_proto)
{
	const __u32 need = CP_ETH_HLEN + CP_VXLAN_ROOM;
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth, *inner;
	struct udphdr *udp;
	struct iphdr *ip;
	__be32 *vx;

	if (skb->protocol != bpf_htons(ETH_P_IP) || skb->len < need)
		return 0;
	if (data + need > data_end) {
		if (bpf_skb_pull_data(skb, need) < 0)
			return 0;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	vx = (void *)(udp + 1);
	inner = (void *)(vx + 2);
	if ((void *)(inner + 1) > data_end)
		return 0;
	if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP_ ||
	    (ip->frag_off & bpf_htons(IP_MF_ | IP_OFFSET_)) || ip->daddr != node_ip ||
	    udp->dest != bpf_htons(CP_VXLAN_PORT) || !(vx[0] & bpf_htonl(CP_VXLAN_FLAG_I)))
		return 0;
	*vni = bpf_ntohl(vx[1]) >> 8;
	*sender = ip->saddr;
	*inner_proto = inner->h_proto;
	return 1;
}

/*
 * Strip the outer headers of a frame cp_vxlan_rx took: the outer Ethernet
 * header stays (its destination is this node's uplink) with the inner
 * ethertype. A GSO packet keeps its segment size. Returns 0 or < 0 with
 * the frame unchanged.
 */
static __always_inline int cp_decap_tc(struct __sk_buff *skb, __be16 inner_proto)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;

	flags |= inner_proto == bpf_htons(ETH_P_IPV6) ? BPF_F_ADJ_ROOM_DECAP_L3_IPV6
						       : BPF_F_ADJ_ROOM_DECAP_L3_IPV4;
	if (bpf_skb_adjust_room(skb, -CP_VXLAN_ROOM, BPF_ADJ_ROOM_MAC, flags) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_proto), &inner_proto,
				   sizeof(inner_proto), 0);
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

	if ((cfg->flags & CP_PARAM_F_TC_TUNNEL) && cfg->uplink_ifindex) {
		reason = cp_encap_tc(skb, cp_net_to_vni(net), remote, cfg->node_ip);
		if (!reason) {
#ifdef CP_TEST_HOOKS
			cp_test_record(cp_net_to_vni(net), remote, bpf_ntohl(remote),
				       bpf_ntohl(cfg->node_ip), cfg->uplink_ifindex);
#endif
			return bpf_redirect_neigh(cfg->uplink_ifindex, NULL, 0, 0);
		}
		if (reason != CP_ENCAP_FALLBACK)
			return cp_drop(reason);
	}

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
