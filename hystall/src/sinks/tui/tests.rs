//! Snapshot tests on a `TestBackend` (no terminal, no root), from synthetic
//! models with fixed times, so the frames are deterministic.

use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::*;
use crate::core::detector::DetectorConfig;
use crate::core::flows::{Dir, DirCounters, FlowCounters, FlowId, HeaderSample};
use crate::core::observation::{DiagSample, Observation, SockChange, SockSample};
use crate::core::verdict::Thresholds;

fn s(secs: f64) -> Mono {
    Mono::from_secs_f64(secs)
}

const PID: u32 = 42;
const T0: f64 = 1000.0;

fn clock() -> WallClock {
    WallClock::fixed(1_764_680_000_000_000_000)
}

fn header() -> Header {
    Header {
        node: "node-1".into(),
        processes: vec![(PID, "sing-box".into())],
        probes_attached: ["sock_send_length", "inet_sock_set_state", "tcp_probe", "quic_ingress@eth0"]
            .map(String::from)
            .to_vec(),
        probes_degraded: vec![("quic_egress@eth0".into(), "TCX unavailable".into())],
        probes_on_demand: vec!["sys_enter".into(), "sys_exit".into()],
        send_path: "tracepoint".into(),
        quic_ports: "443".into(),
        quic_note: None,
        events_per_sec: 3.5,
        events_lost: 0,
        evicted: 0,
        mode: "observe".into(),
        refresh_ms: 1000,
        decrypt: None,
    }
}

fn model() -> Model {
    let th = Thresholds { stall_timeout: Duration::from_secs(10), slow_after: Duration::from_secs(1) };
    Model::new(th, Duration::from_secs(30), DetectorConfig::default())
}

/// A synthetic node: a sing-box serving QUIC on 443 with a few clients.
struct Node {
    model: Model,
    tui: Tui,
    /// Per client port: (c2s full, c2s small, s2c small, s2c full, last full, first).
    flows: Vec<(u16, [u64; 4], Option<Mono>, Mono)>,
}

impl Node {
    fn new() -> Node {
        let mut model = model();
        model.apply(Observation::Owners { at: s(T0), ports: vec![(443, PID)] });
        let mut tui = Tui::new(true);
        tui.set_header(header());
        Node { model, tui, flows: Vec::new() }
    }

    fn flow(port: u16) -> FlowId {
        FlowId {
            client: format!("198.51.100.{}:{port}", port % 200).parse().unwrap(),
            server: "203.0.113.1:443".parse().unwrap(),
        }
    }

    /// A client connects: the server's long header teaches its DCID.
    fn connect(&mut self, port: u16, at: f64) {
        let mut long = vec![0xe0, 0, 0, 0, 1, 0, 4];
        long.extend_from_slice(&[(port >> 8) as u8, port as u8, 0xab, 0xcd]);
        long.extend_from_slice(&[0x40, 0x20]);
        let sample =
            HeaderSample { flow: Node::flow(port), dir: Dir::S2c, payload_len: 60, segs: 1, bytes: long.into() };
        self.model.apply(Observation::Header { at: s(at), sample });
        self.flows.push((port, [0; 4], None, s(at)));
    }

    /// One second of traffic of every client; `bulk(port)` says who uploads.
    fn second(&mut self, at: f64, bulk: impl Fn(u16) -> bool) {
        let mut counts = Vec::new();
        for (port, c, last_full, first) in &mut self.flows {
            if bulk(*port) {
                c[0] += 800;
                c[3] += 40;
                *last_full = Some(s(at));
            }
            c[1] += 4;
            c[2] += 3;
            let c2s = DirCounters {
                packets: [c[1], 0, c[0]],
                bytes: [c[1] * 60, 0, c[0] * 1350],
                last: [Some(s(at)), None, *last_full],
                first: Some(*first),
            };
            let s2c = DirCounters {
                packets: [c[2], 0, c[3]],
                bytes: [c[2] * 50, 0, c[3] * 1350],
                last: [Some(s(at)), None, if c[3] > 0 { Some(s(at)) } else { None }],
                first: Some(*first),
            };
            counts.push((Node::flow(*port), FlowCounters { c2s, s2c, ..Default::default() }));
        }
        self.model.apply(Observation::FlowCounts { at: s(at), flows: counts });
    }

    fn socket(cookie: u64, remote: &str) -> SockSample {
        SockSample {
            cookie,
            pid: PID,
            comm: "sing-box".into(),
            local: Some(format!("203.0.113.1:{}", 40000 + cookie % 20000).parse().unwrap()),
            remote: Some(remote.parse().unwrap()),
            outbound: true,
            state: 1,
            first_seen: Some(s(T0)),
            ..Default::default()
        }
    }

