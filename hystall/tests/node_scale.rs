//! Attribution at node scale (issue: node scale): one real Hysteria2 server
//! (sing-box), several clients uploading at once — starved, healthy, idle,
//! download-only side by side — and the truth from each client's own tunnel.
//! Every starved client must be flagged `likely` (or `confirmed`) with only
//! its own targets; no healthy client may be flagged at all.

mod common;

use common::node::{self, Plan, Setup, Work};
use common::root_or_skip;
use common::singbox::sing_box_or_skip;

/// Stalled streams that exhaust the lab's 20 MiB window with 8 MiB ones.
const NEED: usize = 3;

fn ready(name: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let g = root_or_skip(name)?;
    sing_box_or_skip(name).then_some(g)
}

#[test]
fn one_starved_client_among_fast_slow_idle_and_download_only() {
    let name = "one_starved_client_among_fast_slow_idle_and_download_only";
    let Some(_g) = ready(name) else { return };
    let plans = [
        Plan::new(Work::Stall(4)),
        Plan::new(Work::Fast(4)),
        Plan::new(Work::Idle),
        Plan::new(Work::Slow(2)),
        Plan::new(Work::Download),
    ];
    node::run(&Setup::named(name), &plans).judge(name, NEED);
}

#[test]
fn four_and_two_stalled_uploads_only_the_first_is_starved() {
    let name = "four_and_two_stalled_uploads_only_the_first_is_starved";
    let Some(_g) = ready(name) else { return };
    let plans = [Plan::new(Work::Stall(4)), Plan::new(Work::Stall(2))];
    node::run(&Setup::named(name), &plans).judge(name, NEED);
}
