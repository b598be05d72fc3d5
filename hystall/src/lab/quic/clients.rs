//! More clients on the lab's proxy (`hystall lab --client SPEC`): each its own
//! QUIC connection (its own UDP socket) with its own uploads into targets of
//! its own (their own listener, so a target's address says whose it is), or
//! none (idle), started when its spec says — a node with many clients, in one
//! process. Each probes a new stream of its own every round: its truth.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::client::{Client, Prober, Uploads};
use super::targets::{self, Target};
use crate::cli::Behaviour;

/// What one more client does: `BEHAVIOUR:N[@SECS]` (N uploads into targets of
/// that behaviour, starting SECS after the lab's uploads) or `idle`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientSpec {
    pub behaviour: Option<Behaviour>,
    pub uploads: usize,
    pub after: Duration,
}

impl FromStr for ClientSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (what, after) = match s.split_once('@') {
            Some((w, a)) => {
                let secs: f64 = a.parse().map_err(|_| format!("{a:?} is not a number of seconds"))?;
                let after = Duration::try_from_secs_f64(secs).map_err(|_| format!("{a:?} is not a delay"))?;
                (w, after)
            }
            None => (s, Duration::ZERO),
        };
        if what == "idle" {
            return Ok(ClientSpec { behaviour: None, uploads: 0, after });
        }
        let (b, n) = what.split_once(':').ok_or_else(|| format!("{s:?}: expected BEHAVIOUR:N[@SECS] or idle"))?;
        let behaviour = match b {
            "fast" => Behaviour::Fast,
            "slow" => Behaviour::Slow,
            "upclose" => Behaviour::Upclose,
            "stall" => Behaviour::Stall,
            _ => return Err(format!("{b:?} is not a target behaviour (fast, slow, upclose, stall)")),
        };
        let uploads: usize = n.parse().map_err(|_| format!("{n:?} is not a number of uploads"))?;
        if uploads == 0 || uploads > 64 {
            return Err(format!("{uploads} uploads: 1 to 64"));
        }
        Ok(ClientSpec { behaviour: Some(behaviour), uploads, after })
    }
}

/// One more client, as the lab announces it (`lab_client`).
#[derive(Clone, Debug, Serialize)]
pub struct ClientInfo {
    pub index: usize,
    /// Its UDP address (its QUIC connection's client side).
    pub client: SocketAddr,
    /// `fast`, `slow`, `upclose`, `stall` or `idle`.
    pub behaviour: &'static str,
    pub uploads: usize,
    /// Its targets' address (None when idle).
    pub target_addr: Option<SocketAddr>,
    /// Seconds after the lab's uploads that its own start.
    pub after: f64,
}

/// One probe round of one more client (`lab_client_probe`).
#[derive(Clone, Debug, Serialize)]
pub struct ClientProbe {
    pub t: f64,
    pub index: usize,
    pub stream_ok: bool,
    pub datagram_ok: bool,
}

/// A running extra client: dropping it stops its uploads and probes and closes it.
pub struct Running {
    pub info: ClientInfo,
    target: Option<Target>,
    tasks: Vec<JoinHandle<()>>,
    client: Option<Client>,
}

impl Running {
    pub async fn close(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        if let Some(c) = self.client.take() {
            c.close().await;
        }
        drop(self.target.take());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How to reach the proxy and what every client shares.
pub struct Shared {
    pub server: SocketAddr,
    pub echo: SocketAddr,
    pub chunk: usize,
    pub probe_every: Duration,
    pub probe_timeout: Duration,
    /// When the lab's own uploads start (each client's `after` counts from then).
    pub uploads_at: Duration,
    /// Where the clients' probe rounds go.
    pub probes: mpsc::UnboundedSender<ClientProbe>,
}

/// Connects client `index` and starts its work `start + spec.after` from now.
pub async fn start(
    index: usize,
    spec: &ClientSpec,
    shared: &Shared,
    crypto: quinn::crypto::rustls::QuicClientConfig,
    transport: quinn::TransportConfig,
    since: impl Fn() -> f64 + Send + 'static,
) -> anyhow::Result<Running> {
    let target = match spec.behaviour {
        Some(b) => Some(targets::spawn_target(b).await?),
        None => None,
    };
    let client = Client::connect(shared.server, crypto, transport).await?;
    let info = ClientInfo {
        index,
        client: client.local_addr()?,
        behaviour: spec.behaviour.map_or("idle", targets::behaviour_name),
        uploads: spec.uploads,
        target_addr: target.as_ref().map(Target::addr),
        after: spec.after.as_secs_f64(),
    };
    let mut tasks = Vec::new();
    if let Some(addr) = info.target_addr {
        let (conn, n, chunk, wait) =
            (client.connection().clone(), spec.uploads, shared.chunk, shared.uploads_at + spec.after);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let uploads = Arc::new(Uploads::start(&conn, addr, n, chunk));
            // Held until the task is aborted (the uploads stop when dropped).
            std::future::pending::<()>().await;
            drop(uploads);
        }));
    }
    let mut prober = Prober::new(client.connection().clone(), shared.echo, shared.probe_timeout);
    let (every, probes) = (shared.probe_every, shared.probes.clone());
    tasks.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (stream, datagram) = prober.round().await;
            let p = ClientProbe { t: since(), index, stream_ok: stream.ok, datagram_ok: datagram.ok };
            if probes.send(p).is_err() {
                return;
            }
        }
    }));
    Ok(Running { info, target, tasks, client: Some(client) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_client_specs() {
        assert_eq!(
            "stall:4@2.5".parse(),
            Ok(ClientSpec { behaviour: Some(Behaviour::Stall), uploads: 4, after: Duration::from_millis(2500) })
        );
        assert_eq!("fast:2".parse::<ClientSpec>().unwrap().after, Duration::ZERO);
        assert_eq!("idle@1".parse::<ClientSpec>().unwrap().behaviour, None);
        for bad in ["stall", "stall:0", "loud:2", "fast:x", "fast:2@-1", "fast:2@x"] {
            assert!(bad.parse::<ClientSpec>().is_err(), "{bad}");
        }
    }
}
