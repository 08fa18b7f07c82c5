//! cozyplane API types, validation and claim names. No I/O.
//!
//! * [`sdn`] and [`local`]: the API kinds as kube-derive types, so every crate can
//!   use `kube::Api<VPC>`, `kube::Api<FabricIP>`… directly.
//! * [`catalog`]: [`sdn_kinds`] / [`local_kinds`], the [`kinds::KindInfo`] data the
//!   generic API server registers (schema, scope, names, printer columns, field
//!   selectors, validation).
//! * [`validation`]: the rules (VPC CIDRs/MTU; Port, ServiceVIP and FabricIP claim
//!   names, canonical addresses, immutability).
//! * [`names`]: claim names (`v<vni>.<ip>`, `sv<vni>.<ip>`, `f-<ip>`) and the
//!   datapath's 16-byte address form.
//! * [`labels`]: annotation, label and finalizer keys.
//! * [`selector`]: evaluating a `LabelSelector` against labels.
pub mod catalog;
pub mod cilium;
pub mod kinds;
pub mod labels;
pub mod local;
pub mod names;
pub mod sdn;
pub mod selector;
pub mod validation;

pub use catalog::{local_kinds, sdn_kinds};
pub use local::FabricIP;
pub use sdn::{
    FloatingIP, HostFirewall, Port, SecurityGroup, ServiceVIP, VNIClaim, VPCBinding, VPCGateway,
    VPCPeering, VPC,
};
