//! Root tests of `hystall pcap` on real captures made here with tcpdump on
//! loopback: the built-in lab (with its TLS key log) and a real Hysteria2
//! (sing-box). A starved capture gives the starved verdict with the moment the
//! client's bulk stopped (checked against tshark's reading of the same file,
//! ±1 s); a healthy one gives none; the lab's key log makes it `confirmed`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::singbox::{self, Behaviour, Options, SingBox, TcpTarget};
use common::tcpdump::Tcpdump;
use common::{Proc, bin, root_or_skip};
use serde_json::Value;

const TIMEOUT: &str = "3";

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hystall-pcap-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    // tcpdump drops privileges to its own user: it must be able to write here.
    let _ = Command::new("chmod").arg("777").arg(&d).status();
    d
}

/// Captures the built-in lab; returns (capture, key log, the lab's client address).
fn lab_capture(dir: &Path, target: &str, uploads: usize, secs: u64) -> (PathBuf, PathBuf, String) {
    let file = dir.join(format!("lab-{target}.pcap"));
    let keys = dir.join(format!("lab-{target}.keys"));
    let dump = Tcpdump::start(&file, "udp or tcp");
    let (n, d) = (uploads.to_string(), secs.to_string());
    let mut lab = Proc::spawn(&[
        "lab",
        "--json",
        "--uploads",
        &n,
        "--target",
        target,
        "--duration",
        &d,
        "--keylog",
        keys.to_str().unwrap(),
    ]);
    let ready = lab.wait_event("lab_ready", Duration::from_secs(10));
    let _ = lab.collect_until(Instant::now() + Duration::from_secs(secs + 10));
    let _ = lab.child.wait();
    dump.stop();
    (file, keys, ready["client"].as_str().unwrap().to_owned())
}

fn pcap(file: &Path, extra: &[&str]) -> (Vec<Value>, String) {
    let out = Command::new(bin())
        .args(["pcap", "--json", "--stall-timeout", TIMEOUT])
        .arg(file)
        .args(extra)
        .output()
        .expect("hystall pcap");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect(), stderr)
}

fn starved(events: &[Value]) -> Vec<&Value> {
    conns(events).into_iter().filter(|c| !c["starved"].is_null()).collect()
}

fn conns(events: &[Value]) -> Vec<&Value> {
    let summary = events.iter().find(|e| e["event"] == "pcap_summary").expect("pcap_summary");
    summary["conns"].as_array().unwrap().iter().collect()
}

/// The lab's own connection (other QUIC on loopback may be in the capture).
fn lab_conn<'a>(events: &'a [Value], client: &str) -> &'a Value {
    conns(events)
        .into_iter()
        .find(|c| c["client"] == client)
        .unwrap_or_else(|| panic!("no connection of {client}: {events:#?}"))
}

fn unix(ts: &str) -> f64 {
    ts.parse::<jiff::Timestamp>().unwrap().as_nanosecond() as f64 / 1e9
}

/// Independent reading: the time of the last full-size UDP datagram (bulk
/// stream data) the client sent, by tshark.
fn tshark_last_bulk(file: &Path, client_port: u16) -> Option<f64> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args(["-Y", &format!("udp.srcport == {client_port} && udp.length > 1008"), "-T", "fields", "-e"])
        .arg("frame.time_epoch")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse::<f64>().ok()).reduce(f64::max)
}

fn tshark_or_skip(test: &str) -> bool {
    let ok = Command::new("tshark").arg("-v").output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("{test}: skipped: needs tshark (Debian package tshark; `cargo xtask setup` installs it)");
    }
    ok
}

