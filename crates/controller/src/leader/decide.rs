//! The pure leader-election state machine: given the Lease as last read and
//! how long it has gone unchanged, what should this candidate do?
//!
//! # Why "unchanged for", not `renewTime`
//! Expiry is judged by how long *this* process has seen the Lease record
//! unchanged, on its own monotonic clock, never by comparing the holder's
//! `renewTime` with the local wall clock: a follower whose clock runs ahead
//! would otherwise take over from a live leader. This is the rule client-go
//! uses as well; it costs one full lease duration of observation before a
//! takeover from a crashed holder.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// What the candidate should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// No Lease exists: create it, holding it.
    Create,
    /// We hold the Lease: renew it (bump `renewTime`).
    Renew,
    /// The Lease is free (released) or its holder let it expire: take it.
    TakeOver,
    /// Somebody else holds a live Lease: stay (or become) a follower.
    Follow {
        /// The current holder.
        holder: String,
        /// How long until the Lease expires unless it is renewed.
        expires_in: Duration,
    },
}

/// The holder a Lease names, if any (an empty string counts as none: that is
/// how client-go releases a Lease).
pub fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The duration the Lease declares, or `default` when it declares none (or
/// nonsense).
pub fn declared_duration(spec: &LeaseSpec, default: Duration) -> Duration {
    match spec.lease_duration_seconds {
        Some(s) if s > 0 => Duration::from_secs(u64::from(s.unsigned_abs())),
        _ => default,
    }
}

/// Decides the next step. `lease` is the Lease's spec as just read (`None`:
/// no Lease object), `unchanged_for` how long this process has seen that
/// exact spec, `me` our identity.
pub fn decide(
    lease: Option<&LeaseSpec>,
    unchanged_for: Duration,
    me: &str,
    default_duration: Duration,
) -> Action {
    let Some(spec) = lease else {
        return Action::Create;
    };
    match holder(spec) {
        None => Action::TakeOver,
        Some(h) if h == me => Action::Renew,
        Some(h) => {
            let duration = declared_duration(spec, default_duration);
            if unchanged_for >= duration {
                Action::TakeOver
            } else {
                Action::Follow {
                    holder: h.to_string(),
                    expires_in: duration - unchanged_for,
                }
            }
        }
    }
}

/// The spec to write when we create, renew or take over the Lease.
/// `acquireTime` is kept on a renewal and set on a change of holder;
/// `leaseTransitions` counts changes of holder (a fresh Lease starts at 0).
pub fn held_spec(
    old: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    duration: Duration,
) -> LeaseSpec {
    let seconds = i32::try_from(duration.as_secs()).unwrap_or(i32::MAX).max(1);
    let (acquire_time, transitions) = match old {
        None => (MicroTime(now), 0),
        Some(old) if holder(old) == Some(me) => (
            old.acquire_time.clone().unwrap_or(MicroTime(now)),
            old.lease_transitions.unwrap_or(0),
        ),
        Some(old) => (
            MicroTime(now),
            old.lease_transitions.unwrap_or(0).saturating_add(1),
        ),
    };
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(seconds),
        acquire_time: Some(acquire_time),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..old.cloned().unwrap_or_default()
    }
}

/// The spec to write when we release the Lease on shutdown: no holder, and a
/// one-second duration so electors that do not treat an empty holder as free
/// (they judge expiry alone) also move on quickly.
pub fn released_spec(old: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..old.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn spec(holder: Option<&str>, secs: Option<i32>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: secs,
            lease_transitions: Some(transitions),
            acquire_time: Some(MicroTime(t(0))),
            renew_time: Some(MicroTime(t(5))),
            ..LeaseSpec::default()
        }
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("timestamp")
    }

    #[test]
    fn no_lease_is_created() {
        assert_eq!(decide(None, Duration::ZERO, "me", D), Action::Create);
    }

    #[test]
    fn our_lease_is_renewed_even_when_stale() {
        let s = spec(Some("me"), Some(15), 3);
        assert_eq!(decide(Some(&s), Duration::ZERO, "me", D), Action::Renew);
        assert_eq!(decide(Some(&s), D * 10, "me", D), Action::Renew);
    }

    #[test]
    fn released_lease_is_taken_at_once() {
        for h in [None, Some("")] {
            let s = spec(h, Some(15), 3);
            assert_eq!(decide(Some(&s), Duration::ZERO, "me", D), Action::TakeOver);
        }
    }

    #[test]
    fn a_live_holder_is_followed_until_its_lease_expires() {
        let s = spec(Some("other"), Some(15), 3);
        assert_eq!(
            decide(Some(&s), Duration::from_secs(4), "me", D),
            Action::Follow {
                holder: "other".into(),
                expires_in: Duration::from_secs(11)
            }
        );
        assert_eq!(
            decide(Some(&s), Duration::from_millis(14_999), "me", D),
            Action::Follow {
                holder: "other".into(),
                expires_in: Duration::from_millis(1)
            }
        );
        assert_eq!(decide(Some(&s), D, "me", D), Action::TakeOver);
    }

    #[test]
    fn the_lease_declared_duration_wins_over_ours() {
        let short = spec(Some("other"), Some(2), 0);
        assert_eq!(
            decide(Some(&short), Duration::from_secs(2), "me", D),
            Action::TakeOver
        );
        let bogus = spec(Some("other"), Some(0), 0);
        assert_eq!(declared_duration(&bogus, D), D);
        assert_eq!(declared_duration(&spec(None, None, 0), D), D);
    }

    #[test]
    fn held_spec_counts_transitions_and_keeps_acquire_time_on_renewal() {
        let fresh = held_spec(None, "me", t(100), D);
        assert_eq!(fresh.holder_identity.as_deref(), Some("me"));
        assert_eq!(fresh.lease_transitions, Some(0));
        assert_eq!(fresh.lease_duration_seconds, Some(15));
        assert_eq!(fresh.acquire_time, Some(MicroTime(t(100))));
        assert_eq!(fresh.renew_time, Some(MicroTime(t(100))));

        let renewed = held_spec(Some(&spec(Some("me"), Some(15), 4)), "me", t(200), D);
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(t(0))));
        assert_eq!(renewed.renew_time, Some(MicroTime(t(200))));

        let taken = held_spec(Some(&spec(Some("other"), Some(15), 4)), "me", t(300), D);
        assert_eq!(taken.lease_transitions, Some(5));
        assert_eq!(taken.acquire_time, Some(MicroTime(t(300))));

        let after_release = held_spec(Some(&spec(None, Some(1), 5)), "me", t(400), D);
        assert_eq!(after_release.lease_transitions, Some(6));
        assert_eq!(after_release.lease_duration_seconds, Some(15));
    }

    #[test]
    fn released_spec_frees_the_lease() {
        let r = released_spec(&spec(Some("me"), Some(15), 2), t(9));
        assert_eq!(holder(&r), None);
        assert_eq!(r.lease_duration_seconds, Some(1));
        assert_eq!(r.lease_transitions, Some(2));
        assert_eq!(
            decide(Some(&r), Duration::ZERO, "other", D),
            Action::TakeOver
        );
    }
}
