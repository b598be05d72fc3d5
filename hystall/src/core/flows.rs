//! UDP flow observations in user-space terms (from the TC probe, a capture or a
//! recording).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::time::Mono;

/// One client 5-tuple talking to one server endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FlowId {
    pub client: SocketAddr,
    pub server: SocketAddr,
}

/// Direction of a packet relative to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dir {
    /// Client → server (uploads, the client's ACKs and datagrams).
    C2s = 0,
    /// Server → client.
    S2c = 1,
}

/// Counters of one direction: packets and bytes per size class (ack-sized,
/// medium, full-size), and the last time each class was seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirCounters {
    pub packets: [u64; 3],
    pub bytes: [u64; 3],
    pub last: [Option<Mono>; 3],
    pub first: Option<Mono>,
}

impl DirCounters {
    pub fn total_packets(&self) -> u64 {
        self.packets.iter().sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }

    pub fn last_any(&self) -> Option<Mono> {
        self.last.iter().flatten().max().copied()
    }

    pub fn add(&mut self, o: &DirCounters) {
        for i in 0..3 {
            self.packets[i] += o.packets[i];
            self.bytes[i] += o.bytes[i];
            self.last[i] = self.last[i].max(o.last[i]);
        }
        self.first = match (self.first, o.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// The start of one packet's UDP payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderSample {
    pub flow: FlowId,
    pub dir: Dir,
    pub payload_len: u32,
    pub segs: u32,
    pub bytes: Vec<u8>,
}

/// Counters of one flow, both directions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowCounters {
    pub c2s: DirCounters,
    pub s2c: DirCounters,
}
