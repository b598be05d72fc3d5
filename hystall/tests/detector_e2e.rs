//! Root end-to-end tests of the starvation detector: the built-in QUIC lab
//! (`watch --lab`) and a real Hysteria2 (sing-box), with targets that never
//! read (starved with 4 uploads, not with 1) and targets that read (nothing
//! flagged). Also prints the detection latency figures (docs/PERFORMANCE.md).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::singbox::{self, Behaviour, Options, SingBox, TcpTarget};
use common::{Proc, root_or_skip};
use serde_json::Value;

const TIMEOUT: u64 = 3;

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

fn ts_ms(e: &Value) -> i128 {
    let ts = e["ts"].as_str().expect("ts");
    ts.parse::<jiff::Timestamp>().expect("rfc3339").as_millisecond() as i128
}

/// Runs `watch --lab` for `secs` and returns its events.
fn lab_run(uploads: usize, target: &str, secs: u64) -> Vec<Value> {
    let args = common::lab_watch_args(uploads, target, TIMEOUT, secs);
    let mut w = Proc::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let events = w.collect_until(Instant::now() + Duration::from_secs(secs + 10));
    assert_eq!(w.child.wait().expect("watch ends").code(), Some(0));
    events
}

/// Stall onset → socket_stalled and → quic_starved, from the events' own figures.
fn latencies(events: &[Value]) -> (i128, i128) {
    let stalled = named(events, "socket_stalled");
    let onset = stalled.iter().map(|e| ts_ms(e) - e["no_progress_ms"].as_i64().unwrap() as i128).max().unwrap();
    let first_stalled = stalled.iter().map(|e| ts_ms(e)).min().unwrap();
    let starved = named(events, "quic_starved").iter().map(|e| ts_ms(e)).min().unwrap();
    (first_stalled - onset, starved - onset)
}

#[test]
fn lab_four_uploads_into_stalled_targets_starve_the_connection() {
    let Some(_g) = root_or_skip("lab_four_uploads_into_stalled_targets_starve_the_connection") else { return };
    let events = lab_run(4, "stall", 12);
    let stalled: BTreeSet<u64> = named(&events, "socket_stalled").iter().filter_map(|e| e["cookie"].as_u64()).collect();
    assert!(stalled.len() >= 3, "{events:#?}");
    let starved = named(&events, "quic_starved");
    assert!(!starved.is_empty(), "no quic_starved: {events:#?}");
    let last = starved.last().unwrap();
    assert_eq!(last["confidence"], "likely", "{last}");
    let blamed: BTreeSet<u64> = last["stalled"].as_array().unwrap().iter().filter_map(Value::as_u64).collect();
    assert!(blamed.len() >= 3 && blamed.is_subset(&stalled), "blamed {blamed:?}, stalled {stalled:?}");
    assert!(last["evidence"]["client_bulk_quiet_ms"].as_u64().unwrap() >= 2000, "{last}");
    // Stall-timeout + 3 s, from the moment the targets stopped moving.
    let (to_socket, to_starved) = latencies(&events);
    eprintln!("detection latency (lab): stall onset → socket_stalled {to_socket} ms, → quic_starved {to_starved} ms");
    assert!(to_starved <= (TIMEOUT as i128 + 3) * 1000, "{to_starved} ms");
}

#[test]
fn lab_one_upload_stalls_its_target_but_not_the_connection() {
    let Some(_g) = root_or_skip("lab_one_upload_stalls_its_target_but_not_the_connection") else { return };
    let events = lab_run(1, "stall", 12);
    assert_eq!(named(&events, "socket_stalled").len(), 1, "{events:#?}");
    assert!(named(&events, "quic_starved").is_empty(), "{events:#?}");
}

#[test]
fn lab_targets_that_read_or_close_flag_nothing() {
    let Some(_g) = root_or_skip("lab_targets_that_read_or_close_flag_nothing") else { return };
    for target in ["fast", "slow", "upclose"] {
        let events = lab_run(4, target, 10);
        let bad: Vec<&Value> =
            events.iter().filter(|e| e["event"] == "socket_stalled" || e["event"] == "quic_starved").collect();
        assert!(bad.is_empty(), "{target}: {bad:#?}");
        assert_eq!(named(&events, "quic_conn_opened").len(), 1, "{target}: the lab's connection is seen");
    }
}

