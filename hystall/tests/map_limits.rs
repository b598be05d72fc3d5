//! Root tests of the kernel's maps and rings at their limits.
//! - The flow map: more UDP flows to a watched port than it holds (65,536).
//!   The LRU map makes room by evicting the oldest flows; hystall must count
//!   that and show it (the metrics' `hystall_kernel_map_evicted_total`, the
//!   `top` header's "evicted"), and the classifier must go on counting new
//!   flows afterwards.
//! - A ring: user space stopped while new flows' header samples pour in. The
//!   ring fills, the classifier counts what it could not write
//!   (`hystall_kernel_events_lost_total{ring="samples"}`, the `top` header's
//!   "lost"), and once user space reads again new samples arrive.

mod common;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::scrape::scrape;
use common::{Proc, root_or_skip};

/// One datagram from each of `n` client 5-tuples: every port from 10,000 up
/// of loopback source addresses 127.0.1.`first_ip`, 127.0.1.`first_ip`+1, …
/// (explicit ports: ephemeral ones would be reused as soon as a socket closes).
fn flood(to: SocketAddr, n: usize, first_ip: u8) -> usize {
    let mut sent = 0;
    for ip in first_ip..=u8::MAX {
        for port in 10_000..=u16::MAX {
            if sent >= n {
                return sent;
            }
            let Ok(s) = UdpSocket::bind(SocketAddr::from((Ipv4Addr::new(127, 0, 1, ip), port))) else { continue };
            if s.send_to(&[0x40, 1, 2, 3, 4, 5, 6, 7], to).is_ok() {
                sent += 1;
            }
        }
    }
    sent
}

fn metric(port: u16, name: &str) -> Option<f64> {
    scrape(port).get(name).copied()
}

fn wait_metric(port: u16, name: &str, within: Duration, ok: impl Fn(f64) -> bool) -> Option<f64> {
    let deadline = Instant::now() + within;
    loop {
        let v = metric(port, name);
        if v.is_some_and(&ok) || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A UDP socket of this process, watched as a server port by `hystall watch`
/// with metrics: the socket (kept open), its address, the metrics port, the watcher.
fn watched_server() -> (UdpSocket, SocketAddr, u16, Proc) {
    let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let to = server.local_addr().unwrap();
    let port = to.port().to_string();
    let port_m = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("127.0.0.1:{port_m}");
    let pid = std::process::id().to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--pid", &pid, "--port", &port, "--metrics", &metrics]);
    w.wait_event("watch_started", Duration::from_secs(30));
    (server, to, port_m, w)
}

#[test]
fn a_full_flow_map_evicts_counts_and_shows_it_and_new_flows_are_still_counted() {
    let test = "a_full_flow_map_evicts_counts_and_shows_it_and_new_flows_are_still_counted";
    let Some(_g) = root_or_skip(test) else { return };
    let (_server, to, port_m, mut w) = watched_server();

    // 40,000 flows, read by hystall; then 40,000 more: the map holds 65,536,
    // so about 14,000 of the first go.
    let a = flood(to, 40_000, 1);
    let counted = wait_metric(port_m, "hystall_kernel_udp_packets_total", Duration::from_secs(10), |v| v >= 40_000.0);
    assert!(counted.is_some_and(|v| v >= 40_000.0), "first flood: {a} sent, {counted:?} counted");
    std::thread::sleep(Duration::from_secs(2));
    let b = flood(to, 40_000, 101);
    let evicted = wait_metric(port_m, "hystall_kernel_map_evicted_total", Duration::from_secs(15), |v| v >= 10_000.0);
    let entries = metric(port_m, "hystall_kernel_map_entries{map=\"flows\"}");
    eprintln!("{test}: {a} + {b} flows sent, {evicted:?} evicted, {entries:?} in the map");
    assert!(evicted.is_some_and(|v| v >= 10_000.0), "evictions counted: {evicted:?}");

    // The classifier still counts: a new flow's packets show up.
    let before = metric(port_m, "hystall_kernel_udp_packets_total").unwrap_or(0.0);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..50 {
        s.send_to(b"after the flood", to).unwrap();
    }
    let after = wait_metric(port_m, "hystall_kernel_udp_packets_total", Duration::from_secs(5), |v| v >= before + 50.0);
    assert!(after.is_some_and(|v| v >= before + 50.0), "counted after the flood: {before} then {after:?}");
    assert!(w.stop().is_some(), "watch exits");
}

#[test]
fn a_full_ring_loses_samples_counts_them_and_new_samples_still_arrive() {
    let test = "a_full_ring_loses_samples_counts_them_and_new_samples_still_arrive";
    let Some(_g) = root_or_skip(test) else { return };
    let (_server, to, port_m, mut w) = watched_server();
    assert_eq!(metric(port_m, "hystall_kernel_events_lost_total{ring=\"samples\"}"), Some(0.0));

    // User space stopped: nothing drains the 1 MiB samples ring while 30,000
    // new flows each have their first packet sampled (~140 bytes each).
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(w.pid() as i32, libc::SIGSTOP) };
    let sent = flood(to, 30_000, 201);
    unsafe { libc::kill(w.pid() as i32, libc::SIGCONT) };
    let lost =
        wait_metric(port_m, "hystall_kernel_events_lost_total{ring=\"samples\"}", Duration::from_secs(10), |v| v > 0.0);
    eprintln!("{test}: {sent} new flows while stopped, {lost:?} samples lost");
    assert!(lost.is_some_and(|v| v >= 10_000.0), "lost samples counted: {lost:?}");

    // Samples arrive again: a new client whose short headers share their
    // first bytes has its connection ID read from them (only samples carry
    // header bytes; the counters alone would leave it grouped by 5-tuple).
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let me = s.local_addr().unwrap().to_string();
    for pn in 0..8u8 {
        s.send_to(&[0x40, 0xc1, 0xd2, 0xe3, 0xf4, 0xa5, 0xb6, 0xc7, 0xd8, pn, pn.wrapping_mul(37), !pn], to).unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut opened = None;
    while let Some(e) = w.next_json(deadline) {
        if e["event"] == "quic_conn_opened" && e["client"] == me.as_str() {
            opened = Some(e);
            break;
        }
    }
    let opened = opened.unwrap_or_else(|| panic!("no quic_conn_opened for {me} after the ring filled"));
    assert_eq!(opened["grouping"], "dcid", "its header samples were read: {opened}");
    assert!(opened["dcid"].as_str().is_some_and(|d| d.starts_with("c1d2e3f4")), "{opened}");
    assert!(w.stop().is_some(), "watch exits");
}
