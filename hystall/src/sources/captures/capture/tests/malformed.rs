//! Broken input: fatal errors with clear messages where the file is unreadable, counted
//! skips where only a record is, and never a panic.

use std::io::{self, Read};

use super::super::{CaptureError, CaptureReader, SkipReason};
use super::build::*;
use super::{packets, read_all};

fn open_error(bytes: &[u8]) -> CaptureError {
    match CaptureReader::from_bytes(bytes) {
        Ok(_) => panic!("expected an error opening {bytes:02x?}"),
        Err(e) => e,
    }
}

fn fatal(bytes: &[u8]) -> CaptureError {
    match read_all(bytes).1 {
        Ok(()) => panic!("expected a fatal error"),
        Err(e) => e,
    }
}

fn one_udp() -> Vec<u8> {
    ip(V4A, V4B, 17, &udp(1, 2, b"ok"))
}

#[test]
fn empty_file() {
    assert!(matches!(open_error(b""), CaptureError::Empty));
}

#[test]
fn wrong_magic_says_what_the_bytes_look_like() {
    let gz = open_error(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3]).to_string();
    assert_eq!(
        gz,
        "not a pcap or pcapng capture: the first bytes are 1f 8b 08 00 00 00 00 00 (gzip data: decompress it first)"
    );
    let text = open_error(b"Dec  2 15:51:37 host kernel: hello\n").to_string();
    assert!(text.ends_with("(text)"), "{text}");
    assert!(text.contains("44 65 63 20"), "{text}");
    let short = open_error(&[0xa1]).to_string();
    assert!(short.contains("too short"), "{short}");
}

#[test]
fn truncated_headers() {
    let header = pcap_header(false, false, 1);
    let e = open_error(&header[..20]);
    assert_eq!(e.to_string(), "truncated pcap global header: 20 of 24 bytes");
    let e = open_error(&shb(false)[..16]);
    assert!(matches!(e, CaptureError::TruncatedHeader { need: 28, .. }), "{e}");
    // A section header whose options run past the end of the file.
    let mut long = shb(false);
    long[4..8].copy_from_slice(&64u32.to_le_bytes());
    let e = open_error(&long);
    assert!(matches!(e, CaptureError::TruncatedSectionHeader { need: 64 }), "{e}");
    let mut bom = shb(false);
    bom[8..12].copy_from_slice(&[1, 2, 3, 4]);
    assert!(matches!(open_error(&bom), CaptureError::BadByteOrder { offset: 0, .. }));
}

#[test]
fn truncated_last_record_is_a_counted_skip() {
    let u = one_udp();
    let mut file = pcap(false, false, 101, &[rec(1, 0, &u), rec(2, 0, &u)]);
    file.truncate(file.len() - 5);
    let (p, stats) = packets(&file);
    assert_eq!(p.len(), 1);
    assert_eq!(stats.skipped.get(&SkipReason::TruncatedAtEof), Some(&1));
    // Cut inside the record header too.
    let mut file = pcap(false, false, 101, &[rec(1, 0, &u)]);
    file.extend([1, 2, 3]);
    let (p, stats) = packets(&file);
    assert_eq!((p.len(), stats.skipped.get(&SkipReason::TruncatedAtEof)), (1, Some(&1)));
    // pcapng: cut inside the last block.
    let mut file = shb(false);
    file.extend(idb(false, 101, 0, None));
    file.extend(epb(false, 0, 1, &u, u.len() as u32));
    file.extend(epb(false, 0, 2, &u, u.len() as u32));
    file.truncate(file.len() - 9);
    let (p, stats) = packets(&file);
    assert_eq!((p.len(), stats.skipped.get(&SkipReason::TruncatedAtEof)), (1, Some(&1)));
}

#[test]
fn giant_record_lengths_are_fatal_with_the_offset() {
    let u = one_udp();
    let mut file = pcap(false, false, 101, &[rec(1, 0, &u)]);
    let offset = file.len();
    file.extend(pcap_record(false, &rec(2, 0, &u)));
    file[offset + 8..offset + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    let (records, result, _) = read_all(&file);
    assert_eq!(records.len(), 1, "records before the damage still come out");
    let e = result.expect_err("fatal");
    assert_eq!(
        e.to_string(),
        format!(
            "pcap record at byte {offset} declares 4294967311 bytes, more than the 16777216-byte limit: corrupt file"
        )
    );
    let mut file = shb(true);
    file.extend(idb(true, 101, 0, None));
    let offset = file.len();
    file.extend(epb(true, 0, 1, &u, u.len() as u32));
    file[offset + 4..offset + 8].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(fatal(&file), CaptureError::GiantBlock { offset: o, len: 0xffff_ffff, .. } if o == offset as u64));
    let mut file = shb(false);
    file[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(open_error(&file), CaptureError::GiantBlock { offset: 0, .. }));
    // An impossible pcapng length (not a multiple of 4).
    let mut file = shb(false);
    file.extend(idb(false, 101, 0, None));
    let offset = file.len();
    file.extend(epb(false, 0, 1, &u, u.len() as u32));
    file[offset + 4..offset + 8].copy_from_slice(&13u32.to_le_bytes());
    assert!(matches!(fatal(&file), CaptureError::BadBlockLength { len: 13, .. }));
}

