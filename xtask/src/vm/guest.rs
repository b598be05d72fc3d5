//! Running the check set: in a qemu guest that boots one of the fetched
//! kernels with the host's root read-only over 9p, or directly on the host.
//!
//! Either way the run's folder (OUT) holds the binary under test, sing-box
//! and the scripts (copied: a rebuild during the run cannot change what is
//! tested, and the guest's /root is a fresh tmpfs where ~/.cargo and
//! ~/.cache would hide), and collects each check's output (checks.sh).

use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::kernels::{self, Unpacked};
use crate::sh;

const INIT: &str = include_str!("../../vm/init.sh");
const STAGE2: &str = include_str!("../../vm/stage2.sh");
const CHECKS: &str = include_str!("../../vm/checks.sh");
const SINGBOX: &str = include_str!("../../vm/singbox.py");

/// The modules mounting the 9p root needs (built in on some kernels).
const ROOT_MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];
/// A whole guest: boot, three waves of checks, power-off (2-3 min under TCG;
/// a kernel that fails every check waits out each maximum).
const GUEST_LIMIT: Duration = Duration::from_secs(600);
/// The whole host run (about 45 s).
const HOST_LIMIT: Duration = Duration::from_secs(300);

/// What the run itself (not its checks) came to.
pub struct Ran {
    /// Seconds from start to power-off (or the end of the host run).
    pub secs: f64,
    /// Why the checks may be missing: the guest never reached them, or
    /// stopped before the end. None: checks.sh ran to its end.
    pub broken: Option<String>,
}

/// Copies the binary, sing-box and the scripts into a fresh OUT.
pub fn stage(out: &Path, bin: &Path, sing_box: Option<&Path>) -> anyhow::Result<()> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("clearing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("bin"))?;
    copy_exe(bin, &out.join("bin/hystall"))?;
    if let Some(sb) = sing_box {
        // Named sing-box: `watch --comm sing-box` selects it by the name it runs as
        // (the PyPI package's file is sing-box-linux-amd64).
        copy_exe(sb, &out.join("bin/sing-box"))?;
    }
    for (name, text) in [("stage2.sh", STAGE2), ("checks.sh", CHECKS), ("singbox.py", SINGBOX)] {
        std::fs::write(out.join(name), text)?;
    }
    Ok(())
}

