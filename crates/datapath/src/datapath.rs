//! Loading the eBPF object with its maps pinned under a configurable bpffs
//! directory, reconciling pins left by an earlier agent, and typed map access.
//!
//! Pin reconciliation (why: an incompatible pinned map made the upstream
//! agent crash-loop until reboot, docs/lessons.md #22). aya reuses any pin with
//! the right name without checking its shape, so before loading, every pin
//! named like one of our maps is compared with [`MAP_SPECS`] (type, key and
//! value size, max entries, flags):
//! - compatible: kept, so an agent restart keeps all state;
//! - incompatible: the pin is removed and aya creates a fresh map. The old
//!   map lives on only while the old programs still reference it; they are
//!   swapped out when the agent re-attaches (see [`crate::tcx`]), after it
//!   has refilled the new map;
//! - a `cp_*` map pin the object no longer defines is removed.

use std::fs;
use std::mem::size_of;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapType, PerCpuArray, PerCpuHashMap};
use aya::programs::{CgroupSockAddr, SchedClassifier};
use aya::{Ebpf, EbpfLoader};
use nix::mount::{mount, MsFlags};
use nix::sys::statfs::{statfs, BPF_FS_MAGIC};

use crate::abi::{
    Addr128, Affinity, AffinityKey, Backend, Bridge, BridgeCt, BridgeKey, CtEntry, CtKey,
    DropReason, Endpoint, EpKey, LbVal, Learned, LpmKey, MasqKey, MasqVal, MeterKey, MeterVal,
    NetnsVal, NpCidrKey, NpEp, NpRuleKey, Params, Port, Remote, SgCidrKey, SgGroups, SgRuleKey,
    SockOwn, SockRevKey, Svc, SvcKey, TestDeliver, TestEncap, MAX_LB_CT, MAX_LB_SRC, MAX_SVC_SLOTS,
    NET_DEFAULT, PORT_F_QUARANTINE,
};
use crate::error::{DatapathError, Result};
use crate::meter::{self, Counters};
use crate::netpol::NpMaps;
use crate::service::{self, SockProgram, SvcMaps};
use crate::sg::SgMaps;
use crate::tables::{is_not_found, HashTable, LpmTable};

/// The production object, compiled by `build.rs` from `bpf/`.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cozyplane.bpf.o"));
/// The same source with `-DCP_TEST_HOOKS` (see `bpf/encap.h`); tests only.
pub(crate) static TEST_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/cozyplane_test.bpf.o"));

/// `BPF_F_NO_PREALLOC`.
const NO_PREALLOC: u32 = 1;

/// Which build of the datapath to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// What the agent runs.
    Production,
    /// Built with `CP_TEST_HOOKS`: records the encapsulation decision and
    /// reads the received VNI from `skb->cb[0]`, for BPF_PROG_TEST_RUN tests.
    /// Never attach it to a real interface.
    TestHooks,
}

/// The programs of the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Program {
    /// tcx ingress of every host-side pod veth.
    FromPod,
    /// tcx egress of every host-side pod veth.
    ToPod,
    /// tcx ingress of the overlay (VXLAN) device.
    FromOverlay,
    /// tcx egress of the overlay (VXLAN) device.
    ToOverlay,
    /// tcx egress of the uplink: masquerade SNAT.
    ToUplink,
    /// tcx ingress of the uplink: masquerade reverse.
    FromUplink,
}

impl Program {
    /// Every program.
    pub const ALL: [Program; 6] = [
        Program::FromPod,
        Program::ToPod,
        Program::FromOverlay,
        Program::ToOverlay,
        Program::ToUplink,
        Program::FromUplink,
    ];

    /// The function name in `bpf/cozyplane.bpf.c`.
    pub fn name(self) -> &'static str {
        match self {
            Program::FromPod => "from_pod",
            Program::ToPod => "to_pod",
            Program::FromOverlay => "from_overlay",
            Program::ToOverlay => "to_overlay",
            Program::ToUplink => "to_uplink",
            Program::FromUplink => "from_uplink",
        }
    }
}

/// The expected shape of a pinned map (mirrors `bpf/maps.h`; an
/// unprivileged test checks [`MAP_SPECS`] against the map definitions of the
/// compiled object, `abi/object_check.rs`, and a privileged one against what
/// the kernel reports for a freshly loaded object, `tests/bpf_lifecycle.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MapSpec {
    /// Pin name.
    pub name: &'static str,
    /// Kernel map type.
    pub map_type: MapType,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// `max_entries`.
    pub max_entries: u32,
    /// `map_flags`.
    pub flags: u32,
}

const fn spec(
    name: &'static str,
    map_type: MapType,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
    flags: u32,
) -> MapSpec {
    MapSpec {
        name,
        map_type,
        key_size: key_size as u32,
        value_size: value_size as u32,
        max_entries,
        flags,
    }
}

