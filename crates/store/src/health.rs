//! The write-health flag of a backend, behind [`crate::Storage::ready`].
//!
//! A backend raises it when a write (or its fsync) fails for a reason of
//! the storage rather than of the request — a full disk, an I/O error,
//! etcd's NOSPACE alarm, etcd unreachable — and lowers it on the next write
//! that succeeds or on a successful probe. Readiness reads the flag and
//! never writes, so `/readyz` stays cheap however often it is asked; probes
//! run at most once per [`PROBE_INTERVAL`] while the flag is up.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a faulted backend probes whether it can write again.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Why a backend refuses writes: the storage fault it saw last.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{backend}: writes are failing ({cause}); retrying every {}s", PROBE_INTERVAL.as_secs())]
pub struct Fault {
    /// `embedded store` or `etcd`.
    pub backend: &'static str,
    /// The storage error, with its causes.
    pub cause: String,
}

#[derive(Debug, Default)]
struct State {
    fault: Option<Fault>,
    /// While faulted: the earliest time of the next probe.
    next_probe: Option<Instant>,
}

/// A backend's write-health flag (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Health {
    state: Mutex<State>,
}

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two plain fields, valid whatever a panicking holder did.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current fault, if any.
    pub fn fault(&self) -> Option<Fault> {
        self.state().fault.clone()
    }

    /// Raise (or update) the flag after a failed write.
    pub fn failed(&self, backend: &'static str, cause: String) {
        let mut s = self.state();
        if s.fault.is_none() {
            tracing::error!(backend, cause = %cause, "storage refuses writes: not ready until a write succeeds again");
            s.next_probe = Some(Instant::now() + PROBE_INTERVAL);
        }
        s.fault = Some(Fault { backend, cause });
    }

    /// Lower the flag after a write or probe succeeded.
    pub fn recovered(&self) {
        let mut s = self.state();
        if let Some(f) = s.fault.take() {
            tracing::warn!(backend = f.backend, "storage accepts writes again: ready");
        }
        s.next_probe = None;
    }

    /// While faulted, `true` at most once per [`PROBE_INTERVAL`] (the caller
    /// then probes and reports with [`Health::failed`] or [`Health::recovered`]).
    pub fn probe_due(&self) -> bool {
        let mut s = self.state();
        let now = Instant::now();
        match s.next_probe {
            Some(t) if s.fault.is_some() && now >= t => {
                s.next_probe = Some(now + PROBE_INTERVAL);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_holds_until_recovered_and_probes_are_spaced() {
        let h = Health::default();
        assert!(h.fault().is_none());
        assert!(!h.probe_due(), "no probe while healthy");
        h.failed("etcd", "database space exceeded".into());
        let f = h.fault().map(|f| f.to_string());
        assert_eq!(
            f.as_deref(),
            Some("etcd: writes are failing (database space exceeded); retrying every 1s")
        );
        assert!(!h.probe_due(), "the first probe waits one interval");
        h.recovered();
        assert!(h.fault().is_none());
        assert!(!h.probe_due());
    }
}
