//! Why a packet could not be unprotected or opened.

use thiserror::Error;

/// A reason packet protection could not be removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum CryptoError {
    /// Too few bytes after the packet-number offset for the header-protection
    /// sample (16 bytes, 4 bytes in), or for the packet number itself.
    #[error("packet too short for header protection: {have} bytes after the packet number offset, need {need}")]
    TooShort {
        /// Bytes needed from the packet-number offset.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The payload is shorter than the AEAD tag.
    #[error("payload of {len} bytes is shorter than the 16-byte AEAD tag")]
    NoTag {
        /// Payload length.
        len: usize,
    },
    /// A secret whose length does not fit the suite's hash.
    #[error("secret of {len} bytes does not fit the cipher suite (needs {need})")]
    SecretLength {
        /// Its length.
        len: usize,
        /// The suite's hash length.
        need: usize,
    },
    /// The AEAD tag did not verify: wrong keys, or a corrupt packet.
    #[error("AEAD authentication failed")]
    AuthFailed,
    /// ring refused a key or a sample (should not happen with derived keys).
    #[error("the crypto library refused the key material")]
    Library,
}
