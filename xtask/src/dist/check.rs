//! Checks of the artifacts, one `dist: PASS` or `dist: FAIL` line each (a full
//! `cargo xtask test` adds them to its summary):
//!
//! - the binary is static: no dynamic section, no interpreter (`readelf`);
//! - it runs: `--version`, and as root the lab's starvation is found
//!   (`watch --lab`, 15 s: the embedded eBPF programs load and work);
//! - the .deb holds exactly the expected files, modes and owners (`dpkg-deb
//!   -c`), control fields, conffiles and executable maintainer scripts (`-I`),
//!   the dist binary itself, a unit that runs it, scripts that parse (`sh -n`);
//! - SHA256SUMS verifies.
//!
//! The expected lists are written out here, not taken from `deb.rs`, so that
//! a change of the package shows up as a failure to look at.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use super::{Artifacts, VERSION, deb};
use crate::sh;

/// Every entry of the package: (mode as `dpkg-deb -c` prints it, path); all root/root.
const CONTENTS: [(&str, &str); 16] = [
    ("drwxr-xr-x", "./"),
    ("drwxr-xr-x", "./etc/"),
    ("drwxr-xr-x", "./etc/default/"),
    ("-rw-r--r--", "./etc/default/hystall"),
    ("drwxr-xr-x", "./usr/"),
    ("drwxr-xr-x", "./usr/bin/"),
    ("-rwxr-xr-x", "./usr/bin/hystall"),
    ("drwxr-xr-x", "./usr/lib/"),
    ("drwxr-xr-x", "./usr/lib/systemd/"),
    ("drwxr-xr-x", "./usr/lib/systemd/system/"),
    ("-rw-r--r--", "./usr/lib/systemd/system/hystall.service"),
    ("drwxr-xr-x", "./usr/share/"),
    ("drwxr-xr-x", "./usr/share/doc/"),
    ("drwxr-xr-x", "./usr/share/doc/hystall/"),
    ("-rw-r--r--", "./usr/share/doc/hystall/SERVICE.md"),
    ("-rw-r--r--", "./usr/share/doc/hystall/copyright"),
];

/// The control archive's members: (name, executable).
const CONTROL_MEMBERS: [(&str, bool); 5] =
    [("conffiles", false), ("control", false), ("postinst", true), ("postrm", true), ("prerm", true)];

/// Seconds the lab runs under the static binary, and the most it may take.
const LAB_SECS: u64 = 15;
const LAB_LIMIT: Duration = Duration::from_secs(60);

#[derive(Default, Debug)]
pub struct Report {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    /// The static binary, when it was built: the kernel matrix runs it.
    pub binary: Option<std::path::PathBuf>,
}

impl Report {
    pub fn record(&mut self, what: &str, result: anyhow::Result<()>) {
        match result {
            Ok(()) => {
                self.passed += 1;
                println!("dist: PASS {what}");
            }
            Err(e) => {
                self.failed += 1;
                println!("dist: FAIL {what}: {e:#}");
            }
        }
    }

    fn skip(&mut self, what: &str, why: &str) {
        self.skipped += 1;
        println!("dist: SKIP {what}: {why}");
    }
}

pub(super) fn check(a: &Artifacts) -> Report {
    let mut r = Report { binary: Some(a.binary.clone()), ..Report::default() };
    r.record("binary: static, no dynamic section nor interpreter (readelf -d, -l)", is_static(&a.binary));
    r.record(&format!("binary: `--version` prints `hystall {VERSION}`"), prints_version(&a.binary));
    let lab = "binary: `watch --lab --lab-target stall` reports quic_starved (eBPF embedded and working)";
    if sh::is_root() {
        r.record(lab, finds_the_lab_starving(&a.binary));
    } else {
        r.skip(lab, "needs root");
    }
    r.record("deb: exactly the expected files, modes and owners (dpkg-deb -c)", deb_contents(&a.deb));
    r.record("deb: control fields, conffiles, maintainer scripts (dpkg-deb -I)", deb_control(&a.deb));
    r.record("deb: holds the dist binary, a unit running /usr/bin/hystall, scripts that parse", deb_payload(a));
    r.record("SHA256SUMS verifies (sha256sum -c)", sums_verify(a));
    r
}