/// Every pinned map of the object.
pub const MAP_SPECS: [MapSpec; 40] = [
    spec(
        "cp_locals",
        MapType::Hash,
        size_of::<EpKey>(),
        size_of::<Endpoint>(),
        65536,
        NO_PREALLOC,
    ),
    spec(
        "cp_remotes",
        MapType::LpmTrie,
        size_of::<LpmKey>(),
        size_of::<Remote>(),
        131072,
        NO_PREALLOC,
    ),
    spec(
        "cp_node_remotes",
        MapType::Hash,
        size_of::<Addr128>(),
        size_of::<Remote>(),
        1024,
        NO_PREALLOC,
    ),
    spec(
        "cp_ports",
        MapType::Hash,
        4,
        size_of::<Port>(),
        65536,
        NO_PREALLOC,
    ),
    spec("cp_vnis", MapType::Hash, 4, 4, 4096, NO_PREALLOC),
    spec("cp_vteps", MapType::Hash, 4, 4, 1024, NO_PREALLOC),
    spec(
        "cp_learned",
        MapType::LruHash,
        size_of::<EpKey>(),
        size_of::<Learned>(),
        8192,
        0,
    ),
    spec("cp_params", MapType::Array, 4, size_of::<Params>(), 1, 0),
    spec(
        "cp_masq_fwd",
        MapType::LruHash,
        size_of::<MasqKey>(),
        size_of::<MasqVal>(),
        65536,
        0,
    ),
    spec(
        "cp_masq_rev",
        MapType::LruHash,
        size_of::<MasqKey>(),
        size_of::<MasqVal>(),
        65536,
        0,
    ),
    spec(
        "cp_masq_srcs",
        MapType::LpmTrie,
        size_of::<LpmKey>(),
        4,
        64,
        NO_PREALLOC,
    ),
    spec(
        "cp_internal",
        MapType::LpmTrie,
        size_of::<LpmKey>(),
        4,
        256,
        NO_PREALLOC,
    ),
    spec(
        "cp_peer_routes",
        MapType::LpmTrie,
        size_of::<LpmKey>(),
        4,
        4096,
        NO_PREALLOC,
    ),
    spec("cp_drops", MapType::PerCpuArray, 4, 8, DropReason::SLOTS, 0),
    spec(
        "cp_meters",
        MapType::PerCpuHash,
        size_of::<MeterKey>(),
        size_of::<MeterVal>(),
        65536,
        NO_PREALLOC,
    ),
    spec(
        "cp_bridges",
        MapType::Hash,
        size_of::<EpKey>(),
        size_of::<Bridge>(),
        65536,
        NO_PREALLOC,
    ),
    spec(
        "cp_bridge_fwd",
        MapType::LruHash,
        size_of::<BridgeKey>(),
        size_of::<BridgeCt>(),
        16384,
        0,
    ),
    spec(
        "cp_bridge_rev",
        MapType::LruHash,
        size_of::<BridgeKey>(),
        size_of::<BridgeCt>(),
        16384,
        0,
    ),
    // connection tracking and SecurityGroups (bpf/ct.h, bpf/policy.h)
    spec(
        "cp_ct",
        MapType::LruHash,
        size_of::<CtKey>(),
        size_of::<CtEntry>(),
        65536,
        0,
    ),
    spec(
        "cp_sg_members",
        MapType::Hash,
        size_of::<EpKey>(),
        size_of::<SgGroups>(),
        65536,
        NO_PREALLOC,
    ),
    spec(
        "cp_sg_rules",
        MapType::LpmTrie,
        size_of::<SgRuleKey>(),
        4,
        65536,
        NO_PREALLOC,
    ),
    spec(
        "cp_sg_cidrs",
        MapType::LpmTrie,
        size_of::<SgCidrKey>(),
        4,
        16384,
        NO_PREALLOC,
    ),
    // NetworkPolicy (bpf/netpol.h)
    spec(
        "cp_np_eps",
        MapType::Hash,
        size_of::<EpKey>(),
        size_of::<NpEp>(),
        65536,
        NO_PREALLOC,
    ),
    spec(
        "cp_np_rules",
        MapType::LpmTrie,
        size_of::<NpRuleKey>(),
        4,
        131072,
        NO_PREALLOC,
    ),
    spec(
        "cp_np_deny",
        MapType::LpmTrie,
        size_of::<NpRuleKey>(),
        4,
        16384,
        NO_PREALLOC,
    ),
    spec(
        "cp_np_cidrs",
        MapType::LpmTrie,
        size_of::<NpCidrKey>(),
        4,
        16384,
        NO_PREALLOC,
    ),
    spec("cp_np_epoch", MapType::Array, 4, 4, 1, 0),
    // Services (bpf/service.h)
    spec(
        "cp_svc",
        MapType::Hash,
        size_of::<SvcKey>(),
        size_of::<Svc>(),
        131072,
        NO_PREALLOC,
    ),
    spec("cp_svc_slots", MapType::Array, 4, 4, MAX_SVC_SLOTS, 0),
    spec(
        "cp_backends",
        MapType::Hash,
        4,
        size_of::<Backend>(),
        262144,
        NO_PREALLOC,
    ),
    spec(
        "cp_svc_revs",
        MapType::Hash,
        4,
        size_of::<Backend>(),
        131072,
        NO_PREALLOC,
    ),
    spec(
        "cp_sock_own",
        MapType::SkStorage,
        4,
        size_of::<SockOwn>(),
        0,
        NO_PREALLOC,
    ),
    spec(
        "cp_sock_rev",
        MapType::LruHash,
        size_of::<SockRevKey>(),
        4,
        65536,
        0,
    ),
    spec(
        "cp_affinity",
        MapType::LruHash,
        size_of::<AffinityKey>(),
        size_of::<Affinity>(),
        65536,
        0,
    ),
    // per-packet Service load balancing (bpf/lb.h)
    spec(
        "cp_lb_fwd",
        MapType::LruHash,
        size_of::<MasqKey>(),
        size_of::<LbVal>(),
        MAX_LB_CT,
        0,
    ),
    spec(
        "cp_lb_rev",
        MapType::LruHash,
        size_of::<MasqKey>(),
        size_of::<LbVal>(),
        MAX_LB_CT,
        0,
    ),
    spec("cp_lb_clients", MapType::Array, 4, 4, 65536, 0),
    // from_pod's tail calls (bpf/cozyplane.bpf.c)
    spec("cp_progs", MapType::ProgramArray, 4, 4, 2, 0),
    spec(
        "cp_lb_src",
        MapType::LpmTrie,
        size_of::<LpmKey>(),
        4,
        MAX_LB_SRC,
        NO_PREALLOC,
    ),
    spec(
        "cp_netns",
        MapType::Hash,
        8,
        size_of::<NetnsVal>(),
        65536,
        NO_PREALLOC,
    ),
];

