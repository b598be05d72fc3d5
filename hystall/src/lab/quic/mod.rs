//! `hystall lab` (no subcommand): the failure of DESIGN.md §1, in one process on
//! loopback, with quinn.
//!
//! - A QUIC proxy ([`proxy`]) with Hysteria's flow-control windows (8 MiB per
//!   stream, 20 MiB per connection; quinn's own connection window is unlimited by
//!   default) copies each stream into a TCP target like Go's io.Copy and echoes
//!   datagrams (the UDP relay).
//! - Targets of one behaviour ([`super::targets`]: fast, slow, upclose, stall) and
//!   an echo service ([`echo`]) that probes go to.
//! - A client ([`client`]) with N uploads into the targets, and every
//!   `probe_every` a probe round: a new stream through the proxy to the echo
//!   service, and a datagram.
//!
//! With 4 uploads into stall targets the proxy's writes park, the unread upload
//! bytes fill the 20 MiB connection window, and new streams time out while
//! datagrams still echo, for as long as the lab runs. One upload pins only its
//! own 8 MiB, so probes keep working; so they do with targets that read
//! everything (fast) or close (upclose: the proxy stops the stream, which
//! credits its unread bytes back).
//!
//! Slow targets (16 KiB every 100 ms) are in between, and honestly so: 4 uploads
//! fill the connection window too, and it reopens only as fast as the targets
//! drain, in steps of 1/8 of the window (quinn sends MAX_DATA once that much has
//! been read; quic-go waits for 1/4). New streams then wait seconds for a step,
//! and some probes time out, but the target sockets keep making progress: the
//! sockets are not stalled, and only stall targets may be flagged or touched.
//!
//! The proxy's target sockets are non-blocking tokio sockets owned by this
//! process (as a Go server's are), so `hystall watch --pid` sees what it would
//! see on a real node. [`run_lab`] is the library entry (for `top --lab`); [`run`]
//! is the CLI's.

pub mod churn;
pub mod client;
pub mod clients;
pub mod echo;
pub mod node;
pub mod proxy;
pub mod tls;
pub mod wire;

use std::future::Future;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::targets;
use crate::cli::{Behaviour, LabArgs};
use client::{Client, Probe, Prober, Uploads};
use proxy::{Proxy, ProxyNote};

const MIB: u32 = 1024 * 1024;
/// Hysteria's (and sing-box's) defaults: 8 MiB per stream, 20 MiB per connection.
pub const STREAM_RECEIVE_WINDOW: u32 = 8 * MIB;
pub const CONNECTION_RECEIVE_WINDOW: u32 = 20 * MIB;

/// What the lab runs.
#[derive(Debug, Clone)]
pub struct QuicLabConfig {
    /// Parallel upload streams into targets of `target`'s behaviour.
    pub uploads: usize,
    pub target: Behaviour,
    /// Stop after this long (None: until the stop future, or forever).
    pub duration: Option<Duration>,
    /// The proxy's UDP address (port 0: any).
    pub listen: SocketAddr,
    /// Append the client's TLS secrets here (SSLKEYLOGFILE format).
    pub keylog: Option<PathBuf>,
    pub probe_every: Duration,
    pub probe_timeout: Duration,
    /// Bytes per upload write call.
    pub chunk: usize,
    /// Wait this long after the ready line before the uploads start (so that a
    /// watcher started by the ready line sees the bulk, then its stop).
    pub delay: Duration,
    /// Wait for a line on stdin after the ready line (`--wait-go`).
    pub wait_go: bool,
    /// More clients, each its own QUIC connection with its own work.
    pub clients: Vec<clients::ClientSpec>,
}

impl Default for QuicLabConfig {
    fn default() -> Self {
        Self {
            uploads: 4,
            target: Behaviour::Stall,
            duration: None,
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            keylog: None,
            probe_every: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(2),
            chunk: 64 * 1024,
            delay: Duration::ZERO,
            wait_go: false,
            clients: Vec::new(),
        }
    }
}

