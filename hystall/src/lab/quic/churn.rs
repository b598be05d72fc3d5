//! `hystall lab churn`: many short QUIC connections through the lab proxy, for
//! soak runs (a monitor must stay bounded while thousands of connections and
//! target sockets come and go).
//!
//! N client tasks each loop until the duration ends: a new UDP socket (a new
//! 5-tuple, so a new flow for the TC probe), a handshake, one stream whose
//! upload (64 KiB by default) the proxy copies into a new connection to a fast
//! target, one datagram echoed back, and a clean close. The proxy and the
//! targets live in this process, as with `hystall lab`, so `watch --pid` sees
//! both the QUIC server's port and its target sockets.
//!
//! Prints a `lab_ready` JSON line (pid, server address) before the first
//! connection and a `lab_done` line with the counts at the end.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use quinn::{ClientConfig, Endpoint, VarInt};
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::timeout;

use super::proxy::{Proxy, ProxyNote};
use super::{connect_addr, tls, transport, wire};
use crate::cli::{Behaviour, ChurnLabArgs};
use crate::lab::targets;

/// One connection (handshake, upload, answer, datagram) may take this long on
/// a busy machine before it counts as failed.
pub(super) const CONN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the echoed datagram may take (a lost one is counted, not fatal).
const DATAGRAM_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a closed connection may take to send its CONNECTION_CLOSE and drain.
const CLOSE_WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, Serialize)]
struct Ready {
    event: &'static str,
    pid: u32,
    /// The proxy's UDP address (the QUIC server port to watch).
    server: SocketAddr,
    target_addr: SocketAddr,
    parallel: usize,
    upload_bytes: usize,
    duration: f64,
}

/// Counts over the whole run (shared by the client tasks; `lab node` counts
/// its short connections with it too).
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) connections: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) datagrams_echoed: AtomicU64,
    pub(super) datagrams_lost: AtomicU64,
    pub(super) uploaded: AtomicU64,
}

#[derive(Debug, Serialize)]
struct Done {
    event: &'static str,
    reason: &'static str,
    secs: f64,
    /// Connections that completed the whole exchange.
    connections: u64,
    /// Connections that failed or timed out somewhere.
    failed: u64,
    /// Target connections the proxy made (and closed).
    target_connections: u64,
    datagrams_echoed: u64,
    datagrams_lost: u64,
    uploaded_bytes: u64,
}

/// `hystall lab churn`: runs on a runtime of its own until `--duration` or a signal.
pub fn run(args: ChurnLabArgs) -> anyhow::Result<()> {
    let duration = Duration::try_from_secs_f64(args.duration)
        .context("--duration must be a finite, non-negative number of seconds")?;
    if args.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    let result = rt.block_on(churn(args, duration));
    rt.shutdown_background();
    result
}

async fn churn(args: ChurnLabArgs, duration: Duration) -> anyhow::Result<()> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let identity = tls::Identity::generate()?;
    let target = targets::spawn_target(Behaviour::Fast).await.context("starting the target")?;
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let proxy = Proxy::start(args.listen, identity.server_crypto()?, transport(false), notes_tx)?;
    // Target connections, counted as the proxy reports them (never stored).
    let target_conns = Arc::new(AtomicU64::new(0));
    let counter = target_conns.clone();
    tokio::spawn(async move {
        while let Some(note) = notes.recv().await {
            if let ProxyNote::Connected { .. } = note {
                counter.fetch_add(1, Ordering::Relaxed);
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
        target_addr: target.addr(),
        parallel: args.parallel,
        upload_bytes: args.upload,
        duration: duration.as_secs_f64(),
    };
    print_line(&serde_json::to_string(&ready).context("encoding the ready line")?)?;

    let start = Instant::now();
    let counts = Arc::new(Counts::default());
    let payload: Arc<[u8]> = vec![0u8; args.upload].into();
    let mut tasks = JoinSet::new();
    for _ in 0..args.parallel {
        let (config, counts, payload) = (config.clone(), counts.clone(), payload.clone());
        let target = target.addr();
        tasks.spawn(async move {
            while start.elapsed() < duration {
                match timeout(
                    CONN_TIMEOUT,
                    one_connection(Endpoint::client, &config, server, target, &payload, &counts),
                )
                .await
                {
                    Ok(Ok(())) => counts.connections.fetch_add(1, Ordering::Relaxed),
                    Ok(Err(e)) => {
                        tracing::debug!("churn connection: {e:#}");
                        counts.failed.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    let reason = tokio::select! {
        () = async { while tasks.join_next().await.is_some() {} } => "duration",
        _ = sigint.recv() => "signal",
        _ = sigterm.recv() => "signal",
    };
    tasks.abort_all();
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let done = Done {
        event: "lab_done",
        reason,
        secs: (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        connections: load(&counts.connections),
        failed: load(&counts.failed),
        target_connections: load(&target_conns),
        datagrams_echoed: load(&counts.datagrams_echoed),
        datagrams_lost: load(&counts.datagrams_lost),
        uploaded_bytes: load(&counts.uploaded),
    };
    // Best effort: the reader may be gone after a signal.
    let _ = print_line(&serde_json::to_string(&done).context("encoding the done line")?);
    drop(proxy);
    drop(target);
    Ok(())
}

/// One short connection from a UDP socket of its own, closed cleanly (so the
/// proxy forgets it at once rather than after its idle timeout). `endpoint`
/// makes the client endpoint on a new socket bound to the address it is given.
pub(super) async fn one_connection(
    endpoint: fn(SocketAddr) -> io::Result<Endpoint>,
    config: &ClientConfig,
    server: SocketAddr,
    target: SocketAddr,
    payload: &[u8],
    counts: &Counts,
) -> anyhow::Result<()> {
    let bind = SocketAddr::new(server.ip(), 0);
    let endpoint = endpoint(bind).with_context(|| format!("binding a client socket on {bind}"))?;
    let conn = endpoint
        .connect_with(config.clone(), server, tls::SERVER_NAME)
        .context("starting the handshake")?
        .await
        .context("handshake")?;
    let result = async {
        let (mut send, mut recv) = conn.open_bi().await.context("opening a stream")?;
        send.write_all(&wire::encode_request(target)).await.context("sending the request")?;
        send.write_all(payload).await.context("uploading")?;
        send.finish().context("finishing the upload")?;
        // The status byte, then EOF once the target has read everything and closed.
        let answer = recv.read_to_end(64).await.context("reading the answer")?;
        ensure!(answer.first() == Some(&wire::STATUS_OK), "the proxy could not reach the target");
        counts.uploaded.fetch_add(payload.len() as u64, Ordering::Relaxed);
        conn.send_datagram(b"churn".to_vec().into()).context("sending a datagram")?;
        let echoed = matches!(timeout(DATAGRAM_TIMEOUT, conn.read_datagram()).await, Ok(Ok(_)));
        let slot = if echoed { &counts.datagrams_echoed } else { &counts.datagrams_lost };
        slot.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    .await;
    conn.close(VarInt::from_u32(wire::CODE_LAB_DONE), b"churn");
    let _ = timeout(CLOSE_WAIT, endpoint.wait_idle()).await;
    result
}

pub(super) fn print_line(line: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).context("printing to stdout")
}
