//! `hystall top`: the live dashboard. The pipeline is `watch`'s; the sink is
//! the terminal UI (`sinks::tui`), which knows nothing of the kernel.
//!
//! The terminal is restored however the run ends: quit key, Ctrl-C (a key in
//! raw mode), SIGTERM, --duration, an error, or a panic (the hook restores it
//! before the panic message is printed). The probes are detached when the
//! pipeline drops, in every one of those paths but a panic that aborts.

use std::io::{Stdout, stdout};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{
    self, DisableMouseCapture, EnableMouseCapture, Event as TermEvent, KeyCode, KeyModifiers,
};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::metrics::Metrics;
use super::pipeline::{Pipeline, TICK, deadline};
use crate::cli::TopArgs;
use crate::core::time::{WallClock, mono_now};
use crate::sinks::tui::{Header, Tui};

/// Raw mode, alternate screen and mouse capture, undone on drop.
struct TermGuard;

impl TermGuard {
    fn enter() -> Result<TermGuard> {
        enable_raw_mode().context("the terminal cannot enter raw mode (is this a terminal?)")?;
        execute!(stdout(), EnterAlternateScreen, EnableMouseCapture).context("setting up the terminal")?;
        // A panic restores the terminal before its message is printed.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        Ok(TermGuard)
    }
}

fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(stdout(), LeaveAlternateScreen, DisableMouseCapture);
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        restore();
    }
}

pub async fn run(args: TopArgs) -> Result<()> {
    let mut term_sig = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int_sig = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    // Probes first: their errors are printed on a normal terminal.
    let mut metrics = Metrics::start(args.metrics)?;
    let mut p = Pipeline::start(&args.select, &args.lab, &args.enforce, false)?;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let mut tui = Tui::new(no_color);
    let clock = WallClock::now();

    let _guard = TermGuard::enter()?;
    let mut terminal: Terminal<CrosstermBackend<Stdout>> =
        Terminal::new(CrosstermBackend::new(stdout())).context("opening the terminal")?;
    terminal.clear().ok();

    // Terminal input on a thread of its own (crossterm's read blocks).
    let (keys_tx, mut keys) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while let Ok(ev) = event::read() {
            if keys_tx.send(ev).is_err() {
                break;
            }
        }
    });

    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()).unwrap_or_default();
    let refresh = Duration::from_millis(args.refresh);
    let mut tick = tokio::time::interval(TICK);
    let mut redraw = tokio::time::interval(refresh);
    let end = deadline(args.duration);
    tokio::pin!(end);
    let (mut rate_at, mut rate_sent, mut events_per_sec) = (Instant::now(), p.sent(), 0.0);

    loop {
        tokio::select! {
            _ = term_sig.recv() => break,
            _ = int_sig.recv() => break,
            _ = &mut end => break,
            r = p.recv() => r?,
            _ = tick.tick() => {
                let events = p.tick();
                if let Some(m) = metrics.as_mut() {
                    m.update(&p, &events);
                }
                for e in &events {
                    if let crate::core::event::Event::Enforced(x) = &e.event {
                        let what = if x.dry_run { "would destroy".to_owned() } else { x.result.clone() };
                        tui.set_action(x.socket.cookie, &what);
                    }
                }
                tui.observe(&p.model, mono_now(), &events, &clock);
            }
            _ = redraw.tick() => {
                let dt = rate_at.elapsed().as_secs_f64();
                if dt >= 1.0 {
                    let sent = p.sent();
                    events_per_sec = (sent - rate_sent) as f64 / dt;
                    (rate_at, rate_sent) = (Instant::now(), sent);
                }
                tui.set_header(header(&p, &node, events_per_sec, args.refresh));
                let now = mono_now();
                terminal.draw(|f| tui.draw(f, &p.model, now)).context("drawing")?;
            }
            Some(ev) = keys.recv() => {
                match ev {
                    TermEvent::Key(k) if k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL) => break,
                    TermEvent::Key(k) => {
                        if !tui.key(k) {
                            break;
                        }
                        if let Some(cookie) = tui.take_destroy_request()
                            && let Some(ev) = p.destroy_by_hand(cookie)
                        {
                            if let crate::core::event::Event::Enforced(x) = &ev.event {
                                tui.set_action(cookie, &x.result);
                            }
                            if let Some(m) = metrics.as_mut() {
                                m.update(&p, std::slice::from_ref(&ev));
                            }
                            tui.observe(&p.model, mono_now(), &[ev], &clock);
                        }
                        let now = mono_now();
                        terminal.draw(|f| tui.draw(f, &p.model, now)).context("drawing")?;
                    }
                    TermEvent::Mouse(m) => tui.mouse(m),
                    TermEvent::Resize(..) => {
                        let now = mono_now();
                        terminal.draw(|f| tui.draw(f, &p.model, now)).context("drawing")?;
                    }
                    _ => {}
                }
            }
        }
    }
    // Drop order: the terminal is restored (guard), then the probes detached (p).
    Ok(())
}

fn header(p: &Pipeline, node: &str, events_per_sec: f64, refresh_ms: u64) -> Header {
    let status = p.live.probe_status();
    let mut processes: Vec<(u32, String)> =
        p.live.pids.iter().map(|&pid| (pid, crate::sources::procs::comm_of(pid).unwrap_or_default())).collect();
    processes.sort();
    Header {
        node: node.to_owned(),
        processes,
        probes_attached: status.iter().filter(|s| s.attached).map(|s| s.name.clone()).collect(),
        probes_degraded: status
            .iter()
            .filter(|s| !s.attached)
            .map(|s| (s.name.clone(), s.note.clone().unwrap_or_default()))
            .collect(),
        events_per_sec,
        events_lost: p.lost(),
        mode: p.mode(),
        refresh_ms,
    }
}
