//! Vectors from RFC 9001 Appendix A (v1) and RFC 9369 Appendix A (v2).
//!
//! The short packets (Retry, ChaCha20 short header) and the server Initial of
//! RFC 9001 are byte-exact; the 1200-byte client Initials are their exact
//! first 32 bytes (header, protected packet number, sample) padded to the
//! RFC's total size, which is all a header decoder looks at.

use super::super::{DecodeError, DecodeOptions, Header, LongType, PacketType, Version, decode_packet, packets};
use super::{all_ok, hex, padded};

pub(in super::super) const ODCID: &str = "8394c8f03e515708";
pub(in super::super) const SERVER_SCID: &str = "f067a5502a4262b5";

/// RFC 9001 A.2: client Initial, first 32 bytes; 1200 bytes in all.
pub(in super::super) fn v1_client_initial() -> Vec<u8> {
    padded("c000000001088394c8f03e5157080000449e7b9aec34d1b1c98dd7689fb8ec11", 1200)
}

/// RFC 9001 A.3: server Initial, exact (135 bytes).
pub(in super::super) fn v1_server_initial() -> Vec<u8> {
    hex("cf000000010008f067a5502a4262b5004075c0d95a482cd0991cd25b0aac406a
         5816b6394100f37a1c69797554780bb38cc5a99f5ede4cf73c3ec2493a1839b3
         dbcba3f6ea46c5b7684df3548e7ddeb9c3bf9c73cc3f3bded74b562bfb19fb84
         022f8ef4cdd93795d77d06edbb7aaf2f58891850abbdca3d20398c276456cbc4
         2158407dd074ee")
}

/// RFC 9001 A.4: Retry, exact.
pub(in super::super) fn v1_retry() -> Vec<u8> {
    hex("ff000000010008f067a5502a4262b5746f6b656e04a265ba2eff4d829058fb3f0f2496ba")
}

/// RFC 9001 A.5: ChaCha20-Poly1305 short header, exact; DCID length 0.
pub(in super::super) fn v1_short() -> Vec<u8> {
    hex("4cfe4189655e5cd55c41f69080575d7999c25a5bfb")
}

/// RFC 9369 A.2: v2 client Initial, first 32 bytes; 1200 bytes in all.
pub(in super::super) fn v2_client_initial() -> Vec<u8> {
    padded("d76b3343cf088394c8f03e5157080000449ea0c95e82ffe67b6abcdb4298b485", 1200)
}

/// RFC 9369 A.3: v2 server Initial, first 32 bytes; 135 bytes in all.
pub(in super::super) fn v2_server_initial() -> Vec<u8> {
    padded("dc6b3343cf0008f067a5502a4262b5004075d92faaf16f05d8a4398c47089698", 135)
}

/// RFC 9369 A.4: v2 Retry, exact.
pub(in super::super) fn v2_retry() -> Vec<u8> {
    hex("cf6b3343cf0008f067a5502a4262b5746f6b656ec8646ce8bfe33952d955543665dcc7b6")
}

/// RFC 9369 A.5: v2 ChaCha20-Poly1305 short header, exact; DCID length 0.
pub(in super::super) fn v2_short() -> Vec<u8> {
    hex("5558b1c60ae7b6b932bc27d786f4bc2bb20f2162ba")
}

fn only_packet(datagram: &[u8], opts: DecodeOptions) -> super::super::Packet<'_> {
    let all = all_ok(datagram, opts);
    assert_eq!(all.len(), 1, "one packet: {all:?}");
    all[0]
}

fn check_client_initial(datagram: &[u8], version: Version, first: u8) {
    let p = only_packet(datagram, DecodeOptions::default());
    assert_eq!((p.offset, p.len), (0, 1200));
    assert_eq!(p.packet_type(), PacketType::Initial);
    assert_eq!(p.version(), Some(version.wire()));
    let Header::Long(h) = p.header else { panic!("long header expected: {p:?}") };
    assert_eq!(h.version, version);
    assert_eq!(h.packet_type, LongType::Initial);
    assert_eq!(h.first_byte_protected, first);
    assert!(h.fixed_bit);
    assert_eq!(h.dcid, hex(ODCID));
    assert!(h.scid.is_empty());
    let token = h.token.expect("Initial has a token field");
    assert_eq!((token.offset, token.bytes.len()), (16, 0));
    assert_eq!(h.length, 0x049e);
    assert_eq!(h.pn_offset, 18);
    assert_eq!(h.pn_offset + h.length as usize, 1200);
}

#[test]
fn rfc9001_a2_client_initial() {
    check_client_initial(&v1_client_initial(), Version::V1, 0xc0);
}

