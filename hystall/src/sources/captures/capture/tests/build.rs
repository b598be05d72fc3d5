//! Hand-built capture files: packets layer by layer, then pcap and pcapng containers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const V4A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
pub const V4B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
pub const V6A: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1));
pub const V6B: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2));

pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend(sport.to_be_bytes());
    v.extend(dport.to_be_bytes());
    v.extend(((payload.len() + 8) as u16).to_be_bytes());
    v.extend([0, 0]);
    v.extend(payload);
    v
}

pub struct Tcp<'a> {
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub options: &'a [u8],
    pub payload: &'a [u8],
}

pub fn tcp(t: &Tcp<'_>) -> Vec<u8> {
    assert_eq!(t.options.len() % 4, 0);
    let mut v = Vec::new();
    v.extend(t.sport.to_be_bytes());
    v.extend(t.dport.to_be_bytes());
    v.extend(t.seq.to_be_bytes());
    v.extend(t.ack.to_be_bytes());
    v.push((((20 + t.options.len()) / 4) as u8) << 4);
    v.push(t.flags);
    v.extend(t.window.to_be_bytes());
    v.extend([0, 0, 0, 0]);
    v.extend(t.options);
    v.extend(t.payload);
    v
}

/// An IPv4 packet; `frag` is the raw flags/fragment-offset field.
pub fn ipv4(src: IpAddr, dst: IpAddr, proto: u8, id: u16, frag: u16, payload: &[u8]) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src, dst) else { panic!("v4 addresses") };
    let mut v = vec![0x45, 0];
    v.extend(((20 + payload.len()) as u16).to_be_bytes());
    v.extend(id.to_be_bytes());
    v.extend(frag.to_be_bytes());
    v.extend([64, proto, 0, 0]);
    v.extend(s.octets());
    v.extend(d.octets());
    v.extend(payload);
    v
}

/// An IPv6 packet; `payload` starts with any extension headers named by `next`.
pub fn ipv6(src: IpAddr, dst: IpAddr, next: u8, payload: &[u8]) -> Vec<u8> {
    let (IpAddr::V6(s), IpAddr::V6(d)) = (src, dst) else { panic!("v6 addresses") };
    let mut v = vec![0x60, 0, 0, 0];
    v.extend((payload.len() as u16).to_be_bytes());
    v.extend([next, 64]);
    v.extend(s.octets());
    v.extend(d.octets());
    v.extend(payload);
    v
}

/// An IP packet of either family carrying `proto`.
pub fn ip(src: IpAddr, dst: IpAddr, proto: u8, payload: &[u8]) -> Vec<u8> {
    if src.is_ipv4() { ipv4(src, dst, proto, 1, 0x4000, payload) } else { ipv6(src, dst, proto, payload) }
}

/// An 8-byte IPv6 extension header (hop-by-hop / destination options: PadN).
pub fn ext8(next: u8) -> Vec<u8> {
    vec![next, 0, 1, 4, 0, 0, 0, 0]
}

pub fn ipv6_frag_header(next: u8, offset: usize, more: bool, id: u32) -> Vec<u8> {
    let mut v = vec![next, 0];
    v.extend((((offset / 8) as u16) << 3 | u16::from(more)).to_be_bytes());
    v.extend(id.to_be_bytes());
    v
}

pub fn ethertype_of(ip: &[u8]) -> u16 {
    if ip.first().map(|b| b >> 4) == Some(6) { 0x86dd } else { 0x0800 }
}

/// Ethernet with the given VLAN tag protocol ids (outermost first).
pub fn ether(vlans: &[u16], ip: &[u8]) -> Vec<u8> {
    let mut v = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    for (i, tpid) in vlans.iter().enumerate() {
        v.extend(tpid.to_be_bytes());
        v.extend((100 + i as u16).to_be_bytes());
    }
    v.extend(ethertype_of(ip).to_be_bytes());
    v.extend(ip);
    v
}

pub fn sll(ip: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0];
    v.extend(ethertype_of(ip).to_be_bytes());
    v.extend(ip);
    v
}

pub fn sll2(ip: &[u8]) -> Vec<u8> {
    let mut v = ethertype_of(ip).to_be_bytes().to_vec();
    v.extend([0, 0, 0, 0, 0, 1, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0]);
    v.extend(ip);
    v
}

/// BSD loopback with the family in the given byte order; AF_INET6 as `af6`.
pub fn bsd_loop(big_endian: bool, af6: u32, ip: &[u8]) -> Vec<u8> {
    let af: u32 = if ethertype_of(ip) == 0x86dd { af6 } else { 2 };
    let mut v = if big_endian { af.to_be_bytes().to_vec() } else { af.to_le_bytes().to_vec() };
    v.extend(ip);
    v
}

/// Wraps `ip` in the link layer of `linktype`.
pub fn link(linktype: u32, ip: &[u8]) -> Vec<u8> {
    match linktype {
        0 => bsd_loop(false, 30, ip),
        1 => ether(&[], ip),
        101 | 228 | 229 => ip.to_vec(),
        108 => bsd_loop(true, 24, ip),
        113 => sll(ip),
        276 => sll2(ip),
        other => panic!("no builder for link type {other}"),
    }
}

