//! Shared helpers of the BPF_PROG_TEST_RUN tests: private pin directories,
//! packet crafting with real checksums, and a runner. The tests gate on root
//! with the test kit's `needs!()` (re-exported here).
#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::CString;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use aya::programs::{TestRun, TestRunOptions};
use cozyplane_datapath::{Datapath, Object, Program};
pub use cozyplane_testkit::needs;

pub const TC_ACT_OK: i32 = 0;
pub const TC_ACT_SHOT: i32 = 2;
pub const TC_ACT_REDIRECT: i32 = 7;
/// TCX_NEXT / TC_ACT_UNSPEC: "not mine, pass it on".
pub const CP_PASS: i32 = -1;

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;

/// CRC32c (Castagnoli), SCTP's checksum (RFC 9260 appendix B), bit by bit:
/// the reference the datapath's incremental update is checked against.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82f6_3b78 & (0u32.wrapping_sub(crc & 1)));
        }
    }
    !crc
}

/// An SCTP packet (common header + `payload` as one DATA-shaped chunk)
/// with its CRC32c, stored as SCTP stores it (little endian).
pub fn sctp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&0x5c70_0001u32.to_be_bytes()); // verification tag
    let mut chunk = vec![0u8, 0x03]; // DATA, B|E
    chunk.extend_from_slice(&((4 + payload.len()) as u16).to_be_bytes());
    chunk.extend_from_slice(payload);
    while chunk.len() % 4 != 0 {
        chunk.push(0);
    }
    h.extend_from_slice(&chunk);
    let c = crc32c(&h);
    h[8..12].copy_from_slice(&c.to_le_bytes());
    h
}

/// Whether an SCTP packet's CRC32c is right (computed over it with the
/// CRC field zeroed).
pub fn sctp_crc_ok(l4: &[u8]) -> bool {
    if l4.len() < 12 {
        return false;
    }
    let mut z = l4.to_vec();
    z[8..12].fill(0);
    crc32c(&z).to_le_bytes() == l4[8..12]
}

/// A private bpffs mounted for one test (the host's /sys/fs/bpf may not be
/// mounted, and by-name pins must never leak between tests), unmounted and
/// removed on drop. Pins go to `<mount>/pins`, created by the loader.
pub struct PinDir {
    mount: PathBuf,
    pins: PathBuf,
}

