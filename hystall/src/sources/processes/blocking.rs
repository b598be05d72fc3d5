//! Which watched processes hold blocking TCP sockets: only their writers can
//! park inside a send (where no send probe sees them), so only their threads
//! are read from `/proc` for it (`parked`).
//!
//! Change-driven: the kernel flags a socket whose fd is in blocking mode when
//! it first tracks it (`SOCK_BLOCKING`, a `Blocking` event) and reports its
//! end (`Destroyed`). Only the sockets that were there before hystall (or
//! before a process was selected) are found by a `sock_diag` dump and an fd
//! walk, once. Before, that dump and walk ran every two seconds: on a node
//! with a thousand targets and hundreds of new ones a second, they were the
//! largest part of the watcher's socket work.

use std::collections::{HashMap, HashSet};

/// The blocking TCP sockets of the watched processes.
#[derive(Debug, Default)]
pub struct BlockingWriters {
    /// Tracked sockets the kernel flagged: cookie → pid.
    tracked: HashMap<u64, u32>,
    /// Processes found holding blocking sockets by the last scan (sockets
    /// from before they were tracked; they stay until the next scan).
    scanned: HashSet<u32>,
    /// The processes the last scan was for (None: no scan yet).
    scanned_for: Option<HashSet<u32>>,
}

impl BlockingWriters {
    /// The kernel tracked a socket whose fd is in blocking mode.
    pub fn tracked(&mut self, cookie: u64, pid: u32) {
        self.tracked.insert(cookie, pid);
    }

    /// A tracked socket is gone.
    pub fn destroyed(&mut self, cookie: u64) {
        self.tracked.remove(&cookie);
    }

    /// Keeps only the sockets the kernel still tracks (a lost destroy event).
    pub fn retain(&mut self, cookies: &HashSet<u64>) {
        self.tracked.retain(|c, _| cookies.contains(c));
    }

    /// Whether the processes `pids` need a scan for sockets from before they
    /// were tracked: at the start, and when the selection changed.
    pub fn scan_due(&self, pids: &HashSet<u32>) -> bool {
        self.scanned_for.as_ref() != Some(pids)
    }

    /// The scan's answer for `pids`.
    pub fn scanned(&mut self, pids: &HashSet<u32>, found: HashSet<u32>) {
        self.scanned = found;
        self.scanned_for = Some(pids.clone());
    }

    /// The processes holding blocking sockets now.
    pub fn pids(&self) -> HashSet<u32> {
        self.tracked.values().copied().chain(self.scanned.iter().copied()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tracked.is_empty() && self.scanned.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flagged_sockets_name_their_process_until_they_end() {
        let mut b = BlockingWriters::default();
        let pids = HashSet::from([7, 8]);
        assert!(b.scan_due(&pids));
        b.scanned(&pids, HashSet::from([8]));
        assert!(!b.scan_due(&pids), "one scan per selection");
        assert!(b.scan_due(&HashSet::from([7])), "another selection is scanned again");
        b.tracked(100, 7);
        b.tracked(101, 7);
        assert_eq!(b.pids(), HashSet::from([7, 8]));
        b.destroyed(100);
        assert_eq!(b.pids(), HashSet::from([7, 8]), "one of its two sockets is left");
        // The kernel no longer tracks 101 (its destroy event was lost).
        b.retain(&HashSet::from([5]));
        assert_eq!(b.pids(), HashSet::from([8]));
        b.scanned(&pids, HashSet::new());
        assert!(b.is_empty());
    }
}
