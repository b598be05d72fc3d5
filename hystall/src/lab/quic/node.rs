//! `hystall lab node`: a node's load in one process, for the node-scale
//! benchmark (`benches/node_scale.rs`).
//!
//! - `--conns N` long-lived client connections, each from a UDP socket (a quinn
//!   client endpoint) of its own, so each is its own 5-tuple and its own flow for
//!   the TC classifier (GRO off, so that 10 000 endpoints do not each zero a
//!   3 MiB receive buffer: see `lean_endpoint`). They are opened
//!   `--ramp-parallel` handshakes at a time.
//!   Each sends a datagram every `--every` seconds (echoed by the proxy), the
//!   connections spread evenly over the period; quinn's keep-alive (10 s, as
//!   Hysteria's) runs beneath. A connection that dies is opened again.
//! - `--targets T` long-lived streams over those connections (stream j on
//!   connection j mod N), each copied by the proxy into a target connection that
//!   stays open: alternately a fast target and a slow one (16 KiB per 100 ms).
//!   Each writes `--target-chunk` bytes every `--target-every` seconds, spread
//!   out, so the proxy's target sockets send and are acked steadily.
//! - Once the long-lived ones are up: `--new-per-sec R` short connections per
//!   second, each as `lab churn` makes them (a new UDP socket, a handshake, a
//!   small upload into a new connection to the fast target, a datagram, a clean
//!   close): target sockets and flows that come and go.
//!
//! The proxy and the targets live in this process, as with `hystall lab`, so
//! `watch --pid` sees the QUIC server's port and its target sockets.
//!
//! Prints JSON lines: `lab_ready` (pid, server address) before the first
//! connection, `lab_steady` once the long-lived connections and target streams
//! are up (or the ramp gave up), `lab_stats` every `--stats-every` seconds
//! (cumulative counts and the gauges), and `lab_done` at the end.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use quinn::{AsyncUdpSocket, ClientConfig, Connection, Endpoint, EndpointConfig, Runtime, UdpPoller};
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::{MissedTickBehavior, sleep, timeout};

use super::churn::{self, CONN_TIMEOUT};
use super::proxy::{Proxy, ProxyNote};
use super::{connect_addr, tls, transport, wire};
use crate::cli::{Behaviour, NodeLabArgs};
use crate::lab::targets;

/// What each long-lived connection's datagram carries.
const DATAGRAM: &[u8] = b"hystall lab node keep-busy";
/// Pause before a failed or closed long-lived connection is opened again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The ramp gives up waiting for every connection after this long at least
/// (more for many connections: see `ramp_limit`).
const RAMP_LIMIT_MIN: Duration = Duration::from_secs(60);
/// Short connections in flight: those started in this long at the rate.
const SHORT_IN_FLIGHT: Duration = Duration::from_secs(2);
/// File descriptors kept free for everything else (runtime, stdio, listeners).
const SPARE_FDS: u64 = 1024;

#[derive(Debug, Serialize)]
struct Ready {
    event: &'static str,
    pid: u32,
    /// The proxy's UDP address (the QUIC server port to watch).
    server: SocketAddr,
    fast_target: SocketAddr,
    slow_target: SocketAddr,
    conns: usize,
    new_per_sec: f64,
    targets: usize,
    duration: f64,
    /// The soft RLIMIT_NOFILE this process runs with.
    nofile: u64,
}

#[derive(Debug, Serialize)]
struct Steady {
    event: &'static str,
    /// Seconds since `lab_ready`.
    t: f64,
    /// Whether every long-lived connection and target stream came up.
    complete: bool,
    alive: u64,
    target_streams: u64,
}

/// Counts of the whole run; the gauges go up and down, the rest only up.
#[derive(Debug, Default)]
struct Stats {
    /// Gauge: long-lived connections established now.
    alive: AtomicU64,
    /// Long-lived connections established (again after a drop too).
    opened: AtomicU64,
    /// Long-lived handshakes that failed or timed out.
    connect_failed: AtomicU64,
    /// Established long-lived connections that closed before the end.
    dropped: AtomicU64,
    datagrams_sent: AtomicU64,
    datagrams_echoed: AtomicU64,
    /// Gauge: long-lived target streams answered by the proxy and open now.
    target_streams: AtomicU64,
    /// Long-lived target streams that failed (to open, or later).
    target_failed: AtomicU64,
    target_bytes: AtomicU64,
    /// Gauge: the proxy's target sockets open now (long-lived and short).
    target_sockets: AtomicU64,
    /// Target connections the proxy made.
    target_connects: AtomicU64,
    short_started: AtomicU64,
    /// Short connections not started because too many were still in flight.
    short_skipped: AtomicU64,
    /// Short connections: completed and failed ones, as `lab churn` counts them.
    short: churn::Counts,
}

