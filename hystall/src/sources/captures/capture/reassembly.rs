//! IP fragment reassembly (IPv4 and IPv6), bounded in datagrams, bytes and capture time.
//!
//! QUIC avoids fragmentation, but a proxy's TCP side or a tunnel may not, and a datagram
//! lost to reassembly would look like a stall. Limits keep a hostile or broken capture from
//! growing memory: at most [`MAX_PENDING`] datagrams of at most 64 KiB each, each dropped
//! after [`TIMEOUT_NS`] of capture time. Overlapping fragments with different bytes, or
//! fragments that disagree on where the datagram ends, drop the datagram (counted): there
//! is no right answer, and triage must not guess.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::ip::Fragment;
use super::stats::{SkipReason, Stats};

pub(super) const MAX_PENDING: usize = 1024;
pub(super) const TIMEOUT_NS: u64 = 30_000_000_000;
/// No IP datagram's payload reaches past this.
const MAX_DATAGRAM: usize = 65_535;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct FragKey {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub id: u32,
}

struct Pending {
    first_ts: u64,
    /// Fragment data by offset; never overlapping.
    parts: BTreeMap<usize, Vec<u8>>,
    /// Bytes held, which equals the total once every hole is filled.
    bytes: usize,
    /// The payload length, known once the last fragment arrived.
    total: Option<usize>,
}

#[derive(Default)]
pub(super) struct Reassembler {
    pending: HashMap<FragKey, Pending>,
}

impl Reassembler {
    /// Adds a fragment; returns the datagram's payload once it is complete.
    pub(super) fn add(
        &mut self,
        ts: u64,
        key: FragKey,
        frag: Fragment,
        data: &[u8],
        stats: &mut Stats,
    ) -> Option<Vec<u8>> {
        self.expire(ts, stats);
        let end = frag.offset + data.len();
        if data.is_empty() || end > MAX_DATAGRAM {
            stats.skip(SkipReason::FragmentMalformed);
            return None;
        }
        if !self.pending.contains_key(&key) && self.pending.len() >= MAX_PENDING {
            self.evict_oldest(stats);
        }
        let entry = self.pending.entry(key).or_insert_with(|| Pending {
            first_ts: ts,
            parts: BTreeMap::new(),
            bytes: 0,
            total: None,
        });
        match entry.insert(frag, data) {
            Err(reason) => {
                self.pending.remove(&key);
                stats.skip(reason);
                None
            }
            Ok(()) if entry.total == Some(entry.bytes) => {
                let done = self.pending.remove(&key)?;
                stats.fragments_reassembled += 1;
                Some(done.parts.into_values().flatten().collect())
            }
            Ok(()) => None,
        }
    }

    /// Drops datagrams older than the timeout, in capture time.
    fn expire(&mut self, now: u64, stats: &mut Stats) {
        let before = self.pending.len();
        self.pending.retain(|_, p| now.saturating_sub(p.first_ts) <= TIMEOUT_NS);
        for _ in self.pending.len()..before {
            stats.skip(SkipReason::FragmentTimeout);
        }
    }

    fn evict_oldest(&mut self, stats: &mut Stats) {
        let oldest = self.pending.iter().min_by_key(|(_, p)| p.first_ts).map(|(k, _)| *k);
        if let Some(k) = oldest {
            self.pending.remove(&k);
            stats.skip(SkipReason::FragmentEvicted);
        }
    }

    /// Counts the datagrams still incomplete at the end of the file.
    pub(super) fn finish(&mut self, stats: &mut Stats) {
        for _ in self.pending.drain() {
            stats.skip(SkipReason::FragmentIncompleteAtEof);
        }
    }
}

impl Pending {
    fn insert(&mut self, frag: Fragment, data: &[u8]) -> Result<(), SkipReason> {
        let (start, end) = (frag.offset, frag.offset + data.len());
        if !frag.more {
            if self.total.is_some_and(|t| t != end)
                || self.parts.iter().next_back().is_some_and(|(s, d)| s + d.len() > end)
            {
                return Err(SkipReason::FragmentInconsistent);
            }
            self.total = Some(end);
        } else if self.total.is_some_and(|t| end > t) {
            return Err(SkipReason::FragmentInconsistent);
        }
        if let Some(existing) = self.parts.get(&start) {
            if existing.as_slice() == data {
                return Ok(()); // a retransmitted duplicate
            }
            return Err(SkipReason::FragmentOverlap);
        }
        let before = self.parts.range(..start).next_back().is_some_and(|(s, d)| s + d.len() > start);
        let after = self.parts.range(start..).next().is_some_and(|(s, _)| *s < end);
        if before || after {
            return Err(SkipReason::FragmentOverlap);
        }
        self.parts.insert(start, data.to_vec());
        self.bytes += data.len();
        Ok(())
    }
}
