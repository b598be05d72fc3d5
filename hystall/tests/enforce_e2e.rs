//! Root end-to-end tests of `--enforce` against a real Hysteria2 (sing-box)
//! and the built-in lab: a starved connection is freed live, only the stalled
//! target sockets are destroyed, healthy targets are never touched, --dry-run
//! touches nothing, and enforcement refuses to start without a selection or
//! privilege.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::singbox::{self, Behaviour, Options, SingBox, TcpTarget};
use common::{Proc, root_or_skip};
use serde_json::Value;

const TIMEOUT: &str = "3";

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

fn ts_ms(e: &Value) -> i128 {
    e["ts"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()).map_or(0, |t| t.as_millisecond() as i128)
}

fn now_ms() -> i128 {
    jiff::Timestamp::now().as_millisecond() as i128
}

/// A watch on sing-box with `extra` flags, then sing-box, then `uploads` into
/// a `behaviour` target; probes a new request every 250 ms for `secs`.
/// Returns the events and the probe results (wall ms, ok).
fn run(
    uploads: usize,
    behaviour: Behaviour,
    port: u16,
    extra: &[&str],
    secs: u64,
) -> (Vec<Value>, Vec<(i128, bool)>, bool) {
    let p = port.to_string();
    let mut args = vec!["watch", "--json", "--comm", "sing-box", "--port", &p, "--stall-timeout", TIMEOUT];
    args.extend_from_slice(extra);
    let mut w = Proc::spawn(&args);
    w.wait_event("watch_started", Duration::from_secs(15));
    let mut sb = SingBox::start(Options { server_port: Some(port), ..Default::default() }).expect("sing-box");
    // An unrelated, healthy connection of the same server process: must survive.
    let echo = sb.echo.addr();
    let mut keep = singbox::connect_via(sb.socks(), echo).expect("a healthy connection through the proxy");
    // While the QUIC connection is starved even this stream cannot carry data.
    keep.set_read_timeout(Some(Duration::from_secs(3))).expect("read timeout");
    let target = TcpTarget::spawn(behaviour).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let ups: Vec<_> = (0..uploads).map(|_| singbox::upload_via(sb.socks(), target.addr(), stop.clone())).collect();
    let mut probes = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let ok = singbox::probe_new_stream(sb.socks(), echo, Duration::from_millis(700));
        probes.push((now_ms(), ok));
        std::thread::sleep(Duration::from_millis(250));
    }
    let events = w.collect_until(Instant::now() + Duration::from_millis(500));
    // The healthy connection still carries data both ways; the server lives.
    let mut buf = [0u8; 5];
    let healthy = keep.write_all(b"hello").is_ok() && keep.read_exact(&mut buf).is_ok() && &buf == b"hello";
    assert!(sb.alive(), "sing-box must survive");
    assert!(
        singbox::udp_echo_via(sb.socks(), sb.udp_echo.addr(), b"dgram", Duration::from_secs(2)),
        "the client-facing UDP socket is untouched: datagrams still relay"
    );
    stop.store(true, Ordering::SeqCst);
    for u in ups {
        let _ = u.join();
    }
    (events, probes, healthy)
}

#[test]
fn enforce_frees_a_starved_hysteria2_connection_touching_only_stalled_targets() {
    let Some(_g) = root_or_skip("enforce_frees_a_starved_hysteria2_connection_touching_only_stalled_targets") else {
        return;
    };
    if !singbox::sing_box_or_skip("enforce_frees_a_starved_hysteria2_connection_touching_only_stalled_targets") {
        return;
    }
    let (events, probes, healthy) = run(4, Behaviour::Stall, 24000, &["--enforce"], 10);
    assert!(healthy, "an unrelated connection of the same process was touched");
    let stalled: BTreeSet<u64> = named(&events, "socket_stalled").iter().filter_map(|e| e["cookie"].as_u64()).collect();
    let enforced = named(&events, "enforced");
    assert!(enforced.len() >= 3, "{events:#?}");
    for e in &enforced {
        assert_eq!(e["action"], "destroy", "{e}");
        assert_eq!(e["dry_run"], false);
        assert_eq!(e["result"], "destroyed", "{e}");
        assert_eq!(e["comm"], "sing-box");
        assert!(stalled.contains(&e["cookie"].as_u64().unwrap()), "only stalled sockets: {e}");
        assert!(e["blocked_ms"].as_u64().unwrap() >= 3000 && e["peer_window"] == 0, "evidence: {e}");
    }
    // New requests through the same connection work again soon after the
    // stall onset (the targets stopped moving): the stall timeout, plus a tick.
    let onset = enforced.iter().map(|e| ts_ms(e) - e["no_progress_ms"].as_i64().unwrap() as i128).min().unwrap();
    let first_fail = probes.iter().find(|(_, ok)| !ok).map(|(t, _)| *t).expect("the connection starved first");
    let back = probes.iter().find(|(t, ok)| *ok && *t > first_fail).map(|(t, _)| *t).expect("requests work again");
    eprintln!("enforce: stall onset → requests work again: {} ms", back - onset);
    assert!(back - onset <= 5000, "{} ms after the onset", back - onset);
}

