//! Built datagrams: coalescing, Version Negotiation, unknown versions,
//! draft-29, error reasons, connection keys.

use super::super::{
    CidField, ConnectionId, DecodeError, DecodeOptions, ErrorKind, Header, PacketType, VERSION_1, VERSION_2,
    VERSION_DRAFT_29, Version, decode_packet, packets,
};
use super::{all_ok, hex, long_packet, short_packet};

const CLIENT_CID: [u8; 8] = [0xc1; 8];
const SERVER_CID: [u8; 4] = [0x5e, 0x1e, 0xc7, 0xed];

/// Initial + Handshake + 1-RTT in one datagram, as a client sends when it
/// finishes the handshake. `types` are the first bytes for Initial, Handshake.
fn three_packets(version: u32, initial_first: u8, handshake_first: u8) -> (Vec<u8>, [usize; 3]) {
    let initial = long_packet(initial_first, version, &SERVER_CID, &CLIENT_CID, Some(b"tok"), 60);
    let handshake = long_packet(handshake_first, version, &SERVER_CID, &CLIENT_CID, None, 40);
    let short = short_packet(0x60, &SERVER_CID, 30);
    let sizes = [initial.len(), handshake.len(), short.len()];
    ([initial, handshake, short].concat(), sizes)
}

fn check_three(version: Version, initial_first: u8, handshake_first: u8) {
    let (datagram, sizes) = three_packets(version.wire(), initial_first, handshake_first);
    let all = all_ok(&datagram, DecodeOptions::with_short_dcid_len(4));
    let types: Vec<_> = all.iter().map(|p| p.packet_type()).collect();
    assert_eq!(types, [PacketType::Initial, PacketType::Handshake, PacketType::OneRtt]);
    let extents: Vec<_> = all.iter().map(|p| (p.offset, p.len)).collect();
    assert_eq!(extents, [(0, sizes[0]), (sizes[0], sizes[1]), (sizes[0] + sizes[1], sizes[2])]);
    for p in &all {
        assert_eq!(p.dcid(), Some(&SERVER_CID[..]));
    }
    let Header::Long(initial) = all[0].header else { panic!("Initial first") };
    let token = initial.token.expect("token");
    assert_eq!(token.bytes, b"tok");
    assert_eq!(&datagram[token.offset..token.offset + 3], b"tok");
    assert_eq!((initial.version, initial.length), (version, 60));
    let Header::Long(handshake) = all[1].header else { panic!("Handshake second") };
    assert_eq!(handshake.token, None);
    assert_eq!(handshake.pn_offset, sizes[0] + 1 + 4 + 1 + 4 + 1 + 8 + 2);
    let Header::Short(short) = all[2].header else { panic!("short last") };
    assert!(short.spin_bit);
    assert_eq!(short.pn_offset, Some(sizes[0] + sizes[1] + 1 + 4));
}

#[test]
fn coalesced_initial_handshake_short_v1() {
    check_three(Version::V1, 0xc3, 0xe1);
}

#[test]
fn coalesced_initial_handshake_short_v2_uses_v2_type_bits() {
    // v2: Initial 0b01, Handshake 0b11.
    check_three(Version::V2, 0xd3, 0xf1);
}

#[test]
fn coalesced_draft29_initial() {
    check_three(Version::Draft29, 0xc0, 0xe0);
}

#[test]
fn v2_zero_rtt_and_v1_zero_rtt_bits_differ() {
    let v2 = long_packet(0xe0, VERSION_2, &SERVER_CID, &CLIENT_CID, None, 20);
    let v1 = long_packet(0xd0, VERSION_1, &SERVER_CID, &CLIENT_CID, None, 20);
    for p in [v2, v1] {
        let d = decode_packet(&p, 0, &DecodeOptions::default()).expect("0-RTT");
        assert_eq!(d.packet_type(), PacketType::ZeroRtt);
    }
}

#[test]
fn short_header_with_unknown_dcid_length_takes_the_rest() {
    let (datagram, sizes) = three_packets(VERSION_1, 0xc0, 0xe0);
    let all = all_ok(&datagram, DecodeOptions::default());
    assert_eq!(all.len(), 3);
    assert_eq!((all[2].dcid(), all[2].len), (None, sizes[2]));
}

