//! `cargo xtask fmt [--check]`: `cargo fmt --all`.

use crate::sh;

pub fn fmt(check: bool) -> anyhow::Result<()> {
    let mut cmd = sh::cargo();
    cmd.args(["fmt", "--all"]);
    if check {
        cmd.args(["--", "--check"]);
    }
    sh::run(&mut cmd)
}
