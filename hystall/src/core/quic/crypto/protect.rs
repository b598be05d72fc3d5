//! Removing packet protection: the header mask (RFC 9001 §5.4), the packet
//! number (RFC 9000 §17.1, Appendix A.3) and the AEAD (RFC 9001 §5.3).
//!
//! The header key and the payload key are separate types because a key
//! update replaces only the payload key (RFC 9001 §6): the header-protection
//! key of a direction stays the first 1-RTT generation's for the whole
//! connection.

use ring::aead;

use super::error::CryptoError;
use super::schedule::{Secret, key_material};
use super::suite::Suite;
use crate::core::quic::Version;

/// Bytes of AEAD tag at the end of every protected payload.
const TAG_LEN: usize = 16;
/// Header protection samples 16 bytes...
const SAMPLE_LEN: usize = 16;
/// ...starting 4 bytes after the packet-number offset, as if the packet
/// number were always 4 bytes long.
const SAMPLE_OFFSET: usize = 4;

/// A header-protection key.
pub struct HeaderKey {
    key: aead::quic::HeaderProtectionKey,
}

impl HeaderKey {
    /// The key from raw bytes (16 bytes for AES-128, 32 otherwise).
    pub fn new(suite: Suite, key: &[u8]) -> Result<Self, CryptoError> {
        let key =
            aead::quic::HeaderProtectionKey::new(suite.header_protection(), key).map_err(|_| CryptoError::Library)?;
        Ok(Self { key })
    }

    fn mask(&self, sample: &[u8]) -> Result<[u8; 5], CryptoError> {
        self.key.new_mask(sample).map_err(|_| CryptoError::Library)
    }
}

impl std::fmt::Debug for HeaderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeaderKey(..)")
    }
}

/// An AEAD key and IV: one generation of one direction's packet protection.
pub struct PayloadKey {
    key: aead::LessSafeKey,
    iv: [u8; 12],
}

impl PayloadKey {
    /// The key from raw bytes.
    pub fn new(suite: Suite, key: &[u8], iv: [u8; 12]) -> Result<Self, CryptoError> {
        let key = aead::UnboundKey::new(suite.aead(), key).map_err(|_| CryptoError::Library)?;
        Ok(Self { key: aead::LessSafeKey::new(key), iv })
    }

    /// The payload key of `secret` (its header key is not needed after a key update).
    pub fn from_secret(version: Version, suite: Suite, secret: &Secret) -> Result<Self, CryptoError> {
        let m = key_material(version, suite, secret)?;
        Self::new(suite, &m.key, m.iv)
    }

    /// Opens the payload of an unprotected packet in place: `packet` is the
    /// whole packet with header protection removed, `header_len` the length
    /// of its header (through the packet number), which is the AAD. Returns
    /// the plaintext, at `packet[header_len..]`.
    pub fn open<'p>(&self, pn: u64, packet: &'p mut [u8], header_len: usize) -> Result<&'p mut [u8], CryptoError> {
        if header_len > packet.len() {
            return Err(CryptoError::TooShort { need: header_len, have: packet.len() });
        }
        let (header, payload) = packet.split_at_mut(header_len);
        if payload.len() < TAG_LEN {
            return Err(CryptoError::NoTag { len: payload.len() });
        }
        let mut nonce = self.iv;
        for (n, p) in nonce.iter_mut().skip(4).zip(pn.to_be_bytes()) {
            *n ^= p;
        }
        let nonce = aead::Nonce::assume_unique_for_key(nonce);
        self.key.open_in_place(nonce, aead::Aad::from(&*header), payload).map_err(|_| CryptoError::AuthFailed)
    }
}

impl std::fmt::Debug for PayloadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PayloadKey(..)")
    }
}

/// Header and payload keys of one direction, one generation.
#[derive(Debug)]
pub struct PacketKeys {
    /// Removes header protection.
    pub header: HeaderKey,
    /// Opens payloads.
    pub payload: PayloadKey,
}

impl PacketKeys {
    /// Both keys from a traffic secret.
    pub fn from_secret(version: Version, suite: Suite, secret: &Secret) -> Result<Self, CryptoError> {
        let m = key_material(version, suite, secret)?;
        Ok(Self { header: HeaderKey::new(suite, &m.hp)?, payload: PayloadKey::new(suite, &m.key, m.iv)? })
    }
}

/// What header-protection removal reveals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unprotected {
    /// The first byte, unmasked.
    pub first_byte: u8,
    /// Length of the packet number on the wire (1 to 4).
    pub pn_len: usize,
    /// The full packet number, reconstructed.
    pub pn: u64,
    /// Length of the header through the packet number: the AAD.
    pub header_len: usize,
    /// Short headers: the key phase bit (0x04). `None` for long headers.
    pub key_phase: Option<bool>,
}

/// Removes header protection in place: unmasks the first byte's low bits
/// (4 for long headers, 5 for short) and the packet number, and
/// reconstructs the full packet number from `largest_pn`, the largest
/// packet number opened so far in this packet-number space and direction.
///
/// With a wrong key this "succeeds" with garbage: only the AEAD can tell.
pub fn remove_header_protection(
    key: &HeaderKey,
    packet: &mut [u8],
    pn_offset: usize,
    largest_pn: Option<u64>,
) -> Result<Unprotected, CryptoError> {
    let need = SAMPLE_OFFSET + SAMPLE_LEN;
    let have = packet.len().saturating_sub(pn_offset);
    let short = CryptoError::TooShort { need, have };
    // The sample's end is the furthest byte read; below it nothing overflows.
    let sample_end = pn_offset.checked_add(need).filter(|&end| end <= packet.len()).ok_or(short)?;
    let sample = packet.get(sample_end - SAMPLE_LEN..sample_end).ok_or(short)?;
    let mask = key.mask(sample)?;
    let [m0, pn_mask @ ..] = mask;
    let first = packet.first_mut().ok_or(short)?;
    let long = *first & 0x80 != 0;
    *first ^= m0 & if long { 0x0f } else { 0x1f };
    let first_byte = *first;
    let pn_len = usize::from(first_byte & 0x03) + 1;
    let pn_bytes = packet.get_mut(pn_offset..pn_offset + pn_len).ok_or(short)?;
    let mut truncated = 0u64;
    for (b, m) in pn_bytes.iter_mut().zip(pn_mask) {
        *b ^= m;
        truncated = (truncated << 8) | u64::from(*b);
    }
    Ok(Unprotected {
        first_byte,
        pn_len,
        pn: decode_packet_number(largest_pn, truncated, pn_len * 8),
        header_len: pn_offset + pn_len,
        key_phase: (!long).then_some(first_byte & 0x04 != 0),
    })
}

/// The full packet number closest to the next expected one whose low
/// `bits` bits are `truncated` (RFC 9000 Appendix A.3). `largest` is the
/// largest packet number received in the space, `None` before the first.
pub fn decode_packet_number(largest: Option<u64>, truncated: u64, bits: usize) -> u64 {
    let expected = largest.map_or(0, |l| l.saturating_add(1));
    let window = 1u64 << bits.clamp(8, 32);
    let half = window / 2;
    let mask = window - 1;
    let candidate = (expected & !mask) | (truncated & mask);
    if candidate.saturating_add(half) <= expected && candidate < (1 << 62) - window {
        candidate + window
    } else if candidate > expected.saturating_add(half) && candidate >= window {
        candidate - window
    } else {
        candidate
    }
}
