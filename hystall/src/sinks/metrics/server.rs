//! The HTTP side: `GET /metrics` (the latest snapshot, encoded per scrape) and
//! a small index at `/`, on a thread of its own so that a slow scraper never
//! delays a tick. tiny_http does the HTTP.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;
use tiny_http::{Header, Method, Request, Response, Server};

use super::encode::{CONTENT_TYPE, encode};
use super::snapshot::Snapshot;

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("--metrics {addr}: cannot listen: {why}")]
    Bind { addr: SocketAddr, why: String },
    #[error("--metrics: cannot start the HTTP thread: {0}")]
    Thread(std::io::Error),
}

const INDEX: &str = "<!doctype html><html><head><title>hystall</title></head><body>\n\
<h1>hystall exporter</h1>\n<p><a href=\"/metrics\">/metrics</a>: Prometheus metrics \
(text format 0.0.4; see docs/METRICS.md).</p>\n</body></html>\n";

/// A pipeline that has not published for this long is wedged: `hystall_up 0`
/// (the HTTP thread would otherwise keep serving a frozen snapshot).
const STALE_AFTER: Duration = Duration::from_secs(5);

/// The latest snapshot and when it came.
#[derive(Default)]
struct Shared {
    snapshot: Snapshot,
    published: Option<Instant>,
}

impl Shared {
    fn up(&self) -> bool {
        self.published.is_some_and(|t| t.elapsed() < STALE_AFTER)
    }
}

/// The running exporter; dropping it stops the HTTP thread and frees the port.
pub struct Exporter {
    server: Arc<Server>,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl Exporter {
    /// Binds `addr` and serves on a new thread. Until the first `publish`
    /// (and whenever none came for `STALE_AFTER`), scrapes say `hystall_up 0`.
    pub fn start(addr: SocketAddr) -> Result<Exporter, MetricsError> {
        let server = Server::http(addr).map_err(|e| MetricsError::Bind { addr, why: e.to_string() })?;
        let server = Arc::new(server);
        let bound = server.server_addr().to_ip().unwrap_or(addr);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (server, shared, stop) = (server.clone(), shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("metrics".into())
                .spawn(move || serve(&server, &shared, &stop))
                .map_err(MetricsError::Thread)?
        };
        Ok(Exporter { server, shared, stop, thread: Some(thread), addr: bound })
    }

    /// The address actually bound (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Makes `snapshot` what the next scrapes see.
    pub fn publish(&self, snapshot: Snapshot) {
        let mut s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        s.snapshot = snapshot;
        s.published = Some(Instant::now());
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &Server, shared: &Mutex<Shared>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match server.recv() {
            Ok(req) => respond(req, shared),
            // Unblocked (we are stopping) or a failed accept (e.g. out of
            // fds): check the flag, without spinning on repeated failures.
            Err(e) => {
                tracing::debug!("metrics: {e}");
                if !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

fn respond(req: Request, shared: &Mutex<Shared>) {
    let path = req.url().split('?').next().unwrap_or("");
    let res = match (req.method(), path) {
        (Method::Get | Method::Head, "/metrics") => {
            let body = {
                let s = shared.lock().unwrap_or_else(PoisonError::into_inner);
                encode(&s.snapshot, s.up())
            };
            match body {
                Ok(b) => typed(Response::from_string(b), CONTENT_TYPE),
                Err(_) => Response::from_string("encoding failed\n").with_status_code(500),
            }
        }
        (Method::Get | Method::Head, "/") => typed(Response::from_string(INDEX), "text/html; charset=utf-8"),
        (Method::Get | Method::Head, _) => Response::from_string("not found\n").with_status_code(404),
        _ => Response::from_string("method not allowed\n").with_status_code(405),
    };
    if let Err(e) = req.respond(res) {
        tracing::debug!("metrics: response: {e}");
    }
}

type Body = Response<std::io::Cursor<Vec<u8>>>;

fn typed(res: Body, content_type: &str) -> Body {
    // Our content types are ASCII constants: from_bytes does not fail on them.
    match Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes()) {
        Ok(h) => res.with_header(h),
        Err(()) => res,
    }
}

#[cfg(test)]
mod tests;
