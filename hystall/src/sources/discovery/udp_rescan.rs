//! When the watched processes' UDP sockets are dumped again (`quic.rs`).
//!
//! The dump walks every UDP socket of the host: at node scale (the lab's
//! 10,000 client sockets, a proxy's UDP relays) it was the largest steady
//! cost of discovery at one a second. Server sockets come with a process:
//! one started or restarted is a new pid. So a dump runs
//! - at the rescan after the watched processes changed, and at the one
//!   after it (a new socket is resolved at the dump after the one that
//!   first showed it: `quic::unconnected_udp`);
//! - every `HURRY` for a while after a selected process exec'd (`hurry`:
//!   it binds within milliseconds, and its clients may dial at once);
//! - otherwise every `SLOW`: a socket a running process opens later (a new
//!   inbound, a server on port 0), and sockets gone (a server stopped).
//!
//! Why not a bind probe: a `syscalls/sys_enter_bind` tracepoint is cheap in
//! itself, but enabling any syscall tracepoint puts every syscall of every
//! task on the kernel's slow syscall path (as `raw_syscalls` does), and a
//! cgroup `post_bind` program cannot tell a chosen port from one the kernel
//! picked (quinn and Go clients bind port 0 too).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::sources::processes::pace::Pace;

/// The dump's period while the watched processes stay the same.
pub const SLOW: Duration = Duration::from_secs(2);
/// The dump's period for a while after a selected process started (`hurry`):
/// a proxy binds its sockets within milliseconds of its exec, and a port its
/// config does not name is watched only once a dump has shown it.
pub const HURRY: Duration = Duration::from_millis(150);

pub struct UdpRescan {
    pace: Pace,
    /// The watched processes at the last dump.
    pids: HashSet<u32>,
    /// The last dump saw new processes: the next rescan dumps again.
    follow_up: bool,
    /// Dumps run every `HURRY` until then (a selected process started).
    hurry_until: Option<Instant>,
}

impl UdpRescan {
    /// `min`: the shortest gap between two dumps (also paced by their cost).
    pub fn new(min: Duration) -> UdpRescan {
        UdpRescan { pace: Pace::every(min), pids: HashSet::new(), follow_up: false, hurry_until: None }
    }

    /// A selected process started: dump every `HURRY` for `this` long.
    pub fn hurry(&mut self, this: Duration) {
        self.hurry_until = Some(Instant::now() + this);
    }

    /// Whether a process started a little while ago (`hurry`).
    pub fn hurrying(&self) -> bool {
        self.hurry_until.is_some_and(|t| Instant::now() < t)
    }

    /// Whether to dump now, for these watched processes.
    pub fn due(&self, pids: &HashSet<u32>) -> bool {
        if self.hurrying() {
            return self.pace.due_every(HURRY);
        }
        self.pace.due() && (self.follow_up || *pids != self.pids || self.pace.since_last().is_none_or(|t| t >= SLOW))
    }

    /// Runs the dump `f` for `pids`.
    pub fn run<T>(&mut self, pids: &HashSet<u32>, f: impl FnOnce() -> T) -> T {
        self.follow_up = *pids != self.pids;
        self.pids.clone_from(pids);
        self.pace.run(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_processes_dump_at_once_and_once_more_then_only_every_slow() {
        let pids = HashSet::from([7]);
        let mut r = UdpRescan::new(Duration::ZERO);
        assert!(r.due(&pids), "the first");
        r.run(&pids, || ());
        assert!(r.due(&pids), "the one after it");
        r.run(&pids, || ());
        assert!(!r.due(&pids), "nothing new: not before {SLOW:?}");
        let more = HashSet::from([7, 8]);
        assert!(r.due(&more), "a new process");
        r.run(&more, || ());
        assert!(r.due(&more));
        r.run(&more, || ());
        assert!(!r.due(&more));
        assert!(r.due(&pids), "a process gone");
    }

    #[test]
    fn a_process_that_started_has_its_sockets_dumped_every_hurry_for_a_while() {
        let pids = HashSet::from([7]);
        let mut r = UdpRescan::new(Duration::from_secs(1));
        r.run(&pids, || ());
        r.run(&pids, || ());
        assert!(!r.due(&pids), "paced at a second");
        r.hurry(Duration::from_millis(400));
        assert!(!r.due(&pids), "not before {HURRY:?}");
        std::thread::sleep(HURRY);
        assert!(r.due(&pids), "every {HURRY:?} while hurrying");
        r.run(&pids, || ());
        std::thread::sleep(Duration::from_millis(400));
        assert!(!r.hurrying());
        assert!(!r.due(&pids), "back to the second's pace");
    }
}
