//! Loading, pin reconciliation and tcx attachment of the production object
//! on the real kernel. Needs root (the test kit's gate) and, for
//! the incompatible-pin test, `bpftool`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod bpf_support;

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use aya::programs::tc::SchedClassifier;
use aya::programs::TcAttachType;
use bpf_support::*;
use cozyplane_datapath::abi::{Endpoint, EpKey};
use cozyplane_datapath::{
    detach_tcx, Attached, Datapath, DatapathError, Direction, Iface, Program, MAP_SPECS,
};
use cozyplane_testkit::Tool;

#[test]
fn every_program_passes_the_verifier_and_maps_match_the_spec_table() {
    if !needs!().root().ready() {
        return;
    }
    let pins = PinDir::new("verify");
    let dp = Datapath::load(pins.path()).expect("production object loads");
    assert!(dp.replaced_pins().is_empty());
    assert_eq!(dp.pinned_specs().unwrap(), MAP_SPECS.to_vec());
    for s in &MAP_SPECS {
        assert!(
            pins.path().join(s.name).exists(),
            "{} pinned by name",
            s.name
        );
    }
    let stats = dp.map_stats().unwrap();
    assert_eq!(stats.len(), MAP_SPECS.len());
    let mut total = 0;
    for s in &stats {
        // an LPM trie allocates per node, so an empty one charges nothing
        let lpm = matches!(
            s.name,
            "cp_remotes"
                | "cp_masq_srcs"
                | "cp_internal"
                | "cp_peer_routes"
                | "cp_sg_rules"
                | "cp_sg_cidrs"
                | "cp_np_rules"
                | "cp_np_deny"
                | "cp_np_cidrs"
                | "cp_lb_src"
        );
        assert!(lpm || s.memlock_bytes > 0, "{} reports its memory", s.name);
        eprintln!(
            "memlock {:>16} {:>10} bytes (empty)",
            s.name, s.memlock_bytes
        );
        total += s.memlock_bytes;
    }
    eprintln!("memlock total {total} bytes (empty)");
}

#[test]
fn pins_are_reused_across_reloads_and_incompatible_ones_replaced() {
    if !needs!().root().tool(&BPFTOOL).ready() {
        return;
    }
    let pins = PinDir::new("reuse");
    let key = EpKey::new(0, Ipv4Addr::new(10, 244, 1, 2));
    let ep = Endpoint {
        ifindex: 42,
        mac: POD_MAC,
        flags: 0,
    };
    {
        let mut dp = Datapath::load(pins.path()).unwrap();
        dp.locals.insert(&key, &ep).unwrap();
        dp.ports.insert(&42, &Default::default()).unwrap();
    }
    // an agent restart keeps the state
    let dp = Datapath::load(pins.path()).unwrap();
    assert_eq!(dp.locals.get(&key).unwrap(), Some(ep));
    drop(dp);

    // an older agent left cp_ports with another value size, and a map this
    // object no longer has
    bpftool_map(&pins.path().join("cp_ports"), "cp_ports", 4, 4);
    bpftool_map(&pins.path().join("cp_retired"), "cp_retired", 4, 8);
    let dp = Datapath::load(pins.path()).unwrap();
    assert_eq!(dp.replaced_pins(), ["cp_ports"]);
    assert!(
        !pins.path().join("cp_retired").exists(),
        "unknown cp_ map pin swept"
    );
    assert_eq!(dp.pinned_specs().unwrap(), MAP_SPECS.to_vec());
    assert_eq!(
        dp.ports.get(&42).unwrap(),
        None,
        "replaced map starts empty"
    );
    assert_eq!(
        dp.locals.get(&key).unwrap(),
        Some(ep),
        "compatible maps kept"
    );
}

/// bpftool makes the maps an older agent would have left.
const BPFTOOL: Tool = Tool::new("bpftool", &["version"], "bpftool");

fn bpftool_map(path: &Path, name: &str, key: u32, value: u32) {
    let _ = std::fs::remove_file(path);
    let out = Command::new("bpftool")
        .args(["map", "create"])
        .arg(path)
        .args([
            "type",
            "hash",
            "key",
            &key.to_string(),
            "value",
            &value.to_string(),
        ])
        .args(["entries", "16", "name", name])
        .output()
        .expect("bpftool is installed (apt-get install bpftool)");
    assert!(
        out.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pin_dir_off_bpffs_is_refused_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("cp-not-bpffs-{}", std::process::id()));
    let err = Datapath::load(&dir).err().expect("must fail");
    let _ = std::fs::remove_dir(&dir);
    assert!(matches!(err, DatapathError::NotBpffs { .. }), "{err}");
    assert!(err.to_string().contains("mount -t bpf"));
}

/// Run `ip` (iproute2) in this thread's network namespace.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2) is installed");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn attached_ids(ifname: &str, dir: TcAttachType) -> Vec<u32> {
    let (_, progs) = SchedClassifier::query_tcx(ifname, dir).expect("query tcx");
    progs.iter().map(|p| p.id()).collect()
}

