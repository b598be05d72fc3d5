//! Well-formed synthetic captures: every link type, both IP versions, UDP and TCP, VLANs,
//! fragments, pcapng interfaces, resolutions, byte orders and key logs.

use std::io::Read;
use std::net::SocketAddr;

use super::super::{CaptureFormat, CaptureReader, L4, Record, SkipReason, TcpFlags};
use super::build::*;
use super::{packets, read_all};

const LINK_TYPES: [u32; 8] = [0, 1, 101, 108, 113, 228, 229, 276];

fn udp_l4(payload: &[u8]) -> L4 {
    L4::Udp { payload: payload.to_vec(), truncated: false, orig_len: payload.len() }
}

#[test]
fn every_link_type_with_ipv4_and_ipv6_udp_and_tcp() {
    for linktype in LINK_TYPES {
        for (src, dst) in [(V4A, V4B), (V6A, V6B)] {
            if (linktype == 228 && src.is_ipv6()) || (linktype == 229 && src.is_ipv4()) {
                continue;
            }
            let u = link(linktype, &ip(src, dst, 17, &udp(4433, 50000, b"quic!")));
            let t = tcp(&Tcp {
                sport: 50001,
                dport: 443,
                seq: 7,
                ack: 9,
                flags: 0x18,
                window: 501,
                options: &[],
                payload: b"hello",
            });
            let t = link(linktype, &ip(src, dst, 6, &t));
            let file = pcap(false, false, linktype, &[rec(1_700_000_000, 250_000, &u), rec(1_700_000_001, 0, &t)]);
            let (p, stats) = packets(&file);
            assert_eq!(p.len(), 2, "link type {linktype} {src}: {stats:?}");
            assert_eq!(p[0].ts, 1_700_000_000_250_000_000);
            assert_eq!(p[0].src, SocketAddr::new(src, 4433));
            assert_eq!(p[0].dst, SocketAddr::new(dst, 50000));
            assert_eq!(p[0].l4, udp_l4(b"quic!"));
            assert_eq!(p[1].src, SocketAddr::new(src, 50001));
            let L4::Tcp { seq, ack, flags, window, payload_len, wscale, mss } = p[1].l4 else { panic!("tcp") };
            assert_eq!((seq, ack, window, payload_len, wscale, mss), (7, 9, 501, 5, None, None));
            assert_eq!(flags, TcpFlags::PSH | TcpFlags::ACK);
            assert_eq!((stats.udp, stats.tcp, stats.packets, stats.skipped_total()), (1, 1, 2, 0));
        }
    }
}

#[test]
fn bsd_loopback_accepts_both_byte_orders_and_all_inet6_values() {
    for linktype in [0, 108] {
        for be in [false, true] {
            for af6 in [24, 28, 30] {
                let v6 = bsd_loop(be, af6, &ip(V6A, V6B, 17, &udp(1, 2, b"x")));
                let v4 = bsd_loop(be, af6, &ip(V4A, V4B, 17, &udp(1, 2, b"y")));
                let (p, _) = packets(&pcap(false, false, linktype, &[rec(1, 0, &v6), rec(2, 0, &v4)]));
                assert_eq!(p.len(), 2, "linktype {linktype} be {be} af6 {af6}");
            }
        }
    }
}

#[test]
fn vlan_tags_are_walked() {
    let inner = ip(V4A, V4B, 17, &udp(1, 2, b"tagged"));
    let frames = [ether(&[0x8100], &inner), ether(&[0x88a8, 0x8100], &inner), ether(&[0x9100, 0x8100], &inner)];
    let records: Vec<_> = frames.iter().map(|f| rec(1, 0, f)).collect();
    let (p, stats) = packets(&pcap(false, false, 1, &records));
    assert_eq!(p.len(), 3, "{stats:?}");
    assert!(p.iter().all(|p| p.l4 == udp_l4(b"tagged")));
    let v6 = ether(&[0x8100], &ip(V6A, V6B, 17, &udp(1, 2, b"six")));
    let (p, _) = packets(&pcap(false, false, 1, &[rec(1, 0, &v6)]));
    assert_eq!(p[0].l4, udp_l4(b"six"));
}

#[test]
fn pcap_both_byte_orders_and_nanosecond_magic() {
    let frame = ip(V4A, V4B, 17, &udp(1, 2, b"order"));
    for be in [false, true] {
        for nanos in [false, true] {
            let frac = if nanos { 123_456_789 } else { 123_456 };
            let file = pcap(be, nanos, 101, &[rec(1_600_000_000, frac, &frame)]);
            let reader = CaptureReader::from_bytes(&file).expect("header");
            assert_eq!(reader.format(), CaptureFormat::Pcap { big_endian: be, nanos });
            let (p, _) = packets(&file);
            let want = if nanos { 1_600_000_000_123_456_789 } else { 1_600_000_000_123_456_000 };
            assert_eq!(p[0].ts, want, "be {be} nanos {nanos}");
            assert_eq!(p[0].l4, udp_l4(b"order"));
        }
    }
}

