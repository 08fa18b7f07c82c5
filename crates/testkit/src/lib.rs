//! Test support for every cozyplane test (a dev-only crate: `publish = false`,
//! used only as a dev-dependency; nothing shipped links it).
//!
//! - **The gate** ([`Needs`], [`needs!`]): the one implementation of the rule
//!   "a test that cannot run here fails under CI and is skipped, visibly,
//!   elsewhere". A test names what it needs (root, tools probed by running
//!   them, files, fixtures such as etcd or kubectl) and asks [`Needs::ready`]:
//!   - everything is here: `true`, the test runs;
//!   - something is missing and [`in_ci`]: panic naming everything missing;
//!   - otherwise: `false`, after writing `SKIP <test>: missing …` straight to
//!     the stderr file descriptor (libtest captures `eprintln!` of passing
//!     tests, not direct writes, so the line shows in `cargo test` output
//!     without `--nocapture`) and appending it to the file named by
//!     `COZYPLANE_SKIP_LOG` when set (`scripts/test` counts those lines).
//! - **Polling** ([`eventually`], [`poll`], and `eventually_async`,
//!   `poll_async` with the `tokio` feature): a condition checked until it
//!   holds or a deadline passes, failing with a message naming what was
//!   awaited and the last observation.
//! - **Finders** ([`workspace_binary`], [`cozyplane_bin`], [`cni_plugin_bin`],
//!   [`kubectl`]): the workspace binaries the tests exec (from
//!   `COZYPLANE_BIN`/`COZYPLANE_CNI_BIN`, which `scripts/test` exports, else
//!   built with cargo) and the real kubectl.
//! - **The API server in process** (`apiserver` module, feature `apiserver`).
//!
//! ## How CI is read
//! `CI` counts as set unless it is absent, empty, `0` or `false` (any case):
//! our `.ci/run` and GitHub Actions export `CI=true`, some systems `CI=1`, and
//! a gate must never skip quietly on a CI that spells it differently.
//!
//! ## How root is detected
//! The effective uid from `geteuid(2)` (nix), nothing else.

// Test support: a fixture or finder that fails panics with its message, as the
// test itself would.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod bins;
mod gate;
mod poll;
mod tmpfs;

#[cfg(feature = "apiserver")]
pub mod apiserver;

pub use bins::{
    cni_plugin_bin, cozyplane_bin, helm, kubectl, packaging_tool, static_cni_plugin_bin, tools_dir,
    workspace_binary, NotFound,
};
pub use gate::{in_ci, is_root, tools, Needs, Tool};
pub use poll::{eventually, poll, TimedOut};
#[cfg(feature = "tokio")]
pub use poll::{eventually_async, poll_async};
pub use tmpfs::Tmpfs;

/// The libtest name of the test function this expands in (`module::test`,
/// without the crate's name), found from the type name of a local item, so a
/// test never types its own name. In an `async` test the `{{closure}}`
/// segments of the body are dropped.
#[macro_export]
macro_rules! test_name {
    () => {{
        fn here() {}
        $crate::__test_name_from(::std::any::type_name_of_val(&here))
    }};
}

/// [`Needs`] for the test this expands in: `needs!().root().ready()`.
#[macro_export]
macro_rules! needs {
    () => {
        $crate::Needs::new($crate::test_name!())
    };
}

#[doc(hidden)]
pub fn __test_name_from(path: &str) -> String {
    let mut parts: Vec<&str> = path.split("::").collect();
    // the local item itself, then the async blocks around it
    parts.pop();
    while parts.last() == Some(&"{{closure}}") {
        parts.pop();
    }
    // the crate (a test binary's or a library's) is not part of the test name
    if parts.len() > 1 {
        parts.remove(0);
    }
    parts.join("::")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_test_name_is_the_libtest_name() {
        assert_eq!(test_name!(), "tests::the_test_name_is_the_libtest_name");
    }

    #[tokio::test]
    async fn an_async_test_has_its_own_name_too() {
        let name = async { test_name!() }.await;
        assert_eq!(name, "tests::an_async_test_has_its_own_name_too");
    }

    #[test]
    fn names_are_cut_from_type_paths() {
        use super::__test_name_from as name;
        assert_eq!(name("bpf_forwarding::rpf_drops::here"), "rpf_drops");
        assert_eq!(
            name("kubectl::vpc_crud::embedded::{{closure}}::{{closure}}::here"),
            "vpc_crud::embedded"
        );
        assert_eq!(name("x::here"), "x");
    }
}
