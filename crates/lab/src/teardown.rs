//! Removing everything a topology made, also after a crash.
//!
//! Two sources, so that neither a lost state file nor an unrecorded resource leaks:
//! the state file (namespaces, tracked processes with their start times, pin dirs,
//! cgroups) and discovery (namespaces under `/run/netns` and links in the host carrying
//! the prefix, every process living in one of those namespaces, mounts under
//! `/run/netns` or the run directory carrying the prefix).
//!
//! Order matters: processes first (a process inside a namespace keeps it alive after
//! its bind mount is gone), then the namespace mounts (which frees the namespaces and,
//! with them, every link inside, the fabric bridge and veths included), then leftovers.
//! Every step runs even if an earlier one failed, failures are collected and reported
//! together, and every step is idempotent, so running teardown again retries exactly
//! what is left. The run directory goes last, and only if everything else succeeded:
//! it is the record that something remains.

use std::collections::{BTreeSet, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cozyplane_datapath::netlink::{delete_named_netns, named_netns_path, NlHandle, NETNS_RUN_DIR};
use cozyplane_errors::Chain;
use nix::mount::{umount2, MntFlags};

use crate::error::{LabError, Result};
use crate::process::{self, NsId};
use crate::spec::{carries_prefix, validate_name, RUN_ROOT};
use crate::state::LabState;

/// What a teardown removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Processes killed (pids).
    pub processes: Vec<i32>,
    /// Named namespaces removed.
    pub netns: Vec<String>,
    /// Links removed from the host namespace.
    pub links: Vec<String>,
    /// Stray mounts removed.
    pub mounts: Vec<PathBuf>,
    /// Directories removed (pin dirs, cgroups, the run directory).
    pub dirs: Vec<PathBuf>,
}

impl Cleanup {
    /// True if there was nothing to remove.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.netns.is_empty()
            && self.links.is_empty()
            && self.mounts.is_empty()
            && self.dirs.is_empty()
    }
}

/// Removes every namespace, process, link, mount and directory of topology `prefix`
/// under the default run root ([`RUN_ROOT`]). Safe to run twice and after a crash.
pub fn destroy_by_prefix(prefix: &str) -> Result<Cleanup> {
    destroy_by_prefix_in(prefix, Path::new(RUN_ROOT))
}

