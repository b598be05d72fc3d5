//! The live pipeline shared by `watch` and `top`: selection → kernel probes
//! (sources) → model (core), one tick at a time. Sinks are the callers'.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::caps::{self, Need};
use super::lab_side::LabChild;
use crate::cli::{EnforceArgs, LabSide, PortRange, Selection};
use crate::core::enforce::{EnforceConfig, Enforcer, Exclude};
use crate::core::event::{EnforcedInfo, Event};
use crate::core::event::{Stamped, StartInfo};
use crate::core::model::Model;
use crate::core::observation::Observation;
use crate::core::recording::Header as RecHeader;
use crate::core::time::{Mono, mono_now};
use crate::core::timeline::ModelOptions;
use crate::sinks::enforcer::{Executor, syslog};
use crate::sinks::recorder::Recorder;
use crate::sources::decrypt::DecryptOptions;
use crate::sources::live::{Live, QuicOptions};
use crate::sources::processes::procs::Mode;
use crate::sources::{apis::clash_api, apis::hysteria_api};

/// How often verdicts are re-judged: the latency of `socket_stalled` after the
/// timeout expires is at most this.
pub const TICK: Duration = Duration::from_millis(200);
/// How often the server's stream table is fetched (`--hysteria-api`).
const API_EVERY: Duration = Duration::from_secs(2);
/// How often the server's relay table is fetched (Clash API).
const CLASH_EVERY: Duration = Duration::from_secs(1);

pub struct Pipeline {
    // Field order is drop order: probes detached before the lab is stopped.
    pub live: Live,
    pub model: Model,
    pub start: StartInfo,
    pending: Vec<Observation>,
    lost_seen: u64,
    /// Stream tables from the server's API poller, when one runs.
    api: std::sync::mpsc::Receiver<Observation>,
    /// The Clash APIs polled (given, or found in the watched servers' configs).
    clash: ClashApis,
    /// `--enforce`: the rule and its hands.
    enforcer: Option<(Enforcer, Executor)>,
    /// `hystall record`: every observation and tick, to a file.
    recorder: Option<Recorder>,
    /// The options the model was built with (for recordings).
    pub options: ModelOptions,
    _lab: Option<LabChild>,
}

impl Pipeline {
    /// Validates the options, starts the lab if asked, attaches the probes.
    pub fn start(sel: &Selection, lab: &LabSide, enforce: &EnforceArgs, lab_echo: bool) -> Result<Pipeline> {
        let options = super::model_options(sel.stall_timeout, sel.quic_idle, sel.stream_window, sel.conn_window)?;
        // Before anything starts: one line naming each missing capability
        // (with --enforce, its reasons first: they say what enforcing needs).
        let needs: &[&[Need]] =
            if enforce.enforce && !enforce.dry_run { &[caps::ENFORCE, caps::WATCH] } else { &[caps::WATCH] };
        caps::require(needs)?;
        let mut warnings: Vec<String> =
            super::others::check(enforce.enforce && !enforce.dry_run)?.into_iter().collect();
        let cgroups = crate::sources::processes::cgroup::resolve(&sel.cgroups, &sel.units)?;
        // --lab: the lab's process is the one to watch, its QUIC port the server port.
        let mut lab = if lab.lab { Some(LabChild::start(lab, lab_echo)?) } else { None };
        let mut sel = sel.clone();
        if let Some(l) = &lab {
            sel.pids.push(l.pid);
            sel.ports.push(PortRange { lo: l.server_port, hi: l.server_port });
        }
        let mode = Mode::from_selection(&sel.pids, &sel.comms, &cgroups)?;
        let enforcer = if enforce.enforce { Some(enforcement(enforce, &mode)?) } else { None };
        let quic =
            QuicOptions { ports: sel.ports.iter().flat_map(|r| r.ports()).collect(), ifaces: sel.ifaces.clone() };
        let decrypt = sel.decrypt.then(|| DecryptOptions { keylog_out: sel.keylog_out.clone() });
        let mut live =
            Live::start(mode.clone(), quic, decrypt.as_ref(), mono_now()).context("starting the kernel probes")?;
        if let Some(l) = lab.as_mut() {
            l.go();
        }
        if mode.filters() && live.pids.is_empty() {
            warnings.push(
                "no process matches the selection yet: watching for one (a process that starts later is picked up at its exec)"
                    .into(),
            );
        }
        let (pids, comms) = match &mode {
            Mode::Explicit { pids, comms, .. } => (pids.clone(), comms.clone()),
            Mode::Detected { comms } => (live.pids.iter().copied().collect(), comms.clone()),
            Mode::All => (Vec::new(), Vec::new()),
        };
        let start = StartInfo {
            pids,
            comms,
            cgroups,
            all_processes: !mode.filters(),
            stall_timeout_ms: options.stall_timeout_ms,
            probes: live.probe_status().to_vec(),
            blocked_writers: Some(crate::sources::processes::parked::METHOD.into()),
            send_path: Some(live.send_path_info()),
            quic: Some(live.quic_ports("start")),
            warnings,
            decrypt: live.decrypt_info(),
        };
        if let Some(d) = &start.decrypt {
            syslog(&format!(
                "--decrypt on: {}{}",
                d.summary(),
                d.keylog_out.as_deref().map(|p| format!("; secrets written to {p}")).unwrap_or_default()
            ));
        }
        // The same model a recording of this run replays with.
        let model = options.model();
        let mut pending = Vec::new();
        live.seed(mono_now(), &mut pending);
        let (api_tx, api) = std::sync::mpsc::channel();
        if let Some(url) = &sel.hysteria_api {
            hysteria_api::spawn_poller(url.clone(), sel.hysteria_secret.clone(), API_EVERY, api_tx.clone());
        }
        let mut clash =
            ClashApis { tx: api_tx, polled: HashSet::new(), tried: HashSet::new(), discover: !sel.no_clash_api };
        if let Some(url) = &sel.clash_api {
            clash.poll(clash_api::ClashApi { base: url.clone(), secret: sel.clash_secret.clone(), pid: None });
        }
        clash.discover(&live.pids);
        Ok(Pipeline {
            live,
            model,
            start,
            pending,
            lost_seen: 0,
            api,
            clash,
            enforcer,
            recorder: None,
            options,
            _lab: lab,
        })
    }

