//! The HTTP side on a loopback port of its own (no root).

use std::net::{SocketAddr, TcpListener};

use super::{Exporter, MetricsError};
use crate::sinks::metrics::{Snapshot, Totals};

fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut res = agent.get(&format!("http://{addr}{path}")).call().expect("request");
    let ct = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    (res.status().as_u16(), ct, res.body_mut().read_to_string().unwrap_or_default())
}

#[test]
fn serves_the_latest_snapshot_the_index_and_nothing_else() {
    let ex = Exporter::start("127.0.0.1:0".parse().unwrap()).expect("bind");
    let addr = ex.local_addr();
    assert_ne!(addr.port(), 0);

    // Before the first publish: served, but not up.
    let (status, ct, body) = get(addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(ct, "text/plain; version=0.0.4; charset=utf-8");
    assert!(body.contains("\nhystall_up 0\n"), "{body}");

    let mut s = Snapshot { targets: [1, 0, 2], ..Default::default() };
    s.totals = Totals::default();
    ex.publish(s);
    let (_, _, body) = get(addr, "/metrics?x=1");
    assert!(body.contains("\nhystall_up 1\n"), "{body}");
    assert!(body.contains("\nhystall_stalled_targets 2\n"), "{body}");

    let (status, ct, body) = get(addr, "/");
    assert_eq!((status, ct.as_str()), (200, "text/html; charset=utf-8"));
    assert!(body.contains("href=\"/metrics\""), "{body}");
    assert_eq!(get(addr, "/nope").0, 404);

    // Dropping the exporter stops its thread and frees the port (its worker
    // may take a moment to let go of the last keep-alive connection).
    drop(ex);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while TcpListener::bind(addr).is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(TcpListener::bind(addr).is_ok(), "port {addr} still taken");
}

#[test]
fn a_taken_port_is_an_error_naming_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = Exporter::start(addr).err().expect("must fail");
    assert!(matches!(err, MetricsError::Bind { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&addr.to_string()) && !msg.contains('\n'), "{msg}");
}
