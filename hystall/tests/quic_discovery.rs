//! Root end-to-end tests of QUIC server discovery without `--port`: a real
//! Hysteria2 server (sing-box) on a port in the kernel's ephemeral range is
//! found from the client Initials it receives when it runs before hystall
//! (its config gone); from its config at its exec when it starts after
//! hystall, and when it restarts on another port; from its
//! config when its connection was open before hystall started; in a
//! `--cgroup` it joins after hystall started; a
//! port-hopping range is taken from an nftables DNAT rule; and a run with no
//! QUIC server says so in `watch_started`.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::cgroups::Cgroups;
use common::nft::NftTable;
use common::singbox::{self, Behaviour, Options, SingBox, TcpTarget};
use common::{Proc, root_or_skip};
use serde_json::Value;

const TIMEOUT: &str = "3";

fn named<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

/// The kernel's ephemeral port range.
fn ephemeral() -> (u16, u16) {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").expect("port range");
    let v: Vec<u16> = s.split_whitespace().map(|p| p.parse().expect("port")).collect();
    (v[0], v[1])
}

/// A server with no client yet, on a free port of the ephemeral range. Its
/// config file is removed once it runs: hystall must find the port from the
/// traffic alone (a port the config names is a server port at once).
fn server() -> SingBox {
    let sb = SingBox::start(Options { no_client: true, ..Default::default() }).expect("sing-box server");
    let (lo, hi) = ephemeral();
    assert!((lo..=hi).contains(&sb.server_port), "the harness's free port {} is ephemeral", sb.server_port);
    std::fs::remove_file(sb.dir.join("server.json")).expect("the server's config");
    sb
}

/// A server with no client yet, its config kept: what a proxy started after
/// hystall is found from, at its exec.
fn server_with_config() -> SingBox {
    SingBox::start(Options { no_client: true, ..Default::default() }).expect("sing-box server")
}

fn ports_of(info: &Value) -> Vec<String> {
    info["ports"].as_array().expect("ports").iter().map(|p| p["port"].as_str().expect("port").to_owned()).collect()
}

fn candidates_of(info: &Value) -> Vec<u64> {
    info["candidates"].as_array().expect("candidates").iter().filter_map(Value::as_u64).collect()
}

/// Waits for a `quic_ports_changed` that satisfies `ok`; every event read
/// on the way goes to `log`.
fn wait_ports(w: &mut Proc, log: &mut Vec<Value>, within: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    while let Some(v) = w.next_json(deadline) {
        log.push(v.clone());
        if v["event"] == "quic_ports_changed" && ok(&v) {
            return v;
        }
    }
    panic!("no matching quic_ports_changed within {within:?}:\n{}", w.seen.join("\n"));
}

/// Four uploads through the client into a target that never reads; the events
/// of the next `secs` seconds, after those of `log`.
fn starve(w: &mut Proc, mut log: Vec<Value>, sb: &SingBox, secs: u64) -> Vec<Value> {
    let target = TcpTarget::spawn(Behaviour::Stall).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let ups: Vec<_> = (0..4).map(|_| singbox::upload_via(sb.socks(), target.addr(), stop.clone())).collect();
    log.extend(w.collect_until(Instant::now() + Duration::from_secs(secs)));
    stop.store(true, Ordering::SeqCst);
    for u in ups {
        let _ = u.join();
    }
    log
}

/// The connection through `ports` (the server's, or a hopping range) is
/// reported and starved by the 4 stalls.
fn assert_seen_and_starved(events: &[Value], ports: std::ops::RangeInclusive<u16>) {
    let on = |e: &&&Value| {
        e["server"].as_str().and_then(|s| s.rsplit(':').next()?.parse::<u16>().ok()).is_some_and(|p| ports.contains(&p))
    };
    assert!(named(events, "quic_conn_opened").iter().any(|e| on(&e)), "no quic_conn_opened on {ports:?}: {events:#?}");
    assert!(named(events, "socket_stalled").len() >= 3, "{events:#?}");
    assert!(named(events, "quic_starved").iter().any(|e| on(&e)), "no quic_starved on {ports:?}: {events:#?}");
}

