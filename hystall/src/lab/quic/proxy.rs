//! The lab's QUIC proxy: a quinn server shaped like a Hysteria2 server.
//!
//! Each accepted bidirectional stream carries a request (a target address, see
//! [`wire`]); the proxy connects a non-blocking tokio TCP socket to the target and
//! copies both ways. The upload direction is Go's `io.Copy`: read one 32 KiB chunk
//! from the stream, `write_all` it into the target, repeat. While that write is
//! parked on a full socket nothing more is read from the stream, so its unread
//! bytes stay counted against the stream's and the connection's receive windows:
//! that is the failure the lab reproduces. Datagrams are echoed back (the UDP
//! relay, which flow control does not touch).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use quinn::{Connection, Endpoint, Incoming, RecvStream, SendStream, VarInt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::{JoinHandle, JoinSet};

use super::wire;

/// What Go's io.Copy reads at a time.
const COPY_BUF: usize = 32 * 1024;
/// How long a new stream may take to send its request.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the proxy tells the lab about its target connections.
#[derive(Debug, Clone)]
pub enum ProxyNote {
    /// A stream's target socket is connected (`local` is the proxy's end).
    Connected { stream: u64, local: SocketAddr, remote: SocketAddr },
    /// That socket is closed; `error` says why when a copy failed.
    Closed { stream: u64, local: SocketAddr, remote: SocketAddr, error: Option<String> },
}

/// A running proxy. Dropping it closes the endpoint and every stream and target
/// connection it holds.
#[must_use = "dropping a Proxy closes it"]
pub struct Proxy {
    endpoint: Endpoint,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Binds `listen` (UDP) and serves on the current tokio runtime.
    pub fn start(
        listen: SocketAddr,
        crypto: quinn::crypto::rustls::QuicServerConfig,
        transport: quinn::TransportConfig,
        notes: UnboundedSender<ProxyNote>,
    ) -> anyhow::Result<Self> {
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(Arc::new(transport));
        let endpoint =
            Endpoint::server(config, listen).with_context(|| format!("binding the QUIC proxy on UDP {listen}"))?;
        let addr = endpoint.local_addr().context("reading the proxy's address")?;
        let task = tokio::spawn(accept_loop(endpoint.clone(), notes));
        Ok(Self { endpoint, addr, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.endpoint.close(VarInt::from_u32(wire::CODE_LAB_DONE), b"lab done");
        // Aborting the accept loop drops its JoinSet of connections, whose tasks
        // drop their streams' tasks and so every target socket.
        self.task.abort();
    }
}

async fn accept_loop(endpoint: Endpoint, notes: UnboundedSender<ProxyNote>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => {
                    conns.spawn(serve_connection(incoming, notes.clone()));
                }
                None => break, // endpoint closed
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_connection(incoming: Incoming, notes: UnboundedSender<ProxyNote>) {
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!("lab proxy: handshake: {e}");
            return;
        }
    };
    let mut tasks = JoinSet::new();
    tasks.spawn(echo_datagrams(conn.clone()));
    loop {
        tokio::select! {
            accepted = conn.accept_bi() => match accepted {
                Ok((send, recv)) => {
                    tasks.spawn(serve_stream(send, recv, notes.clone()));
                }
                Err(e) => {
                    tracing::debug!("lab proxy: connection {}: {e}", conn.remote_address());
                    break;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// The UDP relay, reduced to an echo: datagrams are not flow-controlled, so this
/// keeps working while streams starve.
async fn echo_datagrams(conn: Connection) {
    while let Ok(d) = conn.read_datagram().await {
        if let Err(e) = conn.send_datagram(d) {
            tracing::debug!("lab proxy: echoing a datagram: {e}");
        }
    }
}

async fn serve_stream(mut send: SendStream, mut recv: RecvStream, notes: UnboundedSender<ProxyNote>) {
    let stream = u64::from(send.id());
    let target = match tokio::time::timeout(REQUEST_TIMEOUT, wire::read_request(&mut recv)).await {
        Ok(Ok(target)) => target,
        res => {
            let why = match res {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".to_owned(),
            };
            tracing::debug!("lab proxy: stream {stream}: bad request: {why}");
            let _ = recv.stop(VarInt::from_u32(wire::CODE_BAD_REQUEST));
            let _ = send.reset(VarInt::from_u32(wire::CODE_BAD_REQUEST));
            return;
        }
    };
    let tcp = match TcpStream::connect(target).await {
        Ok(tcp) => tcp,
        Err(e) => {
            tracing::debug!("lab proxy: stream {stream}: connecting to {target}: {e}");
            let _ = send.write_all(&[wire::STATUS_CONNECT_FAILED]).await;
            let _ = send.finish();
            let _ = recv.stop(VarInt::from_u32(wire::CODE_TARGET_GONE));
            return;
        }
    };
    let local = match tcp.local_addr() {
        Ok(local) => local,
        Err(e) => {
            tracing::debug!("lab proxy: stream {stream}: {e}");
            return;
        }
    };
    let _ = notes.send(ProxyNote::Connected { stream, local, remote: target });
    let result = relay(&mut send, &mut recv, tcp).await;
    if result.is_err() {
        // Like a proxy closing both ends when a copy fails: STOP_SENDING credits the
        // stream's unread bytes back to the connection.
        let code = VarInt::from_u32(wire::CODE_TARGET_GONE);
        let _ = recv.stop(code);
        let _ = send.reset(code);
    }
    let error = result.err().map(|e| e.to_string());
    let _ = notes.send(ProxyNote::Closed { stream, local, remote: target, error });
}

/// Answers the request, then copies both ways until both directions end (a FIN
/// each way) or either fails. Returning drops the target socket.
async fn relay(send: &mut SendStream, recv: &mut RecvStream, tcp: TcpStream) -> io::Result<()> {
    send.write_all(&[wire::STATUS_OK]).await?;
    let (mut tr, mut tw) = tcp.into_split();
    let up = async {
        copy_up(recv, &mut tw).await?;
        // The client finished its side: pass the FIN on, keep relaying the answer.
        tw.shutdown().await
    };
    let down = async {
        tokio::io::copy(&mut tr, send).await?;
        send.finish().map_err(io::Error::other)
    };
    tokio::try_join!(up, down).map(drop)
}

/// Go's io.Copy from the stream into the target: one read, then a write of all of
/// it; no read while the write is parked.
async fn copy_up(recv: &mut RecvStream, tw: &mut OwnedWriteHalf) -> io::Result<u64> {
    let mut buf = vec![0u8; COPY_BUF];
    let mut total = 0u64;
    while let Some(n) = recv.read(&mut buf).await? {
        tw.write_all(&buf[..n]).await?;
        total += n as u64;
    }
    Ok(total)
}
