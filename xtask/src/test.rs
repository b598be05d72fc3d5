//! `cargo xtask test [-- CARGO_TEST_ARGS]`: set up, then
//! `cargo test --workspace --release --no-fail-fast` with RUST_BACKTRACE=1.
//!
//! The root end-to-end tests drive real servers, clients and timers on a
//! shared 2-core machine. A few failures in integration tests (`tests/*.rs`)
//! are run once more, alone, as cargo-nextest's `--retries` does: a test that
//! passes then is reported as flaky, by name, in the summary (and still
//! counted as failed once); a second failure fails the run. Unit tests and
//! more than `MAX_RETRIED` failures are never retried.
//!
//! Then the kernel matrix (`cargo xtask vm`, every kernel, on the dist binary
//! when built, else the release binary the tests built): its checks count in
//! the closing summary and a failed one fails the run. It runs when no test filter is given (CI runs it);
//! HYSTALL_VM=0 skips it, HYSTALL_VM=1 runs it even with a filter, and
//! HYSTALL_VM=6.12,host runs those kernels only. In CI a
//! matrix that cannot run (no root, no qemu) fails the run; elsewhere it says
//! so in one line and is counted as skipped.
//!
//! Release, so the eBPF object built by hystall's build.rs is shared with `build`
//! and `run`. Tests that need root skip themselves (printing "skipped: needs root")
//! when not root. The test output is passed through while the `test result:` lines
//! are added up into one closing summary line.
//!
//! A full run (no ARGS, as CI's) also builds the artifacts of `cargo xtask dist`
//! and checks them after the tests (`dist::start_test_build`); their PASS/FAIL
//! lines count in the summary.
//!
//! What runs beside the tests. The tests are compiled first, alone, as a step
//! of its own (`cargo test ... --no-run`: a build error stops the run there).
//! Then, while they run (their servers and clients mostly sleep on timers,
//! leaving the CPU idle), two other xtask processes work at SCHED_IDLE
//! priority (`chrt --idle 0`, else `nice -n 19`; I/O in the idle class), each
//! with its output in a file under target/ rather than among the tests' lines
//! (crate::background):
//!
//! - the dist build (`cargo xtask dist-build`, output in target/dist-build.log),
//!   in its own cargo target folder, target/dist-build, so that cargo's lock
//!   of a folder it builds in never makes the tests' own cargo (the retry of a
//!   failed test) wait for it; waited for and checked after the tests and
//!   their retries, its failure printing the end of its log;
//! - the matrix's kernels, when the matrix is to run (as root): downloaded and
//!   unpacked into ~/.cache/hystall-kernels (`cargo xtask vm-fetch`, output in
//!   target/vm-fetch.log; nothing to do when they are cached), waited for
//!   before the matrix, whose own fetch then finds them (and, should the
//!   background one have failed, tries again and says why).
//!
//! They take no CPU time the tests want, so their timers and latencies are as
//! when run alone: a SCHED_IDLE task weighs 3 against a normal one's 1024 and
//! any normal task that wakes preempts it at once (what is still shared is
//! memory, caches and the disk, the last in the idle I/O class). Each job is
//! its own process group, killed whole when the run stops early (an error: the
//! job's `Background` is dropped; a signal: the job sees its stdin pipe close).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::background::Background;
use crate::vm::{self, Kernel};
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

/// Failures retried at most (more means something is broken, not flaky).
const MAX_RETRIED: usize = 3;

/// The failed tests, from libtest's `test X ... FAILED` lines (cargo's
/// `Running tests/NAME.rs` lines go to stderr, which is not read: the suite
/// of a failure is found from the sources instead).
#[derive(Default)]
struct Failures {
    failed: Vec<String>,
}

impl Failures {
    fn add(&mut self, line: &str) {
        if let Some(name) = line.trim().strip_prefix("test ").and_then(|r| r.strip_suffix(" ... FAILED")) {
            self.failed.push(name.to_owned());
        }
    }

