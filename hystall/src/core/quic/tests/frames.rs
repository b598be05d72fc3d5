//! The frame parser: every frame type from hand-written bytes, every prefix
//! of them (an error, never a panic), and random garbage.

use super::super::{Ack, CloseKind, EcnCounts, Frame, FrameError, FrameErrorKind, StreamDir, parse_frames};
use super::{Rng, hex};

/// (bytes, the frame they encode).
fn cases() -> Vec<(Vec<u8>, Frame<'static>)> {
    let ack_raw: &'static [u8] = &[0x01, 0x02];
    vec![
        (hex("01"), Frame::Ping),
        (
            hex("02 4064 0a 00 03"),
            Frame::Ack(Ack { largest: 100, delay: 10, range_count: 0, first_range: 3, ranges_raw: &[], ecn: None }),
        ),
        (
            hex("03 4064 0a 01 03 01 02 05 06 07"),
            Frame::Ack(Ack {
                largest: 100,
                delay: 10,
                range_count: 1,
                first_range: 3,
                ranges_raw: ack_raw,
                ecn: Some(EcnCounts { ect0: 5, ect1: 6, ce: 7 }),
            }),
        ),
        (hex("04 04 4100 8203 0000"), Frame::ResetStream { stream_id: 4, error_code: 0x100, final_size: 0x0203_0000 }),
        (hex("05 08 11"), Frame::StopSending { stream_id: 8, error_code: 0x11 }),
        (hex("06 00 03 616263"), Frame::Crypto { offset: 0, data: b"abc" }),
        (hex("07 02 7a7a"), Frame::NewToken { token: b"zz" }),
        (
            hex("08 04 68656c6c6f"),
            Frame::Stream { stream_id: 4, offset: 0, fin: false, has_len: false, data: b"hello" },
        ),
        (hex("09 04 6869"), Frame::Stream { stream_id: 4, offset: 0, fin: true, has_len: false, data: b"hi" }),
        (hex("0a 00 02 6869"), Frame::Stream { stream_id: 0, offset: 0, fin: false, has_len: true, data: b"hi" }),
        (
            hex("0f 01 4400 02 6869"),
            Frame::Stream { stream_id: 1, offset: 0x400, fin: true, has_len: true, data: b"hi" },
        ),
        (hex("0c 02 05 6869"), Frame::Stream { stream_id: 2, offset: 5, fin: false, has_len: false, data: b"hi" }),
        (hex("10 80100000"), Frame::MaxData { max: 0x0010_0000 }),
        (hex("11 04 4400"), Frame::MaxStreamData { stream_id: 4, max: 0x400 }),
        (hex("12 24"), Frame::MaxStreams { dir: StreamDir::Bidi, max: 0x24 }),
        (hex("13 03"), Frame::MaxStreams { dir: StreamDir::Uni, max: 3 }),
        (hex("14 80100000"), Frame::DataBlocked { limit: 0x0010_0000 }),
        (hex("15 04 4400"), Frame::StreamDataBlocked { stream_id: 4, limit: 0x400 }),
        (hex("16 05"), Frame::StreamsBlocked { dir: StreamDir::Bidi, limit: 5 }),
        (hex("17 06"), Frame::StreamsBlocked { dir: StreamDir::Uni, limit: 6 }),
        (
            hex("18 02 01 04 01020304 000102030405060708090a0b0c0d0e0f"),
            Frame::NewConnectionId {
                seq: 2,
                retire_prior_to: 1,
                cid: &[1, 2, 3, 4],
                reset_token: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
            },
        ),
        (hex("19 07"), Frame::RetireConnectionId { seq: 7 }),
        (hex("1a 0102030405060708"), Frame::PathChallenge([1, 2, 3, 4, 5, 6, 7, 8])),
        (hex("1b 0102030405060708"), Frame::PathResponse([1, 2, 3, 4, 5, 6, 7, 8])),
        (
            hex("1c 0a 08 03 626164"),
            Frame::ConnectionClose { kind: CloseKind::Transport, code: 10, frame_type: Some(8), reason: b"bad" },
        ),
        (
            hex("1d 4100 00"),
            Frame::ConnectionClose { kind: CloseKind::Application, code: 0x100, frame_type: None, reason: b"" },
        ),
        (hex("1e"), Frame::HandshakeDone),
        (hex("1f"), Frame::ImmediateAck),
        (hex("30 646174"), Frame::Datagram { has_len: false, data: b"dat" }),
        (hex("31 02 6461"), Frame::Datagram { has_len: true, data: b"da" }),
        (
            hex("40af 01 02 4064 03"),
            Frame::AckFrequency {
                seq: 1,
                ack_eliciting_threshold: 2,
                request_max_ack_delay: 100,
                reordering_threshold: 3,
            },
        ),
        (hex("000000"), Frame::Padding { len: 3 }),
    ]
}

#[test]
fn every_frame_type_parses() {
    for (bytes, want) in cases() {
        assert_eq!(parse_frames(&bytes), (vec![want], None), "{bytes:02x?}");
    }
}

