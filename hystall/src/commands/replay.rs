//! `--replay FILE`: opens a recording or a capture as a timeline, and plays it
//! through the same model and detector as a live run.

use std::path::Path;

use anyhow::Result;

use super::watch::{emit, emit_all};
use crate::cli::Selection;
use crate::core::event::{Event, Stamped, StartInfo};
use crate::core::time::WallClock;
use crate::core::timeline::{ModelOptions, Player, Step};
use crate::sinks::lines::{Format, Lines};

/// A run to play back, whatever file it came from.
pub struct Timeline {
    /// What the header line says ("recording run.hrec (node n1, part 0)").
    pub title: String,
    pub wall: WallClock,
    pub options: ModelOptions,
    pub start: StartInfo,
    pub steps: Box<dyn Iterator<Item = Step>>,
    /// Called after the last step: warnings about the file (cut short, skipped packets…).
    pub warnings: Box<dyn FnMut() -> Vec<String>>,
}

pub fn open(path: &Path, keylog: Option<&Path>, sel: &Selection) -> Result<Timeline> {
    if crate::sources::captures::replay::is_recording(path) {
        let rec = crate::sources::captures::replay::open_recording(path)?;
        let h = &rec.header;
        let (err, truncated) = (rec.error.clone(), rec.truncated.clone());
        let name = path.display().to_string();
        return Ok(Timeline {
            title: format!("replay of {} (node {}, part {})", name, h.node, h.part),
            wall: WallClock::fixed(h.wall_offset_ns),
            options: h.options.clone(),
            start: StartInfo::offline(h.options.stall_timeout_ms, h.pids.clone(), h.comms.clone(), h.cgroups.clone()),
            steps: rec.steps,
            warnings: Box::new(move || {
                let mut w = Vec::new();
                if let Some(e) = err.borrow_mut().take() {
                    w.push(format!("{name}: {e}; the replay stops there"));
                }
                if *truncated.borrow() {
                    w.push(format!("{name}: the last frame is cut short (the recorder was stopped mid-write)"));
                }
                w
            }),
        });
    }
    // Otherwise a capture: judged with the command line's options.
    let options = super::model_options(sel.stall_timeout, sel.quic_idle, sel.stream_window, sel.conn_window)?;
    let quic_idle = std::time::Duration::from_millis(options.quic_idle_ms);
    let (conv, summary) = super::pcap::converter(path, keylog, &sel.ports, quic_idle)
        .map_err(|e| anyhow::anyhow!("{}: not a hystall recording, and as a capture: {e:#}", path.display()))?;
    let name = path.display().to_string();
    Ok(Timeline {
        title: format!("capture {name}"),
        wall: super::pcap::CAPTURE_CLOCK,
        options: options.clone(),
        start: StartInfo::offline(options.stall_timeout_ms, Vec::new(), Vec::new(), Vec::new()),
        steps: Box::new(conv),
        warnings: Box::new(move || {
            let s = summary.borrow();
            let mut w = Vec::new();
            if let Some(e) = &s.error {
                w.push(format!("{name}: {e}; the replay stops there"));
            }
            let skipped = s.stats.skipped_total();
            if skipped > 0 {
                w.push(format!("{name}: {skipped} packets skipped (see `hystall pcap` for why)"));
            }
            w
        }),
    })
}

/// `watch --replay FILE`: every event, as fast as the file reads.
pub fn watch(path: &Path, keylog: Option<&Path>, sel: &Selection, json: bool) -> Result<()> {
    let mut t = open(path, keylog, sel)?;
    let format = if json { Format::Json } else { Format::Text };
    let mut out = Lines::new(std::io::stdout().lock(), format, t.wall);
    let mut player = Player::new(t.options.model(), t.steps);
    let first = player.start.unwrap_or_default();
    if emit(&mut out, &Stamped { at: first, event: Event::WatchStarted(t.start.clone()) })? {
        return Ok(());
    }
    while let Some(at) = player.next_at() {
        if emit_all(&mut out, &player.advance_to(at))? {
            return Ok(());
        }
    }
    for w in (t.warnings)() {
        eprintln!("hystall: warning: {w}");
    }
    Ok(())
}