    /// The failures to run again, by suite (`tests/SUITE.rs`, from `sources`:
    /// file stem and text): None when any may not be — a unit or doc test
    /// (its name has `::` or a space), a name no single suite defines, or
    /// too many failures.
    fn retriable(&self, sources: &[(String, String)]) -> Option<Vec<(String, Vec<String>)>> {
        if self.failed.is_empty() || self.failed.len() > MAX_RETRIED {
            return None;
        }
        let mut by_suite: Vec<(String, Vec<String>)> = Vec::new();
        for name in &self.failed {
            if name.contains("::") || name.contains(' ') {
                return None;
            }
            let defines = |text: &str| text.contains(&format!("fn {name}()"));
            let mut suites = sources.iter().filter(|(_, text)| defines(text)).map(|(stem, _)| stem);
            let (Some(suite), None) = (suites.next(), suites.next()) else { return None };
            match by_suite.iter_mut().find(|(s, _)| s == suite) {
                Some((_, names)) => names.push(name.clone()),
                None => by_suite.push((suite.clone(), vec![name.clone()])),
            }
        }
        Some(by_suite)
    }
}

/// hystall's integration tests: (file stem, text).
fn integration_sources() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hystall/tests");
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .filter_map(|p| Some((p.file_stem()?.to_str()?.to_owned(), std::fs::read_to_string(&p).ok()?)))
        .collect()
}

/// Runs the failed tests of one suite once more; true when they all pass.
fn retry(suite: &str, names: &[String]) -> anyhow::Result<bool> {
    let mut cmd = sh::cargo();
    cmd.args(["test", "--release", "-p", "hystall", "--test", suite, "--", "--exact", "--test-threads", "1"]);
    cmd.args(names).env("RUST_BACKTRACE", "1");
    println!("$ {}", sh::display(&cmd));
    Ok(cmd.status().context("cannot start cargo test")?.success())
}

/// `cargo test --release --no-fail-fast [--workspace] ARGS`, RUST_BACKTRACE=1.
fn cargo_test(args: &[String]) -> Command {
    let mut cmd = sh::cargo();
    cmd.args(["test", "--release", "--no-fail-fast"]);
    // `-p NAME` picks packages itself; otherwise test the whole workspace.
    let cargo_args = args.iter().take_while(|a| *a != "--");
    if !cargo_args.clone().any(|a| a == "-p" || a.starts_with("--package") || (a.starts_with("-p") && a.len() > 2)) {
        cmd.arg("--workspace");
    }
    cmd.args(args).env("RUST_BACKTRACE", "1");
    cmd
}

