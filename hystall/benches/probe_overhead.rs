//! Probe overhead: how much slower small sends (and unrelated syscalls) get while
//! hystall's eBPF programs are attached. A benchmark, not a test: it prints
//! figures and never fails on them.
//!
//! Workloads, each run for a fixed wall time per round (`HYSTALL_BENCH_SECS`,
//! default 1 s):
//! - `sends`: a blocking loopback TCP pair (TCP_NODELAY, as Go proxies set it); the
//!   writer `write`s 64-byte messages in a tight loop (std's `write` is `send(2)`,
//!   i.e. the sendto syscall, one of the send family the probes time) while a
//!   reader thread drains everything. A fresh pair per round, connected after the
//!   probes are attached, so the monitored socket is tracked from its connect().
//! - `getppid`: a syscall that is no send, in a loop: what `raw_syscalls`
//!   sys_enter/sys_exit cost every other syscall on the machine.
//!
//! Modes:
//! - `detached`: no probes;
//! - `monitored`: `filter_pids: true`, this process's pid in the set: every hook
//!   does its full work on our sends. The syscall probes stay detached, as
//!   `watch` leaves them while the watched processes have no blocking TCP socket
//!   (Go, tokio and most proxies);
//! - `monitored+sys`: the same with the syscall probes (`raw_syscalls`)
//!   attached, as for a process with blocking sockets;
//! - `other`: `filter_pids: true`, only pid 1 in the set: how the machine's other
//!   processes pay (hooks run and filter out early), syscall probes detached;
//! - `all`: `filter_pids: false`: every process is watched, syscall probes
//!   attached (as `watch` does without a selection).
//!
//! Rounds go through the modes in turn (ABCD DCBA ...: a linear drift of the
//! machine weighs on every mode alike); the medians per mode and their ratio to
//! `detached` are printed. Needs root; prints `skipped: needs root` otherwise.
//!
//! `cargo bench -p hystall --bench probe_overhead` (or `cargo xtask bench`). Run
//! without `--bench` (e.g. by `cargo test --benches`) it does one short round only.

mod common;

use std::collections::HashSet;
use std::hint::black_box;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::thread;
use std::time::{Duration, Instant};

use hystall::sources::kernel::probes::{ProbeConfig, Probes};

use common::{PROBE_NAMES, Settings, median};

const MSG_LEN: usize = 64;
/// A pid that is not ours (init): the "machine's other processes" set.
const OTHER_PID: u32 = 1;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Detached,
    Monitored,
    MonitoredSys,
    Other,
    All,
}

const MODES: [Mode; 5] = [Mode::Detached, Mode::Monitored, Mode::MonitoredSys, Mode::Other, Mode::All];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Detached => "detached",
            Mode::Monitored => "monitored",
            Mode::MonitoredSys => "monitored+sys",
            Mode::Other => "other",
            Mode::All => "all",
        }
    }

    /// Loads and attaches the probes for this mode (`None` when detached).
    fn attach(self) -> Result<Option<Probes>, String> {
        let (filter_pids, pid) = match self {
            Mode::Detached => return Ok(None),
            Mode::Monitored | Mode::MonitoredSys => (true, Some(std::process::id())),
            Mode::Other => (true, Some(OTHER_PID)),
            Mode::All => (false, None),
        };
        let mut probes = Probes::load(&ProbeConfig { filter_pids, ..Default::default() }).map_err(|e| e.to_string())?;
        if let Some(pid) = pid {
            probes.set_pids(&HashSet::from([pid])).map_err(|e| e.to_string())?;
        }
        if matches!(self, Mode::MonitoredSys | Mode::All) {
            probes.attach_syscalls().map_err(|e| e.to_string())?;
        }
        Ok(Some(probes))
    }

    /// Whether the probes should track this process's socket in this mode.
    fn tracks_us(self) -> bool {
        matches!(self, Mode::Monitored | Mode::MonitoredSys | Mode::All)
    }
}

#[derive(Clone, Copy)]
enum Workload {
    Sends,
    Getppid,
}

const WORKLOADS: [Workload; 2] = [Workload::Sends, Workload::Getppid];

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Sends => "sends",
            Workload::Getppid => "getppid",
        }
    }
}

