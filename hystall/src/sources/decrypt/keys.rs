//! The secrets the key-log uprobe reads: checked, kept for a while in a key
//! log (by client random), and written to `--keylog-out` only when asked.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hystall_common::{CLIENT_RANDOM_LEN, SECRET_LABEL_MAX, SECRET_MAX, TlsSecret};

use crate::core::quic::{ClientRandom, KeyLog};
use crate::core::time::Mono;

/// Handshakes whose secrets are kept (a node's connections of the last
/// minutes; older ones are dropped first).
pub const MAX_HANDSHAKES: usize = 50_000;
/// Secrets of a handshake are dropped after this long unless a selected
/// connection uses them (then its decryptor holds them until it closes).
pub const KEEP_FOR: Duration = Duration::from_secs(30 * 60);

/// One secret as an NSS key-log line (`LABEL <client random> <secret>`), or
/// why the record cannot be one.
pub fn line(s: &TlsSecret) -> Result<String, &'static str> {
    let label = s.label.get(..s.label_len as usize).filter(|_| s.label_len as usize <= SECRET_LABEL_MAX);
    let label = label.and_then(|l| std::str::from_utf8(l).ok()).ok_or("label unreadable")?;
    if label.is_empty() || !label.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
        return Err("label unreadable");
    }
    if s.random_len as usize != CLIENT_RANDOM_LEN {
        return Err("client random of an unexpected length");
    }
    let len = s.secret_len as usize;
    if !(len == 32 || len == SECRET_MAX) {
        return Err("secret of an unexpected length");
    }
    Ok(format!("{label} {} {}", hex(&s.random), hex(&s.secret[..len])))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The secrets of recent handshakes.
pub struct Keys {
    log: KeyLog,
    /// Client randoms by arrival, for dropping the oldest.
    order: VecDeque<(Mono, ClientRandom)>,
    out: Option<(PathBuf, File)>,
    /// Records read, and those that were no usable secret.
    pub records: u64,
    pub unusable: u64,
    pub handshakes: u64,
    /// Handshakes whose secrets were dropped because their connection closed.
    pub dropped: u64,
    /// Bumped by every secret added (decryptors compare it with theirs).
    pub generation: u64,
}

impl Keys {
    /// `keylog_out`: also append every line there (created 0600, never
    /// world-readable: these secrets decrypt the node's traffic).
    pub fn new(keylog_out: Option<&Path>) -> std::io::Result<Keys> {
        let out = match keylog_out {
            Some(p) => {
                use std::os::unix::fs::OpenOptionsExt as _;
                let f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(p)?;
                // An existing file keeps its mode: make it 0600 too.
                use std::os::unix::fs::PermissionsExt as _;
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                Some((p.to_path_buf(), f))
            }
            None => None,
        };
        Ok(Keys {
            log: KeyLog::default(),
            order: VecDeque::new(),
            out,
            records: 0,
            unusable: 0,
            handshakes: 0,
            dropped: 0,
            generation: 0,
        })
    }

    pub fn keylog_out(&self) -> Option<&Path> {
        self.out.as_ref().map(|(p, _)| p.as_path())
    }

    /// Takes one record from the uprobe.
    pub fn add(&mut self, now: Mono, s: &TlsSecret) {
        self.records += 1;
        let line = match line(s) {
            Ok(l) => l,
            Err(why) => {
                self.unusable += 1;
                tracing::debug!("TLS secret record of pid {} skipped: {why}", s.tgid);
                return;
            }
        };
        if let Some((p, f)) = &mut self.out
            && let Err(e) = writeln!(f, "{line}")
        {
            tracing::warn!("--keylog-out {}: {e}", p.display());
        }
        let known = self.log.len();
        if let Some(random) = self.log.add_line(&line) {
            self.generation += 1;
            if self.log.len() > known {
                self.handshakes += 1;
                self.order.push_back((now, random));
            }
        }
        self.expire(now);
    }

    fn expire(&mut self, now: Mono) {
        while let Some(&(at, r)) = self.order.front() {
            if self.order.len() <= MAX_HANDSHAKES && now.since(at) < KEEP_FOR {
                break;
            }
            self.order.pop_front();
            self.log.remove(&r);
        }
    }

    /// Drops the secrets of one handshake (its connection closed).
    pub fn forget(&mut self, random: &ClientRandom) {
        if self.log.get(random).is_some() {
            self.log.remove(random);
            self.order.retain(|(_, r)| r != random);
            self.generation += 1;
            self.dropped += 1;
        }
    }

    pub fn log(&self) -> &KeyLog {
        &self.log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(label: &str, random: u8, secret_len: u32) -> TlsSecret {
        let mut s = TlsSecret {
            tgid: 1,
            label_len: label.len() as u32,
            random_len: 32,
            secret_len,
            ts_ns: 0,
            label: [0; SECRET_LABEL_MAX],
            random: [random; 32],
            secret: [7; SECRET_MAX],
        };
        s.label[..label.len()].copy_from_slice(label.as_bytes());
        s
    }

    #[test]
    fn records_become_key_log_lines_and_bad_ones_are_counted() {
        let l = line(&record("CLIENT_TRAFFIC_SECRET_0", 1, 32)).unwrap();
        assert_eq!(l, format!("CLIENT_TRAFFIC_SECRET_0 {} {}", "01".repeat(32), "07".repeat(32)));
        assert!(line(&record("SERVER_TRAFFIC_SECRET_0", 1, 48)).unwrap().ends_with(&"07".repeat(48)));
        assert!(line(&record("CLIENT_TRAFFIC_SECRET_0", 1, 31)).is_err());
        let mut r = record("X", 1, 32);
        r.label_len = 40;
        assert!(line(&r).is_err());
        r.label_len = 0;
        assert!(line(&r).is_err());
        let mut r = record("CLIENT_TRAFFIC_SECRET_0", 1, 32);
        r.label[0] = 0xff;
        assert!(line(&r).is_err());
    }

    #[test]
    fn secrets_are_kept_by_handshake_and_written_only_when_asked() {
        let mut k = Keys::new(None).unwrap();
        for label in ["CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET", "CLIENT_TRAFFIC_SECRET_0"] {
            k.add(Mono(1), &record(label, 9, 32));
        }
        k.add(Mono(2), &record("CLIENT_TRAFFIC_SECRET_0", 10, 32));
        assert_eq!((k.records, k.handshakes, k.unusable), (4, 2, 0));
        assert!(k.log().get(&[9; 32]).is_some_and(|s| s.client_app.is_some()));
        assert_eq!(k.generation, 4);
        // Old handshakes go.
        k.add(
            Mono(2).0.checked_add(KEEP_FOR.as_nanos() as u64 + 10).map(Mono).unwrap(),
            &record("CLIENT_TRAFFIC_SECRET_0", 11, 32),
        );
        assert!(k.log().get(&[9; 32]).is_none() && k.log().get(&[11; 32]).is_some());
        // A closed connection's secrets go at once.
        k.forget(&[11; 32]);
        assert!(k.log().get(&[11; 32]).is_none() && k.log().get(&[10; 32]).is_none());
        assert_eq!(k.dropped, 1);

        let dir = std::env::temp_dir().join(format!("hystall-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys.log");
        let mut k = Keys::new(Some(&path)).unwrap();
        k.add(Mono(1), &record("CLIENT_TRAFFIC_SECRET_0", 9, 32));
        use std::os::unix::fs::PermissionsExt as _;
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(KeyLog::parse(&text).len(), 1, "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
