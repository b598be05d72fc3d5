//! Passive QUIC header decoding: what a UDP payload shows without keys.
//!
//! The proxy's QUIC traffic is encrypted; only headers are visible. This
//! module splits a UDP payload into its coalesced QUIC packets and reads, per
//! packet: version, packet type, DCID/SCID, the Initial token, the Length
//! field, the packet's extent in the datagram and the fixed bit, for v1,
//! v2 (RFC 9369), draft-29, Version Negotiation, Retry and, for unknown
//! versions, the invariants (RFC 8999). The grouping logic uses the CIDs to tie
//! packets (and port-hopping 5-tuples) to one connection; see
//! [`Packet::client_to_server_keys`] and [`Packet::server_cid_len_hint`].
//!
//! What it does not do: remove header protection. Without keys the packet
//! number, its length, the reserved bits and the key phase are masked, so the
//! types keep the first byte as `first_byte_protected` and offer only the
//! offset of the packet number. Offline decryption with a key log is a
//! separate layer on top of these offsets: [`crypto`] (RFC 9001/9369 packet
//! protection), [`KeyLog`] (SSLKEYLOGFILE), [`ConnDecryptor`] (one
//! connection, both directions, key updates, trial decryption without the
//! handshake) and [`parse_frames`] (the decrypted frames).
//!
//! It is pure code: no I/O, no allocation, borrowing from the input, and it
//! never panics (every read is bounds-checked; the tests feed it every prefix
//! of valid packets and thousands of random buffers).
//!
//! Salamander (Hysteria's obfuscation) XORs the whole payload, so obfuscated
//! traffic shows up as [`DecodeError::FixedBitClear`] (half the time: the
//! short-header form with a clear fixed bit), as an "unknown version" long
//! header (a random version), or as inconsistent lengths
//! ([`ErrorKind::Malformed`]). Any of these on a client→server flow means:
//! fall back to 5-tuple grouping, and say so.
//!
//! # Why not quinn-proto's parser
//!
//! quinn-proto 0.11 exports `PartialDecode`, `ProtectedHeader`,
//! `ConnectionIdParser` and `FixedLengthConnectionIdParser` (checked against
//! 0.11.19, `src/packet.rs`). The decoder here is self-contained and
//! quinn-proto is used only in tests, as a cross-check on v1/draft-29 packets,
//! because that parser is an endpoint's, not an observer's:
//! - It takes ownership of a `BytesMut` (`PartialDecode::new`) or a
//!   `&mut io::Cursor<BytesMut>` (`ProtectedHeader::decode`): a copy per
//!   datagram, where this decoder borrows `&[u8]`.
//! - `PartialDecode` keeps its header private: publicly it offers only
//!   `dst_cid()`, `len()` and the trailing bytes.
//! - Versions outside the caller's `supported_versions` list become
//!   `PacketDecodeError::UnsupportedVersion` (with both CIDs, which is useful),
//!   and its default list (`DEFAULT_SUPPORTED_VERSIONS`) is v1 and drafts
//!   29–34, without v2. Draft-29 *is* supported.
//! - It does not know v2's renumbered long packet types: the (private)
//!   `LongHeaderType::from_byte` always applies v1's numbering, so a v2
//!   Initial listed as supported decodes as 0-RTT and a v2 Retry as an Initial
//!   (a test demonstrates it).
//! - It rejects CIDs over 20 bytes for every version, including Version
//!   Negotiation and unknown versions, where RFC 8999 allows 255; it checks
//!   the fixed bit before looking at the version, so a Version Negotiation
//!   packet with a clear (arbitrary) bit is rejected unless `grease_quic_bit`.
//! - Version Negotiation: no access to the version list. Retry: no access to
//!   the token or integrity tag, and no check that the 16 tag bytes exist.
//! - Short headers need a `ConnectionIdParser`; `FixedLengthConnectionIdParser`
//!   with a length over 20 would panic in `ConnectionId::from_buf` (it copies
//!   into a 20-byte array), so lengths from the wire must be checked first.
//! - Errors are `InvalidHeader(&'static str)`, without offsets or sizes.

pub mod crypto;
mod decrypt;
mod error;
mod frames;
mod header;
mod invariants;
mod keylog;
mod keys;
mod packet;
mod varint;

#[cfg(test)]
mod tests;

pub use decrypt::{ConnDecryptor, DEFAULT_TRIAL_LIMIT, DecryptError, DecryptStats, Direction, Opened, Space};
pub use error::{CidField, DecodeError, ErrorKind};
pub use frames::{Ack, CloseKind, EcnCounts, Frame, FrameError, FrameErrorKind, Frames, StreamDir, parse_frames};
pub use header::{DecodeOptions, Packets, ShortDcidLen, decode_packet, packets};
pub use invariants::{Peek, common_prefix, known_version};
pub use keylog::{ClientRandom, ConnSecrets, KeyLog};
pub use keys::{ConnectionId, KeyCandidates};
pub use packet::{
    Header, LongHeader, LongType, MAX_CID_LEN, MIN_PROTECTED_LEN, Packet, PacketType, RETRY_INTEGRITY_TAG_LEN,
    RetryHeader, ShortHeader, Token, UnknownVersionHeader, VERSION_1, VERSION_2, VERSION_DRAFT_29, VERSION_NEGOTIATION,
    Version, VersionNegotiation,
};
