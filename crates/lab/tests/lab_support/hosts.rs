//! The lab's network namespaces as hosts to run things in (the external
//! host, a node, a pod's netns), and the probe client run there.

use std::path::Path;
use std::process::Output;

use cozyplane_datapath::netlink::{named_netns_path, Netns};
use cozyplane_lab::{exec_in, LabHost};
use serde_json::{json, Value};

use super::text;

/// A named network namespace of the lab.
pub struct Ns(pub String, pub Netns);

impl Ns {
    /// Opens `/run/netns/<name>`.
    pub fn open(name: &str) -> Ns {
        let ns = Netns::open(named_netns_path(name))
            .unwrap_or_else(|e| panic!("open netns {name}: {e}"));
        Ns(name.to_string(), ns)
    }
}

impl LabHost for Ns {
    fn name(&self) -> &str {
        &self.0
    }
    fn netns(&self) -> &Netns {
        &self.1
    }
}

/// Runs `cozyplane probe client --plan` with `checks` in `ns` once: its
/// report (Null if it printed none) and its output.
pub fn probe_in(bin: &Path, ns: &Ns, checks: &[Value]) -> (Value, Output) {
    let plan = json!({ "checks": checks }).to_string();
    let out = exec_in(
        ns,
        &[
            &bin.display().to_string(),
            "probe",
            "client",
            "--plan",
            &plan,
        ],
    )
    .expect("run probe client");
    let report = text(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    (report, out)
}