/// Stdout of `cmd` (C locale), which must succeed.
fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let line = sh::display(cmd);
    let out = cmd.env("LC_ALL", "C").stdin(Stdio::null()).output().with_context(|| format!("cannot run `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_static(binary: &Path) -> anyhow::Result<()> {
    let dynamic = output(Command::new("readelf").arg("-d").arg(binary))?;
    ensure!(dynamic.contains("There is no dynamic section in this file."), "readelf -d shows one:\n{dynamic}");
    let headers = output(Command::new("readelf").arg("-lW").arg(binary))?;
    ensure!(!headers.contains("INTERP"), "it asks for a program interpreter:\n{headers}");
    Ok(())
}

fn prints_version(binary: &Path) -> anyhow::Result<()> {
    let out = output(Command::new(binary).arg("--version"))?;
    ensure!(out.trim() == format!("hystall {VERSION}"), "it printed {:?}", out.trim());
    Ok(())
}

fn finds_the_lab_starving(binary: &Path) -> anyhow::Result<()> {
    let events = sh::target_dir().join("dist-stage").join("lab.json");
    let file = std::fs::File::create(&events).with_context(|| format!("cannot create {}", events.display()))?;
    let duration = LAB_SECS.to_string();
    let mut child = Command::new(binary)
        .args(["watch", "--lab", "--lab-uploads", "4", "--lab-target", "stall", "--stall-timeout", "3"])
        .args(["--duration", &duration, "--json"])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the binary")?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > LAB_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("still running after {}s (--duration {LAB_SECS})", LAB_LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read as _;
        let _ = e.read_to_string(&mut stderr);
    }
    ensure!(status.success(), "watch failed ({status}): {}", stderr.trim());
    let json = std::fs::read_to_string(&events)?;
    let starved = json.lines().filter(|l| l.contains(r#""event":"quic_starved""#)).count();
    ensure!(starved >= 1, "no quic_starved in {} ({} lines)", events.display(), json.lines().count());
    Ok(())
}

fn deb_contents(deb: &Path) -> anyhow::Result<()> {
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(deb))?;
    let problems = contents_problems(&listing);
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(())
}

/// What differs between a `dpkg-deb -c` listing and CONTENTS.
fn contents_problems(listing: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for line in listing.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [mode, owner, _size, _date, _time, path, ..] = fields[..] else {
            problems.push(format!("unreadable line {line:?}"));
            continue;
        };
        seen.push(path);
        match CONTENTS.iter().find(|(_, p)| *p == path) {
            None => problems.push(format!("unexpected {path}")),
            Some((want, _)) if *want != mode => problems.push(format!("{path} is {mode}, not {want}")),
            Some(_) => {}
        }
        if owner != "root/root" {
            problems.push(format!("{path} is owned by {owner}, not root/root"));
        }
    }
    for (_, path) in CONTENTS {
        if !seen.contains(&path) {
            problems.push(format!("missing {path}"));
        }
    }
    problems
}

fn deb_control(deb: &Path) -> anyhow::Result<()> {
    let info = output(Command::new("dpkg-deb").arg("-I").arg(deb))?;
    let members = control_members(&info);
    let want: Vec<(String, bool)> = CONTROL_MEMBERS.iter().map(|(n, x)| (n.to_string(), *x)).collect();
    ensure!(members == want, "control archive members (name, executable) are {members:?}, not {want:?}");

    let fields = output(Command::new("dpkg-deb").arg("-f").arg(deb))?;
    let field = |key: &str| fields.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(": ")).unwrap_or("");
    let version = deb::version(VERSION);
    for (key, want) in
        [("Package", "hystall"), ("Version", version.as_str()), ("Architecture", deb::ARCH), ("Depends", "passwd")]
    {
        ensure!(field(key) == want, "{key} is {:?}, not {want:?}", field(key));
    }
    ensure!(field("Maintainer").contains('<'), "no Maintainer with an address");
    ensure!(
        field("Installed-Size").parse::<u64>().is_ok_and(|k| k > 1000),
        "Installed-Size {:?}",
        field("Installed-Size")
    );

    let conffiles = output(Command::new("dpkg-deb").arg("-I").arg(deb).arg("conffiles"))?;
    ensure!(conffiles.trim() == "/etc/default/hystall", "conffiles are {:?}", conffiles.trim());
    Ok(())
}

