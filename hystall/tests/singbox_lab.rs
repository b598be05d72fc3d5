//! Tests of the sing-box lab harness (tests/common/singbox.rs) itself: a real
//! Hysteria2 server and client on loopback relay TCP and UDP, and reproduce the
//! starvation of DESIGN.md §2 (four uploads into a never-reading target starve the
//! QUIC connection, one does not, UDP keeps working). No root needed.
//!
//! The tests hold `serial()`: their timing must not depend on each other's load.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::singbox::{
    Behaviour, Options, SingBox, TcpTarget, UdpEcho, connect_via, probe_new_stream, serial, sing_box_or_skip,
    udp_echo_via, udp_sockets_of, upload_via_counting, wait_starved,
};

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const PROBE_EVERY: Duration = Duration::from_millis(500);
const UDP_TIMEOUT: Duration = Duration::from_secs(3);

fn start(opts: Options) -> SingBox {
    let t = Instant::now();
    let lab = SingBox::start(opts).unwrap_or_else(|e| panic!("sing-box lab does not start: {e:#}"));
    eprintln!("lab ready in {:?}: server udp/{}, socks {}", t.elapsed(), lab.server_port, lab.socks());
    lab
}

struct Uploads {
    stop: Arc<AtomicBool>,
    progress: Vec<Arc<AtomicU64>>,
    threads: Vec<JoinHandle<u64>>,
}

impl Uploads {
    fn start(lab: &SingBox, target: &TcpTarget, n: usize) -> Uploads {
        let stop = Arc::new(AtomicBool::new(false));
        let progress: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::default()).collect();
        let threads =
            progress.iter().map(|p| upload_via_counting(lab.socks(), target.addr(), stop.clone(), p.clone())).collect();
        Uploads { stop, progress, threads }
    }

    fn written(&self) -> Vec<u64> {
        self.progress.iter().map(|p| p.load(Ordering::Relaxed)).collect()
    }

    fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().map(|t| t.join().unwrap_or(0)).collect()
    }
}

fn mib(bytes: &[u64]) -> String {
    let parts: Vec<String> = bytes.iter().map(|b| format!("{:.1}", *b as f64 / (1 << 20) as f64)).collect();
    format!("[{}] MiB", parts.join(", "))
}

#[test]
fn healthy_relay_works() {
    if !sing_box_or_skip("healthy_relay_works") {
        return;
    }
    let _g = serial();
    let lab = start(Options::default());
    assert!(probe_new_stream(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT), "probe failed\n{}", lab.logs());
    assert!(
        udp_echo_via(lab.socks(), lab.udp_echo.addr(), b"hystall udp probe", UDP_TIMEOUT),
        "UDP echo through the proxy failed\n{}",
        lab.logs()
    );
    assert!(lab.udp_echo.echoed() >= 1);
    // Many sequential requests, each its own QUIC stream.
    for i in 0..20 {
        assert!(probe_new_stream(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT), "probe {i} failed\n{}", lab.logs());
    }
}

