//! The Debian package, built with `dpkg-deb` from a staged tree (no cargo-deb
//! to install; every file, mode and field is written here, nothing inferred):
//!
//! | path | mode | from |
//! |---|---|---|
//! | /usr/bin/hystall | 0755 | the static binary |
//! | /usr/lib/systemd/system/hystall.service | 0644 | deploy/systemd/hystall.service, run from /usr/bin |
//! | /etc/default/hystall | 0644, conffile | deploy/systemd/hystall.default |
//! | /usr/share/doc/hystall/{copyright,SERVICE.md} | 0644 | here, docs/SERVICE.md |
//!
//! and the maintainer scripts of deploy/debian (the user hystall; stop and
//! disable on removal; never fail without systemd). Files are owned by root
//! (`--root-owner-group`, no fakeroot needed).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail, ensure};

use crate::sh;

pub const ARCH: &str = "amd64";
const UNIT_SRC: &str = "deploy/systemd/hystall.service";
const DEFAULT_SRC: &str = "deploy/systemd/hystall.default";
const SCRIPTS_DIR: &str = "deploy/debian";
const SCRIPTS: [&str; 3] = ["postinst", "prerm", "postrm"];
const SERVICE_DOC: &str = "docs/SERVICE.md";
/// The unit in the repository runs `cargo xtask install`'s binary.
const EXEC_LOCAL: &str = "ExecStart=/usr/local/bin/hystall ";
const EXEC_PACKAGED: &str = "ExecStart=/usr/bin/hystall ";

/// The Debian form of a Cargo version: a pre-release sorts before its release
/// with `~` (1.0.0~rc.1 < 1.0.0), where Cargo's `-` would sort after it.
pub fn version(cargo: &str) -> String {
    cargo.replacen('-', "~", 1)
}

/// Stages the package's tree and builds `deb` from `binary`.
pub fn build(binary: &Path, deb: &Path) -> anyhow::Result<()> {
    let root = sh::workspace_root();
    let stage = sh::target_dir().join("dist-stage").join("deb");
    if stage.exists() {
        std::fs::remove_dir_all(&stage).with_context(|| format!("cannot empty {}", stage.display()))?;
    }
    let read =
        |rel: &str| std::fs::read(root.join(rel)).with_context(|| format!("cannot read {}", root.join(rel).display()));
    let bin = std::fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    let unit = packaged_unit(&String::from_utf8(read(UNIT_SRC)?).context("the unit is not UTF-8")?)?;

    put(&stage, "usr/bin/hystall", &bin, 0o755)?;
    put(&stage, "usr/lib/systemd/system/hystall.service", unit.as_bytes(), 0o644)?;
    put(&stage, "etc/default/hystall", &read(DEFAULT_SRC)?, 0o644)?;
    put(&stage, "usr/share/doc/hystall/copyright", COPYRIGHT.as_bytes(), 0o644)?;
    put(&stage, "usr/share/doc/hystall/SERVICE.md", &read(SERVICE_DOC)?, 0o644)?;

    let installed_kib = installed_size(&stage)?;
    put(&stage, "DEBIAN/control", control(installed_kib).as_bytes(), 0o644)?;
    // Listed here, dpkg keeps the admin's edits of it across upgrades.
    put(&stage, "DEBIAN/conffiles", b"/etc/default/hystall\n", 0o644)?;
    for script in SCRIPTS {
        put(&stage, &format!("DEBIAN/{script}"), &read(&format!("{SCRIPTS_DIR}/{script}"))?, 0o755)?;
    }

    if sh::which("dpkg-deb").is_none() {
        bail!("dpkg-deb not found: install the dpkg package (`cargo xtask setup` does)");
    }
    let mut cmd = Command::new("dpkg-deb");
    cmd.args(["--root-owner-group", "-Zxz", "--build"]).arg(&stage).arg(deb);
    // File times no later than the last commit: the same binary gives the same .deb.
    if std::env::var_os("SOURCE_DATE_EPOCH").is_none()
        && let Some(epoch) = sh::probe(Command::new("git").args(["log", "-1", "--format=%ct"]).current_dir(&root))
    {
        cmd.env("SOURCE_DATE_EPOCH", epoch.trim());
    }
    sh::run(&mut cmd)
}

