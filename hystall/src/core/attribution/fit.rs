//! The two byte rules every true assignment of targets to connections obeys,
//! checked on the byte marks' series:
//!
//! - **carried**: bytes reach a target only after they arrived on the
//!   connection whose stream feeds it, so at every moment the targets tied to
//!   a connection have together taken no more than it carried since the first
//!   of them started;
//! - **explained**: what a connection carried went into its targets, its QUIC
//!   framing (a few per cent), its datagrams, or its receive window (unread
//!   bytes: at most the connection window) — so, for a connection seen from
//!   its start, its targets together explain all but that much of its bytes.
//!
//! Both allow for the marks' granularity (each series is known to within a
//! mark per CPU and per target).

use hystall_common::MARK_BYTES;

use super::{ConnSeries, Target};
use crate::core::time::Mono;

/// QUIC framing and retransmissions, at most, as a share of a connection's
/// client bytes (measured: 3.7–5.3 % for uploads through sing-box).
pub const FRAMING_MAX: f64 = 0.10;

/// Bytes `t` took by `at` since it started (0 before it started).
pub fn took(t: &Target, at: Mono) -> u64 {
    if at < t.start { 0 } else { t.series.at(at).saturating_sub(t.start_bytes) }
}

/// The moments at which the carried rule is checked for `t`: a few points
/// along its marks and its last one.
pub fn checkpoints(t: &Target, out: &mut Vec<Mono>) {
    let n = t.series.len();
    if n == 0 {
        return;
    }
    for q in [n / 4, n / 2, 3 * n / 4, n - 1] {
        if let Some(p) = t.series.point(q) {
            out.push(p.0);
        }
    }
}

/// How long before a target's connect the bytes it takes were counted
/// from until 2026-12-07: a client sends its request and the upload behind
/// it at once, and the server holds them in the stream's buffer until its
/// dial completes. It is not a bound: with eight clients starting together
/// on two loaded cores a dial came more than 300 ms after its bytes (a
/// target took 1.06 MB within 83 ms of its connect while its connection
/// had carried 778 KB since 300 ms before it), the true connection broke
/// the rule, and the target was tied to another client's. So `carried`
/// also allows each target what the connection carried in the `WAIT`
/// before that, up to a stream window (a set: the connection window),
/// which flow control bounds a waiting stream's bytes by.
pub const LEAD: std::time::Duration = std::time::Duration::from_millis(300);

/// How long a request's bytes may wait in its stream for the server's dial
/// to start, at most (a loaded node's scheduling; the dial's own time is
/// after the connect). Not without bound: a connection that went quiet
/// long before a dial (an early upload) did not feed it.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether connection `c` can have carried the bytes of all of `set`: for
/// each target's start, the targets that started then or later took no more
/// than the connection carried since `LEAD` before it, plus what it carried
/// in the `WAIT` before that, which their streams can have held waiting for
/// the dial (at most a stream window each, the connection window in all).
pub fn carried(c: &ConnSeries, set: &[&Target], w: Windows) -> bool {
    carried_fails(c, set, w).is_none()
}

/// Where `carried` fails, the first (from, at, need, have) found: the
/// targets started at or after `from` needed `need` bytes by `at` and the
/// connection can have given them `have` (the debug log's).
pub fn carried_fails(c: &ConnSeries, set: &[&Target], w: Windows) -> Option<(Mono, Mono, u64, u64)> {
    let slack_for = |n: usize| MARK_BYTES * (n + c.per_cpu.len().max(1)) as u64;
    let mut starts: Vec<Mono> = set.iter().map(|t| t.start).collect();
    starts.sort_unstable();
    starts.dedup();
    let mut times = Vec::with_capacity(set.len() * 4);
    for from in starts {
        let later: Vec<&&Target> = set.iter().filter(|t| t.start >= from).collect();
        let lead = c.series.at(Mono(from.0.saturating_sub(LEAD.as_nanos() as u64)));
        // Before its first point the series says nothing of when its first
        // bytes came: all of them may have (the lenient side).
        let wait_from = Mono(from.0.saturating_sub(WAIT.as_nanos() as u64));
        let before = match c.series.first() {
            Some((t0, _)) if t0 > wait_from => 0,
            _ => c.series.at(wait_from),
        };
        let waited = lead.saturating_sub(before);
        let held = w.conn.min(w.stream.saturating_mul(later.len() as u64)).min(waited);
        let base = lead - held;
        times.clear();
        for t in &later {
            checkpoints(t, &mut times);
        }
        let slack = slack_for(later.len());
        for &at in &times {
            let need: u64 = later.iter().map(|t| took(t, at)).sum();
            let have = c.series.at(at).saturating_sub(base);
            if need > have + slack {
                return Some((from, at, need, have));
            }
        }
    }
    None
}

/// The windows that bound what a connection can hold unread.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub stream: u64,
    pub conn: u64,
}

/// Bytes `t` took in (from, now]: what it can explain of a connection's.
pub fn took_between(t: &Target, from: Mono, now: Mono) -> u64 {
    took(t, now).saturating_sub(took(t, from))
}

/// The moments the explained rule is checked at by the loose floors: now
/// and a few of the connection's own marks since `from`, its last one
/// included (a starved connection's last: when its window filled). The
/// rule holds at every moment; targets that keep taking (slow ones) can
/// explain any connection's bytes by now, not by the moment it went quiet.
pub fn moments(c: &ConnSeries, from: Mono, now: Mono) -> Vec<Mono> {
    let len = c.series.len();
    let mut out = vec![now];
    for q in [len / 4, len / 2, 3 * len / 4, len.saturating_sub(1)] {
        if let Some((at, _)) = c.series.point(q)
            && at > from
            && at < now
            && !out.contains(&at)
        {
            out.push(at);
        }
    }
    out
}

/// How many bytes `c` carried since `from` that its targets leave
/// unexplained beyond what framing, datagrams and its receive windows allow
/// (at most a stream window per stream, and the connection window in all);
/// 0 when they explain enough. The targets are `n`, and took `into` bytes
/// together since `from` (`took_between`): the search keeps these sums as
/// it places targets, not the sets. `from` must be a moment since which
/// every target of `c` is known (its first packet, or a horizon after attach).
pub fn unexplained(c: &ConnSeries, n: usize, into: u64, from: Mono, now: Mono, w: Windows) -> u64 {
    let carried = c.series.at(now).saturating_sub(c.series.at(from));
    let unread = w.conn.min(w.stream.saturating_mul(n as u64));
    let allowed =
        unread + (carried as f64 * FRAMING_MAX) as u64 + c.datagrams + MARK_BYTES * (n + c.per_cpu.len().max(1)) as u64;
    carried.saturating_sub(into).saturating_sub(allowed)
}
