//! The per-socket verdict: OK, SLOW or STALLED (pure; time is an input).
//!
//! The rule is the upstream fix's, seen from outside: a socket is STALLED when
//! its writer is blocked on it and nothing has moved for the stall timeout —
//! no send accepted bytes and the peer acknowledged nothing new. Progress of
//! either kind resets the clock, so a slow target that keeps reading is never
//! STALLED, however long its writer waits for buffer space.

use std::time::Duration;

use serde::Serialize;

use super::time::Mono;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    #[default]
    Ok,
    /// Blocked for at least `slow_after`, but still making progress.
    Slow,
    /// Blocked with no progress for the stall timeout.
    Stalled,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::Slow => "SLOW",
            Verdict::Stalled => "STALLED",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// No progress for this long while blocked → STALLED (upstream: 10 s).
    pub stall_timeout: Duration,
    /// Blocked this long (with progress) → SLOW.
    pub slow_after: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { stall_timeout: Duration::from_secs(10), slow_after: Duration::from_secs(1) }
    }
}

/// The facts a verdict rests on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendProgress {
    /// Since when the writer has been blocked on this socket: the first EAGAIN
    /// or short send after the last full send, or the start of a send syscall
    /// still in flight. `None` = not blocked.
    pub blocked_since: Option<Mono>,
    /// The last time bytes moved: a send accepted bytes or the peer
    /// acknowledged new data.
    pub last_progress: Option<Mono>,
}

impl SendProgress {
    /// Since when nothing has moved while blocked (None when not blocked).
    pub fn no_progress_since(&self) -> Option<Mono> {
        let blocked = self.blocked_since?;
        Some(match self.last_progress {
            Some(p) if p > blocked => p,
            _ => blocked,
        })
    }

    pub fn judge(&self, now: Mono, th: &Thresholds) -> Verdict {
        let (Some(blocked), Some(quiet)) = (self.blocked_since, self.no_progress_since()) else {
            return Verdict::Ok;
        };
        if now.since(quiet) >= th.stall_timeout {
            Verdict::Stalled
        } else if now.since(blocked) >= th.slow_after {
            Verdict::Slow
        } else {
            Verdict::Ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Mono {
        Mono::from_secs_f64(secs)
    }

    fn th(timeout: f64) -> Thresholds {
        Thresholds { stall_timeout: Duration::from_secs_f64(timeout), slow_after: Duration::from_secs(1) }
    }

    #[test]
    fn never_blocked_is_ok_forever() {
        let p = SendProgress { blocked_since: None, last_progress: Some(s(1.0)) };
        assert_eq!(p.judge(s(1000.0), &th(10.0)), Verdict::Ok);
    }

    #[test]
    fn blocked_without_progress_stalls_at_the_timeout_not_before() {
        let p = SendProgress { blocked_since: Some(s(100.0)), last_progress: Some(s(99.0)) };
        assert_eq!(p.judge(s(100.5), &th(10.0)), Verdict::Ok);
        assert_eq!(p.judge(s(101.0), &th(10.0)), Verdict::Slow);
        assert_eq!(p.judge(s(109.9), &th(10.0)), Verdict::Slow);
        assert_eq!(p.judge(s(110.0), &th(10.0)), Verdict::Stalled);
    }

    #[test]
    fn acks_after_the_block_reset_the_clock() {
        // A slow reader: the writer waits for buffer space for a minute, but the
        // peer acknowledges data every few seconds.
        let th = th(10.0);
        let mut p = SendProgress { blocked_since: Some(s(0.0)), last_progress: Some(s(0.0)) };
        for t in (5..60).step_by(5) {
            p.last_progress = Some(s(t as f64));
            assert_eq!(p.judge(s(t as f64 + 4.9), &th), Verdict::Slow, "t={t}");
        }
        // The reader stops: 10 s after its last ACK the socket is STALLED.
        assert_eq!(p.judge(s(55.0 + 10.0), &th), Verdict::Stalled);
    }

    #[test]
    fn progress_before_the_block_does_not_count() {
        let p = SendProgress { blocked_since: Some(s(50.0)), last_progress: Some(s(49.9)) };
        assert_eq!(p.no_progress_since(), Some(s(50.0)));
        assert_eq!(p.judge(s(60.0), &th(10.0)), Verdict::Stalled);
    }

    #[test]
    fn short_timeout_still_needs_blocked_for_slow() {
        let p = SendProgress { blocked_since: Some(s(10.0)), last_progress: None };
        assert_eq!(p.judge(s(12.9), &th(3.0)), Verdict::Slow);
        assert_eq!(p.judge(s(13.0), &th(3.0)), Verdict::Stalled);
    }
}