fn prog_id(dp: &mut Datapath, p: Program) -> u32 {
    dp.program_mut(p).unwrap().info().unwrap().id()
}

#[test]
fn tcx_links_survive_the_process_update_in_place_and_detach() {
    if !needs!().root().ready() {
        return;
    }
    // A private network namespace for this test thread only: its veths and
    // links vanish with it.
    // SAFETY: unshare has no memory-safety preconditions; it only moves the
    // calling thread into a new network namespace.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "unshare(CLONE_NEWNET): {}",
        std::io::Error::last_os_error()
    );
    ip(&["link", "add", "cpa", "type", "veth", "peer", "name", "cpb"]);
    ip(&["link", "set", "cpa", "up"]);

    let pins = PinDir::new("tcx");
    let links = pins.mount().join("links");
    std::fs::create_dir_all(&links).unwrap();
    let ingress_pin = links.join("cpa-ingress");

    let mut dp1 = Datapath::load(pins.path()).unwrap();
    let id1 = prog_id(&mut dp1, Program::FromPod);
    let r = dp1
        .attach_tcx(
            Iface::Name("cpa"),
            Program::FromPod,
            Direction::Ingress,
            &ingress_pin,
        )
        .unwrap();
    assert_eq!(r, Attached::Created);
    assert_eq!(attached_ids("cpa", TcAttachType::Ingress), [id1]);
    drop(dp1);
    assert_eq!(
        attached_ids("cpa", TcAttachType::Ingress),
        [id1],
        "the pinned link outlives the loader"
    );

    // a restarted agent swaps its program into the same link atomically
    let mut dp2 = Datapath::load(pins.path()).unwrap();
    let id2 = prog_id(&mut dp2, Program::FromPod);
    assert_ne!(id1, id2);
    let r = dp2
        .attach_tcx(
            Iface::Name("cpa"),
            Program::FromPod,
            Direction::Ingress,
            &ingress_pin,
        )
        .unwrap();
    assert_eq!(r, Attached::Updated);
    assert_eq!(attached_ids("cpa", TcAttachType::Ingress), [id2]);

    // by index, on egress
    let ifindex = nix_ifindex("cpa");
    let egress_pin = links.join("cpa-egress");
    let r = dp2
        .attach_tcx(
            Iface::Index(ifindex),
            Program::ToPod,
            Direction::Egress,
            &egress_pin,
        )
        .unwrap();
    assert_eq!(r, Attached::Created);
    assert_eq!(
        attached_ids("cpa", TcAttachType::Egress),
        [prog_id(&mut dp2, Program::ToPod)]
    );

    // the device is re-created under the same name: the defunct pinned link
    // is replaced by a fresh one
    ip(&["link", "del", "cpa"]);
    ip(&["link", "add", "cpa", "type", "veth", "peer", "name", "cpb"]);
    let r = dp2
        .attach_tcx(
            Iface::Name("cpa"),
            Program::FromPod,
            Direction::Ingress,
            &ingress_pin,
        )
        .unwrap();
    assert_eq!(r, Attached::Created);
    assert_eq!(attached_ids("cpa", TcAttachType::Ingress), [id2]);
    assert!(
        std::fs::read_dir(&links)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().ends_with("-swap")),
        "no temporary pin left behind"
    );

    assert!(detach_tcx(&ingress_pin).unwrap());
    assert!(attached_ids("cpa", TcAttachType::Ingress).is_empty());
    assert!(!detach_tcx(&ingress_pin).unwrap(), "detach is idempotent");

    let err = dp2
        .attach_tcx(
            Iface::Name("nope0"),
            Program::FromPod,
            Direction::Ingress,
            &links.join("nope"),
        )
        .unwrap_err();
    assert!(matches!(err, DatapathError::NoSuchInterface(_)), "{err}");
    assert!(!links.join("nope").exists());
}

fn nix_ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: `c` is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(i, 0, "{name} exists");
    i
}

#[test]
fn a_failed_load_leaves_no_fresh_pins_behind() {
    if !needs!().root().ready() {
        return;
    }
    let pins = PinDir::new("failed-load");
    // something that is not a map squats on one map's pin name
    std::fs::create_dir_all(pins.path().join("cp_vnis")).unwrap();
    let err = Datapath::load(pins.path()).err().expect("load must fail");
    assert!(matches!(err, DatapathError::Load(_)), "{err}");
    let left: Vec<String> = std::fs::read_dir(pins.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["cp_vnis"], "only the squatter remains");

    std::fs::remove_dir(pins.path().join("cp_vnis")).unwrap();
    let dp = Datapath::load(pins.path()).expect("loads once the squatter is gone");
    assert!(dp.replaced_pins().is_empty());
}

