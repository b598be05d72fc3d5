//! Attribution at node scale (issue: node scale): one real Hysteria2 server
//! (sing-box), several clients uploading at once — starved, healthy, idle,
//! download-only side by side — and the truth from each client's own tunnel.
//! Every starved client must be flagged `likely` (or `confirmed` with the
//! server's Clash API) with only its own targets; no healthy client may be
//! flagged at all. Each test prints its score line (docs/DETECTOR.md).

mod common;

use common::node::{self, Expect, NEED, Plan, Setup, Work, ready};
use common::singbox::Options;

/// Healthy clients of every kind, started at `at` seconds; the uploads at a
/// client's uplink rate.
fn healthy_mix(at: f64) -> Vec<Plan> {
    vec![
        Plan::new(Work::Fast(2)).after(at).rate(4 << 20),
        Plan::new(Work::Slow(2)).after(at),
        Plan::new(Work::Idle),
        Plan::new(Work::Download).after(at),
        Plan::new(Work::Stall(2)).after(at + 0.8),
    ]
}

#[test]
fn one_starved_client_among_fast_slow_idle_and_download_only() {
    let name = "one_starved_client_among_fast_slow_idle_and_download_only";
    let Some(_g) = ready(name) else { return };
    let plans = [
        Plan::new(Work::Stall(4)).after(1.0),
        Plan::new(Work::Fast(4)),
        Plan::new(Work::Idle),
        Plan::new(Work::Slow(2)),
        Plan::new(Work::Download),
    ];
    node::run(&Setup::named(name), &plans).judge(name, NEED);
}

/// Requests of several clients that reach the server within the same few
/// milliseconds, uploads that move in step: what timing and bytes cannot
/// split stays unattributed — never blamed on the wrong client. (The Clash
/// API test below splits the same case exactly.)
#[test]
fn uploads_that_start_in_the_same_instant_are_never_blamed_on_the_wrong_client() {
    let name = "uploads_that_start_in_the_same_instant_are_never_blamed_on_the_wrong_client";
    let Some(_g) = ready(name) else { return };
    let plans = [
        Plan::new(Work::Stall(4)),
        Plan::new(Work::Stall(2)),
        Plan::new(Work::Fast(4)),
        Plan::new(Work::Idle),
        Plan::new(Work::Slow(2)),
        Plan::new(Work::Download),
    ];
    node::run(&Setup::named(name), &plans).judge_with(name, NEED, Expect::NoWrongFlag);
}

#[test]
fn four_and_two_stalled_uploads_only_the_first_is_starved() {
    let name = "four_and_two_stalled_uploads_only_the_first_is_starved";
    let Some(_g) = ready(name) else { return };
    let plans = [Plan::new(Work::Stall(4)), Plan::new(Work::Stall(2)).after(1.0)];
    node::run(&Setup::named(name), &plans).judge(name, NEED);
}

#[test]
fn three_clients_starved_at_once_among_healthy_ones() {
    let name = "three_clients_starved_at_once_among_healthy_ones";
    let Some(_g) = ready(name) else { return };
    // Their uploads start 0.2 s apart, each while the others (and the
    // healthy mix, from 0.1 s) upload: every uploader sent packets in the
    // moments before each connect, so the server's answers decide (the
    // targets of the second and third carry `reply` evidence). All three are
    // starved together. Requests within the same few milliseconds are the
    // test above's.
    let mut plans =
        vec![Plan::new(Work::Stall(4)), Plan::new(Work::Stall(4)).after(0.2), Plan::new(Work::Stall(4)).after(0.4)];
    plans.extend(healthy_mix(0.1));
    node::run(&Setup::named(name), &plans).judge(name, NEED);
}

#[test]
fn starts_staggered_by_seconds() {
    let name = "starts_staggered_by_seconds";
    let Some(_g) = ready(name) else { return };
    let plans = [
        Plan::new(Work::Fast(3)),
        Plan::new(Work::Stall(4)).after(1.0),
        Plan::new(Work::Stall(2)).after(2.5),
        Plan::new(Work::Idle),
        Plan::new(Work::Stall(4)).after(4.0),
        Plan::new(Work::Download).after(5.0),
    ];
    let setup = Setup { work_secs: 14.0, ..Setup::named(name) };
    node::run(&setup, &plans).judge(name, NEED);
}

