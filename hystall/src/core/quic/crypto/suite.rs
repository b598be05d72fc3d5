//! The TLS 1.3 cipher suites QUIC uses, and the ring algorithms behind each.

use ring::{aead, hkdf};

/// A TLS 1.3 cipher suite usable with QUIC (RFC 9001 §5.3). The Initial
/// packets always use AES-128-GCM with SHA-256; the handshake picks the
/// suite for everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Suite {
    /// TLS_AES_128_GCM_SHA256 (0x1301).
    Aes128Gcm,
    /// TLS_AES_256_GCM_SHA384 (0x1302).
    Aes256Gcm,
    /// TLS_CHACHA20_POLY1305_SHA256 (0x1303).
    ChaCha20Poly1305,
}

impl Suite {
    /// Every suite, in the order trial decryption tries them.
    pub const ALL: [Self; 3] = [Self::Aes128Gcm, Self::ChaCha20Poly1305, Self::Aes256Gcm];

    /// The suite for a TLS cipher-suite code point, if QUIC can use it.
    pub const fn from_tls_id(id: u16) -> Option<Self> {
        match id {
            0x1301 => Some(Self::Aes128Gcm),
            0x1302 => Some(Self::Aes256Gcm),
            0x1303 => Some(Self::ChaCha20Poly1305),
            _ => None,
        }
    }

    /// The TLS code point.
    pub const fn tls_id(self) -> u16 {
        match self {
            Self::Aes128Gcm => 0x1301,
            Self::Aes256Gcm => 0x1302,
            Self::ChaCha20Poly1305 => 0x1303,
        }
    }

    /// Length of the suite's hash, which is the length of its traffic secrets.
    pub const fn hash_len(self) -> usize {
        match self {
            Self::Aes128Gcm | Self::ChaCha20Poly1305 => 32,
            Self::Aes256Gcm => 48,
        }
    }

    /// Length of the AEAD key and of the header-protection key.
    pub const fn key_len(self) -> usize {
        match self {
            Self::Aes128Gcm => 16,
            Self::Aes256Gcm | Self::ChaCha20Poly1305 => 32,
        }
    }

    /// The suites whose secrets are `len` bytes long: what trial decryption
    /// tries when the ServerHello was not captured.
    pub fn for_secret_len(len: usize) -> impl Iterator<Item = Self> {
        Self::ALL.into_iter().filter(move |s| s.hash_len() == len)
    }

    pub(super) fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Self::Aes128Gcm | Self::ChaCha20Poly1305 => hkdf::HKDF_SHA256,
            Self::Aes256Gcm => hkdf::HKDF_SHA384,
        }
    }

    pub(super) fn aead(self) -> &'static aead::Algorithm {
        match self {
            Self::Aes128Gcm => &aead::AES_128_GCM,
            Self::Aes256Gcm => &aead::AES_256_GCM,
            Self::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }

    pub(super) fn header_protection(self) -> &'static aead::quic::Algorithm {
        match self {
            Self::Aes128Gcm => &aead::quic::AES_128,
            Self::Aes256Gcm => &aead::quic::AES_256,
            Self::ChaCha20Poly1305 => &aead::quic::CHACHA20,
        }
    }
}