#[test]
fn an_ephemeral_port_server_is_found_without_port() {
    let Some(_g) = root_or_skip("an_ephemeral_port_server_is_found_without_port") else { return };
    if !singbox::sing_box_or_skip("an_ephemeral_port_server_is_found_without_port") {
        return;
    }
    let mut sb = server();
    let port = sb.server_port;
    let pid = sb.server_pid().to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--pid", &pid, "--stall-timeout", TIMEOUT]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    let quic = &started["quic"];
    assert!(candidates_of(quic).contains(&u64::from(port)), "{started}");
    assert!(ports_of(quic).is_empty(), "{started}");
    let note = quic["note"].as_str().expect("a note while no server port is known");
    assert!(note.contains(&port.to_string()), "{note}");

    let mut log = Vec::new();
    sb.add_client().expect("client");
    let found = wait_ports(&mut w, &mut log, Duration::from_secs(10), |v| ports_of(v).contains(&port.to_string()));
    assert!(found["note"].is_null(), "{found}");
    assert!(found["ports"][0]["why"].as_str().unwrap().contains("Initial"), "{found}");
    assert_eq!(found["ports"][0]["pid"].as_u64(), Some(u64::from(sb.server_pid())), "{found}");
    let events = starve(&mut w, log, &sb, 12);
    assert_seen_and_starved(&events, port..=port);
}

