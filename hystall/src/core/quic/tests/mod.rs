//! Tests: RFC vectors, built datagrams, robustness, and a quinn-proto cross-check.

mod coalesced;
mod crypto_rfc;
mod decrypt;
mod frames;
mod keylog;
mod quinn;
mod rfc;
mod robust;

use super::{DecodeError, DecodeOptions, Packet, packets};

/// Hex to bytes; whitespace is ignored. Test inputs only.
pub(super) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .bytes()
        .filter(|b| !b.is_ascii_whitespace())
        .map(|b| match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => panic!("not a hex digit: {}", b as char),
        })
        .collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    digits.chunks(2).map(|p| (p[0] << 4) | p[1]).collect()
}

/// `prefix` followed by filler up to `total` bytes: for RFC packets whose
/// header we check but whose long ciphertext does not matter here.
pub(super) fn padded(prefix: &str, total: usize) -> Vec<u8> {
    let mut v = hex(prefix);
    assert!(v.len() <= total);
    v.resize(total, 0x5a);
    v
}

/// A long-header packet: `first`, version, CIDs, token (Initial only: pass
/// `Some`), a 2-byte Length, then `body_len` bytes standing for the protected
/// packet number and payload.
pub(super) fn long_packet(
    first: u8,
    version: u32,
    dcid: &[u8],
    scid: &[u8],
    token: Option<&[u8]>,
    body_len: usize,
) -> Vec<u8> {
    let mut v = vec![first];
    v.extend_from_slice(&version.to_be_bytes());
    v.push(dcid.len() as u8);
    v.extend_from_slice(dcid);
    v.push(scid.len() as u8);
    v.extend_from_slice(scid);
    if let Some(token) = token {
        assert!(token.len() < 64, "1-byte varint token length only");
        v.push(token.len() as u8);
        v.extend_from_slice(token);
    }
    assert!(body_len < 1 << 14);
    v.extend_from_slice(&(0x4000u16 | body_len as u16).to_be_bytes());
    v.extend(std::iter::repeat_n(0xa5, body_len));
    v
}

/// A short-header packet with `body_len` protected bytes after the DCID.
pub(super) fn short_packet(first: u8, dcid: &[u8], body_len: usize) -> Vec<u8> {
    let mut v = vec![first];
    v.extend_from_slice(dcid);
    v.extend(std::iter::repeat_n(0x3c, body_len));
    v
}

/// All packets of a datagram, panicking on any error.
pub(super) fn all_ok(datagram: &[u8], opts: DecodeOptions) -> Vec<Packet<'_>> {
    packets(datagram, opts).collect::<Result<Vec<_>, DecodeError>>().expect("every packet decodes")
}

/// xorshift64*: a tiny deterministic PRNG, so failures reproduce.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub(super) fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}