#[test]
fn trailing_zeros_are_padding_not_a_packet() {
    let (mut datagram, sizes) = three_packets(VERSION_1, 0xc0, 0xe0);
    datagram.truncate(sizes[0] + sizes[1]);
    datagram.extend([0; 25]);
    let items: Vec<_> = packets(&datagram, DecodeOptions::default()).collect();
    assert_eq!(items.len(), 3);
    let err = items[2].clone().expect_err("padding");
    assert_eq!(err, DecodeError::ZeroPadding { at: sizes[0] + sizes[1], len: 25 });
    assert_eq!(err.kind(), ErrorKind::Padding);
}

#[test]
fn version_negotiation_lists_versions() {
    // Unused bits arbitrary: fixed bit clear here, which must not matter.
    let vn = hex("8a 00000000 08 c1c1c1c1c1c1c1c1 04 5e1ec7ed
         00000001 6b3343cf ff00001d 1a2a3a4a");
    let all = all_ok(&vn, DecodeOptions::default());
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].packet_type(), PacketType::VersionNegotiation);
    assert_eq!(all[0].version(), Some(0));
    let Header::VersionNegotiation(h) = all[0].header else { panic!("VN expected") };
    assert_eq!((h.first_byte, h.dcid, h.scid), (0x8a, &CLIENT_CID[..], &SERVER_CID[..]));
    let versions: Vec<u32> = h.versions().collect();
    assert_eq!(versions, [VERSION_1, VERSION_2, VERSION_DRAFT_29, 0x1a2a_3a4a]);
    assert_eq!(all[0].client_to_server_keys().iter().count(), 0);
    assert_eq!(all[0].server_cid_len_hint(), None);
}

#[test]
fn version_negotiation_with_ragged_list_is_malformed() {
    let vn = hex("c0 00000000 00 00 00000001 6b33");
    let err = decode_packet(&vn, 0, &DecodeOptions::default()).expect_err("ragged");
    assert_eq!(err, DecodeError::BadVersionList { len: 6 });
    assert_eq!(err.kind(), ErrorKind::Malformed);
}

#[test]
fn unknown_version_reports_invariants_and_stops() {
    // CIDs of 25 bytes are fine under RFC 8999; the trailing short-looking
    // bytes are opaque and must not be decoded as another packet.
    let mut p = vec![0xc5];
    p.extend(0xfaceb00c_u32.to_be_bytes());
    p.push(25);
    p.extend([7; 25]);
    p.push(3);
    p.extend([9; 3]);
    p.extend(short_packet(0x40, &SERVER_CID, 30));
    let all = all_ok(&p, DecodeOptions::with_short_dcid_len(4));
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].packet_type(), PacketType::UnknownVersion);
    assert_eq!((all[0].version(), all[0].len), (Some(0xfaceb00c), p.len()));
    assert_eq!(all[0].dcid(), Some(&[7; 25][..]));
    assert_eq!(all[0].scid(), Some(&[9; 3][..]));
    // A 25-byte DCID is no key; the 3-byte SCID is.
    let keys = all[0].client_to_server_keys();
    assert_eq!(keys.dcid, None);
    assert_eq!(keys.scid, ConnectionId::new(&[9; 3]));
}

#[test]
fn fixed_bit_clear_is_not_quic() {
    for bytes in
        [short_packet(0x20, &SERVER_CID, 30), long_packet(0x80, VERSION_1, &SERVER_CID, &CLIENT_CID, Some(b""), 30)]
    {
        let err = decode_packet(&bytes, 0, &DecodeOptions::default()).expect_err("clear");
        assert_eq!(err, DecodeError::FixedBitClear { at: 0 });
        assert_eq!(err.kind(), ErrorKind::NotQuic);
        // Unless the peers negotiated greasing the bit (RFC 9287).
        let opts = DecodeOptions { allow_clear_fixed_bit: true, ..DecodeOptions::with_short_dcid_len(4) };
        let p = decode_packet(&bytes, 0, &opts).expect("greased");
        assert_eq!(p.len, bytes.len());
    }
}

#[test]
fn fixed_bit_clear_after_a_good_packet_stops_the_datagram() {
    let mut d = long_packet(0xc0, VERSION_1, &SERVER_CID, &CLIENT_CID, Some(b""), 30);
    let first_len = d.len();
    d.extend(short_packet(0x01, &SERVER_CID, 30));
    let items: Vec<_> = packets(&d, DecodeOptions::default()).collect();
    assert_eq!(items.len(), 2);
    assert!(items[0].is_ok());
    assert_eq!(items[1], Err(DecodeError::FixedBitClear { at: first_len }));
}

