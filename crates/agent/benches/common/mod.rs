//! What the agent's benches share: percentiles, a result line, polling.
#![allow(dead_code)] // each bench uses a different subset

use std::time::{Duration, Instant};

/// The `p` quantile (0..=1) of `sorted` (nearest rank).
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prints p50, p99 and max of `v` (sorted in place).
pub fn line(what: &str, v: &mut [Duration]) {
    v.sort();
    println!(
        "{what:<44} p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms (n={})",
        ms(pct(v, 0.5)),
        ms(pct(v, 0.99)),
        ms(v[v.len() - 1]),
        v.len()
    );
}

/// Calls `done` every `every` until it yields a value; panics naming `what`
/// once `give_up` has passed.
pub fn poll<T>(
    what: &str,
    every: Duration,
    give_up: Duration,
    mut done: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + give_up;
    loop {
        if let Some(v) = done() {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(every);
    }
}
