//! SCTP without the kernel's SCTP: an INIT answered by an INIT ACK, on raw
//! sockets (RFC 9260).
//!
//! NetworkPolicy and Services name SCTP, so SCTP has to be probed with SCTP
//! packets; but a kernel built without SCTP (`CONFIG_IP_SCTP` unset, as on the
//! machines our CI runs on) has no SCTP sockets. The probe therefore speaks the
//! first exchange of SCTP's handshake itself, as a SYN and its SYN-ACK are
//! TCP's:
//!
//! * the client sends an INIT from a random port with a random Initiate Tag
//!   and Verification Tag 0 (RFC 9260 §8.5.1);
//! * the server answers every valid INIT to one of its ports with an INIT ACK
//!   whose Verification Tag is that Initiate Tag and whose State Cookie is the
//!   server's name ([`Responder`]);
//! * the client accepts only an INIT ACK from the target's address and port to
//!   its own port, carrying its tag, with a valid CRC32c; the cookie is the
//!   answer.
//!
//! The client never sends the COOKIE ECHO, so no association is made and the
//! server keeps no state. A kernel that has SCTP also sees these packets and
//! answers them with ABORTs (no association exists); the client ignores those.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, SocketAddr};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// SCTP's IP protocol number.
pub const IPPROTO_SCTP: i32 = 132;
/// Chunk types (RFC 9260 §3.2).
const INIT: u8 = 1;
const INIT_ACK: u8 = 2;
/// The State Cookie parameter of an INIT ACK (§3.3.3).
const STATE_COOKIE: u16 = 7;
/// Ports, Verification Tag, checksum.
const COMMON_HEADER: usize = 12;
/// An INIT or INIT ACK chunk without parameters: type, flags, length,
/// Initiate Tag, a_rwnd, outbound and inbound streams, initial TSN.
const INIT_FIXED: usize = 20;
/// The longest State Cookie sent or accepted: a probe's answer is a name.
pub const MAX_COOKIE: usize = 256;

/// CRC32c (Castagnoli) of `data`, SCTP's checksum (RFC 9260 appendix A).
pub fn crc32c(data: &[u8]) -> u32 {
    !crc32c_update(!0, data)
}

fn crc32c_update(mut crc: u32, data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = crc32c_table();
    for &b in data {
        crc = TABLE[usize::from(crc.to_le_bytes()[0] ^ b)] ^ (crc >> 8);
    }
    crc
}

const fn crc32c_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0u32;
    while i < 256 {
        let mut c = i;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i as usize] = c;
        i += 1;
    }
    t
}

/// The checksum of an SCTP packet: CRC32c over the packet with its checksum
/// field taken as zero, stored little-endian in that field (the byte order of
/// RFC 9260 appendix A's reference code, which the kernel follows).
fn checksum(packet: &[u8]) -> Option<u32> {
    let head = packet.get(..8)?;
    let rest = packet.get(COMMON_HEADER..)?;
    let crc = crc32c_update(!0, head);
    let crc = crc32c_update(crc, &[0; 4]);
    Some(!crc32c_update(crc, rest))
}

/// The first chunk of a packet of the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// INIT, with the sender's Initiate Tag.
    Init {
        /// The tag the receiver must put in its packets' Verification Tag.
        tag: u32,
    },
    /// INIT ACK, with the sender's Initiate Tag and its State Cookie.
    InitAck {
        /// The answering side's own tag.
        tag: u32,
        /// The State Cookie (the probe server's name).
        cookie: Vec<u8>,
    },
    /// Any other chunk, by type (an ABORT from a kernel that has SCTP).
    Other(u8),
}

/// An SCTP packet as far as the probe reads it: the common header and the
/// first chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Verification Tag (0 on an INIT).
    pub vtag: u32,
    /// The first chunk.
    pub chunk: Chunk,
}

