//! Cross-check against quinn-proto's header parser (v1 and draft-29, which it
//! supports), and pin down the differences the module docs claim.

use std::io::Cursor;

use bytes::BytesMut;
use quinn_proto::{
    ConnectionIdParser, FixedLengthConnectionIdParser, LongType as QuinnLongType, PacketDecodeError, PartialDecode,
    ProtectedHeader,
};

use super::super::{
    DecodeError, DecodeOptions, Header, LongType, MAX_CID_LEN, Packet, VERSION_1, VERSION_2, VERSION_DRAFT_29,
    decode_packet,
};
use super::robust::valid_datagrams;
use super::{Rng, rfc};

const QUINN_VERSIONS: &[u32] = &[VERSION_1, VERSION_DRAFT_29];

#[derive(Debug)]
struct Quinn {
    header: ProtectedHeader,
    /// `PartialDecode::len`: the packet's bytes.
    len: usize,
}

/// quinn's view of the packet at `offset`, short-header DCID `dcid_len` bytes.
fn quinn(datagram: &[u8], offset: usize, dcid_len: usize, versions: &[u32]) -> Result<Quinn, PacketDecodeError> {
    assert!(dcid_len <= MAX_CID_LEN, "quinn panics on longer CIDs");
    let parser = FixedLengthConnectionIdParser::new(dcid_len);
    let bytes = BytesMut::from(&datagram[offset..]);
    let header = ProtectedHeader::decode(&mut Cursor::new(bytes.clone()), &parser, versions, false)?;
    let (partial, rest) = PartialDecode::new(bytes, &parser, versions, false)?;
    assert_eq!(partial.len() + rest.map_or(0, |r| r.len()), datagram.len() - offset);
    Ok(Quinn { header, len: partial.len() })
}

/// Both decoders accepted the packet: they must agree on everything both see.
fn assert_agree(ours: &Packet<'_>, theirs: &Quinn) {
    assert_eq!(ours.len, theirs.len, "packet length of {ours:?}");
    let start = ours.offset;
    match (&ours.header, &theirs.header) {
        (Header::Long(h), ProtectedHeader::Initial(q)) => {
            assert_eq!(h.packet_type, LongType::Initial);
            assert_eq!((h.dcid, h.scid), (&q.dst_cid[..], &q.src_cid[..]));
            let token = h.token.expect("Initial token");
            let pos = token.offset - start..token.offset - start + token.bytes.len();
            assert_eq!(pos, q.token_pos);
            assert_eq!((h.length, h.version.wire()), (q.len, q.version));
        }
        (Header::Long(h), ProtectedHeader::Long { ty, dst_cid, src_cid, len, version }) => {
            let ty = match ty {
                QuinnLongType::Handshake => LongType::Handshake,
                QuinnLongType::ZeroRtt => LongType::ZeroRtt,
            };
            assert_eq!(h.packet_type, ty);
            assert_eq!((h.dcid, h.scid), (&dst_cid[..], &src_cid[..]));
            assert_eq!((h.length, h.version.wire()), (*len, *version));
        }
        (Header::Retry(h), ProtectedHeader::Retry { dst_cid, src_cid, version }) => {
            assert_eq!((h.dcid, h.scid), (&dst_cid[..], &src_cid[..]));
            assert_eq!(h.version.wire(), *version);
        }
        (Header::Short(h), ProtectedHeader::Short { spin, dst_cid }) => {
            assert_eq!(h.spin_bit, *spin);
            assert_eq!(h.dcid, Some(&dst_cid[..]));
        }
        (Header::VersionNegotiation(h), ProtectedHeader::VersionNegotiate { random, dst_cid, src_cid }) => {
            assert_eq!(h.first_byte & 0x7f, *random);
            assert_eq!((h.dcid, h.scid), (&dst_cid[..], &src_cid[..]));
        }
        (ours, theirs) => panic!("disagree: {ours:?} vs {theirs:?}"),
    }
}

