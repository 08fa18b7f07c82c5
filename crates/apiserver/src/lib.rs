//! The cozyplane API server: a Kubernetes-conformant registry serving
//! `sdn.cozystack.io` (and, in standalone mode, the core kinds the agent,
//! controller and kpr need) over any [`cozyplane_store::Storage`].
//!
//! Layers, bottom-up: [`keys`] (storage layout) → [`registry`] (generic
//! REST semantics per [`cozyplane_api::kinds::KindInfo`]) → [`watch`] →
//! [`http`] (routing, negotiation) → [`connections`] (accept loop, limits)
//! → [`server`] (TLS, lifecycle) →
//! [`args`] (`cozyplane apiserver`).

pub mod args;
pub mod auth;
pub mod connections;
pub mod continuation;
pub mod core_kinds;
pub mod discovery;
pub mod hooks;
pub mod http;
pub mod keys;
pub mod limits;
pub mod meta;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod pod_strategy;
pub mod query;
pub mod quota;
pub mod registry;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod services;
pub mod status;
pub mod table;
pub mod tenancy;
pub mod tls;
pub mod watch;

pub use args::{run, ApiserverArgs, StorageKind};
pub use server::{RunningServer, ServerBuilder, ServerError, TlsSource};