#[test]
fn snaplen_cut_udp_is_yielded_truncated_with_its_original_length() {
    let full = link(1, &ip(V4A, V4B, 17, &udp(1, 2, &[7u8; 1200])));
    let cut = &full[..14 + 20 + 8 + 100];
    let file = pcap(false, false, 1, &[Rec { sec: 1, frac: 0, data: cut, orig_len: full.len() as u32 }]);
    let (p, stats) = packets(&file);
    assert_eq!(p[0].l4, L4::Udp { payload: vec![7u8; 100], truncated: true, orig_len: 1200 });
    assert_eq!((stats.udp, stats.udp_truncated), (1, 1));
    // TCP payload length comes from the IP header, not the capture.
    let t = tcp(&Tcp { sport: 1, dport: 2, seq: 0, ack: 0, flags: 0x10, window: 1, options: &[], payload: &[0; 1000] });
    let full = ip(V6A, V6B, 6, &t);
    let file = pcap(false, false, 229, &[Rec { sec: 1, frac: 0, data: &full[..80], orig_len: full.len() as u32 }]);
    let (p, _) = packets(&file);
    assert!(matches!(p[0].l4, L4::Tcp { payload_len: 1000, .. }));
}

#[test]
fn tcp_syn_options_give_mss_and_window_scale() {
    // MSS 1460, NOP, WS 7, SACK-permitted, timestamps, NOP padding.
    let options = [2, 4, 5, 180, 1, 3, 3, 7, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1, 1, 0];
    let syn = tcp(&Tcp {
        sport: 40000,
        dport: 443,
        seq: 1,
        ack: 0,
        flags: 0x02,
        window: 64240,
        options: &options,
        payload: b"",
    });
    let (p, _) = packets(&pcap(false, false, 228, &[rec(1, 0, &ip(V4A, V4B, 6, &syn))]));
    let L4::Tcp { flags, wscale, mss, window, payload_len, .. } = p[0].l4 else { panic!("tcp") };
    assert_eq!((wscale, mss, window, payload_len), (Some(7), Some(1460), 64240, 0));
    assert!(flags.contains(TcpFlags::SYN) && !flags.contains(TcpFlags::ACK));
}

/// IPv4 fragments of one UDP datagram, given in `order`.
fn v4_fragments(id: u16, datagram: &[u8], order: &[usize]) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = datagram.chunks(504).collect();
    order
        .iter()
        .map(|&i| {
            let more = if i + 1 < chunks.len() { 0x2000 } else { 0 };
            ipv4(V4A, V4B, 17, id, more | (i * 504 / 8) as u16, chunks[i])
        })
        .collect()
}

#[test]
fn ipv4_fragments_out_of_order_are_reassembled() {
    let payload: Vec<u8> = (0..1400u32).map(|i| i as u8).collect();
    let datagram = udp(5000, 443, &payload);
    let frags = v4_fragments(77, &datagram, &[2, 0, 1]);
    let records: Vec<_> = frags.iter().map(|f| rec(10, 0, f)).collect();
    let (p, stats) = packets(&pcap(false, false, 101, &records));
    assert_eq!(p.len(), 1, "{stats:?}");
    assert_eq!(p[0].l4, udp_l4(&payload));
    assert_eq!((stats.fragments, stats.fragments_reassembled, stats.packets), (3, 1, 3));
}

#[test]
fn ipv4_fragment_overlap_timeout_and_leftovers_are_counted() {
    let datagram = udp(5000, 443, &[1u8; 1400]);
    let mut frags = v4_fragments(1, &datagram, &[0, 1]);
    // Overlap: the second fragment again, one offset unit earlier, with other bytes.
    frags.push(ipv4(V4A, V4B, 17, 1, 0x2000 | (504 / 8 - 1), &[9u8; 64]));
    let mut records: Vec<_> = frags.iter().map(|f| rec(10, 0, f)).collect();
    // Timeout: a first fragment, then another datagram's fragment 31 s later.
    let late = v4_fragments(2, &datagram, &[0]);
    let later = v4_fragments(3, &datagram, &[0]);
    records.push(rec(20, 0, &late[0]));
    records.push(rec(51, 0, &later[0]));
    let (p, stats) = packets(&pcap(false, false, 101, &records));
    assert!(p.is_empty());
    assert_eq!(stats.skipped.get(&SkipReason::FragmentOverlap), Some(&1));
    assert_eq!(stats.skipped.get(&SkipReason::FragmentTimeout), Some(&1));
    assert_eq!(stats.skipped.get(&SkipReason::FragmentIncompleteAtEof), Some(&1));
}

