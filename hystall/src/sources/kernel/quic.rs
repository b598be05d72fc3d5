//! The QUIC side of the live source: which UDP ports and interfaces to watch,
//! and the TC classifier's maps turned into observations.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hystall_common::{AF_INET, DIR_C2S, DIR_S2C, DirStats, FlowKey, FlowSample, FlowStats};

use crate::core::flows::{Dir, DirCounters, FlowCounters, FlowId, HeaderSample, Replies, SampleBytes};
use crate::core::time::Mono;
use crate::sources::discovery::server_ports::UdpSock;
use crate::sources::processes::fd_owners::FdOwners;
use crate::sources::processes::sockdiag::SockDiag;

/// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`): the
/// ports client sockets get when they bind port 0.
pub fn ephemeral_range() -> (u16, u16) {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut it = s.split_whitespace().filter_map(|p| p.parse().ok());
    match (it.next(), it.next()) {
        (Some(lo), Some(hi)) => (lo, hi),
        _ => (32768, 60999),
    }
}

/// The unconnected UDP sockets (no fixed peer) of the processes `pids`: the
/// ones that could be QUIC servers (`server_ports` decides which are). The
/// processes' fds are read only when such a socket is new (`owners`), and
/// only for sockets that were already there at the dump before (`previous`,
/// None before the first): a node's proxy opens and closes client and relay
/// sockets by the hundred a second (the node lab's short connections live
/// well under a second), and a walk of its fds for those would find sockets
/// that are gone and no server among them. A new server socket waits one
/// dump longer to be found (a second after its process appeared, else up to
/// two: `udp_rescan.rs`).
pub fn unconnected_udp(
    diag: &mut SockDiag,
    pids: &HashSet<u32>,
    owners: &mut FdOwners,
    previous: &mut Option<HashSet<u32>>,
) -> Vec<UdpSock> {
    let mut by_inode: HashMap<u32, u16> = HashMap::new();
    let dumped = diag.each_unconnected_udp(|h| {
        let id = &h.socket_id;
        if h.inode != 0 && id.source_port != 0 && id.destination_port == 0 {
            by_inode.insert(h.inode, id.source_port);
        }
    });
    if dumped.is_err() {
        return Vec::new();
    }
    let inodes: HashSet<u32> = by_inode.keys().copied().collect();
    let asked: HashSet<u32> = match previous.as_ref() {
        Some(before) => inodes.intersection(before).copied().collect(),
        None => inodes.clone(),
    };
    *previous = Some(inodes);
    let mut out: Vec<UdpSock> = owners
        .resolve(pids, &asked)
        .into_iter()
        .map(|(inode, h)| UdpSock { port: by_inode[&inode], pid: h.pid, inode })
        .collect();
    out.sort_by_key(|s| (s.port, s.pid, s.inode));
    out.dedup_by_key(|s| (s.port, s.inode));
    out
}

pub fn flow_id(k: &FlowKey) -> FlowId {
    let ip = |a: &[u8; 16]| -> IpAddr {
        if k.family == AF_INET {
            IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
        } else {
            let v6 = Ipv6Addr::from(*a);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
    };
    FlowId {
        client: SocketAddr::new(ip(&k.client), k.client_port),
        server: SocketAddr::new(ip(&k.server), k.server_port),
    }
}

fn dir_counters(d: &DirStats) -> DirCounters {
    DirCounters {
        packets: d.packets,
        bytes: d.bytes,
        last: [Mono::nonzero(d.last_ns[0]), Mono::nonzero(d.last_ns[1]), Mono::nonzero(d.last_ns[2])],
        first: Mono::nonzero(d.first_ns),
    }
}

pub fn flow_counters(s: &FlowStats) -> FlowCounters {
    FlowCounters {
        c2s: dir_counters(&s.dir[DIR_C2S]),
        s2c: dir_counters(&s.dir[DIR_S2C]),
        replies: Replies { n: s.replies_n, at: s.replies },
    }
}

pub fn header_sample(s: &FlowSample) -> HeaderSample {
    let n = (s.caplen as usize).min(s.bytes.len());
    HeaderSample {
        flow: flow_id(&s.key),
        dir: if s.dir as usize == DIR_C2S { Dir::C2s } else { Dir::S2c },
        payload_len: s.payload_len,
        segs: s.segs,
        bytes: SampleBytes::from_slice(&s.bytes[..n]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    fn inode_of(s: &std::net::UdpSocket) -> u32 {
        use std::os::fd::AsRawFd as _;
        std::fs::metadata(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap().ino() as u32
    }

    #[test]
    fn a_new_socket_is_resolved_from_the_dump_after_the_one_that_first_showed_it() {
        let Ok(mut diag) = SockDiag::open() else {
            eprintln!("skipped: no sock_diag here");
            return;
        };
        let me = HashSet::from([std::process::id()]);
        let mut owners = FdOwners::with_gap(std::time::Duration::ZERO);
        let found = |v: &[UdpSock], s: &std::net::UdpSocket| v.iter().any(|u| u.inode == inode_of(s));
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut previous = None;
        // The first dump resolves every socket (what is there at the start).
        assert!(found(&unconnected_udp(&mut diag, &me, &mut owners, &mut previous), &a));
        let walks = owners.scans;
        // A socket new in this dump waits for the next: no walk for it yet.
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let now = unconnected_udp(&mut diag, &me, &mut owners, &mut previous);
        assert!(found(&now, &a) && !found(&now, &b));
        assert_eq!(owners.scans, walks, "a socket seen once is not worth a walk");
        // Still there at the next dump: resolved.
        assert!(found(&unconnected_udp(&mut diag, &me, &mut owners, &mut previous), &b));
        assert_eq!(owners.scans, walks + 1);
        // One that comes and goes between two dumps never costs a walk.
        drop(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        unconnected_udp(&mut diag, &me, &mut owners, &mut previous);
        drop(c);
        unconnected_udp(&mut diag, &me, &mut owners, &mut previous);
        assert_eq!(owners.scans, walks + 1);
    }
}
