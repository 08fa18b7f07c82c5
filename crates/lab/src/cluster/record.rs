//! `cluster.json` in the lab's run directory: what `up` started, for `status`.
//!
//! The topology's `state.json` knows *that* processes were started (for
//! teardown); this record knows *what* each one is (role, place, health
//! endpoint) and where the kubeconfig is. It lives in the run directory, so
//! `down` removes it with everything else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cozyplane_errors::Chain;
use serde::{Deserialize, Serialize};

use super::error::{ClusterError, ClusterResult};

/// One process of the lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    /// `apiserver`, `relay`, `agent` or `controller`.
    pub role: String,
    /// The namespace it runs in (`<lab>-fabric`, `<lab>-node1`, …).
    pub place: String,
    /// Its pid.
    pub pid: i32,
    /// Its start time (clock ticks since boot), so a reused pid is not mistaken for it.
    pub start_time: u64,
    /// Where its `/readyz` answers, inside `place` (none for the relay and the API server).
    pub readyz: Option<SocketAddr>,
    /// Its log file.
    pub log: PathBuf,
}

impl Component {
    /// True if the process is still the one that was started and has not exited.
    /// An exited process nobody reaped yet (a zombie: `up` has exited, so its
    /// processes belong to init) has the same pid and start time but is gone.
    pub fn alive(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X");
        !zombie && crate::process::start_time(self.pid).is_ok_and(|t| t == Some(self.start_time))
    }
}

/// What `lab up` made, beyond the topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// The lab name.
    pub name: String,
    /// The node names, in order.
    pub nodes: Vec<String>,
    /// The host-side kubeconfig (`https://127.0.0.1:<port>`).
    pub kubeconfig: PathBuf,
    /// The processes.
    pub components: Vec<Component>,
    /// The Service CIDR(s) the API server allocates cluster IPs from
    /// (`--service-cluster-ip-range`), for the components that need them.
    /// Empty in records of labs started before it was kept.
    #[serde(default)]
    pub service_cidrs: Vec<String>,
}

impl ClusterRecord {
    /// `<run_dir>/cluster.json`.
    pub fn path(run_dir: &Path) -> PathBuf {
        run_dir.join("cluster.json")
    }

    /// Writes the record atomically (temp file + rename).
    pub fn save(&self, run_dir: &Path) -> ClusterResult<()> {
        let path = Self::path(run_dir);
        let tmp = run_dir.join("cluster.json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(|e| ClusterError::BadFile {
            path: path.clone(),
            detail: Chain(&e).to_string(),
        })?;
        std::fs::write(&tmp, text).map_err(|e| ClusterError::io("write", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| ClusterError::io("rename", &path, e))
    }

    /// Reads the record of the lab whose run directory is `run_dir`; `None` if there is none.
    pub fn load(run_dir: &Path) -> ClusterResult<Option<ClusterRecord>> {
        let path = Self::path(run_dir);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ClusterError::io("read", &path, e)),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| ClusterError::BadFile {
                path,
                detail: Chain(&e).to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reports_absence() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(ClusterRecord::load(dir.path()).expect("load"), None);
        let rec = ClusterRecord {
            name: "t".into(),
            nodes: vec!["t-node1".into()],
            kubeconfig: dir.path().join("kubeconfig"),
            components: vec![Component {
                role: "agent".into(),
                place: "t-node1".into(),
                pid: 1,
                start_time: 2,
                readyz: Some("127.0.0.1:9411".parse().expect("addr")),
                log: dir.path().join("agent.log"),
            }],
            service_cidrs: vec!["10.96.0.0/16".into()],
        };
        rec.save(dir.path()).expect("save");
        assert_eq!(ClusterRecord::load(dir.path()).expect("load"), Some(rec));
        std::fs::write(ClusterRecord::path(dir.path()), "{").expect("write");
        assert!(matches!(
            ClusterRecord::load(dir.path()),
            Err(ClusterError::BadFile { .. })
        ));
    }

    #[test]
    fn our_own_process_is_alive_and_a_wrong_start_time_is_not() {
        let pid = i32::try_from(std::process::id()).expect("pid");
        let start_time = crate::process::start_time(pid)
            .expect("stat")
            .expect("running");
        let mut c = Component {
            role: "x".into(),
            place: "host".into(),
            pid,
            start_time,
            readyz: None,
            log: PathBuf::new(),
        };
        assert!(c.alive());
        c.start_time += 1;
        assert!(!c.alive(), "a reused pid must not count as alive");

        // An exited, not yet reaped child (a zombie) is not alive either.
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let zpid = i32::try_from(child.id()).expect("pid");
        let zstart = crate::process::start_time(zpid)
            .expect("stat")
            .expect("exists");
        let z = Component {
            pid: zpid,
            start_time: zstart,
            ..c.clone()
        };
        // Wait until it has exited without reaping it (its stat says Z).
        crate::wait_for(
            "the child to exit",
            std::time::Duration::from_secs(5),
            || {
                std::fs::read_to_string(format!("/proc/{zpid}/stat"))
                    .is_ok_and(|s| s.contains(") Z"))
            },
        )
        .expect("zombie");
        assert!(!z.alive(), "a zombie is not alive");
        child.wait().expect("reap");
    }
}