#[test]
fn rfc9369_a2_v2_client_initial_type_bits_are_remapped() {
    // 0xd7: type bits 0b01, which is 0-RTT in v1 but Initial in v2.
    check_client_initial(&v2_client_initial(), Version::V2, 0xd7);
}

fn check_server_initial(datagram: &[u8], version: Version) {
    assert_eq!(datagram.len(), 135);
    let p = only_packet(datagram, DecodeOptions::default());
    assert_eq!((p.offset, p.len), (0, 135));
    let Header::Long(h) = p.header else { panic!("long header expected: {p:?}") };
    assert_eq!((h.version, h.packet_type), (version, LongType::Initial));
    assert!(h.dcid.is_empty());
    assert_eq!(h.scid, hex(SERVER_SCID));
    let token = h.token.expect("Initial has a token field");
    assert_eq!((token.offset, token.bytes), (16, &[][..]));
    assert_eq!((h.length, h.pn_offset), (0x75, 18));
    // What a tracker learns: this server's CIDs are 8 bytes long.
    assert_eq!(p.server_cid_len_hint(), Some(8));
}

#[test]
fn rfc9001_a3_server_initial() {
    check_server_initial(&v1_server_initial(), Version::V1);
}

#[test]
fn rfc9369_a3_v2_server_initial() {
    check_server_initial(&v2_server_initial(), Version::V2);
}

fn check_retry(datagram: &[u8], version: Version, first: u8, tag: &str) {
    let p = only_packet(datagram, DecodeOptions::default());
    assert_eq!((p.offset, p.len), (0, 36));
    assert_eq!(p.packet_type(), PacketType::Retry);
    let Header::Retry(h) = p.header else { panic!("Retry expected: {p:?}") };
    assert_eq!((h.version, h.first_byte), (version, first));
    assert!(h.dcid.is_empty());
    assert_eq!(h.scid, hex(SERVER_SCID));
    assert_eq!((h.token.offset, h.token.bytes), (15, &b"token"[..]));
    assert_eq!(h.integrity_tag[..], hex(tag));
    assert_eq!(p.server_cid_len_hint(), Some(8));
}

#[test]
fn rfc9001_a4_retry() {
    check_retry(&v1_retry(), Version::V1, 0xff, "04a265ba2eff4d829058fb3f0f2496ba");
}

#[test]
fn rfc9369_a4_v2_retry_type_bits_are_remapped() {
    // 0xcf: type bits 0b00, Initial in v1, Retry in v2.
    check_retry(&v2_retry(), Version::V2, 0xcf, "c8646ce8bfe33952d955543665dcc7b6");
}

fn check_short(datagram: &[u8], first: u8) {
    let p = only_packet(datagram, DecodeOptions::with_short_dcid_len(0));
    assert_eq!((p.offset, p.len), (0, 21));
    assert_eq!(p.packet_type(), PacketType::OneRtt);
    assert_eq!(p.version(), None);
    let Header::Short(h) = p.header else { panic!("short header expected: {p:?}") };
    assert_eq!(h.first_byte_protected, first);
    assert!(h.fixed_bit);
    assert!(!h.spin_bit);
    assert_eq!((h.dcid, h.pn_offset), (Some(&[][..]), Some(1)));
    // Unknown DCID length: same packet, no DCID.
    let p = only_packet(datagram, DecodeOptions::default());
    let Header::Short(h) = p.header else { panic!("short header expected: {p:?}") };
    assert_eq!((h.dcid, h.pn_offset, p.len), (None, None, 21));
}

#[test]
fn rfc9001_a5_chacha20_short_header() {
    check_short(&v1_short(), 0x4c);
}

#[test]
fn rfc9369_a5_v2_chacha20_short_header() {
    check_short(&v2_short(), 0x55);
}

#[test]
fn a5_short_header_one_byte_shorter_is_too_small_for_a_sample() {
    let short = v1_short();
    let err = decode_packet(&short[..20], 0, &DecodeOptions::with_short_dcid_len(0));
    assert_eq!(err, Err(DecodeError::TooSmallForHeaderProtection { at: 0, have: 19 }));
    // A.5 with a 4-byte DCID assumed leaves only 16 bytes: not a packet.
    let err = decode_packet(&short, 0, &DecodeOptions::with_short_dcid_len(4));
    assert_eq!(err, Err(DecodeError::TooSmallForHeaderProtection { at: 0, have: 16 }));
}

#[test]
fn rfc_initial_with_a_wrong_total_size_is_a_bad_length() {
    let mut short_by_one = v1_client_initial();
    short_by_one.pop();
    let first = packets(&short_by_one, DecodeOptions::default()).next();
    assert_eq!(first, Some(Err(DecodeError::BadLength { at: 18, declared: 1182, available: 1181 })));
}
