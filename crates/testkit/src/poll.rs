//! Waiting for a condition with a deadline, instead of a sleep that hopes it
//! was long enough.
//!
//! The interval starts at 10 ms and doubles up to 50 ms: quick for what is
//! nearly true already, cheap for what takes seconds. The condition is
//! checked once more at the deadline.

use std::fmt::Display;
use std::time::{Duration, Instant};

const FIRST_INTERVAL: Duration = Duration::from_millis(10);
const MAX_INTERVAL: Duration = Duration::from_millis(50);

/// A condition that did not hold before its deadline.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}{}", last.as_ref().map(|l| format!(" (last: {l})")).unwrap_or_default())]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    pub timeout: Duration,
    /// What the last check saw, when it said.
    pub last: Option<String>,
}

/// Calls `check` until it answers `Ok` or `timeout` has passed; `Err(e)` means
/// "not yet", and the last `e` goes into the [`TimedOut`]. Blocking: in an
/// async test use `poll_async`.
pub fn poll<T, E: Display>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, E>,
) -> Result<T, TimedOut> {
    let start = Instant::now();
    let mut interval = FIRST_INTERVAL;
    loop {
        let last = match check() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(timed_out(what, timeout, &last));
        }
        std::thread::sleep(interval.min(left));
        interval = (interval * 2).min(MAX_INTERVAL);
    }
}

/// Waits until `cond` holds; panics naming `what` after `timeout`.
pub fn eventually(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    if let Err(e) = poll(what, timeout, || if cond() { Ok(()) } else { Err(NotYet) }) {
        panic!("{e}");
    }
}

/// [`poll`] with an async check; sleeps on the tokio timer.
#[cfg(feature = "tokio")]
pub async fn poll_async<T, E, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, TimedOut>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    // tokio's clock, so a test with paused time waits in virtual time
    let start = tokio::time::Instant::now();
    let mut interval = FIRST_INTERVAL;
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(timed_out(what, timeout, &last));
        }
        tokio::time::sleep(interval.min(left)).await;
        interval = (interval * 2).min(MAX_INTERVAL);
    }
}

/// [`eventually`] with an async condition.
#[cfg(feature = "tokio")]
pub async fn eventually_async<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let checked = poll_async(what, timeout, || {
        let fut = cond();
        async move {
            if fut.await {
                Ok(())
            } else {
                Err(NotYet)
            }
        }
    })
    .await;
    if let Err(e) = checked {
        panic!("{e}");
    }
}

/// The "not yet" of a plain boolean condition (nothing more to say).
struct NotYet;

impl Display for NotYet {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

fn timed_out(what: &str, timeout: Duration, last: &dyn Display) -> TimedOut {
    let last = last.to_string();
    TimedOut {
        what: what.to_string(),
        timeout,
        last: (!last.is_empty()).then_some(last),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_the_check_passes() {
        let mut calls = 0;
        let v = poll("third call", Duration::from_secs(10), || {
            calls += 1;
            if calls == 3 {
                Ok(calls)
            } else {
                Err(format!("call {calls}"))
            }
        })
        .unwrap();
        assert_eq!(v, 3);
    }

    #[test]
    fn times_out_naming_what_and_the_last_observation() {
        let mut calls = 0;
        let err = poll("the answer", Duration::from_millis(50), || {
            calls += 1;
            Err::<(), _>(format!("saw {calls}"))
        })
        .unwrap_err();
        assert!(calls >= 2, "polled more than once: {calls}");
        let msg = err.to_string();
        assert!(
            msg.starts_with("timed out after 50ms waiting for the answer (last: saw "),
            "{msg}"
        );
    }

    #[test]
    #[should_panic(expected = "timed out after 20ms waiting for never")]
    fn eventually_panics_with_what_it_waited_for() {
        eventually("never", Duration::from_millis(20), || false);
    }

    #[tokio::test]
    async fn the_async_variants_poll_async_conditions() {
        let mut calls = 0u32;
        eventually_async("second call", Duration::from_secs(10), || {
            calls += 1;
            let done = calls == 2;
            async move { done }
        })
        .await;
        assert_eq!(calls, 2);
        let err = poll_async("never", Duration::from_millis(20), || async {
            Err::<(), _>("no")
        })
        .await
        .unwrap_err();
        assert_eq!(err.last.as_deref(), Some("no"));
    }
}
