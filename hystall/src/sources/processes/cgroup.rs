//! `--cgroup` and `--unit`: a service's processes, by cgroup v2 membership.
//!
//! A service keeps its cgroup when it restarts (new pids, same path), so the
//! selection is a path, matched against `/proc/PID/cgroup` on every refresh,
//! like `--comm`. Paths are kept relative to the cgroup v2 root ("/a/b.service"),
//! the form `/proc/PID/cgroup` and `systemctl show -p ControlGroup` use.
//! Every function takes its roots (`/proc`, the cgroup2 mount) so unit tests
//! run on fake trees.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted (see /proc/self/mountinfo); --cgroup and --unit need one")]
    NoCgroup2,
    #[error("cgroup {0:?} does not exist under {1}")]
    NoSuchCgroup(String, String),
    #[error("cgroup path {0:?} is not valid: {1}")]
    BadPath(String, &'static str),
    #[error("unit {0:?} not found: {1}")]
    NoSuchUnit(String, String),
}

/// Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup on unified
/// systems, /sys/fs/cgroup/unified on hybrid ones).
pub fn cgroup2_mount() -> Result<PathBuf, CgroupError> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").map_err(|_| CgroupError::NoCgroup2)?;
    parse_mountinfo(&text).ok_or(CgroupError::NoCgroup2)
}

