//! Root end-to-end tests of `--decrypt` against a real Hysteria2 (sing-box
//! 1.14.4, a stripped Go binary): the server's TLS secrets read by the uprobe,
//! the suspect connection's frames read live, and the verdict `confirmed`
//! from them; nothing for healthy connections; `--keylog-out` writes a key
//! log that decrypts a capture of the same run; the built-in (Rust) lab says
//! it cannot be decrypted.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::singbox::{self, Behaviour, Options, SingBox, TcpTarget};
use common::tcpdump::Tcpdump;
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
    watch_ports(&port.to_string(), extra)
}

/// The same on a port or range (`P` or `LO-HI`).
fn watch_ports(ports: &str, extra: &[&str]) -> Proc {
    let p = ports;
    let mut args = vec!["watch", "--json", "--comm", "sing-box", "--port", p, "--stall-timeout", TIMEOUT, "--decrypt"];
    args.extend_from_slice(extra);
    let mut w = Proc::spawn(&args);
    w.wait_event("watch_started", Duration::from_secs(15));
    w
}

/// Starts the sing-box server alone and waits until `w` probes it: the secrets
/// of a handshake are read only if the uprobe is there before it (clients are
/// added after).
fn start_server(w: &mut Proc, port: u16) -> SingBox {
    start_server_with(w, Options { server_port: Some(port), ..Default::default() })
}

fn start_server_with(w: &mut Proc, opts: Options) -> SingBox {
    let sb = SingBox::start(Options { no_client: true, ..opts }).expect("sing-box");
    wait_probed(w, sb.server_pid());
    sb
}

/// Waits until `w` says it reads the secrets of process `pid`.
fn wait_probed(w: &mut Proc, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(e) = w.next_json(deadline) {
        if e["event"] == "decrypt_changed"
            && e["processes"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["pid"] == pid && !p["functions"].as_array().unwrap().is_empty()))
        {
            return;
        }
    }
    panic!("the sing-box server (pid {pid}) was not probed within 10 s: {:?}", w.seen);
}