#[test]
fn cid_longer_than_20_is_rejected_for_v1_and_short_headers() {
    let long = long_packet(0xc0, VERSION_1, &[1; 21], &CLIENT_CID, Some(b""), 30);
    assert_eq!(
        decode_packet(&long, 0, &DecodeOptions::default()),
        Err(DecodeError::CidTooLong { which: CidField::Dcid, len: 21 })
    );
    let long = long_packet(0xe0, VERSION_2, &SERVER_CID, &[1; 200], None, 30);
    assert_eq!(
        decode_packet(&long, 0, &DecodeOptions::default()),
        Err(DecodeError::CidTooLong { which: CidField::Scid, len: 200 })
    );
    let short = short_packet(0x40, &[1; 30], 30);
    assert_eq!(
        decode_packet(&short, 0, &DecodeOptions::with_short_dcid_len(21)),
        Err(DecodeError::CidTooLong { which: CidField::ShortDcid, len: 21 })
    );
}

#[test]
fn length_inconsistencies_have_their_own_reasons() {
    let mut p = long_packet(0xe0, VERSION_1, &SERVER_CID, &CLIENT_CID, None, 40);
    p.truncate(p.len() - 1);
    let pn_offset = 1 + 4 + 1 + 4 + 1 + 8 + 2;
    assert_eq!(
        decode_packet(&p, 0, &DecodeOptions::default()),
        Err(DecodeError::BadLength { at: pn_offset, declared: 40, available: 39 })
    );
    let p = long_packet(0xe0, VERSION_1, &SERVER_CID, &CLIENT_CID, None, 19);
    assert_eq!(
        decode_packet(&p, 0, &DecodeOptions::default()),
        Err(DecodeError::TooSmallForHeaderProtection { at: 0, have: 19 })
    );
    let mut p = long_packet(0xc0, VERSION_1, &SERVER_CID, &CLIENT_CID, Some(b""), 40);
    // An 8-byte varint token length far past the end.
    let token_len_at = 1 + 4 + 1 + 4 + 1 + 8;
    p.splice(token_len_at..=token_len_at, hex("c000000100000000"));
    assert_eq!(
        decode_packet(&p, 0, &DecodeOptions::default()),
        Err(DecodeError::Truncated {
            what: "token",
            at: token_len_at + 8,
            need: 1 << 32,
            have: p.len() - token_len_at - 8
        })
    );
}

#[test]
fn truncated_fields_name_themselves() {
    let p = long_packet(0xc0, VERSION_1, &SERVER_CID, &CLIENT_CID, Some(b""), 40);
    let cases = [
        (0, DecodeError::Empty),
        (3, DecodeError::Truncated { what: "version", at: 1, need: 4, have: 2 }),
        (5, DecodeError::Truncated { what: "DCID length", at: 5, need: 1, have: 0 }),
        (8, DecodeError::Truncated { what: "DCID", at: 6, need: 4, have: 2 }),
        (13, DecodeError::Truncated { what: "SCID", at: 11, need: 8, have: 2 }),
        (19, DecodeError::Truncated { what: "token length", at: 19, need: 1, have: 0 }),
        (21, DecodeError::Truncated { what: "Length", at: 20, need: 2, have: 1 }),
    ];
    for (len, want) in cases {
        assert_eq!(decode_packet(&p[..len], 0, &DecodeOptions::default()), Err(want));
    }
}

#[test]
fn connection_keys_for_client_packets() {
    let (datagram, _) = three_packets(VERSION_1, 0xc0, 0xe0);
    let all = all_ok(&datagram, DecodeOptions::with_short_dcid_len(4));
    let server = ConnectionId::new(&SERVER_CID).expect("4 bytes");
    let client = ConnectionId::new(&CLIENT_CID).expect("8 bytes");
    let keys = all[0].client_to_server_keys();
    assert_eq!((keys.dcid, keys.scid), (Some(server), Some(client)));
    assert_eq!(keys.iter().copied().collect::<Vec<_>>(), [server, client]);
    let keys = all[2].client_to_server_keys();
    assert_eq!((keys.dcid, keys.scid), (Some(server), None));
    assert_eq!(server.to_string(), "5e1ec7ed");
    assert_eq!(format!("{server:?}"), "ConnectionId(5e1ec7ed)");
    // The server's long headers tell the short-header DCID length.
    assert_eq!(all[0].server_cid_len_hint(), Some(8));
    assert_eq!(all[2].server_cid_len_hint(), None);
    // Short header with unknown length: no key.
    let all = all_ok(&datagram, DecodeOptions::default());
    assert_eq!(all[2].client_to_server_keys().iter().count(), 0);
    assert_eq!(ConnectionId::new(&[0; 21]), None);
    assert!(ConnectionId::new(&[]).expect("empty").is_empty());
}