/// What the kernel side saw of one `sends` round: did it track our socket, and
/// did it count every send.
#[derive(Default)]
struct KernelView {
    rounds: u32,
    tracked: u32,
    all_sends_counted: u32,
    acks: u64,
}

fn main() {
    if !common::is_root() {
        return;
    }
    let settings = common::settings("probe_overhead");
    let Settings { secs, rounds, round_time, .. } = settings;

    // Fail early (and say what did not attach) before spending the time budget.
    match Mode::MonitoredSys.attach() {
        Ok(Some(probes)) => {
            if let Some(missing) = common::not_attached(&probes.status) {
                println!("warning: not attached, so not measured: {missing}");
            }
        }
        Ok(None) => unreachable!("monitored mode attaches"),
        Err(e) => {
            eprintln!("probe_overhead: cannot load the probes: {e}");
            std::process::exit(1);
        }
    }

    println!(
        "probe_overhead: {rounds} rounds x {} modes x {} workloads, {secs} s each; {MSG_LEN}-byte sends on a \
         loopback TCP pair; {} CPUs; pid {}",
        MODES.len(),
        WORKLOADS.len(),
        common::cpus(),
        std::process::id()
    );

    // Warm-up (unmeasured): CPU frequency, page faults, the first connect.
    let _ = measure_sends(Duration::from_millis(200), None);
    let _ = measure_getppid(Duration::from_millis(200));

    // rates[mode][workload] = one rate per round.
    let mut rates = vec![vec![Vec::<f64>::new(); WORKLOADS.len()]; MODES.len()];
    let mut views: Vec<KernelView> = MODES.iter().map(|_| KernelView::default()).collect();
    // Detached rounds that ran while someone else's hystall probes were loaded.
    let mut skewed = 0;
    let started = Instant::now();
    for round in 0..rounds {
        for m in common::round_order(round, MODES.len()) {
            let mode = MODES[m];
            if mode == Mode::Detached && foreign_probes() > 0 {
                skewed += 1;
            }
            let probes = match mode.attach() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("probe_overhead: cannot load the probes ({}): {e}", mode.name());
                    std::process::exit(1);
                }
            };
            for (w, workload) in WORKLOADS.iter().enumerate() {
                let rate = match workload {
                    Workload::Sends => {
                        let (rate, seen) = measure_sends(round_time, probes.as_ref());
                        if let Some((sends, stats)) = seen {
                            let v = &mut views[m];
                            v.rounds += 1;
                            if let Some((send_calls, acks)) = stats {
                                v.tracked += 1;
                                v.acks += acks;
                                if send_calls == sends {
                                    v.all_sends_counted += 1;
                                }
                            }
                        }
                        rate
                    }
                    Workload::Getppid => measure_getppid(round_time),
                };
                rates[m][w].push(rate);
            }
            drop(probes); // detaches
        }
        common::print_round(
            &settings,
            round,
            started,
            "",
            &WORKLOADS.map(Workload::name),
            &MODES.map(Mode::name),
            |m, w| rates[m][w][round],
        );
    }

    report(&rates, &views);

    // In-kernel cost per program run (sends: sock_send_length on each send,
    // tcp_probe on each ACK segment; the state programs at connect and close).
    println!();
    println!("in-kernel cost per program run (BPF statistics on; {} s per mode):", round_time.as_secs_f64());
    for mode in MODES.into_iter().filter(|m| *m != Mode::Detached) {
        let Ok(Some(probes)) = mode.attach() else { continue };
        let figures = common::kernel_ns(&probes, || {
            let _ = measure_sends(round_time, Some(&probes));
        });
        common::print_kernel_ns(mode.name(), &figures);
    }
    if skewed > 0 {
        println!(
            "warning: in {skewed}/{rounds} rounds another process had hystall probes loaded while we measured \
             `detached`: the baseline is slowed too, the ratios understate the overhead"
        );
    }
}

/// Programs with the names of hystall's probes loaded by someone else (another
/// hystall, a test): they would slow the `detached` baseline.
fn foreign_probes() -> usize {
    common::loaded_programs(&PROBE_NAMES)
}

