//! TC classifier overhead: how many UDP packets per second a loopback sender and
//! receiver move while hystall's QUIC flow classifier (`quic_ingress` and
//! `quic_egress`, TCX on `lo`) is attached, against none. A benchmark, not a
//! test: it prints figures and never fails on them.
//!
//! Workloads, each run for a fixed wall time per round (`HYSTALL_BENCH_SECS`,
//! default 1 s):
//! - `udp`: 1200-byte datagrams (a full QUIC packet at the minimum path MTU);
//! - `udp64`: 64-byte datagrams (QUIC ACK-sized).
//!
//! A sender thread `send`s on a connected UDP socket in a tight loop to a socket
//! on 127.0.0.1 that a receiver thread drains with `recv` (receive buffer raised
//! with SO_RCVBUFFORCE, so that a scheduling hiccup drops little). Packets
//! received and sent per second are taken between two snapshots of the threads'
//! counters one round time apart. Drops = sent − received over the whole round,
//! after the receiver has emptied its buffer; `sock drop%` is the part the socket
//! itself dropped (buffer full, the drops column of /proc/net/udp), the rest was
//! lost before it (the loopback backlog). On loopback both hooks run in the
//! sender's thread (the receive path runs in its softirq).
//!
//! Modes:
//! - `detached`: no probes;
//! - `in-set`: the receiver's port is in `PORTS`: every packet is parsed at
//!   egress (its source port is looked up and is no server port) and at ingress,
//!   where it is counted into `FLOWS` (client → server); header samples are
//!   rate-limited (the first 8 per flow direction, then about one a second);
//! - `not-in-set`: `PORTS` holds another port only: every packet is parsed at
//!   both hooks and filtered out.
//!
//! In both attached modes the tracepoint programs are attached too (`Probes::load`
//! does it), their pid filter on pid 1 only: our send and recv syscalls also pay
//! their filtered-out cost (probe_overhead's `other` mode measures that alone).
//! After each attached round the classifier's own per-flow counters are read: in
//! `in-set` they must hold our flow with received ≤ counted ≤ sent; in
//! `not-in-set` no flow of ours.
//!
//! Rounds go through the modes in turn (ABC CBA ...: a linear drift of the
//! machine weighs on every mode alike); the medians per mode and their ratio to
//! `detached` are printed. Before each measurement it checks that no one else
//! has hystall's programs loaded, and warns when someone had: theirs slow every
//! mode, and their classifier, when ahead of ours on lo, ends the TCX chain
//! (it returns TC_ACT_OK), so ours may see nothing. Needs root; prints
//! `skipped: needs root` otherwise.
//!
//! `cargo bench -p hystall --bench tc_overhead` (or `cargo xtask bench`). Run
//! without `--bench` (e.g. by `cargo test --benches`) it does one short round only.

mod common;

use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::UdpSocket;
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

use hystall::sources::kernel::probes::tc::Iface;
use hystall::sources::kernel::probes::{ProbeConfig, Probes};
use hystall_common::{AF_INET, CLASS_ACK, CLASS_FULL, DIR_C2S, DIR_S2C, size_class};

use common::{PROBE_NAMES, Settings, median, per_sec};

/// A pid that is not ours (init): the tracepoint programs filter us out.
const OTHER_PID: u32 = 1;
/// A watched port that is none of ours (the `not-in-set` mode).
const OTHER_PORT: u16 = 443;
/// Receive buffer asked for (the kernel doubles it for its bookkeeping).
const RCVBUF: libc::c_int = 16 << 20;
/// Time the threads get to start before the measured window opens.
const SETTLE: Duration = Duration::from_millis(20);
/// How long the receiver waits for more once the sender has stopped.
const DRAIN_IDLE: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Detached,
    InSet,
    NotInSet,
}

