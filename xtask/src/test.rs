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

/// The first lines of each failure's panic message, printed again just before
/// the summary: a long run's log is often read from its end (or cut in the
/// middle), and the failures are what it is read for.
#[derive(Default)]
struct Digest {
    lines: Vec<String>,
    /// Lines still to keep after a `panicked at` line.
    keep: usize,
}

impl Digest {
    const PER_FAILURE: usize = 4;
    const MAX_LINES: usize = 80;

    fn add(&mut self, line: &str) {
        if self.lines.len() >= Self::MAX_LINES {
            return;
        }
        if line.starts_with("---- ") && line.ends_with(" ----") {
            self.lines.push(line.to_owned());
            self.keep = 0;
        } else if line.contains("panicked at ") {
            self.lines.push(line.to_owned());
            self.keep = Self::PER_FAILURE;
        } else if self.keep > 0 {
            self.keep -= 1;
            if line.starts_with("stack backtrace:") {
                self.keep = 0;
            } else {
                self.lines.push(line.chars().take(400).collect());
            }
        }
    }

    fn print(&self) {
        if self.lines.is_empty() {
            return;
        }
        println!("failures (the first lines of each):");
        for l in &self.lines {
            println!("  {l}");
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
    let mut digest = Digest::default();
    let stdout = child.stdout.take().context("no stdout from cargo test")?;
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        totals.add(&line);
        digest.add(&line);
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
    digest.print();
    println!("summary: {} passed, {} failed, {} skipped", totals.passed, totals.failed, totals.ignored);
    if !status.success() {
        // The summary line above is the last word; just exit like cargo test did.
        std::process::exit(status.code().unwrap_or(101));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_keeps_each_failures_name_and_message_but_no_backtrace() {
        let mut d = Digest::default();
        for l in [
            "running 2 tests",
            "---- a stdout ----",
            "",
            "thread 'a' (1) panicked at hystall/tests/x.rs:3:5:",
            "a: 1 right, 1 missed",
            "stack backtrace:",
            "   0: frame",
            "test result: FAILED. 1 passed; 1 failed;",
        ] {
            d.add(l);
        }
        assert_eq!(
            d.lines,
            ["---- a stdout ----", "thread 'a' (1) panicked at hystall/tests/x.rs:3:5:", "a: 1 right, 1 missed"]
        );
    }
}