/// What the lab reports, in order: one `LabReady`, then `LabTargetConnected` /
/// `LabTargetClosed` for the proxy's target sockets and one `LabProbe` per probe
/// round, and last one `LabDone`. Serialized, each is one JSON object whose
/// `event` is the variant's name in snake_case (`lab_ready`, ...).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum LabEvent {
    LabReady(Ready),
    /// One more client (`--client`), after the ready line.
    LabClient(clients::ClientInfo),
    /// A probe round of one more client: does a new stream through it work?
    LabClientProbe(clients::ClientProbe),
    LabTargetConnected(TargetSocket),
    LabTargetClosed(TargetSocket),
    LabProbe(ProbeRound),
    LabDone(Done),
}

#[derive(Debug, Clone, Serialize)]
pub struct Ready {
    /// This process: it owns the proxy's UDP socket and its target sockets.
    pub pid: u32,
    /// The proxy's UDP address.
    pub server: SocketAddr,
    /// The client's UDP address.
    pub client: SocketAddr,
    /// The upload targets' behaviour and address.
    pub target: Behaviour,
    pub target_addr: SocketAddr,
    /// The echo service that probe streams go to.
    pub echo_addr: SocketAddr,
    pub uploads: usize,
    pub stream_receive_window: u32,
    pub receive_window: u32,
    pub probe_every: f64,
    pub probe_timeout: f64,
}