/// Kernel-side facts about one map, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapStats {
    /// Map name.
    pub name: &'static str,
    /// Bytes of kernel memory the map is charged (`memlock` in fdinfo).
    pub memlock_bytes: u64,
}

/// The loaded datapath: programs verified and loaded (not yet attached),
/// maps pinned and typed.
pub struct Datapath {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    replaced: Vec<&'static str>,
    stat_maps: Vec<(&'static str, MapData)>,
    /// `{net, pod address}` → local pod.
    pub locals: HashTable<EpKey, Endpoint>,
    /// `{net, prefix}` → owning node's tunnel endpoint.
    pub remotes: LpmTable<Remote>,
    /// Node address → that node's tunnel endpoint.
    pub node_remotes: HashTable<Addr128, Remote>,
    /// Host veth ifindex → network.
    pub ports: HashTable<u32, Port>,
    /// VNI → network id, for every network this node serves.
    pub vnis: HashTable<u32, u32>,
    /// Tunnel endpoint (network order) → `VTEP_F_*`: the senders
    /// `from_overlay` accepts.
    pub vteps: HashTable<[u8; 4], u32>,
    /// `{net, address}` → where `from_overlay` last saw it come from
    /// (written by the datapath only; see `bpf/learn.h`).
    pub learned: HashTable<EpKey, Learned>,
    /// Masquerade flows, forward.
    pub masq_fwd: HashTable<MasqKey, MasqVal>,
    /// Masquerade flows, reverse.
    pub masq_rev: HashTable<MasqKey, MasqVal>,
    /// Sources that are masqueraded (pod CIDRs), scope net 0.
    pub masq_srcs: LpmTable<u32>,
    /// Destinations never masqueraded (cluster-internal CIDRs), scope net 0.
    pub internal: LpmTable<u32>,
    /// `{net, peer CIDR}` → the peer VPC's net: the live peerings
    /// (`bpf/vpc.h`), written by the agent's sync.
    pub peer_routes: LpmTable<u32>,
    /// `{0, fabric address}` → the VPC pod behind it (the dual-address
    /// bridge, `bpf/bridge.h`); written through [`Datapath::put_bridge`].
    pub bridges: HashTable<EpKey, Bridge>,
    /// Bridged flows, forward (written by the datapath).
    pub bridge_fwd: HashTable<BridgeKey, BridgeCt>,
    /// Bridged flows, reverse (written by the datapath).
    pub bridge_rev: HashTable<BridgeKey, BridgeCt>,
    params: Array<MapData, Params>,
    drops: PerCpuArray<MapData, u64>,
    meters: PerCpuHashMap<MapData, MeterKey, MeterVal>,
    test_encap: Option<Array<MapData, TestEncap>>,
    test_deliver: Option<Array<MapData, TestDeliver>>,
    tail_calls: TailCalls,
    /// Connection tracking and the SecurityGroup maps (`crate::sg`).
    pub sg: SgMaps,
    /// The NetworkPolicy maps (`crate::netpol`).
    pub np: NpMaps,
    /// The service maps (`crate::service`).
    pub svc: SvcMaps,
}

impl Datapath {
    /// Load the production object with its maps pinned under `pin_dir`
    /// (created if missing; must be on bpffs). Compatible pins are reused.
    pub fn load(pin_dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_object(Object::Production, pin_dir)
    }

