//! Root only: real captures from tcpdump (and dumpcap, when installed) on loopback, read
//! back to exactly the datagrams we sent.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::super::{CaptureFormat, CaptureReader, L4, Record};

const DATAGRAMS: usize = 20;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Starts a capture tool and waits until it reports that it is listening.
fn start(program: &str, args: &[String], ready: &str) -> Child {
    let mut child = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let marker = ready.to_string();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && line.contains(&marker) {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        stop(&mut child);
        panic!("{program} did not start listening");
    }
    // The socket is bound; give the kernel filter a moment to attach.
    std::thread::sleep(Duration::from_millis(300));
    child
}

/// SIGINT, then wait (bounded) so the tool flushes and closes the file.
fn stop(child: &mut Child) {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends known datagrams to a fresh loopback port while `capture(port)` runs, then reads
/// the file back and checks it holds exactly those payloads, once each.
fn round_trip(name: &str, program: &str, ready: &str, file: &Path, args: impl Fn(u16) -> Vec<String>) -> CaptureFormat {
    let receiver = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let port = receiver.local_addr().expect("addr").port();
    let sender = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut child = start(program, &args(port), ready);
    let nonce = std::process::id();
    let sent: Vec<Vec<u8>> = (0..DATAGRAMS).map(|i| format!("hystall {name} {nonce} #{i}").into_bytes()).collect();
    for payload in &sent {
        sender.send_to(payload, ("127.0.0.1", port)).expect("send");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    stop(&mut child);

    let reader = CaptureReader::open(file).expect("open capture");
    let format = reader.format();
    let mut got = Vec::new();
    for record in reader {
        let Record::Packet(p) = record.expect("read capture") else { continue };
        if let (L4::Udp { payload, truncated, .. }, true) = (p.l4, p.dst.port() == port) {
            assert!(!truncated);
            assert!(p.ts > 1_600_000_000_000_000_000, "a real timestamp");
            got.push(payload);
        }
    }
    assert_eq!(got, sent, "{name}: the capture holds exactly the datagrams sent, in order");
    format
}

/// A file in a directory of its own test; the capture tools run as root (`-Z root`).
fn scratch(test: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hystall-live-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

fn tcpdump_args(file: &Path, extra: &[&str]) -> impl Fn(u16) -> Vec<String> {
    let mut base: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    // Immediate mode: with TPACKET_V3 a short capture may otherwise sit unflushed in a block.
    base.extend(["-Z", "root", "--immediate-mode", "-U", "-w"].map(String::from));
    base.push(file.display().to_string());
    move |port| {
        let mut v = base.clone();
        v.extend(["udp", "port"].map(String::from));
        v.push(port.to_string());
        v
    }
}

#[test]
fn live_tcpdump_loopback_captures_read_back() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let f = scratch("tcpdump", "lo.pcap");
    let format = round_trip("lo", "/usr/bin/tcpdump", "listening on", &f, tcpdump_args(&f, &["-i", "lo"]));
    assert!(matches!(format, CaptureFormat::Pcap { nanos: false, .. }));

    let f = scratch("tcpdump", "sll2.pcap");
    let args = tcpdump_args(&f, &["-i", "any", "-y", "LINUX_SLL2"]);
    round_trip("sll2", "/usr/bin/tcpdump", "listening on", &f, args);

    let f = scratch("tcpdump", "nano.pcap");
    let args = tcpdump_args(&f, &["-i", "lo", "--time-stamp-precision", "nano"]);
    let format = round_trip("nano", "/usr/bin/tcpdump", "listening on", &f, args);
    assert!(matches!(format, CaptureFormat::Pcap { nanos: true, .. }));
    let _ = std::fs::remove_dir_all(f.parent().expect("dir"));
}

#[test]
fn live_dumpcap_pcapng_reads_back() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let Some(dumpcap) = ["/usr/bin/dumpcap", "/usr/sbin/dumpcap"].into_iter().find(|p| Path::new(p).exists()) else {
        println!("skipped: dumpcap not installed");
        return;
    };
    let f = scratch("dumpcap", "lo.pcapng");
    let file = f.display().to_string();
    let args = move |port: u16| -> Vec<String> {
        ["-q", "-i", "lo", "-f", &format!("udp port {port}"), "-w", &file].map(String::from).to_vec()
    };
    // dumpcap -q still reports "Capturing on" on stderr.
    let format = round_trip("dumpcap", dumpcap, "Capturing on", &f, args);
    assert_eq!(format, CaptureFormat::PcapNg);
    let _ = std::fs::remove_dir_all(f.parent().expect("dir"));
}
