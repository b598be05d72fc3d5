//! Why a UDP payload (or its tail) is not a QUIC packet we can read.
//!
//! Every input is the *whole* UDP payload, so a field that runs past its end is
//! an inconsistency, not a short read: for traffic on a QUIC port it usually
//! means the bytes are obfuscated (Hysteria's Salamander XORs the whole payload,
//! first byte and lengths included) or not QUIC at all.

use thiserror::Error;

/// Which connection ID field an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CidField {
    /// Destination Connection ID of a long header.
    Dcid,
    /// Source Connection ID of a long header.
    Scid,
    /// Destination Connection ID of a short header (its length came from the caller).
    ShortDcid,
}

impl std::fmt::Display for CidField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Dcid => "DCID",
            Self::Scid => "SCID",
            Self::ShortDcid => "short-header DCID",
        })
    }
}

/// Coarse class of a [`DecodeError`], for counters and for "say so" messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Nothing to decode.
    Empty,
    /// The wire image is not QUIC's: the fixed bit (QUIC bit) is clear.
    /// Salamander-obfuscated or foreign traffic.
    NotQuic,
    /// QUIC-shaped but inconsistent (lengths, CID sizes): corrupt, obfuscated,
    /// or not QUIC.
    Malformed,
    /// All-zero bytes after at least one good packet; not a packet, not garbage.
    Padding,
}

/// A reason the decoder stopped. Offsets are from the start of the UDP payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Error)]
pub enum DecodeError {
    /// The UDP payload is empty.
    #[error("empty UDP payload")]
    Empty,
    /// A header field runs past the end of the datagram.
    #[error("truncated {what} at offset {at}: need {need} bytes, {have} left")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Offset of the field.
        at: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes left in the datagram at `at`.
        have: usize,
    },
    /// The fixed bit (0x40, "QUIC bit") is clear on a packet whose version
    /// requires it. Not QUIC v1/v2, or obfuscated (Salamander), unless the peers
    /// negotiated RFC 9287 greasing (see `DecodeOptions::allow_clear_fixed_bit`).
    #[error("fixed bit clear at offset {at}: not QUIC, or obfuscated (e.g. Salamander)")]
    FixedBitClear {
        /// Offset of the packet's first byte.
        at: usize,
    },
    /// A connection ID longer than the 20 bytes QUIC v1/v2 allow.
    #[error("{which} length {len} exceeds 20 bytes (QUIC v1/v2 limit)")]
    CidTooLong {
        /// Which field.
        which: CidField,
        /// Its length on the wire (or as given, for short headers).
        len: usize,
    },
    /// A long header's Length field claims more bytes than the datagram has left.
    #[error("Length field {declared} at offset {at} exceeds the {available} bytes left")]
    BadLength {
        /// Offset of the packet-number field (where Length starts counting).
        at: usize,
        /// The Length value.
        declared: u64,
        /// Bytes actually left from `at`.
        available: usize,
    },
    /// Fewer than 20 bytes from the packet-number offset to the end of the
    /// packet: header protection samples 16 bytes starting 4 bytes after the
    /// packet-number offset (RFC 9001 §5.4.2), so senders always pad to this.
    #[error("packet at offset {at} has {have} bytes after its header, header protection needs 20")]
    TooSmallForHeaderProtection {
        /// Offset of the packet's first byte.
        at: usize,
        /// Bytes from the packet-number offset to the end of the packet.
        have: u64,
    },
    /// A Version Negotiation packet whose version list is not whole 32-bit words.
    #[error("version negotiation list of {len} bytes is not a multiple of 4")]
    BadVersionList {
        /// Length of the list in bytes.
        len: usize,
    },
    /// The rest of the datagram, after at least one packet, is all zero bytes.
    #[error("{len} zero bytes of padding at offset {at}")]
    ZeroPadding {
        /// Offset of the first zero byte.
        at: usize,
        /// How many.
        len: usize,
    },
}

impl DecodeError {
    /// The coarse class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Empty => ErrorKind::Empty,
            Self::FixedBitClear { .. } => ErrorKind::NotQuic,
            Self::ZeroPadding { .. } => ErrorKind::Padding,
            Self::Truncated { .. }
            | Self::CidTooLong { .. }
            | Self::BadLength { .. }
            | Self::TooSmallForHeaderProtection { .. }
            | Self::BadVersionList { .. } => ErrorKind::Malformed,
        }
    }
}
