//! `cargo xtask test [-- CARGO_TEST_ARGS]`: set up, then
//! `cargo test --workspace --release --no-fail-fast` with RUST_BACKTRACE=1.
//!
//! Release, so the eBPF object built by hystall's build.rs is shared with `build`
//! and `run`. Tests that need root skip themselves (printing "skipped: needs root")
//! when not root. The test output is passed through while the `test result:` lines
//! are added up into one closing summary line.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::{setup, sh};

#[derive(Default)]
struct Totals {
    suites: u32,
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Adds a libtest line such as
    /// `test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; ...`.
    fn add(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        self.suites += 1;
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match label {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

pub fn test(args: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    setup::setup(setup::Verbosity::Quiet, setup::Scope::All)?;

    let mut cmd = sh::cargo();
    cmd.args(["test", "--release", "--no-fail-fast"]);
    // `-p NAME` picks packages itself; otherwise test the whole workspace.
    let cargo_args = args.iter().take_while(|a| *a != "--");
    if !cargo_args.clone().any(|a| a == "-p" || a.starts_with("--package") || (a.starts_with("-p") && a.len() > 2)) {
        cmd.arg("--workspace");
    }
    cmd.args(args).env("RUST_BACKTRACE", "1");
    println!("$ {}", sh::display(&cmd));

    let mut child = cmd.stdout(Stdio::piped()).spawn().context("cannot start cargo test")?;
    let mut totals = Totals::default();
    let stdout = child.stdout.take().context("no stdout from cargo test")?;
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        totals.add(&line);
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    drop(out);
    let status = child.wait()?;
    let secs = started.elapsed().as_secs();

    println!();
    if totals.suites == 0 {
        if status.success() {
            println!("xtask test: no test suite ran ({secs}s)");
            return Ok(());
        }
        bail!("cargo test failed before any test ran ({status}, {secs}s)");
    }
    let verdict = if status.success() { "ok" } else { "FAILED" };
    println!(
        "xtask test: {verdict}: {} suites in {secs}s (ignored tests are counted as skipped; \
         root-only tests print \"skipped: needs root\" when not root)",
        totals.suites
    );
    println!("summary: {} passed, {} failed, {} skipped", totals.passed, totals.failed, totals.ignored);
    if !status.success() {
        // The summary line above is the last word; just exit like cargo test did.
        std::process::exit(status.code().unwrap_or(101));
    }
    Ok(())
}
