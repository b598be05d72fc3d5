//! The TC classifier's job, done on a capture: which UDP packets are QUIC to
//! or from a server, per-flow counters by direction and size class, and header
//! samples, with the same policy as the kernel program (hystall-ebpf
//! quic_flow.rs), so the model sees what it would have seen live.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use hystall_common::flow::{SAMPLE_BYTES, sampling, size_class};

use crate::cli::PortRange;
use crate::core::flows::{Dir, DirCounters, FlowCounters, FlowId, HeaderSample};
use crate::core::quic::crypto::{PacketKeys, Suite, initial_secrets, remove_header_protection};
use crate::core::quic::{Header, LongType, packets};
use crate::core::time::Mono;

/// No single QUIC datagram is larger (path MTUs are at most 1500 bytes on the
/// Internet): a larger one is a GSO/GRO super-packet, captured before the NIC
/// or the kernel cut it into segments.
pub const MAX_DATAGRAM: usize = 1500;

#[derive(Default)]
pub struct FlowState {
    pub counters: FlowCounters,
    dirs: [sampling::State; 2],
    pub last: Mono,
}

/// A QUIC datagram placed in its flow: direction and GSO segments.
pub struct Placed {
    pub flow: FlowId,
    pub dir: Dir,
    /// (offset, length) of each segment in the payload.
    pub segments: Vec<(usize, usize)>,
    /// A header sample the model should get, if the policy wants one.
    pub sample: Option<HeaderSample>,
}

/// Server endpoints and flows.
pub struct UdpFlows {
    ports: Vec<PortRange>,
    /// Server endpoints learned from handshakes (the receiver of a first Initial).
    servers: HashSet<SocketAddr>,
    pub flows: HashMap<FlowId, FlowState>,
    /// Flows that saw a packet lately (polled each tick), pruned as they go idle.
    live: HashSet<FlowId>,
    /// Endpoint pairs seen without a QUIC handshake or a --port (datagrams).
    pub unplaced: u64,
    pub unplaced_pairs: HashSet<(SocketAddr, SocketAddr)>,
    /// Super-packets split into segments.
    pub gso_split: u64,
}

impl UdpFlows {
    pub fn new(ports: Vec<PortRange>) -> Self {
        UdpFlows {
            ports,
            servers: HashSet::new(),
            flows: HashMap::new(),
            live: HashSet::new(),
            unplaced: 0,
            unplaced_pairs: HashSet::new(),
            gso_split: 0,
        }
    }

    fn is_server(&self, a: SocketAddr) -> bool {
        self.servers.contains(&a) || self.ports.iter().any(|r| (r.lo..=r.hi).contains(&a.port()))
    }

    /// The server endpoints known so far.
    pub fn servers(&self) -> impl Iterator<Item = &SocketAddr> {
        self.servers.iter()
    }

    pub fn servers_len(&self) -> usize {
        self.servers.len()
    }

    /// Places one datagram (`orig_len` as the wire carried it); `None` when it
    /// is not on a QUIC server's flow. `dcid` gives the connection's short-header
    /// DCID for this direction when known, to find GSO segment boundaries.
    pub fn place(
        &mut self,
        at: Mono,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
        orig_len: usize,
        dcid: impl Fn(&FlowId, Dir) -> Option<Vec<u8>>,
    ) -> Option<Placed> {
        let (flow, dir) = if self.is_server(dst) && !self.is_server(src) {
            (FlowId { client: src, server: dst }, Dir::C2s)
        } else if self.is_server(src) {
            (FlowId { client: dst, server: src }, Dir::S2c)
        } else if is_client_initial(payload) {
            self.servers.insert(dst);
            (FlowId { client: src, server: dst }, Dir::C2s)
        } else {
            self.unplaced += 1;
            if self.unplaced_pairs.len() < 10_000 {
                self.unplaced_pairs.insert((src.min(dst), src.max(dst)));
            }
            return None;
        };
        let segments = if orig_len > MAX_DATAGRAM && payload.len() == orig_len {
            let cid = dcid(&flow, dir);
            let segs = gso_segments(payload, cid.as_deref());
            if segs.len() > 1 {
                self.gso_split += 1;
            }
            segs
        } else {
            vec![(0, orig_len)]
        };
        self.live.insert(flow);
        let st = self.flows.entry(flow).or_default();
        st.last = at;
        let c = match dir {
            Dir::C2s => &mut st.counters.c2s,
            Dir::S2c => &mut st.counters.s2c,
        };
        for &(_, len) in &segments {
            count(c, at, len);
        }
        // The kernel's reply stamps: once per packet sent (a GSO batch once).
        if dir == Dir::S2c && segments.first().is_some_and(|s| s.1 >= hystall_common::REPLY_MIN as usize) {
            st.counters.replies.push(at);
        }
        // The kernel program's policy (hystall_common::flow::sampling).
        let mut head = [0u8; 5];
        let n = payload.len().min(5);
        head[..n].copy_from_slice(&payload[..n]);
        let sample = st.dirs[dir as usize].take(at.0, head, dir == Dir::C2s).then(|| {
            let first = segments.first().map_or(payload.len(), |s| s.1).min(payload.len());
            HeaderSample {
                flow,
                dir,
                payload_len: first as u32,
                segs: segments.len() as u32,
                bytes: payload[..first.min(SAMPLE_BYTES)].into(),
            }
        });
        Some(Placed { flow, dir, segments, sample })
    }

