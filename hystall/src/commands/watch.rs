//! `hystall watch`: live events as lines (text or JSON).

use std::io::ErrorKind;

use anyhow::{Context as _, Result};
use tokio::signal::unix::{SignalKind, signal};

use super::metrics::Metrics;
use super::pipeline::{Pipeline, TICK, deadline};
use crate::cli::WatchArgs;
use crate::core::event::{Event, Stamped};
use crate::core::time::{WallClock, mono_now};
use crate::sinks::lines::{Format, Lines};

pub async fn run(args: WatchArgs) -> Result<()> {
    if let Some(file) = &args.replay.file {
        return super::replay::watch(file, args.replay.keylog.as_deref(), &args.select, args.json);
    }
    run_live(args, None).await
}

/// `hystall record`: where the recording goes.
pub struct RecordTo<'a> {
    pub path: &'a std::path::Path,
    pub max_bytes: u64,
    pub keep: u32,
}

/// Watches live, optionally recording the run.
pub async fn run_live(args: WatchArgs, record: Option<RecordTo<'_>>) -> Result<()> {
    // Handlers first: a SIGTERM right after start-up must still end the run
    // through the normal path (probes dropped, exit 0), not kill the process.
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut metrics = Metrics::start(args.metrics)?;
    let mut p = Pipeline::start(&args.select, &args.lab, &args.enforce, !args.json)?;
    if let Some(r) = &record {
        p.record(r.path, r.max_bytes, r.keep)?;
    }

    let format = if args.json { Format::Json } else { Format::Text };
    let mut out = Lines::new(std::io::stdout().lock(), format, WallClock::now());
    let started = Stamped { at: mono_now(), event: Event::WatchStarted(p.start.clone()) };
    if let Some(m) = metrics.as_mut() {
        m.update(&p, std::slice::from_ref(&started));
    }
    if emit(&mut out, &started)? {
        return Ok(());
    }
    let mut tick = tokio::time::interval(TICK);
    let end = deadline(args.duration);
    tokio::pin!(end);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = &mut end => break,
            r = p.recv() => r?,
            _ = tick.tick() => {
                let events = p.tick()?;
                if let Some(m) = metrics.as_mut() {
                    m.update(&p, &events);
                }
                if emit_all(&mut out, &events)? {
                    return finish(&mut p, &record);
                }
            }
        }
    }
    finish(&mut p, &record)
    // `p` drops here: programs detached, maps freed, then the lab stopped.
}

fn finish(p: &mut Pipeline, record: &Option<RecordTo<'_>>) -> Result<()> {
    if let (Some((bytes, steps)), Some(r)) = (p.finish_recording()?, record) {
        eprintln!("hystall: recorded {steps} steps, {bytes} bytes, to {}", r.path.display());
    }
    Ok(())
}

/// Writes an event; returns true when stdout is gone (a closed pipe ends the run quietly).
pub(super) fn emit<W: std::io::Write>(out: &mut Lines<W>, e: &Stamped) -> Result<bool> {
    emit_all(out, std::slice::from_ref(e))
}

/// Writes a tick's events, as [`emit`].
pub(super) fn emit_all<W: std::io::Write>(out: &mut Lines<W>, events: &[Stamped]) -> Result<bool> {
    match out.emit_all(events) {
        Ok(()) => Ok(false),
        Err(err) if err.kind() == ErrorKind::BrokenPipe => Ok(true),
        Err(err) => Err(err).context("writing to stdout"),
    }
}
