//! The state machine against a fake kernel (veths, `ports`, `locals`,
//! attached programs in one table) and the real FabricIP allocator over the
//! in-memory claim store. Faults are injected per step.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, Write};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use cozyplane_cni::config::ValidAttachment;
use cozyplane_cni::env::PodIdentity;
use cozyplane_cni::proto::{decode_response, read_line, write_request, StatusRequest};

use super::*;
use crate::ipam::memory::{Faults, MemoryClaimStore};
use crate::ipam::{FabricIpam, Pools};

/// The fake kernel.
#[derive(Debug, Default)]
struct Kernel {
    next_ifindex: u32,
    veths: BTreeMap<String, Plumbed>,
    ports: BTreeMap<u32, u32>,
    locals: BTreeMap<(u32, IpAddr), (u32, [u8; 6])>,
    attached: BTreeSet<String>,
    /// Ports severed by `quarantine_port`.
    quarantined: BTreeSet<u32>,
    /// Dual-address bridges: fabric address -> (net, vpc address, ifindex).
    bridges: BTreeMap<IpAddr, (u32, IpAddr, u32)>,
    /// Fabric routes: (host ifindex, fabric address) -> pod MAC.
    bridge_routes: BTreeMap<(u32, IpAddr), [u8; 6]>,
    /// `cp_netns`: network namespace cookie -> (net, ifindex).
    netns: BTreeMap<u64, (u32, u32)>,
    /// Operations that fail: "prepare", "plumb", "put_port", "put_local#N" (the N-th
    /// put_local call, from 1), "attach", "unplumb", "delete_local",
    /// "delete_port", "detach", "inspect".
    failing: BTreeSet<String>,
    put_local_calls: usize,
    /// The next plumb takes this long (to widen race windows); `None` again
    /// once that plumb has started.
    slow_plumb_once: Option<std::time::Duration>,
}

impl Kernel {
    fn is_empty(&self) -> bool {
        self.veths.is_empty()
            && self.ports.is_empty()
            && self.locals.is_empty()
            && self.attached.is_empty()
            && self.quarantined.is_empty()
            && self.bridges.is_empty()
            && self.bridge_routes.is_empty()
            && self.netns.is_empty()
    }

    fn fail(&self, op: &str) -> Result<(), StepError> {
        if self.failing.contains(op) {
            Err(StepError::Mismatch(format!("injected {op} failure")))
        } else {
            Ok(())
        }
    }
}

type Shared = Arc<Mutex<Kernel>>;

fn k(shared: &Shared) -> std::sync::MutexGuard<'_, Kernel> {
    shared.lock().unwrap()
}

fn veth_key(container_id: &str, ifname: &str) -> String {
    format!("{container_id}/{ifname}")
}

struct FakePlumber(Shared);

/// The fake plumber's VPC pods have netns cookie `FAKE_COOKIE_BASE + ifindex`.
const FAKE_COOKIE_BASE: u64 = 1 << 40;
struct FakeDatapath(Shared);

#[async_trait]
impl Plumber for FakePlumber {
    /// The pair's key in `veths`.
    type Pair = String;

    async fn prepare(&self, spec: &PairSpec) -> Result<String, StepError> {
        tokio::task::yield_now().await;
        let mut k = k(&self.0);
        k.fail("prepare")?;
        let key = veth_key(&spec.container_id, &spec.ifname);
        if k.veths.contains_key(&key) {
            return Err(StepError::Mismatch("veth exists".into()));
        }
        k.next_ifindex += 1;
        let ifindex = 100 + k.next_ifindex;
        // as the real one: a pair with no record reads back as ours,
        // holding no known address
        let p = Plumbed {
            container_id: spec.container_id.clone(),
            ifname: spec.ifname.clone(),
            host_ifname: format!("cph{ifindex}"),
            host_ifindex: ifindex,
            pod_mac: [0; 6],
            addresses: Vec::new(),
            net: 0,
            fabric: Vec::new(),
            severed: false,
            netns_cookie: None,
        };
        k.veths.insert(key.clone(), p);
        Ok(key)
    }

    async fn plumb(&self, spec: &PlumbSpec, pair: String) -> Result<Plumbed, StepError> {
        let delay = k(&self.0).slow_plumb_once.take();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        tokio::task::yield_now().await;
        let mut k = k(&self.0);
        let key = veth_key(&spec.container_id, &spec.ifname);
        assert_eq!(pair, key, "plumb of another attachment's pair");
        if let Err(e) = k.fail("plumb") {
            // the real plumber deletes the pair on failure
            k.veths.remove(&key);
            return Err(e);
        }
        let p = k
            .veths
            .get_mut(&key)
            .ok_or_else(|| StepError::Mismatch("no prepared pair".into()))?;
        if !p.addresses.is_empty() {
            return Err(StepError::Mismatch("the pair is already plumbed".into()));
        }
        let ifindex = p.host_ifindex;
        p.pod_mac = [2, 0, 0, 0, 0, ifindex as u8];
        p.addresses = spec.addresses.clone();
        p.net = spec.net;
        p.fabric = spec.fabric.clone();
        // the fake namespace cookie of a VPC pod's netns
        p.netns_cookie = (spec.net != 0).then_some(FAKE_COOKIE_BASE + u64::from(ifindex));
        Ok(p.clone())
    }

    async fn unplumb(&self, container_id: &str, ifname: &str) -> Result<bool, StepError> {
        let mut k = k(&self.0);
        k.fail("unplumb")?;
        let gone = k.veths.remove(&veth_key(container_id, ifname));
        // routes and neighbours go with the veth
        if let Some(v) = &gone {
            k.bridge_routes.retain(|(i, _), _| *i != v.host_ifindex);
        }
        Ok(gone.is_some())
    }

