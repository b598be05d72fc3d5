//! `--cgroup` and `--unit`: a service's processes, by cgroup v2 membership,
//! followed as processes join it; nothing of processes outside it.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cgroups::Cgroups;
use common::{Proc, root_or_skip, tcp_lab};
use hystall::sources::processes::cgroup::systemd_running;
use serde_json::Value;

fn stalled_pids(events: &[Value]) -> BTreeSet<u64> {
    events.iter().filter(|e| e["event"] == "socket_stalled").filter_map(|e| e["pid"].as_u64()).collect()
}

/// Labs in and out of the cgroup; `watch SELECT` sees only those inside, and a
/// lab moved in later is picked up.
fn selects_only_the_cgroup(dir: &Path, select: &[&str]) {
    let lab = ["--stall", "2", "--duration", "40"];
    let (inside, _) = tcp_lab(&lab);
    let (outside, _) = tcp_lab(&lab);
    let (later, _) = tcp_lab(&lab);
    Cgroups::enter(dir, inside.pid());

    let mut args = vec!["watch", "--json", "--stall-timeout", "2"];
    args.extend_from_slice(select);
    let mut w = Proc::spawn(&args);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    assert_eq!(started["pids"].as_array().map(Vec::len), Some(0), "{started}");
    assert!(started["cgroups"].as_array().is_some_and(|c| c.len() == 1), "{started}");
    let first = w.collect_until(Instant::now() + Duration::from_secs(5));
    assert_eq!(stalled_pids(&first), BTreeSet::from([inside.pid() as u64]), "{first:#?}");

    // A process that joins (a restarted service) is followed within a rescan.
    Cgroups::enter(dir, later.pid());
    let second = w.collect_until(Instant::now() + Duration::from_secs(5));
    assert_eq!(stalled_pids(&second), BTreeSet::from([later.pid() as u64]), "{second:#?}");
    assert!(w.stop() == Some(0));
    drop(outside);
}

#[test]
fn cgroup_selects_its_processes_only() {
    let Some(_g) = root_or_skip("cgroup_selects_its_processes_only") else { return };
    let mut cg = Cgroups::new();
    let name = format!("hystall-test-{}", std::process::id());
    let dir = cg.create(&name);
    selects_only_the_cgroup(&dir, &["--cgroup", &dir.to_string_lossy()]);
}

#[test]
fn unit_selects_its_cgroup_without_systemd() {
    let Some(_g) = root_or_skip("unit_selects_its_cgroup_without_systemd") else { return };
    if systemd_running() {
        eprintln!("unit_selects_its_cgroup_without_systemd: skipped: systemd runs here (its units are real)");
        return;
    }
    let mut cg = Cgroups::new();
    let unit = format!("hystall-test-{}", std::process::id());
    let dir = cg.create(&format!("system.slice/{unit}.service"));
    selects_only_the_cgroup(&dir, &["--unit", &unit]);
}

#[test]
fn unknown_units_and_cgroups_are_clear_errors() {
    let Some(_g) = root_or_skip("unknown_units_and_cgroups_are_clear_errors") else { return };
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::bin()).args(args).output().expect("hystall");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).trim().to_owned()
    };
    let err = run(&["watch", "--unit", "hystall-no-such-unit", "--duration", "1"]);
    assert!(err.starts_with("hystall: unit \"hystall-no-such-unit\" not found: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let err = run(&["watch", "--cgroup", "/hystall-no-such-cgroup", "--duration", "1"]);
    assert!(err.starts_with("hystall: cgroup \"/hystall-no-such-cgroup\" does not exist under "), "{err}");
}
