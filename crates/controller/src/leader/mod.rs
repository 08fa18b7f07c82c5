//! Leader election on a `coordination.k8s.io/v1` Lease, so two controller
//! replicas never both collect garbage.
//!
//! # Protocol
//! Every `renew_interval` the elector reads the Lease and runs
//! [`decide::decide`]. Writes are optimistic: a renewal or takeover is a
//! `PUT` carrying the `resourceVersion` just read, so of two candidates
//! racing for an expired Lease exactly one wins and the other gets 409.
//!
//! # When we stop acting
//! - a renewal fails (conflict, error, or no answer within `renew_interval`),
//!   or the read shows another holder: step down at once;
//! - independently of the elector task, leadership carries a deadline
//!   `attempt start + lease_duration - renew_interval`. A follower takes over
//!   only after seeing the Lease unchanged for a full `lease_duration`,
//!   which starts after our last successful write began, so the deadline
//!   keeps a margin of one `renew_interval` against the follower, even when
//!   the elector task itself is stuck.
//!
//! On shutdown a leader releases the Lease (clears the holder) so a standby
//! takes over without waiting for expiry.

pub mod decide;

use std::time::Duration;

use cozyplane_errors::Chain;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;

use decide::{decide, held_spec, released_spec, Action};

/// Election timing and identity.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This candidate's identity (`holderIdentity`).
    pub identity: String,
    /// How long a Lease lives without renewal (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// How often the Lease is read and renewed; also the request timeout.
    pub renew_interval: Duration,
}

/// Why an election configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectionConfigError {
    /// The timing leaves no safety margin.
    #[error("lease duration {lease:?} must be at least 3 × the renew interval {renew:?} (and whole seconds ≥ 1)")]
    Timing {
        /// The lease duration.
        lease: Duration,
        /// The renew interval.
        renew: Duration,
    },
    /// An empty name, namespace or identity.
    #[error("the lease {0} must not be empty")]
    Empty(&'static str),
}

impl ElectionConfig {
    /// The defaults of the prior system: a 15 s Lease renewed every 5 s.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
        }
    }

    /// Checks the invariants the safety argument in the module docs needs:
    /// a renewal started one interval after the last one finishes within
    /// the leadership deadline (`2 × renew ≤ lease - renew`).
    pub fn validate(&self) -> Result<(), ElectionConfigError> {
        if self.namespace.is_empty() {
            return Err(ElectionConfigError::Empty("namespace"));
        }
        if self.name.is_empty() {
            return Err(ElectionConfigError::Empty("name"));
        }
        if self.identity.is_empty() {
            return Err(ElectionConfigError::Empty("holder identity"));
        }
        let whole = self.lease_duration.subsec_nanos() == 0 && self.lease_duration.as_secs() >= 1;
        if !whole || self.renew_interval.is_zero() || self.renew_interval * 3 > self.lease_duration
        {
            return Err(ElectionConfigError::Timing {
                lease: self.lease_duration,
                renew: self.renew_interval,
            });
        }
        Ok(())
    }
}

/// The shared leadership state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not leading.
    Follower,
    /// Leading until this instant unless renewed.
    LeaderUntil(Instant),
    /// Leader election is off: always leading.
    Unconditional,
}

/// A read-only view of whether this process may act as the leader.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<State>,
}

impl Leadership {
    /// A view that always leads (`--leader-elect=false`).
    pub fn unconditional() -> Self {
        let (tx, rx) = watch::channel(State::Unconditional);
        // The receiver keeps the last value readable after the sender is
        // gone; `changed()` then returns an error, which callers treat as
        // "nothing will change".
        drop(tx);
        Self { rx }
    }

    /// May this process act as the leader right now?
    pub fn is_leader(&self) -> bool {
        match *self.rx.borrow() {
            State::Follower => false,
            State::LeaderUntil(deadline) => Instant::now() < deadline,
            State::Unconditional => true,
        }
    }

    /// Waits until the leadership state changes (returns at once, forever,
    /// once the elector is gone, so callers must not loop on it alone).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Why one election round failed.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("lease request failed")]
    Kube(#[from] kube::Error),
    #[error("lease request timed out")]
    Timeout,
}

/// The candidate: owns the Lease API and the leadership sender.
pub struct Elector {
    api: Api<Lease>,
    config: ElectionConfig,
    tx: watch::Sender<State>,
    /// The Lease spec last read and when it was first seen in that form.
    observed: Option<(Option<LeaseSpec>, Instant)>,
    /// The Lease as we last wrote it (for the release on shutdown).
    held: Option<Lease>,
}

impl Elector {
    /// A candidate for the Lease in `config` (validated).
    pub fn new(
        client: Client,
        config: ElectionConfig,
    ) -> Result<(Self, Leadership), ElectionConfigError> {
        config.validate()?;
        let (tx, rx) = watch::channel(State::Follower);
        let api = Api::namespaced(client, &config.namespace);
        Ok((
            Self {
                api,
                config,
                tx,
                observed: None,
                held: None,
            },
            Leadership { rx },
        ))
    }

