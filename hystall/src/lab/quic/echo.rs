//! The lab's "ok" service: a loopback TCP echo that probe streams go to. It reads
//! everything and writes it back, so a probe through the proxy gets its bytes
//! back as soon as the QUIC connection can carry them.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A running echo service; dropping it closes the listener and its connections.
#[must_use = "dropping an Echo closes it"]
#[derive(Debug)]
pub struct Echo {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Echo {
    /// Binds 127.0.0.1:0 and serves on the current tokio runtime.
    pub async fn spawn() -> io::Result<Self> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        Ok(Self { addr, task: tokio::spawn(serve(listener)) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(echo(stream));
                }
                Err(e) => {
                    tracing::debug!("lab echo: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Echoes until EOF, then closes.
async fn echo(mut stream: TcpStream) {
    let (mut r, mut w) = stream.split();
    if let Err(e) = tokio::io::copy(&mut r, &mut w).await {
        tracing::debug!("lab echo: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn echoes_until_eof() {
        let echo = Echo::spawn().await.unwrap();
        let mut s = TcpStream::connect(echo.addr()).await.unwrap();
        s.write_all(b"hello, lab").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"hello, lab");
    }
}
