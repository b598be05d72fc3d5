//! `hystall watch`: live events as lines.

use std::io::ErrorKind;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::signal::unix::{SignalKind, signal};

use super::lab_side::LabChild;
use crate::cli::WatchArgs;
use crate::core::detector::{DetectorConfig, Windows};
use crate::core::event::{Event, Stamped, StartInfo};
use crate::core::model::Model;
use crate::core::time::{Mono, WallClock, mono_now};
use crate::core::verdict::Thresholds;
use crate::sinks::lines::{Format, Lines};
use crate::sources::live::{Live, QuicOptions};
use crate::sources::procs::Mode;

/// How often verdicts are re-judged: the latency of `socket_stalled` after the
/// timeout expires is at most this.
const TICK: Duration = Duration::from_millis(200);

pub async fn run(args: WatchArgs) -> Result<()> {
    let sel = &args.select;
    anyhow::ensure!(
        sel.stall_timeout > 0.0 && sel.stall_timeout.is_finite(),
        "--stall-timeout must be a positive number of seconds"
    );
    // --lab: the lab's process is the one to watch, its QUIC port the server port.
    let lab = if args.lab.lab { Some(LabChild::start(&args.lab, !args.json)?) } else { None };
    let mut sel = sel.clone();
    if let Some(l) = &lab {
        sel.pids.push(l.pid);
        sel.ports.push(crate::cli::PortRange { lo: l.server_port, hi: l.server_port });
    }
    let sel = &sel;
    let mode = Mode::from_args(&sel.pids, &sel.comms)?;
    let th = Thresholds { stall_timeout: Duration::from_secs_f64(sel.stall_timeout), ..Thresholds::default() };
    // Handlers first: a SIGTERM right after start-up must still end the run
    // through the normal path (probes dropped, exit 0), not kill the process.
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let quic = QuicOptions { ports: sel.ports.iter().flat_map(|r| r.ports()).collect(), ifaces: sel.ifaces.clone() };
    let mut live = Live::start(mode.clone(), quic, mono_now()).context("starting the kernel probes")?;

    let clock = WallClock::now();
    let format = if args.json { Format::Json } else { Format::Text };
    let mut out = Lines::new(std::io::stdout().lock(), format, clock);
    let (pids, comms) = match &mode {
        Mode::Explicit { pids, comms } => (pids.clone(), comms.clone()),
        Mode::Detected { comms } => (live.pids.iter().copied().collect(), comms.clone()),
        Mode::All => (Vec::new(), Vec::new()),
    };
    let start = StartInfo {
        pids,
        comms,
        all_processes: !mode.filters(),
        stall_timeout_ms: th.stall_timeout.as_millis() as u64,
        probes: live.probe_status().to_vec(),
    };
    if emit(&mut out, &Stamped { at: mono_now(), event: Event::WatchStarted(start) })? {
        return Ok(());
    }

    anyhow::ensure!(
        sel.quic_idle > 0.0 && sel.quic_idle.is_finite(),
        "--quic-idle must be a positive number of seconds"
    );
    anyhow::ensure!(
        sel.stream_window > 0.0 && sel.conn_window > 0.0,
        "--stream-window and --conn-window must be positive (MiB)"
    );
    let windows =
        Windows { stream: (sel.stream_window * 1048576.0) as u64, conn: (sel.conn_window * 1048576.0) as u64 };
    let detector = DetectorConfig { windows, ..DetectorConfig::default() };
    let mut table = Model::new(th, Duration::from_secs_f64(sel.quic_idle), detector);
    let mut obs = Vec::new();
    live.seed(mono_now(), &mut obs);
    let mut tick = tokio::time::interval(TICK);
    let end = args.duration.map(|d| tokio::time::Instant::now() + Duration::from_secs_f64(d.max(0.0)));
    let deadline = async move {
        match end {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut lost_seen = 0;

    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = &mut deadline => break,
            r = live.recv(&mut obs) => { r.context("reading kernel events")?; }
            _ = tick.tick() => {
                let now: Mono = mono_now();
                live.poll(now, &table.sockets.wanted(now), &mut obs);
                for o in obs.drain(..) {
                    table.apply(o);
                }
                for e in table.tick(now) {
                    if emit(&mut out, &e)? {
                        return Ok(());
                    }
                }
                let lost = live.counters()[hystall_common::counter::EVENTS_LOST as usize];
                if lost > lost_seen {
                    tracing::warn!("{} kernel events lost (ring buffer full); verdicts may lag", lost - lost_seen);
                    lost_seen = lost;
                }
            }
        }
        // Apply ring events promptly too, without waiting for the tick.
        for o in obs.drain(..) {
            table.apply(o);
        }
    }
    // `live` drops here: programs detached, maps freed; then the lab is stopped.
    drop(live);
    drop(lab);
    Ok(())
}

/// Writes an event; returns true when stdout is gone (a closed pipe ends the run quietly).
fn emit<W: std::io::Write>(out: &mut Lines<W>, e: &Stamped) -> Result<bool> {
    match out.emit(e) {
        Ok(()) => Ok(false),
        Err(err) if err.kind() == ErrorKind::BrokenPipe => Ok(true),
        Err(err) => Err(err).context("writing to stdout"),
    }
}
