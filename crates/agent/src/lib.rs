//! The cozyplane node agent's core, kept free of the kernel and of a live
//! API server so every part is unit-tested. The agent's shape is
//! *watch → compile → sync*:
//!
//! * [`ipam`]: FabricIP allocation (name-as-claim, UID-offset walk, live
//!   reads only), over a [`ipam::ClaimStore`] (kube `Api<FabricIP>` or an
//!   in-memory store).
//! * [`compile`]: pure functions from Nodes + FabricIPs to the desired
//!   overlay entries ([`desired`] holds their plain Rust types: the one
//!   seam where they meet the datapath's map ABI).
//! * [`sync`]: diff-sync of one kernel map against the desired entries,
//!   pruning only what the caller owns.
//! * [`cni_handler`]: ADD/DEL/CHECK/STATUS/GC as a rollback-safe sequence
//!   of steps over the [`ipam::Ipam`], [`cni_handler::Plumber`] and
//!   [`cni_handler::DatapathWriter`] traits.
//! * [`runtime`]: the agent process that wires them to the kernel and the
//!   API server (`cozyplane agent`).

pub mod cni_handler;
pub mod compile;
pub mod desired;
pub mod explain_cli;
pub mod ipam;
pub mod runtime;
pub mod sync;
pub mod tenancy;