    async fn inspect(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Plumbed>, StepError> {
        let k = k(&self.0);
        k.fail("inspect")?;
        Ok(k.veths.get(&veth_key(container_id, ifname)).cloned())
    }

    async fn list(&self) -> Result<Vec<Plumbed>, StepError> {
        Ok(k(&self.0).veths.values().cloned().collect())
    }

    async fn plumb_bridge(
        &self,
        host_ifindex: u32,
        fabric: IpAddr,
        pod_mac: [u8; 6],
    ) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("plumb_bridge")?;
        k.bridge_routes.insert((host_ifindex, fabric), pod_mac);
        Ok(())
    }

    async fn unplumb_bridge(&self, host_ifindex: u32, fabric: IpAddr) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("unplumb_bridge")?;
        k.bridge_routes.remove(&(host_ifindex, fabric));
        Ok(())
    }
}

#[async_trait]
impl DatapathWriter for FakeDatapath {
    async fn put_port(&self, ifindex: u32, net: u32) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("put_port")?;
        k.ports.insert(ifindex, net);
        k.quarantined.remove(&ifindex); // a new port is never severed
        Ok(())
    }

    async fn delete_port(&self, ifindex: u32) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("delete_port")?;
        k.ports.remove(&ifindex);
        k.quarantined.remove(&ifindex);
        Ok(())
    }

    async fn quarantine_port(&self, ifindex: u32) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("quarantine_port")?;
        if k.ports.contains_key(&ifindex) {
            k.quarantined.insert(ifindex);
        }
        Ok(())
    }

    async fn put_local(
        &self,
        net: u32,
        addr: IpAddr,
        ifindex: u32,
        mac: [u8; 6],
    ) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.put_local_calls += 1;
        let nth = format!("put_local#{}", k.put_local_calls);
        k.fail(&nth)?;
        k.locals.insert((net, addr), (ifindex, mac));
        Ok(())
    }

    async fn delete_local(
        &self,
        net: u32,
        addr: IpAddr,
        ifindex: Option<u32>,
    ) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("delete_local")?;
        let ours = match (k.locals.get(&(net, addr)), ifindex) {
            (Some((have, _)), Some(want)) => *have == want,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if ours {
            k.locals.remove(&(net, addr));
        }
        Ok(())
    }

    async fn put_bridge(
        &self,
        fabric: IpAddr,
        net: u32,
        vpc: IpAddr,
        ifindex: u32,
    ) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("put_bridge")?;
        k.bridges.insert(fabric, (net, vpc, ifindex));
        Ok(())
    }

    async fn put_netns(&self, cookie: u64, net: u32, ifindex: u32) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("put_netns")?;
        k.netns.insert(cookie, (net, ifindex));
        Ok(())
    }

    async fn delete_netns(&self, cookie: u64, ifindex: Option<u32>) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("delete_netns")?;
        if ifindex.is_none_or(|want| k.netns.get(&cookie).is_some_and(|(_, i)| *i == want)) {
            k.netns.remove(&cookie);
        }
        Ok(())
    }

    async fn delete_bridge(&self, fabric: IpAddr, ifindex: Option<u32>) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("delete_bridge")?;
        let ours = match (k.bridges.get(&fabric), ifindex) {
            (Some((_, _, have)), Some(want)) => *have == want,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if ours {
            k.bridges.remove(&fabric);
        }
        Ok(())
    }

    async fn attach(&self, host_ifname: &str, _ifindex: u32) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("attach")?;
        k.attached.insert(host_ifname.to_string());
        Ok(())
    }

    async fn detach(&self, host_ifname: &str, _ifindex: u32) -> Result<(), StepError> {
        let mut k = k(&self.0);
        k.fail("detach")?;
        k.attached.remove(host_ifname);
        Ok(())
    }

    async fn check(&self, ep: &crate::desired::LocalEndpoint) -> Result<(), StepError> {
        let k = k(&self.0);
        if k.ports.get(&ep.host_ifindex) != Some(&ep.net) {
            return Err(StepError::Mismatch("ports entry missing".into()));
        }
        for (net, a) in ep.keys() {
            if k.locals.get(&(net, a)) != Some(&(ep.host_ifindex, ep.pod_mac)) {
                return Err(StepError::Mismatch(format!("locals entry for {a} missing")));
            }
        }
        if !k.attached.contains(&ep.host_ifname) {
            return Err(StepError::Mismatch("programs not attached".into()));
        }
        Ok(())
    }
}

type Handler = CniHandler<FabricIpam<MemoryClaimStore>, FakePlumber, FakeDatapath>;

fn handler(pools: &str) -> (Arc<Handler>, Shared) {
    let (h, shared) = unready_handler(pools);
    h.set_ready(true);
    (Arc::new(h), shared)
}

/// A handler over fresh fakes, not yet ready.
fn unready_handler(pools: &str) -> (Handler, Shared) {
    let shared: Shared = Arc::default();
    let ipam = FabricIpam::new(MemoryClaimStore::new(), Pools::parse(pools, &[]).unwrap());
    let h = CniHandler::new(
        ipam,
        FakePlumber(Arc::clone(&shared)),
        FakeDatapath(Arc::clone(&shared)),
        HandlerConfig {
            node: "node-a".into(),
            default_mtu: 1450,
            serial_add: false,
        },
    );
    (h, shared)
}

const DUAL: &str = "10.244.0.0/24,fd00:10:244::/120";

fn attachment(container: &str, uid: Option<&str>) -> Attachment {
    Attachment {
        network: "cozyplane".into(),
        container_id: container.into(),
        ifname: "eth0".into(),
        netns: Some(format!("/run/netns/{container}")),
        pod: uid.map(|u| PodIdentity {
            namespace: "default".into(),
            name: format!("pod-{u}"),
            uid: Some(u.into()),
            infra_container_id: None,
        }),
    }
}

