//! Shared by the containerd test binaries (`containerd_cri`, `containerd_cozyplane`,
//! `containerd_agent`): prerequisites, scratch and CNI dirs, the reference network,
//! small `ip` helpers and the workspace binaries under test.
//!
//! Needs root, containerd, runc, ctr, gcc, tar, iproute2 and Debian's
//! containernetworking-plugins in /usr/lib/cni. Under CI a missing piece fails
//! the test; otherwise it is skipped with a `SKIP` line (the test kit's gate).
//!
//! Workspace binaries come from `$COZYPLANE_CNI_BIN` and `$COZYPLANE_BIN` when
//! set; otherwise the test kit builds them (see `cozyplane_testkit::workspace_binary`).
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cozyplane_cri_harness::{cni_netns, CniDirs, Containerd, CriClient, PodRef, REQUIRED_TOOLS};
use cozyplane_testkit::{tools, Needs, Tool};

/// One harness at a time (async-aware: the guard is held across awaits).
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// The test kit's gate for a containerd test: the calling test's `needs`
/// plus root, the harness's tools (probed with `--version`), iproute2 and
/// the reference plugins. `false` means skipped.
pub fn requirements_met(needs: Needs) -> bool {
    let mut needs = needs.root().tool(&tools::IP);
    for &bin in REQUIRED_TOOLS {
        needs = needs.tool(&Tool::new(
            bin,
            &["--version"],
            "apt-get install containerd runc gcc tar",
        ));
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        needs = needs.file(
            Path::new(REFERENCE_PLUGINS).join(plugin),
            "a reference CNI plugin (containernetworking-plugins)",
        );
    }
    needs.ready()
}

/// A short scratch dir (containerd's socket path must fit in 107 bytes).
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cpcri")
        .tempdir_in("/tmp")
        .expect("create scratch dir")
}

pub fn cni_dirs(base: &Path) -> CniDirs {
    let dirs = CniDirs {
        bin_dir: base.join("cni-bin"),
        conf_dir: base.join("cni-conf"),
    };
    std::fs::create_dir_all(&dirs.bin_dir).expect("create bin dir");
    std::fs::create_dir_all(&dirs.conf_dir).expect("create conf dir");
    std::os::unix::fs::symlink(
        Path::new(REFERENCE_PLUGINS).join("loopback"),
        dirs.bin_dir.join("loopback"),
    )
    .expect("link loopback");
    dirs
}

pub fn pod(name: &str) -> PodRef {
    PodRef {
        name: name.into(),
        namespace: "cri-test".into(),
        uid: format!("uid-{name}"),
    }
}

/// The one `cni-*` netns that appeared since `before`.
pub fn new_netns(before: &BTreeSet<String>) -> String {
    let now = cni_netns().expect("list netns");
    let new: Vec<_> = now.difference(before).cloned().collect();
    assert_eq!(new.len(), 1, "expected one new pod netns, got {new:?}");
    new[0].clone()
}

/// `ip -4 -o addr show dev <dev>` inside netns `ns`.
pub fn addrs_in(ns: &str, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns, "-4", "-o", "addr", "show", "dev", dev])
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip -n {ns} addr show dev {dev}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn host_link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", "dev", name])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Deletes a host link when dropped (the bridge plugin leaves its bridge behind).
pub struct LinkGuard(pub &'static str);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        if host_link_exists(self.0) {
            let _ = Command::new("ip").args(["link", "del", self.0]).status();
        }
    }
}

/// The bridge the reference conflist uses (the bridge plugin leaves it behind).
pub const BRIDGE: &str = "cpcri0";

/// Debian's bridge + host-local + loopback in a bin dir under `base`, with a
/// cniVersion 1.0.0 conflist; returns the dirs and host-local's data dir.
pub fn reference_network(base: &Path) -> (CniDirs, PathBuf) {
    let cni = cni_dirs(base);
    for plugin in ["bridge", "host-local"] {
        std::os::unix::fs::symlink(
            Path::new(REFERENCE_PLUGINS).join(plugin),
            cni.bin_dir.join(plugin),
        )
        .expect("link plugin");
    }
    let ipam_dir = base.join("ipam");
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "cpcri-bridge",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": "10.251.0.0/24" }]],
                "dataDir": ipam_dir,
            },
        }],
    });
    std::fs::write(
        cni.conf_dir.join("10-bridge.conflist"),
        conflist.to_string(),
    )
    .expect("write conflist");
    (cni, ipam_dir)
}

/// Pids of processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(needle)
                .then(|| format!("{}: {cmd}", e.file_name().to_string_lossy()))
        })
        .collect()
}

pub async fn start(base: &Path, cni: &CniDirs) -> (Containerd, CriClient) {
    let mut ctd = Containerd::start(&base.join("ctd"), cni)
        .await
        .unwrap_or_else(|e| panic!("start containerd: {e}"));
    ctd.wait_network_ready(Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("containerd network not ready: {e}\n{}", ctd.log()));
    let client = ctd.client().await.expect("CRI client");
    (ctd, client)
}

/// The plugin binary (`$COZYPLANE_CNI_BIN`, else built by the test kit).
pub fn plugin_binary() -> PathBuf {
    cozyplane_testkit::cni_plugin_bin()
}