impl PinDir {
    pub fn new(test: &str) -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let mount = std::env::temp_dir().join(format!(
            "cp-bpffs-{}-{}-{}",
            test,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        cozyplane_datapath::ensure_bpffs(&mount).expect("mount a private bpffs");
        let pins = mount.join("pins");
        Self { mount, pins }
    }

    pub fn path(&self) -> &Path {
        &self.pins
    }

    pub fn mount(&self) -> &Path {
        &self.mount
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        remove_tree(&self.pins);
        if let Ok(target) = CString::new(self.mount.as_os_str().as_encoded_bytes()) {
            // SAFETY: `target` is a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// bpffs does not support recursive removal in one call; unlink bottom-up.
pub fn remove_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                remove_tree(&p);
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Load the test build into a fresh pin dir.
pub fn load_test(test: &str) -> (PinDir, Datapath) {
    let pins = PinDir::new(test);
    let dp = Datapath::load_object(Object::TestHooks, pins.path()).expect("load test object");
    (pins, dp)
}

/// Registers a local pod on net 0 as the CNI handler does: its host veth
/// (`cp_ports`, fail closed without it) and its endpoint (`cp_locals`).
pub fn add_local_pod(
    dp: &mut Datapath,
    ifindex: u32,
    ip: impl Into<cozyplane_datapath::abi::Addr128>,
    mac: [u8; 6],
) {
    use cozyplane_datapath::abi::{Endpoint, EpKey, Port};
    dp.ports
        .insert(&ifindex, &Port { net: 0, flags: 0 })
        .unwrap();
    dp.locals
        .insert(
            &EpKey::new(0, ip),
            &Endpoint {
                ifindex,
                mac,
                flags: 0,
            },
        )
        .unwrap();
}

/// A crafted `struct __sk_buff` context (192 bytes on this kernel).
#[derive(Default, Clone, Copy)]
pub struct Ctx {
    pub mark: u32,
    pub ingress_ifindex: u32,
    pub ifindex: u32,
    pub cb: [u32; 5],
}

impl Ctx {
    fn bytes(&self) -> [u8; 192] {
        let mut b = [0u8; 192];
        b[8..12].copy_from_slice(&self.mark.to_ne_bytes());
        b[36..40].copy_from_slice(&self.ingress_ifindex.to_ne_bytes());
        b[40..44].copy_from_slice(&self.ifindex.to_ne_bytes());
        for (i, w) in self.cb.iter().enumerate() {
            b[48 + 4 * i..52 + 4 * i].copy_from_slice(&w.to_ne_bytes());
        }
        b
    }
}

/// Result of one run: verdict and the packet as the program left it.
pub struct Run {
    pub verdict: i32,
    pub data: Vec<u8>,
    /// `skb->mark` as the program left it.
    pub mark: u32,
}

pub fn run(dp: &mut Datapath, prog: Program, frame: &[u8], ctx: Ctx) -> Run {
    let p = dp.program_mut(prog).expect("program");
    let ctx_in = ctx.bytes();
    let mut ctx_out = [0u8; 192];
    let mut out = vec![0u8; frame.len() + 256];
    let res = p
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx_in),
            ctx_out: Some(&mut ctx_out),
            ..TestRunOptions::default()
        })
        .expect("BPF_PROG_TEST_RUN");
    out.truncate(res.data_size_out as usize);
    Run {
        verdict: res.return_value as i32,
        data: out,
        mark: u32::from_ne_bytes([ctx_out[8], ctx_out[9], ctx_out[10], ctx_out[11]]),
    }
}

pub const POD_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x02];
pub const GW_MAC: [u8; 6] = [0xee, 0xee, 0xee, 0xee, 0xee, 0xee];

/// The one's-complement Internet checksum over `data`, folded.
pub fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for ch in data.chunks(2) {
        let w = if ch.len() == 2 {
            u16::from_be_bytes([ch[0], ch[1]])
        } else {
            u16::from_be_bytes([ch[0], 0])
        };
        sum += u32::from(w);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(12 + l4.len());
    buf.extend_from_slice(&src.octets());
    buf.extend_from_slice(&dst.octets());
    buf.push(0);
    buf.push(proto);
    buf.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    buf.extend_from_slice(l4);
    csum(&buf)
}

/// An IPv4 packet description.
#[derive(Clone, Debug)]
pub struct Ip4 {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    /// ICMP type (8 request, 0 reply); the id is `sport`.
    pub icmp_type: u8,
    pub payload: Vec<u8>,
    /// Leave the UDP checksum at 0 ("none").
    pub udp_no_csum: bool,
    /// TCP flags (PSH|ACK unless set).
    pub tcp_flags: u8,
}

