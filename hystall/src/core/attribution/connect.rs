//! Connect evidence: the proxy dials a target right after the request that
//! opened the stream arrived, so the connection that sent it had a client
//! packet in the moments before the connect. The flow poll after the connect
//! tells, for every connection, when its last client packet was: one whose
//! last packet is older than the window cannot have sent the request.

use std::cmp::Reverse;
use std::time::Duration;

use crate::core::activity::Digest;
use crate::core::conns::ConnTable;
use crate::core::time::Mono;

/// What a connect asks of an active connection, copied out of it once per
/// poll: at node scale each poll's hundred connects read the front of a list
/// of thousands, and reading the connections themselves (boxed, each a cache
/// miss, and its owner found through its flows) for every connect, and in
/// the sort, was most of the attribution's time.
#[derive(Clone, Copy, Debug)]
pub struct Active {
    id: u64,
    /// Its last client packet.
    last: Mono,
    /// Its first client packet, as the kernel stamped it (the connection
    /// itself may be set up from a later poll or sample).
    began: Mono,
    owner: Option<u32>,
}

/// The open connections with a client packet since `from`, the most recently
/// active first: what the connects of one poll are matched against (built
/// and sorted once per poll, from the digests of the ticks since then, not
/// the whole table; each connect then reads only the front of it).
pub fn recent(conns: &ConnTable, from: Mono, owner_of: &dyn Fn(&Digest) -> Option<u32>) -> Vec<Active> {
    let mut out: Vec<Active> = conns
        .active_since(from)
        .into_iter()
        .filter_map(|d| Some(Active { id: d.id, last: d.last?, began: d.began, owner: owner_of(&d) }))
        .collect();
    out.sort_unstable_by_key(|a| Reverse((a.last, a.id)));
    out
}

/// The connections of `pid` that may have sent the request for a connect at
/// `at` (at most `max`, the most recently active first), and whether more
/// were possible than are kept. `recent` is [`recent`]'s list, as of the
/// first flow poll after the connect.
pub fn candidates(at: Mono, pid: u32, window: Duration, max: usize, recent: &[Active]) -> (Vec<u64>, bool) {
    let from = Mono(at.0.saturating_sub(window.as_nanos() as u64));
    let mut out = Vec::new();
    for c in recent {
        // Sorted by last client packet: the rest are older still.
        if c.last < from {
            break;
        }
        if c.began > at || c.owner.is_some_and(|p| p != pid && pid != 0) {
            continue;
        }
        if out.len() == max {
            return (out, true);
        }
        out.push(c.id);
    }
    (out, false)
}