#[test]
fn garbage_after_valid_records_never_panics() {
    let u = one_udp();
    let mut rng = Rng(0x5eed);
    for case in 0..500 {
        let mut file = if case % 2 == 0 {
            pcap(case % 4 == 0, false, 1, &[rec(1, 0, &ether(&[], &u))])
        } else {
            let mut f = shb(case % 4 == 1);
            f.extend(idb(case % 4 == 1, 1, 0, None));
            let e = ether(&[], &u);
            f.extend(epb(case % 4 == 1, 0, 1, &e, e.len() as u32));
            f
        };
        let n = 1 + rng.below(3000);
        file.extend(rng.bytes(n));
        let (records, _result, _) = read_all(&file);
        assert!(!records.is_empty(), "case {case}: the valid record comes first");
    }
}

#[test]
fn malformed_block_bodies_are_skipped_by_their_length() {
    let u = one_udp();
    let mut file = shb(false);
    file.extend(idb(false, 101, 0, None));
    // An EPB whose captured length exceeds its block.
    let mut bad = epb(false, 0, 1, &u, u.len() as u32);
    bad[20..24].copy_from_slice(&5000u32.to_le_bytes());
    file.extend(bad);
    file.extend(epb(false, 0, 2, &u, u.len() as u32));
    let (p, stats) = packets(&file);
    assert_eq!(p.len(), 1);
    assert_eq!(stats.skipped.get(&SkipReason::MalformedBlock), Some(&1));
}

#[test]
fn random_bodies_on_every_link_type_never_panic() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let valid_ips = [
        ip(V4A, V4B, 17, &udp(1, 2, b"seed payload")),
        ip(
            V6A,
            V6B,
            6,
            &tcp(&Tcp {
                sport: 1,
                dport: 2,
                seq: 3,
                ack: 4,
                flags: 2,
                window: 5,
                options: &[2, 4, 5, 180],
                payload: b"",
            }),
        ),
        ipv4(V4A, V4B, 17, 9, 0x2001, &[0; 64]),
        ipv6(V6A, V6B, 44, &[17, 0, 0, 9, 0, 0, 0, 1, 1, 2, 3, 4]),
    ];
    for linktype in [0u32, 1, 101, 108, 113, 228, 229, 276, 147] {
        let mut records = Vec::new();
        for _ in 0..1500 {
            let frame = if linktype == 147 {
                let n = rng.below(80);
                rng.bytes(n)
            } else {
                // Either pure garbage, or a valid frame with a few bytes flipped and cut.
                match rng.below(3) {
                    0 => {
                        let n = rng.below(120);
                        rng.bytes(n)
                    }
                    _ => {
                        let mut f = link(linktype, &valid_ips[rng.below(valid_ips.len())]);
                        for _ in 0..1 + rng.below(4) {
                            let at = rng.below(f.len());
                            f[at] = rng.next() as u8;
                        }
                        f.truncate(rng.below(f.len() + 1));
                        f
                    }
                }
            };
            records.push(frame);
        }
        let recs: Vec<_> = records.iter().map(|f| rec(1, 0, f)).collect();
        let (_, stats) = packets(&pcap(false, false, linktype, &recs));
        assert_eq!(stats.packets, 1500, "link type {linktype}");
    }
}

#[test]
fn random_mutations_of_whole_files_never_panic() {
    let u = one_udp();
    let e = ether(&[0x8100], &u);
    let mut ng = shb(false);
    ng.extend(idb(false, 1, 0, Some(9)));
    ng.extend(epb(false, 0, 1, &e, e.len() as u32));
    ng.extend(dsb(false, 0x544c_534b, b"CLIENT_RANDOM 00 11\n"));
    ng.extend(spb(false, &e));
    ng.extend(opb(false, 0, 3, &e));
    let legacy = pcap(true, true, 1, &[rec(1, 0, &e), rec(2, 0, &e)]);
    let mut rng = Rng(42);
    for case in 0..4000 {
        let mut file = if case % 2 == 0 { ng.clone() } else { legacy.clone() };
        for _ in 0..1 + rng.below(6) {
            let at = rng.below(file.len());
            file[at] = rng.next() as u8;
        }
        if rng.below(3) == 0 {
            file.truncate(rng.below(file.len() + 1));
        }
        let _ = read_all(&file);
    }
}

/// A reader that fails after `ok` bytes.
struct Failing<'a>(&'a [u8]);

impl Read for Failing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "disk on fire"));
        }
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn io_errors_are_fatal_with_the_real_cause() {
    let u = one_udp();
    let file = pcap(false, false, 101, &[rec(1, 0, &u), rec(2, 0, &u)]);
    let mut reader = CaptureReader::new(Failing(&file[..50])).expect("header reads");
    let e = reader.next().expect("item").expect_err("io error");
    assert!(matches!(e, CaptureError::Io { .. }), "{e}");
    assert!(e.to_string().contains("disk on fire"), "{e}");
    assert!(reader.next().is_none(), "the iterator ends after an error");
}