/// The pod veths' programs are tc filters (`pod_tc`): both hooks run this
/// loader's programs in direct-action mode, a second loader replaces them in
/// place (still one filter per hook), they outlive the loader, they really
/// filter (a veth without a `ports` entry drops what the pod sends), and
/// CHECK's probe reports a missing or foreign filter.
#[tokio::test(flavor = "current_thread")]
async fn pod_filters_replace_in_place_outlive_the_loader_and_fail_closed() {
    use cozyplane_datapath::abi::DropReason;
    use cozyplane_datapath::netlink::{NlHandle, TcHook};
    use cozyplane_datapath::{
        attach_pod_programs, check_pod_programs, detach_pod_programs, POD_FILTER_HANDLE,
        POD_FILTER_PRIORITY,
    };
    if !needs!()
        .root()
        .tool(&cozyplane_testkit::tools::PING)
        .ready()
    {
        return;
    }
    // SAFETY: unshare has no memory-safety preconditions; it only moves the
    // calling thread (the current-thread runtime's only one) into a new
    // network namespace.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    ip(&["link", "add", "cpa", "type", "veth", "peer", "name", "cpb"]);
    ip(&["link", "set", "cpa", "up"]);
    ip(&["addr", "add", "10.9.0.1/24", "dev", "cpb"]);
    ip(&["link", "set", "cpb", "up"]);
    let cpa = nix_ifindex("cpa");
    let nl = NlHandle::current().unwrap();
    let ids = |hook| {
        let nl = nl.clone();
        async move {
            nl.bpf_filters(cpa, hook)
                .await
                .unwrap()
                .iter()
                .map(|f| {
                    assert_eq!(
                        (f.priority, f.handle),
                        (POD_FILTER_PRIORITY, POD_FILTER_HANDLE)
                    );
                    assert!(f.direct_action, "{f:?}");
                    f.prog_id.expect("a program id")
                })
                .collect::<Vec<u32>>()
        }
    };

    let pins = PinDir::new("podtc");
    let mut dp1 = Datapath::load(pins.path()).unwrap();
    let progs1 = dp1.pod_programs().unwrap();
    assert!(
        check_pod_programs(&nl, cpa, &progs1)
            .await
            .unwrap()
            .is_some(),
        "CHECK passes a veth without programs"
    );
    attach_pod_programs(&nl, cpa, &progs1).await.unwrap();
    let (in1, out1) = (
        prog_id(&mut dp1, Program::FromPod),
        prog_id(&mut dp1, Program::ToPod),
    );
    assert_eq!(ids(TcHook::Ingress).await, [in1]);
    assert_eq!(ids(TcHook::Egress).await, [out1]);
    assert_eq!(check_pod_programs(&nl, cpa, &progs1).await.unwrap(), None);

    // they filter: what the "pod" (cpb) sends meets from_pod, which knows no
    // port for cpa and drops it
    let before = dp1.drop_count(DropReason::NoPort).unwrap();
    let _ = Command::new("ping")
        .args(["-c", "2", "-i", "0.2", "-W", "1", "10.9.0.2"])
        .output()
        .expect("ping");
    assert!(
        dp1.drop_count(DropReason::NoPort).unwrap() > before,
        "from_pod did not see (and drop) the pod's packets"
    );
    drop(progs1);
    drop(dp1);
    assert_eq!(
        ids(TcHook::Ingress).await,
        [in1],
        "the filter outlives the loader"
    );

    // a restarted agent: its programs replace the old ones in place
    let mut dp2 = Datapath::load(pins.path()).unwrap();
    let progs2 = dp2.pod_programs().unwrap();
    let (in2, out2) = (
        prog_id(&mut dp2, Program::FromPod),
        prog_id(&mut dp2, Program::ToPod),
    );
    assert_ne!(in1, in2);
    let stale = check_pod_programs(&nl, cpa, &progs2).await.unwrap();
    assert!(
        stale
            .as_deref()
            .is_some_and(|s| s.contains(&in1.to_string())),
        "CHECK must name the old program: {stale:?}"
    );
    attach_pod_programs(&nl, cpa, &progs2).await.unwrap();
    assert_eq!(ids(TcHook::Ingress).await, [in2], "replaced, not added");
    assert_eq!(ids(TcHook::Egress).await, [out2]);
    assert_eq!(check_pod_programs(&nl, cpa, &progs2).await.unwrap(), None);

    // one hook lost: CHECK says which
    assert!(nl
        .del_bpf_filter(cpa, TcHook::Egress, POD_FILTER_PRIORITY, POD_FILTER_HANDLE)
        .await
        .unwrap());
    let missing = check_pod_programs(&nl, cpa, &progs2).await.unwrap();
    assert!(
        missing.as_deref().is_some_and(|s| s.contains("egress")),
        "{missing:?}"
    );
    detach_pod_programs(&nl, cpa).await.unwrap();
    assert!(ids(TcHook::Ingress).await.is_empty());
    detach_pod_programs(&nl, cpa)
        .await
        .expect("detach is idempotent");
    ip(&["link", "del", "cpa"]);
    detach_pod_programs(&nl, cpa)
        .await
        .expect("a gone device has nothing to detach");
    let err = attach_pod_programs(&nl, cpa, &progs2).await.unwrap_err();
    assert!(matches!(err, DatapathError::Tc { .. }), "{err}");
}
