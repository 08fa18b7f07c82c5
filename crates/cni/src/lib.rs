//! The cozyplane CNI plugin (CNI spec 0.3.0 – 1.1.0).
//!
//! The plugin binary (`cozyplane-cni`, installed as `/opt/cni/bin/cozyplane`)
//! is small and synchronous and holds no API credentials: it validates what
//! the runtime gave it and asks the node agent over a local unix socket,
//! because the agent owns IPAM, veths and the eBPF maps.
//!
//! The library is shared with the agent, which serves [`proto`] using
//! [`server::serve_connection`], so both sides use one framing and one set of
//! types.
//!
//! - [`config`]: the network config on stdin.
//! - [`env`]: `CNI_*` variables and `CNI_ARGS`.
//! - [`proto`], [`client`], [`server`]: the agent protocol.
//! - [`types`], [`result`]: the neutral result and its per-version JSON.
//! - [`plugin`]: one invocation, end to end.

pub mod client;
pub mod config;
pub mod env;
pub mod error;
pub mod plugin;
pub mod proto;
pub mod result;
pub mod server;
pub mod types;
pub mod version;

pub use error::{code, CniError};