#[test]
fn a_capture_of_the_lab_stall_is_starved_from_the_right_moment_and_confirmed_with_its_key_log() {
    let test = "a_capture_of_the_lab_stall_is_starved_from_the_right_moment_and_confirmed_with_its_key_log";
    let Some(_g) = root_or_skip(test) else { return };
    if !tshark_or_skip(test) {
        return;
    }
    let dir = tmpdir("lab-stall");
    let (file, keys, client) = lab_capture(&dir, "stall", 4, 10);
    let port: u16 = client.rsplit(':').next().unwrap().parse().unwrap();
    let truth = tshark_last_bulk(&file, port).expect("tshark saw the client's bulk");

    // Headers, timing and the targets' TCP: likely.
    let (events, _) = pcap(&file, &[]);
    let s = [lab_conn(&events, &client)];
    assert_eq!(s[0]["starved"]["confidence"], "likely", "{}", s[0]);
    let since = unix(s[0]["starved"]["since"].as_str().unwrap());
    eprintln!("lab capture: starved since {since:.3}, tshark's last client bulk {truth:.3}");
    assert!((since - truth).abs() <= 1.0, "since {since} vs tshark {truth}");
    assert!(s[0]["starved"]["targets"].as_array().unwrap().len() >= 3);
    let stalled = events.iter().filter(|e| e["event"] == "socket_stalled").count();
    assert!(stalled >= 3, "the targets' zero windows: {stalled}");

    // With the key log: the frames prove it.
    let svg = dir.join("lab.svg");
    let (events, _) = pcap(&file, &["--keylog", keys.to_str().unwrap(), "--svg", svg.to_str().unwrap()]);
    let s = [lab_conn(&events, &client)];
    assert_eq!(s[0]["starved"]["confidence"], "confirmed", "{}", s[0]);
    let since = unix(s[0]["starved"]["since"].as_str().unwrap());
    assert!((since - truth).abs() <= 1.0, "since {since} vs tshark {truth}");
    let f = &s[0]["frames"];
    // The client used the whole connection window (a capture that dropped a
    // few packets under load misses some stream bytes: then DATA_BLOCKED says it).
    let (consumed, max) = (f["client_consumed"].as_u64().unwrap(), f["server_max_data"].as_u64().unwrap());
    let named = f["data_blocked"][0].as_u64().unwrap_or(0);
    assert!(max > 0 && (consumed >= max || named >= max), "the client used the whole connection window: {f}");
    assert!(f["acks"][0].as_u64().unwrap() > 0 && f["datagrams"][0].as_u64().unwrap() > 0, "{f}");
    let d = &s[0]["decrypt"];
    assert_eq!(d["auth_failed"], 0, "{d}");
    assert!(d["opened"].as_u64().unwrap() > 1000, "{d}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("stream data stopped"), "the picture marks the stall");

    // From the client's end (a phone: no targets' TCP in the capture). Without
    // keys the headers cannot tell starvation from idleness, and say so; with
    // them the frames prove it.
    let udp_only = dir.join("lab-udp.pcap");
    let st =
        Command::new("tcpdump").arg("-r").arg(&file).arg("-w").arg(&udp_only).arg("udp").stderr(Stdio::null()).status();
    assert!(st.is_ok_and(|s| s.success()), "tcpdump -r");
    let (events, _) = pcap(&udp_only, &[]);
    let c = lab_conn(&events, &client);
    assert!(c["starved"].is_null(), "{c}");
    assert_eq!(c["verdict"], "cannot_tell", "not 'not starved': {c}");
    assert!(c["note"].as_str().is_some_and(|n| n.contains("--keylog") && n.contains("targets' TCP")), "{c}");
    let text = Command::new(bin()).args(["pcap", "--stall-timeout", TIMEOUT]).arg(&udp_only).output().expect("pcap");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("verdict: cannot tell without keys"), "{text}");
    let (events, _) = pcap(&udp_only, &["--keylog", keys.to_str().unwrap()]);
    let c = lab_conn(&events, &client);
    assert_eq!(c["starved"]["confidence"], "confirmed", "{c}");
    assert!((unix(c["starved"]["since"].as_str().unwrap()) - truth).abs() <= 1.0, "{c}");

    // The secrets inside the capture (pcapng Decryption Secrets Block, by editcap).
    let dsb = dir.join("lab-dsb.pcapng");
    let st = Command::new("editcap")
        .arg("--inject-secrets")
        .arg(format!("tls,{}", keys.display()))
        .arg(&file)
        .arg(&dsb)
        .status();
    if st.is_ok_and(|s| s.success()) {
        let (events, _) = pcap(&dsb, &[]);
        assert_eq!(lab_conn(&events, &client)["starved"]["confidence"], "confirmed");
    } else {
        eprintln!("{test}: editcap missing: the Decryption Secrets Block case is not run");
    }

    // A capture that dropped a run of packets (tcpdump under load) still
    // decrypts after the gap: packet numbers are found a window further on.
    let gap = dir.join("lab-gap.pcap");
    let st = Command::new("editcap").arg(&file).arg(&gap).arg("600-1400").status();
    if st.is_ok_and(|s| s.success()) {
        let (events, _) = pcap(&gap, &["--keylog", keys.to_str().unwrap()]);
        let c = lab_conn(&events, &client);
        assert_eq!(c["decrypt"]["auth_failed"], 0, "{c}");
        // Confirmed unless the cut took the frames that prove it (a MAX_DATA
        // raise we cannot see): then it stays likely, never wrong.
        let conf = c["starved"]["confidence"].as_str().unwrap_or_default();
        assert!(conf == "confirmed" || conf == "likely", "{c}");
    }

    // Played back like a live run (`watch --replay`): the same verdict.
    let out = Command::new(bin())
        .args(["watch", "--json", "--stall-timeout", TIMEOUT, "--replay"])
        .arg(&file)
        .arg("--keylog")
        .arg(&keys)
        .output()
        .unwrap();
    let replayed: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert!(replayed.iter().any(|e| e["event"] == "quic_starved" && e["confidence"] == "confirmed"), "{replayed:#?}");

    // The readable report says the same.
    let out = Command::new(bin())
        .args(["pcap", "--stall-timeout", TIMEOUT, "--keylog"])
        .arg(&keys)
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("STARVED (confirmed)") && text.contains("DATA_BLOCKED") || text.contains("MAX_DATA"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_capture_of_the_lab_with_reading_targets_has_no_verdict() {
    let test = "a_capture_of_the_lab_with_reading_targets_has_no_verdict";
    let Some(_g) = root_or_skip(test) else { return };
    let dir = tmpdir("lab-fast");
    let (file, keys, client) = lab_capture(&dir, "fast", 4, 8);
    let (events, _) = pcap(&file, &[]);
    assert!(lab_conn(&events, &client)["starved"].is_null(), "{events:#?}");
    assert_ne!(lab_conn(&events, &client)["verdict"], "starved", "{events:#?}");
    let (events, _) = pcap(&file, &["--keylog", keys.to_str().unwrap()]);
    let conn = lab_conn(&events, &client);
    assert!(conn["starved"].is_null(), "{events:#?}");
    assert!(conn["frames"]["stream_bytes"][0].as_u64().unwrap() > 10 << 20, "uploads decrypted: {conn}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A sing-box capture as a server would take it: its QUIC port and the targets' TCP.
fn singbox_capture(dir: &Path, behaviour: Behaviour, port: u16, secs: u64) -> (PathBuf, u16) {
    let target = TcpTarget::spawn(behaviour).expect("target");
    let file = dir.join("singbox.pcap");
    let dump = Tcpdump::start(&file, &format!("udp port {port} or tcp port {}", target.addr().port()));
    let sb = SingBox::start(Options { server_port: Some(port), ..Default::default() }).expect("sing-box");
    let stop = Arc::new(AtomicBool::new(false));
    let ups: Vec<_> = (0..4).map(|_| singbox::upload_via(sb.socks(), target.addr(), stop.clone())).collect();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::SeqCst);
    dump.stop();
    for u in ups {
        let _ = u.join();
    }
    drop(sb);
    (file, port)
}

#[test]
fn a_server_side_capture_of_hysteria2_stalled_by_its_targets_is_starved() {
    let test = "a_server_side_capture_of_hysteria2_stalled_by_its_targets_is_starved";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) || !tshark_or_skip(test) {
        return;
    }
    let dir = tmpdir("singbox-stall");
    let (file, port) = singbox_capture(&dir, Behaviour::Stall, 23020, 12);
    let (events, _) = pcap(&file, &[]);
    let s = starved(&events);
    assert_eq!(s.len(), 1, "{events:#?}");
    assert_eq!(s[0]["starved"]["confidence"], "likely", "{}", s[0]);
    let client_port: u16 = s[0]["client"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap();
    let truth = tshark_last_bulk(&file, client_port).expect("tshark saw the client's bulk");
    let since = unix(s[0]["starved"]["since"].as_str().unwrap());
    eprintln!("sing-box capture (server {port}): starved since {since:.3}, tshark's last client bulk {truth:.3}");
    assert!((since - truth).abs() <= 1.0, "since {since} vs tshark {truth}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_server_side_capture_of_hysteria2_with_a_reading_target_has_no_verdict() {
    let test = "a_server_side_capture_of_hysteria2_with_a_reading_target_has_no_verdict";
    let Some(_g) = root_or_skip(test) else { return };
    if !singbox::sing_box_or_skip(test) {
        return;
    }
    let dir = tmpdir("singbox-fast");
    let (file, _) = singbox_capture(&dir, Behaviour::Fast, 23021, 8);
    let (events, _) = pcap(&file, &[]);
    assert!(starved(&events).is_empty(), "{events:#?}");
    let summary = events.iter().find(|e| e["event"] == "pcap_summary").unwrap();
    assert_eq!(summary["conns"].as_array().unwrap().len(), 1, "{summary}");
    std::fs::remove_dir_all(&dir).ok();
}