#[test]
fn twenty_clients_a_few_of_them_starved() {
    let name = "twenty_clients_a_few_of_them_starved";
    let Some(_g) = ready(name) else { return };
    let mut plans =
        vec![Plan::new(Work::Stall(4)), Plan::new(Work::Stall(4)).after(1.5), Plan::new(Work::Stall(4)).after(3.0)];
    // Healthy clients at a client's uplink rate, so that 2 cores carry them.
    for i in 0..17 {
        let at = 0.2 * i as f64;
        plans.push(match i % 6 {
            0 => Plan::new(Work::Fast(2)).after(at).rate(2 << 20),
            1 => Plan::new(Work::Slow(1)).after(at),
            2 => Plan::new(Work::Idle),
            3 => Plan::new(Work::Download).after(at),
            // Between the starved clients' starts.
            4 => Plan::new(Work::Stall(2)).after(0.75 + 1.5 * (i / 6) as f64),
            _ => Plan::new(Work::Fast(1)).after(at).rate(1 << 20),
        });
    }
    let setup = Setup { work_secs: 16.0, ..Setup::named(name) };
    node::run(&setup, &plans).judge(name, NEED);
}

#[test]
fn with_the_clash_api_starved_clients_are_confirmed_with_exact_targets() {
    let name = "with_the_clash_api_starved_clients_are_confirmed_with_exact_targets";
    let Some(_g) = ready(name) else { return };
    // Uploads that start at the same instant: what bytes and timing alone
    // cannot always split, the server's own table does.
    let mut plans = vec![Plan::new(Work::Stall(4)), Plan::new(Work::Stall(4)), Plan::new(Work::Stall(2))];
    plans.extend(healthy_mix(0.0));
    let setup = Setup { opts: Options { clash_api: true, ..Default::default() }, ..Setup::named(name) };
    node::run(&setup, &plans).judge_with(name, NEED, Expect::Confirmed);
}

#[test]
fn over_ipv6() {
    let name = "over_ipv6";
    let Some(_g) = ready(name) else { return };
    let plans = [
        Plan::new(Work::Stall(4)),
        Plan::new(Work::Stall(2)).after(1.0),
        Plan::new(Work::Fast(2)),
        Plan::new(Work::Idle),
    ];
    let setup = Setup { opts: Options { ipv6: true, ..Default::default() }, ..Setup::named(name) };
    node::run(&setup, &plans).judge(name, NEED);
}

#[test]
fn with_salamander_obfuscation() {
    let name = "with_salamander_obfuscation";
    let Some(_g) = ready(name) else { return };
    let plans = [
        Plan::new(Work::Stall(4)),
        Plan::new(Work::Stall(2)).after(1.0),
        Plan::new(Work::Fast(2)),
        Plan::new(Work::Idle),
    ];
    let opts = Options { obfs: Some("hystall-lab".into()), ..Default::default() };
    node::run(&Setup { opts, ..Setup::named(name) }, &plans).judge(name, NEED);
}

#[test]
fn with_port_hopping_clients() {
    let name = "with_port_hopping_clients";
    let Some(_g) = ready(name) else { return };
    let _nft = common::nft::NftTable::dnat("hystall_node_hop", "20101-20110", 20100).expect("nft DNAT rule");
    let plans = [
        Plan::new(Work::Stall(4)),
        Plan::new(Work::Stall(2)).after(1.0),
        Plan::new(Work::Fast(2)).rate(2 << 20),
        Plan::new(Work::Idle),
    ];
    let opts = Options {
        server_port: Some(20100),
        server_ports: Some("20101:20110".into()),
        hop_interval: Some("5s".into()),
        ..Default::default()
    };
    node::run(&Setup { opts, ..Setup::named(name) }, &plans).judge(name, NEED);
}
