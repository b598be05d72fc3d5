//! `cargo xtask clippy`: lints the whole workspace, warnings as errors. Release
//! profile, so the eBPF object built by hystall's build.rs is shared with
//! `build`, `run` and `test`.

use crate::{setup, sh};

pub fn clippy() -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet)?;
    sh::run(sh::cargo().args(["clippy", "--workspace", "--all-targets", "--release", "--", "-D", "warnings"]))
}
