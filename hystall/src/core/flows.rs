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
    /// Inline up to the kernel's sample size: at node scale thousands of
    /// samples a second, and an allocation each was 6 % of hystall's time.
    pub bytes: SampleBytes,
}

/// A header sample's bytes (serialized as a `Vec<u8>` is).
pub type SampleBytes = smallvec::SmallVec<[u8; hystall_common::SAMPLE_BYTES]>;

/// Counters of one flow, both directions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowCounters {
    pub c2s: DirCounters,
    pub s2c: DirCounters,
    /// The last server packets larger than an ACK (older recordings: none).
    #[serde(default)]
    pub replies: Replies,
}

/// The times of a flow's last few *replies*: server → client packets of at
/// least `hystall_common::REPLY_MIN` bytes (`hystall_common::FlowStats::replies`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replies {
    /// Replies so far (the kernel's count wraps at 2^32).
    pub n: u32,
    /// The last `REPLY_SLOTS` of them, at slot `count % REPLY_SLOTS`.
    pub at: [u64; hystall_common::REPLY_SLOTS],
}

/// Whether a connection was answered in a span of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Reply {
    /// A reply was sent in it.
    Sent,
    /// Every reply since before it is known, and none was sent in it.
    None,
    /// Too many replies since: the ones in it were overwritten.
    Unknown,
}

impl Replies {
    /// One more reply at `at` (the capture reader's copy of the kernel's step).
    pub fn push(&mut self, at: Mono) {
        self.at[self.n as usize % hystall_common::REPLY_SLOTS] = at.0;
        self.n = self.n.wrapping_add(1);
    }

    /// Whether a reply was sent in `[from, to]`.
    pub fn within(&self, from: Mono, to: Mono) -> Reply {
        let kept = self.at.iter().take((self.n as usize).min(self.at.len())).filter(|&&t| t != 0);
        let mut oldest = u64::MAX;
        for &t in kept {
            if (from.0..=to.0).contains(&t) {
                return Reply::Sent;
            }
            oldest = oldest.min(t);
        }
        // Fewer than the slots: every reply is kept. Else the dropped ones
        // are older than the oldest kept, which must then precede the span.
        if (self.n as usize) <= self.at.len() || oldest < from.0 { Reply::None } else { Reply::Unknown }
    }
}

impl Reply {
    /// The answer over several flows (a port-hopping connection's paths).
    pub fn any(all: impl IntoIterator<Item = Reply>) -> Reply {
        let mut out = Reply::None;
        for r in all {
            match r {
                Reply::Sent => return Reply::Sent,
                Reply::Unknown => out = Reply::Unknown,
                Reply::None => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_bytes_are_recorded_as_a_vec_of_bytes_is() {
        for n in [0, 5, 64, 100] {
            let v: Vec<u8> = (0..n as u8).collect();
            let inline: SampleBytes = v.as_slice().into();
            let bytes = postcard::to_allocvec(&inline).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&v).unwrap(), "{n} bytes");
            assert_eq!(postcard::from_bytes::<SampleBytes>(&bytes).unwrap().as_slice(), v.as_slice());
        }
    }

    fn ms(v: u64) -> Mono {
        Mono(v * 1_000_000)
    }

    #[test]
    fn a_reply_in_the_span_is_sent_none_is_known_only_while_the_stamps_reach_back() {
        let mut r = Replies::default();
        assert_eq!(r.within(ms(10), ms(20)), Reply::None, "no reply yet");
        r.push(ms(5));
        r.push(ms(15));
        assert_eq!(r.within(ms(10), ms(20)), Reply::Sent);
        assert_eq!(r.within(ms(16), ms(30)), Reply::None);
        // Four more after the span: the slots no longer reach back to it.
        for at in [40, 41, 42, 43] {
            r.push(ms(at));
        }
        assert_eq!(r.within(ms(16), ms(30)), Reply::Unknown, "overwritten: never ruled out");
        assert_eq!(r.within(ms(41), ms(50)), Reply::Sent);
        assert_eq!(r.within(ms(44), ms(50)), Reply::None, "the kept stamps reach back past it");
        assert_eq!(Reply::any([Reply::None, Reply::Unknown]), Reply::Unknown);
        assert_eq!(Reply::any([Reply::None, Reply::Sent, Reply::Unknown]), Reply::Sent);
        assert_eq!(Reply::any([Reply::None, Reply::None]), Reply::None);
    }
}
