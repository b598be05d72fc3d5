//! How the results of sends are seen on the running kernel, best first.
//!
//! The stall rule needs to know when a writer is blocked on a target socket.
//! Kernels differ in what shows it, so the path is chosen at load time by what
//! attaches (never by version numbers):
//!
//! 1. the `sock/sock_send_length` tracepoint (BTF, Linux 6.4+): every send's
//!    result, EAGAIN included;
//! 2. fexit on `tcp_sendmsg` (BTF trampolines): the same results, on the
//!    distribution kernels before 6.4 (Debian 11's 5.10, Debian 12's 6.1);
//! 3. zero windows: where neither attaches, `tcp_probe` marks a socket blocked
//!    while its peer's window is zero and its send buffer is full — the state
//!    in which every write blocks or fails with EAGAIN. It needs no process
//!    context; what it cannot see is a writer blocked on a socket whose peer
//!    still reads (that is a slow target, never a stall, so verdicts match).
//!
//! `HYSTALL_SEND_PATH` (`tracepoint`, `fexit`, `zero_window`) forces a lower
//! path for tests and comparisons; a path that cannot attach falls to the next.

use serde::Serialize;

/// The environment variable that forces a path (tests, diagnostics).
pub const FORCE_ENV: &str = "HYSTALL_SEND_PATH";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SendPath {
    Tracepoint,
    Fexit,
    ZeroWindow,
}

impl SendPath {
    pub const ALL: [SendPath; 3] = [SendPath::Tracepoint, SendPath::Fexit, SendPath::ZeroWindow];

    /// The name events, metrics and `HYSTALL_SEND_PATH` use.
    pub fn id(self) -> &'static str {
        match self {
            SendPath::Tracepoint => "tracepoint",
            SendPath::Fexit => "fexit",
            SendPath::ZeroWindow => "zero_window",
        }
    }

    /// One line for `doctor`, `watch_started` and `top`'s header.
    pub fn describe(self) -> &'static str {
        match self {
            SendPath::Tracepoint => "send results from the sock_send_length tracepoint",
            SendPath::Fexit => "send results from fexit on tcp_sendmsg (no sock_send_length tracepoint here)",
            SendPath::ZeroWindow => {
                "blocks read from zero peer windows with full send buffers (tcp_probe; no send-result hook here)"
            }
        }
    }

    /// The program that implements the path (None: tcp_probe's switch).
    pub fn program(self) -> Option<&'static str> {
        match self {
            SendPath::Tracepoint => Some("sock_send_length"),
            SendPath::Fexit => Some("tcp_sendmsg_exit"),
            SendPath::ZeroWindow => None,
        }
    }

    pub fn parse(s: &str) -> Option<SendPath> {
        SendPath::ALL.into_iter().find(|p| p.id() == s.trim())
    }

    /// The best path allowed: `HYSTALL_SEND_PATH` when set and valid.
    pub fn forced_from(value: Option<&str>) -> Result<SendPath, String> {
        match value {
            None | Some("") => Ok(SendPath::Tracepoint),
            Some(v) => SendPath::parse(v)
                .ok_or_else(|| format!("{FORCE_ENV}={v}: expected one of tracepoint, fexit, zero_window")),
        }
    }
}

/// `watch_started.send_path`, `doctor`'s line and `top`'s header.
pub fn info(path: Option<SendPath>) -> crate::core::event::SendPathInfo {
    match path {
        Some(p) => crate::core::event::SendPathInfo { path: p.id().into(), note: p.describe().into() },
        None => crate::core::event::SendPathInfo {
            path: "none".into(),
            note: "no program sees blocked non-blocking writers here (no sock_send_length, no fexit on tcp_sendmsg, no tcp_probe): only writers parked in a blocking send are found".into(),
        },
    }
}

/// Whether the program `prog` is to be tried, given the best path allowed
/// (`floor`) and the path already attached (`have`): one send-result program
/// at most, the best that attaches.
pub fn wanted(prog: &str, floor: SendPath, have: Option<SendPath>) -> bool {
    let Some(path) = SendPath::ALL.into_iter().find(|p| p.program() == Some(prog)) else { return true };
    path >= floor && have.is_none()
}

/// The path in use once the programs were tried: the first that attached,
/// else zero windows (which needs `tcp_probe`: None without it).
pub fn chosen(attached: &[&str], tcp_probe: bool) -> Option<SendPath> {
    SendPath::ALL
        .into_iter()
        .find(|p| p.program().is_some_and(|prog| attached.contains(&prog)))
        .or(tcp_probe.then_some(SendPath::ZeroWindow))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_path_that_attaches_is_chosen() {
        assert_eq!(chosen(&["sock_send_length", "tcp_probe"], true), Some(SendPath::Tracepoint));
        assert_eq!(chosen(&["tcp_sendmsg_exit", "tcp_probe"], true), Some(SendPath::Fexit));
        assert_eq!(chosen(&["tcp_probe"], true), Some(SendPath::ZeroWindow));
        assert_eq!(chosen(&[], false), None);
    }

    #[test]
    fn only_one_send_result_program_is_tried_and_never_above_the_forced_path() {
        // 6.4+: the tracepoint attaches, fexit is not tried.
        assert!(wanted("sock_send_length", SendPath::Tracepoint, None));
        assert!(!wanted("tcp_sendmsg_exit", SendPath::Tracepoint, Some(SendPath::Tracepoint)));
        // 6.1: the tracepoint failed, fexit is tried.
        assert!(wanted("tcp_sendmsg_exit", SendPath::Tracepoint, None));
        // Forced lower: the better programs are skipped.
        assert!(!wanted("sock_send_length", SendPath::Fexit, None));
        assert!(wanted("tcp_sendmsg_exit", SendPath::Fexit, None));
        assert!(!wanted("tcp_sendmsg_exit", SendPath::ZeroWindow, None));
        // Other programs are always tried.
        assert!(wanted("tcp_probe", SendPath::ZeroWindow, Some(SendPath::Fexit)));
    }

    #[test]
    fn the_forcing_variable_is_checked() {
        assert_eq!(SendPath::forced_from(None), Ok(SendPath::Tracepoint));
        assert_eq!(SendPath::forced_from(Some("zero_window")), Ok(SendPath::ZeroWindow));
        assert_eq!(SendPath::forced_from(Some("fexit")), Ok(SendPath::Fexit));
        assert!(SendPath::forced_from(Some("kprobe")).unwrap_err().contains("expected one of"));
    }
}