/// The first cgroup2 mount point in a mountinfo text (fields: id parent dev
/// root mountpoint options... - fstype source superoptions).
pub fn parse_mountinfo(text: &str) -> Option<PathBuf> {
    text.lines().find_map(|l| {
        let (head, tail) = l.split_once(" - ")?;
        let mountpoint = head.split(' ').nth(4)?;
        (tail.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(unescape(mountpoint)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (b[i], oct) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `--cgroup PATH` as a path relative to the cgroup v2 root: absolute paths
/// under the mount lose the mount prefix; other paths are taken as relative
/// to the root already ("/system.slice/x.service" or "system.slice/x.service").
pub fn normalize(path: &str, mount: &Path) -> Result<String, CgroupError> {
    let p = Path::new(path.trim());
    let rel = p.strip_prefix(mount).unwrap_or(p);
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(s) => {
                parts.push(s.to_str().ok_or(CgroupError::BadPath(path.into(), "not UTF-8"))?)
            }
            std::path::Component::RootDir | std::path::Component::CurDir => {}
            _ => return Err(CgroupError::BadPath(path.into(), "\"..\" is not allowed")),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// `--cgroup` and `--unit` values → cgroup paths relative to the v2 root
/// (nothing to do, and no cgroup2 needed, when both are empty).
pub fn resolve(cgroups: &[String], units: &[String]) -> Result<Vec<String>, CgroupError> {
    if cgroups.is_empty() && units.is_empty() {
        return Ok(Vec::new());
    }
    let mount = cgroup2_mount()?;
    let mut out = Vec::new();
    for c in cgroups {
        out.push(existing(c, &mount)?);
    }
    for u in units {
        out.push(unit_cgroup(u, &mount)?);
    }
    Ok(out)
}

/// `normalize`, then checks that the cgroup exists now (a typo should fail
/// at start, not watch nothing forever).
pub fn existing(path: &str, mount: &Path) -> Result<String, CgroupError> {
    let cg = normalize(path, mount)?;
    if !mount.join(cg.trim_start_matches('/')).is_dir() {
        return Err(CgroupError::NoSuchCgroup(path.into(), mount.display().to_string()));
    }
    Ok(cg)
}

/// The cgroup v2 path in a `/proc/PID/cgroup` text (the "0::/path" line).
pub fn unified_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::")).map(|p| p.strip_suffix(" (deleted)").unwrap_or(p))
}

/// Whether `member` is the cgroup `cg` or below it ("/a/b" is within "/a",
/// "/ab" is not).
pub fn is_within(member: &str, cg: &str) -> bool {
    let cg = cg.trim_end_matches('/');
    cg.is_empty() || member == cg || member.strip_prefix(cg).is_some_and(|rest| rest.starts_with('/'))
}

/// Whether process `pid` (under `proc`) is in any of `cgroups` or below.
pub fn pid_within(proc: &Path, pid: u32, cgroups: &[String]) -> bool {
    std::fs::read_to_string(proc.join(pid.to_string()).join("cgroup"))
        .is_ok_and(|text| unified_path(&text).is_some_and(|m| cgroups.iter().any(|c| is_within(m, c))))
}

/// Processes (under `proc`, normally "/proc") in any of `cgroups` or below.
pub fn pids_in(proc: &Path, cgroups: &[String]) -> std::io::Result<Vec<u32>> {
    let mut out = Vec::new();
    if cgroups.is_empty() {
        return Ok(out);
    }
    for entry in std::fs::read_dir(proc)?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid_within(proc, pid, cgroups) {
            out.push(pid);
        }
    }
    Ok(out)
}

/// Whether systemd is the init system (sd_booted(3): /run/systemd/system exists).
pub fn systemd_running() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// `--unit NAME`: the unit's cgroup. With systemd, as systemd says (a unit not
/// running yet gets its slice's path, so it is picked up when it starts);
/// without, the cgroup directory named NAME or NAME.service under the mount.
pub fn unit_cgroup(name: &str, mount: &Path) -> Result<String, CgroupError> {
    if name.is_empty() || name.contains('/') {
        return Err(CgroupError::NoSuchUnit(name.into(), "a unit name has no '/'".into()));
    }
    if systemd_running() {
        return systemctl_cgroup(name);
    }
    let wanted = [name.to_string(), format!("{name}.service")];
    find_dir(mount, &wanted, 4).map(|p| normalize(&p.to_string_lossy(), mount)).transpose()?.ok_or_else(|| {
        CgroupError::NoSuchUnit(
            name.into(),
            format!("systemd is not running and no cgroup named {name} or {name}.service is under {}", mount.display()),
        )
    })
}

/// Asks systemd: `systemctl show -p ControlGroup,Slice,LoadState NAME`.
fn systemctl_cgroup(name: &str) -> Result<String, CgroupError> {
    let out = Command::new("systemctl")
        .args(["show", "-p", "LoadState", "-p", "ControlGroup", "-p", "Slice", "--", name])
        .output()
        .map_err(|e| CgroupError::NoSuchUnit(name.into(), format!("running systemctl: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(CgroupError::NoSuchUnit(name.into(), err.trim().to_string()));
    }
    parse_show(name, &String::from_utf8_lossy(&out.stdout))
}

/// The cgroup from `systemctl show` output (KEY=VALUE lines).
pub fn parse_show(name: &str, text: &str) -> Result<String, CgroupError> {
    let get = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix('=')).unwrap_or("");
    if get("LoadState") == "not-found" {
        return Err(CgroupError::NoSuchUnit(name.into(), "systemd does not know it".into()));
    }
    match (get("ControlGroup"), get("Slice")) {
        (cg, _) if !cg.is_empty() => Ok(cg.to_string()),
        (_, slice) if !slice.is_empty() => {
            let unit = if name.contains('.') { name.to_string() } else { format!("{name}.service") };
            Ok(format!("{}/{unit}", slice_path(slice)))
        }
        _ => Err(CgroupError::NoSuchUnit(name.into(), "systemd shows no cgroup for it".into())),
    }
}

/// A slice's cgroup path: "a-b.slice" lives in "/a.slice/a-b.slice"
/// (systemd.slice(5)); "-.slice" is the root.
pub fn slice_path(slice: &str) -> String {
    let Some(stem) = slice.strip_suffix(".slice").filter(|s| *s != "-") else { return String::new() };
    let parts: Vec<&str> = stem.split('-').collect();
    (1..=parts.len()).map(|n| format!("/{}.slice", parts[..n].join("-"))).collect()
}

/// A directory named one of `names` under `dir`, at most `depth` levels down
/// (breadth first: the shallowest wins).
fn find_dir(dir: &Path, names: &[String], depth: usize) -> Option<PathBuf> {
    let subdirs: Vec<PathBuf> =
        std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    if let Some(hit) = subdirs.iter().find(|p| p.file_name().is_some_and(|n| names.iter().any(|w| n == w.as_str()))) {
        return Some(hit.clone());
    }
    if depth == 0 {
        return None;
    }
    subdirs.iter().find_map(|d| find_dir(d, names, depth - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup2_mount_is_found_on_unified_and_hybrid_systems() {
        let unified = "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(parse_mountinfo(unified), Some(PathBuf::from("/sys/fs/cgroup")));
        let hybrid = "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(parse_mountinfo(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(parse_mountinfo("41 31 0:38 / /a\\040b rw - cgroup2 none rw\n"), Some(PathBuf::from("/a b")));
        assert_eq!(parse_mountinfo("30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"), None);
        assert_eq!(parse_mountinfo("garbage\n\n"), None);
    }

    #[test]
    fn paths_are_made_relative_to_the_root() {
        let m = Path::new("/sys/fs/cgroup");
        assert_eq!(normalize("/sys/fs/cgroup/system.slice/x.service", m).unwrap(), "/system.slice/x.service");
        assert_eq!(normalize("/system.slice/x.service/", m).unwrap(), "/system.slice/x.service");
        assert_eq!(normalize("system.slice//x.service", m).unwrap(), "/system.slice/x.service");
        assert_eq!(normalize("/sys/fs/cgroup", m).unwrap(), "/");
        assert!(normalize("/a/../b", m).unwrap_err().to_string().contains(".."));
    }

    #[test]
    fn membership_is_the_cgroup_or_below() {
        assert!(is_within("/system.slice/x.service", "/system.slice/x.service"));
        assert!(is_within("/system.slice/x.service/sub", "/system.slice/x.service"));
        assert!(is_within("/system.slice/x.service", "/system.slice/"));
        assert!(!is_within("/system.slice/x.service2", "/system.slice/x.service"));
        assert!(!is_within("/system.slice", "/system.slice/x.service"));
        assert!(is_within("/anything", "/"));
        assert_eq!(unified_path("12:pids:/x\n0::/a/b\n"), Some("/a/b"));
        assert_eq!(unified_path("0::/a/b (deleted)\n"), Some("/a/b"));
        assert_eq!(unified_path("12:pids:/x\n"), None);
    }

    /// A fake /proc: pid → its cgroup file's text.
    fn fake_proc(entries: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hystall-cg-{}-{}", std::process::id(), entries.len()));
        let _ = std::fs::remove_dir_all(&dir);
        for (pid, text) in entries {
            std::fs::create_dir_all(dir.join(pid)).unwrap();
            std::fs::write(dir.join(pid).join("cgroup"), text).unwrap();
        }
        dir
    }

    #[test]
    fn processes_are_matched_by_their_cgroup_file() {
        let proc = fake_proc(&[
            ("10", "0::/system.slice/hy.service\n"),
            ("11", "4:memory:/x\n0::/system.slice/hy.service/worker\n"),
            ("12", "0::/system.slice/hy.service2\n"),
            ("13", "0::/user.slice\n"),
            ("self", "0::/system.slice/hy.service\n"),
            ("14", "4:memory:/system.slice/hy.service\n"),
        ]);
        std::fs::create_dir_all(proc.join("15")).unwrap(); // exited: no cgroup file
        let mut got = pids_in(&proc, &["/system.slice/hy.service".into()]).unwrap();
        got.sort();
        assert_eq!(got, vec![10, 11]);
        let mut two = pids_in(&proc, &["/system.slice/hy.service".into(), "/user.slice".into()]).unwrap();
        two.sort();
        assert_eq!(two, vec![10, 11, 13]);
        assert!(pids_in(&proc, &[]).unwrap().is_empty());
        std::fs::remove_dir_all(proc).unwrap();
    }

    #[test]
    fn systemctl_show_output_gives_the_cgroup() {
        let running = "LoadState=loaded\nControlGroup=/system.slice/hysteria-server.service\nSlice=system.slice\n";
        assert_eq!(parse_show("hysteria-server", running).unwrap(), "/system.slice/hysteria-server.service");
        let stopped = "LoadState=loaded\nControlGroup=\nSlice=system.slice\n";
        assert_eq!(parse_show("hysteria-server", stopped).unwrap(), "/system.slice/hysteria-server.service");
        let nested = "LoadState=loaded\nControlGroup=\nSlice=proxy-edge.slice\n";
        assert_eq!(parse_show("sb.service", nested).unwrap(), "/proxy.slice/proxy-edge.slice/sb.service");
        let err = parse_show("nope", "LoadState=not-found\nControlGroup=\nSlice=\n").unwrap_err();
        assert_eq!(err.to_string(), "unit \"nope\" not found: systemd does not know it");
        assert_eq!(slice_path("-.slice"), "");
    }

    #[test]
    fn units_are_found_as_cgroup_directories_without_systemd() {
        let root = std::env::temp_dir().join(format!("hystall-cgfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("system.slice/hy.service")).unwrap();
        std::fs::create_dir_all(root.join("other/plain")).unwrap();
        assert_eq!(find_dir(&root, &["hy".into(), "hy.service".into()], 4), Some(root.join("system.slice/hy.service")));
        assert_eq!(find_dir(&root, &["plain".into()], 4), Some(root.join("other/plain")));
        assert_eq!(find_dir(&root, &["none".into()], 4), None);
        assert!(existing("/system.slice/hy.service", &root).is_ok());
        let err = existing("/system.slice/typo.service", &root).unwrap_err().to_string();
        assert!(err.starts_with("cgroup \"/system.slice/typo.service\" does not exist under"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }
}