fn add_req(container: &str, uid: &str) -> AddRequest {
    AddRequest {
        attachment: attachment(container, Some(uid)),
        mtu: None,
        runtime_config: None,
    }
}

fn del_req(container: &str, uid: Option<&str>) -> DelRequest {
    DelRequest {
        attachment: attachment(container, uid),
        prev_result: None,
    }
}

fn claims(h: &Handler) -> usize {
    h.ipam().store().snapshot().len()
}

#[tokio::test]
async fn add_plumbs_everything_and_returns_a_well_formed_result() {
    let (h, kernel) = handler(DUAL);
    let r = h.add(&add_req("c1", "u1")).await.unwrap();
    r.validate().unwrap();
    assert_eq!(r.interfaces.len(), 2);
    assert_eq!(r.interfaces[1].name, "eth0");
    assert_eq!(r.interfaces[1].sandbox.as_deref(), Some("/run/netns/c1"));
    assert_eq!(r.interfaces[1].mtu, Some(1450));
    assert!(
        r.interfaces[0].sandbox.is_none(),
        "host veth has no sandbox"
    );
    assert_eq!(r.ips.len(), 2);
    assert_eq!(r.ips[0].address.prefix_len(), 32);
    assert_eq!(r.ips[0].gateway, Some(IpAddr::V4(GATEWAY_V4)));
    assert_eq!(r.ips[1].address.prefix_len(), 128);
    assert_eq!(r.ips[1].gateway, Some(IpAddr::V6(GATEWAY_V6)));
    assert_eq!(r.routes.len(), 2);
    assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
    assert_eq!(r.routes[1].dst.to_string(), "::/0");

    let k = k(&kernel);
    let veth = &k.veths["c1/eth0"];
    assert_eq!(r.interfaces[0].name, veth.host_ifname);
    assert_eq!(r.interfaces[1].mac.as_deref(), Some("02:00:00:00:00:65"));
    assert_eq!(k.ports[&veth.host_ifindex], 0);
    assert!(
        k.netns.is_empty() && veth.netns_cookie.is_none(),
        "a net-0 pod's namespace is not recorded: it sees net-0 Services"
    );
    for ip in &r.ips {
        assert_eq!(
            k.locals[&(0, ip.address.addr())],
            (veth.host_ifindex, veth.pod_mac)
        );
    }
    assert!(k.attached.contains(&veth.host_ifname));
    drop(k);
    assert_eq!(claims(&h), 2);
}

#[tokio::test]
async fn rollback_leaves_nothing_behind_whichever_step_fails() {
    for step in [
        "prepare",
        "plumb",
        "put_port",
        "put_local#1",
        "put_local#2",
        "attach",
    ] {
        let (h, kernel) = handler(DUAL);
        k(&kernel).failing.insert(step.into());
        let err = h.add(&add_req("c1", "u1")).await.unwrap_err();
        assert!(
            matches!(&err, HandlerError::Step { undo_failures, .. } if undo_failures.is_empty()),
            "{step}: {err}"
        );
        assert_eq!(err.to_cni_error().code, code::AGENT_INTERNAL);
        assert!(
            k(&kernel).is_empty(),
            "{step}: kernel state left: {:?}",
            k(&kernel)
        );
        assert_eq!(claims(&h), 0, "{step}: claims left");
        // and the attachment works once the fault is gone
        k(&kernel).failing.clear();
        h.add(&add_req("c1", "u1")).await.unwrap();
        assert_eq!(claims(&h), 2, "{step}");
    }
}

#[tokio::test]
async fn an_ipam_failure_leaves_nothing_and_maps_to_cni_codes() {
    let (h, kernel) = handler("10.0.0.0/30");
    h.add(&add_req("a", "ua")).await.unwrap();
    h.add(&add_req("b", "ub")).await.unwrap();
    let err = h.add(&add_req("c", "uc")).await.unwrap_err();
    assert!(
        matches!(err, HandlerError::Ipam(IpamError::Exhausted { .. })),
        "{err}"
    );
    assert_eq!(err.to_cni_error().code, code::AGENT_INTERNAL);
    assert_eq!(err.to_cni_error().msg, "pod address pool exhausted");
    assert_eq!(k(&kernel).veths.len(), 2);

    // the API server is down: try again later, nothing made
    let (h, kernel) = handler(DUAL);
    h.ipam().store().set_faults(Faults {
        creates_before_failure: Some(1),
        ..Faults::default()
    });
    let err = h.add(&add_req("c", "uc")).await.unwrap_err();
    assert_eq!(err.to_cni_error().code, code::TRY_AGAIN_LATER);
    assert!(k(&kernel).is_empty());
    assert_eq!(claims(&h), 0);
}

#[tokio::test]
async fn a_re_add_clears_a_pair_an_interrupted_add_left_unrecorded() {
    let (h, kernel) = handler(DUAL);
    // an agent killed after making the pair, before the claims answered
    let spec = PairSpec {
        container_id: "c1".into(),
        ifname: "eth0".into(),
        netns: "/run/netns/c1".into(),
        mtu: 1450,
    };
    h.plumber.prepare(&spec).await.unwrap();
    let r = h.add(&add_req("c1", "u1")).await.unwrap();
    let k = k(&kernel);
    assert_eq!(k.veths.len(), 1);
    assert_eq!(
        k.veths["c1/eth0"].addresses,
        r.ips.iter().map(|i| i.address.addr()).collect::<Vec<_>>()
    );
    drop(k);
    assert_eq!(claims(&h), 2);
}

