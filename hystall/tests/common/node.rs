//! A node with many clients, for the attribution tests (DESIGN.md §6): one real
//! Hysteria2 server (sing-box), several sing-box client processes (each its own
//! QUIC connection), each with its own work — uploads into targets of one
//! behaviour, a download, or nothing — started when its plan says, watched by
//! `hystall watch --json --pid SERVER`.
//!
//! Every client has targets of its own (their own listening ports), so a target
//! socket's remote port says whose it is; the client's UDP source ports say
//! which of hystall's connections is its. The truth for each client comes from
//! its side: after the uploads, does a new request through its tunnel work?

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Proc;
use super::singbox::{self, Behaviour, Options, SingBox, TcpTarget};

/// Stalled streams that exhaust the lab's 20 MiB window with 8 MiB ones.
pub const NEED: usize = 3;

/// The guard a node scenario runs under, or None (it printed why it skips):
/// it needs root and sing-box.
pub fn ready(name: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let g = super::root_or_skip(name)?;
    singbox::sing_box_or_skip(name).then_some(g)
}

/// What one client does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// N uploads into targets that never read.
    Stall(usize),
    /// N uploads into targets that read everything.
    Fast(usize),
    /// N uploads into targets that read a little, steadily.
    Slow(usize),
    /// A download from a target that writes (the client's uplink carries ACKs only).
    Download,
    /// Nothing after its start-up request.
    Idle,
}

impl Work {
    /// Whether the client's tunnel must be dead after the uploads, with the
    /// lab's windows (8 MiB per stream, 20 MiB per connection: 3 stalled
    /// streams exhaust it).
    pub fn starves(self) -> bool {
        matches!(self, Work::Stall(n) if n >= 3)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub work: Work,
    /// When its work starts, after the watch is up.
    pub start_after: Duration,
    /// Bytes a second per upload (a client's uplink), or as fast as it goes.
    pub rate: Option<u64>,
}

impl Plan {
    pub fn new(work: Work) -> Plan {
        Plan { work, start_after: Duration::ZERO, rate: None }
    }

    pub fn after(mut self, secs: f64) -> Plan {
        self.start_after = Duration::from_secs_f64(secs);
        self
    }

    pub fn rate(mut self, bytes_per_sec: u64) -> Plan {
        self.rate = Some(bytes_per_sec);
        self
    }
}

/// What a run needs besides the plans.
#[derive(Clone, Debug)]
pub struct Setup {
    pub opts: Options,
    /// Seconds the work runs before the tunnels are probed.
    pub work_secs: f64,
    /// Extra arguments for `hystall watch`.
    pub watch_args: Vec<String>,
    pub stall_timeout: u64,
    /// `hystall record` into this file instead of `watch` (for replays of the
    /// run while working on the attribution): set by `HYSTALL_NODE_RECORD=DIR`.
    pub record: Option<std::path::PathBuf>,
    /// Every client's user tries a new request this often once its work has
    /// begun (a short echo through its tunnel): users whose pages stop
    /// loading retry, and a request that reaches the server tells hystall
    /// that connection still had credit.
    pub retry_every: Option<Duration>,
    /// When the server starts, against hystall's watch.
    pub server: ServerStart,
}

/// When the node's server starts, and how hystall selects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerStart {
    /// Before hystall, selected by `--pid SERVER --port PORT`.
    Before,
    /// After `hystall watch --comm sing-box` is up: found by its name and
    /// config alone, while its clients dial and their work starts at once.
    AfterWatch,
    /// Before `watch --comm sing-box`, then killed and started again (a new
    /// process on the same port, a service restart) this long into the
    /// run; the clients keep running and reconnect (work planned after the
    /// restart starts once its client's tunnel works again).
    RestartAt(Duration),
    /// Before hystall (`--pid SERVER --port PORT`), its clients only once
    /// the watch is up (and, with `--decrypt`, once it reads the server's
    /// secrets: a handshake's are read only if the probe is there first).
    ClientsAfterWatch,
}

impl Setup {
    /// The default setup for the scenario `name`.
    pub fn named(name: &str) -> Setup {
        let record =
            std::env::var_os("HYSTALL_NODE_RECORD").map(|d| std::path::Path::new(&d).join(format!("{name}.rec")));
        Setup {
            opts: Options::default(),
            work_secs: 12.0,
            watch_args: Vec::new(),
            stall_timeout: 3,
            record,
            retry_every: None,
            server: ServerStart::Before,
        }
    }
}

