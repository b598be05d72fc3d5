//! The key schedule: HKDF-Expand-Label (RFC 8446 §7.1) with QUIC's labels,
//! Initial secrets (RFC 9001 §5.2), packet keys (§5.1) and key updates (§6).
//!
//! v2 (RFC 9369 §3.3) changes the Initial salt and the labels ("quicv2 key"
//! instead of "quic key"...) so that v1 middleboxes cannot read v2 Initials;
//! draft-29 shares v1's labels with its own salt.

use std::fmt;

use ring::hkdf;

use super::error::CryptoError;
use super::suite::Suite;
use crate::core::quic::Version;

/// Longest secret: SHA-384's output.
const MAX_SECRET_LEN: usize = 48;

/// A TLS traffic secret (32 bytes for SHA-256 suites, 48 for SHA-384).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Secret {
    len: u8,
    /// Bytes past `len` are zero, so the derived `Eq`/`Hash` are right.
    bytes: [u8; MAX_SECRET_LEN],
}

impl Secret {
    /// A secret from its bytes; `None` unless 32 or 48 bytes long.
    pub fn new(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 32 && bytes.len() != MAX_SECRET_LEN {
            return None;
        }
        let mut out = [0; MAX_SECRET_LEN];
        out.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Self { len: u8::try_from(bytes.len()).ok()?, bytes: out })
    }

    /// The secret's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or_default()
    }

    /// Its length: the hash length of the suite it belongs to.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Never true (a secret is 32 or 48 bytes); here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for Secret {
    /// Secrets stay out of logs: only the length shows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.len)
    }
}

/// Output length for ring's HKDF-Expand.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label(secret, label, context, out.len()) with the suite's
/// hash; `label` without the "tls13 " prefix, which is added here.
pub fn hkdf_expand_label(
    suite: Suite,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    out: &mut [u8],
) -> Result<(), CryptoError> {
    if secret.len() != suite.hash_len() {
        return Err(CryptoError::SecretLength { len: secret.len(), need: suite.hash_len() });
    }
    let prk = hkdf::Prk::new_less_safe(suite.hkdf(), secret);
    expand_label(&prk, label, context, out)
}

fn expand_label(prk: &hkdf::Prk, label: &[u8], context: &[u8], out: &mut [u8]) -> Result<(), CryptoError> {
    let length = u16::try_from(out.len()).map_err(|_| CryptoError::Library)?.to_be_bytes();
    let label_len = [u8::try_from(label.len() + 6).map_err(|_| CryptoError::Library)?];
    let context_len = [u8::try_from(context.len()).map_err(|_| CryptoError::Library)?];
    let info: [&[u8]; 6] = [&length, &label_len, b"tls13 ", label, &context_len, context];
    let okm = prk.expand(&info, Len(out.len())).map_err(|_| CryptoError::Library)?;
    okm.fill(out).map_err(|_| CryptoError::Library)
}

/// The labels a version uses for packet keys.
struct Labels {
    key: &'static [u8],
    iv: &'static [u8],
    hp: &'static [u8],
    ku: &'static [u8],
}

fn labels(version: Version) -> Labels {
    match version {
        Version::V1 | Version::Draft29 => Labels { key: b"quic key", iv: b"quic iv", hp: b"quic hp", ku: b"quic ku" },
        Version::V2 => Labels { key: b"quicv2 key", iv: b"quicv2 iv", hp: b"quicv2 hp", ku: b"quicv2 ku" },
    }
}

fn initial_salt(version: Version) -> &'static [u8; 20] {
    match version {
        Version::V1 => &[
            0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb,
            0x7f, 0x0a,
        ],
        Version::V2 => &[
            0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93, 0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd,
            0x2e, 0xd9,
        ],
        Version::Draft29 => &[
            0xaf, 0xbf, 0xec, 0x28, 0x99, 0x93, 0xd2, 0x4c, 0x9e, 0x97, 0x86, 0xf1, 0x9c, 0x61, 0x11, 0xe0, 0x43, 0x90,
            0xa8, 0x99,
        ],
    }
}

/// Both endpoints' Initial secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InitialSecrets {
    /// Protects client→server Initial packets.
    pub client: Secret,
    /// Protects server→client Initial packets.
    pub server: Secret,
}

/// The Initial secrets for a connection whose client chose `dcid` as its
/// first Destination Connection ID (after a Retry: the Retry's SCID).
pub fn initial_secrets(version: Version, dcid: &[u8]) -> Result<InitialSecrets, CryptoError> {
    let initial = hkdf::Salt::new(hkdf::HKDF_SHA256, initial_salt(version)).extract(dcid);
    let mut client = [0; 32];
    let mut server = [0; 32];
    expand_label(&initial, b"client in", b"", &mut client)?;
    expand_label(&initial, b"server in", b"", &mut server)?;
    let secret = |bytes: &[u8]| Secret::new(bytes).ok_or(CryptoError::Library);
    Ok(InitialSecrets { client: secret(&client)?, server: secret(&server)? })
}

/// Raw packet-protection keys derived from a secret, for tests and display;
/// [`super::PacketKeys`] holds the same material ready for use.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyMaterial {
    /// AEAD key (16 or 32 bytes).
    pub key: Vec<u8>,
    /// AEAD IV, XORed with the packet number to make the nonce.
    pub iv: [u8; 12],
    /// Header-protection key (16 or 32 bytes).
    pub hp: Vec<u8>,
}

impl fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyMaterial(..)")
    }
}

/// The packet key, IV and header-protection key of `secret` (RFC 9001 §5.1).
pub fn key_material(version: Version, suite: Suite, secret: &Secret) -> Result<KeyMaterial, CryptoError> {
    let labels = labels(version);
    let mut key = vec![0; suite.key_len()];
    let mut iv = [0; 12];
    let mut hp = vec![0; suite.key_len()];
    hkdf_expand_label(suite, secret.as_bytes(), labels.key, b"", &mut key)?;
    hkdf_expand_label(suite, secret.as_bytes(), labels.iv, b"", &mut iv)?;
    hkdf_expand_label(suite, secret.as_bytes(), labels.hp, b"", &mut hp)?;
    Ok(KeyMaterial { key, iv, hp })
}

/// The next generation's secret after a key update (RFC 9001 §6.1). The
/// header-protection key does not change with it.
pub fn next_secret(version: Version, suite: Suite, secret: &Secret) -> Result<Secret, CryptoError> {
    let mut next = [0; MAX_SECRET_LEN];
    let out = next.get_mut(..suite.hash_len()).ok_or(CryptoError::Library)?;
    hkdf_expand_label(suite, secret.as_bytes(), labels(version).ku, b"", out)?;
    Secret::new(out).ok_or(CryptoError::Library)
}
