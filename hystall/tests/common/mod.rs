//! Helpers for the root integration tests: run `hystall` subprocesses, read
//! their JSON lines, and skip cleanly when not root.
#![allow(dead_code)]

pub mod cgroups;
pub mod nft;
pub mod node;
pub mod relay;
pub mod scrape;
pub mod shoes;
pub mod side_by_side;
pub mod singbox;
pub mod tcpdump;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Root tests attach kernel probes and measure timing: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The serialising guard alone, for tests that run as any user but attach or
/// enforce (two enforcing monitors at once refuse each other).
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Returns the serialising guard when root; prints the skip line otherwise.
pub fn root_or_skip(test: &str) -> Option<MutexGuard<'static, ()>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("{test}: skipped: needs root");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|p| p.into_inner()))
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_hystall")
}

/// A child process whose stdout lines arrive on a channel; killed on drop.
pub struct Proc {
    pub child: Child,
    lines: Receiver<String>,
    pub seen: Vec<String>,
}

impl Proc {
    pub fn spawn(args: &[&str]) -> Proc {
        Proc::spawn_with_stderr(args, Stdio::inherit())
    }

    /// `spawn`, with extra environment variables.
    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
        Proc::spawn_cmd(Command::new(bin()).args(args).envs(env.iter().copied()), Stdio::inherit())
    }

    /// `spawn`, with stderr going to `stderr` (a file, to read warnings back).
    pub fn spawn_with_stderr(args: &[&str], stderr: impl Into<Stdio>) -> Proc {
        Proc::spawn_cmd(Command::new(bin()).args(args), stderr)
    }

    fn spawn_cmd(cmd: &mut Command, stderr: impl Into<Stdio>) -> Proc {
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr).spawn().expect("spawn hystall");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines: rx, seen: Vec::new() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next JSON line, or None at the deadline or end of output.
    pub fn next_json(&mut self, deadline: Instant) -> Option<Value> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        return Some(v);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Waits for a line whose `event` is `name`.
    pub fn wait_event(&mut self, name: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        while let Some(v) = self.next_json(deadline) {
            if v["event"] == name {
                return v;
            }
        }
        panic!("no {name} event within {within:?}; output so far:\n{}", self.seen.join("\n"));
    }

    /// Every JSON line until the deadline.
    pub fn collect_until(&mut self, deadline: Instant) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(v) = self.next_json(deadline) {
            out.push(v);
        }
        out
    }

    /// SIGTERM, then wait (SIGKILL after 5 s). Returns the exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `hystall lab tcp ARGS` and returns it with its ready line.
/// `watch --json --lab` with `uploads` into `target`, a stall timeout and a duration (seconds).
pub fn lab_watch_args(uploads: usize, target: &str, timeout: u64, secs: u64) -> Vec<String> {
    let (n, t, d) = (uploads.to_string(), timeout.to_string(), secs.to_string());
    ["watch", "--json", "--lab", "--lab-uploads", &n, "--lab-target", target, "--stall-timeout", &t, "--duration", &d]
        .map(String::from)
        .to_vec()
}

pub fn tcp_lab(args: &[&str]) -> (Proc, Value) {
    let mut full = vec!["lab", "tcp"];
    full.extend_from_slice(args);
    let mut lab = Proc::spawn(&full);
    let ready = lab.wait_event("lab_ready", Duration::from_secs(10));
    (lab, ready)
}

/// The `local` addresses of the lab's writers with this behaviour.
pub fn writers(ready: &Value, behaviour: &str) -> Vec<String> {
    ready["writers"]
        .as_array()
        .expect("writers")
        .iter()
        .filter(|w| w["behaviour"] == behaviour)
        .map(|w| w["local"].as_str().expect("local").to_owned())
        .collect()
}

/// (id, name) of the eBPF programs loaded in the kernel right now.
pub fn loaded_programs() -> Vec<(u32, String)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| (p.id(), p.name_as_str().unwrap_or_default().to_owned()))
        .collect()
}
