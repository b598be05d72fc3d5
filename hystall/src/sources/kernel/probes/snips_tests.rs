//! The classifier's snips (`--decrypt`), with the real program on `lo`: the
//! first small packet after a run of large ones — where quic-go's
//! DATA_BLOCKED is when the last bytes of credit fit in it — outlasts the
//! runs of retransmissions that may follow it; the short packet with the
//! last bytes of credit outlasts the short retransmissions after it.

use std::collections::HashSet;
use std::net::UdpSocket;

use hystall_common::{SNIPS, SNIPS_FIRST, Snips, TAILS};

use super::{ProbeConfig, Probes, tc::Iface};

/// A packet of `len` bytes that looks like a QUIC short header, tagged.
fn packet(len: usize, tag: u8) -> Vec<u8> {
    let mut p = vec![tag; len];
    p[0] = 0x40;
    p
}

/// The real classifier with `--decrypt` on `lo`, watching a server port, and
/// one client sending to it.
struct Rig {
    probes: Probes,
    _server: UdpSocket,
    port: u16,
    client: UdpSocket,
}

impl Rig {
    /// None (and says so) when not root.
    fn start() -> Option<Rig> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            println!("skipped: needs root");
            return None;
        }
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = server.local_addr().expect("addr").port();
        let mut probes = Probes::load(&ProbeConfig { decrypt: true, ..Default::default() }).expect("probes load");
        let lo = Iface::by_name("lo").expect("lo");
        probes.attach_quic(&[lo], &HashSet::from([port])).expect("attach on lo");
        let client = UdpSocket::bind("127.0.0.1:0").expect("client");
        Some(Rig { probes, _server: server, port, client })
    }

    /// The client sends a `len`-byte packet tagged `tag`.
    fn send(&self, len: usize, tag: u8) {
        self.client.send_to(&packet(len, tag), ("127.0.0.1", self.port)).expect("send");
    }

    /// What the classifier keeps of the client's flow.
    fn snips(&self) -> Snips {
        let mut key = None;
        self.probes.each_flow(|k, _| {
            if k.server_port == self.port {
                key = Some(k);
            }
        });
        self.probes.snips(&key.expect("the client's flow")).expect("its snips")
    }

    /// The tags of the small packets kept after the last large run.
    fn kept(&self) -> Vec<u8> {
        let snips = self.snips();
        (0..SNIPS).filter(|&i| snips.len[i] > 0).map(|i| snips.bytes[i][1]).collect()
    }

    /// The tags of the short large packets kept (the ring of tails).
    fn tails(&self) -> Vec<u8> {
        let snips = self.snips();
        (0..TAILS).filter(|&i| snips.tail_len[i] > 0).map(|i| snips.tails[i][1]).collect()
    }
}

#[test]
fn the_first_small_packet_after_the_last_stream_run_outlasts_later_runs() {
    let Some(rig) = Rig::start() else { return };
    let send = |len: usize, tag: u8| rig.send(len, tag);
    let kept = || rig.kept();
    // Stream data, then the packet with the last credit and a DATA_BLOCKED
    // (tag 0xdb), then ACKs.
    for _ in 0..5 {
        send(1200, 1);
    }
    send(60, 0xdb);
    send(40, 2);
    send(40, 3);
    // Runs of retransmissions, each followed by ACKs: the DATA_BLOCKED stays
    // through SNIPS_FIRST - 1 of them.
    for run in 0..SNIPS_FIRST - 1 {
        for _ in 0..3 {
            send(1200, 1);
        }
        for _ in 0..3 {
            send(33, 0x10 + run as u8);
        }
        assert!(kept().contains(&0xdb), "after {} runs: {:x?}", run + 1, kept());
    }
    // The ACKs after the last run are there too (the client is alive).
    let last = 0x10 + (SNIPS_FIRST - 2) as u8;
    assert_eq!(kept().iter().filter(|&&t| t == last).count(), 3);
    // One run more and its turn is over.
    for _ in 0..3 {
        send(1200, 1);
    }
    send(33, 0x20);
    assert!(!kept().contains(&0xdb), "{:x?}", kept());
    // Many small packets after a run: the first ones stay, the latest are kept.
    for i in 0..40u8 {
        send(33, 0x40 + i);
    }
    let now = kept();
    assert!(now.contains(&0x20) && now.contains(&(0x40 + 39)), "{now:x?}");
}

#[test]
fn the_short_packet_with_the_last_credit_outlasts_a_burst_of_short_retransmissions() {
    let Some(rig) = Rig::start() else { return };
    let send = |len: usize, tag: u8| rig.send(len, tag);
    let tails = || rig.tails();
    // Full-size stream packets, then the short one with the last bytes of
    // credit and the DATA_BLOCKED (tag 0xdb).
    for _ in 0..5 {
        send(1400, 1);
    }
    send(700, 0xdb);
    // The loss burst repaired: full-size retransmissions, each few ending
    // short (decrypt_e2e's failed run had 8 within 4 ms). The DATA_BLOCKED
    // stays through TAILS - 1 of them.
    for i in 0..TAILS - 1 {
        for _ in 0..3 {
            send(1400, 1);
        }
        send(500 + i, 0x30 + i as u8);
        assert!(tails().contains(&0xdb), "after {} short retransmissions: {:x?}", i + 1, tails());
    }
    const { assert!(TAILS > 8, "the failed run's 8 short retransmissions fit") };
    send(650, 0x70);
    assert!(!tails().contains(&0xdb), "a ring: the oldest goes {:x?}", tails());
    // Full-size ones (or within NEAR_FULL of it) are never kept.
    send(1400 - 10, 0x71);
    assert!(!tails().contains(&0x71), "{:x?}", tails());
}
