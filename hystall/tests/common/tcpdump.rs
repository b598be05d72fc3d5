//! tcpdump writing a loopback capture to a file, for the tests that check a
//! capture of their own run (`pcap_offline`, `decrypt_e2e`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// tcpdump writing a file; stopped (SIGINT, flushed) on `stop` or drop.
pub struct Tcpdump {
    child: Child,
}

impl Tcpdump {
    pub fn start(file: &Path, filter: &str) -> Tcpdump {
        let child = Command::new("tcpdump")
            // A 128 MiB buffer: the lab's first burst fills the default 2 MiB
            // one and the kernel drops packets; a lost tail of the client's
            // stream data leaves the window looking unused (likely, not confirmed).
            .args(["-i", "lo", "--immediate-mode", "-U", "-s", "0", "-B", "131072", "-w"])
            .arg(file)
            .arg(filter)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tcpdump (Debian package tcpdump; `cargo xtask setup` installs it)");
        // tcpdump has no ready signal on a file: give it time to open the socket.
        std::thread::sleep(Duration::from_millis(1500));
        Tcpdump { child }
    }

    pub fn stop(mut self) {
        self.interrupt();
    }

    fn interrupt(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.interrupt();
        }
    }
}
