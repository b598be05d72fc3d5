use super::*;
use crate::sources::discovery::nft::Redirect;
use hystall_common::{AF_INET, DIR_S2C, FlowKey, SAMPLE_BYTES};

use crate::sources::kernel::quic::flow_id;

const RANGE: (u16, u16) = (32768, 60999);
const SERVER: u16 = 40000;

fn key(client_port: u16, server_port: u16) -> FlowKey {
    let mut k = FlowKey { family: AF_INET, client_port, server_port, ..Default::default() };
    k.client[..4].copy_from_slice(&[10, 0, 0, 2]);
    k.server[..4].copy_from_slice(&[10, 0, 0, 1]);
    k
}

/// A long header of `version` and type bits `ty`, with DCID and SCID lengths.
fn long(version: u32, ty: u8, dcid: usize, scid: usize) -> Vec<u8> {
    let mut b = vec![0xc0 | (ty << 4)];
    b.extend(version.to_be_bytes());
    b.push(dcid as u8);
    b.extend(std::iter::repeat_n(0xaa, dcid));
    b.push(scid as u8);
    b.extend(std::iter::repeat_n(0xbb, scid));
    b.extend([0; 8]);
    b
}

fn short() -> Vec<u8> {
    vec![0x40, 1, 2, 3, 4, 5, 6, 7, 8]
}

fn sample(k: FlowKey, dir: usize, ts: u64, bytes: &[u8]) -> (FlowSample, FlowId) {
    let mut b = [0u8; SAMPLE_BYTES];
    let n = bytes.len().min(SAMPLE_BYTES);
    b[..n].copy_from_slice(&bytes[..n]);
    let s = FlowSample {
        key: k,
        ts_ns: ts,
        dir: dir as u32,
        ifindex: 1,
        payload_len: 1200,
        segs: 1,
        caplen: n as u32,
        _pad: 0,
        bytes: b,
    };
    (s, flow_id(&k))
}

fn sock(port: u16, inode: u32) -> UdpSock {
    UdpSock { port, pid: 7, inode }
}

#[test]
fn an_ephemeral_port_that_receives_a_client_initial_becomes_a_server_with_what_it_held() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    p.update(&[sock(SERVER, 1)]);
    assert!(p.kernel_ports().contains(&SERVER));
    assert!(!p.is_server(SERVER));
    assert!(p.note().unwrap().contains("40000"), "{:?}", p.note());
    assert!(p.take_change().unwrap().contains("40000 wait for a client's Initial"));
    p.update(&[sock(SERVER, 1)]);
    assert_eq!(p.take_change(), None, "nothing new");

    // An older connection's short headers are held, not handed on.
    let (s, f) = sample(key(5000, SERVER), DIR_C2S, 1, &short());
    assert!(p.on_sample(s, f).is_empty());
    // A client's first Initial (v1, DCID 8) proves it.
    let (s, f) = sample(key(5001, SERVER), DIR_C2S, 2, &long(VERSION_1, 0, 8, 4));
    let out = p.on_sample(s, f);
    assert_eq!(out.len(), 2, "the held sample and the Initial");
    assert!(p.is_server(SERVER));
    assert!(p.note().is_none());
    assert!(p.take_change().unwrap().contains("40000 is a QUIC server port"));
    let info = p.info("x".into());
    assert_eq!(info.ports.len(), 1);
    assert_eq!(info.ports[0].pid, Some(7));
    assert!(info.ports[0].why.contains("10.0.0.2:5001"), "{}", info.ports[0].why);
    // From now on its samples pass.
    let (s, f) = sample(key(5001, SERVER), DIR_S2C, 3, &short());
    assert_eq!(p.on_sample(s, f).len(), 1);
}

