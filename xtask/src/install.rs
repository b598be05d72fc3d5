//! `cargo xtask install`: build the release binary and install it as
//! /usr/local/bin/hystall (through sudo when not root), then the systemd unit
//! and what it needs (`service.rs`). Leaves identical files untouched.

use anyhow::{Context as _, bail};

use crate::{build, service, setup, sh};

const DEST: &str = "/usr/local/bin/hystall";

pub fn install() -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet, setup::Scope::Run)?;
    build::build_release()?;
    let binary = sh::release_binary();
    let new = std::fs::read(&binary).with_context(|| format!("cannot read {}", binary.display()))?;
    if std::fs::read(DEST).is_ok_and(|old| old == new) {
        println!("install: {DEST} is already up to date");
    } else {
        let Some(mut cmd) = sh::as_root("install") else {
            bail!("not root and no sudo: as root, run `install -m 0755 {} {DEST}`", binary.display());
        };
        println!("install: {} -> {DEST}", binary.display());
        sh::run(cmd.args(["-D", "-m", "0755"]).arg(&binary).arg(DEST))?;
    }
    service::install_service()?;
    println!("install: done; try `sudo hystall doctor` (deployment: docs/SERVICE.md)");
    Ok(())
}
