//! Retry integrity tags (RFC 9001 §5.8, RFC 9369 §3.3.3): an AES-128-GCM tag
//! over the client's original DCID and the Retry packet, with keys fixed per
//! version. Verifying it tells an observer which Initial a Retry answers.

use ring::aead;

use crate::core::quic::{RETRY_INTEGRITY_TAG_LEN, Version};

fn fixed_key(version: Version) -> ([u8; 16], [u8; 12]) {
    match version {
        Version::V1 => (
            [0xbe, 0x0c, 0x69, 0x0b, 0x9f, 0x66, 0x57, 0x5a, 0x1d, 0x76, 0x6b, 0x54, 0xe3, 0x68, 0xc8, 0x4e],
            [0x46, 0x15, 0x99, 0xd3, 0x5d, 0x63, 0x2b, 0xf2, 0x23, 0x98, 0x25, 0xbb],
        ),
        Version::V2 => (
            [0x8f, 0xb4, 0xb0, 0x1b, 0x56, 0xac, 0x48, 0xe2, 0x60, 0xfb, 0xcb, 0xce, 0xad, 0x7c, 0xcc, 0x92],
            [0xd8, 0x69, 0x69, 0xbc, 0x2d, 0x7c, 0x6d, 0x99, 0x90, 0xef, 0xb0, 0x4a],
        ),
        Version::Draft29 => (
            [0xcc, 0xce, 0x18, 0x7e, 0xd0, 0x9a, 0x09, 0xd0, 0x57, 0x28, 0x15, 0x5a, 0x6c, 0xb9, 0x6b, 0xe1],
            [0xe5, 0x49, 0x30, 0xf9, 0x7f, 0x21, 0x36, 0xf0, 0x53, 0x0a, 0x8c, 0x1c],
        ),
    }
}

/// Whether `retry` (the whole Retry packet, tag included) carries a valid
/// integrity tag for a client whose original DCID was `original_dcid`.
pub fn verify_retry_integrity(version: Version, original_dcid: &[u8], retry: &[u8]) -> bool {
    let Some(body_len) = retry.len().checked_sub(RETRY_INTEGRITY_TAG_LEN) else { return false };
    let (body, tag) = retry.split_at(body_len);
    let Ok(odcid_len) = u8::try_from(original_dcid.len()) else { return false };
    let mut pseudo = Vec::with_capacity(1 + original_dcid.len() + body.len());
    pseudo.push(odcid_len);
    pseudo.extend_from_slice(original_dcid);
    pseudo.extend_from_slice(body);
    let (key, nonce) = fixed_key(version);
    let Ok(key) = aead::UnboundKey::new(&aead::AES_128_GCM, &key) else { return false };
    let key = aead::LessSafeKey::new(key);
    // Opening an empty ciphertext checks the tag over the AAD alone.
    let mut tag = tag.to_vec();
    key.open_in_place(aead::Nonce::assume_unique_for_key(nonce), aead::Aad::from(pseudo), &mut tag).is_ok()
}
