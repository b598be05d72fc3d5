//! The lab's client: one QUIC connection to the proxy, N uploads that write as
//! fast as flow control lets them, and probes that show what still works.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use tokio::task::JoinSet;
use tokio::time::timeout;

use super::wire;

/// Pause before an upload that ended (its target closed, say) starts again.
const UPLOAD_RESTART_DELAY: Duration = Duration::from_millis(100);

/// A connected client. Dropping it closes the connection.
pub struct Client {
    endpoint: Endpoint,
    conn: Connection,
}

impl Client {
    pub async fn connect(
        server: SocketAddr,
        crypto: quinn::crypto::rustls::QuicClientConfig,
        transport: quinn::TransportConfig,
    ) -> anyhow::Result<Self> {
        let bind = SocketAddr::new(server.ip(), 0);
        let endpoint = Endpoint::client(bind).with_context(|| format!("binding the QUIC client on UDP {bind}"))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(Arc::new(transport));
        let conn = endpoint
            .connect_with(config, server, super::tls::SERVER_NAME)
            .context("starting the QUIC handshake")?
            .await
            .with_context(|| format!("connecting to the lab proxy at {server}"))?;
        Ok(Self { endpoint, conn })
    }

    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.endpoint.local_addr().context("reading the client's address")
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Closes the connection and waits (briefly) for the close to go out.
    pub async fn close(self) {
        self.conn.close(VarInt::from_u32(wire::CODE_LAB_DONE), b"lab done");
        let _ = timeout(Duration::from_millis(500), self.endpoint.wait_idle()).await;
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.conn.close(VarInt::from_u32(wire::CODE_LAB_DONE), b"lab done");
    }
}

/// N upload streams into one target, each restarted when it ends. Dropping it
/// stops them (the streams are reset with the connection or on drop).
pub struct Uploads {
    counters: Vec<Arc<AtomicU64>>,
    restarts: Arc<AtomicU64>,
    _tasks: JoinSet<()>,
}

impl Uploads {
    pub fn start(conn: &Connection, target: SocketAddr, n: usize, chunk: usize) -> Self {
        let chunk: Arc<[u8]> = vec![0u8; chunk.max(1)].into();
        let restarts = Arc::new(AtomicU64::new(0));
        let mut tasks = JoinSet::new();
        let counters = (0..n)
            .map(|_| {
                let counter = Arc::new(AtomicU64::new(0));
                tasks.spawn(upload_slot(conn.clone(), target, chunk.clone(), counter.clone(), restarts.clone()));
                counter
            })
            .collect();
        Self { counters, restarts, _tasks: tasks }
    }

    /// Payload bytes each upload got into its stream so far.
    pub fn uploaded(&self) -> Vec<u64> {
        self.counters.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// How many times an upload stream ended and a new one took its place.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }
}

async fn upload_slot(
    conn: Connection,
    target: SocketAddr,
    chunk: Arc<[u8]>,
    counter: Arc<AtomicU64>,
    restarts: Arc<AtomicU64>,
) {
    loop {
        let err = upload_once(&conn, target, &chunk, &counter).await;
        if conn.close_reason().is_some() {
            return;
        }
        tracing::debug!("lab upload to {target} ended: {err:#}");
        restarts.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(UPLOAD_RESTART_DELAY).await;
    }
}

/// One upload stream: the request, then the chunk over and over until an error
/// (the proxy stops the stream when the target goes away).
async fn upload_once(conn: &Connection, target: SocketAddr, chunk: &[u8], counter: &AtomicU64) -> anyhow::Error {
    let (mut send, mut recv) = match conn.open_bi().await {
        Ok(s) => s,
        Err(e) => return e.into(),
    };
    let write = async {
        send.write_all(&wire::encode_request(target)).await?;
        loop {
            let n = send.write(chunk).await?;
            counter.fetch_add(n as u64, Ordering::Relaxed);
            // quinn hands out connection credit at write time, first come first
            // served, so a writer that loops without yielding takes all of it. A
            // quic-go client (Hysteria's) shares it among streams round-robin as
            // it packs frames; yielding after each write gets close to that, so a
            // new request is not starved by the uploads' appetite alone.
            tokio::task::yield_now().await;
        }
    };
    // Read the answer (status byte, whatever the target says) so that it never
    // pins this side's own receive window. The proxy resets its half when it
    // gives up on the stream: that ends the upload too. (It also sends
    // STOP_SENDING, but quinn 0.11 may never wake a writer parked on the
    // connection window whose stream window is used up, even once stopped.)
    let drain = async {
        let mut buf = [0u8; 4096];
        loop {
            match recv.read(&mut buf).await {
                Ok(Some(_)) => {}
                Ok(None) => std::future::pending::<()>().await, // the target is done talking
                Err(e) => return e,
            }
        }
    };
    tokio::select! {
        res = write => {
            let res: Result<(), quinn::WriteError> = res;
            match res {
                Ok(()) => unreachable!("the write loop ends only with an error"),
                Err(e) => e.into(),
            }
        }
        e = drain => anyhow::Error::from(e).context("the proxy closed the stream"),
    }
}

/// The outcome of one probe.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub ok: bool,
    /// How long it took, or how long it waited before giving up.
    pub elapsed: Duration,
    /// Why it failed ("timeout", or the error).
    pub error: Option<String>,
}