pub fn test(args: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    setup::setup(setup::Verbosity::Quiet, setup::Scope::All)?;

    let dist_plan = crate::dist::test_builds(args);
    let matrix = matrix_kernels(args);
    let prefetch = matrix.as_ref().and_then(|m| m.as_ref().ok()).filter(|_| sh::is_root()).map(|k| vm::guests(k));
    let prefetch = prefetch.filter(|guests| !guests.is_empty());
    if dist_plan.is_ok() || prefetch.is_some() {
        // The tests are compiled first, alone (the background jobs would slow
        // that down), as a step of its own: a build error stops here, clearly.
        let cargo_args: Vec<String> = args.iter().take_while(|a| *a != "--").cloned().collect();
        let mut build = cargo_test(&cargo_args);
        build.arg("--no-run");
        sh::run(&mut build).context("the tests do not build")?;
    }
    // Beside the tests, at idle priority (crate::background): the dist build,
    // and the matrix's kernels. Dropped unfinished (an early error), each is
    // killed.
    let dist_build = dist_plan.is_ok().then(crate::dist::start_test_build);
    let prefetch = prefetch.and_then(|guests| start_prefetch(&guests));

    let mut cmd = cargo_test(args);
    println!("$ {}", sh::display(&cmd));
    let mut child = cmd.stdout(Stdio::piped()).spawn().context("cannot start cargo test")?;
    let mut totals = Totals::default();
    let mut digest = Digest::default();
    let mut failures = Failures::default();
    let stdout = child.stdout.take().context("no stdout from cargo test")?;
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        totals.add(&line);
        digest.add(&line);
        failures.add(&line);
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    drop(out);
    let status = child.wait()?;
    // Failed once, passed alone: flaky, said by name; the run passes.
    let mut flaky = Vec::new();
    let mut passed = status.success();
    if !passed && let Some(suites) = failures.retriable(&integration_sources()) {
        println!("xtask test: running the {} failed test(s) once more, alone", failures.failed.len());
        passed = true;
        for (suite, names) in &suites {
            if retry(suite, names)? {
                flaky.extend(names.iter().map(|n| format!("{suite}::{n}")));
            } else {
                passed = false;
            }
        }
    }
    // The install artifacts (`cargo xtask dist`), built beside the tests on
    // full runs, checked now: their PASS/FAIL lines count as tests in the summary.
    let dist = match (dist_build, dist_plan) {
        (Some(build), _) => Some(build.finish()),
        (None, Err(why)) => {
            println!("{why}");
            None
        }
        (None, Ok(())) => None,
    };
    let dist_failed = dist.as_ref().is_some_and(|d| d.failed > 0);
    if let Some(d) = &dist {
        totals.suites += 1;
        totals.passed += d.passed;
        totals.failed += d.failed;
        totals.ignored += d.skipped;
    }
    let secs = started.elapsed().as_secs();

    println!();
    if totals.suites == 0 {
        if status.success() {
            println!("xtask test: no test suite ran ({secs}s)");
            return Ok(());
        }
        bail!("cargo test failed before any test ran ({status}, {secs}s)");
    }
    passed &= !dist_failed;
    // The matrix runs what a node installs: the static binary just built and
    // checked by the dist step (the release build when that step did not run).
    let artifact = dist.as_ref().and_then(|d| d.binary.clone()).filter(|b| b.is_file());
    let vm = kernel_matrix(matrix, artifact, prefetch, &mut totals, &mut digest);
    let secs = started.elapsed().as_secs();
    let tests_passed = passed;
    let passed = passed && vm;
    let verdict = if passed { "ok" } else { "FAILED" };
    println!(
        "xtask test: {verdict}: {} suites in {secs}s (ignored tests are counted as skipped; \
         root-only tests print \"skipped: needs root\" when not root)",
        totals.suites
    );
    digest.print();
    if passed && !flaky.is_empty() {
        println!("FLAKY (failed, then passed alone): {}", flaky.join(", "));
    }
    println!("summary: {} passed, {} failed, {} skipped", totals.passed, totals.failed, totals.ignored);
    if !passed {
        // The summary line above is the last word; just exit like cargo test did.
        let code = if tests_passed { 1 } else { status.code().filter(|&c| c != 0).unwrap_or(101) };
        std::process::exit(code);
    }
    Ok(())
}

/// The kernels the matrix is to run (empty: all), from HYSTALL_VM and
/// whether a test filter is given: None when it does not run, Err (the
/// line to print) for a list that does not parse.
fn matrix_kernels(args: &[String]) -> Option<Result<Vec<Kernel>, String>> {
    match std::env::var("HYSTALL_VM").as_deref() {
        Ok("0") => None,
        Ok("1") => Some(Ok(Vec::new())),
        // A list of kernels: those only, even with a filter.
        Ok(list) if !list.is_empty() => Some(
            list.split(',')
                .map(|k| k.trim().parse::<Kernel>().map_err(|e| format!("xtask test: HYSTALL_VM={list}: {e}")))
                .collect(),
        ),
        // A filtered run is someone after a few tests, not the matrix.
        _ if !args.is_empty() => None,
        _ => Some(Ok(Vec::new())),
    }
}