#[test]
fn without_enforce_or_with_dry_run_the_connection_stays_starved_and_nothing_is_touched() {
    let Some(_g) = root_or_skip("without_enforce_or_with_dry_run_the_connection_stays_starved_and_nothing_is_touched")
    else {
        return;
    };
    if !singbox::sing_box_or_skip("without_enforce_or_with_dry_run") {
        return;
    }
    for (extra, port) in [(&[][..], 24001u16), (&["--enforce", "--dry-run"][..], 24002)] {
        // (The unrelated stream shares the starved connection: it cannot carry data.)
        let (events, probes, _) = run(4, Behaviour::Stall, port, extra, 9);
        let enforced = named(&events, "enforced");
        if extra.is_empty() {
            assert!(enforced.is_empty(), "{enforced:#?}");
        } else {
            assert!(enforced.len() >= 3, "dry-run reports what it would do: {events:#?}");
            for e in &enforced {
                assert_eq!(e["dry_run"], true, "{e}");
                assert_eq!(e["result"], "dry-run", "{e}");
            }
        }
        // Still starved at the end: the last probes all fail.
        let tail: Vec<bool> = probes.iter().rev().take(6).map(|(_, ok)| *ok).collect();
        assert!(tail.iter().all(|ok| !ok), "{extra:?}: {tail:?}");
    }
}

#[test]
fn healthy_targets_are_never_destroyed() {
    let Some(_g) = root_or_skip("healthy_targets_are_never_destroyed") else { return };
    if !singbox::sing_box_or_skip("healthy_targets_are_never_destroyed") {
        return;
    }
    for (b, port) in [(Behaviour::Slow, 24003), (Behaviour::Fast, 24004), (Behaviour::Upclose, 24005)] {
        // Several times the stall timeout.
        // (With 4 slow readers the connection window really fills and drains only
        // as fast as they read, so the unrelated stream may be slow too: what
        // matters is that nothing is destroyed.)
        let (events, _, healthy) = run(4, b, port, &["--enforce"], 10);
        assert!(healthy || b == Behaviour::Slow, "{b:?}");
        assert!(named(&events, "enforced").is_empty(), "{b:?}: {events:#?}");
    }
}

#[test]
fn enforce_frees_the_lab_connection() {
    let Some(_g) = root_or_skip("enforce_frees_the_lab_connection") else { return };
    let mut lab = Proc::spawn(&["lab", "--json", "--uploads", "4", "--target", "stall", "--delay", "2"]);
    let ready = lab.wait_event("lab_ready", Duration::from_secs(10));
    let pid = ready["pid"].to_string();
    let port = ready["server"].as_str().unwrap().rsplit(':').next().unwrap().to_owned();
    let mut w =
        Proc::spawn(&["watch", "--json", "--pid", &pid, "--port", &port, "--stall-timeout", TIMEOUT, "--enforce"]);
    w.wait_event("watch_started", Duration::from_secs(15));
    let probes = lab.collect_until(Instant::now() + Duration::from_secs(12));
    let events = w.collect_until(Instant::now() + Duration::from_millis(300));
    assert!(named(&events, "enforced").len() >= 3, "{events:#?}");
    let results: Vec<bool> =
        probes.iter().filter(|p| p["event"] == "lab_probe").map(|p| p["stream_ok"] == true).collect();
    let first_fail = results.iter().position(|ok| !ok).expect("starved first");
    assert!(results[first_fail..].iter().any(|ok| *ok), "new streams work again: {results:?}");
}

#[test]
fn enforcement_refuses_without_a_selection_or_privilege() {
    let _g = common::serial();
    // Without a selection (and no known proxy running): refused, clearly.
    let out =
        std::process::Command::new(common::bin()).args(["watch", "--enforce", "--duration", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let proxies_running = ["sing-box", "hysteria", "xray", "mihomo"]
        .iter()
        .any(|c| std::process::Command::new("pgrep").args(["-x", c]).output().is_ok_and(|o| !o.stdout.is_empty()));
    if !proxies_running {
        assert_eq!(out.status.code(), Some(1), "{err}");
        // Without the capabilities, that is said first.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(err.contains("--enforce needs --pid or --comm") || !root && err.contains("missing capabilit"), "{err}");
    }
    // Without the capabilities: refused before anything is loaded, naming them.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && std::path::Path::new("/usr/bin/setpriv").exists() {
        let me = std::process::id().to_string();
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", common::bin()])
            .args(["watch", "--enforce", "--pid", &me, "--duration", "1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("missing capabilities CAP_NET_ADMIN (needed by --enforce"), "{err}");
    } else {
        eprintln!(
            "enforcement_refuses_without_a_selection_or_privilege: privilege part skipped: needs root and setpriv"
        );
    }
}