#[tokio::test]
async fn a_failing_undo_step_is_reported() {
    let (h, kernel) = handler(DUAL);
    {
        let mut k = k(&kernel);
        k.failing.insert("attach".into());
        k.failing.insert("unplumb".into());
    }
    let err = h.add(&add_req("c1", "u1")).await.unwrap_err();
    match &err {
        HandlerError::Step {
            step: Step::Attach,
            undo_failures,
            ..
        } => {
            assert_eq!(undo_failures.len(), 1, "{undo_failures:?}");
            assert!(
                undo_failures.0[0].what.contains("Unplumb"),
                "{undo_failures:?}"
            );
        }
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("rollback also failed"));
    assert_eq!(
        err.to_cni_error().details,
        "cannot attach the programs: injected attach failure (rollback also failed: \
         Unplumb { container_id: \"c1\", ifname: \"eth0\" }: injected unplumb failure)"
    );
    // the rest was undone: map entries gone, claims released
    let k = k(&kernel);
    assert!(k.ports.is_empty() && k.locals.is_empty() && k.attached.is_empty());
    assert_eq!(k.veths.len(), 1, "only the veth the fault kept");
    drop(k);
    assert_eq!(claims(&h), 0);
}

#[tokio::test]
async fn add_refuses_bad_requests_before_touching_anything() {
    let (h, kernel) = handler(DUAL);
    let mut no_netns = add_req("c", "u");
    no_netns.attachment.netns = None;
    assert_eq!(
        h.add(&no_netns).await.unwrap_err().to_cni_error().code,
        code::INVALID_ENVIRONMENT
    );
    let mut no_pod = add_req("c", "u");
    no_pod.attachment.pod = None;
    assert_eq!(
        h.add(&no_pod).await.unwrap_err().to_cni_error().code,
        code::INVALID_ENVIRONMENT
    );
    let mut no_uid = add_req("c", "u");
    if let Some(p) = no_uid.attachment.pod.as_mut() {
        p.uid = None;
    }
    let err = h.add(&no_uid).await.unwrap_err();
    assert!(
        matches!(err, HandlerError::Ipam(IpamError::MissingPodUid)),
        "{err}"
    );
    assert_eq!(err.to_cni_error().code, code::INVALID_ENVIRONMENT);
    assert!(k(&kernel).is_empty());
    assert_eq!(claims(&h), 0);
}

#[tokio::test]
async fn del_is_idempotent_with_and_without_identity() {
    let (h, kernel) = handler(DUAL);
    h.add(&add_req("c1", "u1")).await.unwrap();
    h.add(&add_req("c2", "u2")).await.unwrap();
    // DEL without pod identity or prevResult: found through the veth
    h.del(&del_req("c1", None)).await.unwrap();
    h.del(&del_req("c1", None)).await.unwrap();
    h.del(&del_req("c1", Some("u1"))).await.unwrap();
    assert_eq!(claims(&h), 2, "c2's claims untouched");
    assert_eq!(k(&kernel).veths.len(), 1);
    // a DEL of something never added
    h.del(&del_req("never", Some("u9"))).await.unwrap();
    h.del(&del_req("c2", Some("u2"))).await.unwrap();
    assert!(k(&kernel).is_empty());
    assert_eq!(claims(&h), 0);
}

#[tokio::test]
async fn del_after_the_sandbox_vanished_clears_locals_and_claims() {
    let (h, kernel) = handler(DUAL);
    let r = h.add(&add_req("c1", "u1")).await.unwrap();
    // the netns died and took the veth with it; the maps still hold entries
    let ifindex = {
        let mut k = k(&kernel);
        let v = k.veths.remove("c1/eth0").unwrap();
        k.attached.remove(&v.host_ifname);
        v.host_ifindex
    };
    let mut del = del_req("c1", Some("u1"));
    del.attachment.netns = None;
    del.prev_result = Some(r);
    h.del(&del).await.unwrap();
    let k = k(&kernel);
    assert!(k.locals.is_empty(), "{:?}", k.locals);
    // the ports entry of a vanished ifindex is the agent's prune's job
    assert_eq!(k.ports.keys().copied().collect::<Vec<_>>(), vec![ifindex]);
    drop(k);
    assert_eq!(claims(&h), 0);
}

#[tokio::test]
async fn del_keeps_the_claims_when_the_kernel_teardown_fails() {
    let (h, kernel) = handler(DUAL);
    h.add(&add_req("c1", "u1")).await.unwrap();
    k(&kernel).failing.insert("delete_local".into());
    let err = h.del(&del_req("c1", Some("u1"))).await.unwrap_err();
    assert!(matches!(err, HandlerError::Teardown(_)), "{err}");
    assert_eq!(
        claims(&h),
        2,
        "addresses stay reserved while locals may deliver them"
    );
    // the runtime retries the DEL
    k(&kernel).failing.clear();
    h.del(&del_req("c1", Some("u1"))).await.unwrap();
    assert!(k(&kernel).is_empty());
    assert_eq!(claims(&h), 0);
}

#[tokio::test]
async fn del_never_removes_another_pods_local_entry() {
    let (h, kernel) = handler(DUAL);
    let r = h.add(&add_req("c1", "u1")).await.unwrap();
    let addr = r.ips[0].address.addr();
    // the entry for c1's address now points at another veth (a newer pod)
    k(&kernel).locals.insert((0, addr), (999, [0; 6]));
    h.del(&del_req("c1", Some("u1"))).await.unwrap();
    assert_eq!(k(&kernel).locals.get(&(0, addr)), Some(&(999, [0; 6])));
}

#[tokio::test]
async fn re_add_after_a_partial_add_reuses_the_claims() {
    let (h, kernel) = handler(DUAL);
    let first = h.add(&add_req("c1", "u1")).await.unwrap();
    // simulate an agent killed after plumbing: programs and locals gone
    {
        let mut k = k(&kernel);
        k.attached.clear();
        k.locals.clear();
    }
    let again = h.add(&add_req("c1", "u1")).await.unwrap();
    assert_eq!(first.ips, again.ips, "same addresses");
    assert_eq!(claims(&h), 2);
    let k = k(&kernel);
    assert_eq!(k.veths.len(), 1);
    assert_eq!(
        k.ports.len(),
        1,
        "the old ports entry was replaced, not leaked"
    );
    assert_eq!(k.locals.len(), 2);
    assert_eq!(k.attached.len(), 1);
}

