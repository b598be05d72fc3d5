//! A slow, lossy path between QUIC clients and their server, in user space:
//! this kernel has no `netem` (nor `prio`) qdisc. Clients send to the relay;
//! it forwards each client's datagrams from an upstream socket of that
//! client's own (so the server, and hystall, still see one source port per
//! client) and sends the server's answers back. Every datagram, either way,
//! is dropped with probability `loss` or delivered `delay` later.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the path does to each datagram, each way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathShape {
    pub delay: Duration,
    /// Probability in 0..1 that a datagram is dropped.
    pub loss: f64,
}

/// Datagrams through the relay, per way: forwarded and dropped.
#[derive(Debug, Default)]
pub struct Counts {
    pub up: AtomicU64,
    pub up_dropped: AtomicU64,
    pub down: AtomicU64,
    pub down_dropped: AtomicU64,
}

/// A datagram due at a time, to a socket (and an address, down).
struct Due {
    at: Instant,
    via: Arc<UdpSocket>,
    to: Option<SocketAddr>,
    bytes: Vec<u8>,
}

pub struct Relay {
    /// Where clients send.
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    /// Each client's address → the local port of its upstream socket.
    upstream: Arc<Mutex<HashMap<SocketAddr, u16>>>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// A small PRNG for the losses (xorshift64*; seeded per way).
struct Dice(u64);

impl Dice {
    fn drop(&mut self, p: f64) -> bool {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        (x as f64 / (1u64 << 53) as f64) < p
    }
}

const POLL: Duration = Duration::from_millis(50);

impl Relay {
    /// A relay on the loopback address of `server`'s family, to `server`.
    pub fn start(server: SocketAddr, shape: PathShape) -> std::io::Result<Relay> {
        let any = SocketAddr::new(server.ip(), 0);
        let front = Arc::new(UdpSocket::bind(any)?);
        front.set_read_timeout(Some(POLL))?;
        let addr = front.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let upstream = Arc::new(Mutex::new(HashMap::new()));
        let threads = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel::<Due>();
        let line = {
            let stop = stop.clone();
            std::thread::spawn(move || delay_line(rx, stop))
        };
        let front_thread = {
            let (stop, counts, upstream, threads) = (stop.clone(), counts.clone(), upstream.clone(), threads.clone());
            std::thread::spawn(move || {
                let mut ups: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
                let mut dice = Dice(0x9e37_79b9_7f4a_7c15);
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, client)) = front.recv_from(&mut buf) else { continue };
                    let up = match ups.get(&client) {
                        Some(u) => u.clone(),
                        None => {
                            let Ok(u) = UdpSocket::bind(any).and_then(|u| u.connect(server).map(|()| u)) else {
                                continue;
                            };
                            let u = Arc::new(u);
                            let _ = u.set_read_timeout(Some(POLL));
                            if let Ok(a) = u.local_addr() {
                                upstream.lock().unwrap_or_else(|e| e.into_inner()).insert(client, a.port());
                            }
                            ups.insert(client, u.clone());
                            let back = back_thread(
                                u.clone(),
                                front.clone(),
                                client,
                                shape,
                                tx.clone(),
                                stop.clone(),
                                counts.clone(),
                            );
                            threads.lock().unwrap_or_else(|e| e.into_inner()).push(back);
                            u
                        }
                    };
                    if dice.drop(shape.loss) {
                        counts.up_dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    counts.up.fetch_add(1, Ordering::Relaxed);
                    let due = Due { at: Instant::now() + shape.delay, via: up, to: None, bytes: buf[..n].to_vec() };
                    if tx.send(due).is_err() {
                        break;
                    }
                }
            })
        };
        threads.lock().unwrap_or_else(|e| e.into_inner()).extend([line, front_thread]);
        Ok(Relay { addr, counts, upstream, stop, threads })
    }

    /// The server-side port the relay uses for the client at local port
    /// `client_port` (what hystall sees as that client's).
    pub fn upstream_port(&self, client_port: u16) -> Option<u16> {
        let map = self.upstream.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().find(|(c, _)| c.port() == client_port).map(|(_, u)| *u)
    }

    /// "forwarded up/dropped, down/dropped" for failure messages.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        format!(
            "relay: up {} (dropped {}), down {} (dropped {})",
            c.up.load(Ordering::Relaxed),
            c.up_dropped.load(Ordering::Relaxed),
            c.down.load(Ordering::Relaxed),
            c.down_dropped.load(Ordering::Relaxed)
        )
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The server's answers to one client, back through the front socket.
fn back_thread(
    up: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
    client: SocketAddr,
    shape: PathShape,
    tx: Sender<Due>,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut dice = Dice(0xd1b5_4a32_d192_ed03 ^ u64::from(client.port()));
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let Ok(n) = up.recv(&mut buf) else { continue };
            if dice.drop(shape.loss) {
                counts.down_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            counts.down.fetch_add(1, Ordering::Relaxed);
            let due = Due {
                at: Instant::now() + shape.delay,
                via: front.clone(),
                to: Some(client),
                bytes: buf[..n].to_vec(),
            };
            if tx.send(due).is_err() {
                break;
            }
        }
    })
}

/// Sends each datagram when due. The delay is the same for all, so the
/// order they come in is the order they are due.
fn delay_line(rx: Receiver<Due>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(d) = rx.recv_timeout(POLL) else { continue };
        let now = Instant::now();
        if d.at > now {
            std::thread::sleep(d.at - now);
        }
        let _ = match d.to {
            Some(to) => d.via.send_to(&d.bytes, to),
            None => d.via.send(&d.bytes),
        };
    }
}
