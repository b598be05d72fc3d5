//! Root end-to-end tests of the send paths (`sources::kernel::probes::send_path`):
//! how blocked writers are seen when the kernel has no `sock_send_length`
//! tracepoint. This host has the tracepoint and no fexit, so the zero-window
//! path is forced here (`HYSTALL_SEND_PATH=zero_window`) and must give the same
//! verdicts and targets as the tracepoint; the fexit path is tested on the
//! kernels that have it by `cargo xtask vm` (Debian's 5.10 and 6.1).

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Proc, root_or_skip, writers};
use serde_json::Value;

const TIMEOUT: u64 = 3;
const ZERO_WINDOW: &[(&str, &str)] = &[("HYSTALL_SEND_PATH", "zero_window")];

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

fn ts_ms(e: &Value) -> i128 {
    let ts = e["ts"].as_str().expect("ts");
    ts.parse::<jiff::Timestamp>().expect("rfc3339").as_millisecond() as i128
}

/// `watch --lab` with the zero-window path for `secs`: its `watch_started`
/// and the events after it.
fn lab_run(uploads: usize, target: &str, secs: u64) -> (Value, Vec<Value>) {
    let args = common::lab_watch_args(uploads, target, TIMEOUT, secs);
    let mut w = Proc::spawn_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), ZERO_WINDOW);
    let started = w.wait_event("watch_started", Duration::from_secs(20));
    let events = w.collect_until(Instant::now() + Duration::from_secs(secs + 10));
    assert_eq!(w.child.wait().expect("watch ends").code(), Some(0));
    (started, events)
}

fn assert_zero_window_path(started: &Value) {
    assert_eq!(started["send_path"]["path"], "zero_window", "{started}");
    let names: Vec<&str> = started["probes"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"tcp_probe"), "{started}");
    assert!(!names.contains(&"sock_send_length") && !names.contains(&"tcp_sendmsg_exit"), "{started}");
}

#[test]
fn the_default_path_here_is_the_tracepoint_and_watch_started_says_so() {
    let Some(_g) = root_or_skip("the_default_path_here_is_the_tracepoint_and_watch_started_says_so") else { return };
    let mut w = Proc::spawn(&["watch", "--json", "--lab", "--lab-uploads", "1", "--duration", "3"]);
    let started = w.wait_event("watch_started", Duration::from_secs(20));
    assert_eq!(started["send_path"]["path"], "tracepoint", "{started}");
    assert!(started["send_path"]["note"].as_str().unwrap().contains("sock_send_length"), "{started}");
    assert_eq!(w.stop(), Some(0));
}

#[test]
fn an_unknown_forced_path_is_one_clear_error() {
    let Some(_g) = root_or_skip("an_unknown_forced_path_is_one_clear_error") else { return };
    let out = std::process::Command::new(common::bin())
        .args(["watch", "--json", "--comm", "no-such-proxy", "--duration", "2"])
        .env("HYSTALL_SEND_PATH", "kprobe")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HYSTALL_SEND_PATH=kprobe") && err.contains("zero_window"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn zero_windows_starve_the_lab_connection_with_its_own_targets() {
    let Some(_g) = root_or_skip("zero_windows_starve_the_lab_connection_with_its_own_targets") else { return };
    let (started, events) = lab_run(4, "stall", 12);
    assert_zero_window_path(&started);
    let stalled: BTreeSet<u64> = named(&events, "socket_stalled").iter().filter_map(|e| e["cookie"].as_u64()).collect();
    assert!(stalled.len() >= 3, "{events:#?}");
    for e in named(&events, "socket_stalled") {
        assert_eq!(e["peer_window"], 0, "{e}");
        assert_eq!(e["outbound"], true, "{e}");
    }
    let starved = named(&events, "quic_starved");
    let last = starved.last().unwrap_or_else(|| panic!("no quic_starved: {events:#?}"));
    assert_eq!(last["confidence"], "likely", "{last}");
    let blamed: BTreeSet<u64> = last["stalled"].as_array().unwrap().iter().filter_map(Value::as_u64).collect();
    assert!(blamed.len() >= 3 && blamed.is_subset(&stalled), "blamed {blamed:?}, stalled {stalled:?}");
    // The same bound as the tracepoint path's (detector_e2e): stall timeout + 3 s.
    let onset = named(&events, "socket_stalled")
        .iter()
        .map(|e| ts_ms(e) - e["no_progress_ms"].as_i64().unwrap() as i128)
        .max()
        .unwrap();
    let to_starved = ts_ms(starved[0]) - onset;
    eprintln!("detection latency (zero_window path, lab): stall onset → quic_starved {to_starved} ms");
    assert!(to_starved <= (TIMEOUT as i128 + 3) * 1000, "{to_starved} ms");
}

#[test]
fn zero_windows_flag_nothing_for_targets_that_read_or_close() {
    let Some(_g) = root_or_skip("zero_windows_flag_nothing_for_targets_that_read_or_close") else { return };
    for target in ["fast", "slow", "upclose"] {
        let (started, events) = lab_run(4, target, 10);
        assert_zero_window_path(&started);
        let bad: Vec<&Value> =
            events.iter().filter(|e| e["event"] == "socket_stalled" || e["event"] == "quic_starved").collect();
        assert!(bad.is_empty(), "{target}: {bad:#?}");
        assert_eq!(named(&events, "quic_conn_opened").len(), 1, "{target}: the lab's connection is seen");
    }
}

#[test]
fn zero_windows_flag_non_blocking_and_blocking_writers_and_no_reading_target() {
    let test = "zero_windows_flag_non_blocking_and_blocking_writers_and_no_reading_target";
    let Some(_g) = root_or_skip(test) else { return };
    // The lab connects after the watcher attached, so every socket is tracked
    // from its connect (not by the start-up scan of stuck sockets).
    let args = ["lab", "tcp", "--stall", "2", "--stall-blocking", "2", "--slow", "2", "--fast", "1"];
    let mut full = args.to_vec();
    full.extend_from_slice(&["--connect-after", "3", "--duration", "30"]);
    let mut lab = Proc::spawn(&full);
    let pid = lab.pid().to_string();
    let t = TIMEOUT.to_string();
    let mut w = Proc::spawn_env(&["watch", "--json", "--pid", &pid, "--stall-timeout", &t], ZERO_WINDOW);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    assert_zero_window_path(&started);
    let ready = lab.wait_event("lab_ready", Duration::from_secs(15));
    let events = w.collect_until(Instant::now() + Duration::from_secs(3 * TIMEOUT + 2));
    let expected: BTreeSet<String> = writers(&ready, "stall").into_iter().collect();
    assert_eq!(expected.len(), 4);
    let flagged: BTreeSet<String> =
        named(&events, "socket_stalled").iter().map(|e| e["local"].as_str().unwrap_or("?").to_owned()).collect();
    // Exactly the stalled writers, both kinds; the slow and fast ones never.
    assert_eq!(flagged, expected, "events: {events:#?}");
    assert_eq!(w.stop(), Some(0));
}