/// One of the proxy's TCP connections to a target (or to the echo service).
#[derive(Debug, Clone, Serialize)]
pub struct TargetSocket {
    /// Seconds since `lab_ready`.
    pub t: f64,
    /// The QUIC stream id it serves.
    pub stream: u64,
    /// "fast", "slow", "upclose", "stall" or "echo".
    pub target: &'static str,
    /// The proxy's end and the target's.
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// On close: why, when a copy failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProbeRound {
    /// Seconds since `lab_ready`, when the round started.
    pub t: f64,
    pub stream_ok: bool,
    /// How long the stream probe took (or waited, when it failed).
    pub stream_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_error: Option<String>,
    pub datagram_ok: bool,
    pub datagram_ms: u64,
    /// Payload bytes each upload has written so far.
    pub uploaded: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Done {
    pub t: f64,
    /// "duration", "signal", or what the caller's stop future said.
    pub reason: &'static str,
    pub uploaded: Vec<u64>,
    /// Upload streams that ended and were started again (upclose targets do that).
    pub upload_restarts: u64,
    pub probes: u64,
    pub stream_ok: u64,
    pub datagram_ok: u64,
}

/// `hystall lab`: runs the lab on a runtime of its own until `--duration` or
/// SIGINT/SIGTERM, printing lines of text or JSON.
pub fn run(args: LabArgs) -> anyhow::Result<()> {
    let cfg = config_from_args(&args)?;
    if tokio::runtime::Handle::try_current().is_ok() {
        bail!("the QUIC lab starts its own runtime: call it outside an async context");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    let json = args.json;
    let result = rt.block_on(async {
        // Installed before anything is announced, so an early SIGTERM is not fatal.
        let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let stop = async move {
            tokio::select! {
                _ = sigint.recv() => "signal",
                _ = sigterm.recv() => "signal",
            }
        };
        let mut out = io::stdout();
        let mut broken = false;
        let mut render = Render::new(json);
        run_lab_until(cfg, stop, |ev| {
            if let Some(line) = render.line(&ev) {
                // Best effort: a reader that went away must not stop the lab midway.
                if !broken && writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                    broken = true;
                }
            }
        })
        .await
    });
    rt.shutdown_background();
    result
}

fn config_from_args(args: &LabArgs) -> anyhow::Result<QuicLabConfig> {
    let secs = |v: f64, what: &str| {
        Duration::try_from_secs_f64(v)
            .with_context(|| format!("{what} must be a finite, non-negative number of seconds"))
    };
    Ok(QuicLabConfig {
        uploads: args.uploads,
        target: args.target,
        duration: args.duration.map(|d| secs(d, "--duration")).transpose()?,
        listen: args.listen,
        keylog: args.keylog.clone(),
        probe_every: secs(args.probe_every, "--probe-every")?,
        probe_timeout: secs(args.probe_timeout, "--probe-timeout")?,
        delay: secs(args.delay, "--delay")?,
        wait_go: args.wait_go,
        clients: args.clients.clone(),
        ..QuicLabConfig::default()
    })
}

/// Runs the lab on the current runtime until `cfg.duration` elapses (forever
/// without one), handing every event to `events`.
pub async fn run_lab(cfg: QuicLabConfig, events: impl FnMut(LabEvent)) -> anyhow::Result<()> {
    run_lab_until(cfg, std::future::pending(), events).await
}

/// [`run_lab`] that also stops when `stop` completes; its output is the reason
/// given in `lab_done`. Everything the lab started (sockets, tasks) is closed
/// when this returns.
pub async fn run_lab_until(
    cfg: QuicLabConfig,
    stop: impl Future<Output = &'static str>,
    mut events: impl FnMut(LabEvent),
) -> anyhow::Result<()> {
    if cfg.probe_every.is_zero() {
        bail!("the probe interval must be more than zero");
    }
    if cfg.probe_timeout.is_zero() {
        bail!("the probe timeout must be more than zero");
    }
    let keylog = cfg.keylog.as_deref().map(tls::KeyLogFile::open).transpose()?.map(Arc::new);
    let identity = tls::Identity::generate()?;

    let target = targets::spawn_target(cfg.target).await.context("starting the target")?;
    let echo = echo::Echo::spawn().await.context("starting the echo service")?;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let proxy = Proxy::start(cfg.listen, identity.server_crypto()?, transport(false), notes_tx)?;
    let client = Client::connect(connect_addr(proxy.addr()), identity.client_crypto(keylog)?, transport(true)).await?;

    let start = Instant::now();
    let since = move || round_ms(start.elapsed());
    events(LabEvent::LabReady(Ready {
        pid: std::process::id(),
        server: proxy.addr(),
        client: client.local_addr()?,
        target: cfg.target,
        target_addr: target.addr(),
        echo_addr: echo.addr(),
        uploads: cfg.uploads,
        stream_receive_window: STREAM_RECEIVE_WINDOW,
        receive_window: CONNECTION_RECEIVE_WINDOW,
        probe_every: cfg.probe_every.as_secs_f64(),
        probe_timeout: cfg.probe_timeout.as_secs_f64(),
    }));

    if cfg.wait_go {
        // The monitor's word that its probes are attached (end of input: it
        // is gone, and so will we be: its death signal).
        tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
            .await
            .context("waiting for the go line")?
            .context("reading the go line")?;
    }
    let (client_probes_tx, mut client_probes) = mpsc::unbounded_channel();
    let shared = clients::Shared {
        server: connect_addr(proxy.addr()),
        echo: echo.addr(),
        chunk: cfg.chunk,
        probe_every: cfg.probe_every,
        probe_timeout: cfg.probe_timeout,
        uploads_at: cfg.delay,
        probes: client_probes_tx,
    };
    let mut extra = Vec::new();
    for (i, spec) in cfg.clients.iter().enumerate() {
        let c = clients::start(i + 1, spec, &shared, identity.client_crypto(None)?, transport(true), since)
            .await
            .with_context(|| format!("starting lab client {}", i + 1))?;
        events(LabEvent::LabClient(c.info.clone()));
        extra.push(c);
    }
    let names: Vec<(SocketAddr, &'static str)> =
        extra.iter().filter_map(|c| c.info.target_addr.map(|a| (a, c.info.behaviour))).collect();

    if !cfg.delay.is_zero() {
        tokio::time::sleep(cfg.delay).await;
    }
    let uploads = Arc::new(Uploads::start(client.connection(), target.addr(), cfg.uploads, cfg.chunk));
    let (probes_tx, mut probes) = mpsc::unbounded_channel();
    let prober = tokio::spawn(probe_loop(
        Prober::new(client.connection().clone(), echo.addr(), cfg.probe_timeout),
        cfg.probe_every,
        start,
        uploads.clone(),
        probes_tx,
    ));
    let abort_prober = AbortOnDrop(prober);

    let target_name = targets::behaviour_name(cfg.target);
    let name_of = |remote: SocketAddr| {
        if remote == echo.addr() {
            return "echo";
        }
        names.iter().find(|(a, _)| *a == remote).map_or(target_name, |(_, n)| n)
    };
    let (mut rounds, mut stream_ok, mut datagram_ok) = (0u64, 0u64, 0u64);
    let deadline = async {
        match cfg.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline, stop);
    let reason = loop {
        tokio::select! {
            () = &mut deadline => break "duration",
            reason = &mut stop => break reason,
            Some(note) = notes.recv() => events(match note {
                ProxyNote::Connected { stream, local, remote } => LabEvent::LabTargetConnected(TargetSocket {
                    t: since(), stream, target: name_of(remote), local, remote, error: None,
                }),
                ProxyNote::Closed { stream, local, remote, error } => LabEvent::LabTargetClosed(TargetSocket {
                    t: since(), stream, target: name_of(remote), local, remote, error,
                }),
            }),
            Some(p) = client_probes.recv() => events(LabEvent::LabClientProbe(p)),
            Some(round) = probes.recv() => {
                let round: ProbeRound = round;
                rounds += 1;
                stream_ok += u64::from(round.stream_ok);
                datagram_ok += u64::from(round.datagram_ok);
                events(LabEvent::LabProbe(round));
            }
        }
    };
    events(LabEvent::LabDone(Done {
        t: since(),
        reason,
        uploaded: uploads.uploaded(),
        upload_restarts: uploads.restarts(),
        probes: rounds,
        stream_ok,
        datagram_ok,
    }));
    drop((abort_prober, uploads)); // stops probing and writing
    for c in extra {
        c.close().await;
    }
    client.close().await;
    drop(proxy);
    drop((target, echo));
    Ok(())
}

async fn probe_loop(
    mut prober: Prober,
    every: Duration,
    start: Instant,
    uploads: Arc<Uploads>,
    out: mpsc::UnboundedSender<ProbeRound>,
) {
    let mut tick = tokio::time::interval(every);
    // A round that outlasts the interval (a probe waiting for its timeout) delays
    // the next one instead of bunching rounds up.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate: give the uploads a head start
    loop {
        tick.tick().await;
        let t = round_ms(start.elapsed());
        let (stream, datagram) = prober.round().await;
        if out.send(probe_round(t, &stream, &datagram, uploads.uploaded())).is_err() {
            return;
        }
    }
}

fn probe_round(t: f64, stream: &Probe, datagram: &Probe, uploaded: Vec<u64>) -> ProbeRound {
    ProbeRound {
        t,
        stream_ok: stream.ok,
        stream_ms: millis(stream.elapsed),
        stream_error: stream.error.clone(),
        datagram_ok: datagram.ok,
        datagram_ms: millis(datagram.elapsed),
        uploaded,
    }
}

/// Aborts a task when dropped (so an early return or error ends it too).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Hysteria's windows, both ways (the client's matter only for downloads). The
/// rest is as Hysteria sets it: 30 s idle timeout, 10 s keep-alive from the client.
pub(crate) fn transport(client: bool) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window(STREAM_RECEIVE_WINDOW.into());
    t.receive_window(CONNECTION_RECEIVE_WINDOW.into());
    t.max_concurrent_bidi_streams(1024u32.into());
    t.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(30_000))));
    if client {
        t.keep_alive_interval(Some(Duration::from_secs(10)));
    }
    t
}

