/* SPDX-License-Identifier: GPL-2.0 */
/*
 * maps.h - the map ABI shared with userspace (crates/datapath/src/abi.rs
 * mirrors every struct here byte for byte). Sizes and offsets are locked
 * twice: by the CP_ABI_* asserts below at compile time, and by an
 * unprivileged Rust test that reads the compiled object (its BTF and map
 * definitions) and compares abi.rs and MAP_SPECS with it
 * (crates/datapath/src/abi/object_check.rs).
 *
 * Byte order contract (locked by tests on both sides):
 *   - addresses (addr128, tunnel/node/masquerade IPv4) and L4 ports are in
 *     network byte order, i.e. the bytes as they appear on the wire;
 *   - ifindexes, network ids, VNIs, flags, prefix lengths and configured
 *     port ranges are host-order integers.
 *
 * Sparse maps are BPF_F_NO_PREALLOC: map memory is charged to the agent's
 * memory cgroup, and preallocated 64k-entry hashes got the upstream agent
 * OOM-killed (docs/lessons.md #21). LRU maps cannot be no-prealloc, so they are
 * sized modestly.
 *
 * Every agent-owned map is pinned by name under the pin directory the
 * loader is given, so an agent restart keeps the state.
 */
#ifndef CP_MAPS_H
#define CP_MAPS_H

#include "common.h"

/* {network id, address}: endpoint identity everywhere. 20 bytes. */
struct cp_ep_key {
	__u32 net;
	struct addr128 addr;
};
CP_ABI_SIZE(struct cp_ep_key, 20);
CP_ABI_OFFSET(struct cp_ep_key, addr, 4);

/* A pod on this node. 12 bytes. */
struct cp_endpoint {
	__u32 ifindex;       /* host-side veth */
	__u8 mac[ETH_ALEN];  /* the pod's own MAC (eth0 inside the pod) */
	__u16 flags;         /* reserved, 0 */
};
CP_ABI_SIZE(struct cp_endpoint, 12);
CP_ABI_OFFSET(struct cp_endpoint, mac, 4);
CP_ABI_OFFSET(struct cp_endpoint, flags, 10);

/*
 * Scoped LPM key. prefixlen counts the bits after the prefixlen field:
 * the 32-bit net is always fully specified (so lookups never cross
 * networks), so an IPv4 /n is 32 + 96 + n and an IPv6 /n is 32 + n;
 * an IPv4 host key is 160. 24 bytes.
 */
struct cp_lpm_key {
	__u32 prefixlen;
	__u32 net;
	struct addr128 addr;
};
CP_ABI_SIZE(struct cp_lpm_key, 24);
CP_ABI_OFFSET(struct cp_lpm_key, net, 4);
CP_ABI_OFFSET(struct cp_lpm_key, addr, 8);

/* Where a remote address lives. 8 bytes. */
struct cp_remote {
	__be32 tunnel_ip;    /* the owning node's tunnel endpoint (IPv4) */
	__u32 flags;         /* reserved, 0 */
};
CP_ABI_SIZE(struct cp_remote, 8);
CP_ABI_OFFSET(struct cp_remote, flags, 4);

/*
 * A remote address learned from a decapsulated packet (cp_learned, keyed
 * by struct cp_ep_key): the sending node's tunnel endpoint, valid until
 * expires_ns (bpf_ktime_get_ns, CLOCK_MONOTONIC). 16 bytes.
 */
struct cp_learned {
	__be32 tunnel_ip;    /* outer source of the packet it was learned from */
	__u32 pad;           /* 0 */
	__u64 expires_ns;
};
CP_ABI_SIZE(struct cp_learned, 16);
CP_ABI_ALIGN(struct cp_learned, 8);
CP_ABI_OFFSET(struct cp_learned, pad, 4);
CP_ABI_OFFSET(struct cp_learned, expires_ns, 8);

/* cp_vteps value bits: who vouches for the tunnel endpoint. */
enum cp_vtep_flags {
	CP_VTEP_F_NODE = 0x1,   /* a cluster node (the agent's topology sync) */
};

