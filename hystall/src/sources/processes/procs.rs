//! Which processes to watch, from /proc: `--pid`, `--comm`, `--cgroup`/`--unit`
//! (see `cgroup.rs`), or the known proxy servers when none is given.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use hystall_common::COMM_LEN;

use super::fd_owners::FdOwners;

/// Process names of QUIC proxy servers, for the default selection.
pub const KNOWN_PROXIES: &[&str] = &[
    "hysteria",
    "hysteria2",
    "sing-box",
    "xray",
    "Xray",
    "mihomo",
    "clash",
    "clash-meta",
    "tuic-server",
    "juicity-server",
    "v2ray",
    "naive",
];

#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("no process with pid {0}")]
    NoSuchPid(u32),
    #[error("/proc is not readable: {0}")]
    Proc(std::io::Error),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `--pid`/`--comm`/`--cgroup` given: exactly those, the union (comms and
    /// cgroups re-scanned for new processes). Cgroups are relative to the
    /// cgroup v2 root ("/system.slice/x.service").
    Explicit { pids: Vec<u32>, comms: Vec<String>, cgroups: Vec<String> },
    /// Nothing given, known proxies found: follow them by name.
    Detected { comms: Vec<String> },
    /// Nothing given, no proxy found: every process.
    All,
}

impl Mode {
    pub fn from_args(pids: &[u32], comms: &[String]) -> Result<Mode, SelectError> {
        Mode::from_selection(pids, comms, &[])
    }

    /// `from_args` with cgroups (already resolved and normalised).
    pub fn from_selection(pids: &[u32], comms: &[String], cgroups: &[String]) -> Result<Mode, SelectError> {
        for &p in pids {
            if !Path::new(&format!("/proc/{p}")).exists() {
                return Err(SelectError::NoSuchPid(p));
            }
        }
        if !pids.is_empty() || !comms.is_empty() || !cgroups.is_empty() {
            return Ok(Mode::Explicit { pids: pids.to_vec(), comms: comms.to_vec(), cgroups: cgroups.to_vec() });
        }
        let running: Vec<String> = KNOWN_PROXIES
            .iter()
            .filter(|name| !pids_by_comm(name).unwrap_or_default().is_empty())
            .map(|s| s.to_string())
            .collect();
        Ok(if running.is_empty() { Mode::All } else { Mode::Detected { comms: running } })
    }

    pub fn filters(&self) -> bool {
        !matches!(self, Mode::All)
    }

    /// Whether a process that has just exec'd `comm` is selected: by its
    /// new name, its cgroup, or its pid (a selected pid that execs another
    /// program stays selected).
    pub fn selects(&self, pid: u32, comm: &str) -> bool {
        let named = |names: &[String]| names.iter().any(|n| comm_is(n, comm));
        match self {
            Mode::Explicit { pids, comms, cgroups } => {
                pids.contains(&pid)
                    || named(comms)
                    || (!cgroups.is_empty() && super::cgroup::pid_within(Path::new("/proc"), pid, cgroups))
            }
            Mode::Detected { comms } => named(comms),
            Mode::All => false,
        }
    }

    /// What the kernel's exec filter hands over (`Probes::filter_execs`,
    /// `proc_exec.rs`): the execs of the selection's names (as `comm_key`s)
    /// and of its explicit pids — every exec `selects` can take. None when
    /// the kernel cannot decide as `selects` does, so every exec goes to
    /// user space: a cgroup selection (membership is read from /proc), a
    /// name with U+FFFD (which `selects` matches against the lossy text of
    /// a comm that is not UTF-8), or no selection at all.
    pub fn exec_selection(&self) -> Option<(Vec<[u8; COMM_LEN]>, Vec<u32>)> {
        let (pids, comms): (&[u32], &[String]) = match self {
            Mode::Explicit { cgroups, .. } if !cgroups.is_empty() => return None,
            Mode::Explicit { pids, comms, .. } => (pids, comms),
            Mode::Detected { comms } => (&[], comms),
            Mode::All => return None,
        };
        if comms.iter().any(|c| c.contains(char::REPLACEMENT_CHARACTER)) {
            return None;
        }
        Some((comms.iter().map(|c| comm_key(c)).collect(), pids.to_vec()))
    }

