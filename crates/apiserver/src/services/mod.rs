//! core/v1 Services as kube-apiserver serves them: defaulting and
//! validation ([`validate`]), cluster IP and node port allocation with the
//! write ([`alloc`]), the ranges they come from ([`config`]), and the
//! repair of allocations a crash left out of step ([`repair`]), and the
//! `kubernetes` Service with its EndpointSlice ([`kubernetes`]).
//!
//! Standalone mode only: behind kube-apiserver, Services are its own.

pub mod alloc;
pub mod config;
pub mod kubernetes;
pub mod repair;
pub mod validate;

use std::sync::Arc;
use std::time::Duration;

pub use alloc::ServiceAllocator;
pub use config::{Family, PortRange, ServiceCidrs, ServiceFlagError};

use crate::hooks::{Allocate, KindHooks};

/// The hooks of core/v1 Services; with an allocator when the server
/// allocates (the defaulting applies either way).
pub fn hooks(allocator: Option<Arc<ServiceAllocator>>) -> KindHooks {
    KindHooks {
        prepare: Some(validate::prepare),
        prepare_update: Some(validate::prepare_update),
        allocate: allocator.map(|a| a as Arc<dyn Allocate>),
        ..KindHooks::default()
    }
}

/// kube's repair interval for service allocations.
pub const DEFAULT_REPAIR_INTERVAL: Duration = Duration::from_secs(180);
/// How old a claim without its Service must be before repair deletes it.
pub const DEFAULT_REPAIR_GRACE: Duration = Duration::from_secs(60);

/// The server's Service settings.
#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// `--service-cluster-ip-range`.
    pub cidrs: ServiceCidrs,
    /// `--service-node-port-range`.
    pub node_ports: PortRange,
    /// How often the repair pass runs.
    pub repair_interval: Duration,
    /// How old an orphaned claim must be before repair deletes it.
    pub repair_grace: Duration,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            cidrs: ServiceCidrs::default(),
            node_ports: PortRange::default(),
            repair_interval: DEFAULT_REPAIR_INTERVAL,
            repair_grace: DEFAULT_REPAIR_GRACE,
        }
    }
}
