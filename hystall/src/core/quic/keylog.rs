//! TLS key logs in the NSS format (what SSLKEYLOGFILE produces, and what
//! pcapng Decryption Secrets Blocks carry): `LABEL <client_random> <secret>`
//! one a line, hex. A key log is the only way into QUIC's 1-RTT packets
//! offline; this parser is lenient because such files are concatenated,
//! hand-edited and written by many TLS stacks: a bad line is counted and
//! skipped, never fatal.

use std::collections::HashMap;

use super::crypto::Secret;

/// A TLS ClientHello random: the key a key log is indexed by.
pub type ClientRandom = [u8; 32];

/// The TLS 1.3 secrets of one connection that QUIC uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConnSecrets {
    /// CLIENT_HANDSHAKE_TRAFFIC_SECRET: client→server Handshake packets.
    pub client_handshake: Option<Secret>,
    /// SERVER_HANDSHAKE_TRAFFIC_SECRET: server→client Handshake packets.
    pub server_handshake: Option<Secret>,
    /// CLIENT_TRAFFIC_SECRET_0: client→server 1-RTT packets, first generation.
    pub client_app: Option<Secret>,
    /// SERVER_TRAFFIC_SECRET_0: server→client 1-RTT packets, first generation.
    pub server_app: Option<Secret>,
}

impl ConnSecrets {
    fn merge(&mut self, other: &Self) {
        self.client_handshake = other.client_handshake.or(self.client_handshake);
        self.server_handshake = other.server_handshake.or(self.server_handshake);
        self.client_app = other.client_app.or(self.client_app);
        self.server_app = other.server_app.or(self.server_app);
    }
}

/// A parsed key log: secrets by client random, in first-seen order.
#[derive(Debug, Clone, Default)]
pub struct KeyLog {
    secrets: HashMap<ClientRandom, ConnSecrets>,
    /// Client randoms in first-seen order, so trial decryption is deterministic.
    order: Vec<ClientRandom>,
    skipped: usize,
    ignored: usize,
}

/// What one line is.
enum Line {
    Blank,
    Ignored,
    Malformed,
    Secret(ClientRandom, Label, Secret),
}

#[derive(Clone, Copy)]
enum Label {
    ClientHandshake,
    ServerHandshake,
    ClientApp,
    ServerApp,
}

impl KeyLog {
    /// Parses key-log text. Never fails: blank lines and `#` comments are
    /// skipped silently; labels QUIC does not need (CLIENT_EARLY_TRAFFIC_SECRET,
    /// EXPORTER_SECRET, TLS 1.2's CLIENT_RANDOM...) are counted in
    /// [`Self::ignored`]; malformed lines and unknown labels in [`Self::skipped`].
    /// A later line for the same label and client random wins.
    pub fn parse(text: &str) -> Self {
        let mut log = Self::default();
        for line in text.lines() {
            log.add_line(line);
        }
        log
    }

    /// Adds one line (live secrets arrive a line at a time); returns the
    /// client random it named when it was a secret QUIC uses.
    pub fn add_line(&mut self, line: &str) -> Option<ClientRandom> {
        match parse_line(line) {
            Line::Blank => None,
            Line::Ignored => {
                self.ignored += 1;
                None
            }
            Line::Malformed => {
                self.skipped += 1;
                None
            }
            Line::Secret(random, label, secret) => {
                let s = self.entry(random);
                let slot = match label {
                    Label::ClientHandshake => &mut s.client_handshake,
                    Label::ServerHandshake => &mut s.server_handshake,
                    Label::ClientApp => &mut s.client_app,
                    Label::ServerApp => &mut s.server_app,
                };
                *slot = Some(secret);
                Some(random)
            }
        }
    }

    /// Forgets a connection's secrets (live: its time is up).
    pub fn remove(&mut self, client_random: &ClientRandom) {
        self.secrets.remove(client_random);
        // The order list is compacted now and then, not on every removal.
        if self.order.len() > 64 && self.order.len() > 2 * self.secrets.len() {
            let secrets = &self.secrets;
            self.order.retain(|r| secrets.contains_key(r));
        }
    }

    fn entry(&mut self, random: ClientRandom) -> &mut ConnSecrets {
        self.secrets.entry(random).or_insert_with(|| {
            self.order.push(random);
            ConnSecrets::default()
        })
    }

    /// Adds another log's entries (e.g. several Decryption Secrets Blocks);
    /// its secrets win over ours for the same client random and label.
    pub fn merge(&mut self, other: &KeyLog) {
        for (random, secrets) in other.iter() {
            self.entry(*random).merge(secrets);
        }
        self.skipped += other.skipped;
        self.ignored += other.ignored;
    }

    /// The secrets logged for a ClientHello random.
    pub fn get(&self, client_random: &ClientRandom) -> Option<&ConnSecrets> {
        self.secrets.get(client_random)
    }

    /// Every connection, in first-seen order: for trial decryption when the
    /// handshake (and so the client random) is not in the capture.
    pub fn iter(&self) -> impl Iterator<Item = (&ClientRandom, &ConnSecrets)> {
        self.order.iter().filter_map(|r| self.secrets.get_key_value(r))
    }

    /// Connections in the log.
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    /// Whether the log has no usable secrets.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Lines that could not be used: malformed, or an unknown label.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Well-formed lines with labels QUIC does not use.
    pub fn ignored(&self) -> usize {
        self.ignored
    }
}

fn parse_line(line: &str) -> Line {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Line::Blank;
    }
    let mut fields = line.split_ascii_whitespace();
    let (Some(label), Some(random), Some(secret), None) = (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Line::Malformed;
    };
    let label = match label {
        "CLIENT_HANDSHAKE_TRAFFIC_SECRET" => Label::ClientHandshake,
        "SERVER_HANDSHAKE_TRAFFIC_SECRET" => Label::ServerHandshake,
        "CLIENT_TRAFFIC_SECRET_0" => Label::ClientApp,
        "SERVER_TRAFFIC_SECRET_0" => Label::ServerApp,
        "CLIENT_EARLY_TRAFFIC_SECRET" | "EXPORTER_SECRET" | "EARLY_EXPORTER_SECRET" | "CLIENT_RANDOM" | "RSA" => {
            return Line::Ignored;
        }
        _ => return Line::Malformed,
    };
    let mut client_random = [0; 32];
    if !decode_hex(random, &mut client_random) {
        return Line::Malformed;
    }
    let mut buf = [0; 48];
    let len = secret.len() / 2;
    let Some(out) = buf.get_mut(..len) else { return Line::Malformed };
    if secret.len() % 2 != 0 || !decode_hex(secret, out) {
        return Line::Malformed;
    }
    match Secret::new(out) {
        Some(s) => Line::Secret(client_random, label, s),
        None => Line::Malformed,
    }
}

/// Decodes `hex` into exactly `out.len()` bytes.
fn decode_hex(hex: &str, out: &mut [u8]) -> bool {
    if hex.len() != out.len() * 2 {
        return false;
    }
    for (o, pair) in out.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let (Some(hi), Some(lo)) = (nibble(pair.first()), nibble(pair.get(1))) else { return false };
        *o = (hi << 4) | lo;
    }
    true
}

fn nibble(c: Option<&u8>) -> Option<u8> {
    let c = *c?;
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}
