//! Root end-to-end tests of the other QUIC proxy protocols sing-box serves:
//! TUIC (v5) and Hysteria (v1), with their default windows. Each runs a
//! starved client (uploads into a never-reading target) beside a healthy one
//! (uploads into a target that reads) on one server: the starved client's
//! connection must be flagged with its own targets, the healthy one never.
//! The truth for each is a new request through its own tunnel.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::side_by_side::{self, named};
use common::singbox::{self, Options, Protocol, SingBox};
use common::{Proc, root_or_skip};
use serde_json::Value;

const TIMEOUT: u64 = 3;

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

    let label = format!("{protocol:?}: ");
    let run = side_by_side::start(test, &label, &lab, &mut w, stalled, Duration::from_secs(20), TIMEOUT + 6);
    let (on_starved, on_healthy) = (run.flags_on(&run.starved_client), run.flags_on(&run.healthy_client));
    let events = run.finish(&label, &mut w);

    let stalled_cookies: BTreeSet<u64> =
        named(&events, "socket_stalled").iter().filter_map(|e| e["cookie"].as_u64()).collect();
    assert!(on_healthy.is_empty(), "{protocol:?}: the healthy client was flagged: {on_healthy:#?}");
    let last = on_starved.last().unwrap_or_else(|| panic!("{protocol:?}: starved client not flagged: {events:#?}"));
    assert!(last["confidence"] == "likely" || last["confidence"] == "confirmed", "{last}");
    let blamed: BTreeSet<u64> = last["stalled"].as_array().unwrap().iter().filter_map(Value::as_u64).collect();
    assert!(!blamed.is_empty() && blamed.is_subset(&stalled_cookies), "blamed {blamed:?}, stalled {stalled_cookies:?}");
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
