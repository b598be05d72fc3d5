//! `--decrypt`: which connections to read the frames of. Decrypting costs a
//! copy of every packet to user space, so only connections that may be
//! starved are read: those the detector flags, and those whose client bulk
//! stopped while the process has target sockets that stopped taking data.
//! The frames then say, exactly, whether each is starved.

use std::time::Duration;

use super::flows::{Dir, FlowId};
use super::model::Model;
use super::time::Mono;
use super::verdict::Verdict;

/// A connection whose bulk stopped this long ago at most is still a suspect.
const RECENT_STOP: Duration = Duration::from_secs(120);
/// ...and at least this long ago (a pause between two writes is not a stop).
const STOPPED_FOR: Duration = Duration::from_millis(500);
/// Client bytes a connection must have sent to count as having had bulk (a
/// handshake's full-size Initial packets are not bulk).
const BULK_BYTES: u64 = 1 << 20;

/// A connection to read, with what decrypting its short headers needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspect {
    pub conn: u64,
    pub flows: Vec<FlowId>,
    /// Length of the server's connection IDs (client short headers).
    pub cid_len: Option<usize>,
}

/// The suspects now, the most likely first: flagged connections, then those
/// whose bulk stopped most recently.
pub fn suspects(m: &Model, now: Mono) -> Vec<Suspect> {
    let held = m.sockets.iter().any(|s| s.k.outbound && s.closed.is_none() && s.verdict != Verdict::Ok);
    let mut ranked: Vec<(u8, std::cmp::Reverse<Mono>, u64)> = Vec::new();
    for c in m.conns.iter().filter(|c| c.closed.is_none() && c.grouping != super::conns::Grouping::Obfuscated) {
        if m.detector.get(c.id).is_some() {
            ranked.push((0, std::cmp::Reverse(now), c.id));
        } else if held
            && c.c2s.total_bytes() >= BULK_BYTES
            && let Some(b) = c.last_bulk(Dir::C2s)
            && now.since(b) >= STOPPED_FOR
            && now.since(b) <= RECENT_STOP
        {
            ranked.push((1, std::cmp::Reverse(b), c.id));
        }
    }
    ranked.sort();
    ranked
        .into_iter()
        .filter_map(|(_, _, id)| m.conns.get(id))
        .map(|c| Suspect { conn: c.id, flows: c.flows.clone(), cid_len: c.cid_len() })
        .collect()
}