/// Where the client connects: the proxy's address, with loopback for a wildcard.
pub(crate) fn connect_addr(server: SocketAddr) -> SocketAddr {
    let ip = match server.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, server.port())
}

fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The CLI's output: every event as JSON, or as text.
struct Render {
    json: bool,
    /// Text only: the streams whose target sockets are shown. Only the first
    /// uploads' are (upclose targets make new ones many times a second).
    shown: std::collections::HashSet<u64>,
    show_at_most: usize,
}

impl Render {
    fn new(json: bool) -> Self {
        Self { json, shown: Default::default(), show_at_most: 0 }
    }

    /// One output line for `ev`, or None for what is left out: the echo
    /// service's connections (one per probe) and, as text, the target sockets of
    /// restarted uploads.
    fn line(&mut self, ev: &LabEvent) -> Option<String> {
        match ev {
            LabEvent::LabTargetConnected(s) | LabEvent::LabTargetClosed(s) if s.target == "echo" => return None,
            LabEvent::LabReady(r) => self.show_at_most = r.uploads,
            LabEvent::LabTargetConnected(s) if !self.json => {
                if self.shown.len() >= self.show_at_most {
                    return None;
                }
                self.shown.insert(s.stream);
            }
            LabEvent::LabTargetClosed(s) if !self.json && !self.shown.contains(&s.stream) => return None,
            _ => {}
        }
        Some(if self.json { serde_json::to_string(ev).expect("lab events serialize") } else { text(ev) })
    }
}