const MODES: [Mode; 3] = [Mode::Detached, Mode::InSet, Mode::NotInSet];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Detached => "detached",
            Mode::InSet => "in-set",
            Mode::NotInSet => "not-in-set",
        }
    }

    /// Loads the probes, filters the tracepoints on another pid, and attaches the
    /// classifier to `lo` watching `ours` or another port (`None` when detached).
    fn attach(self, ours: &HashSet<u16>) -> Result<Option<Probes>, String> {
        let watched = match self {
            Mode::Detached => return Ok(None),
            Mode::InSet => ours.clone(),
            Mode::NotInSet => HashSet::from([OTHER_PORT]),
        };
        let mut probes =
            Probes::load(&ProbeConfig { filter_pids: true, ..Default::default() }).map_err(|e| e.to_string())?;
        probes.set_pids(&HashSet::from([OTHER_PID])).map_err(|e| e.to_string())?;
        let lo = Iface::by_name("lo").ok_or("no interface lo")?;
        let status = probes.attach_quic(&[lo], &watched).map_err(|e| e.to_string())?;
        if let Some(s) = status.iter().find(|s| !s.attached) {
            return Err(format!("{} did not attach: {}", s.name, s.note.as_deref().unwrap_or("?")));
        }
        Ok(Some(probes))
    }
}

#[derive(Clone, Copy)]
enum Workload {
    Udp,
    Udp64,
}

const WORKLOADS: [Workload; 2] = [Workload::Udp, Workload::Udp64];

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Udp => "udp",
            Workload::Udp64 => "udp64",
        }
    }

    /// Datagram (UDP payload) length.
    fn len(self) -> usize {
        match self {
            Workload::Udp => 1200,
            Workload::Udp64 => 64,
        }
    }
}

/// A receiver on 127.0.0.1 and a sender connected to it.
struct Pair {
    rx: UdpSocket,
    tx: UdpSocket,
    /// The receiver's port (the "server" port) and the sender's.
    port: u16,
    client_port: u16,
}

impl Pair {
    fn new() -> Pair {
        let rx = UdpSocket::bind("127.0.0.1:0").expect("bind the receiver");
        set_rcvbuf(&rx);
        rx.set_read_timeout(Some(DRAIN_IDLE)).expect("receiver timeout");
        let addr = rx.local_addr().expect("receiver address");
        let tx = UdpSocket::bind("127.0.0.1:0").expect("bind the sender");
        tx.connect(addr).expect("connect the sender");
        let client_port = tx.local_addr().expect("sender address").port();
        Pair { rx, tx, port: addr.port(), client_port }
    }
}

/// Raises the receive buffer past net.core.rmem_max (root: SO_RCVBUFFORCE), or
/// as far as that allows.
fn set_rcvbuf(s: &UdpSocket) {
    let size = RCVBUF;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt reads exactly `size_of::<c_int>()` bytes from `size`.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
}

