//! Per-second timelines of connections and sockets, fed on every model tick:
//! the deltas of the cumulative counters, so the detail view shows the moment
//! stream data stopped. Bounded: `SECS` buckets each, histories of vanished
//! connections and sockets are dropped, and at most `MAX_SOCKS` socket
//! histories are kept (blocked sockets are admitted beyond it, up to twice).

use std::collections::{HashMap, VecDeque};

use crate::core::conns::Conn;
use crate::core::model::Model;
use crate::core::sockets::Socket;
use crate::core::time::Mono;

/// Seconds of history kept.
pub const SECS: usize = 120;
/// Socket histories kept (each is about 1.4 KiB).
pub const MAX_SOCKS: usize = 16_384;

/// Connection series: client full-size, client small (ack-sized and medium),
/// server full-size, server small; packets per second.
pub const C2S_BULK: usize = 0;
pub const C2S_SMALL: usize = 1;
pub const S2C_BULK: usize = 2;
pub const S2C_SMALL: usize = 3;

/// A ring of per-second buckets ending at `end` (a second of `Mono`).
#[derive(Clone, Debug)]
pub struct Ring<T: Copy + Default> {
    end: u64,
    buckets: VecDeque<T>,
}

impl<T: Copy + Default> Ring<T> {
    fn new(sec: u64) -> Self {
        // Grows as seconds pass: a short-lived socket never costs the full ring.
        let mut buckets = VecDeque::new();
        buckets.push_back(T::default());
        Ring { end: sec, buckets }
    }

    /// The bucket of second `sec` (later seconds open new zero buckets).
    fn at(&mut self, sec: u64) -> &mut T {
        if sec > self.end {
            let gap = (sec - self.end).min(SECS as u64);
            for _ in 0..gap {
                if self.buckets.len() == SECS {
                    self.buckets.pop_front();
                }
                self.buckets.push_back(T::default());
            }
            self.end = sec;
        }
        self.buckets.back_mut().expect("never empty")
    }

    /// The last `n` seconds up to `sec` (oldest first, missing seconds as zero).
    pub fn last(&self, sec: u64, n: usize) -> Vec<T> {
        let mut out = vec![T::default(); n];
        let lag = sec.saturating_sub(self.end) as usize;
        for (i, v) in self.buckets.iter().rev().enumerate() {
            let pos = i + lag;
            if pos >= n {
                break;
            }
            out[n - 1 - pos] = *v;
        }
        out
    }
}

#[derive(Clone, Debug)]
pub struct ConnHistory {
    prev: Option<[u64; 4]>,
    pub ring: Ring<[u32; 4]>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockBucket {
    /// Bytes the peer acknowledged in this second.
    pub acked: u32,
    /// Bytes sends moved into the socket in this second.
    pub sent: u32,
    /// Unsent bytes at the last sample of the second.
    pub unsent: u32,
}

#[derive(Clone, Debug)]
pub struct SockHistory {
    prev: Option<(u64, u64)>,
    pub ring: Ring<SockBucket>,
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub conns: HashMap<u64, ConnHistory>,
    pub socks: HashMap<u64, SockHistory>,
    /// The second vanished entries were last dropped.
    swept: u64,
}

fn sec_of(t: Mono) -> u64 {
    t.0 / 1_000_000_000
}

fn conn_totals(c: &Conn) -> [u64; 4] {
    [c.c2s.packets[2], c.c2s.packets[0] + c.c2s.packets[1], c.s2c.packets[2], c.s2c.packets[0] + c.s2c.packets[1]]
}

fn sock_totals(s: &Socket) -> (u64, u64) {
    let acked = s.k.acked_bytes.max(s.diag.as_ref().map_or(0, |d| d.bytes_acked));
    (acked, s.k.send_bytes)
}

fn sat32(v: u64) -> u32 {
    v.min(u32::MAX as u64) as u32
}

impl History {
    /// Records the model at `now` (after its tick).
    pub fn observe(&mut self, model: &Model, now: Mono) {
        let sec = sec_of(now);
        for c in model.conns.iter() {
            let h = self.conns.entry(c.id).or_insert_with(|| ConnHistory { prev: None, ring: Ring::new(sec) });
            let tot = conn_totals(c);
            let prev = h.prev.replace(tot);
            let b = h.ring.at(sec);
            if let Some(prev) = prev {
                for i in 0..4 {
                    b[i] = b[i].saturating_add(sat32(tot[i].saturating_sub(prev[i])));
                }
            }
        }
        // Vanished entries are dropped once a second (and at once when over the cap).
        let sweep = sec != self.swept || self.socks.len() > MAX_SOCKS;
        self.swept = sec;
        if sweep {
            self.conns.retain(|id, _| model.conns.get(*id).is_some());
            self.socks.retain(|c, _| model.sockets.get(*c).is_some());
        }

        let tracked = self.socks.len();
        for s in model.sockets.iter() {
            let blocked = || s.progress().blocked_since.is_some();
            let h = match self.socks.get_mut(&s.k.cookie) {
                Some(h) => h,
                None if tracked < MAX_SOCKS || (tracked < 2 * MAX_SOCKS && blocked()) => {
                    self.socks.entry(s.k.cookie).or_insert_with(|| SockHistory { prev: None, ring: Ring::new(sec) })
                }
                None => continue,
            };
            let tot = sock_totals(s);
            let prev = h.prev.replace(tot);
            let b = h.ring.at(sec);
            if let Some((acked, sent)) = prev {
                b.acked = b.acked.saturating_add(sat32(tot.0.saturating_sub(acked)));
                b.sent = b.sent.saturating_add(sat32(tot.1.saturating_sub(sent)));
            }
            if let Some(d) = &s.diag {
                b.unsent = d.notsent;
            }
        }
    }

    /// The last `n` seconds of one connection series (`C2S_BULK`, ...).
    pub fn conn_series(&self, conn: u64, series: usize, now: Mono, n: usize) -> Vec<u64> {
        self.conns
            .get(&conn)
            .map(|h| h.ring.last(sec_of(now), n).into_iter().map(|b| b[series] as u64).collect())
            .unwrap_or_else(|| vec![0; n])
    }

    /// The last `n` seconds of one socket, through `f`.
    pub fn sock_series(&self, cookie: u64, now: Mono, n: usize, f: impl Fn(&SockBucket) -> u64) -> Vec<u64> {
        self.socks
            .get(&cookie)
            .map(|h| h.ring.last(sec_of(now), n).iter().map(&f).collect())
            .unwrap_or_else(|| vec![0; n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_seconds_and_fills_gaps_with_zero() {
        let mut r: Ring<u32> = Ring::new(10);
        *r.at(10) += 1;
        *r.at(11) += 2;
        *r.at(14) += 5;
        assert_eq!(r.last(14, 6), vec![0, 1, 2, 0, 0, 5]);
        assert_eq!(r.last(16, 3), vec![5, 0, 0]);
        for s in 15..400 {
            *r.at(s) += 1;
        }
        assert_eq!(r.buckets.len(), SECS);
    }
}
