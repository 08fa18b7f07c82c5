//! Kernel networking outside BPF: network namespaces, links (veth, VXLAN, bridge),
//! addresses, routes, neighbours and sysctls, plus the high-level [`plumb`] /
//! [`unplumb`] of a pod interface that the node agent calls.
//!
//! Everything goes through rtnetlink (async, on the caller's tokio runtime). Work in
//! another namespace happens either through an [`NlHandle`] whose socket was opened in
//! that namespace, or in a closure run on a throwaway thread that entered it
//! ([`Netns::run`]); no tokio worker ever changes namespace. Deletions are idempotent:
//! "not found" is success.
//!
//! This module loads no BPF: the agent attaches its programs to the interfaces
//! [`plumb`] reports (for pod veths as `bpf` filters, whose netlink half is here).

mod addr;
mod error;
mod handle;
mod link;
mod netns;
mod plumb;
mod route;
mod rule;
pub mod sysctl;
mod tc;
mod types;

pub use error::{Error, Result};
pub use handle::{NetnsHandle, NlHandle};
pub use link::{
    validate_ifname, Encapsulation, LinkInfo, OverlaySpec, VethSpec, MAX_ALIAS_LEN, MAX_IFNAME_LEN,
};
pub use netns::{create_named_netns, delete_named_netns, named_netns_path, Netns, NETNS_RUN_DIR};
pub use plumb::{
    configure_pair, create_pair, discard_pair, host_veth_name, plumb, plumb_bridge, unplumb,
    unplumb_bridge, Pair, PairRequest, PlumbRequest, Plumbed, HOST_VETH_PREFIX, POD_GATEWAY_V4,
    POD_GATEWAY_V6,
};
pub use route::{Route, Scope};
pub use rule::{LOCAL_RULE_PRIORITY, REFUSE_RULE_PRIORITY};
pub use tc::{BpfFilter, BpfFilterSpec, TcHook};
pub use types::{IpPrefix, MacAddr};