    /// Runs rounds until `shutdown` becomes true (or its sender is dropped),
    /// then releases the Lease if held.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            if *shutdown.borrow() {
                break;
            }
            let started = Instant::now();
            let round = tokio::time::timeout(self.config.renew_interval, self.round())
                .await
                .unwrap_or(Err(RoundError::Timeout));
            match round {
                Ok(true) => {
                    let deadline =
                        started + (self.config.lease_duration - self.config.renew_interval);
                    if !self.leading() {
                        tracing::info!(identity = %self.config.identity, lease = %self.config.name, "became leader");
                    }
                    self.tx.send_replace(State::LeaderUntil(deadline));
                }
                Ok(false) => self.step_down("another holder has the lease"),
                Err(e) => self.step_down(&Chain(&e).to_string()),
            }
            tokio::select! {
                _ = tokio::time::sleep_until(started + self.config.renew_interval) => {}
                r = shutdown.changed() => if r.is_err() { break },
            }
        }
        self.release().await;
    }

    fn leading(&self) -> bool {
        matches!(*self.tx.borrow(), State::LeaderUntil(_))
    }

    fn step_down(&mut self, why: &str) {
        if self.leading() {
            tracing::warn!(identity = %self.config.identity, reason = why, "stepping down");
        } else {
            tracing::debug!(identity = %self.config.identity, reason = why, "not leader");
        }
        self.held = None;
        self.tx.send_replace(State::Follower);
    }

    /// Records the spec just read; returns how long it has been unchanged.
    fn observe(&mut self, spec: Option<&LeaseSpec>) -> Duration {
        let now = Instant::now();
        match &self.observed {
            Some((seen, since)) if seen.as_ref() == spec => now - *since,
            _ => {
                self.observed = Some((spec.cloned(), now));
                Duration::ZERO
            }
        }
    }

    /// One read-decide-write round; `Ok(true)` when we hold the Lease after it.
    async fn round(&mut self) -> Result<bool, RoundError> {
        let current = self.api.get_opt(&self.config.name).await?;
        // A Lease without a spec is treated as an empty (free) one.
        let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let unchanged_for = self.observe(spec.as_ref());
        let action = decide(
            spec.as_ref(),
            unchanged_for,
            &self.config.identity,
            self.config.lease_duration,
        );
        let now = Timestamp::now();
        let written = match (action, current) {
            (Action::Follow { .. }, _) => return Ok(false),
            (Action::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(held_spec(
                        None,
                        &self.config.identity,
                        now,
                        self.config.lease_duration,
                    )),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(l) => l,
                    Err(kube::Error::Api(s)) if s.is_already_exists() => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
            (Action::Renew | Action::TakeOver, Some(mut lease)) => {
                lease.spec = Some(held_spec(
                    spec.as_ref(),
                    &self.config.identity,
                    now,
                    self.config.lease_duration,
                ));
                // `lease.metadata.resourceVersion` is the one just read: the
                // PUT fails with 409 if anybody wrote in between.
                match self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(l) => l,
                    Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
            // decide() only says Renew/TakeOver for an existing Lease.
            (Action::Renew | Action::TakeOver, None) => return Ok(false),
        };
        let written_spec = written.spec.clone();
        self.observe(written_spec.as_ref());
        self.held = Some(written);
        Ok(true)
    }

    /// Clears the holder if we still hold the Lease (a conflict means
    /// somebody else already moved on: nothing to release).
    async fn release(&mut self) {
        let was_leading = self.leading();
        self.tx.send_replace(State::Follower);
        let Some(mut lease) = self.held.take() else {
            return;
        };
        if !was_leading {
            return;
        }
        let Some(spec) = lease.spec.as_ref() else {
            return;
        };
        lease.spec = Some(released_spec(spec, Timestamp::now()));
        let pp = PostParams::default();
        let put = self.api.replace(&self.config.name, &pp, &lease);
        match tokio::time::timeout(self.config.renew_interval, put).await {
            Ok(Ok(_)) => tracing::info!(identity = %self.config.identity, "released the lease"),
            Ok(Err(e)) => {
                tracing::warn!(error = %Chain(&e), "releasing the lease failed; it will expire")
            }
            Err(_) => tracing::warn!("releasing the lease timed out; it will expire"),
        }
    }
}
