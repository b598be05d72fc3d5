//! `cargo xtask bench [-- ARGS]`: set up, then run every benchmark in one
//! `cargo bench -p hystall --bench probe_overhead --bench tc_overhead --bench pcap_vs_tshark --bench node_scale`:
//! - `probe_overhead`: sends and syscalls per second with the eBPF probes
//!   attached vs detached;
//! - `tc_overhead`: loopback UDP packets per second with the QUIC TC classifier
//!   attached vs detached;
//! - `pcap_vs_tshark`: `hystall pcap` vs tshark on a capture of the lab, wall
//!   time and peak RSS, without and with the key log (needs tcpdump and tshark);
//! - `node_scale`: `hystall watch` on `hystall lab node` (10 000 live QUIC
//!   connections, 500 new/s, 1 000 target sockets): CPU, RSS, map memory, events,
//!   ns per program run, beside the goals and the previous figures.
//!
//! The benchmarks load eBPF programs or capture on lo, so they must run as root. When we are not
//! root, cargo still builds as us (the target folder stays ours) and only the
//! benchmark binaries run through `sudo -E`, set as cargo's runner for the host.
//! `HYSTALL_BENCH_SECS` (seconds per round) is passed through; ARGS are added to
//! the `cargo bench` command line (and those after its own `--` go to each benchmark).

use anyhow::Context as _;

use crate::{setup, sh};

/// The benchmarks of the `hystall` package, run in this order.
const BENCHES: [&str; 4] = ["probe_overhead", "tc_overhead", "pcap_vs_tshark", "node_scale"];

pub fn bench(args: &[String]) -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet, setup::Scope::All)?;
    let mut cmd = sh::cargo();
    cmd.args(["bench", "-p", "hystall"]);
    for bench in BENCHES {
        cmd.args(["--bench", bench]);
    }
    cmd.args(args);
    if !sh::is_root() {
        if sh::which("sudo").is_some() {
            let host = host_triple()?;
            let var = format!("CARGO_TARGET_{}_RUNNER", host.to_uppercase().replace(['-', '.'], "_"));
            cmd.env(var, "sudo -E");
        } else {
            println!("bench: not root and no sudo: the benchmarks will skip themselves (they need root)");
        }
    }
    sh::run(&mut cmd)
}

/// The host's target triple, from `rustc -vV` (the runner variable is per target).
fn host_triple() -> anyhow::Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = sh::probe(std::process::Command::new(rustc).arg("-vV")).context("cannot run `rustc -vV`")?;
    out.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .context("`rustc -vV` printed no host line")
}
