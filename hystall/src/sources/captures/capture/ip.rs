//! IPv4 and IPv6 headers, IPv6 extension headers included, down to the transport payload.
//!
//! Lengths come in pairs: what the capture holds (`payload`) and what the headers declare
//! (`declared`), so a snaplen-limited capture still reports true sizes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::link::Net;
use super::stats::SkipReason;

const NH_HOP_BY_HOP: u8 = 0;
const NH_ROUTING: u8 = 43;
const NH_FRAGMENT: u8 = 44;
const NH_ESP: u8 = 50;
const NH_AH: u8 = 51;
const NH_NONE: u8 = 59;
const NH_DEST_OPTS: u8 = 60;
/// A sane bound on chained extension headers; the lengths bound the walk anyway.
const MAX_EXT_HEADERS: usize = 16;

/// Where a fragment sits in its datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fragment {
    /// The IPv4 identification (16 bits) or IPv6 fragment identification.
    pub id: u32,
    /// Byte offset of this fragment's data in the datagram's payload.
    pub offset: usize,
    /// More fragments follow.
    pub more: bool,
}

#[derive(Debug)]
pub(super) struct IpPacket<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The transport protocol, or for a fragment the protocol of the reassembled payload.
    pub proto: u8,
    /// The captured payload (after all headers), never longer than `declared`.
    pub payload: &'a [u8],
    /// The payload length the headers declare.
    pub declared: usize,
    pub frag: Option<Fragment>,
}

pub(super) fn parse(net: Net<'_>) -> Result<IpPacket<'_>, SkipReason> {
    match net {
        Net::V4(p) => ipv4(p),
        Net::V6(p) => ipv6(p),
    }
}

fn ipv4(p: &[u8]) -> Result<IpPacket<'_>, SkipReason> {
    let h: &[u8; 20] = p.first_chunk::<20>().ok_or(SkipReason::TruncatedIpHeader)?;
    let ihl = usize::from(h[0] & 0x0f) * 4;
    if h[0] >> 4 != 4 || ihl < 20 {
        return Err(SkipReason::MalformedIpHeader);
    }
    if p.len() < ihl {
        return Err(SkipReason::TruncatedIpHeader);
    }
    let mut total = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if total == 0 {
        // Segmentation offload: packets captured before the NIC splits them say 0.
        total = p.len();
    }
    if total < ihl {
        return Err(SkipReason::MalformedIpHeader);
    }
    let frag_field = u16::from_be_bytes([h[6], h[7]]);
    let offset = usize::from(frag_field & 0x1fff) * 8;
    let more = frag_field & 0x2000 != 0;
    let frag =
        (more || offset > 0).then_some(Fragment { id: u32::from(u16::from_be_bytes([h[4], h[5]])), offset, more });
    Ok(IpPacket {
        src: IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
        dst: IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
        proto: h[9],
        payload: p.get(ihl..total.min(p.len())).unwrap_or_default(),
        declared: total - ihl,
        frag,
    })
}

fn ipv6(p: &[u8]) -> Result<IpPacket<'_>, SkipReason> {
    let h: &[u8; 40] = p.first_chunk::<40>().ok_or(SkipReason::TruncatedIpHeader)?;
    if h[0] >> 4 != 6 {
        return Err(SkipReason::MalformedIpHeader);
    }
    let mut declared = usize::from(u16::from_be_bytes([h[4], h[5]]));
    if declared == 0 {
        // A jumbogram or an offloaded super-packet: the capture is all we know.
        declared = p.len() - 40;
    }
    let body = p.get(40..(40 + declared).min(p.len())).unwrap_or_default();
    let walk = ipv6_extensions(h[6], body, declared, true)?;
    let addr = |b: &[u8]| IpAddr::V6(Ipv6Addr::from(b.first_chunk::<16>().copied().unwrap_or_default()));
    Ok(IpPacket {
        src: addr(&h[8..24]),
        dst: addr(&h[24..40]),
        proto: walk.proto,
        payload: body.get(walk.offset..).unwrap_or_default(),
        declared: declared.saturating_sub(walk.offset),
        frag: walk.frag,
    })
}

/// The result of walking IPv6 extension headers.
pub(super) struct Ipv6Walk {
    /// The upper-layer protocol (after a fragment header: the next header it names).
    pub proto: u8,
    /// Bytes of extension headers walked.
    pub offset: usize,
    pub frag: Option<Fragment>,
}

/// Walks the extension headers starting with `next` at the start of `body`. A fragment
/// header ends the walk (the rest is fragmentable, read after reassembly) unless it is an
/// atomic fragment; `fragment_allowed` is false when walking a reassembled payload.
pub(super) fn ipv6_extensions(
    mut next: u8,
    body: &[u8],
    declared: usize,
    fragment_allowed: bool,
) -> Result<Ipv6Walk, SkipReason> {
    let mut offset = 0;
    let mut seen_fragment = false;
    for _ in 0..MAX_EXT_HEADERS {
        let rest = body.get(offset..).unwrap_or_default();
        let len = match next {
            NH_HOP_BY_HOP | NH_ROUTING | NH_DEST_OPTS => rest.get(1).map(|l| (usize::from(*l) + 1) * 8),
            NH_AH => rest.get(1).map(|l| (usize::from(*l) + 2) * 4),
            NH_FRAGMENT => Some(8),
            NH_ESP | NH_NONE => return Err(SkipReason::UnsupportedIpv6),
            proto => return Ok(Ipv6Walk { proto, offset, frag: None }),
        };
        let header = len.and_then(|len| rest.get(..len));
        let Some(header) = header else {
            // Cut by the capture, or longer than the packet says it is.
            let needed = offset + len.unwrap_or(2);
            return Err(if needed > declared { SkipReason::MalformedIpHeader } else { SkipReason::TruncatedIpHeader });
        };
        let following = header.first().copied().unwrap_or(NH_NONE);
        offset += header.len();
        if next == NH_FRAGMENT {
            if !fragment_allowed || seen_fragment {
                return Err(SkipReason::MalformedIpHeader);
            }
            seen_fragment = true;
            let field = u16::from_be_bytes([header.get(2).copied().unwrap_or(0), header.get(3).copied().unwrap_or(0)]);
            let id = header.get(4..8).and_then(|b| b.first_chunk::<4>()).map(|b| u32::from_be_bytes(*b));
            let frag = Fragment { id: id.unwrap_or(0), offset: usize::from(field >> 3) * 8, more: field & 1 != 0 };
            if frag.more || frag.offset > 0 {
                return Ok(Ipv6Walk { proto: following, offset, frag: Some(frag) });
            }
            // An atomic fragment (RFC 6946): not fragmented at all; keep walking.
        }
        next = following;
    }
    Err(SkipReason::MalformedIpHeader)
}