    /// Load `object` with its maps pinned under `pin_dir`.
    pub fn load_object(object: Object, pin_dir: impl AsRef<Path>) -> Result<Self> {
        let pin_dir = pin_dir.as_ref().to_path_buf();
        prepare_pin_dir(&pin_dir)?;
        let replaced = reconcile_pins(&pin_dir)?;
        let existed: Vec<&'static str> = MAP_SPECS
            .iter()
            .filter(|s| pin_dir.join(s.name).exists())
            .map(|s| s.name)
            .collect();
        Self::load_pinned(object, pin_dir.clone(), replaced).inspect_err(|_| {
            // A failed load must not leave fresh, empty pins behind for the
            // next attempt to mistake for state.
            for s in MAP_SPECS.iter().filter(|s| !existed.contains(&s.name)) {
                let _ = fs::remove_file(pin_dir.join(s.name));
            }
        })
    }

    fn load_pinned(object: Object, pin_dir: PathBuf, replaced: Vec<&'static str>) -> Result<Self> {
        let bytes = match object {
            Object::Production => OBJECT,
            Object::TestHooks => TEST_OBJECT,
        };
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pin_dir)
            .load(bytes)
            .map_err(|e| DatapathError::Load(Box::new(e)))?;

        // Verify every program now: a verifier rejection must fail the load,
        // not a later attach.
        for prog in Program::ALL {
            classifier(&mut ebpf, prog)?
                .load()
                .map_err(|e| DatapathError::program(prog.name(), e))?;
        }
        service::load_sock_programs(&mut ebpf)?;
        crate::hostfw::load_host_programs(&mut ebpf)?;
        let tail_calls = set_tail_calls(&mut ebpf)?;

        let mut stat_maps = Vec::with_capacity(MAP_SPECS.len());
        for s in &MAP_SPECS {
            let md = MapData::from_pin(pin_dir.join(s.name))
                .map_err(|e| DatapathError::map(s.name, e))?;
            stat_maps.push((s.name, md));
        }

        let (test_encap, test_deliver) = match object {
            Object::Production => (None, None),
            Object::TestHooks => (
                Some(
                    Array::try_from(take(&mut ebpf, "cp_test_encap")?)
                        .map_err(|e| DatapathError::map("cp_test_encap", e))?,
                ),
                Some(
                    Array::try_from(take(&mut ebpf, "cp_test_deliver")?)
                        .map_err(|e| DatapathError::map("cp_test_deliver", e))?,
                ),
            ),
        };