/// The receive buffer the kernel granted (bytes).
fn rcvbuf(s: &UdpSocket) -> usize {
    let mut v: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`.
    let rc =
        unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, (&raw mut v).cast(), &mut len) };
    if rc == 0 { v as usize } else { 0 }
}

/// A counter alone on its cache lines: the sender's and the receiver's do not
/// bounce one line between the two CPUs.
#[repr(align(128))]
#[derive(Default)]
struct Counter(AtomicU64);

/// One workload in one mode for one round.
#[derive(Clone, Copy, Default)]
struct Run {
    /// Packets received and sent per second in the measured window.
    rx_rate: f64,
    tx_rate: f64,
    /// Over the whole round (settling and drain included).
    sent: u64,
    received: u64,
    /// Dropped by the receiving socket (buffer full), from /proc/net/udp.
    sock_drops: u64,
    /// Sends that failed (ENOBUFS, EAGAIN): not sent, not counted.
    send_errors: u64,
}

impl Run {
    fn drops(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }
}

fn measure(pair: &Pair, len: usize, time: Duration) -> Run {
    let stop = AtomicBool::new(false);
    let (sent, received) = (Counter::default(), Counter::default());
    let drops_before = socket_drops(pair.port).unwrap_or(0);

    let (window, sent_total, received_total, send_errors) = thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut buf = vec![0u8; 2048];
            let mut n = 0u64;
            loop {
                match pair.rx.recv(&mut buf) {
                    Ok(got) => {
                        assert_eq!(got, len, "datagram length");
                        n += 1;
                        received.0.store(n, Relaxed);
                    }
                    // Idle for DRAIN_IDLE: done once the sender has stopped.
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        if stop.load(Relaxed) {
                            return n;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => panic!("receiver: {e}"),
                }
            }
        });
        let sender = s.spawn(|| {
            let msg = vec![0x5au8; len];
            let (mut n, mut errors) = (0u64, 0u64);
            while !stop.load(Relaxed) {
                for _ in 0..32 {
                    match pair.tx.send(&msg) {
                        Ok(_) => {
                            n += 1;
                            sent.0.store(n, Relaxed);
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == ErrorKind::WouldBlock => {
                            errors += 1
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => panic!("sender: {e}"),
                    }
                }
            }
            (n, errors)
        });

        thread::sleep(SETTLE);
        let (s0, r0, t0) = (sent.0.load(Relaxed), received.0.load(Relaxed), Instant::now());
        thread::sleep(time);
        let (s1, r1, t1) = (sent.0.load(Relaxed), received.0.load(Relaxed), Instant::now());
        stop.store(true, Relaxed);
        let (sent_total, send_errors) = sender.join().expect("sender thread");
        let received_total = receiver.join().expect("receiver thread");
        ((s1 - s0, r1 - r0, t1 - t0), sent_total, received_total, send_errors)
    });

    let (tx_window, rx_window, elapsed) = window;
    let secs = elapsed.as_secs_f64();
    Run {
        rx_rate: rx_window as f64 / secs,
        tx_rate: tx_window as f64 / secs,
        sent: sent_total,
        received: received_total,
        sock_drops: socket_drops(pair.port).unwrap_or(0).saturating_sub(drops_before),
        send_errors,
    }
}

/// The drops column of /proc/net/udp for the socket bound to 127.0.0.1:`port`.
fn socket_drops(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    let local = [format!("0100007F:{port:04X}"), format!("7F000001:{port:04X}")];
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if local.iter().any(|l| fields.get(1) == Some(&l.as_str())) { fields.last()?.parse().ok() } else { None }
    })
}

/// What the classifier counted of our flow in one round.
struct Counted {
    c2s: u64,
    /// Of which in the workload's size class.
    c2s_in_class: u64,
    s2c: u64,
}

fn counted(probes: &Probes, pair: &Pair, class: usize) -> Option<Counted> {
    let mut ours = Vec::new();
    probes.each_flow(|k, st| {
        if k.family == AF_INET && k.server_port == pair.port && k.client_port == pair.client_port {
            ours.push((k, st));
        }
    });
    if ours.is_empty() {
        return None;
    }
    let mut c = Counted { c2s: 0, c2s_in_class: 0, s2c: 0 };
    for (_, stats) in &ours {
        c.c2s += stats.dir[DIR_C2S].packets.iter().sum::<u64>();
        c.c2s_in_class += stats.dir[DIR_C2S].packets[class];
        c.s2c += stats.dir[DIR_S2C].packets.iter().sum::<u64>();
    }
    Some(c)
}

/// What the classifier saw of one workload in one mode, over the rounds.
#[derive(Default)]
struct KernelView {
    rounds: u32,
    /// Rounds where our flow was in `FLOWS`.
    found: u32,
    /// Rounds where received ≤ counted ≤ sent, all in the size class, nothing s2c.
    consistent: u32,
    /// Rounds where every packet sent was counted.
    exact: u32,
    sent: u64,
    received: u64,
    c2s: u64,
    s2c: u64,
}

impl KernelView {
    fn add(&mut self, run: &Run, seen: Option<Counted>) {
        self.rounds += 1;
        let Some(c) = seen else { return };
        self.found += 1;
        self.sent += run.sent;
        self.received += run.received;
        self.c2s += c.c2s;
        self.s2c += c.s2c;
        if run.received <= c.c2s && c.c2s <= run.sent && c.c2s_in_class == c.c2s && c.s2c == 0 {
            self.consistent += 1;
        }
        if c.c2s == run.sent {
            self.exact += 1;
        }
    }
}

fn main() {
    if !common::is_root() {
        return;
    }
    let settings = common::settings("tc_overhead");
    let Settings { secs, rounds, round_time, .. } = settings;

    // Fail early (and say what did not attach) before spending the time budget.
    let first = Pair::new();
    match Mode::InSet.attach(&HashSet::from([first.port])) {
        Ok(Some(probes)) => {
            if let Some(missing) = common::not_attached(&probes.status) {
                println!("warning: not attached (their filtered-out cost is not in the figures): {missing}");
            }
        }
        Ok(None) => unreachable!("in-set mode attaches"),
        Err(e) => {
            eprintln!("tc_overhead: cannot attach the probes: {e}");
            std::process::exit(1);
        }
    }

    println!(
        "tc_overhead: {rounds} rounds x {} modes x {} workloads, {secs} s each; UDP on loopback, {} datagrams, \
         receive buffer {} KiB; classifier on lo; {} CPUs; pid {}",
        MODES.len(),
        WORKLOADS.len(),
        WORKLOADS.iter().map(|w| format!("{}-byte", w.len())).collect::<Vec<_>>().join(" and "),
        rcvbuf(&first.rx) / 1024,
        common::cpus(),
        std::process::id()
    );
    drop(first);

    // Warm-up (unmeasured): CPU frequency, page faults, the first sends.
    for workload in WORKLOADS {
        let _ = measure(&Pair::new(), workload.len(), Duration::from_millis(200));
    }

    // runs[mode][workload] = one run per round.
    let mut runs = vec![vec![Vec::<Run>::new(); WORKLOADS.len()]; MODES.len()];
    let mut views: Vec<Vec<KernelView>> =
        MODES.iter().map(|_| WORKLOADS.iter().map(|_| KernelView::default()).collect()).collect();
    // Per mode: rounds that ran while someone else's hystall probes were loaded.
    let mut skewed = vec![0u32; MODES.len()];
    let started = Instant::now();
    for round in 0..rounds {
        for m in common::round_order(round, MODES.len()) {
            let mode = MODES[m];
            if others_probes() > 0 {
                skewed[m] += 1;
            }
            // Fresh sockets (so fresh flows), bound before attaching: their ports
            // are what `in-set` watches.
            let pairs: Vec<Pair> = WORKLOADS.iter().map(|_| Pair::new()).collect();
            let ports: HashSet<u16> = pairs.iter().map(|p| p.port).collect();
            let probes = match mode.attach(&ports) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("tc_overhead: cannot attach the probes ({}): {e}", mode.name());
                    std::process::exit(1);
                }
            };
            for (w, workload) in WORKLOADS.iter().enumerate() {
                let run = measure(&pairs[w], workload.len(), round_time);
                if let Some(p) = &probes {
                    views[m][w].add(&run, counted(p, &pairs[w], size_class(workload.len() as u32)));
                }
                runs[m][w].push(run);
            }
            drop(probes); // detaches
        }
        let (workloads, modes) = (WORKLOADS.map(Workload::name), MODES.map(Mode::name));
        common::print_round(&settings, round, started, "received ", &workloads, &modes, |m, w| {
            runs[m][w][round].rx_rate
        });
    }

    report(&runs, &views);

    // In-kernel cost per program run, per attached mode and workload.
    println!();
    println!("in-kernel cost per program run (BPF statistics on; {} s per workload):", round_time.as_secs_f64());
    for mode in MODES.into_iter().filter(|m| *m != Mode::Detached) {
        for workload in WORKLOADS {
            let pair = Pair::new();
            let probes = match mode.attach(&HashSet::from([pair.port])) {
                Ok(Some(p)) => p,
                _ => continue,
            };
            let figures = common::kernel_ns(&probes, || {
                let _ = measure(&pair, workload.len(), round_time);
            });
            common::print_kernel_ns(&format!("{} {}", mode.name(), workload.name()), &figures);
        }
    }
    if skewed.iter().any(|&n| n > 0) {
        let per_mode: Vec<String> =
            MODES.iter().zip(&skewed).map(|(mode, n)| format!("{} {n}/{rounds}", mode.name())).collect();
        println!(
            "warning: another process had hystall probes loaded while we measured ({}): they slow every mode, \
             and a classifier of theirs ahead of ours on lo ends the TCX chain (TC_ACT_OK), so ours may not see \
             the packets",
            per_mode.join(", ")
        );
    }
}

/// Programs with hystall's probe names that someone else (another hystall, a
/// test, a benchmark) has loaded: they would slow the `detached` baseline. Ours
/// linger a moment after `Probes` is dropped (the kernel frees a link's program
/// after an RCU grace period): wait for them to go first.
fn others_probes() -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n = hystall_probes();
        if n == 0 || Instant::now() >= deadline {
            return n;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Loaded programs with the names of hystall's probes.
fn hystall_probes() -> usize {
    common::loaded_programs(&[&["quic_ingress", "quic_egress"][..], &PROBE_NAMES].concat())
}

/// `part` as a percentage of `whole`.
fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { 100.0 * part as f64 / whole as f64 }
}

fn report(runs: &[Vec<Vec<Run>>], views: &[Vec<KernelView>]) {
    let base = MODES.iter().position(|&m| m == Mode::Detached).expect("detached is a mode");
    println!();
    // Packets received per second. ratio: of the medians; paired: median over
    // rounds of (this mode / detached) in the same round, which a drift of the
    // machine between rounds does not move; +ns/pkt: what the classifier adds to
    // each packet, from the medians. sent: median packets sent per second. drop%
    // and sock drop%: of all packets sent over the rounds.
    println!(
        "{:<8} {:<10} {} {:>11} {:>7} {:>10}",
        "workload",
        "mode",
        common::header_cells("received", "+ns/pkt", 7),
        "sent",
        "drop%",
        "sock drop%"
    );
    for (w, workload) in WORKLOADS.iter().enumerate() {
        let base_rates = rx_rates(&runs[base][w]);
        for (m, mode) in MODES.iter().enumerate() {
            let rs = &runs[m][w];
            let tx: Vec<f64> = rs.iter().map(|r| r.tx_rate).collect();
            let sent: u64 = rs.iter().map(|r| r.sent).sum();
            let drops: u64 = rs.iter().map(Run::drops).sum();
            let sock_drops: u64 = rs.iter().map(|r| r.sock_drops).sum();
            println!(
                "{:<8} {:<10} {} {:>11} {:>7.3} {:>10.3}",
                workload.name(),
                mode.name(),
                common::stats_cells(&rx_rates(rs), &base_rates, 7),
                per_sec(median(&tx)),
                percent(drops, sent),
                percent(sock_drops, sent)
            );
        }
    }
    let send_errors: u64 = runs.iter().flatten().flatten().map(|r| r.send_errors).sum();
    if send_errors > 0 {
        println!("note: {send_errors} sends failed (ENOBUFS/EAGAIN) over all rounds: not counted as sent");
    }

    println!();
    for (m, mode) in MODES.iter().enumerate() {
        for (w, workload) in WORKLOADS.iter().enumerate() {
            let v = &views[m][w];
            if v.rounds == 0 {
                continue;
            }
            if *mode == Mode::InSet {
                let class = match size_class(workload.len() as u32) {
                    CLASS_ACK => "ack-sized",
                    CLASS_FULL => "full-size",
                    _ => "medium",
                };
                let ok = v.found == v.rounds && v.consistent == v.rounds;
                println!(
                    "kernel view {} {}: our flow in {}/{} rounds, c2s packets counted {} of {} sent ({} received), \
                     {} s2c; received <= counted <= sent, all {class}, in {} rounds; every packet counted in {} \
                     ({})",
                    workload.name(),
                    mode.name(),
                    v.found,
                    v.rounds,
                    v.c2s,
                    v.sent,
                    v.received,
                    v.s2c,
                    v.consistent,
                    v.exact,
                    if ok { "as expected" } else { "UNEXPECTED" }
                );
            } else {
                println!(
                    "kernel view {} {}: our flow in {}/{} rounds ({})",
                    workload.name(),
                    mode.name(),
                    v.found,
                    v.rounds,
                    if v.found == 0 { "as expected" } else { "UNEXPECTED" }
                );
            }
        }
    }

    println!();
    common::print_ratios(&WORKLOADS.map(Workload::name), &MODES.map(Mode::name), base, "pps", |m, w| {
        median(&rx_rates(&runs[m][w]))
    });
}

/// The packets received per second of each run.
fn rx_rates(runs: &[Run]) -> Vec<f64> {
    runs.iter().map(|r| r.rx_rate).collect()
}
