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
use crate::core::event::Stamped;
use crate::core::time::{Mono, WallClock, mono_now};
use crate::core::timeline::{Player, Step};
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

/// What the dashboard shows: the live node, or a file played back.
enum Feed {
    Live(Box<Pipeline>),
    Replay(Box<ReplayFeed>),
}

/// A timeline played in its own time, `speed` times as fast as recorded.
struct ReplayFeed {
    player: Player<Box<dyn Iterator<Item = Step>>>,
    title: String,
    started: Instant,
    speed: f64,
    ended: bool,
    warnings: Box<dyn FnMut() -> Vec<String>>,
}

impl Feed {
    async fn recv(&mut self) -> Result<()> {
        match self {
            Feed::Live(p) => p.recv().await,
            Feed::Replay(_) => std::future::pending().await,
        }
    }

    fn tick(&mut self) -> Result<Vec<Stamped>> {
        match self {
            Feed::Live(p) => p.tick(),
            Feed::Replay(r) => {
                let t0 = r.player.start.unwrap_or_default();
                let target = if r.speed <= 0.0 {
                    Mono(u64::MAX)
                } else {
                    Mono(t0.0.saturating_add((r.started.elapsed().as_secs_f64() * r.speed * 1e9) as u64))
                };
                // Bounded per tick: keys and redraws stay live on a big file.
                let events = r.player.advance(target, 20_000);
                if !r.ended && r.player.next_at().is_none() {
                    r.ended = true;
                    for w in (r.warnings)() {
                        tracing::warn!("{w}");
                    }
                }
                Ok(events)
            }
        }
    }

    fn now(&self) -> Mono {
        match self {
            Feed::Live(_) => mono_now(),
            Feed::Replay(r) => r.player.now,
        }
    }

    fn model(&self) -> &crate::core::model::Model {
        match self {
            Feed::Live(p) => &p.model,
            Feed::Replay(r) => &r.player.model,
        }
    }

    fn sent(&self) -> u64 {
        match self {
            Feed::Live(p) => p.sent(),
            Feed::Replay(_) => 0,
        }
    }
}

pub async fn run(args: TopArgs) -> Result<()> {
    let mut term_sig = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int_sig = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut metrics = Metrics::start(args.metrics)?;
    // Probes (or the file) first: their errors are printed on a normal terminal.
    let (mut feed, clock) = match &args.replay.file {
        None => {
            (Feed::Live(Box::new(Pipeline::start(&args.select, &args.lab, &args.enforce, false)?)), WallClock::now())
        }
        Some(file) => {
            anyhow::ensure!(args.speed >= 0.0 && args.speed.is_finite(), "--speed must be 0 or more");
            let t = super::replay::open(file, args.replay.keylog.as_deref(), &args.select)?;
            let player = Player::new(t.options.model(), t.steps);
            let feed = ReplayFeed {
                player,
                title: t.title,
                started: Instant::now(),
                speed: args.speed,
                ended: false,
                warnings: t.warnings,
            };
            (Feed::Replay(Box::new(feed)), t.wall)
        }
    };
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let mut tui = Tui::new(no_color);

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
    let (mut rate_at, mut rate_sent, mut events_per_sec) = (Instant::now(), feed.sent(), 0.0);

    loop {
        tokio::select! {
            _ = term_sig.recv() => break,
            _ = int_sig.recv() => break,
            _ = &mut end => break,
            r = feed.recv() => r?,
            _ = tick.tick() => {
                let events = feed.tick()?;
                if let Some(m) = metrics.as_mut()
                    && let Feed::Live(p) = &feed
                {
                    m.update(p, &events);
                }
                for e in &events {
                    if let crate::core::event::Event::Enforced(x) = &e.event {
                        let what = if x.dry_run { "would destroy".to_owned() } else { x.result.clone() };
                        tui.set_action(x.socket.cookie, &what);
                    }
                }
                tui.observe(feed.model(), feed.now(), &events, &clock);
            }
            _ = redraw.tick() => {
                let dt = rate_at.elapsed().as_secs_f64();
                if dt >= 1.0 {
                    let sent = feed.sent();
                    events_per_sec = (sent - rate_sent) as f64 / dt;
                    (rate_at, rate_sent) = (Instant::now(), sent);
                }
                tui.set_header(match &feed {
                    Feed::Live(p) => header(p, &node, events_per_sec, args.refresh),
                    Feed::Replay(r) => replay_header(r, &clock, args.refresh),
                });
                let now = feed.now();
                terminal.draw(|f| tui.draw(f, feed.model(), now)).context("drawing")?;
            }
            Some(ev) = keys.recv() => {
                match ev {
                    TermEvent::Key(k) if k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL) => break,
                    TermEvent::Key(k) => {
                        if !tui.key(k) {
                            break;
                        }
                        if let Some(cookie) = tui.take_destroy_request()
                            && let Feed::Live(p) = &mut feed
                            && let Some(ev) = p.destroy_by_hand(cookie)
                        {
                            if let crate::core::event::Event::Enforced(x) = &ev.event {
                                tui.set_action(cookie, &x.result);
                            }
                            if let Some(m) = metrics.as_mut() {
                                m.update(p, std::slice::from_ref(&ev));
                            }
                            tui.observe(&p.model, mono_now(), &[ev], &clock);
                        }
                        let now = feed.now();
                        terminal.draw(|f| tui.draw(f, feed.model(), now)).context("drawing")?;
                    }
                    TermEvent::Mouse(m) => tui.mouse(m),
                    TermEvent::Resize(..) => {
                        let now = feed.now();
                        terminal.draw(|f| tui.draw(f, feed.model(), now)).context("drawing")?;
                    }
                    _ => {}
                }
            }
        }
    }
    // Drop order: the terminal is restored (guard), then the probes detached (feed).
    Ok(())
}