/// One client after the run.
#[derive(Debug)]
pub struct Client {
    pub plan: Plan,
    /// Its UDP source ports seen during the run (more than one with port hopping).
    pub udp_ports: BTreeSet<u16>,
    /// Ports of its own targets.
    pub target_ports: BTreeSet<u16>,
    /// A new request through its tunnel worked after the uploads.
    pub tunnel_works: bool,
    /// hystall's connections that are this client's.
    pub conns: BTreeSet<u64>,
}

/// One `quic_starved` as the judge sees it.
#[derive(Debug, Clone)]
pub struct Flag {
    pub conn: u64,
    pub confidence: String,
    /// Target ports of the blamed sockets (None: a socket no event described).
    pub blamed: Vec<Option<u16>>,
    /// Target ports of the stalled targets it holds some of whatever the
    /// split (`evidence.shared_targets`), and how many at least.
    pub shared: Vec<Option<u16>>,
    pub shared_at_least: usize,
}

pub struct Run {
    pub events: Vec<Value>,
    pub clients: Vec<Client>,
    pub server_pid: u32,
}

/// How long a client is waited for to reconnect after a restart (a quic-go
/// client learns its connection died at its 30 s idle timeout at the latest).
const RECONNECT_WITHIN: Duration = Duration::from_secs(40);
/// How much longer than planned a run waits for its starved clients' flags.
const GRACE: Duration = Duration::from_secs(10);