#[test]
fn frames_in_sequence_with_padding_runs() {
    let bytes = hex("01 0000 1e 31 01 78 00 0a 00 01 79 000000");
    let (frames, err) = parse_frames(&bytes);
    assert_eq!(err, None);
    assert_eq!(
        frames,
        vec![
            Frame::Ping,
            Frame::Padding { len: 2 },
            Frame::HandshakeDone,
            Frame::Datagram { has_len: true, data: b"x" },
            Frame::Padding { len: 1 },
            Frame::Stream { stream_id: 0, offset: 0, fin: false, has_len: true, data: b"y" },
            Frame::Padding { len: 3 },
        ]
    );
}

#[test]
fn every_proper_prefix_is_an_error_or_fewer_frames() {
    for (bytes, want) in cases() {
        for len in 0..bytes.len() {
            let (frames, err) = parse_frames(&bytes[..len]);
            // A prefix can still be a whole, shorter frame: padding, or a
            // STREAM/DATAGRAM without length, which runs to the end.
            let shorter_ok = matches!(
                want,
                Frame::Padding { .. } | Frame::Stream { has_len: false, .. } | Frame::Datagram { has_len: false, .. }
            );
            if len == 0 {
                assert_eq!((frames.len(), err), (0, None));
            } else if !shorter_ok {
                assert!(frames.is_empty(), "{bytes:02x?}[..{len}] gave {frames:?}");
                let err = err.expect("a truncated frame is an error");
                assert_eq!(err.offset, 0);
                assert!(matches!(err.kind, FrameErrorKind::Truncated { .. }), "{err}");
            }
        }
    }
}

#[test]
fn errors_say_where_and_why() {
    let bytes = hex("01 01 40ff 01");
    let (frames, err) = parse_frames(&bytes);
    assert_eq!(frames, vec![Frame::Ping, Frame::Ping]);
    assert_eq!(err, Some(FrameError { offset: 2, frame_type: Some(0xff), kind: FrameErrorKind::UnknownType(0xff) }));
    let (_, err) = parse_frames(&hex("06 00 05 6162"));
    assert_eq!(err.map(|e| e.kind), Some(FrameErrorKind::Truncated { what: "crypto data" }));
    let (_, err) = parse_frames(&hex("18 01 00 15"));
    assert_eq!(err.map(|e| e.kind), Some(FrameErrorKind::Invalid("NEW_CONNECTION_ID length")));
    let (_, err) = parse_frames(&hex("02 03 00 00 04"));
    assert_eq!(err.map(|e| e.kind), Some(FrameErrorKind::Invalid("first ACK range below packet number 0")));
    let (_, err) = parse_frames(&hex("0e 00 ffffffffffffffff 01 00"));
    assert!(matches!(err.map(|e| e.kind), Some(FrameErrorKind::Invalid(_))));
    // Huge lengths are truncations, not allocations.
    let (_, err) = parse_frames(&hex("31 ffffffffffffffff"));
    assert_eq!(err.map(|e| e.kind), Some(FrameErrorKind::Truncated { what: "datagram data" }));
    let (_, err) = parse_frames(&hex("02 10 00 80ffffff 00"));
    assert_eq!(err.map(|e| e.kind), Some(FrameErrorKind::Truncated { what: "ack gap" }));
}

#[test]
fn ack_ranges_expand_to_packet_numbers() {
    // Largest 100, first range 3 (97..=100), gap 1 / len 2 (92..=94), gap 0 / len 0 (90).
    let bytes = hex("02 4064 00 02 03 01 02 00 00");
    let (frames, err) = parse_frames(&bytes);
    assert_eq!(err, None);
    let Frame::Ack(ack) = frames[0] else { panic!("{frames:?}") };
    assert_eq!(ack.ranges().collect::<Vec<_>>(), vec![(97, 100), (92, 94), (90, 90)]);
    // Ranges that would go below 0 stop the iterator instead of wrapping.
    let bytes = hex("02 05 00 01 01 08 00");
    let (frames, _) = parse_frames(&bytes);
    let Frame::Ack(ack) = frames[0] else { panic!("{frames:?}") };
    assert_eq!(ack.ranges().collect::<Vec<_>>(), vec![(4, 5)]);
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = Rng::new(0x5eed_f4a3);
    let mut seen_ok = 0;
    for round in 0..20_000 {
        let len = rng.below(64);
        let mut bytes = rng.bytes(len);
        // Bias towards known frame types so parsing goes deep.
        if let Some(first) = bytes.first_mut()
            && round % 2 == 0
        {
            *first = (*first % 0x20) | if round % 4 == 0 { 0x00 } else { 0x08 };
        }
        let (frames, err) = parse_frames(&bytes);
        if let Some(e) = err {
            assert!(e.offset < bytes.len());
        }
        seen_ok += frames.len();
        for f in frames {
            if let Frame::Ack(a) = f {
                a.ranges().take(1000).for_each(drop);
            }
        }
    }
    assert!(seen_ok > 1000, "the fuzz reached real frames: {seen_ok}");
}
