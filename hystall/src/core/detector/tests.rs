//! The detector on synthetic timelines.

use super::*;
use crate::core::flows::{DirCounters, FlowCounters, FlowId, HeaderSample};
use crate::core::observation::{ByteMark, Observation, SockChange, SockSample};
use crate::core::verdict::Thresholds;

mod frames;
mod together;

fn s(secs: f64) -> Mono {
    Mono::from_secs_f64(secs)
}

const PID: u32 = 42;
const SERVER_PORT: u16 = 443;

/// A synthetic node: one server process, its connections and targets.
struct Node {
    conns: ConnTable,
    socks: SocketTable,
    det: Detector,
    owners: HashMap<u16, u32>,
    /// Per client: cumulative counters (c2s full, c2s small, s2c small).
    flows: HashMap<u16, (u64, u64, u64, Option<Mono>, Mono)>,
    streams: Option<Vec<ServerStream>>,
    links: crate::core::attribution::Attribution,
}

impl Node {
    fn new() -> Node {
        Node::with_timeout(10)
    }

    /// A node whose sockets and detector use a stall timeout of `secs`.
    fn with_timeout(secs: u64) -> Node {
        let stall_timeout = Duration::from_secs(secs);
        let th = Thresholds { stall_timeout, slow_after: Duration::from_secs(1) };
        Node {
            conns: ConnTable::new(Duration::from_secs(30)),
            socks: SocketTable::new(th),
            det: Detector::new(DetectorConfig { stall_timeout, ..Default::default() }),
            owners: HashMap::from([(SERVER_PORT, PID)]),
            flows: HashMap::new(),
            streams: None,
            links: Default::default(),
        }
    }

    fn flow(client_port: u16) -> FlowId {
        FlowId {
            client: format!("10.0.0.{}:{client_port}", client_port % 200).parse().unwrap(),
            server: format!("10.0.0.1:{SERVER_PORT}").parse().unwrap(),
        }
    }

    /// A client connects (its server Handshake teaches the DCID).
    fn connect(&mut self, client: u16, at: f64) {
        let dcid = [client as u8, 1, 2, 3];
        let mut long = vec![0xe0, 0, 0, 0, 1, 0, 4];
        long.extend_from_slice(&dcid);
        long.extend_from_slice(&[0x40, 0x20]);
        let f = Node::flow(client);
        self.conns
            .sample(s(at), &HeaderSample { flow: f, dir: Dir::S2c, payload_len: 60, segs: 1, bytes: long.into() });
        self.flows.insert(client, (0, 0, 0, None, s(at)));
    }

    /// One second of traffic for `client`: bulk up or not; small packets both ways.
    fn second(&mut self, client: u16, at: f64, bulk: bool) {
        let e = self.flows.get_mut(&client).unwrap();
        if bulk {
            e.0 += 8000;
            e.3 = Some(s(at));
        }
        e.1 += 5;
        e.2 += 5;
        let (full, small, down, last_full, first) = *e;
        let c2s = DirCounters {
            packets: [small, 0, full],
            bytes: [small * 50, 0, full * 1200],
            last: [Some(s(at)), None, last_full],
            first: Some(first),
        };
        let s2c = DirCounters {
            packets: [down, 0, 0],
            bytes: [down * 50, 0, 0],
            last: [Some(s(at)), None, None],
            first: Some(first),
        };
        self.conns.counters(s(at), Node::flow(client), FlowCounters { c2s, s2c, ..Default::default() });
        self.links.polled(s(at));
        if bulk {
            // The kernel's byte marks of the second's client bytes, one
            // each MARK_BYTES, spread over the second.
            let (from, to) = ((full - 8000) * 1200, full * 1200);
            let step = hystall_common::MARK_BYTES;
            let marks: Vec<ByteMark> = (from / step + 1..=to / step)
                .map(|k| {
                    let frac = (k * step - from) as f64 / (to - from) as f64;
                    ByteMark::Flow { flow: Node::flow(client), cpu: 0, at: s(at - 1.0 + frac), bytes: k * step }
                })
                .collect();
            self.links.marks(&marks, &self.conns);
        }
    }

