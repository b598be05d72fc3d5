//! Sockets that were already stuck before hystall attached.
//!
//! A non-blocking writer tries once (EAGAIN) and then waits; if that happened
//! before the probes were attached, no send will ever be seen again. So when
//! the watch starts (and when new processes are selected) we ask sock_diag for
//! TCP sockets with bytes queued and not sent, find their owners in /proc, and
//! start tracking them as blocked *since now* (the true onset is unknown, so
//! the reported blocked time is a lower bound). From then on the probes track
//! their ACK progress like any other socket.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use hystall_common::{AF_INET, AF_INET6, SOCK_HAS_TUPLE, SOCK_OUTBOUND, SockStats, Tuple};
use netlink_packet_sock_diag::inet::StateFlags;

use super::fd_owners::FdOwners;
use super::procs;
use super::sockdiag::SockDiag;
use crate::core::observation::DiagSample;
use crate::core::time::Mono;

/// A socket found stuck, with its owner.
pub struct Stuck {
    pub diag: DiagSample,
    pub stats: SockStats,
}

/// TCP sockets of `pids` (every process when `None`) with unsent bytes queued.
pub fn find_stuck(diag: &mut SockDiag, pids: Option<&HashSet<u32>>, now: Mono) -> Vec<Stuck> {
    let states = StateFlags::ESTABLISHED | StateFlags::CLOSE_WAIT;
    let Ok(all) = diag.dump_tcp(states) else { return Vec::new() };
    let queued: HashMap<u32, DiagSample> =
        all.into_iter().filter(|d| d.notsent > 0 && d.inode != 0).map(|d| (d.inode, d)).collect();
    if queued.is_empty() {
        return Vec::new();
    }
    let listen_ports = listening_ports(diag);
    let mut out = Vec::new();
    for (pid, inodes) in owners(pids, &queued.keys().copied().collect()) {
        let comm = procs::comm_of(pid).unwrap_or_default();
        let ports = procs::listen_ports_of(pid, &listen_ports);
        for ino in inodes {
            let d = queued[&ino].clone();
            let (Some(local), Some(remote)) = (d.local, d.remote) else { continue };
            let mut st = SockStats {
                tgid: pid,
                flags: SOCK_HAS_TUPLE,
                state: d.state as u32,
                first_seen_ns: now.0,
                blocked_since_ns: now.0,
                ..Default::default()
            };
            // Accepted sockets share their local port with one of the owner's
            // listeners; everything else the process connected itself.
            if !ports.contains(&local.port()) {
                st.flags |= SOCK_OUTBOUND;
            }
            let bytes = comm.as_bytes();
            st.comm[..bytes.len().min(15)].copy_from_slice(&bytes[..bytes.len().min(15)]);
            st.tuple = tuple_of(local, remote);
            st.snd_wnd = d.snd_wnd;
            out.push(Stuck { diag: d, stats: st });
        }
    }
    out
}

/// pid → socket inodes among `wanted`, from /proc/PID/fd.
fn owners(pids: Option<&HashSet<u32>>, wanted: &HashSet<u32>) -> HashMap<u32, Vec<u32>> {
    let candidates: HashSet<u32> = match pids {
        Some(p) => p.clone(),
        None => std::fs::read_dir("/proc")
            .map(|rd| rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default(),
    };
    let mut out: HashMap<u32, Vec<u32>> = HashMap::new();
    for (ino, h) in FdOwners::default().resolve(&candidates, wanted) {
        out.entry(h.pid).or_default().push(ino);
    }
    out
}

/// Which of `pids` hold a TCP socket in blocking mode (no O_NONBLOCK in
/// /proc/PID/fdinfo): only such a writer can park inside a send syscall. Go,
/// tokio and most proxies use non-blocking sockets only. Run once per
/// selection, for the sockets from before hystall tracked them (the kernel
/// flags the ones it tracks: `sources::blocking`).
pub fn has_blocking_tcp(diag: &mut SockDiag, pids: &HashSet<u32>, owners: &mut FdOwners) -> HashSet<u32> {
    let Ok(tcp) = diag.dump_tcp(StateFlags::all()) else { return HashSet::new() };
    let inodes: HashSet<u32> = tcp.iter().filter(|d| d.state != 10).map(|d| d.inode).filter(|&i| i != 0).collect();
    let held = owners.resolve(pids, &inodes);
    held.into_values().filter(|h| !procs::fd_nonblocking(h.pid, h.fd)).map(|h| h.pid).collect()
}

/// Listening sockets: inode → port.
pub fn listening_ports(diag: &mut SockDiag) -> HashMap<u32, u16> {
    diag.dump_tcp(StateFlags::LISTEN)
        .map(|v| v.into_iter().filter_map(|d| Some((d.inode, d.local?.port()))).collect())
        .unwrap_or_default()
}

pub fn tuple_of(local: SocketAddr, remote: SocketAddr) -> Tuple {
    let mut t = Tuple { sport: local.port(), dport: remote.port(), ..Default::default() };
    match (local, remote) {
        (SocketAddr::V4(l), SocketAddr::V4(r)) => {
            t.family = AF_INET;
            t.saddr[..4].copy_from_slice(&l.ip().octets());
            t.daddr[..4].copy_from_slice(&r.ip().octets());
        }
        _ => {
            t.family = AF_INET6;
            t.saddr = ip6(local);
            t.daddr = ip6(remote);
        }
    }
    t
}

fn ip6(a: SocketAddr) -> [u8; 16] {
    match a {
        SocketAddr::V4(v) => v.ip().to_ipv6_mapped().octets(),
        SocketAddr::V6(v) => v.ip().octets(),
    }
}
