//! `hystall pcap FILE`: a capture judged by the same model and detector as a
//! live node (sources/captures/offline rebuilds what the probes would have seen), then
//! a report, JSON lines like `watch`, and a picture of the timeline.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Write as _};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::cli::{PcapArgs, PortRange};
use crate::core::event::{Event, SCHEMA_VERSION, Stamped, StartInfo};
use crate::core::flows::FlowId;
use crate::core::model::conn_info;
use crate::core::quic::KeyLog;
use crate::core::series::Series;
use crate::core::time::{Mono, WallClock};
use crate::core::timeline::{ModelOptions, Player};
use crate::sinks::lines::{Format, Lines};
use crate::sinks::report::{self, ConnReport, DecryptFigures, Report};
use crate::sources::captures::capture::CaptureReader;
use crate::sources::captures::offline::{self, BUCKET, Converter, Summary};

/// Capture time is Unix time: Mono values are Unix nanoseconds.
pub const CAPTURE_CLOCK: WallClock = WallClock::fixed(0);

/// A capture being read as a timeline, and what its reading learns.
pub type CaptureSource = (Converter<BufReader<File>>, Rc<RefCell<Summary>>);

/// Opens a capture as a timeline source.
pub fn converter(
    path: &Path,
    keylog: Option<&Path>,
    ports: &[PortRange],
    quic_idle: Duration,
) -> Result<CaptureSource> {
    let keylog = match keylog {
        Some(k) => {
            let text = std::fs::read(k).with_context(|| format!("reading the key log {}", k.display()))?;
            Some(KeyLog::parse(&String::from_utf8_lossy(&text)))
        }
        None => None,
    };
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let reader = CaptureReader::new(BufReader::with_capacity(1 << 20, file))?;
    let conv = Converter::new(reader, offline::Options { ports: ports.to_vec(), keylog, quic_idle });
    let summary = conv.summary.clone();
    Ok((conv, summary))
}

pub fn options(args: &PcapArgs) -> Result<ModelOptions> {
    super::model_options(args.stall_timeout, args.quic_idle, args.stream_window, args.conn_window)
}

