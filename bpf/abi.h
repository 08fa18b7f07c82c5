/* SPDX-License-Identifier: GPL-2.0 */
/*
 * abi.h - puts every ABI enum into the object's BTF.
 *
 * Userspace mirrors the map structs, the drop reasons and a few constants
 * (crates/datapath/src/abi.rs). An unprivileged Rust test reads all of them
 * back from the compiled object and compares (crates/datapath/src/abi/
 * object_check.rs), so a drift fails on any machine, without root or BPF
 * syscalls. The structs reach BTF through the map definitions that use
 * them; an enum only if something emitted has it as a type, and the
 * constants (enumerators, not #defines, for this reason: see common.h) are
 * never used as a type at all. Hence this anchor: one member per ABI enum.
 * An enum a header adds for userspace goes here too, and the Rust test then
 * insists that abi.rs mirror each of its enumerators.
 *
 * The anchor variable lives in its own section, ".cp_abi", that no loader
 * reads: aya (and libbpf) skip sections they do not know, so it costs no
 * map and no kernel memory; only its BTF is loaded, with the rest.
 */
#ifndef CP_ABI_H
#define CP_ABI_H

#include "common.h"
#include "maps.h"
#include "metrics.h"
#include "encap.h"
#include "meter.h"
#include "bridge.h"
#include "ct.h"
#include "policy.h"
#include "netpol.h"
#include "hostfw.h"
#include "service.h"
#include "lb.h"
#include "nat.h"

struct cp_abi_anchor {
	enum cp_abi_common common;
	enum cp_vtep_flags vtep_flags;
	enum cp_param_flags param_flags;
	enum cp_learn_ttl learn_ttl;
	enum cp_marks marks;
	enum cp_drop_reason drop_reason;
	enum cp_port_flags port_flags;
	enum cp_meter_kind meter_kind;
	enum cp_bridge_ports bridge_ports;
	enum cp_ct_flags ct_flags;
	enum cp_ct_timeouts ct_timeouts;
	enum cp_sg_abi sg_abi;
	enum cp_np_abi np_abi;
	enum cp_hostfw_abi hostfw_abi;
	enum cp_svc_abi svc_abi;
	enum cp_lb_abi lb_abi;
	enum cp_nat_state nat_state;
};

static const struct cp_abi_anchor cp_abi_anchor
	__attribute__((section(".cp_abi"), used));

#endif /* CP_ABI_H */