    /// The processes selected now (explicit pids that exited are dropped).
    pub fn resolve(&self) -> HashSet<u32> {
        let mut out = HashSet::new();
        let comms: &[String] = match self {
            Mode::Explicit { pids, comms, cgroups } => {
                out.extend(pids.iter().copied().filter(|p| Path::new(&format!("/proc/{p}")).exists()));
                out.extend(super::cgroup::pids_in(Path::new("/proc"), cgroups).unwrap_or_default());
                comms
            }
            Mode::Detected { comms } => comms,
            Mode::All => return out,
        };
        for c in comms {
            out.extend(pids_by_comm(c).unwrap_or_default());
        }
        out
    }
}

/// Whether a process name (as the kernel keeps it, cut to 15 bytes) is `name`.
pub fn comm_is(name: &str, comm: &str) -> bool {
    name.as_bytes()[..name.len().min(15)] == *comm.as_bytes()
}

/// The kernel's comm of a process named `name`, as `bpf_get_current_comm`
/// gives it: cut to 15 bytes, NUL-padded. Equal to a comm whenever
/// `comm_is(name, comm)` is (the exec filter's key).
pub fn comm_key(name: &str) -> [u8; COMM_LEN] {
    let mut key = [0u8; COMM_LEN];
    let n = name.len().min(COMM_LEN - 1);
    key[..n].copy_from_slice(&name.as_bytes()[..n]);
    key
}

/// Processes whose /proc/PID/comm is exactly `name` (like `pgrep -x`). comm is
/// cut to 15 bytes by the kernel, so a longer name matches on its prefix.
pub fn pids_by_comm(name: &str) -> Result<Vec<u32>, SelectError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").map_err(SelectError::Proc)?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if let Ok(c) = std::fs::read_to_string(entry.path().join("comm"))
            && comm_is(name, c.strip_suffix('\n').unwrap_or(&c))
        {
            out.push(pid);
        }
    }
    Ok(out)
}

pub fn comm_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim_end().to_owned())
}

/// The socket inode behind `/proc/PID/fd/FD` (`socket:[INODE]`).
pub fn fd_socket_inode(pid: u32, fd: u64) -> Option<u32> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    socket_inode(link.as_os_str().as_encoded_bytes())
}

/// The inode of an fd link's target `socket:[N]` (None for any other file).
pub fn socket_inode(link: &[u8]) -> Option<u32> {
    std::str::from_utf8(link.strip_prefix(b"socket:[")?.strip_suffix(b"]")?).ok()?.parse().ok()
}

/// Per-process facts that events need and the kernel cannot give cheaply: the
/// process name (the kernel reports the *thread's* comm, e.g. "tokio-rt-worker")
/// and its listening ports (a socket on one of them was accepted, not connected).
#[derive(Default)]
pub struct ProcCache {
    entries: std::collections::HashMap<u32, (crate::core::time::Mono, String, HashSet<u16>)>,
    /// Per process, which listening sockets it holds (its fds are read again
    /// only when a listener is new).
    owners: std::collections::HashMap<u32, FdOwners>,
}

impl ProcCache {
    const TTL: std::time::Duration = std::time::Duration::from_secs(2);

    /// (process name, listening ports) of `pid`, refreshed every two seconds.
    pub fn get(
        &mut self,
        pid: u32,
        now: crate::core::time::Mono,
        listeners: impl FnOnce() -> std::collections::HashMap<u32, u16>,
    ) -> (&str, &HashSet<u16>) {
        let fresh = self.entries.get(&pid).is_some_and(|(at, _, _)| now.since(*at) < Self::TTL);
        if !fresh {
            let comm = comm_of(pid).unwrap_or_default();
            let listeners = listeners();
            let inodes: HashSet<u32> = listeners.keys().copied().collect();
            let held = self
                .owners
                .entry(pid)
                .or_insert_with(|| FdOwners::with_gap(Duration::ZERO))
                .resolve(&HashSet::from([pid]), &inodes);
            let ports = held.keys().filter_map(|i| listeners.get(i).copied()).collect();
            self.entries.insert(pid, (now, comm, ports));
        }
        let (_, comm, ports) = &self.entries[&pid];
        (comm, ports)
    }

