//! End to end, without root: a quinn client and server on 127.0.0.1 talk
//! through a UDP relay that records every datagram with its direction, the
//! client's TLS secrets go to an in-memory key log, and [`ConnDecryptor`]
//! must then read the whole capture: stream bytes exactly as sent, ACKs,
//! DATAGRAMs, a key update in each direction. Once per cipher suite.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::SupportedCipherSuite;
use rustls::crypto::ring::cipher_suite;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::UdpSocket;

use super::super::crypto::Suite;
use super::super::{
    ConnDecryptor, DecodeOptions, DecryptError, Direction, Frame, Header, KeyLog, Opened, ShortDcidLen, Space, packets,
    parse_frames,
};

/// The client's secrets, as SSLKEYLOGFILE lines, in memory.
#[derive(Debug, Default)]
struct MemKeyLog(Mutex<String>);

impl rustls::KeyLog for MemKeyLog {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        let hex = |b: &[u8]| {
            b.iter().fold(String::new(), |mut s, x| {
                let _ = write!(s, "{x:02x}");
                s
            })
        };
        let mut text = self.0.lock().unwrap();
        let _ = writeln!(text, "{label} {} {}", hex(client_random), hex(secret));
    }
}

type Capture = Vec<(Direction, Vec<u8>)>;
/// What the decryptor said about one packet.
type Outcome = (Direction, Result<Opened, DecryptError>);

fn provider(suite: SupportedCipherSuite) -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![suite];
    Arc::new(provider)
}

/// Initial packets always use AES-128-GCM, whatever the negotiated suite.
fn initial_suite() -> rustls::quic::Suite {
    cipher_suite::TLS13_AES_128_GCM_SHA256.tls13().and_then(|s| s.quic_suite()).unwrap()
}

fn configs(suite: SupportedCipherSuite, keylog: Arc<MemKeyLog>) -> (quinn::ServerConfig, quinn::ClientConfig) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert: CertificateDer<'static> = certified.cert.der().clone();
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let mut server = rustls::ServerConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], PrivateKeyDer::Pkcs8(key))
        .unwrap();
    server.alpn_protocols = vec![b"h3".to_vec()];
    server.max_early_data_size = u32::MAX;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h3".to_vec()];
    client.key_log = keylog;
    let server = QuicServerConfig::with_initial(Arc::new(server), initial_suite()).unwrap();
    let client = QuicClientConfig::with_initial(Arc::new(client), initial_suite()).unwrap();
    (quinn::ServerConfig::with_crypto(Arc::new(server)), quinn::ClientConfig::new(Arc::new(client)))
}

