//! One server, two clients side by side (protocols_e2e.rs, shoes_e2e.rs):
//! client 0 uploads into a never-reading target until its connection starves,
//! client 1 four streams into a target that reads. The truth comes from each
//! client's own tunnel: a new request fails through client 0, works through
//! client 1, and client 0 stays starved while the watch runs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Proc;
use super::singbox::{
    Behaviour, SingBox, TcpTarget, probe_new_stream, udp_echo_via, udp_sockets_of, upload_via, wait_starved,
};

pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// The client-side addresses of client `i`'s QUIC connection to the server.
pub fn quic_addrs(lab: &SingBox, i: usize) -> BTreeSet<String> {
    udp_sockets_of(lab.client_pid_of(i))
        .into_iter()
        .filter(|(_, remote)| remote.port() == lab.server_port)
        .map(|(local, _)| local.to_string())
        .collect()
}

/// A running scenario, its events read; `finish` ends it.
pub struct SideBySide {
    /// When the uploads began.
    pub began: jiff::Timestamp,
    /// Every event of the watch after `watch_started`, for `watch_secs`.
    pub events: Vec<Value>,
    /// The QUIC client addresses of the starved and of the healthy client.
    pub starved_client: BTreeSet<String>,
    pub healthy_client: BTreeSet<String>,
    stall: TcpTarget,
    _fast: TcpTarget,
    stop: Arc<AtomicBool>,
    ups: Vec<JoinHandle<u64>>,
}

/// Starts the uploads (`stalled` into the never-reading target) under the
/// watch `w`, waits until client 0 is starved (at most `starve_within`), then
/// reads the watch's events for `watch_secs`. `label` prefixes the messages.
pub fn start(
    test: &str,
    label: &str,
    lab: &SingBox,
    w: &mut Proc,
    stalled: usize,
    starve_within: Duration,
    watch_secs: u64,
) -> SideBySide {
    let stall = TcpTarget::spawn(Behaviour::Stall).expect("stall target");
    let fast = TcpTarget::spawn(Behaviour::Fast).expect("fast target");
    let stop = Arc::new(AtomicBool::new(false));
    let began = jiff::Timestamp::now();
    let mut ups: Vec<_> = (0..stalled).map(|_| upload_via(lab.socks_of(0), stall.addr(), stop.clone())).collect();
    ups.extend((0..4).map(|_| upload_via(lab.socks_of(1), fast.addr(), stop.clone())));

    // The truth, from each client's own tunnel.
    let starved_after =
        wait_starved(lab.socks_of(0), lab.echo.addr(), PROBE_TIMEOUT, Duration::from_millis(500), 2, starve_within);
    assert!(starved_after.is_some(), "{label}{stalled} stalled uploads did not starve client 0\n{}", lab.logs());
    assert!(probe_new_stream(lab.socks_of(1), lab.echo.addr(), PROBE_TIMEOUT), "{label}client 1 must be healthy");
    let udp = udp_echo_via(lab.socks_of(0), lab.udp_echo.addr(), b"hystall udp probe", Duration::from_secs(3));
    eprintln!(
        "{test}: server pid {} port {}, clients {} {}, stall {}, fast {}; new requests through client 0 fail \
         from +{starved_after:?}; UDP through it: {udp}",
        lab.server_pid(),
        lab.server_port,
        lab.client_pid_of(0),
        lab.client_pid_of(1),
        stall.addr(),
        fast.addr(),
    );

    let events = w.collect_until(Instant::now() + Duration::from_secs(watch_secs));
    let starved_client = quic_addrs(lab, 0);
    let healthy_client = quic_addrs(lab, 1);
    assert!(!starved_client.is_empty() && !healthy_client.is_empty(), "{label}the clients' QUIC sockets");
    // Still starved at the end (the truth held while we watched).
    assert!(!probe_new_stream(lab.socks_of(0), lab.echo.addr(), PROBE_TIMEOUT), "{label}recovered by itself");
    SideBySide { began, events, starved_client, healthy_client, stall, _fast: fast, stop, ups }
}

impl SideBySide {
    /// Stops the uploads and the watch (which must exit 0), then checks that
    /// no target of the healthy client stalled: every stalled socket goes to
    /// the never-reading target.
    pub fn finish(self, label: &str, w: &mut Proc) -> Vec<Value> {
        let stall_addr = self.stall.addr().to_string();
        self.stop.store(true, Ordering::SeqCst);
        drop(self.stall);
        for u in self.ups {
            let _ = u.join();
        }
        assert_eq!(w.stop(), Some(0));
        for e in named(&self.events, "socket_stalled") {
            assert_eq!(e["remote"].as_str(), Some(stall_addr.as_str()), "{label}{e}");
        }
        self.events
    }

    /// The `quic_starved` events on the connection of `client`.
    pub fn flags_on(&self, client: &BTreeSet<String>) -> Vec<Value> {
        named(&self.events, "quic_starved")
            .into_iter()
            .filter(|e| e["client"].as_str().is_some_and(|c| client.contains(c)))
            .cloned()
            .collect()
    }
}
