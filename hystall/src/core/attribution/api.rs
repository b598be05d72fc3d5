//! Exact evidence: the server's own table of relayed connections. The Clash API
//! (sing-box's `experimental.clash_api`, mihomo's `external-controller`) lists
//! each relayed TCP connection with the inbound that accepted it, the client's
//! address — for a QUIC inbound, the client's UDP address, which names the
//! QUIC connection — the destination, the bytes uploaded and when it started.
//! Each record is matched to the target socket the server dialled for it: the
//! same destination, a connect at the record's start, the same bytes sent.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::Target;
use crate::core::conns::ConnTable;
use crate::core::sockets::SocketTable;
use crate::core::time::Mono;

/// A record and a socket more than this apart in start time are not one.
const MAX_START_GAP_NS: u64 = 3_000_000_000;

/// One relayed TCP connection as the server reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayRecord {
    /// The server's id of the relayed connection.
    pub id: String,
    /// The inbound that accepted it, as the server names it (sing-box:
    /// `hysteria2/hy2-in`; mihomo: `Hysteria2`...).
    pub inbound: String,
    /// Where the client came from (for a QUIC inbound: its UDP address).
    pub source: Option<SocketAddr>,
    /// The destination's address, when the server resolved it.
    pub dest_ip: Option<IpAddr>,
    pub dest_port: u16,
    /// Bytes the client sent (what the server wrote into the target).
    pub upload: u64,
    pub start: Mono,
    /// The process that serves the API, when known.
    pub pid: Option<u32>,
}

impl RelayRecord {
    /// Whether the inbound is a QUIC one (Hysteria, Hysteria2, TUIC).
    pub fn quic_inbound(&self) -> bool {
        let i = self.inbound.to_ascii_lowercase();
        ["hysteria", "tuic", "quic"].iter().any(|k| i.contains(k))
    }
}

/// An open target socket a record may be: (cookie, remote IP, pid, start, bytes sent).
type Candidate = (u64, IpAddr, u32, Mono, u64);

/// (target cookie, its connection) for each record matched to a target
/// socket; the connection is None when the record's inbound is not a QUIC
/// one (the target belongs to no QUIC connection). A record of a QUIC inbound
/// whose client address no connection has says nothing.
pub fn match_relays(
    records: &[RelayRecord],
    conns: &ConnTable,
    socks: &SocketTable,
    targets: &super::Map<u64, Target>,
) -> Vec<(u64, Option<u64>)> {
    // Candidate sockets by destination port (a record's port is always known).
    let mut by_port: HashMap<u16, Vec<Candidate>> = HashMap::new();
    for s in socks.iter().filter(|s| s.closed.is_none() && s.k.outbound) {
        let Some(remote) = s.remote() else { continue };
        let start = targets.get(&s.k.cookie).and_then(|t| t.connect).or(s.k.first_seen).unwrap_or_default();
        by_port.entry(remote.port()).or_default().push((s.k.cookie, remote.ip(), s.k.pid, start, s.k.send_bytes));
    }
    let mut pairs: Vec<(u64, usize, u64)> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        for &(cookie, ip, pid, start, sent) in by_port.get(&r.dest_port).into_iter().flatten() {
            if r.dest_ip.is_some_and(|d| d.to_canonical() != ip.to_canonical()) || r.pid.is_some_and(|p| p != pid) {
                continue;
            }
            let gap = start.0.abs_diff(r.start.0);
            if gap > MAX_START_GAP_NS {
                continue;
            }
            // Start time first (ms), then bytes (the two counters are read at
            // different moments, so only a large difference counts).
            let bytes = sent.abs_diff(r.upload);
            let cost = gap / 1_000_000 + bytes / (256 << 10);
            pairs.push((cost, i, cookie));
        }
    }
    pairs.sort_unstable();
    let (mut used_r, mut used_s) = (BTreeSet::new(), BTreeSet::new());
    let mut out = Vec::new();
    for (_, i, cookie) in pairs {
        if used_r.contains(&i) || used_s.contains(&cookie) {
            continue;
        }
        used_r.insert(i);
        used_s.insert(cookie);
        let r = &records[i];
        if !r.quic_inbound() {
            out.push((cookie, None));
        } else if let Some(conn) = r.source.and_then(|a| conns.conn_by_client(&a)) {
            out.push((cookie, Some(conn)));
        }
    }
    out
}
