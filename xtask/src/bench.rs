//! `cargo xtask bench [-- ARGS]`: set up, then
//! `cargo bench -p hystall --bench probe_overhead` (probe overhead: sends and
//! syscalls per second with the eBPF probes attached vs detached).
//!
//! The benchmark loads eBPF programs, so it must run as root. When we are not
//! root, cargo still builds as us (the target folder stays ours) and only the
//! benchmark binary runs through `sudo -E`, set as cargo's runner for the host.
//! `HYSTALL_BENCH_SECS` (seconds per round) is passed through.

use anyhow::Context as _;

use crate::{setup, sh};

pub fn bench(args: &[String]) -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet)?;
    let mut cmd = sh::cargo();
    cmd.args(["bench", "-p", "hystall", "--bench", "probe_overhead"]).args(args);
    if !sh::is_root() {
        if sh::which("sudo").is_some() {
            let host = host_triple()?;
            let var = format!("CARGO_TARGET_{}_RUNNER", host.to_uppercase().replace(['-', '.'], "_"));
            cmd.env(var, "sudo -E");
        } else {
            println!("bench: not root and no sudo: the benchmark will skip itself (it needs root)");
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