/* What a host-side pod veth belongs to. 8 bytes. */
struct cp_port {
	__u32 net;
	__u32 flags;         /* CP_PORT_F_*; bit 31 reserved: gateway leg */
};
CP_ABI_SIZE(struct cp_port, 8);
CP_ABI_OFFSET(struct cp_port, flags, 4);

/* cp_port.flags bits (bit 31 stays reserved for the gateway leg). */
enum cp_port_flags {
	/*
	 * The port is severed (its VPC binding was revoked): from_pod drops
	 * everything it sends, ARP and ND included, and the destination gate
	 * delivers nothing into it (bpf/vpc.h, CP_DROP_QUARANTINED). The pod
	 * keeps running; only a new attach writes a port without the bit.
	 */
	CP_PORT_F_QUARANTINE = 0x1,
};

/* Node configuration, a single entry at index 0 of cp_params. 64 bytes. */
struct cp_params {
	__u32 vxlan_ifindex;  /* overlay device */
	__u32 uplink_ifindex; /* default-route uplink (informational) */
	__be32 node_ip;       /* this node's tunnel endpoint */
	__be32 masq_ip;       /* masquerade source; 0 disables masquerade */
	__u16 masq_port_min;  /* host order, inclusive */
	__u16 masq_port_max;  /* host order, inclusive */
	__u32 flags;          /* CP_PARAM_F_* */
	struct addr128 node_ip6; /* this node's IPv6 address for the per-packet
				  * LB's SNAT (bpf/lb.h); all zero: none */
	__u32 reserved[6];
};
CP_ABI_SIZE(struct cp_params, 64);
CP_ABI_OFFSET(struct cp_params, uplink_ifindex, 4);
CP_ABI_OFFSET(struct cp_params, node_ip, 8);
CP_ABI_OFFSET(struct cp_params, masq_ip, 12);
CP_ABI_OFFSET(struct cp_params, masq_port_min, 16);
CP_ABI_OFFSET(struct cp_params, masq_port_max, 18);
CP_ABI_OFFSET(struct cp_params, flags, 20);
CP_ABI_OFFSET(struct cp_params, node_ip6, 24);
CP_ABI_OFFSET(struct cp_params, reserved, 40);

/* cp_params.flags bits. */
enum cp_param_flags {
	/*
	 * Hand net-0 delivery into local pods (same node from_pod, and
	 * cross node from_overlay) to the kernel instead of redirecting: an
	 * iptables kube-proxy must see both directions of a ClusterIP flow in
	 * conntrack to un-DNAT replies (docs/lessons.md #11). to_pod still
	 * runs.
	 */
	CP_PARAM_F_KERNEL_LOCAL = 0x1,
	/*
	 * Deliver into local pods with bpf_redirect to the host veth's
	 * egress (to_pod runs there as well) instead of bpf_redirect_peer
	 * into the pod: slower by a veth transmit and backlog hop, but
	 * tcpdump on the host veth sees pod-bound traffic again. A debugging
	 * switch (bpf/deliver.h).
	 */
	CP_PARAM_F_DELIVER_EGRESS = 0x2,
	/*
	 * Encapsulate in tc and send to the uplink with bpf_redirect_neigh;
	 * decapsulate at the uplink's tc ingress what is for a local pod
	 * (bpf/encap.h). Without it, or for what tc cannot take, the VXLAN
	 * device does both.
	 */
	CP_PARAM_F_TC_TUNNEL = 0x4,
};

/*
 * Masquerade connection key: the 5-tuple as it appears on the wire in the
 * direction it is looked up (forward: pod -> peer before SNAT; reverse:
 * peer -> masquerade address, i.e. the reply). ICMP echo uses the
 * identifier as the "port" of the pod side and 0 for the peer. 40 bytes.
 */
struct cp_masq_key {
	struct addr128 src;
	struct addr128 dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};
CP_ABI_SIZE(struct cp_masq_key, 40);
CP_ABI_ALIGN(struct cp_masq_key, 4);
CP_ABI_OFFSET(struct cp_masq_key, dst, 16);
CP_ABI_OFFSET(struct cp_masq_key, sport, 32);
CP_ABI_OFFSET(struct cp_masq_key, dport, 34);
CP_ABI_OFFSET(struct cp_masq_key, proto, 36);
CP_ABI_OFFSET(struct cp_masq_key, pad, 37);