/// Starts `hystall watch` on sing-box, then sing-box, then `uploads` into a
/// target of `behaviour`; returns the events of `secs` seconds.
fn singbox_run(uploads: usize, behaviour: Behaviour, port: u16, secs: u64) -> Vec<Value> {
    let p = port.to_string();
    let t = TIMEOUT.to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--comm", "sing-box", "--port", &p, "--stall-timeout", &t]);
    w.wait_event("watch_started", Duration::from_secs(15));
    let sb = SingBox::start(Options { server_port: Some(port), ..Default::default() }).expect("sing-box");
    let target = TcpTarget::spawn(behaviour).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let ups: Vec<_> = (0..uploads).map(|_| singbox::upload_via(sb.socks(), target.addr(), stop.clone())).collect();
    let events = w.collect_until(Instant::now() + Duration::from_secs(secs));
    stop.store(true, Ordering::SeqCst);
    for u in ups {
        let _ = u.join();
    }
    drop(sb);
    events
}

#[test]
fn hysteria2_four_uploads_into_a_never_reading_target_are_flagged() {
    let Some(_g) = root_or_skip("hysteria2_four_uploads_into_a_never_reading_target_are_flagged") else { return };
    if !singbox::sing_box_or_skip("hysteria2_four_uploads_into_a_never_reading_target_are_flagged") {
        return;
    }
    let events = singbox_run(4, Behaviour::Stall, 23000, 12);
    let stalled: BTreeSet<u64> = named(&events, "socket_stalled").iter().filter_map(|e| e["cookie"].as_u64()).collect();
    assert!(stalled.len() >= 3, "{events:#?}");
    for e in named(&events, "socket_stalled") {
        assert_eq!(e["comm"], "sing-box", "the server's target sockets: {e}");
    }
    let starved = named(&events, "quic_starved");
    assert!(!starved.is_empty(), "no quic_starved: {events:#?}");
    let last = starved.last().unwrap();
    assert_eq!(last["confidence"], "likely", "{last}");
    assert_eq!(last["comm"], "sing-box");
    let blamed: BTreeSet<u64> = last["stalled"].as_array().unwrap().iter().filter_map(Value::as_u64).collect();
    assert!(blamed.len() >= 3 && blamed.is_subset(&stalled), "blamed {blamed:?}, stalled {stalled:?}");
    let (to_socket, to_starved) = latencies(&events);
    eprintln!(
        "detection latency (sing-box): stall onset → socket_stalled {to_socket} ms, → quic_starved {to_starved} ms"
    );
    assert!(to_starved <= (TIMEOUT as i128 + 3) * 1000, "{to_starved} ms");
}

#[test]
fn hysteria2_one_upload_into_a_never_reading_target_is_not_starved() {
    let Some(_g) = root_or_skip("hysteria2_one_upload_into_a_never_reading_target_is_not_starved") else { return };
    if !singbox::sing_box_or_skip("hysteria2_one_upload_into_a_never_reading_target_is_not_starved") {
        return;
    }
    let events = singbox_run(1, Behaviour::Stall, 23001, 10);
    assert_eq!(named(&events, "socket_stalled").len(), 1, "{events:#?}");
    assert!(named(&events, "quic_starved").is_empty(), "{events:#?}");
}

#[test]
fn hysteria2_targets_that_read_or_close_flag_nothing() {
    let Some(_g) = root_or_skip("hysteria2_targets_that_read_or_close_flag_nothing") else { return };
    if !singbox::sing_box_or_skip("hysteria2_targets_that_read_or_close_flag_nothing") {
        return;
    }
    for (b, port) in [(Behaviour::Slow, 23002), (Behaviour::Fast, 23003), (Behaviour::Upclose, 23004)] {
        let events = singbox_run(4, b, port, 9);
        let bad: Vec<&Value> =
            events.iter().filter(|e| e["event"] == "socket_stalled" || e["event"] == "quic_starved").collect();
        assert!(bad.is_empty(), "{b:?}: {bad:#?}");
    }
}

#[test]
fn doctor_selftest_sees_the_whole_signature() {
    let Some(_g) = root_or_skip("doctor_selftest_sees_the_whole_signature") else { return };
    let out =
        std::process::Command::new(common::bin()).args(["doctor", "--selftest", "--json"]).output().expect("doctor");
    assert!(out.status.success());
    let checks: Vec<Value> = serde_json::from_slice(&out.stdout).expect("doctor --json");
    let selftest: Vec<&Value> =
        checks.iter().filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with("selftest:"))).collect();
    assert_eq!(selftest.len(), 3, "{checks:#?}");
    for c in selftest {
        assert_eq!(c["status"], "ok", "{c}");
    }
}
