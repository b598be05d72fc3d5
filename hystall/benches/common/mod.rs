//! What the overhead benchmarks (`probe_overhead`, `tc_overhead`) share: the
//! settings, the root check, the interleaved rounds, the detection of someone
//! else's probes, and the helpers of their figures and report tables.

use std::thread;
use std::time::{Duration, Instant};

use hystall::core::event::ProbeStatus;

/// Rounds of a full run (`--bench`); a run without it does one short round.
const ROUNDS: usize = 5;
/// Wall time per workload and round of a full run when `HYSTALL_BENCH_SECS` is unset.
const DEFAULT_SECS: f64 = 1.0;
/// The same for a run without `--bench`.
const SHORT_SECS: f64 = 0.1;

/// The names (as the kernel truncates them) of hystall's tracepoint and kprobe
/// programs.
pub const PROBE_NAMES: [&str; 6] =
    ["sock_send_lengt", "inet_sock_set_s", "tcp_probe", "tcp_destroy_soc", "sys_enter", "sys_exit"];

/// How long and how often to measure.
pub struct Settings {
    /// The benchmark's name, which starts its messages.
    pub bench: &'static str,
    /// Seconds per workload and round, as given.
    pub secs: f64,
    pub rounds: usize,
    /// `secs` as a duration.
    pub round_time: Duration,
}

/// Whether we run as root; prints `skipped: needs root` when not.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: needs root");
    }
    root
}

/// The settings from the command line and `HYSTALL_BENCH_SECS`; exits with 2
/// (naming `bench`) when that is not a positive number of seconds.
pub fn settings(bench: &'static str) -> Settings {
    let full = std::env::args().any(|a| a == "--bench");
    let secs = match std::env::var("HYSTALL_BENCH_SECS") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => s,
            _ => {
                eprintln!("{bench}: HYSTALL_BENCH_SECS={v:?} is not a positive number of seconds");
                std::process::exit(2);
            }
        },
        Err(_) if full => DEFAULT_SECS,
        Err(_) => SHORT_SECS,
    };
    let rounds = if full { ROUNDS } else { 1 };
    Settings { bench, secs, rounds, round_time: Duration::from_secs_f64(secs) }
}

/// The programs that did not attach, with why: `name (note); ...`, or `None`
/// when all did.
pub fn not_attached(status: &[ProbeStatus]) -> Option<String> {
    let missing: Vec<String> = status
        .iter()
        .filter(|s| !s.attached)
        .map(|s| format!("{} ({})", s.name, s.note.as_deref().unwrap_or("?")))
        .collect();
    (!missing.is_empty()).then(|| missing.join("; "))
}

/// The CPUs this process may run on (0 when unknown).
pub fn cpus() -> usize {
    thread::available_parallelism().map_or(0, |n| n.get())
}

/// The order of the `modes` modes in `round`: ABC in even rounds, CBA in odd
/// ones, so that a linear drift of the machine weighs on every mode alike.
pub fn round_order(round: usize, modes: usize) -> Vec<usize> {
    if round.is_multiple_of(2) { (0..modes).collect() } else { (0..modes).rev().collect() }
}

/// Prints one round's figures to stderr, in mode order (the report has only
/// medians): `{bench}: round 2/5 (9 s): {what}udp: detached 1.2k/s, ...; udp64: ...`,
/// with `rate(m, w)` the round's rate of mode `m` and workload `w`.
pub fn print_round(
    settings: &Settings,
    round: usize,
    started: Instant,
    what: &str,
    workloads: &[&str],
    modes: &[&str],
    rate: impl Fn(usize, usize) -> f64,
) {
    let line: Vec<String> = workloads
        .iter()
        .enumerate()
        .map(|(w, workload)| {
            let per_mode: Vec<String> =
                modes.iter().enumerate().map(|(m, mode)| format!("{mode} {}", per_sec(rate(m, w)))).collect();
            format!("{workload}: {}", per_mode.join(", "))
        })
        .collect();
    eprintln!(
        "{}: round {}/{} ({:.0} s): {what}{}",
        settings.bench,
        round + 1,
        settings.rounds,
        started.elapsed().as_secs_f64(),
        line.join("; ")
    );
}