impl Ip4 {
    pub fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self::new(src, dst, PROTO_TCP, sport, dport)
    }
    pub fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self::new(src, dst, PROTO_UDP, sport, dport)
    }
    pub fn icmp_echo(src: Ipv4Addr, dst: Ipv4Addr, id: u16, reply: bool) -> Self {
        let mut p = Self::new(src, dst, PROTO_ICMP, id, 0);
        p.icmp_type = if reply { 0 } else { 8 };
        p
    }
    fn new(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, sport: u16, dport: u16) -> Self {
        Self {
            src,
            dst,
            proto,
            sport,
            dport,
            icmp_type: 8,
            payload: b"cozyplane test payload!".to_vec(),
            udp_no_csum: false,
            tcp_flags: 0x18,
        }
    }

    /// The Ethernet frame, with every checksum correct.
    pub fn frame(&self, dst_mac: [u8; 6], src_mac: [u8; 6]) -> Vec<u8> {
        let l4 = match self.proto {
            PROTO_TCP => {
                let mut h = vec![0u8; 20];
                h[0..2].copy_from_slice(&self.sport.to_be_bytes());
                h[2..4].copy_from_slice(&self.dport.to_be_bytes());
                h[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
                h[12] = 5 << 4;
                h[13] = self.tcp_flags;
                h[14..16].copy_from_slice(&64240u16.to_be_bytes());
                h.extend_from_slice(&self.payload);
                let c = pseudo_sum(self.src, self.dst, PROTO_TCP, &h);
                h[16..18].copy_from_slice(&c.to_be_bytes());
                h
            }
            PROTO_SCTP => sctp(self.sport, self.dport, &self.payload),
            PROTO_UDP => {
                let mut h = vec![0u8; 8];
                h[0..2].copy_from_slice(&self.sport.to_be_bytes());
                h[2..4].copy_from_slice(&self.dport.to_be_bytes());
                let len = (8 + self.payload.len()) as u16;
                h[4..6].copy_from_slice(&len.to_be_bytes());
                h.extend_from_slice(&self.payload);
                if !self.udp_no_csum {
                    let mut c = pseudo_sum(self.src, self.dst, PROTO_UDP, &h);
                    if c == 0 {
                        c = 0xffff;
                    }
                    h[6..8].copy_from_slice(&c.to_be_bytes());
                }
                h
            }
            _ => {
                let mut h = vec![0u8; 8];
                h[0] = self.icmp_type;
                h[4..6].copy_from_slice(&self.sport.to_be_bytes());
                h[6..8].copy_from_slice(&1u16.to_be_bytes());
                h.extend_from_slice(&self.payload);
                let c = csum(&h);
                h[2..4].copy_from_slice(&c.to_be_bytes());
                h
            }
        };
        let mut ip = vec![0u8; 20];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = self.proto;
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&self.dst.octets());
        let c = csum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());

        let mut f = Vec::with_capacity(14 + ip.len() + l4.len());
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&l4);
        f
    }
}

/// What a frame says, parsed back, with checksum validity.
#[derive(Debug)]
pub struct Parsed {
    pub dst_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub ip_csum_ok: bool,
    pub l4_csum_ok: bool,
    pub l4_csum: u16,
    pub payload: Vec<u8>,
}

pub fn parse(f: &[u8]) -> Parsed {
    assert!(f.len() >= 34, "frame too short: {}", f.len());
    let mut dst_mac = [0u8; 6];
    dst_mac.copy_from_slice(&f[..6]);
    let ip = &f[14..34];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let proto = ip[9];
    let l4 = &f[34..];
    let (sport, dport, l4_csum, hdr, l4_csum_ok) = match proto {
        PROTO_TCP => (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
            u16::from_be_bytes([l4[16], l4[17]]),
            20,
            pseudo_sum(src, dst, proto, l4) == 0,
        ),
        PROTO_UDP => {
            let c = u16::from_be_bytes([l4[6], l4[7]]);
            (
                u16::from_be_bytes([l4[0], l4[1]]),
                u16::from_be_bytes([l4[2], l4[3]]),
                c,
                8,
                c == 0 || pseudo_sum(src, dst, proto, l4) == 0,
            )
        }
        PROTO_SCTP => (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
            0,
            16, // the common header and the DATA chunk's header
            sctp_crc_ok(l4),
        ),
        _ => (
            u16::from_be_bytes([l4[4], l4[5]]),
            0,
            u16::from_be_bytes([l4[2], l4[3]]),
            8,
            csum(l4) == 0,
        ),
    };
    Parsed {
        dst_mac,
        src,
        dst,
        proto,
        sport,
        dport,
        ip_csum_ok: csum(ip) == 0,
        l4_csum_ok,
        l4_csum,
        payload: l4[hdr..].to_vec(),
    }
}

/// Recompute the IPv4 header checksum of an Ethernet + IPv4 `frame`.
pub fn fix_ip4_csum(frame: &mut [u8]) {
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    frame[24..26].copy_from_slice(&[0, 0]);
    let c = csum(&frame[14..14 + ihl]);
    frame[24..26].copy_from_slice(&c.to_be_bytes());
}

