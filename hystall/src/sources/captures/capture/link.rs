//! Link layers: from a captured frame down to its IPv4 or IPv6 packet.

use super::stats::SkipReason;

pub(super) const LINKTYPE_NULL: u32 = 0;
pub(super) const LINKTYPE_ETHERNET: u32 = 1;
pub(super) const LINKTYPE_RAW: u32 = 101;
pub(super) const LINKTYPE_LOOP: u32 = 108;
pub(super) const LINKTYPE_LINUX_SLL: u32 = 113;
pub(super) const LINKTYPE_IPV4: u32 = 228;
pub(super) const LINKTYPE_IPV6: u32 = 229;
pub(super) const LINKTYPE_LINUX_SLL2: u32 = 276;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
/// 802.1Q, 802.1ad (QinQ) and the pre-standard QinQ tag.
const ETHERTYPE_VLAN: [u16; 3] = [0x8100, 0x88a8, 0x9100];
/// More stacked VLAN tags than this is garbage, not a network.
const MAX_VLAN_TAGS: usize = 8;

/// The network-layer packet inside a frame.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Net<'a> {
    V4(&'a [u8]),
    V6(&'a [u8]),
}

/// Strips the link-layer header of `linktype`.
pub(super) fn decapsulate(linktype: u32, frame: &[u8]) -> Result<Net<'_>, SkipReason> {
    match linktype {
        LINKTYPE_ETHERNET => ethernet(frame),
        LINKTYPE_RAW => by_version(frame),
        LINKTYPE_IPV4 => Ok(Net::V4(frame)),
        LINKTYPE_IPV6 => Ok(Net::V6(frame)),
        // Protocol at offset 14, header 16 bytes.
        LINKTYPE_LINUX_SLL => ethertype(be16(frame, 14)?, frame.get(16..)),
        // Protocol at offset 0, header 20 bytes.
        LINKTYPE_LINUX_SLL2 => ethertype(be16(frame, 0)?, frame.get(20..)),
        LINKTYPE_NULL | LINKTYPE_LOOP => bsd_loopback(frame),
        other => Err(SkipReason::LinkType(other)),
    }
}

fn ethernet(frame: &[u8]) -> Result<Net<'_>, SkipReason> {
    let mut offset = 12;
    let mut ty = be16(frame, offset)?;
    let mut tags = 0;
    while ETHERTYPE_VLAN.contains(&ty) {
        tags += 1;
        if tags > MAX_VLAN_TAGS {
            return Err(SkipReason::NotIp);
        }
        // Tag control information (2 bytes), then the next ethertype.
        offset += 4;
        ty = be16(frame, offset)?;
    }
    ethertype(ty, frame.get(offset + 2..))
}

fn ethertype(ty: u16, rest: Option<&[u8]>) -> Result<Net<'_>, SkipReason> {
    let rest = rest.ok_or(SkipReason::TruncatedLinkHeader)?;
    match ty {
        ETHERTYPE_IPV4 => Ok(Net::V4(rest)),
        ETHERTYPE_IPV6 => Ok(Net::V6(rest)),
        _ => Err(SkipReason::NotIp),
    }
}

/// BSD loopback: a 4-byte address family, in the capturing host's byte order for NULL and
/// big-endian for LOOP, but writers get this wrong, so both orders are accepted.
/// AF_INET is 2 everywhere; AF_INET6 is 24 (NetBSD, OpenBSD), 28 (FreeBSD) or 30 (macOS).
fn bsd_loopback(frame: &[u8]) -> Result<Net<'_>, SkipReason> {
    let head: [u8; 4] = frame.first_chunk::<4>().copied().ok_or(SkipReason::TruncatedLinkHeader)?;
    let rest = frame.get(4..).unwrap_or_default();
    let family = |af: u32| match af {
        2 => Some(Net::V4(rest)),
        24 | 28 | 30 => Some(Net::V6(rest)),
        _ => None,
    };
    family(u32::from_le_bytes(head)).or_else(|| family(u32::from_be_bytes(head))).ok_or(SkipReason::NotIp)
}

/// LINKTYPE_RAW: the IP version nibble tells.
fn by_version(packet: &[u8]) -> Result<Net<'_>, SkipReason> {
    match packet.first().map(|b| b >> 4) {
        Some(4) => Ok(Net::V4(packet)),
        Some(6) => Ok(Net::V6(packet)),
        Some(_) => Err(SkipReason::NotIp),
        None => Err(SkipReason::TruncatedIpHeader),
    }
}

fn be16(b: &[u8], at: usize) -> Result<u16, SkipReason> {
    match b.get(at..at + 2) {
        Some(&[hi, lo]) => Ok(u16::from_be_bytes([hi, lo])),
        _ => Err(SkipReason::TruncatedLinkHeader),
    }
}
