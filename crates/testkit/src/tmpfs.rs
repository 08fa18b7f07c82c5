//! A tmpfs of a chosen size, for tests that fill a file system (storage
//! faults). Root only; gate the test with `needs!().root()`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for a test; unmounted (lazily, so it never fails on a
/// busy mount) when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`, e.g. `"24m"`), mode 0700,
    /// at `at` (created if missing). Panics when the mount fails.
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs on {}: {st}", at.display());
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
