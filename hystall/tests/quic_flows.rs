//! Root integration tests of the QUIC flow probe with real QUIC on loopback: a
//! quinn client and server in this process (uploads, downloads, datagrams);
//! `hystall watch --json` must see exactly one connection whose packet and
//! byte counts match what quinn itself counted.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Proc, root_or_skip};
use hystall::lab::quic::tls::{Identity, SERVER_NAME};
use serde_json::Value;

const MIB: usize = 1024 * 1024;

fn within(actual: u64, expected: u64, pct: f64) -> bool {
    let e = expected as f64;
    (actual as f64 - e).abs() <= e * pct / 100.0
}

/// What the server's side counted for its last connection, once it closed.
type ServerStats = Arc<std::sync::Mutex<Option<quinn::ConnectionStats>>>;

/// Server: reads uni streams to the end, answers a bi stream with `n` bytes
/// (the request says how many), echoes datagrams.
async fn serve(endpoint: quinn::Endpoint, stats: ServerStats) {
    while let Some(incoming) = endpoint.accept().await {
        let stats = stats.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            let c = conn.clone();
            tokio::spawn(async move {
                c.closed().await;
                *stats.lock().unwrap() = Some(c.stats());
            });
            let c = conn.clone();
            tokio::spawn(async move {
                while let Ok(d) = c.read_datagram().await {
                    let _ = c.send_datagram(d);
                }
            });
            let c = conn.clone();
            tokio::spawn(async move {
                while let Ok(mut rx) = c.accept_uni().await {
                    tokio::spawn(async move {
                        let _ = rx.read_to_end(usize::MAX).await;
                    });
                }
            });
            while let Ok((mut tx, mut rx)) = conn.accept_bi().await {
                let Ok(req) = rx.read_to_end(16).await else { continue };
                let n = u64::from_be_bytes(req[..8].try_into().unwrap_or([0; 8])) as usize;
                let _ = tx.write_all(&vec![7u8; n]).await;
                let _ = tx.finish();
            }
        });
    }
}

struct Counted {
    tx_bytes: u64,
    tx_datagrams: u64,
    rx_bytes: u64,
    rx_datagrams: u64,
    client: SocketAddr,
}

/// Connects, uploads, downloads, exchanges datagrams, closes; returns what
/// quinn counted on the client side.
async fn exchange(server: SocketAddr, id: &Identity) -> anyhow::Result<Counted> {
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    client.set_default_client_config(quinn::ClientConfig::new(Arc::new(id.client_crypto(None)?)));
    let conn = client.connect(server, SERVER_NAME)?.await?;

    let mut up = conn.open_uni().await?;
    up.write_all(&vec![1u8; 4 * MIB]).await?;
    up.finish()?;
    let _ = up.stopped().await;

    let (mut tx, mut rx) = conn.open_bi().await?;
    tx.write_all(&((3 * MIB) as u64).to_be_bytes()).await?;
    tx.finish()?;
    let down = rx.read_to_end(4 * MIB).await?;
    assert_eq!(down.len(), 3 * MIB);

    for i in 0..200u32 {
        conn.send_datagram(vec![i as u8; 500].into())?;
        let _ = tokio::time::timeout(Duration::from_millis(500), conn.read_datagram()).await;
    }
    let local = client.local_addr()?;
    conn.close(0u32.into(), b"done");
    client.wait_idle().await;
    let st = conn.stats();
    Ok(Counted {
        tx_bytes: st.udp_tx.bytes,
        tx_datagrams: st.udp_tx.datagrams,
        rx_bytes: st.udp_rx.bytes,
        rx_datagrams: st.udp_rx.datagrams,
        client: local,
    })
}

#[test]
fn a_quinn_connection_is_one_connection_with_matching_counts() {
    let Some(_g) = root_or_skip("a_quinn_connection_is_one_connection_with_matching_counts") else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let id = Identity::generate().unwrap();
    let server_cfg = quinn::ServerConfig::with_crypto(Arc::new(id.server_crypto().unwrap()));
    let endpoint = rt.block_on(async { quinn::Endpoint::server(server_cfg, "127.0.0.1:0".parse().unwrap()) }).unwrap();
    let server = endpoint.local_addr().unwrap();
    let server_stats = ServerStats::default();
    rt.spawn(serve(endpoint, server_stats.clone()));

    let me = std::process::id().to_string();
    let port = server.port().to_string();
    let mut w = Proc::spawn(&["watch", "--json", "--pid", &me, "--port", &port, "--quic-idle", "2"]);
    let started = w.wait_event("watch_started", Duration::from_secs(15));
    assert!(
        started["probes"].as_array().unwrap().iter().any(|p| p["name"] == "quic_ingress@lo" && p["attached"] == true),
        "{started}"
    );

    let counted = rt.block_on(exchange(server, &id)).expect("quinn exchange");
    std::thread::sleep(Duration::from_millis(300));
    let srv = (*server_stats.lock().unwrap()).expect("server saw the connection close");
    let events = w.collect_until(Instant::now() + Duration::from_secs(6));
    let opened: Vec<&Value> = events.iter().filter(|e| e["event"] == "quic_conn_opened").collect();
    let closed: Vec<&Value> = events.iter().filter(|e| e["event"] == "quic_conn_closed").collect();
    assert_eq!(opened.len(), 1, "exactly one connection: {events:#?}");
    assert_eq!(closed.len(), 1, "closed when idle: {events:#?}");
    let c = closed[0];
    assert_eq!(c["conn"], opened[0]["conn"]);
    assert_eq!(c["client"], counted.client.to_string());
    assert_eq!(c["server"], server.to_string());
    assert_eq!(c["grouping"], "dcid", "{c}");
    assert_eq!(c["reason"], "idle");
    let got = |k: &str| c[k].as_u64().unwrap();
    // Each direction is counted where the server host handles it: what the
    // client sent (arriving), what the server sent (leaving). On loopback the
    // client's socket can drop some of the server's bursts; those still count.
    eprintln!(
        "client tx {} B / {} pkts (rx {} B / {} pkts), server tx {} B / {} pkts; hystall: c2s {} B / {} pkts, s2c {} B / {} pkts",
        counted.tx_bytes,
        counted.tx_datagrams,
        counted.rx_bytes,
        counted.rx_datagrams,
        srv.udp_tx.bytes,
        srv.udp_tx.datagrams,
        got("c2s_bytes"),
        got("c2s_packets"),
        got("s2c_bytes"),
        got("s2c_packets")
    );
    assert!(within(got("c2s_bytes"), counted.tx_bytes, 5.0), "{c}");
    assert!(within(got("c2s_packets"), counted.tx_datagrams, 5.0), "{c}");
    assert!(within(got("s2c_bytes"), srv.udp_tx.bytes, 5.0), "{c}");
    assert!(within(got("s2c_packets"), srv.udp_tx.datagrams, 5.0), "{c}");
    assert!(got("s2c_bytes") >= counted.rx_bytes, "{c}");
    assert_eq!(w.stop(), Some(0));
}
