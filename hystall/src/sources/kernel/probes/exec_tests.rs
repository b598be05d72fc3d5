//! The exec tracepoint's filter (`proc_exec.rs`), with the real program: an
//! exec of a program the selection does not name is no record once the
//! filter is on; one it names (by a name longer than the kernel's 15 bytes,
//! too) is, and so is any exec of a selected pid.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use aya::maps::{MapData, RingBuf};
use hystall_common::{SockEvent, SockEventKind, counter};

use super::{ProbeConfig, Probes};
use crate::sources::processes::procs::{comm_key, comm_str};

/// A copy of `true` named `name` in `dir` (its exec's comm is the name, cut to 15 bytes).
fn program(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::copy("/bin/true", &path).expect("copy /bin/true");
    path
}

fn run(path: &Path) -> u32 {
    let mut child = Command::new(path).spawn().expect("spawn");
    let pid = child.id();
    assert!(child.wait().expect("wait").success());
    pid
}

/// The execs in the ring: (pid, comm).
fn execs(ring: &mut RingBuf<MapData>) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() >= std::mem::size_of::<SockEvent>() {
            // SAFETY: the kernel wrote a SockEvent (repr(C), Pod) of this size.
            let ev: SockEvent = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const SockEvent) };
            if ev.kind() == Some(SockEventKind::Exec) {
                out.push((ev.stats.tgid, comm_str(&ev.stats.comm)));
            }
        }
    }
    out
}

#[test]
fn only_the_execs_of_the_selection_reach_user_space() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("hystall-exec-filter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let selected = program(&dir, "hystall-selected-proxy");
    let other = program(&dir, "hx-not-selected");
    let mut probes = Probes::load(&ProbeConfig { filter_pids: true, ..Default::default() }).expect("probes load");
    let mut ring = probes.take_events().expect("events ring");
    let skipped = |p: &Probes| p.counter(counter::EXECS_SKIPPED);

    // Before the filter is on (and whenever it cannot be): every exec.
    let before = run(&other);
    assert!(execs(&mut ring).iter().any(|&(pid, _)| pid == before), "an exec with the filter off");
    assert_eq!(skipped(&probes), 0);

    // A process selected by its pid, which execs a program of another name later.
    let mut sh = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("read line && exec {}", other.display()))
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh");
    probes.filter_execs(&[comm_key("hystall-selected-proxy")], &[sh.id()]).expect("exec filter");

    let unselected = run(&other);
    let named = run(&selected);
    sh.stdin.take().expect("stdin").write_all(b"\n").expect("go");
    assert!(sh.wait().expect("wait").success());
    let seen = execs(&mut ring);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!seen.iter().any(|&(pid, _)| pid == unselected), "an unselected exec was sent: {seen:?}");
    assert!(seen.contains(&(named, "hystall-selecte".to_owned())), "the selected name's exec: {seen:?}");
    assert!(seen.contains(&(sh.id(), "hx-not-selected".to_owned())), "the selected pid's exec: {seen:?}");
    assert!(skipped(&probes) >= 1, "skipped execs are counted");
}
