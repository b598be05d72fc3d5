//! shoes (crates.io `shoes`, Rust): a second Hysteria2 server implementation,
//! on quinn instead of quic-go, run in place of sing-box's server by
//! `singbox::Options::shoes` (the clients stay sing-box).
//!
//! Building it takes about 20 minutes on two cores (`cargo install shoes --locked
//! --root DIR`), too long for every test run: the tests use a binary named by
//! `HYSTALL_SHOES`, or `shoes` on PATH, and skip without one.
//!
//! Its QUIC windows (shoes 0.3.2, `global_limits`, src/config/types/global.rs) are
//! quinn's receive windows: 2 MiB per connection (`quic_receive_window`) and
//! 256 KiB per stream (`quic_stream_window`), which the server config leaves at
//! their defaults.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, bail};
use serde_json::json;

use super::singbox::{Options, PASSWORD, Protocol, is_executable, loopback};

/// Environment variable naming the shoes binary.
pub const SHOES_ENV: &str = "HYSTALL_SHOES";
/// shoes' default windows, in MiB as `watch --stream-window/--conn-window` take them.
pub const STREAM_WINDOW_MIB: &str = "0.25";
pub const CONN_WINDOW_MIB: &str = "2";

/// The shoes binary: `$HYSTALL_SHOES`, else `shoes` on PATH. A `HYSTALL_SHOES`
/// that names no executable file is a mistake worth a failure, not a skip.
pub fn shoes_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(SHOES_ENV).filter(|p| !p.is_empty()).map(PathBuf::from) {
        assert!(is_executable(&p), "{SHOES_ENV}={} is not an executable file", p.display());
        return Some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("shoes")).find(|p| is_executable(p))
}

/// The shoes binary, or None after printing the test's one skip line.
pub fn shoes_or_skip(test: &str) -> Option<PathBuf> {
    let found = shoes_bin();
    if found.is_none() {
        eprintln!(
            "{test}: skipped: no shoes binary (set {SHOES_ENV}; build it with cargo install shoes --locked --root DIR)"
        );
    }
    found
}

/// Writes `server.yaml` (JSON is YAML) for a Hysteria2 server on the lab's
/// loopback port with the lab's certificate and password (UDP relaying on, as
/// sing-box's), checks it with `shoes --dry-run`, and runs it with its output in
/// `server.log`. Config reloading is off: the folder is the test's.
pub fn run_server(bin: &Path, opts: &Options, dir: &Path, port: u16, key: &Path, cert: &Path) -> anyhow::Result<Child> {
    if opts.protocol != Protocol::Hysteria2
        || opts.obfs.is_some()
        || opts.server_ports.is_some()
        || opts.stream_receive_window.is_some()
        || opts.connection_receive_window.is_some()
        || opts.clash_api
    {
        bail!("the shoes server of the lab is plain Hysteria2 with its default windows: {opts:?}");
    }
    let address =
        if opts.ipv6 { format!("[{}]:{port}", loopback(true)) } else { format!("{}:{port}", loopback(false)) };
    let config = json!([{
        "address": address,
        "transport": "quic",
        "quic_settings": { "cert": cert, "key": key, "alpn_protocols": ["h3"] },
        "protocol": { "type": "hysteria2", "password": PASSWORD, "udp_enabled": true },
    }]);
    let path = dir.join("server.yaml");
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    let check = Command::new(bin).arg("--dry-run").arg(&path).output()?;
    if !check.status.success() {
        bail!(
            "shoes --dry-run rejects {}: {}{}",
            path.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let log = File::create(dir.join("server.log"))?;
    Command::new(bin)
        .arg("--no-reload")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))
}
