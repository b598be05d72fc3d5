//! Unit tests of the attribution on synthetic timelines, one per rule: a
//! synthetic server (one process, port 443) whose clients send client bytes
//! (with the kernel's byte marks) and whose targets are dialled and fed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hystall_common::MARK_BYTES;

use super::api::RelayRecord;
use super::*;
use crate::core::flows::{Dir, DirCounters, FlowCounters, FlowId, HeaderSample, Replies};
use crate::core::observation::{Observation, SockChange, SockSample};
use crate::core::verdict::Thresholds;

const PID: u32 = 42;
const MIB: u64 = 1 << 20;

fn ms(v: u64) -> Mono {
    Mono(v * 1_000_000)
}

struct Node {
    conns: ConnTable,
    socks: SocketTable,
    links: Attribution,
    owners: HashMap<u16, u32>,
    /// Per client port: client bytes so far, last packet.
    sent: HashMap<u16, (u64, Mono)>,
    /// Per target: bytes taken so far.
    took: HashMap<u64, u64>,
    /// Per client port: the server's answers (reply-sized packets).
    replies: HashMap<u16, Replies>,
}

impl Node {
    fn new() -> Node {
        let th = Thresholds { stall_timeout: Duration::from_secs(10), slow_after: Duration::from_secs(1) };
        let mut n = Node {
            conns: ConnTable::new(Duration::from_secs(30)),
            socks: SocketTable::new(th),
            links: Attribution::new(Config::default()),
            owners: HashMap::from([(443, PID)]),
            sent: HashMap::new(),
            took: HashMap::new(),
            replies: HashMap::new(),
        };
        // We attach at 0: connections that come later are seen whole.
        n.tick(0);
        n
    }

    fn flow(port: u16) -> FlowId {
        FlowId { client: format!("10.0.0.2:{port}").parse().unwrap(), server: "10.0.0.1:443".parse().unwrap() }
    }

    /// A client connects at `at_ms` (its server Handshake teaches the DCID).
    fn client(&mut self, port: u16, at_ms: u64) {
        let mut long = vec![0xe0, 0, 0, 0, 1, 0, 4];
        long.extend_from_slice(&[(port >> 8) as u8, port as u8, 2, 3]);
        long.extend_from_slice(&[0x40, 0x20]);
        let sample =
            HeaderSample { flow: Node::flow(port), dir: Dir::S2c, payload_len: 60, segs: 1, bytes: long.into() };
        self.conns.sample(ms(at_ms), &sample);
        self.sent.insert(port, (0, ms(at_ms)));
        self.poll(port, at_ms);
    }

    fn conn(&self, port: u16) -> u64 {
        self.conns.conn_of(&Node::flow(port)).expect("a connection")
    }

    /// The flow poll's counters of `port` at `at_ms`.
    fn poll(&mut self, port: u16, at_ms: u64) {
        let (bytes, last) = self.sent[&port];
        let c2s = DirCounters {
            packets: [1, 0, bytes / 1200],
            bytes: [60, 0, bytes],
            last: [Some(last), None, (bytes > 0).then_some(last)],
            first: Some(ms(0)),
        };
        let s2c = DirCounters { packets: [1, 0, 0], bytes: [60, 0, 0], last: [Some(last), None, None], first: None };
        let replies = self.replies.get(&port).copied().unwrap_or_default();
        self.conns.counters(ms(at_ms), Node::flow(port), FlowCounters { c2s, s2c, replies });
        self.links.polled(ms(at_ms));
    }

    /// Client `port` sends `bytes` evenly over (from, to] ms, with its marks.
    fn send(&mut self, port: u16, from: u64, to: u64, bytes: u64) {
        let (before, _) = self.sent[&port];
        let after = before + bytes;
        let marks: Vec<ByteMark> = (before / MARK_BYTES + 1..=after / MARK_BYTES)
            .map(|k| {
                let at = from + (to - from) * (k * MARK_BYTES - before) / bytes;
                ByteMark::Flow { flow: Node::flow(port), cpu: 0, at: ms(at), bytes: k * MARK_BYTES }
            })
            .collect();
        self.links.marks(&marks, &self.conns);
        self.sent.insert(port, (after, ms(to)));
        self.poll(port, to);
    }

