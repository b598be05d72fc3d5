//! Root end-to-end test of `hystall top --lab` in a real terminal (tmux):
//! the starved lab connection and its stalled targets appear on screen within
//! the expected time, the detail view opens, a stalled target can be destroyed
//! by hand (D, then y), and quitting leaves the terminal and the kernel clean.
//! The header shows no degraded program, and warns when no QUIC server port
//! is watched (the reason one keypress away, in `?`).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::root_or_skip;

const SESSION: &str = "hystall_top_test";

fn tmux(args: &[&str]) -> std::process::Output {
    Command::new("tmux").args(args).output().expect("tmux")
}

fn screen() -> String {
    String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", SESSION]).stdout).into_owned()
}

/// Waits until the screen shows every one of `needles`.
fn wait_for(needles: &[&str], within: Duration) -> Result<String, String> {
    let deadline = Instant::now() + within;
    let mut last = String::new();
    while Instant::now() < deadline {
        last = screen();
        if needles.iter().all(|n| last.contains(n)) {
            return Ok(last);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(last)
}

struct Session;

impl Drop for Session {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", SESSION]);
    }
}

#[test]
fn top_lab_shows_the_starved_connection_and_quits_cleanly() {
    let Some(_g) = root_or_skip("top_lab_shows_the_starved_connection_and_quits_cleanly") else { return };
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("top_lab_shows_the_starved_connection_and_quits_cleanly: skipped: tmux not installed");
        return;
    }
    let ours = ["sock_send_lengt", "inet_sock_set_s", "tcp_probe", "tcp_destroy_soc", "quic_ingress", "quic_egress"];
    let ids = || -> std::collections::BTreeSet<u32> {
        common::loaded_programs().into_iter().filter(|(_, n)| ours.contains(&n.as_str())).map(|(id, _)| id).collect()
    };
    let before = ids();
    let _ = tmux(&["kill-session", "-t", SESSION]);
    // When top exits, the shell prints a marker: proof the terminal is usable.
    let cmd = format!("{} top --lab --stall-timeout 3 --refresh 250; echo TOP-EXITED-$?; sleep 30", common::bin());
    let out = tmux(&["new-session", "-d", "-s", SESSION, "-x", "160", "-y", "48", &cmd]);
    assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
    let _session = Session;

    // Stall timeout 3 s + 3 s, plus the lab's own start-up.
    // The connection's verdict with its confidence, and its stalled targets' rows.
    let shown = wait_for(&["STARVED likely"], Duration::from_secs(12)).unwrap_or_else(|s| panic!("screen:\n{s}"));
    let stalled_rows = shown.lines().filter(|l| l.contains("ESTABLISHED") && l.contains("STALLED")).count();
    assert!(stalled_rows >= 3, "stalled target rows on screen:\n{shown}");
    let during: std::collections::BTreeSet<u32> = ids().difference(&before).copied().collect();
    assert!(during.len() >= 6, "probes loaded while top runs: {during:?}");
    // Every program attached: none degraded, none waiting (blocked writers
    // are read from /proc, no syscall probe is attached).
    let head: String = shown.lines().take(3).collect::<Vec<_>>().join("\n");
    assert!(!head.contains("degraded") && !head.contains("on demand"), "header:\n{head}");
    assert!(head.contains("QUIC ports "), "the watched QUIC port in the header:\n{head}");
    // The help is one keypress away.
    let _ = tmux(&["send-keys", "-t", SESSION, "?"]);
    wait_for(&["details of the selected connection"], Duration::from_secs(3)).unwrap_or_else(|s| panic!("help:\n{s}"));
    let _ = tmux(&["send-keys", "-t", SESSION, "Escape"]);

    // The detail view of the selected (starved, on top) connection.
    let _ = tmux(&["send-keys", "-t", SESSION, "Enter"]);
    let detail = wait_for(&["stopped"], Duration::from_secs(3)).unwrap_or_else(|s| panic!("detail view:\n{s}"));
    assert!(detail.contains("stalled"), "evidence in the detail view:\n{detail}");

    let _ = tmux(&["send-keys", "-t", SESSION, "Escape"]);

    // Destroy the selected stalled target by hand: D asks, y confirms.
    let _ = tmux(&["send-keys", "-t", SESSION, "Tab"]);
    let _ = tmux(&["send-keys", "-t", SESSION, "D"]);
    wait_for(&["Destroy socket"], Duration::from_secs(3)).unwrap_or_else(|s| panic!("no confirmation asked:\n{s}"));
    let _ = tmux(&["send-keys", "-t", SESSION, "y"]);
    // The action in the log, and the destroyed socket closing.
    wait_for(&["ENFORCE", "CLOSED"], Duration::from_secs(4)).unwrap_or_else(|s| panic!("no destroy:\n{s}"));

    let _ = tmux(&["send-keys", "-t", SESSION, "q"]);
    let after = wait_for(&["TOP-EXITED-0"], Duration::from_secs(8)).unwrap_or_else(|s| panic!("after quit:\n{s}"));
    assert!(!after.contains("STARVED"), "the alternate screen is gone:\n{after}");
    std::thread::sleep(Duration::from_millis(500));
    let left: Vec<u32> = ids().intersection(&during).copied().collect();
    assert!(left.is_empty(), "programs left loaded after quit: {left:?}");
    let labs = Command::new("pgrep").args(["-f", "hystall lab --json"]).output().expect("pgrep");
    assert!(labs.stdout.is_empty(), "the lab child is gone");
}

