//! Root end-to-end tests of `--decrypt` against a real Hysteria2 (sing-box
//! 1.14.4, a stripped Go binary): the server's TLS secrets read by the uprobe,
//! the suspect connection's frames read live, and the verdict `confirmed`
//! from them; nothing for healthy connections; `--keylog-out` writes a key
//! log that decrypts a capture of the same run; the built-in (Rust) lab says
//! it cannot be decrypted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::singbox::{self, Behaviour, Options, SingBox, TcpTarget};
use common::{Proc, bin, root_or_skip};
use serde_json::Value;

const TIMEOUT: &str = "3";

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hystall-decrypt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    // tcpdump drops privileges to its own user: it must be able to write here.
    let _ = Command::new("chmod").arg("777").arg(&d).status();
    d
}

/// `watch --decrypt` on sing-box at `port`, with `extra` arguments.
fn watch(port: u16, extra: &[&str]) -> Proc {
    let p = port.to_string();
    let mut args = vec!["watch", "--json", "--comm", "sing-box", "--port", &p, "--stall-timeout", TIMEOUT, "--decrypt"];
    args.extend_from_slice(extra);
    let mut w = Proc::spawn(&args);
    w.wait_event("watch_started", Duration::from_secs(15));
    w
}

/// Starts the sing-box server alone and waits until `w` probes it: the secrets
/// of a handshake are read only if the uprobe is there before it (clients are
/// added after).
fn start_server(w: &mut Proc, port: u16) -> SingBox {
    let sb = SingBox::start(Options { server_port: Some(port), no_client: true, ..Default::default() }).expect("sing-box");
    let pid = sb.server_pid();
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(e) = w.next_json(deadline) {
        if e["event"] == "decrypt_changed"
            && e["processes"].as_array().is_some_and(|ps| ps.iter().any(|p| p["pid"] == pid && !p["functions"].as_array().unwrap().is_empty()))
        {
            return sb;
        }
    }
    panic!("the sing-box server (pid {pid}) was not probed within 10 s: {:?}", w.seen);
}

/// Uploads from client `i` of `sb` into `target`, `n` at once.
fn uploads(sb: &SingBox, i: usize, target: &TcpTarget, n: usize, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<u64>> {
    (0..n).map(|_| singbox::upload_via(sb.socks_of(i), target.addr(), stop.clone())).collect()
}

/// A UDP echo through client `i`'s tunnel every half second (QUIC DATAGRAM
/// frames: they flow on a starved connection, as a real client's DNS does);
/// returns how many came back.
fn keep_alive(sb: &SingBox, i: usize, stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let (socks, echo, stop) = (sb.socks_of(i), sb.udp_echo.addr(), stop.clone());
    std::thread::spawn(move || {
        let mut ok = 0;
        while !stop.load(Ordering::SeqCst) {
            ok += u64::from(singbox::udp_echo_via(socks, echo, b"alive", Duration::from_millis(500)));
            std::thread::sleep(Duration::from_millis(500));
        }
        ok
    })
}

/// tcpdump writing a file; stopped (SIGINT, flushed) on drop.
struct Tcpdump(Child);

impl Tcpdump {
    fn start(file: &Path, filter: &str) -> Tcpdump {
        let child = Command::new("tcpdump")
            .args(["-i", "lo", "--immediate-mode", "-U", "-s", "0", "-B", "131072", "-w"])
            .arg(file)
            .arg(filter)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tcpdump (Debian package tcpdump; `cargo xtask setup` installs it)");
        std::thread::sleep(Duration::from_millis(1500));
        Tcpdump(child)
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

#[test]
fn four_stalled_uploads_are_confirmed_from_live_frames() {
    let test = "four_stalled_uploads_are_confirmed_from_live_frames";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    let dir = tmpdir("stall");
    let keys = dir.join("keys.log");
    let port = 23100;
    let mut w = watch(port, &["--keylog-out", keys.to_str().unwrap()]);
    let target = TcpTarget::spawn(Behaviour::Stall).expect("target");
    let capture = dir.join("run.pcap");
    let dump = Tcpdump::start(&capture, &format!("udp port {port} or tcp port {}", target.addr().port()));
    let mut sb = start_server(&mut w, port);
    let client = sb.add_client().expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let ups = uploads(&sb, client, &target, 4, &stop);
    let alive = keep_alive(&sb, client, &stop);
    let mut events: Vec<Value> = w.seen.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
    events.extend(w.collect_until(Instant::now() + Duration::from_secs(12)));
    // The truth, from the client: a new request through its tunnel fails.
    let truth = singbox::probe_new_stream(sb.socks_of(client), sb.echo.addr(), Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    let datagrams = alive.join().unwrap();
    assert!(!truth, "the client is starved: a new request must fail");
    assert!(datagrams > 0, "datagrams through the tunnel still flowed");
    drop(dump);
    for u in ups {
        let _ = u.join();
    }
    drop(sb);
    for e in &events {
        eprintln!("{e}");
    }
    let probed = named(&events, "decrypt_changed");
    assert!(
        probed.iter().any(|e| e["processes"].as_array().unwrap().iter().any(|p| p["functions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "crypto/tls.(*Config).writeKeyLog"))),
        "the server's key-log function is probed: {probed:#?}"
    );
    let starved = named(&events, "quic_starved");
    let confirmed: Vec<&&Value> = starved.iter().filter(|e| e["confidence"] == "confirmed").collect();
    assert!(!confirmed.is_empty(), "confirmed from frames: {starved:#?}");
    let f = &confirmed[0]["evidence"]["frames"];
    assert!(f["data_blocked_limit"].as_u64().is_some_and(|l| l > 0) || f["max_data"].as_u64().unwrap_or(0) > 0, "{f}");
    // The key log: 0600, and it decrypts a capture of the same run.
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&keys).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&keys).unwrap();
    assert!(text.lines().any(|l| l.starts_with("CLIENT_TRAFFIC_SECRET_0 ")), "{text}");
    let out = Command::new(bin())
        .args(["pcap", "--json", "--stall-timeout", TIMEOUT, "--keylog"])
        .arg(&keys)
        .arg(&capture)
        .output()
        .expect("hystall pcap");
    let summary: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["event"] == "pcap_summary")
        .expect("pcap_summary");
    let conns = summary["conns"].as_array().unwrap();
    assert!(
        conns.iter().any(|c| c["decrypt"]["secrets_found"] == true && c["starved"]["confidence"] == "confirmed"),
        "the key log decrypts the capture: {summary:#}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