    /// Waits for kernel events and applies them to the model.
    pub async fn recv(&mut self) -> Result<()> {
        self.live.recv(&mut self.pending).await.context("reading kernel events")?;
        self.apply_pending()
    }

    /// Records (when recording) and applies what the sources saw.
    fn apply_pending(&mut self) -> Result<()> {
        for o in self.pending.drain(..) {
            if let Some(r) = self.recorder.as_mut() {
                r.obs(&o)?;
            }
            self.model.apply(o);
        }
        Ok(())
    }

    /// Starts recording the run into `path` (`hystall record`).
    pub fn record(&mut self, path: &std::path::Path, max_bytes: u64, keep: u32) -> Result<()> {
        let header = RecHeader {
            hystall_version: env!("CARGO_PKG_VERSION").into(),
            node: std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()).unwrap_or_default(),
            wall_offset_ns: crate::core::time::WallClock::now().offset_ns(),
            options: self.options.clone(),
            pids: self.start.pids.clone(),
            comms: self.start.comms.clone(),
            cgroups: self.start.cgroups.clone(),
            part: 0,
        };
        self.recorder = Some(Recorder::create(path, header, max_bytes, keep)?);
        Ok(())
    }

    /// Ends the recording: (bytes written over all parts, steps).
    pub fn finish_recording(&mut self) -> Result<Option<(u64, u64)>> {
        match self.recorder.take() {
            Some(r) => {
                let steps = r.steps;
                Ok(Some((r.finish()?, steps)))
            }
            None => Ok(None),
        }
    }

    /// One tick: polls the sources, judges, returns the events.
    pub fn tick(&mut self) -> Result<Vec<Stamped>> {
        let now: Mono = mono_now();
        let targets: Vec<u64> = self.model.sockets.targets().collect();
        // What the rings hold that did not wake us (the kernel wakes us only
        // for a batch).
        self.live.drain(&mut self.pending);
        self.live.poll(now, &self.model.sockets.wanted(now), &targets, &mut self.pending);
        self.clash.discover(&self.live.pids);
        self.pending.extend(self.api.try_iter());
        // Sockets whose close event was lost go as an observation, so a
        // recording replays the same.
        if let Some(cookies) = self.live.upkeep(now) {
            let gone = self.model.sockets.untracked(now, &cookies);
            if !gone.is_empty() {
                self.pending.push(Observation::SocketsGone { at: now, cookies: gone });
            }
        }
        self.apply_pending()?;
        if let Some(r) = self.recorder.as_mut() {
            r.tick(now, &self.model)?;
        }
        let lost = self.lost();
        if lost > self.lost_seen {
            tracing::warn!("{} kernel events lost (ring buffer full); verdicts may lag", lost - self.lost_seen);
            self.lost_seen = lost;
        }
        let mut events = self.model.tick(now);
        if let Some(info) = self.live.take_ports_change() {
            tracing::info!("QUIC server ports: {} ({})", info.summary(), info.reason);
            events.push(Stamped { at: now, event: Event::QuicPortsChanged(info) });
        }
        if self.live.decrypting() {
            // The next tick reads the frames of the suspects of this one.
            self.live.select_suspects(&crate::core::suspects::suspects(&self.model, now));
            if let Some(info) = self.live.take_decrypt_change() {
                syslog(&format!("--decrypt: {}", info.summary()));
                events.push(Stamped { at: now, event: Event::DecryptChanged(info) });
            }
        }
        // Bounded kernel flow map: the flows of closed connections go.
        let swept = std::mem::take(&mut self.model.swept_flows);
        if !swept.is_empty() {
            let gone = self.live.forget_flows(&swept);
            if !gone.is_empty() {
                self.pending.push(Observation::FlowsForgotten { at: now, flows: gone });
                self.apply_pending()?;
            }
        }
        if let Some((rule, hands)) = self.enforcer.as_mut() {
            for d in rule.decide(now, &self.model.sockets) {
                let outcome = hands.act(&d);
                let Some(s) = self.model.sockets.get(outcome.cookie) else { continue };
                let info = EnforcedInfo {
                    action: outcome.action,
                    dry_run: hands.dry_run,
                    result: outcome.result,
                    socket: s.info(now),
                };
                syslog(&format!(
                    "enforced: {} {} pid {} {} -> {} (blocked {} ms, unsent {:?} B, peer window {}): {}",
                    if info.dry_run { "dry-run" } else { info.action },
                    info.socket.comm,
                    info.socket.pid,
                    info.socket.local.as_deref().unwrap_or("?"),
                    info.socket.remote.as_deref().unwrap_or("?"),
                    info.socket.blocked_ms,
                    info.socket.unsent_bytes,
                    info.socket.peer_window,
                    info.result
                ));
                events.push(Stamped { at: now, event: Event::Enforced(info) });
            }
        }
        Ok(events)
    }

    /// `top`'s `D` key: destroys one socket by hand, after the user confirmed,
    /// under the same rule as `--enforce`: only a STALLED target socket (one the
    /// process connected), and only for real when not in --dry-run.
    pub fn destroy_by_hand(&mut self, cookie: u64) -> Option<Stamped> {
        let now = mono_now();
        let s = self.model.sockets.get(cookie)?;
        let info = s.info(now);
        let dry_run = self.enforcer.as_ref().is_some_and(|(_, h)| h.dry_run);
        let (action, result) = match (s.verdict, s.k.outbound, s.local(), s.remote()) {
            (crate::core::verdict::Verdict::Stalled, true, Some(local), Some(remote)) => {
                let d = crate::core::enforce::Decision::Destroy { cookie, pid: s.k.pid, local, remote };
                let outcome = match self.enforcer.as_mut() {
                    Some((_, hands)) => hands.act(&d),
                    None => match Executor::new(false) {
                        Ok(mut hands) => hands.act(&d),
                        Err(e) => crate::sinks::enforcer::Outcome {
                            cookie,
                            action: "destroy",
                            result: format!("failed: {e}"),
                        },
                    },
                };
                (outcome.action, outcome.result)
            }
            _ => ("refuse", "refused: only a STALLED target socket (connected by the process) can be destroyed".into()),
        };
        let info = EnforcedInfo { action, dry_run, result, socket: info };
        syslog(&format!(
            "destroy by hand (top): cookie {cookie} {} -> {}: {}",
            info.socket.local.as_deref().unwrap_or("?"),
            info.socket.remote.as_deref().unwrap_or("?"),
            info.result
        ));
        Some(Stamped { at: now, event: Event::Enforced(info) })
    }

    /// "observe", "enforce 10s" or "dry-run 10s", for the dashboard.
    pub fn mode(&self) -> String {
        let t = self.start.stall_timeout_ms as f64 / 1000.0;
        match &self.enforcer {
            None => "observe".into(),
            Some((_, h)) if h.dry_run => format!("dry-run {t}s"),
            Some(_) => format!("enforce {t}s"),
        }
    }

    /// Kernel events lost so far (ring buffers full: events, header samples,
    /// byte marks, TLS secrets). Packets not passed for decryption are not
    /// counted here: their budget drops them by design (see the metrics).
    pub fn lost(&self) -> u64 {
        use hystall_common::counter::{EVENTS_LOST, MARKS_LOST, SAMPLES_LOST, SECRETS_LOST};
        let c = self.live.counters();
        c[EVENTS_LOST as usize] + c[SAMPLES_LOST as usize] + c[MARKS_LOST as usize] + c[SECRETS_LOST as usize]
    }

    /// Kernel map entries lost so far: inserts into a full map, flows the
    /// LRU flow map evicted.
    pub fn evicted(&self) -> u64 {
        use hystall_common::counter::{FLOWS_FULL, MAP_FULL};
        let c = self.live.counters();
        c[MAP_FULL as usize] + c[FLOWS_FULL as usize] + self.live.flows_evicted()
    }

    /// Kernel events delivered so far.
    pub fn sent(&self) -> u64 {
        self.live.counters()[hystall_common::counter::EVENTS_SENT as usize]
    }
}