#[test]
fn too_many_pending_datagrams_evict_the_oldest() {
    let datagram = udp(5000, 443, &[1u8; 1400]);
    let frags: Vec<Vec<u8>> = (0..1100u16).map(|id| v4_fragments(id, &datagram, &[0]).remove(0)).collect();
    let records: Vec<_> = frags.iter().enumerate().map(|(i, f)| rec(1, i as u32, f)).collect();
    let (_, stats) = packets(&pcap(false, false, 101, &records));
    assert_eq!(stats.skipped.get(&SkipReason::FragmentEvicted), Some(&(1100 - 1024)));
    assert_eq!(stats.skipped.get(&SkipReason::FragmentIncompleteAtEof), Some(&1024));
}

#[test]
fn ipv6_fragments_after_extension_headers_are_reassembled() {
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    // Fragmentable part: a destination-options header, then UDP.
    let mut fragmentable = ext8(17);
    fragmentable.extend(udp(443, 6000, &payload));
    let chunks: Vec<&[u8]> = fragmentable.chunks(1232).collect();
    let mut frames = Vec::new();
    for i in [1, 2, 0] {
        // Unfragmentable part: hop-by-hop, then the fragment header.
        let mut body = ext8(44);
        body.extend(ipv6_frag_header(60, i * 1232, i + 1 < chunks.len(), 0xdead_beef));
        body.extend(chunks[i]);
        frames.push(link(113, &ipv6(V6A, V6B, 0, &body)));
    }
    let records: Vec<_> = frames.iter().map(|f| rec(3, 0, f)).collect();
    let (p, stats) = packets(&pcap(true, false, 113, &records));
    assert_eq!(p.len(), 1, "{stats:?}");
    assert_eq!(p[0].l4, udp_l4(&payload));
    assert_eq!(p[0].dst, SocketAddr::new(V6B, 6000));
    assert_eq!(stats.fragments_reassembled, 1);
}

#[test]
fn ipv6_atomic_fragment_and_routing_header_pass_through() {
    let mut body = vec![44, 0, 0, 0, 0, 0, 0, 0]; // a routing header, 8 bytes, then a fragment header
    body.extend(ipv6_frag_header(17, 0, false, 5));
    body.extend(udp(1, 2, b"atomic"));
    let (p, stats) = packets(&pcap(false, false, 229, &[rec(1, 0, &ipv6(V6A, V6B, 43, &body))]));
    assert_eq!(p[0].l4, udp_l4(b"atomic"));
    assert_eq!(stats.fragments, 0);
}

#[test]
fn non_ip_and_other_protocols_are_counted_skips() {
    let arp = {
        let mut v = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x06];
        v.extend([0; 28]);
        v
    };
    let icmp = link(1, &ip(V4A, V4B, 1, &[8, 0, 0, 0, 0, 0, 0, 0]));
    let gre = link(1, &ip(V6A, V6B, 47, &[0; 8]));
    let file = pcap(false, false, 1, &[rec(1, 0, &arp), rec(1, 0, &icmp), rec(1, 0, &gre)]);
    let (p, stats) = packets(&file);
    assert!(p.is_empty());
    assert_eq!(stats.skipped.get(&SkipReason::NotIp), Some(&1));
    assert_eq!(stats.skipped.get(&SkipReason::Icmp), Some(&1));
    assert_eq!(stats.skipped.get(&SkipReason::Protocol(47)), Some(&1));
    let (p, stats) = packets(&pcap(false, false, 147, &[rec(1, 0, &arp)]));
    assert!(p.is_empty());
    assert_eq!(stats.skipped.get(&SkipReason::LinkType(147)), Some(&1));
}

#[test]
fn pcapng_two_interfaces_with_different_link_types_and_resolutions() {
    for be in [false, true] {
        let mut file = shb(be);
        file.extend(idb(be, 1, 0, None)); // Ethernet, default µs
        file.extend(idb(be, 101, 0, Some(9))); // raw IP, ns
        file.extend(idb(be, 113, 0, Some(0x80 | 20))); // SLL, 2^-20 s
        let a = ether(&[], &ip(V4A, V4B, 17, &udp(1, 2, b"eth")));
        let b = ip(V6A, V6B, 17, &udp(3, 4, b"raw"));
        let c = sll(&ip(V4A, V4B, 17, &udp(5, 6, b"sll")));
        file.extend(epb(be, 0, 1_700_000_000_000_001, &a, a.len() as u32));
        file.extend(epb(be, 1, 1_700_000_000_123_456_789, &b, b.len() as u32));
        file.extend(epb(be, 2, (1_700_000_000u64 << 20) | (1 << 19), &c, c.len() as u32));
        let reader = CaptureReader::from_bytes(&file).expect("header");
        assert_eq!(reader.format(), CaptureFormat::PcapNg);
        let (p, stats) = packets(&file);
        assert_eq!(p.len(), 3, "be {be}: {stats:?}");
        assert_eq!(p[0].ts, 1_700_000_000_000_001_000);
        assert_eq!(p[1].ts, 1_700_000_000_123_456_789);
        assert_eq!(p[2].ts, 1_700_000_000_500_000_000);
        assert_eq!(p[1].l4, udp_l4(b"raw"));
        assert_eq!(p[2].l4, udp_l4(b"sll"));
    }
}