pub fn run(args: PcapArgs) -> Result<()> {
    let opts = options(&args)?;
    let (conv, summary) =
        converter(&args.file, args.keylog.as_deref(), &args.ports, Duration::from_millis(opts.quic_idle_ms))?;
    let report = analyse(&args.file.display().to_string(), conv, summary, &opts);
    if let Some(svg) = &args.svg {
        std::fs::write(svg, crate::sinks::svg::render(&report))
            .with_context(|| format!("writing {}", svg.display()))?;
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let res = if args.json {
        json(&mut out, &report, &opts)
    } else {
        write!(out, "{}", report::text(&report, &CAPTURE_CLOCK))
    };
    match res {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// Plays the capture through the model; the report.
pub fn analyse<I: Iterator<Item = crate::core::timeline::Step>>(
    file: &str,
    steps: I,
    summary: Rc<RefCell<Summary>>,
    opts: &ModelOptions,
) -> Report {
    let mut player = Player::new(opts.model(), steps);
    let mut events = Vec::new();
    // Every connection a 5-tuple carried (a client port can be reused).
    let mut flow_conn: HashMap<FlowId, Vec<u64>> = HashMap::new();
    let mut conns: HashMap<u64, ConnReport> = HashMap::new();
    let mut next_snap = Mono::ZERO;
    while let Some(at) = player.next_at() {
        events.extend(player.advance_to(at));
        if at >= next_snap {
            snapshot(&player.model, &mut flow_conn, &mut conns);
            next_snap = Mono(at.0 + 1_000_000_000);
        }
    }
    snapshot(&player.model, &mut flow_conn, &mut conns);
    let s = summary.borrow();
    let start = s.start.unwrap_or_default();
    let mut verdicts = report::verdicts(&events);
    for c in conns.values_mut() {
        c.verdict = verdicts.remove(&c.conn);
    }
    // Per connection: its flows' series, and what decryption found.
    let bucket_ns = BUCKET.as_nanos() as u64;
    let bucket_of = |t: Mono| (t.since(start).as_nanos() as u64 / bucket_ns) as usize;
    for (flow, series) in &s.series {
        let ids = flow_conn.get(flow).map(Vec::as_slice).unwrap_or_default();
        for id in ids {
            let Some(c) = conns.get_mut(id) else { continue };
            // A reused 5-tuple: each connection takes the buckets of its own lifetime.
            let (from, to) = if ids.len() > 1 { (bucket_of(c.first), bucket_of(c.last)) } else { (0, usize::MAX) };
            for (i, b) in series.iter().filter(|(i, _)| (from..=to).contains(i)) {
                let cell = c.series.at(i);
                for k in 0..4 {
                    cell[k] = cell[k].saturating_add(b[k]);
                }
            }
        }
    }
    for d in &s.decrypted {
        // The connection (of the flow's) whose lifetime holds the decryptor's traffic.
        let Some(c) = d
            .flows
            .iter()
            .filter_map(|f| flow_conn.get(f))
            .flatten()
            .max_by_key(|id| {
                conns.get(id).map_or(0, |c| {
                    let (from, to) = (bucket_of(c.first), bucket_of(c.last));
                    d.series.iter().filter(|(i, _)| (from..=to).contains(i)).count()
                })
            })
            .copied()
            .and_then(|id| conns.get_mut(&id))
        else {
            continue;
        };
        // Several decryptors on one connection (a client restarting on one port): the busiest wins.
        if c.decrypt.as_ref().is_some_and(|x| x.opened >= d.stats.opened) {
            continue;
        }
        c.frames = d.secrets_found.then(|| d.frames.clone());
        c.stream_series = d.secrets_found.then(|| d.series.clone());
        c.decrypt = Some(DecryptFigures {
            opened: d.stats.opened,
            auth_failed: d.stats.auth_failed,
            no_keys: d.stats.no_keys,
            secrets_found: d.secrets_found,
            key_updates: d.stats.key_updates,
        });
    }
    let quiet_for = Duration::from_millis(opts.stall_timeout_ms);
    for c in conns.values_mut() {
        c.gaps = gaps(&c.series, start, bucket_ns);
        if c.verdict.is_none() && c.frames.is_none() {
            c.note = headers_only_note(&c.series, quiet_for, BUCKET);
        }
    }
    let mut conns: Vec<ConnReport> = conns.into_values().collect();
    // Starved first, then by first packet.
    conns.sort_by_key(|c| (c.verdict.is_none(), c.first, c.conn));
    Report {
        file: file.to_owned(),
        start,
        end: s.end.unwrap_or_default(),
        packets: s.stats.packets,
        udp: s.stats.udp,
        tcp: s.stats.tcp,
        skipped: s.stats.skipped.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        unplaced_udp: s.unplaced_udp,
        gso_split: s.gso_split,
        time_jumps: s.time_jumps,
        servers: s.servers.iter().map(ToString::to_string).collect(),
        keylog_entries: s.keylog_entries,
        keylog_skipped: s.keylog_skipped,
        error: s.error.clone(),
        bucket_secs: BUCKET.as_secs_f64(),
        conns,
        events,
    }
}

fn snapshot(
    model: &crate::core::model::Model,
    flow_conn: &mut HashMap<FlowId, Vec<u64>>,
    conns: &mut HashMap<u64, ConnReport>,
) {
    for c in model.conns.iter().filter(|c| c.opened_reported) {
        for f in &c.flows {
            let ids = flow_conn.entry(*f).or_default();
            if !ids.contains(&c.id) {
                ids.push(c.id);
            }
        }
        let info = conn_info(c);
        let r = conns.entry(c.id).or_default();
        r.conn = c.id;
        r.client = info.client.unwrap_or_default();
        r.server = info.server.unwrap_or_default();
        r.dcid = info.dcid;
        r.grouping = info.grouping.to_owned();
        r.hops = info.hops;
        r.first = c.first_seen;
        r.last = c.last_seen;
        r.c2s_bytes = info.c2s_bytes;
        r.s2c_bytes = info.s2c_bytes;
    }
}

/// Without keys or targets a stop of the client's bulk while the connection
/// lives on is either starvation or an idle client: headers cannot tell, and
/// the report says so rather than guess.
fn headers_only_note(series: &Series<[u32; 4]>, quiet_for: Duration, bucket: Duration) -> Option<String> {
    let last_bulk = series.iter().filter(|(_, b)| b[0] > 0).map(|(i, _)| i).last()?;
    let last_any = series.iter().filter(|(_, b)| b[1] > 0 || b[3] > 0).map(|(i, _)| i).last()?;
    let alive = bucket * (last_any.saturating_sub(last_bulk) as u32);
    (alive >= quiet_for).then(|| {
        format!(
            "the client's bulk stopped around +{:.2}s and the connection stayed alive {:.1} s more: starved or an idle \
             client, which headers alone cannot tell apart; what would tell: the TLS key log (--keylog), or a capture \
             on the server that holds the targets' TCP",
            (bucket * last_bulk as u32).as_secs_f64(),
            alive.as_secs_f64()
        )
    })
}

/// Runs of at least a second without a packet either way, between the first and last packet.
fn gaps(series: &Series<[u32; 4]>, start: Mono, bucket_ns: u64) -> Vec<(Mono, f64)> {
    let busy: Vec<usize> = series.iter().filter(|(_, b)| b.iter().any(|&x| x > 0)).map(|(i, _)| i).collect();
    busy.windows(2)
        .filter(|w| (w[1] - w[0] - 1) as u64 * bucket_ns >= 1_000_000_000)
        .map(|w| {
            let from = Mono(start.0.saturating_add((w[0] + 1) as u64 * bucket_ns));
            (from, (w[1] - w[0] - 1) as f64 * bucket_ns as f64 / 1e9)
        })
        .collect()
}

fn json(out: &mut impl std::io::Write, r: &Report, opts: &ModelOptions) -> std::io::Result<()> {
    let mut lines = Lines::new(&mut *out, Format::Json, CAPTURE_CLOCK);
    let start = StartInfo::offline(opts.stall_timeout_ms, Vec::new(), Vec::new(), Vec::new());
    lines.emit(&Stamped { at: r.start, event: Event::WatchStarted(start) })?;
    for e in &r.events {
        lines.emit(e)?;
    }
    let conns: Vec<serde_json::Value> = r
        .conns
        .iter()
        .map(|c| {
            serde_json::json!({
                "conn": c.conn, "client": c.client, "server": c.server, "dcid": c.dcid, "hops": c.hops,
                "c2s_bytes": c.c2s_bytes, "s2c_bytes": c.s2c_bytes,
                "starved": c.verdict.as_ref().map(|v| serde_json::json!({
                    "confidence": v.confidence,
                    "since": CAPTURE_CLOCK.rfc3339(v.since),
                    "since_s": v.since.since(r.start).as_secs_f64(),
                    "recovered": v.recovered.as_ref().map(|(t, why)| serde_json::json!({"at": CAPTURE_CLOCK.rfc3339(*t), "reason": why})),
                    "targets": v.targets,
                })),
                "frames": c.frames,
                "decrypt": c.decrypt,
                "verdict": c.verdict_word(),
                "note": c.note,
                "gaps": c.gaps.iter().map(|(t, s)| serde_json::json!({"from_s": t.since(r.start).as_secs_f64(), "secs": s})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let summary = serde_json::json!({
        "v": SCHEMA_VERSION,
        "ts": CAPTURE_CLOCK.rfc3339(r.end),
        "event": "pcap_summary",
        "file": r.file,
        "start": CAPTURE_CLOCK.rfc3339(r.start),
        "duration_s": r.end.since(r.start).as_secs_f64(),
        "packets": r.packets, "udp": r.udp, "tcp": r.tcp,
        "skipped": r.skipped.iter().map(|(k, v)| serde_json::json!({"reason": k, "count": v})).collect::<Vec<_>>(),
        "unplaced_udp": r.unplaced_udp,
        "gso_split": r.gso_split,
        "servers": r.servers,
        "keylog_entries": r.keylog_entries,
        "error": r.error,
        "conns": conns,
    });
    writeln!(out, "{summary}")
}
