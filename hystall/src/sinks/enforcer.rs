//! Carries out enforcement decisions: SOCK_DESTROY through sock_diag, addressed
//! by 4-tuple and cookie so that exactly that socket is hit; where the kernel
//! lacks it, pidfd_getfd + shutdown(SHUT_RDWR) on the owner's own descriptor.
//! Every action, and every dry-run decision, is checked afterwards, reported
//! as an `enforced` event and written to the system log.

use std::ffi::CString;

use crate::core::enforce::Decision;
use crate::sources::processes::procs;
use crate::sources::processes::sockdiag::{DiagError, SockDiag};

pub struct Executor {
    diag: SockDiag,
    pub dry_run: bool,
}

/// What happened to one socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub cookie: u64,
    /// `destroy`, or `refuse` (a rule stopped it).
    pub action: &'static str,
    /// `destroyed`, `shut down (pidfd)`, `dry-run`, `gone already`, or why it failed.
    pub result: String,
}

impl Executor {
    pub fn new(dry_run: bool) -> Result<Executor, DiagError> {
        Ok(Executor { diag: SockDiag::open()?, dry_run })
    }

    pub fn act(&mut self, d: &Decision) -> Outcome {
        match *d {
            Decision::Refuse { cookie, reason } => Outcome { cookie, action: "refuse", result: reason.to_owned() },
            Decision::Destroy { cookie, pid, local, remote } => {
                let result = if self.dry_run { "dry-run".to_owned() } else { self.destroy(cookie, pid, local, remote) };
                Outcome { cookie, action: "destroy", result }
            }
        }
    }

    fn destroy(&mut self, cookie: u64, pid: u32, local: std::net::SocketAddr, remote: std::net::SocketAddr) -> String {
        let inode = match self.diag.query(cookie, local, remote) {
            Ok(Some(d)) => d.inode,
            Ok(None) => return "gone already".into(),
            Err(e) => return format!("failed: {e}"),
        };
        let how = match self.diag.destroy(cookie, local, remote) {
            Ok(()) => "destroyed",
            // No CONFIG_INET_DIAG_DESTROY: close it from the owner's side.
            Err(DiagError::Kernel(e)) if e.abs() == libc::EOPNOTSUPP => match shutdown_via_pidfd(pid, inode) {
                Ok(()) => "shut down (pidfd)",
                Err(e) => return format!("failed: SOCK_DESTROY unsupported, pidfd fallback: {e}"),
            },
            Err(e) => return format!("failed: {e}"),
        };
        // Check that it is gone (a destroyed socket leaves ESTABLISHED at once).
        match self.diag.query(cookie, local, remote) {
            Ok(None) => how.to_owned(),
            Ok(Some(d)) if d.state != 1 => how.to_owned(),
            Ok(Some(_)) => "failed: the socket is still established".into(),
            Err(e) => format!("{how}, but checking failed: {e}"),
        }
    }
}

/// Finds the owner's descriptor of socket `inode`, takes a copy with
/// pidfd_getfd, and shuts the connection down both ways.
fn shutdown_via_pidfd(pid: u32, inode: u32) -> Result<(), String> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| format!("/proc/{pid}/fd: {e}"))?;
    let fd = fds
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .find(|&n| procs::fd_socket_inode(pid, n) == Some(inode))
        .ok_or("the owner holds no descriptor of it")?;
    // SAFETY: raw syscalls with plain integer arguments; the fds we get are ours to close.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as libc::c_int;
        if pidfd < 0 {
            return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
        }
        let copy = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd as libc::c_int, 0) as libc::c_int;
        libc::close(pidfd);
        if copy < 0 {
            return Err(format!("pidfd_getfd: {}", std::io::Error::last_os_error()));
        }
        let rc = libc::shutdown(copy, libc::SHUT_RDWR);
        let err = std::io::Error::last_os_error();
        libc::close(copy);
        if rc != 0 {
            return Err(format!("shutdown: {err}"));
        }
    }
    Ok(())
}

/// One line to the system log (LOG_DAEMON, warning), as well as the event.
pub fn syslog(msg: &str) {
    let Ok(c) = CString::new(msg.replace('\0', " ")) else { return };
    let ident = c"hystall";
    // SAFETY: openlog keeps the ident pointer; it is a 'static C string. The
    // format is a literal "%s" with one C-string argument.
    unsafe {
        libc::openlog(ident.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON);
        libc::syslog(libc::LOG_WARNING, c"%s".as_ptr(), c.as_ptr());
    }
}
