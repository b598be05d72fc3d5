//! Malformed captures through the whole offline path (`analyse_bytes`: reader,
//! converter, decryption, model, report, text, SVG): every case must end as a
//! report or a clear one-line error, never a panic or a hang. The fuzz target
//! (fuzz/, `cargo xtask fuzz`) explores further; these cases run in every
//! `cargo test` and need no root.
//!
//! The seed is a real capture of `hystall lab` on loopback with its key log
//! (tests/data/lab.pcap, lab.keylog; see tests/data/README.md).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;

use hystall::commands::pcap::CAPTURE_CLOCK;
use hystall::commands::pcap_bytes::analyse_bytes;
use hystall::sinks::report::{self, Report};
use hystall::sinks::svg;

const SEED: &[u8] = include_bytes!("data/lab.pcap");
const KEYLOG: &str = include_str!("data/lab.keylog");
/// The lab server's UDP port in the seed capture.
const LAB_PORT: u16 = 4433;

/// xorshift64*: deterministic, so a failing case is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Analyses one case, renders it, and checks the outcome; a panic is reported with
/// the case's name, and its input saved under the test target folder.
fn check(name: &str, capture: &[u8], keylog: Option<&str>) -> Option<Report> {
    let res = catch_unwind(AssertUnwindSafe(|| {
        analyse_bytes(capture, keylog).inspect(|r| {
            let _ = report::text(r, &CAPTURE_CLOCK);
            let _ = svg::render(r);
        })
    }));
    let res = res.unwrap_or_else(|_| {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pcap_malformed-{name}.pcap"));
        let _ = std::fs::write(&path, capture);
        panic!("case {name} panicked; its input: {}", path.display());
    });
    match res {
        Ok(r) => {
            if let Some(e) = &r.error {
                assert_one_line(name, e);
            }
            Some(r)
        }
        Err(e) => {
            assert_one_line(name, &e.to_string());
            None
        }
    }
}

fn assert_one_line(name: &str, msg: &str) {
    assert!(!msg.trim().is_empty() && !msg.contains('\n'), "case {name}: not a one-line error: {msg:?}");
}

/// A little-endian microsecond pcap with Ethernet frames.
fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for (i, f) in frames.iter().enumerate() {
        let ts = 1_700_000_000u32;
        for v in [ts + i as u32 / 100, (i as u32 % 100) * 10_000, f.len() as u32, f.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(f);
    }
    out
}

/// Ethernet + IPv4 around a transport header and payload.
fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0; 12];
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(l4);
    f
}

fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    for v in [sport, dport, (8 + payload.len()) as u16, 0] {
        u.extend_from_slice(&v.to_be_bytes());
    }
    u.extend_from_slice(payload);
    ipv4(17, [127, 0, 0, 1], [127, 0, 0, 2], &u)
}

/// A TCP header with random fields and options, and a random payload.
fn tcp(rng: &mut Rng, sport: u16, dport: u16) -> Vec<u8> {
    let doff = 5 + rng.below(11);
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&rng.bytes(8)); // seq, ack
    t.push((doff as u8) << 4);
    t.extend_from_slice(&rng.bytes(5)); // flags, window, checksum
    t.extend_from_slice(&[0, 0]);
    t.extend_from_slice(&rng.bytes((doff - 5) * 4));
    let n = rng.below(64);
    t.extend_from_slice(&rng.bytes(n));
    ipv4(6, [127, 0, 0, 1], [127, 0, 0, 2], &t)
}

#[test]
fn seed_capture_is_a_real_lab_capture() {
    let r = check("seed", SEED, None).expect("the seed capture reads");
    assert!(r.packets > 0 && r.udp > 0, "packets {} udp {}", r.packets, r.udp);
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(!r.servers.is_empty(), "no QUIC server learned from the handshake");
    let r = check("seed-keys", SEED, Some(KEYLOG)).expect("the seed capture reads");
    let d = r.conns.iter().filter_map(|c| c.decrypt.as_ref()).find(|d| d.secrets_found).expect("decrypted");
    // Some packets of the seed are cut or missing: most open, not all.
    assert!(d.opened > 2 * d.auth_failed && d.no_keys == 0, "{d:?}");
}

#[test]
fn every_prefix_is_a_report_or_one_error() {
    let stride = (SEED.len() / 400).max(1);
    let cuts = (0..SEED.len().min(64)).chain((64..SEED.len()).step_by(stride));
    for cut in cuts {
        check(&format!("prefix-{cut}"), &SEED[..cut], Some(KEYLOG));
    }
}