    /// The server dials target `cookie` at `at_ms`.
    fn dial(&mut self, cookie: u64, at_ms: u64) {
        let sample = SockSample {
            cookie,
            pid: PID,
            comm: "sing-box".into(),
            local: Some(format!("10.0.0.1:{}", 40000 + cookie).parse().unwrap()),
            remote: Some(format!("192.0.2.{}:80", cookie % 250).parse().unwrap()),
            outbound: true,
            state: 2,
            first_seen: Some(ms(at_ms)),
            ..Default::default()
        };
        self.socks.apply(Observation::Sock { at: ms(at_ms), change: SockChange::State { old: 7, new: 2 }, sample });
        self.links.connect(cookie, PID, ms(at_ms));
        self.took.insert(cookie, 0);
    }

    /// The server sends client `port` a reply-sized packet at `at_ms`.
    fn answer(&mut self, port: u16, at_ms: u64) {
        self.replies.entry(port).or_default().push(ms(at_ms));
    }

    /// Target `cookie` takes `bytes` evenly over (from, to] ms, with its marks.
    fn feed(&mut self, cookie: u64, from: u64, to: u64, bytes: u64) {
        let before = self.took[&cookie];
        let after = before + bytes;
        let marks: Vec<ByteMark> = (before / MARK_BYTES + 1..=after / MARK_BYTES)
            .map(|k| {
                let at = from + (to - from) * (k * MARK_BYTES - before) / bytes;
                ByteMark::Send { cookie, at: ms(at), bytes: k * MARK_BYTES }
            })
            .collect();
        self.links.marks(&marks, &self.conns);
        self.took.insert(cookie, after);
    }

    fn tick(&mut self, at_ms: u64) {
        self.socks.tick(ms(at_ms));
        self.conns.tick(ms(at_ms));
        self.links.tick(ms(at_ms), &self.conns, &self.socks, &self.owners);
    }

    fn link(&self, cookie: u64) -> Option<(u64, Vec<&'static str>)> {
        self.links.link(cookie).map(|l| (l.conn, l.evidence.names()))
    }
}

#[test]
fn connect_the_only_connection_that_sent_just_before_the_dial_is_the_one() {
    let mut n = Node::new();
    n.client(1001, 1000);
    n.client(1002, 1000);
    // Client 1002 is quiet since 1 s; 1001 sends its request at 4.99 s.
    n.send(1001, 4990, 4995, 1000);
    n.dial(7, 5000);
    n.poll(1002, 5200);
    n.tick(5200);
    assert_eq!(n.link(7), Some((n.conn(1001), vec!["connect"])));
    assert!(n.links.linked_to(n.conn(1002)).next().is_none());
}

#[test]
fn bytes_a_connection_whose_bytes_only_this_target_explains_gets_it() {
    let mut n = Node::new();
    n.client(1001, 1000);
    n.client(1002, 1000);
    // Both clients are busy when the targets are dialled; 1002 has its own
    // fast target that takes all it carries.
    n.dial(8, 2000);
    n.dial(7, 2000);
    n.send(1001, 2000, 3000, 12 * MIB);
    n.send(1002, 2000, 3000, 40 * MIB);
    n.feed(7, 2000, 3000, 12 * MIB);
    n.feed(8, 2000, 3000, 40 * MIB);
    n.tick(3000);
    // 1002's 40 MiB cannot go anywhere but target 8 (more than its windows
    // can hold), and 1001's cannot have fed target 8: 7 is 1001's.
    assert_eq!(n.link(8).map(|l| l.0), Some(n.conn(1002)));
    assert_eq!(n.link(7).map(|l| l.0), Some(n.conn(1001)));
    assert!(n.link(7).unwrap().1.contains(&"bytes"));
}

#[test]
fn carried_a_connection_that_carried_less_than_the_target_took_is_ruled_out() {
    let mut n = Node::new();
    n.client(1001, 1000);
    n.client(1002, 1000);
    n.dial(7, 2000);
    // Both send around the dial; only 1001 carries what target 7 then takes.
    n.send(1002, 1990, 2500, MIB / 2);
    n.send(1001, 1990, 2500, 6 * MIB);
    n.feed(7, 2000, 2500, 5 * MIB);
    n.tick(2600);
    assert_eq!(n.link(7).map(|l| l.0), Some(n.conn(1001)));
}

