//! Work that a full `cargo xtask test` runs beside its tests: another xtask
//! process (a hidden subcommand: `dist-build`, `vm-fetch`) at the lowest CPU
//! priority, its output in a log file rather than among the tests' lines.
//!
//! - Priority: SCHED_IDLE (`chrt --idle 0`; `nice -n 19` where chrt cannot),
//!   inherited by everything it starts (cargo, rustc, apt, dpkg-deb): such a
//!   task weighs 3 against a normal task's 1024 and a waking normal task
//!   preempts it, so it runs on what the tests leave idle (their servers and
//!   clients mostly sleep on timers) and cannot delay their timing. I/O is in
//!   the idle class too (`ionice -c 3`, where the I/O scheduler honours it).
//! - Lifetime: the job is its own process group, killed whole (`kill -9
//!   -PGID`) when the `Background` is dropped unfinished (an early error).
//!   Should this process die without unwinding (a signal, Ctrl-C), the job
//!   sees its stdin, a pipe only we hold open, reach end of file and kills its
//!   group itself (`stop_with_parent`).

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::sh;

// kill(2), getpgrp(2): no memory-safety preconditions; declared here to avoid a
// libc dependency.
unsafe extern "C" {
    safe fn kill(pid: i32, sig: i32) -> i32;
    safe fn getpgrp() -> i32;
}
const SIGKILL: i32 = 9;

/// Lines of a failed job's log printed again.
const TAIL_LINES: usize = 40;

/// A running job; see the module's comment.
pub struct Background {
    what: &'static str,
    /// None once waited for.
    child: Option<Child>,
    /// The write end of the job's stdin, open as long as we hold it.
    lifeline: Option<ChildStdin>,
    log: PathBuf,
    started: Instant,
}

impl Background {
    /// Starts `xtask ARGS` (this same executable) at the lowest priority, its
    /// stdout and stderr to `log`.
    pub fn start(what: &'static str, args: &[&str], log: &Path) -> anyhow::Result<Background> {
        use std::os::unix::process::CommandExt as _;
        let exe = std::env::current_exe().context("cannot find the xtask executable")?;
        let mut line = lowest_priority();
        line.push(exe.into_os_string());
        line.extend(args.iter().map(Into::into));
        let mut cmd = Command::new(&line[0]);
        cmd.args(&line[1..]);
        let file = std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        cmd.stdin(Stdio::piped()).stdout(file.try_clone()?).stderr(file).process_group(0);
        println!("{what}: in the background: $ {} (output: {})", sh::display(&cmd), log.display());
        let mut child = cmd.spawn().with_context(|| format!("cannot start `{}`", sh::display(&cmd)))?;
        // Child::wait would close a stdin it still held: ours until the job ends.
        let lifeline = child.stdin.take();
        Ok(Background { what, child: Some(child), lifeline, log: log.to_owned(), started: Instant::now() })
    }

    /// Waits for the job; Err (after printing the last lines of its log) when
    /// it failed.
    pub fn finish(mut self) -> anyhow::Result<()> {
        let mut child = self.child.take().context("already waited for")?;
        if child.try_wait()?.is_none() {
            println!(
                "{}: waiting for the background job (started {}s ago)",
                self.what,
                self.started.elapsed().as_secs()
            );
        }
        let waited = Instant::now();
        let status = child.wait().context("waiting for the background job")?;
        drop(self.lifeline.take());
        if status.success() {
            println!(
                "{}: the background job succeeded ({}s after it started, waited {}s for it; output: {})",
                self.what,
                self.started.elapsed().as_secs(),
                waited.elapsed().as_secs(),
                self.log.display()
            );
            return Ok(());
        }
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        println!("{}: the background job failed ({status}); the last lines of {}:", self.what, self.log.display());
        for l in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
            println!("  | {l}");
        }
        bail!("the background job failed ({status}; output: {})", self.log.display())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // Not reaped yet, so the group's id is still its own.
        if let Ok(pgid) = i32::try_from(child.id()) {
            kill(-pgid, SIGKILL);
        }
        let _ = child.wait();
        // Maybe while unwinding: a failed write must not panic again.
        let _ = writeln!(std::io::stdout(), "{}: the background job was stopped", self.what);
    }
}

/// The command words that run a program at the lowest CPU and I/O priority
/// (the program itself to be appended).
fn lowest_priority() -> Vec<std::ffi::OsString> {
    let mut words = Vec::new();
    if let Some(chrt) = sh::which("chrt")
        && sh::probe(Command::new(&chrt).args(["--idle", "0", "true"])).is_some()
    {
        words.extend([chrt.into_os_string(), "--idle".into(), "0".into()]);
    } else if let Some(nice) = sh::which("nice") {
        words.extend([nice.into_os_string(), "-n".into(), "19".into()]);
    }
    if let Some(ionice) = sh::which("ionice") {
        // -t: run it anyway where the class cannot be set.
        words.extend([ionice.into_os_string(), "-c".into(), "3".into(), "-t".into()]);
    }
    words
}

/// In a job (first thing): ends the job's whole process group, this process
/// included, when stdin reaches end of file, i.e. when the `cargo xtask
/// test` that started it, the only holder of the pipe's other end, is gone.
/// Only as the leader of its own process group, as `Background::start` makes
/// it: run otherwise (by hand, stdin maybe /dev/null), it must not kill the
/// caller's group. (The thread reads no environment: `sh::set_env`'s premise
/// still holds.)
pub fn stop_with_parent() {
    if i32::try_from(std::process::id()).ok() != Some(getpgrp()) {
        return;
    }
    std::thread::spawn(|| {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 64];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        kill(0, SIGKILL);
    });
}