/// Loaded programs whose names start with one of `names`.
pub fn loaded_programs(names: &[&str]) -> usize {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str().is_some_and(|n| names.iter().any(|want| n.starts_with(want))))
        .count()
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// 1.23M/s, 456.7k/s.
pub fn per_sec(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2}M/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k/s", r / 1e3)
    } else {
        format!("{r:.0}/s")
    }
}

/// The report table's header cells from the rate column on: `rate`, min, max,
/// ratio, paired and `added` (the +ns column, `added_width` wide).
pub fn header_cells(rate: &str, added: &str, added_width: usize) -> String {
    format!("{rate:>11} {:>11} {:>11} {:>7} {:>7} {added:>added_width$}", "min", "max", "ratio", "paired")
}

/// The report table's cells from the rate column on, for one mode's per-round
/// `rates` against the `detached` ones of the same rounds: median, min, max;
/// ratio of the medians; paired: median over rounds of (this mode / detached)
/// in the same round, which a drift of the machine between rounds does not
/// move; the nanoseconds added to each operation, from the medians
/// (`added_width` wide).
pub fn stats_cells(rates: &[f64], detached: &[f64], added_width: usize) -> String {
    let med = median(rates);
    let base = median(detached);
    let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let max = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let paired: Vec<f64> = rates.iter().zip(detached).map(|(a, d)| a / d).collect();
    format!(
        "{:>11} {:>11} {:>11} {:>7.3} {:>7.3} {:>added_width$.0}",
        per_sec(med),
        per_sec(min),
        per_sec(max),
        med / base,
        median(&paired),
        1e9 / med - 1e9 / base
    )
}

/// The report's closing lines: per workload, each attached mode's median rate
/// to the `detached` one (mode `base`), as
/// `ratio {workload}_{unit} {mode}: 0.95 (detached ..., attached ...)`.
pub fn print_ratios(workloads: &[&str], modes: &[&str], base: usize, unit: &str, rates: impl Fn(usize, usize) -> f64) {
    for (w, workload) in workloads.iter().enumerate() {
        let detached = rates(base, w);
        for (m, mode) in modes.iter().enumerate().filter(|&(m, _)| m != base) {
            let attached = rates(m, w);
            println!(
                "ratio {workload}_{unit} {mode}: {:.2} (detached {}, attached {})",
                attached / detached,
                per_sec(detached),
                per_sec(attached)
            );
        }
    }
}

/// In-kernel cost of each program over `run`: BPF run-time statistics on
/// (they add two clock reads per program run on the whole machine, so this
/// is measured apart from the ratio rounds), the programs' run time and run
/// count before and after, and the ns per run of those that ran.
pub fn kernel_ns(probes: &hystall::sources::kernel::probes::Probes, run: impl FnOnce()) -> Vec<(String, f64, u64)> {
    let guard = hystall::sources::kernel::probes::stats::StatsGuard::enable();
    if !guard.enabled() {
        println!("note: BPF statistics unavailable: {}", guard.error.as_deref().unwrap_or("?"));
        return Vec::new();
    }
    let before = probes.prog_stats();
    run();
    let after = probes.prog_stats();
    drop(guard);
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.program == a.program)?;
            let n = a.run_count.saturating_sub(b.run_count);
            let t = a.run_time.saturating_sub(b.run_time).as_nanos() as f64;
            (n > 0).then(|| (a.program.clone(), t / n as f64, n))
        })
        .collect()
}

/// Prints `kernel_ns` figures for one workload and mode.
pub fn print_kernel_ns(label: &str, figures: &[(String, f64, u64)]) {
    let cells: Vec<String> = figures.iter().map(|(p, ns, n)| format!("{p} {ns:.0} ns ({n} runs)")).collect();
    println!("  {label}: {}", if cells.is_empty() { "no runs".to_owned() } else { cells.join(", ") });
}
