//! A real container runtime for tests: a private containerd 1.6 driven through its
//! CRI, so a CNI plugin is exercised the way a kubelet + containerd node runs it.
//!
//! * [`Containerd`] starts containerd as a child process with all state under one
//!   scratch directory, the CNI `bin_dir`/`conf_dir` the caller chose, and a locally
//!   built pause image ([`build_pause_image`]); it stops it by pid and cleans up.
//! * [`CriClient`] is a small CRI `runtime.v1` client (tonic, over the unix socket):
//!   `Version`, `Status`, `RunPodSandbox`, `PodSandboxStatus`, `StopPodSandbox`,
//!   `RemovePodSandbox`, `ListPodSandbox` — the calls that make containerd run CNI
//!   ADD (on run) and DEL (on stop, and again without a netns on remove).
//!
//! containerd 1.6's libcni accepts CNI results up to cniVersion 1.0.0 only, and
//! needs the `loopback` plugin in `bin_dir` for the pod's `lo`.
//!
//! Everything here needs root plus `containerd`, `runc`, `ctr`, `gcc` (with glibc's
//! static `libc.a`) and `tar` ([`REQUIRED_TOOLS`]; the tests' gate probes them).
//!
//! Test-only: crates use it as a dev-dependency (the lab's `containerd_*` tests), so
//! the `cozyplane` binary never links tonic and the CRI code (see
//! `docs/architecture.md`, "Why the CRI harness is its own dev-only crate").

mod client;
mod containerd;
mod error;
mod pause;

use std::process::{Command, Output};

pub use client::{CriClient, PodRef, CALL_TIMEOUT};
pub use containerd::{
    cni_netns, CniDirs, Containerd, HOST_LOCK, HOST_LOCK_TIMEOUT, NETNS_DIR, START_TIMEOUT,
};
pub use error::{CriError, Result};
pub use k8s_cri::v1 as api;
pub use pause::{build_pause_image, PAUSE_IMAGE};

/// The programs the harness runs.
pub const REQUIRED_TOOLS: &[&str] = &["containerd", "runc", "ctr", "gcc", "tar"];

/// Runs `cmd` and turns a non-zero exit into [`CriError::Command`] with its stderr.
pub(crate) fn run_checked(cmd: &mut Command) -> Result<Output> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|source| CriError::Spawn {
        program: program.clone(),
        source,
    })?;
    if out.status.success() {
        return Ok(out);
    }
    let command = std::iter::once(program)
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    Err(CriError::Command {
        command,
        status: out.status,
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_commands_report_their_stderr() {
        let err =
            run_checked(Command::new("sh").args(["-c", "echo boom >&2; exit 3"])).unwrap_err();
        match err {
            CriError::Command {
                command,
                status,
                stderr,
            } => {
                assert_eq!(command, "sh -c echo boom >&2; exit 3");
                assert_eq!(status.code(), Some(3));
                assert_eq!(stderr, "boom");
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = run_checked(&mut Command::new("/nonexistent/tool")).unwrap_err();
        assert!(matches!(err, CriError::Spawn { .. }), "{err}");
        assert_eq!(
            run_checked(&mut Command::new("true"))
                .unwrap()
                .status
                .code(),
            Some(0)
        );
    }
}
