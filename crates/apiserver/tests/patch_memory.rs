//! The memory a JSON patch bomb costs the server (issue #9: a second
//! 17-copy patch grew the process to 24 GB). Its own test binary, with a
//! counting allocator, so no other test's allocations are measured.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{json, Value};
use support::Backend;

/// The system allocator, counting the bytes live now and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above with this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Two patches of 20 self-doubling copies each (before the fix: a 48 MB
/// object from the first, and 2^20 times that asked of the second) cost
/// the server less than 50 MB at their peak, on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_bombs_cost_less_than_50_mb() {
    for backend in [Backend::Embedded, Backend::Etcd] {
        let Some(h) = support::start(backend, "copy_bombs_cost_less_than_50_mb").await else {
            continue;
        };
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "m"},
                          "spec": {"podCIDRs": ["x".repeat(40)]}});
        let c = h.post("/api/v1/nodes", &node).await;
        assert_eq!(c.status, 201, "{}", c.text);
        let op = json!({"op": "copy", "from": "/spec/podCIDRs", "path": "/spec/podCIDRs/-"});
        let patch = Value::Array(vec![op; 20]);
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        // Only the first patch: were it applied, the second would ask for
        // terabytes and take the test machine down with the server.
        let r = h
            .patch("/api/v1/nodes/m", "application/json-patch+json", &patch)
            .await;
        let grown = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        eprintln!("{backend:?}: the first patch grew memory by {grown} bytes at its peak");
        assert_eq!(
            r.status,
            422,
            "{backend:?}: {}",
            &r.text[..r.text.len().min(200)]
        );
        let r = h
            .patch("/api/v1/nodes/m", "application/json-patch+json", &patch)
            .await;
        assert_eq!(r.status, 422, "{backend:?}");
        let grown = grown.max(PEAK.load(Ordering::Relaxed).saturating_sub(base));
        assert!(
            grown < 50 * 1024 * 1024,
            "{backend:?}: the patches grew memory by {grown} bytes"
        );
        h.server.shutdown().await;
    }
}
