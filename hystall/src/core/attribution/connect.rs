//! Connect evidence: the proxy dials a target right after the request that
//! opened the stream arrived, so the connection that sent it had a client
//! packet in the moments before the connect. The flow poll after the connect
//! tells, for every connection, when its last client packet was: one whose
//! last packet is older than the window cannot have sent the request.

use std::time::Duration;

use crate::core::conns::{Conn, ConnTable};

/// The open connections with a client packet since `from`: what the
/// connects of one poll are matched against (built once per poll, not
/// once per connect over every connection).
pub fn recent(conns: &ConnTable, from: Mono) -> Vec<&Conn> {
    conns.iter().filter(|c| c.closed.is_none() && c.c2s.last_any().is_some_and(|t| t >= from)).collect()
}
use crate::core::time::Mono;

/// The connections of `pid` that may have sent the request for a connect at
/// `at` (at most `max`, the most recently active first), and whether more
/// were possible than are kept. Called with the connections as of the first
/// flow poll after the connect.
pub fn candidates(
    at: Mono,
    pid: u32,
    window: Duration,
    max: usize,
    conns: &[&Conn],
    owner_of: &dyn Fn(&Conn) -> Option<u32>,
) -> (Vec<u64>, bool) {
    let from = Mono(at.0.saturating_sub(window.as_nanos() as u64));

    let mut out: Vec<(Mono, u64)> = conns
        .iter()
        .copied()
        // Its first client packet, as the kernel stamped it (the connection
        // itself may be set up from a later poll or sample).
        .filter(|c| c.closed.is_none() && c.c2s.first.unwrap_or(c.first_seen).min(c.first_seen) <= at)
        .filter(|c| c.c2s.last_any().is_some_and(|t| t >= from))
        .filter(|c| owner_of(c).is_none_or(|p| p == pid || pid == 0))
        .map(|c| (c.c2s.last_any().unwrap_or_default(), c.id))
        .collect();
    let crowded = out.len() > max;
    out.sort_by(|a, b| b.cmp(a));
    out.truncate(max);
    (out.into_iter().map(|(_, id)| id).collect(), crowded)
}