impl Packet {
    /// The packet on the wire, checksum included.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(COMMON_HEADER + INIT_FIXED + 4 + MAX_COOKIE);
        p.extend_from_slice(&self.src_port.to_be_bytes());
        p.extend_from_slice(&self.dst_port.to_be_bytes());
        p.extend_from_slice(&self.vtag.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        let init = |p: &mut Vec<u8>, kind: u8, tag: u32, params: &[u8]| {
            // the last parameter's padding is not part of the chunk's length
            let len = INIT_FIXED + params.len();
            p.push(kind);
            p.push(0);
            p.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes());
            p.extend_from_slice(&tag.to_be_bytes());
            p.extend_from_slice(&65_535u32.to_be_bytes()); // a_rwnd
            p.extend_from_slice(&1u16.to_be_bytes()); // outbound streams
            p.extend_from_slice(&1u16.to_be_bytes()); // inbound streams
            p.extend_from_slice(&tag.to_be_bytes()); // initial TSN: any value
            p.extend_from_slice(params);
            p.resize(p.len().next_multiple_of(4), 0);
        };
        match &self.chunk {
            Chunk::Init { tag } => init(&mut p, INIT, *tag, &[]),
            Chunk::InitAck { tag, cookie } => {
                let cookie = &cookie[..cookie.len().min(MAX_COOKIE)];
                let mut param = Vec::with_capacity(4 + cookie.len());
                param.extend_from_slice(&STATE_COOKIE.to_be_bytes());
                param
                    .extend_from_slice(&u16::try_from(4 + cookie.len()).unwrap_or(0).to_be_bytes());
                param.extend_from_slice(cookie);
                init(&mut p, INIT_ACK, *tag, &param);
            }
            Chunk::Other(kind) => p.extend_from_slice(&[*kind, 0, 0, 4]),
        }
        if let Some(sum) = checksum(&p) {
            p[8..12].copy_from_slice(&sum.to_le_bytes());
        }
        p
    }

    /// Reads an SCTP packet (from its common header on); `None` for anything
    /// malformed: a wrong checksum, a truncated chunk, an INIT or INIT ACK
    /// with tag 0, an INIT ACK without a State Cookie or with one longer than
    /// [`MAX_COOKIE`].
    pub fn decode(bytes: &[u8]) -> Option<Packet> {
        let be16 = |at: usize| Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?));
        let be32 = |at: usize| Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        let sum = u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?);
        if checksum(bytes)? != sum {
            return None;
        }
        let kind = *bytes.get(COMMON_HEADER)?;
        let len = usize::from(be16(COMMON_HEADER + 2)?);
        let end = COMMON_HEADER + len;
        if len < 4 || end > bytes.len() {
            return None;
        }
        let chunk = match kind {
            INIT | INIT_ACK => {
                if len < INIT_FIXED {
                    return None;
                }
                let tag = be32(COMMON_HEADER + 4)?;
                if tag == 0 {
                    return None;
                }
                if kind == INIT {
                    Chunk::Init { tag }
                } else {
                    let mut at = COMMON_HEADER + INIT_FIXED;
                    let mut cookie = None;
                    while at + 4 <= end {
                        let (ptype, plen) = (be16(at)?, usize::from(be16(at + 2)?));
                        if plen < 4 || at + plen > end {
                            return None;
                        }
                        if ptype == STATE_COOKIE {
                            cookie = Some(bytes.get(at + 4..at + plen)?.to_vec());
                        }
                        at += plen.next_multiple_of(4);
                    }
                    let cookie = cookie.filter(|c| c.len() <= MAX_COOKIE)?;
                    Chunk::InitAck { tag, cookie }
                }
            }
            other => Chunk::Other(other),
        };
        Some(Packet {
            src_port: be16(0)?,
            dst_port: be16(2)?,
            vtag: be32(4)?,
            chunk,
        })
    }
}

/// The SCTP packet in what a raw socket of `ip`'s family read: an IPv4 raw
/// socket hands over the IP header too, an IPv6 one does not.
pub fn payload(ip: IpAddr, datagram: &[u8]) -> Option<&[u8]> {
    match ip {
        IpAddr::V4(_) => datagram.get(usize::from(datagram.first()? & 0x0f) * 4..),
        IpAddr::V6(_) => Some(datagram),
    }
}

/// A raw SCTP socket of `ip`'s family.
pub fn raw_socket(ip: IpAddr) -> io::Result<Socket> {
    let domain = if ip.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    Socket::new(domain, Type::RAW, Some(Protocol::from(IPPROTO_SCTP)))
}