    /// The server dials a target (CLOSE → SYN_SENT).
    fn dial(&mut self, cookie: u64, remote: &str, at: f64) {
        let k = Node::socket(cookie, remote);
        self.model.apply(Observation::Sock { at: s(at), change: SockChange::State { old: 7, new: 2 }, sample: k });
    }

    /// A target that got bytes until `fed_until`, then blocked for good.
    fn stall_target(&mut self, cookie: u64, remote: &str, fed_until: f64) {
        let mut k = Node::socket(cookie, remote);
        k.send_bytes = 8 << 20;
        k.acked_bytes = 4 << 20;
        k.send_calls = 100;
        k.send_eagain = 3;
        k.last_send = Some(s(fed_until));
        k.blocked_since = Some(s(fed_until));
        self.model.apply(Observation::Sock { at: s(fed_until), change: SockChange::Blocked, sample: k });
        let d = DiagSample {
            cookie,
            state: 1,
            send_q: 4 << 20,
            notsent: 3 << 20,
            bytes_acked: 4 << 20,
            ..Default::default()
        };
        self.model.apply(Observation::Diag { at: s(fed_until + 0.5), sample: d });
    }

    /// A healthy target: sends complete.
    fn ok_target(&mut self, cookie: u64, remote: &str, at: f64) {
        let mut k = Node::socket(cookie, remote);
        k.send_bytes = 1 << 20;
        k.acked_bytes = 1 << 20;
        k.last_send = Some(s(at));
        self.model.apply(Observation::Sock { at: s(at), change: SockChange::Poll, sample: k });
    }

    fn tick(&mut self, at: f64) {
        let mut events = self.model.tick(s(at));
        // Events of one tick come in a hash map's order: make the log deterministic.
        events.sort_by_key(|e| (e.at, format!("{:?}", e.event)));
        self.tui.observe(&self.model, s(at), &events, &clock());
    }

    fn draw(&mut self, w: u16, h: u16, at: f64) -> Terminal<TestBackend> {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| self.tui.draw(f, &self.model, s(at))).unwrap();
        term
    }

    fn key(&mut self, code: KeyCode) -> bool {
        self.tui.key(KeyEvent::new(code, KeyModifiers::NONE))
    }
}

const TARGETS: [&str; 4] = ["93.184.216.34:443", "93.184.216.35:443", "151.101.1.69:443", "140.82.121.4:443"];

/// Client 1 (port 50001) uploads into 4 targets that stop reading; client 2
/// (50002) keeps uploading; a healthy target and a slow one beside them.
fn starved_node() -> Node {
    let mut n = Node::new();
    n.connect(50001, T0);
    // Client 1 asks for its four targets before client 2 comes: the
    // connects tie them to it.
    for (i, remote) in TARGETS.iter().enumerate() {
        n.dial(i as u64 + 1, remote, T0 + 0.5);
    }
    n.connect(50002, T0 + 0.8);
    for t in 1..=6 {
        let at = T0 + t as f64;
        n.second(at, |_| true);
        n.tick(at);
    }
    for (i, remote) in TARGETS.iter().enumerate() {
        n.stall_target(i as u64 + 1, remote, T0 + 5.0 + i as f64 * 0.3);
    }
    n.ok_target(10, "8.8.8.8:853", T0 + 6.0);
    for t in 7..=20 {
        let at = T0 + t as f64;
        n.second(at, |p| p == 50002);
        n.ok_target(10, "8.8.8.8:853", at);
        n.tick(at);
    }
    n
}

#[test]
fn starved_connection_with_four_stalled_targets() {
    let mut n = starved_node();
    let st = n.model.detector.get(1).expect("conn 1 starved");
    assert_eq!(st.targets.len(), 4);
    let term = n.draw(160, 40, T0 + 20.0);
    insta::assert_snapshot!(term.backend());
}

#[test]
fn detail_of_the_starved_connection() {
    let mut n = starved_node();
    n.draw(160, 40, T0 + 20.0);
    assert!(n.key(KeyCode::Enter));
    let term = n.draw(160, 40, T0 + 20.0);
    let text = format!("{}", term.backend());
    assert!(text.contains("Connection 1"), "{text}");
    assert!(text.contains("client stream data stopped"), "{text}");
    insta::assert_snapshot!(term.backend());
}

