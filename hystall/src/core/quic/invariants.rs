//! What the first bytes of a UDP payload say, by the version-independent rules
//! (RFC 8999). The TC probe sends only a prefix of each sampled packet (64
//! bytes), which is enough for a long header's connection IDs but not for the
//! full decoder (`header.rs`), which checks lengths against the whole packet.

use super::keys::ConnectionId;
use super::packet::{VERSION_1, VERSION_2, VERSION_DRAFT_29, VERSION_NEGOTIATION};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peek {
    /// Long header: version and both connection IDs.
    Long { version: u32, dcid: ConnectionId, scid: ConnectionId, fixed_bit: bool },
    /// Short header: the bytes after the first one (DCID, then protected packet number).
    Short { fixed_bit: bool },
    /// Too short, or CID lengths that do not fit: not a QUIC header.
    Invalid,
}

impl Peek {
    pub fn of(bytes: &[u8]) -> Peek {
        let Some(&first) = bytes.first() else { return Peek::Short { fixed_bit: false } };
        let fixed_bit = first & 0x40 != 0;
        if first & 0x80 == 0 {
            return Peek::Short { fixed_bit };
        }
        let Some(v) = bytes.get(1..5) else { return Peek::Invalid };
        let version = u32::from_be_bytes([v[0], v[1], v[2], v[3]]);
        let Some(&dl) = bytes.get(5) else { return Peek::Invalid };
        let Some(dcid) = bytes.get(6..6 + dl as usize).and_then(ConnectionId::new) else { return Peek::Invalid };
        let at = 6 + dl as usize;
        let Some(&sl) = bytes.get(at) else { return Peek::Invalid };
        let Some(scid) = bytes.get(at + 1..at + 1 + sl as usize).and_then(ConnectionId::new) else {
            return Peek::Invalid;
        };
        Peek::Long { version, dcid, scid, fixed_bit }
    }

    /// A long header of a version nobody speaks, or with connection IDs longer
    /// than QUIC allows: what obfuscation looks like (Hysteria's Salamander XORs
    /// every byte, so half its packets look like long headers with random
    /// versions). The fixed bit is no evidence: peers that negotiated RFC 9287
    /// greasing (quinn does) clear it in long and short headers alike.
    pub fn looks_obfuscated(&self) -> bool {
        match self {
            Peek::Long { version, .. } => !known_version(*version),
            // Connection ID lengths over 20 (RFC 9000 allows none) on a long header.
            Peek::Invalid => true,
            Peek::Short { .. } => false,
        }
    }
}

pub fn known_version(v: u32) -> bool {
    v == VERSION_1
        || v == VERSION_2
        || v == VERSION_DRAFT_29
        || v == VERSION_NEGOTIATION
        || (v & 0x0f0f_0f0f) == 0x0a0a_0a0a
}

/// The length of the connection ID at the start of `a` and `b` (short-header
/// payloads after the first byte) as far as they agree: the DCID is the same in
/// every packet of a path, the protected packet number after it is not.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_header_prefix_gives_both_ids() {
        // RFC 9001 A.3 server Initial: DCID empty, SCID f067a5502a4262b5.
        let b = [0xc1, 0, 0, 0, 1, 0, 8, 0xf0, 0x67, 0xa5, 0x50, 0x2a, 0x42, 0x62, 0xb5, 0x00, 0x40, 0x75];
        match Peek::of(&b) {
            Peek::Long { version, dcid, scid, fixed_bit } => {
                assert_eq!(version, 1);
                assert!(dcid.is_empty());
                assert_eq!(scid.as_bytes(), &[0xf0, 0x67, 0xa5, 0x50, 0x2a, 0x42, 0x62, 0xb5]);
                assert!(fixed_bit);
            }
            other => panic!("{other:?}"),
        }
        assert!(!Peek::of(&b).looks_obfuscated());
    }

    #[test]
    fn random_versions_and_bad_lengths_look_obfuscated() {
        assert!(Peek::of(&[0xc0, 0x12, 0x34, 0x56, 0x78, 0, 0]).looks_obfuscated());
        assert!(Peek::of(&[0xc0, 0, 0, 0, 1, 200, 1, 2]).looks_obfuscated());
        assert!(!Peek::of(&[0x80, 0, 0, 0, 1, 0, 0]).looks_obfuscated(), "greased long header");
        assert!(!Peek::of(&[0x00, 1, 2, 3]).looks_obfuscated(), "greased short header");
        assert!(!Peek::of(&[]).looks_obfuscated(), "an empty sample says nothing");
    }

    #[test]
    fn common_prefix_stops_at_the_first_difference() {
        assert_eq!(common_prefix(&[1, 2, 3, 4, 9], &[1, 2, 3, 4, 7]), 4);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
