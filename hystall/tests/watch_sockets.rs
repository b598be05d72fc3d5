//! Root integration tests of the stalled-send probes, through the real binary:
//! `hystall lab tcp` makes real writers and targets on loopback, `hystall watch
//! --json` must flag exactly the writers into a never-reading target.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Proc, root_or_skip, tcp_lab, writers};
use serde_json::Value;

const TIMEOUT: u64 = 3;

fn locals_of(events: &[Value], name: &str) -> BTreeSet<String> {
    events.iter().filter(|e| e["event"] == name).map(|e| e["local"].as_str().unwrap_or("?").to_owned()).collect()
}

fn watch(pid: u32, timeout: u64, extra: &[&str]) -> Proc {
    let pid = pid.to_string();
    let t = timeout.to_string();
    let mut args = vec!["watch", "--json", "--pid", &pid, "--stall-timeout", &t];
    args.extend_from_slice(extra);
    let mut w = Proc::spawn(&args);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    for p in started["probes"].as_array().expect("probes") {
        assert!(p["attached"] == true, "probe not attached: {p}");
        // No raw_syscalls program on the default path.
        assert!(p["name"] != "sys_enter" && p["name"] != "sys_exit", "{p}");
    }
    // Blocked writers are read from /proc instead, and watch_started says so.
    assert!(started["blocked_writers"].as_str().is_some_and(|m| m.contains("/proc/")), "{started}");
    w
}

#[test]
fn stalled_writers_are_flagged_within_timeout_plus_one_second() {
    let Some(_g) = root_or_skip("stalled_writers_are_flagged_within_timeout_plus_one_second") else { return };
    // The lab waits 3 s before writing so that the watcher sees the first
    // blocked send live (not by the start-up scan).
    let (lab, ready) = tcp_lab(&[
        "--stall",
        "3",
        "--stall-blocking",
        "2",
        "--fast",
        "1",
        "--slow",
        "1",
        "--delay",
        "3",
        "--duration",
        "30",
    ]);
    let writes_start = Instant::now() + Duration::from_secs(3);
    let mut w = watch(lab.pid(), TIMEOUT, &[]);
    assert!(Instant::now() < writes_start, "watch took too long to start; the test would not test the live path");

    // Writers fill the stall target's buffers within a fraction of a second of
    // starting; the verdict must follow within the timeout plus one second.
    let deadline = writes_start + Duration::from_secs(TIMEOUT + 1);
    let events = w.collect_until(deadline);
    let expected: BTreeSet<String> = writers(&ready, "stall").into_iter().collect();
    assert_eq!(expected.len(), 5);
    assert_eq!(locals_of(&events, "socket_stalled"), expected, "events: {events:#?}");

    for e in events.iter().filter(|e| e["event"] == "socket_stalled") {
        assert_eq!(e["v"], 1);
        assert_eq!(e["pid"], lab.pid());
        assert_eq!(e["outbound"], true, "{e}");
        assert_eq!(e["peer_window"], 0, "a never-reading peer advertises a zero window: {e}");
        assert!(e["unsent_bytes"].as_u64().unwrap_or(0) > 1_000_000, "megabytes stay queued: {e}");
        assert!(e["blocked_ms"].as_u64().unwrap() >= TIMEOUT * 1000, "{e}");
        assert!(e["cookie"].as_u64().unwrap() > 0);
        assert_eq!(e["remote"], ready["targets"]["stall"]);
    }
    // Blocking writers are parked inside send(): at least one must be seen so.
    assert!(events.iter().any(|e| e["event"] == "socket_stalled" && e["in_syscall"] == true), "{events:#?}");

    // The fast and slow writers stay clean for several more timeouts.
    let later = w.collect_until(Instant::now() + Duration::from_secs(2 * TIMEOUT));
    assert!(locals_of(&later, "socket_stalled").is_empty(), "unexpected: {later:#?}");
    assert_eq!(w.stop(), Some(0), "watch must exit 0 on SIGTERM");
}

