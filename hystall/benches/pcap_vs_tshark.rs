//! Offline triage speed: `hystall pcap FILE` against tshark reading the same
//! capture, without keys and with the key log (both decrypting QUIC). A
//! benchmark, not a test: it prints figures and never fails on them.
//!
//! The capture is made here: `tcpdump -i lo -U udp port P` while `hystall lab
//! --duration D --uploads 4 --keylog K --listen 127.0.0.1:P` runs (D = 10 s with
//! `--bench`, 2 s otherwise), so it needs root (tcpdump) and tshark; without
//! either it prints `skipped: ...`.
//!
//! Pairs, each run `ROUNDS` times alternately (the median wall time; the
//! largest peak RSS, from wait4's rusage of the child):
//! - `no keys`: `hystall pcap F` vs `tshark -r F -q -z conv,udp` (every packet
//!   read and dissected to UDP, one table at the end);
//! - `keys`: `hystall pcap F --keylog K` vs `tshark -r F -o tls.keylog_file:K
//!   -T fields -e quic.frame_type` (every QUIC packet decrypted, its frames
//!   printed).
//!
//! tshark is told the lab port is QUIC (`-d udp.port==P,quic`) so that it does
//! not depend on its heuristics. `cargo bench -p hystall --bench pcap_vs_tshark`
//! (or `cargo xtask bench`).

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HYSTALL: &str = env!("CARGO_BIN_EXE_hystall");
const TSHARK: &str = "tshark";
const ROUNDS: usize = 3;

/// Wall time and peak RSS of one run.
struct Run {
    wall: Duration,
    rss_kib: i64,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root (tcpdump on lo)");
        return;
    }
    for tool in [TSHARK, "tcpdump"] {
        if !on_path(tool) {
            println!("skipped: {tool} not found (cargo xtask setup installs it)");
            return;
        }
    }
    let dir = std::env::temp_dir().join(format!("hystall-pcap-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        println!("skipped: cannot create {}: {e}", dir.display());
        return;
    }
    let secs = if full { 10 } else { 2 };
    let res = capture(&dir, secs).map(|(pcap, keylog, port)| compare(&pcap, &keylog, port, secs));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = res {
        println!("skipped: {e}");
    }
}

/// Captures the lab; the capture, its key log and the server port.
fn capture(dir: &Path, secs: u32) -> Result<(PathBuf, PathBuf, u16), String> {
    let port = free_udp_port()?;
    let (pcap, keylog) = (dir.join("lab.pcap"), dir.join("lab.keylog"));
    let mut dump = Command::new("tcpdump")
        .args(["-i", "lo", "-U", "-w"])
        .arg(&pcap)
        .args(["udp", "port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start tcpdump: {e}"))?;
    // tcpdump has no readiness signal on stdout with -w: wait for its file header.
    let ready = wait_until(Duration::from_secs(5), || pcap.metadata().is_ok_and(|m| m.len() >= 24));
    std::thread::sleep(Duration::from_millis(300));
    let lab = ready.then(|| {
        Command::new(HYSTALL)
            .args(["lab", "--duration", &secs.to_string(), "--uploads", "4", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--keylog")
            .arg(&keylog)
            .stdout(Stdio::null())
            .status()
    });
    std::thread::sleep(Duration::from_millis(300));
    stop(&mut dump);
    match lab {
        None => Err("tcpdump wrote no capture header within 5 s".into()),
        Some(Err(e)) => Err(format!("cannot run hystall lab: {e}")),
        Some(Ok(s)) if !s.success() => Err(format!("hystall lab failed ({s})")),
        Some(Ok(_)) => Ok((pcap, keylog, port)),
    }
}

fn compare(pcap: &Path, keylog: &Path, port: u16, secs: u32) {
    let size = pcap.metadata().map_or(0, |m| m.len());
    println!("pcap_vs_tshark: lab {secs} s, 4 uploads: capture {:.1} MB", size as f64 / 1e6);
    let decode_as = format!("udp.port=={port},quic");
    let f = pcap.to_string_lossy().into_owned();
    let k = keylog.to_string_lossy().into_owned();
    let tls_keylog = format!("tls.keylog_file:{k}");
    let pairs: [(&str, Vec<&str>, Vec<&str>); 2] = [
        ("no keys", vec!["pcap", &f], vec!["-r", &f, "-d", &decode_as, "-q", "-z", "conv,udp"]),
        (
            "keys",
            vec!["pcap", &f, "--keylog", &k],
            vec!["-r", &f, "-d", &decode_as, "-o", &tls_keylog, "-T", "fields", "-e", "quic.frame_type"],
        ),
    ];
    println!("| mode | hystall | tshark | tshark/hystall | hystall peak RSS | tshark peak RSS |");
    println!("|---|---|---|---|---|---|");
    for (mode, ours, theirs) in pairs {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            a.push(timed(HYSTALL, &ours));
            b.push(timed(TSHARK, &theirs));
        }
        let (Some(a), Some(b)) = (summary(&a), summary(&b)) else {
            println!("| {mode} | a run failed: {} / {} | | | | |", error(&a), error(&b));
            continue;
        };
        println!(
            "| {mode} | {:.3} s | {:.3} s | **{:.1}** | {:.1} MiB | {:.1} MiB |",
            a.wall.as_secs_f64(),
            b.wall.as_secs_f64(),
            b.wall.as_secs_f64() / a.wall.as_secs_f64(),
            a.rss_kib as f64 / 1024.0,
            b.rss_kib as f64 / 1024.0,
        );
    }
}

/// Median wall time and largest peak RSS of the runs, if all succeeded.
fn summary(runs: &[Result<Run, String>]) -> Option<Run> {
    let mut walls: Vec<Duration> = runs.iter().map(|r| r.as_ref().ok().map(|r| r.wall)).collect::<Option<_>>()?;
    walls.sort();
    let rss = runs.iter().filter_map(|r| r.as_ref().ok()).map(|r| r.rss_kib).max()?;
    Some(Run { wall: walls[walls.len() / 2], rss_kib: rss })
}

fn error(runs: &[Result<Run, String>]) -> String {
    runs.iter().find_map(|r| r.as_ref().err().cloned()).unwrap_or_else(|| "ok".into())
}

/// Runs `program args` with stdout discarded; its wall time and peak RSS.
fn timed(program: &str, args: &[&str]) -> Result<Run, String> {
    let started = Instant::now();
    let child = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with valid pointers to locals.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    if pid < 0 {
        return Err(format!("wait4 {program}: {}", std::io::Error::last_os_error()));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(format!("{program} failed (wait status {status})"));
    }
    Ok(Run { wall, rss_kib: usage.ru_maxrss })
}

/// Stops tcpdump with SIGINT so that it flushes its file, then reaps it.
fn stop(child: &mut Child) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    if !wait_until(Duration::from_secs(5), || child.try_wait().is_ok_and(|s| s.is_some())) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

fn free_udp_port() -> Result<u16, String> {
    let s = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("cannot bind a UDP socket: {e}"))?;
    s.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .any(|d| d.join(tool).is_file())
}