    /// A target socket of the server that got bytes until `fed_until`, then
    /// blocked for good (a never-reading target).
    fn stall_target(&mut self, cookie: u64, fed_until: f64) {
        // Dialled two seconds before, fed 1 MiB a second until then.
        self.links.connect(cookie, PID, s(fed_until - 2.0));
        let marks: Vec<ByteMark> = [1.5, 0.5]
            .iter()
            .enumerate()
            .map(|(i, back)| ByteMark::Send { cookie, at: s(fed_until - back), bytes: (i as u64 + 1) << 20 })
            .collect();
        self.links.marks(&marks, &self.conns);
        let k = SockSample {
            cookie,
            pid: PID,
            comm: "sing-box".into(),
            local: Some(format!("10.0.0.1:{}", 40000 + cookie).parse().unwrap()),
            remote: Some("93.184.216.34:443".parse().unwrap()),
            outbound: true,
            state: 1,
            last_send: Some(s(fed_until)),
            blocked_since: Some(s(fed_until)),
            first_seen: Some(s(0.0)),
            ..Default::default()
        };
        self.socks.apply(Observation::Sock { at: s(fed_until), change: SockChange::Blocked, sample: k });
    }

    fn tick(&mut self, at: f64) -> Vec<Stamped> {
        let mut out = self.socks.tick(s(at));
        self.conns.tick(s(at));
        self.links.tick(s(at), &self.conns, &self.socks, &self.owners);
        out.extend(self.det.tick(s(at), &self.conns, &self.socks, &self.links, &self.owners, self.streams.as_deref()));
        out.into_iter().filter(|e| matches!(e.event, Event::QuicStarved(_) | Event::QuicRecovered(_))).collect()
    }
}

fn starved(events: &[Stamped]) -> Vec<(u64, &'static str, usize)> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Event::QuicStarved(i) => Some((i.conn, i.confidence, i.stalled.len())),
            _ => None,
        })
        .collect()
}

/// One client uploads for 5 s into three targets that stop reading at
/// 3, 4 and 5 s.
fn fed_then_three_stalled() -> (Node, Vec<Stamped>) {
    let mut n = Node::new();
    n.connect(1000, 0.0);
    let mut events = Vec::new();
    for t in 1..=5 {
        n.second(1000, t as f64, true);
        events.extend(n.tick(t as f64));
    }
    for (cookie, fed) in [(1, 3.0), (2, 4.0), (3, 5.0)] {
        n.stall_target(cookie, fed);
    }
    (n, events)
}

#[test]
fn three_stalled_streams_starve_the_connection_that_fed_them() {
    let (mut n, mut events) = fed_then_three_stalled();
    for t in 6..=16 {
        n.second(1000, t as f64, false);
        events.extend(n.tick(t as f64));
    }
    // The targets reach the stall timeout one after the other; two are
    // not enough (its bytes since before we attached are not all known,
    // so they cannot say its window is used up).
    assert_eq!(starved(&events), vec![(1, "likely", 3)]);
    let st = n.det.get(1).unwrap();
    assert_eq!(st.since, s(5.0), "client bulk stopped at 5 s");
    assert!(st.targets.iter().all(|(_, strength)| *strength == 1.0));
}

/// Frames of a client that used up the 20 MiB connection credit at 5 s.
fn blocked_frames(last_stream: f64, acks_until: f64) -> crate::core::frames::FrameState {
    crate::core::frames::FrameState {
        opened: [500, 400],
        stream_bytes: [20 << 20, 0],
        last_stream: [Some(s(last_stream)), None],
        acks: [100, 80],
        last_ack: [Some(s(acks_until)), Some(s(acks_until))],
        datagrams: [10, 10],
        last_datagram: [Some(s(acks_until)), Some(s(acks_until))],
        client_consumed: 20 << 20,
        server_max_data: Some(20 << 20),
        data_blocked: Some((20 << 20, s(last_stream), s(acks_until))),
        data_blocked_frames: 1,
        ..Default::default()
    }
}

#[test]
fn decrypted_frames_confirm_it_without_any_target() {
    use crate::core::frames::FrameSample;
    let mut n = Node::new();
    n.connect(1000, 0.0);
    let mut events = Vec::new();
    for t in 1..=5 {
        n.second(1000, t as f64, true);
        events.extend(n.tick(t as f64));
    }
    for t in 6..=16 {
        n.second(1000, t as f64, false);
        let state = blocked_frames(5.0, t as f64);
        n.conns.frames(FrameSample { flow: Node::flow(1000), state });
        events.extend(n.tick(t as f64));
    }
    assert_eq!(starved(&events), vec![(1, "confirmed", 0)]);
    let st = n.det.get(1).unwrap();
    assert_eq!(st.since, s(5.0), "the client's last STREAM frame");
    let Some(Event::QuicStarved(info)) = events.first().map(|e| &e.event) else { panic!() };
    let f = info.evidence.frames.as_ref().expect("frame evidence");
    assert_eq!((f.max_data, f.client_consumed, f.data_blocked_limit), (20 << 20, 20 << 20, Some(20 << 20)));

    // The server raises MAX_DATA and the client sends again: recovered.
    let mut state = blocked_frames(17.0, 17.0);
    state.server_max_data = Some(40 << 20);
    state.max_data_raised = Some(s(16.5));
    n.second(1000, 17.0, true);
    n.conns.frames(FrameSample { flow: Node::flow(1000), state });
    let after = n.tick(17.0);
    assert!(after.iter().any(|e| matches!(e.event, Event::QuicRecovered(_))), "{after:?}");
}

