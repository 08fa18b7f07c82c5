//! The agent's side of the CNI: ADD, DEL, CHECK, STATUS and GC as sequences
//! of steps over [`Ipam`], [`Plumber`] and [`DatapathWriter`].
//!
//! # ADD is all or nothing
//! ADD runs *claim addresses → plumb the veth → `ports` entry → (a VPC
//! pod) its network namespace's `cp_netns` entry → `locals` entries →
//! attach the programs*, pushing the inverse of every completed
//! step on an undo stack. If a step fails, the stack is unwound in reverse
//! order (programs detached, map entries removed, veth deleted, claims
//! released) and the error names the failed step plus any undo step that
//! failed too. The same unwinding runs when the result cannot be delivered
//! to the plugin ([`CniHandler::serve_blocking`]): the runtime never learned
//! about the attachment, so nothing of it may stay.
//!
//! A retried ADD of an attachment that is already (partly) plumbed, say
//! after the agent was killed in the middle of one, first tears the old
//! kernel state down and then plumbs afresh, reusing the address claims
//! (IPAM matches them by pod UID and attachment).
//!
//! # DEL is idempotent and releases addresses last
//! DEL removes the kernel state first (`locals`, `ports`, the node's routes
//! to the pod; the veth is doomed and deleted, its programs with it, in the
//! background) and releases the claims only when all of that succeeded: an
//! address is never free for another pod while a `locals` entry or a route
//! still delivers it to this veth. A veth with its record names the entries
//! to clear; only without one are the claims read to find them. Everything it removes may already be gone; a second DEL, or a
//! DEL without netns, prevResult or pod identity, succeeds. Without pod
//! identity, the claims are found through the addresses the veth or the
//! prevResult name, and released only if annotated with this attachment.
//!
//! # Concurrency
//! Operations on one attachment are serialized by a per-attachment lock.
//! GC takes a write gate that ADD/DEL/CHECK hold for reading, so an ADD in
//! flight (whose attachment the runtime's valid list cannot include yet) is
//! never collected halfway. [`CniHandler::serve_blocking`] keeps the
//! attachment's lock until an ADD's result is delivered or rolled back, so
//! a retried ADD can never be undone by its predecessor's rollback.
//!
//! The futures must run to completion (an ADD dropped between two steps
//! would skip its rollback): `serve_blocking` drives them with `block_on`,
//! which never cancels.

mod locks;
pub mod metrics;
pub mod traits;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cozyplane_cni::error::{code, CniError};
use cozyplane_cni::proto::{
    AddRequest, Attachment, CheckRequest, DelRequest, GcRequest, ProtoError, Request, Response,
};
use cozyplane_cni::server::serve_connection;
use cozyplane_cni::types::{AttachmentResult, Interface, IpConfig, Route};
use cozyplane_errors::Chain;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use tokio::sync::{OwnedMutexGuard, RwLock, RwLockReadGuard};

use crate::desired::NET_DEFAULT;
use crate::ipam::{attachment_key, Claimant, Ipam, IpamError, Release};
use crate::tenancy::{AttachError, Tenancy};
use locks::KeyedLocks;
pub use metrics::CniMetrics;
pub use traits::{
    BarrierClaims, DatapathWriter, Failure, Failures, PairSpec, PlumbSpec, Plumbed, Plumber,
    PolicyGate, StepError,
};

/// The pod's IPv4 on-link gateway (answered by proxy ARP on the host veth).
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pod's IPv6 gateway (on every host veth).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Node-wide settings of the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerConfig {
    /// This node's name (written into claims).
    pub node: String,
    /// The pod MTU when the network config sets none.
    pub default_mtu: u32,
    /// Make the veth pair after the claims instead of during them (the
    /// latency bench's A/B).
    pub serial_add: bool,
}

/// The steps of an ADD, for error reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Finding and checking the pod's VPC.
    Resolve,
    /// Claiming addresses.
    Allocate,
    /// Creating the veth pair.
    Plumb,
    /// Writing the `ports` entry.
    Port,
    /// Recording a VPC pod's network namespace (`cp_netns`).
    Netns,
    /// Writing a `locals` entry.
    Local,
    /// Bridging a VPC pod's fabric address (route, neighbour, map entry).
    Bridge,
    /// Attaching the programs.
    Attach,
    /// Waiting for the pod's policy state in the datapath.
    Policy,
    /// Tearing down an earlier, partial ADD of the same attachment.
    Reset,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Resolve => "resolve the pod's VPC",
            Step::Allocate => "claim addresses",
            Step::Plumb => "plumb the veth",
            Step::Port => "write the ports entry",
            Step::Netns => "record the pod's network namespace",
            Step::Local => "write a locals entry",
            Step::Bridge => "bridge the fabric address",
            Step::Attach => "attach the programs",
            Step::Policy => "put the pod's policy in place",
            Step::Reset => "reset an earlier partial ADD",
        })
    }
}

