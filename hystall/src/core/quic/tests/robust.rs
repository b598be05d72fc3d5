//! Never panic, never read out of bounds: every prefix of every valid
//! datagram, and thousands of random and mutated buffers.

use super::super::{
    DecodeOptions, Header, Packet, ShortDcidLen, VERSION_1, VERSION_2, VERSION_DRAFT_29, decode_packet, packets,
};
use super::{Rng, hex, long_packet, rfc, short_packet};

/// Valid datagrams of every shape the decoder knows.
pub(super) fn valid_datagrams() -> Vec<Vec<u8>> {
    let cid4 = [1, 2, 3, 4];
    let cid8 = [9; 8];
    let mut coalesced = long_packet(0xc0, VERSION_1, &cid4, &cid8, Some(b"token"), 50);
    coalesced.extend(long_packet(0xe0, VERSION_1, &cid4, &cid8, None, 30));
    coalesced.extend(short_packet(0x41, &cid4, 25));
    let mut coalesced_v2 = long_packet(0xd0, VERSION_2, &cid4, &cid8, Some(b""), 20);
    coalesced_v2.extend(long_packet(0xf0, VERSION_2, &cid4, &cid8, None, 20));
    vec![
        rfc::v1_client_initial(),
        rfc::v1_server_initial(),
        rfc::v1_retry(),
        rfc::v1_short(),
        rfc::v2_client_initial(),
        rfc::v2_server_initial(),
        rfc::v2_retry(),
        rfc::v2_short(),
        coalesced,
        coalesced_v2,
        long_packet(0xc0, VERSION_DRAFT_29, &cid8, &cid4, Some(b"t"), 24),
        hex("c0 00000000 04 01020304 08 0909090909090909 00000001 6b3343cf"),
        hex("c0 12345678 04 01020304 00 abcdef"),
    ]
}

fn option_sets() -> Vec<DecodeOptions> {
    let mut sets: Vec<DecodeOptions> =
        [0, 4, 8, 20, 21, 255].into_iter().map(DecodeOptions::with_short_dcid_len).collect();
    sets.push(DecodeOptions::default());
    sets.push(DecodeOptions { short_dcid_len: ShortDcidLen::Known(4), allow_clear_fixed_bit: true });
    sets
}

/// What must hold of any decoded packet: it lies within the datagram, and so
/// does everything it points at.
fn check_packet(datagram: &[u8], p: &Packet<'_>) {
    let end = p.offset + p.len;
    assert!(p.len > 0 && end <= datagram.len(), "{p:?} in {}", datagram.len());
    let within = |at: usize, len: usize| at >= p.offset && at + len <= end;
    match &p.header {
        Header::Long(h) => {
            assert!(within(h.pn_offset, h.length as usize));
            assert_eq!(h.pn_offset + h.length as usize, end);
            if let Some(t) = h.token {
                assert!(within(t.offset, t.bytes.len()));
                assert_eq!(&datagram[t.offset..t.offset + t.bytes.len()], t.bytes);
            }
        }
        Header::Retry(h) => {
            assert!(within(h.token.offset, h.token.bytes.len() + 16));
            assert_eq!(h.token.offset + h.token.bytes.len() + 16, end);
        }
        Header::Short(h) => {
            if let Some(pn) = h.pn_offset {
                assert!(within(pn, 20));
            }
        }
        Header::VersionNegotiation(h) => assert!(h.versions_raw.len().is_multiple_of(4)),
        Header::UnknownVersion(_) => assert_eq!(end, datagram.len()),
    }
}

/// Iterates a datagram and checks the packets tile it from the start.
fn check_datagram(datagram: &[u8], opts: DecodeOptions) {
    let mut expected_offset = 0;
    let mut count = 0;
    for item in packets(datagram, opts) {
        count += 1;
        assert!(count <= datagram.len() + 1, "iterator does not end");
        match item {
            Ok(p) => {
                assert_eq!(p.offset, expected_offset);
                check_packet(datagram, &p);
                expected_offset = p.offset + p.len;
                let _ = (p.client_to_server_keys(), p.server_cid_len_hint());
            }
            Err(e) => {
                let _ = (e.to_string(), e.kind());
            }
        }
    }
}

/// Decoding at every offset, in and past the datagram, must not panic either.
fn check_every_offset(datagram: &[u8], opts: DecodeOptions) {
    for offset in 0..datagram.len() + 3 {
        if let Ok(p) = decode_packet(datagram, offset, &opts) {
            assert_eq!(p.offset, offset);
            check_packet(datagram, &p);
        }
    }
}

#[test]
fn every_prefix_of_valid_datagrams_is_safe() {
    for datagram in valid_datagrams() {
        for opts in option_sets() {
            for len in 0..=datagram.len() {
                let prefix = &datagram[..len];
                check_datagram(prefix, opts);
                if len < 200 || len % 97 == 0 {
                    check_every_offset(prefix, opts);
                }
            }
        }
    }
}

#[test]
fn every_strict_prefix_of_a_long_packet_is_an_error() {
    // A long header with a Length field cannot decode from a prefix: the
    // Length runs past the end (or a field before it does).
    for datagram in valid_datagrams() {
        let opts = DecodeOptions::default();
        let Ok(first) = decode_packet(&datagram, 0, &opts) else { panic!("valid datagram fails") };
        if !matches!(first.header, Header::Long(_)) {
            continue;
        }
        for len in 0..first.len {
            assert!(decode_packet(&datagram[..len], 0, &opts).is_err(), "len {len}");
        }
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let opts = option_sets();
    for i in 0..6000 {
        let len = match i % 3 {
            0 => rng.below(64),
            1 => rng.below(300),
            _ => rng.below(1500),
        };
        let mut buf = rng.bytes(len);
        // A third of the buffers get a known version, to get past the
        // version check into the version-specific code.
        if i % 3 == 2 && buf.len() >= 5 {
            buf[0] |= 0xc0;
            let v = [VERSION_1, VERSION_2, VERSION_DRAFT_29, 0][rng.below(4)];
            buf[1..5].copy_from_slice(&v.to_be_bytes());
            if buf.len() > 6 {
                buf[5] %= 24;
            }
        }
        let o = opts[i % opts.len()];
        check_datagram(&buf, o);
        if len < 300 {
            check_every_offset(&buf, o);
        }
    }
}

#[test]
fn mutated_valid_datagrams_never_panic() {
    let mut rng = Rng::new(42);
    let valid = valid_datagrams();
    let opts = option_sets();
    for i in 0..6000 {
        let mut buf = valid[i % valid.len()].clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(buf.len().min(40));
            buf[at] ^= 1 << rng.below(8);
        }
        if rng.below(4) == 0 {
            let len = rng.below(buf.len() + 1);
            buf.truncate(len);
        }
        check_datagram(&buf, opts[i % opts.len()]);
    }
}