/// Compares the two decoders on one buffer, allowing only the documented
/// differences. Returns which case it was, so the fuzz test can show it
/// reached them all.
fn cross_check(datagram: &[u8], dcid_len: u8) -> &'static str {
    let ours = decode_packet(datagram, 0, &DecodeOptions::with_short_dcid_len(dcid_len));
    if datagram.is_empty() {
        assert_eq!(ours, Err(DecodeError::Empty));
        return "empty";
    }
    let theirs = quinn(datagram, 0, usize::from(dcid_len), QUINN_VERSIONS);
    match (&ours, &theirs) {
        (Ok(p), Ok(q)) => {
            assert_agree(p, q);
            "both accept"
        }
        // Unknown versions: quinn also reports the invariant CIDs.
        (
            Ok(p @ Packet { header: Header::UnknownVersion(h), .. }),
            Err(PacketDecodeError::UnsupportedVersion { src_cid, dst_cid, version }),
        ) => {
            assert_eq!((h.dcid, h.scid), (&dst_cid[..], &src_cid[..]));
            assert_eq!(p.version(), Some(*version));
            "unknown version"
        }
        // quinn checks the fixed bit first and caps CIDs at 20 for every
        // version; RFC 8999 does neither for VN and unknown versions.
        (Ok(p), Err(PacketDecodeError::InvalidHeader(_))) => {
            assert!(
                matches!(p.header, Header::VersionNegotiation(_) | Header::UnknownVersion(_)),
                "we accept, quinn rejects: {p:?} / {theirs:?}"
            );
            let fixed_clear = datagram[0] & 0x40 == 0;
            let long_cid =
                p.dcid().is_some_and(|c| c.len() > MAX_CID_LEN) || p.scid().is_some_and(|c| c.len() > MAX_CID_LEN);
            assert!(fixed_clear || long_cid, "{p:?} / {theirs:?}");
            "only we accept"
        }
        // Checks quinn does not make when it first parses a header.
        (Err(e), Ok(_)) => {
            assert!(
                matches!(
                    e,
                    DecodeError::TooSmallForHeaderProtection { .. }
                        | DecodeError::BadVersionList { .. }
                        | DecodeError::Truncated { what: "Retry integrity tag", .. }
                ),
                "we reject ({e}), quinn accepts"
            );
            "only quinn accepts"
        }
        (Err(_), Err(_)) => "both reject",
        (ours, theirs) => panic!("disagree: {ours:?} vs {theirs:?}"),
    }
}

#[test]
fn valid_datagrams_agree_with_quinn_packet_by_packet() {
    for datagram in valid_datagrams() {
        // quinn has no v2 numbering; compare only what it supports.
        if datagram.get(1..5) == Some(&VERSION_2.to_be_bytes()[..]) || datagram[0] & 0x80 == 0 {
            continue;
        }
        let opts = DecodeOptions::with_short_dcid_len(4);
        for p in super::all_ok(&datagram, opts) {
            match quinn(&datagram, p.offset, 4, QUINN_VERSIONS) {
                Ok(q) => assert_agree(&p, &q),
                Err(PacketDecodeError::UnsupportedVersion { .. }) => {
                    assert!(matches!(p.header, Header::UnknownVersion(_)));
                }
                Err(e) => panic!("quinn rejects {p:?}: {e}"),
            }
        }
    }
    for short in [rfc::v1_short(), rfc::v2_short()] {
        let p = decode_packet(&short, 0, &DecodeOptions::with_short_dcid_len(0)).expect("A.5");
        assert_agree(&p, &quinn(&short, 0, 0, QUINN_VERSIONS).expect("quinn A.5"));
    }
}

#[test]
fn quinn_supports_draft29_but_not_v2() {
    assert!(quinn_proto::DEFAULT_SUPPORTED_VERSIONS.contains(&VERSION_DRAFT_29));
    assert!(!quinn_proto::DEFAULT_SUPPORTED_VERSIONS.contains(&VERSION_2));
}