/// Why an operation failed. The runtime sees it through
/// [`HandlerError::to_cni_error`], with the whole chain in `details`.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The request lacks something the operation needs.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The agent is not ready to plumb pods yet.
    #[error("the node agent is not ready")]
    NotReady,
    /// IPAM failed (rolled back).
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// The pod may not join the VPC it asks for, or its lookup failed
    /// (nothing was made).
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// A step failed; everything before it was undone except `undo_failures`.
    /// It carries several errors, so it has no `source()`: the message
    /// prints the step's error and each undo failure with their chains.
    #[error("cannot {step}: {}{}", Chain(error), undo_note(undo_failures))]
    Step {
        /// The step that failed.
        step: Step,
        /// Its error.
        error: StepError,
        /// Undo steps that failed as well (the leftovers GC will meet).
        undo_failures: Failures,
    },
    /// A retried ADD could not clear the kernel state an earlier, partial
    /// ADD of the same attachment left; nothing was added.
    #[error("cannot {}: {failures}", Step::Reset, failures = .0)]
    Reset(Failures),
    /// DEL or GC could not remove everything; the claims were kept.
    #[error("teardown incomplete: {0}")]
    Teardown(Failures),
    /// CHECK found the attachment not as ADD left it.
    #[error("check failed")]
    Check(#[source] StepError),
}

fn undo_note(failures: &Failures) -> String {
    if failures.is_empty() {
        String::new()
    } else {
        format!(" (rollback also failed: {failures})")
    }
}

/// Why a DEL (or the DEL of one attachment in a GC) failed.
#[derive(Debug, thiserror::Error)]
enum DelError {
    /// Finding or releasing the claims failed.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// Some kernel state could not be removed; the claims were kept.
    #[error("teardown incomplete: {0}")]
    Teardown(Failures),
}

impl From<DelError> for HandlerError {
    fn from(e: DelError) -> Self {
        match e {
            DelError::Ipam(e) => HandlerError::Ipam(e),
            DelError::Teardown(f) => HandlerError::Teardown(f),
        }
    }
}

impl HandlerError {
    /// The CNI error the runtime sees.
    pub fn to_cni_error(&self) -> CniError {
        let code = match self {
            HandlerError::Invalid(_) | HandlerError::Ipam(IpamError::MissingPodUid) => {
                code::INVALID_ENVIRONMENT
            }
            HandlerError::NotReady => code::TRY_AGAIN_LATER,
            HandlerError::Ipam(e) if e.is_transient() => code::TRY_AGAIN_LATER,
            HandlerError::Attach(e) if e.is_transient() => code::TRY_AGAIN_LATER,
            HandlerError::Attach(AttachError::Store(_)) => code::AGENT_INTERNAL,
            HandlerError::Attach(_) => code::ATTACHMENT_DENIED,
            _ => code::AGENT_INTERNAL,
        };
        // The kubelet shows `msg` in the pod's events: a refusal names its cause.
        if let HandlerError::Attach(e) = self {
            let msg = format!("VPC attachment failed: {e}");
            let chain = Chain(e).to_string();
            let err = CniError::new(code, msg);
            return if chain == e.to_string() {
                err
            } else {
                err.with_details(chain)
            };
        }
        let msg = match self {
            HandlerError::Ipam(IpamError::Exhausted { .. }) => "pod address pool exhausted",
            HandlerError::Ipam(_) => "address management failed",
            HandlerError::Invalid(_) => "invalid request",
            HandlerError::NotReady => "node agent not ready",
            HandlerError::Step { .. } | HandlerError::Reset(_) => {
                "attachment failed and was rolled back"
            }
            HandlerError::Teardown(_) => "teardown incomplete",
            HandlerError::Check(_) => "attachment check failed",
            HandlerError::Attach(_) => "VPC attachment failed",
        };
        CniError::new(code, msg).with_details(Chain(self).to_string())
    }
}

/// What a GC did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Attachments torn down (veth and datapath state).
    pub attachments: usize,
    /// Claims released (with the attachments, and orphans without a veth).
    pub claims: usize,
}

/// An inverse step on the ADD undo stack.
#[derive(Debug, Clone)]
enum Undo {
    Release(Release),
    ReleasePorts {
        vni: u32,
        release: Release,
    },
    Unplumb {
        container_id: String,
        ifname: String,
    },
    Port {
        ifindex: u32,
    },
    Netns {
        cookie: u64,
        ifindex: u32,
    },
    Local {
        net: u32,
        addr: IpAddr,
        ifindex: u32,
    },
    Detach {
        host_ifname: String,
        ifindex: u32,
    },
    Bridge {
        fabric: IpAddr,
        ifindex: u32,
    },
}

/// See the module docs.
pub struct CniHandler<I, P, D> {
    ipam: I,
    plumber: P,
    datapath: D,
    config: HandlerConfig,
    ready: AtomicBool,
    locks: KeyedLocks,
    gc_gate: RwLock<()>,
    metrics: Option<CniMetrics>,
    tenancy: Option<Arc<dyn Tenancy>>,
    policy: Option<Arc<dyn PolicyGate>>,
}

