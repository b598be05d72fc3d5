//! When the watched processes' UDP sockets are dumped again (`quic.rs`).
//!
//! The dump walks every UDP socket of the host: at node scale (the lab's
//! 10,000 client sockets, a proxy's UDP relays) it was the largest steady
//! cost of discovery at one a second. Server sockets come with a process:
//! one started or restarted is a new pid. So a dump runs
//! - at the rescan after the watched processes changed, and at the one
//!   after it (a new socket is resolved at the dump after the one that
//!   first showed it: `quic::unconnected_udp`);
//! - otherwise every `SLOW`: a socket a running process opens later (a new
//!   inbound, a server on port 0), and sockets gone (a server stopped).
//!
//! Why not a bind probe: a `syscalls/sys_enter_bind` tracepoint is cheap in
//! itself, but enabling any syscall tracepoint puts every syscall of every
//! task on the kernel's slow syscall path (as `raw_syscalls` does), and a
//! cgroup `post_bind` program cannot tell a chosen port from one the kernel
//! picked (quinn and Go clients bind port 0 too).

use std::collections::HashSet;
use std::time::Duration;

use crate::sources::processes::pace::Pace;

/// The dump's period while the watched processes stay the same.
pub const SLOW: Duration = Duration::from_secs(2);

pub struct UdpRescan {
    pace: Pace,
    /// The watched processes at the last dump.
    pids: HashSet<u32>,
    /// The last dump saw new processes: the next rescan dumps again.
    follow_up: bool,
}

impl UdpRescan {
    /// `min`: the shortest gap between two dumps (also paced by their cost).
    pub fn new(min: Duration) -> UdpRescan {
        UdpRescan { pace: Pace::every(min), pids: HashSet::new(), follow_up: false }
    }

    /// Whether to dump now, for these watched processes.
    pub fn due(&self, pids: &HashSet<u32>) -> bool {
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
}