/// Two clients that do the same at the same moments, two targets (7, 8):
/// nothing tells them apart.
fn in_step(n: &mut Node) {
    n.client(1001, 1000);
    n.client(1002, 1000);
    n.dial(7, 2000);
    n.dial(8, 2000);
    n.send(1001, 2000, 3000, 10 * MIB);
    n.send(1002, 2000, 3000, 10 * MIB);
    n.feed(7, 2000, 3000, 4 * MIB);
    n.feed(8, 2000, 3000, 4 * MIB);
    n.tick(3000);
}

#[test]
fn unattributed_when_nothing_tells_two_connections_apart() {
    let mut n = Node::new();
    in_step(&mut n);
    assert_eq!(n.link(7), None);
    assert_eq!(n.link(8), None);
    let mut maybe = n.links.target(7).unwrap().maybe().to_vec();
    maybe.sort_unstable();
    assert_eq!(maybe, vec![n.conn(1001), n.conn(1002)], "its candidates are said");
}

#[test]
fn a_group_whose_search_ran_out_of_budget_waits_before_the_next() {
    let mut n = Node::new();
    n.links = Attribution::new(Config { search_nodes: 1, ..Config::default() });
    n.tick(0);
    in_step(&mut n);
    assert_eq!(n.links.searches, 1, "searched once, out of budget");
    // New marks make every tick a deduction; the group waits its turn.
    for at in [3200, 3400, 4000, 4800] {
        n.feed(7, at - 200, at, MARK_BYTES);
        n.tick(at);
    }
    assert_eq!(n.links.searches, 1, "not again within {SEARCH_BACKOFF:?}");
    n.feed(7, 4800, 5100, MARK_BYTES);
    n.tick(5100);
    assert_eq!(n.links.searches, 2, "again after it");
    assert_eq!(n.link(7), None, "and nothing guessed");
}

/// Client 1001 opens three targets while 1002 is quiet (the connect alone
/// ties them), and the server answers 1001 right after each connect
/// completed when `answers`.
fn three_tied_by_the_connect(n: &mut Node, answers: bool) {
    n.client(1001, 1000);
    n.client(1002, 1000);
    for (cookie, at) in [(1, 1500), (2, 1600), (3, 1700)] {
        n.send(1001, at - 10, at - 5, 1000);
        n.dial(cookie, at);
        n.links.established(cookie, ms(at + 1));
        if answers {
            n.answer(1001, at + 2);
        }
    }
    n.poll(1001, 1800);
    n.poll(1002, 1800);
    n.tick(1800);
    for cookie in 1..=3 {
        assert_eq!(n.link(cookie).map(|l| l.0), Some(n.conn(1001)));
    }
}

/// Both clients upload in step; at 2.5 s the server dials target 20 for
/// 1002 and (when `answers`) answers 1002 alone.
fn a_request_among_uploads(n: &mut Node, answers: bool) {
    n.send(1001, 1800, 2500, 7 * MIB);
    n.send(1002, 1800, 2500, 7 * MIB);
    n.dial(20, 2500);
    n.links.established(20, ms(2501));
    if answers {
        n.answer(1002, 2504);
    }
    n.send(1001, 2500, 3000, 5 * MIB);
    n.send(1002, 2500, 3000, 5 * MIB);
    n.feed(20, 2500, 3000, MIB / 4);
    n.tick(3000);
}

#[test]
fn reply_uploaders_the_server_did_not_answer_after_the_connect_are_ruled_out() {
    let mut n = Node::new();
    three_tied_by_the_connect(&mut n, true);
    assert!(n.links.answers(PID), "three exact ties, each answered: the process answers");
    a_request_among_uploads(&mut n, true);
    assert_eq!(n.link(20), Some((n.conn(1002), vec!["connect", "reply"])));
}

#[test]
fn reply_a_process_whose_config_says_it_answers_is_held_to_it_from_its_first_request() {
    let mut n = Node::new();
    n.links.answering(vec![PID]);
    assert!(n.links.answers(PID), "its config names Hysteria 2 inbounds only");
    n.client(1001, 1000);
    n.client(1002, 1000);
    a_request_among_uploads(&mut n, true);
    assert_eq!(n.link(20), Some((n.conn(1002), vec!["connect", "reply"])));
    // Told it no longer serves only such inbounds: nothing learned, rule off.
    n.links.answering(Vec::new());
    assert!(!n.links.answers(PID));
}

