//! The Rust half of the map ABI checked against the compiled object, without
//! root and without a BPF syscall, so a drift fails `cargo test` on any
//! machine.
//!
//! `abi.rs` and [`MAP_SPECS`] restate what `bpf/*.h` define. These tests read
//! the objects `build.rs` compiled, the very bytes [`crate::Datapath`] loads,
//! and compare:
//! - **maps**, parsed by aya-obj as aya's loader sees them: every map of
//!   [`MAP_SPECS`] is in the object with the same type, key size, value
//!   size, max entries and flags, pinned by name, and no map is in the object
//!   that [`MAP_SPECS`] lacks (the test object has exactly two more, its
//!   test hooks). Global-data sections (`.rodata` and the like), which aya
//!   turns into unpinned maps of its own, are not part of the pinned ABI,
//!   and neither are `cp_scratch_*` maps (per-CPU working memory: a
//!   one-slot per-CPU array, never pinned);
//! - **struct layouts**, from the object's BTF: every `#[repr(C)]` mirror
//!   has its C struct's size, and each field the C struct's offset and size,
//!   field by field in both directions; every struct that keys or fills a
//!   map has a mirror;
//! - **drop reasons**: `enum cp_drop_reason` against [`DropReason`], by
//!   name (`CP_DROP_` + the metric label), value and count, and
//!   `CP_DROP_MAX` against [`DropReason::SLOTS`];
//! - **constants**: every enumerator of the ABI enums `bpf/abi.h` anchors in
//!   BTF against its Rust constant (the learning TTL, flag bits, defaults).
//!
//! Each test collects every difference and fails once, naming each one.
//! The C side also asserts its own layouts at compile time (`CP_ABI_*` in
//! `bpf/common.h`); the privileged `bpf_lifecycle` test still checks that
//! the kernel reports [`MAP_SPECS`] for the loaded maps, which pin
//! reconciliation depends on.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{offset_of, size_of};

use aya::maps::MapType;
use aya_obj::generated::bpf_map_type;
use aya_obj::maps::PinningType;
use aya_obj::{EbpfSectionKind, Map};
use object::{Object as _, ObjectSection as _};

use super::btf::Btf;
use super::*;
use crate::datapath::{MapSpec, MAP_SPECS, OBJECT, TEST_OBJECT};

/// The maps only the `CP_TEST_HOOKS` object has (`bpf/encap.h`,
/// `bpf/deliver.h`): unpinned, so not in [`MAP_SPECS`].
fn test_hook_specs() -> [MapSpec; 2] {
    let array = |name, value_size: usize| MapSpec {
        name,
        map_type: MapType::Array,
        key_size: 4,
        value_size: u32::try_from(value_size).unwrap(),
        max_entries: 1,
        flags: 0,
    };
    [
        array("cp_test_encap", size_of::<TestEncap>()),
        array("cp_test_deliver", size_of::<TestDeliver>()),
    ]
}