#[test]
fn frames_of_an_idle_client_with_credit_left_prove_nothing() {
    use crate::core::frames::FrameSample;
    let mut n = Node::new();
    n.connect(1000, 0.0);
    let mut events = Vec::new();
    for t in 1..=12 {
        n.second(1000, t as f64, t <= 5);
        let mut state = blocked_frames(5.0, t as f64);
        state.client_consumed = 3 << 20;
        state.data_blocked = None;
        n.conns.frames(FrameSample { flow: Node::flow(1000), state });
        events.extend(n.tick(t as f64));
    }
    assert!(starved(&events).is_empty(), "{events:?}");
}

#[test]
fn the_servers_own_stream_table_confirms_it() {
    let mut n = Node::new();
    n.connect(1000, 0.0);
    for t in 1..=5 {
        n.second(1000, t as f64, true);
        n.tick(t as f64);
    }
    for c in 1..=3 {
        n.stall_target(c, 5.0);
    }
    // Hysteria's /dump/streams: three established streams of connection 7
    // to the targets' address, idle since 5 s; one healthy stream elsewhere.
    let stream = |id: u64, addr: &str, idle_since: f64| ServerStream {
        connection: 7,
        stream: id,
        state: "estab".into(),
        req_addr: "example.com:443".into(),
        hooked_req_addr: addr.into(),
        tx: 0,
        rx: 8 << 20,
        last_active: s(idle_since),
    };
    n.streams = Some(vec![
        stream(0, "93.184.216.34:443", 5.0),
        stream(4, "93.184.216.34:443", 5.0),
        stream(8, "93.184.216.34:443", 5.0),
        stream(12, "1.1.1.1:53", 15.5),
    ]);
    let mut events = Vec::new();
    for t in 6..=16 {
        n.second(1000, t as f64, false);
        events.extend(n.tick(t as f64));
    }
    assert_eq!(starved(&events).last(), Some(&(1, "confirmed", 3)));
    let api = n.det.get(1).unwrap().api.clone().unwrap();
    assert_eq!((api.connection, api.frozen_streams, api.matching), (7, 3, 3));
}

#[test]
fn one_stalled_stream_stalls_its_target_but_does_not_starve_the_connection() {
    let mut n = Node::new();
    n.connect(1000, 0.0);
    for t in 1..=3 {
        n.second(1000, t as f64, true);
        n.tick(t as f64);
    }
    n.stall_target(1, 3.0);
    let mut events = Vec::new();
    for t in 4..=30 {
        n.second(1000, t as f64, false);
        events.extend(n.tick(t as f64));
    }
    assert!(events.is_empty(), "{:?}", starved(&events));
    assert_eq!(n.socks.counts()[2], 1, "the target itself is STALLED");
}

/// A client first seen after we attached, 38 MB up in 4 s, then quiet.
fn whole_upload(n: &mut Node, secs: u64) {
    n.tick(0.0);
    n.connect(1000, 1.5);
    for t in 2..2 + secs {
        n.second(1000, t as f64, true);
        n.tick(t as f64);
    }
}

#[test]
fn two_stalled_streams_are_suspected_when_its_bytes_fill_the_window_and_a_third_makes_it_likely() {
    let mut n = Node::new();
    whole_upload(&mut n, 4);
    n.stall_target(1, 4.0);
    n.stall_target(2, 5.0);
    let mut events = Vec::new();
    for t in 6..=16 {
        n.second(1000, t as f64, false);
        events.extend(n.tick(t as f64));
    }
    // 38 MB carried, 4 MB of it into the two targets: more than the
    // 20 MiB window is pinned by something, one stream short of likely.
    assert_eq!(starved(&events), vec![(1, "suspected", 2)]);
    n.stall_target(3, 5.0);
    let mut more = Vec::new();
    for t in 17..=21 {
        n.second(1000, t as f64, false);
        more.extend(n.tick(t as f64));
    }
    assert_eq!(starved(&more), vec![(1, "likely", 3)], "emitted again when the confidence rises");
}

