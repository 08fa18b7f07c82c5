//! The state file: what a topology made, written *before* making it, so teardown after
//! a crash knows what to remove.
//!
//! `<run_root>/<name>/state.json` is rewritten atomically (temporary file + rename)
//! after every change, so a crash leaves either the old or the new version, never a
//! torn one. It is only one of two sources for teardown: namespaces are also found by
//! listing `/run/netns`, and processes by the namespace they live in, so a lost state
//! file loses nothing but the records discovery cannot recover (pin dirs, cgroups).
//!
//! The format has room for what later lab components make: bpffs pin directories
//! (`pin_dirs`) and cgroups (`cgroups`). Unknown fields are ignored and missing ones
//! default, so older and newer versions of the lab can clean up after each other.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};

/// File name of the state file inside the run directory.
pub const STATE_FILE: &str = "state.json";

/// Current format version.
pub const STATE_VERSION: u32 = 1;

/// Everything a topology made that teardown must undo.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LabState {
    /// Format version ([`STATE_VERSION`]).
    pub version: u32,
    /// The topology name (prefix).
    pub name: String,
    /// Named namespaces (under `/run/netns`), recorded before they are created.
    pub netns: Vec<String>,
    /// Processes started in the lab.
    pub processes: Vec<TrackedProcess>,
    /// bpffs pin directories to remove (for agents started by the lab).
    pub pin_dirs: Vec<PathBuf>,
    /// cgroup directories to remove.
    pub cgroups: Vec<PathBuf>,
}

/// A process the lab started. The start time (in clock ticks since boot, field 22 of
/// `/proc/<pid>/stat`) tells the process apart from a later one that reuses its pid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackedProcess {
    /// The pid.
    pub pid: i32,
    /// Its start time, clock ticks since boot.
    pub start_time: u64,
    /// The node (or other lab namespace) it runs in.
    pub place: String,
    /// The program, for humans reading the file.
    pub program: String,
}

impl LabState {
    /// An empty state for topology `name`.
    pub fn new(name: &str) -> LabState {
        LabState {
            version: STATE_VERSION,
            name: name.to_string(),
            ..LabState::default()
        }
    }

    /// The state file inside `run_dir`.
    pub fn path(run_dir: &Path) -> PathBuf {
        run_dir.join(STATE_FILE)
    }

    /// Reads the state file in `run_dir`; `None` if there is none.
    pub fn load(run_dir: &Path) -> Result<Option<LabState>> {
        let path = LabState::path(run_dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(LabError::io("read", path, e)),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| LabError::StateFile { path, source })
    }

    /// Writes the state file in `run_dir` atomically.
    pub fn save(&self, run_dir: &Path) -> Result<()> {
        let path = LabState::path(run_dir);
        let tmp = run_dir.join(format!(".{STATE_FILE}.tmp"));
        let json = serde_json::to_vec_pretty(self).map_err(|source| LabError::StateFile {
            path: path.clone(),
            source,
        })?;
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            LabError::io("write", &path, e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(LabState::load(dir.path()).unwrap(), None);
        let mut s = LabState::new("lab");
        s.netns = vec!["lab-fabric".into(), "lab-node1".into()];
        s.processes.push(TrackedProcess {
            pid: 42,
            start_time: 1234,
            place: "lab-node1".into(),
            program: "sleep".into(),
        });
        s.pin_dirs.push("/sys/fs/bpf/lab-node1".into());
        s.save(dir.path()).unwrap();
        assert_eq!(LabState::load(dir.path()).unwrap(), Some(s.clone()));
        s.processes.clear();
        s.save(dir.path()).unwrap();
        assert_eq!(LabState::load(dir.path()).unwrap(), Some(s));
        // Only the state file remains: the temporary one was renamed over it.
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 1);
    }

    #[test]
    fn tolerates_unknown_and_missing_fields() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            LabState::path(dir.path()),
            r#"{"name":"lab","netns":["lab-node1"],"future_field":[1,2]}"#,
        )
        .unwrap();
        let s = LabState::load(dir.path()).unwrap().unwrap();
        assert_eq!(s.netns, ["lab-node1"]);
        assert!(s.processes.is_empty());
    }

    #[test]
    fn a_corrupt_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(LabState::path(dir.path()), "{not json").unwrap();
        let err = LabState::load(dir.path()).unwrap_err();
        assert!(matches!(err, LabError::StateFile { .. }), "{err}");
        assert!(err.to_string().contains("state.json"), "{err}");
    }
}