/// [`destroy_by_prefix`] with an explicit run root.
pub fn destroy_by_prefix_in(prefix: &str, run_root: &Path) -> Result<Cleanup> {
    validate_name(prefix)?;
    let run_dir = run_root.join(prefix);
    let mut errors = Vec::new();
    let mut done = Cleanup::default();

    let state = match LabState::load(&run_dir) {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => {
            // Keep going with discovery; the run dir stays so the file can be looked at.
            errors.push(Chain(&e).to_string());
            LabState::default()
        }
    };

    // Namespaces: recorded ones plus discovered ones.
    let mut names: BTreeSet<String> = state
        .netns
        .iter()
        .filter(|n| carries_prefix(n, prefix))
        .cloned()
        .collect();
    match list_netns(prefix) {
        Ok(found) => names.extend(found),
        Err(e) => errors.push(Chain(&e).to_string()),
    }
    let ids: HashSet<NsId> = names
        .iter()
        .filter_map(|n| std::fs::metadata(named_netns_path(n)).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect();

    kill_processes(&state, &ids, &mut done, &mut errors);

    for name in &names {
        let existed = named_netns_path(name).exists();
        match delete_named_netns(name) {
            Ok(()) if existed => done.netns.push(name.clone()),
            Ok(()) => {}
            Err(e) => errors.push(Chain(&e).to_string()),
        }
    }

    remove_stray_mounts(prefix, &run_dir, &mut done, &mut errors);

    for dir in state.pin_dirs.iter() {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => done.dirs.push(dir.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("remove pin dir {}: {}", dir.display(), Chain(&e))),
        }
    }
    for dir in state.cgroups.iter() {
        // A cgroup directory is removed with rmdir (its control files go with it);
        // it must be empty of processes, which the kill step above saw to.
        match std::fs::remove_dir(dir) {
            Ok(()) => done.dirs.push(dir.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("remove cgroup {}: {}", dir.display(), Chain(&e))),
        }
    }

    match delete_host_links(prefix) {
        Ok(links) => done.links = links,
        Err(e) => errors.push(Chain(&e).to_string()),
    }

    if !errors.is_empty() {
        return Err(LabError::Teardown {
            prefix: prefix.to_string(),
            errors,
        });
    }
    match std::fs::remove_dir_all(&run_dir) {
        Ok(()) => done.dirs.push(run_dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(LabError::io("remove run dir", run_dir, e)),
    }
    Ok(done)
}

/// Names of the topologies that have a run directory under `run_root` (running, or
/// left behind by a crash): what `cozyplane lab down` without a name would remove.
pub fn known_topologies(run_root: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(run_root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LabError::io("list", run_root, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LabError::io("list", run_root, e))?;
        if let Some(name) = entry.file_name().to_str() {
            if validate_name(name).is_ok() && entry.path().is_dir() {
                out.push(name.to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Names under `/run/netns` that carry the prefix.
pub fn list_netns(prefix: &str) -> Result<Vec<String>> {
    let dir = Path::new(NETNS_RUN_DIR);
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LabError::io("list", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LabError::io("list", dir, e))?;
        if let Some(name) = entry.file_name().to_str() {
            if carries_prefix(name, prefix) {
                out.push(name.to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn kill_processes(
    state: &LabState,
    ids: &HashSet<NsId>,
    done: &mut Cleanup,
    errors: &mut Vec<String>,
) {
    // Tracked processes: ours only if the start time still matches (pid reuse).
    for p in &state.processes {
        let same = |pid| process::start_time(pid).ok().flatten() == Some(p.start_time);
        match process::kill_verified(p.pid, same) {
            Ok(true) => done.processes.push(p.pid),
            Ok(false) => {}
            Err(e) => errors.push(format!("kill {} ({}): {}", p.pid, p.program, Chain(&e))),
        }
    }
    // Everything else living in our namespaces (untracked, or children of tracked ones).
    if ids.is_empty() {
        return;
    }
    let found = match process::processes_in(ids) {
        Ok(f) => f,
        Err(e) => {
            errors.push(format!("scan /proc: {}", Chain(&e)));
            return;
        }
    };
    for pid in found {
        let inside = |pid| process::netns_of(pid).is_some_and(|id| ids.contains(&id));
        match process::kill_verified(pid, inside) {
            Ok(true) => done.processes.push(pid),
            Ok(false) => {}
            Err(e) => errors.push(format!("kill {pid}: {}", Chain(&e))),
        }
    }
}

/// Mount points (from `/proc/self/mountinfo`) under `/run/netns` carrying the prefix
/// or under the run directory: bind mounts stacked twice, or left without their file.
fn stray_mounts(prefix: &str, run_dir: &Path) -> Result<Vec<PathBuf>> {
    let path = Path::new("/proc/self/mountinfo");
    let info = std::fs::read_to_string(path).map_err(|e| LabError::io("read", path, e))?;
    Ok(parse_stray_mounts(&info, prefix, run_dir))
}

fn parse_stray_mounts(mountinfo: &str, prefix: &str, run_dir: &Path) -> Vec<PathBuf> {
    let netns_dir = Path::new(NETNS_RUN_DIR);
    let mut out: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| {
            let in_netns = p.parent() == Some(netns_dir)
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| carries_prefix(n, prefix));
            in_netns || p.starts_with(run_dir)
        })
        .collect();
    // Deepest first, so nested mounts come off before their parents.
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

fn remove_stray_mounts(prefix: &str, run_dir: &Path, done: &mut Cleanup, errors: &mut Vec<String>) {
    // A mount point can carry stacked mounts; each pass removes the top one.
    for _ in 0..8 {
        let mounts = match stray_mounts(prefix, run_dir) {
            Ok(m) => m,
            Err(e) => {
                errors.push(Chain(&e).to_string());
                return;
            }
        };
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            match umount2(&m, MntFlags::MNT_DETACH) {
                Ok(()) => done.mounts.push(m.clone()),
                Err(e) => {
                    errors.push(format!("umount {}: {}", m.display(), Chain(&e)));
                    return;
                }
            }
            if m.parent() == Some(Path::new(NETNS_RUN_DIR)) {
                let _ = std::fs::remove_file(&m);
            }
        }
    }
    errors.push(format!("mounts with prefix {prefix} keep coming back"));
}

/// Deletes links in the calling process's namespace whose name carries the prefix.
/// The lab puts none there; this catches whatever a user of the lab (a benchmark, a
/// future component) did. Runs on its own thread with its own small runtime, so it
/// works from sync code, from `Drop`, and from inside another runtime alike.
fn delete_host_links(prefix: &str) -> Result<Vec<String>> {
    let prefix = prefix.to_string();
    let run = move || -> Result<Vec<String>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LabError::io("start a runtime", "(host links)", e))?;
        rt.block_on(async move {
            let nl = NlHandle::current()?;
            let mut removed = Vec::new();
            for link in nl.list_links().await? {
                if carries_prefix(&link.name, &prefix) && nl.delete_link(link.index).await? {
                    removed.push(link.name);
                }
            }
            Ok(removed)
        })
    };
    std::thread::Builder::new()
        .name("cp-lab-links".into())
        .spawn(run)
        .map_err(|e| LabError::io("spawn thread", "(host links)", e))?
        .join()
        .map_err(|_| {
            LabError::io(
                "host link cleanup",
                "(host links)",
                std::io::Error::other("thread panicked"),
            )
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_only_our_mounts_deepest_first() {
        let info = "\
22 1 0:21 / /run rw - tmpfs tmpfs rw
30 22 0:4 net:[4026532300] /run/netns/lab1-node1 rw - nsfs nsfs rw
31 22 0:4 net:[4026532301] /run/netns/lab10-node1 rw - nsfs nsfs rw
32 22 0:4 net:[4026532302] /run/netns/other-lab1 rw - nsfs nsfs rw
33 22 0:30 / /run/cozyplane-lab/lab1/bpf rw - bpf bpf rw
34 33 0:31 / /run/cozyplane-lab/lab1/bpf/x rw - bpf bpf rw
35 22 0:32 / /run/cozyplane-lab/lab10 rw - tmpfs tmpfs rw
";
        let run_dir = Path::new("/run/cozyplane-lab/lab1");
        let got = parse_stray_mounts(info, "lab1", run_dir);
        let want: Vec<PathBuf> = [
            "/run/cozyplane-lab/lab1/bpf/x",
            "/run/cozyplane-lab/lab1/bpf",
            "/run/netns/lab1-node1",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn refuses_prefixes_that_would_match_too_much() {
        for bad in ["", "-", "a-b", "../x"] {
            let err = destroy_by_prefix_in(bad, Path::new("/nonexistent")).unwrap_err();
            assert!(matches!(err, LabError::InvalidSpec(_)), "{bad:?}: {err}");
        }
    }

    #[test]
    fn lists_topologies_by_their_run_dirs() {
        let root = tempfile::tempdir().unwrap();
        assert!(known_topologies(&root.path().join("missing"))
            .unwrap()
            .is_empty());
        for d in ["lab2", "lab1", "Not-a-lab"] {
            std::fs::create_dir(root.path().join(d)).unwrap();
        }
        std::fs::write(root.path().join("lab3"), "a file, not a run dir").unwrap();
        assert_eq!(known_topologies(root.path()).unwrap(), ["lab1", "lab2"]);
    }

    #[test]
    fn an_empty_cleanup_is_empty() {
        assert!(Cleanup::default().is_empty());
        let c = Cleanup {
            processes: vec![1],
            ..Cleanup::default()
        };
        assert!(!c.is_empty());
    }
}