#[test]
fn a_client_socket_that_sends_the_first_initial_is_dropped_for_its_lifetime() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    p.update(&[sock(50000, 9)]);
    // It sends an Initial to a remote server...
    let (s, f) = sample(key(443, 50000), DIR_S2C, 1, &long(VERSION_1, 0, 8, 4));
    assert!(p.on_sample(s, f).is_empty());
    assert!(!p.kernel_ports().contains(&50000));
    // ...and the server's Initial back (even one with a long DCID) proves nothing.
    let (s, f) = sample(key(443, 50000), DIR_C2S, 2, &long(VERSION_1, 0, 8, 8));
    assert!(p.on_sample(s, f).is_empty());
    assert!(!p.is_server(50000));
    // The same socket is not taken back as a candidate on the next rescan.
    p.update(&[sock(50000, 9)]);
    assert!(!p.kernel_ports().contains(&50000));
    // A new socket on that port (a new process) is a candidate again.
    p.update(&[sock(50000, 10)]);
    assert!(p.kernel_ports().contains(&50000));
}

#[test]
fn a_socket_talking_to_our_own_server_port_on_this_host_is_its_client_not_a_candidate() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    // 443: a server at once (bound outside the ephemeral range); 50000 and
    // 50001: candidates, their Initials long past (opened before we came).
    p.update(&[sock(443, 1), sock(50000, 9), sock(50001, 10)]);
    assert!(p.kernel_ports().is_superset(&HashSet::from([443, 50000, 50001])));
    let on_host = |client: [u8; 4], server: [u8; 4], server_port| {
        let mut k = key(443, server_port);
        k.client[..4].copy_from_slice(&client);
        k.server[..4].copy_from_slice(&server);
        k
    };
    // A remote peer's port 443 says nothing (a remote server, or a client
    // whose port happens to be 443): still a candidate.
    let (s, f) = sample(on_host([10, 0, 0, 2], [10, 0, 0, 1], 50000), DIR_C2S, 1, &short());
    p.on_sample(s, f);
    assert!(p.kernel_ports().contains(&50000));
    // Our 443 on this host's address, and on loopback: its clients.
    let (s, f) = sample(on_host([10, 0, 0, 1], [10, 0, 0, 1], 50000), DIR_C2S, 2, &short());
    assert!(p.on_sample(s, f).is_empty());
    let (s, f) = sample(on_host([127, 0, 0, 1], [127, 0, 0, 1], 50001), DIR_S2C, 3, &short());
    assert!(p.on_sample(s, f).is_empty());
    assert_eq!(p.kernel_ports(), HashSet::from([443]), "no longer counted twice");
    // For as long as they live.
    p.update(&[sock(443, 1), sock(50000, 9), sock(50001, 10)]);
    assert_eq!(p.kernel_ports(), HashSet::from([443]));
}

#[test]
fn what_a_port_receives_after_it_spoke_first_on_that_flow_does_not_promote_it() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    p.update(&[sock(50000, 9)]);
    // Seen only from its second packet on (a short header out first).
    let (s, f) = sample(key(443, 50000), DIR_S2C, 1, &short());
    p.on_sample(s, f);
    let (s, f) = sample(key(443, 50000), DIR_C2S, 2, &long(VERSION_1, 0, 8, 8));
    p.on_sample(s, f);
    assert!(!p.is_server(50000));
}

#[test]
fn server_initials_and_other_packets_do_not_promote() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    p.update(&[sock(SERVER, 1)]);
    for (i, b) in [
        long(VERSION_1, 0, 4, 8), // a server's Initial to a quic-go client (DCID = its 4-byte SCID)
        long(VERSION_1, 2, 8, 4), // Handshake
        long(VERSION_2, 0, 8, 4), // v2 type 0 is 0-RTT, not Initial
        long(0x1234_5678, 0, 8, 4),
        short(),
    ]
    .iter()
    .enumerate()
    {
        let (s, f) = sample(key(6000 + i as u16, SERVER), DIR_C2S, i as u64, b);
        assert!(p.on_sample(s, f).is_empty());
    }
    assert!(!p.is_server(SERVER));
    let (s, f) = sample(key(7000, SERVER), DIR_C2S, 9, &long(VERSION_2, 1, 8, 4));
    assert!(!p.on_sample(s, f).is_empty(), "a v2 Initial");
    assert!(p.is_server(SERVER));
}

