//! A capture as a timeline (`hystall pcap`, `--replay FILE.pcap`): what the
//! live probes would have seen, rebuilt from packets, so the same model and
//! detector judge it.
//!
//! - [`udp`]: the TC classifier's counters and header samples, QUIC server
//!   endpoints learned from handshakes (or `--port`), GSO super-packets split;
//! - [`tcp`]: TCP connections as sockets of their connecting side (a target
//!   that stops reading shows as a zero window and a frozen ACK);
//! - [`quic`]: with a key log, decrypted frames per QUIC connection.
//!
//! Time is capture time (Unix nanoseconds as `Mono`); ticks every 200 ms of it,
//! as live, except past the first [`MAX_GAP`] of a quiet gap. Packets out of order by a few ms (several interfaces) are taken at
//! the latest time seen.

pub mod quic;
pub mod tcp;
pub mod udp;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::rc::Rc;
use std::time::Duration;

use crate::cli::PortRange;
use crate::core::flows::{Dir, FlowId};
use crate::core::frames::FrameSample;
use crate::core::observation::Observation;
use crate::core::quic::KeyLog;
use crate::core::time::Mono;
use crate::core::timeline::Step;
use crate::sources::captures::capture::{CaptureError, CaptureReader, L4, Record, Stats};

/// Ticks of the model, as live (commands/pipeline.rs TICK).
pub const TICK: Duration = Duration::from_millis(200);
/// The part of a quiet gap that is ticked through: every verdict and close a gap
/// can bring comes within it (stall timeouts and the QUIC idle time are shorter).
pub const MAX_GAP: Duration = Duration::from_secs(600);
/// A record this far ahead of the previous one has a corrupt timestamp.
pub const MAX_JUMP: Duration = Duration::from_secs(24 * 3600);
/// Width of the timeline's buckets (report and picture).
pub const BUCKET: Duration = Duration::from_millis(250);
/// Buckets kept over all flows (16 bytes each: 64 MiB); past it the picture
/// and gaps stop, the verdicts do not.
pub const MAX_BUCKETS: usize = 4 << 20;

pub struct Options {
    /// Server ports, besides those learned from handshakes.
    pub ports: Vec<PortRange>,
    pub keylog: Option<KeyLog>,
    /// Flows idle this long are no longer polled (the model closes them).
    pub quic_idle: Duration,
}

/// Per flow and bucket: bytes [c2s full-size, c2s other, s2c full-size, s2c other].
pub type Buckets = crate::core::series::Series<[u32; 4]>;

/// What the conversion learned, for the report (filled as it goes).
#[derive(Default)]
pub struct Summary {
    pub start: Option<Mono>,
    pub end: Option<Mono>,
    pub stats: Stats,
    pub error: Option<String>,
    pub series: HashMap<FlowId, Buckets>,
    /// Records whose time jumped more than MAX_JUMP ahead (taken at the last time).
    pub time_jumps: u64,
    /// Buckets stored over all series; `series_full` once MAX_BUCKETS is reached.
    pub buckets: usize,
    pub series_full: bool,
    pub decrypted: Vec<quic::Decrypted>,
    pub keylog_entries: usize,
    pub keylog_skipped: usize,
    pub keylog_in_capture: u64,
    pub unplaced_udp: u64,
    pub unplaced_pairs: usize,
    pub gso_split: u64,
    pub tcp_segments: u64,
    pub frame_errors: u64,
    pub servers: Vec<std::net::SocketAddr>,
}

pub struct Converter<R: Read> {
    reader: CaptureReader<R>,
    udp: udp::UdpFlows,
    tcp: tcp::TcpTable,
    dec: Option<quic::Decryptors>,
    quic_idle: Duration,
    queue: VecDeque<Step>,
    next_tick: Option<Mono>,
    last: Mono,
    owners_sent: usize,
    pub summary: Rc<RefCell<Summary>>,
    done: bool,
}

impl<R: Read> Converter<R> {
    pub fn new(reader: CaptureReader<R>, opts: Options) -> Self {
        let summary = Summary {
            keylog_entries: opts.keylog.as_ref().map_or(0, KeyLog::len),
            keylog_skipped: opts.keylog.as_ref().map_or(0, KeyLog::skipped),
            ..Default::default()
        };
        Converter {
            reader,
            udp: udp::UdpFlows::new(opts.ports),
            tcp: tcp::TcpTable::default(),
            dec: opts.keylog.map(quic::Decryptors::new),
            quic_idle: opts.quic_idle,
            queue: VecDeque::new(),
            next_tick: None,
            last: Mono::ZERO,
            owners_sent: 0,
            summary: Rc::new(RefCell::new(summary)),
            done: false,
        }
    }

    fn bucket(&self, at: Mono) -> usize {
        let start = self.summary.borrow().start.unwrap_or(at);
        (at.since(start).as_nanos() / BUCKET.as_nanos()) as usize
    }

    /// Reads records until something is queued or the file ends.
    fn fill(&mut self) {
        while self.queue.is_empty() && !self.done {
            match self.reader.next_record() {
                Ok(Some(Record::Packet(p))) => self.packet(p),
                Ok(Some(Record::KeyLog(text))) => {
                    let k = KeyLog::parse(&text);
                    let mut s = self.summary.borrow_mut();
                    s.keylog_in_capture += k.len() as u64;
                    s.keylog_entries += k.len();
                    drop(s);
                    match self.dec.as_mut() {
                        Some(d) => d.add_keys(&k),
                        None => self.dec = Some(quic::Decryptors::new(k)),
                    }
                }
                Ok(None) => self.finish(None),
                Err(e) => self.finish(Some(e)),
            }
        }
    }