/// Waits until `w` says it reads the TLS secrets of process `pid` (`--decrypt`).
fn wait_probed(w: &mut Proc, pid: u32) {
    let probed = |p: &Value| p["pid"] == pid && p["functions"].as_array().is_some_and(|f| !f.is_empty());
    // A server running before the watch is probed at its start (`watch_started`
    // says so), one that starts later when it execs (`decrypt_changed`).
    let at_start = w.seen.iter().filter_map(|l| serde_json::from_str::<Value>(l).ok()).any(|e| {
        e["event"] == "watch_started" && e["decrypt"]["processes"].as_array().is_some_and(|ps| ps.iter().any(probed))
    });
    if at_start {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Some(e) = w.next_json(deadline) {
        if e["event"] == "decrypt_changed" && e["processes"].as_array().is_some_and(|ps| ps.iter().any(probed)) {
            return;
        }
    }
    panic!("the sing-box server (pid {pid}) was not probed within 15 s: {:?}", w.seen);
}

/// Starts the node, runs every client's plan, probes every tunnel, and returns
/// what hystall said and what the clients saw.
pub fn run(setup: &Setup, plans: &[Plan]) -> Run {
    let opts = Options { clients: plans.len(), ..setup.opts.clone() };
    let timeout = setup.stall_timeout.to_string();
    let record = setup.record.as_ref().map(|p| p.to_string_lossy().into_owned());
    let mut args: Vec<&str> = match &record {
        Some(file) => vec!["record", file],
        None => vec!["watch"],
    };
    args.extend(["--json", "--stall-timeout", &timeout]);
    args.extend(setup.watch_args.iter().map(String::as_str));
    // A server started after hystall is selected by name, as a service's is.
    let mut watch = None;
    if setup.server == ServerStart::AfterWatch {
        let mut w = Proc::spawn(&[args.as_slice(), &["--comm", "sing-box"]].concat());
        w.wait_event("watch_started", Duration::from_secs(20));
        watch = Some(w);
    }
    let clients_later = setup.server == ServerStart::ClientsAfterWatch;
    let mut sb = SingBox::start(Options { no_client: clients_later, ..opts })
        .unwrap_or_else(|e| panic!("sing-box node does not start: {e:#}"));
    let mut server_pid = sb.server_pid().to_string();
    // The server's port, and the hopping range a DNAT rule forwards to it.
    let port = match &setup.opts.server_ports {
        Some(range) => format!("{}-{}", sb.server_port, range.split(':').next_back().unwrap_or_default()),
        None => sb.server_port.to_string(),
    };
    let mut watch = watch.unwrap_or_else(|| {
        let select: &[&str] = match setup.server {
            ServerStart::Before | ServerStart::ClientsAfterWatch => &["--pid", &server_pid, "--port", &port],
            _ => &["--comm", "sing-box"],
        };
        let mut w = Proc::spawn(&[args.as_slice(), select].concat());
        w.wait_event("watch_started", Duration::from_secs(20));
        w
    });
    if clients_later {
        if setup.watch_args.iter().any(|a| a == "--decrypt") {
            wait_probed(&mut watch, sb.server_pid());
        }
        for _ in 0..plans.len() {
            sb.add_client().unwrap_or_else(|e| panic!("a sing-box client does not start: {e:#}"));
        }
    }

    // Each client's UDP source ports, sampled while it runs.
    let ports: Arc<Mutex<Vec<BTreeSet<u16>>>> = Arc::new(Mutex::new(vec![BTreeSet::new(); plans.len()]));
    let done = Arc::new(AtomicBool::new(false));
    let pids: Vec<u32> = (0..plans.len()).map(|i| sb.client_pid_of(i)).collect();
    let sampler = {
        let (ports, done) = (ports.clone(), done.clone());
        // Behind a relay, the clients' sockets are connected to it.
        let server = sb.relay.as_ref().map_or(sb.server_port, |r| r.addr.port());
        let hopping = setup.opts.server_ports.is_some();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                for (i, pid) in pids.iter().enumerate() {
                    // Connected to the server, or unconnected (port-hopping clients).
                    let mine: Vec<u16> = singbox::udp_sockets_of(*pid)
                        .into_iter()
                        .filter(|(_, r)| r.port() == 0 || r.port() == server || hopping)
                        .map(|(l, _)| l.port())
                        .collect();
                    ports.lock().unwrap_or_else(|e| e.into_inner())[i].extend(mine);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    let stop = Arc::new(AtomicBool::new(false));
    // Set once a restarted server is up again (work planned after the
    // restart must not reach the old one on its way out).
    let restarted = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    // When each client's work ends: as planned, or, when it waited for its
    // client to reconnect, as long after its real start.
    let ends: Arc<Mutex<Vec<Instant>>> =
        Arc::new(Mutex::new(plans.iter().map(|_| start + Duration::from_secs_f64(setup.work_secs)).collect()));
    let mut targets: Vec<Vec<TcpTarget>> = Vec::new();
    let mut work: Vec<JoinHandle<()>> = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let behaviour = match plan.work {
            Work::Stall(_) => Some(Behaviour::Stall),
            Work::Fast(_) => Some(Behaviour::Fast),
            Work::Slow(_) => Some(Behaviour::Slow),
            Work::Download => Some(Behaviour::Source),
            Work::Idle => None,
        };
        let mine: Vec<TcpTarget> = behaviour.into_iter().map(|b| TcpTarget::spawn(b).expect("target")).collect();
        let addrs: Vec<SocketAddr> = mine.iter().map(TcpTarget::addr).collect();
        targets.push(mine);
        let (socks, stop, plan) = (sb.socks_of(i), stop.clone(), *plan);
        // Users retry each at their own moments: client i's first try is
        // i/n of a period later than client 0's (in step, every try would
        // come with another client's, and nothing would say whose it was).
        let (echo, retry_every) = (sb.echo.addr(), setup.retry_every);
        let phase = retry_every.map(|e| e.mul_f64(i as f64 / plans.len() as f64)).unwrap_or_default();
        // Work planned after a restart waits for its client to be back: a
        // quic-go client learns its connection died only at its idle timeout
        // (30 s; the new server sends no stateless reset), and its user
        // tries until a request goes through.
        let reconnects = matches!(setup.server, ServerStart::RestartAt(r) if plan.start_after >= r);
        let (ends, work_secs, restarted) = (ends.clone(), setup.work_secs, restarted.clone());
        work.push(std::thread::spawn(move || {
            let at = start + plan.start_after;
            while Instant::now() < at && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if reconnects {
                ends.lock().unwrap_or_else(|e| e.into_inner())[i] =
                    Instant::now() + RECONNECT_WITHIN + Duration::from_secs_f64(work_secs);
                while !restarted.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                while !stop.load(Ordering::Relaxed) && !singbox::probe_new_stream(socks, echo, Duration::from_secs(2)) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                let end = Instant::now() + Duration::from_secs_f64(work_secs) - plan.start_after;
                ends.lock().unwrap_or_else(|e| e.into_inner())[i] = end;
            }
            let n = match plan.work {
                Work::Stall(n) | Work::Fast(n) | Work::Slow(n) => n,
                Work::Download => 1,
                Work::Idle => 0,
            };
            let progress = Arc::new(AtomicU64::new(0));
            let threads: Vec<JoinHandle<u64>> = (0..n)
                .map(|_| match plan.work {
                    Work::Download => singbox::download_via(socks, addrs[0], stop.clone(), progress.clone()),
                    _ => singbox::upload_via_rate(socks, addrs[0], stop.clone(), progress.clone(), plan.rate),
                })
                .collect();
            if let Some(every) = retry_every {
                let mut next = Instant::now() + phase;
                while !stop.load(Ordering::Relaxed) {
                    next += every;
                    while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    if !stop.load(Ordering::Relaxed) {
                        singbox::probe_new_stream(socks, echo, Duration::from_secs(2));
                    }
                }
            }
            for t in threads {
                let _ = t.join();
            }
        }));
    }

    let deadline = start + Duration::from_secs_f64(setup.work_secs);
    let mut events = Vec::new();
    if let ServerStart::RestartAt(at) = setup.server {
        events = watch.collect_until(start + at);
        sb.restart_server().unwrap_or_else(|e| panic!("the server does not start again: {e:#}"));
        server_pid = sb.server_pid().to_string();
        restarted.store(true, Ordering::Relaxed);
        // The clients whose work began before it: the run does not end
        // before each is back (its truth is read through its new connection).
        for i in (0..plans.len()).filter(|&i| plans[i].start_after < at) {
            let (socks, echo, stop, ends) = (sb.socks_of(i), sb.echo.addr(), stop.clone(), ends.clone());
            ends.lock().unwrap_or_else(|e| e.into_inner())[i] = Instant::now() + RECONNECT_WITHIN;
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) && !singbox::probe_new_stream(socks, echo, Duration::from_secs(2)) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                let mut ends = ends.lock().unwrap_or_else(|e| e.into_inner());
                ends[i] = ends[i].max(Instant::now());
            });
        }
    }
    events.extend(watch.collect_until(deadline));
    // Work that started late (its client reconnecting) runs its full time.
    let late = || ends.lock().unwrap_or_else(|e| e.into_inner()).iter().max().copied().unwrap_or(deadline);
    while Instant::now() < late() {
        events.extend(watch.collect_until(late().min(Instant::now() + Duration::from_secs(1))));
    }
    let deadline = late().max(deadline);
    // A loaded machine fills the windows later: wait up to GRACE more for as
    // many connections flagged `likely` or better as the plans starve (which
    // ones is judged below), then a little longer for any wrong flag to show.
    let starving = plans.iter().filter(|p| p.work.starves()).count();
    let flagged = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["event"] == "quic_starved" && (e["confidence"] == "likely" || e["confidence"] == "confirmed"))
            .filter_map(|e| e["conn"].as_u64())
            .collect::<BTreeSet<u64>>()
            .len()
    };
    if flagged(&events) < starving {
        let hard = Instant::now() + GRACE;
        while flagged(&events) < starving {
            let Some(v) = watch.next_json(hard) else { break };
            events.push(v);
        }
        events.extend(watch.collect_until(hard.min(Instant::now() + Duration::from_secs(2))));
        eprintln!("{:.1} s past the planned {} s", (Instant::now() - deadline).as_secs_f64(), setup.work_secs);
    }
    // The truth, from each client's side, while its uploads still hold their streams.
    let echo = sb.echo.addr();
    let probes: Vec<JoinHandle<bool>> = (0..plans.len())
        .map(|i| {
            let socks = sb.socks_of(i);
            std::thread::spawn(move || {
                singbox::probe_new_stream(socks, echo, Duration::from_secs(3))
                    || singbox::probe_new_stream(socks, echo, Duration::from_secs(3))
            })
        })
        .collect();
    let works: Vec<bool> = probes.into_iter().map(|p| p.join().unwrap_or(false)).collect();
    events.extend(watch.collect_until(Instant::now() + Duration::from_millis(500)));
    stop.store(true, Ordering::Relaxed);
    done.store(true, Ordering::Relaxed);
    for w in work {
        let _ = w.join();
    }
    let _ = sampler.join();
    assert!(sb.alive(), "a sing-box process died during the run\n{}", sb.logs());
    watch.stop();

    let mut ports = ports.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Behind a relay, the server (and hystall) see its upstream port per client.
    if let Some(relay) = &sb.relay {
        eprintln!("{}", relay.summary());
        for p in ports.iter_mut() {
            *p = p.iter().filter_map(|&c| relay.upstream_port(c)).collect();
        }
    }
    let mut clients: Vec<Client> = plans
        .iter()
        .zip(ports)
        .zip(&targets)
        .zip(works)
        .map(|(((plan, udp_ports), mine), tunnel_works)| Client {
            plan: *plan,
            udp_ports,
            target_ports: mine.iter().map(|t| t.addr().port()).collect(),
            tunnel_works,
            conns: BTreeSet::new(),
        })
        .collect();
    for e in &events {
        let (Some(conn), Some(port)) = (e["conn"].as_u64(), client_port(e)) else { continue };
        if let Some(c) = clients.iter_mut().find(|c| c.udp_ports.contains(&port)) {
            c.conns.insert(conn);
        }
    }
    drop(targets);
    drop(sb);
    Run { events, clients, server_pid: server_pid.parse().unwrap_or(0) }
}