impl<I: Ipam, P: Plumber, D: DatapathWriter> CniHandler<I, P, D> {
    /// A handler; not ready until [`CniHandler::set_ready`].
    pub fn new(ipam: I, plumber: P, datapath: D, config: HandlerConfig) -> Self {
        Self {
            ipam,
            plumber,
            datapath,
            config,
            ready: AtomicBool::new(false),
            locks: KeyedLocks::default(),
            gc_gate: RwLock::new(()),
            metrics: None,
            tenancy: None,
            policy: None,
        }
    }

    /// Answers an ADD only once `gate` says the pod's policy state is in
    /// the datapath (the agent's policy barrier, `runtime::barrier`).
    pub fn with_policy_gate(mut self, gate: Arc<dyn PolicyGate>) -> Self {
        self.policy = Some(gate);
        self
    }

    /// Serves VPC attachments (pods with the `sdn.cozystack.io/vpc`
    /// annotation). Without it every pod joins the default network and the
    /// annotation is not read.
    pub fn with_tenancy(mut self, tenancy: Arc<dyn Tenancy>) -> Self {
        self.tenancy = Some(tenancy);
        self
    }

    /// Records how long each request [`CniHandler::serve_blocking`] serves takes.
    pub fn with_metrics(mut self, metrics: CniMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Marks the agent ready (datapath loaded, overlay up) or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// The IPAM (tests inspect it).
    pub fn ipam(&self) -> &I {
        &self.ipam
    }

    /// Answers one request.
    pub async fn handle(&self, req: &Request) -> Response {
        let outcome = match req {
            Request::Add(a) => self.add(a).await.map(Some),
            Request::Del(d) => self.del(d).await.map(|()| None),
            Request::Check(c) => self.check(c).await.map(|()| None),
            Request::Status(_) => self.status().map(|()| None),
            Request::Gc(g) => self.gc(g).await.map(|_| None),
        };
        respond(req, outcome)
    }

    /// Serves one plugin connection (blocking: call it from a blocking
    /// thread, e.g. `spawn_blocking`, with a handle to the runtime).
    ///
    /// If an ADD succeeded but its result could not be written back, the
    /// ADD is undone, as the protocol requires. The attachment's lock is
    /// held from the ADD until its result is delivered or rolled back, so a
    /// retried ADD (the plugin gave up and the runtime asked again) waits
    /// and is never undone by the first attempt's rollback.
    ///
    /// With [`CniHandler::with_metrics`], each request the handler answered is
    /// timed from accept to delivery (a request that could not be decoded is not).
    pub fn serve_blocking(
        &self,
        rt: &tokio::runtime::Handle,
        stream: &UnixStream,
    ) -> Result<Request, ProtoError> {
        let started = Instant::now();
        let mut held: Option<(AddRequest, AddGuards<'_>)> = None;
        // (command, answered with success) once the handler ran
        let mut answered: Option<(&'static str, bool)> = None;
        let served = serve_connection(stream, |req| {
            let resp = match req {
                Request::Add(a) => {
                    let (outcome, guards) = rt.block_on(self.add_guarded(a));
                    if let (Ok(_), Some(g)) = (&outcome, guards) {
                        held = Some((a.clone(), g));
                    }
                    respond(req, outcome.map(Some))
                }
                other => rt.block_on(self.handle(other)),
            };
            answered = Some((metrics::command(req), matches!(resp, Response::Ok { .. })));
            resp
        });
        // The time the plugin waited; an answer it never got is an error.
        if let (Some(m), Some((op, ok))) = (&self.metrics, answered) {
            m.observe(op, ok && served.is_ok(), started.elapsed());
        }
        if let (Err(e), Some((add, guards))) = (&served, held) {
            let att = &add.attachment;
            tracing::warn!(error = %Chain(e), container = %att.container_id, "ADD result undeliverable; rolling back");
            let uid = att.pod.as_ref().and_then(|p| p.uid.clone());
            let undone =
                rt.block_on(self.del_locked(&att.container_id, &att.ifname, uid, Vec::new()));
            if let Err(e) = undone {
                tracing::error!(error = %Chain(&e), "rollback of an undeliverable ADD failed; GC will finish it");
            }
            drop(guards);
        }
        served
    }

    /// STATUS: can ADD be served?
    pub fn status(&self) -> Result<(), HandlerError> {
        if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(HandlerError::NotReady)
        }
    }

    /// ADD; see the module docs.
    pub async fn add(&self, req: &AddRequest) -> Result<AttachmentResult, HandlerError> {
        self.add_guarded(req).await.0
    }

    /// ADD, returning the gate and attachment lock it ran under (when it got
    /// that far) so the caller can keep them until the result is delivered.
    async fn add_guarded(
        &self,
        req: &AddRequest,
    ) -> (
        Result<AttachmentResult, HandlerError>,
        Option<AddGuards<'_>>,
    ) {
        let att = &req.attachment;
        let prepared = self.status().and_then(|()| {
            let netns = att
                .netns
                .clone()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| HandlerError::Invalid("ADD needs CNI_NETNS".into()))?;
            Ok((netns, self.claimant(att)?))
        });
        let (netns, who) = match prepared {
            Ok(p) => p,
            Err(e) => return (Err(e), None),
        };
        let guards = AddGuards {
            _gate: self.gc_gate.read().await,
            _lock: self
                .locks
                .lock(&attachment_key(&att.container_id, &att.ifname))
                .await,
        };
        let outcome = self.add_locked(req, &who, netns).await;
        (outcome, Some(guards))
    }

    /// ADD with the gate and the attachment lock held.
    async fn add_locked(
        &self,
        req: &AddRequest,
        who: &Claimant,
        netns: String,
    ) -> Result<AttachmentResult, HandlerError> {
        let att = &req.attachment;

        // A partial ADD left by a killed agent: clear its kernel state, keep claims.
        if let Some(old) = self
            .plumber
            .inspect(&att.container_id, &att.ifname)
            .await
            .map_err(|error| step_error(Step::Reset, error))?
        {
            let keys: BTreeSet<(u32, IpAddr)> = old.endpoint().keys().into_iter().collect();
            let failures = self.teardown_kernel(Some(&old), &keys).await;
            if !failures.is_empty() {
                return Err(HandlerError::Reset(failures));
            }
        }

        let mut undo = Vec::new();
        match self.add_steps(att, who, netns, req.mtu, &mut undo).await {
            Ok(result) => Ok(result),
            Err((step, error)) => {
                let undo_failures = self.unwind(undo).await;
                match (step, error) {
                    (Step::Allocate, AddFailure::Ipam(e)) => Err(HandlerError::Ipam(e)),
                    (_, AddFailure::Attach(e)) => Err(HandlerError::Attach(e)),
                    (step, AddFailure::Ipam(e)) => Err(step_error(step, StepError::Ipam(e))),
                    (step, AddFailure::Step(error)) => Err(HandlerError::Step {
                        step,
                        error,
                        undo_failures,
                    }),
                }
            }
        }
    }

    async fn add_steps(
        &self,
        att: &Attachment,
        who: &Claimant,
        netns: String,
        mtu: Option<u32>,
        undo: &mut Vec<Undo>,
    ) -> Result<AttachmentResult, (Step, AddFailure)> {
        let t0 = std::time::Instant::now();
        // The VPC first: a refused pod claims nothing.
        let target = match &self.tenancy {
            Some(t) => t
                .resolve(who)
                .await
                .map_err(|e| (Step::Resolve, AddFailure::Attach(e)))?,
            None => None,
        };
        let t_resolve = t0.elapsed();
        let node_mtu = mtu.unwrap_or(self.config.default_mtu);
        // A VPC's MTU may lower the pod's, never raise it past what the
        // overlay carries on this node.
        let mtu = target
            .as_ref()
            .and_then(|t| t.mtu)
            .map_or(node_mtu, |m| m.min(node_mtu));
        // The claims (an API round trip each, the fabric address and a VPC
        // pod's Port at once) and the veth pair, which needs no address,
        // are made together.
        let pair_spec = PairSpec {
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            netns: netns.clone(),
            mtu,
        };
        let ports = async {
            match (&target, &self.tenancy) {
                (Some(t), Some(tenancy)) => tenancy.allocate(t, who).await.map(Some),
                _ => Ok(None),
            }
        };
        let claims = async { tokio::join!(timed(self.ipam.allocate(who)), ports) };
        let prepare = timed(self.plumber.prepare(&pair_spec));
        let (((leases, t_claim), ports), (pair, t_pair)) = if self.config.serial_add {
            (claims.await, prepare.await)
        } else {
            tokio::join!(claims, prepare)
        };
        let release = |addresses: Vec<IpAddr>| Release {
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            pod_uid: Some(who.uid.clone()),
            addresses,
        };
        // Whatever was made is undone if anything failed.
        if let Ok(leases) = &leases {
            undo.push(Undo::Release(release(
                leases.iter().map(|l| l.address).collect(),
            )));
        }
        if let (Ok(Some(ports)), Some(t)) = (&ports, &target) {
            undo.push(Undo::ReleasePorts {
                vni: t.vni,
                release: release(ports.iter().map(|l| l.address).collect()),
            });
        }
        if pair.is_ok() {
            undo.push(Undo::Unplumb {
                container_id: att.container_id.clone(),
                ifname: att.ifname.clone(),
            });
        }
        let leases = leases.map_err(|e| (Step::Allocate, AddFailure::Ipam(e)))?;
        let ports = ports.map_err(|e| (Step::Allocate, AddFailure::Ipam(e)))?;
        let pair = pair.map_err(|e| (Step::Plumb, AddFailure::Step(e)))?;
        let fabric: Vec<IpAddr> = leases.iter().map(|l| l.address).collect();
        let mut port_claims = Vec::new();
        let (net, addresses) = match (&target, ports) {
            (Some(t), Some(ports)) => {
                port_claims = ports
                    .iter()
                    .map(|l| (l.claim.clone(), l.claim_uid.clone()))
                    .collect();
                (t.vni, ports.iter().map(|l| l.address).collect())
            }
            _ => (NET_DEFAULT, fabric.clone()),
        };

        let t_alloc = t0.elapsed();
        let spec = PlumbSpec {
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            netns: netns.clone(),
            mtu,
            addresses: addresses.clone(),
            net,
            fabric: fabric.clone(),
        };
        let plumbed = self
            .plumber
            .plumb(&spec, pair)
            .await
            .map_err(|e| (Step::Plumb, AddFailure::Step(e)))?;
        let ifindex = plumbed.host_ifindex;
        let t_plumb = t0.elapsed();

        self.datapath
            .put_port(ifindex, net)
            .await
            .map_err(|e| (Step::Port, AddFailure::Step(e)))?;
        undo.push(Undo::Port { ifindex });

        // A VPC pod's sockets are translated against its own network's
        // Services only (never net 0's: its VPC may use the service CIDR),
        // from its first connect on: the pod runs nothing before the ADD
        // returns.
        if net != NET_DEFAULT {
            let cookie = plumbed.netns_cookie.ok_or_else(|| {
                (
                    Step::Netns,
                    AddFailure::Step(StepError::Mismatch(
                        "the plumbing did not report the pod's network namespace cookie".into(),
                    )),
                )
            })?;
            self.datapath
                .put_netns(cookie, net, ifindex)
                .await
                .map_err(|e| (Step::Netns, AddFailure::Step(e)))?;
            undo.push(Undo::Netns { cookie, ifindex });
        }

        for (net, addr) in plumbed.endpoint().keys() {
            self.datapath
                .put_local(net, addr, ifindex, plumbed.pod_mac)
                .await
                .map_err(|e| (Step::Local, AddFailure::Step(e)))?;
            undo.push(Undo::Local { net, addr, ifindex });
        }

        // The dual-address bridge: the node reaches a VPC pod at its fabric
        // address, translated to the VPC address of the same family.
        if net != NET_DEFAULT {
            for (fabric, vpc) in bridge_pairs(&fabric, &addresses) {
                self.plumber
                    .plumb_bridge(ifindex, fabric, plumbed.pod_mac)
                    .await
                    .map_err(|e| (Step::Bridge, AddFailure::Step(e)))?;
                self.datapath
                    .put_bridge(fabric, net, vpc, ifindex)
                    .await
                    .map_err(|e| (Step::Bridge, AddFailure::Step(e)))?;
                undo.push(Undo::Bridge { fabric, ifindex });
            }
        }

        let t_maps = t0.elapsed();
        self.datapath
            .attach(&plumbed.host_ifname, ifindex)
            .await
            .map_err(|e| (Step::Attach, AddFailure::Step(e)))?;
        // Where an ADD's time goes (cumulative, microseconds).
        tracing::debug!(
            resolve = t_resolve.as_micros() as u64,
            allocate = t_alloc.as_micros() as u64,
            claim_alone = t_claim.as_micros() as u64,
            pair_alone = t_pair.as_micros() as u64,
            plumb = t_plumb.as_micros() as u64,
            maps = t_maps.as_micros() as u64,
            attach = t0.elapsed().as_micros() as u64,
            "ADD step timings"
        );
        undo.push(Undo::Detach {
            host_ifname: plumbed.host_ifname.clone(),
            ifindex,
        });

        // The pod runs nothing before the ADD answers: answer once the
        // datapath holds its policy (runtime/barrier.rs).
        if let Some(gate) = &self.policy {
            let claims = BarrierClaims {
                namespace: who.namespace.clone(),
                pod: (who.name.clone(), who.uid.clone()),
                vpc_namespace: target.as_ref().map(|t| t.namespace.clone()),
                fabric_ips: leases
                    .iter()
                    .map(|l| (l.claim.clone(), l.claim_uid.clone()))
                    .collect(),
                ports: port_claims,
            };
            let waited = gate
                .wait(&claims)
                .await
                .map_err(|reason| (Step::Policy, AddFailure::Step(StepError::Mismatch(reason))))?;
            tracing::debug!(
                waited,
                policy = t0.elapsed().as_micros() as u64,
                "ADD policy barrier"
            );
        }

        // The tenant's self-discovery annotations: a cache, so a failure to
        // write them does not fail the ADD (the Port is the record).
        if let (Some(_), Some(tenancy)) = (&target, &self.tenancy) {
            let mac = format_mac(plumbed.pod_mac);
            if let Err(e) = tenancy.annotate(who, &addresses, &mac).await {
                tracing::warn!(pod = %who.name, namespace = %who.namespace, error = %Chain(&e), "cannot annotate the pod with its VPC address");
            }
        }

        Ok(build_result(att, &plumbed, &fabric, netns, mtu))
    }

    /// Runs the undo stack newest first; returns the failures.
    async fn unwind(&self, undo: Vec<Undo>) -> Failures {
        let mut failures = Failures::default();
        for step in undo.into_iter().rev() {
            let outcome = match &step {
                Undo::Detach {
                    host_ifname,
                    ifindex,
                } => self.datapath.detach(host_ifname, *ifindex).await,
                Undo::Bridge { fabric, ifindex } => {
                    self.datapath.delete_bridge(*fabric, Some(*ifindex)).await
                }
                Undo::Local { net, addr, ifindex } => {
                    self.datapath
                        .delete_local(*net, *addr, Some(*ifindex))
                        .await
                }
                Undo::Port { ifindex } => self.datapath.delete_port(*ifindex).await,
                Undo::Netns { cookie, ifindex } => {
                    self.datapath.delete_netns(*cookie, Some(*ifindex)).await
                }
                Undo::Unplumb {
                    container_id,
                    ifname,
                } => self.plumber.unplumb(container_id, ifname).await.map(|_| ()),
                Undo::Release(r) => self
                    .ipam
                    .release(r)
                    .await
                    .map(|_| ())
                    .map_err(StepError::Ipam),
                Undo::ReleasePorts { vni, release } => match &self.tenancy {
                    Some(t) => t
                        .release(*vni, release)
                        .await
                        .map(|_| ())
                        .map_err(StepError::Ipam),
                    None => Ok(()),
                },
            };
            if let Err(e) = outcome {
                failures.push(Failure::new(format!("{step:?}"), e));
            }
        }
        failures
    }

    /// DEL; see the module docs.
    pub async fn del(&self, req: &DelRequest) -> Result<(), HandlerError> {
        let att = &req.attachment;
        let _gate = self.gc_gate.read().await;
        let _lock = self
            .locks
            .lock(&attachment_key(&att.container_id, &att.ifname))
            .await;
        let prev: Vec<IpAddr> = req
            .prev_result
            .iter()
            .flat_map(|r| r.ips.iter().map(|ip| ip.address.addr()))
            .collect();
        let pod_uid = att.pod.as_ref().and_then(|p| p.uid.clone());
        self.del_locked(&att.container_id, &att.ifname, pod_uid, prev)
            .await
            .map(|_| ())
            .map_err(HandlerError::from)
    }

    /// DEL with the locks held; returns how many claims were released.
    async fn del_locked(
        &self,
        container_id: &str,
        ifname: &str,
        pod_uid: Option<String>,
        hints: Vec<IpAddr>,
    ) -> Result<usize, DelError> {
        let t0 = std::time::Instant::now();
        let plumbed = self
            .plumber
            .inspect(container_id, ifname)
            .await
            .map_err(|e| DelError::Teardown(Failures(vec![Failure::new("inspect", e)])))?;
        let t_inspect = t0.elapsed();
        let net = plumbed.as_ref().map_or(NET_DEFAULT, |p| p.net);
        let mut release = Release {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
            pod_uid,
            addresses: hints,
        };
        // The VPC Ports: found by the pod UID, or by the recorded VPC
        // addresses (their claim names need the VNI, which the record has).
        let mut ports = Release {
            addresses: Vec::new(),
            ..release.clone()
        };
        if let Some(p) = &plumbed {
            release.addresses.extend(&p.fabric);
            if p.net != NET_DEFAULT {
                ports.addresses.extend(&p.addresses);
            }
        }
        // The attachment's claims, read live: they are deleted once the
        // kernel objects are gone, so an address is never reused early.
        let claims = async {
            let fabric = self.ipam.held(&release).await?;
            let ports = match &self.tenancy {
                Some(t) => t.held(net, &ports).await?,
                None => Vec::new(),
            };
            Ok::<_, IpamError>((fabric, ports))
        };
        // The entries to clear. A veth with its record names them all: an
        // ADD writes `locals` entries for the recorded addresses only, and
        // each is cleared only if it still points at this veth; the claims
        // are read meanwhile. Without one (the veth is gone, or was never
        // recorded), only addresses whose claims are still this
        // attachment's are ours to clear.
        let (failures, claims) = match plumbed.as_ref().filter(|p| !p.addresses.is_empty()) {
            Some(p) => {
                let mut keys: BTreeSet<(u32, IpAddr)> = BTreeSet::new();
                // a severed pod's own entries included: severing removed
                // them, unless it was cut short
                keys.extend(p.addresses.iter().map(|a| (p.net, *a)));
                if p.net != NET_DEFAULT {
                    keys.extend(p.fabric.iter().map(|a| (NET_DEFAULT, *a)));
                }
                tokio::join!(self.teardown_kernel(plumbed.as_ref(), &keys), claims)
            }
            None => {
                let claims = claims.await?;
                let mut keys: BTreeSet<(u32, IpAddr)> = claims
                    .0
                    .iter()
                    .chain(&claims.1)
                    .map(|h| (h.net, h.address))
                    .collect();
                if let Some(p) = &plumbed {
                    keys.extend(p.endpoint().keys());
                }
                let failures = self.teardown_kernel(plumbed.as_ref(), &keys).await;
                (failures, Ok(claims))
            }
        };
        let t_kernel = t0.elapsed();
        if !failures.is_empty() {
            return Err(DelError::Teardown(failures));
        }
        let (fabric, ports) = claims?;
        let mut released = self.ipam.release_held(&fabric).await?;
        if let Some(t) = &self.tenancy {
            released += t.release_held(&ports).await?;
        }
        // Where a DEL's time goes (cumulative, microseconds).
        tracing::debug!(
            inspect = t_inspect.as_micros() as u64,
            kernel_and_claims = t_kernel.as_micros() as u64,
            release = t0.elapsed().as_micros() as u64,
            "DEL step timings"
        );
        Ok(released)
    }

    /// Removes programs, `locals`, `ports` and the veth; best effort, every
    /// step is attempted, the failures are returned.
    async fn teardown_kernel(
        &self,
        plumbed: Option<&Plumbed>,
        keys: &BTreeSet<(u32, IpAddr)>,
    ) -> Failures {
        let mut failures = Failures::default();
        let ifindex = plumbed.map(|p| p.host_ifindex);
        if let Some(p) = plumbed {
            if let Err(e) = self.datapath.detach(&p.host_ifname, p.host_ifindex).await {
                failures.push(Failure::new(format!("detach {}", p.host_ifname), e));
            }
        }
        for (net, addr) in keys {
            if let Err(e) = self.datapath.delete_local(*net, *addr, ifindex).await {
                failures.push(Failure::new(format!("delete local net {net} {addr}"), e));
            }
            // a VPC pod's fabric address may be bridged (none on a net-0 pod)
            if *net == NET_DEFAULT {
                if let Err(e) = self.datapath.delete_bridge(*addr, ifindex).await {
                    failures.push(Failure::new(format!("delete bridge {addr}"), e));
                }
            }
        }
        if let Some(p) = plumbed {
            if let Some(cookie) = p.netns_cookie {
                if let Err(e) = self.datapath.delete_netns(cookie, ifindex).await {
                    failures.push(Failure::new(format!("delete netns {cookie}"), e));
                }
            }
            if let Err(e) = self.datapath.delete_port(p.host_ifindex).await {
                failures.push(Failure::new(format!("delete port {}", p.host_ifindex), e));
            }
            if let Err(e) = self.plumber.unplumb(&p.container_id, &p.ifname).await {
                failures.push(Failure::new(format!("delete veth {}", p.host_ifname), e));
            }
        }
        failures
    }

    /// CHECK: the veth, its addresses, their claims and the datapath entries
    /// are all as ADD left them.
    pub async fn check(&self, req: &CheckRequest) -> Result<(), HandlerError> {
        self.status()?;
        let att = &req.attachment;
        let who = self.claimant(att)?;
        let _gate = self.gc_gate.read().await;
        let _lock = self
            .locks
            .lock(&attachment_key(&att.container_id, &att.ifname))
            .await;
        let plumbed = self
            .plumber
            .inspect(&att.container_id, &att.ifname)
            .await
            .map_err(HandlerError::Check)?
            .ok_or_else(|| {
                HandlerError::Check(StepError::Mismatch(
                    "the attachment's veth does not exist".into(),
                ))
            })?;
        // The result reports the fabric (net-0) addresses: a VPC pod's
        // interface holds its VPC addresses instead.
        let mut want: Vec<IpAddr> = req
            .prev_result
            .ips
            .iter()
            .map(|i| i.address.addr())
            .collect();
        let mut have = plumbed.fabric.clone();
        want.sort();
        have.sort();
        if want != have {
            return Err(HandlerError::Check(StepError::Mismatch(format!(
                "the attachment holds {have:?}, the ADD result says {want:?}"
            ))));
        }
        self.ipam
            .verify(&who, &have)
            .await
            .map_err(|e| HandlerError::Check(StepError::Ipam(e)))?;
        if plumbed.net != NET_DEFAULT {
            let tenancy = self.tenancy.as_ref().ok_or_else(|| {
                HandlerError::Check(StepError::Mismatch(format!(
                    "the attachment is on VPC network {} but this agent serves no VPCs",
                    plumbed.net
                )))
            })?;
            tenancy
                .verify(plumbed.net, &who, &plumbed.addresses)
                .await
                .map_err(|e| HandlerError::Check(StepError::Ipam(e)))?;
        }
        self.datapath
            .check(&plumbed.endpoint())
            .await
            .map_err(HandlerError::Check)
    }

    /// GC: tears down every attachment (and releases every claim of this
    /// node) not in the runtime's valid list.
    pub async fn gc(&self, req: &GcRequest) -> Result<GcReport, HandlerError> {
        let _gate = self.gc_gate.write().await;
        let keep: BTreeSet<String> = req
            .valid_attachments
            .iter()
            .map(|v| attachment_key(&v.container_id, &v.ifname))
            .collect();
        let mut report = GcReport::default();
        let mut failures = Failures::default();
        let plumbed = self.plumber.list().await.map_err(|e| {
            HandlerError::Teardown(Failures(vec![Failure::new("list attachments", e)]))
        })?;
        let stale: BTreeMap<String, Plumbed> = plumbed
            .into_iter()
            .map(|p| (attachment_key(&p.container_id, &p.ifname), p))
            .filter(|(k, _)| !keep.contains(k))
            .collect();
        for (key, p) in stale {
            match self
                .del_locked(&p.container_id, &p.ifname, None, p.fabric.clone())
                .await
            {
                Ok(n) => {
                    report.attachments += 1;
                    report.claims += n;
                }
                Err(DelError::Teardown(f)) => failures.extend_in(&key, f),
                Err(DelError::Ipam(e)) => failures.push(Failure::new(key, e)),
            }
        }
        // Veths of ADDs killed before they wrote their record (the runtime
        // abandoned them; no ADD runs beside GC).
        match self.plumber.remove_unrecorded().await {
            Ok(n) => report.attachments += n,
            Err(e) => failures.push(Failure::new("remove unrecorded veths", e)),
        }
        if failures.is_empty() {
            // Claims of attachments that never got a veth (an agent killed
            // between claim and plumb, then the sandbox abandoned).
            report.claims += self.ipam.gc(&self.config.node, &keep).await?;
            if let Some(t) = &self.tenancy {
                report.claims += t.gc(&self.config.node, &keep).await?;
            }
            Ok(report)
        } else {
            Err(HandlerError::Teardown(failures))
        }
    }

    fn claimant(&self, att: &Attachment) -> Result<Claimant, HandlerError> {
        let pod = att.pod.as_ref().ok_or_else(|| {
            HandlerError::Invalid(
                "CNI_ARGS must name the pod (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID)".into(),
            )
        })?;
        Ok(Claimant {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone().unwrap_or_default(),
            container_id: att.container_id.clone(),
            ifname: att.ifname.clone(),
            node: self.config.node.clone(),
        })
    }
}

/// The guards an ADD runs under: the GC gate (read) and the attachment lock.
struct AddGuards<'a> {
    _gate: RwLockReadGuard<'a, ()>,
    _lock: OwnedMutexGuard<()>,
}