#[test]
fn a_server_started_after_hystall_is_found() {
    let Some(_g) = root_or_skip("a_server_started_after_hystall_is_found") else { return };
    if !singbox::sing_box_or_skip("a_server_started_after_hystall_is_found") {
        return;
    }
    let mut w = Proc::spawn(&["watch", "--json", "--comm", "sing-box", "--stall-timeout", TIMEOUT]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    assert!(started["quic"]["note"].is_string(), "nothing QUIC watched yet: {started}");
    let mut sb = server_with_config();
    let port = sb.server_port;
    let mut log = Vec::new();
    // Found at its exec, from its config,
    // before it has bound the port: not at the next rescan.
    let found = wait_ports(&mut w, &mut log, Duration::from_secs(10), |v| ports_of(v).contains(&port.to_string()));
    assert!(found["reason"].as_str().unwrap().contains("just started"), "{found}");
    assert_eq!(ports_of(&found), [port.to_string()], "{found}");
    let before = log.len();
    sb.add_client().expect("client");
    let events = starve(&mut w, log, &sb, 12);
    assert_seen_and_starved(&events, port..=port);
    // The port stays a server port for the rest of the run, and the
    // client's own socket (also sing-box, also watched) is never taken for one.
    let later: Vec<&Value> = named(&events[before..], "quic_ports_changed");
    assert!(later.iter().all(|e| ports_of(e) == [port.to_string()]), "{later:#?}");
}

#[test]
fn a_server_restarted_on_another_port_is_followed() {
    let Some(_g) = root_or_skip("a_server_restarted_on_another_port_is_followed") else { return };
    if !singbox::sing_box_or_skip("a_server_restarted_on_another_port_is_followed") {
        return;
    }
    let mut w = Proc::spawn(&["watch", "--json", "--comm", "sing-box", "--stall-timeout", TIMEOUT]);
    w.wait_event("watch_started", Duration::from_secs(15));
    let mut first = server_with_config();
    let old = first.server_port;
    let mut log = Vec::new();
    wait_ports(&mut w, &mut log, Duration::from_secs(10), |v| ports_of(v).contains(&old.to_string()));
    first.add_client().expect("client");
    // Restart: new processes, new port.
    drop(first);
    let gone = wait_ports(&mut w, &mut log, Duration::from_secs(10), |v| !ports_of(v).contains(&old.to_string()));
    assert!(gone["reason"].as_str().unwrap().contains("gone"), "{gone}");
    assert!(gone["note"].is_string(), "nothing watched again, and said: {gone}");
    let mut second = server_with_config();
    let new = second.server_port;
    assert_ne!(new, old);
    // The new process is found at its exec, from its config.
    let found = wait_ports(&mut w, &mut log, Duration::from_secs(10), |v| ports_of(v).contains(&new.to_string()));
    assert!(found["reason"].as_str().unwrap().contains("just started"), "{found}");
    second.add_client().expect("client");
    let events = starve(&mut w, log, &second, 12);
    assert_seen_and_starved(&events, new..=new);
}

#[test]
fn no_quic_server_is_said_in_watch_started() {
    let Some(_g) = root_or_skip("no_quic_server_is_said_in_watch_started") else { return };
    let mut sleeper = Command::new("sleep").arg("60").stdout(Stdio::null()).spawn().expect("sleep");
    let pid = sleeper.id().to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--pid", &pid, "--duration", "3"]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    let quic = &started["quic"];
    assert!(ports_of(quic).is_empty() && candidates_of(quic).is_empty(), "{started}");
    let note = quic["note"].as_str().expect("note");
    assert!(note.contains("no QUIC server port") && note.contains("--port"), "{note}");
    assert_eq!(quic["reason"], "start");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn doctor_names_the_udp_ports_a_running_server_would_be_found_on() {
    let Some(_g) = root_or_skip("doctor_names_the_udp_ports_a_running_server_would_be_found_on") else { return };
    if !singbox::sing_box_or_skip("doctor_names_the_udp_ports_a_running_server_would_be_found_on") {
        return;
    }
    let sb = server();
    let out = Command::new(common::bin()).args(["doctor", "--json"]).output().expect("doctor");
    assert!(out.status.success());
    let checks: Vec<Value> = serde_json::from_slice(&out.stdout).expect("doctor --json");
    let quic = checks.iter().find(|c| c["name"] == "QUIC servers").expect("a QUIC servers check");
    assert_eq!(quic["status"], "ok", "{quic}");
    let detail = quic["detail"].as_str().unwrap();
    assert!(detail.contains("sing-box") && detail.contains(&sb.server_port.to_string()), "{detail}");
}

#[test]
fn a_port_hopping_range_is_found_from_an_nftables_dnat_rule() {
    let test = "a_port_hopping_range_is_found_from_an_nftables_dnat_rule";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    let _nft = NftTable::dnat("hystall_test_discover_hop", "20101-20110", 20100).expect("nft DNAT rule");
    let mut w = Proc::spawn(&["watch", "--json", "--comm", "sing-box", "--stall-timeout", TIMEOUT]);
    w.wait_event("watch_started", Duration::from_secs(15));
    let sb = SingBox::start(Options {
        server_port: Some(20100),
        server_ports: Some("20101:20110".into()),
        hop_interval: Some("5s".into()),
        ..Default::default()
    })
    .expect("sing-box");
    let mut log = Vec::new();
    let hop =
        wait_ports(&mut w, &mut log, Duration::from_secs(15), |v| ports_of(v).contains(&"20101-20110".to_owned()));
    let row = hop["ports"].as_array().unwrap().iter().find(|p| p["port"] == "20101-20110").unwrap();
    assert!(row["why"].as_str().unwrap().contains("20100"), "{row}");
    let events = starve(&mut w, log, &sb, 12);
    assert_seen_and_starved(&events, 20100..=20110);
}

#[test]
fn a_server_whose_connection_predates_hystall_is_found_from_its_config() {
    let test = "a_server_whose_connection_predates_hystall_is_found_from_its_config";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    // Server and client first: the QUIC connection is open before hystall starts,
    // so no Initial will come; the server's config names the port.
    let sb = SingBox::start(Options::default()).expect("sing-box");
    let port = sb.server_port;
    let pid = sb.server_pid().to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--pid", &pid, "--stall-timeout", TIMEOUT]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    let quic = &started["quic"];
    assert_eq!(ports_of(quic), [port.to_string()], "{started}");
    assert!(quic["ports"][0]["why"].as_str().unwrap().contains("server.json"), "{started}");
    assert!(quic["note"].is_null(), "{started}");
    let events = starve(&mut w, Vec::new(), &sb, 12);
    assert_seen_and_starved(&events, port..=port);
}

#[test]
fn a_server_started_later_in_a_watched_cgroup_is_found() {
    let test = "a_server_started_later_in_a_watched_cgroup_is_found";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    let mut cg = Cgroups::new();
    let dir = cg.create("hystall-test-discovery.slice/proxy.service");
    let sel = "/hystall-test-discovery.slice/proxy.service";
    let mut w = Proc::spawn(&["watch", "--json", "--cgroup", sel, "--stall-timeout", TIMEOUT]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    assert!(started["quic"]["note"].is_string(), "nothing QUIC watched yet: {started}");
    // The "service" starts: its process joins the cgroup, as systemd would put it.
    let mut sb = server();
    let port = sb.server_port;
    Cgroups::enter(&dir, sb.server_pid());
    let mut log = Vec::new();
    wait_ports(&mut w, &mut log, Duration::from_secs(10), |v| candidates_of(v).contains(&u64::from(port)));
    sb.add_client().expect("client");
    wait_ports(&mut w, &mut log, Duration::from_secs(10), |v| ports_of(v).contains(&port.to_string()));
    let events = starve(&mut w, log, &sb, 12);
    assert_seen_and_starved(&events, port..=port);
    drop(sb);
}
