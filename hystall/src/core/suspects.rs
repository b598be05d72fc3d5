//! `--decrypt`: which connections to read, and how closely. Two tiers:
//!
//! - *watched*: connections that carried bulk recently while a target socket
//!   of the proxy is blocked. Only their snips are read (the kernel keeps,
//!   per flow, the client's last large packet and the small ones after it,
//!   where a client that runs out of credit says DATA_BLOCKED): a map lookup
//!   a tick, no packet copied.
//! - *passed*: connections the detector flags, or whose frames say the client
//!   is blocked. The classifier passes their packets (within a byte budget),
//!   so their ACK, DATAGRAM and STREAM frames show whether they stay blocked.
//!
//! The frames then say, exactly, whether each is starved.

use std::time::Duration;

use super::flows::{Dir, FlowId};
use super::model::Model;
use super::time::Mono;
use super::verdict::Verdict;

/// Bulk this long ago at most makes a connection worth watching.
const RECENT_BULK: Duration = Duration::from_secs(120);
/// Client bytes a connection must have sent to count as having had bulk (a
/// handshake's full-size Initial packets are not bulk).
const BULK_BYTES: u64 = 1 << 20;
/// Connections passed / watched at once.
pub const MAX_PASSED: usize = 64;
pub const MAX_WATCHED: usize = 1024;

/// A connection to read, with what decrypting its short headers needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspect {
    pub conn: u64,
    pub flows: Vec<FlowId>,
    /// Length of the server's connection IDs (client short headers).
    pub cid_len: Option<usize>,
    /// Pass its packets (else only its snips are read).
    pub pass: bool,
}

/// The suspects now, passed ones first, the most recent bulk first.
pub fn suspects(m: &Model, now: Mono) -> Vec<Suspect> {
    let held = m
        .sockets
        .iter()
        .any(|s| s.k.outbound && s.closed.is_none() && (s.k.blocked_since.is_some() || s.verdict != Verdict::Ok));
    let mut ranked: Vec<(bool, std::cmp::Reverse<Mono>, u64)> = Vec::new();
    for c in m.conns.iter().filter(|c| c.closed.is_none() && c.grouping != super::conns::Grouping::Obfuscated) {
        let bulk = c.last_bulk(Dir::C2s);
        let blocked = c.frames.as_ref().is_some_and(|f| f.data_blocked.is_some());
        if m.detector.get(c.id).is_some() || blocked {
            ranked.push((false, std::cmp::Reverse(bulk.unwrap_or(c.first_seen)), c.id));
        } else if held
            && c.c2s.total_bytes() >= BULK_BYTES
            && let Some(b) = bulk
            && now.since(b) <= RECENT_BULK
        {
            ranked.push((true, std::cmp::Reverse(b), c.id));
        }
    }
    ranked.sort();
    let (passed, watched): (Vec<_>, Vec<_>) = ranked.into_iter().partition(|r| !r.0);
    passed
        .into_iter()
        .take(MAX_PASSED)
        .chain(watched.into_iter().take(MAX_WATCHED))
        .filter_map(|(watch_only, _, id)| m.conns.get(id).map(|c| (watch_only, c)))
        .map(|(watch_only, c)| Suspect { conn: c.id, flows: c.flows.clone(), cid_len: c.cid_len(), pass: !watch_only })
        .collect()
}