#[test]
fn four_uploads_into_a_stall_target_starve_the_connection() {
    let test = "four_uploads_into_a_stall_target_starve_the_connection";
    if !sing_box_or_skip(test) {
        return;
    }
    let _g = serial();
    let lab = start(Options::default());
    let stall = TcpTarget::spawn(Behaviour::Stall).expect("stall target");

    let t0 = Instant::now();
    let uploads = Uploads::start(&lab, &stall, 4);
    let starved = wait_starved(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT, PROBE_EVERY, 2, Duration::from_secs(15));
    eprintln!(
        "{test}: first failing probe started {starved:?} after the uploads; written so far {}; stall target accepted {}",
        mib(&uploads.written()),
        stall.accepted()
    );
    let Some(_) = starved else {
        let written = uploads.stop();
        panic!("new requests still work 15 s after 4 uploads (written {})\n{}", mib(&written), lab.logs());
    };
    assert_eq!(stall.accepted(), 4, "each upload reaches the stall target");

    // DATAGRAM frames are not flow-controlled: UDP still goes through.
    let t = Instant::now();
    let udp = udp_echo_via(lab.socks(), lab.udp_echo.addr(), b"hystall udp probe", UDP_TIMEOUT);
    eprintln!("{test}: UDP echo while starved: {udp} in {:?}", t.elapsed());
    assert!(udp, "UDP echo through the starved connection failed\n{}", lab.logs());
    // Still starved (not a transient hiccup).
    assert!(!probe_new_stream(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT), "connection recovered by itself");

    // Closing the target's sockets ends the copies; the connection lives again.
    let t = Instant::now();
    drop(stall);
    let mut recovered = None;
    while t.elapsed() < Duration::from_secs(10) {
        if probe_new_stream(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT) {
            recovered = Some(t.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let written = uploads.stop();
    eprintln!(
        "{test}: after closing the stall target, new requests work again after {recovered:?}; \
         uploads wrote {} in {:?}",
        mib(&written),
        t0.elapsed()
    );
    assert!(recovered.is_some(), "no recovery within 10 s of closing the stall target\n{}", lab.logs());
}

#[test]
fn one_upload_does_not_starve() {
    let test = "one_upload_does_not_starve";
    if !sing_box_or_skip(test) {
        return;
    }
    let _g = serial();
    let lab = start(Options::default());
    let stall = TcpTarget::spawn(Behaviour::Stall).expect("stall target");

    let uploads = Uploads::start(&lab, &stall, 1);
    let mut at_5s = None;
    let start = Instant::now();
    let mut failures = Vec::new();
    while start.elapsed() < Duration::from_secs(10) {
        let at = start.elapsed();
        if at_5s.is_none() && at >= Duration::from_secs(5) {
            at_5s = Some(uploads.written());
        }
        if !probe_new_stream(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT) {
            failures.push(at);
        }
        std::thread::sleep(PROBE_EVERY.saturating_sub(start.elapsed() - at));
    }
    let at_10s = uploads.written();
    let udp = udp_echo_via(lab.socks(), lab.udp_echo.addr(), b"hystall udp probe", UDP_TIMEOUT);
    let written = uploads.stop();
    eprintln!(
        "{test}: written at 5 s {}, at 10 s {}, in all {}; failed probes at {failures:?}; UDP {udp}",
        mib(&at_5s.unwrap_or_default()),
        mib(&at_10s),
        mib(&written)
    );
    assert_eq!(stall.accepted(), 1);
    assert!(failures.is_empty(), "new requests failed at {failures:?} with one stalled upload\n{}", lab.logs());
    assert!(udp, "UDP echo failed\n{}", lab.logs());
}

#[test]
fn salamander_obfs_relays() {
    if !sing_box_or_skip("salamander_obfs_relays") {
        return;
    }
    let _g = serial();
    let lab = start(Options { obfs: Some("hystall-salamander".into()), ..Options::default() });
    assert!(probe_new_stream(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT), "probe failed\n{}", lab.logs());
    assert!(udp_echo_via(lab.socks(), lab.udp_echo.addr(), b"salamander", UDP_TIMEOUT), "UDP failed\n{}", lab.logs());
}

/// Port hopping over a one-port "range" (the server's own port): no DNAT needed,
/// and the client still opens a new UDP socket every hop interval.
#[test]
fn port_hopping_client_relays_across_hops() {
    let test = "port_hopping_client_relays_across_hops";
    if !sing_box_or_skip(test) {
        return;
    }
    let _g = serial();
    let port = free_udp_port();
    let lab = start(Options {
        server_port: Some(port),
        server_ports: Some(format!("{port}:{port}")),
        hop_interval: Some("5s".into()),
        ..Options::default()
    });
    let client = lab.client_pid().expect("client");
    let mut local_ports = BTreeSet::new();
    let start = Instant::now();
    let mut failures = Vec::new();
    while start.elapsed() < Duration::from_secs(11) {
        let at = start.elapsed();
        if !probe_new_stream(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT) {
            failures.push(at);
        }
        local_ports.extend(udp_sockets_of(client).iter().filter(|(_, r)| r.port() == port).map(|(l, _)| l.port()));
        std::thread::sleep(PROBE_EVERY.saturating_sub(start.elapsed() - at));
    }
    eprintln!("{test}: the client's UDP ports towards udp/{port} over 11 s: {local_ports:?}");
    assert!(failures.is_empty(), "probes failed at {failures:?} across hops\n{}", lab.logs());
    assert!(local_ports.len() >= 2, "no hop seen: {local_ports:?}");
    assert!(udp_echo_via(lab.socks(), lab.udp_echo.addr(), b"hop", UDP_TIMEOUT), "UDP failed\n{}", lab.logs());
}

/// The server's window options reach quic-go: with a 4 MiB connection window a
/// single stalled upload is enough to starve the connection.
#[test]
fn small_connection_window_lets_one_upload_starve() {
    let test = "small_connection_window_lets_one_upload_starve";
    if !sing_box_or_skip(test) {
        return;
    }
    let _g = serial();
    let lab = start(Options { connection_receive_window: Some(4 << 20), ..Options::default() });
    let stall = TcpTarget::spawn(Behaviour::Stall).expect("stall target");
    let uploads = Uploads::start(&lab, &stall, 1);
    let starved = wait_starved(lab.socks(), lab.echo.addr(), PROBE_TIMEOUT, PROBE_EVERY, 2, Duration::from_secs(10));
    drop(stall);
    let written = uploads.stop();
    eprintln!("{test}: starved after {starved:?}; written {}", mib(&written));
    assert!(starved.is_some(), "one upload did not starve a 4 MiB connection window\n{}", lab.logs());
}

/// The targets on their own (no proxy): each behaves as named.
#[test]
fn targets_behave_as_named() {
    use std::io::{Read, Write};
    let _g = serial();
    let chunk = vec![1u8; 64 * 1024];
    let pump = |t: &TcpTarget, secs: f64| -> (u64, bool) {
        let mut s = std::net::TcpStream::connect(t.addr()).expect("connect");
        s.set_write_timeout(Some(Duration::from_millis(100))).unwrap();
        let (start, mut sent, mut closed) = (Instant::now(), 0u64, false);
        while start.elapsed().as_secs_f64() < secs {
            match s.write(&chunk) {
                Ok(n) => sent += n as u64,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        (sent, closed)
    };
    let fast = TcpTarget::spawn(Behaviour::Fast).unwrap();
    let (sent, _) = pump(&fast, 0.5);
    std::thread::sleep(Duration::from_millis(200));
    assert!(fast.received() > 1 << 20 && fast.received() <= sent, "fast read {} of {sent}", fast.received());

    let slow = TcpTarget::spawn(Behaviour::Slow).unwrap();
    pump(&slow, 2.0);
    let r = slow.received();
    // 16 KiB per 100 ms: about 320 KiB in 2 s.
    assert!((128 << 10..=480 << 10).contains(&r), "slow read {r} bytes in 2 s");

    let upclose = TcpTarget::spawn(Behaviour::Upclose).unwrap();
    let (_, closed) = pump(&upclose, 3.0);
    assert!(closed, "upclose target did not close");
    assert_eq!(upclose.received(), 64 << 10);

    let stall = TcpTarget::spawn(Behaviour::Stall).unwrap();
    let (sent, closed) = pump(&stall, 1.0);
    assert!(!closed && stall.received() == 0 && stall.accepted() == 1, "stall: sent {sent}, closed {closed}");

    let echo = TcpTarget::spawn(Behaviour::Echo).unwrap();
    let mut s = std::net::TcpStream::connect(echo.addr()).unwrap();
    s.write_all(b"0123456789abcdef").unwrap();
    let mut back = [0u8; 16];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"0123456789abcdef");

    let udp = UdpEcho::spawn().unwrap();
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    u.send_to(b"ping", udp.addr()).unwrap();
    let mut buf = [0u8; 16];
    let (n, _) = u.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"ping");

    // connect_via fails cleanly when nothing listens.
    let nothing = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert!(connect_via(nothing, echo.addr()).is_err());
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
