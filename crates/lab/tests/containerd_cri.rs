//! A real runtime: containerd 1.6, started by the test, creates pod sandboxes through
//! its CRI and runs CNI plugins from a per-test `bin_dir`, exactly as on a node.
//!
//! This binary proves the harness itself with Debian's reference plugins (bridge,
//! host-local and loopback): a full sandbox lifecycle, crash cleanup through `Drop`,
//! and bad input refused up front. `containerd_cozyplane` and `containerd_agent` run
//! the same lifecycle with the cozyplane plugin. See `containerd_support` for the
//! prerequisites.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod containerd_support;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use containerd_support::*;
use cozyplane_cri_harness::{api, cni_netns, CniDirs, Containerd};
use cozyplane_testkit::needs;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_plugins_run_a_sandbox_through_cri() {
    if !requirements_met(needs!()) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let base = scratch();
    let (cni, ipam_dir) = reference_network(base.path());
    let _bridge = LinkGuard(BRIDGE);

    let (ctd, mut cri) = start(base.path(), &cni).await;
    let version = cri.version().await.expect("Version");
    assert_eq!(version.runtime_name, "containerd");
    assert!(version.runtime_version.starts_with("1.6"), "{version:?}");

    let netns_before = cni_netns().expect("list netns");
    let log_dir = base.path().join("logs");
    std::fs::create_dir_all(&log_dir).expect("create log dir");
    let t0 = std::time::Instant::now();
    let id = cri
        .run_pod_sandbox(pod("ref").sandbox_config(&log_dir))
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctd.log()));
    eprintln!(
        "RunPodSandbox (bridge + host-local) took {:?}",
        t0.elapsed()
    );
    let listed = cri.list_pod_sandbox().await.expect("ListPodSandbox");
    assert!(
        listed
            .iter()
            .any(|s| s.id == id && s.state == api::PodSandboxState::SandboxReady as i32),
        "{listed:?}"
    );

    let ip: Ipv4Addr = cri
        .pod_ip(&id)
        .await
        .expect("PodSandboxStatus IP")
        .parse()
        .expect("an IPv4 address");
    assert_eq!(
        ip.octets()[..3],
        [10, 251, 0],
        "{ip} not from host-local's range"
    );
    let ns = new_netns(&netns_before);
    let eth0 = addrs_in(&ns, "eth0");
    assert!(eth0.contains(&format!("inet {ip}/24")), "{eth0}");
    let lo = addrs_in(&ns, "lo");
    assert!(
        lo.contains("inet 127.0.0.1/8"),
        "loopback plugin did not run: {lo}"
    );
    // host-local records the lease by address
    assert!(ipam_dir.join("cpcri-bridge").join(ip.to_string()).exists());

    cri.stop_pod_sandbox(&id).await.expect("StopPodSandbox");
    assert!(
        !ipam_dir.join("cpcri-bridge").join(ip.to_string()).exists(),
        "DEL did not release the lease"
    );
    cri.remove_pod_sandbox(&id).await.expect("RemovePodSandbox");
    assert!(cri.list_pod_sandbox().await.expect("list").is_empty());
    assert_eq!(
        cni_netns().expect("list netns"),
        netns_before,
        "pod netns left behind"
    );
    ctd.shutdown().await.expect("shutdown");
}

/// A test that panics with a sandbox still running only gets `Drop`: that must still
/// end containerd, its shim and the pause process, and remove the netns, the mounts
/// and the scratch dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_harness_with_a_live_sandbox_leaves_nothing() {
    if !requirements_met(needs!()) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let base = scratch();
    let (cni, _ipam_dir) = reference_network(base.path());
    let _bridge = LinkGuard(BRIDGE);
    let run_dir_existed = Path::new("/run/containerd").exists();
    let netns_before = cni_netns().expect("list netns");

    let (ctd, mut cri) = start(base.path(), &cni).await;
    let dir = ctd.dir().to_path_buf();
    let socket = ctd.socket().to_string_lossy().into_owned();
    let log_dir = base.path().join("logs");
    std::fs::create_dir_all(&log_dir).expect("create log dir");
    cri.run_pod_sandbox(pod("leak").sandbox_config(&log_dir))
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", ctd.log()));
    new_netns(&netns_before);
    assert!(
        !processes_mentioning(&socket).is_empty(),
        "no shim found for {socket}"
    );
    drop(cri);
    drop(ctd);

    assert_eq!(
        processes_mentioning(&socket),
        Vec::<String>::new(),
        "processes outlived the harness"
    );
    assert_eq!(
        cni_netns().expect("list netns"),
        netns_before,
        "pod netns left behind"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir_str = dir.to_string_lossy();
    assert!(
        !mounts.contains(dir_str.as_ref()),
        "mounts left under {dir_str}"
    );
    if !run_dir_existed {
        assert!(
            !Path::new("/run/containerd").exists(),
            "/run/containerd left behind"
        );
    }
}

/// Bad input is refused before anything is created or started.
#[tokio::test]
async fn a_socket_path_too_long_is_refused_up_front() {
    let base = tempfile::tempdir().expect("tempdir");
    let long = base.path().join("d".repeat(120));
    let cni = CniDirs {
        bin_dir: base.path().join("bin"),
        conf_dir: base.path().join("conf"),
    };
    let err = Containerd::start(&long, &cni)
        .await
        .expect_err("must be refused");
    assert!(err.to_string().contains("longer than 107 bytes"), "{err}");
    assert!(!long.exists(), "nothing may be created for a refused start");
}

/// Harnesses share `/run/containerd` and `/var/run/netns`, so a second one waits for
/// the first to clean up (the machine-wide lock), then starts normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_harness_waits_for_the_first_to_finish() {
    if !requirements_met(needs!()) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let base = scratch();
    let (cni, _ipam_dir) = reference_network(base.path());
    let first = Containerd::start(&base.path().join("a"), &cni)
        .await
        .expect("start the first containerd");
    let second_dir = base.path().join("b");
    let second = tokio::spawn({
        let cni = cni.clone();
        async move { Containerd::start(&second_dir, &cni).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !second.is_finished(),
        "the second harness started while the first was running"
    );
    assert!(
        !base.path().join("b").exists(),
        "the second harness touched its dir early"
    );
    first.shutdown().await.expect("shutdown the first");
    let second = second
        .await
        .expect("join")
        .expect("start the second after the first stopped");
    let mut cri = second.client().await.expect("client");
    assert_eq!(
        cri.version().await.expect("Version").runtime_name,
        "containerd"
    );
    second.shutdown().await.expect("shutdown the second");
}
