//! Loopback TCP targets with the four behaviours that matter (DESIGN.md §6).
//!
//! A target is one listener on 127.0.0.1 with an ephemeral port; every connection
//! it accepts is treated the same way. The TCP lab writes into targets directly; a
//! QUIC lab can copy proxied streams into them.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::MissedTickBehavior;

use crate::cli::Behaviour;

/// What a slow target reads per tick, and how often it ticks.
pub const SLOW_READ: u64 = 16 * 1024;
pub const SLOW_PERIOD: Duration = Duration::from_millis(100);
/// What an upclose target reads before it closes the connection.
pub const UPCLOSE_BYTES: u64 = 64 * 1024;

/// The name of a behaviour as the CLI and the JSON lines spell it.
pub fn behaviour_name(behaviour: Behaviour) -> &'static str {
    match behaviour {
        Behaviour::Fast => "fast",
        Behaviour::Slow => "slow",
        Behaviour::Upclose => "upclose",
        Behaviour::Stall => "stall",
    }
}

/// A running target. Dropping it stops the listener and closes every connection
/// it accepted (a stall target's sockets stay open exactly as long as it lives).
#[must_use = "dropping a Target closes it"]
#[derive(Debug)]
pub struct Target {
    addr: SocketAddr,
    behaviour: Behaviour,
    received: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Target {
    /// Where to connect: 127.0.0.1 and the port the kernel picked.
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
}

impl Drop for Target {
    fn drop(&mut self) {
        // The connections live in a JoinSet owned by this task: aborting the task
        // drops the set, which aborts them and closes their sockets.
        self.task.abort();
    }
}

/// Binds 127.0.0.1:0 and serves connections with `behaviour` on the current tokio
/// runtime. The listener is bound before this returns, so connecting right away
/// works (the kernel completes handshakes into the backlog before accept()).
pub async fn spawn_target(behaviour: Behaviour) -> io::Result<Target> {
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    let received = Arc::new(AtomicU64::new(0));
    let task = tokio::spawn(serve(listener, behaviour, received.clone()));
    Ok(Target { addr, behaviour, received, task })
}

async fn serve(listener: TcpListener, behaviour: Behaviour, received: Arc<AtomicU64>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(treat(stream, behaviour, received.clone()));
                }
                Err(e) => {
                    // E.g. EMFILE: pause instead of spinning on an error that persists.
                    tracing::debug!("lab target {}: accept: {e}", behaviour_name(behaviour));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            // Reap finished connections so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Serves one accepted connection; returning drops (closes) it.
async fn treat(mut stream: TcpStream, behaviour: Behaviour, received: Arc<AtomicU64>) {
    let result = match behaviour {
        Behaviour::Fast => read_up_to(&mut stream, u64::MAX, &received).await.map(drop),
        Behaviour::Slow => read_slowly(&mut stream, &received).await,
        // Closing with bytes still unread makes Linux answer with RST, so the
        // writer's next send fails (ECONNRESET/EPIPE), as it would in a proxy.
        Behaviour::Upclose => read_up_to(&mut stream, UPCLOSE_BYTES, &received).await.map(drop),
        // Never read, never close: the stream stays owned by this future, which
        // lives as long as the target. Kernel buffer sizes are left at their
        // defaults on purpose, as a real target would have them.
        Behaviour::Stall => std::future::pending().await,
    };
    if let Err(e) = result {
        tracing::debug!("lab target {}: {e}", behaviour_name(behaviour));
    }
}

/// Reads until `limit` bytes or EOF; returns how many bytes it read.
async fn read_up_to(stream: &mut TcpStream, limit: u64, received: &AtomicU64) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    while total < limit {
        let want = usize::try_from(limit - total).unwrap_or(usize::MAX).min(buf.len());
        let n = stream.read(&mut buf[..want]).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
        received.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(total)
}

/// SLOW_READ bytes every SLOW_PERIOD, until EOF: a writer keeps making progress,
/// slowly, so it must never be taken for stalled.
async fn read_slowly(stream: &mut TcpStream, received: &AtomicU64) -> io::Result<()> {
    let mut tick = tokio::time::interval(SLOW_PERIOD);
    // After a pause (nothing to read), go on at the steady rate, no catch-up burst.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if read_up_to(stream, SLOW_READ, received).await? < SLOW_READ {
            return Ok(()); // EOF
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::time::timeout;

    const MIB: usize = 1024 * 1024;

    #[tokio::test]
    async fn fast_target_reads_everything() {
        let target = spawn_target(Behaviour::Fast).await.unwrap();
        let mut w = TcpStream::connect(target.addr()).await.unwrap();
        // More than loopback buffers can hold, so it only completes if it is read.
        let payload = vec![7u8; 32 * MIB];
        timeout(Duration::from_secs(10), w.write_all(&payload)).await.unwrap().unwrap();
        w.shutdown().await.unwrap();
        // The target closes after EOF, having counted everything.
        let mut rest = Vec::new();
        timeout(Duration::from_secs(10), w.read_to_end(&mut rest)).await.unwrap().unwrap();
        assert_eq!(target.received(), payload.len() as u64);
    }

    #[tokio::test]
    async fn upclose_target_closes_after_64k_and_the_writer_fails() {
        let target = spawn_target(Behaviour::Upclose).await.unwrap();
        let mut w = TcpStream::connect(target.addr()).await.unwrap();
        let chunk = vec![1u8; 32 * 1024];
        let err = timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = w.write_all(&chunk).await {
                    return e;
                }
            }
        })
        .await
        .expect("the writer should fail once the target has closed");
        assert!(matches!(err.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset), "{err:?}");
        assert_eq!(target.received(), UPCLOSE_BYTES);
    }

    #[tokio::test]
    async fn stall_target_blocks_a_writer() {
        let target = spawn_target(Behaviour::Stall).await.unwrap();
        let mut w = TcpStream::connect(target.addr()).await.unwrap();
        let payload = vec![0u8; 16 * MIB];
        let res = timeout(Duration::from_secs(2), w.write_all(&payload)).await;
        assert!(res.is_err(), "write_all into a stall target completed");
        assert_eq!(target.received(), 0);
    }

    #[tokio::test]
    async fn slow_target_reads_steadily() {
        let target = spawn_target(Behaviour::Slow).await.unwrap();
        let mut w = TcpStream::connect(target.addr()).await.unwrap();
        let payload = vec![0u8; 16 * MIB];
        let res = timeout(Duration::from_secs(1), w.write_all(&payload)).await;
        assert!(res.is_err(), "16 MiB went through a slow target in 1 s");
        // About 10 ticks of 16 KiB; loose bounds so a busy machine does not fail it.
        let got = target.received();
        assert!((2 * SLOW_READ..=20 * SLOW_READ).contains(&got), "received {got}");
    }

    #[tokio::test]
    async fn dropping_a_stall_target_closes_its_connections() {
        let target = spawn_target(Behaviour::Stall).await.unwrap();
        let mut w = TcpStream::connect(target.addr()).await.unwrap();
        // Let it accept, then drop it: the writer must see EOF or a reset.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(target);
        let mut buf = [0u8; 1];
        let res = timeout(Duration::from_secs(5), w.read(&mut buf)).await.unwrap();
        assert!(matches!(res, Ok(0) | Err(_)), "{res:?}");
    }
}
