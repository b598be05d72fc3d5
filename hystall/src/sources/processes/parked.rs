//! Writers parked inside a send syscall, read from `/proc/PID/task/TID/syscall`
//! (the syscall a sleeping thread is in, with its arguments) instead of the
//! `raw_syscalls` probes, which put every syscall of the machine on the slow
//! path. A blocking writer sits in write()/sendmsg() while its socket is full
//! and `sock_send_length` fires only when the call returns, so this is how
//! such a stall is seen at all. Only processes that hold blocking TCP sockets
//! are read (Go, tokio and most proxies have none), once per socket poll.

use std::collections::{HashMap, HashSet};

use hystall_common::SendSyscalls;

use crate::core::time::Mono;

/// How `watch` finds them, as `watch_started` says.
pub const METHOD: &str = "/proc/PID/task/TID/syscall of the processes holding blocking TCP sockets (no syscall probe)";

/// A thread found inside a send-family syscall, and since when (the first
/// reading that showed this same call: same syscall, arguments and stack).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parked {
    pub pid: u32,
    pub tid: u32,
    pub fd: u64,
    pub since: Mono,
}

#[derive(Default)]
pub struct ParkedWriters {
    /// tid → (the syscall line read, first seen).
    seen: HashMap<u32, (String, Mono)>,
}

impl ParkedWriters {
    /// The threads of `pids` inside a send syscall now.
    pub fn read(&mut self, pids: &HashSet<u32>, calls: &SendSyscalls, now: Mono) -> Vec<Parked> {
        let mut out = Vec::new();
        let mut live = HashSet::new();
        for &pid in pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
            for t in tasks.flatten() {
                let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
                let Ok(line) = std::fs::read_to_string(t.path().join("syscall")) else { continue };
                let Some((nr, fd)) = parse(&line) else { continue };
                if !calls.contains(nr) {
                    continue;
                }
                live.insert(tid);
                let since = match self.seen.get(&tid) {
                    Some((l, since)) if *l == line => *since,
                    _ => {
                        self.seen.insert(tid, (line, now));
                        now
                    }
                };
                out.push(Parked { pid, tid, fd, since });
            }
        }
        self.seen.retain(|tid, _| live.contains(tid));
        out
    }
}

/// (syscall number, first argument) of a `syscall` file's line: "NR ARG1 ARG2
/// ... SP PC" for a sleeping thread; "running" or "-1 SP PC" otherwise.
fn parse(line: &str) -> Option<(u32, u64)> {
    let mut it = line.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    let arg = it.next()?;
    let fd = u64::from_str_radix(arg.strip_prefix("0x")?, 16).ok()?;
    (nr >= 0).then_some((nr as u32, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    use std::time::Duration;

    #[test]
    fn lines_of_the_syscall_file() {
        assert_eq!(parse("1 0x5 0x7f00 0x10000 0x0 0x0 0x0 0x7ffd 0x7f01\n"), Some((1, 5)));
        assert_eq!(parse("running\n"), None);
        assert_eq!(parse("-1 0x7ffd 0x7f01\n"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn a_writer_blocked_in_write_is_found_with_its_fd_and_kept_since_its_first_reading() {
        // A blocking socket whose peer never reads: the writer parks in write().
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer, _) = l.accept().unwrap();
        let fd = s.as_raw_fd() as u64;
        let tid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let t = tid.clone();
        std::thread::spawn(move || {
            t.store(unsafe { libc::gettid() } as u32, std::sync::atomic::Ordering::SeqCst);
            let chunk = vec![0u8; 1 << 20];
            while s.write_all(&chunk).is_ok() {}
        });
        let calls = crate::sources::kernel::probes::syscalls::send_syscalls().expect("a known architecture");
        let me = HashSet::from([std::process::id()]);
        let mut p = ParkedWriters::default();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let first = loop {
            let found = p.read(&me, &calls, Mono(1));
            if let Some(w) = found.into_iter().find(|w| w.fd == fd) {
                break w;
            }
            assert!(std::time::Instant::now() < deadline, "the writer never parked");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(first.tid, tid.load(std::sync::atomic::Ordering::SeqCst));
        // Still the same call later: the first reading's time is kept.
        let again = p.read(&me, &calls, Mono(2)).into_iter().find(|w| w.fd == fd).expect("still parked");
        assert_eq!(again.since, first.since);
    }
}
