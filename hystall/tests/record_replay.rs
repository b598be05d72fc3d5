//! Root test of `hystall record` and `--replay`: a lab stall recorded live
//! replays to the same verdicts at the same times; a cut-short recording and a
//! file that is not one are handled with clear messages.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Proc, bin, root_or_skip};
use serde_json::Value;

/// (event, subject, ts): what must match between the live run and the replay.
fn verdicts(events: &[Value]) -> BTreeSet<(String, String, String)> {
    events
        .iter()
        .filter(|e| e["event"] != "watch_started")
        .map(|e| {
            let subject = e.get("cookie").or_else(|| e.get("conn")).map(|v| v.to_string()).unwrap_or_default();
            let conf = e.get("confidence").and_then(Value::as_str).unwrap_or_default();
            (format!("{} {conf}", e["event"].as_str().unwrap_or_default()), subject, e["ts"].to_string())
        })
        .collect()
}

fn replay(file: &std::path::Path) -> (Vec<Value>, String, Option<i32>) {
    let out = Command::new(bin()).args(["watch", "--json", "--replay"]).arg(file).output().expect("replay runs");
    let events = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    (events, String::from_utf8_lossy(&out.stderr).into_owned(), out.status.code())
}

#[test]
fn a_recorded_lab_stall_replays_to_the_same_verdicts_at_the_same_times() {
    let Some(_g) = root_or_skip("a_recorded_lab_stall_replays_to_the_same_verdicts_at_the_same_times") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("hystall-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("stall.hrec");
    let mut rec = Proc::spawn(&[
        "record",
        file.to_str().unwrap(),
        "--json",
        "--lab",
        "--lab-uploads",
        "4",
        "--stall-timeout",
        "3",
        "--duration",
        "14",
    ]);
    let live = rec.collect_until(Instant::now() + Duration::from_secs(30));
    assert_eq!(rec.child.wait().unwrap().code(), Some(0));
    let live_set = verdicts(&live);
    assert!(live.iter().any(|e| e["event"] == "quic_starved"), "the lab stalled live: {live:?}");
    assert!(live.iter().filter(|e| e["event"] == "socket_stalled").count() >= 3);

    let (replayed, stderr, code) = replay(&file);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(replayed.first().map(|e| e["event"].clone()), Some("watch_started".into()));
    assert_eq!(verdicts(&replayed), live_set, "replay differs from the live run");
    let size = std::fs::metadata(&file).unwrap().len();
    eprintln!("recorded 14 s of a lab stall in {size} bytes; replay identical ({} events)", live_set.len());

    // Cut short (a recorder killed mid-write): replays what is there, says so.
    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.join("cut.hrec");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3 + 1]).unwrap();
    let (events, stderr, code) = replay(&cut);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!events.is_empty());
    assert!(stderr.contains("cut short") || stderr.is_empty(), "{stderr}");

    // Not a recording, not a capture: one line, non-zero.
    let junk = dir.join("junk.bin");
    std::fs::write(&junk, b"hello, this is not a recording").unwrap();
    let (_, stderr, code) = replay(&junk);
    assert_eq!(code, Some(1));
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}