#[test]
fn fixed_ports_are_servers_at_once_and_go_with_their_socket() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    p.update(&[sock(443, 1), sock(SERVER, 2)]);
    assert!(p.is_server(443));
    assert!(p.take_change().unwrap().contains("found 443"));
    let (s, f) = sample(key(5001, SERVER), DIR_C2S, 2, &long(VERSION_1, 0, 8, 4));
    p.on_sample(s, f);
    p.take_change();
    // The server restarts on another port: both old ports go, the new one is a candidate.
    p.update(&[sock(41000, 3)]);
    assert!(!p.is_server(443) && !p.is_server(SERVER));
    let change = p.take_change().unwrap();
    assert!(change.contains("443,40000 gone"), "{change}");
    assert!(change.contains("41000 wait"), "{change}");
    assert!(p.note().unwrap().contains("41000"));
    assert_eq!(p.kernel_ports(), HashSet::from([41000]));
}

#[test]
fn explicit_ports_stay_and_show_as_ranges() {
    let explicit: HashSet<u16> = (20000..=20010).chain([443]).collect();
    let mut p = ServerPorts::new(explicit, RANGE, true);
    p.update(&[]);
    assert!(p.is_server(20005));
    assert_eq!(p.take_change(), None);
    let info = p.info("start".into());
    let ports: Vec<&str> = info.ports.iter().map(|p| p.port.as_str()).collect();
    assert_eq!(ports, ["443", "20000-20010"]);
    assert!(info.note.is_none());
}

#[test]
fn the_note_says_why_nothing_is_watched() {
    let p = ServerPorts::new(HashSet::new(), RANGE, true);
    assert!(p.note().unwrap().contains("no unconnected UDP socket"));
    let p = ServerPorts::new(HashSet::new(), RANGE, false);
    assert!(p.note().unwrap().contains("--port"));
    let info = p.info("start".into());
    assert!(info.summary().contains("no QUIC server port"));
}

#[test]
fn firewall_ranges_sent_to_a_server_port_are_watched_with_it() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    let hop = Redirect { lo: 20001, hi: 20003, to: SERVER };
    let other = Redirect { lo: 30001, hi: 30002, to: 30000 };
    p.update(&[sock(SERVER, 1)]);
    p.take_change();
    // Not a server port yet: the range waits.
    p.set_redirects(vec![hop, other]);
    assert!(!p.is_server(20002));
    assert_eq!(p.take_change(), None);
    let (s, f) = sample(key(5001, SERVER), DIR_C2S, 2, &long(VERSION_1, 0, 8, 4));
    p.on_sample(s, f);
    assert!(p.is_server(20001) && p.is_server(20003) && !p.is_server(30001));
    assert!(p.kernel_ports().contains(&20002));
    let change = p.take_change().unwrap();
    assert!(change.contains("20001-20003 -> 40000"), "{change}");
    let info = p.info("x".into());
    let hop_row = info.ports.iter().find(|r| r.port == "20001-20003").expect("the range");
    assert_eq!(hop_row.pid, Some(7));
    assert_eq!(p.counts(), (4, 0));
    // The server goes: its range with it.
    p.update(&[]);
    assert!(!p.is_server(20001));
    assert!(p.take_change().unwrap().contains("no port-hopping range"));
}

#[test]
fn a_port_the_proxys_config_names_is_a_server_port_at_once() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    p.set_configured(HashMap::from([(SERVER, "/etc/sing-box/config.json".to_owned())]));
    p.update(&[sock(SERVER, 1), sock(50000, 2)]);
    assert!(p.is_server(SERVER), "no Initial needed");
    assert!(!p.is_server(50000));
    assert!(p.take_change().unwrap().contains("found 40000 (named by the proxy's config)"));
    assert!(p.info("x".into()).ports[0].why.contains("/etc/sing-box/config.json"));
}

