//! Just enough TLS to find a connection's key-log entry and cipher suite: the
//! Initial space's CRYPTO stream reassembled, then the ClientHello's random
//! (the key-log key) and the ServerHello's cipher_suite (RFC 8446 §4.1.2-3).

/// Bytes of CRYPTO stream kept per direction: a ClientHello with a large
/// post-quantum key share is ~1.5 KiB, certificates never go here (they are
/// in the Handshake space); anything past this is ignored.
const MAX_STREAM: usize = 16 * 1024;
/// Out-of-order CRYPTO frames held while waiting for the gap to fill.
const MAX_PENDING: usize = 64;

const CLIENT_HELLO: u8 = 1;
const SERVER_HELLO: u8 = 2;
/// Handshake header (type, 24-bit length) and legacy_version before the random.
const RANDOM_AT: usize = 6;
const RANDOM_LEN: usize = 32;

/// The in-order prefix of one direction's Initial CRYPTO stream.
#[derive(Debug, Default)]
pub(super) struct CryptoStream {
    contiguous: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
}

impl CryptoStream {
    /// Adds one CRYPTO frame's data (retransmissions and overlaps welcome).
    pub(super) fn insert(&mut self, offset: u64, data: &[u8]) {
        if !self.append(offset, data) && self.pending.len() < MAX_PENDING && offset < MAX_STREAM as u64 {
            self.pending.push((offset, data.to_vec()));
        }
        while let Some(i) = self.pending.iter().position(|(o, _)| *o <= self.contiguous.len() as u64) {
            let (o, d) = self.pending.swap_remove(i);
            self.append(o, &d);
        }
    }

    /// Appends what `data` adds past the contiguous prefix; false if it
    /// starts beyond it (a gap).
    fn append(&mut self, offset: u64, data: &[u8]) -> bool {
        let have = self.contiguous.len();
        let Ok(offset) = usize::try_from(offset) else { return false };
        if offset > have {
            return false;
        }
        let room = MAX_STREAM.saturating_sub(have);
        let new = data.get(have - offset..).unwrap_or_default();
        self.contiguous.extend_from_slice(new.get(..new.len().min(room)).unwrap_or_default());
        true
    }

    fn message(&self, msg_type: u8) -> Option<&[u8]> {
        (self.contiguous.first() == Some(&msg_type)).then_some(self.contiguous.as_slice())
    }

    /// The ClientHello random, once its first 38 bytes are in.
    pub(super) fn client_random(&self) -> Option<[u8; RANDOM_LEN]> {
        let hello = self.message(CLIENT_HELLO)?;
        hello.get(RANDOM_AT..RANDOM_AT + RANDOM_LEN)?.try_into().ok()
    }

    /// The ServerHello's cipher_suite, after the random and the
    /// legacy_session_id_echo.
    pub(super) fn server_cipher_suite(&self) -> Option<u16> {
        let hello = self.message(SERVER_HELLO)?;
        let sid_len_at = RANDOM_AT + RANDOM_LEN;
        let sid_len = usize::from(*hello.get(sid_len_at)?);
        let at = sid_len_at + 1 + sid_len;
        Some(u16::from_be_bytes(hello.get(at..at + 2)?.try_into().ok()?))
    }
}
