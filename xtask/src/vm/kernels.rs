//! The kernels of the matrix: which Debian package each one is today, and
//! getting it unpacked under `~/.cache/hystall-kernels` without installing
//! anything on the host.
//!
//! Package names are resolved at run time from Debian's metapackages
//! (`linux-image-amd64` depends on `linux-image-6.1.0-NN-amd64`): a hard-coded
//! ABI number would break the day Debian removes it from the archive. apt runs
//! with a private source list and private state folders per suite, so the
//! host's apt configuration is read (for its archive addresses) but never
//! changed, and a suite the host does not list (Debian 11's bullseye) works.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};

use crate::sh;

/// One column of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Debian 11 (bullseye): 5.10.
    V5_10,
    /// Debian 12 (bookworm): 6.1.
    V6_1,
    /// Debian 12's PREEMPT_RT flavour of 6.1.
    V6_1Rt,
    /// 6.12 as bookworm-security ships it.
    V6_12,
    /// This machine's own kernel, no VM: the control.
    Host,
}

impl Kernel {
    pub const ALL: [Kernel; 5] = [Kernel::V5_10, Kernel::V6_1, Kernel::V6_1Rt, Kernel::V6_12, Kernel::Host];

    pub fn label(self) -> &'static str {
        match self {
            Kernel::V5_10 => "5.10",
            Kernel::V6_1 => "6.1",
            Kernel::V6_1Rt => "6.1-rt",
            Kernel::V6_12 => "6.12",
            Kernel::Host => "host",
        }
    }

    /// The metapackage whose first dependency is the current kernel package,
    /// and the suite it is in.
    fn metapackage(self) -> Option<(&'static str, Suite)> {
        match self {
            Kernel::V5_10 => Some(("linux-image-amd64", Suite::Bullseye)),
            Kernel::V6_1 => Some(("linux-image-amd64", Suite::Bookworm)),
            Kernel::V6_1Rt => Some(("linux-image-rt-amd64", Suite::Bookworm)),
            Kernel::V6_12 => Some(("linux-image-6.12-amd64", Suite::Bookworm)),
            Kernel::Host => None,
        }
    }
}

impl std::str::FromStr for Kernel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Kernel::ALL
            .into_iter()
            .find(|k| k.label() == s)
            .ok_or_else(|| format!("unknown kernel `{s}` (one of: 5.10, 6.1, 6.1-rt, 6.12, host)"))
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A private apt "system": its own source list and state, one per suite, so
/// that a metapackage resolves to that suite's kernel and not another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Suite {
    /// Debian 11 (with its security suite, where its kernel updates land).
    Bullseye,
    /// Debian 12 with bookworm-security (6.1 updates and the 6.12 kernel).
    Bookworm,
}

impl Suite {
    fn name(self) -> &'static str {
        match self {
            Suite::Bullseye => "bullseye",
            Suite::Bookworm => "bookworm",
        }
    }
}

/// An unpacked kernel package: what a VM boots.
#[derive(Debug, Clone)]
pub struct Unpacked {
    /// The Debian package, e.g. `linux-image-6.1.0-57-amd64`.
    pub package: String,
    /// `uname -r` of the kernel, e.g. `6.1.0-57-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// The root of the unpacked package (holds `lib/modules/RELEASE`).
    pub root: PathBuf,
}

impl Unpacked {
    pub fn modules(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }
}

/// `${XDG_CACHE_HOME:-~/.cache}/hystall-kernels`.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").context("no HOME for the kernel cache")?).join(".cache"),
    };
    Ok(base.join("hystall-kernels"))
}

/// The kernel package for `kernel`, downloaded and unpacked (cached).
pub fn fetch(kernel: Kernel) -> anyhow::Result<Unpacked> {
    let (meta, suite) = kernel.metapackage().context("the host kernel is not fetched")?;
    let cache = cache_dir()?;
    let apt = Apt::new(&cache, suite)?;
    // The last name resolved is remembered, so that a machine without network
    // still runs with what it has.
    let remembered = cache.join(format!("resolved-{}", kernel.label()));
    let package = match apt.update().and_then(|()| apt.first_dependency(meta)) {
        Ok(p) => {
            std::fs::write(&remembered, &p)?;
            p
        }
        Err(e) => match std::fs::read_to_string(&remembered) {
            Ok(p) => {
                println!("vm: {kernel}: cannot ask apt ({e:#}); using the cached {}", p.trim());
                p.trim().to_owned()
            }
            Err(_) => return Err(e),
        },
    };
    let root = cache.join(&package);
    if !root.join("boot").is_dir() {
        let deb = apt.download(&package)?;
        unpack(&deb, &root)?;
    }
    let release = only_entry(&root.join("lib/modules"))?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.is_file() {
        bail!("{package} has no {}", vmlinuz.display());
    }
    let unpacked = Unpacked { package, release, vmlinuz, root };
    if !unpacked.modules().join("modules.dep").is_file() {
        // Writes only inside the unpacked tree (-b).
        sh::run(Command::new(tool("depmod")).arg("-b").arg(&unpacked.root).arg(&unpacked.release))?;
    }
    Ok(unpacked)
}

fn only_entry(dir: &Path) -> anyhow::Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("expected one kernel release in {}, found {names:?}", dir.display()),
    }
}

