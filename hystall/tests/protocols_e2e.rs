//! Root end-to-end tests of the other QUIC proxy protocols sing-box serves:
//! TUIC (v5) and Hysteria (v1), with their default windows. Each runs a
//! starved client (uploads into a never-reading target) beside a healthy one
//! (uploads into a target that reads) on one server: the starved client's
//! connection must be flagged with its own targets, the healthy one never.
//! The truth for each is a new request through its own tunnel.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::singbox::{
    self, Behaviour, Options, Protocol, SingBox, TcpTarget, probe_new_stream, udp_echo_via, udp_sockets_of, upload_via,
    wait_starved,
};
use common::{Proc, root_or_skip};
use serde_json::Value;

const TIMEOUT: u64 = 3;
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// The client-side addresses of client `i`'s QUIC connection to the server.
fn quic_addrs(lab: &SingBox, i: usize) -> BTreeSet<String> {
    udp_sockets_of(lab.client_pid_of(i))
        .into_iter()
        .filter(|(_, remote)| remote.port() == lab.server_port)
        .map(|(local, _)| local.to_string())
        .collect()
}

/// One server of `protocol`, two clients: client 0 uploads `stalled` streams
/// into a never-reading target, client 1 four into a target that reads.
fn starved_beside_healthy(test: &str, protocol: Protocol, stalled: usize) {
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    let t = TIMEOUT.to_string();
    let lab = SingBox::start(Options { protocol, clients: 2, ..Default::default() }).expect("sing-box");
    // This server only (other sing-box processes on the machine are not ours);
    // its port comes from its config (sing-box -c), not from --port.
    let pid = lab.server_pid().to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--pid", &pid, "--stall-timeout", &t]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    assert!(started["quic"].to_string().contains(&lab.server_port.to_string()), "{protocol:?}: {started}");

    let stall = TcpTarget::spawn(Behaviour::Stall).expect("stall target");
    let fast = TcpTarget::spawn(Behaviour::Fast).expect("fast target");
    let stop = Arc::new(AtomicBool::new(false));
    let mut ups: Vec<_> = (0..stalled).map(|_| upload_via(lab.socks_of(0), stall.addr(), stop.clone())).collect();
    ups.extend((0..4).map(|_| upload_via(lab.socks_of(1), fast.addr(), stop.clone())));

    // The truth, from each client's own tunnel.
    let starved_after = wait_starved(
        lab.socks_of(0),
        lab.echo.addr(),
        PROBE_TIMEOUT,
        Duration::from_millis(500),
        2,
        Duration::from_secs(20),
    );
    assert!(starved_after.is_some(), "{protocol:?}: {stalled} stalled uploads did not starve client 0\n{}", lab.logs());
    assert!(
        probe_new_stream(lab.socks_of(1), lab.echo.addr(), PROBE_TIMEOUT),
        "{protocol:?}: client 1 must be healthy"
    );
    let udp = udp_echo_via(lab.socks_of(0), lab.udp_echo.addr(), b"hystall udp probe", Duration::from_secs(3));
    eprintln!("{test}: starved after {starved_after:?}; UDP through the starved client: {udp}");
    eprintln!(
        "{test}: server pid {} port {}, clients {} {}, stall {}, fast {}, echo {}, udp echo {}",
        lab.server_pid(),
        lab.server_port,
        lab.client_pid_of(0),
        lab.client_pid_of(1),
        stall.addr(),
        fast.addr(),
        lab.echo.addr(),
        lab.udp_echo.addr()
    );

    let events = w.collect_until(Instant::now() + Duration::from_secs(TIMEOUT + 6));
    let starved_client = quic_addrs(&lab, 0);
    let healthy_client = quic_addrs(&lab, 1);
    assert!(!starved_client.is_empty() && !healthy_client.is_empty(), "{protocol:?}: the clients' QUIC sockets");
    // Still starved at the end (the truth held while we watched).
    assert!(!probe_new_stream(lab.socks_of(0), lab.echo.addr(), PROBE_TIMEOUT), "{protocol:?}: recovered by itself");
    let stall_addr = stall.addr().to_string();
    stop.store(true, Ordering::SeqCst);
    drop(stall);
    for u in ups {
        let _ = u.join();
    }
    assert_eq!(w.stop(), Some(0));

    let stalled_cookies: BTreeSet<u64> =
        named(&events, "socket_stalled").iter().filter_map(|e| e["cookie"].as_u64()).collect();
    let flagged: Vec<&Value> = named(&events, "quic_starved");
    let on_starved: Vec<&&Value> =
        flagged.iter().filter(|e| e["client"].as_str().is_some_and(|c| starved_client.contains(c))).collect();
    let on_healthy: Vec<&&Value> =
        flagged.iter().filter(|e| e["client"].as_str().is_some_and(|c| healthy_client.contains(c))).collect();
    assert!(on_healthy.is_empty(), "{protocol:?}: the healthy client was flagged: {on_healthy:#?}");
    let last = on_starved.last().unwrap_or_else(|| panic!("{protocol:?}: starved client not flagged: {events:#?}"));
    assert!(last["confidence"] == "likely" || last["confidence"] == "confirmed", "{last}");
    let blamed: BTreeSet<u64> = last["stalled"].as_array().unwrap().iter().filter_map(Value::as_u64).collect();
    assert!(!blamed.is_empty() && blamed.is_subset(&stalled_cookies), "blamed {blamed:?}, stalled {stalled_cookies:?}");
    // No target of the healthy client among them: every stalled socket goes
    // to the never-reading target.
    for e in named(&events, "socket_stalled") {
        assert_eq!(e["remote"].as_str(), Some(stall_addr.as_str()), "{protocol:?}: {e}");
    }
}

#[test]
fn tuic_four_stalled_uploads_are_flagged_and_the_healthy_client_is_not() {
    starved_beside_healthy("tuic_four_stalled_uploads_are_flagged_and_the_healthy_client_is_not", Protocol::Tuic, 4);
}

#[test]
fn hysteria_v1_stalled_uploads_are_flagged_and_the_healthy_client_is_not() {
    starved_beside_healthy(
        "hysteria_v1_stalled_uploads_are_flagged_and_the_healthy_client_is_not",
        Protocol::Hysteria,
        5,
    );
}
