//! When decrypted frames prove a connection starved (`confirmed`), and when
//! they do not.
//!
//! The frames say, exactly, that the client is blocked at the server's
//! connection limit. They do not say why the server keeps the limit: a
//! connection whose streams go to slow targets is blocked at its limit too,
//! between two raises (quic-go raises MAX_DATA once a quarter of the window
//! was read: every ~4 s for four targets reading 320 KB/s each). Such a
//! connection is window-limited, not starved: its targets keep moving, the
//! server keeps raising, and a new request gets credit at the next raise.
//! So the frames prove a starvation only when the limit has held for the
//! stall timeout (the rule the targets themselves are judged by) and, where
//! the server's targets are seen at all (live, a server-side capture), the
//! process holds stalled targets that may be this connection's: slow ones
//! are never STALLED.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::core::frames::FrameState;
use crate::core::time::Mono;

/// When the client's stream data stopped, if its frames show it blocked for
/// good: the client used up the server's connection limit, sent no new
/// stream data for `hold`, the server did not raise the limit since, and
/// the client still sends ACK or DATAGRAM frames (it is alive, only
/// blocked).
///
/// Live (`--decrypt`), a connection is read only once it is suspect: its last
/// STREAM frames were never passed, only the DATA_BLOCKED the classifier kept
/// after them. Then the stop is the DATA_BLOCKED, provided the kernel's counts
/// (`last_bulk`: the last full-size client packet) saw no bulk after it.
pub fn frame_proof(f: &FrameState, now: Mono, hold: Duration, last_bulk: Option<Mono>) -> Option<Mono> {
    f.client_blocked_at_limit()?;
    let stop = match (f.last_stream[0], f.data_blocked) {
        (Some(s), _) => s,
        (None, Some((_, at, _))) if last_bulk.is_none_or(|b| b <= at) => at,
        _ => return None,
    };
    // A raise after the stop: the client has credit (it is idle, or about to
    // send again), whatever it said before.
    (now.since(stop) >= hold && f.max_data_raised.is_none_or(|r| r <= stop) && f.client_alive_after(stop))
        .then_some(stop)
}

/// The stalled targets each process holds, as far as they bear on frames:
/// which processes have target sockets seen at all, and the stalled targets
/// no evidence ties to one connection (with the connections they may be,
/// empty when not yet narrowed).
#[derive(Default)]
pub struct StalledByProcess<'a> {
    /// Processes with an outbound socket in the table (any state).
    seen: HashSet<u32>,
    /// Stalled targets of each process that no link gives to a connection.
    open: HashMap<u32, Vec<&'a [u64]>>,
}

impl<'a> StalledByProcess<'a> {
    /// A process has an outbound socket.
    pub fn seen(&mut self, pid: u32) {
        self.seen.insert(pid);
    }

    /// A stalled target of `pid` that no evidence ties to one connection;
    /// `maybe` lists the connections it may be (empty: any of the process's).
    pub fn open(&mut self, pid: u32, maybe: &'a [u64]) {
        self.open.entry(pid).or_default().push(maybe);
    }

    /// Whether decrypted frames may confirm connection `conn` of process
    /// `pid` (None: not known) that has `linked` stalled targets linked to
    /// it: where no target socket is seen at all (a client-side capture) the
    /// frames stand alone; else one stalled target at least must be
    /// possibly its.
    pub fn backs(&self, pid: Option<u32>, conn: u64, linked: usize) -> bool {
        let seen = match pid {
            Some(p) => self.seen.contains(&p),
            None => !self.seen.is_empty(),
        };
        if !seen || linked > 0 {
            return true;
        }
        let mine = |v: &&[u64]| v.is_empty() || v.contains(&conn);
        match pid {
            Some(p) => self.open.get(&p).is_some_and(|v| v.iter().any(mine)),
            None => self.open.values().flatten().any(mine),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Mono {
        Mono::from_secs_f64(secs)
    }

    /// Blocked at 20 MiB at `stop`, ACKs until `alive`.
    fn blocked(stop: f64, alive: f64) -> FrameState {
        FrameState {
            last_stream: [Some(s(stop)), None],
            last_ack: [Some(s(alive)), None],
            client_consumed: 20 << 20,
            server_max_data: Some(20 << 20),
            data_blocked: Some((20 << 20, s(stop), s(stop))),
            ..Default::default()
        }
    }

    #[test]
    fn the_limit_must_hold_for_the_stall_timeout() {
        let hold = Duration::from_secs(3);
        let f = blocked(10.0, 20.0);
        assert_eq!(frame_proof(&f, s(12.9), hold, None), None, "2.9 s: a slow target's raise may still come");
        assert_eq!(frame_proof(&f, s(13.0), hold, None), Some(s(10.0)));
        // Raised after the stop: credit again.
        let mut raised = f.clone();
        raised.max_data_raised = Some(s(11.0));
        raised.server_max_data = Some(25 << 20);
        assert_eq!(frame_proof(&raised, s(20.0), hold, None), None);
        // Nothing from the client after the stop: gone, not blocked.
        assert_eq!(frame_proof(&blocked(10.0, 10.0), s(20.0), hold, None), None);
    }

    #[test]
    fn live_the_stop_is_the_data_blocked_unless_bulk_came_after() {
        let hold = Duration::from_secs(3);
        let mut f = blocked(10.0, 20.0);
        f.last_stream = [None, None];
        assert_eq!(frame_proof(&f, s(14.0), hold, Some(s(9.5))), Some(s(10.0)));
        // Full-size client packets after it: a raise we did not read.
        assert_eq!(frame_proof(&f, s(14.0), hold, Some(s(11.0))), None);
    }

    #[test]
    fn frames_need_a_stalled_target_that_may_be_theirs_where_targets_are_seen() {
        let maybe = [1, 2];
        let mut p = StalledByProcess::default();
        // No target socket seen anywhere (a capture of the client's end).
        assert!(p.backs(Some(7), 1, 0));
        assert!(p.backs(None, 1, 0));
        // Process 7's targets are seen, none stalled (slow ones keep moving).
        p.seen(7);
        assert!(!p.backs(Some(7), 1, 0));
        assert!(p.backs(Some(7), 1, 2), "linked stalled targets back it");
        // An unattributed stalled target that may be connection 1 or 2.
        p.open(7, &maybe);
        assert!(p.backs(Some(7), 1, 0));
        assert!(!p.backs(Some(7), 3, 0), "not a candidate");
        // Another process's stalled targets are not this one's.
        p.seen(8);
        assert!(!p.backs(Some(8), 1, 0));
        // Not yet narrowed: any connection of its process.
        p.open(8, &[]);
        assert!(p.backs(Some(8), 5, 0));
    }
}