#[test]
fn two_stalled_streams_whose_bytes_fit_in_the_window_are_not_flagged() {
    let mut n = Node::new();
    // 19 MB carried, 4 MB of it into the targets: 15 MB pinned, less
    // than the connection window: new streams still get credit.
    whole_upload(&mut n, 2);
    n.stall_target(1, 3.0);
    n.stall_target(2, 3.0);
    let mut events = Vec::new();
    for t in 4..=20 {
        n.second(1000, t as f64, false);
        events.extend(n.tick(t as f64));
    }
    assert!(starved(&events).is_empty(), "{:?}", starved(&events));
}

#[test]
fn a_starved_connection_recovers_when_its_targets_go_and_bulk_flows() {
    let mut n = Node::new();
    n.connect(1000, 0.0);
    for t in 1..=3 {
        n.second(1000, t as f64, true);
        n.tick(t as f64);
    }
    for c in 1..=3 {
        n.stall_target(c, 3.0);
    }
    let mut events = Vec::new();
    for t in 4..=14 {
        n.second(1000, t as f64, false);
        events.extend(n.tick(t as f64));
    }
    assert_eq!(starved(&events).len(), 1);
    // --enforce (or the upstream fix) closes the targets; uploads resume.
    for c in 1..=3 {
        let mut k = n.socks.get(c).unwrap().k.clone();
        k.state = 7;
        n.socks.apply(Observation::Sock { at: s(14.5), change: SockChange::Destroyed, sample: k });
    }
    let mut after = Vec::new();
    for t in 15..=20 {
        n.second(1000, t as f64, true);
        after.extend(n.tick(t as f64));
    }
    let recovered: Vec<&Stamped> = after.iter().filter(|e| matches!(e.event, Event::QuicRecovered(_))).collect();
    assert_eq!(recovered.len(), 1, "exactly once, no flapping");
    assert!(starved(&after).is_empty());
}

#[test]
fn with_two_clients_only_the_one_that_fed_the_stalled_targets_is_starved() {
    let mut n = Node::new();
    n.connect(1000, 0.0);
    n.connect(1001, 0.0);
    // Client 1001 uploaded early and went quiet long before; 1000 uploads
    // until its targets stall.
    for t in 1..=10 {
        n.second(1000, t as f64, true);
        n.second(1001, t as f64, t <= 2);
        n.tick(t as f64);
    }
    for c in 1..=3 {
        n.stall_target(c, 9.0 + c as f64 * 0.3);
    }
    let mut events = Vec::new();
    for t in 11..=25 {
        n.second(1000, t as f64, false);
        n.second(1001, t as f64, false);
        events.extend(n.tick(t as f64));
    }
    assert_eq!(starved(&events), vec![(1, "likely", 3)]);
}

#[test]
fn many_slow_targets_are_not_stalled_so_nothing_is_starved() {
    let mut n = Node::new();
    n.connect(1000, 0.0);
    let mut events = Vec::new();
    for t in 1..=40 {
        n.second(1000, t as f64, t % 7 == 0);
        // Slow readers: blocked writers whose peers keep acknowledging.
        for c in 1..=5u64 {
            let k = SockSample {
                cookie: c,
                pid: PID,
                outbound: true,
                state: 1,
                blocked_since: Some(s(1.0)),
                last_ack: Some(s(t as f64)),
                ..Default::default()
            };
            n.socks.apply(Observation::Sock { at: s(t as f64), change: SockChange::Poll, sample: k });
        }
        events.extend(n.tick(t as f64));
    }
    assert!(events.is_empty());
    assert_eq!(n.socks.counts(), [0, 5, 0], "all SLOW, none STALLED");
}

#[test]
fn frames_of_a_connection_none_of_whose_packets_opened_are_no_evidence() {
    use crate::core::frames::{FrameSample, FrameState};
    let (mut n, mut events) = fed_then_three_stalled();
    for t in 6..=16 {
        n.second(1000, t as f64, false);
        // --decrypt without secrets (shoes: rustls): packets passed, none opened.
        let state = FrameState { unopened: [40 * t, 10 * t], ..Default::default() };
        n.conns.frames(FrameSample { flow: Node::flow(1000), state });
        events.extend(n.tick(t as f64));
    }
    assert_eq!(starved(&events), vec![(1, "likely", 3)]);
    let Some(Event::QuicStarved(info)) = events.iter().map(|e| &e.event).find(|e| matches!(e, Event::QuicStarved(_)))
    else {
        panic!()
    };
    assert!(info.evidence.frames.is_none(), "{:?}", info.evidence.frames);
}