/// Uploads from client `i` of `sb` into `target`, `n` at once.
fn uploads(
    sb: &SingBox,
    i: usize,
    target: &TcpTarget,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
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

/// `kernel.bpf_stats_enabled` on for a run, restored on drop.
struct BpfStats(Option<String>);

impl BpfStats {
    fn enable() -> BpfStats {
        const P: &str = "/proc/sys/kernel/bpf_stats_enabled";
        let old = std::fs::read_to_string(P).ok();
        let _ = std::fs::write(P, "1");
        BpfStats(old)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", old.trim());
        }
    }
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Prints ns per run of the programs `--decrypt` adds or changes.
fn print_costs(m: &std::collections::HashMap<String, f64>) {
    for prog in ["go_tls_keylog", "quic_ingress", "quic_egress"] {
        let get = |name: &str| m.get(&format!("{name}{{program=\"{prog}\"}}")).copied().unwrap_or(0.0);
        let (secs, runs) = (get("hystall_probe_run_time_seconds_total"), get("hystall_probe_run_count_total"));
        if runs > 0.0 {
            eprintln!("--decrypt cost: {prog}: {:.0} ns per run over {runs} runs", secs * 1e9 / runs);
        }
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
    // The cost figures (docs/PERFORMANCE.md): BPF run-time statistics on for
    // the run, read back from the metrics endpoint.
    let stats = BpfStats::enable();
    let metrics = free_tcp_port();
    let maddr = format!("127.0.0.1:{metrics}");
    let mut w = watch(port, &["--keylog-out", keys.to_str().unwrap(), "--metrics", &maddr]);
    let target = TcpTarget::spawn(Behaviour::Stall).expect("target");
    let capture = dir.join("run.pcap");
    let dump = Tcpdump::start(&capture, &format!("udp port {port} or tcp port {}", target.addr().port()));
    let mut sb = start_server(&mut w, port);
    let client = sb.add_client().expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let ups = uploads(&sb, client, &target, 4, &stop);
    let alive = keep_alive(&sb, client, &stop);
    let mut events: Vec<Value> = w.seen.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
    events.extend(collect_until_confirmed(&mut w, Instant::now() + Duration::from_secs(25)));
    // The truth, from the client: a new request through its tunnel fails.
    let truth = singbox::probe_new_stream(sb.socks_of(client), sb.echo.addr(), Duration::from_secs(2));
    print_costs(&common::scrape::scrape(metrics));
    drop(stats);
    stop.store(true, Ordering::SeqCst);
    let datagrams = alive.join().unwrap();
    assert!(!truth, "the client is starved: a new request must fail");
    assert!(datagrams > 0, "datagrams through the tunnel still flowed");
    dump.stop();
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
    // The streams that hold the window, as far as the frames read show them
    // (live: those whose last frames rode in the packets kept at the stop).
    let held = f["blocked_streams"].as_array().expect("blocked_streams");
    assert!(!held.is_empty() && held.iter().all(|s| s["offset"].as_u64().unwrap_or(0) > 0), "{f}");
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
    let decrypted = conns
        .iter()
        .find(|c| c["decrypt"]["secrets_found"] == true && c["starved"]["confidence"] == "confirmed")
        .unwrap_or_else(|| panic!("the key log decrypts the capture: {summary:#}"));
    // Every frame is read offline: the four uploads' streams, each open with
    // megabytes in it (the stream the probe opened at the end has none).
    let open: Vec<&Value> = decrypted["frames"]["client_streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["ended"] == false && s["offset"].as_u64().unwrap_or(0) > 1 << 20)
        .collect();
    assert_eq!(open.len(), 4, "{:#}", decrypted["frames"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// The events of a run: `watch --decrypt` first, the server, then one client
/// per entry of `clients` uploading into targets of that behaviour (n at
/// once; n = 0: idle), datagrams flowing through every tunnel; returns the
/// events and, per client, whether a new request still worked at the end.
fn run(port: u16, opts: Options, clients: &[(Behaviour, usize)], secs: u64) -> (Vec<Value>, Vec<bool>, SingBox) {
    run_watching(&port.to_string(), port, opts, clients, secs, Duration::ZERO, &[])
}

/// `run`, watching `ports` (the server's port and the ones hopped to).
fn run_watching(
    ports: &str,
    port: u16,
    opts: Options,
    clients: &[(Behaviour, usize)],
    secs: u64,
    upload_after: Duration,
    watch_args: &[&str],
) -> (Vec<Value>, Vec<bool>, SingBox) {
    let mut w = watch_ports(ports, watch_args);
    let mut sb = start_server_with(&mut w, Options { server_port: Some(port), ..opts });
    let stop = Arc::new(AtomicBool::new(false));
    let mut targets = Vec::new();
    let mut ups = Vec::new();
    let mut alive = Vec::new();
    let mut idx = Vec::new();
    for _ in clients {
        let i = sb.add_client().expect("client");
        idx.push(i);
        alive.push(keep_alive(&sb, i, &stop));
    }
    std::thread::sleep(upload_after);
    for (&(b, n), &i) in clients.iter().zip(&idx) {
        let t = TcpTarget::spawn(b).expect("target");
        ups.extend(uploads(&sb, i, &t, n, &stop));
        targets.push(t);
    }
    let mut events: Vec<Value> = w.seen.iter().filter_map(|l| serde_json::from_str(l).ok()).collect();
    events.extend(collect_until_confirmed(&mut w, Instant::now() + Duration::from_secs(secs)));
    let truth: Vec<bool> = idx
        .iter()
        .map(|&i| singbox::probe_new_stream(sb.socks_of(i), sb.echo.addr(), Duration::from_secs(2)))
        .collect();
    stop.store(true, Ordering::SeqCst);
    for u in ups {
        let _ = u.join();
    }
    for a in alive {
        let _ = a.join();
    }
    (events, truth, sb)
}

/// Every event until `deadline`, or until a few seconds after the first
/// `confirmed` flag (time enough for a wrong flag to show as well): a loaded
/// machine takes longer to fill the targets' buffers, and a fixed window
/// would then judge a run that had not stalled yet.
fn collect_until_confirmed(w: &mut Proc, deadline: Instant) -> Vec<Value> {
    let mut out = Vec::new();
    let mut end = deadline;
    while let Some(v) = w.next_json(end) {
        if v["event"] == "quic_starved" && v["confidence"] == "confirmed" && end == deadline {
            end = deadline.min(Instant::now() + Duration::from_secs(4));
        }
        out.push(v);
    }
    out
}

/// One line per flag (when, client, confidence), for failure messages.
fn flags_summary(events: &[Value]) -> String {
    named(events, "quic_starved")
        .iter()
        .map(|e| format!("{} {} {}", e["ts"], e["client"], e["confidence"]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The client address of each connection flagged `confirmed`.
fn confirmed_clients(events: &[Value]) -> BTreeSet<String> {
    named(events, "quic_starved")
        .iter()
        .filter(|e| e["confidence"] == "confirmed")
        .filter_map(|e| e["client"].as_str().map(str::to_owned))
        .collect()
}

/// Client addresses (UDP) of sing-box client process `pid`.
fn client_addrs(pid: u32) -> BTreeSet<String> {
    singbox::udp_sockets_of(pid).into_iter().map(|(local, _)| local.to_string()).collect()
}

#[test]
fn uploads_into_targets_that_read_or_close_are_not_flagged() {
    let test = "uploads_into_targets_that_read_or_close_are_not_flagged";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    for (b, port) in [(Behaviour::Fast, 23101), (Behaviour::Slow, 23102), (Behaviour::Upclose, 23103)] {
        let (events, truth, _sb) = run(port, Options::default(), &[(b, 4)], 10);
        let flagged = named(&events, "quic_starved");
        eprintln!("{b:?}: a new request works: {}; flags: {}", truth[0], flagged.len());
        // Four uploads into slow readers can hold the window for a while (a
        // new request may wait for the next raise), but their targets keep
        // moving: never starved (`slow_targets_that_keep_moving_…`).
        assert!(flagged.is_empty(), "{b:?}: {flagged:#?}");
        if b != Behaviour::Slow {
            assert_eq!(truth, vec![true], "{b:?}: the client is healthy");
        }
    }
}

/// Runs of `slow_targets_that_keep_moving_are_never_flagged`.
const SLOW_RUNS: usize = 5;
/// How long each run uploads: beyond the longer stall timeout and two of
/// the slower targets' raises.
const SLOW_RUN: Duration = Duration::from_secs(17);

#[test]
fn slow_targets_that_keep_moving_are_never_flagged() {
    let test = "slow_targets_that_keep_moving_are_never_flagged";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    // Four uploads into targets that read slowly but steadily: the server
    // reads them as the targets drain and raises MAX_DATA every ~4 s
    // (`Steady`, ~320 KB/s each) or ~8 s (`Slow`), and between two raises
    // the client is blocked at its limit and says so (DATA_BLOCKED). A
    // connection held back by targets that keep moving is window-limited,
    // not starved. Two watchers at once, at stall timeouts 3 and 10 s; a
    // new client per run, the runs in a row on one server.
    let port = 23111;
    let watch_at = |timeout: &str| {
        let args =
            ["watch", "--json", "--comm", "sing-box", "--port", "23111", "--stall-timeout", timeout, "--decrypt"];
        let mut w = Proc::spawn(&args);
        w.wait_event("watch_started", Duration::from_secs(15));
        w
    };
    let mut watchers = [("3", watch_at("3")), ("10", watch_at("10"))];
    let mut sb =
        SingBox::start(Options { no_client: true, server_port: Some(port), ..Default::default() }).expect("sing-box");
    for (_, w) in watchers.iter_mut() {
        wait_probed(w, sb.server_pid());
    }
    let mut flags = Vec::new();
    for run in 0..SLOW_RUNS {
        let behaviour = if run % 2 == 0 { Behaviour::Steady } else { Behaviour::Slow };
        let client = sb.add_client().expect("client");
        let target = TcpTarget::spawn(behaviour).expect("target");
        let stop = Arc::new(AtomicBool::new(false));
        let ups = uploads(&sb, client, &target, 4, &stop);
        let alive = keep_alive(&sb, client, &stop);
        let deadline = Instant::now() + SLOW_RUN;
        let mut events: Vec<(&str, Value)> = Vec::new();
        while Instant::now() < deadline {
            for (timeout, w) in watchers.iter_mut() {
                let until = Instant::now() + Duration::from_millis(200);
                events.extend(w.collect_until(until).into_iter().map(|e| (*timeout, e)));
            }
        }
        // What a new request through the tunnel does now (for the record:
        // it may wait for the next raise).
        let works = singbox::probe_new_stream(sb.socks_of(client), sb.echo.addr(), Duration::from_secs(2));
        stop.store(true, Ordering::SeqCst);
        for u in ups {
            let _ = u.join();
        }
        let datagrams = alive.join().unwrap();
        let stalled = events.iter().filter(|(_, e)| e["event"] == "socket_stalled").count();
        let flagged: Vec<&(&str, Value)> = events.iter().filter(|(_, e)| e["event"] == "quic_starved").collect();
        eprintln!(
            "run {run} ({behaviour:?}): targets read {} KiB, {datagrams} datagrams echoed, a new request works: \
             {works}, socket_stalled {stalled}, flags {}",
            target.received() >> 10,
            flagged.len()
        );
        assert!(target.received() > 1 << 20, "run {run}: the targets read (they are slow, not stalled)");
        flags.extend(flagged.into_iter().map(|(t, e)| format!("run {run}, stall timeout {t}: {e}")));
    }
    assert!(flags.is_empty(), "slow targets flagged:\n{}", flags.join("\n"));
}

#[test]
fn of_two_clients_only_the_one_with_enough_stalled_uploads_is_confirmed() {
    let test = "of_two_clients_only_the_one_with_enough_stalled_uploads_is_confirmed";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    let (events, truth, sb) = run(23104, Options::default(), &[(Behaviour::Stall, 4), (Behaviour::Stall, 2)], 25);
    assert_eq!(truth, vec![false, true], "4 stalled uploads starve a client, 2 do not");
    let starved = client_addrs(sb.client_pid_of(0));
    let healthy = client_addrs(sb.client_pid_of(1));
    let confirmed = confirmed_clients(&events);
    assert!(
        !confirmed.is_empty() && confirmed.is_subset(&starved),
        "confirmed {confirmed:?}, starved client {starved:?}; flags:\n{}",
        flags_summary(&events)
    );
    let wrong: Vec<&Value> = named(&events, "quic_starved")
        .into_iter()
        .filter(|e| e["client"].as_str().is_some_and(|c| healthy.contains(c)))
        .collect();
    assert!(wrong.is_empty(), "the healthy client is flagged: {wrong:#?}");
}

#[test]
fn an_ipv6_client_is_confirmed_too() {
    let test = "an_ipv6_client_is_confirmed_too";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    let (events, truth, _sb) = run(23105, Options { ipv6: true, ..Default::default() }, &[(Behaviour::Stall, 4)], 25);
    assert_eq!(truth, vec![false]);
    let confirmed = confirmed_clients(&events);
    assert!(confirmed.iter().any(|c| c.starts_with('[')), "an IPv6 client confirmed: {confirmed:?}\n{events:#?}");
}

#[test]
fn the_built_in_lab_is_not_go_and_says_so() {
    let test = "the_built_in_lab_is_not_go_and_says_so";
    let Some(_g) = root_or_skip(test) else { return };
    let mut w = Proc::spawn(&["watch", "--json", "--lab", "--decrypt", "--stall-timeout", TIMEOUT, "--duration", "10"]);
    let events = w.collect_until(Instant::now() + Duration::from_secs(20));
    assert_eq!(w.child.wait().expect("watch ends").code(), Some(0));
    let start = &named(&events, "watch_started")[0];
    let d = &start["decrypt"];
    let lab = d["processes"].as_array().and_then(|p| p.first()).expect("the lab's process is listed");
    assert!(lab["functions"].as_array().unwrap().is_empty(), "{d}");
    assert!(lab["note"].as_str().unwrap().contains("not a Go binary"), "{d}");
    assert!(d["note"].as_str().is_some(), "{d}");
    // Degraded, not broken: the lab's starvation is still found by inference.
    let starved = named(&events, "quic_starved");
    assert!(starved.iter().any(|e| e["confidence"] == "likely"), "{events:#?}");
}

#[test]
fn an_idle_client_beside_a_starved_one_is_never_flagged() {
    let test = "an_idle_client_beside_a_starved_one_is_never_flagged";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    // The capture and key log stay when it fails (`hystall pcap --keylog`).
    let dir = tmpdir("idle");
    let keys = dir.join("keys.log");
    let dump = Tcpdump::start(&dir.join("run.pcap"), "udp port 23106");
    // The second client uploads nothing: only datagrams through its tunnel.
    let (events, truth, sb) = run_watching(
        "23106",
        23106,
        Options::default(),
        &[(Behaviour::Stall, 4), (Behaviour::Fast, 0)],
        25,
        Duration::ZERO,
        &["--keylog-out", keys.to_str().unwrap()],
    );
    dump.stop();
    // The events stay beside the capture when it fails.
    let lines: Vec<String> = events.iter().map(|e| e.to_string()).collect();
    std::fs::write(dir.join("events.jsonl"), lines.join("\n")).ok();
    eprintln!("capture, key log and events of this run: {}", dir.display());
    assert_eq!(truth, vec![false, true]);
    let idle = client_addrs(sb.client_pid_of(1));
    let starved = client_addrs(sb.client_pid_of(0));
    let confirmed = confirmed_clients(&events);
    assert!(
        !confirmed.is_empty() && confirmed.is_subset(&starved),
        "confirmed {confirmed:?}, starved {starved:?}; flags:\n{}",
        flags_summary(&events)
    );
    let wrong: Vec<&Value> = named(&events, "quic_starved")
        .into_iter()
        .filter(|e| e["client"].as_str().is_some_and(|c| idle.contains(c)))
        .collect();
    assert!(wrong.is_empty(), "the idle client is flagged: {wrong:#?}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn salamander_connections_are_not_read_and_say_so() {
    let test = "salamander_connections_are_not_read_and_say_so";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    // Salamander hides the QUIC packets under a key from the server's config,
    // not from TLS: the secrets are read, the packets cannot be opened, and
    // the connection is never read (its verdict stays inferred).
    let opts = Options { obfs: Some("hystall-salamander".into()), ..Default::default() };
    let (events, truth, _sb) = run(23107, opts, &[(Behaviour::Stall, 4)], 12);
    assert_eq!(truth, vec![false]);
    for e in named(&events, "quic_starved") {
        assert_eq!(e["obfuscated"], true, "{e}");
        assert_ne!(e["confidence"], "confirmed", "no frames are read under Salamander: {e}");
        assert!(e["evidence"]["frames"].is_null(), "{e}");
    }
}

#[test]
fn a_client_that_hops_ports_is_confirmed_across_its_hops() {
    let test = "a_client_that_hops_ports_is_confirmed_across_its_hops";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    // Hysteria's port hopping: the client sends to a port of a range (a new
    // UDP socket each hop) that a DNAT rule forwards to the server's port;
    // the connection, and its keys, stay the same.
    let _nft = common::nft::NftTable::dnat("hystall_decrypt_hop", "23121-23130", 23120).expect("nft DNAT rule");
    let opts =
        Options { server_ports: Some("23121:23130".into()), hop_interval: Some("5s".into()), ..Default::default() };
    // The capture and key log of the run stay when it fails, for
    // `hystall pcap --keylog` (what the client sent after each hop).
    let dir = tmpdir("hop");
    let keys = dir.join("keys.log");
    let capture = dir.join("run.pcap");
    let dump = Tcpdump::start(&capture, "udp portrange 23120-23130");
    // The uploads start after the first hop: the frames read are on a flow
    // the handshake never used (tied to the connection by its CIDs).
    let (events, truth, sb) = run_watching(
        "23120-23130",
        23120,
        opts,
        &[(Behaviour::Stall, 4)],
        25,
        Duration::from_secs(7),
        &["--keylog-out", keys.to_str().unwrap()],
    );
    dump.stop();
    eprintln!("capture and key log of this run: {}", dir.display());
    assert_eq!(truth, vec![false], "the client is starved");
    let starved = named(&events, "quic_starved");
    let confirmed: Vec<&&Value> = starved.iter().filter(|e| e["confidence"] == "confirmed").collect();
    let opened = named(&events, "quic_conn_opened");
    let first = opened.first().and_then(|e| e["client"].as_str()).unwrap_or_default();
    eprintln!(
        "first client address {first}; when confirmed: {:?}; the client's sockets now: {:?}",
        confirmed.iter().map(|e| &e["client"]).collect::<Vec<_>>(),
        client_addrs(sb.client_pid_of(0))
    );
    assert!(!confirmed.is_empty(), "confirmed from frames after a hop: {events:#?}");
    assert!(confirmed.iter().all(|e| e["client"].as_str() != Some(first)), "the client had hopped: {confirmed:#?}");
    // One connection across the hops: no second one opened for the client.
    assert_eq!(named(&events, "quic_conn_opened").len(), 1, "{events:#?}");
    for e in &confirmed {
        assert!(
            e["evidence"]["frames"]["data_blocked_limit"].as_u64().is_some()
                || e["evidence"]["frames"]["max_data"].as_u64().unwrap_or(0) > 0,
            "{e}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Files under `roots` modified since `since` (not following links, not
/// `skip`), at most 64 MiB each: where a leaked secret would be.
fn written_since(roots: &[&std::path::Path], since: std::time::SystemTime, skip: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = roots.iter().map(|p| p.to_path_buf()).collect();
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
        if p.starts_with(skip) {
            continue;
        }
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.filter_map(Result::ok).map(|e| e.path()));
            }
        } else if meta.is_file() && meta.len() <= 64 << 20 && meta.modified().is_ok_and(|m| m >= since) {
            out.push(p);
        }
    }
    out
}

#[test]
fn no_secret_is_written_anywhere_without_keylog_out() {
    let test = "no_secret_is_written_anywhere_without_keylog_out";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    // Two hystalls read the same server's secrets: one writes them to a key
    // log (so that the test knows them), the other has no --keylog-out. Its
    // output, its log and every file written anywhere during the run must
    // hold none of them, in hex or raw.
    let dir = tmpdir("nowrite");
    let keys = dir.join("keys.log");
    let since = std::time::SystemTime::now() - Duration::from_secs(1);
    let port = 23108;
    let mut knows = watch(port, &["--keylog-out", keys.to_str().unwrap()]);
    let log = std::fs::File::create(dir.join("quiet.stderr")).unwrap();
    let p = port.to_string();
    let mut quiet = Proc::spawn_with_stderr(
        &["watch", "--json", "--comm", "sing-box", "--port", &p, "--stall-timeout", TIMEOUT, "--decrypt"],
        log,
    );
    quiet.wait_event("watch_started", Duration::from_secs(15));
    let mut sb = start_server_with(&mut knows, Options { server_port: Some(port), ..Default::default() });
    wait_probed(&mut quiet, sb.server_pid());
    let client = sb.add_client().expect("client");
    let target = TcpTarget::spawn(Behaviour::Stall).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let ups = uploads(&sb, client, &target, 4, &stop);
    let alive = keep_alive(&sb, client, &stop);
    let events = collect_until_confirmed(&mut quiet, Instant::now() + Duration::from_secs(25));
    stop.store(true, Ordering::SeqCst);
    let _ = alive.join();
    for u in ups {
        let _ = u.join();
    }
    quiet.stop();
    knows.stop();
    drop(sb);
    // The quiet one read the secrets and decrypted with them.
    assert!(
        named(&events, "quic_starved").iter().any(|e| e["confidence"] == "confirmed"),
        "the run without --keylog-out decrypts too: {events:#?}"
    );
    let text = std::fs::read_to_string(&keys).unwrap();
    let mut secrets: Vec<Vec<u8>> = Vec::new();
    for l in text.lines() {
        let Some(hex) = l.split_whitespace().nth(2) else { continue };
        let raw: Vec<u8> =
            (0..hex.len() / 2).filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect();
        secrets.extend([hex.as_bytes().to_vec(), hex.to_uppercase().into_bytes(), raw]);
    }
    assert!(secrets.len() >= 3 * 4, "the key log has the handshake's secrets: {text}");
    let holds = |hay: &[u8]| secrets.iter().any(|s| hay.windows(s.len()).any(|w| w == s.as_slice()));
    assert!(!holds(quiet.seen.join("\n").as_bytes()), "a secret in the output of the run without --keylog-out");
    let roots: Vec<&std::path::Path> = ["/tmp", "/var/tmp", "/var/log", "/run", "/dev/shm", "/root", "/home", "."]
        .iter()
        .map(std::path::Path::new)
        .collect();
    assert!(holds(text.as_bytes()), "the check finds the secrets where they are");
    let files = written_since(&roots, since, &keys);
    assert!(files.iter().any(|f| f.ends_with("quiet.stderr")), "its log is checked: {files:?}");
    let leaked: Vec<&PathBuf> = files.iter().filter(|f| std::fs::read(f).is_ok_and(|b| holds(&b))).collect();
    eprintln!("{} files written during the run checked", files.len());
    assert!(leaked.is_empty(), "secrets found in {leaked:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// tmux, for the dashboard test.
fn tmux(args: &[&str]) -> std::process::Output {
    Command::new("tmux").args(args).output().expect("tmux")
}

/// Waits until tmux session `s` shows every one of `needles`.
fn screen_shows(s: &str, needles: &[&str], within: Duration) -> Result<String, String> {
    let deadline = Instant::now() + within;
    let mut last = String::new();
    while Instant::now() < deadline {
        last = String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", s]).stdout).into_owned();
        if needles.iter().all(|n| last.contains(n)) {
            return Ok(last);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(last)
}

#[test]
fn top_decrypt_shows_the_starved_connection_confirmed_from_its_frames() {
    let test = "top_decrypt_shows_the_starved_connection_confirmed_from_its_frames";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("{test}: skipped: tmux not installed");
        return;
    }
    // What an operator does: the node runs, `sudo hystall top --decrypt`;
    // then a client connects, and its uploads stall.
    const S: &str = "hystall_top_decrypt_test";
    struct Session;
    impl Drop for Session {
        fn drop(&mut self) {
            let _ = tmux(&["kill-session", "-t", S]);
        }
    }
    let port = 23109;
    let mut sb =
        SingBox::start(Options { server_port: Some(port), no_client: true, ..Default::default() }).expect("sing-box");
    let _ = tmux(&["kill-session", "-t", S]);
    let cmd = format!(
        "{} top --decrypt --comm sing-box --port {port} --stall-timeout {TIMEOUT} --refresh 250; echo TOP-EXITED-$?; sleep 30",
        bin()
    );
    let out = tmux(&["new-session", "-d", "-s", S, "-x", "200", "-y", "50", &cmd]);
    assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
    let _session = Session;
    // The header says the server's secrets are read before any client comes.
    screen_shows(S, &["decrypt 1 server(s)"], Duration::from_secs(15)).unwrap_or_else(|s| panic!("header:\n{s}"));
    let client = sb.add_client().expect("client");
    let target = TcpTarget::spawn(Behaviour::Stall).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let ups = uploads(&sb, client, &target, 4, &stop);
    let alive = keep_alive(&sb, client, &stop);
    let shown = screen_shows(S, &["STARVED confirmed"], Duration::from_secs(15));
    // The detail of the selected (starved, on top) connection: its frames.
    let _ = tmux(&["send-keys", "-t", S, "Enter"]);
    let detail = screen_shows(S, &["Frames (decrypted)", "DATA_BLOCKED"], Duration::from_secs(4));
    let _ = tmux(&["send-keys", "-t", S, "Escape"]);
    let _ = tmux(&["send-keys", "-t", S, "q"]);
    let after = screen_shows(S, &["TOP-EXITED-0"], Duration::from_secs(8));
    stop.store(true, Ordering::SeqCst);
    let _ = alive.join();
    for u in ups {
        let _ = u.join();
    }
    let shown = shown.unwrap_or_else(|s| panic!("no confirmed connection on screen:\n{s}"));
    let head: String = shown.lines().take(3).collect::<Vec<_>>().join("\n");
    // The client's handshake is tied to its connection by its Initial.
    assert!(head.contains("handshakes, 1 tied") || head.contains("handshakes, 2 tied"), "{head}");
    let detail = detail.unwrap_or_else(|s| panic!("detail view:\n{s}"));
    eprintln!("{detail}");
    assert!(detail.contains("open streams:"), "{detail}");
    after.unwrap_or_else(|s| panic!("after quit:\n{s}"));
}
