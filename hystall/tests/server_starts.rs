//! A server that starts after hystall, or restarts during a watch, under
//! load (issue 29): the proxy is selected by name (`--comm sing-box`), its
//! port found from its config, and its connections — found mid-flight —
//! counted from their first watched packet. Each starved client must be
//! flagged `likely`, no healthy one at all; the truth from each client's own
//! tunnel (`common/node.rs`). Each test prints its score line.

mod common;

use std::time::Duration;

use common::node::{self, NEED, Plan, ServerStart, Setup, Work, ready};

#[test]
fn a_server_started_after_hystall_with_its_clients_uploading_at_once() {
    let name = "a_server_started_after_hystall_with_its_clients_uploading_at_once";
    let Some(_g) = ready(name) else { return };
    let plans = [Plan::new(Work::Stall(4)), Plan::new(Work::Fast(2)).rate(4 << 20), Plan::new(Work::Idle)];
    let setup = Setup { server: ServerStart::AfterWatch, ..Setup::named(name) };
    node::run(&setup, &plans).judge(name, NEED);
}

#[test]
fn a_server_restarted_during_a_watch_with_its_clients_reconnecting_and_uploading() {
    let name = "a_server_restarted_during_a_watch_with_its_clients_reconnecting_and_uploading";
    let Some(_g) = ready(name) else { return };
    // Load before the restart (a download, cut by it); after it, each
    // client reconnects — at once when the stopping server's close reached
    // it, else at its 30 s idle timeout (sing-box's close on SIGTERM races
    // its exit) — and its uploads start then, one's into targets that
    // stall. The old connections' clients keep sending into the new server
    // meanwhile: they must not be blamed.
    let plans = [
        Plan::new(Work::Stall(4)).after(3.0),
        Plan::new(Work::Download),
        Plan::new(Work::Fast(2)).rate(4 << 20).after(3.0),
        Plan::new(Work::Idle),
    ];
    let setup = Setup { server: ServerStart::RestartAt(Duration::from_secs(3)), work_secs: 15.0, ..Setup::named(name) };
    node::run(&setup, &plans).judge(name, NEED);
}
