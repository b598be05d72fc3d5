//! hystall as a service: the systemd unit grants exactly the capabilities the
//! binary checks, and with exactly those (as user nobody, no root) the whole
//! lab signature shows; without any one of them it stops at once, naming it.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{bin, root_or_skip};
use hystall::commands::caps::{ENFORCE, WATCH};
use serde_json::Value;

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/hystall.service")
}

/// The capabilities listed by `key=` in the unit (e.g. "CAP_BPF").
fn unit_caps(key: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(unit_path()).expect("the unit file");
    let line = text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).expect("key in the unit");
    line.split_whitespace().map(str::to_owned).collect()
}

/// `setpriv` as nobody holding exactly `caps` (ambient, so they survive exec).
fn as_nobody(caps: &BTreeSet<String>) -> Command {
    let list: String = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={list}"))
        .arg(format!("--ambient-caps={list}"))
        .arg(format!("--bounding-set={list}"))
        .arg(bin());
    cmd
}

/// Runs `cmd`, killing it after `limit`; None if it had to be killed.
fn run_for(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("setpriv");
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().ok();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn unit_grants_exactly_the_capabilities_hystall_checks() {
    let checked: BTreeSet<String> = WATCH.iter().chain(ENFORCE).map(|n| n.cap.to_string()).collect();
    assert_eq!(unit_caps("AmbientCapabilities"), checked);
    assert_eq!(unit_caps("CapabilityBoundingSet"), checked);
}

#[test]
fn unit_file_passes_systemd_analyze_verify() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("unit_file_passes_systemd_analyze_verify: skipped: systemd-analyze is not installed");
        return;
    }
    // The unit names /usr/local/bin/hystall, which may not be installed here:
    // verify a copy that runs the binary under test instead.
    let dir = std::env::temp_dir().join(format!("hystall-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(unit_path()).unwrap().replace("/usr/local/bin/hystall", bin());
    let unit = dir.join("hystall.service");
    std::fs::write(&unit, text).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&unit).output().expect("systemd-analyze");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Unknown keys are only warnings (exit 0): any line about our unit fails.
    let about_unit: Vec<&str> = stderr.lines().filter(|l| l.contains("hystall.service")).collect();
    assert!(out.status.success() && about_unit.is_empty(), "systemd-analyze verify: {stderr}");
}

#[test]
fn nobody_with_the_units_capabilities_sees_the_lab_starve() {
    let Some(_g) = root_or_skip("nobody_with_the_units_capabilities_sees_the_lab_starve") else { return };
    let caps = unit_caps("AmbientCapabilities");
    let mut cmd = as_nobody(&caps);
    cmd.args(["watch", "--lab", "--lab-uploads", "4", "--stall-timeout", "3", "--json", "--duration", "16"]);
    let out = run_for(cmd, Duration::from_secs(40)).expect("watch ended after --duration");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "watch as nobody failed: {}\n{stderr}", out.status);
    let events: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let count = |name: &str| events.iter().filter(|e| e["event"] == name).count();
    assert!(count("socket_stalled") >= 3, "stalled targets as nobody:\n{stdout}\n{stderr}");
    assert!(count("quic_starved") >= 1, "the lab's starvation as nobody:\n{stdout}\n{stderr}");
}

#[test]
fn each_missing_capability_is_named_at_once() {
    let Some(_g) = root_or_skip("each_missing_capability_is_named_at_once") else { return };
    let all = unit_caps("AmbientCapabilities");
    for cap in &all {
        let mut fewer = all.clone();
        fewer.remove(cap);
        let mut cmd = as_nobody(&fewer);
        cmd.args(["watch", "--lab", "--stall-timeout", "3", "--json", "--duration", "10"]);
        let started = Instant::now();
        let out = run_for(cmd, Duration::from_secs(8)).unwrap_or_else(|| panic!("without {cap}: still running"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "without {cap}: exited 0\n{stderr}");
        assert!(started.elapsed() < Duration::from_secs(3), "without {cap}: took {:?}", started.elapsed());
        assert!(
            stderr.starts_with(&format!("hystall: missing capability {cap} (needed")) && stderr.lines().count() == 1,
            "without {cap}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "without {cap}: the lab must not start");
    }
}
