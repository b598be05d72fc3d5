//! `cargo xtask clippy`: lints the whole workspace, warnings as errors. Release
//! profile, so the eBPF object built by hystall's build.rs is shared with
//! `build`, `run` and `test`. The kernel programs (`hystall-ebpf`) are left out:
//! they only build for the BPF target (hystall's build.rs compiles them, where
//! rustc's own lints apply); on the host their panic handler meets std.

use crate::{setup, sh};

pub fn clippy() -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet, setup::Scope::All)?;
    sh::run(sh::cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "hystall-ebpf",
        "--all-targets",
        "--release",
        "--",
        "-D",
        "warnings",
    ]))
}
