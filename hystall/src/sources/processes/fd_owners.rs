//! Which watched process holds a socket: socket inodes (from sock_diag) to
//! (pid, fd), from `/proc/PID/fd`. A proxy holds thousands of fds, and
//! readlink'ing each of them every second cost more than everything else user
//! space does; so the fds are read only when a socket hystall asks about is
//! new (not resolved before, not known to be another process's), at most once
//! a second (a node makes sockets all the time), and the answers are kept
//! while the sockets live.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::AsRawFd as _;
use std::time::{Duration, Instant};

use super::pace::Pace;
use super::procs;

/// At most one walk of the fds this often: a node makes new sockets all the
/// time (UDP relays, short targets), and one walk answers every question
/// asked until the next (the UDP candidates and the blocking TCP check share it).
const MIN_GAP: Duration = Duration::from_secs(1);
/// Inodes found held by no watched process are remembered while asked about;
/// unasked for this long, they are forgotten.
const ELSEWHERE_KEEP: Duration = Duration::from_secs(10);

/// Where a socket is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub fd: u64,
}

pub struct FdOwners {
    /// The processes the answers are for (another set: start again).
    pids: HashSet<u32>,
    /// Every socket the processes held at the last walk.
    held: HashMap<u32, Holder>,
    /// Inodes asked for at a walk and held by none of them, with when they
    /// were last asked for.
    elsewhere: HashMap<u32, Instant>,
    /// Walks are paced (a process with tens of thousands of fds is walked
    /// less often).
    pace: Pace,
    /// `/proc/PID/fd` walks so far (for tests and the log).
    pub scans: u64,
}

impl Default for FdOwners {
    fn default() -> Self {
        FdOwners::with_gap(MIN_GAP)
    }
}

impl FdOwners {
    /// Walks at most once per `min_gap` (zero: whenever a socket is new).
    pub fn with_gap(min_gap: Duration) -> Self {
        FdOwners {
            pids: HashSet::new(),
            held: HashMap::new(),
            elsewhere: HashMap::new(),
            pace: Pace::every(min_gap),
            scans: 0,
        }
    }

    /// The holders among `pids` of each of `inodes` (inodes no one of them
    /// holds, and new ones until the next walk is due, are left out).
    pub fn resolve(&mut self, pids: &HashSet<u32>, inodes: &HashSet<u32>) -> HashMap<u32, Holder> {
        if *pids != self.pids {
            *self = FdOwners { pids: pids.clone(), scans: self.scans, ..FdOwners::with_gap(self.pace.min()) };
        }
        let now = Instant::now();
        let mut new = false;
        for i in inodes {
            if let Some(asked) = self.elsewhere.get_mut(i) {
                *asked = now;
            } else if !self.held.contains_key(i) {
                new = true;
            }
        }
        if new && self.pace.due() {
            self.scans += 1;
            self.held = self.pace.run(|| walk(pids));
            tracing::debug!(sockets = self.held.len(), took = ?self.pace.cost(), "fds walked");
            self.elsewhere.retain(|_, asked| now.duration_since(*asked) < ELSEWHERE_KEEP);
            self.elsewhere.extend(inodes.iter().filter(|i| !self.held.contains_key(i)).map(|i| (*i, now)));
        }
        inodes.iter().filter_map(|i| Some((*i, *self.held.get(i)?))).collect()
    }
}

/// Every socket fd of `pids`: inode → holder. `readlinkat` on the fd
/// directory, not `readlink` of each full path: the path walk through /proc
/// was half the cost.
fn walk(pids: &HashSet<u32>) -> HashMap<u32, Holder> {
    let mut found = HashMap::new();
    let mut buf = [0u8; 64];
    for &pid in pids {
        let dir_path = format!("/proc/{pid}/fd");
        let (Ok(dir), Ok(fds)) = (std::fs::File::open(&dir_path), std::fs::read_dir(&dir_path)) else { continue };
        for fd in fds.flatten() {
            let name = fd.file_name();
            let Some(n) = name.to_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
            let Ok(c) = CString::new(name.as_encoded_bytes()) else { continue };
            // SAFETY: `dir` is an open directory fd, `c` a NUL-terminated
            // name, `buf` writable for its length; the result bounds the read.
            let len = unsafe { libc::readlinkat(dir.as_raw_fd(), c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(len) = usize::try_from(len) else { continue };
            if let Some(ino) = procs::socket_inode(&buf[..len]) {
                found.insert(ino, Holder { pid, fd: n });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    fn inode_of(fd: &impl std::os::fd::AsRawFd) -> u32 {
        std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap().ino() as u32
    }

    #[test]
    fn the_fds_are_read_again_only_for_a_new_socket() {
        let me = HashSet::from([std::process::id()]);
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut o = FdOwners::with_gap(Duration::ZERO);
        let mut inodes = HashSet::from([inode_of(&a), 1]); // 1: a socket of no one here
        let r = o.resolve(&me, &inodes);
        assert_eq!(r.get(&inode_of(&a)).map(|h| h.pid), Some(std::process::id()));
        assert!(!r.contains_key(&1));
        assert_eq!(o.scans, 1);
        // The same sockets: nothing read.
        o.resolve(&me, &inodes);
        assert_eq!(o.scans, 1);
        // A new one: read once more, and found.
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        inodes.insert(inode_of(&b));
        assert!(o.resolve(&me, &inodes).contains_key(&inode_of(&b)));
        assert_eq!(o.scans, 2);
        // With a gap, a new socket waits for the next walk that is due.
        let mut slow = FdOwners::with_gap(Duration::from_secs(3600));
        assert!(slow.resolve(&me, &inodes).contains_key(&inode_of(&b)));
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        inodes.insert(inode_of(&c));
        assert!(!slow.resolve(&me, &inodes).contains_key(&inode_of(&c)));
        assert_eq!(slow.scans, 1);
        // Another set of processes: start again.
        o.resolve(&HashSet::from([1]), &inodes);
        assert_eq!(o.scans, 3);
    }
}