#[test]
fn detail_of_a_stalled_socket() {
    let mut n = starved_node();
    n.draw(160, 40, T0 + 20.0);
    n.key(KeyCode::Tab);
    n.draw(160, 40, T0 + 20.0);
    n.key(KeyCode::Enter);
    let term = n.draw(160, 40, T0 + 20.0);
    let text = format!("{}", term.backend());
    assert!(text.contains("STALLED: the writer has been blocked"), "{text}");
    assert!(text.contains("Fed by QUIC connection 1 (linked by connect)"), "{text}");
}

#[test]
fn empty_node() {
    let mut n = Node::new();
    n.tick(T0);
    let term = n.draw(120, 30, T0);
    insta::assert_snapshot!(term.backend());
}

#[test]
fn tiny_terminal_does_not_panic() {
    let mut n = starved_node();
    let term = n.draw(40, 10, T0 + 20.0);
    insta::assert_snapshot!(term.backend());
    // Every small size, including degenerate ones.
    for (w, h) in [(0, 0), (1, 1), (59, 13), (60, 14), (61, 15), (80, 24)] {
        n.draw(w, h, T0 + 20.0);
        n.key(KeyCode::Enter);
        n.draw(w, h, T0 + 20.0);
        n.key(KeyCode::Char('?'));
        n.draw(w, h, T0 + 20.0);
        n.key(KeyCode::Esc);
        n.key(KeyCode::Esc);
    }
}

#[test]
fn help_overlay() {
    let mut n = starved_node();
    n.key(KeyCode::Char('?'));
    let term = n.draw(100, 30, T0 + 20.0);
    insta::assert_snapshot!(term.backend());
}

#[test]
fn filter_keeps_matching_rows() {
    let mut n = starved_node();
    n.key(KeyCode::Tab);
    n.key(KeyCode::Char('/'));
    for c in "8.8.8".chars() {
        n.key(KeyCode::Char(c));
    }
    let term = n.draw(160, 40, T0 + 20.0);
    let text = format!("{}", term.backend());
    assert!(text.contains("Target sockets (1 of 5)"), "{text}");
    assert!(text.contains("8.8.8.8:853"), "{text}");
    assert!(!text.contains("93.184.216.34:443 "), "{text}");
}

#[test]
fn paused_shows_the_frozen_view() {
    let mut n = starved_node();
    n.key(KeyCode::Char('p'));
    assert!(n.tui.paused());
    let before = format!("{}", n.draw(160, 40, T0 + 20.0).backend());
    assert!(before.contains("PAUSED"));
    // The model moves on: the client uploads again, a new client comes.
    n.connect(50003, T0 + 21.0);
    for t in 21..=25 {
        let at = T0 + t as f64;
        n.second(at, |_| true);
        n.tick(at);
    }
    let after = format!("{}", n.draw(160, 40, T0 + 25.0).backend());
    assert_eq!(before, after, "nothing rebuilt while paused");
    n.key(KeyCode::Char('p'));
    let live = format!("{}", n.draw(160, 40, T0 + 25.0).backend());
    assert!(!live.contains("PAUSED"));
    assert!(live.contains("50003"), "{live}");
}

#[test]
fn no_color_means_no_colour() {
    use ratatui::style::Color;
    let mut n = starved_node();
    let term = n.draw(160, 40, T0 + 20.0);
    let buf = term.backend().buffer();
    assert!(buf.content.iter().all(|c| c.fg == Color::Reset && c.bg == Color::Reset));
    let mut n = starved_node();
    n.tui = Tui::new(false);
    n.tick(T0 + 20.0);
    let term = n.draw(160, 40, T0 + 20.0);
    assert!(term.backend().buffer().content.iter().any(|c| c.fg == Color::Red), "starved rows are red");
}