#[test]
fn quinn_reads_v2_type_bits_with_v1_numbering() {
    // Even told v2 is supported, quinn takes the v2 client Initial (type bits
    // 0b01) for 0-RTT, and so reads the token-length byte as the Length.
    let initial = rfc::v2_client_initial();
    let q = quinn(&initial, 0, 0, &[VERSION_2]).expect("quinn parses it, wrongly");
    assert!(matches!(q.header, ProtectedHeader::Long { ty: QuinnLongType::ZeroRtt, len: 0, .. }));
    // The v2 Retry (type bits 0b00) it takes for an Initial, whose "token"
    // then runs past the end.
    let retry = rfc::v2_retry();
    let err = quinn(&retry, 0, 0, &[VERSION_2]).err();
    assert_eq!(err, Some(PacketDecodeError::InvalidHeader("token out of bounds")));
    // Ours: Initial and Retry.
    for (bytes, want) in [(initial, "Initial"), (retry, "Retry")] {
        let p = decode_packet(&bytes, 0, &DecodeOptions::default()).expect("v2");
        assert_eq!(format!("{:?}", p.packet_type()), want);
    }
}

#[test]
fn quinn_fixed_length_parser_panics_past_20_bytes() {
    let result = std::panic::catch_unwind(|| {
        let mut buf = &[0u8; 64][..];
        FixedLengthConnectionIdParser::new(MAX_CID_LEN + 1).parse(&mut buf)
    });
    assert!(result.is_err(), "so lengths from the wire must be capped first");
}

#[test]
fn differential_fuzz_against_quinn() {
    let mut rng = Rng::new(7);
    let mut cases = std::collections::BTreeMap::new();
    let seeds: Vec<Vec<u8>> = valid_datagrams()
        .into_iter()
        .filter(|d| d.get(1..5) != Some(&VERSION_2.to_be_bytes()[..]))
        .chain([rfc::v1_short()])
        .collect();
    for i in 0..8000 {
        let mut buf = if i % 4 == 0 {
            let len = rng.below(200);
            rng.bytes(len)
        } else {
            seeds[i % seeds.len()].clone()
        };
        for _ in 0..rng.below(4) {
            if !buf.is_empty() {
                let at = rng.below(buf.len().min(48));
                buf[at] ^= 1 << rng.below(8);
            }
        }
        if rng.below(3) == 0 {
            let len = rng.below(buf.len() + 1);
            buf.truncate(len);
        }
        let case = cross_check(&buf, [0, 4, 8, 20][i % 4]);
        *cases.entry(case).or_insert(0) += 1;
    }
    let all = ["both accept", "both reject", "only quinn accepts", "only we accept", "unknown version"];
    for case in all {
        assert!(cases.get(case).copied().unwrap_or(0) >= 20, "{case} too rare: {cases:?}");
    }
}

#[test]
fn quinn_rejects_what_the_invariants_allow_and_misses_a_missing_retry_tag() {
    // Version Negotiation with its arbitrary fixed bit clear.
    let vn = super::hex("80 00000000 00 00 00000001");
    assert_eq!(quinn(&vn, 0, 0, QUINN_VERSIONS).err(), Some(PacketDecodeError::InvalidHeader("fixed bit unset")));
    assert!(decode_packet(&vn, 0, &DecodeOptions::default()).is_ok());
    // Version Negotiation echoing a 21-byte CID.
    let mut vn = super::hex("c0 00000000 15");
    vn.extend([1; 21]);
    vn.extend(super::hex("00 00000001"));
    assert_eq!(quinn(&vn, 0, 0, QUINN_VERSIONS).err(), Some(PacketDecodeError::InvalidHeader("malformed cid")));
    assert!(decode_packet(&vn, 0, &DecodeOptions::default()).is_ok());
    // A Retry cut right after its SCID: quinn accepts it.
    let retry = rfc::v1_retry();
    let cut = &retry[..15];
    assert!(quinn(cut, 0, 0, QUINN_VERSIONS).is_ok());
    assert_eq!(
        decode_packet(cut, 0, &DecodeOptions::default()),
        Err(DecodeError::Truncated { what: "Retry integrity tag", at: 15, need: 16, have: 0 })
    );
}