/// Fetches the matrix's guest kernels (`cargo xtask vm-fetch`) beside the
/// tests; None when it cannot start (the matrix then fetches them itself).
fn start_prefetch(guests: &[Kernel]) -> Option<Background> {
    let mut args = vec!["vm-fetch"];
    for k in guests {
        args.extend(["--kernel", k.label()]);
    }
    Background::start("vm", &args, &sh::target_dir().join("vm-fetch.log"))
        .map_err(|e| println!("vm: cannot fetch the kernels beside the tests ({e:#}); the matrix will"))
        .ok()
}

/// The kernel matrix after the tests (`matrix`: its kernels, as
/// `matrix_kernels` gives them), its checks added to `totals`; false
/// when it failed (a check, or, in CI, not being able to run at all).
/// `prefetch`, the fetch of its kernels begun with the tests, is waited for
/// first: the matrix's own fetch uses the same cache.
fn kernel_matrix(
    matrix: Option<Result<Vec<Kernel>, String>>,
    bin: Option<PathBuf>,
    prefetch: Option<Background>,
    totals: &mut Totals,
    digest: &mut Digest,
) -> bool {
    let kernels = match matrix {
        None => return true,
        Some(Err(line)) => {
            println!("{line}");
            totals.failed += 1;
            return false;
        }
        Some(Ok(kernels)) => kernels,
    };
    let matrix_args = crate::vm::Args { bin, kernels, ..Default::default() };
    println!();
    println!("xtask test: the kernel matrix (cargo xtask vm; HYSTALL_VM=0 skips it)");
    if let Some(p) = prefetch
        && p.finish().is_err()
    {
        println!("vm: the matrix fetches the kernels itself (and says why one cannot be had)");
    }
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    match crate::vm::matrix(&matrix_args) {
        Ok(o) => {
            totals.passed += o.passed;
            totals.failed += o.failed;
            for line in o.failures {
                if digest.lines.len() < Digest::MAX_LINES {
                    digest.lines.push(line);
                }
            }
            o.failed == 0
        }
        Err(e) if ci => {
            println!("xtask test: the kernel matrix cannot run: {e:#}");
            totals.failed += 1;
            false
        }
        Err(e) => {
            println!("xtask test: kernel matrix skipped: {e:#}");
            totals.ignored += 1;
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_few_integration_test_failures_are_retried_by_suite() {
        let sources = vec![
            ("node_scale".to_owned(), "#[test]\nfn twenty_clients() {}\n#[test]\nfn three_clients() {}".to_owned()),
            ("decrypt_e2e".to_owned(), "#[test]\nfn four_stalled() {}\nfn helper() {}".to_owned()),
            ("other".to_owned(), "fn helper() {}".to_owned()),
        ];
        let mut f = Failures::default();
        for l in [
            "test core::x ... ok",
            "test twenty_clients ... FAILED",
            "test three_clients ... FAILED",
            "test four_stalled ... FAILED",
        ] {
            f.add(l);
        }
        assert_eq!(
            f.retriable(&sources),
            Some(vec![
                ("node_scale".to_owned(), vec!["twenty_clients".to_owned(), "three_clients".to_owned()]),
                ("decrypt_e2e".to_owned(), vec!["four_stalled".to_owned()]),
            ])
        );
        // A unit or doc test, a name two suites define, or too many
        // failures: never retried.
        for name in ["core::x::tests::y", "src/lib.rs - x (line 3)", "helper"] {
            let mut g = Failures::default();
            g.add(&format!("test {name} ... FAILED"));
            assert_eq!(g.retriable(&sources), None, "{name}");
        }
        f.add("test twenty_clients ... FAILED");
        assert_eq!(f.retriable(&sources), None);
        // The real suites are found.
        assert!(integration_sources().iter().any(|(stem, _)| stem == "node_scale"));
    }

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
