//! `cargo xtask vm`: the kernel matrix. Debian's kernels (5.10, 6.1, 6.1-rt,
//! 6.12) boot under qemu with the host's root read-only over 9p and run the
//! check set as root inside; `host` runs the same checks on this machine as
//! the control. One line per check per kernel, then two tables (verdicts;
//! probe path and stall → quic_starved latency, in markdown).
//!
//! - kernels.rs: which package each kernel is today; download and unpack.
//! - guest.rs: staging a run's folder, the initramfs, qemu, the host run.
//! - checks.rs: judging what the checks left (`watch --json` events).
//! - report.rs: the lines and the tables.
//! - xtask/vm/: the scripts that run in the guest (embedded at build time).
//!
//! A `cargo xtask test` that will run the matrix fetches its kernels while its
//! tests run (`fetch_only`, as the hidden `cargo xtask vm-fetch`, at SCHED_IDLE
//! priority: crate::background), and waits for that before the matrix, whose
//! own fetch then finds them in the cache.

mod checks;
mod guest;
mod kernels;
mod report;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::{setup, sh};
pub use kernels::Kernel;

#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Kernels to run, repeatable: 5.10, 6.1, 6.1-rt, 6.12, host (default: all).
    #[arg(long = "kernel", value_name = "K")]
    pub kernels: Vec<Kernel>,
    /// The hystall binary under test (default: target/release/hystall, built if missing).
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,
    /// Keep every kernel's run folder (console log, each check's output) under DIR/KERNEL
    /// (default: target/vm-logs/KERNEL, kept only for a kernel with a failed check).
    #[arg(long, value_name = "DIR")]
    pub keep_logs: Option<PathBuf>,
}

/// The matrix's count, for `cargo xtask test`'s summary.
pub struct Outcome {
    pub passed: u64,
    pub failed: u64,
    /// The FAIL lines, as printed.
    pub failures: Vec<String>,
}

/// `cargo xtask vm`: fails when a check fails.
pub fn vm(args: &Args) -> anyhow::Result<()> {
    let o = matrix(args)?;
    println!("vm: {} passed, {} failed", o.passed, o.failed);
    if o.failed > 0 {
        bail!("{} check(s) failed", o.failed);
    }
    Ok(())
}

/// Runs the matrix; Err only when it cannot run at all (no root, no qemu).
pub fn matrix(args: &Args) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    if !sh::is_root() {
        bail!("the kernel matrix needs root (its checks load eBPF programs): run it with sudo -E");
    }
    ensure_tools()?;
    let bin = binary(args.bin.as_deref())?;
    // The check fails (saying why) rather than the whole matrix.
    let sing_box = setup::sing_box_binary().map_err(|e| println!("vm: no sing-box ({e:#}): its check will fail")).ok();
    let kernels = asked(&args.kernels);
    let logs = match &args.keep_logs {
        Some(dir) => dir.clone(),
        None => sh::target_dir().join("vm-logs"),
    };
    println!(
        "vm: {} on {} ({})",
        bin.display(),
        kernels.iter().map(|k| k.label()).collect::<Vec<_>>().join(", "),
        logs.display()
    );

    // Guests first, `jobs()` at a time (each TCG guest is one host thread),
    // their kernels fetched one at a time before (apt); the host's run
    // after, alone (its checks time the machine itself).
    let guests = guests(&kernels);
    let mut queue: std::collections::VecDeque<(Kernel, anyhow::Result<kernels::Unpacked>)> =
        guests.iter().map(|&k| (k, kernels::fetch(k))).collect();
    let queue = std::sync::Mutex::new(std::mem::take(&mut queue));
    let done = std::sync::Mutex::new(Vec::new());
    // A row's lines together, whichever guest ends first.
    let print = std::sync::Mutex::new(());
    let jobs = jobs().min(guests.len().max(1));
    if jobs > 1 {
        println!("vm: {jobs} guests at a time (HYSTALL_VM_JOBS)");
    }
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let Some((k, fetched)) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                        break;
                    };
                    let row = run_one(k, Some(fetched), &bin, sing_box.as_deref(), &logs.join(k.label()));
                    {
                        let _one = print.lock().unwrap_or_else(|e| e.into_inner());
                        report::print_row(&row);
                    }
                    done.lock().unwrap_or_else(|e| e.into_inner()).push(row);
                }
            });
        }
    });
    let mut rows = done.into_inner().unwrap_or_else(|e| e.into_inner());
    if kernels.contains(&Kernel::Host) {
        let row = run_one(Kernel::Host, None, &bin, sing_box.as_deref(), &logs.join(Kernel::Host.label()));
        report::print_row(&row);
        rows.push(row);
    }
    // The tables in the order asked.
    rows.sort_by_key(|r| kernels.iter().position(|k| *k == r.kernel));
    if args.keep_logs.is_none() {
        // Only what failed is worth reading afterwards.
        for row in &rows {
            if row.checks.iter().all(|c| c.pass) {
                let _ = std::fs::remove_dir_all(logs.join(row.kernel.label()));
            }
        }
    }
    report::print_tables(&rows, started.elapsed().as_secs());
    if rows.iter().any(|r| r.kernel != Kernel::Host) && !guest::kvm() {
        println!(
            "(the guests ran under TCG, no usable KVM here: their times are those of an emulated CPU, \
             upper bounds of a real machine's)"
        );
    }
    let passed = rows.iter().flat_map(|r| &r.checks).filter(|c| c.pass).count() as u64;
    let failed = rows.iter().flat_map(|r| &r.checks).filter(|c| !c.pass).count() as u64;
    let failures = rows.iter().flat_map(report::failure_lines).collect();
    Ok(Outcome { passed, failed, failures })
}