/// Checks that enforcement may start: an explicit selection or a detected
/// proxy, the privilege, and a working mechanism. Refuses clearly otherwise.
fn enforcement(args: &EnforceArgs, mode: &Mode) -> Result<(Enforcer, Executor)> {
    if !mode.filters() {
        anyhow::bail!(
            "--enforce needs --pid or --comm (or --cgroup, --unit, or a known proxy running): it will not close sockets of every process"
        );
    }
    if !args.dry_run {
        match crate::commands::doctor::destroy_works() {
            Ok(true) => {}
            Ok(false) | Err(_) if pidfd_works() => {}
            other => anyhow::bail!(
                "--enforce: neither SOCK_DESTROY nor pidfd_getfd works on this kernel ({}); nothing would be enforced",
                match other {
                    Err(e) => e.to_string(),
                    _ => "the test socket survived".into(),
                }
            ),
        }
    }
    let excludes = args
        .exclude
        .iter()
        .map(|e| Exclude::parse(e))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--exclude: {e}"))?;
    anyhow::ensure!(args.max_destroys_per_minute > 0, "--max-destroys-per-minute must be at least 1");
    let rule =
        Enforcer::new(EnforceConfig { dry_run: args.dry_run, max_per_minute: args.max_destroys_per_minute, excludes });
    let hands = Executor::new(args.dry_run).context("sock_diag for enforcement")?;
    Ok((rule, hands))
}