#[test]
fn healthy_targets_are_never_flagged() {
    let Some(_g) = root_or_skip("healthy_targets_are_never_flagged") else { return };
    let (lab, _ready) = tcp_lab(&["--slow", "3", "--fast", "2", "--upclose", "3", "--delay", "2", "--duration", "30"]);
    let mut w = watch(lab.pid(), 2, &["--duration", "12"]);
    // Six times the timeout: slow writers wait seconds for buffer space, but
    // their peer keeps acknowledging, so they must never be STALLED.
    let events = w.collect_until(Instant::now() + Duration::from_secs(14));
    let bad: Vec<&Value> = events.iter().filter(|e| e["event"] == "socket_stalled").collect();
    assert!(bad.is_empty(), "healthy sockets flagged: {bad:#?}");
    let code = w.child.wait().expect("watch ends by --duration").code();
    assert_eq!(code, Some(0));
}

#[test]
fn a_blocking_writer_connected_after_the_start_is_seen_parked() {
    let test = "a_blocking_writer_connected_after_the_start_is_seen_parked";
    let Some(_g) = root_or_skip(test) else { return };
    // The lab connects 3 s after it starts, so the watcher (and its one
    // start-up look for blocking sockets) comes first. Its writers connect
    // non-blocking and turn blocking afterwards, as a connect with a timeout
    // does: the kernel's look at the fd when the socket is tracked sees it
    // non-blocking, and its look when the peer's window closes sees it blocking.
    let mut full = vec!["lab", "tcp", "--stall-blocking", "2", "--fast", "1", "--connect-after", "3"];
    full.extend_from_slice(&["--duration", "30"]);
    let connects = Instant::now() + Duration::from_secs(3);
    let mut lab = Proc::spawn(&full);
    let mut w = watch(lab.pid(), TIMEOUT, &[]);
    assert!(Instant::now() < connects, "watch took too long to start; the test would not test the kernel's flag");
    let ready = lab.wait_event("lab_ready", Duration::from_secs(15));
    let events = w.collect_until(Instant::now() + Duration::from_secs(TIMEOUT + 2));
    let expected: BTreeSet<String> = writers(&ready, "stall").into_iter().collect();
    assert_eq!(expected.len(), 2);
    let stalled: Vec<&Value> = events.iter().filter(|e| e["event"] == "socket_stalled").collect();
    assert_eq!(locals_of(&events, "socket_stalled"), expected, "events: {events:#?}");
    // Seen parked inside send(): only the threads of a process known to hold
    // blocking sockets are read for it, and nothing but the kernel's flag
    // said so here.
    assert!(stalled.iter().any(|e| e["in_syscall"] == true), "{stalled:#?}");
    assert_eq!(w.stop(), Some(0));
}

#[test]
fn sockets_stuck_before_attach_are_found_by_the_startup_scan() {
    let Some(_g) = root_or_skip("sockets_stuck_before_attach_are_found_by_the_startup_scan") else { return };
    let (lab, ready) = tcp_lab(&["--stall", "2", "--stall-blocking", "1", "--fast", "1", "--duration", "30"]);
    std::thread::sleep(Duration::from_secs(1));
    let mut w = watch(lab.pid(), TIMEOUT, &[]);
    let events = w.collect_until(Instant::now() + Duration::from_secs(TIMEOUT + 1));
    let expected: BTreeSet<String> = writers(&ready, "stall").into_iter().collect();
    assert_eq!(locals_of(&events, "socket_stalled"), expected, "events: {events:#?}");
}

