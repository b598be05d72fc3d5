//! Offline decryption of one QUIC connection, seen from the middle.
//!
//! An observer with a capture of both directions and a TLS key log can read
//! every packet: Initial keys come from the client's first Destination
//! Connection ID (RFC 9001 §5.2; a Retry replaces it with the Retry's SCID),
//! the Initial CRYPTO stream gives the ClientHello random that indexes the key
//! log and the ServerHello's cipher suite, and the key log gives the Handshake
//! and 1-RTT secrets. Captures often start mid-connection (no handshake): then
//! each key-log entry is tried on the first protected packets, for a bounded
//! number of packets, and the one that opens is kept.
//!
//! [`ConnDecryptor`] is fed packets in capture order and keeps the state this
//! needs: largest packet number per direction and space (packet numbers are
//! truncated on the wire), key phases (key updates), the chosen suite.
//! Pure code, no I/O; it never panics on input.

mod generations;
mod hello;

use std::sync::Arc;

use thiserror::Error;

use self::generations::{OpenError, Plain, SpaceKeys};
use self::hello::CryptoStream;
use super::crypto::{CryptoError, Secret, Suite, initial_secrets, verify_retry_integrity};
use super::frames::{Frame, Frames};
use super::keylog::{ClientRandom, ConnSecrets, KeyLog};
use super::{ConnectionId, Header, LongType, Packet, PacketType, Version};

/// Packets that may fail trial decryption before the decryptor gives up on
/// finding this connection in the key log.
pub const DEFAULT_TRIAL_LIMIT: u32 = 16;

/// Which way a packet went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client (the side that sent the first Initial).
    ClientToServer,
    /// From the server.
    ServerToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Self::ClientToServer => 0,
            Self::ServerToClient => 1,
        }
    }
}

/// The encryption level a packet was protected at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// Initial packets (keys from the client's DCID).
    Initial,
    /// Handshake packets.
    Handshake,
    /// 0-RTT packets (client early data; never decrypted here).
    ZeroRtt,
    /// 1-RTT (short header) packets.
    Application,
}

impl Space {
    /// Index of the packet-number space (0-RTT and 1-RTT share one).
    fn pn_space(self) -> usize {
        match self {
            Self::Initial => 0,
            Self::Handshake => 1,
            Self::ZeroRtt | Self::Application => 2,
        }
    }
}

/// A decrypted packet. Run [`super::parse_frames`] on the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// Its encryption level.
    pub space: Space,
    /// Its full packet number.
    pub pn: u64,
    /// Short headers: the key phase bit. `None` for long headers.
    pub key_phase: Option<bool>,
    /// The plaintext: frames.
    pub payload: Vec<u8>,
}

/// Why a packet was not decrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum DecryptError {
    /// No secrets for this space and direction: the key log lacks them, the
    /// ClientHello has not been seen yet, or (0-RTT) they are not supported.
    #[error("no keys for {space:?} packets")]
    NoKeys {
        /// The packet's space.
        space: Space,
    },
    /// No key-log entry opened this connection's packets (trial decryption
    /// gave up after the configured number of packets).
    #[error("no matching secrets in the key log")]
    NoMatchingSecrets,
    /// Header protection could not be removed (packet too short).
    #[error("cannot remove header protection: {0}")]
    Unprotect(CryptoError),
    /// The AEAD tag did not verify: wrong secrets, or a corrupt packet.
    #[error("{space:?} packet {pn} failed authentication")]
    AuthFailed {
        /// The packet's space.
        space: Space,
        /// The packet number the (possibly wrong) header key revealed.
        pn: u64,
    },
    /// The packet is not where its header says, or lacks what decryption
    /// needs (a short header decoded without its DCID length).
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    /// Not a protected packet: Retry, Version Negotiation, unknown version.
    #[error("{0:?} packets are not encrypted")]
    NotEncrypted(PacketType),
}