        Ok(Self {
            locals: HashTable::new("cp_locals", hash(&mut ebpf, "cp_locals")?),
            remotes: LpmTable::new("cp_remotes", lpm(&mut ebpf, "cp_remotes")?),
            node_remotes: HashTable::new("cp_node_remotes", hash(&mut ebpf, "cp_node_remotes")?),
            ports: HashTable::new("cp_ports", hash(&mut ebpf, "cp_ports")?),
            vnis: HashTable::new("cp_vnis", hash(&mut ebpf, "cp_vnis")?),
            vteps: HashTable::new("cp_vteps", hash(&mut ebpf, "cp_vteps")?),
            learned: HashTable::new("cp_learned", hash(&mut ebpf, "cp_learned")?),
            masq_fwd: HashTable::new("cp_masq_fwd", hash(&mut ebpf, "cp_masq_fwd")?),
            masq_rev: HashTable::new("cp_masq_rev", hash(&mut ebpf, "cp_masq_rev")?),
            masq_srcs: LpmTable::new("cp_masq_srcs", lpm(&mut ebpf, "cp_masq_srcs")?),
            internal: LpmTable::new("cp_internal", lpm(&mut ebpf, "cp_internal")?),
            peer_routes: LpmTable::new("cp_peer_routes", lpm(&mut ebpf, "cp_peer_routes")?),
            bridges: HashTable::new("cp_bridges", hash(&mut ebpf, "cp_bridges")?),
            bridge_fwd: HashTable::new("cp_bridge_fwd", hash(&mut ebpf, "cp_bridge_fwd")?),
            bridge_rev: HashTable::new("cp_bridge_rev", hash(&mut ebpf, "cp_bridge_rev")?),
            params: Array::try_from(take(&mut ebpf, "cp_params")?)
                .map_err(|e| DatapathError::map("cp_params", e))?,
            drops: PerCpuArray::try_from(take(&mut ebpf, "cp_drops")?)
                .map_err(|e| DatapathError::map("cp_drops", e))?,
            meters: PerCpuHashMap::try_from(take(&mut ebpf, "cp_meters")?)
                .map_err(|e| DatapathError::map("cp_meters", e))?,
            test_encap,
            test_deliver,
            tail_calls,
            sg: SgMaps {
                ct: HashTable::new("cp_ct", hash(&mut ebpf, "cp_ct")?),
                members: HashTable::new("cp_sg_members", hash(&mut ebpf, "cp_sg_members")?),
                rules: LpmTable::new("cp_sg_rules", lpm(&mut ebpf, "cp_sg_rules")?),
                cidrs: LpmTable::new("cp_sg_cidrs", lpm(&mut ebpf, "cp_sg_cidrs")?),
            },
            np: NpMaps {
                eps: HashTable::new("cp_np_eps", hash(&mut ebpf, "cp_np_eps")?),
                rules: LpmTable::new("cp_np_rules", lpm(&mut ebpf, "cp_np_rules")?),
                deny: LpmTable::new("cp_np_deny", lpm(&mut ebpf, "cp_np_deny")?),
                cidrs: LpmTable::new("cp_np_cidrs", lpm(&mut ebpf, "cp_np_cidrs")?),
                epoch: Array::try_from(take(&mut ebpf, "cp_np_epoch")?)
                    .map_err(|e| DatapathError::map("cp_np_epoch", e))?,
                mirror: None,
            },
            svc: SvcMaps {
                frontends: HashTable::new("cp_svc", hash(&mut ebpf, "cp_svc")?),
                slots: Array::try_from(take(&mut ebpf, "cp_svc_slots")?)
                    .map_err(|e| DatapathError::map("cp_svc_slots", e))?,
                backends: HashTable::new("cp_backends", hash(&mut ebpf, "cp_backends")?),
                revs: HashTable::new("cp_svc_revs", hash(&mut ebpf, "cp_svc_revs")?),
                sock_rev: HashTable::new("cp_sock_rev", hash(&mut ebpf, "cp_sock_rev")?),
                affinity: HashTable::new("cp_affinity", hash(&mut ebpf, "cp_affinity")?),
                lb_fwd: HashTable::new("cp_lb_fwd", hash(&mut ebpf, "cp_lb_fwd")?),
                lb_rev: HashTable::new("cp_lb_rev", hash(&mut ebpf, "cp_lb_rev")?),
                lb_src: LpmTable::new("cp_lb_src", lpm(&mut ebpf, "cp_lb_src")?),
                netns: HashTable::new("cp_netns", hash(&mut ebpf, "cp_netns")?),
                shadow: Default::default(),
                slot_limit: MAX_SVC_SLOTS,
            },
            ebpf,
            pin_dir,
            replaced,
            stat_maps,
        })
    }

    /// The pin directory.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Pins found incompatible with this object and replaced at load time;
    /// their state is gone and must be rebuilt by the caller.
    pub fn replaced_pins(&self) -> &[&'static str] {
        &self.replaced
    }

    /// A loaded program, e.g. to run it with `aya::programs::TestRun`.
    pub fn program_mut(&mut self, prog: Program) -> Result<&mut SchedClassifier> {
        classifier(&mut self.ebpf, prog)
    }

    pub(crate) fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// A loaded socket-LB program.
    pub fn sock_program_mut(&mut self, prog: SockProgram) -> Result<&mut CgroupSockAddr> {
        service::sock_program(&mut self.ebpf, prog)
    }

    /// The node configuration (all zero until set).
    pub fn params(&self) -> Result<Params> {
        self.params
            .get(&0, 0)
            .map_err(|e| DatapathError::map("cp_params", e))
    }

    /// Points `from_uplink`'s tail call at this object's `tc_decap` (the
    /// tc tunnel's receive side, `bpf/encap.h`). Call it once `cp_vteps`,
    /// `cp_vnis` and `cp_params` hold this node's entries: from then on any
    /// `from_uplink`, an older object's included, decapsulates with them.
    pub fn arm_tc_decap(&mut self) -> Result<()> {
        self.tail_calls
            .progs
            .set(SLOT_TC_DECAP, &self.tail_calls.tc_decap, 0)
            .map_err(|e| DatapathError::map("cp_progs", e))
    }

    /// Replace the node configuration.
    pub fn set_params(&mut self, params: &Params) -> Result<()> {
        if params.masq_ip != [0; 4]
            && (params.masq_port_min == 0 || params.masq_port_max < params.masq_port_min)
        {
            return Err(DatapathError::InvalidValue(format!(
                "masquerade port range {}-{} is empty or starts at 0",
                params.masq_port_min, params.masq_port_max
            )));
        }
        self.params
            .set(0, params, 0)
            .map_err(|e| DatapathError::map("cp_params", e))
    }