/// A random non-zero tag (or port material): std's per-process random
/// hashing keys over a counter, which is unpredictable enough for a probe.
pub fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    let [a, b, c, d, ..] = h.finish().to_le_bytes();
    u32::from_le_bytes([a, b, c, d]).max(1)
}

/// The answer of `Responder` to one packet a raw socket read, if it is an
/// INIT to one of `ports`.
pub fn answer(ports: &BTreeSet<u16>, name: &str, packet: &[u8]) -> Option<Vec<u8>> {
    let p = Packet::decode(packet)?;
    let Chunk::Init { tag } = p.chunk else {
        return None;
    };
    if p.vtag != 0 || !ports.contains(&p.dst_port) {
        return None;
    }
    Some(
        Packet {
            src_port: p.dst_port,
            dst_port: p.src_port,
            vtag: tag,
            chunk: Chunk::InitAck {
                tag: random_u32(),
                cookie: name.as_bytes().to_vec(),
            },
        }
        .encode(),
    )
}

/// The server side: answers every INIT to its ports on its address with an
/// INIT ACK carrying its name. Needs CAP_NET_RAW.
#[derive(Debug)]
pub struct Responder {
    /// The raw socket, driven through tokio's datagram socket: `recvfrom`
    /// and `sendto` are the calls a raw socket takes too.
    socket: tokio::net::UdpSocket,
    bind: IpAddr,
    ports: BTreeSet<u16>,
    name: String,
}

impl Responder {
    /// Opens the raw socket on `bind` (its family only).
    pub fn bind(bind: IpAddr, ports: BTreeSet<u16>, name: &str) -> io::Result<Self> {
        let s = raw_socket(bind)?;
        s.bind(&SockAddr::from(SocketAddr::new(bind, 0)))?;
        s.set_nonblocking(true)?;
        let socket = tokio::net::UdpSocket::from_std(s.into())?;
        Ok(Self {
            socket,
            bind,
            ports,
            name: name.to_string(),
        })
    }

    /// The ports answered.
    pub fn ports(&self) -> &BTreeSet<u16> {
        &self.ports
    }

