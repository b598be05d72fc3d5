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

/// How long before a target's connect the bytes it takes may have arrived:
/// a client sends its request and the upload behind it at once, and the
/// server holds them in the stream's buffer until its dial completes (the
/// connect rule's window: the request arrives within it). With many clients
/// starting together on a loaded node the dial comes milliseconds late, and
/// counting from the connect itself ruled out every assignment, the true
/// one included. It is not a bound (docs/DETECTOR.md: a dial that came
/// later than this after its bytes, and the wrong tie it made); allowing
/// the bytes a waiting stream can hold (up to a stream window) instead made
/// this rule say nothing of stalled targets, which take less than that.
pub const LEAD: std::time::Duration = std::time::Duration::from_millis(300);

/// Whether connection `c` can have carried the bytes of all of `set`: for
/// each target's start, the targets that started then or later took no more
/// than the connection carried since `LEAD` before it (a target takes
/// nothing before its connect, so bytes carried before that went elsewhere).
pub fn carried(c: &ConnSeries, set: &[&Target]) -> bool {
    carried_fails(c, set).is_none()
}

/// Where `carried` fails, the first (from, at, need, have) found: the
/// targets started at or after `from` needed `need` bytes by `at` and the
/// connection carried `have` since `LEAD` before `from` (the debug log's).
pub fn carried_fails(c: &ConnSeries, set: &[&Target]) -> Option<(Mono, Mono, u64, u64)> {
    let slack_for = |n: usize| MARK_BYTES * (n + c.per_cpu.len().max(1)) as u64;
    let mut starts: Vec<Mono> = set.iter().map(|t| t.start).collect();
    starts.sort_unstable();
    starts.dedup();
    let mut times = Vec::with_capacity(set.len() * 4);
    for from in starts {
        let later: Vec<&&Target> = set.iter().filter(|t| t.start >= from).collect();
        // Its points older than the horizon are gone: from before them,
        // what it carried since is known only to be at most its count.
        let base = c.series.least_at(Mono(from.0.saturating_sub(LEAD.as_nanos() as u64)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::flows::FlowId;

    fn ms(v: u64) -> Mono {
        Mono(v * 1_000_000)
    }

    #[test]
    fn carried_still_holds_once_the_connections_early_points_are_forgotten() {
        let flow = FlowId { client: "10.0.0.2:1001".parse().unwrap(), server: "10.0.0.1:443".parse().unwrap() };
        let mut c = ConnSeries::new();
        for k in 1..=100 {
            c.mark(flow, 0, ms(400 + k * 10), k * MARK_BYTES);
        }
        // A target dialled at 400 ms took half of it by 905 ms.
        let mut t = Target::new(1, ms(400));
        for k in 1..=50 {
            t.series.push(ms(405 + k * 10), k * MARK_BYTES);
        }
        assert!(carried(&c, &[&t]));
        // The horizon passes 1 s: the connection's points before it go, the
        // target's stay. What it carried from 400 ms on is no longer known to
        // be as little as its first point left says.
        c.series.forget_before(ms(1000));
        assert!(carried(&c, &[&t]), "the connection that fed it is not ruled out by our forgetting");
    }
}
