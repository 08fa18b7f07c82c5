//! Finding the programs the tests exec: the workspace's own binaries and the
//! real kubectl.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The workspace root (this crate lives in `crates/testkit`).
const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Where kubectl is looked for after `$COZYPLANE_KUBECTL`: gcloud's pinned
/// 1.33 (what `/usr/bin/kubectl`, a version dispatcher, would pick for our
/// server's 1.33 `/version`), then `/usr/bin/kubectl`.
pub const KUBECTL_CANDIDATES: [&str; 2] = [
    "/usr/lib/google-cloud-sdk/bin/kubectl.1.33",
    "/usr/bin/kubectl",
];

/// A program the tests need was not found.
#[derive(Debug, thiserror::Error)]
#[error("{what} (looked at {looked})")]
pub struct NotFound {
    /// What is missing and how to provide it.
    pub what: String,
    /// Where it was looked for.
    pub looked: String,
}

/// The real kubectl: `$COZYPLANE_KUBECTL`, else the first of
/// [`KUBECTL_CANDIDATES`] that answers `kubectl version --client`.
pub fn kubectl() -> Result<PathBuf, NotFound> {
    let candidates: Vec<PathBuf> = match std::env::var_os("COZYPLANE_KUBECTL") {
        Some(p) => vec![PathBuf::from(p)],
        None => KUBECTL_CANDIDATES.iter().map(PathBuf::from).collect(),
    };
    candidates
        .iter()
        .find(|k| {
            Command::new(k)
                .args(["version", "--client"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .cloned()
        .ok_or_else(|| NotFound {
            what: "kubectl (install google-cloud-cli's kubectl, or set COZYPLANE_KUBECTL)".into(),
            looked: candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The `cozyplane` binary (`$COZYPLANE_BIN`, else built; see
/// [`workspace_binary`]).
pub fn cozyplane_bin() -> PathBuf {
    workspace_binary("COZYPLANE_BIN", "cozyplane", "cozyplane")
}

/// The CNI plugin binary (`$COZYPLANE_CNI_BIN`, else built; see
/// [`workspace_binary`]).
pub fn cni_plugin_bin() -> PathBuf {
    workspace_binary("COZYPLANE_CNI_BIN", "cozyplane-cni", "cozyplane-cni")
}

/// A binary of this workspace: `$<env_var>` when set (`scripts/test` builds
/// them all first and exports the paths), else built once per test process
/// with `cargo build -p <package> --bin <bin>` into `<target>/testkit-bins`.
/// A separate target dir, because the `cargo test` running this test holds
/// the lock on its own until the tests end. Panics when the build fails.
pub fn workspace_binary(env_var: &str, package: &str, bin: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var) {
        return PathBuf::from(p);
    }
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(path) = built.get(bin) {
        return path.clone();
    }
    let path = build(env_var, package, bin);
    built.insert(bin.to_string(), path.clone());
    path
}

fn build(env_var: &str, package: &str, bin: &str) -> PathBuf {
    // <target>/<profile>/deps/<test>-<hash>
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binaries live in <target>/<profile>/deps");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let target_dir = profile_dir
        .parent()
        .expect("test binaries live in <target>/<profile>/deps")
        .join("testkit-bins");
    let note = format!(
        "note: building {bin} for this test into {} (set {env_var} to use a built one)\n",
        target_dir.display()
    );
    let _ = std::io::stderr().lock().write_all(note.as_bytes());
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", package, "--bin", bin, "--target-dir"])
        .arg(&target_dir)
        .current_dir(WORKSPACE);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("run cargo build -p {package}: {e}"));
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    let path = target_dir
        .join(if release { "release" } else { "debug" })
        .join(bin);
    assert!(
        path.is_file(),
        "no {bin} at {} after the build",
        path.display()
    );
    path
}

/// The CNI plugin linked statically, as the image ships it (it runs on the
/// node against the node's libraries): `$COZYPLANE_CNI_STATIC_BIN` when set
/// (`scripts/test` builds it), else built once per test process with
/// `cargo rustc … -C target-feature=+crt-static` into
/// `<target>/testkit-static-cni`. Panics when the build fails.
pub fn static_cni_plugin_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("COZYPLANE_CNI_STATIC_BIN") {
        return PathBuf::from(p);
    }
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("the test binary's path");
            let target_dir = exe
                .ancestors()
                .nth(3)
                .expect("test binaries live in <target>/<profile>/deps")
                .join("testkit-static-cni");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
            let status = Command::new(cargo)
                .args([
                    "rustc",
                    "-p",
                    "cozyplane-cni",
                    "--bin",
                    "cozyplane-cni",
                    "--target-dir",
                ])
                .arg(&target_dir)
                .args(["--", "-C", "target-feature=+crt-static"])
                .current_dir(WORKSPACE)
                .status()
                .expect("run cargo");
            assert!(status.success(), "building the static CNI plugin failed");
            target_dir.join("debug").join("cozyplane-cni")
        })
        .clone()
}

/// The packaging tools dir `scripts/install-deps.sh` fills: `$COZYPLANE_TOOLS`,
/// else `/var/tmp/cozyplane-tools`.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("COZYPLANE_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/cozyplane-tools"))
}

/// A packaging tool at `<tools dir>/<rel>` that answers `<tool> <probe…>`.
pub fn packaging_tool(rel: &str, probe: &[&str]) -> Result<PathBuf, NotFound> {
    let path = tools_dir().join(rel);
    let runs = Command::new(&path)
        .args(probe)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if runs {
        Ok(path)
    } else {
        Err(NotFound {
            what: format!("{rel} (run scripts/install-deps.sh, or set COZYPLANE_TOOLS)"),
            looked: path.display().to_string(),
        })
    }
}

/// The real helm of major version `major` (3 or 4), as `scripts/install-deps.sh`
/// installs it (`<tools dir>/bin/helm<major>`).
pub fn helm(major: u8) -> Result<PathBuf, NotFound> {
    packaging_tool(&format!("bin/helm{major}"), &["version", "--short"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_root_holds_the_workspace_manifest() {
        let manifest = std::fs::read_to_string(Path::new(WORKSPACE).join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"), "{manifest}");
    }

    #[test]
    fn a_set_variable_wins_without_a_build() {
        // Any variable that is set will do (setting one would race with the
        // other tests reading the environment): PATH.
        let path = std::env::var_os("PATH").expect("PATH is set");
        assert_eq!(
            workspace_binary("PATH", "no-such-package", "x"),
            PathBuf::from(path)
        );
    }
}
