//! `/proc/sys/net` sysctls.
//!
//! Files under `/proc/sys/net` show the namespace of the *thread that opens them*, so
//! these functions act on the calling thread's namespace. To change another namespace,
//! call them inside [`super::Netns::run`] / [`super::Netns::run_async`] (one thread hop
//! for a whole batch).
//!
//! Keys are given as path components, never as a dotted string, because interface names
//! may contain dots (`eth0.100`): `["ipv4", "conf", "eth0.100", "rp_filter"]`.

use std::path::PathBuf;

use super::error::{Error, Result};
use super::link::validate_ifname;

/// Which `conf/<which>/…` directory to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfTarget<'a> {
    /// `conf/all`.
    All,
    /// `conf/default` (inherited by links created later).
    Default,
    /// `conf/<device>`.
    Dev(&'a str),
}

impl ConfTarget<'_> {
    fn component(&self) -> Result<&str> {
        match self {
            ConfTarget::All => Ok("all"),
            ConfTarget::Default => Ok("default"),
            ConfTarget::Dev(d) => {
                validate_ifname(d)?;
                Ok(d)
            }
        }
    }
}

fn key_path(components: &[&str]) -> Result<(String, PathBuf)> {
    let mut path = PathBuf::from("/proc/sys/net");
    for c in components {
        if c.is_empty() || *c == "." || *c == ".." || c.contains('/') {
            return Err(Error::invalid("sysctl key", format!("{components:?}")));
        }
        path.push(c);
    }
    Ok((format!("net/{}", components.join("/")), path))
}

/// Writes `value` to `/proc/sys/net/<components…>` in the calling thread's namespace.
pub fn write_net(components: &[&str], value: &str) -> Result<()> {
    let (key, path) = key_path(components)?;
    std::fs::write(&path, value).map_err(|source| Error::Sysctl { key, source })
}

/// Reads `/proc/sys/net/<components…>` (trailing newline trimmed).
pub fn read_net(components: &[&str]) -> Result<String> {
    let (key, path) = key_path(components)?;
    std::fs::read_to_string(&path)
        .map(|s| s.trim_end().to_string())
        .map_err(|source| Error::Sysctl { key, source })
}

fn flag(on: bool) -> &'static str {
    if on {
        "1"
    } else {
        "0"
    }
}

/// `net.ipv4.ip_forward`.
pub fn set_ipv4_forwarding(on: bool) -> Result<()> {
    write_net(&["ipv4", "ip_forward"], flag(on))
}

/// `net.ipv6.conf.<t>.forwarding`.
pub fn set_ipv6_forwarding(t: ConfTarget<'_>, on: bool) -> Result<()> {
    write_net(&["ipv6", "conf", t.component()?, "forwarding"], flag(on))
}

/// `net.ipv4.conf.<t>.forwarding` (per device: lets the kernel route packets that
/// arrive on it).
pub fn set_ipv4_conf_forwarding(t: ConfTarget<'_>, on: bool) -> Result<()> {
    write_net(&["ipv4", "conf", t.component()?, "forwarding"], flag(on))
}

/// `net.ipv4.conf.<t>.rp_filter` (0 = off, 1 = strict, 2 = loose). The kernel uses
/// the maximum of `all` and the device, so "off" needs both (lesson 13).
pub fn set_rp_filter(t: ConfTarget<'_>, mode: u8) -> Result<()> {
    write_net(
        &["ipv4", "conf", t.component()?, "rp_filter"],
        &mode.to_string(),
    )
}

/// `net.ipv4.conf.<t>.proxy_arp`: the host veth answers ARP for the pod's on-link
/// gateway 169.254.1.1.
pub fn set_proxy_arp(t: ConfTarget<'_>, on: bool) -> Result<()> {
    write_net(&["ipv4", "conf", t.component()?, "proxy_arp"], flag(on))
}

/// `net.ipv4.neigh.<dev>.proxy_delay`: proxy ARP answers are otherwise delayed by up
/// to 0.8 s, which a new pod's first packet would pay.
pub fn set_proxy_delay(t: ConfTarget<'_>, jiffies: u32) -> Result<()> {
    write_net(
        &["ipv4", "neigh", t.component()?, "proxy_delay"],
        &jiffies.to_string(),
    )
}

/// `net.ipv6.conf.<t>.disable_ipv6`.
pub fn set_disable_ipv6(t: ConfTarget<'_>, disabled: bool) -> Result<()> {
    write_net(
        &["ipv6", "conf", t.component()?, "disable_ipv6"],
        flag(disabled),
    )
}

/// `net.ipv6.conf.<t>.accept_ra` (0 = never, 1 = unless forwarding, 2 = always).
pub fn set_accept_ra(t: ConfTarget<'_>, mode: u8) -> Result<()> {
    write_net(
        &["ipv6", "conf", t.component()?, "accept_ra"],
        &mode.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cannot_escape_proc_sys_net() {
        assert!(key_path(&["ipv4", "..", "x"]).is_err());
        assert!(key_path(&["ipv4/conf"]).is_err());
        assert!(key_path(&["ipv4", ""]).is_err());
        let (key, path) = key_path(&["ipv4", "conf", "eth0.100", "rp_filter"]).unwrap();
        assert_eq!(key, "net/ipv4/conf/eth0.100/rp_filter");
        assert_eq!(
            path,
            PathBuf::from("/proc/sys/net/ipv4/conf/eth0.100/rp_filter")
        );
        assert!(ConfTarget::Dev("a/b").component().is_err());
    }

    #[test]
    fn reads_a_real_sysctl() {
        // Readable without privileges in any namespace.
        let v = read_net(&["ipv4", "ip_forward"]).unwrap();
        assert!(v == "0" || v == "1", "{v:?}");
        let err = read_net(&["ipv4", "conf", "cpt-no-such-dev", "rp_filter"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("net/ipv4/conf/cpt-no-such-dev/rp_filter"),
            "{err}"
        );
    }
}