/// Counters, for "how much of this capture could be read".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DecryptStats {
    /// Packets opened.
    pub opened: u64,
    /// Packets whose AEAD failed.
    pub auth_failed: u64,
    /// Packets without keys (including after trial decryption gave up).
    pub no_keys: u64,
    /// Malformed or too-short packets.
    pub malformed: u64,
    /// Key updates followed, client→server and server→client.
    pub key_updates: [u32; 2],
    /// Retry packets whose integrity tag verified.
    pub retries: u32,
}

/// Initial keys, for the DCID and version they were derived from.
struct InitialKeys {
    version: Version,
    dcid: ConnectionId,
    keys: [SpaceKeys; 2],
}

/// Decrypts the packets of one connection, both directions, in capture order.
pub struct ConnDecryptor {
    keylog: Arc<KeyLog>,
    /// Last version seen in a long header: it sets the 1-RTT labels.
    version: Option<Version>,
    /// The DCID Initial keys derive from.
    initial_dcid: Option<ConnectionId>,
    initial: Option<InitialKeys>,
    crypto: [CryptoStream; 2],
    client_random: Option<ClientRandom>,
    suite: Option<Suite>,
    secrets: Option<ConnSecrets>,
    /// Handshake (0) and 1-RTT (1) keys per direction.
    keys: [[Option<SpaceKeys>; 2]; 2],
    largest: [[Option<u64>; 3]; 2],
    trial_limit: u32,
    trial_failures: u32,
    stats: DecryptStats,
}

