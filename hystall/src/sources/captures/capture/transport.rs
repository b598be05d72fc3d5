//! UDP and TCP headers: ports plus what flow-control triage needs.
//! Checksums are not checked: captures taken on the sending host carry offloaded,
//! not-yet-computed checksums.

use super::record::{L4, TcpFlags};
use super::stats::SkipReason;

pub(super) const PROTO_ICMP: u8 = 1;
pub(super) const PROTO_TCP: u8 = 6;
pub(super) const PROTO_UDP: u8 = 17;
pub(super) const PROTO_ICMPV6: u8 = 58;

const TCP_OPT_END: u8 = 0;
const TCP_OPT_NOP: u8 = 1;
const TCP_OPT_MSS: u8 = 2;
const TCP_OPT_WSCALE: u8 = 3;

/// Ports and transport summary from `data` (the captured transport bytes) of a payload the
/// IP layer declares `declared` bytes long.
pub(super) fn decode(proto: u8, data: &[u8], declared: usize) -> Result<(u16, u16, L4), SkipReason> {
    match proto {
        PROTO_UDP => udp(data, declared),
        PROTO_TCP => tcp(data, declared),
        PROTO_ICMP | PROTO_ICMPV6 => Err(SkipReason::Icmp),
        other => Err(SkipReason::Protocol(other)),
    }
}

fn udp(data: &[u8], declared: usize) -> Result<(u16, u16, L4), SkipReason> {
    let h: &[u8; 8] = data.first_chunk::<8>().ok_or(SkipReason::TruncatedUdpHeader)?;
    let (sport, dport) = (u16::from_be_bytes([h[0], h[1]]), u16::from_be_bytes([h[2], h[3]]));
    let mut udp_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    if udp_len == 0 && declared > usize::from(u16::MAX) {
        udp_len = declared; // an IPv6 jumbogram's UDP length (RFC 2675)
    }
    if udp_len < 8 || udp_len > declared {
        return Err(SkipReason::MalformedUdpHeader);
    }
    let orig_len = udp_len - 8;
    let payload = data.get(8..udp_len.min(data.len())).unwrap_or_default().to_vec();
    let truncated = payload.len() < orig_len;
    Ok((sport, dport, L4::Udp { payload, truncated, orig_len }))
}

fn tcp(data: &[u8], declared: usize) -> Result<(u16, u16, L4), SkipReason> {
    let h: &[u8; 20] = data.first_chunk::<20>().ok_or(SkipReason::TruncatedTcpHeader)?;
    let header_len = usize::from(h[12] >> 4) * 4;
    if header_len < 20 || header_len > declared {
        return Err(SkipReason::MalformedTcpHeader);
    }
    let options = data.get(20..header_len).ok_or(SkipReason::TruncatedTcpHeader)?;
    let (mss, wscale) = tcp_options(options);
    let be32 = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    Ok((
        u16::from_be_bytes([h[0], h[1]]),
        u16::from_be_bytes([h[2], h[3]]),
        L4::Tcp {
            seq: be32(4),
            ack: be32(8),
            flags: TcpFlags(h[13]),
            window: u16::from_be_bytes([h[14], h[15]]),
            wscale,
            mss,
            payload_len: declared - header_len,
        },
    ))
}

/// MSS and window scale from TCP options; a malformed option list ends the scan.
fn tcp_options(mut opts: &[u8]) -> (Option<u16>, Option<u8>) {
    let (mut mss, mut wscale) = (None, None);
    while let Some((&kind, rest)) = opts.split_first() {
        match kind {
            TCP_OPT_END => break,
            TCP_OPT_NOP => opts = rest,
            _ => {
                let Some(len) = rest.first().map(|l| usize::from(*l)).filter(|l| *l >= 2) else { break };
                let Some(opt) = opts.get(..len) else { break };
                match (kind, opt) {
                    (TCP_OPT_MSS, &[_, 4, hi, lo]) => mss = Some(u16::from_be_bytes([hi, lo])),
                    (TCP_OPT_WSCALE, &[_, 3, shift]) => wscale = Some(shift),
                    _ => {}
                }
                opts = opts.get(len..).unwrap_or_default();
            }
        }
    }
    (mss, wscale)
}
