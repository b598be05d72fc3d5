//! Root test of the kernel flow map at its limit: more UDP flows to a watched
//! port than the map holds (65,536). The LRU map makes room by evicting the
//! oldest flows; hystall must count that and show it (the metrics'
//! `hystall_kernel_map_evicted_total`, the `top` header's "evicted"), and the
//! classifier must go on counting new flows afterwards.

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

#[test]
fn a_full_flow_map_evicts_counts_and_shows_it_and_new_flows_are_still_counted() {
    let test = "a_full_flow_map_evicts_counts_and_shows_it_and_new_flows_are_still_counted";
    let Some(_g) = root_or_skip(test) else { return };
    let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let to = server.local_addr().unwrap();
    let port = to.port().to_string();
    let port_m = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("127.0.0.1:{port_m}");
    let pid = std::process::id().to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--pid", &pid, "--port", &port, "--metrics", &metrics]);
    w.wait_event("watch_started", Duration::from_secs(30));

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