#[test]
fn a_candidate_holds_only_its_last_seconds() {
    let mut p = ServerPorts::new(HashSet::new(), RANGE, true);
    p.update(&[sock(SERVER, 1)]);
    let sec = 1_000_000_000;
    // One sample every 5 s for a minute, as an idle connection's keepalives.
    for i in 0..12u64 {
        let (s, f) = sample(key(5000, SERVER), DIR_C2S, i * 5 * sec, &short());
        assert!(p.on_sample(s, f).is_empty());
    }
    // Proven: what it hands on is the last 10 s, not the minute.
    let (s, f) = sample(key(5001, SERVER), DIR_C2S, 56 * sec, &long(VERSION_1, 0, 8, 4));
    let out = p.on_sample(s, f);
    assert_eq!(out.len(), 4, "samples at 45, 50 and 55 s, and the Initial");
    assert!(out.iter().all(|s| s.ts_ns >= 45 * sec));
}

#[test]
fn the_ports_a_started_proxys_config_names_are_watched_before_it_binds_them() {
    let eph = (32768, 60999);
    let mut p = ServerPorts::new(HashSet::new(), eph, true);
    let file = "/etc/sing-box/config.json".to_string();
    p.started(9, &[(41000, file.clone())], |_| true);
    assert!(p.is_server(41000), "watched at its exec, not at the next rescan");
    assert!(p.kernel_ports().contains(&41000));
    assert_eq!(p.owners().get(&41000), Some(&9));
    let change = p.take_change().expect("a change");
    assert!(change.contains("41000") && change.contains("pid 9"), "{change}");
    // A rescan before it has bound the port does not take it back...
    p.set_configured(HashMap::from([(41000, file.clone())]));
    p.update(&[]);
    assert!(p.is_server(41000));
    assert!(p.take_change().is_none());
    // ...its socket shows, held by the new process...
    p.update(&[UdpSock { port: 41000, pid: 9, inode: 5 }]);
    assert!(p.is_server(41000));
    assert_eq!(p.owners().get(&41000), Some(&9));
    // ...and when the socket goes, so does the port (the grace was for binding).
    p.update(&[]);
    assert!(!p.is_server(41000));
}

#[test]
fn a_restarted_proxys_port_is_owned_by_the_new_process() {
    let mut p = ServerPorts::new(HashSet::new(), (32768, 60999), true);
    let file = "/etc/sing-box/config.json".to_string();
    p.set_configured(HashMap::from([(41000, file.clone())]));
    p.update(&[UdpSock { port: 41000, pid: 7, inode: 5 }]);
    p.take_change();
    // The new process execs while the old one still holds the port: no
    // second "found", the owner stays while it runs...
    p.started(8, &[(41000, file.clone())], |pid| pid == 7);
    assert!(p.take_change().is_none());
    assert_eq!(p.owners().get(&41000), Some(&7));
    // ...a dump still shows the old socket, then none before the new one
    // binds: the port stays watched (the gap a restart would otherwise open)...
    p.update(&[UdpSock { port: 41000, pid: 7, inode: 5 }]);
    p.update(&[]);
    assert!(p.is_server(41000), "kept for the new process to bind");
    // ...which then owns it.
    p.update(&[UdpSock { port: 41000, pid: 8, inode: 6 }]);
    assert_eq!(p.owners().get(&41000), Some(&8));
    // A short-lived run of the same config (`sing-box check`) whose owner
    // has gone takes it over only until the next dump shows the server's.
    p.started(9, &[(41000, file)], |pid| pid == 8);
    assert_eq!(p.owners().get(&41000), Some(&8));
    assert!(p.take_change().is_none());
}