    /// Forgets processes not seen for a minute (bounded memory).
    pub fn expire(&mut self, now: crate::core::time::Mono) {
        self.entries.retain(|_, (at, _, _)| now.since(*at) < std::time::Duration::from_secs(60));
        self.owners.retain(|pid, _| self.entries.contains_key(pid));
    }
}

/// The local ports of `pid`'s listening sockets, given all listeners (inode → port).
pub fn listen_ports_of(pid: u32, listeners: &std::collections::HashMap<u32, u16>) -> HashSet<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return HashSet::new() };
    fds.flatten()
        .filter_map(|fd| fd.file_name().to_str()?.parse::<u64>().ok())
        .filter_map(|n| listeners.get(&fd_socket_inode(pid, n)?).copied())
        .collect()
}

/// Whether `/proc/PID/fdinfo/FD` shows O_NONBLOCK (unknown counts as yes).
pub fn fd_nonblocking(pid: u32, fd: u64) -> bool {
    let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else { return true };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_none_or(|flags| flags & libc::O_NONBLOCK as u32 != 0)
}

/// Turns a kernel `comm` buffer into a string.
pub fn comm_str(raw: &[u8]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_found_by_comm_and_pid() {
        let me = std::process::id();
        let comm = comm_of(me).expect("own comm");
        assert!(pids_by_comm(&comm).unwrap().contains(&me));
        let mode = Mode::from_args(&[me], &[]).unwrap();
        assert!(mode.resolve().contains(&me));
    }

    #[test]
    fn unknown_pid_is_a_clear_error() {
        let err = Mode::from_args(&[u32::MAX - 1], &[]).unwrap_err();
        assert_eq!(err.to_string(), format!("no process with pid {}", u32::MAX - 1));
    }

    #[test]
    fn the_exec_filter_keys_are_the_kernels_comms() {
        assert_eq!(&comm_key("sing-box"), b"sing-box\0\0\0\0\0\0\0\0");
        // A longer name: the kernel keeps its first 15 bytes.
        let long = comm_key("hysteria-server-2");
        assert_eq!(&long, b"hysteria-server\0");
        assert!(comm_is("hysteria-server-2", &comm_str(&long)));
        assert_eq!(comm_key(""), [0; COMM_LEN]);
    }

    #[test]
    fn the_kernel_filters_execs_unless_a_cgroup_or_a_lossy_name_is_selected() {
        let me = std::process::id();
        let names = |m: &Mode| m.exec_selection().map(|(c, p)| (c.iter().map(|k| comm_str(k)).collect::<Vec<_>>(), p));
        let explicit = |pids: &[u32], comms: &[&str], cgroups: &[&str]| Mode::Explicit {
            pids: pids.to_vec(),
            comms: comms.iter().map(|s| s.to_string()).collect(),
            cgroups: cgroups.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(names(&explicit(&[me], &["sing-box"], &[])), Some((vec!["sing-box".into()], vec![me])));
        assert_eq!(names(&Mode::Detected { comms: vec!["xray".into()] }), Some((vec!["xray".into()], vec![])));
        assert_eq!(names(&explicit(&[], &["sing-box"], &["/system.slice/x.service"])), None);
        assert_eq!(names(&explicit(&[], &["a\u{fffd}b"], &[])), None);
        assert_eq!(names(&Mode::All), None);
    }

    #[test]
    fn comm_buffer_stops_at_nul() {
        assert_eq!(comm_str(b"sing-box\0\0\0\0\0\0\0\0"), "sing-box");
        assert_eq!(comm_str(b"0123456789abcdef"), "0123456789abcdef");
    }
}
