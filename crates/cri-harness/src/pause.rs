//! A local `pause` image, because the sandbox image cannot be pulled here.
//!
//! containerd's CRI starts every pod sandbox from `sandbox_image`; with no registry
//! access that image must already be in its `k8s.io` namespace. We compile a tiny
//! static `pause` (it only reaps children and exits on SIGINT/SIGTERM) and wrap it in
//! a one-layer OCI image layout tar that `ctr images import` accepts. Everything is
//! content-addressed by SHA-256, so the same inputs give the same image.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use cozyplane_errors::Chain;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::error::{CriError, Result};
use crate::run_checked;

/// The image name the harness imports and configures as `sandbox_image`.
pub const PAUSE_IMAGE: &str = "localhost/cozyplane/pause:test";

/// The pause program: PID 1 of the sandbox; it holds the namespaces open.
const PAUSE_C: &str = r#"
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction term = { .sa_handler = on_term };
    struct sigaction chld = { .sa_handler = on_chld, .sa_flags = SA_NOCLDSTOP };
    sigaction(SIGINT, &term, NULL);
    sigaction(SIGTERM, &term, NULL);
    sigaction(SIGCHLD, &chld, NULL);
    for (;;) pause();
    return 0;
}
"#;

/// Builds the pause image under `work` and returns the path of its OCI layout tar.
///
/// Needs `gcc` (with glibc's static `libc.a`) and `tar`.
pub fn build_pause_image(work: &Path) -> Result<PathBuf> {
    let src = work.join("pause.c");
    let rootfs = work.join("pause-rootfs");
    let layout = work.join("pause-oci");
    let blobs = layout.join("blobs").join("sha256");
    for dir in [&rootfs, &blobs] {
        fs::create_dir_all(dir).map_err(|e| CriError::io("create", dir, e))?;
    }
    fs::write(&src, PAUSE_C).map_err(|e| CriError::io("write", &src, e))?;
    let bin = rootfs.join("pause");
    run_checked(
        Command::new("gcc")
            .args(["-static", "-Os", "-s", "-o"])
            .arg(&bin)
            .arg(&src),
    )?;

    // The layer: an uncompressed tar of the rootfs, so its digest is also its diff id.
    let layer_tar = work.join("pause-layer.tar");
    run_checked(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&layer_tar)
            .arg("pause"),
    )?;
    let layer = fs::read(&layer_tar).map_err(|e| CriError::io("read", &layer_tar, e))?;
    let layer_digest = put_blob(&blobs, &layer)?;

    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Entrypoint": ["/pause"] },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    });
    let config =
        serde_json::to_vec(&config).map_err(|e| CriError::Invalid(Chain(&e).to_string()))?;
    let config_digest = put_blob(&blobs, &config)?;

    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
    });
    let manifest =
        serde_json::to_vec(&manifest).map_err(|e| CriError::Invalid(Chain(&e).to_string()))?;
    let manifest_digest = put_blob(&blobs, &manifest)?;

    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": { "io.containerd.image.name": PAUSE_IMAGE },
        }],
    });
    write_json(&layout.join("index.json"), &index)?;
    write_json(
        &layout.join("oci-layout"),
        &json!({ "imageLayoutVersion": "1.0.0" }),
    )?;

    let image_tar = work.join("pause-image.tar");
    run_checked(
        Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
            .arg(&layout)
            .arg("-cf")
            .arg(&image_tar)
            .args(["oci-layout", "index.json", "blobs"]),
    )?;
    Ok(image_tar)
}

/// Stores `data` as a blob named by its digest; returns `sha256:<hex>`.
fn put_blob(blobs: &Path, data: &[u8]) -> Result<String> {
    let hex = sha256_hex(data);
    let path = blobs.join(&hex);
    fs::write(&path, data).map_err(|e| CriError::io("write", &path, e))?;
    Ok(format!("sha256:{hex}"))
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let bytes = serde_json::to_vec(value).map_err(|e| CriError::Invalid(Chain(&e).to_string()))?;
    fs::write(path, bytes).map_err(|e| CriError::io("write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_names_are_sha256_digests() {
        // FIPS 180-2 test vector
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let dir = tempfile::tempdir().unwrap();
        let digest = put_blob(dir.path(), b"abc").unwrap();
        assert_eq!(
            digest,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let stored = fs::read(dir.path().join(&digest["sha256:".len()..])).unwrap();
        assert_eq!(stored, b"abc");
    }
}