fn copy_exe(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// The environment checks.sh reads: the binaries by their paths as the
/// runner sees OUT (`/run/hv-out` in a guest).
fn check_env(seen_as: &Path, out: &Path) -> Vec<(String, String)> {
    let mut env = vec![("HYSTALL".to_owned(), seen_as.join("bin/hystall").display().to_string())];
    if out.join("bin/sing-box").exists() {
        env.push(("HYSTALL_SING_BOX".to_owned(), seen_as.join("bin/sing-box").display().to_string()));
    }
    env
}

/// checks.sh on this machine: the control.
pub fn run_host(out: &Path) -> anyhow::Result<Ran> {
    let started = Instant::now();
    let mut cmd = Command::new("bash");
    cmd.arg(out.join("checks.sh")).arg(out).envs(check_env(out, out));
    let log = File::create(out.join("console.log"))?;
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    let status = wait_limited(cmd.spawn().context("cannot start bash checks.sh")?, HOST_LIMIT)?;
    let broken = match status {
        Some(s) if s.success() => None,
        Some(s) => Some(format!("checks.sh exited with {s}")),
        None => Some(format!("checks.sh still running after {} s: killed", HOST_LIMIT.as_secs())),
    };
    Ok(Ran { secs: started.elapsed().as_secs_f64(), broken })
}

/// Boots `kernel` under qemu and runs checks.sh inside as PID 1's child.
pub fn run_guest(kernel: &Unpacked, out: &Path) -> anyhow::Result<Ran> {
    let mut env = format!("HV_KVER='{}'\nHV_MODDIR='{}'\n", kernel.release, kernel.modules().display());
    for (k, v) in check_env(Path::new("/run/hv-out"), out) {
        env.push_str(&format!("export {k}='{v}'\n"));
    }
    std::fs::write(out.join("env.sh"), env)?;
    let initramfs = out.join("initramfs.gz");
    build_initramfs(kernel, &initramfs)?;

    let started = Instant::now();
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(accelerator())
        .args(["-smp", "2", "-m", "3G", "-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(&initramfs)
        .args(["-append", "console=ttyS0 panic=-1 loglevel=5 rdinit=/init"])
        .args(["-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"])
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=hvout,security_model=none,multidevs=remap", out.display()));
    let log = File::create(out.join("console.log"))?;
    cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    let status = wait_limited(cmd.spawn().context("cannot start qemu-system-x86_64")?, GUEST_LIMIT)?;
    let secs = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&initramfs);
    let broken = if !out.join("stage2-started").exists() {
        Some(format!("the guest never reached stage 2 (qemu: {}); console: {}", describe(status), console_tail(out)))
    } else if !out.join("done").exists() {
        Some(format!(
            "the guest stopped before the end of the checks (qemu: {}); console: {}",
            describe(status),
            console_tail(out)
        ))
    } else {
        None
    };
    Ok(Ran { secs, broken })
}

fn describe(status: Option<std::process::ExitStatus>) -> String {
    status.map_or_else(|| format!("killed after {} s", GUEST_LIMIT.as_secs()), |s| s.to_string())
}

/// The last few non-empty console lines, on one line.
fn console_tail(out: &Path) -> String {
    let Ok(f) = File::open(out.join("console.log")) else { return "(none)".into() };
    let lines: Vec<String> = BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// TCG, unless /dev/kvm is a normal KVM. On these machines /dev/kvm is
/// `kvm_pvm` (nested "PVM"), which boots only PVM-built guest kernels: a stock
/// Debian kernel hangs right after "Probing EDD" without a word.
/// HYSTALL_VM_ACCEL=kvm|tcg overrides.
///
/// TCG runs single-threaded (both vCPUs on one host thread): multi-threaded
/// TCG (QEMU 7.2, Debian 12's) hung guests in about one kernel run in
/// fifteen, every vCPU spinning at the `sys_enter` tracepoint's jump-label
/// site in syscall_trace_enter (soft lockups, nothing of hystall on the
/// stack) right after a probe attached there: the kernel rewrites that
/// instruction on the fly while the other vCPU runs it, which multi-threaded
/// TCG does not always see. HYSTALL_VM_TCG=multi brings it back (faster).
fn accelerator() -> Vec<&'static str> {
    if kvm() {
        vec!["-enable-kvm", "-cpu", "host"]
    } else if std::env::var("HYSTALL_VM_TCG").is_ok_and(|v| v == "multi") {
        vec!["-accel", "tcg,thread=multi", "-cpu", "max"]
    } else {
        vec!["-accel", "tcg,thread=single", "-cpu", "max"]
    }
}

/// Whether the guests run under KVM (see `accelerator`).
pub fn kvm() -> bool {
    match std::env::var("HYSTALL_VM_ACCEL").as_deref() {
        Ok("kvm") => true,
        Ok("tcg") => false,
        _ => {
            let writable = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
            writable && !Path::new("/sys/module/kvm_pvm").exists()
        }
    }
}

/// Waits for `child` at most `limit`; kills it after that (None).
fn wait_limited(mut child: std::process::Child, limit: Duration) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs a helper without printing it; its stderr in the error when it fails.
fn quiet(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot start `{}`", sh::display(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({}): {}", sh::display(cmd), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The initramfs: static busybox, /init (init.sh) and the modules that
/// mounting the 9p root needs, decompressed, in load order (/mods/order).
fn build_initramfs(kernel: &Unpacked, to: &Path) -> anyhow::Result<()> {
    let ir = to.with_extension("d");
    let _ = std::fs::remove_dir_all(&ir);
    for d in ["bin", "dev", "proc", "sys", "newroot", "mods"] {
        std::fs::create_dir_all(ir.join(d))?;
    }
    let busybox = kernels::tool("busybox");
    copy_exe(&busybox, &ir.join("bin/busybox"))?;
    std::fs::write(ir.join("init"), INIT)?;
    std::fs::set_permissions(ir.join("init"), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    // The kernel opens /dev/console for /init before devtmpfs is mounted.
    quiet(Command::new("mknod").args(["-m", "600"]).arg(ir.join("dev/console")).args(["c", "5", "1"]))?;
    quiet(Command::new("mknod").args(["-m", "666"]).arg(ir.join("dev/null")).args(["c", "1", "3"]))?;

    let mut order: Vec<String> = Vec::new();
    for m in ROOT_MODULES {
        let out = Command::new(kernels::tool("modprobe"))
            .arg("-d")
            .arg(&kernel.root)
            .arg("-S")
            .arg(&kernel.release)
            .arg("--show-depends")
            .arg(m)
            .output()
            .context("cannot run modprobe --show-depends")?;
        if !out.status.success() {
            bail!("modprobe --show-depends {m} for {}: {}", kernel.release, String::from_utf8_lossy(&out.stderr));
        }
        // `insmod PATH` lines in load order; `builtin NAME` needs nothing.
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(path) = line.strip_prefix("insmod ").and_then(|r| r.split_whitespace().next()) else { continue };
            let path = PathBuf::from(path);
            let file = path.file_name().and_then(|n| n.to_str()).context("module path")?;
            let (name, decompress) = match file.rsplit_once('.') {
                Some((n, "xz")) => (n.to_owned(), Some("xz")),
                Some((n, "zst")) => (n.to_owned(), Some("zstd")),
                Some((n, "gz")) => (n.to_owned(), Some("gzip")),
                _ => (file.to_owned(), None),
            };
            if order.contains(&name) {
                continue;
            }
            let dest = ir.join("mods").join(&name);
            match decompress {
                Some(tool) => {
                    let data =
                        Command::new(tool).arg("-dc").arg(&path).output().with_context(|| format!("{tool} -dc"))?;
                    if !data.status.success() {
                        bail!("{tool} -dc {} failed", path.display());
                    }
                    std::fs::write(&dest, data.stdout)?;
                }
                None => copy_exe(&path, &dest)?,
            }
            order.push(name);
        }
    }
    std::fs::write(ir.join("mods/order"), order.join("\n") + "\n")?;
    let script = format!("cd '{}' && find . | cpio -o -H newc --quiet | gzip -1 > '{}'", ir.display(), to.display());
    quiet(Command::new("sh").args(["-c", &script]))?;
    std::fs::remove_dir_all(&ir)?;
    Ok(())
}
