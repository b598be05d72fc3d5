//! TLS for the QUIC lab: a fresh self-signed certificate per run (rcgen), rustls
//! with the ring provider, TLS 1.3 only, ALPN "h3" as Hysteria2 uses, and an
//! optional key log in SSLKEYLOGFILE format so a capture of the lab can be decrypted.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The name in the certificate, and the one the client asks for.
pub const SERVER_NAME: &str = "localhost";
/// What Hysteria2 negotiates.
pub const ALPN: &[u8] = b"h3";

/// A self-signed certificate and its key, made at start-up.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl Identity {
    pub fn generate() -> anyhow::Result<Self> {
        let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])
            .context("generating a self-signed certificate")?;
        Ok(Self {
            cert: certified.cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()),
        })
    }

    pub fn server_crypto(&self) -> anyhow::Result<QuicServerConfig> {
        let mut tls = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .context("TLS 1.3 with the ring provider")?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], PrivateKeyDer::Pkcs8(self.key.clone_key()))
            .context("loading the lab certificate")?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        QuicServerConfig::try_from(tls).context("making the server's TLS config fit for QUIC")
    }

    /// A client that trusts exactly this certificate; its secrets go to `keylog`.
    pub fn client_crypto(&self, keylog: Option<Arc<KeyLogFile>>) -> anyhow::Result<QuicClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.clone()).context("trusting the lab certificate")?;
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .context("TLS 1.3 with the ring provider")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        if let Some(keylog) = keylog {
            tls.key_log = keylog;
        }
        QuicClientConfig::try_from(tls).context("making the client's TLS config fit for QUIC")
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Writes TLS secrets to a given file in the NSS key log format (what
/// SSLKEYLOGFILE produces): `LABEL <client_random hex> <secret hex>`, one a line,
/// flushed as it goes so the file is usable while the lab runs. Unlike rustls'
/// own `KeyLogFile`, the path comes from the caller, not from the environment.
pub struct KeyLogFile {
    path: PathBuf,
    file: Mutex<File>,
}

impl KeyLogFile {
    /// Opens `path` for appending (creating it), as SSLKEYLOGFILE users expect.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening the key log {}", path.display()))?;
        Ok(Self { path: path.to_owned(), file: Mutex::new(file) })
    }
}

impl fmt::Debug for KeyLogFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLogFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl rustls::KeyLog for KeyLogFile {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        let line = key_log_line(label, client_random, secret);
        let mut file = self.file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // One write per line (O_APPEND keeps lines whole); a failure costs only the
        // ability to decrypt later, so it is logged, not fatal.
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
            tracing::warn!("writing the key log {}: {e}", self.path.display());
        }
    }
}

fn key_log_line(label: &str, client_random: &[u8], secret: &[u8]) -> String {
    format!("{label} {} {}\n", hex(client_random), hex(secret))
}

fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::KeyLog;

    #[test]
    fn key_log_lines_are_nss_format() {
        assert_eq!(
            key_log_line("CLIENT_TRAFFIC_SECRET_0", &[0x00, 0xab], &[0x01, 0xff, 0x10]),
            "CLIENT_TRAFFIC_SECRET_0 00ab 01ff10\n"
        );
    }

    #[test]
    fn key_log_file_appends() {
        let path = std::env::temp_dir().join(format!("hystall-keylog-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let log = KeyLogFile::open(&path).unwrap();
        log.log("A", &[1], &[2]);
        log.log("B", &[3], &[4]);
        drop(log);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "A 01 02\nB 03 04\n");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn configs_build() {
        let id = Identity::generate().unwrap();
        id.server_crypto().unwrap();
        id.client_crypto(None).unwrap();
    }
}
