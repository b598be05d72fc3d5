//! The built-in lab with many clients (`hystall lab --client ...`): one quinn
//! proxy, five QUIC connections each with its own work, watched by
//! `hystall watch --pid LAB --port PORT`. The truth of each client is its own
//! probe (a new stream through its connection) at the end; each starved
//! client must be flagged `likely` with only its own targets, the others not
//! at all.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Proc, root_or_skip};
use serde_json::Value;

fn addr(v: &Value) -> Option<SocketAddr> {
    v.as_str()?.parse().ok()
}

#[test]
fn each_starved_lab_client_is_flagged_with_its_own_targets_only() {
    let name = "each_starved_lab_client_is_flagged_with_its_own_targets_only";
    let Some(_g) = root_or_skip(name) else { return };
    // Client 0 (the lab's own): 4 uploads into never-reading targets from +1.5 s.
    let mut lab = Proc::spawn(&[
        "lab",
        "--json",
        "--uploads",
        "4",
        "--target",
        "stall",
        "--delay",
        "1.5",
        "--duration",
        "16",
        "--client",
        "stall:2@1",
        "--client",
        "fast:2@0.5",
        "--client",
        "idle",
        "--client",
        "stall:4@3",
        "--client",
        "slow:2@1",
    ]);
    let ready = lab.wait_event("lab_ready", Duration::from_secs(10));
    // (client address, target address, starves): the lab's windows are 8/20 MiB.
    let mut clients: Vec<(SocketAddr, Option<SocketAddr>, bool)> =
        vec![(addr(&ready["client"]).unwrap(), addr(&ready["target_addr"]), true)];
    for _ in 0..5 {
        let c = lab.wait_event("lab_client", Duration::from_secs(10));
        let starves = c["behaviour"] == "stall" && c["uploads"].as_u64() >= Some(3);
        clients.push((addr(&c["client"]).unwrap(), addr(&c["target_addr"]), starves));
    }
    let pid = ready["pid"].as_u64().unwrap().to_string();
    let port = addr(&ready["server"]).unwrap().port().to_string();
    let mut watch = Proc::spawn(&["watch", "--json", "--pid", &pid, "--port", &port, "--stall-timeout", "3"]);
    watch.wait_event("watch_started", Duration::from_secs(20));

    let deadline = Instant::now() + Duration::from_secs(13);
    let events = watch.collect_until(deadline);
    let lab_lines = lab.collect_until(Instant::now() + Duration::from_millis(100));
    watch.stop();

    // Each client's last probe: does a new stream through it still work?
    let mut works: BTreeMap<usize, bool> = BTreeMap::new();
    for l in &lab_lines {
        let index = match l["event"].as_str() {
            Some("lab_probe") => 0,
            Some("lab_client_probe") => l["index"].as_u64().unwrap() as usize,
            _ => continue,
        };
        works.insert(index, l["stream_ok"] == true);
    }
    let conn_of: BTreeMap<u64, SocketAddr> = events
        .iter()
        .filter(|e| e["event"] == "quic_conn_opened")
        .filter_map(|e| Some((e["conn"].as_u64()?, addr(&e["client"])?)))
        .collect();
    let remote_of: BTreeMap<u64, SocketAddr> =
        events.iter().filter_map(|e| Some((e["cookie"].as_u64()?, addr(&e["remote"])?))).collect();
    let mut story = Vec::new();
    for (i, (client, target, starves)) in clients.iter().enumerate() {
        assert_eq!(works.get(&i), Some(&!starves), "client {i}: the lab did not do what it should\n{lab_lines:#?}");
        let flags: Vec<(&str, BTreeSet<Option<SocketAddr>>)> = events
            .iter()
            .filter(|e| e["event"] == "quic_starved")
            .filter(|e| e["conn"].as_u64().and_then(|c| conn_of.get(&c)) == Some(client))
            .map(|e| {
                let blamed = e["stalled"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| c.as_u64().and_then(|c| remote_of.get(&c).copied()))
                    .collect();
                (e["confidence"].as_str().unwrap_or(""), blamed)
            })
            .collect();
        story.push(format!("client {i} {client} starves {starves}: {flags:?}"));
        if *starves {
            assert!(
                flags.iter().any(|(conf, blamed)| *conf == "likely" && blamed == &BTreeSet::from([*target])),
                "client {i} must be flagged likely with its own targets only:\n{}",
                story.join("\n")
            );
        } else {
            assert!(flags.is_empty(), "healthy client {i} flagged:\n{}", story.join("\n"));
        }
    }
    eprintln!("{name}:\n{}", story.join("\n"));
}