/// At most three entries, then how many more: the header has one line for it.
fn short_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<&str> = items.collect();
    match all.len() {
        0..=3 => all.join(","),
        n => format!("{} (+{} more)", all[..3].join(","), n - 3),
    }
}

/// The header of a replay: the file, the position in it, the speed.
fn replay_header(r: &ReplayFeed, clock: &WallClock, refresh_ms: u64) -> Header {
    let at = r.player.now;
    let pos = at.since(r.player.start.unwrap_or(at)).as_secs_f64();
    let state = if r.ended { "ended".to_owned() } else { format!("x{}", r.speed) };
    Header {
        node: r.title.clone(),
        processes: Vec::new(),
        probes_attached: Vec::new(),
        probes_degraded: Vec::new(),
        probes_on_demand: Vec::new(),
        send_path: String::new(),
        quic_ports: String::new(),
        quic_note: None,
        events_per_sec: 0.0,
        events_lost: 0,
        evicted: 0,
        mode: format!("replay +{pos:.1}s {state} ({})", &clock.rfc3339(at)[..19]),
        refresh_ms,
        decrypt: None,
    }
}

fn header(p: &Pipeline, node: &str, events_per_sec: f64, refresh_ms: u64) -> Header {
    use crate::sources::kernel::probes::is_waiting;
    let status = p.live.probe_status();
    let quic = p.live.quic_ports("now");
    let mut processes: Vec<(u32, String)> = p
        .live
        .pids
        .iter()
        .map(|&pid| (pid, crate::sources::processes::procs::comm_of(pid).unwrap_or_default()))
        .collect();
    processes.sort();
    Header {
        node: node.to_owned(),
        processes,
        probes_attached: status.iter().filter(|s| s.attached).map(|s| s.name.clone()).collect(),
        probes_degraded: status
            .iter()
            .filter(|s| !s.attached && !is_waiting(s))
            .map(|s| (s.name.clone(), s.note.clone().unwrap_or_default()))
            .collect(),
        probes_on_demand: status.iter().filter(|s| is_waiting(s)).map(|s| s.name.clone()).collect(),
        send_path: p.live.send_path_info().path,
        quic_ports: short_list(quic.ports.iter().map(|p| p.port.as_str())),
        quic_note: quic.note,
        events_per_sec,
        events_lost: p.lost(),
        evicted: p.evicted(),
        mode: p.mode(),
        refresh_ms,
        decrypt: p.live.decrypt_info().map(|d| {
            let read = d.processes.iter().filter(|p| !p.functions.is_empty()).count();
            format!("{read} server(s), {} handshakes, {} tied, {} read", d.handshakes, d.tied, d.selected)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::short_list;

    #[test]
    fn the_header_names_three_ports_then_counts_the_rest() {
        assert_eq!(short_list(std::iter::empty()), "");
        assert_eq!(short_list(["443", "20000-20010"].into_iter()), "443,20000-20010");
        assert_eq!(short_list(["1", "2", "3", "4", "5"].into_iter()), "1,2,3 (+2 more)");
    }
}