fn u16b(v: u16, be: bool) -> [u8; 2] {
    if be { v.to_be_bytes() } else { v.to_le_bytes() }
}

fn u32b(v: u32, be: bool) -> [u8; 4] {
    if be { v.to_be_bytes() } else { v.to_le_bytes() }
}

/// One legacy pcap record: seconds, fraction (µs or ns), captured bytes, original length.
pub struct Rec<'a> {
    pub sec: u32,
    pub frac: u32,
    pub data: &'a [u8],
    pub orig_len: u32,
}

pub fn rec(sec: u32, frac: u32, data: &[u8]) -> Rec<'_> {
    Rec { sec, frac, data, orig_len: data.len() as u32 }
}

pub fn pcap_header(be: bool, nanos: bool, linktype: u32) -> Vec<u8> {
    let magic: u32 = if nanos { 0xa1b2_3c4d } else { 0xa1b2_c3d4 };
    let mut v = u32b(magic, be).to_vec();
    v.extend(u16b(2, be));
    v.extend(u16b(4, be));
    v.extend(u32b(0, be));
    v.extend(u32b(0, be));
    v.extend(u32b(262_144, be));
    v.extend(u32b(linktype, be));
    v
}

pub fn pcap_record(be: bool, r: &Rec<'_>) -> Vec<u8> {
    let mut v = u32b(r.sec, be).to_vec();
    v.extend(u32b(r.frac, be));
    v.extend(u32b(r.data.len() as u32, be));
    v.extend(u32b(r.orig_len, be));
    v.extend(r.data);
    v
}

pub fn pcap(be: bool, nanos: bool, linktype: u32, records: &[Rec<'_>]) -> Vec<u8> {
    let mut v = pcap_header(be, nanos, linktype);
    for r in records {
        v.extend(pcap_record(be, r));
    }
    v
}

/// A pcapng block of `ty` with `body` (padded to 32 bits).
pub fn ng_block(be: bool, ty: u32, body: &[u8]) -> Vec<u8> {
    let pad = (4 - body.len() % 4) % 4;
    let len = (12 + body.len() + pad) as u32;
    let mut v = u32b(ty, be).to_vec();
    v.extend(u32b(len, be));
    v.extend(body);
    v.extend(std::iter::repeat_n(0, pad));
    v.extend(u32b(len, be));
    v
}

pub fn shb(be: bool) -> Vec<u8> {
    let mut body = u32b(0x1a2b_3c4d, be).to_vec();
    body.extend(u16b(1, be));
    body.extend(u16b(0, be));
    body.extend(u64::MAX.to_le_bytes()); // section length unknown: all ones either way
    ng_block(be, 0x0a0d_0d0a, &body)
}

pub fn idb(be: bool, linktype: u16, snaplen: u32, tsresol: Option<u8>) -> Vec<u8> {
    let mut body = u16b(linktype, be).to_vec();
    body.extend(u16b(0, be));
    body.extend(u32b(snaplen, be));
    if let Some(r) = tsresol {
        body.extend(u16b(9, be));
        body.extend(u16b(1, be));
        body.extend([r, 0, 0, 0]);
        body.extend([0, 0, 0, 0]); // opt_endofopt
    }
    ng_block(be, 1, &body)
}

pub fn epb(be: bool, if_id: u32, ts: u64, data: &[u8], orig_len: u32) -> Vec<u8> {
    let mut body = u32b(if_id, be).to_vec();
    body.extend(u32b((ts >> 32) as u32, be));
    body.extend(u32b(ts as u32, be));
    body.extend(u32b(data.len() as u32, be));
    body.extend(u32b(orig_len, be));
    body.extend(data);
    ng_block(be, 6, &body)
}

pub fn spb(be: bool, data: &[u8]) -> Vec<u8> {
    let mut body = u32b(data.len() as u32, be).to_vec();
    body.extend(data);
    ng_block(be, 3, &body)
}

/// The obsolete Packet Block (type 2).
pub fn opb(be: bool, if_id: u16, ts: u64, data: &[u8]) -> Vec<u8> {
    let mut body = u16b(if_id, be).to_vec();
    body.extend(u16b(0, be));
    body.extend(u32b((ts >> 32) as u32, be));
    body.extend(u32b(ts as u32, be));
    body.extend(u32b(data.len() as u32, be));
    body.extend(u32b(data.len() as u32, be));
    body.extend(data);
    ng_block(be, 2, &body)
}

/// A Decryption Secrets Block.
pub fn dsb(be: bool, secrets_type: u32, secrets: &[u8]) -> Vec<u8> {
    let mut body = u32b(secrets_type, be).to_vec();
    body.extend(u32b(secrets.len() as u32, be));
    body.extend(secrets);
    ng_block(be, 10, &body)
}

/// A small deterministic PRNG (xorshift64*) for the garbage tests.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