#[test]
fn not_a_capture_is_one_clear_error() {
    let mut swapped = SEED.to_vec();
    swapped[..4].copy_from_slice(b"\x7fELF");
    for (name, bytes) in [
        ("empty", &b""[..]),
        ("text", b"hello, this is a text file\n"),
        ("elf", &swapped),
        ("one-byte", b"\xd4"),
        ("magic-only", b"\xd4\xc3\xb2\xa1"),
    ] {
        assert!(check(name, bytes, None).is_none(), "case {name} was read as a capture");
    }
}

#[test]
fn giant_lengths_stop_cleanly() {
    // A pcap record declaring 4 GiB.
    let mut p = pcap(&[udp(1, 2, b"x")]);
    let first = 24 + 8;
    p[first..first + 4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    let r = check("pcap-giant-record", &p, None).expect("the header is fine");
    assert!(r.error.is_some(), "a 4 GiB record is no packet");
    // A pcapng section header and a block declaring nearly 4 GiB.
    let mut ng = Vec::new();
    ng.extend_from_slice(&0x0a0d_0d0au32.to_le_bytes());
    ng.extend_from_slice(&28u32.to_le_bytes());
    ng.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    ng.extend_from_slice(&[1, 0, 0, 0]);
    ng.extend_from_slice(&u64::MAX.to_le_bytes());
    ng.extend_from_slice(&28u32.to_le_bytes());
    ng.extend_from_slice(&6u32.to_le_bytes()); // Enhanced Packet Block
    ng.extend_from_slice(&0xffff_fff0u32.to_le_bytes());
    ng.extend_from_slice(&[0; 16]);
    check("pcapng-giant-block", &ng, None);
    let mut bad_shb = ng.clone();
    bad_shb[4..8].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    check("pcapng-giant-section", &bad_shb, None);
    // A snaplen of 4 GiB in the pcap header is only a number.
    let mut snap = pcap(&[udp(1, 2, b"x")]);
    snap[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
    check("pcap-giant-snaplen", &snap, None).expect("the header is fine");
}

#[test]
fn garbage_packets_inside_a_valid_pcap() {
    let mut rng = Rng(0x5eed_0001);
    let mut frames = Vec::new();
    for i in 0..600 {
        let port = [443, LAB_PORT, 53, 8443][rng.below(4)];
        let n = rng.below(1500);
        let mut payload = rng.bytes(n);
        if i % 3 == 0 && payload.len() > 6 {
            payload[0] |= 0xc0; // a long header, QUIC version 1
            payload[1..5].copy_from_slice(&1u32.to_be_bytes());
        }
        frames.push(match i % 4 {
            0 => udp(50_000, port, &payload),
            1 => udp(port, 50_000, &payload),
            2 => {
                let sport = 40_000 + rng.below(4) as u16;
                tcp(&mut rng, sport, port)
            }
            _ => {
                // An IP layer of random bytes (v4 or v6, extension headers, fragments).
                let mut f = vec![0; 12];
                f.extend_from_slice(if i % 8 == 3 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
                let n = 40 + rng.below(200);
                let mut ip = rng.bytes(n);
                ip[0] = if i % 8 == 3 { 0x60 } else { 0x45 };
                f.extend_from_slice(&ip);
                f
            }
        });
    }
    let p = pcap(&frames);
    for keylog in [None, Some(KEYLOG)] {
        let r = check("garbage", &p, keylog).expect("the header is fine");
        assert_eq!(r.packets, 600, "every frame counted, read or skipped");
    }
    // The same garbage after the seed's own packets: known flows get nonsense.
    let mut mixed = SEED.to_vec();
    mixed.extend_from_slice(&p[24..]);
    check("seed-then-garbage", &mixed, Some(KEYLOG)).expect("the header is fine");
}

/// `LABEL client_random secret` lines with `f` applied to the client random and the secret.
fn rewrite_keylog(f: impl Fn(&str, &str) -> (String, String)) -> String {
    let mut out = String::new();
    for line in KEYLOG.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if let [label, random, secret] = parts[..] {
            let (random, secret) = f(random, secret);
            out.push_str(&format!("{label} {random} {secret}\n"));
        }
    }
    out
}

fn decrypt_figures(r: &Report) -> Vec<&report::DecryptFigures> {
    r.conns.iter().filter_map(|c| c.decrypt.as_ref()).collect()
}

#[test]
fn wrong_secrets_count_failures() {
    let flip = |s: &str| s.chars().map(|c| if c == '0' { '1' } else { '0' }).collect::<String>();
    let wrong = rewrite_keylog(|random, secret| (random.to_owned(), flip(secret)));
    let r = check("wrong-secrets", SEED, Some(&wrong)).expect("reads");
    let figures = decrypt_figures(&r);
    assert!(figures.iter().any(|d| d.auth_failed > 0), "{figures:?}");
    assert!(r.conns.iter().all(|c| c.frames.as_ref().is_none_or(|f| f.stream_bytes == [0, 0])));
}

#[test]
fn missing_secrets_mean_no_keys() {
    let other = rewrite_keylog(|random, secret| (random.chars().rev().collect(), secret.to_owned()));
    for (name, keylog) in [("other-randoms", other.as_str()), ("empty-keylog", ""), ("junk-keylog", "junk\n\0\n")] {
        let r = check(name, SEED, Some(keylog)).expect("reads");
        let figures = decrypt_figures(&r);
        assert!(figures.iter().all(|d| !d.secrets_found), "{name}: {figures:?}");
        assert!(figures.iter().any(|d| d.no_keys > 0), "{name}: {figures:?}");
    }
}

/// One random change: flipped bits, random or extreme bytes, a cut, a deleted,
/// duplicated or random range.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut m = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = m.len();
        let at = rng.below(len);
        match rng.below(7) {
            0 => m[at] ^= 1 << rng.below(8),
            1 => m[at] = rng.next() as u8,
            2 => m[at] = [0, 0xff, 0x7f, 0x80][rng.below(4)],
            3 => m.truncate(at),
            4 => {
                let end = (at + rng.below(64)).min(len);
                m.drain(at..end);
            }
            5 => {
                let end = (at + rng.below(256)).min(len);
                let chunk = m[at..end].to_vec();
                m.splice(at..at, chunk);
            }
            _ => {
                let n = rng.below(32);
                let end = (at + n).min(len);
                let noise = rng.bytes(end - at);
                m[at..end].copy_from_slice(&noise);
            }
        }
        if m.is_empty() {
            break;
        }
    }
    m
}

