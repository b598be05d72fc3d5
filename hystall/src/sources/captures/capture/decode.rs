//! The per-frame pipeline: link layer, IP (with reassembly), transport, counted.

use std::net::{IpAddr, SocketAddr};

use super::container::Frame;
use super::ip::{self};
use super::link::{self, Net};
use super::reassembly::{FragKey, Reassembler};
use super::record::{L4, Packet};
use super::stats::{SkipReason, Stats};
use super::transport;

#[derive(Default)]
pub(super) struct Decoder {
    reassembler: Reassembler,
}

impl Decoder {
    /// The packet in `frame`, if it yields one now (a fragment may complete a datagram
    /// later). Anything else is counted in `stats`.
    pub(super) fn frame(&mut self, frame: &Frame<'_>, stats: &mut Stats) -> Option<Packet> {
        stats.packets += 1;
        match self.decode(frame, stats) {
            Ok(Some(packet)) => {
                match &packet.l4 {
                    L4::Udp { truncated, .. } => {
                        stats.udp += 1;
                        stats.udp_truncated += u64::from(*truncated);
                    }
                    L4::Tcp { .. } => stats.tcp += 1,
                }
                Some(packet)
            }
            Ok(None) => None,
            Err(reason) => {
                stats.skip(reason);
                None
            }
        }
    }

    /// Counts what the reassembler still holds: the file has ended.
    pub(super) fn finish(&mut self, stats: &mut Stats) {
        self.reassembler.finish(stats);
    }

    fn decode(&mut self, frame: &Frame<'_>, stats: &mut Stats) -> Result<Option<Packet>, SkipReason> {
        let net = link::decapsulate(frame.linktype, frame.data)?;
        let is_v6 = matches!(net, Net::V6(_));
        let ip = ip::parse(net)?;
        let Some(frag) = ip.frag else {
            return packet(frame.ts, ip.src, ip.dst, ip.proto, ip.payload, ip.declared).map(Some);
        };
        stats.fragments += 1;
        if ip.payload.len() < ip.declared {
            return Err(SkipReason::FragmentTruncated);
        }
        let key = FragKey { src: ip.src, dst: ip.dst, proto: ip.proto, id: frag.id };
        let Some(whole) = self.reassembler.add(frame.ts, key, frag, ip.payload, stats) else {
            return Ok(None);
        };
        // IPv6: the reassembled payload may start with more extension headers.
        let (proto, offset) = if is_v6 {
            let walk = ip::ipv6_extensions(ip.proto, &whole, whole.len(), false)?;
            (walk.proto, walk.offset)
        } else {
            (ip.proto, 0)
        };
        let data = whole.get(offset..).unwrap_or_default();
        packet(frame.ts, ip.src, ip.dst, proto, data, data.len()).map(Some)
    }
}

fn packet(ts: u64, src: IpAddr, dst: IpAddr, proto: u8, data: &[u8], declared: usize) -> Result<Packet, SkipReason> {
    let (sport, dport, l4) = transport::decode(proto, data, declared)?;
    Ok(Packet { ts, src: SocketAddr::new(src, sport), dst: SocketAddr::new(dst, dport), l4 })
}
