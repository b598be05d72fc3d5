//! What a scrape shows, computed on the pipeline's thread: plain numbers, so
//! the HTTP thread never touches the model and a scrape never blocks a tick.

use std::collections::{BTreeMap, HashSet};

use hystall_common::counter;

use crate::core::detector::Confidence;
use crate::core::event::{Event, Stamped};
use crate::core::model::Model;
use crate::core::verdict::Verdict;
use crate::sources::kernel::probes::stats::ProgStats;

/// How an enforcement action ended, as the `result` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EnforceResult {
    Ok,
    Failed,
    DryRun,
}

impl EnforceResult {
    pub const ALL: [EnforceResult; 3] = [EnforceResult::Ok, EnforceResult::Failed, EnforceResult::DryRun];

    pub fn as_str(self) -> &'static str {
        match self {
            EnforceResult::Ok => "ok",
            EnforceResult::Failed => "failed",
            EnforceResult::DryRun => "dry_run",
        }
    }

    /// The executor's results are sentences ("destroyed", "gone already",
    /// "failed: ..."); only a leading "failed" is a failure.
    fn of(dry_run: bool, result: &str) -> EnforceResult {
        if dry_run {
            EnforceResult::DryRun
        } else if result.starts_with("failed") {
            EnforceResult::Failed
        } else {
            EnforceResult::Ok
        }
    }
}

/// Counters that only the event stream can give; they grow for the whole run.
#[derive(Clone, Debug)]
pub struct Totals {
    /// By event name; every name of `Event::NAMES` is present.
    pub events: BTreeMap<&'static str, u64>,
    /// Connections that became starved (a rise of confidence is not a new one).
    pub starvations: u64,
    /// Starved connections that recovered.
    pub recoveries: u64,
    /// (action, result) → count; `destroy` with every result is present.
    pub actions: BTreeMap<(&'static str, EnforceResult), u64>,
    /// Decisions the enforcer refused to carry out (rate limit).
    pub refusals: u64,
    /// Connections starved now, to tell a new starvation from a re-report.
    starved_now: HashSet<u64>,
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            events: Event::NAMES.iter().map(|n| (*n, 0)).collect(),
            starvations: 0,
            recoveries: 0,
            actions: EnforceResult::ALL.iter().map(|r| (("destroy", *r), 0)).collect(),
            refusals: 0,
            starved_now: HashSet::new(),
        }
    }
}

impl Totals {
    pub fn observe(&mut self, events: &[Stamped]) {
        for e in events {
            *self.events.entry(e.event.name()).or_default() += 1;
            match &e.event {
                // Counted once per connection, however often its confidence rises.
                Event::QuicStarved(s) => self.starvations += u64::from(self.starved_now.insert(s.conn)),
                Event::QuicRecovered(s) => {
                    self.starved_now.remove(&s.conn);
                    self.recoveries += 1;
                }
                Event::Enforced(i) if i.action == "refuse" => self.refusals += 1,
                Event::Enforced(i) => {
                    *self.actions.entry((i.action, EnforceResult::of(i.dry_run, &i.result))).or_default() += 1;
                }
                _ => {}
            }
        }
    }
}

/// A probe's attachment, as `hystall_probe_attached` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeGauge {
    pub program: String,
    pub attached: bool,
    /// Detached on purpose until needed (the syscall probes): not degraded.
    pub waiting: bool,
}

/// What the kernel side says about itself.
#[derive(Clone, Debug, Default)]
pub struct Kernel {
    /// The `COUNTERS` array, summed over CPUs (`hystall_common::counter`).
    pub counters: [u64; counter::LEN as usize],
    pub probes: Vec<ProbeGauge>,
    pub progs: Vec<ProgStats>,
    /// BPF run-time statistics are being collected (else run times stay 0).
    pub stats_enabled: bool,
    /// Occupancy of the kernel maps that grow with traffic (counted every 10 s).
    pub maps: Vec<crate::sources::kernel::probes::upkeep::MapFill>,
    /// Flows the kernel's LRU flow map evicted to make room.
    pub flows_evicted: u64,
    /// QUIC server ports watched (0: no QUIC connection can be seen).
    pub quic_server_ports: u64,
    /// Unconnected UDP ports of the watched processes not yet shown to serve QUIC.
    pub quic_candidate_ports: u64,
}

/// Sizes of the model's tables (closed entries not yet swept included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub sockets: u64,
    pub connections: u64,
    /// Client 5-tuples of those connections.
    pub flows: u64,
    /// Flows of closed connections whose last figures are kept (until the
    /// kernel forgets them).
    pub retired_flows: u64,
    /// Target sockets the attribution follows (closed ones linked to a
    /// connection stay for its horizon: their bytes explain its bytes).
    pub attributed_targets: u64,
    /// Connections whose client bytes the attribution keeps as a series.
    pub byte_series: u64,
}

impl Tables {
    /// (label, value) pairs, in a fixed order.
    pub fn rows(&self) -> [(&'static str, u64); 6] {
        [
            ("sockets", self.sockets),
            ("connections", self.connections),
            ("flows", self.flows),
            ("retired_flows", self.retired_flows),
            ("attributed_targets", self.attributed_targets),
            ("byte_series", self.byte_series),
        ]
    }
}

/// Everything one scrape shows.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Open target sockets (connected by the watched processes) by verdict:
    /// OK, SLOW, STALLED.
    pub targets: [u64; 3],
    /// Starved connections by confidence: suspected, likely, confirmed.
    pub starved: [u64; 3],
    pub quic_connections: u64,
    /// Entries of the user-side tables, by name: what must stay flat on a
    /// node that runs for days.
    pub tables: Tables,
    pub totals: Totals,
    pub kernel: Kernel,
}

impl Snapshot {
    /// Gauges from the model as it is now; counters as accumulated.
    pub fn new(model: &Model, totals: &Totals, kernel: Kernel) -> Snapshot {
        let mut targets = [0u64; 3];
        for s in model.sockets.iter().filter(|s| s.closed.is_none() && s.k.outbound) {
            targets[verdict_index(s.verdict)] += 1;
        }
        let mut starved = [0u64; 3];
        for s in model.detector.starved() {
            starved[confidence_index(s.confidence)] += 1;
        }
        let quic_connections = model.conns.iter().filter(|c| c.closed.is_none() && c.opened_reported).count() as u64;
        let tables = Tables {
            sockets: model.sockets.len() as u64,
            connections: model.conns.len() as u64,
            flows: model.conns.flows_len() as u64,
            retired_flows: model.conns.retired_len() as u64,
            attributed_targets: model.attribution.sizes().0 as u64,
            byte_series: model.attribution.sizes().1 as u64,
        };
        Snapshot { targets, starved, quic_connections, tables, totals: totals.clone(), kernel }
    }
}

fn verdict_index(v: Verdict) -> usize {
    match v {
        Verdict::Ok => 0,
        Verdict::Slow => 1,
        Verdict::Stalled => 2,
    }
}

fn confidence_index(c: Confidence) -> usize {
    match c {
        Confidence::Suspected => 0,
        Confidence::Likely => 1,
        Confidence::Confirmed => 2,
    }
}
