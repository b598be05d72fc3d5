//! QUIC packet protection (RFC 9001 §5, RFC 9369 §3.3) for an offline observer.
//!
//! Pure functions over byte slices: the key schedule (HKDF-Expand-Label with
//! the version's labels), Initial secrets from the client's original DCID,
//! header-protection removal, packet-number reconstruction, AEAD opening, key
//! updates and Retry integrity tags. The primitives are ring's (HKDF, AES-GCM,
//! ChaCha20-Poly1305, and `ring::aead::quic` for the header masks): nothing
//! cryptographic is implemented here, only the QUIC glue around it.
//!
//! Nothing here panics on wire data; a packet that cannot be opened is a
//! [`CryptoError`].

mod error;
mod protect;
mod retry;
mod schedule;
mod suite;

pub use error::CryptoError;
pub use protect::{HeaderKey, PacketKeys, PayloadKey, Unprotected, decode_packet_number, remove_header_protection};
pub use retry::verify_retry_integrity;
pub use schedule::{
    InitialSecrets, KeyMaterial, Secret, hkdf_expand_label, initial_secrets, key_material, next_secret,
};
pub use suite::Suite;
