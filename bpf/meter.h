/* SPDX-License-Identifier: GPL-2.0 */
/*
 * meter.h - per-network (per-VPC) packet and byte counters.
 *
 * cp_meters is keyed by {net, kind}: kind CP_METER_INGRESS (delivered into a
 * pod of that network), CP_METER_EGRESS (sent by a pod of that network and
 * forwarded: delivered on this node or encapsulated to another), or
 * CP_METER_DROP + a drop reason (enum cp_drop_reason) for packets of that
 * network the datapath dropped. Each value is {packets, bytes}, per CPU (no
 * atomics on the hot path; the agent sums the CPUs). Bytes are skb->len at
 * the counting point: the Ethernet frame, the inner one for overlay traffic.
 *
 * Only VPCs are metered (net != CP_NET_DEFAULT): the default network pays
 * one compare, not a map lookup, and has no VPC to label its counters with.
 * Nothing is counted per pod.
 *
 * Memory is bounded: a no-prealloc hash holds only the {net, kind} pairs
 * that occurred, at most CP_MAX_METERS (4096 networks, the size of cp_vnis,
 * times 16 kinds). When it is full, new pairs are not counted (existing
 * ones still are); the agent removes a network's entries when it stops
 * serving it (Datapath::forget_net_counters).
 */
#ifndef CP_METER_H
#define CP_METER_H

#include "common.h"
#include "metrics.h"

enum cp_meter_kind {
	CP_METER_INGRESS = 0,
	CP_METER_EGRESS = 1,
	/* CP_METER_DROP + reason: drops of that network by reason */
	CP_METER_DROP = 0x100,
};

/* {network id, kind}. 8 bytes. */
struct cp_meter_key {
	__u32 net;
	__u32 kind;
};
CP_ABI_SIZE(struct cp_meter_key, 8);
CP_ABI_OFFSET(struct cp_meter_key, kind, 4);

/* One CPU's count. 16 bytes. */
struct cp_meter_val {
	__u64 packets;
	__u64 bytes;
};
CP_ABI_SIZE(struct cp_meter_val, 16);
CP_ABI_OFFSET(struct cp_meter_val, bytes, 8);

#define CP_MAX_METERS 65536

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, CP_MAX_METERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_meter_key);
	__type(value, struct cp_meter_val);
} cp_meters SEC(".maps");

/* Count one packet of `bytes` for {net, kind}; net 0 is not metered. */
static __always_inline void cp_meter(__u32 net, __u32 kind, __u32 bytes)
{
	struct cp_meter_key k = { .net = net, .kind = kind };
	struct cp_meter_val first = { .packets = 1, .bytes = bytes };
	struct cp_meter_val *v;

	if (net == CP_NET_DEFAULT)
		return;
	v = bpf_map_lookup_elem(&cp_meters, &k);
	if (!v) {
		/* the first packet of this pair: create it with this CPU's count
		 * (the kernel zeroes the other CPUs'); another CPU may have won
		 * the race, then add to its entry */
		if (bpf_map_update_elem(&cp_meters, &k, &first, BPF_NOEXIST) == 0)
			return;
		v = bpf_map_lookup_elem(&cp_meters, &k);
		if (!v)
			return; /* full: not counted (see above) */
	}
	v->packets += 1;
	v->bytes += bytes;
}

/* Count the delivery of `skb` into a pod of `net`. */
static __always_inline void cp_meter_ingress(struct __sk_buff *skb, __u32 net)
{
	cp_meter(net, CP_METER_INGRESS, skb->len);
}

/* Count `skb` as sent by a pod of `net` if `verdict` forwarded it (a
 * redirect); returns `verdict`, so call sites read `return cp_meter_egress(..)`. */
static __always_inline int cp_meter_egress(struct __sk_buff *skb, __u32 net, int verdict)
{
	if (verdict == TC_ACT_REDIRECT)
		cp_meter(net, CP_METER_EGRESS, skb->len);
	return verdict;
}

/* cp_drop() for a packet whose network is known: counted globally by
 * reason (cp_drops) and for the network (cp_meters). */
static __always_inline int cp_drop_net(struct __sk_buff *skb, __u32 net, __u32 reason)
{
	cp_meter(net, CP_METER_DROP + reason, skb->len);
	return cp_drop(reason);
}

#endif /* CP_METER_H */