fn client_port(e: &Value) -> Option<u16> {
    let addr: SocketAddr = e["client"].as_str()?.parse().ok()?;
    Some(addr.port())
}

impl Run {
    /// Target port of each socket cookie any event described.
    fn remote_ports(&self) -> BTreeMap<u64, u16> {
        let mut out = BTreeMap::new();
        for e in &self.events {
            let remote = e["remote"].as_str().and_then(|r| r.parse::<SocketAddr>().ok());
            if let (Some(cookie), Some(r)) = (e["cookie"].as_u64(), remote) {
                out.insert(cookie, r.port());
            }
            for t in e["evidence"]["targets"].as_array().into_iter().flatten() {
                let remote = t["remote"].as_str().and_then(|r| r.parse::<SocketAddr>().ok());
                if let (Some(cookie), Some(r)) = (t["cookie"].as_u64(), remote) {
                    out.insert(cookie, r.port());
                }
            }
        }
        out
    }

    /// Every `quic_starved` of client `i`'s connections.
    pub fn flags_of(&self, i: usize) -> Vec<Flag> {
        let ports = self.remote_ports();
        // The target port of each socket cookie in a list (None: not described).
        let target_ports = |list: &Value| -> Vec<Option<u16>> {
            list.as_array().into_iter().flatten().filter_map(Value::as_u64).map(|c| ports.get(&c).copied()).collect()
        };
        let conns = &self.clients[i].conns;
        self.events
            .iter()
            .filter(|e| e["event"] == "quic_starved")
            .filter(|e| e["conn"].as_u64().is_some_and(|c| conns.contains(&c)))
            .map(|e| Flag {
                conn: e["conn"].as_u64().unwrap_or(0),
                confidence: e["confidence"].as_str().unwrap_or_default().to_owned(),
                blamed: target_ports(&e["stalled"]),
                shared: target_ports(&e["evidence"]["shared_targets"]["targets"]),
                shared_at_least: e["evidence"]["shared_targets"]["at_least"].as_u64().unwrap_or(0) as usize,
            })
            .collect()
    }

