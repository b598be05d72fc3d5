//! `cargo xtask install`, service part: the systemd unit, its default options
//! file, the system user it runs as, and a daemon-reload when systemd runs.
//! Each step says what it did or why it did nothing, so a re-run is harmless.

use std::path::Path;
use std::process::Command;

use anyhow::bail;

use crate::sh;

const UNIT_SRC: &str = "deploy/systemd/hystall.service";
const UNIT_DEST: &str = "/etc/systemd/system/hystall.service";
const DEFAULT_SRC: &str = "deploy/systemd/hystall.default";
const DEFAULT_DEST: &str = "/etc/default/hystall";
const USER: &str = "hystall";

pub fn install_service() -> anyhow::Result<()> {
    let root = sh::workspace_root();
    copy_if_changed(&root.join(UNIT_SRC), UNIT_DEST, "0644")?;
    if Path::new(DEFAULT_DEST).exists() {
        println!("install: {DEFAULT_DEST} exists, kept as it is");
    } else {
        copy_if_changed(&root.join(DEFAULT_SRC), DEFAULT_DEST, "0644")?;
    }
    ensure_user()?;
    if Path::new("/run/systemd/system").is_dir() {
        sh::run(root_cmd("systemctl")?.arg("daemon-reload"))?;
        println!("install: start it with `systemctl enable --now hystall` (options in {DEFAULT_DEST})");
    } else {
        println!("install: systemd is not running here: no daemon-reload; the unit is ready for a systemd host");
    }
    Ok(())
}

fn root_cmd(program: &str) -> anyhow::Result<Command> {
    match sh::as_root(program) {
        Some(cmd) => Ok(cmd),
        None => bail!("not root and no sudo: run `cargo xtask install` as root"),
    }
}

/// `install -D -m MODE SRC DEST`, unless DEST already has the same bytes.
fn copy_if_changed(src: &Path, dest: &str, mode: &str) -> anyhow::Result<()> {
    let new = std::fs::read(src).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", src.display()))?;
    if std::fs::read(dest).is_ok_and(|old| old == new) {
        println!("install: {dest} is already up to date");
        return Ok(());
    }
    sh::run(root_cmd("install")?.args(["-D", "-m", mode]).arg(src).arg(dest))
}

/// The system user the unit runs as (no home, no login shell).
fn ensure_user() -> anyhow::Result<()> {
    let exists = Command::new("id").args(["-u", USER]).output().is_ok_and(|o| o.status.success());
    if exists {
        println!("install: user {USER} exists");
        return Ok(());
    }
    let nologin =
        ["/usr/sbin/nologin", "/sbin/nologin"].into_iter().find(|p| Path::new(p).exists()).unwrap_or("/bin/false");
    sh::run(root_cmd("useradd")?.args([
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        nologin,
        USER,
    ]))
}