fn text(ev: &LabEvent) -> String {
    match ev {
        LabEvent::LabReady(r) => format!(
            "QUIC lab (pid {}): proxy on udp {} (stream window {} MiB, connection window {} MiB), client {}\n\
             {} upload(s) into the {} target at {}; a new stream to the echo service at {} and a datagram \
             every {} s (timeout {} s)",
            r.pid,
            r.server,
            r.stream_receive_window / MIB,
            r.receive_window / MIB,
            r.client,
            r.uploads,
            targets::behaviour_name(r.target),
            r.target_addr,
            r.echo_addr,
            r.probe_every,
            r.probe_timeout,
        ),
        LabEvent::LabTargetConnected(s) => {
            format!("{:7.1}s  stream {} -> {} target: {} -> {}", s.t, s.stream, s.target, s.local, s.remote)
        }
        LabEvent::LabTargetClosed(s) => format!(
            "{:7.1}s  stream {} -> {} target closed ({} -> {}){}",
            s.t,
            s.stream,
            s.target,
            s.local,
            s.remote,
            s.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
        ),
        LabEvent::LabClient(c) => format!(
            "client {}: {} on UDP {}, {} upload(s) into the {} target {} from +{:.1}s",
            c.index,
            c.behaviour,
            c.client,
            c.uploads,
            c.behaviour,
            c.target_addr.map_or_else(|| "-".into(), |a| a.to_string()),
            c.after
        ),
        LabEvent::LabClientProbe(p) => format!(
            "{:7.1}s  client {}: new stream {}  datagram {}",
            p.t,
            p.index,
            if p.stream_ok { "ok" } else { "FAILED" },
            if p.datagram_ok { "ok" } else { "FAILED" }
        ),
        LabEvent::LabProbe(p) => {
            let stream = if p.stream_ok {
                format!("ok {:>4} ms", p.stream_ms)
            } else {
                format!("FAILED ({})", p.stream_error.as_deref().unwrap_or("?"))
            };
            let datagram = if p.datagram_ok { format!("ok {:>4} ms", p.datagram_ms) } else { "FAILED".to_owned() };
            let uploaded: Vec<String> = p.uploaded.iter().map(|&b| mib(b)).collect();
            format!("{:7.1}s  new stream {stream}  datagram {datagram}  uploaded {}", p.t, uploaded.join(" "))
        }
        LabEvent::LabDone(d) => format!(
            "{:7.1}s  done ({}): {} probe rounds, new stream ok in {}, datagram ok in {}; uploaded {}{}",
            d.t,
            d.reason,
            d.probes,
            d.stream_ok,
            d.datagram_ok,
            d.uploaded.iter().map(|&b| mib(b)).collect::<Vec<_>>().join(" "),
            if d.upload_restarts > 0 { format!(" ({} upload restarts)", d.upload_restarts) } else { String::new() },
        ),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}M", bytes as f64 / f64::from(MIB))
}

#[cfg(test)]
mod tests;
