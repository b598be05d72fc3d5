//! `cargo xtask dist`: what a node installs without a toolchain, in target/dist/:
//!
//! - `hystall-VERSION-x86_64-linux`: one static binary with the eBPF programs
//!   inside, which runs on any x86_64 Linux whatever its libc (`binary.rs`);
//! - `hystall_VERSION_amd64.deb`: that binary, the systemd unit, its options
//!   file and the service user (`deb.rs`);
//! - `SHA256SUMS` of both (`sha256sum -c SHA256SUMS` there).
//!
//! Then it checks them (`check.rs`), as a full `cargo xtask test` does.
//!
//! A full `cargo xtask test` builds them while its tests run (`start_test_build`:
//! the hidden `cargo xtask dist-build`, at SCHED_IDLE priority, so that it takes
//! only the CPU the tests leave idle; crate::background), in cargo's own folder
//! target/dist-build (`build_dir`), and checks them after the tests
//! (`TestBuild::finish`). The artifacts go to target/dist/ either way.

mod binary;
mod check;
mod deb;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::background::Background;
use crate::{setup, sh};

pub use binary::TARGET;
pub use check::Report;

/// The workspace version (xtask's own is `version.workspace = true`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where the artifacts of this version go.
struct Artifacts {
    dir: PathBuf,
    binary: PathBuf,
    deb: PathBuf,
    sums: PathBuf,
}

impl Artifacts {
    fn new() -> Self {
        let dir = sh::target_dir().join("dist");
        Artifacts {
            binary: dir.join(format!("hystall-{VERSION}-x86_64-linux")),
            deb: dir.join(format!("hystall_{}_{}.deb", deb::version(VERSION), deb::ARCH)),
            sums: dir.join("SHA256SUMS"),
            dir,
        }
    }
}

pub fn dist() -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet, setup::Scope::Dist)?;
    let started = Instant::now();
    let artifacts = build()?;
    println!("dist: built in {}s", started.elapsed().as_secs());
    let report = check::check(&artifacts);
    if report.failed > 0 {
        bail!("{} check(s) of the artifacts failed (the FAIL lines above)", report.failed);
    }
    for path in [&artifacts.binary, &artifacts.deb, &artifacts.sums] {
        let size = path.metadata().map(|m| m.len()).unwrap_or(0);
        println!("dist: {} ({:.1} MiB)", path.display(), size as f64 / (1024.0 * 1024.0));
    }
    Ok(())
}

/// Cargo's target folder for the static build (binary.rs says why its own).
pub fn build_dir() -> PathBuf {
    sh::target_dir().join("dist-build")
}

/// `cargo xtask dist-build` (hidden): builds the artifacts, no set-up, no
/// checks; what a full `cargo xtask test` runs beside its tests, having set up.
pub fn build_only() -> anyhow::Result<()> {
    let started = Instant::now();
    build()?;
    println!("dist: built in {}s", started.elapsed().as_secs());
    Ok(())
}

/// Whether a `cargo xtask test` with these ARGS builds and checks the
/// artifacts (CI's full run does): Err(the line that says why not). A
/// filtered run (any ARGS) does not.
pub fn test_builds(args: &[String]) -> Result<(), &'static str> {
    if !args.is_empty() {
        return Err("dist: not built (a filtered run; a full `cargo xtask test` builds and checks it)");
    }
    if std::env::var_os("HYSTALL_SKIP_DIST").is_some_and(|v| !v.is_empty()) {
        return Err("dist: skipped (HYSTALL_SKIP_DIST is set)");
    }
    Ok(())
}

/// The dist step of a full `cargo xtask test`, under way: its build runs
/// beside the tests (`cargo xtask dist-build`, at idle priority, output to
/// target/dist-build.log); `finish` then checks the artifacts.
pub struct TestBuild {
    job: anyhow::Result<Background>,
}

/// Starts the build (once the tests are compiled: it would slow that down).
pub fn start_test_build() -> TestBuild {
    let log = sh::target_dir().join("dist-build.log");
    TestBuild { job: Background::start("dist", &["dist-build"], &log) }
}

impl TestBuild {
    /// Waits for the build, then checks the artifacts; the PASS/FAIL lines
    /// count in the closing summary.
    pub fn finish(self) -> Report {
        println!("\ndist: the install artifacts (built as `cargo xtask dist` does, beside the tests): checking them");
        let report = match self.job.and_then(Background::finish) {
            Ok(()) => check::check(&Artifacts::new()),
            Err(e) => {
                let mut report = Report::default();
                report.record("build (`cargo xtask dist`)", Err(e));
                report
            }
        };
        println!("dist: {} passed, {} failed, {} skipped", report.passed, report.failed, report.skipped);
        report
    }
}

fn build() -> anyhow::Result<Artifacts> {
    let artifacts = Artifacts::new();
    let built = binary::build()?;
    // A fresh folder: SHA256SUMS then names all that is there, no older version's files.
    if artifacts.dir.exists() {
        std::fs::remove_dir_all(&artifacts.dir).with_context(|| format!("cannot empty {}", artifacts.dir.display()))?;
    }
    std::fs::create_dir_all(&artifacts.dir).with_context(|| format!("cannot create {}", artifacts.dir.display()))?;
    std::fs::copy(&built, &artifacts.binary)
        .with_context(|| format!("cannot copy {} to {}", built.display(), artifacts.binary.display()))?;
    deb::build(&artifacts.binary, &artifacts.deb)?;
    write_sums(&artifacts)?;
    Ok(artifacts)
}

/// SHA256SUMS in `sha256sum` format, with bare names, so that `sha256sum -c`
/// works in the folder they are downloaded to.
fn write_sums(artifacts: &Artifacts) -> anyhow::Result<()> {
    let names = [&artifacts.binary, &artifacts.deb].map(|p| file_name(p));
    let out = Command::new("sha256sum")
        .args(names)
        .current_dir(&artifacts.dir)
        .output()
        .context("cannot run sha256sum (coreutils)")?;
    if !out.status.success() {
        bail!("sha256sum failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    std::fs::write(&artifacts.sums, &out.stdout).with_context(|| format!("cannot write {}", artifacts.sums.display()))
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
