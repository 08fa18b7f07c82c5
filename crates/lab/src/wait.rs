//! Polling for a condition with a deadline, for tests and `lab up`.
//!
//! The poll interval starts at 10 ms and doubles up to 200 ms: fast for conditions
//! that are nearly true already (a route appearing), cheap for slow ones (an agent
//! becoming ready).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::{LabError, Result};

const FIRST_INTERVAL: Duration = Duration::from_millis(10);
const MAX_INTERVAL: Duration = Duration::from_millis(200);

/// Calls `cond` until it returns true or `timeout` has passed; returns how long it
/// took. `what` names the condition in the timeout error. Blocking.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<Duration> {
    let start = Instant::now();
    let mut interval = FIRST_INTERVAL;
    loop {
        if cond() {
            return Ok(start.elapsed());
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(LabError::Timeout {
                what: what.to_string(),
                timeout,
            });
        }
        std::thread::sleep(interval.min(left));
        interval = (interval * 2).min(MAX_INTERVAL);
    }
}

/// [`wait_for`] with an async condition; sleeps without blocking the executor.
pub async fn wait_for_async<F, Fut>(what: &str, timeout: Duration, mut cond: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    let mut interval = FIRST_INTERVAL;
    loop {
        if cond().await {
            return Ok(start.elapsed());
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(LabError::Timeout {
                what: what.to_string(),
                timeout,
            });
        }
        tokio::time::sleep(interval.min(left)).await;
        interval = (interval * 2).min(MAX_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_once_the_condition_holds() {
        let mut calls = 0;
        wait_for("third call", Duration::from_secs(10), || {
            calls += 1;
            calls == 3
        })
        .unwrap();
        assert_eq!(calls, 3);
    }

    #[test]
    fn times_out_with_the_condition_named() {
        let mut calls = 0;
        let err = wait_for("never", Duration::from_millis(50), || {
            calls += 1;
            false
        })
        .unwrap_err();
        assert!(matches!(err, LabError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("never"), "{err}");
        // Polled more than once, and checked once more at the deadline.
        assert!(calls >= 2, "{calls}");
    }

    #[tokio::test]
    async fn async_variant_polls_an_async_condition() {
        let mut calls = 0u32;
        wait_for_async("second call", Duration::from_secs(10), || {
            calls += 1;
            let done = calls == 2;
            async move { done }
        })
        .await
        .unwrap();
        assert_eq!(calls, 2);
        let err = wait_for_async("never", Duration::from_millis(30), || async { false })
            .await
            .unwrap_err();
        assert!(matches!(err, LabError::Timeout { .. }));
    }
}