/// `frame` (from [`Ip4::frame`]) with the IPv4 flags + fragment offset word
/// set to `frag` (`0x2000` is "more fragments", the low 13 bits the offset
/// in 8-byte units), checksum fixed.
pub fn with_frag(mut frame: Vec<u8>, frag: u16) -> Vec<u8> {
    frame[20..22].copy_from_slice(&frag.to_be_bytes());
    fix_ip4_csum(&mut frame);
    frame
}

/// `frame` (from [`Ip4::frame`]) with IPv4 options `opts` (a multiple of 4
/// bytes) after the fixed header: ihl, total length and checksum fixed.
pub fn with_ip_options(frame: Vec<u8>, opts: &[u8]) -> Vec<u8> {
    assert_eq!(opts.len() % 4, 0, "options are 32-bit words");
    let mut f = frame[..34].to_vec();
    f.extend_from_slice(opts);
    f.extend_from_slice(&frame[34..]);
    f[14] = 0x40 | (5 + (opts.len() / 4) as u8);
    let total = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ip4_csum(&mut f);
    f
}

/// An Ethernet + IPv6 frame from a pod (`POD_MAC` → `GW_MAC`) with next
/// header `next` and `rest` after the fixed header (checksums are not looked
/// at by the programs' IPv6 paths).
pub fn ip6_frame(
    src: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    next: u8,
    rest: &[u8],
) -> Vec<u8> {
    eth_ip6(GW_MAC, POD_MAC, src, dst, next, 255, rest)
}

/// An Ethernet + IPv6 frame: the fixed header (hop limit `hops`, next
/// header `next`), then `rest` as is.
pub fn eth_ip6(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: u8,
    hops: u8,
    rest: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(54 + rest.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&0x86ddu16.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(rest.len() as u16).to_be_bytes());
    f.push(next);
    f.push(hops);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(rest);
    f
}

/// An IPv6 TCP or UDP packet description (the fixed header only).
#[derive(Clone, Debug)]
pub struct Ip6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub payload: Vec<u8>,
}

impl Ip6 {
    pub fn tcp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        Self::new(src, dst, PROTO_TCP, sport, dport)
    }
    pub fn udp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        Self::new(src, dst, PROTO_UDP, sport, dport)
    }
    pub fn new(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, sport: u16, dport: u16) -> Self {
        Self {
            src,
            dst,
            proto,
            sport,
            dport,
            payload: b"cozyplane IPv6 payload".to_vec(),
        }
    }

    /// The Ethernet frame, with the L4 checksum correct.
    pub fn frame(&self, dst_mac: [u8; 6], src_mac: [u8; 6]) -> Vec<u8> {
        if self.proto == PROTO_SCTP {
            let l4 = sctp(self.sport, self.dport, &self.payload);
            return eth_ip6(dst_mac, src_mac, self.src, self.dst, self.proto, 64, &l4);
        }
        let (mut l4, csum_at) = if self.proto == PROTO_TCP {
            let mut h = vec![0u8; 20];
            h[12] = 5 << 4;
            h[13] = 0x18; // PSH|ACK
            h[14..16].copy_from_slice(&64240u16.to_be_bytes());
            (h, 16)
        } else {
            (vec![0u8; 8], 6)
        };
        l4[0..2].copy_from_slice(&self.sport.to_be_bytes());
        l4[2..4].copy_from_slice(&self.dport.to_be_bytes());
        l4.extend_from_slice(&self.payload);
        if self.proto == PROTO_UDP {
            let len = l4.len() as u16;
            l4[4..6].copy_from_slice(&len.to_be_bytes());
        }
        let c = pseudo_sum6(self.src, self.dst, self.proto, &l4);
        l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
        eth_ip6(dst_mac, src_mac, self.src, self.dst, self.proto, 64, &l4)
    }
}

/// The IPv6 pseudo-header checksum over `l4` (0 when `l4` carries a correct one).
pub fn pseudo_sum6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, l4: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(40 + l4.len());
    buf.extend_from_slice(&src.octets());
    buf.extend_from_slice(&dst.octets());
    buf.extend_from_slice(&(l4.len() as u32).to_be_bytes());
    buf.extend_from_slice(&[0, 0, 0, proto]);
    buf.extend_from_slice(l4);
    csum(&buf)
}

