/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vpc.h - VPC isolation and quarantine.
 *
 * A VPC's network id equals its VNI (>= 100; net 0, the default network,
 * rides VNI 1: cp_net_to_vni). A VPC pod's host veth has cp_ports = {vni};
 * its VPC address is in cp_locals {vni, addr}; the VPC's pods on other nodes
 * are host entries (/32, /128) in cp_remotes {vni, addr} -> that node's
 * tunnel endpoint; cp_vnis maps vni -> vni for every VPC the node serves.
 *
 * The rules (docs/datapath.md, "VPC isolation"):
 *   - from_pod: a VPC pod reaches exactly the endpoints of its own VPC, in
 *     cp_locals or cp_remotes under its own net. Nothing of it goes to the
 *     kernel (whose tables are the default network's): not a node, not a
 *     net-0 pod, not another VPC (a twin VPC's identical address included),
 *     not the outside, not the overlay port, no learned entry. Dropped as
 *     vpc_isolated. ARP and IPv6 ND/MLD with its own host veth stay allowed
 *     (from_pod, before this);
 *   - from_overlay: nothing is learned on a VPC; the inner source must be a
 *     Port of that VPC on the sending node: cp_remotes {net, src} exists
 *     (vpc_source otherwise) and names the outer sender (vpc_sender
 *     otherwise). The destination must be a local endpoint of that VPC
 *     (no_endpoint);
 *   - the destination gate (deliver.h): a VPC port admits only inline
 *     deliveries of its own net; whatever the kernel routes into it is
 *     refused (vpc_kernel_path) until the dual-address bridge admits its
 *     node -> fabric IP translation there. A net-0 packet never enters a
 *     VPC port (the gate's port->net check);
 *   - quarantine (CP_PORT_F_QUARANTINE, maps.h): a severed port sends
 *     nothing (from_pod, before parsing: ARP and ND too) and the gate
 *     delivers nothing into it (quarantined);
 *   - peering (cp_peer_routes): a live peering of VPCs A and B puts B's
 *     CIDRs under A's net and A's under B's, each naming the other's net.
 *     A pod of A whose destination is no endpoint of A but lies in a peer
 *     CIDR is delivered (gate on B's net) or encapsulated with B's VNI to
 *     an endpoint of B; nothing else of B's net is reachable. On receipt
 *     the inner source may be a Port of the peer that the peer route
 *     names, on the sending node. Routes are per pair: peering is not
 *     transitive (A-B and B-C give A no route to C).
 */
#ifndef CP_VPC_H
#define CP_VPC_H

#include "common.h"
#include "maps.h"
#include "meter.h"
#include "parse.h"
#include "rpf.h"

#define CP_MAX_PEER_ROUTES 4096

/* {net, peer CIDR} -> the peer VPC's net: the live peerings (agent-owned). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_PEER_ROUTES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_lpm_key);
	__type(value, __u32);
} cp_peer_routes SEC(".maps");

/* The peer net whose CIDR holds `addr`, seen from `net`; 0 when none. */
static __always_inline __u32 cp_peer_of(__u32 net, const struct addr128 *addr)
{
	struct cp_lpm_key lk;
	const __u32 *peer;

	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = net;
	lk.addr = *addr;
	peer = bpf_map_lookup_elem(&cp_peer_routes, &lk);
	return peer ? *peer : 0;
}
#include "encap.h"
#include "deliver.h"

/* cp_vpc_from_pod(): the destination is no endpoint of the pod's VPC. */
#define CP_VPC_OFF_NET 0x200

/*
 * from_pod for a pod on VPC `net` (!= CP_NET_DEFAULT), after RPF. Returns the
 * tc verdict of a delivery or encapsulation within the VPC, or
 * CP_VPC_OFF_NET: then the only way left is the bridge's reverse path (a
 * reply to 169.254.1.1 / fe80::1), and from_pod drops the rest as
 * vpc_isolated. `key` is caller scratch.
 *
 * Peering slots in after the two lookups below: a peer's endpoints are
 * looked up under this net's scope (a cp_peers {net, dst} -> peer net
 * check), delivered with the peer's net to the gate and encapsulated with
 * the peer's VNI; nothing else of this function changes.
 */
static __always_inline int cp_vpc_from_pod(struct __sk_buff *skb, const struct cp_pkt *pkt,
					   __u32 net, struct cp_ep_key *key)
{
	const struct cp_endpoint *ep;
	const struct cp_remote *rem;
	struct cp_lpm_key lk;

	/* 64:ff9b::/96 aliases the IPv4 keys of this very VPC */
	if (pkt->flags & CP_PKT_DST_NAT64)
		goto isolated;

	/* this node: the pod itself too (never handed to the kernel) */
	key->net = net;
	key->addr = pkt->dst;
	ep = bpf_map_lookup_elem(&cp_locals, key);
	if (ep)
		return cp_meter_egress(skb, net, cp_deliver_local(skb, pkt, net, ep, key));

	/* another node's Port of this VPC */
	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = net;
	lk.addr = pkt->dst;
	rem = bpf_map_lookup_elem(&cp_remotes, &lk);
	if (rem)
		return cp_meter_egress(skb, net, cp_encap_redirect(skb, net, rem->tunnel_ip));

	/* a peered VPC's endpoint: delivered on the peer's net, carried with
	 * the peer's VNI (the receiver checks the source against its own
	 * route back) */
	{
		__u32 peer = cp_peer_of(net, &pkt->dst);

		if (peer && peer != net) {
			key->net = peer;
			key->addr = pkt->dst;
			ep = bpf_map_lookup_elem(&cp_locals, key);
			if (ep)
				return cp_meter_egress(skb, net,
						       cp_deliver_local(skb, pkt, peer, ep, key));
			lk.net = peer;
			rem = bpf_map_lookup_elem(&cp_remotes, &lk);
			if (rem)
				return cp_meter_egress(skb, net,
						       cp_encap_redirect(skb, peer, rem->tunnel_ip));
		}
	}

isolated:
	return CP_VPC_OFF_NET;
}

/*
 * from_overlay on VPC `net` (!= CP_NET_DEFAULT): is the inner source a Port
 * of that VPC on the node that sent it? Returns 0, or the drop reason:
 * vpc_source when cp_remotes has no entry {net, src} (a spoofed inner
 * source, a Port of this node, an address of another VPC or of net 0),
 * vpc_sender when it names another node's tunnel endpoint than the outer
 * source (a node posing as another node's pods). VPC Ports are known before
 * they send, so a VPC never learns (bpf/learn.h is net 0's). Limit: a VM
 * that live-migrates is cut off until its Port's remote entry moves.
 */
static __always_inline int cp_vpc_source_check(const struct cp_pkt *pkt, __u32 net,
					       __be32 sender)
{
	const struct cp_remote *rem;
	struct cp_lpm_key lk;

	/* 64:ff9b::/96 would pass for an IPv4 Port's key */
	if (pkt->flags & CP_PKT_SRC_NAT64)
		return CP_DROP_VPC_SOURCE;
	lk.prefixlen = CP_LPM_NET_BITS + 128;
	lk.net = net;
	lk.addr = pkt->src;
	rem = bpf_map_lookup_elem(&cp_remotes, &lk);
	if (!rem) {
		/* a Port of a VPC peered with this one, in the peer's CIDR */
		__u32 peer = cp_peer_of(net, &pkt->src);

		if (!peer || peer == net)
			return CP_DROP_VPC_SOURCE;
		lk.net = peer;
		rem = bpf_map_lookup_elem(&cp_remotes, &lk);
		if (!rem)
			return CP_DROP_VPC_SOURCE;
	}
	if (rem->tunnel_ip != sender)
		return CP_DROP_VPC_SENDER;
	return 0;
}

#define ICMPV6_ECHO_REQUEST_ 128
#define ICMPV6_ECHO_REPLY_ 129

/*
 * to_pod, IPv6 link scope (CP_PKT_V6_KERNEL) into host veth `ifindex`: the
 * host's own neighbour discovery and ICMPv6 with the pod, which the gate
 * never sees. A default-network port takes it as before. A severed port
 * takes nothing. A VPC port takes ICMPv6 errors and ND/MLD (types 1-127 and
 * 130-143, behind at most one hop-by-hop header) and nothing else: TCP, UDP
 * and echo from the host's link-local address would be a node -> VPC pod
 * path outside the bridge. Returns the tc verdict.
 */
static __always_inline int cp_vpc_to_pod_link_scope(struct __sk_buff *skb,
						    const struct cp_pkt *pkt, __u32 ifindex)
{
	const struct cp_port *port = bpf_map_lookup_elem(&cp_ports, &ifindex);
	__u32 off = pkt->l4_off;
	__u8 proto = pkt->l4proto;
	__u32 net;
	__u8 type;

	if (!port)
		return CP_PASS;
	net = port->net;
	if (port->flags & CP_PORT_F_QUARANTINE)
		return cp_drop_net(skb, net, CP_DROP_QUARANTINED);
	if (net == CP_NET_DEFAULT)
		return CP_PASS;
	if (proto == IPPROTO_HOPOPTS_) {
		__u8 hbh[2];

		if (bpf_skb_load_bytes(skb, off, hbh, sizeof(hbh)) < 0)
			goto kernel_path;
		proto = hbh[0];
		off += ((__u32)hbh[1] + 1) * 8;
	}
	if (proto != IPPROTO_ICMPV6_ || bpf_skb_load_bytes(skb, off, &type, 1) < 0)
		goto kernel_path;
	if (type != ICMPV6_ECHO_REQUEST_ && type != ICMPV6_ECHO_REPLY_ && type <= 143)
		return CP_PASS;
kernel_path:
	return cp_drop_net(skb, net, CP_DROP_VPC_KERNEL_PATH);
}

#endif /* CP_VPC_H */
