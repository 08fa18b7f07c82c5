//! Checks before `lab up` touches anything, so a missing prerequisite is a clear
//! message instead of a half-built lab and an errno.

use std::path::Path;

use super::error::{ClusterError, ClusterResult};

/// Fails unless the effective user is root.
pub fn require_root() -> ClusterResult<()> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(ClusterError::NotRoot)
    }
}

/// True if `/proc/filesystems` lists `fs` (the kernel can mount it).
fn kernel_has_fs(filesystems: &str, fs: &str) -> bool {
    filesystems
        .lines()
        .any(|l| l.split_whitespace().last() == Some(fs))
}

/// True if some mount in `/proc/self/mountinfo` has file system type `fs`.
fn mounted_fs(mountinfo: &str, fs: &str) -> bool {
    // The type is the first field after the " - " separator.
    mountinfo.lines().any(|l| {
        l.split_once(" - ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some(fs)
    })
}

fn read(path: &str) -> ClusterResult<String> {
    std::fs::read_to_string(path).map_err(|e| ClusterError::io("read", path, e))
}

/// Everything `lab up` needs from the machine: root, a kernel that can mount a
/// bpffs (each agent mounts its own under the lab's run directory, so
/// `/sys/fs/bpf` itself need not be mounted) and a mounted cgroup v2 hierarchy.
pub fn check_host() -> ClusterResult<()> {
    require_root()?;
    if !kernel_has_fs(&read("/proc/filesystems")?, "bpf") {
        return Err(ClusterError::MissingFilesystem {
            what: "the BPF file system",
            path: "/proc/filesystems".into(),
            hint: "this kernel cannot mount a bpffs; use a kernel with CONFIG_BPF_SYSCALL (Linux >= 6.6)",
        });
    }
    if !mounted_fs(&read("/proc/self/mountinfo")?, "cgroup2") {
        return Err(ClusterError::MissingFilesystem {
            what: "cgroup v2",
            path: "/proc/self/mountinfo".into(),
            hint: "mount it (`mount -t cgroup2 none /sys/fs/cgroup`, or boot with \
                   systemd.unified_cgroup_hierarchy=1)",
        });
    }
    Ok(())
}

/// Fails unless `path` is an executable file.
pub fn require_binary(what: &'static str, path: &Path, env: &'static str) -> ClusterResult<()> {
    use std::os::unix::fs::PermissionsExt;
    let ok =
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if ok {
        Ok(())
    } else {
        Err(ClusterError::MissingBinary {
            what,
            path: path.into(),
            env,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_override() {
        let err = require_binary(
            "the cozyplane binary",
            Path::new("/nonexistent/cozyplane"),
            "COZYPLANE_BIN",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            err.contains("/nonexistent/cozyplane") && err.contains("COZYPLANE_BIN"),
            "{err}"
        );
        // A directory is not a binary either.
        assert!(require_binary("x", Path::new("/tmp"), "X").is_err());
        assert!(require_binary("sh", Path::new("/bin/sh"), "X").is_ok());
    }

    #[test]
    fn filesystems_and_mounts_are_recognised() {
        let fss = "nodev\tsysfs\nnodev\tcgroup2\nnodev\tbpf\n\text4\n";
        assert!(kernel_has_fs(fss, "bpf") && kernel_has_fs(fss, "ext4"));
        assert!(!kernel_has_fs(fss, "bpffs") && !kernel_has_fs("nodev\tcgroup\n", "cgroup2"));
        let mi = "30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw\n\
                  41 30 0:37 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert!(mounted_fs(mi, "cgroup2"));
        assert!(!mounted_fs(mi, "bpf"));
        assert!(mounted_fs(
            &read("/proc/self/mountinfo").expect("mountinfo"),
            "proc"
        ));
    }
}