#[test]
fn with_no_selection_a_blocking_writer_stuck_before_the_start_is_seen_parked() {
    let test = "with_no_selection_a_blocking_writer_stuck_before_the_start_is_seen_parked";
    let Some(_g) = root_or_skip(test) else { return };
    let (lab, ready) = tcp_lab(&["--stall-blocking", "1", "--fast", "1", "--duration", "30"]);
    std::thread::sleep(Duration::from_secs(1));
    // Every process watched, so no per-selection look for blocking sockets:
    // the stuck socket is found by the start-up scan (it sent before the
    // kernel tracked anything) and tracked from user space; the kernel reads
    // its fd's mode at the first zero-window answer after that.
    let t = TIMEOUT.to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--stall-timeout", &t]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    assert_eq!(started["all_processes"], true, "{started}");
    let events = w.collect_until(Instant::now() + Duration::from_secs(TIMEOUT + 2));
    let ours: Vec<Value> = events.into_iter().filter(|e| e["pid"] == lab.pid()).collect();
    let expected: BTreeSet<String> = writers(&ready, "stall").into_iter().collect();
    assert_eq!(locals_of(&ours, "socket_stalled"), expected, "events: {ours:#?}");
    let stalled: Vec<&Value> = ours.iter().filter(|e| e["event"] == "socket_stalled").collect();
    assert!(stalled.iter().all(|e| e["in_syscall"] == true), "{stalled:#?}");
    assert_eq!(w.stop(), Some(0));
}

#[test]
fn a_stalled_socket_that_closes_is_reported_closed() {
    let Some(_g) = root_or_skip("a_stalled_socket_that_closes_is_reported_closed") else { return };
    let (lab, ready) = tcp_lab(&["--stall", "2", "--delay", "2", "--duration", "8"]);
    let mut w = watch(lab.pid(), 2, &[]);
    // The lab writes after 2 s and exits 8 s later (10 s after its start):
    // 2 s of margin after that for the close to be seen (not a fixed window
    // after watch_started, which comes sooner or later after the lab's start).
    let events = w.collect_until(Instant::now() + Duration::from_secs(12));
    let expected: BTreeSet<String> = writers(&ready, "stall").into_iter().collect();
    assert_eq!(locals_of(&events, "socket_stalled"), expected, "events: {events:#?}");
    // The lab exits at 8 s: its sockets are destroyed.
    assert_eq!(locals_of(&events, "socket_closed"), expected, "events: {events:#?}");
    let stalled: BTreeSet<u64> =
        events.iter().filter(|e| e["event"] == "socket_stalled").filter_map(|e| e["cookie"].as_u64()).collect();
    let closed: BTreeSet<u64> =
        events.iter().filter(|e| e["event"] == "socket_closed").filter_map(|e| e["cookie"].as_u64()).collect();
    assert_eq!(stalled, closed, "the same sockets, by cookie");
}

#[test]
fn sigterm_detaches_every_program() {
    let Some(_g) = root_or_skip("sigterm_detaches_every_program") else { return };
    // Program names as the kernel keeps them (15 characters).
    let ours = ["sock_send_lengt", "inet_sock_set_s", "tcp_probe", "tcp_destroy_soc", "sys_enter", "sys_exit"];
    let ids = || -> BTreeSet<u32> {
        common::loaded_programs().into_iter().filter(|(_, n)| ours.contains(&n.as_str())).map(|(id, _)| id).collect()
    };
    let before = ids();
    // A blocking writer too (its threads are read from /proc; no syscall
    // probe is loaded for it).
    let (lab, _) = tcp_lab(&["--fast", "1", "--stall-blocking", "1", "--duration", "10"]);
    let mut w = watch(lab.pid(), TIMEOUT, &[]);
    std::thread::sleep(Duration::from_millis(500));
    let during: BTreeSet<u32> = ids().difference(&before).copied().collect();
    assert!(during.len() >= 4, "the watch's programs should be loaded: {during:?}");
    assert_eq!(w.stop(), Some(0));
    // The kernel frees a program after an RCU grace period, a moment after
    // its last fd is closed.
    let mut left: Vec<u32> = Vec::new();
    for _ in 0..50 {
        left = ids().intersection(&during).copied().collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(left.is_empty(), "programs left loaded after SIGTERM: {left:?}");
}

#[test]
fn unknown_pid_is_a_one_line_error() {
    // No root needed: the selection is checked before anything is loaded.
    let out =
        std::process::Command::new(common::bin()).args(["watch", "--pid", "4294967294"]).output().expect("run hystall");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end(), "hystall: no process with pid 4294967294");
}