    fn packet(&mut self, p: crate::sources::captures::capture::Packet) {
        // A record far ahead of the last one is a corrupt timestamp, not a
        // day-long silence: taken at the last time (and counted), or every
        // later packet would be pinned to the future.
        let mut at = Mono(p.ts).max(self.last);
        if self.last != Mono::ZERO && at.since(self.last) > MAX_JUMP {
            at = self.last;
            self.summary.borrow_mut().time_jumps += 1;
        }
        self.last = at;
        {
            let mut s = self.summary.borrow_mut();
            s.start.get_or_insert(at);
            s.end = Some(at);
        }
        let next = *self.next_tick.get_or_insert(Mono(at.0.saturating_add(TICK.as_nanos() as u64)));
        if at >= next {
            // Every tick up to this packet (a quiet gap is many ticks), but only the
            // first MAX_GAP of a longer gap, then the last tick before the packet: a
            // timestamp years ahead (a corrupt record) must not mean billions of ticks.
            let tick_ns = TICK.as_nanos() as u64;
            let mut t = next;
            let last = Mono(next.0 + (at.0 - next.0) / tick_ns * tick_ns);
            let capped = Mono(next.0.saturating_add(MAX_GAP.as_nanos() as u64)).min(last);
            while t <= capped {
                self.tick(t);
                match t.0.checked_add(tick_ns) {
                    Some(n) => t = Mono(n),
                    None => break,
                }
            }
            if t <= last && t != capped {
                self.tick(last);
            }
            self.next_tick = Some(Mono(last.0.saturating_add(tick_ns)));
        }
        let bucket = self.bucket(at);
        match p.l4 {
            L4::Udp { payload, orig_len, .. } => {
                let dec = &self.dec;
                let placed = self.udp.place(at, p.src, p.dst, &payload, orig_len, |flow, dir| {
                    dec.as_ref().and_then(|d| d.dcid_for(flow, dir, &payload))
                });
                let Some(placed) = placed else { return };
                if let Some(sample) = placed.sample {
                    self.queue.push_back(Step::Obs(Observation::Header { at, sample }));
                }
                self.series(bucket, placed.flow, placed.dir, &placed.segments);
                if let Some(dec) = self.dec.as_mut() {
                    for &(off, len) in &placed.segments {
                        if let Some(seg) = payload.get(off..off + len) {
                            dec.datagram(at, bucket, placed.flow, placed.dir, seg);
                        }
                    }
                }
            }
            L4::Tcp { seq, ack, flags, window, wscale, payload_len, .. } => {
                let seg = tcp::Segment { seq, ack, flags, window, wscale, payload_len };
                let mut out = Vec::new();
                self.tcp.segment(at, p.src, p.dst, &seg, &mut out);
                self.queue.extend(out.into_iter().map(Step::Obs));
            }
        }
    }

    fn series(&mut self, bucket: usize, flow: FlowId, dir: Dir, segments: &[(usize, usize)]) {
        let mut s = self.summary.borrow_mut();
        if s.buckets >= MAX_BUCKETS {
            s.series_full = true;
            return;
        }
        let budget = MAX_BUCKETS - s.buckets;
        let b = s.series.entry(flow).or_default();
        if b.growth(bucket) > budget {
            s.series_full = true;
            return;
        }
        let before = b.stored();
        let cell = b.at(bucket);
        for &(_, len) in segments {
            let full = len as u32 >= hystall_common::flow::FULL_MIN;
            let i = (dir as usize) * 2 + usize::from(!full);
            cell[i] = cell[i].saturating_add(len as u32);
        }
        let grown = b.stored() - before;
        s.buckets += grown;
    }

    /// What a live tick does: poll the flow counters and sockets, then judge.
    fn tick(&mut self, t: Mono) {
        let known = self.udp.servers_len();
        if known != self.owners_sent {
            self.owners_sent = known;
            // No process is known in a capture: one owner (pid 0) for every server port.
            let ports = self.udp.servers().map(|a| (a.port(), 0)).collect();
            self.queue.push_back(Step::Obs(Observation::Owners { at: t, ports }));
        }
        let since = Mono(t.0.saturating_sub((self.quic_idle + Duration::from_secs(5)).as_nanos() as u64));
        let flows = self.udp.active(since);
        if !flows.is_empty() {
            self.queue.push_back(Step::Obs(Observation::FlowCounts { at: t, flows }));
        }
        let mut out = Vec::new();
        self.tcp.flush(t, &mut out);
        self.queue.extend(out.into_iter().map(Step::Obs));
        if let Some(dec) = self.dec.as_mut() {
            for (flow, state) in dec.changed() {
                self.queue
                    .push_back(Step::Obs(Observation::Frames { at: t, sample: Box::new(FrameSample { flow, state }) }));
            }
        }
        self.queue.push_back(Step::Tick(t));
    }

    fn finish(&mut self, err: Option<CaptureError>) {
        self.done = true;
        // A last tick at the last packet, so the end of the capture is judged.
        if self.summary.borrow().start.is_some() {
            self.tick(Mono(self.last.0.saturating_add(1)));
        }
        let mut s = self.summary.borrow_mut();
        s.error = err.map(|e| e.to_string());
        s.stats = self.reader.stats().clone();
        s.unplaced_udp = self.udp.unplaced;
        s.unplaced_pairs = self.udp.unplaced_pairs.len();
        s.gso_split = self.udp.gso_split;
        s.tcp_segments = self.tcp.segments;
        s.servers = self.udp.servers().copied().collect();
        s.servers.sort();
        if let Some(d) = &self.dec {
            s.decrypted = d.summary();
            s.frame_errors = d.frame_errors;
        }
    }
}

impl<R: Read> Iterator for Converter<R> {
    type Item = Step;
    fn next(&mut self) -> Option<Step> {
        self.fill();
        self.queue.pop_front()
    }
}