#[tokio::test]
async fn check_confirms_and_detects_drift() {
    let (h, kernel) = handler(DUAL);
    let r = h.add(&add_req("c1", "u1")).await.unwrap();
    let check = CheckRequest {
        attachment: attachment("c1", Some("u1")),
        prev_result: r.clone(),
    };
    h.check(&check).await.unwrap();
    // programs detached behind our back
    k(&kernel).attached.clear();
    let err = h.check(&check).await.unwrap_err();
    assert!(
        matches!(&err, HandlerError::Check(m) if m.to_string().contains("not attached")),
        "{err}"
    );
    // a prevResult that does not match the interface
    let mut wrong = check.clone();
    wrong.prev_result.ips.pop();
    assert!(matches!(h.check(&wrong).await, Err(HandlerError::Check(_))));
    // no such attachment
    let mut other = check;
    other.attachment.container_id = "nope".into();
    assert!(matches!(h.check(&other).await, Err(HandlerError::Check(_))));
}

#[tokio::test]
async fn status_follows_readiness() {
    let (h, _) = handler(DUAL);
    let status = Request::Status(StatusRequest {
        network: "cozyplane".into(),
    });
    assert_eq!(h.handle(&status).await, Response::ok());
    h.set_ready(false);
    match h.handle(&status).await {
        Response::Error { error } => assert_eq!(error.code, code::NOT_AVAILABLE),
        other => panic!("unexpected {other:?}"),
    }
    // ADD while not ready: try again later, nothing made
    match h.handle(&Request::Add(add_req("c", "u"))).await {
        Response::Error { error } => assert_eq!(error.code, code::TRY_AGAIN_LATER),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(claims(&h), 0);
}

#[tokio::test]
async fn gc_removes_attachments_and_orphan_claims_not_in_the_valid_list() {
    let (h, kernel) = handler(DUAL);
    h.add(&add_req("keep", "u1")).await.unwrap();
    h.add(&add_req("stale", "u2")).await.unwrap();
    // an orphan claim: the agent died between claim and plumb
    h.ipam()
        .allocate(&Claimant {
            namespace: "default".into(),
            name: "p3".into(),
            uid: "u3".into(),
            container_id: "orphan".into(),
            ifname: "eth0".into(),
            node: "node-a".into(),
        })
        .await
        .unwrap();
    assert_eq!(claims(&h), 6);
    let gc = GcRequest {
        network: "cozyplane".into(),
        valid_attachments: vec![ValidAttachment {
            container_id: "keep".into(),
            ifname: "eth0".into(),
        }],
    };
    let report = h.gc(&gc).await.unwrap();
    assert_eq!(
        report,
        GcReport {
            attachments: 1,
            claims: 4
        }
    );
    {
        let k = k(&kernel);
        assert_eq!(k.veths.keys().collect::<Vec<_>>(), vec!["keep/eth0"]);
        assert_eq!(k.locals.len(), 2);
        assert_eq!(k.ports.len(), 1);
        assert_eq!(k.attached.len(), 1);
    }
    assert_eq!(claims(&h), 2);
    // a second GC has nothing to do
    assert_eq!(h.gc(&gc).await.unwrap(), GcReport::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_and_dels_leave_a_consistent_state() {
    let (h, kernel) = handler("10.0.0.0/24");
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let h = Arc::clone(&h);
            tokio::spawn(async move {
                let c = format!("c{i}");
                let u = format!("u{i}");
                let r = h.add(&add_req(&c, &u)).await.unwrap();
                if i % 2 == 0 {
                    h.del(&del_req(&c, Some(&u))).await.unwrap();
                }
                r.ips[0].address.addr()
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let k = k(&kernel);
    assert_eq!(k.veths.len(), 20);
    assert_eq!(k.locals.len(), 20);
    assert_eq!(k.ports.len(), 20);
    drop(k);
    assert_eq!(claims(&h), 20);
}

/// The protocol contract: an ADD whose response cannot be delivered (the
/// plugin gave up and closed the socket) is rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeliverable_add_result_is_rolled_back() {
    let (h, kernel) = handler(DUAL);
    let (server, mut client) = UnixStream::pair().unwrap();
    write_request(&mut client, &Request::Add(add_req("c1", "u1"))).unwrap();
    drop(client); // the plugin timed out and left
    let rt = tokio::runtime::Handle::current();
    let h2 = Arc::clone(&h);
    let served = tokio::task::spawn_blocking(move || h2.serve_blocking(&rt, &server))
        .await
        .unwrap();
    assert!(matches!(served, Err(ProtoError::Io(_))), "{served:?}");
    assert!(k(&kernel).is_empty(), "{:?}", k(&kernel));
    assert_eq!(claims(&h), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_add_result_is_kept() {
    let (h, kernel) = handler(DUAL);
    let (server, mut client) = UnixStream::pair().unwrap();
    write_request(&mut client, &Request::Add(add_req("c1", "u1"))).unwrap();
    let rt = tokio::runtime::Handle::current();
    let h2 = Arc::clone(&h);
    let served = tokio::task::spawn_blocking(move || h2.serve_blocking(&rt, &server))
        .await
        .unwrap();
    assert_eq!(served.unwrap().op(), "add");
    let line = read_line(&mut BufReader::new(&client)).unwrap();
    match decode_response(&line).unwrap() {
        Response::Ok { result: Some(r) } => assert_eq!(r.ips.len(), 2),
        other => panic!("unexpected {other:?}"),
    }
    client.flush().unwrap();
    assert_eq!(k(&kernel).veths.len(), 1);
    assert_eq!(claims(&h), 2);
}

/// A retried ADD that arrives while the first attempt's result is being
/// delivered (and then rolled back) must not be undone by that rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_add_is_not_undone_by_the_first_attempts_rollback() {
    let (h, kernel) = handler(DUAL);
    k(&kernel).slow_plumb_once = Some(std::time::Duration::from_millis(300));
    let (server, mut client) = UnixStream::pair().unwrap();
    write_request(&mut client, &Request::Add(add_req("c1", "u1"))).unwrap();
    drop(client);
    let rt = tokio::runtime::Handle::current();
    let h1 = Arc::clone(&h);
    let first = tokio::task::spawn_blocking(move || h1.serve_blocking(&rt, &server));
    // the retry arrives while the first attempt is still plumbing (it has
    // taken the slow plumb, and takes 300 ms over it)
    cozyplane_testkit::eventually_async(
        "the first attempt to start plumbing",
        std::time::Duration::from_secs(10),
        || {
            let started = k(&kernel).slow_plumb_once.is_none();
            async move { started }
        },
    )
    .await;
    let retry = h.add(&add_req("c1", "u1")).await.unwrap();
    assert!(
        first.await.unwrap().is_err(),
        "the first result was undeliverable"
    );
    // the retry ran after the rollback and its result is what the kernel holds
    let k = k(&kernel);
    let veth = &k.veths["c1/eth0"];
    assert_eq!(retry.interfaces[0].name, veth.host_ifname);
    assert_eq!(k.locals.len(), 2);
    assert_eq!(k.ports.len(), 1);
    assert!(k.attached.contains(&veth.host_ifname));
    drop(k);
    assert_eq!(claims(&h), 2);
}

/// What the agent's /metrics serves: each request served on the socket is
/// timed by command and outcome, an undeliverable answer as an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_requests_show_up_in_the_metrics() {
    let cni = CniMetrics::default();
    let (h, kernel) = handler(DUAL);
    let Ok(h) = Arc::try_unwrap(h) else {
        panic!("the handler is shared")
    };
    let h = Arc::new(h.with_metrics(cni.clone()));
    let serve = |req: Request, read_answer: bool| {
        let (server, mut client) = UnixStream::pair().unwrap();
        write_request(&mut client, &req).unwrap();
        // else the plugin gave up
        let client = read_answer.then_some(client);
        let (h, rt) = (Arc::clone(&h), tokio::runtime::Handle::current());
        async move {
            let served = tokio::task::spawn_blocking(move || h.serve_blocking(&rt, &server))
                .await
                .unwrap();
            assert_eq!(served.is_ok(), read_answer, "{served:?}");
            if let Some(client) = client {
                read_line(&mut BufReader::new(&client)).unwrap();
            }
        }
    };
    serve(Request::Add(add_req("c1", "u1")), true).await;
    serve(Request::Del(del_req("c1", Some("u1"))), true).await;
    serve(Request::Add(add_req("c2", "u2")), false).await;
    assert!(k(&kernel).is_empty(), "the undelivered ADD was rolled back");
    h.set_ready(false);
    let status = StatusRequest {
        network: "cozyplane".into(),
    };
    serve(Request::Status(status), true).await;

    let stats = crate::runtime::watch::SyncStats::default();
    let text = crate::runtime::metrics::AgentMetrics::new(&stats, &cni).encode();
    let name = "cozyplane_cni_request_duration_seconds";
    assert!(
        text.contains(&format!("# TYPE {name} histogram\n")),
        "{text}"
    );
    for (labels, n) in [
        ("op=\"ADD\",result=\"ok\"", 1),
        ("op=\"DEL\",result=\"ok\"", 1),
        ("op=\"ADD\",result=\"error\"", 1),
        ("op=\"STATUS\",result=\"error\"", 1),
    ] {
        let count = format!("{name}_count{{{labels}}} {n}\n");
        assert!(text.contains(&count), "{count:?} missing from:\n{text}");
        let inf = format!("{name}_bucket{{{labels},le=\"+Inf\"}} {n}\n");
        assert!(text.contains(&inf), "{inf:?} missing from:\n{text}");
    }
    assert!(!text.contains("op=\"CHECK\""), "{text}");
}

/// The CNI result's details carry every cause of a nested failure once: the
/// step's error with its chain down to the errno, then each undo failure.
#[test]
fn cni_details_print_each_cause_once() {
    use crate::ipam::store::StoreError;
    use cozyplane_datapath::DatapathError;

    let err = HandlerError::Step {
        step: Step::Attach,
        error: StepError::Datapath(DatapathError::link(
            "/sys/fs/bpf/cozyplane/links/cph0-in",
            "removing the pin",
            std::io::Error::from_raw_os_error(libc::EACCES),
        )),
        undo_failures: Failures(vec![Failure::new(
            "release the claims",
            IpamError::Store(StoreError::Unavailable("timed out".into())),
        )]),
    };
    let details = err.to_cni_error().details;
    assert_eq!(
        details,
        "cannot attach the programs: link /sys/fs/bpf/cozyplane/links/cph0-in: removing \
         the pin: Permission denied (os error 13) (rollback also failed: release the claims: \
         claim store unavailable: timed out)"
    );
    for part in ["removing the pin", "Permission denied", "timed out"] {
        assert_eq!(details.matches(part).count(), 1, "{part:?} in {details}");
    }

    let check = HandlerError::Check(StepError::Mismatch("programs not attached".into()));
    assert_eq!(check.to_string(), "check failed");
    assert_eq!(
        check.to_cni_error().details,
        "check failed: programs not attached"
    );
}

// --- VPC attachments ---

mod vpc {
    use super::*;
    use crate::tenancy::testing::{vpc, Fake};
    use crate::tenancy::VpcAttach;
    use cozyplane_api::Port;

    type Ports = VpcAttach<Fake, MemoryClaimStore<Port>>;

    /// t1 owns VPC `net` (10.0.0.0/24, VNI 100, MTU 1400); namespace
    /// `default` is bound to it; pod `pod-<uid>` in `default` asks for it.
    fn vpc_handler(uids: &[&str], bound: bool) -> (Arc<Handler>, Shared, Arc<Ports>) {
        let mut f = Fake::default();
        f.vpcs.insert(
            ("t1".into(), "net".into()),
            vpc("t1", "net", &["10.0.0.0/24"], Some(100), Some("Ready")),
        );
        if bound {
            f.bindings
                .push(("default".into(), "t1".into(), "net".into()));
        }
        for u in uids {
            f.pods.insert(
                ("default".into(), format!("pod-{u}")),
                (u.to_string(), Some("t1/net".into())),
            );
        }
        let ports = Arc::new(VpcAttach::new(f, MemoryClaimStore::new(), None));
        let (h, kernel) = handler(DUAL);
        let h = Arc::into_inner(h)
            .unwrap()
            .with_tenancy(Arc::clone(&ports) as Arc<dyn Tenancy>);
        (Arc::new(h), kernel, ports)
    }

    #[tokio::test]
    async fn a_vpc_pod_holds_its_vpc_address_and_the_host_its_fabric_one() {
        let (h, kernel, ports) = vpc_handler(&["u1"], true);
        let r = h.add(&add_req("c1", "u1")).await.unwrap();
        r.validate().unwrap();
        // The result reports the fabric addresses (the kubelet's pod IPs).
        let fabric: Vec<IpAddr> = r.ips.iter().map(|i| i.address.addr()).collect();
        assert_eq!(fabric.len(), 2);
        assert!(fabric.iter().all(|a| !a.to_string().starts_with("10.0.0.")));
        assert_eq!(r.interfaces[1].mtu, Some(1400), "the VPC's MTU");
        let stored = ports.store().snapshot();
        assert_eq!(stored.len(), 1);
        let (name, port) = stored.iter().next().unwrap();
        assert!(name.starts_with("v100.10.0.0."), "{name}");
        let vpc_ip: IpAddr = port.spec.ip.parse().unwrap();

        {
            let kk = k(&kernel);
            let veth = &kk.veths["c1/eth0"];
            assert_eq!(veth.addresses, [vpc_ip], "only the VPC address inside");
            assert_eq!(veth.net, 100);
            assert_eq!(veth.fabric, fabric);
            assert_eq!(kk.ports[&veth.host_ifindex], 100);
            let want: BTreeSet<(u32, IpAddr)> = std::iter::once((100, vpc_ip))
                .chain(fabric.iter().map(|a| (0, *a)))
                .collect();
            let have: BTreeSet<(u32, IpAddr)> = kk.locals.keys().copied().collect();
            assert_eq!(have, want);
            // Its network namespace is recorded on its VPC, so socket-LB
            // never translates its sockets against net-0 Services.
            let cookie = veth.netns_cookie.expect("a VPC pod's cookie");
            assert_eq!(
                kk.netns,
                BTreeMap::from([(cookie, (100, veth.host_ifindex))])
            );
        }
        let annotated = ports_annotated(&ports);
        assert_eq!(annotated, [("pod-u1".to_string(), vec![vpc_ip])]);

        // DEL removes everything, Ports and FabricIPs included.
        h.del(&del_req("c1", Some("u1"))).await.unwrap();
        assert!(k(&kernel).is_empty(), "{:?}", k(&kernel));
        assert_eq!(claims(&h), 0);
        assert!(ports.store().snapshot().is_empty());
    }

    fn ports_annotated(p: &Ports) -> Vec<(String, Vec<IpAddr>)> {
        let annotated = p.directory().annotated.lock().unwrap();
        annotated
            .iter()
            .map(|(pod, ips, mac)| {
                assert_eq!(mac.len(), 17, "{mac}");
                (pod.clone(), ips.clone())
            })
            .collect()
    }

    #[tokio::test]
    async fn without_a_binding_nothing_is_made_and_the_error_names_why() {
        let (h, kernel, ports) = vpc_handler(&["u1"], false);
        let err = h.add(&add_req("c1", "u1")).await.unwrap_err();
        let cni = err.to_cni_error();
        assert_eq!(cni.code, code::ATTACHMENT_DENIED);
        assert!(
            cni.msg
                .contains("no VPCBinding in namespace default references VPC t1/net"),
            "{}",
            cni.msg
        );
        assert!(k(&kernel).is_empty());
        assert_eq!(claims(&h), 0, "no FabricIP");
        assert!(ports.store().snapshot().is_empty(), "no Port");
    }

    #[tokio::test]
    async fn a_retried_vpc_add_replaces_the_netns_entry_and_del_removes_it() {
        let (h, kernel, _ports) = vpc_handler(&["u1"], true);
        h.add(&add_req("c1", "u1")).await.unwrap();
        // an agent killed after plumbing: the programs are gone
        k(&kernel).attached.clear();
        h.add(&add_req("c1", "u1")).await.unwrap();
        {
            let kk = k(&kernel);
            let veth = &kk.veths["c1/eth0"];
            let cookie = veth.netns_cookie.unwrap();
            assert_eq!(
                kk.netns,
                BTreeMap::from([(cookie, (100, veth.host_ifindex))]),
                "the first attempt's entry was removed, not leaked"
            );
        }
        // An entry of the same namespace now owned by another veth survives
        // the DEL (never another pod's newer entry).
        let cookie = k(&kernel).veths["c1/eth0"].netns_cookie.unwrap();
        k(&kernel).netns.insert(cookie, (100, 9999));
        h.del(&del_req("c1", Some("u1"))).await.unwrap();
        assert_eq!(k(&kernel).netns, BTreeMap::from([(cookie, (100, 9999))]));
    }

    #[tokio::test]
    async fn a_failed_vpc_add_rolls_back_ports_too() {
        for step in [
            "plumb",
            "put_port",
            "put_netns",
            "put_local#1",
            "put_local#3",
            "plumb_bridge",
            "put_bridge",
            "attach",
        ] {
            let (h, kernel, ports) = vpc_handler(&["u1"], true);
            k(&kernel).failing.insert(step.into());
            let err = h.add(&add_req("c1", "u1")).await.unwrap_err();
            assert!(matches!(err, HandlerError::Step { .. }), "{step}: {err}");
            assert!(k(&kernel).is_empty(), "{step}: {:?}", k(&kernel));
            assert_eq!(claims(&h), 0, "{step}");
            assert!(ports.store().snapshot().is_empty(), "{step}: Port left");
        }
    }

    #[tokio::test]
    async fn vpc_exhaustion_releases_the_fabric_claim() {
        // /30 with .1 held back: one pod fits.
        let mut f = Fake::default();
        f.vpcs.insert(
            ("t1".into(), "net".into()),
            vpc("t1", "net", &["10.0.0.0/30"], Some(100), Some("Ready")),
        );
        f.bindings
            .push(("default".into(), "t1".into(), "net".into()));
        for u in ["u1", "u2"] {
            f.pods.insert(
                ("default".into(), format!("pod-{u}")),
                (u.into(), Some("t1/net".into())),
            );
        }
        let ports = Arc::new(VpcAttach::new(f, MemoryClaimStore::new(), None));
        let (h, kernel) = handler(DUAL);
        let h = Arc::into_inner(h)
            .unwrap()
            .with_tenancy(Arc::clone(&ports) as Arc<dyn Tenancy>);
        h.add(&add_req("c1", "u1")).await.unwrap();
        let err = h.add(&add_req("c2", "u2")).await.unwrap_err();
        assert!(
            matches!(err, HandlerError::Ipam(IpamError::Exhausted { .. })),
            "{err}"
        );
        assert_eq!(k(&kernel).veths.len(), 1);
        assert_eq!(claims(&h), 2, "only the first pod's FabricIPs");
        assert_eq!(ports.store().snapshot().len(), 1);
    }

    #[tokio::test]
    async fn gc_and_check_cover_vpc_attachments() {
        let (h, kernel, ports) = vpc_handler(&["u1", "u2"], true);
        let r1 = h.add(&add_req("c1", "u1")).await.unwrap();
        h.add(&add_req("c2", "u2")).await.unwrap();
        h.check(&CheckRequest {
            attachment: attachment("c1", Some("u1")),
            prev_result: r1.clone(),
        })
        .await
        .unwrap();
        h.gc(&GcRequest {
            network: "cozyplane".into(),
            valid_attachments: vec![ValidAttachment {
                container_id: "c1".into(),
                ifname: "eth0".into(),
            }],
        })
        .await
        .unwrap();
        assert_eq!(k(&kernel).veths.len(), 1);
        assert_eq!(ports.store().snapshot().len(), 1);
        assert_eq!(claims(&h), 2);
    }
}

/// A [`PolicyGate`] that records what it was asked and answers `answer`.
struct Gate {
    answer: Result<bool, String>,
    asked: std::sync::Mutex<Vec<BarrierClaims>>,
}

#[async_trait]
impl PolicyGate for Gate {
    async fn wait(&self, claims: &BarrierClaims) -> Result<bool, String> {
        self.asked.lock().unwrap().push(claims.clone());
        self.answer.clone()
    }
}

fn gated(answer: Result<bool, String>) -> (Handler, Shared, Arc<Gate>) {
    let gate = Arc::new(Gate {
        answer,
        asked: std::sync::Mutex::default(),
    });
    let (h, shared) = unready_handler(DUAL);
    let h = h.with_policy_gate(gate.clone());
    h.set_ready(true);
    (h, shared, gate)
}

#[tokio::test]
async fn an_add_asks_the_policy_gate_for_its_own_claims() {
    let (h, kernel, gate) = gated(Ok(true));
    let r = h.add(&add_req("c1", "u1")).await.unwrap();
    let asked = gate.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].namespace, "default");
    assert_eq!(asked[0].vpc_namespace, None, "a net-0 pod");
    let mut names: Vec<&str> = asked[0]
        .fabric_ips
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    names.sort();
    let mut want: Vec<String> = r
        .ips
        .iter()
        .map(|ip| cozyplane_api::names::fabric_ip_name(ip.address.addr()))
        .collect();
    want.sort();
    assert_eq!(names, want);
    let store = h.ipam().store().snapshot();
    for (name, uid) in &asked[0].fabric_ips {
        let claim = store.get(name).expect("the claim");
        assert_eq!(claim.metadata.uid.as_deref(), Some(uid.as_str()));
    }
    assert!(k(&kernel).attached.len() == 1);
}

#[tokio::test]
async fn a_policy_gate_that_does_not_clear_fails_the_add_closed() {
    let (h, kernel, _) = gated(Err("no sync wrote the pod's policy within 5s".into()));
    let err = h.add(&add_req("c1", "u1")).await.unwrap_err();
    assert!(
        matches!(&err, HandlerError::Step { step: Step::Policy, undo_failures, .. } if undo_failures.is_empty()),
        "{err}"
    );
    assert!(err.to_string().contains("no sync wrote"), "{err}");
    assert!(k(&kernel).is_empty(), "kernel state left: {:?}", k(&kernel));
    assert_eq!(claims(&h), 0, "claims left");
}