    /// Answers until dropped; a failed receive or send is skipped.
    pub async fn serve(self) -> io::Result<()> {
        let mut buf = vec![0u8; 2048];
        loop {
            let Ok((n, from)) = self.socket.recv_from(&mut buf).await else {
                continue;
            };
            let Some(packet) = buf.get(..n).and_then(|d| payload(self.bind, d)) else {
                continue;
            };
            if let Some(reply) = answer(&self.ports, &self.name, packet) {
                // a raw socket's "port" is its protocol: 0 means the socket's
                let _ = self
                    .socket
                    .send_to(&reply, SocketAddr::new(from.ip(), 0))
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `p` with its checksum recomputed after an edit.
    fn reseal(p: &mut [u8]) {
        let sum = checksum(p).unwrap();
        p[8..12].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // the check value of CRC-32C, and RFC 3720 §B.4's 32 zero bytes
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    }

    #[test]
    fn an_init_has_the_wire_layout_and_its_checksum_covers_it() {
        // ports 40000 → 80, the INIT chunk of 20 bytes, the CRC32c of the
        // packet with a zero checksum field in that field, little-endian
        let mut p = Packet {
            src_port: 40_000,
            dst_port: 80,
            vtag: 0,
            chunk: Chunk::Init { tag: 0x1122_3344 },
        }
        .encode();
        assert_eq!(p.len(), COMMON_HEADER + INIT_FIXED);
        assert_eq!(&p[..4], &[0x9c, 0x40, 0x00, 0x50]);
        assert_eq!(&p[12..16], &[INIT, 0, 0, 20]);
        let sum = u32::from_le_bytes(p[8..12].try_into().unwrap());
        p[8..12].copy_from_slice(&[0; 4]);
        assert_eq!(crc32c(&p), sum);
    }

    #[test]
    fn an_init_gets_an_init_ack_with_the_name_and_the_tag() {
        let ports = BTreeSet::from([80, 81]);
        let init = Packet {
            src_port: 50_001,
            dst_port: 81,
            vtag: 0,
            chunk: Chunk::Init { tag: 77 },
        }
        .encode();
        let reply = Packet::decode(&answer(&ports, "x-a", &init).unwrap()).unwrap();
        assert_eq!(
            (reply.src_port, reply.dst_port, reply.vtag),
            (81, 50_001, 77)
        );
        let Chunk::InitAck { tag, cookie } = reply.chunk else {
            panic!("{reply:?}");
        };
        assert_ne!(tag, 0);
        assert_eq!(cookie, b"x-a");
        // the INIT ACK's chunk length counts the cookie but not its padding
        let raw = answer(&ports, "x-a", &init).unwrap();
        assert_eq!(u16::from_be_bytes([raw[14], raw[15]]), 20 + 4 + 3);
        assert_eq!(raw.len() % 4, 0);
    }

    #[test]
    fn what_is_not_a_valid_init_to_a_served_port_gets_nothing() {
        let ports = BTreeSet::from([80]);
        let init = |dst, vtag, tag| {
            Packet {
                src_port: 1,
                dst_port: dst,
                vtag,
                chunk: Chunk::Init { tag },
            }
            .encode()
        };
        assert!(answer(&ports, "n", &init(80, 0, 5)).is_some());
        // another port, a non-zero vtag, tag 0
        assert!(answer(&ports, "n", &init(81, 0, 5)).is_none());
        assert!(answer(&ports, "n", &init(80, 9, 5)).is_none());
        assert!(answer(&ports, "n", &init(80, 0, 0)).is_none());
        // a corrupt bit, a truncation, a chunk longer than the packet
        let mut bad = init(80, 0, 5);
        bad[20] ^= 1;
        assert!(answer(&ports, "n", &bad).is_none());
        let good = init(80, 0, 5);
        for n in 0..good.len() {
            assert!(answer(&ports, "n", &good[..n]).is_none(), "{n} bytes");
        }
        let mut long = init(80, 0, 5);
        long[15] = 200;
        reseal(&mut long);
        assert!(Packet::decode(&long).is_none());
        // an INIT ACK is not answered
        let ack = Packet {
            src_port: 1,
            dst_port: 80,
            vtag: 0,
            chunk: Chunk::InitAck {
                tag: 3,
                cookie: b"x".to_vec(),
            },
        }
        .encode();
        assert!(answer(&ports, "n", &ack).is_none());
    }

    #[test]
    fn an_init_ack_without_a_cookie_or_with_a_huge_one_is_refused() {
        let mut ack = Packet {
            src_port: 80,
            dst_port: 1,
            vtag: 7,
            chunk: Chunk::InitAck {
                tag: 3,
                cookie: Vec::new(),
            },
        }
        .encode();
        assert!(Packet::decode(&ack).is_some());
        // the cookie parameter's type changed to another one: no cookie left
        ack[COMMON_HEADER + INIT_FIXED + 1] = 8;
        reseal(&mut ack);
        assert!(Packet::decode(&ack).is_none());
        // encode caps the cookie, so a longer one is built by hand
        let mut big = Packet {
            src_port: 80,
            dst_port: 1,
            vtag: 7,
            chunk: Chunk::InitAck {
                tag: 3,
                cookie: Vec::new(),
            },
        }
        .encode();
        let extra = MAX_COOKIE + 4;
        big.extend(std::iter::repeat_n(b'a', extra));
        let plen = u16::try_from(4 + extra).unwrap();
        let clen = u16::try_from(INIT_FIXED + 4 + extra).unwrap();
        big[COMMON_HEADER + INIT_FIXED + 2..COMMON_HEADER + INIT_FIXED + 4]
            .copy_from_slice(&plen.to_be_bytes());
        big[COMMON_HEADER + 2..COMMON_HEADER + 4].copy_from_slice(&clen.to_be_bytes());
        reseal(&mut big);
        assert!(Packet::decode(&big).is_none());
    }

    #[test]
    fn the_ipv4_header_is_skipped_and_ipv6_has_none() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let mut d = vec![0x46u8; 24];
        d.extend_from_slice(b"sctp");
        assert_eq!(payload(v4, &d), Some(&b"sctp"[..]));
        assert_eq!(payload(v6, b"sctp"), Some(&b"sctp"[..]));
        assert_eq!(payload(v4, &[]), None);
    }
}