#[test]
fn top_says_in_the_header_when_no_quic_server_is_watched() {
    let Some(_g) = root_or_skip("top_says_in_the_header_when_no_quic_server_is_watched") else { return };
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("top_says_in_the_header_when_no_quic_server_is_watched: skipped: tmux not installed");
        return;
    }
    let mut sleeper = Command::new("sleep").arg("60").spawn().expect("sleep");
    let _ = tmux(&["kill-session", "-t", SESSION]);
    let cmd = format!("{} top --pid {} --refresh 250; echo TOP-EXITED-$?; sleep 30", common::bin(), sleeper.id());
    let out = tmux(&["new-session", "-d", "-s", SESSION, "-x", "160", "-y", "48", &cmd]);
    assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
    let _session = Session;
    wait_for(&["no server port watched (? why)"], Duration::from_secs(10)).unwrap_or_else(|s| panic!("header:\n{s}"));
    let _ = tmux(&["send-keys", "-t", SESSION, "?"]);
    wait_for(&["QUIC: no QUIC server port watched"], Duration::from_secs(3)).unwrap_or_else(|s| panic!("help:\n{s}"));
    let _ = tmux(&["send-keys", "-t", SESSION, "Escape"]);
    let _ = tmux(&["send-keys", "-t", SESSION, "q"]);
    wait_for(&["TOP-EXITED-0"], Duration::from_secs(8)).unwrap_or_else(|s| panic!("after quit:\n{s}"));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn top_replays_a_recorded_stall_in_the_dashboard() {
    let Some(_g) = root_or_skip("top_replays_a_recorded_stall_in_the_dashboard") else { return };
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("top_replays_a_recorded_stall_in_the_dashboard: skipped: tmux not installed");
        return;
    }
    const REPLAY: &str = "hystall_top_replay_test";
    let dir = std::env::temp_dir().join(format!("hystall-top-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("stall.hrec");
    let rec = Command::new(common::bin())
        .args(["record", file.to_str().unwrap(), "--lab", "--stall-timeout", "3", "--duration", "12"])
        .output()
        .expect("record");
    assert_eq!(rec.status.code(), Some(0), "{}", String::from_utf8_lossy(&rec.stderr));

    let _ = tmux(&["kill-session", "-t", REPLAY]);
    let cmd = format!(
        "{} top --replay {} --speed 4 --refresh 250; echo TOP-EXITED-$?; sleep 30",
        common::bin(),
        file.display()
    );
    let out = tmux(&["new-session", "-d", "-s", REPLAY, "-x", "160", "-y", "48", &cmd]);
    assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
    struct Kill;
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = tmux(&["kill-session", "-t", "hystall_top_replay_test"]);
        }
    }
    let _kill = Kill;
    let screen = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", REPLAY]).stdout).into_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = String::new();
    while Instant::now() < deadline {
        last = screen();
        if last.contains("STARVED likely") && last.contains("replay") {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(last.contains("STARVED likely") && last.contains("replay"), "screen:\n{last}");
    let stalled_rows = last.lines().filter(|l| l.contains("STALLED")).count();
    assert!(stalled_rows >= 3, "{last}");
    let _ = tmux(&["send-keys", "-t", REPLAY, "q"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !screen().contains("TOP-EXITED-0") {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(screen().contains("TOP-EXITED-0"), "{}", screen());
    std::fs::remove_dir_all(&dir).ok();
}
