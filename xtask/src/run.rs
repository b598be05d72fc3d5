//! `cargo xtask run -- ARGS`: set up (quietly), build, then become
//! `target/release/hystall ARGS`, through `sudo -E` when not root. The process is
//! replaced (exec), so stdin, the tty, signals and the exit code are hystall's own.

use std::os::unix::process::CommandExt as _;
use std::process::Command;

use anyhow::bail;

use crate::{build, setup, sh};

pub fn run(args: &[String]) -> anyhow::Result<()> {
    setup::setup(setup::Verbosity::Quiet, setup::Scope::Run)?;
    build::build_release()?;
    let binary = sh::release_binary();
    let mut cmd = if sh::is_root() {
        Command::new(&binary)
    } else if sh::which("sudo").is_some() {
        let mut cmd = Command::new("sudo");
        cmd.arg("-E").arg(&binary);
        cmd
    } else {
        println!("run: not root and no sudo: hystall will lack the rights to load its probes");
        Command::new(&binary)
    };
    cmd.args(args);
    println!("$ {}", sh::display(&cmd));
    let err = cmd.exec(); // returns only on failure
    bail!("cannot run {}: {err}", binary.display())
}