/// An Ethernet + IPv6 TCP/UDP frame taken apart ([`parse6`]).
#[derive(Debug)]
pub struct Parsed6 {
    pub dst_mac: [u8; 6],
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub l4_csum_ok: bool,
    pub payload: Vec<u8>,
}

pub fn parse6(f: &[u8]) -> Parsed6 {
    assert!(f.len() >= 62, "frame too short: {}", f.len());
    assert_eq!(&f[12..14], &[0x86, 0xdd], "an IPv6 frame");
    let mut dst_mac = [0u8; 6];
    dst_mac.copy_from_slice(&f[..6]);
    let ip = &f[14..54];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
    let proto = ip[6];
    let l4 = &f[54..];
    let hdr = match proto {
        PROTO_TCP => 20,
        PROTO_SCTP => 16,
        _ => 8,
    };
    Parsed6 {
        dst_mac,
        src,
        dst,
        proto,
        sport: u16::from_be_bytes([l4[0], l4[1]]),
        dport: u16::from_be_bytes([l4[2], l4[3]]),
        l4_csum_ok: if proto == PROTO_SCTP {
            sctp_crc_ok(l4)
        } else {
            pseudo_sum6(src, dst, proto, l4) == 0
        },
        payload: l4[hdr..].to_vec(),
    }
}

/// Frame offsets of an ICMPv6 error: the ICMPv6 header at 54, the quoted
/// IPv6 header at 62, the quoted L4 at 102.
pub const ICMP6: usize = 54;
pub const QIP6: usize = 62;
pub const QL6: usize = 102;

/// An ICMPv6 error of `type_`/`code` (with `word`: the MTU of a packet too
/// big) from `src` to `dst` quoting `quote` (an IPv6 packet without its
/// Ethernet header), with a correct checksum.
#[allow(clippy::too_many_arguments)] // a packet's fields
pub fn icmp6_error(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    type_: u8,
    code: u8,
    word: u32,
    quote: &[u8],
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
) -> Vec<u8> {
    let mut m = vec![type_, code, 0, 0];
    m.extend_from_slice(&word.to_be_bytes());
    m.extend_from_slice(quote);
    let c = pseudo_sum6(src, dst, PROTO_ICMPV6, &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    eth_ip6(dst_mac, src_mac, src, dst, PROTO_ICMPV6, 64, &m)
}

/// An ICMPv6 error frame taken apart: the outer addresses, the quoted
/// packet's tuple, and whether the ICMPv6 checksum is correct.
#[derive(Debug)]
pub struct ParsedIcmp6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub type_: u8,
    pub word: u32,
    pub quoted_src: Ipv6Addr,
    pub quoted_dst: Ipv6Addr,
    pub quoted_sport: u16,
    pub quoted_dport: u16,
    pub csum_ok: bool,
}

pub fn parse_icmp6(f: &[u8]) -> ParsedIcmp6 {
    assert!(f.len() >= QL6 + 4, "frame too short: {}", f.len());
    assert_eq!(f[20], PROTO_ICMPV6, "an ICMPv6 message");
    let a = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap());
    let (src, dst) = (a(22), a(38));
    ParsedIcmp6 {
        src,
        dst,
        type_: f[ICMP6],
        word: u32::from_be_bytes([f[ICMP6 + 4], f[ICMP6 + 5], f[ICMP6 + 6], f[ICMP6 + 7]]),
        quoted_src: a(QIP6 + 8),
        quoted_dst: a(QIP6 + 24),
        quoted_sport: u16::from_be_bytes([f[QL6], f[QL6 + 1]]),
        quoted_dport: u16::from_be_bytes([f[QL6 + 2], f[QL6 + 3]]),
        csum_ok: pseudo_sum6(src, dst, PROTO_ICMPV6, &f[ICMP6..]) == 0,
    }
}

pub const PROTO_HOPOPTS: u8 = 0;
pub const PROTO_ICMPV6: u8 = 58;