/// Whether pidfd_open works here (the fallback when SOCK_DESTROY is missing).
fn pidfd_works() -> bool {
    // SAFETY: pidfd_open on our own pid; the fd is closed at once.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) as libc::c_int;
        if fd >= 0 {
            libc::close(fd);
        }
        fd >= 0
    }
}

/// A future that ends after `secs` (never without).
pub async fn deadline(secs: Option<f64>) {
    match secs {
        Some(d) => tokio::time::sleep(Duration::from_secs_f64(d.max(0.0))).await,
        None => std::future::pending().await,
    }
}

/// The Clash APIs polled: the one given, and those found in the config of
/// each watched process (looked for once per process).
struct ClashApis {
    tx: std::sync::mpsc::Sender<Observation>,
    polled: HashSet<String>,
    tried: HashSet<u32>,
    discover: bool,
}

impl ClashApis {
    fn poll(&mut self, api: clash_api::ClashApi) {
        if self.polled.insert(api.base.clone()) {
            tracing::info!(base = %api.base, pid = ?api.pid, "polling the Clash API for exact attribution");
            clash_api::spawn_poller(api, CLASH_EVERY, self.tx.clone());
        }
    }

    /// Looks in the config of every watched process not looked at yet.
    fn discover(&mut self, pids: &HashSet<u32>) {
        if !self.discover {
            return;
        }
        for &pid in pids {
            if self.tried.insert(pid)
                && let Some(api) = clash_api::discover(pid)
            {
                self.poll(api);
            }
        }
    }
}