#[test]
fn reply_a_server_that_does_not_answer_never_has_silence_count_against_anyone() {
    let mut n = Node::new();
    three_tied_by_the_connect(&mut n, false);
    assert!(!n.links.answers(PID));
    a_request_among_uploads(&mut n, false);
    assert_eq!(n.link(20), None, "both were busy at the connect: unattributed");
    // Answers that come only now (another protocol, or late) do not open it.
    let mut n = Node::new();
    three_tied_by_the_connect(&mut n, false);
    a_request_among_uploads(&mut n, true);
    assert_eq!(n.link(20), None);
}

#[test]
fn idle_and_download_only_connections_are_never_candidates() {
    let mut n = Node::new();
    n.client(1001, 1000);
    // 1002 sent its last request long ago (idle); 1003 only downloads
    // (its uplink carries ACKs, far less than the target takes).
    n.client(1002, 1000);
    n.client(1003, 1000);
    n.send(1003, 1500, 2000, 2000);
    n.send(1001, 1900, 3000, 8 * MIB);
    n.dial(7, 2000);
    n.feed(7, 2000, 3000, 4 * MIB);
    n.send(1003, 2000, 3000, 3000);
    n.poll(1002, 3000);
    n.tick(3000);
    assert_eq!(n.link(7).map(|l| l.0), Some(n.conn(1001)));
    let t = n.links.target(7).unwrap();
    assert!(!t.at_connect().unwrap().contains(&n.conn(1002)), "idle: not a candidate at the dial");
}

/// A target found already stuck (no connect, no bytes seen: it predates us).
fn found_stuck(n: &mut Node, cookie: u64, at_ms: u64) {
    let sample = SockSample {
        cookie,
        pid: PID,
        comm: "sing-box".into(),
        remote: Some("192.0.2.9:80".parse().unwrap()),
        outbound: true,
        state: 1,
        blocked_since: Some(ms(at_ms)),
        first_seen: Some(ms(at_ms)),
        ..Default::default()
    };
    n.socks.apply(Observation::Sock { at: ms(at_ms), change: SockChange::Blocked, sample });
}

#[test]
fn only_a_stuck_target_of_a_process_with_one_connection_is_that_ones() {
    let mut n = Node::new();
    n.client(1001, 1000);
    found_stuck(&mut n, 7, 1000);
    n.poll(1001, 12_000);
    n.tick(12_000);
    assert_eq!(n.link(7), Some((n.conn(1001), vec!["only"])));
    // With two connections, nothing tells which: unattributed.
    let mut n = Node::new();
    n.client(1001, 1000);
    n.client(1002, 1000);
    found_stuck(&mut n, 7, 1000);
    n.tick(12_000);
    assert_eq!(n.link(7), None);
}

#[test]
fn a_link_once_made_stays_and_counts_for_one_connection() {
    let mut n = Node::new();
    n.client(1001, 1000);
    n.client(1002, 1000);
    n.send(1001, 1990, 1995, 1000);
    n.dial(7, 2000);
    n.poll(1002, 2100);
    n.tick(2100);
    let first = n.link(7).unwrap().0;
    assert_eq!(first, n.conn(1001));
    // Later, client 1002 uploads while target 7 is fed: nothing moves it.
    n.send(1002, 2100, 4000, 30 * MIB);
    n.send(1001, 2100, 4000, 5 * MIB);
    n.feed(7, 2100, 4000, 4 * MIB);
    n.tick(4000);
    assert_eq!(n.link(7).map(|l| l.0), Some(first));
    let under: Vec<u64> = [1001, 1002].iter().flat_map(|p| n.links.linked_to(n.conn(*p)).collect::<Vec<_>>()).collect();
    assert_eq!(under, vec![7], "one connection holds it");
}