#[derive(Debug, Serialize)]
struct Snapshot {
    event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    /// Seconds since `lab_ready`.
    t: f64,
    alive: u64,
    opened: u64,
    connect_failed: u64,
    dropped: u64,
    datagrams_sent: u64,
    datagrams_echoed: u64,
    target_streams: u64,
    target_failed: u64,
    target_bytes: u64,
    target_sockets: u64,
    target_connects: u64,
    short_started: u64,
    short_done: u64,
    short_failed: u64,
    short_skipped: u64,
}

impl Stats {
    fn snapshot(&self, event: &'static str, reason: Option<&'static str>, t: f64) -> Snapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            event,
            reason,
            t,
            alive: l(&self.alive),
            opened: l(&self.opened),
            connect_failed: l(&self.connect_failed),
            dropped: l(&self.dropped),
            datagrams_sent: l(&self.datagrams_sent),
            datagrams_echoed: l(&self.datagrams_echoed),
            target_streams: l(&self.target_streams),
            target_failed: l(&self.target_failed),
            target_bytes: l(&self.target_bytes),
            target_sockets: l(&self.target_sockets),
            target_connects: l(&self.target_connects),
            short_started: l(&self.short_started),
            short_done: l(&self.short.connections),
            short_failed: l(&self.short.failed),
            short_skipped: l(&self.short_skipped),
        }
    }
}

/// Holds one unit of a gauge; gives it back when dropped (also when the task
/// holding it is aborted).
struct Held {
    stats: Arc<Stats>,
    gauge: fn(&Stats) -> &AtomicU64,
}