/// The repository's unit, run from /usr/bin.
fn packaged_unit(unit: &str) -> anyhow::Result<String> {
    ensure!(
        unit.matches(EXEC_LOCAL).count() == 1,
        "{UNIT_SRC}: expected one line starting `{}` to point at /usr/bin/hystall",
        EXEC_LOCAL.trim_end()
    );
    Ok(unit.replace(EXEC_LOCAL, EXEC_PACKAGED))
}

fn control(installed_kib: u64) -> String {
    let version = version(super::VERSION);
    let maintainer = maintainer();
    // Depends: passwd for useradd in postinst (priority required: always there).
    // The binary runs `tc` only to remove a clsact qdisc it added on kernels
    // before 6.6, `nft` only to read port-hopping rules, and `systemctl` only
    // for --unit: none is needed for it to run, hence Recommends and Suggests.
    format!(
        "Package: hystall
Version: {version}
Architecture: {ARCH}
Maintainer: {maintainer}
Installed-Size: {installed_kib}
Depends: passwd
Recommends: iproute2
Suggests: nftables, systemd
Section: net
Priority: optional
Description: finds QUIC proxy connections starved by stalled TCP targets
 hystall watches a QUIC proxy node (Hysteria2, sing-box, Xray, mihomo) with
 eBPF and finds, live, the connections that are alive but starved of stream
 data because the server's writes into stalled TCP targets have pinned the
 QUIC flow-control window, from outside an unmodified server binary.
 .
 One static binary with its eBPF programs inside, and a systemd unit
 (hystall.service, options in /etc/default/hystall) that runs it as the
 unprivileged user hystall with only the capabilities it needs.
"
    )
}

/// `DEBFULLNAME <DEBEMAIL>` when both are set (Debian's convention), else the project's.
fn maintainer() -> String {
    match (std::env::var("DEBFULLNAME"), std::env::var("DEBEMAIL")) {
        (Ok(name), Ok(email)) if !name.is_empty() && !email.is_empty() => format!("{name} <{email}>"),
        _ => "hystall maintainers <maintainers@users.noreply.a-seed-cde76f7f.example>".to_owned(),
    }
}

const COPYRIGHT: &str = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: hystall

Files: *
Copyright: the hystall contributors
License: MIT or Apache-2.0
 hystall is dual-licensed under the MIT license and the Apache License 2.0,
 at your option. On Debian systems, the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
";

/// Writes `rel` under `stage` with `mode`, making its folders (0755).
fn put(stage: &Path, rel: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let path = stage.join(rel);
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    // Explicitly: the umask must not decide the modes in the package.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// Installed-Size: KiB of the files, each rounded up, as dpkg-gencontrol counts.
fn installed_size(stage: &Path) -> anyhow::Result<u64> {
    fn walk(dir: &Path, total: &mut u64) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
            let path: PathBuf = entry?.path();
            let meta = path.symlink_metadata()?;
            if meta.is_dir() {
                walk(&path, total)?;
            } else {
                *total += meta.len().div_ceil(1024);
            }
        }
        Ok(())
    }
    let mut total = 0;
    walk(stage, &mut total)?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_pre_releases_sort_before_their_release_in_debian() {
        assert_eq!(version("0.1.0"), "0.1.0");
        assert_eq!(version("1.0.0-rc.1"), "1.0.0~rc.1");
        assert_eq!(version("1.0.0-rc-2+g1"), "1.0.0~rc-2+g1");
    }

    #[test]
    fn the_packaged_unit_runs_the_packaged_binary() {
        let unit = std::fs::read_to_string(sh::workspace_root().join(UNIT_SRC)).unwrap();
        let packaged = packaged_unit(&unit).unwrap();
        assert!(packaged.contains("\nExecStart=/usr/bin/hystall watch --json $HYSTALL_ARGS\n"), "{packaged}");
        assert!(!packaged.contains("ExecStart=/usr/local/bin"), "{packaged}");
        assert!(packaged_unit("[Service]\nExecStart=/opt/hystall watch\n").is_err());
    }

    #[test]
    fn the_control_file_has_the_fields_dpkg_needs() {
        let c = control(12);
        for field in ["Package: hystall\n", "Architecture: amd64\n", "Installed-Size: 12\n", "Depends: passwd\n"] {
            assert!(c.contains(field), "{field}: {c}");
        }
        assert!(c.contains(&format!("\nVersion: {}\n", super::super::VERSION)));
        // Continuation lines of the description start with a space, none is empty.
        let description = c.split("Description: ").nth(1).unwrap();
        assert!(description.lines().skip(1).all(|l| l.starts_with(' ') && l.len() > 1), "{description}");
    }
}