/// The kernels run when `kernels` are asked for (all when none), each once:
/// two runs of one would share its folder.
fn asked(kernels: &[Kernel]) -> Vec<Kernel> {
    let from = if kernels.is_empty() { &Kernel::ALL[..] } else { kernels };
    let mut out = Vec::new();
    for k in from {
        if !out.contains(k) {
            out.push(*k);
        }
    }
    out
}

/// The kernels booted under qemu when `kernels` are asked for (all when
/// none), each once.
pub fn guests(kernels: &[Kernel]) -> Vec<Kernel> {
    asked(kernels).into_iter().filter(|k| *k != Kernel::Host).collect()
}

/// `cargo xtask vm-fetch --kernel K...` (hidden): downloads and unpacks those
/// kernels into the cache (`kernels::fetch`, the matrix's first step), no
/// set-up; Err when one could not be had (the matrix then tries again, and
/// says why).
pub fn fetch_only(kernels: &[Kernel]) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for k in guests(kernels) {
        match kernels::fetch(k) {
            Ok(u) => println!("vm: {k}: {} ({}) is in {}", u.package, u.release, u.root.display()),
            Err(e) => {
                println!("vm: {k}: cannot fetch it: {e:#}");
                failed.push(k.label());
            }
        }
    }
    if !failed.is_empty() {
        bail!("cannot fetch {}", failed.join(", "));
    }
    Ok(())
}

/// Guests run at once: HYSTALL_VM_JOBS, else 2 where single-threaded TCG
/// runs each on one host thread and the machine has two cores or more
/// (under KVM or multi-threaded TCG a guest uses both: one at a time).
fn jobs() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let one_thread = !guest::kvm() && std::env::var("HYSTALL_VM_TCG").map_or(true, |v| v != "multi");
    let default = if one_thread { cores.min(2) } else { 1 };
    std::env::var("HYSTALL_VM_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(default).max(1)
}

/// One kernel's run (`fetched`: its package, None for the host), judged.
/// Never fails: a kernel that cannot be fetched or booted fails each of its
/// checks, saying why.
fn run_one(
    kernel: Kernel,
    fetched: Option<anyhow::Result<kernels::Unpacked>>,
    bin: &Path,
    sing_box: Option<&Path>,
    out: &Path,
) -> report::Row {
    let started = Instant::now();
    let mut row = report::Row::new(kernel);
    let ran = (|| -> anyhow::Result<guest::Ran> {
        guest::stage(out, bin, sing_box)?;
        if kernel == Kernel::Host {
            row.release = host_release();
            return guest::run_host(out);
        }
        let k = match fetched {
            Some(f) => f?,
            None => kernels::fetch(kernel)?,
        };
        row.release = k.release.clone();
        println!("vm: {kernel}: booting {} ({}) under qemu", k.package, k.release);
        guest::run_guest(&k, out)
    })();
    let broken = match &ran {
        Ok(r) => {
            println!("vm: {kernel}: checks ran in {:.0} s", r.secs);
            r.broken.clone()
        }
        Err(e) => Some(format!("{e:#}")),
    };
    // The copies of hystall and sing-box (70 MB) are of no use afterwards.
    let _ = std::fs::remove_dir_all(out.join("bin"));
    let (checks, figures) = checks::judge(out, broken.as_deref());
    row.checks = checks;
    row.figures = figures;
    row.secs = started.elapsed().as_secs_f64();
    if let Some(b) = broken {
        println!("vm: {kernel}: {b}");
    }
    row
}

fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "?".into(), |s| s.trim().to_owned())
}

/// The binary under test: --bin, or the release binary (built when missing).
fn binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        if !sh::is_executable(p) {
            bail!("--bin {}: not an executable file", p.display());
        }
        return std::fs::canonicalize(p).with_context(|| format!("--bin {}", p.display()));
    }
    let release = sh::release_binary();
    if !release.exists() {
        println!("vm: {} is missing: building it", release.display());
        crate::build::build_release()?;
    }
    Ok(release)
}

/// qemu, a static busybox (the initramfs's shell), kmod (modprobe/depmod on
/// the unpacked trees), cpio, xz and zstd (compressed modules): installed when
/// missing, as `setup` does. Err, in one line, when they cannot be had.
fn ensure_tools() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for (tool, pkg) in [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("modprobe", "kmod"),
        ("depmod", "kmod"),
        ("cpio", "cpio"),
        ("xz", "xz-utils"),
        ("zstd", "zstd"),
        ("dpkg-deb", "dpkg"),
    ] {
        if setup::tool(tool).is_none() && !missing.contains(&pkg) {
            missing.push(pkg);
        }
    }
    // Debian's `busybox` package is dynamically linked: no use in an initramfs.
    let static_busybox =
        sh::probe(std::process::Command::new("dpkg-query").args(["-W", "-f=${Status}", "busybox-static"]))
            .is_some_and(|s| s.contains("install ok installed"));
    if !static_busybox {
        missing.push("busybox-static");
    }
    if missing.is_empty() {
        return Ok(());
    }
    println!("vm: installing {}", missing.join(" "));
    setup::apt_get_install(&missing)
        .context("the kernel matrix cannot run: qemu and its helpers could not be installed")
}
