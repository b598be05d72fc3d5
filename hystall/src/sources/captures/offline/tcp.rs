//! The socket probes' job, done on a capture: each TCP connection seen becomes
//! a socket of its connecting side, with the progress facts the verdicts use.
//! On the wire a writer blocked on a target that stopped reading shows as the
//! target's receive window closed at zero (the sender only sends window
//! probes) and the acknowledged sequence number frozen; a slow reader opens
//! the window again and acknowledges more, so it never stalls — the same rule
//! as live, from the other side of the socket.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::core::observation::{Observation, SockChange, SockSample};
use crate::core::time::Mono;
use crate::sources::captures::capture::TcpFlags;

const ESTABLISHED: u8 = 1;
const SYN_SENT: u8 = 2;
const FIN_WAIT1: u8 = 4;
const CLOSE: u8 = 7;
const CLOSE_WAIT: u8 = 8;
/// What the report calls the sockets of a capture (no process is known).
pub const COMM: &str = "(capture)";

/// One TCP segment, as the capture reader gives it.
pub struct Segment {
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    pub window: u16,
    pub wscale: Option<u8>,
    pub payload_len: usize,
}

struct Conn {
    sample: SockSample,
    /// Local = the connecting side (the proxy, for a target connection).
    local: SocketAddr,
    isn: Option<u32>,
    /// Highest sequence end sent by the local side, relative to `isn`.
    sent: u64,
    /// Highest acknowledgement from the peer, relative to `isn`.
    acked: u64,
    wscale: [Option<u8>; 2],
    fin: [bool; 2],
    /// Sequence numbers are tracked relative to the first one seen, extended
    /// to 64 bits (a connection moves more than 4 GiB): (last raw, extended).
    base_seq: Option<u32>,
    seq_ext: (u32, u64),
    ack_ext: (u32, u64),
    dirty: bool,
    /// In the table's dirty list.
    queued: bool,
    /// The last segment either way.
    seen: Mono,
}

type Key = (SocketAddr, SocketAddr);

#[derive(Default)]
pub struct TcpTable {
    conns: HashMap<Key, Conn>,
    /// Connections with news since the last flush (a flush costs these only).
    dirty: Vec<Key>,
    next_cookie: u64,
    last_sweep: Mono,
    pub segments: u64,
}

/// A connection without a segment for this long has left the capture (a
/// stalled sender's window probes back off to 120 s at most): it is reported
/// gone and forgotten, so a long capture's table stays bounded.
const SILENT: std::time::Duration = std::time::Duration::from_secs(300);

impl TcpTable {
    /// Applies one segment; change events go to `out` at once, polls at `flush`.
    pub fn segment(&mut self, at: Mono, src: SocketAddr, dst: SocketAddr, s: &Segment, out: &mut Vec<Observation>) {
        self.segments += 1;
        let key = (src.min(dst), src.max(dst));
        let syn_only = s.flags.contains(TcpFlags::SYN) && !s.flags.contains(TcpFlags::ACK);
        if syn_only && self.conns.get(&key).is_some_and(|c| c.sample.state == CLOSE) {
            self.conns.remove(&key);
        }
        let c = self.conns.entry(key).or_insert_with(|| {
            self.next_cookie += 1;
            // The connecting side: the SYN's sender; mid-connection, the side
            // with the higher (ephemeral) port.
            let local = if syn_only || src.port() > dst.port() { src } else { dst };
            let remote = if local == src { dst } else { src };
            Conn {
                sample: SockSample {
                    cookie: self.next_cookie,
                    pid: 0,
                    comm: COMM.into(),
                    local: Some(local),
                    remote: Some(remote),
                    outbound: true,
                    state: if syn_only { SYN_SENT } else { ESTABLISHED },
                    first_seen: Some(at),
                    ..Default::default()
                },
                local,
                isn: None,
                sent: 0,
                acked: 0,
                wscale: [None, None],
                fin: [false, false],
                base_seq: None,
                seq_ext: (0, 0),
                ack_ext: (0, 0),
                dirty: true,
                queued: false,
                seen: at,
            }
        });
        c.seen = at;
        let from_local = src == c.local;
        let side = usize::from(!from_local);
        if s.flags.contains(TcpFlags::SYN) {
            c.wscale[side] = s.wscale;
        }
        if from_local {
            let base = *c.base_seq.get_or_insert(s.seq);
            let end = extend(&mut c.seq_ext, s.seq.wrapping_sub(base)) + s.payload_len as u64;
            if end > c.sent && s.payload_len > 0 {
                c.sent = end;
                c.sample.send_bytes = end;
                c.sample.send_calls += 1;
                c.sample.last_send = Some(at);
                c.dirty = true;
            }
        } else if s.flags.contains(TcpFlags::ACK)
            && let Some(base) = c.base_seq
        {
            let acked = extend(&mut c.ack_ext, s.ack.wrapping_sub(base));
            // Wrapped past what was sent: an old or foreign ACK.
            if acked > c.acked && acked <= c.sent + 1 {
                c.acked = acked;
                c.sample.acked_bytes = acked;
                c.sample.acks += 1;
                c.sample.last_ack = Some(at);
                c.dirty = true;
            }
            // Windows are scaled once both SYNs offered the option.
            let shift = match c.wscale {
                [Some(_), Some(peer)] => peer.min(14),
                _ => 0,
            };
            let window = u32::from(s.window) << shift;
            if window != c.sample.peer_window {
                c.sample.peer_window = window;
                c.dirty = true;
            }
            // Zero window with data outstanding or waiting: the writer is blocked.
            let outstanding = c.sent > c.acked;
            if window == 0 && (outstanding || c.sample.send_bytes > 0) && c.sample.blocked_since.is_none() {
                c.sample.blocked_since = Some(at);
                c.sample.send_eagain += 1;
                out.push(Observation::Sock { at, change: SockChange::Blocked, sample: c.sample.clone() });
            } else if window > 0 && c.sample.blocked_since.is_some() {
                c.sample.blocked_since = None;
                out.push(Observation::Sock { at, change: SockChange::Unblocked, sample: c.sample.clone() });
            }
        }
        let old = c.sample.state;
        if s.flags.contains(TcpFlags::RST) {
            c.sample.state = CLOSE;
        } else if s.flags.contains(TcpFlags::FIN) {
            c.fin[side] = true;
            c.sample.state = match (c.fin[0], c.fin[1]) {
                (true, true) => CLOSE,
                (true, false) => FIN_WAIT1,
                _ => CLOSE_WAIT,
            };
        } else if c.sample.state == SYN_SENT && s.flags.contains(TcpFlags::ACK) && !from_local {
            c.sample.state = ESTABLISHED;
        }
        if c.sample.state != old {
            let change = if c.sample.state == CLOSE {
                SockChange::Destroyed
            } else {
                SockChange::State { old, new: c.sample.state }
            };
            out.push(Observation::Sock { at, change, sample: c.sample.clone() });
            c.dirty = false;
        }
        c.isn.get_or_insert(s.seq);
        if c.dirty && !c.queued {
            c.queued = true;
            self.dirty.push(key);
        }
    }