/// 10k connections and 100k sockets on 200x50: only the visible rows are built.
#[test]
fn draws_a_big_node_fast() {
    let mut m = model();
    let at = s(T0);
    m.apply(Observation::Owners { at, ports: vec![(443, PID)] });
    let mut flows = Vec::with_capacity(10_000);
    for i in 0..10_000u32 {
        let flow = FlowId {
            client: std::net::SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 40000)),
            server: "203.0.113.1:443".parse().unwrap(),
        };
        let d = DirCounters { packets: [10, 0, 100], bytes: [500, 0, 135_000], last: [Some(at); 3], first: Some(at) };
        flows.push((flow, FlowCounters { c2s: d, s2c: d, ..Default::default() }));
    }
    m.apply(Observation::FlowCounts { at, flows });
    for c in 0..100_000u64 {
        let mut k = Node::socket(c + 1, "192.0.2.1:443");
        k.local = Some(std::net::SocketAddr::from(([10, 0, (c >> 8) as u8, c as u8], (c % 60000) as u16 + 1024)));
        if c % 100 == 0 {
            k.blocked_since = Some(s(T0 - 20.0));
        }
        m.apply(Observation::Sock { at, change: SockChange::Poll, sample: k });
    }
    let events = m.tick(s(T0 + 3.0));
    let mut tui = Tui::new(false);
    tui.set_header(header());
    let t = Instant::now();
    tui.observe(&m, s(T0 + 3.0), &events, &clock());
    let first_observe = t.elapsed();
    let t = Instant::now();
    tui.observe(&m, s(T0 + 4.0), &[], &clock());
    let observe = t.elapsed();
    let mut term = Terminal::new(TestBackend::new(200, 50)).unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..3 {
        let t = Instant::now();
        term.draw(|f| tui.draw(f, &m, s(T0 + 3.0))).unwrap();
        worst = worst.max(t.elapsed());
    }
    // Sorted by socket verdict: the stalled ones first.
    tui.key(KeyEvent::new(KeyCode::Tab, KeyModifiers::NONE));
    tui.key(KeyEvent::new(KeyCode::Char('p'), KeyModifiers::NONE));
    let t = Instant::now();
    term.draw(|f| tui.draw(f, &m, s(T0 + 3.0))).unwrap();
    let freeze = t.elapsed();
    println!(
        "10k conns, 100k sockets on 200x50: first observe {first_observe:?}, next {observe:?}, draw {worst:?} (worst of 3), pause {freeze:?}"
    );
    assert!(worst < Duration::from_millis(500), "draw took {worst:?}");
    let text = format!("{}", term.backend());
    assert!(text.contains("STALLED"), "{text}");
}

#[test]
fn lost_events_and_evicted_map_entries_show_in_the_header() {
    let mut n = Node::new();
    let quiet = format!("{}", n.draw(160, 20, T0).backend());
    assert!(quiet.contains("lost 0") && !quiet.contains("evicted"), "{quiet}");
    n.tui.set_header(Header { events_lost: 3, evicted: 14_592, ..header() });
    let text = format!("{}", n.draw(160, 20, T0).backend());
    assert!(text.contains("lost 3") && text.contains("evicted 14592"), "{text}");
}

#[test]
fn decrypt_shows_in_the_header_only_when_on() {
    let mut n = Node::new();
    let quiet = format!("{}", n.draw(200, 20, T0).backend());
    assert!(!quiet.contains("decrypt"), "{quiet}");
    n.tui.set_header(Header { decrypt: Some("1 server(s), 3 handshakes, 1 read".into()), ..header() });
    let text = format!("{}", n.draw(200, 20, T0).backend());
    assert!(text.contains("decrypt 1 server(s), 3 handshakes, 1 read"), "{text}");
}

#[test]
fn detail_of_a_connection_its_frames_prove_starved() {
    use crate::core::frames::{ClientStream, FrameSample, FrameState};
    let mut n = starved_node();
    // What `--decrypt` read of client 1: it used up the limit it names in
    // DATA_BLOCKED, with four streams holding it; ACKs and datagrams after.
    let streams = [(0, 5u64 << 20), (4, 5 << 20), (8, 6 << 20), (12, 4 << 20)];
    let state = FrameState {
        opened: [40, 0],
        client_consumed: 20 << 20,
        server_max_data: Some(20 << 20),
        data_blocked: Some((20 << 20, s(T0 + 5.0), s(T0 + 5.0))),
        data_blocked_frames: 1,
        last_stream: [Some(s(T0 + 5.0)), None],
        acks: [30, 0],
        last_ack: [Some(s(T0 + 19.0)), None],
        datagrams: [12, 0],
        last_datagram: [Some(s(T0 + 19.5)), None],
        client_streams: streams
            .iter()
            .map(|&(id, offset)| ClientStream { id, offset, last_new: Some(s(T0 + 5.0)), ..Default::default() })
            .collect(),
        ..Default::default()
    };
    n.model.apply(Observation::Frames {
        at: s(T0 + 19.8),
        sample: Box::new(FrameSample { flow: Node::flow(50001), state }),
    });
    n.tick(T0 + 20.0);
    n.draw(200, 40, T0 + 20.0);
    assert!(n.key(KeyCode::Enter));
    let term = n.draw(200, 40, T0 + 20.0);
    let text = format!("{}", term.backend());
    assert!(text.contains("STARVED (confirmed)"), "{text}");
    assert!(text.contains("Frames (decrypted): the client sent 20.0 MiB (DATA_BLOCKED at 20.0 MiB)"), "{text}");
    assert!(text.contains("open streams: 8 (6.0 MiB), 0 (5.0 MiB), 4 (5.0 MiB), 12 (4.0 MiB)"), "{text}");
    insta::assert_snapshot!(term.backend());
}
