//! The static binary: `cargo rustc` for x86_64-unknown-linux-musl.
//!
//! Why musl rather than glibc with `+crt-static`: hystall resolves host names
//! (ureq reaches `--hysteria-api URL`, `--clash-api`, and the Clash API found
//! in a sing-box or mihomo config, e.g. `localhost:9090`). A static glibc does
//! that through NSS, which dlopen()s the node's own libnss_*.so at run time and
//! breaks when they come from another glibc version; musl reads /etc/hosts and
//! /etc/resolv.conf itself. musl's allocator is slower than glibc's under
//! threads, but at node scale (10 000 connections, 500 new a second, 1 000
//! targets) the watcher took the same CPU (3.5 % vs 3.4 % of a core) and less
//! RSS (63 vs 85 MiB): docs/SERVICE.md, "The static binary".
//!
//! `-C relocation-model=static`, given to the binary only (`cargo rustc`, so the
//! dependencies are the ones `cargo build --target` makes), links a plain static
//! executable instead of a static PIE: no dynamic section at all (a static PIE
//! keeps one for relocating itself), at the price of a fixed load address for
//! the code (stack, heap and mappings are still randomized).
//!
//! `--target` keeps build scripts and proc-macros on the host target, so
//! hystall's build.rs still builds the eBPF object with aya-build (it passes its
//! own `--target bpfel-unknown-none` and flags to its inner cargo).
//!
//! In its own target folder, target/dist-build (`super::build_dir`): a full
//! `cargo xtask test` builds it while its tests run, and cargo locks a target
//! folder while it builds in it (with `--target`, the host's `release` folder
//! too, where build scripts and proc-macros go), so that in the shared one the
//! tests' own cargo (the retry of a failed test) would wait for this build.

use std::path::PathBuf;

use crate::sh;

pub const TARGET: &str = "x86_64-unknown-linux-musl";

/// Builds the binary; its path in cargo's target folder.
pub fn build() -> anyhow::Result<PathBuf> {
    println!("dist: static binary for {TARGET}");
    let dir = super::build_dir();
    sh::run(
        sh::cargo()
            .args(["rustc", "--release", "-p", "hystall", "--bin", "hystall", "--target", TARGET, "--target-dir"])
            .arg(&dir)
            .args(["--", "-C", "relocation-model=static"]),
    )?;
    Ok(dir.join(TARGET).join("release").join("hystall"))
}