/* forward: the translated source; reverse: the original pod source. 24 bytes. */
struct cp_masq_val {
	struct addr128 addr;
	__be16 port;
	__u16 state;         /* reverse: CP_NAT_S_* (bpf/nat.h) */
	__u32 expires_s;     /* reverse: when the port may be taken over
			      * (CLOCK_MONOTONIC s); 0: never (an older agent's) */
};
CP_ABI_SIZE(struct cp_masq_val, 24);
CP_ABI_OFFSET(struct cp_masq_val, port, 16);
CP_ABI_OFFSET(struct cp_masq_val, state, 18);
CP_ABI_OFFSET(struct cp_masq_val, expires_s, 20);

#define CP_MAX_LOCALS 65536
#define CP_MAX_REMOTES 131072
#define CP_MAX_NODE_REMOTES 1024
#define CP_MAX_PORTS 65536
#define CP_MAX_VNIS 4096
#define CP_MAX_MASQ_CT 65536
#define CP_MAX_MASQ_SRCS 64
#define CP_MAX_INTERNAL 256
#define CP_MAX_VTEPS 1024
#define CP_MAX_LEARNED 8192

/* How long a learned remote stays usable: long enough to bridge the
 * agent's watch + debounce until the authoritative cp_remotes entry
 * arrives, short enough that a stale one (a migrated VM) ages out fast.
 * An enum (a 64-bit one, BTF_KIND_ENUM64) so the object records it. */
enum cp_learn_ttl {
	CP_LEARN_TTL_NS = 10ULL * 1000 * 1000 * 1000,
};

/* {net, pod address} -> local pod: same-node delivery and the RPF witness. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_LOCALS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_ep_key);
	__type(value, struct cp_endpoint);
} cp_locals SEC(".maps");

/* {net, prefix} -> tunnel endpoint of the node holding it. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_REMOTES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_lpm_key);
	__type(value, struct cp_remote);
} cp_remotes SEC(".maps");

/* node address (any NIC/family) -> that node's tunnel endpoint. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_NODE_REMOTES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct addr128);
	__type(value, struct cp_remote);
} cp_node_remotes SEC(".maps");

/*
 * Tunnel endpoint (outer IPv4 source, network order) -> CP_VTEP_F_* flags:
 * the only senders from_overlay accepts decapsulated packets from.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_VTEPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __be32);
	__type(value, __u32);
} cp_vteps SEC(".maps");

/*
 * {net, address} -> where a packet from that address came from, for
 * addresses cp_remotes does not know (yet): a brand-new pod elsewhere
 * whose claim this node's agent has not seen. Never consulted when an
 * authoritative entry exists; entries expire (CP_LEARN_TTL_NS) and the LRU
 * bounds the memory. Written by from_overlay only.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_LEARNED);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_ep_key);
	__type(value, struct cp_learned);
} cp_learned SEC(".maps");

/* host veth ifindex -> source network. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_PORTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct cp_port);
} cp_ports SEC(".maps");

/* VNI -> network id, for every network this node serves. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_VNIS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} cp_vnis SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct cp_params);
} cp_params SEC(".maps");

/* Masquerade flows: forward (pod tuple -> translated source). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_MASQ_CT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_masq_key);
	__type(value, struct cp_masq_val);
} cp_masq_fwd SEC(".maps");

/* Masquerade flows: reverse (reply tuple -> original pod source). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CP_MAX_MASQ_CT);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_masq_key);
	__type(value, struct cp_masq_val);
} cp_masq_rev SEC(".maps");

/* Sources that get masqueraded (the pod CIDRs), at net 0. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_MASQ_SRCS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_lpm_key);
	__type(value, __u32);
} cp_masq_srcs SEC(".maps");

/* Cluster-internal destinations that are never masqueraded, at net 0. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CP_MAX_INTERNAL);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct cp_lpm_key);
	__type(value, __u32);
} cp_internal SEC(".maps");

static __always_inline const struct cp_params *cp_get_params(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cp_params, &zero);
}

#endif /* CP_MAPS_H */
