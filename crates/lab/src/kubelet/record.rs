//! The per-pod record in the kubelet's state dir, so a restarted kubelet
//! knows what its predecessor made.
//!
//! `<state>/pods/<uid>/record.json` is written (atomically) *before* each
//! thing it describes is made: the netns and container id (and `needs_del`)
//! before the netns and the CNI ADD, the workload pid and start time right after the spawn.
//! A kubelet that starts finds every record: pods still wanted are adopted
//! (old workload killed through a pidfd after checking its start time,
//! network kept, workload restarted), the others are torn down (DEL, netns
//! removed, record deleted). The same directory holds the pod's workload log
//! and termination-log file.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::status::Observed;

/// What the kubelet made for one pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    /// Pod uid.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The named netns (none for hostNetwork pods).
    pub netns: Option<String>,
    /// The CNI container id.
    pub container_id: String,
    /// The CNI ADD result once ADD succeeded (its presence means the network is up).
    pub cni_result: Option<serde_json::Value>,
    /// An ADD was attempted and no DEL has succeeded since: the pod's teardown must DEL.
    #[serde(default)]
    pub needs_del: bool,
    /// The pod addresses from that result.
    pub pod_ips: Vec<IpAddr>,
    /// The running workload: pid and start time (clock ticks since boot).
    pub workload: Option<(i32, u64)>,
    /// The last reported status (restart count, terminal state survive a kubelet restart).
    pub observed: Option<Observed>,
}

impl PodRecord {
    /// The directory of pod `uid` under `state_dir`.
    pub fn dir(state_dir: &Path, uid: &str) -> PathBuf {
        state_dir.join("pods").join(uid)
    }

    /// Writes the record atomically (temp file + rename).
    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let dir = Self::dir(state_dir, &self.uid);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(".record.json.tmp");
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join("record.json"))
    }

    /// Every record under `state_dir`; unreadable ones are returned as errors by path.
    pub fn load_all(state_dir: &Path) -> (Vec<PodRecord>, Vec<(PathBuf, String)>) {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        let Ok(entries) = std::fs::read_dir(state_dir.join("pods")) else {
            return (ok, bad);
        };
        for e in entries.flatten() {
            let path = e.path().join("record.json");
            match std::fs::read(&path) {
                Ok(text) => match serde_json::from_slice::<PodRecord>(&text) {
                    Ok(r) => ok.push(r),
                    Err(err) => bad.push((path, err.to_string())),
                },
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    // A directory without a record: a pod whose record was never
                    // written (nothing was made for it) or whose removal was cut short.
                    let _ = std::fs::remove_dir_all(e.path());
                }
                Err(err) => bad.push((path, err.to_string())),
            }
        }
        (ok, bad)
    }

    /// Removes the pod's directory (record, log, termination log).
    pub fn remove(state_dir: &Path, uid: &str) -> std::io::Result<()> {
        match std::fs::remove_dir_all(Self::dir(state_dir, uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_leftover_dirs_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = PodRecord {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "p".into(),
            netns: Some("lab-node1-pu1".into()),
            container_id: "u1".into(),
            cni_result: Some(serde_json::json!({"ips": [{"address": "10.244.0.2/32"}]})),
            needs_del: true,
            pod_ips: vec!["10.244.0.2".parse().expect("ip")],
            workload: Some((42, 4242)),
            observed: None,
        };
        r.save(dir.path()).expect("save");
        std::fs::create_dir_all(PodRecord::dir(dir.path(), "empty")).expect("mkdir");
        std::fs::create_dir_all(PodRecord::dir(dir.path(), "bad")).expect("mkdir");
        std::fs::write(PodRecord::dir(dir.path(), "bad").join("record.json"), "{").expect("write");
        let (ok, bad) = PodRecord::load_all(dir.path());
        assert_eq!(ok, vec![r]);
        assert_eq!(bad.len(), 1);
        assert!(!PodRecord::dir(dir.path(), "empty").exists());
        PodRecord::remove(dir.path(), "u1").expect("remove");
        PodRecord::remove(dir.path(), "u1").expect("remove twice");
        assert!(!PodRecord::dir(dir.path(), "u1").exists());
    }
}