    /// Bridges the node to a VPC pod: `cp_bridges[{0, fabric}] = {net,
    /// ifindex, vpc}`, so what the node's own stack sends to `fabric` (routed
    /// into the pod's host veth `ifindex`, see
    /// [`crate::netlink::plumb_bridge`]) reaches the pod at `vpc` from its
    /// gateway (`169.254.1.1`, `fe80::1`), and its replies come back from
    /// `fabric`. Overwrites. Both addresses of one family, unicast and
    /// global (an IPv6 address in `64:ff9b::/96` would alias an IPv4 key);
    /// `net` must be a VPC's (not 0).
    pub fn put_bridge(
        &mut self,
        fabric: IpAddr,
        net: u32,
        vpc: IpAddr,
        ifindex: u32,
    ) -> Result<()> {
        let refuse = |why: &str| {
            Err(DatapathError::InvalidValue(format!(
                "bridge {fabric} -> {vpc}: {why}"
            )))
        };
        if net == NET_DEFAULT {
            return refuse("the default network needs no bridge");
        }
        if fabric.is_ipv4() != vpc.is_ipv4() {
            return refuse("the two addresses are of different families");
        }
        for a in [fabric, vpc] {
            let bad = match a {
                IpAddr::V4(v4) => {
                    v4.is_unspecified()
                        || v4.is_multicast()
                        || v4.is_broadcast()
                        || v4.is_loopback()
                }
                IpAddr::V6(v6) => {
                    let o = v6.octets();
                    v6.is_unspecified()
                        || v6.is_multicast()
                        || v6.is_loopback()
                        || (o[0] == 0xfe && o[1] & 0xc0 == 0x80)
                        || Addr128::from_v6(v6).to_ip().is_ipv4()
                }
            };
            if bad {
                return refuse("not a global unicast address");
            }
        }
        self.bridges.insert(
            &EpKey::new(NET_DEFAULT, fabric),
            &Bridge {
                net,
                ifindex,
                vpc: vpc.into(),
            },
        )
    }

    /// Removes the bridge of `fabric` and forgets its flows (so a later pod
    /// holding the same VPC or fabric address inherits none of them); with
    /// `Some(ifindex)` only if the entry still points at that veth (never
    /// another pod's newer entry). `Ok(false)` if there was nothing to
    /// remove. Idempotent.
    pub fn delete_bridge(&mut self, fabric: IpAddr, ifindex: Option<u32>) -> Result<bool> {
        let key = EpKey::new(NET_DEFAULT, fabric);
        match (self.bridges.get(&key)?, ifindex) {
            (None, _) => return Ok(false),
            (Some(have), Some(want)) if have.ifindex != want => return Ok(false),
            _ => {}
        }
        let removed = self.bridges.remove(&key)?;
        let fabric = Addr128::from(fabric);
        for table in [&mut self.bridge_fwd, &mut self.bridge_rev] {
            for (k, v) in table.entries()? {
                if v.fabric == fabric {
                    table.remove(&k)?;
                }
            }
        }
        Ok(removed)
    }

    /// Drops by reason, summed over all CPUs.
    pub fn drops(&self) -> Result<Vec<(DropReason, u64)>> {
        DropReason::ALL
            .iter()
            .map(|&r| {
                let per_cpu = self
                    .drops
                    .get(&(r as u32), 0)
                    .map_err(|e| DatapathError::map("cp_drops", e))?;
                Ok((r, per_cpu.iter().sum()))
            })
            .collect()
    }

    /// Drops of one reason, summed over all CPUs.
    pub fn drop_count(&self, reason: DropReason) -> Result<u64> {
        let per_cpu = self
            .drops
            .get(&(reason as u32), 0)
            .map_err(|e| DatapathError::map("cp_drops", e))?;
        Ok(per_cpu.iter().sum())
    }

    /// Per-network (per-VPC) counters: ingress, egress and drops by reason,
    /// packets and bytes, summed over all CPUs (`cp_meters`, `bpf/meter.h`).
    /// Only networks that saw traffic are present; net 0 is not metered.
    pub fn net_counters(&self) -> Result<Counters> {
        let mut entries = Vec::new();
        for item in self.meters.iter() {
            match item {
                Ok((key, per_cpu)) => entries.push((key, meter::sum_cpus(per_cpu.iter()))),
                // removed (forget_net_counters) during the walk
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(DatapathError::map("cp_meters", e)),
            }
        }
        Ok(meter::fold(entries))
    }

