//! `cargo xtask build`: the release binary. hystall's build.rs compiles the eBPF
//! programs (nightly + rust-src + bpf-linker, which `setup` provides).

use crate::sh;

pub fn build_release() -> anyhow::Result<()> {
    println!("build: release binary {}", sh::release_binary().display());
    sh::run(sh::cargo().args(["build", "--release", "-p", "hystall"]))
}