/// Sends per second over `time`; with probes, also what the kernel saw of our
/// socket: `(sends made, Some((send_calls, acks)) if tracked)`.
type Seen = Option<(u64, Option<(u64, u64)>)>;

fn measure_sends(time: Duration, probes: Option<&Probes>) -> (f64, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback listener");
    let addr = listener.local_addr().expect("listener address");
    let mut writer = TcpStream::connect(addr).expect("connect on loopback");
    let (mut reader, _) = listener.accept().expect("accept on loopback");
    writer.set_nodelay(true).expect("TCP_NODELAY");

    let drain = thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => total += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("reader: {e}"),
            }
        }
    });

    let msg = [0x5au8; MSG_LEN];
    let mut sends = 0u64;
    let start = Instant::now();
    let deadline = start + time;
    let elapsed = loop {
        // Check the clock (vDSO, no syscall) every 32 sends.
        for _ in 0..32 {
            writer.write_all(&msg).expect("send on loopback");
        }
        sends += 32;
        let now = Instant::now();
        if now >= deadline {
            break now - start;
        }
    };

    let seen = probes.map(|p| {
        let stats = p.sock(socket_cookie(&writer)).map(|s| (s.send_calls, s.acks));
        (sends, stats)
    });
    writer.shutdown(Shutdown::Write).expect("shutdown");
    let received = drain.join().expect("reader thread");
    assert_eq!(received, sends * MSG_LEN as u64, "the reader got every byte");
    (sends as f64 / elapsed.as_secs_f64(), seen)
}

/// `getppid` calls per second over `time`.
fn measure_getppid(time: Duration) -> f64 {
    let mut calls = 0u64;
    let start = Instant::now();
    let deadline = start + time;
    let elapsed = loop {
        for _ in 0..256 {
            // SAFETY: getppid has no preconditions and cannot fail.
            black_box(unsafe { libc::getppid() });
        }
        calls += 256;
        let now = Instant::now();
        if now >= deadline {
            break now - start;
        }
    };
    calls as f64 / elapsed.as_secs_f64()
}

/// SO_COOKIE of a socket: the key of the probes' SOCKS map.
fn socket_cookie(s: &TcpStream) -> u64 {
    let mut cookie = 0u64;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cookie`.
    let rc = unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_COOKIE, (&raw mut cookie).cast(), &mut len)
    };
    assert_eq!(rc, 0, "SO_COOKIE: {}", std::io::Error::last_os_error());
    cookie
}

fn report(rates: &[Vec<Vec<f64>>], views: &[KernelView]) {
    let base = MODES.iter().position(|&m| m == Mode::Detached).expect("detached is a mode");
    println!();
    // ratio: of the medians; paired: median over rounds of (this mode / detached)
    // in the same round, which a drift of the machine between rounds does not move;
    // +ns/op: what the probes add to each send or syscall, from the medians.
    println!("{:<9} {:<10} {}", "workload", "mode", common::header_cells("median", "+ns/op", 8));
    for (w, workload) in WORKLOADS.iter().enumerate() {
        for (m, mode) in MODES.iter().enumerate() {
            println!(
                "{:<9} {:<10} {}",
                workload.name(),
                mode.name(),
                common::stats_cells(&rates[m][w], &rates[base][w], 8)
            );
        }
    }

    println!();
    for (m, mode) in MODES.iter().enumerate() {
        let v = &views[m];
        if v.rounds == 0 {
            continue;
        }
        let expect = if mode.tracks_us() { v.rounds } else { 0 };
        let verdict =
            if v.tracked == expect && v.all_sends_counted == v.tracked { "as expected" } else { "UNEXPECTED" };
        println!(
            "kernel view {}: our socket tracked in {}/{} rounds, every send counted in {}, {} ACKs seen ({verdict})",
            mode.name(),
            v.tracked,
            v.rounds,
            v.all_sends_counted,
            v.acks
        );
    }

    println!();
    common::print_ratios(&WORKLOADS.map(Workload::name), &MODES.map(Mode::name), base, "per_sec", |m, w| {
        median(&rates[m][w])
    });
}
