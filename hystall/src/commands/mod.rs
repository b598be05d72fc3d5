//! One module per subcommand: each wires sources → core → sinks.

pub mod doctor;
pub mod lab_side;
pub mod pcap;
pub mod pcap_bytes;
pub mod pipeline;
pub mod record;
pub mod replay;
pub mod top;
pub mod watch;

/// Exits with a clear message when not root (or without the capabilities).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