impl Probe {
    fn from_result(start: Instant, res: anyhow::Result<()>) -> Self {
        let elapsed = start.elapsed();
        match res {
            Ok(()) => Self { ok: true, elapsed, error: None },
            Err(e) => Self { ok: false, elapsed, error: Some(format!("{e:#}")) },
        }
    }
}

/// Probes what the connection can still carry: a new stream to the echo service
/// (a new request through the proxy) and a datagram.
pub struct Prober {
    conn: Connection,
    echo: SocketAddr,
    timeout: Duration,
    seq: u64,
}

impl Prober {
    pub fn new(conn: Connection, echo: SocketAddr, timeout: Duration) -> Self {
        Self { conn, echo, timeout, seq: 0 }
    }

    /// Both probes at once; returns (stream, datagram).
    pub async fn round(&mut self) -> (Probe, Probe) {
        self.seq += 1;
        tokio::join!(self.probe_stream(self.seq), self.probe_datagram(self.seq))
    }

    /// Opens a new stream to the echo service, sends 16 bytes, expects the status
    /// byte and the same 16 bytes back within the timeout.
    async fn probe_stream(&self, seq: u64) -> Probe {
        let start = Instant::now();
        let opened = match timeout(self.timeout, self.conn.open_bi()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Probe::from_result(start, Err(e.into())),
            Err(_) => return Probe::from_result(start, Err(anyhow::anyhow!("timeout opening a stream"))),
        };
        let (mut send, mut recv) = opened;
        let mut payload = [0u8; 16];
        payload[..8].copy_from_slice(b"hystall!");
        payload[8..].copy_from_slice(&seq.to_be_bytes());
        let rest = self.timeout.saturating_sub(start.elapsed());
        let res = match timeout(rest, exchange(&mut send, &mut recv, self.echo, &payload)).await {
            Ok(res) => res,
            Err(_) => Err(anyhow::anyhow!("timeout")),
        };
        if res.is_ok() {
            let _ = send.finish();
        } else {
            // Abandon it for good: without the reset, the unsent request would
            // still go out whenever the window opens again.
            let code = VarInt::from_u32(wire::CODE_PROBE_ABANDONED);
            let _ = send.reset(code);
            let _ = recv.stop(code);
        }
        Probe::from_result(start, res)
    }

    /// Sends a datagram and waits for its echo (older echoes are skipped).
    async fn probe_datagram(&self, seq: u64) -> Probe {
        let start = Instant::now();
        let res = async {
            self.conn.send_datagram(wire::probe_datagram(seq).to_vec().into()).context("sending a datagram")?;
            loop {
                let d = self.conn.read_datagram().await.context("reading datagrams")?;
                if wire::parse_probe_datagram(&d) == Some(seq) {
                    return Ok(());
                }
            }
        };
        let res = timeout(self.timeout, res).await.unwrap_or_else(|_| Err(anyhow::anyhow!("timeout")));
        Probe::from_result(start, res)
    }
}

async fn exchange(
    send: &mut SendStream,
    recv: &mut RecvStream,
    echo: SocketAddr,
    payload: &[u8; 16],
) -> anyhow::Result<()> {
    let mut msg = wire::encode_request(echo);
    msg.extend_from_slice(payload);
    send.write_all(&msg).await.context("writing the request")?;
    let mut answer = [0u8; 17];
    recv.read_exact(&mut answer).await.context("reading the answer")?;
    if answer[0] != wire::STATUS_OK {
        bail!("the proxy could not connect to the echo service (status {})", answer[0]);
    }
    if answer[1..] != payload[..] {
        bail!("the echo differs from what was sent");
    }
    Ok(())
}
