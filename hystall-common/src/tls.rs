//! TLS secrets read at the entry of Go's `crypto/tls.(*Config).writeKeyLog`
//! (`--decrypt`): every TLS 1.3 handshake of a Go server passes its secrets
//! there, whether or not a key log is configured (the function checks for a
//! writer itself), so a uprobe on its entry sees them all.

/// Ring buffer of secrets. A handshake gives four (two handshake, two traffic
/// secrets) of `size_of::<TlsSecret>()` = 152 bytes: 256 KiB holds ~400
/// handshakes between two drains.
pub const SECRETS_RING_BYTES: u32 = 1 << 18;
/// Longest label copied ("CLIENT_HANDSHAKE_TRAFFIC_SECRET" is 31 bytes).
pub const SECRET_LABEL_MAX: usize = 32;
/// A TLS ClientHello random.
pub const CLIENT_RANDOM_LEN: usize = 32;
/// Longest secret copied (SHA-384 suites give 48 bytes).
pub const SECRET_MAX: usize = 48;

/// One key-log line, as the function received it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsSecret {
    pub tgid: u32,
    /// Lengths the caller passed (may exceed what was copied: then user space
    /// drops the record).
    pub label_len: u32,
    pub random_len: u32,
    pub secret_len: u32,
    pub ts_ns: u64,
    pub label: [u8; SECRET_LABEL_MAX],
    pub random: [u8; CLIENT_RANDOM_LEN],
    pub secret: [u8; SECRET_MAX],
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::TlsSecret {}
}