#[test]
fn pcapng_simple_and_obsolete_packet_blocks_and_unknown_interface() {
    let be = true;
    let mut file = shb(be);
    file.extend(idb(be, 101, 0, Some(9)));
    let a = ip(V4A, V4B, 17, &udp(1, 2, b"opb"));
    let b = ip(V4A, V4B, 17, &udp(1, 2, b"spb"));
    file.extend(opb(be, 0, 42, &a));
    file.extend(spb(be, &b));
    file.extend(epb(be, 5, 1, &a, a.len() as u32));
    let (p, stats) = packets(&file);
    assert_eq!(p.len(), 2);
    assert_eq!((p[0].ts, p[1].ts), (42, 42), "an SPB takes the last timestamp");
    assert_eq!(p[1].l4, udp_l4(b"spb"));
    assert_eq!(stats.skipped.get(&SkipReason::UnknownInterface), Some(&1));
}

#[test]
fn pcapng_key_log_is_yielded_in_file_order_and_sections_reset_interfaces() {
    let keys = "CLIENT_HANDSHAKE_TRAFFIC_SECRET 00 11\nSERVER_HANDSHAKE_TRAFFIC_SECRET 00 22\n";
    let a = ip(V4A, V4B, 17, &udp(1, 2, b"before"));
    let mut file = shb(false);
    file.extend(idb(false, 101, 0, None));
    file.extend(epb(false, 0, 1, &a, a.len() as u32));
    file.extend(dsb(false, 0x544c_534b, keys.as_bytes()));
    file.extend(dsb(false, 0x5747_4b4c, b"wireguard"));
    // A second section, big-endian, whose interface 0 is Ethernet.
    file.extend(shb(true));
    file.extend(idb(true, 1, 0, None));
    let e = ether(&[], &a);
    file.extend(epb(true, 0, 2, &e, e.len() as u32));
    let (records, result, stats) = read_all(&file);
    result.expect("no error");
    assert_eq!(records.len(), 3);
    assert!(matches!(&records[0], Record::Packet(_)));
    assert_eq!(records[1], Record::KeyLog(keys.to_string()));
    assert!(matches!(&records[2], Record::Packet(p) if p.ts == 2_000));
    assert_eq!(stats.key_logs, 1);
    assert_eq!(stats.skipped.get(&SkipReason::OtherSecrets), Some(&1));
}

/// A reader that hands out a few bytes per call, like a slow pipe.
struct Trickle<'a>(&'a [u8], usize);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.1.min(buf.len()).min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn blocks_bigger_than_the_buffer_and_short_reads_stream_fine() {
    // 600 KB packets (past the 256 KiB initial buffer) through 7-byte reads.
    let big = vec![0x5a; 600_000];
    let u = ip(V6A, V6B, 17, &udp(1, 2, &big[..60_000]));
    let mut file = shb(false);
    file.extend(idb(false, 101, 0, None));
    file.extend(epb(false, 0, 1, &big, big.len() as u32)); // not IP: counted skip
    for _ in 0..3 {
        file.extend(epb(false, 0, 1, &u, u.len() as u32));
    }
    let reader = CaptureReader::new(Trickle(&file, 7)).expect("header");
    let mut n = 0;
    for r in reader {
        assert!(matches!(r, Ok(Record::Packet(_))));
        n += 1;
    }
    assert_eq!(n, 3);
    let file = pcap(false, true, 101, &[rec(1, 2, &big), rec(1, 3, &u)]);
    let records: Vec<_> = CaptureReader::new(Trickle(&file, 1000)).expect("header").collect();
    assert_eq!(records.len(), 1);
}

#[test]
fn open_reads_a_file_from_disk() {
    let dir = std::env::temp_dir().join(format!("hystall-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("one.pcap");
    std::fs::write(&path, pcap(false, false, 228, &[rec(1, 0, &ip(V4A, V4B, 17, &udp(1, 2, b"disk")))]))
        .expect("write");
    let records: Vec<_> = CaptureReader::open(&path).expect("open").collect::<Result<_, _>>().expect("read");
    assert_eq!(records.len(), 1);
    let missing = CaptureReader::open(dir.join("missing.pcap")).err().expect("error");
    assert!(missing.to_string().starts_with("cannot open "), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}
