//! Which watched process holds a socket: socket inodes (from sock_diag) to
//! (pid, fd), from `/proc/PID/fd`. A proxy holds thousands of fds, and
//! readlink'ing each of them every second cost more than everything else user
//! space does; so the fds are read only when a socket hystall asks about is
//! new (not resolved before, not known to be another process's), and the
//! answers are kept while the sockets live.

use std::collections::{HashMap, HashSet};

use super::procs;

/// Where a socket is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub fd: u64,
}

#[derive(Default)]
pub struct FdOwners {
    /// The processes the answers are for (another set: start again).
    pids: HashSet<u32>,
    held: HashMap<u32, Holder>,
    /// Inodes looked for and held by none of them.
    elsewhere: HashSet<u32>,
    /// `/proc/PID/fd` walks so far (for tests and the log).
    pub scans: u64,
}

impl FdOwners {
    /// The holders among `pids` of each of `inodes` (inodes no one of them
    /// holds are left out).
    pub fn resolve(&mut self, pids: &HashSet<u32>, inodes: &HashSet<u32>) -> HashMap<u32, Holder> {
        if *pids != self.pids {
            *self = FdOwners { pids: pids.clone(), scans: self.scans, ..FdOwners::default() };
        }
        // Forget sockets that are gone (bounded memory; inodes are reused).
        self.held.retain(|i, _| inodes.contains(i));
        self.elsewhere.retain(|i| inodes.contains(i));
        let new = inodes.iter().any(|i| !self.held.contains_key(i) && !self.elsewhere.contains(i));
        if new {
            self.scans += 1;
            let mut found = HashMap::new();
            for &pid in pids {
                let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
                for fd in fds.flatten() {
                    let Some(n) = fd.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
                    if let Some(ino) = procs::fd_socket_inode(pid, n)
                        && inodes.contains(&ino)
                    {
                        found.insert(ino, Holder { pid, fd: n });
                    }
                }
            }
            self.elsewhere.extend(inodes.iter().filter(|i| !found.contains_key(i)));
            self.held = found;
        }
        inodes.iter().filter_map(|i| Some((*i, *self.held.get(i)?))).collect()
    }
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
        let mut o = FdOwners::default();
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
        // Another set of processes: start again.
        o.resolve(&HashSet::from([1]), &inodes);
        assert_eq!(o.scans, 3);
    }
}