    /// Removes every counter of network `net` (when this node no longer
    /// serves it), so `cp_meters` holds only live networks. Returns how many
    /// entries went.
    pub fn forget_net_counters(&mut self, net: u32) -> Result<usize> {
        let mut keys = Vec::new();
        for key in self.meters.keys() {
            match key {
                Ok(k) if k.net == net => keys.push(k),
                Ok(_) => {}
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(DatapathError::map("cp_meters", e)),
            }
        }
        let mut removed = 0;
        for k in &keys {
            match self.meters.remove(k) {
                Ok(()) => removed += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(DatapathError::map("cp_meters", e)),
            }
        }
        Ok(removed)
    }

    /// Severs (`quarantined` true) or restores the port of host veth
    /// `ifindex` ([`PORT_F_QUARANTINE`]): a severed pod sends nothing and
    /// receives nothing, and stays running. Its network and other flags are
    /// kept. Returns `false` if the veth has no port entry (nothing reaches
    /// such a veth anyway: `from_pod` drops as `no_port`).
    pub fn set_port_quarantine(&mut self, ifindex: u32, quarantined: bool) -> Result<bool> {
        let Some(mut port) = self.ports.get(&ifindex)? else {
            return Ok(false);
        };
        if quarantined {
            port.flags |= PORT_F_QUARANTINE;
        } else {
            port.flags &= !PORT_F_QUARANTINE;
        }
        self.ports.insert(&ifindex, &port)?;
        Ok(true)
    }

    /// What the test build recorded about the last encapsulation; `None` for
    /// the production object or before any packet was encapsulated.
    pub fn test_encap(&self) -> Result<Option<TestEncap>> {
        let Some(map) = &self.test_encap else {
            return Ok(None);
        };
        let v = map
            .get(&0, 0)
            .map_err(|e| DatapathError::map("cp_test_encap", e))?;
        Ok((v.count > 0).then_some(v))
    }

    /// What the test build recorded about the last delivery into a local
    /// pod (target and redirect flavour); `None` for the production object
    /// or before any delivery.
    pub fn test_deliver(&self) -> Result<Option<TestDeliver>> {
        let Some(map) = &self.test_deliver else {
            return Ok(None);
        };
        let v = map
            .get(&0, 0)
            .map_err(|e| DatapathError::map("cp_test_deliver", e))?;
        Ok((v.count > 0).then_some(v))
    }

    /// Kernel memory charged per pinned map (the OOM diagnostic,
    /// docs/lessons.md #21), read from `/proc/self/fdinfo`.
    pub fn map_stats(&self) -> Result<Vec<MapStats>> {
        self.stat_maps
            .iter()
            .map(|(name, md)| {
                let fd = md.fd().as_fd().as_raw_fd();
                let path = format!("/proc/self/fdinfo/{fd}");
                let text = fs::read_to_string(&path).map_err(|source| DatapathError::StalePin {
                    path: path.clone().into(),
                    source,
                })?;
                let memlock_bytes = text
                    .lines()
                    .find_map(|l| l.strip_prefix("memlock:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                Ok(MapStats {
                    name,
                    memlock_bytes,
                })
            })
            .collect()
    }

    /// What the kernel says about each pinned map (type, sizes, flags).
    pub fn pinned_specs(&self) -> Result<Vec<MapSpec>> {
        self.stat_maps
            .iter()
            .map(|(name, md)| {
                let info = md.info().map_err(|e| DatapathError::map(name, e))?;
                Ok(MapSpec {
                    name,
                    map_type: info.map_type().map_err(|e| DatapathError::map(name, e))?,
                    key_size: info.key_size(),
                    value_size: info.value_size(),
                    max_entries: info.max_entries(),
                    flags: info.map_flags(),
                })
            })
            .collect()
    }
}

fn classifier(ebpf: &mut Ebpf, prog: Program) -> Result<&mut SchedClassifier> {
    typed_program(ebpf, prog.name())
}

/// The program `name` of `ebpf` as its type (a classifier, a cgroup
/// sock_addr or skb program); an error names it if it is missing or of
/// another type.
pub(crate) fn typed_program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf.program_mut(name).ok_or(DatapathError::Program {
        name,
        source: Box::new(aya::programs::ProgramError::UnexpectedProgramType),
    })?;
    p.try_into().map_err(|e| DatapathError::program(name, e))
}

/// `cp_progs` slots (`enum cp_prog_slots`).
const SLOT_LB_FROM_POD: u32 = 0;
const SLOT_TC_DECAP: u32 = 1;

/// `from_pod`'s tail call for a ClusterIP no socket hook translated.
const LB_FROM_POD: &str = "lb_from_pod";
/// `from_uplink`'s tail call for the overlay's packets in tc tunnel mode.
const TC_DECAP: &str = "tc_decap";

/// `cp_progs` and the target armed only once the node's maps are written.
struct TailCalls {
    progs: aya::maps::ProgramArray<MapData>,
    tc_decap: aya::programs::ProgramFd,
}

