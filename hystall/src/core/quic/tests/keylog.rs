//! Key-log parsing: labels, comments, malformed lines, merging.

use super::super::KeyLog;

const RANDOM_A: &str = "aa00000000000000000000000000000000000000000000000000000000000001";
const RANDOM_B: &str = "bb00000000000000000000000000000000000000000000000000000000000002";

fn random(s: &str) -> [u8; 32] {
    super::hex(s).try_into().unwrap()
}

#[test]
fn parses_the_four_quic_secrets_and_skips_the_rest() {
    let s32 = "11".repeat(32);
    let s48 = "22".repeat(48);
    let text = format!(
        "# SSL/TLS secrets log file\n\n\
         CLIENT_HANDSHAKE_TRAFFIC_SECRET {RANDOM_A} {s32}\n\
         SERVER_HANDSHAKE_TRAFFIC_SECRET {RANDOM_A} {s32}\r\n\
         CLIENT_TRAFFIC_SECRET_0 {RANDOM_A} {s32}\n\
         SERVER_TRAFFIC_SECRET_0 {} {s48}\n\
         EXPORTER_SECRET {RANDOM_A} {s32}\n\
         CLIENT_EARLY_TRAFFIC_SECRET {RANDOM_A} {s32}\n\
         CLIENT_RANDOM {RANDOM_B} {}\n\
         CLIENT_TRAFFIC_SECRET_0 {RANDOM_B} {}\n\
         CLIENT_TRAFFIC_SECRET_0 {RANDOM_B}\n\
         CLIENT_TRAFFIC_SECRET_0 {RANDOM_B} zz{}\n\
         CLIENT_TRAFFIC_SECRET_0 abcd {s32}\n\
         SOMETHING_NEW {RANDOM_B} {s32}\n\
         CLIENT_TRAFFIC_SECRET_0 {RANDOM_B} {s32} extra\n\
         CLIENT_TRAFFIC_SECRET_0 {RANDOM_B} {}\n",
        RANDOM_A.to_uppercase(),
        "33".repeat(48),
        "44".repeat(31),
        "55".repeat(31),
        "66".repeat(33),
    );
    let log = KeyLog::parse(&text);
    assert_eq!((log.len(), log.skipped(), log.ignored()), (1, 7, 3));
    let a = log.get(&random(RANDOM_A)).expect("upper-case hex is the same random");
    assert_eq!(a.client_handshake.unwrap().as_bytes(), [0x11; 32]);
    assert_eq!(a.server_handshake.unwrap().len(), 32);
    assert_eq!(a.client_app.unwrap().len(), 32);
    assert_eq!(a.server_app.unwrap().as_bytes(), [0x22; 48]);
    assert!(log.get(&random(RANDOM_B)).is_none());
}

#[test]
fn merge_adds_entries_and_later_secrets_win() {
    let mut log = KeyLog::parse(&format!("CLIENT_TRAFFIC_SECRET_0 {RANDOM_A} {}\nbad line\n", "01".repeat(32)));
    let other = KeyLog::parse(&format!(
        "CLIENT_TRAFFIC_SECRET_0 {RANDOM_A} {}\nSERVER_TRAFFIC_SECRET_0 {RANDOM_B} {}\n",
        "02".repeat(32),
        "03".repeat(32)
    ));
    log.merge(&other);
    assert_eq!((log.len(), log.skipped()), (2, 1));
    assert_eq!(log.get(&random(RANDOM_A)).unwrap().client_app.unwrap().as_bytes(), [2; 32]);
    let order: Vec<_> = log.iter().map(|(r, _)| *r).collect();
    assert_eq!(order, vec![random(RANDOM_A), random(RANDOM_B)]);
}

#[test]
fn garbage_text_never_panics() {
    let mut rng = super::Rng::new(99);
    for _ in 0..2000 {
        let len = rng.below(300);
        let bytes: Vec<u8> = (0..len).map(|_| b"CLIENT_TRAFFIC_SECRET_0 0af \n#\t"[rng.below(31)]).collect();
        let log = KeyLog::parse(&String::from_utf8_lossy(&bytes));
        assert!(log.len() <= log.iter().count());
    }
}