/// Forwards datagrams between the client (who talks to `front`) and the
/// server, recording each with its direction.
async fn relay(front: UdpSocket, server: SocketAddr, capture: Arc<Mutex<Capture>>) {
    let back = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    back.connect(server).await.unwrap();
    let mut client = None;
    let mut up = vec![0; 65536];
    let mut down = vec![0; 65536];
    loop {
        tokio::select! {
            Ok((n, from)) = front.recv_from(&mut up) => {
                client = Some(from);
                capture.lock().unwrap().push((Direction::ClientToServer, up[..n].to_vec()));
                let _ = back.send(&up[..n]).await;
            }
            Ok(n) = back.recv(&mut down) => {
                capture.lock().unwrap().push((Direction::ServerToClient, down[..n].to_vec()));
                if let Some(to) = client {
                    let _ = front.send_to(&down[..n], to).await;
                }
            }
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

const FIRST: usize = 100_000;
const SECOND: usize = 40_000;
const DATAGRAMS: [&[u8]; 3] = [b"datagram one", b"datagram two", b"datagram three"];

/// Runs one connection through the relay; returns the capture and key log.
async fn run(suite: SupportedCipherSuite) -> (Capture, String) {
    let keylog = Arc::new(MemKeyLog::default());
    let (server_config, client_config) = configs(suite, Arc::clone(&keylog));
    let server = quinn::Endpoint::server(server_config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let server_addr = server.local_addr().unwrap();
    let front = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let front_addr = front.local_addr().unwrap();
    let capture = Arc::new(Mutex::new(Vec::new()));
    let relay = tokio::spawn(relay(front, server_addr, Arc::clone(&capture)));

    let server_task = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        for _ in 0..2 {
            let (mut send, mut recv) = conn.accept_bi().await.unwrap();
            let mut data = recv.read_to_end(1 << 20).await.unwrap();
            data.reverse();
            send.write_all(&data).await.unwrap();
            send.finish().unwrap();
            if conn.stats().path.sent_packets > 0 && data.len() == FIRST {
                for want in DATAGRAMS {
                    assert_eq!(conn.read_datagram().await.unwrap(), want);
                }
            }
        }
        let _ = conn.closed().await;
        server.wait_idle().await;
    });

    let client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let conn = client.connect_with(client_config, front_addr, "localhost").unwrap().await.unwrap();
    for (len, seed) in [(FIRST, 1u8), (SECOND, 2u8)] {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&pattern(len, seed)).await.unwrap();
        send.finish().unwrap();
        let back = recv.read_to_end(1 << 20).await.unwrap();
        let mut want = pattern(len, seed);
        want.reverse();
        assert_eq!(back, want);
        if len == FIRST {
            for d in DATAGRAMS {
                conn.send_datagram(bytes::Bytes::from_static(d)).unwrap();
            }
            conn.force_key_update();
        }
    }
    conn.close(0u32.into(), b"done");
    client.wait_idle().await;
    tokio::time::timeout(Duration::from_secs(10), server_task).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    relay.abort();
    let capture = capture.lock().unwrap().clone();
    let text = keylog.0.lock().unwrap().clone();
    (capture, text)
}

/// quinn greases the fixed bit (RFC 9287) by default: allow it.
fn opts(short_dcid_len: ShortDcidLen) -> DecodeOptions {
    DecodeOptions { short_dcid_len, allow_clear_fixed_bit: true }
}

/// Short-header DCID lengths per direction, from the long headers' SCIDs.
fn dcid_lengths(capture: &Capture) -> [u8; 2] {
    let mut lens = [0u8; 2];
    for (dir, datagram) in capture {
        for p in packets(datagram, opts(ShortDcidLen::Unknown)).flatten() {
            if let Header::Long(h) = p.header {
                // A client's SCID is what the server puts in short headers, and back.
                let other = if *dir == Direction::ClientToServer { 1 } else { 0 };
                lens[other] = h.scid.len() as u8;
            }
        }
    }
    lens
}

/// Every packet of the capture through one decryptor; `long_headers: false`
/// leaves them out, as in a capture that starts after the handshake.
fn decrypt_all(capture: &Capture, keylog: KeyLog, long_headers: bool) -> (ConnDecryptor, Vec<Outcome>) {
    let lens = dcid_lengths(capture);
    let mut d = ConnDecryptor::new(Arc::new(keylog));
    let mut out = Vec::new();
    for (dir, datagram) in capture {
        let len = if *dir == Direction::ClientToServer { lens[0] } else { lens[1] };
        for p in packets(datagram, opts(ShortDcidLen::Known(len))) {
            let p = p.expect("quinn's packets decode");
            if !long_headers && !matches!(p.header, Header::Short(_)) {
                continue;
            }
            out.push((*dir, d.decrypt(*dir, &p, datagram)));
        }
    }
    (d, out)
}

#[derive(Default)]
struct Seen {
    streams: BTreeMap<(usize, u64), Vec<u8>>,
    datagrams: Vec<Vec<u8>>,
    acks: [usize; 2],
    phases: [[bool; 2]; 2],
}

fn read_frames(results: &[Outcome]) -> Seen {
    let mut seen = Seen::default();
    for (dir, r) in results {
        let Ok(opened) = r else { continue };
        let d = if *dir == Direction::ClientToServer { 0 } else { 1 };
        if let Some(phase) = opened.key_phase {
            seen.phases[d][usize::from(phase)] = true;
        }
        let (frames, err) = parse_frames(&opened.payload);
        assert_eq!(err, None, "{dir:?} {:?} pn {}", opened.space, opened.pn);
        for f in frames {
            match f {
                Frame::Stream { stream_id, offset, data, .. } => {
                    let buf = seen.streams.entry((d, stream_id)).or_default();
                    let end = offset as usize + data.len();
                    if buf.len() < end {
                        buf.resize(end, 0);
                    }
                    buf[offset as usize..end].copy_from_slice(data);
                }
                Frame::Datagram { data, .. } if d == 0 => seen.datagrams.push(data.to_vec()),
                Frame::Ack(_) => seen.acks[d] += 1,
                _ => {}
            }
        }
    }
    seen
}

fn check_suite(suite: SupportedCipherSuite, want: Suite) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (capture, keylog_text) = rt.block_on(run(suite));
    let keylog = KeyLog::parse(&keylog_text);
    assert_eq!((keylog.len(), keylog.skipped()), (1, 0), "{keylog_text}");

    // The whole capture, handshake included.
    let (d, results) = decrypt_all(&capture, keylog.clone(), true);
    assert!(results.len() > 100, "140 KB each way is well over 100 packets: {}", results.len());
    for (dir, r) in &results {
        assert!(r.is_ok(), "{dir:?}: {r:?}");
    }
    assert_eq!(d.suite(), Some(want));

    // A capture that lost a long run of client packets (tcpdump drops under
    // load): the packet numbers after the gap are reconstructed a window
    // further on, and everything after it still opens.
    let c2s: Vec<usize> =
        capture.iter().enumerate().filter(|(_, (dir, _))| *dir == Direction::ClientToServer).map(|(i, _)| i).collect();
    let (from, to) = (c2s[c2s.len() / 4], c2s[(c2s.len() / 4 + 300).min(c2s.len() - 10)]);
    let gapped: Capture = capture
        .iter()
        .enumerate()
        .filter(|(i, (dir, _))| !(*dir == Direction::ClientToServer && (from..to).contains(i)))
        .map(|(_, x)| x.clone())
        .collect();
    let (_, gap_results) = decrypt_all(&gapped, keylog.clone(), true);
    let failed: Vec<_> = gap_results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(failed.is_empty(), "after a gap of {} client datagrams: {failed:?}", to - from);
    assert!(d.secrets_found());
    let stats = d.stats();
    assert_eq!((stats.opened as usize, stats.auth_failed, stats.no_keys), (results.len(), 0, 0));
    assert_eq!(stats.key_updates, [1, 1], "one key update each way");
    for space in [Space::Initial, Space::Handshake, Space::Application] {
        assert!(results.iter().any(|(_, r)| r.as_ref().is_ok_and(|o| o.space == space)), "{space:?}");
    }
    let seen = read_frames(&results);
    assert_eq!(seen.phases, [[true, true], [true, true]], "both key phases in both directions");
    assert!(seen.acks[0] > 0 && seen.acks[1] > 0);
    assert_eq!(seen.datagrams, DATAGRAMS.map(<[u8]>::to_vec).to_vec());
    for (stream, len, seed) in [(0, FIRST, 1), (4, SECOND, 2)] {
        let mut back = pattern(len, seed);
        assert_eq!(seen.streams.get(&(0, stream)), Some(&back), "client stream {stream}");
        back.reverse();
        assert_eq!(seen.streams.get(&(1, stream)), Some(&back), "server stream {stream}");
    }

    // No handshake in the capture: trial decryption against a key log with
    // an unrelated entry before the right one.
    let decoy = format!(
        "CLIENT_TRAFFIC_SECRET_0 {r} {s}\nSERVER_TRAFFIC_SECRET_0 {r} {s}\n",
        r = "ab".repeat(32),
        s = "cd".repeat(want.hash_len())
    );
    let mut with_decoy = KeyLog::parse(&decoy);
    with_decoy.merge(&keylog);
    let (d, results) = decrypt_all(&capture, with_decoy.clone(), false);
    assert!(results.iter().all(|(_, r)| r.is_ok()), "trial decryption opens everything");
    assert_eq!((d.suite(), d.stats().key_updates), (Some(want), [1, 1]));
    assert_eq!(d.client_random(), keylog.iter().next().map(|(r, _)| r));

    // The handshake's random told up front (live: read from the client's
    // Initial): the short headers open with no trial, the decoy first in the
    // log or not; a wrong random opens nothing, with no trial to fall back on.
    let random = *keylog.iter().next().map(|(r, _)| r).unwrap();
    let hello = {
        let (d, _) = decrypt_all(&capture[..1].to_vec(), KeyLog::default(), true);
        d.client_random().copied()
    };
    assert_eq!(hello, Some(random), "the first client Initial names the handshake");
    for (told, opens) in [(random, true), ([0x5a; 32], false)] {
        let lens = dcid_lengths(&capture);
        let mut d = ConnDecryptor::new(Arc::new(with_decoy.clone())).with_trial_limit(0);
        d.set_client_random(told);
        assert_eq!(d.secrets_found(), opens);
        let short: Vec<Outcome> = capture
            .iter()
            .flat_map(|(dir, datagram)| {
                let len = if *dir == Direction::ClientToServer { lens[0] } else { lens[1] };
                packets(datagram, opts(ShortDcidLen::Known(len)))
                    .flatten()
                    .filter(|p| matches!(p.header, Header::Short(_)))
                    .map(|p| (*dir, d.decrypt(*dir, &p, datagram)))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(short.iter().all(|(_, r)| r.is_ok() == opens), "told {told:02x?}: {:?}", short.first());
    }

    // Only the decoy: trial decryption gives up after a bounded number of packets.
    let (d, results) = decrypt_all(&capture, KeyLog::parse(&decoy), false);
    assert!(!d.secrets_found());
    assert!(results.iter().all(|(_, r)| r.is_err()));
    assert!(results.iter().any(|(_, r)| *r == Err(DecryptError::NoMatchingSecrets)));

    // Traffic secrets missing: the handshake still opens, 1-RTT is NoKeys.
    let handshake_only: String =
        keylog_text.lines().filter(|l| !l.contains("TRAFFIC_SECRET_0")).map(|l| l.to_owned() + "\n").collect();
    let (d, results) = decrypt_all(&capture, KeyLog::parse(&handshake_only), true);
    for (dir, r) in &results {
        match r {
            Ok(o) => assert_ne!(o.space, Space::Application),
            Err(e) => assert_eq!(*e, DecryptError::NoKeys { space: Space::Application }, "{dir:?}"),
        }
    }
    assert!(d.stats().no_keys > 0 && d.stats().auth_failed == 0);

    // Wrong traffic secrets: every 1-RTT packet fails authentication.
    let wrong: String = keylog_text
        .lines()
        .map(|l| {
            let mut l = l.to_owned();
            if l.contains("TRAFFIC_SECRET_0") {
                // Another last hex digit: a wrong secret of the right length.
                let last = l.pop();
                l.push(if last == Some('0') { '1' } else { '0' });
            }
            l + "\n"
        })
        .collect();
    let (d, results) = decrypt_all(&capture, KeyLog::parse(&wrong), true);
    let app = results
        .iter()
        .filter(|(_, r)| matches!(r, Err(DecryptError::AuthFailed { space: Space::Application, .. })))
        .count();
    assert!(app > 0);
    assert_eq!(d.stats().auth_failed as usize, app);
    assert!(results.iter().all(|(_, r)| r.as_ref().map_or(true, |o| o.space != Space::Application)));
}

#[test]
fn quinn_capture_decrypts_with_aes_128_gcm() {
    check_suite(cipher_suite::TLS13_AES_128_GCM_SHA256, Suite::Aes128Gcm);
}

#[test]
fn quinn_capture_decrypts_with_aes_256_gcm() {
    check_suite(cipher_suite::TLS13_AES_256_GCM_SHA384, Suite::Aes256Gcm);
}

#[test]
fn quinn_capture_decrypts_with_chacha20_poly1305() {
    check_suite(cipher_suite::TLS13_CHACHA20_POLY1305_SHA256, Suite::ChaCha20Poly1305);
}