/// Verifies the tail-call targets and points `cp_progs` slot 0 at
/// `lb_from_pod`, before any of this object's programs is attached (the
/// slots are pinned: an older object's `from_pod`, still attached for a
/// moment, calls the new target). `tc_decap` is only verified here: its
/// slot is armed by [`Datapath::arm_tc_decap`] once the sender check's maps
/// are filled, since an older `from_uplink` calls whatever the slot holds,
/// and after an upgrade that replaced `cp_vteps` a target armed at load
/// would check senders against an empty map.
fn set_tail_calls(ebpf: &mut Ebpf) -> Result<TailCalls> {
    let mut fds = Vec::with_capacity(2);
    for name in [LB_FROM_POD, TC_DECAP] {
        let prog: &mut SchedClassifier = typed_program(ebpf, name)?;
        prog.load().map_err(|e| DatapathError::program(name, e))?;
        let fd = prog
            .fd()
            .map_err(|e| DatapathError::program(name, e))?
            .try_clone()
            .map_err(|e| DatapathError::program(name, e.into()))?;
        fds.push(fd);
    }
    let mut progs = aya::maps::ProgramArray::try_from(take(ebpf, "cp_progs")?)
        .map_err(|e| DatapathError::map("cp_progs", e))?;
    let (Some(tc_decap), Some(lb)) = (fds.pop(), fds.pop()) else {
        return Err(DatapathError::MissingMap { name: "cp_progs" });
    };
    progs
        .set(SLOT_LB_FROM_POD, &lb, 0)
        .map_err(|e| DatapathError::map("cp_progs", e))?;
    Ok(TailCalls { progs, tc_decap })
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<Map> {
    ebpf.take_map(name)
        .ok_or(DatapathError::MissingMap { name })
}

fn hash<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>> {
    HashMap::try_from(take(ebpf, name)?).map_err(|e| DatapathError::map(name, e))
}

fn lpm<V: aya::Pod, K: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<LpmTrie<MapData, K, V>> {
    LpmTrie::try_from(take(ebpf, name)?).map_err(|e| DatapathError::map(name, e))
}

/// Create the pin directory and make sure pins can live there.
fn prepare_pin_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|source| DatapathError::PinDir {
        path: dir.to_path_buf(),
        source,
    })?;
    if !is_bpffs(dir)? {
        return Err(DatapathError::NotBpffs {
            path: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// Mount a bpffs at `dir` (created if missing) unless it already is on one.
/// Agents that share one kernel (the lab) each get their own pin root.
pub fn ensure_bpffs(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|source| DatapathError::PinDir {
        path: dir.to_path_buf(),
        source,
    })?;
    if is_bpffs(dir)? {
        return Ok(());
    }
    mount(
        Some("bpf"),
        dir,
        Some("bpf"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| DatapathError::PinDir {
        path: dir.to_path_buf(),
        source: e.into(),
    })
}

/// Whether `dir` is on a bpffs.
fn is_bpffs(dir: &Path) -> Result<bool> {
    let st = statfs(dir).map_err(|e| DatapathError::PinDir {
        path: dir.to_path_buf(),
        source: e.into(),
    })?;
    Ok(st.filesystem_type() == BPF_FS_MAGIC)
}

/// Remove pinned maps whose shape differs from [`MAP_SPECS`] and `cp_*` map
/// pins the object no longer defines. Returns the replaced map names.
fn reconcile_pins(dir: &Path) -> Result<Vec<&'static str>> {
    let mut replaced = Vec::new();
    let entries = fs::read_dir(dir).map_err(|source| DatapathError::PinDir {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| DatapathError::PinDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        if !name.starts_with("cp_") {
            continue;
        }
        let path = entry.path();
        // Only map pins are ours to judge; links and programs are skipped.
        let Ok(md) = MapData::from_pin(&path) else {
            continue;
        };
        let compatible = match MAP_SPECS.iter().find(|s| s.name == name) {
            Some(spec) => matches_spec(&md, spec),
            None => false,
        };
        drop(md);
        if !compatible {
            tracing::warn!(pin = %path.display(), "removing incompatible or unknown pinned map");
            fs::remove_file(&path).map_err(|source| DatapathError::StalePin {
                path: path.clone(),
                source,
            })?;
            if let Some(spec) = MAP_SPECS.iter().find(|s| s.name == name) {
                replaced.push(spec.name);
            }
        }
    }
    Ok(replaced)
}

fn matches_spec(md: &MapData, spec: &MapSpec) -> bool {
    let Ok(info) = md.info() else {
        return false;
    };
    info.map_type().ok() == Some(spec.map_type)
        && info.key_size() == spec.key_size
        && info.value_size() == spec.value_size
        && info.max_entries() == spec.max_entries
        && info.map_flags() == spec.flags
}