/// (name, executable) of the control archive's members in `dpkg-deb -I` output
/// (`   1745 bytes,    39 lines   *  postinst   #!/bin/sh`).
fn control_members(info: &str) -> Vec<(String, bool)> {
    info.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().skip_while(|w| *w != "lines").skip(1).peekable();
            let executable = words.next_if_eq(&"*").is_some();
            Some((words.next()?.to_owned(), executable))
        })
        .collect()
}

fn deb_payload(a: &Artifacts) -> anyhow::Result<()> {
    let dir = sh::target_dir().join("dist-stage").join("check");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(dir.join("root"))?;
    output(Command::new("dpkg-deb").arg("-x").arg(&a.deb).arg(dir.join("root")))?;
    output(Command::new("dpkg-deb").arg("-e").arg(&a.deb).arg(dir.join("DEBIAN")))?;
    let packaged = std::fs::read(dir.join("root/usr/bin/hystall"))?;
    ensure!(packaged == std::fs::read(&a.binary)?, "/usr/bin/hystall differs from {}", a.binary.display());
    let unit = std::fs::read_to_string(dir.join("root/usr/lib/systemd/system/hystall.service"))?;
    ensure!(unit.contains("\nExecStart=/usr/bin/hystall watch --json "), "the unit does not run /usr/bin/hystall");
    let default = std::fs::read(dir.join("root/etc/default/hystall"))?;
    ensure!(
        default == std::fs::read(sh::workspace_root().join("deploy/systemd/hystall.default"))?,
        "/etc/default/hystall differs from deploy/systemd/hystall.default"
    );
    for script in ["postinst", "prerm", "postrm"] {
        output(Command::new("sh").arg("-n").arg(dir.join("DEBIAN").join(script)))
            .with_context(|| format!("{script} does not parse"))?;
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn sums_verify(a: &Artifacts) -> anyhow::Result<()> {
    let out = output(Command::new("sha256sum").args(["-c", "SHA256SUMS"]).current_dir(&a.dir))?;
    ensure!(out.lines().count() == 2, "SHA256SUMS should list the binary and the .deb:\n{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_must_match_the_expected_contents_exactly() {
        let line = |(mode, path): (&str, &str)| format!("{mode} root/root      0 2026-12-06 15:57 {path}\n");
        let good: String = CONTENTS.into_iter().map(line).collect();
        assert_eq!(contents_problems(&good), Vec::<String>::new());

        let bad = good
            .replace(
                "-rwxr-xr-x root/root      0 2026-12-06 15:57 ./usr/bin/hystall",
                "-rwxrwxr-x root/root 0 d t ./usr/bin/hystall",
            )
            .replace("-rw-r--r-- root/root      0 2026-12-06 15:57 ./etc/default/hystall\n", "")
            + "-rw-r--r-- user/user 0 d t ./usr/share/doc/hystall/x\n";
        assert_eq!(
            contents_problems(&bad),
            [
                "./usr/bin/hystall is -rwxrwxr-x, not -rwxr-xr-x",
                "unexpected ./usr/share/doc/hystall/x",
                "./usr/share/doc/hystall/x is owned by user/user, not root/root",
                "missing ./etc/default/hystall",
            ]
        );
    }

    #[test]
    fn control_members_are_read_with_their_executable_mark() {
        let info = " new Debian package, version 2.0.
 size 1864 bytes: control archive=1452 bytes.
       7 bytes,     1 lines      conffiles            
    1745 bytes,    39 lines   *  postinst             #!/bin/sh
 Package: hystall
";
        assert_eq!(control_members(info), [("conffiles".to_owned(), false), ("postinst".to_owned(), true)]);
    }
}
