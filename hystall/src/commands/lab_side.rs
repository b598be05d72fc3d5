//! `--lab`: the built-in QUIC lab in a child process, beside the monitor.
//!
//! A child process (not a task in ours) so that the watched pid holds only the
//! lab's sockets, exactly as a proxy server would. It is killed when the
//! monitor ends, however it ends: the guard's drop on a normal end, and the
//! kernel (PR_SET_PDEATHSIG) when the monitor is killed outright (SIGKILL, a
//! crash), where no drop runs.

use std::io::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{Context, bail};

use crate::cli::LabSide;

pub struct LabChild {
    child: Child,
    /// The lab waits for a line here before its uploads (`go`).
    go: Option<ChildStdin>,
    pub pid: u32,
    pub server_port: u16,
}

impl LabChild {
    /// Starts `hystall lab --json ...` and waits for its ready line. The lab's
    /// later lines (probe results) go to stderr as they come, when `echo` is set.
    pub fn start(opts: &LabSide, echo: bool) -> anyhow::Result<LabChild> {
        let exe = std::env::current_exe().context("finding our own binary for the lab")?;
        let parent = std::process::id() as libc::pid_t;
        let mut cmd = Command::new(exe);
        // SAFETY: runs in the forked child before exec; prctl, getppid and
        // _exit are async-signal-safe and touch no memory of ours.
        unsafe {
            cmd.pre_exec(move || {
                // The death signal follows the thread that forked: this is the
                // main thread, which lives as long as the monitor.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The monitor died between fork and prctl: no signal will come.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            })
        };
        let mut child = cmd
            .args(["lab", "--json", "--uploads", &opts.lab_uploads.to_string(), "--target"])
            .arg(format!("{:?}", opts.lab_target).to_lowercase())
            // Uploads start once the monitor is attached: the timeline then
            // shows client bulk flowing, and the moment it stops.
            .args(["--delay", "1.5", "--wait-go"])
            .args(opts.lab_clients.iter().flat_map(|c| ["--client", c.as_str()]))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the lab")?;
        let out = child.stdout.take().context("lab stdout")?;
        let mut lines = BufReader::new(out).lines();
        let ready = loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("\"lab_ready\"") => break l,
                Some(Ok(_)) => continue,
                _ => {
                    let _ = child.kill();
                    bail!("the lab ended before it was ready");
                }
            }
        };
        let v: serde_json::Value = serde_json::from_str(&ready).context("the lab's ready line")?;
        let pid = v["pid"].as_u64().context("lab pid")? as u32;
        let server: std::net::SocketAddr =
            v["server"].as_str().context("lab server address")?.parse().context("lab server address")?;
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                if echo {
                    eprintln!("lab: {l}");
                }
            }
        });
        let go = child.stdin.take();
        Ok(LabChild { child, go, pid, server_port: server.port() })
    }

    /// Tells the lab that the probes are attached: its uploads start 1.5 s
    /// later (a fixed delay from its ready line raced a slow start, e.g.
    /// `--decrypt`'s, and its first requests went unseen).
    pub fn go(&mut self) {
        if let Some(mut w) = self.go.take() {
            let _ = w.write_all(b"go\n");
        }
    }
}

impl Drop for LabChild {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid: SIGTERM lets it close cleanly.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