    /// Flags on connections that are no client's (none expected).
    pub fn orphan_flags(&self) -> Vec<&Value> {
        let known: BTreeSet<u64> = self.clients.iter().flat_map(|c| c.conns.iter().copied()).collect();
        self.events
            .iter()
            .filter(|e| e["event"] == "quic_starved")
            .filter(|e| e["conn"].as_u64().is_none_or(|c| !known.contains(&c)))
            .collect()
    }

    /// Checks the run against the truth: the lab starved exactly the clients
    /// it should have (else the run proves nothing), every starved client is
    /// flagged `likely` or better with only its own targets, at least
    /// `need` of them, and no healthy client is flagged at all. Returns the
    /// score line (right flags, missed, wrong) and panics with the whole story
    /// when the verdicts are wrong.
    pub fn judge(&self, name: &str, need: usize) -> Score {
        self.judge_with(name, need, Expect::Likely)
    }

    /// `judge`, with what the run must show of the starved clients.
    pub fn judge_with(&self, name: &str, need: usize, expect: Expect) -> Score {
        let mut score = Score::default();
        let mut story = Vec::new();
        for (i, c) in self.clients.iter().enumerate() {
            let flags = self.flags_of(i);
            story.push(format!(
                "client {i} {:?} (after {:?}, rate {:?}): udp {:?} targets {:?} conns {:?} tunnel_works {} flags {:?}",
                c.plan.work,
                c.plan.start_after,
                c.plan.rate,
                c.udp_ports,
                c.target_ports,
                c.conns,
                c.tunnel_works,
                flags
            ));
            assert_eq!(
                c.tunnel_works,
                !c.plan.work.starves(),
                "{name}: the lab did not do what client {i}'s plan says (tunnel works: {}):\n{}",
                c.tunnel_works,
                story.join("\n")
            );
            assert!(!c.conns.is_empty() || matches!(c.plan.work, Work::Idle), "{name}: client {i}: no connection seen");
            if c.plan.work.starves() {
                score.starved += 1;
                let best = flags.iter().rev().find(|f| f.confidence == "likely" || f.confidence == "confirmed");
                // Its own targets, and the shared ones it holds at least so
                // many of whatever the split: that many of those are its in
                // truth (else the floor was wrong).
                let own = |p: &Option<u16>| p.is_some_and(|p| c.target_ports.contains(&p));
                // `confirmed` rests on the connection's own frames
                // (`--decrypt`) or the server's table, not on how many
                // targets the attribution names: it need not name `need`.
                let right = best.is_some_and(|f| {
                    (f.blamed.len() + f.shared_at_least >= need || f.confidence == "confirmed")
                        && f.blamed.iter().all(own)
                        && f.shared.iter().filter(|p| own(p)).count() >= f.shared_at_least
                });
                if right {
                    score.right += 1;
                    if best.is_some_and(|f| f.confidence == "confirmed") {
                        score.confirmed += 1;
                    }
                } else {
                    score.missed += 1;
                }
                // No flag of this client may carry another's targets as
                // its own, nor claim more of the shared ones than are its.
                score.foreign += flags
                    .iter()
                    .filter(|f| {
                        f.blamed.iter().any(|p| !own(p))
                            || f.shared.iter().filter(|p| own(p)).count() < f.shared_at_least
                    })
                    .count();
            } else {
                score.healthy += 1;
                score.wrong += usize::from(!flags.is_empty());
                score.foreign += flags.len();
            }
        }
        score.wrong += self.orphan_flags().len();
        eprintln!("{name}: {score}\n{}", story.join("\n"));
        // HYSTALL_NODE_EVENTS=1: every event of the run, for a look at the evidence.
        if std::env::var_os("HYSTALL_NODE_EVENTS").is_some() {
            for e in self.events.iter().filter(|e| e["event"] != "quic_conn_opened") {
                eprintln!("{e}");
            }
        }
        assert!(
            score.wrong == 0
                && score.foreign == 0
                && match expect {
                    Expect::Likely => score.missed == 0,
                    Expect::Confirmed => score.missed == 0 && score.confirmed == score.right,
                    Expect::NoWrongFlag => true,
                },
            "{name}: {score}\n{}\nevents:\n{}",
            story.join("\n"),
            self.events
                .iter()
                .filter(|e| e["event"] != "quic_conn_opened")
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
        score
    }
}

/// What a run must show of its starved clients (never a wrong flag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Each flagged `likely` or better with only its own targets.
    Likely,
    /// Each flagged `confirmed` (a server API) with only its own targets.
    Confirmed,
    /// Flagged right or not at all (what timing and bytes cannot split).
    NoWrongFlag,
}

/// Right and wrong flags over a run (the figures docs/DETECTOR.md gives).
#[derive(Debug, Default, Clone, Copy)]
pub struct Score {
    pub starved: usize,
    pub healthy: usize,
    /// Starved clients flagged likely/confirmed with only their own targets.
    pub right: usize,
    pub confirmed: usize,
    /// Starved clients not flagged so.
    pub missed: usize,
    /// Healthy clients flagged (any confidence), or flags on no client's connection.
    pub wrong: usize,
    /// Flags carrying another client's targets.
    pub foreign: usize,
}

impl std::fmt::Display for Score {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "starved {} flagged right {} (confirmed {}) missed {}; healthy {} flagged {}; flags with foreign targets {}",
            self.starved, self.right, self.confirmed, self.missed, self.healthy, self.wrong, self.foreign
        )
    }
}
