//! Printing an error with its causes, each once.
//!
//! Our errors follow one rule (docs/architecture.md, "Errors"): a variant that
//! wraps another error either returns it from [`Error::source`] and leaves it out
//! of its own message, or prints it and does not return it, never both. Every
//! place where an error becomes text for a person or another program (the CNI
//! result, an HTTP Status, a pod's status message, the CLI's `error:` line, a log
//! field) must therefore print the whole chain: that is [`Chain`].
//!
//! ```
//! use cozyplane_errors::Chain;
//! # #[derive(Debug)] struct Outer(std::io::Error);
//! # impl std::fmt::Display for Outer {
//! #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("read /etc/x") }
//! # }
//! # impl std::error::Error for Outer {
//! #     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> { Some(&self.0) }
//! # }
//! let e = Outer(std::io::Error::other("disk on fire"));
//! assert_eq!(Chain(&e).to_string(), "read /etc/x: disk on fire");
//! // in a log line:
//! // tracing::warn!(error = %Chain(&e), "giving up");
//! ```
//!
//! Some libraries' errors print their source *and* return it (kube's
//! `KubeconfigError`, aya's `EbpfError`). A cause whose text the line printed so
//! far already ends with is therefore skipped, so such a cause shows once too,
//! and its own causes are still followed.

use std::error::Error;
use std::fmt;

/// Displays an error and its [`Error::source`] chain as `outer: inner: innermost`,
/// each message once (see the crate docs).
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !text.is_empty() && !line.ends_with(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&line)
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;
    use std::io;

    /// A leaf with a context around it, the way our crates nest: an io error in a
    /// context variant, in a wrapper that names the component.
    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("create {path}")]
        Io {
            path: &'static str,
            #[source]
            source: io::Error,
        },
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("starting the agent")]
        Start(#[source] Inner),
        #[error(transparent)]
        Same(Inner),
    }

    fn nested() -> Outer {
        Outer::Start(Inner::Io {
            path: "/run/x",
            source: io::Error::from_raw_os_error(13),
        })
    }

    #[test]
    fn every_cause_is_printed_once_in_order() {
        let text = Chain(&nested()).to_string();
        assert_eq!(
            text,
            "starting the agent: create /run/x: Permission denied (os error 13)"
        );
        for part in ["starting the agent", "create /run/x", "Permission denied"] {
            assert_eq!(text.matches(part).count(), 1, "{part:?} in {text:?}");
        }
    }

    #[test]
    fn a_transparent_wrapper_adds_nothing() {
        let e = Outer::Same(Inner::Io {
            path: "/run/x",
            source: io::Error::from_raw_os_error(2),
        });
        assert_eq!(
            Chain(&e).to_string(),
            "create /run/x: No such file or directory (os error 2)"
        );
    }

    /// Library errors that print their source and return it (kube, aya) show the
    /// cause once, and the cause's own causes still follow.
    #[test]
    fn a_cause_already_printed_by_its_wrapper_is_skipped() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to read kubeconfig: {0}")]
        struct Repeats(#[source] Outer);

        let text = Chain(&Repeats(nested())).to_string();
        assert_eq!(
            text,
            "failed to read kubeconfig: starting the agent: create /run/x: \
             Permission denied (os error 13)"
        );
    }

    #[test]
    fn a_leaf_is_its_own_message() {
        let e = io::Error::other("plain");
        assert_eq!(Chain(&e).to_string(), "plain");
        assert_eq!(format!("{:?}", Chain(&e)), "plain");
    }
}
