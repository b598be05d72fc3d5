//! The exposition of a synthetic node: one QUIC connection starved by three
//! stalled targets (driven through the real model), plus enforcement events
//! and kernel figures.

use std::time::Duration;

use super::encode;
use crate::core::detector::DetectorConfig;
use crate::core::event::{EnforcedInfo, Event, Stamped};
use crate::core::flows::{Dir, DirCounters, FlowCounters, FlowId, HeaderSample};
use crate::core::model::Model;
use crate::core::observation::{Observation, SockChange, SockSample};
use crate::core::time::Mono;
use crate::core::verdict::Thresholds;
use crate::sinks::metrics::{Kernel, ProbeGauge, Snapshot, Totals};
use crate::sources::kernel::probes::stats::ProgStats;

fn s(secs: f64) -> Mono {
    Mono::from_secs_f64(secs)
}

const CLIENT: &str = "10.0.0.2:50000";
const SERVER: &str = "10.0.0.1:443";

fn flow() -> FlowId {
    FlowId { client: CLIENT.parse().unwrap(), server: SERVER.parse().unwrap() }
}

/// Cumulative counters of the client's flow after `secs` seconds, bulk
/// upload until `bulk_until`.
fn counts(secs: u64, bulk_until: u64) -> FlowCounters {
    let full = secs.min(bulk_until) * 8000;
    let last_full = Some(s(secs.min(bulk_until) as f64));
    let c2s = DirCounters {
        packets: [secs * 5, 0, full],
        bytes: [secs * 250, 0, full * 1200],
        last: [Some(s(secs as f64)), None, last_full],
        first: Some(s(0.0)),
    };
    let s2c = DirCounters {
        packets: [secs * 5, 0, 0],
        bytes: [secs * 250, 0, 0],
        last: [Some(s(secs as f64)), None, None],
        first: Some(s(0.0)),
    };
    FlowCounters { c2s, s2c, ..Default::default() }
}