#[test]
fn api_the_servers_table_ties_exactly_and_names_other_inbounds() {
    let mut n = Node::new();
    n.client(1001, 1000);
    n.client(1002, 1000);
    n.dial(7, 2000);
    n.dial(9, 2000);
    n.send(1001, 2000, 3000, 10 * MIB);
    n.send(1002, 2000, 3000, 10 * MIB);
    n.tick(2500);
    let record = |source: Option<&str>, inbound: &str, cookie: u64| RelayRecord {
        id: cookie.to_string(),
        inbound: inbound.into(),
        source: source.map(|s| s.parse().unwrap()),
        dest_ip: Some(format!("192.0.2.{cookie}").parse().unwrap()),
        dest_port: 80,
        upload: 0,
        start: ms(2000),
        pid: Some(PID),
    };
    n.links.relays(vec![
        record(Some("10.0.0.2:1002"), "hysteria2/hy2-in", 7),
        record(Some("10.0.0.9:5555"), "mixed/socks-in", 9),
    ]);
    n.tick(3000);
    let l = n.links.link(7).unwrap();
    assert_eq!((l.conn, l.evidence.api, l.score), (n.conn(1002), true, 1.0));
    let other = n.links.target(9).unwrap();
    assert!(other.other_inbound && other.link.is_none(), "a SOCKS relay is no QUIC connection's");
}

#[test]
fn window_used_up_only_when_the_unexplained_bytes_fill_the_connection_window() {
    let mut n = Node::new();
    // Both first seen after we attached: every target they feed is known.
    n.client(1001, 1500);
    n.client(1002, 1500);
    n.send(1001, 1990, 1995, 1000);
    n.dial(7, 2000);
    n.poll(1002, 2100);
    n.tick(2100);
    n.send(1002, 2400, 2410, 1000);
    n.dial(8, 2420);
    n.poll(1001, 2500);
    n.tick(2500);
    assert_eq!(n.link(7).map(|l| l.0), Some(n.conn(1001)));
    assert_eq!(n.link(8).map(|l| l.0), Some(n.conn(1002)));
    // 1001: 4 MiB into its target, 30 MiB carried: more than 20 MiB pinned.
    n.send(1001, 2500, 3000, 30 * MIB);
    n.feed(7, 2500, 3000, 4 * MIB);
    // 1002: 4 MiB into its target, 18 MiB carried: 14 MiB pinned.
    n.send(1002, 2500, 3000, 18 * MIB);
    n.feed(8, 2500, 3000, 4 * MIB);
    n.tick(3000);
    assert!(n.links.window_used_up(n.conn(1001), ms(3000)));
    assert!(!n.links.window_used_up(n.conn(1002), ms(3000)));
}

/// Cost at node scale: 2,000 connections; 1,000 target sockets dialled one a
/// tick (200 ms, as in `watch`), each right after its client's request while
/// the other clients are quiet, and fed 1 MiB by its client; prints the time
/// per tick (docs/DETECTOR.md).
#[test]
fn cost_per_tick_at_two_thousand_connections_and_a_thousand_targets() {
    let mut n = Node::new();
    // Clients that keep their connections for the whole run (no idle expiry).
    n.conns = ConnTable::new(Duration::from_secs(3600));
    let conns = 2000u16;
    for i in 0..conns {
        n.client(10_000 + i, 500);
    }
    let mut at = 1000;
    let mut spent = Duration::ZERO;
    for t in 0..1000u64 {
        let port = 10_000 + (t as u16 * 7) % conns;
        n.send(port, at, at + 1, 1000);
        n.dial(t + 1, at + 2);
        // Its connect completes and the server answers (the reply check).
        n.links.established(t + 1, ms(at + 3));
        n.answer(port, at + 4);
        n.send(port, at + 2, at + 100, MIB + MIB / 8);
        n.feed(t + 1, at + 3, at + 100, MIB);
        at += 200;
        let start = Instant::now();
        n.tick(at);
        spent += start.elapsed();
        // Past `BUSY_TARGETS` the deduction runs once a second, but who was
        // active at a connect is still taken at the first poll after it.
        assert!(n.links.target(t + 1).and_then(|x| x.at_connect()).is_some(), "target {} at its first poll", t + 1);
    }
    let start = Instant::now();
    for k in 1..=10 {
        n.tick(at + k * 200);
    }
    let idle = start.elapsed() / 10;
    let linked = (1..=1000).filter(|c| n.link(*c).is_some()).count();
    eprintln!(
        "attribution: {:?} per tick while a target a tick is dialled, {idle:?} per tick after; {linked} linked",
        spent / 1000
    );
    assert_eq!(linked, 1000, "each tied by its connect");
}