/// Each fabric address with the VPC address of its family (a family the
/// VPC lacks is not bridged).
pub fn bridge_pairs(fabric: &[IpAddr], vpc: &[IpAddr]) -> Vec<(IpAddr, IpAddr)> {
    fabric
        .iter()
        .filter_map(|f| {
            vpc.iter()
                .find(|v| v.is_ipv4() == f.is_ipv4())
                .map(|v| (*f, *v))
        })
        .collect()
}

/// Turns an operation's outcome into the protocol response.
fn respond(req: &Request, outcome: Result<Option<AttachmentResult>, HandlerError>) -> Response {
    match outcome {
        Ok(result) => Response::Ok { result },
        Err(e) => {
            tracing::warn!(op = req.op(), error = %Chain(&e), "CNI request failed");
            let mut error = e.to_cni_error();
            if let (Request::Status(_), HandlerError::NotReady) = (req, &e) {
                error.code = code::NOT_AVAILABLE;
            }
            Response::Error { error }
        }
    }
}

/// Why an ADD step failed, before it is turned into a [`HandlerError`].
enum AddFailure {
    Ipam(IpamError),
    Attach(AttachError),
    Step(StepError),
}

/// Runs `f`, returning its output and how long it took.
async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, std::time::Duration) {
    let t = std::time::Instant::now();
    let out = f.await;
    (out, t.elapsed())
}