/// `dpkg-deb -x` into a temporary folder renamed into place, so that an
/// interrupted unpack is never taken for a complete one.
fn unpack(deb: &Path, root: &Path) -> anyhow::Result<()> {
    // Not with_extension: package names have dots (6.12.118+deb12).
    let tmp = PathBuf::from(format!("{}.partial", root.display()));
    let _ = std::fs::remove_dir_all(&tmp);
    sh::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&tmp))?;
    std::fs::rename(&tmp, root).with_context(|| format!("renaming {} into place", tmp.display()))?;
    Ok(())
}

/// A tool by name, also from the sbin folders (depmod, modprobe are not on a
/// normal user's PATH); the bare name when not found (the error then says it).
pub fn tool(name: &str) -> PathBuf {
    crate::setup::tool(name).unwrap_or_else(|| PathBuf::from(name))
}

/// apt-get/apt-cache with a private source list and state under the cache.
struct Apt {
    dir: PathBuf,
    debs: PathBuf,
}

/// Lists younger than this are not updated again.
const LISTS_FRESH: Duration = Duration::from_secs(12 * 3600);
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

impl Apt {
    fn new(cache: &Path, suite: Suite) -> anyhow::Result<Apt> {
        let dir = cache.join("apt").join(suite.name());
        let debs = cache.join("debs");
        for d in [dir.join("lists/partial"), dir.join("cache/archives/partial"), debs.clone()] {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        let (archive, security) = host_archives()?;
        let s = suite.name();
        let signed = if Path::new(KEYRING).is_file() { format!("[signed-by={KEYRING}] ") } else { String::new() };
        let list = format!(
            "deb {signed}{archive} {s} main\n\
             deb {signed}{security} {s}-security main\n"
        );
        std::fs::write(dir.join("sources.list"), list)?;
        Ok(Apt { dir, debs })
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        cmd.arg("-q")
            .arg("-o")
            .arg(format!("Dir::Etc::sourcelist={}", d("sources.list")))
            .args(["-o", "Dir::Etc::sourceparts=-"])
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", d("lists")))
            .arg("-o")
            .arg(format!("Dir::Cache={}", d("cache")))
            // The host's dpkg status is read, never written: nothing is installed.
            .args(["-o", "APT::Get::List-Cleanup=0"]);
        if sh::is_root() {
            // The cache under ~root is not the _apt user's to write.
            cmd.args(["-o", "APT::Sandbox::User=root"]);
        }
        cmd
    }

    fn update(&self) -> anyhow::Result<()> {
        let stamp = self.dir.join("updated");
        let fresh = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() < LISTS_FRESH);
        if fresh {
            return Ok(());
        }
        sh::run(self.command("apt-get").arg("update"))?;
        std::fs::write(&stamp, "")?;
        Ok(())
    }

    /// The first `Depends:` of a metapackage.
    fn first_dependency(&self, meta: &str) -> anyhow::Result<String> {
        let out = self
            .command("apt-cache")
            .args(["depends", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces"])
            .arg(meta)
            .output()
            .context("cannot run apt-cache")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.trim().strip_prefix("Depends: ").map(|p| p.trim().to_owned()))
            .filter(|p| p.starts_with("linux-image-"))
            .with_context(|| format!("apt-cache depends {meta}: no linux-image dependency ({})", text.trim()))
    }

    fn download(&self, package: &str) -> anyhow::Result<PathBuf> {
        let find = || -> Option<PathBuf> {
            std::fs::read_dir(&self.debs).ok()?.filter_map(Result::ok).map(|e| e.path()).find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
            })
        };
        if let Some(deb) = find() {
            return Ok(deb);
        }
        sh::run(self.command("apt-get").current_dir(&self.debs).args(["download", package]))?;
        find().with_context(|| format!("apt-get download {package} left no .deb in {}", self.debs.display()))
    }
}

/// The Debian archive and security archive addresses of the host's own apt
/// sources (both one-line and deb822 formats): the matrix uses the mirror
/// this machine is set up for.
fn host_archives() -> anyhow::Result<(String, String)> {
    let mut uris = Vec::new();
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.filter_map(Result::ok).map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let name = f.to_string_lossy();
        if !(name.ends_with(".list") || name.ends_with(".sources")) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("URIs:") {
                uris.extend(rest.split_whitespace().map(str::to_owned));
            } else if let Some(rest) = line.strip_prefix("deb ") {
                // `deb [options] URI suite components`
                let rest = match rest.trim_start().strip_prefix('[') {
                    Some(r) => r.split_once(']').map_or("", |(_, r)| r),
                    None => rest,
                };
                uris.extend(rest.split_whitespace().next().map(str::to_owned));
            }
        }
    }
    let is_security = |u: &&String| u.trim_end_matches('/').ends_with("debian-security");
    let security = uris.iter().find(is_security).cloned();
    let archive = uris.iter().find(|u| u.trim_end_matches('/').ends_with("/debian")).cloned();
    match (archive, security) {
        (Some(a), Some(s)) => Ok((a, s)),
        (Some(a), None) => Ok((a.clone(), format!("{}-security", a.trim_end_matches('/')))),
        _ => bail!("no Debian archive (a URI ending in /debian) in the host's apt sources: cannot fetch kernels"),
    }
}