/// A UDP header and payload for [`ip6_frame`].
pub fn udp6(sport: u16, dport: u16) -> Vec<u8> {
    let payload = b"v6 payload";
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(payload);
    h
}

/// An ICMPv6 message of `type_` (24 bytes: header, reserved word, a target
/// or multicast address) for [`ip6_frame`].
pub fn icmp6(type_: u8) -> Vec<u8> {
    let mut m = vec![type_, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    m
}

/// A hop-by-hop header with a router alert (as MLD reports carry), then
/// `next` with `rest`, for [`ip6_frame`] with next header [`PROTO_HOPOPTS`].
pub fn hop_by_hop(next: u8, rest: &[u8]) -> Vec<u8> {
    // next header, length 0 (8 bytes), router alert (type 5, len 2, MLD 0), PadN 0
    let mut h = vec![next, 0, 0x05, 0x02, 0, 0, 0x01, 0x00];
    h.extend_from_slice(rest);
    h
}

/// Frame offsets of an ICMP error: ICMP at 34, the quoted IPv4 header at
/// 42, the quoted L4 at 62.
pub const ICMP: usize = 34;
pub const QIP: usize = 42;
pub const QL4: usize = 62;

/// An ICMP error from `src` to `dst` quoting `quote` (an IPv4 packet without
/// its Ethernet header), with valid outer IP and ICMP checksums.
pub fn icmp_error(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    quote: &[u8],
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
) -> Vec<u8> {
    // destination unreachable, fragmentation needed, next-hop MTU 1400
    let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0x78];
    icmp.extend_from_slice(quote);
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut ip = vec![0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = PROTO_ICMP;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&icmp);
    f
}

/// `f` (an [`icmp_error`] frame) with its type, code and the word after the
/// checksum (the next-hop MTU of "fragmentation needed", else 0) set, the
/// ICMP checksum recomputed.
pub fn with_icmp_header(mut f: Vec<u8>, icmp_type: u8, code: u8, mtu: u16) -> Vec<u8> {
    f[ICMP] = icmp_type;
    f[ICMP + 1] = code;
    f[ICMP + 2..ICMP + 4].copy_from_slice(&[0, 0]);
    f[ICMP + 6..ICMP + 8].copy_from_slice(&mtu.to_be_bytes());
    let c = csum(&f[ICMP..]);
    f[ICMP + 2..ICMP + 4].copy_from_slice(&c.to_be_bytes());
    f
}

/// The quote of `pkt`: its IPv4 header and the first 8 L4 bytes.
pub fn quote(pkt: &Ip4) -> Vec<u8> {
    pkt.frame([0; 6], [0; 6])[14..14 + 28].to_vec()
}

/// Checks a translated ICMP error: its outer addresses, every checksum, the
/// quoted addresses and ports (or echo type and id) as `quoted`'s, and the
/// MTU as [`icmp_error`] wrote it.
pub fn assert_icmp_error(f: &[u8], src: Ipv4Addr, dst: Ipv4Addr, quoted: &Ip4) {
    let p = parse(f);
    assert_eq!((p.src, p.dst), (src, dst), "outer addresses");
    assert!(p.ip_csum_ok, "outer IPv4 checksum");
    assert_eq!(csum(&f[ICMP..]), 0, "ICMP checksum over the message");
    assert_eq!(csum(&f[QIP..QL4]), 0, "quoted IPv4 checksum");
    let want = quote(quoted);
    assert_eq!(&f[QIP + 12..QIP + 20], &want[12..20], "quoted addresses");
    if quoted.proto == PROTO_ICMP {
        // type and id; the quoted ICMP checksum is left alone, like the
        // masquerade's (it covers bytes the quote does not carry)
        assert_eq!(&f[QL4..QL4 + 2], &want[20..22], "quoted echo type");
        assert_eq!(&f[QL4 + 4..QL4 + 6], &want[24..26], "quoted echo id");
    } else {
        assert_eq!(&f[QL4..QL4 + 4], &want[20..24], "quoted ports");
    }
    assert_eq!(&f[ICMP + 6..ICMP + 8], &[0x05, 0x78], "MTU untouched");
}