impl Held {
    fn new(stats: &Arc<Stats>, gauge: fn(&Stats) -> &AtomicU64) -> Self {
        gauge(stats).fetch_add(1, Ordering::Relaxed);
        Self { stats: stats.clone(), gauge }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        (self.gauge)(&self.stats).fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every long-lived connection task shares.
struct Plan {
    config: ClientConfig,
    server: SocketAddr,
    /// The lab's start, which the periodic traffic is phased against.
    start: tokio::time::Instant,
    every: Duration,
    target_every: Duration,
    target_chunk: usize,
    /// Handshakes in flight during the ramp (and for reconnections).
    handshakes: Semaphore,
    stats: Arc<Stats>,
}

/// `hystall lab node`: runs on a runtime of its own until `--duration` or a signal.
pub fn run(args: NodeLabArgs) -> anyhow::Result<()> {
    let secs = |v: f64, what: &str| {
        Duration::try_from_secs_f64(v)
            .with_context(|| format!("{what} must be a finite, non-negative number of seconds"))
    };
    let duration = secs(args.duration, "--duration")?;
    let every = secs(args.every, "--every")?;
    let target_every = secs(args.target_every, "--target-every")?;
    let stats_every = secs(args.stats_every, "--stats-every")?;
    if every.is_zero() || target_every.is_zero() || stats_every.is_zero() {
        bail!("--every, --target-every and --stats-every must be more than zero");
    }
    if !(args.new_per_sec.is_finite() && args.new_per_sec >= 0.0) {
        bail!("--new-per-sec must be a finite, non-negative number");
    }
    if args.targets > 0 && args.conns == 0 {
        bail!("--targets needs at least one long-lived connection (--conns)");
    }
    if args.ramp_parallel == 0 {
        bail!("--ramp-parallel must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    let result = rt.block_on(node(args, duration, every, target_every, stats_every));
    rt.shutdown_background();
    result
}

/// Short connections allowed in flight at once: those of 2 s at the rate, at
/// least 16. One takes milliseconds when all is well; when the machine cannot
/// keep up, more in flight would only make every handshake slower (and time
/// out), so the rest are skipped and counted.
fn short_cap(rate: f64) -> usize {
    ((rate * SHORT_IN_FLIGHT.as_secs_f64()).ceil() as usize).max(16)
}

async fn node(
    args: NodeLabArgs,
    duration: Duration,
    every: Duration,
    target_every: Duration,
    stats_every: Duration,
) -> anyhow::Result<()> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    // One UDP socket per long-lived connection, two sockets per target
    // connection (the proxy's and the target's), three per short connection.
    let cap = short_cap(args.new_per_sec);
    let need = args.conns as u64 + 2 * args.targets as u64 + 3 * cap as u64 + SPARE_FDS;
    let nofile = raise_nofile(need);
    if nofile < need {
        eprintln!("lab node: RLIMIT_NOFILE is {nofile}, this load may need {need}: expect failed connections");
    }

    let identity = tls::Identity::generate()?;
    let fast = targets::spawn_target(Behaviour::Fast).await.context("starting the fast target")?;
    let slow = targets::spawn_target(Behaviour::Slow).await.context("starting the slow target")?;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let proxy = Proxy::start(args.listen, identity.server_crypto()?, transport(false), notes_tx)?;
    let stats = Arc::new(Stats::default());
    let counter = stats.clone();
    tokio::spawn(async move {
        while let Some(note) = notes.recv().await {
            match note {
                ProxyNote::Connected { .. } => {
                    counter.target_connects.fetch_add(1, Ordering::Relaxed);
                    counter.target_sockets.fetch_add(1, Ordering::Relaxed);
                }
                ProxyNote::Closed { .. } => {
                    counter.target_sockets.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    });

    let mut config = ClientConfig::new(Arc::new(identity.client_crypto(None)?));
    config.transport_config(Arc::new(transport(true)));
    let server = connect_addr(proxy.addr());
    let ready = Ready {
        event: "lab_ready",
        pid: std::process::id(),
        server: proxy.addr(),
        fast_target: fast.addr(),
        slow_target: slow.addr(),
        conns: args.conns,
        new_per_sec: args.new_per_sec,
        targets: args.targets,
        duration: duration.as_secs_f64(),
        nofile,
    };
    churn::print_line(&serde_json::to_string(&ready).context("encoding the ready line")?)?;

    let start = Instant::now();
    let since = move || (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    let plan = Arc::new(Plan {
        config: config.clone(),
        server,
        start: tokio::time::Instant::from_std(start),
        every,
        target_every,
        target_chunk: args.target_chunk,
        handshakes: Semaphore::new(args.ramp_parallel),
        stats: stats.clone(),
    });
    let mut long = JoinSet::new();
    for i in 0..args.conns {
        // Stream j on connection j mod N, alternately into the fast and the slow target.
        let hosted: Vec<(usize, SocketAddr)> = (i..args.targets)
            .step_by(args.conns.max(1))
            .map(|j| (j, if j % 2 == 0 { fast.addr() } else { slow.addr() }))
            .collect();
        long.spawn(long_lived(plan.clone(), i, args.conns, hosted, args.targets));
    }

    let ramp_limit = RAMP_LIMIT_MIN.max(Duration::from_millis(20 * args.conns as u64));
    let mut steady_at: Option<Instant> = None;
    let mut shorts = JoinSet::new();
    let payload: Arc<[u8]> = vec![0u8; args.short_upload].into();
    let mut check = tokio::time::interval(Duration::from_millis(10));
    check.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut report = tokio::time::interval(stats_every);
    report.set_missed_tick_behavior(MissedTickBehavior::Delay);
    report.tick().await; // the first tick is immediate
    let deadline = sleep(duration);
    tokio::pin!(deadline);
    let reason = loop {
        tokio::select! {
            () = &mut deadline => break "duration",
            _ = sigint.recv() => break "signal",
            _ = sigterm.recv() => break "signal",
            _ = report.tick() => {
                let line = serde_json::to_string(&stats.snapshot("lab_stats", None, since()))?;
                let _ = churn::print_line(&line);
            }
            _ = check.tick() => match steady_at {
                None => {
                    let alive = stats.alive.load(Ordering::Relaxed);
                    let streams = stats.target_streams.load(Ordering::Relaxed);
                    let complete = alive >= args.conns as u64 && streams >= args.targets as u64;
                    if complete || start.elapsed() >= ramp_limit {
                        let steady = Steady { event: "lab_steady", t: since(), complete, alive, target_streams: streams };
                        churn::print_line(&serde_json::to_string(&steady)?)?;
                        steady_at = Some(Instant::now());
                    }
                }
                Some(at) => {
                    // As many short connections as the rate says by now.
                    let due = (args.new_per_sec * at.elapsed().as_secs_f64()) as u64;
                    while stats.short_started.load(Ordering::Relaxed) < due {
                        stats.short_started.fetch_add(1, Ordering::Relaxed);
                        if shorts.len() >= cap {
                            stats.short_skipped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let (config, stats, payload, target) = (config.clone(), stats.clone(), payload.clone(), fast.addr());
                        shorts.spawn(async move {
                            let counts = &stats.short;
                            match timeout(CONN_TIMEOUT, churn::one_connection(lean_endpoint, &config, server, target, &payload, counts)).await {
                                Ok(Ok(())) => counts.connections.fetch_add(1, Ordering::Relaxed),
                                Ok(Err(e)) => {
                                    tracing::debug!("lab node: short connection: {e:#}");
                                    counts.failed.fetch_add(1, Ordering::Relaxed)
                                }
                                Err(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
                            };
                        });
                    }
                }
            },
            Some(_) = shorts.join_next(), if !shorts.is_empty() => {}
        }
    };
    let done = stats.snapshot("lab_done", Some(reason), since());
    shorts.abort_all();
    long.abort_all();
    // Best effort: the reader may be gone after a signal.
    let _ = churn::print_line(&serde_json::to_string(&done).context("encoding the done line")?);
    drop(proxy);
    drop((fast, slow));
    Ok(())
}

/// One long-lived connection, opened again whenever it fails or closes, with
/// its periodic datagrams and the target streams it hosts (`(index, target)`).
async fn long_lived(plan: Arc<Plan>, i: usize, n: usize, hosted: Vec<(usize, SocketAddr)>, t: usize) {
    let stats = &plan.stats;
    let phase = plan.every.mul_f64(i as f64 / n as f64);
    loop {
        let connected = {
            let Ok(_permit) = plan.handshakes.acquire().await else { return };
            timeout(CONN_TIMEOUT, connect(&plan.config, plan.server)).await
        };
        let (endpoint, conn) = match connected {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::debug!("lab node: connection {i}: {e:#}");
                stats.connect_failed.fetch_add(1, Ordering::Relaxed);
                sleep(RETRY_AFTER).await;
                continue;
            }
            Err(_) => {
                stats.connect_failed.fetch_add(1, Ordering::Relaxed);
                sleep(RETRY_AFTER).await;
                continue;
            }
        };
        stats.opened.fetch_add(1, Ordering::Relaxed);
        let alive = Held::new(stats, |s| &s.alive);
        let mut streams = JoinSet::new();
        for &(j, target) in &hosted {
            let phase = plan.target_every.mul_f64(j as f64 / t.max(1) as f64);
            streams.spawn(target_stream(plan.clone(), conn.clone(), target, phase));
        }
        let mut tick = tokio::time::interval_at(next_after(plan.start + phase, plan.every), plan.every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if conn.send_datagram(DATAGRAM.to_vec().into()).is_ok() {
                        stats.datagrams_sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
                d = conn.read_datagram() => match d {
                    Ok(_) => { stats.datagrams_echoed.fetch_add(1, Ordering::Relaxed); }
                    Err(e) => {
                        tracing::debug!("lab node: connection {i} closed: {e}");
                        break;
                    }
                },
            }
        }
        streams.abort_all();
        drop(alive);
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        drop(endpoint);
        sleep(RETRY_AFTER).await;
    }
}

/// A client endpoint of its own (a new UDP socket) and a connection from it.
async fn connect(config: &ClientConfig, server: SocketAddr) -> anyhow::Result<(Endpoint, Connection)> {
    let bind = SocketAddr::new(server.ip(), 0);
    let endpoint = lean_endpoint(bind).with_context(|| format!("binding a client socket on {bind}"))?;
    let conn = endpoint
        .connect_with(config.clone(), server, tls::SERVER_NAME)
        .context("starting the handshake")?
        .await
        .context("handshake")?;
    Ok((endpoint, conn))
}

/// A client endpoint on a new UDP socket bound to `bind`, with UDP GRO off.
///
/// quinn sizes an endpoint's receive buffer for 32 datagrams of the socket's
/// GRO segments each: with GRO on, 32 × 64 × 1472 bytes = 3 MiB per endpoint,
/// allocated zeroed. A few clients do not mind; 10 000 endpoints and hundreds of
/// new ones per second do (gigabytes, and the zeroing). A client of this lab
/// receives a few small packets at a time, so it runs without GRO (the kernel
/// hands over each datagram alone) and quinn is told so: 32 × 1472 bytes.
/// When GRO cannot be turned off, the socket is left as quinn made it.
fn lean_endpoint(bind: SocketAddr) -> io::Result<Endpoint> {
    let socket = std::net::UdpSocket::bind(bind)?;
    let fd = socket.as_raw_fd();
    let runtime: Arc<dyn Runtime> = Arc::new(quinn::TokioRuntime);
    // quinn-udp turns GRO on here (where the kernel has it).
    let inner = runtime.wrap_udp_socket(socket)?;
    let off: libc::c_int = 0;
    // SAFETY: `fd` is the socket `inner` owns and keeps open; the option value
    // is a c_int that lives across the call.
    let res = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_UDP,
            libc::UDP_GRO,
            std::ptr::from_ref(&off).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let socket: Arc<dyn AsyncUdpSocket> = if res == 0 { Arc::new(NoGro(inner)) } else { inner };
    Endpoint::new_with_abstract_socket(EndpointConfig::default(), None, socket, runtime)
}

/// A quinn socket whose GRO is off: it receives one datagram per buffer.
#[derive(Debug)]
struct NoGro(Arc<dyn AsyncUdpSocket>);

impl AsyncUdpSocket for NoGro {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.0.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit) -> io::Result<()> {
        self.0.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut std::task::Context,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> std::task::Poll<io::Result<usize>> {
        self.0.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.0.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        1
    }

    fn may_fragment(&self) -> bool {
        self.0.may_fragment()
    }
}

/// One long-lived stream into `target`: the request, the proxy's answer, then
/// `target_chunk` bytes every `target_every` (phased by `phase`) until the
/// connection goes.
async fn target_stream(plan: Arc<Plan>, conn: Connection, target: SocketAddr, phase: Duration) {
    let stats = &plan.stats;
    let result = async {
        let (mut send, mut recv) = conn.open_bi().await.context("opening a stream")?;
        send.write_all(&wire::encode_request(target)).await.context("sending the request")?;
        let mut status = [0u8; 1];
        recv.read_exact(&mut status).await.context("reading the answer")?;
        ensure!(status[0] == wire::STATUS_OK, "the proxy could not reach the target");
        let _open = Held::new(stats, |s| &s.target_streams);
        let chunk = vec![0u8; plan.target_chunk];
        let mut tick = tokio::time::interval_at(next_after(plan.start + phase, plan.target_every), plan.target_every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            send.write_all(&chunk).await.context("writing")?;
            stats.target_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }
    .await;
    let result: anyhow::Result<()> = result;
    if let Err(e) = result {
        tracing::debug!("lab node: target stream into {target}: {e:#}");
        stats.target_failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// The first instant `base + k * every` (k ≥ 0) that is not in the past.
fn next_after(base: tokio::time::Instant, every: Duration) -> tokio::time::Instant {
    first_not_before(base, every, tokio::time::Instant::now())
}

/// The first instant `base + k * every` (k ≥ 0) not before `now`.
fn first_not_before(base: tokio::time::Instant, every: Duration, now: tokio::time::Instant) -> tokio::time::Instant {
    if base >= now {
        return base;
    }
    let behind = now.duration_since(base).as_secs_f64();
    let periods = (behind / every.as_secs_f64()).ceil();
    base + every.mul_f64(periods)
}

/// Raises the soft RLIMIT_NOFILE to `need` (and the hard one, when allowed and
/// needed); returns the soft limit in force afterwards.
fn raise_nofile(need: u64) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    if lim.rlim_cur >= need {
        return lim.rlim_cur;
    }
    let want = libc::rlimit { rlim_cur: need, rlim_max: lim.rlim_max.max(need) };
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
        return need;
    }
    // Not allowed to raise the hard limit: go as far as it allows.
    let capped = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &capped) } == 0 { lim.rlim_max } else { lim.rlim_cur }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_connections_in_flight_follow_the_rate() {
        assert_eq!(short_cap(0.0), 16);
        assert_eq!(short_cap(500.0), 1000);
    }

    #[test]
    fn the_next_tick_is_never_in_the_past() {
        let base = tokio::time::Instant::now();
        let (every, s) = (Duration::from_secs(5), Duration::from_secs);
        assert_eq!(first_not_before(base + s(2), every, base), base + s(2));
        assert_eq!(first_not_before(base + s(2), every, base + s(12)), base + s(12));
        assert_eq!(first_not_before(base + s(2), every, base + s(13)), base + s(17));
    }
}
