//! `cargo xtask fuzz [--secs N] [-- LIBFUZZER_ARGS]`: the cargo-fuzz target
//! `pcap_offline` (fuzz/) for N seconds, on a seed corpus made from the committed
//! test captures.
//!
//! 1. setup (nightly, bpf-linker: the fuzz build compiles hystall, eBPF included);
//! 2. cargo-fuzz from crates.io, only when `cargo-fuzz` is not on PATH;
//! 3. seeds: every capture in hystall/tests/data, twice (first byte 0: no key
//!    log, 1: the fixed key log), into fuzz/corpus/pcap_offline (overwritten:
//!    the corpus is generated, not committed);
//! 4. `cargo +nightly fuzz run pcap_offline` with a bounded time, a per-input
//!    timeout (a hang is a finding too) and a memory limit. A crash leaves its
//!    input in fuzz/artifacts/pcap_offline and fails the task.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

use crate::{setup, sh};

const TARGET: &str = "pcap_offline";
/// Seconds one input may take before libFuzzer calls it a hang.
const INPUT_TIMEOUT_SECS: u32 = 10;
/// Memory limit of the fuzzing process, MiB.
const RSS_LIMIT_MB: u32 = 2048;

pub fn fuzz(secs: u64, args: &[String]) -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet, setup::Scope::All)?;
    cargo_fuzz()?;
    let root = sh::workspace_root();
    let corpus = root.join("fuzz").join("corpus").join(TARGET);
    let seeds = seed_corpus(&root.join("hystall").join("tests").join("data"), &corpus)?;
    println!("fuzz: {seeds} seed inputs in {}", corpus.display());
    let mut cmd = Command::new("rustup");
    // Through rustup, not $CARGO (a stable cargo that knows no `+nightly`).
    for var in ["RUSTUP_TOOLCHAIN", "RUSTC", "RUSTDOC", "CARGO"] {
        cmd.env_remove(var);
    }
    cmd.current_dir(root.join("fuzz"));
    cmd.args(["run", "nightly", "cargo", "fuzz", "run", TARGET]);
    cmd.arg(&corpus);
    cmd.arg("--");
    cmd.arg(format!("-max_total_time={secs}"));
    cmd.arg(format!("-timeout={INPUT_TIMEOUT_SECS}"));
    cmd.arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"));
    cmd.args(args);
    sh::run(&mut cmd).context("the fuzzer stopped on a finding: its input is in fuzz/artifacts/pcap_offline")
}

/// Installs cargo-fuzz when it is missing.
fn cargo_fuzz() -> anyhow::Result<()> {
    if let Some(path) = sh::which("cargo-fuzz") {
        println!("fuzz: cargo-fuzz present ({})", path.display());
        return Ok(());
    }
    println!("fuzz: installing cargo-fuzz from crates.io");
    sh::run(sh::cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    sh::prepare_path();
    anyhow::ensure!(sh::which("cargo-fuzz").is_some(), "cargo-fuzz was installed but is not on PATH");
    Ok(())
}

/// Writes `0 ++ capture` and `1 ++ capture` (the target's key-log switch) for
/// every .pcap/.pcapng in `data`; the number of seeds.
fn seed_corpus(data: &Path, corpus: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(corpus).with_context(|| format!("cannot create {}", corpus.display()))?;
    let mut n = 0;
    let entries = std::fs::read_dir(data).with_context(|| format!("cannot list {}", data.display()))?;
    for entry in entries {
        let path = entry?.path();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
        if !matches!(ext, "pcap" | "pcapng") {
            continue;
        }
        let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        for (choice, tag) in [(0u8, "nokeys"), (1u8, "keys")] {
            let mut seed = Vec::with_capacity(bytes.len() + 1);
            seed.push(choice);
            seed.extend_from_slice(&bytes);
            let out = corpus.join(format!("seed-{name}-{tag}"));
            std::fs::write(&out, seed).with_context(|| format!("cannot write {}", out.display()))?;
            n += 1;
        }
    }
    Ok(n)
}