    /// Polls of the sockets that moved since the last flush.
    pub fn flush(&mut self, at: Mono, out: &mut Vec<Observation>) {
        for key in std::mem::take(&mut self.dirty) {
            let Some(c) = self.conns.get_mut(&key) else { continue };
            c.queued = false;
            if c.dirty && c.sample.state != CLOSE {
                c.dirty = false;
                out.push(Observation::Sock { at, change: SockChange::Poll, sample: c.sample.clone() });
            }
        }
        // Every 10 s: forget closed connections after a minute, and silent
        // ones (reported gone) after SILENT.
        if at.since(self.last_sweep).as_secs() < 10 {
            return;
        }
        self.last_sweep = at;
        self.conns.retain(|_, c| {
            let quiet = at.since(c.seen);
            if c.sample.state == CLOSE {
                return quiet.as_secs() < 60;
            }
            if quiet >= SILENT {
                c.sample.state = CLOSE;
                out.push(Observation::Sock { at, change: SockChange::Destroyed, sample: c.sample.clone() });
                return false;
            }
            true
        });
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }
}

/// A 32-bit sequence number (relative) extended to 64 bits from the last one
/// seen: the nearest value, forward or a little back (reordering).
fn extend(last: &mut (u32, u64), raw: u32) -> u64 {
    let diff = i64::from(raw.wrapping_sub(last.0) as i32);
    let ext = last.1.saturating_add_signed(diff);
    if diff > 0 {
        *last = (raw, ext);
    }
    ext
}

#[cfg(test)]
mod tests {
    #[test]
    fn sequence_numbers_extend_past_4_gib() {
        let mut last = (0u32, 0u64);
        let mut want = 0u64;
        for _ in 0..5000 {
            want += 1_000_000;
            assert_eq!(super::extend(&mut last, want as u32), want);
        }
        assert!(want > 1 << 32);
        // A little back (a retransmission) is not a wrap.
        assert_eq!(super::extend(&mut last, (want - 1000) as u32), want - 1000);
    }

    use super::*;
    use crate::core::sockets::SocketTable;
    use crate::core::verdict::{Thresholds, Verdict};

    fn s(secs: f64) -> Mono {
        Mono::from_secs_f64(secs)
    }

    fn seg(seq: u32, ack: u32, flags: TcpFlags, window: u16, len: usize) -> Segment {
        Segment { seq, ack, flags, window, wscale: Some(7), payload_len: len }
    }

    /// A proxy writes into a target; `reads` says whether the target keeps reading.
    fn run(reads: bool) -> Verdict {
        let proxy: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let target: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let mut t = TcpTable::default();
        let mut out = Vec::new();
        let ack = TcpFlags::ACK;
        t.segment(s(0.0), proxy, target, &seg(1000, 0, TcpFlags::SYN, 64240, 0), &mut out);
        t.segment(s(0.0), target, proxy, &seg(5000, 1001, TcpFlags::SYN | ack, 65160, 0), &mut out);
        let mut seq = 1001u32;
        let mut time = 0.1;
        for i in 0..200u16 {
            // The target's window shrinks to zero unless it reads; then the
            // proxy can only send window probes (no new data).
            let win = if reads { 200 } else { 200u16.saturating_sub(i * 4) };
            if win > 0 {
                t.segment(s(time), proxy, target, &seg(seq, 5001, ack, 502, 1448), &mut out);
                seq += 1448;
            } else {
                t.segment(s(time), proxy, target, &seg(seq - 1, 5001, ack, 502, 0), &mut out);
            }
            t.segment(s(time), target, proxy, &seg(5001, seq, ack, win, 0), &mut out);
            time += 0.05;
            t.flush(s(time), &mut out);
        }
        let mut table =
            SocketTable::new(Thresholds { stall_timeout: std::time::Duration::from_secs(3), ..Default::default() });
        for o in out {
            table.apply(o);
        }
        table.tick(s(time + 4.0));
        table.iter().next().unwrap().verdict
    }

    #[test]
    fn a_target_that_stops_reading_stalls_the_connecting_side() {
        assert_eq!(run(false), Verdict::Stalled);
    }

    #[test]
    fn a_target_that_keeps_reading_never_stalls() {
        assert_eq!(run(true), Verdict::Ok);
    }
}
