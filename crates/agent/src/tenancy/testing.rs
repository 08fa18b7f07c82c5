//! A [`VpcDirectory`] from plain tables, for the unit tests of the attach
//! path and the CNI handler.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;

use async_trait::async_trait;
use cozyplane_api::sdn::{VPCSpec, VPCStatus};
use cozyplane_api::VPC;
use kube::api::ObjectMeta;

use super::{AttachError, PodFacts, VpcDirectory};

/// A directory from plain tables.
#[derive(Default)]
pub struct Fake {
    /// (ns, name) -> (uid, annotation)
    pub pods: BTreeMap<(String, String), (String, Option<String>)>,
    /// (ns, name) -> labels (none: no labels)
    pub labels: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// (binding ns, vpc ns, vpc)
    pub bindings: Vec<(String, String, String)>,
    pub vpcs: BTreeMap<(String, String), VPC>,
    pub annotated: Mutex<Vec<(String, Vec<IpAddr>, String)>>,
}

#[async_trait]
impl VpcDirectory for Fake {
    async fn pod(&self, ns: &str, name: &str, uid: &str) -> Result<PodFacts, AttachError> {
        let key = (ns.to_string(), name.to_string());
        match self.pods.get(&key) {
            Some((u, a)) if u == uid => Ok(PodFacts {
                vpc: a.clone(),
                labels: self.labels.get(&key).cloned().unwrap_or_default(),
            }),
            _ => Err(AttachError::PodNotFound {
                namespace: ns.into(),
                name: name.into(),
                uid: uid.into(),
            }),
        }
    }
    async fn bound(&self, ns: &str, vns: &str, vpc: &str) -> Result<bool, AttachError> {
        Ok(self
            .bindings
            .iter()
            .any(|(b, n, v)| b == ns && n == vns && v == vpc))
    }
    async fn vpc(&self, ns: &str, name: &str) -> Result<Option<VPC>, AttachError> {
        Ok(self.vpcs.get(&(ns.into(), name.into())).cloned())
    }
    async fn annotate(
        &self,
        _ns: &str,
        name: &str,
        _uid: &str,
        ips: &[IpAddr],
        mac: &str,
    ) -> Result<(), AttachError> {
        self.annotated
            .lock()
            .unwrap()
            .push((name.into(), ips.to_vec(), mac.into()));
        Ok(())
    }
}

pub fn vpc(ns: &str, name: &str, cidrs: &[&str], vni: Option<i32>, phase: Option<&str>) -> VPC {
    VPC {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        spec: VPCSpec {
            cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            mtu: Some(1400),
        },
        status: Some(VPCStatus {
            vni,
            phase: phase.map(String::from),
            conditions: Vec::new(),
        }),
    }
}