impl std::fmt::Debug for ConnDecryptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnDecryptor")
            .field("version", &self.version)
            .field("suite", &self.suite)
            .field("secrets_found", &self.secrets.is_some())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ConnDecryptor {
    /// A decryptor that looks secrets up in `keylog`.
    pub fn new(keylog: Arc<KeyLog>) -> Self {
        Self {
            keylog,
            version: None,
            initial_dcid: None,
            initial: None,
            crypto: Default::default(),
            client_random: None,
            suite: None,
            secrets: None,
            keys: Default::default(),
            largest: [[None; 3]; 2],
            trial_limit: DEFAULT_TRIAL_LIMIT,
            trial_failures: 0,
            stats: DecryptStats::default(),
        }
    }

    /// How many packets trial decryption may fail on before giving up.
    pub fn with_trial_limit(mut self, packets: u32) -> Self {
        self.trial_limit = packets;
        self
    }

    /// The QUIC version, when no long header has been seen (it selects v1 or
    /// v2 labels for 1-RTT keys; without it trial decryption tries both).
    pub fn with_version(mut self, version: Version) -> Self {
        self.version = Some(version);
        self
    }

    /// The cipher suite of the Handshake and 1-RTT packets, once known.
    pub fn suite(&self) -> Option<Suite> {
        self.suite
    }

    /// Whether this connection's secrets were found in the key log.
    pub fn secrets_found(&self) -> bool {
        self.secrets.is_some()
    }

    /// The ClientHello random (seen in the capture, or of the key-log entry
    /// trial decryption matched).
    pub fn client_random(&self) -> Option<&ClientRandom> {
        self.client_random.as_ref()
    }

    /// The version the 1-RTT keys use.
    pub fn version(&self) -> Option<Version> {
        self.version
    }

    /// Counters so far.
    pub fn stats(&self) -> DecryptStats {
        let mut stats = self.stats;
        for (dir, slot) in stats.key_updates.iter_mut().enumerate() {
            *slot = self.keys.get(dir).and_then(|k| k[1].as_ref()).map_or(0, |k| k.updates);
        }
        stats
    }

    /// The ClientHello random, learnt elsewhere (live: from the client's
    /// Initial, copied when the connection began): its secrets are looked up
    /// by it, with no trial decryption.
    pub fn set_client_random(&mut self, random: ClientRandom) {
        if self.client_random.is_none() {
            self.client_random = Some(random);
            self.secrets = self.keylog.get(&random).copied();
        }
    }

    /// A key log with more secrets (a pcapng Decryption Secrets Block read
    /// after this connection started): its ClientHello's secrets may be there now.
    pub fn set_keylog(&mut self, keylog: Arc<KeyLog>) {
        self.keylog = keylog;
        if self.secrets.is_none()
            && let Some(random) = &self.client_random
        {
            self.secrets = self.keylog.get(random).copied();
        }
    }

    /// Decrypts one packet of `datagram` (as the header decoder found it).
    pub fn decrypt(&mut self, dir: Direction, packet: &Packet<'_>, datagram: &[u8]) -> Result<Opened, DecryptError> {
        let result = self.decrypt_packet(dir, packet, datagram);
        match &result {
            Ok(_) => self.stats.opened += 1,
            Err(DecryptError::AuthFailed { .. }) => self.stats.auth_failed += 1,
            Err(DecryptError::NoKeys { .. } | DecryptError::NoMatchingSecrets) => self.stats.no_keys += 1,
            Err(DecryptError::Malformed(_) | DecryptError::Unprotect(_)) => self.stats.malformed += 1,
            Err(DecryptError::NotEncrypted(_)) => {}
        }
        result
    }

    /// `decrypt`, counting only a success: for trials (which DCID length a
    /// short header has), whose failures are expected.
    pub fn try_decrypt(&mut self, dir: Direction, packet: &Packet<'_>, datagram: &[u8]) -> Option<Opened> {
        let opened = self.decrypt_packet(dir, packet, datagram).ok()?;
        self.stats.opened += 1;
        Some(opened)
    }

    fn decrypt_packet(&mut self, dir: Direction, packet: &Packet<'_>, datagram: &[u8]) -> Result<Opened, DecryptError> {
        let end = packet.offset.checked_add(packet.len).ok_or(DecryptError::Malformed("packet length overflows"))?;
        let bytes = datagram.get(packet.offset..end).ok_or(DecryptError::Malformed("packet outside the datagram"))?;
        let relative = |pn_offset: usize| {
            pn_offset.checked_sub(packet.offset).ok_or(DecryptError::Malformed("packet number before the packet"))
        };
        match &packet.header {
            Header::Long(h) => {
                self.version = Some(h.version);
                let pn_offset = relative(h.pn_offset)?;
                match h.packet_type {
                    LongType::Initial => self.open_initial(dir, h.version, h.dcid, bytes, pn_offset),
                    LongType::Handshake => self.open_keyed(dir, Space::Handshake, bytes, pn_offset),
                    LongType::ZeroRtt => Err(DecryptError::NoKeys { space: Space::ZeroRtt }),
                }
            }
            Header::Short(h) => {
                let pn_offset =
                    h.pn_offset.ok_or(DecryptError::Malformed("short header decoded without DCID length"))?;
                self.open_keyed(dir, Space::Application, bytes, relative(pn_offset)?)
            }
            Header::Retry(h) => {
                if dir == Direction::ServerToClient
                    && let Some(odcid) = self.initial_dcid
                    && verify_retry_integrity(h.version, odcid.as_bytes(), bytes)
                {
                    // The client's next Initials use the Retry's SCID as DCID,
                    // and their keys derive from it.
                    self.initial_dcid = ConnectionId::new(h.scid);
                    self.stats.retries += 1;
                }
                Err(DecryptError::NotEncrypted(PacketType::Retry))
            }
            Header::VersionNegotiation(_) | Header::UnknownVersion(_) => {
                Err(DecryptError::NotEncrypted(packet.packet_type()))
            }
        }
    }

    fn open_initial(
        &mut self,
        dir: Direction,
        version: Version,
        dcid: &[u8],
        bytes: &[u8],
        pn_offset: usize,
    ) -> Result<Opened, DecryptError> {
        if dir == Direction::ClientToServer && self.initial_dcid.is_none() {
            self.initial_dcid = ConnectionId::new(dcid);
        }
        let odcid = self.initial_dcid.ok_or(DecryptError::NoKeys { space: Space::Initial })?;
        if self.initial.as_ref().is_none_or(|k| k.version != version || k.dcid != odcid) {
            let secrets = initial_secrets(version, odcid.as_bytes()).map_err(DecryptError::Unprotect)?;
            let keys = [
                SpaceKeys::new(version, Suite::Aes128Gcm, &secrets.client).map_err(DecryptError::Unprotect)?,
                SpaceKeys::new(version, Suite::Aes128Gcm, &secrets.server).map_err(DecryptError::Unprotect)?,
            ];
            self.initial = Some(InitialKeys { version, dcid: odcid, keys });
        }
        let largest = self.largest_mut(dir, Space::Initial);
        let largest_pn = *largest;
        let keys = self.initial.as_mut().and_then(|k| k.keys.get_mut(dir.index()));
        let keys = keys.ok_or(DecryptError::NoKeys { space: Space::Initial })?;
        let plain = keys.open(bytes, pn_offset, largest_pn).map_err(|e| open_error(e, Space::Initial))?;
        let opened = self.finish(dir, Space::Initial, plain);
        self.read_hello(dir, &opened.payload);
        Ok(opened)
    }

    /// Feeds Initial CRYPTO data to the TLS reader: the ClientHello random
    /// finds the key-log entry, the ServerHello names the suite.
    fn read_hello(&mut self, dir: Direction, payload: &[u8]) {
        let Some(stream) = self.crypto.get_mut(dir.index()) else { return };
        for frame in Frames::new(payload) {
            match frame {
                Ok(Frame::Crypto { offset, data }) => stream.insert(offset, data),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        match dir {
            Direction::ClientToServer if self.client_random.is_none() => {
                self.client_random = stream.client_random();
                if let Some(random) = &self.client_random {
                    self.secrets = self.keylog.get(random).copied();
                }
            }
            Direction::ServerToClient if self.suite.is_none() => {
                self.suite = stream.server_cipher_suite().and_then(Suite::from_tls_id);
            }
            _ => {}
        }
    }

    /// Handshake and 1-RTT packets: keys from the key log.
    fn open_keyed(
        &mut self,
        dir: Direction,
        space: Space,
        bytes: &[u8],
        pn_offset: usize,
    ) -> Result<Opened, DecryptError> {
        let level = usize::from(space == Space::Application);
        let largest = *self.largest_mut(dir, space);
        if self.keys.get(dir.index()).and_then(|k| k.get(level)).is_some_and(Option::is_some) {
            let keys = self.keys.get_mut(dir.index()).and_then(|k| k.get_mut(level)).and_then(Option::as_mut);
            let keys = keys.ok_or(DecryptError::NoKeys { space })?;
            let plain = keys.open(bytes, pn_offset, largest).map_err(|e| open_error(e, space))?;
            return Ok(self.finish(dir, space, plain));
        }
        let (plain, keys) = match self.secrets {
            Some(secrets) => self.install(dir, space, &secrets, bytes, pn_offset, largest)?,
            None if self.client_random.is_some() || self.trial_failures >= self.trial_limit => {
                return Err(if self.client_random.is_some() {
                    DecryptError::NoKeys { space }
                } else {
                    DecryptError::NoMatchingSecrets
                });
            }
            None => self.trial(dir, space, bytes, pn_offset, largest)?,
        };
        if let Some(slot) = self.keys.get_mut(dir.index()).and_then(|k| k.get_mut(level)) {
            *slot = Some(keys);
        }
        Ok(self.finish(dir, space, plain))
    }

    /// Keys for a space from known secrets: the ServerHello's suite, or each
    /// suite the secret's length allows.
    fn install(
        &mut self,
        dir: Direction,
        space: Space,
        secrets: &ConnSecrets,
        bytes: &[u8],
        pn_offset: usize,
        largest: Option<u64>,
    ) -> Result<(Plain, SpaceKeys), DecryptError> {
        let secret = secret_for(secrets, dir, space).ok_or(DecryptError::NoKeys { space })?;
        let mut last = DecryptError::NoKeys { space };
        for version in self.versions() {
            for suite in self.suites(&secret) {
                match try_open(version, suite, &secret, bytes, pn_offset, largest, space) {
                    Ok(found) => {
                        self.suite = Some(suite);
                        self.version = Some(version);
                        return Ok(found);
                    }
                    Err(e) => last = e,
                }
            }
        }
        Err(last)
    }

    /// No handshake in the capture: each key-log entry, until one opens.
    fn trial(
        &mut self,
        dir: Direction,
        space: Space,
        bytes: &[u8],
        pn_offset: usize,
        largest: Option<u64>,
    ) -> Result<(Plain, SpaceKeys), DecryptError> {
        let log = Arc::clone(&self.keylog);
        for (random, secrets) in log.iter() {
            let Some(secret) = secret_for(secrets, dir, space) else { continue };
            for version in self.versions() {
                for suite in self.suites(&secret) {
                    if let Ok(found) = try_open(version, suite, &secret, bytes, pn_offset, largest, space) {
                        self.suite = Some(suite);
                        self.version = Some(version);
                        self.secrets = Some(*secrets);
                        self.client_random = Some(*random);
                        return Ok(found);
                    }
                }
            }
        }
        self.trial_failures += 1;
        Err(if self.trial_failures >= self.trial_limit {
            DecryptError::NoMatchingSecrets
        } else {
            DecryptError::NoKeys { space }
        })
    }

    fn versions(&self) -> Vec<Version> {
        match self.version {
            Some(v) => vec![v],
            None => vec![Version::V1, Version::V2],
        }
    }

    fn suites(&self, secret: &Secret) -> Vec<Suite> {
        match self.suite {
            Some(s) if s.hash_len() == secret.len() => vec![s],
            _ => Suite::for_secret_len(secret.len()).collect(),
        }
    }

    fn largest_mut(&mut self, dir: Direction, space: Space) -> &mut Option<u64> {
        let [c2s, s2c] = &mut self.largest;
        let spaces = if dir == Direction::ClientToServer { c2s } else { s2c };
        let [initial, handshake, app] = spaces;
        match space.pn_space() {
            0 => initial,
            1 => handshake,
            _ => app,
        }
    }

    fn finish(&mut self, dir: Direction, space: Space, plain: Plain) -> Opened {
        let largest = self.largest_mut(dir, space);
        *largest = Some(largest.map_or(plain.header.pn, |l| l.max(plain.header.pn)));
        Opened { space, pn: plain.header.pn, key_phase: plain.header.key_phase, payload: plain.payload }
    }
}

fn secret_for(secrets: &ConnSecrets, dir: Direction, space: Space) -> Option<Secret> {
    match (space, dir) {
        (Space::Handshake, Direction::ClientToServer) => secrets.client_handshake,
        (Space::Handshake, Direction::ServerToClient) => secrets.server_handshake,
        (Space::Application, Direction::ClientToServer) => secrets.client_app,
        (Space::Application, Direction::ServerToClient) => secrets.server_app,
        (Space::Initial | Space::ZeroRtt, _) => None,
    }
}

fn try_open(
    version: Version,
    suite: Suite,
    secret: &Secret,
    bytes: &[u8],
    pn_offset: usize,
    largest: Option<u64>,
    space: Space,
) -> Result<(Plain, SpaceKeys), DecryptError> {
    // Candidate keys (a suite, a version, a key-log entry) get one attempt:
    // no packet-number gap search, which would multiply the cost of every wrong guess.
    let mut keys = SpaceKeys::new(version, suite, secret).map_err(DecryptError::Unprotect)?;
    keys.gap_windows = 0;
    let plain = keys.open(bytes, pn_offset, largest).map_err(|e| open_error(e, space))?;
    keys.gap_windows = generations::MAX_GAP_WINDOWS;
    Ok((plain, keys))
}

fn open_error(e: OpenError, space: Space) -> DecryptError {
    match e {
        OpenError::Header(e) => DecryptError::Unprotect(e),
        OpenError::Payload(CryptoError::AuthFailed, pn) => DecryptError::AuthFailed { space, pn },
        OpenError::Payload(e, _) => DecryptError::Unprotect(e),
    }
}