fn stalled_target(cookie: u64, fed_until: f64) -> Observation {
    let k = SockSample {
        cookie,
        pid: 42,
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
    Observation::Sock { at: s(fed_until), change: SockChange::Blocked, sample: k }
}

/// The model after a starvation: returns it and every event it emitted.
fn starved_node() -> (Model, Vec<Stamped>) {
    let th = Thresholds { stall_timeout: Duration::from_secs(10), slow_after: Duration::from_secs(1) };
    let mut m = Model::new(th, Duration::from_secs(30), DetectorConfig::default());
    m.apply(Observation::Owners { at: s(0.0), ports: vec![(443, 42)] });
    // The server's Handshake teaches the 4-byte DCID.
    let mut long = vec![0xe0, 0, 0, 0, 1, 0, 4, 9, 1, 2, 3];
    long.extend_from_slice(&[0x40, 0x20]);
    let sample = HeaderSample { flow: flow(), dir: Dir::S2c, payload_len: 60, segs: 1, bytes: long.into() };
    m.apply(Observation::Header { at: s(0.0), sample });
    // The server dials the three targets right after the client's requests.
    for cookie in 1..=3 {
        let Observation::Sock { sample, .. } = stalled_target(cookie, 0.5) else { unreachable!() };
        m.apply(Observation::Sock { at: s(0.5), change: SockChange::State { old: 7, new: 2 }, sample });
    }
    let mut events = Vec::new();
    for t in 1..=16u64 {
        if t == 5 {
            for (cookie, fed) in [(1, 3.0), (2, 4.0), (3, 5.0)] {
                m.apply(stalled_target(cookie, fed));
            }
        }
        m.apply(Observation::FlowCounts { at: s(t as f64), flows: vec![(flow(), counts(t, 5))] });
        events.extend(m.tick(s(t as f64)));
    }
    (m, events)
}

fn enforced(action: &'static str, dry_run: bool, result: &str) -> Stamped {
    let info = EnforcedInfo { action, dry_run, result: result.into(), ..Default::default() };
    Stamped { at: s(17.0), event: Event::Enforced(info) }
}

use crate::sources::kernel::probes::upkeep::MapFill;

fn kernel() -> Kernel {
    let mut counters = [0u64; hystall_common::counter::LEN as usize];
    counters[hystall_common::counter::EVENTS_SENT as usize] = 120;
    counters[hystall_common::counter::EVENTS_LOST as usize] = 2;
    counters[hystall_common::counter::SAMPLES_LOST as usize] = 5;
    counters[hystall_common::counter::MARKS_LOST as usize] = 3;
    counters[hystall_common::counter::SECRETS_LOST as usize] = 4;
    counters[hystall_common::counter::PACKETS_LOST as usize] = 6;
    let probe = |p: &str, attached, waiting| ProbeGauge { program: p.into(), attached, waiting };
    Kernel {
        counters,
        probes: vec![
            probe("sock_send_length", true, false),
            probe("tcp_probe", false, false),
            probe("sys_enter", false, true),
            probe("quic_ingress@lo", true, false),
        ],
        progs: vec![ProgStats { program: "tcp_probe".into(), run_time: Duration::from_millis(1500), run_count: 300 }],
        stats_enabled: true,
        maps: vec![MapFill { map: "socks", entries: 7, capacity: 131_072 }],
        flows_evicted: 9,
        quic_server_ports: 0,
        quic_candidate_ports: 2,
    }
}

fn exposition() -> String {
    let (model, mut events) = starved_node();
    events.push(enforced("destroy", true, "dry-run"));
    events.push(enforced("destroy", false, "destroyed"));
    events.push(enforced("destroy", false, "failed: the socket is still established"));
    events.push(enforced("refuse", false, "rate limit: too many destroys this minute"));
    let mut totals = Totals::default();
    totals.observe(&events);
    encode(&Snapshot::new(&model, &totals, kernel()), true).unwrap()
}

/// The value of the sample `series` (name and labels exactly as printed).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_starved_node_shows_in_every_metric() {
    let t = exposition();
    let expect = [
        ("hystall_up", 1.0),
        ("hystall_build_info{version=\"0.1.0\"}", 1.0),
        ("hystall_stalled_targets", 3.0),
        ("hystall_slow_targets", 0.0),
        ("hystall_target_sockets{verdict=\"stalled\"}", 3.0),
        ("hystall_target_sockets{verdict=\"ok\"}", 0.0),
        ("hystall_starved_connections{confidence=\"suspected\"}", 0.0),
        ("hystall_starved_connections{confidence=\"likely\"}", 1.0),
        ("hystall_starved_connections{confidence=\"confirmed\"}", 0.0),
        ("hystall_quic_connections", 1.0),
        // Likely once the third target stalls: one starvation, one event.
        ("hystall_starvation_events_total", 1.0),
        ("hystall_events_total{event=\"quic_starved\"}", 1.0),
        ("hystall_events_total{event=\"socket_stalled\"}", 3.0),
        ("hystall_events_total{event=\"quic_recovered\"}", 0.0),
        ("hystall_events_total{event=\"enforced\"}", 4.0),
        ("hystall_recoveries_total", 0.0),
        ("hystall_enforcement_actions_total{action=\"destroy\",result=\"dry_run\"}", 1.0),
        ("hystall_enforcement_actions_total{action=\"destroy\",result=\"ok\"}", 1.0),
        ("hystall_enforcement_actions_total{action=\"destroy\",result=\"failed\"}", 1.0),
        ("hystall_enforcement_refusals_total", 1.0),
        ("hystall_kernel_events_total{ring=\"events\"}", 120.0),
        ("hystall_kernel_events_lost_total{ring=\"events\"}", 2.0),
        ("hystall_kernel_events_lost_total{ring=\"samples\"}", 5.0),
        ("hystall_kernel_events_lost_total{ring=\"marks\"}", 3.0),
        ("hystall_kernel_events_lost_total{ring=\"secrets\"}", 4.0),
        ("hystall_kernel_packets_not_passed_total", 6.0),
        ("hystall_kernel_map_evicted_total", 9.0),
        ("hystall_probe_attached{program=\"sock_send_length\"}", 1.0),
        ("hystall_probe_attached{program=\"tcp_probe\"}", 0.0),
        ("hystall_probe_attached{program=\"sys_enter\"}", 0.0),
        // tcp_probe failed; sys_enter only waits to be needed.
        ("hystall_probes_degraded", 1.0),
        // No QUIC server port found yet, two UDP ports waiting for an Initial.
        ("hystall_quic_server_ports", 0.0),
        ("hystall_quic_candidate_ports", 2.0),
        ("hystall_events_total{event=\"quic_ports_changed\"}", 0.0),
        ("hystall_probe_stats_enabled", 1.0),
        ("hystall_probe_run_time_seconds_total{program=\"tcp_probe\"}", 1.5),
        ("hystall_probe_run_count_total{program=\"tcp_probe\"}", 300.0),
        ("hystall_kernel_map_entries{map=\"socks\"}", 7.0),
        ("hystall_kernel_map_capacity{map=\"socks\"}", 131_072.0),
        ("hystall_table_entries{table=\"connections\"}", 1.0),
    ];
    for (series, want) in expect {
        assert_eq!(value(&t, series), Some(want), "{series} in:\n{t}");
    }
    assert!(t.contains("# TYPE hystall_starvation_events_total counter\n"), "{t}");
    assert!(t.contains("# TYPE hystall_stalled_targets gauge\n"), "{t}");
    assert!(!t.contains("# EOF"), "0.0.4 text, not OpenMetrics");
}

#[test]
fn every_event_kind_is_present_from_the_start_and_labels_stay_bounded() {
    let t = encode(&Snapshot::default(), false).unwrap();
    assert_eq!(value(&t, "hystall_up"), Some(0.0));
    for name in Event::NAMES {
        assert_eq!(value(&t, &format!("hystall_events_total{{event=\"{name}\"}}")), Some(0.0), "{name}");
    }
    // No connection, socket or address ever becomes a label.
    let t = exposition();
    for l in t.lines().filter(|l| !l.starts_with('#')) {
        for bad in ["conn=", "cookie=", "client=", "remote=", "local=", "pid="] {
            assert!(!l.contains(bad), "unbounded label in {l}");
        }
    }
}

#[test]
fn promtool_accepts_the_exposition() {
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        eprintln!("skipped: promtool not installed");
        return;
    };
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(exposition().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
