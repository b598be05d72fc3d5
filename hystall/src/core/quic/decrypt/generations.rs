//! One direction's keys for the Handshake or the 1-RTT space, with key
//! updates (RFC 9001 §6): the key phase bit flips when the sender moves to
//! the next generation (secret_{n+1} = HKDF-Expand-Label(secret_n, "quic ku")),
//! the header-protection key stays the first generation's. The previous
//! generation is kept so that packets reordered across an update still open.

use super::super::Version;
use super::super::crypto::{CryptoError, HeaderKey, PacketKeys, PayloadKey, Secret, Suite, next_secret};
use super::super::crypto::{Unprotected, remove_header_protection};

/// Packet-number windows tried past the reconstructed number when a packet
/// does not open (a capture that dropped packets): 64 windows of a 1-byte
/// number are 16k packets.
pub(super) const MAX_GAP_WINDOWS: u64 = 64;

struct Generation {
    secret: Secret,
    key: PayloadKey,
    /// The key phase bit packets of this generation carry.
    phase: bool,
    /// Lowest packet number opened with it (`None` for the first generation,
    /// which has nothing before it).
    first_pn: Option<u64>,
}

impl Generation {
    fn next(&self, version: Version, suite: Suite) -> Result<Self, CryptoError> {
        let secret = next_secret(version, suite, &self.secret)?;
        let key = PayloadKey::from_secret(version, suite, &secret)?;
        Ok(Self { secret, key, phase: !self.phase, first_pn: None })
    }
}

/// A packet whose protection is gone.
pub(super) struct Plain {
    pub(super) header: Unprotected,
    pub(super) payload: Vec<u8>,
}

/// Why [`SpaceKeys::open`] failed: before or after the packet number was known.
pub(super) enum OpenError {
    /// The header could not be unprotected.
    Header(CryptoError),
    /// The AEAD refused it; the packet number is what the header said.
    Payload(CryptoError, u64),
}

/// Keys of one direction in one packet-number space.
pub(super) struct SpaceKeys {
    version: Version,
    suite: Suite,
    header: HeaderKey,
    current: Generation,
    previous: Option<Generation>,
    next: Option<Generation>,
    /// Key updates followed.
    pub(super) updates: u32,
    /// Packet-number windows searched past a gap (0 while the keys are a guess).
    pub(super) gap_windows: u64,
}

impl SpaceKeys {
    pub(super) fn new(version: Version, suite: Suite, secret: &Secret) -> Result<Self, CryptoError> {
        let keys = PacketKeys::from_secret(version, suite, secret)?;
        Ok(Self {
            version,
            suite,
            header: keys.header,
            current: Generation { secret: *secret, key: keys.payload, phase: false, first_pn: None },
            previous: None,
            next: None,
            updates: 0,
            gap_windows: MAX_GAP_WINDOWS,
        })
    }

    /// Opens a packet (`packet` is untouched): header protection off, then
    /// the generation its key phase bit and packet number point at.
    pub(super) fn open(&mut self, packet: &[u8], pn_offset: usize, largest: Option<u64>) -> Result<Plain, OpenError> {
        let mut clear_header = packet.to_vec();
        let header =
            remove_header_protection(&self.header, &mut clear_header, pn_offset, largest).map_err(OpenError::Header)?;
        let phase = header.key_phase.unwrap_or(false);
        let attempt_pn = |key: &PayloadKey, pn: u64| {
            let mut buf = clear_header.clone();
            let len = key.open(pn, &mut buf, header.header_len)?.len();
            buf.drain(..header.header_len);
            buf.truncate(len);
            Ok::<_, CryptoError>(Plain { header: Unprotected { pn, ..header }, payload: buf })
        };
        // The packet number is reconstructed from the largest one seen; after a
        // gap of more than half its window (packets the capture dropped) that
        // guess is a window short. The truncated bits are right: try the next
        // windows before calling the packet undecryptable, or every later
        // packet would fail too.
        let gap_windows = self.gap_windows;
        let attempt = |key: &PayloadKey| {
            attempt_pn(key, header.pn).or_else(|e| {
                let window = 1u64 << (8 * header.pn_len.clamp(1, 4));
                (1..=gap_windows)
                    .filter_map(|k| header.pn.checked_add(k * window))
                    .find_map(|pn| attempt_pn(key, pn).ok())
                    .ok_or(e)
            })
        };
        if phase == self.current.phase {
            let plain = attempt(&self.current.key).map_err(|e| OpenError::Payload(e, header.pn))?;
            if self.current.first_pn.is_some_and(|f| header.pn < f) {
                self.current.first_pn = Some(header.pn);
            }
            return Ok(plain);
        }
        // The other phase: an older packet of the previous generation, or the
        // first of the next one.
        let older = self.current.first_pn.is_some_and(|f| header.pn < f);
        if older && let Some(prev) = &self.previous {
            return attempt(&prev.key).map_err(|e| OpenError::Payload(e, header.pn));
        }
        if self.next.is_none() {
            self.next = Some(self.current.next(self.version, self.suite).map_err(OpenError::Header)?);
        }
        let next_result = self.next.as_ref().map(|n| attempt(&n.key));
        match next_result {
            Some(Ok(plain)) => {
                if let Some(mut next) = self.next.take() {
                    next.first_pn = Some(header.pn);
                    self.previous = Some(std::mem::replace(&mut self.current, next));
                    self.updates += 1;
                }
                Ok(plain)
            }
            _ => match &self.previous {
                Some(prev) => attempt(&prev.key).map_err(|e| OpenError::Payload(e, header.pn)),
                None => Err(OpenError::Payload(CryptoError::AuthFailed, header.pn)),
            },
        }
    }
}