#[test]
fn mutated_captures_never_panic() {
    let mut rng = Rng(0x5eed_0002);
    let mut reports = 0;
    for i in 0..3000 {
        let m = mutate(&mut rng, SEED);
        let keylog = (i % 2 == 0).then_some(KEYLOG);
        if check(&format!("mutant-{i}"), &m, keylog).is_some() {
            reports += 1;
        }
    }
    assert!(reports > 1500, "most mutants keep a valid header: {reports}");
}

/// Byte offsets of the records of a little-endian pcap.
fn record_offsets(p: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 24;
    while let Some(len) = p.get(at + 8..at + 12) {
        out.push(at);
        at += 16 + u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    }
    out
}

#[test]
fn a_timestamp_years_ahead_is_no_hang() {
    // 80 years of quiet at 200 ms ticks would be 10^10 ticks (and as many
    // timeline buckets): a record a day or more ahead of the one before is a
    // corrupt timestamp, taken at the time before it and counted.
    let mut p = SEED.to_vec();
    let offsets = record_offsets(&p);
    assert_eq!(offsets.len(), 270);
    for &at in &offsets[offsets.len() / 2..] {
        p[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    }
    let started = std::time::Instant::now();
    let r = check("years-ahead", &p, Some(KEYLOG)).expect("reads");
    assert_eq!(r.time_jumps, (offsets.len() - offsets.len() / 2) as u64, "each record far ahead is counted");
    assert!(r.end.since(r.start).as_secs() < 86_400, "{:?}", r.end.since(r.start));
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
}

#[test]
fn cli_on_a_non_capture_exits_1_with_one_line() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join("pcap_malformed-not-a-capture.txt");
    std::fs::write(&file, "not a capture\n").expect("write the file");
    let out = Command::new(env!("CARGO_BIN_EXE_hystall")).arg("pcap").arg(&file).output().expect("run hystall");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
    assert!(stderr.starts_with("hystall: ") && stderr.contains("not a pcap or pcapng"), "stderr: {stderr}");
    assert!(out.stdout.is_empty());
}