/// A `#[repr(C)]` mirror of a C struct: its size and, per field, the name
/// (the C member's name too), offset and size.
struct Mirror {
    rust: &'static str,
    c: &'static str,
    size: usize,
    fields: Vec<(&'static str, usize, usize)>,
}

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! mirror {
    ($ty:ident => $c:literal { $($field:ident),* $(,)? }) => {
        Mirror {
            rust: stringify!($ty),
            c: $c,
            size: size_of::<$ty>(),
            fields: vec![$((
                stringify!($field),
                offset_of!($ty, $field),
                field_size(|v: &$ty| &v.$field),
            )),*],
        }
    };
}

/// Every struct of the map ABI and its Rust mirror.
fn mirrors() -> Vec<Mirror> {
    // aya's lpm_trie::Key is `#[repr(C, packed)] { prefix_len: u32, data }`;
    // its fields are private, so the data's offset is what precedes it.
    let lpm_data = size_of::<LpmKey>() - size_of::<EpKey>();
    vec![
        Mirror {
            rust: "Addr128",
            c: "addr128",
            size: size_of::<Addr128>(),
            fields: vec![("w", offset_of!(Addr128, 0), field_size(|v: &Addr128| &v.0))],
        },
        mirror!(EpKey => "cp_ep_key" { net, addr }),
        Mirror {
            rust: "LpmKey",
            c: "cp_lpm_key",
            size: size_of::<LpmKey>(),
            fields: vec![
                ("prefixlen", 0, lpm_data),
                (
                    "net",
                    lpm_data + offset_of!(EpKey, net),
                    field_size(|v: &EpKey| &v.net),
                ),
                (
                    "addr",
                    lpm_data + offset_of!(EpKey, addr),
                    field_size(|v: &EpKey| &v.addr),
                ),
            ],
        },
        mirror!(Endpoint => "cp_endpoint" { ifindex, mac, flags }),
        mirror!(Remote => "cp_remote" { tunnel_ip, flags }),
        mirror!(Learned => "cp_learned" { tunnel_ip, pad, expires_ns }),
        mirror!(Port => "cp_port" { net, flags }),
        mirror!(MeterKey => "cp_meter_key" { net, kind }),
        mirror!(MeterVal => "cp_meter_val" { packets, bytes }),
        mirror!(Params => "cp_params" {
            vxlan_ifindex, uplink_ifindex, node_ip, masq_ip,
            masq_port_min, masq_port_max, flags, node_ip6, reserved,
        }),
        mirror!(MasqKey => "cp_masq_key" { src, dst, sport, dport, proto, pad }),
        mirror!(MasqVal => "cp_masq_val" { addr, port, state, expires_s }),
        mirror!(Bridge => "cp_bridge" { net, ifindex, vpc }),
        mirror!(BridgeKey => "cp_bridge_key" { net, t }),
        mirror!(BridgeCt => "cp_bridge_ct" { addr, fabric, port, pad, flags }),
        mirror!(TestEncap => "cp_test_encap" {
            vni, remote, ifindex, count, key_remote, key_local,
        }),
        mirror!(TestDeliver => "cp_test_deliver" { ifindex, peer, count, pad }),
        mirror!(CtKey => "cp_ct_key" { zone, src, dst, sport, dport, proto, pad }),
        mirror!(CtEntry => "cp_ct_entry" { expires_ns, flags, epoch }),
        mirror!(NpEp => "cp_np_ep" { id, flags }),
        mirror!(SgGroups => "cp_sg_groups" { count, ids }),
        mirror!(SvcKey => "cp_svc_key" { net, addr, port, proto, scope }),
        mirror!(Svc => "cp_svc" {
            rev_id, base, count, local_count, maglev_base, maglev_m, affinity_s, flags
        }),
        mirror!(Backend => "cp_backend" { net, addr, port, proto, flags }),
        mirror!(SockRevKey => "cp_sock_rev_key" { cookie, addr, port, pad }),
        mirror!(SockOwn => "cp_sock_own" { addr, port, pad, rev_id }),
        mirror!(AffinityKey => "cp_affinity_key" { netns, client, rev_id, pad }),
        mirror!(Affinity => "cp_affinity" { last_ns, backend_id, slot }),
        mirror!(LbVal => "cp_lb_val" {
            client, backend_id, rev_id, client_port, snat_port, ifindex, flags, expires_s
        }),
        mirror!(NetnsVal => "cp_netns_val" { net, ifindex }),
        lpm_mirror::<SgRule>(
            "SgRuleKey",
            "cp_sg_rule_key",
            vec![
                (
                    "net",
                    offset_of!(SgRule, net),
                    field_size(|v: &SgRule| &v.net),
                ),
                (
                    "group",
                    offset_of!(SgRule, group),
                    field_size(|v: &SgRule| &v.group),
                ),
                (
                    "peer_net",
                    offset_of!(SgRule, peer_net),
                    field_size(|v: &SgRule| &v.peer_net),
                ),
                (
                    "peer",
                    offset_of!(SgRule, peer),
                    field_size(|v: &SgRule| &v.peer),
                ),
                (
                    "dir",
                    offset_of!(SgRule, dir),
                    field_size(|v: &SgRule| &v.dir),
                ),
                (
                    "proto",
                    offset_of!(SgRule, proto),
                    field_size(|v: &SgRule| &v.proto),
                ),
                (
                    "port",
                    offset_of!(SgRule, port),
                    field_size(|v: &SgRule| &v.port),
                ),
            ],
        ),
        lpm_mirror::<NpRule>(
            "NpRuleKey",
            "cp_np_rule_key",
            vec![
                (
                    "subject",
                    offset_of!(NpRule, subject),
                    field_size(|v: &NpRule| &v.subject),
                ),
                (
                    "dir",
                    offset_of!(NpRule, dir),
                    field_size(|v: &NpRule| &v.dir),
                ),
                (
                    "pad",
                    offset_of!(NpRule, pad),
                    field_size(|v: &NpRule| &v.pad),
                ),
                (
                    "peer",
                    offset_of!(NpRule, peer),
                    field_size(|v: &NpRule| &v.peer),
                ),
                (
                    "proto",
                    offset_of!(NpRule, proto),
                    field_size(|v: &NpRule| &v.proto),
                ),
                (
                    "pad2",
                    offset_of!(NpRule, pad2),
                    field_size(|v: &NpRule| &v.pad2),
                ),
                (
                    "port",
                    offset_of!(NpRule, port),
                    field_size(|v: &NpRule| &v.port),
                ),
            ],
        ),
        lpm_mirror::<NpCidr>(
            "NpCidrKey",
            "cp_np_cidr_key",
            vec![
                (
                    "subject",
                    offset_of!(NpCidr, subject),
                    field_size(|v: &NpCidr| &v.subject),
                ),
                (
                    "dir",
                    offset_of!(NpCidr, dir),
                    field_size(|v: &NpCidr| &v.dir),
                ),
                (
                    "pad",
                    offset_of!(NpCidr, pad),
                    field_size(|v: &NpCidr| &v.pad),
                ),
                (
                    "addr",
                    offset_of!(NpCidr, addr),
                    field_size(|v: &NpCidr| &v.addr),
                ),
            ],
        ),
        lpm_mirror::<SgCidr>(
            "SgCidrKey",
            "cp_sg_cidr_key",
            vec![
                (
                    "net",
                    offset_of!(SgCidr, net),
                    field_size(|v: &SgCidr| &v.net),
                ),
                (
                    "group",
                    offset_of!(SgCidr, group),
                    field_size(|v: &SgCidr| &v.group),
                ),
                (
                    "dir",
                    offset_of!(SgCidr, dir),
                    field_size(|v: &SgCidr| &v.dir),
                ),
                (
                    "pad",
                    offset_of!(SgCidr, pad),
                    field_size(|v: &SgCidr| &v.pad),
                ),
                (
                    "addr",
                    offset_of!(SgCidr, addr),
                    field_size(|v: &SgCidr| &v.addr),
                ),
            ],
        ),
    ]
}

/// The mirror of a C LPM key `{ __u32 prefixlen; <T's fields> }` that Rust
/// spells aya's `lpm_trie::Key<T>`: `fields` are T's, offset by the prefix.
fn lpm_mirror<T>(
    rust: &'static str,
    c: &'static str,
    fields: Vec<(&'static str, usize, usize)>,
) -> Mirror {
    let size = size_of::<aya::maps::lpm_trie::Key<T>>();
    let data = size - size_of::<T>();
    let mut all = vec![("prefixlen", 0, data)];
    all.extend(fields.into_iter().map(|(n, o, s)| (n, data + o, s)));
    Mirror {
        rust,
        c,
        size,
        fields: all,
    }
}

/// The constants of the ABI enums (`bpf/abi.h`) by C name, with the Rust
/// value that mirrors each.
fn constants() -> Vec<(&'static str, i128)> {
    let mut v = vec![
        ("CP_NET_DEFAULT", i128::from(NET_DEFAULT)),
        ("CP_VNI_DEFAULT", i128::from(VNI_DEFAULT)),
        ("CP_GW4", i128::from(u32::from(GATEWAY_V4))),
        ("CP_LPM_NET_BITS", i128::from(LPM_NET_BITS)),
        ("CP_VXLAN_PORT", i128::from(VXLAN_PORT)),
        ("CP_VTEP_F_NODE", i128::from(VTEP_F_NODE)),
        ("CP_PARAM_F_KERNEL_LOCAL", i128::from(PARAM_F_KERNEL_LOCAL)),
        (
            "CP_PARAM_F_DELIVER_EGRESS",
            i128::from(PARAM_F_DELIVER_EGRESS),
        ),
        ("CP_PARAM_F_TC_TUNNEL", i128::from(PARAM_F_TC_TUNNEL)),
        ("CP_LEARN_TTL_NS", i128::from(LEARN_TTL_NS)),
        ("CP_MARK_ENCAP", i128::from(MARK_ENCAP)),
        ("CP_DROP_MAX", i128::from(DropReason::SLOTS)),
        ("CP_PORT_F_QUARANTINE", i128::from(PORT_F_QUARANTINE)),
        ("CP_METER_INGRESS", i128::from(METER_INGRESS)),
        ("CP_METER_EGRESS", i128::from(METER_EGRESS)),
        ("CP_METER_DROP", i128::from(METER_DROP)),
        ("CP_BRIDGE_PORT_MIN", i128::from(BRIDGE_PORT_MIN)),
        ("CP_BRIDGE_PORT_MAX", i128::from(BRIDGE_PORT_MAX)),
        ("CP_CT_F_SEEN_REPLY", i128::from(CT_F_SEEN_REPLY)),
        ("CP_CT_F_FIN_ORIG", i128::from(CT_F_FIN_ORIG)),
        ("CP_CT_F_FIN_REPLY", i128::from(CT_F_FIN_REPLY)),
        ("CP_CT_F_CLOSED", i128::from(CT_F_CLOSED)),
        ("CP_CT_F_SRC_OK", i128::from(CT_F_SRC_OK)),
        ("CP_CT_F_DST_OK", i128::from(CT_F_DST_OK)),
        ("CP_CT_TCP_SYN_NS", i128::from(CT_TCP_SYN_NS)),
        ("CP_CT_TCP_EST_NS", i128::from(CT_TCP_EST_NS)),
        ("CP_CT_TCP_CLOSE_NS", i128::from(CT_TCP_CLOSE_NS)),
        ("CP_CT_UDP_NS", i128::from(CT_UDP_NS)),
        ("CP_CT_ICMP_NS", i128::from(CT_ICMP_NS)),
        ("CP_CT_SCTP_EST_NS", i128::from(CT_SCTP_EST_NS)),
        ("CP_CT_RENEW_SLACK_NS", i128::from(CT_RENEW_SLACK_NS)),
        ("CP_CT_F_NP_SRC", i128::from(CT_F_NP_SRC)),
        ("CP_CT_F_NP_DST", i128::from(CT_F_NP_DST)),
        ("CP_CT_F_NP_NODE", i128::from(CT_F_NP_NODE)),
        ("CP_NP_F_ISOLATED_IN", i128::from(NP_F_ISOLATED_IN)),
        ("CP_NP_F_ISOLATED_OUT", i128::from(NP_F_ISOLATED_OUT)),
        ("CP_NP_F_DENY_IN", i128::from(NP_F_DENY_IN)),
        ("CP_NP_F_DENY_OUT", i128::from(NP_F_DENY_OUT)),
        ("CP_NP_HOST_NET", i128::from(NP_HOST_NET)),
        ("CP_NP_HOST_ID", i128::from(NP_HOST_ID)),
        ("CP_CT_ZONE_HOST", i128::from(CT_ZONE_HOST)),
        ("CP_NP_INGRESS", i128::from(NP_INGRESS)),
        ("CP_NP_EGRESS", i128::from(NP_EGRESS)),
        ("CP_NP_PEER_ANY", i128::from(NP_PEER_ANY)),
        ("CP_NP_PEER_CIDR", i128::from(NP_PEER_CIDR)),
        ("CP_NP_RULE_FIXED_BITS", i128::from(NP_RULE_FIXED_BITS)),
        ("CP_NP_CIDR_FIXED_BITS", i128::from(NP_CIDR_FIXED_BITS)),
        ("CP_SG_MAX_GROUPS", SG_MAX_GROUPS as i128),
        ("CP_SG_PEER_CIDR", i128::from(SG_PEER_CIDR)),
        ("CP_SG_INGRESS", i128::from(SG_INGRESS)),
        ("CP_SG_EGRESS", i128::from(SG_EGRESS)),
        ("CP_SG_RULE_FIXED_BITS", i128::from(SG_RULE_FIXED_BITS)),
        ("CP_SG_CIDR_FIXED_BITS", i128::from(SG_CIDR_FIXED_BITS)),
        ("CP_SVC_SCOPE_INTERNAL", i128::from(SVC_SCOPE_INTERNAL)),
        ("CP_SVC_SCOPE_EXTERNAL", i128::from(SVC_SCOPE_EXTERNAL)),
        ("CP_LB_F_SNAT", i128::from(LB_F_SNAT)),
        ("CP_NAT_S_REPLIED", i128::from(NAT_S_REPLIED)),
        ("CP_NAT_S_CLOSING", i128::from(NAT_S_CLOSING)),
        ("CP_LB_F_REPLIED", i128::from(LB_F_REPLIED)),
        ("CP_LB_F_CLOSING", i128::from(LB_F_CLOSING)),
        ("CP_LB_F_HAIRPIN", i128::from(LB_F_HAIRPIN)),
        ("CP_SVC_F_AFFINITY", i128::from(SVC_F_AFFINITY)),
        ("CP_SVC_F_SOURCE_RANGES", i128::from(SVC_F_SOURCE_RANGES)),
        ("CP_BACKEND_F_LOCAL", i128::from(BACKEND_F_LOCAL)),
        (
            "CP_BACKEND_F_TERMINATING",
            i128::from(BACKEND_F_TERMINATING),
        ),
        // the overlay MAC is CP_OVERLAY_MAC0 then five CP_OVERLAY_MAC_BYTE
        ("CP_OVERLAY_MAC0", i128::from(OVERLAY_MAC[0])),
    ];
    v.extend(
        OVERLAY_MAC[1..]
            .iter()
            .map(|b| ("CP_OVERLAY_MAC_BYTE", i128::from(*b))),
    );
    v
}

/// The C name of a drop reason: `CP_DROP_` and its metric label.
fn drop_reason_c_name(r: DropReason) -> String {
    format!("CP_DROP_{}", r.label().to_uppercase())
}

struct Parsed {
    what: &'static str,
    maps: BTreeMap<String, Map>,
    btf: Btf,
}

fn parse(what: &'static str, bytes: &[u8]) -> Parsed {
    let obj = aya_obj::Object::parse(bytes)
        .unwrap_or_else(|e| panic!("aya-obj cannot parse the {what} object: {e}"));
    let elf = object::File::parse(bytes).unwrap();
    let section = elf
        .section_by_name(".BTF")
        .unwrap_or_else(|| panic!("the {what} object has no .BTF (built without -g?)"));
    Parsed {
        what,
        maps: obj.maps.into_iter().collect(),
        btf: Btf::parse(section.data().unwrap()),
    }
}

fn objects() -> [(Parsed, Vec<MapSpec>); 2] {
    let production = parse("production", OBJECT);
    let test = parse("CP_TEST_HOOKS", TEST_OBJECT);
    let mut test_specs = MAP_SPECS.to_vec();
    test_specs.extend(test_hook_specs());
    [(production, MAP_SPECS.to_vec()), (test, test_specs)]
}

/// Fail once with every problem, each named once (both objects usually
/// report the same drift).
fn fail_on(mut problems: Vec<String>, what: &str) {
    let mut seen = BTreeSet::new();
    problems.retain(|p| seen.insert(p.clone()));
    assert!(
        problems.is_empty(),
        "{what} differs between bpf/ and the Rust side:\n  - {}",
        problems.join("\n  - ")
    );
}

/// What the object says about the map `name`, as a [`MapSpec`].
fn spec_of(name: &str, m: &Map) -> Result<MapSpec, String> {
    let map_type = bpf_map_type::try_from(m.map_type())
        .ok()
        .and_then(|t| MapType::try_from(t).ok())
        .ok_or_else(|| format!("map {name}: unknown map type {}", m.map_type()))?;
    Ok(MapSpec {
        name: "",
        map_type,
        key_size: m.key_size(),
        value_size: m.value_size(),
        max_entries: m.max_entries(),
        flags: m.map_flags(),
    })
}

fn map_problems(obj: &Parsed, expected: &[MapSpec]) -> Vec<String> {
    let what = obj.what;
    let mut problems = Vec::new();
    for (name, m) in &obj.maps {
        if matches!(
            m.section_kind(),
            EbpfSectionKind::Data | EbpfSectionKind::Rodata | EbpfSectionKind::Bss
        ) {
            continue; // global data, not a pinned map
        }
        // per-CPU working memory (bpf/policy.h): no state, never pinned, raw bytes
        if name.starts_with("cp_scratch_") {
            if m.pinning() == PinningType::ByName {
                problems.push(format!(
                    "scratch map {name} must not be pinned ({what} object)"
                ));
            }
            if !matches!(spec_of(name, m), Ok(s) if s.map_type == MapType::PerCpuArray && s.max_entries == 1)
            {
                problems.push(format!(
                    "scratch map {name} must be a one-slot per-CPU array ({what} object)"
                ));
            }
            continue;
        }
        let Some(want) = expected.iter().find(|s| s.name == name) else {
            problems.push(format!(
                "map {name} is in the {what} object but not in MAP_SPECS (datapath.rs)"
            ));
            continue;
        };
        let have = match spec_of(name, m) {
            Ok(s) => s,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let mut differ = |field: &str, c: String, rust: String| {
            if c != rust {
                problems.push(format!(
                    "map {name}: {field} is {c} in bpf/ but {rust} in MAP_SPECS"
                ));
            }
        };
        let hex = |flags: u32| format!("{flags:#x}");
        differ(
            "type",
            format!("{:?}", have.map_type),
            format!("{:?}", want.map_type),
        );
        differ(
            "key size",
            have.key_size.to_string(),
            want.key_size.to_string(),
        );
        differ(
            "value size",
            have.value_size.to_string(),
            want.value_size.to_string(),
        );
        differ(
            "max_entries",
            have.max_entries.to_string(),
            want.max_entries.to_string(),
        );
        differ("map_flags", hex(have.flags), hex(want.flags));
        let pinned = m.pinning() == PinningType::ByName;
        let listed = MAP_SPECS.iter().any(|s| s.name == name);
        if listed && !pinned {
            problems.push(format!(
                "map {name} is in MAP_SPECS (the pinned maps) but not pinned by name in bpf/ \
                 ({what} object)"
            ));
        }
        if pinned && !listed {
            problems.push(format!(
                "map {name} is pinned by name in bpf/ ({what} object) but MAP_SPECS, the \
                 pinned maps, lacks it"
            ));
        }
    }
    for s in expected {
        if !obj.maps.contains_key(s.name) {
            let table = if MAP_SPECS.contains(s) {
                "MAP_SPECS"
            } else {
                "test_hook_specs()"
            };
            problems.push(format!(
                "map {} is in {table} but not in the {what} object (bpf/)",
                s.name
            ));
        }
    }
    problems
}

#[test]
fn map_specs_match_the_object() {
    let mut problems = Vec::new();
    for (obj, expected) in objects() {
        problems.extend(map_problems(&obj, &expected));
    }
    fail_on(problems, "the map table");
}

fn struct_problems(obj: &Parsed, mirrors: &[Mirror]) -> Vec<String> {
    let mut problems = Vec::new();
    for m in mirrors {
        let Some(c) = obj.btf.find_struct(m.c) else {
            // the test structs exist only in the test object
            if !m.c.starts_with("cp_test_") || obj.what != "production" {
                problems.push(format!(
                    "struct {} (mirrored by abi::{}) is not in the {} object's BTF; \
                     is it still a map key or value?",
                    m.c, m.rust, obj.what
                ));
            }
            continue;
        };
        let (c_name, r_name) = (m.c, m.rust);
        if c.size != m.size {
            problems.push(format!(
                "struct {c_name} is {} bytes in bpf/ but abi::{r_name} is {}",
                c.size, m.size
            ));
        }
        for &(field, offset, size) in &m.fields {
            let Some(member) = c.members.iter().find(|mem| mem.name == field) else {
                problems.push(format!(
                    "abi::{r_name}.{field} has no member {field} in struct {c_name}"
                ));
                continue;
            };
            if member.offset != offset {
                problems.push(format!(
                    "{c_name}.{field} is at offset {} in bpf/ but abi::{r_name}.{field} at {offset}",
                    member.offset
                ));
            }
            let c_size = obj.btf.size_of(member.type_id);
            if c_size != size {
                problems.push(format!(
                    "{c_name}.{field} is {c_size} bytes in bpf/ but abi::{r_name}.{field} is {size}"
                ));
            }
        }
        for member in c.members {
            if !m.fields.iter().any(|(f, ..)| *f == member.name) {
                problems.push(format!(
                    "struct {c_name} has member {} (offset {}) that abi::{r_name} lacks",
                    member.name, member.offset
                ));
            }
        }
    }
    // every struct a map is keyed by or holds has a mirror
    for (name, map) in &obj.maps {
        let Map::Btf(m) = map else { continue };
        for (role, id) in [
            ("key", m.def.btf_key_type_id),
            ("value", m.def.btf_value_type_id),
        ] {
            if id == 0 {
                continue;
            }
            if let Some(s) = obj.btf.struct_name(id) {
                if !mirrors.iter().any(|m| m.c == s) {
                    problems.push(format!(
                        "map {name}'s {role} is struct {s}, which no abi.rs type mirrors"
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn struct_layouts_match_the_object() {
    let mirrors = mirrors();
    let mut problems = Vec::new();
    for (obj, _) in objects() {
        problems.extend(struct_problems(&obj, &mirrors));
    }
    fail_on(problems, "a struct layout");
}

/// The enums `struct cp_abi_anchor` (`bpf/abi.h`) holds: name → enumerators.
fn abi_enums(obj: &Parsed) -> BTreeMap<String, Vec<(String, i128)>> {
    let anchor = obj.btf.find_struct("cp_abi_anchor").unwrap_or_else(|| {
        panic!(
            "struct cp_abi_anchor (bpf/abi.h) is not in the {} object's BTF",
            obj.what
        )
    });
    anchor
        .members
        .iter()
        .map(|m| {
            let e = obj.btf.enum_of(m.type_id).unwrap_or_else(|| {
                panic!("cp_abi_anchor.{} is not an enum", m.name);
            });
            (e.name.to_owned(), e.values.to_vec())
        })
        .collect()
}

fn drop_reason_problems(obj: &Parsed) -> Vec<String> {
    let enums = abi_enums(obj);
    let Some(c) = enums.get("cp_drop_reason") else {
        return vec![format!(
            "enum cp_drop_reason is not anchored in the {} object (bpf/abi.h)",
            obj.what
        )];
    };
    let c: BTreeMap<&str, i128> = c
        .iter()
        .filter(|(n, _)| n != "CP_DROP_MAX")
        .map(|(n, v)| (n.as_str(), *v))
        .collect();
    let mut problems = Vec::new();
    for r in DropReason::ALL {
        let name = drop_reason_c_name(r);
        match c.get(name.as_str()) {
            None => problems.push(format!(
                "DropReason::{r:?} = {} has no {name} in enum cp_drop_reason (bpf/metrics.h)",
                r as u32
            )),
            Some(&v) if v != i128::from(r as u32) => problems.push(format!(
                "drop reason {name} is {v} in bpf/metrics.h but DropReason::{r:?} is {}",
                r as u32
            )),
            Some(_) => {}
        }
    }
    for (name, v) in &c {
        if !DropReason::ALL
            .iter()
            .any(|&r| drop_reason_c_name(r) == *name)
        {
            problems.push(format!(
                "drop reason {name} = {v} (bpf/metrics.h) has no DropReason variant \
                 (or its label is not {:?})",
                name.trim_start_matches("CP_DROP_").to_lowercase()
            ));
        }
    }
    if c.len() != DropReason::ALL.len() {
        problems.push(format!(
            "enum cp_drop_reason has {} reasons but DropReason::ALL {}",
            c.len(),
            DropReason::ALL.len()
        ));
    }
    problems
}

#[test]
fn drop_reasons_match_the_object() {
    let mut problems = Vec::new();
    for (obj, _) in objects() {
        problems.extend(drop_reason_problems(&obj));
    }
    fail_on(problems, "the drop reason enum");
}

fn constant_problems(obj: &Parsed) -> Vec<String> {
    let c: BTreeMap<String, i128> = abi_enums(obj).into_values().flatten().collect();
    let rust = constants();
    let mut problems = Vec::new();
    for (name, want) in &rust {
        match c.get(*name) {
            None => problems.push(format!(
                "constant {name} is not in the ABI enums of the {} object (bpf/abi.h)",
                obj.what
            )),
            Some(have) if have != want => problems.push(format!(
                "constant {name} is {have} ({have:#x}) in bpf/ but the Rust mirror in abi.rs is \
                 {want} ({want:#x})"
            )),
            Some(_) => {}
        }
    }
    let mirrored: BTreeSet<&str> = rust.iter().map(|(n, _)| *n).collect();
    for (name, v) in &c {
        if name.starts_with("CP_DROP_") && name != "CP_DROP_MAX" {
            continue; // the reasons: drop_reasons_match_the_object
        }
        if !mirrored.contains(name.as_str()) {
            problems.push(format!(
                "constant {name} = {v} is in an ABI enum (bpf/abi.h) but abi.rs does not \
                 mirror it (add it to constants() in abi/object_check.rs)"
            ));
        }
    }
    problems
}

#[test]
fn constants_match_the_object() {
    let mut problems = Vec::new();
    for (obj, _) in objects() {
        problems.extend(constant_problems(&obj));
    }
    fail_on(problems, "an ABI constant");
}