    /// Cumulative counters of the flows that saw a packet since `since` (the
    /// others leave the live set: a tick costs the live flows, not all of them).
    pub fn active(&mut self, since: Mono) -> Vec<(FlowId, FlowCounters)> {
        let flows = &self.flows;
        self.live.retain(|f| flows.get(f).is_some_and(|st| st.last >= since));
        self.live.iter().filter_map(|f| Some((*f, flows.get(f)?.counters.clone()))).collect()
    }
}

fn count(c: &mut DirCounters, at: Mono, len: usize) {
    let class = size_class(len as u32);
    c.packets[class] += 1;
    c.bytes[class] += len as u64;
    c.last[class] = Some(at);
    c.first.get_or_insert(at);
}

/// A client's first Initial: a long-header Initial of at least 1200 bytes
/// that opens with the Initial keys derived from its own DCID. A server pads
/// its Initials to 1200 bytes too, but they are protected with keys from the
/// client's DCID, not their own: taking one for a client's (a capture that
/// missed the first packet) would turn the flow around.
fn is_client_initial(payload: &[u8]) -> bool {
    if payload.len() < 1200 {
        return false;
    }
    let Some(Ok(p)) = packets(payload, Default::default()).next() else { return false };
    let Header::Long(h) = &p.header else { return false };
    if h.packet_type != LongType::Initial {
        return false;
    }
    let Ok(secrets) = initial_secrets(h.version, h.dcid) else { return false };
    let Ok(keys) = PacketKeys::from_secret(h.version, Suite::Aes128Gcm, &secrets.client) else { return false };
    let Some(bytes) = p.offset.checked_add(p.len).and_then(|end| payload.get(p.offset..end)) else { return false };
    let Some(pn_offset) = h.pn_offset.checked_sub(p.offset) else { return false };
    let mut buf = bytes.to_vec();
    let Ok(u) = remove_header_protection(&keys.header, &mut buf, pn_offset, None) else { return false };
    keys.payload.open(u.pn, &mut buf, u.header_len).is_ok()
}

/// Splits a GSO super-packet into its segments: all of one size but the last.
/// The size is the smallest at which every segment starts like the first: the
/// same header form and the same DCID (or, unknown, the same 4 bytes after the
/// first). Long headers and anything else are left whole.
pub fn gso_segments(payload: &[u8], dcid: Option<&[u8]>) -> Vec<(usize, usize)> {
    let Some(&first) = payload.first() else { return vec![(0, 0)] };
    // Without the DCID, the bytes where one would be (4 at least in practice:
    // quic-go 4, quinn 8): a short header's DCID repeats in every segment,
    // while a random match of 4 bytes inside ciphertext does not happen.
    let guessed = payload.get(1..5).filter(|_| first & 0x80 == 0);
    let cid = dcid.filter(|c| !c.is_empty()).or(guessed);
    let Some(cid) = cid else { return vec![(0, payload.len())] };
    let min = 21;
    let fits = |s: usize| {
        (1..).map(|k| k * s).take_while(|&o| o < payload.len()).all(|o| {
            // The form bit only: the fixed bit may be greased (RFC 9287, quinn does).
            payload[o] & 0x80 == first & 0x80 && payload.get(o + 1..o + 1 + cid.len()) == Some(cid)
        })
    };
    match (min..=MAX_DATAGRAM.min(payload.len().saturating_sub(1))).find(|&s| fits(s)) {
        Some(s) => (0..payload.len()).step_by(s).map(|o| (o, s.min(payload.len() - o))).collect(),
        None => vec![(0, payload.len())],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gso_super_packets_split_at_the_repeated_header() {
        let cid = [0xaa, 0xbb, 0xcc, 0xdd];
        let mut p = Vec::new();
        for i in 0..10u8 {
            let mut seg = vec![0x40 | (i & 0x1f)];
            seg.extend_from_slice(&cid);
            seg.resize(if i == 9 { 700 } else { 1452 }, i.wrapping_mul(37));
            p.extend_from_slice(&seg);
        }
        let segs = gso_segments(&p, Some(&cid));
        assert_eq!(segs.len(), 10);
        assert!(segs[..9].iter().all(|s| s.1 == 1452));
        assert_eq!(segs[9], (9 * 1452, 700));
        // Without the DCID, sizes of 1000+ still split.
        assert_eq!(gso_segments(&p, None).len(), 10);
        // Garbage: one segment, no panic.
        // Ciphertext-like bytes: nothing repeats, nothing is split.
        let mut x = 0x2545f4914f6cdd1du64;
        let noise: Vec<u8> = (0..3000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut short = noise.clone();
        short[0] = 0x41;
        assert_eq!(gso_segments(&short, None).len(), 1);
        let mut long = noise;
        long[0] = 0xc1;
        assert_eq!(gso_segments(&long, None).len(), 1);
        assert_eq!(gso_segments(&[0x00, 0xff, 0x13][..], None), vec![(0, 3)]);
        assert_eq!(gso_segments(&[][..], None), vec![(0, 0)]);
    }
}
