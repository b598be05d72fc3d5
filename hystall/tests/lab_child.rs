//! Root test: `watch --lab` killed outright (SIGKILL: no destructor runs)
//! leaves no `hystall lab` child behind; the kernel kills it with its parent.

mod common;

use std::time::{Duration, Instant};

use common::{Proc, root_or_skip};

fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry: read its state.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

#[test]
fn watch_lab_killed_with_sigkill_takes_its_lab_child_along() {
    let Some(_g) = root_or_skip("watch_lab_killed_with_sigkill_takes_its_lab_child_along") else { return };
    let mut w = Proc::spawn(&["watch", "--json", "--lab"]);
    let started = w.wait_event("watch_started", Duration::from_secs(20));
    let lab: Vec<u32> =
        started["pids"].as_array().expect("pids").iter().filter_map(|p| p.as_u64()).map(|p| p as u32).collect();
    assert_eq!(lab.len(), 1, "the lab's pid: {started}");
    let lab = lab[0];
    assert!(alive(lab), "the lab runs while watch does");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(w.pid() as i32, libc::SIGKILL) };
    let _ = w.child.wait();
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(lab) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(lab), "the lab child {lab} outlived its killed parent");
}