fn step_error(step: Step, error: StepError) -> HandlerError {
    HandlerError::Step {
        step,
        error,
        undo_failures: Failures::default(),
    }
}

fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The ADD result: the host veth (index 0), the pod interface (index 1)
/// with its addresses, and a default route per family via the gateway.
fn build_result(
    att: &Attachment,
    plumbed: &Plumbed,
    addresses: &[IpAddr],
    netns: String,
    mtu: u32,
) -> AttachmentResult {
    let interfaces = vec![
        Interface {
            name: plumbed.host_ifname.clone(),
            ..Interface::default()
        },
        Interface {
            name: att.ifname.clone(),
            mac: Some(format_mac(plumbed.pod_mac)),
            mtu: Some(mtu),
            sandbox: Some(netns),
            ..Interface::default()
        },
    ];
    let mut ips = Vec::new();
    let mut routes = Vec::new();
    for addr in addresses {
        // The address as a host prefix (/32, /128) and the family's default route.
        let (gw, default) = match addr {
            IpAddr::V4(_) => (IpAddr::V4(GATEWAY_V4), IpNet::V4(Ipv4Net::default())),
            IpAddr::V6(_) => (IpAddr::V6(GATEWAY_V6), IpNet::V6(Ipv6Net::default())),
        };
        ips.push(IpConfig {
            address: IpNet::from(*addr),
            gateway: Some(gw),
            interface: Some(1),
        });
        routes.push(Route::new(default, Some(gw)));
    }
    AttachmentResult {
        interfaces,
        ips,
        routes,
        ..AttachmentResult::default()
    }
}

#[cfg(test)]
mod tests;
